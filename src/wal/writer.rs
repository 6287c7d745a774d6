//! The single writer: group commit and compaction on a dedicated thread.
//!
//! Blocking file I/O must not run on the async workers, and group commit needs exactly one
//! place where writes happen, so the log file belongs to one std thread. It sleeps until a
//! submission arrives, then takes every submission queued meanwhile (those that arrived while
//! the previous `fdatasync` ran), writes them with one write (`O_DIRECT` where it can, see
//! [`Direct`]) and syncs once (unless all
//! of them are unsynced submissions, see [`Request::sync`]), and only then
//! completes them all, in queue order. N concurrent appenders therefore cost about N / batch
//! syncs. Completing in order means a completion also vouches for everything queued before.
//!
//! After a failed write or sync the file's state is unknown (a partial write may sit at the
//! end, and after a failed fsync the kernel may have dropped the dirty pages), so the writer
//! poisons itself: that batch and every later submission fail. Writing on after garbage would
//! put acknowledged records behind a tail that recovery truncates.
//!
//! Compaction runs here too, between batches, so no append can slip between the checkpoint
//! and the switch to the new segment (see [`super`] for why that matters).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use super::record::{SyncMark, SYNC_MARK_LEN};
use super::segment;
use super::SnapshotSource;

/// Above this, the batch buffer's capacity is released after each batch.
const KEEP_BATCH_CAPACITY: usize = 1 << 20;

/// Whom to tell when a submission is durable (or failed). Dropped untold (the writer is
/// gone), it tells of the failure.
pub struct Done(Option<Notify>);

pub enum Notify {
    /// A future ([`super::Durable`]) waits on the other end.
    Channel(oneshot::Sender<io::Result<()>>),
    /// Called on the writer thread; must be quick and must not block.
    Callback(Box<dyn FnOnce(io::Result<()>) + Send>),
}

impl Done {
    pub fn new(notify: Notify) -> Done {
        Done(Some(notify))
    }

    /// Nobody to tell (an unsynced submission: see [`Request::sync`]).
    pub fn nobody() -> Done {
        Done(None)
    }

    fn complete(mut self, result: io::Result<()>) {
        match self.0.take() {
            // The submitter may have given up (dropped its future); nothing to tell then.
            Some(Notify::Channel(tx)) => {
                let _ = tx.send(result);
            }
            Some(Notify::Callback(f)) => f(result),
            None => {}
        }
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        if self.0.is_some() {
            let done = Done(self.0.take());
            done.complete(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "wal writer stopped",
            )));
        }
    }
}

/// One queued submission: its framed records (written as one contiguous run), whom to tell,
/// and its share of the byte budget (released when the request is dropped, after completion).
pub struct Request {
    pub frames: Vec<u8>,
    pub done: Done,
    /// `false`: written in its place in the stream, but no reason for a sync of its own. It
    /// becomes durable with the next sync any later request causes (a batch of only such
    /// requests is written without one). For records nobody waits for, whose loss in a
    /// crash is harmless together with everything after them (see `raft::log_store`).
    pub sync: bool,
    pub _permit: OwnedSemaphorePermit,
}

/// Counters for tests and benchmarks.
#[derive(Debug, Default)]
pub struct Stats {
    /// Submissions written (and synced, unless `Settings::sync` is off or all of the batch's
    /// requests were unsynced ones).
    pub appends: AtomicU64,
    /// Batch syncs that did it (compaction's own syncs are not counted).
    pub syncs: AtomicU64,
    /// Checkpoints written and switched to.
    pub compactions: AtomicU64,
    /// Batches written with `O_DIRECT` (see [`Direct`]).
    pub direct_writes: AtomicU64,
    /// The log poisoned itself after a failed write: it refuses every append from then on.
    pub failed: std::sync::atomic::AtomicBool,
}

/// State the writer shares with the [`super::Wal`] handles.
#[derive(Default)]
pub struct Shared {
    pub stats: Stats,
    /// The current segment's path (it changes at each compaction).
    pub path: Mutex<PathBuf>,
    /// Where compaction gets the live state from; none means no compaction.
    pub source: Mutex<Option<SnapshotSource>>,
    /// Held by the writer while it writes and syncs a batch; a test holding it stalls the
    /// writer deterministically (see `Wal::hold_writer`).
    pub hold: Mutex<()>,
    /// Framed records left to ride on the writer's next batch, the latest per (group, kind)
    /// (see [`super::Wal::defer_latest`]).
    pub deferred: Mutex<BTreeMap<(u64, u8), Vec<u8>>>,
}

impl Shared {
    /// Takes the deferred records, appending their frames to `out`; whether there were any.
    fn take_deferred(&self, out: &mut Vec<u8>) -> bool {
        let taken =
            std::mem::take(&mut *self.deferred.lock().unwrap_or_else(PoisonError::into_inner));
        for frames in taken.values() {
            out.extend_from_slice(frames);
        }
        !taken.is_empty()
    }
}

/// How the writer behaves.
pub struct Settings {
    /// Most requests taken into one batch (the queue's capacity).
    pub max_batch: usize,
    /// `false` skips every sync — unsafe, for negative controls only.
    pub sync: bool,
    /// UNSAFE, negative controls only: keep written batches in a process-memory cache
    /// (flushed at 8 MiB, before compaction and on close), as a volatile disk cache would,
    /// so a crash (kill -9) loses what was acknowledged since the last flush.
    pub volatile: bool,
    /// Compact once the segment is at least this long (and at least twice its checkpoint).
    pub compact_bytes: u64,
    pub max_record_bytes: u32,
    /// Zero-fill the segment this far ahead of the appends (0: off); see [`Writer::extend`].
    pub preallocate: u64,
    /// Append with `O_DIRECT` where it can (see [`Direct`]).
    pub direct_io: bool,
    /// While this file exists, no batch is written; one that reads `fail` fails the batch
    /// (see `WalOptions::hold_while`).
    pub hold_while: Option<PathBuf>,
}

/// The segment being appended to.
pub struct Segment {
    pub dir: PathBuf,
    pub file: File,
    pub seq: u64,
    pub len: u64,
}

/// Starts the writer thread. It ends when every sender is gone and the queue is empty.
pub fn spawn(
    segment: Segment,
    rx: mpsc::Receiver<Request>,
    shared: Arc<Shared>,
    settings: Settings,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("quorate-wal".into())
        .spawn(move || Writer::new(segment, shared, settings).run(rx))
}

/// Starts the writer as a task on the current tokio runtime (see
/// `WalOptions::writer_on_runtime`): the same loop, its I/O done inline. Dropping the runtime
/// drops the writer with whatever its `volatile` cache holds, as a crash would, and with
/// whatever a `stall` kept it from writing.
pub fn spawn_task(
    segment: Segment,
    mut rx: mpsc::Receiver<Request>,
    shared: Arc<Shared>,
    settings: Settings,
    stall: Option<Arc<std::sync::atomic::AtomicBool>>,
) {
    let mut writer = Writer::new(segment, shared, settings);
    tokio::spawn(async move {
        let mut waiting: Vec<Request> = Vec::new();
        let mut batch: Vec<u8> = Vec::new();
        while let Some(first) = rx.recv().await {
            // A stalled disk (see `WalOptions::stall`): nothing is written until it clears.
            while stall.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            waiting.push(first);
            writer.write_waiting(&mut rx, &mut waiting, &mut batch);
        }
        writer.close(&mut batch);
    });
}

type Poison = (io::ErrorKind, String);

struct Writer {
    segment: Segment,
    shared: Arc<Shared>,
    settings: Settings,
    /// Length of the current segment's checkpoint (0 for a segment not made by compaction).
    base_len: u64,
    /// No compaction before the segment reaches this (pushed on after a failed attempt).
    next_compaction_at: u64,
    poisoned: Option<Poison>,
    /// The `volatile` cache (see [`Settings::volatile`]).
    cache: Vec<u8>,
    /// The current segment file's length: `segment.len` plus the zero-filled room ahead.
    allocated: u64,
    /// Appends through `O_DIRECT` (see [`Direct`]); `None` where they go through the page
    /// cache.
    direct: Option<Direct>,
    /// The file system refused `O_DIRECT` (at open or on a write): not tried again, not even
    /// for the next segment.
    direct_refused: bool,
    /// Every byte of the current segment before this offset is synced: what the next
    /// write's sync mark says (see [`super::recover`]).
    synced: u64,
    /// The segment's length after the last closing mark (see [`Writer::seal`]).
    sealed: u64,
}

/// Zeros written per call when extending a segment.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// The `volatile` cache is written out at this size.
const VOLATILE_FLUSH: usize = 8 << 20;

impl Writer {
    fn new(segment: Segment, shared: Arc<Shared>, settings: Settings) -> Writer {
        let next_compaction_at = settings.compact_bytes;
        let allocated = segment.len;
        let mut writer = Writer {
            allocated,
            segment,
            shared,
            settings,
            base_len: 0,
            next_compaction_at,
            poisoned: None,
            cache: Vec::new(),
            direct: None,
            direct_refused: false,
            // The segment was synced as recovery opened it.
            synced: allocated,
            sealed: 0,
        };
        writer.open_direct();
        writer
    }

    /// Opens the current segment for `O_DIRECT` appends where that pays: appends into
    /// zero-filled room (preallocation in whole blocks, with syncs, not `volatile`) on a
    /// file system that takes `O_DIRECT`. Otherwise, or if anything fails, appends go
    /// through the page cache as before.
    fn open_direct(&mut self) {
        self.direct = None;
        if !self.settings.direct_io
            || self.direct_refused
            || !self.preallocating()
            || self.settings.preallocate % DIRECT_BLOCK != 0
        {
            return;
        }
        match Direct::open(&self.segment) {
            Ok(direct) => self.direct = Some(direct),
            Err(e) => {
                self.direct_refused = true;
                tracing::info!(error = %e, "wal: O_DIRECT appends unavailable here; appending through the page cache")
            }
        }
    }

    fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut waiting: Vec<Request> = Vec::new();
        let mut batch: Vec<u8> = Vec::new();
        while let Some(first) = rx.blocking_recv() {
            waiting.push(first);
            self.write_waiting(&mut rx, &mut waiting, &mut batch);
        }
        self.close(&mut batch);
    }

    /// Whether appends go to zero-filled room (see [`Writer::extend`]).
    fn preallocating(&self) -> bool {
        self.settings.preallocate > 0 && self.settings.sync && !self.settings.volatile
    }

    /// Makes the file at least `end` long by writing zeros after the current allocation, up
    /// to the next multiple of `preallocate` past `end`, then puts the cursor back at the end
    /// of the log. No sync of its own (the batch's `sync_data` that follows covers it),
    /// except with `O_DIRECT` appends: see the end of the function.
    ///
    /// Why: appending past the end of a file changes its size, so every `fdatasync` must also
    /// write the inode, a second I/O that waits for the first. Overwriting zeros that are
    /// already on disk leaves the size alone, so the sync writes the data blocks only (on
    /// this machine's ext4: 0.24 -> 0.11 ms p50 per 4 KiB `fdatasync`, and a third less CPU).
    /// Holes or `fallocate` would not do: their blocks are allocated (or marked written) at
    /// the first write, which is again metadata. Recovery reads the zeros as a torn tail
    /// (length 0, see [`super::record`]) and cuts them; a clean close trims them.
    fn extend(&mut self, end: u64) -> io::Result<()> {
        let chunk = self.settings.preallocate;
        let target = (end / chunk + 1).saturating_mul(chunk);
        let file = &mut self.segment.file;
        file.seek(SeekFrom::Start(self.allocated))?;
        let mut left = target - self.allocated;
        while left > 0 {
            let n = left.min(ZEROS.len() as u64) as usize;
            file.write_all(&ZEROS[..n])?;
            left -= n as u64;
        }
        file.seek(SeekFrom::Start(self.segment.len))?;
        if self.direct.is_some() {
            // An `O_DIRECT` write into a range with dirty cached pages first writes them back
            // and waits; synced now, the zeros cost one sync per `preallocate` bytes instead.
            file.sync_data()?;
        }
        self.allocated = target;
        Ok(())
    }

    /// On close: cuts the zero-filled room off, so a clean log ends at its last record.
    /// Failure costs nothing but a zero tail that the next open cuts.
    fn trim(&mut self) {
        if self.poisoned.is_some() || self.allocated <= self.segment.len {
            return;
        }
        let file = &self.segment.file;
        let trimmed = file
            .set_len(self.segment.len)
            .and_then(|()| file.sync_all());
        match trimmed {
            Ok(()) => self.allocated = self.segment.len,
            Err(e) => tracing::warn!(error = %e, "wal: could not trim the preallocated tail"),
        }
    }

    /// Takes what else is queued behind `waiting`'s first request, writes and syncs it all
    /// once, completes every request in order, and compacts if due.
    fn write_waiting(
        &mut self,
        rx: &mut mpsc::Receiver<Request>,
        waiting: &mut Vec<Request>,
        batch: &mut Vec<u8>,
    ) {
        while waiting.len() < self.settings.max_batch {
            match rx.try_recv() {
                Ok(next) => waiting.push(next),
                Err(_) => break,
            }
        }
        let outcome = match &self.poisoned {
            Some(reason) => Err(reason.clone()),
            None => self
                .write_batch(batch, waiting)
                .map_err(|e| (e.kind(), e.to_string())),
        };
        if let Err(reason) = &outcome {
            self.poison(reason.clone());
        }
        for request in waiting.drain(..) {
            let result = match &outcome {
                Ok(()) => Ok(()),
                Err((kind, msg)) => Err(io::Error::new(*kind, format!("wal poisoned: {msg}"))),
            };
            request.done.complete(result);
        }
        if batch.capacity() > KEEP_BATCH_CAPACITY {
            *batch = Vec::new();
        }
        if self.poisoned.is_none() && self.compaction_due() {
            let _ = self.flush_cache();
            self.compact();
        }
    }

    /// On close: writes what is still deferred (with a sync: a clean close keeps it), the
    /// `volatile` cache, and trims the zero-filled room.
    fn close(&mut self, batch: &mut Vec<u8>) {
        batch.clear();
        batch.resize(SYNC_MARK_LEN, 0);
        if self.poisoned.is_none() && self.shared.take_deferred(batch) {
            if let Err(e) = self.write_deferred(batch) {
                // Poisoned, `trim` leaves the file alone (recovery cuts what was torn).
                self.poison((e.kind(), e.to_string()));
            }
        }
        let _ = self.flush_cache();
        if let Err(e) = self.seal(batch) {
            self.poison((e.kind(), e.to_string()));
        }
        self.trim();
    }

    /// On close: syncs what is not, then writes (and syncs) a write of its sync mark alone,
    /// saying all of it was synced. Without a mark after it, damage to the last write while
    /// the node is stopped would read as a torn tail at the next open, and be cut (see
    /// [`super::recover`]). Not in the unsafe modes, and not twice at the same length.
    fn seal(&mut self, batch: &mut Vec<u8>) -> io::Result<()> {
        if self.poisoned.is_some()
            || !self.settings.sync
            || self.settings.volatile
            || self.segment.len == 0
            || self.segment.len == self.sealed
        {
            return Ok(());
        }
        if self.synced < self.segment.len {
            self.segment.file.sync_data()?;
            self.synced = self.segment.len;
        }
        batch.clear();
        batch.resize(SYNC_MARK_LEN, 0);
        self.write_out(batch)?;
        self.segment.file.sync_data()?;
        self.synced = self.segment.len;
        self.sealed = self.segment.len;
        Ok(())
    }

    fn write_deferred(&mut self, batch: &mut [u8]) -> io::Result<()> {
        self.write_out(batch)?;
        if self.settings.sync && !self.settings.volatile {
            self.segment.file.sync_data()?;
            self.synced = self.segment.len;
        }
        Ok(())
    }

    /// Writes out the `volatile` cache (a no-op without it).
    fn flush_cache(&mut self) -> io::Result<()> {
        if !self.cache.is_empty() {
            self.segment.file.write_all(&self.cache)?;
            self.cache.clear();
        }
        Ok(())
    }

    fn poison(&mut self, reason: Poison) {
        if self.poisoned.is_none() {
            tracing::error!(error = %reason.1, "wal: write failed; the log refuses further appends");
            self.poisoned = Some(reason);
            self.shared.stats.failed.store(true, Ordering::Relaxed);
        }
    }

    fn write_batch(&mut self, batch: &mut Vec<u8>, waiting: &[Request]) -> io::Result<()> {
        batch.clear();
        // Room for the sync mark, filled in by `write_out`.
        batch.resize(SYNC_MARK_LEN, 0);
        for request in waiting {
            batch.extend_from_slice(&request.frames);
        }
        if let Some(file) = &self.settings.hold_while {
            while file.exists() {
                if std::fs::read(file).is_ok_and(|c| c.starts_with(b"fail")) {
                    return Err(io::Error::other(
                        "test: the disk failed (hold file says fail)",
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let shared = Arc::clone(&self.shared);
        let _hold = shared.hold.lock().unwrap_or_else(PoisonError::into_inner);
        // After the requests: a deferred record follows everything submitted before it was
        // deferred that is not in a later batch (see `Wal::defer_latest` for why that order
        // is enough).
        shared.take_deferred(batch);
        self.write_out(batch)?;
        let stats = &self.shared.stats;
        if self.settings.sync && waiting.iter().any(|r| r.sync) {
            self.segment.file.sync_data()?;
            stats.syncs.fetch_add(1, Ordering::Relaxed);
            if !self.settings.volatile {
                self.synced = self.segment.len;
            }
        }
        stats
            .appends
            .fetch_add(waiting.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Appends `batch` at the end of the segment (into the `volatile` cache in that mode),
    /// extending the zero-filled room first if needed. No sync. Its first `SYNC_MARK_LEN`
    /// bytes are the room for its sync mark: filled in here.
    fn write_out(&mut self, batch: &mut [u8]) -> io::Result<()> {
        let mark = SyncMark {
            len: batch.len() as u64,
            synced: self.synced,
        };
        batch[..SYNC_MARK_LEN].copy_from_slice(&mark.encode());
        let batch: &[u8] = batch;
        let end = self.segment.len + batch.len() as u64;
        if self.preallocating() && end > self.allocated {
            self.extend(end)?;
        }
        // An `O_DIRECT` write covers whole blocks, from the start of the partial last one.
        let padded_end = self.direct.as_ref().map(|d| {
            let blocks = (d.tail.len() + batch.len()).next_multiple_of(DIRECT_BLOCK as usize);
            d.block_start(self.segment.len) + blocks as u64
        });
        if let Some(padded_end) = padded_end.filter(|&e| e > self.allocated) {
            self.extend(padded_end)?;
        }
        let start = self.segment.len;
        // Counted before the write: a failed write leaves `len` past the real end, which only
        // matters for compaction, and the log is poisoned then anyway.
        self.segment.len = end;
        if let Some(direct) = &mut self.direct {
            match direct.append(start, batch) {
                Ok(()) => {
                    self.shared
                        .stats
                        .direct_writes
                        .fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                // The file system refuses the write (an alignment or O_DIRECT itself it
                // does not take): through the page cache from now on. Whatever part was
                // written holds the right bytes; the write below writes it all again.
                Err(e) if refused(&e) => {
                    tracing::info!(error = %e, "wal: O_DIRECT append refused; appending through the page cache");
                    self.direct = None;
                    self.direct_refused = true;
                }
                Err(e) => return Err(e),
            }
        }
        if self.settings.volatile {
            self.cache.extend_from_slice(batch);
            if self.cache.len() >= VOLATILE_FLUSH {
                self.segment.file.write_all(&self.cache)?;
                self.cache.clear();
            }
        } else {
            // Positional: O_DIRECT writes do not move the file's cursor. (The `volatile`
            // cache above appends at the cursor; that mode never writes any other way.)
            self.segment.file.write_all_at(batch, start)?;
        }
        Ok(())
    }

    fn compaction_due(&self) -> bool {
        let len = self.segment.len;
        len >= self.next_compaction_at && len >= self.base_len.saturating_mul(2)
    }

    /// Writes the live state into the next segment and switches to it. A failure before the
    /// switch leaves the log in the old segment (tried again after another `compact_bytes`);
    /// a failure that leaves it unknown which segment recovery would choose poisons the log.
    fn compact(&mut self) {
        let source = self
            .shared
            .source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(source) = source else {
            return;
        };
        self.next_compaction_at = self.segment.len.saturating_add(self.settings.compact_bytes);
        let records = match source() {
            Ok(records) => records,
            Err(e) => {
                tracing::error!(error = %e, "wal: the live state could not be read; compaction skipped");
                return;
            }
        };
        let dir = self.segment.dir.clone();
        let seq = self.segment.seq + 1;
        let written = segment::write_checkpoint(
            &dir,
            seq,
            &records,
            self.settings.max_record_bytes,
            self.settings.sync,
        );
        let (file, path, len) = match written {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(error = %e, "wal: compaction failed; staying in the old segment");
                let partial = dir.join(segment::segment_name(seq));
                if let Err(e) = segment::remove_partial(&dir, &partial) {
                    // The partial segment might outlive a crash and be preferred: stop here.
                    self.poison((e.kind(), format!("removing a failed checkpoint: {e}")));
                }
                return;
            }
        };
        let old = std::mem::replace(
            &mut self.segment,
            Segment {
                dir: dir.clone(),
                file,
                seq,
                len,
            },
        );
        *self
            .shared
            .path
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = path;
        self.base_len = len;
        // The checkpoint was synced whole before the switch (unless syncs are off).
        self.synced = if self.settings.sync { len } else { 0 };
        self.allocated = len;
        self.open_direct();
        self.next_compaction_at = self.settings.compact_bytes;
        self.shared
            .stats
            .compactions
            .fetch_add(1, Ordering::Relaxed);
        let old_path = dir.join(segment::segment_name(old.seq));
        drop(old.file);
        // Recovery removes a superseded segment too, so a failure here costs only disk space.
        let removed = std::fs::remove_file(&old_path).and_then(|()| {
            if self.settings.sync {
                segment::sync_dir(&dir)
            } else {
                Ok(())
            }
        });
        if let Err(e) = removed {
            tracing::warn!(error = %e, segment = %old_path.display(), "wal: could not remove the old segment");
        }
        tracing::info!(
            segment = seq,
            checkpoint_bytes = len,
            records = records.len(),
            "wal: compacted"
        );
    }
}

/// Whether a failed `O_DIRECT` write means the file system does not take such writes
/// (rather than a failing disk): EINVAL (an alignment it wants otherwise), EOPNOTSUPP.
fn refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)
    )
}

/// The block size `O_DIRECT` appends are aligned to (memory, file offset and length): 4 KiB,
/// which every device's logical block size divides.
const DIRECT_BLOCK: u64 = 4096;

/// `O_DIRECT` appends to the current segment.
///
/// Why: synced after a page-cache write, an append costs the page cache's writeback of the
/// dirty page (locking, tagging, submitting it) before the device flush; written with
/// `O_DIRECT` into the same zero-filled room and then synced, it costs 0.77x the CPU and
/// 0.94x the p50 latency on this machine (`benches/wal_sync.rs`; docs/benchmarks.md). The
/// durability contract is unchanged: the batch's `sync_data` still follows, flushing the
/// device's cache.
///
/// How: `O_DIRECT` writes whole aligned blocks from aligned memory, so each append rewrites
/// the partial block at the end of the log (`tail`: the records already in it, unchanged)
/// followed by the batch, padded with zeros to a whole block. The zeros land in the
/// zero-filled room ahead (`Writer::extend` keeps the padded end inside it), so the file's
/// size does not change. A crash mid-write leaves the tail's bytes as they were (written
/// again with the same values) and recovery cuts a torn batch as before; a page-cache
/// write-back rewrites the whole page the same way.
struct Direct {
    /// The segment file, opened again with `O_DIRECT`.
    file: File,
    /// The bytes of the log's last partial block (`len % DIRECT_BLOCK` of them).
    tail: Vec<u8>,
    /// Storage for the write buffer: `append` writes from its first 4 KiB boundary.
    buf: Vec<u8>,
}

impl Direct {
    #[cfg(target_os = "linux")]
    fn open(segment: &Segment) -> io::Result<Direct> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = segment.dir.join(segment::segment_name(segment.seq));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        let keep = segment.len % DIRECT_BLOCK;
        let mut tail = vec![0; keep as usize];
        segment.file.read_exact_at(&mut tail, segment.len - keep)?;
        Ok(Direct {
            file,
            tail,
            buf: Vec::new(),
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn open(_: &Segment) -> io::Result<Direct> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "O_DIRECT appends are implemented for Linux only",
        ))
    }

    /// Where the block holding the log's end `len` starts.
    fn block_start(&self, len: u64) -> u64 {
        len - self.tail.len() as u64
    }

    /// Writes `batch` at `len`, the log's end: the tail block and the batch, zero-padded to
    /// whole blocks, in one aligned write. On success the tail is the new last partial block.
    fn append(&mut self, len: u64, batch: &[u8]) -> io::Result<()> {
        let start = self.block_start(len);
        let data = self.tail.len() + batch.len();
        let padded = data.next_multiple_of(DIRECT_BLOCK as usize);
        let block = DIRECT_BLOCK as usize;
        // Aligned storage: `padded` bytes from the first 4 KiB boundary in `buf`.
        self.buf.clear();
        self.buf.resize(padded + block, 0);
        let at = self.buf.as_ptr().align_offset(block);
        let out = &mut self.buf[at..at + padded];
        out[..self.tail.len()].copy_from_slice(&self.tail);
        out[self.tail.len()..data].copy_from_slice(batch);
        self.file.write_all_at(out, start)?;
        let keep = data % block;
        self.tail.clear();
        self.tail.extend_from_slice(&out[data - keep..data]);
        if self.buf.capacity() > KEEP_BATCH_CAPACITY {
            self.buf = Vec::new();
        }
        Ok(())
    }
}
