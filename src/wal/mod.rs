//! The node's write-ahead log: one file shared by every Raft group on the node, with group
//! commit.
//!
//! Why one log: each fsync costs a disk round trip (a millisecond or more), and a node runs
//! one Raft group per shard. One log per group would cost one sync per group per batch; one
//! shared log lets a single `fdatasync` cover whatever every group appended meanwhile.
//!
//! What it promises: [`Wal::append`] resolves `Ok` only after the record is written and
//! synced (`File::sync_data`), so an acknowledged record survives a crash or power loss.
//! [`Wal::open`] returns every intact record in append order and truncates a torn or corrupt
//! tail (see [`recover`]). Records are opaque: a group id, a kind byte and bytes.
//!
//! What it does not do yet (issue 4): one segment file (`wal-000001.log`) holds the whole log,
//! so it grows until compaction exists; there is no per-group truncation or purge, no
//! openraft storage adaptor and no lock against two processes opening the same directory.
//!
//! Bounded: at most `queue_records` appends and `queue_bytes` framed bytes are queued or being
//! written at once (later appenders wait), and one record holds at most `max_record_bytes`.
//!
//! An append whose future is dropped after it was queued may still be written: like any log,
//! only `Ok` means durable, and anything not acknowledged may or may not survive.
//! Dropping the last clone of a [`Wal`] waits for the writer to finish its queue and close the
//! file (at most one batch), so a reopen afterwards sees everything that was acknowledged.

pub mod record;
pub mod recover;
mod writer;

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot, Semaphore};

pub use record::Record;
use record::{encode_into, payload_len, FRAME_HEADER, PAYLOAD_HEADER};
use writer::{Request, Settings, Stats};

/// The single segment's file name inside the WAL directory.
pub const SEGMENT_NAME: &str = "wal-000001.log";

/// Tuning and (for tests) safety switches.
#[derive(Debug, Clone)]
pub struct WalOptions {
    /// Largest payload (group + kind + bytes) one record may hold. Larger appends are refused;
    /// on recovery a larger length marks a corrupt tail.
    pub max_record_bytes: u32,
    /// Most appends queued or in the batch being written.
    pub queue_records: usize,
    /// Most framed bytes queued or in the batch being written; at least one maximal record.
    pub queue_bytes: usize,
    /// `true` (the default) syncs every batch. `false` is UNSAFE: acknowledged records can be
    /// lost on power failure. It exists as the negative control for durability tests.
    pub sync: bool,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            max_record_bytes: 16 << 20,
            queue_records: 4096,
            queue_bytes: 64 << 20,
            sync: true,
        }
    }
}

impl WalOptions {
    fn validate(&self) -> io::Result<()> {
        let invalid = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        let max = self.max_record_bytes;
        if (max as usize) < PAYLOAD_HEADER || max > u32::MAX - FRAME_HEADER as u32 {
            return invalid(format!(
                "max_record_bytes {max} must be {PAYLOAD_HEADER}..={}",
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
        Ok(())
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
    stats: Arc<Stats>,
    max_record_bytes: u32,
    path: PathBuf,
    writer: Option<JoinHandle<()>>,
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

    /// Opens (creating the directory and file if missing) the log in `dir`, recovers it, and
    /// starts the writer. Returns every intact record in append order.
    ///
    /// Blocking: it reads the whole log. From async code, call it in `spawn_blocking`.
    pub fn open_with(dir: impl AsRef<Path>, options: WalOptions) -> io::Result<(Wal, Vec<Record>)> {
        options.validate()?;
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)?;
        let path = dir.join(SEGMENT_NAME);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        sync_dir(dir)?;
        let recovered = recover::recover(&mut file, options.max_record_bytes)?;
        let (tx, rx) = mpsc::channel(options.queue_records);
        let stats = Arc::new(Stats::default());
        let settings = Settings {
            max_batch: options.queue_records,
            sync: options.sync,
        };
        let writer = writer::spawn(file, rx, Arc::clone(&stats), settings)?;
        let inner = Inner {
            tx: Some(tx),
            budget: Arc::new(Semaphore::new(options.queue_bytes)),
            stats,
            max_record_bytes: options.max_record_bytes,
            path,
            writer: Some(writer),
        };
        Ok((
            Wal {
                inner: Arc::new(inner),
            },
            recovered.records,
        ))
    }

    /// Appends one record; resolves after it is written and synced (with `sync: true`).
    /// Refuses (`InvalidInput`) a payload over `max_record_bytes`; fails with the writer's
    /// error once a write or sync has failed.
    pub async fn append(&self, group: u64, kind: u8, bytes: &[u8]) -> io::Result<()> {
        let max = self.inner.max_record_bytes;
        let Some(len) = payload_len(bytes.len()).filter(|&len| len <= max) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "wal record of {} payload bytes exceeds max_record_bytes {max}",
                    bytes.len().saturating_add(PAYLOAD_HEADER)
                ),
            ));
        };
        let frame_len = len + FRAME_HEADER as u32;
        let permit = Arc::clone(&self.inner.budget)
            .acquire_many_owned(frame_len)
            .await
            .map_err(|_| stopped())?;
        let mut frame = Vec::with_capacity(frame_len as usize);
        encode_into(&mut frame, group, kind, bytes);
        let (done, result) = oneshot::channel();
        let request = Request {
            frame,
            done,
            _permit: permit,
        };
        let tx = self.inner.tx.as_ref().ok_or_else(stopped)?;
        tx.send(request).await.map_err(|_| stopped())?;
        result.await.map_err(|_| stopped())?
    }

    /// `(appends, syncs)` so far: records made durable (written, with `sync: false`) and the
    /// syncs that covered them. `syncs / appends` is the fsync cost per append.
    pub fn stats(&self) -> (u64, u64) {
        let stats = &self.inner.stats;
        (
            stats.appends.load(Ordering::Relaxed),
            stats.syncs.load(Ordering::Relaxed),
        )
    }

    /// The segment file's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
}

fn stopped() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "wal writer stopped")
}

/// Makes the segment's directory entry durable (a new file is lost on power failure until its
/// directory is synced). Directories cannot be opened as files on Windows; skip it there.
fn sync_dir(dir: &Path) -> io::Result<()> {
    if cfg!(unix) {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}
