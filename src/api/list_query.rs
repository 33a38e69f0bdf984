//! The query of every list route: `limit`, `continue`, `selector`, `index` and `wait`, plus
//! the route's own filters, read and checked here, before the handler runs. A bad parameter
//! therefore never reaches the store nor holds a blocking request, and one answer names every
//! problem: 400 for a parameter the route does not take or a value not of its kind
//! (`limit=many`), otherwise 422 for a value out of bounds, a bad selector, token or wait.

use std::time::Duration;

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use axum::http::Uri;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::IntoParams;

use crate::api::blocking::{Blocking, DEFAULT_WAIT};
use crate::api::extract::{declared_params, QueryProblems};
use crate::api::paging::{decode_token, Paging, MAX_LIMIT};
use crate::api::query_values::{duration, not_of_kind, whole_number};
use crate::error::{ApiError, Violations};
use crate::kv::MAX_WATCH_WAIT;
use crate::labels::Selector;
use crate::model::duration::parse_duration;

/// The highest `index` accepted: the stores' indexes are signed 64-bit integers (SQLite's
/// rowids and P2's Go code), so no listing can answer one above it.
pub const MAX_INDEX: u64 = i64::MAX as u64;

/// The parameters every listing takes, as sent; [`ListQuery`] checks them.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// At most this many items (1 to 1000); all of them when absent.
    #[param(value_type = Option<u64>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
    /// The `continue` token of the previous page.
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    /// Only items whose labels match this Kubernetes label selector (`=`, `==`, `!=`, `in`,
    /// `notin`, `key`, `!key`), e.g. `pod_id=hello,availability_zone in (a,b)`; absent or
    /// empty selects every item. The operation says which labels it matches.
    // Not taken by a listing of items that have no labels (`UnlabelledListParams`).
    selector: Option<String>,
    /// Hold the request, for at most `wait`, while nothing the listing is read from has
    /// changed since this index (the `X-Index` of a previous answer): a listing of part of
    /// its trees (one node's pods, one pod's health, one object's events) is held even at an
    /// index older than its current `X-Index`, while that part has not changed since.
    // The maximum is `MAX_INDEX`, which the attribute takes only as a literal.
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9223372036854775807_u64)]
    index: Option<String>,
    /// How long to hold it at most, e.g. `30s` or `5m`; at most `10m`, default `5m`. Only
    /// with `index`.
    wait: Option<String>,
}

/// [`ListParams`] but `selector`: what a listing of items that have no labels takes (its
/// filter's [`ListFilter::SELECTS`] is false), declared so in its document. A selector
/// there could only ever select everything, so it is not offered at all.
pub struct UnlabelledListParams;

impl IntoParams for UnlabelledListParams {
    fn into_params(parameter_in: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let mut params = ListParams::into_params(parameter_in);
        params.retain(|param| param.name != "selector");
        params
    }
}

/// A listing's own parameters beside [`ListParams`], such as the pods' `node`: declared
/// (for the document and the check of unknown parameters) and checked with the common ones.
pub trait ListFilter: DeserializeOwned + IntoParams + Default {
    /// Whether the listed items have labels for a `selector` to match. A listing of items
    /// that have none takes [`UnlabelledListParams`], and declares them in its document.
    const SELECTS: bool = true;

    /// Adds each problem of the filter's values to `violations`.
    fn check(&self, _violations: &mut Violations) {}
}

/// The filter of a listing that has none of its own.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct NoFilter {}

impl ListFilter for NoFilter {}

/// A listing's query, read and checked: the extractor of every list route.
#[derive(Debug)]
pub struct ListQuery<F = NoFilter> {
    /// The listing's own parameters, checked by [`ListFilter::check`].
    pub filter: F,
    /// Only items whose labels match; everything when `selector` is absent, as it always
    /// is for a listing that takes none.
    pub selector: Selector,
    /// Which page to answer.
    pub paging: Paging,
    /// Whether and how long to hold the request.
    pub blocking: Blocking,
}

impl<F: ListFilter, S: Send + Sync> FromRequestParts<S> for ListQuery<F> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        ListQuery::from_uri(&parts.uri)
    }
}

impl<F: ListFilter> ListQuery<F> {
    fn from_uri(uri: &Uri) -> Result<Self, ApiError> {
        let mut problems = QueryProblems::new(uri.query(), || {
            let mut accepted = if F::SELECTS {
                declared_params::<ListParams>()
            } else {
                declared_params::<UnlabelledListParams>()
            };
            accepted.extend(declared_params::<F>());
            accepted
        });
        // A value that does not fit is a problem, refused below.
        let params: ListParams = problems.read().unwrap_or_default();
        let filter: F = problems.read().unwrap_or_default();
        let limit = params
            .limit
            .as_deref()
            .map(|text| (text, parse_count(text)));
        if let Some((text, Count::Malformed)) = limit {
            problems.malformed("limit", not_of_kind(limit_takes(), text));
        }
        let blocking = BlockingText::read(
            params.index.as_deref(),
            params.wait.as_deref(),
            &mut problems,
        );
        problems.finish()?;

        let mut violations = Violations::new();
        let limit = match limit {
            Some((_, Count::Fits(n))) if (1..=MAX_LIMIT as u64).contains(&n) => Some(n as usize),
            None | Some((_, Count::Malformed)) => None,
            Some((text, Count::OutOfRange | Count::Fits(_))) => {
                violations.add("limit", not_of_kind(limit_takes(), text));
                None
            }
        };
        let blocking = blocking.check_index(&mut violations);
        let after = params.continue_token.as_deref().and_then(|token| {
            let after = decode_token(token);
            if after.is_none() {
                violations.add(
                    "continue",
                    "is not a page token: send back a page's `continue` unchanged",
                );
            }
            after
        });
        let selector = match params.selector.as_deref().map(str::parse::<Selector>) {
            None => Selector::everything(),
            Some(Ok(selector)) => selector,
            Some(Err(e)) => {
                violations.add("selector", e.to_string());
                Selector::everything()
            }
        };
        let blocking = blocking.check_wait(&mut violations);
        filter.check(&mut violations);
        violations.finish()?;
        Ok(ListQuery {
            filter,
            selector,
            paging: Paging { limit, after },
            blocking,
        })
    }
}

/// `index` and `wait` as sent, shared by listings and single-object reads: a malformed
/// index is a 400 problem, values out of bounds are 422 violations, the index's named
/// before the wait's.
pub(crate) struct BlockingText<'a> {
    /// The index as sent, and read.
    index: Option<(&'a str, Count)>,
    wait: Option<&'a str>,
}

/// [`BlockingText`] with its index checked.
pub(crate) struct CheckedIndex<'a> {
    index: Option<u64>,
    wait: Option<&'a str>,
}

impl<'a> BlockingText<'a> {
    /// Reads both, noting a malformed index in `problems`.
    pub(crate) fn read(
        index: Option<&'a str>,
        wait: Option<&'a str>,
        problems: &mut QueryProblems,
    ) -> Self {
        let index = index.map(|text| (text, parse_count(text)));
        if let Some((text, Count::Malformed)) = index {
            problems.malformed("index", not_of_kind(index_takes(), text));
        }
        BlockingText { index, wait }
    }

    /// Adds an index out of bounds to `violations`.
    pub(crate) fn check_index(self, violations: &mut Violations) -> CheckedIndex<'a> {
        let index = match self.index {
            Some((_, Count::Fits(n))) if n <= MAX_INDEX => Some(n),
            None | Some((_, Count::Malformed)) => None,
            Some((text, Count::OutOfRange | Count::Fits(_))) => {
                violations.add("index", not_of_kind(index_takes(), text));
                None
            }
        };
        CheckedIndex {
            index,
            wait: self.wait,
        }
    }
}

impl CheckedIndex<'_> {
    /// The blocking asked for, adding a wait out of bounds to `violations`.
    pub(crate) fn check_wait(self, violations: &mut Violations) -> Blocking {
        let wait = match self.wait.map(check_wait) {
            None => DEFAULT_WAIT,
            Some(Ok(wait)) => wait,
            Some(Err(problem)) => {
                violations.add("wait", problem);
                DEFAULT_WAIT
            }
        };
        Blocking {
            until: self.index.map(|index| (index, wait)),
        }
    }
}

/// How long a request to `uri` asks to be held, if it is a valid blocking list request; for
/// the request deadline, which must outlast the wait. Parameters other than `index` and
/// `wait` are left to the route, which refuses bad ones at once.
pub fn requested_wait(uri: &Uri) -> Option<Duration> {
    uri.query()?;
    let Query(params) = Query::<ListParams>::try_from_uri(uri).ok()?;
    match parse_count(params.index.as_deref()?) {
        Count::Fits(index) if index <= MAX_INDEX => {}
        _ => return None,
    }
    match params.wait.as_deref().map(check_wait) {
        None => Some(DEFAULT_WAIT),
        Some(wait) => wait.ok(),
    }
}

/// A count parameter (`limit`, `index`) read from its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    Fits(u64),
    /// A whole number, but negative or too large for any count.
    OutOfRange,
    /// Not a whole number at all.
    Malformed,
}

/// What `limit` takes; the same words for a value that is no number and one out of bounds.
fn limit_takes() -> String {
    whole_number(1, MAX_LIMIT)
}

/// What `index` takes.
fn index_takes() -> String {
    whole_number(0, MAX_INDEX)
}

fn parse_count(text: &str) -> Count {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Count::Malformed;
    }
    match text.parse::<u64>() {
        Ok(n) => Count::Fits(n),
        Err(_) => Count::OutOfRange,
    }
}

/// The wait `text` asks for; or what `wait` takes, when it is no duration or too long.
fn check_wait(text: &str) -> Result<Duration, String> {
    parse_duration(text)
        .ok()
        .filter(|wait| *wait <= MAX_WATCH_WAIT)
        .ok_or_else(|| not_of_kind(duration("10m"), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(text: &str) -> Result<ListQuery, ApiError> {
        ListQuery::<NoFilter>::from_uri(&format!("/x?{text}").parse().unwrap())
    }

    fn causes(text: &str) -> (u16, Vec<String>) {
        let body = query(text).unwrap_err().body();
        (
            body.code,
            body.causes.into_iter().map(|c| c.field).collect(),
        )
    }

    #[test]
    fn reads_every_parameter() {
        let token = Paging {
            limit: Some(1),
            after: None,
        }
        .page(vec!["a".to_owned(), "b".to_owned()], String::as_str)
        .continue_token
        .unwrap();
        let q = query(&format!(
            "limit=1000&continue={token}&selector=a%3Db&index={MAX_INDEX}&wait=10m"
        ))
        .unwrap();
        assert_eq!(
            q.paging,
            Paging {
                limit: Some(1000),
                after: Some("a".into())
            }
        );
        assert_eq!(q.selector.to_string(), "a=b");
        assert_eq!(
            q.blocking.until,
            Some((MAX_INDEX, Duration::from_secs(600)))
        );
        let q = query("index=0").unwrap();
        assert_eq!(q.blocking.until, Some((0, DEFAULT_WAIT)));
        let q = query("").unwrap();
        assert_eq!(
            (q.paging, q.blocking),
            (Paging::default(), Blocking::default())
        );
        assert!(q.selector.is_everything());
    }

    #[test]
    fn out_of_bounds_values_are_422_all_at_once() {
        assert_eq!(
            causes("limit=0&index=9223372036854775808&wait=11m&continue=%25&selector=a%20in%20("),
            (
                422,
                ["limit", "index", "continue", "selector", "wait"]
                    .map(String::from)
                    .to_vec()
            )
        );
        assert_eq!(causes("limit=1001"), (422, vec!["limit".to_owned()]));
        assert_eq!(causes("limit=-1"), (422, vec!["limit".to_owned()]));
        assert_eq!(
            causes("index=99999999999999999999999"),
            (422, vec!["index".to_owned()])
        );
        assert_eq!(causes("wait=forever"), (422, vec!["wait".to_owned()]));
    }

    #[test]
    fn unknown_parameters_and_malformed_values_are_400_all_at_once() {
        let body = query("limitt=5&limit=many&index=soon&zz=1&limit=2")
            .unwrap_err()
            .body();
        assert_eq!(body.code, 400);
        assert!(
            body.message.starts_with(
                "unknown query parameters `limitt`, `zz`; accepted: limit, continue, \
                 selector, index, wait"
            ),
            "{}",
            body.message
        );
        let body = query("limitt=5").unwrap_err().body();
        assert_eq!(
            body.message,
            "unknown query parameter `limitt`; accepted: limit, continue, selector, index, wait"
        );
        assert_eq!(
            causes("limitt=5&limit=many&index=soon"),
            (400, ["limitt", "limit", "index"].map(String::from).to_vec())
        );
    }

    #[test]
    fn the_deadline_sees_only_valid_blocking_requests() {
        let wait = |q: &str| requested_wait(&format!("/x?{q}").parse().unwrap());
        assert_eq!(wait("index=3&wait=2s"), Some(Duration::from_secs(2)));
        assert_eq!(wait("index=3&node=a"), Some(DEFAULT_WAIT));
        assert_eq!(wait("wait=2s"), None);
        assert_eq!(wait("index=3&wait=11m"), None);
        assert_eq!(wait("index=9223372036854775808&wait=2s"), None);
    }
}
