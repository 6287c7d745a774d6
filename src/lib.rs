//! quorate: a distributed, exact, durable rate limiter.
//!
//! # Layout
//! - `limiter/` — the pure algorithm core: one file per algorithm, `decide(state, policy, now,
//!   cost)`, no clock reads, no I/O, no floats in state.
//! - `policy/` — named limits from a TOML policy file, validated with errors that name the fix.
//! - `sim/` (the crate's `sim/` folder, compiled in as [`sim`]) — the workload simulator behind
//!   `quorate sim ...`: trace replay, Poisson arrivals, the boundary-burst scenario, SVG plots.
//! - `main.rs` — the thin CLI.

pub mod limiter;
pub mod policy;

#[path = "../sim/mod.rs"]
pub mod sim;
