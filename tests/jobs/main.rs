//! The jobs: the reaper and the pruner against real databases and the real
//! sandbox, and `payments-jobs` as a process.
#![allow(clippy::unwrap_used)]

mod lag;
mod pending_refunds;
mod provider;
mod pruner;
mod reaper;
mod reconcile_in_turn;
mod reconciler;
mod runner;
