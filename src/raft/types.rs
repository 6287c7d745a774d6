//! The Raft type configuration shared by every shard group.
//!
//! A log entry's payload is a shard [`Batch`] (commands with their shard time); applying it
//! answers one [`Applied`] per command. Node ids are `u64`; a node's address is the peer
//! address in [`openraft::BasicNode`].

use crate::shard::command::{Applied, Batch};
use serde::{Deserialize, Serialize};
use std::io::Cursor;

/// What applying one batch answered, in the batch's order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applies(pub Vec<Applied>);

openraft::declare_raft_types!(
    /// quorate's Raft types.
    pub TypeConfig:
        D = Batch,
        R = Applies,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A node's id in the cluster (1-based in configs).
pub type NodeId = u64;
/// A Raft group's id: the shard number.
pub type GroupId = u64;
