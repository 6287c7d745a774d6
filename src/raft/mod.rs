//! Replication: one openraft group per shard (multi-Raft), all groups on a node sharing one
//! write-ahead log.

pub mod types;

pub use types::{Applies, GroupId, NodeId, TypeConfig};
