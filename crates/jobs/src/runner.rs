//! The jobs on timers until a shutdown signal. A pass that has started
//! always finishes: the signal is only watched between passes, so a record
//! is never left half-driven by a stopping runner.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::Outcome;
use crate::deliverer::Deliverer;
use crate::expirer::Expirer;
use crate::pruner::Pruner;
use crate::reaper::Reaper;
use crate::reconciler::Reconciler;
use crate::settings::JobArgs;

/// One job a runner drives.
#[derive(Debug, Clone)]
pub enum Job {
    Reap(Reaper),
    Prune(Pruner),
    Reconcile(Reconciler),
    Expire(Expirer),
    Deliver(Deliverer),
}

impl Job {
    fn name(&self) -> &'static str {
        match self {
            Self::Reap(_) => "reaper",
            Self::Prune(_) => "pruner",
            Self::Reconcile(_) => "reconciler",
            Self::Expire(_) => "expirer",
            Self::Deliver(_) => "deliverer",
        }
    }

    /// One pass: the rows it worked on, or why it failed.
    async fn pass(&self) -> Result<u64, String> {
        match self {
            Self::Reap(reaper) => match reaper.try_run_once().await {
                Ok(r) if r.failed > 0 => Err(format!("{} records failed", r.failed)),
                Ok(r) => Ok(r.total()),
                Err(e) => Err(e.to_string()),
            },
            Self::Prune(pruner) => pruner
                .try_run_once()
                .await
                .map(|r| r.deleted)
                .map_err(|e| e.to_string()),
            Self::Reconcile(reconciler) => match reconciler.try_run_once().await {
                Ok(r) if r.lookup_failed > 0 => {
                    Err(format!("{} provider lookups failed", r.lookup_failed))
                }
                Ok(r) => Ok(r.settled()),
                Err(e) => Err(e.to_string()),
            },
            Self::Expire(expirer) => expirer
                .try_run_once()
                .await
                .map(|r| r.expired)
                .map_err(|e| e.to_string()),
            Self::Deliver(deliverer) => deliverer
                .try_run_once()
                .await
                .map(|r| r.total())
                .map_err(|e| e.to_string()),
        }
    }
}

/// The jobs a runner drives, each with how often.
#[derive(Debug, Clone)]
pub struct Jobs {
    pub jobs: Vec<(Job, Duration)>,
}

impl Jobs {
    /// Runs whichever jobs are given, each every `--reap-every`,
    /// `--prune-every`, `--reconcile-every`, `--expire-every` or
    /// `--deliver-every` of `args`.
    pub fn new(jobs: impl IntoIterator<Item = Job>, args: &JobArgs) -> Self {
        let every = |job: &Job| match job {
            Job::Reap(_) => args.reap_every,
            Job::Prune(_) => args.prune_every,
            Job::Reconcile(_) => args.reconcile_every,
            Job::Expire(_) => args.expire_every,
            Job::Deliver(_) => args.deliver_every,
        };
        Self {
            jobs: jobs
                .into_iter()
                .map(|job| {
                    let every = every(&job);
                    (job, every)
                })
                .collect(),
        }
    }

    /// One pass of each job; `Err` if any failed.
    pub async fn run_once(&self) -> Result<Outcome, String> {
        let mut worked = 0;
        let mut errors = Vec::new();
        for (job, _) in &self.jobs {
            match job.pass().await {
                Ok(n) => worked += n,
                Err(e) => errors.push(format!("{}: {e}", job.name())),
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
        let mut next: Vec<Instant> = self.jobs.iter().map(|_| Instant::now()).collect();
        loop {
            let Some(&soonest) = next.iter().min() else {
                return;
            };
            tokio::select! {
                () = &mut shutdown => {
                    tracing::info!("jobs stopping");
                    return;
                }
                () = tokio::time::sleep_until(soonest) => {}
            }
            let now = Instant::now();
            for ((job, every), next) in self.jobs.iter().zip(next.iter_mut()) {
                if *next <= now {
                    if let Err(e) = job.pass().await {
                        tracing::error!(job = job.name(), error = %e, "pass failed");
                    }
                    *next = Instant::now() + *every;
                }
            }
        }
    }
}
