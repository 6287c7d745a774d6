//! Seeded Poisson arrivals.
//!
//! Why: random traffic at a steady average still clumps. At 60% of a 10-per-second limit a
//! one-second window sees 11 or more arrivals about 4% of the time, so window limiters reject
//! some of a load that is well within the limit, while a bucket with spare capacity absorbs the
//! clumps. This module makes that visible, reproducibly: gaps are exponential,
//! `-ln(1 - U) / rate` with `U` from a ChaCha8 generator seeded by the user, so the same seed
//! gives the same arrivals with the same build (`f64::ln` comes from the platform's maths
//! library, which may differ by an ulp elsewhere).
//!
//! Floats are used only to draw the gaps; each gap is rounded to whole picoseconds and
//! arrival times are summed as integers, so the limiters see plain shard time.

use super::{Arrival, SimError, Workload};
use crate::limiter::{Nanos, SECOND};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The most arrivals a run may expect (`rate x duration`), to keep memory bounded.
pub const MAX_EXPECTED_ARRIVALS: f64 = 20_000_000.0;

/// The highest rate: one arrival per nanosecond, the resolution of shard time.
pub const MAX_RATE: f64 = 1e9;

/// The most keys a run may spread arrivals over.
pub const MAX_KEYS: u64 = 1_000_000;

/// Arrivals at `rate` per second in total for `duration`, spread uniformly at random over
/// `keys` keys (named `k0`, `k1`, ...; each key sees a Poisson process at `rate / keys`).
/// With one key no key draws are made, so the times depend on the seed alone.
pub fn arrivals(rate: f64, duration: Nanos, seed: u64, keys: u64) -> Result<Workload, SimError> {
    if !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE) {
        return Err(SimError::Invalid(format!(
            "--rate {rate} must be a positive number of arrivals per second, at most {MAX_RATE:.0} (one per nanosecond)"
        )));
    }
    if duration == 0 {
        return Err(SimError::Invalid(
            "--duration must be longer than 0 s".into(),
        ));
    }
    let expected = rate * (duration as f64 / SECOND as f64);
    if expected > MAX_EXPECTED_ARRIVALS {
        return Err(SimError::Invalid(format!(
            "--rate x --duration is {expected:.0} expected arrivals; at most {MAX_EXPECTED_ARRIVALS:.0} are supported, lower one of them"
        )));
    }
    if keys == 0 || keys > MAX_KEYS {
        return Err(SimError::Invalid(format!(
            "--keys {keys} must be between 1 and {MAX_KEYS}"
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut arrivals = Vec::with_capacity(expected as usize + 16);
    // Time is summed in integer picoseconds so that rounding each gap does not bias short
    // gaps (at one arrival per ns, per-gap rounding to whole ns ran 4% fast).
    let mut now_ps: u128 = 0;
    loop {
        let u: f64 = rng.random();
        let gap_ps = (-(1.0 - u).ln() / rate * (SECOND as f64 * 1000.0)).round();
        // `as` saturates: an absurdly long gap simply ends the run.
        now_ps = now_ps.saturating_add(gap_ps as u128);
        let now: Nanos = u64::try_from(now_ps / 1000).unwrap_or(u64::MAX);
        if now >= duration {
            break;
        }
        let key = if keys == 1 {
            0
        } else {
            rng.random_range(0..keys) as usize
        };
        arrivals.push(Arrival { at: now, key });
        if arrivals.len() as f64 > 2.0 * MAX_EXPECTED_ARRIVALS {
            return Err(SimError::Invalid(
                "the run produced over twice the supported number of arrivals; lower --rate or --duration".into(),
            ));
        }
    }
    Ok(Workload {
        keys: (0..keys).map(|k| format!("k{k}")).collect(),
        arrivals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_arrivals() {
        let a = arrivals(6.0, 60 * SECOND, 7, 3).unwrap();
        let b = arrivals(6.0, 60 * SECOND, 7, 3).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, arrivals(6.0, 60 * SECOND, 8, 3).unwrap());
    }

    #[test]
    fn the_count_is_close_to_rate_times_duration() {
        let n = arrivals(10.0, 1000 * SECOND, 1, 1).unwrap().arrivals.len();
        // 10_000 expected, standard deviation 100.
        assert!((9_500..10_500).contains(&n), "{n}");
    }

    #[test]
    fn arrivals_are_sorted_and_inside_the_duration() {
        let w = arrivals(50.0, 10 * SECOND, 2, 4).unwrap();
        assert!(w.arrivals.windows(2).all(|p| p[0].at <= p[1].at));
        assert!(w.arrivals.iter().all(|a| a.at < 10 * SECOND && a.key < 4));
        assert_eq!(w.keys, ["k0", "k1", "k2", "k3"]);
    }

    #[test]
    fn nonsense_parameters_are_refused_not_run() {
        assert!(arrivals(0.0, SECOND, 1, 1).is_err());
        assert!(arrivals(f64::NAN, SECOND, 1, 1).is_err());
        assert!(arrivals(-1.0, SECOND, 1, 1).is_err());
        assert!(arrivals(f64::INFINITY, SECOND, 1, 1).is_err());
        assert!(arrivals(1.0, 0, 1, 1).is_err());
        assert!(arrivals(1.0, SECOND, 1, 0).is_err());
        assert!(arrivals(1e6, u64::MAX, 1, 1).is_err());
        assert!(arrivals(1e10, 1, 1, 1).is_err());
    }

    #[test]
    fn a_tiny_rate_ends_without_overflow() {
        let w = arrivals(1e-300, u64::MAX, 1, 1).unwrap();
        assert!(w.arrivals.len() <= 1);
    }
}
