//! Fixed window: at most `limit` units per window, windows aligned to multiples of `period`
//! since shard time zero. O(1) state. Only admitted requests count. Across a boundary it can
//! admit up to `2 x limit` in a span much shorter than `period` — that is its definition.
//!
//! ```
//! use quorate::limiter::fixed_window::{decide, Policy, State};
//! let p = Policy::new(2, 1_000).unwrap();
//! let mut s = State::default();
//! assert!(decide(&mut s, &p, 10, 1).allowed());
//! assert!(decide(&mut s, &p, 20, 1).allowed());
//! assert_eq!(decide(&mut s, &p, 30, 1).retry_after, 970);
//! ```

use super::{Decision, Nanos, Outcome};
use serde::{Deserialize, Serialize};

/// `limit` units per window of `period`; shared with the other window algorithm.
pub use super::WindowPolicy as Policy;

/// The current window's index (`start / period`) and the units admitted in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    window: u64,
    count: u64,
}

/// Rolls the state to `now`'s window (never backwards) and returns the window's end.
fn roll(s: &mut State, p: &Policy, now: Nanos) -> u128 {
    let idx = p.window_of(now);
    if idx > s.window {
        s.window = idx;
        s.count = 0;
    }
    (s.window as u128 + 1) * p.period() as u128
}

#[inline]
pub fn decide(s: &mut State, p: &Policy, now: Nanos, cost: u64) -> Decision {
    let end = roll(s, p, now);
    let until_end = u64::try_from(end - now as u128).unwrap_or(u64::MAX);
    // count <= limit, unless a reload lowered the limit since the key spent it.
    let left = p.limit().saturating_sub(s.count);
    let mut d = Decision {
        outcome: Outcome::Allowed,
        limit: p.limit(),
        remaining: left,
        reset_after: if s.count == 0 { 0 } else { until_end },
        retry_after: 0,
        delay: 0,
    };
    if cost > p.limit() {
        d.outcome = Outcome::Never;
    } else if cost > left {
        d.outcome = Outcome::Denied;
        d.retry_after = until_end;
    } else if cost > 0 {
        s.count += cost;
        d.remaining = left - cost;
        d.reset_after = until_end;
    }
    d
}

/// A reload changed the key's limit to `p`: a window numbered under a shorter period (a
/// larger number than `now`'s window under `p`) becomes `now`'s window, keeping its counts.
/// Without this the key waited until `p`'s windows caught up with the old numbers (the
/// shard's age times the ratio of the periods).
pub fn adopt(s: &mut State, p: &Policy, now: Nanos) {
    s.window = s.window.min(p.window_of(now));
}

pub fn is_fresh(s: &State, p: &Policy, now: Nanos) -> bool {
    s.count == 0 || p.window_of(now) > s.window
}

/// Gives back `cost` units admitted at `admitted_at` (the all-or-nothing rule's compensation).
/// Only the admission's own window is credited, so a refund never lifts a key above fresh.
pub fn refund(s: &mut State, p: &Policy, admitted_at: Nanos, cost: u64) {
    if p.window_of(admitted_at) == s.window {
        s.count -= cost.min(s.count);
    }
}
