//! `payments-jobs reap|prune|run [--once] [--dry-run]`: the reaper and the
//! pruner, for ops. Exit code 1 when a `--once` pass failed or the
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
    about = "Recovers stuck charges and prunes old idempotency keys"
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
    /// Both, each on its timer.
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
    cli.settings.validate()?;
    cli.jobs.validate(&cli.settings.gateway)?;
    // The reaper re-drives charges at the provider, so it needs one; the
    // pruner only talks to the database.
    let provider = cli.settings.gateway.remote()?;
    if reap && provider.is_none() {
        anyhow::bail!(
            "GATEWAY_URL is not set: the reaper re-drives charges at the provider, set GATEWAY_URL \
             and GATEWAY_SECRET_KEY as for payments-api"
        );
    }
    let store = cli.settings.database.open().await?;
    let reaper = match provider.filter(|_| reap) {
        Some(provider) => {
            let app = payments_app::assemble(store.clone(), &cli.settings, provider).await?;
            Some(cli.jobs.reaper(app.service, cli.settings.gateway.lease))
        }
        None => None,
    };
    let pruner = prune.then(|| cli.jobs.pruner(store));
    let jobs = Jobs::new(reaper, pruner, &cli.jobs);

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
