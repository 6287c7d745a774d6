//! Invariant: liveness after healing. Within a bounded simulated time after the last fault
//! is healed, every shard has a leader that every node agrees on, and a check under the
//! limit on every shard is admitted.

use super::history::secs;
use std::time::Duration;

/// What the healing phase measured.
#[derive(Debug, Clone, Default)]
pub struct Liveness {
    /// Simulated ns from the heal until every node saw the same leader for every shard.
    pub leaders_after: Option<u64>,
    /// Per shard: ns from the heal until a probe check there was admitted.
    pub admitted_after: Vec<Option<u64>>,
    /// Per shard: how each node saw it at the end of the probing (for a shard whose probe
    /// was never admitted, the report says where it stood).
    pub views: Vec<String>,
}

pub fn check(l: &Liveness, within: Duration) -> Vec<String> {
    let bound = within.as_nanos() as u64;
    let mut out = Vec::new();
    match l.leaders_after {
        Some(t) if t <= bound => {}
        Some(t) => out.push(format!(
            "liveness: leaders agreed only {} s after healing",
            secs(t)
        )),
        None => out.push(format!(
            "liveness: some shard had no agreed leader {} s after healing",
            secs(bound)
        )),
    }
    for (shard, t) in l.admitted_after.iter().enumerate() {
        match t {
            Some(t) if *t <= bound => {}
            _ => out.push(format!(
                "liveness: no under-limit check was admitted on shard {shard} within {} s of \
                 healing{}",
                secs(bound),
                l.views
                    .get(shard)
                    .map(|v| format!(" (the nodes' views: {v})"))
                    .unwrap_or_default()
            )),
        }
    }
    out
}
