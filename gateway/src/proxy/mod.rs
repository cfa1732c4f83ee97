//! The reverse proxy: forwards a downstream request to the upstream origin
//! and streams both bodies through.
//!
//! What it guarantees an operator:
//! - **Streaming**: request and response bodies are never buffered; a 1 GiB
//!   upload passes through in the memory of a few frames.
//! - **Pooled** upstream connections ([`crate::proxy::upstream::Upstream`]), with a
//!   connect timeout and an idle timeout. A request without a body is
//!   written straight from the client's head with the changes below
//!   ([`sluice_wire::h1`]); any other has its header map edited and goes through
//!   hyper's client. Both send the same headers (a property test holds them
//!   to it).
//! - **Hop-by-hop headers** (`Connection` and every header it names,
//!   `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
//!   `Proxy-*`) removed in both directions; `Upgrade` survives only on a
//!   WebSocket handshake, which is passed through and then spliced.
//! - **Forwarding headers**: `X-Forwarded-For` is appended to when the peer
//!   is a trusted proxy and replaced otherwise (a client cannot forge its
//!   address); `X-Forwarded-Proto`, `X-Forwarded-Host` and `Forwarded`
//!   (RFC 7239) are set.
//! - **No client-sent `Sluice-*` header** ever reaches the origin: only the
//!   gateway speaks in that namespace (`Sluice-Admission`).
//! - Failures are problem+json: 502 `origin_unreachable` when the origin
//!   cannot be reached, 504 `origin_timeout` when its response headers do not
//!   arrive in time, 502 `origin_tls_failed` when the TLS handshake with an
//!   `https://` origin fails (logged once per cause, [`tls::CauseLog`]),
//!   400 `malformed_request` when the downstream body itself
//!   failed (a bad chunk size, a body cut short): the client's fault is
//!   never reported as the origin's.
//! - **https origins** ([`tls`]): verified against the system roots or
//!   `proxy.origin_ca`, SNI, ALPN `h2`/`http/1.1`; every request goes
//!   through hyper's connections. `proxy.insecure_skip_verify` is warned
//!   about at startup and shown by the `sluice_origin_tls_insecure` gauge.

pub mod headers;
pub mod tls;
pub mod upstream;

use std::net::IpAddr;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Uri, Version};
use hyper_util::rt::TokioIo;

use crate::app::problem::Problem;
use crate::app::telemetry::Telemetry;
use crate::config::{ProxyConfig, Timeouts};
use crate::edge::client_ip::ClientInfo;
use crate::proxy::headers::{is_hop_by_hop, strip_headers, strip_hop_by_hop};
use crate::proxy::upstream::{Upstream, UpstreamError};
use sluice_wire::watch::ConnWatch;

/// The origin's response head did not come within
/// `timeouts.upstream_response`.
struct Late;

/// The value of an origin's `Sluice-Command` response header, taken out of
/// the response before it reaches the client and left in the response's
/// extensions for the admission gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OriginCommand(pub String);

/// Forwards requests to one origin.
#[derive(Clone)]
pub struct Proxy {
    upstream: std::sync::Arc<Upstream>,
    origin: Uri,
    /// The origin's `host[:port]`, the `Host` of requests when the
    /// client's is not preserved.
    origin_host: HeaderValue,
    preserve_host: bool,
    response_timeout: Duration,
    /// A WebSocket tunnel with no byte either way for this long is closed.
    tunnel_idle: Duration,
    /// A request body forwarded upstream that pauses this long fails
    /// (`timeouts.body_read`), so a stalled upload holds no origin slot.
    body_idle: Duration,
    telemetry: Telemetry,
    /// Permits of the requests waiting for the origin
    /// (`limits.max_origin_requests`).
    slots: std::sync::Arc<tokio::sync::Semaphore>,
    /// A plain `http://` origin: bodiless requests take the native path.
    plain: bool,
    /// Failed TLS handshakes, each cause logged once.
    tls_failures: std::sync::Arc<tls::CauseLog>,
}

impl Proxy {
    /// A proxy to `origin` (an `http://` or `https://host:port[/base]` URL) with at most
    /// `max_in_flight` requests waiting for it at once, for a server of
    /// `io_threads` I/O threads.
    pub fn new(
        origin: &str,
        cfg: &ProxyConfig,
        timeouts: &Timeouts,
        max_in_flight: usize,
        io_threads: usize,
        telemetry: Telemetry,
    ) -> anyhow::Result<Proxy> {
        let origin: Uri = origin.parse()?;
        let authority = origin
            .authority()
            .ok_or_else(|| anyhow::anyhow!("origin {origin} has no host"))?;
        let https = origin.scheme() == Some(&http::uri::Scheme::HTTPS);
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let mut upstream = Upstream::new(
            format!("{}:{port}", authority.host()),
            timeouts.upstream_connect,
            timeouts.upstream_idle,
            cfg.pool_max_idle_per_host,
            io_threads,
        );
        if https {
            upstream = upstream.with_tls(origin_tls(authority.host(), cfg)?);
        } else if cfg.origin_ca.is_some() || cfg.insecure_skip_verify {
            tracing::warn!(
                %origin,
                "proxy.origin_ca and proxy.insecure_skip_verify apply to an https:// origin only; this one is plain http (no TLS, nothing verified)"
            );
        }
        telemetry.origin_tls_insecure(https && cfg.insecure_skip_verify);
        let origin_host = HeaderValue::from_str(authority.as_str())?;
        Ok(Proxy {
            plain: !https,
            tls_failures: std::sync::Arc::default(),
            upstream: std::sync::Arc::new(upstream),
            origin,
            origin_host,
            preserve_host: cfg.preserve_host,
            response_timeout: timeouts.upstream_response,
            tunnel_idle: timeouts.tunnel_idle,
            body_idle: timeouts.body_read,
            telemetry,
            slots: std::sync::Arc::new(tokio::sync::Semaphore::new(max_in_flight)),
        })
    }

    /// The origin's URL.
    pub fn origin(&self) -> &Uri {
        &self.origin
    }

    /// Forwards one request. `admission`: the gateway's own header to the
    /// origin, `Sluice-Admission` (the visitor's admission token), added
    /// after the client's `Sluice-*` headers were removed.
    ///
    /// At most `limits.max_origin_requests` requests wait for the origin's
    /// response headers at once; one past it is answered at once with 503
    /// `overloaded` and `Retry-After`, without reaching the origin.
    pub async fn forward(
        &self,
        req: Request<Body>,
        client: &ClientInfo,
        admission: OwnHeader,
    ) -> Response {
        // The connection's deadlines, when the server put them with it.
        let watch = req.extensions().get::<std::sync::Arc<ConnWatch>>().cloned();
        self.forward_watched(req, client, admission, watch.as_deref())
            .await
    }

    /// [`Proxy::forward`], the wait for the origin's response head kept by
    /// the connection's `watch` when there is one (one timer for the
    /// connection), else by a timer of its own.
    pub async fn forward_watched(
        &self,
        mut req: Request<Body>,
        client: &ClientInfo,
        admission: OwnHeader,
        watch: Option<&ConnWatch>,
    ) -> Response {
        let Ok(_permit) = self.slots.try_acquire() else {
            self.telemetry.shed("origin");
            return Problem::origin_overloaded().into_response();
        };
        let upgrade = wants_upgrade(&req);
        let (downstream_upgrade, bound, hold) = if upgrade.is_some() {
            (
                Some(hyper::upgrade::on(&mut req)),
                req.extensions_mut().remove::<TunnelBound>(),
                req.extensions_mut().remove::<ConnHold>(),
            )
        } else {
            (None, None, None)
        };

        // The host the client asked for: its `Host`, else the authority of
        // an absolute-form target. A header value is shared, not copied.
        let original_host: Option<HeaderValue> = match req.headers().get(header::HOST) {
            Some(h) if h.to_str().is_ok() => Some(h.clone()),
            _ => req
                .uri()
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
        };
        let fwd = Forwarding::new(
            req.headers(),
            client,
            original_host,
            (!self.preserve_host).then(|| self.origin_host.clone()),
            &self.origin_host,
        );

        let started = std::time::Instant::now();
        // A request without a body that is no upgrade (most of them) is
        // written straight from its parts ([`sluice_wire::h1`]); any other is
        // edited in place (never taken apart and put together again, each a
        // copy of its head) and goes through hyper's client.
        let native = self.plain
            && upgrade.is_none()
            && *req.method() != http::Method::CONNECT
            && http_body::Body::is_end_stream(req.body());
        let (result, body_failed) = if native {
            let mut send = self.upstream.native();
            // The target as it came, under the origin's base path if any.
            let base = self.origin.path().trim_end_matches('/');
            let pq = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
            let joined;
            let target = if base.is_empty() {
                pq
            } else {
                joined = format!("{base}{pq}");
                &joined
            };
            encode_forwarded(&req, target, &fwd, admission.as_ref(), send.head());
            let method = req.method().clone();
            drop(req);
            let result = self.in_time(send.send(method), watch, started).await;
            (result, None)
        } else {
            let body_failed = match self.for_hyper(&mut req, &fwd, admission, upgrade.as_ref()) {
                Ok(flag) => flag,
                Err(res) => return res,
            };
            // Boxed: hyper's client future is large, and kept inline it
            // would make every forwarded request's future (the bodiless
            // ones too) as large, a copy of it at each move.
            let send = Box::pin(self.upstream.send(req));
            let result = self.in_time(send, watch, started).await;
            (result, body_failed)
        };
        let mut res = match result {
            Ok(Ok(res)) => res,
            Ok(Err(e)) => return self.upstream_failed(e, body_failed.as_deref()),
            Err(Late) => {
                self.telemetry.upstream_error("timeout");
                return Problem::origin_timeout()
                    .log_cause(&"no response headers within the upstream response timeout")
                    .into_response();
            }
        };
        self.telemetry
            .upstream(res.status().as_u16(), started.elapsed().as_secs_f64());

        if res.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            return self.switch_protocols(res, downstream_upgrade, bound, hold);
        }

        // A native answer came without its hop-by-hop fields already.
        if !native {
            strip_headers(res.headers_mut(), false);
        }
        if let Some(cmd) = res.headers_mut().remove(SLUICE_COMMAND)
            && let Ok(s) = cmd.to_str()
        {
            res.extensions_mut()
                .insert(OriginCommand(s.trim().to_ascii_lowercase()));
        }
        res
    }

    /// Edits a request for hyper's client in place: the origin's target and
    /// HTTP/1.1, the forwarding headers, the upgrade asked for, the
    /// gateway's own headers, and a body that notes its own failure (so
    /// that failure is answered as the client's, 400, not as the origin's,
    /// 502): the flag it sets, when there is a body.
    #[allow(clippy::result_large_err)]
    fn for_hyper(
        &self,
        req: &mut Request<Body>,
        fwd: &Forwarding,
        admission: OwnHeader,
        upgrade: Option<&HeaderValue>,
    ) -> Result<Option<std::sync::Arc<std::sync::atomic::AtomicBool>>, Response> {
        let uri = self
            .upstream_uri(req.uri())
            .map_err(|e| Problem::malformed(format!("bad request target: {e}")).into_response())?;
        *req.uri_mut() = uri;
        *req.version_mut() = Version::HTTP_11;
        let h = req.headers_mut();
        fwd.apply(h);
        if let Some(proto) = upgrade {
            h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            h.insert(header::UPGRADE, proto.clone());
        }
        if let Some((name, v)) = admission {
            h.insert(name, v);
        }
        if http_body::Body::is_end_stream(req.body()) {
            return Ok(None);
        }
        let failed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = failed.clone();
        let body = IdleBody::new(std::mem::take(req.body_mut()), self.body_idle);
        *req.body_mut() = Body::new(http_body_util::BodyExt::map_err(body, move |e| {
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
            e
        }));
        Ok(Some(failed))
    }

    /// The answer when the origin could not be asked or did not answer:
    /// 400 when it was the client's body that failed (not the origin's
    /// fault), 502 `origin_tls_failed` for a failed TLS handshake (its
    /// cause logged once, not at each request), else 502
    /// `origin_unreachable`, the cause logged.
    fn upstream_failed(
        &self,
        e: UpstreamError,
        body_failed: Option<&std::sync::atomic::AtomicBool>,
    ) -> Response {
        if body_failed.is_some_and(|f| f.load(std::sync::atomic::Ordering::Relaxed)) {
            return Problem::malformed("the request body could not be read")
                .log_cause(&error_chain(&e))
                .into_response();
        }
        if let UpstreamError::Tls { failure, .. } = &e {
            self.telemetry.upstream_error("tls");
            self.tls_failures.failed(&self.origin.to_string(), failure);
            return Problem::origin_tls_failed().into_response();
        }
        self.telemetry.upstream_error("unreachable");
        let cause = error_chain(&e);
        if let UpstreamError::Connect {
            timed_out: true, ..
        } = e
        {
            return Problem::origin_unreachable()
                .log_cause(&format!("connect timeout: {cause}"))
                .into_response();
        }
        Problem::origin_unreachable()
            .log_cause(&cause)
            .into_response()
    }

    /// The origin's 101: the tunnel opens only on its answer to a
    /// WebSocket handshake (`downstream` is the client's side of it); a 101
    /// to anything else is the origin's fault (502).
    fn switch_protocols(
        &self,
        mut res: Response,
        downstream: Option<hyper::upgrade::OnUpgrade>,
        bound: Option<TunnelBound>,
        hold: Option<ConnHold>,
    ) -> Response {
        let Some(downstream) = downstream else {
            self.telemetry.upstream_error("unexpected_upgrade");
            return Problem::origin_unreachable()
                .log_cause(&"the origin switched protocols on a request that asked for no upgrade")
                .into_response();
        };
        let upstream = hyper::upgrade::on(&mut res);
        let idle = self.tunnel_idle;
        tokio::spawn(async move {
            match tokio::try_join!(downstream, upstream) {
                Ok((down, up)) => tunnel(down, up, idle, bound, hold).await,
                Err(e) => tracing::warn!(error = %e, "upgrade failed"),
            }
        });
        let (mut parts, body) = res.into_parts();
        let proto = parts.headers.get(header::UPGRADE).cloned();
        strip_hop_by_hop(&mut parts.headers);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(p) = proto {
            parts.headers.insert(header::UPGRADE, p);
        }
        Response::from_parts(parts, body)
    }

    /// `send`, unless the origin's response head takes longer than
    /// `timeouts.upstream_response` from `started`.
    async fn in_time<T>(
        &self,
        send: impl std::future::Future<Output = T>,
        watch: Option<&ConnWatch>,
        started: std::time::Instant,
    ) -> Result<T, Late> {
        // Pinned where it is (`pin!` would move it, a copy of the whole
        // future).
        futures_util::pin_mut!(send);
        let Some(watch) = watch else {
            return tokio::time::timeout(self.response_timeout, send)
                .await
                .map_err(|_| Late);
        };
        let mut late = watch.origin_wait(started);
        std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(answer) = send.as_mut().poll(cx) {
                return std::task::Poll::Ready(Ok(answer));
            }
            std::pin::Pin::new(&mut late).poll(cx).map(|()| Err(Late))
        })
        .await
    }

    /// The request target upstream, in origin form (`/path?query`, under
    /// the origin's base path if it has one).
    fn upstream_uri(&self, downstream: &Uri) -> Result<Uri, http::Error> {
        let base = self.origin.path().trim_end_matches('/');
        match downstream.path_and_query() {
            // An origin at its root (the usual case): the target as it came.
            Some(pq) if base.is_empty() => Uri::builder().path_and_query(pq.clone()),
            pq => {
                let pq = pq.map(|pq| pq.as_str()).unwrap_or("/");
                Uri::builder().path_and_query(format!("{base}{pq}"))
            }
        }
        .build()
    }
}

/// The TLS side of an `https://` origin at `host`, as `[proxy]` says; a
/// loud warning when nothing is verified.
fn origin_tls(host: &str, cfg: &ProxyConfig) -> anyhow::Result<tls::OriginTls> {
    if cfg.insecure_skip_verify {
        tracing::warn!(
            host,
            "proxy.insecure_skip_verify = true: the origin's TLS certificate is NOT verified; \
             anyone on the path to the origin can read and change every request, cookie and \
             answer (a test setting, never for production)"
        );
    }
    tls::OriginTls::new(host, cfg.origin_ca.as_deref(), cfg.insecure_skip_verify)
}

/// The protocol asked for in an HTTP/1.1 `Upgrade` handshake that names
/// `upgrade` in its `Connection` header.
fn wants_upgrade<B>(req: &Request<B>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let conn_upgrade = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if !conn_upgrade {
        return None;
    }
    // Only WebSocket is tunnelled: any other protocol (h2c above all, whose
    // upgrade would hand the client an HTTP/2 connection to the origin that
    // no gate sees) is served as a plain request, its upgrade headers
    // removed with the other hop-by-hop ones. One `Upgrade` header naming
    // exactly `websocket` (RFC 6455 §4.1), nothing else.
    let mut upgrades = req.headers().get_all(header::UPGRADE).iter();
    let proto = upgrades.next()?;
    if upgrades.next().is_some() || !proto.as_bytes().eq_ignore_ascii_case(b"websocket") {
        return None;
    }
    Some(proto.clone())
}

pin_project_lite::pin_project! {
    /// A request body that fails when no piece of it comes for `idle`: a
    /// client that starts an upload and stalls does not hold the origin's
    /// slot (and connection) for as long as it likes.
    struct IdleBody {
        #[pin]
        inner: Body,
        #[pin]
        timer: tokio::time::Sleep,
        idle: Duration,
    }
}

impl IdleBody {
    fn new(inner: Body, idle: Duration) -> Self {
        IdleBody {
            inner,
            timer: tokio::time::sleep(idle),
            idle,
        }
    }
}

impl http_body::Body for IdleBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        match this.inner.poll_frame(cx) {
            std::task::Poll::Pending => {}
            ready => {
                this.timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + *this.idle);
                return ready;
            }
        }
        match this.timer.poll(cx) {
            std::task::Poll::Ready(()) => {
                std::task::Poll::Ready(Some(Err(axum::Error::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the request body stalled (timeouts.body_read)",
                )))))
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Where a WebSocket opened through the gate must end: when the admission
/// it was opened with expires (`expires_at_s`, Unix seconds) or its
/// session is revoked (`ended`). Put in the request's extensions by the
/// gate.
#[derive(Clone)]
pub struct TunnelBound {
    /// The admission token's expiry.
    pub expires_at_s: u64,
    /// Whether the admission's session has ended (a revoke).
    pub ended: std::sync::Arc<dyn Fn() -> bool + Send + Sync>,
}

/// What a downstream connection holds while it is open (its
/// `limits.max_connections` permit and its count in
/// `sluice_open_connections`), shared with a tunnel made of it, so an
/// upgraded connection stays counted until the tunnel closes.
#[derive(Clone)]
pub struct ConnHold(pub std::sync::Arc<dyn std::any::Any + Send + Sync>);

/// How often a tunnel checks its idle time and its admission.
const TUNNEL_CHECK: Duration = Duration::from_secs(1);

/// Splices a WebSocket's two sides until either closes, no byte crosses for
/// `idle`, or its admission ends (`bound`); holds the downstream
/// connection's `hold` meanwhile.
async fn tunnel(
    down: hyper::upgrade::Upgraded,
    up: hyper::upgrade::Upgraded,
    idle: Duration,
    bound: Option<TunnelBound>,
    hold: Option<ConnHold>,
) {
    let _hold = hold;
    let last = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = tokio::time::Instant::now();
    let mut down = Activity::new(TokioIo::new(down), last.clone(), start);
    let mut up = Activity::new(TokioIo::new(up), last.clone(), start);
    let copy = tokio::io::copy_bidirectional(&mut down, &mut up);
    tokio::pin!(copy);
    let mut check = tokio::time::interval(TUNNEL_CHECK.min(idle));
    loop {
        tokio::select! {
            done = &mut copy => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "upgraded connection ended");
                }
                return;
            }
            _ = check.tick() => {
                let quiet = start.elapsed().saturating_sub(Duration::from_millis(
                    last.load(std::sync::atomic::Ordering::Relaxed),
                ));
                if quiet >= idle {
                    tracing::debug!("tunnel closed: idle");
                    return;
                }
                if let Some(b) = &bound {
                    if crate::app::clock::now_s() >= b.expires_at_s {
                        tracing::debug!("tunnel closed: its admission expired");
                        return;
                    }
                    if (b.ended)() {
                        tracing::debug!("tunnel closed: its session was revoked");
                        return;
                    }
                }
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// An I/O that notes when bytes last moved through it (ms since
    /// `start`), for the tunnel's idle timeout.
    struct Activity<T> {
        #[pin]
        io: T,
        last: std::sync::Arc<std::sync::atomic::AtomicU64>,
        start: tokio::time::Instant,
    }
}

impl<T> Activity<T> {
    fn new(
        io: T,
        last: std::sync::Arc<std::sync::atomic::AtomicU64>,
        start: tokio::time::Instant,
    ) -> Self {
        Activity { io, last, start }
    }
}

fn touch(last: &std::sync::atomic::AtomicU64, start: tokio::time::Instant) {
    let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    last.store(ms, std::sync::atomic::Ordering::Relaxed);
}

impl<T: tokio::io::AsyncRead> tokio::io::AsyncRead for Activity<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let r = this.io.poll_read(cx, buf);
        if buf.filled().len() > before {
            touch(this.last, *this.start);
        }
        r
    }
}

impl<T: tokio::io::AsyncWrite> tokio::io::AsyncWrite for Activity<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

const SLUICE_COMMAND: HeaderName = HeaderName::from_static("sluice-command");
/// The gateway's own header to the origin: the visitor's admission token.
pub(crate) const SLUICE_ADMISSION: HeaderName = HeaderName::from_static("sluice-admission");

/// The gateway's own header to the origin, at most one per request:
/// [`SLUICE_ADMISSION`] (the visitor's admission token) or
/// `Sluice-Crawler` (a verified crawler's name). A client's own `Sluice-*`
/// fields never pass, so it is never written twice.
pub(crate) type OwnHeader = Option<(HeaderName, HeaderValue)>;
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Writes `ip` as text: IPv4 by hand (the proxied path writes the client's
/// address into two headers per request; `core::fmt` costs several times
/// more), IPv6 through `Display`.
fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                if octet >= 100 {
                    out.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    out.push(char::from(b'0' + octet / 10 % 10));
                }
                out.push(char::from(b'0' + octet % 10));
            }
        }
        IpAddr::V6(v6) => {
            use std::fmt::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

/// A header value made from text written for it, without copying it again.
fn header_value(text: String) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(text)).ok()
}

/// The TCP peer's address as header text, once per connection: the
/// `X-Forwarded-For` of every request from a peer that is no trusted proxy.
pub fn peer_text(peer: std::net::SocketAddr) -> Option<HeaderValue> {
    let mut text = String::with_capacity(40);
    push_ip(&mut text, peer.ip());
    header_value(text)
}

/// The headers the gateway sets on a forwarded request, made once, then
/// either applied to its header map ([`Forwarding::apply`]) or written with
/// the rest of its head ([`encode_forwarded`]).
struct Forwarding {
    /// `X-Forwarded-For`: the trusted chain and the peer, or the peer alone.
    xff: Option<HeaderValue>,
    proto: &'static str,
    /// `X-Forwarded-Host`: the host the client asked for.
    host_asked: Option<HeaderValue>,
    forwarded: Option<HeaderValue>,
    /// The `Host` to send instead of the client's (`proxy.preserve_host =
    /// false`).
    host: Option<HeaderValue>,
    /// The `Host` to send when the client's does not go on (it sent none,
    /// or its `Connection` named it): the authority of an absolute-form
    /// target, else the origin's (HTTP/1.1 requires one).
    fallback_host: HeaderValue,
}

impl Forwarding {
    /// `replace_host`: the origin's `Host` when the client's is not kept.
    fn new(
        h: &HeaderMap,
        client: &ClientInfo,
        original_host: Option<HeaderValue>,
        replace_host: Option<HeaderValue>,
        origin_host: &HeaderValue,
    ) -> Forwarding {
        let xff = match (&client.peer_text, client.peer_trusted) {
            (Some(peer), false) => Some(peer.clone()),
            _ => {
                let mut xff = String::with_capacity(48);
                if client.peer_trusted {
                    for v in h
                        .get_all(&X_FORWARDED_FOR)
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                    {
                        xff.push_str(v);
                        xff.push_str(", ");
                    }
                }
                push_ip(&mut xff, client.peer.ip());
                header_value(xff)
            }
        };
        let mut fwd = String::with_capacity(64);
        match client.ip {
            IpAddr::V4(_) => {
                fwd.push_str("for=");
                push_ip(&mut fwd, client.ip);
            }
            IpAddr::V6(_) => {
                fwd.push_str("for=\"[");
                push_ip(&mut fwd, client.ip);
                fwd.push_str("]\"");
            }
        }
        if let Some(host) = original_host
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .filter(|s| s.bytes().all(|b| b.is_ascii_graphic() && b != b'"'))
        {
            fwd.push_str(";host=\"");
            fwd.push_str(host);
            fwd.push('"');
        }
        fwd.push_str(";proto=");
        fwd.push_str(client.proto);
        Forwarding {
            xff,
            proto: client.proto,
            fallback_host: original_host.clone().unwrap_or_else(|| origin_host.clone()),
            host_asked: original_host,
            forwarded: header_value(fwd),
            host: replace_host,
        }
    }

    /// Sets them in `h`, after taking out what a client may not send on
    /// (hop-by-hop, `Sluice-*`).
    fn apply(&self, h: &mut HeaderMap) {
        strip_headers(h, true);
        // Room for what is added, at once (the map grows once, if at all).
        h.reserve(6);
        match &self.xff {
            Some(v) => h.insert(X_FORWARDED_FOR, v.clone()),
            None => h.remove(X_FORWARDED_FOR),
        };
        h.insert(X_FORWARDED_PROTO, HeaderValue::from_static(self.proto));
        match &self.host_asked {
            Some(v) => h.insert(X_FORWARDED_HOST, v.clone()),
            None => h.remove(X_FORWARDED_HOST),
        };
        match &self.forwarded {
            Some(v) => h.insert(header::FORWARDED, v.clone()),
            None => h.remove(header::FORWARDED),
        };
        if let Some(host) = &self.host {
            h.insert(header::HOST, host.clone());
        } else if !h.contains_key(header::HOST) {
            h.insert(header::HOST, self.fallback_host.clone());
        }
    }

    /// Whether a header of the client's request is sent on as it is: not
    /// one the gateway sets, nor hop-by-hop, nor `Sluice-*`.
    fn passes(&self, name: &HeaderName) -> bool {
        let n = name.as_str();
        !(is_hop_by_hop(n)
            || n.starts_with("sluice-")
            || *name == X_FORWARDED_FOR
            || *name == X_FORWARDED_PROTO
            || *name == X_FORWARDED_HOST
            || *name == header::FORWARDED
            || (*name == header::HOST && self.host.is_some()))
    }
}

/// Writes the head of a forwarded request without a body, with the same
/// headers as [`Forwarding::apply`] and the `admission` header would leave
/// in its map, straight from the client's: no header map is edited or made.
/// (The client's own `Sluice-*` fields never pass [`Forwarding::passes`],
/// so the gateway's is never written twice.)
fn encode_forwarded(
    req: &Request<Body>,
    target: &str,
    fwd: &Forwarding,
    admission: Option<&(HeaderName, HeaderValue)>,
    out: &mut Vec<u8>,
) {
    let h = req.headers();
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut line = |name: &HeaderName, value: &HeaderValue| {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    };
    // What `Connection` names goes too (rarely anything but itself).
    let named: Vec<HeaderName> = if h.contains_key(header::CONNECTION) {
        h.get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
            .collect()
    } else {
        Vec::new()
    };
    let (mut has_length, mut has_host) = (false, false);
    for (name, value) in h {
        if fwd.passes(name) && (named.is_empty() || !named.contains(name)) {
            has_length |= *name == header::CONTENT_LENGTH;
            has_host |= *name == header::HOST;
            line(name, value);
        }
    }
    match &fwd.host {
        Some(v) => line(&header::HOST, v),
        None if !has_host => line(&header::HOST, &fwd.fallback_host),
        None => {}
    }
    if let Some(v) = &fwd.xff {
        line(&X_FORWARDED_FOR, v);
    }
    line(&X_FORWARDED_PROTO, &HeaderValue::from_static(fwd.proto));
    if let Some(v) = &fwd.host_asked {
        line(&X_FORWARDED_HOST, v);
    }
    if let Some(v) = &fwd.forwarded {
        line(&header::FORWARDED, v);
    }
    if let Some((name, v)) = admission {
        line(name, v);
    }
    // As hyper's client: a bodiless request of a method that may carry one
    // says its length is zero.
    if !has_length && !matches!(*req.method(), http::Method::GET | http::Method::HEAD) {
        out.extend_from_slice(b"content-length: 0\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::proxy::headers::strip_sluice;

    #[test]
    fn hop_by_hop_and_named_headers_go() {
        let mut h = HeaderMap::new();
        h.insert("connection", "close, x-secret".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("te", "trailers".parse().unwrap());
        h.insert("trailer", "x".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("upgrade", "h2c".parse().unwrap());
        h.insert("proxy-authorization", "x".parse().unwrap());
        h.insert("proxy-connection", "x".parse().unwrap());
        h.insert("x-end-to-end", "kept".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["x-end-to-end"], "kept");
    }

    #[test]
    fn sluice_headers_go() {
        let mut h = HeaderMap::new();
        h.insert("sluice-admission", "forged".parse().unwrap());
        h.insert("Sluice-Anything", "forged".parse().unwrap());
        h.insert("x-sluice", "kept".parse().unwrap());
        strip_sluice(&mut h);
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn hop_by_hop_sluice_and_named_headers_go_in_one_pass() {
        let mut h = HeaderMap::new();
        h.append("connection", "keep-alive".parse().unwrap());
        h.append(
            "connection",
            "x-a, X-B ,, bad name, Upgrade, close".parse().unwrap(),
        );
        h.insert("close", "a header of that name".parse().unwrap());
        h.insert("x-a", "1".parse().unwrap());
        h.insert("x-b", "1".parse().unwrap());
        h.insert("proxy-authorization", "x".parse().unwrap());
        h.insert("sluice-admission", "forged".parse().unwrap());
        h.insert("x-sluice", "kept".parse().unwrap());
        h.insert("x-end-to-end", "kept".parse().unwrap());
        let mut kept = h.clone();
        strip_headers(&mut h, true);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["x-end-to-end", "x-sluice"]);
        // Without `sluice`, as for a response: the origin's Sluice-* stay.
        strip_headers(&mut kept, false);
        assert!(kept.contains_key("sluice-admission"));
        assert!(!kept.contains_key("x-b"));
        // Nothing to strip: nothing changes.
        let before = h.clone();
        strip_headers(&mut h, true);
        assert_eq!(h, before);
    }

    proptest::proptest! {
        #[test]
        fn ip_text_is_display(v4 in proptest::prelude::any::<[u8; 4]>(), v6 in proptest::prelude::any::<[u16; 8]>()) {
            for ip in [IpAddr::from(v4), IpAddr::from(v6)] {
                let mut out = String::from("x");
                push_ip(&mut out, ip);
                proptest::prop_assert_eq!(out, format!("x{ip}"));
            }
        }
    }

    #[test]
    fn a_trusted_peer_chain_is_appended_to() {
        let peer: std::net::SocketAddr = "10.0.0.1:5".parse().unwrap();
        let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "1.2.3.4".parse().unwrap());
        h.append("x-forwarded-for", "5.6.7.8, 10.0.0.9".parse().unwrap());
        let client = ClientInfo::resolve(peer, &h, &trusted);
        assert_eq!(client.ip, "5.6.7.8".parse::<IpAddr>().unwrap());
        let origin = HeaderValue::from_static("origin:80");
        Forwarding::new(&h, &client, None, None, &origin).apply(&mut h);
        assert_eq!(
            h.get_all("x-forwarded-for").iter().collect::<Vec<_>>(),
            ["1.2.3.4, 5.6.7.8, 10.0.0.9, 10.0.0.1"]
        );
        assert_eq!(h[header::FORWARDED], "for=5.6.7.8;proto=http");
        assert!(!h.contains_key("x-forwarded-host"));
    }

    #[test]
    fn forwarded_is_rfc7239() {
        for (peer, host, want) in [
            (
                "1.2.3.4:5",
                Some("shop.example"),
                "for=1.2.3.4;host=\"shop.example\";proto=http",
            ),
            ("[::1]:5", None, "for=\"[::1]\";proto=http"),
            // a host that cannot be quoted is left out
            ("1.2.3.4:5", Some("a\"b"), "for=1.2.3.4;proto=http"),
        ] {
            let peer: std::net::SocketAddr = peer.parse().unwrap();
            let client = ClientInfo::resolve(peer, &HeaderMap::new(), &[]);
            let mut h = HeaderMap::new();
            let host = host.map(HeaderValue::from_static);
            let origin = HeaderValue::from_static("origin:80");
            Forwarding::new(&h, &client, host, None, &origin).apply(&mut h);
            assert_eq!(h[header::FORWARDED], want);
            assert_eq!(h["x-forwarded-for"], peer.ip().to_string());
        }
    }

    type Fields = Vec<(String, String)>;

    /// The head written straight from a bodiless request carries exactly
    /// the headers that the header-map path leaves for hyper's client to
    /// write, whatever the client sent.
    fn both_paths(
        names: &[(&'static str, &'static str)],
        trusted: bool,
        preserve_host: bool,
        extra: bool,
    ) -> (Fields, Fields) {
        let mut b = Request::get("/p?q=1");
        for (n, v) in names {
            b = b.header(*n, *v);
        }
        let req = b.body(Body::empty()).unwrap();
        let peer: std::net::SocketAddr = "10.0.0.1:5".parse().unwrap();
        let nets: Vec<ipnet::IpNet> = if trusted {
            vec!["10.0.0.0/8".parse().unwrap()]
        } else {
            Vec::new()
        };
        let mut client = ClientInfo::resolve(peer, req.headers(), &nets);
        client.peer_text = peer_text(peer);
        let origin = HeaderValue::from_static("origin:8080");
        let host = req.headers().get(header::HOST).cloned();
        let fwd = Forwarding::new(
            req.headers(),
            &client,
            host,
            (!preserve_host).then(|| origin.clone()),
            &origin,
        );
        let admission = extra.then(|| (SLUICE_ADMISSION, HeaderValue::from_static("token")));
        let mut wire = Vec::new();
        encode_forwarded(&req, "/p?q=1", &fwd, admission.as_ref(), &mut wire);
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Request::new(&mut fields);
        assert!(
            parsed.parse(&wire).unwrap().is_complete(),
            "{}",
            String::from_utf8_lossy(&wire)
        );
        assert_eq!((parsed.method, parsed.path), (Some("GET"), Some("/p?q=1")));
        let mut written: Vec<(String, String)> = parsed
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_owned(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect();
        let mut h = req.headers().clone();
        fwd.apply(&mut h);
        if let Some((name, v)) = admission {
            h.insert(name, v);
        }
        let mut mapped: Vec<(String, String)> = h
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned()))
            .collect();
        written.sort();
        mapped.sort();
        let hosts = written.iter().filter(|(n, _)| n == "host").count();
        assert_eq!(hosts, 1, "one Host, always: {written:?}");
        (written, mapped)
    }

    const TRICKY: [(&str, &str); 15] = [
        ("host", "shop.example"),
        ("connection", "keep-alive, x-private"),
        ("x-private", "secret"),
        ("keep-alive", "timeout=5"),
        ("te", "trailers"),
        ("proxy-authorization", "Basic x"),
        ("sluice-admission", "forged"),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-host", "evil.example"),
        ("x-forwarded-proto", "https"),
        ("forwarded", "for=6.6.6.6"),
        ("x-custom", "kept"),
        ("cookie", "a=b"),
        ("upgrade", "h2c"),
        ("connection", "Host"),
    ];

    #[test]
    fn the_written_head_matches_the_edited_map_for_every_header() {
        let (written, mapped) = both_paths(&TRICKY[..14], true, true, true);
        assert_eq!(written, mapped);
        assert!(written.contains(&("host".into(), "shop.example".into())));
        assert!(
            written.contains(&("sluice-admission".into(), "token".into())),
            "the gateway's own, not the client's: {written:?}"
        );
        // A Connection that names Host: the origin still gets one.
        let (written, mapped) = both_paths(&TRICKY, true, true, false);
        assert_eq!(written, mapped);
        let names: Vec<&str> = written.iter().map(|(n, _)| n.as_str()).collect();
        for gone in [
            "connection",
            "x-private",
            "keep-alive",
            "te",
            "proxy-authorization",
            "upgrade",
        ] {
            assert!(!names.contains(&gone), "{gone} in {written:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn written_and_edited_heads_agree(
            // Each at most once (two Host headers are no valid request).
            pick in proptest::collection::btree_set(0usize..TRICKY.len(), 0..TRICKY.len()),
            trusted in proptest::prelude::any::<bool>(),
            preserve_host in proptest::prelude::any::<bool>(),
            extra in proptest::prelude::any::<bool>(),
        ) {
            let names: Vec<_> = pick.iter().map(|&i| TRICKY[i]).collect();
            let (written, mapped) = both_paths(&names, trusted, preserve_host, extra);
            proptest::prop_assert_eq!(written, mapped);
        }
    }
}
