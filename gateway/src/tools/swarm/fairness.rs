//! Fairness of a swarm run: Kendall's tau-b between the order the visitors
//! joined in and the order the room admitted them in
//! ([`sluice_admission::fairness`]).
//!
//! **Arrival** is when the join that bought the visitor's place was sent
//! (a join lost with a killed gateway and sent again arrives again).
//! **Admission order** is the visitor's *place*, the frontier position it
//! was admitted at, read from its admission token (`epoch`, `seq`: a later
//! epoch admits after an earlier one) and, for a scheduled room's
//! pre-queue tickets, from the draw the room published (its seed revealed
//! after the opening, the same [`PlaceMap`] every gateway uses). Ranking by
//! place rather than by when a poll happened to see the admission keeps
//! the poll interval's noise out: a FIFO room scores 1 unless the queue
//! itself reordered someone.

use base64::Engine as _;
use serde_json::{Value, json};
use sluice_admission::{PlaceMap, PrequeueDraw};

/// The lane of an admitted visitor: the one its enqueue token asked for
/// (`None`: no token, the default lane) and the one the join's answer
/// named (a room with lanes names it to a visitor who waits; an admission
/// on the spot names none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct LaneOf {
    pub(super) asked: Option<String>,
    pub(super) answered: Option<String>,
}

/// One admitted visitor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Admission {
    /// µs after the crowd started when its place-buying join was sent.
    pub(super) arrived_us: u64,
    /// The room's epoch in its admission token.
    pub(super) epoch: u64,
    /// Its seq (from the admission token).
    pub(super) seq: u64,
    /// Its lane.
    pub(super) lane: LaneOf,
}

/// `(epoch, seq)` of an admission token's claims, read without verifying
/// (the swarm only ranks what the gateway handed it); `None` for a token
/// that names no seq (a fail-open admission).
pub(super) fn token_place(token: &str) -> Option<(u64, u64)> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    Some((claims["epoch"].as_u64()?, claims["seq"].as_u64()?))
}

/// The published pre-queue draw of the room's public state
/// (`prequeue_seed`, `prequeue_first_seq`, `prequeue_tickets` once the
/// room has opened), as a place map.
pub(super) fn draw_of(public_room: &Value) -> Option<PlaceMap> {
    let seed = public_room["prequeue_seed"].as_str()?;
    let seed = sluice_admission::prequeue::from_hex(seed)?;
    let first = public_room["prequeue_first_seq"].as_u64()?;
    let n = public_room["prequeue_tickets"].as_u64()?;
    Some(PlaceMap::new(
        &seed,
        PrequeueDraw {
            from: first.checked_sub(1)?,
            n,
            k: 0,
        },
    ))
}

/// The report's `fairness.admission` for a `random` room, whose tau the
/// swarm does not report (`sluice simulate --method random` models it).
pub(super) const RANDOM_NOT_MEASURED: &str = "not measured: a random room's places are its draws', which the admission token does not name (sluice simulate --method random models them)";

/// (arrival µs, (epoch, place)): what the fairness measure ranks.
type Ranked = (u64, (u64, u64));

/// The `fairness` object of the report: room-wide, and per lane when the
/// room has lanes (`lanes`, by lane id).
///
/// Within a lane, places are handed out in lane-seq order (a lane's share
/// of each advance goes to its next seqs; a visitor let in on the spot
/// finds nobody waiting in any lane), so ranking a lane's visitors by
/// place is ranking them by their place in the lane. A visitor without an
/// enqueue token is in the default lane, whose id the answers to the ones
/// who waited give.
pub(super) fn fairness_json(admissions: &[Admission], draw: Option<&PlaceMap>) -> Value {
    let pairs: Vec<Ranked> = admissions
        .iter()
        .map(|a| {
            let place = draw.map_or(a.seq, |m| m.place(a.seq));
            (a.arrived_us, (a.epoch, place))
        })
        .collect();
    let tau = sluice_admission::fairness::kendall_tau_b(&pairs);
    let round = |t: Option<f64>| t.map(|t| (t * 1e6).round() / 1e6);
    let mut out = json!({
        "kendall_tau": round(tau),
        "visitors": pairs.len(),
        "arrival": "join sent",
        "admission": "place (frontier position)",
    });
    let with_lanes = admissions
        .iter()
        .any(|a| a.lane.answered.is_some() || a.lane.asked.is_some());
    if with_lanes {
        // the default lane's id: what a token-less visitor who waited was told
        let default = admissions
            .iter()
            .find(|a| a.lane.asked.is_none() && a.lane.answered.is_some())
            .and_then(|a| a.lane.answered.clone())
            .unwrap_or_else(|| "(default)".to_owned());
        let mut by_lane: std::collections::BTreeMap<String, Vec<Ranked>> =
            std::collections::BTreeMap::new();
        for (a, pair) in admissions.iter().zip(&pairs) {
            let id = a
                .lane
                .answered
                .clone()
                .or_else(|| a.lane.asked.clone())
                .unwrap_or_else(|| default.clone());
            by_lane.entry(id).or_default().push(*pair);
        }
        let lanes: serde_json::Map<String, Value> = by_lane
            .into_iter()
            .map(|(id, p)| {
                let tau = sluice_admission::fairness::kendall_tau_b(&p);
                (id, json!({"kendall_tau": round(tau), "visitors": p.len()}))
            })
            .collect();
        out["lanes"] = Value::Object(lanes);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn places_from_tokens_and_draws() {
        let claims = json!({"epoch": 7, "seq": 42, "typ": "admit"});
        let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let token = format!("{}.{}.sig", b64(b"{}"), b64(claims.to_string().as_bytes()));
        assert_eq!(token_place(&token), Some((7, 42)));
        assert_eq!(token_place("garbage"), None);
        assert_eq!(token_place("a.!!.c"), None);

        let seed = "00".repeat(32);
        let public = json!({"prequeue_seed": seed, "prequeue_first_seq": 1, "prequeue_tickets": 5});
        let map = draw_of(&public).unwrap();
        // arrival order = seq order: with the draw's places the tau is the
        // draw's own, without it a perfect 1
        let adm: Vec<Admission> = (1..=5)
            .map(|seq| Admission {
                arrived_us: seq * 10,
                epoch: 1,
                seq,
                lane: LaneOf::default(),
            })
            .collect();
        assert_eq!(fairness_json(&adm, None)["kendall_tau"], 1.0);
        let drawn = fairness_json(&adm, Some(&map))["kendall_tau"]
            .as_f64()
            .unwrap();
        let order = sluice_admission::shuffle_order(&[0u8; 32], 5);
        let want = sluice_admission::fairness::kendall_tau_b(
            &(0..5u64)
                .map(|t| (t, order.iter().position(|&x| u64::from(x) == t).unwrap()))
                .collect::<Vec<_>>(),
        )
        .unwrap();
        assert!((drawn - want).abs() < 1e-6, "{drawn} vs {want}");
        assert_eq!(draw_of(&json!({"state": "open"})), None);
        assert!(fairness_json(&adm, None).get("lanes").is_none());
    }

    /// Two lanes interleaved by place (presale's visitors overtake): each
    /// lane's own tau is 1, the room's is not; a token-less visitor let in
    /// on the spot counts in the default lane the waiting ones were told.
    #[test]
    fn one_tau_per_lane() {
        let lane = |asked: Option<&str>, answered: Option<&str>| LaneOf {
            asked: asked.map(str::to_owned),
            answered: answered.map(str::to_owned),
        };
        let mut adm = vec![Admission {
            arrived_us: 1,
            epoch: 1,
            seq: 1,
            lane: lane(None, None),
        }];
        // public joined at 10, 20, 30, …; presale at 15, 25, 35, … but
        // presale's places come first
        for k in 0..5u64 {
            adm.push(Admission {
                arrived_us: 10 + 10 * k,
                epoch: 1,
                seq: 20 + k,
                lane: lane(None, Some("public")),
            });
            adm.push(Admission {
                arrived_us: 15 + 10 * k,
                epoch: 1,
                seq: 2 + k,
                lane: lane(Some("presale"), Some("presale")),
            });
        }
        let f = fairness_json(&adm, None);
        assert_eq!(f["lanes"]["presale"]["kendall_tau"], 1.0, "{f}");
        assert_eq!(f["lanes"]["presale"]["visitors"], 5, "{f}");
        assert_eq!(f["lanes"]["public"]["kendall_tau"], 1.0, "{f}");
        assert_eq!(f["lanes"]["public"]["visitors"], 6, "{f}");
        assert!(f["kendall_tau"].as_f64().unwrap() < 0.9, "{f}");
    }
}
