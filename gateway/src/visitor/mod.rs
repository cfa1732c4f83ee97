//! The visitor endpoints of API.md: challenge, join, status, the public
//! room state and the JWKS.
//!
//! A queued visitor costs the store nothing: its place is the `seq` inside
//! its signed queue token. A status poll is a cached signature check and a
//! look at the room's snapshot; the store is asked only once per visitor,
//! when its place comes up (the claim).

pub mod assets;
pub mod enqueue;
pub mod invite;
pub mod page;
pub mod stream;
pub mod template;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};
use sluice_admission::{
    AdmitOutcome, JoinOnce, JoinOutcome, QueueClaims, QueueStore, Snapshot, Solution, Spend,
    new_visitor_id,
};
use sluice_pow::{PowError, network_prefix};

use crate::app::clock::{now_ms, now_s};
use crate::app::extract::JsonBody;
use crate::app::problem::Problem;
use crate::app::state::AppState;
use crate::edge::client_ip::ClientInfo;
use crate::gate::cookies;
use crate::gate::rooms::{self, Placement, Room};

/// Longest `invite` a challenge or a join takes (the OpenAPI document's).
const MAX_INVITE_LEN: usize = 128;
/// Longest `enqueue_token` a join takes.
const MAX_ENQUEUE_TOKEN_LEN: usize = 4096;

/// The `invite` of a challenge's body: none for an empty body or an object
/// without the member (clients older than invites send those); 400
/// `malformed_request` for a body that is not a JSON object or an `invite`
/// that is not a string of at most 128 characters (JSON Schema's
/// `maxLength` counts characters, not bytes).
fn challenge_invite(body: &[u8]) -> Result<Option<String>, Problem> {
    if body.trim_ascii().is_empty() {
        return Ok(None);
    }
    let fields = match serde_json::from_slice(body) {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => return Err(Problem::malformed("the body must be a JSON object")),
    };
    match fields.get("invite") {
        None => Ok(None),
        Some(serde_json::Value::String(code)) if code.chars().count() <= MAX_INVITE_LEN => {
            Ok(Some(code.clone()))
        }
        Some(serde_json::Value::String(_)) => {
            Err(Problem::malformed("invite: at most 128 characters"))
        }
        Some(_) => Err(Problem::malformed("invite: must be a string")),
    }
}

/// `POST /_sluice/rooms/{room}/challenge`.
pub async fn challenge(
    State(state): State<AppState>,
    Path(room_id): Path<String>,
    axum::Extension(client): axum::Extension<ClientInfo>,
    body: axum::body::Bytes,
) -> Result<Response, Problem> {
    let room = state.room(&room_id)?;
    let prefix = network_prefix(client.ip);
    rate_limit(&state, room, prefix)?;
    // An invite-only room issues no work without a valid code: the body's
    // `invite` (any other body is ignored, as before invites; an `invite`
    // that is not a string, or longer than any code, is refused everywhere).
    let typed = challenge_invite(&body)?;
    // A full `reject` room issues no work it would refuse at the join.
    if let Some(wait) = room.looks_full(now_ms()) {
        state.telemetry().room_full(room.id());
        return Err(Problem::room_full(wait));
    }
    if room.config.invite_only {
        invite::check(&state, room, prefix, typed.as_deref()).await?;
    }
    let now = now_ms();
    let level = room.difficulty.observe_and_level(prefix, now);
    let spec = level.spec(room.id(), room.config.challenge_ttl);
    let issued = state
        .pow()
        .issue(&spec, now)
        .map_err(|e| Problem::internal().log_cause(&e))?;
    state.telemetry().challenge(room.id());
    Ok(axum::Json(json!({
        "challenge": issued.challenge,
        "puzzles": issued.puzzles,
        "difficulty_bits": issued.difficulty_bits,
        "expires_at": issued.expires_at,
        "algorithm": "sha256-leading-zero-bits",
        "min_solve_ms": spec.min_solve.as_millis() as u64,
    }))
    .into_response())
}

/// Takes one token of the room's per-network limit, or answers 429
/// `rate_limited` (counted in `sluice_rate_limited_total{limit="network"}`).
fn rate_limit(state: &AppState, room: &Room, prefix: sluice_pow::NetPrefix) -> Result<(), Problem> {
    room.check_rate_limit(prefix).map_err(|wait| {
        state.telemetry().rate_limited(room.id(), "network");
        Problem::rate_limited(wait)
    })
}

/// The body of a join.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinBody {
    challenge: String,
    solutions: Vec<String>,
    #[serde(default)]
    return_to: Option<String>,
    /// An invite code (invite-only rooms; ignored elsewhere).
    #[serde(default)]
    invite: Option<String>,
    /// The origin's enqueue token (module `enqueue`).
    #[serde(default)]
    enqueue_token: Option<String>,
}

/// `POST /_sluice/rooms/{room}/join`.
pub async fn join(
    State(state): State<AppState>,
    Path(room_id): Path<String>,
    axum::Extension(client): axum::Extension<ClientInfo>,
    headers: HeaderMap,
    body: Result<JsonBody<JoinBody>, Problem>,
) -> Result<Response, Problem> {
    let room = state.room(&room_id)?;
    let prefix = network_prefix(client.ip);

    // A visitor that already holds a place keeps it: same seq, no new one.
    // Any valid queue token of the room counts (cookie or bearer); one
    // whose place is spent (its session ended) joins anew below.
    if let Some((token, claims)) = queue_token_from(&state, &headers, room, &client)
        && let Some(res) = status_answer(
            &state,
            room,
            &claims,
            &client,
            StatusCode::CREATED,
            Some(&token),
        )
        .await?
    {
        return Ok(res);
    }

    let JsonBody(body) = body?;
    // The network's budget first (a malformed join spends it too: probing
    // is not free), then the body's shape: a malformed join is 400 whatever
    // the room's state (a closed room answered 423 to it before).
    rate_limit(&state, room, prefix)?;
    check_join_body(&state, room, &body)?;
    let snap = room.snapshot();
    if snap.closed {
        return Err(Problem::room_closed());
    }
    let return_to = safe_return_to(body.return_to.as_deref());
    // The account, before the work: a bad token costs no verification, and
    // an account that has a place gets it back from any device.
    let (account, lane_claim) =
        match enqueue::check_lane(room, body.enqueue_token.as_deref()).await? {
            Some((account, lane)) => (Some(account), lane),
            None => (None, None),
        };
    // The lane, before the work too: one the room does not have takes
    // nothing (422 `lane_not_found`).
    let (lane, lane_id) = join_lane(room, lane_claim.as_deref())?;
    let lane_id = lane_id.as_deref();
    let mut spent: Option<String> = None;
    if let Some(acct) = &account
        && let Some(note) = state
            .accounts()
            .lookup(room.id(), acct, now_ms())
            .await
            .map_err(|e| Problem::store_unavailable().log_cause(&e))?
    {
        match place_again(
            &state,
            room,
            &client,
            Some(&note),
            return_to.clone(),
            lane_id,
        )
        .await
        {
            Ok(res) => return Ok(res),
            Err(Err(p)) => return Err(p),
            // spent (its session ended): the account joins anew
            Err(Ok(_)) => spent = Some(note),
        }
    }
    // The code before the work: a join without a valid one costs no
    // verification (module `invite`). A used-up code may still be a lost
    // answer resubmitted: its proof of work is looked at, and only the
    // place it already bought comes back (below).
    let invite_hash = match invite::check(&state, room, prefix, body.invite.as_deref()).await {
        Ok(h) => h,
        Err(p) if p.reason() == Some("exhausted") => {
            let now = now_ms();
            let Ok(verified) = state
                .pow()
                .verify(&body.challenge, &body.solutions, room.id(), now)
            else {
                return Err(p);
            };
            return match state
                .queue()
                .spend_solution(room.id(), &verified.id, verified.guard_ttl(now))
                .await
            {
                Ok(Spend::Replayed { note }) => {
                    place_again(&state, room, &client, note.as_deref(), return_to, lane_id)
                        .await
                        .map_err(|e| match e {
                            Ok(pow) => pow_problem(pow),
                            Err(p) => p,
                        })
                }
                // a new proof for a used-up code: refused, work and all
                _ => Err(p),
            };
        }
        Err(p) => return Err(p),
    };
    let rejected = |e: sluice_pow::PowError| {
        state.telemetry().pow_rejected(room.id(), e.code());
        pow_problem(e)
    };
    let replayed = |e: Result<PowError, Problem>| match e {
        Ok(pow) => rejected(pow),
        Err(p) => p,
    };
    let now = now_ms();
    let verified = state
        .pow()
        .verify(&body.challenge, &body.solutions, room.id(), now)
        .map_err(rejected)?;
    let ttl = verified.guard_ttl(now);
    // A join with steps of its own between the work and the place (an
    // invite's use, the account's hold) spends the solution first, alone;
    // any other spends it in the join itself: one store step.
    let spend_first = invite_hash.is_some() || account.is_some();
    if spend_first {
        match state
            .queue()
            .spend_solution(room.id(), &verified.id, ttl)
            .await
        {
            Ok(Spend::First) => {}
            Ok(Spend::Replayed { note }) => {
                return place_again(&state, room, &client, note.as_deref(), return_to, lane_id)
                    .await
                    .map_err(replayed);
            }
            Err(e) => {
                state
                    .telemetry()
                    .pow_rejected(room.id(), "store_unavailable");
                return Err(Problem::store_unavailable().log_cause(&e));
            }
        }
    }

    if let Some(hash) = &invite_hash {
        invite::redeem(&state, room, hash, &format!("network {prefix}")).await?;
    }
    // One place per account: hold the account for this join, or answer
    // with the place another join of it just took.
    let nonce = new_visitor_id();
    if let Some(acct) = &account {
        match reserve_account(
            &state,
            room,
            &client,
            acct,
            &nonce,
            spent.as_deref(),
            &return_to,
            lane_id,
        )
        .await
        {
            Ok(None) => {}
            Ok(Some(res)) => {
                if let Some(hash) = &invite_hash {
                    invite::give_back(&state, room, hash).await;
                }
                return Ok(res);
            }
            Err(p) => {
                if let Some(hash) = &invite_hash {
                    invite::give_back(&state, room, hash).await;
                }
                return Err(p);
            }
        }
    }
    // The place, and the solution noted with it (what a replay of it gets
    // back), in one store step.
    let sub = new_visitor_id();
    let solution = Solution {
        id: &verified.id,
        ttl,
        sub: &sub,
        spent: spend_first,
        lane,
    };
    let outcome = match rooms::join_once(room, state.queue(), solution).await {
        Ok(JoinOnce::Joined(outcome)) => outcome,
        Ok(JoinOnce::Replayed { note }) => {
            // the same solution, sent again while this request was on its
            // way: it gets the place the first one bought
            return place_again(&state, room, &client, note.as_deref(), return_to, lane_id)
                .await
                .map_err(replayed);
        }
        Err(e) => {
            if let Some(hash) = &invite_hash {
                invite::give_back(&state, room, hash).await;
            }
            if let Some(acct) = &account {
                settle_account(&state, room, acct, &nonce, None).await;
            }
            // A refused one-step join recorded nothing; a solution spent
            // first is given back, and so is one whose place a failover
            // could lose. After a timeout the step may have run: the
            // solution then holds its place (a resubmission gets it), so
            // it is kept.
            let release =
                spend_first || matches!(e, sluice_admission::AdmissionError::NotReplicated { .. });
            return join_failed(
                &state,
                room,
                &client,
                release.then_some(&verified.id),
                e,
                snap.epoch,
                &return_to,
            )
            .await;
        }
    };
    if let Some(acct) = &account {
        let note = NotedPlace {
            seq: outcome.seq,
            epoch: outcome.epoch,
            sub: sub.clone(),
        }
        .to_string();
        settle_account(&state, room, acct, &nonce, Some(&note)).await;
    }
    if outcome.admitted {
        // passthrough: nobody waits and credit remains; the join claimed
        // the place, its session starts here
        state
            .start_session(
                room,
                &sluice_admission::session_of(outcome.epoch, outcome.place),
            )
            .await;
        return admit(
            &state,
            room,
            &sub,
            Some(outcome.place),
            outcome.epoch,
            &client,
            &return_to,
            StatusCode::OK,
        )
        .await;
    }
    let (_, token) = queue_token(
        &state,
        room,
        &sub,
        outcome.seq,
        outcome.epoch,
        return_to,
        lane_id.map(str::to_owned),
    )?;
    let mut body = waiting_join_body(room, &outcome, &token);
    if let Some(i) = outcome.lane.map(usize::from) {
        let snap = room.snapshot();
        if let Some(l) = snap.lanes.get(i) {
            let position = outcome
                .seq
                .saturating_sub(l.frontier.max(outcome.frontier))
                .max(1);
            body["position"] = json!(position);
            if body.get("eta_seconds").is_some() {
                body["eta_seconds"] = json!(lane_eta(room, &snap, i, position));
            }
        }
        body["lane"] = json!(lane_id);
    }
    let mut res = (StatusCode::CREATED, axum::Json(body)).into_response();
    cookies::set_queue(res.headers_mut(), room, &token, &client);
    Ok(res)
}

/// Holds `account` for this join (`nonce`): `None` when held, the answer
/// with the account's place when another join bound one (from any device
/// or gateway), 503 when another join of it is still in flight after a
/// short wait.
#[allow(clippy::too_many_arguments)]
async fn reserve_account(
    state: &AppState,
    room: &Arc<Room>,
    client: &ClientInfo,
    account: &str,
    nonce: &str,
    spent: Option<&str>,
    return_to: &str,
    lane: Option<&str>,
) -> Result<Option<Response>, Problem> {
    use sluice_admission::enqueue::Reserve;
    let store = |e: sluice_admission::AdmissionError| Problem::store_unavailable().log_cause(&e);
    let mut spent = spent.map(str::to_owned);
    for _ in 0..40 {
        let r = state
            .accounts()
            .reserve(
                room.id(),
                account,
                nonce,
                enqueue::RESERVATION,
                spent.as_deref(),
                now_ms(),
            )
            .await
            .map_err(store)?;
        match r {
            Reserve::Reserved => return Ok(None),
            Reserve::Bound(note) => {
                match place_again(state, room, client, Some(&note), return_to.to_owned(), lane)
                    .await
                {
                    Ok(res) => return Ok(Some(res)),
                    Err(Err(p)) => return Err(p),
                    Err(Ok(_)) => spent = Some(note),
                }
            }
            Reserve::Busy => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    Err(Problem::store_overloaded().retry_after(1))
}

/// Binds `note` to the account this join held (or releases it on `None`);
/// a failure is logged: the reservation lapses by itself.
async fn settle_account(
    state: &AppState,
    room: &Room,
    account: &str,
    nonce: &str,
    note: Option<&str>,
) {
    if let Err(e) = state
        .accounts()
        .settle(room.id(), account, nonce, note, enqueue::BINDING, now_ms())
        .await
    {
        tracing::warn!(room = room.id(), error = %e, "account's place not recorded");
    }
}

/// The queue token a request carries for `room` (bearer first, then the
/// cookie), if it verifies: its text and claims.
fn queue_token_from(
    state: &AppState,
    headers: &HeaderMap,
    room: &Room,
    client: &ClientInfo,
) -> Option<(String, QueueClaims)> {
    [
        cookies::bearer(headers),
        cookies::read(headers, &cookies::queue_name(room.id()), client),
    ]
    .into_iter()
    .flatten()
    .find_map(|t| {
        let claims = state.verify_queue(&t, room.id()).ok()?;
        Some((t, claims))
    })
}

/// A queue token for place `seq` of `room`, held by visitor `sub`: its
/// claims and the signed token.
fn queue_token(
    state: &AppState,
    room: &Room,
    sub: &str,
    seq: u64,
    epoch: u64,
    return_to: String,
    lane: Option<String>,
) -> Result<(QueueClaims, String), Problem> {
    let mut claims = QueueClaims::new(
        room.id(),
        sub,
        seq,
        epoch,
        now_s(),
        room.config.queue_token_ttl,
    );
    claims.ret = Some(return_to);
    claims.lane = lane;
    let token = state
        .keyring()
        .sign_queue(&claims)
        .map_err(|e| Problem::internal().log_cause(&e))?;
    Ok((claims, token))
}

/// The place a solution bought, noted with the solution in the queue store
/// (`QueueStore::join_once`) as `seq:epoch:sub`, and bound to an account
/// the same way.
#[derive(Debug, PartialEq, Eq)]
struct NotedPlace {
    seq: u64,
    epoch: u64,
    sub: String,
}

impl NotedPlace {
    fn parse(s: &str) -> Option<NotedPlace> {
        let mut it = s.splitn(3, ':');
        let seq = it.next()?.parse().ok()?;
        let epoch = it.next()?.parse().ok()?;
        let sub = it.next().filter(|s| !s.is_empty())?.to_owned();
        Some(NotedPlace { seq, epoch, sub })
    }
}

impl std::fmt::Display for NotedPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.seq, self.epoch, self.sub)
    }
}

/// `GET /_sluice/rooms/{room}/status`.
pub async fn status(
    State(state): State<AppState>,
    Path(room_id): Path<String>,
    axum::Extension(client): axum::Extension<ClientInfo>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let room = state.room(&room_id)?;
    let token = cookies::bearer(&headers)
        .or_else(|| cookies::read(&headers, &cookies::queue_name(room.id()), &client))
        .ok_or_else(|| {
            Problem::new(
                StatusCode::UNAUTHORIZED,
                "token_missing",
                "A queue token is required",
            )
        })?;
    let claims = state
        .verify_queue(&token, room.id())
        .map_err(|e| token_invalid().log_cause(&e))?;
    if stream::wants_stream(&headers) {
        let last = headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.len() <= 64)
            .map(str::to_owned);
        return stream::status_stream(state.clone(), room.clone(), claims, client, last).await;
    }
    match status_answer(&state, room, &claims, &client, StatusCode::OK, None).await? {
        Some(res) => Ok(res),
        None => {
            // The place was used and its session is over (revoked, or
            // expired): the token admits nobody again. The page starts over.
            let mut res = token_invalid().with("reason", "spent").into_response();
            cookies::clear(res.headers_mut(), &cookies::queue_name(room.id()));
            Ok(res)
        }
    }
}

fn token_invalid() -> Problem {
    Problem::new(
        StatusCode::UNAUTHORIZED,
        "token_invalid",
        "The queue token is not valid for this room",
    )
}

/// A join the store could not take: nothing was bought, so the solution
/// stays good for another try (`release`: the one spent apart from the
/// join is given back); a fail-open room lets the visitor in while its
/// store is down (not a closed one), any other answers the store's error.
async fn join_failed(
    state: &AppState,
    room: &Arc<Room>,
    client: &ClientInfo,
    release: Option<&[u8; 16]>,
    e: sluice_admission::AdmissionError,
    epoch: u64,
    return_to: &str,
) -> Result<Response, Problem> {
    if let Some(id) = release
        && let Err(g) = state.queue().release_solution(room.id(), id).await
    {
        tracing::warn!(room = room.id(), error = %g, "solution not released after a failed join");
    }
    if matches!(e, sluice_admission::AdmissionError::Full(_)) {
        // a `reject` room: nothing taken, the solution (released above),
        // any invite and the account stay good for a later try
        state.telemetry().room_full(room.id());
        let snap = room.snapshot();
        return Err(Problem::room_full(rooms::full_retry_after(
            snap.rate_per_sec,
            0.0,
        )));
    }
    if !matches!(e, sluice_admission::AdmissionError::Closed(_)) && rooms::fail_open(room) {
        tracing::warn!(room = room.id(), error = %e, "store down: failing open");
        let sub = new_visitor_id();
        return admit(
            state,
            room,
            &sub,
            None,
            epoch,
            client,
            return_to,
            StatusCode::OK,
        )
        .await;
    }
    Err(e.into())
}

/// The same solution again: a client that lost the answer to its join (a
/// dropped connection, a timeout) gets the place it bought back, never a
/// second one. No note: the first join is still in flight, or it was
/// admitted at once; a place since spent is not given back. Either is
/// `Err(Ok(Replayed))`, a fault `Err(Err(problem))`.
async fn place_again(
    state: &AppState,
    room: &Arc<Room>,
    client: &ClientInfo,
    note: Option<&str>,
    return_to: String,
    lane: Option<&str>,
) -> Result<Response, Result<PowError, Problem>> {
    let Some(place) = note.and_then(NotedPlace::parse) else {
        return Err(Ok(PowError::Replayed));
    };
    let (claims, token) = queue_token(
        state,
        room,
        &place.sub,
        place.seq,
        place.epoch,
        return_to,
        lane.map(str::to_owned),
    )
    .map_err(Err)?;
    let Some(mut res) = status_answer(
        state,
        room,
        &claims,
        client,
        StatusCode::CREATED,
        Some(&token),
    )
    .await
    .map_err(Err)?
    else {
        return Err(Ok(PowError::Replayed));
    };
    if !res.headers().contains_key(header::SET_COOKIE) {
        cookies::set_queue(res.headers_mut(), room, &token, client);
    }
    Ok(res)
}

/// A join body's shape: at most 64 solutions and a challenge of at most
/// 1 KiB, in the gateway's own form (`base64url.base64url`), each solution
/// a canonical decimal u64. Anything else is 400 `malformed_request`,
/// counted as a proof-of-work rejection.
fn check_join_body(state: &AppState, room: &Room, body: &JoinBody) -> Result<(), Problem> {
    if body.solutions.len() > 64 || body.challenge.len() > 1024 {
        return Err(Problem::malformed("challenge or solutions too long"));
    }
    // The document's bounds, whatever the room does with them.
    if body
        .invite
        .as_ref()
        .is_some_and(|i| i.chars().count() > MAX_INVITE_LEN)
        || body
            .enqueue_token
            .as_ref()
            .is_some_and(|t| t.chars().count() > MAX_ENQUEUE_TOKEN_LEN)
    {
        return Err(Problem::malformed(
            "invite (at most 128 characters) or enqueue_token (at most 4096) too long",
        ));
    }
    let base64url = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if !body
        .challenge
        .split_once('.')
        .is_some_and(|(payload, tag)| base64url(payload) && base64url(tag))
    {
        state
            .telemetry()
            .pow_rejected(room.id(), "malformed_request");
        return Err(Problem::malformed(
            "challenge is not one the gateway issues (base64url.base64url)",
        ));
    }
    if let Some(i) = body
        .solutions
        .iter()
        .position(|s| sluice_pow::hash::parse_canonical_u64(s).is_none())
    {
        state
            .telemetry()
            .pow_rejected(room.id(), "malformed_request");
        return Err(Problem::malformed(format!(
            "solutions[{i}] is not a u64 in decimal without sign or leading zeros"
        )));
    }
    Ok(())
}

/// The answer to a join that took a place in line: its queue token,
/// position and wait (a ticket of the pre-queue draw before a scheduled
/// opening; `paused`, with no promise of a wait, in a paused room).
fn waiting_join_body(room: &Room, outcome: &JoinOutcome, token: &str) -> Value {
    let snap = room.snapshot();
    if outcome.prequeue {
        let mut b = prequeue_body(room, &snap, outcome.seq);
        b["queue_token"] = json!(token);
        // this join is a ticket even if the snapshot is a tick behind
        let tickets = snap
            .queue_length()
            .max(outcome.seq.saturating_sub(outcome.frontier));
        b["position"] = json!(tickets.max(1));
        b["prequeue_tickets"] = json!(tickets);
        b
    } else {
        // a random room's new seq waits for the next draw: the middle of
        // those waiting for it is its expected place
        let random = room.settings().method == sluice_admission::QueueMethod::Random;
        let position = if random {
            rooms::next_draw_position(&snap, outcome.seq)
        } else {
            outcome
                .seq
                .saturating_sub(snap.frontier.max(outcome.frontier))
                .max(1)
        };
        // A paused room keeps taking joins and says so (API.md: status
        // `paused`), rather than promising a wait it cannot estimate.
        // (An operator's pause: a sold-out halt is told by the status poll.)
        let paused = room.settings().paused && !snap.closed;
        let mut b = json!({
            "state": if paused { "paused" } else { "waiting" },
            "queue_token": token,
            "seq": outcome.seq,
            "position": position,
            "poll_after_ms": poll_after(room, &snap, position),
            "rate_per_sec": snap.rate_per_sec,
        });
        if paused {
            b["poll_after_ms"] = json!(poll_after(room, &snap, position).max(5_000));
        } else {
            b["eta_seconds"] = json!(room.eta_for_position(&snap, position));
        }
        if random {
            b["awaiting_draw"] = json!(true);
        }
        b
    }
}

/// What a queue token's polls are counted under: its seq, with its lane
/// in the top bits (a lane's seqs are its own, so two lanes' seq 3 are two
/// visitors).
pub(crate) fn poll_key(room: &Room, claims: &QueueClaims) -> u64 {
    let lane = claims
        .lane
        .as_deref()
        .and_then(|l| room.settings().lanes.iter().position(|x| x.id == l));
    lane.map_or(claims.seq, |i| claims.seq | ((i as u64 + 1) << 56))
}

/// The lane a join goes to: its index for the store and its id for the
/// queue token. The enqueue token's `lane` claim, else the room's default
/// lane (the last); a lane the room does not have is 422
/// `lane_not_found`. A room without lanes ignores the claim (as it did
/// before lanes existed): `(None, None)`.
fn join_lane(room: &Room, claim: Option<&str>) -> Result<(Option<u8>, Option<String>), Problem> {
    let settings = room.settings();
    if settings.lanes.is_empty() {
        return Ok((None, None));
    }
    match sluice_admission::lanes::lane_index(&settings.lanes, claim) {
        Ok(Some(i)) => Ok((Some(i as u8), Some(settings.lanes[i].id.clone()))),
        Ok(None) => Ok((None, None)),
        Err(()) => Err(Problem::lane_not_found()),
    }
}

/// The lane of a queue token in a room with lanes (index into the
/// snapshot's lanes): its `lane` claim, the default lane (the last) for a
/// token without one or naming a lane the room no longer has; `None`
/// without lanes.
fn token_lane(room: &Room, snap: &Snapshot, claims: &QueueClaims) -> Option<usize> {
    let last = snap.lanes.len().checked_sub(1)?;
    let settings = room.settings();
    let i = sluice_admission::lanes::lane_index(&settings.lanes, claims.lane.as_deref())
        .ok()
        .flatten()
        .unwrap_or(last);
    Some(i.min(last))
}

/// The ETA of `position` in lane `i`, from the lane's share of the rate:
/// weighted, its weight over the weights of the lanes with someone waiting
/// (the others' share flows to them); strict, behind everyone waiting in
/// the lanes above it.
fn lane_eta(room: &Room, snap: &Snapshot, i: usize, position: u64) -> u64 {
    let settings = room.settings();
    match settings.lane_mode {
        sluice_admission::lanes::LaneMode::Strict => {
            let ahead: u64 = snap.lanes[..i].iter().map(|l| l.waiting()).sum();
            room.eta_for_position(snap, ahead + position)
        }
        sluice_admission::lanes::LaneMode::Weighted => {
            let wsum: u64 = snap
                .lanes
                .iter()
                .enumerate()
                .filter(|(j, l)| *j == i || l.waiting() > 0)
                .map(|(_, l)| u64::from(l.weight))
                .sum();
            let w = u64::from(snap.lanes[i].weight).max(1);
            // position / (rate × w / wsum) = (position × wsum / w) / rate
            room.eta_for_position(snap, (position * wsum).div_ceil(w))
        }
    }
}

/// A place of the current epoch for a queue token of an epoch the room's
/// state does not cover (the store lost its state), with the token that
/// names it: the same place for every poll of that token. `None` when the
/// token's own place stands.
async fn reseat_if_lost(
    state: &AppState,
    room: &Room,
    claims: &QueueClaims,
) -> Result<Option<(QueueClaims, String)>, Problem> {
    let snap = room.snapshot();
    // a lane's seqs start again with a new state: only its own epoch's
    // stand (no floors cover them)
    let covered = if snap.lanes.is_empty() {
        snap.covers(claims.epoch, claims.seq)
    } else {
        claims.epoch == snap.epoch
    };
    if snap.epoch == 0 || covered {
        return Ok(None);
    }
    let ttl = room.config.queue_token_ttl;
    let o = state
        .queue()
        .reseat(room.id(), claims.epoch, claims.seq, ttl)
        .await?;
    let ret = claims.ret.clone().unwrap_or_else(|| "/".to_owned());
    // with lanes the store reseats into the default lane
    let lane = o.lane.and_then(|i| {
        room.settings()
            .lanes
            .get(usize::from(i))
            .map(|l| l.id.clone())
    });
    queue_token(state, room, &claims.sub, o.seq, o.epoch, ret, lane).map(Some)
}

/// The status answer while the room is `closed`, `sold_out` or `paused`:
/// the place kept, polled rarely.
fn room_state_body(
    state: &AppState,
    room: &Room,
    snap: &Snapshot,
    room_state: &str,
    seq: u64,
    position: u64,
) -> Value {
    let mut body = json!({
        "state": room_state,
        "seq": seq,
        "position": position,
        "poll_after_ms": poll_after(room, snap, position).max(5_000),
    });
    if room_state == "sold_out" {
        // Stock held in carts may come back (holds expire or are
        // released): the place is kept and admission resumes then.
        body["stock_may_return"] = json!(state.events().room_stock_may_return(room.id()));
    }
    add_next_wave(state, room, &mut body);
    body
}

/// While one of the room's events has a scheduled wave pending, the
/// status answer says when the next one opens: `next_wave_at` (Unix
/// seconds, rounded up) and `next_wave_at_ms`, from the view refreshed
/// every second.
fn add_next_wave(state: &AppState, room: &Room, body: &mut Value) {
    if let Some(at) = state.events().room_next_wave_ms(room.id()) {
        body["next_wave_at"] = json!(at.div_ceil(1000));
        body["next_wave_at_ms"] = json!(at);
    }
}

/// What a visitor holding a valid queue token is told, before it becomes
/// an HTTP answer (a poll) or an event (a stream, [`stream`]).
pub(crate) struct StatusAnswer {
    /// The HTTP status of the poll's answer.
    pub status: StatusCode,
    /// The JSON object of API.md's status answer.
    pub body: Value,
    /// `waiting`, `admitted`, or the room's state (`closed`, `sold_out`,
    /// `paused`).
    pub state: &'static str,
    /// The position told (1 = next), 0 when admitted.
    pub position: u64,
    /// A new queue token (the place was given again after a store loss):
    /// its cookie goes with the answer.
    pub reissued: Option<String>,
    /// The admission token of an admitted place: its cookie goes with the
    /// answer.
    pub admission: Option<String>,
}

impl StatusAnswer {
    /// The poll's answer: the body, with the cookies it sets.
    pub(crate) fn into_response(self, room: &Room, client: &ClientInfo) -> Response {
        let mut res = (self.status, axum::Json(self.body)).into_response();
        if let Some(t) = &self.reissued {
            cookies::set_queue(res.headers_mut(), room, t, client);
        }
        if let Some(t) = &self.admission {
            cookies::set_admission(res.headers_mut(), room, t, client);
        }
        no_store(res)
    }
}

/// The answer to a visitor holding a valid queue token: waiting (with its
/// position), the room's state, or admitted (claiming its place and its
/// one session); `None` when the place is spent (its session ended).
/// Counts one poll of the token ([`Room::check_poll_limit`]).
///
/// A token of an epoch the room's state does not cover (the store lost
/// its state and nothing vouches that the new one was created above the
/// token's seq) is given a place of the current epoch first, the same one
/// for every poll of that token, never a seq another visitor holds; the
/// answer then carries the new `queue_token` (and cookie).
async fn status_answer(
    state: &AppState,
    room: &Arc<Room>,
    claims: &QueueClaims,
    client: &ClientInfo,
    waiting_status: StatusCode,
    echo_token: Option<&str>,
) -> Result<Option<Response>, Problem> {
    room.check_poll_limit(claims.epoch, poll_key(room, claims))
        .map_err(|wait| {
            state.telemetry().rate_limited(room.id(), "polls");
            Problem::rate_limited(wait)
        })?;
    Ok(
        status_of(state, room, claims, client, waiting_status, echo_token)
            .await?
            .map(|a| a.into_response(room, client)),
    )
}

/// [`status_answer`] before it becomes an HTTP answer, without counting a
/// poll: what a stream tells at each change.
pub(crate) async fn status_of(
    state: &AppState,
    room: &Arc<Room>,
    claims: &QueueClaims,
    client: &ClientInfo,
    waiting_status: StatusCode,
    echo_token: Option<&str>,
) -> Result<Option<StatusAnswer>, Problem> {
    let reseated = reseat_if_lost(state, room, claims).await?;
    let (claims, reissued) = match &reseated {
        Some((c, token)) => (c, Some(token.clone())),
        None => (claims, None),
    };
    let echo_token = reissued.as_deref().or(echo_token);
    let snap = room.snapshot();
    let return_to = claims.ret.clone().unwrap_or_else(|| "/".to_owned());
    // The place is the seq, unless the seq holds a ticket of a draw (the
    // pre-queue's, or a random room's): unknown while the pre-queue is open
    // (or the draw's place map is being built), and for a random room's
    // seq that waits for the next draw.
    let lane = token_lane(room, &snap, claims);
    let mut next_draw = false;
    let (place, admitted, position) = match lane {
        Some(i) => {
            // the lane's own frontier says whether it is admitted; its
            // place (what claims and sessions count) comes from the store
            let l = &snap.lanes[i];
            let place = if claims.seq != 0 && claims.seq <= l.frontier {
                state
                    .queue()
                    .lane_place(room.id(), i as u8, claims.seq)
                    .await
                    .map_err(|e| Problem::store_unavailable().log_cause(&e))?
            } else {
                None
            };
            (place, place.is_some(), l.position(claims.seq).max(1))
        }
        None => {
            let placement = room
                .placement(state.queue(), &snap, claims.seq)
                .await
                .map_err(|e| Problem::store_unavailable().log_cause(&e))?;
            let (place, position) = match placement {
                Placement::At(p) => (Some(p), snap.position(p).max(1)),
                Placement::Pending => (None, snap.queue_length().max(1)),
                Placement::NextDraw => {
                    next_draw = true;
                    (None, rooms::next_draw_position(&snap, claims.seq))
                }
            };
            let admitted = place.is_some_and(|p| snap.is_admitted(p));
            (place, admitted, position)
        }
    };
    // a lane's seqs are its own: sessions are named by the place
    let session_seq = |place: u64| if lane.is_some() { place } else { claims.seq };
    let room_state = if snap.closed {
        Some("closed")
    } else if state.sold_out(room.id()) {
        Some("sold_out")
    } else if snap.paused && !admitted {
        Some("paused")
    } else {
        None
    };
    if let Some(s) = room_state {
        let mut body = room_state_body(state, room, &snap, s, claims.seq, position);
        if let Some(t) = &reissued {
            body["queue_token"] = json!(t);
        }
        return Ok(Some(StatusAnswer {
            status: StatusCode::OK,
            body,
            state: s,
            position,
            reissued,
            admission: None,
        }));
    }
    if let Some(place) = place.filter(|_| admitted) {
        let sid = sluice_admission::session_of(claims.epoch, session_seq(place));
        if room.is_ended(&sid) {
            return Ok(None);
        }
        let ttl = room.settings().session_ttl;
        let admitted = match state.queue().admit(room.id(), place, &sid, ttl).await {
            Ok(AdmitOutcome::Spent) => return Ok(None),
            Ok(outcome) => outcome.is_admitted(),
            Err(e) => {
                // The frontier passed this seq (the snapshot says so): the
                // place is the visitor's whether or not the store can record
                // the claim now. An unrecorded claim is later refunded as a
                // no-show: at most one extra admission per claim lost; the
                // session is the place's own either way.
                tracing::warn!(room = room.id(), seq = claims.seq, error = %e, "claim not recorded; admitting from the snapshot");
                true
            }
        };
        if admitted {
            let mut a = admission_answer(
                state,
                room,
                &claims.sub,
                Some(session_seq(place)),
                claims.epoch,
                client,
                &return_to,
                StatusCode::OK,
            )?;
            a.reissued = reissued;
            return Ok(Some(a));
        }
    }
    let mut body = if snap.prequeue_open && place.is_none() && lane.is_none() {
        prequeue_body(room, &snap, claims.seq)
    } else {
        let eta = match lane {
            Some(i) => lane_eta(room, &snap, i, position),
            None => room.eta_for_position(&snap, position),
        };
        let poll = if place.is_none() && lane.is_none() && !next_draw {
            // the draw was just made: this gateway is building its places
            500 + rand::random_range(0..500)
        } else {
            poll_after(room, &snap, position)
        };
        json!({
            "state": "waiting",
            "seq": claims.seq,
            "position": position,
            "eta_seconds": eta,
            "poll_after_ms": poll,
            "rate_per_sec": snap.rate_per_sec,
        })
    };
    if let Some(t) = echo_token {
        body["queue_token"] = json!(t);
    }
    if next_draw {
        body["awaiting_draw"] = json!(true);
    }
    if let Some(i) = lane {
        body["lane"] = json!(room.settings().lanes.get(i).map(|l| l.id.clone()));
    }
    add_next_wave(state, room, &mut body);
    Ok(Some(StatusAnswer {
        status: waiting_status,
        body,
        state: "waiting",
        position,
        reissued,
        admission: None,
    }))
}

/// Issues an admission token (naming the place's session), sets its cookie
/// and answers `admitted`. The session itself is started by the caller
/// (the claim, or the passthrough).
#[allow(clippy::too_many_arguments)]
async fn admit(
    state: &AppState,
    room: &Arc<Room>,
    sub: &str,
    seq: Option<u64>,
    epoch: u64,
    client: &ClientInfo,
    return_to: &str,
    status: StatusCode,
) -> Result<Response, Problem> {
    admission_answer(state, room, sub, seq, epoch, client, return_to, status)
        .map(|a| a.into_response(room, client))
}

/// The `admitted` answer: an admission token naming the place's session.
#[allow(clippy::too_many_arguments)]
fn admission_answer(
    state: &AppState,
    room: &Arc<Room>,
    sub: &str,
    seq: Option<u64>,
    epoch: u64,
    client: &ClientInfo,
    return_to: &str,
    status: StatusCode,
) -> Result<StatusAnswer, Problem> {
    let (token, _claims) = state.issue_admission(room, sub, seq, epoch, client)?;
    Ok(StatusAnswer {
        status,
        body: json!({
            "state": "admitted",
            "admission_token": token,
            "return_to": return_to,
        }),
        state: "admitted",
        position: 0,
        reissued: None,
        admission: Some(token),
    })
}

/// `GET /_sluice/rooms/{room}`: the public state of a room.
pub async fn public_room(
    State(state): State<AppState>,
    Path(room_id): Path<String>,
) -> Result<Response, Problem> {
    let room = state.room(&room_id)?;
    let snap = room.snapshot();
    let st = if state.sold_out(room.id()) {
        "sold_out"
    } else {
        room.public_state(&snap)
    };
    let new_position = snap.queue_length() + 1;
    let mut body = json!({
        "room": room.id(),
        "state": st,
        "queue_length": snap.queue_length(),
        "rate_per_sec": snap.rate_per_sec,
        "eta_seconds_for_new_visitor": room.eta_for_position(&snap, new_position),
        "method": room.method().as_str(),
    });
    if let Some(obj) = body.as_object_mut() {
        obj.extend(room.prequeue_fields(&snap));
        if room.method() == sluice_admission::QueueMethod::Reject {
            // nobody waits in a reject room: whether a join now would
            // likely be refused (503 room_full)
            obj.insert("full".into(), json!(room.looks_full(now_ms()).is_some()));
        }
        if snap.prequeue_open {
            // nobody is admitted before the opening
            obj.insert(
                "eta_seconds_for_new_visitor".into(),
                json!(ms_until(snap.opens_at_ms).div_ceil(1000)),
            );
        }
    }
    Ok(axum::Json(body).into_response())
}

/// ms from now (the gateway's clock) until `t`, 0 when past or none.
fn ms_until(t: Option<u64>) -> u64 {
    t.map_or(0, |t| t.saturating_sub(now_ms()))
}

/// The waiting answer of a pre-queue ticket, before the opening (API.md's
/// `waiting`, extended): `position` is the number of tickets so far (the
/// draw gives a place among them: an upper bound), `eta_seconds` the time
/// to the opening (a lower bound), plus `prequeue: true`, `opens_at`,
/// `prequeue_commitment` and `prequeue_tickets`.
fn prequeue_body(room: &Room, snap: &Snapshot, seq: u64) -> Value {
    let remaining = ms_until(snap.opens_at_ms);
    let tickets = snap.queue_length();
    let mut body = json!({
        "state": "waiting",
        "seq": seq,
        "position": tickets.max(1),
        "eta_seconds": remaining.div_ceil(1000),
        "poll_after_ms": prequeue_poll_ms(remaining, opening_spread_ms(room, snap), &mut rand::rng()),
        "rate_per_sec": snap.rate_per_sec,
        "prequeue": true,
    });
    if let Some(obj) = body.as_object_mut() {
        obj.extend(room.prequeue_fields(snap));
        obj.remove("prequeue_open");
    }
    body
}

/// How widely the pre-queue's first polls after the opening are spread:
/// the time the draw takes to admit everyone (N / rate), at most 30 s and
/// half the claim window (an early place waits for its poll at most that
/// long, well inside its claim window), at least 1 s. A pre-queue of
/// millions must not poll in the same second.
fn opening_spread_ms(room: &Room, snap: &Snapshot) -> u64 {
    let rate = snap.rate_per_sec.max(1.0);
    let drain_ms = (snap.queue_length() as f64 / rate * 1000.0) as u64;
    let half_window = room.settings().claim_window.as_millis() as u64 / 2;
    drain_ms.min(30_000).min(half_window).max(1_000)
}

/// The poll interval of a pre-queue ticket, `remaining_ms` before the
/// opening: nothing changes for a ticket until then, so a quarter of the
/// time left, between 5 and 20 s; close to the opening, just after it,
/// spread uniformly over `spread_ms` so the whole pre-queue does not poll
/// at once.
pub fn prequeue_poll_ms<R: rand::Rng + ?Sized>(
    remaining_ms: u64,
    spread_ms: u64,
    rng: &mut R,
) -> u64 {
    use rand::RngExt as _;
    let far = (remaining_ms / 4).clamp(5_000, 20_000);
    if remaining_ms < far {
        remaining_ms + 200 + rng.random_range(0..spread_ms.max(1))
    } else {
        far
    }
}

/// `GET /_sluice/jwks.json`.
pub async fn jwks(State(state): State<AppState>) -> Response {
    let mut res = axum::Json(state.keyring().jwks()).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/jwk-set+json"),
    );
    res
}

fn poll_after(room: &Room, snap: &Snapshot, position: u64) -> u64 {
    let rate = room.admits_per_sec().max(snap.rate_per_sec);
    sluice_admission::poll_after_ms_eta(position, rate, &mut rand::rng())
}

fn no_store(mut res: Response) -> Response {
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// A proof-of-work failure as its API answer.
pub fn pow_problem(e: PowError) -> Problem {
    let code = e.code();
    let p = match code {
        "pow_expired" => Problem::new(
            StatusCode::FORBIDDEN,
            "pow_expired",
            "The challenge expired; fetch a new one",
        ),
        "pow_replayed" => Problem::new(
            StatusCode::CONFLICT,
            "pow_replayed",
            "This solution was already used",
        ),
        "store_unavailable" => Problem::store_unavailable(),
        "pow_too_early" => Problem::pow_too_early(e.retry_after_ms().unwrap_or(1)),
        "malformed_request" => Problem::malformed("the challenge or a solution is malformed"),
        _ => Problem::new(
            StatusCode::FORBIDDEN,
            "pow_invalid",
            "The proof of work is not valid",
        ),
    };
    p.log_cause(&e)
}

/// The `return_to` of a join: a same-origin path, else `/`. Anything with a
/// scheme, a host, `//`, a backslash or a control character becomes `/`.
pub fn safe_return_to(given: Option<&str>) -> String {
    let Some(s) = given else {
        return "/".to_owned();
    };
    let ok = s.starts_with('/')
        && !s.starts_with("//")
        && !s.contains('\\')
        && s.len() <= 2048
        && !s.chars().any(|c| c.is_control() || c.is_whitespace())
        && !s.starts_with("/_sluice/");
    if ok { s.to_owned() } else { "/".to_owned() }
}

/// Used by tests and the page: a JSON value for a waiting-room status.
pub fn waiting_json(room: &Room, snap: &Snapshot) -> Value {
    json!({
        "room": room.id(),
        "state": room.public_state(snap),
        "queue_length": snap.queue_length(),
        "challenge_url": format!("/_sluice/rooms/{}/challenge", room.id()),
        "join_url": format!("/_sluice/rooms/{}/join", room.id()),
        "status_url": format!("/_sluice/rooms/{}/status", room.id()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prequeue_polls_rarely_then_just_after_the_opening() {
        let mut rng = rand::rng();
        assert_eq!(prequeue_poll_ms(3_600_000, 1_000, &mut rng), 20_000);
        assert_eq!(prequeue_poll_ms(40_000, 1_000, &mut rng), 10_000);
        assert_eq!(prequeue_poll_ms(6_000, 1_000, &mut rng), 5_000);
        for remaining in [0, 1_000, 4_999] {
            let p = prequeue_poll_ms(remaining, 1_000, &mut rng);
            assert!((remaining + 200..remaining + 1_200).contains(&p), "{p}");
            let p = prequeue_poll_ms(remaining, 30_000, &mut rng);
            assert!((remaining + 200..remaining + 30_200).contains(&p), "{p}");
        }
    }

    #[test]
    fn return_to_is_same_origin_only() {
        for bad in [
            "https://evil.example/",
            "//evil.example/x",
            "/\\evil.example",
            "\\\\evil",
            "javascript:alert(1)",
            "evil.example",
            "/a\nb",
            "/ spaced",
            "/_sluice/admin/",
        ] {
            assert_eq!(safe_return_to(Some(bad)), "/", "{bad}");
        }
        assert_eq!(
            safe_return_to(Some("/tickets/42?seat=a&x=%2F")),
            "/tickets/42?seat=a&x=%2F"
        );
        assert_eq!(safe_return_to(None), "/");
    }

    #[test]
    fn a_noted_place_round_trips_and_junk_is_refused() {
        let p = NotedPlace {
            seq: 42,
            epoch: 3,
            sub: "v-abc:def".into(),
        };
        assert_eq!(NotedPlace::parse(&p.to_string()), Some(p));
        for junk in ["", "1", "x:1:a", "1:x:a", "1:2:", "1:2", "-1:2:a"] {
            assert_eq!(NotedPlace::parse(junk), None, "{junk}");
        }
    }
}
