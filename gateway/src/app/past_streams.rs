//! The trace and compression layers, with event streams kept past both.
//!
//! Two of tower-http's layers cost an event stream memory for its whole
//! life (issue 21: an idle waiting visitor's stream at most 4 KiB; README
//! "Measured", "Streams"):
//! - [`Trace`](tower_http::trace::Trace) keeps the request's span open
//!   until the answer's body ends. An open span is a slot in the
//!   subscriber's registry with its formatted fields and extensions, about
//!   0.5 KB.
//! - [`Compression`](tower_http::compression::Compression) answers with a
//!   [`CompressionBody`](tower_http::compression::CompressionBody), an
//!   enum as large as its largest encoder's state (brotli's: about 6 KB),
//!   whether it compresses or not (its predicate never compresses an event
//!   stream). Measured with heaptrack, it was more than half of an idle
//!   stream's memory.
//!
//! So [`PastStreams`] wraps both: a request that asks for an event stream
//! (`Accept: text/event-stream`,
//! [`crate::visitor::stream::wants_stream`]) goes to the route as it is,
//! served inside a request span (the trace layer's own maker) until its
//! answer's head is ready, and its body goes on without it. Every other
//! answer goes through the wrapped layers as before, its body boxed here
//! (the compression layer's own body is boxed as it leaves that layer, in
//! `app`, so the layers above move a pointer, not kilobytes). Our own
//! rather than tower's `Either` of two services: which one answers is
//! decided by the request, and both must give the same body type.

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use futures_util::TryFutureExt as _;
use futures_util::future::{Either, MapOk};
use http::{Request, Response};
use tower::util::Oneshot;
use tower::{Layer, Service, ServiceExt as _};
use tracing::Instrument as _;
use tracing::instrument::Instrumented;

/// `layer` (the trace and compression layers), with event streams kept
/// past it: their requests are served in a span made by `span` (the trace
/// layer's own maker) for as long as the answer's head takes (module
/// docs).
#[derive(Clone)]
pub struct PastStreams<L> {
    /// The layers every other request goes through.
    pub layer: L,
    /// The span of a request (the same as the trace layer makes).
    pub span: fn(&Request<Body>) -> tracing::Span,
}

impl<S: Clone, L: Layer<S>> Layer<S> for PastStreams<L> {
    type Service = PastStreamsService<L::Service, S>;

    fn layer(&self, inner: S) -> Self::Service {
        PastStreamsService {
            traced: self.layer.layer(inner.clone()),
            plain: inner,
            span: self.span,
        }
    }
}

/// The service of [`PastStreams`].
#[derive(Clone)]
pub struct PastStreamsService<T, S> {
    traced: T,
    plain: S,
    span: fn(&Request<Body>) -> tracing::Span,
}

type Boxed<B> = fn(Response<B>) -> Response<Body>;

/// An answer with its body boxed (for the compression layer's too, in
/// `app`: kilobytes moved once instead of at every layer above).
pub(crate) fn boxed<B>(res: Response<B>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    res.map(Body::new)
}

impl<T, S, B> Service<Request<Body>> for PastStreamsService<T, S>
where
    T: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<MapOk<T::Future, Boxed<B>>, Instrumented<Oneshot<S, Request<Body>>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.traced.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if crate::visitor::stream::wants_stream(req.headers()) {
            let span = (self.span)(&req);
            Either::Right(self.plain.clone().oneshot(req).instrument(span))
        } else {
            Either::Left(self.traced.call(req).map_ok(boxed::<B> as Boxed<B>))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use futures_util::StreamExt as _;
    use http::header;
    use http_body_util::BodyExt as _;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower_http::compression::predicate::DefaultPredicate;
    use tower_http::compression::{CompressionBody, CompressionLayer};
    use tracing::Subscriber;
    use tracing::span::{Attributes, Id};
    use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt as _};

    const EVENT: &[u8] = b"event: status\ndata: {}\n\n";

    /// Counts the spans open now, and those ever made.
    #[derive(Clone, Default)]
    struct Open(Arc<AtomicUsize>, Arc<AtomicUsize>);

    impl<S: Subscriber> tracing_subscriber::Layer<S> for Open {
        fn on_new_span(&self, _: &Attributes<'_>, _: &Id, _: LayerContext<'_, S>) {
            self.0.fetch_add(1, Ordering::SeqCst);
            self.1.fetch_add(1, Ordering::SeqCst);
        }
        fn on_close(&self, _: Id, _: LayerContext<'_, S>) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn span(req: &Request<Body>) -> tracing::Span {
        tracing::info_span!("request", path = %req.uri().path())
    }

    fn json_body() -> String {
        format!("[{}0]", "0,".repeat(2000))
    }

    /// An event stream that sends one event and then waits for ever, or a
    /// few KB of JSON.
    async fn route(req: Request<Body>) -> Result<Response<Body>, Infallible> {
        tracing::info!("in the handler");
        let stream = crate::visitor::stream::wants_stream(req.headers());
        let (mut res, ct) = if stream {
            let first = futures_util::stream::once(async {
                Ok::<_, Infallible>(Bytes::from_static(EVENT))
            });
            let body = Body::from_stream(first.chain(futures_util::stream::pending()));
            (Response::new(body), "text/event-stream")
        } else {
            (Response::new(Body::from(json_body())), "application/json")
        };
        res.headers_mut()
            .insert(header::CONTENT_TYPE, http::HeaderValue::from_static(ct));
        Ok(res)
    }

    async fn call<S>(svc: &mut S, accept: &str) -> Response<Body>
    where
        S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    {
        let req = Request::builder()
            .uri("/_sluice/rooms/r/status")
            .header(header::ACCEPT, accept)
            .header(header::ACCEPT_ENCODING, "br, gzip")
            .body(Body::empty())
            .unwrap();
        svc.ready().await.unwrap().call(req).await.unwrap()
    }

    /// The stream's first event comes at once (a compressor would hold it
    /// back).
    async fn first_event(res: Response<Body>) {
        let mut body = res.into_body();
        let frame = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame())
            .await
            .expect("the first event at once")
            .unwrap()
            .unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(EVENT));
    }

    #[tokio::test]
    async fn an_open_event_stream_holds_no_span_other_answers_keep_theirs() {
        let open = Open::default();
        let subscriber = tracing_subscriber::registry().with(open.clone());
        let _guard = tracing::subscriber::set_default(subscriber);
        let layer = PastStreams {
            layer: tower_http::trace::TraceLayer::new_for_http().make_span_with(span),
            span,
        };
        let mut svc = layer.layer(tower::service_fn(route));

        // a JSON answer: its span lives until its body is read
        let res = call(&mut svc, "application/json").await;
        assert_eq!(open.0.load(Ordering::SeqCst), 1, "the body holds the span");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], json_body().as_bytes());
        assert_eq!(open.0.load(Ordering::SeqCst), 0);

        // an event stream: served in a span, open and live without one
        let res = call(&mut svc, "text/event-stream").await;
        assert_eq!(open.1.load(Ordering::SeqCst), 2, "it was served in a span");
        assert_eq!(open.0.load(Ordering::SeqCst), 0, "no span while it is open");
        first_event(res).await;
        assert_eq!(open.0.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn answers_are_compressed_and_event_streams_pass_untouched_and_live() {
        let layer = PastStreams {
            layer: CompressionLayer::new().compress_when(DefaultPredicate::new()),
            span,
        };
        let mut svc = layer.layer(tower::service_fn(route));
        // A JSON answer: compressed as before.
        let res = call(&mut svc, "application/json").await;
        assert_eq!(res.headers()[header::CONTENT_ENCODING], "br");
        // An event stream: not compressed, and its first event comes at once
        // (a compressor would hold it back).
        let res = call(&mut svc, "text/event-stream").await;
        assert!(res.headers().get(header::CONTENT_ENCODING).is_none());
        first_event(res).await;
    }

    #[test]
    fn a_compression_body_is_kilobytes_and_what_a_stream_holds_is_not() {
        // Why the layer exists (module docs): were this small, it would not.
        assert!(std::mem::size_of::<CompressionBody<Body>>() > 4096);
        assert!(std::mem::size_of::<Body>() <= 16);
    }
}
