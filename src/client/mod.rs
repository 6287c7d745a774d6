//! `quorate::client::Client`: a typed client for a quorate node, or for several nodes of
//! one cluster, over RESP.
//!
//! A small pool of connections (each carries one request at a time; a call takes a free one,
//! or waits for the next one in turn); every call is bounded by a timeout; a connection that
//! fails or times out is dropped and a fresh one is opened by the next call, so one broken
//! connection never poisons later calls. Connections go through the
//! [`Connector`](crate::net::Connector) seam, so the same client runs over TCP and in the
//! simulation.
//!
//! [`Client::check_with_retry`] retries with the policy of [`retry`]: a denial is retried
//! after exactly the wait the node gave (if the policy allows that long); a transport error
//! or `TRYAGAIN` after a jittered backoff. Pass a request id to make transport retries safe:
//! the node answers a repeated id from memory instead of spending twice. (A denial is retried
//! under a derived id, `ID~1`, `ID~2`..., since a repeated id would only repeat the denial.)
//!
//! **Several nodes** ([`Client::with_nodes`]): every node of a cluster answers every key, so
//! the client uses the first of its list that is up (list a sidecar's own node first).
//! - A node that refused a connection, or on which a call failed without an answer (reset,
//!   closed, or the client's own timeout after the call had half of it there; not a call
//!   the caller dropped), is passed over for [`ClientConfig::down_for`], and its pooled
//!   connections are replaced.
//! - A call goes to another node only when nothing of it was sent (but see the next
//!   point): its connect failed, its pooled connection's node was marked down or was seen
//!   to have closed it before the request was written, failback (below), or the node
//!   answered a new connection with
//!   "max number of clients" (it closes those unread; that node is skipped for this call
//!   only, and with no other node up the call fails with [`ClientError::Unavailable`],
//!   which is retryable). A request that
//!   was written and got no answer is sent again only on a fresh connection to the same
//!   node (the idle-close case), else the call returns its error: the check may have been
//!   decided. Retry it with a request id, which the cluster remembers whichever node is
//!   asked ([`Client::check_with_retry`] does).
//! - A check with a request id, and the commands that spend nothing, are sent again within
//!   the call: to the next node up when the node took them and failed without an answer,
//!   and in the idle-close case to the same node for a share of the time left, then to the
//!   next ones (a crashed host may let a connect time out rather than refuse it).
//! - A connection to a later node is replaced once it is [`ClientConfig::failback_after`]
//!   old, if an earlier node accepts a connection within half the call's time left (else it
//!   is kept): the client returns to the first node once it is back.
//! - A member that answers is used, whatever it answers: one cut off from the others
//!   answers with its limits' `on_unavailable` (deny by default; a check with a request id
//!   that would be denied gets `TRYAGAIN` instead), and the client stays.
//! - Except a node removed from the cluster, which answers checks with `-NOTMEMBER`: it is
//!   passed over for [`REMOVED_PASSED_OVER`] (a minute), and the call returns
//!   [`ClientError::NotMember`], which is retryable (the retry goes to another node); a
//!   check with a request id goes on to the next node within the call instead. One without
//!   does not: of a check of several items, shards that had not refused it yet may have
//!   decided their part.
//! - With [`ClientConfig::routes_every`] (the default) each check goes to its shard's
//!   leader instead of the first node up, through a client of its own that prefers that
//!   node and fails over as above: see [`route`].
//!
//! ```
//! use quorate::api::resp::serve;
//! use quorate::client::{Client, Wait};
//! use quorate::clock::SystemClock;
//! use quorate::config::NodeConfig;
//! use quorate::net::{tcp::TcpListener, Listener};
//! use quorate::policy::PolicySet;
//! use quorate::service::Service;
//! use std::sync::Arc;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A node on a free loopback port...
//! let config = NodeConfig::default();
//! let service = Service::start(config, PolicySet::default_policies(), Arc::new(SystemClock::new()))
//!     .await
//!     .unwrap();
//! let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
//! let addr = listener.local_addr().unwrap();
//! tokio::spawn(serve(listener, service, std::future::pending()));
//!
//! // ...and a client.
//! let client = Client::new(addr);
//! // redis-cell's CL.THROTTLE: 30 per 60 s with bursts of 16.
//! let t = client.throttle("user123", 15, 30, 60, 1).await.unwrap();
//! assert!(!t.limited);
//! assert_eq!((t.limit, t.remaining), (16, 15));
//! // Named limits of the policy file, all-or-nothing, with an idempotency id.
//! let a = client.check(&[("login", "alice", 1), ("api", "key-1", 1)], Some("req-1")).await.unwrap();
//! assert!(a.allowed);
//! assert_eq!(a.wait, Wait::Now);
//! assert_eq!(a.items[0].remaining, 4);
//! # }
//! ```

pub mod resp;
pub mod retry;
pub mod route;

use crate::api::resp::frame::Frame;
use crate::clock::runtime_now;
use crate::net::tcp::TcpConnector;
use crate::net::Connector;
use resp::{CallError, Conn};
use retry::RetryPolicy;
use route::{RouteKey, Router};
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;

/// How a [`Client`] connects and how long it waits. Fields may be added: build it as
/// `ClientConfig { timeout, ..ClientConfig::default() }`.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Connections in the pool: how many calls can be in flight at once (at least 1). With
    /// several nodes and routing ([`ClientConfig::routes_every`]) there is one such pool per
    /// node, each preferring its node, and one more connection per node for `QR.ROUTES`.
    pub connections: usize,
    /// The longest a call may take, waiting for a connection included.
    pub timeout: Duration,
    /// Seed of the retry jitter (fix it for reproducible simulations).
    pub jitter_seed: u64,
    /// With several nodes: how long a node is passed over after it refused a connection or
    /// a call on it got no answer (reset, closed, timed out).
    pub down_for: Duration,
    /// With several nodes: the age at which a connection to a node other than the first one
    /// up is replaced by one to an earlier node (if one accepts; else it is kept).
    pub failback_after: Duration,
    /// With several nodes: send each check to its shard's leader, from a map of where keys
    /// live (`QR.ROUTES`, see [`route`]) that a call fetches again in the background when it
    /// finds it older than this. `None`: every check goes to the first node up, which
    /// forwards what it does not lead.
    pub routes_every: Option<Duration>,
}

impl Default for ClientConfig {
    /// 4 connections, 1 s timeout, a jitter seed that differs between clients; a failed
    /// node passed over for 1 s, failback after 10 s; with several nodes, checks sent to
    /// their shard's leader, the map fetched again once it is a second old.
    fn default() -> Self {
        ClientConfig {
            connections: 4,
            timeout: Duration::from_secs(1),
            jitter_seed: std::collections::hash_map::RandomState::new().hash_one(0u8),
            down_for: Duration::from_secs(1),
            failback_after: Duration::from_secs(10),
            routes_every: Some(Duration::from_secs(1)),
        }
    }
}

/// Why a call failed. A denial is not an error: it is an answer with `allowed: false`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("connection failed: {0}")]
    Io(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The server's reply was malformed or not the expected shape.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server refused the request (`-ERR ...`): bad input, unknown limit...
    #[error("server error: {0}")]
    Server(String),
    /// The node cannot decide now (`-TRYAGAIN`); a retry may succeed.
    #[error("node unavailable: {0}")]
    Unavailable(String),
    /// The node was removed from its cluster (`-NOTMEMBER`): it decides no check any more.
    /// A client of several nodes passes it over for [`REMOVED_PASSED_OVER`], so a retry
    /// goes to another node (a client of that node alone gets this again).
    #[error("not a cluster member: {0}")]
    NotMember(String),
}

impl ClientError {
    /// True when trying again may succeed (the request itself was not at fault).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ClientError::Connect(_)
                | ClientError::Io(_)
                | ClientError::Timeout(_)
                | ClientError::Unavailable(_)
                | ClientError::NotMember(_)
        )
    }
}

/// How long before a request could succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// It was admitted (no wait).
    Now,
    /// Denied; the same request would be admitted after this long if nothing else spent.
    After(Duration),
    /// Denied, and it can never be admitted (a cost above the limit's capacity).
    Never,
}

/// The decision on one item of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemAnswer {
    pub limit: String,
    pub key: String,
    pub allowed: bool,
    /// The most one key can be granted at once.
    pub capacity: u64,
    /// The largest cost that would be admitted now.
    pub remaining: u64,
    /// Millisecond precision, rounded up.
    pub retry_after: Wait,
    /// Time until the key is as if never seen; millisecond precision, rounded up.
    pub reset_after: Duration,
    /// The answer came from the limit's `on_unavailable` rule (the node's key cap reached,
    /// or in a cluster the shard could not decide in time), not from its algorithm.
    pub fallback: bool,
    /// A shadow limit's item: its denial is reported and counted but denies nothing (the
    /// check's `allowed` leaves it out). False from a server before the flag.
    pub shadow: bool,
}

/// The answer to a check (`QR.CHECK`) or a peek.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckAnswer {
    /// True when every item admitted (and so each was spent); false when none was spent.
    pub allowed: bool,
    /// The wait before the whole check could succeed.
    pub wait: Wait,
    pub items: Vec<ItemAnswer>,
}

/// The answer to `CL.THROTTLE`, redis-cell's five fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottleAnswer {
    pub limited: bool,
    /// `max_burst + 1`.
    pub limit: u64,
    pub remaining: u64,
    /// When limited (and the quantity can ever fit): whole seconds, rounded up.
    pub retry_after: Option<Duration>,
    /// Whole seconds, rounded up.
    pub reset_after: Duration,
}

/// A pooled RESP client of one node, or of the first node up of a list. Cheap to clone
/// (clones share the pool).
pub struct Client<C: Connector = TcpConnector> {
    shared: Arc<Shared<C>>,
}

impl<C: Connector> Clone for Client<C> {
    fn clone(&self) -> Self {
        Client {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<C: Connector> {
    nodes: Vec<Node>,
    connector: C,
    config: ClientConfig,
    /// One slot per pooled connection; `None` until first used or after a failure.
    slots: Vec<Mutex<Option<Pooled<C::Conn>>>>,
    next: AtomicUsize,
    jitter: AtomicU64,
    /// What `Node::down_until` counts from.
    epoch: Instant,
    /// With several nodes and [`ClientConfig::routes_every`]: the clients calls go through.
    router: Option<Router<C>>,
}

/// Owned by a routing map's refresh task: ends the refresh when dropped, however the task
/// ends (done, dropped unpolled or cancelled by a runtime shutting down, or panicked), so
/// the next refresh can start.
struct RefreshClaim<C: Connector>(std::sync::Weak<Shared<C>>);

impl<C: Connector> Drop for RefreshClaim<C> {
    fn drop(&mut self) {
        if let Some(router) = self.0.upgrade().as_ref().and_then(|s| s.router.as_ref()) {
            router.release();
        }
    }
}

struct Node {
    addr: SocketAddr,
    /// Passed over until this long after `Shared::epoch` (in ns; 0: never failed).
    down_until: AtomicU64,
}

/// [`On::node`] while a call is on no node.
const NO_NODE: usize = usize::MAX;

/// The node a call is on (connecting to it or waiting for its reply), and since when (ns
/// after `Shared::epoch`): read when the client's timeout ends the call.
struct On {
    node: AtomicUsize,
    since: AtomicU64,
}

impl Default for On {
    fn default() -> Self {
        On {
            node: AtomicUsize::new(NO_NODE),
            since: AtomicU64::new(0),
        }
    }
}

impl On {
    fn set<C: Connector>(&self, shared: &Shared<C>, node: usize) {
        if self.node.swap(node, Ordering::Relaxed) != node {
            self.since.store(shared.now(), Ordering::Relaxed);
        }
    }
}

/// Where a request that a node took and failed to answer may be sent again, within its
/// call, by a client of several nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// Only to the same node, on a fresh connection (the idle-close case): a check without
    /// a request id, `CL.THROTTLE`. The node may have decided it before it failed, and a
    /// second member would spend it again.
    SameNode,
    /// To any member: a check with a request id (the cluster answers a repeated id with its
    /// first answer, whichever member is asked, as for [`Client::check_with_retry`]'s
    /// retries), and the commands that spend nothing (`PING`, `QR.PEEK`, `QR.ROUTES`).
    AnyMember,
}

/// How long a client of several nodes passes over a node that answered `-NOTMEMBER`: its
/// id is out of the cluster for good, but its address may come back as a new member.
pub const REMOVED_PASSED_OVER: Duration = Duration::from_secs(60);

/// A removed node's refusal (`-NOTMEMBER ...`).
fn is_not_member(frame: &Frame) -> bool {
    matches!(frame, Frame::Error(m) if resp::not_member(m).is_some())
}

/// A node at its connection cap says this before it closes a new connection unread.
fn is_full(frame: &Frame) -> bool {
    let full = crate::api::resp::server::MAX_CLIENTS_REPLY
        .strip_prefix(b"-")
        .and_then(|r| r.strip_suffix(b"\r\n"));
    matches!(frame, Frame::Error(m) if Some(m.as_bytes()) == full)
}

/// A pooled connection, with the node it goes to and when it was opened.
struct Pooled<S> {
    conn: Conn<S>,
    node: usize,
    opened: Instant,
}

impl<C: Connector> Shared<C> {
    fn now(&self) -> u64 {
        let elapsed = runtime_now().saturating_duration_since(self.epoch);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }

    fn mark_down(&self, i: usize) {
        self.mark_down_for(i, self.config.down_for);
    }

    fn mark_down_for(&self, i: usize, d: Duration) {
        let until = self
            .now()
            .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.nodes[i]
            .down_until
            .store(until.max(1), Ordering::Relaxed);
    }

    fn is_up(&self, i: usize, now: u64) -> bool {
        self.nodes[i].down_until.load(Ordering::Relaxed) <= now
    }

    /// The nodes to try, in order: those up, in list order, then those down (so that a
    /// call still tries every node when all have failed lately).
    fn order(&self) -> Vec<usize> {
        let now = self.now();
        let (mut up, down): (Vec<usize>, Vec<usize>) =
            (0..self.nodes.len()).partition(|&i| self.is_up(i, now));
        up.extend(down);
        up
    }

    /// [`Shared::order`] without node `i`: where a call goes next after `i`.
    fn order_without(&self, i: usize) -> Vec<usize> {
        self.order().into_iter().filter(|&n| n != i).collect()
    }

    /// True when `p` should be replaced: it goes to a node after the first one up and is
    /// `failback_after` old.
    fn fails_back(&self, p: &Pooled<C::Conn>) -> bool {
        let now = self.now();
        p.node > 0
            && runtime_now().saturating_duration_since(p.opened) >= self.config.failback_after
            && (0..p.node).any(|i| self.is_up(i, now))
    }
}

impl Client<TcpConnector> {
    /// A client of the node at `addr` over TCP, with the default configuration. Connections
    /// are opened when first needed.
    pub fn new(addr: SocketAddr) -> Self {
        Client::with_connector(addr, TcpConnector, ClientConfig::default())
    }

    /// A client of the first node up of `addrs` (nodes of one cluster, the preferred one
    /// first) over TCP, with the default configuration: see the module doc.
    pub fn cluster(addrs: impl IntoIterator<Item = SocketAddr>) -> Self {
        Client::with_nodes(addrs, TcpConnector, ClientConfig::default())
    }
}

impl<C: Connector> Client<C> {
    pub fn with_connector(addr: SocketAddr, connector: C, config: ClientConfig) -> Self {
        Client::with_nodes([addr], connector, config)
    }

    /// A client of the first node up of `addrs`, the preferred one first (see the module
    /// doc). With no address, every call fails with [`ClientError::Connect`].
    pub fn with_nodes(
        addrs: impl IntoIterator<Item = SocketAddr>,
        connector: C,
        config: ClientConfig,
    ) -> Self {
        let addrs: Vec<SocketAddr> = addrs.into_iter().collect();
        let router = match config.routes_every {
            Some(every) if addrs.len() > 1 => Some(Router::new(&addrs, &connector, &config, every)),
            _ => None,
        };
        let nodes = addrs
            .into_iter()
            .map(|addr| Node {
                addr,
                down_until: AtomicU64::new(0),
            })
            .collect();
        let slots = (0..config.connections.max(1))
            .map(|_| Mutex::new(None))
            .collect();
        let jitter = AtomicU64::new(config.jitter_seed);
        Client {
            shared: Arc::new(Shared {
                nodes,
                connector,
                config,
                slots,
                next: AtomicUsize::new(0),
                jitter,
                epoch: runtime_now(),
                router,
            }),
        }
    }

    /// Spends `cost` of each `(limit, key, cost)`, all-or-nothing (`QR.CHECK`). With a
    /// `request_id`, a repeat within the node's idempotency horizon gets the first answer and
    /// spends nothing more.
    pub async fn check(
        &self,
        items: &[(&str, &str, u64)],
        request_id: Option<&str>,
    ) -> Result<CheckAnswer, ClientError> {
        let costs: Vec<String> = items.iter().map(|(_, _, c)| c.to_string()).collect();
        let mut args: Vec<&[u8]> = vec![b"QR.CHECK"];
        if let Some(id) = request_id {
            args.extend([&b"ID"[..], id.as_bytes()]);
        }
        for ((limit, key, _), cost) in items.iter().zip(&costs) {
            args.extend([limit.as_bytes(), key.as_bytes(), cost.as_bytes()]);
        }
        let route = items
            .first()
            .map(|&(limit, key, _)| RouteKey::Named { limit, key });
        let resend = if request_id.is_some() {
            Resend::AnyMember
        } else {
            Resend::SameNode
        };
        resp::check_answer(self.routed(route).call(&args, resend).await?)
    }

    /// What a check of cost 0 would say, spending nothing (`QR.PEEK`).
    pub async fn peek(&self, limit: &str, key: &str) -> Result<CheckAnswer, ClientError> {
        resp::check_answer(
            self.routed(Some(RouteKey::Named { limit, key }))
                .call(
                    &[b"QR.PEEK", limit.as_bytes(), key.as_bytes()],
                    Resend::AnyMember,
                )
                .await?,
        )
    }

    /// redis-cell's `CL.THROTTLE key max_burst count period quantity`: `count` per `period`
    /// seconds, bursts of `max_burst + 1`.
    pub async fn throttle(
        &self,
        key: &str,
        max_burst: u64,
        count: u64,
        period_secs: u64,
        quantity: u64,
    ) -> Result<ThrottleAnswer, ClientError> {
        let nums = [max_burst, count, period_secs, quantity].map(|n| n.to_string());
        let mut args: Vec<&[u8]> = vec![b"CL.THROTTLE", key.as_bytes()];
        args.extend(nums.iter().map(|n| n.as_bytes()));
        let limit = crate::api::resp::command::throttle_limit(max_burst, count, period_secs);
        let route = RouteKey::Inline { limit, key };
        resp::throttle_answer(
            self.routed(Some(route))
                .call(&args, Resend::SameNode)
                .await?,
        )
    }

    /// `PING`: true when the node answered `PONG`.
    pub async fn ping(&self) -> Result<(), ClientError> {
        match self
            .routed(None)
            .call(&[b"PING"], Resend::AnyMember)
            .await?
        {
            Frame::Simple(s) if s == "PONG" => Ok(()),
            Frame::Error(m) => Err(resp::server_error(m)),
            other => Err(ClientError::Protocol(format!(
                "expected PONG, got {other:?}"
            ))),
        }
    }

    /// [`Client::check`], retried under `policy`: a denial after the node's wait (when the
    /// policy would wait that long), a retryable error after a jittered backoff. Returns the
    /// last answer (allowed, or the denial the policy gave up on) or the last error.
    pub async fn check_with_retry(
        &self,
        items: &[(&str, &str, u64)],
        request_id: Option<&str>,
        policy: &RetryPolicy,
    ) -> Result<CheckAnswer, ClientError> {
        let mut waited = Duration::ZERO;
        let mut denials = 0u32;
        let mut attempt = 0u32;
        loop {
            let id = request_id.map(|id| match denials {
                0 => id.to_string(),
                n => format!("{id}~{n}"),
            });
            let outcome = self.check(items, id.as_deref()).await;
            let retry_after = match &outcome {
                Ok(a) => match a.wait {
                    Wait::After(d) if !a.allowed => Some(d),
                    _ => return outcome,
                },
                Err(e) if e.is_retryable() => None,
                Err(_) => return outcome,
            };
            let Some(delay) = policy.delay_within(attempt, waited, retry_after, self.next_random())
            else {
                return outcome;
            };
            if outcome.is_ok() {
                denials = denials.saturating_add(1);
            }
            tokio::time::sleep(delay).await;
            waited = waited.saturating_add(delay);
            attempt = attempt.saturating_add(1);
        }
    }

    /// With routing ([`ClientConfig::routes_every`]): the shard count and, per shard, the
    /// index in this client's list of the node it sends that shard's checks to (`None`: the
    /// first node up), once the map has been fetched. `None` without routing or before.
    pub fn routes(&self) -> Option<(u32, Vec<Option<usize>>)> {
        self.shared.router.as_ref()?.known()
    }

    /// The client a call about `key` goes through: with routing, the one that prefers the
    /// node leading the key's shard (starting a refresh of the map when it is due); else
    /// this one.
    fn routed(&self, key: Option<RouteKey<'_>>) -> &Client<C> {
        let Some(router) = &self.shared.router else {
            return self;
        };
        if router.due(self.shared.now()) {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    // While it waits for the probes the task holds only them and a weak
                    // reference: a client dropped meanwhile closes its pools at once.
                    let claim = RefreshClaim(Arc::downgrade(&self.shared));
                    let probes = router.probes();
                    rt.spawn(async move {
                        let answers = route::ask(&probes).await;
                        if let Some(shared) = claim.0.upgrade() {
                            if let Some(r) = &shared.router {
                                r.apply(answers);
                            }
                        }
                        drop(claim);
                    });
                }
                // No runtime to run it on (a call could not run either): the next refresh
                // starts when due.
                Err(_) => router.release(),
            }
        }
        router.member(key)
    }

    /// Sends one request and returns its reply (a server error reply is `Ok(Frame::Error)`;
    /// a node's "max number of clients" is [`ClientError::Unavailable`]), within the
    /// timeout. If the timeout ends the call while it is on a node (connecting or waiting
    /// for the reply) and has been for half the timeout, that node is marked down; a call
    /// the caller drops marks nothing, nor does one that spent its time waiting for a pooled
    /// connection.
    async fn call(&self, args: &[&[u8]], resend: Resend) -> Result<Frame, ClientError> {
        let timeout = self.shared.config.timeout;
        // A timeout too long for the clock is as good as none (about 30 years).
        let budget = timeout.min(Duration::from_secs(1 << 30));
        let deadline = runtime_now() + budget;
        let on = On::default();
        match tokio::time::timeout_at(deadline, self.call_untimed(args, resend, deadline, &on))
            .await
        {
            Ok(Ok(frame)) if is_full(&frame) => Err(ClientError::Unavailable(
                "the node is at its connection cap (max number of clients reached)".into(),
            )),
            Ok(result) => result,
            Err(_) => {
                let i = on.node.load(Ordering::Relaxed);
                let since = on.since.load(Ordering::Relaxed);
                let fair = u64::try_from((budget / 2).as_nanos()).unwrap_or(u64::MAX);
                if i != NO_NODE && self.shared.now().saturating_sub(since) >= fair {
                    self.shared.mark_down(i);
                }
                Err(ClientError::Timeout(timeout))
            }
        }
    }

    async fn call_untimed(
        &self,
        args: &[&[u8]],
        resend: Resend,
        deadline: Instant,
        on: &On,
    ) -> Result<Frame, ClientError> {
        let shared = &*self.shared;
        let mut slot = self.slot().await;
        // The connection is taken out of its slot for the call: if the call fails, or is
        // cancelled by the timeout halfway, it is dropped (closed) rather than left holding
        // a reply that the next call would read.
        let mut pooled = match slot.take() {
            Some(p) if shared.nodes.len() > 1 => self.reuse(p, deadline, on).await?,
            Some(p) => p,
            None => self.connect(shared.order(), deadline, on).await?,
        };
        let mut fresh = !pooled.conn.used;
        // A request that may be sent again to another node: one the cluster answers the same
        // whichever member gets it, however often (see `Resend`).
        let anywhere = shared.nodes.len() > 1 && resend == Resend::AnyMember;
        on.set(shared, pooled.node);
        let mut moved = false;
        let mut result = match pooled.conn.call(args).await {
            Err(CallError::ClosedBeforeReply(first)) if pooled.conn.used => {
                // The node had most likely closed this pooled connection (idle) before our
                // request, so it is sent once more on a fresh connection: to the same node
                // first. A node that read the request and then crashed looks the same, and a
                // retry elsewhere could spend it twice, so a request that is not `anywhere`
                // goes to the same node only (which refuses if it is down). One that is gets
                // a share of the time left there (a crashed host need not refuse: the
                // connect may just time out), then the next nodes up.
                let node = pooled.node;
                let mut nodes = vec![node];
                if anywhere {
                    nodes.extend(shared.order_without(node));
                }
                pooled = self
                    .connect(nodes, deadline, on)
                    .await
                    .map_err(|e| ClientError::Io(format!("{first}; reconnecting failed: {e}")))?;
                moved = pooled.node != node;
                fresh = true;
                pooled.conn.call(args).await
            }
            other => other,
        };
        if anywhere && !moved && matches!(&result, Err(e) if e.unanswered()) {
            // The node took the request and failed without an answer (reset, closed): it is
            // passed over, and the request goes once to the next node up that accepts.
            shared.mark_down(pooled.node);
            fresh |= self
                .resend_elsewhere(args, deadline, on, &mut pooled, &mut result)
                .await;
        }
        if shared.nodes.len() > 1 && fresh && matches!(&result, Ok((f, _)) if is_full(f)) {
            // A node at its connection cap answers a new connection with this and closes it
            // unread: nothing was decided, so the next node up may take the request. (The
            // node is not marked down: the client's other connections to it are fine.)
            self.resend_elsewhere(args, deadline, on, &mut pooled, &mut result)
                .await;
        }
        if shared.nodes.len() > 1 && matches!(&result, Ok((f, _)) if is_not_member(f)) {
            // A node removed from the cluster refuses checks: it is passed over, and a
            // request that may go anywhere goes once to the next node up. One that may not
            // is answered with the error: a check of several items may have been decided
            // in part by shards that had not refused it yet.
            shared.mark_down_for(pooled.node, REMOVED_PASSED_OVER);
            if anywhere {
                self.resend_elsewhere(args, deadline, on, &mut pooled, &mut result)
                    .await;
            }
        }
        match result {
            Ok((frame, keep)) => {
                if keep && !is_full(&frame) {
                    *slot = Some(pooled);
                }
                Ok(frame)
            }
            Err(CallError::ClosedBeforeReply(m)) => {
                shared.mark_down(pooled.node);
                Err(ClientError::Io(m))
            }
            Err(CallError::Other(e)) => {
                // A malformed answer is an answer: the node is up.
                if !matches!(e, ClientError::Protocol(_)) {
                    shared.mark_down(pooled.node);
                }
                Err(e)
            }
        }
    }

    /// Sends `args` once more, on a new connection to the first node up other than
    /// `pooled`'s, which then replaces `pooled` and its `result`; whether one accepted (if
    /// none did, both stay as they were).
    async fn resend_elsewhere(
        &self,
        args: &[&[u8]],
        deadline: Instant,
        on: &On,
        pooled: &mut Pooled<C::Conn>,
        result: &mut Result<(Frame, bool), CallError>,
    ) -> bool {
        let others = self.shared.order_without(pooled.node);
        let Ok(p) = self.connect(others, deadline, on).await else {
            return false;
        };
        *pooled = p;
        *result = pooled.conn.call(args).await;
        true
    }

    /// A pooled connection of a client of several nodes, checked before a request is
    /// written on it: replaced if its node was marked down since, or if the node closed it
    /// (nothing was sent, so the request may go to any node); and if it goes to a later
    /// node than the first one up and is `failback_after` old, replaced by a connection to
    /// an earlier node if one accepts within half the time left (else kept).
    async fn reuse(
        &self,
        p: Pooled<C::Conn>,
        deadline: Instant,
        on: &On,
    ) -> Result<Pooled<C::Conn>, ClientError> {
        let shared = &*self.shared;
        let mut p = p;
        if !shared.is_up(p.node, shared.now()) || p.conn.closed_by_peer() {
            return self.connect(shared.order(), deadline, on).await;
        }
        if shared.fails_back(&p) {
            let now = shared.now();
            let earlier = (0..p.node).filter(|&i| shared.is_up(i, now)).collect();
            let half = runtime_now() + deadline.saturating_duration_since(runtime_now()) / 2;
            if let Ok(q) = self.connect(earlier, half, on).await {
                p = q;
            }
        }
        Ok(p)
    }

    /// A free pooled slot, or the next one in turn when all are busy.
    async fn slot(&self) -> MutexGuard<'_, Option<Pooled<C::Conn>>> {
        let slots = &self.shared.slots;
        let start = self.shared.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..slots.len() {
            if let Ok(guard) = slots[(start + i) % slots.len()].try_lock() {
                return guard;
            }
        }
        slots[start % slots.len()].lock().await
    }

    /// A new connection to the first of `nodes` that accepts one within `deadline`. With
    /// several nodes, each attempt gets an equal share of the time left (the last one all of
    /// it), so that a node that never completes the handshake leaves time for the others.
    /// A node that refuses is marked down, and so is one whose attempt timed out if its
    /// share was fair (at least the timeout over twice the number of nodes).
    async fn connect(
        &self,
        nodes: Vec<usize>,
        deadline: Instant,
        on: &On,
    ) -> Result<Pooled<C::Conn>, ClientError> {
        let shared = &*self.shared;
        let mut failed = Vec::new();
        let n = nodes.len();
        let count = u32::try_from(shared.nodes.len()).unwrap_or(u32::MAX);
        let floor = shared.config.timeout / count.saturating_mul(2).max(1);
        for (k, i) in nodes.into_iter().enumerate() {
            on.set(shared, i);
            let addr = shared.nodes[i].addr;
            let attempt = shared.connector.connect(addr);
            let (result, fair) = if shared.nodes.len() > 1 {
                let left = deadline.saturating_duration_since(runtime_now());
                let share = left / u32::try_from(n - k).unwrap_or(u32::MAX);
                let result = tokio::time::timeout(share, attempt)
                    .await
                    .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
                (result, share >= floor)
            } else {
                (attempt.await, true)
            };
            match result {
                Ok(stream) => {
                    return Ok(Pooled {
                        conn: Conn::new(stream),
                        node: i,
                        opened: runtime_now(),
                    })
                }
                Err(e) => {
                    if fair || e.kind() != std::io::ErrorKind::TimedOut {
                        shared.mark_down(i);
                    }
                    failed.push(format!("{addr}: {e}"));
                }
            }
        }
        if failed.is_empty() {
            failed.push("no node address given".into());
        }
        Err(ClientError::Connect(failed.join("; ")))
    }

    /// The next jitter draw (splitmix64).
    fn next_random(&self) -> u64 {
        let mut z = self
            .shared
            .jitter
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refresh task dropped before it ran (its runtime shut down) still ends the refresh:
    /// else routing would never refresh again for the client's life.
    #[test]
    fn a_refresh_dropped_with_its_runtime_lets_the_next_one_start() {
        let config = ClientConfig {
            routes_every: Some(Duration::ZERO),
            ..ClientConfig::default()
        };
        // Nothing listens there; nothing is sent in this test anyway.
        let addrs = [
            "127.0.0.1:9".parse().unwrap(),
            "127.0.0.1:7".parse().unwrap(),
        ];
        let client = Client::with_nodes(addrs, TcpConnector, config);
        let router = || client.shared.router.as_ref().unwrap();
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let rt = runtime();
        {
            let _in = rt.enter();
            client.routed(None);
        }
        assert!(
            router().is_refreshing(),
            "a refresh was spawned and has not run"
        );
        drop(rt);
        assert!(
            !router().is_refreshing(),
            "the dropped task left the refresh claimed"
        );
        // And the next call starts one again.
        let rt = runtime();
        let _in = rt.enter();
        client.routed(None);
        assert!(router().is_refreshing());
    }
}
