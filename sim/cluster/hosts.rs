//! The simulated cluster's hosts: each runs the REAL node (`Node::start_member`) over
//! turmoil's sockets and its own [`SimClock`], with its data directory OUTSIDE the host's
//! closure, so a crash and restart (`bounce`) finds the node's disk as it was left.
//!
//! Durability model: files live on a real (preferably RAM-backed) file system, written by
//! the WAL writer running as a task on the host (see `Hooks::io_on_runtime`). With
//! `fsync` on (the default), a write is acknowledged only after it reached the file, and a
//! crash keeps everything in the file: that models an fsync'd disk. With the "skip fsync"
//! negative control the WAL holds acknowledged writes in process memory (its
//! `unsafe_volatile` mode), and a crash drops them: that models unsynced writes lost.

use super::history::{AppliedLog, FallbackRecord, History};
use super::Options;
use crate::clock::{SharedClock, SimClock};
use crate::config::{ClusterSettings, NodeConfig};
use crate::net::turmoil::{TurmoilConnector, TurmoilListener};
use crate::node::Node;
use crate::policy::PolicySet;
use crate::raft::hooks::Hooks;
use crate::raft::NodeId;
use crate::service::Service;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The nodes' election timeout (the shortest; openraft draws up to twice it). A leader's lease
/// is 80% of it, so fast answers a lost leader gave span no more than this.
pub const ELECTION_TIMEOUT: Duration = Duration::from_millis(400);

pub const PEER_PORT: u16 = 7000;
/// Calls with forwarded checks out to one peer past which callers wait and share the next
/// (a production node's is `forward::MAX_IN_FLIGHT`, 32): a run's tens of clients rarely
/// have 32 forwards out to one member, and so would seldom send a `ForwardMany` of more
/// than one check. With one, a forward while another to the same member is out waits for
/// it (what that changes: docs/verification.md, "What runs").
pub const FORWARD_IN_FLIGHT: usize = 1;
pub const RESP_PORT: u16 = 6379;
pub const HTTP_PORT: u16 = 8080;

fn instance_early_purges(service: &Service) -> u64 {
    service.cluster().map_or(0, |c| {
        c.status_with(false)
            .iter()
            .map(|g| g.early_purges)
            .sum::<u64>()
    })
}

/// Everything about one node that outlives its host's software (a crash).
pub struct NodeHandle {
    pub id: NodeId,
    pub name: String,
    pub ip: IpAddr,
    pub clock: Arc<SimClock>,
    /// The running node's service (None while it is down).
    pub service: Mutex<Option<Service>>,
    /// Times the software started (seeds each start's nonces differently).
    pub starts: AtomicU64,
    /// True while the nemesis keeps it crashed.
    pub down: std::sync::atomic::AtomicBool,
    /// True while the nemesis stalls its disk (`Hooks::wal_stall`).
    pub stall: Arc<std::sync::atomic::AtomicBool>,
    /// Early log purges (`GroupStatus::early_purges`) of the node's crashed instances: a
    /// restart's count starts again at 0.
    early_purges_before: AtomicU64,
    config: NodeConfig,
    policies: PolicySet,
    seed: u64,
    history: Arc<Mutex<History>>,
}

impl NodeHandle {
    pub fn resp_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, RESP_PORT)
    }

    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, HTTP_PORT)
    }

    pub fn peer_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, PEER_PORT)
    }

    /// The running node's service, if it is up.
    pub fn service(&self) -> Option<Service> {
        self.service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Forgets the running node (called when its host is crashed: the old instance's
    /// memory must not outlive it).
    pub fn forget(&self) {
        let old = self
            .service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(old) = &old {
            let n = instance_early_purges(old);
            self.early_purges_before.fetch_add(n, Ordering::SeqCst);
        }
        drop(old);
    }

    /// Log purges that reached this node's store before the snapshot covering them was on
    /// disk, over all its instances so far (see `GroupStatus::early_purges`).
    pub fn early_purges(&self) -> u64 {
        let before = self.early_purges_before.load(Ordering::SeqCst);
        before + self.service().map_or(0, |s| instance_early_purges(&s))
    }

    fn note(&self, what: impl std::fmt::Display) {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .event(super::workload::now(), format_args!("{} {what}", self.name));
    }

    /// The host's software: start the node, then serve until crashed.
    pub async fn run(self: Arc<Self>) -> turmoil::Result {
        let any = |port| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
        let peer = TurmoilListener::bind(any(PEER_PORT)).await?;
        let resp = TurmoilListener::bind(any(RESP_PORT)).await?;
        let http = TurmoilListener::bind(any(HTTP_PORT)).await?;
        let start = self.starts.fetch_add(1, Ordering::SeqCst);
        self.note(format_args!("start #{start}"));
        let seed = super::derive(self.seed, &format!("node-{}-start-{start}", self.id));
        let clock: SharedClock = self.clock.clone();
        let node = Node::start_member(
            self.config.clone(),
            self.policies.clone(),
            clock,
            http,
            resp,
            peer,
            TurmoilConnector,
            seed,
        )
        .await?;
        *self.service.lock().unwrap_or_else(|p| p.into_inner()) = Some(node.service().clone());
        self.note("serving");
        std::future::pending::<()>().await;
        drop(node);
        Ok(())
    }
}

/// A directory removed when dropped: the nodes' disks for one run.
pub struct RunDir(pub PathBuf);

impl RunDir {
    /// A fresh directory under /dev/shm when it exists (fsync there costs nothing), else the
    /// system's temporary directory.
    pub fn new(seed: u64) -> std::io::Result<RunDir> {
        static N: AtomicU64 = AtomicU64::new(0);
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!(
            "quorate-sim-{}-{seed}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(RunDir(dir))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds every node's handle. `ips` are the hosts' simulated addresses, in node order: the
/// first `opts.nodes` are the cluster's members from the start; any after them (the spare of
/// `--membership-faults`) start to join (`--join`), knowing every node's address.
pub fn handles(
    opts: &Options,
    ips: &[IpAddr],
    dir: &RunDir,
    policies: &PolicySet,
    log: &Arc<Mutex<AppliedLog>>,
    history: &Arc<Mutex<History>>,
    epoch_ns: u64,
) -> Vec<Arc<NodeHandle>> {
    let everyone: BTreeMap<NodeId, String> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| (i as NodeId + 1, SocketAddr::new(*ip, PEER_PORT).to_string()))
        .collect();
    let members: BTreeMap<NodeId, String> = everyone
        .iter()
        .take(opts.nodes)
        .map(|(id, addr)| (*id, addr.clone()))
        .collect();
    ips.iter()
        .enumerate()
        .map(|(i, ip)| {
            let id = i as NodeId + 1;
            let join = i >= opts.nodes;
            // Hosts disagree on their monotonic origin, as real machines do.
            let origin = u64::from_le_bytes(
                super::derive(opts.seed, &format!("clock-{id}"))[..8]
                    .try_into()
                    .unwrap_or_default(),
            ) % (1 << 50);
            let clock = Arc::new(SimClock::new(origin, epoch_ns));
            let sink_log = log.clone();
            let sink_history = history.clone();
            let stall = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let hooks = Hooks {
                applied: Some(Arc::new(move |e| {
                    sink_history
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .event(
                            super::workload::now(),
                            format_args!(
                                "n{} apply shard {} term {} index {} ({} commands)",
                                e.node,
                                e.group,
                                e.term,
                                e.index,
                                e.batch.map_or(0, |b| b.commands.len())
                            ),
                        );
                    sink_log.lock().unwrap_or_else(|p| p.into_inner()).record(e)
                })),
                handover: Some({
                    let sink_history = history.clone();
                    Arc::new(move |node, group, to, moved| {
                        let mut h = sink_history.lock().unwrap_or_else(|p| p.into_inner());
                        let done = if moved {
                            h.handovers += 1;
                            "handed"
                        } else {
                            h.handovers_failed += 1;
                            "did not hand"
                        };
                        h.event(
                            super::workload::now(),
                            format_args!("n{node} {done} shard {group} over to n{to}"),
                        );
                    })
                }),
                fallback: Some({
                    let sink_history = history.clone();
                    Arc::new(move |f| {
                        sink_history
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .fallbacks
                            .push(FallbackRecord::of(f));
                    })
                }),
                vote: Some({
                    let sink_history = history.clone();
                    Arc::new(move |v| {
                        sink_history
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .votes
                            .record(super::workload::now(), v);
                    })
                }),
                io_on_runtime: true,
                wal_stall: Some(stall.clone()),
                forward_in_flight: Some(FORWARD_IN_FLIGHT),
                unsafe_apply_local_clock: opts
                    .controls
                    .apply_local_clock
                    .then(|| clock.clone() as SharedClock),
                unsafe_answer_before_commit: opts.controls.answer_before_commit,
                unsafe_forget_votes: opts.controls.forget_votes,
            };
            let mut config = NodeConfig {
                data_dir: Some(dir.0.join(format!("n{id}"))),
                shards: opts.shards,
                sharding: opts.sharding,
                decision_log_sample: 0.0,
                ..NodeConfig::default()
            };
            config.cluster = Some(ClusterSettings {
                node_id: id,
                members: if join {
                    everyone.clone()
                } else {
                    members.clone()
                },
                peer_addr: SocketAddr::new(*ip, PEER_PORT),
                secret: "quorate-simulation-secret".into(),
                wal_sync: !opts.controls.skip_fsync,
                wal_direct_io: true,
                refuse_requests: Vec::new(),
                wal_hold_while: None,
                heartbeat: Duration::from_millis(100),
                election_timeout: ELECTION_TIMEOUT,
                unavailable_after: Duration::from_millis(500),
                write_timeout: Duration::from_secs(1),
                batch_max: 1024,
                batch_linger: Duration::from_millis(2),
                fast_linger: Duration::from_millis(20),
                fast_batch: 512,
                pipeline: 1,
                denial_cache: 100_000,
                snapshot_every: if opts.small_snapshots { 50 } else { 20_000 },
                snapshot_log_bytes: if opts.small_snapshots { 4096 } else { 16 << 20 },
                join,
                hooks,
            });
            Arc::new(NodeHandle {
                id,
                name: format!("n{id}"),
                ip: *ip,
                clock,
                service: Mutex::new(None),
                starts: AtomicU64::new(0),
                down: Default::default(),
                stall,
                early_purges_before: AtomicU64::new(0),
                config,
                policies: policies.clone(),
                seed: opts.seed,
                history: history.clone(),
            })
        })
        .collect()
}
