//! Token bucket: `rate` tokens per `period`, refilled continuously, holding at most
//! `capacity`; a new key starts full. A request of cost `c` takes `c` tokens if it can.
//! Over any interval of length `t` it admits at most `capacity + rate x t / period` units.
//!
//! Exact integers: the bucket is kept as its *deficit* (how far below full it is) in units of
//! `1/period` token, so a refill over `dt` nanoseconds adds exactly `rate x dt` units — no
//! rounding, whatever the ratio of rate to period.

use super::{check_period, Decision, Divisor, Nanos, Outcome, PolicyError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy {
    rate: Divisor,
    period: Divisor,
    capacity: u64,
}

impl Policy {
    /// `rate` tokens per `period` nanoseconds, at most `capacity` held.
    ///
    /// ```
    /// use quorate::limiter::token_bucket::{decide, Policy, State};
    /// let p = Policy::new(1, 1_000, 2).unwrap();
    /// let mut s = State::default();
    /// assert!(decide(&mut s, &p, 0, 2).allowed());
    /// assert_eq!(decide(&mut s, &p, 0, 1).retry_after, 1_000);
    /// ```
    pub fn new(rate: u64, period: Nanos, capacity: u64) -> Result<Self, PolicyError> {
        if rate == 0 {
            return Err(PolicyError::ZeroLimit);
        }
        if capacity == 0 {
            return Err(PolicyError::ZeroBurst);
        }
        check_period(period)?;
        Ok(Policy {
            rate: rate.into(),
            period: period.into(),
            capacity,
        })
    }
    pub fn rate(&self) -> u64 {
        self.rate.get()
    }
    pub fn period(&self) -> Nanos {
        self.period.get()
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

/// Tokens missing from a full bucket (in `1/period` units) as of `last`, and the time of the
/// last admission that took any: how much a refund may give back ([`refund`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    deficit: u128,
    last: Nanos,
    admitted: Nanos,
}

fn refilled(s: &State, p: &Policy, now: Nanos) -> u128 {
    let dt = now.saturating_sub(s.last) as u128;
    s.deficit.saturating_sub(p.rate() as u128 * dt)
}

#[inline]
pub fn decide(s: &mut State, p: &Policy, now: Nanos, cost: u64) -> Decision {
    s.deficit = refilled(s, p, now);
    s.last = s.last.max(now);
    let period = p.period() as u128;
    let full = p.capacity as u128 * period;
    // deficit <= full, unless a reload lowered the capacity since the key spent it.
    let level = full.saturating_sub(s.deficit);
    let mut d = Decision {
        outcome: Outcome::Allowed,
        limit: p.capacity,
        remaining: p.period.div_sat(level),
        reset_after: 0,
        retry_after: 0,
        delay: 0,
    };
    if cost > p.capacity {
        d.outcome = Outcome::Never;
    } else {
        let need = cost as u128 * period;
        if need <= level {
            s.deficit += need;
            if cost > 0 {
                s.admitted = s.admitted.max(now);
            }
            d.remaining = p.period.div_sat(level - need);
        } else {
            d.outcome = Outcome::Denied;
            d.retry_after = p.rate.ceil_sat(need + s.deficit - full);
        }
    }
    d.reset_after = p.rate.ceil_sat(s.deficit);
    d
}

/// A reload changed the key's limit from `old` to `p` (see [`super::Limit::adopt`]). The
/// deficit counts `period` units per token: read under another period it meant another
/// number of tokens (10 per second made 10 per minute: a deficit of the whole bucket read
/// as a sixtieth of it, nine tokens handed out at once). The deficit at `now` under `old`,
/// in tokens, becomes the same number of tokens under `p` (rounded up, at most `p`'s
/// capacity), refilled from `now` at `p`'s rate; `admitted` as for the GCRA
/// (`limiter::admitted_after_reload`).
pub fn adopt(s: &mut State, old: &Policy, p: &Policy, now: Nanos) {
    let deficit = refilled(s, old, now);
    (s.deficit, s.admitted) = super::carry_debt(
        deficit,
        s.admitted,
        now,
        (old.rate(), old.period()),
        (p.rate(), p.period()),
        p.capacity,
    );
    s.last = s.last.max(now);
}

pub fn is_fresh(s: &State, p: &Policy, now: Nanos) -> bool {
    refilled(s, p, now) == 0
}

/// Puts back `cost` tokens taken at `admitted_at`, less what the bucket refilled between
/// then and its last admission, never more than the bucket's capacity: exact right after
/// the admission, and never more than a bucket that never made it holds (the bucket is a
/// GCRA in other units: see [`super::gcra::refund`]).
pub fn refund(s: &mut State, p: &Policy, admitted_at: Nanos, cost: u64) {
    let credit = super::gcra::credit(p.rate(), p.period(), s.admitted, admitted_at, cost);
    s.deficit = s.deficit.saturating_sub(credit);
}
