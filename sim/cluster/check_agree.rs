//! Invariant: replicas agree. No two nodes applied different entries at the same log
//! position (recorded as they apply), and once healed and caught up every node's shard state
//! has the same digest (`ShardState::digest`) at the same applied index.

use super::history::{AppliedLog, Digests};

/// `digests`: per node, `(shard, applied index, digest)` after the run healed.
pub fn check(log: &AppliedLog, digests: &Digests) -> Vec<String> {
    let mut out = super::first_ten(
        log.conflicts
            .iter()
            .map(|c| format!("divergent apply: {c}")),
        "divergent applies",
    );
    let Some((first_id, first)) = digests.first() else {
        return out;
    };
    for (id, other) in &digests[1..] {
        for (a, b) in first.iter().zip(other) {
            if a != b {
                out.push(format!(
                    "replicas differ after healing: shard {} is (applied {}, digest {:x}) on n{first_id} but (applied {}, digest {:x}) on n{id}",
                    a.0, a.1, a.2, b.1, b.2
                ));
            }
        }
    }
    out
}
