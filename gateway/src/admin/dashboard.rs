//! The operator's dashboard at `/_sluice/admin/`: one embedded page (no
//! token needed to load it; every figure it shows comes from the admin API
//! with the token the operator types once; a gateway without an admin
//! token says so in the page, which then shows a read-only view from the
//! public room state instead of asking for a token nobody has), its script
//! and stylesheet (served with the page's other files under
//! `/_sluice/static/`, linked by their hashed names), and the
//! "what if" the page asks before a change is applied.
//!
//! `GET /_sluice/admin/rooms/{room}/whatif?rate_per_sec=…` runs the real
//! admission simulator ([`sluice_admission::sim`]) from the room's live
//! line with the proposed settings, in virtual time, and answers when that
//! line would drain. The line is capped at [`WHATIF_MAX_VISITORS`] (a
//! longer one is simulated at that size and the drain time scaled), so an
//! answer takes milliseconds even for a line of millions.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderMap, HeaderValue, header};
use serde_json::{Map, Value, json};
use sluice_admission::RoomPatch;
use sluice_admission::sim::{self, Arrivals, SimConfig};

use crate::app::problem::Problem;
use crate::app::state::AppState;
use crate::edge::client_ip::ClientInfo;
use crate::visitor::assets;

const PAGE: &str = include_str!("../../../static/admin.html");

/// The page with its script and stylesheet linked by their hashed names
/// (cached for a year, [`crate::visitor::assets`]), made once.
static PAGE_HTML: LazyLock<String> = LazyLock::new(|| {
    let values = HashMap::from([
        ("admin_css_url", assets::embedded_url("admin.css")),
        ("admin_js_url", assets::embedded_url("admin.js")),
    ]);
    crate::visitor::template::render(PAGE, &values)
});

/// Longest line the what-if simulates as is.
pub const WHATIF_MAX_VISITORS: u64 = 20_000;

/// Virtual time after which the what-if gives up: the line does not drain
/// within two days at that rate.
const WHATIF_HORIZON_SECONDS: f64 = 2.0 * 86_400.0;

/// Session length assumed by the what-if when the room states none (it
/// matters only under a `max_active` cap).
const WHATIF_SESSION_SECONDS: f64 = 60.0;

/// The dashboard's routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/_sluice/admin/", get(page))
        .route("/_sluice/admin", get(page))
        .route("/_sluice/admin/rooms/{room}/whatif", get(whatif))
}

/// Where the page says whether the gateway has an admin token.
const TOKEN_MARK: &str = r#"data-admin-token="configured""#;

/// The page as served, with its br and gzip forms, made once (at start,
/// by [`assets::warm`]): for a gateway with an admin token, and without
/// one. Compressed per request, anyone could make the gateway spend br's
/// setup on every load of a public page.
pub(crate) static PAGES: LazyLock<[assets::Asset; 2]> = LazyLock::new(|| {
    let html = "text/html; charset=utf-8";
    [
        assets::Asset::document(html, PAGE_HTML.clone()),
        assets::Asset::document(
            html,
            PAGE_HTML.replacen(TOKEN_MARK, r#"data-admin-token="none""#, 1),
        ),
    ]
});

/// `GET /_sluice/admin/`: the page, under the same strict policy as the
/// waiting page (no inline code, same-origin everything, no framing);
/// `<body data-admin-token="none">` when the gateway has no admin token.
async fn page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let which = usize::from(state.config().admin_token.is_none());
    let mut res = PAGES[which].answer(&headers, assets::Caching::NoStore);
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(crate::visitor::page::CSP),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    res
}

/// `GET /_sluice/admin/rooms/{room}/whatif?…`: the proposed settings (any
/// of the PATCH's admission settings, as query parameters) applied to a
/// copy of the room's, and the simulated drain of its current line.
async fn whatif(
    State(state): State<AppState>,
    Path(room): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let room = state.room(&room)?;
    let mut patch = Map::new();
    for (k, v) in query {
        let value = match k.as_str() {
            "rate_per_sec" | "burst" | "capacity_rps" | "safety_margin" => v
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .map(|x| json!(x))
                .ok_or_else(|| Problem::invalid_setting(&k, "must be a number"))?,
            // empty: no cap (as `null` in the PATCH)
            "max_active" if v.is_empty() => json!(0),
            "max_active" => v
                .parse::<u64>()
                .map(|x| json!(x))
                .map_err(|_| Problem::invalid_setting(&k, "must be a whole number"))?,
            other => {
                return Err(Problem::invalid_setting(
                    other,
                    "not an admission setting the simulator models",
                ));
            }
        };
        patch.insert(k, value);
    }
    let patch: RoomPatch = serde_json::from_value(Value::Object(patch))
        .map_err(|e| Problem::invalid_setting("query", e.to_string()))?;
    let mut settings = (*room.settings()).clone();
    patch
        .apply(&mut settings)
        .map_err(|e| Problem::invalid_setting(e.field, e.reason))?;
    // What if admission were running: a paused room is simulated resumed.
    settings.paused = false;
    settings.closed = false;

    let line = room.snapshot().queue_length();
    let simulated = line.min(WHATIF_MAX_VISITORS);
    let cfg = SimConfig {
        visitors: 0,
        initial_queue: simulated,
        arrivals: Arrivals::Spike,
        session_seconds: settings
            .session_length
            .map_or(WHATIF_SESSION_SECONDS, |d| d.as_secs_f64()),
        room: settings.clone(),
        // At rate 0 a line never moves (the simulation starts without
        // credit): one second says so as well as two days, which took the
        // simulator seconds of a blocking thread (found by schemathesis).
        horizon_seconds: if settings.rate_per_sec > 0.0 {
            WHATIF_HORIZON_SECONDS
        } else {
            1.0
        },
        tick_ms: whatif_tick_ms(simulated, settings.rate_per_sec),
        ..SimConfig::default()
    };
    cfg.validate()
        .map_err(|e| Problem::invalid_setting("query", e.to_string()))?;
    let started = std::time::Instant::now();
    let report = tokio::task::spawn_blocking(move || sim::run(&cfg, |_| {}))
        .await
        .map_err(|e| Problem::internal().log_cause(&e))?
        .map_err(|e| Problem::invalid_setting("query", e.to_string()))?;
    let scale = if simulated > 0 {
        line as f64 / simulated as f64
    } else {
        1.0
    };
    let drain = if line == 0 {
        Some(0.0)
    } else {
        report.drain_seconds.map(|s| s * scale)
    };
    Ok(axum::Json(json!({
        "room": room.id(),
        "queue_length": line,
        "simulated_visitors": simulated,
        "scaled": simulated < line,
        "rate_per_sec": report.rate_per_sec,
        "burst": report.burst,
        "max_active": report.max_active,
        "drain_seconds": drain,
        "horizon_seconds": WHATIF_HORIZON_SECONDS,
        "simulation_ms": started.elapsed().as_secs_f64() * 1000.0,
    }))
    .into_response())
}

/// The simulator's tick for a what-if: the gateway's 100 ms while the line
/// could drain within ten minutes, whole seconds beyond (a slow rate over a
/// long line simulated two days in 1.7 million ticks, seconds of a blocking
/// thread; a second's tick is as good an answer at that scale).
fn whatif_tick_ms(line: u64, rate_per_sec: f64) -> u64 {
    if rate_per_sec > 0.0 && line as f64 / rate_per_sec <= 600.0 {
        100
    } else {
        1000
    }
}

/// Who made an admin call, for the audit log: the first 8 hex digits of
/// the SHA-256 of the bearer token they presented (enough to tell tokens
/// apart after a rotation, useless to an attacker reading logs), and the
/// client's address.
pub fn audit_who(headers: &HeaderMap, client: Option<&ClientInfo>) -> String {
    use sha2::{Digest, Sha256};
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let digest = Sha256::digest(token.as_bytes());
    let fp: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    match client {
        Some(c) => format!("token:{fp} ip:{}", c.ip),
        None => format!("token:{fp} ip:unknown"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_carries_the_admin_token_mark_once() {
        // the mark `page` swaps for a gateway without an admin token
        assert_eq!(PAGE.matches(TOKEN_MARK).count(), 1);
        assert!(PAGE.contains(&format!("<body {TOKEN_MARK}>")));
    }
}
