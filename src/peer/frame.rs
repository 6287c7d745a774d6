//! Frames: `[u32 length BE][u8 kind][u64 id BE][body]`, `length` counting kind, id and body.
//!
//! The parsing is in two pure functions ([`parse_len`], [`parse_prefix`]); [`read_frame`]
//! only adds the reads (fuzzed, with the bodies' decoding: `fuzz/fuzz_targets/peer_frame.rs`). A length over the limit is refused
//! before the body is read, and the body buffer grows with the bytes that actually arrive, so
//! a peer that announces a large frame and sends nothing costs no memory.

use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Bytes of the kind and the id that open every frame's payload.
pub const PREFIX: usize = 9;
/// The body buffer grows by at most this much per read.
const CHUNK: usize = 64 << 10;
/// The writer stops gathering queued frames into one write at this many bytes.
const BATCH: usize = 256 << 10;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A call; the body is the request. Either way on a connection.
    Request = 0,
    /// The handler's reply to the request with the same id.
    Response = 1,
    /// The handler failed or timed out; the body is a UTF-8 message.
    Error = 2,
    /// The node that received the request with this id refused it: too many already run.
    Busy = 3,
    /// Liveness probe from the dialer; empty body.
    Ping = 4,
    /// The answer to a ping; empty body.
    Pong = 5,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            0 => Kind::Request,
            1 => Kind::Response,
            2 => Kind::Error,
            3 => Kind::Busy,
            4 => Kind::Ping,
            5 => Kind::Pong,
            _ => return None,
        })
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    /// The correlation id: a response carries its request's.
    pub id: u64,
    pub body: Vec<u8>,
}

impl Frame {
    pub fn new(kind: Kind, id: u64, body: Vec<u8>) -> Self {
        Frame { kind, id, body }
    }

    /// Appends the encoded frame to `out`. The caller has checked the size against the limit
    /// (a body over `u32::MAX - PREFIX` cannot be encoded and panics).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let len = u32::try_from(PREFIX + self.body.len()).expect("frame checked against max_frame");
        out.reserve(4 + PREFIX + self.body.len());
        out.extend_from_slice(&len.to_be_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&self.body);
    }
}

/// Why no frame could be read; each closes the connection.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the peer closed the connection")]
    Closed,
    #[error("the peer announced a {len}-byte frame; the limit is {max}")]
    TooLarge { len: u32, max: u32 },
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    #[error("nothing arrived from the peer for {0:?}")]
    Idle(Duration),
    #[error("reading from the peer: {0}")]
    Io(#[from] io::Error),
}

/// Checks a frame's length prefix; returns the body length.
pub fn parse_len(len: [u8; 4], max: u32) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(len);
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    (len as usize)
        .checked_sub(PREFIX)
        .ok_or(FrameError::Malformed("shorter than the kind and id"))
}

/// Parses the kind and id.
pub fn parse_prefix(prefix: [u8; PREFIX]) -> Result<(Kind, u64), FrameError> {
    let kind = Kind::from_u8(prefix[0]).ok_or(FrameError::Malformed("unknown kind"))?;
    let mut id = [0u8; 8];
    id.copy_from_slice(&prefix[1..]);
    Ok((kind, u64::from_be_bytes(id)))
}

/// Reads one frame. `idle` bounds each wait for bytes (not the whole frame, so a large frame
/// on a slow but live link is not cut off).
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: u32,
    idle: Duration,
) -> Result<Frame, FrameError> {
    let mut len = [0u8; 4];
    let got = read_some(r, &mut len, idle).await?;
    if got == 0 {
        return Err(FrameError::Closed);
    }
    read_full(r, &mut len[got..], idle).await?;
    let body_len = parse_len(len, max)?;
    let mut prefix = [0u8; PREFIX];
    read_full(r, &mut prefix, idle).await?;
    let (kind, id) = parse_prefix(prefix)?;
    let mut body = Vec::with_capacity(body_len.min(CHUNK));
    while body.len() < body_len {
        let start = body.len();
        let end = body_len.min(start + CHUNK);
        body.resize(end, 0);
        read_full(r, &mut body[start..end], idle).await?;
    }
    Ok(Frame { kind, id, body })
}

/// One read of at least one byte (0 at end of stream), bounded by `idle`.
async fn read_some<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut [u8],
    idle: Duration,
) -> Result<usize, FrameError> {
    match tokio::time::timeout(idle, r.read(buf)).await {
        Ok(n) => Ok(n?),
        Err(_) => Err(FrameError::Idle(idle)),
    }
}

/// Fills `buf`; the end of the stream here is a cut-off frame.
pub(crate) async fn read_full<R: AsyncRead + Unpin>(
    r: &mut R,
    mut buf: &mut [u8],
    idle: Duration,
) -> Result<(), FrameError> {
    while !buf.is_empty() {
        let n = read_some(r, buf, idle).await?;
        if n == 0 {
            return Err(FrameError::Closed);
        }
        buf = &mut buf[n..];
    }
    Ok(())
}

/// Writes queued frames until every sender is gone: all frames queued at the moment go out
/// together, then one flush (a burst of calls costs one write, not one each). Woken by a
/// frame, it first yields once, so that the other tasks ready in this turn of the runtime
/// (and those the next poll of the sockets wakes) queue theirs before the write: forwards
/// that arrive together leave together (docs/benchmarks.md: 8-11% fewer `sendto` per
/// decision at -P 1). A write that makes no progress for `idle` fails: a peer that stops
/// reading (or a partition that fills the socket buffer) must not hold the connection, and
/// everything queued on it, forever.
pub(crate) async fn write_loop<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::Receiver<Frame>,
    idle: Duration,
) -> io::Result<()> {
    let stalled = || {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no write progress for {idle:?}"),
        )
    };
    let mut buf = Vec::new();
    while let Some(first) = rx.recv().await {
        tokio::task::yield_now().await;
        buf.clear();
        first.encode_into(&mut buf);
        while buf.len() < BATCH {
            match rx.try_recv() {
                Ok(f) => f.encode_into(&mut buf),
                Err(_) => break,
            }
        }
        for chunk in buf.chunks(CHUNK) {
            tokio::time::timeout(idle, w.write_all(chunk))
                .await
                .map_err(|_| stalled())??;
        }
        tokio::time::timeout(idle, w.flush())
            .await
            .map_err(|_| stalled())??;
        if buf.capacity() > 4 * BATCH {
            // Do not keep a snapshot-sized buffer for the connection's lifetime.
            buf = Vec::new();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(5);

    fn encoded(f: &Frame) -> Vec<u8> {
        let mut v = Vec::new();
        f.encode_into(&mut v);
        v
    }

    #[tokio::test]
    async fn frames_round_trip_back_to_back() {
        let a = Frame::new(Kind::Request, 7, b"hello".to_vec());
        let b = Frame::new(Kind::Pong, u64::MAX, Vec::new());
        let c = Frame::new(Kind::Response, 1, vec![9; 200_000]);
        let mut wire = encoded(&a);
        wire.extend(encoded(&b));
        wire.extend(encoded(&c));
        let mut r = &wire[..];
        assert_eq!(read_frame(&mut r, 1 << 20, IDLE).await.unwrap(), a);
        assert_eq!(read_frame(&mut r, 1 << 20, IDLE).await.unwrap(), b);
        assert_eq!(read_frame(&mut r, 1 << 20, IDLE).await.unwrap(), c);
        assert!(matches!(
            read_frame(&mut r, 1 << 20, IDLE).await,
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn a_length_over_the_limit_is_refused_and_the_limit_itself_is_not() {
        assert!(matches!(
            parse_len(u32::MAX.to_be_bytes(), 1000),
            Err(FrameError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_len(1001u32.to_be_bytes(), 1000),
            Err(FrameError::TooLarge { .. })
        ));
        assert_eq!(
            parse_len(1000u32.to_be_bytes(), 1000).unwrap(),
            1000 - PREFIX
        );
    }

    #[test]
    fn a_length_shorter_than_the_prefix_or_an_unknown_kind_is_malformed() {
        assert!(matches!(
            parse_len(8u32.to_be_bytes(), 1000),
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            parse_prefix([6, 0, 0, 0, 0, 0, 0, 0, 1]),
            Err(FrameError::Malformed(_))
        ));
    }

    #[tokio::test]
    async fn a_writer_whose_peer_stops_reading_fails_after_the_idle_time() {
        let (w, _unread) = tokio::io::duplex(1024);
        let (tx, rx) = mpsc::channel(4);
        tx.send(Frame::new(Kind::Response, 1, vec![0; 1 << 20]))
            .await
            .unwrap();
        let r = write_loop(w, rx, Duration::from_millis(50)).await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn a_frame_cut_off_mid_body_is_an_error_not_a_short_frame() {
        let mut wire = encoded(&Frame::new(Kind::Request, 1, vec![1; 100]));
        wire.truncate(50);
        let mut r = &wire[..];
        assert!(matches!(
            read_frame(&mut r, 1 << 20, IDLE).await,
            Err(FrameError::Closed)
        ));
    }

    #[tokio::test]
    async fn a_frame_that_stalls_mid_body_ends_as_idle() {
        // Announce 16 MiB, send 10 bytes, then stall.
        let (mut w, mut r) = tokio::io::duplex(1 << 16);
        let mut head = Vec::new();
        head.extend_from_slice(&(16u32 << 20).to_be_bytes());
        head.push(Kind::Request as u8);
        head.extend_from_slice(&1u64.to_be_bytes());
        head.extend_from_slice(&[0; 10]);
        tokio::io::AsyncWriteExt::write_all(&mut w, &head)
            .await
            .unwrap();
        let res = read_frame(&mut r, 32 << 20, Duration::from_millis(50)).await;
        assert!(matches!(res, Err(FrameError::Idle(_))), "{res:?}");
    }
}
