//! Hooks for the deterministic simulation and its negative controls. A production node has
//! them all unset (`Hooks::default()`), and nothing in the configuration file or the CLI of
//! `quorate node` can set them: only code that builds a `ClusterSettings` itself (the
//! simulation in `sim/cluster/`) can.
//!
//! - `applied` sees every entry a node's state machine applies, so the simulation's checkers
//!   can resolve unknown client outcomes and compare replicas' applied logs.
//! - `fallback` sees every check a node answers by its `on_unavailable` rule, so they can
//!   tell those answers from the log's and bound what `local` admits.
//! - `vote` sees every vote a node's log store saved (once durable) or found on disk at
//!   start, so a run can check that no node's vote ever goes back (a restart included) and
//!   that no leader stands on its own vote alone.
//! - `handover` sees every handover of a leadership a node tried, so a run can say how many
//!   it saw.
//! - `forward_in_flight` lowers the calls with forwarded checks out to one peer past which
//!   callers wait and share the next (`forward::MAX_IN_FLIGHT`), so a simulation's few
//!   clients reach the batched path (`PeerRequest::ForwardMany`) too.
//! - `io_on_runtime` runs the WAL writer as a task on the host's runtime (a thread's
//!   timing is outside simulated time; see `WalOptions::writer_on_runtime`).
//! - `wal_stall`, while set, stalls that WAL writer task (a disk whose writes hang: a
//!   leader replicates what it has not written, and a crash then loses it from its disk).
//! - the `unsafe_*` switches break one safety mechanism each, so the simulation's checkers
//!   can be SEEN to fail (docs/verification.md, "Negative controls").

use super::types::{GroupId, NodeId};
use crate::clock::SharedClock;
use crate::limiter::{Limit, Nanos};
use crate::policy::OnUnavailable;
use crate::shard::command::{Applied, Batch};
use std::sync::Arc;

/// One entry a node applied.
pub struct AppliedEntry<'a> {
    pub node: NodeId,
    pub group: GroupId,
    pub term: u64,
    pub index: u64,
    /// The batch (`None` for blank and membership entries).
    pub batch: Option<&'a Batch>,
    /// What applying it answered, one per command.
    pub results: &'a [Applied],
}

/// Called for every applied entry, on the applying task: must be quick and must not block.
pub type AppliedSink = Arc<dyn Fn(&AppliedEntry<'_>) + Send + Sync>;

/// A check a node answered by its limit's `on_unavailable` rule: its shard could not decide
/// it in time. (A check with a request id that the rule would deny is answered as undecided
/// instead, and is not one of these.)
pub struct FallbackAnswer<'a> {
    pub node: NodeId,
    /// The node's start (`ClusterConfig::incarnation`): a restarted node's `local` table
    /// starts empty.
    pub incarnation: u64,
    pub key: &'a str,
    /// The limit the check named (under `local` the node kept its share of it).
    pub limit: &'a Limit,
    pub cost: u64,
    pub request_id: Option<&'a str>,
    pub rule: OnUnavailable,
    pub allowed: bool,
    /// The node's monotonic clock when it answered: the time its `local` table decided at.
    pub at: Nanos,
}

/// Called for every `on_unavailable` answer, on the answering task: quick, never blocking.
pub type FallbackSink = Arc<dyn Fn(&FallbackAnswer<'_>) + Send + Sync>;

/// A vote a node's log store for one shard holds: saved (durable when this is reported) or,
/// with `restored`, found on disk when the node started (term 0 and node 0: none found).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VoteSaved {
    pub node: NodeId,
    pub group: GroupId,
    pub term: u64,
    /// The candidate voted for; with `committed`, the leader of `term`.
    pub leader: NodeId,
    pub committed: bool,
    pub restored: bool,
}

/// Called for every vote a log store saved or restored, on its task: quick, never blocking.
pub type VoteSink = Arc<dyn Fn(&VoteSaved) + Send + Sync>;

/// Called when a node's handover of a shard's leadership has ended: (node, shard, to,
/// whether the leadership moved). Quick, never blocking.
pub type HandoverSink = Arc<dyn Fn(NodeId, GroupId, NodeId, bool) + Send + Sync>;

#[derive(Clone, Default)]
pub struct Hooks {
    pub applied: Option<AppliedSink>,
    pub fallback: Option<FallbackSink>,
    pub handover: Option<HandoverSink>,
    pub vote: Option<VoteSink>,
    pub io_on_runtime: bool,
    /// With `io_on_runtime`: the WAL writer writes nothing while this is set
    /// (`WalOptions::stall`).
    pub wal_stall: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Calls with forwarded checks out to one peer (strict or fast) past which callers
    /// wait and share the next, instead of `forward::MAX_IN_FLIGHT`.
    pub forward_in_flight: Option<usize>,
    /// UNSAFE negative control: apply decides at this node's clock reading instead of the
    /// batch's shard time (replicas diverge; windows are no longer the log's).
    pub unsafe_apply_local_clock: Option<SharedClock>,
    /// UNSAFE negative control: strict checks are answered from the leader's speculative
    /// state as soon as their entry is submitted, before it commits, lease or not.
    pub unsafe_answer_before_commit: bool,
    /// UNSAFE negative control: a vote is reported saved without being written (a restart
    /// finds the vote before it, unless a WAL compaction happened to copy it).
    pub unsafe_forget_votes: bool,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("applied", &self.applied.is_some())
            .field("fallback", &self.fallback.is_some())
            .field("handover", &self.handover.is_some())
            .field("vote", &self.vote.is_some())
            .field("io_on_runtime", &self.io_on_runtime)
            .field("wal_stall", &self.wal_stall.is_some())
            .field("forward_in_flight", &self.forward_in_flight)
            .field(
                "unsafe_apply_local_clock",
                &self.unsafe_apply_local_clock.is_some(),
            )
            .field(
                "unsafe_answer_before_commit",
                &self.unsafe_answer_before_commit,
            )
            .field("unsafe_forget_votes", &self.unsafe_forget_votes)
            .finish()
    }
}
