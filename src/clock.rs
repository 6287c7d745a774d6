//! The `Clock` seam: the only way node code reads time.
//!
//! Production uses [`SystemClock`]; tests and the turmoil simulation inject their own
//! (skewed, drifting, stepping) clocks. Decisions never use wall time: a shard stamps each
//! batch with *shard time*, derived from the monotonic reading (see [`ShardTime`]), and wall
//! time is only used to render HTTP dates.

use crate::limiter::Nanos;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync + 'static {
    /// Monotonic nanoseconds since an arbitrary, fixed origin; never decreases.
    fn monotonic(&self) -> Nanos;
    /// Wall-clock nanoseconds since the Unix epoch. Only for rendering dates to humans.
    fn wall(&self) -> Nanos;
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The operating system's clocks.
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(), // seam: the one monotonic origin
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn monotonic(&self) -> Nanos {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
    fn wall(&self) -> Nanos {
        SystemTime::now() // seam: wall time, for HTTP dates only
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to: for tests.
#[derive(Default)]
pub struct ManualClock {
    mono: AtomicU64,
    wall: AtomicU64,
}

impl ManualClock {
    pub fn new(start: Nanos) -> Self {
        ManualClock {
            mono: AtomicU64::new(start),
            wall: AtomicU64::new(start),
        }
    }
    pub fn advance(&self, by: Nanos) {
        self.mono.fetch_add(by, Ordering::SeqCst);
        self.wall.fetch_add(by, Ordering::SeqCst);
    }
    /// Steps the wall clock alone (skew), which must change no decision.
    pub fn set_wall(&self, wall: Nanos) {
        self.wall.store(wall, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn monotonic(&self) -> Nanos {
        self.mono.load(Ordering::SeqCst)
    }
    fn wall(&self) -> Nanos {
        self.wall.load(Ordering::SeqCst)
    }
}

/// A shard's time: `t = max(previous, base + (monotonic - monotonic at start))`.
///
/// It never runs backwards and ignores the wall clock entirely. `base` is where the shard's
/// time stood when this owner took over (0 for a fresh single node; the last committed
/// batch time once the log carries it), so a new owner continues rather than restarts it.
pub struct ShardTime {
    clock: SharedClock,
    base: Nanos,
    mono_at_start: Nanos,
    last: Nanos,
}

impl ShardTime {
    pub fn new(clock: SharedClock, base: Nanos) -> Self {
        let mono_at_start = clock.monotonic();
        ShardTime {
            clock,
            base,
            mono_at_start,
            last: base,
        }
    }

    /// The time to stamp the next batch with.
    pub fn now(&mut self) -> Nanos {
        let elapsed = self.clock.monotonic().saturating_sub(self.mono_at_start);
        self.last = self.last.max(self.base.saturating_add(elapsed));
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_time_continues_from_its_base_and_ignores_wall_clock_steps() {
        let clock = Arc::new(ManualClock::new(5_000));
        let mut t = ShardTime::new(clock.clone(), 1_000_000);
        assert_eq!(t.now(), 1_000_000);
        clock.advance(250);
        clock.set_wall(0);
        assert_eq!(t.now(), 1_000_250);
    }
}
