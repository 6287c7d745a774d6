//! Sliding window log: the exact rolling limit. A request at `t` occupies its cost in every
//! window `(t - period, t]`; admit while the units admitted in the last `period` plus the cost
//! stay within `limit`. State is a ring of `(timestamp, units)` entries, at most `limit` of
//! them (every entry holds at least one unit), so memory is bounded by the policy, never by
//! traffic: at most `16 x limit` bytes per key, `limit <= MAX_LOG_LIMIT`.

use super::{Decision, Nanos, Outcome, PolicyError, WindowPolicy, MAX_LOG_LIMIT};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// The window parameters, with the limit also capped by the memory bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy(WindowPolicy);

impl Policy {
    /// `limit` units in any rolling window of `period` nanoseconds.
    ///
    /// ```
    /// use quorate::limiter::sliding_log::{decide, Policy, State};
    /// let p = Policy::new(1, 100).unwrap();
    /// let mut s = State::default();
    /// assert!(decide(&mut s, &p, 50, 1).allowed());
    /// assert_eq!(decide(&mut s, &p, 120, 1).retry_after, 30);
    /// ```
    pub fn new(limit: u64, period: Nanos) -> Result<Self, PolicyError> {
        if limit > MAX_LOG_LIMIT {
            return Err(PolicyError::LogLimitTooLarge(limit));
        }
        WindowPolicy::new(limit, period).map(Policy)
    }
    pub fn limit(&self) -> u64 {
        self.0.limit()
    }
    pub fn period(&self) -> Nanos {
        self.0.period()
    }
}

/// Admissions still inside the window, oldest first, and their total units.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    entries: VecDeque<(Nanos, u64)>,
    total: u64,
}

impl State {
    /// How many entries the ring holds (for memory accounting).
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// When an admission at `at` stops counting.
fn expiry(at: Nanos, p: &Policy) -> u128 {
    at as u128 + p.period() as u128
}

fn gap(until: u128, now: Nanos) -> Nanos {
    u64::try_from(until - now as u128).unwrap_or(u64::MAX)
}

#[inline]
pub fn decide(s: &mut State, p: &Policy, now: Nanos, cost: u64) -> Decision {
    let now = s.entries.back().map_or(now, |&(at, _)| now.max(at));
    while let Some(&(at, n)) = s.entries.front() {
        if expiry(at, p) > now as u128 {
            break;
        }
        s.entries.pop_front();
        s.total -= n;
    }
    // total <= limit, unless a reload lowered the limit since the key spent it.
    let left = p.limit().saturating_sub(s.total);
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
        // Walk the oldest admissions until enough units have expired to fit `cost`.
        let need = (s.total + cost).saturating_sub(p.limit());
        let mut freed = 0;
        for &(at, n) in &s.entries {
            freed += n;
            if freed >= need {
                d.retry_after = gap(expiry(at, p), now);
                break;
            }
        }
        d.outcome = Outcome::Denied;
    } else if cost > 0 {
        match s.entries.back_mut() {
            Some((at, n)) if *at == now => *n += cost,
            _ => s.entries.push_back((now, cost)),
        }
        s.total += cost;
        d.remaining = left - cost;
    }
    if let Some(&(at, _)) = s.entries.back() {
        d.reset_after = gap(expiry(at, p), now);
    }
    d
}

pub fn is_fresh(s: &State, p: &Policy, now: Nanos) -> bool {
    s.entries
        .back()
        .is_none_or(|&(at, _)| expiry(at, p) <= now as u128)
}

/// Gives back `cost` units admitted at `admitted_at`: the admission's own entry shrinks (and
/// disappears at zero). Nothing else is credited, so a refund never lifts a key above fresh.
pub fn refund(s: &mut State, _p: &Policy, admitted_at: Nanos, cost: u64) {
    if let Some(i) = s.entries.iter().position(|&(at, _)| at == admitted_at) {
        let n = &mut s.entries[i].1;
        let back = cost.min(*n);
        *n -= back;
        s.total -= back;
        if *n == 0 {
            s.entries.remove(i);
        }
    }
}
