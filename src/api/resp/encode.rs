//! Writing RESP2 and RESP3 frames. Simple strings and errors are single lines by definition,
//! and error messages can quote what a client sent (`unknown command '...'`), so CR and LF in
//! them are replaced with spaces: a client must never be able to inject a reply.
//!
//! The two protocols differ only in nulls and maps here; every check reply (integers, bulk
//! strings and arrays) is the same bytes in both, so the fast writers below serve both.

use super::frame::{Frame, Protocol};
use bytes::{BufMut, BytesMut};

/// Appends `frame` to `out` in RESP2.
pub fn encode(frame: &Frame, out: &mut BytesMut) {
    encode_as(frame, Protocol::Resp2, out)
}

/// Appends `frame` to `out` in the given protocol.
pub fn encode_as(frame: &Frame, proto: Protocol, out: &mut BytesMut) {
    match frame {
        Frame::Simple(s) => line(out, b'+', s.as_bytes()),
        Frame::Error(s) => line(out, b'-', s.as_bytes()),
        Frame::Integer(n) => number(out, b':', *n),
        Frame::Bulk(b) => bulk(b, out),
        Frame::Null => match proto {
            Protocol::Resp2 => out.put_slice(b"$-1\r\n"),
            Protocol::Resp3 => out.put_slice(b"_\r\n"),
        },
        Frame::Array(items) => {
            array_header(items.len(), out);
            for item in items {
                encode_as(item, proto, out);
            }
        }
        Frame::Map(pairs) => {
            match proto {
                Protocol::Resp2 => array_header(pairs.len().saturating_mul(2), out),
                Protocol::Resp3 => number(out, b'%', pairs.len() as i64),
            }
            for (field, value) in pairs {
                encode_as(field, proto, out);
                encode_as(value, proto, out);
            }
        }
    }
}

/// Appends an array of integers: the encoding of `Frame::Array` of `Frame::Integer`s,
/// without building the frames. A short array (every `CL.THROTTLE` reply) is built on the
/// stack and appended at once: per-number appends and formatting showed in profiles of
/// pipelined load.
pub fn integers(numbers: &[i64], out: &mut BytesMut) {
    if numbers.len() > SHORT {
        array_header(numbers.len(), out);
        integers_in_place(numbers, out);
        return;
    }
    let mut reply = [0u8; 23 * (SHORT + 1)];
    let at = put_number(&mut reply, 0, b'*', numbers.len() as i64);
    let at = put_numbers(&mut reply, at, numbers);
    out.extend_from_slice(&reply[..at]);
}

/// Appends integers one after another (no array header): the encoding of each
/// `Frame::Integer`. Up to [`SHORT`] of them at a time are built on the stack and appended
/// at once.
pub fn integers_in_place(numbers: &[i64], out: &mut BytesMut) {
    for chunk in numbers.chunks(SHORT) {
        let mut buf = [0u8; 23 * SHORT];
        let at = put_numbers(&mut buf, 0, chunk);
        out.extend_from_slice(&buf[..at]);
    }
}

/// How many integers are formatted on the stack at once.
const SHORT: usize = 8;

/// Writes `:n\r\n` for each of `numbers` (at most 23 bytes each) at `at`; returns the end.
fn put_numbers(buf: &mut [u8], mut at: usize, numbers: &[i64]) -> usize {
    for &n in numbers {
        at = put_number(buf, at, b':', n);
    }
    at
}

/// Appends an array's header: `*len`.
pub fn array_header(len: usize, out: &mut BytesMut) {
    number(out, b'*', i64::try_from(len).unwrap_or(i64::MAX));
}

/// Appends a bulk string: the encoding of `Frame::Bulk`.
pub fn bulk(bytes: &[u8], out: &mut BytesMut) {
    number(out, b'$', i64::try_from(bytes.len()).unwrap_or(i64::MAX));
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// Writes `kind`, `n` in decimal and CRLF at `at` (at most 23 bytes); returns the end.
fn put_number(buf: &mut [u8], mut at: usize, kind: u8, n: i64) -> usize {
    buf[at] = kind;
    at += 1;
    if n < 0 {
        buf[at] = b'-';
        at += 1;
    }
    let mut v = n.unsigned_abs();
    // Digits counted by division, not a logarithm: most numbers of a reply are below 100.
    let mut digits = 1;
    let mut rest = v / 10;
    while rest > 0 {
        digits += 1;
        rest /= 10;
    }
    let end = at + digits;
    for i in (at..end).rev() {
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    buf[end] = b'\r';
    buf[end + 1] = b'\n';
    end + 2
}

/// The encoding of one frame, for tests and the client.
pub fn to_bytes(frame: &Frame) -> BytesMut {
    let mut out = BytesMut::new();
    encode(frame, &mut out);
    out
}

fn line(out: &mut BytesMut, kind: u8, text: &[u8]) {
    out.put_u8(kind);
    out.extend(text.iter().map(|&b| match b {
        b'\r' | b'\n' => b' ',
        b => b,
    }));
    out.put_slice(b"\r\n");
}

fn number(out: &mut BytesMut, kind: u8, n: i64) {
    // Formatted on the stack, then appended at once: integers are most of a reply, and both
    // `fmt` and three appends showed in profiles.
    let mut line = [0u8; 23];
    let end = put_number(&mut line, 0, kind, n);
    out.extend_from_slice(&line[..end]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(f: Frame) -> String {
        String::from_utf8(to_bytes(&f).to_vec()).unwrap()
    }

    #[test]
    fn each_frame_type_has_its_resp2_encoding() {
        assert_eq!(enc(Frame::simple("OK")), "+OK\r\n");
        assert_eq!(enc(Frame::err("boom")), "-ERR boom\r\n");
        assert_eq!(enc(Frame::Integer(-1)), ":-1\r\n");
        assert_eq!(enc(Frame::Integer(i64::MIN)), ":-9223372036854775808\r\n");
        assert_eq!(enc(Frame::bulk("hi")), "$2\r\nhi\r\n");
        assert_eq!(enc(Frame::bulk("")), "$0\r\n\r\n");
        assert_eq!(enc(Frame::Null), "$-1\r\n");
        assert_eq!(enc(Frame::Array(vec![])), "*0\r\n");
        assert_eq!(
            enc(Frame::Array(vec![
                Frame::Integer(1),
                Frame::Array(vec![Frame::bulk("a")])
            ])),
            "*2\r\n:1\r\n*1\r\n$1\r\na\r\n"
        );
    }

    #[test]
    fn nulls_and_maps_differ_between_resp2_and_resp3_and_nothing_else_does() {
        let map = Frame::Map(vec![
            (Frame::bulk("proto"), Frame::Integer(3)),
            (Frame::bulk("leader"), Frame::Null),
        ]);
        let as_ = |f: &Frame, p| {
            let mut out = BytesMut::new();
            encode_as(f, p, &mut out);
            String::from_utf8(out.to_vec()).unwrap()
        };
        assert_eq!(
            as_(&map, Protocol::Resp2),
            "*4\r\n$5\r\nproto\r\n:3\r\n$6\r\nleader\r\n$-1\r\n"
        );
        assert_eq!(
            as_(&map, Protocol::Resp3),
            "%2\r\n$5\r\nproto\r\n:3\r\n$6\r\nleader\r\n_\r\n"
        );
        assert_eq!(as_(&Frame::Map(vec![]), Protocol::Resp3), "%0\r\n");
        // Nested in an array, too.
        assert_eq!(
            as_(&Frame::Array(vec![Frame::Null]), Protocol::Resp3),
            "*1\r\n_\r\n"
        );
        // Everything else is the same bytes.
        let same = Frame::Array(vec![
            Frame::simple("OK"),
            Frame::err("x"),
            Frame::Integer(-7),
            Frame::bulk("b"),
            Frame::Array(vec![]),
        ]);
        assert_eq!(as_(&same, Protocol::Resp3), as_(&same, Protocol::Resp2));
        assert_eq!(as_(&same, Protocol::Resp2), enc(same));
    }

    #[test]
    fn line_breaks_in_errors_and_simple_strings_cannot_inject_a_reply() {
        assert_eq!(enc(Frame::err("a\r\n+OK")), "-ERR a  +OK\r\n");
        assert_eq!(enc(Frame::simple("x\ny")), "+x y\r\n");
    }

    #[test]
    fn integer_arrays_encode_as_arrays_of_integer_frames() {
        let edges = [
            0,
            1,
            -1,
            9,
            10,
            -10,
            99,
            100,
            999_999,
            1_000_000,
            i64::MAX,
            i64::MIN,
            i64::MIN + 1,
        ];
        let mut lists: Vec<Vec<i64>> = vec![vec![], edges.to_vec()];
        lists.extend(edges.chunks(5).map(<[i64]>::to_vec));
        lists.push(vec![i64::MIN; 8]);
        for numbers in lists {
            let mut out = BytesMut::new();
            integers(&numbers, &mut out);
            let frame = Frame::Array(numbers.iter().copied().map(Frame::Integer).collect());
            assert_eq!(out, to_bytes(&frame), "{numbers:?}");
        }
        for n in edges.into_iter().chain((-1000..1000).map(|i| i * 7919)) {
            assert_eq!(enc(Frame::Integer(n)), format!(":{n}\r\n"));
        }
    }

    #[test]
    fn bulk_strings_carry_any_bytes() {
        assert_eq!(enc(Frame::bulk("a\r\nb")), "$4\r\na\r\nb\r\n");
    }

    #[test]
    fn unsigned_counts_saturate_to_the_resp_integer_range() {
        assert_eq!(Frame::uint(u64::MAX), Frame::Integer(i64::MAX));
        assert_eq!(Frame::uint(7), Frame::Integer(7));
    }
}
