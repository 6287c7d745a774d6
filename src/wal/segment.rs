//! Segment files: their names, which one is authoritative at open, and writing a new one
//! that holds a checkpoint of the live state.
//!
//! Segments are `wal-NNNNNN.log`, numbered from 1. Segment 1 is the log as first created. A
//! segment numbered 2 or more is written by compaction: the live state's records, then the
//! [checkpoint marker](is_checkpoint_marker), then whatever is appended after. Such a segment
//! is *complete* only if a scan reaches the marker: every record before it is intact, so the
//! whole checkpoint is there. Recovery uses the newest complete segment and deletes the rest
//! (see the crash reasoning in [`super`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::record::{encode_into, payload_len, Record, SyncMark, SYNC_MARK_LEN, WAL_GROUP};
use super::recover::{cut_tail, scan_file};

/// The group of the checkpoint marker (no shard has this id).
pub const MARKER_GROUP: u64 = WAL_GROUP;
/// The kind of the checkpoint marker.
pub const MARKER_KIND: u8 = 0xFF;
/// The checkpoint marker's bytes; a caller's record that matches all three is refused.
pub const MARKER_BYTES: &[u8] = b"quorate-wal: checkpoint complete";

/// Whether `(group, kind, bytes)` is the checkpoint marker.
pub fn is_checkpoint_marker(group: u64, kind: u8, bytes: &[u8]) -> bool {
    group == MARKER_GROUP && kind == MARKER_KIND && bytes == MARKER_BYTES
}

/// The file name of segment `seq`.
pub fn segment_name(seq: u64) -> String {
    format!("wal-{seq:06}.log")
}

/// The number in a segment file name, if `name` is one.
fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("wal-")?.strip_suffix(".log")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&seq| seq >= 1)
}

/// The segment numbers present in `dir`, newest first.
fn list_segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut seqs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if let Some(seq) = entry.file_name().to_str().and_then(parse_segment_name) {
            seqs.push(seq);
        }
    }
    seqs.sort_unstable_by(|a, b| b.cmp(a));
    Ok(seqs)
}

/// The segment recovery settled on, its tail cut and its cursor at the end.
pub struct Opened {
    pub file: File,
    pub seq: u64,
    pub path: PathBuf,
    /// Its records without the checkpoint marker.
    pub records: Vec<Record>,
    /// Its length: where the next append goes.
    pub len: u64,
}

/// Opens the newest complete segment in `dir` (creating segment 1 if there is none), cuts its
/// torn tail, and deletes every other segment. Nothing is deleted unless a complete segment
/// was found; with none, the directory is left as it is and the error says why.
pub fn open_newest(dir: &Path, max_payload: u32) -> io::Result<Opened> {
    let seqs = list_segments(dir)?;
    if seqs.is_empty() {
        let path = dir.join(segment_name(1));
        let file = open_rw(&path, false)?;
        sync_dir(dir)?;
        return Ok(Opened {
            file,
            seq: 1,
            path,
            records: Vec::new(),
            len: 0,
        });
    }
    for &seq in &seqs {
        let path = dir.join(segment_name(seq));
        let mut file = open_rw(&path, false)?;
        let scanned = scan_file(&file, max_payload)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let marker_at = scanned
            .records
            .iter()
            .position(|r| is_checkpoint_marker(r.group, r.kind, &r.bytes));
        if seq > 1 && marker_at.is_none() {
            tracing::warn!(
                segment = %path.display(),
                "wal: segment has no complete checkpoint (compaction was cut short); using an older one"
            );
            continue;
        }
        cut_tail(&mut file, &scanned)?;
        // What it holds may be only in the page cache (a process killed, not the machine):
        // synced now, the writer's next sync mark can say all of it was.
        file.sync_data()?;
        let len = scanned.valid_len;
        let mut records = scanned.records;
        if let Some(at) = marker_at.filter(|_| seq > 1) {
            records.remove(at);
        }
        for &other in seqs.iter().filter(|&&other| other != seq) {
            let stale = dir.join(segment_name(other));
            tracing::info!(segment = %stale.display(), "wal: removing a superseded segment");
            std::fs::remove_file(&stale)?;
        }
        sync_dir(dir)?;
        return Ok(Opened {
            file,
            seq,
            path,
            records,
            len,
        });
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "wal: no complete segment in {} (segments {seqs:?} all lack their checkpoint marker)",
            dir.display()
        ),
    ))
}

/// Writes segment `seq` holding `records` then the checkpoint marker, syncs it and the
/// directory (when `sync`), and returns it open with the cursor at the end and its length.
/// On error the caller removes the file (see `remove_partial`).
pub fn write_checkpoint(
    dir: &Path,
    seq: u64,
    records: &[Record],
    max_payload: u32,
    sync: bool,
) -> io::Result<(File, PathBuf, u64)> {
    // Its first record a sync mark covering the whole checkpoint: appends follow with
    // marks saying it was synced, so damage inside it reads as damage, not as a segment cut
    // short (which would send recovery back to the older segment, without those appends).
    let mut buf = vec![0u8; SYNC_MARK_LEN];
    for record in records {
        if is_checkpoint_marker(record.group, record.kind, &record.bytes) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a checkpoint record is the marker",
            ));
        }
        let fits = payload_len(record.bytes.len()).is_some_and(|len| len <= max_payload);
        if !fits {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a checkpoint record of {} bytes exceeds max_record_bytes {max_payload}",
                    record.bytes.len()
                ),
            ));
        }
        encode_into(&mut buf, record.group, record.kind, &record.bytes);
    }
    encode_into(&mut buf, MARKER_GROUP, MARKER_KIND, MARKER_BYTES);
    let mark = SyncMark {
        len: buf.len() as u64,
        synced: 0,
    };
    buf[..SYNC_MARK_LEN].copy_from_slice(&mark.encode());
    let path = dir.join(segment_name(seq));
    let mut file = open_rw(&path, true)?;
    file.write_all(&buf)?;
    if sync {
        file.sync_all()?;
        sync_dir(dir)?;
    }
    Ok((file, path, buf.len() as u64))
}

/// Removes a segment whose checkpoint failed, durably: if the name survived a crash while the
/// log went on in the older segment, recovery would prefer it and lose those appends.
pub fn remove_partial(dir: &Path, path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    sync_dir(dir)
}

fn open_rw(path: &Path, truncate: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(truncate)
        .open(path)
}

/// Makes directory entries durable (a new or removed file is not, on power failure, until its
/// directory is synced). Directories cannot be opened as files on Windows; skip it there.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    if cfg!(unix) {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_round_trip_and_strangers_are_ignored() {
        assert_eq!(segment_name(1), "wal-000001.log");
        assert_eq!(parse_segment_name("wal-000001.log"), Some(1));
        assert_eq!(parse_segment_name("wal-1234567.log"), Some(1_234_567));
        for stranger in [
            "wal-.log",
            "wal-000000.log",
            "wal-00x001.log",
            "wal-000002.log.tmp",
            "notes.txt",
            "wal-+1.log",
        ] {
            assert_eq!(parse_segment_name(stranger), None, "{stranger}");
        }
    }
}
