//! Arbitrary bytes from a client: the request parser and the command parser must never
//! panic, and parsing the bytes as they trickle in (in chunks) must give exactly what parsing
//! them all at once gives.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use quorate::api::resp::command;
use quorate::api::resp::frame::{parse_request, Limits, ProtocolError};

/// Small limits, so the fuzzer reaches every bound quickly.
const LIMITS: Limits = Limits {
    max_bulk: 64,
    max_elements: 8,
    max_frame: 256,
};

type Parsed = (Vec<Vec<bytes::Bytes>>, Option<ProtocolError>);

/// Parses everything complete in `buf` into `out`; false once an error stopped it.
fn drain(buf: &mut BytesMut, out: &mut Parsed) -> bool {
    loop {
        match parse_request(buf, &LIMITS) {
            Ok(Some(args)) => {
                assert!(!args.is_empty(), "empty requests are skipped");
                let _ = command::parse(&args);
                out.0.push(args);
            }
            Ok(None) => return true,
            Err(e) => {
                out.1 = Some(e);
                return false;
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut whole: Parsed = (Vec::new(), None);
    drain(&mut BytesMut::from(data), &mut whole);

    let step = 1 + data.first().map_or(0, |b| usize::from(*b) % 13);
    let mut chunked: Parsed = (Vec::new(), None);
    let mut buf = BytesMut::new();
    for chunk in data.chunks(step) {
        buf.extend_from_slice(chunk);
        if !drain(&mut buf, &mut chunked) {
            break;
        }
        // The parser keeps at most one incomplete request: bounded by the limits.
        assert!(
            buf.len() <= LIMITS.max_frame + step,
            "buffer grew to {}",
            buf.len()
        );
    }
    assert_eq!(whole, chunked);
});
