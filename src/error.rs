//! The one error type handlers return, and the JSON body every error response carries.
//!
//! Which constructor to use:
//! - [`ApiError::invalid`] / [`Violations`]: the request parsed but its content is wrong
//!   (422 `Invalid`); list every bad field at once.
//! - [`ApiError::bad_request`]: the request cannot be understood at all (400).
//! - [`ApiError::not_found`], [`ApiError::conflict`], [`ApiError::precondition_failed`]: the
//!   named resource is missing, changed concurrently, or not in the state the client expected.
//! - [`ApiError::internal`] and [`ApiError::unavailable`]: anything the client cannot fix. The
//!   client sees a generic message; the cause is logged once, inside the request's span.
//! - [`ApiError::store_timeout`] and [`ApiError::outcome_unknown`]: 503s with reasons of their
//!   own, for a store that does not answer in time and for a write it may or may not have
//!   applied.
//! - [`ApiError::new`]: any other status; its message is sent as given.
//!
//! A [`StoreError`] converts with `?`; see the `From` impl for the mapping.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::kv::StoreError;
use crate::model::FieldError;

/// The body of every error response, shaped like a Kubernetes `Status` so clients branch on
/// `reason` and show `message`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The HTTP status code, repeated so a logged or saved body stands on its own.
    pub code: u16,
    /// CamelCase name of the failure, one per status: `NotFound`, `Conflict`, `Invalid`,
    /// `PreconditionFailed`, `PayloadTooLarge`, `ServiceUnavailable`, `InternalError`, ...;
    /// except that a 503 says `StoreTimeout` when the store did not answer within the
    /// request's deadline and nothing was written (retry later), and `OutcomeUnknown` when a
    /// write was sent but not confirmed, so it may or may not have been applied: re-read
    /// before retrying.
    /// `UnreadableDocument` (500) when a stored document cannot be decoded.
    pub reason: String,
    /// For people; never parse it.
    pub message: String,
    /// Every bad field of a rejected request, so the client can fix them all in one go.
    pub causes: Vec<Cause>,
}

impl ErrorBody {
    /// An error response of the OpenAPI document, for the responses added to operations
    /// after they are collected (the limits on every request, authentication).
    pub fn documented(description: &str) -> utoipa::openapi::RefOr<utoipa::openapi::Response> {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let body = ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("ErrorBody")))
            .build();
        let response = ResponseBuilder::new()
            .description(description)
            .content("application/json", body)
            .build();
        utoipa::openapi::RefOr::T(response)
    }
}

/// One bad field of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Cause {
    /// Path of the field as named in JSON, e.g. `spec.replicas` or `labels[0]`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl Cause {
    /// Shorthand for building causes inline.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A model rule's finding, reported as it was found.
impl From<FieldError> for Cause {
    fn from(error: FieldError) -> Self {
        Cause::new(error.field, error.message)
    }
}

/// An error on its way to becoming a JSON response.
#[derive(Debug, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    status: StatusCode,
    /// Set where one status covers failures the client must tell apart; otherwise the
    /// status's own reason.
    reason: Option<&'static str>,
    message: String,
    causes: Vec<Cause>,
    /// What really went wrong, for the log only: 5xx bodies stay generic so they leak
    /// nothing about the store or the deployment.
    internal: Option<String>,
}

impl ApiError {
    /// An error whose `message` is sent exactly as given; for a hidden cause use
    /// [`ApiError::internal`] or [`ApiError::unavailable`] instead.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            reason: None,
            message: message.into(),
            causes: Vec::new(),
            internal: None,
        }
    }

    /// 400: the request cannot be parsed, so no field-level detail is possible.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404: the named resource does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 405: the route does not take `method`; the answer's `Allow` lists what it takes.
    pub fn method_not_allowed(method: &axum::http::Method, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed on {path}; the Allow header lists what is"),
        )
    }

    /// 409: someone else changed the resource first (a CAS miss); re-read and retry.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }

    /// 412: the resource is not in the state the client said it expected.
    pub fn precondition_failed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PRECONDITION_FAILED, message)
    }

    /// 422 listing every bad field; the message repeats them for clients that only show it.
    pub fn invalid(causes: impl IntoIterator<Item = impl Into<Cause>>) -> Self {
        let causes: Vec<Cause> = causes.into_iter().map(Into::into).collect();
        let detail = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect::<Vec<_>>()
            .join("; ");
        ApiError {
            causes,
            ..Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("the request is invalid: {detail}"),
            )
        }
    }

    /// 500 with a generic body; `cause` goes to the log only.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        ApiError {
            internal: Some(cause.to_string()),
            ..Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal server error")
        }
    }

    /// 503 with a generic body; `cause` goes to the log only. The client may retry.
    pub fn unavailable(cause: impl std::fmt::Display) -> Self {
        ApiError {
            internal: Some(cause.to_string()),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the store is unavailable; retry later",
            )
        }
    }

    /// 503 `StoreTimeout`: the store did not answer within the request's deadline, and
    /// nothing was written (a read, or writes all withdrawn before the store took them); the
    /// client may retry. `cause` goes to the log.
    pub fn store_timeout(cause: impl std::fmt::Display) -> Self {
        ApiError {
            reason: Some(STORE_TIMEOUT),
            ..Self::unavailable(cause).with_message("the store did not answer in time; retry later")
        }
    }

    /// 503 `OutcomeUnknown`: a write reached the store (or may have) but its answer did not
    /// come back, so it may or may not have been applied. A blind retry could apply it twice
    /// or undo someone else's change; the client must re-read first. `cause` goes to the log.
    pub fn outcome_unknown(cause: impl std::fmt::Display) -> Self {
        ApiError {
            reason: Some(OUTCOME_UNKNOWN),
            ..Self::unavailable(cause).with_message(
                "the store did not confirm the write, which may or may not have been applied; \
                 re-read before retrying",
            )
        }
    }

    /// The same error with another message for the client.
    pub fn with_message(self, message: &str) -> Self {
        ApiError {
            message: message.into(),
            ..self
        }
    }

    /// 500 `UnreadableDocument`: the stored document the request names cannot be decoded.
    /// Nothing secret is in such a message, so it is sent (and logged); it should say how to
    /// clear the document.
    pub fn unreadable(message: impl Into<String>) -> Self {
        let message = message.into();
        ApiError {
            internal: Some(message.clone()),
            reason: Some(UNREADABLE_DOCUMENT),
            ..Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
        }
    }

    /// The same error listing `causes`, for a 400 that can name the parts it could not read.
    pub fn with_causes(self, causes: Vec<Cause>) -> Self {
        ApiError { causes, ..self }
    }

    /// The HTTP status the response will carry.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Whether the error tells of what the store holds (an object missing, or stored but
    /// unreadable), rather than of the request or of the store's health: a read answers it
    /// at the index it reflects ([`crate::api::blocking::error_at`]).
    pub fn tells_what_is_stored(&self) -> bool {
        self.status == StatusCode::NOT_FOUND || self.reason == Some(UNREADABLE_DOCUMENT)
    }

    /// The body exactly as it will be sent.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.status.as_u16(),
            reason: self
                .reason
                .map_or_else(|| reason(self.status), String::from),
            message: self.message.clone(),
            causes: self.causes.clone(),
        }
    }

    /// axum's rejections say precisely what was wrong with the request; keep their status
    /// and text, except for the rare 5xx, which is treated like any internal error.
    fn rejected(status: StatusCode, text: String) -> Self {
        if status.is_server_error() {
            Self::internal(text)
        } else {
            Self::new(status, text)
        }
    }
}

/// The reason of [`ApiError::store_timeout`].
pub const STORE_TIMEOUT: &str = "StoreTimeout";
/// The reason of [`ApiError::outcome_unknown`].
pub const OUTCOME_UNKNOWN: &str = "OutcomeUnknown";
/// The reason of a 500 for a stored document that cannot be decoded.
pub const UNREADABLE_DOCUMENT: &str = "UnreadableDocument";

/// The CamelCase reason for a status: Kubernetes' names where they differ from HTTP's
/// (422 is `Invalid`, 500 is `InternalError`), otherwise HTTP's reason phrase run together.
fn reason(status: StatusCode) -> String {
    match status {
        StatusCode::UNPROCESSABLE_ENTITY => "Invalid".into(),
        StatusCode::INTERNAL_SERVER_ERROR => "InternalError".into(),
        _ => status
            .canonical_reason()
            .unwrap_or("Unknown")
            .split(|c: char| !c.is_ascii_alphanumeric())
            .collect(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // Built once per failed request, inside its span: the one place the cause is logged.
        if let Some(cause) = &self.internal {
            tracing::error!(status = self.status.as_u16(), %cause, "request failed");
        }
        let retry = (self.status == StatusCode::SERVICE_UNAVAILABLE
            && self.reason != Some(OUTCOME_UNKNOWN))
        .then_some([(RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECONDS))]);
        (self.status, retry, Json(self.body())).into_response()
    }
}

/// The `Retry-After` of a 503, in seconds: the server is briefly unable to answer (its
/// store, its mirror, or its connection cap), and clients and SDKs that honour the header
/// should come back soon rather than at once or never. Not of an `OutcomeUnknown`: the write
/// may have been applied, and a client (or an SDK's retry policy) retrying it blindly could
/// apply it twice; it must re-read first.
pub const RETRY_AFTER_SECONDS: &str = "1";

/// Collects every problem found while validating one request, so the client gets them all in
/// a single 422 instead of one per attempt.
#[derive(Debug, Default)]
pub struct Violations {
    causes: Vec<Cause>,
}

impl Violations {
    /// No problems yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `field` is wrong and why.
    pub fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.causes.push(Cause::new(field, message));
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.causes.is_empty()
    }

    /// `Ok` if nothing was recorded, otherwise one [`ApiError::invalid`] listing everything.
    pub fn finish(self) -> Result<(), ApiError> {
        if self.causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(self.causes))
        }
    }

    /// Like [`Violations::finish`], for a request another part of which an extractor has
    /// already checked: one 422 lists the causes of both. An error of `checked` that is not a
    /// 422 comes first, as it would have without this request's own problems.
    pub fn finish_with<T>(mut self, checked: Result<T, ApiError>) -> Result<T, ApiError> {
        match checked {
            Ok(value) => self.finish().map(|()| value),
            Err(e) if e.status == StatusCode::UNPROCESSABLE_ENTITY => {
                self.causes.extend(e.causes);
                Err(ApiError::invalid(self.causes))
            }
            Err(e) => Err(e),
        }
    }
}

/// How store failures reach clients:
/// - `NotFound` → 404, `Conflict` → 409, `Invalid` → 422, with the store's message.
/// - `Unavailable` → 503, generic body: the client may retry once the store is back.
/// - `OutcomeUnknown` → 503 `OutcomeUnknown`: the client re-reads before retrying.
/// - `Forbidden` → 500, generic body: the store refused *this server's* credentials (its
///   Consul token), which no client can fix and a retry will not heal; the operator finds
///   the store's message in the log.
impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound(_) => Self::not_found(err.to_string()),
            StoreError::Conflict { .. } => Self::conflict(err.to_string()),
            StoreError::Invalid(_) => Self::new(StatusCode::UNPROCESSABLE_ENTITY, err.to_string()),
            StoreError::Unavailable(_) => Self::unavailable(err),
            StoreError::OutcomeUnknown(_) => Self::outcome_unknown(err),
            StoreError::Forbidden(_) => Self::internal(format!(
                "the store refused the server's credentials (check --consul-token): {err}"
            )),
        }
    }
}

/// Malformed JSON is 400, well-formed JSON of the wrong shape 422, a missing
/// `Content-Type: application/json` 415, a body over the limit 413.
impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        Self::rejected(rejection.status(), rejection.body_text())
    }
}

/// A path segment that does not deserialize is 400.
impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::rejected(rejection.status(), rejection.body_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_camel_case() {
        let cases = [
            (StatusCode::BAD_REQUEST, "BadRequest"),
            (StatusCode::FORBIDDEN, "Forbidden"),
            (StatusCode::NOT_FOUND, "NotFound"),
            (StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
            (StatusCode::CONFLICT, "Conflict"),
            (StatusCode::PRECONDITION_FAILED, "PreconditionFailed"),
            (StatusCode::PAYLOAD_TOO_LARGE, "PayloadTooLarge"),
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType"),
            (StatusCode::UNPROCESSABLE_ENTITY, "Invalid"),
            (StatusCode::INTERNAL_SERVER_ERROR, "InternalError"),
            (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
        ];
        for (status, expected) in cases {
            assert_eq!(reason(status), expected, "{status}");
        }
    }

    #[test]
    fn violations_report_every_cause() {
        let mut v = Violations::new();
        assert!(v.is_empty());
        v.add("spec.replicas", "must not be negative");
        v.add("labels[0]", "bad key");
        let body = v.finish().unwrap_err().body();
        assert_eq!(body.code, 422);
        assert_eq!(body.reason, "Invalid");
        assert_eq!(
            body.causes,
            [
                Cause::new("spec.replicas", "must not be negative"),
                Cause::new("labels[0]", "bad key")
            ]
        );
        assert!(body.message.contains("spec.replicas: must not be negative"));
        assert!(body.message.contains("labels[0]: bad key"));
        assert!(Violations::new().finish().is_ok());
    }

    #[test]
    fn violations_join_the_causes_of_an_extractors_422() {
        let checked = |field: &str| Err::<(), _>(ApiError::invalid([Cause::new(field, "bad")]));
        let mut v = Violations::new();
        v.add("pod_id", "bad");
        let body = v.finish_with(checked("limit")).unwrap_err().body();
        let fields: Vec<_> = body.causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!((body.code, fields), (422, vec!["pod_id", "limit"]));

        let mut v = Violations::new();
        v.add("pod_id", "bad");
        let unreadable = Err::<(), _>(ApiError::bad_request("unknown parameter"));
        assert_eq!(
            v.finish_with(unreadable).unwrap_err().status().as_u16(),
            400
        );
        assert_eq!(Violations::new().finish_with(Ok(7)).unwrap(), 7);
    }

    #[test]
    fn store_errors_map_to_statuses() {
        let cases = [
            (StoreError::NotFound("k".into()), StatusCode::NOT_FOUND),
            (StoreError::conflict("cas"), StatusCode::CONFLICT),
            (
                StoreError::Invalid("key".into()),
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            (
                StoreError::Forbidden("ACL".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                StoreError::Unavailable("down".into()),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                StoreError::OutcomeUnknown("lost".into()),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
        ];
        for (err, status) in cases {
            assert_eq!(ApiError::from(err).status(), status);
        }
    }

    #[test]
    fn store_timeouts_and_unknown_outcomes_have_reasons_of_their_own() {
        let cases = [
            (ApiError::unavailable("down"), "ServiceUnavailable"),
            (ApiError::store_timeout("hung"), STORE_TIMEOUT),
            (ApiError::outcome_unknown("lost"), OUTCOME_UNKNOWN),
            (
                ApiError::from(StoreError::OutcomeUnknown("lost".into())),
                OUTCOME_UNKNOWN,
            ),
        ];
        for (err, reason) in cases {
            let body = err.body();
            assert_eq!((body.code, body.reason.as_str()), (503, reason));
        }
        let unknown = ApiError::outcome_unknown("lost").body();
        assert!(unknown.message.contains("re-read"), "{unknown:?}");
    }

    #[test]
    fn a_503_says_when_to_retry_unless_its_write_may_have_been_applied() {
        let retry_after = |err: ApiError| {
            let response = err.into_response();
            response.headers().get(RETRY_AFTER).cloned()
        };
        assert_eq!(
            retry_after(ApiError::unavailable("down")).unwrap(),
            RETRY_AFTER_SECONDS
        );
        assert!(retry_after(ApiError::store_timeout("hung")).is_some());
        assert_eq!(retry_after(ApiError::outcome_unknown("lost")), None);
    }

    #[test]
    fn server_errors_hide_their_cause() {
        let secret = "consul at 10.0.0.7:8500 said: Permission denied";
        for err in [
            ApiError::from(StoreError::Forbidden(secret.into())),
            ApiError::from(StoreError::Unavailable(secret.into())),
            ApiError::from(StoreError::OutcomeUnknown(secret.into())),
            ApiError::store_timeout(secret),
            ApiError::internal(secret),
        ] {
            let body = err.body();
            assert!(!body.message.contains("10.0.0.7"), "{body:?}");
            assert_eq!(
                err.internal.as_deref().map(|c| c.contains(secret)),
                Some(true)
            );
        }
    }
}
