//! Configuration: every setting is a flag and an environment variable (clap
//! `env`), durations are human-readable (`1500ms`, `5m`, `24h`), and the
//! combination is validated before anything starts.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use payments_app::settings::{DatabaseArgs, LogArgs, secret};
use payments_app::{Provider, Settings as AppSettings};
use payments_jobs::settings::JobArgs;
use secrecy::{ExposeSecret, SecretString};

use crate::auth::JwtRules;

pub use payments_app::ConfigError;

/// The JWT secret `make run` and the README use. Refused next to a real provider.
pub const DEV_JWT_SECRET: &str = "dev-only-secret-do-not-use-in-production";
const MIN_HS256_SECRET_BYTES: usize = 32;
/// The largest `JWT_LEEWAY`: an allowance for clock skew, not a lifetime.
const MAX_JWT_LEEWAY: Duration = Duration::from_secs(5 * 60);

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
        #[arg(long)]
        customer: String,
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
    /// Run the reaper and the pruner in this process too. Default: on with
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
    #[command(flatten)]
    pub http: crate::server::HttpTimeouts,
}

/// How bearer tokens are verified.
#[derive(Debug, Clone)]
pub enum JwtKey {
    Hs256(SecretString),
    /// PEM text of the public key.
    Rs256(String),
}

impl Settings {
    /// The JWT key, or why there is none.
    pub fn jwt_key(&self) -> Result<JwtKey, ConfigError> {
        match (&self.jwt_hs256_secret, &self.jwt_rs256_public_key) {
            (Some(_), Some(_)) => Err(ConfigError(
                "set either JWT_HS256_SECRET or JWT_RS256_PUBLIC_KEY, not both".into(),
            )),
            (None, None) => Err(ConfigError(
                "no JWT key: set JWT_HS256_SECRET (at least 32 bytes) or JWT_RS256_PUBLIC_KEY \
                 (`make run` sets a development secret)"
                    .into(),
            )),
            (Some(secret), None) if secret.expose_secret().len() < MIN_HS256_SECRET_BYTES => {
                Err(ConfigError(format!(
                    "JWT_HS256_SECRET must be at least {MIN_HS256_SECRET_BYTES} bytes"
                )))
            }
            (Some(secret), None) => Ok(JwtKey::Hs256(secret.clone())),
            (None, Some(key)) if key.trim_start().starts_with("-----BEGIN") => {
                Ok(JwtKey::Rs256(key.clone()))
            }
            (None, Some(path)) => std::fs::read_to_string(path)
                .map(JwtKey::Rs256)
                .map_err(|e| ConfigError(format!("JWT_RS256_PUBLIC_KEY: cannot read {path}: {e}"))),
        }
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
        Ok(JwtRules {
            max_lifetime: self.jwt_max_lifetime,
            leeway: self.jwt_leeway,
            issuer: non_empty("JWT_ISSUER", &self.jwt_issuer)?,
            audience: non_empty("JWT_AUDIENCE", &self.jwt_audience)?,
        })
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
            None => Provider::Sandbox(self.sandbox_listen_addr),
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
        Ok(provider)
    }

    /// Whether the reaper and pruner run in this process.
    pub fn with_jobs(&self) -> bool {
        self.with_jobs
            .unwrap_or(self.core.gateway.gateway_url.is_none())
    }
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

    #[test]
    #[cfg(feature = "dev-sandbox")]
    fn defaults_are_valid_with_a_secret() {
        let provider = settings(&[SECRET]).validate().expect("valid");
        assert!(matches!(provider, Provider::Sandbox(_)), "{provider:?}");
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
    fn dev_secrets_are_refused_next_to_any_real_provider_host() {
        let refused = |args: &[&str]| settings(args).validate().expect_err("refused").0;
        let dev = format!("--jwt-hs256-secret={DEV_JWT_SECRET}");
        let live = "--gateway-secret-key=sk_live_x";
        // Userinfo, and a backslash that hides the real host from some parsers.
        let hidden = refused(&[&dev, r"--gateway-url=https://a.example\@localhost", live]);
        assert!(hidden.contains("GATEWAY_URL"), "{hidden}");
        let userinfo = refused(&[&dev, "--gateway-url=https://user:pass@localhost", live]);
        assert!(userinfo.contains("user"), "{userinfo}");
        for url in [
            "https://localhost.example.com",
            "http://127.0.0.1.example.com",
            "http://10.0.0.1:12111",
            "http://[::ffff:10.0.0.1]/",
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
