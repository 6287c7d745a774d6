//! The peer transport: request/response frames between cluster nodes.
//!
//! Every inter-node RPC (all Raft groups' messages and forwarded checks) travels as an opaque
//! body in a frame; the Raft layer encodes its own messages with bincode. This module provides
//! framing, multiplexing, authentication, timeouts, reconnects and bounds, and nothing else.
//!
//! # Connections
//! A node pair has one connection, which carries the calls of both nodes: many concurrent
//! calls each way, each request with a correlation id (each side numbers its own calls) and
//! the responses in any order. The pair's lower node id dials it; the higher id, needing a
//! connection it does not have, knocks: it dials and authenticates, the lower id answers
//! [`handshake::Opened::DialBack`] and closes that connection, and the higher id waits for
//! the lower id's. A knock names the last connection the higher id took from the lower one
//! when the knock began (both ends know a connection by the same id,
//! [`handshake::conn_id`]; one taken while the knock is on its way is not named). If the
//! lower id holds none live, or that one, the higher id (which knocks only without a live
//! connection) has lost it: the lower id closes it and dials back (unless it is dialing the
//! higher id already: that dial is the answer). If it holds another, that one was dialed
//! after the higher id last took one and crossed the knock on the way (both nodes lost
//! their connection and both reached for a new one): it is kept, and the higher id takes it
//! when it arrives, so the crossing costs nothing. A kept connection is pinged, and dialed
//! anew if it ends within `handshake_timeout`: it may lead to a process of the higher id
//! that is gone (restarted without its close reaching the lower id; a restarted host resets
//! the connection), and a higher id that just started names no connection. A knock whose
//! dial back never came (after `connect_timeout + handshake_timeout`) is followed by one
//! that says whatever the lower id holds is stale.
//! Who connects first does not matter, and once a pair is connected it holds one
//! connection; two overlap only while one replaces the other.
//! A connection's death fails the calls of both directions in flight on it.
//!
//! This needs each node's [`Peers`] attached to its server ([`PeerServer::with_peers`]), as
//! every cluster member's are: the server answers requests on the connections the `Peers`
//! dialed (`Busy` while no server is attached), and hands them the connections lower ids
//! dial. A peer the acceptor does not know by id, or a server with no `Peers` attached,
//! serves a connection as dialed (answers its calls, sends none back). While a higher id
//! waits for a dial back that does not come (the lower id cannot reach it), its calls wait
//! out their timeouts, and its next call knocks again after `connect_timeout +
//! handshake_timeout`.
//!
//! # Wire format
//! After the handshake, both directions are a sequence of frames
//! `[u32 length BE][u8 kind][u64 id BE][body]`, where `length` counts everything after itself
//! and is at most [`PeerConfig::max_frame`]. A larger length closes the connection before
//! anything is allocated for it. Kinds are listed in [`frame::Kind`].
//!
//! # Handshake (see [`handshake`])
//! Before any frame, the dialer and the acceptor prove to each other that they hold the cluster
//! secret, over fresh nonces from both sides, without sending the secret:
//! 1. client: `magic, version, client_id, client_data, nonce_c`
//! 2. server: `magic, version, server_id, server_data, nonce_s, HMAC(secret, "quorate-server" |
//!    version | nonce_c | nonce_s | client_id | client_data | server_id | server_data)`
//! 3. client (after checking the server's MAC, that `server_id` is the node it meant to
//!    reach, and that `server_data` is the data id it knows that node by, if any):
//!    `HMAC(secret, "quorate-client" | version | nonce_s | nonce_c | client_id | client_data |
//!    server_id | server_data | knock), knock` (`knock`, 8 bytes: see "Connections"; 0 from
//!    a dialer that does not knock)
//! 4. server (after a constant-time check of the client's MAC, and of `client_data` as in 3):
//!    one byte, `1`; or `2` if it knows `client_id` by another data id (then it closes); or
//!    `3` if it dials the client back (the client knocked; then it closes, see above).
//!
//! `*_data` is the sender's data directory's id ([`identity`]): a member back under its id
//! on another data directory has forgotten its votes, and is refused.
//!
//! The server refuses, by closing, a client claiming the server's own id or an id outside the
//! member list, and every failure is counted in [`PeerStats`] and logged. The whole handshake
//! has a deadline. The labels keep a MAC from one role being replayed in the other; the nonces
//! keep an old exchange from being replayed; the ids bind the proof to this pair.
//!
//! What the handshake does not give: confidentiality or per-frame integrity. An attacker on
//! the path who can inject TCP segments into an established connection can forge frames; run
//! the peer network on a private segment (or add TLS) where that matters.
//!
//! # Liveness and bounds
//! A partitioned connection drops segments silently and a read on it waits forever, so:
//! - every call has a timeout ([`Peers::call`]);
//! - the dialer sends a ping every [`PeerConfig::ping_interval`] and the acceptor answers; each
//!   side closes a connection on which nothing arrived for [`PeerConfig::idle_timeout`], or
//!   on which a write made no progress for as long (a peer that stopped reading). A
//!   single timed-out call does not close the connection (other calls on it may be healthy and
//!   one slow handler is no evidence of a dead link); a connection that times out is dropped;
//! - the calls waiting on one connection are capped ([`PeerConfig::max_in_flight`]), as are the
//!   handlers running for one connection ([`PeerConfig::max_concurrent_requests`]), the time a
//!   handler may take ([`PeerConfig::handler_timeout`]) and the accepted connections
//!   ([`PeerConfig::max_connections`]), of which those still in the handshake from any one
//!   address ([`PeerConfig::max_handshakes_per_addr`]: a host without the secret cannot take
//!   every slot with connections it never authenticates, and keep the peers out).
//!
//! When a connection dies, every call waiting on it fails exactly once with
//! [`PeerError::ConnectionLost`]; the next call reconnects (or knocks) at once, and after a failed connect
//! the peer is [`PeerError::Unreachable`] (failing fast) for a backoff that doubles up to
//! [`PeerConfig::reconnect_backoff_max`].
//!
//! # Determinism
//! Sockets come through the [`crate::net`] seam, timers through `tokio::time` and nonces from
//! a seeded [`Nonces`] generator; `select!`s are `biased` and tables are ordered maps, so the
//! simulation replays the same run for the same seed.

pub mod client;
mod conn;
pub mod frame;
pub mod handshake;
pub mod identity;
pub mod server;

pub use client::Peers;
pub use server::{serve, PeerServer};

use futures::future::BoxFuture;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A node's id (the Raft node id).
pub type NodeId = crate::raft::NodeId;

/// What a node runs for each request a peer sends it: `(from, body) -> reply body`, or an error
/// message that the caller receives as [`PeerError::Remote`].
pub type Handler =
    Arc<dyn Fn(NodeId, Vec<u8>) -> BoxFuture<'static, Result<Vec<u8>, String>> + Send + Sync>;

/// The transport's settings. One value serves both the dialing ([`Peers`]) and the accepting
/// ([`serve`]) side of a node.
#[derive(Clone)]
pub struct PeerConfig {
    /// This node's id: sent in the handshake, and refused when a peer claims it.
    pub node_id: NodeId,
    /// The cluster secret every node shares; proves membership in the handshake. At least
    /// [`MIN_SECRET`] bytes.
    pub secret: Arc<[u8]>,
    /// If set, the only node ids allowed to connect to this node.
    pub members: Option<Arc<[NodeId]>>,
    /// Largest frame (after the length prefix) either side accepts or sends: bounds the memory
    /// one frame can take, and must fit the largest snapshot chunk.
    pub max_frame: u32,
    /// Calls that may wait for replies on one connection; more fail with
    /// [`PeerError::Overloaded`] instead of queueing without bound.
    pub max_in_flight: usize,
    /// Requests from one connection whose handlers may run at once; more are answered
    /// [`PeerError::Busy`] at once.
    pub max_concurrent_requests: usize,
    /// Which requests are bulk: many at once by nature (a node's forwarded client checks),
    /// where the others are few and must not wait behind them (Raft's appends and votes,
    /// whose loss costs a shard its leader). By the request's bytes; `None` (the default):
    /// none is, and the two limits below do not apply.
    pub is_bulk: Option<fn(&[u8]) -> bool>,
    /// Of `max_in_flight`, the most calls one connection may have waiting that are bulk;
    /// more fail with [`PeerError::Overloaded`]. The rest stay for the other calls.
    pub max_bulk_in_flight: usize,
    /// Of `max_concurrent_requests`, the most bulk requests from one connection whose
    /// handlers may run at once; more are answered [`PeerError::Busy`]. The rest stay for
    /// the other requests, which a flood of bulk ones then cannot crowd out.
    pub max_bulk_requests: usize,
    /// Accepted connections (including ones still in the handshake); more are closed at once.
    pub max_connections: usize,
    /// Connections from one IP address still in the handshake; more from it are closed at
    /// once. An address that opens connections and never authenticates (it has no secret)
    /// holds at most this many of the `max_connections` slots, each for at most
    /// `handshake_timeout`.
    pub max_handshakes_per_addr: usize,
    /// The cluster places keys by hash slot: sent in the handshake, and a peer that places
    /// them otherwise is refused (see [`handshake::SLOTS_BIT`]).
    pub slot_sharding: bool,
    /// This node's data id, sent in the handshake, and the data ids its peers presented
    /// first: a peer back with another data directory is refused ([`identity`]). `None`
    /// (the default) sends none and checks none.
    pub identities: Option<Arc<identity::Identities>>,
    /// Deadline for connecting (dialer side only).
    pub connect_timeout: Duration,
    /// Deadline for the whole handshake: an unauthenticated peer cannot hold a slot longer.
    pub handshake_timeout: Duration,
    /// Time a handler may run before its caller is told it timed out.
    pub handler_timeout: Duration,
    /// How often the dialer pings: keeps an idle healthy connection from looking dead.
    pub ping_interval: Duration,
    /// A connection on which nothing arrived for this long is closed (a silent partition).
    /// Must be well above `ping_interval`.
    pub idle_timeout: Duration,
    /// First wait after a failed connect before the next attempt.
    pub reconnect_backoff_min: Duration,
    /// Longest wait between connect attempts.
    pub reconnect_backoff_max: Duration,
}

/// The shortest cluster secret accepted: 16 bytes (128 bits).
pub const MIN_SECRET: usize = 16;

impl PeerConfig {
    /// Settings with the defaults below for `node_id` and `secret`.
    ///
    /// ```
    /// use quorate::peer::PeerConfig;
    /// let cfg = PeerConfig::new(1, b"a cluster secret of 32 bytes....".to_vec());
    /// assert!(cfg.validate().is_ok());
    /// assert_eq!(cfg.max_frame, 32 << 20);
    /// ```
    pub fn new(node_id: NodeId, secret: Vec<u8>) -> Self {
        PeerConfig {
            node_id,
            secret: secret.into(),
            members: None,
            max_frame: 32 << 20,
            max_in_flight: 4096,
            max_concurrent_requests: 1024,
            is_bulk: None,
            max_bulk_in_flight: 3072,
            max_bulk_requests: 768,
            max_connections: 256,
            max_handshakes_per_addr: 8,
            slot_sharding: false,
            identities: None,
            connect_timeout: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(2),
            handler_timeout: Duration::from_secs(5),
            ping_interval: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(3),
            reconnect_backoff_min: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(2),
        }
    }

    /// Checks the settings, naming what to fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.secret.len() < MIN_SECRET {
            return Err(format!(
                "the peer secret is {} bytes; use at least {MIN_SECRET} random bytes",
                self.secret.len()
            ));
        }
        if (self.max_frame as usize) < frame::PREFIX {
            return Err(format!(
                "max_frame {} is below the {}-byte frame prefix",
                self.max_frame,
                frame::PREFIX
            ));
        }
        if self.max_in_flight == 0
            || self.max_concurrent_requests == 0
            || self.max_connections == 0
            || self.max_handshakes_per_addr == 0
        {
            return Err(
                "max_in_flight, max_concurrent_requests, max_connections and \
                 max_handshakes_per_addr must be at least 1"
                    .into(),
            );
        }
        if self.is_bulk.is_some()
            && (self.max_bulk_in_flight == 0
                || self.max_bulk_requests == 0
                || self.max_bulk_in_flight >= self.max_in_flight
                || self.max_bulk_requests >= self.max_concurrent_requests)
        {
            return Err(format!(
                "max_bulk_in_flight ({}) and max_bulk_requests ({}) must be at least 1 and below \
                 max_in_flight ({}) and max_concurrent_requests ({}): the rest is kept for \
                 requests that are not bulk",
                self.max_bulk_in_flight,
                self.max_bulk_requests,
                self.max_in_flight,
                self.max_concurrent_requests
            ));
        }
        if self.idle_timeout <= self.ping_interval {
            return Err(format!(
                "idle_timeout ({:?}) must exceed ping_interval ({:?}), or healthy idle \
                 connections get closed",
                self.idle_timeout, self.ping_interval
            ));
        }
        if self.reconnect_backoff_min.is_zero()
            || self.reconnect_backoff_max < self.reconnect_backoff_min
        {
            return Err("reconnect backoff: need 0 < min <= max".into());
        }
        Ok(())
    }

    /// Whether `id` may connect to this node.
    fn accepts(&self, id: NodeId) -> bool {
        id != self.node_id && self.members.as_ref().is_none_or(|m| m.contains(&id))
    }
}

impl fmt::Debug for PeerConfig {
    /// Everything but the secret, which must never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerConfig")
            .field("node_id", &self.node_id)
            .field("secret", &format_args!("<{} bytes>", self.secret.len()))
            .field("members", &self.members)
            .field("max_frame", &self.max_frame)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .field("max_bulk_in_flight", &self.max_bulk_in_flight)
            .field("max_bulk_requests", &self.max_bulk_requests)
            .field("max_connections", &self.max_connections)
            .field("max_handshakes_per_addr", &self.max_handshakes_per_addr)
            .field("slot_sharding", &self.slot_sharding)
            .field("identities", &self.identities)
            .field("connect_timeout", &self.connect_timeout)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("handler_timeout", &self.handler_timeout)
            .field("ping_interval", &self.ping_interval)
            .field("idle_timeout", &self.idle_timeout)
            .field("reconnect_backoff_min", &self.reconnect_backoff_min)
            .field("reconnect_backoff_max", &self.reconnect_backoff_max)
            .finish()
    }
}

/// Why a call failed. Whether the request may have been handled is part of the answer:
/// [`UnknownPeer`](Self::UnknownPeer), [`Unreachable`](Self::Unreachable), [`Auth`](Self::Auth),
/// [`Refused`](Self::Refused), [`Identity`](Self::Identity), [`Overloaded`](Self::Overloaded),
/// [`Busy`](Self::Busy) and [`TooLarge`](Self::TooLarge) mean it was not; [`Timeout`](Self::Timeout) and
/// [`ConnectionLost`](Self::ConnectionLost) mean it may have been; [`Remote`](Self::Remote)
/// means the handler ran and failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    #[error("node {0} is not a known peer: check the cluster's member list and peer addresses")]
    UnknownPeer(NodeId),
    #[error(
        "node {peer} is unreachable ({reason}): check that it runs and listens on its peer \
         address; retrying after a backoff"
    )]
    Unreachable { peer: NodeId, reason: String },
    #[error(
        "the connection to node {peer} died with the call in flight: it may or may not have been \
         handled"
    )]
    ConnectionLost { peer: NodeId },
    #[error(
        "node {peer} did not answer within {after:?}: the request may or may not have been \
         handled; check the node's load and the network between the nodes"
    )]
    Timeout { peer: NodeId, after: Duration },
    #[error(
        "{limit} calls to node {peer} are already waiting for replies (max_in_flight, or \
         max_bulk_in_flight of the bulk ones): send less"
    )]
    Overloaded { peer: NodeId, limit: usize },
    #[error(
        "node {peer} refused the request: too many of this node's requests already run there \
         (its max_concurrent_requests, or max_bulk_requests of the bulk ones), or its peer \
         server is starting or stopping"
    )]
    Busy { peer: NodeId },
    #[error("node {peer} failed the request: {message}")]
    Remote { peer: NodeId, message: String },
    #[error(
        "could not authenticate node {peer} ({reason}): check that both nodes use the same \
         cluster secret and that the peer address points at that node"
    )]
    Auth { peer: NodeId, reason: String },
    #[error(
        "node {peer} closed the handshake: check that it uses the same cluster secret, \
         protocol version and --sharding, and that this node's id is in its member list (its \
         log says which)"
    )]
    Refused { peer: NodeId },
    /// The peer's data directory is not the one it had, or it says so of this node's
    /// ([`identity`]): the reason names the fix.
    #[error("node {peer}: {reason}")]
    Identity { peer: NodeId, reason: String },
    #[error("a body of {len} bytes for node {peer} exceeds max_frame ({max} bytes)")]
    TooLarge { peer: NodeId, len: usize, max: u32 },
}

/// Counters for what the transport refused or handled; read them in tests and metrics.
#[derive(Debug, Default)]
pub struct PeerStats {
    /// Accepted connections that failed the handshake (wrong secret, unknown or own id,
    /// garbage, timeout).
    pub handshake_failures: AtomicU64,
    /// Connections that completed the handshake on the accepting side (knocks included).
    pub authenticated: AtomicU64,
    /// Of those, knocks: a higher id with no connection to this node, dialed back (unless a
    /// connection this node dialed crossed the knock).
    pub dialed_back: AtomicU64,
    /// Connections closed for a protocol violation after the handshake (oversized or
    /// malformed frame, unexpected kind).
    pub protocol_errors: AtomicU64,
    /// Connections closed at once because `max_connections` were open.
    pub connections_rejected: AtomicU64,
    /// Connections closed at once because `max_handshakes_per_addr` connections from the
    /// same address were still in the handshake.
    pub handshakes_refused: AtomicU64,
    /// Requests answered [`PeerError::Busy`] for want of room while this server was
    /// attached. (One that arrives on a dialed connection while no server is attached is
    /// answered `Busy` too, but not counted: these counters are the server's.)
    pub busy: AtomicU64,
    /// Requests whose handler ran.
    pub handled: AtomicU64,
}

impl PeerStats {
    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The source of handshake nonces and reconnect jitter: seeded, so the simulation replays;
/// a node seeds it from [`crate::net::os_seed`]. Clones share one stream.
#[derive(Clone)]
pub struct Nonces(Arc<Mutex<ChaCha20Rng>>);

impl Nonces {
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Nonces(Arc::new(Mutex::new(ChaCha20Rng::from_seed(seed))))
    }
    /// The next 32 random bytes.
    pub fn nonce(&self) -> [u8; 32] {
        let mut n = [0u8; 32];
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fill_bytes(&mut n);
        n
    }
    fn next_u64(&self) -> u64 {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).next_u64()
    }
}
