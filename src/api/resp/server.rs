//! The RESP accept loop: a connection cap, one task per connection, graceful shutdown.
//!
//! Shutdown follows mini-redis: every connection holds a receiver of a broadcast channel and
//! a clone of an mpsc sender. On shutdown the server stops accepting and drops its broadcast
//! sender, which tells every connection to stop after its current batch; when the last
//! connection task ends, the last mpsc sender is dropped and `serve` returns.

use super::conn::{self, Shutdown};
use crate::net::{Listener, Stream};
use crate::service::Service;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::{broadcast, mpsc, OwnedSemaphorePermit, Semaphore};

/// What a client over the connection cap is told before it is disconnected (Redis's words).
pub const MAX_CLIENTS_REPLY: &[u8] = b"-ERR max number of clients reached\r\n";

/// Serves RESP on `listener` until `shutdown` completes, then waits for the open connections
/// to finish their current batch and returns.
pub async fn serve<L: Listener>(
    mut listener: L,
    service: Service,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let (notify, _) = broadcast::channel::<()>(1);
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let cap = service.config().max_connections.min(Semaphore::MAX_PERMITS);
    let permits = Arc::new(Semaphore::new(cap));
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(api = "resp", %addr, max_connections = cap, "listening");
    }
    tokio::select! {
        () = accept_loop(&mut listener, &service, &permits, &notify, &done_tx) => {}
        () = shutdown => {}
    }
    drop(listener);
    drop(notify);
    drop(done_tx);
    // Returns `None` once every connection task has dropped its sender.
    let _ = done_rx.recv().await;
    tracing::info!(api = "resp", "stopped");
    Ok(())
}

/// Accepts forever; errors (out of file descriptors...) are logged and retried with backoff.
async fn accept_loop<L: Listener>(
    listener: &mut L,
    service: &Service,
    permits: &Arc<Semaphore>,
    notify: &broadcast::Sender<()>,
    done: &mpsc::Sender<()>,
) {
    let mut backoff = Duration::from_millis(10);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                backoff = Duration::from_millis(10);
                accepted
            }
            Err(e) => {
                tracing::warn!(api = "resp", "accept failed: {e}; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refuse(stream, peer, service).await;
            continue;
        };
        let guard = ConnGuard::new(service, permit, done.clone());
        let shutdown = Shutdown::new(notify.subscribe());
        let service = service.clone();
        tokio::spawn(async move {
            conn::handle(stream, peer, service, shutdown).await;
            drop(guard);
        });
    }
}

/// Tells a client over the cap why, then disconnects it. Bounded in time: a fresh
/// connection's send buffer takes the few bytes at once.
async fn refuse<S: Stream>(mut stream: S, peer: SocketAddr, service: &Service) {
    service
        .metrics()
        .connections_refused
        .with_label_values(&["resp"])
        .inc();
    // Debug, as over HTTP: a client opening connections past the cap would otherwise write
    // a line each; the counter has every one.
    tracing::debug!(api = "resp", %peer, "connection refused: max number of clients reached");
    let _ = tokio::time::timeout(Duration::from_millis(100), async {
        stream.write_all(MAX_CLIENTS_REPLY).await?;
        stream.shutdown().await
    })
    .await;
}

/// Held by each connection task: counts it in the gauge, holds its slot under the cap, and
/// tells `serve` when it ends.
struct ConnGuard {
    service: Service,
    _permit: OwnedSemaphorePermit,
    _done: mpsc::Sender<()>,
}

impl ConnGuard {
    fn new(service: &Service, permit: OwnedSemaphorePermit, done: mpsc::Sender<()>) -> Self {
        service
            .metrics()
            .connections
            .with_label_values(&["resp"])
            .inc();
        ConnGuard {
            service: service.clone(),
            _permit: permit,
            _done: done,
        }
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.service
            .metrics()
            .connections
            .with_label_values(&["resp"])
            .dec();
    }
}
