//! Adaptive admission end to end: an origin whose latency grows with its
//! load (it serves `CAPACITY` requests per second, one after another, so
//! more than that builds a queue), a gateway whose room starts at three
//! times that rate with adaptive admission on, and a steady line of JSON
//! visitors, each making one origin request once admitted (so the origin's
//! load follows the admission rate). After convergence the admission rate
//! sits within 20% of the origin's capacity and the origin's p99 in the
//! final window is under the objective.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use sluice_gateway::config::RoomConfig;
use sluice_gateway::gate::adaptive::AdaptiveConfig;
use sluice_tests::client::TestClient;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, TestGateway, admin_patch, admin_room, easy_room};
use std::sync::Mutex;

/// The origin's true capacity, requests per second.
const CAPACITY: f64 = 40.0;
/// The latency objective, ms.
const OBJECTIVE_MS: f64 = 500.0;

/// An origin serving one request at a time, each taking `1 / CAPACITY`:
/// latency is the service time plus the wait behind those before.
struct PacedOrigin {
    addr: std::net::SocketAddr,
    /// (arrival, latency) of every request.
    served: Arc<Mutex<Vec<(Instant, Duration)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PacedOrigin {
    async fn start() -> PacedOrigin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(Mutex::new(Vec::new()));
        let next_free = Arc::new(Mutex::new(tokio::time::Instant::now()));
        let log = served.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (log, next_free) = (log.clone(), next_free.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |_req| {
                        let (log, next_free) = (log.clone(), next_free.clone());
                        async move {
                            let arrived = tokio::time::Instant::now();
                            let done = {
                                let mut nf = next_free.lock().unwrap();
                                let start = (*nf).max(arrived);
                                *nf = start + Duration::from_secs_f64(1.0 / CAPACITY);
                                *nf
                            };
                            tokio::time::sleep_until(done).await;
                            log.lock()
                                .unwrap()
                                .push((arrived.into_std(), done.duration_since(arrived)));
                            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                                "served",
                            ))))
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        PacedOrigin { addr, served, task }
    }

    /// The p99 latency (ms) of requests that arrived after `since`, and
    /// their count.
    fn p99_since(&self, since: Instant) -> (f64, usize) {
        let mut v: Vec<f64> = self
            .served
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at >= since)
            .map(|(_, l)| l.as_secs_f64() * 1000.0)
            .collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        if v.is_empty() {
            return (0.0, 0);
        }
        let i = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
        (v[i], v.len())
    }
}

impl Drop for PacedOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adaptive_admission_converges_on_the_origins_capacity() {
    let origin = PacedOrigin::start().await;
    let room = RoomConfig {
        adaptive: AdaptiveConfig {
            enabled: true,
            latency_p99_ms: OBJECTIVE_MS,
            max_error_ratio: 0.05,
            floor_rate: 5.0,
            ceiling_rate: 200.0,
            decrease_factor: 0.8,
            increase_step: 1.0,
            interval: Duration::from_millis(500),
            min_samples: 5,
            ..AdaptiveConfig::default()
        },
        ..easy_room("shop", 3.0 * CAPACITY, 5.0, &["/shop"])
    };
    let gw = TestGateway::builder()
        .origin(format!("http://{}", origin.addr))
        .config(|c| c.rooms = vec![room])
        .spawn()
        .await;
    let base = gw.url();

    // A steady line: about QUEUE visitors waiting at any time, each making
    // one origin request once admitted.
    const QUEUE: u64 = 40;
    let waiting = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let run_for = Duration::from_secs(45);
    let feeder = {
        let (base, waiting) = (base.clone(), waiting.clone());
        tokio::spawn(async move {
            let mut visitors = Vec::new();
            while started.elapsed() < run_for {
                while waiting.load(Ordering::Relaxed) < QUEUE {
                    waiting.fetch_add(1, Ordering::Relaxed);
                    let (base, waiting) = (base.clone(), waiting.clone());
                    visitors.push(tokio::spawn(async move {
                        let mut v = Visitor::new(&base, "shop");
                        let joined = v.join("/shop/item").await;
                        let admitted = joined.status.is_success()
                            && v.wait_admitted(Duration::from_secs(30), 200).await;
                        waiting.fetch_sub(1, Ordering::Relaxed);
                        if admitted {
                            let res = v.get_admitted("/shop/item").await;
                            assert_eq!(res.status, 200, "{}", res.text());
                        }
                    }));
                }
                visitors.retain(|t| !t.is_finished());
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            for t in visitors {
                t.abort();
            }
        })
    };

    // The final window: the last 15 s. Until then, a trace of decisions.
    while started.elapsed() < run_for - Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let v = admin_room(&base, "shop").await;
        eprintln!(
            "{:>5.1}s rate {:>6.1} queue {:>3} {} {}",
            started.elapsed().as_secs_f64(),
            v["rate_per_sec"].as_f64().unwrap_or(0.0),
            v["queue_length"],
            v["adaptive"]["mode"],
            v["adaptive"]["reason"]
        );
    }
    let window_start = Instant::now();
    let before = admin_room(&base, "shop").await;
    let mut rates = Vec::new();
    while started.elapsed() < run_for {
        tokio::time::sleep(Duration::from_millis(500)).await;
        rates.push(
            admin_room(&base, "shop").await["rate_per_sec"]
                .as_f64()
                .unwrap(),
        );
    }
    let after = admin_room(&base, "shop").await;
    let secs = window_start.elapsed().as_secs_f64();
    feeder.await.unwrap();

    let admitted =
        after["admitted_total"].as_u64().unwrap() - before["admitted_total"].as_u64().unwrap();
    let admission_rate = admitted as f64 / secs;
    let mean_rate = rates.iter().sum::<f64>() / rates.len() as f64;
    let (p99, n) = origin.p99_since(window_start);
    let adaptive = &after["adaptive"];
    eprintln!(
        "final window: admitted {admission_rate:.1}/s, mean rate {mean_rate:.1}/s (rates {rates:?}), origin p99 {p99:.0} ms over {n} requests; adaptive {adaptive}"
    );
    assert_eq!(adaptive["enabled"], true);
    assert!(adaptive["reason"].as_str().is_some_and(|r| !r.is_empty()));
    assert!(
        (0.8 * CAPACITY..=1.2 * CAPACITY).contains(&admission_rate),
        "admission rate {admission_rate:.1}/s not within 20% of {CAPACITY}/s"
    );
    assert!(
        (0.8 * CAPACITY..=1.2 * CAPACITY).contains(&mean_rate),
        "rate {mean_rate:.1}/s not within 20% of {CAPACITY}/s"
    );
    assert!(n > 100, "only {n} origin requests in the final window");
    assert!(
        p99 < OBJECTIVE_MS,
        "origin p99 {p99:.0} ms ≥ {OBJECTIVE_MS} ms"
    );

    // The steering gateway's metrics parse and name the room.
    let res = TestClient::new()
        .get(
            &format!("{base}/metrics"),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        )
        .await;
    let scrape = prometheus_parse::Scrape::parse(res.text().lines().map(|l| Ok(l.to_owned())))
        .expect("valid Prometheus text");
    for m in [
        "sluice_adaptive_rate_per_second",
        "sluice_adaptive_decisions_total",
        "sluice_origin_p99_seconds",
        "sluice_origin_error_ratio",
    ] {
        let s = scrape.samples.iter().find(|s| s.metric == m);
        assert!(
            s.is_some_and(|s| s.labels.get("room") == Some("shop")),
            "{m} missing: {}",
            res.text()
        );
    }
    assert!(scrape.samples.iter().any(|s| {
        s.metric == "sluice_adaptive_decisions_total"
            && s.labels.get("decision") == Some("decreasing")
    }));
    gw.shutdown().await;
}

/// Adaptive admission is switched on and off live, an operator's manual
/// rate overrides it for the configured time (or the PATCH's own), and bad
/// values are refused with 422 `invalid_setting`.
#[tokio::test]
async fn adaptive_admission_is_switched_and_overridden_live() {
    let gw = TestGateway::builder()
        .config(|c| {
            c.rooms = vec![RoomConfig {
                capacity_rps: Some(100.0),
                safety_margin: 0.0,
                ..easy_room("shop", 10.0, 5.0, &["/shop"])
            }]
        })
        .origin("http://127.0.0.1:9")
        .spawn()
        .await;
    let base = gw.url();
    let a = admin_room(&base, "shop").await;
    assert_eq!(a["adaptive"]["enabled"], false, "{a}");
    assert_eq!(a["adaptive"]["mode"], "off");
    assert_eq!(a["adaptive"]["ceiling"], 100.0, "capacity caps the ceiling");

    let res = admin_patch(&base, "shop", json!({"adaptive_enabled": true})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let a = res.json();
    assert_eq!(a["adaptive"]["enabled"], true, "{a}");
    assert_eq!(a["adaptive"]["mode"], "holding");
    assert_eq!(a["capacity_rps"], 100.0, "calibration kept as the ceiling");

    // A manual rate: overridden for the configured 10 minutes.
    let res = admin_patch(&base, "shop", json!({"rate_per_sec": 7})).await;
    let a = res.json();
    assert_eq!(a["rate_per_sec"], 7.0, "{a}");
    assert_eq!(a["adaptive"]["mode"], "overridden", "{a}");
    let left = a["adaptive"]["override_remaining_secs"].as_u64().unwrap();
    assert!((590..=600).contains(&left), "{left}");
    // …or for the PATCH's own time; 0 ends it.
    let a = admin_patch(
        &base,
        "shop",
        json!({"rate_per_sec": 8, "adaptive_override_secs": 30}),
    )
    .await
    .json();
    let left = a["adaptive"]["override_remaining_secs"].as_u64().unwrap();
    assert!((20..=30).contains(&left), "{left}");
    let a = admin_patch(&base, "shop", json!({"adaptive_override_secs": 0}))
        .await
        .json();
    assert_ne!(a["adaptive"]["mode"], "overridden", "{a}");
    assert_eq!(a["adaptive"]["override_until_ms"], serde_json::Value::Null);

    for bad in [
        json!({"adaptive_enabled": "yes"}),
        json!({"adaptive_enabled": null}),
        json!({"adaptive_override_secs": -1}),
        json!({"adaptive_override_secs": 1e12}),
        json!({"adaptive_override_secs": "10"}),
    ] {
        let res = admin_patch(&base, "shop", bad.clone()).await;
        assert_eq!(res.status, 422, "{bad}: {}", res.text());
        assert_eq!(res.json()["code"], "invalid_setting", "{bad}");
    }

    let a = admin_patch(&base, "shop", json!({"adaptive_enabled": false}))
        .await
        .json();
    assert_eq!(a["adaptive"]["mode"], "off", "{a}");
    gw.shutdown().await;
}

/// With two gateways on one Redis, one steers the room at a time (the lease
/// in the store); when it stops, the other takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gateway_steers_a_room_and_another_takes_over() {
    let Some(redis) = sluice_tests::redis_server::RedisServer::start() else {
        return;
    };
    let gateway = || {
        TestGateway::builder()
            .origin("http://127.0.0.1:9")
            .redis(redis.url())
            .config(|c| {
                c.rooms = vec![RoomConfig {
                    adaptive: AdaptiveConfig {
                        enabled: true,
                        interval: Duration::from_millis(100),
                        min_samples: 1,
                        ..AdaptiveConfig::default()
                    },
                    ..easy_room("shop", 10.0, 5.0, &["/shop"])
                }]
            })
            .spawn()
    };
    let gws = vec![gateway().await, gateway().await];
    let steering = async |gws: &[TestGateway]| -> Vec<bool> {
        let mut v = Vec::new();
        for g in gws {
            v.push(admin_room(&g.url(), "shop").await["adaptive"]["steering_here"] == true);
        }
        v
    };
    // No traffic: the window stretches 10 intervals, then both try the lease.
    let deadline = Instant::now() + Duration::from_secs(10);
    let leader = loop {
        let s = steering(&gws).await;
        assert!(!(s[0] && s[1]), "both gateways steer");
        if let Some(i) = s.iter().position(|x| *x) {
            break i;
        }
        assert!(Instant::now() < deadline, "nobody steers");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let s = steering(&gws).await;
        assert!(s[leader] && !s[1 - leader], "{s:?}");
    }
    let a = admin_room(&gws[1 - leader].url(), "shop").await["adaptive"].clone();
    assert_eq!(
        a["mode"], "holding",
        "the follower shows the leader's decision: {a}"
    );
    assert!(
        a["reason"].as_str().unwrap().contains("nothing to learn"),
        "{a}"
    );

    // The leader stops: the other takes over once the lease lapses.
    let mut gws = gws;
    let old = gws.remove(leader);
    old.shutdown().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while steering(&gws).await != [true] {
        assert!(Instant::now() < deadline, "nobody took over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for g in gws {
        g.shutdown().await;
    }
}
