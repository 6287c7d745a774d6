//! Policy files on arbitrary text: a validated set or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(set) = quorate::policy::PolicySet::from_toml(text) {
            assert_eq!(set.limits.len(), set.options.len());
        }
    }
});
