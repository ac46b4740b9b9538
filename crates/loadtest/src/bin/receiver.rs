//! `payments-receiver`: a webhook receiver for development and staging. It
//! listens on loopback (or where told), verifies each delivery's
//! `Payments-Signature` with `payments_client::webhook::verify`, prints one
//! line per event (on stderr, as a log), and answers 200 (400 to a delivery whose signature does
//! not verify, which the server then retries). `--fail-percent` answers 500
//! to that share of deliveries, to watch the retries.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use clap::Parser;
use payments_client::webhook::{SIGNATURE_HEADER, verify};
use serde_json::Value;

/// Receives the payments server's webhooks, verifies their signatures and
/// prints each event.
#[derive(Debug, Parser)]
#[command(name = "payments-receiver", version)]
struct Args {
    /// Where to listen; the endpoint's URL is `http://<this>/hooks`.
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// The endpoint's signing secret, as in WEBHOOK_ENDPOINTS.
    #[arg(long, env = "WEBHOOK_SECRET", hide_env_values = true)]
    secret: String,
    /// Answer 500 to this share of deliveries (0-100), to see retries.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    fail_percent: u8,
    /// How old a signature may be.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    tolerance: Duration,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Arc::new(Args::parse());
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("payments-receiver: binding {}: {e}", args.listen);
            return std::process::ExitCode::from(2);
        }
    };
    let addr = listener.local_addr().map_or(args.listen, |a| a);
    let app = axum::Router::new()
        .route("/hooks", axum::routing::post(receive))
        .with_state(args);
    println!("payments-receiver listening on http://{addr}/hooks");
    match axum::serve(listener, app).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("payments-receiver: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn receive(State(args): State<Arc<Args>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if let Err(e) = verify(&args.secret, header, &body, args.tolerance) {
        eprintln!("REFUSED (400): {e}");
        return StatusCode::BAD_REQUEST;
    }
    let event: Value = serde_json::from_slice(&body).unwrap_or_default();
    let text = |v: &Value| v.as_str().unwrap_or("?").to_owned();
    let object = &event["data"]["object"];
    let fail = uuid::Uuid::new_v4().as_bytes()[0] % 100 < args.fail_percent;
    eprintln!(
        "{} {} {} {} -> {}",
        text(&event["id"]),
        text(&event["type"]),
        text(&object["id"]),
        text(&object["status"]),
        if fail {
            "500 (--fail-percent)"
        } else {
            "200, signature verified"
        }
    );
    if fail {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    }
}
