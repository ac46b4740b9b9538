//! The jobs' own flags; the database, provider and lease flags are
//! `payments_app::Settings`, shared with `payments-api`.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use payments_app::ConfigError;
use payments_app::settings::GatewayArgs;
use payments_domain::service::ChargeService;
use payments_domain::store::Store;

use crate::deliverer::{Deliverer, DelivererSettings};
use crate::progress::ProgressSettings;
use crate::pruner::{Pause, Pruner};
use crate::reaper::{Reaper, ReaperSettings};
use crate::reconciler::{Reconciler, ReconcilerSettings};

/// The jobs' own settings.
#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    /// Give up on a request whose provider outcome is still unknown this
    /// long after it was claimed: record `500 request_abandoned`, charge
    /// `unknown`. Longer than the lease, inside the provider's key retention.
    #[arg(long, env = "ABANDON_AFTER", default_value = "15m", value_parser = humantime::parse_duration)]
    pub abandon_after: Duration,
    /// How often `run` reaps.
    #[arg(long, env = "REAP_EVERY", default_value = "1m", value_parser = humantime::parse_duration)]
    pub reap_every: Duration,
    /// How often `run` marks lapsed holds expired.
    #[arg(long, env = "EXPIRE_EVERY", default_value = "1m", value_parser = humantime::parse_duration)]
    pub expire_every: Duration,
    /// How often `run` prunes.
    #[arg(long, env = "PRUNE_EVERY", default_value = "1h", value_parser = humantime::parse_duration)]
    pub prune_every: Duration,
    /// Records one reaper pass handles at most.
    #[arg(long, env = "REAP_BATCH", default_value_t = 500)]
    pub reap_batch: u32,
    /// Provider calls one reaper makes at once.
    #[arg(long, env = "REAP_CONCURRENCY", default_value_t = 4)]
    pub reap_concurrency: u32,
    /// Rows deleted per statement (and transaction) by the pruner. Default:
    /// 5000, and 250 on SQLite, where a batch holds the only write lock.
    #[arg(long, env = "PRUNE_BATCH")]
    pub prune_batch: Option<u32>,
    /// The pruner's pause between batches (`0s`: none). Default: as long as
    /// the last batch took, so it holds the database at most half the time,
    /// and at least 25 ms on SQLite so the API's writes get in.
    #[arg(long, env = "PRUNE_PAUSE", value_parser = humantime::parse_duration)]
    pub prune_pause: Option<Duration>,
    /// How long after the provider could last have acted on its last call
    /// (the call's send time plus GATEWAY_TIMEOUT plus
    /// PROVIDER_MAX_PROCESSING) an unknown charge or refund may still be
    /// missing from the provider's search; only past it does reconciliation
    /// conclude "not made" (Stripe's search usually lags under a minute,
    /// longer during incidents). At least PROVIDER_MAX_PROCESSING.
    #[arg(long, env = "RECONCILE_SEARCH_LAG", default_value = "5m", value_parser = humantime::parse_duration)]
    pub reconcile_search_lag: Duration,
    /// How often `run` reconciles.
    #[arg(long, env = "RECONCILE_EVERY", default_value = "5m", value_parser = humantime::parse_duration)]
    pub reconcile_every: Duration,
    /// Unknown charges, and refunds, one reconcile pass looks up at most.
    #[arg(long, env = "RECONCILE_BATCH", default_value_t = 100)]
    pub reconcile_batch: u32,
    /// How far back each reconcile pass reads the provider's charges and
    /// refunds for orphans (ours at the provider, with no row here). It
    /// reads every charge and refund of the window, each checked by one
    /// primary-key read: size it to the volume, and widen it once after the
    /// jobs were stopped for longer. `0s`: no orphan search.
    #[arg(long, env = "RECONCILE_ORPHAN_WINDOW", default_value = "1h", value_parser = humantime::parse_duration)]
    pub reconcile_orphan_window: Duration,
    /// How often a long prune or reconcile logs its progress (rows done,
    /// rate, time left); the first line this long after the pass starts.
    /// `0s`: after every batch.
    #[arg(long, env = "PROGRESS_EVERY", default_value = "5s", value_parser = humantime::parse_duration)]
    pub progress_every: Duration,
    /// The merchant's webhook endpoints, a JSON array: `[{"url":
    /// "https://shop.example/hooks", "secret": "whsec_...", "events":
    /// ["charge.succeeded"]}]` (`secrets: [new, old]` during a rotation;
    /// no `events`: all). Empty: events are kept and listed, not sent
    /// (docs/webhooks.md).
    #[arg(
        long,
        env = "WEBHOOK_ENDPOINTS",
        default_value = "",
        hide_env_values = true,
        hide_default_value = true
    )]
    pub webhook_endpoints: String,
    /// How long a webhook attempt may take before it counts as failed.
    #[arg(long, env = "WEBHOOK_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub webhook_timeout: Duration,
    /// How long a runner holds a delivery while it attempts it; longer than
    /// WEBHOOK_TIMEOUT, so a slow attempt is never made twice at once.
    #[arg(long, env = "WEBHOOK_LEASE", default_value = "1m", value_parser = humantime::parse_duration)]
    pub webhook_lease: Duration,
    /// How long a delivery is retried before it is given up (failed, until
    /// `payments-jobs webhooks --resend-failed`).
    #[arg(long, env = "WEBHOOK_RETRY_FOR", default_value = "3days", value_parser = humantime::parse_duration)]
    pub webhook_retry_for: Duration,
    /// The first retry's delay, doubled per attempt (with jitter) up to
    /// WEBHOOK_BACKOFF_MAX.
    #[arg(long, env = "WEBHOOK_BACKOFF", default_value = "30s", value_parser = humantime::parse_duration)]
    pub webhook_backoff: Duration,
    #[arg(long, env = "WEBHOOK_BACKOFF_MAX", default_value = "1h", value_parser = humantime::parse_duration)]
    pub webhook_backoff_max: Duration,
    /// Deliver to private, link-local and other internal addresses too
    /// (checked when connecting); only for a receiver on the merchant's own
    /// private network. Loopback URLs are always allowed.
    #[arg(long, env = "WEBHOOK_ALLOW_PRIVATE_NETWORKS", default_value_t = false)]
    pub webhook_allow_private_networks: bool,
    /// How often `run` dispatches and delivers events.
    #[arg(long, env = "DELIVER_EVERY", default_value = "5s", value_parser = humantime::parse_duration)]
    pub deliver_every: Duration,
    /// Deliveries one runner leases at a time.
    #[arg(long, env = "DELIVER_BATCH", default_value_t = 100)]
    pub deliver_batch: u32,
    /// Webhook attempts one runner makes at once.
    #[arg(long, env = "DELIVER_CONCURRENCY", default_value_t = 8)]
    pub deliver_concurrency: u32,
    /// How long events are kept (`GET /api/events`, re-sends); longer than
    /// WEBHOOK_RETRY_FOR. An event with a delivery still to make is kept.
    #[arg(long, env = "EVENT_RETENTION", default_value = "30days", value_parser = humantime::parse_duration)]
    pub event_retention: Duration,
    /// Draw a progress bar on stderr as well (`payments-jobs` sets it when
    /// stderr is a terminal and the logs are text).
    #[arg(skip)]
    pub progress_bar: bool,
}

impl JobArgs {
    /// The reaper these settings describe, re-driving with `service`'s
    /// lease.
    pub fn reaper(&self, service: Arc<ChargeService>, lease: Duration) -> Reaper {
        Reaper::new(service, self.reaper_settings(lease))
    }

    /// The reaper's settings, with `lease`.
    pub fn reaper_settings(&self, lease: Duration) -> ReaperSettings {
        ReaperSettings {
            lease,
            abandon_after: self.abandon_after,
            batch: self.reap_batch,
            concurrency: self.reap_concurrency,
        }
    }

    fn progress(&self) -> ProgressSettings {
        ProgressSettings {
            every: self.progress_every,
            bar: self.progress_bar,
        }
    }

    /// The reconciler these settings describe.
    pub fn reconciler(&self, service: Arc<ChargeService>) -> Reconciler {
        let settings = ReconcilerSettings {
            search_lag: self.reconcile_search_lag,
            batch: self.reconcile_batch,
            orphan_window: self.reconcile_orphan_window,
            progress: self.progress(),
        };
        Reconciler::new(service, settings)
    }

    /// The pruner these settings describe.
    pub fn pruner(&self, store: Arc<dyn Store>) -> Pruner {
        let pause = match self.prune_pause {
            Some(pause) => Pause::Fixed(pause),
            None => Pause::AsLongAsTheBatch,
        };
        Pruner::new(store, self.prune_batch)
            .with_pause(pause)
            .with_progress(self.progress())
            .with_event_retention(self.event_retention)
    }

    /// The deliverer these settings describe (WEBHOOK_ENDPOINTS parsed
    /// again: [`JobArgs::validate`] has refused a bad one already).
    pub fn deliverer(&self, store: Arc<dyn Store>) -> Result<Deliverer, ConfigError> {
        let sender = payments_gateway::webhook::HttpWebhookSender::new(
            self.webhook_timeout,
            self.webhook_allow_private_networks,
        )
        .map_err(|e| ConfigError(format!("the webhook HTTP client: {e}")))?;
        let settings = DelivererSettings {
            endpoints: payments_app::webhooks::parse_endpoints(&self.webhook_endpoints)?,
            lease: self.webhook_lease,
            retry_for: self.webhook_retry_for,
            backoff: self.webhook_backoff,
            backoff_max: self.webhook_backoff_max,
            batch: self.deliver_batch,
            concurrency: usize::try_from(self.deliver_concurrency).unwrap_or(usize::MAX),
        };
        Ok(Deliverer::new(store, Arc::new(sender), settings))
    }

    /// The jobs' rules, against the provider's key retention and the lease.
    pub fn validate(&self, gateway: &GatewayArgs) -> Result<(), ConfigError> {
        if self.abandon_after <= gateway.lease {
            return Err(ConfigError(format!(
                "--abandon-after ({}) must be longer than LEASE ({}): a request must get at \
                 least one re-drive before it is abandoned",
                humantime::format_duration(self.abandon_after),
                humantime::format_duration(gateway.lease)
            )));
        }
        if self.abandon_after + gateway.provider_key_margin >= gateway.provider_key_retention {
            return Err(ConfigError(format!(
                "--abandon-after ({}) plus PROVIDER_KEY_MARGIN ({}) must be shorter than \
                 PROVIDER_KEY_RETENTION ({}): re-drives must end before the provider may \
                 forget its key, or a re-drive could charge twice",
                humantime::format_duration(self.abandon_after),
                humantime::format_duration(gateway.provider_key_margin),
                humantime::format_duration(gateway.provider_key_retention)
            )));
        }
        if self.reconcile_search_lag < gateway.provider_max_processing {
            return Err(ConfigError(format!(
                "RECONCILE_SEARCH_LAG ({}) must be at least PROVIDER_MAX_PROCESSING ({}): an \
                 operation the provider is still making must not be concluded \"not made\"",
                humantime::format_duration(self.reconcile_search_lag),
                humantime::format_duration(gateway.provider_max_processing)
            )));
        }
        if self.reap_every.is_zero()
            || self.prune_every.is_zero()
            || self.reconcile_every.is_zero()
            || self.expire_every.is_zero()
            || self.deliver_every.is_zero()
        {
            return Err(
                "--reap-every, --prune-every, --reconcile-every, --expire-every and \
                 --deliver-every must be greater than 0"
                    .into(),
            );
        }
        if self.reap_batch == 0
            || self.prune_batch == Some(0)
            || self.reap_concurrency == 0
            || self.reconcile_batch == 0
            || self.deliver_batch == 0
            || self.deliver_concurrency == 0
        {
            return Err(
                "--reap-batch, --reap-concurrency, --prune-batch, --reconcile-batch, \
                 --deliver-batch and --deliver-concurrency must be at least 1"
                    .into(),
            );
        }
        self.validate_webhooks()
    }

    /// The webhooks' rules: the endpoints parse, the lease outlasts an
    /// attempt, events outlive their deliveries.
    fn validate_webhooks(&self) -> Result<(), ConfigError> {
        payments_app::webhooks::parse_endpoints(&self.webhook_endpoints)?;
        let show = humantime::format_duration;
        if self.webhook_lease < self.webhook_timeout + LEASE_OVER_TIMEOUT {
            return Err(ConfigError(format!(
                "WEBHOOK_LEASE ({}) must be at least WEBHOOK_TIMEOUT ({}) plus {}: a delivery \
                 still being attempted must not be leased to another runner",
                show(self.webhook_lease),
                show(self.webhook_timeout),
                show(LEASE_OVER_TIMEOUT)
            )));
        }
        if self.event_retention <= self.webhook_retry_for {
            return Err(ConfigError(format!(
                "EVENT_RETENTION ({}) must be longer than WEBHOOK_RETRY_FOR ({}): an event must \
                 outlive its deliveries' retries, and be there to re-send after",
                show(self.event_retention),
                show(self.webhook_retry_for)
            )));
        }
        if self.webhook_backoff.is_zero() || self.webhook_backoff > self.webhook_backoff_max {
            return Err(ConfigError(format!(
                "WEBHOOK_BACKOFF ({}) must be greater than 0 and at most WEBHOOK_BACKOFF_MAX ({})",
                show(self.webhook_backoff),
                show(self.webhook_backoff_max)
            )));
        }
        Ok(())
    }
}

/// How much longer than an attempt's timeout a delivery's lease is, at
/// least: the attempt's recording, and a slow runner.
const LEASE_OVER_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use clap::FromArgMatches;

    /// Why the jobs' settings refuse `args`, if they do.
    fn refused(args: &[&str]) -> Option<String> {
        let command = JobArgs::augment_args(GatewayArgs::augment_args(clap::Command::new("x")));
        let matches = command
            .try_get_matches_from(std::iter::once("x").chain(args.iter().copied()))
            .expect("parses");
        let gateway = GatewayArgs::from_arg_matches(&matches).expect("gateway flags");
        let jobs = JobArgs::from_arg_matches(&matches).expect("job flags");
        jobs.validate(&gateway).err().map(|e| e.0)
    }

    #[test]
    fn abandon_after_must_sit_between_the_lease_and_the_key_retention() {
        assert_eq!(refused(&[]), None);
        let short = refused(&["--abandon-after=20s"]).expect("refused");
        assert!(short.contains("LEASE"), "{short}");
        // 23 h + the 1 h margin reaches the 24 h retention.
        let long = refused(&["--abandon-after=23h"]).expect("refused");
        assert!(long.contains("PROVIDER_KEY_RETENTION"), "{long}");
        assert_eq!(refused(&["--abandon-after=22h59m"]), None);
    }

    #[test]
    fn webhook_settings_are_refused_where_they_would_lose_or_double_deliveries() {
        let lease = refused(&["--webhook-lease=10s", "--webhook-timeout=10s"]).expect("refused");
        assert!(lease.contains("WEBHOOK_LEASE"), "{lease}");
        assert_eq!(
            refused(&["--webhook-lease=15s", "--webhook-timeout=10s"]),
            None
        );
        let retention = refused(&["--event-retention=3days"]).expect("refused");
        assert!(retention.contains("EVENT_RETENTION"), "{retention}");
        assert_eq!(refused(&["--event-retention=4days"]), None);
        let backoff = refused(&["--webhook-backoff=2h"]).expect("refused");
        assert!(backoff.contains("WEBHOOK_BACKOFF"), "{backoff}");
        let private = refused(&[
            "--webhook-endpoints",
            r#"[{"url":"http://10.0.0.1/h","secret":"whsec_0123456789abcdefghijkl"}]"#,
        ])
        .expect("refused");
        assert!(private.contains("WEBHOOK_ENDPOINTS"), "{private}");
    }

    #[test]
    fn the_search_lag_is_at_least_the_provider_max_processing() {
        let short = refused(&["--reconcile-search-lag=0s"]).expect("refused");
        assert!(
            short.contains("RECONCILE_SEARCH_LAG") && short.contains("PROVIDER_MAX_PROCESSING"),
            "{short}"
        );
        let below = refused(&["--reconcile-search-lag=2m", "--provider-max-processing=3m"])
            .expect("refused");
        assert!(below.contains("PROVIDER_MAX_PROCESSING"), "{below}");
        assert_eq!(
            refused(&["--reconcile-search-lag=3m", "--provider-max-processing=3m"]),
            None
        );
    }
}
