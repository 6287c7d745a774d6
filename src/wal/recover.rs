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
//! Torn or damaged? A crash can tear only what was written after the last sync. Every write
//! the writer makes begins with a sync mark ([`SyncMark`]): the write's length, and how far
//! the segment had been synced before it. At a bad record, recovery finds the end of the
//! write holding it (by that write's mark; for a bad mark, by reading on record by record
//! from the mark's fixed length) and follows the marks of the writes after it, each at the
//! offset the one before gives. A mark saying the segment had been synced past the bad record
//! proves it was durable, so a disk damaged it since; cutting there would silently drop
//! acknowledged entries and votes that the rest of the cluster counts on (a node that forgets
//! its vote can vote twice in a term). The log is then refused with an error naming the
//! offsets, and nothing is cut. Where the damage took the marks with it (a block of zeros or
//! of other bytes over a write's mark), they cannot be followed: recovery then looks at every
//! offset after the bad record for an intact mark that says so, from which the marks lead to
//! the log's end ([`mark_beyond`]). Otherwise (no later mark says so: the writes after the
//! last sync, a log written before sync marks) the bad record is a torn tail, and the log is
//! cut at the start of the write holding it (nothing in a write that was not synced was
//! acknowledged), so it always ends where a write ended and the marks' lengths keep leading
//! to marks. Following lengths, a record's bytes (which a client chooses, through its keys)
//! are never taken for a mark; the search past damage looks through them, and
//! [`mark_beyond`] says why that is safe. A log begun by a build without marks (until its
//! first compaction) takes a bad first record for a mark too, so the records after it are
//! read from where a mark would end, and a mark found that way could refuse the log (the safe
//! side: nothing is cut). In such a log, damage before its first mark is cut as a torn tail,
//! as it was before marks.
//!
//! A clean close ends the log with a write of a mark alone (see `writer`), so after one, the
//! last write is covered too; after a crash, the writes since the last sync are not.
//!
//! Memory: one payload buffer at a time, at most the configured maximum, and only after the
//! file is known to be long enough to hold it. The returned records are the whole segment;
//! compaction (see [`super`]) keeps a segment near the size of the live state.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};

use std::os::unix::fs::FileExt;

use super::record::{decode_payload, Header, Record, SyncMark, FRAME_HEADER, SYNC_MARK_LEN};

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
    /// The file ends inside a write (by its sync mark's length).
    ShortWrite,
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
    let Scan {
        mut records,
        bad,
        torn,
        write,
    } = scan(&mut BufReader::new(reader), file_len, max_payload)?;
    let mut valid_len = bad;
    // A segment's first byte begins a write (a bad first mark, then, is a mark).
    let write = write.or((bad == 0).then_some(Write {
        start: 0,
        end: 0,
        records_before: 0,
    }));
    if let (Some(why), Some(w)) = (torn, write) {
        // The write the bad record is in (or, if it begins one, whose mark it is).
        let next = if bad < w.end {
            Some(w.end)
        } else {
            // The bad record is a write's mark: a mark's length is fixed, and the write's
            // records follow it, each at the offset the one before gives, up to the next mark.
            next_mark(file, bad + SYNC_MARK_LEN as u64, file_len, max_payload)?
        };
        let followed = match next {
            Some(at) => synced_past(file, at, bad, file_len)?,
            None => None,
        };
        // The damage may have taken the marks that lead past it with it (a zeroed or
        // overwritten block): then the first intact mark after it that says so, if the
        // marks from it lead to the log's end.
        let proof = match followed {
            Some(at) => Some(at),
            None => mark_beyond(file, bad, file_len)?,
        };
        if let Some(mark_at) = proof {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "wal: the record at byte {bad} is damaged ({why:?}), and the write at byte \
                     {mark_at} says the log was synced past it: a disk damaged durable records, \
                     this is not a torn write. Nothing was cut ({} bytes follow). This node's \
                     log cannot be trusted: replace the node (a fresh id and an empty data \
                     directory; docs/operations.md, \"Replacing a failed member\")",
                    file_len - bad
                ),
            ));
        }
        if bad < w.end {
            // A torn write goes whole, its mark too (it was not synced, so nothing in it was
            // acknowledged): the log then ends at a write's end, where the next one's mark
            // goes, and every mark's length still leads to the next mark.
            valid_len = w.start;
            records.truncate(w.records_before);
        }
    }
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
        if zeros_at(file, scanned.valid_len, scanned.file_len)? {
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

/// The last write a scan entered, by its sync mark.
#[derive(Debug, Clone, Copy)]
struct Write {
    start: u64,
    end: u64,
    /// Records (not marks) before it.
    records_before: usize,
}

/// What [`scan`] read.
struct Scan {
    /// The intact records before `bad`, without sync marks.
    records: Vec<Record>,
    /// The offset of the first bad record (the end, if none).
    bad: u64,
    /// Why it stopped early, if it did.
    torn: Option<Torn>,
    /// The write it stopped in or right after (by the last sync mark read; `None` in a log
    /// without marks).
    write: Option<Write>,
}

/// Reads records until the end or the first bad one.
fn scan(reader: &mut impl Read, file_len: u64, max_payload: u32) -> io::Result<Scan> {
    let mut records = Vec::new();
    let mut offset = 0u64;
    let mut write: Option<Write> = None;
    let stopped = loop {
        let mut raw = [0u8; FRAME_HEADER];
        match read_up_to(reader, &mut raw)? {
            0 if write.is_some_and(|w| w.end > offset) => break Torn::ShortWrite,
            0 => {
                return Ok(Scan {
                    records,
                    bad: offset,
                    torn: None,
                    write: None,
                })
            }
            FRAME_HEADER => {}
            _ => break Torn::ShortHeader,
        }
        let header = Header::parse(raw);
        if !header.plausible(max_payload) {
            break Torn::AbsurdLength(header.len);
        }
        let end = offset + FRAME_HEADER as u64 + u64::from(header.len);
        if end > file_len {
            break Torn::ShortPayload;
        }
        let mut payload = vec![0u8; header.len as usize];
        if read_up_to(reader, &mut payload)? != payload.len() {
            break Torn::ShortPayload;
        }
        match decode_payload(header, payload) {
            Some(record) => match SyncMark::of(&record) {
                Some(mark) => {
                    write = Some(Write {
                        start: offset,
                        end: offset.saturating_add(mark.len),
                        records_before: records.len(),
                    })
                }
                None => records.push(record),
            },
            None => break Torn::BadChecksum,
        }
        offset = end;
    };
    // A write that ended before the stop without a mark after it: not a log of marks there.
    Ok(Scan {
        records,
        bad: offset,
        torn: Some(stopped),
        write: write.filter(|w| w.end >= offset),
    })
}

/// The offset of the first sync mark at or after `at`, reading record by record (each at the
/// offset the one before gives), if every record up to it is intact.
fn next_mark(file: &File, mut at: u64, file_len: u64, max_payload: u32) -> io::Result<Option<u64>> {
    loop {
        let mut raw = [0u8; FRAME_HEADER];
        if at.saturating_add(FRAME_HEADER as u64) > file_len {
            return Ok(None);
        }
        file.read_exact_at(&mut raw, at)?;
        let header = Header::parse(raw);
        let end = at + FRAME_HEADER as u64 + u64::from(header.len);
        if !header.plausible(max_payload) || end > file_len {
            return Ok(None);
        }
        let mut payload = vec![0u8; header.len as usize];
        file.read_exact_at(&mut payload, at + FRAME_HEADER as u64)?;
        match decode_payload(header, payload) {
            Some(record) if SyncMark::of(&record).is_some() => return Ok(Some(at)),
            Some(_) => at = end,
            None => return Ok(None),
        }
    }
}

/// Follows the writes after a bad record at `bad` from the mark at `at`, mark by mark: the
/// offset of the first mark saying the segment had been synced past `bad`, if one is reached.
/// Stops at the first offset without an intact mark.
fn synced_past(file: &File, mut at: u64, bad: u64, file_len: u64) -> io::Result<Option<u64>> {
    while at.saturating_add(SYNC_MARK_LEN as u64) <= file_len {
        let mut raw = [0u8; SYNC_MARK_LEN];
        file.read_exact_at(&mut raw, at)?;
        // A real mark says at most its own offset was synced.
        let Some(mark) = SyncMark::parse(&raw).filter(|m| m.synced <= at) else {
            return Ok(None);
        };
        if mark.synced > bad {
            return Ok(Some(at));
        }
        if mark.len < SYNC_MARK_LEN as u64 {
            return Ok(None);
        }
        at = at.saturating_add(mark.len);
    }
    Ok(None)
}

/// The first offset after `bad` holding an intact sync mark that says the segment had been
/// synced past `bad` (and no further than the mark itself), from which the marks lead, write
/// by write, to the end of the log: the file's end, or the zero-filled room after the last
/// write. Found by trying every offset, so that damage covering a write's mark and more (a
/// block of zeros, a block of another file's bytes) cannot hide the writes synced after it.
///
/// A record's bytes are looked through here, so a client's key could hold a mark; but to
/// refuse a torn tail with one, it would have to sit after the tear, in a write that was not
/// synced, name an offset between the tear and itself, and have a length that leads to the
/// log's end or past the file (a length past the file is taken for a last write torn short,
/// so this part is easy to forge); and refusing is the safe side (nothing is cut; the node
/// is replaced).
fn mark_beyond(file: &File, bad: u64, file_len: u64) -> io::Result<Option<u64>> {
    const CHUNK: usize = 1 << 20;
    let want_len = ((SYNC_MARK_LEN - FRAME_HEADER) as u32).to_le_bytes();
    let mut buf = vec![0u8; CHUNK + SYNC_MARK_LEN];
    let mut from = bad + 1;
    while from.saturating_add(SYNC_MARK_LEN as u64) <= file_len {
        let n = (file_len - from).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], from)?;
        let last = n - SYNC_MARK_LEN;
        for i in 0..=last {
            if buf[i..i + 4] != want_len {
                continue;
            }
            let raw: &[u8; SYNC_MARK_LEN] = buf[i..i + SYNC_MARK_LEN].try_into().expect("sized");
            let at = from + i as u64;
            let Some(mark) = SyncMark::parse(raw) else {
                continue;
            };
            if mark.synced > bad && mark.synced <= at && leads_to_end(file, at, file_len)? {
                return Ok(Some(at));
            }
        }
        from += last as u64 + 1;
    }
    Ok(None)
}

/// Whether the marks from the intact one at `at` lead, each by its length, to the end of the
/// log: past the file's end (a last write torn short), or to zeros up to it.
fn leads_to_end(file: &File, mut at: u64, file_len: u64) -> io::Result<bool> {
    loop {
        if at.saturating_add(SYNC_MARK_LEN as u64) > file_len {
            return Ok(at >= file_len || zeros_at(file, at, file_len)?);
        }
        let mut raw = [0u8; SYNC_MARK_LEN];
        file.read_exact_at(&mut raw, at)?;
        match SyncMark::parse(&raw).filter(|m| m.synced <= at) {
            Some(mark) if mark.len >= SYNC_MARK_LEN as u64 => at = at.saturating_add(mark.len),
            Some(_) => return Ok(false),
            None => return zeros_at(file, at, file_len),
        }
    }
}

/// Whether every byte of `file` from `at` to `end` is zero.
fn zeros_at(file: &File, mut at: u64, end: u64) -> io::Result<bool> {
    let mut buf = vec![0u8; 64 << 10];
    while at < end {
        let n = (end - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)?;
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
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
