//! Configuration: every setting is a flag and an environment variable (clap
//! `env`), durations are human-readable (`1500ms`, `5m`, `24h`), and the
//! combination is validated before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use payments_app::settings::{DatabaseArgs, LogArgs, secret};
use payments_app::{Provider, Settings as AppSettings};
use payments_jobs::settings::JobArgs;
use secrecy::{ExposeSecret, SecretString};

use crate::auth::{BackOffice, JwtRules};

pub use payments_app::ConfigError;

/// The JWT secret `make run` and the README use. Refused next to a real provider.
pub const DEV_JWT_SECRET: &str = "dev-only-secret-do-not-use-in-production";
const MIN_HS256_SECRET_BYTES: usize = 32;
/// The largest `JWT_LEEWAY`: an allowance for clock skew, not a lifetime.
const MAX_JWT_LEEWAY: Duration = Duration::from_secs(5 * 60);

/// The shortest provider webhook secret taken (Stripe's are `whsec_` and
/// 32 characters).
pub const MIN_WEBHOOK_SECRET: usize = 24;

/// `payments-api [serve] [SETTINGS]`, `payments-api migrate`, or
/// `payments-api token --customer ID`: each subcommand takes only its own
/// flags, and serving's may also come without `serve`.
#[derive(Debug, Parser)]
#[command(
    name = "payments-api",
    version,
    about = "A payments API that takes money exactly once",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub settings: Settings,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the API (the default).
    Serve(Box<Settings>),
    /// Apply the database migrations and exit.
    Migrate {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Mint a development JWT for a customer, signed with JWT_HS256_SECRET.
    Token {
        /// The customer id (the token's `sub`).
        #[arg(long, required_unless_present = "subject", conflicts_with = "subject")]
        customer: Option<String>,
        /// A subject that is not a customer, e.g. a back-office user or
        /// service (`ops_bob`): the token's `sub`.
        #[arg(long)]
        subject: Option<String>,
        /// A scope the token carries (repeat it, or space-separate):
        /// charges:write, charges:read, charges:read_all, refunds:write,
        /// charges:capture, events:read, disputes:read.
        #[arg(long = "scope", value_delimiter = ' ')]
        scopes: Vec<String>,
        /// The token's `aud`: the server's JWT_BACKOFFICE_AUDIENCE makes a
        /// back-office token (`make run` serves with `payments-backoffice`).
        #[arg(long)]
        audience: Option<String>,
        /// How long the token is valid.
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// The HS256 secret the server verifies tokens with.
        #[arg(long, env = "JWT_HS256_SECRET", hide_env_values = true, value_parser = secret)]
        jwt_hs256_secret: Option<SecretString>,
    },
}

/// Whether `POST /api/charges` requires an `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeyMode {
    /// Keyless requests get 400 `idempotency_key_missing`.
    Required,
    /// Rollout: keyless requests are served without protection and logged.
    Optional,
}

/// What serving takes: the settings shared with `payments-jobs`, the jobs'
/// own (for `--with-jobs`), and the HTTP side's.
#[derive(Debug, Clone, Args)]
pub struct Settings {
    #[command(flatten)]
    pub core: AppSettings,
    #[command(flatten)]
    pub jobs: JobArgs,
    /// Address to listen on.
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    pub listen_addr: SocketAddr,
    /// Where the in-process sandbox listens when GATEWAY_URL is unset.
    #[arg(long, env = "SANDBOX_LISTEN_ADDR", default_value = "127.0.0.1:12111")]
    pub sandbox_listen_addr: SocketAddr,
    /// The file the in-process sandbox keeps its ledger in (charges,
    /// refunds, the idempotency keys it answered) across restarts. Default:
    /// beside a SQLite DATABASE_URL's file, named after it
    /// (data/payments.sandbox-ledger.jsonl); in memory with any other database.
    #[arg(long, env = "SANDBOX_LEDGER")]
    pub sandbox_ledger: Option<PathBuf>,
    /// Run the reaper, the pruner and the reconciler in this process too. Default: on with
    /// the in-process sandbox (so `make run` is complete), off otherwise
    /// (run `payments-jobs` instead).
    #[arg(long, env = "WITH_JOBS", num_args = 0..=1, default_missing_value = "true")]
    pub with_jobs: Option<bool>,
    /// `required`, or `optional` while clients roll out keys (keyless requests are unprotected).
    #[arg(
        long,
        env = "IDEMPOTENCY_KEY_MODE",
        value_enum,
        default_value = "required"
    )]
    pub idempotency_key_mode: KeyMode,
    /// Where clients learn to send keys; linked from keyless answers.
    #[arg(long, env = "CLIENT_GUIDE_URL", default_value = "docs/client-guide.md")]
    pub client_guide_url: String,
    /// HS256 secret for bearer JWTs (at least 32 bytes).
    #[arg(long, env = "JWT_HS256_SECRET", hide_env_values = true, value_parser = secret)]
    pub jwt_hs256_secret: Option<SecretString>,
    /// RS256 public key for bearer JWTs: PEM text, or the path of a PEM file.
    #[arg(long, env = "JWT_RS256_PUBLIC_KEY")]
    pub jwt_rs256_public_key: Option<String>,
    /// ES256 (P-256) public key for bearer JWTs: PEM text, or the path of a PEM file.
    #[arg(long, env = "JWT_ES256_PUBLIC_KEY")]
    pub jwt_es256_public_key: Option<String>,
    /// The identity provider's JWK set (`https://...`; `http` only on
    /// loopback): RS256 and ES256 keys, chosen by the token's `kid`.
    #[arg(long, env = "JWT_JWKS_URL")]
    pub jwt_jwks_url: Option<String>,
    /// How long one fetch of JWT_JWKS_URL may take.
    #[arg(long, env = "JWT_JWKS_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub jwt_jwks_timeout: Duration,
    /// How often the JWK set is fetched again.
    #[arg(long, env = "JWT_JWKS_REFRESH", default_value = "10m", value_parser = humantime::parse_duration)]
    pub jwt_jwks_refresh: Duration,
    /// The shortest time between two fetches of the JWK set: a token with an
    /// unknown `kid` fetches it again at most this often.
    #[arg(long, env = "JWT_JWKS_MIN_REFRESH", default_value = "30s", value_parser = humantime::parse_duration)]
    pub jwt_jwks_min_refresh: Duration,
    /// The longest a token may still be valid for: a token whose `exp` is
    /// further ahead is refused (a leaked year-long token is a year-long key).
    #[arg(long, env = "JWT_MAX_LIFETIME", default_value = "24h", value_parser = humantime::parse_duration)]
    pub jwt_max_lifetime: Duration,
    /// Clock-skew allowance for the tokens' `exp`, `nbf` and `iat`.
    #[arg(long, env = "JWT_LEEWAY", default_value = "30s", value_parser = humantime::parse_duration)]
    pub jwt_leeway: Duration,
    /// When set, tokens must carry `iss` equal to it.
    #[arg(long, env = "JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// When set, tokens must carry an `aud` that contains it. When unset,
    /// `aud` is not checked.
    #[arg(long, env = "JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// The audience of the back office's tokens (its own API at the
    /// identity provider, which only staff clients may get tokens for):
    /// back-office scopes (refunds:write, charges:read_all, ...) count
    /// only in a token whose `aud` contains it. Unset, with
    /// JWT_BACKOFFICE_ISSUER unset too: no token is the back office's.
    #[arg(long, env = "JWT_BACKOFFICE_AUDIENCE")]
    pub jwt_backoffice_audience: Option<String>,
    /// The issuer of the back office's tokens (a staff tenant or realm
    /// whose keys are the same JWK set): back-office scopes count only in
    /// a token whose `iss` equals it (and, when set, of
    /// JWT_BACKOFFICE_AUDIENCE).
    #[arg(long, env = "JWT_BACKOFFICE_ISSUER")]
    pub jwt_backoffice_issuer: Option<String>,
    /// Let customers refund their own charges, as before roles. Off: only
    /// back-office tokens with refunds:write refund (any customer's charge).
    #[arg(long, env = "REFUNDS_BY_CUSTOMER", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub refunds_by_customer: bool,
    /// The secret(s) the provider signs its webhooks with (Stripe's
    /// endpoint signing secret, `whsec_...`), comma-separated during a
    /// rotation: `POST /webhooks/provider` takes only events signed with
    /// one of them. Unset: provider webhooks are not taken (404), except
    /// from the in-process sandbox, whose own secret is always taken.
    #[arg(long, env = "GATEWAY_WEBHOOK_SECRET", hide_env_values = true, value_parser = payments_app::settings::secret)]
    pub gateway_webhook_secret: Option<SecretString>,
    #[command(flatten)]
    pub http: crate::server::HttpTimeouts,
}

/// How bearer tokens are verified.
#[derive(Debug, Clone)]
pub enum JwtKey {
    Hs256(SecretString),
    /// PEM text of the public key.
    Rs256(String),
    /// PEM text of the P-256 public key.
    Es256(String),
    /// The identity provider's JWK set.
    Jwks(JwksSettings),
}

/// Where the JWK set is fetched from, and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwksSettings {
    pub url: reqwest::Url,
    /// One fetch.
    pub timeout: Duration,
    /// Between scheduled fetches.
    pub refresh: Duration,
    /// Between any two fetches started by unknown `kid`s.
    pub min_refresh: Duration,
}

impl Settings {
    /// The JWT key, or why there is none.
    pub fn jwt_key(&self) -> Result<JwtKey, ConfigError> {
        let sources = [
            ("JWT_HS256_SECRET", self.jwt_hs256_secret.is_some()),
            ("JWT_RS256_PUBLIC_KEY", self.jwt_rs256_public_key.is_some()),
            ("JWT_ES256_PUBLIC_KEY", self.jwt_es256_public_key.is_some()),
            ("JWT_JWKS_URL", self.jwt_jwks_url.is_some()),
        ];
        let set: Vec<&str> = sources
            .iter()
            .filter(|(_, set)| *set)
            .map(|(name, _)| *name)
            .collect();
        if set.len() > 1 {
            return Err(ConfigError(format!(
                "set only one JWT key source, not several ({} are set)",
                set.join(", ")
            )));
        }
        if let Some(secret) = &self.jwt_hs256_secret {
            if secret.expose_secret().len() < MIN_HS256_SECRET_BYTES {
                return Err(ConfigError(format!(
                    "JWT_HS256_SECRET must be at least {MIN_HS256_SECRET_BYTES} bytes"
                )));
            }
            return Ok(JwtKey::Hs256(secret.clone()));
        }
        if let Some(key) = &self.jwt_rs256_public_key {
            return pem("JWT_RS256_PUBLIC_KEY", key).map(JwtKey::Rs256);
        }
        if let Some(key) = &self.jwt_es256_public_key {
            return pem("JWT_ES256_PUBLIC_KEY", key).map(JwtKey::Es256);
        }
        if let Some(url) = &self.jwt_jwks_url {
            return self.jwks(url).map(JwtKey::Jwks);
        }
        Err(ConfigError(
            "no JWT key: set JWT_HS256_SECRET (at least 32 bytes), JWT_RS256_PUBLIC_KEY, \
             JWT_ES256_PUBLIC_KEY or JWT_JWKS_URL (`make run` sets a development secret)"
                .into(),
        ))
    }

    /// JWT_JWKS_URL and its timings, or why they are refused.
    fn jwks(&self, raw: &str) -> Result<JwksSettings, ConfigError> {
        let url = payments_app::settings::https_or_loopback(
            "JWT_JWKS_URL",
            raw,
            "keys fetched over plain http can be replaced on the way, and with them anyone \
             could mint tokens",
            "the URL is logged when a fetch fails",
        )?;
        let show = |d: Duration| humantime::format_duration(d).to_string();
        if self.jwt_jwks_timeout.is_zero() {
            return Err(ConfigError(
                "JWT_JWKS_TIMEOUT must be greater than 0".into(),
            ));
        }
        if self.jwt_jwks_refresh.is_zero() {
            return Err(ConfigError(
                "JWT_JWKS_REFRESH must be greater than 0".into(),
            ));
        }
        if self.jwt_jwks_min_refresh > self.jwt_jwks_refresh {
            return Err(ConfigError(format!(
                "JWT_JWKS_MIN_REFRESH ({}) must be at most JWT_JWKS_REFRESH ({})",
                show(self.jwt_jwks_min_refresh),
                show(self.jwt_jwks_refresh)
            )));
        }
        Ok(JwksSettings {
            url,
            timeout: self.jwt_jwks_timeout,
            refresh: self.jwt_jwks_refresh,
            min_refresh: self.jwt_jwks_min_refresh,
        })
    }

    /// How tokens are validated besides their signature, or why the
    /// settings are refused.
    pub fn jwt_rules(&self) -> Result<JwtRules, ConfigError> {
        if self.jwt_max_lifetime.is_zero() {
            return Err(ConfigError(
                "JWT_MAX_LIFETIME must be greater than 0".into(),
            ));
        }
        if self.jwt_leeway > MAX_JWT_LEEWAY {
            return Err(ConfigError(format!(
                "JWT_LEEWAY ({}) must be at most {}: it is an allowance for clock skew, and \
                 tokens are accepted that long after they expire",
                humantime::format_duration(self.jwt_leeway),
                humantime::format_duration(MAX_JWT_LEEWAY)
            )));
        }
        let non_empty = |name: &str, value: &Option<String>| match value.as_deref() {
            Some(v) if v.trim().is_empty() => Err(ConfigError(format!(
                "{name} is set but empty: unset it or name the expected value"
            ))),
            _ => Ok(value.clone()),
        };
        let rules = JwtRules {
            max_lifetime: self.jwt_max_lifetime,
            leeway: self.jwt_leeway,
            issuer: non_empty("JWT_ISSUER", &self.jwt_issuer)?,
            audience: non_empty("JWT_AUDIENCE", &self.jwt_audience)?,
            back_office: BackOffice {
                audience: non_empty("JWT_BACKOFFICE_AUDIENCE", &self.jwt_backoffice_audience)?,
                issuer: non_empty("JWT_BACKOFFICE_ISSUER", &self.jwt_backoffice_issuer)?,
            },
        };
        // A back office every customer token would pass for.
        let office = &rules.back_office;
        let same = |office: &Option<String>, everyone: &Option<String>| {
            office.is_none() || office == everyone
        };
        if office.is_configured()
            && same(&office.audience, &rules.audience)
            && same(&office.issuer, &rules.issuer)
        {
            return Err(ConfigError(
                "JWT_BACKOFFICE_AUDIENCE / JWT_BACKOFFICE_ISSUER must differ from JWT_AUDIENCE / \
                 JWT_ISSUER: every customer's token would be the back office's"
                    .into(),
            ));
        }
        Ok(rules)
    }

    /// Validates the whole serving configuration; where provider calls go.
    pub fn validate(&self) -> Result<Provider, ConfigError> {
        self.core.validate()?;
        self.http.validate()?;
        if self.with_jobs() {
            self.jobs.validate(&self.core.gateway)?;
        }
        let jwt = self.jwt_key()?;
        self.jwt_rules()?;
        let provider = match self.core.gateway.remote()? {
            #[cfg(feature = "dev-sandbox")]
            None => Provider::Sandbox {
                listen: self.sandbox_listen_addr,
                ledger: self.sandbox_ledger(),
                webhook_url: Some(Self::sandbox_webhook_url(self.listen_addr)),
            },
            #[cfg(not(feature = "dev-sandbox"))]
            None => {
                return Err(ConfigError(
                    "GATEWAY_URL is not set, and this build has no in-process sandbox \
                     (it was built without the `dev-sandbox` feature): set GATEWAY_URL \
                     and GATEWAY_SECRET_KEY to the provider's"
                        .into(),
                ));
            }
            Some(remote) => {
                let dev_secret =
                    matches!(&jwt, JwtKey::Hs256(s) if s.expose_secret() == DEV_JWT_SECRET);
                if dev_secret && self.core.gateway.is_real() {
                    return Err(ConfigError(
                        "refusing to start: a real GATEWAY_URL with the development \
                         JWT_HS256_SECRET; anyone could mint tokens"
                            .into(),
                    ));
                }
                remote
            }
        };
        self.provider_webhook_secrets()?;
        // Last: the provider's own rules name what is wrong first.
        self.core.gateway.derivation()?;
        Ok(provider)
    }

    /// The secrets provider webhooks are verified with: GATEWAY_WEBHOOK_SECRET's,
    /// each at least [`MIN_WEBHOOK_SECRET`] characters, and the in-process
    /// sandbox's when it is the provider; `None` when there are none.
    pub fn provider_webhook_secrets(&self) -> Result<Option<Vec<SecretString>>, ConfigError> {
        use payments_app::settings::SANDBOX_WEBHOOK_SECRET;
        let mut secrets = Vec::new();
        if let Some(list) = &self.gateway_webhook_secret {
            for secret in list.expose_secret().split(',').map(str::trim) {
                if secret.len() < MIN_WEBHOOK_SECRET {
                    return Err(ConfigError(format!(
                        "GATEWAY_WEBHOOK_SECRET: each secret must be at least \
                         {MIN_WEBHOOK_SECRET} characters (the provider's endpoint signing \
                         secret, whsec_...)"
                    )));
                }
                if secret == SANDBOX_WEBHOOK_SECRET && self.core.gateway.is_real() {
                    return Err(ConfigError(
                        "refusing to start: a real GATEWAY_URL with the sandbox's \
                         GATEWAY_WEBHOOK_SECRET; anyone could forge provider events"
                            .into(),
                    ));
                }
                secrets.push(SecretString::from(secret));
            }
        }
        if self.core.gateway.gateway_url.is_none() {
            secrets.push(SecretString::from(SANDBOX_WEBHOOK_SECRET));
        }
        Ok((!secrets.is_empty()).then_some(secrets))
    }

    /// Where the in-process sandbox sends its webhooks: the
    /// `POST /webhooks/provider` of this server listening on `addr` (on
    /// loopback when it listens on every address).
    pub fn sandbox_webhook_url(mut addr: std::net::SocketAddr) -> String {
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        format!("http://{addr}{}", crate::routes::PROVIDER_WEBHOOKS)
    }

    /// Where the in-process sandbox keeps its ledger: SANDBOX_LEDGER, else
    /// beside the SQLite database file (`data/payments.db`:
    /// `data/payments.sandbox-ledger.jsonl`), so the two are kept, and
    /// reset by `make clean-data`, together, and every database has a
    /// provider of its own; `None` (memory) for any other database.
    pub fn sandbox_ledger(&self) -> Option<PathBuf> {
        if let Some(path) = &self.sandbox_ledger {
            return Some(path.clone());
        }
        let database = self.core.database.database_url.sqlite_file()?;
        let mut name = database.file_stem()?.to_owned();
        name.push(".sandbox-ledger.jsonl");
        Some(database.with_file_name(name))
    }

    /// Whether the reaper and pruner run in this process.
    pub fn with_jobs(&self) -> bool {
        self.with_jobs
            .unwrap_or(self.core.gateway.gateway_url.is_none())
    }
}

/// A public key setting: PEM text, or the path of a PEM file.
fn pem(name: &str, value: &str) -> Result<String, ConfigError> {
    if value.trim_start().starts_with("-----BEGIN") {
        return Ok(value.to_owned());
    }
    std::fs::read_to_string(value)
        .map_err(|e| ConfigError(format!("{name}: cannot read {value}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(args: &[&str]) -> Settings {
        let mut argv = vec!["payments-api"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).expect("parses").settings
    }

    const SECRET: &str = "--jwt-hs256-secret=0123456789abcdef0123456789abcdef-x";
    const LOOPBACK_SANDBOX: &str = "--gateway-url=http://127.0.0.1:12111";
    const SANDBOX_KEY: &str = "--gateway-secret-key=sk_test_sandbox";

    #[test]
    #[cfg(feature = "dev-sandbox")]
    fn defaults_are_valid_with_a_secret() {
        let provider = settings(&[SECRET]).validate().expect("valid");
        assert!(matches!(provider, Provider::Sandbox { .. }), "{provider:?}");
    }

    #[test]
    fn the_sandbox_ledger_is_kept_beside_a_sqlite_database() {
        let ledger = |args: &[&str]| settings(args).sandbox_ledger();
        let path = |p: &str| Some(PathBuf::from(p));
        assert_eq!(ledger(&[]), path("data/payments.sandbox-ledger.jsonl"));
        assert_eq!(
            ledger(&["--database-url=sqlite:///tmp/x/dev.sqlite3?mode=rwc"]),
            path("/tmp/x/dev.sandbox-ledger.jsonl")
        );
        assert_eq!(ledger(&["--database-url=sqlite::memory:"]), None);
        assert_eq!(ledger(&["--database-url=postgres://u@h/db"]), None);
        assert_eq!(
            ledger(&[
                "--database-url=postgres://u@h/db",
                "--sandbox-ledger=l.jsonl"
            ]),
            path("l.jsonl")
        );
    }

    #[test]
    #[cfg(not(feature = "dev-sandbox"))]
    fn without_the_sandbox_a_gateway_url_is_required() {
        let refused = settings(&[SECRET]).validate().expect_err("refused").0;
        assert!(
            refused.contains("GATEWAY_URL") && refused.contains("`dev-sandbox`"),
            "{refused}"
        );
    }

    #[test]
    fn refuses_dangerous_or_inconsistent_settings() {
        let refused = |args: &[&str]| settings(args).validate().expect_err("refused").0;
        assert!(refused(&[]).contains("no JWT key"));
        assert!(refused(&["--jwt-hs256-secret=short"]).contains("32 bytes"));
        assert!(refused(&[SECRET, "--lease=5s", "--gateway-timeout=10s"]).contains("LEASE"));
        assert!(refused(&[SECRET, "--idempotency-ttl=48h"]).contains("retention"));
        let outlived = refused(&[
            SECRET,
            "--allow-short-ttl",
            "--idempotency-ttl=20s",
            "--lease=30s",
            "--gateway-timeout=5s",
        ]);
        assert!(
            outlived.contains("LEASE (30s) must be shorter than IDEMPOTENCY_TTL (20s)"),
            "{outlived}"
        );
        let short = refused(&[SECRET, "--idempotency-ttl=59m"]);
        assert!(
            short.contains("at least 1h") && short.contains("ALLOW_SHORT_TTL"),
            "{short}"
        );
        assert!(
            settings(&[
                SECRET,
                LOOPBACK_SANDBOX,
                SANDBOX_KEY,
                "--idempotency-ttl=1h"
            ])
            .validate()
            .is_ok()
        );
        // For tests only: allowed, with a warning at start.
        assert!(
            settings(&[
                SECRET,
                LOOPBACK_SANDBOX,
                SANDBOX_KEY,
                "--idempotency-ttl=2m",
                "--allow-short-ttl"
            ])
            .validate()
            .is_ok()
        );
        assert!(
            refused(&[SECRET, "--gateway-url=https://api.example.com"])
                .contains("GATEWAY_SECRET_KEY")
        );
        let dev = format!("--jwt-hs256-secret={DEV_JWT_SECRET}");
        assert!(
            refused(&[
                &dev,
                "--gateway-url=https://api.example.com",
                "--gateway-secret-key=sk_live_x"
            ])
            .contains("development")
        );
        assert!(
            refused(&[
                SECRET,
                "--gateway-url=https://api.example.com",
                "--gateway-secret-key=sk_test_sandbox"
            ])
            .contains("sandbox")
        );
        // The development secret is fine against a sandbox on loopback.
        assert!(
            settings(&[
                &dev,
                "--gateway-url=http://127.0.0.1:12111",
                "--gateway-secret-key=sk_test_sandbox"
            ])
            .validate()
            .is_ok()
        );
    }

    #[test]
    fn a_real_provider_needs_its_own_provider_key_secret() {
        let refused = |args: &[&str]| settings(args).validate().expect_err("refused").0;
        let real = [
            "--gateway-url=https://api.example.com",
            "--gateway-secret-key=sk_live_x",
        ];
        let with = |extra: &str| [SECRET, real[0], real[1], extra].map(str::to_owned);
        let missing = refused(&[SECRET, real[0], real[1]]);
        assert!(
            missing.contains("PROVIDER_KEY_SECRET must be set"),
            "{missing}"
        );
        let short = with("--provider-key-secret=too-short");
        let short = refused(&short.each_ref().map(String::as_str));
        assert!(short.contains("at least 32 bytes"), "{short}");
        let dev = with(&format!(
            "--provider-key-secret={}",
            payments_app::settings::DEV_PROVIDER_KEY_SECRET
        ));
        let dev = refused(&dev.each_ref().map(String::as_str));
        assert!(dev.contains("development PROVIDER_KEY_SECRET"), "{dev}");
        let good = with("--provider-key-secret=0123456789abcdef0123456789abcdef");
        assert!(
            settings(&good.each_ref().map(String::as_str))
                .validate()
                .is_ok()
        );
        // A sandbox on loopback derives under the development secret.
        assert!(
            settings(&[
                SECRET,
                LOOPBACK_SANDBOX,
                "--gateway-secret-key=sk_test_sandbox"
            ])
            .validate()
            .is_ok()
        );
    }

    #[test]
    fn dev_secrets_are_refused_next_to_any_real_provider_host() {
        let refused = |args: &[&str]| settings(args).validate().expect_err("refused").0;
        let dev = format!("--jwt-hs256-secret={DEV_JWT_SECRET}");
        let live = "--gateway-secret-key=sk_live_x";
        // Userinfo, and a backslash that hides the real host from some parsers.
        let hidden = refused(&[&dev, r"--gateway-url=https://a.example\@localhost", live]);
        assert!(hidden.contains("GATEWAY_URL"), "{hidden}");
        let userinfo = refused(&[&dev, "--gateway-url=https://user:pass@localhost", live]);
        assert!(userinfo.contains("user"), "{userinfo}");
        // (https: plain http to them is refused before the secrets are
        // looked at, `plain_http_is_refused_but_on_loopback`.)
        for url in [
            "https://localhost.example.com",
            "https://127.0.0.1.example.com",
            "https://10.0.0.1:12111",
            "https://[::ffff:10.0.0.1]/",
        ] {
            let arg = format!("--gateway-url={url}");
            assert!(
                refused(&[&dev, &arg, live]).contains("development"),
                "{url}"
            );
            let sandbox = refused(&[SECRET, &arg, "--gateway-secret-key=sk_test_sandbox"]);
            assert!(sandbox.contains("sandbox"), "{url}: {sandbox}");
        }
        assert!(refused(&[&dev, "--gateway-url=ftp://localhost", live]).contains("http"));
        // Every spelling of loopback is development.
        for url in [
            "http://localhost:12111",
            "http://LOCALHOST:12111/v1",
            "http://127.0.0.2:12111",
            "http://127.1:12111",
            "http://[::1]:12111",
        ] {
            let arg = format!("--gateway-url={url}");
            assert!(
                settings(&[&dev, &arg, "--gateway-secret-key=sk_test_sandbox"])
                    .validate()
                    .is_ok(),
                "{url}"
            );
        }
    }

    #[test]
    fn jwt_rules_have_defaults_and_limits() {
        assert_eq!(
            settings(&[SECRET]).jwt_rules().expect("valid"),
            JwtRules::default()
        );
        let rules = settings(&[
            SECRET,
            "--jwt-max-lifetime=1h",
            "--jwt-leeway=5s",
            "--jwt-issuer=https://idp.example",
            "--jwt-audience=payments",
        ])
        .jwt_rules()
        .expect("valid");
        assert_eq!(rules.max_lifetime, Duration::from_secs(3600));
        assert_eq!(rules.leeway, Duration::from_secs(5));
        assert_eq!(rules.issuer.as_deref(), Some("https://idp.example"));
        assert_eq!(rules.audience.as_deref(), Some("payments"));
        let refused = |args: &[&str]| settings(args).validate().expect_err("refused").0;
        assert!(refused(&[SECRET, "--jwt-max-lifetime=0s"]).contains("JWT_MAX_LIFETIME"));
        assert!(refused(&[SECRET, "--jwt-leeway=1h"]).contains("JWT_LEEWAY"));
        assert!(refused(&[SECRET, "--jwt-audience= "]).contains("JWT_AUDIENCE"));
        // A back office every customer's token would pass for.
        let office = "--jwt-backoffice-audience=payments-backoffice";
        for args in [
            &[
                SECRET,
                "--jwt-audience=payments",
                "--jwt-backoffice-audience=payments",
            ][..],
            &[
                SECRET,
                "--jwt-issuer=https://idp",
                "--jwt-backoffice-issuer=https://idp",
            ],
        ] {
            assert!(refused(args).contains("must differ"), "{args:?}");
        }
        let rules = settings(&[SECRET, "--jwt-audience=payments", office])
            .jwt_rules()
            .expect("valid");
        assert_eq!(
            rules.back_office.audience.as_deref(),
            Some("payments-backoffice")
        );
        assert!(
            settings(&[
                SECRET,
                "--jwt-issuer=https://idp",
                "--jwt-backoffice-issuer=https://idp",
                office
            ])
            .jwt_rules()
            .is_ok(),
            "the same issuer with an audience of its own"
        );
        assert!(
            refused(&[SECRET, "--jwt-backoffice-audience= "]).contains("JWT_BACKOFFICE_AUDIENCE")
        );
    }

    #[test]
    fn exactly_one_jwt_key_source() {
        let refused = |args: &[&str]| settings(args).validate().expect_err("refused").0;
        let jwks = "--jwt-jwks-url=https://idp.example/.well-known/jwks.json";
        let rs = "--jwt-rs256-public-key=-----BEGIN PUBLIC KEY-----";
        let es = "--jwt-es256-public-key=-----BEGIN PUBLIC KEY-----";
        for (args, named) in [
            (
                &[SECRET, jwks][..],
                &["JWT_HS256_SECRET", "JWT_JWKS_URL"][..],
            ),
            (&[rs, jwks], &["JWT_RS256_PUBLIC_KEY", "JWT_JWKS_URL"]),
            (&[es, jwks], &["JWT_ES256_PUBLIC_KEY", "JWT_JWKS_URL"]),
            (&[SECRET, rs], &["JWT_HS256_SECRET", "JWT_RS256_PUBLIC_KEY"]),
            (&[rs, es], &["JWT_RS256_PUBLIC_KEY", "JWT_ES256_PUBLIC_KEY"]),
            (
                &[SECRET, rs, es, jwks],
                &[
                    "JWT_HS256_SECRET",
                    "JWT_RS256_PUBLIC_KEY",
                    "JWT_ES256_PUBLIC_KEY",
                    "JWT_JWKS_URL",
                ],
            ),
        ] {
            let message = refused(args);
            assert!(message.contains("only one JWT key source"), "{message}");
            for name in named {
                assert!(message.contains(name), "{args:?}: {message}");
            }
        }
        let none = refused(&[]);
        assert!(
            none.contains("no JWT key") && none.contains("JWT_JWKS_URL"),
            "{none}"
        );
        let JwtKey::Jwks(jwks) = settings(&[jwks]).jwt_key().expect("a JWKS key") else {
            panic!("not a JWKS source");
        };
        assert_eq!(
            jwks,
            JwksSettings {
                url: "https://idp.example/.well-known/jwks.json"
                    .parse()
                    .expect("a URL"),
                timeout: Duration::from_secs(5),
                refresh: Duration::from_secs(600),
                min_refresh: Duration::from_secs(30),
            }
        );
        let es_path = settings(&["--jwt-es256-public-key=/no/such/key.pem"]);
        let message = es_path.jwt_key().expect_err("refused").0;
        assert!(message.contains("JWT_ES256_PUBLIC_KEY"), "{message}");
    }

    #[test]
    fn jwks_urls_are_https_or_loopback_http() {
        let key = |url: &str| settings(&[&format!("--jwt-jwks-url={url}")]).jwt_key();
        for url in [
            "https://idp.example/.well-known/jwks.json",
            "https://idp.example:8443/keys",
            "http://127.0.0.1:9000/jwks",
            "http://localhost/jwks",
            "http://[::1]:9000/jwks",
        ] {
            assert!(key(url).is_ok(), "{url}: {:?}", key(url));
        }
        for (url, needle) in [
            ("http://idp.example/jwks", "https"),
            ("http://10.0.0.1/jwks", "https"),
            ("http://localhost.idp.example/jwks", "https"),
            ("ftp://idp.example/jwks", "http(s)"),
            ("file:///etc/jwks.json", "http(s)"),
            ("idp.example/jwks", "not a URL"),
            ("", "not a URL"),
            ("https://user:pass@idp.example/jwks", "user info"),
            (r"https://idp.example\@localhost/jwks", "backslash"),
        ] {
            let message = key(url).expect_err(url).0;
            assert!(
                message.contains("JWT_JWKS_URL") && message.contains(needle),
                "{url}: {message}"
            );
        }
    }

    #[test]
    fn jwks_timings_are_checked() {
        let url = "--jwt-jwks-url=https://idp.example/jwks";
        let refused = |args: &[&str]| {
            let mut all = vec![url];
            all.extend_from_slice(args);
            settings(&all).validate().expect_err("refused").0
        };
        assert!(refused(&["--jwt-jwks-timeout=0s"]).contains("JWT_JWKS_TIMEOUT"));
        assert!(refused(&["--jwt-jwks-refresh=0s"]).contains("JWT_JWKS_REFRESH"));
        let inverted = refused(&["--jwt-jwks-refresh=1m", "--jwt-jwks-min-refresh=5m"]);
        assert!(inverted.contains("JWT_JWKS_MIN_REFRESH"), "{inverted}");
        let JwtKey::Jwks(jwks) = settings(&[
            url,
            "--jwt-jwks-timeout=1500ms",
            "--jwt-jwks-refresh=1m",
            "--jwt-jwks-min-refresh=0s",
        ])
        .jwt_key()
        .expect("valid") else {
            panic!("not a JWKS source");
        };
        assert_eq!(jwks.timeout, Duration::from_millis(1500));
        assert_eq!(jwks.refresh, Duration::from_secs(60));
        assert_eq!(jwks.min_refresh, Duration::ZERO);
    }

    #[test]
    fn durations_are_human_readable() {
        let s = settings(&[SECRET, "--lease=1m", "--gateway-timeout=1500ms"]);
        assert_eq!(s.core.gateway.lease, Duration::from_secs(60));
        assert_eq!(s.core.gateway.gateway_timeout, Duration::from_millis(1500));
    }

    #[test]
    fn jobs_run_in_process_with_the_sandbox_only_by_default() {
        assert!(settings(&[SECRET]).with_jobs());
        let remote = [
            "--gateway-url=http://127.0.0.1:1",
            "--gateway-secret-key=sk_test_sandbox",
        ];
        assert!(!settings(&[SECRET, remote[0], remote[1]]).with_jobs());
        assert!(settings(&[SECRET, remote[0], remote[1], "--with-jobs"]).with_jobs());
        assert!(!settings(&[SECRET, "--with-jobs=false"]).with_jobs());
        let short = settings(&[SECRET, "--abandon-after=10s"]);
        assert!(
            short.validate().is_err(),
            "job settings are checked when jobs run here"
        );
    }

    #[test]
    fn each_subcommand_takes_only_its_own_flags() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        let token = cli
            .find_subcommand_mut("token")
            .expect("token")
            .render_long_help()
            .to_string();
        assert!(token.contains("--customer") && token.contains("JWT_HS256_SECRET"));
        for other in [
            "DATABASE_URL",
            "GATEWAY_URL",
            "LEASE",
            "LISTEN_ADDR",
            "LOG_FORMAT",
        ] {
            assert!(
                !token.contains(other),
                "token --help lists {other}:\n{token}"
            );
        }
        let parse = |args: &[&str]| Cli::try_parse_from([&["payments-api"], args].concat());
        assert!(parse(&["token", "--customer=c", "--lease=5s"]).is_err());
        assert!(parse(&["token"]).is_err(), "a customer or a subject");
        assert!(parse(&["token", "--customer=c", "--subject=s"]).is_err());
        match parse(&[
            "token",
            "--subject=ops_bob",
            "--scope",
            "refunds:write charges:read_all",
        ]) {
            Ok(Cli {
                command:
                    Some(Command::Token {
                        subject, scopes, ..
                    }),
                ..
            }) => {
                assert_eq!(subject.as_deref(), Some("ops_bob"));
                assert_eq!(scopes, ["refunds:write", "charges:read_all"]);
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        assert!(parse(&["--lease=5s", "token", "--customer=c"]).is_err());
        // Serving's flags, with or without `serve`.
        for args in [&["--lease=1m"][..], &["serve", "--lease=1m"]] {
            let cli = parse(args).expect("parses");
            let settings = match cli.command {
                Some(Command::Serve(settings)) => *settings,
                None => cli.settings,
                other => panic!("{other:?}"),
            };
            assert_eq!(settings.core.gateway.lease, Duration::from_secs(60));
        }
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let s = settings(&[
            SECRET,
            "--gateway-url=http://127.0.0.1:1",
            "--gateway-secret-key=sk_test_hidden_42",
        ]);
        let shown = format!("{s:?}");
        assert!(shown.contains("gateway_url"), "{shown}");
        for secret in ["sk_test_hidden_42", "0123456789abcdef0123456789abcdef-x"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        let key = s.jwt_key().expect("a key");
        assert!(!format!("{key:?}").contains("0123456789abcdef"));
    }
}
