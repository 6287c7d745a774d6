//! Invariant: what a member admits by itself while a shard cannot decide (`on_unavailable =
//! "local"`) keeps to its share of the limit. Per member — per start of it: the share's table
//! is in memory — and per key, the admissions it answered so keep the bound of the limit's
//! share over the voters, in the member's own monotonic time, the clock its table decides
//! by. The share is the one docs/semantics.md promises, each of quota and capacity divided by
//! the voters (at least 1), written out here ([`share`]) rather than taken from the node or
//! from `Limit::share`, so that a fault in either shows. So N members together admit at most
//! N shares beside what the log admits. (A node divides by its shard's learners too, which
//! only makes its share smaller while a member is added: this checks the bound over the
//! voters.)

use super::bound;
use super::history::FallbackRecord;
use crate::limiter::{Limit, Nanos};
use crate::policy::OnUnavailable;
use crate::raft::NodeId;
use std::collections::BTreeMap;

/// A member's share of `limit` among `voters`: each of quota and capacity divided, at least 1.
pub fn share(limit: &Limit, voters: u64) -> Option<Limit> {
    let part = |v: u64| (v / voters.max(1)).max(1);
    Limit::new(
        limit.algorithm(),
        part(limit.quota()),
        limit.period(),
        part(limit.capacity()),
    )
    .ok()
}

pub fn check(fallbacks: &[FallbackRecord], voters: u64) -> Vec<String> {
    type Admitted<'a> = (&'a Limit, Vec<(Nanos, u64)>);
    let mut per: BTreeMap<(NodeId, u64, &str), Admitted<'_>> = BTreeMap::new();
    for f in fallbacks
        .iter()
        .filter(|f| f.allowed && f.rule == OnUnavailable::Local)
    {
        per.entry((f.node, f.incarnation, f.key.as_str()))
            .or_insert_with(|| (&f.limit, Vec::new()))
            .1
            .push((f.at, f.cost));
    }
    let mut out = Vec::new();
    for ((node, _, key), (limit, mut times)) in per {
        // One member's answers come in its clock's order; sorted all the same (stable).
        times.sort_by_key(|t| t.0);
        match share(limit, voters) {
            Some(share) => {
                if let Some(v) = bound::violation(&share, &times) {
                    out.push(format!(
                        "local: node {node} admitted {key} beyond its share of the limit by \
                         itself: {v}"
                    ));
                }
            }
            None => out.push(format!("local: no share of {key}'s limit {limit:?}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, SECOND};

    fn admitted(node: NodeId, incarnation: u64, at: Nanos) -> FallbackRecord {
        FallbackRecord {
            node,
            incarnation,
            key: "k".into(),
            // 3 per second, burst 3: a share of one per second, burst one, over 3 voters.
            limit: Limit::new(Algorithm::TokenBucket, 3, SECOND, 3).unwrap(),
            cost: 1,
            request_id: None,
            rule: OnUnavailable::Local,
            allowed: true,
            at,
        }
    }

    #[test]
    fn each_member_and_start_is_held_to_its_own_share() {
        // One a second at each of three members, and again after a restart: within.
        let ok: Vec<_> = (1..=3)
            .flat_map(|n| [admitted(n, 1, 0), admitted(n, 1, SECOND), admitted(n, 2, 0)])
            .collect();
        assert!(check(&ok, 3).is_empty());
        // Two within a second at one member in one start: beyond its share.
        let mut over = ok.clone();
        over.push(admitted(2, 1, SECOND / 2));
        let v = check(&over, 3);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("node 2"), "{v:?}");
        // Denials and `allow`'s admissions are not the share's.
        let mut other = ok;
        other.push(FallbackRecord {
            allowed: false,
            ..admitted(2, 1, SECOND / 2)
        });
        other.push(FallbackRecord {
            rule: OnUnavailable::Allow,
            ..admitted(2, 1, SECOND / 2)
        });
        assert!(check(&other, 3).is_empty());
    }
}
