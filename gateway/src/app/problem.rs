//! Errors as HTTP answers: every error the gateway itself produces is an
//! `application/problem+json` document (RFC 9457) with the stable `code` of
//! API.md. This is the one place where faults become responses; the private
//! cause is logged here, once, and never sent to the client.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Map, Value, json};

/// A problem answer under construction.
#[derive(Debug, Clone)]
pub struct Problem {
    status: StatusCode,
    code: &'static str,
    title: String,
    extra: Map<String, Value>,
    retry_after: Option<u64>,
}

impl Problem {
    /// A problem with the given status, API code and human title.
    pub fn new(status: StatusCode, code: &'static str, title: impl Into<String>) -> Problem {
        Problem {
            status,
            code,
            title: title.into(),
            extra: Map::new(),
            retry_after: None,
        }
    }

    /// Adds a field beside `type`, `title`, `status` and `code`.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Problem {
        self.extra.insert(key.to_owned(), value.into());
        self
    }

    /// Adds a `Retry-After` header (seconds).
    pub fn retry_after(mut self, seconds: u64) -> Problem {
        self.retry_after = Some(seconds);
        self
    }

    /// Logs a private cause at warn level and returns self (the cause is
    /// never part of the answer).
    pub fn log_cause(self, cause: &dyn std::fmt::Display) -> Problem {
        tracing::warn!(code = self.code, status = self.status.as_u16(), cause = %cause, "request failed");
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The API code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The `reason` field, when the problem has one.
    pub fn reason(&self) -> Option<&str> {
        self.extra.get("reason").and_then(Value::as_str)
    }

    // === the codes of API.md ===

    /// 400 `malformed_request`.
    pub fn malformed(detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "malformed_request",
            "The request is malformed",
        )
        .with("detail", detail.into())
    }

    /// 401 `unauthorized` (admin API): no bearer token, or not the
    /// admin token (`reason` `token_refused`).
    pub fn unauthorized() -> Problem {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "A valid admin token is required",
        )
        .with("reason", "token_refused")
    }

    /// 401 `unauthorized` from a gateway started without an admin token
    /// (`reason` `no_admin_token`): no token opens its admin API, and the
    /// detail says how to give it one. Telling this apart costs nothing:
    /// there is no token to guess.
    pub fn no_admin_token() -> Problem {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "A valid admin token is required",
        )
        .with("reason", "no_admin_token")
        .with(
            "detail",
            "this gateway has no admin token (start it with --admin-token or SLUICE_ADMIN_TOKEN)",
        )
    }

    /// 404 `room_not_found`.
    pub fn room_not_found() -> Problem {
        Problem::new(
            StatusCode::NOT_FOUND,
            "room_not_found",
            "No such waiting room",
        )
    }

    /// 404 `not_found` for unknown gateway paths.
    pub fn not_found() -> Problem {
        Problem::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "No such gateway endpoint",
        )
    }

    /// 405 `method_not_allowed`.
    pub fn method_not_allowed() -> Problem {
        Problem::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "Method not allowed on this endpoint",
        )
    }

    /// 413 `body_too_large`.
    pub fn body_too_large() -> Problem {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "The request body is too large",
        )
    }

    /// 415 `unsupported_media_type`.
    pub fn unsupported_media_type() -> Problem {
        Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Expected Content-Type: application/json",
        )
    }

    /// 422 `invalid_setting`.
    pub fn invalid_setting(field: &str, reason: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_setting",
            "A setting is out of range",
        )
        .with("field", field.to_owned())
        .with("detail", reason.into())
    }

    /// 429 `rate_limited`.
    pub fn rate_limited(retry_after: u64) -> Problem {
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "Too many requests from your network; slow down",
        )
        .retry_after(retry_after.max(1))
    }

    /// 502 `origin_unreachable`.
    pub fn origin_unreachable() -> Problem {
        Problem::new(
            StatusCode::BAD_GATEWAY,
            "origin_unreachable",
            "The origin cannot be reached",
        )
        .retry_after(5)
    }

    /// 502 `origin_tls_failed`: the TLS handshake with an `https://`
    /// origin failed (an expired or wrong-host certificate, one from an
    /// untrusted issuer, a peer that does not speak TLS).
    pub fn origin_tls_failed() -> Problem {
        Problem::new(
            StatusCode::BAD_GATEWAY,
            "origin_tls_failed",
            "The origin's TLS connection could not be verified",
        )
        .retry_after(5)
    }

    /// 504 `origin_timeout`.
    pub fn origin_timeout() -> Problem {
        Problem::new(
            StatusCode::GATEWAY_TIMEOUT,
            "origin_timeout",
            "The origin did not answer in time",
        )
        .retry_after(5)
    }

    /// 503 `store_unavailable`.
    pub fn store_unavailable() -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "The gateway's store cannot be reached; try again shortly",
        )
        .retry_after(2)
    }

    /// 503 `store_unavailable` with `"reason": "overloaded"`: the gateway
    /// already has `limits.max_store_requests` store-bound requests in
    /// flight (a slow store); this one is refused at once.
    pub fn store_overloaded() -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "Too many requests are waiting for the store; try again shortly",
        )
        .with("reason", "overloaded")
        .retry_after(1)
    }

    /// 503 `overloaded`: the gateway already forwards
    /// `limits.max_origin_requests` requests to the origin; this one is
    /// refused at once.
    pub fn origin_overloaded() -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "Too many requests are in flight to the origin; try again shortly",
        )
        .retry_after(1)
    }

    /// 408 `request_timeout`: the request's body did not arrive within
    /// `timeouts.body_read`.
    pub fn request_timeout() -> Problem {
        Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            "The request body did not arrive in time",
        )
    }

    /// 423 `room_closed`.
    pub fn room_closed() -> Problem {
        Problem::new(
            StatusCode::LOCKED,
            "room_closed",
            "This waiting room is closed",
        )
    }

    /// 422 `lane_not_found`: the join's enqueue token names a lane the room
    /// does not have; nothing was taken or spent (checked before the work).
    pub fn lane_not_found() -> Problem {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "lane_not_found",
            "The enqueue token names a lane this room does not have",
        )
    }

    /// 503 `room_full`: a room of the `reject` queueing method cannot let
    /// the visitor in now and keeps no line; nothing was taken (no place,
    /// no seq, the proof of work and any invite stay good). `Retry-After`
    /// is when the bucket is likely to hold an admission again.
    pub fn room_full(retry_after: u64) -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "room_full",
            "This room is full and keeps no line: try again later",
        )
        .retry_after(retry_after.max(1))
    }

    /// 429 `pow_too_early`: a valid solution sent before the challenge's
    /// minimum solve age; the same solution is accepted for the same place
    /// once `retry_after_ms` have passed.
    pub fn pow_too_early(retry_after_ms: u64) -> Problem {
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "pow_too_early",
            "Solved sooner than this challenge allows; send the same solution again shortly",
        )
        .with("retry_after_ms", retry_after_ms)
        .retry_after(retry_after_ms.div_ceil(1000).max(1))
    }

    /// 500 `internal_error` (a bug; the cause is logged).
    pub fn internal() -> Problem {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "Internal error",
        )
    }
}

/// The admission store's faults as answers: what the visitor or the
/// operator can do about each (the cause is logged once, here).
impl From<sluice_admission::AdmissionError> for Problem {
    fn from(e: sluice_admission::AdmissionError) -> Problem {
        use sluice_admission::AdmissionError as E;
        match &e {
            E::Closed(_) => Problem::room_closed(),
            E::Full(_) => Problem::room_full(1),
            E::LaneNotFound(_) => Problem::lane_not_found(),
            E::InvalidRoomId(_) => Problem::room_not_found(),
            E::InvalidSetting(i) => Problem::invalid_setting(i.field, i.reason.clone()),
            _ => Problem::store_unavailable().log_cause(&e),
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert(
            "type".into(),
            json!(format!("https://sluice.dev/problems/{}", self.code)),
        );
        body.insert("title".into(), json!(self.title));
        body.insert("status".into(), json!(self.status.as_u16()));
        body.insert("code".into(), json!(self.code));
        for (k, v) in self.extra {
            body.insert(k, v);
        }
        let bytes = serde_json::to_vec(&Value::Object(body)).unwrap_or_default();
        let mut res = (self.status, bytes).into_response();
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        res
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn problem_json_shape() {
        let res = Problem::rate_limited(3).with("x", 1).into_response();
        assert_eq!(res.status(), 429);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        assert_eq!(res.headers()["cache-control"], "no-store");
        assert_eq!(res.headers()["retry-after"], "3");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], "rate_limited");
        assert_eq!(v["status"], 429);
        assert_eq!(v["x"], 1);
        assert!(v["type"].as_str().unwrap().ends_with("rate_limited"));
    }
}
