//! The accepting side: authenticate each connection, then run it ([`super::conn`]): the
//! handler answers every request on it, concurrently and bounded, in completion order, and
//! when the node's [`Peers`] are attached ([`PeerServer::with_peers`]) the node's own calls
//! to the dialer go on it too, or the node dials the knocking peer back.

use super::client::Pair;
use super::conn::{self, End, Serving, ServingCell};
use super::frame::FrameError;
use super::handshake::{self, Opened};
use super::{Handler, Nonces, PeerConfig, PeerStats, Peers};
use crate::net::{Connector, Listener, Stream};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, warn};

/// A node's peer server: build it, keep its [`stats`](Self::stats), then [`serve`](Self::serve).
pub struct PeerServer {
    cfg: PeerConfig,
    nonces: Nonces,
    stats: Arc<PeerStats>,
    /// What answers requests, shared with the attached [`Peers`] (or this server's own).
    serving: ServingCell,
    pair: Option<Attached>,
}

/// The node's [`Peers`] while attached to its server; detached when the server is gone:
/// the handler taken back (it may hold what holds the `Peers`) and the connections the
/// `Peers` dialed closed, as the server's own are.
struct Attached(Arc<dyn Pair>);

impl Drop for Attached {
    fn drop(&mut self) {
        self.0.detach();
    }
}

/// What every connection task shares.
struct Shared {
    cfg: PeerConfig,
    nonces: Nonces,
    stats: Arc<PeerStats>,
    serving: ServingCell,
    pair: Option<Attached>,
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
        let stats = Arc::<PeerStats>::default();
        let serving = ServingCell::default();
        serving.store(Some(Arc::new(Serving {
            handler,
            stats: stats.clone(),
        })));
        PeerServer {
            cfg,
            nonces,
            stats,
            serving,
            pair: None,
        }
    }

    /// Makes this server and `peers` (the same node's) one end of each node pair's single
    /// connection: the handler answers requests on the connections `peers` dial, the
    /// connections lower ids dial here carry `peers`' calls to them, and a higher id's knock
    /// is answered by dialing it back. Until the server is dropped or stops serving.
    pub fn with_peers<C: Connector>(mut self, peers: &Peers<C>) -> Self {
        let pair: Arc<dyn Pair> = Arc::new(peers.clone());
        pair.serving().store(self.serving.load_full());
        self.serving = pair.serving().clone();
        self.pair = Some(Attached(pair));
        self
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
            nonces: self.nonces,
            stats: self.stats,
            serving: self.serving,
            pair: self.pair,
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
    let pair = sh.pair.as_ref().map(|p| &p.0);
    let dial_back = |from| pair.is_some_and(|p| p.dials_back(from));
    let shook = tokio::time::timeout(
        cfg.handshake_timeout,
        handshake::server(&mut stream, cfg, nonce, dial_back),
    )
    .await;
    drop(place);
    let (from, id) = match shook {
        Ok(Ok(s)) if s.opened == Opened::Ready => (s.from, s.conn),
        Ok(Ok(s)) => {
            let from = s.from;
            PeerStats::bump(&sh.stats.authenticated);
            PeerStats::bump(&sh.stats.dialed_back);
            debug!(%addr, from, seen = s.seen, "peer knocked");
            drop(stream);
            if let Some(p) = pair {
                p.dial_back(from, s.seen);
            }
            return;
        }
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
    let (c, run) = conn::open(stream, id, from, cfg, sh.serving.clone(), End::Acceptor);
    if let Some(p) = pair {
        p.accepted(from, &c);
    }
    match run.await {
        Ok(()) | Err(FrameError::Closed) => debug!(%addr, from, "peer disconnected"),
        Err(e @ (FrameError::TooLarge { .. } | FrameError::Malformed(_))) => {
            warn!(%addr, from, error = %e, "peer broke the protocol; connection closed");
        }
        Err(e) => debug!(%addr, from, error = %e, "peer connection closed"),
    }
}
