//! `/api/v1/daemonsets`: create, list, read (with rollout status), patch and delete daemon sets.
//!
//! What is stored is exactly P2's daemon-set document, so P2's DS farm and `p2-dsctl`
//! work on the same store. Every change carries an audit record naming who made it: the
//! name of the request's token ([`Actor`]; `anonymous` without tokens). Because P2's farm disables any
//! daemon set that is created or changed into contention, the API refuses such a write
//! with 409 instead, naming the other daemon set, unless the daemon set is stored disabled.
//! The check and the write are not one transaction: two racing writes can both pass it, in
//! which case the farm's own check disables the later one.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::{combined_index, error_at, index_header};
use crate::api::extract::{ApiJson, ApiPath, MergePatch, NoQuery};
use crate::api::list_query::{ListFilter, ListParams, ListQuery};
use crate::api::paging::Page;
use crate::api::preconditions::{etag, stale, IfMatch};
use crate::api::reads::{
    block_on_store, current_mirror, current_reader, indexed_source, mirror_index, source,
    IndexedReader, ReadParams, ReadQuery, Source,
};
use crate::api::responses::{created, read_back};
use crate::app::AppState;
use crate::error::{ApiError, ErrorBody, Violations};
use crate::kv::keys::segment_problem;
use crate::kv::{KvStore, StoreError, StoreResult};
use crate::labels::{LabelType, Labels, Requirement, Selector, DS_ID_LABEL, RC_ID_LABEL};
use crate::layout;
use crate::model::conditions::{some_of, Condition};
use crate::model::duration::format_timeout;
use crate::model::event::{Actor, Meta, ObjectKind};
use crate::model::{
    ds_spec, CreateDaemonSet, DaemonSetId, DaemonSetPatch, HealthCounts, HealthState, PodHealth,
    PodId, StoredDaemonSet,
};
use crate::state::{Mirror, Span, Tree};
use crate::store::conditions::{mirrored, read_conditions, ConditionStore};
use crate::store::daemon_sets::{
    self, describe, selects_every_node, DaemonSetError, DaemonSetFarmStatus, DaemonSetRecord,
    DaemonSetStore,
};
use crate::store::events::{list_meta, mirrored_meta, read_meta};
use crate::store::health::HealthStore;
use crate::store::labels::LabelStore;
use crate::store::pods::{validate_pod_id, PodLocation, PodStore, PodTree};
use crate::store::rcs::RcStore;
use crate::store::Versioned;

/// OpenAPI tag of the daemon-set routes.
pub const TAG: &str = "daemonsets";

/// The daemon-set routes, nested under `/api/v1` by the top-level router.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_daemon_sets, create_daemon_set))
        .routes(routes!(get_daemon_set, patch_daemon_set, delete_daemon_set))
}

/// A daemon set as the API shows it: the stored fields, the timeout as duration text and the
/// version to pass back in `If-Match`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DaemonSet {
    /// UUID chosen by the server on create.
    pub id: String,
    /// The pod manifest exactly as stored (YAML text).
    pub manifest: String,
    /// Selector of the nodes to run on, in canonical form; `""` selects every node.
    pub node_selector: String,
    /// Nodes that must stay healthy while the farm replaces pods with a new manifest (P2's
    /// farm does not act on it).
    pub min_health: i64,
    /// Free-form name such as `production`; plays no part in scheduling.
    pub cluster_name: String,
    /// The manifest's `id`; fixed for the life of the daemon set.
    pub pod_id: String,
    /// How long the farm waits for one node to become healthy, e.g. `10m0s`, before it gives
    /// up on it; it brings up at most 50 nodes at a time.
    #[schema(example = "10m0s")]
    pub timeout: String,
    /// Whether the daemon set is paused.
    pub disabled: bool,
    /// The stored document's modify index, also sent as the `ETag`.
    pub resource_version: String,
    /// The rollout as seen now; given for a single daemon set, absent in lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub status: Option<DaemonSetStatus>,
    /// `Progressing`, `Blocked` and `Contended`, as the leader's DS farm last computed them;
    /// empty until a leader's farm has looked at the daemon set (or when another farm owns
    /// it).
    #[serde(default)]
    #[schema(required = true)]
    pub conditions: Vec<Condition>,
    /// When the daemon set was created through this server; `null` for one another tool
    /// created.
    #[schema(format = DateTime, required = true)]
    pub created: Option<String>,
    /// When its document last changed through this server (the API or the farm); `null`
    /// for one another tool created and this server never changed.
    #[schema(format = DateTime, required = true)]
    pub modified: Option<String>,
}

impl DaemonSet {
    /// The view with the times kept beside the daemon set.
    fn with_times(self, meta: Option<Meta>) -> Self {
        let (created, modified) = Meta::times(meta);
        DaemonSet {
            created,
            modified,
            ..self
        }
    }
}

/// Where a daemon set's rollout stands, computed when asked from node labels, pod labels and
/// health records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DaemonSetStatus {
    /// Nodes its selector matches now.
    pub nodes_targeted: usize,
    /// Pods labelled `daemon_set_id=<id>`, i.e. nodes it has been scheduled on.
    pub nodes_scheduled: usize,
    /// Of those on targeted nodes running the daemon set's pod id and not labelled for an
    /// enabled RC too, the ones whose node reports running its intended manifest with health
    /// `passing`: the nodes the farm counts for `min_health`, which while it takes over a
    /// disabled daemon set's pods also counts those of them that are healthy.
    pub nodes_healthy: usize,
    /// What the DS farm last published about the rollout; `null` until it has.
    #[schema(required = true)]
    pub farm: Option<DaemonSetFarmStatus>,
}

/// The filter of `GET /api/v1/daemonsets`; an empty `pod_id` means no filter, as in the pod
/// listing.
#[derive(Debug, Default, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DaemonSetFilter {
    /// Only daemon sets running this pod ID.
    #[param(value_type = Option<PodId>, inline)]
    pub pod_id: Option<String>,
    /// Read through to the store rather than from this server's mirror of it.
    pub consistent: Option<bool>,
}

impl DaemonSetFilter {
    /// The pod ID to list, if any.
    fn pod_id(&self) -> Option<&str> {
        self.pod_id.as_deref().filter(|s| !s.is_empty())
    }
}

impl ListFilter for DaemonSetFilter {
    fn check(&self, violations: &mut Violations) {
        if let Some(Err(e)) = self.pod_id().map(validate_pod_id) {
            violations.add("pod_id", e);
        }
    }
}

/// How daemon-set store failures reach clients: a missing daemon set is 404, a stale
/// `If-Match` 412, a broken invariant 422 and an unreadable stored document 500
/// `UnreadableDocument`.
impl From<DaemonSetError> for ApiError {
    fn from(err: DaemonSetError) -> Self {
        match err {
            DaemonSetError::NotFound(id) => {
                ApiError::not_found(format!("daemon set {id} not found"))
            }
            DaemonSetError::Stale { what, expected } => stale(&what, expected),
            DaemonSetError::Invalid(problems) => ApiError::invalid(problems),
            DaemonSetError::Undecodable { id, .. } => {
                ApiError::unreadable(format!("{err}; DELETE /api/v1/daemonsets/{id} removes it"))
            }
            DaemonSetError::Store(e) => e.into(),
        }
    }
}

/// Lists daemon sets, sorted by ID, optionally only those running one pod ID.
///
/// Daemon sets have no labels of their own in P2, so `selector` matches `pod_id` and
/// `cluster_name` as labels, e.g. `cluster_name in (production,staging)`. Blocks with `?index=&wait=` until a daemon set, its conditions or its times change; `X-Index`
/// carries their index. Items carry no `status`; read one daemon set for it. Served from the server's
/// mirror of the store unless `?consistent=true`.
#[utoipa::path(
    get,
    path = "/daemonsets",
    tag = TAG,
    params(DaemonSetFilter, ListParams),
    responses(
        (status = OK, description = "One page of daemon sets", body = Page<DaemonSet>,
            headers(("X-Index" = u64, description = "The index of the daemon sets, their conditions and times, for ?index="))),
        (status = BAD_REQUEST, description = "Malformed query string", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Bad selector, limit, continue token, index or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn list_daemon_sets(
    State(app): State<AppState>,
    query: ListQuery<DaemonSetFilter>,
) -> Result<impl IntoResponse, ApiError> {
    let pod_id = query.filter.pod_id();
    let wanted = |ds: &StoredDaemonSet| {
        pod_id.is_none_or(|pod| ds.pod_id == pod) && query.selector.matches(&ds.labels())
    };
    let consistent = query.filter.consistent.unwrap_or(false);
    let (index, items) = match source(&app, &LIST_TREES, &[], consistent, query.blocking).await {
        Source::Mirror(mirror) => {
            let index = mirror_index(mirror, &LIST_TREES);
            let records = mirror.entries(Tree::DaemonSets);
            let records = records
                .values()
                .filter_map(|entry| daemon_sets::from_entry(entry));
            let items = records
                .filter(|r| wanted(&r.value))
                .map(|r| {
                    let meta = mirrored_meta(mirror, ObjectKind::Daemonsets, &r.value.id);
                    let conditions = mirrored(mirror, ObjectKind::Daemonsets, &r.value.id);
                    daemon_set(&r, None, conditions).with_times(meta)
                })
                .collect();
            (index, items)
        }
        Source::Store(blocking) => {
            let prefixes = block_on_store(&app, &LIST_TREES, &[], blocking).await?;
            let kv: Arc<dyn KvStore> = app.store_reads.clone();
            // Taken before anything is read: a change landing between the reads is in the
            // answer or above its index, so a client blocking at it misses nothing.
            let index = combined_index(kv.as_ref(), &prefixes).await?;
            let (_, records) = DaemonSetStore::new(kv.clone()).list().await?;
            let mut times = list_meta(kv.as_ref(), ObjectKind::Daemonsets).await?;
            let mut conditions = ConditionStore::new(kv).list(ObjectKind::Daemonsets).await?;
            let items = records
                .iter()
                .filter(|r| wanted(&r.value))
                .map(|r| {
                    let conditions = conditions.remove(&r.value.id).flatten();
                    let conditions = conditions.map(|r| r.conditions).unwrap_or_default();
                    daemon_set(r, None, conditions).with_times(times.remove(&r.value.id))
                })
                .collect();
            (index, items)
        }
    };
    let page = query.paging.page(items, |ds: &DaemonSet| ds.id.as_str());
    Ok(([index_header(index)], ApiJson(page)))
}

/// Creates a daemon set; `pod_id` is the manifest's `id`.
///
/// Every bad field is reported at once (422). An enabled daemon set that would contend with
/// another (same pod ID, overlapping nodes) is refused with 409 naming the other and, where
/// the two selectors are not the same (by canonical text, as P2 compares them) and neither
/// selects every node, the nodes both select (else it says whose selector selects every
/// node, or that the two are the same); send `"disabled": true` to store it anyway, paused.
#[utoipa::path(
    post,
    path = "/daemonsets",
    tag = TAG,
    request_body = CreateDaemonSet,
    responses(
        (status = CREATED, description = "The new daemon set", body = DaemonSet,
            headers(("ETag" = String, description = "The version, for If-Match"),
                    ("Location" = String, description = "URL of the new daemon set"))),
        (status = BAD_REQUEST, description = "Malformed JSON", body = ErrorBody),
        (status = CONFLICT, description = "It would contend with another daemon set", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "The body is not JSON", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Invalid fields, all listed", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn create_daemon_set(
    State(app): State<AppState>,
    _: NoQuery,
    actor: Actor,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<impl IntoResponse, ApiError> {
    let ds = ds_spec::new_daemon_set(body).map_err(ApiError::invalid)?;
    let store = app.daemon_sets();
    let labels = app.labels();
    if let Some(contender) = store.find_contender(&ds, &labels).await? {
        return Err(contention_error(&ds, &contender));
    }
    let record = store.create(ds, &actor).await?;
    let id = record
        .value
        .id
        .parse::<DaemonSetId>()
        .map_err(ApiError::internal)?
        .uuid();
    let view = applied_view(&app, id, &record).await;
    created(&format!("/api/v1/daemonsets/{id}"), record.index, view)
}

/// Reads one daemon set with its rollout status.
///
/// Served from the server's mirror of the store unless `?consistent=true` (see `X-Index`).
/// Blocks with `?index=&wait=` until anything it is made of changes: the daemon set, any
/// node's labels (its selector may match the node), its pods' labels, the RCs they name,
/// their intents, what their nodes run, their health, the farm's status record of it or
/// its conditions; not at other daemon sets' or pods' changes, even at an index they have
/// moved past.
#[utoipa::path(
    get,
    path = "/daemonsets/{id}",
    tag = TAG,
    params(("id" = inline(DaemonSetId), Path, description = "Daemon set ID"), ReadParams),
    responses(
        (status = OK, description = "The daemon set", body = DaemonSet,
            headers(("ETag" = String, description = "The version, for If-Match"),
                    ("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = NOT_FOUND, description = "No such daemon set", body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for the daemon set to come back"))),
        (status = UNPROCESSABLE_ENTITY, description = "The ID is not a UUID, or a bad index or wait", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The stored daemon set cannot be decoded (reason `UnreadableDocument`); DELETE removes it", body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for it to be mended"))),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn get_daemon_set(
    State(app): State<AppState>,
    query: ReadQuery,
    ApiPath(id): ApiPath<DaemonSetId>,
) -> Result<Response, ApiError> {
    let id = id.uuid();
    let spans = view_spans(id);
    let (IndexedReader { kv, index }, mirror) =
        indexed_source(&app, &DS_TREES, &spans, query.consistent, query.blocking).await?;
    let record = match DaemonSetStore::new(kv.clone()).get(id).await {
        Ok(Some(record)) => record,
        Ok(None) => return Ok(error_at(DaemonSetError::NotFound(id).into(), index)),
        Err(e @ DaemonSetError::Undecodable { .. }) => return Ok(error_at(e.into(), index)),
        Err(e) => return Err(e.into()),
    };
    let view = view(&kv, mirror, id, &record).await?;
    Ok(([etag(record.index), index_header(index)], ApiJson(view)).into_response())
}

/// Changes a daemon set with a JSON merge patch of `manifest`, `node_selector`,
/// `min_health`, `cluster_name`, `timeout` and `disabled`.
///
/// With `If-Match` the patch applies only to that version (412 otherwise); without it, it is
/// re-applied to the latest version while it loses to concurrent writes (for up to 5 s), so
/// concurrent patches of different fields all take effect. A patch that changes nothing
/// answers 200 with the daemon set unchanged. A change leaving the daemon set enabled and
/// contending with another is refused with 409 naming the other and, where the two
/// selectors are not the same and neither selects every node, the nodes both select (else
/// it says whose selector selects every node, or that the two are the same). It is refused so
/// whatever it changes (the manifest alone included) while nodes relabelled into both make
/// them contend (`Contended` reason `NodeLabelsContend`): the write would make the
/// contention this one's, for which the DS farm disables the one written last. Change those
/// nodes' labels or a selector first, or disable one of the two.
#[utoipa::path(
    patch,
    path = "/daemonsets/{id}",
    tag = TAG,
    params(
        ("id" = inline(DaemonSetId), Path, description = "Daemon set ID"),
        ("If-Match" = Option<String>, Header, nullable = false, description = "Apply only to this version (an ETag)")
    ),
    request_body(description = "A JSON merge patch",
        content((DaemonSetPatch = "application/merge-patch+json"), (DaemonSetPatch = "application/json"))),
    responses(
        (status = OK, description = "The daemon set after the patch", body = DaemonSet,
            headers(("ETag" = String, description = "The version, for If-Match"))),
        (status = BAD_REQUEST, description = "Malformed JSON or If-Match", body = ErrorBody),
        (status = NOT_FOUND, description = "No such daemon set", body = ErrorBody),
        (status = CONFLICT, description = "It would contend with another daemon set, or it kept changing for 5 s", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "If-Match is stale", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "The body is not a JSON merge patch", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Invalid fields, all listed", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The stored daemon set cannot be decoded (reason `UnreadableDocument`); DELETE removes it", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn patch_daemon_set(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(id): ApiPath<DaemonSetId>,
    if_match: IfMatch,
    actor: Actor,
    MergePatch(body): MergePatch,
) -> Result<impl IntoResponse, ApiError> {
    let id = id.uuid();
    let store = app.daemon_sets();
    let labels = app.labels();
    let (changes, mut problems) = ds_spec::parse_patch(body);
    if !problems.is_empty() {
        // Report a manifest for the wrong pod along with the other problems.
        if let (Some(manifest), Ok(Some(current))) = (&changes.manifest, store.get(id).await) {
            problems.extend(ds_spec::pod_id_problem(manifest, &current.value));
        }
        problems.finish().map_err(ApiError::invalid)?;
    }
    let expected = if_match
        .expected(app.store.as_ref(), &layout::daemon_set(id), &describe(id))
        .await?;
    let record = store
        .update(id, expected, &actor, &app.mirror, |current| {
            let (changes, store, labels) = (&changes, &store, &labels);
            async move {
                let next = changes
                    .apply(&current.value)
                    .map_err(|e| ApiError::invalid([e]))?;
                if next != current.value {
                    if let Some(contender) = store.find_contender(&next, labels).await? {
                        return Err(contention_error(&next, &contender));
                    }
                }
                Ok::<_, ApiError>(next)
            }
        })
        .await?;
    let view = applied_view(&app, id, &record).await;
    Ok(([etag(record.index)], ApiJson(view)))
}

/// Deletes a daemon set (only at the `If-Match` version, when given).
///
/// Its pods are not touched here: the DS farm's cleanup removes pods whose daemon set is gone.
/// A stored document that cannot be decoded is deleted too (without an audit record, as
/// there is no daemon set to record).
#[utoipa::path(
    delete,
    path = "/daemonsets/{id}",
    tag = TAG,
    params(
        ("id" = inline(DaemonSetId), Path, description = "Daemon set ID"),
        ("If-Match" = Option<String>, Header, nullable = false, description = "Delete only this version (an ETag)")
    ),
    responses(
        (status = NO_CONTENT, description = "Deleted"),
        (status = BAD_REQUEST, description = "Malformed If-Match", body = ErrorBody),
        (status = NOT_FOUND, description = "No such daemon set", body = ErrorBody),
        (status = CONFLICT, description = "It kept changing for 5 s", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "If-Match is stale", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The ID is not a UUID", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn delete_daemon_set(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(id): ApiPath<DaemonSetId>,
    if_match: IfMatch,
    actor: Actor,
) -> Result<StatusCode, ApiError> {
    let id = id.uuid();
    let expected = if_match
        .expected(app.store.as_ref(), &layout::daemon_set(id), &describe(id))
        .await?;
    app.daemon_sets().delete(id, expected, &actor).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The 409 for `ds`, which would contend with `other` on `nodes` (none named: a selector
/// selects every node or the two are the same), saying how to end it: where the other's
/// selector selects every node, only a change of that one does.
fn contention_error(
    ds: &StoredDaemonSet,
    (other, nodes): &(StoredDaemonSet, BTreeSet<String>),
) -> ApiError {
    let (other_id, selector, pod_id) = (&other.id, &other.node_selector, &other.pod_id);
    let everywhere = |ds: &StoredDaemonSet| selects_every_node(&ds.node_selector);
    let overlap = match (nodes.is_empty(), everywhere(other), everywhere(ds)) {
        (false, _, _) => format!(
            "selects nodes this daemon set would select ({}); change a node selector or \
             those nodes' labels",
            some_of(nodes)
        ),
        (true, true, false) => {
            "its node selector selects every node; change its node selector".to_owned()
        }
        (true, false, true) => "this daemon set's node selector selects every node; change \
                                this one's node selector"
            .to_owned(),
        (true, _, _) => "the two node selectors are the same; change a node selector".to_owned(),
    };
    ApiError::conflict(format!(
        "daemon set {other_id} (node_selector {selector:?}) is enabled for pod {pod_id:?} too, \
         and {overlap}, or store this one with \"disabled\": true"
    ))
}

/// The trees a daemon set's view is made of: its document, what its rollout status counts
/// (the RCs among it, as a pod an enabled RC labels too is not counted), and the farms'
/// conditions (written after the pass that saw the rest change, so a client blocked at an
/// answer's index is woken by them too), and its times: written with the document, but
/// delivered by a watch of their own tree, maybe after it. A read's `X-Index` is what they
/// hold (`reads::mirror_index`), so it claims a change of the document only with its times.
const DS_TREES: [Tree; 10] = [
    Tree::DaemonSets,
    Tree::Rcs,
    Tree::Labels(LabelType::Node),
    Tree::Labels(LabelType::Pod),
    Tree::Intent,
    Tree::Reality,
    Tree::Health,
    Tree::DsStatus,
    Tree::Conditions,
    Tree::Meta,
];

/// What one daemon set's view is made of, within [`DS_TREES`]: a read of it blocked on
/// `?index=` is woken by a change of these, not by every pod's. Every node's labels are
/// among them (the selector may come to match any node, and node labels change seldom).
fn view_spans(id: uuid::Uuid) -> [Span; 6] {
    [
        Span::Prefix(layout::daemon_set(id)),
        Span::Prefix(layout::meta(ObjectKind::Daemonsets, id)),
        Span::Prefix(layout::labels_of_type(LabelType::Node)),
        Span::DaemonSetPods {
            ds_id: id.to_string(),
        },
        Span::Prefix(layout::ds_farm_status(id)),
        Span::Prefix(layout::conditions(ObjectKind::Daemonsets, id)),
    ]
}

/// The trees a listing of daemon sets is made of: their documents, the farms' conditions
/// and their times (its items have no rollout status). The times are written with a
/// document but delivered by a watch of their own tree, maybe after it: the listing claims
/// a document's change only with them.
const LIST_TREES: [Tree; 3] = [Tree::DaemonSets, Tree::Conditions, Tree::Meta];

/// The view of `record` with its rollout status, times and conditions, all read through
/// `kv`, which reads `mirror` when given.
async fn view(
    kv: &Arc<dyn KvStore>,
    mirror: Option<&Mirror>,
    id: uuid::Uuid,
    record: &DaemonSetRecord,
) -> Result<DaemonSet, ApiError> {
    let status = rollout_status(kv, mirror, id, record).await?;
    let meta = read_meta(kv.as_ref(), &layout::meta(ObjectKind::Daemonsets, id)).await?;
    let conditions = read_conditions(kv.as_ref(), ObjectKind::Daemonsets, &id.to_string()).await?;
    Ok(daemon_set(record, Some(status), conditions).with_times(meta))
}

/// The view of a daemon set just written, for the write's answer: from the mirror (which
/// holds this server's own writes at once) unless it cannot be trusted.
async fn current_view(
    app: &AppState,
    id: uuid::Uuid,
    record: &DaemonSetRecord,
) -> Result<DaemonSet, ApiError> {
    view(&current_reader(app), current_mirror(app), id, record).await
}

/// [`current_view`], or, when that cannot be read, the view of what was written without
/// its status ([`read_back`]).
async fn applied_view(app: &AppState, id: uuid::Uuid, record: &DaemonSetRecord) -> DaemonSet {
    read_back("daemon set", current_view(app, id, record), || {
        daemon_set(record, None, Vec::new())
    })
    .await
}

fn daemon_set(
    record: &Versioned<impl Borrow<StoredDaemonSet>>,
    status: Option<DaemonSetStatus>,
    conditions: Vec<Condition>,
) -> DaemonSet {
    let ds: &StoredDaemonSet = record.value.borrow();
    DaemonSet {
        id: ds.id.clone(),
        manifest: ds.manifest.raw().to_owned(),
        node_selector: ds.node_selector.clone(),
        min_health: ds.min_health,
        cluster_name: ds.cluster_name.clone(),
        pod_id: ds.pod_id.clone(),
        timeout: format_timeout(ds.timeout),
        disabled: ds.disabled,
        resource_version: record.index.to_string(),
        status,
        conditions,
        created: None,
        modified: None,
    }
}

/// Counts, now, the nodes a daemon set targets, the nodes it has pods on, and the healthy ones.
/// Its pods are found through the mirror's label index when `kv` reads `mirror`: a daemon
/// set's cost is its pods', not the fleet's.
async fn rollout_status(
    kv: &Arc<dyn KvStore>,
    mirror: Option<&Mirror>,
    id: uuid::Uuid,
    record: &DaemonSetRecord,
) -> Result<DaemonSetStatus, ApiError> {
    let labels = LabelStore::reading(kv.clone(), mirror);
    // Writes keep the selector parsable; one that is not (written by another tool) cannot
    // be acted on by the farm, so it targets nothing.
    let targeted: HashSet<String> = match record.value.node_selector.parse::<Selector>() {
        Ok(selector) => {
            let nodes = labels.matching(LabelType::Node, &selector).await?;
            nodes.into_iter().map(|node| node.id).collect()
        }
        Err(_) => HashSet::new(),
    };
    let owned = Requirement::equals(DS_ID_LABEL, id.to_string()).map_err(ApiError::internal)?;
    let pods = labels
        .matching(LabelType::Pod, &Selector::from_requirements([owned]))
        .await?;
    // Healthy as the farm counts nodes for `min_health`: by the one rule, against what the
    // node is meant to run (its intent, the daemon set's manifest or not yet).
    let health = pod_health(kv, &record.value.pod_id).await?;
    let manifests = PodStore::new(kv.clone());
    let mut counts = HealthCounts::default();
    for (pod, labels) in pods.iter().filter_map(|pod| {
        PodLocation::from_label_id(&pod.id).map(|location| (location, &pod.labels))
    }) {
        // The farm keeps the pod only on the nodes the selector matches now, and leaves a
        // pod whose labels name an enabled RC too to the RC.
        if pod.pod_id() != record.value.pod_id
            || !targeted.contains(pod.node())
            || names_enabled_rc(kv, labels).await?
        {
            continue;
        }
        let Some(intent) = manifests.get(PodTree::Intent, &pod).await? else {
            counts.add(PodHealth::NotReal);
            continue;
        };
        let running = manifests
            .get(PodTree::Reality, &pod)
            .await?
            .map(|entry| entry.manifest.sha());
        let result = health.get(pod.node()).copied();
        counts.add(PodHealth::of(
            &intent.manifest.sha(),
            running.as_deref(),
            result,
        ));
    }
    let farm = DaemonSetStore::new(kv.clone()).farm_status(id).await?;
    Ok(DaemonSetStatus {
        nodes_targeted: targeted.len(),
        nodes_scheduled: pods.len(),
        nodes_healthy: counts.healthy as usize,
        farm,
    })
}

/// Whether `labels` name an RC that is stored enabled, as the farm tells a pod an RC holds
/// (an RC that cannot be read runs nowhere, so it holds nothing).
async fn names_enabled_rc(kv: &Arc<dyn KvStore>, labels: &Labels) -> Result<bool, ApiError> {
    let Some(rc_id) = labels
        .get(RC_ID_LABEL)
        .filter(|id| uuid::Uuid::parse_str(id).is_ok())
    else {
        return Ok(false);
    };
    match RcStore::new(kv.clone()).get(rc_id).await {
        Ok(rc) => Ok(rc.is_some_and(|rc| !rc.value.disabled)),
        Err(StoreError::Invalid(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Every health result of one pod ID, by node (the record's `Node` field, as P2 keys them).
async fn pod_health(
    kv: &Arc<dyn KvStore>,
    pod_id: &str,
) -> StoreResult<HashMap<String, HealthState>> {
    if segment_problem(pod_id).is_some() {
        return Ok(HashMap::new());
    }
    let (_, by_node) = HealthStore::new(kv.clone()).list_for_pod(pod_id).await?;
    Ok(by_node
        .into_iter()
        .map(|(node, entry)| (node, entry.state()))
        .collect())
}
