//! Optimistic concurrency over HTTP: a single resource's `ETag` is its modify index, and
//! `If-Match` makes a write conditional on it (412 when stale).

use axum::extract::FromRequestParts;
use axum::http::header::{ETAG, IF_MATCH};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue};

use crate::error::ApiError;
use crate::store::update::UpdateError;

/// The index a write must find, from `If-Match` (`"42"`, `W/"42"` or `42`); `None` without
/// the header or with `*`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IfMatch(pub Option<u64>);

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(IF_MATCH) else {
            return Ok(IfMatch(None));
        };
        let text = value
            .to_str()
            .map_err(|_| ApiError::bad_request("If-Match is not valid text"))?
            .trim();
        if text == "*" {
            return Ok(IfMatch(None));
        }
        let bare = text.trim_start_matches("W/").trim_matches('"');
        bare.parse::<u64>().map(|i| IfMatch(Some(i))).map_err(|_| {
            ApiError::bad_request(format!(
                "If-Match must be an ETag this server issued, like \"42\"; got {text:?}"
            ))
        })
    }
}

/// The `ETag` header for a resource at `index`.
pub fn etag(index: u64) -> (HeaderName, HeaderValue) {
    let value = HeaderValue::from_str(&format!("\"{index}\"")).expect("digits are a valid header");
    (ETAG, value)
}

/// The 412 answered when a conditional write finds the resource changed.
pub fn stale(what: &str, expected: u64) -> ApiError {
    ApiError::precondition_failed(format!(
        "{what} has changed since version {expected}; read it again and retry"
    ))
}

/// A read-modify-write whose `If-Match` version is no longer current answers 412.
impl UpdateError for ApiError {
    fn stale(what: &str, expected: u64) -> Self {
        stale(what, expected)
    }
}
