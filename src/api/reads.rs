//! Where a read is served from: the state mirror, or the store itself.
//!
//! Reads come from the mirror ([`crate::state::Mirror`]) at the index its watches have
//! listed, which `X-Index` states; the server's own writes are in it at once, so a client
//! that wrote through this server reads its write. The index claims an own write only once
//! the tree's watch has listed past it, which a read waits for (bounded; a write's own
//! answer does not, [`current_mirror`]): that listing brings in any other writer's change
//! from before the write, which the index would otherwise claim without the answer holding
//! it. A read goes through to the store instead when the
//! client asks for `?consistent=true`, when the mirror is not healthy as the read comes or
//! once its waits are over (not loaded yet, not
//! read again since the store's index went backwards, or a tree's watch lost for longer than
//! its bound: stale data is never served silently), after a write of unknown outcome until
//! its trees have caught up with the store ([`Mirror::settle`]: the client re-reads before
//! it retries, and must see the write if it landed), and for a blocking read whose `index`
//! is past the mirror's (the client has seen a newer
//! state, e.g. on another server). Blocking reads from the mirror wait on its change
//! signal, so waiting clients cost the store nothing.
//!
//! A read that goes through to the store reads it through [`App::store_reads`]
//! ([`crate::kv::shared_listings`]): such reads list whole trees the store has no index into,
//! and come in crowds when the mirror cannot be trusted, so concurrent listings of a prefix
//! are shared; a read shares only a listing sent after it arrived, so it still sees every
//! write acknowledged before it. The handlers that read the store themselves on that path
//! (`Source::Store`) read through it too; writes, and the views answering them, use
//! [`App::store`].

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::Deserialize;
use tokio::time::Instant;
use utoipa::IntoParams;

use crate::api::blocking::{combined_index, Blocking};
use crate::api::extract::{declared_params, QueryProblems};
use crate::api::list_query::{BlockingText, ListFilter};
use crate::app::App;
use crate::error::{ApiError, Violations};
use crate::kv::{KvStore, WatchTarget};
use crate::state::{Mirror, MirrorReader, Seen, Span, Tree};

/// The query of a single-object read: blocking and consistency.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReadParams {
    /// Hold the request, for at most `wait`, while nothing the answer shows has changed
    /// since this index (the `X-Index` of a previous answer): even at an index older than
    /// the object's current `X-Index`, while the object has not changed since.
    // The maximum is `MAX_INDEX`, which the attribute takes only as a literal.
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9223372036854775807_u64)]
    index: Option<String>,
    /// How long to hold it at most, e.g. `30s` or `5m`; at most `10m`, default `5m`. Only
    /// with `index`.
    wait: Option<String>,
    /// Read through to the store rather than from this server's mirror of it.
    consistent: Option<bool>,
}

/// A single-object read's query, read and checked.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReadQuery {
    pub consistent: bool,
    pub blocking: Blocking,
}

impl<S: Send + Sync> FromRequestParts<S> for ReadQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut problems = QueryProblems::new(parts.uri.query(), declared_params::<ReadParams>);
        // A value that does not fit is a problem, refused below.
        let params: ReadParams = problems.read().unwrap_or_default();
        let blocking = BlockingText::read(
            params.index.as_deref(),
            params.wait.as_deref(),
            &mut problems,
        );
        problems.finish()?;
        let mut violations = Violations::new();
        let blocking = blocking
            .check_index(&mut violations)
            .check_wait(&mut violations);
        violations.finish()?;
        Ok(ReadQuery {
            consistent: params.consistent.unwrap_or(false),
            blocking,
        })
    }
}

/// The filter of a listing that can read through to the store.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ConsistentFilter {
    /// Read through to the store rather than from this server's mirror of it.
    consistent: Option<bool>,
}

impl ListFilter for ConsistentFilter {}

impl ConsistentFilter {
    /// Whether the client asked to read through to the store.
    pub fn consistent(&self) -> bool {
        self.consistent.unwrap_or(false)
    }
}

/// Where a read is served from.
pub enum Source<'a> {
    /// The mirror, having held the read if it asked to block.
    Mirror(&'a Mirror),
    /// The store, with the blocking still to do there.
    Store(Blocking),
}

/// Where to serve a read of `trees` from (see the module documentation); a blocking read
/// served from the mirror is held here, on the mirror.
///
/// `trees` are the trees the answer is made of. Its `X-Index` ([`mirror_index`]) is
/// their listed index, but no higher than every one of them holds every change up to: the
/// trees are watched one by one, so one write to several trees (an intent and its pod
/// labels) can reach them one after the other, and an answer claiming the newer index
/// without the older change would leave a client blocking at that index waiting for a
/// change it has not seen. So a read first waits (bounded) for the watches to confirm the
/// server's own writes to the trees, then for every tree to hold every change up to their
/// listed index ([`Mirror::catch_up`]). A blocking read waits for a change under
/// `spans` (the keys the answer is made of, within `trees`), or of `trees` when there
/// are none: a read of one node's pods is not woken by another node's, even at an index
/// the trees have since moved past while its spans did not change
/// ([`Mirror::changed_past`]).
pub async fn source<'a>(
    app: &'a App,
    trees: &[Tree],
    spans: &[Span],
    consistent: bool,
    blocking: Blocking,
) -> Source<'a> {
    let mirror = &app.mirror;
    if consistent || !mirror.health().is_healthy() {
        return Source::Store(blocking);
    }
    // A write of unknown outcome may have landed unseen: a client re-reading before it
    // retries must see it if it did.
    if !mirror.settle(trees, CATCH_UP).await {
        return Source::Store(blocking);
    }
    let deadline = Instant::now() + CATCH_UP;
    let Some((index, wait)) = blocking.until else {
        mirror.confirm(trees, CATCH_UP).await;
        let left = deadline.saturating_duration_since(Instant::now());
        mirror.catch_up(trees, left).await;
        return trusted(mirror, blocking);
    };
    // Where the read's wait ends, which a read the mirror can no longer answer waits out on
    // the store.
    let ends = Instant::now() + wait;
    // Taken with the index, so that a change landing after is either past `index` or
    // unlike the extents, and never missed; and only once the trees' own writes are
    // confirmed, or a client at the index may not have seen what they are compared with.
    let mut seen = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let confirmed = mirror.confirm(trees, left).await;
        let seen = mirror.seen(trees, spans);
        // Unconfirmed after a confirmation: another own write came in meanwhile.
        if seen.confirmed || !confirmed || Instant::now() >= deadline {
            break seen;
        }
    };
    // An index the watches have listed but the trees do not all hold yet (from a store's
    // answer, or another server's) is caught up with rather than read from the store.
    if index > seen.index() && seen.listed.iter().any(|listed| *listed >= index) {
        mirror.catch_up_to(trees, index, CATCH_UP).await;
        seen = mirror.seen(trees, spans);
    }
    // A change listed since the answer at `index` was built is not one the client has seen,
    // though the answer's index stays there until every tree holds every change up to it:
    // caught up with, the answer claims it and is given at once, rather than the change
    // taken into the baseline of the hold below and missed until another one.
    if index == seen.index().max(1) && mirror.catch_up(trees, CATCH_UP).await {
        seen = mirror.seen(trees, spans);
    }
    let reached = seen.index().max(1);
    if index > reached {
        return Source::Store(blocking);
    }
    // At an index the trees have moved past, a read of spans nothing in which changed
    // since is held too: on a busy fleet its trees' index moves between any two reads.
    let unchanged_since = index < reached
        && seen.confirmed
        && !spans.is_empty()
        && !mirror.changed_past(spans, index);
    if index == reached || unchanged_since {
        // An unconfirmed view (a watch failing, or too slow) is no baseline for the
        // spans' extents, but it is for the trees' listed indexes: the read is held
        // until one of them moves. So is a read whose spans hold a change past `index`
        // already that no answer can claim yet (a tree whose watch lags or fails holds
        // the index down): the extents will not change for it.
        let claim_pending =
            index == reached && !spans.is_empty() && mirror.changed_past(spans, index);
        let spans = if seen.confirmed && !claim_pending {
            spans
        } else {
            &[]
        };
        hold(app, trees, spans, seen, wait).await;
    }
    mirror.catch_up(trees, CATCH_UP).await;
    let left = ends.saturating_duration_since(Instant::now());
    trusted(
        mirror,
        Blocking {
            until: Some((index, left)),
        },
    )
}

/// The mirror to answer from once a read's waits are over, or the store if the mirror can
/// no longer be trusted meanwhile: its watch lost, or the store gone backwards, which ends
/// the waits at once and leaves the trees holding the old store's entries until they are
/// read again. A blocking read is held there for what is left of its wait (`blocking`), as
/// one arriving then would be, rather than answered at once as though something changed
/// (the store answers at once if it went backwards past the client's index).
fn trusted(mirror: &Mirror, blocking: Blocking) -> Source<'_> {
    if !mirror.health().is_healthy() {
        return Source::Store(blocking);
    }
    Source::Mirror(mirror)
}

/// How long a read waits for its trees' watches to confirm the server's own writes, and
/// then for its trees to catch up with one another; past it, the answer is given as the
/// mirror holds it, at the index it has confirmed.
const CATCH_UP: Duration = Duration::from_secs(1);

/// Holds a blocking read of `trees` on the mirror for at most `wait`, until what it reads
/// changes from `before` (the index of a tree's newest change, and the `spans`' extents),
/// or the answer's `X-Index` moves from where it stood as the hold began, or the mirror can
/// no longer be trusted ([`until_untrusted`]), the read then held on the store for the rest
/// of its wait. Any tree's index counts, not only the answer's `X-Index`: a tree whose
/// watch lags holds that index down, and its late delivery of another writer's change may
/// leave it unmoved. A tree that holds nothing counts at the index it came to hold nothing,
/// not at the one its watch lists it at (on Consul the whole store's, moved by every write
/// anywhere): a change delivered late into it makes it hold something, which moves its
/// index, and its listing that lets the answer claim a change the answer held already moves
/// the `X-Index`. A catch-up since `before` that did so brought no change either, and is not
/// answered at once.
async fn hold(app: &App, trees: &[Tree], spans: &[Span], before: Seen, wait: Duration) {
    let mirror = &app.mirror;
    let mut changes = mirror.changes();
    let claimed = mirror.claimable_index(trees);
    let held = async {
        loop {
            changes.borrow_and_update();
            let now = mirror.seen(trees, spans);
            let moved = now.changed != before.changed || now.claimable != claimed;
            if moved && (spans.is_empty() || now.extents != before.extents) {
                return;
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = tokio::time::timeout(wait, held) => {}
        () = until_untrusted(mirror) => {}
        () = app.shutdown.cancelled() => {}
    }
}

/// How often a read held on the mirror looks whether the mirror can still be trusted.
const TRUST_CHECK: Duration = Duration::from_secs(1);

/// Returns once the mirror cannot be trusted ([`crate::state::MirrorHealth::is_healthy`]):
/// a mirror that lost its watch learns nothing more of the store, so a read held on it
/// would not be woken by a change there until its whole wait ran out; it goes to the store
/// instead. Looked at every [`TRUST_CHECK`], as a watch counts lost only once its bound has
/// passed.
async fn until_untrusted(mirror: &Mirror) {
    loop {
        tokio::time::sleep(TRUST_CHECK).await;
        if !mirror.health().is_healthy() {
            return;
        }
    }
}

/// The mirror as it holds things now, the server's own writes in, while it can be trusted:
/// what a write reads to check itself and to build its answer. Neither waits for the
/// watches to confirm the server's own writes, so a write costs the store no read; an
/// answer built from it claims only the index they have listed ([`mirror_index`]).
pub fn current_mirror(app: &App) -> Option<&Mirror> {
    let mirror = &app.mirror;
    mirror.health().is_healthy().then_some(mirror)
}

/// [`current_mirror`] read as a store, or the store itself while the mirror cannot be
/// trusted.
pub fn current_reader(app: &App) -> Arc<dyn KvStore> {
    match current_mirror(app) {
        Some(mirror) => Arc::new(MirrorReader::new(mirror.clone())),
        None => app.store.clone(),
    }
}

/// What to read `trees` through, by [`source`]: the mirror, read as a store, or the store
/// itself once a blocking read has waited there for a change under `spans` (the keys the
/// answer is made of; the trees' prefixes when there are none; a span's keys or prefixes,
/// [`Span::targets`]). Lets a handler read through a repository in one code path.
pub async fn reader(
    app: &App,
    trees: &[Tree],
    spans: &[Span],
    consistent: bool,
    blocking: Blocking,
) -> Result<Arc<dyn KvStore>, ApiError> {
    Ok(source_reader(app, trees, spans, consistent, blocking)
        .await?
        .0)
}

/// [`reader`], and the mirror when the reader reads it, as [`indexed_source`] gives them.
pub async fn source_reader<'a>(
    app: &'a App,
    trees: &[Tree],
    spans: &[Span],
    consistent: bool,
    blocking: Blocking,
) -> Result<(Arc<dyn KvStore>, Option<&'a Mirror>), ApiError> {
    let (kv, source) = open(app, trees, spans, consistent, blocking).await?;
    let mirror = match source {
        Opened::Mirror(mirror) => Some(mirror),
        Opened::Store(_) => None,
    };
    Ok((kv, mirror))
}

/// A [`reader`] and the index an answer read through it reflects.
pub struct IndexedReader {
    pub kv: Arc<dyn KvStore>,
    /// Taken before anything is read, so that a client blocking at it misses no change: the
    /// mirror's index of the trees ([`mirror_index`]), or the store's of the prefixes.
    pub index: u64,
}

/// [`reader`], with the index of an answer made of `trees` (under `spans`), for a read
/// whose repositories' own indexes do not cover all it shows.
pub async fn indexed_reader(
    app: &App,
    trees: &[Tree],
    spans: &[Span],
    consistent: bool,
    blocking: Blocking,
) -> Result<IndexedReader, ApiError> {
    Ok(indexed_source(app, trees, spans, consistent, blocking)
        .await?
        .0)
}

/// [`indexed_reader`], and the mirror when the reader reads it: for a read that narrows
/// what it reads by the mirror's secondary indexes (e.g. [`Mirror::pods_of_rc`]), which
/// the store has not.
pub async fn indexed_source<'a>(
    app: &'a App,
    trees: &[Tree],
    spans: &[Span],
    consistent: bool,
    blocking: Blocking,
) -> Result<(IndexedReader, Option<&'a Mirror>), ApiError> {
    let (kv, source) = open(app, trees, spans, consistent, blocking).await?;
    let (index, mirror) = match source {
        Opened::Mirror(mirror) => (mirror_index(mirror, trees), Some(mirror)),
        Opened::Store(prefixes) => (
            combined_index(app.store_reads.as_ref(), &prefixes).await?,
            None,
        ),
    };
    Ok((IndexedReader { kv, index }, mirror))
}

/// Which source [`open`] read from: the mirror, or the store with the prefixes whose index
/// the answer claims.
enum Opened<'a> {
    Mirror(&'a Mirror),
    Store(Vec<String>),
}

/// The reader of [`reader`] and where it reads.
async fn open<'a>(
    app: &'a App,
    trees: &[Tree],
    spans: &[Span],
    consistent: bool,
    blocking: Blocking,
) -> Result<(Arc<dyn KvStore>, Opened<'a>), ApiError> {
    match source(app, trees, spans, consistent, blocking).await {
        Source::Mirror(mirror) => Ok((
            Arc::new(MirrorReader::answering(mirror.clone(), trees)),
            Opened::Mirror(mirror),
        )),
        Source::Store(blocking) => {
            let prefixes = block_on_store(app, trees, spans, blocking).await?;
            Ok((app.store_reads.clone(), Opened::Store(prefixes)))
        }
    }
}

/// Holds a blocking read of `trees` served from the store until what `spans` hold changes
/// (what `trees` hold, when there are none; a single key's span is held until that key
/// changes, not another that starts with it); the prefixes whose index its answer claims:
/// the trees' (and the spans', on Consul at the whole store's when empty), as from the
/// mirror, so that a client passes back either answer's index and is held while nothing
/// it shows changed.
pub async fn block_on_store(
    app: &App,
    trees: &[Tree],
    spans: &[Span],
    blocking: Blocking,
) -> Result<Vec<String>, ApiError> {
    let tree_prefixes: Vec<String> = trees.iter().map(|tree| tree.prefix()).collect();
    if spans.is_empty() {
        blocking.block(app, &tree_prefixes).await?;
        return Ok(tree_prefixes);
    }
    let span_targets: Vec<WatchTarget> = spans.iter().flat_map(Span::targets).collect();
    blocking
        .block_within(app, &span_targets, &tree_prefixes)
        .await?;
    let span_prefixes: Vec<String> = spans.iter().flat_map(Span::prefixes).collect();
    // Each read once: a span is often a tree's whole prefix (no prefix holds its keys).
    let mut claimed = [span_prefixes, tree_prefixes].concat();
    claimed.sort_unstable();
    claimed.dedup();
    Ok(claimed)
}

/// The index a mirror read of `trees` reflects ([`Mirror::claimable_index`]), and never
/// below 1, as a store's listing (so that a client blocking at the `X-Index` of empty trees
/// is held on the mirror).
pub fn mirror_index(mirror: &Mirror, trees: &[Tree]) -> u64 {
    mirror.claimable_index(trees).max(1)
}
