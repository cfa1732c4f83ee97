//! The real `sluice` binary as a child process: the embedded default and
//! graceful shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_tests::GatewayProcess;
use sluice_tests::client::TestClient;
use sluice_tests::origin::TestOrigin;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn embedded_default_serves_the_demo_shop() {
    let gw = GatewayProcess::start(&[]);
    let client = TestClient::new();
    let res = client
        .get(&format!("{}/_sluice/healthz", gw.url()), &[])
        .await;
    assert_eq!(res.status, 200);
    let res = client
        .get(&format!("{}/_sluice/readyz", gw.url()), &[])
        .await;
    assert_eq!(res.status, 200);
    let res = client
        .get(
            &format!("{}/echo/hi?x=1", gw.url()),
            &[("accept", "application/json")],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let v = res.json();
    assert_eq!(v["path"], "/echo/hi");
    assert_eq!(v["query"], "x=1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_an_in_flight_request_and_exits_0() {
    let origin = TestOrigin::start().await;
    let mut gw = GatewayProcess::start(&["--origin", &origin.url()]);
    // An idle keep-alive connection: the drain must close it at once, not
    // wait out the 30 s grace period for it.
    let mut idle = tokio::net::TcpStream::connect(gw.url().trim_start_matches("http://"))
        .await
        .unwrap();
    idle.write_all(b"GET /echo/idle HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let url = format!("{}/slow/1500", gw.url());
    let in_flight = tokio::spawn(async move { TestClient::new().get(&url, &[]).await });
    // let the request reach the origin, then ask the gateway to stop
    tokio::time::sleep(Duration::from_millis(400)).await;
    gw.signal("TERM");
    let res = in_flight.await.unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(res.text(), "slept");
    let closed = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the idle connection was not closed by the drain: {closed:?}"
    );
    let code = tokio::task::spawn_blocking(move || gw.wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(code, Some(0));
}
