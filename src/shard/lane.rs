//! The hand-off from callers to a shard actor: a lane of waiting batches and one flag.
//!
//! Callers [`Lane::push`] their batch and send the actor one wake-up (a `Drain` message)
//! only when `push` says so: when no wake-up is already on its way. The actor's
//! [`Lane::begin_drain`] clears the flag *before* taking the lane, so a batch pushed after
//! the take sees the flag clear and sends a new wake-up: no batch is stranded, and each is
//! taken by exactly one drain. `tests/loom_lane.rs` checks this over every interleaving.

use crate::sync::{AtomicBool, Mutex, MutexGuard, Ordering};

/// Waiting items and whether a drain is scheduled.
pub struct Lane<T> {
    queue: Mutex<Vec<T>>,
    /// True while a wake-up is on its way to (or being handled by) the drainer.
    scheduled: AtomicBool,
}

impl<T> Default for Lane<T> {
    fn default() -> Self {
        Lane::new()
    }
}

impl<T> Lane<T> {
    pub fn new() -> Lane<T> {
        Lane {
            queue: Mutex::new(Vec::new()),
            scheduled: AtomicBool::new(false),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Vec<T>> {
        // A panic while holding the lock cannot leave the Vec half-changed; keep using it.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `item`. True if the caller must wake the drainer (no wake-up is pending).
    pub fn push(&self, item: T) -> bool {
        self.queue().push(item);
        // `swap(true)` says the same for a bool; the compare-exchange is what loom models
        // faithfully (its `swap` can read a stale value: tokio-rs/loom#254, #389).
        self.scheduled
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The wake-up `push` asked for could not be delivered (the drainer is gone): let the
    /// next push, or the drainer's successor, send one.
    pub fn wake_failed(&self) {
        self.scheduled.store(false, Ordering::SeqCst);
    }

    /// A new drainer is about to wake itself (its predecessor may have died with items
    /// queued and the flag set): pushes meanwhile need not send another wake-up.
    pub fn mark_scheduled(&self) {
        self.scheduled.store(true, Ordering::SeqCst);
    }

    /// The drainer's turn, once per wake-up: everything queued so far.
    pub fn begin_drain(&self) -> Vec<T> {
        // Clear the flag first: an item queued after the take below sends a new wake-up.
        self.scheduled.store(false, Ordering::SeqCst);
        std::mem::take(&mut *self.queue())
    }
}
