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
    out.put_u8(kind);
    // itoa, not `fmt`: integers are most of a reply, and `fmt` showed in profiles.
    out.put_slice(itoa::Buffer::new().format(n).as_bytes());
    out.put_slice(b"\r\n");
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
