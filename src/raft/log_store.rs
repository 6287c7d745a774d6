//! Durable Raft log storage for every shard group on a node, in one shared write-ahead log.
//!
//! [`NodeLog::open`] opens the node's [`Wal`], replays it into per-group in-memory state
//! (vote, committed id, purge point, entries by index) and hands out a [`GroupLog`] per group:
//! openraft's storage-v2 [`RaftLogStorage`] and [`RaftLogReader`] for that group. Reads are
//! served from memory; every change is one WAL submission tagged with the group id, so one
//! fsync covers whatever all groups appended meanwhile (group commit).
//!
//! # Records
//! Each record's bytes are bincode 2 (serde, standard configuration):
//!
//! | kind | bytes | replay |
//! |------|-------|--------|
//! | [`kind::VOTE`] | `Vote<u64>` | set the vote |
//! | [`kind::ENTRIES`] | one or more `Entry`, back to back | put each at its index |
//! | [`kind::TRUNCATE`] | `u64` index | delete entries at and after it |
//! | [`kind::PURGE`] | `LogId<u64>` | raise the purge point, delete entries up to it |
//! | [`kind::COMMITTED`] | `Option<LogId<u64>>` | set the committed id |
//!
//! One append is one submission; if its entries exceed one record they are split over several
//! (each a run of whole entries, in order). A record that does not decode fails
//! [`NodeLog::open`] with `InvalidData`: the checksum passed, so it is a bug or a foreign file,
//! not a torn write, and guessing would be worse than stopping.
//!
//! # The contract, and why it holds
//! Every change takes its room in the WAL queue first (the only wait), then, under the group's
//! lock, updates memory and enqueues its submission. So memory and the WAL see each group's
//! changes in the same order, and reads see a change as soon as the call that made it returns.
//! - `save_vote` returns only after its record is durable.
//! - `append` returns once the entries are in memory and queued; its callback is called by the
//!   WAL writer only after the sync that made them durable.
//! - `truncate` returns only after its record is durable, like `save_vote`. It used to ride
//!   on the next append's sync (the WAL is one ordered stream, and what survives a crash is a
//!   prefix of it), but openraft does not always append after a truncation: a follower that
//!   installs a snapshot conflicting with its log truncates its uncommitted entries, purges,
//!   and acknowledges the snapshot with no append. Had a power cut then lost the truncation,
//!   its restart would find the snapshot applied and the stale entries after it still in the
//!   log (openraft then purges to the snapshot and takes the log to end there, while this
//!   store still held them behind the next appends). Conflict truncations are rare (a new
//!   leader's log differing from this follower's uncommitted tail), and so is their sync.
//! - `purge` causes no sync of its own ([`crate::wal::Reserved::submit_unsynced`]): it is
//!   written in its place in the stream and made durable by the next sync. A lost purge only
//!   brings back entries the state machine already covers. But a purge must not be on disk
//!   before the snapshot that covers what it deletes, or a crash between would leave the log
//!   purged past the snapshot on disk (the restart cannot re-apply what is gone). openraft
//!   0.9.25 purged as soon as it had asked for a received snapshot to be installed, while
//!   the install was still writing the file; the vendored openraft runs that purge only
//!   once the install has finished (vendor/README.md, the fourth change), and after a
//!   snapshot this node built the file is durable before openraft hears of it. The store
//!   does not trust this: a purge past the group's durable snapshot
//!   ([`NodeLog::group_after_snapshots`]) is counted (`MachineInfo::early_purges`, a
//!   violation in the simulation) and waits until the snapshot covers it, or fails after a
//!   minute, which stops the group's Raft core on this node with nothing purged. (Skipping
//!   it is not safe: appends past the snapshot would then leave a gap in the log.)
//! - `save_committed` does not even queue a submission: the id is left with the WAL
//!   ([`crate::wal::Wal::defer_latest`], the latest per group) and written after the
//!   writer's next batch of any group, or at close. openraft saves it after every commit on
//!   every node; as its own submission it cost each node a wake of the WAL thread and a
//!   write per entry. On a follower openraft saves a committed id only once the entries it
//!   names are appended and synced here (it answers AppendEntries after the flush), so the
//!   record follows them in the stream wherever it lands. A leader (vendor/openraft, see
//!   vendor/README.md) may commit on its followers' syncs before its own append is synced:
//!   while any append of the group is unsynced, the id is queued as an unsynced record
//!   behind them instead, like a purge. An idle node keeps
//!   its last id in memory only, until some group writes or the WAL closes; a crash loses it.
//!   A lost committed id only means less is re-applied at restart (the next leader's first
//!   commit covers the rest). (It used to cost a sync of its own after every entry on every
//!   node: about 40% of the syncs in the cluster benchmark.)
//! - A crash inside one append's submission keeps a prefix of its entries: a shorter log with
//!   no hole, which is a state Raft already handles (the callback was never called).
//!
//! Compaction: the WAL asks [`NodeLog`] for every group's live state as records (vote, purge
//! point, committed, entries) and writes them as a checkpoint. Replaying a group's records is
//! idempotent on the state they produced, which is what lets the checkpoint run slightly ahead
//! of the writer (see `crate::wal`).
//!
//! Memory: every group's unpurged entries stay in memory; openraft purges them after snapshots.

use std::collections::BTreeMap;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, LogId, OptionalSend, StorageError, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::hooks::{VoteSaved, VoteSink};
use super::state_machine::MachineInfo;
use super::types::{GroupId, NodeId, TypeConfig};
use crate::wal::{Batch, Durable, Record, Reserved, Wal, WalOptions};

/// A Raft log entry of a shard group.
pub type Entry = openraft::Entry<TypeConfig>;

type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// The WAL record kinds this store writes.
pub mod kind {
    pub const VOTE: u8 = 1;
    pub const ENTRIES: u8 = 2;
    pub const TRUNCATE: u8 = 3;
    pub const PURGE: u8 = 4;
    pub const COMMITTED: u8 = 5;
}

/// Encoding: bincode 2's standard configuration.
fn encode<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Decodes one value from the front of `bytes`; returns it and the bytes it used. The limit
/// (no record is larger) keeps a corrupt length from asking for an absurd allocation.
fn decode_prefix<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), String> {
    let config = bincode::config::standard().with_limit::<{ u32::MAX as usize }>();
    bincode::serde::decode_from_slice(bytes, config).map_err(|e| e.to_string())
}

/// Decodes exactly one value filling `bytes`.
fn decode_all<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let (value, used) = decode_prefix(bytes)?;
    if used != bytes.len() {
        return Err(format!("{} trailing bytes", bytes.len() - used));
    }
    Ok(value)
}

/// One group's log as replayed from the WAL and kept up to date in memory.
#[derive(Debug, Default)]
struct GroupState {
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
    entries: BTreeMap<u64, Entry>,
    /// Appends submitted and not yet synced (their callbacks not called).
    unsynced_appends: u64,
}

impl GroupState {
    fn put(&mut self, entry: Entry) {
        self.entries.insert(entry.log_id.index, entry);
    }

    fn truncate(&mut self, since: u64) {
        self.entries.split_off(&since);
    }

    fn purge(&mut self, upto: LogId<NodeId>) {
        if self
            .last_purged
            .is_none_or(|purged| purged.index < upto.index)
        {
            self.last_purged = Some(upto);
        }
        match upto.index.checked_add(1) {
            Some(keep_from) => self.entries = self.entries.split_off(&keep_from),
            None => self.entries.clear(),
        }
    }

    /// Applies one record read back from the WAL.
    fn replay(&mut self, kind: u8, bytes: &[u8]) -> Result<(), String> {
        match kind {
            kind::VOTE => self.vote = Some(decode_all(bytes)?),
            kind::ENTRIES => {
                let mut rest = bytes;
                while !rest.is_empty() {
                    let (entry, used): (Entry, usize) = decode_prefix(rest)?;
                    if used == 0 {
                        return Err("an entry of zero bytes".into());
                    }
                    self.put(entry);
                    rest = &rest[used..];
                }
            }
            kind::TRUNCATE => self.truncate(decode_all(bytes)?),
            kind::PURGE => self.purge(decode_all(bytes)?),
            kind::COMMITTED => self.committed = decode_all(bytes)?,
            other => return Err(format!("unknown record kind {other}")),
        }
        Ok(())
    }

    /// The records that rebuild this state from nothing (none for an empty state).
    fn checkpoint(
        &self,
        group: GroupId,
        max_record: usize,
        out: &mut Vec<Record>,
    ) -> io::Result<()> {
        let record = |kind, bytes| Record { group, kind, bytes };
        if let Some(vote) = &self.vote {
            out.push(record(kind::VOTE, encode(vote)?));
        }
        if let Some(purged) = &self.last_purged {
            out.push(record(kind::PURGE, encode(purged)?));
        }
        if self.committed.is_some() {
            out.push(record(kind::COMMITTED, encode(&self.committed)?));
        }
        let encoded = self.entries.values().map(encode);
        for bytes in entry_records(encoded, max_record)? {
            out.push(record(kind::ENTRIES, bytes));
        }
        Ok(())
    }
}

/// Packs encoded entries into record bodies of at most `max_record` bytes each, in order.
fn entry_records(
    encoded: impl Iterator<Item = io::Result<Vec<u8>>>,
    max_record: usize,
) -> io::Result<Vec<Vec<u8>>> {
    let mut records = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    for entry in encoded {
        let entry = entry?;
        if entry.len() > max_record {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a log entry of {} bytes exceeds the WAL's record limit of {max_record}",
                    entry.len()
                ),
            ));
        }
        if !current.is_empty() && current.len() + entry.len() > max_record {
            records.push(std::mem::take(&mut current));
        }
        current.extend_from_slice(&entry);
    }
    if !current.is_empty() {
        records.push(current);
    }
    Ok(records)
}

type Shared = Arc<Mutex<GroupState>>;
type Groups = Mutex<BTreeMap<GroupId, Shared>>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code panics while holding these locks; if some did, the state is still consistent
    // (each change is applied whole before the guard drops), so carry on rather than cascade.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every Raft group's log on this node, in one WAL.
pub struct NodeLog {
    wal: Wal,
    groups: Arc<Groups>,
    ack_before_durable: bool,
    votes: Option<VoteWatch>,
    /// This node's id ([`NodeLog::set_node`]): a vote of its own, committed, is handed to
    /// openraft as not committed (see [`NodeLog::group_after_snapshots`]).
    node: Option<NodeId>,
}

/// The simulation's view of the votes a node's group logs save (`Hooks::vote`), and its
/// negative control.
#[derive(Clone)]
struct VoteWatch {
    node: NodeId,
    sink: VoteSink,
    /// UNSAFE: report votes saved without writing them.
    forget: bool,
}

impl VoteWatch {
    fn report(&self, group: GroupId, vote: &Vote<NodeId>, restored: bool) {
        (self.sink)(&VoteSaved {
            node: self.node,
            group,
            term: vote.leader_id.term,
            leader: vote.leader_id.node_id,
            committed: vote.committed,
            restored,
        });
    }
}

impl NodeLog {
    /// Opens (or creates) the WAL in `dir` and replays it. Returns the log and the ids of the
    /// groups that have any state on disk.
    ///
    /// Blocking: it reads the whole log. From async code, call it in `spawn_blocking`.
    pub fn open(dir: impl AsRef<Path>, options: WalOptions) -> io::Result<(NodeLog, Vec<GroupId>)> {
        let (wal, records) = Wal::open_with(dir, options)?;
        let mut states: BTreeMap<GroupId, GroupState> = BTreeMap::new();
        for (at, record) in records.iter().enumerate() {
            states
                .entry(record.group)
                .or_default()
                .replay(record.kind, &record.bytes)
                .map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "wal record {at} (group {}, kind {}) does not decode: {e}",
                            record.group, record.kind
                        ),
                    )
                })?;
        }
        drop(records);
        let ids = states.keys().copied().collect();
        let groups: Arc<Groups> = Arc::new(Mutex::new(
            states
                .into_iter()
                .map(|(id, state)| (id, Arc::new(Mutex::new(state))))
                .collect(),
        ));
        let max_record = wal.batch().max_record_bytes();
        let source = Arc::clone(&groups);
        wal.set_snapshot_source(Arc::new(move || checkpoint(&source, max_record)));
        Ok((
            NodeLog {
                wal,
                groups,
                ack_before_durable: false,
                votes: None,
                node: None,
            },
            ids,
        ))
    }

    /// The storage for `group` (created empty if the group has none yet). Handles for the
    /// same group share its state.
    pub fn group(&self, group: GroupId) -> GroupLog {
        let state = Arc::clone(lock(&self.groups).entry(group).or_default());
        GroupLog {
            group,
            wal: self.wal.clone(),
            state,
            ack_before_durable: self.ack_before_durable,
            snapshot: None,
            votes: self.votes.clone(),
        }
    }

    /// [`NodeLog::group`], whose purges go no further than `snapshot` (the group's state
    /// machine's `MachineInfo::snapshot_durable`) covers (see the module docs).
    ///
    /// The entries it holds past that snapshot (replayed from the WAL) count towards the
    /// next one's bytes (`MachineInfo::log_bytes`), so a node restarted on a long log takes
    /// a snapshot soon instead of holding it until as many bytes more have come.
    pub fn group_after_snapshots(&self, group: GroupId, snapshot: Arc<MachineInfo>) -> GroupLog {
        let log = GroupLog {
            snapshot: Some(Arc::clone(&snapshot)),
            ..self.group(group)
        };
        let covered = snapshot.snapshot_durable.load(Ordering::Acquire);
        let (mut held, mut entries) = (0, 0);
        for (_, e) in lock(&log.state).entries.range(covered + 1..) {
            held += encode(e).map_or(0, |bytes| bytes.len() as u64);
            entries += 1;
        }
        snapshot.log_bytes.fetch_add(held, Ordering::Relaxed);
        snapshot.log_entries.fetch_add(entries, Ordering::Relaxed);
        if let Some(watch) = &log.votes {
            // No vote on disk is reported as openraft's default vote (term 0), below any.
            let vote = lock(&log.state).vote.unwrap_or_default();
            watch.report(group, &vote, true);
        }
        // A leader sends its own entries to its followers before they are durable here
        // (vendor/README.md, the first change), so a leader killed before its disk caught
        // up can hold less log than its followers committed. openraft restores a node whose
        // saved vote is its own and committed as that term's leader at once, with the log it
        // has: it would write other entries in that term at indexes its followers hold
        // committed ones for, which they take for the same entries (a log id is a term,
        // a leader and an index), and the committed ones are lost. Handed over as not
        // committed, the vote starts the node as a follower: it leads again only through an
        // election, in a later term, which a node missing committed entries cannot win.
        if let Some(node) = self.node {
            let mut state = lock(&log.state);
            if let Some(vote) = state.vote.as_mut() {
                if vote.committed && vote.leader_id.node_id == node {
                    vote.committed = false;
                }
            }
        }
        log
    }

    /// The groups with state (on disk or handed out since open).
    pub fn groups(&self) -> Vec<GroupId> {
        lock(&self.groups).keys().copied().collect()
    }

    /// `(appends, syncs)` of the shared WAL: submissions made durable and the fsyncs that
    /// did it; `syncs / appends` is the fsync cost per submission.
    pub fn stats(&self) -> (u64, u64) {
        self.wal.stats()
    }

    /// The shared WAL (for its compaction count and test hooks).
    pub fn wal(&self) -> &Wal {
        &self.wal
    }

    /// UNSAFE, for negative controls only: group logs handed out afterwards call `append`'s
    /// callback as soon as the entries are queued, before they are durable.
    #[doc(hidden)]
    pub fn set_unsafe_ack_before_durable(&mut self, on: bool) {
        self.ack_before_durable = on;
    }

    /// This node's id, before any group log is handed out: its own committed vote is then
    /// handed to openraft as not committed ([`NodeLog::group_after_snapshots`]).
    pub fn set_node(&mut self, node: NodeId) {
        self.node = Some(node);
    }

    /// For the simulation: group logs handed out afterwards report to `sink` every vote they
    /// save (once durable) and, from [`NodeLog::group_after_snapshots`], the vote found on
    /// disk. `unsafe_forget` (a negative control) reports votes saved without writing them.
    #[doc(hidden)]
    pub fn watch_votes(&mut self, node: NodeId, sink: VoteSink, unsafe_forget: bool) {
        self.votes = Some(VoteWatch {
            node,
            sink,
            forget: unsafe_forget,
        });
    }
}

/// Every group's live state as records, for the WAL's compaction.
fn checkpoint(groups: &Groups, max_record: usize) -> io::Result<Vec<Record>> {
    let groups: Vec<(GroupId, Shared)> = lock(groups)
        .iter()
        .map(|(&id, state)| (id, Arc::clone(state)))
        .collect();
    let mut out = Vec::new();
    for (id, state) in groups {
        lock(&state).checkpoint(id, max_record, &mut out)?;
    }
    Ok(out)
}

/// One group's Raft log storage (and, cloned, its reader).
#[derive(Clone)]
pub struct GroupLog {
    group: GroupId,
    wal: Wal,
    state: Shared,
    ack_before_durable: bool,
    votes: Option<VoteWatch>,
    /// The group's state machine's info: the last index its snapshot file covers durably,
    /// which no purge passes, and the count of purges that would have. `None`: no check
    /// (tests of the store alone).
    snapshot: Option<Arc<MachineInfo>>,
}

fn storage_error(
    subject: ErrorSubject<NodeId>,
    verb: ErrorVerb,
    e: io::Error,
) -> StorageError<NodeId> {
    StorageError::from_io_error(subject, verb, e)
}

impl GroupLog {
    /// This log's group id.
    pub fn group_id(&self) -> GroupId {
        self.group
    }

    /// A batch holding one record of `kind` with `value` encoded.
    fn one_record<T: Serialize>(&self, kind: u8, value: &T) -> io::Result<Batch> {
        let mut batch = self.wal.batch();
        batch.push(self.group, kind, &encode(value)?)?;
        Ok(batch)
    }

    /// Waits for room in the WAL queue, then, under the group's lock, applies `update` to
    /// memory and enqueues `batch` (so memory and the WAL agree on the order of changes).
    async fn write(
        &self,
        batch: Batch,
        update: impl FnOnce(&mut GroupState),
    ) -> io::Result<Durable> {
        self.stage(batch, update, Reserved::submit).await
    }

    /// [`GroupLog::write`], returning once the record is durable.
    async fn write_synced(
        &self,
        batch: Batch,
        update: impl FnOnce(&mut GroupState),
    ) -> io::Result<()> {
        self.write(batch, update).await?.await
    }

    /// [`GroupLog::write`] for a record nobody waits for: it causes no sync of its own and
    /// rides on the next append's (see the module docs).
    async fn write_unsynced(
        &self,
        batch: Batch,
        update: impl FnOnce(&mut GroupState),
    ) -> io::Result<()> {
        self.stage(batch, update, Reserved::submit_unsynced).await
    }

    /// The steps of both writes: room in the queue, then `update` and `submit` under the
    /// group's lock.
    async fn stage<T>(
        &self,
        batch: Batch,
        update: impl FnOnce(&mut GroupState),
        submit: impl FnOnce(Reserved) -> T,
    ) -> io::Result<T> {
        let reserved = self.wal.reserve(batch).await?;
        let mut state = lock(&self.state);
        update(&mut state);
        Ok(submit(reserved))
    }

    fn entries_batch(&self, entries: &[Entry]) -> io::Result<Batch> {
        let mut batch = self.wal.batch();
        let records = entry_records(entries.iter().map(encode), batch.max_record_bytes())?;
        for bytes in records {
            batch.push(self.group, kind::ENTRIES, &bytes)?;
        }
        Ok(batch)
    }
}

/// The in-memory side of a truncation from `since` (a named step: the negative controls
/// swap the synced write of it for an unsynced one).
fn truncating(since: u64) -> impl FnOnce(&mut GroupState) {
    move |s| s.truncate(since)
}

/// How long a purge that came before the snapshot covering it was durable waits for it
/// before it fails (`GroupLog::purge`; never in practice: see the module docs).
const EARLY_PURGE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// `range` as `start..end` (end `None` for unbounded); `None` if it is empty.
fn index_range(range: &impl RangeBounds<u64>) -> Option<(u64, Option<u64>)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => None,
    };
    match end {
        Some(end) if end <= start => None,
        _ => Some((start, end)),
    }
}

impl RaftLogReader<TypeConfig> for GroupLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry>> {
        let Some((start, end)) = index_range(&range) else {
            return Ok(Vec::new());
        };
        let state = lock(&self.state);
        let found = match end {
            Some(end) => state.entries.range(start..end),
            None => state.entries.range(start..),
        };
        Ok(found.map(|(_, entry)| entry.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for GroupLog {
    type LogReader = GroupLog;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let state = lock(&self.state);
        let last_purged_log_id = state.last_purged;
        let last_log_id = state
            .entries
            .last_key_value()
            .map(|(_, entry)| entry.log_id)
            .or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        let fail = |e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, e);
        let batch = self.one_record(kind::VOTE, vote).map_err(fail)?;
        let vote = *vote;
        if let Some(watch) = self.votes.as_ref().filter(|w| w.forget) {
            lock(&self.state).vote = Some(vote);
            watch.report(self.group, &vote, false);
            return Ok(());
        }
        self.write_synced(batch, |s| s.vote = Some(vote))
            .await
            .map_err(fail)?;
        if let Some(watch) = &self.votes {
            watch.report(self.group, &vote, false);
        }
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        Ok(lock(&self.state).vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        let fail = |e| storage_error(ErrorSubject::Store, ErrorVerb::Write, e);
        // A leader commits before its own append is synced (vendor/README.md), and the
        // negative control's broken store acknowledges entries before they are written: a
        // committed id may then name entries still queued, so it keeps its place in the
        // queue behind them (a deferred record could be written ahead of them).
        if self.ack_before_durable || lock(&self.state).unsynced_appends > 0 {
            let batch = self.one_record(kind::COMMITTED, &committed).map_err(fail)?;
            return self
                .write_unsynced(batch, |s| s.committed = committed)
                .await
                .map_err(fail);
        }
        let bytes = encode(&committed).map_err(fail)?;
        // Not awaited, no sync and no submission of its own: it rides on the WAL's next
        // batch (see the module docs). Under the group's lock, so memory and the deferred
        // record agree.
        let mut state = lock(&self.state);
        self.wal
            .defer_latest(self.group, kind::COMMITTED, &bytes)
            .map_err(fail)?;
        state.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        Ok(lock(&self.state).committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let fail = |e| storage_error(ErrorSubject::Logs, ErrorVerb::Write, e);
        let entries: Vec<Entry> = entries.into_iter().collect();
        let batch = self.entries_batch(&entries).map_err(fail)?;
        if let Some(info) = &self.snapshot {
            info.log_bytes
                .fetch_add(batch.bytes() as u64, Ordering::Relaxed);
            info.log_entries
                .fetch_add(entries.len() as u64, Ordering::Relaxed);
        }
        let reserved = self.wal.reserve(batch).await.map_err(fail)?;
        let mut state = lock(&self.state);
        for entry in entries {
            state.put(entry);
        }
        if self.ack_before_durable {
            // The broken store of the negative control: acknowledges before the sync.
            drop(reserved.submit());
            callback.log_io_completed(Ok(()));
        } else {
            state.unsynced_appends += 1;
            let shared = Arc::clone(&self.state);
            reserved.submit_then(move |result| {
                lock(&shared).unsynced_appends -= 1;
                callback.log_io_completed(result)
            });
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let fail = |e| storage_error(ErrorSubject::Logs, ErrorVerb::Delete, e);
        let since = log_id.index;
        let batch = self.one_record(kind::TRUNCATE, &since).map_err(fail)?;
        // Durable before it returns: no append need follow it (module docs).
        self.write_synced(batch, truncating(since))
            .await
            .map_err(fail)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let fail = |e| storage_error(ErrorSubject::Logs, ErrorVerb::Delete, e);
        if let Some(info) = &self.snapshot {
            let durable = info.snapshot_durable.load(Ordering::Acquire);
            if durable < log_id.index {
                // Not skipped: a skipped purge followed by appends past a snapshot would
                // leave a gap in the log, which a restart cannot read.
                info.early_purges.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    group = self.group,
                    upto = log_id.index,
                    durable,
                    "a log purge came before the snapshot covering it was on disk; it waits"
                );
                // Bounded: should the snapshot never come (its install failed), the error
                // stops the group's Raft core with nothing purged, instead of holding it.
                let covered = async {
                    while info.snapshot_durable.load(Ordering::Acquire) < log_id.index {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                };
                if tokio::time::timeout(EARLY_PURGE_WAIT, covered)
                    .await
                    .is_err()
                {
                    let durable = info.snapshot_durable.load(Ordering::Acquire);
                    return Err(fail(io::Error::other(format!(
                        "purge up to {} before a snapshot covering it was on disk \
                         (durable up to {durable} after {EARLY_PURGE_WAIT:?})",
                        log_id.index
                    ))));
                }
            }
        }
        let batch = self.one_record(kind::PURGE, &log_id).map_err(fail)?;
        // Not awaited: a lost purge is harmless (module docs).
        self.write_unsynced(batch, |s| s.purge(log_id))
            .await
            .map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::log_id;

    fn blank(index: u64) -> Entry {
        Entry {
            log_id: log_id(1, 1, index),
            payload: openraft::EntryPayload::Blank,
        }
    }

    #[test]
    fn entries_pack_into_records_under_the_limit_in_order() {
        let encoded: Vec<Vec<u8>> = vec![vec![1; 4], vec![2; 4], vec![3; 7], vec![4; 1]];
        let records = entry_records(encoded.clone().into_iter().map(Ok), 8).unwrap();
        assert_eq!(
            records,
            vec![[[1; 4], [2; 4]].concat(), [vec![3; 7], vec![4]].concat()]
        );
        let err = entry_records(encoded.into_iter().map(Ok), 6).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_checkpoint_replays_to_the_same_state() {
        let mut state = GroupState::default();
        for i in 1..=6 {
            state.put(blank(i));
        }
        state.purge(log_id(1, 1, 2));
        state.truncate(6);
        state.vote = Some(Vote::new(3, 2));
        state.committed = Some(log_id(1, 1, 4));
        let mut records = Vec::new();
        let one_entry = encode(&blank(3)).unwrap().len();
        state.checkpoint(7, one_entry, &mut records).unwrap();
        assert_eq!(
            records.iter().filter(|r| r.kind == kind::ENTRIES).count(),
            3
        );
        let mut replayed = GroupState::default();
        for r in &records {
            assert_eq!(r.group, 7);
            replayed.replay(r.kind, &r.bytes).unwrap();
        }
        assert_eq!(format!("{replayed:?}"), format!("{state:?}"));
    }

    #[test]
    fn replaying_records_again_on_their_result_changes_nothing() {
        // What lets a checkpoint run ahead of the writer (crate::wal module docs).
        let records = [
            (
                kind::ENTRIES,
                [encode(&blank(1)).unwrap(), encode(&blank(2)).unwrap()].concat(),
            ),
            (kind::TRUNCATE, encode(&2u64).unwrap()),
            (kind::ENTRIES, encode(&blank(2)).unwrap()),
            (kind::PURGE, encode(&log_id::<NodeId>(1, 1, 1)).unwrap()),
            (kind::VOTE, encode(&Vote::<NodeId>::new(2, 1)).unwrap()),
            (
                kind::COMMITTED,
                encode(&Some(log_id::<NodeId>(1, 1, 2))).unwrap(),
            ),
        ];
        for from in 0..records.len() {
            let mut state = GroupState::default();
            for (kind, bytes) in &records {
                state.replay(*kind, bytes).unwrap();
            }
            let once = format!("{state:?}");
            for (kind, bytes) in &records[from..] {
                state.replay(*kind, bytes).unwrap();
            }
            assert_eq!(format!("{state:?}"), once, "replaying from record {from}");
        }
    }

    #[test]
    fn undecodable_records_are_errors_not_panics() {
        let mut state = GroupState::default();
        assert!(state.replay(kind::VOTE, &[0xFF; 3]).is_err());
        assert!(state.replay(kind::ENTRIES, &[0x80]).is_err());
        assert!(state.replay(kind::TRUNCATE, &[]).is_err());
        assert!(state.replay(kind::PURGE, &[1, 2]).is_err());
        assert!(state.replay(kind::COMMITTED, &[7]).is_err());
        assert!(state.replay(99, &[]).is_err());
        let mut vote = encode(&Vote::<NodeId>::new(1, 1)).unwrap();
        vote.push(0);
        assert!(state.replay(kind::VOTE, &vote).is_err(), "trailing bytes");
    }

    #[test]
    fn empty_and_reversed_ranges_read_nothing() {
        assert_eq!(index_range(&(3..3)), None);
        let reversed = (Bound::Included(5), Bound::Excluded(3));
        assert_eq!(index_range(&reversed), None);
        let reversed = (Bound::Included(3), Bound::Included(2));
        assert_eq!(index_range(&reversed), None);
        assert_eq!(index_range(&(3..=3)), Some((3, Some(4))));
        assert_eq!(index_range(&(..)), Some((0, None)));
        assert_eq!(index_range(&(u64::MAX..=u64::MAX)), Some((u64::MAX, None)));
    }
}
