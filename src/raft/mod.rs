//! Replication: one openraft group per shard (multi-Raft), all groups on a node sharing one
//! write-ahead log.
//!
//! - `types` — the Raft type configuration (a log entry carries a shard batch).
//! - `log_store` — every group's Raft log and vote, in the node's shared WAL.
//! - `state_machine` — a shard's state driven by committed batches, with durable snapshots.
//! - `rpc` — the messages between nodes and openraft's network over the peer transport.
//! - `intake` — what a follower lets through of a leader's snapshot stream.
//! - `cluster` — the groups of a node, the leader's batcher, forwarding and fallbacks.
//! - `hooks` — what the simulation observes and the switches of its negative controls.

pub mod cluster;
pub mod denials;
pub mod forward;
pub mod hooks;
pub mod intake;
pub mod log_store;
pub mod replies;
pub mod rpc;
pub mod state_machine;
pub mod types;

pub use log_store::{GroupLog, NodeLog};
pub use types::{Applies, GroupId, NodeId, TypeConfig};
