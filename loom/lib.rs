//! The parts of quorate that the loom models check, from quorate's own source files (not
//! copies), so a model runs the code the node runs. Paths mirror the main crate's.

#[path = "../src/sync.rs"]
pub mod sync;

#[path = "../src/limiter/mod.rs"]
pub mod limiter;

#[path = "../src/raft/replies.rs"]
#[doc(hidden)]
pub mod raft_replies;
#[path = "../src/shard/lane.rs"]
#[doc(hidden)]
pub mod shard_lane;

pub mod shard {
    pub use crate::shard_lane as lane;
}

pub mod raft {
    pub use crate::raft_replies as replies;
}
