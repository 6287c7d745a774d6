//! RESP frames and the incremental parser of client requests.
//!
//! A connection speaks RESP2 until it sends `HELLO 3`; the frames are the same in both, and
//! only the encoder ([`super::encode::encode_as`]) writes them differently: a
//! [`Frame::Null`] is `$-1` in RESP2 and `_` in RESP3, a [`Frame::Map`] a flat array of
//! field, value pairs in RESP2 and `%` in RESP3.
//!
//! Clients send either an array of bulk strings (`*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n`) or an
//! inline command (`ECHO hi\r\n`, as telnet sends). [`take_batch`] takes whatever has
//! arrived in the connection's buffer and returns every complete request in it as one
//! [`Batch`] (the server's parser); [`parse_request`] returns only the first, or `None` when
//! more bytes are needed. Neither consumes a partial frame, so either can simply be called
//! again after the next read.
//!
//! The parser is where hostile input meets the node, so it trusts no declared length: a
//! length is checked against [`Limits`] as soon as its header is read, before any byte of the
//! data arrives, and nothing is ever reserved from it. Only bytes that actually arrived are
//! kept, and the caller's buffer stays below [`Limits::max_frame`] plus one read. Malformed
//! input is a [`ProtocolError`]; the server answers `-ERR Protocol error: ...` and closes the
//! connection, as Redis does.

use super::inline;
use bytes::{Bytes, BytesMut};
use std::ops::Range;

/// The protocol a connection speaks: RESP2 until the client sends `HELLO 3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Resp2,
    Resp3,
}

impl Protocol {
    /// The version number `HELLO` takes and answers.
    pub fn version(self) -> i64 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

/// One RESP value: what the server replies (and what the client decodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// `+OK`. Must not contain CR or LF (the encoder replaces them).
    Simple(String),
    /// `-ERR message`: the first word is the error kind. Must not contain CR or LF.
    Error(String),
    /// `:42`
    Integer(i64),
    /// `$2\r\nhi`
    Bulk(Bytes),
    /// `$-1` in RESP2, `_` in RESP3 (and `*-1` when decoded).
    Null,
    /// `*2\r\n...`
    Array(Vec<Frame>),
    /// Field, value pairs: `%1\r\n...` in RESP3; in RESP2 the flat array Redis sends
    /// (`*2\r\n<field><value>`).
    Map(Vec<(Frame, Frame)>),
}

impl Frame {
    /// A simple string from a literal.
    pub fn simple(s: &str) -> Frame {
        Frame::Simple(s.to_string())
    }

    /// A bulk string from anything byte-like.
    pub fn bulk(b: impl Into<Bytes>) -> Frame {
        Frame::Bulk(b.into())
    }

    /// An `-ERR message` error.
    pub fn err(message: impl std::fmt::Display) -> Frame {
        Frame::Error(format!("ERR {message}"))
    }

    /// An integer from an unsigned count, saturated to the RESP integer range.
    pub fn uint(n: u64) -> Frame {
        Frame::Integer(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// How much a request may declare and occupy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest bulk string, and longest inline command line, in bytes.
    pub max_bulk: usize,
    /// Most elements of one array.
    pub max_elements: usize,
    /// Longest whole request (an array with all its elements and headers), in bytes.
    pub max_frame: usize,
}

/// Most elements of a request array: no command needs more (16 items of 3 arguments each).
pub const MAX_ELEMENTS: usize = 1024;

/// Longest header line (`*1024`, `$65536`): a sign and 19 digits fit.
const MAX_HEADER: usize = 21;

impl Limits {
    /// The limits a node applies, from its configured `max_frame_bytes`: each bulk string and
    /// inline line up to that size, and a whole request up to twice it (so a bulk string of
    /// the largest size still fits with the rest of its command).
    pub fn from_max_frame_bytes(max_frame_bytes: usize) -> Limits {
        Limits {
            max_bulk: max_frame_bytes,
            max_elements: MAX_ELEMENTS,
            max_frame: max_frame_bytes.saturating_mul(2),
        }
    }
}

/// Why a request was refused as malformed. The `Display` text follows Redis's wording where
/// Redis has one; the server sends it as `-ERR Protocol error: <text>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("invalid multibulk length")]
    InvalidMultibulkLength,
    #[error("too many elements in request ({count}, at most {max})")]
    TooManyElements { count: i64, max: usize },
    #[error("invalid bulk length")]
    InvalidBulkLength,
    #[error("bulk string too large ({len} bytes, at most {max})")]
    BulkTooLarge { len: i64, max: usize },
    #[error("request too large (at most {max} bytes)")]
    FrameTooLarge { max: usize },
    #[error("expected '$', got '{}'", char::from(*.0).escape_default())]
    ExpectedBulk(u8),
    #[error("expected CRLF after bulk string")]
    ExpectedCrlf,
    #[error("too big inline request (at most {max} bytes)")]
    InlineTooLong { max: usize },
    #[error("unbalanced quotes in request")]
    UnbalancedQuotes,
    #[error("unexpected reply type '{}'", char::from(*.0).escape_default())]
    UnexpectedType(u8),
    #[error("reply nested too deeply")]
    TooDeep,
}

impl ProtocolError {
    /// A short label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            ProtocolError::InvalidMultibulkLength => "invalid_multibulk_length",
            ProtocolError::TooManyElements { .. } => "too_many_elements",
            ProtocolError::InvalidBulkLength => "invalid_bulk_length",
            ProtocolError::BulkTooLarge { .. } => "bulk_too_large",
            ProtocolError::FrameTooLarge { .. } => "frame_too_large",
            ProtocolError::ExpectedBulk(_) => "expected_bulk",
            ProtocolError::ExpectedCrlf => "expected_crlf",
            ProtocolError::InlineTooLong { .. } => "inline_too_long",
            ProtocolError::UnbalancedQuotes => "unbalanced_quotes",
            ProtocolError::UnexpectedType(_) => "unexpected_type",
            ProtocolError::TooDeep => "too_deep",
        }
    }
}

/// Where one argument of a parsed request lies.
#[derive(Debug, Clone)]
enum Arg {
    /// In the bytes the request was parsed from.
    At(Range<usize>),
    /// Its own bytes: an argument of an inline command, whose quotes were resolved.
    Own(Bytes),
}

impl Arg {
    fn in_<'a>(&'a self, data: &'a [u8]) -> &'a [u8] {
        match self {
            Arg::At(r) => &data[r.clone()],
            Arg::Own(b) => b,
        }
    }

    /// The argument as bytes of its own, sharing `data`'s memory where it lies in it.
    fn to_bytes(&self, data: &Bytes) -> Bytes {
        match self {
            Arg::At(r) => data.slice(r.clone()),
            Arg::Own(b) => b.clone(),
        }
    }
}

/// Complete requests taken out of a connection's buffer together: their bytes, split off the
/// buffer in one piece, and where each argument lies in them. Reading an argument copies
/// nothing and touches no reference count (a `Bytes` per argument did, and showed in
/// profiles of pipelined load).
#[derive(Debug, Default)]
pub struct Batch {
    data: Bytes,
    args: Vec<Arg>,
    /// Each request's arguments: a range of `args`, never empty.
    requests: Vec<Range<usize>>,
}

impl Batch {
    /// How many requests.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// The arguments of request `i` (`i < len()`), into `out`, which is cleared first.
    pub fn args<'a>(&'a self, i: usize, out: &mut Vec<&'a [u8]>) {
        out.clear();
        out.extend(
            self.args[self.requests[i].clone()]
                .iter()
                .map(|a| a.in_(&self.data)),
        );
    }

    /// Every request's arguments as bytes of their own (for tests and the fuzzer).
    pub fn to_vecs(&self) -> Vec<Vec<Bytes>> {
        self.requests
            .iter()
            .map(|r| {
                self.args[r.clone()]
                    .iter()
                    .map(|a| a.to_bytes(&self.data))
                    .collect()
            })
            .collect()
    }
}

/// Takes the complete requests at the front of `buf` as one batch: at most `max`, up to and
/// including a `QUIT`, and the protocol error that stopped the parser, if any (the requests
/// before it are in the batch). Empty requests (`*0`, blank inline lines) are consumed and
/// skipped, as Redis does; an incomplete request is left in `buf`. After an error the
/// buffer's content is unspecified; the connection must be closed.
pub fn take_batch(
    buf: &mut BytesMut,
    limits: &Limits,
    max: usize,
) -> (Batch, Option<ProtocolError>) {
    if buf.is_empty() {
        return (Batch::default(), None);
    }
    // Room for one usual request (CL.THROTTLE has 6 arguments); more is reserved once one
    // is complete.
    let mut args = Vec::with_capacity(8);
    let mut requests: Vec<Range<usize>> = Vec::new();
    let mut pos = 0;
    let mut error = None;
    while requests.len() < max {
        let first = args.len();
        match scan(&buf[pos..], limits, pos, &mut args) {
            Ok(Some(len)) => {
                pos += len;
                if args.len() == first {
                    continue;
                }
                if requests.is_empty() {
                    // Sized from the bytes after the first complete request (an argument
                    // takes 6 bytes or more in an array, a CL.THROTTLE request about 60),
                    // so a pipelined batch rarely grows them; a request still arriving
                    // gets no more than the room for one request's arguments above.
                    let rest = buf.len() - pos;
                    args.reserve((rest / 8).min(4096));
                    requests.reserve((rest / 32).min(max) + 1);
                }
                requests.push(first..args.len());
                if args[first].in_(buf).eq_ignore_ascii_case(b"QUIT") {
                    break;
                }
            }
            Ok(None) => {
                args.truncate(first);
                break;
            }
            Err(e) => {
                args.truncate(first);
                error = Some(e);
                break;
            }
        }
    }
    // Nothing complete: nothing split off, so the buffer stays unshared and the next read
    // can reuse its memory in place.
    let data = if pos == 0 {
        Bytes::new()
    } else {
        buf.split_to(pos).freeze()
    };
    (
        Batch {
            data,
            args,
            requests,
        },
        error,
    )
}

/// Takes the first complete request out of `buf`: its arguments (those of an array share
/// `buf`'s memory).
///
/// `Ok(None)`: no complete request yet (nothing is consumed). Empty requests (`*0`, blank
/// inline lines) are consumed and skipped, as Redis does. After an error the buffer's content
/// is unspecified; the connection must be closed. (The server parses with [`take_batch`];
/// the two share one scanner.)
pub fn parse_request(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let mut args = Vec::new();
    loop {
        let Some(len) = scan(buf, limits, 0, &mut args)? else {
            return Ok(None);
        };
        let frame = buf.split_to(len).freeze();
        if args.is_empty() {
            continue;
        }
        return Ok(Some(args.iter().map(|a| a.to_bytes(&frame)).collect()));
    }
}

/// Scans the request at the start of `buf`: its length in bytes once it has all arrived
/// (`None` before), with its arguments pushed to `out`, their ranges shifted by `base` (where
/// `buf` starts in the caller's bytes). On `None` or an error, `out` may hold a part of them.
fn scan(
    buf: &[u8],
    limits: &Limits,
    base: usize,
    out: &mut Vec<Arg>,
) -> Result<Option<usize>, ProtocolError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first == b'*' {
        return scan_array(buf, limits, base, out);
    }
    let Some(end) = find_inline_end(buf, limits)? else {
        return Ok(None);
    };
    out.extend(
        inline::split(strip_eol(&buf[..=end]), limits.max_elements)?
            .into_iter()
            .map(Arg::Own),
    );
    Ok(Some(end + 1))
}

/// The line without its `\n` or `\r\n`.
fn strip_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The index of the `\n` ending the inline command at the start of `buf`, if it has arrived.
fn find_inline_end(buf: &[u8], limits: &Limits) -> Result<Option<usize>, ProtocolError> {
    let window = &buf[..buf.len().min(limits.max_bulk.saturating_add(2))];
    match window.iter().position(|&b| b == b'\n') {
        Some(i) if strip_eol(&buf[..=i]).len() <= limits.max_bulk => Ok(Some(i)),
        Some(_) => Err(ProtocolError::InlineTooLong {
            max: limits.max_bulk,
        }),
        None if buf.len() > limits.max_bulk.saturating_add(1) => {
            Err(ProtocolError::InlineTooLong {
                max: limits.max_bulk,
            })
        }
        None => Ok(None),
    }
}

/// Scans the array at the start of `buf` (see [`scan`]).
fn scan_array(
    buf: &[u8],
    limits: &Limits,
    base: usize,
    out: &mut Vec<Arg>,
) -> Result<Option<usize>, ProtocolError> {
    let Some((count, mut pos)) = header(buf, 1, ProtocolError::InvalidMultibulkLength)? else {
        return Ok(None);
    };
    if count <= 0 {
        return Ok(Some(pos));
    }
    if count > limits.max_elements as i64 {
        return Err(ProtocolError::TooManyElements {
            count,
            max: limits.max_elements,
        });
    }
    for _ in 0..count {
        let Some(&kind) = buf.get(pos) else {
            return Ok(None);
        };
        if kind != b'$' {
            return Err(ProtocolError::ExpectedBulk(kind));
        }
        let Some((len, start)) = header(buf, pos + 1, ProtocolError::InvalidBulkLength)? else {
            return Ok(None);
        };
        let Some((body, next)) = bulk_body(buf, start, len, limits)? else {
            return Ok(None);
        };
        out.push(Arg::At(base + body.start..base + body.end));
        pos = next;
    }
    Ok(Some(pos))
}

/// Reads the integer of a header line starting at `from` (just after its `*` or `$`) and
/// ending with `\r\n`: the number and the index after the line, or `None` if the line has
/// not fully arrived.
fn header(
    buf: &[u8],
    from: usize,
    bad: ProtocolError,
) -> Result<Option<(i64, usize)>, ProtocolError> {
    let rest = buf.get(from..).unwrap_or_default();
    // The usual header: up to 18 digits (no overflow possible), then CRLF. Read in one pass;
    // anything else (a sign, a long or bad number, a line still arriving) takes the strict
    // path. Headers were a third of a pipelined CL.THROTTLE's parsing.
    let mut n: i64 = 0;
    for (i, &b) in rest.iter().enumerate().take(19) {
        match b {
            b'0'..=b'9' if i < 18 => n = n * 10 + i64::from(b - b'0'),
            b'\r' if i > 0 && rest.get(i + 1) == Some(&b'\n') => {
                return Ok(Some((n, from + i + 2)))
            }
            _ => break,
        }
    }
    strict_header(buf, from, bad)
}

/// [`header`] without its fast path: every header line, whatever it holds.
fn strict_header(
    buf: &[u8],
    from: usize,
    bad: ProtocolError,
) -> Result<Option<(i64, usize)>, ProtocolError> {
    let rest = buf.get(from..).unwrap_or_default();
    let window = &rest[..rest.len().min(MAX_HEADER + 1)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        return if rest.len() > MAX_HEADER {
            Err(bad)
        } else {
            Ok(None)
        };
    };
    match rest.get(cr + 1) {
        None => return Ok(None),
        Some(b'\n') => {}
        Some(_) => return Err(bad),
    }
    let n = parse_int(&rest[..cr]).ok_or(bad)?;
    Ok(Some((n, from + cr + 2)))
}

/// A strict decimal integer: an optional `-`, then digits, no leading `+`, within `i64`.
pub fn parse_int(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        n = n.checked_mul(10)?;
        n = if negative {
            n.checked_sub(i64::from(d - b'0'))?
        } else {
            n.checked_add(i64::from(d - b'0'))?
        };
    }
    Some(n)
}

/// The body of a bulk string whose declared length `len` was read and whose data starts at
/// `start`: its byte range and where the next frame starts, `None` until it has all arrived.
/// The length is checked against the limits before anything waits for or keeps the data, so
/// a frame that lies about its length is refused without allocating it.
pub(crate) fn bulk_body(
    buf: &[u8],
    start: usize,
    len: i64,
    limits: &Limits,
) -> Result<Option<(Range<usize>, usize)>, ProtocolError> {
    if len < 0 {
        return Err(ProtocolError::InvalidBulkLength);
    }
    if len > limits.max_bulk as i64 {
        return Err(ProtocolError::BulkTooLarge {
            len,
            max: limits.max_bulk,
        });
    }
    // `len` <= max_bulk, so these sums cannot overflow in practice; saturate anyway.
    let end = start.saturating_add(len as usize);
    let next = end.saturating_add(2);
    if next > limits.max_frame {
        return Err(ProtocolError::FrameTooLarge {
            max: limits.max_frame,
        });
    }
    if buf.len() < next {
        return Ok(None);
    }
    if &buf[end..next] != b"\r\n" {
        return Err(ProtocolError::ExpectedCrlf);
    }
    Ok(Some((start..end, next)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_bulk: 16,
        max_elements: 4,
        max_frame: 48,
    };

    fn parse_all(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(args) = parse_request(&mut buf, &LIMITS)? {
            out.push(args.iter().map(|a| a.to_vec()).collect());
        }
        Ok(out)
    }

    fn args(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    #[test]
    fn an_array_of_bulk_strings_is_one_request() {
        let got = parse_all(b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n").unwrap();
        assert_eq!(got, vec![args(&["ECHO", "hi"])]);
    }

    #[test]
    fn pipelined_requests_come_out_in_order() {
        let got =
            parse_all(b"*1\r\n$4\r\nPING\r\nECHO a\r\n*2\r\n$4\r\nECHO\r\n$0\r\n\r\n").unwrap();
        assert_eq!(
            got,
            vec![args(&["PING"]), args(&["ECHO", "a"]), args(&["ECHO", ""])]
        );
    }

    #[test]
    fn a_request_split_anywhere_parses_the_same_once_complete() {
        let whole = b"*3\r\n$2\r\nab\r\n$1\r\nc\r\n$3\r\ndef\r\nPING x\r\n";
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            let mut got = Vec::new();
            while let Some(a) = parse_request(&mut buf, &LIMITS).unwrap() {
                got.push(a);
            }
            buf.extend_from_slice(&whole[cut..]);
            while let Some(a) = parse_request(&mut buf, &LIMITS).unwrap() {
                got.push(a);
            }
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(got[0], vec!["ab", "c", "def"]);
            assert_eq!(got[1], vec!["PING", "x"]);
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn a_batch_holds_what_parsing_one_by_one_gives_and_leaves_the_incomplete_tail() {
        let input =
            b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n*0\r\nECHO \"a b\" c\r\n*1\r\n$4\r\nPING\r\n*2\r\n$4";
        let mut one_by_one = BytesMut::from(&input[..]);
        let mut want = Vec::new();
        while let Some(args) = parse_request(&mut one_by_one, &LIMITS).unwrap() {
            want.push(args);
        }
        let mut buf = BytesMut::from(&input[..]);
        let (batch, error) = take_batch(&mut buf, &LIMITS, 10);
        assert_eq!(error, None);
        assert_eq!(batch.to_vecs(), want);
        assert_eq!(batch.len(), 3);
        let mut args = Vec::new();
        batch.args(1, &mut args);
        assert_eq!(args, [&b"ECHO"[..], b"a b", b"c"]);
        assert_eq!(&buf[..], b"*2\r\n$4");
        assert_eq!(buf, one_by_one);
        // Nothing complete: nothing split off (the buffer is not shared with the batch).
        let (batch, error) = take_batch(&mut buf, &LIMITS, 10);
        assert!(batch.is_empty() && batch.data.is_empty() && error.is_none());
        assert_eq!(&buf[..], b"*2\r\n$4");
    }

    #[test]
    fn an_incomplete_request_consumes_nothing() {
        let mut buf = BytesMut::from(&b"*2\r\n$4\r\nECHO\r\n$2\r\nh"[..]);
        assert_eq!(parse_request(&mut buf, &LIMITS), Ok(None));
        assert_eq!(buf.len(), 19);
    }

    #[test]
    fn empty_arrays_and_blank_lines_are_skipped() {
        assert_eq!(
            parse_all(b"*0\r\n\r\n   \r\n*-1\r\nPING\n").unwrap(),
            vec![args(&["PING"])]
        );
    }

    #[test]
    fn a_bulk_length_beyond_the_limit_is_refused_before_its_data_arrives() {
        let mut buf = BytesMut::from(&b"*1\r\n$999999999\r\n"[..]);
        assert_eq!(
            parse_request(&mut buf, &LIMITS),
            Err(ProtocolError::BulkTooLarge {
                len: 999_999_999,
                max: 16
            })
        );
    }

    #[test]
    fn an_array_declaring_too_many_elements_is_refused_at_its_header() {
        let mut buf = BytesMut::from(&b"*5\r\n"[..]);
        assert_eq!(
            parse_request(&mut buf, &LIMITS),
            Err(ProtocolError::TooManyElements { count: 5, max: 4 })
        );
    }

    #[test]
    fn a_request_whose_elements_add_up_past_the_frame_limit_is_refused() {
        let mut buf = BytesMut::from(&b"*4\r\n$16\r\n0123456789abcdef\r\n$16\r\n"[..]);
        assert_eq!(
            parse_request(&mut buf, &LIMITS),
            Err(ProtocolError::FrameTooLarge { max: 48 })
        );
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let cases: &[(&[u8], ProtocolError)] = &[
            (b"*x\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*+1\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*1\r\n$-1\r\n", ProtocolError::InvalidBulkLength),
            (b"*1\r\n$1x\r\n", ProtocolError::InvalidBulkLength),
            (b"*1\r\n:1\r\n", ProtocolError::ExpectedBulk(b':')),
            (b"*1\r\n$1\r\nab\r\n", ProtocolError::ExpectedCrlf),
            (b"*1\rx", ProtocolError::InvalidMultibulkLength),
            (
                b"*99999999999999999999999\r\n",
                ProtocolError::InvalidMultibulkLength,
            ),
            (
                b"*1\r\n$00000000000000000000000000001\r\n",
                ProtocolError::InvalidBulkLength,
            ),
            (b"ECHO \"a\r\n", ProtocolError::UnbalancedQuotes),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_all(input).as_ref(),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn a_header_without_its_line_end_waits_until_it_is_too_long() {
        assert_eq!(parse_all(b"*123"), Ok(vec![]));
        assert_eq!(parse_all(b"*1\r\n$12"), Ok(vec![]));
        assert_eq!(
            parse_all(b"*1111111111111111111111"),
            Err(ProtocolError::InvalidMultibulkLength)
        );
    }

    #[test]
    fn an_inline_line_of_more_arguments_than_an_array_may_hold_is_refused() {
        assert_eq!(
            parse_all(b"A b c d\r\n").unwrap(),
            vec![args(&["A", "b", "c", "d"])]
        );
        assert_eq!(
            parse_all(b"A b c d e\r\n"),
            Err(ProtocolError::TooManyElements { count: 5, max: 4 })
        );
    }

    #[test]
    fn an_inline_line_longer_than_the_limit_is_refused_even_without_its_end() {
        assert_eq!(parse_all(b"0123456789abcdef\r\n").unwrap().len(), 1);
        assert_eq!(
            parse_all(b"0123456789abcdefg\r\n"),
            Err(ProtocolError::InlineTooLong { max: 16 })
        );
        assert_eq!(
            parse_all(b"0123456789abcdefgh"),
            Err(ProtocolError::InlineTooLong { max: 16 })
        );
        assert_eq!(parse_all(b"0123456789abcdef"), Ok(vec![]));
    }

    #[test]
    fn the_header_fast_path_reads_what_the_strict_path_reads() {
        let mut lines: Vec<Vec<u8>> = Vec::new();
        for digits in 0..=24 {
            let number: String = (0..digits)
                .map(|i| char::from(b'0' + (i * 7 % 10) as u8))
                .collect();
            for prefix in ["", "-", "+", "0", " "] {
                for end in ["\r\n", "\r", "", "\rx", "\n", "x\r\n", "\r\n*"] {
                    lines.push(format!("*{prefix}{number}{end}").into_bytes());
                }
            }
        }
        lines.push(b"*9223372036854775807\r\n".to_vec());
        lines.push(b"*999999999999999999\r\n".to_vec());
        lines.push(b"*9999999999999999999\r\n".to_vec());
        for line in lines {
            let bad = ProtocolError::InvalidMultibulkLength;
            assert_eq!(
                header(&line, 1, bad.clone()),
                strict_header(&line, 1, bad),
                "{:?}",
                String::from_utf8_lossy(&line)
            );
        }
    }

    #[test]
    fn integers_parse_strictly_within_i64() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-12"), Some(-12));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_int(b"9223372036854775808"), None);
        for bad in [&b""[..], b"-", b"+1", b" 1", b"1 ", b"1.5", b"0x1"] {
            assert_eq!(parse_int(bad), None);
        }
    }

    #[test]
    fn limits_from_the_config_allow_a_whole_frame_of_twice_the_bulk_limit() {
        let l = Limits::from_max_frame_bytes(65536);
        assert_eq!(
            (l.max_bulk, l.max_elements, l.max_frame),
            (65536, 1024, 131072)
        );
    }
}
