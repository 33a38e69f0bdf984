//! Success answers shared by the resources, so that every create answers alike, and every
//! committed write answers whether or not its object can be read back.

use std::fmt::Display;
use std::future::Future;

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

/// What a committed write answers with: the object as `read` back, or, when that read fails,
/// as `written` (what the write itself knows of it). The write is applied, and an error would
/// invite the client to apply it again.
pub async fn read_back<T, E: Display>(
    what: &str,
    read: impl Future<Output = Result<T, E>>,
    written: impl FnOnce() -> T,
) -> T {
    match read.await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(error = %e, "reading a written {what} back failed");
            written()
        }
    }
}
