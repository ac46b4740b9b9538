//! # payments-app
//!
//! The one place that assembles the server, used by `payments-api`'s main,
//! `payments-jobs`' main and the tests' `spawn_app` alike, so there is no
//! second copy of the wiring to drift (`docs/architecture.md`, "Crates").
//!
//! - [`settings`]: the flags and environment variables both binaries share
//!   ([`Settings`]: database, provider and lease, charge limits, logs), each
//!   validated into one [`ConfigError`].
//! - [`telemetry`]: the process-wide Prometheus recorder.
//! - [`webhooks`]: `WEBHOOK_ENDPOINTS`, the merchant's webhook endpoints,
//!   read and checked ([`webhooks::parse_endpoints`]).
//! - [`build`] / [`assemble`]: store + gateway + [`ChargeService`].
//! - [`shutdown_signal`]: SIGINT or SIGTERM.
#![forbid(unsafe_code)]

pub mod answers;
pub mod limits;
pub mod logwriter;
pub mod settings;
pub mod telemetry;
pub mod webhooks;

use std::sync::Arc;

use anyhow::Context;
use payments_domain::derive::Derivation;
use payments_domain::service::{ChargeService, Policy};
use payments_domain::store::Store;
use payments_gateway::HttpGateway;
use secrecy::{ExposeSecret, SecretString};

pub use settings::{
    ConfigError, Settings, batch_logs, flush_logs, init_logging, init_logging_batched, log_format,
    report_exit_error,
};

/// Where provider calls go.
#[derive(Debug, Clone)]
pub enum Provider {
    /// A provider at `url` (Stripe-compatible), authenticated with `secret_key`.
    Remote {
        url: String,
        secret_key: SecretString,
    },
    /// An in-process sandbox (`make run`; no money moves).
    #[cfg(feature = "dev-sandbox")]
    Sandbox {
        /// Where it listens.
        listen: std::net::SocketAddr,
        /// The file its ledger is kept in across restarts; `None`: memory.
        ledger: Option<std::path::PathBuf>,
        /// Where it sends its webhooks (signed with
        /// [`settings::SANDBOX_WEBHOOK_SECRET`]); `None`: it sends none.
        webhook_url: Option<String>,
    },
}

impl Provider {
    /// This provider with an in-process sandbox's webhooks sent to `url`
    /// (once the API's address is bound); a remote provider is unchanged.
    #[cfg_attr(not(feature = "dev-sandbox"), allow(unused_variables))]
    pub fn webhooks_to(self, url: String) -> Self {
        #[cfg(feature = "dev-sandbox")]
        if let Provider::Sandbox { listen, ledger, .. } = self {
            return Provider::Sandbox {
                listen,
                ledger,
                webhook_url: Some(url),
            };
        }
        self
    }
}

/// What the binaries and the tests run: the store, and the service over it
/// and the provider.
#[derive(Debug, Clone)]
pub struct Assembly {
    pub store: Arc<dyn Store>,
    pub service: Arc<ChargeService>,
    /// The provider's base URL (the sandbox's, when in-process).
    pub provider_url: String,
}

/// Opens the store (applying migrations), then [`assemble`]s over it.
pub async fn build(settings: &Settings, provider: Provider) -> anyhow::Result<Assembly> {
    let store = settings.database.open().await?;
    assemble(store, settings, provider).await
}

/// The service over `store` and `provider`, with the settings' policy.
pub async fn assemble(
    store: Arc<dyn Store>,
    settings: &Settings,
    provider: Provider,
) -> anyhow::Result<Assembly> {
    let (provider_url, secret_key, remote) = match provider {
        Provider::Remote { url, secret_key } => (url, secret_key, true),
        #[cfg(feature = "dev-sandbox")]
        Provider::Sandbox {
            listen,
            ledger,
            webhook_url,
        } => {
            let (url, key) = start_sandbox(listen, ledger, webhook_url).await?;
            (url, key, false)
        }
    };
    let gateway = HttpGateway::pinned(
        &provider_url,
        secret_key.expose_secret(),
        settings.gateway.gateway_timeout,
        &settings.gateway.gateway_stripe_version,
    )
    .ok_or_else(|| {
        anyhow::anyhow!(
            "GATEWAY_STRIPE_VERSION {:?} is not a Stripe API version",
            settings.gateway.gateway_stripe_version
        )
    })?
    .context("building the provider client")?;
    if remote {
        tokio::spawn(probe(gateway.clone(), provider_url.clone()));
    }
    let policy = settings.policy()?;
    pin_derivation(store.as_ref(), &policy.derivation).await?;
    let mut service = ChargeService::new(store.clone(), Arc::new(gateway), policy);
    if settings.charges.replay_cache_mb > 0 {
        let bytes = settings.charges.replay_cache_mb.saturating_mul(1024 * 1024);
        service = service.with_answers(Arc::new(answers::MokaAnswers::new(bytes)));
    }
    if let Some((per_minute, burst)) = settings.charges.rate_limit() {
        service = service.with_rate_limit(Arc::new(limits::GovernorLimit::new(per_minute, burst)));
    }
    if let Some((per_minute, burst)) = settings.charges.backoffice_rate_limit() {
        let limit = limits::GovernorLimit::new(per_minute, burst);
        service = service.with_back_office_rate_limit(Arc::new(limit));
    }
    let service = Arc::new(service);
    Ok(Assembly {
        store,
        service,
        provider_url,
    })
}

impl Settings {
    /// The service's rules.
    pub fn policy(&self) -> Result<Policy, ConfigError> {
        Ok(Policy {
            lease: self.gateway.lease,
            ttl: self.charges.idempotency_ttl,
            max_amount_cents: self.charges.max_amount_cents,
            redrive_limit: self.gateway.redrive_limit(),
            provider_acts_within: self.gateway.provider_acts_within(),
            derivation: self.gateway.derivation()?,
            hold_expiry: self.charges.hold_expiry,
            hold_capture_margin: self.charges.hold_capture_margin,
        })
    }
}

/// Refuses to serve under another PROVIDER_KEY_SECRET than the one the
/// database's operations were derived under: its fingerprint is stored by
/// the first process to start, and every replica and jobs runner after it
/// must show the same. Two secrets would derive two provider keys for one
/// operation, and a retry after a lost write would charge again.
async fn pin_derivation(store: &dyn Store, derivation: &Derivation) -> anyhow::Result<()> {
    let ours = derivation.fingerprint();
    let pinned = store
        .pin_setting(PROVIDER_KEY_FINGERPRINT, &ours)
        .await
        .map_err(|e| anyhow::anyhow!("reading the provider key secret's fingerprint: {e}"))?;
    anyhow::ensure!(
        pinned == ours,
        "refusing to start: PROVIDER_KEY_SECRET is not the secret this database's operations \
         were derived under (fingerprint {ours}, the database holds {pinned}); every replica \
         and jobs runner must use the same secret, and it is never rotated"
    );
    Ok(())
}

/// Tries the provider once at start, in the background, and says loudly
/// when it cannot be reached: a `GATEWAY_URL` on a closed port otherwise
/// starts, reports ready, and answers every charge 503. Start-up and
/// readiness do not wait for it: a provider outage must not take every
/// replica out of the load balancer, when replays, reads and 409s still
/// work and every charge is answered 503 with `Retry-After` until it is
/// back.
async fn probe(gateway: HttpGateway, url: String) {
    match gateway.reachable().await {
        Ok(()) => tracing::info!(gateway = %url, "the provider answers"),
        Err(reason) => tracing::warn!(
            gateway = %url,
            %reason,
            "PROVIDER UNREACHABLE AT START: GATEWAY_URL cannot be reached; every new charge and \
             refund will answer 503 gateway_unavailable until it can. Serving anyway (readiness \
             does not depend on the provider): check GATEWAY_URL"
        ),
    }
}

/// The name the secret's fingerprint is stored under.
pub const PROVIDER_KEY_FINGERPRINT: &str = "provider_key_fingerprint";

/// Starts the in-process sandbox, its ledger read from and kept in `ledger`
/// (in memory when `None`); its URL and secret key. It lives as long as the
/// process: each change is in the file before it is answered, so nothing
/// needs flushing at exit.
#[cfg(feature = "dev-sandbox")]
async fn start_sandbox(
    addr: std::net::SocketAddr,
    ledger: Option<std::path::PathBuf>,
    webhook_url: Option<String>,
) -> anyhow::Result<(String, SecretString)> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!("binding the in-process sandbox on {addr} (set SANDBOX_LISTEN_ADDR)")
    })?;
    let url = format!("http://{}", listener.local_addr()?);
    let kept = match &ledger {
        Some(path) => path.display().to_string(),
        None => "memory (a database that is not a SQLite file; set SANDBOX_LEDGER)".to_owned(),
    };
    let file = match ledger {
        None => None,
        Some(path) => Some(
            tokio::task::spawn_blocking(move || payments_sandbox::LedgerFile::open(path))
                .await
                .context("loading the in-process sandbox's ledger")?
                .map_err(|e| {
                    anyhow::anyhow!(
                        "{e}. With `make run`, `make clean-data` resets ./data: the database \
                         and the sandbox's ledger together (SANDBOX_LEDGER sets the ledger's path)"
                    )
                })?,
        ),
    };
    let config = payments_sandbox::SandboxConfig {
        webhook_url,
        webhook_secret: settings::SANDBOX_WEBHOOK_SECRET.to_owned(),
        ..payments_sandbox::SandboxConfig::default()
    };
    tokio::spawn(payments_sandbox::serve_with_ledger(
        listener,
        config,
        file,
        std::future::pending(),
    ));
    tracing::warn!(
        sandbox = %url,
        ledger = %kept,
        "GATEWAY_URL is not set: charging against an in-process SANDBOX. NO REAL MONEY MOVES. \
         Fault injection: POST {url}/_sandbox/config"
    );
    Ok((url, settings::SANDBOX_SECRET_KEY.into()))
}

/// Resolves on SIGINT or SIGTERM. A signal that cannot be listened for is
/// logged and never fires, so the other still stops the process.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutdown signal received; finishing the work in hand");
}
