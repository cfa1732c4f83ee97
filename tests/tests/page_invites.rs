//! The waiting page at the door of an invite-only room and of a room for
//! the shop's signed-in customers (issue 22), in a real headless Chromium
//! against a real gateway, on real sockets.
//!
//! The origin hands its fan a code or an enqueue token in the URL's
//! fragment (`#sluice_invite=…`, `#sluice_enqueue=…`); the page must take
//! it out of the address bar at once, keep it for the tab, send it with
//! the challenge and the join, and forget it once admitted. Without a code
//! (or with a wrong or used one) it shows a form and solves no work until
//! a code is accepted; without a valid token it sends the fan to sign in,
//! with no work and no retry loop. What the tests watch is what a fan and
//! the operator would: the address bar, the page's words and focus, the
//! admin API's redemptions and the gateway's metrics.
//!
//! Without chromium or chromedriver the tests print a loud SKIPPED line,
//! except under `CI=true`, where that is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::Method;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};
use sluice_gateway::config::RoomConfig;
use sluice_gateway::config::room::EnqueueConfig;
use sluice_tests::browser::wait_for;
use sluice_tests::chromium::Browser;
use sluice_tests::client::{Answer, TestClient, body};
use sluice_tests::firefox::Firefox;
use sluice_tests::origin::TestOrigin;
use sluice_tests::{ADMIN_TOKEN, TestGateway, admin_patch, easy_room, metric};

/// A phone-sized window (CSS pixels).
const WINDOW: (u32, u32) = (412, 915);
/// The HS256 secret the origin and the `members` room share.
const SECRET: &str = "the-shop-and-sluice-share-this-32+-byte-secret";
/// How long the page may take to do what a fan waits for.
const LIMIT: Duration = Duration::from_secs(20);

// === the gateway and its rooms ===

/// The shop's sign-in page of room `club`.
const SIGN_IN: &str = "/echo/login?next=/echo/club&from=sluice";

/// `vip`: invite-only, under `/echo/vip`; `members`: enqueue tokens
/// required, under `/echo/members`; `club`: the same, with the shop's
/// sign-in page, under `/echo/club`. All admit nobody after their first
/// visitor (`rate` 0, one credit) unless `open`, when they admit at once.
async fn gateway(origin: &TestOrigin, open: bool) -> TestGateway {
    let rate = if open { 1000.0 } else { 0.0 };
    let burst = if open { 1000.0 } else { 1.0 };
    TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.rooms = vec![
                RoomConfig {
                    invite_only: true,
                    ..easy_room("vip", rate, burst, &["/echo/vip"])
                },
                RoomConfig {
                    enqueue: EnqueueConfig {
                        required: true,
                        hmac_secret: Some(SECRET.into()),
                        ..EnqueueConfig::default()
                    },
                    ..easy_room("members", rate, burst, &["/echo/members"])
                },
                RoomConfig {
                    enqueue: EnqueueConfig {
                        required: true,
                        hmac_secret: Some(SECRET.into()),
                        sign_in_url: Some(SIGN_IN.into()),
                        ..EnqueueConfig::default()
                    },
                    ..easy_room("club", rate, burst, &["/echo/club"])
                },
            ];
        })
        .spawn()
        .await
}

async fn admin(base: &str, method: Method, path: &str, body_text: String) -> Answer {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    TestClient::new()
        .call(
            method,
            &format!("{base}/_sluice/admin/rooms/{path}"),
            &[
                ("authorization", bearer.as_str()),
                ("content-type", "application/json"),
            ],
            body(body_text),
        )
        .await
}

/// One code of `uses` uses in `vip`: `(code, id)`.
async fn issue(base: &str, uses: u64) -> (String, String) {
    let req = json!({"count": 1, "uses": uses, "label": "page test"});
    let res = admin(base, Method::POST, "vip/invites", req.to_string()).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let i = &res.json()["invites"][0];
    (
        i["code"].as_str().unwrap().to_owned(),
        i["id"].as_str().unwrap().to_owned(),
    )
}

/// Redemptions of the code `id`, by the admin API.
async fn used(base: &str, id: &str) -> u64 {
    let res = admin(
        base,
        Method::GET,
        &format!("vip/invites/{id}"),
        String::new(),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()["used"].as_u64().unwrap()
}

async fn challenges(base: &str, room: &str) -> f64 {
    metric(base, &format!("sluice_challenges_total{{room=\"{room}\"}}")).await
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The shop's enqueue token for its account `sub` in `room`, valid a
/// minute.
fn token(room: &str, sub: &str) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": sub, "aud": room, "exp": now() + 60, "iat": now()}),
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// A JSON client joins `room` with `extra` in its challenge and join
/// (a code, a token): the join's answer.
async fn json_join(base: &str, room: &str, extra: Value) -> Value {
    let c = TestClient::new()
        .post_json(
            &format!("{base}/_sluice/rooms/{room}/challenge"),
            &[],
            &extra,
        )
        .await;
    assert_eq!(c.status, 200, "{}", c.text());
    let mut req = sluice_tests::visitor::join_body(&c, "/").await;
    for (k, v) in extra.as_object().unwrap() {
        req[k] = v.clone();
    }
    let res = TestClient::new()
        .post_json(&format!("{base}/_sluice/rooms/{room}/join"), &[], &req)
        .await;
    assert!(res.status.is_success(), "{}", res.text());
    res.json()
}

// === what the page shows ===

/// The position the page shows, once it shows one.
async fn position(b: &Browser) -> u64 {
    wait_for(LIMIT, "a position on the page", || async {
        b.text("#position").await.trim().parse().ok()
    })
    .await
}

/// Waits until the origin's page replaced the waiting page; its URL.
async fn landed(b: &Browser) -> String {
    wait_for(LIMIT, "the origin's page", || async {
        let on_page = b.js("return !!document.getElementById('sluice')").await;
        (on_page == json!(false)).then_some(())
    })
    .await;
    b.url().await
}

/// The page's `sessionStorage` value of `key` (null when absent).
async fn kept(b: &Browser, key: &str) -> Value {
    b.c()
        .execute(
            "return sessionStorage.getItem(arguments[0]);",
            vec![json!(key)],
        )
        .await
        .unwrap()
}

/// Waits until the page's status says `words` (the page's text in the
/// failure).
async fn says(b: &Browser, words: &str) {
    let deadline = std::time::Instant::now() + LIMIT;
    while !b.text("#state").await.contains(words) {
        assert!(
            std::time::Instant::now() < deadline,
            "the page never said {words:?}: {} at {}",
            b.text("body").await,
            b.url().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The seq of this tab's place (the page keeps its starting position per
/// room and seq).
async fn page_seq(b: &Browser, room: &str) -> u64 {
    let prefix = format!("sluice-start:{room}:");
    let v = b
        .c()
        .execute(
            "return Object.keys(sessionStorage).find(k => k.startsWith(arguments[0])) || '';",
            vec![json!(prefix)],
        )
        .await
        .unwrap();
    v.as_str()
        .and_then(|k| k.strip_prefix(&prefix))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no place kept for {room}: {v}"))
}

/// Waits until the invite form shows, with `words` in its message and the
/// focus in its input; answers the refusal's reason.
async fn invite_form(b: &Browser, words: &str) -> String {
    wait_for(LIMIT, "the invite form", || async {
        let msg = b.text("#sluice-invite-msg").await;
        (b.text("#sluice-invite label").await == "Invite code" && msg.contains(words)).then_some(())
    })
    .await;
    assert_eq!(
        b.js("return document.activeElement && document.activeElement.id")
            .await,
        json!("sluice-invite-code"),
        "the focus moved to the code's input"
    );
    assert_eq!(
        b.js("return document.getElementById('sluice-invite-code').labels[0].textContent")
            .await,
        json!("Invite code")
    );
    assert_eq!(
        b.js("return document.getElementById('sluice-invite-msg').getAttribute('aria-live')")
            .await,
        json!("polite")
    );
    assert_eq!(
        b.js("return document.getElementById('sluice').getAttribute('data-state')")
            .await,
        json!("invite")
    );
    let lead = b.text("#sluice .lead").await;
    assert!(
        lead.contains("invited guests") && !lead.contains("place is kept"),
        "the lead promises no place before a code is taken: {lead}"
    );
    let reason = b
        .js("return document.getElementById('sluice-invite').getAttribute('data-reason')")
        .await;
    reason.as_str().unwrap_or_default().to_owned()
}

// === invite codes ===

/// A fan arrives with a code in the fragment (and a fragment of the
/// shop's own): the code leaves the address bar before anything else,
/// stays in the tab through a reload, buys one place (one redemption),
/// and is forgotten once the fan is in.
async fn code_in_the_fragment(b: &Browser, origin: &TestOrigin) {
    let gw = gateway(origin, false).await;
    let base = gw.url();
    let (front, _) = issue(&base, 1).await;
    json_join(&base, "vip", json!({"invite": front})).await; // the room's one credit
    let (code, id) = issue(&base, 1).await;

    let deep = format!("{base}/echo/vip/drop?x=1");
    let entries = b.js("return history.length").await.as_u64().unwrap();
    b.c()
        .goto(&format!("{deep}#seats&sluice_invite={code}"))
        .await
        .unwrap();
    let p = position(b).await;
    assert_eq!(p, 1, "next in line behind the one admitted");
    let url = b.url().await;
    assert_eq!(
        url,
        format!("{deep}#seats"),
        "the code left the address bar"
    );
    assert_eq!(b.js("return location.hash").await, json!("#seats"));
    assert_eq!(
        b.js("return history.length").await,
        json!(entries + 1),
        "the address replaced, not a new history entry"
    );
    assert_eq!(kept(b, "sluice-invite:vip").await, json!(code));
    assert_eq!(used(&base, &id).await, 1, "one redemption");

    // A reload keeps the place; nothing is redeemed again.
    b.c().refresh().await.unwrap();
    assert_eq!(position(b).await, 1);
    assert_eq!(used(&base, &id).await, 1);

    // The line moves: the fan lands where it asked, the code forgotten.
    let res = admin_patch(&base, "vip", json!({"rate_per_sec": 50.0})).await;
    assert!(res.status.is_success(), "{}", res.text());
    assert_eq!(landed(b).await, deep);
    assert!(b.text("body").await.contains("/echo/vip/drop"));
    assert_eq!(kept(b, "sluice-invite:vip").await, Value::Null);
    assert_eq!(used(&base, &id).await, 1);
    gw.shutdown().await;
}

/// A fan with no code sees the form (no work issued), types a guess (told
/// it was not recognised, still no work), then the right code in capitals
/// with a dash, as a fan would, and is let in on that one code.
async fn code_typed_in_the_form(b: &mut Browser, origin: &TestOrigin) {
    let gw = gateway(origin, true).await;
    let base = gw.url();
    let (code, id) = issue(&base, 1).await;

    // The room is idle and admits at once (a JSON fan with a code is let
    // in by its join); a visitor with no code is never let in on the
    // spot, however many snapshots pass.
    let (other, _) = issue(&base, 1).await;
    let joined = json_join(&base, "vip", json!({"invite": other})).await;
    assert_eq!(joined["state"], "admitted", "{joined}");
    for _ in 0..10 {
        let page = TestClient::new()
            .get(
                &format!("{base}/echo/vip/probe"),
                &[("accept", "text/html")],
            )
            .await;
        assert!(page.text().contains("id=\"sluice\""), "{}", page.text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let issued = challenges(&base, "vip").await;

    let deep = format!("{base}/echo/vip/hall");
    b.c().goto(&deep).await.unwrap();
    assert_eq!(invite_form(b, "by invitation").await, "required");
    assert!(b.text("#state").await.contains("by invitation"));
    b.shot("invite-form").await;
    assert_eq!(
        challenges(&base, "vip").await,
        issued,
        "no work before a code"
    );

    b.type_into("#sluice-invite-code", &"a".repeat(26)).await;
    b.click("#sluice-invite button").await;
    assert_eq!(invite_form(b, "not recognised").await, "unknown");
    assert_eq!(
        b.js("return document.getElementById('sluice-invite-code').getAttribute('aria-invalid')")
            .await,
        json!("true")
    );
    b.shot("invite-unknown").await;
    assert_eq!(
        challenges(&base, "vip").await,
        issued,
        "no work for a guess"
    );

    let typed = format!(
        "{}-{}",
        code[..13].to_ascii_uppercase(),
        code[13..].to_ascii_uppercase()
    );
    b.type_into("#sluice-invite-code", &typed).await;
    b.click("#sluice-invite button").await;
    assert_eq!(landed(b).await, deep);
    assert_eq!(used(&base, &id).await, 1);
    assert_eq!(
        challenges(&base, "vip").await,
        issued + 1.0,
        "one challenge, solved once"
    );
    gw.shutdown().await;
}

/// A code another fan already used: the form says it can no longer be
/// used, and the gateway issued no work for it.
async fn code_used_up(b: &mut Browser, origin: &TestOrigin) {
    let gw = gateway(origin, true).await;
    let base = gw.url();
    let (code, id) = issue(&base, 1).await;
    json_join(&base, "vip", json!({"invite": code})).await;
    assert_eq!(used(&base, &id).await, 1);
    let issued = challenges(&base, "vip").await;
    let exhausted = r#"sluice_invites_total{room="vip",result="exhausted"}"#;

    b.c()
        .goto(&format!("{base}/echo/vip/late#sluice_invite={code}"))
        .await
        .unwrap();
    assert_eq!(invite_form(b, "can no longer be used").await, "exhausted");
    b.shot("invite-used").await;
    assert_eq!(b.js("return location.hash").await, json!(""));
    assert!(
        !b.url().await.contains(&code),
        "the code left the address bar"
    );
    assert_eq!(kept(b, "sluice-invite:vip").await, Value::Null);
    assert_eq!(challenges(&base, "vip").await, issued, "no work issued");
    assert!(metric(&base, exhausted).await >= 1.0);
    assert_eq!(used(&base, &id).await, 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_takes_invite_codes_from_the_fragment_and_the_form() {
    let Some(mut b) = Browser::start("page-invites-chromium", WINDOW).await else {
        return;
    };
    let origin = TestOrigin::start().await;
    code_in_the_fragment(&b, &origin).await;
    code_typed_in_the_form(&mut b, &origin).await;
    code_used_up(&mut b, &origin).await;
    b.close().await;
}

// === enqueue tokens ===

/// A fan the shop signed in arrives with its token: its place is its
/// account's, the same for a second tab with no cookie and for a JSON
/// device of the same account; without a token, or with one for another
/// room, the page sends the fan to sign in, asks no work and does not
/// retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_carries_the_shops_enqueue_token() {
    let Some(mut b) = Browser::start("page-enqueue-chromium", WINDOW).await else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, false).await;
    let base = gw.url();
    // The room's one credit, then one waiting in front.
    for sub in ["first", "second"] {
        json_join(
            &base,
            "members",
            json!({"enqueue_token": token("members", sub)}),
        )
        .await;
    }

    let deep = format!("{base}/echo/members/drop");
    let jwt = token("members", "fan-1");
    b.c()
        .goto(&format!("{deep}#sluice_enqueue={jwt}"))
        .await
        .unwrap();
    let p = position(&b).await;
    assert_eq!(p, 2);
    assert_eq!(b.url().await, deep, "the token left the address bar");
    assert_eq!(kept(&b, "sluice-enqueue:members").await, json!(jwt));
    let seq = page_seq(&b, "members").await;
    b.shot("enqueue-waiting").await;

    // A second tab, no cookie, a fresh token of the same account.
    let first_tab = b.c().window().await.unwrap();
    let tab = b.c().new_window(true).await.unwrap();
    b.c().switch_to_window(tab.handle).await.unwrap();
    // (cookies are deleted for the document's site: open one of it first)
    b.c()
        .goto(&format!("{base}/_sluice/healthz"))
        .await
        .unwrap();
    b.c().delete_all_cookies().await.unwrap();
    assert!(b.c().get_all_cookies().await.unwrap().is_empty());
    b.c()
        .goto(&format!(
            "{deep}#sluice_enqueue={}",
            token("members", "fan-1")
        ))
        .await
        .unwrap();
    assert_eq!(position(&b).await, p, "the account's place, not a new one");
    assert_eq!(page_seq(&b, "members").await, seq);
    // And a JSON device of the account.
    let device = json_join(
        &base,
        "members",
        json!({"enqueue_token": token("members", "fan-1")}),
    )
    .await;
    assert_eq!(device["seq"], json!(seq), "{device}");

    // The line moves: the tab lands where it asked, the token forgotten.
    let res = admin_patch(&base, "members", json!({"rate_per_sec": 50.0})).await;
    assert!(res.status.is_success(), "{}", res.text());
    assert_eq!(landed(&b).await, deep);
    assert_eq!(kept(&b, "sluice-enqueue:members").await, Value::Null);
    b.c().close_window().await.unwrap();
    b.c().switch_to_window(first_tab).await.unwrap();
    assert_eq!(landed(&b).await, deep, "the first tab is in too");

    // No token, the room idle (it admits at once): sign in first, no
    // work asked, not let in on the spot.
    b.c().delete_all_cookies().await.unwrap();
    assert!(b.c().get_all_cookies().await.unwrap().is_empty());
    let issued = challenges(&base, "members").await;
    let other = format!("{base}/echo/members/other?y=2");
    b.c().goto(&other).await.unwrap();
    says(&b, "signed in at the shop").await;
    b.shot("enqueue-sign-in").await;
    let link = b
        .js("return document.querySelector('#sluice-sign-in a').getAttribute('href')")
        .await;
    assert_eq!(
        link,
        json!("/echo/members/other?y=2"),
        "back to the page asked"
    );
    assert_eq!(
        b.js("return document.getElementById('sluice').getAttribute('data-state')")
            .await,
        json!("sign-in")
    );
    assert_eq!(challenges(&base, "members").await, issued, "no work asked");
    let lead = b.text("#sluice .lead").await;
    assert!(
        lead.contains("signed-in customers") && !lead.contains("place is kept"),
        "the lead promises no place before a token: {lead}"
    );

    // A room with the shop's sign-in page: the notice links there (the
    // ampersand intact), in the same words.
    b.c().goto(&format!("{base}/echo/club/drop")).await.unwrap();
    says(&b, "signed in at the shop").await;
    assert_eq!(
        b.js("return document.querySelector('#sluice-sign-in a').getAttribute('href')")
            .await,
        json!(SIGN_IN)
    );
    assert_eq!(b.text("#sluice-sign-in a").await, "Sign in at the shop");
    assert_eq!(challenges(&base, "club").await, 0.0, "no work asked");

    // A token for another room: refused at the join, said once, no loop.
    let wrong = token("vip", "fan-1");
    b.c()
        .goto(&format!("{base}/echo/members/again#sluice_enqueue={wrong}"))
        .await
        .unwrap();
    says(&b, "expired or is not valid").await;
    assert_eq!(kept(&b, "sluice-enqueue:members").await, Value::Null);
    let after = challenges(&base, "members").await;
    assert_eq!(after, issued + 1.0, "one try");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(challenges(&base, "members").await, after, "no retry loop");
    b.close().await;
    gw.shutdown().await;
}

// === the same door in Firefox ===

/// Firefox (WebDriver BiDi): a code in the fragment lets the fan in on one
/// redemption with the code gone from the address bar; with no code the
/// form shows with the focus in it and a code put in it lets the fan in;
/// with no token the sign-in notice shows and no work is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firefox_takes_a_code_and_sends_a_fan_without_token_to_sign_in() {
    let Some(ff) = Firefox::start("page-invites-firefox").await else {
        return;
    };
    ff.set_viewport(WINDOW.0, WINDOW.1).await;
    let origin = TestOrigin::start().await;
    let gone = "return !document.getElementById('sluice')";
    async fn until(ff: &Firefox, script: &str, what: &str) {
        wait_for(LIMIT, what, || async {
            (ff.try_js(script).await.ok() == Some(json!(true))).then_some(())
        })
        .await;
    }

    // A code in the fragment.
    let gw = gateway(&origin, true).await;
    let base = gw.url();
    let (code, id) = issue(&base, 1).await;
    let deep = format!("{base}/echo/vip/drop");
    ff.goto(&format!("{deep}#sluice_invite={code}")).await;
    until(&ff, gone, "the origin's page").await;
    assert_eq!(ff.url().await, deep);
    assert_eq!(used(&base, &id).await, 1);
    assert_eq!(
        ff.js("return sessionStorage.getItem('sluice-invite:vip')")
            .await,
        Value::Null
    );
    gw.shutdown().await;

    // No code: the form; a code put in it.
    let gw = gateway(&origin, true).await;
    let base = gw.url();
    let (code, id) = issue(&base, 1).await;
    let deep = format!("{base}/echo/vip/hall");
    ff.goto(&deep).await;
    until(
        &ff,
        "const m = document.getElementById('sluice-invite-msg'); \
         return !!m && m.textContent.includes('by invitation') \
           && document.activeElement.id === 'sluice-invite-code'",
        "the invite form, focused",
    )
    .await;
    assert_eq!(challenges(&base, "vip").await, 0.0, "no work before a code");
    ff.js(&format!(
        "document.getElementById('sluice-invite-code').value = {};",
        json!(code)
    ))
    .await;
    ff.click("#sluice-invite button").await;
    until(&ff, gone, "the origin's page").await;
    assert_eq!(ff.url().await, deep);
    assert_eq!(used(&base, &id).await, 1);

    // No token: sign in first.
    ff.goto(&format!("{base}/echo/members/drop")).await;
    until(
        &ff,
        "return document.getElementById('state').textContent.includes('signed in at the shop') \
           && !!document.querySelector('#sluice-sign-in a')",
        "the sign-in notice",
    )
    .await;
    assert_eq!(challenges(&base, "members").await, 0.0, "no work asked");
    gw.shutdown().await;
    ff.close().await;
}
