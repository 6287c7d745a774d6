//! The client's side of RESP: one connection that sends a request and reads its reply, and
//! the translation of quorate's replies into typed answers.
//!
//! Replies are decoded with the same bounded decoder the tests use ([`decode`]), so a
//! misbehaving server cannot make the client allocate without bound or recurse deeply.

use super::{CheckAnswer, ClientError, ItemAnswer, ThrottleAnswer, Wait};
use crate::api::resp::decode::parse_reply;
use crate::api::resp::frame::{Frame, Limits};
use crate::net::Stream;
use bytes::{BufMut, BytesMut};
use std::io;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the client accepts from a server: quorate's largest reply (`INFO`, or a check of
/// many items) is far below these.
pub const REPLY_LIMITS: Limits = Limits {
    max_bulk: 1024 * 1024,
    max_elements: 4096,
    max_frame: 4 * 1024 * 1024,
};

const READ_CHUNK: usize = 16 * 1024;

/// One open connection to a node.
pub struct Conn<S> {
    stream: S,
    buf: BytesMut,
    /// True once this connection has answered a request (it came from the pool).
    pub(super) used: bool,
}

/// How a call on a connection failed.
pub(super) enum CallError {
    /// The server closed (or reset) the connection before any byte of the reply: on a
    /// connection taken from the pool, the server had most likely closed it as idle before
    /// our request arrived, so the request may be sent again on a fresh one.
    ClosedBeforeReply(String),
    Other(ClientError),
}

impl CallError {
    /// The request may have reached the node, which gave no answer: the connection closed,
    /// failed or cut the reply off. (A malformed answer is an answer.)
    pub(super) fn unanswered(&self) -> bool {
        matches!(
            self,
            CallError::ClosedBeforeReply(_) | CallError::Other(ClientError::Io(_))
        )
    }
}

impl<S: Stream> Conn<S> {
    pub fn new(stream: S) -> Self {
        Conn {
            stream,
            buf: BytesMut::new(),
            used: false,
        }
    }

    /// True when the server has closed (or reset) this idle connection, or sent bytes
    /// nobody asked for; looked at without waiting, before a request is written, so that
    /// the request can go elsewhere with nothing sent. (A close not yet seen by the runtime
    /// reads as open: the request is then sent and fails as `ClosedBeforeReply`.)
    pub(super) fn closed_by_peer(&mut self) -> bool {
        let mut byte = [0u8; 1];
        let mut buf = tokio::io::ReadBuf::new(&mut byte);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // Ready: end of stream (nothing read), unexpected bytes, or an error.
        std::pin::Pin::new(&mut self.stream)
            .poll_read(&mut cx, &mut buf)
            .is_ready()
    }

    /// Sends one request and reads its reply. `Ok(Frame::Error(..))` is a server's error
    /// reply; the connection is still good. `keep` is false when the connection must not be
    /// reused (the server sent more than one reply).
    pub(super) async fn call(&mut self, args: &[&[u8]]) -> Result<(Frame, bool), CallError> {
        let request = encode_request(args);
        let io_err = |e: io::Error| match e.kind() {
            io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted => CallError::ClosedBeforeReply(e.to_string()),
            _ => CallError::Other(ClientError::Io(e.to_string())),
        };
        self.stream.write_all(&request).await.map_err(io_err)?;
        self.stream.flush().await.map_err(io_err)?;
        loop {
            match parse_reply(&mut self.buf, &REPLY_LIMITS) {
                Ok(Some(frame)) => {
                    self.used = true;
                    return Ok((frame, self.buf.is_empty()));
                }
                Ok(None) => {}
                Err(e) => return Err(CallError::Other(ClientError::Protocol(e.to_string()))),
            }
            let before = self.buf.len();
            self.buf.reserve(READ_CHUNK);
            let mut limited = (&mut self.stream).take(READ_CHUNK as u64);
            match limited.read_buf(&mut self.buf).await {
                Ok(0) if before == 0 => {
                    return Err(CallError::ClosedBeforeReply(
                        "connection closed by the server".into(),
                    ))
                }
                Ok(0) => {
                    return Err(CallError::Other(ClientError::Io(
                        "connection closed in the middle of a reply".into(),
                    )))
                }
                Ok(_) => {}
                Err(e) if before == 0 => return Err(io_err(e)),
                Err(e) => return Err(CallError::Other(ClientError::Io(e.to_string()))),
            }
        }
    }
}

/// A request as an array of bulk strings.
pub fn encode_request(args: &[&[u8]]) -> BytesMut {
    let mut out = BytesMut::new();
    out.put_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.put_slice(format!("${}\r\n", a.len()).as_bytes());
        out.put_slice(a);
        out.put_slice(b"\r\n");
    }
    out
}

/// A server's error reply as a [`ClientError`]: `TRYAGAIN` is [`ClientError::Unavailable`],
/// `NOTMEMBER` [`ClientError::NotMember`].
pub fn server_error(message: String) -> ClientError {
    if let Some(rest) = message.strip_prefix("TRYAGAIN ") {
        return ClientError::Unavailable(rest.to_string());
    }
    match not_member(&message) {
        Some(rest) => ClientError::NotMember(rest.to_string()),
        None => ClientError::Server(message),
    }
}

/// The reason of a removed node's refusal (`NOTMEMBER reason`), if `message` is one.
pub(super) fn not_member(message: &str) -> Option<&str> {
    let code = crate::api::resp::reply::NOT_MEMBER;
    message.strip_prefix(code)?.strip_prefix(' ')
}

fn unexpected(what: &str, frame: &Frame) -> ClientError {
    ClientError::Protocol(format!("expected {what}, got {frame:?}"))
}

fn array(frame: Frame, what: &str) -> Result<Vec<Frame>, ClientError> {
    match frame {
        Frame::Array(items) => Ok(items),
        Frame::Error(m) => Err(server_error(m)),
        other => Err(unexpected(what, &other)),
    }
}

fn int(frame: &Frame) -> Result<i64, ClientError> {
    match frame {
        Frame::Integer(n) => Ok(*n),
        other => Err(unexpected("an integer", other)),
    }
}

fn uint(frame: &Frame) -> Result<u64, ClientError> {
    u64::try_from(int(frame)?).map_err(|_| unexpected("a non-negative integer", frame))
}

fn flag(frame: &Frame) -> Result<bool, ClientError> {
    match int(frame)? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(unexpected("0 or 1", frame)),
    }
}

fn text(frame: &Frame) -> Result<String, ClientError> {
    match frame {
        Frame::Bulk(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        other => Err(unexpected("a bulk string", other)),
    }
}

/// A wait field: -1 none, -2 never, else an amount converted by `from`.
fn wait(frame: &Frame, from: fn(u64) -> Duration) -> Result<Wait, ClientError> {
    match int(frame)? {
        -1 => Ok(Wait::Now),
        -2 => Ok(Wait::Never),
        n => u64::try_from(n)
            .map(|n| Wait::After(from(n)))
            .map_err(|_| unexpected("-1, -2 or a wait", frame)),
    }
}

/// The answer to `QR.CHECK` / `QR.PEEK`.
pub fn check_answer(frame: Frame) -> Result<CheckAnswer, ClientError> {
    let fields = array(frame, "a check reply")?;
    let [allowed, retry_after, items @ ..] = fields.as_slice() else {
        return Err(ClientError::Protocol(
            "a check reply has fewer than 2 fields".into(),
        ));
    };
    let allowed = flag(allowed)?;
    let items = items
        .iter()
        .map(item_answer)
        .collect::<Result<Vec<_>, _>>()?;
    let wait = match wait(retry_after, Duration::from_secs)? {
        // The top-level wait is in whole seconds, rounded up; the denying items' waits are
        // in milliseconds. The smaller of the seconds and the largest item wait is exact to
        // the millisecond and still ignores shadow items (which the seconds leave out).
        Wait::After(secs) => {
            let longest_item = items
                .iter()
                .filter_map(|i| match i.retry_after {
                    Wait::After(d) if !i.allowed && !i.shadow => Some(d),
                    _ => None,
                })
                .max();
            Wait::After(longest_item.map_or(secs, |d| d.min(secs)))
        }
        other => other,
    };
    Ok(CheckAnswer {
        allowed,
        wait,
        items,
    })
}

fn item_answer(frame: &Frame) -> Result<ItemAnswer, ClientError> {
    let Frame::Array(f) = frame else {
        return Err(unexpected("an item array", frame));
    };
    // Seven fields: a server from before the fallback flag; eight: before the shadow flag
    // (their answers are not marked).
    let (fields, fallback, shadow) = match f.as_slice() {
        [seven @ .., fallback, shadow] if f.len() == 9 => (seven, flag(fallback)?, flag(shadow)?),
        [seven @ .., fallback] if f.len() == 8 => (seven, flag(fallback)?, false),
        seven => (seven, false, false),
    };
    let [limit, key, allowed, capacity, remaining, retry_after, reset_after] = fields else {
        return Err(ClientError::Protocol(format!(
            "an item has {} fields, not 7, 8 or 9",
            f.len()
        )));
    };
    Ok(ItemAnswer {
        limit: text(limit)?,
        key: text(key)?,
        allowed: flag(allowed)?,
        capacity: uint(capacity)?,
        remaining: uint(remaining)?,
        retry_after: wait(retry_after, Duration::from_millis)?,
        reset_after: Duration::from_millis(uint(reset_after)?),
        fallback,
        shadow,
    })
}

/// The answer to `CL.THROTTLE`.
pub fn throttle_answer(frame: Frame) -> Result<ThrottleAnswer, ClientError> {
    let fields = array(frame, "a CL.THROTTLE reply")?;
    let [limited, limit, remaining, retry_after, reset_after] = fields.as_slice() else {
        return Err(ClientError::Protocol(format!(
            "a CL.THROTTLE reply has {} fields, not 5",
            fields.len()
        )));
    };
    let retry_after = match int(retry_after)? {
        -1 => None,
        _ => Some(Duration::from_secs(uint(retry_after)?)),
    };
    Ok(ThrottleAnswer {
        limited: flag(limited)?,
        limit: uint(limit)?,
        remaining: uint(remaining)?,
        retry_after,
        reset_after: Duration::from_secs(uint(reset_after)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::resp::decode::parse_reply;

    fn frame(wire: &str) -> Frame {
        parse_reply(&mut BytesMut::from(wire.as_bytes()), &REPLY_LIMITS)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn requests_are_arrays_of_bulk_strings() {
        assert_eq!(
            &encode_request(&[b"QR.PEEK", b"login", b""])[..],
            b"*3\r\n$7\r\nQR.PEEK\r\n$5\r\nlogin\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn a_throttle_reply_becomes_a_typed_answer() {
        let a = throttle_answer(frame("*5\r\n:1\r\n:16\r\n:0\r\n:2\r\n:32\r\n")).unwrap();
        assert_eq!(
            a,
            ThrottleAnswer {
                limited: true,
                limit: 16,
                remaining: 0,
                retry_after: Some(Duration::from_secs(2)),
                reset_after: Duration::from_secs(32),
            }
        );
        let a = throttle_answer(frame("*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n")).unwrap();
        assert_eq!(a.retry_after, None);
    }

    #[test]
    fn a_denied_check_waits_for_its_slowest_denying_item_to_the_millisecond() {
        let a = check_answer(frame(
            "*4\r\n:0\r\n:2\r\n\
             *8\r\n$3\r\napi\r\n$1\r\nk\r\n:1\r\n:200\r\n:199\r\n:-1\r\n:11\r\n:1\r\n\
             *7\r\n$5\r\nlogin\r\n$1\r\nk\r\n:0\r\n:5\r\n:0\r\n:1501\r\n:60000\r\n",
        ))
        .unwrap();
        assert!(!a.allowed);
        assert_eq!(a.wait, Wait::After(Duration::from_millis(1501)));
        assert_eq!(a.items.len(), 2);
        assert_eq!(a.items[0].retry_after, Wait::Now);
        assert_eq!(
            (
                a.items[1].limit.as_str(),
                a.items[1].capacity,
                a.items[1].remaining
            ),
            ("login", 5, 0)
        );
        assert_eq!(a.items[1].reset_after, Duration::from_secs(60));
        // The first item came from its fallback; the second has no flag (an older server).
        assert_eq!((a.items[0].fallback, a.items[1].fallback), (true, false));
    }

    /// A shadow item's denial is marked, and its wait is not the check's.
    #[test]
    fn a_shadow_items_denial_is_marked_and_does_not_set_the_wait() {
        let a = check_answer(frame(
            "*4\r\n:0\r\n:2\r\n\
             *9\r\n$3\r\napi\r\n$1\r\nk\r\n:0\r\n:200\r\n:0\r\n:1200\r\n:11\r\n:0\r\n:0\r\n\
             *9\r\n$5\r\nlogin\r\n$1\r\nk\r\n:0\r\n:5\r\n:0\r\n:1501\r\n:60000\r\n:0\r\n:1\r\n",
        ))
        .unwrap();
        assert_eq!((a.items[0].shadow, a.items[1].shadow), (false, true));
        assert_eq!(a.wait, Wait::After(Duration::from_millis(1200)));
    }

    #[test]
    fn a_check_that_can_never_succeed_waits_never() {
        let a = check_answer(frame(
            "*3\r\n:0\r\n:-2\r\n*7\r\n$5\r\nlogin\r\n$1\r\nk\r\n:0\r\n:5\r\n:5\r\n:-2\r\n:0\r\n",
        ))
        .unwrap();
        assert_eq!(a.wait, Wait::Never);
    }

    #[test]
    fn error_replies_become_typed_errors() {
        assert!(matches!(
            check_answer(Frame::Error("TRYAGAIN unavailable: x".into())),
            Err(ClientError::Unavailable(m)) if m == "unavailable: x"
        ));
        assert!(matches!(
            throttle_answer(Frame::Error("ERR bad".into())),
            Err(ClientError::Server(m)) if m == "ERR bad"
        ));
        assert!(matches!(
            check_answer(Frame::Error("NOTMEMBER removed".into())),
            Err(ClientError::NotMember(m)) if m == "removed"
        ));
        // Only the code, followed by a space, is one.
        assert!(matches!(
            check_answer(Frame::Error("NOTMEMBERS x".into())),
            Err(ClientError::Server(_))
        ));
    }

    #[test]
    fn malformed_replies_are_protocol_errors_not_panics() {
        for wire in [
            ":1\r\n",
            "*1\r\n:1\r\n",
            "*3\r\n:1\r\n:-1\r\n:5\r\n",
            "*3\r\n:7\r\n:-1\r\n*0\r\n",
            "*3\r\n:1\r\n:-1\r\n*6\r\n$1\r\nl\r\n$1\r\nk\r\n:1\r\n:5\r\n:4\r\n:-1\r\n",
            "*3\r\n:1\r\n:-1\r\n*10\r\n$1\r\nl\r\n$1\r\nk\r\n:1\r\n:5\r\n:4\r\n:-1\r\n:0\r\n:0\r\n:0\r\n:0\r\n",
            "*3\r\n:1\r\n:-1\r\n*9\r\n$1\r\nl\r\n$1\r\nk\r\n:1\r\n:5\r\n:4\r\n:-1\r\n:0\r\n:0\r\n:3\r\n",
            "*3\r\n:1\r\n:-1\r\n*8\r\n$1\r\nl\r\n$1\r\nk\r\n:1\r\n:5\r\n:4\r\n:-1\r\n:0\r\n:2\r\n",
            "*2\r\n:0\r\n:-9\r\n",
        ] {
            assert!(
                matches!(check_answer(frame(wire)), Err(ClientError::Protocol(_))),
                "{wire:?}"
            );
        }
        for wire in [
            "*4\r\n:0\r\n:1\r\n:1\r\n:1\r\n",
            "*5\r\n:0\r\n:-5\r\n:1\r\n:-1\r\n:1\r\n",
        ] {
            assert!(
                matches!(throttle_answer(frame(wire)), Err(ClientError::Protocol(_))),
                "{wire:?}"
            );
        }
    }
}
