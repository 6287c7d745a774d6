//! Edge cases of the algorithm core, one behaviour per test: boundary instants, cost 0,
//! cost above capacity, time standing still, long idle gaps and the u64 extremes.

use quorate::limiter::{
    gcra, leaky_queue, Algorithm, Decision, KeyState, Limit, Outcome, MAX_LOG_LIMIT, MAX_PERIOD,
    SECOND,
};

const MS: u64 = 1_000_000;

fn limit(alg: Algorithm, limit: u64, period: u64, burst: u64) -> Limit {
    Limit::new(alg, limit, period, burst).unwrap()
}

/// Each algorithm at 10 per second, capacity 10.
fn all_ten_per_second() -> Vec<Limit> {
    Algorithm::ALL
        .iter()
        .map(|&a| limit(a, 10, SECOND, 10))
        .collect()
}

fn admitted(l: &Limit, s: &mut KeyState, times: impl IntoIterator<Item = u64>) -> usize {
    times
        .into_iter()
        .filter(|&t| l.decide(s, t, 1).allowed())
        .count()
}

#[test]
fn fixed_window_resets_exactly_at_the_boundary_instant() {
    let l = limit(Algorithm::FixedWindow, 3, SECOND, 0);
    let mut s = l.new_state();
    assert_eq!(admitted(&l, &mut s, [0, 0, 0]), 3);
    let d = l.decide(&mut s, SECOND - 1, 1);
    assert_eq!((d.outcome, d.retry_after), (Outcome::Denied, 1));
    assert!(l.decide(&mut s, SECOND, 1).allowed());
}

#[test]
fn fixed_window_admits_twice_the_limit_across_a_boundary() {
    let l = limit(Algorithm::FixedWindow, 10, SECOND, 0);
    let mut s = l.new_state();
    let times = (0..10)
        .map(|i| SECOND - 10 + i)
        .chain((0..10).map(|i| SECOND + i));
    assert_eq!(admitted(&l, &mut s, times), 20);
}

#[test]
fn windows_are_aligned_to_multiples_of_the_period_since_time_zero() {
    let l = limit(Algorithm::FixedWindow, 1, 100, 0);
    let mut s = l.new_state();
    assert!(l.decide(&mut s, 250, 1).allowed());
    // The window is [200, 300), not [250, 350).
    assert_eq!(l.decide(&mut s, 251, 1).retry_after, 49);
    assert!(l.decide(&mut s, 300, 1).allowed());
}

#[test]
fn sliding_log_admits_again_exactly_one_period_after_the_oldest_admission() {
    let l = limit(Algorithm::SlidingLog, 2, SECOND, 0);
    let mut s = l.new_state();
    assert_eq!(admitted(&l, &mut s, [100, 200]), 2);
    assert_eq!(l.decide(&mut s, 500, 1).retry_after, SECOND + 100 - 500);
    assert!(!l.decide(&mut s, SECOND + 99, 1).allowed());
    assert!(l.decide(&mut s, SECOND + 100, 1).allowed());
}

#[test]
fn sliding_log_state_is_bounded_by_the_limit_not_by_traffic() {
    let l = limit(Algorithm::SlidingLog, 50, SECOND, 0);
    let mut s = l.new_state();
    for t in 0..100_000u64 {
        l.decide(&mut s, t * 1_000, 1);
    }
    let KeyState::SlidingLog(log) = &s else {
        unreachable!()
    };
    assert!(log.len() <= 50, "{} entries", log.len());
}

#[test]
fn sliding_log_refuses_a_limit_above_its_memory_bound() {
    let err = Limit::new(Algorithm::SlidingLog, MAX_LOG_LIMIT + 1, SECOND, 0).unwrap_err();
    assert!(err.to_string().contains("sliding_counter"), "{err}");
}

#[test]
fn sliding_counter_weights_the_previous_window_by_the_part_still_covered() {
    let l = limit(Algorithm::SlidingCounter, 10, SECOND, 0);
    let mut s = l.new_state();
    assert!(l.decide(&mut s, 0, 10).allowed());
    // 30% into the next window, 70% of the previous 10 still count: 7, so 3 remain.
    assert_eq!(l.decide(&mut s, SECOND + 300 * MS, 0).remaining, 3);
    assert!(l.decide(&mut s, SECOND + 300 * MS, 3).allowed());
    assert!(!l.decide(&mut s, SECOND + 300 * MS, 1).allowed());
}

#[test]
fn sliding_counter_admits_while_estimate_plus_cost_minus_one_is_below_the_limit() {
    // prev = 5 at 50% -> estimate 2.5 + curr 0. Cost 8: 2.5 + 8 - 1 = 9.5 < 10: admitted.
    let l = limit(Algorithm::SlidingCounter, 10, SECOND, 0);
    let mut s = l.new_state();
    assert!(l.decide(&mut s, 0, 5).allowed());
    assert!(l.decide(&mut s.clone(), SECOND + 500 * MS, 8).allowed());
    // Cost 9: 2.5 + 9 - 1 = 10.5, not below 10.
    assert!(!l.decide(&mut s, SECOND + 500 * MS, 9).allowed());
}

#[test]
fn token_bucket_starts_full_and_refills_continuously() {
    let l = limit(Algorithm::TokenBucket, 10, SECOND, 20);
    let mut s = l.new_state();
    assert!(l.decide(&mut s, 0, 20).allowed());
    let d = l.decide(&mut s, 0, 1);
    assert_eq!((d.outcome, d.retry_after), (Outcome::Denied, 100 * MS));
    assert_eq!(l.decide(&mut s, 250 * MS, 0).remaining, 2);
    assert_eq!(l.decide(&mut s, 250 * MS, 0).reset_after, 1_750 * MS);
}

#[test]
fn token_bucket_refills_a_rate_that_does_not_divide_the_period_exactly() {
    // 3 per second: one token every 333_333_333.3 ns. Empty the bucket, then each token
    // arrives at ceil(k x 10^9 / 3) exactly: no drift from rounding, three in one second.
    let l = limit(Algorithm::TokenBucket, 3, SECOND, 3);
    let mut s = l.new_state();
    assert!(l.decide(&mut s, 0, 3).allowed());
    assert_eq!(l.decide(&mut s, 0, 1).retry_after, 333_333_334);
    for at in [333_333_334, 666_666_667, SECOND] {
        assert!(!l.decide(&mut s, at - 1, 1).allowed(), "{at}");
        assert!(l.decide(&mut s, at, 1).allowed(), "{at}");
    }
}

/// redis-cell's own test table (its `it_rate_limits`), 5 per second with max_burst 4:
/// (ms since start, quantity, remaining, reset_after ms, retry_after ms or -1, limited).
#[test]
fn gcra_gives_the_answers_of_redis_cells_own_test_table() {
    let cases: [(u64, u64, u64, u64, i64, bool); 15] = [
        (0, 6, 5, 0, -1, true),
        (0, 1, 4, 1000, -1, false),
        (0, 1, 3, 2000, -1, false),
        (0, 1, 2, 3000, -1, false),
        (0, 1, 1, 4000, -1, false),
        (0, 1, 0, 5000, -1, false),
        (0, 1, 0, 5000, 1000, true),
        (3000, 1, 2, 3000, -1, false),
        (3100, 1, 1, 3900, -1, false),
        (4000, 1, 1, 4000, -1, false),
        (8000, 1, 4, 1000, -1, false),
        (9500, 1, 4, 1000, -1, false),
        (9500, 0, 4, 1000, -1, false),
        (9500, 2, 2, 3000, -1, false),
        (9500, 5, 2, 3000, 3000, true),
    ];
    let p = gcra::Policy::new(1, SECOND, 5).unwrap();
    let mut s = gcra::State::default();
    let start = 1_700_000_000 * SECOND;
    for (i, (at, qty, remaining, reset, retry, limited)) in cases.into_iter().enumerate() {
        let d = gcra::decide(&mut s, &p, start + at * MS, qty);
        assert_eq!(d.limit, 5, "case {i}");
        assert_eq!(!d.allowed(), limited, "case {i}: {d:?}");
        assert_eq!(d.remaining, remaining, "case {i}: {d:?}");
        assert_eq!(d.reset_after, reset * MS, "case {i}: {d:?}");
        let retry_ns = if retry < 0 { 0 } else { retry as u64 * MS };
        assert_eq!(d.retry_after, retry_ns, "case {i}: {d:?}");
    }
}

#[test]
fn leaky_queue_delays_instead_of_rejecting_until_the_queue_is_full() {
    let p = leaky_queue::Policy::new(10, SECOND, 3).unwrap();
    let mut s = leaky_queue::State::default();
    let delays: Vec<_> = (0..3)
        .map(|_| leaky_queue::decide(&mut s, &p, 0, 1).delay)
        .collect();
    assert_eq!(delays, [0, 100 * MS, 200 * MS]);
    let d = leaky_queue::decide(&mut s, &p, 0, 1);
    assert_eq!((d.outcome, d.retry_after), (Outcome::Denied, 100 * MS));
    // As the queue drains, a new request waits only for what is still ahead of it.
    assert_eq!(leaky_queue::decide(&mut s, &p, 150 * MS, 1).delay, 150 * MS);
}

#[test]
fn cost_zero_peeks_without_consuming() {
    for l in all_ten_per_second() {
        let mut s = l.new_state();
        assert!(l.decide(&mut s, 0, 4).allowed());
        let before = s.clone();
        let peek = l.decide(&mut s, 0, 0);
        assert!(peek.allowed(), "{:?}", l.algorithm());
        assert_eq!(peek.remaining, 6, "{:?}", l.algorithm());
        assert_eq!(s, before, "{:?}: a peek changed the state", l.algorithm());
    }
}

#[test]
fn cost_above_capacity_is_never_not_retry_later() {
    for l in all_ten_per_second() {
        let mut s = l.new_state();
        let before = s.clone();
        let d = l.decide(&mut s, 5, 11);
        assert_eq!(d.outcome, Outcome::Never, "{:?}", l.algorithm());
        assert_eq!((d.retry_after, d.remaining), (0, 10), "{:?}", l.algorithm());
        let full = l.decide(&mut s, 5, 10);
        assert_eq!(
            full,
            l.decide(&mut before.clone(), 5, 10),
            "{:?}",
            l.algorithm()
        );
        assert!(full.allowed(), "{:?}: capacity itself fits", l.algorithm());
    }
}

#[test]
fn time_standing_still_grants_the_capacity_once() {
    for l in all_ten_per_second() {
        let mut s = l.new_state();
        let t = 7 * SECOND + 3;
        assert_eq!(
            admitted(&l, &mut s, std::iter::repeat_n(t, 1_000)),
            10,
            "{:?}",
            l.algorithm()
        );
    }
}

#[test]
fn a_very_long_idle_gap_leaves_the_key_as_if_never_seen() {
    for l in all_ten_per_second() {
        let mut s = l.new_state();
        assert_eq!(admitted(&l, &mut s, [0; 10]), 10);
        let later = u64::MAX / 2;
        assert!(l.is_fresh(&s, later), "{:?}", l.algorithm());
        assert_eq!(
            l.decide(&mut s, later, 3),
            l.decide(&mut l.new_state(), later, 3)
        );
    }
}

#[test]
fn an_exhausted_key_is_not_fresh_so_eviction_cannot_reset_it() {
    for l in all_ten_per_second() {
        let mut s = l.new_state();
        assert_eq!(admitted(&l, &mut s, [SECOND / 2; 10]), 10);
        assert!(!l.is_fresh(&s, SECOND / 2 + 1), "{:?}", l.algorithm());
    }
}

#[test]
fn a_state_of_another_algorithm_is_replaced_by_a_fresh_one() {
    let tb = limit(Algorithm::TokenBucket, 1, SECOND, 1);
    let fw = limit(Algorithm::FixedWindow, 5, SECOND, 0);
    let mut s = tb.new_state();
    assert!(tb.decide(&mut s, 0, 1).allowed());
    assert_eq!(fw.decide(&mut s, 0, 1).remaining, 4);
    assert!(matches!(s, KeyState::FixedWindow(_)));
}

#[test]
fn extremes_of_rate_period_cost_and_time_never_panic_or_over_admit() {
    let log_max = MAX_LOG_LIMIT;
    let costs = [0, 1, 2, u64::MAX / 2, u64::MAX - 1, u64::MAX];
    let times = [0, 1, MAX_PERIOD, u64::MAX / 2, u64::MAX - 1, u64::MAX];
    for alg in Algorithm::ALL {
        let top = if alg == Algorithm::SlidingLog {
            log_max
        } else {
            u64::MAX
        };
        for n in [1, 2, top - 1, top] {
            for period in [1, 2, SECOND, MAX_PERIOD - 1, MAX_PERIOD] {
                let l = limit(alg, n, period, n);
                let mut s = l.new_state();
                for &t in &times {
                    for &c in &costs {
                        let d: Decision = l.decide(&mut s, t, c);
                        assert_eq!(
                            d.outcome == Outcome::Never,
                            c > n,
                            "{alg:?} {n} {period} {t} {c}"
                        );
                        assert!(d.remaining <= n);
                        let _ = (
                            d.retry_after_secs(),
                            d.reset_after_secs(),
                            l.is_fresh(&s, t),
                        );
                    }
                }
                // A fresh key at the end of time grants its capacity once, not twice.
                let mut s = l.new_state();
                let first = l.decide(&mut s, u64::MAX, n);
                let second = l.decide(&mut s, u64::MAX, n);
                assert!(
                    !(first.allowed() && second.allowed()),
                    "{alg:?} {n} {period}"
                );
            }
        }
    }
}

#[test]
fn the_largest_period_and_the_zero_values_are_validated() {
    for alg in Algorithm::ALL {
        assert!(Limit::new(alg, 1, MAX_PERIOD + 1, 1).is_err());
        assert!(Limit::new(alg, 1, 0, 1).is_err());
        assert!(Limit::new(alg, 0, SECOND, 1).is_err());
    }
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyQueue,
    ] {
        assert!(Limit::new(alg, 1, SECOND, 0).is_err());
    }
}

#[test]
fn retry_after_in_seconds_rounds_up_never_down() {
    let d = |ns| Decision {
        outcome: Outcome::Denied,
        limit: 1,
        remaining: 0,
        reset_after: ns,
        retry_after: ns,
        delay: 0,
    };
    assert_eq!(d(1).retry_after_secs(), 1);
    assert_eq!(d(SECOND).retry_after_secs(), 1);
    assert_eq!(d(SECOND + 1).retry_after_secs(), 2);
    assert_eq!(d(0).retry_after_secs(), 0);
    assert_eq!(d(u64::MAX).reset_after_secs(), u64::MAX.div_ceil(SECOND));
}

/// A reload may shrink a limit while keys keep their state: a key spent under the larger
/// limit is decided under the smaller one without a panic or an overflow, and is denied
/// (it has spent more than the smaller limit allows), until time gives it back.
#[test]
fn a_key_spent_under_a_larger_limit_is_denied_under_a_smaller_one() {
    for alg in Algorithm::ALL {
        let large = limit(alg, 100, SECOND, 100);
        let small = limit(alg, 10, SECOND, 10);
        let mut s = large.new_state();
        assert_eq!(
            admitted(&large, &mut s, (0..100).map(|i| i * 1000)),
            100,
            "{alg:?}"
        );
        let d = small.decide(&mut s, 100 * 1000, 1);
        assert_eq!(d.outcome, Outcome::Denied, "{alg:?}: {d:?}");
        assert_eq!(d.remaining, 0, "{alg:?}: {d:?}");
        assert!(d.retry_after > 0, "{alg:?}: {d:?}");
        // Long after, the key is as fresh under the small limit as a new one.
        let later = 100 * SECOND;
        assert!(small.decide(&mut s, later, 1).allowed(), "{alg:?}");
    }
}

/// A reload may lengthen a period while keys keep their state: a key spent under the short
/// period is admitted again under the long one within two long periods, not after a time
/// that grows with the shard's age (window numbers were counted in the short period's units;
/// without `Limit::adopt` the fixed window waited 1.9 years here).
#[test]
fn a_key_spent_under_a_short_period_recovers_under_a_longer_one() {
    for alg in Algorithm::ALL {
        let short = limit(alg, 10, SECOND, 10);
        let long = limit(alg, 10, 60 * SECOND, 10);
        let start = 1_000_000 * SECOND; // a shard some days old
        let mut s = short.new_state();
        assert_eq!(
            admitted(&short, &mut s, (0..10).map(|i| start + i)),
            10,
            "{alg:?}"
        );
        let later = start + 120 * SECOND;
        long.adopt(&short, &mut s, later); // what a shard does when a key's limit changed
        let d = long.decide(&mut s, later, 1);
        if !d.allowed() {
            assert!(d.retry_after <= 120 * SECOND, "{alg:?}: {d:?}");
            let again = long.decide(&mut s, later + d.retry_after, 1);
            assert!(again.allowed(), "{alg:?}: {again:?} after its retry_after");
        }
    }
}

const DAY: u64 = 24 * 3600 * SECOND;

/// The algorithms whose state is a debt in units scaled by the rate or the period.
const BUCKETS: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::LeakyQueue,
];

/// Reloads of a bucket of 10 per second, capacity 10, to (rate, period, capacity).
const BUCKET_CHANGES: [(u64, u64, u64); 8] = [
    (5, SECOND, 10),        // rate lowered
    (20, SECOND, 10),       // rate raised
    (3, SECOND, 10),        // lowered to an interval that is not a whole number of ns
    (600, 60 * SECOND, 10), // the same rate over a longer period
    (1, 100 * MS, 10),      // the same rate over a shorter period
    (10, 60 * SECOND, 10),  // the same quota over a longer period: 60 times slower
    (10, SECOND, 5),        // capacity lowered
    (20, SECOND, 20),       // rate and capacity raised
];

/// `a x b / c`, rounded up.
fn mul_div_ceil(a: u64, b: u64, c: u64) -> u64 {
    u64::try_from((a as u128 * b as u128).div_ceil(c as u128)).unwrap()
}

/// Each bucket algorithm's key before a reload, at each shard age the reload tests run at:
/// (the shard time, the algorithm, its limit of 10 per second with capacity 10).
fn bucket_keys() -> impl Iterator<Item = (u64, Algorithm, Limit)> {
    [1_000 * SECOND, 30 * DAY].into_iter().flat_map(|start| {
        BUCKETS
            .into_iter()
            .map(move |alg| (start, alg, limit(alg, 10, SECOND, 10)))
    })
}

/// One reload of [`bucket_reloads`]: from `old` (10 per second, capacity 10) to `new`,
/// `rate` per `period` with capacity `cap`, at a shard time of `start`.
struct Reload {
    start: u64,
    old: Limit,
    new: Limit,
    rate: u64,
    period: u64,
    cap: u64,
    /// What the assertions name.
    what: String,
}

/// Every reload of [`BUCKET_CHANGES`], of each bucket algorithm, at each shard age.
fn bucket_reloads() -> impl Iterator<Item = Reload> {
    bucket_keys().flat_map(|(start, alg, old)| {
        BUCKET_CHANGES
            .into_iter()
            .map(move |(rate, period, cap)| Reload {
                start,
                old: old.clone(),
                new: limit(alg, rate, period, cap),
                rate,
                period,
                cap,
                what: format!("{alg:?} at {start}: 10/s, 10 -> {rate} per {period}, {cap}"),
            })
    })
}

/// How many requests of cost 1 a copy of `s` admits at `t`, one after the other.
fn burst_at(l: &Limit, s: &KeyState, t: u64) -> u64 {
    let mut s = s.clone();
    let mut n = 0;
    while n <= l.capacity() && l.decide(&mut s, t, 1).allowed() {
        n += 1;
    }
    n
}

/// A reload that changes a bucket's rate, period or capacity carries what the key has spent
/// and not yet recovered over in the new limit's units (capped at its capacity), at a shard
/// time of any age: the key is granted at once exactly what the new limit has left after
/// that debt (no fresh burst), it is full again one new refill after the reload (no lockout
/// that grows with the shard's age), and the `retry_after` of a denial is exact.
/// (Before `Limit::adopt` converted these states, a lowered rate read the GCRA's stored time
/// at the new scale and locked the key out for about the shard's age, while each denial said
/// "retry in one interval"; a raised rate or longer period gave a whole new burst at once.)
#[test]
fn a_reload_carries_a_bucket_keys_debt_over_in_the_new_limits_units() {
    for Reload {
        start,
        old,
        new,
        rate,
        period,
        cap,
        what,
    } in bucket_reloads()
    {
        let mut s = old.new_state();
        assert_eq!(admitted(&old, &mut s, [start; 10]), 10, "{what}");
        // 300 ms later three units are back: the key owes seven.
        let at = start + 300 * MS;
        new.adopt(&old, &mut s, at);
        let owed = 7.min(cap);
        assert_eq!(
            burst_at(&new, &s, at),
            cap - owed,
            "{what}: admitted at once after the reload"
        );
        // Spent to the last unit: the denial's retry_after is one new interval, and
        // exact (denied a nanosecond earlier, admitted then).
        let mut spent = s.clone();
        assert_eq!(
            admitted(&new, &mut spent, (owed..cap).map(|_| at)) as u64,
            cap - owed
        );
        let d = new.decide(&mut spent, at, 1);
        assert_eq!(d.outcome, Outcome::Denied, "{what}: {d:?}");
        assert_eq!(
            d.retry_after,
            mul_div_ceil(1, period, rate),
            "{what}: {d:?}"
        );
        let retry = at + d.retry_after;
        assert!(
            !new.decide(&mut spent.clone(), retry - 1, 1).allowed(),
            "{what}"
        );
        let again = new.decide(&mut spent, retry, 1);
        assert!(again.allowed(), "{what}: {again:?} at its retry_after");
        // Full again one refill of the new limit after the reload.
        let refill = mul_div_ceil(cap, period, rate);
        assert_eq!(
            burst_at(&new, &s, at + refill),
            cap,
            "{what}: after a refill"
        );
    }
}

/// A bucket key that had recovered fully before a reload owes nothing: it gets the new
/// limit's whole capacity at once, whatever the change and the shard's age.
#[test]
fn a_bucket_key_recovered_before_a_reload_gets_the_new_full_burst() {
    for Reload {
        start,
        old,
        new,
        cap,
        what,
        ..
    } in bucket_reloads()
    {
        let mut s = old.new_state();
        assert_eq!(admitted(&old, &mut s, [start - 10 * SECOND; 10]), 10);
        new.adopt(&old, &mut s, start);
        assert_eq!(burst_at(&new, &s, start), cap, "{what}");
    }
}

/// A refund of a bucket key never leaves it better off than a key that never made the
/// refunded admission, when reloads changed the key's limit and changed it back before the
/// refund came (the shard refunds only under the key's current limit, the admission's own:
/// as nodes with the old and the new policy file send checks during a rollout). The refund
/// counts what drained since the admission at the current rate; a faster rate in between,
/// or a capacity that cut the debt, took more: nothing admitted before such a reload is
/// given back. And a refund right after an admission under a rate that is at least the old
/// one gives it back whole, as without a reload.
#[test]
fn a_refund_after_reloads_never_leaves_a_key_better_off_than_without_the_admission() {
    for (start, alg, old) in bucket_keys() {
        let what = format!("{alg:?} at {start}");
        // A faster rate in between: `x` admits 5 and refunds them after the round trip,
        // `y` never admits them.
        let faster = limit(alg, 40, SECOND, 10);
        let (mut x, mut y) = (old.new_state(), old.new_state());
        assert!(old.decide(&mut x, start, 5).allowed());
        faster.adopt(&old, &mut x, start);
        faster.adopt(&old, &mut y, start);
        // 100 ms later `x` owes one unit, `y` nothing; both admit one.
        let back = start + 100 * MS;
        assert!(faster.decide(&mut x, back, 1).allowed());
        assert!(faster.decide(&mut y, back, 1).allowed());
        old.adopt(&faster, &mut x, back);
        old.adopt(&faster, &mut y, back);
        old.refund(&mut x, start, 5);
        assert_eq!(burst_at(&old, &y, back), 9, "{what}");
        assert!(
            burst_at(&old, &x, back) <= 9,
            "{what}: the refund gave back too much"
        );

        // A capacity that cut the debt in between: `x` owes 10 (5 of them refunded
        // later), `y` 5; both owe 5 under the smaller capacity.
        let smaller = limit(alg, 10, SECOND, 5);
        let (mut x, mut y) = (old.new_state(), old.new_state());
        assert!(old.decide(&mut x, start, 5).allowed());
        assert!(old.decide(&mut x, start, 5).allowed());
        assert!(old.decide(&mut y, start, 5).allowed());
        for s in [&mut x, &mut y] {
            smaller.adopt(&old, s, start);
            old.adopt(&smaller, s, start);
        }
        old.refund(&mut x, start, 5);
        assert_eq!(burst_at(&old, &y, start), 5, "{what}");
        assert!(
            burst_at(&old, &x, start) <= 5,
            "{what}: the refund gave back too much"
        );

        // A rate raised for good: a refund right after an admission is exact.
        let mut s = old.new_state();
        assert_eq!(admitted(&old, &mut s, [start; 10]), 10);
        let raised = limit(alg, 20, SECOND, 10);
        raised.adopt(&old, &mut s, start);
        let later = start + 100 * MS;
        assert_eq!(burst_at(&raised, &s, later), 2, "{what}");
        assert!(raised.decide(&mut s, later, 1).allowed());
        raised.refund(&mut s, later, 1);
        assert_eq!(
            burst_at(&raised, &s, later),
            2,
            "{what}: not given back whole"
        );
    }
}

/// A reload between extreme bucket parameters (limits up to `u64::MAX`, periods of 1 ns to
/// 366 days) neither panics nor hands out what the key owes: a key that spent its whole old
/// capacity has nothing left under a new capacity no larger, and a denial's `retry_after` is
/// never longer than the new limit's full refill.
#[test]
fn a_reload_between_extreme_bucket_parameters_never_panics_or_over_admits() {
    let values = [1, 2, 1_000, u64::MAX - 1, u64::MAX];
    let periods = [1, 3, SECOND, MAX_PERIOD - 1, MAX_PERIOD];
    let params: Vec<(u64, u64, u64)> = values
        .iter()
        .flat_map(|&n| periods.iter().map(move |&p| (n, p, n)))
        .chain([(1, MAX_PERIOD, u64::MAX), (u64::MAX, 1, 1)])
        .collect();
    for alg in BUCKETS {
        for &(r0, p0, c0) in &params {
            for &(r1, p1, c1) in &params {
                let (old, new) = (limit(alg, r0, p0, c0), limit(alg, r1, p1, c1));
                for t in [0, 1, 30 * DAY] {
                    let what = format!("{alg:?} at {t}: {r0}/{p0}/{c0} -> {r1}/{p1}/{c1}");
                    let mut s = old.new_state();
                    let spent = old.decide(&mut s, t, c0).allowed();
                    for at in [t, t + 1, t + MAX_PERIOD] {
                        let mut s = s.clone();
                        new.adopt(&old, &mut s, at);
                        let peek = new.decide(&mut s, at, 0);
                        assert!(peek.remaining <= c1, "{what}: {peek:?}");
                        if spent && at == t && c0 >= c1 {
                            assert_eq!(peek.remaining, 0, "{what}: {peek:?}");
                        }
                        let d = new.decide(&mut s, at, 1);
                        let refill = (c1 as u128 * p1 as u128).div_ceil(r1 as u128);
                        assert!(d.retry_after as u128 <= refill, "{what}: {d:?}");
                    }
                }
            }
        }
    }
}
