//! A shard group's state machine: the shard's [`ShardState`] driven by committed batches.
//!
//! Every replica applies the same batches in log order with the batch's own time, so every
//! replica reaches the same state and the same answers (`ShardState::apply` reads no clock).
//! The leader answers a caller with what ITS apply returned, after the entry committed.
//!
//! Durability: the log is the durable record; the state machine lives in memory and is
//! rebuilt on start from the last snapshot plus the committed log after it. A snapshot is
//! written to `<dir>/group-<g>.snap` (temp file, fsync, rename, directory fsync) before
//! openraft is told it exists, because openraft purges the log behind a snapshot.
//! Snapshot file: `[u32 meta length][meta (bincode)][shard image]`.

use super::hooks::{AppliedEntry, Hooks};
use super::rpc::Removal;
use super::types::{Applies, GroupId, NodeId, TypeConfig};
use crate::shard::state::{Bounds, PendingImage, ShardState};
use arc_swap::ArcSwap;
use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, BasicNode, EntryPayload, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use std::collections::BTreeSet;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

type Membership = StoredMembership<NodeId, BasicNode>;
type Meta = SnapshotMeta<NodeId, BasicNode>;

/// What a group's readers (status, metrics) see of its state machine without a lock.
#[derive(Debug, Default)]
pub struct MachineInfo {
    pub keys: AtomicU64,
    /// Shard time of the last applied batch.
    pub time: AtomicU64,
    /// Index of the last applied entry (0 before any).
    pub applied: AtomicU64,
    pub snapshots: AtomicU64,
    /// Snapshots received from a leader and installed.
    pub installed: AtomicU64,
    /// The last log index the snapshot file covers, once it is durable: the group's log
    /// store purges no further (`raft::log_store`).
    pub snapshot_durable: AtomicU64,
    /// Bytes of entries appended to the group's log on this node (as written to the WAL), and
    /// their count when the last snapshot was taken or installed: what `snapshot_loop`
    /// (raft/cluster.rs) takes a snapshot by.
    pub log_bytes: AtomicU64,
    pub log_bytes_at_snapshot: AtomicU64,
    /// Entries appended to the group's log on this node (what `log_bytes` came in).
    pub log_entries: AtomicU64,
    /// Purges that reached the log store before the snapshot covering them was durable
    /// (they wait for it). Always 0: openraft (vendor/README.md, the fourth change) runs the
    /// purge after a snapshot install only once the install has finished. Counted, not
    /// trusted.
    pub early_purges: AtomicU64,
    /// The ids removed from the group, as this replica has applied them (a copy of the
    /// state's `MemberHistory::removed`, replaced whenever that changes): read on the peer
    /// path, where a removed node's votes and forwards are refused, without the state's lock.
    pub removed: ArcSwap<BTreeSet<NodeId>>,
}

/// The last snapshot, as kept in memory and on disk.
#[derive(Clone)]
struct Stored {
    meta: Meta,
    data: Arc<Vec<u8>>,
}

pub struct ShardMachine {
    group: GroupId,
    state: Arc<Mutex<ShardState>>,
    bounds: Bounds,
    last_applied: Option<LogId<NodeId>>,
    membership: Membership,
    file: Arc<SnapshotFile>,
    info: Arc<MachineInfo>,
    /// Snapshots built by this process, to name them uniquely.
    built: Arc<AtomicU64>,
    /// This node's id and the simulation's hooks (see `super::hooks`).
    node: NodeId,
    hooks: Hooks,
    /// Told when this replica applies (or restores) this node's own removal from the group.
    removal: Arc<Removal>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn sm_read(e: impl ToString) -> StorageError<NodeId> {
    StorageIOError::read_state_machine(AnyError::error(e.to_string())).into()
}

fn snap_write(e: impl ToString) -> StorageError<NodeId> {
    StorageIOError::write_snapshot(None, AnyError::error(e.to_string())).into()
}

impl ShardMachine {
    /// Notes the log's bytes as of a snapshot taken or installed (`MachineInfo::log_bytes`).
    fn mark_log_bytes(&self) {
        let appended = self.info.log_bytes.load(Ordering::Relaxed);
        self.info
            .log_bytes_at_snapshot
            .store(appended, Ordering::Relaxed);
    }

    /// Opens group `group`'s state machine, restoring the snapshot in `dir` if there is one.
    pub fn open(dir: &Path, group: GroupId, bounds: Bounds) -> Result<ShardMachine, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(format!("group-{group}.snap"));
        let info = Arc::new(MachineInfo::default());
        let mut sm = ShardMachine {
            group,
            state: Arc::new(Mutex::new(ShardState::new(bounds))),
            bounds,
            last_applied: None,
            membership: Membership::default(),
            file: Arc::new(SnapshotFile {
                path,
                current: Mutex::new(None),
                writing: Mutex::new(()),
                info: info.clone(),
            }),
            info,
            built: Arc::new(AtomicU64::new(0)),
            node: 0,
            hooks: Hooks::default(),
            removal: Arc::default(),
        };
        let path = sm.file.path.clone();
        match std::fs::read(&path) {
            Ok(bytes) => {
                let (meta, image) =
                    split_snapshot(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
                sm.restore(meta, image)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
        Ok(sm)
    }

    /// Sets this node's id (`node`, also what names it to the simulation's hooks) and the
    /// hooks (see `super::hooks`); `removal` learns this node's removal from the group once
    /// this replica has applied it (at once if the restored snapshot has it).
    pub fn set_node(&mut self, node: NodeId, hooks: Hooks, removal: Arc<Removal>) {
        self.node = node;
        self.hooks = hooks;
        self.removal = removal;
        self.note_removed(&lock(&self.state));
    }

    /// The shard state (shared, for status and tests).
    pub fn state(&self) -> Arc<Mutex<ShardState>> {
        self.state.clone()
    }

    pub fn info(&self) -> Arc<MachineInfo> {
        self.info.clone()
    }

    /// At open: the snapshot in the file becomes the state, and the current snapshot.
    fn restore(&mut self, meta: Meta, image: &[u8]) -> Result<(), String> {
        let state = ShardState::from_image(image, self.bounds)?;
        self.take_state(&meta, state);
        self.file.mark_durable(&meta);
        *lock(&self.file.current) = Some(Stored {
            meta,
            data: Arc::new(image.to_vec()),
        });
        Ok(())
    }

    /// `state`, decoded from the snapshot `meta` describes, becomes this replica's state.
    fn take_state(&mut self, meta: &Meta, state: ShardState) {
        self.publish(&state, meta.last_log_id);
        self.note_removed(&state);
        *lock(&self.state) = state;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
    }

    /// Publishes the ids removed from the group (`MachineInfo::removed`), and tells
    /// `removal` if this node is among them.
    fn note_removed(&self, state: &ShardState) {
        let removed = &state.members().removed;
        if **self.info.removed.load() != *removed {
            self.info.removed.store(Arc::new(removed.clone()));
        }
        if removed.contains(&self.node) {
            self.removal.learn(self.group, self.node);
        }
    }

    fn publish(&self, state: &ShardState, applied: Option<LogId<NodeId>>) {
        self.info.keys.store(state.len() as u64, Ordering::Relaxed);
        self.info.time.store(state.time(), Ordering::Relaxed);
        self.info
            .applied
            .store(applied.map_or(0, |l| l.index), Ordering::Relaxed);
    }
}

/// Writes `bytes` to `path` durably: a temp file, fsync, rename, directory fsync.
fn write_durably(path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    let tmp = path.with_extension("snap.tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        for p in parts {
            f.write_all(p)?;
        }
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if cfg!(unix) {
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
    }
    Ok(())
}

/// Every node a membership names, voters and learners.
fn node_ids(m: &openraft::Membership<NodeId, BasicNode>) -> std::collections::BTreeSet<NodeId> {
    m.nodes().map(|(id, _)| *id).collect()
}

fn encode_meta(meta: &Meta) -> Vec<u8> {
    bincode::serde::encode_to_vec(meta, bincode::config::standard())
        .expect("snapshot meta always encodes")
}

fn split_snapshot(bytes: &[u8]) -> Result<(Meta, &[u8]), String> {
    let len = bytes
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("snapshot file shorter than its header")?;
    let meta_bytes = bytes
        .get(4..4 + len)
        .ok_or("snapshot file shorter than its meta")?;
    let (meta, _): (Meta, usize) = bincode::serde::decode_from_slice(
        meta_bytes,
        bincode::config::standard().with_limit::<{ 1 << 20 }>(),
    )
    .map_err(|e| format!("snapshot meta: {e}"))?;
    Ok((meta, &bytes[4 + len..]))
}

/// A group's snapshot file, shared by its state machine and the builds it hands out.
struct SnapshotFile {
    path: PathBuf,
    /// The snapshot in the file: set only together with the file's write ([`Self::persist`]).
    current: Mutex<Option<Stored>>,
    /// Held while the file is written: a build (openraft runs it as a task of its own) and
    /// an install may finish at once.
    writing: Mutex<()>,
    /// Where the durable mark goes (`MachineInfo::snapshot_durable`).
    info: Arc<MachineInfo>,
}

impl SnapshotFile {
    /// Writes `stored` to the file and makes it the current snapshot, unless the file holds
    /// a newer one: a build that finishes after an install of a newer snapshot (openraft
    /// builds in a task of its own) must not put its older image back in the file, nor offer
    /// it to lagging followers, once openraft has purged the log the newer one covers.
    /// Blocking; the writes are serialized by `writing`.
    fn persist(&self, stored: &Stored) -> std::io::Result<()> {
        let _writing = lock(&self.writing);
        let newer = lock(&self.current)
            .as_ref()
            .is_some_and(|c| c.meta.last_log_id > stored.meta.last_log_id);
        if newer {
            return Ok(());
        }
        let meta = encode_meta(&stored.meta);
        let len = (meta.len() as u32).to_le_bytes();
        write_durably(&self.path, &[&len, &meta, &stored.data])?;
        self.mark_durable(&stored.meta);
        *lock(&self.current) = Some(stored.clone());
        Ok(())
    }

    /// Raises the durable snapshot mark to what `meta` covers.
    fn mark_durable(&self, meta: &Meta) {
        let index = meta.last_log_id.map_or(0, |l| l.index);
        self.info
            .snapshot_durable
            .fetch_max(index, Ordering::Release);
    }
}

pub struct ShardSnapshotBuilder {
    /// Encode and write the snapshot inline (see [`crate::member::blocking_io`]).
    inline: bool,
    meta: Meta,
    /// The state as of `meta`, encoded by the build (taken by it: openraft builds once).
    pending: Option<PendingImage>,
    file: Arc<SnapshotFile>,
    info: Arc<MachineInfo>,
}

impl RaftSnapshotBuilder<TypeConfig> for ShardSnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let pending = self
            .pending
            .take()
            .ok_or_else(|| snap_write("this snapshot was built already"))?;
        let (file, meta) = (self.file.clone(), self.meta.clone());
        // Encoded here, in a task of its own, while the shard applies on: the image's key
        // table shares its parts with the state's until either changes them.
        // Built anyway if a newer snapshot is in the file: openraft keeps its newer one.
        let stored = crate::member::blocking_io(self.inline, move || {
            let stored = Stored {
                meta,
                data: Arc::new(pending.encode()),
            };
            file.persist(&stored)?;
            Ok(stored)
        })
        .await
        .map_err(snap_write)?;
        self.info.snapshots.fetch_add(1, Ordering::Relaxed);
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data.to_vec())),
        })
    }
}

impl RaftStateMachine<TypeConfig> for ShardMachine {
    type SnapshotBuilder = ShardSnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, Membership), StorageError<NodeId>> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applies>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = openraft::Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut out = Vec::new();
        let mut state = lock(&self.state);
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            let (applies, batch) = match entry.payload {
                EntryPayload::Blank => (Applies::default(), None),
                EntryPayload::Normal(batch) => {
                    let applies = match &self.hooks.unsafe_apply_local_clock {
                        // Negative control only: decide at this node's own clock reading.
                        Some(clock) => {
                            let mut local = (*batch).clone();
                            local.time = clock.monotonic();
                            local.later.clear();
                            Applies(state.apply(&local))
                        }
                        None => Applies(state.apply(&batch)),
                    };
                    (applies, Some(batch))
                }
                EntryPayload::Membership(m) => {
                    state.note_membership(&node_ids(self.membership.membership()), &node_ids(&m));
                    self.note_removed(&state);
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    (Applies::default(), None)
                }
            };
            if let Some(sink) = &self.hooks.applied {
                sink(&AppliedEntry {
                    node: self.node,
                    group: self.group,
                    term: entry.log_id.leader_id.term,
                    index: entry.log_id.index,
                    batch: batch.as_deref(),
                    results: &applies.0,
                });
            }
            out.push(applies);
        }
        self.publish(&state, self.last_applied);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> ShardSnapshotBuilder {
        // Taken now, between applies, so the image matches `last_applied` exactly; encoded
        // by the build (a copy of the key table that shares its parts: microseconds).
        let pending = lock(&self.state).pending_image();
        self.mark_log_bytes();
        let n = self.built.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match self.last_applied {
            Some(l) => format!("g{}-t{}-i{}-{n}", self.group, l.leader_id.term, l.index),
            None => format!("g{}-empty-{n}", self.group),
        };
        ShardSnapshotBuilder {
            inline: self.hooks.io_on_runtime,
            meta: SnapshotMeta {
                last_log_id: self.last_applied,
                last_membership: self.membership.clone(),
                snapshot_id,
            },
            pending: Some(pending),
            file: self.file.clone(),
            info: self.info.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        // Decoded before it replaces the file: an image that does not decode leaves the
        // snapshot on disk (and the state) as they were.
        let state = ShardState::from_image(&data, self.bounds).map_err(sm_read)?;
        let stored = Stored {
            meta: meta.clone(),
            data: Arc::new(data),
        };
        // On disk first: once installed, openraft may purge the log it replaces.
        let file = self.file.clone();
        crate::member::blocking_io(self.hooks.io_on_runtime, move || file.persist(&stored))
            .await
            .map_err(snap_write)?;
        self.take_state(meta, state);
        self.mark_log_bytes();
        self.info.installed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        Ok(lock(&self.file.current).clone().map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data.to_vec())),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::state::MemberHistory;
    use openraft::{CommittedLeaderId, Entry};
    use std::collections::BTreeSet;

    fn bounds() -> Bounds {
        Bounds {
            max_keys: 100,
            idempotency_horizon: 1_000_000_000,
            max_request_ids: 100,
        }
    }

    fn membership(index: u64, voters: &[NodeId]) -> Entry<TypeConfig> {
        let voters: BTreeSet<NodeId> = voters.iter().copied().collect();
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Membership(openraft::Membership::new(vec![voters], ())),
        }
    }

    #[tokio::test]
    async fn applied_membership_entries_leave_a_history_that_snapshots_carry() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = ShardMachine::open(dir.path(), 0, bounds()).unwrap();
        sm.apply([
            membership(1, &[1, 2, 3]),
            membership(2, &[1, 2, 3, 4]),
            membership(3, &[2, 3, 4]),
        ])
        .await
        .unwrap();
        let history = |sm: &ShardMachine| lock(&sm.state()).members().clone();
        let want = MemberHistory {
            removed: [1].into(),
        };
        assert_eq!(history(&sm), want);
        // Written as a snapshot, then opened by a new process: the history is back.
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let reopened = ShardMachine::open(dir.path(), 0, bounds()).unwrap();
        assert_eq!(history(&reopened), want);
    }

    #[tokio::test]
    async fn a_replica_that_applies_its_own_removal_learns_it() {
        let dir = tempfile::tempdir().unwrap();
        // Node 3's replica, and node 2's, of the same log.
        let replica = |node: NodeId, sub: &str| {
            let mut sm = ShardMachine::open(&dir.path().join(sub), 0, bounds()).unwrap();
            let removal = Arc::new(Removal::default());
            sm.set_node(node, Hooks::default(), removal.clone());
            (sm, removal)
        };
        let (mut three, three_out) = replica(3, "a");
        let (mut two, two_out) = replica(2, "b");
        for sm in [&mut three, &mut two] {
            sm.apply([membership(1, &[1, 2, 3]), membership(2, &[1, 2, 3, 4])])
                .await
                .unwrap();
            assert!(sm.info.removed.load().is_empty());
        }
        assert!(!three_out.is_known());
        for sm in [&mut three, &mut two] {
            sm.apply([membership(3, &[1, 2, 4])]).await.unwrap();
            // The ids the peer path refuses, without the state's lock.
            assert_eq!(**sm.info.removed.load(), BTreeSet::from([3]));
        }
        assert!(three_out.is_known());
        assert!(!two_out.is_known());
        // Restarted from its snapshot, node 3 knows it at once.
        three
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let (_, again) = replica(3, "a");
        assert!(again.is_known());
    }

    /// The index of the snapshot `sm` offers, and of the one a restart from `dir` restores.
    async fn snapshot_indexes(sm: &mut ShardMachine, dir: &Path) -> (u64, u64) {
        let offered = sm.get_current_snapshot().await.unwrap().unwrap();
        let mut reopened = ShardMachine::open(dir, 0, bounds()).unwrap();
        let (restored, _) = reopened.applied_state().await.unwrap();
        assert_eq!(
            reopened.info().snapshot_durable.load(Ordering::Acquire),
            restored.unwrap().index,
            "the snapshot restored at open covers the log up to its index, durably"
        );
        (
            offered.meta.last_log_id.unwrap().index,
            restored.unwrap().index,
        )
    }

    /// openraft builds a snapshot in a task of its own, so an install of a newer snapshot can
    /// finish first (a lagging follower receives the leader's); openraft then purges the log
    /// up to the newer one, and the older image must not replace it in the file (a restart
    /// could not re-apply the purged log) nor be offered to followers.
    #[tokio::test]
    async fn a_build_that_finishes_after_a_newer_install_leaves_the_newer_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let (lagging_dir, ahead_dir) = (dir.path().join("lagging"), dir.path().join("ahead"));
        let mut lagging = ShardMachine::open(&lagging_dir, 0, bounds()).unwrap();
        lagging.apply([membership(1, &[1, 2, 3])]).await.unwrap();
        let mut build = lagging.get_snapshot_builder().await;
        let mut ahead = ShardMachine::open(&ahead_dir, 0, bounds()).unwrap();
        ahead
            .apply([
                membership(1, &[1, 2, 3]),
                membership(2, &[1, 2, 3, 4]),
                membership(3, &[2, 3, 4]),
            ])
            .await
            .unwrap();
        let newer = ahead
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        lagging
            .install_snapshot(&newer.meta, newer.snapshot)
            .await
            .unwrap();
        // Durable: the log store may purge up to it.
        assert_eq!(lagging.info().snapshot_durable.load(Ordering::Acquire), 3);
        let late = build.build_snapshot().await.unwrap();
        assert_eq!(late.meta.last_log_id.unwrap().index, 1);
        assert_eq!(lagging.info().snapshot_durable.load(Ordering::Acquire), 3);
        assert_eq!(snapshot_indexes(&mut lagging, &lagging_dir).await, (3, 3));
    }

    /// A batch of checks, one admitted per key on a fresh table.
    fn checks(index: u64, keys: std::ops::Range<u64>) -> Entry<TypeConfig> {
        use crate::limiter::{Algorithm, Limit, SECOND};
        let limit = Limit::new(Algorithm::Gcra, 10, SECOND, 10).unwrap();
        let commands = keys
            .map(|k| crate::shard::command::Command::Check {
                key: format!("key-{k}"),
                limit: limit.clone(),
                cost: 1,
                request_id: None,
                on_full: crate::policy::OnUnavailable::Deny,
            })
            .collect();
        let batch = crate::shard::command::Batch {
            time: index * 1_000_000,
            commands,
            later: Vec::new(),
            epoch: 1,
        };
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Arc::new(batch)),
        }
    }

    /// openraft takes the builder between two applies and runs the build in a task of its
    /// own while the shard applies on: the image is encoded then, and must be of the state
    /// when the builder was taken (the snapshot's `last_log_id`), not of what was applied
    /// since.
    #[tokio::test]
    async fn a_snapshot_is_of_the_state_its_builder_was_taken_at() {
        let dir = tempfile::tempdir().unwrap();
        let bounds = Bounds {
            max_keys: 1_000_000,
            ..bounds()
        };
        let mut sm = ShardMachine::open(dir.path(), 0, bounds).unwrap();
        sm.apply([membership(1, &[1, 2, 3]), checks(2, 0..20_000)])
            .await
            .unwrap();
        let at_build = lock(&sm.state()).digest();
        let mut build = sm.get_snapshot_builder().await;
        // Applied after the builder was taken: a key changed, keys added, keys evicted.
        let evict = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), 5),
            payload: EntryPayload::Normal(Arc::new(crate::shard::command::Batch {
                time: 10_000_000_000,
                commands: vec![crate::shard::command::Command::Evict],
                later: Vec::new(),
                epoch: 1,
            })),
        };
        sm.apply([checks(3, 0..1), checks(4, 20_000..30_000), evict])
            .await
            .unwrap();
        let now = lock(&sm.state()).digest();
        assert_ne!(now, at_build);
        assert_eq!(lock(&sm.state()).len(), 0, "every key evicted");
        let built = build.build_snapshot().await.unwrap();
        assert_eq!(built.meta.last_log_id.unwrap().index, 2);
        let image = ShardState::from_image(built.snapshot.get_ref(), bounds).unwrap();
        assert_eq!((image.len(), image.digest()), (20_000, at_build));
        assert_eq!(lock(&sm.state()).digest(), now, "the build changed nothing");
    }

    #[tokio::test]
    async fn a_received_image_that_does_not_decode_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = ShardMachine::open(dir.path(), 0, bounds()).unwrap();
        sm.apply([membership(1, &[1, 2, 3])]).await.unwrap();
        let built = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let mut meta = built.meta.clone();
        meta.last_log_id = Some(LogId::new(CommittedLeaderId::new(2, 1), 9));
        let garbage = Box::new(Cursor::new(vec![0xff; 64]));
        assert!(sm.install_snapshot(&meta, garbage).await.is_err());
        assert_eq!(sm.applied_state().await.unwrap().0.unwrap().index, 1);
        assert_eq!(snapshot_indexes(&mut sm, dir.path()).await, (1, 1));
    }
}
