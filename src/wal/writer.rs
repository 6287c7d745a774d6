//! The single writer: group commit on a dedicated thread.
//!
//! Blocking file I/O must not run on the async workers, and group commit needs exactly one
//! place where writes happen, so the log file belongs to one std thread. It sleeps until an
//! append arrives, then takes every append queued meanwhile (those that arrived while the
//! previous `fdatasync` ran), writes them with one `write_all` and syncs once, and only then
//! completes all their futures. N concurrent appenders therefore cost about N / batch syncs.
//!
//! After a failed write or sync the file's state is unknown (a partial write may sit at the
//! end, and after a failed fsync the kernel may have dropped the dirty pages), so the writer
//! poisons itself: that batch and every later append fail. Writing on after garbage would put
//! acknowledged records behind a tail that recovery truncates.

use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

/// Above this, the batch buffer's capacity is released after each batch.
const KEEP_BATCH_CAPACITY: usize = 1 << 20;

/// One queued append: its framed bytes, whom to tell, and its share of the byte budget
/// (released when the request is dropped, after the batch is done).
pub struct Request {
    pub frame: Vec<u8>,
    pub done: oneshot::Sender<io::Result<()>>,
    pub _permit: OwnedSemaphorePermit,
}

/// Counters for tests and benchmarks: records made durable, and syncs that did it.
#[derive(Debug, Default)]
pub struct Stats {
    pub appends: AtomicU64,
    pub syncs: AtomicU64,
}

/// How the writer behaves.
pub struct Settings {
    /// Most requests taken into one batch (the queue's capacity).
    pub max_batch: usize,
    /// `false` skips `fdatasync` — unsafe, for negative controls only.
    pub sync: bool,
}

/// Starts the writer thread. It ends when every sender is gone and the queue is empty.
pub fn spawn(
    file: File,
    rx: mpsc::Receiver<Request>,
    stats: Arc<Stats>,
    settings: Settings,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("quorate-wal".into())
        .spawn(move || run(file, rx, &stats, &settings))
}

fn run(mut file: File, mut rx: mpsc::Receiver<Request>, stats: &Stats, settings: &Settings) {
    let mut waiting: Vec<Request> = Vec::new();
    let mut batch: Vec<u8> = Vec::new();
    let mut poisoned: Option<(io::ErrorKind, String)> = None;
    while let Some(first) = rx.blocking_recv() {
        waiting.push(first);
        while waiting.len() < settings.max_batch {
            match rx.try_recv() {
                Ok(next) => waiting.push(next),
                Err(_) => break,
            }
        }
        let outcome = match &poisoned {
            Some(reason) => Err(reason.clone()),
            None => write_batch(&mut file, &mut batch, &waiting, stats, settings.sync)
                .map_err(|e| (e.kind(), e.to_string())),
        };
        if let Err(reason) = &outcome {
            if poisoned.is_none() {
                tracing::error!(error = %reason.1, "wal: write failed; the log refuses further appends");
                poisoned = Some(reason.clone());
            }
        }
        for request in waiting.drain(..) {
            let result = match &outcome {
                Ok(()) => Ok(()),
                Err((kind, msg)) => Err(io::Error::new(*kind, format!("wal poisoned: {msg}"))),
            };
            // The appender may have given up (dropped its future); nothing to tell then.
            let _ = request.done.send(result);
        }
        if batch.capacity() > KEEP_BATCH_CAPACITY {
            batch = Vec::new();
        }
    }
}

fn write_batch(
    file: &mut File,
    batch: &mut Vec<u8>,
    waiting: &[Request],
    stats: &Stats,
    sync: bool,
) -> io::Result<()> {
    batch.clear();
    for request in waiting {
        batch.extend_from_slice(&request.frame);
    }
    file.write_all(batch)?;
    if sync {
        file.sync_data()?;
        stats.syncs.fetch_add(1, Ordering::Relaxed);
    }
    stats
        .appends
        .fetch_add(waiting.len() as u64, Ordering::Relaxed);
    Ok(())
}
