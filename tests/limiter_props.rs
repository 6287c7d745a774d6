//! Property tests: every algorithm against a naive reference model on random traces, plus the
//! contract every decision must keep (exact remaining / retry_after / reset_after, eviction
//! soundness, denials and peeks change nothing) and each algorithm's burst bound.

use proptest::prelude::*;
use quorate::limiter::{Algorithm, Decision, KeyState, Limit, Nanos, Outcome};

/// One request of a trace: the gap since the previous one and its cost.
#[derive(Debug, Clone)]
struct Step {
    gap: Nanos,
    cost: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            prop_oneof![3 => 0..40u64, 2 => 0..400u64, 1 => 0..5_000u64],
            prop_oneof![4 => 1..3u64, 1 => 0..8u64],
        )
            .prop_map(|(gap, cost)| Step { gap, cost }),
        1..160,
    )
}

fn params() -> impl Strategy<Value = (u64, Nanos, u64)> {
    (1..12u64, prop_oneof![1..8u64, 8..1_000u64], 1..12u64)
}

/// The admitted history a reference model decides from: (time, cost).
type History = Vec<(Nanos, u64)>;

fn units(h: &History, keep: impl Fn(Nanos) -> bool) -> u128 {
    h.iter()
        .filter(|&&(t, _)| keep(t))
        .map(|&(_, c)| c as u128)
        .sum()
}

/// Would the reference admit `cost` at `now` given the admitted history?
fn reference_admits(limit: &Limit, h: &History, now: Nanos, cost: u64) -> bool {
    if cost == 0 {
        return true;
    }
    if cost > limit.capacity() {
        return false;
    }
    let c = cost as u128;
    match limit {
        Limit::FixedWindow(p) => {
            let w = now / p.period();
            units(h, |t| t / p.period() == w) + c <= p.limit() as u128
        }
        Limit::SlidingLog(p) => {
            units(h, |t| t as u128 + p.period() as u128 > now as u128) + c <= p.limit() as u128
        }
        Limit::SlidingCounter(p) => {
            // Cloudflare's rule, stated directly: prev x (P - e) / P + curr + c - 1 < limit.
            let (per, w) = (p.period() as u128, now / p.period());
            let curr = units(h, |t| t / p.period() == w);
            let prev = units(h, |t| w > 0 && t / p.period() == w - 1);
            let e = now as u128 - w as u128 * per;
            prev * (per - e) + (curr + c - 1) * per < p.limit() as u128 * per
        }
        Limit::TokenBucket(_) | Limit::Gcra(_) | Limit::LeakyQueue(_) => {
            // A bucket of rate r per P and capacity b, starting full, admits a request iff for
            // every earlier admission time s the units admitted in [s, now] plus this one stay
            // within b + r (now - s) / P (its arrival curve; s = now covers "cost <= b").
            let (r, per, b) = bucket(limit);
            h.iter()
                .map(|&(s, _)| s)
                .chain([now])
                .all(|s| (units(h, |t| t >= s) + c) * per <= b * per + r * (now - s) as u128)
        }
    }
}

fn bucket(limit: &Limit) -> (u128, u128, u128) {
    match limit {
        Limit::TokenBucket(p) => (p.rate() as u128, p.period() as u128, p.capacity() as u128),
        Limit::Gcra(p) => (p.rate() as u128, p.period() as u128, p.burst() as u128),
        Limit::LeakyQueue(p) => (p.rate() as u128, p.period() as u128, p.capacity() as u128),
        _ => unreachable!(),
    }
}

fn probe(limit: &Limit, state: &KeyState, now: Nanos, cost: u64) -> Decision {
    limit.decide(&mut state.clone(), now, cost)
}

/// Runs a trace through `limit`, checking each decision against the reference and the
/// contract. Returns the admitted history.
fn run_checked(limit: &Limit, steps: &[Step], start: Nanos) -> Result<History, TestCaseError> {
    let mut state = limit.new_state();
    let mut history = History::new();
    let mut now = start;
    // The state before the last decision that should have changed nothing.
    let mut unchanged: Option<KeyState> = None;
    for step in steps {
        now += step.gap;
        let before = state.clone();
        let fresh_before = limit.is_fresh(&state, now);
        let d = limit.decide(&mut state, now, step.cost);
        if let Some(ghost) = unchanged.take() {
            prop_assert_eq!(
                probe(limit, &ghost, now, step.cost),
                d,
                "a denial or peek changed a later decision"
            );
        }
        if fresh_before {
            prop_assert_eq!(
                probe(limit, &limit.new_state(), now, step.cost),
                d,
                "an evictable state decided differently from a fresh one"
            );
        }
        let expected = reference_admits(limit, &history, now, step.cost);
        prop_assert_eq!(
            d.allowed(),
            expected,
            "at {} cost {}: {:?}",
            now,
            step.cost,
            d
        );
        prop_assert_eq!(d.outcome == Outcome::Never, step.cost > limit.capacity());
        prop_assert_eq!(d.limit, limit.capacity());
        if d.allowed() && step.cost > 0 {
            history.push((now, step.cost));
        } else {
            unchanged = Some(before.clone());
        }
        // `remaining` is exactly the largest cost admitted now.
        if d.remaining >= 1 {
            prop_assert!(
                probe(limit, &state, now, d.remaining).allowed(),
                "remaining {} not admitted",
                d.remaining
            );
        }
        if d.remaining < limit.capacity() {
            prop_assert!(
                !probe(limit, &state, now, d.remaining + 1).allowed(),
                "remaining {} understated",
                d.remaining
            );
        }
        // `retry_after` is exact: the same request succeeds then, and not a nanosecond sooner.
        if d.outcome == Outcome::Denied {
            prop_assert!(d.retry_after >= 1);
            prop_assert!(
                probe(limit, &before, now + d.retry_after, step.cost).allowed(),
                "not admitted after retry_after {}",
                d.retry_after
            );
            prop_assert!(
                !probe(limit, &before, now + d.retry_after - 1, step.cost).allowed(),
                "retry_after {} too long",
                d.retry_after
            );
        } else {
            prop_assert_eq!(d.retry_after, 0);
        }
        // `reset_after` is exact: fresh then, not fresh a nanosecond sooner.
        prop_assert!(
            limit.is_fresh(&state, now + d.reset_after),
            "not fresh after reset_after {}",
            d.reset_after
        );
        if d.reset_after > 0 {
            prop_assert!(
                !limit.is_fresh(&state, now + d.reset_after - 1),
                "reset_after {} too long",
                d.reset_after
            );
        }
    }
    Ok(history)
}

/// The most units admitted in any half-open window `[t, t + len)` of the history.
fn max_in_window(h: &History, len: Nanos) -> u128 {
    h.iter()
        .map(|&(s, _)| units(h, |t| t >= s && t < s.saturating_add(len)))
        .max()
        .unwrap_or(0)
}

fn check_algorithm(
    alg: Algorithm,
    (limit, period, burst): (u64, Nanos, u64),
    steps: &[Step],
    start: Nanos,
) -> Result<(), TestCaseError> {
    let l = Limit::new(alg, limit, period, burst).unwrap();
    let h = run_checked(&l, steps, start)?;
    let cap = l.capacity() as u128;
    match alg {
        Algorithm::FixedWindow | Algorithm::SlidingCounter => {
            prop_assert!(
                max_in_window(&h, period) <= 2 * cap,
                "more than 2 x limit in a window"
            );
        }
        Algorithm::SlidingLog => prop_assert!(max_in_window(&h, period) <= cap),
        _ => {
            // At most b + r x t / P over any interval of length t (both ends inclusive).
            let (r, per, b) = bucket(&l);
            for &(s, _) in &h {
                for &(e, _) in h.iter().filter(|&&(e, _)| e >= s) {
                    prop_assert!(
                        units(&h, |t| t >= s && t <= e) * per <= b * per + r * (e - s) as u128
                    );
                }
            }
        }
    }
    Ok(())
}

/// The step loop of the refund properties: a key `x` makes the first admission of positive
/// cost at step `pick` or later and refunds it `delay` steps later (at once for 0), while a
/// key `y` is sent the same admissions but that one; every other admission of `x` must be
/// one `y` admits too.
///
/// Across reloads (`reloads`: the steps after the refunded admission at which the key's limit
/// flips between `limits[0]` and `limits[1]`, and one step before it maybe), both keys adopt
/// each flip, a refund applies only under the limit of its admission (as in the shard), and
/// at every step `x` has no more left than `y`. Without, `limits[0]` is the only one used.
fn refund_against_a_key_without_the_admission(
    limits: [&Limit; 2],
    s: &[Step],
    pick: usize,
    delay: usize,
    reloads: Option<(&[usize], Option<usize>)>,
) -> Result<(), TestCaseError> {
    let mut which = 0;
    // `x` makes the admission and refunds it `delay` steps later; `y` never makes it.
    let (mut x, mut y) = (limits[0].new_state(), limits[0].new_state());
    let mut pending: Option<(Nanos, u64, usize, usize)> = None;
    let mut picked: Option<usize> = None;
    let mut now = 0;
    for (i, step) in s.iter().enumerate() {
        now += step.gap;
        if let Some((flips, early)) = reloads {
            let flip = match picked {
                Some(at) => flips.contains(&(i - at)),
                None => early == Some(i),
            };
            if flip {
                let (from, to) = (limits[which], limits[1 - which]);
                if from != to {
                    to.adopt(from, &mut x, now);
                    to.adopt(from, &mut y, now);
                }
                which = 1 - which;
            }
        }
        let l = limits[which];
        if let Some((at, cost, _, under)) = pending.filter(|p| p.2 == i) {
            if limits[under] == l {
                l.refund(&mut x, at, cost);
            }
            pending = None;
        }
        if reloads.is_some() {
            // Owing at least what `y` owes, `x` never has more left.
            let (rx, ry) = (
                probe(l, &x, now, 0).remaining,
                probe(l, &y, now, 0).remaining,
            );
            prop_assert!(
                rx <= ry,
                "step {i} (t {now}): {rx} left after the refund, {ry} without the admission"
            );
        }
        if !l.decide(&mut x, now, step.cost).allowed() {
            continue;
        }
        if picked.is_none() && i >= pick && step.cost > 0 {
            picked = Some(i);
            pending = Some((now, step.cost, i + delay, which));
            if delay == 0 {
                l.refund(&mut x, now, step.cost);
                pending = None;
            }
            continue;
        }
        let d = l.decide(&mut y, now, step.cost);
        prop_assert!(
            d.allowed(),
            "step {i} (t {now}, cost {}): admitted by the key that refunded, denied by one that never made the admission ({d:?})",
            step.cost
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn fixed_window_matches_its_reference(p in params(), s in steps(), start in 0..3_000u64) {
        check_algorithm(Algorithm::FixedWindow, p, &s, start)?;
    }

    #[test]
    fn sliding_log_matches_its_reference(p in params(), s in steps(), start in 0..3_000u64) {
        check_algorithm(Algorithm::SlidingLog, p, &s, start)?;
    }

    #[test]
    fn sliding_counter_matches_its_reference(p in params(), s in steps(), start in 0..3_000u64) {
        check_algorithm(Algorithm::SlidingCounter, p, &s, start)?;
    }

    #[test]
    fn token_bucket_matches_its_reference(p in params(), s in steps(), start in 0..3_000u64) {
        check_algorithm(Algorithm::TokenBucket, p, &s, start)?;
    }

    #[test]
    fn gcra_matches_its_reference(p in params(), s in steps(), start in 0..3_000u64) {
        check_algorithm(Algorithm::Gcra, p, &s, start)?;
    }

    #[test]
    fn leaky_queue_matches_its_reference(p in params(), s in steps(), start in 0..3_000u64) {
        check_algorithm(Algorithm::LeakyQueue, p, &s, start)?;
    }

    /// GCRA is the token bucket's virtual-scheduling form: every field of every decision
    /// agrees; the queue admits the same and its delay is the backlog ahead of it.
    #[test]
    fn gcra_token_bucket_and_queue_agree((limit, period, burst) in params(), s in steps()) {
        let tb = Limit::new(Algorithm::TokenBucket, limit, period, burst).unwrap();
        let g = Limit::new(Algorithm::Gcra, limit, period, burst).unwrap();
        let q = Limit::new(Algorithm::LeakyQueue, limit, period, burst).unwrap();
        let (mut st, mut sg, mut sq) = (tb.new_state(), g.new_state(), q.new_state());
        let mut now = 0;
        // Reference finishing time of the queue, in ns x rate.
        let mut finish: u128 = 0;
        for step in &s {
            now += step.gap;
            let a = tb.decide(&mut st, now, step.cost);
            let b = g.decide(&mut sg, now, step.cost);
            let c = q.decide(&mut sq, now, step.cost);
            prop_assert_eq!(a, b);
            prop_assert_eq!(Decision { delay: 0, ..c }, b);
            if c.allowed() {
                let now_s = now as u128 * limit as u128;
                let wait = finish.saturating_sub(now_s);
                prop_assert_eq!(c.delay as u128, wait.div_ceil(limit as u128));
                finish = finish.max(now_s) + step.cost as u128 * period as u128;
            }
        }
    }

    /// A refund right after an admission undoes it: every later decision is as if it had
    /// never happened. A refund later never makes a key better off than a fresh one.
    #[test]
    fn a_refund_undoes_an_admission_and_never_lifts_a_key_above_fresh(
        alg in prop::sample::select(Algorithm::ALL.to_vec()),
        p in params(),
        s in steps(),
        refund_delay in prop_oneof![Just(0u64), 0..3_000u64],
    ) {
        let l = Limit::new(alg, p.0, p.1, p.2).unwrap();
        let mut state = l.new_state();
        let mut now = 0;
        for (i, step) in s.iter().enumerate() {
            now += step.gap;
            let before = state.clone();
            let d = l.decide(&mut state, now, step.cost);
            if !d.allowed() || step.cost == 0 || i % 3 != 0 {
                continue;
            }
            let mut refunded = state.clone();
            l.refund(&mut refunded, now, step.cost);
            let later = now + refund_delay;
            let probe_cost = s.get(i + 1).map_or(1, |n| n.cost);
            if refund_delay == 0 {
                prop_assert_eq!(probe(&l, &refunded, now, probe_cost), probe(&l, &before, now, probe_cost));
                prop_assert_eq!(probe(&l, &refunded, now + 1, probe_cost), probe(&l, &before, now + 1, probe_cost));
            }
            // Never better off than a fresh key: whatever a fresh key refuses, so does it.
            let r = probe(&l, &refunded, later, 0);
            prop_assert!(r.remaining <= l.capacity());
            let f = probe(&l, &l.new_state(), later, 0);
            prop_assert!(r.remaining <= f.remaining, "refund lifted remaining above fresh: {:?} vs {:?}", r, f);
        }
    }

    /// A refund given after other admissions of the key leaves it no better off than a key
    /// that never made the refunded admission: every later admission (every one, in fact)
    /// is one that key admits too, sent the same admissions but that one. (A refund that
    /// gave back the whole cost after a later admission let a bucket or GCRA admit more than
    /// its bound: the cluster simulation's check of several items found it.)
    #[test]
    fn a_refund_never_admits_more_than_a_key_that_never_made_the_admission(
        alg in prop::sample::select(Algorithm::ALL.to_vec()),
        p in params(),
        s in steps(),
        pick in 0..40usize,
        delay in prop_oneof![Just(0usize), 0..6usize, 0..60usize],
    ) {
        let l = Limit::new(alg, p.0, p.1, p.2).unwrap();
        refund_against_a_key_without_the_admission([&l, &l], &s, pick, delay, None)?;
    }

    /// A reload between any two bucket limits (token bucket, GCRA, leaky queue), at any
    /// shard age, carries what the key owes over in the new limit's units: right after it
    /// the key has what the new capacity leaves after the old debt (one unit less at most,
    /// by rounding up), it is full one new refill later, a denial's `retry_after` is exact,
    /// and the three algorithms still agree on every later decision.
    #[test]
    fn a_reload_carries_a_bucket_keys_debt_over_in_the_new_units(
        old in params(),
        new in params(),
        s in steps(),
        start in prop_oneof![0..3_000u64, Just(30 * 24 * 3600 * 1_000_000_000u64)],
        idle in prop_oneof![Just(0u64), 0..3_000u64],
        cost in 1..12u64,
        after in steps(),
    ) {
        let mut runs = Vec::new();
        for alg in [Algorithm::TokenBucket, Algorithm::Gcra, Algorithm::LeakyQueue] {
            let lo = Limit::new(alg, old.0, old.1, old.2).unwrap();
            let ln = Limit::new(alg, new.0, new.1, new.2).unwrap();
            let mut st = lo.new_state();
            let mut now = start;
            for step in &s {
                now += step.gap;
                lo.decide(&mut st, now, step.cost);
            }
            let at = now + idle;
            let had = probe(&lo, &st, at, 0).remaining;
            ln.adopt(&lo, &mut st, at);
            let expected = (new.2 + had).saturating_sub(old.2);
            let got = probe(&ln, &st, at, 0).remaining;
            prop_assert!(
                got <= expected && got + 1 >= expected,
                "{alg:?}: {got} left after the reload, {had} of {} before it", old.2
            );
            let refill = u64::try_from((new.2 as u128 * new.1 as u128).div_ceil(new.0 as u128)).unwrap();
            prop_assert_eq!(probe(&ln, &st, at + refill, 0).remaining, new.2);
            let d = probe(&ln, &st, at, cost);
            if d.outcome == Outcome::Denied {
                prop_assert!(d.retry_after <= refill, "{alg:?}: {d:?}");
                prop_assert!(probe(&ln, &st, at + d.retry_after, cost).allowed(), "{alg:?}: {d:?}");
                prop_assert!(!probe(&ln, &st, at + d.retry_after - 1, cost).allowed(), "{alg:?}: {d:?}");
            }
            let mut now = at;
            let decisions: Vec<Decision> = after
                .iter()
                .map(|step| {
                    now += step.gap;
                    ln.decide(&mut st, now, step.cost)
                })
                .collect();
            runs.push(decisions);
        }
        prop_assert_eq!(&runs[0], &runs[1]);
        for (q, g) in runs[2].iter().zip(&runs[1]) {
            prop_assert_eq!(Decision { delay: 0, ..*q }, *g);
        }
    }

    /// A refund never leaves a bucket key better off than a key that never made the refunded
    /// admission, across reloads that change its limit and change it back between the
    /// admission and its refund (nodes with the old and the new policy file both sending
    /// checks during a rollout). As in the shard, a refund applies only under the key's
    /// current limit, which is its admission's own.
    #[test]
    fn a_refund_across_reloads_never_admits_more_than_a_key_that_never_made_the_admission(
        alg in prop::sample::select(vec![Algorithm::TokenBucket, Algorithm::Gcra, Algorithm::LeakyQueue]),
        p in params(),
        q in params(),
        s in steps(),
        pick in 0..40usize,
        delay in prop_oneof![0..4usize, 0..12usize, 0..60usize],
        // Reloads, in steps after the admission (and one before it, maybe).
        flips in prop::collection::vec(1..12usize, 0..4),
        early in prop::option::of(0..40usize),
    ) {
        let limits = [
            Limit::new(alg, p.0, p.1, p.2).unwrap(),
            Limit::new(alg, q.0, q.1, q.2).unwrap(),
        ];
        refund_against_a_key_without_the_admission(
            [&limits[0], &limits[1]],
            &s,
            pick,
            delay,
            Some((&flips, early)),
        )?;
    }

    /// The precomputed-reciprocal division is exact for every dividend and divisor.
    #[test]
    fn divisor_division_is_exact(
        d in prop_oneof![1..4u64, any::<u64>()],
        x in prop_oneof![0..1_000u128, any::<u64>().prop_map(u128::from), any::<u128>()],
    ) {
        let div = quorate::limiter::Divisor::from(d.max(1));
        let d = d.max(1) as u128;
        prop_assert_eq!(div.div_rem(x), (x / d, (x % d) as u64));
        prop_assert_eq!(div.ceil_sat(x) as u128, x.div_ceil(d).min(u64::MAX as u128));
    }

    /// The algorithms keep working at the far end of shard time and with huge parameters.
    #[test]
    fn large_times_and_parameters_keep_the_contract(
        alg in prop::sample::select(Algorithm::ALL.to_vec()),
        limit in prop_oneof![1..5u64, 1_000..100_000u64],
        period in prop_oneof![1..10u64, 1_000_000_000..quorate::limiter::MAX_PERIOD],
        burst in prop_oneof![1..5u64, 1_000..100_000u64],
        s in steps(),
        start in (u64::MAX / 4)..(u64::MAX / 2),
    ) {
        let l = Limit::new(alg, limit, period, burst).unwrap();
        run_checked(&l, &s, start)?;
    }
}
