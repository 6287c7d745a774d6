//! Invariant: no acknowledged strict admission is lost — across crashes, failovers and
//! partitions. Every check a client was told was admitted under a strict policy is an
//! admission in the committed log (under its request id), so a failover can never hand the
//! same units out again.
//!
//! And its mirror, under every policy: a check a client was told was denied is no admission
//! in the log. A denial says nothing was spent, so a caller retries it under a new request id
//! (the id's first answer is kept); had the log admitted it, the retry would spend twice. An
//! `on_unavailable` denial of a check the leader went on to admit did exactly that (the
//! clients here always send an id: no denial is given from a member's cache).

use super::history::{History, Outcome};
use crate::limiter::Nanos;
use std::collections::BTreeMap;

pub fn check(history: &History, decisions: &BTreeMap<&str, (bool, Nanos)>) -> Vec<String> {
    let mut out = Vec::new();
    for op in history
        .ops
        .iter()
        .filter(|o| !o.fast && o.outcome == Outcome::Allowed)
    {
        let id = format!("{}#0", op.id);
        match decisions.get(id.as_str()) {
            Some((true, _)) => {}
            Some((false, _)) => out.push(format!(
                "strict: {} ({} {}) was acknowledged as admitted but the log denied it",
                op.id, op.policy, op.key
            )),
            None => out.push(format!(
                "strict: {} ({} {}) was acknowledged as admitted but is in no node's applied log (lost)",
                op.id, op.policy, op.key
            )),
        }
    }
    for op in history.ops.iter().filter(|o| o.outcome == Outcome::Denied) {
        if let Some((true, _)) = decisions.get(format!("{}#0", op.id).as_str()) {
            out.push(format!(
                "{} ({} {}) was answered as denied but the log admitted it (spent unknown to its caller)",
                op.id, op.policy, op.key
            ));
        }
    }
    out
}
