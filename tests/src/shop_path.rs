//! The path a visitor's browser takes through the waiting page and the
//! demo shop, written once for every engine: the tests in
//! `tests/browser.rs` (Chromium) and `tests/firefox.rs` (Firefox) drive
//! their browser through [`Page`], so both engines are held to the same
//! steps.
//!
//! The path: the demo shop behind a gateway ([`shop_behind_gateway`]) with
//! a line in front ([`line_in_front`]); the waiting page's position falls
//! until the shop's page replaces it ([`until_admitted`]); then a hold of 2
//! tickets, the demo provider's payment and the confirmation, with the
//! admin API's stock agreeing ([`hold_pay_confirm`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sluice_gateway::config::{EventConfig, RoomConfig};
use sluice_gateway::tools::demo_origin::{self, DemoOptions, DemoShop};

use crate::browser::wait_for;
use crate::visitor::Visitor;
use crate::{TestGateway, admin_get};

/// The demo shop's webhook secret in these tests.
pub const WEBHOOK_SECRET: &str = "whsec-browser-0123456789";

/// What the path needs of a browser tab.
#[allow(async_fn_in_trait)] // awaited in place by the tests, never spawned
pub trait Page {
    /// The text of the element matching `css`, or "" when there is none.
    async fn text(&self, css: &str) -> String;
    /// Whether an element matches `css`.
    async fn exists(&self, css: &str) -> bool;
    /// Whether the element matching `css` is shown.
    async fn visible(&self, css: &str) -> bool;
    /// Clicks the element matching `css`, as a person would.
    async fn click(&self, css: &str);
    /// Chooses `value` in the `<select>` matching `css`.
    async fn select(&self, css: &str, value: &str);
    /// The current URL, or "" when the browser cannot say.
    async fn url(&self) -> String;
    /// Saves a screenshot named `NN-name.png`; returns its path.
    async fn shot(&mut self, name: &str) -> PathBuf;
    /// The attribute `name` of the element matching `css`, or "" when
    /// there is none.
    async fn attr(&self, css: &str, name: &str) -> String;
    /// Opens `url` in this tab.
    async fn goto(&self, url: &str);
    /// Forgets every cookie (a new visitor in the same browser).
    async fn clear_cookies(&self);
}

/// The demo shop (event `demo`, 100 tickets, 4 a cart, holds of 5 min)
/// behind a gateway whose room has one credit, admits `rate_per_sec`
/// visitors a second and asks an easy proof of work (k = 4, b = 8); on
/// Redis at `redis` when given.
pub async fn shop_behind_gateway(
    rate_per_sec: f64,
    redis: Option<String>,
) -> (TestGateway, DemoShop) {
    let shop = demo_origin::spawn(DemoOptions {
        webhook_secret: Some(WEBHOOK_SECRET.into()),
        gateway: None,
    })
    .await
    .expect("demo shop");
    let mut b = TestGateway::builder().origin(shop.url()).config(|c| {
        c.webhook_secret = Some(WEBHOOK_SECRET.into());
        c.rooms = vec![RoomConfig {
            rate_per_sec,
            burst: 1.0,
            puzzles: 4,
            difficulty_floor_bits: 8,
            difficulty_ceiling_bits: 8,
            join_limit_per_prefix_per_min: 0,
            attack_min_solve: Duration::ZERO,
            ..RoomConfig::default()
        }];
        c.events = vec![EventConfig {
            total: 100,
            cart_limit: 4,
            hold_ttl: Duration::from_secs(300),
            ..EventConfig::default()
        }];
    });
    if let Some(r) = redis {
        b = b.redis(r);
    }
    let gw = b.spawn().await;
    shop.set_gateway(gw.url());
    (gw, shop)
}

/// `n` JSON visitors join the room at `base`: the first takes the room's
/// one credit, the others wait in front of whoever comes next.
pub async fn line_in_front(base: &str, n: usize) {
    for _ in 0..n {
        let mut v = Visitor::new(base, "default");
        let res = v.join("/").await;
        assert!(res.status.is_success(), "{}", res.text());
    }
}

/// Watches the waiting page, shown at `first`, until the shop's page
/// replaced it (within `limit`); answers the URL it landed on and the
/// positions seen, after checking they fell and never rose.
pub async fn until_admitted(page: &impl Page, first: u64, limit: Duration) -> (String, Vec<u64>) {
    let mut seen = vec![first];
    let deadline = Instant::now() + limit;
    let landed = loop {
        // The waiting page is served at the deep URL itself: admitted is
        // when the shop's page replaced it.
        if page.exists("#shop").await {
            break page.url().await;
        }
        if let Ok(p) = page.text("#position").await.trim().parse::<u64>()
            && seen.last() != Some(&p)
        {
            seen.push(p);
        }
        assert!(
            Instant::now() < deadline,
            "not admitted within {limit:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        seen.windows(2).all(|w| w[1] <= w[0]) && seen.len() >= 2,
        "the position fell: {seen:?}"
    );
    (landed, seen)
}

/// In the shop at the gateway `base`: live availability, a hold of 2 with
/// its countdown, the demo provider's payment page, the confirmation; then
/// the admin API's stock: 2 confirmed, none held, nothing lost. Answers the
/// three screenshots (held, payment, confirmation).
pub async fn hold_pay_confirm(page: &mut impl Page, base: &str) -> Vec<PathBuf> {
    wait_for(Duration::from_secs(10), "availability", || async {
        (page.text("#available").await == "100").then_some(())
    })
    .await;
    page.select("#qty", "2").await;
    page.click("#hold-btn").await;
    wait_for(
        Duration::from_secs(10),
        "the hold and its countdown",
        || async {
            let cd = page.text("#countdown").await;
            (page.visible("#hold").await
                && page.text("#hold-qty").await == "2"
                && (cd.starts_with('4') || cd.starts_with('5')))
            .then_some(())
        },
    )
    .await;
    wait_for(
        Duration::from_secs(10),
        "availability after the hold",
        || async { (page.text("#available").await == "98").then_some(()) },
    )
    .await;
    let mut shots = vec![page.shot("shop-held").await];
    let held = admin_get(base, "/_sluice/admin/events/demo").await;
    assert_eq!(held["held"], 2, "{held}");

    // Pay through the demo provider: the signed webhook confirms.
    page.click("#pay").await;
    wait_for(Duration::from_secs(10), "the payment page", || async {
        page.url().await.contains("/demo-pay/").then_some(())
    })
    .await;
    shots.push(page.shot("payment").await);
    page.click("#pay-confirm").await;
    wait_for(Duration::from_secs(10), "the confirmation", || async {
        (page.text("#order-status").await == "confirmed").then_some(())
    })
    .await;
    assert_eq!(page.text("#confirmed-qty").await, "2");
    shots.push(page.shot("confirmation").await);

    // Stock agrees: 2 confirmed, nothing held, nothing lost.
    let e = admin_get(base, "/_sluice/admin/events/demo").await;
    let n = |k: &str| e[k].as_u64().unwrap_or_else(|| panic!("no {k}: {e}"));
    assert_eq!(n("confirmed"), 2, "{e}");
    assert_eq!(n("held"), 0, "{e}");
    assert_eq!(
        n("available") + n("held") + n("confirmed"),
        n("total"),
        "{e}"
    );
    assert_eq!(e["invariant_holds"], true, "{e}");
    shots
}
