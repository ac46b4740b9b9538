//! `payments-jobs reap|prune|run [--once] [--dry-run]`: the reaper and the
//! pruner, for ops. Exit code 1 when a `--once` pass failed or the
//! configuration is refused; `run` stops cleanly on SIGTERM/SIGINT after the
//! pass in hand.

use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use payments_domain::service::{ChargeService, Policy};
use payments_gateway::HttpGateway;
use payments_jobs::runner::Jobs;
use payments_jobs::settings::{DatabaseArgs, GatewayArgs, JobArgs, LogArgs, init_logging};
use payments_jobs::telemetry;

#[derive(Debug, Parser)]
#[command(
    name = "payments-jobs",
    version,
    about = "Recovers stuck charges and prunes old idempotency keys"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// One pass, then exit (non-zero if it failed).
    #[arg(long, global = true)]
    once: bool,
    /// Report what a pass would do; change nothing (implies --once).
    #[arg(long, global = true)]
    dry_run: bool,
    /// Serve Prometheus metrics (reaped, abandoned, pruned, provider calls)
    /// on this address at /metrics while `run` runs.
    #[arg(long, env = "METRICS_ADDR", global = true)]
    metrics_addr: Option<std::net::SocketAddr>,
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    database: DatabaseArgs,
    #[command(flatten)]
    gateway: GatewayArgs,
    #[command(flatten)]
    jobs: JobArgs,
}

#[derive(Debug, Clone, Copy, Subcommand)]
enum Command {
    /// Re-drive in-progress requests whose lease expired (every --reap-every).
    Reap,
    /// Delete complete records past their expiry (every --prune-every).
    Prune,
    /// Both, each on its timer.
    Run,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log.log_format);
    // Installed first, so every pass is counted.
    if let Err(e) = telemetry::handle() {
        tracing::warn!(error = %e, "metrics recorder unavailable");
    }
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("payments-jobs: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let reap = matches!(cli.command, Command::Reap | Command::Run);
    let prune = matches!(cli.command, Command::Prune | Command::Run);
    cli.database.validate().map_err(anyhow::Error::msg)?;
    cli.gateway.validate().map_err(anyhow::Error::msg)?;
    cli.jobs
        .validate(&cli.gateway)
        .map_err(anyhow::Error::msg)?;
    // The reaper re-drives charges at the provider, so it needs one; the
    // pruner only talks to the database.
    let remote = cli.gateway.remote().map_err(anyhow::Error::msg)?;
    let (url, secret_key) = match remote {
        Some((url, key, _)) => (url, key),
        None if reap => anyhow::bail!(
            "GATEWAY_URL is not set: the reaper re-drives charges at the provider, set GATEWAY_URL \
             and GATEWAY_SECRET_KEY as for payments-api"
        ),
        None => (String::from("http://127.0.0.1:9"), String::new()),
    };
    let store = cli.database.open().await?;
    let gateway = HttpGateway::new(&url, &secret_key, cli.gateway.gateway_timeout)
        .context("building the provider client")?;
    let policy = Policy {
        lease: cli.gateway.lease,
        ttl: cli.gateway.provider_key_retention,
        max_amount_cents: i64::MAX,
        redrive_limit: cli.gateway.redrive_limit(),
    };
    let service = Arc::new(ChargeService::new(store, Arc::new(gateway), policy));
    let jobs = Jobs::new(service, &cli.jobs, cli.gateway.lease, reap, prune);

    if cli.dry_run {
        if let Some((reaper, _)) = &jobs.reaper {
            reaper.dry_run().await?;
        }
        if let Some((pruner, _)) = &jobs.pruner {
            pruner.dry_run().await?;
        }
        return Ok(());
    }
    if cli.once {
        let outcome = jobs.run_once().await.map_err(anyhow::Error::msg)?;
        tracing::info!(?outcome, "pass complete");
        return Ok(());
    }
    tracing::info!(
        reap,
        prune,
        "payments-jobs running; SIGTERM or SIGINT stops it after the pass in hand"
    );
    jobs.run_until_stopped(shutdown_signal()).await;
    Ok(())
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutdown signal received");
}
