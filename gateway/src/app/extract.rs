//! The extractors the handlers share.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use http::header;

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
        if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
            if !(ct.starts_with("application/json") || ct.contains("+json")) {
                return Err(Problem::unsupported_media_type());
            }
        }
        let body: Body = req.into_body();
        let bytes = axum::body::to_bytes(body, limit)
            .await
            .map_err(|_| Problem::body_too_large().with("limit_bytes", limit))?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| Problem::malformed(format!("invalid JSON body: {e}")))
    }
}
