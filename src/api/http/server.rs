//! The HTTP server: our own accept loop over the `net` seam, so the same code serves over
//! tokio TCP and over the simulator's sockets, with every resource bounded.
//!
//! - Connections: at most `max_connections` at once; one over the cap is closed at once
//!   (not queued) and counted in `quorate_connections_refused_total{api="http"}`.
//! - Time: hyper's header-read timeout (`idle_timeout`) closes idle keep-alive connections
//!   and slow-header clients; [`StallTimeout`] closes clients that stop reading.
//! - Shutdown: when `shutdown` completes the listener is dropped (no new connections), idle
//!   connections close, in-flight requests finish (for at most [`DRAIN_TIMEOUT`]).

use super::routes::router;
use super::stall::StallTimeout;
use crate::net::{Listener, Stream};
use crate::service::Service;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// Longest wait for in-flight requests at shutdown; connections still open after it are
/// cut.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request head (request line and headers) accepted.
const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Most request headers accepted.
const MAX_HEADERS: usize = 64;
/// Pause after a failed accept (e.g. out of file descriptors) before the next.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Serves the HTTP API on `listener` until `shutdown` completes, then drains.
pub async fn serve<L: Listener>(
    mut listener: L,
    service: Service,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let config = service.config().clone();
    let metrics = service.metrics().clone();
    let app = router(service);
    // Clamped as the RESP server's: a larger count would panic in tokio.
    let permits = Arc::new(Semaphore::new(
        config.max_connections.min(Semaphore::MAX_PERMITS),
    ));
    let (stop_tx, stop_rx) = watch::channel(());
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(config.idle_timeout)
        .max_headers(MAX_HEADERS)
        .max_header_size(MAX_HEADER_BYTES)
        .max_buf_size(MAX_HEADER_BYTES.max(config.max_body_bytes).max(8192))
        .auto_date_header(false);
    let mut conns = JoinSet::new();
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(api = "http", %addr, "listening");
    }
    tokio::pin!(shutdown);
    loop {
        while conns.try_join_next().is_some() {}
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (conn, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(api = "http", error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics
                .connections_refused
                .with_label_values(&["http"])
                .inc();
            tracing::debug!(
                api = "http",
                %peer,
                max = config.max_connections,
                "connection refused: at the connection cap (max_connections)"
            );
            drop(conn);
            continue;
        };
        let open = OpenConnection::new(metrics.connections.with_label_values(&["http"]));
        let io = TokioIo::new(StallTimeout::new(conn, config.idle_timeout));
        let served = builder.serve_connection(io, TowerToHyperService::new(app.clone()));
        let stop = stop_rx.clone();
        conns.spawn(async move {
            run(served, stop, peer).await;
            drop((open, permit));
        });
    }
    drop(listener);
    drop(stop_tx);
    while conns.try_join_next().is_some() {}
    tracing::info!(
        api = "http",
        open = conns.len(),
        "shutting down: draining connections"
    );
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            api = "http",
            open = conns.len(),
            "connections still open after the drain timeout; closing them"
        );
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    }
    Ok(())
}

type Served<C> = http1::Connection<TokioIo<StallTimeout<C>>, TowerToHyperService<Router>>;

/// Serves one connection until it closes, or until shutdown: then hyper finishes the
/// request in flight (if any) and closes.
async fn run<C: Stream>(served: Served<C>, mut stop: watch::Receiver<()>, peer: SocketAddr) {
    tokio::pin!(served);
    let result = tokio::select! {
        r = served.as_mut() => r,
        _ = stop.changed() => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(api = "http", %peer, error = %e, "connection closed on an error");
    }
}

/// Counts an open connection in `quorate_connections{api="http"}` for as long as it lives
/// (also when its task is aborted).
struct OpenConnection(prometheus::IntGauge);

impl OpenConnection {
    fn new(gauge: prometheus::IntGauge) -> Self {
        gauge.inc();
        OpenConnection(gauge)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}
