//! `payments-jobs reap|prune|reconcile|expire|deliver|run [--once]
//! [--dry-run]`: the reaper, the pruner, the reconciler, the expirer and the
//! deliverer, for ops; `payments-jobs webhooks [--resend EVENT_ID |
//! --resend-failed]` lists failed webhook deliveries and sends them again. Exit code 1 when a `--once` pass failed or the
//! configuration is refused; `run` stops cleanly on SIGTERM/SIGINT after the
//! pass in hand.

use std::io::IsTerminal;
use std::sync::LazyLock;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use payments_app::settings::LogFormat;
use payments_app::telemetry::{self, Binary};
use payments_app::{Settings, init_logging, report_exit_error, shutdown_signal};
use payments_domain::webhook::DeliveryState;
use payments_jobs::reaper;
use payments_jobs::runner::{Job as RunnerJob, Jobs};
use payments_jobs::settings::JobArgs;

/// `--version`: the version and the git commit, `0.1.0 (abc1234)`.
static VERSION: LazyLock<String> = LazyLock::new(|| telemetry::version(env!("CARGO_PKG_VERSION")));

#[derive(Debug, Parser)]
#[command(
    name = "payments-jobs",
    about = "Recovers stuck charges, reconciles unknown outcomes and prunes old idempotency keys"
)]
struct Cli {
    /// Which job.
    #[arg(value_enum)]
    job: Job,
    /// One pass, then exit (non-zero if it failed).
    #[arg(long)]
    once: bool,
    /// Report what a pass would do; change nothing (implies --once). `reap
    /// --dry-run` and `prune --dry-run` only read the database and need no
    /// GATEWAY_URL; `reconcile --dry-run` asks the provider.
    #[arg(long)]
    dry_run: bool,
    /// Serve Prometheus metrics (reaped, abandoned, pruned, provider calls)
    /// on this address at /metrics while `run` runs. Accepted, and not
    /// served, with --once or --dry-run.
    #[arg(long, env = "METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// `webhooks`: send this event again to every endpoint that wants it
    /// (whatever its deliveries did before).
    #[arg(long, value_name = "EVENT_ID", conflicts_with = "resend_failed")]
    resend: Option<String>,
    /// `webhooks`: send every failed delivery again (after a receiver's
    /// outage), each with a new WEBHOOK_RETRY_FOR window.
    #[arg(long)]
    resend_failed: bool,
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
    /// Mark holds that lapsed uncaptured expired, and count holds by
    /// status (every --expire-every).
    Expire,
    /// Dispatch new events and deliver due webhooks (every
    /// --deliver-every).
    Deliver,
    /// List failed webhook deliveries; with --resend or --resend-failed,
    /// send them again.
    Webhooks,
    /// All five jobs, each on its timer.
    Run,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let matches = Cli::command().version(VERSION.as_str()).get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let format = cli.settings.log.log_format;
    init_logging(format);
    // A bar only for a person at a terminal: never in a log file, never
    // amid JSON lines.
    cli.jobs.progress_bar = format == LogFormat::Text && std::io::stderr().is_terminal();
    // Installed first, so every pass is counted, and every metric is
    // described and at zero before the first.
    if let Err(e) = telemetry::install(Binary::Jobs, env!("CARGO_PKG_VERSION")) {
        tracing::warn!(error = %e, "metrics recorder unavailable");
    }
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            report_exit_error("payments-jobs", &e);
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let reap = matches!(cli.job, Job::Reap | Job::Run);
    let prune = matches!(cli.job, Job::Prune | Job::Run);
    let reconcile = matches!(cli.job, Job::Reconcile | Job::Run);
    let expire = matches!(cli.job, Job::Expire | Job::Run);
    let deliver = matches!(cli.job, Job::Deliver | Job::Run);
    if (cli.resend.is_some() || cli.resend_failed) && cli.job != Job::Webhooks {
        anyhow::bail!("--resend and --resend-failed go with `payments-jobs webhooks`");
    }
    cli.settings.validate()?;
    cli.jobs.validate(&cli.settings.gateway)?;
    // The reaper and the reconciler talk to the provider, so they need one;
    // the pruner only talks to the database, and so does the reaper's dry
    // run. The reconciler's dry run looks each operation up at the provider.
    let provider = cli.settings.gateway.remote()?;
    cli.settings.gateway.derivation()?;
    if provider.is_none() {
        if reconcile {
            let why = if cli.dry_run {
                "the reconciler, even in a dry run, looks each operation up at the provider"
            } else {
                "the reaper and the reconciler talk to the provider"
            };
            anyhow::bail!(
                "GATEWAY_URL is not set: {why}; set GATEWAY_URL and GATEWAY_SECRET_KEY as for \
                 payments-api"
            );
        }
        if reap && !cli.dry_run {
            anyhow::bail!(
                "GATEWAY_URL is not set: the reaper talks to the provider, set GATEWAY_URL and \
                 GATEWAY_SECRET_KEY as for payments-api (`reap --dry-run` needs neither)"
            );
        }
    }
    // Bound before any work, so a taken or refused address stops the start.
    let one_pass = cli.once || cli.dry_run;
    let metrics = match cli.metrics_addr {
        Some(addr) if !one_pass => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding METRICS_ADDR {addr} for /metrics"))?,
        ),
        Some(addr) => {
            tracing::info!(%addr, "one pass: METRICS_ADDR is not served");
            None
        }
        None => None,
    };
    let store = cli.settings.database.open().await?;
    if cli.job == Job::Webhooks {
        return webhooks(&cli, store).await;
    }
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
    let pruner = prune.then(|| cli.jobs.pruner(store.clone()));
    let expirer = expire.then(|| payments_jobs::expirer::Expirer::new(store.clone()));
    let deliverer = match deliver {
        true => Some(cli.jobs.deliverer(store.clone())?),
        false => None,
    };

    if cli.dry_run {
        if reap {
            let settings = cli.jobs.reaper_settings(cli.settings.gateway.lease);
            let limit = cli.settings.gateway.redrive_limit();
            reaper::dry_run(&store, &settings, limit).await?;
        }
        if let Some(pruner) = &pruner {
            pruner.dry_run().await?;
        }
        if let Some(reconciler) = &reconciler {
            reconciler.dry_run().await?;
        }
        if let Some(expirer) = &expirer {
            let holds = expirer.dry_run().await?;
            tracing::info!(?holds, "expire dry run: holds by status");
        }
        if let Some(deliverer) = &deliverer {
            let oldest = deliverer.oldest().await?;
            tracing::info!(
                ?oldest,
                "deliver dry run: the oldest event still to deliver"
            );
        }
        return Ok(());
    }
    let jobs = [
        reaper.map(RunnerJob::Reap),
        pruner.map(RunnerJob::Prune),
        reconciler.map(RunnerJob::Reconcile),
        expirer.map(RunnerJob::Expire),
        deliverer.map(RunnerJob::Deliver),
    ];
    let jobs = Jobs::new(jobs.into_iter().flatten(), &cli.jobs);
    if cli.once {
        let outcome = jobs.run_once().await.map_err(anyhow::Error::msg)?;
        tracing::info!(?outcome, "pass complete");
        return Ok(());
    }
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics = metrics.map(|listener| {
        tokio::spawn(telemetry::serve_metrics(listener, async move {
            let _ = metrics_stopped.await;
        }))
    });
    tracing::info!(
        reap,
        prune,
        reconcile,
        expire,
        deliver,
        "payments-jobs running; SIGTERM or SIGINT stops it after the pass in hand"
    );
    jobs.run_until_stopped(shutdown_signal()).await;
    let _ = stop_metrics.send(());
    if let Some(server) = metrics {
        match server.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the /metrics server failed"),
            Err(e) => tracing::warn!(error = %e, "the /metrics server task failed"),
        }
    }
    Ok(())
}

/// `payments-jobs webhooks`: the failed deliveries, one line each on
/// stdout; with `--resend` or `--resend-failed`, sent again (the next
/// `deliver` pass attempts them).
async fn webhooks(
    cli: &Cli,
    store: std::sync::Arc<dyn payments_domain::store::Store>,
) -> anyhow::Result<()> {
    let deliverer = cli.jobs.deliverer(store)?;
    if cli.resend_failed || cli.resend.is_some() {
        let resent = deliverer.resend(cli.resend.as_deref()).await?;
        match &cli.resend {
            Some(event) if resent == 0 => {
                anyhow::bail!("no event {event:?}, or no endpoint in WEBHOOK_ENDPOINTS wants it")
            }
            Some(event) => println!("{event}: {resent} deliveries to make again"),
            None => println!("{resent} failed deliveries to make again"),
        }
        return Ok(());
    }
    let failed = deliverer.list(DeliveryState::Failed, 1000).await?;
    if failed.is_empty() {
        println!("no failed deliveries");
    }
    for d in &failed {
        println!(
            "{}\t{}\t{}\tattempts={}\tlast_status={}\tlast_error={}",
            d.event.id,
            d.event.event_type,
            d.endpoint,
            d.attempts,
            d.last_status.map_or("-".to_owned(), |s| s.to_string()),
            d.last_error.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}
