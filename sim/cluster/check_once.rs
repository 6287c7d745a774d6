//! Invariant: a request id is decided once. However often a client sends a check again
//! under the same id (after a timeout, a lost connection, a `TRYAGAIN`; `--retry-clients`),
//! and whichever leader each attempt reaches, the committed log holds at most one
//! application of the id that was not a replay of the first: the idempotency table is
//! replicated with the shard's state, so a new leader, a restarted node and a snapshot
//! all answer a repeat from it. Two would mean the repeat consumed again.

use super::history::AppliedLog;
use std::collections::BTreeMap;

pub fn check(log: &AppliedLog) -> Vec<String> {
    // Request id -> where (shard, index) it was applied other than as a replay.
    let mut decided: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for (at, r) in &log.entries {
        for c in &r.checks {
            if let (Some(id), false) = (&c.request_id, c.replayed) {
                decided.entry(id.as_str()).or_default().push(*at);
            }
        }
    }
    decided
        .into_iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(id, at)| {
            format!(
                "request id {id} was decided {} times, not replayed (shard, index): {at:?}",
                at.len()
            )
        })
        .collect()
}
