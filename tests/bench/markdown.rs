//! `docs/benchmarks.md`: `tests/bench/template.md` filled in from what the
//! [`Bench`] measured. A load run's table is the load report's own
//! [`Report::markdown`]; the hand-written analysis is kept across runs.

use std::collections::BTreeMap;
use std::fmt::{self, Display, Write as _};

use anyhow::{Context, Result};
use payments_loadtest::load::{Report, StreamReport};

use crate::Bench;
use crate::database::Pgbench;
use crate::machine::CpuPerOp;
use crate::results::{BackendResults, CacheFull, Prune, Slow};

pub const ANALYSIS_START: &str = "<!-- analysis:start -->";
pub const ANALYSIS_END: &str = "<!-- analysis:end -->";

const ANALYSIS_PLACEHOLDER: &str = "\n_Placeholder: what these figures mean, where the time goes, \
and what was tuned because of them. Write it by hand; `make bench` keeps everything between the \
analysis markers when it rewrites this file._\n";

/// The hand-written analysis of `existing` (the file's current text), or
/// the placeholder.
pub fn kept_analysis(existing: Option<&str>) -> String {
    let kept = existing.and_then(|text| {
        let start = text.find(ANALYSIS_START)? + ANALYSIS_START.len();
        let end = start + text[start..].find(ANALYSIS_END)?;
        Some(text[start..end].to_owned())
    });
    kept.unwrap_or_else(|| ANALYSIS_PLACEHOLDER.to_owned())
}

/// A markdown table, with a blank line after it.
struct Table(String);

impl Table {
    /// Its columns' heads, as `a | b | c`.
    fn new(head: &str) -> Self {
        let columns = head.split(" | ").count();
        Self(format!("| {head} |\n|{}\n", "---|".repeat(columns)))
    }

    fn row<S: ToString>(&mut self, cells: impl IntoIterator<Item = S>) {
        // Free text must not break the table.
        let cell = |c: S| c.to_string().replace('|', "\\|").replace('\n', " ");
        let cells: Vec<String> = cells.into_iter().map(cell).collect();
        let _ = writeln!(self.0, "| {} |", cells.join(" | "));
    }
}

impl Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.0)
    }
}

/// The whole file: `tests/bench/template.md` filled in, `{new_requests}`
/// with `BENCH_NEW_REQUESTS` and so on.
pub fn render(r: &Bench, analysis: &str) -> Result<String> {
    let mut warnings = String::new();
    let changed = r.settings.changed();
    if !changed.is_empty() {
        let changed = changed.join("`, `");
        let _ = writeln!(
            warnings,
            "> **Not a full-size run.** Changed from the defaults: `{changed}`. The verdicts \
             below apply to these settings, not to the sizes the targets name.\n"
        );
    }
    if !r.failures.is_empty() {
        warnings.push_str("> **The bench failed** (it exited non-zero) for these reasons:\n");
        for failure in &r.failures {
            let first = failure.lines().next().unwrap_or_default();
            let _ = writeln!(warnings, "> - {}", first.replace('|', "\\|"));
        }
        warnings.push('\n');
    }
    let mut vars = BTreeMap::new();
    let mut knobs = Table::new("variable | default | this run | what");
    for k in &r.settings.knobs {
        let key = k.name.trim_start_matches("BENCH_").to_ascii_lowercase();
        vars.insert(key, k.value.clone());
        let value = if k.value == k.default {
            "default".to_owned()
        } else {
            format!("**`{}`**", k.value)
        };
        let default = format!("`{}`", k.default);
        knobs.row([format!("`{}`", k.name), default, value, k.doc.to_owned()]);
    }
    let mut machine = Table::new(" | ");
    for (name, value) in &r.machine {
        machine.row([name, value.as_str()]);
        // `{date}`, `{commit}`.
        vars.insert(name.to_string(), value.clone());
    }
    let sheet = sheet(r);
    let elapsed = crate::STARTED.elapsed().as_secs_f64();
    let filled = [
        ("elapsed", format!("{elapsed:.0}")),
        ("warnings", warnings),
        ("knobs", knobs.to_string()),
        ("machine", machine.to_string()),
        ("slow_pool", crate::settings::SLOW_POOL.to_string()),
        ("gateway_timeout", crate::GATEWAY_TIMEOUT.to_owned()),
        ("lease", crate::LEASE.to_owned()),
        ("targets", sheet.targets.to_string()),
        ("figures", sheet.figures.to_string()),
        (
            "chart",
            match r.chart_name.as_str() {
                "" => String::new(),
                name => format!("![Requests/s and p99 per scenario and backend]({name})\n\n"),
            },
        ),
        (
            "new",
            each(r, |b| {
                let cpu = cpu_table(b, b.new_cpu.as_ref(), "charge", r.settings.warmup);
                Some(format!("{}{cpu}", b.new.as_ref()?.markdown()))
            }),
        ),
        (
            "batches",
            each(r, |b| Some(batch_table(b.batches.as_ref()?))),
        ),
        ("ceiling", each(r, |b| b.ceiling.as_ref())),
        (
            "health",
            each(r, |b| {
                let cpu = cpu_table(b, b.health_cpu.as_ref(), "read", 0);
                Some(format!("{}{cpu}", b.health.as_ref()?.markdown()))
            }),
        ),
        ("cache", each(r, |b| b.cache.as_ref())),
        ("pgbench", each(r, |b| b.pgbench.as_ref())),
        (
            "replay",
            each(r, |b| {
                let cpu = cpu_table(b, b.replay_cpu.as_ref(), "replay", r.settings.warmup);
                Some(format!("{}{cpu}", b.replay.as_ref()?.markdown()))
            }),
        ),
        ("storm", each(r, |b| Some(b.storm.as_ref()?.markdown()))),
        (
            "refund",
            each(r, |b| {
                let cpu = cpu_table(b, b.refund_cpu.as_ref(), "refund", 0);
                Some(format!("{}{cpu}", b.refund.as_ref()?.markdown()))
            }),
        ),
        (
            "capture",
            each(r, |b| {
                let cpu = cpu_table(b, b.capture_cpu.as_ref(), "capture", 0);
                Some(format!("{}{cpu}", b.capture.as_ref()?.markdown()))
            }),
        ),
        (
            "list",
            each(r, |b| {
                let (first, deep) = b.list.as_ref()?;
                let (first_cpu, deep_cpu) = b.list_cpu;
                Some(format!(
                    "First page:\n\n{}{}Deep page:\n\n{}{}",
                    first.markdown(),
                    cpu_table(b, first_cpu.as_ref(), "read", 0),
                    deep.markdown(),
                    cpu_table(b, deep_cpu.as_ref(), "read", 0),
                ))
            }),
        ),
        ("slow", each(r, |b| b.slow.as_ref())),
        ("prune", each(r, |b| b.prune.as_ref())),
        ("analysis", analysis.to_owned()),
    ];
    vars.extend(filled.map(|(key, value)| (key.to_owned(), value)));
    fill(include_str!("template.md"), &vars)
}

/// `template` with every `{key}` replaced by its value, in one pass (a
/// value is never filled in itself).
fn fill(template: &str, vars: &BTreeMap<String, String>) -> Result<String> {
    let (mut out, mut rest) = (String::new(), template);
    while let Some(start) = rest.find('{') {
        let key = rest[start + 1..].split('}').next().unwrap_or_default();
        let value = vars.get(key);
        let value = value.with_context(|| format!("template.md: no value for {{{key}}}"))?;
        out.push_str(&rest[..start]);
        out.push_str(value);
        rest = &rest[start + key.len() + 2..];
    }
    Ok(out + rest)
}

/// A target's measurement and verdict (`None`: measured, but not under the
/// conditions the target names).
type Judged = Option<(String, Option<bool>)>;

/// The key figures, a column per backend, and the targets judged from them.
struct Sheet<'a> {
    backends: &'a [BackendResults],
    figures: Table,
    targets: Table,
}

impl Sheet<'_> {
    fn figure(&mut self, name: &str, figure: impl Fn(&BackendResults) -> Option<String>) {
        let cells = self.backends.iter().map(&figure);
        let cells = cells.map(|cell| cell.unwrap_or("-".into()));
        self.figures.row([name.to_owned()].into_iter().chain(cells));
    }

    /// A figure judged by `target` on each backend where it was measured.
    fn judged(&mut self, name: &str, target: &str, judge: impl Fn(&BackendResults) -> Judged) {
        for b in self.backends {
            let Some((measured, met)) = judge(b) else {
                continue;
            };
            let verdict = match met {
                Some(true) => "**MET**",
                Some(false) => "**NOT MET**",
                None => "inconclusive",
            };
            self.targets.row([target, b.backend, &measured, verdict]);
        }
        self.figure(name, |b| Some(judge(b)?.0));
    }
}

/// The targets (as the design review set them) and the key figures.
fn sheet(r: &Bench) -> Sheet<'_> {
    let names: Vec<&str> = r.backends.iter().map(|b| b.backend).collect();
    let mut s = Sheet {
        backends: &r.backends,
        figures: Table::new(&format!("figure | {}", names.join(" | "))),
        targets: Table::new("target | backend | measured | verdict"),
    };
    fn new(b: &BackendResults) -> Option<&StreamReport> {
        b.new.as_ref()?.stream("charge")
    }
    s.figure("new: charges/s", |b| Some(rate(new(b)?.throughput_rps)));
    s.figure("new: p50 / p99", |b| {
        let l = new(b)?.latency_us?;
        Some(format!("{} / {}", ms(l.p50), ms(l.p99)))
    });
    let target = "new charges/s on PostgreSQL >= 60% of the pgbench ceiling";
    s.judged("new ÷ pgbench ceiling", target, |b| {
        let tps = b.pgbench.as_ref()?.tps;
        let rps = new(b)?.throughput_rps;
        let share = 100.0 * rps / tps;
        let measured = format!("{share:.0}% ({} / {} tps)", rate(rps), rate(tps));
        Some((measured, Some(rps / tps >= 0.60)))
    });
    s.figure("SQLite one-writer ceiling: charges/s", |b| {
        Some(rate(b.ceiling?.rate()))
    });
    let target = "new charges/s on SQLite >= 1.5x the one-writer ceiling";
    s.judged("new ÷ one-writer ceiling", target, |b| {
        let ceiling = b.ceiling?.rate();
        let rps = new(b)?.throughput_rps;
        let measured = format!(
            "{:.2}x ({} / {} charges/s)",
            rps / ceiling,
            rate(rps),
            rate(ceiling)
        );
        Some((measured, Some(rps >= 1.5 * ceiling)))
    });
    s.figure(
        "new: charges per SQLite commit (mean; share of commits carrying 1 / 2-4 / 5+)",
        |b| {
            let batches = b.batches.as_ref()?;
            Some(batch_summary(batches))
        },
    );
    s.figure("new: API CPU per charge", |b| {
        Some(micros(b.new_cpu?.us.api))
    });
    let cpu = "new: CPU per charge (API + database server + sandbox + load generator)";
    s.figure(cpu, |b| Some(cpu_sum(b, &b.new_cpu?)));
    s.figure("health: `/healthz` req/s, p99", |b| {
        let health = b.health.as_ref()?.stream("health")?;
        let p99 = health.latency_us?.p99;
        Some(format!(
            "{} req/s, p99 {}",
            rate(health.throughput_rps),
            ms(p99)
        ))
    });
    let target = "replays >= 50% of the same server's /healthz rate, p99 < 5 ms";
    s.judged("replay: req/s ÷ /healthz, p99", target, |b| {
        let replay = b.replay.as_ref()?.stream("replay")?;
        let (rps, p99) = (replay.throughput_rps, replay.latency_us?.p99);
        let health = b.health.as_ref()?.stream("health")?.throughput_rps;
        let share = rps / health;
        let measured = format!(
            "{:.0}% ({} / {} req/s), p99 {}",
            share * 100.0,
            rate(rps),
            rate(health),
            ms(p99)
        );
        Some((measured, Some(share >= 0.5 && p99 < 5_000)))
    });
    s.figure("replay: API CPU per replay", |b| {
        Some(micros(b.replay_cpu?.us.api))
    });
    let cpu = "replay: CPU per replay (API + database server + sandbox + load generator)";
    s.figure(cpu, |b| Some(cpu_sum(b, &b.replay_cpu?)));
    s.figure("replay: cache hits / misses (hit rate)", |b| {
        let (hits, misses) = b.replay_cache?;
        Some(hit_rate(hits, misses))
    });
    let target = "replay cache full at its default size: API RSS < 150 MB";
    s.judged(
        "cache: keys past the cache's size, hit rate, API RSS",
        target,
        |b| {
            let cache = b.cache.as_ref()?;
            let rss = cache.rss_kb?;
            let keys = cache.report.settings["keys"].as_u64().unwrap_or_default();
            let measured = format!(
                "{keys} keys, {}, RSS {} (peak {})",
                hit_rate(cache.hits, cache.misses),
                mb(rss),
                show(cache.hwm_kb, mb)
            );
            Some((measured, Some(cache.hwm_kb.unwrap_or(rss) < 150 * 1024)))
        },
    );
    s.figure("refund: refunds/s, p99", |b| {
        per_second(b.refund.as_ref()?, "refund")
    });
    s.figure("capture: captures/s, p99", |b| {
        per_second(b.capture.as_ref()?, "capture")
    });
    s.figure("list: a page of 20 (first / deep), req/s, p99", |b| {
        let (first, deep) = b.list.as_ref()?;
        let page = |r: &Report| {
            let list = r.stream("list")?;
            Some(format!(
                "{} req/s, p99 {}",
                rate(list.throughput_rps),
                ms(list.latency_us?.p99)
            ))
        };
        Some(format!("{} / {}", page(first)?, page(deep)?))
    });
    let target = "storm: exactly one provider call per key, no 5xx";
    s.judged("storm: provider calls per key, 5xx", target, |b| {
        let (storm, calls) = (b.storm.as_ref()?, b.storm_provider_requests);
        let (keys, errors) = (storm.operations.started, server_errors(storm));
        let per_key = show(calls, |n| format!("{:.2}", n as f64 / keys.max(1) as f64));
        let shown = opt(calls);
        let measured = format!("{per_key} ({shown} calls, {keys} keys), {errors} 5xx");
        // Without the sandbox's request count it cannot be judged.
        let ok = calls.map(|n| n == keys && storm.correct && errors == 0);
        Some((measured, ok))
    });
    let name = "slow: ended 201; charges (provider / database / operations)";
    let target = "slow: every charge in flight ends 201, one charge each";
    s.judged(name, target, |b| {
        let report = &b.slow.as_ref()?.report;
        let (c, ops) = (&report.charges, &report.operations);
        let in_flight = report.settings["in_flight"].as_u64().unwrap_or_default();
        let ended_201 = report.stream("operation")?.statuses.get(&201);
        let ended_201 = ended_201.copied().unwrap_or_default();
        let (provider, database) = (opt(c.provider), opt(c.database));
        let measured = format!(
            "{ended_201} of {in_flight}; {provider} / {database} / {}",
            ops.started
        );
        // A correct report counted one charge per operation everywhere.
        let ok = ended_201 == in_flight && report.correct && ops.charged == ops.started;
        Some((measured, Some(ok)))
    });
    let name = "slow: pool timeouts in the API's log";
    s.judged(name, "slow: no pool timeouts", |b| {
        let timeouts = b.slow.as_ref()?.pool_timeouts;
        Some((timeouts.to_string(), Some(timeouts == 0)))
    });
    let target = "slow: probe replay and GET p99 < 50 ms";
    s.judged("slow: probe replay / GET p99", target, |b| {
        let slow = &b.slow.as_ref()?.report;
        let (replay, get) = (p99(slow, "probe_replay"), p99(slow, "probe_get"));
        let ok = replay.zip(get).map(|(r, g)| r < 50_000 && g < 50_000);
        Some((format!("{} / {}", show(replay, ms), show(get, ms)), ok))
    });
    let target = "slow: API peak RSS < 150 MB";
    s.judged("slow: API peak RSS (VmHWM)", target, |b| {
        let kb = b.slow.as_ref()?.vm_hwm_kb?;
        Some((mb(kb), Some(kb < 150 * 1024)))
    });
    let target = "prune: new p99 with the pruner <= 2x without";
    s.judged("prune: new p99 without -> with", target, |b| {
        let prune = b.prune.as_ref()?;
        let without = p99(&prune.baseline, "charge")?;
        let with = p99(&prune.with_prune, "charge")?;
        let ratio = with as f64 / without.max(1) as f64;
        let mut measured = format!("{} -> {} ({ratio:.2}x)", ms(without), ms(with));
        let (overlap, run) = (prune.overlap_secs, prune.run_secs);
        if overlap < run {
            let _ = write!(
                measured,
                "; the pruner ran only {overlap:.1} s of the {run:.1} s run"
            );
        }
        // A pruner that ran for a sliver of the run says little about its p99.
        Some((measured, (overlap >= run * 0.5).then_some(ratio <= 2.0)))
    });
    s.figure("prune: rows, wall time", |b| {
        let p = b.prune.as_ref()?;
        let deleted = opt(p.pass["deleted"].as_u64());
        Some(format!("{deleted} in {:.1} s", p.prune_wall_secs))
    });
    s
}

/// A run's CPU per operation, by process, as a table under the run's own
/// (`what`: `charge`, `replay`, `read`, ...; `warmup`: the requests run
/// before, 0 for none); empty when it was not measured.
fn cpu_table(b: &BackendResults, cpu: Option<&CpuPerOp>, what: &str, warmup: u64) -> String {
    let Some(cpu) = cpu else {
        return String::new();
    };
    let head = format!("CPU per {what} | API | database server | sandbox | load generator | total");
    let mut table = Table::new(&head);
    let us = cpu.us;
    let warm = match warmup {
        0 => String::new(),
        n => format!(" after {n} of warm-up"),
    };
    let runs = match cpu.runs {
        1 => String::new(),
        n => format!(", the median of {n} runs"),
    };
    table.row([
        format!(
            "over {} {what}s{warm} ({:.1} s){runs}",
            cpu.operations, cpu.secs
        ),
        micros(us.api),
        database_micros(b, us.database, "(in the API)"),
        micros(us.sandbox),
        micros(us.load),
        micros(us.total()),
    ]);
    table.to_string()
}

/// `API + database + sandbox + load = total`, µs per operation.
fn cpu_sum(b: &BackendResults, cpu: &CpuPerOp) -> String {
    let us = cpu.us;
    let parts = [
        micros(us.api),
        database_micros(b, us.database, "-"),
        micros(us.sandbox),
        micros(us.load),
    ];
    format!("{} = {}", parts.join(" + "), micros(us.total()))
}

/// The database server's CPU per operation, or `none` on SQLite, which has
/// no server (its work is the API's).
fn database_micros(b: &BackendResults, us: f64, none: &str) -> String {
    if b.backend == "sqlite" {
        none.to_owned()
    } else {
        micros(us)
    }
}

/// CPU time per operation: whole µs, tenths below 100 µs.
fn micros(us: f64) -> String {
    if us < 100.0 {
        format!("{us:.1} µs")
    } else {
        format!("{us:.0} µs")
    }
}

/// Hits and misses, and the share of hits.
fn hit_rate(hits: u64, misses: u64) -> String {
    let share = 100.0 * hits as f64 / (hits + misses).max(1) as f64;
    format!("{hits} / {misses} ({share:.1}%)")
}

/// The mean batch and how commits split by size, from the histogram's
/// per-bucket counts (a bucket's batches counted at its bound, so the mean
/// is an upper estimate).
fn batch_summary(batches: &[(String, u64)]) -> String {
    let bound = |b: &str| {
        b.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .unwrap_or(256.0)
    };
    let total: u64 = batches.iter().map(|(_, n)| n).sum();
    let weighted: f64 = batches.iter().map(|(b, n)| bound(b) * *n as f64).sum();
    let share = |keep: &dyn Fn(f64) -> bool| {
        let n: u64 = batches
            .iter()
            .filter(|(b, _)| keep(bound(b)))
            .map(|(_, n)| n)
            .sum();
        format!("{:.0}%", 100.0 * n as f64 / total.max(1) as f64)
    };
    format!(
        "≤ {:.1}; {} / {} / {} of {total}",
        weighted / total.max(1) as f64,
        share(&|b| b <= 1.0),
        share(&|b| b > 1.0 && b <= 4.0),
        share(&|b| b > 4.0)
    )
}

/// The group commit's batch sizes as a table.
fn batch_table(batches: &[(String, u64)]) -> String {
    let mut table = Table::new("claims and finishes per commit (at most) | commits");
    for (bound, n) in batches.iter().filter(|(_, n)| *n > 0) {
        table.row([bound.clone(), n.to_string()]);
    }
    table.to_string()
}

/// The one-writer ceiling.
impl Display for crate::database::Ceiling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut table = Table::new("charges | seconds | charges/s | per charge");
        let per = 1e6 * self.secs / self.charges.max(1) as f64;
        table.row([
            self.charges.to_string(),
            format!("{:.2}", self.secs),
            rate(self.rate()),
            format!("{per:.0} µs"),
        ]);
        write!(f, "{table}")
    }
}

/// The replay cache filled past its size.
impl Display for CacheFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}Replay cache: {}. API memory after the run: RSS {}, peak {}.\n\n",
            self.report.markdown(),
            hit_rate(self.hits, self.misses),
            show(self.rss_kb, mb),
            show(self.hwm_kb, mb)
        )
    }
}

/// p99 of a stream, µs.
fn p99(report: &Report, stream: &str) -> Option<u64> {
    Some(report.stream(stream)?.latency_us?.p99)
}

/// Answers with a 5xx status on every stream of a report.
fn server_errors(report: &Report) -> u64 {
    let statuses = report.streams.iter().flat_map(|s| &s.statuses);
    let errors = statuses.filter(|(status, _)| **status >= 500);
    errors.map(|(_, n)| n).sum()
}

/// Each backend's section with a heading, if it has one.
fn each<'a, D: Display>(r: &'a Bench, section: impl Fn(&'a BackendResults) -> Option<D>) -> String {
    let backends = r.backends.iter();
    let sections = backends.filter_map(|b| Some(format!("#### {}\n\n{}", b.backend, section(b)?)));
    let sections: String = sections.collect();
    if sections.is_empty() {
        "Not run.\n\n".into()
    } else {
        sections
    }
}

/// The pgbench ceiling.
impl Display for Pgbench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (c, j, t) = (self.clients, self.threads, self.seconds);
        let command =
            format!("`pgbench -n -M prepared -f tests/bench/charge.sql -c {c} -j {j} -T {t}`");
        let latency = show(self.latency_avg_ms, |ms| format!("{ms:.3} ms"));
        let mut table = Table::new("command | tps | latency avg | transactions | failed");
        let counts = [opt(self.transactions), opt(self.failed)];
        table.row([command, rate(self.tps), latency].into_iter().chain(counts));
        write!(f, "{table}")
    }
}

/// A slow run, with the API's memory and log.
impl Display for Slow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rss = show(self.vm_hwm_kb, mb);
        let (timeouts, errors) = (self.pool_timeouts, self.error_lines);
        write!(
            f,
            "{}API: peak RSS {rss} (VmHWM); pool timeouts in its log: {timeouts}; ERROR lines: \
             {errors}; provider calls: {}.\n\n",
            self.report.markdown(),
            opt(self.provider_requests)
        )
    }
}

/// A prune: the pruner's figures, then `new` without and with it.
impl Display for Prune {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pass = |key: &str| self.pass[key].as_u64();
        let (deleted, batches, own_ms) = (pass("deleted"), pass("batches"), pass("elapsed_ms"));
        let speed = deleted.zip(own_ms.filter(|ms| *ms > 0));
        let speed = show(speed.map(|(d, ms)| d * 1000 / ms), |s| rate(s as f64));
        let exited = if self.prune_ok { "exited 0" } else { "FAILED" };
        let (overlap, run) = (self.overlap_secs, self.run_secs);
        let whole = if overlap >= run {
            "the whole run"
        } else {
            "**not the whole run** (a shorter `BENCH_PRUNE_SECONDS` would cover it)"
        };
        write!(
            f,
            "Seeding took {:.1} s. The pruner {exited} in {:.2} s wall ({} rows deleted, \
             {} batches, {speed} rows/s; its own timing {} ms); it ran {overlap:.1} s of the \
             {run:.1} s run: {whole}. Left after the pass: {}.\n\nWithout the pruner:\n\n{}With \
             the pruner:\n\n{}",
            self.seed_secs,
            self.prune_wall_secs,
            opt(deleted),
            opt(batches),
            opt(own_ms),
            self.remaining,
            self.baseline.markdown(),
            self.with_prune.markdown()
        )
    }
}

/// A stream's operations per second and p99: `1,234 /s, p99 5.6 ms`.
fn per_second(report: &Report, stream: &str) -> Option<String> {
    let stream = report.stream(stream)?;
    let p99 = stream.latency_us?.p99;
    Some(format!(
        "{} /s, p99 {}",
        rate(stream.throughput_rps),
        ms(p99)
    ))
}

/// A report's number formats, as its tables show them.
fn ms(us: u64) -> String {
    Report::ms(us)
}

fn rate(x: f64) -> String {
    Report::rate(x)
}

fn mb(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

fn opt(n: Option<u64>) -> String {
    show(n, |n| n.to_string())
}

/// A figure, or `-` when there is none.
fn show<T>(value: Option<T>, format: impl Fn(T) -> String) -> String {
    value.map_or_else(|| "-".to_owned(), format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_analysis_survives_a_rewrite() {
        let old = format!("# x\n{ANALYSIS_START}\nmine\n{ANALYSIS_END}\nrest");
        assert_eq!(kept_analysis(Some(&old)), "\nmine\n");
        assert_eq!(kept_analysis(None), ANALYSIS_PLACEHOLDER);
        assert_eq!(kept_analysis(Some("no markers")), ANALYSIS_PLACEHOLDER);
    }
}
