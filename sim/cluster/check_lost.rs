//! Invariant: no acknowledged strict admission is lost — across crashes, failovers and
//! partitions. Every check a client was told was admitted under a strict policy is an
//! admission in the committed log (under its request id), so a failover can never hand the
//! same units out again.
//!
//! And its mirror, under every policy: a check a client was told was denied is no admission
//! in the log. A denial says nothing was spent, so a caller retries it under a new request id
//! (the id's first answer is kept); had the log admitted it, the retry would spend twice. An
//! `on_unavailable` denial of a check the leader went on to admit did exactly that (the
//! clients here send an id with every check of one item: no denial of one is given from a
//! member's cache). A check of several items may be denied with admissions of its other
//! items in the log: those must be refunded, or they stay spent ([`kept`], the safe side);
//! and no item of an admitted check is ever refunded.
//!
//! An item a node admitted by its `on_unavailable` rule (`allow`, or `local` within its share)
//! is the node's admission, not the log's: it need not be in the log (`check_local` bounds
//! it), though it must not be refunded either (only the log's admissions are).

use super::history::{History, Outcome};
use crate::limiter::Nanos;
use std::collections::{BTreeMap, BTreeSet};

pub fn check(
    history: &History,
    decisions: &BTreeMap<&str, (bool, Nanos)>,
    refunded: &BTreeSet<&str>,
    outside: &BTreeSet<&str>,
) -> Vec<String> {
    let mut out = Vec::new();
    for op in history.ops.iter().filter(|o| o.outcome == Outcome::Allowed) {
        for (id, item) in op.logged() {
            // Its caller spends it: nothing may give it back.
            if refunded.contains(id.as_str()) {
                out.push(format!(
                    "{id} ({} {}) was acknowledged as admitted but the log refunded it",
                    item.policy, item.key
                ));
            }
            // An admission the node made by itself is not the log's to hold.
            if item.fast || outside.contains(id.as_str()) {
                continue;
            }
            match decisions.get(id.as_str()) {
                Some((true, _)) => {}
                Some((false, _)) => out.push(format!(
                    "strict: {id} ({} {}) was acknowledged as admitted but the log denied it",
                    item.policy, item.key
                )),
                None => out.push(format!(
                    "strict: {id} ({} {}) was acknowledged as admitted but is in no node's applied log (lost)",
                    item.policy, item.key
                )),
            }
        }
    }
    // A check of several items that one of them denied holds the others' admissions until
    // their refunds apply (`check_strict` takes refunds out); one whose refund never applied
    // stays spent, the safe side, and is counted by `kept`.
    for op in history
        .ops
        .iter()
        .filter(|o| o.outcome == Outcome::Denied && o.items.len() == 1)
    {
        for (id, item) in op.logged() {
            if let Some((true, _)) = decisions.get(id.as_str()) {
                out.push(format!(
                    "{} ({} {}) was answered as denied but the log admitted it (spent unknown to its caller)",
                    op.id, item.policy, item.key
                ));
            }
        }
    }
    out
}

/// The admissions of checks answered as denied (of several items: another item denied)
/// that the log holds and never refunded: a refund that did not apply in time (its shard
/// had no leader, the call timed out). Spent, unknown to their caller: the safe side of the
/// all-or-nothing rule, and what a caller's retry under a new id spends again.
pub fn kept(
    history: &History,
    decisions: &BTreeMap<&str, (bool, Nanos)>,
    refunded: &BTreeSet<&str>,
) -> u64 {
    history
        .ops
        .iter()
        .filter(|o| o.outcome == Outcome::Denied && o.items.len() > 1)
        .flat_map(|o| o.logged())
        .filter(|(id, _)| {
            matches!(decisions.get(id.as_str()), Some((true, _))) && !refunded.contains(id.as_str())
        })
        .count() as u64
}
