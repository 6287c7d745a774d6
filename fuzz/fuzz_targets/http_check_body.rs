//! The `/v1/check` body decoder on arbitrary bytes: a request or a 400, never a panic, and
//! whatever it accepts respects the bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quorate::api::http::request::{parse_check_body, Bounds};

fuzz_target!(|data: &[u8]| {
    let bounds = Bounds {
        max_key_len: 64,
        max_items: 4,
    };
    if let Ok(req) = parse_check_body(data, &bounds) {
        assert!(!req.items.is_empty() && req.items.len() <= bounds.max_items);
        assert!(req.items.iter().all(|i| !i.key.is_empty() && i.key.len() <= bounds.max_key_len));
    }
});
