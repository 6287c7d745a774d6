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
//! leader sends its stream again from byte 0. The buffer then grows only by bytes received,
//! in order: it is never larger than the image a leader sends.
//!
//! [`TypeConfig`]: super::types::TypeConfig

use openraft::error::SnapshotMismatch;
use openraft::SnapshotSegmentId;
use std::sync::Mutex;

/// One group's snapshot stream as its chunks arrive: which stream, and how many of its
/// bytes are known written.
#[derive(Debug, Default)]
pub struct SnapshotIntake {
    stream: Mutex<Option<(String, u64)>>,
}

impl SnapshotIntake {
    /// Whether a chunk of stream `id` at `offset` may reach openraft: `Err` with the
    /// mismatch to answer (the leader then starts over) when it would leave a gap.
    pub fn admit(&self, id: &str, offset: u64) -> Result<(), SnapshotMismatch> {
        let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        if offset == 0 {
            // A new stream (openraft starts a new buffer for it), or this one sent again
            // from its start (written over the same buffer, whose length it keeps).
            if stream.as_ref().is_none_or(|(s, _)| s != id) {
                *stream = Some((id.to_owned(), 0));
            }
            return Ok(());
        }
        let expect = match &*stream {
            Some((s, received)) if s == id => {
                if offset <= *received {
                    return Ok(());
                }
                *received
            }
            // Not the stream being received: openraft would answer the same (it has no
            // such stream), unless it kept one this intake let go of, which starts over.
            _ => 0,
        };
        Err(SnapshotMismatch {
            expect: SnapshotSegmentId {
                id: id.to_owned(),
                offset: expect,
            },
            got: SnapshotSegmentId {
                id: id.to_owned(),
                offset,
            },
        })
    }

    /// Records a chunk openraft took (written, not refused for its vote): stream `id` has
    /// its bytes up to `end`; a `done` chunk ends the stream.
    pub fn took(&self, id: &str, end: u64, done: bool) {
        let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((s, received)) = stream.as_mut() {
            if s == id {
                if done {
                    *stream = None;
                } else {
                    *received = (*received).max(end);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(i: &SnapshotIntake, id: &str, offset: u64) -> u64 {
        let m = i.admit(id, offset).expect_err("a gap is refused");
        assert_eq!((m.got.id.as_str(), m.got.offset), (id, offset));
        m.expect.offset
    }

    #[test]
    fn chunks_go_through_only_without_a_gap() {
        let i = SnapshotIntake::default();
        // Nothing received: only a stream's start goes through.
        assert_eq!(refused(&i, "a", 1 << 40), 0);
        i.admit("a", 0).unwrap();
        assert_eq!(refused(&i, "a", 1), 0, "nothing of it known written yet");
        i.took("a", 100, false);
        i.admit("a", 100).unwrap();
        i.admit("a", 40).unwrap(); // a chunk sent again
        assert_eq!(refused(&i, "a", 101), 100);
        assert_eq!(refused(&i, "a", u64::MAX), 100);
        // The same stream from its start again keeps what it has.
        i.admit("a", 0).unwrap();
        i.admit("a", 100).unwrap();
        // Another stream's chunk past 0 is refused; its start replaces the stream.
        assert_eq!(refused(&i, "b", 10), 0);
        i.admit("b", 0).unwrap();
        assert_eq!(refused(&i, "a", 50), 0);
        assert_eq!(refused(&i, "b", 1), 0);
        // A chunk of a stream no longer received is not recorded.
        i.took("a", 500, false);
        assert_eq!(refused(&i, "b", 1), 0);
        i.took("b", 10, false);
        i.admit("b", 10).unwrap();
        // The last chunk ends it.
        i.took("b", 20, true);
        assert_eq!(refused(&i, "b", 10), 0);
    }
}
