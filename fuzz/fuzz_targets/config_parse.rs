//! The TOML configuration on arbitrary text: parsed and validated without
//! a panic (a bad config is a one-line error, never a crash).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_gateway::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = Config::from_toml(text) {
        let _ = c.validate();
        let _ = c.with_defaults().validate();
    }
});
