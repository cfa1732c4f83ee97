//! One hot event split into 8 shards against the same event on one key,
//! on a 3-primary Redis Cluster, in one run; then the last units of a
//! sharded sale (issue 20's bench, seed 003's exercise: 50,000 units over
//! 8 sub-counters under 10,000 concurrent requests).
//!
//!   cargo run --release -p sluice-tests --example shard_bench \
//!     [seconds=10] [tasks=256] [rounds=2] [crowd=10000] [units=50000] [limit=120]
//!
//! Starts its own 3-primary cluster (no replicas) on free loopback ports
//! and drives `Sharded<RedisInventory>::hold`, the gateway's path, from
//! this one process. Two phases:
//!
//! * **Throughput.** `tasks` concurrent tasks, each holding 1 unit for a
//!   fresh visitor in a loop for `seconds`, on a plain event (one key,
//!   one primary) and on the same event split into 8 shards, with stock
//!   that never runs out; `rounds` rounds of each, alternated (plain,
//!   sharded, plain, …), after a 1 s warm-up of each. Prints every round
//!   with the CPU it cost (this process, and the primaries by `INFO
//!   cpu`), the medians and their ratio.
//! * **Last units.** `units` units (cart limit 4) and `crowd` tasks
//!   released at once, each buying carts of 1 to 4 units for fresh
//!   visitors, on a plain event and on an 8-shard one, in two ways:
//!   - *timed*: a buyer told "sold out" for a cart of several units asks
//!     again for one; told "sold out" for one unit, it stops. Nothing but
//!     holds, so the time to sell out is the store's. On a plain event
//!     this sells every unit; units left when every buyer has stopped
//!     were refused to someone who asked for one.
//!   - *observed*: after every "sold out" the buyer reads the event; if
//!     units are left (available or in transit) it asks again for what
//!     is left, else it stops. The reads cost the store (8 calls on the
//!     sharded event), so this run's time is not the headline.
//!
//!   The timed sale is run again with `tasks` buyers: fewer buyers per
//!   home shard, so homes run dry unevenly and units move. A "false
//!   sold-out" is a sold-out answer while units remained; three counts of
//!   it, from loose to strict: answers that arrived before the last
//!   successful hold did (includes carts larger than what was left);
//!   answers whose next read showed units enough for the cart (observed
//!   only); and answers that arrived while at least the cart's units were
//!   provably unsold (`units` minus the units of every hold that had
//!   *started* by then: a lower bound, 0 on a plain event by construction).
//!   The store underneath counts the calls of each routed hold (home
//!   attempts, shards walked, units moved), so the report says how many
//!   holds moved units home first and how many sold-out answers came after
//!   `ROUTER_ROUNDS` home attempts (when the router keeps its turn over
//!   pass, pull and hold; it answers "sold out" only from a proving pass).
//!
//! Ends with checks: never oversold, nothing in transit, the invariant,
//! no visitor over the cart limit (tracked here, and read from every
//! shard's `visitors` hash), every cart on its visitor's home shard,
//! cart-limit probes (a second hold by one in eight buyers, one unit over
//! the limit) refused, and every unit sold where the buyers' rule
//! guarantees it (plain events; the observed sale). Exits 1 when one
//! fails. Units left unsold by a timed sharded sale are the goal missed
//! (printed, exit 0). Everything it started stops with it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_reservation::observed::{Call, Observed, Observer};
use sluice_reservation::sharded::{ROUTER_ROUNDS, home_shard, split};
use sluice_reservation::{
    EventId, EventState, HoldOutcome, Inventory, RedisConfig, RedisInventory, SetStockOutcome,
    Sharded, StockSpec,
};
use sluice_tests::cluster::RedisCluster;
use sluice_tests::redis_server::cli;

type Store = Sharded<Observed<RedisInventory, Counter>>;

const SHARDS: u32 = 8;
const CART_LIMIT: u32 = 4;
/// Stock of the throughput phase: never sold out.
const ENDLESS: u64 = 1_000_000_000;
/// Hold attempts per buyer of the last-units phase, at most.
const MAX_ATTEMPTS: u32 = 10_000;

tokio::task_local! {
    /// Store calls of the buyer's current hold: hold scripts, transfers
    /// out (a shard walked), transfers in (units moved), reads (the
    /// router's survey of every shard before a "sold out").
    static CALLS: Cell<[u32; 4]>;
}

/// Counts the calls a routed hold makes on the Redis store ([`CALLS`],
/// where a buyer sets it), to tell why a hold was answered as it was.
#[derive(Clone)]
struct Counter;

impl Observer for Counter {
    fn before(&self, call: Call) {
        let i = match call {
            Call::Hold => 0,
            Call::TransferOut => 1,
            Call::TransferIn => 2,
            Call::Read => 3,
        };
        let _ = CALLS.try_with(|c| {
            let mut v = c.get();
            v[i] += 1;
            c.set(v);
        });
    }
}

struct Args {
    seconds: u64,
    tasks: usize,
    rounds: usize,
    crowd: usize,
    units: u64,
    limit: u64,
}

impl Args {
    fn parse() -> Args {
        let a: Vec<String> = std::env::args().collect();
        let n = |i: usize, d: u64| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
        Args {
            seconds: n(1, 10).max(1),
            tasks: n(2, 256).max(1) as usize,
            rounds: n(3, 2).max(1) as usize,
            crowd: n(4, 10_000).max(1) as usize,
            units: n(5, 50_000).max(1),
            limit: n(6, 120).max(1),
        }
    }
}

fn spec(total: u64) -> StockSpec {
    StockSpec {
        total,
        cart_limit: CART_LIMIT,
        hold_ttl: Duration::from_secs(600),
        version: 1,
        room: "default".into(),
    }
}

/// A visitor id like the gateway's: random, 128 bits.
fn visitor() -> String {
    format!("{:032x}", rand::random::<u128>())
}

async fn create(store: &Store, event: &EventId, total: u64, shards: u32) {
    let out = store
        .set_sharded_stock(event, &spec(total), shards)
        .await
        .expect("set stock");
    assert!(
        matches!(out, SetStockOutcome::Created { available } if available == total),
        "{event}: {out:?}"
    );
}

async fn state(store: &Store, event: &EventId) -> EventState {
    store.read(event).await.expect("read").expect("the event")
}

/// Empties every primary: each run starts on fresh keys, and memory
/// stays bounded.
fn flush(cluster: &RedisCluster) {
    for n in &cluster.nodes {
        cli(n.port, None, &["FLUSHALL"]);
    }
}

/// CPU seconds so far: this process (user + system, 100 ticks a second
/// on Linux), and each primary (`INFO cpu`).
fn cpu(cluster: &RedisCluster) -> (f64, Vec<f64>) {
    let own = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name, which ends with ')'.
            let rest = s.rsplit_once(')')?.1.to_owned();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
        })
        .unwrap_or(0.0);
    let nodes = cluster
        .nodes
        .iter()
        .map(|n| {
            cli(n.port, None, &["INFO", "cpu"])
                .lines()
                .filter_map(|l| {
                    let (k, v) = l.trim().split_once(':')?;
                    (k == "used_cpu_sys" || k == "used_cpu_user").then(|| v.parse::<f64>().ok())?
                })
                .sum()
        })
        .collect();
    (own, nodes)
}

/// Cores used between two [`cpu`] samples over `secs`.
fn cores(a: &(f64, Vec<f64>), b: &(f64, Vec<f64>), secs: f64) -> String {
    let per: Vec<String> =
        b.1.iter()
            .zip(&a.1)
            .map(|(y, x)| format!("{:.2}", (y - x) / secs))
            .collect();
    format!(
        "client {:.2} + primaries {} cores",
        (b.0 - a.0) / secs,
        per.join("/")
    )
}

// === throughput ===

struct Rate {
    per_sec: f64,
    held: u64,
    refused: u64,
    errors: u64,
}

/// `tasks` tasks holding 1 unit for a fresh visitor each, for `seconds`.
async fn load(store: &Store, event: &EventId, seconds: f64, tasks: usize) -> Rate {
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let start = Instant::now();
    let stop = start + Duration::from_secs_f64(seconds);
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (store, event, counts) = (store.clone(), event.clone(), counts.clone());
        handles.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let i = match store.hold(&event, &visitor(), 1, None).await {
                    Ok(HoldOutcome::Held(_)) => 0,
                    Ok(_) => 1,
                    Err(_) => 2,
                };
                counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let held = counts[0].load(Ordering::Relaxed);
    Rate {
        per_sec: held as f64 / start.elapsed().as_secs_f64(),
        held,
        refused: counts[1].load(Ordering::Relaxed),
        errors: counts[2].load(Ordering::Relaxed),
    }
}

/// One measured round on a fresh event: holds/s and the CPU it cost.
async fn round(
    store: &Store,
    cluster: &RedisCluster,
    event: &EventId,
    shards: u32,
    args: &Args,
    failures: &mut Vec<String>,
) -> (f64, String) {
    create(store, event, ENDLESS, shards).await;
    let before = cpu(cluster);
    let t = Instant::now();
    let r = load(store, event, args.seconds as f64, args.tasks).await;
    let after = cpu(cluster);
    let secs = t.elapsed().as_secs_f64();
    // CPU per hold, client and primaries: what a core buys, whatever
    // share of the machine this run got.
    let spent = after.0 - before.0 + after.1.iter().sum::<f64>() - before.1.iter().sum::<f64>();
    let used = format!(
        "{:.0} µs CPU a hold; {}",
        spent / (r.held.max(1) as f64) * 1e6,
        cores(&before, &after, secs)
    );
    let st = state(store, event).await;
    let what = format!("throughput, {event} ({shards} shards)");
    if !st.invariant_holds {
        failures.push(format!("{what}: invariant broken"));
    }
    if st.held != r.held || r.refused + r.errors > 0 {
        failures.push(format!(
            "{what}: {} held by the store, {} answered held, {} refused, {} errors",
            st.held, r.held, r.refused, r.errors
        ));
    }
    flush(cluster);
    (r.per_sec, used)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

// === last units ===

/// What a buyer does after a "sold out" (module docs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Timed,
    Observed,
}

struct HeldRec {
    start: Instant,
    end: Instant,
    qty: u32,
    visitor: String,
    shard: EventId,
    /// Its store calls ([`CALLS`]).
    calls: [u32; 4],
}

struct SoldOutRec {
    end: Instant,
    qty: u32,
    calls: [u32; 4],
    /// Available and in transit in the read that followed (observed).
    left: Option<u64>,
}

#[derive(Default)]
struct BuyerLog {
    held: Vec<HeldRec>,
    sold_out: Vec<SoldOutRec>,
    /// Calls that failed: start, qty (a failed hold may have been taken).
    errors: Vec<(Instant, u32, String)>,
    other: Vec<String>,
    probes: u64,
    probes_refused: u64,
    probes_held: u64,
}

/// One of the crowd: carts of 1 to 4 for fresh visitors until sold out.
async fn buyer(
    store: Store,
    event: EventId,
    mode: Mode,
    mut go: tokio::sync::watch::Receiver<bool>,
    deadline: Instant,
) -> BuyerLog {
    let _ = go.wait_for(|g| *g).await;
    let mut log = BuyerLog::default();
    let mut attempts = 0;
    'visitors: loop {
        let visitor = visitor();
        let mut qty = rand::random::<u32>() % CART_LIMIT + 1;
        loop {
            attempts += 1;
            if attempts > MAX_ATTEMPTS || Instant::now() >= deadline {
                break 'visitors;
            }
            CALLS.with(|c| c.set([0; 4]));
            let start = Instant::now();
            let r = store.hold(&event, &visitor, qty, None).await;
            let end = Instant::now();
            let calls = CALLS.with(Cell::get);
            match r {
                Ok(HoldOutcome::Held(v)) => {
                    log.held.push(HeldRec {
                        start,
                        end,
                        qty,
                        visitor: visitor.clone(),
                        shard: v.event,
                        calls,
                    });
                    if rand::random::<u32>().is_multiple_of(8) {
                        // One unit over the limit: must be refused.
                        log.probes += 1;
                        let over = CART_LIMIT - qty + 1;
                        let at = Instant::now();
                        match store.hold(&event, &visitor, over, None).await {
                            Ok(HoldOutcome::Held(_)) => log.probes_held += 1,
                            Ok(HoldOutcome::CartLimitExceeded { .. }) => log.probes_refused += 1,
                            Ok(other) => log.other.push(format!("probe: {other:?}")),
                            Err(e) => log.errors.push((at, over, format!("probe: {e}"))),
                        }
                    }
                    continue 'visitors;
                }
                Ok(HoldOutcome::SoldOut { .. }) if mode == Mode::Timed => {
                    log.sold_out.push(SoldOutRec {
                        end,
                        qty,
                        calls,
                        left: None,
                    });
                    if qty == 1 {
                        break 'visitors;
                    }
                    qty = 1;
                }
                Ok(HoldOutcome::SoldOut { .. }) => {
                    let left = match store.read(&event).await {
                        Ok(Some(s)) => s.available.unwrap_or(0) + s.in_transit,
                        Ok(None) => 0,
                        Err(e) => {
                            log.errors.push((end, 0, format!("read: {e}")));
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                    };
                    log.sold_out.push(SoldOutRec {
                        end,
                        qty,
                        calls,
                        left: Some(left),
                    });
                    if left == 0 {
                        break 'visitors;
                    }
                    // Units left (or landing): again, for what is left.
                    qty = qty.min(u32::try_from(left).unwrap_or(u32::MAX));
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Ok(other) => {
                    log.other.push(format!("{other:?}"));
                    continue 'visitors;
                }
                Err(e) => {
                    log.errors.push((start, qty, e.to_string()));
                    continue 'visitors;
                }
            }
        }
    }
    log
}

#[derive(Default)]
struct Sale {
    secs: f64,
    holds: u64,
    units: u64,
    unsold: u64,
    sold_out: u64,
    before_last_hold: u64,
    read_saw_cart: Option<u64>,
    provably_false: u64,
    provably_false_one: u64,
    /// Of those, answered after the router's last home attempt.
    provably_false_capped: u64,
    /// Sold-out answers after [`ROUTER_ROUNDS`] home attempts.
    capped: u64,
    /// Holds that moved units to their home first.
    pulled: u64,
    /// Store calls per hold answer, on average.
    calls_per_answer: f64,
    /// Sold-out answers from the last hold on, and over how long.
    after: (u64, f64),
    probes: u64,
    probes_refused: u64,
    errors: u64,
    transfers: Option<usize>,
    moved: Option<u64>,
    cpu: String,
    end: String,
}

/// One last-units sale on `event`, created here with `shards`.
#[allow(clippy::too_many_arguments)]
async fn sale(
    store: &Store,
    cluster: &RedisCluster,
    event: &EventId,
    shards: u32,
    buyers: usize,
    mode: Mode,
    args: &Args,
    failures: &mut Vec<String>,
) -> Sale {
    let units = args.units;
    create(store, event, units, shards).await;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let deadline = Instant::now() + Duration::from_secs(args.limit);
    let handles: Vec<_> = (0..buyers)
        .map(|_| {
            let (store, event, rx) = (store.clone(), event.clone(), rx.clone());
            let b = buyer(store, event, mode, rx, deadline);
            tokio::spawn(CALLS.scope(Cell::new([0; 4]), b))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = cpu(cluster);
    let start = Instant::now();
    tx.send(true).unwrap();
    let mut logs = Vec::new();
    for h in handles {
        logs.push(h.await.unwrap());
    }
    let busy = start.elapsed().as_secs_f64();
    let used = cores(&before, &cpu(cluster), busy);
    let mode_name = if mode == Mode::Timed {
        "timed"
    } else {
        "observed"
    };
    let what = format!("last units, {event} ({shards} shards, {buyers} buyers, {mode_name})");
    let mut fail = |m: String| failures.push(format!("{what}: {m}"));

    let held: Vec<&HeldRec> = logs.iter().flat_map(|l| &l.held).collect();
    let sold_out: Vec<&SoldOutRec> = logs.iter().flat_map(|l| &l.sold_out).collect();
    let errors: Vec<&(Instant, u32, String)> = logs.iter().flat_map(|l| &l.errors).collect();
    let last_end = held.iter().map(|h| h.end).max().unwrap_or(start);
    let mut s = Sale {
        secs: last_end.duration_since(start).as_secs_f64(),
        holds: held.len() as u64,
        units: held.iter().map(|h| u64::from(h.qty)).sum(),
        sold_out: sold_out.len() as u64,
        read_saw_cart: (mode == Mode::Observed).then_some(0),
        probes: logs.iter().map(|l| l.probes).sum(),
        probes_refused: logs.iter().map(|l| l.probes_refused).sum(),
        errors: errors.len() as u64,
        cpu: format!("{used} over {busy:.2} s"),
        ..Sale::default()
    };

    // Units sold by time t are at most those of the holds started by t
    // (a failed call counted as taken): what is left, at least the rest.
    let mut started: Vec<(Instant, u64)> = held
        .iter()
        .map(|h| (h.start, u64::from(h.qty)))
        .chain(errors.iter().map(|e| (e.0, u64::from(e.1))))
        .collect();
    started.sort_by_key(|x| x.0);
    let mut prefix = Vec::with_capacity(started.len() + 1);
    prefix.push(0u64);
    for (_, q) in &started {
        prefix.push(prefix.last().unwrap() + q);
    }
    for so in &sold_out {
        if so.end < last_end {
            s.before_last_hold += 1;
        }
        if let (Some(n), Some(left)) = (s.read_saw_cart.as_mut(), so.left)
            && left >= u64::from(so.qty)
        {
            *n += 1;
        }
        let n = started.partition_point(|x| x.0 < so.end);
        if units.saturating_sub(prefix[n]) >= u64::from(so.qty) {
            s.provably_false += 1;
            s.provably_false_one += u64::from(so.qty == 1);
            s.provably_false_capped += u64::from(so.calls[0] >= ROUTER_ROUNDS);
        }
        s.capped += u64::from(so.calls[0] >= ROUTER_ROUNDS);
    }
    s.pulled = held.iter().filter(|h| h.calls[2] > 0).count() as u64;
    let calls: u64 = held
        .iter()
        .map(|h| h.calls)
        .chain(sold_out.iter().map(|x| x.calls))
        .map(|c| u64::from(c.iter().sum::<u32>()))
        .sum();
    s.calls_per_answer = calls as f64 / (held.len() + sold_out.len()).max(1) as f64;
    let finish = sold_out.iter().map(|x| x.end).max().unwrap_or(last_end);
    s.after = (
        sold_out.iter().filter(|x| x.end >= last_end).count() as u64,
        finish.saturating_duration_since(last_end).as_secs_f64(),
    );

    let st = state(store, event).await;
    s.unsold = st.available.unwrap_or(0);
    s.end = format!(
        "held {}, available {:?}, in transit {}, invariant {}",
        st.held, st.available, st.in_transit, st.invariant_holds
    );
    if shards > 1 {
        let t: Vec<String> = st
            .shard_states
            .iter()
            .map(|x| x.total.to_string())
            .collect();
        s.end += &format!("; shard totals {}", t.join("/"));
    }
    if st.total != units || st.held + st.available.unwrap_or(0) != units || st.confirmed != 0 {
        fail(format!(
            "total {}, held {} + available {:?} + confirmed {}, want {units}",
            st.total, st.held, st.available, st.confirmed
        ));
    }
    if st.held != s.units {
        fail(format!(
            "store holds {}, answered held {}",
            st.held, s.units
        ));
    }
    if st.in_transit != 0 || !st.invariant_holds {
        fail(s.end.clone());
    }
    // Every unit sold where the buyers' rule guarantees it.
    if (shards == 1 || mode == Mode::Observed) && s.unsold != 0 {
        fail(format!("{} units left unsold", s.unsold));
    }
    let probes_held: u64 = logs.iter().map(|l| l.probes_held).sum();
    if probes_held > 0 {
        fail(format!("{probes_held} holds over the cart limit taken"));
    }
    let other: Vec<&String> = logs.iter().flat_map(|l| &l.other).collect();
    if let Some(o) = other.first() {
        fail(format!("{} unexpected answers, first {o}", other.len()));
    }
    if let Some(e) = errors.first() {
        fail(format!("{} store errors, first: {}", errors.len(), e.2));
    }

    // Carts as tracked here, and as every shard's visitors hash says.
    let mut tracked: HashMap<&str, (u32, &EventId)> = HashMap::new();
    for h in &held {
        let e = tracked.entry(&h.visitor).or_insert((0, &h.shard));
        e.0 += h.qty;
        if e.1 != &h.shard {
            fail(format!("visitor {} holds on two shards", h.visitor));
        }
        if h.shard != event.shard(home_shard(&h.visitor, shards)) {
            fail(format!(
                "visitor {} held on {}, not home",
                h.visitor, h.shard
            ));
        }
    }
    if let Some((v, (q, _))) = tracked.iter().find(|(_, (q, _))| *q > CART_LIMIT) {
        fail(format!("visitor {v} got {q} units (tracked)"));
    }
    let mut stored: HashMap<String, (u64, u32)> = HashMap::new();
    for k in 0..shards {
        let key = format!("sluice:{{{}}}:visitors", event.shard(k));
        let out = cluster.cli(&["HGETALL", &key]);
        for pair in out.lines().collect::<Vec<_>>().chunks(2) {
            if let [v, q] = pair {
                let e = stored.entry((*v).to_owned()).or_insert((0, k));
                e.0 += q.trim().parse::<u64>().unwrap_or(u64::MAX);
                if e.1 != k {
                    fail(format!("visitor {v} has units on two shards"));
                }
            }
        }
    }
    let stored_units: u64 = stored.values().map(|x| x.0).sum();
    if stored_units != st.held || stored.len() != tracked.len() {
        fail(format!(
            "visitors hashes: {} visitors, {stored_units} units; tracked {} visitors",
            stored.len(),
            tracked.len()
        ));
    }
    if let Some((v, (q, _))) = stored.iter().find(|(_, (q, _))| *q > u64::from(CART_LIMIT)) {
        fail(format!("visitor {v} has {q} units in the store"));
    }

    if shards > 1 {
        let first = split(units, shards);
        s.moved = Some(
            st.shard_states
                .iter()
                .zip(&first)
                .map(|(x, f)| x.total.saturating_sub(*f))
                .sum(),
        );
        s.transfers = Some(
            store
                .recent_transitions(event, 10_000_000)
                .await
                .expect("stream")
                .iter()
                .filter(|t| t.reason.as_deref() == Some("transfer_in"))
                .count(),
        );
    }
    flush(cluster);
    s
}

/// Prints sales side by side.
fn table(cols: &[(&str, &Sale)]) {
    let row = |name: &str, f: &dyn Fn(&Sale) -> String| {
        let cells: Vec<String> = cols.iter().map(|(_, s)| format!("{:>14}", f(s))).collect();
        println!("{name:<42}{}", cells.join(""));
    };
    let heads: Vec<String> = cols.iter().map(|(h, _)| format!("{h:>14}")).collect();
    println!("{:<42}{}", "", heads.join(""));
    let opt = |x: Option<u64>| x.map_or("-".into(), |n| n.to_string());
    row("time to sell out (last hold), s", &|x| {
        format!("{:.2}", x.secs)
    });
    row("holds (carts) / units", &|x| {
        format!("{}/{}", x.holds, x.units)
    });
    row("holds/s until then", &|x| {
        format!("{:.0}", x.holds as f64 / x.secs.max(1e-9))
    });
    row("units left unsold at the end", &|x| x.unsold.to_string());
    row("sold-out answers", &|x| x.sold_out.to_string());
    row("  before the last hold completed", &|x| {
        x.before_last_hold.to_string()
    });
    row("  next read showed units for the cart", &|x| {
        opt(x.read_saw_cart)
    });
    row("  cart's units provably unsold", &|x| {
        x.provably_false.to_string()
    });
    row("    of them for one unit", &|x| {
        x.provably_false_one.to_string()
    });
    row("    of them after the router's last try", &|x| {
        x.provably_false_capped.to_string()
    });
    row("  answered after the router's last try", &|x| {
        x.capped.to_string()
    });
    row("sold-out answers/s after the last hold", &|x| {
        format!("{:.0}", x.after.0 as f64 / x.after.1.max(1e-9))
    });
    row("cart-limit probes refused / made", &|x| {
        format!("{}/{}", x.probes_refused, x.probes)
    });
    row("store errors", &|x| x.errors.to_string());
    row("transfers (transfer_in entries)", &|x| {
        opt(x.transfers.map(|n| n as u64))
    });
    row("units moved off their first shard", &|x| opt(x.moved));
    row("holds that moved units home first", &|x| {
        x.pulled.to_string()
    });
    row("store calls per hold answer (mean)", &|x| {
        format!("{:.2}", x.calls_per_answer)
    });
    for (h, s) in cols {
        println!("  {h}: {}; {}", s.end, s.cpu);
    }
}

/// Shards of `event` per primary.
fn placement(cluster: &RedisCluster, event: &EventId, shards: u32) -> String {
    let mut by_port: Vec<(u16, u32)> = cluster.nodes.iter().map(|n| (n.port, 0)).collect();
    for k in 0..shards {
        let port = cluster.primary_for(&format!("sluice:{{{}}}:stock", event.shard(k)));
        if let Some(e) = by_port.iter_mut().find(|e| e.0 == port) {
            e.1 += 1;
        }
    }
    let v: Vec<String> = by_port.iter().map(|(_, n)| n.to_string()).collect();
    v.join("/")
}

/// This process's children: pid and command line (as the child shows
/// it: redis-server rewrites its own to `redis-server 127.0.0.1:PORT`).
fn children() -> Vec<(u32, String)> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the command name: state, ppid, …
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1));
        if ppid == Some(me.as_str()) {
            let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            out.push((pid, String::from_utf8_lossy(&cmd).replace('\0', " ")));
        }
    }
    out
}

/// The harness's cluster, bounded. `redis-cli --cluster create` waits
/// for every node to know every other, and on a loaded machine a
/// handshake can time out (the harness runs nodes with a 1 s node
/// timeout), so it may wait for ever: after 20 s every node is introduced
/// to every other again (`CLUSTER MEET`); after 120 s the servers (this
/// process's children) are stopped and the bench exits 2.
fn start_cluster() -> RedisCluster {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(RedisCluster::start(3, 0));
    });
    let begun = Instant::now();
    let mut met = false;
    let stop = |why: &str| -> ! {
        for (pid, _) in children() {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
        }
        println!("FAILED: {why}; servers stopped");
        std::process::exit(2);
    };
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Some(cluster)) => return cluster,
            Ok(None) => stop("no redis-server or redis-cli"),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                stop("the cluster did not start")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if !met && begun.elapsed() > Duration::from_secs(20) {
            met = true;
            let ports: Vec<u16> = children()
                .iter()
                .filter(|(_, cmd)| cmd.starts_with("redis-server"))
                .filter_map(|(_, cmd)| {
                    let addr = cmd
                        .split_whitespace()
                        .find(|w| w.starts_with("127.0.0.1:"))?;
                    addr.trim_start_matches("127.0.0.1:").parse().ok()
                })
                .collect();
            println!("cluster not formed after 20 s: introducing nodes {ports:?} again");
            for a in &ports {
                for b in &ports {
                    if a != b {
                        cli(*a, None, &["CLUSTER", "MEET", "127.0.0.1", &b.to_string()]);
                    }
                }
            }
        }
        if begun.elapsed() > Duration::from_secs(120) {
            stop("the cluster did not form in 120 s");
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("$ {}", std::env::args().collect::<Vec<_>>().join(" "));
    println!(
        "seconds={} tasks={} rounds={} crowd={} units={} limit={}s; {cores} cores for this \
         process and all three primaries",
        args.seconds, args.tasks, args.rounds, args.crowd, args.units, args.limit
    );
    let cluster = start_cluster();
    // Every phase is bounded; this bounds the whole, and a signal too
    // stops the servers (a process killed outright would leave them).
    let bound =
        Duration::from_secs(2 * args.seconds * args.rounds as u64 + 2 + 6 * args.limit + 60);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    let outcome = tokio::select! {
        failures = bench(&args, &cluster) => Ok(failures),
        _ = tokio::signal::ctrl_c() => Err("interrupted"),
        _ = term.recv() => Err("terminated"),
        () = tokio::time::sleep(bound) => Err("time bound passed"),
    };
    drop(cluster);
    match outcome {
        Ok(failures) if failures.is_empty() => println!("checks: all held"),
        Ok(failures) => {
            for f in &failures {
                println!("FAILED: {f}");
            }
            std::process::exit(1);
        }
        Err(why) => {
            println!("FAILED: {why} after {bound:?}; servers stopped");
            std::process::exit(2);
        }
    }
}

/// Both phases; returns the checks that failed.
async fn bench(args: &Args, cluster: &RedisCluster) -> Vec<String> {
    // Ten thousand calls in flight on one multiplexed connection can
    // queue past the gateway's 2 s bound, and a timed-out hold is
    // ambiguous: this bench waits.
    let config = RedisConfig {
        timeout: Duration::from_secs(30),
        ..RedisConfig::new(cluster.url())
    };
    let store = Sharded::new(Observed {
        inner: RedisInventory::connect(&config).await.expect("connect"),
        observer: Counter,
    });
    let plain = EventId::parse("plain").unwrap();
    let hot = EventId::parse("hot").unwrap();
    println!(
        "3 primaries, no replicas; keys per primary: \"plain\" {}, \"hot\" (8 shards) {}",
        placement(cluster, &plain, 1),
        placement(cluster, &hot, SHARDS)
    );
    let mut failures = Vec::new();

    // Warm-up: scripts loaded on every primary, connections open.
    for (event, shards) in [(&plain, 1), (&hot, SHARDS)] {
        create(&store, event, ENDLESS, shards).await;
        load(&store, event, 1.0, args.tasks).await;
        flush(cluster);
    }

    println!(
        "\n== throughput: {} tasks, 1 unit per fresh visitor, {} s per round",
        args.tasks, args.seconds
    );
    let (mut p, mut s) = (Vec::new(), Vec::new());
    for r in 1..=args.rounds {
        for (event, shards) in [(&plain, 1), (&hot, SHARDS)] {
            let (rate, used) = round(&store, cluster, event, shards, args, &mut failures).await;
            let name = if shards == 1 { "plain" } else { "8 shards" };
            println!("round {r}  {name:<9} {rate:>8.0} holds/s   ({used})");
            if shards == 1 { &mut p } else { &mut s }.push(rate);
        }
    }
    let (pm, sm) = (median(&p), median(&s));
    println!("median   plain     {pm:>8.0} holds/s");
    println!("median   8 shards  {sm:>8.0} holds/s");
    println!("ratio    8 shards / plain = {:.2}", sm / pm);

    println!(
        "\n== last units: {} units, cart limit {CART_LIMIT} (carts of 1-4), {} buyers at once",
        args.units, args.crowd
    );
    let (crowd, few) = (args.crowd, args.tasks);
    let f = &mut failures;
    let tp = sale(&store, cluster, &plain, 1, crowd, Mode::Timed, args, f).await;
    let ts = sale(&store, cluster, &hot, SHARDS, crowd, Mode::Timed, args, f).await;
    let op = sale(&store, cluster, &plain, 1, crowd, Mode::Observed, args, f).await;
    let os = sale(
        &store,
        cluster,
        &hot,
        SHARDS,
        crowd,
        Mode::Observed,
        args,
        f,
    )
    .await;
    let fp = sale(&store, cluster, &plain, 1, few, Mode::Timed, args, f).await;
    let fs = sale(&store, cluster, &hot, SHARDS, few, Mode::Timed, args, f).await;
    println!("-- timed: a buyer refused one unit stops");
    table(&[("plain", &tp), ("8 shards", &ts)]);
    println!("-- observed: a read after every sold-out; again while units are left");
    table(&[("plain", &op), ("8 shards", &os)]);
    println!("-- timed, {few} buyers");
    table(&[("plain", &fp), ("8 shards", &fs)]);
    println!(
        "ratio    sell-out time 8 shards / plain: timed {:.2}, observed {:.2}, {few} buyers {:.2}",
        ts.secs / tp.secs.max(1e-9),
        os.secs / op.secs.max(1e-9),
        fs.secs / fp.secs.max(1e-9)
    );
    println!(
        "RESULT throughput_plain={pm:.0} throughput_sharded={sm:.0} throughput_ratio={:.2} \
         sellout_plain_s={:.2} sellout_sharded_s={:.2} sellout_ratio={:.2} \
         false_soldout_sharded={} false_soldout_sharded_observed={} \
         false_soldout_sharded_few={} unsold_sharded={} unsold_sharded_few={}",
        sm / pm,
        tp.secs,
        ts.secs,
        ts.secs / tp.secs.max(1e-9),
        ts.provably_false,
        os.provably_false,
        fs.provably_false,
        ts.unsold,
        fs.unsold
    );
    let goal: Vec<String> = [("timed", &ts), ("observed", &os), ("few buyers", &fs)]
        .iter()
        .filter(|(_, s)| s.provably_false + s.unsold > 0)
        .map(|(n, s)| {
            format!(
                "{n}: {} provably false sold-outs, {} units unsold",
                s.provably_false, s.unsold
            )
        })
        .collect();
    for g in &goal {
        println!("goal missed (no false sold-out), 8 shards, {g}");
    }
    failures
}
