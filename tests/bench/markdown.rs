//! `docs/benchmarks.md`: `tests/bench/template.md` (how to reproduce, the
//! setup, what each scenario does) filled in from [`Results`]: the knobs, the
//! machine, the targets with verdicts computed from the figures, the key
//! figures, every scenario's tables, and the hand-written analysis, which is
//! kept across runs (the text between [`ANALYSIS_START`] and [`ANALYSIS_END`]
//! in the file being replaced). Every table is a [`Table`]; a load run's is
//! [`Report::markdown`].

use std::collections::BTreeMap;
use std::fmt::{self, Display, Write as _};

use anyhow::{Context, Result};
use payments_loadtest::load::{Report, StreamReport};

use crate::machine::PerCharge;
use crate::results::{BackendResults, Prune, Results, Slow, Storm, p99, server_errors};

pub const ANALYSIS_START: &str = "<!-- analysis:start -->";
pub const ANALYSIS_END: &str = "<!-- analysis:end -->";

const ANALYSIS_PLACEHOLDER: &str = "\n_Placeholder: what these figures mean, where the time goes, and \
what was tuned because of them. Write it by hand; `make bench` keeps everything between the \
analysis markers when it rewrites this file._\n";

/// The targets, as the design review set them.
const NEW_CEILING_SHARE: f64 = 0.60;
const REPLAY_RPS: f64 = 10_000.0;
const REPLAY_P99_US: u64 = 10_000;
const PROBE_P99_US: u64 = 50_000;
const RSS_LIMIT_KB: u64 = 150 * 1024;
const PRUNE_P99_RATIO: f64 = 2.0;
/// The share of the `new` run the pruner must cover for a verdict.
const MIN_PRUNE_OVERLAP: f64 = 0.5;

/// The verdicts.
const MET: &str = "**MET**";
const NOT_MET: &str = "**NOT MET**";
/// Measured, but not under the conditions the target names.
const INCONCLUSIVE: &str = "inconclusive";
const NOT_RUN: &str = "not run";

/// The hand-written analysis of `existing` (the file's current text), or
/// the placeholder.
pub fn kept_analysis(existing: Option<&str>) -> String {
    existing
        .and_then(|text| {
            let start = text.find(ANALYSIS_START)? + ANALYSIS_START.len();
            let end = start + text[start..].find(ANALYSIS_END)?;
            Some(text[start..end].to_owned())
        })
        .unwrap_or_else(|| ANALYSIS_PLACEHOLDER.to_owned())
}

/// A markdown table, with a blank line after it.
struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Its columns' heads, as `a | b | c`.
    fn new(head: &str) -> Self {
        let head = head.split(" | ").map(str::to_owned).collect();
        Self {
            head,
            rows: Vec::new(),
        }
    }

    fn row<S: ToString>(&mut self, cells: impl IntoIterator<Item = S>) {
        // Free text must not break the table.
        let cell = |c: S| c.to_string().replace('|', "\\|").replace('\n', " ");
        self.rows.push(cells.into_iter().map(cell).collect());
    }
}

impl Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "| {} |\n|{}",
            self.head.join(" | "),
            "---|".repeat(self.head.len())
        )?;
        for row in &self.rows {
            writeln!(f, "| {} |", row.join(" | "))?;
        }
        writeln!(f)
    }
}

/// The whole file: `tests/bench/template.md` filled in.
pub fn render(r: &Results, analysis: &str) -> Result<String> {
    let m = &r.machine;
    let mut warnings = String::new();
    if !r.changed.is_empty() {
        let changed = r.changed.join("`, `");
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
    let mut knobs = Table::new("variable | default | this run | what");
    for k in &r.knobs {
        let value = if k.value == k.default {
            "default".into()
        } else {
            format!("**`{}`**", k.value)
        };
        let default = if k.default.is_empty() {
            "-".into()
        } else {
            format!("`{}`", k.default)
        };
        knobs.row([format!("`{}`", k.name), default, value, k.doc.to_owned()]);
    }
    let mut machine = Table::new(" | ");
    let (cpu, commit) = (
        format!("{} x {}", m.cpus, m.cpu_model),
        format!("`{}`", m.git),
    );
    let facts = [("CPU", &cpu), ("memory", &m.memory), ("kernel", &m.kernel)];
    let tools = [
        ("load average at start", &m.load_average),
        ("rustc", &m.rustc),
    ];
    let versions = [
        ("PostgreSQL", &m.postgres),
        ("SQLite", &m.sqlite),
        ("commit", &commit),
    ];
    for (name, value) in facts.into_iter().chain(tools).chain(versions) {
        machine.row([name, value]);
    }
    machine.row(["date", &m.date]);
    let mut vars = BTreeMap::new();
    for knob in &r.knobs {
        // `{new_requests}` is `BENCH_NEW_REQUESTS`, and so on.
        let key = knob.name.trim_start_matches("BENCH_").to_ascii_lowercase();
        vars.insert(key, knob.value.clone());
    }
    let run = |report: &Report| report.markdown().to_string();
    let filled = [
        ("date", m.date.clone()),
        ("commit", m.git.clone()),
        ("elapsed", format!("{:.0}", r.elapsed_secs)),
        ("warnings", warnings),
        ("knobs", knobs.to_string()),
        ("machine", machine.to_string()),
        ("slow_pool", r.api.slow_pool.to_string()),
        ("gateway_timeout", r.api.gateway_timeout.to_owned()),
        ("lease", r.api.lease.to_owned()),
        ("postgres_server", r.postgres_server.clone()),
        ("targets", targets(r).to_string()),
        ("figures", key_figures(r).to_string()),
        ("new", each(r, |b| b.new.as_ref(), run)),
        ("pgbench", pgbench(r)),
        ("fsync_off", fsync_off(r)),
        ("replay", each(r, |b| b.replay.as_ref(), run)),
        ("storm", each(r, |b| b.storm.as_ref(), storm)),
        ("slow", each(r, |b| b.slow.as_ref(), slow)),
        ("prune", each(r, |b| b.prune.as_ref(), prune)),
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
        let value = vars
            .get(key)
            .with_context(|| format!("template.md: no value for {{{key}}}"))?;
        out.push_str(&rest[..start]);
        out.push_str(value);
        rest = &rest[start + key.len() + 2..];
    }
    Ok(out + rest)
}

fn met(ok: bool) -> &'static str {
    if ok { MET } else { NOT_MET }
}

/// The targets, each judged from the figures (or not run).
fn targets(r: &Results) -> Table {
    let mut table = Table::new("target | backend | measured | verdict");
    let mut row = |target: &str, backend: &str, judged: Option<(String, &str)>| {
        let (measured, verdict) = judged.unwrap_or(("-".to_owned(), NOT_RUN));
        table.row([target, backend, &measured, verdict]);
    };
    let share = NEW_CEILING_SHARE * 100.0;
    let target = format!("new charges/s on PostgreSQL >= {share:.0}% of the pgbench ceiling");
    let postgres = r.backends.iter().find(|b| b.backend == "postgres");
    let new = postgres.and_then(|b| b.new.as_ref()?.stream("charge"));
    let pgbench = r.pgbench.as_ref().filter(|p| p.tps > 0.0);
    let judged = new.zip(pgbench).map(|(new, pgbench)| {
        let (rps, tps) = (new.throughput_rps, pgbench.tps);
        let measured = format!(
            "{} / {} tps = {:.0}%",
            rate(rps),
            rate(tps),
            100.0 * rps / tps
        );
        (measured, met(rps / tps >= NEW_CEILING_SHARE))
    });
    row(&target, "postgres", judged);
    let (rps, p99_us) = (rate(REPLAY_RPS), ms(REPLAY_P99_US));
    let replay_target = format!("replays >= {rps} req/s and p99 < {p99_us}");
    let prune_target = format!("prune: new p99 with the pruner <= {PRUNE_P99_RATIO}x without");
    for b in &r.backends {
        let name = b.backend;
        let replay = b.replay.as_ref().and_then(|r| r.stream("replay"));
        let judged = replay.map(|replay| {
            let (rps, p99) = (replay.throughput_rps, replay.latency_us.map(|l| l.p99));
            let ok = rps >= REPLAY_RPS && p99.is_some_and(|p| p < REPLAY_P99_US);
            (
                format!("{} req/s, p99 {}", rate(rps), show(p99, ms)),
                met(ok),
            )
        });
        row(&replay_target, name, judged);

        let judged = b.storm.as_ref().map(|storm| {
            let (keys, calls, charged, errors) = storm_figures(storm);
            let (calls_text, charged_text) = (opt(calls), opt(charged));
            let measured = format!(
                "{keys} keys: {calls_text} provider calls, {charged_text} provider charges, \
                 {errors} 5xx"
            );
            // Without the sandbox's request count it cannot be judged.
            let ok = calls.map(|calls| calls == keys && charged == Some(keys) && errors == 0);
            (measured, ok.map_or(NOT_RUN, met))
        });
        row(
            "storm: exactly one provider call per key, no 5xx",
            name,
            judged,
        );

        let slow = b.slow.as_ref();
        let mut target = "slow: every charge in flight ends 201, one charge each".to_owned();
        let judged = slow.map(|slow| {
            let (report, c, ops) = (&slow.report, &slow.report.charges, &slow.report.operations);
            let in_flight = report.settings["in_flight"].as_u64().unwrap_or_default();
            let _ = write!(target, " (at {in_flight} in flight)");
            let all_201 = ended_201(report);
            let one_each = c.provider == Some(ops.charged)
                && c.database == Some(ops.charged)
                && ops.charged == ops.started
                && ops.charged_twice == 0
                && c.provider_keys_charged_twice == Some(0);
            let (provider, database) = (opt(c.provider), opt(c.database));
            let measured = format!(
                "{all_201}/{in_flight} ended 201; charges: provider {provider}, database \
                 {database}, operations {}",
                ops.started
            );
            (measured, met(all_201 == in_flight && one_each))
        });
        row(&target, name, judged);
        let timeouts = slow.map(|s| s.pool_timeouts);
        let judged = timeouts.map(|n| (format!("{n} in the API's log"), met(n == 0)));
        row("slow: no pool timeouts", name, judged);
        let judged = slow.map(|slow| {
            let replay = p99(&slow.report, "probe_replay");
            let get = p99(&slow.report, "probe_get");
            let ok = replay
                .zip(get)
                .map(|(r, g)| met(r < PROBE_P99_US && g < PROBE_P99_US));
            let measured = format!("replay {}, GET {}", show(replay, ms), show(get, ms));
            (measured, ok.unwrap_or(NOT_RUN))
        });
        row("slow: probe replay and GET p99 < 50 ms", name, judged);
        let rss = slow.and_then(|slow| slow.vm_hwm_kb.or(slow.rss_max_kb));
        let judged = rss.map(|kb| (format!("{} (VmHWM)", mb(kb)), met(kb < RSS_LIMIT_KB)));
        row("slow: API peak RSS < 150 MB", name, judged);

        let judged = b.prune.as_ref().and_then(|prune| {
            let (without, with, ratio) = prune_ratio(prune)?;
            let (overlap, run) = (prune.overlap_secs, prune.run_secs);
            let mut measured = format!("{} -> {} ({ratio:.2}x)", ms(without), ms(with));
            if !prune.overlapped_whole_run {
                let _ = write!(
                    measured,
                    "; the pruner ran only {overlap:.1} s of the {run:.1} s run"
                );
            }
            // A pruner that ran for a sliver of the run says little about the run's p99.
            let short = overlap < run * MIN_PRUNE_OVERLAP;
            Some((
                measured,
                if short {
                    INCONCLUSIVE
                } else {
                    met(ratio <= PRUNE_P99_RATIO)
                },
            ))
        });
        row(&prune_target, name, judged);
    }
    table
}

/// Keys, provider calls, provider charges and 5xx of a storm.
fn storm_figures(storm: &Storm) -> (u64, Option<u64>, Option<u64>, u64) {
    let (report, calls) = (&storm.report, storm.provider_requests);
    let (keys, errors) = (report.operations.started, server_errors(report));
    (keys, calls, report.charges.provider, errors)
}

/// Operations of a `slow` run that ended 201.
fn ended_201(report: &Report) -> u64 {
    let operations = report.stream("operation");
    operations
        .and_then(|o| o.statuses.get(&201).copied())
        .unwrap_or_default()
}

/// p99 without and with the pruner (µs) and their ratio.
fn prune_ratio(prune: &Prune) -> Option<(u64, u64, f64)> {
    let without = p99(&prune.baseline, "charge")?;
    let with = p99(&prune.with_prune, "charge")?;
    Some((without, with, with as f64 / without.max(1) as f64))
}

/// One figure per backend, side by side.
fn key_figures(r: &Results) -> Table {
    type Figure = fn(&BackendResults, &Results) -> Option<String>;
    const CPU: &str = "new: CPU per charge (API + sandbox + load + PostgreSQL)";
    let backends: Vec<&str> = r.backends.iter().map(|b| b.backend).collect();
    let mut table = Table::new(&format!("figure | {}", backends.join(" | ")));
    fn new(b: &BackendResults) -> Option<&StreamReport> {
        b.new.as_ref()?.stream("charge")
    }
    fn replay(b: &BackendResults) -> Option<&StreamReport> {
        b.replay.as_ref()?.stream("replay")
    }
    fn slow(b: &BackendResults) -> Option<&Report> {
        b.slow.as_ref().map(|s| &s.report)
    }
    fn cpu(c: &PerCharge) -> String {
        let parts = [c.api_us, c.sandbox_us, c.load_us, c.postgres_us];
        let total = parts.iter().sum::<f64>();
        format!(
            "{} = {total:.0} µs",
            parts.map(|x| format!("{x:.0} µs")).join(" + ")
        )
    }
    let figures: [(&str, Figure); 17] = [
        ("new: charges/s", |b, _| Some(rate(new(b)?.throughput_rps))),
        ("new: p50 / p99", |b, _| {
            let l = new(b)?.latency_us?;
            Some(format!("{} / {}", ms(l.p50), ms(l.p99)))
        }),
        ("new ÷ pgbench ceiling", |b, r| {
            let new = new(b).filter(|_| b.backend == "postgres")?;
            Some(versus_ceiling(new.throughput_rps, r.pgbench.as_ref()?.tps))
        }),
        (CPU, |b, _| b.new_cpu.as_ref().map(cpu)),
        ("the same, fsync off (supplementary)", |b, _| {
            let f = b.fsync_off.as_ref()?;
            let new = f.new.stream("charge")?;
            Some(versus_ceiling(new.throughput_rps, f.pgbench.tps))
        }),
        ("replay: req/s", |b, _| {
            Some(rate(replay(b)?.throughput_rps))
        }),
        ("replay: p99", |b, _| Some(ms(replay(b)?.latency_us?.p99))),
        ("storm: provider calls per key", |b, _| {
            let (keys, calls, _, _) = storm_figures(b.storm.as_ref()?);
            let per_key = calls? as f64 / keys.max(1) as f64;
            Some(format!("{per_key:.2} ({} calls, {keys} keys)", calls?))
        }),
        ("storm: 5xx", |b, _| {
            Some(server_errors(&b.storm.as_ref()?.report).to_string())
        }),
        ("slow: operations ending 201", |b, _| {
            let report = slow(b)?;
            let in_flight = report.settings["in_flight"].as_u64();
            report.stream("operation")?;
            let in_flight = in_flight.unwrap_or_default();
            Some(format!("{} of {in_flight}", ended_201(report)))
        }),
        (
            "slow: charges (provider / database / operations)",
            |b, _| {
                let report = slow(b)?;
                let (c, started) = (&report.charges, report.operations.started);
                Some(format!(
                    "{} / {} / {started}",
                    opt(c.provider),
                    opt(c.database)
                ))
            },
        ),
        ("slow: pool timeouts", |b, _| {
            Some(b.slow.as_ref()?.pool_timeouts.to_string())
        }),
        ("slow: probe replay p99", |b, _| {
            Some(ms(p99(slow(b)?, "probe_replay")?))
        }),
        ("slow: probe GET p99", |b, _| {
            Some(ms(p99(slow(b)?, "probe_get")?))
        }),
        ("slow: API peak RSS (VmHWM / max sampled)", |b, _| {
            let slow = b.slow.as_ref()?;
            let (hwm, max) = (show(slow.vm_hwm_kb, mb), show(slow.rss_max_kb, mb));
            Some(format!("{hwm} / {max}"))
        }),
        ("prune: new p99 without -> with", |b, _| {
            let (without, with, ratio) = prune_ratio(b.prune.as_ref()?)?;
            Some(format!("{} -> {} ({ratio:.2}x)", ms(without), ms(with)))
        }),
        ("prune: rows, wall time", |b, _| {
            let p = b.prune.as_ref()?;
            Some(format!("{} in {:.1} s", opt(p.deleted), p.prune_wall_secs))
        }),
    ];
    for (name, figure) in figures {
        let cells = r.backends.iter().map(|b| figure(b, r));
        table.row(
            [Some(name.to_owned())]
                .into_iter()
                .chain(cells)
                .map(|c| c.unwrap_or("-".into())),
        );
    }
    table
}

/// `52% (2,502 / 4,780 tps)`.
fn versus_ceiling(rps: f64, tps: f64) -> String {
    format!(
        "{:.0}% ({} / {} tps)",
        100.0 * rps / tps,
        rate(rps),
        rate(tps)
    )
}

/// The pgbench ceiling's section, when it ran.
fn pgbench(r: &Results) -> String {
    let Some(p) = &r.pgbench else {
        return String::new();
    };
    let (clients, threads, seconds) = (p.clients, p.threads, p.seconds);
    let head = "clients | threads | seconds | tps | latency avg | transactions | failed";
    let mut table = Table::new(head);
    let latency = p.latency_avg_ms.map(|l| format!("{l:.3} ms"));
    let (latency, tps) = (latency.unwrap_or_else(|| "-".into()), rate(p.tps));
    let counts = [clients, threads, seconds].map(|n| n.to_string());
    table.row(
        counts
            .into_iter()
            .chain([tps, latency, opt(p.transactions), opt(p.failed)]),
    );
    format!(
        "### pgbench ceiling (PostgreSQL)\n\n`tests/bench/charge.sql` (the SQL of one new \
         charge: the claim, then the finish, one statement each, as \
         `crates/store/src/sql.rs` runs them on PostgreSQL) on a fresh migrated database of the \
         same server, run just before the PostgreSQL `new`:\n`pgbench -n -M prepared -f \
         tests/bench/charge.sql -c {clients} -j {threads} -T {seconds}`.\n\n{table}"
    )
}

/// Each backend's section with a heading, `section` of its results if any.
fn each<T>(
    r: &Results,
    part: fn(&BackendResults) -> Option<&T>,
    section: fn(&T) -> String,
) -> String {
    let parts = r
        .backends
        .iter()
        .filter_map(|b| Some((b.backend, part(b)?)));
    parts
        .map(|(name, part)| format!("#### {name}\n\n{}", section(part)))
        .collect()
}

/// The supplementary section of PostgreSQL without its commit flush.
fn fsync_off(r: &Results) -> String {
    let Some(f) = r.backends.iter().find_map(|b| b.fsync_off.as_ref()) else {
        return String::new();
    };
    let (tps, clients, seconds) = (rate(f.pgbench.tps), f.pgbench.clients, f.pgbench.seconds);
    let runs = each(
        r,
        |b| b.fsync_off.as_ref(),
        |f| f.new.markdown().to_string(),
    );
    format!(
        "### PostgreSQL with the commit flush off (supplementary)\n\nThe same cluster with \
         `fsync`, `synchronous_commit` and `full_page_writes` off, as the tests run it: the \
         pgbench ceiling ({tps} tps, {clients} clients, {seconds} s), then `new` on a fresh \
         database. Not a target: no payments database runs without flushing its commits, but \
         it shows the server's own cost per charge when the database costs only CPU.\n\n{runs}"
    )
}

/// A storm, with the provider's calls.
fn storm(storm: &Storm) -> String {
    let (keys, calls, charged, errors) = storm_figures(storm);
    let (calls, charged) = (opt(calls), opt(charged));
    format!(
        "{}Provider calls (sandbox `requests`): {calls} for {keys} keys; provider charges: \
         {charged}; 5xx answers: {errors}.\n\n",
        storm.report.markdown()
    )
}

/// A slow run, with the API's memory and log.
fn slow(slow: &Slow) -> String {
    let (hwm, max) = (show(slow.vm_hwm_kb, mb), show(slow.rss_max_kb, mb));
    let (timeouts, errors) = (slow.pool_timeouts, slow.error_lines);
    let calls = opt(slow.provider_requests);
    format!(
        "{}API: peak RSS {hwm} (VmHWM; max sampled every 250 ms: {max}); pool timeouts in its \
         log: {timeouts}; ERROR lines: {errors}; provider calls: {calls}.\n\n",
        slow.report.markdown()
    )
}

/// A prune: the pruner's figures, then `new` without and with it.
fn prune(p: &Prune) -> String {
    let mut table = Table::new("figure | value");
    table.row([
        "seeded",
        &format!("{} rows in {:.1} s", p.seeded, p.seed_secs),
    ]);
    let speed = match (p.deleted, p.prune_elapsed_ms) {
        (Some(d), Some(ms)) if ms > 0 => rate(d as f64 * 1000.0 / ms as f64),
        _ => "-".to_owned(),
    };
    let own = p
        .prune_elapsed_ms
        .map(|ms| format!("; its own timing {ms} ms"));
    let exited = if p.prune_ok { "exited 0" } else { "FAILED" };
    let (wall, deleted, batches) = (p.prune_wall_secs, opt(p.deleted), opt(p.batches));
    let rows = format!("{deleted} rows deleted, {batches} batches, {speed} rows/s");
    let own = own.unwrap_or_default();
    table.row([
        "pruner",
        &format!("{exited} in {wall:.2} s wall ({rows}){own}"),
    ]);
    let whole = if p.overlapped_whole_run {
        "the whole run"
    } else {
        "**not the whole run** (a shorter `BENCH_PRUNE_SECONDS`, or more rows, would cover it)"
    };
    let (overlap, run) = (p.overlap_secs, p.run_secs);
    let ran = format!("the pruner ran {overlap:.1} s of the {run:.1} s run: {whole}");
    table.row(["overlap", &ran]);
    table.row(["left after the pass", &opt(p.remaining)]);
    let ratio = prune_ratio(p)
        .map(|(without, with, ratio)| format!("{} -> {} ({ratio:.2}x)", ms(without), ms(with)));
    table.row([
        "new p99 without -> with",
        &ratio.unwrap_or_else(|| "-".into()),
    ]);
    let (baseline, with) = (p.baseline.markdown(), p.with_prune.markdown());
    format!("{table}Without the pruner:\n\n{baseline}With the pruner:\n\n{with}")
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
fn show(value: Option<u64>, format: fn(u64) -> String) -> String {
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
