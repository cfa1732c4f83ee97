//! Scheduled openings: RFC 3339 times, pre-queue seeds, and
//! `sluice prequeue-verify`, the check anyone can run on a published draw.
//!
//! Before a scheduled room opens, joins are pre-queue tickets and nobody is
//! admitted; the room's public state carries the commitment (hex SHA-256 of
//! the seed). At the opening the store records the draw (its first ticket
//! seq and the number of tickets) and the public state reveals the seed;
//! places then follow [`sluice_admission::shuffle_order`] (see
//! `sluice_admission::prequeue` for the algorithm).

use std::process::ExitCode;

use clap::Args;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use sluice_admission::prequeue::{from_hex, to_hex};
use sluice_admission::{PrequeueDraw, commitment, shuffle_order};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Parses an RFC 3339 timestamp (`2026-12-01T10:00:00Z`,
/// `2026-12-01T11:00:00+01:00`) into ms since the Unix epoch.
pub fn parse_rfc3339_ms(s: &str) -> Result<u64, String> {
    let t = OffsetDateTime::parse(s, &Rfc3339)
        .map_err(|e| format!("must be an RFC 3339 time such as 2026-12-01T10:00:00Z ({e})"))?;
    let ms = t.unix_timestamp_nanos() / 1_000_000;
    if ms <= 0 || ms > i128::from(sluice_admission::settings::MAX_OPENS_AT_MS) {
        return Err("must be after 1970 and before the year 10000".into());
    }
    Ok(ms as u64)
}

/// ms since the Unix epoch as RFC 3339 in UTC (`2026-12-01T10:00:00Z`;
/// milliseconds only when there are some).
pub fn format_rfc3339(ms: u64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let t = if ms.is_multiple_of(1000) {
        t.replace_nanosecond(0).unwrap_or(t)
    } else {
        t
    };
    t.format(&Rfc3339).unwrap_or_default()
}

/// The seed of a room scheduled in the configuration file. Every gateway
/// sharing a store must pick the same one without talking to the others,
/// so it is derived: HMAC-SHA256(pow secret, `"sluice-prequeue-seed:" room
/// ":" opens_at_ms`), as secret as the pow secret. Without a pow secret
/// (one gateway) it is random. A schedule set through the admin API gets a
/// random seed.
pub fn config_seed(secret: Option<&str>, room: &str, opens_ms: u64) -> String {
    match secret {
        Some(s) => match Hmac::<Sha256>::new_from_slice(s.as_bytes()) {
            Ok(mut mac) => {
                mac.update(format!("sluice-prequeue-seed:{room}:{opens_ms}").as_bytes());
                to_hex(&mac.finalize().into_bytes())
            }
            Err(_) => sluice_admission::prequeue::new_seed_hex(),
        },
        None => sluice_admission::prequeue::new_seed_hex(),
    }
}

/// The commitment of a hex seed (`None` when it is not hex).
pub fn commitment_of(seed_hex: &str) -> Option<String> {
    from_hex(seed_hex).map(|b| commitment(&b))
}

/// Flags of `sluice prequeue-verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The revealed seed (hex), `prequeue_seed` of the room's public state.
    #[arg(long)]
    pub seed: String,
    /// The commitment published before the opening (hex SHA-256),
    /// `prequeue_commitment`.
    #[arg(long)]
    pub commitment: String,
    /// How many tickets the draw ordered, `prequeue_tickets`.
    #[arg(long)]
    pub tickets: u64,
    /// The seq of the first ticket, `prequeue_first_seq` (1 unless the room
    /// had admitted visitors before it was scheduled).
    #[arg(long, default_value_t = 1)]
    pub first_seq: u64,
    /// Print only the place of this seq (from your queue token or status).
    #[arg(long)]
    pub seq: Option<u64>,
    /// A `random` room's draw: its index (`draw_index` of the room's
    /// state). `--seed` is then the room's seed, revealed when the room
    /// closes, and the draw's order comes from its seed for this index;
    /// `--first-seq` and `--tickets` are the draw's (`draw_first_seq`,
    /// `draw_tickets`).
    #[arg(long)]
    pub draw: Option<u64>,
}

/// Runs `sluice prequeue-verify`: exit 0 when the seed matches the
/// commitment, 1 when it does not, 64 on bad input.
pub fn run_verify(a: VerifyArgs) -> ExitCode {
    let Some(seed) = from_hex(a.seed.trim()) else {
        eprintln!("--seed must be hex");
        return ExitCode::from(64);
    };
    if a.tickets > sluice_admission::prequeue::MAX_TICKETS
        || a.first_seq == 0
        || a.first_seq.checked_add(a.tickets).is_none()
    {
        eprintln!(
            "--tickets must be at most {}, --first-seq at least 1, and their sum fit in 64 bits",
            u32::MAX
        );
        return ExitCode::from(64);
    }
    let computed = commitment(&seed);
    let matches = computed.eq_ignore_ascii_case(a.commitment.trim());
    println!("sha256(seed) = {computed}");
    if !matches {
        println!("commitment MISMATCH: the seed is not the one committed to");
        return ExitCode::from(1);
    }
    println!("commitment matches");
    let draw = PrequeueDraw {
        from: a.first_seq - 1,
        n: a.tickets,
        k: a.draw.unwrap_or(0),
    };
    let seed = match a.draw {
        Some(k) => {
            let s = sluice_admission::prequeue::draw_seed(&seed, k);
            println!("draw {k}: seed {}", to_hex(&s));
            s.to_vec()
        }
        None => seed,
    };
    match a.seq {
        Some(seq) => {
            let map = sluice_admission::PlaceMap::new(&seed, draw);
            if draw.contains(seq) {
                let place = map.place(seq);
                println!(
                    "seq {seq}: place {place} ({} of {} in the draw)",
                    place - draw.from,
                    draw.n
                );
            } else {
                println!("seq {seq}: not in the draw; place {seq} (first come, first served)");
            }
        }
        None => {
            println!("place\tseq");
            for (k, ticket) in shuffle_order(&seed, a.tickets as u32).iter().enumerate() {
                println!(
                    "{}\t{}",
                    draw.from + 1 + k as u64,
                    draw.from + 1 + u64::from(*ticket)
                );
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rfc3339_roundtrip() {
        let ms = parse_rfc3339_ms("2026-12-01T10:00:00Z").unwrap();
        assert_eq!(ms, 1_796_119_200_000);
        assert_eq!(format_rfc3339(ms), "2026-12-01T10:00:00Z");
        assert_eq!(parse_rfc3339_ms("2026-12-01T11:00:00+01:00").unwrap(), ms);
        assert_eq!(format_rfc3339(ms + 250), "2026-12-01T10:00:00.25Z");
        for bad in [
            "",
            "tomorrow",
            "2026-12-01",
            "2026-13-01T10:00:00Z",
            "1969-12-31T23:59:59Z",
        ] {
            assert!(parse_rfc3339_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn config_seeds_agree_between_gateways() {
        let a = config_seed(Some("secret"), "r", 5);
        assert_eq!(a, config_seed(Some("secret"), "r", 5));
        assert_ne!(a, config_seed(Some("secret"), "r", 6));
        assert_ne!(a, config_seed(Some("other"), "r", 5));
        assert_eq!(a.len(), 64);
        assert_eq!(commitment_of(&a).unwrap().len(), 64);
    }
}
