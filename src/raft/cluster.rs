//! A node's share of the cluster: one openraft group per shard, the proposer that batches
//! decisions into log entries, forwarding to leaders, and the `on_unavailable` fallback.
//!
//! The data path for a batch of commands bound for shard `g`:
//! - this node leads `g`: the commands join `g`'s proposer lane. The proposer takes
//!   everything waiting (up to `batch_max` commands), stamps it with the shard time and
//!   submits it as ONE log entry (one entry may hold several takes, see below). While
//!   `pipeline` entries are in flight it does not submit, so under load the lane fills and
//!   entries grow: batching adapts to the load and adds no delay when idle. Under load a
//!   strict entry may also linger up to `batch_linger` for as many callers as the last
//!   entry held (the callers its commit answered, coming back). The answer to each command
//!   is what applying the COMMITTED entry returned on this node (or a denial by the
//!   committed state, which changes nothing: `deny_at_once`), so a strict admission is never
//!   forgotten by a failover. The exception is a `fast` check, answered from the leader's
//!   speculative state within its lease: with the pipeline full, the next entry stays open
//!   and takes fast callers as they come, each take a part with its own shard time, so fast
//!   callers do not wait for the entry ahead (unless the open entry is full, or there is no
//!   speculative copy or lease: then they wait in the lane, as strict callers do, whose
//!   deadline is checked when the pipeline has room and they are taken). An entry whose
//!   callers were all answered early is held up to `fast_linger` after the last entry (or
//!   until `fast_batch` commands): fewer entries under fast load, each costing every replica
//!   a WAL append and replication messages.
//! - another node leads `g`: the commands are forwarded to it over the peer transport, in
//!   a call of their own, or under load in one with the others waiting to forward there
//!   (`super::forward`), with the time left of each caller's deadline (`unavailable_after`);
//!   `NotLeader` hints are followed until that deadline. A leader's proposer drops undecided
//!   a caller it takes past its deadline (`drop_expired`): its caller has had its
//!   `on_unavailable` answer.
//! - no leader or no quorum within `unavailable_after`: each check is answered by its
//!   policy's `on_unavailable` (deny; allow, counted; or local: this node enforces
//!   `limit / members` by itself on its own table until the shard is back); a check with a
//!   request id is never denied there, but answered as unavailable (see `fallback`).
//!
//! Shard time: a leader stamps batches with `max(last, base + monotonic elapsed)` where
//! `base` is the shard time of the last entry it applied when it took office, so a new
//! leader continues the log's time and its wall clock is never read. Apply takes
//! `max(batch time, state time)`, so an old batch stamped lower cannot turn time back.

use super::denials::DenialCache;
use super::forward::Forwarder;
use super::hooks::FallbackAnswer;
use super::intake::SnapshotIntake;
use super::replies::{ProposerLane, Replies, Waiting};
use super::rpc::{
    ask, CallError, ChangeError, ForwardAnswer, ForwardError, ForwardItem, MemberChange,
    PeerRequest, PeerResponse, Transport,
};
use super::state_machine::{MachineInfo, ShardMachine};
use super::types::{Applies, GroupId, NodeId, TypeConfig};
use crate::clock::{ShardTime, SharedClock};
use crate::limiter::{Decision, Nanos, Outcome};
use crate::metrics::Metrics;
use crate::policy::OnUnavailable;
use crate::shard::actor::ShardError;
use crate::shard::command::{Applied, Batch, Command, Fallback};
use crate::shard::state::{Bounds, MemberHistory, ShardState};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{InstallSnapshotRequest, InstallSnapshotResponse};
use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, Raft, ServerState};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{oneshot, Notify, Semaphore};

/// How a node takes part in the cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub node_id: NodeId,
    /// Every member's id and peer address (this node included).
    pub members: BTreeMap<NodeId, String>,
    /// Snapshots go under `<data_dir>/snapshots`.
    pub data_dir: PathBuf,
    pub shards: u32,
    pub heartbeat: Duration,
    pub election_min: Duration,
    pub election_max: Duration,
    /// Longest wait for a submitted entry to commit before the answer is "unavailable".
    pub write_timeout: Duration,
    /// Longest wait for a forwarded batch's answer.
    pub forward_timeout: Duration,
    /// Most leaders' denials kept to answer again without forwarding (`super::denials`).
    pub denial_cache: usize,
    /// Longest wait for a shard to have a leader before `on_unavailable` answers.
    pub unavailable_after: Duration,
    /// Most commands in one log entry.
    pub batch_max: usize,
    /// Under load, longest a strict entry waits (nothing in flight) for the callers the
    /// last commit answered (see `propose_loop`; the runtime's timer rounds it up to a
    /// millisecond tick); zero proposes at once.
    pub batch_linger: Duration,
    /// Least time between entries whose callers are all fast (answered already); a strict
    /// caller, or `fast_batch` commands, ends the wait (see `propose_loop`).
    pub fast_linger: Duration,
    /// Commands at which a fast-only entry is proposed without waiting out `fast_linger`.
    pub fast_batch: usize,
    /// Most entries a group's leader has submitted but not yet seen committed.
    pub pipeline: usize,
    /// Longest a follower's notice of a new commit waits for the next AppendEntries to
    /// carry it (`rpc::GroupLink::append_entries`); zero sends each at once.
    pub commit_notice_delay: Duration,
    /// A snapshot is taken after this many entries since the last.
    pub snapshot_every: u64,
    /// ... or after this many bytes of entries appended since the last ([`snapshot_loop`]).
    pub snapshot_log_bytes: u64,
    /// Joining a running cluster: never bootstrap the groups (a member adds this node).
    pub join: bool,
    /// The simulation's observers and negative-control switches (unset in production).
    pub hooks: super::hooks::Hooks,
    /// Tests only (`--test-refuse-peer-requests`): peer requests of these variant indexes
    /// are refused unread, as a member of a build from before them refuses them.
    pub refuse_requests: Vec<u8>,
    /// Drawn at random for each start of this node: with a term, it names a leadership
    /// (the entries' [`Batch::epoch`]) that a restart leading the same term again would not
    /// share (openraft restores a committed vote of its own as that term's leadership;
    /// quorate's log store hands it over as not committed, so none does now).
    pub incarnation: u64,
}

impl ClusterConfig {
    pub fn defaults(node_id: NodeId, members: BTreeMap<NodeId, String>, data_dir: PathBuf) -> Self {
        ClusterConfig {
            node_id,
            members,
            data_dir,
            shards: 16,
            heartbeat: Duration::from_millis(100),
            election_min: Duration::from_millis(400),
            election_max: Duration::from_millis(800),
            write_timeout: Duration::from_secs(2),
            forward_timeout: Duration::from_secs(2),
            denial_cache: 100_000,
            unavailable_after: Duration::from_millis(500),
            batch_max: 4096,
            batch_linger: Duration::from_millis(2),
            fast_linger: Duration::from_millis(20),
            fast_batch: 512,
            pipeline: 4,
            commit_notice_delay: Duration::from_millis(5),
            snapshot_every: 20_000,
            snapshot_log_bytes: 16 << 20,
            join: false,
            hooks: Default::default(),
            refuse_requests: Vec::new(),
            incarnation: 0,
        }
    }

    fn raft_config(&self) -> Result<Arc<openraft::Config>, String> {
        let ms = |d: Duration| d.as_millis().max(1) as u64;
        let config = openraft::Config {
            heartbeat_interval: ms(self.heartbeat),
            election_timeout_min: ms(self.election_min),
            election_timeout_max: ms(self.election_max),
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: (self.snapshot_every / 2).clamp(1, 1000),
            max_payload_entries: 64,
            ..Default::default()
        };
        config
            .validate()
            .map(Arc::new)
            .map_err(|e| format!("raft settings: {e}"))
    }
}

/// One caller's commands waiting in a proposer lane.
struct Pending {
    commands: Vec<Command>,
    /// May be answered from the leader's speculative state before the entry commits.
    fast: bool,
    /// Not to be decided after this (monotonic ns on this node's clock): its caller has had
    /// its `on_unavailable` answer by then (`drop_expired`).
    deadline: Nanos,
    reply: oneshot::Sender<Result<Vec<Applied>, Proposal>>,
}

impl Pending {
    /// Whether its deadline has passed at `now`.
    fn expired(&self, now: Nanos) -> bool {
        self.deadline <= now
    }
}

impl Waiting for Pending {
    fn commands(&self) -> usize {
        self.commands.len()
    }

    fn fast(&self) -> bool {
        self.fast
    }
}

/// Why the proposer did not answer with a committed result.
#[derive(Debug, Clone)]
enum Proposal {
    /// Never submitted to Raft (this node was not the leader, or Raft had stopped): nothing
    /// was applied, so the caller may try elsewhere.
    NotSubmitted(String),
    /// Submitted, then failed or lost: it may still commit. The outcome is unknown.
    Lost(String),
}

/// The leader-side batcher of one group.
struct Proposer {
    lane: ProposerLane<Pending>,
    wake: Notify,
    inflight: Arc<Semaphore>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The voter `group` prefers as its leader: the one at position `group` mod the number of
/// `voters` (sorted by id). Starts, the rebalancer, removals and SIGTERM all reckon with
/// this one rule, so leaders spread evenly and stay put. `None` with no voters.
fn preferred(voters: &[NodeId], group: GroupId) -> Option<NodeId> {
    let n = u64::try_from(voters.len()).ok().filter(|&n| n > 0)?;
    voters.get(usize::try_from(group % n).ok()?).copied()
}

/// One shard's Raft group on this node.
struct Group {
    id: GroupId,
    raft: Raft<TypeConfig>,
    info: Arc<MachineInfo>,
    proposer: Proposer,
    /// The `local` fallback's own table (limits divided by the member count).
    local: Mutex<ShardState>,
    /// Entries proposed by this node as leader.
    proposed: AtomicU64,
    /// The state machine's state (read to seed the speculative state).
    info_state: Arc<Mutex<ShardState>>,
    /// Set when an entry the speculative state assumed did not commit.
    spec_failed: Arc<std::sync::atomic::AtomicBool>,
    /// Monotonic time at which the last committed entry was proposed (0: none yet).
    lease_from: Arc<AtomicU64>,
    /// A leadership handover asked of the proposer ([`Cluster::hand_over`]), and whether
    /// one is (read by the proposer every round without the lock).
    handover: Mutex<Option<HandoverAsk>>,
    handover_asked: AtomicBool,
    /// Numbers the asks, so that an asker withdraws only its own.
    handover_seq: AtomicU64,
    /// This node was removed from the group: a member refused its vote or a check it
    /// forwarded ([`PeerResponse::Removed`]), or this replica applied the removal (the state
    /// machine says so). From then on it refuses the shard's checks
    /// ([`ShardError::Removed`]): it hears from no leader any more, and would otherwise
    /// answer them with `on_unavailable` once its view is stale. Its elections in the group
    /// stop (a task started with the group).
    removed: Arc<super::rpc::Removal>,
    /// The snapshot stream this node receives as a follower: its chunks reach openraft only
    /// without a gap ([`SnapshotIntake`]).
    intake: SnapshotIntake,
}

/// A handover the proposer is to carry out: to whom, and where the outcome goes.
struct HandoverAsk {
    seq: u64,
    to: NodeId,
    reply: oneshot::Sender<Result<(), String>>,
}

/// Per-group numbers for `/v1/admin/status` and `quorate status`.
#[derive(Debug, Clone, Serialize)]
pub struct GroupStatus {
    pub shard: GroupId,
    pub state: String,
    pub leader: Option<NodeId>,
    /// The group's voters, as this node last saw its membership.
    pub voters: Vec<NodeId>,
    /// Nodes the membership names that do not vote (an add not finished).
    pub learners: Vec<NodeId>,
    /// Node ids removed from the group's membership, as this node's replica has applied
    /// them ([`MemberHistory`]): never given to a new member.
    pub removed: Vec<NodeId>,
    /// This node was removed from the group (a member said so, or this replica applied
    /// it): it refuses the shard's checks.
    pub this_node_removed: bool,
    pub term: u64,
    pub last_log_index: u64,
    /// The last log index purged behind a snapshot (0: none): the log holds the entries
    /// after it, up to `last_log_index`.
    pub purged_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    /// Entries each follower is behind the leader's last log index, as the leader's
    /// replication figures say (empty when not known).
    pub lag: BTreeMap<NodeId, u64>,
    /// Whose figures `lag` holds: this node's when it leads the shard, else the leader's,
    /// asked by [`Cluster::fill_lag`] (`None`: not asked, or it did not answer).
    pub lag_from: Option<NodeId>,
    pub keys: u64,
    pub shard_time_ns: u64,
    pub snapshots: u64,
    /// Snapshots this member received from a leader and installed.
    pub snapshots_installed: u64,
    /// Log purges that reached this member's store before the snapshot covering them was
    /// durable (`MachineInfo::early_purges`; they waited for it): always 0 unless openraft's
    /// ordering broke.
    pub early_purges: u64,
    pub entries_proposed: u64,
    /// A hash of the shard's applied state (keys and their states, order-independent):
    /// equal on every replica that applied the same entries. Only when asked for
    /// ([`Cluster::status_with`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// Builds a group's log storage (the node's shared WAL hands these out).
pub trait LogFactory {
    type Log: RaftLogStorage<TypeConfig>;
    /// `snapshot`: the group's state machine's info, whose durable snapshot mark the log's
    /// purges do not pass (`raft::log_store`).
    fn log(&mut self, group: GroupId, snapshot: Arc<MachineInfo>) -> Result<Self::Log, String>;
}

pub struct Cluster {
    config: ClusterConfig,
    groups: Vec<Arc<Group>>,
    transport: Arc<dyn Transport>,
    clock: SharedClock,
    metrics: Metrics,
    bounds: Bounds,
    /// Denials learned from other nodes' leaders.
    denials: DenialCache,
    /// This node's RESP address, once its server is bound.
    resp_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// Other members' RESP addresses as they last gave them (`None`: never), and when they
    /// are to be asked again (monotonic ns).
    peer_resp: Mutex<std::collections::HashMap<NodeId, (Option<std::net::SocketAddr>, u64)>>,
    /// Held while members are asked for their RESP addresses: one round at a time.
    resp_asking: tokio::sync::Mutex<()>,
    /// Held while leaders are asked for their lag (`fill_lag`): one round at a time, however
    /// many status requests come.
    lag_asking: tokio::sync::Mutex<()>,
    /// Sends forwarded checks, several callers' in one call (`super::forward`).
    forwarder: Arc<Forwarder>,
}

/// The epoch of the entries a leader proposes ([`Batch::epoch`]): one per start of a node
/// (`incarnation`) and term, never 0 (a batch made outside a cluster).
pub fn epoch(incarnation: u64, term: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&incarnation.to_le_bytes());
    bytes[8..].copy_from_slice(&term.to_le_bytes());
    crate::shard::route::fnv1a(&bytes).max(1)
}

/// A member as a Redis Cluster client needs it (`CLUSTER NODES`, `CLUSTER SLOTS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientNode {
    pub id: NodeId,
    /// Where it serves RESP clients: host (an IP without brackets, or the host of its peer
    /// address) and port (`None`: not known, it has not answered).
    pub resp: Option<(String, u16)>,
    /// Its peer address's port (Redis's "cluster bus" port), 0 when not known.
    pub bus_port: u16,
}

/// Longest a status waits for a shard leader's lag figures (`Cluster::fill_lag`).
const LAG_WAIT: Duration = Duration::from_secs(1);

/// How long a member's RESP address is used before it is asked again.
const RESP_ADDR_TTL: u64 = 10 * crate::limiter::SECOND;
/// How long an ask that got no address waits before the member is asked again.
const RESP_ADDR_RETRY: u64 = crate::limiter::SECOND;
/// Longest wait for a member's RESP address (a `CLUSTER` command waits for the answers).
const RESP_ADDR_WAIT: Duration = Duration::from_millis(500);

impl Cluster {
    /// Opens every group's state machine and log, starts its Raft node, and initialises the
    /// groups on a fresh data directory (every member does the same with the same members,
    /// which openraft makes safe).
    pub async fn start<F: LogFactory>(
        config: ClusterConfig,
        mut logs: F,
        transport: Arc<dyn Transport>,
        clock: SharedClock,
        metrics: Metrics,
        bounds: Bounds,
    ) -> Result<Arc<Cluster>, String> {
        if !config.members.contains_key(&config.node_id) {
            return Err(format!(
                "node id {} is not in the member list {:?}",
                config.node_id,
                config.members.keys().collect::<Vec<_>>()
            ));
        }
        let raft_config = config.raft_config()?;
        let snap_dir = config.data_dir.join("snapshots");
        let members: BTreeMap<NodeId, BasicNode> = config
            .members
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr)))
            .collect();
        let mut groups = Vec::new();
        for g in 0..config.shards.max(1) as GroupId {
            let mut sm = ShardMachine::open(&snap_dir, g, bounds)?;
            let removed = Arc::new(super::rpc::Removal::default());
            sm.set_node(config.node_id, config.hooks.clone(), removed.clone());
            let info = sm.info();
            let info_state = sm.state();
            let log = logs.log(g, info.clone())?;
            let network = super::rpc::GroupNetwork {
                group: g,
                transport: transport.clone(),
                notice_delay: config.commit_notice_delay,
                removed: removed.clone(),
            };
            // openraft's log lines name the group through its cluster name.
            let raft_config = Arc::new(openraft::Config {
                cluster_name: format!("shard-{g}"),
                ..(*raft_config).clone()
            });
            let raft = Raft::new(config.node_id, raft_config, network, log, sm)
                .await
                .map_err(|e| format!("shard {g}: cannot start raft: {e}"))?;
            // A new cluster: the member a group prefers (the one at position g mod members,
            // as the rebalance loop reckons) starts it, and leads it from the outset, so no
            // leadership has to move after a start. The others start it only if it still
            // has no leader after a while (its preferred member did not come up).
            if !config.join && !raft.is_initialized().await.map_err(|e| e.to_string())? {
                let ids: Vec<NodeId> = members.keys().copied().collect();
                let Some(preferred) = preferred(&ids, g) else {
                    return Err(format!("shard {g}: no members to start it with"));
                };
                let (raft, members) = (raft.clone(), members.clone());
                let wait = config.election_max * 4;
                tokio::spawn(async move {
                    if preferred != config.node_id {
                        tokio::time::sleep(wait).await;
                        let m = raft.metrics().borrow().clone();
                        if m.current_leader.is_some() || m.membership_config.voter_ids().count() > 0
                        {
                            return;
                        }
                    }
                    if let Err(e) = raft.initialize(members).await {
                        tracing::debug!(group = g, error = %e, "initialize skipped");
                    }
                });
            }
            let group = Arc::new(Group {
                id: g,
                raft,
                info,
                proposer: Proposer {
                    lane: ProposerLane::new(),
                    wake: Notify::new(),
                    inflight: Arc::new(Semaphore::new(config.pipeline.max(1))),
                },
                local: Mutex::new(ShardState::new(bounds)),
                proposed: AtomicU64::new(0),
                info_state,
                spec_failed: Arc::default(),
                lease_from: Arc::default(),
                handover: Mutex::new(None),
                handover_asked: AtomicBool::new(false),
                handover_seq: AtomicU64::new(0),
                removed,
                intake: SnapshotIntake::default(),
            });
            {
                // A removed node is out for good (ids are never given out again), and its
                // campaigns can only do harm: a member that has not applied the removal yet
                // takes the higher term, and then refuses its leader's appends (it falls
                // behind for as long as the removed node runs). The task holds no Raft
                // handle: a group dropped unstarted shuts its Raft down as ever.
                let (weak, removed) = (Arc::downgrade(&group), group.removed.clone());
                tokio::spawn(async move {
                    removed.learned().await;
                    if let Some(group) = weak.upgrade() {
                        group.raft.runtime_config().elect(false);
                    }
                });
            }
            groups.push(group);
        }
        let denials = DenialCache::new(config.denial_cache);
        let forwarder = Arc::new(Forwarder::new(
            transport.clone(),
            clock.clone(),
            config.forward_timeout,
            config
                .hooks
                .forward_in_flight
                .unwrap_or(super::forward::MAX_IN_FLIGHT),
            metrics.forwarded.clone(),
            metrics.forward_calls.clone(),
        ));
        let cluster = Arc::new(Cluster {
            config,
            groups,
            transport,
            clock,
            metrics,
            bounds,
            denials,
            resp_addr: std::sync::OnceLock::new(),
            peer_resp: Mutex::default(),
            resp_asking: tokio::sync::Mutex::new(()),
            lag_asking: tokio::sync::Mutex::new(()),
            forwarder,
        });
        for g in &cluster.groups {
            tokio::spawn(propose_loop(cluster.clone(), g.clone()));
        }
        tokio::spawn(rebalance_loop(Arc::downgrade(&cluster)));
        tokio::spawn(snapshot_loop(Arc::downgrade(&cluster)));
        Ok(cluster)
    }

    pub fn node_id(&self) -> NodeId {
        self.config.node_id
    }

    pub fn count(&self) -> u32 {
        self.groups.len() as u32
    }

    /// Records where this node serves RESP clients (once its server is bound).
    pub fn set_resp_addr(&self, addr: std::net::SocketAddr) {
        let _ = self.resp_addr.set(addr);
    }

    /// Every member of any shard, with where it serves RESP clients: its own answer, asked
    /// over the peer connection at most every 10 s (1 s after an ask that got no address; one
    /// round at a time, the members at once, each ask bounded by 500 ms and the forward
    /// timeout; a member that does not answer keeps its last known address). An address
    /// bound to all interfaces (`0.0.0.0`, `::`) is given with its peer address's host.
    pub async fn client_nodes(&self) -> Vec<ClientNode> {
        let mut members: BTreeMap<NodeId, String> = BTreeMap::new();
        for g in &self.groups {
            let m = g.raft.metrics().borrow().membership_config.clone();
            for (id, node) in m.membership().nodes() {
                members.entry(*id).or_insert_with(|| node.addr.clone());
            }
        }
        let _one_round = self.resp_asking.lock().await;
        let now = self.clock.monotonic();
        let stale: Vec<NodeId> = {
            let known = lock(&self.peer_resp);
            members
                .keys()
                .filter(|id| **id != self.config.node_id)
                .filter(|id| known.get(id).is_none_or(|(_, next)| now >= *next))
                .copied()
                .collect()
        };
        let asked = futures::future::join_all(stale.into_iter().map(|id| async move {
            let answer = ask(
                &*self.transport,
                id,
                &PeerRequest::RespAddr,
                self.config.forward_timeout.min(RESP_ADDR_WAIT),
            )
            .await;
            (id, answer)
        }))
        .await;
        let mut known = lock(&self.peer_resp);
        known.retain(|id, _| members.contains_key(id));
        for (id, answer) in asked {
            let entry = known.entry(id).or_insert((None, now));
            match answer {
                Ok(PeerResponse::RespAddr(Some(addr))) => {
                    *entry = (Some(addr), now.saturating_add(RESP_ADDR_TTL))
                }
                other => {
                    // Asked again after RESP_ADDR_RETRY, not the whole TTL: a member whose
                    // server was not bound yet, or that was briefly away, gets its slots back
                    // soon.
                    entry.1 = now.saturating_add(RESP_ADDR_RETRY);
                    tracing::debug!(peer = id, answer = ?other.map(|_| ()), "no RESP address")
                }
            }
        }
        members
            .into_iter()
            .map(|(id, peer)| {
                let resp = if id == self.config.node_id {
                    self.resp_addr.get().copied()
                } else {
                    known.get(&id).and_then(|(a, _)| *a)
                };
                let (host, port) = peer.rsplit_once(':').unwrap_or((peer.as_str(), "0"));
                let host = host.trim_start_matches('[').trim_end_matches(']');
                ClientNode {
                    id,
                    resp: resp.map(|a| {
                        let ip = if a.ip().is_unspecified() {
                            host.to_string()
                        } else {
                            a.ip().to_string()
                        };
                        (ip, a.port())
                    }),
                    bus_port: port.parse().unwrap_or(0),
                }
            })
            .collect()
    }

    /// Each shard's leader as this node knows it, and its term (`QR.ROUTES`, `CLUSTER
    /// SLOTS`). None at term 0 in a shard this node knows it was removed from: its view of
    /// it is stale, and a client that asks several nodes keeps the newest term's answer.
    pub fn leaders(&self) -> Vec<(Option<NodeId>, u64)> {
        self.groups
            .iter()
            .map(|g| {
                if g.removed.is_known() {
                    return (None, 0);
                }
                let m = g.raft.metrics();
                let m = m.borrow();
                (known_leader(&m), m.current_term)
            })
            .collect()
    }

    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// The voters of a group, as this node last saw its membership.
    fn voters(group: &Group) -> Vec<NodeId> {
        let m = group.raft.metrics();
        let m = m.borrow();
        m.membership_config.membership().voter_ids().collect()
    }

    /// Every node any group's membership names (voters and learners), with its address.
    fn known_ids(&self) -> BTreeMap<NodeId, String> {
        let mut ids = BTreeMap::new();
        for g in &self.groups {
            let m = g.raft.metrics();
            let m = m.borrow();
            for (id, node) in m.membership_config.membership().nodes() {
                ids.insert(*id, node.addr.clone());
            }
        }
        ids
    }

    /// Every group's member history ([`MemberHistory`]), as this node's replica has applied it.
    fn member_histories(&self) -> Vec<(GroupId, MemberHistory)> {
        self.groups
            .iter()
            .map(|g| (g.id, lock(&g.info_state).members().clone()))
            .collect()
    }

    /// Adds or removes a member in every group, each through its leader. Adding needs a
    /// fresh id (above every id the groups' memberships have named, and never removed from
    /// one: [`check_change`]) unless the same add is being resumed; each group's leader
    /// refuses an id that left its membership, also when this node's replicas lag. Removing
    /// the last voters is refused.
    pub async fn change_members(&self, change: MemberChange) -> Result<(), String> {
        check_change(&change, &self.known_ids(), &self.member_histories())?;
        for g in &self.groups {
            let mut done = false;
            for _attempt in 0..20 {
                let leader = match self.leader(g) {
                    Some(l) => l,
                    None => {
                        self.wait_for_leader(g).await;
                        continue;
                    }
                };
                let result = if leader == self.config.node_id {
                    self.change_group(g, &change).await
                } else {
                    let request = PeerRequest::Members {
                        group: g.id,
                        change: change.clone(),
                    };
                    match ask(
                        &*self.transport,
                        leader,
                        &request,
                        self.config.write_timeout * 10,
                    )
                    .await
                    {
                        Ok(PeerResponse::Members(r)) => r,
                        Ok(other) => Err(ForwardError::Unavailable(format!(
                            "unexpected answer {other:?}"
                        ))
                        .into()),
                        Err(e) => Err(ForwardError::Unavailable(e.to_string()).into()),
                    }
                };
                match result {
                    Ok(()) => {
                        done = true;
                        break;
                    }
                    Err(ChangeError::Final(why)) => return Err(why),
                    Err(ChangeError::Retry(e)) => {
                        tracing::info!(shard = g.id, error = %e, "membership change: retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            if !done {
                return Err(format!(
                    "shard {}: the membership change did not complete; run it again",
                    g.id
                ));
            }
        }
        Ok(())
    }

    /// Hands a leader's snapshot chunk to openraft, unless it would leave a gap in the
    /// stream's buffer ([`SnapshotIntake`]): then the answer is the mismatch openraft gives
    /// a chunk of a stream it does not have, and the leader sends the stream from its start.
    async fn receive_chunk(
        &self,
        group: &Group,
        rpc: InstallSnapshotRequest<TypeConfig>,
    ) -> Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        let id = rpc.meta.snapshot_id.clone();
        let (vote, done) = (rpc.vote, rpc.done);
        let end = rpc.offset.saturating_add(rpc.data.len() as u64);
        let offset = rpc.offset;
        if let Err((why, mismatch)) = group.intake.admit(&id, offset) {
            tracing::info!(group = group.id, %mismatch, why = why.label(), "snapshot chunk refused");
            self.metrics
                .snapshot_chunks_refused
                .with_label_values(&[why.label()])
                .inc();
            return Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(
                mismatch,
            )));
        }
        let answer = group.raft.install_snapshot(rpc).await;
        // Taken unless refused for its vote (then the answer names a greater one, or one
        // that cannot be compared).
        if answer.as_ref().is_ok_and(|r| r.vote <= vote) {
            group.intake.took(&id, offset, end, done);
        }
        answer
    }

    /// Carries out `change` on `group`, which this node leads.
    async fn change_group(&self, group: &Group, change: &MemberChange) -> Result<(), ChangeError> {
        if self.leader(group) != Some(self.config.node_id) {
            return Err(ForwardError::NotLeader {
                leader: self.leader(group),
            }
            .into());
        }
        // The group's membership as its log has it (voters and learners), read once.
        let membership = {
            let m = group.raft.metrics();
            let m = m.borrow();
            m.membership_config.clone()
        };
        let voters: Vec<NodeId> = membership.membership().voter_ids().collect();
        let fail = |e: String| ChangeError::Retry(ForwardError::Unavailable(e));
        let waited = |e: openraft::metrics::WaitError| match e {
            openraft::metrics::WaitError::Timeout(..) => None,
            shutting_down => Some(fail(shutting_down.to_string())),
        };
        match change {
            MemberChange::Add { id, addr } => {
                // The removed ids are in the applied state, which a new leader may not have
                // caught up to its log's membership yet (the membership above is the log's).
                let at = membership.log_id().map(|l| l.index);
                group
                    .raft
                    .wait(Some(self.config.write_timeout))
                    .applied_index_at_least(at, "the membership applied")
                    .await
                    .map_err(|e| {
                        waited(e)
                            .unwrap_or_else(|| fail("the membership is not applied yet".into()))
                    })?;
                let named_at = membership
                    .membership()
                    .get_node(id)
                    .map(|n| n.addr.as_str());
                // The history is read under the lock (not copied), held in this block only.
                let checked = {
                    let state = lock(&group.info_state);
                    leader_check_add(group.id, *id, addr, named_at, state.members())
                };
                checked.map_err(ChangeError::Final)?;
                if voters.contains(id) {
                    return Ok(());
                }
                // Added as a learner; made a voter only once it holds the log up to its own
                // add. (openraft's blocking add waits without end, and takes a learner within
                // `replication_lag_threshold` entries as caught up, one that never answered
                // included: a node that is not there would have become a voter.) The wait is
                // bounded, within the caller's `write_timeout * 10` for a step sent here.
                let added = group
                    .raft
                    .add_learner(*id, BasicNode::new(addr), false)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                let at = added.log_id.index;
                let wait = self.config.write_timeout * 5;
                let caught_up = group
                    .raft
                    .wait(Some(wait))
                    .metrics(
                        |m| match &m.replication {
                            // No longer the leader: the voter change below fails, and is retried.
                            None => true,
                            Some(r) => r.get(id).copied().flatten().is_some_and(|l| l.index >= at),
                        },
                        "the new node to hold the log up to its add",
                    )
                    .await;
                if let Err(e) = caught_up {
                    return Err(waited(e).unwrap_or_else(|| {
                        ChangeError::Final(format!(
                            "node {id} has not caught up with shard {} within {wait:?}: check \
                             that it runs, started with --join, and listens for peers at {addr}. \
                             It is a learner of that shard now (it does not vote): run the add \
                             again to wait on, or remove it (and, if {addr} was wrong, add the \
                             node under a new id: a removed id is not given out again)",
                            group.id
                        ))
                    }));
                }
                let ids: std::collections::BTreeSet<NodeId> = [*id].into();
                group
                    .raft
                    .change_membership(openraft::ChangeMembers::AddVoterIds(ids), false)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
            }
            MemberChange::Remove { id } => {
                let ids: std::collections::BTreeSet<NodeId> = [*id].into();
                if !voters.contains(id) {
                    // A learner (an add that stopped before it became a voter: named, not
                    // voting) leaves too.
                    if membership.membership().get_node(id).is_some() {
                        group
                            .raft
                            .change_membership(openraft::ChangeMembers::RemoveNodes(ids), false)
                            .await
                            .map_err(|e| fail(e.to_string()))?;
                    }
                    return Ok(());
                }
                if voters.len() <= 1 {
                    return Err(ChangeError::Final(format!(
                        "refusing to remove the last voter of shard {}",
                        group.id
                    )));
                }
                // This node leads the group: hand the leadership to another voter first, and
                // have the change sent again to it. A leader removed by its own change steps
                // down once the change commits, and the group would have no leader for an
                // election timeout. If the handover fails, the removal goes ahead here.
                if *id == self.config.node_id {
                    if lock(&group.handover).is_some() {
                        // A rebalance's handover: the change is sent again after it.
                        return Err(fail("a handover of this shard is under way".into()));
                    }
                    let others: Vec<NodeId> = voters.iter().copied().filter(|v| v != id).collect();
                    if let Some(to) = preferred(&others, group.id) {
                        match self.hand_over(group, to).await {
                            Ok(()) => {
                                return Err(ForwardError::NotLeader { leader: Some(to) }.into());
                            }
                            Err(why) => {
                                tracing::info!(shard = group.id, %why, "no handover before this leader's removal");
                            }
                        }
                    }
                }
                group
                    .raft
                    .change_membership(openraft::ChangeMembers::RemoveVoters(ids), false)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// Hands `group`'s leadership, which this node holds, to the voter `to` (openraft 0.9
    /// has no leadership transfer; see [`run_handover`], which the group's proposer runs).
    /// First asks `to` for its RESP address, a round trip that changes nothing: the
    /// leader's replication figures, which the rebalancer reads, go stale for a member that
    /// is down or cut off, and a handover to it would hold up the group's callers for
    /// nothing.
    async fn hand_over(&self, group: &Group, to: NodeId) -> Result<(), String> {
        let probe = ask(
            &*self.transport,
            to,
            &PeerRequest::RespAddr,
            self.config.election_min / 2,
        )
        .await;
        if let Err(e) = probe {
            let why = format!("node {to} does not answer: {e}");
            self.handed_over(group, to, &Err(why.clone()));
            return Err(why);
        }
        let Some((seq, outcome)) = Cluster::ask_handover(group, to) else {
            return Err("a handover of this shard is under way".into());
        };
        // Above the proposer's longest handover (see `run_handover`'s waits).
        let limit =
            self.config.write_timeout + self.config.election_min * 3 + self.config.election_max * 4;
        match tokio::time::timeout(limit, outcome).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err("the proposer stopped".into()),
            Err(_) => {
                // Not taken up (the proposer is stuck): withdrawn, if it is still this one.
                // Taken up, it ends anyway.
                let mut asked = lock(&group.handover);
                if asked.as_ref().is_some_and(|a| a.seq == seq) {
                    asked.take();
                }
                Err(format!("no outcome within {limit:?}"))
            }
        }
    }

    /// Before this member stops (SIGTERM, a rolling restart): hands each shard it leads to
    /// another voter (the one the shard prefers among the others, as a removal does), so no
    /// shard waits an election timeout for a new leader. All at once, for at most
    /// `election_max` in all (about what a failover would take): a member stopped with the
    /// others at once does not wait on handovers to members that are stopping too.
    pub async fn hand_over_all(&self) {
        let me = self.config.node_id;
        let handovers = self.groups.iter().filter_map(|g| {
            if self.leader(g) != Some(me) {
                return None;
            }
            let others: Vec<NodeId> = Cluster::voters(g)
                .into_iter()
                .filter(|v| *v != me)
                .collect();
            let to = preferred(&others, g.id)?;
            Some(async move {
                let _ = self.hand_over(g, to).await;
            })
        });
        let all = futures::future::join_all(handovers);
        let _ = tokio::time::timeout(self.config.election_max, all).await;
    }

    /// Asks `group`'s proposer for a handover to `to`: the ask's number and where its
    /// outcome comes; `None` if one is asked already.
    fn ask_handover(
        group: &Group,
        to: NodeId,
    ) -> Option<(u64, oneshot::Receiver<Result<(), String>>)> {
        let (reply, outcome) = oneshot::channel();
        let seq = group.handover_seq.fetch_add(1, Ordering::Relaxed);
        {
            let mut asked = lock(&group.handover);
            if asked.is_some() {
                return None;
            }
            *asked = Some(HandoverAsk { seq, to, reply });
        }
        group.handover_asked.store(true, Ordering::SeqCst);
        group.proposer.wake.notify_one();
        Some((seq, outcome))
    }

    /// Asks shard `shard`'s proposer to hand its leadership to `to`, without waiting for the
    /// outcome (the simulation's nemesis, outside the node's runtime). False if one is asked
    /// already. A node that does not lead the shard answers the ask with a refusal.
    pub fn start_handover(&self, shard: u32, to: NodeId) -> bool {
        Cluster::ask_handover(self.group(shard), to).is_some()
    }

    /// Counts and reports a handover's outcome (the proposer calls it).
    fn handed_over(&self, group: &Group, to: NodeId, result: &Result<(), String>) {
        match result {
            Ok(()) => {
                self.metrics.handovers.with_label_values(&["done"]).inc();
                tracing::info!(shard = group.id, to, "leadership handed over");
            }
            Err(why) => {
                self.metrics.handovers.with_label_values(&["failed"]).inc();
                tracing::info!(shard = group.id, to, %why, "leadership not handed over");
            }
        }
        if let Some(sink) = &self.config.hooks.handover {
            sink(self.config.node_id, group.id, to, result.is_ok());
        }
    }

    /// A handover from `group`'s leader (`PeerRequest::Handover`): waive the lease of its
    /// leadership `vote`, and with `elect` call an election.
    async fn take_handover(
        &self,
        group: &Group,
        vote: openraft::Vote<NodeId>,
        elect: bool,
    ) -> Result<(), String> {
        let (mine, voter) = {
            let m = group.raft.metrics();
            let m = m.borrow();
            let voter = m
                .membership_config
                .membership()
                .voter_ids()
                .any(|v| v == self.config.node_id);
            (m.vote, voter)
        };
        if mine != vote {
            return Err(format!("this node's vote is {mine}, not {vote}"));
        }
        if elect && !voter {
            return Err("this node does not vote in the shard".into());
        }
        group
            .raft
            .trigger()
            .waive_lease(vote)
            .await
            .map_err(|e| e.to_string())?;
        if elect {
            group
                .raft
                .trigger()
                .elect()
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The shards this node leads now that hold keys (what the eviction loop visits: an
    /// empty shard has nothing to evict and gets no log entry for it).
    pub fn led_shards(&self) -> Vec<u32> {
        self.groups
            .iter()
            .filter(|g| g.info.keys.load(Ordering::Relaxed) > 0)
            .filter(|g| self.leader(g) == Some(self.config.node_id))
            .map(|g| g.id as u32)
            .collect()
    }

    /// True when every group has a leader this node knows of, and this node was not
    /// removed from any (a removed node refuses checks: a load balancer is to pass it over).
    pub fn ready(&self) -> bool {
        self.groups
            .iter()
            .all(|g| self.leader(g).is_some() && !g.removed.is_known())
    }

    fn group(&self, shard: u32) -> &Arc<Group> {
        &self.groups[shard as usize % self.groups.len()]
    }

    /// The group's leader as this node knows it ([`known_leader`]).
    fn leader(&self, group: &Group) -> Option<NodeId> {
        known_leader(&group.raft.metrics().borrow())
    }

    /// The shards whose Raft core on this node stopped on an error (a failed disk: the WAL
    /// poisons itself and every group's next write fails), with the error. This node serves
    /// them no more until it is restarted: `/healthz` says so.
    pub fn failed_groups(&self) -> Vec<(GroupId, String)> {
        self.groups
            .iter()
            .filter_map(|g| match &g.raft.metrics().borrow().running_state {
                Ok(()) | Err(openraft::error::Fatal::Stopped) => None,
                Err(e) => Some((g.id, e.to_string())),
            })
            .collect()
    }

    /// Decides `commands` on shard `shard` through its leader; see the module doc.
    pub async fn apply(
        &self,
        shard: u32,
        commands: Vec<Command>,
        fast: bool,
    ) -> Result<Vec<Applied>, ShardError> {
        let group = self.group(shard).clone();
        let me = self.config.node_id;
        if group.removed.is_known() {
            return Err(ShardError::Removed(shard));
        }
        let leader = self.leader(&group);
        // A denial this node learned from another node's leader, still in force, is given
        // again without asking (a leader uses its committed state instead, in its proposer).
        if leader != Some(me) {
            if let Some(denied) = self.denials.answer(&commands, self.clock.monotonic()) {
                self.metrics.denials_cached.inc_by(denied.len() as u64);
                return Ok(denied);
            }
        }
        // One deadline for the whole call: waiting for a leader, proposing or forwarding, and
        // retrying what was certainly not applied. Past it (or on an outcome that may have
        // been applied), `on_unavailable` answers (a check with a request id that it would
        // deny: `Applied::Unknown`, see `fallback`).
        let deadline = self.deadline_in(self.config.unavailable_after);
        let attempt = async {
            let mut hint = leader;
            loop {
                let id = match hint {
                    Some(id) => id,
                    None => self.wait_for_leader(&group).await?,
                };
                let result = if id == me {
                    self.propose(&group, commands.clone(), fast, deadline).await
                } else {
                    let asked_at = self.clock.monotonic();
                    let answer = self
                        .forward(id, &group, commands.clone(), fast, deadline)
                        .await;
                    if let Ok(applied) = &answer {
                        self.denials.learn(&commands, applied, asked_at);
                    }
                    answer
                };
                // Learned meanwhile (a refused forward, or the removal applied): not to be
                // tried again, `ShardError::Removed` answers (below).
                if result.is_err() && group.removed.is_known() {
                    return None;
                }
                match result {
                    Ok(applied) => return Some(applied),
                    Err(ForwardError::NotLeader { leader }) => {
                        hint = leader.filter(|l| *l != id);
                        if hint.is_none() {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    Err(ForwardError::Unavailable(why)) => {
                        tracing::debug!(shard, leader = id, %why, "not applied; trying again");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        hint = self.leader(&group);
                    }
                    Err(ForwardError::Unknown(why)) => {
                        tracing::debug!(shard, leader = id, %why, "outcome unknown");
                        return None;
                    }
                }
            }
        };
        match tokio::time::timeout(self.config.unavailable_after, attempt).await {
            Ok(Some(applied)) => Ok(applied),
            // Nor does a node that learned of its removal meanwhile answer `on_unavailable`.
            _ if group.removed.is_known() => Err(ShardError::Removed(shard)),
            _ => Ok(self.fallback(&group, &commands)),
        }
    }

    async fn wait_for_leader(&self, group: &Group) -> Option<NodeId> {
        let mut rx = group.raft.metrics();
        let wait = async move {
            // A stopped core names no leader ever again: at once, then.
            rx.wait_for(|m| m.current_leader.is_some() || m.running_state.is_err())
                .await
                .ok()
                .and_then(|m| known_leader(&m))
        };
        tokio::time::timeout(self.config.unavailable_after, wait)
            .await
            .ok()
            .flatten()
    }

    /// Sends `commands` to `to`, believed to lead `group`, to be decided by `deadline` (this
    /// node's monotonic ns), and waits for the answer.
    async fn forward(
        &self,
        to: NodeId,
        group: &Group,
        commands: Vec<Command>,
        fast: bool,
        deadline: Nanos,
    ) -> Result<Vec<Applied>, ForwardError> {
        // A deadline that has passed: the forwarder answers `Unavailable`, sending nothing.
        let answer = self
            .forwarder
            .forward(to, group.id, commands, fast, deadline)
            .await;
        match answer {
            Ok(ForwardAnswer::Decided(result)) => result,
            // Refused, not decided: this node was removed from the group (`Cluster::handle`).
            Ok(ForwardAnswer::Removed) => {
                group.removed.learn(group.id, to);
                Err(ForwardError::Unavailable(
                    "this node was removed from the shard".into(),
                ))
            }
            // Not sent: nothing was applied. Sent and no answer: unknown.
            Err(e @ CallError::NotSent(..)) => Err(ForwardError::Unavailable(e.to_string())),
            Err(e) => Err(ForwardError::Unknown(e.to_string())),
        }
    }

    /// Puts `commands` in this node's proposer lane for `group` and waits for the answer
    /// from the committed entry. Not decided past `deadline` (this node's monotonic ns; see
    /// `drop_expired`).
    async fn propose(
        &self,
        group: &Arc<Group>,
        commands: Vec<Command>,
        fast: bool,
        deadline: Nanos,
    ) -> Result<Vec<Applied>, ForwardError> {
        let n = commands.len();
        let bound = (self.config.batch_max * self.config.pipeline * 4) as u64;
        if !group.proposer.lane.reserve(n as u64, bound) {
            return Err(ForwardError::Unavailable("proposer queue full".into()));
        }
        let (reply, answer) = oneshot::channel();
        // Strict callers wait for the commit; fast ones may be answered from the leader's
        // speculative state (see `propose_loop`); under the negative-control hook, all.
        let answer_early = fast || self.config.hooks.unsafe_answer_before_commit;
        // Past `write_timeout` this waits no more (below) and its caller gets its
        // `on_unavailable` answer: no later decision, then, whatever the caller's deadline.
        let deadline = deadline.min(self.deadline_in(self.config.write_timeout));
        let pending = Pending {
            commands,
            fast: answer_early,
            deadline,
            reply,
        };
        if group.proposer.lane.push(pending).is_err() {
            // The proposer has stopped (Raft is shutting down): nothing was submitted.
            return Err(self.not_submitted(group, "the proposer stopped".into()));
        }
        group.proposer.wake.notify_one();
        let answer = tokio::time::timeout(self.config.write_timeout, answer).await;
        match answer {
            Ok(Ok(Ok(applied))) if applied.len() == n => Ok(applied),
            Ok(Ok(Ok(_))) => Err(ForwardError::Unknown("answer count mismatch".into())),
            Ok(Ok(Err(Proposal::Lost(why)))) => Err(ForwardError::Unknown(why)),
            Ok(Ok(Err(Proposal::NotSubmitted(why)))) => Err(self.not_submitted(group, why)),
            // The reply handle was dropped unanswered (a panic in its holder).
            Ok(Err(_)) => Err(ForwardError::Unknown(
                "the proposer dropped the answer".into(),
            )),
            Err(_) => Err(ForwardError::Unknown("commit timed out".into())),
        }
    }

    /// What a caller whose commands were never submitted is told: the leader to ask, if
    /// another node leads the group.
    fn not_submitted(&self, group: &Group, why: String) -> ForwardError {
        match self.leader(group) {
            Some(l) if l != self.config.node_id => ForwardError::NotLeader { leader: Some(l) },
            _ => ForwardError::Unavailable(why),
        }
    }

    /// A forwarded batch: decide it here if this node leads the group, within `within` of
    /// now (the sender's deadline; `None` from a member of an older build: `write_timeout`).
    /// Past it, the sender has answered its caller and gone: nothing waits for the answer,
    /// and the peer server's handler slot this holds is let go.
    pub async fn decide_forwarded(
        &self,
        group: GroupId,
        commands: Vec<Command>,
        fast: bool,
        within: Option<Duration>,
    ) -> Result<Vec<Applied>, ForwardError> {
        let Some(g) = self.groups.get(group as usize).cloned() else {
            return Err(ForwardError::Unavailable(format!("no shard {group}")));
        };
        let leader = self.leader(&g);
        if leader != Some(self.config.node_id) {
            return Err(ForwardError::NotLeader { leader });
        }
        // At most `write_timeout`, what `propose` waits (a garbled deadline holds no slot
        // for longer); none left: not queued at all.
        let within = within.map_or(self.config.write_timeout, |w| {
            w.min(self.config.write_timeout)
        });
        if within.is_zero() {
            return Err(ForwardError::Unavailable(
                "the sender's deadline passed".into(),
            ));
        }
        let deadline = self.deadline_in(within);
        match tokio::time::timeout(within, self.propose(&g, commands, fast, deadline)).await {
            Ok(result) => result,
            Err(_) => Err(ForwardError::Unknown(format!(
                "no answer within {within:?}"
            ))),
        }
    }

    /// This node's monotonic time `d` from now (ns), saturating.
    fn deadline_in(&self, d: Duration) -> Nanos {
        let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.clock.monotonic().saturating_add(d)
    }

    /// The policy's `on_unavailable` answer for each command; except that a check with a
    /// request id is never denied here: under `deny`, and under `local` when the local share
    /// would deny, it is `Applied::Unknown`. A denial tells its caller that nothing was
    /// spent, and a caller retries a denial under a new id (the id's first answer is kept, a
    /// denial too); but this attempt (sent to a leader that did not answer) or an earlier one
    /// under the same id (whose answer was lost) may have been admitted, and the retry would
    /// spend again. An admission (`allow`, or `local` within the share) is not retried.
    fn fallback(&self, group: &Group, commands: &[Command]) -> Vec<Applied> {
        let members = local_sharers(
            group.raft.metrics().borrow().membership_config.membership(),
            self.config.node_id,
        );
        let now = self.clock.monotonic();
        commands
            .iter()
            .map(|c| match c {
                Command::Check {
                    key,
                    limit,
                    cost,
                    on_full,
                    request_id,
                } => {
                    // A cost above the limit's capacity is refused whatever the shard's
                    // state, so this answer is the shard's own, under every rule: not
                    // `allow`'s admission, nor an unknown outcome for a retry to repeat.
                    if *cost > limit.capacity() {
                        return Applied::Decided {
                            decision: Decision::never(limit.capacity()),
                            replayed: false,
                            fallback: Fallback::No,
                            at: now,
                            epoch: 0,
                        };
                    }
                    let decision = match on_full {
                        OnUnavailable::Local => {
                            let share = limit.share(members);
                            let batch = Batch {
                                time: now,
                                commands: vec![Command::Check {
                                    key: key.clone(),
                                    limit: share,
                                    cost: *cost,
                                    request_id: None,
                                    on_full: OnUnavailable::Deny,
                                }],
                                later: Vec::new(),
                                epoch: 0,
                            };
                            // A denial spends nothing of the share (denials change no
                            // state), so one with a request id can become `Unknown` below.
                            match lock(&group.local).apply(&batch).pop() {
                                // The share's capacity is part of the limit's: a cost above
                                // it (but within the limit's, as above) the shard could
                                // admit, so this is "not now", not "never".
                                Some(Applied::Decided { decision, .. })
                                    if decision.outcome != Outcome::Never =>
                                {
                                    decision
                                }
                                _ => Decision::unavailable(limit.capacity(), false),
                            }
                        }
                        other => {
                            Decision::unavailable(limit.capacity(), *other == OnUnavailable::Allow)
                        }
                    };
                    if request_id.is_some() && decision.outcome == Outcome::Denied {
                        // Counted by the service, which answers it (`settle_unknown`).
                        return Applied::Unknown;
                    }
                    if let Some(sink) = &self.config.hooks.fallback {
                        sink(&FallbackAnswer {
                            node: self.config.node_id,
                            incarnation: self.config.incarnation,
                            key,
                            limit,
                            cost: *cost,
                            request_id: request_id.as_deref(),
                            rule: *on_full,
                            allowed: decision.allowed(),
                            at: now,
                        });
                    }
                    let label = match on_full {
                        OnUnavailable::Deny => "deny",
                        OnUnavailable::Allow => "allow",
                        OnUnavailable::Local => "local",
                    };
                    self.metrics.unavailable.with_label_values(&[label]).inc();
                    Applied::Decided {
                        decision,
                        replayed: false,
                        fallback: Fallback::Unavailable,
                        at: now,
                        epoch: 0,
                    }
                }
                Command::Refund { .. } => Applied::Refunded,
                Command::Evict => {
                    let n = lock(&group.local).apply(&Batch {
                        time: now,
                        commands: vec![Command::Evict],
                        later: Vec::new(),
                        epoch: 0,
                    });
                    n.into_iter().next().unwrap_or(Applied::Evicted(0))
                }
            })
            .collect()
    }

    /// Handles one peer request (from the peer transport's server).
    pub async fn handle(&self, from: NodeId, body: &[u8]) -> Vec<u8> {
        // bincode writes the variant's index first, in one byte below 251 (`rpc::is_bulk`).
        let refused = &self.config.refuse_requests;
        if !refused.is_empty() && body.first().is_some_and(|v| refused.contains(v)) {
            let why = "unknown variant (refused by --test-refuse-peer-requests)".into();
            return super::rpc::encode(&PeerResponse::Refused(why));
        }
        let request: PeerRequest = match super::rpc::decode(body) {
            Ok(r) => r,
            Err(e) => return super::rpc::encode(&PeerResponse::Refused(e)),
        };
        let group = |g: GroupId| self.groups.get(g as usize).cloned();
        // A node removed from a group runs on until it is stopped: it forwards its clients'
        // checks to the leader it knew, and campaigns once it hears from no leader. A member
        // that has applied the removal refuses both, which tells the node it is out (see
        // `PeerResponse::Removed`): it is not to decide the shard's checks, nor to count in
        // its elections. (Read from the applied ids' copy, without the state's lock.)
        let removed = |g: GroupId, kind: &str| {
            // (Not `group(g)`: no Arc clone on the path of every forwarded check.)
            let out = self
                .groups
                .get(g as usize)
                .is_some_and(|gr| gr.info.removed.load().contains(&from));
            if out {
                self.metrics
                    .removed_refusals
                    .with_label_values(&[kind])
                    .inc();
            }
            out
        };
        let response = match request {
            PeerRequest::Vote { group: g, .. } if removed(g, "vote") => PeerResponse::Removed,
            PeerRequest::Forward { group: g, .. } | PeerRequest::ForwardWithin { group: g, .. }
                if removed(g, "forward") =>
            {
                PeerResponse::Removed
            }
            PeerRequest::Append { group: g, rpc } => match group(g) {
                Some(gr) => PeerResponse::Append(gr.raft.append_entries(rpc).await),
                None => PeerResponse::Refused(format!("no shard {g}")),
            },
            PeerRequest::Vote { group: g, rpc } => match group(g) {
                Some(gr) => PeerResponse::Vote(gr.raft.vote(rpc).await),
                None => PeerResponse::Refused(format!("no shard {g}")),
            },
            PeerRequest::Snapshot { group: g, rpc } => match group(g) {
                Some(gr) => PeerResponse::Snapshot(self.receive_chunk(&gr, rpc).await),
                None => PeerResponse::Refused(format!("no shard {g}")),
            },
            PeerRequest::Members { group: g, change } => match group(g) {
                Some(gr) => PeerResponse::Members(self.change_group(&gr, &change).await),
                None => PeerResponse::Refused(format!("no shard {g}")),
            },
            PeerRequest::Forward {
                group: g,
                commands,
                fast,
            } => PeerResponse::Forward(self.decide_forwarded(g, commands, fast, None).await),
            PeerRequest::ForwardWithin {
                group: g,
                commands,
                fast,
                within_us,
            } => {
                let within = Some(Duration::from_micros(within_us));
                PeerResponse::Forward(self.decide_forwarded(g, commands, fast, within).await)
            }
            PeerRequest::ForwardMany { fast, items } => {
                // Each item as a call of its own; the answer waits for the last.
                let removed = &removed;
                let decide = |item: ForwardItem| async move {
                    if removed(item.group, "forward") {
                        return ForwardAnswer::Removed;
                    }
                    let within = Some(Duration::from_micros(item.within_us));
                    let commands = item.commands;
                    let decided = self.decide_forwarded(item.group, commands, fast, within);
                    ForwardAnswer::Decided(decided.await)
                };
                let answers = futures::future::join_all(items.into_iter().map(decide)).await;
                PeerResponse::ForwardMany(answers)
            }
            PeerRequest::RespAddr => PeerResponse::RespAddr(self.resp_addr.get().copied()),
            PeerRequest::Lag => PeerResponse::Lag(self.led_lag()),
            PeerRequest::Handover {
                group: g,
                vote,
                elect,
            } => match group(g) {
                Some(gr) => PeerResponse::Handover(self.take_handover(&gr, vote, elect).await),
                None => PeerResponse::Refused(format!("no shard {g}")),
            },
        };
        super::rpc::encode(&response)
    }

    /// Every group's Raft state as this node sees it, without the state digests.
    pub fn status(&self) -> Vec<GroupStatus> {
        self.status_with(false)
    }

    /// [`Cluster::status`]; with `digests`, every shard's applied state is hashed too
    /// (`ShardState::digest`, under the state's lock: the shard's applies wait for it).
    pub fn status_with(&self, digests: bool) -> Vec<GroupStatus> {
        self.groups
            .iter()
            .map(|g| {
                let m = g.raft.metrics().borrow().clone();
                let last = m.last_log_index.unwrap_or(0);
                let lag = m
                    .replication
                    .as_ref()
                    .map(|r| {
                        r.iter()
                            .filter(|(id, _)| **id != self.config.node_id)
                            .map(|(id, matched)| {
                                (*id, last.saturating_sub(matched.map_or(0, |l| l.index)))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let removed = g.info.removed.load().iter().copied().collect();
                let this_node_removed = g.removed.is_known();
                let lag_from = m.replication.is_some().then_some(self.config.node_id);
                GroupStatus {
                    shard: g.id,
                    state: format!("{:?}", m.state),
                    leader: known_leader(&m),
                    voters: m.membership_config.membership().voter_ids().collect(),
                    learners: m.membership_config.membership().learner_ids().collect(),
                    removed,
                    this_node_removed,
                    term: m.current_term,
                    last_log_index: last,
                    purged_index: m.purged.map_or(0, |l| l.index),
                    commit_index: m.last_applied.map_or(0, |l| l.index),
                    applied_index: g.info.applied.load(Ordering::Relaxed),
                    lag,
                    lag_from,
                    keys: g.info.keys.load(Ordering::Relaxed),
                    shard_time_ns: g.info.time.load(Ordering::Relaxed),
                    snapshots: g.info.snapshots.load(Ordering::Relaxed),
                    snapshots_installed: g.info.installed.load(Ordering::Relaxed),
                    early_purges: g.info.early_purges.load(Ordering::Relaxed),
                    entries_proposed: g.proposed.load(Ordering::Relaxed),
                    digest: digests.then(|| format!("{:016x}", lock(&g.info_state).digest())),
                }
            })
            .collect()
    }

    /// Each follower's lag in every group this node leads (a `PeerRequest::Lag`'s answer).
    fn led_lag(&self) -> Vec<(GroupId, BTreeMap<NodeId, u64>)> {
        self.status_with(false)
            .into_iter()
            .filter(|g| g.lag_from == Some(self.config.node_id))
            .map(|g| (g.shard, g.lag))
            .collect()
    }

    /// Fills in the lag of the shards in `groups` (this node's status) that another member
    /// leads, asking each such leader once, all at once, for up to a second (or
    /// `forward_timeout`, if shorter): a status shows every shard's lag from whichever
    /// member is asked. One round at a time, so a flood of statuses asks no more; one that
    /// waits a round's time for its turn gives up. A leader that does not answer (or an
    /// older build, which refuses the request) leaves its shards' lag empty.
    pub async fn fill_lag(&self, groups: &mut [GroupStatus]) {
        let mut leaders: Vec<NodeId> = groups
            .iter()
            .filter(|g| g.lag_from.is_none())
            .filter_map(|g| g.leader)
            .filter(|l| *l != self.config.node_id)
            .collect();
        leaders.sort_unstable();
        leaders.dedup();
        if leaders.is_empty() {
            return;
        }
        let wait = self.config.forward_timeout.min(LAG_WAIT);
        // A status that waits longer than a round for the round under way leaves the lag
        // empty: concurrent statuses then take at most two rounds' time each.
        let Ok(_one_round) = tokio::time::timeout(wait, self.lag_asking.lock()).await else {
            return;
        };
        let asked = futures::future::join_all(leaders.into_iter().map(|leader| async move {
            let answer = ask(&*self.transport, leader, &PeerRequest::Lag, wait).await;
            (leader, answer)
        }))
        .await;
        for (leader, answer) in asked {
            let Ok(PeerResponse::Lag(led)) = answer else {
                continue;
            };
            for (shard, lag) in led {
                // Only where this node takes it for the leader too: figures of a leadership
                // this node does not know of would sit beside the wrong leader.
                if let Some(g) = groups
                    .iter_mut()
                    .find(|g| g.shard == shard && g.leader == Some(leader))
                {
                    g.lag = lag;
                    g.lag_from = Some(leader);
                }
            }
        }
    }

    /// Every group's applied index and state digest (`ShardState::digest`), for comparing
    /// replicas once they have applied the same log (the simulation's agreement check).
    pub fn digests(&self) -> Vec<(GroupId, u64, u64)> {
        self.groups
            .iter()
            .map(|g| {
                let state = lock(&g.info_state);
                (g.id, g.info.applied.load(Ordering::Relaxed), state.digest())
            })
            .collect()
    }

    /// Copies every group's Raft state into the metrics (called every second).
    pub fn publish_metrics(&self) {
        let failed: Vec<GroupId> = self.failed_groups().into_iter().map(|f| f.0).collect();
        for g in self.status_with(false) {
            let shard = g.shard.to_string();
            let l = [shard.as_str()];
            self.metrics
                .raft_term
                .with_label_values(&l)
                .set(g.term as i64);
            self.metrics
                .raft_leader
                .with_label_values(&l)
                .set((g.leader == Some(self.config.node_id)) as i64);
            self.metrics
                .raft_applied
                .with_label_values(&l)
                .set(g.applied_index as i64);
            self.metrics
                .raft_entries_proposed
                .with_label_values(&l)
                .set(g.entries_proposed as i64);
            self.metrics
                .raft_follower_lag
                .with_label_values(&l)
                .set(g.lag.values().copied().max().unwrap_or(0) as i64);
            self.metrics
                .raft_group_failed
                .with_label_values(&l)
                .set(failed.contains(&g.shard) as i64);
            self.metrics.keys.with_label_values(&l).set(g.keys as i64);
        }
    }

    /// Forgets the denials learned from other leaders (the policies changed).
    pub fn policies_changed(&self) {
        self.denials.clear();
    }

    /// Stops every group's Raft node.
    pub async fn shutdown(&self) {
        for g in &self.groups {
            let _ = g.raft.shutdown().await;
            g.proposer.wake.notify_one();
        }
    }
}

/// The leader's speculative state for `consistency = "fast"`: the committed state plus
/// every entry this leader has submitted in `term` and the parts of the open entry, so it
/// answers as the log will.
struct Speculative {
    term: u64,
    state: ShardState,
}

/// The next entry while the pipeline is full: taken from the lane run by run, each run a
/// part of the batch decided at its own shard time, its fast callers answered at once.
struct Open {
    term: u64,
    batch: Batch,
    replies: Replies<oneshot::Sender<Result<Vec<Applied>, Proposal>>>,
}

impl Open {
    /// Commands the next entry may still take (`batch_max` without an open entry).
    fn room(open: &Option<Open>, batch_max: usize) -> usize {
        open.as_ref().map_or(batch_max, |o| {
            batch_max.saturating_sub(o.batch.commands.len())
        })
    }
}

/// The leader-side batcher of one group: see the module doc.
async fn propose_loop(cluster: Arc<Cluster>, group: Arc<Group>) {
    let mut time: Option<(u64, ShardTime)> = None;
    let mut spec: Option<Speculative> = None;
    let pipeline = cluster.config.pipeline.max(1);
    let batch_max = cluster.config.batch_max.max(1);
    let linger = cluster.config.batch_linger;
    let lane = &group.proposer.lane;
    // The lease: a majority acknowledged an entry proposed at `lease_from`, so no other
    // leader can be elected before `lease_from + election_min` (followers do not vote while
    // they hear from a leader). 80% of that, for clock-rate differences between nodes.
    let lease_ns = (cluster.config.election_min.as_nanos() as u64).saturating_mul(8) / 10;
    // Negative control only (see `hooks`): every caller answered early, lease or not.
    let unsafe_early = cluster.config.hooks.unsafe_answer_before_commit;
    let mut open: Option<Open> = None;
    // A term in which this node began a handover of its leadership: it answers no fast check
    // early for the rest of it (the voters waived its lease, see `run_handover`). None at the
    // start: a node never leads a term it led before a restart (its log store hands openraft
    // its own committed vote as not committed, `NodeLog::group_after_snapshots`), so no
    // waiver given before the restart can stand in a term it leads.
    let mut no_early_term: u64 = 0;
    // Fast-only entries: proposed no sooner than `fast_linger` after the last entry, unless
    // they hold `fast_batch` commands (see the wait below). At most half the lease: a hold
    // that outlasted it would leave the next fast callers unanswerable early (the lease
    // runs from the last committed entry's proposal).
    let fast_linger = u64::try_from(cluster.config.fast_linger.as_nanos())
        .unwrap_or(u64::MAX)
        .min(lease_ns / 2);
    let fast_batch = cluster.config.fast_batch.clamp(1, batch_max);
    // Whether this leader's lease holds for answers in `term`: a majority acknowledged an
    // entry proposed less than `lease_ns` ago, and no waiver of it stands (`no_early_term`).
    let lease_holds = |term: u64, no_early_term: u64| -> bool {
        let lease_from = group.lease_from.load(Ordering::SeqCst);
        unsafe_early
            || (lease_from > 0
                && cluster.clock.monotonic().saturating_sub(lease_from) < lease_ns
                && no_early_term != term)
    };
    // Whether fast callers taken now would be answered at once: this node leads, its
    // speculative copy is of the current term and still the log's, and the lease holds.
    // Without pipeline room only then are they taken (`take_fast`), into the open entry: a
    // caller there waits for the pipeline however long, past its deadline (it would be
    // decided after its caller had the `on_unavailable` answer). Any other caller waits in
    // the lane, and its deadline is checked when it is taken (`drop_expired`).
    let early_now = |spec: &Option<Speculative>, no_early_term: u64| -> bool {
        let term = {
            let m = group.raft.metrics();
            let m = m.borrow();
            if m.state != ServerState::Leader {
                return false;
            }
            m.current_term
        };
        spec.as_ref().is_some_and(|s| s.term == term)
            && !group.spec_failed.load(Ordering::SeqCst)
            && lease_holds(term, no_early_term)
    };
    // Whether a caller waits in the lane that the open entry cannot take now: a strict one,
    // or a fast one that would not be answered at once or does not fit.
    let lane_blocks = |open: &Option<Open>, spec: &Option<Speculative>, no_early_term| {
        lane.any_strict()
            || (lane.any_fast()
                && !(lane.fast_fits(Open::room(open, batch_max)) && early_now(spec, no_early_term)))
    };
    // How much longer `open` is held by the fast linger: `None` if it is not (there is
    // none, a caller in it waits for the commit, it is full enough, a caller waits that it
    // cannot take, or `fast_linger` has passed since the last entry was proposed at
    // `last_proposed`).
    let hold_for = |open: &Option<Open>,
                    last_proposed: Nanos,
                    spec: &Option<Speculative>,
                    no_early_term: u64|
     -> Option<Nanos> {
        let o = open.as_ref()?;
        if fast_linger == 0
            || !o.replies.all_answered()
            || o.batch.commands.len() >= fast_batch
            || group.handover_asked.load(Ordering::Relaxed)
            || lane_blocks(open, spec, no_early_term)
        {
            return None;
        }
        let until = last_proposed.saturating_add(fast_linger);
        let now = cluster.clock.monotonic();
        (now < until).then(|| until - now)
    };
    let mut last_proposed: Nanos = 0;
    // Callers and commands of the last round's entry (0 if it proposed none): what a
    // lingering entry waits for; and the callers of the entry before it.
    let mut last_entry = (0usize, 0usize);
    let mut callers_before = 0usize;
    loop {
        // Wait for work: callers, taken into a new entry when the pipeline has room; with
        // it full, fast callers that are answered at once into the open entry (`early_now`;
        // every other caller waits in the lane, so the next entry gathers everything that
        // arrives meanwhile); or room for the open entry.
        //
        // An open entry whose callers were all answered early (fast checks) is held, pipeline
        // room or not, until `fast_linger` has passed since the last entry was proposed or it
        // holds `fast_batch` commands: no caller waits for it, and every entry costs each
        // replica a WAL append, a share of an fsync and replication messages whatever it
        // carries, so under fast load fewer, larger entries cost less CPU per decision
        // (docs/benchmarks.md). Fast callers arriving meanwhile join it. A caller in the lane
        // that it cannot take (a strict one, or a fast one not answered at once) ends the
        // wait. At light load the last entry is long past: no wait.
        //
        // A handover asked of the proposer takes no callers: the open entry, if any, is
        // proposed, and then the handover runs (below).
        let permit = loop {
            let handing_over = group.handover_asked.load(Ordering::Relaxed);
            if handing_over && open.is_none() {
                break None;
            }
            let hold = hold_for(&open, last_proposed, &spec, no_early_term);
            let permit = if hold.is_none() {
                group.proposer.inflight.clone().try_acquire_owned().ok()
            } else {
                None
            };
            let waiting = !lane.is_empty() && !handing_over;
            if permit.is_some() && (waiting || open.is_some()) {
                break permit;
            }
            let room = Open::room(&open, batch_max);
            if waiting && room > 0 && lane.fast_fits(room) && early_now(&spec, no_early_term) {
                break None;
            }
            drop(permit);
            if let Some(left) = hold {
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep(Duration::from_nanos(left)) => {}
                    _ = group.proposer.wake.notified() => {}
                }
            } else if waiting || open.is_some() {
                tokio::select! {
                    biased; // room first; and no draw from the runtime's RNG
                    p = group.proposer.inflight.clone().acquire_owned() => match p {
                        Ok(p) => break Some(p),
                        Err(_) => return stop(lane, open, "the proposer stopped"),
                    },
                    _ = group.proposer.wake.notified() => {}
                }
            } else {
                group.proposer.wake.notified().await;
            }
            if group.raft.metrics().borrow().running_state.is_err() {
                return stop(lane, open, "raft stopped");
            }
        };
        if open.is_none() && group.handover_asked.load(Ordering::SeqCst) {
            drop(permit);
            // The flag first: an ask made after the take sets it again.
            group.handover_asked.store(false, Ordering::SeqCst);
            let asked = lock(&group.handover).take();
            if let Some(HandoverAsk { to, reply, .. }) = asked {
                spec = None;
                let result = run_handover(&cluster, &group, to, &mut no_early_term).await;
                cluster.handed_over(&group, to, &result);
                let _ = reply.send(result);
            }
            last_entry = (0, 0);
            callers_before = 0;
            continue;
        }
        // Under load (the last round's entry held several callers), a strict-only lane with
        // the pipeline empty lingers: callers the last commit answered come back within a
        // round trip, and without the wait they miss this entry for the next one. It waits
        // until the lane holds as many callers or commands as that entry, a fast caller
        // arrives, or `batch_linger` has passed (rounded up to the runtime timer's
        // millisecond tick). It takes two entries in a row of two or more callers: at light
        // load one caller per entry is the rule and two the chance. Nor does a round after
        // one that proposed nothing wait (a flood of denials, answered at once).
        let (callers, commands) = last_entry;
        let loaded = callers.min(callers_before) >= 2;
        let want = commands.min(batch_max) as u64;
        let empty = group.proposer.inflight.available_permits() + 1 >= pipeline;
        if permit.is_some()
            && open.is_none()
            && loaded
            && empty
            && !linger.is_zero()
            && group.raft.metrics().borrow().state == ServerState::Leader
        {
            let until = tokio::time::sleep(linger);
            tokio::pin!(until);
            while lane.len() < callers && lane.queued() < want && !lane.any_fast() {
                tokio::select! {
                    biased;
                    _ = &mut until => break,
                    _ = group.proposer.wake.notified() => {}
                }
                if group.raft.metrics().borrow().running_state.is_err() {
                    return stop(lane, open, "raft stopped");
                }
            }
        }
        let room = Open::room(&open, batch_max);
        let pending = if room == 0 || group.handover_asked.load(Ordering::Relaxed) {
            Vec::new()
        } else if permit.is_some() {
            lane.take(room)
        } else if early_now(&spec, no_early_term) {
            lane.take_fast(room)
        } else {
            Vec::new()
        };
        let pending = drop_expired(&cluster, pending);
        let (term, is_leader, caught_up) = {
            let m = group.raft.metrics();
            let m = m.borrow();
            // This term's first entry applied: everything committed before it is too.
            let applied_term = m.last_applied.map(|l| l.leader_id.term);
            (
                m.current_term,
                m.state == ServerState::Leader,
                applied_term == Some(m.current_term),
            )
        };
        if !is_leader {
            spec = None;
            last_entry = (0, 0);
            callers_before = 0;
            for p in pending {
                answer(
                    p.reply,
                    Err(Proposal::NotSubmitted("not the leader".into())),
                );
            }
            abandon(open.take(), "not the leader");
            continue;
        }
        // The entry carries this term's shard time: if the term changed while it was open,
        // it is not proposed.
        if open.as_ref().is_some_and(|o| o.term != term) {
            spec = None;
            abandon(
                open.take(),
                "the term changed before the entry was proposed",
            );
        }
        // A new term: continue the shard time from what this node has applied.
        if time.as_ref().is_none_or(|(t, _)| *t != term) {
            let base = group.info.time.load(Ordering::Relaxed);
            time = Some((term, ShardTime::new(cluster.clock.clone(), base)));
        }
        let now = time.as_mut().map_or(0, |(_, t)| t.now());
        // A new leader that has not applied everything committed yet would deny on an old
        // state at an old time (and with too long a retry_after): it proposes them instead.
        let pending = if caught_up {
            deny_at_once(&group.info_state, pending, now)
        } else {
            pending
        };
        let any_fast = pending.iter().any(|p| p.fast);
        // The speculative state is (re)built only with nothing else in flight or open,
        // after the state machine has applied everything committed before this term's
        // entries and every entry in this node's log (`log_applied`, a second guard: a
        // leader restored in its own term held older ones, before the log store handed
        // openraft a restarted node's own vote as not committed): then the committed
        // state plus what follows is exactly what the log will say.
        let idle = open.is_none()
            && group.proposer.inflight.available_permits() + usize::from(permit.is_some())
                >= pipeline;
        if spec.as_ref().is_some_and(|s| s.term != term) {
            spec = None;
        }
        if spec.is_none()
            && any_fast
            && idle
            && linearizable(&group, cluster.config.unavailable_after).await
            && log_applied(&group, cluster.config.unavailable_after).await
        {
            spec = Some(Speculative {
                term,
                state: lock(&group.info_state).share(),
            });
        }
        // The waits above (up to `unavailable_after` each) may have outlived deadlines.
        let pending = drop_expired(&cluster, pending);
        // An entry the copy assumed has failed (its answer may come while an entry is
        // open): the copy is no longer the log's.
        if group.spec_failed.swap(false, Ordering::SeqCst) {
            spec = None;
        }
        // The lease as of the answers, after the waits above (up to `unavailable_after` for
        // a rebuilt copy, which can be longer than the lease).
        let lease = lease_holds(term, no_early_term);
        if permit.is_none() && !(lease && spec.is_some()) {
            // Fast callers taken for the open entry that cannot be answered at once after
            // all (the lease lapsed or the copy failed since `early_now`): not to wait in it
            // for the pipeline, past their deadline. Nothing was decided; they ask again.
            for p in pending {
                answer(
                    p.reply,
                    Err(Proposal::NotSubmitted(
                        "no pipeline room, and no early answer".into(),
                    )),
                );
            }
        } else if !pending.is_empty() {
            // (Nothing to add if every caller was denied at once or waited past its deadline.)
            let mut replies = Replies::with_capacity(pending.len());
            let mut commands = Vec::new();
            for p in pending {
                replies.add(p.commands.len(), p.fast, p.reply);
                commands.extend(p.commands);
            }
            let mut part = Batch::at(now, commands);
            part.epoch = epoch(cluster.config.incarnation, term);
            let guessed = spec.as_mut().map(|s| s.state.apply(&part));
            // Fast callers are answered now, from the speculative state, while the lease
            // holds (a leader cut off from its majority stops answering early within a
            // lease): whether the entry is proposed now or stays open until the pipeline
            // has room, so a fast check does not wait for the entry ahead to commit. Their
            // admissions are in this entry; a crash before it commits forgets them, as it
            // forgets the entries in flight (the over-admission bound, docs/semantics.md).
            if let (Some(results), true) = (guessed, lease) {
                replies.answer_early(results, answer);
            }
            match &mut open {
                Some(o) => {
                    // One term, so one epoch: an open entry of another term was dropped.
                    debug_assert_eq!(o.batch.epoch, part.epoch);
                    o.batch.push_part(now, part.commands);
                    o.replies.append(replies);
                }
                None => {
                    open = Some(Open {
                        term,
                        batch: part,
                        replies,
                    })
                }
            }
        }
        // Without room in the pipeline the entry stays open for the next callers; and with
        // room, if the fast linger holds it (it just took its first callers): the wait above.
        let Some(permit) = permit else { continue };
        if hold_for(&open, last_proposed, &spec, no_early_term).is_some() {
            continue;
        }
        let Some(Open {
            term,
            batch,
            replies,
        }) = open.take()
        else {
            last_entry = (0, 0);
            callers_before = 0;
            continue; // every caller was denied at once
        };
        callers_before = last_entry.0;
        last_entry = (replies.len(), batch.commands.len());
        // The lease runs from here: the followers hear of the entry after this instant.
        let proposed_at = cluster.clock.monotonic();
        last_proposed = proposed_at;
        let submitted = if group.raft.metrics().borrow().current_term == term {
            group.proposed.fetch_add(1, Ordering::Relaxed);
            group
                .raft
                .client_write_ff(Arc::new(batch))
                .await
                .map_err(|e| e.to_string())
        } else {
            Err("the term changed before the entry was proposed".to_string())
        };
        if submitted.is_err() {
            spec = None;
        }
        let failed = group.spec_failed.clone();
        let lease_from = group.lease_from.clone();
        tokio::spawn(async move {
            let result: Result<Applies, Proposal> = match submitted {
                Ok(rx) => match rx.await {
                    Ok(Ok(resp)) => Ok(resp.data),
                    Ok(Err(e)) => Err(Proposal::Lost(e.to_string())),
                    Err(_) => Err(Proposal::Lost("raft dropped the entry".into())),
                },
                Err(why) => Err(Proposal::NotSubmitted(why)),
            };
            // Before the pipeline slot is freed, so the proposer sees them when it has room.
            if result.is_ok() {
                lease_from.fetch_max(proposed_at, Ordering::SeqCst);
            } else {
                // The speculative state assumed this entry: it is no longer the log's.
                failed.store(true, Ordering::SeqCst);
            }
            drop(permit);
            match result {
                Ok(Applies(applied)) => replies.complete(Ok(applied), answer),
                Err(why) => replies.complete(Err(why), answer),
            }
        });
        if group.spec_failed.swap(false, Ordering::SeqCst) {
            spec = None;
        }
    }
}

/// Hands `group`'s leadership to the voter `to`; run by the group's proposer, which takes no
/// callers meanwhile (they wait in its lane, and once the leadership has moved are sent to
/// the new leader). openraft 0.9 has no leadership transfer, and a voter that heard from the
/// leader within its lease refuses to vote, so:
/// 1. every entry in flight completes (the proposer holds the whole pipeline);
/// 2. `to` acknowledges this node's whole log, so it wins the vote of any voter;
/// 3. this node and the other voters waive the lease of this leadership (openraft patch,
///    `Trigger::waive_lease`: for one lease, and only while their vote is this one); it
///    takes `to` and enough of them for a majority;
/// 4. `to` calls an election, which every voter that waived grants (this node too, which
///    steps down);
/// 5. the leadership moves within two election timeouts, or the handover failed.
///
/// Before its own waiver, it names the waived leadership's term in `no_early_term`: the
/// proposer answers no fast check early for the rest of that term, since its fast lease
/// assumes that no voter votes within it, which the waiver undoes. A handover that fails
/// after that leaves this node the leader, answering fast checks only on commit.
///
/// The waivers and the election are asked with a short timeout (half the minimum election
/// timeout each): a waiver lasts one lease (the maximum election timeout), and the target's
/// vote requests must reach the voters within it.
async fn run_handover(
    cluster: &Cluster,
    group: &Group,
    to: NodeId,
    no_early_term: &mut u64,
) -> Result<(), String> {
    let me = cluster.config.node_id;
    let pipeline = u32::try_from(cluster.config.pipeline.max(1)).unwrap_or(u32::MAX);
    let _pipeline = tokio::time::timeout(
        cluster.config.write_timeout,
        group.proposer.inflight.clone().acquire_many_owned(pipeline),
    )
    .await
    .map_err(|_| "the entries in flight did not complete in time".to_string())?
    .map_err(|_| "the proposer stopped".to_string())?;
    let (vote, voters, last) = {
        let m = group.raft.metrics();
        let m = m.borrow();
        if m.state != ServerState::Leader {
            return Err("this node does not lead the shard".into());
        }
        let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
        (m.vote, voters, m.last_log_index)
    };
    if to == me || !voters.contains(&to) {
        return Err(format!("node {to} is not another voter of the shard"));
    }
    let holds_log = |m: &openraft::RaftMetrics<NodeId, BasicNode>| {
        m.vote != vote
            || m.replication
                .as_ref()
                .and_then(|r| r.get(&to).copied().flatten())
                .is_some_and(|l| Some(l.index) >= last)
    };
    let held = group
        .raft
        .wait(Some(cluster.config.election_min))
        .metrics(holds_log, "the new leader to hold the log")
        .await
        .map_err(|e| format!("node {to} does not hold the whole log: {e}"))?;
    if held.vote != vote {
        return Err("the leadership changed meanwhile".into());
    }
    // This node's own waiver: as a voter's (which also checks the vote still stands).
    *no_early_term = vote.leader_id().term;
    cluster.take_handover(group, vote, false).await?;
    let quick = cluster.config.election_min / 2;
    let waive = |id: NodeId| {
        let request = PeerRequest::Handover {
            group: group.id,
            vote,
            elect: false,
        };
        async move {
            let r = ask(&*cluster.transport, id, &request, quick).await;
            matches!(r, Ok(PeerResponse::Handover(Ok(()))))
        }
    };
    let others = voters.iter().copied().filter(|v| *v != me && *v != to);
    let waived = futures::future::join_all(others.map(waive))
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count();
    // This node and `to` vote for `to`, and so does every voter that waived.
    if 2 + waived <= voters.len() / 2 {
        return Err(format!(
            "{waived} of the other {} voters waived the lease: not a majority",
            voters.len() - 2
        ));
    }
    let request = PeerRequest::Handover {
        group: group.id,
        vote,
        elect: true,
    };
    let asked = cluster.clock.monotonic();
    match ask(&*cluster.transport, to, &request, quick).await {
        Ok(PeerResponse::Handover(Ok(()))) => {}
        Ok(PeerResponse::Handover(Err(why))) => return Err(format!("node {to}: {why}")),
        Ok(other) => return Err(format!("node {to}: unexpected answer {other:?}")),
        Err(e) => return Err(e.to_string()),
    }
    let term = vote.leader_id().term;
    let led = group
        .raft
        .wait(Some(cluster.config.election_max * 2))
        .metrics(
            |m| m.current_term > term && m.current_leader.is_some_and(|l| l != me),
            "a new leader",
        )
        .await
        .map(|_| ())
        .map_err(|e| format!("node {to} called an election, but: {e}"));
    if led.is_ok() {
        let gap = cluster.clock.monotonic().saturating_sub(asked);
        cluster.metrics.handover_gap.observe(gap as f64 / 1e9);
    }
    led
}

/// How many nodes share each limit under `on_unavailable = "local"`, as node `me` counts
/// them: every node `membership` names, learners too (a node being added answers its
/// clients by itself as well; divided by the voters only, N voters and a learner together
/// could admit (N+1)/N of the limit), and `me` if its copy does not name it yet (a node
/// joining, before it has the entry that adds it). A node that has not yet applied another
/// new member's entry still divides by one fewer.
fn local_sharers(membership: &openraft::Membership<NodeId, BasicNode>, me: NodeId) -> u64 {
    let named = membership.nodes().count();
    let missing = usize::from(!membership.nodes().any(|(id, _)| *id == me));
    (named + missing) as u64
}

/// Answers the callers among `pending` whose deadline has passed (`NotSubmitted`: decided
/// nothing), and returns the others. Such a caller has had its `on_unavailable` answer
/// (strict under `deny`: "denied, nothing spent"), or its sender has, and gone: deciding it
/// now would spend what its caller was told was not spent (or, under `allow` and `local`,
/// count it twice). A caller decided in time can still be answered late (its entry commits
/// after the deadline): this bounds that window by the commit, not by the time it queued.
fn drop_expired(cluster: &Cluster, pending: Vec<Pending>) -> Vec<Pending> {
    let now = cluster.clock.monotonic();
    if !pending.iter().any(|p| p.expired(now)) {
        return pending;
    }
    let (late, live): (Vec<Pending>, Vec<Pending>) =
        pending.into_iter().partition(|p| p.expired(now));
    let commands: usize = late.iter().map(|p| p.commands.len()).sum();
    cluster.metrics.checks_expired.inc_by(commands as u64);
    for p in late {
        answer(
            p.reply,
            Err(Proposal::NotSubmitted(
                "the caller's deadline passed before a decision".into(),
            )),
        );
    }
    live
}

/// The leader `m` names, or `None` once the group's Raft core has stopped (on an error,
/// such as a failed disk write): its metrics keep the last leader, this node itself if it
/// led, and the node would go on choosing itself (and advertising itself to routing
/// clients) while it can decide nothing.
fn known_leader(m: &openraft::RaftMetrics<NodeId, BasicNode>) -> Option<NodeId> {
    match m.running_state {
        Ok(()) => m.current_leader,
        Err(_) => None,
    }
}

/// Whether `group`'s leadership is confirmed by a quorum and this node has applied its
/// term's first entry (openraft's `ensure_linearizable`), within `limit`: openraft waits for
/// the apply without end, and a leader cut off before that entry committed, whose successor
/// never wrote as far, would wait for ever (and its proposer with it, should it lead again).
async fn linearizable(group: &Group, limit: Duration) -> bool {
    tokio::time::timeout(limit, group.raft.ensure_linearizable())
        .await
        .is_ok_and(|r| r.is_ok())
}

/// Whether this node has applied every entry in its log. A leader's own entries in flight are
/// known to its proposer, but a node restarted as the leader of the same term (openraft keeps
/// a committed vote across a restart) may hold entries it proposed before the restart, not
/// yet committed, after its term's first entry: `ensure_linearizable` does not wait for
/// them, and a speculative copy made before they apply would miss what they consume (found
/// by simulation seed 118 at 30 clients: a fast admission the log then denied; tested by the
/// `--quick-restarts` sweeps). Waits (up
/// to `within`) rather than testing once: the copy is built only when the proposer is idle,
/// which under steady fast load may not come again this term, and openraft's metrics may
/// trail the state machine by a moment.
async fn log_applied(group: &Group, within: Duration) -> bool {
    group
        .raft
        .wait(Some(within))
        .metrics(
            |m| m.last_applied.map(|l| l.index) >= m.last_log_index,
            "every log entry applied",
        )
        .await
        .is_ok()
}

/// Tells the callers of an entry that will not be proposed (if any) so; those answered
/// early keep their answers.
fn abandon(open: Option<Open>, why: &str) {
    if let Some(o) = open {
        o.replies
            .complete(Err(Proposal::NotSubmitted(why.into())), answer);
    }
}

/// The proposer ends: every caller still waiting, in the open entry or in the lane, is
/// told its commands were not submitted (rather than waiting out its timeout), and the
/// lane refuses later callers.
fn stop(lane: &ProposerLane<Pending>, open: Option<Open>, why: &str) {
    abandon(open, why);
    for p in lane.close() {
        answer(p.reply, Err(Proposal::NotSubmitted(why.into())));
    }
}

/// A denial changes no state, so it needs no log entry (strict or fast): each caller whose
/// every command is a check the COMMITTED state denies at `now` is answered at once, and the
/// others are returned to be proposed. The log's answer could only be a denial too: the
/// entries still in flight only consume more, at times up to `now` (the one exception, an
/// in-flight refund, can only make this a denial the log would not have given; never an
/// admission). Only once this term's first entry is applied (the caller checks), so the
/// state and its time are the log's up to there. Under a flood of denied requests on a hot
/// key, nothing reaches the log, the followers or the disk.
fn deny_at_once(state: &Mutex<ShardState>, pending: Vec<Pending>, now: Nanos) -> Vec<Pending> {
    let state = lock(state);
    let mut rest = Vec::with_capacity(pending.len());
    for p in pending {
        match state.denials(&p.commands, now) {
            Some(denied) => answer(p.reply, Ok(denied)),
            None => rest.push(p),
        }
    }
    rest
}

/// Answers one proposer caller. A caller that timed out is gone; its answer is dropped.
fn answer(
    reply: oneshot::Sender<Result<Vec<Applied>, Proposal>>,
    a: Result<Vec<Applied>, Proposal>,
) {
    let _ = reply.send(a);
}

/// The refusal of an add whose id a member already has at another address (`shard`: the
/// group whose leader refuses; none when a member refuses for every group).
fn already_a_member(id: NodeId, shard: Option<GroupId>, at: &str) -> String {
    let of = shard.map(|g| format!(" of shard {g}")).unwrap_or_default();
    format!("node {id} is already a member{of} (at {at}); a new node needs a new id")
}

/// Why ids are not given out twice, for the refusals that say so.
const NOT_REUSED: &str = "ids are not reused, so that a removed node's old state cannot come back";

/// The refusal of an add of an id that `shard` removed.
fn removed_from(id: NodeId, shard: GroupId) -> String {
    format!("node id {id} is not fresh: it was removed from shard {shard}")
}

/// A shard leader's own check of an add of node `id` at `addr` (`at`: the address its log's
/// membership has for `id`, if any), after it applied that membership: the id must not be
/// a member at another address, nor one its shard removed. (A member checks every shard
/// first, [`check_change`], from its own replicas, which may lag.)
fn leader_check_add(
    shard: GroupId,
    id: NodeId,
    addr: &str,
    at: Option<&str>,
    history: &MemberHistory,
) -> Result<(), String> {
    if let Some(at) = at.filter(|at| *at != addr) {
        return Err(already_a_member(id, Some(shard), at));
    }
    if history.removed.contains(&id) {
        return Err(format!("{} ({NOT_REUSED})", removed_from(id, shard)));
    }
    Ok(())
}

/// Whether `change` may be asked of the groups' leaders, given every node their memberships
/// name now (`known`, with addresses) and their member histories. An add needs an id no
/// membership has named, above every id one has (so a removed node's old state cannot come
/// back under its id), unless it is the same add resumed: an id some group has at the same
/// address, which no group has removed. An id that some group removed while another still
/// has it is an unfinished remove, not a resumed add: refused, naming the remove to repeat.
fn check_change(
    change: &MemberChange,
    known: &BTreeMap<NodeId, String>,
    histories: &[(GroupId, MemberHistory)],
) -> Result<(), String> {
    match change {
        MemberChange::Add { id, addr } => {
            if !crate::config::is_host_port(addr) {
                return Err(format!(
                    "peer address \"{addr}\" is not HOST:PORT (e.g. 10.0.0.4:7100 or quorate-4:7100)"
                ));
            }
            // Every id a membership has named: a member now, or removed from one.
            let highest = histories
                .iter()
                .flat_map(|(_, h)| h.removed.iter().copied())
                .chain(known.keys().copied())
                .max()
                .unwrap_or(0);
            let fresh = format!("use an id above {highest} ({NOT_REUSED})");
            if let Some((group, _)) = histories.iter().find(|(_, h)| h.removed.contains(id)) {
                let unfinished = if known.contains_key(id) {
                    format!(
                        "; other shards still have it: finish that remove first (send \
                         {{\"remove\": {{\"id\": {id}}}}} again)"
                    )
                } else {
                    String::new()
                };
                return Err(format!(
                    "{}{unfinished}; {fresh}",
                    removed_from(*id, *group)
                ));
            }
            if let Some(at) = known.get(id) {
                if at != addr {
                    return Err(already_a_member(*id, None, at));
                }
            }
            if *id == 0 || (*id <= highest && !known.contains_key(id)) {
                return Err(format!("node id {id} is not fresh: {fresh}"));
            }
        }
        MemberChange::Remove { id } => {
            if !known.contains_key(id) {
                return Err(format!(
                    "node {id} is not a member (as this member sees the shards' memberships)"
                ));
            }
        }
    }
    Ok(())
}

/// Bounds a shard's log by bytes, checked every second: openraft counts only entries
/// (`snapshot_every`, and `max_in_snapshot_log_to_keep` behind a snapshot), and an entry can
/// carry hundreds of checks. Seen: a 3-node cluster on one machine under pipelined fast load
/// held about 3,500 entries per shard and no snapshot after six million checks, each node
/// at 970 MB resident and 240 MB of log, on its way to 20,000 entries.
///
/// - A snapshot once the entries appended since the last one reach `snapshot_log_bytes`.
/// - Behind a snapshot, openraft keeps up to 1,000 entries (for a follower a little behind
///   to catch up by log; it purges in batches of 256, so up to about 1,250): fewer when they
///   would come to more than a quarter of `snapshot_log_bytes` at the entries' recent
///   average size; a leader keeps more for a follower behind, up to what all of
///   `snapshot_log_bytes` holds.
///
/// Every replica decides for itself, as openraft's own policy does.
async fn snapshot_loop(cluster: std::sync::Weak<Cluster>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Per group: the (bytes, entries) appended as of the last tick, the entries' average
    // size, and the index last asked to be purged up to.
    let mut seen: BTreeMap<GroupId, ((u64, u64), u64, u64)> = BTreeMap::new();
    loop {
        tick.tick().await;
        let Some(c) = cluster.upgrade() else { return };
        let keep_most = (c.config.snapshot_every / 2).clamp(1, 1000);
        for g in &c.groups {
            let appended = g.info.log_bytes.load(Ordering::Relaxed);
            let entries = g.info.log_entries.load(Ordering::Relaxed);
            let ((bytes_then, entries_then), per_entry, asked) =
                seen.entry(g.id).or_insert(((0, 0), 0, 0));
            if entries > *entries_then {
                let sample = appended.saturating_sub(*bytes_then) / (entries - *entries_then);
                *per_entry = match *per_entry {
                    0 => sample,
                    before => (before * 3 + sample) / 4,
                };
            }
            (*bytes_then, *entries_then) = (appended, entries);
            // Behind the snapshot both the file (durable) and openraft (its metrics) know of,
            // keeping what a quarter of `snapshot_log_bytes` holds; a leader keeps more for
            // a follower behind that (one catching up after a snapshot install needs the
            // entries after it, or it needs another snapshot), up to what all of
            // `snapshot_log_bytes` holds, so a member that is down bounds nothing.
            let upto = {
                let m = g.raft.metrics();
                let m = m.borrow();
                let snapshot = m.snapshot.as_ref().map_or(0, |l| l.index);
                let durable = g
                    .info
                    .snapshot_durable
                    .load(Ordering::Acquire)
                    .min(snapshot);
                let entries_in = |bytes: u64| match *per_entry {
                    0 => keep_most,
                    size => (bytes / size).min(keep_most),
                };
                let keep = entries_in(c.config.snapshot_log_bytes / 4);
                let keep_for_followers = entries_in(c.config.snapshot_log_bytes);
                let held = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.values().map(|l| l.as_ref().map_or(0, |l| l.index)).min());
                let held = held.map_or(u64::MAX, |h| {
                    h.max(durable.saturating_sub(keep_for_followers))
                });
                if keep < keep_most {
                    durable.saturating_sub(keep).min(held)
                } else {
                    0
                }
            };
            if upto > *asked {
                *asked = upto;
                let _ = g.raft.trigger().purge_log(upto).await;
            }
            let since =
                appended.saturating_sub(g.info.log_bytes_at_snapshot.load(Ordering::Relaxed));
            if since < c.config.snapshot_log_bytes {
                continue;
            }
            // Not again until as many more bytes, should openraft not build one now (it
            // builds one at a time); the snapshot sets the mark again when it is taken.
            g.info
                .log_bytes_at_snapshot
                .store(appended, Ordering::Relaxed);
            tracing::debug!(
                shard = g.id,
                bytes = since,
                "log bytes since the last snapshot: taking one"
            );
            // An error is a stopped group (its core failed): the others go on.
            let _ = g.raft.trigger().snapshot().await;
        }
    }
}

/// Spreads leadership: every few seconds, a node that leads a group another voter is
/// preferred for (group g prefers the voter at position g mod voters) hands the group's
/// leadership to it (`Cluster::hand_over`) once that voter holds the log and the group's leadership
/// has been settled for a while. With every node doing this the leaders settle one per
/// preferred node, also after a node returns, with any number of voters.
async fn rebalance_loop(cluster: std::sync::Weak<Cluster>) {
    let mut tick = tokio::time::interval(Duration::from_secs(3));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    // Per group: the (leader, term) last seen and since when (ns on the node's clock); and
    // until when a group whose handover failed is left alone.
    let mut seen: BTreeMap<GroupId, (Option<NodeId>, u64, u64)> = BTreeMap::new();
    let mut resting: BTreeMap<GroupId, u64> = BTreeMap::new();
    loop {
        tick.tick().await;
        let Some(c) = cluster.upgrade() else { return };
        let me = c.config.node_id;
        let now = c.clock.monotonic();
        // A leadership newer than both election timeouts is left alone: a returning node
        // that calls elections of its own (openraft 0.9 has no pre-vote) settles first.
        let settled_ns = (c.config.election_max + c.config.election_min).as_nanos() as u64;
        for g in &c.groups {
            let to = preferred(&Cluster::voters(g), g.id);
            let (leader, term, preferred_holds_log) = {
                let m = g.raft.metrics();
                let m = m.borrow();
                let last = m.last_log_index.unwrap_or(0);
                let holds = to
                    .and_then(|p| m.replication.as_ref()?.get(&p).copied().flatten())
                    .is_some_and(|l| l.index + 8 >= last);
                (known_leader(&m), m.current_term, holds)
            };
            let since = match seen.get(&g.id) {
                Some(&(l, t, since)) if l == leader && t == term => since,
                _ => {
                    seen.insert(g.id, (leader, term, now));
                    now
                }
            };
            let Some(to) = to.filter(|&to| leader == Some(me) && to != me) else {
                continue;
            };
            if resting.get(&g.id).is_some_and(|until| now < *until) {
                continue;
            }
            if preferred_holds_log && now.saturating_sub(since) > settled_ns {
                tracing::info!(
                    shard = g.id,
                    to,
                    "handing the shard's leadership to its preferred member (rebalance)"
                );
                if c.hand_over(g, to).await.is_err() {
                    // Not again for ten ticks (the member may be down: the leader's
                    // replication figures for it go stale).
                    resting.insert(g.id, now + 30 * crate::limiter::SECOND);
                }
                // One group per tick: a handover pauses the group's commits.
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_share_is_divided_among_voters_and_learners() {
        let voters = std::collections::BTreeSet::from([1, 2, 3]);
        let nodes: BTreeMap<NodeId, BasicNode> =
            (1..=4).map(|id| (id, BasicNode::default())).collect();
        let adding = openraft::Membership::new(vec![voters.clone()], nodes);
        assert_eq!(adding.voter_ids().count(), 3);
        assert_eq!(
            local_sharers(&adding, 1),
            4,
            "a learner answers by itself too"
        );
        assert_eq!(local_sharers(&adding, 4), 4);
        let three = openraft::Membership::<NodeId, BasicNode>::new(vec![voters], ());
        assert_eq!(local_sharers(&three, 2), 3);
        // A node not yet named by its copy (joining): itself as well.
        assert_eq!(local_sharers(&three, 5), 4);
        let none = openraft::Membership::<NodeId, BasicNode>::new(Vec::new(), ());
        assert_eq!(local_sharers(&none, 5), 1);
        // A joint configuration (3 to 4 voters): every node of both.
        let joint = openraft::Membership::<NodeId, BasicNode>::new(
            vec![[1, 2, 3].into(), [1, 2, 3, 4].into()],
            (),
        );
        assert_eq!(local_sharers(&joint, 4), 4);
    }

    fn known(ids: &[NodeId]) -> BTreeMap<NodeId, String> {
        ids.iter()
            .map(|id| (*id, format!("10.0.0.{id}:7100")))
            .collect()
    }

    fn history(removed: &[NodeId]) -> MemberHistory {
        MemberHistory {
            removed: removed.iter().copied().collect(),
        }
    }

    fn add(id: NodeId) -> MemberChange {
        MemberChange::Add {
            id,
            addr: format!("10.0.0.{id}:7100"),
        }
    }

    #[test]
    fn a_shard_leader_refuses_an_id_its_shard_removed_or_has_elsewhere() {
        let addr = "127.0.0.1:7104";
        assert_eq!(leader_check_add(2, 4, addr, None, &history(&[1])), Ok(()));
        // Resumed: the shard has node 4 at the same address.
        assert_eq!(
            leader_check_add(2, 4, addr, Some(addr), &history(&[])),
            Ok(())
        );
        // The member that sent the add had not seen node 4 come and go; the leader has.
        let e = leader_check_add(2, 4, addr, None, &history(&[4])).unwrap_err();
        assert!(e.contains("not fresh") && e.contains("shard 2"), "{e}");
        let e = leader_check_add(2, 4, addr, Some("10.0.0.9:7100"), &history(&[])).unwrap_err();
        assert!(
            e.contains("already a member of shard 2 (at 10.0.0.9:7100)"),
            "{e}"
        );
    }

    #[test]
    fn an_add_needs_an_id_no_shard_has_named_or_removed() {
        let three = [(0, history(&[])), (1, history(&[])), (2, history(&[]))];
        assert_eq!(check_change(&add(4), &known(&[1, 2, 3]), &three), Ok(()));
        // Resumed: shard 0 has node 4 already, at the same address, and no shard removed it.
        let resumed = [(0, history(&[])), (1, history(&[])), (2, history(&[]))];
        assert_eq!(
            check_change(&add(4), &known(&[1, 2, 3, 4]), &resumed),
            Ok(())
        );
        // Node 4 came and went while this member's own view saw none of it: the history
        // (replicated) still has it.
        let gone = [(0, history(&[4])), (1, history(&[4])), (2, history(&[4]))];
        let e = check_change(&add(4), &known(&[1, 2, 3]), &gone).unwrap_err();
        assert!(e.contains("not fresh") && e.contains("above 4"), "{e}");
        // An unfinished remove: shard 0 dropped node 4, shards 1 and 2 still have it. Not a
        // resumed add (that would put node 4 back into shard 0): finish the remove.
        let half = [(0, history(&[4])), (1, history(&[])), (2, history(&[]))];
        let e = check_change(&add(4), &known(&[1, 2, 3, 4]), &half).unwrap_err();
        assert!(
            e.contains("removed from shard 0") && e.contains(r#"{"remove": {"id": 4}}"#),
            "{e}"
        );
        // Below the highest id ever named, never a member here: not fresh either.
        let e = check_change(&add(2), &known(&[1, 3, 5]), &three).unwrap_err();
        assert!(e.contains("not fresh") && e.contains("above 5"), "{e}");
        let e = check_change(&add(0), &known(&[1, 2, 3]), &three).unwrap_err();
        assert!(e.contains("not fresh"), "{e}");
        let moved = MemberChange::Add {
            id: 3,
            addr: "10.0.0.9:7100".into(),
        };
        let e = check_change(&moved, &known(&[1, 2, 3]), &three).unwrap_err();
        assert!(e.contains("already a member"), "{e}");
        let nowhere = MemberChange::Add {
            id: 4,
            addr: "nowhere".into(),
        };
        let e = check_change(&nowhere, &known(&[1, 2, 3]), &three).unwrap_err();
        assert!(e.contains("HOST:PORT"), "{e}");
    }

    #[test]
    fn a_remove_needs_a_member() {
        let h = [(0, history(&[]))];
        assert_eq!(
            check_change(&MemberChange::Remove { id: 2 }, &known(&[1, 2, 3]), &h),
            Ok(())
        );
        let e = check_change(&MemberChange::Remove { id: 7 }, &known(&[1, 2, 3]), &h).unwrap_err();
        assert!(e.contains("not a member"), "{e}");
    }
}
