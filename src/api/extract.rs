//! Extractors that reject bad input with an [`ApiError`], so every error body has one shape.
//!
//! Handlers use these instead of axum's `Json`, `Query` and `Path`, whose rejections are
//! plain text.

mod objects;

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use axum::body::Bytes;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor,
};
use serde::{Deserialize, Serialize};
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::IntoParams;

use objects::ObjectsOnly;

use crate::api::query_values::{not_of_kind, takes};
use crate::error::{ApiError, Cause};

/// A JSON request body (or response): 400 when malformed, 422 when of the wrong shape
/// (naming the field, [`shaped`]) or naming a key twice in any object (see
/// [`refuse_duplicate_keys`]), 415 without `Content-Type: application/json` (not another
/// `+json` type, such as a merge patch, which the document could not name), 413 over the
/// body limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let sent = media_type(req.headers());
        if sent != "application/json" {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "the body must be sent as application/json; got {}",
                    described(&sent)
                ),
            ));
        }
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(JsonRejection::from)?;
        refuse_duplicate_keys(&bytes)?;
        let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
        let value = shaped(&mut deserializer)?;
        deserializer.end().map_err(malformed_json)?;
        Ok(ApiJson(value))
    }
}

/// JSON read into the shape `T`: a value that does not fit it (of the wrong type at any
/// depth, an array where an object goes included, a field missing or unknown) is 422 with a
/// cause naming the field, as every other invalid body is; JSON that is not well formed is
/// 400.
pub fn shaped<'de, T, D>(deserializer: D) -> Result<T, ApiError>
where
    T: Deserialize<'de>,
    D: Deserializer<'de, Error = serde_json::Error>,
{
    serde_path_to_error::deserialize(ObjectsOnly(deserializer)).map_err(|e| {
        if e.inner().classify() != serde_json::error::Category::Data {
            return malformed_json(e.into_inner());
        }
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        // The path ends at an unknown field, but at a missing one's object: serde names a
        // missing field only in its message.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next());
        let field = match (path.as_str(), missing) {
            (".", None) => "body".to_owned(),
            (".", Some(name)) => name.to_owned(),
            (_, Some(name)) => format!("{path}.{name}"),
            (_, None) => path,
        };
        ApiError::invalid([Cause::new(field, message)])
    })
}

/// 400 for JSON that is not well formed, every body's wording of it.
pub fn malformed_json(e: serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("malformed JSON: {e}"))
}

/// A media type [`media_type`] read, as a 415 names what was sent (its first 100
/// characters, for a header that could hold thousands).
fn described(media_type: &str) -> &str {
    match media_type.char_indices().nth(100) {
        _ if media_type.is_empty() => "no Content-Type",
        Some((end, _)) => &media_type[..end],
        None => media_type,
    }
}

/// The media type of a request's `Content-Type`, lower-cased, without parameters.
fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// Refuses a JSON body in which some object, at any depth, names a key twice (422 naming
/// where): parsers disagree on which value wins, so such a body means different things to
/// different readers. Malformed JSON passes here and is reported by the parse that follows.
pub fn refuse_duplicate_keys(bytes: &[u8]) -> Result<(), ApiError> {
    let found = RefCell::new(None);
    let seed = DuplicateKeys {
        at: String::new(),
        found: &found,
    };
    let _ = seed.deserialize(&mut serde_json::Deserializer::from_slice(bytes));
    match found.into_inner() {
        Some(cause) => Err(ApiError::invalid([cause])),
        None => Ok(()),
    }
}

/// Walks one JSON value, recording the first duplicate key (and stopping there).
struct DuplicateKeys<'a> {
    /// Where this value is, written as [`shaped`] names a field (`labels`, `items[0].name`);
    /// empty at the top.
    at: String,
    found: &'a RefCell<Option<Cause>>,
}

impl DuplicateKeys<'_> {
    fn field(&self, name: &str) -> Self {
        self.at(if self.at.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.at)
        })
    }

    fn element(&self, index: usize) -> Self {
        self.at(format!("{}[{index}]", self.at))
    }

    fn at(&self, at: String) -> Self {
        DuplicateKeys {
            at,
            found: self.found,
        }
    }
}

impl<'de> DeserializeSeed<'de> for DuplicateKeys<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DuplicateKeys<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                let field = if self.at.is_empty() { "body" } else { &self.at };
                *self.found.borrow_mut() =
                    Some(Cause::new(field, format!("names the key {key:?} twice")));
                return Err(de::Error::custom("duplicate key"));
            }
            map.next_value_seed(self.field(&key))?;
            seen.insert(key);
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        while seq.next_element_seed(self.element(index))?.is_some() {
            index += 1;
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

impl<T: Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        Json(self.0).into_response()
    }
}

/// A query string deserialized into `T`, whose `IntoParams` declares every parameter the
/// route takes: 400 naming any other parameter, one given twice (but a list, see
/// [`QueryProblems::new`]), or one whose value does not fit its field of `T`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned + IntoParams,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut problems = QueryProblems::new(parts.uri.query(), declared_params::<T>);
        let value = problems.read();
        problems.finish()?;
        // `read` notes a problem whenever it gives nothing, so `finish` has refused that.
        value
            .map(ApiQuery)
            .ok_or_else(|| ApiError::bad_request("the query cannot be read"))
    }
}

/// The query of a route that takes no parameters: 400 naming any that is sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoQuery;

impl<S: Send + Sync> FromRequestParts<S> for NoQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        QueryProblems::new(parts.uri.query(), Vec::new).finish()?;
        Ok(NoQuery)
    }
}

/// The query parameters `T` declares, in declaration order, as the API document publishes
/// them: each one's name, and the schema that says what it takes.
pub fn declared_params<T: IntoParams>() -> Vec<Parameter> {
    T::into_params(|| Some(ParameterIn::Query))
}

/// What makes a query string unreadable (400): parameters the route does not take, ones
/// given more than once (but a list), and values not of their parameter's kind. Collected
/// so that one answer names them all. Every query is read through here, so each such answer
/// names its parameters in `causes`.
pub struct QueryProblems {
    accepted: Vec<Parameter>,
    /// The query's accepted parameters, each with its first value only, for [`Self::read`].
    first_values: String,
    unknown: Vec<String>,
    malformed: Vec<Cause>,
}

impl QueryProblems {
    /// Starts with the parameters of `query` that are not among those `accepted` lists, and
    /// those it gives more than once (which one counts would be a guess), but for a list
    /// (a parameter published as an array): its values, comma-separated as the document
    /// says or the parameter repeated as SDKs send a list whatever the document says, are
    /// read as one comma-separated list. `accepted` is called only when there is a query:
    /// most requests have none, and listing a route's parameters builds their whole
    /// OpenAPI description.
    pub fn new(query: Option<&str>, accepted: impl FnOnce() -> Vec<Parameter>) -> Self {
        let query = query.unwrap_or_default();
        let accepted = if query.is_empty() {
            Vec::new()
        } else {
            accepted()
        };
        let mut values: Vec<(String, String)> = Vec::new();
        let mut unknown: Vec<String> = Vec::new();
        let mut malformed = Vec::new();
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            let Some(param) = accepted.iter().find(|a| a.name == name) else {
                if !unknown.iter().any(|u| *u == name) {
                    unknown.push(name.into_owned());
                }
                continue;
            };
            match values.iter_mut().find(|(seen, _)| *seen == name) {
                None => values.push((name.into_owned(), value.into_owned())),
                Some((_, list)) if is_list(param) => {
                    list.push(',');
                    list.push_str(&value);
                }
                Some(_) if !malformed.iter().any(|c: &Cause| c.field == name) => {
                    malformed.push(Cause::new(name, "is given more than once"));
                }
                Some(_) => {}
            }
        }
        let mut first_values = url::form_urlencoded::Serializer::new(String::new());
        first_values.extend_pairs(values);
        QueryProblems {
            accepted,
            first_values: first_values.finish(),
            unknown,
            malformed,
        }
    }

    /// The query's accepted parameters read into `T`; or `None`, noting a value that does
    /// not fit its field (`consistent=yes`) as a problem of that parameter, for
    /// [`Self::finish`] to refuse. The cause says what the parameter takes as its published
    /// schema says it ([`takes`]), and the value as sent.
    pub fn read<T: DeserializeOwned>(&mut self) -> Option<T> {
        let pairs = url::form_urlencoded::parse(self.first_values.as_bytes());
        match serde_path_to_error::deserialize(serde_urlencoded::Deserializer::new(pairs)) {
            Ok(value) => Some(value),
            Err(e) => {
                // Every field of a query is a parameter: the path is its name, or `.` for
                // the query as a whole, which only serde's words describe.
                let path = e.path().to_string();
                let sent = url::form_urlencoded::parse(self.first_values.as_bytes())
                    .find(|(name, _)| *name == path);
                let declared = self.accepted.iter().find(|p| p.name == path);
                match (declared, sent) {
                    (Some(param), Some((_, value))) => {
                        let cause = not_of_kind(takes(param.schema.as_ref()), &value);
                        self.malformed(&path, cause);
                    }
                    _ => {
                        let field = if path == "." { "query" } else { &path };
                        self.malformed(field, e.into_inner().to_string());
                    }
                }
                None
            }
        }
    }

    /// Records that the value of `param` is not of its kind.
    pub fn malformed(&mut self, param: &str, message: impl Into<String>) {
        self.malformed.push(Cause::new(param, message));
    }

    /// `Ok` when nothing was found, otherwise one 400 naming every problem; for an unknown
    /// parameter it lists the parameters the route takes.
    pub fn finish(self) -> Result<(), ApiError> {
        let mut parts = Vec::new();
        if !self.unknown.is_empty() {
            let names = self
                .unknown
                .iter()
                .map(|name| format!("`{name}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let plural = if self.unknown.len() > 1 { "s" } else { "" };
            parts.push(format!("unknown query parameter{plural} {names}"));
            parts.push(if self.accepted.is_empty() {
                "this route takes none".to_owned()
            } else {
                let names: Vec<&str> = self.accepted.iter().map(|p| p.name.as_str()).collect();
                format!("accepted: {}", names.join(", "))
            });
        }
        parts.extend(
            self.malformed
                .iter()
                .map(|cause| format!("{}: {}", cause.field, cause.message)),
        );
        if parts.is_empty() {
            return Ok(());
        }
        let causes = self
            .unknown
            .into_iter()
            .map(|name| Cause::new(name, "unknown query parameter"))
            .chain(self.malformed)
            .collect();
        Err(ApiError::bad_request(parts.join("; ")).with_causes(causes))
    }
}

/// Whether `param` is published as a list (an array), whose values may be given repeated.
fn is_list(param: &Parameter) -> bool {
    use utoipa::openapi::schema::Schema;
    use utoipa::openapi::RefOr;
    matches!(param.schema, Some(RefOr::T(Schema::Array(_))))
}

/// Path parameters deserialized into `T`: 422 naming the parameter when its type's own rule
/// refuses it (an id type from `crate::model::ids`), 400 when the path does not fit `T`
/// otherwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(PathRejection::FailedToDeserializePathParams(failed)) => match failed.kind() {
                ErrorKind::DeserializeError { key, message, .. } => {
                    Err(ApiError::invalid([Cause::new(key, message)]))
                }
                _ => Err(PathRejection::FailedToDeserializePathParams(failed).into()),
            },
            Err(rejection) => Err(rejection.into()),
        }
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
        let content_type = media_type(req.headers());
        if content_type != "application/merge-patch+json" && content_type != "application/json" {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "a patch must be sent as application/merge-patch+json or application/json; got {}",
                    described(&content_type)
                ),
            ));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::new(e.status(), e.body_text()))?;
        refuse_duplicate_keys(&bytes)?;
        match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Ok(serde_json::Value::Object(map)) => Ok(MergePatch(map)),
            Ok(_) => Err(ApiError::bad_request("a merge patch must be a JSON object")),
            Err(e) => Err(malformed_json(e)),
        }
    }
}
