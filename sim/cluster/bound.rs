//! The most a limit may admit, as a check over a key's admissions in shard time.
//!
//! - sliding log: at most `limit` units in any window `[t, t + period)` — exact;
//! - fixed window: at most `limit` units in any aligned window;
//! - token bucket and GCRA: at most `capacity + quota x dt / period` units over any span of
//!   length `dt` (both ends included);
//! - sliding counter and leaky queue: not bounded here (the workload does not use them).

use crate::limiter::{Algorithm, Limit, Nanos};

/// Admissions of one key, `(shard time, cost)`, sorted by time: the first violation of the
/// limit's bound, described, or `None`.
pub fn violation(limit: &Limit, admitted: &[(Nanos, u64)]) -> Option<String> {
    let period = limit.period() as i128;
    match limit.algorithm() {
        Algorithm::SlidingLog => {
            let cap = limit.capacity() as i128;
            let mut start = 0;
            let mut units: i128 = 0;
            for &(t, c) in admitted {
                units += c as i128;
                while (t - admitted[start].0) as i128 >= period {
                    units -= admitted[start].1 as i128;
                    start += 1;
                }
                if units > cap {
                    return Some(format!(
                        "{units} units admitted within {} ns (from {} to {t}); the limit is {cap} per {period} ns",
                        t - admitted[start].0,
                        admitted[start].0
                    ));
                }
            }
            None
        }
        Algorithm::FixedWindow => {
            let cap = limit.capacity() as i128;
            let mut window = None;
            let mut units: i128 = 0;
            for &(t, c) in admitted {
                let w = t as i128 / period;
                if window != Some(w) {
                    window = Some(w);
                    units = 0;
                }
                units += c as i128;
                if units > cap {
                    return Some(format!(
                        "{units} units admitted in window {w}; the limit is {cap}"
                    ));
                }
            }
            None
        }
        Algorithm::TokenBucket | Algorithm::Gcra => {
            // units(i..=j) x period <= capacity x period + quota x (t_j - t_i), for all i <= j:
            // with prefix sums S, S_{j+1} P - q t_j <= cap P + min_i (S_i P - q t_i).
            let cap = limit.capacity() as i128;
            let q = limit.quota() as i128;
            let mut best: Option<(i128, usize)> = None;
            let mut sum: i128 = 0;
            for (j, &(t, c)) in admitted.iter().enumerate() {
                let here = sum * period - q * t as i128;
                if best.is_none_or(|(b, _)| here < b) {
                    best = Some((here, j));
                }
                sum += c as i128;
                let (b, i) = best.unwrap_or((0, 0));
                if sum * period - q * t as i128 > cap * period + b {
                    let dt = t - admitted[i].0;
                    let units: u64 = admitted[i..=j].iter().map(|a| a.1).sum();
                    return Some(format!(
                        "{units} units admitted over {dt} ns (from {} to {t}); the bound is {cap} + {q} x dt / {period}",
                        admitted[i].0
                    ));
                }
            }
            None
        }
        Algorithm::SlidingCounter | Algorithm::LeakyQueue => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::SECOND;

    fn at(times: &[u64]) -> Vec<(Nanos, u64)> {
        times.iter().map(|&t| (t, 1)).collect()
    }

    #[test]
    fn a_sliding_log_bound_sees_one_too_many_in_a_rolling_window() {
        let l = Limit::new(Algorithm::SlidingLog, 2, SECOND, 2).unwrap();
        assert!(violation(&l, &at(&[0, 500, SECOND, SECOND + 500])).is_none());
        assert!(violation(&l, &at(&[0, 500, SECOND - 1])).is_some());
    }

    #[test]
    fn a_bucket_bound_allows_capacity_then_the_rate() {
        let l = Limit::new(Algorithm::TokenBucket, 1, SECOND, 2).unwrap();
        assert!(violation(&l, &at(&[0, 0, SECOND, 2 * SECOND])).is_none());
        assert!(violation(&l, &at(&[0, 0, SECOND - 1])).is_some());
        assert!(violation(&l, &at(&[5 * SECOND, 5 * SECOND, 5 * SECOND])).is_some());
    }

    #[test]
    fn a_fixed_window_bound_counts_per_aligned_window() {
        let l = Limit::new(Algorithm::FixedWindow, 2, SECOND, 2).unwrap();
        assert!(violation(&l, &at(&[0, 1, SECOND, SECOND + 1])).is_none());
        assert!(violation(&l, &at(&[0, 1, SECOND - 1])).is_some());
    }
}
