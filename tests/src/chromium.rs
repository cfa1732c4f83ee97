//! Headless Chromium over WebDriver: Debian's `chromium` and
//! `chromedriver`, driven with fantoccini. One [`Browser`] is a
//! chromedriver child process with one session; both end when it is
//! dropped (chromedriver's whole process group, Chromium included:
//! [`crate::process`]), and its temporary profile is removed.
//!
//! The same [`Browser`] drives WebKit ([`Browser::start_webkit`]: Safari's
//! engine, Debian's `webkit2gtk-driver`, its `WebKitWebDriver` running
//! WebKitGTK's MiniBrowser on an `Xvfb` display of its own).
//!
//! Without chromium or chromedriver, [`Browser::start`] prints a loud
//! `SKIPPED` line and answers `None`, except under `CI=true`, where that is
//! a failure ([`crate::browser::installed`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::browser::{ONE_BROWSER, artifacts_dir, installed};
use crate::process::{kill_group, own_group};
use crate::redis_server::free_port;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const WEBKIT_DRIVER: &str = "/usr/bin/WebKitWebDriver";
const MINIBROWSER: &str = "/usr/lib/x86_64-linux-gnu/webkit2gtk-4.1/MiniBrowser";
const XVFB: &str = "/usr/bin/Xvfb";

/// A chromedriver child process with one headless Chromium session.
pub struct Browser {
    client: Option<Client>,
    _turn: tokio::sync::MutexGuard<'static, ()>,
    driver: Child,
    /// The X display of a WebKit session.
    xvfb: Option<Child>,
    profile: PathBuf,
    artifacts: PathBuf,
    shots: u32,
}

impl Browser {
    /// Starts chromedriver and a session whose window is `window` CSS
    /// pixels, waiting for the test binary's other browser to finish
    /// first; `None` (after the loud SKIPPED line) when the machine has no
    /// Chromium. Screenshots go to `target/browser-artifacts/<test>/`.
    pub async fn start(test: &str, window: (u32, u32)) -> Option<Browser> {
        if !installed(
            test,
            &[CHROMIUM, CHROMEDRIVER],
            "apt-get install chromium chromium-driver",
        ) {
            return None;
        }
        let turn = ONE_BROWSER.lock().await;
        let port = free_port();
        let driver = own_group(&mut Command::new(CHROMEDRIVER))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = std::env::temp_dir().join(format!(
            "sluice-chromium-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let b = Browser {
            client: None,
            _turn: turn,
            driver,
            xvfb: None,
            profile,
            artifacts: artifacts_dir(test),
            shots: 0,
        };
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1",
                    format!("--user-data-dir={}", b.profile.display()),
                    format!("--window-size={},{}", window.0, window.1),
                ],
            },
        });
        Some(b.connect(port, caps, "chromedriver").await)
    }

    /// [`Browser::start`] in WebKit: WebKitGTK's MiniBrowser driven by
    /// `WebKitWebDriver` on an `Xvfb` display of its own (`window` is the
    /// screen's size). `None` (after the loud SKIPPED line) without them.
    pub async fn start_webkit(test: &str, window: (u32, u32)) -> Option<Browser> {
        if !installed(
            test,
            &[WEBKIT_DRIVER, MINIBROWSER, XVFB],
            "apt-get install webkit2gtk-driver xvfb",
        ) {
            return None;
        }
        let turn = ONE_BROWSER.lock().await;
        // A display number nobody uses.
        let display = (90..400)
            .map(|_| 90 + rand::random::<u32>() % 300)
            .find(|n| !Path::new(&format!("/tmp/.X11-unix/X{n}")).exists())
            .expect("a free X display");
        let xvfb = own_group(&mut Command::new(XVFB))
            .args([
                format!(":{display}"),
                "-screen".into(),
                "0".into(),
                format!("{}x{}x24", window.0.max(640), window.1.max(480)),
                "-nolisten".into(),
                "tcp".into(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start Xvfb");
        let socket = format!("/tmp/.X11-unix/X{display}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Path::new(&socket).exists() {
            assert!(Instant::now() < deadline, "Xvfb :{display} never came up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let port = free_port();
        let driver = own_group(&mut Command::new(WEBKIT_DRIVER))
            .arg(format!("--port={port}"))
            .env("DISPLAY", format!(":{display}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start WebKitWebDriver");
        let b = Browser {
            client: None,
            _turn: turn,
            driver,
            xvfb: Some(xvfb),
            profile: std::env::temp_dir().join("sluice-webkit-none"),
            artifacts: artifacts_dir(test),
            shots: 0,
        };
        let caps = json!({
            "browserName": "MiniBrowser",
            "webkitgtk:browserOptions": {
                "binary": MINIBROWSER,
                "args": ["--automation"],
            },
        });
        let b = b.connect(port, caps, "WebKitWebDriver").await;
        let _ = b.c().set_window_size(window.0, window.1).await;
        Some(b)
    }

    /// A WebDriver session with `caps` from the driver on `port`.
    async fn connect(mut self, port: u16, caps: Value, driver: &str) -> Browser {
        let Value::Object(caps) = caps else {
            unreachable!()
        };
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no WebDriver session from {driver} within 20 s: {e}"),
            }
        };
        self.client = Some(client);
        self
    }

    /// The WebDriver session.
    pub fn c(&self) -> &Client {
        self.client.as_ref().expect("session")
    }

    /// Where this test's screenshots and other artifacts go.
    pub fn artifacts(&self) -> &Path {
        &self.artifacts
    }

    /// Saves a screenshot named `NN-name.png`; returns its path.
    pub async fn shot(&mut self, name: &str) -> PathBuf {
        self.shots += 1;
        let png = self.c().screenshot().await.expect("screenshot");
        let path = self.artifacts.join(format!("{:02}-{name}.png", self.shots));
        std::fs::write(&path, png).expect("write screenshot");
        eprintln!("screenshot: {}", path.display());
        path
    }

    /// The rendered text of the element matching `css` (WebDriver's
    /// element text: "" for a hidden one), or "" when there is none.
    pub async fn text(&self, css: &str) -> String {
        match self.c().find(Locator::Css(css)).await {
            Ok(e) => e.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// The `textContent` of the element matching `css` ("" when there is
    /// none), read in the page so a re-rendered element is never stale.
    pub async fn text_content(&self, css: &str) -> String {
        self.c()
            .execute(
                "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';",
                vec![json!(css)],
            )
            .await
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// The current URL, or "" when the browser cannot say.
    pub async fn url(&self) -> String {
        self.c()
            .current_url()
            .await
            .map(|u| u.to_string())
            .unwrap_or_default()
    }

    /// Clicks the element matching `css`.
    pub async fn click(&self, css: &str) {
        self.c()
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Replaces an input's value by typing, as a person would.
    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self
            .c()
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"));
        e.clear().await.expect("clear");
        e.send_keys(text).await.expect("type");
    }

    /// Runs `script` (a function body: `return …`) in the page.
    pub async fn js(&self, script: &str) -> Value {
        self.c()
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("script {script}: {e}"))
    }

    /// Ends the session politely (dropping kills chromedriver anyway).
    pub async fn close(mut self) {
        if let Some(c) = self.client.take() {
            let _ = c.close().await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The driver's group: the browser it started, with its
        // renderers, ends with it.
        kill_group(&mut self.driver);
        if let Some(x) = &mut self.xvfb {
            kill_group(x);
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl crate::shop_path::Page for Browser {
    async fn text(&self, css: &str) -> String {
        Browser::text(self, css).await
    }

    async fn exists(&self, css: &str) -> bool {
        self.c().find(Locator::Css(css)).await.is_ok()
    }

    async fn visible(&self, css: &str) -> bool {
        match self.c().find(Locator::Css(css)).await {
            Ok(e) => e.is_displayed().await.unwrap_or(false),
            Err(_) => false,
        }
    }

    async fn click(&self, css: &str) {
        Browser::click(self, css).await;
    }

    async fn select(&self, css: &str, value: &str) {
        self.c()
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
            .select_by_value(value)
            .await
            .unwrap_or_else(|e| panic!("choose {value} in {css}: {e}"));
    }

    async fn url(&self) -> String {
        Browser::url(self).await
    }

    async fn shot(&mut self, name: &str) -> PathBuf {
        Browser::shot(self, name).await
    }

    async fn attr(&self, css: &str, name: &str) -> String {
        match self.c().find(Locator::Css(css)).await {
            Ok(e) => e.attr(name).await.ok().flatten().unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    async fn goto(&self, url: &str) {
        self.c().goto(url).await.expect("open the URL");
    }

    async fn clear_cookies(&self) {
        self.c().delete_all_cookies().await.expect("delete cookies");
    }
}
