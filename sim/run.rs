//! Running a policy set over a workload.
//!
//! Why separate: this is the only place the simulator calls the algorithm core. Each policy
//! sees every arrival, each key has its own state per policy (created "never seen"), every
//! request costs 1, and `now` is the arrival's shard time — the same calls a shard makes, so
//! what the simulator reports is what a deployment would do with that traffic.

use super::window::max_in_any_window;
use super::Workload;
use crate::limiter::{Algorithm, Limit, Nanos};
use crate::policy::PolicySet;

/// What one policy did with a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyResult {
    pub name: String,
    pub algorithm: Algorithm,
    /// A short description of the limit, e.g. `10 per 1s, capacity 20`.
    pub limit: String,
    pub allowed: u64,
    pub rejected: u64,
    /// The window used for [`PolicyResult::max_in_window`]: the policy's period.
    pub window: Nanos,
    /// The most requests admitted for one key in any `window`-long span (the maximum over
    /// keys), directly comparable with the policy's per-key limit.
    pub max_in_window: u64,
    /// Arrival times of the admitted requests (for the leaky queue: when they were admitted,
    /// not when their delay ends).
    pub admitted_at: Vec<Nanos>,
    /// Arrival times of the rejected requests.
    pub rejected_at: Vec<Nanos>,
}

impl PolicyResult {
    /// Allowed as a percentage of all arrivals; `None` with no arrivals.
    pub fn allow_rate(&self) -> Option<f64> {
        let total = self.allowed + self.rejected;
        (total > 0).then(|| self.allowed as f64 * 100.0 / total as f64)
    }
}

/// Runs every policy of `set` over `workload`. Results are ordered by algorithm (windows
/// first, then buckets, as in [`Algorithm::ALL`]) and then by policy name.
///
/// `keep_times` keeps every admitted and rejected arrival time in the results (8 bytes per
/// arrival per policy), which only the plot needs; without it memory stays bounded by the
/// workload itself, however many policies the file holds.
pub fn run(set: &PolicySet, workload: &Workload, keep_times: bool) -> Vec<PolicyResult> {
    let mut policies: Vec<(&String, &Limit)> = set.limits.iter().collect();
    policies.sort_by_key(|(name, limit)| (limit.algorithm(), name.as_str()));
    policies
        .into_iter()
        .map(|(name, limit)| run_one(name, limit, workload, keep_times))
        .collect()
}

fn run_one(name: &str, limit: &Limit, workload: &Workload, keep_times: bool) -> PolicyResult {
    let mut states = vec![limit.new_state(); workload.keys.len()];
    let mut per_key: Vec<Vec<Nanos>> = vec![Vec::new(); workload.keys.len()];
    let mut admitted_at = Vec::new();
    let mut rejected_at = Vec::new();
    let (mut allowed, mut rejected) = (0u64, 0u64);
    for a in &workload.arrivals {
        if limit.decide(&mut states[a.key], a.at, 1).allowed() {
            allowed += 1;
            per_key[a.key].push(a.at);
            if keep_times {
                admitted_at.push(a.at);
            }
        } else {
            rejected += 1;
            if keep_times {
                rejected_at.push(a.at);
            }
        }
    }
    let window = limit.period();
    PolicyResult {
        name: name.to_string(),
        algorithm: limit.algorithm(),
        limit: describe(limit),
        allowed,
        rejected,
        window,
        max_in_window: per_key
            .iter()
            .map(|times| max_in_any_window(times, window))
            .max()
            .unwrap_or(0),
        admitted_at,
        rejected_at,
    }
}

/// `10 per 1s` for the window algorithms, `10 per 1s, capacity 20` for the buckets.
pub fn describe(limit: &Limit) -> String {
    let period = humantime::format_duration(std::time::Duration::from_nanos(limit.period()));
    match limit {
        Limit::FixedWindow(p) => format!("{} per {period}", p.limit()),
        Limit::SlidingLog(p) => format!("{} per {period}", p.limit()),
        Limit::SlidingCounter(p) => format!("{} per {period}", p.limit()),
        Limit::TokenBucket(p) => format!("{} per {period}, capacity {}", p.rate(), p.capacity()),
        Limit::Gcra(p) => format!("{} per {period}, capacity {}", p.rate(), p.burst()),
        Limit::LeakyQueue(p) => format!("{} per {period}, capacity {}", p.rate(), p.capacity()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Arrival;

    fn same_instant(n: usize, keys: usize) -> Workload {
        Workload {
            keys: (0..keys).map(|k| format!("k{k}")).collect(),
            arrivals: (0..n * keys)
                .map(|i| Arrival {
                    at: 0,
                    key: i % keys,
                })
                .collect(),
        }
    }

    fn allowed(results: &[PolicyResult]) -> Vec<(&str, u64)> {
        results
            .iter()
            .map(|r| (r.name.as_str(), r.allowed))
            .collect()
    }

    #[test]
    fn a_burst_of_25_meets_each_algorithms_capacity() {
        let r = run(&PolicySet::comparison(), &same_instant(25, 1), true);
        assert_eq!(
            allowed(&r),
            [
                ("fixed_window", 10),
                ("sliding_log", 10),
                ("sliding_counter", 10),
                ("token_bucket", 20),
                ("gcra", 20)
            ]
        );
        assert!(r.iter().all(|p| p.allowed + p.rejected == 25));
    }

    #[test]
    fn every_key_has_its_own_state() {
        let r = run(&PolicySet::comparison(), &same_instant(25, 2), true);
        assert_eq!(r[0].allowed, 20);
        assert_eq!(r[3].allowed, 40);
        // The window column is per key: each key got its own 10.
        assert_eq!(r[0].max_in_window, 10);
    }

    #[test]
    fn the_limit_is_described_with_its_period_and_capacity() {
        let r = run(&PolicySet::comparison(), &Workload::default(), true);
        assert_eq!(r[0].limit, "10 per 1s");
        assert_eq!(r[4].limit, "10 per 1s, capacity 20");
        assert_eq!(r[0].allow_rate(), None);
    }
}
