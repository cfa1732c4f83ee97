//! The compression layer, with event streams kept past it.
//!
//! tower-http's [`Compression`] answers every response with a
//! [`CompressionBody`], an enum as large as its largest encoder's state
//! (brotli's: about 6 KB), whether it compresses or not. Its predicate
//! never compresses an event stream, but an event stream's body was still
//! one, boxed by the panic layer above it, for as long as the stream was
//! open: more than half of an idle status stream's memory (issue 21: at
//! most 4 KiB each; measured with heaptrack, README "Measured",
//! "Streams"). So a request that asks for an event stream (`Accept:
//! text/event-stream`, [`crate::visitor::stream::wants_stream`]) goes to
//! the route as it is, and every other answer's compression body is boxed
//! here, as the panic layer boxed it before (one allocation per answer,
//! as before; the panic layer now boxes only the small bodies around it).
//!
//! Our own rather than tower's `Either` of two services: which one answers
//! is decided by the request, and both must give the same body type.

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::TryFutureExt as _;
use futures_util::future::{Either, MapOk};
use http::{Request, Response};
use tower::util::Oneshot;
use tower::{Layer, Service, ServiceExt as _};
use tower_http::compression::{
    Compression, CompressionBody, CompressionLayer, Predicate, ResponseFuture,
};

/// [`CompressionLayer`], with event streams kept past it (module docs).
#[derive(Clone)]
pub struct CompressLayer<P>(pub CompressionLayer<P>);

impl<S: Clone, P: Predicate> Layer<S> for CompressLayer<P> {
    type Service = Compress<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        Compress {
            compressed: self.0.layer(inner.clone()),
            plain: inner,
        }
    }
}

/// The service of [`CompressLayer`].
#[derive(Clone)]
pub struct Compress<S, P> {
    compressed: Compression<S, P>,
    plain: S,
}

type Boxed = fn(Response<CompressionBody<Body>>) -> Response<Body>;

fn boxed(res: Response<CompressionBody<Body>>) -> Response<Body> {
    res.map(Body::new)
}

impl<S, P> Service<Request<Body>> for Compress<S, P>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
    P: Predicate,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<MapOk<ResponseFuture<S::Future, P>, Boxed>, Oneshot<S, Request<Body>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.compressed.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if crate::visitor::stream::wants_stream(req.headers()) {
            Either::Right(self.plain.clone().oneshot(req))
        } else {
            Either::Left(self.compressed.call(req).map_ok(boxed as Boxed))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http::header;
    use http_body_util::BodyExt as _;
    use tower_http::compression::predicate::DefaultPredicate;

    /// The answer of the route below: a few KB of JSON, or an event stream
    /// that sends one event and then waits for ever.
    async fn route(req: Request<Body>) -> Result<Response<Body>, Infallible> {
        let stream = crate::visitor::stream::wants_stream(req.headers());
        let mut res = if stream {
            let first = futures_util::stream::once(async {
                Ok::<_, Infallible>(axum::body::Bytes::from_static(
                    b"event: status\ndata: {}\n\n",
                ))
            });
            Response::new(Body::from_stream(
                first.chain(futures_util::stream::pending()),
            ))
        } else {
            Response::new(Body::from(format!("[{}0]", "0,".repeat(2000))))
        };
        let ct = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        res.headers_mut()
            .insert(header::CONTENT_TYPE, http::HeaderValue::from_static(ct));
        Ok(res)
    }

    fn request(accept: &str) -> Request<Body> {
        Request::builder()
            .header(header::ACCEPT, accept)
            .header(header::ACCEPT_ENCODING, "br, gzip")
            .body(Body::empty())
            .unwrap()
    }

    use futures_util::StreamExt as _;

    #[tokio::test]
    async fn answers_are_compressed_and_event_streams_pass_untouched_and_live() {
        let layer = CompressLayer(CompressionLayer::new().compress_when(DefaultPredicate::new()));
        let mut svc = layer.layer(tower::service_fn(route));
        // A JSON answer: compressed as before.
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(request("application/json"))
            .await
            .unwrap();
        assert_eq!(res.headers()[header::CONTENT_ENCODING], "br");
        // An event stream: not compressed, and its first event comes at once
        // (a compressor would hold it back).
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(request("text/event-stream"))
            .await
            .unwrap();
        assert!(res.headers().get(header::CONTENT_ENCODING).is_none());
        let mut body = res.into_body();
        let frame = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame())
            .await
            .expect("the first event at once")
            .unwrap()
            .unwrap();
        assert_eq!(
            frame.into_data().unwrap(),
            axum::body::Bytes::from_static(b"event: status\ndata: {}\n\n")
        );
    }

    #[test]
    fn a_compression_body_is_kilobytes_and_what_a_stream_holds_is_not() {
        // Why the layer exists (module docs): were this small, it would not.
        assert!(std::mem::size_of::<CompressionBody<Body>>() > 4096);
        assert!(std::mem::size_of::<Body>() <= 16);
    }
}
