//! The synchronisation types of the code that loom models check.
//!
//! Under `--cfg loom` (`scripts/loom`) these are loom's types, so the models in
//! `tests/loom_*.rs` run the real hand-off code over every interleaving loom explores;
//! otherwise they are std's. Only code with a loom model uses this module.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(loom)]
pub use loom::sync::{Arc, Mutex, MutexGuard};

#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(not(loom))]
pub use std::sync::{Arc, Mutex, MutexGuard};
