//! Invariant: a fast limit over-admits only within its bound.
//!
//! A fast check is answered by the shard leader from its speculative state (the committed state
//! plus the entries it has in flight, at most `pipeline` per shard (1 here), and the open entry
//! gathered while the pipeline is full) while its lease holds (a majority acknowledged an entry
//! it proposed within 80% of the election timeout), before the entry commits. The committed log
//! itself is exact (apply decides, deterministically), so its admissions must keep the
//! algorithm's bound like strict ones. The excess is the admissions clients were told of that
//! are in no applied entry: speculative answers whose entries were lost with a leader. (An
//! admission that is in the log as a denial is a violation by itself: the speculative state is
//! the committed state with the same entries applied in the same order at the same times, so
//! where the log holds a leader's answer it gives the same answer. An `allow` or `local`
//! fallback admits without the log: such items are passed by here (`check_local` bounds
//! `local`'s). A check with a request id that its shard cannot decide and its rule would
//! deny gets `TRYAGAIN`, an unknown outcome, never a denial.) The speculative
//! state enforces the limit over everything in flight, so each lost batch of in-flight
//! entries hands out at most one key's capacity again, per window it spans for a fixed
//! window (whose count starts again at each boundary). The answers a lost leader gave span
//! at most its lease, under the election timeout, so the bound checked here is
//! `excess(key) <= allowance x (leader changes + leader crashes of the key's shard)` (zero
//! excess without either), the allowance being the capacity, times
//! `ceil(election timeout / period) + 1` for a fixed window. A leader crash counts even when
//! no other node was elected before the leader restarted (before `03d0ae8` it could lead the
//! same term again): its unreplicated answers were lost all the same (seed
//! 300117 at 30 clients, until a timing change moved it: n2 crashed 14 ms after a fast
//! admission its linger held; the unit test below builds that case).

use super::bound;
use super::history::{AppliedLog, History, Outcome};
use crate::limiter::{Algorithm, Limit, Nanos};
use std::collections::BTreeMap;

/// The most one leader change may let `limit` hand out again: its capacity, for each window
/// a span of `lost` (the longest a lost leader's answers run) can touch if it is a fixed
/// window.
pub fn allowance(limit: &Limit, lost: Nanos) -> u64 {
    let windows = match limit.algorithm() {
        Algorithm::FixedWindow => lost.div_ceil(limit.period().max(1)) + 1,
        _ => 1,
    };
    limit.capacity().saturating_mul(windows)
}

/// Measured excess: (total lost fast admissions, violations).
pub fn check(
    history: &History,
    log: &AppliedLog,
    decisions: &BTreeMap<&str, (bool, Nanos)>,
    outside: &std::collections::BTreeSet<&str>,
    shard_of: impl Fn(&str, &str) -> u32,
    is_fast: impl Fn(&str) -> bool,
    allowance_of: impl Fn(&str) -> u64,
) -> (u64, Vec<String>) {
    let mut out: Vec<String> = super::check_strict::admissions(log, &is_fast)
        .into_iter()
        .filter_map(|(key, (limit, times))| {
            bound::violation(limit, &times)
                .map(|v| format!("fast: the committed log over-admits on {key}: {v}"))
        })
        .collect();
    let terms = log.terms();
    // (limit, key) -> admissions told to clients and missing from the log.
    let mut excess: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut denied = Vec::new();
    for op in history.ops.iter().filter(|o| o.outcome == Outcome::Allowed) {
        for (id, item) in op
            .logged()
            .filter(|(id, i)| i.fast && !outside.contains(id.as_str()))
        {
            match decisions.get(id.as_str()) {
                Some((true, _)) => {}
                Some((false, _)) => denied.push(format!(
                    "fast: {id} ({} {}) was answered as admitted but the log denied it (the log must repeat the leader's answers)",
                    item.policy, item.key
                )),
                None => {
                    *excess
                        .entry((item.policy.as_str(), item.key.as_str()))
                        .or_default() += 1
                }
            }
        }
    }
    out.extend(super::first_ten(
        denied.into_iter(),
        "fast admissions that the log denied",
    ));
    let total = excess.values().sum();
    for ((policy, key), n) in excess {
        let shard = shard_of(policy, key) as u64;
        let key = format!("{policy}:{key}");
        let changes = terms.get(&shard).map_or(0, |t| t.len().saturating_sub(1)) as u64;
        let crashes = history.leader_crashes.get(&shard).copied().unwrap_or(0);
        let bound = allowance_of(&key) * (changes + crashes);
        if n > bound {
            out.push(format!(
                "fast over-admission on {key}: {n} admissions told to clients are not in the log; bound {bound} ({changes} leader changes and {crashes} crashes of its leader, shard {shard})"
            ));
        }
    }
    (total, out)
}

#[cfg(test)]
mod tests {
    use super::super::history::Op;
    use super::*;
    use crate::limiter::SECOND;

    #[test]
    fn a_fixed_window_is_allowed_its_limit_per_window_a_lost_span_touches() {
        let window = Limit::new(Algorithm::FixedWindow, 2, SECOND / 10, 2).unwrap();
        // 400 ms over 100 ms windows touches at most 5 of them.
        assert_eq!(allowance(&window, 4 * SECOND / 10), 10);
        let bucket = Limit::new(Algorithm::TokenBucket, 2, SECOND, 4).unwrap();
        assert_eq!(allowance(&bucket, 4 * SECOND / 10), bucket.capacity());
    }

    /// Seed 300117's case, built by hand (the seed itself stopped showing it when a timing
    /// changed): a leader crashed after a fast admission it had not replicated, and led the
    /// same term again on restart, so the log shows no leader change. One admission lost per
    /// crash is within the bound; with no crash it is over it.
    #[test]
    fn a_leader_crash_without_an_election_allows_one_lost_batch() {
        let history = |crashes: u64| History {
            ops: vec![Op {
                client: 0,
                id: "c0-1".into(),
                anonymous: false,
                items: vec![super::super::history::Item {
                    policy: "p".into(),
                    key: "k".into(),
                    fast: true,
                }],
                node: 2,
                invoked: 0,
                completed: Some(1),
                outcome: Outcome::Allowed,
            }],
            leader_crashes: [(1, crashes)].into_iter().filter(|c| c.1 > 0).collect(),
            ..Default::default()
        };
        let check = |h: &History| {
            check(
                h,
                &AppliedLog::default(),
                &BTreeMap::new(),
                &Default::default(),
                |_, _| 1,
                |_| true,
                |_| 1,
            )
        };
        let (excess, violations) = check(&history(1));
        assert_eq!((excess, violations.len()), (1, 0), "{violations:?}");
        let (excess, violations) = check(&history(0));
        assert_eq!(excess, 1);
        assert!(
            violations.len() == 1
                && violations[0].contains("bound 0 (0 leader changes and 0 crashes"),
            "{violations:?}"
        );
    }
}
