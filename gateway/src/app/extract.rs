//! The extractors the handlers share.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use http::{HeaderMap, header};

use crate::app::problem::Problem;
use crate::app::state::AppState;

/// A JSON request body, read within the configured limit; every failure is
/// a problem+json answer (400 `malformed_request`, 413 `body_too_large`).
pub struct JsonBody<T>(pub T);

impl<T> FromRequest<AppState> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
{
    type Rejection = Problem;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.config().limits.control_body_bytes;
        json_content(req.headers())?;
        let body: Body = req.into_body();
        let bytes = axum::body::to_bytes(body, limit)
            .await
            .map_err(|_| Problem::body_too_large().with("limit_bytes", limit))?;
        Self::parse(&bytes)
    }
}

impl<T: serde::de::DeserializeOwned> JsonBody<T> {
    /// A body already read whole, its `Content-Type` as the headers say:
    /// what [`FromRequest`] answers for it (415, 400 or the value).
    pub(crate) fn read(headers: &HeaderMap, bytes: &[u8]) -> Result<Self, Problem> {
        json_content(headers)?;
        Self::parse(bytes)
    }

    fn parse(bytes: &[u8]) -> Result<Self, Problem> {
        serde_json::from_slice(bytes)
            .map(JsonBody)
            .map_err(|e| Problem::malformed(format!("invalid JSON body: {e}")))
    }
}

/// 415 `unsupported_media_type` unless the body is said to be JSON (or
/// not said to be anything).
fn json_content(headers: &HeaderMap) -> Result<(), Problem> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
        if !(ct.starts_with("application/json") || ct.contains("+json")) {
            return Err(Problem::unsupported_media_type());
        }
    }
    Ok(())
}
