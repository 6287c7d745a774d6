//! Leaky bucket as a meter: the generic cell rate algorithm (GCRA), as redis-cell's
//! `CL.THROTTLE` computes it. One "theoretical arrival time" (TAT) per key; a request of cost
//! `c` moves it `c` emission intervals (`period / rate`) into the future, and is admitted
//! while the TAT stays within `burst` intervals of now. `burst` is the capacity: how many
//! units a fresh key may take at once (redis-cell's `max_burst + 1`).
//!
//! Exact integers: times are kept *scaled by `rate`* (`ns x rate`), so the emission interval
//! is exactly `period` scaled units even when `period / rate` is not a whole number of
//! nanoseconds (redis-cell truncates it).
//!
//! The same admissions as a token bucket of the same rate and capacity (GCRA is its
//! "virtual scheduling" form); the property tests check that equivalence.

use super::{check_period, Decision, Divisor, Nanos, Outcome, PolicyError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy {
    rate: Divisor,
    period: Divisor,
    burst: u64,
}

impl Policy {
    /// `rate` units per `period` nanoseconds, with `burst` units available at once.
    ///
    /// ```
    /// use quorate::limiter::gcra::{decide, Policy, State};
    /// // redis-cell's `CL.THROTTLE key 15 30 60`: 30 per 60 s, max_burst 15 (capacity 16).
    /// let p = Policy::new(30, 60_000_000_000, 16).unwrap();
    /// let mut s = State::default();
    /// let d = decide(&mut s, &p, 0, 1);
    /// assert!(d.allowed());
    /// assert_eq!((d.limit, d.remaining, d.reset_after_secs()), (16, 15, 2));
    /// ```
    pub fn new(rate: u64, period: Nanos, burst: u64) -> Result<Self, PolicyError> {
        if rate == 0 {
            return Err(PolicyError::ZeroLimit);
        }
        if burst == 0 {
            return Err(PolicyError::ZeroBurst);
        }
        check_period(period)?;
        Ok(Policy {
            rate: rate.into(),
            period: period.into(),
            burst,
        })
    }
    pub fn rate(&self) -> u64 {
        self.rate.get()
    }
    pub fn period(&self) -> Nanos {
        self.period.get()
    }
    pub fn burst(&self) -> u64 {
        self.burst
    }
    pub(crate) fn rate_divisor(&self) -> Divisor {
        self.rate
    }
}

/// The theoretical arrival time, in nanoseconds x rate. Zero (any time <= now) is "fresh".
/// And the time of the last admission that moved it: how much a refund may give back
/// ([`refund`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    tat: u128,
    admitted: Nanos,
}

/// The scheduling core shared with the leaky-bucket queue. Returns the decision and the
/// backlog (TAT - now, scaled) that was ahead of the request.
#[inline(always)]
pub(crate) fn schedule(s: &mut State, p: &Policy, now: Nanos, cost: u64) -> (Decision, u128) {
    let capacity = p.burst;
    let (rate_w, period_w) = (p.rate() as u128, p.period() as u128);
    let now_s = now as u128 * rate_w;
    let tolerance = capacity as u128 * period_w;
    // Never more than `tolerance` for monotone time; clamped so a misuse cannot underflow.
    let backlog = s.tat.saturating_sub(now_s).min(tolerance);
    let mut ttl = backlog;
    let mut d = Decision {
        outcome: Outcome::Allowed,
        limit: capacity,
        remaining: 0,
        reset_after: 0,
        retry_after: 0,
        delay: 0,
    };
    if cost > capacity {
        d.outcome = Outcome::Never;
    } else {
        let after = backlog + cost as u128 * period_w;
        match now_s.checked_add(after) {
            Some(tat) if after <= tolerance => {
                if cost > 0 {
                    s.tat = tat;
                    s.admitted = s.admitted.max(now);
                    ttl = after;
                }
            }
            // Past the end of representable time (2^128 scaled units) nothing is admitted.
            None => {
                d.outcome = Outcome::Denied;
                d.retry_after = u64::MAX;
            }
            Some(_) => {
                d.outcome = Outcome::Denied;
                d.retry_after = p.rate.ceil_sat(after - tolerance);
            }
        }
    }
    d.remaining = p.period.div_sat(tolerance - ttl);
    d.reset_after = p.rate.ceil_sat(ttl);
    (d, backlog)
}

#[inline]
pub fn decide(s: &mut State, p: &Policy, now: Nanos, cost: u64) -> Decision {
    schedule(s, p, now, cost).0
}

/// True when nothing is scheduled after `now`: the key is as if never seen.
pub fn is_fresh(s: &State, p: &Policy, now: Nanos) -> bool {
    s.tat <= now as u128 * p.rate() as u128
}

/// A reload changed the key's limit from `old` to `p` (see [`super::Limit::adopt`]). The TAT
/// is a time scaled by the rate, and its distance from now, the backlog, counts `period`
/// scaled units per unit of cost: read at another rate it meant another time (a lowered rate
/// read it as far in the future — the key denied for about the shard's age, each denial
/// saying "retry in one interval" — and a raised rate as long past, a fresh burst). The
/// backlog at `now` under `old` (at most its tolerance), in units of cost, becomes the same
/// number of units under `p` (rounded up, at most `p`'s burst), owed from `now`.
///
/// `admitted` then keeps refunds on the safe side (`limiter::admitted_after_reload`): under
/// a slower rate, or a burst that cut the backlog, an admission made before the reload is
/// given nothing back.
pub fn adopt(s: &mut State, old: &Policy, p: &Policy, now: Nanos) {
    let old_tolerance = old.burst as u128 * old.period() as u128;
    let backlog = s
        .tat
        .saturating_sub(now as u128 * old.rate() as u128)
        .min(old_tolerance);
    let (backlog, admitted) = super::carry_debt(
        backlog,
        s.admitted,
        now,
        (old.rate(), old.period()),
        (p.rate(), p.period()),
        p.burst,
    );
    s.tat = if backlog == 0 {
        0
    } else {
        (now as u128 * p.rate() as u128).saturating_add(backlog)
    };
    s.admitted = admitted;
}

/// Gives back `cost` units admitted at `admitted_at`: moves the TAT back by `cost`
/// intervals, less the time from that admission to the key's last one. Right after the
/// admission (no admission since) that undoes it exactly. An admission since — made while
/// the refunded units were still held — may have found the key idle in a world without them,
/// and would then have started its interval later than it did here: pulling the TAT back by
/// the whole `cost` would credit that gap too, and admit more than the algorithm's bound.
/// Taking the gap off never credits more than a key that never made the refunded admission
/// holds (the property test `a_refund_never_admits_more_than_a_key_that_never_made_the_admission`).
/// An admission this state does not hold (after its last one) gets nothing back. A TAT at or
/// before now is "fresh", so a refund never grants more than a never-seen key has.
pub fn refund(s: &mut State, p: &Policy, admitted_at: Nanos, cost: u64) {
    let credit = credit(p.rate(), p.period(), s.admitted, admitted_at, cost);
    s.tat = s.tat.saturating_sub(credit);
}

/// What a refund of `cost` admitted at `admitted_at` may give back at `rate` per `period`,
/// in scaled time (a token bucket's deficit units alike): `cost` intervals less the time
/// from then to `last`, the key's last admission (nothing when that was before it: the
/// state does not hold it; nor when `last` is `Nanos::MAX`, which a reload leaves when
/// nothing admitted may be given back: `limiter::admitted_after_reload`).
pub(crate) fn credit(rate: u64, period: Nanos, last: Nanos, admitted_at: Nanos, cost: u64) -> u128 {
    if last < admitted_at || last == Nanos::MAX {
        return 0;
    }
    let gap = (last - admitted_at) as u128 * rate as u128;
    (cost as u128 * period as u128).saturating_sub(gap)
}
