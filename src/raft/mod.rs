//! Replication: one openraft group per shard (multi-Raft), all groups on a node sharing one
//! write-ahead log.

pub mod log_store;
pub mod types;

pub use log_store::{GroupLog, NodeLog};
pub use types::{Applies, GroupId, NodeId, TypeConfig};
