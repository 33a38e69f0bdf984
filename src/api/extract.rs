//! Extractors that reject bad input with an [`ApiError`], so every error body has one shape.
//!
//! Handlers use these instead of axum's `Json`, `Query` and `Path`, whose rejections are
//! plain text.

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{ApiError, Cause};
use crate::labels::Selector;

/// A JSON request body (or response): 400 when malformed, 422 when of the wrong shape, 415
/// without `Content-Type: application/json`, 413 over the body limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Json(value) = Json::<T>::from_request(req, state).await?;
        Ok(ApiJson(value))
    }
}

impl<T: Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        Json(self.0).into_response()
    }
}

/// A query string deserialized into `T`; 400 when it does not fit.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(value) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(ApiQuery(value))
    }
}

/// Path parameters deserialized into `T`; 400 when they do not fit.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(value) = Path::<T>::from_request_parts(parts, state).await?;
        Ok(ApiPath(value))
    }
}

/// A JSON merge patch (RFC 7386) body: `application/merge-patch+json`, or plain
/// `application/json` for clients that cannot set the former. Must be a JSON object.
#[derive(Debug, Clone, Default)]
pub struct MergePatch(pub serde_json::Map<String, serde_json::Value>);

impl<S> FromRequest<S> for MergePatch
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        use axum::http::header::CONTENT_TYPE;
        use axum::http::StatusCode;

        let content_type = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        if content_type != "application/merge-patch+json" && content_type != "application/json" {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "a patch must be sent as application/merge-patch+json or application/json",
            ));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::new(e.status(), e.body_text()))?;
        match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Ok(serde_json::Value::Object(map)) => Ok(MergePatch(map)),
            Ok(_) => Err(ApiError::bad_request("a merge patch must be a JSON object")),
            Err(e) => Err(ApiError::bad_request(format!("malformed JSON: {e}"))),
        }
    }
}

/// The `selector` query parameter, parsed; `None` when absent. A bad one is 422 with the
/// parser's message, which says where the text went wrong.
pub fn selector_param(text: Option<&str>) -> Result<Option<Selector>, ApiError> {
    text.map(str::parse::<Selector>)
        .transpose()
        .map_err(|e| ApiError::invalid([Cause::new("selector", e.to_string())]))
}
