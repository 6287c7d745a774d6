//! Writing RESP2 frames. Simple strings and errors are single lines by definition, and error
//! messages can quote what a client sent (`unknown command '...'`), so CR and LF in them are
//! replaced with spaces: a client must never be able to inject a reply.

use super::frame::Frame;
use bytes::{BufMut, BytesMut};

/// Appends `frame` to `out`.
pub fn encode(frame: &Frame, out: &mut BytesMut) {
    match frame {
        Frame::Simple(s) => line(out, b'+', s.as_bytes()),
        Frame::Error(s) => line(out, b'-', s.as_bytes()),
        Frame::Integer(n) => number(out, b':', *n),
        Frame::Bulk(b) => {
            number(out, b'$', i64::try_from(b.len()).unwrap_or(i64::MAX));
            out.put_slice(b);
            out.put_slice(b"\r\n");
        }
        Frame::Null => out.put_slice(b"$-1\r\n"),
        Frame::Array(items) => {
            number(out, b'*', i64::try_from(items.len()).unwrap_or(i64::MAX));
            for item in items {
                encode(item, out);
            }
        }
    }
}

/// Appends an array of integers: the encoding of `Frame::Array` of `Frame::Integer`s,
/// without building the frames.
pub fn integers(numbers: &[i64], out: &mut BytesMut) {
    number(out, b'*', i64::try_from(numbers.len()).unwrap_or(i64::MAX));
    for &n in numbers {
        number(out, b':', n);
    }
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
    // itoa, not `fmt`, and the line built on the stack then appended at once: integers are
    // most of a reply, and both `fmt` and three appends showed in profiles.
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(n).as_bytes();
    // Longest: the kind, i64::MIN's 20 characters, CRLF.
    let mut line = [0u8; 23];
    let end = 1 + digits.len();
    line[0] = kind;
    line[1..end].copy_from_slice(digits);
    line[end..end + 2].copy_from_slice(b"\r\n");
    out.extend_from_slice(&line[..end + 2]);
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
    fn line_breaks_in_errors_and_simple_strings_cannot_inject_a_reply() {
        assert_eq!(enc(Frame::err("a\r\n+OK")), "-ERR a  +OK\r\n");
        assert_eq!(enc(Frame::simple("x\ny")), "+x y\r\n");
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
