//! Arbitrary bytes from a server: the reply decoder and the client's typed answers must
//! never panic, whatever a misbehaving node sends.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use quorate::api::resp::decode::parse_reply;
use quorate::api::resp::encode::{encode_as, to_bytes};
use quorate::api::resp::frame::{Limits, Protocol};
use quorate::client::resp::{check_answer, throttle_answer};

const LIMITS: Limits = Limits {
    max_bulk: 64,
    max_elements: 8,
    max_frame: 512,
};

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = parse_reply(&mut buf, &LIMITS) {
        // What was decoded encodes and decodes again (lossy UTF-8 may have grown its lines).
        let roomy = Limits {
            max_bulk: 4096,
            max_elements: LIMITS.max_elements,
            max_frame: usize::MAX,
        };
        let again = parse_reply(&mut to_bytes(&frame), &roomy);
        assert!(matches!(again, Ok(Some(_))), "{frame:?} -> {again:?}");
        // And in RESP3 (nulls `_`, maps `%`), as a connection writes after `HELLO 3`.
        let mut resp3 = BytesMut::new();
        encode_as(&frame, Protocol::Resp3, &mut resp3);
        let again = parse_reply(&mut resp3, &roomy);
        assert!(matches!(again, Ok(Some(_))), "{frame:?} -> {again:?} (RESP3)");
        let _ = check_answer(frame.clone());
        let _ = throttle_answer(frame);
    }
});
