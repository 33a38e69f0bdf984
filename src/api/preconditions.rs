//! Optimistic concurrency over HTTP: a single resource's `ETag` is its modify index, and
//! `If-Match` makes a write conditional on it (412 when stale).

use std::collections::BTreeSet;

use axum::extract::FromRequestParts;
use axum::http::header::{ETAG, IF_MATCH};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue};

use crate::error::ApiError;
use crate::kv::{KvStore, StoreError};
use crate::store::update::{Expected, UpdateError};

/// A write's `If-Match`: a list names the versions any of which the write may find; `*`,
/// any version at all. A tag is taken for the version it names, weak (`W/"42"`) or not:
/// RFC 9110 §13.1.1 would have a weak tag never match, but a compressing proxy passes this
/// server's ETags on weakened, and a client sending back what it was given would then never
/// write. A bare `42` is taken as `"42"`, as clients built before the header was checked
/// send it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum IfMatch {
    /// No header: the write applies to whatever version is stored.
    #[default]
    Absent,
    /// `*`: any version, but there must be one.
    Any,
    /// The versions the strong tags name: at least one.
    Versions(BTreeSet<u64>),
}

/// The `If-Match` values [`IfMatch`] is read from, as the document gives them: `*`, or a
/// comma-separated list of one or more ETags this server issues (`"42"`, weak `W/"42"`, or
/// bare `42`), empty elements allowed. A value of 20 digits, past any index issued, is left
/// out so that every value matching names a `u64`.
pub const IF_MATCH_PATTERN: &str = r#"^[ \t]*\*[ \t]*$|^[ \t,]*(W/)?("(0|[1-9][0-9]{0,18})"|0|[1-9][0-9]{0,18})([ \t]*,[ \t,]*(W/)?("(0|[1-9][0-9]{0,18})"|0|[1-9][0-9]{0,18}))*[ \t,]*$"#;

impl IfMatch {
    /// What the write must find, for its check-and-set (`None`: anything). A single version
    /// needs no read. For `*` or several, `key`'s version is read: `*` needs there to be one
    /// (412 otherwise, naming `what` as what must exist), and then holds for as long as
    /// there is one, whatever writes land meanwhile; a list holds for the version stored if
    /// it names it (otherwise the write answers as for the list's first version, stale).
    pub async fn expected(
        &self,
        store: &dyn KvStore,
        key: &str,
        what: &str,
    ) -> Result<Option<Expected>, ApiError> {
        let versions = match self {
            IfMatch::Absent => return Ok(None),
            IfMatch::Versions(versions) if versions.len() == 1 => {
                return Ok(versions.first().copied().map(Expected::Version))
            }
            IfMatch::Any => None,
            IfMatch::Versions(versions) => Some(versions),
        };
        // An object never stored, or deleted, is at version 0 (labels: none).
        let current = store.get(key).await?.map_or(0, |pair| pair.modify_index);
        match versions {
            None if current == 0 => Err(absent(what)),
            None => Ok(Some(Expected::Existing)),
            Some(versions) if versions.contains(&current) => Ok(Some(Expected::Version(current))),
            Some(versions) => Ok(versions.first().copied().map(Expected::Version)),
        }
    }

    fn parse(text: &str) -> Result<Self, ApiError> {
        let malformed = || {
            ApiError::bad_request(format!(
                "If-Match must be `*` or ETags this server issued, like \"42\" or \"42\", \"43\"; \
                 got {text:?}"
            ))
        };
        if text.trim() == "*" {
            return Ok(IfMatch::Any);
        }
        let mut versions = BTreeSet::new();
        // RFC 9110 §5.6.1: a list may hold empty elements, which count for nothing.
        for tag in text.split(',').map(str::trim).filter(|tag| !tag.is_empty()) {
            let tag = tag.strip_prefix("W/").unwrap_or(tag);
            let version = opaque_tag(tag).unwrap_or(tag);
            versions.insert(issued_version(version).ok_or_else(malformed)?);
        }
        if versions.is_empty() {
            return Err(malformed());
        }
        Ok(IfMatch::Versions(versions))
    }
}

/// The version a tag's text names, if it is spelt as [`etag`] spells one: digits only, without
/// leading zeros. Tags compare as text, so `"+5"` or `"05"` never match the ETag `"5"`; read as
/// numbers, they would let a write through.
fn issued_version(text: &str) -> Option<u64> {
    let canonical =
        text.bytes().all(|b| b.is_ascii_digit()) && (text == "0" || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

/// What a quoted entity tag holds between its quotes.
fn opaque_tag(tag: &str) -> Option<&str> {
    tag.strip_prefix('"')?.strip_suffix('"')
}

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut lines = parts.headers.get_all(IF_MATCH).iter().peekable();
        if lines.peek().is_none() {
            return Ok(IfMatch::Absent);
        }
        // A list may come as several header lines (RFC 9110 §5.3).
        let text = lines
            .map(|line| line.to_str())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ApiError::bad_request("If-Match is not valid text"))?
            .join(",");
        IfMatch::parse(&text)
    }
}

/// The `ETag` header for a resource at `index`.
pub fn etag(index: u64) -> (HeaderName, HeaderValue) {
    let value = HeaderValue::from_str(&format!("\"{index}\"")).expect("digits are a valid header");
    (ETAG, value)
}

/// The 412 answered when a conditional write finds the resource changed, or gone from under
/// `If-Match: *`.
pub fn stale(what: &str, expected: Expected) -> ApiError {
    match expected {
        Expected::Version(version) => ApiError::precondition_failed(format!(
            "{what} has changed since version {version}; read it again and retry"
        )),
        Expected::Existing => absent(what),
    }
}

/// The 412 of `If-Match: *` on `what` (a label set, a report, an RC...) while it does not
/// exist: named, since the route's object may exist when the thing written does not (a node
/// with no label set).
fn absent(what: &str) -> ApiError {
    ApiError::precondition_failed(format!(
        "If-Match: * needs {what} to exist, and it does not"
    ))
}

/// What a write made under `expected` (its `If-Match`, if any) answers: its failure as
/// [`write_error`] says, every other outcome as it is.
pub fn unless_stale<T>(
    written: Result<T, StoreError>,
    what: &str,
    expected: Option<Expected>,
) -> Result<T, ApiError> {
    written.map_err(|err| write_error(err, what, expected))
}

/// A write's store error under `expected`: a `Conflict` when it named a version is that
/// version gone, and a `NotFound` under `*` the object gone, each a 412; any other as it is.
pub fn write_error(err: StoreError, what: &str, expected: Option<Expected>) -> ApiError {
    match (err, expected) {
        (StoreError::Conflict { .. }, Some(expected @ Expected::Version(_)))
        | (StoreError::NotFound(_), Some(expected @ Expected::Existing)) => stale(what, expected),
        (err, _) => err.into(),
    }
}

/// A read-modify-write whose `If-Match` no longer holds answers 412.
impl UpdateError for ApiError {
    fn stale(what: &str, expected: Expected) -> Self {
        stale(what, expected)
    }
}
