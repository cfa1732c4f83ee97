//! Verified crawlers (issue 22) through real sockets: a gateway on a real
//! Redis in front of a real origin, guarding a busy room (one visitor
//! admitted, one waiting in line, no credit left), with
//!
//! - Web Bot Auth: two crawler operators' key directories served over
//!   HTTPS on loopback ports (certificates of a test CA the gateway is
//!   told to trust), and a signer writing RFC 9421 signatures the way a
//!   crawler would ([`sluice_tests::crawler::Signer`], written from the
//!   RFC, not with the gateway's code);
//! - forward-confirmed reverse DNS: a DNS server of the test's own on a
//!   loopback UDP port (the gateway's `crawlers.dns.nameservers`), the
//!   clients' addresses told to the gateway in `X-Forwarded-For` by its
//!   trusted proxy (127.0.0.1): the resolver answers `localhost` itself
//!   for every 127/8 PTR, so loopback addresses cannot stand for crawlers.
//!
//! What a hostile client would try, each of which must wait in line like
//! any visitor (503 `waiting_room_active`), reach nothing and take
//! nothing: a crawler's User-Agent alone; a signature over the wrong
//! components; a stale, future or expired one; an unknown key, a key of
//! the directory that did not sign, a signer off the allow-list, another
//! `tag` or `alg`; a signature for another authority or path; a replayed
//! nonce; a PTR under another suffix, or under the right one whose forward
//! lookup does not hold the address; a nameserver that never answers (the
//! request still gets its answer: fail closed, no hang). The good ones
//! pass, with `Sluice-Crawler` at the origin and no admission, cookie or
//! place; past a crawler's budget, 429 `rate_limited` with `Retry-After`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_gateway::config::crawlers::CrawlerConfig;
use sluice_tests::client::{Answer, TestClient};
use sluice_tests::crawler::{DnsServer, KeyDirectory, Sig, Signer, Zone, now};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::tls::TestCa;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, TestGateway, admin_room, easy_room};

const ROOM: &str = "busy";

/// A gateway guarding `/echo` with room `busy` (0.001/s, burst 1) on a
/// real Redis, trusting 127.0.0.1's `X-Forwarded-For`, with `agents`
/// and `dns` as its nameserver.
async fn gateway(
    origin: &TestOrigin,
    redis: &RedisServer,
    ca: &TestCa,
    dns: std::net::SocketAddr,
    agents: Vec<CrawlerConfig>,
) -> TestGateway {
    gateway_with(origin, redis, ca, dns, agents, |_| {}).await
}

/// [`gateway`], with `extra` changes to its configuration.
async fn gateway_with(
    origin: &TestOrigin,
    redis: &RedisServer,
    ca: &TestCa,
    dns: std::net::SocketAddr,
    agents: Vec<CrawlerConfig>,
    extra: impl FnOnce(&mut sluice_gateway::config::Config),
) -> TestGateway {
    let ca = ca.cert.clone();
    TestGateway::builder()
        .origin(origin.url())
        .redis(redis.url())
        .config(move |c| {
            c.rooms = vec![easy_room(ROOM, 0.001, 1.0, &["/echo"])];
            c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
            c.crawlers.directory_ca = Some(ca);
            c.crawlers.dns.nameservers = vec![dns];
            c.crawlers.dns.timeout = Duration::from_millis(500);
            c.crawlers.agents = agents;
        })
        .config(extra)
        .spawn()
        .await
}

/// Two gateways on one Redis, each with the crawler `agent` makes of one
/// signer's key directory; the room made busy through `a` and seen busy
/// from `ip` through `b` (`None`: no `redis-server`, said by
/// [`RedisServer::start`]).
struct Two {
    origin: TestOrigin,
    signer: Signer,
    dir: KeyDirectory,
    a: TestGateway,
    b: TestGateway,
    _redis: RedisServer,
    _ca: TestCa,
    _dns: DnsServer,
}

impl Two {
    /// A fresh signature of the page by the directory's signer.
    fn signed(&self) -> Vec<(String, String)> {
        signed_page(&self.signer, &self.dir)
    }
}

async fn two_gateways(agent: impl Fn(&KeyDirectory) -> CrawlerConfig, ip: &str) -> Option<Two> {
    let redis = RedisServer::start()?;
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let signer = Signer::new();
    let dir = KeyDirectory::start(&ca, &[&signer]).await;
    let dns = DnsServer::start(Zone::new()).await;
    let a = gateway(&origin, &redis, &ca, dns.addr, vec![agent(&dir)]).await;
    let b = gateway(&origin, &redis, &ca, dns.addr, vec![agent(&dir)]).await;
    make_busy(&a.url()).await;
    sees_busy(&b.url(), ip).await;
    Some(Two {
        origin,
        signer,
        dir,
        a,
        b,
        _redis: redis,
        _ca: ca,
        _dns: dns,
    })
}

/// Makes the room busy: a first visitor is let in (the room's one credit),
/// a second one waits in line. The room's view then.
async fn make_busy(base: &str) -> serde_json::Value {
    let mut first = Visitor::new(base, ROOM);
    let res = first.join("/echo").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["state"], "admitted");
    let mut second = Visitor::new(base, ROOM);
    let res = second.join("/echo").await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.json()["state"], "waiting");
    let view = admin_room(base, ROOM).await;
    assert_eq!(view["queue_length"], 1, "{view}");
    view
}

/// `GET {base}{path}` as a JSON client from `ip` (through the trusted
/// proxy), with `headers`; never longer than a generous bound (a check
/// that hangs fails here instead of stalling the suite).
async fn get(base: &str, path: &str, ip: &str, headers: &[(String, String)]) -> Answer {
    let mut h: Vec<(&str, &str)> = vec![("accept", "application/json"), ("x-forwarded-for", ip)];
    h.extend(headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let url = format!("{base}{path}");
    tokio::time::timeout(Duration::from_secs(30), TestClient::new().get(&url, &h))
        .await
        .expect("an answer, not a hang")
}

/// The request waited like any visitor: 503 `waiting_room_active`, no
/// admission cookie.
fn waits(res: &Answer, what: &str) {
    assert_eq!(res.status, 503, "{what}: {}", res.text());
    assert_eq!(res.json()["code"], "waiting_room_active", "{what}");
    assert!(
        res.headers
            .get_all("set-cookie")
            .iter()
            .all(|c| !c.to_str().unwrap().contains("sluice_a_")),
        "{what}: no admission cookie"
    );
}

/// The request reached the origin as crawler `name`: `Sluice-Crawler`
/// there, no admission token forwarded, no cookie set.
fn passed(res: &Answer, name: &str, what: &str) {
    assert_eq!(res.status, 200, "{what}: {}", res.text());
    let echo = res.json();
    assert_eq!(
        echo["headers"]["sluice-crawler"],
        serde_json::json!([name]),
        "{what}: {echo}"
    );
    assert!(
        echo["headers"].get("sluice-admission").is_none(),
        "{what}: no admission"
    );
    assert!(res.header("set-cookie").is_none(), "{what}: no cookie");
}

/// The sum of `sluice_crawler_requests_total` samples whose labels hold
/// every one of `labels` (`crawler="x"`, `result="y"`).
async fn crawler_metric(base: &str, labels: &[&str]) -> f64 {
    let res = TestClient::new()
        .get(
            &format!("{base}/metrics"),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        )
        .await;
    res.text()
        .lines()
        .filter(|l| l.starts_with("sluice_crawler_requests_total{"))
        .filter(|l| labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Nothing was taken from the room since `before`: the same line, no
/// new seq, no new admission.
async fn nothing_taken(base: &str, before: &serde_json::Value) {
    let after = admin_room(base, ROOM).await;
    for field in ["queue_length", "tail", "admitted_total"] {
        assert_eq!(after[field], before[field], "{field}: {after}");
    }
}

/// Waits (10 s at most) until gateway `base` sees the room busy: a plain
/// visitor from `ip` waits there.
async fn sees_busy(base: &str, ip: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while get(base, "/echo/page", ip, &[]).await.status != 503 {
        assert!(
            std::time::Instant::now() < deadline,
            "gateway {base} never saw the room busy"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The headers of a request for `/echo/page` at `shop.example` signed by
/// `signer` of `dir` (a fresh nonce each time), with that `Host`.
fn signed_page(signer: &Signer, dir: &KeyDirectory) -> Vec<(String, String)> {
    let host = "shop.example";
    let mut h = signer.headers(&Sig::new(&dir.origin(), host, "/echo/page"));
    h.push(("host".into(), host.into()));
    h
}

fn signed_agent(name: &str, dir: &KeyDirectory) -> CrawlerConfig {
    CrawlerConfig {
        name: name.into(),
        signature_agent: Some(dir.origin()),
        rooms: vec![ROOM.into()],
        rate_per_sec: 1000.0,
        burst: 1000,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn web_bot_auth_passes_a_busy_room_and_nothing_short_of_it_does() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let signer = Signer::new();
    let rate_signer = Signer::new();
    let outsider = Signer::new();
    let dir = KeyDirectory::start(&ca, &[&signer]).await;
    let rate_dir = KeyDirectory::start(&ca, &[&rate_signer]).await;
    // a directory nobody put on the allow-list, holding the outsider's key
    let other_dir = KeyDirectory::start(&ca, &[&outsider]).await;
    let dns = DnsServer::start(Zone::new()).await;
    let gw = gateway(
        &origin,
        &redis,
        &ca,
        dns.addr,
        vec![
            signed_agent("signedbot", &dir),
            CrawlerConfig {
                rate_per_sec: 0.001,
                burst: 2,
                ..signed_agent("ratebot", &rate_dir)
            },
        ],
    )
    .await;
    let base = gw.url();
    let authority = gw.addr.to_string();
    let before = make_busy(&base).await;
    let ip = "203.0.113.50";
    let sig = || Sig::new(&dir.origin(), &authority, "/echo/page");

    // A good signature passes the busy room, at once.
    let at_origin = origin.requests();
    let res = get(&base, "/echo/page", ip, &signer.headers(&sig())).await;
    passed(&res, "signedbot", "a good signature");
    assert_eq!(origin.requests(), at_origin + 1);
    // Forward-auth judges the described request the same way: 200 with
    // the crawler's name for the proxy to forward, no admission.
    let mut h = signer.headers(&sig());
    h.push(("x-original-uri".into(), "/echo/page".into()));
    let res = get(&base, "/_sluice/auth", ip, &h).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("sluice-crawler"), Some("signedbot"));
    assert!(res.header("sluice-admission").is_none());
    assert!(res.header("set-cookie").is_none());
    let res = get(
        &base,
        "/_sluice/auth",
        ip,
        &[("x-original-uri".into(), "/echo/page".into())],
    )
    .await;
    assert_eq!(res.status, 503, "unsigned: {}", res.text());

    // Everything short of it waits, and reaches nothing.
    let at_origin = origin.requests();
    let ua = vec![(
        "user-agent".to_owned(),
        "Mozilla/5.0 (compatible; signedbot/1.0)".to_owned(),
    )];
    waits(
        &get(&base, "/echo/page", ip, &ua).await,
        "a User-Agent alone",
    );
    let cases: Vec<(&str, Vec<(String, String)>)> = vec![
        (
            "no @authority covered",
            signer.headers(&Sig {
                components: vec!["@method", "@path", "signature-agent"],
                ..sig()
            }),
        ),
        (
            "the signature-agent member not covered",
            signer.headers(&Sig {
                components: vec!["@authority", "@method", "@path"],
                ..sig()
            }),
        ),
        (
            "a stale created",
            signer.headers(&Sig {
                created: now() - 600,
                ..sig()
            }),
        ),
        (
            "a created in the future",
            signer.headers(&Sig {
                created: now() + 600,
                expires: now() + 900,
                ..sig()
            }),
        ),
        (
            "expired",
            signer.headers(&Sig {
                created: now() - 10,
                expires: now() - 1,
                ..sig()
            }),
        ),
        ("an unknown key", outsider.headers(&sig())),
        (
            "the directory's keyid, another key's signature",
            outsider.headers(&Sig {
                keyid: Some(signer.keyid()),
                ..sig()
            }),
        ),
        (
            "a signer off the allow-list",
            outsider.headers(&Sig {
                agent: other_dir.origin(),
                ..sig()
            }),
        ),
        (
            "the allow-listed signer over plain http",
            signer.headers(&Sig {
                agent: dir.origin().replace("https://", "http://"),
                ..sig()
            }),
        ),
        (
            "another authority",
            signer.headers(&Sig {
                authority: "shop.example".into(),
                ..sig()
            }),
        ),
        (
            "another path",
            signer.headers(&Sig {
                path: "/echo/elsewhere".into(),
                ..sig()
            }),
        ),
        (
            "another tag",
            signer.headers(&Sig {
                tag: "not-web-bot-auth".into(),
                ..sig()
            }),
        ),
        (
            "another alg",
            signer.headers(&Sig {
                alg: Some("rsa-pss-sha512".into()),
                ..sig()
            }),
        ),
    ];
    for (what, headers) in &cases {
        waits(&get(&base, "/echo/page", ip, headers).await, what);
    }
    // the signature itself tampered with (one byte flipped)
    let mut tampered = signer.headers(&sig());
    let s = &mut tampered[2].1;
    let flip = if s.as_bytes()[8] == b'A' { "B" } else { "A" };
    s.replace_range(8..9, flip);
    waits(
        &get(&base, "/echo/page", ip, &tampered).await,
        "a tampered signature",
    );
    // The same good signature twice: the nonce verifies once.
    let once = signer.headers(&sig());
    passed(
        &get(&base, "/echo/page", ip, &once).await,
        "signedbot",
        "first use",
    );
    let at_origin_replay = origin.requests();
    waits(
        &get(&base, "/echo/page", ip, &once).await,
        "a replayed nonce",
    );
    assert_eq!(origin.requests(), at_origin_replay);
    assert_eq!(
        origin.requests(),
        at_origin + 1,
        "nothing refused reached the origin"
    );

    // Its own budget: past it 429 `rate_limited`, with Retry-After.
    let rsig = || Sig::new(&rate_dir.origin(), &authority, "/echo/r");
    for n in 0..2 {
        let res = get(&base, "/echo/r", ip, &rate_signer.headers(&rsig())).await;
        passed(&res, "ratebot", &format!("within the burst ({n})"));
    }
    let res = get(&base, "/echo/r", ip, &rate_signer.headers(&rsig())).await;
    assert_eq!(res.status, 429, "{}", res.text());
    let p = res.json();
    assert_eq!(p["code"], "rate_limited", "{p}");
    assert_eq!(p["crawler"], "ratebot", "{p}");
    assert!(res.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    assert!(
        res.header("content-type")
            .unwrap()
            .starts_with("application/problem+json")
    );
    // …which is its own: the other crawler still passes
    passed(
        &get(&base, "/echo/page", ip, &signer.headers(&sig())).await,
        "signedbot",
        "another crawler's budget",
    );

    // Nothing was taken from the fans: the line, the seqs, the admissions.
    nothing_taken(&base, &before).await;
    // Counted per crawler and reason, and shown to the operator.
    for (labels, at_least) in [
        (vec!["crawler=\"signedbot\"", "result=\"passed\""], 3.0),
        (vec!["crawler=\"signedbot\"", "result=\"stale\""], 2.0),
        (vec!["crawler=\"signedbot\"", "result=\"expired\""], 1.0),
        (vec!["crawler=\"signedbot\"", "result=\"components\""], 1.0),
        (vec!["crawler=\"unknown\"", "result=\"components\""], 1.0),
        (vec!["crawler=\"signedbot\"", "result=\"unknown_key\""], 1.0),
        (vec!["crawler=\"signedbot\"", "result=\"signature\""], 3.0),
        (vec!["crawler=\"signedbot\"", "result=\"replayed\""], 1.0),
        (vec!["crawler=\"unknown\"", "result=\"signer\""], 2.0),
        (vec!["crawler=\"unknown\"", "result=\"tag\""], 1.0),
        (vec!["crawler=\"signedbot\"", "result=\"alg\""], 1.0),
        (vec!["crawler=\"ratebot\"", "result=\"rate_limited\""], 1.0),
    ] {
        let n = crawler_metric(&base, &labels).await;
        assert!(n >= at_least, "{labels:?}: {n}");
    }
    let view = admin_room(&base, ROOM).await;
    let c = &view["crawlers"];
    assert!(c["passed"].as_u64().unwrap() >= 5, "{c}");
    assert!(c["refused"].as_u64().unwrap() >= 14, "{c}");
    assert_eq!(c["rate_limited"], 1, "{c}");
    let agent = c["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "signedbot")
        .unwrap();
    assert!(agent["passed"].as_u64().unwrap() >= 3, "{agent}");
    assert_eq!(agent["keys"], 1, "{agent}");
    assert!(dir.fetches() >= 1);
    assert_eq!(
        other_dir.fetches(),
        0,
        "a signer off the list is never fetched"
    );
    drop(dns);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forward_confirmed_reverse_dns_passes_and_fails_closed() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let zone = Zone::new()
        // a real crawler: PTR under the suffix, its A holding the address
        .ptr("203.0.113.10", &["crawl-10.googlebot.com."])
        .addrs("crawl-10.googlebot.com", &["203.0.113.10"])
        .ptr("2001:db8::10", &["crawl-v6.googlebot.com."])
        .addrs("crawl-v6.googlebot.com", &["2001:db8::10"])
        // a PTR under another suffix (and one that only looks like it)
        .ptr("203.0.113.11", &["crawler.evil.example."])
        .addrs("crawler.evil.example", &["203.0.113.11"])
        .ptr("203.0.113.14", &["evilgooglebot.com."])
        .addrs("evilgooglebot.com", &["203.0.113.14"])
        // a spoofed PTR: the crawler's zone does not hold the address
        .ptr("203.0.113.12", &["crawl-12.googlebot.com."])
        .addrs("crawl-12.googlebot.com", &["203.0.113.99"]);
    let dns = DnsServer::start(zone).await;
    let googlebot = CrawlerConfig {
        name: "googlebot".into(),
        hostnames: vec![".googlebot.com".into()],
        user_agents: vec!["Googlebot".into()],
        rate_per_sec: 0.001,
        burst: 3,
        ..Default::default()
    };
    let gw = gateway(&origin, &redis, &ca, dns.addr, vec![googlebot.clone()]).await;
    let base = gw.url();
    let before = make_busy(&base).await;
    let ua = vec![(
        "user-agent".to_owned(),
        "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)".to_owned(),
    )];

    let at_origin = origin.requests();
    for (ip, what) in [
        ("203.0.113.11", "a PTR under another suffix"),
        ("203.0.113.14", "a PTR that only ends like the suffix"),
        (
            "203.0.113.12",
            "a PTR whose forward lookup lacks the address",
        ),
        ("203.0.113.13", "no PTR at all"),
        ("127.0.0.1", "a loopback address"),
    ] {
        waits(&get(&base, "/echo/g", ip, &ua).await, what);
    }
    // the right address without a crawler's User-Agent is not looked up
    let queries = dns.queries();
    waits(
        &get(&base, "/echo/g", "203.0.113.10", &[]).await,
        "the crawler's address, a browser's User-Agent",
    );
    assert_eq!(dns.queries(), queries, "no lookup without a crawler's UA");
    assert_eq!(origin.requests(), at_origin);

    // The real crawler passes, on IPv4 and IPv6.
    passed(
        &get(&base, "/echo/g", "203.0.113.10", &ua).await,
        "googlebot",
        "FCrDNS, IPv4",
    );
    passed(
        &get(&base, "/echo/g", "2001:db8::10", &ua).await,
        "googlebot",
        "FCrDNS, IPv6",
    );
    // the confirmation is cached: no new lookup
    let queries = dns.queries();
    passed(
        &get(&base, "/echo/g", "203.0.113.10", &ua).await,
        "googlebot",
        "cached",
    );
    assert_eq!(dns.queries(), queries, "cached");
    // its budget (burst 3) spent: 429
    let res = get(&base, "/echo/g", "203.0.113.10", &ua).await;
    assert_eq!(res.status, 429, "{}", res.text());
    assert_eq!(res.json()["code"], "rate_limited");
    assert!(res.header("retry-after").is_some());
    nothing_taken(&base, &before).await;
    for result in ["no_ptr", "hostname", "forward", "passed", "rate_limited"] {
        let n = crawler_metric(
            &base,
            &["crawler=\"googlebot\"", &format!("result=\"{result}\"")],
        )
        .await;
        assert!(n >= 1.0, "{result}: {n}");
    }
    gw.shutdown().await;

    // A nameserver that never answers: the crawler waits, and is answered
    // (after `crawlers.dns.timeout`, not never).
    let hole = DnsServer::black_hole().await;
    let gw = gateway(&origin, &redis, &ca, hole.addr, vec![googlebot]).await;
    let base = gw.url();
    for _ in 0..2 {
        waits(
            &get(&base, "/echo/g", "203.0.113.10", &ua).await,
            "DNS down",
        );
    }
    assert!(hole.queries() >= 1, "the gateway asked");
    assert!(crawler_metric(&base, &["result=\"dns\""]).await >= 1.0);
    gw.shutdown().await;
}

/// Keys change under a running gateway: a key rotated into the directory
/// verifies once the gateway refetches (asked by the unknown `keyid`, at
/// most once per `directory_retry`), the key rotated out stops verifying;
/// while the signer's directory is down, the keys fetched before still
/// verify (an outage is no revocation).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rotated_keys_follow_the_directory_and_an_outage_revokes_nothing() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let (old, new, stranger) = (Signer::new(), Signer::new(), Signer::new());
    let dir = KeyDirectory::start(&ca, &[&old]).await;
    let dns = DnsServer::start(Zone::new()).await;
    let gw = gateway_with(
        &origin,
        &redis,
        &ca,
        dns.addr,
        vec![signed_agent("signedbot", &dir)],
        |c| c.crawlers.directory_retry = Duration::from_secs(1),
    )
    .await;
    let base = gw.url();
    let authority = gw.addr.to_string();
    let before = make_busy(&base).await;
    let ip = "203.0.113.60";
    let sig = || Sig::new(&dir.origin(), &authority, "/echo/k");
    let status = |signer: &Signer| {
        let h = signer.headers(&sig());
        let base = base.clone();
        async move { get(&base, "/echo/k", ip, &h).await.status }
    };
    assert_eq!(status(&old).await, 200);

    // rotation: the new key in, the old one out
    dir.serve(&[&new]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = status(&new).await;
        if s == 200 {
            break;
        }
        assert_eq!(s, 503, "an unknown key waits meanwhile");
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated key never verified"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        status(&old).await,
        503,
        "the removed key no longer verifies"
    );

    // the signer's directory goes down: refetches fail, the keys stay
    dir.set_failing(true);
    let fetched = dir.fetches();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while dir.fetches() == fetched {
        // an unknown key asks for a refetch
        assert_eq!(status(&stranger).await, 503);
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway never refetched"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        status(&new).await,
        200,
        "a failed fetch keeps the keys fetched before"
    );
    nothing_taken(&base, &before).await;
    gw.shutdown().await;
}

/// A nonce verifies once across gateways: the same signed request (the
/// same `Host`, so the same `@authority`) replayed to a second gateway on
/// the same Redis waits, while a fresh signature passes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nonce_verifies_once_across_gateways() {
    let ip = "203.0.113.70";
    let Some(two) = two_gateways(|dir| signed_agent("signedbot", dir), ip).await else {
        return;
    };
    let (origin, base_a, base_b) = (&two.origin, two.a.url(), two.b.url());
    let signed = || two.signed();
    let once = signed();
    passed(
        &get(&base_a, "/echo/page", ip, &once).await,
        "signedbot",
        "first use, at gateway a",
    );
    let at_origin = origin.requests();
    waits(
        &get(&base_b, "/echo/page", ip, &once).await,
        "the same nonce replayed to gateway b",
    );
    waits(
        &get(&base_a, "/echo/page", ip, &once).await,
        "the same nonce replayed to gateway a",
    );
    assert_eq!(origin.requests(), at_origin, "no replay reached the origin");
    assert!(crawler_metric(&base_b, &["result=\"replayed\""]).await >= 1.0);
    passed(
        &get(&base_b, "/echo/page", ip, &signed()).await,
        "signedbot",
        "a fresh nonce at gateway b",
    );
}

/// A crawler's budget is one budget however many gateways it is spread
/// over (the queue store's, `take_rate`): with a burst of 3 and a rate
/// that refills nothing during the test, three requests pass in all,
/// alternating between two gateways on one Redis, and every later one is
/// 429 `rate_limited` at either gateway, reaching no origin. Before the
/// budget was shared, each gateway had a bucket of its own and the
/// crawler got 3 at each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crawlers_budget_is_one_across_gateways() {
    let ip = "203.0.113.80";
    let agent = |dir: &KeyDirectory| CrawlerConfig {
        rate_per_sec: 0.001,
        burst: 3,
        ..signed_agent("budgetbot", dir)
    };
    let Some(two) = two_gateways(agent, ip).await else {
        return;
    };
    let (origin, base_a, base_b) = (&two.origin, two.a.url(), two.b.url());
    let signed = || two.signed();
    let at_origin = origin.requests();
    let mut passes = 0;
    let mut limited = [0, 0];
    for n in 0..10 {
        let (which, base) = if n % 2 == 0 {
            (0, &base_a)
        } else {
            (1, &base_b)
        };
        let res = get(base, "/echo/page", ip, &signed()).await;
        match res.status.as_u16() {
            200 => {
                passed(&res, "budgetbot", &format!("request {n}"));
                passes += 1;
            }
            429 => {
                let p = res.json();
                assert_eq!(p["code"], "rate_limited", "{p}");
                assert_eq!(p["crawler"], "budgetbot", "{p}");
                let wait: u64 = res.header("retry-after").unwrap().parse().unwrap();
                assert!(wait >= 1, "{wait}");
                limited[which] += 1;
            }
            s => panic!("request {n}: {s} {}", res.text()),
        }
    }
    assert_eq!(passes, 3, "three in all, not three per gateway");
    assert!(
        limited[0] >= 1 && limited[1] >= 1,
        "refused at both gateways: {limited:?}"
    );
    assert_eq!(
        origin.requests(),
        at_origin + 3,
        "only the budget reached the origin"
    );
    for base in [&base_a, &base_b] {
        assert!(
            crawler_metric(base, &["crawler=\"budgetbot\"", "result=\"rate_limited\""]).await
                >= 1.0
        );
    }
}
