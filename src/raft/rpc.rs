//! What nodes say to each other, and openraft's network over the peer transport.
//!
//! Every message is one [`PeerRequest`] / [`PeerResponse`] encoded with bincode 2 and carried
//! as an opaque body by the peer transport (one connection per node pair, all groups
//! multiplexed on it). Decoding is bounded and never panics: a malformed body is an error.

use super::types::{GroupId, NodeId, TypeConfig};
use crate::shard::command::{Applied, Command};
use futures::future::BoxFuture;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, LogId, Vote};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A request from one node to another.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerRequest {
    Append {
        group: GroupId,
        rpc: AppendEntriesRequest<TypeConfig>,
    },
    Vote {
        group: GroupId,
        rpc: VoteRequest<NodeId>,
    },
    Snapshot {
        group: GroupId,
        rpc: InstallSnapshotRequest<TypeConfig>,
    },
    /// A membership change for `group`, sent to its leader.
    Members {
        group: GroupId,
        change: MemberChange,
    },
    /// Checks forwarded to the node believed to lead `group`.
    Forward {
        group: GroupId,
        commands: Vec<Command>,
        /// Every command may be answered before it commits (`consistency = "fast"`).
        fast: bool,
    },
    /// The RESP address the peer serves clients on (`CLUSTER NODES`). Last, so that the
    /// variants before it keep their encoding; an older member refuses it as undecodable.
    RespAddr,
    /// From `group`'s leader, handing its leadership (`vote`) over: waive the lease of that
    /// leadership for a while, and with `elect`, call an election (the receiver is the node
    /// taking over). See `cluster::run_handover`. After the variants above, for the same reason.
    Handover {
        group: GroupId,
        vote: openraft::Vote<NodeId>,
        elect: bool,
    },
    /// `Forward` with the sender's deadline: the receiver decides none of `commands` later
    /// than `within_us` microseconds after it received them (by then the sender has given
    /// its caller the `on_unavailable` answer, and a decision would spend what its caller
    /// was told was not spent). Relative, so the nodes' clocks need not agree. After the
    /// variants above, for the same reason: an older member refuses it as undecodable
    /// (decided nothing), and the sender sends a plain `Forward` instead.
    ForwardWithin {
        group: GroupId,
        commands: Vec<Command>,
        fast: bool,
        within_us: u64,
    },
    /// The checks of several callers, each item as a `ForwardWithin` of its own (decided,
    /// or refused, apart from the others): answered with one [`PeerResponse::ForwardMany`]
    /// (see `forward.rs`). After the variants above: an older member refuses it as
    /// undecodable, and the sender sends each item on its own.
    ForwardMany {
        /// Every command of every item may be answered before it commits.
        fast: bool,
        items: Vec<ForwardItem>,
    },
    /// Each follower's lag in every group the receiver leads (`quorate status` asks each
    /// shard's leader). Last, for the same reason: an older member refuses it, and the
    /// asker shows no lag for those shards.
    Lag,
}

/// One caller's forwarded checks in a [`PeerRequest::ForwardMany`].
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardItem {
    pub group: GroupId,
    pub commands: Vec<Command>,
    /// As `ForwardWithin`'s: decided no later than this long after it was received.
    pub within_us: u64,
}

/// What became of one item of a [`PeerRequest::ForwardMany`], in the items' order.
#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardAnswer {
    /// As `PeerResponse::Forward`.
    Decided(Result<Vec<Applied>, ForwardError>),
    /// As `PeerResponse::Removed`: refused unread, the sender out of the item's group.
    Removed,
}

/// A change of a group's voters, carried out by the group's leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberChange {
    /// Add a node (as a learner, caught up, then a voter).
    Add { id: NodeId, addr: String },
    /// Remove a voter.
    Remove { id: NodeId },
}

/// Why a shard's leader did not carry out a membership change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ChangeError {
    /// Not now (no leader, a timeout, a leadership that moved): the same change may succeed
    /// when tried again.
    #[error("{0}")]
    Retry(#[from] ForwardError),
    /// Not by trying again at once: the leader's shard refuses it (the id left its
    /// membership), or it went as far as it could (a new node that does not catch up). The
    /// text says what to do; it goes back to the caller as it is.
    #[error("{0}")]
    Final(String),
}

/// Why a forwarded batch was not decided by the node it was sent to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ForwardError {
    #[error("node is not the leader of this shard (leader: {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    /// Certainly not applied (not sent, or refused before it was proposed).
    #[error("shard unavailable: {0}")]
    Unavailable(String),
    /// Sent or proposed, then lost: it may still be applied.
    #[error("outcome unknown: {0}")]
    Unknown(String),
}

/// The answer to a [`PeerRequest`] of the same kind.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerResponse {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    Forward(Result<Vec<Applied>, ForwardError>),
    Members(Result<(), ChangeError>),
    /// The request could not be decoded or names a group this node does not have.
    Refused(String),
    /// The RESP address this node serves clients on (`None` before its server is bound).
    RespAddr(Option<std::net::SocketAddr>),
    /// `Err` when the receiver does not follow that leadership (or is not a voter, for
    /// `elect`).
    Handover(Result<(), String>),
    /// To a vote request or forwarded checks: the asker's id was removed from this group's
    /// membership (as the answering replica has applied it), so the request was refused
    /// unread (the checks not decided). Ids are never given out again, so the asker is out
    /// for good.
    Removed,
    /// To a `ForwardMany`: each item's answer, in order.
    ForwardMany(Vec<ForwardAnswer>),
    /// To a `Lag`: per group the answering node leads, each follower's entries behind its
    /// last log index.
    Lag(Vec<(GroupId, BTreeMap<NodeId, u64>)>),
}

/// Largest message body decoded (a snapshot chunk or a log batch).
pub const MAX_BODY: usize = 64 << 20;

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
        .expect("peer messages always encode")
}

pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, String> {
    let (value, used) = bincode::serde::decode_from_slice(
        bytes,
        bincode::config::standard().with_limit::<MAX_BODY>(),
    )
    .map_err(|e| format!("malformed peer message: {e}"))?;
    if used != bytes.len() {
        return Err(format!(
            "{} trailing bytes in a peer message",
            bytes.len() - used
        ));
    }
    Ok(value)
}

/// Whether an encoded [`PeerRequest`] is bulk to the peer transport
/// ([`crate::peer::PeerConfig::is_bulk`]): forwarded client checks, as many at once as the
/// clients send, and a status's question for the lag (`PeerRequest::Lag`). A flood of them
/// then cannot take the room of Raft's appends and votes (a follower that answers its
/// leader's heartbeats `Busy` calls an election). By the variant's
/// index, which bincode writes first, in one byte below 251 (pinned by a test). (A peer
/// holding the secret could write it in a longer varint, which bincode reads too, and have
/// its forwards taken for other requests: with the secret it can do worse.)
pub fn is_bulk(body: &[u8]) -> bool {
    body.first().is_some_and(|v| BULK_VARIANTS.contains(v))
}

/// The indexes of `PeerRequest::Lag`, `PeerRequest::Forward`, `PeerRequest::ForwardWithin` and
/// `PeerRequest::ForwardMany`.
const BULK_VARIANTS: [u8; 4] = [4, 7, 8, 9];

/// Why a call to a peer failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The request was certainly not delivered (no connection, refused, over a local bound).
    #[error("peer {0} unreachable (not sent): {1}")]
    NotSent(NodeId, String),
    /// Sent, then no answer (timed out, connection lost): the peer may have acted on it.
    #[error("peer {0} unreachable: {1}")]
    Unreachable(NodeId, String),
    /// The peer answered with an error or something undecodable.
    #[error("peer {0} failed the call: {1}")]
    Failed(NodeId, String),
}

/// The peer transport as the Raft layer uses it: a request-response call with a deadline.
/// Object-safe (a boxed future per call: noise next to a network round trip), so the cluster
/// holds one `Arc<dyn Transport>` whatever sockets are underneath.
pub trait Transport: Send + Sync + 'static {
    /// Learns (or updates) a peer's address: openraft hands every member's address to the
    /// network when it first talks to it, so a node added at runtime becomes reachable.
    fn learn(&self, _id: NodeId, _addr: &str) {}

    fn call(
        &self,
        to: NodeId,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Vec<u8>, CallError>>;
}

/// The transport as shared by every group.
pub type SharedTransport = Arc<dyn Transport>;

/// Sends `request` to `to` and decodes its answer.
pub async fn ask<T: Transport + ?Sized>(
    transport: &T,
    to: NodeId,
    request: &PeerRequest,
    timeout: Duration,
) -> Result<PeerResponse, CallError> {
    let body = transport.call(to, encode(request), timeout).await?;
    decode(&body).map_err(|e| CallError::Failed(to, e))
}

/// Whether this node knows that it was removed from a group, and a wake-up for the task
/// that then stops its elections there (see `Cluster::start`).
#[derive(Debug, Default)]
pub struct Removal {
    known: AtomicBool,
    learned: tokio::sync::Notify,
}

impl Removal {
    pub fn is_known(&self) -> bool {
        self.known.load(Ordering::Relaxed)
    }

    /// Records that this node is out of `group`, as `by` (a member that refused its vote or
    /// its forwarded checks with [`PeerResponse::Removed`], or this node, having applied its
    /// removal) says (logged once).
    pub fn learn(&self, group: GroupId, by: NodeId) {
        if !self.known.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                shard = group,
                by,
                "this node was removed from the shard: it refuses the shard's checks"
            );
            self.learned.notify_one();
        }
    }

    /// Returns once the removal is known.
    pub async fn learned(&self) {
        if !self.is_known() {
            // `notify_one` leaves a permit when nobody waits yet.
            self.learned.notified().await;
        }
    }
}

/// openraft's network for one group.
#[derive(Clone)]
pub struct GroupNetwork {
    pub group: GroupId,
    pub transport: SharedTransport,
    /// How long a commit notice waits for the next AppendEntries to carry it (see
    /// [`GroupLink::append_entries`]); zero sends every notice at once and awaits its answer,
    /// as openraft expects by default.
    pub notice_delay: Duration,
    /// Learned when a member answers that this node was removed from the group
    /// ([`PeerResponse::Removed`]).
    pub removed: Arc<Removal>,
}

/// openraft's connection to one peer for one group. The transport multiplexes; the state is
/// the commit notices' (see [`GroupLink::append_entries`]).
pub struct GroupLink {
    group: GroupId,
    target: NodeId,
    transport: SharedTransport,
    notice_delay: Duration,
    removed: Arc<Removal>,
    /// The newest `leader_commit` this link has carried; `None` before its first call.
    carried: Option<Option<LogId<NodeId>>>,
    notices: Arc<Mutex<Notices>>,
}

/// A link's deferred commit notice, and what the answer to one said.
#[derive(Default)]
struct Notices {
    /// The newest notice not sent yet.
    pending: Option<AppendEntriesRequest<TypeConfig>>,
    /// A task is due to send `pending`.
    due: bool,
    /// A vote higher than the leader's that a notice's answer carried: the link's next call
    /// returns it instead of sending.
    higher: Option<Vote<NodeId>>,
}

fn lock_notices(n: &Mutex<Notices>) -> MutexGuard<'_, Notices> {
    n.lock().unwrap_or_else(|e| e.into_inner())
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = GroupLink;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> GroupLink {
        self.transport.learn(target, &node.addr);
        GroupLink {
            group: self.group,
            target,
            transport: self.transport.clone(),
            notice_delay: self.notice_delay,
            removed: self.removed.clone(),
            carried: None,
            notices: Arc::default(),
        }
    }
}

fn call_error<E: std::error::Error>(e: CallError) -> RPCError<NodeId, BasicNode, E> {
    match e {
        // Not delivered (the peer is down or refusing): openraft backs off before retrying.
        CallError::NotSent(..) => RPCError::Unreachable(Unreachable::new(&e)),
        // Delivered and not answered in time (a loaded peer, a follower's fsync): retry on the
        // next round without the back-off, which would stall that follower's stream.
        CallError::Unreachable(..) => RPCError::Network(NetworkError::new(&e)),
        CallError::Failed(..) => RPCError::Network(NetworkError::new(&e)),
    }
}

fn unexpected<E: std::error::Error>(
    target: NodeId,
    got: PeerResponse,
) -> RPCError<NodeId, BasicNode, E> {
    let e = CallError::Failed(target, format!("unexpected answer: {got:?}"));
    RPCError::Network(NetworkError::new(&e))
}

impl GroupLink {
    /// Whether `rpc` is a commit notice to defer: no entries, and a `leader_commit` newer
    /// than this link has carried, on a link that has made a call before (see
    /// [`GroupLink::append_entries`]). Records the commit as carried either way.
    fn defers(&mut self, rpc: &AppendEntriesRequest<TypeConfig>) -> bool {
        let newer = self.carried.as_ref().is_none_or(|c| rpc.leader_commit > *c);
        let notice = !self.notice_delay.is_zero()
            && rpc.entries.is_empty()
            && self.carried.is_some()
            && newer;
        if newer {
            self.carried = Some(rpc.leader_commit);
        }
        notice
    }

    /// Keeps `rpc` as the link's pending notice, and makes sure a task sends it (or a newer
    /// one) after `notice_delay` unless a call carries it first.
    fn defer(&self, rpc: AppendEntriesRequest<TypeConfig>, option: &RPCOption) {
        let mut n = lock_notices(&self.notices);
        n.pending = Some(rpc);
        if n.due {
            return;
        }
        n.due = true;
        let (group, target, delay) = (self.group, self.target, self.notice_delay);
        let (notices, transport) = (self.notices.clone(), self.transport.clone());
        let ttl = option.hard_ttl();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let rpc = {
                let mut n = lock_notices(&notices);
                n.due = false;
                n.pending.take()
            };
            let Some(rpc) = rpc else { return };
            let request = PeerRequest::Append { group, rpc };
            // Any other answer or failure is the next call's to meet: it goes to the same
            // follower, with this commit or a newer one.
            if let Ok(PeerResponse::Append(Ok(AppendEntriesResponse::HigherVote(v)))) =
                ask(&*transport, target, &request, ttl).await
            {
                lock_notices(&notices).higher = Some(v);
            }
        });
    }

    async fn ask<E: std::error::Error>(
        &self,
        request: PeerRequest,
        option: &RPCOption,
    ) -> Result<PeerResponse, RPCError<NodeId, BasicNode, E>> {
        ask(&*self.transport, self.target, &request, option.hard_ttl())
            .await
            .map_err(call_error)
    }
}

impl RaftNetwork<TypeConfig> for GroupLink {
    /// After a peer was unreachable, try it again every 200 ms (openraft's default is 500 ms):
    /// a restarted member is back in the replication stream sooner.
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }

    /// Sends AppendEntries and returns the follower's answer, except for a commit notice.
    ///
    /// openraft 0.9 follows every commit, when nothing else waits to go to a follower, with
    /// an AppendEntries that carries no entries, only the new commit index, and its stream
    /// to that follower sends nothing else until the answer is back: about half of a strict
    /// entry's peer messages, for news the next AppendEntries carries anyway. So such a
    /// notice is answered `Success` at once and kept for up to `notice_delay`: the next
    /// call on the link (new entries, or a periodic heartbeat) carries a commit at least as
    /// new and drops it; else a task sends it then. Only the followers learn a commit a
    /// little later; they decide nothing, and a new leader applies up to its own term's
    /// first entry before it decides (see `cluster`).
    ///
    /// The `Success` tells openraft nothing it did not know: the notice's `prev_log_id` is
    /// the follower's match it already has, so no match and no commit moves. A heartbeat
    /// whose commit is not new is sent and awaited, so a deposed leader still learns of the
    /// higher vote from its periodic heartbeats; a higher vote in a sent notice's answer is
    /// returned by the link's next call. A link's first call is always sent: openraft's
    /// leadership check (`ensure_linearizable`) makes a new link per follower for one
    /// empty AppendEntries and counts only real answers.
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let group = self.group;
        if let Some(v) = lock_notices(&self.notices).higher.take() {
            return Ok(AppendEntriesResponse::HigherVote(v));
        }
        if self.defers(&rpc) {
            self.defer(rpc, &option);
            return Ok(AppendEntriesResponse::Success);
        }
        // This call carries a commit at least as new as a notice still pending.
        lock_notices(&self.notices).pending = None;
        match self
            .ask(PeerRequest::Append { group, rpc }, &option)
            .await?
        {
            PeerResponse::Append(Ok(r)) => Ok(r),
            PeerResponse::Append(Err(e)) => Err(RPCError::RemoteError(
                openraft::error::RemoteError::new(self.target, e),
            )),
            other => Err(unexpected(self.target, other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let group = self.group;
        match self
            .ask(PeerRequest::Snapshot { group, rpc }, &option)
            .await?
        {
            PeerResponse::Snapshot(Ok(r)) => Ok(r),
            PeerResponse::Snapshot(Err(e)) => Err(RPCError::RemoteError(
                openraft::error::RemoteError::new(self.target, e),
            )),
            other => Err(unexpected(self.target, other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let group = self.group;
        match self.ask(PeerRequest::Vote { group, rpc }, &option).await? {
            PeerResponse::Vote(Ok(r)) => Ok(r),
            PeerResponse::Vote(Err(e)) => Err(RPCError::RemoteError(
                openraft::error::RemoteError::new(self.target, e),
            )),
            // A removed node campaigns when it hears from no leader: a member that has
            // applied the removal refuses it, and so this node learns it is out.
            PeerResponse::Removed => {
                self.removed.learn(group, self.target);
                Err(unexpected(self.target, PeerResponse::Removed))
            }
            other => Err(unexpected(self.target, other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry, EntryPayload};

    /// Members of different builds of one protocol version talk: a variant's encoding never
    /// moves (bincode writes the variant's index first), and an older build refuses a
    /// variant it does not know as undecodable. Pinned here.
    #[test]
    fn the_request_variants_keep_their_indexes() {
        let forward = PeerRequest::Forward {
            group: 1,
            commands: Vec::new(),
            fast: false,
        };
        let within = PeerRequest::ForwardWithin {
            group: 1,
            commands: Vec::new(),
            fast: false,
            within_us: 500_000,
        };
        assert_eq!(encode(&forward)[0], 4);
        assert_eq!(encode(&PeerRequest::RespAddr)[0], 5);
        assert_eq!(encode(&within)[0], 7);
        let many = PeerRequest::ForwardMany {
            fast: true,
            items: vec![ForwardItem {
                group: 2,
                commands: Vec::new(),
                within_us: 9,
            }],
        };
        assert_eq!(encode(&many)[0], 8);
        assert_eq!(encode(&PeerResponse::Removed)[0], 8);
        assert_eq!(encode(&PeerResponse::ForwardMany(Vec::new()))[0], 9);
        assert_eq!(encode(&PeerRequest::Lag)[0], 9);
        assert_eq!(encode(&PeerResponse::Lag(Vec::new()))[0], 10);
        let bytes = encode(&within);
        assert!(matches!(
            decode::<PeerRequest>(&bytes),
            Ok(PeerRequest::ForwardWithin {
                within_us: 500_000,
                ..
            })
        ));
    }

    /// Forwarded checks are bulk to the transport, every other request is not.
    #[test]
    fn only_forwarded_checks_are_bulk() {
        let vote = Vote::new_committed(1, 1);
        let requests = [
            PeerRequest::Append {
                group: 1,
                rpc: append(1, 2, 1),
            },
            PeerRequest::Vote {
                group: 1,
                rpc: VoteRequest::new(vote, None),
            },
            PeerRequest::Snapshot {
                group: 1,
                rpc: InstallSnapshotRequest {
                    vote,
                    meta: Default::default(),
                    offset: 0,
                    data: vec![0; 8],
                    done: true,
                },
            },
            PeerRequest::Members {
                group: 1,
                change: MemberChange::Remove { id: 3 },
            },
            PeerRequest::Forward {
                group: 1,
                commands: Vec::new(),
                fast: false,
            },
            PeerRequest::RespAddr,
            PeerRequest::Handover {
                group: 1,
                vote,
                elect: true,
            },
            PeerRequest::ForwardWithin {
                group: 1,
                commands: Vec::new(),
                fast: true,
                within_us: 1,
            },
            PeerRequest::ForwardMany {
                fast: false,
                items: Vec::new(),
            },
            PeerRequest::Lag,
        ];
        for r in &requests {
            let forwarded = matches!(
                r,
                PeerRequest::Forward { .. }
                    | PeerRequest::ForwardWithin { .. }
                    | PeerRequest::ForwardMany { .. }
                    | PeerRequest::Lag
            );
            assert_eq!(is_bulk(&encode(r)), forwarded, "{r:?}");
        }
        assert!(!is_bulk(&[]));
    }

    /// A follower that records the AppendEntries it is sent and gives one answer to all.
    struct Follower {
        got: Mutex<Vec<AppendEntriesRequest<TypeConfig>>>,
        answer: Mutex<Answer>,
    }

    #[derive(Clone, Copy)]
    enum Answer {
        Success,
        Conflict,
        Higher(Vote<NodeId>),
    }

    impl Transport for Follower {
        fn call(
            &self,
            _to: NodeId,
            body: Vec<u8>,
            _timeout: Duration,
        ) -> BoxFuture<'static, Result<Vec<u8>, CallError>> {
            let Ok(PeerRequest::Append { rpc, .. }) = decode::<PeerRequest>(&body) else {
                panic!("only AppendEntries expected");
            };
            self.got.lock().unwrap().push(rpc);
            let answer = match *self.answer.lock().unwrap() {
                Answer::Success => AppendEntriesResponse::Success,
                Answer::Conflict => AppendEntriesResponse::Conflict,
                Answer::Higher(v) => AppendEntriesResponse::HigherVote(v),
            };
            Box::pin(async move { Ok(encode(&PeerResponse::Append(Ok(answer)))) })
        }
    }

    fn follower() -> Arc<Follower> {
        Arc::new(Follower {
            got: Mutex::new(Vec::new()),
            answer: Mutex::new(Answer::Success),
        })
    }

    async fn link(to: &Arc<Follower>, delay: Duration) -> GroupLink {
        let transport: SharedTransport = to.clone();
        let mut net = GroupNetwork {
            group: 0,
            transport,
            notice_delay: delay,
            removed: Arc::default(),
        };
        net.new_client(2, &BasicNode::new("127.0.0.1:1")).await
    }

    fn id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// AppendEntries from leader 1 in term 1: `entries` after index `prev`, commit `commit`.
    fn append(prev: u64, entries: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(id(prev)),
            entries: (prev + 1..=prev + entries)
                .map(|i| Entry {
                    log_id: id(i),
                    payload: EntryPayload::Blank,
                })
                .collect(),
            leader_commit: Some(id(commit)),
        }
    }

    async fn send(
        link: &mut GroupLink,
        rpc: AppendEntriesRequest<TypeConfig>,
    ) -> AppendEntriesResponse<NodeId> {
        link.append_entries(rpc, RPCOption::new(Duration::from_secs(1)))
            .await
            .expect("the fake follower always answers")
    }

    fn commits(f: &Follower) -> Vec<(usize, Option<u64>)> {
        let got = f.got.lock().unwrap();
        got.iter()
            .map(|r| (r.entries.len(), r.leader_commit.map(|c| c.index)))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_notice_is_answered_at_once_and_rides_on_the_next_append() {
        let f = follower();
        let mut l = link(&f, Duration::from_millis(5)).await;
        send(&mut l, append(0, 2, 0)).await;
        // The commit of 2, alone: answered by the link, not sent.
        *f.answer.lock().unwrap() = Answer::Conflict;
        assert_eq!(
            send(&mut l, append(2, 0, 2)).await,
            AppendEntriesResponse::Success
        );
        assert_eq!(commits(&f), vec![(2, Some(0))]);
        // The next entries carry it; the notice is never sent.
        *f.answer.lock().unwrap() = Answer::Success;
        send(&mut l, append(2, 1, 2)).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(commits(&f), vec![(2, Some(0)), (1, Some(2))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_notice_nothing_carries_is_sent_after_the_delay() {
        let f = follower();
        let mut l = link(&f, Duration::from_millis(5)).await;
        send(&mut l, append(0, 2, 0)).await;
        send(&mut l, append(2, 0, 1)).await;
        send(&mut l, append(2, 0, 2)).await;
        tokio::time::sleep(Duration::from_millis(4)).await;
        assert_eq!(commits(&f), vec![(2, Some(0))]);
        tokio::time::sleep(Duration::from_millis(2)).await;
        // Only the newest of the two notices.
        assert_eq!(commits(&f), vec![(2, Some(0)), (0, Some(2))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_higher_vote_in_a_notices_answer_is_the_next_calls_answer() {
        let f = follower();
        let mut l = link(&f, Duration::from_millis(5)).await;
        send(&mut l, append(0, 2, 0)).await;
        send(&mut l, append(2, 0, 2)).await;
        let higher = Vote::new_committed(2, 3);
        *f.answer.lock().unwrap() = Answer::Higher(higher);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(commits(&f).len(), 2, "the notice was sent");
        *f.answer.lock().unwrap() = Answer::Success;
        assert_eq!(
            send(&mut l, append(2, 1, 2)).await,
            AppendEntriesResponse::HigherVote(higher)
        );
        assert_eq!(commits(&f).len(), 2, "returned without sending");
    }

    /// openraft's leadership check sends one empty AppendEntries on a new link per follower
    /// and counts the answers: it must get the follower's, never the link's own.
    #[tokio::test(start_paused = true)]
    async fn a_links_first_call_and_a_heartbeat_with_no_news_get_the_followers_answer() {
        let f = follower();
        let higher = Vote::new_committed(2, 3);
        *f.answer.lock().unwrap() = Answer::Higher(higher);
        let mut l = link(&f, Duration::from_millis(5)).await;
        assert_eq!(
            send(&mut l, append(2, 0, 2)).await,
            AppendEntriesResponse::HigherVote(higher)
        );
        assert_eq!(
            send(&mut l, append(2, 0, 2)).await,
            AppendEntriesResponse::HigherVote(higher)
        );
        assert_eq!(commits(&f), vec![(0, Some(2)), (0, Some(2))]);
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_delay_every_notice_is_sent_and_awaited() {
        let f = follower();
        let mut l = link(&f, Duration::ZERO).await;
        send(&mut l, append(0, 2, 0)).await;
        *f.answer.lock().unwrap() = Answer::Conflict;
        assert_eq!(
            send(&mut l, append(2, 0, 2)).await,
            AppendEntriesResponse::Conflict
        );
        assert_eq!(commits(&f), vec![(2, Some(0)), (0, Some(2))]);
    }
}
