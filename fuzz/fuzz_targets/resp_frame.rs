//! Arbitrary bytes from a client: the request parser and the command parser must never
//! panic, and parsing the bytes as they trickle in (in chunks) must give exactly what parsing
//! them all at once gives, and taking them as batches (as the server does) gives the same
//! requests as taking them one by one.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use quorate::api::resp::command;
use quorate::api::resp::frame::{parse_request, take_batch, Limits, ProtocolError};

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
                let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
                let _ = command::parse(&refs);
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

    // Batches of at most 1 + data[1] % 7 requests, as a connection takes them.
    let max = 1 + data.get(1).map_or(0, |b| usize::from(*b) % 7);
    let mut batched: Parsed = (Vec::new(), None);
    let mut buf = BytesMut::from(data);
    loop {
        let (batch, error) = take_batch(&mut buf, &LIMITS, max);
        assert!(batch.len() <= max);
        let n = batch.len();
        batched.0.extend(batch.to_vecs());
        if error.is_some() {
            batched.1 = error;
            break;
        }
        if n == 0 {
            break;
        }
    }
    // A batch also ends after a QUIT, which the loop above simply continues past.
    assert_eq!(whole, batched);
});
