//! The real `sluice` binary as a child process: the embedded default and
//! graceful shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_tests::GatewayProcess;
use sluice_tests::client::TestClient;
use sluice_tests::origin::TestOrigin;

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
    let url = format!("{}/slow/1500", gw.url());
    let in_flight = tokio::spawn(async move { TestClient::new().get(&url, &[]).await });
    // let the request reach the origin, then ask the gateway to stop
    tokio::time::sleep(Duration::from_millis(400)).await;
    gw.signal("TERM");
    let res = in_flight.await.unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(res.text(), "slept");
    let code = tokio::task::spawn_blocking(move || gw.wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(code, Some(0));
}
