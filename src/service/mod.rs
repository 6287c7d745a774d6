//! The node's application API: what RESP, HTTP and the client call.
//!
//! A [`Service`] validates checks, resolves limits from the policy set, routes each item to
//! its shard actor (one batch per shard per call), applies the all-or-nothing rule across
//! shards (refunding what was admitted when any item denies), and keeps the metrics.

pub mod types;

pub use types::*;

pub mod refusal_log;
mod resolve;
use refusal_log::RefusalLog;
pub(crate) use resolve::{inline_route, item_request_id};

use crate::clock::{LazyTimer, SharedClock};
use crate::config::NodeConfig;
use crate::limiter::{Decision, Nanos, Outcome};
use crate::metrics::Metrics;
use crate::policy::PolicySet;
use crate::raft::cluster::{Cluster, GroupStatus};
use crate::shard::actor::{ShardError, Shards};
use crate::shard::command::{Applied, Command, Fallback};
use crate::shard::route::{shard_of, Sharding};
use crate::shard::state::Bounds;
use resolve::Resolved;
use serde::Serialize;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The commands bound for one shard, the (request, item) each answers, in order, and
/// whether every one of them may be answered before it commits (`consistency = "fast"`).
type ShardBatch = (Vec<(usize, usize)>, Vec<Command>, bool);

/// A handle to a running node's decision path. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

/// Where shard batches are decided: this node's own shard actors, or the cluster's Raft
/// groups (through their leaders).
pub enum Backend {
    Local(Shards),
    Cluster(Arc<Cluster>),
}

impl Backend {
    fn count(&self) -> u32 {
        match self {
            Backend::Local(s) => s.count(),
            Backend::Cluster(c) => c.count(),
        }
    }

    async fn apply(
        &self,
        shard: u32,
        commands: Vec<Command>,
        fast: bool,
    ) -> Result<Vec<Applied>, ShardError> {
        match self {
            Backend::Local(s) => s.apply(shard, commands).await,
            Backend::Cluster(c) => c.apply(shard, commands, fast).await,
        }
    }
}

struct Inner {
    config: NodeConfig,
    metrics: Metrics,
    clock: SharedClock,
    policies: arc_swap::ArcSwap<PolicySet>,
    shards: Backend,
    /// Bounds one call's wait for its shards.
    call_timeout: std::time::Duration,
    /// Counts decisions, for sampling the decision log deterministically.
    decided: AtomicU64,
    /// Which refused requests are logged: a flood of them is counted in full, but logged
    /// at a bounded rate.
    refusals: RefusalLog,
    /// Where the RESP server listens, once bound (`CLUSTER NODES` on a single node).
    resp_addr: std::sync::OnceLock<std::net::SocketAddr>,
}

/// One shard's status, for `/v1/admin/status`.
#[derive(Debug, Clone, Serialize)]
pub struct ShardStatus {
    pub shard: u32,
    pub keys: u64,
    pub queue_depth: u64,
    pub shard_time_ns: u64,
    pub restarts: u64,
}

/// The node's status, for `/v1/admin/status` and `INFO`.
#[derive(Debug, Clone, Serialize)]
pub struct NodeStatus {
    pub version: &'static str,
    pub shards: Vec<ShardStatus>,
    pub keys: u64,
    pub max_keys: u64,
    pub limits: Vec<String>,
    pub inline_allowed: bool,
    /// Every shard group's Raft state, when the node is a cluster member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterStatus>,
}

/// A cluster member's view of every shard group.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    pub node_id: u64,
    pub groups: Vec<GroupStatus>,
}

/// What a reload changed.
#[derive(Debug, Clone, Serialize)]
pub struct ReloadReport {
    pub limits: usize,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

/// Why a call whose shards did not answer within `timeout` is unavailable.
fn no_answer_within(timeout: std::time::Duration) -> String {
    format!("no answer from a shard within {timeout:?}")
}

/// Why a check with a request id is unavailable when its shard could not decide it in time
/// (`Applied::Unknown`).
pub const OUTCOME_UNKNOWN: &str = "the shard could not decide in time, and an attempt under this request id may have been admitted: retry with the same request id";

/// A check's request id and its resolved items, or the error that refused it.
type ResolvedCheck = (Option<String>, Result<Vec<Resolved>, CheckError>);

/// Decisions counted during one call, added to the `decisions` metric once per (limit,
/// outcome) at its end: a metric-vector lookup per decision showed in profiles of
/// pipelined load.
#[derive(Default)]
struct DecisionTally(Vec<(Cow<'static, str>, &'static str, u64)>);

impl DecisionTally {
    // A `&Cow`, not a `&str`: cloning it copies nothing for the built-in names.
    #[allow(clippy::ptr_arg)]
    fn count(&mut self, limit: &Cow<'static, str>, outcome: &'static str) {
        match self
            .0
            .iter_mut()
            .find(|(l, o, _)| *o == outcome && l == limit)
        {
            Some((_, _, n)) => *n += 1,
            // Borrowed (built-in) names are not copied.
            None => self.0.push((limit.clone(), outcome, 1)),
        }
    }

    fn add_to(&self, decisions: &prometheus::IntCounterVec) {
        for (limit, outcome, n) in &self.0 {
            decisions
                .with_label_values(&[limit.as_ref(), outcome])
                .inc_by(*n);
        }
    }
}

impl Service {
    /// Starts the shard actors. `policies` is the validated policy set to begin with.
    pub async fn start(
        config: NodeConfig,
        policies: PolicySet,
        clock: SharedClock,
    ) -> Result<Service, String> {
        let metrics = Metrics::new();
        let shards = Shards::start(
            config.shards.max(1),
            Service::bounds(&config),
            clock.clone(),
            metrics.clone(),
            config.shard_timeout,
        )
        .await?;
        let timeout = config.shard_timeout;
        Ok(Service::with_backend(
            config,
            policies,
            clock,
            metrics,
            Backend::Local(shards),
            timeout,
        ))
    }

    /// A service deciding through the cluster's Raft groups. `metrics` must be the ones the
    /// cluster counts into; `timeout` bounds one call (the cluster answers unavailable
    /// checks by `on_unavailable` within its own bound, which must be shorter).
    pub fn clustered(
        config: NodeConfig,
        policies: PolicySet,
        clock: SharedClock,
        metrics: Metrics,
        cluster: Arc<Cluster>,
        timeout: std::time::Duration,
    ) -> Service {
        Service::with_backend(
            config,
            policies,
            clock,
            metrics,
            Backend::Cluster(cluster),
            timeout,
        )
    }

    fn with_backend(
        config: NodeConfig,
        policies: PolicySet,
        clock: SharedClock,
        metrics: Metrics,
        shards: Backend,
        call_timeout: std::time::Duration,
    ) -> Service {
        Service {
            inner: Arc::new(Inner {
                config,
                metrics,
                clock,
                policies: arc_swap::ArcSwap::from_pointee(policies),
                shards,
                call_timeout,
                decided: AtomicU64::new(0),
                refusals: RefusalLog::default(),
                resp_addr: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The bounds each shard keeps, from the node's settings (every member of a cluster
    /// must use the same: replicas apply the same commands under them).
    pub fn bounds(config: &NodeConfig) -> Bounds {
        Bounds {
            max_keys: config.max_keys.div_ceil(config.shards.max(1) as u64),
            idempotency_horizon: u64::try_from(config.idempotency_horizon.as_nanos())
                .unwrap_or(u64::MAX),
            max_request_ids: 100_000,
        }
    }

    /// Decides one check (all-or-nothing over its items).
    pub async fn check(&self, req: CheckRequest) -> Result<CheckResponse, CheckError> {
        self.check_many(vec![req])
            .await
            .pop()
            .unwrap_or_else(|| Err(CheckError::Unavailable("no answer".into())))
    }

    /// Decides several independent checks — a connection's pipelined requests — with one
    /// message per shard. Answers come back in request order, exactly one each.
    ///
    /// All-or-nothing across shards: every item is decided on its shard; if any item of a
    /// request is denied, the items it admitted are refunded (through the same shards)
    /// before the answer is sent. This never over-admits; a concurrent request may briefly
    /// see the reservation and be denied (docs/semantics.md). A request that can never pass
    /// (an item's cost is above its limit's capacity) admits nothing: its other items are
    /// only peeked at.
    pub async fn check_many(
        &self,
        reqs: Vec<CheckRequest>,
    ) -> Vec<Result<CheckResponse, CheckError>> {
        let started = self.inner.clock.monotonic();
        self.check_many_with(reqs, None, started).await
    }

    /// A timer that bounds each of one caller's successive calls (a connection's) by the call
    /// timeout, for [`Service::check_many_timed`]: cheaper than a timer per call.
    pub fn call_timer(&self) -> LazyTimer {
        LazyTimer::new(self.inner.clock.clone(), self.inner.call_timeout)
    }

    /// [`Service::check_many`], with a call of one check of one item (an unpipelined
    /// request, the commonest call) bounded by `timer` (from [`Service::call_timer`],
    /// restarted here) instead of a timer of its own. Larger calls keep theirs. `started` is
    /// the caller's reading of the service's clock when the requests arrived (one clock read
    /// fewer per call: they showed in profiles of unpipelined load); latencies and the
    /// call's time limit run from it.
    pub async fn check_many_timed(
        &self,
        reqs: Vec<CheckRequest>,
        timer: &mut LazyTimer,
        started: crate::limiter::Nanos,
    ) -> Vec<Result<CheckResponse, CheckError>> {
        self.check_many_with(reqs, Some(timer), started).await
    }

    async fn check_many_with(
        &self,
        mut reqs: Vec<CheckRequest>,
        timer: Option<&mut LazyTimer>,
        started: crate::limiter::Nanos,
    ) -> Vec<Result<CheckResponse, CheckError>> {
        let policies = self.policies();
        let config = &self.inner.config;
        if let [req] = reqs.as_mut_slice() {
            // An unpipelined client's request: most calls. One item needs no fan-out, no
            // all-or-nothing bookkeeping and no refund, so it skips their allocations.
            let answer = match resolve::request(req, &policies, config) {
                Ok(items) if items.len() == 1 => {
                    self.check_one_item(items, req.request_id.as_deref(), started, timer)
                        .await
                }
                Ok(items) => {
                    let id = req.request_id.take();
                    return self.decide(vec![(id, Ok(items))], started).await;
                }
                Err(e) => Err(e),
            };
            return vec![answer];
        }
        let resolved = reqs
            .into_iter()
            .map(|mut req| {
                let items = resolve::request(&mut req, &policies, config);
                (req.request_id, items)
            })
            .collect();
        self.decide(resolved, started).await
    }

    /// A check of exactly one item: one command to one shard, under the call's timeout.
    async fn check_one_item(
        &self,
        mut items: Vec<Resolved>,
        request_id: Option<&str>,
        started: crate::limiter::Nanos,
        timer: Option<&mut LazyTimer>,
    ) -> Result<CheckResponse, CheckError> {
        let item = &mut items[0];
        let shard = self.sharding().shard(item.route, self.inner.shards.count());
        let fast = item.fast;
        let command = item.command(request_id, 0, true);
        let timeout = self.inner.call_timeout;
        let call = self.inner.shards.apply(shard, vec![command], fast);
        let answer = match timer {
            Some(timer) => {
                timer.restart_at(started);
                timer.bound(call).await
            }
            None => tokio::time::timeout(timeout, call).await.ok(),
        };
        let applied = match answer {
            Some(Ok(mut applied)) => applied.pop(),
            Some(Err(e)) => return Err(e.into()),
            None => return Err(CheckError::Unavailable(no_answer_within(timeout))),
        };
        let mut results = [applied];
        self.settle_unknown(&items, &mut results)?;
        let mut counted = DecisionTally::default();
        let response = self.respond(&mut items, &results, started, &mut counted);
        counted.add_to(&self.inner.metrics.decisions);
        // A denied one-item check consumed nothing: nothing to refund.
        Ok(response)
    }

    /// Settles the `Applied::Unknown` results of one check's items (a check with a request id
    /// that its shard could not decide in time, `Cluster::fallback`): a shadow item's becomes
    /// `on_unavailable`'s denial (a shadow limit never denies the request, and nobody retries
    /// its denial), counted as `deny`; any other makes the whole check unavailable (the
    /// error returned), counted as `unknown`, once per item.
    fn settle_unknown(
        &self,
        items: &[Resolved],
        results: &mut [Option<Applied>],
    ) -> Result<(), CheckError> {
        let mut undecided = false;
        for (item, result) in items.iter().zip(results.iter_mut()) {
            if !matches!(result, Some(Applied::Unknown)) {
                continue;
            }
            let label = if item.shadow {
                *result = Some(Applied::Decided {
                    decision: Decision::unavailable(item.limit.capacity(), false),
                    replayed: false,
                    fallback: Fallback::Unavailable,
                    at: 0,
                    epoch: 0,
                });
                "deny"
            } else {
                undecided = true;
                "unknown"
            };
            let unavailable = &self.inner.metrics.unavailable;
            unavailable.with_label_values(&[label]).inc();
        }
        if undecided {
            Err(CheckError::Unavailable(OUTCOME_UNKNOWN.into()))
        } else {
            Ok(())
        }
    }

    /// Decides resolved checks (each with its request id, or the error that refused it):
    /// one message per shard, then refunds for the checks that were denied in part.
    async fn decide(
        &self,
        checks: Vec<ResolvedCheck>,
        started: crate::limiter::Nanos,
    ) -> Vec<Result<CheckResponse, CheckError>> {
        let mut answers: Vec<Option<Result<CheckResponse, CheckError>>> =
            Vec::with_capacity(checks.len());
        let mut resolved: Vec<Vec<Resolved>> = Vec::with_capacity(checks.len());
        let mut ids: Vec<Option<String>> = Vec::with_capacity(checks.len());
        let mut per_shard: BTreeMap<u32, ShardBatch> = BTreeMap::new();
        for (r, (request_id, check)) in checks.into_iter().enumerate() {
            match check {
                Ok(mut items) => {
                    let single = items.len() == 1;
                    // Not with a request id: a retry may replay admissions of an earlier
                    // attempt (kept for it), which only a refund under the id gives back.
                    let never = request_id.is_none() && resolve::never_passes(&items);
                    for (i, item) in items.iter_mut().enumerate() {
                        let shard = self.sharding().shard(item.route, self.inner.shards.count());
                        let slot = per_shard
                            .entry(shard)
                            .or_insert_with(|| (Vec::new(), Vec::new(), true));
                        slot.2 &= item.fast;
                        slot.0.push((r, i));
                        if never && item.cost <= item.limit.capacity() {
                            // A check that can never pass spends nothing: its items that could
                            // pass are peeked at (cost 0 admits nothing and changes no future
                            // decision), so nothing needs refunding, and no concurrent check
                            // sees a reservation.
                            item.cost = 0;
                        }
                        slot.1.push(item.command(request_id.as_deref(), i, single));
                    }
                    answers.push(None);
                    resolved.push(items);
                }
                Err(e) => {
                    answers.push(Some(Err(e)));
                    resolved.push(Vec::new());
                }
            }
            ids.push(request_id);
        }
        // Every item's result in one vector: check r's items from first[r] on.
        let mut first = Vec::with_capacity(resolved.len());
        let mut total = 0;
        for items in &resolved {
            first.push(total);
            total += items.len();
        }
        let mut results: Vec<Option<Applied>> = vec![None; total];
        let shards = &self.inner.shards;
        let sent = per_shard
            .into_iter()
            .map(|(shard, (slots, commands, fast))| async move {
                (slots, shards.apply(shard, commands, fast).await)
            });
        // One timer bounds the whole fan-out: a shard that does not answer in time makes every
        // request of this call unavailable (an admission it made stays consumed: safe side).
        let timeout = self.inner.call_timeout;
        let outcomes = match tokio::time::timeout(timeout, futures::future::join_all(sent)).await {
            Ok(outcomes) => outcomes,
            Err(_) => {
                let why = no_answer_within(timeout);
                return answers
                    .into_iter()
                    .map(|a| a.unwrap_or_else(|| Err(CheckError::Unavailable(why.clone()))))
                    .collect();
            }
        };
        for (slots, outcome) in outcomes {
            match outcome {
                Ok(applied) => {
                    for ((r, i), a) in slots.into_iter().zip(applied) {
                        results[first[r] + i] = Some(a);
                    }
                }
                Err(e) => {
                    let e = CheckError::from(e);
                    for (r, _) in slots {
                        answers[r] = Some(Err(e.clone()));
                    }
                }
            }
        }
        let mut refunds: BTreeMap<u32, Vec<Command>> = BTreeMap::new();
        let mut counted = DecisionTally::default();
        for (r, items) in resolved.iter_mut().enumerate() {
            let results = &mut results[first[r]..first[r] + items.len()];
            if answers[r].is_none() {
                if let Err(e) = self.settle_unknown(items, results) {
                    answers[r] = Some(Err(e));
                }
            }
            let id = ids[r].as_deref();
            if answers[r].is_some() {
                // Invalid, or a shard failed: refund whatever other shards admitted. Not
                // with a request id: the shards remember each of its admissions under it,
                // and the caller's retry gets them again (a refunded one would then be
                // spent by nobody); the shard that failed may have admitted too.
                if id.is_none() {
                    self.collect_refunds(items, results, None, &mut refunds);
                }
                continue;
            }
            let response = self.respond(items, results, started, &mut counted);
            if !response.allowed {
                self.collect_refunds(items, results, id, &mut refunds);
            }
            answers[r] = Some(Ok(response));
        }
        counted.add_to(&self.inner.metrics.decisions);
        if !refunds.is_empty() {
            self.refund(refunds).await;
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(CheckError::Unavailable("no answer".into()))))
            .collect()
    }

    /// Gives back what the items of denied or failed checks admitted, under one timer. A
    /// refund that fails or times out leaves its admission consumed: the safe side.
    async fn refund(&self, refunds: BTreeMap<u32, Vec<Command>>) {
        let shards = &self.inner.shards;
        let timeout = self.inner.call_timeout;
        let refunds = refunds
            .into_iter()
            .map(|(shard, commands)| shards.apply(shard, commands, true));
        let refunded = match tokio::time::timeout(timeout, futures::future::join_all(refunds)).await
        {
            Ok(done) => done,
            Err(_) => {
                tracing::warn!(
                    ?timeout,
                    "refunds not confirmed in time; those admissions stay consumed"
                );
                Vec::new()
            }
        };
        for failed in refunded.into_iter().filter_map(Result::err) {
            tracing::warn!(error = %failed, "refund not applied");
        }
    }

    /// Builds the response from the items' results (all present), counting and logging.
    /// The items' names and keys move into the response.
    fn respond(
        &self,
        items: &mut [Resolved],
        results: &[Option<Applied>],
        started: crate::limiter::Nanos,
        counted: &mut DecisionTally,
    ) -> CheckResponse {
        let mut out = Vec::with_capacity(items.len());
        let n = items.len();
        for (item, applied) in items.iter_mut().zip(results) {
            let (decision, fallback) = match applied {
                Some(Applied::Decided {
                    decision, fallback, ..
                }) => (*decision, *fallback),
                _ => continue,
            };
            // Only the key table's own rule: `on_unavailable`'s answers while a shard
            // cannot decide are counted in `quorate_unavailable_answers_total`.
            if fallback == Fallback::KeyCap {
                self.inner.metrics.key_cap_rejections.inc();
            }
            let outcome = match (decision.outcome, item.shadow) {
                (Outcome::Allowed, _) => "allowed",
                (_, true) => "shadow_denied",
                (Outcome::Denied, _) => "denied",
                (Outcome::Never, _) => "never",
            };
            counted.count(&item.name, outcome);
            self.log_sampled(item, &decision, outcome, fallback, started);
            out.push(ItemDecision {
                limit: std::mem::take(&mut item.name),
                key: std::mem::take(&mut item.key),
                algorithm: item.limit.algorithm(),
                period_ns: item.period_ns,
                quota: item.limit.quota(),
                decision,
                shadow: item.shadow,
                fallback: fallback.any(),
            });
        }
        let allowed = out.len() == n && out.iter().all(|i| i.shadow || i.decision.allowed());
        CheckResponse {
            allowed,
            items: out,
        }
    }

    /// Refund commands for every item of a failed check that holds an admission: one it
    /// made now, or with a `request_id`, one replayed from the id's first decision (a retry
    /// of a check denied after an earlier attempt failed with admissions kept for the retry;
    /// the shard gives an admission under an id back once, so refunding a replay again is
    /// harmless).
    fn collect_refunds(
        &self,
        items: &[Resolved],
        results: &[Option<Applied>],
        request_id: Option<&str>,
        refunds: &mut BTreeMap<u32, Vec<Command>>,
    ) {
        // A check of one item has nothing to refund: its denial consumed nothing, and a
        // failed shard decided nothing. (Its storage key moved into its command.)
        if items.len() < 2 {
            return;
        }
        for (i, (item, applied)) in items.iter().zip(results).enumerate() {
            // Replayed or not: a replay comes only with a request id, which its refund
            // carries.
            if let Some(Applied::Decided {
                decision,
                fallback: Fallback::No,
                at,
                epoch,
                ..
            }) = applied
            {
                if decision.allowed() && item.cost > 0 {
                    let shard = self.sharding().shard(item.route, self.inner.shards.count());
                    let refund = item.refund(*at, *epoch, request_id, i);
                    refunds.entry(shard).or_default().push(refund);
                }
            }
        }
    }

    /// One log line per sampled decision: key type, algorithm, decision, remaining, latency,
    /// the status the HTTP API answers for it, and whether a rule answered instead of the
    /// algorithm (`fallback`: `key_cap`, the key table's `on_full`; `unavailable`, the
    /// shard's `on_unavailable`; else `no`).
    fn log_sampled(
        &self,
        item: &Resolved,
        d: &crate::limiter::Decision,
        outcome: &str,
        fallback: Fallback,
        started: crate::limiter::Nanos,
    ) {
        let rate = self.inner.config.decision_log_sample;
        if rate <= 0.0 {
            return;
        }
        let n = self.inner.decided.fetch_add(1, Ordering::Relaxed);
        let every = (1.0 / rate.min(1.0)).round().max(1.0) as u64;
        if n % every == 0 {
            tracing::info!(
                limit = %item.name,
                key_type = %item.key_type,
                algorithm = %item.limit.algorithm(),
                decision = outcome,
                remaining = d.remaining,
                retry_after_ms = d.retry_after.div_ceil(1_000_000),
                latency_us = self.inner.clock.monotonic().saturating_sub(started) / 1_000,
                status = if d.allowed() || item.shadow { 200 } else { 429 },
                fallback = fallback.name(),
                "decision"
            );
        }
    }

    /// The policy set in force.
    pub fn policies(&self) -> Arc<PolicySet> {
        self.inner.policies.load_full()
    }

    /// Re-reads the policy file (or the built-in defaults) and swaps it in. Keys keep their
    /// state across a reload (limits whose parameters changed apply the new parameters to
    /// it); an invalid file changes nothing.
    pub fn reload(&self) -> Result<ReloadReport, String> {
        let loaded = match &self.inner.config.policies {
            Some(path) => PolicySet::load(path).map_err(|e| e.to_string()),
            None => Ok(PolicySet::default_policies()),
        };
        let new = match loaded {
            Ok(p) => p,
            Err(e) => {
                self.inner
                    .metrics
                    .reloads
                    .with_label_values(&["error"])
                    .inc();
                tracing::warn!(error = %e, "policy reload refused; keeping the current policies");
                return Err(e);
            }
        };
        let old = self.policies();
        let report = ReloadReport {
            limits: new.limits.len(),
            added: new
                .limits
                .keys()
                .filter(|k| !old.limits.contains_key(*k))
                .cloned()
                .collect(),
            removed: old
                .limits
                .keys()
                .filter(|k| !new.limits.contains_key(*k))
                .cloned()
                .collect(),
            changed: new
                .limits
                .keys()
                .filter(|k| old.limits.contains_key(*k) && old.get(k) != new.get(k))
                .cloned()
                .collect(),
        };
        self.inner.policies.store(Arc::new(new));
        if let Some(cluster) = self.cluster() {
            cluster.policies_changed();
        }
        self.inner.metrics.reloads.with_label_values(&["ok"]).inc();
        tracing::info!(?report, "policies reloaded");
        Ok(report)
    }

    /// Drops, on every shard, the keys whose state is as if never seen. Returns how many.
    pub async fn evict(&self) -> u64 {
        let shards = &self.inner.shards;
        // In a cluster each shard's leader evicts (through its log); followers apply that.
        let mine: Vec<u32> = match shards {
            Backend::Local(s) => (0..s.count()).collect(),
            Backend::Cluster(c) => c.led_shards(),
        };
        let runs = mine
            .into_iter()
            .map(|s| shards.apply(s, vec![Command::Evict], true));
        let all = futures::future::join_all(runs);
        let evicted: u64 = tokio::time::timeout(self.inner.call_timeout * 4, all)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter_map(Result::ok)
            .flatten()
            .map(|a| match a {
                Applied::Evicted(n) => n,
                _ => 0,
            })
            .sum();
        self.inner.metrics.evictions.inc_by(evicted);
        evicted
    }

    /// The node's status, without the shards' state digests ([`Service::status_with`]).
    pub fn status(&self) -> NodeStatus {
        self.status_with(false)
    }

    /// The node's status; with `digests`, a cluster member hashes every shard's applied
    /// state too (under the state's lock, which holds the shard's applies: about 14 ms per
    /// 100,000 keys), for comparing replicas.
    pub fn status_with(&self, digests: bool) -> NodeStatus {
        let (shards, raft) = match &self.inner.shards {
            Backend::Local(s) => (s.status(), None),
            Backend::Cluster(c) => {
                let groups = c.status_with(digests);
                let shards = groups
                    .iter()
                    .map(|g| ShardStatus {
                        shard: g.shard as u32,
                        keys: g.keys,
                        queue_depth: 0,
                        shard_time_ns: g.shard_time_ns,
                        restarts: 0,
                    })
                    .collect();
                (
                    shards,
                    Some(ClusterStatus {
                        node_id: c.node_id(),
                        groups,
                    }),
                )
            }
        };
        let policies = self.policies();
        NodeStatus {
            version: env!("CARGO_PKG_VERSION"),
            keys: shards.iter().map(|s| s.keys).sum(),
            shards,
            max_keys: self.inner.config.max_keys,
            limits: policies.limits.keys().cloned().collect(),
            inline_allowed: policies.inline.allow,
            cluster: raft,
        }
    }

    /// Fills in, on a cluster member's status, the lag of the shards other members lead
    /// (asking their leaders: see `Cluster::fill_lag`).
    pub async fn fill_lag(&self, status: &mut NodeStatus) {
        if let (Backend::Cluster(c), Some(cluster)) = (&self.inner.shards, &mut status.cluster) {
            c.fill_lag(&mut cluster.groups).await;
        }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.config
    }

    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    /// Counts a request that `api` refused as malformed, under `reason` (one of
    /// `metrics::BAD_REQUEST_REASONS`), and says whether to log it: at most
    /// `refusal_log::LINES_PER_SECOND` a second are. `now` is the node's monotonic clock, as
    /// the caller read it for the request.
    pub fn refused(&self, api: &'static str, reason: &'static str, now: Nanos) -> bool {
        debug_assert!(
            crate::metrics::is_bad_request_reason(api, reason),
            "{api} refusal `{reason}` is missing from metrics::BAD_REQUEST_REASONS"
        );
        self.inner
            .metrics
            .bad_requests
            .with_label_values(&[api, reason])
            .inc();
        self.inner.refusals.admit(now)
    }

    /// True once the shards are running and accepting checks.
    /// A cluster member is ready once every shard has a leader it knows of; a node removed
    /// from the cluster is not.
    pub fn ready(&self) -> bool {
        match &self.inner.shards {
            Backend::Local(s) => s.count() > 0,
            Backend::Cluster(c) => c.ready(),
        }
    }

    /// The shards this node can serve no more until it is restarted (a cluster member's
    /// Raft group stopped on an error, such as a failed disk), with the error.
    pub fn failed_shards(&self) -> Vec<(u64, String)> {
        match &self.inner.shards {
            Backend::Local(_) => Vec::new(),
            Backend::Cluster(c) => c.failed_groups(),
        }
    }

    /// Test hook: makes a shard's actor panic (it is restarted on its state).
    #[doc(hidden)]
    pub fn crash_shard(&self, shard: u32) {
        if let Backend::Local(s) = &self.inner.shards {
            s.crash(shard)
        }
    }

    /// Test hook: every shard answers nothing for `d` (a single node's shards only).
    #[doc(hidden)]
    pub fn stall_shards(&self, d: std::time::Duration) {
        if let Backend::Local(s) = &self.inner.shards {
            s.stall(d)
        }
    }

    /// How many shards keys are spread over.
    pub fn shard_count(&self) -> u32 {
        self.inner.shards.count()
    }

    /// Records where the RESP server listens (the node does, once it is bound).
    pub fn set_resp_addr(&self, addr: std::net::SocketAddr) {
        let _ = self.inner.resp_addr.set(addr);
        if let Backend::Cluster(c) = &self.inner.shards {
            c.set_resp_addr(addr);
        }
    }

    /// Where the RESP server listens, once the node has said.
    pub fn resp_addr(&self) -> Option<std::net::SocketAddr> {
        self.inner.resp_addr.get().copied()
    }

    /// How keys are spread over shards.
    pub fn sharding(&self) -> Sharding {
        self.inner.config.sharding
    }

    /// The shard that owns a storage key under `hash` sharding (test and admin use).
    pub fn shard_of(&self, storage_key: &str) -> u32 {
        shard_of(storage_key, self.inner.shards.count())
    }

    /// Stops the shard actors.
    pub async fn shutdown(&self) {
        match &self.inner.shards {
            Backend::Local(s) => s.stop().await,
            Backend::Cluster(c) => c.shutdown().await,
        }
    }

    /// The cluster this node belongs to, if any.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        match &self.inner.shards {
            Backend::Cluster(c) => Some(c),
            Backend::Local(_) => None,
        }
    }
}
