//! Calling peers: one authenticated connection per peer, opened when first needed and shared
//! by every call to that peer, and by the peer's calls to this node.
//!
//! A pair's connection is dialed by its lower node id ([module docs](super), "Connections").
//! Each peer has a slot. Toward a higher id its state moves `Idle -> Connecting -> Up`, or on
//! a failed connect `Connecting -> Backoff -> Idle` (calls meanwhile fail fast with the
//! connect's error). Toward a lower id, `Connecting` is a knock: a handshake the peer answers
//! by dialing back (`Awaiting`, until that connection arrives through the peer server and the
//! slot is `Up`). A connection that dies is noticed by the next call, which reconnects (or
//! knocks) at once.

use super::conn::{self, lock, Conn, End, Reply, ServingCell};
use super::frame::{Frame, Kind, PREFIX};
use super::handshake::{self, HandshakeError, Knock, Opened, KNOCK_STALE};
use super::{NodeId, Nonces, PeerConfig, PeerError};
use crate::net::Connector;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;
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
    /// What answers the peers' requests on every connection: set while this node's peer
    /// server stands ([`super::PeerServer::with_peers`]).
    serving: ServingCell,
    /// Numbers knocks, so that only a knock's own timer ends its wait.
    knocks: AtomicU64,
    /// Toward each lower id: what this node's next knock says ([`Knock`]): the id of the
    /// last connection it took from the peer, or [`KNOCK_STALE`] after a knock went
    /// unanswered. By node id, not in the slot: a connection taken while the peer had no
    /// slot here (not yet known, or its slot being replaced) is named too, and kept when
    /// the peer is forgotten (a member removed and learned again). Changed under the
    /// slot's state lock where there is a slot (this lock is taken inside it).
    seen: Mutex<BTreeMap<NodeId, Knock>>,
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
    /// A dial and handshake are under way (toward a lower id: a knock).
    Connecting,
    /// The peer, the pair's lower id, said it dials this node back; calls wait for that
    /// connection. With the knock's number, so that only its own timer ends the wait.
    Awaiting(u64),
    Up(Arc<Conn>),
    /// The last dial failed with this error; calls fail fast with it until the backoff ends.
    Backoff(PeerError),
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
                serving: ServingCell::default(),
                knocks: AtomicU64::new(0),
                seen: Mutex::default(),
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
        let slot = self.slot(to).ok_or(PeerError::UnknownPeer(to))?;
        loop {
            let mut changed = {
                let mut state = lock(&slot.state);
                let dial = match &*state {
                    State::Up(c) if c.is_live() => return Ok(c.clone()),
                    // It died since the last call: reconnect at once.
                    State::Up(..) => Some(0),
                    State::Backoff(e) => return Err(e.clone()),
                    State::Connecting | State::Awaiting(_) => None,
                    State::Idle { failures } => Some(*failures),
                };
                if let Some(failures) = dial {
                    *state = State::Connecting;
                    // Toward a lower id, the knock names what this node last took as it is
                    // now, when it has none live: a connection taken while the knock is on
                    // its way is one the knock must not close.
                    let seen = if to < self.inner.cfg.node_id {
                        self.inner.seen(to)
                    } else {
                        0
                    };
                    // A task of its own, so a short call's timeout does not abort the dial
                    // that later calls would use.
                    let task = dial_task(self.inner.clone(), slot.clone(), failures, seen);
                    tokio::spawn(task);
                }
                // Subscribed under the state lock: the dial's end (which changes the state
                // under the same lock) cannot slip between our look and our wait.
                slot.changed.subscribe()
            };
            let _ = changed.changed().await;
        }
    }
}

/// What the peer server asks of the node's [`Peers`]: where its handler goes, whether it
/// dials a knocking peer back, the dial back, and the connections lower ids dialed.
pub(crate) trait Pair: Send + Sync {
    fn serving(&self) -> &ServingCell;
    /// The server stops: no handler answers any more, and every connection closes.
    fn detach(&self);
    /// Whether this node dials `from` back instead of taking the connection it dialed: it
    /// is the pair's lower id and knows where `from` listens.
    fn dials_back(&self, from: NodeId) -> bool;
    /// `from` knocked, saying `seen` ([`Knock`]): it had no live connection to this node
    /// when it sent the knock. This node's connection to it is stale if `from` took it
    /// (then `from` lost it): closed, and a new one dialed. One `from` has not taken yet
    /// was dialed after the knock was sent (it crossed the knock): kept, `from` takes it.
    fn dial_back(&self, from: NodeId, seen: Knock);
    /// `from` dialed `conn`: this node's calls to it go there, if `from` is the pair's lower
    /// id and a known peer.
    fn accepted(&self, from: NodeId, conn: &Arc<Conn>);
}

impl<C: Connector> Peers<C> {
    fn slot(&self, id: NodeId) -> Option<Arc<Slot>> {
        self.inner
            .slots
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }
}

impl<C> Inner<C> {
    /// What a knock to `peer` says now ([`Knock`]).
    fn seen(&self, peer: NodeId) -> Knock {
        lock(&self.seen).get(&peer).copied().unwrap_or(0)
    }

    fn set_seen(&self, peer: NodeId, seen: Knock) {
        lock(&self.seen).insert(peer, seen);
    }
}

impl<C: Connector> Pair for Peers<C> {
    fn serving(&self) -> &ServingCell {
        &self.inner.serving
    }

    fn detach(&self) {
        self.inner.serving.store(None);
        let slots = self.inner.slots.read().unwrap_or_else(|e| e.into_inner());
        for slot in slots.values() {
            if let State::Up(c) = &*lock(&slot.state) {
                c.close();
            }
        }
    }

    fn dials_back(&self, from: NodeId) -> bool {
        self.inner.cfg.node_id < from && self.slot(from).is_some()
    }

    fn dial_back(&self, from: NodeId, seen: Knock) {
        let Some(slot) = self.slot(from) else { return };
        let kept = {
            let mut state = lock(&slot.state);
            let kept = match &*state {
                State::Connecting => return,
                State::Up(c) if c.is_live() && seen != KNOCK_STALE && c.id != seen => {
                    Some(c.clone())
                }
                State::Up(c) => {
                    c.close();
                    None
                }
                _ => None,
            };
            if kept.is_none() {
                *state = State::Connecting;
            }
            kept
        };
        let Some(kept) = kept else {
            slot.changed.send_modify(|n| *n = n.wrapping_add(1));
            tokio::spawn(dial_task(self.inner.clone(), slot, 0, 0));
            return;
        };
        // Kept: it crossed the knock, or it leads to a process of `from` that is gone
        // without a word (restarted behind a partition, which kept the close from arriving).
        // A ping tells them apart (the restarted host answers it with a reset), and a kept
        // connection that ends within the handshake timeout is replaced at once.
        let _ = kept.tx.try_send(Frame::new(Kind::Ping, 0, Vec::new()));
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let wait = inner.cfg.handshake_timeout;
            if tokio::time::timeout(wait, kept.tx.closed()).await.is_err() {
                return;
            }
            let ours = |s: &State| matches!(s, State::Up(c) if Arc::ptr_eq(c, &kept));
            if slot.replace(ours, State::Connecting) {
                dial_task(inner, slot, 0, 0).await;
            }
        });
    }

    fn accepted(&self, from: NodeId, conn: &Arc<Conn>) {
        if from > self.inner.cfg.node_id {
            return;
        }
        let Some(slot) = self.slot(from) else {
            // Not known here yet: once it is, the next knock names this connection, and
            // the peer replaces it (one reconnect).
            return self.inner.set_seen(from, conn.id);
        };
        let mut old = None;
        slot.replace(
            |s| {
                if let State::Up(c) = s {
                    old = Some(c.clone());
                }
                // Under the state lock, as the store of a knock gone unanswered: the last
                // to change the state says what the next knock names.
                self.inner.set_seen(from, conn.id);
                true
            },
            State::Up(conn.clone()),
        );
        // `from` dials only when it holds no connection: the old one is dead to it.
        if let Some(old) = old.filter(|c| !Arc::ptr_eq(c, conn)) {
            old.close();
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

    /// Sets the state if `now` holds of the current one, waking the calls waiting on it;
    /// whether it did.
    fn replace(&self, now: impl FnOnce(&State) -> bool, state: State) -> bool {
        let mut current = lock(&self.state);
        if !now(&current) {
            return false;
        }
        *current = state;
        drop(current);
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        true
    }

    fn replace_connecting(&self, state: State) -> bool {
        self.replace(|s| matches!(s, State::Connecting), state)
    }
}

/// Dials and authenticates (toward a lower id: knocks, saying `seen`); on failure holds the
/// peer in backoff, then lets the next call retry. Changes the slot only if it is still
/// `Connecting`: a connection the peer dialed meanwhile (through the peer server) stands.
async fn dial_task<C: Connector>(
    inner: Arc<Inner<C>>,
    slot: Arc<Slot>,
    failures: u32,
    seen: Knock,
) {
    let (peer, cfg) = (slot.peer, &inner.cfg);
    match dial(&inner, &slot, seen).await {
        Ok((stream, id, Opened::Ready)) => {
            let (c, run) = conn::open(stream, id, peer, cfg, inner.serving.clone(), End::Dialer);
            tokio::spawn(async move {
                match run.await {
                    Ok(()) => debug!(peer, "peer connection closed"),
                    Err(e) => warn!(peer, error = %e, "peer connection lost"),
                }
            });
            if slot.replace_connecting(State::Up(c.clone())) {
                debug!(peer, addr = %slot.addr, "peer connection up");
            } else {
                c.close();
            }
        }
        Ok((_, _, Opened::DialBack)) => {
            debug!(peer, addr = %slot.addr, "peer dials back");
            let knock = inner.knocks.fetch_add(1, Ordering::Relaxed);
            // Also over an earlier knock's wait (two knocks were on their way): the wait
            // starts again, for this knock's dial back.
            let waiting = |s: &State| matches!(s, State::Connecting | State::Awaiting(_));
            if slot.replace(waiting, State::Awaiting(knock)) {
                // No connection arrived (the peer could not reach this node, or kept one
                // this node never took): the next call knocks again, saying that whatever
                // the peer holds is stale.
                tokio::time::sleep(cfg.connect_timeout + cfg.handshake_timeout).await;
                let idle = State::Idle {
                    failures: failures.saturating_add(1),
                };
                slot.replace(
                    |s| {
                        let ours = matches!(s, State::Awaiting(k) if *k == knock);
                        if ours {
                            inner.set_seen(peer, KNOCK_STALE);
                        }
                        ours
                    },
                    idle,
                );
            }
        }
        Err(e) => {
            warn!(peer, addr = %slot.addr, error = %e, "peer connect failed");
            if slot.replace_connecting(State::Backoff(e)) {
                tokio::time::sleep(backoff(cfg, &inner.nonces, failures)).await;
                let mut state = lock(&slot.state);
                if matches!(*state, State::Backoff(_)) {
                    *state = State::Idle {
                        failures: failures.saturating_add(1),
                    };
                }
            }
        }
    }
}

/// Dials and authenticates: the stream, its connection id, and how the handshake left it.
/// Toward a lower id the handshake is a knock, saying `seen`.
async fn dial<C: Connector>(
    inner: &Inner<C>,
    slot: &Slot,
    seen: Knock,
) -> Result<(C::Conn, u64, Opened), PeerError> {
    let (cfg, connector, peer) = (&inner.cfg, &inner.connector, slot.peer);
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
    let nonce = inner.nonces.nonce();
    let shake = handshake::client(&mut stream, cfg, peer, nonce, seen);
    match tokio::time::timeout(cfg.handshake_timeout, shake).await {
        Ok(Ok(opened)) => Ok((stream, handshake::conn_id(&nonce), opened)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::tcp::TcpConnector;
    use tokio::io::DuplexStream;
    use tokio::task::JoinHandle;

    const SECRET: &[u8] = b"a cluster secret of 32 bytes....";

    /// Node 1 with peer 2, and its connection `id` to node 2 up in the slot: the node, the
    /// slot, the connection, its task and node 2's end.
    #[allow(clippy::type_complexity)]
    fn node_1_up(
        cfg: &PeerConfig,
        id: u64,
    ) -> (
        Peers<TcpConnector>,
        Arc<Slot>,
        Arc<Conn>,
        JoinHandle<Result<(), super::super::frame::FrameError>>,
        DuplexStream,
    ) {
        let peers = Peers::new(
            cfg.clone(),
            TcpConnector,
            [(2, "127.0.0.1:9")],
            Nonces::from_seed([0; 32]),
        )
        .unwrap();
        let slot = peers.slot(2).unwrap();
        let (ours, theirs) = tokio::io::duplex(1024);
        let (c, run) = conn::open(ours, id, 2, cfg, peers.inner.serving.clone(), End::Dialer);
        let task = tokio::spawn(run);
        *lock(&slot.state) = State::Up(c.clone());
        (peers, slot, c, task, theirs)
    }

    #[tokio::test]
    async fn a_knock_keeps_a_connection_the_knocker_has_not_taken_and_ends_one_it_has() {
        let cfg = PeerConfig::new(1, SECRET.to_vec());
        let (peers, slot, c, task, _theirs) = node_1_up(&cfg, 7);
        // Node 2 knocks having taken connection 6 (an older one), or none: connection 7
        // crossed the knock, and node 2 takes it when it arrives.
        for seen in [6, 0] {
            Pair::dial_back(&peers, 2, seen);
            assert!(matches!(&*lock(&slot.state), State::Up(x) if Arc::ptr_eq(x, &c)));
            assert!(c.is_live());
        }
        // Node 2 knocks having taken connection 7: it lost it.
        Pair::dial_back(&peers, 2, 7);
        assert!(!matches!(&*lock(&slot.state), State::Up(..)));
        task.await.unwrap().unwrap();
        assert!(!c.is_live());
        // After a knock that went unanswered, whatever this node holds is stale.
        let (peers, slot, _, task, _theirs) = node_1_up(&cfg, 8);
        Pair::dial_back(&peers, 2, KNOCK_STALE);
        assert!(!matches!(&*lock(&slot.state), State::Up(..)));
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_kept_connection_that_ends_soon_after_the_knock_is_replaced_at_once() {
        // No ping of the dialer's own in the test's time.
        let cfg = PeerConfig {
            ping_interval: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(120),
            ..PeerConfig::new(1, SECRET.to_vec())
        };
        let (peers, slot, c, task, theirs) = node_1_up(&cfg, 7);
        Pair::dial_back(&peers, 2, 6);
        assert!(matches!(&*lock(&slot.state), State::Up(x) if Arc::ptr_eq(x, &c)));
        // The kept connection was pinged (the frame's kind follows its 4-byte length).
        let mut theirs = theirs;
        let mut head = [0u8; 5];
        let read = tokio::io::AsyncReadExt::read_exact(&mut theirs, &mut head);
        tokio::time::timeout(Duration::from_secs(1), read)
            .await
            .expect("no ping came")
            .unwrap();
        assert_eq!(head[4], Kind::Ping as u8);
        // Its far end is gone (a restarted host reset it): node 1 dials node 2 at once,
        // without waiting for a call of its own.
        drop(theirs);
        task.await.unwrap().ok();
        until_state(&slot, |s| !matches!(s, State::Up(..))).await;
    }

    /// Node 1 at a loopback address, answering every knock that it dials back (and never
    /// doing so), and reporting what each knock said.
    async fn node_1_answering_knocks() -> (
        std::net::SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<Knock>,
    ) {
        use crate::net::tcp::TcpListener;
        use crate::net::Listener;
        let mut listener = TcpListener::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let one = PeerConfig::new(1, SECRET.to_vec());
        let (knocks, knocked) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                if let Ok(s) = handshake::server(&mut sock, &one, [1; 32], |_| true).await {
                    let _ = knocks.send(s.seen);
                }
            }
        });
        (addr, knocked)
    }

    /// The next knock node 1 answered (5 s at most).
    async fn next(knocked: &mut tokio::sync::mpsc::UnboundedReceiver<Knock>) -> Knock {
        tokio::time::timeout(Duration::from_secs(5), knocked.recv())
            .await
            .expect("no knock came")
            .unwrap()
    }

    /// Waits (5 s at most) until `slot`'s state is as `want` says.
    async fn until_state(slot: &Slot, want: impl Fn(&State) -> bool) {
        let mut changed = slot.changed.subscribe();
        tokio::time::timeout(Duration::from_secs(5), async {
            while !want(&lock(&slot.state)) {
                changed.changed().await.unwrap();
            }
        })
        .await
        .expect("the slot's state never came");
    }

    #[tokio::test]
    async fn a_knock_whose_dial_back_never_comes_makes_the_next_say_all_is_stale() {
        let (addr, mut knocked) = node_1_answering_knocks().await;
        let cfg = PeerConfig {
            connect_timeout: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(1),
            ..PeerConfig::new(2, SECRET.to_vec())
        };
        let peers = Peers::new(cfg, TcpConnector, [(1, addr)], Nonces::from_seed([0; 32])).unwrap();
        let slot = peers.slot(1).unwrap();
        peers.inner.set_seen(1, 5);
        let e = peers
            .call(1, b"x".to_vec(), Duration::from_millis(50))
            .await;
        assert!(matches!(e, Err(PeerError::Unreachable { .. })), "{e:?}");
        assert_eq!(next(&mut knocked).await, 5);
        until_state(&slot, |s| matches!(s, State::Awaiting(_))).await;
        assert_eq!(peers.inner.seen(1), 5);
        // No dial back within connect_timeout + handshake_timeout.
        until_state(&slot, |s| matches!(s, State::Idle { .. })).await;
        assert_eq!(peers.inner.seen(1), KNOCK_STALE);
    }

    /// Connects only once let through.
    #[derive(Clone)]
    struct Gated(Arc<tokio::sync::Semaphore>);

    impl Connector for Gated {
        type Conn = <TcpConnector as Connector>::Conn;
        async fn connect(&self, addr: std::net::SocketAddr) -> std::io::Result<Self::Conn> {
            let _pass = self.0.acquire().await;
            TcpConnector.connect(addr).await
        }
    }

    #[tokio::test]
    async fn a_knock_names_what_was_taken_when_it_began_not_what_came_on_its_way() {
        let (addr, mut knocked) = node_1_answering_knocks().await;
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let cfg = PeerConfig::new(2, SECRET.to_vec());
        let peers = Peers::new(
            cfg.clone(),
            Gated(gate.clone()),
            [(1, addr)],
            Nonces::from_seed([0; 32]),
        )
        .unwrap();
        let slot = peers.slot(1).unwrap();
        // Node 2 last took connection 5, and it is gone: a call knocks.
        peers.inner.set_seen(1, 5);
        let caller = peers.clone();
        let call =
            tokio::spawn(
                async move { caller.call(1, b"x".to_vec(), Duration::from_secs(2)).await },
            );
        while !matches!(&*lock(&slot.state), State::Connecting) {
            tokio::task::yield_now().await;
        }
        // Node 1's new connection 9 arrives while the knock is on its way (its dial back of
        // an earlier knock, or its own dial): node 2 takes it, and calls go on it.
        let (ours, _theirs) = tokio::io::duplex(1024);
        let (c, _run) = conn::open(ours, 9, 1, &cfg, peers.inner.serving.clone(), End::Acceptor);
        Pair::accepted(&peers, 1, &c);
        gate.add_permits(1);
        // The knock still names connection 5, so node 1 keeps connection 9.
        assert_eq!(next(&mut knocked).await, 5);
        assert!(matches!(&*lock(&slot.state), State::Up(x) if Arc::ptr_eq(x, &c)));
        call.abort();
    }

    #[tokio::test]
    async fn a_connection_taken_from_a_lower_id_is_what_the_next_knock_names() {
        let cfg = PeerConfig::new(2, SECRET.to_vec());
        let peers = Peers::new(
            cfg.clone(),
            TcpConnector,
            [(1, "127.0.0.1:9"), (3, "127.0.0.1:9")],
            Nonces::from_seed([0; 32]),
        )
        .unwrap();
        let serving = || peers.inner.serving.clone();
        let (c, _run) = conn::open(duplex(), 5, 1, &cfg, serving(), End::Acceptor);
        Pair::accepted(&peers, 1, &c);
        assert!(matches!(
            &*lock(&peers.slot(1).unwrap().state),
            State::Up(_)
        ));
        assert_eq!(peers.inner.seen(1), 5);
        // From a lower id this node does not know yet (or no longer): named all the same,
        // so that the knock once it is known has the connection replaced.
        peers.remove_peer(1);
        let (c, _run) = conn::open(duplex(), 6, 1, &cfg, serving(), End::Acceptor);
        Pair::accepted(&peers, 1, &c);
        peers.set_peer(1, "127.0.0.1:9");
        assert_eq!(peers.inner.seen(1), 6);
        // A connection a higher id dialed is not this node's to take.
        let (c, _run) = conn::open(duplex(), 7, 3, &cfg, serving(), End::Acceptor);
        Pair::accepted(&peers, 3, &c);
        assert_eq!(peers.inner.seen(3), 0);
        assert!(!matches!(
            &*lock(&peers.slot(3).unwrap().state),
            State::Up(..)
        ));
    }

    fn duplex() -> DuplexStream {
        tokio::io::duplex(1024).0
    }
}
