//! Headless Firefox over WebDriver BiDi, without geckodriver (Debian has
//! none): Firefox ≥ 129 serves BiDi itself on a WebSocket when started with
//! `--remote-debugging-port`. [`Firefox::start`] runs Debian's
//! `firefox-esr` with a fresh temporary profile, reads the WebSocket
//! address it prints, opens a session on `ws://…/session` and keeps the
//! first tab as the current browsing context. Dropping it kills Firefox
//! (its whole process group: the content processes too) and removes the
//! profile.
//!
//! Only what the tests need: navigate and reload (waiting for `complete`),
//! evaluate JavaScript that answers JSON, set the viewport, screenshots,
//! tabs, preload scripts whose `channel` argument reports back as
//! `script.message` events, and the `log.entryAdded` entries. Every wait is
//! bounded: a command not answered within 30 s is an error.
//!
//! Without Firefox, [`Firefox::start`] prints a loud `SKIPPED` line and
//! answers `None`, except under `CI=true`, where that is a failure
//! ([`crate::browser::installed`]).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

use crate::browser::{ONE_BROWSER, artifacts_dir, installed};
use crate::process::{kill_group, own_group};

/// Debian's Firefox ESR.
pub const FIREFOX: &str = "/usr/bin/firefox-esr";
/// The longest any one BiDi command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest Firefox may take to open its WebSocket.
const START_TIMEOUT: Duration = Duration::from_secs(40);

/// Preferences for a quiet, deterministic test profile (the remote agent
/// sets its own recommended ones on top): no first-run pages, no proxy
/// taken from the environment, no background calls home, English.
const USER_JS: &str = r#"
user_pref("browser.shell.checkDefaultBrowser", false);
user_pref("browser.startup.page", 0);
user_pref("browser.startup.homepage_override.mstone", "ignore");
user_pref("datareporting.policy.dataSubmissionEnabled", false);
user_pref("toolkit.telemetry.reportingpolicy.firstRun", false);
user_pref("app.update.disabledForTesting", true);
user_pref("network.proxy.type", 0);
user_pref("services.settings.server", "http://127.0.0.1:9/remote-settings");
user_pref("browser.safebrowsing.update.enabled", false);
user_pref("extensions.update.enabled", false);
user_pref("app.normandy.enabled", false);
user_pref("intl.accept_languages", "en-US, en");
"#;

/// A command for the connection task, with where its answer goes.
type Outgoing = (Value, oneshot::Sender<Value>);

/// A headless Firefox with one WebDriver BiDi session.
pub struct Firefox {
    child: Child,
    profile: PathBuf,
    commands: mpsc::UnboundedSender<Outgoing>,
    events: Arc<Mutex<Vec<Value>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    context: String,
    artifacts: PathBuf,
    shots: u32,
    connection: tokio::task::JoinHandle<()>,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Firefox {
    /// Starts Firefox and a BiDi session subscribed to `log.entryAdded`
    /// and `script.message`, waiting for the test binary's other browser
    /// to finish first; `None` (after the loud SKIPPED line) when the
    /// machine has no Firefox. Screenshots go to
    /// `target/browser-artifacts/<test>/`.
    pub async fn start(test: &str) -> Option<Firefox> {
        if !installed(test, &[FIREFOX], "apt-get install firefox-esr") {
            return None;
        }
        let turn = ONE_BROWSER.lock().await;
        let profile = std::env::temp_dir().join(format!(
            "sluice-firefox-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&profile).expect("profile dir");
        std::fs::write(profile.join("user.js"), USER_JS).expect("user.js");
        let mut child = own_group(&mut Command::new(FIREFOX))
            .arg("-headless")
            .arg("-no-remote")
            .arg("-profile")
            .arg(&profile)
            // port 0: Firefox picks a free one and prints it
            .args(["--remote-debugging-port", "0"])
            .env("MOZ_CRASHREPORTER_DISABLE", "1")
            .env_remove("DISPLAY")
            .env_remove("WAYLAND_DISPLAY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start firefox");

        // Firefox's stderr: the WebSocket address, then kept (the last
        // lines) for a failure message; always drained, so it never blocks.
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let pipe = child.stderr.take().expect("stderr");
            let kept = stderr.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if let Some(at) = line.find("WebDriver BiDi listening on ") {
                        let url = line[at + "WebDriver BiDi listening on ".len()..].trim();
                        let _ = tx.send(url.to_owned());
                    }
                    let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                    if kept.len() >= 200 {
                        kept.remove(0);
                    }
                    kept.push(line);
                }
            });
        }
        let ws_url = match rx.recv_timeout(START_TIMEOUT) {
            Ok(url) => url,
            Err(_) => {
                let status = child.try_wait().ok().flatten();
                kill_group(&mut child);
                let log = stderr.lock().unwrap_or_else(|e| e.into_inner()).join("\n");
                panic!(
                    "firefox printed no WebDriver BiDi address within {START_TIMEOUT:?} (exit: {status:?}):\n{log}"
                );
            }
        };
        let connected = tokio::time::timeout(
            COMMAND_TIMEOUT,
            tokio_tungstenite::connect_async(format!("{ws_url}/session")),
        )
        .await;
        let ws = match connected {
            Ok(Ok((ws, _))) => ws,
            other => {
                kill_group(&mut child);
                panic!("no BiDi WebSocket at {ws_url}/session: {other:?}");
            }
        };
        let events = Arc::new(Mutex::new(Vec::new()));
        let (commands, outgoing) = mpsc::unbounded_channel();
        let connection = tokio::spawn(connection(ws, outgoing, events.clone()));
        let mut ff = Firefox {
            child,
            profile,
            commands,
            events,
            stderr,
            context: String::new(),
            artifacts: artifacts_dir(test),
            shots: 0,
            connection,
            _turn: turn,
        };
        let session = ff
            .command("session.new", json!({"capabilities": {}}))
            .await
            .expect("session.new");
        eprintln!(
            "firefox: {} {}",
            session["capabilities"]["browserName"]
                .as_str()
                .unwrap_or("?"),
            session["capabilities"]["browserVersion"]
                .as_str()
                .unwrap_or("?")
        );
        ff.command(
            "session.subscribe",
            json!({"events": ["log.entryAdded", "script.message"]}),
        )
        .await
        .expect("session.subscribe");
        let tree = ff
            .command("browsingContext.getTree", json!({"maxDepth": 0}))
            .await
            .expect("browsingContext.getTree");
        ff.context = tree["contexts"][0]["context"]
            .as_str()
            .expect("a top-level browsing context")
            .to_owned();
        Some(ff)
    }

    /// Sends one BiDi command and answers its `result`, or the error
    /// Firefox gave, or a timeout after 30 s.
    pub async fn command(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send((json!({"method": method, "params": params}), tx))
            .map_err(|_| anyhow!("{method}: the BiDi connection is closed"))?;
        let answer = tokio::time::timeout(COMMAND_TIMEOUT, rx)
            .await
            .with_context(|| format!("{method}: no answer within {COMMAND_TIMEOUT:?}"))?
            .map_err(|_| anyhow!("{method}: the BiDi connection closed"))?;
        if answer["type"] == "success" {
            Ok(answer["result"].clone())
        } else {
            bail!("{method}: {} ({})", answer["error"], answer["message"])
        }
    }

    /// The current browsing context (a tab).
    pub fn context(&self) -> &str {
        &self.context
    }

    /// Makes `context` the one the other methods act on.
    pub fn switch_to(&mut self, context: &str) {
        context.clone_into(&mut self.context);
    }

    /// Opens a new tab and answers its context (the current one stays).
    pub async fn new_tab(&self) -> String {
        let r = self
            .command("browsingContext.create", json!({"type": "tab"}))
            .await
            .expect("browsingContext.create");
        r["context"].as_str().expect("context").to_owned()
    }

    /// Closes a tab.
    pub async fn close_tab(&self, context: &str) {
        self.command("browsingContext.close", json!({"context": context}))
            .await
            .expect("browsingContext.close");
    }

    /// Opens `url` and waits for the page's `load`.
    pub async fn goto(&self, url: &str) {
        self.command(
            "browsingContext.navigate",
            json!({"context": self.context, "url": url, "wait": "complete"}),
        )
        .await
        .unwrap_or_else(|e| panic!("open {url}: {e:#}"));
    }

    /// Reloads the page and waits for its `load`.
    pub async fn reload(&self) {
        self.command(
            "browsingContext.reload",
            json!({"context": self.context, "wait": "complete"}),
        )
        .await
        .unwrap_or_else(|e| panic!("reload: {e:#}"));
    }

    /// The current URL, or "" when Firefox cannot say.
    pub async fn url(&self) -> String {
        self.command(
            "browsingContext.getTree",
            json!({"root": self.context, "maxDepth": 0}),
        )
        .await
        .ok()
        .and_then(|t| t["contexts"][0]["url"].as_str().map(str::to_owned))
        .unwrap_or_default()
    }

    /// Runs `body` (an async function body: `return …`, `await` allowed)
    /// in the page and answers its value through JSON; an error when it
    /// throws or the page went away meanwhile.
    pub async fn try_js(&self, body: &str) -> anyhow::Result<Value> {
        let expression = format!(
            "(async () => {{\n{body}\n}})().then((v) => JSON.stringify(v === undefined ? null : v))"
        );
        let r = self
            .command(
                "script.evaluate",
                json!({
                    "expression": expression,
                    "target": {"context": self.context},
                    "awaitPromise": true,
                    "resultOwnership": "none",
                }),
            )
            .await?;
        if r["type"] == "exception" {
            bail!("the script threw: {}", r["exceptionDetails"]["text"]);
        }
        let text = r["result"]["value"]
            .as_str()
            .with_context(|| format!("not a JSON string: {r}"))?;
        Ok(serde_json::from_str(text)?)
    }

    /// [`Firefox::try_js`], failing the test on an error.
    pub async fn js(&self, body: &str) -> Value {
        self.try_js(body)
            .await
            .unwrap_or_else(|e| panic!("script {body}: {e:#}"))
    }

    /// The `textContent` of the element matching `css`, or "" when there
    /// is none (or no page to ask).
    pub async fn text(&self, css: &str) -> String {
        let css = Value::from(css);
        self.try_js(&format!(
            "const e = document.querySelector({css}); return e ? e.textContent : '';"
        ))
        .await
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
    }

    /// Clicks the element matching `css` as a person would: scrolled into
    /// view, then a real (trusted) mouse press and release at its centre.
    pub async fn click(&self, css: &str) {
        let selector = Value::from(css);
        let found = self
            .command(
                "script.evaluate",
                json!({
                    "expression": format!(
                        "(() => {{ const e = document.querySelector({selector}); \
                         if (e) e.scrollIntoView({{block: 'center'}}); return e; }})()"
                    ),
                    "target": {"context": self.context},
                    "awaitPromise": false,
                    "resultOwnership": "root",
                }),
            )
            .await
            .unwrap_or_else(|e| panic!("find {css}: {e:#}"));
        let Some(element) = found["result"]["sharedId"].as_str() else {
            panic!("no {css} on the page: {found}");
        };
        let at_element = json!({"type": "element", "element": {"sharedId": element}});
        self.command(
            "input.performActions",
            json!({
                "context": self.context,
                "actions": [{
                    "type": "pointer",
                    "id": "mouse",
                    "parameters": {"pointerType": "mouse"},
                    "actions": [
                        {"type": "pointerMove", "x": 0, "y": 0, "origin": at_element},
                        {"type": "pointerDown", "button": 0},
                        {"type": "pointerUp", "button": 0},
                    ],
                }],
            }),
        )
        .await
        .unwrap_or_else(|e| panic!("click {css}: {e:#}"));
    }

    /// Sets the viewport of the current tab, in CSS pixels.
    pub async fn set_viewport(&self, width: u32, height: u32) {
        self.command(
            "browsingContext.setViewport",
            json!({"context": self.context, "viewport": {"width": width, "height": height}}),
        )
        .await
        .expect("browsingContext.setViewport");
    }

    /// Runs `function` (a JavaScript function declaration) in every new
    /// document of the session before the page's own scripts. Its one
    /// argument is a function that sends a string back as a
    /// `script.message` event on `channel` ([`Firefox::messages`]).
    pub async fn preload(&self, function: &str, channel: &str) {
        self.command(
            "script.addPreloadScript",
            json!({
                "functionDeclaration": function,
                "arguments": [{"type": "channel", "value": {"channel": channel}}],
            }),
        )
        .await
        .expect("script.addPreloadScript");
    }

    /// The strings sent so far on a preload script's `channel`, oldest
    /// first, with the context each came from.
    pub fn messages(&self, channel: &str) -> Vec<(String, String)> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|e| e["method"] == "script.message" && e["params"]["channel"] == channel)
            .map(|e| {
                let p = &e["params"];
                let data = p["data"]["value"].as_str().unwrap_or_default().to_owned();
                let context = p["source"]["context"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                (context, data)
            })
            .collect()
    }

    /// The `log.entryAdded` entries so far (console calls and JavaScript
    /// errors): their `params`.
    pub fn log_entries(&self) -> Vec<Value> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|e| e["method"] == "log.entryAdded")
            .map(|e| e["params"].clone())
            .collect()
    }

    /// Saves a screenshot of the viewport named `NN-name.png`; returns its
    /// path.
    pub async fn shot(&mut self, name: &str) -> PathBuf {
        self.shots += 1;
        let r = self
            .command(
                "browsingContext.captureScreenshot",
                json!({"context": self.context}),
            )
            .await
            .expect("browsingContext.captureScreenshot");
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("data"))
            .expect("base64 PNG");
        let path = self.artifacts.join(format!("{:02}-{name}.png", self.shots));
        std::fs::write(&path, png).expect("write screenshot");
        eprintln!("screenshot: {}", path.display());
        path
    }

    /// Where this test's screenshots and other artifacts go.
    pub fn artifacts(&self) -> &Path {
        &self.artifacts
    }

    /// The last lines Firefox wrote to stderr (for a failure message).
    pub fn stderr_tail(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }

    /// Ends the session and Firefox politely (dropping kills it anyway).
    pub async fn close(self) {
        let _ = self.command("browser.close", json!({})).await;
    }
}

impl Drop for Firefox {
    fn drop(&mut self) {
        self.connection.abort();
        kill_group(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// The WebSocket: commands go out numbered, answers come back to whoever
/// asked by that number, events are kept in order.
async fn connection<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    mut outgoing: mpsc::UnboundedReceiver<Outgoing>,
    events: Arc<Mutex<Vec<Value>>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = ws.split();
    let mut waiting: HashMap<u64, oneshot::Sender<Value>> = HashMap::new();
    let mut next_id = 1u64;
    loop {
        tokio::select! {
            command = outgoing.recv() => {
                let Some((mut command, reply)) = command else { break };
                command["id"] = json!(next_id);
                waiting.insert(next_id, reply);
                next_id += 1;
                if sink.send(Message::text(command.to_string())).await.is_err() {
                    break;
                }
            }
            frame = stream.next() => {
                let text = match frame {
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => continue,
                };
                let Ok(message) = serde_json::from_str::<Value>(text.as_str()) else {
                    continue;
                };
                match message["id"].as_u64() {
                    Some(id) => {
                        if let Some(reply) = waiting.remove(&id) {
                            let _ = reply.send(message);
                        }
                    }
                    None if message["type"] == "event" => {
                        events.lock().unwrap_or_else(|e| e.into_inner()).push(message);
                    }
                    None => {}
                }
            }
        }
    }
}

impl crate::shop_path::Page for Firefox {
    async fn text(&self, css: &str) -> String {
        Firefox::text(self, css).await
    }

    async fn exists(&self, css: &str) -> bool {
        let css = Value::from(css);
        self.try_js(&format!("return document.querySelector({css}) !== null;"))
            .await
            .is_ok_and(|v| v == true)
    }

    async fn visible(&self, css: &str) -> bool {
        let css = Value::from(css);
        self.try_js(&format!(
            "const e = document.querySelector({css}); return e !== null && e.checkVisibility();"
        ))
        .await
        .is_ok_and(|v| v == true)
    }

    async fn click(&self, css: &str) {
        Firefox::click(self, css).await;
    }

    async fn select(&self, css: &str, value: &str) {
        let (css, value) = (Value::from(css), Value::from(value));
        let chosen = self
            .js(&format!(
                "const s = document.querySelector({css}); s.value = {value};\n\
                 s.dispatchEvent(new Event('input', {{bubbles: true}}));\n\
                 s.dispatchEvent(new Event('change', {{bubbles: true}}));\n\
                 return s.value;"
            ))
            .await;
        assert_eq!(chosen, value, "choose {value} in {css}");
    }

    async fn url(&self) -> String {
        Firefox::url(self).await
    }

    async fn shot(&mut self, name: &str) -> PathBuf {
        Firefox::shot(self, name).await
    }

    async fn attr(&self, css: &str, name: &str) -> String {
        let (css, name) = (Value::from(css), Value::from(name));
        self.try_js(&format!(
            "const e = document.querySelector({css}); return e ? (e.getAttribute({name}) || '') : '';"
        ))
        .await
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
    }

    async fn goto(&self, url: &str) {
        Firefox::goto(self, url).await;
    }

    async fn clear_cookies(&self) {
        self.command("storage.deleteCookies", json!({}))
            .await
            .expect("delete cookies");
    }
}
