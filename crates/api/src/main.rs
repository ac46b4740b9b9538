//! `payments-api`: serve (default), `migrate`, or `token --customer ID`.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use payments_api::auth::{self, Authenticator};
#[cfg(feature = "dev-sandbox")]
use payments_api::config::SANDBOX_SECRET_KEY;
use payments_api::config::{Cli, Command, GatewayTarget, Settings};
use payments_api::{AppState, serve};
use payments_domain::provider::Gateway;
use payments_domain::service::{ChargeService, Policy};
use payments_gateway::HttpGateway;
use payments_jobs::runner::Jobs;
use payments_jobs::settings::init_logging;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.settings.log.log_format);
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => run(cli.settings).await,
        Command::Migrate => migrate(&cli.settings).await,
        Command::Token { customer, ttl } => token(&cli.settings, &customer, ttl),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("payments-api: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn token(settings: &Settings, customer: &str, ttl: std::time::Duration) -> anyhow::Result<()> {
    let secret = settings
        .jwt_hs256_secret
        .as_deref()
        .context("`token` signs with JWT_HS256_SECRET; set it")?;
    payments_domain::charge::CustomerId::parse(customer)
        .map_err(|e| anyhow::anyhow!("--customer: {e}"))?;
    println!("{}", auth::mint_hs256(secret, customer, ttl)?);
    Ok(())
}

async fn migrate(settings: &Settings) -> anyhow::Result<()> {
    settings.database.open().await?;
    tracing::info!(database = %settings.database.database_url, "migrations applied");
    Ok(())
}

async fn run(settings: Settings) -> anyhow::Result<()> {
    let (jwt, target) = settings.validate()?;
    let auth = Authenticator::with_rules(&jwt, settings.jwt_rules()?)?;
    let store = settings.database.open().await?;
    let (gateway_url, secret_key) = match target {
        GatewayTarget::Remote { url, secret_key } => (url, secret_key),
        #[cfg(feature = "dev-sandbox")]
        GatewayTarget::EmbeddedSandbox => embedded_sandbox(&settings).await?,
    };
    let gateway: Arc<dyn Gateway> = Arc::new(
        HttpGateway::new(&gateway_url, &secret_key, settings.gateway.gateway_timeout)
            .context("building the provider client")?,
    );
    let policy = Policy {
        lease: settings.gateway.lease,
        ttl: settings.idempotency_ttl,
        max_amount_cents: settings.max_amount_cents,
        redrive_limit: settings.gateway.redrive_limit(),
    };
    let service = Arc::new(ChargeService::new(store, gateway, policy));
    let (stop_jobs, jobs_stopped) = tokio::sync::oneshot::channel::<()>();
    let jobs = settings.with_jobs().then(|| {
        let jobs = Jobs::new(
            service.clone(),
            &settings.jobs,
            settings.gateway.lease,
            true,
            true,
        );
        tracing::info!("running the reaper and the pruner in this process (--with-jobs)");
        tokio::spawn(jobs.run_until_stopped(async move {
            let _ = jobs_stopped.await;
        }))
    });
    let state = AppState {
        service,
        auth: Arc::new(auth),
        key_mode: settings.idempotency_key_mode,
        client_guide_url: settings.client_guide_url.as_str().into(),
        http: settings.http,
    };
    let listener = tokio::net::TcpListener::bind(settings.listen_addr)
        .await
        .with_context(|| format!("binding {}", settings.listen_addr))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, database = %settings.database.database_url, gateway = %gateway_url, "serving");
    println!("payments-api listening on http://{addr}");
    serve(listener, state, shutdown_signal()).await?;
    // The jobs finish the pass in hand, then stop.
    let _ = stop_jobs.send(());
    if let Some(jobs) = jobs {
        let _ = jobs.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
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
    tracing::info!("shutdown signal received; draining in-flight requests");
}

/// Starts the in-process sandbox of `make run`; its URL and secret key.
#[cfg(feature = "dev-sandbox")]
async fn embedded_sandbox(settings: &Settings) -> anyhow::Result<(String, String)> {
    let listener = tokio::net::TcpListener::bind(settings.sandbox_listen_addr)
        .await
        .with_context(|| {
            format!(
                "binding the in-process sandbox on {} (set SANDBOX_LISTEN_ADDR)",
                settings.sandbox_listen_addr
            )
        })?;
    let url = format!("http://{}", listener.local_addr()?);
    // Lives as long as the process.
    tokio::spawn(payments_sandbox::serve(
        listener,
        payments_sandbox::SandboxConfig::default(),
        std::future::pending(),
    ));
    tracing::warn!(
        sandbox = %url,
        "GATEWAY_URL is not set: charging against an in-process SANDBOX. NO REAL MONEY MOVES. \
         Fault injection: POST {url}/_sandbox/config"
    );
    Ok((url, SANDBOX_SECRET_KEY.to_owned()))
}
