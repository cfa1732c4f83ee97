//! One visitor's journey, as the module doc of [`super`] tells it:
//! challenge and solve, join, poll until admitted, hold (with an idempotent
//! replay and a second hold now and then), then pay or release. Every grant,
//! release and payment is written to the [`Ledger`](super::ledger::Ledger).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use serde_json::json;

use super::RETRIES;
use super::client::{Answer, Endpoint};
use super::crowd::Shared;
use super::ledger::{Cart, now_unix};

/// The event as an admitted visitor sees it.
#[derive(Clone, Debug)]
pub(super) struct EventInfo {
    pub(super) total: u64,
    pub(super) cart_limit: u64,
    /// The event's categories (empty: none; holds then ask for a `qty`).
    pub(super) categories: Vec<CategoryInfo>,
}

/// One category of the event as an admitted visitor sees it.
#[derive(Clone, Debug)]
pub(super) struct CategoryInfo {
    pub(super) id: String,
    pub(super) total: u64,
    pub(super) cart_limit: Option<u64>,
}

/// What one hold asks for: a bare quantity, or units of some categories.
#[derive(Clone, Debug)]
enum Want {
    Qty(u64),
    Items(Vec<(String, u64)>),
}

impl Want {
    /// A random ask of at most `max_qty` units: on an event with
    /// categories, one or two of them (so bundles across categories are
    /// probed), the units split between them.
    fn pick(rng: &mut StdRng, info: &EventInfo, max_qty: u64) -> Want {
        let n = info.categories.len();
        if n == 0 {
            return Want::Qty(rng.random_range(1..=max_qty));
        }
        let first = rng.random_range(0..n);
        let mut picked = vec![first];
        if n > 1 && max_qty > 1 && rng.random_bool(0.4) {
            picked.push((first + rng.random_range(1..n)) % n);
        }
        let k = picked.len() as u64;
        let mut left = rng.random_range(k..=max_qty);
        let mut items = Vec::with_capacity(picked.len());
        for (j, &c) in picked.iter().enumerate() {
            let rest = k - 1 - j as u64; // items after this one take 1 each at least
            let q = if rest == 0 {
                left
            } else {
                rng.random_range(1..=left - rest)
            };
            left -= q;
            items.push((info.categories[c].id.clone(), q));
        }
        Want::Items(items)
    }

    fn body(&self) -> serde_json::Value {
        match self {
            Want::Qty(q) => json!({ "qty": q }),
            Want::Items(items) => json!({
                "items": items
                    .iter()
                    .map(|(c, q)| json!({ "category": c, "qty": q }))
                    .collect::<Vec<_>>()
            }),
        }
    }
}

/// A hold granted: its id, units in all and per category.
struct Granted {
    id: String,
    qty: u64,
    items: Vec<(String, u64)>,
}

/// How a visit ended.
pub(super) enum Outcome {
    /// Held (and perhaps paid for) something.
    Bought,
    /// Admitted, then left without holding anything, as the crowd that
    /// does not buy was asked to (`Settings::buy` false).
    Left,
    /// Admitted but nothing was held, or the room said sold out.
    SoldOut,
    /// Gave up: an unexpected answer or too many failures.
    Failed,
}

/// A visit that could not go on, with the reason.
pub(super) struct Stop(pub(super) Outcome);

/// Sleeps as a 429/503 asks (at least 100 ms, at most the poll cap).
async fn back_off(sh: &Shared, a: Option<&Answer>) {
    let wait = a
        .and_then(|a| a.retry_after)
        .unwrap_or(Duration::from_millis(500))
        .clamp(Duration::from_millis(100), sh.s.max_poll);
    tokio::time::sleep(wait).await;
}

fn failed<T>() -> Result<T, Stop> {
    Err(Stop(Outcome::Failed))
}

/// One visitor, from challenge to payment.
pub(super) async fn visit(sh: &Shared, i: u64) -> Result<Outcome, Stop> {
    let mut rng = StdRng::seed_from_u64(
        sh.s.seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(i),
    );
    let asked = lane_of(sh, i);
    let (joined, arrived_us, answered) = join(sh, i, asked).await?;
    let admission = match joined {
        Joined::Admitted(t) => t,
        Joined::Waiting {
            queue_token,
            poll_after_ms,
        } => poll(sh, &queue_token, poll_after_ms).await?,
    };
    sh.counters.admitted.fetch_add(1, Ordering::Relaxed);
    if let Some((epoch, seq)) = super::fairness::token_place(&admission) {
        sh.admissions.lock().push(super::fairness::Admission {
            arrived_us,
            epoch,
            seq,
            lane: super::fairness::LaneOf {
                asked: asked.map(str::to_owned),
                answered,
            },
        });
    }
    if !sh.s.buy {
        return Ok(Outcome::Left);
    }
    let info = event_info(sh, &admission).await?;
    let max_qty = sh.s.max_qty.map_or(info.cart_limit, u64::from).max(1);

    let mut cart = Cart::default();
    let want = Want::pick(&mut rng, &info, max_qty);
    let key = format!("swarm-{:x}-{i}-1", sh.run_id);
    let Some(g) = hold(sh, &admission, &want, &key).await? else {
        return Ok(Outcome::SoldOut);
    };
    cart.add(&g.id, g.qty, &g.items);
    if rng.random_bool(0.25) {
        // the same key again must name the same hold; another one is a
        // second hold after all, and its units count toward the cart
        if let Some(again) = hold(sh, &admission, &want, &key).await?
            && cart.add(&again.id, again.qty, &again.items)
        {
            sh.ledger.lock().idempotency_mismatches += 1;
        }
    }
    if rng.random_bool(0.5) {
        // a second hold: refused with cart_limit_exceeded when over the
        // limit (the event's or a category's), which is what this probes
        let want2 = Want::pick(&mut rng, &info, max_qty);
        let key2 = format!("swarm-{:x}-{i}-2", sh.run_id);
        if let Some(g2) = hold(sh, &admission, &want2, &key2).await? {
            cart.add(&g2.id, g2.qty, &g2.items);
        }
    }
    {
        let mut l = sh.ledger.lock();
        if cart.units > info.cart_limit {
            l.above_cart_limit += 1;
        }
        for c in &info.categories {
            let units = cart.by_category.get(&c.id).copied().unwrap_or(0);
            if c.cart_limit.is_some_and(|limit| units > limit) {
                *l.above_category_limit.entry(c.id.clone()).or_default() += 1;
            }
        }
    }
    let mine = cart.ids;

    for (n, id) in mine.iter().enumerate() {
        let pay = sh.s.webhook_secret.is_some() && rng.random_bool(sh.s.pay_ratio);
        if pay {
            pay_for(sh, i, n, id).await;
        } else if rng.random_bool(0.5) {
            release(sh, &admission, id).await;
        }
        // else: left to expire
    }
    Ok(Outcome::Bought)
}

enum Joined {
    Admitted(String),
    Waiting {
        queue_token: String,
        poll_after_ms: u64,
    },
}

/// The lane visitor `i` joins with an enqueue token naming it (drawn by
/// `--lane-mix` from its own stream of the seed), `None`: no token.
fn lane_of(sh: &Shared, i: u64) -> Option<&str> {
    if sh.s.lane_mix.is_empty() {
        return None;
    }
    let mut rng = StdRng::seed_from_u64(
        sh.s.seed
            .wrapping_mul(0xD1B5_4A32_D192_ED03)
            .wrapping_add(i)
            .rotate_left(17),
    );
    let u: f64 = rng.random();
    let mut sum = 0.0;
    for (id, share) in &sh.s.lane_mix {
        sum += share;
        if u < sum {
            return Some(id);
        }
    }
    None
}

/// An enqueue token for visitor `i` naming `lane`, signed with the room's
/// HMAC secret as its origin would sign it: its own account, short-lived.
fn enqueue_token(sh: &Shared, i: u64, lane: &str) -> Option<String> {
    let secret = sh.s.enqueue_secret.as_deref()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let claims = json!({
        "sub": format!("swarm-{:x}-{i}", sh.run_id),
        "aud": sh.s.room,
        "iat": now,
        "exp": now + 60,
        "lane": lane,
    });
    let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).ok()?;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &key,
    )
    .ok()
}

/// Challenge, solve, join (with an enqueue token naming `lane`, if any); a
/// 429/503 (or a consumed challenge) starts over. With the answer, when
/// the join that bought the place was sent (µs after the crowd started),
/// and the lane the answer names (a room with lanes says it when the
/// visitor waits).
async fn join(
    sh: &Shared,
    i: u64,
    lane: Option<&str>,
) -> Result<(Joined, u64, Option<String>), Stop> {
    let room = &sh.s.room;
    let mut unanswered: Option<u64> = None;
    for _ in 0..RETRIES {
        let Ok(a) = sh
            .http
            .post_json(
                Endpoint::Challenge,
                &format!("/_sluice/rooms/{room}/challenge"),
                None,
                &[],
                &json!({}),
            )
            .await
        else {
            back_off(sh, None).await;
            continue;
        };
        if a.is_transient() {
            back_off(sh, Some(&a)).await;
            continue;
        }
        if a.status != StatusCode::OK {
            return failed();
        }
        let fetched = Instant::now();
        let (Some(challenge), Some(puzzles), Some(bits)) = (
            a.body["challenge"].as_str().map(str::to_owned),
            a.body["puzzles"]
                .as_u64()
                .and_then(|v| u8::try_from(v).ok()),
            a.body["difficulty_bits"]
                .as_u64()
                .and_then(|v| u8::try_from(v).ok()),
        ) else {
            return failed();
        };
        let min_solve = Duration::from_millis(a.body["min_solve_ms"].as_u64().unwrap_or(0));
        let c = challenge.clone();
        // a permit of the solvers, when they are bounded (released once
        // solved, before the join)
        let permit = match &sh.solvers {
            Some(s) => Some(s.acquire().await.map_err(|_| Stop(Outcome::Failed))?),
            None => None,
        };
        let Ok(solutions) =
            tokio::task::spawn_blocking(move || sluice_pow::solve(&c, puzzles, bits, 1)).await
        else {
            return failed();
        };
        drop(permit);
        if let Some(rest) = min_solve.checked_sub(fetched.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        let mut body = json!({
            "challenge": challenge,
            "solutions": solutions,
            "return_to": format!("/swarm/{i}"),
        });
        if let Some(l) = lane {
            body["enqueue_token"] = json!(enqueue_token(sh, i, l).ok_or(Stop(Outcome::Failed))?);
        }
        let now = sh.t0.elapsed().as_micros() as u64;
        // With an enqueue token the place is the account's: bought by the
        // first attempt that reached the store and given back to every
        // retry, so a join whose answer was lost (a killed gateway) may
        // have bought the place the retry is told. Its arrival is the
        // first such attempt's: one sent and never answered (an attempt
        // that found no connection, or was answered with a refusal, took
        // nothing). Without a token every join is a new place.
        let sent = match lane {
            Some(_) => unanswered.unwrap_or(now),
            None => now,
        };
        let a = match sh
            .http
            .post_json(
                Endpoint::Join,
                &format!("/_sluice/rooms/{room}/join"),
                None,
                &[],
                &body,
            )
            .await
        {
            Ok(a) => a,
            Err(e) => {
                if !e.starts_with(super::client::NOT_SENT) {
                    unanswered.get_or_insert(now);
                }
                back_off(sh, None).await;
                continue;
            }
        };
        if a.is_transient() || a.code() == Some("pow_replayed") {
            back_off(sh, Some(&a)).await;
            continue;
        }
        let token = |k: &str| a.body[k].as_str().map(str::to_owned);
        let answered = token("lane");
        match (a.status.as_u16(), a.body["state"].as_str()) {
            (200, Some("admitted")) => {
                sh.counters.joined.fetch_add(1, Ordering::Relaxed);
                return token("admission_token")
                    .map(|t| (Joined::Admitted(t), sent, answered))
                    .ok_or(Stop(Outcome::Failed));
            }
            (201, Some("waiting")) => {
                sh.counters.joined.fetch_add(1, Ordering::Relaxed);
                return token("queue_token")
                    .map(|queue_token| {
                        let w = Joined::Waiting {
                            queue_token,
                            poll_after_ms: a.body["poll_after_ms"].as_u64().unwrap_or(1000),
                        };
                        (w, sent, answered)
                    })
                    .ok_or(Stop(Outcome::Failed));
            }
            _ => return failed(),
        }
    }
    failed()
}

/// Polls the status until admitted; the admission token.
async fn poll(sh: &Shared, queue_token: &str, first_wait_ms: u64) -> Result<String, Stop> {
    let path = format!("/_sluice/rooms/{}/status", sh.s.room);
    let mut wait = Duration::from_millis(first_wait_ms);
    let mut failures = 0;
    loop {
        tokio::time::sleep(wait.min(sh.s.max_poll)).await;
        let a = match sh
            .http
            .get(Endpoint::Status, &path, Some(queue_token))
            .await
        {
            Ok(a) if !a.is_transient() => a,
            other => {
                failures += 1;
                if failures > RETRIES {
                    return failed();
                }
                wait = other
                    .ok()
                    .and_then(|a| a.retry_after)
                    .unwrap_or(Duration::from_millis(500));
                continue;
            }
        };
        if a.status != StatusCode::OK {
            return failed();
        }
        match a.body["state"].as_str() {
            Some("admitted") => {
                return a.body["admission_token"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or(Stop(Outcome::Failed));
            }
            Some("waiting" | "paused") => {}
            Some("sold_out" | "closed") => return Err(Stop(Outcome::SoldOut)),
            _ => return failed(),
        }
        wait = Duration::from_millis(a.body["poll_after_ms"].as_u64().unwrap_or(1000));
    }
}

/// The event's total, cart limit and categories, read once by the first
/// admitted visitor (the endpoint wants an admitted visitor).
async fn event_info(sh: &Shared, admission: &str) -> Result<EventInfo, Stop> {
    let path = format!("/_sluice/events/{}", sh.s.event);
    sh.event
        .get_or_try_init(|| async {
            for _ in 0..RETRIES {
                match sh.http.get(Endpoint::Event, &path, Some(admission)).await {
                    Ok(a) if a.status == StatusCode::OK => {
                        if let (Some(total), Some(cart_limit)) =
                            (a.body["total"].as_u64(), a.body["cart_limit"].as_u64())
                        {
                            let categories = categories_of(&a.body).ok_or(Stop(Outcome::Failed))?;
                            return Ok(EventInfo {
                                total,
                                cart_limit,
                                categories,
                            });
                        }
                        return Err(Stop(Outcome::Failed));
                    }
                    Ok(a) if a.is_transient() => back_off(sh, Some(&a)).await,
                    Ok(_) => return Err(Stop(Outcome::Failed)),
                    Err(_) => back_off(sh, None).await,
                }
            }
            Err(Stop(Outcome::Failed))
        })
        .await
        .cloned()
}

/// The `categories` of an event's answer (none: an empty list); `None`
/// when malformed.
fn categories_of(body: &serde_json::Value) -> Option<Vec<CategoryInfo>> {
    let Some(list) = body.get("categories") else {
        return Some(Vec::new());
    };
    list.as_array()?
        .iter()
        .map(|c| {
            Some(CategoryInfo {
                id: c["id"].as_str()?.to_owned(),
                total: c["total"].as_u64()?,
                cart_limit: c["cart_limit"].as_u64(),
            })
        })
        .collect()
}

/// The `items` of a hold's answer, or what was asked when it has none.
fn items_of(body: &serde_json::Value, want: &Want) -> Vec<(String, u64)> {
    let from_answer = body["items"].as_array().map(|list| {
        list.iter()
            .filter_map(|i| Some((i["category"].as_str()?.to_owned(), i["qty"].as_u64()?)))
            .collect::<Vec<_>>()
    });
    match (from_answer, want) {
        (Some(items), _) if !items.is_empty() => items,
        (_, Want::Items(items)) => items.clone(),
        (_, Want::Qty(_)) => Vec::new(),
    }
}

/// Asks for `want` with `key`; the hold when granted, `None` when refused
/// as sold out or over a cart limit.
async fn hold(
    sh: &Shared,
    admission: &str,
    want: &Want,
    key: &str,
) -> Result<Option<Granted>, Stop> {
    let path = format!("/_sluice/events/{}/holds", sh.s.event);
    let headers = [("idempotency-key", key.to_owned())];
    for _ in 0..RETRIES {
        // a lost answer is retried with the same key: at most one hold
        let a = match sh
            .http
            .post_json(
                Endpoint::Hold,
                &path,
                Some(admission),
                &headers,
                &want.body(),
            )
            .await
        {
            Ok(a) if a.is_transient() && a.code() != Some("inventory_not_ready") => {
                back_off(sh, Some(&a)).await;
                continue;
            }
            Ok(a) => a,
            Err(_) => {
                back_off(sh, None).await;
                continue;
            }
        };
        if a.status == StatusCode::CREATED {
            let (Some(id), Some(granted)) = (a.body["hold_id"].as_str(), a.body["qty"].as_u64())
            else {
                return failed();
            };
            let expires_at = a.body["expires_at"].as_u64().unwrap_or(u64::MAX);
            let items = items_of(&a.body, want);
            sh.ledger.lock().grant(id, granted, expires_at, &items);
            return Ok(Some(Granted {
                id: id.to_owned(),
                qty: granted,
                items,
            }));
        }
        return match a.code() {
            Some("sold_out" | "cart_limit_exceeded") => Ok(None),
            _ => failed(),
        };
    }
    failed()
}

/// `DELETE /_sluice/holds/{id}`.
async fn release(sh: &Shared, admission: &str, id: &str) {
    sh.ledger.lock().set_releasing(id, true);
    let path = format!("/_sluice/holds/{id}");
    for _ in 0..RETRIES {
        match sh
            .http
            .call(
                Endpoint::Release,
                Method::DELETE,
                &path,
                Some(admission),
                &[],
                None,
            )
            .await
        {
            Ok(a) if a.status == StatusCode::OK => {
                sh.ledger.lock().released(id);
                return;
            }
            Ok(a) if a.is_transient() => back_off(sh, Some(&a)).await,
            Ok(_) => break,
            Err(_) => back_off(sh, None).await,
        }
    }
    // not released after all: it still counts until it expires
    sh.ledger.lock().set_releasing(id, false);
}

/// Pays through the signed webhook, as a payment provider would.
async fn pay_for(sh: &Shared, i: u64, n: usize, id: &str) {
    let Some(secret) = &sh.s.webhook_secret else {
        return;
    };
    let body = json!({
        "payment_event_id": format!("swarm-{:x}-{i}-{n}", sh.run_id),
        "hold_id": id,
        "outcome": "succeeded",
    })
    .to_string();
    for _ in 0..RETRIES {
        // signed afresh each time: the timestamp must be recent
        let sig = crate::reserve::sign_webhook(secret.as_bytes(), now_unix(), body.as_bytes());
        match sh
            .http
            .call(
                Endpoint::Webhook,
                Method::POST,
                "/_sluice/webhooks/payment",
                None,
                &[("sluice-signature", sig)],
                Some(Bytes::from(body.clone())),
            )
            .await
        {
            Ok(a) if a.status == StatusCode::OK => {
                let mut l = sh.ledger.lock();
                match a.body["status"].as_str() {
                    Some("confirmed") => l.confirm(id),
                    Some("released") => l.released(id),
                    _ => {}
                }
                return;
            }
            Ok(a) if a.code() == Some("hold_expired") => {
                sh.ledger.lock().lapsed(id);
                return;
            }
            Ok(a) if a.is_transient() => back_off(sh, Some(&a)).await,
            Ok(_) => return,
            Err(_) => back_off(sh, None).await,
        }
    }
}
