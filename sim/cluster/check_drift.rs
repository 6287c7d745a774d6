//! Invariant: a strict limit's over-admission in real time is no larger than clock drift
//! allows (docs/semantics.md, "Clocks").
//!
//! Decisions run on shard time, which a leader advances with its own monotonic clock: a
//! leader whose clock runs fast by `d` lets its shard's time pass `1 + d` times faster than
//! real time, so its buckets refill that much faster. `check_strict` proves the bound in
//! shard time; this checker measures in the simulation's true time. For a strict token
//! bucket or GCRA, over any span `dt` of true time:
//!
//! `units admitted <= capacity + quota x (1 + d) x dt / period`
//!
//! where `d` is the fastest drift any node had (`Options::drift_bound_ppm`). Each admission
//! is placed by its shard time, and its true time is only known to lie between the call's
//! invocation and its "allowed" answer (the end of the run for any other outcome: an unknown
//! outcome may be applied later; the checks here carry request ids, so they get no fallback
//! denial, and a denial is not applied as an admission, `check_lost`), so a span is taken at
//! its widest: from the earlier admission's invocation to the later one's answer. An item a
//! node admitted by its `on_unavailable` rule got its "allowed" from that node, not from the
//! log, whose decision on the id (if the attempt reached the leader) may come later: the end
//! of the run bounds it too.

use super::history::{AppliedLog, Op, Outcome};
use crate::limiter::{Algorithm, Limit, Nanos};
use std::collections::BTreeMap;

/// One key's admissions: `(shard time, earliest true time, latest true time, cost)`.
type Spans = Vec<(Nanos, Nanos, Nanos, u64)>;

/// Violations over the committed log's strict bucket and GCRA admissions, refunds taken out
/// (`is_strict` by storage key), `end` the true time the run ended.
pub fn check(
    log: &AppliedLog,
    ops: &[Op],
    end: Nanos,
    drift_bound_ppm: i64,
    outside: &std::collections::BTreeSet<&str>,
    is_strict: impl Fn(&str) -> bool,
) -> Vec<String> {
    // Only an "allowed" answer says the decision was made by then: an unknown outcome may be
    // applied, as an admission, after it (taking every other outcome so is the safe side).
    let calls: BTreeMap<String, (Nanos, Nanos)> = ops
        .iter()
        .flat_map(|o| {
            let by = match (&o.outcome, o.completed) {
                (Outcome::Allowed, Some(t)) => t,
                _ => end,
            };
            o.logged().map(move |(id, _)| {
                let by = if outside.contains(id.as_str()) {
                    end
                } else {
                    by
                };
                (id, (o.invoked, by))
            })
        })
        .collect();
    let mut keys: BTreeMap<&str, (&Limit, Spans)> = BTreeMap::new();
    for c in log.spent() {
        let bucket = matches!(
            c.limit.algorithm(),
            Algorithm::TokenBucket | Algorithm::Gcra
        );
        if !bucket || !is_strict(&c.key) {
            continue;
        }
        let Some(&(lo, hi)) = c.request_id.as_ref().and_then(|id| calls.get(id)) else {
            continue;
        };
        keys.entry(c.key.as_str())
            .or_insert_with(|| (&c.limit, Vec::new()))
            .1
            .push((c.at, lo, hi, c.cost));
    }
    keys.into_iter()
        .filter_map(|(key, (limit, mut spans))| {
            spans.sort_by_key(|s| (s.0, s.1));
            violation(limit, &spans, drift_bound_ppm).map(|v| {
                format!(
                    "strict over-admission beyond the drift bound ({drift_bound_ppm} ppm) on {key}: {v}"
                )
            })
        })
        .collect()
}

/// The first span that breaks `capacity + quota x (1 + ppm/10^6) x dt / period`.
fn violation(limit: &Limit, spans: &[(Nanos, Nanos, Nanos, u64)], ppm: i64) -> Option<String> {
    const M: i128 = 1_000_000;
    let period = limit.period() as i128;
    let cap = limit.capacity() as i128;
    // The quota per period, scaled by 10^6 and by the drift.
    let q = limit.quota() as i128 * (M + ppm as i128);
    // units(i..=j) x P x M <= cap x P x M + q x (hi_j - lo_i): with prefix sums S,
    // S_{j+1} P M - q hi_j <= cap P M + min_{i <= j} (S_i P M - q lo_i).
    let mut best: Option<(i128, usize)> = None;
    let mut sum: i128 = 0;
    for (j, &(_, lo, hi, cost)) in spans.iter().enumerate() {
        let here = sum * period * M - q * lo as i128;
        if best.is_none_or(|(b, _)| here < b) {
            best = Some((here, j));
        }
        sum += cost as i128;
        let (b, i) = best.unwrap_or((0, 0));
        if sum * period * M - q * hi as i128 > cap * period * M + b {
            let units: u64 = spans[i..=j].iter().map(|s| s.3).sum();
            return Some(format!(
                "{units} units admitted within {} ns of true time (calls from {} to {hi} ns, shard times {} to {}); the bound is {cap} + {} x (1 + {ppm}/10^6) x dt / {period}",
                hi.saturating_sub(spans[i].1),
                spans[i].1,
                spans[i].0,
                spans[j].0,
                limit.quota()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::SECOND;

    #[test]
    fn the_drift_bound_admits_the_extra_refill_and_no_more() {
        // 1 per second, capacity 1: 11 admissions placed exactly at 0, 1 s, ..., 10 s fit
        // at any drift; 12 within those 10 s only with a 10 % drift.
        let l = Limit::new(Algorithm::TokenBucket, 1, SECOND, 1).unwrap();
        let at = |ts: &[u64]| -> Vec<(Nanos, Nanos, Nanos, u64)> {
            ts.iter().map(|&t| (t, t, t, 1)).collect()
        };
        let eleven: Vec<u64> = (0..=10).map(|k| k * SECOND).collect();
        assert!(violation(&l, &at(&eleven), 0).is_none());
        // Every 10/11 s (rounded up), 12 in just over 10 s.
        let twelve: Vec<u64> = (0..12).map(|k| k * (10 * SECOND).div_ceil(11)).collect();
        assert!(violation(&l, &at(&twelve), 0).is_some());
        assert!(violation(&l, &at(&twelve), 100_000).is_none());
        // Calls answered a second after they were made widen every span by that second.
        let wide: Vec<_> = at(&twelve)
            .into_iter()
            .map(|(s, lo, hi, c)| (s, lo, hi + SECOND, c))
            .collect();
        assert!(violation(&l, &wide, 0).is_none());
    }
}
