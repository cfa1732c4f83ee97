//! Proof-of-work challenge verification on arbitrary input: the challenge
//! and the counters, split from one input at newlines. Never a panic; a
//! forged challenge never verifies.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice_pow::Keyset;

const NOW_MS: u64 = 1_800_000_000_000;

fn keys() -> &'static Keyset {
    static K: OnceLock<Keyset> = OnceLock::new();
    K.get_or_init(|| Keyset::from_secret(b"fuzz-secret-0123456789abcdef").expect("keys"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = s.split('\n');
    let challenge = lines.next().unwrap_or("");
    let solutions: Vec<&str> = lines.collect();
    // Without the secret no challenge can be made: nothing verifies.
    assert!(
        keys()
            .verify(challenge, &solutions, "default", NOW_MS)
            .is_err()
    );
});
