//! Accepting and serving connections.
//!
//! The sandbox runs its own accept loop instead of `axum::serve` because
//! `drop_after_charge` must close a connection without writing a response,
//! which no response a handler can return achieves. Each connection is served
//! by hyper inside a `select!` against a per-connection [`ConnectionControl`]
//! that handlers reach through a request extension; triggering it drops the
//! connection future, and with it the socket.

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tower::ServiceExt;

use crate::config::SandboxConfig;
use crate::journal::LedgerFile;
use crate::routes;
use crate::state::AppState;

/// How long connections get to finish after shutdown before they are cut.
/// Short, because a hanging request (`hang: true`) never finishes.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// A handler's way to close its own connection without answering.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionControl {
    kill: Arc<Notify>,
}

impl ConnectionControl {
    /// Closes the connection as soon as the connection task sees it. The
    /// caller must not produce a response afterwards (it would race the
    /// close), so it should wait forever instead.
    pub(crate) fn close_without_response(&self) {
        // `notify_one` keeps a permit if the connection task is not waiting
        // at this instant, so the signal cannot be lost.
        self.kill.notify_one();
    }
}

/// Serves the sandbox on an already-bound listener until `shutdown` resolves,
/// its ledger in memory.
///
/// On shutdown it stops accepting, lets open connections finish their
/// current request for a short grace period, then closes the rest. Fails
/// only if `config` is invalid ([`io::ErrorKind::InvalidInput`]); accept
/// errors are logged and the loop goes on.
pub async fn serve(
    listener: TcpListener,
    config: SandboxConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with_ledger(listener, config, None, shutdown).await
}

/// [`serve`], with the ledger read from and kept in `ledger` when given
/// (in memory when `None`). The file is released once the server stopped.
pub async fn serve_with_ledger(
    listener: TcpListener,
    config: SandboxConfig,
    ledger: Option<LedgerFile>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    config
        .validate()
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    let state = match ledger {
        Some(file) => AppState::with_ledger(config, file),
        None => AppState::new(config),
    };
    let router = routes::router(state.clone());
    // Announces lapsed holds while webhooks are on; stopped with the server.
    let expiries =
        tokio::spawn(Arc::clone(&state.webhooks).watch_expiries(Arc::clone(&state.ledger)));
    let (stop_tx, stop_rx) = watch::channel(());
    let mut connections = JoinSet::new();
    let mut shutdown = pin!(shutdown);

    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tracing::debug!(%peer, "connection accepted");
                    connections.spawn(serve_connection(stream, router.clone(), stop_rx.clone()));
                }
                Err(error) => {
                    // Per-connection failures (reset before accept) and
                    // resource exhaustion (EMFILE) are both transient here;
                    // back off briefly so the latter does not spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(finished) = connections.join_next(), if !connections.is_empty() => {
                if let Err(error) = finished {
                    tracing::error!(%error, "connection task failed");
                }
            }
        }
    }

    drop(listener);
    // Every connection's receiver sees this as a change: graceful shutdown.
    stop_tx.send_replace(());
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            open = connections.len(),
            "closing connections still open after the grace period"
        );
        connections.shutdown().await;
    }
    expiries.abort();
    // A request still processing (its client gone) can no longer record:
    // the file is released for the next sandbox. Webhook deliveries still
    // pending stop.
    state.close();
    tracing::info!("sandbox stopped");
    Ok(())
}

async fn serve_connection(stream: TcpStream, router: Router, mut stop: watch::Receiver<()>) {
    let control = ConnectionControl::default();
    let for_requests = control.clone();
    let service = router.map_request(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(for_requests.clone());
        request
    });
    let connection = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    let mut connection = pin!(connection);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            () = control.kill.notified() => {
                // Returning drops the connection future and so the socket:
                // the client sees the connection close with no response.
                tracing::info!("closing the connection without a response (drop_after_charge)");
                return;
            }
            // An error means the server is gone: stop just the same.
            _ = stop.changed(), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// A sandbox running in the background on 127.0.0.1 with a random port.
/// Dropping the handle stops it; [`SandboxHandle::stop`] waits until it has.
#[derive(Debug)]
pub struct SandboxHandle {
    addr: SocketAddr,
    // Dropping the sender resolves the server's shutdown future.
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl SandboxHandle {
    /// Binds 127.0.0.1:0 and serves `config` on a background task, its
    /// ledger in memory. Fails if binding fails or `config` is invalid.
    pub async fn start(config: SandboxConfig) -> io::Result<SandboxHandle> {
        Self::start_with_ledger(config, None).await
    }

    /// [`SandboxHandle::start`], with the ledger read from and kept in
    /// `ledger` when given.
    pub async fn start_with_ledger(
        config: SandboxConfig,
        ledger: Option<LedgerFile>,
    ) -> io::Result<SandboxHandle> {
        config
            .validate()
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async {
                // Sent or dropped: either way, stop.
                let _ = stopped.await;
            };
            if let Err(error) = serve_with_ledger(listener, config, ledger, shutdown).await {
                tracing::error!(%error, "sandbox stopped with an error");
            }
        });
        Ok(SandboxHandle { addr, stop, task })
    }

    /// Stops the sandbox and waits until it has: its connections are
    /// closed and its ledger file, if any, released.
    pub async fn stop(self) {
        let Self { stop, task, .. } = self;
        let _ = stop.send(());
        if let Err(error) = task.await {
            tracing::error!(%error, "the sandbox's task failed");
        }
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the sandbox listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}
