//! Shards: the owners of limiter state.
//!
//! Keys map to `S` shards by jump consistent hash, or by Redis hash slot in a cluster created
//! with slot sharding ([`route`]). Each shard's state
//! ([`state::ShardState`]) is changed only by applying [`command::Batch`]es — plain data,
//! serialisable with bincode 2, applied deterministically: the same values the Raft log will
//! carry. On a node, one ractor actor per shard ([`actor`]) is the only writer of that state,
//! so check-and-update is atomic by ownership; it stamps each batch with one shard time.

pub mod actor;
pub mod command;
mod ids;
pub mod lane;
pub mod route;
pub mod state;
pub mod table;
