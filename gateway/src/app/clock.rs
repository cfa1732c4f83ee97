//! The gateway's clock: Unix time as the gateway sees it. The admission
//! store keeps its own (Redis `TIME`); this one stamps tokens and
//! challenges.

/// Milliseconds since the Unix epoch (the gateway's clock; the admission
/// store uses its own).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Seconds since the Unix epoch.
pub fn now_s() -> u64 {
    now_ms() / 1000
}
