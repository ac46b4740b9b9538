//! `payments-sandbox`: the simulated provider as a process.
//!
//! Prints exactly one line to stdout once it listens,
//! `payments-sandbox listening on http://IP:PORT`, so a test that starts it
//! with `--listen 127.0.0.1:0` can read the port. Logs go to stderr.
//!
//! With `--ledger PATH` (`SANDBOX_LEDGER`) its charges, refunds, captures,
//! disputes and answered idempotency keys are kept in that file across
//! restarts (the crate's `journal` module); without, in memory only.
//!
//! With `--webhook-url URL` (`SANDBOX_WEBHOOK_URL`) it sends Stripe's
//! signed events there (the crate's `webhooks` module); the rest of the
//! webhook settings are set at run time through `POST /_sandbox/config`.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{ArgAction, Parser};
// Boolean env vars accept 1/0, yes/no, on/off as well as true/false.
use clap::builder::BoolishValueParser;
use payments_sandbox::{LedgerFile, RefundStatus, SandboxConfig};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// A simulated Stripe-compatible payment provider with fault injection.
/// It moves no money.
#[derive(Debug, Parser)]
#[command(name = "payments-sandbox", version)]
struct Args {
    /// Address to listen on; port 0 picks a free one.
    #[arg(long, env = "SANDBOX_LISTEN_ADDR", default_value = "127.0.0.1:12111")]
    listen: SocketAddr,
    /// Keep the ledger (charges, refunds, captures and the idempotency keys
    /// answered) in this file across restarts; created if missing. Unset: in
    /// memory.
    #[arg(long, env = "SANDBOX_LEDGER")]
    ledger: Option<PathBuf>,
    /// Milliseconds to wait before processing each charge, refund or
    /// capture.
    #[arg(long, env = "SANDBOX_LATENCY_MS", default_value_t = 0)]
    latency_ms: u64,
    /// Probability (0.0-1.0) of answering a charge, refund or capture with
    /// 500 and doing nothing; the 500 is saved under the idempotency key and
    /// replayed to every retry with it, as Stripe does.
    #[arg(long, env = "SANDBOX_ERROR_RATE", default_value_t = 0.0, value_parser = parse_rate)]
    error_rate: f64,
    /// Probability (0.0-1.0) of answering a charge, refund or capture with
    /// 429 before its idempotency key is looked at: nothing done, nothing
    /// saved.
    #[arg(long, env = "SANDBOX_RATE_LIMIT_RATE", default_value_t = 0.0, value_parser = parse_rate)]
    rate_limit_rate: f64,
    /// Never answer charge, refund or capture requests, and do nothing.
    #[arg(long, env = "SANDBOX_HANG", value_parser = BoolishValueParser::new())]
    hang: bool,
    /// Charge (or refund, or capture), then close the connection without
    /// answering.
    #[arg(long, env = "SANDBOX_DROP_AFTER_CHARGE", value_parser = BoolishValueParser::new())]
    drop_after_charge: bool,
    /// Seconds the sandbox remembers an idempotency key (Stripe: 24 h).
    #[arg(long, env = "SANDBOX_KEY_RETENTION_SECS", default_value_t = payments_sandbox::DEFAULT_KEY_RETENTION_SECS)]
    key_retention_secs: u64,
    /// Milliseconds before a new charge shows up in charge searches.
    #[arg(long, env = "SANDBOX_SEARCH_LAG_MS", default_value_t = 0)]
    search_lag_ms: u64,
    /// The status new refunds get: succeeded, pending, requires_action
    /// (settled later by `POST /_sandbox/refunds/{id}`), failed, canceled.
    #[arg(long, env = "SANDBOX_REFUND_STATUS", default_value = "succeeded", value_parser = parse_refund_status)]
    refund_status: RefundStatus,
    /// The only secret key accepted on `/v1` (others: 401, as Stripe
    /// answers an invalid key). Unset: any non-empty key.
    #[arg(long, env = "SANDBOX_SECRET_KEY", hide_env_values = true)]
    secret_key: Option<String>,
    /// A restricted key without permission on `/v1`: answered 403.
    #[arg(long, env = "SANDBOX_RESTRICTED_KEY", hide_env_values = true)]
    restricted_key: Option<String>,
    /// Seconds a hold (a charge with `capture=false`) can be captured for:
    /// its `capture_before` is its creation plus this; then it is released.
    #[arg(long, env = "SANDBOX_HOLD_EXPIRY_SECONDS", default_value_t = payments_sandbox::DEFAULT_HOLD_EXPIRY_SECS)]
    hold_expiry_seconds: u64,
    /// Whether a hold's answers show its `capture_before` (`false`: left
    /// out; the hold still lapses on time).
    #[arg(long, env = "SANDBOX_SEND_CAPTURE_BEFORE", default_value_t = true, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    send_capture_before: bool,
    /// Send Stripe's events (webhooks) to this http(s) URL, signed with
    /// `--webhook-secret`. Unset: no events.
    #[arg(long, env = "SANDBOX_WEBHOOK_URL")]
    webhook_url: Option<String>,
    /// The webhook signing secret (`Stripe-Signature`), at least 24
    /// characters.
    #[arg(long, env = "SANDBOX_WEBHOOK_SECRET", hide_env_values = true, default_value = payments_sandbox::DEFAULT_WEBHOOK_SECRET)]
    webhook_secret: String,
}

fn parse_refund_status(raw: &str) -> Result<RefundStatus, String> {
    serde_json::from_value(serde_json::Value::String(raw.to_owned())).map_err(|_| {
        format!("must be one of succeeded, pending, requires_action, failed, canceled; got {raw:?}")
    })
}

fn parse_rate(raw: &str) -> Result<f64, String> {
    let rate: f64 = raw.parse().map_err(|error| format!("{error}"))?;
    if (0.0..=1.0).contains(&rate) {
        Ok(rate)
    } else {
        Err(format!("must be between 0.0 and 1.0, got {rate}"))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let config = SandboxConfig {
        latency_ms: args.latency_ms,
        error_rate: args.error_rate,
        rate_limit_rate: args.rate_limit_rate,
        hang: args.hang,
        drop_after_charge: args.drop_after_charge,
        key_retention_secs: args.key_retention_secs,
        search_lag_ms: args.search_lag_ms,
        refund_status: args.refund_status,
        secret_key: args.secret_key,
        restricted_key: args.restricted_key,
        hold_expiry_seconds: args.hold_expiry_seconds,
        send_capture_before: args.send_capture_before,
        webhook_url: args.webhook_url,
        webhook_secret: args.webhook_secret,
        ..SandboxConfig::default()
    };
    config.validate().context("invalid sandbox configuration")?;

    let kept = match &args.ledger {
        Some(path) => format!("keeps its ledger in {}", path.display()),
        None => "keeps everything in memory".to_owned(),
    };
    tracing::warn!(
        "payments-sandbox is a SIMULATOR: it moves no money, {kept} and, without \
         --secret-key, accepts any API key. Never point a production system at it."
    );
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    let ledger = match args.ledger {
        Some(path) => Some(tokio::task::spawn_blocking(move || LedgerFile::open(path)).await??),
        None => None,
    };
    tracing::info!(%addr, ?config, "payments-sandbox starting");

    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "payments-sandbox listening on http://{addr}")
        .and_then(|()| stdout.flush())
        .context("writing the listening line to stdout")?;
    drop(stdout);

    payments_sandbox::serve_with_ledger(listener, config, ledger, shutdown_signal())
        .await
        .context("serving")?;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM. If a handler cannot be installed, that
/// signal is logged and ignored rather than stopping the server at once.
async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                terminate.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => tracing::info!("SIGINT received, stopping"),
        () = terminate => tracing::info!("SIGTERM received, stopping"),
    }
}
