//! The incident, reproduced small, and the connection-holding case.

use std::sync::Arc;
use std::time::Duration;

use payments_sandbox::SandboxConfig;
use payments_tests::{
    AppOptions, Backend, TestApp, backend_tests, charge_body, new_key, spawn_app,
};

/// A correct client: one key per operation, generated before the first
/// attempt; retry on timeouts, connection errors, 409 (after Retry-After)
/// and 503; stop on any final answer. Returns the final status and attempts.
async fn charge_with_retries(
    app: &TestApp,
    client: &reqwest::Client,
    customer: &str,
    body: &str,
) -> (u16, u32) {
    let key = new_key();
    for attempt in 1..=30 {
        match app
            .post_charge_with(client, customer, Some(&key), body)
            .await
        {
            Ok(r) if r.status() == 409 || r.status() == 503 => {
                let wait = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1);
                tokio::time::sleep(Duration::from_secs(wait)).await;
            }
            Ok(r) => return (r.status().as_u16(), attempt),
            // Timed out or dropped: the charge may or may not have happened;
            // only a retry with the same key can tell.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("{customer}: no final answer after 30 attempts");
}

/// Provider 1.8 s, client timeout 1.5 s, a dozen customers retrying:
/// exactly one charge per customer at the provider and in the database.
async fn slow_provider_and_impatient_clients_charge_once(backend: Backend) {
    let options = AppOptions {
        sandbox: SandboxConfig {
            latency_ms: 1800,
            ..SandboxConfig::default()
        },
        ..AppOptions::default()
    };
    let Some(app) = spawn_app(backend, options).await else {
        return;
    };
    let app = Arc::new(app);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let customers: Vec<String> = (0..12).map(|i| format!("cus_{i}")).collect();
    let tasks: Vec<_> = customers
        .iter()
        .map(|customer| {
            let app = app.clone();
            let client = client.clone();
            let customer = customer.clone();
            tokio::spawn(async move {
                charge_with_retries(&app, &client, &customer, &charge_body(4900, "tok_visa")).await
            })
        })
        .collect();
    let mut retried = 0;
    for t in tasks {
        let (status, attempts) = t.await.unwrap();
        assert_eq!(status, 201);
        if attempts > 1 {
            retried += 1;
        }
    }
    assert_eq!(
        retried, 12,
        "every client timed out at least once and retried"
    );
    let charges = app.sandbox_charges().await;
    assert_eq!(charges.len(), 12, "one provider charge per customer");
    assert_eq!(app.db.charges().await, 12);
    for customer in &customers {
        let n = app
            .db
            .count(
                "SELECT COUNT(*) FROM charges WHERE customer_id = ? AND status = 'succeeded'",
                "SELECT COUNT(*) FROM charges WHERE customer_id = $1 AND status = 'succeeded'",
                &[customer],
            )
            .await;
        assert_eq!(n, 1, "{customer} charged exactly once");
    }
}

/// With 2 pooled connections and a 1 s provider, 20 charges are at the
/// provider at once: no connection is held across the call (held
/// transactions would cap the provider's concurrency at 2).
async fn slow_provider_holds_no_connection(backend: Backend) {
    let options = AppOptions {
        pool_size: 2,
        sandbox: SandboxConfig {
            latency_ms: 1000,
            ..SandboxConfig::default()
        },
        ..AppOptions::default()
    };
    let Some(app) = spawn_app(backend, options).await else {
        return;
    };
    let app = Arc::new(app);
    let barrier = Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let app = app.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                app.post_charge(
                    &format!("cus_{i}"),
                    Some(&new_key()),
                    &charge_body(100, "tok_visa"),
                )
                .await
                .status()
                .as_u16()
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 201);
    }
    let stats = app.sandbox_stats().await;
    assert_eq!(
        stats["max_in_flight"], 20,
        "all 20 provider calls were in flight at once: {stats}"
    );
    assert_eq!(app.sandbox_charges().await.len(), 20);
    assert_eq!(app.db.charges_with_status("succeeded").await, 20);
}

backend_tests!(
    slow_provider_and_impatient_clients_charge_once,
    slow_provider_holds_no_connection,
);
