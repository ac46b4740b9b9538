//! The scenarios. Each returns its streams and one [`OpRecord`] per
//! logical charge (setup charges included); [`super::run`] does the
//! accounting. Each marks its measured part ([`Mark`]): its own requests,
//! after its setup.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use payments_client::model::ChargeStatus;
use tokio::sync::{Barrier, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::operation::{Looked, OpRecord, Operation, Read, Run, Seen};
use super::sandbox::Sandbox;
use super::stream::{Stream, TransportError};
use super::{LoadError, Mark};

/// What a scenario hands back for the report.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub streams: Vec<Arc<Stream>>,
    pub ops: Vec<OpRecord>,
    /// All the planned work ran before the deadline.
    pub completed: bool,
}

/// A charge made in setup, to be re-sent: its operation, the stored answer
/// and the charge id it named.
#[derive(Debug, Clone)]
struct Completed {
    op: Operation,
    body: Vec<u8>,
    charge_id: String,
}

fn stream(name: &'static str, allowed: &'static [u16]) -> Result<Arc<Stream>, LoadError> {
    Ok(Arc::new(
        Stream::new(name, allowed).map_err(|e| LoadError::Internal(e.to_string()))?,
    ))
}

/// Waits for every task; a task that panicked is an internal error.
async fn join_all<T: 'static>(mut tasks: JoinSet<T>) -> Result<Vec<T>, LoadError> {
    let mut results = Vec::with_capacity(tasks.len());
    while let Some(joined) = tasks.join_next().await {
        results.push(joined.map_err(|e| LoadError::Internal(format!("a task failed: {e}")))?);
    }
    Ok(results)
}

/// How a scenario makes its operation `index` labelled `label`: a charge
/// ([`Run::operation`]) or a hold ([`Run::hold`]).
type Make = fn(&Run, &str, u64) -> Result<Operation, serde_json::Error>;

/// Up to `count` operations labelled `label`, made by `make`, each driven
/// to a final answer by the retry loop, on `concurrency` workers. Returns
/// them in index order, and whether all `count` started.
async fn drive_many(
    run: &Arc<Run>,
    label: &'static str,
    count: u64,
    concurrency: u64,
    stream: &Arc<Stream>,
    make: Make,
) -> Result<(Vec<(Operation, OpRecord)>, bool), LoadError> {
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.min(count) {
        let (run, next, stream) = (run.clone(), next.clone(), stream.clone());
        workers.spawn(async move {
            let mut done = Vec::new();
            while run.open() {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let op = make(&run, label, i)?;
                let record = run.drive(&op, &stream).await;
                done.push((i, op, record));
            }
            Ok::<_, LoadError>(done)
        });
    }
    let mut all = Vec::new();
    for done in join_all(workers).await? {
        all.extend(done?);
    }
    all.sort_by_key(|(i, _, _)| *i);
    let completed = all.len() as u64 >= count;
    Ok((
        all.into_iter().map(|(_, op, r)| (op, r)).collect(),
        completed,
    ))
}

/// `work(i)` for every `i` below `total`, on `concurrency` workers, none
/// started after the deadline: how many made what they were after
/// (`Ok(true)`), and whether all `total` started.
async fn each<W, F>(
    run: &Arc<Run>,
    total: u64,
    concurrency: u64,
    work: W,
) -> Result<(u64, bool), LoadError>
where
    W: Fn(u64) -> F + Clone + Send + 'static,
    F: Future<Output = Result<bool, LoadError>> + Send + 'static,
{
    let (next, made) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.min(total) {
        let (run, next, made, work) = (run.clone(), next.clone(), made.clone(), work.clone());
        workers.spawn(async move {
            while run.open() {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                if work(i).await? {
                    made.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, LoadError>(())
        });
    }
    for done in join_all(workers).await? {
        done?;
    }
    let all_started = next.load(Ordering::Relaxed) >= total;
    Ok((made.load(Ordering::Relaxed), all_started))
}

/// The setup charges that ended 201, ready to be re-sent.
fn completed(run: &Run, created: &[(Operation, OpRecord)], wanted: u64) -> Vec<Completed> {
    let done: Vec<Completed> = created
        .iter()
        .filter(|(_, record)| record.charged())
        .filter_map(|(op, record)| {
            Some(Completed {
                op: op.clone(),
                body: record.final_body.clone(),
                charge_id: record.charge_ids.first()?.clone(),
            })
        })
        .collect();
    if (done.len() as u64) < wanted {
        run.violations.push(format!(
            "setup: only {} of {wanted} charges to re-send ended 201",
            done.len()
        ));
    }
    done
}

/// Checks a re-sent completed key: 201, `Idempotent-Replay: true`, and the
/// stored body byte for byte.
fn check_replay(run: &Run, target: &Completed, seen: &Seen, stream: &str) {
    let Seen::Answer(answer) = seen else { return };
    if answer.status != 201 {
        // Counted (and judged) as a disallowed status of the stream.
        return;
    }
    if !answer.replayed {
        run.violations.push(format!(
            "{stream}: key {}: a 201 without Idempotent-Replay: true (charged again?)",
            target.op.key
        ));
    } else if answer.body != target.body {
        run.violations.push(format!(
            "{stream}: key {}: the replay differs from the stored answer",
            target.op.key
        ));
    }
}

/// `new`: every operation a fresh key, `concurrency` at a time.
pub(crate) async fn new_charges(
    run: &Arc<Run>,
    requests: u64,
    concurrency: u64,
) -> Result<Outcome, LoadError> {
    let charge = stream("charge", &[201, 409])?;
    run.mark(Mark::Start);
    let (ops, completed) =
        drive_many(run, "new", requests, concurrency, &charge, Run::operation).await?;
    run.mark(Mark::End);
    Ok(Outcome {
        streams: vec![charge],
        ops: ops.into_iter().map(|(_, r)| r).collect(),
        completed,
    })
}

/// `replay`: `keys` charges made first, then `requests` re-sends of them,
/// round-robin, `concurrency` at a time; every answer must be the stored one.
pub(crate) async fn replay(
    run: &Arc<Run>,
    keys: u64,
    requests: u64,
    concurrency: u64,
) -> Result<Outcome, LoadError> {
    let setup = stream("setup", &[201, 409])?;
    let replays = stream("replay", &[201])?;
    let (created, setup_done) =
        drive_many(run, "replay", keys, concurrency, &setup, Run::operation).await?;
    let targets = Arc::new(completed(run, &created, keys));
    let ops = created.into_iter().map(|(_, r)| r).collect();
    if targets.is_empty() {
        return Ok(Outcome {
            streams: vec![setup, replays],
            ops,
            completed: false,
        });
    }
    run.mark(Mark::Start);
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.min(requests) {
        let (run, next, targets, replays) =
            (run.clone(), next.clone(), targets.clone(), replays.clone());
        workers.spawn(async move {
            while run.open() {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                let target = &targets[(i % targets.len() as u64) as usize];
                let seen = run.send(&target.op, &replays).await;
                check_replay(&run, target, &seen, "replay");
            }
        });
    }
    join_all(workers).await?;
    run.mark(Mark::End);
    let sent = next.load(Ordering::Relaxed).min(requests);
    Ok(Outcome {
        streams: vec![setup, replays],
        ops,
        completed: setup_done && sent >= requests,
    })
}

/// `storm`: for each key, `per_key` requests with the same key and body
/// released at once, `concurrency` keys at a time; then one correct retry of
/// the key, which must end 201.
pub(crate) async fn storm(
    run: &Arc<Run>,
    keys: u64,
    per_key: u64,
    concurrency: u64,
) -> Result<Outcome, LoadError> {
    let storm = stream("storm", &[201, 409])?;
    let last = stream("final", &[201, 409])?;
    run.mark(Mark::Start);
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.min(keys) {
        let (run, next, storm, last) = (run.clone(), next.clone(), storm.clone(), last.clone());
        workers.spawn(async move {
            let mut records = Vec::new();
            while run.open() {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys {
                    break;
                }
                let op = Arc::new(run.operation("storm", i)?);
                records.push(storm_one(&run, &op, per_key, &storm, &last).await?);
            }
            Ok::<_, LoadError>(records)
        });
    }
    let mut ops = Vec::new();
    for records in join_all(workers).await? {
        ops.extend(records?);
    }
    run.mark(Mark::End);
    let completed = ops.len() as u64 >= keys;
    Ok(Outcome {
        streams: vec![storm, last],
        ops,
        completed,
    })
}

async fn storm_one(
    run: &Arc<Run>,
    op: &Arc<Operation>,
    per_key: u64,
    storm: &Arc<Stream>,
    last: &Arc<Stream>,
) -> Result<OpRecord, LoadError> {
    let together = Arc::new(Barrier::new(usize::try_from(per_key).unwrap_or(usize::MAX)));
    let mut requests = JoinSet::new();
    for _ in 0..per_key {
        let (run, op, storm, together) = (run.clone(), op.clone(), storm.clone(), together.clone());
        requests.spawn(async move {
            // Every request is ready before any is sent.
            together.wait().await;
            run.send(&op, &storm).await
        });
    }
    let mut record = OpRecord::new(&op.key);
    for seen in join_all(requests).await? {
        if let Seen::Answer(answer) = seen {
            record.observe(&answer, &run.violations);
        }
    }
    // After the storm the key must be complete: the retry gets 201 (a
    // replay), or 409 then 201 while the winner finishes.
    let after = run.drive(op, last).await;
    if let Some(status) = after.final_status.filter(|s| *s != 201) {
        run.violations.push(format!(
            "storm: key {}: the retry after the storm ended {status}, not 201",
            op.key
        ));
    }
    record.final_status = after.final_status;
    record.final_body = after.final_body.clone();
    record.absorb(after);
    Ok(record)
}

/// `refund`: `charges` charges made first, then `per_charge` refunds of each
/// (equal parts), every refund its own key driven to a final answer,
/// `concurrency` at a time. Each must end 201 naming one refund; with a
/// sandbox, it must have made exactly the refunds answered.
pub(crate) async fn refunds(
    run: &Arc<Run>,
    sandbox: Option<&Sandbox>,
    charges: u64,
    per_charge: u64,
    concurrency: u64,
) -> Result<Outcome, LoadError> {
    let setup = stream("setup", &[201, 409])?;
    let refund = stream("refund", &[201, 409])?;
    let (created, setup_done) =
        drive_many(run, "refund", charges, concurrency, &setup, Run::operation).await?;
    let targets: Arc<Vec<String>> = Arc::new(
        completed(run, &created, charges)
            .into_iter()
            .map(|c| c.charge_id)
            .collect(),
    );
    let ops = created.into_iter().map(|(_, r)| r).collect();
    let part = (run.amount_cents / i64::try_from(per_charge).unwrap_or(i64::MAX)).max(1);
    let total = targets.len() as u64 * per_charge;
    let before = match sandbox {
        Some(sandbox) => Some(sandbox.refund_count().await?),
        None => None,
    };
    let refund_one = {
        let (run, refund) = (run.clone(), refund.clone());
        move |i: u64| {
            let (run, targets, refund) = (run.clone(), targets.clone(), refund.clone());
            async move {
                let op = run.refund(&targets[(i / per_charge) as usize], part)?;
                let record = run.drive(&op, &refund).await;
                match record.final_status {
                    Some(201) if record.charge_ids.len() == 1 => return Ok(true),
                    Some(201) => run.violations.push(format!(
                        "refund: key {}: one key answered with {} refunds",
                        op.key,
                        record.charge_ids.len()
                    )),
                    Some(status) => run
                        .violations
                        .push(format!("refund: key {}: ended {status}, not 201", op.key)),
                    None => {}
                }
                Ok(false)
            }
        }
    };
    run.mark(Mark::Start);
    let (made, all_started) = each(run, total, concurrency, refund_one).await?;
    run.mark(Mark::End);
    if let (Some(sandbox), Some(before)) = (sandbox, before) {
        let at_provider = sandbox.refund_count().await? - before;
        if at_provider != made {
            run.violations.push(format!(
                "refund: the provider made {at_provider} refunds for {made} answered"
            ));
        }
    }
    Ok(Outcome {
        streams: vec![setup, refund],
        ops,
        completed: setup_done && all_started,
    })
}

/// `capture`: `holds` holds authorized first, then each captured in full by
/// the back office, every capture its own key driven by the client's retry
/// loop, `concurrency` at a time. Each must end 201 with the charge
/// `succeeded` and all of it captured; with a sandbox, it must hold exactly
/// one capture of each hold captured, and none of the others.
pub(crate) async fn captures(
    run: &Arc<Run>,
    sandbox: Option<&Sandbox>,
    holds: u64,
    concurrency: u64,
) -> Result<Outcome, LoadError> {
    let setup = stream("setup", &[201, 409])?;
    let capture = stream("capture", &[201])?;
    let (created, setup_done) =
        drive_many(run, "capture", holds, concurrency, &setup, Run::hold).await?;
    let targets = Arc::new(completed(run, &created, holds));
    let provider_ids: BTreeSet<String> = created
        .iter()
        .filter(|(_, record)| record.charged())
        .flat_map(|(_, record)| record.gateway_ids.iter().cloned())
        .collect();
    let ops = created.into_iter().map(|(_, r)| r).collect();
    let capture_one = {
        let (run, capture, targets) = (run.clone(), capture.clone(), targets.clone());
        move |i: u64| {
            let (run, capture, targets) = (run.clone(), capture.clone(), targets.clone());
            async move {
                let hold = &targets[i as usize].charge_id;
                Ok(captured(&run, hold, run.capture(hold, &capture).await))
            }
        }
    };
    run.mark(Mark::Start);
    let (made, all_started) = each(run, targets.len() as u64, concurrency, capture_one).await?;
    run.mark(Mark::End);
    if let Some(sandbox) = sandbox {
        let per_hold = sandbox.captures_of(&provider_ids).await?;
        let at_provider: u64 = per_hold.values().sum();
        if at_provider != made || per_hold.len() as u64 != made {
            run.violations.push(format!(
                "capture: the provider made {at_provider} captures of {} holds for {made} answered",
                per_hold.len()
            ));
        }
    }
    Ok(Outcome {
        streams: vec![setup, capture],
        ops,
        completed: setup_done && all_started,
    })
}

/// Whether a capture of `hold` ended as it must: 201 with the charge,
/// `succeeded`, all of it captured. Anything else answered is a violation.
fn captured(run: &Run, hold: &str, looked: Looked) -> bool {
    match looked {
        Looked::Found(charge)
            if charge.id == hold
                && charge.status == ChargeStatus::Succeeded
                && charge.amount_captured == run.amount_cents =>
        {
            return true;
        }
        Looked::Found(charge) => run.violations.push(format!(
            "capture: {hold}: answered charge {} in status {:?}, {} of {} captured",
            charge.id, charge.status, charge.amount_captured, run.amount_cents
        )),
        Looked::Answered(status) => run.violations.push(format!(
            "capture: {hold}: ended {status}, not 201 with the charge"
        )),
        // No final answer: the stream counts it, and the hold stays
        // uncaptured (not `succeeded` in the database's count).
        Looked::NoAnswer(_) => {}
    }
    false
}

/// `list` and `health`: `requests` reads of one page of `GET /api/charges`
/// or of `GET /healthz`, `concurrency` at a time; every answer must be 200.
pub(crate) async fn reads(
    run: &Arc<Run>,
    read: Read,
    requests: u64,
    concurrency: u64,
) -> Result<Outcome, LoadError> {
    let name = match read {
        Read::Page(_) => "list",
        Read::Health => "health",
    };
    let pages = stream(name, &[200])?;
    run.mark(Mark::Start);
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.min(requests) {
        let (run, next, pages, read) = (run.clone(), next.clone(), pages.clone(), read.clone());
        workers.spawn(async move {
            while run.open() && next.fetch_add(1, Ordering::Relaxed) < requests {
                run.read(&read, &pages).await;
            }
        });
    }
    join_all(workers).await?;
    run.mark(Mark::End);
    Ok(Outcome {
        streams: vec![pages],
        ops: Vec::new(),
        completed: next.load(Ordering::Relaxed) >= requests,
    })
}

/// `slow`'s settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slow {
    pub in_flight: u64,
    pub provider_latency: Duration,
    pub probe_concurrency: u64,
    pub probe_keys: u64,
    pub probe_interval: Duration,
}

/// `slow`: `probe_keys` completed charges made first; then the sandbox's
/// latency is raised and `in_flight` charges start at once, each a correct
/// retry loop until 201, while probes re-send the completed keys and `GET`
/// their charges; the latency goes back to 0 at the end, whatever happened.
pub(crate) async fn slow(
    run: &Arc<Run>,
    sandbox: &Sandbox,
    settings: Slow,
) -> Result<Outcome, LoadError> {
    let setup = stream("setup", &[201, 409])?;
    let (created, setup_done) = drive_many(
        run,
        "probe",
        settings.probe_keys,
        settings.probe_keys,
        &setup,
        Run::operation,
    )
    .await?;
    let targets = Arc::new(completed(run, &created, settings.probe_keys));
    let mut ops: Vec<OpRecord> = created.into_iter().map(|(_, r)| r).collect();

    sandbox.set_latency(settings.provider_latency).await?;
    run.mark(Mark::Start);
    let phase = in_flight(run, settings, targets).await;
    run.mark(Mark::End);
    let restored = sandbox.set_latency(Duration::ZERO).await;
    let (mut streams, charges, all_done) = phase?;
    if let Err(e) = restored {
        run.violations
            .push(format!("could not set the sandbox latency back to 0: {e}"));
    }
    streams.insert(0, setup);
    ops.extend(charges);
    Ok(Outcome {
        streams,
        ops,
        completed: setup_done && all_done,
    })
}

type Phase = (Vec<Arc<Stream>>, Vec<OpRecord>, bool);

async fn in_flight(
    run: &Arc<Run>,
    settings: Slow,
    targets: Arc<Vec<Completed>>,
) -> Result<Phase, LoadError> {
    // 503 `gateway_unavailable` is the contract's answer while the provider
    // is slower than the server's gateway timeout; the loop retries it.
    let charge = stream("charge", &[201, 409, 503])?;
    let operation = stream("operation", &[201])?;
    let probe_replay = stream("probe_replay", &[201])?;
    let probe_get = stream("probe_get", &[200])?;

    let (stop, stopped) = watch::channel(false);
    let mut probes = JoinSet::new();
    if !targets.is_empty() {
        let next = Arc::new(AtomicU64::new(0));
        for _ in 0..settings.probe_concurrency {
            let (run, next, targets) = (run.clone(), next.clone(), targets.clone());
            let (replay, get, mut stopped) =
                (probe_replay.clone(), probe_get.clone(), stopped.clone());
            let interval = settings.probe_interval;
            probes.spawn(async move {
                while run.open() && !*stopped.borrow() {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let target = &targets[(i % targets.len() as u64) as usize];
                    let seen = run.send(&target.op, &replay).await;
                    check_replay(&run, target, &seen, "probe_replay");
                    probe_get_one(&run, target, &get).await;
                    if !interval.is_zero() {
                        // Wakes early when the charges are done.
                        let _ = tokio::time::timeout(interval, stopped.changed()).await;
                    }
                }
            });
        }
    }

    let together = Arc::new(Barrier::new(
        usize::try_from(settings.in_flight).unwrap_or(usize::MAX),
    ));
    let mut charges = JoinSet::new();
    for i in 0..settings.in_flight {
        let op = run.operation("slow", i)?;
        let (run, charge, operation, together) = (
            run.clone(),
            charge.clone(),
            operation.clone(),
            together.clone(),
        );
        charges.spawn(async move {
            // All charges are in flight at once.
            together.wait().await;
            let started = Instant::now();
            let record = run.drive(&op, &charge).await;
            match record.final_status {
                Some(status) => operation.answered(started, status, false),
                None => operation.failed(started, TransportError::Cancelled),
            }
            record
        });
    }
    let records = join_all(charges).await;
    // Stop the probes whatever happened to the charges.
    let _ = stop.send(true);
    join_all(probes).await?;
    let records = records?;
    let all_done = !records.iter().any(OpRecord::unfinished);
    Ok((
        vec![charge, operation, probe_replay, probe_get],
        records,
        all_done,
    ))
}

async fn probe_get_one(run: &Run, target: &Completed, stream: &Stream) {
    match run.get(&target.charge_id, stream).await {
        Looked::Found(charge)
            if charge.id == target.charge_id && charge.status == ChargeStatus::Succeeded => {}
        Looked::Found(charge) => run.violations.push(format!(
            "probe_get: {} answered charge {} in status {:?}",
            target.charge_id, charge.id, charge.status
        )),
        Looked::Answered(200) => run.violations.push(format!(
            "probe_get: {}: a 200 whose body is not a charge",
            target.charge_id
        )),
        // Other statuses are judged as the stream's; no answer is counted.
        Looked::Answered(_) | Looked::NoAnswer(_) => {}
    }
}
