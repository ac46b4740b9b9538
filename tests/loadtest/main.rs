//! `payments-smoke` and `payments-load` (the `payments-loadtest` crate)
//! against the real API, sandbox and databases, and against stand-ins that
//! charge every request: as library calls, and as the real binaries (built
//! first: `cargo build -p payments-loadtest --bins`; `make test` builds
//! every binary).
#![allow(clippy::unwrap_used)]

mod load;
mod smoke;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::routing::post;
use payments_tests::{AppOptions, Backend, TestApp, binary, spawn_app};

/// The real API and sandbox on a fresh SQLite database.
async fn sqlite_app(options: AppOptions) -> TestApp {
    spawn_app(Backend::Sqlite, options)
        .await
        .expect("SQLite is always available")
}

/// Runs the real binary `name` with an empty environment: (exit code,
/// stdout, stderr).
async fn run_tool(name: &str, args: &[&str]) -> (i32, String, String) {
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(binary(name))
            .args(args)
            .env_clear()
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{name} did not finish in time"))
    .unwrap_or_else(|e| panic!("cannot run {name}: {e}"));
    (
        output.status.code().expect("exited"),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A server that charges every request: each `POST /api/charges` takes
/// `work` (so that concurrent requests overlap), then makes a new charge of
/// the request's fields and answers 201, whatever its key. Never 409, 422 or
/// a replay. Its URL, and the charges it made so far.
async fn non_idempotent_server(work: Duration) -> (String, Arc<AtomicU64>) {
    let charges = Arc::new(AtomicU64::new(0));
    let counter = charges.clone();
    let app = Router::new().route(
        "/api/charges",
        post(move |body: Bytes| {
            let counter = counter.clone();
            async move {
                tokio::time::sleep(work).await;
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let charge = serde_json::json!({
                    "id": format!("ch_standin_{n}"),
                    "customer_id": "cus_standin",
                    "amount_cents": request["amount_cents"],
                    "currency": request["currency"],
                    "status": "succeeded",
                    "description": request["description"],
                    "metadata": request["metadata"],
                    "gateway_charge_id": format!("gw_{n}"),
                    "created_at": "2024-05-01T12:00:00.000Z",
                });
                (
                    StatusCode::CREATED,
                    [(header::CONTENT_TYPE, "application/json")],
                    charge.to_string(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, charges)
}
