//! Leaky bucket as a queue: traffic shaping. Requests leave the bucket at `rate` per
//! `period`; instead of "no", an admitted request is told "start after `delay`" — the time
//! until the requests queued ahead of it have drained. The queue holds at most `capacity`
//! units (the one being served included), so `delay <= (capacity - cost) x period / rate`;
//! beyond that a request is rejected. This is nginx's `limit_req burst=capacity-1` without
//! `nodelay`.
//!
//! It admits exactly what the GCRA meter of the same rate and capacity admits: the two are
//! the same virtual schedule, read differently (the meter lets the request through now; the
//! queue tells it when its turn comes). It shares the meter's exact scaled arithmetic.

use super::gcra::{self, schedule, State as GcraState};
use super::{Decision, Nanos, PolicyError};
use serde::{Deserialize, Serialize};

/// The meter's parameters, read as a queue: `burst` is the queue's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy(gcra::Policy);

impl Policy {
    /// Drains `rate` units per `period` nanoseconds; at most `capacity` units queued.
    ///
    /// ```
    /// use quorate::limiter::leaky_queue::{decide, Policy, State};
    /// let p = Policy::new(1, 100, 3).unwrap();
    /// let mut s = State::default();
    /// let delays: Vec<_> = (0..3).map(|_| decide(&mut s, &p, 0, 1).delay).collect();
    /// assert_eq!(delays, [0, 100, 200]);
    /// assert!(!decide(&mut s, &p, 0, 1).allowed());
    /// ```
    pub fn new(rate: u64, period: Nanos, capacity: u64) -> Result<Self, PolicyError> {
        gcra::Policy::new(rate, period, capacity).map(Policy)
    }
    pub fn rate(&self) -> u64 {
        self.0.rate()
    }
    pub fn period(&self) -> Nanos {
        self.0.period()
    }
    pub fn capacity(&self) -> u64 {
        self.0.burst()
    }
}

/// When the queue drains (scaled by rate), as for the meter.
pub type State = GcraState;

#[inline]
pub fn decide(s: &mut State, p: &Policy, now: Nanos, cost: u64) -> Decision {
    let (mut d, backlog) = schedule(s, &p.0, now, cost);
    if d.allowed() {
        d.delay = p.0.rate_divisor().ceil_sat(backlog);
    }
    d
}

pub fn is_fresh(s: &State, p: &Policy, now: Nanos) -> bool {
    gcra::is_fresh(s, &p.0, now)
}

/// A reload changed the queue's limit from `old` to `p`: the units queued at `now` stay
/// queued under `p`, at most its capacity (see [`gcra::adopt`]).
pub fn adopt(s: &mut State, old: &Policy, p: &Policy, now: Nanos) {
    gcra::adopt(s, &old.0, &p.0, now)
}

/// Takes `cost` units admitted at `admitted_at` back out of the queue (see [`gcra::refund`]).
pub fn refund(s: &mut State, p: &Policy, admitted_at: Nanos, cost: u64) {
    gcra::refund(s, &p.0, admitted_at, cost)
}
