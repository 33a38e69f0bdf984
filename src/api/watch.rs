//! `GET /api/v1/watch`: the state mirror's changes as Server-Sent Events, for dashboards and
//! tools that would otherwise poll.
//!
//! A stream starts with a snapshot (every object asked for, as `added`), marked done by a
//! `synced` event, then carries every change. Each change's SSE id is a stream position (see
//! [`crate::state::Change::position`]), and so is `synced`'s; a snapshot's objects and the
//! `resync` and `dropped` events have none, so a client's last id is always a position it
//! has everything up to. A client that reconnects with `Last-Event-ID` gets the retained
//! changes from there, possibly repeating those of that very position, never missing one. A
//! position the server no longer retains (or never gave: one from before its mirror first
//! read the store, or from before the store was reset) gets a `resync` event and a fresh
//! snapshot; after the store went backwards, every stream is sent `resync` and a snapshot
//! of the store as the mirror has read it again, not of the old one. While the mirror has
//! lost the watch of a tree a stream reads, it is not opened (503), as reads go to the store
//! then rather than serve what may be old.
//! With a selector over RCs, rolls or pods, whose labels are kept apart from them, the
//! stream follows their label sets' changes too, to send an object that starts or stops
//! matching; one that starts is sent as the mirror holds it then, and its changes to older
//! versions, which the stream may get to after, are not sent. A client more than the
//! server's buffer behind on one of the kinds it follows (changes of other kinds do not
//! count) is sent `dropped` and disconnected, so a slow client never holds the others back.
//! A stream opened with a token that a re-read of the token file revokes ends at once: its
//! token was checked only when it opened.

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::stream::{self, Stream};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::ApiQuery;
use crate::api::list_query::MAX_INDEX;
use crate::api::query_values::one_of;
use crate::app::AppState;
use crate::auth::Revocation;
use crate::error::{ApiError, Cause, ErrorBody, Violations};
use crate::labels::{LabelType, Selector};
use crate::metrics::{self, SseClient};
use crate::state::{
    object_id, Backlog, Change, ChangeType, Entry, Kind, Mirror, Receiver, Signal, Subscription,
    Tree,
};

/// OpenAPI tag of the change stream.
pub const TAG: &str = "watch";

/// How often an idle stream sends a comment line, so that proxies keep it open.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// How long a new stream waits for the mirror's first read of the store before answering 503.
const LOADING_WAIT: Duration = Duration::from_secs(5);

/// The change-stream route.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(watch))
}

/// The query of `GET /api/v1/watch`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WatchQuery {
    /// Comma-separated kinds to watch: `rcs`, `rolls`, `daemonsets`, `nodes`, `labels`,
    /// `pods`, `reality`, `health`, `events` (the parameter may also be repeated, one kind
    /// each). Default: every kind but `events` (whose snapshot is every retained event), or
    /// with a `selector` every kind that has labels (`rcs`, `rolls`, `nodes`, `labels`,
    /// `pods`).
    // Documented as the list it is, so that a client sends only names of kinds, and at least
    // one: [`Filter::from_query`] reads the text, the values of a repeated parameter joined
    // by `QueryProblems`.
    #[param(value_type = Option<Vec<Kind>>, style = Form, explode = false, min_items = 1)]
    kinds: Option<String>,
    /// Only objects whose labels (as the mirror holds them when the event is sent) match
    /// this Kubernetes label selector. An object the client was sent that is deleted or
    /// stops matching comes as `deleted`; one that starts matching, as `added`. An empty
    /// one selects everything, as if absent.
    selector: Option<String>,
}

/// The data of one event, as JSON. The SSE event name is its `type`.
#[derive(Debug, Serialize, ToSchema)]
pub struct WatchEvent {
    #[serde(rename = "type")]
    pub event_type: WatchEventType,
    /// The object's kind, for changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub kind: Option<Kind>,
    /// The object's id within its kind (`<node>/<pod_id>` for pods, `<type>/<id>` for
    /// labels), for changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub id: Option<String>,
    /// The index of the change (for a deletion, one at which the object was gone); for the
    /// other events, the stream position.
    pub index: u64,
    /// The stored object: its JSON document, or the text of a manifest; for a deletion, as
    /// last seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<serde_json::Value>,
}

/// What an event tells: `added`, `modified`, `deleted`; or `synced` (the snapshot is
/// complete), `resync` (start again: a fresh snapshot follows) or `dropped` (the client fell
/// too far behind and is disconnected).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WatchEventType {
    Added,
    Modified,
    Deleted,
    Synced,
    Resync,
    Dropped,
}

impl WatchEventType {
    /// The SSE event name, which is the type's.
    fn as_str(self) -> &'static str {
        match self {
            WatchEventType::Added => "added",
            WatchEventType::Modified => "modified",
            WatchEventType::Deleted => "deleted",
            WatchEventType::Synced => "synced",
            WatchEventType::Resync => "resync",
            WatchEventType::Dropped => "dropped",
        }
    }
}

impl From<ChangeType> for WatchEventType {
    fn from(change_type: ChangeType) -> Self {
        match change_type {
            ChangeType::Added => WatchEventType::Added,
            ChangeType::Modified => WatchEventType::Modified,
            ChangeType::Deleted => WatchEventType::Deleted,
        }
    }
}

/// What a stream sends: the kinds asked for and the selector.
#[derive(Debug, Clone)]
struct Filter {
    kinds: Vec<Kind>,
    selector: Option<Selector>,
}

impl Filter {
    /// Reads the query: 422 for an unknown kind, a bad selector, or a selector over a kind
    /// without labels.
    fn from_query(query: &WatchQuery) -> Result<Filter, ApiError> {
        let mut violations = Violations::new();
        let selector = match query.selector.as_deref().map(str::parse::<Selector>) {
            None => None,
            Some(Ok(selector)) => Some(selector),
            Some(Err(e)) => {
                violations.add("selector", e.to_string());
                None
            }
        };
        // An empty selector selects everything, as on the listings: the stream is one
        // without a selector, of kinds without labels too.
        let selector = selector.filter(|selector| !selector.is_everything());
        let selecting = selector.is_some();
        let kinds = match query.kinds.as_deref() {
            None if selecting => Kind::ALL.into_iter().filter(|k| k.has_labels()).collect(),
            None => Kind::defaults().collect(),
            Some(names) => {
                let mut kinds = Vec::new();
                for name in names.split(',').map(str::trim) {
                    match Kind::parse(name) {
                        Some(kind) if selecting && !kind.has_labels() => {
                            let labelled: Vec<&str> = Kind::ALL
                                .into_iter()
                                .filter(|k| k.has_labels())
                                .map(Kind::as_str)
                                .collect();
                            violations.add(
                                "kinds",
                                format!(
                                    "kind {name:?} has no labels to select: a selector applies to {}",
                                    one_of(&labelled)
                                ),
                            )
                        }
                        Some(kind) => kinds.push(kind),
                        None => violations.add("kinds", format!("unknown kind {name:?}")),
                    }
                }
                kinds
            }
        };
        violations.finish()?;
        Ok(Filter { kinds, selector })
    }

    /// The label types whose sets' changes the stream reads too: with a selector over
    /// objects whose labels are kept apart from them (RCs, rolls, pods), their label sets,
    /// whose changes move those objects into or out of the selector; only theirs, so that
    /// other label sets' changes (every pod's, to a stream of RCs) do not count against the
    /// client's buffer.
    fn relabelling(&self) -> Vec<LabelType> {
        // Label sets asked for as a kind are read whole.
        if self.selector.is_none() || self.kinds.contains(&Kind::Labels) {
            return Vec::new();
        }
        let apart = self.kinds.iter().filter(|kind| labelled_apart(**kind));
        apart.filter_map(|kind| kind.label_type()).collect()
    }

    /// Subscribes to the mirror's changes for this filter.
    fn subscribe(&self, mirror: &Mirror, resume: Option<u64>) -> Subscription {
        mirror.subscribe(resume, &self.kinds, &self.relabelling())
    }

    /// The prefixes of the trees the stream reads (see [`Filter::reads`]) whose watch the
    /// mirror has lost for longer than its bound ([`Mirror::health`]).
    fn lost(&self, mirror: &Mirror) -> Vec<String> {
        let lost = mirror.health().lost;
        (self.trees().into_iter().map(Tree::prefix))
            .filter(|prefix| lost.iter().any(|(lost, _)| lost == prefix))
            .collect()
    }

    /// The trees the stream reads ([`Filter::reads`]).
    fn trees(&self) -> Vec<Tree> {
        Tree::ALL
            .into_iter()
            .filter(|tree| self.reads(*tree))
            .collect()
    }

    /// Whether the stream reads `tree`: it holds objects of a kind asked for, or, with a
    /// selector, the labels of objects of such a kind.
    fn reads(&self, tree: Tree) -> bool {
        let labels_of_kind = |tree| {
            let mut label_types = self.kinds.iter().filter_map(|kind| kind.label_type());
            matches!(tree, Tree::Labels(label_type) if label_types.any(|t| t == label_type))
        };
        self.follows(tree) || (self.selector.is_some() && labels_of_kind(tree))
    }

    /// Whether `tree` holds objects of a kind asked for.
    fn follows(&self, tree: Tree) -> bool {
        tree.kind().is_some_and(|kind| self.kinds.contains(&kind))
    }

    /// The keys of the objects the selector matches now (none without one), at no version
    /// known: what a client that resumes holds, but for the changes since its position,
    /// which tell it the rest.
    /// The server's own deletes not streamed yet are changes since its position too, and
    /// not in the retained changes: the client may hold those objects, so their deletion is
    /// sent when it is streamed. So may it hold an object (one still there) whose label set
    /// the server removed, unstreamed, while it matched: the object leaves the selector when
    /// the removal is streamed.
    fn selected_now(&self, mirror: &Mirror) -> HashMap<String, u64> {
        let Some(selector) = &self.selector else {
            return HashMap::new();
        };
        let mut selected = HashMap::new();
        for tree in Tree::ALL.into_iter().filter(|tree| self.follows(*tree)) {
            let unstreamed = mirror.unstreamed_deletes(tree).into_iter();
            selected.extend(unstreamed.map(|entry| (entry.pair.key.clone(), 0)));
            for entry in mirror.entries(tree).values() {
                if self.selects(selector, mirror, tree, entry) {
                    selected.insert(entry.pair.key.clone(), 0);
                }
            }
        }
        let apart = self.kinds.iter().filter(|kind| labelled_apart(**kind));
        for label_type in apart.filter_map(|kind| kind.label_type()) {
            let labels = Tree::Labels(label_type);
            for removed in mirror.unstreamed_deletes(labels) {
                if !selector.matches(&removed.labels()) {
                    continue;
                }
                let relabelled = self.relabelled_object(labels, &removed.pair.key);
                let there = relabelled.filter(|(_, key)| mirror.get(key).is_some());
                selected.extend(there.map(|(_, key)| (key, 0)));
            }
        }
        selected
    }

    /// The tree and key of the object of a kind asked for whose labels are kept apart from
    /// it, at `key` of the label set tree `labels`, if any.
    fn relabelled_object(&self, labels: Tree, key: &str) -> Option<(Tree, String)> {
        let Tree::Labels(label_type) = labels else {
            return None;
        };
        let kind = (self.kinds.iter().copied())
            .find(|kind| kind.label_type() == Some(label_type) && labelled_apart(*kind))?;
        let tree = kind.trees().next()?;
        let id = key.strip_prefix(&labels.prefix())?;
        Some((tree, format!("{}{id}", tree.prefix())))
    }

    /// Whether the object `entry` of `tree` (of a kind asked for) has labels that the
    /// selector matches: those the mirror holds now for an object whose labels are kept
    /// apart from it, the entry's own for a node or a label set (whose labels are the entry).
    fn selects(&self, selector: &Selector, mirror: &Mirror, tree: Tree, entry: &Entry) -> bool {
        let apart = tree.kind().filter(|kind| labelled_apart(*kind));
        match apart.and_then(Kind::label_type) {
            Some(label_type) => {
                mirror.labels_match(label_type, object_id(tree, &entry.pair.key), selector)
            }
            None => selector.matches(&entry.labels()),
        }
    }
}

/// Streams the changes of the kinds asked for as Server-Sent Events.
///
/// The stream starts with every object asked for as an `added` event, then a `synced`
/// event, then one event per change. Every event's data is a JSON object (`WatchEvent`);
/// the SSE event name is its `type`; the SSE id of a change and of `synced` is the stream
/// position to pass back in `Last-Event-ID` when reconnecting (a snapshot's objects and the
/// `resync` and `dropped` events have none, so a client cut off amid a snapshot or dropped
/// resumes from the last position it has everything up to). Positions are store indexes:
/// the highest index the stream had reached (a change to one kind may arrive after a later
/// change to another), from one past the index the server first read, so that no position
/// of a server before a restart resumes; once the store has gone backwards, offset so that
/// they stay above every earlier position.
/// On reconnection the changes retained since that position are sent instead of the
/// snapshot, and so no `synced` (those of the position itself may come again: apply them
/// idempotently); for a position no longer retained, or from before this server's stream
/// began, a `resync` event comes first, then a fresh snapshot and `synced`. So too, an open
/// stream is sent `resync`, a fresh snapshot and `synced` once the store has gone backwards
/// (restored, or restarted empty): drop what the stream sent before. Positions are the
/// server's own: one another server over the same store gave is taken as this server's,
/// though changes may have reached the two in different orders, so it may miss some; resume
/// on the server that gave it, or start again without `Last-Event-ID`. A `Last-Event-ID` is
/// digits only (400 otherwise, its cause naming the header); an empty one is taken as none,
/// as an SSE client's empty id resets its last one: the stream starts with a snapshot. A
/// comment line is
/// sent every 15 s on an idle stream. A client too slow to keep up with the changes is sent
/// a `dropped` event and disconnected.
/// While the server has lost its watch of a tree the stream would read (as `/readyz` says),
/// a new or resumed stream is refused with 503 rather than started from what may be an old
/// view; a stream open already stays open and is sent the changes once the watch is back.
#[utoipa::path(
    get,
    path = "/watch",
    tag = TAG,
    params(
        WatchQuery,
        // The maximum is `MAX_INDEX`, which the attribute takes only as a literal.
        ("Last-Event-ID" = Option<u64>, Header, nullable = false, maximum = 9223372036854775807_u64,
            description = "The SSE id of the last event received, to resume from: digits only; \
                an empty one is taken as none (a fresh snapshot)")
    ),
    responses(
        // Text: an SSE stream is lines, not one JSON value; each event's `data` line is a
        // `WatchEvent`, a component of its own for SDKs to decode it with.
        (status = OK, description = "An endless stream of Server-Sent Events, each one's `data` a `WatchEvent` in JSON", body = String, content_type = "text/event-stream"),
        (status = BAD_REQUEST, description = "`Last-Event-ID` is not a stream position (digits, a number up to 2^63-1)", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "An unknown kind, a bad selector, or a selector over a kind without labels", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The server has not read the store yet, or has lost its watch of a tree the stream reads (see `/readyz`)", body = ErrorBody)
    )
)]
async fn watch(
    State(app): State<AppState>,
    ApiQuery(query): ApiQuery<WatchQuery>,
    headers: HeaderMap,
    revocation: Revocation,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let resume = resume_position(&headers)?;
    let filter = Filter::from_query(&query)?;
    // Nor is a stream started from the old store's entries after the store went backwards.
    let loading = async {
        app.mirror.loaded().await;
        app.mirror.read_again(&filter.trees()).await
    };
    if tokio::time::timeout(LOADING_WAIT, loading).await != Ok(true) {
        return Err(ApiError::unavailable(
            "the state mirror has not read the store yet",
        ));
    }
    // A tree whose watch is lost may be held as it was long ago: a stream would start from
    // it with no sign that it is old, where a read goes to the store instead. Streams open
    // already stay open: they are sent what changed once the watch is back.
    let lost = filter.lost(&app.mirror);
    if !lost.is_empty() {
        return Err(ApiError::unavailable(format!(
            "the state mirror has lost the watch of {}",
            lost.join(", ")
        )));
    }
    let watcher = Watcher::start(app, filter, resume, revocation);
    let events = stream::unfold(watcher, |mut watcher| async move {
        let event = watcher.next().await?;
        Some((Ok(event), watcher))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(HEARTBEAT)))
}

/// The position a stream resumes from: its `Last-Event-ID`, digits only (as the stream gives
/// them: `+5` is no position), or none when the header is absent or empty (an SSE client
/// sends no empty one; an empty id resets its last one, so it asks for a fresh snapshot).
/// 400 otherwise, naming the header.
fn resume_position(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    const HEADER: &str = "Last-Event-ID";
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().ok().map(str::trim);
    if text == Some("") {
        return Ok(None);
    }
    text.filter(|text| text.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|text| text.parse::<u64>().ok())
        // Positions are store indexes, which never pass `MAX_INDEX`.
        .filter(|position| *position <= MAX_INDEX)
        .map(Some)
        .ok_or_else(|| {
            let message =
                format!("must be a stream position: digits only, a number from 0 to {MAX_INDEX}");
            ApiError::bad_request(format!("{HEADER} {message}"))
                .with_causes(vec![Cause::new(HEADER, message)])
        })
}

/// An event waiting in a client's backlog. A change is rendered only when its turn comes, so
/// a snapshot of a large fleet costs the client a pointer per object until it reads it,
/// and a client cut off halfway never has the rest rendered.
enum Pending {
    Control(Event),
    Change(Arc<Change>),
    /// An object of a snapshot: sent without an id, so that a client cut off midway
    /// resumes from where it was before the snapshot, or takes a new one.
    Snapshot(Arc<Change>),
}

/// One client's stream.
struct Watcher {
    app: AppState,
    filter: Filter,
    /// Events to send before listening again.
    pending: VecDeque<Pending>,
    receiver: Receiver,
    /// With a selector, the keys of the objects last sent as matching it, each with the
    /// modify index of the version last sent (0 when not known): an object that is deleted
    /// or stops matching is sent as `deleted` only if the client holds it, and a change to
    /// a version older than the client holds (sent as it was when its labels brought it
    /// in) is not sent.
    selected: HashMap<String, u64>,
    /// Whether the stream ends once `pending` is sent.
    ending: bool,
    /// Ends the stream, at once, when the token it was opened with is revoked.
    revocation: Revocation,
    /// Counts the stream in the metrics while it lives.
    _client: SseClient,
}

impl Watcher {
    fn start(
        app: AppState,
        filter: Filter,
        resume: Option<u64>,
        revocation: Revocation,
    ) -> Watcher {
        // Taken before the subscription, so that every change after it is in the backlog.
        let selected = match resume {
            Some(_) => filter.selected_now(&app.mirror),
            None => HashMap::new(),
        };
        let subscription = filter.subscribe(&app.mirror, resume);
        let resumed = resume.is_some() && !subscription.backlog.resynced;
        let mut watcher = Watcher {
            receiver: subscription.receiver,
            app,
            filter,
            pending: VecDeque::new(),
            selected,
            ending: false,
            revocation,
            _client: SseClient::connected(),
        };
        watcher.queue(subscription.backlog, !resumed);
        watcher
    }

    /// The event to send for `change`, if any. Without a selector, every change of a kind
    /// asked for. With one, a change of an object that matches it (as `added` if the client
    /// does not hold it, never as `added` if it does); the deletion of an object the client
    /// holds; and, for an object that stops matching, a deletion. `unsure`: the
    /// change is replayed to a client that resumed, which may hold any object that changed
    /// since its position, so each one that is gone or does not match is sent as deleted,
    /// and a node or a label set that matches (whose change may be the one that brought it
    /// into the selector, as a relabelled RC's is) as added.
    fn admit(&mut self, change: Arc<Change>, unsure: bool) -> Option<Arc<Change>> {
        if !self.filter.follows(change.tree) {
            return None;
        }
        let Some(selector) = &self.filter.selector else {
            return Some(change);
        };
        let key = &change.entry.pair.key;
        let version = change.entry.pair.modify_index;
        let sent_version = self.selected.remove(key);
        let sent = sent_version.is_some();
        let held = sent || unsure;
        if change.change_type == ChangeType::Deleted {
            return held.then_some(change);
        }
        let mirror = &self.app.mirror;
        let kind = change.tree.kind()?;
        if self
            .filter
            .selects(selector, mirror, change.tree, &change.entry)
        {
            // The client holds a newer version already.
            if let Some(sent_version) = sent_version.filter(|sent| *sent > version) {
                self.selected.insert(key.clone(), sent_version);
                return None;
            }
            self.selected.insert(key.clone(), version);
            return Some(match change.change_type {
                // An object that starts matching is new to the client.
                _ if !held => retyped(&change, ChangeType::Added),
                _ if unsure && !labelled_apart(kind) => retyped(&change, ChangeType::Added),
                // One the client was sent already, its labels having brought it in as they
                // reached the mirror before it (a pod's, which the farms write first), is not.
                ChangeType::Added if sent && !unsure => retyped(&change, ChangeType::Modified),
                _ => change,
            });
        }
        held.then(|| retyped(&change, ChangeType::Deleted))
    }

    /// For a change of a label set kept apart from its object (an RC's, a roll's, a pod's)
    /// when the client follows the object's kind with a selector: the object as `added` if
    /// it now matches and the client did not hold it, as `deleted` if it no longer matches
    /// and the client held it. `unsure`: replayed to a client that resumed, which may hold
    /// the object or not.
    fn relabeled(&mut self, change: &Change, unsure: bool) -> Option<Arc<Change>> {
        let selector = self.filter.selector.as_ref()?;
        let (tree, key) = (self.filter).relabelled_object(change.tree, &change.entry.pair.key)?;
        let mirror = &self.app.mirror;
        let entry = mirror.get(&key)?;
        let change_type = if self.filter.selects(selector, mirror, tree, &entry) {
            let new = !self.selected.contains_key(&key);
            (new || unsure).then_some(ChangeType::Added)?;
            self.selected.insert(key, entry.pair.modify_index);
            ChangeType::Added
        } else {
            let held = self.selected.remove(&key).is_some();
            (held || unsure).then_some(ChangeType::Deleted)?
        };
        Some(Arc::new(Change {
            change_type,
            tree,
            index: change.index,
            position: change.position,
            entry,
            rendered: OnceLock::new(),
        }))
    }

    /// Queues a subscription's backlog: after a snapshot, a `synced` event; before one that
    /// replaces a position that cannot resume, `resync`.
    fn queue(&mut self, backlog: Backlog, snapshot: bool) {
        let position = backlog.position;
        let snapshot = snapshot || backlog.resynced;
        if backlog.resynced {
            self.pending
                .push_back(Pending::Control(control(WatchEventType::Resync, position)));
        }
        if snapshot {
            self.selected.clear();
        }
        // Replayed with a selector, an object whose labels change later in the backlog may
        // have come to match only then: until its label change is replayed, the client may
        // not hold it, so a change of it that matches is sent as added rather than modified.
        // Without a selector the client holds every object it follows.
        let relabelled_object = |filter: &Filter, change: &Change| {
            let relabelled = filter.relabelled_object(change.tree, &change.entry.pair.key);
            let selected = !snapshot && filter.selector.is_some();
            relabelled.filter(|_| selected).map(|(_, key)| key)
        };
        let mut relabelled_later: HashSet<String> = (backlog.changes.iter())
            .filter_map(|change| relabelled_object(&self.filter, change))
            .collect();
        for change in backlog.changes {
            if let Some(key) = relabelled_object(&self.filter, &change) {
                relabelled_later.remove(&key);
            }
            // A snapshot's label sets move no object: its objects are sent as they are.
            let relabeled = (!snapshot).then(|| self.relabeled(&change, true)).flatten();
            if let Some(relabeled) = relabeled {
                self.pending.push_back(Pending::Change(relabeled));
            }
            if let Some(mut change) = self.admit(change, !snapshot) {
                let key = &change.entry.pair.key;
                if change.change_type == ChangeType::Modified && relabelled_later.contains(key) {
                    change = retyped(&change, ChangeType::Added);
                }
                self.pending.push_back(if snapshot {
                    Pending::Snapshot(change)
                } else {
                    Pending::Change(change)
                });
            }
        }
        if snapshot {
            // The position the snapshot reflects: resuming from it misses nothing.
            let synced = control(WatchEventType::Synced, position).id(position.to_string());
            self.pending.push_back(Pending::Control(synced));
        }
    }

    /// The next event to send; `None` ends the stream.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if self.revocation.revoked() {
                tracing::info!("change stream ended: its token was revoked");
                return None;
            }
            match self.pending.pop_front() {
                Some(Pending::Control(event)) => return Some(event),
                Some(Pending::Change(change)) => {
                    return Some(change_event(&change).id(change.position.to_string()))
                }
                Some(Pending::Snapshot(change)) => return Some(change_event(&change)),
                None => {}
            }
            if self.ending {
                return None;
            }
            let signal = tokio::select! {
                signal = self.receiver.recv() => signal,
                () = self.revocation.reloaded() => continue,
                () = self.app.shutdown.cancelled() => return None,
            };
            match signal {
                Ok(Signal::Change(change)) => {
                    let relabeled = self.relabeled(&change, false);
                    let admitted = self.admit(change, false);
                    for change in admitted.into_iter().chain(relabeled) {
                        self.pending.push_back(Pending::Change(change));
                    }
                }
                Ok(Signal::Resync) => {
                    // The snapshot is of the store as it is now, once the mirror has read
                    // it again, not of the old store's entries it holds until then.
                    let trees = self.filter.trees();
                    tokio::select! {
                        _ = self.app.mirror.read_again(&trees) => {}
                        () = self.app.shutdown.cancelled() => return None,
                    }
                    let subscription = self.filter.subscribe(&self.app.mirror, None);
                    let resync = control(WatchEventType::Resync, subscription.backlog.position);
                    self.pending.push_back(Pending::Control(resync));
                    self.receiver = subscription.receiver;
                    self.queue(subscription.backlog, true);
                }
                Err(RecvError::Lagged(_)) => {
                    self.ending = true;
                    metrics::sse_client_dropped();
                    return Some(control(WatchEventType::Dropped, self.app.mirror.position()));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    }
}

/// Whether the labels of objects of `kind` are kept in a tree apart from the objects, whose
/// changes do not change the objects.
fn labelled_apart(kind: Kind) -> bool {
    kind.label_type()
        .is_some_and(|label_type| kind.trees().all(|tree| tree != Tree::Labels(label_type)))
}

/// `change` as a change of another type, for one client.
fn retyped(change: &Change, change_type: ChangeType) -> Arc<Change> {
    Arc::new(Change {
        change_type,
        tree: change.tree,
        index: change.index,
        position: change.position,
        entry: change.entry.clone(),
        rendered: OnceLock::new(),
    })
}

/// An event without an object (`synced`, `resync`, `dropped`), at `position`. Only `synced`
/// is given an id: a client reconnecting after `resync` or `dropped` resumes from the last
/// change it received.
fn control(event_type: WatchEventType, position: u64) -> Event {
    let data = WatchEvent {
        event_type,
        kind: None,
        id: None,
        index: position,
        object: None,
    };
    Event::default()
        .event(event_type.as_str())
        .data(serde_json::to_string(&data).expect("an event serializes"))
}

/// Whether `tree`'s values are manifests, sent as their text: YAML, which a writer may have
/// written in flow style, reading as JSON, though a pod or a report is never a JSON document.
fn holds_manifests(tree: Tree) -> bool {
    matches!(tree, Tree::Intent | Tree::Reality)
}

/// A change's event, without its id; its data is rendered once for all streams.
fn change_event(change: &Arc<Change>) -> Event {
    let event_type = WatchEventType::from(change.change_type);
    let data = change.rendered.get_or_init(|| {
        let value = change.entry.value();
        let json = (!holds_manifests(change.tree))
            .then(|| serde_json::from_slice(&value).ok())
            .flatten();
        let object = json.unwrap_or_else(|| {
            serde_json::Value::String(String::from_utf8_lossy(&value).into_owned())
        });
        let event = WatchEvent {
            event_type,
            kind: change.tree.kind(),
            id: Some(object_id(change.tree, &change.entry.pair.key).to_owned()),
            index: change.index,
            object: Some(object),
        };
        serde_json::to_string(&event).expect("an event serializes")
    });
    Event::default()
        .event(event_type.as_str())
        .data(data.as_str())
}
