//! Request ids (one counter for the router's layer and the direct path) and
//! the answer to a handler's panic.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::response::{IntoResponse, Response};
use http::{HeaderName, HeaderValue};
use tower_http::request_id::{MakeRequestId, RequestId};

use crate::app::problem::Problem;

/// Request ids: a random per-process prefix and a counter — unique, cheap,
/// and they sort by arrival within one gateway.
#[derive(Clone)]
pub struct RequestIds {
    /// 8 hex digits.
    prefix: [u8; 8],
    next: Arc<AtomicU64>,
}

/// The header a request id travels in.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

impl Default for RequestIds {
    fn default() -> Self {
        let p: u32 = rand::random();
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(format!("{p:08x}").as_bytes());
        RequestIds {
            prefix,
            next: Arc::new(AtomicU64::new(1)),
        }
    }
}

impl RequestIds {
    /// The next id: the prefix, '-', the counter in lowercase hex (at most
    /// 25 bytes), written without `core::fmt` (it is made for every request).
    pub fn next_value(&self) -> HeaderValue {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut buf = [0u8; 25];
        buf[..8].copy_from_slice(&self.prefix);
        buf[8] = b'-';
        let digits = (64 - n.leading_zeros() as usize).div_ceil(4).max(1);
        for i in 0..digits {
            buf[9 + digits - 1 - i] = HEX[((n >> (4 * i)) & 0xf) as usize];
        }
        HeaderValue::from_bytes(&buf[..9 + digits])
            .unwrap_or_else(|_| HeaderValue::from_static("-"))
    }
}

impl MakeRequestId for RequestIds {
    fn make_request_id<B>(&mut self, _req: &http::Request<B>) -> Option<RequestId> {
        Some(RequestId::new(self.next_value()))
    }
}

pub fn panic_response(err: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let msg = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("panic");
    tracing::error!(panic = msg, "handler panicked");
    Problem::internal().into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn request_ids_are_the_prefix_and_the_counter_in_hex() {
        let ids = RequestIds::default();
        let prefix = std::str::from_utf8(&ids.prefix).unwrap().to_owned();
        assert!(prefix.bytes().all(|b| b.is_ascii_hexdigit()), "{prefix}");
        for n in [1u64, 9, 10, 15, 16, 255, 256, 0xdead_beef, u64::MAX] {
            ids.next.store(n, Ordering::Relaxed);
            assert_eq!(ids.next_value(), format!("{prefix}-{n:x}").as_str());
        }
        ids.next.store(0, Ordering::Relaxed);
        assert_eq!(ids.next_value(), format!("{prefix}-0").as_str());
    }
}
