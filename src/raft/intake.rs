//! What a follower lets through of a leader's snapshot stream ([`SnapshotIntake`]).
//!
//! openraft 0.9 writes each chunk of an `InstallSnapshot` stream at the offset the chunk
//! names, into the receive buffer ([`TypeConfig`]'s `Cursor<Vec<u8>>`). A chunk whose offset
//! lies past the bytes received grows the buffer to that offset, zero-filled: one frame from a
//! peer could make the node allocate and touch gigabytes. A failed write there would be a
//! `StorageError`, which stops the group, so the bound cannot be the buffer's. The chunks are
//! checked before openraft sees them instead: a chunk goes through only where it starts a
//! stream (offset 0) or starts within the bytes its stream already has. Any other is answered
//! as openraft answers a chunk of a stream it does not have (`SnapshotMismatch`), on which the
//! leader sends its stream again from byte 0. A chunk starts at most where the bytes
//! openraft took of its stream end, so the buffer grows only by bytes received: a gap it
//! could zero-fill is never longer than the bytes of that stream taken before (a start
//! taken again begins the count afresh).
//!
//! [`TypeConfig`]: super::types::TypeConfig

use openraft::error::SnapshotMismatch;
use openraft::SnapshotSegmentId;
use std::sync::Mutex;

/// One group's snapshot stream as its chunks arrive: which stream, and how many of its
/// bytes are known written. Changed only by chunks openraft took ([`SnapshotIntake::took`]):
/// a chunk refused for its vote (a stale leader's) leaves the current stream as it was.
#[derive(Debug, Default)]
pub struct SnapshotIntake {
    stream: Mutex<Option<(String, u64)>>,
}

/// Why a chunk was refused: the label of `quorate_snapshot_chunks_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It starts past the bytes received of its stream.
    Gap,
    /// It continues a stream this node is not receiving (it restarted, or the stream ended
    /// or was replaced): openraft answers the same.
    NoStream,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Gap => "gap",
            Refusal::NoStream => "no_stream",
        }
    }
}

impl SnapshotIntake {
    /// Whether a chunk of stream `id` at `offset` may reach openraft: `Err` with the
    /// mismatch to answer (the leader then starts over) when it would leave a gap.
    pub fn admit(&self, id: &str, offset: u64) -> Result<(), (Refusal, SnapshotMismatch)> {
        if offset == 0 {
            // A stream's start: openraft begins a buffer for it (or writes over the start of
            // the one it has).
            return Ok(());
        }
        let stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        let (refusal, expect) = match &*stream {
            Some((s, received)) if s == id => {
                if offset <= *received {
                    return Ok(());
                }
                (Refusal::Gap, *received)
            }
            _ => (Refusal::NoStream, 0),
        };
        let mismatch = SnapshotMismatch {
            expect: SnapshotSegmentId {
                id: id.to_owned(),
                offset: expect,
            },
            got: SnapshotSegmentId {
                id: id.to_owned(),
                offset,
            },
        };
        Err((refusal, mismatch))
    }

    /// Records a chunk openraft took (written, not refused for its vote): of stream `id`,
    /// from `offset` to `end`. A start begins the stream afresh (openraft may have begun a
    /// new buffer: only what this start wrote is known), and the last chunk ends it.
    pub fn took(&self, id: &str, offset: u64, end: u64, done: bool) {
        let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        if done {
            *stream = None;
        } else if offset == 0 {
            *stream = Some((id.to_owned(), end));
        } else if let Some((s, received)) = stream.as_mut() {
            if s == id {
                *received = (*received).max(end);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(i: &SnapshotIntake, id: &str, offset: u64) -> (Refusal, u64) {
        let (why, m) = i.admit(id, offset).expect_err("a gap is refused");
        assert_eq!((m.got.id.as_str(), m.got.offset), (id, offset));
        (why, m.expect.offset)
    }

    #[test]
    fn chunks_go_through_only_without_a_gap() {
        use Refusal::*;
        let i = SnapshotIntake::default();
        // Nothing received: only a stream's start goes through.
        assert_eq!(refused(&i, "a", 1 << 40), (NoStream, 0));
        i.admit("a", 0).unwrap();
        assert_eq!(refused(&i, "a", 1), (NoStream, 0), "not taken yet");
        i.took("a", 0, 60, false);
        i.took("a", 60, 100, false);
        i.admit("a", 100).unwrap();
        i.admit("a", 40).unwrap(); // a chunk sent again
        assert_eq!(refused(&i, "a", 101), (Gap, 100));
        assert_eq!(refused(&i, "a", u64::MAX), (Gap, 100));
        // A start taken again begins afresh: openraft may have begun a new buffer.
        i.took("a", 0, 60, false);
        assert_eq!(refused(&i, "a", 100), (Gap, 60));
        i.admit("a", 60).unwrap();
        // Another stream's start, refused for its vote (not taken), changes nothing.
        i.admit("b", 0).unwrap();
        assert_eq!(refused(&i, "b", 10), (NoStream, 0));
        i.admit("a", 60).unwrap();
        // Taken, it replaces the stream.
        i.took("b", 0, 10, false);
        assert_eq!(refused(&i, "a", 50), (NoStream, 0));
        i.admit("b", 10).unwrap();
        // A chunk of a stream no longer received is not recorded.
        i.took("a", 10, 500, false);
        assert_eq!(refused(&i, "b", 11), (Gap, 10));
        // The last chunk ends it.
        i.took("b", 10, 20, true);
        assert_eq!(refused(&i, "b", 10), (NoStream, 0));
    }
}
