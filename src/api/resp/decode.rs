//! Reading RESP2 replies, and the RESP3 null and map quorate sends after `HELLO 3`: what the
//! client (and the tests) need to understand a server.
//!
//! The same distrust as the request parser: declared lengths are checked against [`Limits`]
//! before their data is awaited, nothing is reserved from them, arrays nest at most
//! [`MAX_DEPTH`] deep (so a hostile server cannot overflow the stack), and a partial reply
//! consumes nothing.

use super::frame::{bulk_body, parse_int, Frame, Limits, ProtocolError};
use bytes::{Bytes, BytesMut};

/// Deepest nesting of arrays accepted in a reply (quorate's replies nest two deep).
pub const MAX_DEPTH: usize = 8;

/// Takes the first complete reply out of `buf`, or `None` if it has not fully arrived.
pub fn parse_reply(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Frame>, ProtocolError> {
    let Some((frame, len)) = scan(buf, 0, 0, limits)? else {
        return Ok(None);
    };
    let _ = buf.split_to(len);
    Ok(Some(frame))
}

/// The frame starting at `pos` and the index after it.
fn scan(
    buf: &[u8],
    pos: usize,
    depth: usize,
    limits: &Limits,
) -> Result<Option<(Frame, usize)>, ProtocolError> {
    if pos > limits.max_frame {
        return Err(ProtocolError::FrameTooLarge {
            max: limits.max_frame,
        });
    }
    let Some(&kind) = buf.get(pos) else {
        return Ok(None);
    };
    let Some((text, next)) = line(buf, pos + 1, limits)? else {
        return Ok(None);
    };
    match kind {
        b'+' => Ok(Some((Frame::Simple(lossy(text)), next))),
        b'-' => Ok(Some((Frame::Error(lossy(text)), next))),
        b':' => {
            let n = parse_int(text).ok_or(ProtocolError::InvalidBulkLength)?;
            Ok(Some((Frame::Integer(n), next)))
        }
        b'$' => bulk(buf, text, next, limits),
        b'*' => array(buf, text, next, depth, limits),
        b'_' if text.is_empty() => Ok(Some((Frame::Null, next))),
        b'%' => map(buf, text, next, depth, limits),
        other => Err(ProtocolError::UnexpectedType(other)),
    }
}

fn bulk(
    buf: &[u8],
    header: &[u8],
    start: usize,
    limits: &Limits,
) -> Result<Option<(Frame, usize)>, ProtocolError> {
    let len = parse_int(header).ok_or(ProtocolError::InvalidBulkLength)?;
    if len == -1 {
        return Ok(Some((Frame::Null, start)));
    }
    Ok(bulk_body(buf, start, len, limits)?
        .map(|(body, next)| (Frame::Bulk(Bytes::copy_from_slice(&buf[body])), next)))
}

fn array(
    buf: &[u8],
    header: &[u8],
    pos: usize,
    depth: usize,
    limits: &Limits,
) -> Result<Option<(Frame, usize)>, ProtocolError> {
    let count = parse_int(header).ok_or(ProtocolError::InvalidMultibulkLength)?;
    if count == -1 {
        return Ok(Some((Frame::Null, pos)));
    }
    Ok(items(buf, count, pos, depth, limits)?.map(|(items, next)| (Frame::Array(items), next)))
}

/// A RESP3 map: `%<pairs>` then a field and a value per pair.
fn map(
    buf: &[u8],
    header: &[u8],
    pos: usize,
    depth: usize,
    limits: &Limits,
) -> Result<Option<(Frame, usize)>, ProtocolError> {
    let pairs = parse_int(header).ok_or(ProtocolError::InvalidMultibulkLength)?;
    let Some((items, next)) = items(buf, pairs.saturating_mul(2), pos, depth, limits)? else {
        return Ok(None);
    };
    let mut items = items.into_iter();
    let mut out = Vec::with_capacity(items.len() / 2);
    while let (Some(field), Some(value)) = (items.next(), items.next()) {
        out.push((field, value));
    }
    Ok(Some((Frame::Map(out), next)))
}

/// `count` frames one after another from `pos` (an array's or a map's), within the limits.
fn items(
    buf: &[u8],
    count: i64,
    mut pos: usize,
    depth: usize,
    limits: &Limits,
) -> Result<Option<(Vec<Frame>, usize)>, ProtocolError> {
    if count < 0 {
        return Err(ProtocolError::InvalidMultibulkLength);
    }
    if count > limits.max_elements as i64 {
        return Err(ProtocolError::TooManyElements {
            count,
            max: limits.max_elements,
        });
    }
    if depth >= MAX_DEPTH {
        return Err(ProtocolError::TooDeep);
    }
    let mut items = Vec::new();
    for _ in 0..count {
        let Some((item, next)) = scan(buf, pos, depth + 1, limits)? else {
            return Ok(None);
        };
        items.push(item);
        pos = next;
    }
    Ok(Some((items, pos)))
}

/// The text of the line starting at `from` and the index after its `\r\n`.
fn line<'a>(
    buf: &'a [u8],
    from: usize,
    limits: &Limits,
) -> Result<Option<(&'a [u8], usize)>, ProtocolError> {
    let rest = buf.get(from..).unwrap_or_default();
    let max = limits.max_bulk;
    let window = &rest[..rest.len().min(max.saturating_add(2))];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(i) => Ok(Some((&rest[..i], from + i + 2))),
        None if rest.len() > max.saturating_add(1) => Err(ProtocolError::InlineTooLong { max }),
        None => Ok(None),
    }
}

fn lossy(text: &[u8]) -> String {
    String::from_utf8_lossy(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::super::encode::to_bytes;
    use super::*;

    const LIMITS: Limits = Limits {
        max_bulk: 64,
        max_elements: 8,
        max_frame: 256,
    };

    fn one(input: &[u8]) -> Result<Option<Frame>, ProtocolError> {
        parse_reply(&mut BytesMut::from(input), &LIMITS)
    }

    #[test]
    fn what_the_encoder_writes_the_decoder_reads_back() {
        let frames = [
            Frame::simple("PONG"),
            Frame::err("nope"),
            Frame::Integer(-42),
            Frame::bulk("a\r\nb"),
            Frame::Null,
            Frame::Array(vec![
                Frame::Integer(1),
                Frame::Array(vec![Frame::bulk("k"), Frame::Null]),
                Frame::Array(vec![]),
            ]),
        ];
        for f in frames {
            assert_eq!(one(&to_bytes(&f)), Ok(Some(f.clone())));
        }
    }

    #[test]
    fn a_partial_reply_consumes_nothing() {
        let whole = to_bytes(&Frame::Array(vec![Frame::bulk("abc"), Frame::Integer(5)]));
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(parse_reply(&mut buf, &LIMITS), Ok(None), "cut at {cut}");
            assert_eq!(buf.len(), cut);
        }
    }

    #[test]
    fn a_null_array_decodes_as_null() {
        assert_eq!(one(b"*-1\r\n"), Ok(Some(Frame::Null)));
    }

    #[test]
    fn resp3_nulls_and_maps_read_back() {
        let map = Frame::Map(vec![
            (Frame::bulk("proto"), Frame::Integer(3)),
            (Frame::bulk("modules"), Frame::Array(vec![Frame::Null])),
        ]);
        let mut bytes = BytesMut::new();
        super::super::encode::encode_as(&map, super::super::frame::Protocol::Resp3, &mut bytes);
        assert_eq!(one(&bytes), Ok(Some(map)));
        assert_eq!(one(b"_\r\n"), Ok(Some(Frame::Null)));
        assert_eq!(one(b"%0\r\n"), Ok(Some(Frame::Map(vec![]))));
        // A partial map consumes nothing; a hostile one is refused.
        assert_eq!(one(b"%1\r\n+a\r\n"), Ok(None));
        assert!(matches!(
            one(b"%5\r\n"),
            Err(ProtocolError::TooManyElements { .. })
        ));
        assert_eq!(one(b"%-1\r\n"), Err(ProtocolError::InvalidMultibulkLength));
        assert_eq!(one(b"_x\r\n"), Err(ProtocolError::UnexpectedType(b'_')));
    }

    #[test]
    fn hostile_replies_are_refused_not_trusted() {
        assert!(matches!(
            one(b"$999999\r\n"),
            Err(ProtocolError::BulkTooLarge { .. })
        ));
        assert!(matches!(
            one(b"*9\r\n"),
            Err(ProtocolError::TooManyElements { .. })
        ));
        assert_eq!(one(b"?x\r\n"), Err(ProtocolError::UnexpectedType(b'?')));
        assert_eq!(one(b":1.5\r\n"), Err(ProtocolError::InvalidBulkLength));
        assert_eq!(one(b"$1\r\nab\r\n"), Err(ProtocolError::ExpectedCrlf));
        assert_eq!(one(b"$-2\r\n"), Err(ProtocolError::InvalidBulkLength));
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1);
        assert_eq!(one(deep.as_bytes()), Err(ProtocolError::TooDeep));
        let long = format!("+{}\r\n", "x".repeat(100));
        assert!(matches!(
            one(long.as_bytes()),
            Err(ProtocolError::InlineTooLong { .. })
        ));
    }

    #[test]
    fn a_reply_larger_than_the_frame_limit_is_refused() {
        let big = Frame::Array((0..8).map(|_| Frame::bulk(vec![b'x'; 60])).collect());
        assert!(matches!(
            one(&to_bytes(&big)),
            Err(ProtocolError::FrameTooLarge { .. })
        ));
    }
}
