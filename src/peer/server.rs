//! The accepting side: authenticate each connection, then run the handler for every request
//! on it, concurrently and bounded, answering on the same connection in completion order.

use super::frame::{self, read_frame, Frame, FrameError, Kind};
use super::{handshake, Handler, NodeId, Nonces, PeerConfig, PeerStats};
use crate::net::{Listener, Stream};
use futures::FutureExt;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::BufReader;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, warn};

/// Longest error message sent back to a caller; a handler's message is cut there.
const MAX_ERROR: usize = 4096;

/// A node's peer server: build it, keep its [`stats`](Self::stats), then [`serve`](Self::serve).
pub struct PeerServer {
    cfg: PeerConfig,
    handler: Handler,
    nonces: Nonces,
    stats: Arc<PeerStats>,
}

/// What every connection task shares.
struct Shared {
    cfg: PeerConfig,
    handler: Handler,
    nonces: Nonces,
    stats: Arc<PeerStats>,
    /// Connections still in the handshake, per source address (no entry: none).
    handshaking: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection's place among its address's handshakes; given up when dropped.
struct Handshaking {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl Handshaking {
    /// A place for a handshake from `ip`, unless `max_handshakes_per_addr` are under way.
    fn enter(shared: &Arc<Shared>, ip: IpAddr) -> Option<Handshaking> {
        let mut counts = shared
            .handshaking
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = counts.entry(ip).or_insert(0);
        if *n >= shared.cfg.max_handshakes_per_addr {
            return None;
        }
        *n += 1;
        Some(Handshaking {
            shared: Arc::clone(shared),
            ip,
        })
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        let mut counts = self
            .shared
            .handshaking
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

impl PeerServer {
    /// A server answering peers with `handler`.
    ///
    /// ```
    /// use futures::FutureExt;
    /// use quorate::peer::{Handler, Nonces, PeerConfig, PeerServer};
    /// use std::sync::Arc;
    /// let echo: Handler = Arc::new(|_from, body| async move { Ok(body) }.boxed());
    /// let cfg = PeerConfig::new(2, b"a cluster secret of 32 bytes....".to_vec());
    /// let server = PeerServer::new(cfg, echo, Nonces::from_seed([0; 32]));
    /// assert_eq!(quorate::peer::PeerStats::get(&server.stats().handled), 0);
    /// ```
    pub fn new(cfg: PeerConfig, handler: Handler, nonces: Nonces) -> Self {
        PeerServer {
            cfg,
            handler,
            nonces,
            stats: Arc::default(),
        }
    }

    /// The server's counters (handshake failures, requests handled, ...).
    pub fn stats(&self) -> Arc<PeerStats> {
        self.stats.clone()
    }

    /// Accepts peer connections until `shutdown` completes, then closes every connection at
    /// once (calls in flight on them fail with `ConnectionLost` on the caller's side).
    pub async fn serve<L: Listener>(
        self,
        mut listener: L,
        shutdown: impl Future<Output = ()> + Send,
    ) -> io::Result<()> {
        self.cfg
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let slots = Arc::new(Semaphore::new(self.cfg.max_connections));
        let shared = Arc::new(Shared {
            cfg: self.cfg,
            handler: self.handler,
            nonces: self.nonces,
            stats: self.stats,
            handshaking: Mutex::default(),
        });
        let mut conns = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = listener.accept() => {
                    let (stream, addr) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of descriptors and the like: wait instead of spinning.
                            warn!(error = %e, "peer accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    // First: an address flooding the handshake takes no slot, and is not logged
                    // one by one (a flood would flood the log), only counted.
                    let Some(place) = Handshaking::enter(&shared, addr.ip()) else {
                        PeerStats::bump(&shared.stats.handshakes_refused);
                        debug!(%addr, "peer connection refused: max_handshakes_per_addr from its address");
                        continue;
                    };
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        PeerStats::bump(&shared.stats.connections_rejected);
                        warn!(%addr, "peer connection refused: max_connections are open");
                        continue;
                    };
                    conns.spawn(connection(stream, addr, shared.clone(), slot, place));
                }
            }
        }
        conns.shutdown().await;
        Ok(())
    }
}

/// Serves peer requests on `listener` with `handler` until `shutdown` completes: the same as
/// `PeerServer::new(cfg, handler, nonces).serve(listener, shutdown)`, for callers that need no
/// counters.
pub async fn serve<L: Listener>(
    listener: L,
    cfg: PeerConfig,
    handler: Handler,
    nonces: Nonces,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    PeerServer::new(cfg, handler, nonces)
        .serve(listener, shutdown)
        .await
}

async fn connection<S: Stream>(
    mut stream: S,
    addr: SocketAddr,
    sh: Arc<Shared>,
    _slot: OwnedSemaphorePermit,
    place: Handshaking,
) {
    let cfg = &sh.cfg;
    let nonce = sh.nonces.nonce();
    let shook = tokio::time::timeout(
        cfg.handshake_timeout,
        handshake::server(&mut stream, cfg, nonce),
    )
    .await;
    drop(place);
    let from = match shook {
        Ok(Ok(from)) => from,
        Ok(Err(e)) => {
            PeerStats::bump(&sh.stats.handshake_failures);
            warn!(%addr, error = %e, "peer handshake failed; connection closed");
            return;
        }
        Err(_) => {
            PeerStats::bump(&sh.stats.handshake_failures);
            let timeout = cfg.handshake_timeout;
            warn!(%addr, ?timeout, "peer handshake timed out; connection closed");
            return;
        }
    };
    PeerStats::bump(&sh.stats.authenticated);
    debug!(%addr, from, "peer connected");
    let (rd, wr) = tokio::io::split(stream);
    let (tx, rx) = mpsc::channel(cfg.max_concurrent_requests + 64);
    // Dropped when this function returns: tells the connection's handlers to stop.
    let (_closed_tx, closed) = watch::channel(());
    let end = tokio::select! {
        biased;
        r = frame::write_loop(wr, rx, cfg.idle_timeout) => r.map_err(FrameError::Io),
        r = read_requests(BufReader::new(rd), from, &sh, tx, closed) => r,
    };
    match end {
        Ok(()) | Err(FrameError::Closed) => debug!(%addr, from, "peer disconnected"),
        Err(e @ (FrameError::TooLarge { .. } | FrameError::Malformed(_))) => {
            PeerStats::bump(&sh.stats.protocol_errors);
            warn!(%addr, from, error = %e, "peer broke the protocol; connection closed");
        }
        Err(e) => debug!(%addr, from, error = %e, "peer connection closed"),
    }
}

async fn read_requests<R: tokio::io::AsyncRead + Unpin>(
    mut rd: R,
    from: NodeId,
    sh: &Arc<Shared>,
    tx: mpsc::Sender<Frame>,
    closed: watch::Receiver<()>,
) -> Result<(), FrameError> {
    let cfg = &sh.cfg;
    let running = Arc::new(Semaphore::new(cfg.max_concurrent_requests));
    // Bulk requests hold a permit of both: at most `max_bulk_requests` of them run, and the
    // rest of `running` stays for the others.
    let bulk = cfg
        .is_bulk
        .map(|_| Arc::new(Semaphore::new(cfg.max_bulk_requests)));
    loop {
        let f = read_frame(&mut rd, cfg.max_frame, cfg.idle_timeout).await?;
        let reply = match f.kind {
            Kind::Ping => Frame::new(Kind::Pong, f.id, Vec::new()),
            Kind::Request => match permits(&f.body, cfg, &running, &bulk) {
                Some(permit) => {
                    PeerStats::bump(&sh.stats.handled);
                    tokio::spawn(handle(
                        f,
                        from,
                        sh.clone(),
                        tx.clone(),
                        closed.clone(),
                        permit,
                    ));
                    continue;
                }
                None => {
                    PeerStats::bump(&sh.stats.busy);
                    Frame::new(Kind::Busy, f.id, Vec::new())
                }
            },
            _ => return Err(FrameError::Malformed("a reply sent to the accepting side")),
        };
        if tx.send(reply).await.is_err() {
            return Ok(());
        }
    }
}

/// The permits a request runs under: one of `running`, and for a bulk request one of
/// `bulk` too (see [`PeerConfig::is_bulk`]). `None`: the connection has no room for it.
fn permits(
    body: &[u8],
    cfg: &PeerConfig,
    running: &Arc<Semaphore>,
    bulk: &Option<Arc<Semaphore>>,
) -> Option<Permits> {
    let of_bulk = match (cfg.is_bulk, bulk) {
        (Some(is_bulk), Some(bulk)) if is_bulk(body) => {
            Some(bulk.clone().try_acquire_owned().ok()?)
        }
        _ => None,
    };
    Some((running.clone().try_acquire_owned().ok()?, of_bulk))
}

type Permits = (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>);

/// Runs the handler for one request, bounded in time, and queues its answer.
async fn handle(
    req: Frame,
    from: NodeId,
    sh: Arc<Shared>,
    tx: mpsc::Sender<Frame>,
    mut closed: watch::Receiver<()>,
    _permits: Permits,
) {
    let (limit, max) = (sh.cfg.handler_timeout, sh.cfg.max_frame);
    let handler = sh.handler.clone();
    // Calling the handler inside the future puts a panic in its synchronous part under
    // catch_unwind too.
    let run = AssertUnwindSafe(async move { handler(from, req.body).await }).catch_unwind();
    let outcome = tokio::select! {
        biased;
        // The connection is gone: nobody can receive the answer.
        _ = closed.changed() => return,
        r = tokio::time::timeout(limit, run) => r,
    };
    let reply = match outcome {
        Ok(Ok(Ok(body))) if frame::PREFIX + body.len() <= max as usize => {
            Frame::new(Kind::Response, req.id, body)
        }
        Ok(Ok(Ok(body))) => error(
            req.id,
            max,
            format!(
                "the reply of {} bytes exceeds max_frame ({max})",
                body.len()
            ),
        ),
        Ok(Ok(Err(msg))) => error(req.id, max, msg),
        Ok(Err(_panic)) => {
            warn!(from, "peer request handler panicked");
            error(req.id, max, "the handler panicked".into())
        }
        Err(_) => error(
            req.id,
            max,
            format!("the handler did not finish within {limit:?}"),
        ),
    };
    let _ = tx.send(reply).await;
}

fn error(id: u64, max_frame: u32, mut msg: String) -> Frame {
    let room = MAX_ERROR.min((max_frame as usize).saturating_sub(frame::PREFIX));
    if msg.len() > room {
        let mut cut = room;
        while !msg.is_char_boundary(cut) {
            cut -= 1;
        }
        msg.truncate(cut);
    }
    Frame::new(Kind::Error, id, msg.into_bytes())
}
