//! The flags and environment variables `payments-api` and `payments-jobs`
//! share (clap `env`; durations like `1500ms`, `5m`, `24h`), and the rules
//! that refuse a dangerous combination before anything starts.

use std::io::IsTerminal;
use std::num::NonZeroU32;
use std::time::Duration;

use clap::Args;
use payments_domain::derive::Derivation;
use payments_domain::store::Store;
use payments_store::{DatabaseUrl, PoolSettings};
use secrecy::{ExposeSecret, SecretString};
use tracing_subscriber::fmt::writer::BoxMakeWriter;

use crate::Provider;

/// Why the settings were refused: the one configuration error of both
/// binaries.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl From<String> for ConfigError {
    fn from(message: String) -> Self {
        Self(message)
    }
}

impl From<&str> for ConfigError {
    fn from(message: &str) -> Self {
        Self(message.to_owned())
    }
}

/// A secret flag's value (clap has no parser for [`SecretString`]).
pub fn secret(value: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(value.into())
}

/// What both binaries assemble a service from ([`crate::build`]).
#[derive(Debug, Clone, Args)]
#[group(id = "shared_settings")]
pub struct Settings {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub gateway: GatewayArgs,
    #[command(flatten)]
    pub charges: ChargeArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

impl Settings {
    /// Every shared rule: the database's, the provider's and lease's, and
    /// the charges'.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.database.validate()?;
        self.gateway.validate()?;
        let retention = self.gateway.provider_key_retention;
        let ttl = self.charges.idempotency_ttl;
        if ttl.is_zero() || ttl > retention {
            return Err(ConfigError(format!(
                "IDEMPOTENCY_TTL ({}) must be greater than 0 and at most the provider's key \
                 retention ({}): a key the provider forgot must not be answered as ours",
                humantime::format_duration(ttl),
                humantime::format_duration(retention)
            )));
        }
        if ttl < MIN_IDEMPOTENCY_TTL {
            if !self.charges.allow_short_ttl {
                return Err(ConfigError(format!(
                    "IDEMPOTENCY_TTL ({}) must be at least {}: clients resume a payment with its \
                     key for as long as the server says it remembers keys, and a key forgotten \
                     sooner charges again (ALLOW_SHORT_TTL=true lifts this, for tests only)",
                    humantime::format_duration(ttl),
                    humantime::format_duration(MIN_IDEMPOTENCY_TTL)
                )));
            }
            tracing::warn!(
                ttl = %humantime::format_duration(ttl),
                "ALLOW_SHORT_TTL: IDEMPOTENCY_TTL is below {}; a client that resumes a payment \
                 after the TTL is charged again. For tests only",
                humantime::format_duration(MIN_IDEMPOTENCY_TTL)
            );
        }
        if self.gateway.lease >= ttl {
            return Err(ConfigError(format!(
                "LEASE ({}) must be shorter than IDEMPOTENCY_TTL ({}): a record expires a TTL \
                 after its claim, so an attempt that finished later would leave an answer \
                 already expired, and its client's next retry would start a second operation",
                humantime::format_duration(self.gateway.lease),
                humantime::format_duration(ttl)
            )));
        }
        if self.charges.hold_expiry.is_zero() {
            return Err("HOLD_EXPIRY must be greater than 0".into());
        }
        if self.charges.hold_capture_margin >= self.charges.hold_expiry {
            return Err(ConfigError(format!(
                "HOLD_CAPTURE_MARGIN ({}) must be shorter than HOLD_EXPIRY ({}): no hold could \
                 ever be captured",
                humantime::format_duration(self.charges.hold_capture_margin),
                humantime::format_duration(self.charges.hold_expiry)
            )));
        }
        if self.charges.max_amount_cents <= 0 {
            return Err("MAX_AMOUNT_CENTS must be greater than 0".into());
        }
        for (prefix, per_minute, burst) in [
            (
                "",
                self.charges.rate_limit_per_minute,
                self.charges.rate_limit_burst,
            ),
            (
                "BACKOFFICE_",
                self.charges.backoffice_rate_limit_per_minute,
                self.charges.backoffice_rate_limit_burst,
            ),
        ] {
            if per_minute > 0 && burst == 0 {
                return Err(ConfigError(format!(
                    "{prefix}RATE_LIMIT_BURST must be at least 1 while \
                     {prefix}RATE_LIMIT_PER_MINUTE is set ({prefix}RATE_LIMIT_PER_MINUTE=0 turns \
                     the limit off)"
                )));
            }
        }
        Ok(())
    }
}

/// The charges' limits.
#[derive(Debug, Clone, Args)]
pub struct ChargeArgs {
    /// How long a key is remembered. At most the provider's key retention (24h).
    #[arg(long, env = "IDEMPOTENCY_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    pub idempotency_ttl: Duration,
    /// FOR TESTS ONLY: accept an IDEMPOTENCY_TTL below 1h (a warning is
    /// logged at start). Clients resume payments for as long as the server
    /// says it remembers keys; a shorter TTL charges a late resume again.
    #[arg(long, env = "ALLOW_SHORT_TTL", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub allow_short_ttl: bool,
    /// The largest charge accepted, in minor units.
    #[arg(long, env = "MAX_AMOUNT_CENTS", default_value_t = 1_000_000)]
    pub max_amount_cents: i64,
    /// Memory for copies of completed answers, so a replay needs no
    /// database round trip (MiB; 0: off). At ~0.5 KB a copy, 32 MiB holds
    /// about 60,000 recent keys.
    #[arg(long, env = "REPLAY_CACHE_MB", default_value_t = 32)]
    pub replay_cache_mb: u64,
    /// New charges and refunds (a key with no record yet) each customer may
    /// start per minute, per replica; 0: no limit. Over it: 429
    /// `rate_limited`. Replays, 409s and 422s are never limited.
    #[arg(long, env = "RATE_LIMIT_PER_MINUTE", default_value_t = 30)]
    pub rate_limit_per_minute: u32,
    /// How many of them a customer may start at once before the
    /// per-minute rate applies.
    #[arg(long, env = "RATE_LIMIT_BURST", default_value_t = 10)]
    pub rate_limit_burst: u32,
    /// New refunds (and charges) each back-office subject may start per
    /// minute, per replica; 0 (the default): no limit. The back office is
    /// the merchant's own staff and tools, authenticated by its own
    /// audience or issuer; a limit here brakes a runaway script.
    #[arg(long, env = "BACKOFFICE_RATE_LIMIT_PER_MINUTE", default_value_t = 0)]
    pub backoffice_rate_limit_per_minute: u32,
    /// How many of them a back-office subject may start at once.
    #[arg(long, env = "BACKOFFICE_RATE_LIMIT_BURST", default_value_t = 10)]
    pub backoffice_rate_limit_burst: u32,
    /// How long a hold (`"capture": false`) lasts when the provider does
    /// not say (its `capture_before`): from its authorization. Stripe's
    /// online card holds last 7 days.
    #[arg(long, env = "HOLD_EXPIRY", default_value = "7d", value_parser = humantime::parse_duration)]
    pub hold_expiry: Duration,
    /// A capture is refused (400 `hold_expired`) without calling the
    /// provider once its hold lapses within this: time for the capture
    /// and its retries to reach the provider before the hold is gone.
    #[arg(long, env = "HOLD_CAPTURE_MARGIN", default_value = "1h", value_parser = humantime::parse_duration)]
    pub hold_capture_margin: Duration,
}

impl ChargeArgs {
    /// The rate limit's (per minute, burst), or `None` when it is off.
    pub fn rate_limit(&self) -> Option<(NonZeroU32, NonZeroU32)> {
        Some((
            NonZeroU32::new(self.rate_limit_per_minute)?,
            NonZeroU32::new(self.rate_limit_burst)?,
        ))
    }

    /// The back office's (per minute, burst), or `None` when it is off.
    pub fn backoffice_rate_limit(&self) -> Option<(NonZeroU32, NonZeroU32)> {
        Some((
            NonZeroU32::new(self.backoffice_rate_limit_per_minute)?,
            NonZeroU32::new(self.backoffice_rate_limit_burst)?,
        ))
    }
}

/// The shortest `IDEMPOTENCY_TTL` accepted without `ALLOW_SHORT_TTL`: what
/// the client guide tells apps to assume before an answer has told them the
/// server's TTL (the `Idempotency-Key-TTL` header).
pub const MIN_IDEMPOTENCY_TTL: Duration = Duration::from_secs(60 * 60);

/// How long Stripe remembers its idempotency keys: the default of
/// `PROVIDER_KEY_RETENTION`. Every re-drive must happen inside it.
pub const PROVIDER_KEY_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// The database.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// sqlite://PATH, postgres://USER@HOST/DB or mysql://USER@HOST/DB
    /// (MariaDB too, also as mariadb://).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://data/payments.db"
    )]
    pub database_url: DatabaseUrl,
    /// Connections in the database pool.
    #[arg(long, env = "DATABASE_MAX_CONNECTIONS", default_value_t = 10)]
    pub database_max_connections: u32,
    /// How long a caller waits for a pooled connection.
    #[arg(long, env = "DATABASE_ACQUIRE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub database_acquire_timeout: Duration,
    /// SQLite: the most claims and finishes committed together in one
    /// transaction (group commit: one fsync for the batch); 1 commits each
    /// on its own.
    #[arg(long, env = "SQLITE_WRITE_BATCH", default_value_t = payments_store::DEFAULT_WRITE_BATCH)]
    pub sqlite_write_batch: u32,
}

impl DatabaseArgs {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.database_max_connections == 0 {
            return Err("DATABASE_MAX_CONNECTIONS must be at least 1".into());
        }
        if self.sqlite_write_batch == 0 {
            return Err("SQLITE_WRITE_BATCH must be at least 1".into());
        }
        Ok(())
    }

    /// Opens the store and applies its missing migrations, as a server or
    /// the jobs do at start. On a cluster whose migrations take no lock
    /// (Galera) it only checks them: `payments-api migrate`
    /// ([`Self::migrate`]) runs them, once, before the replicas start.
    pub async fn open(&self) -> anyhow::Result<std::sync::Arc<dyn Store>> {
        let store = self.connect().await?;
        let Err(why) = store.ready().await else {
            return Ok(store);
        };
        if let Some(cluster) = store.cluster() {
            anyhow::bail!(
                "{}: not ready on a {cluster} cluster ({why}); migrations are not applied \
                 at start there, since concurrent migrators would race: run \
                 `payments-api migrate` once against one node, then start the replicas",
                self.database_url
            );
        }
        Self::apply(&*store).await?;
        Ok(store)
    }

    /// Opens the store and applies its missing migrations, on a cluster
    /// too: `payments-api migrate`, the one migrator.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        Self::apply(&*self.connect().await?).await
    }

    async fn connect(&self) -> anyhow::Result<std::sync::Arc<dyn Store>> {
        let pool = PoolSettings {
            max_connections: self.database_max_connections,
            acquire_timeout: self.database_acquire_timeout,
            write_batch: self.sqlite_write_batch,
        };
        payments_store::connect(&self.database_url, &pool)
            .await
            .map_err(|e| anyhow::anyhow!("opening {}: {}", self.database_url, e))
    }

    async fn apply(store: &dyn Store) -> anyhow::Result<()> {
        store
            .migrate()
            .await
            .map_err(|e| anyhow::anyhow!("applying migrations: {}", e))
    }
}

/// The payment provider, and the lease that must outlast a call to it.
#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// The provider's base URL (Stripe-compatible).
    #[arg(long, env = "GATEWAY_URL")]
    pub gateway_url: Option<String>,
    /// The provider's secret key.
    #[arg(long, env = "GATEWAY_SECRET_KEY", hide_env_values = true, value_parser = secret)]
    pub gateway_secret_key: Option<SecretString>,
    /// Timeout of one provider call. The lease must outlast it.
    #[arg(long, env = "GATEWAY_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub gateway_timeout: Duration,
    /// How long a driver (API request or reaper) owns an in-progress request.
    #[arg(long, env = "LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// How long the provider remembers its idempotency keys (Stripe: 24h).
    #[arg(long, env = "PROVIDER_KEY_RETENTION", default_value = "24h", value_parser = humantime::parse_duration)]
    pub provider_key_retention: Duration,
    /// No provider call re-drives a record claimed longer ago than the key
    /// retention minus this margin: such a record is abandoned instead. At
    /// least LEASE + GATEWAY_TIMEOUT, the latest a call under a lease taken
    /// just inside the limit can reach the provider.
    #[arg(long, env = "PROVIDER_KEY_MARGIN", default_value = "1h", value_parser = humantime::parse_duration)]
    pub provider_key_margin: Duration,
    /// How long the provider may still act on a call after we stop waiting
    /// for it (GATEWAY_TIMEOUT bounds only our wait). Reconciliation counts
    /// its search lag from a call's send time plus GATEWAY_TIMEOUT plus
    /// this; RECONCILE_SEARCH_LAG must be at least this long.
    #[arg(long, env = "PROVIDER_MAX_PROCESSING", default_value = "5m", value_parser = humantime::parse_duration)]
    pub provider_max_processing: Duration,
    /// Allow plain http to a GATEWAY_URL host that is not loopback. Only
    /// for a sandbox on a private network (the docker compose stack): the
    /// secret key travels in clear. Refused with a live key (`sk_live_`,
    /// `rk_live_`); a warning is logged at start.
    #[arg(long, env = "GATEWAY_ALLOW_PLAIN_HTTP", value_parser = clap::builder::BoolishValueParser::new())]
    pub gateway_allow_plain_http: bool,
    /// The Stripe API version sent as `Stripe-Version` on every provider
    /// call, so answers keep the shape this server reads whatever the
    /// account's default version is. Change it only with the code.
    #[arg(long, env = "GATEWAY_STRIPE_VERSION", default_value = payments_gateway::DEFAULT_STRIPE_VERSION)]
    pub gateway_stripe_version: String,
    /// The secret keyed operations' ids and provider idempotency keys are
    /// derived under (HMAC-SHA256, at least 32 bytes). Required with a real
    /// GATEWAY_URL; identical on every replica and jobs runner of one
    /// database (checked at start); never rotated: a new secret derives new
    /// keys, and a retry after a lost write would charge again.
    #[arg(long, env = "PROVIDER_KEY_SECRET", hide_env_values = true, value_parser = secret)]
    pub provider_key_secret: Option<SecretString>,
}

/// The derivation secret used without PROVIDER_KEY_SECRET, for a sandbox on
/// loopback only; refused next to a real provider.
pub const DEV_PROVIDER_KEY_SECRET: &str = "payments-development-provider-key-secret";

/// The sandbox's secret key; refused next to a real provider.
pub const SANDBOX_SECRET_KEY: &str = "sk_test_sandbox";

/// The secret the in-process sandbox signs its webhooks with (the
/// sandbox's default), which a server against it takes: development only,
/// refused with a real GATEWAY_URL.
pub const SANDBOX_WEBHOOK_SECRET: &str = "whsec_sandbox_development_secret_not_for_production";

impl GatewayArgs {
    /// The age past which a record is never re-driven: the provider's key
    /// retention minus the margin.
    pub fn redrive_limit(&self) -> Duration {
        self.provider_key_retention
            .saturating_sub(self.provider_key_margin)
    }

    /// How long after a call was sent the provider may still act on it:
    /// GATEWAY_TIMEOUT plus PROVIDER_MAX_PROCESSING.
    pub fn provider_acts_within(&self) -> Duration {
        self.gateway_timeout
            .saturating_add(self.provider_max_processing)
    }

    /// What ids and provider keys are derived under: PROVIDER_KEY_SECRET,
    /// or the development secret where no real provider is configured.
    pub fn derivation(&self) -> Result<Derivation, ConfigError> {
        let secret = match &self.provider_key_secret {
            Some(secret) => secret.expose_secret(),
            None if self.is_real() => {
                return Err(
                    "PROVIDER_KEY_SECRET must be set with a real GATEWAY_URL: provider \
                     idempotency keys are derived under it (at least 32 bytes, e.g. \
                     `openssl rand -hex 32`; the same on every replica and jobs runner, \
                     never rotated)"
                        .into(),
                );
            }
            None => DEV_PROVIDER_KEY_SECRET,
        };
        if self.is_real() && secret == DEV_PROVIDER_KEY_SECRET {
            return Err(
                "refusing to start: a real GATEWAY_URL with the development PROVIDER_KEY_SECRET"
                    .into(),
            );
        }
        Derivation::new(secret.as_bytes()).map_err(|e| ConfigError(e.to_string()))
    }

    /// The lease, timeout and key-retention rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !payments_gateway::is_stripe_version(&self.gateway_stripe_version) {
            return Err(ConfigError(format!(
                "GATEWAY_STRIPE_VERSION {:?} is not a Stripe API version (YYYY-MM-DD, \
                 optionally .name, e.g. {})",
                self.gateway_stripe_version,
                payments_gateway::DEFAULT_STRIPE_VERSION
            )));
        }
        if self.gateway_timeout.is_zero() {
            return Err("GATEWAY_TIMEOUT must be greater than 0".into());
        }
        if self.provider_max_processing.is_zero() {
            return Err(
                "PROVIDER_MAX_PROCESSING must be greater than 0: a provider may go on \
                 processing a call after we stop waiting for it"
                    .into(),
            );
        }
        let least_margin = self.lease + self.gateway_timeout;
        if self.provider_key_margin < least_margin {
            return Err(ConfigError(format!(
                "PROVIDER_KEY_MARGIN ({}) must be at least LEASE + GATEWAY_TIMEOUT ({}): a \
                 re-drive taken just inside the limit may reach the provider that much later",
                humantime::format_duration(self.provider_key_margin),
                humantime::format_duration(least_margin)
            )));
        }
        if self.provider_key_margin >= self.provider_key_retention {
            return Err(ConfigError(format!(
                "PROVIDER_KEY_MARGIN ({}) must be shorter than PROVIDER_KEY_RETENTION ({})",
                humantime::format_duration(self.provider_key_margin),
                humantime::format_duration(self.provider_key_retention)
            )));
        }
        if self.lease <= self.gateway_timeout {
            return Err(ConfigError(format!(
                "LEASE ({}) must be longer than GATEWAY_TIMEOUT ({}): a shorter lease lets a \
                 retry take over a provider call that is still running",
                humantime::format_duration(self.lease),
                humantime::format_duration(self.gateway_timeout)
            )));
        }
        Ok(())
    }

    /// The provider GATEWAY_URL names, or `None` when it is unset. A
    /// loopback URL is development (the sandbox); anything else may move
    /// real money ([`Self::is_real`]) and must not use the sandbox's key.
    pub fn remote(&self) -> Result<Option<Provider>, ConfigError> {
        let Some(url) = &self.gateway_url else {
            return Ok(None);
        };
        let secret_key = self
            .gateway_secret_key
            .clone()
            .ok_or("GATEWAY_URL is set but GATEWAY_SECRET_KEY is not")?;
        let live = ["sk_live_", "rk_live_"]
            .iter()
            .any(|p| secret_key.expose_secret().starts_with(p));
        match parse_gateway_url(url) {
            Ok(_) => {}
            // The one exception to the rule, for a sandbox on a private
            // network: asked for by name, never with a live key.
            Err(refused) if self.gateway_allow_plain_http && !live => {
                let parsed = url::Url::parse(url).ok();
                if parsed.as_ref().is_none_or(|u| u.scheme() != "http") {
                    return Err(refused);
                }
                let mut as_https = url.clone();
                as_https.replace_range(..4, "https");
                parse_gateway_url(&as_https)?;
                tracing::warn!(
                    gateway_url = %url,
                    "GATEWAY_ALLOW_PLAIN_HTTP: the provider's secret key travels in clear to a \
                     host that is not loopback; acceptable only for a sandbox on a private network"
                );
            }
            Err(refused) if self.gateway_allow_plain_http => {
                return Err(ConfigError(format!(
                    "{}; GATEWAY_ALLOW_PLAIN_HTTP is refused with a live secret key",
                    refused.0
                )));
            }
            Err(refused) => return Err(refused),
        }
        if self.is_real() && secret_key.expose_secret() == SANDBOX_SECRET_KEY {
            return Err(
                "refusing to start: a real GATEWAY_URL with the sandbox's GATEWAY_SECRET_KEY"
                    .into(),
            );
        }
        Ok(Some(Provider::Remote {
            url: url.clone(),
            secret_key,
        }))
    }

    /// Whether GATEWAY_URL names a host other than loopback: a provider
    /// that may move real money. (Plain http to such a host is refused,
    /// or allowed by GATEWAY_ALLOW_PLAIN_HTTP: it is real all the same.)
    pub fn is_real(&self) -> bool {
        self.gateway_url.as_deref().is_some_and(|url| {
            let parsed = parse_gateway_url(url).ok().or_else(|| {
                url::Url::parse(url)
                    .ok()
                    .filter(|u| u.scheme() == "http" && u.username().is_empty())
            });
            parsed.is_some_and(|url| !url.host().is_some_and(|host| host_is_loopback(&host)))
        })
    }
}

/// GATEWAY_URL, parsed as the HTTP client will parse it (WHATWG, the `url`
/// crate), by the rule every URL we send a secret to follows
/// ([`https_or_loopback`]: https, plain http only on loopback, a host, no
/// user info, no backslash); the host decides whether development secrets
/// are allowed.
pub fn parse_gateway_url(raw: &str) -> Result<url::Url, ConfigError> {
    https_or_loopback(
        "GATEWAY_URL",
        raw,
        "GATEWAY_SECRET_KEY would travel in clear, and anyone on the way could read it and \
         move money with it",
        "the provider is authenticated with GATEWAY_SECRET_KEY, and user info can disguise \
         the real host",
    )
}

/// The rule for every URL this server sends a secret to or trusts what it
/// fetches from (`GATEWAY_URL`, `JWT_JWKS_URL`, `WEBHOOK_ENDPOINTS`): a
/// URL, `https`, or plain `http` only on loopback ([`host_is_loopback`]),
/// with a host, no user info and no backslash (parsers disagree on the host
/// of `https://a.example\@localhost`: `a.example` for the `url` crate,
/// `localhost` for others, and the host decides what is allowed).
/// `setting` names it in every message; `why_https` says what plain http
/// would expose, `why_no_user_info` why user info is refused.
pub fn https_or_loopback(
    setting: &str,
    raw: &str,
    why_https: &str,
    why_no_user_info: &str,
) -> Result<url::Url, ConfigError> {
    if raw.contains('\\') {
        return Err(ConfigError(format!(
            "{setting} {raw:?} contains a backslash: parsers disagree on which host it names; \
             write the URL without it"
        )));
    }
    let url = url::Url::parse(raw)
        .map_err(|e| ConfigError(format!("{setting} {raw:?} is not a URL: {e}")))?;
    let loopback = url.host().is_some_and(|host| host_is_loopback(&host));
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(ConfigError(format!(
                "{setting} must be https (plain http only on loopback): {why_https} (got a URL \
                 whose host is {:?})",
                url.host_str().unwrap_or_default()
            )));
        }
        scheme => {
            return Err(ConfigError(format!(
                "{setting} {raw:?} is not an http(s) URL (scheme {scheme:?})"
            )));
        }
    }
    if url.host().is_none() {
        return Err(ConfigError(format!("{setting} {raw:?} has no host")));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ConfigError(format!(
            "{setting} must not contain user info (user:password@): {why_no_user_info} (got a \
             URL whose host is {:?})",
            url.host_str().unwrap_or_default()
        )));
    }
    Ok(url)
}

/// `localhost`, 127.0.0.0/8 or ::1.
pub fn host_is_loopback<S: AsRef<str>>(host: &url::Host<S>) -> bool {
    match host {
        url::Host::Domain(domain) => domain.as_ref().eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// Log output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The log format flag.
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// Structured logs on stderr, `RUST_LOG` filtering (default `info`). With
/// [`LogFormat::Json`] every line is one JSON object; the binaries then
/// write nothing else to stdout or stderr (see [`log_format`]). Each line
/// is written as it is logged: `payments-jobs` and one-off commands, whose
/// lines take turns with a progress bar and a closing error.
pub fn init_logging(format: LogFormat) {
    init_logging_to(format, BoxMakeWriter::new(std::io::stderr));
}

/// [`init_logging`] for the server: lines gathered in memory and written
/// to stderr by a thread of their own, a burst at a time (see
/// [`crate::logwriter`]: what it saves, and what a user gives up). Without
/// a thread to write them, lines are written as they are logged.
pub fn init_logging_batched(format: LogFormat) {
    match crate::logwriter::Batched::start(std::io::stderr()) {
        Ok((batched, lines)) => {
            *LOG_WRITER.lock().unwrap_or_else(|p| p.into_inner()) = Some(batched);
            init_logging_to(format, BoxMakeWriter::new(lines));
        }
        Err(_) => init_logging(format),
    }
}

fn init_logging_to(format: LogFormat, writer: BoxMakeWriter) {
    let _ = LOG_FORMAT.set(format);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        // Colour codes only for a person at a terminal: in a file or a log
        // pipeline they are noise, and formatting them costs CPU per line.
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The log writer's thread, while it runs.
static LOG_WRITER: std::sync::Mutex<Option<crate::logwriter::Batched>> =
    std::sync::Mutex::new(None);

/// Writes every log line still gathered and stops the writer's thread: the
/// last thing the server does before it exits. Lines logged afterwards
/// are written as they are logged.
pub fn flush_logs() {
    let batched = LOG_WRITER.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(batched) = batched {
        batched.finish();
    }
}

/// From now on the server's lines are gathered and written a burst at a
/// time ([`init_logging_batched`]); until now they were written one by one,
/// so every start-up line is on stderr before the server says it serves.
pub fn batch_logs() {
    if let Some(batched) = &*LOG_WRITER.lock().unwrap_or_else(|p| p.into_inner()) {
        batched.begin();
    }
}

/// The format [`init_logging`] set up, if it ran: a binary's own lines for
/// people (a `listening on` line, a progress bar) are left out with JSON.
pub fn log_format() -> Option<LogFormat> {
    LOG_FORMAT.get().copied()
}

/// Reports the error that ends `program` (exit code 1): an error log line
/// (one JSON object with `LOG_FORMAT=json`, the message being the error);
/// with text logs, or before logging is set up, also a plain
/// `program: error` line on stderr for the person who ran it.
pub fn report_exit_error(program: &str, error: &anyhow::Error) {
    tracing::error!("{error:#}");
    if log_format() != Some(LogFormat::Json) {
        eprintln!("{program}: {error:#}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        gateway: GatewayArgs,
    }

    fn parse(args: &[&str]) -> Cli {
        let mut argv = vec!["x"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).expect("parses")
    }

    #[test]
    fn the_key_margin_covers_a_lease_and_a_call() {
        let ok = parse(&[]);
        assert!(ok.gateway.validate().is_ok());
        assert_eq!(ok.gateway.redrive_limit(), Duration::from_secs(23 * 3600));
        let thin = parse(&["--provider-key-margin=39s"]);
        assert!(
            thin.gateway
                .validate()
                .expect_err("refused")
                .0
                .contains("LEASE + GATEWAY_TIMEOUT")
        );
        let wide = parse(&["--provider-key-retention=1h", "--provider-key-margin=1h"]);
        assert!(wide.gateway.validate().is_err());
        let short = parse(&["--provider-key-retention=10m", "--provider-key-margin=1m"]);
        assert_eq!(short.gateway.redrive_limit(), Duration::from_secs(540));
    }

    #[test]
    fn the_provider_may_act_after_we_stop_waiting() {
        let ok = parse(&["--gateway-timeout=2s", "--provider-max-processing=1m"]);
        assert!(ok.gateway.validate().is_ok());
        assert_eq!(ok.gateway.provider_acts_within(), Duration::from_secs(62));
        let none = parse(&["--provider-max-processing=0s"]);
        let refused = none.gateway.validate().expect_err("refused").0;
        assert!(refused.contains("PROVIDER_MAX_PROCESSING"), "{refused}");
    }

    #[test]
    fn gateway_rules() {
        assert!(
            parse(&["--lease=5s", "--gateway-timeout=10s"])
                .gateway
                .validate()
                .is_err()
        );
        let real_with_sandbox_key = parse(&[
            "--gateway-url=https://api.example.com",
            "--gateway-secret-key=sk_test_sandbox",
        ]);
        assert!(real_with_sandbox_key.gateway.remote().is_err());
        let sandbox = parse(&[
            "--gateway-url=http://127.0.0.1:1",
            "--gateway-secret-key=sk_test_sandbox",
        ]);
        assert!(matches!(sandbox.gateway.remote(), Ok(Some(_))) && !sandbox.gateway.is_real());
        assert!(parse(&["--gateway-url=http://x"]).gateway.remote().is_err());
    }

    #[test]
    fn gateway_urls_with_user_info_or_odd_schemes_are_refused() {
        let gateway = |url: &str, key: &str| {
            let url = format!("--gateway-url={url}");
            let key = format!("--gateway-secret-key={key}");
            parse(&[&url, &key]).gateway
        };
        let remote = |url: &str, key: &str| gateway(url, key).remote().map_err(|e| e.0);
        let hidden = remote(r"https://a.example\@localhost", "sk_live_x").expect_err("refused");
        assert!(hidden.contains("backslash"), "{hidden}");
        for url in [
            "https://user:pass@api.example.com",
            "https://user@localhost",
            "http://a.example:@127.0.0.1",
        ] {
            let e = remote(url, "sk_live_x").expect_err("refused");
            assert!(e.contains("user info"), "{url}: {e}");
        }
        for url in [
            "ftp://localhost",
            "file:///tmp/x",
            "localhost:12111",
            "https://",
        ] {
            assert!(remote(url, "sk_live_x").is_err(), "{url}");
        }
        // The sandbox's key next to any non-loopback host.
        for url in [
            "https://localhost.example.com",
            "https://127.0.0.1.example.com",
            "https://[::ffff:10.0.0.1]:12111",
        ] {
            let e = remote(url, SANDBOX_SECRET_KEY).expect_err("refused");
            assert!(e.contains("sandbox"), "{url}: {e}");
        }
        for url in ["http://localhost:1", "http://127.1:1", "http://[::1]:1/v1"] {
            let sandbox = gateway(url, SANDBOX_SECRET_KEY);
            assert!(
                matches!(sandbox.remote(), Ok(Some(_))) && !sandbox.is_real(),
                "{url}"
            );
        }
        let live = gateway("https://api.example.com", "sk_live_x");
        assert!(matches!(live.remote(), Ok(Some(_))) && live.is_real());
    }

    /// Issue 23, item 3.5: the secret key never travels in clear: plain
    /// http only to loopback, as for JWT_JWKS_URL (one rule, one function).
    #[test]
    fn plain_http_gateway_urls_are_refused_but_on_loopback() {
        let remote = |url: &str| {
            let url = format!("--gateway-url={url}");
            parse(&[&url, "--gateway-secret-key=sk_live_x"])
                .gateway
                .remote()
                .map_err(|e| e.0)
        };
        for url in [
            "http://api.stripe.com",
            "http://sandbox:12111",
            "http://10.0.0.1:12111",
            "http://127.0.0.1.example.com",
            "http://[::ffff:127.0.0.1]:12111",
            "http://localhost.example.com",
        ] {
            let e = remote(url).expect_err(url);
            assert!(
                e.contains("GATEWAY_URL must be https (plain http only on loopback)")
                    && e.contains("in clear"),
                "{url}: {e}"
            );
        }
        for url in [
            "https://api.stripe.com",
            "http://127.0.0.1:12111",
            "http://localhost:12111",
            "http://[::1]:12111",
        ] {
            assert!(
                matches!(remote(url), Ok(Some(_))),
                "{url}: {:?}",
                remote(url)
            );
        }
    }

    #[test]
    fn plain_http_to_a_private_sandbox_only_when_asked_and_never_live() {
        let remote = |url: &str, key: &str, allow: bool| {
            let url = format!("--gateway-url={url}");
            let key = format!("--gateway-secret-key={key}");
            let mut args = vec![url.as_str(), key.as_str()];
            if allow {
                args.push("--gateway-allow-plain-http");
            }
            let gateway = parse(&args).gateway;
            (gateway.remote().map_err(|e| e.0), gateway.is_real())
        };
        let (compose, real) = remote("http://sandbox:12111", "sk_test_compose", true);
        assert!(matches!(compose, Ok(Some(_))) && real, "{compose:?}");
        let (live, _) = remote("http://sandbox:12111", "sk_live_x", true);
        assert!(live.expect_err("refused").contains("live"));
        let (hidden, _) = remote("http://user:pw@sandbox:12111", "sk_test_compose", true);
        assert!(hidden.expect_err("refused").contains("user info"));
        let (sandbox_key, _) = remote("http://sandbox:12111", SANDBOX_SECRET_KEY, true);
        assert!(sandbox_key.expect_err("refused").contains("sandbox"));
        let (not_asked, _) = remote("http://sandbox:12111", "sk_test_compose", false);
        assert!(not_asked.expect_err("refused").contains("https"));
    }

    #[test]
    fn the_stripe_version_is_pinned_and_checked() {
        let default = parse(&[]);
        assert_eq!(
            default.gateway.gateway_stripe_version,
            payments_gateway::DEFAULT_STRIPE_VERSION
        );
        assert!(default.gateway.validate().is_ok());
        assert!(
            parse(&["--gateway-stripe-version=2024-06-20"])
                .gateway
                .validate()
                .is_ok()
        );
        for bad in ["latest", "", "2024-06-20 ", "20240620"] {
            let arg = format!("--gateway-stripe-version={bad}");
            let e = parse(&[&arg]).gateway.validate().expect_err(bad).0;
            assert!(e.contains("GATEWAY_STRIPE_VERSION"), "{bad}: {e}");
        }
    }
}
