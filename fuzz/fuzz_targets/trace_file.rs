//! Simulator trace files on arbitrary bytes: arrivals in time order or a line-numbered
//! error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(w) = quorate::sim::trace::parse(data, "fuzz") {
        assert!(w.arrivals.windows(2).all(|p| p[0].at <= p[1].at));
    }
});
