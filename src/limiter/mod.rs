//! The algorithm core: pure, deterministic rate-limiting decisions.
//!
//! Every function here takes the current *shard time* (`now`, integer nanoseconds) as an
//! argument, reads no clock, does no I/O and keeps no floats in its state, so replicas that
//! replay the same log of `(now, key, cost)` reach byte-identical state.
//!
//! One file per algorithm, each with a `Policy` (validated parameters), a `State` (per key,
//! `Default` is "never seen") and `decide(&mut state, &policy, now, cost) -> Decision`.
//! [`Limit`] and [`KeyState`] wrap the six algorithms in one type for callers that hold
//! policies of several kinds (the shard, the simulator).
//!
//! Conventions shared by all algorithms:
//! - `cost = 0` peeks: the answer is "allowed" with the current `remaining`, and the state's
//!   future decisions are unchanged.
//! - A cost larger than the policy's capacity can never succeed: the outcome is
//!   [`Outcome::Never`], distinct from [`Outcome::Denied`] ("not now, retry after").
//! - Time is monotone per key: shard time never runs backwards (the shard stamps each batch
//!   with `max(previous, ...)`), and the algorithms are specified for non-decreasing `now`.
//!   An earlier `now` never panics; the window algorithms and the token bucket treat it as
//!   the latest time they have seen.
//! - A denial changes nothing the key's future decisions depend on.
//! - Arithmetic is widened to `u128` where products can exceed `u64`, and saturates or denies
//!   rather than wraps, so no rate, period or cost can panic or over-admit.

pub mod fixed_window;
pub mod gcra;
pub mod leaky_queue;
pub mod sliding_counter;
pub mod sliding_log;
pub mod token_bucket;

use serde::{Deserialize, Serialize};
use std::fmt;

/// Shard time and durations, in nanoseconds.
pub type Nanos = u64;

/// One second in nanoseconds.
pub const SECOND: Nanos = 1_000_000_000;

/// The longest period a policy may have: 366 days. Bounding it keeps every product of a
/// period with a count inside `u128` (2^64 x 2^55), which is what makes the arithmetic exact.
pub const MAX_PERIOD: Nanos = 366 * 24 * 3600 * SECOND;

/// The largest limit a sliding-window-log policy may have. Its state holds up to `limit`
/// timestamps per key, so the limit is also the memory bound per key (16 bytes each).
pub const MAX_LOG_LIMIT: u64 = 100_000;

/// What a decision says about the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Admitted (for the leaky-bucket queue: admitted to start after [`Decision::delay`]).
    Allowed,
    /// Not now: it would succeed after [`Decision::retry_after`] if nothing else consumed.
    Denied,
    /// Never: the cost exceeds what the policy can ever grant at once.
    Never,
}

/// The answer to one check. All durations are exact nanoseconds from `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub outcome: Outcome,
    /// The policy's capacity: the most one key can be granted at once.
    pub limit: u64,
    /// The largest cost that would be admitted right now (after this decision's consumption).
    pub remaining: u64,
    /// Time until the key is back to its "never seen" state if nothing else arrives.
    pub reset_after: Nanos,
    /// For [`Outcome::Denied`]: the earliest time from now at which the same request would be
    /// admitted if nothing else consumed. Zero otherwise.
    pub retry_after: Nanos,
    /// For the leaky-bucket queue: how long the admitted request must wait before it starts.
    /// Zero for every other algorithm.
    pub delay: Nanos,
}

impl Decision {
    /// The answer when a shard cannot decide (`on_unavailable`): denied, retry in a second;
    /// or admitted. `limit` is the policy's capacity.
    pub fn unavailable(limit: u64, allow: bool) -> Self {
        Decision {
            outcome: if allow {
                Outcome::Allowed
            } else {
                Outcome::Denied
            },
            limit,
            remaining: 0,
            reset_after: 0,
            retry_after: if allow { 0 } else { SECOND },
            delay: 0,
        }
    }

    /// A cost above `limit`, the capacity: refused whatever the key's state (the
    /// algorithms' own answer, without their view of the key's remaining and reset).
    pub fn never(limit: u64) -> Self {
        Decision {
            outcome: Outcome::Never,
            limit,
            remaining: 0,
            reset_after: 0,
            retry_after: 0,
            delay: 0,
        }
    }

    /// True when the request was admitted (possibly with a [`Decision::delay`]).
    pub fn allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }

    /// `retry_after` in whole seconds, rounded up: waiting that long must succeed.
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.retry_after)
    }

    /// `reset_after` in whole seconds, rounded up.
    pub fn reset_after_secs(&self) -> u64 {
        ceil_secs(self.reset_after)
    }
}

/// Nanoseconds to whole seconds, rounded up.
pub fn ceil_secs(ns: Nanos) -> u64 {
    ns.div_ceil(SECOND)
}

/// Why a policy's parameters were refused. Messages name the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("`limit` must be at least 1 (a limit of 0 admits nothing; remove the policy instead)")]
    ZeroLimit,
    #[error("`burst` must be at least 1 (it is how many requests one key can make at once)")]
    ZeroBurst,
    #[error("`period` must be at least 1ns")]
    ZeroPeriod,
    #[error("`period` {0}ns is longer than the maximum of 366 days; use a shorter period")]
    PeriodTooLong(Nanos),
    #[error(
        "`limit` {0} is too large for sliding_log (at most {max}: its state keeps one timestamp per admitted unit); use sliding_counter for large limits",
        max = MAX_LOG_LIMIT
    )]
    LogLimitTooLarge(u64),
}

pub(crate) fn check_period(period: Nanos) -> Result<(), PolicyError> {
    match period {
        0 => Err(PolicyError::ZeroPeriod),
        p if p > MAX_PERIOD => Err(PolicyError::PeriodTooLong(p)),
        _ => Ok(()),
    }
}

/// A non-zero `u64` divisor with its reciprocal precomputed when the policy is built.
///
/// Hardware division (and `u128` division even more) costs more than the rest of a decision
/// together; with `m = floor((2^64 - 1) / d)`, `(x m) >> 64` is `x / d` or one less, so one
/// multiply and one correction give the exact quotient of any `u64` (larger dividends, which
/// only extreme parameters produce, fall back to plain division). Serialised as `d` alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "u64", into = "u64")]
pub struct Divisor {
    d: u64,
    m: u64,
}

impl From<u64> for Divisor {
    /// Zero (never produced by a validated policy) is treated as one rather than panicking.
    fn from(d: u64) -> Self {
        let d = d.max(1);
        Divisor { d, m: u64::MAX / d }
    }
}

impl From<Divisor> for u64 {
    fn from(v: Divisor) -> u64 {
        v.d
    }
}

impl Divisor {
    pub fn get(self) -> u64 {
        self.d
    }

    /// `(x / d, x % d)`, exact.
    #[inline]
    pub fn div_rem(self, x: u128) -> (u128, u64) {
        if x >> 64 != 0 {
            return (x / self.d as u128, (x % self.d as u128) as u64);
        }
        let x = x as u64;
        let mut q = ((x as u128 * self.m as u128) >> 64) as u64;
        let mut r = x - q * self.d;
        if r >= self.d {
            q += 1;
            r -= self.d;
        }
        (q as u128, r)
    }

    /// `x / d` saturated to `u64`.
    #[inline]
    pub fn div_sat(self, x: u128) -> u64 {
        u64::try_from(self.div_rem(x).0).unwrap_or(u64::MAX)
    }

    /// `ceil(x / d)` saturated to `u64` (durations past 584 years read as forever).
    #[inline]
    pub fn ceil_sat(self, x: u128) -> u64 {
        let (q, r) = self.div_rem(x);
        u64::try_from(q + (r != 0) as u128).unwrap_or(u64::MAX)
    }
}

/// A bucket's debt through a reload: `debt` scaled units where one unit of cost is `from`
/// scaled units (the old period), re-expressed where one unit is `to` (the new period),
/// rounded up, and capped at `capacity` units. Also says whether the cap cut it. Exact in
/// `u128` for any validated parameters (units below the capacity, times a period: 2^119).
fn rescale_debt(debt: u128, from: Nanos, to: Nanos, capacity: u64) -> (u128, bool) {
    let (from, to, capacity) = (from.max(1) as u128, to as u128, capacity as u128);
    let (units, part) = (debt / from, debt % from);
    if units > capacity || (units == capacity && part > 0) {
        return (capacity * to, true);
    }
    (units * to + (part * to).div_ceil(from), false)
}

/// The last-admission time (`admitted`, what a refund may give back: [`gcra::credit`]) a
/// bucket keeps through a reload at `now` from `old_rate` per `old_period` to `rate` per
/// `period` with `capacity`. A refund takes off what would have drained from the refunded
/// admission to the last one, at the key's current rate. Across a reload to a rate at least
/// the old one, that is at least what did drain, and the time is kept, unless the new
/// capacity `cut` the debt (a refund would then lift the key above one that never made the
/// admission). Otherwise it moves one full refill of the new limit past `now`: an admission
/// made before the reload gets nothing back, one made within that refill less than its due
/// (and if that is past the end of time, `Nanos::MAX`: nothing is ever given back).
fn admitted_after_reload(
    admitted: Nanos,
    now: Nanos,
    (old_rate, old_period): (u64, Nanos),
    (rate, period): (u64, Nanos),
    capacity: u64,
    cut: bool,
) -> Nanos {
    let as_fast = rate as u128 * old_period as u128 >= old_rate as u128 * period as u128;
    if as_fast && !cut {
        return admitted;
    }
    let refill = Divisor::from(rate).ceil_sat(capacity as u128 * period as u128);
    // Not `admitted.max(now) + refill`: a key whose limit flips back and forth (members
    // with two policy files during a rolling reload) would push it a refill further each
    // time, and its refunds would give nothing for ever longer.
    admitted.max(now.saturating_add(refill))
}

/// What a bucket (token bucket, GCRA, leaky queue) keeps through a reload at `now` from
/// `old` to `new` (each `(rate, period)`) with the new `capacity`: its `debt`, in scaled
/// units of the old period, rescaled to the new one ([`rescale_debt`]), and its last
/// admission's time `admitted`, as far as refunds may still give back from it
/// ([`admitted_after_reload`], which needs to know whether the capacity cut the debt).
pub(crate) fn carry_debt(
    debt: u128,
    admitted: Nanos,
    now: Nanos,
    old: (u64, Nanos),
    new: (u64, Nanos),
    capacity: u64,
) -> (u128, Nanos) {
    let (debt, cut) = rescale_debt(debt, old.1, new.1, capacity);
    let admitted = admitted_after_reload(admitted, now, old, new, capacity, cut);
    (debt, admitted)
}

/// `limit` units per window of `period`: the parameters of the fixed window and the
/// sliding window counter, with the window length's reciprocal precomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WindowPolicy {
    limit: u64,
    period: Divisor,
}

impl WindowPolicy {
    pub fn new(limit: u64, period: Nanos) -> Result<Self, PolicyError> {
        if limit == 0 {
            return Err(PolicyError::ZeroLimit);
        }
        check_period(period)?;
        Ok(WindowPolicy {
            limit,
            period: period.into(),
        })
    }
    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn period(&self) -> Nanos {
        self.period.get()
    }
    /// The index of the aligned window holding `now`.
    #[inline]
    pub fn window_of(&self, now: Nanos) -> u64 {
        self.period.div_rem(now as u128).0 as u64
    }
    /// `x / period`, exact.
    #[inline]
    pub(crate) fn div_period(&self, x: u128) -> u128 {
        self.period.div_rem(x).0
    }
}

/// The names of the algorithms, as written in policy files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    FixedWindow,
    SlidingLog,
    SlidingCounter,
    TokenBucket,
    /// Leaky bucket as a meter: the generic cell rate algorithm.
    Gcra,
    /// Leaky bucket as a queue: admitted requests are told how long to wait.
    LeakyQueue,
}

impl Algorithm {
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyQueue,
    ];

    /// The name used in policy files and reports.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingCounter => "sliding_counter",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyQueue => "leaky_queue",
        }
    }

    /// Parses a policy-file name; the error lists the accepted names.
    pub fn from_name(name: &str) -> Result<Self, String> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                format!(
                    "unknown algorithm `{name}`; use one of: {}",
                    names.join(", ")
                )
            })
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A validated limit of any algorithm.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Limit {
    FixedWindow(fixed_window::Policy),
    SlidingLog(sliding_log::Policy),
    SlidingCounter(sliding_counter::Policy),
    TokenBucket(token_bucket::Policy),
    Gcra(gcra::Policy),
    LeakyQueue(leaky_queue::Policy),
}

/// The per-key state of any algorithm. `KeyState::default_for(limit)` is "never seen".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyState {
    FixedWindow(fixed_window::State),
    SlidingLog(sliding_log::State),
    SlidingCounter(sliding_counter::State),
    TokenBucket(token_bucket::State),
    Gcra(gcra::State),
    LeakyQueue(leaky_queue::State),
}

impl Limit {
    /// Builds a limit from the common parameters: `limit` requests per `period`, and for the
    /// bucket algorithms (token bucket, GCRA, leaky queue) a `burst` capacity.
    /// Window algorithms ignore `burst`.
    pub fn new(
        algorithm: Algorithm,
        limit: u64,
        period: Nanos,
        burst: u64,
    ) -> Result<Self, PolicyError> {
        Ok(match algorithm {
            Algorithm::FixedWindow => Limit::FixedWindow(fixed_window::Policy::new(limit, period)?),
            Algorithm::SlidingLog => Limit::SlidingLog(sliding_log::Policy::new(limit, period)?),
            Algorithm::SlidingCounter => {
                Limit::SlidingCounter(sliding_counter::Policy::new(limit, period)?)
            }
            Algorithm::TokenBucket => {
                Limit::TokenBucket(token_bucket::Policy::new(limit, period, burst)?)
            }
            Algorithm::Gcra => Limit::Gcra(gcra::Policy::new(limit, period, burst)?),
            Algorithm::LeakyQueue => {
                Limit::LeakyQueue(leaky_queue::Policy::new(limit, period, burst)?)
            }
        })
    }

    /// This limit divided among `n` nodes (quota and capacity, each at least 1): what each
    /// node enforces alone under `on_unavailable = "local"`.
    pub fn share(&self, n: u64) -> Limit {
        let n = n.max(1);
        let part = |v: u64| (v / n).max(1);
        Limit::new(
            self.algorithm(),
            part(self.quota()),
            self.period(),
            part(self.capacity()),
        )
        .unwrap_or_else(|_| self.clone())
    }

    pub fn algorithm(&self) -> Algorithm {
        match self {
            Limit::FixedWindow(_) => Algorithm::FixedWindow,
            Limit::SlidingLog(_) => Algorithm::SlidingLog,
            Limit::SlidingCounter(_) => Algorithm::SlidingCounter,
            Limit::TokenBucket(_) => Algorithm::TokenBucket,
            Limit::Gcra(_) => Algorithm::Gcra,
            Limit::LeakyQueue(_) => Algorithm::LeakyQueue,
        }
    }

    /// The most one key can be granted at once; larger costs get [`Outcome::Never`].
    pub fn capacity(&self) -> u64 {
        match self {
            Limit::FixedWindow(p) => p.limit(),
            Limit::SlidingLog(p) => p.limit(),
            Limit::SlidingCounter(p) => p.limit(),
            Limit::TokenBucket(p) => p.capacity(),
            Limit::Gcra(p) => p.burst(),
            Limit::LeakyQueue(p) => p.capacity(),
        }
    }

    /// Units per period: the window algorithms' limit, the bucket algorithms' refill rate.
    /// (What `RateLimit-Policy` advertises; the capacity can be larger.)
    pub fn quota(&self) -> u64 {
        match self {
            Limit::FixedWindow(p) => p.limit(),
            Limit::SlidingLog(p) => p.limit(),
            Limit::SlidingCounter(p) => p.limit(),
            Limit::TokenBucket(p) => p.rate(),
            Limit::Gcra(p) => p.rate(),
            Limit::LeakyQueue(p) => p.rate(),
        }
    }

    /// The period: the window length, or the time the rate is counted over.
    pub fn period(&self) -> Nanos {
        match self {
            Limit::FixedWindow(p) => p.period(),
            Limit::SlidingLog(p) => p.period(),
            Limit::SlidingCounter(p) => p.period(),
            Limit::TokenBucket(p) => p.period(),
            Limit::Gcra(p) => p.period(),
            Limit::LeakyQueue(p) => p.period(),
        }
    }

    /// The "never seen" state for this limit.
    pub fn new_state(&self) -> KeyState {
        match self {
            Limit::FixedWindow(_) => KeyState::FixedWindow(Default::default()),
            Limit::SlidingLog(_) => KeyState::SlidingLog(Default::default()),
            Limit::SlidingCounter(_) => KeyState::SlidingCounter(Default::default()),
            Limit::TokenBucket(_) => KeyState::TokenBucket(Default::default()),
            Limit::Gcra(_) => KeyState::Gcra(Default::default()),
            Limit::LeakyQueue(_) => KeyState::LeakyQueue(Default::default()),
        }
    }

    /// Decides one request. A state of another algorithm (the policy was changed to a
    /// different algorithm) is replaced by a fresh one first.
    #[inline]
    pub fn decide(&self, state: &mut KeyState, now: Nanos, cost: u64) -> Decision {
        loop {
            return match (self, &mut *state) {
                (Limit::FixedWindow(p), KeyState::FixedWindow(s)) => {
                    fixed_window::decide(s, p, now, cost)
                }
                (Limit::SlidingLog(p), KeyState::SlidingLog(s)) => {
                    sliding_log::decide(s, p, now, cost)
                }
                (Limit::SlidingCounter(p), KeyState::SlidingCounter(s)) => {
                    sliding_counter::decide(s, p, now, cost)
                }
                (Limit::TokenBucket(p), KeyState::TokenBucket(s)) => {
                    token_bucket::decide(s, p, now, cost)
                }
                (Limit::Gcra(p), KeyState::Gcra(s)) => gcra::decide(s, p, now, cost),
                (Limit::LeakyQueue(p), KeyState::LeakyQueue(s)) => {
                    leaky_queue::decide(s, p, now, cost)
                }
                _ => {
                    *state = self.new_state();
                    continue;
                }
            };
        }
    }

    /// A reload changed a key's limit from `old` to this one: carries its `state` over, so
    /// that the key is neither handed a fresh allowance nor locked out by the change.
    ///
    /// - Fixed window, sliding counter: window numbers count periods, so a window state
    ///   numbered under a shorter period moves to the window `now` is in, keeping its counts
    ///   (it never grants more).
    /// - Token bucket, GCRA, leaky queue: their state is a debt in units scaled by the period
    ///   (the bucket's deficit) or by the rate (the GCRA's theoretical arrival time), which the
    ///   new parameters would misread. What the key has spent and not yet recovered at `now`,
    ///   in units of cost, is carried over (rounded up to the new scale, capped at the new
    ///   capacity) and owed again from `now` at the new rate: the key is granted at once no
    ///   more than the new capacity less that debt, and it is full again at the latest one new
    ///   refill (`capacity x period / rate`) after the reload. A refund of an admission made
    ///   before the reload may give back less than before it, never more ([`gcra::adopt`]).
    /// - Sliding log: its entries are absolute times, counted against the new period and limit
    ///   (the admissions it no longer holds, older than the old period, are forgotten).
    ///
    /// A state of another algorithm (the reload changed the limit's algorithm) is left as it
    /// is: [`Limit::decide`] replaces it with a fresh one, so an algorithm change gives every
    /// key a fresh allowance.
    pub fn adopt(&self, old: &Limit, state: &mut KeyState, now: Nanos) {
        match (self, old, state) {
            (Limit::FixedWindow(p), _, KeyState::FixedWindow(s)) => fixed_window::adopt(s, p, now),
            (Limit::SlidingCounter(p), _, KeyState::SlidingCounter(s)) => {
                sliding_counter::adopt(s, p, now)
            }
            (Limit::TokenBucket(p), Limit::TokenBucket(o), KeyState::TokenBucket(s)) => {
                token_bucket::adopt(s, o, p, now)
            }
            (Limit::Gcra(p), Limit::Gcra(o), KeyState::Gcra(s)) => gcra::adopt(s, o, p, now),
            (Limit::LeakyQueue(p), Limit::LeakyQueue(o), KeyState::LeakyQueue(s)) => {
                leaky_queue::adopt(s, o, p, now)
            }
            _ => {}
        }
    }

    /// Gives back `cost` units that a decision at `admitted_at` admitted: the compensation
    /// of the all-or-nothing rule when another limit of the same check denied. Right after the
    /// admission it undoes it exactly; later it never leaves the key better off than if that
    /// admission had never been made, nor above its fresh state.
    pub fn refund(&self, state: &mut KeyState, admitted_at: Nanos, cost: u64) {
        match (self, state) {
            (Limit::FixedWindow(p), KeyState::FixedWindow(s)) => {
                fixed_window::refund(s, p, admitted_at, cost)
            }
            (Limit::SlidingLog(p), KeyState::SlidingLog(s)) => {
                sliding_log::refund(s, p, admitted_at, cost)
            }
            (Limit::SlidingCounter(p), KeyState::SlidingCounter(s)) => {
                sliding_counter::refund(s, p, admitted_at, cost)
            }
            (Limit::TokenBucket(p), KeyState::TokenBucket(s)) => {
                token_bucket::refund(s, p, admitted_at, cost)
            }
            (Limit::Gcra(p), KeyState::Gcra(s)) => gcra::refund(s, p, admitted_at, cost),
            (Limit::LeakyQueue(p), KeyState::LeakyQueue(s)) => {
                leaky_queue::refund(s, p, admitted_at, cost)
            }
            // A state of another algorithm holds nothing this limit admitted.
            _ => {}
        }
    }

    /// True when `state` at `now` answers every future request exactly as a never-seen key
    /// would, so it may be dropped without granting anyone a fresh allowance.
    pub fn is_fresh(&self, state: &KeyState, now: Nanos) -> bool {
        match (self, state) {
            (Limit::FixedWindow(p), KeyState::FixedWindow(s)) => fixed_window::is_fresh(s, p, now),
            (Limit::SlidingLog(p), KeyState::SlidingLog(s)) => sliding_log::is_fresh(s, p, now),
            (Limit::SlidingCounter(p), KeyState::SlidingCounter(s)) => {
                sliding_counter::is_fresh(s, p, now)
            }
            (Limit::TokenBucket(p), KeyState::TokenBucket(s)) => token_bucket::is_fresh(s, p, now),
            (Limit::Gcra(p), KeyState::Gcra(s)) => gcra::is_fresh(s, p, now),
            (Limit::LeakyQueue(p), KeyState::LeakyQueue(s)) => leaky_queue::is_fresh(s, p, now),
            // A state of another algorithm is replaced on the next decision anyway.
            _ => true,
        }
    }
}
