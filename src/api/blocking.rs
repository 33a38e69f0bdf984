//! Blocking queries on list endpoints: `?index=N&wait=D` holds the request until what it
//! lists changes past index N or D passes, as Consul's and Nomad's blocking queries do.
//!
//! A handler reads its prefixes, answers with the highest index among them in `X-Index`, and
//! before reading from the store holds the request ([`crate::api::reads::block_on_store`],
//! the one home of that hold, through [`Blocking::block`]) so a client that passes back the
//! last `X-Index` is held until something changes.

use std::cmp::Ordering;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures::future::select_all;

use crate::app::App;
use crate::error::ApiError;
use crate::kv::{KvStore, StoreResult, WatchTarget};

/// The header carrying a listing's index.
pub const INDEX_HEADER: HeaderName = HeaderName::from_static("x-index");

/// How long a blocking query waits when `wait` is not given, as in Consul.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);

/// A checked `?index=&wait=`; [`crate::api::list_query`] reads and checks the parameters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Blocking {
    /// The index to wait past (the `X-Index` of a previous answer) and how long to wait at
    /// most; `None` when the request does not block.
    pub until: Option<(u64, Duration)>,
}

impl Blocking {
    /// Waits, if the request asked to, until the combined index of `prefixes` differs from
    /// the client's, the wait passes, or the server starts shutting down; read through
    /// [`App::store_reads`], as every read that goes through to the store.
    pub async fn block(&self, app: &App, prefixes: &[String]) -> Result<(), ApiError> {
        let targets: Vec<WatchTarget> = prefixes.iter().cloned().map(WatchTarget::Prefix).collect();
        self.block_within(app, &targets, &[]).await
    }

    /// [`Blocking::block`] for a read of part of its trees: held until what `targets`
    /// (that part: prefixes, or single keys) holds changes past the client's index, which
    /// may be the index of the whole trees (`beside`, the trees' prefixes), as an answer
    /// from the mirror or [`combined_index`] of both claims. The trees' index only tells a client's index
    /// this store never reached (it went backwards, or the index is another's), which is
    /// answered at once.
    pub async fn block_within(
        &self,
        app: &App,
        targets: &[WatchTarget],
        beside: &[String],
    ) -> Result<(), ApiError> {
        if let Some((index, wait)) = self.until {
            let store = app.store_reads.as_ref();
            tokio::select! {
                result = wait_for_change(store, targets, beside, index, wait) => result?,
                () = app.shutdown.cancelled() => {}
            }
        }
        Ok(())
    }
}

/// The index a listing over several prefixes answers with: the highest of theirs.
pub async fn combined_index(store: &dyn KvStore, prefixes: &[String]) -> StoreResult<u64> {
    Ok(combined(&prefix_indexes(store, prefixes).await?))
}

/// Each prefix's index, read cheaply (its keys cut at the first `/`).
async fn prefix_indexes(store: &dyn KvStore, prefixes: &[String]) -> StoreResult<Vec<u64>> {
    let mut indexes = Vec::with_capacity(prefixes.len());
    for prefix in prefixes {
        indexes.push(store.keys(prefix, Some('/')).await?.0);
    }
    Ok(indexes)
}

fn combined(indexes: &[u64]) -> u64 {
    indexes.iter().copied().max().unwrap_or(1).max(1)
}

/// Each target's index: a prefix's as [`prefix_indexes`] reads it, a key's its own (its
/// modify index, or where it is missing what the store answers a read of it at).
async fn target_indexes(store: &dyn KvStore, targets: &[WatchTarget]) -> StoreResult<Vec<u64>> {
    let mut indexes = Vec::with_capacity(targets.len());
    for target in targets {
        indexes.push(match target {
            WatchTarget::Prefix(prefix) => store.keys(prefix, Some('/')).await?.0,
            // Index 0 asks for the current state, without blocking.
            WatchTarget::Key(_) => store.watch(target, 0, Duration::ZERO).await?.index,
        });
    }
    Ok(indexes)
}

/// Returns once the combined index of `targets` is past `index`, or that of `targets` and
/// `beside` together is below it (the store went backwards, or the index is not its own),
/// or after `wait`. Without `beside`, once the index of `targets` is not `index`.
async fn wait_for_change(
    store: &dyn KvStore,
    targets: &[WatchTarget],
    beside: &[String],
    index: u64,
    wait: Duration,
) -> StoreResult<()> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let indexes = target_indexes(store, targets).await?;
        let current = combined(&indexes);
        let reached = match current.cmp(&index) {
            Ordering::Less => current.max(combined_index(store, beside).await?),
            _ => current,
        };
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if current > index || reached < index || remaining.is_zero() {
            return Ok(());
        }
        // Too short for a blocking query (Consul would answer at once, over and over).
        if remaining < Duration::from_millis(100) {
            tokio::time::sleep(remaining).await;
            return Ok(());
        }
        let watches = (targets.iter().zip(&indexes))
            .map(|(target, &at)| Box::pin(async move { store.watch(target, at, remaining).await }));
        let (result, _, _) = select_all(watches).await;
        result?;
    }
}

/// The `X-Index` header for a listing.
pub fn index_header(index: u64) -> (HeaderName, HeaderValue) {
    (INDEX_HEADER, HeaderValue::from(index.max(1)))
}

/// An error answer with the `X-Index` of the read that found it: the 404 of an object gone
/// tells a blocking client the index to wait at for it to come back, as Consul's blocking
/// queries do, rather than leave it asking again at its old index, answered at once; the
/// 500 of one stored unreadable, the index to wait at for it to be mended.
pub fn error_at(error: ApiError, index: u64) -> Response {
    ([index_header(index)], error).into_response()
}
