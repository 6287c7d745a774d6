//! Node config files on arbitrary text: options or an error, and options become a node
//! configuration or an error that says what to fix, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quorate::config::NodeOptions;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(options) = NodeOptions::from_toml(text) {
            if let Ok(config) = options.to_config() {
                assert!(config.shards >= 1 && config.max_keys >= 1);
            }
        }
    }
});
