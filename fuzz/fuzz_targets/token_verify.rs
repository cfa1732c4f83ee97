//! Queue and admission token verification on arbitrary input: never a
//! panic, and nothing but the genuine tokens verifies.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use sluice_admission::{AdmitClaims, Keyring, QueueClaims};

const NOW: u64 = 1_800_000_000;

struct Fixture {
    ring: Keyring,
    queue: String,
    admit: String,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let ring = Keyring::ephemeral();
        let q = QueueClaims::new("default", "visitor", 7, 1, NOW, Duration::from_secs(600));
        let a = AdmitClaims::new("default", "visitor", 1, NOW, Duration::from_secs(600));
        Fixture {
            queue: ring.sign_queue(&q).expect("sign"),
            admit: ring.sign_admit(&a).expect("sign"),
            ring,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let q = f.ring.verify_queue(s, "default", NOW);
    assert_eq!(q.is_ok(), s == f.queue, "{s}");
    let a = f.ring.verify_admit(s, "default", NOW);
    assert_eq!(a.is_ok(), s == f.admit, "{s}");
});
