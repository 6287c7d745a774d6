//! Invariant: a strict limit never over-admits, in any window (epsilon = 0).
//!
//! Counted over the committed log — every admission any node applied, keyed by log position,
//! which includes every admission whose reply was lost (an unknown outcome resolved from the
//! applied log) — less those the log refunded (a check of several items that one of them
//! denied gives back what the others admitted), in shard time, against each algorithm's
//! bound ([`super::bound`]). The admissions clients were told of are all in it too, or
//! `check_lost` reports them.

use super::bound;
use super::history::{Admissions, AppliedLog};
use std::collections::BTreeMap;

/// Every key's admissions `(limit, [(time, cost)])` from the committed log, refunds taken
/// out ([`AppliedLog::spent`]), for the limits `select` accepts (by storage key).
pub fn admissions(
    log: &AppliedLog,
    select: impl Fn(&str) -> bool,
) -> BTreeMap<&str, Admissions<'_>> {
    let mut keys: BTreeMap<&str, Admissions<'_>> = BTreeMap::new();
    for c in log.spent() {
        if select(&c.key) {
            keys.entry(c.key.as_str())
                .or_insert_with(|| (&c.limit, Vec::new()))
                .1
                .push((c.at, c.cost));
        }
    }
    // Entries of different shards interleave; within a key, order by time (stable).
    for (_, times) in keys.values_mut() {
        times.sort_by_key(|a| a.0);
    }
    keys
}

pub fn check(log: &AppliedLog, is_strict: impl Fn(&str) -> bool) -> Vec<String> {
    admissions(log, is_strict)
        .into_iter()
        .filter_map(|(key, (limit, times))| {
            bound::violation(limit, &times).map(|v| format!("strict over-admission on {key}: {v}"))
        })
        .collect()
}
