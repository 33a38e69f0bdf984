//! Success answers shared by the resources, so that every create answers alike.

use axum::http::header::LOCATION;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::api::extract::ApiJson;
use crate::api::preconditions::etag;
use crate::error::ApiError;

/// The answer to a create: 201 with the new resource, its URL in `Location` and its version
/// in `ETag`, so that a client can change it with `If-Match` without reading it back.
pub fn created(location: &str, index: u64, body: impl Serialize) -> Result<Response, ApiError> {
    let location = HeaderValue::from_str(location).map_err(ApiError::internal)?;
    Ok((
        StatusCode::CREATED,
        [etag(index), (LOCATION, location)],
        ApiJson(body),
    )
        .into_response())
}
