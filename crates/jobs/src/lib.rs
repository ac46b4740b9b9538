//! # payments-jobs
//!
//! The background work that keeps exactly-once true over time
//! (`docs/operations.md`): the reaper finishes requests nobody else will (a crashed API
//! process, a client that never came back after a 503) with the provider's
//! real outcome, and the pruner keeps the key table small.
//!
//! # Layout
//!
//! - [`reaper`]: takes over in-progress records whose lease expired and
//!   re-drives the provider call with the charge's stored provider key;
//!   abandons for reconciliation only past `--abandon-after`.
//! - [`pruner`]: deletes complete records past their expiry in bounded
//!   batches.
//! - [`expirer`]: marks holds that lapsed uncaptured `expired`, and
//!   counts holds by status.
//! - [`deliverer`]: events to the merchant's endpoints, signed, at least
//!   once, with backoff; re-sends.
//! - [`reconciler`]: settles charges and refunds left `unknown` from the
//!   provider's records, and replaces their abandoned answers.
//! - [`progress`]: a long pass's progress lines (and bar, at a terminal).
//! - [`runner`]: `run_until_stopped`, the jobs on timers until a shutdown
//!   signal, finishing the pass in hand.
//! - [`settings`]: the jobs' own flags, shared by `payments-jobs` and
//!   `payments-api --with-jobs`; the rest are `payments_app::Settings`.
//!
//! Every job is safe to run on several nodes at once: records are claimed
//! by a conditional update on the lease (with `FOR UPDATE SKIP LOCKED` on
//! PostgreSQL), and deletes take disjoint batches.
#![forbid(unsafe_code)]

pub mod deliverer;
pub mod expirer;
pub mod progress;
pub mod pruner;
pub mod reaper;
pub mod reconciler;
pub mod runner;
pub mod settings;

/// What one pass of a job did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It processed this many rows.
    Worked(u64),
    /// There was nothing to do.
    Idle,
}
