//! What happened in a run: every client operation, every fault, and every entry any node
//! applied — the material the checkers judge — plus the event trace that must come out
//! byte-identical for the same seed.

use crate::limiter::{Limit, Nanos};
use crate::policy::OnUnavailable;
use crate::raft::hooks::{AppliedEntry, FallbackAnswer};
use crate::raft::NodeId;
use crate::service::item_request_id;
use crate::shard::command::{Applied, Command};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Per node, every shard's `(shard, applied index, state digest)`.
pub type Digests = Vec<(NodeId, Vec<(u64, u64, u64)>)>;

/// A key's admissions in the committed log: its limit and `(shard time, cost)` each.
pub type Admissions<'a> = (&'a Limit, Vec<(Nanos, u64)>);

/// How a client operation ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Still running when the workload stopped.
    Pending,
    Allowed,
    Denied,
    /// Definitely not applied (the connection was never made, or the node refused the input).
    Failed(String),
    /// It may or may not have been applied (a timeout, a broken connection, "unavailable").
    Unknown(String),
}

impl Outcome {
    /// The `TRYAGAIN` of a shard that could not decide a check with a request id in time
    /// (`service::OUTCOME_UNKNOWN`): the cluster's answer, not a call lost on the way.
    pub fn is_undecided(&self) -> bool {
        matches!(self, Outcome::Unknown(e) if e.contains(crate::service::OUTCOME_UNKNOWN))
    }
}

/// One limit a check names: a policy and the key it is spent on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub policy: String,
    pub key: String,
    /// The policy's consistency is `fast`.
    pub fast: bool,
}

/// One client operation: a check with a unique request id, of one item or (with
/// `--multi-item-clients`) two, all or nothing.
#[derive(Debug, Clone)]
pub struct Op {
    pub client: usize,
    /// The operation's name, and the request id the client sent with it (the log carries
    /// item `i` under `item_request_id`) unless `anonymous`.
    pub id: String,
    /// Sent without a request id (`--multi-item-clients` sends a quarter of its checks of
    /// two items so): no retry, and the log cannot tie its decisions to it.
    pub anonymous: bool,
    pub items: Vec<Item>,
    pub node: NodeId,
    pub invoked: Nanos,
    pub completed: Option<Nanos>,
    pub outcome: Outcome,
}

impl Op {
    /// Each item with the request id the log carries it under; none for an anonymous
    /// operation (the checkers that follow ids pass it by; the bounds count its admissions
    /// in the log all the same).
    pub fn logged(&self) -> impl Iterator<Item = (String, &Item)> {
        let items = if self.anonymous {
            &[][..]
        } else {
            &self.items[..]
        };
        items.iter().enumerate().map(|(i, item)| {
            // Every check costs 1; a policy's key prefix is `{policy}:`.
            let storage_key = format!("{}:{}", item.policy, item.key);
            (item_request_id(&self.id, i, 1, &storage_key), item)
        })
    }

    /// The items as the trace shows them: `policy key`, joined by ` + `.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .items
            .iter()
            .map(|i| format!("{} {}", i.policy, i.key))
            .collect();
        parts.join(" + ")
    }
}

/// A check as the log applied it.
#[derive(Debug, Clone)]
pub struct AppliedCheck {
    pub request_id: Option<String>,
    pub key: String,
    pub limit: Limit,
    pub cost: u64,
    pub allowed: bool,
    /// Answered from the idempotency table: consumed nothing.
    pub replayed: bool,
    /// Answered by `on_full` at the key cap.
    pub fallback: bool,
    /// The shard time it was decided at (the state's time: at least the batch's).
    pub at: Nanos,
}

/// A refund as the log applied it: `cost` given back to the admission on `key` at
/// `admitted_at` (of an all-or-nothing check another item denied), remembered under
/// `request_id` (the shard gives such an admission back once) or else made in an entry of
/// `epoch` (the shard gives it back only in an entry of that epoch).
#[derive(Debug, Clone)]
pub struct AppliedRefund {
    pub key: String,
    pub admitted_at: Nanos,
    pub cost: u64,
    pub request_id: Option<String>,
    /// Without a request id: whether it applied in an entry of its admission's epoch.
    pub same_epoch: bool,
}

/// One log entry (of one group) as the first node to apply it saw it.
#[derive(Debug, Clone)]
pub struct AppliedRecord {
    pub term: u64,
    /// Shard time of the batch.
    pub time: Nanos,
    /// A digest of the batch and its results, to compare what different nodes applied.
    pub digest: u64,
    pub checks: Vec<AppliedCheck>,
    pub refunds: Vec<AppliedRefund>,
    /// The nodes that applied it.
    pub nodes: Vec<NodeId>,
}

/// Every entry applied anywhere, keyed by (group, index): the committed log, as far as any
/// node got. Two nodes applying different entries at the same place is a violation by itself.
#[derive(Debug, Default)]
pub struct AppliedLog {
    pub entries: BTreeMap<(u64, u64), AppliedRecord>,
    pub conflicts: Vec<String>,
}

impl AppliedLog {
    pub fn record(&mut self, e: &AppliedEntry<'_>) {
        let Some(batch) = e.batch else {
            return;
        };
        let digest = {
            let bytes =
                bincode::serde::encode_to_vec((batch, e.results), bincode::config::standard())
                    .unwrap_or_default();
            crate::shard::route::fnv1a(&bytes)
        };
        if let Some(r) = self.entries.get_mut(&(e.group, e.index)) {
            if r.digest != digest || r.term != e.term {
                self.conflicts.push(format!(
                    "shard {} index {}: node {} applied term {} digest {:x}, node(s) {:?} applied term {} digest {:x}",
                    e.group, e.index, e.node, e.term, digest, r.nodes, r.term, r.digest
                ));
            }
            if !r.nodes.contains(&e.node) {
                r.nodes.push(e.node);
            }
            return;
        }
        let checks = batch
            .commands
            .iter()
            .zip(e.results)
            .filter_map(|(c, a)| match (c, a) {
                (
                    Command::Check {
                        key,
                        limit,
                        cost,
                        request_id,
                        ..
                    },
                    Applied::Decided {
                        decision,
                        replayed,
                        fallback,
                        at,
                        ..
                    },
                ) => Some(AppliedCheck {
                    request_id: request_id.clone(),
                    key: key.clone(),
                    limit: limit.clone(),
                    cost: *cost,
                    allowed: decision.allowed(),
                    replayed: *replayed,
                    fallback: fallback.any(),
                    at: *at,
                }),
                _ => None,
            })
            .collect();
        let refunds = batch
            .commands
            .iter()
            .filter_map(|c| match c {
                Command::Refund {
                    key,
                    cost,
                    admitted_at,
                    request_id,
                    epoch,
                    ..
                } => Some(AppliedRefund {
                    key: key.clone(),
                    admitted_at: *admitted_at,
                    cost: *cost,
                    request_id: request_id.clone(),
                    same_epoch: *epoch == batch.epoch,
                }),
                _ => None,
            })
            .collect();
        self.entries.insert(
            (e.group, e.index),
            AppliedRecord {
                term: e.term,
                time: batch.time,
                digest,
                checks,
                refunds,
                nodes: vec![e.node],
            },
        );
    }

    /// The first application of each request id that consumed (not a replay), with its
    /// shard time: what the cluster decided for that request.
    pub fn decisions(&self) -> BTreeMap<&str, (bool, Nanos)> {
        let mut out = BTreeMap::new();
        for r in self.entries.values() {
            for c in &r.checks {
                if let (Some(id), false) = (&c.request_id, c.replayed) {
                    out.entry(id.as_str()).or_insert((c.allowed, c.at));
                }
            }
        }
        out
    }

    /// Every admission the log still holds, in log order (shard by shard): checks admitted
    /// by their algorithm (not replays, not `on_full`'s), less those a refund in the log gave
    /// back. A refund names its admission's request id, or (a check sent without one) its
    /// key, time and cost, and then gives back only in an entry of its admission's epoch, as
    /// the shard does; a refund of an admission given back already gives nothing back here.
    /// This is what the limits' bounds are judged on: a refund that gave back more than its
    /// admission shows as the admissions after it breaking the bound.
    pub fn spent(&self) -> Vec<&AppliedCheck> {
        let refunded = self.refunded();
        let mut by_time: BTreeMap<(&str, Nanos, u64), usize> = BTreeMap::new();
        for f in self
            .refunds()
            .filter(|f| f.request_id.is_none() && f.same_epoch)
        {
            *by_time
                .entry((f.key.as_str(), f.admitted_at, f.cost))
                .or_default() += 1;
        }
        let mut out = Vec::new();
        for r in self.entries.values() {
            for c in &r.checks {
                if !c.allowed || c.replayed || c.fallback {
                    continue;
                }
                if let Some(id) = &c.request_id {
                    if refunded.contains(id.as_str()) {
                        continue;
                    }
                }
                match by_time.get_mut(&(c.key.as_str(), c.at, c.cost)) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => out.push(c),
                }
            }
        }
        out
    }

    /// Every refund in the log.
    pub fn refunds(&self) -> impl Iterator<Item = &AppliedRefund> {
        self.entries.values().flat_map(|r| &r.refunds)
    }

    /// The request ids the log refunded an admission of.
    pub fn refunded(&self) -> std::collections::BTreeSet<&str> {
        self.refunds()
            .filter_map(|f| f.request_id.as_deref())
            .collect()
    }

    /// Leadership terms seen per shard (entries applied under each).
    pub fn terms(&self) -> BTreeMap<u64, Vec<u64>> {
        let mut out: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for ((g, _), r) in &self.entries {
            let t = out.entry(*g).or_default();
            if t.last() != Some(&r.term) {
                t.push(r.term);
            }
        }
        out
    }
}

/// A check a node answered by its `on_unavailable` rule (`raft::hooks::FallbackAnswer`).
#[derive(Debug, Clone)]
pub struct FallbackRecord {
    pub node: NodeId,
    /// The node's start: its `local` table is in memory, so each start has its own share.
    pub incarnation: u64,
    pub key: String,
    pub limit: Limit,
    pub cost: u64,
    pub request_id: Option<String>,
    pub rule: OnUnavailable,
    pub allowed: bool,
    /// The node's monotonic time.
    pub at: Nanos,
}

impl FallbackRecord {
    pub fn of(f: &FallbackAnswer<'_>) -> Self {
        FallbackRecord {
            node: f.node,
            incarnation: f.incarnation,
            key: f.key.to_owned(),
            limit: f.limit.clone(),
            cost: f.cost,
            request_id: f.request_id.map(str::to_owned),
            rule: f.rule,
            allowed: f.allowed,
            at: f.at,
        }
    }
}

/// The request ids (of items, as `item_request_id` names them) that some node admitted by its `on_unavailable`
/// rule: such an admission is the node's, outside the log, so the checkers that hold an
/// acknowledged admission to the log pass these by. (Coarse: an id admitted so once and
/// answered by the log in a later attempt is passed by too.)
pub fn admitted_outside_the_log(fallbacks: &[FallbackRecord]) -> std::collections::BTreeSet<&str> {
    fallbacks
        .iter()
        .filter(|f| f.allowed)
        .filter_map(|f| f.request_id.as_deref())
        .collect()
}

/// The run's history: operations in invocation order, and the trace.
#[derive(Debug, Default)]
pub struct History {
    pub ops: Vec<Op>,
    /// One line per event, in the order the (single-threaded) simulation produced them.
    pub trace: String,
    pub faults: u64,
    /// Shard leaderships a node handed to another (`raft::hooks::Hooks::handover`), and
    /// handovers that ended with the leadership where it was.
    pub handovers: u64,
    pub handovers_failed: u64,
    /// Disk stalls of `--disk-stalls`, and those that ended in a crash.
    pub disk_stalls: u64,
    pub stall_crashes: u64,
    /// Per shard, how many times the nemesis crashed a node that led it (by its own
    /// account): each crash loses the fast answers of the entries it had not replicated,
    /// whether or not another node is elected before it restarts (a restarted node comes
    /// back a follower and leads again only in a later term).
    pub leader_crashes: BTreeMap<u64, u64>,
    /// Per shard whose leader a crash took down (not a quick restart): ns until another
    /// node led it. And the shards that had no other leader when the next fault came.
    pub failovers: Vec<Nanos>,
    pub failovers_unresolved: u64,
    /// Checks sent again under their request id after an unknown outcome
    /// (`--retry-clients`).
    pub retries: u64,
    /// Every `on_unavailable` answer any node gave, in the order given.
    pub fallbacks: Vec<FallbackRecord>,
    /// Every vote the nodes' log stores saved or found at a start, as checked.
    pub votes: super::check_vote::Votes,
}

/// Formats simulated nanoseconds as seconds with millisecond precision.
pub fn secs(ns: Nanos) -> String {
    format!("{}.{:03}", ns / 1_000_000_000, (ns / 1_000_000) % 1000)
}

impl History {
    pub fn event(&mut self, at: Nanos, what: impl std::fmt::Display) {
        let _ = writeln!(self.trace, "{} {what}", secs(at));
    }

    pub fn retry(&mut self, at: Nanos, what: impl std::fmt::Display) {
        self.retries += 1;
        self.event(at, what);
    }

    pub fn fault(&mut self, at: Nanos, what: impl std::fmt::Display) {
        self.faults += 1;
        self.event(at, format_args!("nemesis {what}"));
    }

    /// Starts an operation; returns its index.
    pub fn invoke(&mut self, op: Op) -> usize {
        self.event(
            op.invoked,
            format_args!(
                "c{} invoke {}{} {} -> n{}",
                op.client,
                op.id,
                if op.anonymous { " (no id)" } else { "" },
                op.describe(),
                op.node
            ),
        );
        self.ops.push(op);
        self.ops.len() - 1
    }

    pub fn complete(&mut self, i: usize, at: Nanos, outcome: Outcome) {
        let op = &mut self.ops[i];
        op.completed = Some(at);
        op.outcome = outcome;
        let line = format!("c{} {} {:?}", op.client, op.id, op.outcome);
        self.event(at, line);
    }

    /// 64-bit digest of the trace (FNV-1a), to compare runs.
    pub fn trace_digest(&self) -> u64 {
        crate::shard::route::fnv1a(self.trace.as_bytes())
    }

    /// Everything but the faults and the closing tally (for comparing runs whose faults
    /// differ, like the skew scenarios: same operations, same answers, same applies).
    pub fn ops_trace(&self) -> String {
        self.trace
            .lines()
            .filter(|l| !l.contains(" nemesis ") && !l.contains(" end: "))
            .fold(String::new(), |mut s, l| {
                s.push_str(l);
                s.push('\n');
                s
            })
    }
}
