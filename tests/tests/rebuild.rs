//! A store that lost its data is rebuilt from the ledger (issue 18), with a
//! real `redis-server`, a real PostgreSQL (`initdb` + `pg_ctl`, a cluster of
//! the test's own) and real `sluice serve --postgres` processes, each
//! running a ledger consumer in-process.
//!
//! The sale: visitors join the queue (seqs), hold units, some pay through
//! the signed webhook, some keep their holds open; every answer is kept.
//! Once the ledger has written everything, the gateway is SIGKILLed, Redis
//! is flushed, and a new gateway starts: it finds the event gone, refuses to
//! load the configured stock, and rebuilds it from PostgreSQL. The test then
//! compares Redis, the ledger and the clients' answers: nothing sold twice,
//! every open hold still held by its owner (and payable), every cart still
//! counted, and no seq handed out again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use http::Method;
use serde_json::{Value, json};
use sluice_tests::client::{Answer, TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::postgres::PgServer;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, GatewayProcess, sluice_bin, temp_file, temp_keys};

const WEBHOOK_SECRET: &str = "whsec-rebuild-0123456789abcdef";
const TOTAL: u64 = 40;
const CART: u64 = 4;

struct Site {
    redis: RedisServer,
    pg: PgServer,
    origin: TestOrigin,
    keys: PathBuf,
}

impl Site {
    async fn start() -> Option<Site> {
        let redis = RedisServer::start()?;
        let pg = PgServer::new()?;
        Some(Site {
            redis,
            pg,
            origin: TestOrigin::start().await,
            keys: temp_keys(),
        })
    }

    fn config(&self, auto_rebuild: bool) -> PathBuf {
        let text = format!(
            "[[rooms]]\nid = \"hall\"\npaths = [\"/\"]\nrate_per_sec = 500\nburst = 500\npuzzles = 1\n\
             difficulty_floor_bits = 1\ndifficulty_ceiling_bits = 2\njoin_limit_per_prefix_per_min = 0\n\
             attack_min_solve = \"0s\"\n\n\
             [[events]]\nid = \"gig\"\nroom = \"hall\"\ntotal = {TOTAL}\ncart_limit = {CART}\nhold_ttl = \"300s\"\n\n\
             [ledger]\nauto_rebuild = {auto_rebuild}\nflush_interval = \"50ms\"\n"
        );
        temp_file("rebuild.toml", &text)
    }

    /// `sluice serve` on this site; `postgres`: with the ledger.
    fn gateway(&self, postgres: bool, auto_rebuild: bool, load_stock: bool) -> GatewayProcess {
        let cfg = self.config(auto_rebuild);
        let redis = self.redis.url();
        let origin = self.origin.url();
        let pg = self.pg.url();
        let mut args = vec![
            "--redis",
            &redis,
            "--origin",
            &origin,
            "--config",
            cfg.to_str().unwrap(),
            "--keys-dir",
            self.keys.to_str().unwrap(),
            "--admin-token",
            ADMIN_TOKEN,
            "--webhook-secret",
            WEBHOOK_SECRET,
        ];
        if postgres {
            args.extend(["--postgres", &pg]);
        }
        if load_stock {
            args.push("--load-stock");
        }
        GatewayProcess::start_logged(&args, "warn,audit=info,sluice_gateway::reserve=info")
    }

    /// A visitor of room `hall` with an admission signed by the site's key.
    fn buyer(&self, base: &str) -> Visitor {
        sluice_tests::admitted_visitor(&self.keys, base, "hall")
    }
}

/// The seq a join gave: in the answer while waiting, in the admission
/// token's claims when admitted at once.
fn seq_of(v: &Visitor) -> u64 {
    use base64::Engine as _;
    if let Some(s) = v.seq {
        return s;
    }
    let token = v.admission_token.as_deref().expect("joined");
    let payload = token.split('.').nth(1).unwrap();
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    claims["seq"].as_u64().expect("an admission of a seq")
}

async fn hold(v: &Visitor, qty: u64) -> Answer {
    v.call_admitted(
        Method::POST,
        "/_sluice/events/gig/holds",
        Some(json!({"qty": qty})),
        &[],
    )
    .await
}

async fn pay(base: &str, hold_id: &str) -> sluice_tests::client::Answer {
    sluice_tests::pay_succeeded(base, WEBHOOK_SECRET, hold_id).await
}

async fn admin(base: &str, method: Method, path: &str) -> Answer {
    TestClient::new()
        .call(
            method,
            &format!("{base}{path}"),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
            body(""),
        )
        .await
}

async fn until(
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> Option<Value>,
) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the clients were told during the sale.
#[derive(Default)]
struct Answers {
    /// (owner, hold id, qty) of holds acknowledged and not paid.
    open: Vec<(Visitor, String, u64)>,
    /// (owner, hold id, qty) of holds paid (webhook answered `confirmed`).
    paid: Vec<(Visitor, String, u64)>,
    /// Seqs handed out by joins.
    seqs: Vec<u64>,
}

impl Answers {
    fn units(list: &[(Visitor, String, u64)]) -> u64 {
        list.iter().map(|(_, _, q)| q).sum()
    }
}

/// Joins through the real queue (proof of work), then sells: each buyer
/// holds 1 to 4 units; every other one pays.
async fn sale(site: &Site, base: &str, answers: &mut Answers) {
    for _ in 0..6 {
        let mut v = Visitor::new(base, "hall");
        let res = v.join("/").await;
        assert!(res.status.is_success(), "{}", res.text());
        answers.seqs.push(seq_of(&v));
    }
    for i in 0..10u64 {
        let v = site.buyer(base);
        let qty = 1 + i % CART;
        let res = hold(&v, qty).await;
        assert_eq!(res.status, 201, "{}", res.text());
        let id = res.json()["hold_id"].as_str().unwrap().to_owned();
        if i % 2 == 0 {
            let paid = pay(base, &id).await;
            assert_eq!(paid.status, 200, "{}", paid.text());
            assert_eq!(paid.json()["status"], "confirmed");
            answers.paid.push((v, id, qty));
        } else {
            answers.open.push((v, id, qty));
        }
    }
}

/// Waits until the ledger has written every entry of `gig` and recorded
/// the room's floors at least as high as every seq handed out.
async fn ledger_caught_up(site: &Site, base: &str, answers: &Answers) {
    let max_seq = *answers.seqs.iter().max().unwrap();
    // The gateway watches the lag (every second, with Redis).
    until("the lag is measured", Duration::from_secs(10), async || {
        let seen = sluice_tests::metric(base, "sluice_ledger_behind{event=\"gig\"}").await == 0.0
            && sluice_tests::metric(base, "sluice_ledger_lag_entries{event=\"gig\"}").await == 0.0
            && sluice_tests::metric(base, "sluice_ledger_drift_units{event=\"gig\"}").await == 0.0;
        let ready = admin(base, Method::GET, "/_sluice/readyz").await.json();
        (seen && ready["ledger"]["configured"] == true && ready["ledger"]["behind"] == json!([]))
            .then_some(ready)
    })
    .await;
    until(
        "the ledger catches up",
        Duration::from_secs(30),
        async || {
            let e = admin(base, Method::GET, "/_sluice/admin/events/gig")
                .await
                .json();
            let ledger = &e["ledger"];
            // Written, and reconciled against the store with no drift.
            let written =
                ledger["read"] == true && ledger["lag_entries"] == 0 && ledger["drift_units"] == 0;
            let tail: u64 = site
                .pg
                .psql("SELECT coalesce(max(tail), 0) FROM rooms WHERE room = 'hall'")
                .trim()
                .parse()
                .unwrap_or(0);
            (written && tail >= max_seq).then_some(e)
        },
    )
    .await;
}

/// Redis, the ledger and the clients agree after the rebuild.
async fn assert_rebuilt(site: &Site, base: &str, answers: &Answers) {
    let paid = Answers::units(&answers.paid);
    let open = Answers::units(&answers.open);
    let e = admin(base, Method::GET, "/_sluice/admin/events/gig")
        .await
        .json();
    assert_eq!(e["ready"], true, "{e}");
    assert_eq!(e["confirmed"], paid, "sales kept: {e}");
    assert_eq!(e["held"], open, "open holds kept: {e}");
    assert_eq!(e["available"], TOTAL - paid - open, "{e}");
    assert_eq!(e["invariant_holds"], true, "{e}");

    // Every open hold is still its owner's, held, with its deadline.
    for (v, id, qty) in &answers.open {
        let res = v
            .call_admitted(Method::GET, &format!("/_sluice/holds/{id}"), None, &[])
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
        let h = res.json();
        assert_eq!(h["status"], "held", "{h}");
        assert_eq!(h["qty"], *qty, "{h}");
    }
    // Every paid hold is still sold.
    for (v, id, _) in &answers.paid {
        let res = v
            .call_admitted(Method::GET, &format!("/_sluice/holds/{id}"), None, &[])
            .await;
        assert_eq!(res.json()["status"], "confirmed", "{}", res.text());
    }
    // Carts are still counted: a buyer with 4 units (held or bought) may
    // take no more.
    for (v, _, qty) in answers.open.iter().chain(&answers.paid) {
        if *qty == CART {
            let res = hold(v, 1).await;
            assert_eq!(res.status, 409, "a full cart took more: {}", res.text());
            assert_eq!(res.json()["code"], "cart_limit_exceeded", "{}", res.text());
        }
    }
    // The ledger holds every acknowledged hold and every confirmed payment.
    let holds: u64 = site
        .pg
        .psql("SELECT count(*) FROM holds WHERE event = 'gig'")
        .trim()
        .parse()
        .unwrap();
    assert_eq!(holds, (answers.open.len() + answers.paid.len()) as u64);
    for (_, id, _) in &answers.paid {
        let n = site.pg.psql(&format!(
            "SELECT count(*) FROM payments WHERE hold_id = '{id}'"
        ));
        assert_eq!(n.trim(), "1", "payment of {id} missing from the ledger");
    }
}

/// Sells what is left and pays the restored holds: exactly `TOTAL` units
/// end up sold, none twice.
async fn sell_out(site: &Site, base: &str, answers: &Answers) {
    for (_, id, _) in &answers.open {
        let paid = pay(base, id).await;
        assert_eq!(paid.status, 200, "{}", paid.text());
        assert_eq!(paid.json()["status"], "confirmed", "{}", paid.text());
    }
    let mut sold_after = 0;
    for _ in 0..TOTAL {
        let v = site.buyer(base);
        let res = hold(&v, 1).await;
        if res.status == 201 {
            let id = res.json()["hold_id"].as_str().unwrap().to_owned();
            assert_eq!(pay(base, &id).await.status, 200);
            sold_after += 1;
        } else {
            assert_eq!(res.json()["code"], "sold_out", "{}", res.text());
        }
    }
    let before = Answers::units(&answers.paid) + Answers::units(&answers.open);
    assert_eq!(before + sold_after, TOTAL, "units sold in all");
    let e = admin(base, Method::GET, "/_sluice/admin/events/gig")
        .await
        .json();
    assert_eq!(
        (&e["confirmed"], &e["available"]),
        (&json!(TOTAL), &json!(0)),
        "{e}"
    );
}

/// No seq handed out before the loss is handed out again.
async fn no_seq_reused(base: &str, answers: &Answers) {
    let max_before = *answers.seqs.iter().max().unwrap();
    for _ in 0..3 {
        let mut v = Visitor::new(base, "hall");
        let res = v.join("/").await;
        assert!(res.status.is_success(), "{}", res.text());
        let seq = seq_of(&v);
        assert!(
            seq > max_before,
            "seq {seq} handed out again (≤ {max_before})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_store_is_rebuilt_from_the_ledger_by_a_restarted_gateway() {
    let Some(site) = Site::start().await else {
        return;
    };
    let mut gw = site.gateway(true, true, true);
    let base = gw.url();
    until("stock loaded", Duration::from_secs(10), async || {
        let e = admin(&base, Method::GET, "/_sluice/admin/events/gig")
            .await
            .json();
        (e["available"] == TOTAL).then_some(e)
    })
    .await;
    let mut answers = Answers::default();
    sale(&site, &base, &mut answers).await;
    ledger_caught_up(&site, &base, &answers).await;

    // Everything lost at once: the gateway and the store's data.
    gw.signal("KILL");
    gw.wait(Duration::from_secs(5));
    assert!(site.redis.command("FLUSHALL").contains("OK"));

    // A new gateway (with --load-stock, which must not reload a store the
    // ledger knows had the event) finds the event gone and rebuilds it.
    let gw = site.gateway(true, true, true);
    let base = gw.url();
    until(
        "rebuilt from the ledger",
        Duration::from_secs(20),
        async || {
            let e = admin(&base, Method::GET, "/_sluice/admin/events/gig")
                .await
                .json();
            (e["ready"] == true).then_some(e)
        },
    )
    .await;
    // The buyers come back through the new gateway.
    for (v, _, _) in answers.open.iter_mut().chain(answers.paid.iter_mut()) {
        v.base = base.clone();
    }
    assert_rebuilt(&site, &base, &answers).await;
    assert!(
        gw.log_lines()
            .iter()
            .any(|l| l.contains("rebuilt from the ledger")),
        "the rebuild is logged"
    );
    no_seq_reused(&base, &answers).await;
    sell_out(&site, &base, &answers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_rebuilds_a_lost_event_and_never_overwrites_live_counters() {
    let Some(site) = Site::start().await else {
        return;
    };
    let gw = site.gateway(true, false, true);
    let base = gw.url();
    until("stock loaded", Duration::from_secs(10), async || {
        let e = admin(&base, Method::GET, "/_sluice/admin/events/gig")
            .await
            .json();
        (e["available"] == TOTAL).then_some(e)
    })
    .await;
    let mut answers = Answers::default();
    sale(&site, &base, &mut answers).await;
    ledger_caught_up(&site, &base, &answers).await;

    // Live counters are never overwritten.
    let res = admin(&base, Method::POST, "/_sluice/admin/events/gig/rebuild").await;
    assert_eq!(res.status, 409, "{}", res.text());
    assert_eq!(res.json()["code"], "event_present");
    // An event the ledger never saw.
    let res = admin(&base, Method::POST, "/_sluice/admin/events/nope/rebuild").await;
    assert_eq!(res.status, 404, "{}", res.text());
    assert_eq!(res.json()["code"], "event_not_found");

    // Flushed while the gateway runs: without auto_rebuild it stays not
    // ready (never reloaded from the configuration, never sold out).
    assert!(site.redis.command("FLUSHALL").contains("OK"));
    until("the loss is seen", Duration::from_secs(10), async || {
        let e = admin(&base, Method::GET, "/_sluice/admin/events/gig")
            .await
            .json();
        (e["ready"] == false).then_some(e)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let v = site.buyer(&base);
    let res = hold(&v, 1).await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(res.json()["code"], "inventory_not_ready");

    // A gateway without a ledger cannot rebuild.
    let plain = site.gateway(false, false, false);
    let res = admin(
        &plain.url(),
        Method::POST,
        "/_sluice/admin/events/gig/rebuild",
    )
    .await;
    assert_eq!(res.status, 409, "{}", res.text());
    assert_eq!(res.json()["code"], "ledger_not_configured");

    // The operator's command.
    let out = std::process::Command::new(sluice_bin())
        .args([
            "admin",
            "--url",
            &base,
            "--token",
            ADMIN_TOKEN,
            "--json",
            "event",
            "gig",
            "rebuild",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outcome"], "restored", "{v}");
    // The gateway's metrics say what the ledger did.
    let m = |s: &'static str| sluice_tests::metric(&base, s);
    assert_eq!(
        m("sluice_ledger_rebuilds_total{outcome=\"restored\"}").await,
        1.0
    );
    assert!(m("sluice_ledger_rebuilds_total{outcome=\"present\"}").await >= 1.0);
    assert!(m("sluice_ledger_rebuilds_total{outcome=\"unknown\"}").await >= 1.0);
    assert_eq!(v["confirmed"], Answers::units(&answers.paid), "{v}");
    assert_eq!(v["held"], Answers::units(&answers.open), "{v}");
    assert_eq!(v["open_holds"], answers.open.len(), "{v}");
    // Twice is refused: the first rebuild's counters are live.
    let res = admin(&base, Method::POST, "/_sluice/admin/events/gig/rebuild").await;
    assert_eq!(res.status, 409, "{}", res.text());

    assert_rebuilt(&site, &base, &answers).await;
    sell_out(&site, &base, &answers).await;
}
