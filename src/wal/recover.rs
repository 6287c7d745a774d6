//! Recovery: read every intact record from the start of the log and cut the file at the first
//! one that is not.
//!
//! A crash can leave the last write half done (a short header, a short payload, a zero-filled
//! tail) and a bad disk can flip bits. Either way the first record that fails its bounds or its
//! checksum ends the log: it and everything after it are truncated, and the truncation is
//! synced before the log accepts new appends, so a later append can never be hidden behind
//! garbage. An I/O *error* while reading is returned, never mistaken for a torn tail: cutting
//! the file because of a transient EIO would delete acknowledged records.
//!
//! Memory: one payload buffer at a time, at most the configured maximum, and only after the
//! file is known to be long enough to hold it. The returned records are the whole segment;
//! compaction (see [`super`]) keeps a segment near the size of the live state.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};

use super::record::{decode_payload, Header, Record, FRAME_HEADER};

/// What recovery found.
#[derive(Debug)]
pub struct Recovered {
    /// Every intact record, in log order.
    pub records: Vec<Record>,
    /// The length of the intact prefix: where the next append goes.
    pub valid_len: u64,
    /// Bytes cut off the end (0 for a clean log).
    pub truncated: u64,
}

/// Why the scan stopped before the end of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Torn {
    ShortHeader,
    AbsurdLength(u32),
    ShortPayload,
    BadChecksum,
}

/// What a read-only scan of one segment found; [`cut_tail`] then makes it the file's length.
#[derive(Debug)]
pub struct Scanned {
    /// Every intact record, in log order.
    pub records: Vec<Record>,
    /// The length of the intact prefix.
    pub valid_len: u64,
    /// The file's length when scanned.
    pub file_len: u64,
    /// Why the scan stopped early, if it did.
    pub torn: Option<Torn>,
}

/// Reads every intact record of `file` from the start without changing the file (a segment
/// that recovery may reject must not be cut first).
pub fn scan_file(file: &File, max_payload: u32) -> io::Result<Scanned> {
    let file_len = file.metadata()?.len();
    let mut reader = file;
    reader.seek(SeekFrom::Start(0))?;
    let (records, valid_len, torn) = scan(&mut BufReader::new(reader), file_len, max_payload)?;
    Ok(Scanned {
        records,
        valid_len,
        file_len,
        torn,
    })
}

/// Truncates `file` after its intact prefix (syncing the truncation) and leaves the cursor at
/// the end, where the next append goes. Returns the bytes cut off.
pub fn cut_tail(file: &mut File, scanned: &Scanned) -> io::Result<u64> {
    let truncated = scanned.file_len.saturating_sub(scanned.valid_len);
    if truncated > 0 {
        if zeros_from(file, scanned.valid_len)? {
            // The writer's zero-filled room (see `WalOptions::preallocate_bytes`), left by a
            // crash or kill: nothing was torn.
            tracing::info!(
                bytes = truncated,
                at = scanned.valid_len,
                "wal: zero-filled room after the last record dropped"
            );
        } else {
            tracing::warn!(
                truncated_bytes = truncated,
                at = scanned.valid_len,
                reason = ?scanned.torn,
                records = scanned.records.len(),
                "wal: torn or corrupt tail truncated"
            );
        }
        file.set_len(scanned.valid_len)?;
        file.sync_all()?;
    }
    file.seek(SeekFrom::Start(scanned.valid_len))?;
    Ok(truncated)
}

/// Whether every byte of `file` from `at` to its end is zero.
fn zeros_from(file: &mut File, at: u64) -> io::Result<bool> {
    file.seek(SeekFrom::Start(at))?;
    let mut reader = BufReader::new(&*file);
    let mut buf = [0u8; 8192];
    loop {
        match read_up_to(&mut reader, &mut buf)? {
            0 => return Ok(true),
            n if buf[..n].iter().any(|&b| b != 0) => return Ok(false),
            _ => {}
        }
    }
}

/// Scans `file` from the start, truncates it after the last intact record (syncing the
/// truncation), and leaves the cursor at the end.
pub fn recover(file: &mut File, max_payload: u32) -> io::Result<Recovered> {
    let scanned = scan_file(file, max_payload)?;
    let truncated = cut_tail(file, &scanned)?;
    Ok(Recovered {
        valid_len: scanned.valid_len,
        records: scanned.records,
        truncated,
    })
}

/// Reads records until the end or the first bad one; returns them, the intact length, and why
/// it stopped early (if it did).
fn scan(
    reader: &mut impl Read,
    file_len: u64,
    max_payload: u32,
) -> io::Result<(Vec<Record>, u64, Option<Torn>)> {
    let mut records = Vec::new();
    let mut offset = 0u64;
    loop {
        let mut raw = [0u8; FRAME_HEADER];
        match read_up_to(reader, &mut raw)? {
            0 => return Ok((records, offset, None)),
            FRAME_HEADER => {}
            _ => return Ok((records, offset, Some(Torn::ShortHeader))),
        }
        let header = Header::parse(raw);
        if !header.plausible(max_payload) {
            return Ok((records, offset, Some(Torn::AbsurdLength(header.len))));
        }
        let end = offset + FRAME_HEADER as u64 + u64::from(header.len);
        if end > file_len {
            return Ok((records, offset, Some(Torn::ShortPayload)));
        }
        let mut payload = vec![0u8; header.len as usize];
        if read_up_to(reader, &mut payload)? != payload.len() {
            return Ok((records, offset, Some(Torn::ShortPayload)));
        }
        match decode_payload(header, payload) {
            Some(record) => records.push(record),
            None => return Ok((records, offset, Some(Torn::BadChecksum))),
        }
        offset = end;
    }
}

/// Fills `buf` as far as the reader allows; returns how many bytes it got (short only at EOF).
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
