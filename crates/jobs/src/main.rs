//! `payments-jobs reap|prune|reconcile|run [--once] [--dry-run]`: the
//! reaper, the pruner and the reconciler, for ops. Exit code 1 when a `--once` pass failed or the
//! configuration is refused; `run` stops cleanly on SIGTERM/SIGINT after the
//! pass in hand.

use clap::{Parser, ValueEnum};
use payments_app::{Settings, init_logging, shutdown_signal, telemetry};
use payments_jobs::runner::Jobs;
use payments_jobs::settings::JobArgs;

#[derive(Debug, Parser)]
#[command(
    name = "payments-jobs",
    version,
    about = "Recovers stuck charges, reconciles unknown outcomes and prunes old idempotency keys"
)]
struct Cli {
    /// Which job.
    #[arg(value_enum)]
    job: Job,
    /// One pass, then exit (non-zero if it failed).
    #[arg(long)]
    once: bool,
    /// Report what a pass would do; change nothing (implies --once).
    #[arg(long)]
    dry_run: bool,
    /// Serve Prometheus metrics (reaped, abandoned, pruned, provider calls)
    /// on this address at /metrics while `run` runs.
    #[arg(long, env = "METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    #[command(flatten)]
    settings: Settings,
    #[command(flatten)]
    jobs: JobArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Job {
    /// Re-drive in-progress requests whose lease expired (every --reap-every).
    Reap,
    /// Delete complete records past their expiry (every --prune-every).
    Prune,
    /// Settle unknown charges and refunds from the provider's records
    /// (every --reconcile-every).
    Reconcile,
    /// All three, each on its timer.
    Run,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.settings.log.log_format);
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
    let reap = matches!(cli.job, Job::Reap | Job::Run);
    let prune = matches!(cli.job, Job::Prune | Job::Run);
    let reconcile = matches!(cli.job, Job::Reconcile | Job::Run);
    cli.settings.validate()?;
    cli.jobs.validate(&cli.settings.gateway)?;
    // The reaper and the reconciler talk to the provider, so they need one;
    // the pruner only talks to the database.
    let provider = cli.settings.gateway.remote()?;
    if (reap || reconcile) && provider.is_none() {
        anyhow::bail!(
            "GATEWAY_URL is not set: the reaper and the reconciler talk to the provider, set \
             GATEWAY_URL and GATEWAY_SECRET_KEY as for payments-api"
        );
    }
    let store = cli.settings.database.open().await?;
    let service = match provider.filter(|_| reap || reconcile) {
        Some(provider) => {
            let app = payments_app::assemble(store.clone(), &cli.settings, provider).await?;
            Some(app.service)
        }
        None => None,
    };
    let reaper = service
        .clone()
        .filter(|_| reap)
        .map(|service| cli.jobs.reaper(service, cli.settings.gateway.lease));
    let reconciler = service
        .filter(|_| reconcile)
        .map(|service| cli.jobs.reconciler(service));
    let pruner = prune.then(|| cli.jobs.pruner(store));

    if cli.dry_run {
        if let Some(reaper) = &reaper {
            reaper.dry_run().await?;
        }
        if let Some(pruner) = &pruner {
            pruner.dry_run().await?;
        }
        if let Some(reconciler) = &reconciler {
            reconciler.dry_run().await?;
        }
        return Ok(());
    }
    let jobs = Jobs::new(reaper, pruner, reconciler, &cli.jobs);
    if cli.once {
        let outcome = jobs.run_once().await.map_err(anyhow::Error::msg)?;
        tracing::info!(?outcome, "pass complete");
        return Ok(());
    }
    tracing::info!(
        reap,
        prune,
        reconcile,
        "payments-jobs running; SIGTERM or SIGINT stops it after the pass in hand"
    );
    jobs.run_until_stopped(shutdown_signal()).await;
    Ok(())
}
