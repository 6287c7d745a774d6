//! A node's configuration: addresses, bounds on every queue and input, and intervals.
//! Every bound here exists so that hostile or accidental input cannot exhaust the node.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Where the HTTP/JSON API listens.
    pub http_addr: SocketAddr,
    /// Where the RESP (Redis protocol) API listens.
    pub resp_addr: SocketAddr,
    /// The node's data directory (state persistence arrives with the cluster).
    pub data_dir: Option<PathBuf>,
    /// The policy file; `None` uses the built-in default policies.
    pub policies: Option<PathBuf>,
    /// Number of shards keys are spread over (jump consistent hash).
    pub shards: u32,
    /// Most keys the node holds across all limits; at the cap, new keys get their
    /// limit's `on_unavailable` answer and existing keys keep working.
    pub max_keys: u64,
    /// Longest key accepted, in bytes.
    pub max_key_len: usize,
    /// Most limits one check may name.
    pub max_items: usize,
    /// Largest HTTP body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// Largest RESP frame (bulk string or array length) accepted.
    pub max_frame_bytes: usize,
    /// Most concurrent client connections (RESP and HTTP each).
    pub max_connections: usize,
    /// Idle client connections are closed after this long.
    pub idle_timeout: Duration,
    /// How long a request id is remembered for idempotent retries.
    pub idempotency_horizon: Duration,
    /// How often each shard drops keys whose state is as if never seen.
    pub eviction_interval: Duration,
    /// Fraction of decisions logged (0.0 ..= 1.0).
    pub decision_log_sample: f64,
    /// How long a check may wait for its shard before the node answers unavailable.
    pub shard_timeout: Duration,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            http_addr: "127.0.0.1:8080".parse().expect("literal"),
            resp_addr: "127.0.0.1:6380".parse().expect("literal"),
            data_dir: None,
            policies: None,
            shards: 16,
            max_keys: 10_000_000,
            max_key_len: 512,
            max_items: 16,
            max_body_bytes: 64 * 1024,
            max_frame_bytes: 64 * 1024,
            max_connections: 10_000,
            idle_timeout: Duration::from_secs(300),
            idempotency_horizon: Duration::from_secs(60),
            eviction_interval: Duration::from_secs(1),
            decision_log_sample: 0.0,
            shard_timeout: Duration::from_millis(500),
        }
    }
}
