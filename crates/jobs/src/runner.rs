//! Both jobs on timers until a shutdown signal. A pass that has started
//! always finishes: the signal is only watched between passes, so a record
//! is never left half-driven by a stopping runner.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::Outcome;
use crate::pruner::Pruner;
use crate::reaper::Reaper;
use crate::settings::JobArgs;

/// The jobs a runner drives, and how often.
#[derive(Debug, Clone)]
pub struct Jobs {
    pub reaper: Option<(Reaper, Duration)>,
    pub pruner: Option<(Pruner, Duration)>,
}

impl Jobs {
    /// Runs whichever of `reaper` and `pruner` is given, each every
    /// `--reap-every` / `--prune-every` of `args`.
    pub fn new(reaper: Option<Reaper>, pruner: Option<Pruner>, args: &JobArgs) -> Self {
        Self {
            reaper: reaper.map(|reaper| (reaper, args.reap_every)),
            pruner: pruner.map(|pruner| (pruner, args.prune_every)),
        }
    }

    /// One pass of each job; `Err` if any failed.
    pub async fn run_once(&self) -> Result<Outcome, String> {
        let mut worked = 0;
        let mut errors = Vec::new();
        if let Some((reaper, _)) = &self.reaper {
            match reaper.try_run_once().await {
                Ok(r) if r.failed > 0 => {
                    errors.push(format!("reaper: {} records failed", r.failed))
                }
                Ok(r) => worked += r.total(),
                Err(e) => errors.push(format!("reaper: {e}")),
            }
        }
        if let Some((pruner, _)) = &self.pruner {
            match pruner.try_run_once().await {
                Ok(r) => worked += r.deleted,
                Err(e) => errors.push(format!("pruner: {e}")),
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        Ok(if worked > 0 {
            Outcome::Worked(worked)
        } else {
            Outcome::Idle
        })
    }

    /// Runs each job on its timer (first pass at once) until `shutdown`
    /// resolves. Failed passes are logged and retried on the next tick.
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut next_reap = Instant::now();
        let mut next_prune = Instant::now();
        loop {
            let next = match (&self.reaper, &self.pruner) {
                (Some(_), Some(_)) => next_reap.min(next_prune),
                (Some(_), None) => next_reap,
                (None, Some(_)) => next_prune,
                (None, None) => return,
            };
            tokio::select! {
                () = &mut shutdown => {
                    tracing::info!("jobs stopping");
                    return;
                }
                () = tokio::time::sleep_until(next) => {}
            }
            let now = Instant::now();
            if let Some((reaper, every)) = &self.reaper
                && next_reap <= now
            {
                if let Err(e) = reaper.try_run_once().await {
                    tracing::error!(error = %e, "reap pass failed");
                }
                next_reap = Instant::now() + *every;
            }
            if let Some((pruner, every)) = &self.pruner
                && next_prune <= now
            {
                if let Err(e) = pruner.try_run_once().await {
                    tracing::error!(error = %e, "prune pass failed");
                }
                next_prune = Instant::now() + *every;
            }
        }
    }
}
