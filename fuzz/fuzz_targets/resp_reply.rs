//! Arbitrary bytes from a server: the reply decoder and the client's typed answers must
//! never panic, whatever a misbehaving node sends.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use quorate::api::resp::decode::parse_reply;
use quorate::api::resp::encode::to_bytes;
use quorate::api::resp::frame::Limits;
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
        let _ = check_answer(frame.clone());
        let _ = throttle_answer(frame);
    }
});
