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
#[derive(Clone, Copy, Debug)]
pub(super) struct EventInfo {
    pub(super) total: u64,
    pub(super) cart_limit: u64,
}

/// How a visit ended.
pub(super) enum Outcome {
    /// Held (and perhaps paid for) something.
    Bought,
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
    let admission = match join(sh, i).await? {
        Joined::Admitted(t) => t,
        Joined::Waiting {
            queue_token,
            poll_after_ms,
        } => poll(sh, &queue_token, poll_after_ms).await?,
    };
    sh.counters.admitted.fetch_add(1, Ordering::Relaxed);
    let info = event_info(sh, &admission).await?;
    let max_qty = sh.s.max_qty.map_or(info.cart_limit, u64::from).max(1);

    let mut cart = Cart::default();
    let qty = rng.random_range(1..=max_qty);
    let key = format!("swarm-{:x}-{i}-1", sh.run_id);
    let Some((id, granted)) = hold(sh, &admission, qty, &key).await? else {
        return Ok(Outcome::SoldOut);
    };
    cart.add(&id, granted);
    if rng.random_bool(0.25) {
        // the same key again must name the same hold; another one is a
        // second hold after all, and its units count toward the cart
        if let Some((again, granted_again)) = hold(sh, &admission, qty, &key).await?
            && cart.add(&again, granted_again)
        {
            sh.ledger.lock().idempotency_mismatches += 1;
        }
    }
    if rng.random_bool(0.5) {
        // a second hold: refused with cart_limit_exceeded when over the
        // limit, which is what this probes
        let qty2 = rng.random_range(1..=max_qty);
        let key2 = format!("swarm-{:x}-{i}-2", sh.run_id);
        if let Some((id2, granted2)) = hold(sh, &admission, qty2, &key2).await? {
            cart.add(&id2, granted2);
        }
    }
    if cart.units > info.cart_limit {
        sh.ledger.lock().above_cart_limit += 1;
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

/// Challenge, solve, join; a 429/503 (or a consumed challenge) starts over.
async fn join(sh: &Shared, i: u64) -> Result<Joined, Stop> {
    let room = &sh.s.room;
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
        let Ok(solutions) =
            tokio::task::spawn_blocking(move || sluice_pow::solve(&c, puzzles, bits, 1)).await
        else {
            return failed();
        };
        if let Some(rest) = min_solve.checked_sub(fetched.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        let body = json!({
            "challenge": challenge,
            "solutions": solutions,
            "return_to": format!("/swarm/{i}"),
        });
        let Ok(a) = sh
            .http
            .post_json(
                Endpoint::Join,
                &format!("/_sluice/rooms/{room}/join"),
                None,
                &[],
                &body,
            )
            .await
        else {
            back_off(sh, None).await;
            continue;
        };
        if a.is_transient() || a.code() == Some("pow_replayed") {
            back_off(sh, Some(&a)).await;
            continue;
        }
        let token = |k: &str| a.body[k].as_str().map(str::to_owned);
        match (a.status.as_u16(), a.body["state"].as_str()) {
            (200, Some("admitted")) => {
                sh.counters.joined.fetch_add(1, Ordering::Relaxed);
                return token("admission_token")
                    .map(Joined::Admitted)
                    .ok_or(Stop(Outcome::Failed));
            }
            (201, Some("waiting")) => {
                sh.counters.joined.fetch_add(1, Ordering::Relaxed);
                return token("queue_token")
                    .map(|queue_token| Joined::Waiting {
                        queue_token,
                        poll_after_ms: a.body["poll_after_ms"].as_u64().unwrap_or(1000),
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

/// The event's total and cart limit, read once by the first admitted
/// visitor (the endpoint wants an admitted visitor).
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
                            return Ok(EventInfo { total, cart_limit });
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
        .copied()
}

/// Asks for `qty` units with `key`; `Some((hold_id, qty))` when granted,
/// `None` when refused as sold out or over the cart limit.
async fn hold(
    sh: &Shared,
    admission: &str,
    qty: u64,
    key: &str,
) -> Result<Option<(String, u64)>, Stop> {
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
                &json!({ "qty": qty }),
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
            sh.ledger.lock().grant(id, granted, expires_at);
            return Ok(Some((id.to_owned(), granted)));
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
