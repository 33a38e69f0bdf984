//! `GET /api/v1/events`: who changed what and when, newest first, from the server's mirror
//! of the events tree (bounded by `--event-retention-count` and `--event-retention-age`).

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::index_header;
use crate::api::extract::ApiJson;
use crate::api::list_query::{ListFilter, ListQuery, UnlabelledListParams};
use crate::api::paging::Page;
use crate::api::query_values::{not_of_kind, one_of};
use crate::api::reads::{block_on_store, mirror_index, source, Source};
use crate::app::AppState;
use crate::error::{ApiError, ErrorBody, Violations};
use crate::kv::KvStore;
use crate::layout;
use crate::model::event::{Event, EventKind};
use crate::model::json_may_hold;
use crate::model::timestamp::parse_rfc3339;
use crate::state::{Entries, Entry, Span, Tree};

/// OpenAPI tag of the events route.
pub const TAG: &str = "events";

/// The events route.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_events))
}

/// The filters of `GET /api/v1/events`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventFilter {
    /// Only events about objects of this kind: `rcs`, `rolls`, `daemonsets`, `nodes` (node
    /// labels), `labels` (other objects' labels), `reality` or `health` (node agents'
    /// reports).
    #[param(value_type = Option<EventKind>)]
    kind: Option<String>,
    /// Only events about the object with this id.
    id: Option<String>,
    /// Only events by this actor (a token's name, `anonymous`, or `farm:<farm>@<holder>`).
    actor: Option<String>,
    /// Only events at or after this time (RFC 3339).
    #[param(format = DateTime)]
    since: Option<String>,
    /// Only events before this time (RFC 3339); not before `since`.
    #[param(format = DateTime)]
    until: Option<String>,
}

impl ListFilter for EventFilter {
    /// Events have no labels.
    const SELECTS: bool = false;

    fn check(&self, violations: &mut Violations) {
        if let Some(kind) = &self.kind {
            if EventKind::parse(kind).is_none() {
                let names: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
                violations.add("kind", not_of_kind(one_of(&names), kind));
            }
        }
        for (field, value) in [("since", &self.since), ("until", &self.until)] {
            if let Some(text) = value.as_deref().filter(|t| parse_rfc3339(t).is_none()) {
                let takes = "an RFC 3339 time such as 2024-05-01T12:00:00Z";
                violations.add(field, not_of_kind(takes, text));
            }
        }
        // A window that ends before it starts admits nothing: a mistake, not a question.
        let time = |text: &Option<String>| text.as_deref().and_then(parse_rfc3339);
        if let (Some(since), Some(until)) = (time(&self.since), time(&self.until)) {
            if until < since {
                violations.add("until", "must not be before since");
            }
        }
    }
}

/// The events a listing reads: every retained one, or one object's.
enum Stored {
    All(Entries),
    OfObject(Vec<Arc<Entry>>),
}

impl EventFilter {
    /// Whether the stored bytes of an event may hold one [`EventFilter::admits`], told
    /// without decoding them, so that one object's events read from the store (the mirror
    /// has an index of them) cost a scan of the retained events' bytes rather than a
    /// decoding of every one: an event about the object `id` holds it in its JSON as it is,
    /// unless the JSON escapes a character somewhere (this server's writer escapes none
    /// that an object id has; any event that escapes one, or is not UTF-8, is decoded to
    /// tell).
    fn may_admit(&self, stored: &[u8]) -> bool {
        let Some(id) = self.id.as_deref() else {
            return true;
        };
        json_may_hold(stored, id)
    }

    /// Whether `event` passes every filter given.
    fn admits(&self, event: &Event) -> bool {
        let time = Event::time_of_id(&event.id);
        let bound = |text: &Option<String>| text.as_deref().and_then(parse_rfc3339);
        let after = |since: SystemTime| time.is_some_and(|t| t >= since);
        let before = |until: SystemTime| time.is_some_and(|t| t < until);
        self.kind
            .as_deref()
            .is_none_or(|k| event.kind.as_str() == k)
            && self.id.as_deref().is_none_or(|id| event.object_id == id)
            && self.actor.as_deref().is_none_or(|a| event.actor == a)
            && bound(&self.since).is_none_or(after)
            && bound(&self.until).is_none_or(before)
    }
}

/// Lists events, newest first.
///
/// Every change made through the API or by the farms is an event, written in the same
/// transaction as the change: its time, actor, action, object, request id and the fields it
/// changed, before and after. Events are kept up to `--event-retention-count` and for
/// `--event-retention-age`. Served from the server's mirror of the store; blocks with
/// `?index=&wait=` until an event (of the object, with `id`) is added or pruned. Events
/// have no labels, so the listing takes no `selector`. The change stream carries them too
/// (`GET /api/v1/watch?kinds=events`).
#[utoipa::path(
    get,
    path = "/events",
    tag = TAG,
    params(EventFilter, UnlabelledListParams),
    responses(
        (status = OK, description = "One page of events, newest first", body = Page<Event>,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Bad kind, time, limit, continue token, index or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn list_events(
    State(app): State<AppState>,
    query: ListQuery<EventFilter>,
) -> Result<Response, ApiError> {
    let trees = [Tree::Events];
    // One object's listing wakes only at its own events.
    let spans: Vec<Span> = (query.filter.id.iter())
        .map(|id| Span::ObjectEvents {
            object_id: id.clone(),
        })
        .collect();
    let (index, stored): (u64, Stored) =
        match source(&app, &trees, &spans, false, query.blocking).await {
            Source::Mirror(mirror) => {
                let index = mirror_index(mirror, &trees);
                // One object's events are read through the mirror's index of them: their
                // cost is theirs, not every retained event's.
                match &query.filter.id {
                    Some(id) => (index, Stored::OfObject(mirror.events_of(id))),
                    None => (index, Stored::All(mirror.entries(Tree::Events))),
                }
            }
            Source::Store(blocking) => {
                block_on_store(&app, &trees, &spans, blocking).await?;
                let listing = app.store_reads.list(layout::EVENTS).await?;
                let entries = listing.pairs.into_iter();
                let entries = entries.map(|pair| Arc::new(Tree::Events.decode(pair)));
                (listing.index, Stored::All(entries.collect()))
            }
        };
    let newest_first: Box<dyn Iterator<Item = &Arc<Entry>>> = match &stored {
        Stored::All(entries) => Box::new(entries.values().rev()),
        Stored::OfObject(entries) => Box::new(entries.iter().rev()),
    };
    // Read in place, newest first, and decoded only until the page is full.
    let page = query.paging.page_descending_decoded(
        newest_first,
        |entry| &entry.pair.key[layout::EVENTS.len()..],
        |entry| {
            if !query.filter.may_admit(&entry.pair.value) {
                return None;
            }
            match Event::from_json(&entry.pair.value) {
                Ok(event) => query.filter.admits(&event).then_some(event),
                Err(e) => {
                    tracing::warn!(key = %entry.pair.key, error = %e, "skipping unreadable event");
                    None
                }
            }
        },
    );
    Ok(([index_header(index)], ApiJson(page)).into_response())
}
