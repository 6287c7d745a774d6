//! The node's write-ahead log: one log shared by every Raft group on the node, with group
//! commit and compaction.
//!
//! Why one log: each fsync costs a disk round trip (a millisecond or more), and a node runs
//! one Raft group per shard. One log per group would cost one sync per group per batch; one
//! shared log lets a single `fdatasync` cover whatever every group appended meanwhile.
//!
//! # What it promises
//! - A *submission* is one or more records ([`Batch`]). [`Wal::reserve`] waits for room in
//!   the bounded queue; [`Reserved::submit`] then enqueues synchronously, so submissions enter
//!   the log in the order `submit` is called, and returns a [`Durable`] future that resolves
//!   `Ok` only after the records are written and synced (`File::sync_data`).
//!   [`Reserved::submit_then`] calls a function instead (on the writer thread). [`Wal::append`]
//!   is the one-record, wait-for-it form. [`Reserved::submit_unsynced`] enqueues records that
//!   nobody waits for and that cause no sync of their own: they become durable with the next
//!   sync any later submission causes. [`Wal::defer_latest`] does not even queue: its record
//!   (the latest per group and kind) is written after the writer's next batch, or at close.
//! - Completions come in queue order, and one sync covers everything written before it, so a
//!   completed submission vouches for every earlier one: the log on disk is always a *prefix*
//!   of the submission stream.
//! - A submission's records are written contiguously, in order, in one write. A crash can
//!   cut the writes after the last sync: recovery drops a cut write whole (its sync mark gives
//!   its length), so a submission survives whole or not at all; and it refuses a log whose
//!   damaged record a later write's mark says was synced (see [`recover`]).
//! - [`Wal::open`] returns every intact record in append order up to a torn write, and cuts
//!   that write and everything after it; a log whose damaged record was synced it refuses
//!   (see [`recover`]). Records are opaque: a group id, a kind byte and bytes.
//!
//! Bounded: at most `queue_records` submissions and `queue_bytes` framed bytes are queued or
//! being written at once (later submitters wait in `reserve`), one record holds at most
//! `max_record_bytes`, and one submission at most `queue_bytes`.
//!
//! A submission whose future is dropped after it was queued is still written: like any log,
//! only `Ok` means durable, and anything not acknowledged may or may not survive.
//! Dropping the last clone of a [`Wal`] waits for the writer to finish its queue and close the
//! file (at most one batch), so a reopen afterwards sees everything that was acknowledged.
//!
//! # Segments and compaction
//! The log lives in numbered segment files (`wal-000001.log`, `wal-000002.log`, ...); one is
//! current. Once the current segment reaches `compact_bytes` (and at least twice the size of
//! its own checkpoint, so a large live state does not compact after every batch), and a
//! [`SnapshotSource`] is set, the writer thread, between two batches:
//! 1. asks the source for the live state as records (for the Raft store: every group's vote,
//!    committed id, purge point and entries);
//! 2. writes them to segment N+1, then a checkpoint marker record, then syncs the file and the
//!    directory;
//! 3. appends from then on to N+1, and deletes segment N.
//!
//! Recovery uses the newest *complete* segment — segment 1, or one whose scan reaches its
//! checkpoint marker — and deletes every other one. Crash reasoning, step by step:
//! - before the marker is durable (during 2): N+1 is incomplete (the scan stops at the first
//!   bad record, so it cannot reach a marker with anything torn before it); recovery deletes
//!   it and uses N, which is untouched and holds everything acknowledged;
//! - after 2: N+1 is complete and its name durable, so recovery picks it; no append went to
//!   N+1 before its directory entry was synced, and no append went to N after the checkpoint
//!   was taken (one thread does both), so nothing acknowledged is missing;
//! - during 3: N is superseded and deleted again at open.
//!
//! A failure in step 2 removes N+1 (and syncs the directory) and carries on in N; if even that
//! fails, the log poisons itself, since a surviving N+1 would hide later appends to N.
//!
//! Why the checkpoint may include records still queued: the source reads state that
//! submitters update *before* they submit, so the checkpoint can be slightly ahead of what was
//! written. Those queued records are then written after it, i.e. replayed twice. The Raft
//! store's records are idempotent per group (set vote, set committed, put entry at index,
//! delete a range, raise the purge point: replaying a suffix of them on the state they led to
//! changes nothing), so this is harmless, and each group's checkpoint is still a prefix of that
//! group's records that includes everything written. Across groups no order is kept or needed.
//!
//! A member holds its data directory with a [`DirLock`] (taken before the WAL opens), so two
//! processes never append to one WAL. Not done: compaction stalls appends while it writes (a
//! checkpoint of the live state, normally small next to 64 MiB).

mod lock;
pub mod record;
pub mod recover;
mod segment;
mod writer;

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

pub use lock::{DirLock, LOCK_FILE};
pub use record::Record;
use record::{encode_into, payload_len, FRAME_HEADER, PAYLOAD_HEADER};
pub use segment::segment_name;
use writer::{Done, Notify, Request, Settings, Shared};

/// The first segment's file name inside the WAL directory.
pub const SEGMENT_NAME: &str = "wal-000001.log";

/// Produces the live state as records, for compaction; called on the writer thread.
pub type SnapshotSource = Arc<dyn Fn() -> io::Result<Vec<Record>> + Send + Sync>;

/// Tuning and (for tests) safety switches.
#[derive(Debug, Clone)]
pub struct WalOptions {
    /// Largest payload (group + kind + bytes) one record may hold. Larger appends are refused;
    /// on recovery a larger length marks a corrupt tail.
    pub max_record_bytes: u32,
    /// Most submissions queued or in the batch being written.
    pub queue_records: usize,
    /// Most framed bytes queued or in the batch being written; at least one maximal record.
    /// Also the largest one submission may be.
    pub queue_bytes: usize,
    /// Compact once the current segment is this long (and twice its checkpoint); only with a
    /// [`SnapshotSource`] set.
    pub compact_bytes: u64,
    /// `true` (the default) syncs every batch that holds a submission other than an unsynced
    /// one ([`Reserved::submit_unsynced`]). `false` is UNSAFE: acknowledged records can be
    /// lost on power failure. It exists as the negative control for durability tests.
    pub sync: bool,
    /// UNSAFE, negative controls only: hold written records in process memory (flushed at
    /// 8 MiB, before compaction and on close) as a volatile disk cache would, so that a
    /// process crash loses acknowledged records the way a power cut loses unsynced ones.
    pub unsafe_volatile: bool,
    /// Run the writer as a task on the opener's tokio runtime, doing its file I/O inline
    /// (blocking that runtime for each batch), instead of on its own thread. For the
    /// deterministic simulation only: a thread's progress is outside simulated time, a task
    /// on the simulated host's runtime is not. Must be opened from within a tokio runtime.
    pub writer_on_runtime: bool,
    /// Keep the segment file zero-filled this far ahead of the appends, so a sync need not
    /// write the file's size (see `Writer::extend`); 0 turns it off. Only with `sync`.
    pub preallocate_bytes: u64,
    /// Append with `O_DIRECT` where the file system takes it (Linux; with `sync` and
    /// preallocation in whole 4 KiB blocks): less CPU per synced append (see
    /// `writer::Direct`). Falls back to the page cache by itself.
    pub direct_io: bool,
    /// Tests of real processes only: before each batch, while this file exists, the writer
    /// waits and writes and syncs nothing (a disk whose syncs stall), so a test can check
    /// what a node does while its appends are not durable (`--test-hold-wal-while`). A file
    /// that reads `fail` fails the batch instead (a failed disk: the log poisons itself).
    pub hold_while: Option<std::path::PathBuf>,
    /// The data directory's lock ([`DirLock`]), held until the log is closed: after the
    /// last handle is dropped and the writer has finished.
    pub dir_lock: Option<Arc<DirLock>>,
    /// The simulation only, with `writer_on_runtime`: while this is set the writer takes
    /// no batch (it checks again every simulated millisecond), a disk whose writes stall;
    /// what it has not written is lost if the host crashes meanwhile. The thread writer
    /// ignores it (`hold_while` is the real processes' stall).
    pub stall: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            max_record_bytes: 16 << 20,
            queue_records: 4096,
            queue_bytes: 64 << 20,
            compact_bytes: 64 << 20,
            sync: true,
            unsafe_volatile: false,
            writer_on_runtime: false,
            preallocate_bytes: 1 << 20,
            direct_io: true,
            hold_while: None,
            dir_lock: None,
            stall: None,
        }
    }
}

impl WalOptions {
    fn validate(&self) -> io::Result<()> {
        let invalid = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        let max = self.max_record_bytes;
        // The log's own records (the checkpoint marker, sync marks) must fit: a scan bounded
        // below them would take the first one for a torn tail and cut the log there.
        let least = PAYLOAD_HEADER + segment::MARKER_BYTES.len().max(16);
        if (max as usize) < least || max > u32::MAX - FRAME_HEADER as u32 {
            return invalid(format!(
                "max_record_bytes {max} must be {least}..={}",
                u32::MAX - FRAME_HEADER as u32
            ));
        }
        let frame = max as usize + FRAME_HEADER;
        if self.queue_bytes < frame || self.queue_bytes > Semaphore::MAX_PERMITS {
            return invalid(format!(
                "queue_bytes {} must hold one maximal record ({frame} bytes) and be at most {}",
                self.queue_bytes,
                Semaphore::MAX_PERMITS
            ));
        }
        if self.queue_records == 0 {
            return invalid("queue_records must be at least 1".into());
        }
        if self.compact_bytes == 0 {
            return invalid("compact_bytes must be at least 1".into());
        }
        Ok(())
    }

    /// The most framed bytes one submission may hold.
    fn max_submission(&self) -> usize {
        self.queue_bytes.min(u32::MAX as usize)
    }
}

/// Records to be written as one submission: contiguous and in order.
pub struct Batch {
    frames: Vec<u8>,
    records: usize,
    max_record_bytes: u32,
}

impl Batch {
    /// Adds a record. Refuses (`InvalidInput`) a payload over `max_record_bytes`, the
    /// checkpoint marker's exact record, and the sync marks' group and kind.
    pub fn push(&mut self, group: u64, kind: u8, bytes: &[u8]) -> io::Result<()> {
        let max = self.max_record_bytes;
        if payload_len(bytes.len()).filter(|&len| len <= max).is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "wal record of {} payload bytes exceeds max_record_bytes {max}",
                    bytes.len().saturating_add(PAYLOAD_HEADER)
                ),
            ));
        }
        if segment::is_checkpoint_marker(group, kind, bytes) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the wal reserves this record as its checkpoint marker",
            ));
        }
        if group == record::WAL_GROUP && kind == record::SYNC_MARK_KIND {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the wal reserves this group and kind for its sync marks",
            ));
        }
        encode_into(&mut self.frames, group, kind, bytes);
        self.records += 1;
        Ok(())
    }

    /// The most caller bytes one record may hold.
    pub fn max_record_bytes(&self) -> usize {
        self.max_record_bytes as usize - PAYLOAD_HEADER
    }

    /// Bytes of the records pushed so far, as the log will hold them (framing included).
    pub fn bytes(&self) -> usize {
        self.frames.len()
    }

    /// Records pushed so far.
    pub fn len(&self) -> usize {
        self.records
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Bytes on disk so far.
    pub fn framed_len(&self) -> usize {
        self.frames.len()
    }
}

/// A submission with its room in the queue reserved: submitting it cannot block or fail.
pub struct Reserved {
    frames: Vec<u8>,
    permit: mpsc::OwnedPermit<Request>,
    budget: OwnedSemaphorePermit,
}

impl Reserved {
    /// Enqueues the records now (behind every earlier `submit`); the future resolves once they
    /// are durable. Dropping the future does not withdraw them.
    pub fn submit(self) -> Durable {
        let (tx, rx) = oneshot::channel();
        self.send(Done::new(Notify::Channel(tx)));
        Durable { rx }
    }

    /// Enqueues the records now; `then` is called with the outcome once they are durable (or
    /// failed). It runs on the writer thread: it must be quick and must not block.
    pub fn submit_then(self, then: impl FnOnce(io::Result<()>) + Send + 'static) {
        self.send(Done::new(Notify::Callback(Box::new(then))));
    }

    /// Enqueues the records now, behind every earlier `submit`, without a sync of their
    /// own: they are written with the writer's next batch and become durable with the next
    /// sync that any later submission causes. A crash before it may lose them, but only
    /// together with everything submitted after them (recovery keeps a prefix of the
    /// stream). For records nobody needs to wait for: each such sync cost as much CPU as an
    /// append's in the cluster benchmark, and held the next append's sync behind it.
    pub fn submit_unsynced(self) {
        self.send_as(Done::nobody(), false);
    }

    fn send(self, done: Done) {
        self.send_as(done, true);
    }

    fn send_as(self, done: Done, sync: bool) {
        // If the writer is gone the request is dropped, and dropping `done` reports the
        // failure (see `writer::Done`).
        self.permit.send(Request {
            frames: self.frames,
            done,
            sync,
            _permit: self.budget,
        });
    }
}

/// Resolves once a submission is durable; `Err` if it failed or the writer stopped.
pub struct Durable {
    rx: oneshot::Receiver<io::Result<()>>,
}

impl Future for Durable {
    type Output = io::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| Err(stopped())))
    }
}

/// A handle to the log; clones share one file and one writer.
#[derive(Clone)]
pub struct Wal {
    inner: Arc<Inner>,
}

struct Inner {
    tx: Option<mpsc::Sender<Request>>,
    budget: Arc<Semaphore>,
    shared: Arc<Shared>,
    max_record_bytes: u32,
    max_submission: usize,
    writer: Option<JoinHandle<()>>,
    /// Dropped after `drop` has joined the writer.
    _dir_lock: Option<Arc<DirLock>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue lets the writer drain it and exit; joining means the file is
        // closed when the last handle is gone.
        self.tx.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Wal {
    /// [`Wal::open_with`] with the default options.
    pub fn open(dir: impl AsRef<Path>) -> io::Result<(Wal, Vec<Record>)> {
        Wal::open_with(dir, WalOptions::default())
    }

    /// Opens (creating the directory and first segment if missing) the log in `dir`, recovers
    /// it from its newest complete segment, and starts the writer. Returns every intact record
    /// in append order (a checkpoint's records first).
    ///
    /// Blocking: it reads the whole segment. From async code, call it in `spawn_blocking`.
    pub fn open_with(dir: impl AsRef<Path>, options: WalOptions) -> io::Result<(Wal, Vec<Record>)> {
        options.validate()?;
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)?;
        let opened = segment::open_newest(dir, options.max_record_bytes)?;
        let (tx, rx) = mpsc::channel(options.queue_records);
        let shared = Arc::new(Shared::default());
        *shared.path.lock().unwrap_or_else(PoisonError::into_inner) = opened.path;
        let settings = Settings {
            max_batch: options.queue_records,
            sync: options.sync,
            volatile: options.unsafe_volatile,
            compact_bytes: options.compact_bytes,
            max_record_bytes: options.max_record_bytes,
            preallocate: options.preallocate_bytes,
            direct_io: options.direct_io,
            hold_while: options.hold_while.clone(),
        };
        let segment = writer::Segment {
            dir: dir.to_path_buf(),
            file: opened.file,
            seq: opened.seq,
            len: opened.len,
        };
        let writer = if options.writer_on_runtime {
            writer::spawn_task(
                segment,
                rx,
                Arc::clone(&shared),
                settings,
                options.stall.clone(),
            );
            None
        } else {
            Some(writer::spawn(segment, rx, Arc::clone(&shared), settings)?)
        };
        let inner = Inner {
            tx: Some(tx),
            budget: Arc::new(Semaphore::new(options.queue_bytes)),
            shared,
            max_record_bytes: options.max_record_bytes,
            max_submission: options.max_submission(),
            writer,
            _dir_lock: options.dir_lock.clone(),
        };
        Ok((
            Wal {
                inner: Arc::new(inner),
            },
            opened.records,
        ))
    }

    /// An empty submission for this log.
    pub fn batch(&self) -> Batch {
        Batch {
            frames: Vec::new(),
            records: 0,
            max_record_bytes: self.inner.max_record_bytes,
        }
    }

    /// Waits for room in the queue for `batch`. Refuses (`InvalidInput`) a batch over
    /// `queue_bytes`. An empty batch is a barrier: it completes once everything submitted
    /// before it is durable.
    pub async fn reserve(&self, batch: Batch) -> io::Result<Reserved> {
        let len = batch.frames.len();
        if len > self.inner.max_submission {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "wal submission of {len} bytes exceeds queue_bytes {}",
                    self.inner.max_submission
                ),
            ));
        }
        let tx = self.inner.tx.as_ref().ok_or_else(stopped)?.clone();
        let budget = Arc::clone(&self.inner.budget)
            .acquire_many_owned(len as u32)
            .await
            .map_err(|_| stopped())?;
        let permit = tx.reserve_owned().await.map_err(|_| stopped())?;
        Ok(Reserved {
            frames: batch.frames,
            permit,
            budget,
        })
    }

    /// [`Wal::reserve`] then [`Reserved::submit`].
    pub async fn submit(&self, batch: Batch) -> io::Result<Durable> {
        Ok(self.reserve(batch).await?.submit())
    }

    /// Appends one record; resolves after it is written and synced (with `sync: true`).
    /// Refuses (`InvalidInput`) a payload over `max_record_bytes`; fails with the writer's
    /// error once a write or sync has failed.
    pub async fn append(&self, group: u64, kind: u8, bytes: &[u8]) -> io::Result<()> {
        let mut batch = self.batch();
        batch.push(group, kind, bytes)?;
        self.submit(batch).await?.await
    }

    /// Sets where compaction reads the live state from; without one the log never compacts.
    /// The records it returns must, replayed alone, rebuild the state every record written so
    /// far built (see the module docs).
    pub fn set_snapshot_source(&self, source: SnapshotSource) {
        *self
            .inner
            .shared
            .source
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(source);
    }

    /// Whether the log refuses every append after a failed write (it poisoned itself).
    pub fn failed(&self) -> bool {
        self.inner.shared.stats.failed.load(Ordering::Relaxed)
    }

    /// `(appends, syncs)` so far: submissions written (made durable by a sync, unless the
    /// WAL runs with `sync: false` or they were [`Reserved::submit_unsynced`] and no later
    /// sync has come yet) and the syncs that covered them. `syncs / appends` is the fsync
    /// cost per submission.
    pub fn stats(&self) -> (u64, u64) {
        let stats = &self.inner.shared.stats;
        (
            stats.appends.load(Ordering::Relaxed),
            stats.syncs.load(Ordering::Relaxed),
        )
    }

    /// Batches written with `O_DIRECT` so far ([`WalOptions::direct_io`]); 0 where the file
    /// system refused it and the log appends through the page cache.
    pub fn direct_writes(&self) -> u64 {
        self.inner
            .shared
            .stats
            .direct_writes
            .load(Ordering::Relaxed)
    }

    /// Leaves a record to ride on the writer's next batch, written after that batch's
    /// submissions, without waking the writer or queueing a submission; it is durable with
    /// the next sync after that. A later record of the same `(group, kind)` not yet written
    /// replaces it, so only the latest is written. The writer's close writes what is left.
    ///
    /// For a record nobody waits for, whose value supersedes the earlier ones, and which
    /// refers only to records already durable when it is deferred (the Raft log's committed
    /// id, deferred only while its group has no unsynced append: see `raft::log_store`).
    /// Written later than its call, it can still only follow those records in the stream. A
    /// crash loses it if no batch was written after it (it is in memory only until then).
    pub fn defer_latest(&self, group: u64, kind: u8, bytes: &[u8]) -> io::Result<()> {
        let mut one = self.batch();
        one.push(group, kind, bytes)?;
        self.inner
            .shared
            .deferred
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((group, kind), one.frames);
        Ok(())
    }

    /// Compactions done since open.
    pub fn compactions(&self) -> u64 {
        self.inner.shared.stats.compactions.load(Ordering::Relaxed)
    }

    /// The current segment file's path.
    pub fn path(&self) -> PathBuf {
        self.inner
            .shared
            .path
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// For tests: while the guard lives the writer writes and syncs nothing (submissions
    /// queue up), so a test can check what happens before a submission is durable.
    #[doc(hidden)]
    pub fn hold_writer(&self) -> MutexGuard<'_, ()> {
        self.inner
            .shared
            .hold
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn stopped() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "wal writer stopped")
}
