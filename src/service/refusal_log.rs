//! A bound on the log lines of refused requests.
//!
//! Each request the RESP or HTTP API refuses as malformed is logged (`info`, with its reason),
//! so that an operator can tell why a client was turned away. One line per refusal had no
//! bound: a client pipelining unknown commands made a node write 200,000 lines (36 MB) in
//! half a second. So a node logs at most [`LINES_PER_SECOND`] refusals a second, its APIs
//! together, and the first refusal it logs after leaving some out comes after one line that
//! says how many it left out. `quorate_bad_requests_total` still counts every one.

use crate::limiter::Nanos;
use std::sync::Mutex;

/// The refusals a node logs in a second, at most.
pub const LINES_PER_SECOND: u32 = 10;

const SECOND: Nanos = 1_000_000_000;

/// Which of a node's refusals are logged. One per node (in its `Service`), so that the bound
/// holds however many connections and APIs the refusals come from.
#[derive(Debug)]
pub struct RefusalLog {
    /// The refusals logged in one second, at most.
    per_second: u32,
    /// Locked only to take a line: the lines themselves are written outside it.
    window: Mutex<Window>,
}

/// The second being logged: the pure core of [`RefusalLog`], which takes the time as an
/// argument.
#[derive(Debug, Default)]
struct Window {
    /// When the second began (at the first refusal after the last one ended); `None` before
    /// the first refusal.
    start: Option<Nanos>,
    /// Refusals logged since `start`.
    logged: u32,
    /// Refusals left out since the last one logged: told with the next one logged.
    left_out: u64,
}

impl Window {
    /// Whether the refusal at `now` may be logged: `Some` with the number left out since the
    /// last one logged, or `None` when this second has had its lines (it is then counted as
    /// left out).
    fn take(&mut self, now: Nanos, per_second: u32) -> Option<u64> {
        if self
            .start
            .is_none_or(|start| now.saturating_sub(start) >= SECOND)
        {
            self.start = Some(now);
            self.logged = 0;
        }
        if self.logged < per_second {
            self.logged += 1;
            Some(std::mem::take(&mut self.left_out))
        } else {
            self.left_out += 1;
            None
        }
    }
}

impl RefusalLog {
    /// A log of at most `per_second` refusals a second.
    pub fn new(per_second: u32) -> Self {
        RefusalLog {
            per_second,
            window: Mutex::new(Window::default()),
        }
    }

    /// Whether the refusal at `now` (the node's monotonic clock) is to be logged. When some
    /// were left out since the last one logged, first logs how many.
    pub fn admit(&self, now: Nanos) -> bool {
        let taken = self
            .window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(now, self.per_second);
        match taken {
            None => false,
            Some(0) => true,
            Some(left_out) => {
                tracing::info!(
                    left_out,
                    "{left_out} refused requests were not logged (at most {} a second are); \
                     quorate_bad_requests_total counts every one",
                    self.per_second
                );
                true
            }
        }
    }
}

impl Default for RefusalLog {
    fn default() -> Self {
        Self::new(LINES_PER_SECOND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lets_its_lines_through_each_second_and_counts_the_rest() {
        let mut w = Window::default();
        for _ in 0..3 {
            assert_eq!(w.take(5, 3), Some(0));
        }
        for at in [5, 6, SECOND + 4] {
            assert_eq!(w.take(at, 3), None, "at {at}");
        }
        // The next second: its first line tells the three left out, the others nothing.
        assert_eq!(w.take(SECOND + 5, 3), Some(3));
        assert_eq!(w.take(SECOND + 6, 3), Some(0));
        assert_eq!(w.take(SECOND + 7, 3), Some(0));
        assert_eq!(w.take(SECOND + 8, 3), None);
        assert_eq!(w.take(10 * SECOND, 3), Some(1));
    }

    #[test]
    fn a_second_begins_at_the_first_refusal_after_the_last_one_ended() {
        let mut w = Window::default();
        assert_eq!(w.take(7 * SECOND, 1), Some(0));
        assert_eq!(w.take(8 * SECOND - 1, 1), None);
        assert_eq!(w.take(8 * SECOND + SECOND / 2, 1), Some(1));
        // That second runs from 8.5 s, not from 8 s.
        assert_eq!(w.take(9 * SECOND + 1, 1), None);
        assert_eq!(w.take(9 * SECOND + SECOND / 2, 1), Some(1));
    }

    #[test]
    fn a_flood_is_logged_at_the_bound_and_every_refusal_is_accounted_for() {
        let log = RefusalLog::new(LINES_PER_SECOND);
        let flood = 200_000u64;
        let logged = (0..flood).filter(|i| log.admit(i * 2_500)).count() as u64;
        assert_eq!(logged, LINES_PER_SECOND as u64, "half a second of refusals");
        let left_out = log.window.lock().unwrap().left_out;
        assert_eq!(logged + left_out, flood);
        assert!(log.admit(SECOND));
        assert_eq!(log.window.lock().unwrap().left_out, 0, "told and reset");
    }

    #[test]
    fn a_bound_of_zero_logs_nothing() {
        let log = RefusalLog::new(0);
        assert!(!(0..100).any(|i| log.admit(i * SECOND)));
    }
}
