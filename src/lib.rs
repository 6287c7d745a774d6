//! quorate: a distributed, exact, durable rate limiter.
//!
//! # Layout
//! - `limiter/` — the pure algorithm core: one file per algorithm, `decide(state, policy, now,
//!   cost)`, no clock reads, no I/O, no floats in state.
//! - `policy/` — named limits from a TOML policy file, validated with errors that name the fix.
//! - `sim/` (the crate's `sim/` folder, compiled in as [`sim`]) — the workload simulator behind
//!   `quorate sim ...`: trace replay, Poisson arrivals, the boundary-burst scenario, SVG plots,
//!   and `sim/cluster/`, the deterministic turmoil simulation of the cluster under faults.
//! - `clock.rs` — the `Clock` seam (the only way node code reads time) and shard time.
//! - `net/` — the `net` seam: `Listener`/`Connector` traits, their tokio TCP version and
//!   turmoil's simulated one.
//! - `peer/` — the peer transport: one authenticated (HMAC handshake), multiplexed connection
//!   per node and direction carrying every inter-node RPC as a framed request/response, with
//!   timeouts, reconnects and bounds.
//! - `config.rs` — a node's addresses and the bounds on every input and queue.
//! - `metrics.rs` — the Prometheus metrics.
//! - `service/` — the node's application API: validate, route to shards, all-or-nothing.
//! - `wal/` — the shared write-ahead log: group commit, ordered submissions completed after
//!   the sync, checksummed records, torn-tail truncation, segments with checkpoint compaction.
//! - `raft/` — the shard groups' Raft types and their durable log storage over the WAL
//!   (`NodeLog`, one `GroupLog` per group).
//! - `main.rs` — the thin CLI.

pub mod api;
pub mod client;
pub mod clock;
pub mod config;
pub mod limiter;
pub mod member;
pub mod metrics;
pub mod net;
pub mod node;
pub mod peer;
pub mod policy;
pub mod raft;
pub mod service;
pub mod shard;
pub mod sync;
pub mod wal;

#[path = "../sim/mod.rs"]
pub mod sim;
