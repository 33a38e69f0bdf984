//! Blocking queries on list endpoints: `?index=N&wait=D` holds the request until what it
//! lists changes past index N or D passes, as Consul's and Nomad's blocking queries do.
//!
//! A handler reads its prefixes, answers with the highest index among them in `X-Index`, and
//! before reading calls [`Blocking::block`] so a client that passes back the last
//! `X-Index` is held until something changes. A prefix the store lists nothing under counts
//! as the mirror counts its tree ([`counted_index`]), not at the index the store lists it
//! at: on Consul that is the whole store's, which every write anywhere moves, so that a
//! read of an empty tree would be woken by each, and its `X-Index` would run ahead of the
//! mirror's answer to the same read.

use std::cmp::Ordering;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures::future::select_all;

use crate::app::App;
use crate::error::ApiError;
use crate::kv::{KvStore, StoreResult, WatchTarget};
use crate::state::Mirror;

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
        self.block_within(app, prefixes, &[]).await
    }

    /// [`Blocking::block`] for a read of part of its trees: held until what `prefixes`
    /// (that part) holds changes past the client's index, which may be the index of the
    /// whole trees (`beside`, the trees' prefixes), as an answer from the mirror or
    /// [`combined_index`] of both claims. The trees' index only tells a client's index
    /// this store never reached (it went backwards, or the index is another's), which is
    /// answered at once.
    pub async fn block_within(
        &self,
        app: &App,
        prefixes: &[String],
        beside: &[String],
    ) -> Result<(), ApiError> {
        if let Some((index, wait)) = self.until {
            let store = app.store_reads.as_ref();
            let waited = wait_for_change(store, &app.mirror, prefixes, beside, index, wait);
            tokio::select! {
                result = waited => result?,
                () = app.shutdown.cancelled() => {}
            }
        }
        Ok(())
    }
}

/// The index a listing over several prefixes answers with: the highest of theirs, as
/// [`PrefixIndex::counted`] counts each.
pub async fn combined_index(
    store: &dyn KvStore,
    mirror: &Mirror,
    prefixes: &[String],
) -> StoreResult<u64> {
    Ok(combined(&prefix_indexes(store, mirror, prefixes).await?))
}

/// A prefix's index as the store listed it, and as an answer counts it.
#[derive(Debug, Clone, Copy)]
struct PrefixIndex {
    /// What a watch of the prefix waits past.
    listed: u64,
    /// What the answer's `X-Index` counts, and a blocked read waits to move: the listed
    /// index, but as the mirror counts the prefix's tree when the store lists nothing under
    /// it ([`Mirror::empty_listing_index`]), as the mirror's own answers count it.
    counted: u64,
}

/// Each prefix's index, read cheaply (its keys cut at the first `/`).
async fn prefix_indexes(
    store: &dyn KvStore,
    mirror: &Mirror,
    prefixes: &[String],
) -> StoreResult<Vec<PrefixIndex>> {
    let mut indexes = Vec::with_capacity(prefixes.len());
    for prefix in prefixes {
        let (listed, keys) = store.keys(prefix, Some('/')).await?;
        let counted = counted_index(mirror, prefix, listed, keys.is_empty());
        indexes.push(PrefixIndex { listed, counted });
    }
    Ok(indexes)
}

/// The index an answer read from the store counts for its listing of `prefix` at `listed`,
/// which found nothing when `empty` ([`PrefixIndex::counted`]).
pub fn counted_index(mirror: &Mirror, prefix: &str, listed: u64, empty: bool) -> u64 {
    match empty {
        true => mirror.empty_listing_index(prefix, listed),
        false => listed,
    }
}

fn combined(indexes: &[PrefixIndex]) -> u64 {
    let counted = indexes.iter().map(|index| index.counted);
    counted.max().unwrap_or(1).max(1)
}

/// Returns once the combined index of `prefixes` is past `index`, or that of `prefixes` and
/// `beside` together is below it (the store went backwards, or the index is not its own),
/// or after `wait`. Without `beside`, once the index of `prefixes` is not `index`.
async fn wait_for_change(
    store: &dyn KvStore,
    mirror: &Mirror,
    prefixes: &[String],
    beside: &[String],
    index: u64,
    wait: Duration,
) -> StoreResult<()> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let indexes = prefix_indexes(store, mirror, prefixes).await?;
        let current = combined(&indexes);
        let reached = match current.cmp(&index) {
            Ordering::Less => current.max(combined_index(store, mirror, beside).await?),
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
        let watches = prefixes.iter().zip(&indexes).map(|(prefix, at)| {
            Box::pin(async move {
                store
                    .watch(&WatchTarget::Prefix(prefix.clone()), at.listed, remaining)
                    .await
            })
        });
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
/// queries do, rather than leave it asking again at its old index, answered at once.
pub fn error_at(error: ApiError, index: u64) -> Response {
    ([index_header(index)], error).into_response()
}
