//! Flags and environment variables shared by `payments-jobs` and
//! `payments-api` (clap `env`; durations like `1500ms`, `5m`, `24h`).

use std::fmt;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use payments_domain::store::Store;
use payments_store::{DatabaseUrl, PoolSettings};

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
        default_value = "sqlite://data/payments.db",
        global = true
    )]
    pub database_url: DatabaseUrl,
    /// Connections in the database pool.
    #[arg(
        long,
        env = "DATABASE_MAX_CONNECTIONS",
        default_value_t = 10,
        global = true
    )]
    pub database_max_connections: u32,
    /// How long a caller waits for a pooled connection.
    #[arg(long, env = "DATABASE_ACQUIRE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration, global = true)]
    pub database_acquire_timeout: Duration,
}

impl DatabaseArgs {
    pub fn validate(&self) -> Result<(), String> {
        if self.database_max_connections == 0 {
            return Err("DATABASE_MAX_CONNECTIONS must be at least 1".into());
        }
        Ok(())
    }

    /// Opens the store and applies its migrations.
    pub async fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        let pool = PoolSettings {
            max_connections: self.database_max_connections,
            acquire_timeout: self.database_acquire_timeout,
        };
        let store = payments_store::connect(&self.database_url, &pool)
            .await
            .map_err(|e| anyhow::anyhow!("opening {}: {}", self.database_url, e))?;
        store
            .migrate()
            .await
            .map_err(|e| anyhow::anyhow!("applying migrations: {}", e))?;
        Ok(store)
    }
}

/// The payment provider, and the lease that must outlast a call to it.
#[derive(Clone, Args)]
pub struct GatewayArgs {
    /// The provider's base URL (Stripe-compatible).
    #[arg(long, env = "GATEWAY_URL", global = true)]
    pub gateway_url: Option<String>,
    /// The provider's secret key.
    #[arg(
        long,
        env = "GATEWAY_SECRET_KEY",
        hide_env_values = true,
        global = true
    )]
    pub gateway_secret_key: Option<String>,
    /// Timeout of one provider call. The lease must outlast it.
    #[arg(long, env = "GATEWAY_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration, global = true)]
    pub gateway_timeout: Duration,
    /// How long a driver (API request or reaper) owns an in-progress request.
    #[arg(long, env = "LEASE", default_value = "30s", value_parser = humantime::parse_duration, global = true)]
    pub lease: Duration,
    /// How long the provider remembers its idempotency keys (Stripe: 24h).
    #[arg(long, env = "PROVIDER_KEY_RETENTION", default_value = "24h", value_parser = humantime::parse_duration, global = true)]
    pub provider_key_retention: Duration,
    /// No provider call re-drives a record claimed longer ago than the key
    /// retention minus this margin: such a record is abandoned instead. At
    /// least LEASE + GATEWAY_TIMEOUT, the latest a call under a lease taken
    /// just inside the limit can reach the provider.
    #[arg(long, env = "PROVIDER_KEY_MARGIN", default_value = "1h", value_parser = humantime::parse_duration, global = true)]
    pub provider_key_margin: Duration,
}

impl fmt::Debug for GatewayArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatewayArgs")
            .field("gateway_url", &self.gateway_url)
            .field(
                "gateway_secret_key",
                &self.gateway_secret_key.as_ref().map(|_| "***"),
            )
            .field("gateway_timeout", &self.gateway_timeout)
            .field("lease", &self.lease)
            .field("provider_key_retention", &self.provider_key_retention)
            .field("provider_key_margin", &self.provider_key_margin)
            .finish()
    }
}

/// The sandbox's secret key; refused next to a real provider.
pub const SANDBOX_SECRET_KEY: &str = "sk_test_sandbox";

impl GatewayArgs {
    /// The age past which a record is never re-driven: the provider's key
    /// retention minus the margin.
    pub fn redrive_limit(&self) -> Duration {
        self.provider_key_retention
            .saturating_sub(self.provider_key_margin)
    }

    /// The lease, timeout and key-retention rules.
    pub fn validate(&self) -> Result<(), String> {
        if self.gateway_timeout.is_zero() {
            return Err("GATEWAY_TIMEOUT must be greater than 0".into());
        }
        let least_margin = self.lease + self.gateway_timeout;
        if self.provider_key_margin < least_margin {
            return Err(format!(
                "PROVIDER_KEY_MARGIN ({}) must be at least LEASE + GATEWAY_TIMEOUT ({}): a \
                 re-drive taken just inside the limit may reach the provider that much later",
                humantime::format_duration(self.provider_key_margin),
                humantime::format_duration(least_margin)
            ));
        }
        if self.provider_key_margin >= self.provider_key_retention {
            return Err(format!(
                "PROVIDER_KEY_MARGIN ({}) must be shorter than PROVIDER_KEY_RETENTION ({})",
                humantime::format_duration(self.provider_key_margin),
                humantime::format_duration(self.provider_key_retention)
            ));
        }
        if self.lease <= self.gateway_timeout {
            return Err(format!(
                "LEASE ({}) must be longer than GATEWAY_TIMEOUT ({}): a shorter lease lets a \
                 retry take over a provider call that is still running",
                humantime::format_duration(self.lease),
                humantime::format_duration(self.gateway_timeout)
            ));
        }
        Ok(())
    }

    /// `(url, secret key, is a real provider)` when GATEWAY_URL is set.
    /// A loopback URL is development (the sandbox); anything else may move
    /// real money and must not use the sandbox's key.
    pub fn remote(&self) -> Result<Option<(String, String, bool)>, String> {
        let Some(url) = &self.gateway_url else {
            return Ok(None);
        };
        let parsed = parse_gateway_url(url)?;
        let secret_key = self
            .gateway_secret_key
            .clone()
            .ok_or("GATEWAY_URL is set but GATEWAY_SECRET_KEY is not")?;
        let real = !parsed.host().is_some_and(|host| host_is_loopback(&host));
        if real && secret_key == SANDBOX_SECRET_KEY {
            return Err(
                "refusing to start: a real GATEWAY_URL with the sandbox's GATEWAY_SECRET_KEY"
                    .into(),
            );
        }
        Ok(Some((url.clone(), secret_key, real)))
    }
}

/// GATEWAY_URL, parsed as the HTTP client will parse it (WHATWG, the `url`
/// crate): `http` or `https`, a host, and no user info. A backslash is
/// refused too: parsers disagree on the host of `https://a.example\@localhost`
/// (`a.example` for the `url` crate, `localhost` for others), and the host
/// decides whether development secrets are allowed.
pub fn parse_gateway_url(raw: &str) -> Result<url::Url, String> {
    if raw.contains('\\') {
        return Err(format!(
            "GATEWAY_URL {raw:?} contains a backslash: parsers disagree on which host it names; \
             write the URL without it"
        ));
    }
    let url = url::Url::parse(raw)
        .map_err(|e| format!("GATEWAY_URL {raw:?} is not an http(s) URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "GATEWAY_URL {raw:?} is not an http(s) URL (scheme {:?})",
            url.scheme()
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "GATEWAY_URL must not contain user info (user:password@): the provider is \
             authenticated with GATEWAY_SECRET_KEY, and user info can disguise the real host \
             (got a URL whose host is {:?})",
            url.host_str().unwrap_or_default()
        ));
    }
    if url.host().is_none() {
        return Err(format!("GATEWAY_URL {raw:?} has no host"));
    }
    Ok(url)
}

/// The host of an `http://` or `https://` URL, lower-cased; an IPv6 address
/// without its brackets.
pub fn url_host(url: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    if !matches!(url.scheme(), "http" | "https") {
        return None;
    }
    match url.host()? {
        url::Host::Domain(domain) => (!domain.is_empty()).then(|| domain.to_owned()),
        url::Host::Ipv4(ip) => Some(ip.to_string()),
        url::Host::Ipv6(ip) => Some(ip.to_string()),
    }
}

/// Loopback hosts are development; anything else may be real. `host` is a
/// host as [`url_host`] returns it (an IPv6 address with or without brackets).
pub fn is_loopback(host: &str) -> bool {
    let bracketed;
    let host = if host.contains(':') && !host.starts_with('[') {
        bracketed = format!("[{host}]");
        bracketed.as_str()
    } else {
        host
    };
    url::Host::parse(host).is_ok_and(|host| host_is_loopback(&host))
}

/// `localhost`, 127.0.0.0/8 or ::1.
pub fn host_is_loopback<S: AsRef<str>>(host: &url::Host<S>) -> bool {
    match host {
        url::Host::Domain(domain) => domain.as_ref().eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// The jobs' own settings.
#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    /// Give up on a request whose provider outcome is still unknown this
    /// long after it was claimed: record `500 request_abandoned`, charge
    /// `unknown`. Longer than the lease, inside the provider's key retention.
    #[arg(long, env = "ABANDON_AFTER", default_value = "15m", value_parser = humantime::parse_duration, global = true)]
    pub abandon_after: Duration,
    /// How often `run` reaps.
    #[arg(long, env = "REAP_EVERY", default_value = "1m", value_parser = humantime::parse_duration, global = true)]
    pub reap_every: Duration,
    /// How often `run` prunes.
    #[arg(long, env = "PRUNE_EVERY", default_value = "1h", value_parser = humantime::parse_duration, global = true)]
    pub prune_every: Duration,
    /// Records one reaper pass handles at most.
    #[arg(long, env = "REAP_BATCH", default_value_t = 500, global = true)]
    pub reap_batch: u32,
    /// Provider calls one reaper makes at once.
    #[arg(long, env = "REAP_CONCURRENCY", default_value_t = 4, global = true)]
    pub reap_concurrency: u32,
    /// Rows deleted per statement (and transaction) by the pruner. Default:
    /// 5000, and 250 on SQLite, where a batch holds the only write lock.
    #[arg(long, env = "PRUNE_BATCH", global = true)]
    pub prune_batch: Option<u32>,
    /// The pruner's pause between batches (`0s`: none). Default: as long as
    /// the last batch took, so it holds the database at most half the time,
    /// and at least 25 ms on SQLite so the API's writes get in.
    #[arg(long, env = "PRUNE_PAUSE", value_parser = humantime::parse_duration, global = true)]
    pub prune_pause: Option<Duration>,
}

impl JobArgs {
    /// The pruner's pause, as configured.
    pub fn pause(&self) -> crate::pruner::Pause {
        match self.prune_pause {
            Some(pause) => crate::pruner::Pause::Fixed(pause),
            None => crate::pruner::Pause::AsLongAsTheBatch,
        }
    }

    pub fn validate(&self, gateway: &GatewayArgs) -> Result<(), String> {
        if self.abandon_after <= gateway.lease {
            return Err(format!(
                "--abandon-after ({}) must be longer than LEASE ({}): a request must get at \
                 least one re-drive before it is abandoned",
                humantime::format_duration(self.abandon_after),
                humantime::format_duration(gateway.lease)
            ));
        }
        if self.abandon_after + gateway.provider_key_margin >= gateway.provider_key_retention {
            return Err(format!(
                "--abandon-after ({}) plus PROVIDER_KEY_MARGIN ({}) must be shorter than \
                 PROVIDER_KEY_RETENTION ({}): re-drives must end before the provider may \
                 forget its key, or a re-drive could charge twice",
                humantime::format_duration(self.abandon_after),
                humantime::format_duration(gateway.provider_key_margin),
                humantime::format_duration(gateway.provider_key_retention)
            ));
        }
        if self.reap_every.is_zero() || self.prune_every.is_zero() {
            return Err("--reap-every and --prune-every must be greater than 0".into());
        }
        if self.reap_batch == 0 || self.prune_batch == Some(0) || self.reap_concurrency == 0 {
            return Err(
                "--reap-batch, --reap-concurrency and --prune-batch must be at least 1".into(),
            );
        }
        Ok(())
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
        #[command(flatten)]
        jobs: JobArgs,
    }

    fn parse(args: &[&str]) -> Cli {
        let mut argv = vec!["x"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).expect("parses")
    }

    #[test]
    fn abandon_after_must_sit_between_the_lease_and_the_key_retention() {
        let ok = parse(&[]);
        assert!(ok.jobs.validate(&ok.gateway).is_ok());
        let short = parse(&["--abandon-after=20s"]);
        assert!(
            short
                .jobs
                .validate(&short.gateway)
                .expect_err("refused")
                .contains("LEASE")
        );
        // 23 h + the 1 h margin reaches the 24 h retention.
        let long = parse(&["--abandon-after=23h"]);
        assert!(
            long.jobs
                .validate(&long.gateway)
                .expect_err("refused")
                .contains("PROVIDER_KEY_RETENTION")
        );
        let within = parse(&["--abandon-after=22h59m"]);
        assert!(within.jobs.validate(&within.gateway).is_ok());
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
                .contains("LEASE + GATEWAY_TIMEOUT")
        );
        let wide = parse(&["--provider-key-retention=1h", "--provider-key-margin=1h"]);
        assert!(wide.gateway.validate().is_err());
        let short = parse(&["--provider-key-retention=10m", "--provider-key-margin=1m"]);
        assert_eq!(short.gateway.redrive_limit(), Duration::from_secs(540));
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
        assert!(matches!(sandbox.gateway.remote(), Ok(Some((_, _, false)))));
        assert!(parse(&["--gateway-url=http://x"]).gateway.remote().is_err());
    }

    #[test]
    fn finds_hosts() {
        assert_eq!(
            url_host("http://127.0.0.1:8080/x").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(
            url_host("https://u:p@API.stripe.com").as_deref(),
            Some("api.stripe.com")
        );
        assert_eq!(url_host("http://[::1]:9/").as_deref(), Some("::1"));
        assert_eq!(url_host("ftp://x"), None);
        assert!(is_loopback("::1") && is_loopback("localhost") && !is_loopback("10.0.0.1"));
    }

    #[test]
    fn loopback_is_decided_by_the_parsed_host() {
        assert!(is_loopback("[::1]") && is_loopback("127.0.0.2") && is_loopback("127.1"));
        assert!(is_loopback("LOCALHOST"));
        for host in [
            "localhost.example.com",
            "127.0.0.1.example.com",
            "::ffff:10.0.0.1",
            "10.0.0.1",
            "",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
        assert_eq!(url_host("http://127.1:9/").as_deref(), Some("127.0.0.1"));
        assert_eq!(
            url_host("http://LocalHost:9/").as_deref(),
            Some("localhost")
        );
    }

    #[test]
    fn gateway_urls_with_user_info_or_odd_schemes_are_refused() {
        let remote = |url: &str, key: &str| {
            let url = format!("--gateway-url={url}");
            let key = format!("--gateway-secret-key={key}");
            parse(&[&url, &key]).gateway.remote()
        };
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
            "http://127.0.0.1.example.com",
            "http://[::ffff:10.0.0.1]:12111",
        ] {
            let e = remote(url, SANDBOX_SECRET_KEY).expect_err("refused");
            assert!(e.contains("sandbox"), "{url}: {e}");
        }
        for url in ["http://localhost:1", "http://127.1:1", "http://[::1]:1/v1"] {
            assert!(
                matches!(remote(url, SANDBOX_SECRET_KEY), Ok(Some((_, _, false)))),
                "{url}"
            );
        }
        assert!(matches!(
            remote("https://api.example.com", "sk_live_x"),
            Ok(Some((_, _, true)))
        ));
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
    #[arg(
        long,
        env = "LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,
}

/// Structured logs on stderr, `RUST_LOG` filtering (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal: in a file or a log
        // pipeline they are noise, and formatting them costs CPU per line.
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
