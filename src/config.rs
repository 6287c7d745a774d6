//! A node's configuration: addresses, bounds on every queue and input, and intervals.
//! Every bound here exists so that hostile or accidental input cannot exhaust the node.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Where the HTTP/JSON API listens.
    pub http_addr: SocketAddr,
    /// Where the RESP (Redis protocol) API listens.
    pub resp_addr: SocketAddr,
    /// A cluster member's data directory (its Raft log, snapshots and identity records).
    pub data_dir: Option<PathBuf>,
    /// The policy file; `None` uses the built-in default policies.
    pub policies: Option<PathBuf>,
    /// Number of shards keys are spread over.
    pub shards: u32,
    /// How keys are spread over the shards (see [`crate::shard::route`]).
    pub sharding: crate::shard::route::Sharding,
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
    /// Cluster membership; `None` runs a single node that keeps state in memory.
    pub cluster: Option<ClusterSettings>,
    /// The token the admin API's changes (`POST /v1/admin/reload`, `POST
    /// /v1/admin/members`) need as `Authorization: Bearer <token>`; `None` leaves them open.
    pub admin_token: Option<String>,
}

/// How this node takes part in a cluster.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub node_id: u64,
    /// Every member's id and peer address, this node included.
    pub members: BTreeMap<u64, String>,
    /// Where this node accepts peer connections.
    pub peer_addr: SocketAddr,
    /// The shared secret peers prove in the handshake.
    pub secret: String,
    /// `false` is UNSAFE (acknowledged decisions can be lost on a crash): the negative
    /// control of the durability tests.
    pub wal_sync: bool,
    /// Appends to the write-ahead log with O_DIRECT where the file system takes it.
    pub wal_direct_io: bool,
    /// Tests only: the write-ahead log stalls while this file exists.
    pub wal_hold_while: Option<PathBuf>,
    /// Tests only: peer requests of these variant indexes are refused unread, as a member
    /// of an older build refuses them (`Cluster::handle`).
    pub refuse_requests: Vec<u8>,
    pub heartbeat: Duration,
    pub election_timeout: Duration,
    /// Longest wait for a shard's leader before `on_unavailable` answers.
    pub unavailable_after: Duration,
    /// Longest wait for an entry to commit (and for a forwarded batch, at most: a forward
    /// carries its sender's deadline, `unavailable_after`, and a leader decides none of it
    /// later).
    pub write_timeout: Duration,
    /// Most commands per log entry.
    pub batch_max: usize,
    /// Longest a leader holds a strict entry for the callers its last one answered.
    pub batch_linger: Duration,
    /// Least time between a shard leader's entries while all their callers are `fast`
    /// (answered already): fewer, larger entries for fast load.
    pub fast_linger: Duration,
    /// A fast-only entry is proposed at once when it holds this many commands.
    pub fast_batch: usize,
    /// A shard's snapshot is taken after this many log entries since the last.
    pub snapshot_every: u64,
    /// ... or after this many bytes of log entries since the last, whichever comes first.
    pub snapshot_log_bytes: u64,
    /// Most entries a shard's leader has proposed and not yet seen committed.
    pub pipeline: usize,
    /// Most leaders' denials this node keeps and gives again without forwarding (0: none).
    pub denial_cache: usize,
    /// Joining an existing cluster: do not bootstrap the groups; wait to be added through
    /// the admin API of a member.
    pub join: bool,
    /// The simulation's observers and negative-control switches; unset in production.
    pub hooks: crate::raft::hooks::Hooks,
}

/// Reads a duration setting: (name, value, default) -> the duration or what to fix.
type DurationParser = dyn Fn(&str, &Option<String>, Duration) -> Result<Duration, String>;

/// True for `HOST:PORT` with a non-empty host and a port 1-65535.
pub fn is_host_port(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
}

/// Parses `1=host:port,2=host:port,...`.
pub fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut members = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('=').ok_or_else(|| {
            format!("`peers`: \"{part}\" is not ID=HOST:PORT; write e.g. \"1=10.0.0.1:7100,2=10.0.0.2:7100\"")
        })?;
        let id: u64 = id
            .trim()
            .parse()
            .ok()
            .filter(|&i| i > 0)
            .ok_or_else(|| format!("`peers`: node id \"{id}\" must be a positive integer"))?;
        let addr = addr.trim();
        if !is_host_port(addr) {
            return Err(format!(
                "`peers`: address \"{addr}\" of node {id} is not HOST:PORT (e.g. 10.0.0.1:7100 or quorate-1:7100)"
            ));
        }
        if members.insert(id, addr.trim().to_string()).is_some() {
            return Err(format!("`peers`: node id {id} appears twice"));
        }
    }
    Ok(members)
}

/// The member of `members` this host is, by name: the one whose address's host, or that
/// host's first DNS label, is `hostname` ("quorate-0" is "quorate-0.quorate:7100"). Lets a
/// StatefulSet's pods share one configuration without a per-pod `id`.
pub fn member_for_host(members: &BTreeMap<u64, String>, hostname: &str) -> Option<u64> {
    let hostname = hostname.trim();
    if hostname.is_empty() {
        return None;
    }
    let mut found = members.iter().filter(|(_, addr)| {
        let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
        host == hostname || host.split('.').next() == Some(hostname)
    });
    match (found.next(), found.next()) {
        (Some((id, _)), None) => Some(*id),
        _ => None,
    }
}

/// A cluster member's shard count when none is given: one Raft group per member of a
/// 3-node cluster. Every entry costs each member a WAL append, a share of an fsync and the
/// replication messages whatever it carries, so few groups with full entries beat many with
/// thin ones when members have few cores: on 2 shared cores, 3 groups took half the CPU per
/// decision of 16 and reached Redis at `-P 16` (docs/benchmarks.md). A single node keeps 16:
/// its shards are actors only, with no per-entry cost.
pub const CLUSTER_SHARDS: u32 = 3;

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            http_addr: "127.0.0.1:8080".parse().expect("literal"),
            resp_addr: "127.0.0.1:6380".parse().expect("literal"),
            data_dir: None,
            policies: None,
            shards: 16,
            sharding: crate::shard::route::Sharding::Hash,
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
            cluster: None,
            admin_token: None,
        }
    }
}

/// The node's settings as the CLI and a config file give them: every field optional, so a
/// flag (or its environment variable) wins over the config file, which wins over the
/// defaults. The same struct is the clap arguments and the config file's schema.
#[derive(Debug, Clone, Default, clap::Args, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeOptions {
    /// Address of the HTTP/JSON API [default: 127.0.0.1:8080].
    #[arg(long, env = "QUORATE_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// Address of the RESP (Redis protocol) API [default: 127.0.0.1:6380].
    #[arg(long, env = "QUORATE_RESP_ADDR")]
    pub resp_addr: Option<SocketAddr>,
    /// Data directory: a cluster member's Raft log, snapshots and identity records (needed
    /// with --peers; created if missing). A single node keeps its state in memory.
    #[arg(long, env = "QUORATE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Policy file [default: ./quorate.toml if present, else the built-in defaults].
    #[arg(long, env = "QUORATE_POLICIES")]
    pub policies: Option<PathBuf>,
    /// Number of shards; a cluster member's are its Raft groups, and every member of a
    /// cluster needs the same count [default: 16 for a single node, 3 for a cluster member].
    #[arg(long, env = "QUORATE_SHARDS")]
    pub shards: Option<u32>,
    /// How keys are spread over shards: "hash" (each limit's keys spread on their own), or
    /// "slots" (Redis Cluster's hash slots, so Redis Cluster clients and
    /// `redis-benchmark --cluster` send each key to its leader). Chosen when a cluster is
    /// created; every member needs the same [default: hash].
    #[arg(long, env = "QUORATE_SHARDING")]
    pub sharding: Option<String>,
    /// Most keys held by the node; new keys beyond get their limit's on_unavailable answer
    /// [default: 10000000].
    #[arg(long, env = "QUORATE_MAX_KEYS")]
    pub max_keys: Option<u64>,
    /// Longest key, in bytes [default: 512].
    #[arg(long, env = "QUORATE_MAX_KEY_LEN")]
    pub max_key_len: Option<usize>,
    /// Most limits one check may name [default: 16].
    #[arg(long, env = "QUORATE_MAX_ITEMS")]
    pub max_items: Option<usize>,
    /// Largest HTTP body, in bytes; larger gets 413 [default: 65536].
    #[arg(long, env = "QUORATE_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Largest RESP bulk string or inline command, in bytes [default: 65536].
    #[arg(long, env = "QUORATE_MAX_FRAME_BYTES")]
    pub max_frame_bytes: Option<usize>,
    /// Most concurrent connections per API [default: 10000].
    #[arg(long, env = "QUORATE_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Idle connections close after this long, e.g. "300s" [default: 300s].
    #[arg(long, env = "QUORATE_IDLE_TIMEOUT")]
    pub idle_timeout: Option<String>,
    /// How long a request id is remembered for idempotent retries [default: 60s].
    #[arg(long, env = "QUORATE_IDEMPOTENCY_HORIZON")]
    pub idempotency_horizon: Option<String>,
    /// How often keys as if never seen are dropped [default: 1s].
    #[arg(long, env = "QUORATE_EVICTION_INTERVAL")]
    pub eviction_interval: Option<String>,
    /// Longest wait for a shard before answering unavailable [default: 500ms].
    #[arg(long, env = "QUORATE_SHARD_TIMEOUT")]
    pub shard_timeout: Option<String>,
    /// Fraction of decisions logged, 0.0 to 1.0 [default: 0].
    #[arg(long, env = "QUORATE_LOG_SAMPLE")]
    pub log_sample: Option<f64>,
    /// A token (at least 16 visible ASCII characters) that the admin API's changes, POST /v1/admin/reload
    /// and POST /v1/admin/members, must carry as `Authorization: Bearer <token>`; without
    /// it they are open to anyone who reaches the HTTP port [default: none].
    #[arg(long, env = "QUORATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// This node's id in the cluster (a member of --peers). Without --peers the node runs
    /// alone, in memory.
    #[arg(long, env = "QUORATE_ID")]
    pub id: Option<u64>,
    /// Every member's id and peer address, e.g. "1=10.0.0.1:7100,2=10.0.0.2:7100,3=10.0.0.3:7100".
    #[arg(long, env = "QUORATE_PEERS")]
    pub peers: Option<String>,
    /// Where this node listens for peers [default: its own address in --peers].
    #[arg(long, env = "QUORATE_PEER_ADDR")]
    pub peer_addr: Option<SocketAddr>,
    /// The cluster secret peers prove to each other (at least 16 characters; the same on
    /// every member). Prefer the environment variable to the flag.
    #[arg(long, env = "QUORATE_CLUSTER_SECRET", hide_env_values = true)]
    pub cluster_secret: Option<String>,
    /// Raft heartbeat interval [default: 100ms].
    #[arg(long, env = "QUORATE_HEARTBEAT")]
    pub heartbeat: Option<String>,
    /// Raft election timeout (randomised between it and twice it) [default: 400ms].
    #[arg(long, env = "QUORATE_ELECTION_TIMEOUT")]
    pub election_timeout: Option<String>,
    /// Longest a check waits for its shard (a leader, the commit, a forwarded answer) before
    /// the policy's on_unavailable answers [default: 500ms].
    #[arg(long, env = "QUORATE_UNAVAILABLE_AFTER")]
    pub unavailable_after: Option<String>,
    /// Longest a leader waits for an entry's commit; a membership change's step sent to
    /// another member's leader waits ten times this [default: 2s].
    #[arg(long, env = "QUORATE_WRITE_TIMEOUT")]
    pub write_timeout: Option<String>,
    /// Most decisions in one Raft log entry [default: 1024].
    #[arg(long, env = "QUORATE_BATCH_MAX")]
    pub batch_max: Option<usize>,
    /// Under load, how long a shard's leader may hold a strict entry (nothing in flight)
    /// for as many callers as its last entry held, so that the callers its last commit
    /// answered join it; rounded up to the runtime timer's millisecond tick; 0 proposes at
    /// once [default: 2ms].
    #[arg(long, env = "QUORATE_BATCH_LINGER")]
    pub batch_linger: Option<String>,
    /// Least time between a shard leader's log entries while every caller in the next one
    /// is a `fast` check (answered at once from the leader's state, so none waits for it):
    /// fewer, larger entries, less CPU per decision, and a replication lag up to this long.
    /// A strict caller ends the wait; at most half the lease (so 40% of the election
    /// timeout) is used; 0 proposes as soon as the pipeline has room [default: 20ms].
    #[arg(long, env = "QUORATE_FAST_LINGER")]
    pub fast_linger: Option<String>,
    /// A fast-only entry held by `fast_linger` is proposed at once when it holds this many
    /// decisions (at most `batch_max`) [default: 512].
    #[arg(long, env = "QUORATE_FAST_BATCH")]
    pub fast_batch: Option<usize>,
    /// Entries a shard's leader may have in flight (proposed, not yet committed); while they
    /// are, new checks wait and join the next entry [default: 1].
    #[arg(long, env = "QUORATE_PIPELINE")]
    pub pipeline: Option<usize>,
    /// Denials from other nodes' leaders this node keeps, to deny the same check again
    /// itself until four fifths of its retry-after have passed; 0 turns it off
    /// [default: 100000].
    #[arg(long, env = "QUORATE_DENIAL_CACHE")]
    pub denial_cache: Option<usize>,
    /// Log entries between a shard's snapshots [default: 20000].
    #[arg(long, env = "QUORATE_SNAPSHOT_EVERY")]
    pub snapshot_every: Option<u64>,
    /// Bytes of log entries (as written to the log) after which a shard takes a snapshot,
    /// whatever their count: what bounds the log's memory and disk when entries are large
    /// (fast load puts hundreds of checks in one) [default: 16777216, 16 MiB].
    #[arg(long, env = "QUORATE_SNAPSHOT_LOG_BYTES")]
    pub snapshot_log_bytes: Option<u64>,
    /// Write the write-ahead log with O_DIRECT (then fdatasync, as without it): less CPU per
    /// durable append on Linux. Where the file system refuses O_DIRECT the log falls back to
    /// the page cache by itself; `false` always uses the page cache [default: true].
    #[arg(long, env = "QUORATE_WAL_DIRECT_IO", num_args = 0..=1, default_missing_value = "true")]
    pub wal_direct_io: Option<bool>,
    /// Join a running cluster instead of bootstrapping one: start with an empty data dir,
    /// then add this node with `POST /v1/admin/members` on any member.
    #[arg(long, env = "QUORATE_JOIN", num_args = 0..=1, default_missing_value = "true")]
    pub join: Option<bool>,
    /// TEST ONLY, UNSAFE: skip fsync of the write-ahead log (acknowledged decisions can be
    /// lost on a crash). The durability tests' negative control.
    #[arg(long, env = "QUORATE_UNSAFE_NO_FSYNC", hide = true)]
    pub unsafe_no_fsync: Option<bool>,
    /// TEST ONLY: while this file exists the write-ahead log writes and syncs nothing (a
    /// stalled disk), so a test can see what a node answers before its appends are durable;
    /// a file that reads `fail` fails the writes instead (a failed disk).
    /// A flag only: no environment variable, and a config file that names it is refused.
    #[arg(long, value_name = "FILE", hide = true)]
    #[serde(skip)]
    pub test_hold_wal_while: Option<PathBuf>,
    /// TEST ONLY: refuse, unread, the peer requests of these variant indexes
    /// (comma-separated; 7 is a forward with its deadline, 8 forwards in a batch, 9 a
    /// status's question for the lag), as a
    /// member of a build from before them refuses what it cannot read: so a test can see
    /// its peers fall back to the requests it reads. A flag only, like the one above.
    #[arg(long, value_name = "INDEXES", hide = true)]
    #[serde(skip)]
    pub test_refuse_peer_requests: Option<String>,
}

/// The variant indexes `--test-refuse-peer-requests` names: only those a build could be
/// from before (`ForwardWithin` 7, `ForwardMany` 8, `Lag` 9), so the flag cannot stop a
/// cluster.
fn refused_requests(flag: Option<&str>) -> Result<Vec<u8>, String> {
    let Some(flag) = flag else {
        return Ok(Vec::new());
    };
    flag.split(',')
        .map(|v| match v.trim().parse::<u8>() {
            Ok(i @ (7..=9)) => Ok(i),
            _ => Err(format!(
                "`--test-refuse-peer-requests` takes 7, 8 and 9, comma-separated; not {v:?}"
            )),
        })
        .collect()
}

/// The longest duration any setting takes: beyond it a timer or deadline could overflow (a
/// heartbeat of 2^64 s doubled, an `Instant` pushed past its range), and no timeout of a rate
/// limiter needs more.
pub const MAX_SETTING_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The most shards a node takes (each an actor; in a cluster, each a Raft group).
pub const MAX_SHARDS: u32 = 4096;

/// The duration setting `name` (`v`, or `default`) as `duration` parses it, unless it is
/// zero: a zero timeout would make the node unusable.
fn nonzero(
    duration: &DurationParser,
    name: &str,
    v: &Option<String>,
    default: Duration,
) -> Result<Duration, String> {
    match duration(name, v, default)? {
        d if d.is_zero() => Err(format!(
            "`{name}` must be above zero; write e.g. \"500ms\", \"30s\""
        )),
        d => Ok(d),
    }
}

impl NodeOptions {
    /// Reads a config file (TOML, the same keys as the flags with underscores).
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        Self::from_toml(&text).map_err(|e| format!("config file {}: {e}", path.display()))
    }

    /// Parses a config file's text (unknown keys are refused).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// `self` where set, else `fallback`.
    pub fn or(self, fallback: NodeOptions) -> NodeOptions {
        NodeOptions {
            http_addr: self.http_addr.or(fallback.http_addr),
            resp_addr: self.resp_addr.or(fallback.resp_addr),
            data_dir: self.data_dir.or(fallback.data_dir),
            policies: self.policies.or(fallback.policies),
            shards: self.shards.or(fallback.shards),
            sharding: self.sharding.or(fallback.sharding),
            max_keys: self.max_keys.or(fallback.max_keys),
            max_key_len: self.max_key_len.or(fallback.max_key_len),
            max_items: self.max_items.or(fallback.max_items),
            max_body_bytes: self.max_body_bytes.or(fallback.max_body_bytes),
            max_frame_bytes: self.max_frame_bytes.or(fallback.max_frame_bytes),
            max_connections: self.max_connections.or(fallback.max_connections),
            idle_timeout: self.idle_timeout.or(fallback.idle_timeout),
            idempotency_horizon: self.idempotency_horizon.or(fallback.idempotency_horizon),
            eviction_interval: self.eviction_interval.or(fallback.eviction_interval),
            shard_timeout: self.shard_timeout.or(fallback.shard_timeout),
            admin_token: self.admin_token.or(fallback.admin_token),
            log_sample: self.log_sample.or(fallback.log_sample),
            id: self.id.or(fallback.id),
            peers: self.peers.or(fallback.peers),
            peer_addr: self.peer_addr.or(fallback.peer_addr),
            cluster_secret: self.cluster_secret.or(fallback.cluster_secret),
            heartbeat: self.heartbeat.or(fallback.heartbeat),
            election_timeout: self.election_timeout.or(fallback.election_timeout),
            unavailable_after: self.unavailable_after.or(fallback.unavailable_after),
            write_timeout: self.write_timeout.or(fallback.write_timeout),
            batch_max: self.batch_max.or(fallback.batch_max),
            batch_linger: self.batch_linger.or(fallback.batch_linger),
            fast_linger: self.fast_linger.or(fallback.fast_linger),
            fast_batch: self.fast_batch.or(fallback.fast_batch),
            unsafe_no_fsync: self.unsafe_no_fsync.or(fallback.unsafe_no_fsync),
            test_hold_wal_while: self.test_hold_wal_while.or(fallback.test_hold_wal_while),
            test_refuse_peer_requests: self
                .test_refuse_peer_requests
                .or(fallback.test_refuse_peer_requests),
            wal_direct_io: self.wal_direct_io.or(fallback.wal_direct_io),
            join: self.join.or(fallback.join),
            snapshot_every: self.snapshot_every.or(fallback.snapshot_every),
            snapshot_log_bytes: self.snapshot_log_bytes.or(fallback.snapshot_log_bytes),
            pipeline: self.pipeline.or(fallback.pipeline),
            denial_cache: self.denial_cache.or(fallback.denial_cache),
        }
    }

    /// The settings given that only a cluster member reads, when no `peers` are: a single
    /// node ignores them, and keeps its state in memory whatever `data_dir` says. The node
    /// logs them at start (the container image sets `data_dir` for a member's sake, so they
    /// are not refused).
    pub fn ignored_without_peers(&self) -> Vec<&'static str> {
        if self.peers.is_some() {
            return Vec::new();
        }
        let set = [
            ("data_dir", self.data_dir.is_some()),
            ("heartbeat", self.heartbeat.is_some()),
            ("election_timeout", self.election_timeout.is_some()),
            ("unavailable_after", self.unavailable_after.is_some()),
            ("write_timeout", self.write_timeout.is_some()),
            ("batch_max", self.batch_max.is_some()),
            ("batch_linger", self.batch_linger.is_some()),
            ("fast_linger", self.fast_linger.is_some()),
            ("fast_batch", self.fast_batch.is_some()),
            ("pipeline", self.pipeline.is_some()),
            ("denial_cache", self.denial_cache.is_some()),
            ("snapshot_every", self.snapshot_every.is_some()),
            ("snapshot_log_bytes", self.snapshot_log_bytes.is_some()),
            ("wal_direct_io", self.wal_direct_io.is_some()),
            ("join", self.join.is_some()),
            ("unsafe_no_fsync", self.unsafe_no_fsync.is_some()),
        ];
        set.into_iter()
            .filter(|(_, s)| *s)
            .map(|(n, _)| n)
            .collect()
    }

    fn cluster_settings(
        &self,
        duration: &DurationParser,
    ) -> Result<Option<ClusterSettings>, String> {
        let Some(peers) = &self.peers else {
            if self.id.is_some() || self.peer_addr.is_some() {
                return Err("`id` and `peer_addr` need `peers` (--peers 1=HOST:PORT,...)".into());
            }
            return Ok(None);
        };
        let members = parse_peers(peers)?;
        let node_id = self.id.ok_or(
            "a cluster member needs `id` (--id N, one of the ids in --peers), or a hostname \
             that names exactly one of the hosts in --peers",
        )?;
        let own = members.get(&node_id).ok_or_else(|| {
            format!(
                "`id` {node_id} is not in `peers` (ids there: {:?})",
                members.keys().collect::<Vec<_>>()
            )
        })?;
        let peer_addr = match self.peer_addr {
            Some(a) => a,
            None => own.parse().map_err(|_| {
                format!("node {node_id}'s peer address \"{own}\" is a name, not IP:PORT: give --peer-addr (QUORATE_PEER_ADDR) to listen on, e.g. 0.0.0.0:7100")
            })?,
        };
        let secret = self.cluster_secret.clone().ok_or(
            "a cluster member needs `cluster_secret` (QUORATE_CLUSTER_SECRET), the same on every member",
        )?;
        if secret.len() < 16 {
            return Err("`cluster_secret` must be at least 16 characters".into());
        }
        let election_timeout = duration(
            "election_timeout",
            &self.election_timeout,
            Duration::from_millis(400),
        )?;
        let heartbeat = duration("heartbeat", &self.heartbeat, Duration::from_millis(100))?;
        if heartbeat * 2 > election_timeout {
            return Err(format!(
                "`heartbeat` ({heartbeat:?}) must be at most half of `election_timeout` ({election_timeout:?})"
            ));
        }
        Ok(Some(ClusterSettings {
            node_id,
            members,
            peer_addr,
            secret,
            wal_sync: !self.unsafe_no_fsync.unwrap_or(false),
            wal_direct_io: self.wal_direct_io.unwrap_or(true),
            wal_hold_while: self.test_hold_wal_while.clone(),
            refuse_requests: refused_requests(self.test_refuse_peer_requests.as_deref())?,
            heartbeat,
            election_timeout,
            unavailable_after: nonzero(
                duration,
                "unavailable_after",
                &self.unavailable_after,
                Duration::from_millis(500),
            )?,
            write_timeout: nonzero(
                duration,
                "write_timeout",
                &self.write_timeout,
                Duration::from_secs(2),
            )?,
            batch_max: self.batch_max.unwrap_or(1024).max(1),
            batch_linger: duration("batch_linger", &self.batch_linger, Duration::from_millis(2))?,
            fast_linger: duration("fast_linger", &self.fast_linger, Duration::from_millis(20))?,
            fast_batch: self.fast_batch.unwrap_or(512).max(1),
            join: self.join.unwrap_or(false),
            pipeline: self.pipeline.unwrap_or(1).max(1),
            denial_cache: self.denial_cache.unwrap_or(100_000),
            snapshot_every: match self.snapshot_every.unwrap_or(20_000) {
                0 => return Err("`snapshot_every` must be at least 1".into()),
                n => n,
            },
            snapshot_log_bytes: match self.snapshot_log_bytes.unwrap_or(16 << 20) {
                0 => return Err("`snapshot_log_bytes` must be at least 1".into()),
                n => n,
            },
            hooks: Default::default(),
        }))
    }

    /// The node configuration these options describe, or what is wrong and how to fix it.
    pub fn to_config(&self) -> Result<NodeConfig, String> {
        let d = NodeConfig::default();
        let duration = |name: &str, v: &Option<String>, default: Duration| match v {
            None => Ok(default),
            Some(text) => match humantime::parse_duration(text) {
                Ok(d) if d > MAX_SETTING_DURATION => Err(format!(
                    "`{name}` = \"{text}\" is too long: at most {}",
                    humantime::format_duration(MAX_SETTING_DURATION)
                )),
                Ok(d) => Ok(d),
                Err(e) => Err(format!(
                    "`{name}` = \"{text}\" is not a duration ({e}); write e.g. \"500ms\", \"30s\""
                )),
            },
        };
        let positive = |name: &str, v: u64| {
            if v == 0 {
                Err(format!("`{name}` must be at least 1"))
            } else {
                Ok(v)
            }
        };
        let log_sample = self.log_sample.unwrap_or(d.decision_log_sample);
        if !(0.0..=1.0).contains(&log_sample) {
            return Err(format!(
                "`log_sample` = {log_sample} must be between 0.0 and 1.0"
            ));
        }
        let cluster = self.cluster_settings(&duration)?;
        if cluster.is_some() && self.data_dir.is_none() {
            return Err("a cluster member needs `data_dir` (--data-dir): its Raft log and snapshots live there".into());
        }
        let default_shards = match cluster {
            Some(_) => CLUSTER_SHARDS,
            None => d.shards,
        };
        if let Some(token) = &self.admin_token {
            check_admin_token(token)?;
        }
        Ok(NodeConfig {
            cluster,
            admin_token: self.admin_token.clone(),
            http_addr: self.http_addr.unwrap_or(d.http_addr),
            resp_addr: self.resp_addr.unwrap_or(d.resp_addr),
            data_dir: self.data_dir.clone(),
            policies: self.policies.clone(),
            shards: match positive("shards", self.shards.unwrap_or(default_shards) as u64)? {
                n if n > MAX_SHARDS as u64 => {
                    return Err(format!("`shards` = {n} is too many: at most {MAX_SHARDS}"))
                }
                n => n as u32,
            },
            sharding: match &self.sharding {
                None => d.sharding,
                Some(text) => crate::shard::route::Sharding::parse(text).ok_or_else(|| {
                    format!("`sharding` = \"{text}\" is neither \"hash\" nor \"slots\"")
                })?,
            },
            max_keys: positive("max_keys", self.max_keys.unwrap_or(d.max_keys))?,
            max_key_len: positive(
                "max_key_len",
                self.max_key_len.unwrap_or(d.max_key_len) as u64,
            )? as usize,
            max_items: positive("max_items", self.max_items.unwrap_or(d.max_items) as u64)?
                as usize,
            max_body_bytes: positive(
                "max_body_bytes",
                self.max_body_bytes.unwrap_or(d.max_body_bytes) as u64,
            )? as usize,
            max_frame_bytes: positive(
                "max_frame_bytes",
                self.max_frame_bytes.unwrap_or(d.max_frame_bytes) as u64,
            )? as usize,
            max_connections: positive(
                "max_connections",
                self.max_connections.unwrap_or(d.max_connections) as u64,
            )? as usize,
            idle_timeout: nonzero(
                &duration,
                "idle_timeout",
                &self.idle_timeout,
                d.idle_timeout,
            )?,
            idempotency_horizon: duration(
                "idempotency_horizon",
                &self.idempotency_horizon,
                d.idempotency_horizon,
            )?,
            eviction_interval: duration(
                "eviction_interval",
                &self.eviction_interval,
                d.eviction_interval,
            )?,
            shard_timeout: nonzero(
                &duration,
                "shard_timeout",
                &self.shard_timeout,
                d.shard_timeout,
            )?,
            decision_log_sample: log_sample,
        })
    }
}

/// An admin token as a node takes it (`--admin-token`) and a client sends it: at least 16
/// characters, each visible ASCII (a header carries nothing else intact: spaces at its ends
/// are trimmed, other bytes refused by HTTP libraries).
pub fn check_admin_token(token: &str) -> Result<(), String> {
    if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("`admin_token` must be at least 16 characters, each visible ASCII (no spaces or control characters), e.g. from `openssl rand -hex 32`".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_config_file_which_wins_over_defaults() {
        let file: NodeOptions =
            toml::from_str("shards = 4\nmax_keys = 100\nidle_timeout = \"5s\"").unwrap();
        let cli = NodeOptions {
            shards: Some(8),
            ..NodeOptions::default()
        };
        let c = cli.or(file).to_config().unwrap();
        assert_eq!((c.shards, c.max_keys), (8, 100));
        assert_eq!(c.idle_timeout, Duration::from_secs(5));
        assert_eq!(c.max_key_len, NodeConfig::default().max_key_len);
    }

    #[test]
    fn an_admin_token_is_long_enough_and_visible_ascii() {
        let with = |token: &str| {
            NodeOptions {
                admin_token: Some(token.into()),
                ..NodeOptions::default()
            }
            .to_config()
        };
        assert_eq!(
            with("sixteen-chars-ok").unwrap().admin_token.as_deref(),
            Some("sixteen-chars-ok")
        );
        for bad in [
            "short",
            "fifteen-chars-x",
            "sixteen-chars\r\nok",
            "sixteen chars ok",
            "sixteen-chars-\u{e9}\u{e9}",
        ] {
            assert!(with(bad).unwrap_err().contains("admin_token"), "{bad:?}");
        }
        assert_eq!(
            NodeOptions::default().to_config().unwrap().admin_token,
            None
        );
    }

    #[test]
    fn peers_may_be_names_or_addresses_and_need_a_port() {
        let m = parse_peers("1=10.0.0.1:7100, 2=quorate-2:7100,3=[::1]:7100").unwrap();
        assert_eq!(m[&2], "quorate-2:7100");
        assert_eq!(m[&3], "[::1]:7100");
        for bad in [
            "1=quorate-1",
            "1=quorate-1:",
            "1=:7100",
            "1=q:70000",
            "1=q:0",
            "1=q:x",
        ] {
            let e = parse_peers(bad).unwrap_err();
            assert!(e.contains("HOST:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_member_finds_its_id_by_hostname() {
        let m = parse_peers("1=quorate-0.quorate:7100,2=quorate-1.quorate:7100,3=q3:7100").unwrap();
        assert_eq!(member_for_host(&m, "quorate-1"), Some(2));
        assert_eq!(member_for_host(&m, "quorate-0.quorate\n"), Some(1));
        assert_eq!(member_for_host(&m, "q3"), Some(3));
        assert_eq!(member_for_host(&m, "quorate"), None);
        assert_eq!(member_for_host(&m, ""), None);
        let twice = parse_peers("1=a.x:7100,2=a.y:7100").unwrap();
        assert_eq!(member_for_host(&twice, "a"), None);
    }

    #[test]
    fn a_member_named_by_host_needs_a_listen_address() {
        let opts = NodeOptions {
            id: Some(1),
            peers: Some("1=quorate-1:7100,2=quorate-2:7100".into()),
            cluster_secret: Some("a-secret-of-16-chars".into()),
            data_dir: Some("/data".into()),
            ..Default::default()
        };
        assert!(opts.to_config().unwrap_err().contains("--peer-addr"));
        let opts = NodeOptions {
            peer_addr: Some("0.0.0.0:7100".parse().unwrap()),
            ..opts
        };
        let c = opts.to_config().unwrap().cluster.unwrap();
        assert_eq!(c.peer_addr.port(), 7100);
    }

    /// Member 1 of a 3-node loopback cluster, every required setting given.
    fn member() -> NodeOptions {
        NodeOptions {
            id: Some(1),
            peers: Some("1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103".into()),
            cluster_secret: Some("a-secret-of-16-chars".into()),
            data_dir: Some("/data".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_member_refuses_only_the_peer_requests_an_older_build_could_not_read() {
        let refusing = |flag: Option<&str>| {
            let opts = NodeOptions {
                test_refuse_peer_requests: flag.map(String::from),
                ..member()
            };
            opts.to_config().map(|c| c.cluster.unwrap().refuse_requests)
        };
        assert_eq!(refusing(None).unwrap(), Vec::<u8>::new());
        assert_eq!(refusing(Some("7, 8")).unwrap(), vec![7, 8]);
        assert_eq!(refusing(Some("8")).unwrap(), vec![8]);
        assert_eq!(refusing(Some("9")).unwrap(), vec![9]);
        // Forward (4) and Raft's own requests every build reads: refusing them would stop
        // the cluster, not stand for an older build.
        for bad in ["4", "7,1", "", "7,,8", "x", "256", "10"] {
            let e = refusing(Some(bad)).unwrap_err();
            assert!(e.contains("takes 7, 8 and 9"), "{bad}: {e}");
        }
        // Not from a config file.
        let file = toml::from_str::<NodeOptions>("test_refuse_peer_requests = \"7\"");
        assert!(file.is_err());
    }

    #[test]
    fn a_cluster_member_defaults_to_one_shard_per_member_and_a_single_node_to_16() {
        let member = member();
        assert_eq!(member.clone().to_config().unwrap().shards, CLUSTER_SHARDS);
        let chosen = NodeOptions {
            shards: Some(16),
            ..member
        };
        assert_eq!(chosen.to_config().unwrap().shards, 16);
        assert_eq!(NodeOptions::default().to_config().unwrap().shards, 16);
    }

    /// A node without peers names the member-only settings it was given and ignores (a
    /// `--data-dir` without `--peers` keeps nothing on disk); a member names none.
    #[test]
    fn member_only_settings_given_without_peers_are_named() {
        let single = NodeOptions {
            data_dir: Some("/data".into()),
            election_timeout: Some("5".into()),
            join: Some(true),
            ..NodeOptions::default()
        };
        assert_eq!(
            single.ignored_without_peers(),
            ["data_dir", "election_timeout", "join"]
        );
        assert!(single.to_config().unwrap().cluster.is_none());
        assert!(NodeOptions::default().ignored_without_peers().is_empty());
        let member = NodeOptions {
            election_timeout: Some("1s".into()),
            ..member()
        };
        assert!(member.ignored_without_peers().is_empty());
    }

    #[test]
    fn batch_linger_defaults_to_2ms_and_parses_like_every_duration() {
        let linger = |v: Option<&str>| {
            NodeOptions {
                batch_linger: v.map(Into::into),
                ..member()
            }
            .to_config()
            .map(|c| c.cluster.unwrap().batch_linger)
        };
        assert_eq!(linger(None), Ok(Duration::from_millis(2)));
        assert_eq!(linger(Some("0s")), Ok(Duration::ZERO));
        assert_eq!(linger(Some("1ms")), Ok(Duration::from_millis(1)));
        let err = linger(Some("soon")).unwrap_err();
        assert!(
            err.contains("`batch_linger`") && err.contains("500ms"),
            "{err}"
        );
    }

    #[test]
    fn fast_linger_defaults_to_20ms_and_fast_batch_to_512() {
        let cluster = |linger: Option<&str>, batch: Option<usize>| {
            NodeOptions {
                fast_linger: linger.map(Into::into),
                fast_batch: batch,
                ..member()
            }
            .to_config()
            .map(|c| {
                let c = c.cluster.unwrap();
                (c.fast_linger, c.fast_batch)
            })
        };
        assert_eq!(cluster(None, None), Ok((Duration::from_millis(20), 512)));
        assert_eq!(cluster(Some("0s"), Some(0)), Ok((Duration::ZERO, 1)));
        assert_eq!(
            cluster(Some("5ms"), Some(64)),
            Ok((Duration::from_millis(5), 64))
        );
        let err = cluster(Some("later"), None).unwrap_err();
        assert!(err.contains("`fast_linger`"), "{err}");
    }

    /// Found by reading the `config_file` fuzz target's path: a heartbeat of u64::MAX
    /// seconds used to overflow (and panic) when compared with twice itself.
    #[test]
    fn an_absurd_duration_is_refused_not_a_panic() {
        let err = NodeOptions {
            heartbeat: Some("18446744073709551615s".into()),
            ..member()
        }
        .to_config()
        .unwrap_err();
        assert!(
            err.contains("`heartbeat`") && err.contains("too long"),
            "{err}"
        );
        let year = NodeOptions {
            idle_timeout: Some("365days".into()),
            ..member()
        };
        assert!(year.to_config().is_ok());
    }

    #[test]
    fn bad_settings_name_the_field_and_the_fix() {
        let bad = |o: NodeOptions| o.to_config().unwrap_err();
        assert!(bad(NodeOptions {
            shards: Some(0),
            ..Default::default()
        })
        .contains("`shards`"));
        assert!(bad(NodeOptions {
            shards: Some(4_000_000_000),
            ..Default::default()
        })
        .contains("`shards` = 4000000000 is too many"));
        assert!(bad(NodeOptions {
            idle_timeout: Some("0s".into()),
            ..Default::default()
        })
        .contains("`idle_timeout` must be above zero"));
        assert!(bad(NodeOptions {
            unavailable_after: Some("0ms".into()),
            ..member()
        })
        .contains("`unavailable_after` must be above zero"));
        assert!(bad(NodeOptions {
            sharding: Some("ring".into()),
            ..Default::default()
        })
        .contains("neither \"hash\" nor \"slots\""));
        let slots = NodeOptions::from_toml("sharding = \"slots\"").unwrap();
        assert_eq!(
            slots.to_config().unwrap().sharding,
            crate::shard::route::Sharding::Slots
        );
        assert!(bad(NodeOptions {
            idle_timeout: Some("soon".into()),
            ..Default::default()
        })
        .contains("500ms"));
        assert!(bad(NodeOptions {
            log_sample: Some(2.0),
            ..Default::default()
        })
        .contains("log_sample"));
        assert!(toml::from_str::<NodeOptions>("shardz = 3")
            .unwrap_err()
            .to_string()
            .contains("shardz"));
    }
}
