//! The HTTP/1.1 server loop: what `axum::serve` does, plus the timeouts it
//! does not offer. A client that sends half a header, trickles a body, or
//! holds an idle keep-alive connection is cut off, so slow or stalled
//! clients cannot hold the server's connections and tasks forever.
//!
//! - header read: hyper's `header_read_timeout`, from the connection's start
//!   (or the first byte of a later request) to the end of the head;
//! - body read: the whole body must arrive within the limit, enforced where
//!   the body is read (`extract::JsonBody`), answered 408;
//! - idle keep-alive: a connection with no request in flight for the limit
//!   is closed (gracefully: a request that starts meanwhile completes).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use clap::Args;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

/// The server's timeouts.
#[derive(Debug, Clone, Copy, Args)]
pub struct HttpTimeouts {
    /// How long a client may take to send a request's head (line and headers).
    #[arg(long, env = "HTTP_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub http_header_read_timeout: Duration,
    /// How long a client may take to send a request's whole body.
    #[arg(long, env = "HTTP_BODY_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub http_body_read_timeout: Duration,
    /// How long an idle keep-alive connection is kept open.
    #[arg(long, env = "HTTP_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub http_idle_timeout: Duration,
}

impl Default for HttpTimeouts {
    fn default() -> Self {
        Self {
            http_header_read_timeout: Duration::from_secs(10),
            http_body_read_timeout: Duration::from_secs(30),
            http_idle_timeout: Duration::from_secs(60),
        }
    }
}

impl HttpTimeouts {
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        if self.http_header_read_timeout.is_zero()
            || self.http_body_read_timeout.is_zero()
            || self.http_idle_timeout.is_zero()
        {
            return Err(
                "HTTP_HEADER_READ_TIMEOUT, HTTP_BODY_READ_TIMEOUT and HTTP_IDLE_TIMEOUT must be \
                 greater than 0"
                    .into(),
            );
        }
        Ok(())
    }
}

/// What a connection's watchdog needs: requests in flight, and when the
/// last one ended.
#[derive(Debug)]
struct Activity {
    in_flight: AtomicUsize,
    last: std::sync::Mutex<Instant>,
}

impl Activity {
    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let last = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        Some(last.elapsed())
    }

    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
}

/// Counts a request in flight until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves `app` until `shutdown` resolves, then stops accepting and waits
/// for the connections' in-flight requests to finish (graceful shutdown).
pub async fn run(
    listener: TcpListener,
    app: Router,
    timeouts: HttpTimeouts,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop, stopping) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off, go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Reap finished connection tasks as we go.
        while connections.try_join_next().is_some() {}
        connections.spawn(connection(stream, app.clone(), timeouts, stopping.clone()));
    }
    drop(listener);
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

async fn connection(
    stream: tokio::net::TcpStream,
    app: Router,
    timeouts: HttpTimeouts,
    mut stopping: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity {
        in_flight: AtomicUsize::new(0),
        last: std::sync::Mutex::new(Instant::now()),
    });
    let tracked = activity.clone();
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let guard = InFlight::start(&tracked);
            let app = app.clone();
            async move {
                let response =
                    tower::ServiceExt::oneshot(app, request.map(axum::body::Body::new)).await;
                drop(guard);
                response
            }
        });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.http_header_read_timeout)
        .serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let idle = timeouts.http_idle_timeout;
    let check_every = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    let mut closing = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            changed = stopping.changed(), if !closing => {
                if changed.is_err() || *stopping.borrow() {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            () = tokio::time::sleep(check_every), if !closing => {
                if activity.idle_for().is_some_and(|d| d >= idle) {
                    tracing::debug!("closing an idle keep-alive connection");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}
