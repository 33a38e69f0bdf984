//! Answers built from the mirror, kept and served again until one of the trees they were
//! read from changes.
//!
//! A read served from the mirror is a function of its request and of the trees it reads: a
//! tree's generation moves on every change of its entries (the server's own writes and
//! deletes included), and its listed and complete indexes, which decide the answer's
//! `X-Index`, when a listing confirms own writes and as the tree is found to hold every
//! change up to a newer index; none of them goes back until the tree is read whole again,
//! which counts as a version of its own. So an answer kept with the versions it was built
//! at is exactly what building it again would give, for as long as they hold: a hot read
//! costs a lookup instead of decoding, counting and serializing. Versions are read before
//! the answer is built, so a change made meanwhile only makes the next request build it
//! again.
//!
//! A blocking read (`?index=`) is neither kept nor looked up: its target names the index it
//! waited at, new at each call of a client long-polling, so its answers would fill the bound
//! with targets never asked for again and drop the hot answers with them. Once held, its
//! answer is the one of the same read without `index` and `wait`, but finding that one kept
//! would take reading the query again here, for a read that is mostly answered past the
//! versions any answer was kept at (it was held until one of them moved): it is built.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, PoisonError};

use axum::body::{to_bytes, Body, Bytes};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use crate::api::blocking::Blocking;
use crate::error::ApiError;
use crate::state::{Mirror, Tree, TreeVersion};

/// The most bytes of answers kept; past it every kept answer is dropped at once, which
/// bounds memory without bookkeeping per answer (the hot ones come back at the next read).
const MAX_BYTES: usize = 32 << 20;

/// What one kept answer costs beyond its target, headers and body: its entry in the map, its
/// header map's own tables and its trees' versions, roughly.
const ENTRY_BYTES: usize = 512;

/// Kept answers, by request target (path and query, its parameters ordered: `kept_key`).
#[derive(Default)]
pub struct Answers {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    by_target: HashMap<String, Kept200>,
    bytes: usize,
}

/// A `200 OK` answer and the versions of the trees it was built from.
struct Kept200 {
    versions: Vec<TreeVersion>,
    headers: HeaderMap,
    body: Bytes,
}

impl Answers {
    /// The answer to `target`, which reads `trees` of `mirror`: the kept one while those
    /// trees' versions are unchanged, else the one `build` makes (kept when it is a `200 OK`
    /// no larger than `MAX_BYTES`). Kept by path and query (`kept_key`): the answer does
    /// not depend on the host a client names in an absolute-form target. A `blocking` read
    /// is always built, and never kept (see the module documentation).
    pub async fn get_or_build<F>(
        &self,
        mirror: &Mirror,
        trees: &[Tree],
        target: &Uri,
        blocking: Blocking,
        build: impl FnOnce() -> F,
    ) -> Result<Response, ApiError>
    where
        F: Future<Output = Result<Response, ApiError>>,
    {
        if blocking.until.is_some() {
            return build().await;
        }
        let target = kept_key(target);
        let target = target.as_ref();
        let versions = mirror.versions(trees);
        if let Some(answer) = self.lookup(target, &versions) {
            return Ok(answer);
        }
        let response = build().await?;
        if response.status() != StatusCode::OK {
            return Ok(response);
        }
        let (parts, body) = response.into_parts();
        // Built in memory already: read whole, however large, and kept only if it fits.
        let built = to_bytes(body, usize::MAX)
            .await
            .map_err(|e| ApiError::internal(format!("reading an answer to keep it: {e}")))?;
        let body = self.keep(target, versions, parts.headers.clone(), built);
        Ok((parts, Body::from(body)).into_response())
    }

    fn lookup(&self, target: &str, versions: &[TreeVersion]) -> Option<Response> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let answer = kept
            .by_target
            .get(target)
            .filter(|answer| answer.versions == versions)?;
        // The headers are set as kept, not inserted one by one into a response's own.
        let mut response = Response::new(Body::from(answer.body.clone()));
        *response.headers_mut() = answer.headers.clone();
        Some(response)
    }

    /// Keeps the answer `body` built for `target` if it fits; the body to serve.
    fn keep(
        &self,
        target: &str,
        versions: Vec<TreeVersion>,
        headers: HeaderMap,
        body: Bytes,
    ) -> Bytes {
        let mut answer = Kept200 {
            versions,
            headers,
            body,
        };
        let size = answer.size(target);
        // Larger than every kept answer may be together: served as built, never kept.
        if size > MAX_BYTES {
            return answer.body;
        }
        // A JSON answer is serialized into a buffer grown by doubling, which the bound does
        // not see: up to twice its length. Kept (and served) is a copy of its own length.
        answer.body = Bytes::copy_from_slice(&answer.body);
        let served = answer.body.clone();
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        // The answer it replaces goes first, so that only the room this one takes beyond
        // it counts against the bound.
        if let Some(replaced) = kept.by_target.remove(target) {
            kept.bytes -= replaced.size(target);
        }
        if kept.bytes + size > MAX_BYTES {
            kept.by_target.clear();
            kept.bytes = 0;
        }
        kept.bytes += size;
        kept.by_target.insert(target.to_owned(), answer);
        served
    }
}

/// The key an answer to `target` is kept under: its path, and its query's parameters
/// ordered by name, so that the same parameters sent in another order find the answer kept
/// rather than build and keep another copy. A query is read by name
/// ([`crate::api::extract::QueryProblems`]): a parameter's values count in the order they
/// come (a list's are joined in it, a parameter given twice is refused), wherever the other
/// parameters' stand. So the parameters are ordered stably, by name as read (decoded), and
/// each is kept as sent: two queries share a key only when they give each name the same
/// values in the same order, spelled alike, and so read alike. Empty parameters (`&&`),
/// which reading skips, are left out.
fn kept_key(target: &Uri) -> Cow<'_, str> {
    let Some(target) = target.path_and_query() else {
        return Cow::Borrowed("/");
    };
    let Some(query) = target.query() else {
        return Cow::Borrowed(target.as_str());
    };
    let mut params: Vec<(Cow<'_, str>, &str)> = query
        .split('&')
        .filter_map(|param| {
            let (name, _) = url::form_urlencoded::parse(param.as_bytes()).next()?;
            Some((name, param))
        })
        .collect();
    let by_name =
        |(one, _): &(Cow<'_, str>, &str), (other, _): &(Cow<'_, str>, &str)| one.cmp(other);
    // Most queries come ordered already (one parameter, or a client's own order): their
    // key is the target as sent, borrowed.
    let sent_ordered = params.len() == query.split('&').count()
        && params.is_sorted_by(|one, other| by_name(one, other).is_le());
    if sent_ordered {
        return Cow::Borrowed(target.as_str());
    }
    // Stable: the values of one name stay in the order they were sent.
    params.sort_by(by_name);
    let mut key = String::with_capacity(target.as_str().len());
    key.push_str(target.path());
    for (i, (_, param)) in params.iter().enumerate() {
        key.push(if i == 0 { '?' } else { '&' });
        key.push_str(param);
    }
    Cow::Owned(key)
}

impl Kept200 {
    /// The memory it holds, kept under `target`: the target counts as much as the body, since
    /// a client chooses it (a query of up to the longest request target for an empty page).
    fn size(&self, target: &str) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum();
        ENTRY_BYTES + target.len() + headers + self.body.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::api::extract::ApiJson;
    use crate::kv::sqlite::SqliteStore;
    use crate::kv::KvStore;
    use crate::state::MirrorConfig;

    /// A mirror (not started, holding nothing) of a new embedded store in a directory that
    /// lives as long as the first value.
    async fn unstarted_mirror() -> (tempfile::TempDir, Mirror) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db").display().to_string();
        let store: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
        (dir, Mirror::new(store, MirrorConfig::default()))
    }

    /// A kept answer holds no more memory than its size counts: a body serialized into a
    /// growing buffer (as a JSON answer is, each growth doubling it) is not kept in that
    /// buffer, up to twice its length, or the kept answers would hold up to twice the bound.
    #[tokio::test]
    async fn a_kept_answer_holds_no_more_than_its_length() {
        let (_dir, mirror) = unstarted_mirror().await;
        let answers = Answers::default();
        let page: Vec<String> = (0..11_000).map(|i| format!("rc-{i:06}")).collect();
        let build = || std::future::ready(Ok(ApiJson(page).into_response()));
        let target: Uri = "/api/v1/rcs".parse().unwrap();
        let served = answers
            .get_or_build(&mirror, &[Tree::Rcs], &target, Blocking::default(), build)
            .await
            .unwrap();
        drop(served);

        let kept = answers.kept.lock().unwrap().by_target.remove("/api/v1/rcs");
        let body = kept.expect("the answer was not kept").body;
        let length = body.len();
        let held = body
            .try_into_mut()
            .expect("the kept body is shared")
            .capacity();
        assert_eq!(held, length, "a body of {length} bytes holds {held}");
    }

    /// An answer too large to keep is served as it was built: a copy of its own length,
    /// which a kept answer is, would only add that length to the memory it takes while
    /// served, for the largest answers.
    #[tokio::test]
    async fn an_answer_too_large_to_keep_is_served_as_built() {
        let (_dir, mirror) = unstarted_mirror().await;
        let answers = Answers::default();
        let built = Bytes::from(vec![b' '; MAX_BYTES + 1]);
        let build = || std::future::ready(Ok(built.clone().into_response()));
        let target: Uri = "/api/v1/rcs".parse().unwrap();
        let served = answers
            .get_or_build(&mirror, &[Tree::Rcs], &target, Blocking::default(), build)
            .await
            .unwrap();
        let served = to_bytes(served.into_body(), usize::MAX).await.unwrap();
        assert_eq!(served.len(), built.len());
        assert_eq!(served.as_ptr(), built.as_ptr(), "the answer was copied");
    }

    /// The same parameters in another order are the same query, answered by the answer
    /// kept for the first order rather than built and kept again. Before, answers were kept
    /// by the target as sent, and each order built (and held) its own copy.
    #[tokio::test]
    async fn the_same_parameters_in_another_order_find_the_kept_answer() {
        let (_dir, mirror) = unstarted_mirror().await;
        let answers = Answers::default();
        let builds = AtomicUsize::new(0);
        let build = || {
            builds.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(Bytes::from_static(b"[]").into_response()))
        };
        for target in [
            "/api/v1/rcs?selector=a&limit=5",
            "/api/v1/rcs?limit=5&selector=a",
        ] {
            let target: Uri = target.parse().unwrap();
            answers
                .get_or_build(&mirror, &[Tree::Rcs], &target, Blocking::default(), build)
                .await
                .unwrap();
        }
        assert_eq!(
            builds.load(Ordering::SeqCst),
            1,
            "the answer was built again for its parameters in another order"
        );
    }

    /// Queries read apart are kept apart, whatever order their parameters come in: the
    /// values of one name in another order (a list's, joined in the order sent), one name
    /// spelled encoded and plain (read as one name, so its values' order counts), and an
    /// encoded `&` inside a value (one parameter, not two); the same query in other orders,
    /// or with empty parameters, has one key.
    #[test]
    fn queries_read_apart_have_keys_apart() {
        let key = |target: &str| kept_key(&target.parse().unwrap()).into_owned();
        // Each pair, and whether it is one query.
        let pairs = [
            ("/x?a=1&a=2", "/x?a=2&a=1", false),
            ("/x?a=1&b=0&a=2", "/x?a=2&b=0&a=1", false),
            ("/x?a=1&%61=2", "/x?%61=2&a=1", false),
            ("/x?a=x%26b=y", "/x?b=y&a=x", false),
            ("/x?a=1", "/y?a=1", false),
            ("/x?b=0&a=1&a=2", "/x?a=1&a=2&b=0", true),
            ("/x?a=1&b=0&a=2", "/x?a=1&a=2&b=0", true),
            ("/x?&b=0&&a=1", "/x?a=1&b=0", true),
            ("/x?", "/x", true),
        ];
        for (one, other, same) in pairs {
            let (one_key, other_key) = (key(one), key(other));
            assert_eq!(
                one_key == other_key,
                same,
                "{one} and {other}: keys {one_key} and {other_key}"
            );
        }
    }

    /// Clients long-polling a list, each blocking read at the index of the answer before,
    /// leave the hot answer kept: their targets, new at each call, are not kept, so however
    /// many bytes they are answered together they never pass the bound and drop it.
    #[tokio::test]
    async fn blocking_reads_at_new_indexes_leave_the_hot_answer_kept() {
        let (_dir, mirror) = unstarted_mirror().await;
        let answers = Answers::default();
        let builds = AtomicUsize::new(0);
        let built = |body: Bytes| {
            builds.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(body.into_response()))
        };
        let read = |target: &str, blocking: Blocking, body: Bytes| {
            let target: Uri = target.parse().unwrap();
            let answers = &answers;
            let mirror = &mirror;
            let built = &built;
            async move {
                answers
                    .get_or_build(mirror, &[Tree::Rcs], &target, blocking, || built(body))
                    .await
                    .unwrap()
            }
        };
        let hot = "/api/v1/rcs/0b1e0a5e-8d4a-4f4e-9c39-2f7b8f0a2c11";
        read(hot, Blocking::default(), Bytes::from_static(b"{}")).await;

        let page = Bytes::from(vec![b' '; 1 << 20]);
        let polls = 2 * MAX_BYTES / page.len();
        for index in 1..=polls as u64 {
            let until = Some((index, Duration::from_secs(1)));
            let target = format!("/api/v1/rcs?index={index}&wait=1s");
            read(&target, Blocking { until }, page.clone()).await;
        }
        assert_eq!(builds.load(Ordering::SeqCst), 1 + polls);

        read(hot, Blocking::default(), Bytes::from_static(b"{}")).await;
        assert_eq!(
            builds.load(Ordering::SeqCst),
            1 + polls,
            "the hot answer was built again: the blocking reads' answers dropped it"
        );
    }

    /// An answer built again replaces the one kept under its target: only the room it takes
    /// beyond that one counts against the bound, so that, near it, the other kept answers
    /// (built at the same versions, as valid) stay.
    #[test]
    fn an_answer_built_again_near_the_bound_leaves_the_others_kept() {
        let answers = Answers::default();
        let keep = |target: &str, body: &Bytes| {
            answers.keep(target, Vec::new(), HeaderMap::new(), body.clone());
        };
        let list = Bytes::from(vec![b' '; MAX_BYTES * 3 / 4]);
        let one = Bytes::from_static(b"{}");
        keep("/api/v1/rcs", &list);
        keep("/api/v1/rcs/x", &one);
        keep("/api/v1/rcs", &list);
        let kept = answers.kept.lock().unwrap();
        assert!(
            kept.by_target.contains_key("/api/v1/rcs/x"),
            "keeping the list again dropped the other answers"
        );
        let held: usize = (kept.by_target.iter())
            .map(|(target, answer)| answer.size(target))
            .sum();
        assert_eq!(kept.bytes, held);
    }

    /// Answers kept under many long targets (as many queries as a client cares to send, each
    /// of an empty page) hold no more than the bound, targets counted.
    #[test]
    fn kept_answers_hold_at_most_the_bound_whatever_their_targets() {
        let answers = Answers::default();
        let padding = "a".repeat(8 * 1024);
        for i in 0..(2 * MAX_BYTES / padding.len()) {
            let target = format!("/api/v1/rcs?selector=k+in+(v{i},{padding})");
            answers.keep(
                &target,
                Vec::new(),
                HeaderMap::new(),
                Bytes::from_static(b"[]"),
            );
        }
        let kept = answers.kept.lock().unwrap();
        let held: usize = kept
            .by_target
            .iter()
            .map(|(target, answer)| target.len() + answer.body.len())
            .sum();
        assert!(held <= MAX_BYTES, "{held} bytes held");
    }
}
