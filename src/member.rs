//! Assembles a cluster member: the node's write-ahead log, every shard's Raft group, the
//! peer transport (client and server) and the service that routes checks through them.

use crate::clock::SharedClock;
use crate::config::NodeConfig;
use crate::metrics::Metrics;
use crate::net::{Connector, Listener};
use crate::peer::identity::Identities;
use crate::peer::{Nonces, PeerConfig, PeerError, Peers};
use crate::policy::PolicySet;
use crate::raft::cluster::{Cluster, ClusterConfig, LogFactory};
use crate::raft::log_store::{GroupLog, NodeLog};
use crate::raft::rpc::{CallError, Transport};
use crate::raft::{GroupId, NodeId};
use crate::service::Service;
use crate::shard::route::Sharding;
use crate::wal::{DirLock, WalOptions};
use futures::future::BoxFuture;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The peer client as the Raft layer's transport.
struct PeerTransport<C: Connector>(Peers<C>);

impl<C: Connector> Transport for PeerTransport<C> {
    fn learn(&self, id: NodeId, addr: &str) {
        // The client resolves the name at each dial.
        self.0.set_peer(id, addr);
    }

    fn call(
        &self,
        to: NodeId,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Vec<u8>, CallError>> {
        let peers = self.0.clone();
        Box::pin(async move {
            peers.call(to, body, timeout).await.map_err(|e| match e {
                PeerError::Remote { .. } => CallError::Failed(to, e.to_string()),
                // Sent, and then no answer: the peer may have acted on it.
                PeerError::Timeout { .. } | PeerError::ConnectionLost { .. } => {
                    CallError::Unreachable(to, e.to_string())
                }
                // Refused or never sent: certainly not acted on.
                other => CallError::NotSent(to, other.to_string()),
            })
        })
    }
}

impl LogFactory for NodeLog {
    type Log = GroupLog;
    fn log(
        &mut self,
        group: GroupId,
        snapshot: Arc<crate::raft::state_machine::MachineInfo>,
    ) -> Result<GroupLog, String> {
        Ok(self.group_after_snapshots(group, snapshot))
    }
}

/// An independent seed for one purpose, from the node's seed (SHA-256 of seed and label).
fn derive_seed(seed: &[u8; 32], label: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(seed);
    h.update(label);
    h.finalize().into()
}

/// 16 bytes of [`derive_seed`] as a number (a new data directory's id, a start's incarnation).
fn derive_number(seed: &[u8; 32], label: &[u8]) -> u128 {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&derive_seed(seed, label)[..16]);
    u128::from_le_bytes(bytes)
}

/// The file in a data directory that records its cluster's shard count.
pub const SHARDS_FILE: &str = "shards";

/// Refuses a data directory written with another shard count. Which group holds a key
/// follows from the count, so a member that started on the same data with another count
/// would look for keys in groups whose state does not have them (their allowances would
/// start afresh). A directory without the record gets one (fsynced, then its directory).
pub fn check_shard_count(data_dir: &std::path::Path, shards: u32) -> io::Result<()> {
    let path = data_dir.join(SHARDS_FILE);
    match read_record(data_dir, SHARDS_FILE)? {
        Some(text) => {
            let found: u32 = text.parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} should hold the data directory's shard count, not {text:?}: restore \
                         it (it is the count the cluster was created with)",
                        path.display(),
                    ),
                )
            })?;
            if found == shards {
                return Ok(());
            }
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the data directory {} belongs to a cluster of {found} shards, but this \
                     member is configured with {shards}: start it with --shards {found} \
                     (QUORATE_SHARDS={found}), or give a new cluster a new data directory",
                    data_dir.display()
                ),
            ))
        }
        None if data_dir.join("wal").exists() => {
            // A log without the record: written by a quorate before the record existed,
            // whose count cannot be known here (the default was 16 then).
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the data directory {} holds a Raft log but no shard count: write the count \
                     its cluster was created with into {} (`echo 16 > {}` if it was created \
                     with an older quorate's default), then start with that --shards",
                    data_dir.display(),
                    path.display(),
                    path.display()
                ),
            ))
        }
        None => write_record(data_dir, SHARDS_FILE, shards),
    }
}

/// The file in a data directory that records the format of its log entries.
pub const LOG_FORMAT_FILE: &str = "log-format";

/// The log entry format this build writes and reads (entries and snapshots). 5: snapshots
/// hold the group's member history (`shard::state::MemberHistory`); 4: snapshots
/// hold request ids as 16-byte digests; 3: refunds
/// carry their admission's request id, snapshots remember when each id was decided and
/// whether it was refunded, and bucket and GCRA keys their last admission's time; 2:
/// entries carry the shard times of their parts (`Batch::later`); 1 (no record) had one
/// time per entry.
pub const LOG_FORMAT: u32 = 5;

/// Refuses a data directory whose log this build cannot read: one recorded with another
/// format, or a log without a record (written before format 2). A directory without a
/// log gets the record (fsynced, then its directory).
pub fn check_log_format(data_dir: &std::path::Path) -> io::Result<()> {
    let refuse = |found: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the data directory {} holds a Raft log of format {found}, and this quorate \
                 reads format {LOG_FORMAT}: run the quorate that wrote it, or stop every member \
                 and start them on fresh data directories (docs/operations.md, \"Upgrade\")",
                data_dir.display()
            ),
        )
    };
    match read_record(data_dir, LOG_FORMAT_FILE)? {
        Some(text) if text == LOG_FORMAT.to_string() => Ok(()),
        Some(text) => Err(refuse(&text)),
        None if data_dir.join("wal").exists() => Err(refuse("1 (no log-format record)")),
        None => write_record(data_dir, LOG_FORMAT_FILE, LOG_FORMAT),
    }
}

/// The file in a data directory that records how its cluster spreads keys over shards.
pub const SHARDING_FILE: &str = "sharding";

/// Refuses a data directory written with another sharding (which group holds a key follows
/// from it, as from the shard count). A log without the record was written before `slots`
/// existed, so with `hash`. A directory without a log gets the record.
pub fn check_sharding(data_dir: &std::path::Path, sharding: Sharding) -> io::Result<()> {
    let path = data_dir.join(SHARDING_FILE);
    let found = match read_record(data_dir, SHARDING_FILE)? {
        Some(text) => Sharding::parse(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} should hold the data directory's sharding, hash or slots, not {text:?}: \
                     restore it (it is the sharding the cluster was created with)",
                    path.display(),
                ),
            )
        })?,
        None if data_dir.join("wal").exists() => Sharding::Hash,
        None => return write_record(data_dir, SHARDING_FILE, sharding.name()),
    };
    if found == sharding {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "the data directory {} belongs to a cluster that shards keys by {}, but this \
             member is configured with {}: start it with --sharding {} \
             (QUORATE_SHARDING={}), or give a new cluster a new data directory",
            data_dir.display(),
            found.name(),
            sharding.name(),
            found.name(),
            found.name()
        ),
    ))
}

/// A one-line record's text, trimmed; `None` if the data directory has no such file.
pub(crate) fn read_record(data_dir: &std::path::Path, name: &str) -> io::Result<Option<String>> {
    match std::fs::read_to_string(data_dir.join(name)) {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes a one-line record into the data directory durably: a temporary file, fsynced,
/// renamed into place, then the directory fsynced.
pub(crate) fn write_record(
    data_dir: &std::path::Path,
    name: &str,
    value: impl std::fmt::Display,
) -> io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(data_dir)?;
    let tmp = data_dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{value}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, data_dir.join(name))?;
    std::fs::File::open(data_dir)?.sync_all()
}

/// Runs blocking file work on the blocking pool, or inline when `inline` (under the
/// simulation, where I/O runs on the runtime: a blocking-pool thread's timing is outside
/// simulated time).
pub(crate) async fn blocking_io<T: Send + 'static>(
    inline: bool,
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    if inline {
        work()
    } else {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(io::Error::other)?
    }
}

/// Starts the member's Raft groups and peer server; returns the service and the peer
/// server's task (it ends when `shutdown` resolves).
pub async fn start<P: Listener, C: Connector>(
    config: NodeConfig,
    policies: PolicySet,
    clock: SharedClock,
    peer: P,
    connector: C,
    seed: [u8; 32],
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<(Service, JoinHandle<io::Result<()>>)> {
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
    let settings = config
        .cluster
        .clone()
        .ok_or_else(|| invalid("not a cluster member: no peers configured".into()))?;
    let data_dir = config
        .data_dir
        .clone()
        .ok_or_else(|| invalid("a cluster member needs a data directory".into()))?;
    // HOST:PORT as configured (validated by `parse_peers`): the peer client resolves a name
    // before every dial, so peers may start in any order and move to new addresses.
    let addrs: Vec<(NodeId, String)> = settings
        .members
        .iter()
        .filter(|(id, _)| **id != settings.node_id)
        .map(|(id, addr)| (*id, addr.clone()))
        .collect();
    let shards = config.shards.max(1);
    let sharding = config.sharding;
    let dir = data_dir.clone();
    let fresh = derive_number(&seed, b"data-id");
    let io_on_runtime = settings.hooks.io_on_runtime;
    let volatile_log = !settings.wal_sync;
    let (lock, identities) = blocking_io(io_on_runtime, move || {
        // First: nothing below may read or write a directory another process is using.
        let lock = DirLock::acquire(&dir)?;
        check_log_format(&dir)?;
        check_shard_count(&dir, shards)?;
        check_sharding(&dir, sharding)?;
        Ok((
            lock,
            Identities::load(&dir, fresh, io_on_runtime, volatile_log)?,
        ))
    })
    .await?;
    let wal_dir = data_dir.join("wal");
    // The negative control of the durability tests: no fsync, acknowledgements before the
    // write, and writes held in process memory, so kill -9 loses acknowledged entries.
    let options = WalOptions {
        sync: settings.wal_sync,
        unsafe_volatile: !settings.wal_sync,
        writer_on_runtime: settings.hooks.io_on_runtime,
        direct_io: settings.wal_direct_io,
        hold_while: settings.wal_hold_while.clone(),
        dir_lock: Some(Arc::new(lock)),
        stall: settings.hooks.wal_stall.clone(),
        ..WalOptions::default()
    };
    if !settings.wal_sync {
        tracing::warn!(
            "UNSAFE: --unsafe-no-fsync is set; acknowledged decisions can be lost on a crash"
        );
    }
    // Blocking: it reads the whole log.
    let (mut log, _) = blocking_io(options.writer_on_runtime, move || {
        NodeLog::open(&wal_dir, options)
    })
    .await?;
    log.set_unsafe_ack_before_durable(!settings.wal_sync);
    log.set_node(settings.node_id);
    if let Some(sink) = settings.hooks.vote.clone() {
        log.watch_votes(settings.node_id, sink, settings.hooks.unsafe_forget_votes);
    }
    let log_stats = log.wal().clone();

    let peer_config = peer_config(
        settings.node_id,
        &settings.secret,
        config.sharding,
        settings.write_timeout,
        Some(Arc::new(identities)),
    );
    let nonces = Nonces::from_seed(seed);
    let peers =
        Peers::new(peer_config.clone(), connector, addrs, nonces.clone()).map_err(invalid)?;
    let transport: Arc<dyn Transport> = Arc::new(PeerTransport(peers.clone()));

    let metrics = Metrics::new();
    let mut cluster_config =
        ClusterConfig::defaults(settings.node_id, settings.members.clone(), data_dir.clone());
    cluster_config.shards = shards;
    cluster_config.heartbeat = settings.heartbeat;
    cluster_config.election_min = settings.election_timeout;
    cluster_config.election_max = settings.election_timeout * 2;
    cluster_config.unavailable_after = settings.unavailable_after;
    cluster_config.write_timeout = settings.write_timeout;
    cluster_config.forward_timeout = settings.unavailable_after;
    cluster_config.batch_max = settings.batch_max;
    cluster_config.batch_linger = settings.batch_linger;
    cluster_config.fast_linger = settings.fast_linger;
    cluster_config.fast_batch = settings.fast_batch;
    cluster_config.denial_cache = settings.denial_cache;
    cluster_config.join = settings.join;
    cluster_config.pipeline = settings.pipeline;
    cluster_config.snapshot_every = settings.snapshot_every;
    cluster_config.snapshot_log_bytes = settings.snapshot_log_bytes;
    cluster_config.hooks = settings.hooks.clone();
    cluster_config.refuse_requests = settings.refuse_requests.clone();
    // The low 8 bytes, as this was before `derive_number`: the same incarnations.
    cluster_config.incarnation = derive_number(&seed, b"incarnation") as u64;
    let bounds = Service::bounds(&config);
    // openraft's random draws (election timeouts) come from the node's seed, not the OS's
    // directly: under the simulation that makes elections reproducible.
    let raft_seed = derive_seed(&seed, b"raft");
    let cluster = crate::raft::types::with_raft_seed(
        raft_seed,
        Cluster::start(
            cluster_config,
            log,
            transport,
            clock.clone(),
            metrics.clone(),
            bounds,
        ),
    )
    .await
    .map_err(io::Error::other)?;

    let handled = cluster.clone();
    let handler: crate::peer::Handler = Arc::new(move |from, body| {
        let cluster = handled.clone();
        Box::pin(async move { Ok(cluster.handle(from, &body).await) })
    });
    // One connection per member pair: the server's handler answers on the connections
    // `peers` dial, and `peers` call on those lower ids dial here.
    let peer_server = crate::peer::PeerServer::new(peer_config, handler, nonces).with_peers(&peers);
    let peer_stats = peer_server.stats();

    // Metrics: the WAL's fsync economy, the peer server's connections and every group's
    // Raft state, once a second.
    let wal = log_stats.clone();
    let watched = Arc::downgrade(&cluster);
    let metrics_task = metrics.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut peers = PeerCounts::default();
        loop {
            tick.tick().await;
            let Some(cluster) = watched.upgrade() else {
                return;
            };
            let (appends, syncs) = wal.stats();
            metrics_task.wal_appends.set(appends as i64);
            metrics_task.wal_syncs.set(syncs as i64);
            metrics_task.wal_failed.set(wal.failed() as i64);
            peers.publish(&peer_stats, &metrics_task);
            cluster.publish_metrics();
        }
    });
    let server = tokio::spawn(peer_server.serve(peer, shutdown));
    // The cluster bounds each shard's part of a call by `unavailable_after` and then answers
    // by `on_unavailable`; the service's own bound sits just above it.
    let timeout =
        settings.unavailable_after + settings.write_timeout * 2 + Duration::from_millis(500);
    let service = Service::clustered(config, policies, clock, metrics, cluster, timeout);
    tracing::info!(
        node = settings.node_id,
        members = settings.members.len(),
        "cluster member started"
    );
    Ok((service, server))
}

/// The peer server's counters as last published: each publish adds what they gained since.
#[derive(Default)]
struct PeerCounts {
    /// `quorate_peer_connections_total{result}`, by result (the order of `publish`'s list).
    connections: [u64; 5],
    /// `quorate_peer_requests_busy_total`.
    busy: u64,
}

impl PeerCounts {
    fn publish(&mut self, stats: &crate::peer::PeerStats, metrics: &Metrics) {
        use crate::peer::PeerStats;
        let connections = [
            ("authenticated", &stats.authenticated),
            ("handshake_failed", &stats.handshake_failures),
            ("refused_per_address", &stats.handshakes_refused),
            ("refused_max_connections", &stats.connections_rejected),
            ("protocol_error", &stats.protocol_errors),
        ];
        for ((result, counter), published) in connections.iter().zip(&mut self.connections) {
            let now = PeerStats::get(counter);
            metrics
                .peer_connections
                .with_label_values(&[result])
                .inc_by(now.saturating_sub(*published));
            *published = now;
        }
        let busy = PeerStats::get(&stats.busy);
        metrics.peer_busy.inc_by(busy.saturating_sub(self.busy));
        self.busy = busy;
    }
}

/// The peer transport's settings of a member.
fn peer_config(
    node_id: u64,
    secret: &str,
    sharding: Sharding,
    write_timeout: Duration,
    identities: Option<Arc<Identities>>,
) -> PeerConfig {
    let mut peer_config = PeerConfig::new(node_id, secret.as_bytes().to_vec());
    // Any node proving the cluster secret may connect: members are added at runtime, and
    // the Raft membership (not this list) decides who votes. Rotate the secret to shut out
    // a removed node that still has it.
    peer_config.members = None;
    peer_config.slot_sharding = sharding == Sharding::Slots;
    // Forwarded checks have room of their own on a connection, apart from Raft's requests.
    peer_config.is_bulk = Some(crate::raft::rpc::is_bulk);
    // A member back under its id on another data directory has forgotten its votes: its
    // peers refuse it (`peer::identity`).
    peer_config.identities = identities;
    // A handler may take as long as the longest peer request: a membership step sent to a
    // shard's leader (`Cluster::change_members` asks with `write_timeout * 10`; adding a node
    // waits up to `write_timeout * 5` for it to catch up). Under the default 5 s the server
    // cut such a step off first, and the member resent it over and over.
    peer_config.handler_timeout = peer_config.handler_timeout.max(
        write_timeout
            .saturating_mul(10)
            .saturating_add(Duration::from_secs(1)),
    );
    peer_config
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member's forwarded checks are bulk to its peer transport (their own room on a
    /// connection), its Raft requests not; the settings are valid.
    #[test]
    fn a_members_forwarded_checks_are_bulk_on_the_peer_connection() {
        use crate::raft::rpc::{encode, PeerRequest};
        let c = peer_config(
            2,
            "a cluster secret of 32 bytes....",
            Sharding::Hash,
            Duration::from_secs(2),
            None,
        );
        c.validate().unwrap();
        let is_bulk = c.is_bulk.expect("a member classifies its peer requests");
        let forward = PeerRequest::Forward {
            group: 0,
            commands: Vec::new(),
            fast: false,
        };
        assert!(is_bulk(&encode(&forward)));
        assert!(!is_bulk(&encode(&PeerRequest::RespAddr)));
        assert!(c.max_bulk_requests < c.max_concurrent_requests);
        assert_eq!(c.handler_timeout, Duration::from_secs(21));
    }

    /// Each publish adds to the metrics what the peer server's counters gained since the
    /// last, each under its own name and label.
    #[test]
    fn the_peer_servers_counters_are_published_as_they_grow() {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = crate::peer::PeerStats::default();
        let metrics = Metrics::new();
        let mut published = PeerCounts::default();
        let connections =
            |result: &str| metrics.peer_connections.with_label_values(&[result]).get();
        stats.authenticated.store(3, Relaxed);
        stats.handshake_failures.store(1, Relaxed);
        stats.busy.store(7, Relaxed);
        published.publish(&stats, &metrics);
        stats.authenticated.store(5, Relaxed);
        stats.protocol_errors.store(2, Relaxed);
        stats.busy.store(9, Relaxed);
        published.publish(&stats, &metrics);
        published.publish(&stats, &metrics);
        assert_eq!(connections("authenticated"), 5);
        assert_eq!(connections("handshake_failed"), 1);
        assert_eq!(connections("protocol_error"), 2);
        assert_eq!(connections("refused_per_address"), 0);
        assert_eq!(connections("refused_max_connections"), 0);
        assert_eq!(metrics.peer_busy.get(), 9);
    }

    #[test]
    fn a_data_directory_keeps_its_shard_count_and_refuses_another() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        check_shard_count(&data, 16).unwrap();
        assert_eq!(
            std::fs::read_to_string(data.join(SHARDS_FILE)).unwrap(),
            "16\n"
        );
        check_shard_count(&data, 16).unwrap();
        let e = check_shard_count(&data, 3).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let msg = e.to_string();
        assert!(msg.contains("cluster of 16 shards"), "{msg}");
        assert!(msg.contains("--shards 16"), "{msg}");
        // The refusal changed nothing.
        assert_eq!(
            std::fs::read_to_string(data.join(SHARDS_FILE)).unwrap(),
            "16\n"
        );
    }

    #[test]
    fn a_data_directory_keeps_its_sharding_and_an_old_log_is_hash() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        check_sharding(&data, Sharding::Slots).unwrap();
        assert_eq!(
            std::fs::read_to_string(data.join(SHARDING_FILE)).unwrap(),
            "slots\n"
        );
        check_sharding(&data, Sharding::Slots).unwrap();
        let e = check_sharding(&data, Sharding::Hash).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("--sharding slots"), "{e}");
        // A log written before the record was written with hash sharding.
        let old = dir.path().join("old");
        std::fs::create_dir_all(old.join("wal")).unwrap();
        check_sharding(&old, Sharding::Hash).unwrap();
        let e = check_sharding(&old, Sharding::Slots).unwrap_err();
        assert!(e.to_string().contains("--sharding hash"), "{e}");
        assert!(
            !old.join(SHARDING_FILE).exists(),
            "the refusal wrote a record"
        );
        std::fs::write(data.join(SHARDING_FILE), "ring\n").unwrap();
        let e = check_sharding(&data, Sharding::Slots).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_log_without_a_shard_count_is_refused_not_given_the_configured_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("wal")).unwrap();
        let e = check_shard_count(dir.path(), 3).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("no shard count"), "{e}");
        assert!(
            !dir.path().join(SHARDS_FILE).exists(),
            "the refusal wrote a count"
        );
    }

    #[test]
    fn a_log_of_another_format_is_refused_and_a_new_directory_gets_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        check_log_format(&data).unwrap();
        assert_eq!(
            std::fs::read_to_string(data.join(LOG_FORMAT_FILE)).unwrap(),
            format!("{LOG_FORMAT}\n")
        );
        check_log_format(&data).unwrap();
        // The format before this build's.
        std::fs::write(data.join(LOG_FORMAT_FILE), "2\n").unwrap();
        let e = check_log_format(&data).unwrap_err();
        assert!(e.to_string().contains("format 2"), "{e}");
        // A log written before the record (format 1) is refused, and no record is written.
        let old = dir.path().join("old");
        std::fs::create_dir_all(old.join("wal")).unwrap();
        let e = check_log_format(&old).unwrap_err();
        assert!(e.to_string().contains("fresh data directories"), "{e}");
        assert!(
            !old.join(LOG_FORMAT_FILE).exists(),
            "the refusal wrote a record"
        );
    }

    #[test]
    fn a_damaged_shard_count_record_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SHARDS_FILE), "sixteen").unwrap();
        let e = check_shard_count(dir.path(), 16).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains(SHARDS_FILE), "{e}");
    }
}
