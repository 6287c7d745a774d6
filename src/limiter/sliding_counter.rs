//! Sliding window counter: two aligned counters and a weighted estimate of the rolling count,
//! `estimate = previous x (period - elapsed) / period + current` (Cloudflare's rule). A request
//! of cost `c` is admitted while `estimate + c - 1 < limit`; only admitted requests count.
//! O(1) state; approximate, because it assumes the previous window's requests were spread
//! evenly. All arithmetic is exact integers: the comparison is done multiplied by `period`.
//!
//! With `w = previous x (period - elapsed)`, the rule is equivalent to
//! `c <= limit - current - floor(w / period)`, which gives `remaining` directly.
//!
//! ```
//! use quorate::limiter::sliding_counter::{decide, Policy, State};
//! let p = Policy::new(10, 1_000).unwrap();
//! let mut s = State::default();
//! assert!(decide(&mut s, &p, 0, 10).allowed());
//! // Half-way into the next window, half of the previous window still counts.
//! assert_eq!(decide(&mut s, &p, 1_500, 0).remaining, 5);
//! ```

use super::{Decision, Nanos, Outcome};
use serde::{Deserialize, Serialize};

/// `limit` units per window of `period`; shared with the other window algorithm.
pub use super::WindowPolicy as Policy;

/// The current window's index and the units admitted in it and in the window before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    window: u64,
    prev: u64,
    curr: u64,
}

/// The smallest elapsed time `e` in `[0, period)` at which `floor(count x (period - e) /
/// period) <= k`, or `None` if that only happens in a later window.
fn first_fit(count: u64, k: u64, period: u128) -> Option<u128> {
    if count <= k {
        return Some(0);
    }
    // count x (period - e) < (k + 1) x period  <=>  period - e <= ((k+1) period - 1) / count
    let m = ((k as u128 + 1) * period - 1) / count as u128;
    let e = period - m;
    (e < period).then_some(e)
}

#[inline]
pub fn decide(s: &mut State, p: &Policy, now: Nanos, cost: u64) -> Decision {
    let period = p.period() as u128;
    let idx = p.window_of(now);
    if idx > s.window {
        s.prev = if idx - s.window == 1 { s.curr } else { 0 };
        s.curr = 0;
        s.window = idx;
    }
    let start = s.window as u128 * period;
    let now_w = now as u128;
    let elapsed = now_w.saturating_sub(start); // 0 if `now` went backwards
    let weighted = p.div_period(s.prev as u128 * (period - elapsed));
    let used = s.curr as u128 + weighted;
    let left = (p.limit() as u128).saturating_sub(used) as u64;
    let mut d = Decision {
        outcome: Outcome::Allowed,
        limit: p.limit(),
        remaining: left,
        reset_after: 0,
        retry_after: 0,
        delay: 0,
    };
    if cost > p.limit() {
        d.outcome = Outcome::Never;
    } else if cost > left {
        d.outcome = Outcome::Denied;
        // In this window the previous count's weight decays; if the current count alone
        // leaves no room, wait for the next window (where `curr` becomes the decaying part),
        // or the one after (where nothing is left).
        // (`curr` can exceed the limit if a reload lowered the limit since.)
        let in_this = (s.curr <= p.limit() && cost <= p.limit() - s.curr)
            .then(|| first_fit(s.prev, p.limit() - s.curr - cost, period))
            .flatten()
            .map(|e| start + e);
        let next = start + period;
        let target = in_this.unwrap_or_else(|| match first_fit(s.curr, p.limit() - cost, period) {
            Some(e) => next + e,
            None => next + period,
        });
        d.retry_after = u64::try_from(target - now_w).unwrap_or(u64::MAX);
    } else if cost > 0 {
        s.curr += cost;
        d.remaining = left - cost;
    }
    let until = |windows: u128| u64::try_from(start + windows * period - now_w).unwrap_or(u64::MAX);
    d.reset_after = if s.curr > 0 {
        until(2)
    } else if s.prev > 0 {
        until(1)
    } else {
        0
    };
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
    let idx = p.window_of(now);
    if idx >= s.window.saturating_add(2) {
        true
    } else if idx > s.window {
        s.curr == 0
    } else {
        s.prev == 0 && s.curr == 0
    }
}

/// Gives back `cost` units admitted at `admitted_at`, from the counter that holds them
/// (current or previous window); never below zero, so never above fresh.
pub fn refund(s: &mut State, p: &Policy, admitted_at: Nanos, cost: u64) {
    let w = p.window_of(admitted_at);
    if w == s.window {
        s.curr -= cost.min(s.curr);
    } else if w.checked_add(1) == Some(s.window) {
        s.prev -= cost.min(s.prev);
    }
}
