//! The burst at the boundary: the fixed window's known weakness, shown.
//!
//! Why: a fixed window of "10 per second" resets at every whole second, so a client that
//! sends 10 requests just before the boundary and 10 just after gets all 20 through in about
//! 2 ms — twice the limit in a small fraction of the period. The other algorithms look back
//! across the boundary: the sliding log and the buckets admit at most 10; the sliding counter,
//! whose estimate floors the previous window's weighted count (10 x 0.9999 counts as 9),
//! admits 11 — approximate, but nowhere near 20.
//!
//! Scenario: one key; 10 requests at 0.9990, 0.9991, ..., 0.9999 s and 10 at 1.0000, ...,
//! 1.0009 s (0.1 ms apart). Policies: the comparison set's 10 per 1 s — except that
//! token_bucket and gcra get capacity 10 instead of 20 **for this scenario only**, so every
//! algorithm can admit at most 10 at once and the comparison is apples to apples (with
//! capacity 20 the buckets would admit 20 by design, which says nothing about boundaries).
//! The report's notes state the same choice.

use super::{Arrival, Workload};
use crate::limiter::{Algorithm, Limit, Nanos, SECOND};
use crate::policy::PolicySet;

/// The limit every policy of the scenario has, per [`SECOND`]; also the bucket capacity.
pub const LIMIT: u64 = 10;

/// Spacing of the burst's requests: 0.1 ms.
pub const STEP: Nanos = 100_000;

/// The comparison algorithms at 10 per 1 s, with capacity 10 for the buckets.
pub fn policies() -> PolicySet {
    let limits = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ]
    .into_iter()
    .map(|a| {
        let limit = Limit::new(a, LIMIT, SECOND, LIMIT).expect("a valid limit");
        (a.name().to_string(), limit)
    })
    .collect();
    PolicySet::from_limits(limits)
}

/// `LIMIT` requests in the `LIMIT` steps before the 1 s boundary, `LIMIT` from it on.
pub fn arrivals() -> Workload {
    let first = SECOND - LIMIT * STEP;
    Workload {
        keys: vec!["client".to_string()],
        arrivals: (0..2 * LIMIT)
            .map(|i| Arrival {
                at: first + i * STEP,
                key: 0,
            })
            .collect(),
    }
}

/// What the report says about the scenario.
pub fn notes() -> Vec<String> {
    vec![
        "one key: 10 requests at 0.9990 .. 0.9999 s and 10 at 1.0000 .. 1.0009 s (0.1 ms apart), 20 within 2 ms around the 1 s window boundary".to_string(),
        "every policy is 10 per 1 s; token_bucket and gcra use capacity 10 here (not the comparison set's 20) so all can admit at most 10 at once".to_string(),
        "fixed_window admits 2 x limit because each side of the boundary is a fresh window; max/window is the most admitted in any 1 s span".to_string(),
        "sliding_counter is approximate: 0.1 ms after the boundary the previous 10 count as floor(10 x 0.9999) = 9, so it admits one more".to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_straddles_the_boundary_within_two_milliseconds() {
        let w = arrivals();
        let times: Vec<Nanos> = w.arrivals.iter().map(|a| a.at).collect();
        assert_eq!(times.len(), 20);
        assert_eq!(times[0], 999_000_000);
        assert_eq!(times[9], 999_900_000);
        assert_eq!(times[10], SECOND);
        assert_eq!(times[19], 1_000_900_000);
    }

    #[test]
    fn only_the_fixed_window_admits_twice_the_limit() {
        let results = crate::sim::boundary().results;
        assert_eq!(results.len(), 5);
        for r in &results {
            if r.algorithm == Algorithm::FixedWindow {
                assert_eq!((r.allowed, r.max_in_window), (20, 20));
            } else if r.algorithm == Algorithm::SlidingCounter {
                // The weighted estimate is floored: one over the limit at most.
                assert!(r.allowed <= 11 && r.max_in_window <= 11, "{r:?}");
            } else {
                assert!(r.allowed <= 10, "{} allowed {}", r.name, r.allowed);
                assert!(r.max_in_window <= 10, "{}", r.name);
            }
        }
    }
}
