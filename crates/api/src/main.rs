//! `payments-api`: serve (default), `migrate`, or `token --customer ID`.
//!
//! Output: logs on stderr (one JSON object a line with `LOG_FORMAT=json`).
//! Serving with text logs, stdout says `payments-api listening on URL` for
//! a person or a script to read; with JSON logs stdout stays empty and the
//! `serving` log line carries the address. `token` prints the token on
//! stdout: data for a script, not a log line.

use std::sync::LazyLock;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches};
use payments_api::auth;
use payments_api::config::{Cli, Command, Settings};
use payments_api::{AppState, serve};
use payments_app::settings::{DatabaseArgs, LogFormat};
use payments_app::{
    flush_logs, init_logging, init_logging_batched, log_format, report_exit_error, shutdown_signal,
};
use payments_jobs::runner::{Job, Jobs};
use secrecy::{ExposeSecret, SecretString};

/// mimalloc rather than glibc's malloc: fewer instructions per allocation
/// and no lock contention between the runtime's threads (see the
/// workspace's Cargo.toml and docs/benchmarks.md, issue 31).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `--version`: the version and the git commit, `0.1.0 (abc1234)`.
static VERSION: LazyLock<String> =
    LazyLock::new(|| payments_app::telemetry::version(env!("CARGO_PKG_VERSION")));

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let matches = Cli::command().version(VERSION.as_str()).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        None => run(cli.settings).await,
        Some(Command::Serve(settings)) => run(*settings).await,
        Some(Command::Migrate { database, log }) => {
            init_logging(log.log_format);
            migrate(&database).await
        }
        Some(Command::Token {
            customer,
            subject,
            scopes,
            audience,
            ttl,
            jwt_hs256_secret,
        }) => token(
            jwt_hs256_secret.as_ref(),
            customer.or(subject),
            &scopes,
            audience.as_deref(),
            ttl,
        ),
    };
    let code = match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            report_exit_error("payments-api", &e);
            std::process::ExitCode::FAILURE
        }
    };
    flush_logs();
    code
}

/// Prints a development token for `subject` (a customer, or with
/// `--subject` anyone else) carrying `scopes`, each of which must be one
/// of this server's, for `audience` when given.
fn token(
    secret: Option<&SecretString>,
    subject: Option<String>,
    scopes: &[String],
    audience: Option<&str>,
    ttl: std::time::Duration,
) -> anyhow::Result<()> {
    use payments_domain::scope::Scope;
    let secret = secret.context("`token` signs with JWT_HS256_SECRET; set it")?;
    let subject = subject.context("--customer or --subject names the token's subject")?;
    payments_domain::charge::CustomerId::parse(&subject)
        .map_err(|e| anyhow::anyhow!("--customer/--subject: {e}"))?;
    if let Some(unknown) = scopes.iter().find(|s| Scope::parse(s).is_none()) {
        let known: Vec<&str> = Scope::ALL.iter().map(|s| s.as_str()).collect();
        anyhow::bail!(
            "--scope {unknown:?} is not one of this server's: {}",
            known.join(", ")
        );
    }
    println!(
        "{}",
        auth::mint_hs256_scoped(secret.expose_secret(), &subject, scopes, audience, ttl)?
    );
    Ok(())
}

async fn migrate(database: &DatabaseArgs) -> anyhow::Result<()> {
    database.migrate().await?;
    tracing::info!(database = %database.database_url, "migrations applied");
    Ok(())
}

async fn run(settings: Settings) -> anyhow::Result<()> {
    init_logging_batched(settings.core.log.log_format);
    let provider = settings.validate()?;
    // Bound before the provider is built: an in-process sandbox sends its
    // webhooks to the address really bound (LISTEN_ADDR's port may be 0).
    let listener = tokio::net::TcpListener::bind(settings.listen_addr)
        .await
        .with_context(|| format!("binding {}", settings.listen_addr))?;
    let addr = listener.local_addr()?;
    let provider = provider.webhooks_to(Settings::sandbox_webhook_url(addr));
    let app = payments_app::build(&settings.core, provider).await?;
    let (stop_jobs, jobs_stopped) = tokio::sync::oneshot::channel::<()>();
    let jobs = match settings.with_jobs() {
        false => None,
        true => Some({
            let reaper = settings
                .jobs
                .reaper(app.service.clone(), settings.core.gateway.lease);
            let pruner = settings.jobs.pruner(app.store.clone());
            let reconciler = settings.jobs.reconciler(app.service.clone());
            let expirer = payments_jobs::expirer::Expirer::new(app.store.clone());
            let deliverer = settings.jobs.deliverer(app.store.clone())?;
            let jobs = Jobs::new(
                [
                    Job::Reap(reaper),
                    Job::Prune(pruner),
                    Job::Reconcile(reconciler),
                    Job::Expire(expirer),
                    Job::Deliver(deliverer),
                ],
                &settings.jobs,
            );
            tracing::info!(
                "running the reaper, the pruner, the reconciler, the expirer and the deliverer in \
             this process (--with-jobs)"
            );
            tokio::spawn(jobs.run_until_stopped(async move {
                let _ = jobs_stopped.await;
            }))
        }),
    };
    let state = AppState::new(&settings, app.service)?;
    // With JWT_JWKS_URL: the keys are fetched before serving (a failure is
    // logged and retried; tokens are refused until keys arrive).
    let jwks = match state.auth.jwks() {
        Some(jwks) => Some(jwks.start().await),
        None => None,
    };
    tracing::info!(%addr, database = %settings.core.database.database_url, gateway = %app.provider_url, "serving");
    // For a person, and for scripts and tests that wait for it; with JSON
    // logs every line is JSON, and the `serving` line above has the address.
    if log_format() != Some(LogFormat::Json) {
        println!("payments-api listening on http://{addr}");
    }
    payments_app::batch_logs();
    serve(listener, state, shutdown_signal()).await?;
    if let Some(jwks) = jwks {
        jwks.abort();
    }
    // The jobs finish the pass in hand, then stop.
    let _ = stop_jobs.send(());
    if let Some(jobs) = jobs {
        let _ = jobs.await;
    }
    tracing::info!("stopped");
    Ok(())
}
