//! Prometheus metrics of a node, rendered at `GET /metrics`.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The `reason`s of `quorate_bad_requests_total`, by `api`: every reason of a 4xx the HTTP
/// API answers (`api/http`), and every reason of a refusal over RESP (`api/resp`). Each of
/// their series is created at 0 with the metrics (see [`Metrics::new`]).
pub const BAD_REQUEST_REASONS: &[(&str, &[&str])] = &[
    (
        "http",
        &[
            "malformed_json",
            "empty_body",
            "missing_field",
            "invalid_field",
            "unknown_field",
            "empty_key",
            "key_too_long",
            "too_many_items",
            "unknown_limit",
            "invalid_input",
            "bad_query",
            "missing_key_header",
            "body_read_failed",
            "bad_content_length",
            "reload_failed",
            "bad_body",
            "membership_change_failed",
            "unauthorized",
            "not_found",
            "method_not_allowed",
            "body_timeout",
            "not_a_cluster",
            "body_too_large",
        ],
    ),
    (
        "resp",
        &[
            "unknown_command",
            "wrong_arity",
            "invalid_argument",
            "unsupported_protocol",
            "protocol",
            "invalid_input",
            "unknown_limit",
        ],
    ),
];

/// Whether `reason` is one of `api`'s in [`BAD_REQUEST_REASONS`].
pub fn is_bad_request_reason(api: &str, reason: &str) -> bool {
    BAD_REQUEST_REASONS
        .iter()
        .any(|(a, reasons)| *a == api && reasons.contains(&reason))
}

/// Every metric the node exports. Cheap to clone (handles share the same series).
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Decisions by policy and outcome (`allowed`, `denied`, `never`, `shadow_denied`).
    pub decisions: IntCounterVec,
    /// Time from receiving a check to its answer, by API (`resp`, `http`).
    pub decision_latency: HistogramVec,
    /// Batches waiting in each shard actor's mailbox.
    pub queue_depth: IntGaugeVec,
    /// Keys held per shard.
    pub keys: IntGaugeVec,
    /// Keys dropped because their state was as if never seen.
    pub evictions: IntCounter,
    /// New keys refused at the key cap (answered by `on_unavailable`).
    pub key_cap_rejections: IntCounter,
    /// Requests refused as malformed, by API and reason (`BAD_REQUEST_REASONS`).
    pub bad_requests: IntCounterVec,
    /// Shard actors restarted after a crash.
    pub shard_restarts: IntCounter,
    /// Open client connections, by API.
    pub connections: IntGaugeVec,
    /// Connections refused at the connection cap, by API.
    pub connections_refused: IntCounterVec,
    /// Policy reloads by result (`ok`, `error`).
    pub reloads: IntCounterVec,
    /// Checks answered by `on_unavailable` because their shard had no leader or quorum, by
    /// answer (`deny`, `allow`, `local`; `unknown`: a check with a request id that `deny`, or
    /// `local` past its share, would deny, answered as unavailable).
    pub unavailable: IntCounterVec,
    /// Checks a cluster member denied from the denials it learned from other nodes'
    /// leaders, without forwarding them.
    pub denials_cached: IntCounter,
    /// Commands (checks, and the refunds and evictions a check may carry) a cluster member
    /// sent to another node's leader, each attempt; a client that sends each key to its
    /// shard's leader keeps it low.
    pub forwarded: IntCounter,
    /// Peer calls that carried forwarded commands: the callers waiting to forward to one
    /// peer at once share a call (`raft/forward.rs`), so under load far fewer than the
    /// checks.
    pub forward_calls: IntCounter,
    /// Commands a shard's leader dropped undecided: their caller's deadline
    /// (`--unavailable-after`, carried by a forward) passed while they waited for its
    /// proposer, and the caller had its `on_unavailable` answer.
    pub checks_expired: IntCounter,
    /// Handovers of a shard's leadership from this member to another (a rebalance, before
    /// its own removal, on SIGTERM), by result (`done`, `failed`).
    pub handovers: IntCounterVec,
    /// Of each handover done: from the leader's asking the target to call its election to
    /// the new leader (the time the shard had no leader able to commit). With the voters'
    /// lease waiver, one election round; without it the target could win only once their
    /// leases lapsed (the maximum election timeout).
    pub handover_gap: Histogram,
    /// Requests from a node removed from a shard that this member refused, by kind (`vote`:
    /// it campaigned; `forward`: a check it forwarded): it still runs, and learns so that it
    /// is out (and asks no more: about once per shard, again after each restart of it).
    pub removed_refusals: IntCounterVec,
    /// Snapshot chunks this follower refused before openraft saw them (the leader then sends
    /// the stream from its start; see `raft::intake`), by why: `gap` (it started past the
    /// bytes received of its stream), `no_stream` (a stream this node is not receiving).
    pub snapshot_chunks_refused: IntCounterVec,
    /// Cluster members only (refreshed every second):
    /// WAL submissions made durable, and the fsyncs that covered them.
    pub wal_appends: IntGauge,
    pub wal_syncs: IntGauge,
    /// Per shard: the Raft term, 1 if this node leads it, the last applied log index, and
    /// the log entries this node proposed as its leader.
    pub raft_term: IntGaugeVec,
    pub raft_leader: IntGaugeVec,
    pub raft_applied: IntGaugeVec,
    pub raft_entries_proposed: IntGaugeVec,
    /// Per shard, leader only: log entries the furthest follower is behind.
    pub raft_follower_lag: IntGaugeVec,
    /// Storage failures: 1 once the member's WAL refused every append after a failed
    /// write, and per shard 1 while its Raft group on this member is stopped by an error.
    pub wal_failed: IntGauge,
    pub raft_group_failed: IntGaugeVec,
    /// Connections to this member's peer server, by how they ended up (see
    /// `peer::PeerStats`), and peer requests answered `Busy` (too many at once on one
    /// connection). Published every second.
    pub peer_connections: IntCounterVec,
    pub peer_busy: IntCounter,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let decision_latency = HistogramVec::new(
            HistogramOpts::new(
                "quorate_decision_latency_seconds",
                "Time from receiving a check to its answer",
            )
            .buckets(vec![
                5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.25,
            ]),
            &["api"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(decision_latency.clone()))
            .expect("unique metric");
        let handover_gap = Histogram::with_opts(
            HistogramOpts::new(
                "quorate_leader_handover_gap_seconds",
                "Handovers done by this member: from asking the new leader to call its election to seeing it lead",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0]),
        )
        .expect("valid metric");
        registry
            .register(Box::new(handover_gap.clone()))
            .expect("unique metric");
        // The counters whose label values are a fixed set have each of their series created
        // at 0 (below), so that `/metrics` exports it from the start: a series that appeared
        // at its first increment would start at 1, and `rate()` or `increase()` over it would
        // miss that first event after a restart (the alert on
        // `quorate_unavailable_answers_total` in docs/operations.md, for one).
        let metrics = Metrics {
            decisions: counter_vec(
                "quorate_decisions_total",
                "Decisions by policy and outcome",
                &["policy", "outcome"],
            ),
            decision_latency,
            queue_depth: gauge_vec(
                "quorate_shard_queue_depth",
                "Batches waiting in a shard actor's mailbox",
                &["shard"],
            ),
            keys: gauge_vec("quorate_keys", "Keys held per shard", &["shard"]),
            evictions: counter(
                "quorate_evictions_total",
                "Keys dropped because their state was as if never seen",
            ),
            key_cap_rejections: counter(
                "quorate_key_cap_rejections_total",
                "New keys refused at the key cap",
            ),
            bad_requests: counter_vec(
                "quorate_bad_requests_total",
                "Requests refused as malformed",
                &["api", "reason"],
            ),
            shard_restarts: counter(
                "quorate_shard_restarts_total",
                "Shard actors restarted after a crash",
            ),
            connections: gauge_vec("quorate_connections", "Open client connections", &["api"]),
            connections_refused: counter_vec(
                "quorate_connections_refused_total",
                "Connections refused at the connection cap",
                &["api"],
            ),
            reloads: counter_vec(
                "quorate_policy_reloads_total",
                "Policy reloads by result",
                &["result"],
            ),
            unavailable: counter_vec(
                "quorate_unavailable_answers_total",
                "Checks a shard could not decide in time (no leader or no quorum), by answer (deny, allow, local; unknown: with a request id, answered as unavailable)",
                &["answer"],
            ),
            denials_cached: counter(
                "quorate_denials_cached_total",
                "Checks denied from denials learned from other nodes' leaders, not forwarded",
            ),
            forwarded: counter(
                "quorate_forwarded_checks_total",
                "Commands (checks, refunds, evictions) sent to another node's leader, each attempt",
            ),
            forward_calls: counter(
                "quorate_forward_calls_total",
                "Peer calls that carried forwarded commands (the callers waiting at once share one)",
            ),
            checks_expired: counter(
                "quorate_checks_expired_total",
                "Commands a shard's leader dropped undecided: their caller's deadline passed while they waited for its proposer",
            ),
            handovers: counter_vec(
                "quorate_leader_handovers_total",
                "Handovers of a shard's leadership from this member to another (rebalance, before its removal, on SIGTERM), by result (done, failed)",
                &["result"],
            ),
            handover_gap,
            removed_refusals: counter_vec(
                "quorate_removed_node_refusals_total",
                "Requests from a node removed from a shard, refused (it still runs), by kind (vote, forward)",
                &["kind"],
            ),
            snapshot_chunks_refused: counter_vec(
                "quorate_snapshot_chunks_refused_total",
                "Snapshot chunks refused before openraft saw them, by why (gap: past the bytes received of their stream; no_stream: of a stream this node is not receiving); the leader sends the stream again from its start",
                &["why"],
            ),
            wal_appends: gauge(
                "quorate_wal_appends",
                "Write-ahead log submissions made durable since start",
            ),
            wal_syncs: gauge(
                "quorate_wal_syncs",
                "fdatasync calls of the write-ahead log since start (group commit: far fewer than appends)",
            ),
            raft_term: gauge_vec("quorate_raft_term", "Raft term per shard", &["shard"]),
            raft_leader: gauge_vec(
                "quorate_raft_is_leader",
                "1 if this node leads the shard's Raft group",
                &["shard"],
            ),
            raft_applied: gauge_vec(
                "quorate_raft_applied_index",
                "Last log index applied to the shard's state",
                &["shard"],
            ),
            raft_entries_proposed: gauge_vec(
                "quorate_raft_entries_proposed",
                "Log entries (decision batches) this node proposed as the shard's leader since start",
                &["shard"],
            ),
            raft_follower_lag: gauge_vec(
                "quorate_raft_follower_lag_entries",
                "Leader only: entries the furthest follower is behind",
                &["shard"],
            ),
            wal_failed: gauge(
                "quorate_wal_failed",
                "1 once this member's write-ahead log refused every append after a failed write (a failed disk: restart the member on a working one)",
            ),
            raft_group_failed: gauge_vec(
                "quorate_raft_group_failed",
                "1 while the shard's Raft group on this member is stopped by an error (a storage failure)",
                &["shard"],
            ),
            peer_connections: counter_vec(
                "quorate_peer_connections_total",
                "Connections to this member's peer port by result: authenticated, handshake_failed (wrong secret, unknown or own id, garbage, timeout), refused_per_address, refused_max_connections, protocol_error (closed after the handshake)",
                &["result"],
            ),
            peer_busy: counter(
                "quorate_peer_requests_busy_total",
                "Peer requests answered Busy: too many at once on one connection",
            ),
            registry,
        };
        for (api, reasons) in BAD_REQUEST_REASONS {
            for reason in *reasons {
                metrics.bad_requests.with_label_values(&[api, reason]);
            }
        }
        let zero = |counter: &IntCounterVec, values: &[&str]| {
            for value in values {
                counter.with_label_values(&[value]);
            }
        };
        zero(&metrics.unavailable, &["deny", "allow", "local", "unknown"]);
        zero(&metrics.connections_refused, &["resp", "http"]);
        zero(&metrics.removed_refusals, &["vote", "forward"]);
        zero(&metrics.snapshot_chunks_refused, &["gap", "no_stream"]);
        metrics
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
