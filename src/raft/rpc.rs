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
use openraft::BasicNode;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
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
}

/// A change of a group's voters, carried out by the group's leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberChange {
    /// Add a node (as a learner, caught up, then a voter).
    Add { id: NodeId, addr: String },
    /// Remove a voter.
    Remove { id: NodeId },
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
    Members(Result<(), ForwardError>),
    /// The request could not be decoded or names a group this node does not have.
    Refused(String),
    /// The RESP address this node serves clients on (`None` before its server is bound).
    RespAddr(Option<std::net::SocketAddr>),
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

/// openraft's network for one group.
#[derive(Clone)]
pub struct GroupNetwork {
    pub group: GroupId,
    pub transport: SharedTransport,
}

/// openraft's connection to one peer for one group (no state: the transport multiplexes).
pub struct GroupLink {
    group: GroupId,
    target: NodeId,
    transport: SharedTransport,
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = GroupLink;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> GroupLink {
        self.transport.learn(target, &node.addr);
        GroupLink {
            group: self.group,
            target,
            transport: self.transport.clone(),
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

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let group = self.group;
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
            other => Err(unexpected(self.target, other)),
        }
    }
}
