//! The built-in demo shop: the origin that `sluice serve` runs behind the
//! gateway when no `--origin` is given, on a free loopback port, so a
//! newcomer sees the whole flow with one command: the waiting room, then a
//! shop that holds tickets, a demo payment provider and a confirmation.
//!
//! It is a separate HTTP server that knows the gateway only through its
//! public API (API.md), exactly as a real origin would:
//! - the browser talks to the reservation endpoints itself
//!   (`/_sluice/events/…`, `/_sluice/holds/…`), same origin, with the
//!   admission cookie the gateway set;
//! - the shop's server side reads the admission token the gateway forwards
//!   (`Sluice-Admission`) and uses it as a bearer token to look a hold up;
//! - the demo payment provider calls the payment webhook server to server
//!   with a `Sluice-Signature` made from the shared webhook secret.
//!
//! Routes:
//! - `GET /` — the front page, linking to the event; with a crowd to send
//!   ([`DemoShop::set_crowd`], as `sluice serve` gives its embedded shop),
//!   the control that sends it and a live panel of the line it makes;
//! - `POST /demo/crowd` — starts the crowd (header `X-Demo-Crowd: start`,
//!   which a cross-site form cannot send), or finds it already on its way;
//!   either way the presser's own admission is given back
//!   (`Sluice-Command: revoke`), so the next page they open puts them in
//!   line with the crowd;
//! - `GET /demo/crowd/status` — the crowd's progress as JSON (the embedded
//!   demo's room lets this path past the queue, [`room`], so the page can
//!   show it while its reader waits in line);
//! - `GET /shop/{event}` — the event page: live availability, a quantity
//!   (per category, for an event with categories: one hold takes them all
//!   or none), a hold with a countdown to its expiry, release, pay (its script and
//!   style are files: the pages carry a strict Content-Security-Policy);
//! - `GET /demo-pay/{hold}` and `POST /demo-pay/{hold}` — the demo payment
//!   provider: a checkout page, then the signed webhook, then a redirect to
//!   the order page;
//! - `GET /demo-pay/events` — the demo provider's list of the payment
//!   events it sent (as real providers list theirs), for `sluice ledger
//!   payments --provider`;
//! - `GET /shop/{event}/orders/{hold}` — the confirmation;
//! - `GET /shop-static/{file}` — the shop's script and style;
//! - `ANY /echo/...` — answers with a JSON description of what it received
//!   (method, path, query, headers, body length and SHA-256), which makes
//!   the proxy's behaviour visible from a browser or `curl`.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

use crate::config::RoomConfig;
use crate::reserve::sign_webhook;
use crate::visitor::template::html_escape;

/// The policy of the shop's pages: its own files only, no inline code.
const CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const SHOP_JS: &str = include_str!("../../../static/demo/shop.js");
const SHOP_CSS: &str = include_str!("../../../static/demo/shop.css");
const FRONT_JS: &str = include_str!("../../../static/demo/front.js");

/// The crowd's progress, never queued in the embedded demo's room.
pub const CROWD_STATUS_PATH: &str = "/demo/crowd/status";

/// The room in front of the embedded shop (`sluice serve` with no config
/// file and no `--origin`): the default room, tuned so the shop's crowd
/// (a few hundred simulated visitors, all from this machine) forms a line
/// a newcomer can watch form, move and drain within a minute:
/// - 6 admissions/s (burst 6) instead of 50, so the crowd outruns it;
/// - no limit on joins per client network (the crowd and the newcomer
///   share one, loopback; 60 a minute would turn most of it away);
/// - a light proof of work (16 puzzles of 8 to 10 bits, no minimum solve
///   time under attack): the crowd solves on this machine's cores, beside
///   the gateway it measures;
/// - the crowd's progress ([`CROWD_STATUS_PATH`]) past the queue.
///
/// Never settings for a sale: with a config file or an `--origin` the
/// default room is [`RoomConfig::default`].
pub fn room() -> RoomConfig {
    let base = RoomConfig::default();
    let mut bypass_paths = base.bypass_paths.clone();
    bypass_paths.push(CROWD_STATUS_PATH.to_owned());
    RoomConfig {
        rate_per_sec: 6.0,
        burst: 6.0,
        join_limit_per_prefix_per_min: 0,
        difficulty_floor_bits: 8,
        difficulty_ceiling_bits: 10,
        attack_min_solve: std::time::Duration::ZERO,
        bypass_paths,
        ..base
    }
}

/// A crowd of simulated visitors sent through the gateway in front of the
/// shop: `sluice serve` gives its embedded shop one
/// ([`DemoShop::set_crowd`]) made of `sluice swarm`'s visitors, run
/// in-process against its own listener. The shop only starts it and reads
/// its progress; how many come, how fast, and when they stop is the
/// crowd's to bound.
pub trait Crowd: Send + Sync {
    /// Starts a crowd, unless one is still on its way.
    fn start(&self) -> CrowdStart;
    /// The crowd on its way, or the last one (`running` false; all zeros
    /// before the first).
    fn progress(&self) -> CrowdProgress;
}

/// What pressing the control did.
#[derive(Clone, Debug)]
pub enum CrowdStart {
    /// A new crowd is on its way.
    Started(CrowdProgress),
    /// One was already on its way: nothing more was started.
    AlreadyRunning(CrowdProgress),
}

/// A crowd's progress, as `GET /demo/crowd/status` answers it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct CrowdProgress {
    /// The room the crowd queues in.
    pub room: String,
    /// Still on its way (false: done, stopped, or none yet).
    pub running: bool,
    /// Visitors it brings in all.
    pub visitors: u64,
    /// Visitors that have arrived so far.
    pub arrived: u64,
    /// Visitors that joined the line (or were let in at once).
    pub joined: u64,
    /// Visitors let in.
    pub admitted: u64,
    /// Visitors that gave up (an answer they could not use).
    pub failed: u64,
    /// Seconds since it started.
    pub elapsed_secs: u64,
    /// Seconds until it stops by itself at the latest.
    pub stops_within_secs: u64,
}

/// What the demo shop needs to know of the gateway in front of it.
#[derive(Clone, Debug, Default)]
pub struct DemoOptions {
    /// The payment webhook's HMAC secret (the gateway's
    /// `--webhook-secret`). None: the demo provider cannot confirm a
    /// payment and says so.
    pub webhook_secret: Option<String>,
    /// The gateway's base URL for server-to-server calls
    /// (`http://127.0.0.1:8080`); may also be given later with
    /// [`DemoShop::set_gateway`], once the gateway listens.
    pub gateway: Option<String>,
}

/// A running demo shop.
#[derive(Clone)]
pub struct DemoShop {
    /// Its address.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl DemoShop {
    /// `http://addr`, the `--origin` of the gateway in front of it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Tells the shop where the gateway listens (once; later calls are
    /// ignored).
    pub fn set_gateway(&self, url: impl Into<String>) {
        let _ = self
            .shared
            .gateway
            .set(url.into().trim_end_matches('/').to_owned());
    }

    /// Gives the shop a crowd to send (once; later calls are ignored):
    /// its front page then shows the control. Only `sluice serve`'s own
    /// embedded shop gets one, so an operator's `--origin` never does.
    pub fn set_crowd(&self, crowd: Arc<dyn Crowd>) {
        let _ = self.shared.crowd.set(crowd);
    }

    fn crowd(&self) -> Option<&Arc<dyn Crowd>> {
        self.shared.crowd.get()
    }
}

struct Shared {
    webhook_secret: Option<String>,
    gateway: OnceLock<String>,
    crowd: OnceLock<Arc<dyn Crowd>>,
    client: Client<HttpConnector, Full<Bytes>>,
    /// Every payment event sent, in order (`GET /demo-pay/events`); a demo
    /// keeps them in memory, bounded.
    sent: parking_lot::Mutex<Vec<Value>>,
}

/// Most payment events the demo provider remembers.
const SENT_MAX: usize = 100_000;

/// Starts the demo shop on a free loopback port.
pub async fn spawn(opts: DemoOptions) -> anyhow::Result<DemoShop> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared {
        webhook_secret: opts.webhook_secret.filter(|s| !s.is_empty()),
        gateway: OnceLock::new(),
        crowd: OnceLock::new(),
        client: Client::builder(TokioExecutor::new()).build_http(),
        sent: parking_lot::Mutex::new(Vec::new()),
    });
    let shop = DemoShop { addr, shared };
    if let Some(g) = opts.gateway {
        shop.set_gateway(g);
    }
    let app = router(shop.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "demo origin stopped");
        }
    });
    Ok(shop)
}

/// The demo shop's routes.
pub fn router(shop: DemoShop) -> Router {
    Router::new()
        .route("/", get(front_page))
        .route("/demo/crowd", post(start_crowd))
        .route(CROWD_STATUS_PATH, get(crowd_status))
        .route("/shop/{event}", get(event_page))
        .route("/shop/{event}/orders/{hold}", get(order_page))
        .route("/demo-pay/events", get(payment_events))
        .route("/demo-pay/{hold}", get(pay_page).post(pay))
        .route("/shop-static/{file}", get(static_file))
        .route("/echo", any(echo))
        .route("/echo/{*rest}", any(echo))
        .with_state(shop)
}

// === pages ===

/// A page of the shop with its security headers.
fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>{} · sluice demo shop</title><link rel=\"stylesheet\" href=\"/shop-static/shop.css\"></head>\
<body><header class=\"top\"><a class=\"brand\" href=\"/\"><span class=\"mark\" aria-hidden=\"true\"></span>sluice demo shop</a></header>\
<main>{body}</main><footer>A demo origin behind the sluice gateway. No real money moves.</footer></body></html>\n",
        html_escape(title)
    );
    let mut res = (status, Html(html)).into_response();
    secure(res.headers_mut());
    res
}

fn secure(h: &mut HeaderMap) {
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
}

async fn front_page(State(shop): State<DemoShop>) -> Response {
    let control = shop.crowd().map(|c| crowd_control(&c.progress()));
    page(
        StatusCode::OK,
        "Welcome",
        &format!(
            r#"<h1>Welcome to the demo shop</h1>
<p class="lead">You are past the waiting room: this page is served by the demo origin behind the sluice gateway.</p>
<p><a class="button" href="/shop/demo">See the tickets of event “demo”</a></p>{}
<p class="small">See what the origin receives from the gateway: <a href="/echo/hello?from=browser">/echo/hello?from=browser</a>.</p>"#,
            control.unwrap_or_default()
        ),
    )
}

/// The crowd's control and its live panel (filled by `front.js`).
fn crowd_control(p: &CrowdProgress) -> String {
    let n = p.visitors;
    let room = html_escape(&p.room);
    format!(
        r#"
<section class="card" id="crowd" data-room="{room}" data-visitors="{n}" aria-labelledby="crowd-h">
  <h2 id="crowd-h">See the waiting room</h2>
  <p>Alone, you pass straight through: nobody is in line. Send a crowd of {n} simulated fans through this gateway (the visitors of <span class="nowrap">sluice swarm</span>, from this machine: each solves the proof of work, joins and waits its turn) and a line forms, moves and drains.</p>
  <p><button type="button" id="crowd-start" class="button">Send {n} fans</button></p>
  <div id="crowd-live" hidden>
    <dl class="figures">
      <div><dt>Fans joined</dt><dd id="crowd-joined">0</dd></div>
      <div><dt>Let in</dt><dd id="crowd-admitted">0</dd></div>
      <div><dt>In line now</dt><dd id="crowd-queue">0</dd></div>
      <div><dt>Admitting</dt><dd id="crowd-rate">–</dd></div>
    </dl>
    <p id="crowd-join-box" hidden><a id="crowd-join" class="button" href="/shop/demo" target="_blank" rel="noopener">Join the line (opens a new tab)</a></p>
  </div>
  <p id="crowd-message" role="status" aria-live="polite"></p>
  <p class="small">Watch the line on the dashboard too: <a href="/_sluice/admin/" target="_blank" rel="noopener">/_sluice/admin/</a> (read-only unless the gateway has an admin token).</p>
</section>
<script src="/shop-static/front.js"></script>"#
    )
}

/// `POST /demo/crowd`: starts the crowd (or finds it on its way) and gives
/// the presser's admission back, so they can queue with it.
async fn start_crowd(State(shop): State<DemoShop>, headers: HeaderMap) -> Response {
    let Some(crowd) = shop.crowd() else {
        return crowd_answer(
            StatusCode::NOT_FOUND,
            json!({"error": "this shop has no crowd to send: only `sluice serve`'s embedded shop has one"}),
        );
    };
    // A custom header: a form of another site cannot send it, and a
    // script of another site would need a CORS preflight this shop never
    // grants.
    if headers.get("x-demo-crowd").and_then(|v| v.to_str().ok()) != Some("start") {
        return crowd_answer(
            StatusCode::FORBIDDEN,
            json!({"error": "press the control on the shop's front page (header X-Demo-Crowd: start)"}),
        );
    }
    let (status, started, progress) = match crowd.start() {
        CrowdStart::Started(p) => (StatusCode::ACCEPTED, true, p),
        CrowdStart::AlreadyRunning(p) => (StatusCode::OK, false, p),
    };
    let mut res = crowd_answer(status, json!({"started": started, "crowd": progress}));
    // The presser joins the crowd: the gateway ends their session and
    // clears its cookies, so the next guarded page they open is the line.
    res.headers_mut()
        .insert("sluice-command", HeaderValue::from_static("revoke"));
    res
}

/// `GET /demo/crowd/status`: `{"crowd": {…}}` (`null` without a crowd).
async fn crowd_status(State(shop): State<DemoShop>) -> Response {
    let progress = shop.crowd().map(|c| c.progress());
    crowd_answer(StatusCode::OK, json!({ "crowd": progress }))
}

fn crowd_answer(status: StatusCode, body: Value) -> Response {
    let mut res = (status, axum::Json(body)).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

async fn event_page(Path(event): Path<String>) -> Response {
    let ev = html_escape(&event);
    let body = format!(
        r##"<h1>Tickets: {ev}</h1>
<div id="shop" data-event="{ev}">
<p class="lead">Choose how many tickets you want and hold them while you pay.</p>
<section class="card" aria-labelledby="stock-h">
  <h2 id="stock-h">Availability</h2>
  <p class="stock"><span id="available" class="big">…</span> <span id="of-total"></span></p>
  <div class="meter" aria-hidden="true"><div id="meter-fill"></div></div>
  <p id="next-wave" hidden></p>
</section>
<section class="card" id="buy" aria-labelledby="buy-h">
  <h2 id="buy-h">Your tickets</h2>
  <form id="hold-form">
    <span id="single"><label for="qty">Quantity</label>
    <select id="qty" name="qty"><option value="1">1</option></select></span>
    <table id="tiers" hidden><thead><tr><th scope="col">Category</th><th scope="col">Left</th><th scope="col">Tickets</th></tr></thead><tbody></tbody></table>
    <button type="submit" id="hold-btn" class="button">Hold tickets</button>
  </form>
</section>
<section class="card" id="hold" hidden aria-labelledby="hold-h">
  <h2 id="hold-h">Held for you</h2>
  <p><strong id="hold-qty"></strong> ticket(s) are yours for <strong id="countdown" class="countdown">–</strong>.</p>
  <p id="hold-items" hidden></p>
  <div class="actions">
    <a id="pay" class="button" href="#">Pay now</a>
    <button type="button" id="release" class="button secondary">Release</button>
  </div>
</section>
<p id="message" role="status" aria-live="polite"></p>
</div>
<noscript><p class="notice">The shop needs JavaScript to show live availability and hold tickets.</p></noscript>
<script src="/shop-static/shop.js"></script>"##
    );
    page(StatusCode::OK, &format!("Tickets: {event}"), &body)
}

async fn static_file(Path(file): Path<String>) -> Response {
    let (ctype, body) = match file.as_str() {
        "shop.js" => ("text/javascript; charset=utf-8", SHOP_JS),
        "shop.css" => ("text/css; charset=utf-8", SHOP_CSS),
        "front.js" => ("text/javascript; charset=utf-8", FRONT_JS),
        _ => return (StatusCode::NOT_FOUND, "no such file").into_response(),
    };
    let mut res = Body::from(body).into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    res
}

// === the demo payment provider ===

/// The hold as the visitor's own token sees it (`GET /_sluice/holds/{id}`
/// with the forwarded admission token as bearer), or the page to show.
async fn hold_of_visitor(
    shop: &DemoShop,
    headers: &HeaderMap,
    hold: &str,
) -> Result<Value, Response> {
    let Some(token) = headers
        .get("sluice-admission")
        .and_then(|v| v.to_str().ok())
    else {
        return Err(page(
            StatusCode::UNAUTHORIZED,
            "Not admitted",
            "<h1>Not admitted</h1><p>This page is only reachable through the gateway, after the waiting room.</p>",
        ));
    };
    let path = format!("/_sluice/holds/{}", encode_segment(hold));
    match shop.call(Method::GET, &path, Some(token), None).await {
        Ok((StatusCode::OK, v)) => Ok(v),
        Ok((StatusCode::NOT_FOUND, _)) => Err(page(
            StatusCode::NOT_FOUND,
            "No such hold",
            "<h1>No such hold</h1><p>This hold does not exist or is not yours. <a href=\"/shop/demo\">Back to the shop</a>.</p>",
        )),
        Ok((status, v)) => Err(gateway_trouble(&format!("{status} {v}"))),
        Err(e) => Err(gateway_trouble(&e)),
    }
}

fn gateway_trouble(cause: &str) -> Response {
    tracing::warn!(cause, "demo shop: gateway call failed");
    page(
        StatusCode::BAD_GATEWAY,
        "Try again",
        "<h1>Something went wrong</h1><p>The shop could not reach the ticket service. Please try again in a moment.</p>",
    )
}

async fn pay_page(
    State(shop): State<DemoShop>,
    Path(hold): Path<String>,
    headers: HeaderMap,
) -> Response {
    let h = match hold_of_visitor(&shop, &headers, &hold).await {
        Ok(h) => h,
        Err(res) => return res,
    };
    let event = h["event"].as_str().unwrap_or("demo");
    if h["status"] != "held" {
        return Redirect::to(&order_path(event, &hold)).into_response();
    }
    let qty = h["qty"].as_u64().unwrap_or(0);
    let body = format!(
        r#"<div class="provider">
<p class="provider-brand">DemoPay <span>test mode</span></p>
<h1>Pay for {qty} ticket(s)</h1>
<p>Event <strong>{ev}</strong>, order <code>{hold_e}</code>.</p>{items}
<p class="small">This pretend provider confirms the payment to the gateway with a signed webhook, as a real one would.</p>
<form method="post" action="/demo-pay/{hold_e}" class="actions">
  <button type="submit" name="outcome" value="succeeded" id="pay-confirm" class="button">Pay {qty} × €42.00</button>
  <button type="submit" name="outcome" value="failed" id="pay-fail" class="button secondary">Decline the payment</button>
</form>
</div>"#,
        ev = html_escape(event),
        hold_e = html_escape(&hold),
        items = items_html(&h),
    );
    page(StatusCode::OK, "DemoPay checkout", &body)
}

#[derive(serde::Deserialize)]
struct PayForm {
    outcome: String,
}

async fn pay(
    State(shop): State<DemoShop>,
    Path(hold): Path<String>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<PayForm>,
) -> Response {
    let h = match hold_of_visitor(&shop, &headers, &hold).await {
        Ok(h) => h,
        Err(res) => return res,
    };
    let event = h["event"].as_str().unwrap_or("demo").to_owned();
    let outcome = if form.outcome == "succeeded" {
        "succeeded"
    } else {
        "failed"
    };
    let Some(secret) = &shop.shared.webhook_secret else {
        return page(
            StatusCode::SERVICE_UNAVAILABLE,
            "Payments off",
            "<h1>Payments are off</h1><p>The gateway has no webhook secret, so the demo provider cannot confirm a payment. Start it with <code>--webhook-secret</code>.</p>",
        );
    };
    // One payment event per hold and outcome: a double submit is the same
    // event again, which the webhook answers the same way.
    let event_body = json!({
        "payment_event_id": format!("demopay_{hold}_{outcome}"),
        "hold_id": hold,
        "outcome": outcome,
    });
    {
        // Listed once the provider decided, whatever the webhook's fate
        // (a provider's record does not depend on the merchant hearing it).
        let mut sent = shop.shared.sent.lock();
        if !sent.contains(&event_body) && sent.len() < SENT_MAX {
            sent.push(event_body.clone());
        }
    }
    let body = event_body.to_string();
    let signature = sign_webhook(
        secret.as_bytes(),
        crate::app::clock::now_s(),
        body.as_bytes(),
    );
    match shop
        .signed_post("/_sluice/webhooks/payment", &signature, body)
        .await
    {
        Ok((StatusCode::OK, _)) => Redirect::to(&order_path(&event, &hold)).into_response(),
        Ok((StatusCode::CONFLICT, v)) => page(
            StatusCode::CONFLICT,
            "Hold lapsed",
            &format!(
                "<h1>Your hold lapsed</h1><p>The tickets went back on sale before the payment arrived ({}). You were not charged.</p><p><a class=\"button\" href=\"/shop/{}\">Back to the shop</a></p>",
                html_escape(v["code"].as_str().unwrap_or("conflict")),
                html_escape(&event)
            ),
        ),
        Ok((status, v)) => gateway_trouble(&format!("webhook {status} {v}")),
        Err(e) => gateway_trouble(&e),
    }
}

/// The payment events the demo provider sent, oldest first:
/// `{"data": [{"payment_event_id", "hold_id", "outcome"}, …]}`.
async fn payment_events(State(shop): State<DemoShop>) -> Response {
    let data = shop.shared.sent.lock().clone();
    let mut res = axum::Json(json!({ "data": data })).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

fn order_path(event: &str, hold: &str) -> String {
    format!(
        "/shop/{}/orders/{}",
        encode_segment(event),
        encode_segment(hold)
    )
}

/// A hold's units per category as a paragraph (`id="order-items"`), or
/// nothing for a hold of an event without categories.
fn items_html(h: &serde_json::Value) -> String {
    let parts: Vec<String> = h["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| {
            Some(format!(
                "{} × {}",
                html_escape(i["category"].as_str()?),
                i["qty"].as_u64()?
            ))
        })
        .collect();
    if parts.is_empty() {
        return String::new();
    }
    format!(
        r#"
<p id="order-items">{}</p>"#,
        parts.join(", ")
    )
}

async fn order_page(
    State(shop): State<DemoShop>,
    Path((event, hold)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let h = match hold_of_visitor(&shop, &headers, &hold).await {
        Ok(h) => h,
        Err(res) => return res,
    };
    let qty = h["qty"].as_u64().unwrap_or(0);
    let ev = html_escape(&event);
    let hold_e = html_escape(&hold);
    let items = items_html(&h);
    let body = match h["status"].as_str() {
        Some("confirmed") => format!(
            r#"<div class="card confirmed" id="confirmation">
<p class="tick" aria-hidden="true">✓</p>
<h1>You're going!</h1>
<p class="lead">Payment received: <strong id="confirmed-qty">{qty}</strong> ticket(s) for <strong>{ev}</strong> are yours.</p>{items}
<p>Order <code id="order-id">{hold_e}</code> · status <strong id="order-status">confirmed</strong></p>
</div>
<p><a href="/shop/{ev}">Back to the shop</a></p>"#
        ),
        Some("held") => format!(
            r#"<h1>Waiting for payment</h1><p>Order <code>{hold_e}</code> is held and not paid yet.</p><p><a class="button" href="/demo-pay/{hold_e}">Pay now</a></p>"#
        ),
        Some(s) => format!(
            r#"<h1>No tickets bought</h1><p>Order <code>{hold_e}</code> is <strong id="order-status">{}</strong>: its tickets went back on sale and you were not charged.</p><p><a class="button" href="/shop/{ev}">Back to the shop</a></p>"#,
            html_escape(s)
        ),
        None => return gateway_trouble("hold without status"),
    };
    page(StatusCode::OK, "Your order", &body)
}

// === server-to-server calls to the gateway ===

impl DemoShop {
    fn gateway(&self) -> Result<&str, String> {
        self.shared
            .gateway
            .get()
            .map(String::as_str)
            .ok_or_else(|| "the demo shop does not know the gateway's address".to_owned())
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        extra: Option<(&str, &str, String)>,
    ) -> Result<(StatusCode, Value), String> {
        let url = format!("{}{path}", self.gateway()?);
        let mut req = http::Request::builder()
            .method(method)
            .uri(url)
            .header(header::ACCEPT, "application/json");
        if let Some(t) = bearer {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let body = match extra {
            Some((name, value, body)) => {
                req = req
                    .header(name, value)
                    .header(header::CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(body))
            }
            None => Full::new(Bytes::new()),
        };
        let req = req.body(body).map_err(|e| e.to_string())?;
        let res = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            self.shared.client.request(req),
        )
        .await
        .map_err(|_| "gateway call timed out".to_owned())?
        .map_err(|e| e.to_string())?;
        let status = res.status();
        let bytes = res
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok((status, v))
    }

    async fn signed_post(
        &self,
        path: &str,
        signature: &str,
        body: String,
    ) -> Result<(StatusCode, Value), String> {
        self.call(
            Method::POST,
            path,
            None,
            Some(("sluice-signature", signature, body)),
        )
        .await
    }
}

/// Percent-encodes everything but unreserved characters, for one path
/// segment.
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

// === echo ===

async fn echo(req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let mut hasher = Sha256::new();
    let mut len: u64 = 0;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => {
                len += bytes.len() as u64;
                hasher.update(&bytes);
            }
            Err(e) => return (http::StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        }
    }
    let headers: serde_json::Map<String, serde_json::Value> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                serde_json::Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()),
            )
        })
        .collect();
    let body = serde_json::json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "headers": headers,
        "body_bytes": len,
        "body_sha256": hex(&hasher.finalize()),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(body.to_string()),
    )
        .into_response()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_room_is_valid_and_lets_the_crowds_progress_past_the_queue() {
        let room = room();
        room.validate("rooms[0]").expect("a valid room");
        assert_eq!(room.id, "default");
        assert!(room.bypass_paths.iter().any(|p| p == CROWD_STATUS_PATH));
        // the start itself is guarded: the presser's pass is revoked there
        assert!(!room.bypass_paths.iter().any(|p| p == "/demo/crowd"));
        assert!(room.rate_per_sec < RoomConfig::default().rate_per_sec);
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(encode_segment("h_1-2.x~"), "h_1-2.x~");
        assert_eq!(encode_segment("a/b?c"), "a%2Fb%3Fc");
    }

    #[test]
    fn a_hold_with_categories_shows_its_breakdown_escaped() {
        let h = serde_json::json!({"items": [
            {"category": "floor", "qty": 2},
            {"category": "<vip>", "qty": 1},
        ]});
        assert_eq!(
            items_html(&h),
            "\n<p id=\"order-items\">floor × 2, &lt;vip&gt; × 1</p>"
        );
        assert_eq!(items_html(&serde_json::json!({"qty": 2})), "");
    }
}
