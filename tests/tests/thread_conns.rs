//! Per-thread Redis connections (`sluice_redis::local`), against a real
//! `redis-server` of the test's own: a thread that opted in runs its
//! commands on a connection of its own (told apart by `CLIENT ID`), other
//! threads share one, the thread's connection goes with the thread, and a
//! restart of Redis (killed, its data gone) never fails a command on a
//! thread's connection once the shared one works again: the connections
//! that sat idle through the restart are checked with a `PING` before a
//! command of a visitor's runs on them. Failures are counted per server: a
//! server that fails over and over leaves another server's threads on
//! their own connections.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use sluice_redis::{RedisConn, RedisTls, RedisUrl, ThreadConns};
use sluice_tests::redis_server::RedisServer;

const TIMEOUT: Duration = Duration::from_secs(2);

async fn client_id(conn: &mut RedisConn) -> redis::RedisResult<i64> {
    redis::cmd("CLIENT").arg("ID").query_async(conn).await
}

async fn open(server: &RedisServer) -> ThreadConns {
    let url = RedisUrl::parse(&server.url()).unwrap();
    let shared = url.connect(TIMEOUT).await.unwrap();
    ThreadConns::new(shared, &url, &RedisTls::default(), TIMEOUT)
}

fn connected_clients(server: &RedisServer) -> i64 {
    let info = server.command("INFO clients");
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no connected_clients in {info:?}"))
}

/// Runs `f` on a new thread that opted in, inside a current-thread runtime
/// of its own (as the gateway's I/O threads are).
fn on_io_thread<T: Send + 'static>(
    f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>> + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(move || {
        sluice_redis::opt_in_thread();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(f())
    })
}

/// Commands on `conns` from this thread until one runs on a connection
/// other than `shared_id` (within 5 s); that connection's id.
async fn own_id(conns: &ThreadConns, shared_id: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let id = client_id(&mut conns.get()).await.unwrap();
        if id != shared_id {
            return id;
        }
        assert!(
            Instant::now() < deadline,
            "this thread never got a connection of its own"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opted_in_threads_get_a_connection_each_others_share_one() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conns = open(&server).await;
    let shared_id = client_id(&mut conns.shared().clone()).await.unwrap();
    let before = connected_clients(&server);

    // this thread did not opt in: always the shared connection
    for _ in 0..50 {
        assert_eq!(client_id(&mut conns.get()).await.unwrap(), shared_id);
    }

    // two I/O threads: one connection each, kept for every later command
    let barrier = Arc::new(Barrier::new(3));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let conns = conns.clone();
            let barrier = barrier.clone();
            on_io_thread(move || {
                Box::pin(async move {
                    let id = own_id(&conns, shared_id).await;
                    for _ in 0..200 {
                        assert_eq!(client_id(&mut conns.get()).await.unwrap(), id);
                    }
                    // hold the connection open while the clients are
                    // counted: between two waits (blocking this thread's
                    // runtime: nothing else runs on it)
                    barrier.wait();
                    barrier.wait();
                    id
                })
            })
        })
        .collect();
    // both threads have theirs (the barrier), counted by the server
    let start = Instant::now();
    let b = barrier.clone();
    tokio::task::spawn_blocking(move || b.wait()).await.unwrap();
    let during = connected_clients(&server);
    let b = barrier.clone();
    tokio::task::spawn_blocking(move || b.wait()).await.unwrap();
    let ids: Vec<i64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_ne!(ids[0], ids[1], "each thread its own connection");
    assert!(!ids.contains(&shared_id));
    assert_eq!(
        during,
        before + 2,
        "one connection per opted-in thread: {during} clients, {before} before"
    );

    // gone with their threads (the runtimes dropped)
    loop {
        let now = connected_clients(&server);
        if now == before {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the threads' connections outlived them: {now} clients, {before} before"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // and the shared one still works
    assert_eq!(
        client_id(&mut conns.shared().clone()).await.unwrap(),
        shared_id
    );
}

/// `n` ready signals, polled (blocking a worker of the test's runtime
/// could stall the shared connection's reader).
async fn wait_ready(rx: &std::sync::mpsc::Receiver<()>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = 0;
    while got < n {
        match rx.try_recv() {
            Ok(()) => got += 1,
            Err(_) => {
                assert!(Instant::now() < deadline, "the I/O threads never got ready");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_fails_no_command_on_an_idle_thread_connection() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let conns = open(&server).await;
    let shared_id = client_id(&mut conns.shared().clone()).await.unwrap();

    // Each round: the I/O threads have connections of their own and sit
    // idle; Redis is killed and comes back empty; the shared connection is
    // used until it works again (as the gateway's ticks do); then every
    // command from the I/O threads must succeed, on whichever connection.
    let rounds = 3;
    let go: Vec<_> = (0..2).map(|_| std::sync::mpsc::channel::<bool>()).collect();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let mut senders = Vec::new();
    let mut threads = Vec::new();
    for (tx, rx) in go {
        senders.push(tx);
        let conns = conns.clone();
        let ready = ready_tx.clone();
        threads.push(on_io_thread(move || {
            Box::pin(async move {
                let mut failures = Vec::new();
                let mut own = 0u32;
                loop {
                    // a connection of its own before Redis goes
                    let deadline = Instant::now() + Duration::from_secs(5);
                    loop {
                        let id = client_id(&mut conns.get()).await;
                        if id.is_ok_and(|id| id != shared_id) {
                            break;
                        }
                        assert!(Instant::now() < deadline, "no connection of its own");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    ready.send(()).unwrap();
                    // idle while Redis restarts
                    let more = rx.recv().unwrap(); // blocks this thread's runtime too
                    if !more {
                        return (failures, own);
                    }
                    // a burst right after: nothing may fail
                    for i in 0..300 {
                        let mut c = conns.get();
                        match redis::cmd("INCR")
                            .arg("after-restart")
                            .query_async::<i64>(&mut c)
                            .await
                        {
                            Ok(_) => {}
                            Err(e) => failures.push(format!("command {i}: {e}")),
                        }
                        if client_id(&mut conns.get())
                            .await
                            .is_ok_and(|id| id != shared_id)
                        {
                            own += 1;
                        }
                    }
                }
            })
        }));
    }
    drop(ready_tx);
    let mut shared = conns.shared().clone();
    for round in 0..rounds {
        wait_ready(&ready_rx, senders.len()).await;
        server.restart_empty();
        // the shared connection works again (its first command after the
        // restart may fail: it has not tried the new server yet)
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut shared_failed = 0;
        while redis::cmd("PING")
            .query_async::<String>(&mut shared)
            .await
            .is_err()
        {
            shared_failed += 1;
            assert!(
                Instant::now() < deadline,
                "round {round}: Redis never came back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            shared_failed >= 1,
            "round {round}: the restart went unnoticed by the shared connection"
        );
        for tx in &senders {
            tx.send(true).unwrap();
        }
    }
    // the last burst done (each thread back on its own connection): stop
    wait_ready(&ready_rx, senders.len()).await;
    for tx in &senders {
        tx.send(false).unwrap();
    }
    for t in threads {
        let (failures, own) = t.join().unwrap();
        assert!(
            failures.is_empty(),
            "commands failed after the restart: {failures:?}"
        );
        // (each went back to a connection of its own before saying it
        // was ready for the next round: the top of its loop)
        eprintln!("commands after restarts on a thread's own connection: {own}");
    }
    // everything the threads sent after the last restart arrived
    let n: i64 = redis::cmd("GET")
        .arg("after-restart")
        .query_async(&mut shared)
        .await
        .unwrap();
    assert_eq!(n, 2 * 300);
}

/// Another server failing (killed, every command to it refused) leaves
/// this server's thread connections in use: failures are counted per
/// server. Counted process-wide, as they once were, the first command
/// after each failure went back to the shared connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_servers_failures_leave_this_servers_threads_on_their_own() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let Some(mut other) = RedisServer::start() else {
        return;
    };
    let conns = open(&server).await;
    let shared_id = client_id(&mut conns.shared().clone()).await.unwrap();
    let other_url = RedisUrl::parse(&other.url()).unwrap();
    let mut failing = other_url.connect(TIMEOUT).await.unwrap();
    client_id(&mut failing).await.unwrap();
    other.kill();

    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let (fail_tx, fail_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let thread = on_io_thread(move || {
        Box::pin(async move {
            let id = own_id(&conns, shared_id).await;
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            // after each failure of the other server, the very next command
            // still runs on this thread's own connection
            let mut fail_rx = fail_rx;
            let mut on_shared = 0;
            let mut rounds = 0;
            while fail_rx.recv().await.is_some() {
                rounds += 1;
                if client_id(&mut conns.get()).await.unwrap() != id {
                    on_shared += 1;
                }
                done_tx.send(()).unwrap();
            }
            (rounds, on_shared)
        })
    });
    wait_ready(&ready_rx, 1).await;
    go_tx.send(()).unwrap();
    for round in 0..20 {
        let e = redis::cmd("PING")
            .query_async::<String>(&mut failing)
            .await
            .expect_err("the other server is down");
        assert!(
            e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal(),
            "round {round}: not a connection failure: {e}"
        );
        fail_tx.send(()).unwrap();
        done_rx.recv().await.unwrap();
    }
    drop(fail_tx);
    let (rounds, on_shared) = tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
    assert_eq!(rounds, 20);
    assert_eq!(
        on_shared, 0,
        "the other server's failures sent this thread back to the shared connection"
    );
}
