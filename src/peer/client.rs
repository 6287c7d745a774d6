//! The dialing side: one lazily opened, authenticated connection per peer, shared by every
//! call to that peer.
//!
//! Each peer has a slot whose state moves `Idle -> Connecting -> Up`, or on a failed connect
//! `Connecting -> Backoff -> Idle` (calls meanwhile fail fast with the connect's error). A
//! connection that dies is noticed by the next call, which reconnects at once. Each connection
//! has one task that reads replies, writes queued frames in batches and pings; when it ends,
//! every call still waiting on that connection gets `ConnectionLost`, exactly once: a waiting
//! call's reply sender lives in the pending table, and whoever removes it (the reply, the
//! connection's end, or the call giving up) is the only one who can use it.

use super::frame::{self, read_frame, Frame, FrameError, Kind, PREFIX};
use super::handshake::{self, HandshakeError};
use super::{NodeId, Nonces, PeerConfig, PeerError};
use crate::net::{Connector, Stream};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;
use tokio::io::{AsyncRead, BufReader};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, warn};

/// The client side of the peer transport: call any peer by node id. Cheap to clone; clones
/// share the connections.
pub struct Peers<C: Connector> {
    inner: Arc<Inner<C>>,
}

impl<C: Connector> Clone for Peers<C> {
    fn clone(&self) -> Self {
        Peers {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<C> {
    cfg: PeerConfig,
    connector: C,
    nonces: Nonces,
    /// Ordered, so nothing observable depends on a hasher's seed.
    slots: RwLock<BTreeMap<NodeId, Arc<Slot>>>,
}

/// One peer's connection state.
struct Slot {
    peer: NodeId,
    /// HOST:PORT as configured; resolved again on every dial, so a peer that comes back at a
    /// new address under the same name is found.
    addr: String,
    state: Mutex<State>,
    /// Bumped whenever a connect attempt ends, waking the calls that wait for it.
    changed: watch::Sender<u64>,
}

enum State {
    /// No connection; the next call dials. `failures` sets the backoff if that fails.
    Idle {
        failures: u32,
    },
    /// A dial and handshake are under way.
    Connecting,
    Up(Arc<Conn>),
    /// The last dial failed with this error; calls fail fast with it until the backoff ends.
    Backoff(PeerError),
}

/// A live connection as the callers see it.
struct Conn {
    /// Frames for the connection's writer. Closed once the connection's task has ended.
    tx: mpsc::Sender<Frame>,
    pending: Arc<Pending>,
}

type Reply = Result<Vec<u8>, PeerError>;

/// Calls waiting for replies on one connection. `None` once the connection has ended, so no
/// call can register on a connection that will never answer.
struct Pending {
    table: Mutex<Option<Table>>,
    next_id: AtomicU64,
}

/// The waiting calls by id, each with whether it is bulk ([`PeerConfig::is_bulk`]), and how
/// many are.
#[derive(Default)]
struct Table {
    waiting: BTreeMap<u64, (oneshot::Sender<Reply>, bool)>,
    bulk: usize,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<oneshot::Sender<Reply>> {
        let (waiter, bulk) = self.waiting.remove(&id)?;
        self.bulk -= usize::from(bulk);
        Some(waiter)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pending {
    /// Registers a call: at most `limit` wait at once, and of them at most `bulk_limit`
    /// bulk ones (`bulk_limit` is `Some` for a bulk call).
    fn register(
        self: &Arc<Self>,
        peer: NodeId,
        limit: usize,
        bulk_limit: Option<usize>,
    ) -> Result<(u64, oneshot::Receiver<Reply>, Waiting), PeerError> {
        let mut table = lock(&self.table);
        let Some(table) = table.as_mut() else {
            return Err(PeerError::Unreachable {
                peer,
                reason: "the connection just closed".into(),
            });
        };
        if table.waiting.len() >= limit {
            return Err(PeerError::Overloaded { peer, limit });
        }
        if let Some(limit) = bulk_limit {
            if table.bulk >= limit {
                return Err(PeerError::Overloaded { peer, limit });
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        table.waiting.insert(id, (tx, bulk_limit.is_some()));
        table.bulk += usize::from(bulk_limit.is_some());
        let waiting = Waiting {
            pending: self.clone(),
            id,
        };
        Ok((id, rx, waiting))
    }

    fn complete(&self, id: u64, reply: Reply) {
        let waiter = lock(&self.table).as_mut().and_then(|t| t.remove(id));
        // A reply for a call that gave up (timed out) finds nobody: dropped.
        if let Some(w) = waiter {
            let _ = w.send(reply);
        }
    }

    /// The connection ended: fail every waiting call, in id order.
    fn fail_all(&self, peer: NodeId) {
        let table = lock(&self.table).take().unwrap_or_default();
        for (_, (w, _)) in table.waiting {
            let _ = w.send(Err(PeerError::ConnectionLost { peer }));
        }
    }
}

/// A call's entry in the pending table; removed when the call ends, however it ends.
struct Waiting {
    pending: Arc<Pending>,
    id: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(t) = lock(&self.pending.table).as_mut() {
            t.remove(self.id);
        }
    }
}

impl<C: Connector> Peers<C> {
    /// A client for the peers `(id, peer address)`, dialing through `connector`. An address is
    /// `IP:PORT` or `NAME:PORT`, resolved through the connector before every dial. Nothing is
    /// dialed until the first call. Fails if `cfg` does not [validate](PeerConfig::validate).
    ///
    /// ```
    /// use quorate::net::tcp::TcpConnector;
    /// use quorate::peer::{Nonces, PeerConfig, Peers};
    /// let cfg = PeerConfig::new(1, b"a cluster secret of 32 bytes....".to_vec());
    /// let peers = [(2, "10.0.0.2:7001"), (3, "quorate-3:7001")];
    /// let client = Peers::new(cfg, TcpConnector, peers, Nonces::from_seed([0; 32])).unwrap();
    /// # drop(client);
    /// ```
    pub fn new(
        cfg: PeerConfig,
        connector: C,
        peers: impl IntoIterator<Item = (NodeId, impl ToString)>,
        nonces: Nonces,
    ) -> Result<Self, String> {
        cfg.validate()?;
        let slots = peers
            .into_iter()
            .map(|(id, addr)| (id, Slot::new(id, addr.to_string())))
            .collect();
        Ok(Peers {
            inner: Arc::new(Inner {
                cfg,
                connector,
                nonces,
                slots: RwLock::new(slots),
            }),
        })
    }

    /// Adds a peer or changes its address (its old connection closes once idle).
    pub fn set_peer(&self, id: NodeId, addr: impl ToString) {
        let addr = addr.to_string();
        let mut slots = self.inner.slots.write().unwrap_or_else(|e| e.into_inner());
        if slots.get(&id).is_some_and(|s| s.addr == addr) {
            return;
        }
        slots.insert(id, Slot::new(id, addr));
    }

    /// Forgets a peer; later calls to it fail with [`PeerError::UnknownPeer`].
    pub fn remove_peer(&self, id: NodeId) {
        self.inner
            .slots
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// Sends `body` to node `to` and waits, at most `timeout` in all (connecting included),
    /// for the reply of its handler.
    pub async fn call(
        &self,
        to: NodeId,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, PeerError> {
        let max = self.inner.cfg.max_frame;
        if PREFIX + body.len() > max as usize {
            return Err(PeerError::TooLarge {
                peer: to,
                len: body.len(),
                max,
            });
        }
        let mut sent = false;
        match tokio::time::timeout(timeout, self.call_inner(to, body, &mut sent)).await {
            Ok(r) => r,
            Err(_) if sent => Err(PeerError::Timeout {
                peer: to,
                after: timeout,
            }),
            Err(_) => Err(PeerError::Unreachable {
                peer: to,
                reason: format!("no connection within the call's timeout of {timeout:?}"),
            }),
        }
    }

    async fn call_inner(&self, to: NodeId, body: Vec<u8>, sent: &mut bool) -> Reply {
        let conn = self.connection(to).await?;
        let cfg = &self.inner.cfg;
        let bulk_limit = cfg
            .is_bulk
            .filter(|is_bulk| is_bulk(&body))
            .map(|_| cfg.max_bulk_in_flight);
        let (id, reply, _waiting) = conn.pending.register(to, cfg.max_in_flight, bulk_limit)?;
        if conn
            .tx
            .send(Frame::new(Kind::Request, id, body))
            .await
            .is_err()
        {
            return Err(PeerError::Unreachable {
                peer: to,
                reason: "the connection just closed".into(),
            });
        }
        *sent = true;
        reply
            .await
            .unwrap_or(Err(PeerError::ConnectionLost { peer: to }))
    }

    /// The live connection to `to`, dialing if there is none.
    async fn connection(&self, to: NodeId) -> Result<Arc<Conn>, PeerError> {
        let slot = self
            .inner
            .slots
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&to)
            .cloned()
            .ok_or(PeerError::UnknownPeer(to))?;
        loop {
            let mut changed = {
                let mut state = lock(&slot.state);
                let dial = match &*state {
                    State::Up(c) if !c.tx.is_closed() => return Ok(c.clone()),
                    // It died since the last call: reconnect at once.
                    State::Up(_) => Some(0),
                    State::Backoff(e) => return Err(e.clone()),
                    State::Connecting => None,
                    State::Idle { failures } => Some(*failures),
                };
                if let Some(failures) = dial {
                    *state = State::Connecting;
                    // A task of its own, so a short call's timeout does not abort the dial
                    // that later calls would use.
                    tokio::spawn(dial_task(
                        self.inner.cfg.clone(),
                        self.inner.connector.clone(),
                        self.inner.nonces.clone(),
                        slot.clone(),
                        failures,
                    ));
                }
                // Subscribed under the state lock: the dial's end (which changes the state
                // under the same lock) cannot slip between our look and our wait.
                slot.changed.subscribe()
            };
            let _ = changed.changed().await;
        }
    }
}

impl Slot {
    fn new(peer: NodeId, addr: String) -> Arc<Slot> {
        Arc::new(Slot {
            peer,
            addr,
            state: Mutex::new(State::Idle { failures: 0 }),
            changed: watch::Sender::new(0),
        })
    }

    fn set(&self, state: State) {
        *lock(&self.state) = state;
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Dials and authenticates; on failure holds the peer in backoff, then lets the next call
/// retry.
async fn dial_task<C: Connector>(
    cfg: PeerConfig,
    connector: C,
    nonces: Nonces,
    slot: Arc<Slot>,
    failures: u32,
) {
    let peer = slot.peer;
    match dial(&cfg, &connector, &nonces, &slot).await {
        Ok(stream) => {
            debug!(peer, addr = %slot.addr, "peer connection up");
            slot.set(State::Up(spawn_connection(stream, peer, &cfg)));
        }
        Err(e) => {
            warn!(peer, addr = %slot.addr, error = %e, "peer connect failed");
            slot.set(State::Backoff(e));
            tokio::time::sleep(backoff(&cfg, &nonces, failures)).await;
            let mut state = lock(&slot.state);
            if matches!(*state, State::Backoff(_)) {
                *state = State::Idle {
                    failures: failures.saturating_add(1),
                };
            }
        }
    }
}

async fn dial<C: Connector>(
    cfg: &PeerConfig,
    connector: &C,
    nonces: &Nonces,
    slot: &Slot,
) -> Result<C::Conn, PeerError> {
    let peer = slot.peer;
    // Resolution counts against the connect timeout: a hung name service is an unreachable
    // peer like any other.
    let connect = async {
        let addr = connector.resolve(&slot.addr).await?;
        connector.connect(addr).await
    };
    let addr = &slot.addr;
    let mut stream = match tokio::time::timeout(cfg.connect_timeout, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return Err(PeerError::Unreachable {
                peer,
                reason: format!("connecting to {addr}: {e}"),
            })
        }
        Err(_) => {
            return Err(PeerError::Unreachable {
                peer,
                reason: format!("connecting to {addr} took over {:?}", cfg.connect_timeout),
            })
        }
    };
    let shake = handshake::client(&mut stream, cfg, peer, nonces.nonce());
    match tokio::time::timeout(cfg.handshake_timeout, shake).await {
        Ok(Ok(())) => Ok(stream),
        Ok(Err(e)) => Err(match e {
            HandshakeError::Closed
            | HandshakeError::Version(_)
            | HandshakeError::Sharding { .. } => PeerError::Refused { peer },
            HandshakeError::Io(e) => PeerError::Unreachable {
                peer,
                reason: format!("handshake with {addr}: {e}"),
            },
            e @ (HandshakeError::DataChanged { .. }
            | HandshakeError::DataRefused(_)
            | HandshakeError::NotRecorded(_)) => PeerError::Identity {
                peer,
                reason: format!("{e} (at {addr})"),
            },
            e @ (HandshakeError::BadMac
            | HandshakeError::WrongPeer { .. }
            | HandshakeError::BadMagic
            | HandshakeError::IdRefused(_)) => PeerError::Auth {
                peer,
                reason: format!("{e} at {addr}"),
            },
        }),
        Err(_) => Err(PeerError::Unreachable {
            peer,
            reason: format!(
                "handshake with {addr} took over {:?}",
                cfg.handshake_timeout
            ),
        }),
    }
}

/// The wait after `failures` earlier failed dials: doubling from the minimum to the maximum,
/// with jitter over its upper half so that nodes do not redial in lockstep.
fn backoff(cfg: &PeerConfig, nonces: &Nonces, failures: u32) -> Duration {
    let base = cfg
        .reconnect_backoff_min
        .saturating_mul(1u32 << failures.min(20))
        .min(cfg.reconnect_backoff_max);
    let half = base / 2;
    let jitter_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX).max(1);
    half + Duration::from_nanos(nonces.next_u64() % jitter_ns)
}

/// Starts the connection's task: reads replies, writes frames, pings.
fn spawn_connection<S: Stream>(stream: S, peer: NodeId, cfg: &PeerConfig) -> Arc<Conn> {
    let (rd, wr) = tokio::io::split(stream);
    // Each call queues one frame after taking a pending slot, so this holds every call.
    let (tx, rx) = mpsc::channel(cfg.max_in_flight + 16);
    let pending = Arc::new(Pending {
        table: Mutex::new(Some(Table::default())),
        next_id: AtomicU64::new(1),
    });
    let (max, idle, every) = (cfg.max_frame, cfg.idle_timeout, cfg.ping_interval);
    let weak = tx.downgrade();
    let table = pending.clone();
    tokio::spawn(async move {
        let end = tokio::select! {
            biased;
            r = read_replies(BufReader::new(rd), &table, peer, max, idle) => r,
            r = frame::write_loop(wr, rx, idle) => r.map_err(FrameError::Io),
            () = ping(weak, every) => Ok(()),
        };
        match end {
            Ok(()) => debug!(peer, "peer connection closed: no longer used"),
            Err(e) => warn!(peer, error = %e, "peer connection lost"),
        }
        table.fail_all(peer);
    });
    Arc::new(Conn { tx, pending })
}

async fn read_replies<R: AsyncRead + Unpin>(
    mut rd: R,
    pending: &Pending,
    peer: NodeId,
    max: u32,
    idle: Duration,
) -> Result<(), FrameError> {
    loop {
        let f = read_frame(&mut rd, max, idle).await?;
        let reply = match f.kind {
            Kind::Pong => continue,
            Kind::Response => Ok(f.body),
            Kind::Error => Err(PeerError::Remote {
                peer,
                message: String::from_utf8_lossy(&f.body).into_owned(),
            }),
            Kind::Busy => Err(PeerError::Busy { peer }),
            Kind::Request | Kind::Ping => {
                return Err(FrameError::Malformed("a request sent to the dialing side"))
            }
        };
        pending.complete(f.id, reply);
    }
}

/// Pings until the connection is no longer used (every caller's sender gone).
async fn ping(tx: mpsc::WeakSender<Frame>, every: Duration) {
    let mut n = 0u64;
    loop {
        tokio::time::sleep(every).await;
        let Some(tx) = tx.upgrade() else { return };
        n += 1;
        if tx
            .send(Frame::new(Kind::Ping, n, Vec::new()))
            .await
            .is_err()
        {
            return;
        }
    }
}
