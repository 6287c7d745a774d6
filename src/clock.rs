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

/// The async runtime's monotonic clock, for code that times its own waits with tokio
/// (`sleep`, `timeout`) and compares instants with them, such as the client's failover
/// bookkeeping: tokio's clock is the simulated one under turmoil, and paused in tests.
pub fn runtime_now() -> tokio::time::Instant {
    tokio::time::Instant::now() // seam: the runtime's clock
}

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

/// A simulated host's clock for `quorate sim cluster`: it reads turmoil's simulated time and
/// lets the nemesis inject the faults real clocks have.
///
/// - `monotonic` runs at `1 + drift_ppm / 10^6` times simulated time from an origin of its
///   own (hosts disagree on it, as real machines do) and never decreases: a drift change
///   re-anchors it where it stands, and every reading is at least the previous one.
/// - `wall` is the monotonic reading moved to the simulation's epoch plus an offset the
///   nemesis steps forward or BACKWARDS (an NTP step, an operator's `date -s`): only wall time
///   may go back, and nothing that decides reads it.
///
/// Control calls come from the simulation driver between steps and name the simulated time
/// they happen at; readings inside a host take simulated time from turmoil.
pub struct SimClock {
    state: std::sync::Mutex<SimClockState>,
    /// The largest monotonic reading handed out.
    last_mono: AtomicU64,
}

struct SimClockState {
    /// Simulated time (ns since the simulation began) of the current drift segment's start.
    anchor_sim: Nanos,
    /// The monotonic reading at `anchor_sim`.
    anchor_mono: Nanos,
    /// Rate error in parts per million (|ppm| < 10^6).
    drift_ppm: i64,
    /// Wall time at monotonic 0 (the simulation's epoch minus the host's origin).
    wall_base: i128,
    /// Steps applied to wall time (ns, either sign).
    wall_offset: i128,
    /// The latest simulated time seen (used when called outside a host).
    last_sim: Nanos,
}

impl SimClock {
    /// `origin`: the monotonic reading at simulated time 0; `epoch`: the wall time (ns since
    /// the Unix epoch) at simulated time 0.
    pub fn new(origin: Nanos, epoch: Nanos) -> Self {
        SimClock {
            state: std::sync::Mutex::new(SimClockState {
                anchor_sim: 0,
                anchor_mono: origin,
                drift_ppm: 0,
                wall_base: epoch as i128 - origin as i128,
                wall_offset: 0,
                last_sim: 0,
            }),
            last_mono: AtomicU64::new(origin),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimClockState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Simulated time now: turmoil's inside a host, else the latest seen.
    fn sim_now(state: &mut SimClockState) -> Nanos {
        if let Some(d) = ::turmoil::sim_elapsed() {
            let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            state.last_sim = state.last_sim.max(ns);
        }
        state.last_sim
    }

    fn mono_at(state: &SimClockState, sim: Nanos) -> Nanos {
        let dt = sim.saturating_sub(state.anchor_sim) as i128;
        let scaled = dt * (1_000_000 + state.drift_ppm as i128) / 1_000_000;
        (state.anchor_mono as i128 + scaled.max(0)).clamp(0, u64::MAX as i128) as Nanos
    }

    fn reading(&self, state: &mut SimClockState, sim: Nanos) -> Nanos {
        let m = Self::mono_at(state, sim);
        self.last_mono.fetch_max(m, Ordering::SeqCst).max(m)
    }

    /// From simulated time `at` on, the clock runs `ppm` parts per million fast (or slow).
    pub fn set_drift_ppm(&self, at: std::time::Duration, ppm: i64) {
        let mut s = self.lock();
        let sim = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX);
        s.last_sim = s.last_sim.max(sim);
        let mono = self.reading(&mut s, sim);
        s.anchor_sim = sim;
        s.anchor_mono = mono;
        s.drift_ppm = ppm.clamp(-999_999, 999_999);
    }

    /// Steps the wall clock by `by_ns` (negative: backwards). Monotonic time is untouched.
    pub fn step_wall(&self, by_ns: i64) {
        self.lock().wall_offset += by_ns as i128;
    }

    /// The wall clock's total offset from the simulation's epoch-based time, in ns.
    pub fn wall_offset(&self) -> i128 {
        self.lock().wall_offset
    }
}

impl Clock for SimClock {
    fn monotonic(&self) -> Nanos {
        let mut s = self.lock();
        let sim = Self::sim_now(&mut s);
        self.reading(&mut s, sim)
    }
    fn wall(&self) -> Nanos {
        let mut s = self.lock();
        let sim = Self::sim_now(&mut s);
        let mono = self.reading(&mut s, sim) as i128;
        (s.wall_base + mono + s.wall_offset).clamp(0, u64::MAX as i128) as Nanos
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

/// A time limit measured from the last [`restart`](LazyTimer::restart), kept with one tokio
/// [`Sleep`](tokio::time::Sleep) that is re-armed lazily: for the idle limit of a connection
/// and for the wait of each of its calls.
///
/// A fresh timer per wait (`tokio::time::timeout`) inserts and removes a timer-wheel entry
/// every time, and when the runtime had gone to sleep with no earlier timer pending, the
/// insert also wakes the driver through its eventfd. On an unpipelined connection a timer
/// around every read and write was about a tenth of a request's instructions (callgrind),
/// and a timer per call 0.19 `write(eventfd)` system calls per request (strace). Here a
/// restart only notes the time (one clock read through the seam, or none: `restart_at`).
/// When the sleep fires, it checks that note: if the limit since the last restart has not
/// passed, the sleep moves to the end of that limit and the wait goes on. So a wait ends
/// after exactly `limit` since the last restart, and the sleep is re-armed at most once per
/// `limit`, not once per wait. A sleep that fired while nothing waited (an idle
/// connection) is replaced at the next wait, once.
pub struct LazyTimer {
    limit: std::time::Duration,
    clock: SharedClock,
    /// Monotonic time of the last restart.
    last: Nanos,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl LazyTimer {
    /// A timer whose limit runs from now.
    pub fn new(clock: SharedClock, limit: std::time::Duration) -> Self {
        LazyTimer {
            limit,
            last: clock.monotonic(),
            clock,
            sleep: Box::pin(tokio::time::sleep(limit)),
        }
    }

    pub fn limit(&self) -> std::time::Duration {
        self.limit
    }

    /// The limit runs from now.
    pub fn restart(&mut self) {
        self.last = self.clock.monotonic();
    }

    /// The limit runs from `now`, a reading of this timer's clock the caller already has.
    pub fn restart_at(&mut self, now: Nanos) {
        self.last = now;
    }

    /// Runs `fut` until it finishes (`Some`) or `limit` has passed since the last restart
    /// (`None`).
    pub async fn bound<F: std::future::Future>(&mut self, fut: F) -> Option<F::Output> {
        let limit = u64::try_from(self.limit.as_nanos()).unwrap_or(u64::MAX);
        if self.sleep.is_elapsed() {
            // Fired while nothing waited: arm it for the rest of this limit.
            let left = limit.saturating_sub(self.clock.monotonic().saturating_sub(self.last));
            self.sleep = Box::pin(tokio::time::sleep(std::time::Duration::from_nanos(left)));
        }
        let mut fut = std::pin::pin!(fut);
        loop {
            tokio::select! {
                biased;
                out = &mut fut => return Some(out),
                _ = &mut self.sleep => {
                    let since = self.clock.monotonic().saturating_sub(self.last);
                    if since >= limit {
                        return None;
                    }
                    let at = self.sleep.deadline() + std::time::Duration::from_nanos(limit - since);
                    self.sleep.as_mut().reset(at);
                }
            }
        }
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

    #[test]
    fn a_sim_clock_drifts_and_steps_its_wall_clock_back_but_never_its_monotonic_one() {
        use std::time::Duration;
        let c = SimClock::new(1_000, 5_000_000);
        assert_eq!(c.monotonic(), 1_000);
        c.set_drift_ppm(Duration::ZERO, 500_000); // 1.5x
        c.set_drift_ppm(Duration::from_nanos(1_000), -500_000); // then 0.5x
        let m = c.monotonic();
        assert_eq!(m, 1_000 + 1_500);
        let w = c.wall();
        c.step_wall(-60_000_000_000);
        assert!(c.wall() < w);
        assert_eq!(c.monotonic(), m);
    }
}
