//! The admin API's lockout: failed authentications counted per client
//! network, so the admin token cannot be guessed at wire speed.

/// Failed admin authentications a client network (its /24 or /56, as for
/// joins) may make per minute; past it, admin calls from that network
/// answer 429 until the minute is over.
pub const ADMIN_FAILURES_PER_MIN: u32 = 20;

/// Most client networks whose failed admin authentications are tracked at
/// once.
const ADMIN_FAILURES_TRACKED: usize = 100_000;

/// Failed admin authentications per client network, in fixed one-minute
/// windows. The admin token is compared in constant time; this bounds how
/// many guesses a network gets. While a network is over the limit its
/// calls are refused *without* comparing the token, so a guess made then
/// teaches nothing (a locked-out operator waits out the minute, or calls
/// from another network).
///
/// Memory is bounded: at [`ADMIN_FAILURES_TRACKED`] networks, the windows
/// that ended are dropped; if the map is still full, a network not yet
/// tracked is not tracked (its failures are not counted until room frees
/// up, at the latest a minute later). A tracked network is never reset
/// early, so a blocked one stays blocked however many other networks fail.
pub(crate) struct AdminFailures {
    cap: usize,
    windows: std::sync::Mutex<Windows>,
}

impl Default for AdminFailures {
    fn default() -> Self {
        AdminFailures::with_cap(ADMIN_FAILURES_TRACKED)
    }
}

impl AdminFailures {
    fn with_cap(cap: usize) -> AdminFailures {
        AdminFailures {
            cap,
            windows: std::sync::Mutex::default(),
        }
    }

    /// Seconds to wait when `net` is over the limit at `now_s`.
    pub(crate) fn blocked(&self, net: sluice_pow::NetPrefix, now_s: u64) -> Option<u64> {
        let map = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let (start, n) = *map.get(&net)?;
        let end = start + 60;
        (n >= ADMIN_FAILURES_PER_MIN && now_s < end).then(|| end - now_s)
    }

    pub(crate) fn record(&self, net: sluice_pow::NetPrefix, now_s: u64) {
        let mut map = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let Some(w) = window(&mut map, self.cap, net, now_s) else {
            return;
        };
        if now_s >= w.0 + 60 {
            *w = (now_s, 0);
        }
        w.1 = w.1.saturating_add(1);
    }

    /// Blocks `net` for a minute from `now_s`, as its own count would (the
    /// failures seen by every gateway on the store spent the network's
    /// budget: [`super::admin_guard`]); never shortens a block.
    pub(crate) fn block(&self, net: sluice_pow::NetPrefix, now_s: u64) {
        let mut map = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = window(&mut map, self.cap, net, now_s) {
            *w = (now_s, ADMIN_FAILURES_PER_MIN.max(w.1));
        }
    }
}

type Windows = std::collections::HashMap<sluice_pow::NetPrefix, (u64, u32)>;

/// `net`'s window, made when there is room for it (module docs on the
/// bound).
fn window(
    map: &mut Windows,
    cap: usize,
    net: sluice_pow::NetPrefix,
    now_s: u64,
) -> Option<&mut (u64, u32)> {
    if !map.contains_key(&net) && map.len() >= cap {
        // Only windows that are over go: they count nothing any more.
        map.retain(|_, (start, _)| now_s < *start + 60);
        if map.len() >= cap {
            tracing::warn!(
                tracked = map.len(),
                "admin failures: too many networks tracked; this one is not counted"
            );
            return None;
        }
    }
    Some(map.entry(net).or_insert((now_s, 0)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn net(i: u32) -> sluice_pow::NetPrefix {
        sluice_pow::network_prefix(std::net::IpAddr::from(std::net::Ipv4Addr::from(
            0x0a00_0000 + (i << 8),
        )))
    }

    #[test]
    fn a_full_admin_failure_map_never_resets_a_blocked_network() {
        let f = AdminFailures::with_cap(4);
        let attacker = net(0);
        for _ in 0..ADMIN_FAILURES_PER_MIN {
            f.record(attacker, 1000);
        }
        assert_eq!(f.blocked(attacker, 1000), Some(60));
        // A spray of other networks fills the map and goes on past it.
        for i in 1..50 {
            f.record(net(i), 1010);
        }
        assert_eq!(f.windows.lock().unwrap().len(), 4);
        assert_eq!(
            f.blocked(attacker, 1010),
            Some(50),
            "the attacker was reset"
        );
        // The attacker's own further failures keep counting in its window.
        f.record(attacker, 1020);
        assert_eq!(f.blocked(attacker, 1020), Some(40));
        // Networks tracked before the map filled keep their counts.
        let early = net(1);
        for _ in 1..ADMIN_FAILURES_PER_MIN {
            f.record(early, 1030);
        }
        assert!(f.blocked(early, 1030).is_some());
        // Once windows have ended they make room, and a new network counts.
        let late = net(99);
        f.record(late, 1075);
        assert!(f.windows.lock().unwrap().contains_key(&late));
        assert_eq!(f.blocked(attacker, 1075), None, "its minute is over");
        // The early network's window (started at 1010) is over too.
        assert_eq!(f.blocked(early, 1075), None);
    }

    #[test]
    fn a_block_from_the_shared_budget_lasts_a_minute_and_never_shortens_one() {
        let f = AdminFailures::with_cap(4);
        let n = net(7);
        f.record(n, 1000);
        assert_eq!(f.blocked(n, 1000), None);
        f.block(n, 1010);
        assert_eq!(f.blocked(n, 1010), Some(60));
        // a later block moves the end on; the network's own failures and
        // an earlier end never bring it forward
        f.record(n, 1020);
        assert_eq!(f.blocked(n, 1020), Some(50));
        f.block(n, 1030);
        assert_eq!(f.blocked(n, 1030), Some(60));
        assert_eq!(f.blocked(n, 1090), None);
        // a full map: an untracked network is not blocked (bounded memory)
        for i in 20..30 {
            f.record(net(i), 1090);
        }
        f.block(net(99), 1090);
        assert_eq!(f.blocked(net(99), 1090), None);
    }
}
