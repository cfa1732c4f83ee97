//! The gateway's clock: Unix time as the gateway sees it, from
//! `sluice-clock` (the same clock the domain crates' memory stores read by
//! default). The Redis stores keep their own (Redis `TIME`); this one
//! stamps tokens, challenges and webhooks.

pub use sluice_clock::{now_ms, now_s};
