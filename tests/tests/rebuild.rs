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
    /// Extra configuration appended (another event).
    extra: String,
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
            extra: String::new(),
        })
    }

    fn config(&self, auto_rebuild: bool) -> PathBuf {
        let text = format!(
            "[[rooms]]\nid = \"hall\"\npaths = [\"/\"]\nrate_per_sec = 500\nburst = 500\npuzzles = 1\n\
             difficulty_floor_bits = 1\ndifficulty_ceiling_bits = 2\njoin_limit_per_prefix_per_min = 0\n\
             attack_min_solve = \"0s\"\n\n\
             [[events]]\nid = \"gig\"\nroom = \"hall\"\ntotal = {TOTAL}\ncart_limit = {CART}\nhold_ttl = \"300s\"\n\n\
             [ledger]\nauto_rebuild = {auto_rebuild}\nflush_interval = \"50ms\"\n\n{}",
            self.extra
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

    /// The same visitor (its admission token) at another gateway.
    fn buyer_as(&self, base: &str, v: &Visitor) -> Visitor {
        let mut again = Visitor::new(base, "hall");
        again.admission_token = v.admission_token.clone();
        again
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
            // (before the ledger made its tables: not yet)
            let tail: u64 = site
                .pg
                .try_psql("SELECT coalesce(max(tail), 0) FROM rooms WHERE room = 'hall'")
                .ok()?
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

// === An event with categories ===

/// `tiers` in room `hall`: floor 8 (at most 3 each), vip 4, balcony 6 (at
/// most 2 each), at most 4 units per visitor across them.
const TIERS: &str = "[[events]]\nid = \"tiers\"\nroom = \"hall\"\ncart_limit = 4\nhold_ttl = \"300s\"\n\n\
     [[events.categories]]\nid = \"floor\"\ntotal = 8\ncart_limit = 3\n\n\
     [[events.categories]]\nid = \"vip\"\ntotal = 4\n\n\
     [[events.categories]]\nid = \"balcony\"\ntotal = 6\ncart_limit = 2\n";

/// The categories' stock text the ledger keeps (`events.categories`).
const TIERS_LEDGER: &str = "floor:8:3,vip:4:0,balcony:6:2";

async fn hold_items(v: &Visitor, items: &[(&str, u64)]) -> Answer {
    let items: Vec<Value> = items
        .iter()
        .map(|(c, q)| json!({"category": c, "qty": q}))
        .collect();
    v.call_admitted(
        Method::POST,
        "/_sluice/events/tiers/holds",
        Some(json!({ "items": items })),
        &[],
    )
    .await
}

async fn tiers_view(base: &str) -> Value {
    admin(base, Method::GET, "/_sluice/admin/events/tiers")
        .await
        .json()
}

/// `{category: [total, available, held, confirmed]}` of the admin view.
fn tier_counts(view: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for c in view["categories"].as_array().expect("categories") {
        out.insert(
            c["id"].as_str().unwrap().to_owned(),
            json!([c["total"], c["available"], c["held"], c["confirmed"]]),
        );
    }
    Value::Object(out)
}

/// A hold of `tiers` the sale made, with what it was told.
struct TierHold {
    owner: Visitor,
    id: String,
    items: Vec<(&'static str, u64)>,
}

/// The sale: paid, open and released holds across the three categories.
/// Floor ends 2 held, 4 sold; vip 2 held, 2 sold (none left); balcony 1
/// held, 3 sold.
async fn tiers_sale(site: &Site, base: &str) -> (Vec<TierHold>, Vec<TierHold>) {
    let plan: [(&[(&'static str, u64)], &str); 7] = [
        (&[("floor", 3)], "pay"),
        (&[("floor", 2), ("vip", 1)], "open"),
        (&[("vip", 1), ("balcony", 2)], "pay"),
        (&[("balcony", 1)], "open"),
        (&[("floor", 1), ("balcony", 1)], "release"),
        (&[("vip", 1)], "open"),
        (&[("floor", 1), ("vip", 1), ("balcony", 1)], "pay"),
    ];
    let (mut open, mut paid) = (Vec::new(), Vec::new());
    for (items, then) in plan {
        let v = site.buyer(base);
        let res = hold_items(&v, items).await;
        assert_eq!(res.status, 201, "{}", res.text());
        let id = res.json()["hold_id"].as_str().unwrap().to_owned();
        let h = TierHold {
            owner: v,
            id,
            items: items.to_vec(),
        };
        match then {
            "pay" => {
                let res = pay(base, &h.id).await;
                assert_eq!(res.json()["status"], "confirmed", "{}", res.text());
                paid.push(h);
            }
            "release" => {
                let res = h
                    .owner
                    .call_admitted(
                        Method::DELETE,
                        &format!("/_sluice/holds/{}", h.id),
                        None,
                        &[],
                    )
                    .await;
                assert!(res.status.is_success(), "{}", res.text());
            }
            _ => open.push(h),
        }
    }
    (open, paid)
}

/// Waits until the ledger has written every entry of `tiers`, reconciled
/// with no drift, and returns the admin view.
async fn tiers_caught_up(base: &str) -> Value {
    until(
        "the ledger catches up on tiers",
        Duration::from_secs(30),
        async || {
            let behind =
                sluice_tests::metric(base, "sluice_ledger_lag_entries{event=\"tiers\"}").await;
            let e = tiers_view(base).await;
            let l = &e["ledger"];
            (behind == 0.0 && l["read"] == true && l["lag_entries"] == 0 && l["drift_units"] == 0)
                .then_some(e)
        },
    )
    .await
}

/// The ledger's per-category balance (`category_balance`), as the admin
/// view's [`tier_counts`].
fn ledger_tier_counts(pg: &PgServer) -> Value {
    let rows = pg.psql(
        "SELECT category, total, available, held_units, confirmed_units
         FROM category_balance WHERE event = 'tiers' ORDER BY position",
    );
    let mut out = serde_json::Map::new();
    for line in rows.lines() {
        let f: Vec<&str> = line.split('|').collect();
        let n = |i: usize| -> u64 { f[i].parse().unwrap() };
        out.insert(f[0].to_owned(), json!([n(1), n(2), n(3), n(4)]));
    }
    Value::Object(out)
}

/// POST rebuild of `tiers`.
async fn rebuild_tiers(base: &str) -> Answer {
    admin(base, Method::POST, "/_sluice/admin/events/tiers/rebuild").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_with_categories_is_rebuilt_per_category_and_never_as_a_plain_one() {
    let Some(mut site) = Site::start().await else {
        return;
    };
    site.extra = TIERS.to_owned();
    let gw = site.gateway(true, false, true);
    let base = gw.url();
    until("tiers loaded", Duration::from_secs(10), async || {
        let e = tiers_view(&base).await;
        (e["available"] == 18).then_some(e)
    })
    .await;
    let (open, paid) = tiers_sale(&site, &base).await;
    let before = tiers_caught_up(&base).await;
    let expected = json!({
        "floor": [8, 2, 2, 4],
        "vip": [4, 0, 2, 2],
        "balcony": [6, 2, 1, 3],
    });
    assert_eq!(tier_counts(&before), expected, "{before}");
    // The ledger keeps the same per category.
    assert_eq!(ledger_tier_counts(&site.pg), expected);
    assert_eq!(
        site.pg
            .psql("SELECT categories FROM events WHERE event = 'tiers'"),
        TIERS_LEDGER
    );
    let items = site.pg.psql(&format!(
        "SELECT string_agg(category || '=' || qty, '/' ORDER BY category)
         FROM hold_items WHERE hold_id = '{}'",
        paid[2].id
    ));
    assert_eq!(items, "balcony=1/floor=1/vip=1");

    // The store loses everything behind the running gateway.
    assert!(site.redis.command("FLUSHALL").contains("OK"));
    until("the loss is seen", Duration::from_secs(10), async || {
        let e = tiers_view(&base).await;
        (e["ready"] == false).then_some(e)
    })
    .await;

    // Safety net: a ledger that lost the categories (or never had them)
    // cannot rebuild the event, as plain or otherwise.
    site.pg
        .psql("UPDATE events SET categories = NULL WHERE event = 'tiers'");
    let res = rebuild_tiers(&base).await;
    assert_eq!(res.status, 422, "{}", res.text());
    assert!(res.text().contains("categor"), "{}", res.text());
    site.pg.psql(
        "CREATE TABLE hold_items_aside AS SELECT * FROM hold_items WHERE event = 'tiers';
         DELETE FROM hold_items WHERE event = 'tiers'",
    );
    let res = rebuild_tiers(&base).await;
    assert_eq!(res.status, 422, "{}", res.text());
    assert!(
        res.text().contains("knows the event with categories"),
        "{}",
        res.text()
    );
    // Categories back but a hold's breakdown missing: refused too.
    site.pg.psql(&format!(
        "UPDATE events SET categories = '{TIERS_LEDGER}' WHERE event = 'tiers';
         INSERT INTO hold_items SELECT * FROM hold_items_aside WHERE hold_id <> '{}'",
        open[0].id
    ));
    let res = rebuild_tiers(&base).await;
    assert_eq!(res.status, 422, "{}", res.text());
    assert!(res.text().contains("breakdown"), "{}", res.text());
    assert_eq!(tiers_view(&base).await["ready"], false, "nothing restored");
    site.pg.psql(&format!(
        "INSERT INTO hold_items SELECT * FROM hold_items_aside WHERE hold_id = '{}'",
        open[0].id
    ));

    // The ledger whole: the rebuild restores each category.
    let res = rebuild_tiers(&base).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let v = res.json();
    assert_eq!(
        (&v["outcome"], &v["categories"], &v["held"], &v["confirmed"]),
        (&json!("restored"), &json!(3), &json!(5), &json!(9)),
        "{v}"
    );
    let after = until("rebuilt", Duration::from_secs(10), async || {
        let e = tiers_view(&base).await;
        (e["ready"] == true).then_some(e)
    })
    .await;
    assert_eq!(tier_counts(&after), expected, "{after}");
    assert_eq!(after["categories"], before["categories"], "{after}");
    assert_eq!(after["invariant_holds"], true, "{after}");

    // Open holds keep their owner and breakdown; paid ones stay sold.
    for (h, status) in open
        .iter()
        .map(|h| (h, "held"))
        .chain(paid.iter().map(|h| (h, "confirmed")))
    {
        let res = h
            .owner
            .call_admitted(Method::GET, &format!("/_sluice/holds/{}", h.id), None, &[])
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
        let got = res.json();
        assert_eq!(got["status"], status, "{got}");
        let want: Vec<Value> = h
            .items
            .iter()
            .map(|(c, q)| json!({"category": c, "qty": q}))
            .collect();
        let mut have = got["items"].as_array().cloned().unwrap_or_default();
        have.sort_by_key(|i| i["category"].as_str().unwrap().to_owned());
        let mut want = want;
        want.sort_by_key(|i| i["category"].as_str().unwrap().to_owned());
        assert_eq!(have, want, "{got}");
    }

    // Carts per category and across them are still counted.
    let refused = |res: &Answer, category: Option<&str>| {
        assert_eq!(res.status, 409, "{}", res.text());
        let p = res.json();
        assert_eq!(p["code"], "cart_limit_exceeded", "{p}");
        assert_eq!(p["category"].as_str(), category, "{p}");
    };
    // paid[0] bought floor 3 of 3; paid[1] balcony 2 of 2; open[0] holds
    // 3 of 4 across categories.
    refused(
        &hold_items(&paid[0].owner, &[("floor", 1)]).await,
        Some("floor"),
    );
    refused(
        &hold_items(&paid[1].owner, &[("balcony", 1)]).await,
        Some("balcony"),
    );
    refused(&hold_items(&open[0].owner, &[("balcony", 2)]).await, None);
    // All or nothing: vip is gone, so floor is not taken either.
    let v = site.buyer(&base);
    let res = hold_items(&v, &[("floor", 1), ("vip", 1)]).await;
    assert_eq!(res.status, 409, "{}", res.text());
    assert_eq!(
        (&res.json()["code"], &res.json()["category"]),
        (&json!("sold_out"), &json!("vip"))
    );
    assert_eq!(tier_counts(&tiers_view(&base).await), expected);

    // No tier sells past what it has left.
    for (category, left) in [("floor", 2), ("vip", 0), ("balcony", 2)] {
        let mut taken = 0;
        loop {
            let v = site.buyer(&base);
            let res = hold_items(&v, &[(category, 1)]).await;
            if res.status != 201 {
                let p = res.json();
                assert_eq!(
                    (&p["code"], &p["category"]),
                    (&json!("sold_out"), &json!(category)),
                    "{p}"
                );
                break;
            }
            let id = res.json()["hold_id"].as_str().unwrap().to_owned();
            assert_eq!(pay(&base, &id).await.json()["status"], "confirmed");
            taken += 1;
            assert!(taken <= left, "{category} oversold");
        }
        assert_eq!(taken, left, "{category}: units left after the rebuild");
    }
    // The restored holds are paid: every unit of every tier sold once.
    for h in &open {
        let res = pay(&base, &h.id).await;
        assert_eq!(res.json()["status"], "confirmed", "{}", res.text());
    }
    let end = tiers_view(&base).await;
    assert_eq!(
        tier_counts(&end),
        json!({
            "floor": [8, 0, 0, 8],
            "vip": [4, 0, 0, 4],
            "balcony": [6, 0, 0, 6],
        }),
        "{end}"
    );
    // The ledger followed the rebuild (its `restored` entry) and the sales
    // after it, and agrees.
    let end = tiers_caught_up(&base).await;
    assert_eq!(end["confirmed"], 18, "{end}");
    assert_eq!(ledger_tier_counts(&site.pg), tier_counts(&end));
    assert_eq!(
        site.pg.psql(
            "SELECT count(*) FROM hold_transitions
             WHERE event = 'tiers' AND kind = 'restored' AND categories = 'floor:8:3,vip:4:0,balcony:6:2'"
        ),
        "1"
    );
}

/// A category whose units change in the store behind the ledger's back
/// (vip gains 3 the stream never carried; the event's own counter is left
/// alone): the gateway running the ledger in-process reports that
/// category's drift, and only it, in the admin view and as
/// `sluice_ledger_category_drift_units`, corrects nothing, and reports 0
/// again once the store is put right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_category_drifting_in_the_store_is_reported_by_the_gateway() {
    let Some(mut site) = Site::start().await else {
        return;
    };
    site.extra = TIERS.to_owned();
    let gw = site.gateway(true, false, true);
    let base = gw.url();
    until("tiers loaded", Duration::from_secs(10), async || {
        let e = tiers_view(&base).await;
        (e["available"] == 18).then_some(e)
    })
    .await;
    tiers_sale(&site, &base).await;
    let agreed = tiers_caught_up(&base).await;
    assert_eq!(agreed["ledger"]["category_drift"], json!({}), "{agreed}");
    let vip_metric = "sluice_ledger_category_drift_units{event=\"tiers\",category=\"vip\"}";

    let vip_avail = |by: i64| {
        let reply = site
            .redis
            .command(&format!("HINCRBY sluice:{{tiers}}:meta c:vip:avail {by}"));
        assert!(reply.starts_with(':'), "{reply}");
    };
    vip_avail(3);
    // The next entry (a floor hold) carries every category's availability.
    let res = hold_items(&site.buyer(&base), &[("floor", 1)]).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let drifted = until(
        "the drift is reported",
        Duration::from_secs(30),
        async || {
            let e = tiers_view(&base).await;
            (e["ledger"]["category_drift"] == json!({"vip": -3})).then_some(e)
        },
    )
    .await;
    assert_eq!(
        drifted["ledger"]["drift_units"], 0,
        "the event agrees: {drifted}"
    );
    assert_eq!(sluice_tests::metric(&base, vip_metric).await, -3.0);
    assert_eq!(
        sluice_tests::metric(&base, "sluice_ledger_drift_units{event=\"tiers\"}").await,
        0.0
    );
    let text = metrics_text(&base).await;
    assert!(
        !text.contains("sluice_ledger_category_drift_units{event=\"tiers\",category=\"floor\"}"),
        "only the drifting category has a series: {text}"
    );
    // Reported, never corrected: the store keeps its 3 units.
    let vip = drifted["categories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "vip")
        .unwrap()
        .clone();
    assert_eq!(vip["available"], 3, "{drifted}");

    // Put right in the store: the next reconciliation agrees again.
    vip_avail(-3);
    let res = hold_items(&site.buyer(&base), &[("floor", 1)]).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let agreed = until("the drift clears", Duration::from_secs(30), async || {
        let e = tiers_view(&base).await;
        (e["ledger"]["category_drift"] == json!({})).then_some(e)
    })
    .await;
    assert_eq!(agreed["ledger"]["drift_units"], 0, "{agreed}");
    let text = metrics_text(&base).await;
    assert!(
        text.lines().any(|l| l == format!("{vip_metric} 0")),
        "vip's series goes back to 0: {text}"
    );
}

/// The gateway's Prometheus page.
async fn metrics_text(base: &str) -> String {
    let res = sluice_tests::client::TestClient::new()
        .get(
            &format!("{base}/metrics"),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.text()
}

// === Property: random sales of an event with categories ===

/// One hold the random sale took: its owner, units per category, and how
/// it ended (`None`: still held).
struct Taken {
    id: sluice_reservation::HoldId,
    visitor: String,
    items: Vec<sluice_reservation::Item>,
    end: Option<&'static str>,
}

/// A seeded random sale of an event with 1 to 3 categories: holds over
/// random categories by 4 visitors (refusals included), releases, paid
/// and failed payments.
async fn random_sale(
    inv: &sluice_reservation::RedisInventory,
    ev: &sluice_reservation::EventId,
    seed: u64,
) -> (sluice_reservation::StockSpec, Vec<Taken>) {
    use rand::{RngExt as _, SeedableRng as _};
    use sluice_reservation::{CategoryId, CategorySpec, HoldOutcome, Inventory, Item};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let cats: Vec<CategorySpec> = (0..rng.random_range(1..4usize))
        .map(|i| CategorySpec {
            id: CategoryId::parse(&format!("c{i}")).unwrap(),
            total: rng.random_range(0..16u64),
            cart_limit: rng.random_bool(0.5).then(|| rng.random_range(1..4u32)),
        })
        .collect();
    let spec = sluice_reservation::StockSpec {
        total: 0,
        cart_limit: rng.random_range(1..7u32),
        hold_ttl: Duration::from_secs(600),
        version: 1,
        room: "hall".into(),
    };
    let out = inv
        .set_stock_with_categories(ev, &spec, &cats)
        .await
        .unwrap();
    assert!(
        matches!(out, sluice_reservation::SetStockOutcome::Created { .. }),
        "{out:?}"
    );
    let mut taken: Vec<Taken> = Vec::new();
    for n in 0..40 {
        let open: Vec<usize> = (0..taken.len())
            .filter(|i| taken[*i].end.is_none())
            .collect();
        let roll = rng.random_range(0..10u32);
        if roll < 7 || open.is_empty() {
            let visitor = format!("v{}", rng.random_range(0..4u32));
            let mut items: Vec<Item> = Vec::new();
            for c in &cats {
                if rng.random_bool(0.6) {
                    items.push(Item {
                        category: c.id.clone(),
                        qty: rng.random_range(1..4u32),
                    });
                }
            }
            if items.is_empty() {
                continue;
            }
            if let HoldOutcome::Held(view) =
                inv.hold_items(ev, &visitor, &items, None).await.unwrap()
            {
                taken.push(Taken {
                    id: view.hold_id,
                    visitor,
                    items,
                    end: None,
                });
            }
        } else {
            let i = open[rng.random_range(0..open.len())];
            let t = &mut taken[i];
            match roll {
                7 => {
                    inv.confirm(&t.id, &format!("pay-{seed}-{n}"), true)
                        .await
                        .unwrap();
                    t.end = Some("confirmed");
                }
                8 => {
                    inv.confirm(&t.id, &format!("fail-{seed}-{n}"), false)
                        .await
                        .unwrap();
                    t.end = Some("released");
                }
                _ => {
                    inv.release(&t.id, &t.visitor).await.unwrap();
                    t.end = Some("released");
                }
            }
        }
    }
    (spec, taken)
}

/// The entries ever added to `ev`'s stream (`XINFO STREAM`'s
/// `entries-added`), trimmed ones included.
async fn entries_added(redis: &RedisServer, ev: &sluice_reservation::EventId) -> u64 {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: std::collections::HashMap<String, redis::Value> = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(format!("sluice:{{{ev}}}:stream"))
        .query_async(&mut conn)
        .await
        .unwrap();
    match info.get("entries-added") {
        Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap(),
        other => panic!("XINFO STREAM without entries-added: {other:?}"),
    }
}

/// Seeded random sales of events with categories, recorded by an
/// in-process ledger into PostgreSQL; each event is then lost (a
/// `FLUSHALL`: every key, its stream too) and restored from the ledger's record. After the
/// rebuild each category's total, available, held, confirmed and cart
/// limit equal the store's before the loss, every open or paid hold reads
/// the same (status, qty, breakdown), every visitor's cart counts the same
/// (across categories and per category: the next unit past the limit is
/// refused with the same count), and no category sells one unit past
/// what it had left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_category_sales_come_back_exactly_from_the_ledger() {
    use sluice_reservation::{HoldOutcome, Inventory, Item};
    let (Some(redis), Some(pg)) = (RedisServer::start(), PgServer::new()) else {
        return;
    };
    let inv = sluice_reservation::RedisInventory::connect(&sluice_reservation::RedisConfig::new(
        redis.url(),
    ))
    .await
    .unwrap();
    let mut c = sluice_ledger::ConsumerConfig::new(redis.url(), pg.url());
    c.batch = 100;
    c.flush = Duration::from_millis(50);
    c.rescan = Duration::from_millis(200);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let consumer = tokio::spawn(sluice_ledger::run(
        c,
        std::sync::Arc::new(sluice_ledger::Metrics::default()),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut ledger = sluice_ledger::Ledger::connect(&pg.url(), Duration::from_secs(5))
        .await
        .unwrap();
    for seed in 0..16u64 {
        let ev = sluice_reservation::EventId::parse(&format!("prop{seed}")).unwrap();
        let (spec, taken) = random_sale(&inv, &ev, seed).await;
        let before = inv.read(&ev).await.unwrap().unwrap();
        eprintln!(
            "seed {seed}: {} holds ({} open, {} paid), {:?}",
            taken.len(),
            taken.iter().filter(|t| t.end.is_none()).count(),
            taken.iter().filter(|t| t.end == Some("confirmed")).count(),
            before
                .categories
                .iter()
                .map(|c| (c.total, c.available, c.held, c.confirmed, c.cart_limit))
                .collect::<Vec<_>>()
        );
        // Entries the sale wrote, however many the ledger already
        // acknowledged and trimmed (it may start reading mid-sale on a
        // slow machine: the stream's length is then short of them).
        let written = entries_added(&redis, &ev).await;
        assert!(written > 1, "seed {seed}: no sale");
        let stream_len = written.to_string();
        until(
            "the ledger records the sale",
            Duration::from_secs(30),
            async || {
                // The in-process ledger may not have made its tables yet.
                let n = pg
                    .try_psql(&format!(
                        "SELECT count(*) FROM hold_transitions WHERE event = '{ev}'"
                    ))
                    .ok()?;
                (stream_len == n).then_some(json!(n))
            },
        )
        .await;
        assert!(redis.command("FLUSHALL").contains("OK"));
        assert_eq!(inv.read(&ev).await.unwrap(), None);
        let (record, cats) = ledger
            .event_record_with_categories(&ev)
            .await
            .unwrap()
            .expect("a record");
        let out = inv
            .restore_with_categories(&ev, &spec, &record, &cats)
            .await
            .unwrap();
        assert!(
            matches!(out, sluice_reservation::RestoreOutcome::Restored { .. }),
            "seed {seed}: {out:?}"
        );
        let after = inv.read(&ev).await.unwrap().unwrap();
        assert_eq!(after.categories, before.categories, "seed {seed}");
        assert_eq!(
            (after.total, after.available, after.held, after.confirmed),
            (
                before.total,
                before.available,
                before.held,
                before.confirmed
            ),
            "seed {seed}"
        );
        assert!(after.invariant_holds, "seed {seed}");

        // Holds read the same.
        let sorted = |mut v: Vec<Item>| {
            v.sort();
            v
        };
        for t in &taken {
            let view = inv.get_hold(&t.id, &t.visitor).await.unwrap();
            match t.end {
                Some("released") => assert_eq!(
                    view, None,
                    "seed {seed}: records of ended holds are not restored"
                ),
                end => {
                    let view = view.expect("restored");
                    assert_eq!(
                        (
                            format!("{:?}", view.status).to_lowercase(),
                            view.qty,
                            sorted(view.items)
                        ),
                        (
                            end.unwrap_or("held").to_owned(),
                            t.items.iter().map(|i| i.qty).sum::<u32>(),
                            sorted(t.items.clone())
                        ),
                        "seed {seed}"
                    );
                }
            }
        }

        // Carts: per visitor across categories, and per category.
        let mut have: std::collections::BTreeMap<&str, u32> = Default::default();
        let mut have_cat: std::collections::BTreeMap<(&str, String), u32> = Default::default();
        for t in taken.iter().filter(|t| t.end != Some("released")) {
            for i in &t.items {
                *have.entry(&t.visitor).or_default() += i.qty;
                *have_cat
                    .entry((&t.visitor, i.category.to_string()))
                    .or_default() += i.qty;
            }
        }
        let limit = spec.cart_limit;
        let first = &before.categories[0].id;
        for (v, h) in &have {
            let item = Item {
                category: first.clone(),
                qty: limit - h + 1,
            };
            assert_eq!(
                inv.hold_items(&ev, v, &[item], None).await.unwrap(),
                HoldOutcome::CartLimitExceeded { limit, held: *h },
                "seed {seed}: cart of {v}"
            );
        }
        for ((v, c), ch) in &have_cat {
            let cat = before
                .categories
                .iter()
                .find(|k| k.id.as_str() == c)
                .unwrap();
            let Some(climit) = cat.cart_limit else {
                continue;
            };
            let q = climit - ch + 1;
            if have[v] + q > limit {
                continue;
            }
            let item = Item {
                category: cat.id.clone(),
                qty: q,
            };
            assert_eq!(
                inv.hold_items(&ev, v, &[item], None).await.unwrap(),
                HoldOutcome::CategoryCartLimitExceeded {
                    category: c.clone(),
                    limit: climit,
                    held: *ch
                },
                "seed {seed}: cart of {v} in {c}"
            );
        }
        // No category sells past what it has left: a new buyer asking one
        // more than is left (within every cart limit) is refused.
        for cat in &after.categories {
            let most = cat.cart_limit.unwrap_or(limit).min(limit);
            let ask = cat.available + 1;
            if ask > u64::from(most) {
                continue;
            }
            let item = Item {
                category: cat.id.clone(),
                qty: u32::try_from(ask).unwrap(),
            };
            assert_eq!(
                inv.hold_items(&ev, "newcomer", &[item], None)
                    .await
                    .unwrap(),
                HoldOutcome::CategorySoldOut {
                    category: cat.id.to_string(),
                    available: cat.available
                },
                "seed {seed}"
            );
        }
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), consumer)
        .await
        .expect("the ledger stops")
        .unwrap()
        .unwrap();
}

// === Stock feeds ===

/// An admin call with a JSON body.
async fn admin_json(base: &str, method: Method, path: &str, body_json: Value) -> Answer {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    TestClient::new()
        .call(
            method,
            &format!("{base}{path}"),
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
            ],
            body(body_json.to_string()),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_rows_reach_the_ledger_per_category_and_come_back_by_rebuild() {
    let Some(mut site) = Site::start().await else {
        return;
    };
    site.extra = TIERS.to_owned();
    let gw = site.gateway(true, false, true);
    let base = gw.url();
    until("tiers loaded", Duration::from_secs(10), async || {
        let e = tiers_view(&base).await;
        (e["available"] == 18).then_some(e)
    })
    .await;
    let (open, _) = tiers_sale(&site, &base).await;
    let stock = async |row: Value| {
        admin_json(
            &base,
            Method::POST,
            "/_sluice/admin/events/tiers/stock",
            row,
        )
        .await
    };
    // Deltas (one replayed, one refused) and a snapshot, one row at once.
    for row in [
        json!({"delta": 5, "key": "po-1", "category": "floor"}),
        json!({"delta": 5, "key": "po-1", "category": "floor"}),
        json!({"delta": -2, "key": "dmg-1", "category": "balcony"}),
        json!({"total": 20, "version": 3, "category": "floor"}),
    ] {
        let res = stock(row).await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
    let res = stock(json!({"delta": -1, "key": "dmg-2", "category": "vip"})).await;
    assert_eq!(res.status, 409, "{}", res.text());
    // And a row through the lane.
    let res = admin_json(
        &base,
        Method::POST,
        "/_sluice/admin/events/tiers/feed",
        json!({"rows": [{"delta": 3, "key": "po-2", "category": "vip"}]}),
    )
    .await;
    assert_eq!(res.status, 202, "{}", res.text());
    until("the lane drained", Duration::from_secs(10), async || {
        let l = admin(&base, Method::GET, "/_sluice/admin/events/tiers/feed")
            .await
            .json();
        (l["applied"] == 1).then_some(l)
    })
    .await;
    let before = tiers_caught_up(&base).await;
    let expected = json!({
        "floor": [20, 14, 2, 4],
        "vip": [7, 3, 2, 2],
        "balcony": [4, 0, 1, 3],
    });
    assert_eq!(tier_counts(&before), expected, "{before}");
    // The ledger took each category's new total.
    assert_eq!(ledger_tier_counts(&site.pg), expected);
    assert_eq!(
        site.pg
            .psql("SELECT categories FROM events WHERE event = 'tiers'"),
        "floor:20:3,vip:7:0,balcony:4:2"
    );
    assert_eq!(
        site.pg.psql(
            "SELECT count(*) FROM hold_transitions WHERE event = 'tiers' AND kind = 'stock' AND reason IN ('delta', 'snapshot')"
        ),
        "4"
    );

    // Lost and rebuilt: the totals the feeds set come back.
    assert!(site.redis.command("FLUSHALL").contains("OK"));
    until("the loss is seen", Duration::from_secs(10), async || {
        let e = tiers_view(&base).await;
        (e["ready"] == false).then_some(e)
    })
    .await;
    let res = rebuild_tiers(&base).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let after = until("rebuilt", Duration::from_secs(10), async || {
        let e = tiers_view(&base).await;
        (e["ready"] == true).then_some(e)
    })
    .await;
    assert_eq!(tier_counts(&after), expected, "{after}");
    assert_eq!(after["total"], 31, "{after}");
    assert_eq!(after["invariant_holds"], true, "{after}");
    // The open holds still hold their units.
    for h in &open {
        let res = h
            .owner
            .call_admitted(Method::GET, &format!("/_sluice/holds/{}", h.id), None, &[])
            .await;
        assert_eq!(res.json()["status"], "held", "{}", res.text());
    }
}

/// Scheduled waves across a loss: a released wave's total reaches the
/// ledger (its `stock` entry `reason=wave`), so the rebuild restores it;
/// the wave still ahead that the rebuilding gateway saw pending is
/// scheduled again (`waves_rescheduled`); the released one is never
/// applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_keeps_released_waves_and_schedules_again_the_waves_ahead() {
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
    let now = sluice_gateway::app::clock::now_ms();
    let (soon, later) = (now + 2_000, now + 600_000);
    let res = TestClient::new()
        .call(
            Method::PUT,
            &format!("{base}/_sluice/admin/events/gig/waves"),
            &[
                ("authorization", &format!("Bearer {ADMIN_TOKEN}")),
                ("content-type", "application/json"),
            ],
            body(json!({"waves": [{"at": soon, "qty": 5}, {"at": later, "qty": 7}]}).to_string()),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    // The first wave opens; the ledger records the total it reached.
    until(
        "the ledger's total after the wave",
        Duration::from_secs(20),
        async || {
            admin(&base, Method::GET, "/_sluice/admin/events/gig").await;
            let t = site
                .pg
                .try_psql("SELECT total FROM events WHERE event = 'gig'")
                .unwrap_or_default();
            (t.trim() == (TOTAL + 5).to_string()).then_some(json!(t))
        },
    )
    .await;

    assert!(site.redis.command("FLUSHALL").contains("OK"));
    until("the loss is seen", Duration::from_secs(10), async || {
        let e = admin(&base, Method::GET, "/_sluice/admin/events/gig")
            .await
            .json();
        (e["ready"] == false).then_some(e)
    })
    .await;
    let res = admin(&base, Method::POST, "/_sluice/admin/events/gig/rebuild").await;
    assert_eq!(res.status, 200, "{}", res.text());
    let r = res.json();
    assert_eq!(r["total"], TOTAL + 5, "{r}");
    assert_eq!(r["waves_rescheduled"], 1, "{r}");
    // The first wave, if this gateway's view (refreshed every second)
    // still had it pending: due, so never scheduled again (it is in the
    // ledger's total), only reported.
    let skipped = r["waves_skipped"].as_array().unwrap();
    assert!(
        skipped.is_empty() || (skipped.len() == 1 && skipped[0]["at_ms"] == soon),
        "{r}"
    );
    let e = admin(&base, Method::GET, "/_sluice/admin/events/gig")
        .await
        .json();
    assert_eq!(
        (
            e["total"].clone(),
            e["available"].clone(),
            e["pending_waves"].clone(),
            e["next_wave_at_ms"].clone()
        ),
        (json!(TOTAL + 5), json!(TOTAL + 5), json!(1), json!(later)),
        "{e}"
    );
    assert_eq!(e["invariant_holds"], true, "{e}");
}

// === A sharded event ===

/// `hot` in room `hall`: 40 units over 4 shards, at most 4 per visitor.
const HOT: &str = "[[events]]\nid = \"hot\"\nroom = \"hall\"\ntotal = 40\ncart_limit = 4\nhold_ttl = \"300s\"\nshards = 4\n";

async fn hot_view(base: &str) -> Value {
    admin(base, Method::GET, "/_sluice/admin/events/hot")
        .await
        .json()
}

async fn hot_hold(v: &Visitor, qty: u64) -> Answer {
    v.call_admitted(
        Method::POST,
        "/_sluice/events/hot/holds",
        Some(json!({"qty": qty})),
        &[],
    )
    .await
}

/// Waits until the ledger's counters of every shard (total, held, sold)
/// are the store's.
async fn hot_ledger_caught_up(site: &Site, base: &str) -> Value {
    until("the ledger has every shard", Duration::from_secs(30), async || {
        let v = hot_view(base).await;
        let shards = v["shard_states"].as_array()?.clone();
        for s in &shards {
            let id = s["id"].as_str()?;
            let row = site
                .pg
                .try_psql(&format!(
                    "SELECT total || ',' || held_units || ',' || confirmed_units FROM events WHERE event = '{id}'"
                ))
                .ok()?;
            let want = format!("{},{},{}", s["total"], s["held"], s["confirmed"]);
            if row.trim() != want {
                return None;
            }
        }
        (shards.len() == 4 && v["in_transit"] == 0).then_some(v)
    })
    .await
}

/// The counters a rebuild must bring back, and the per-shard totals.
fn hot_counts(v: &Value) -> Value {
    json!({
        "total": v["total"], "available": v["available"], "held": v["held"],
        "confirmed": v["confirmed"], "shards": v["shards"],
        "per_shard": v["shard_states"].as_array().unwrap().iter()
            .map(|s| json!([s["id"], s["total"], s["held"], s["confirmed"]]))
            .collect::<Vec<_>>(),
    })
}

/// A sharded event comes back from the ledger shard by shard: one shard's
/// keys lost behind a running gateway (only that shard rebuilt, the
/// others left live), then the whole store flushed with the gateway
/// SIGKILLed and restarted. Each time the counters per shard, the open
/// and paid holds, the carts and the layout come back, and in the end
/// exactly the stock is sold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_event_is_rebuilt_shard_by_shard() {
    let Some(mut site) = Site::start().await else {
        return;
    };
    site.extra = HOT.to_owned();
    let mut gw = site.gateway(true, true, true);
    let base = gw.url();
    until("stock loaded", Duration::from_secs(15), async || {
        let v = hot_view(&base).await;
        (v["ready"] == true && v["shards"] == 4).then_some(v)
    })
    .await;
    // The sale: 12 buyers hold 1 to 4 units (their homes uneven, so
    // shards pull from each other); every other one pays.
    let mut open = Vec::new();
    let mut paid = Vec::new();
    for i in 0..12u64 {
        let v = site.buyer(&base);
        let qty = 1 + i % CART;
        let res = hot_hold(&v, qty).await;
        assert_eq!(res.status, 201, "{}", res.text());
        let id = res.json()["hold_id"].as_str().unwrap().to_owned();
        if i % 2 == 0 {
            assert_eq!(pay(&base, &id).await.json()["status"], "confirmed");
            paid.push((v, id, qty));
        } else {
            open.push((v, id, qty));
        }
    }
    let before = hot_counts(&hot_ledger_caught_up(&site, &base).await);

    // One shard's keys go behind the running gateway: it is rebuilt
    // alone, automatically.
    let lost = "hot~2";
    let reply = site.redis.command(&format!(
        "EVAL \"local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do n = n + redis.call('DEL', k) end return n\" 0 sluice:{{{lost}}}:*"
    ));
    assert!(reply.starts_with(':') && reply.trim() != ":0", "{reply}");
    // Rebuilt when the gateway notices the loss (its view of the event
    // may be from before it for a moment): the log says so, then the view
    // is whole again.
    until("one shard rebuilt", Duration::from_secs(20), async || {
        gw.log_lines()
            .iter()
            .any(|l| l.contains("lost shards rebuilt") && l.contains("\"shards\":1"))
            .then_some(Value::Null)
    })
    .await;
    assert!(
        !gw.log_lines()
            .iter()
            .any(|l| l.contains("lost shards rebuilt") && !l.contains("\"shards\":1")),
        "only the lost shard rebuilt"
    );
    let after = until(
        "the shard is rebuilt",
        Duration::from_secs(20),
        async || {
            let v = hot_view(&base).await;
            (v["ready"] == true && v["invariant_holds"] == true).then_some(v)
        },
    )
    .await;
    assert_eq!(hot_counts(&after), before, "{after}");

    // Everything flushed, the gateway SIGKILLed and restarted: rebuilt.
    hot_ledger_caught_up(&site, &base).await;
    gw.signal("KILL");
    gw.wait(Duration::from_secs(5));
    assert!(site.redis.command("FLUSHALL").contains("OK"));
    let gw = site.gateway(true, true, true);
    let base = gw.url();
    let after = until(
        "the event is rebuilt",
        Duration::from_secs(30),
        async || {
            let v = hot_view(&base).await;
            (v["ready"] == true && v["shards"] == 4 && v["invariant_holds"] == true).then_some(v)
        },
    )
    .await;
    assert_eq!(hot_counts(&after), before, "{after}");
    for (v, id, qty) in &open {
        let v = site.buyer_as(&base, v);
        let h = v
            .call_admitted(Method::GET, &format!("/_sluice/holds/{id}"), None, &[])
            .await
            .json();
        assert_eq!(
            (h["status"].as_str(), h["qty"].as_u64()),
            (Some("held"), Some(*qty)),
            "{h}"
        );
        if *qty == CART {
            let res = hot_hold(&v, 1).await;
            assert_eq!(res.json()["code"], "cart_limit_exceeded", "{}", res.text());
        }
    }
    for (v, id, _) in &paid {
        let v = site.buyer_as(&base, v);
        let h = v
            .call_admitted(Method::GET, &format!("/_sluice/holds/{id}"), None, &[])
            .await
            .json();
        assert_eq!(h["status"], "confirmed", "{h}");
    }
    // The open holds are paid, the rest sold out: exactly the stock.
    for (_, id, _) in &open {
        assert_eq!(pay(&base, id).await.json()["status"], "confirmed");
    }
    let mut more = 0;
    for _ in 0..40 {
        let v = site.buyer(&base);
        let res = hot_hold(&v, 1).await;
        if res.status == 201 {
            more += 1;
        } else {
            assert_eq!(res.json()["code"], "sold_out", "{}", res.text());
            break;
        }
    }
    let sold: u64 = open.iter().chain(&paid).map(|(_, _, q)| q).sum();
    assert_eq!(sold + more, 40, "units sold in all");
    let end = hot_view(&base).await;
    assert_eq!(
        (end["available"].as_u64(), end["in_transit"].as_u64()),
        (Some(0), Some(0)),
        "{end}"
    );
}
