//! The on-disk record format, in one place so the writer and the recovery scan cannot disagree.
//!
//! ```text
//! [len: u32 LE][crc32(payload): u32 LE][payload: len bytes]
//! payload = [group: u64 LE][kind: u8][bytes]
//! ```
//!
//! The checksum covers the payload; the length is checked by bounds instead (at least
//! [`PAYLOAD_HEADER`] bytes, at most the configured maximum). A zero-filled tail — what a file
//! extended but never written looks like after a crash — has length 0 and is therefore torn,
//! not an empty record (the CRC-32 of nothing is 0, so the checksum alone would accept it).

/// Bytes before the payload: length and checksum.
pub const FRAME_HEADER: usize = 8;

/// Bytes of the payload before the caller's bytes: group and kind.
pub const PAYLOAD_HEADER: usize = 9;

/// One record as the caller sees it. The WAL never looks inside `bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The Raft group (shard) the record belongs to.
    pub group: u64,
    /// What the record is (entry, vote, ...); chosen by the caller.
    pub kind: u8,
    /// The caller's bytes.
    pub bytes: Vec<u8>,
}

/// The payload length a record with `bytes_len` caller bytes has, if it fits in a `u32`.
pub fn payload_len(bytes_len: usize) -> Option<u32> {
    bytes_len
        .checked_add(PAYLOAD_HEADER)
        .and_then(|n| u32::try_from(n).ok())
}

/// Appends the framed record to `out`. `payload_len(bytes.len())` must be `Some`; callers
/// check it (and the configured maximum) first.
pub fn encode_into(out: &mut Vec<u8>, group: u64, kind: u8, bytes: &[u8]) {
    let len = payload_len(bytes.len()).unwrap_or(u32::MAX);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&group.to_le_bytes());
    crc.update(&[kind]);
    crc.update(bytes);
    out.reserve(FRAME_HEADER + PAYLOAD_HEADER + bytes.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(&group.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(bytes);
}

/// A frame header read from disk: the payload length and its expected checksum.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub len: u32,
    pub crc: u32,
}

impl Header {
    pub fn parse(raw: [u8; FRAME_HEADER]) -> Header {
        let [a, b, c, d, e, f, g, h] = raw;
        Header {
            len: u32::from_le_bytes([a, b, c, d]),
            crc: u32::from_le_bytes([e, f, g, h]),
        }
    }

    /// Whether the length is one a writer with this maximum could have produced.
    pub fn plausible(&self, max_payload: u32) -> bool {
        self.len as usize >= PAYLOAD_HEADER && self.len <= max_payload
    }
}

/// The group of the WAL's own records (no shard has this id): the checkpoint marker (see
/// `segment`) and sync marks.
pub const WAL_GROUP: u64 = u64::MAX;

/// The kind of a sync mark; a caller's record of [`WAL_GROUP`] and this kind is refused.
pub const SYNC_MARK_KIND: u8 = 0xFE;

/// A sync mark's framed length: frame header, payload header, two `u64`.
pub const SYNC_MARK_LEN: usize = FRAME_HEADER + PAYLOAD_HEADER + 16;

/// The first record of every write the writer makes (and of every checkpoint): how long the
/// write is, itself included, and how far the segment had been synced before it. Recovery
/// uses them to tell a torn write from damage to what was synced (see `recover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncMark {
    /// Bytes of the write it starts, the mark included.
    pub len: u64,
    /// Every byte of the segment before this offset had been synced when the write began.
    pub synced: u64,
}

impl SyncMark {
    /// The framed record.
    pub fn encode(&self) -> [u8; SYNC_MARK_LEN] {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.len.to_le_bytes());
        bytes[8..].copy_from_slice(&self.synced.to_le_bytes());
        let mut out = Vec::with_capacity(SYNC_MARK_LEN);
        encode_into(&mut out, WAL_GROUP, SYNC_MARK_KIND, &bytes);
        let mut framed = [0u8; SYNC_MARK_LEN];
        framed.copy_from_slice(&out);
        framed
    }

    /// The mark `record` is, if it is one.
    pub fn of(record: &Record) -> Option<SyncMark> {
        if record.group != WAL_GROUP || record.kind != SYNC_MARK_KIND {
            return None;
        }
        let bytes: &[u8; 16] = record.bytes.as_slice().try_into().ok()?;
        let (len, synced) = bytes.split_at(8);
        Some(SyncMark {
            len: u64::from_le_bytes(len.try_into().ok()?),
            synced: u64::from_le_bytes(synced.try_into().ok()?),
        })
    }

    /// The mark framed in `raw`, if it holds an intact one.
    pub fn parse(raw: &[u8; SYNC_MARK_LEN]) -> Option<SyncMark> {
        let (head, payload) = raw.split_at(FRAME_HEADER);
        let header = Header::parse(head.try_into().ok()?);
        if header.len as usize != SYNC_MARK_LEN - FRAME_HEADER {
            return None;
        }
        SyncMark::of(&decode_payload(header, payload.to_vec())?)
    }
}

/// Checks a payload against its header and splits it into a [`Record`]; `None` if corrupt.
pub fn decode_payload(header: Header, mut payload: Vec<u8>) -> Option<Record> {
    if payload.len() != header.len as usize || crc32fast::hash(&payload) != header.crc {
        return None;
    }
    let head: [u8; PAYLOAD_HEADER] = payload.get(..PAYLOAD_HEADER)?.try_into().ok()?;
    let [g0, g1, g2, g3, g4, g5, g6, g7, kind] = head;
    payload.drain(..PAYLOAD_HEADER);
    Some(Record {
        group: u64::from_le_bytes([g0, g1, g2, g3, g4, g5, g6, g7]),
        kind,
        bytes: payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoded_record_decodes_to_itself() {
        let mut out = Vec::new();
        encode_into(&mut out, 7, 3, b"hello");
        let header = Header::parse(out[..FRAME_HEADER].try_into().unwrap());
        assert!(header.plausible(1024));
        let rec = decode_payload(header, out[FRAME_HEADER..].to_vec()).unwrap();
        assert_eq!(
            rec,
            Record {
                group: 7,
                kind: 3,
                bytes: b"hello".to_vec()
            }
        );
    }

    #[test]
    fn a_sync_mark_round_trips_and_a_flipped_bit_is_no_mark() {
        let mark = SyncMark {
            len: 4133,
            synced: 1 << 40,
        };
        let mut raw = mark.encode();
        assert_eq!(SyncMark::parse(&raw), Some(mark));
        raw[SYNC_MARK_LEN - 1] ^= 1;
        assert_eq!(SyncMark::parse(&raw), None);
        let other = Record {
            group: WAL_GROUP,
            kind: SYNC_MARK_KIND - 1,
            bytes: vec![0; 16],
        };
        assert_eq!(SyncMark::of(&other), None);
    }

    #[test]
    fn a_zero_filled_header_is_not_a_record() {
        assert!(!Header::parse([0; FRAME_HEADER]).plausible(1024));
    }
}
