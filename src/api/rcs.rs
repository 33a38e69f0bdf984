//! Replication controllers over HTTP: create, list, read (with status), patch and delete.
//!
//! Stored documents keep P2's exact shape (`crate::model::StoredRc`); what clients see is
//! [`RcView`], which adds the RC's own labels, its `resource_version` and a status read from
//! the pod labels the RC farm writes, and the conditions the leader's RC farm computed. List
//! items carry the status too, so a dashboard needs
//! one request; that is why a list's `X-Index` also follows the pod label tree (and the
//! conditions', which a list shows too).

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{OriginalUri, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::{combined_index, error_at, index_header};
use crate::api::extract::{ApiJson, ApiPath, ApiQuery, MergePatch, NoQuery};
use crate::api::list_query::{ListParams, ListQuery};
use crate::api::paging::Page;
use crate::api::preconditions::{etag, IfMatch};
use crate::api::reads::{
    block_on_store, current_mirror, mirror_index, source, ConsistentFilter, ReadParams, ReadQuery,
    Source,
};
use crate::api::responses::{created, read_back};
use crate::app::AppState;
use crate::error::{ApiError, ErrorBody};
use crate::kv::{KvStore, StoreError, TxnOp};
use crate::labels::{LabelType, Labels, Requirement, Selector, RC_ID_LABEL};
use crate::layout;
use crate::model::conditions::Condition;
use crate::model::event::{Actor, Meta, ObjectKind};
use crate::model::{NewRc, RcId, RcPatch, RcPatchDocument, RcSpec, StoredRc};
use crate::state::{Mirror, MirrorReader, Span, Tree};
use crate::store::conditions::{mirrored, read_conditions, ConditionStore};
use crate::store::events::{list_meta, mirrored_meta, read_meta};
use crate::store::labels::LabelStore;
use crate::store::rcs::{self, RcRecord, RcStore};
use crate::store::rolls::{Naming, RollStore};
use crate::store::update::{update_from_mirror, update_with_retry};
use crate::store::Versioned;

/// OpenAPI tag of the RC routes.
pub const TAG: &str = "replication_controllers";

/// P2's store retries an id collision this many times.
const MAX_CREATE_ATTEMPTS: usize = 3;

/// An RC as clients see it: the stored document plus its labels, version and status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RcView {
    /// A UUID assigned on creation: time-ordered (v7) when this server makes it, v4 when
    /// P2's tools do.
    pub id: String,
    /// The pod manifest as stored: YAML text, byte for byte.
    pub manifest: String,
    /// Which nodes the RC may schedule on; `""` selects every node.
    pub node_selector: String,
    /// Labels put on every pod the RC schedules.
    #[schema(value_type = BTreeMap<String, String>)]
    pub pod_labels: Labels,
    /// How many pods the RC wants.
    pub replicas_desired: i64,
    /// A disabled RC makes no scheduling changes.
    pub disabled: bool,
    /// `dynamic_strategy`, `static_strategy` or `""`.
    pub allocation_strategy: String,
    /// The RC's own labels (type `replication_controller`).
    #[schema(value_type = BTreeMap<String, String>)]
    pub labels: Labels,
    /// The stored document's modify index; also the `ETag` and the `If-Match` to send.
    pub resource_version: String,
    /// What the RC farm has done so far, from the pod labels.
    pub status: RcStatus,
    /// `Ready`, `Progressing` and `Degraded`, as the leader's RC farm last computed them;
    /// empty until a leader's farm has looked at the RC (or when another farm owns it).
    #[serde(default)]
    #[schema(required = true)]
    pub conditions: Vec<Condition>,
    /// When the RC was created through this server; `null` for one another tool created.
    #[schema(format = DateTime, required = true)]
    pub created: Option<String>,
    /// When its document last changed through this server (the API or a roll); `null`
    /// for one another tool created and this server never changed.
    #[schema(format = DateTime, required = true)]
    pub modified: Option<String>,
}

/// Where an RC's pods are, as the pod labels say (`replication_controller_id=<id>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RcStatus {
    /// How many pods carry the RC's id.
    pub current_replicas: usize,
    /// The nodes they are on, sorted.
    pub nodes: Vec<String>,
}

impl RcView {
    /// The view of `record` (owned, or shared with the mirror) with its labels and the pod
    /// labels that name it.
    pub fn new(
        record: &Versioned<impl Borrow<StoredRc>>,
        labels: Labels,
        status: RcStatus,
        conditions: Vec<Condition>,
    ) -> Self {
        let rc: &StoredRc = record.value.borrow();
        RcView {
            id: rc.id.clone(),
            manifest: rc.manifest.raw().to_owned(),
            node_selector: rc.node_selector.clone(),
            pod_labels: rc.pod_labels.clone().unwrap_or_default(),
            replicas_desired: rc.replicas_desired,
            disabled: rc.disabled,
            allocation_strategy: rc.allocation_strategy.to_string(),
            labels,
            resource_version: record.index.to_string(),
            status,
            conditions,
            created: None,
            modified: None,
        }
    }

    /// The view with the times kept beside the RC.
    pub fn with_times(self, meta: Option<Meta>) -> Self {
        let (created, modified) = Meta::times(meta);
        RcView {
            created,
            modified,
            ..self
        }
    }
}

impl RcStatus {
    /// The status of the RC whose pods (label ids `<node>/<pod_id>`) are `pods`.
    fn from_pods<'a>(pods: impl IntoIterator<Item = &'a str>) -> Self {
        let mut nodes: Vec<String> = pods
            .into_iter()
            .map(|id| id.split_once('/').map_or(id, |(node, _)| node).to_owned())
            .collect();
        let current_replicas = nodes.len();
        nodes.sort();
        nodes.dedup();
        RcStatus {
            current_replicas,
            nodes,
        }
    }

    /// The status the mirror holds for RC `id`.
    fn mirrored(mirror: &Mirror, id: &str) -> Self {
        Self::from_pods(mirror.pods_of_rc(id).iter().map(String::as_str))
    }
}

/// The trees an RC's view is made of: its document, its labels, the pod labels its
/// status counts and the farms' conditions (written after the pass that saw the pods
/// change, so a client blocked at an answer's index is woken by them too). A write's
/// answer claims what they hold (`reads::mirror_index`); a read's, [`VIEW_TREES`].
const RC_TREES: [Tree; 4] = [
    Tree::Rcs,
    Tree::Labels(LabelType::ReplicationController),
    Tree::Labels(LabelType::Pod),
    Tree::Conditions,
];

/// Every tree an RC's view reads: [`RC_TREES`] and the times kept beside it. A kept answer
/// stands while none of them changes. The times are written with the RC, but a watch
/// delivers them on their own tree, maybe after the RC's: a read of one RC, or of the list,
/// is made of them too, so that its `X-Index` claims an RC's change only with the times
/// written with it.
const VIEW_TREES: [Tree; 5] = [
    Tree::Rcs,
    Tree::Labels(LabelType::ReplicationController),
    Tree::Labels(LabelType::Pod),
    Tree::Conditions,
    Tree::Meta,
];

/// The RC routes.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_rcs, create_rc))
        .routes(routes!(get_rc, patch_rc, delete_rc))
}

/// Query parameters of an RC deletion.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteRcParams {
    /// Delete even while `replicas_desired` is not 0 (the pods stay where they are).
    #[serde(default)]
    pub force: bool,
}

/// Path parameter naming one RC.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RcPath {
    /// The RC's id.
    #[param(inline)]
    pub id: RcId,
}

/// Creates an RC and its labels in one transaction.
///
/// `pod_id=<manifest id>` is added to the RC's labels; `availability_zone` and
/// `cluster_name`, when given, are added to `pod_labels`.
#[utoipa::path(
    post,
    path = "/rcs",
    tag = TAG,
    request_body = RcSpec,
    responses(
        (status = CREATED, description = "The new RC", body = RcView,
            headers(("ETag" = String, description = "The RC's version"),
                    ("Location" = String, description = "Where the RC lives"))),
        (status = BAD_REQUEST, description = "Malformed JSON", body = ErrorBody),
        (status = CONFLICT, description = "Another write to the new RC's id or its labels landed first, attempt after attempt; nothing was written", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "Not JSON", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Invalid fields, all listed", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody),
    )
)]
async fn create_rc(
    State(app): State<AppState>,
    _: NoQuery,
    actor: Actor,
    ApiJson(spec): ApiJson<RcSpec>,
) -> Result<Response, ApiError> {
    let NewRc { mut rc, labels } = spec.validate(&app.validation).map_err(ApiError::invalid)?;
    let store = app.rcs();
    let mut attempt = 1;
    let record = loop {
        match store.create(rc.clone(), &labels, &actor).await {
            Ok(Ok(record)) => break record,
            Ok(Err(too_large)) => return Err(ApiError::invalid([too_large])),
            Err(StoreError::Conflict { .. }) if attempt < MAX_CREATE_ATTEMPTS => {
                attempt += 1;
                rc.id = RcId::generate().to_string();
            }
            Err(e) => return Err(e.into()),
        }
    };
    let (view, _) = applied_view(&app, &record, || labels).await;
    created(
        &format!("/api/v1/rcs/{}", record.value.id),
        record.index,
        view,
    )
}

/// Lists RCs, with their labels and status, sorted by id.
///
/// `selector` matches the RC's own labels, e.g. `pod_id=hello`. Blocks with `?index=&wait=`
/// until an RC, its times, an RC label, a pod label or a condition changes. Served from
/// the server's mirror of the store unless `?consistent=true` (see `X-Index`).
#[utoipa::path(
    get,
    path = "/rcs",
    tag = TAG,
    params(ListParams, ConsistentFilter),
    responses(
        (status = OK, description = "One page of RCs", body = Page<RcView>,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Bad selector, limit, token or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody),
    )
)]
async fn list_rcs(
    State(app): State<AppState>,
    OriginalUri(target): OriginalUri,
    query: ListQuery<ConsistentFilter>,
) -> Result<Response, ApiError> {
    let blocking = match source(
        &app,
        &VIEW_TREES,
        &[],
        query.filter.consistent(),
        query.blocking,
    )
    .await
    {
        Source::Mirror(mirror) => {
            let build = || async { Ok(mirrored_list(mirror, &query)) };
            return app
                .answers
                .get_or_build(mirror, &VIEW_TREES, &target, query.blocking, build)
                .await;
        }
        Source::Store(blocking) => blocking,
    };
    let claimed = block_on_store(&app, &VIEW_TREES, &[], blocking).await?;

    let kv: Arc<dyn KvStore> = app.store_reads.clone();
    // Taken before anything is read, as in `get_rc`.
    let index = combined_index(kv.as_ref(), &claimed).await?;
    let label_store = LabelStore::new(kv.clone());
    let (_, records) = RcStore::new(kv.clone()).list().await?;
    let (_, rc_labels) = label_store.list(LabelType::ReplicationController).await?;
    let (_, pods) = label_store.list(LabelType::Pod).await?;
    let mut times = list_meta(kv.as_ref(), ObjectKind::Rcs).await?;
    let mut conditions = ConditionStore::new(kv).list(ObjectKind::Rcs).await?;

    let mut labels_by_rc: BTreeMap<String, Labels> = rc_labels
        .into_iter()
        .map(|labeled| (labeled.id, labeled.labels))
        .collect();
    let mut pods_by_rc: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for pod in &pods {
        if let Some(rc_id) = pod.labels.get(RC_ID_LABEL) {
            pods_by_rc.entry(rc_id).or_default().push(&pod.id);
        }
    }
    let items = records
        .iter()
        .filter_map(|record| {
            let labels = labels_by_rc.remove(&record.value.id).unwrap_or_default();
            query.selector.matches(&labels).then(|| {
                let pods = pods_by_rc.get(record.value.id.as_str());
                let status = RcStatus::from_pods(pods.into_iter().flatten().copied());
                let conditions = conditions.remove(&record.value.id).flatten();
                let conditions = conditions.map(|r| r.conditions).unwrap_or_default();
                RcView::new(record, labels, status, conditions)
                    .with_times(times.remove(&record.value.id))
            })
        })
        .collect();
    let page = query.paging.page(items, |view: &RcView| &view.id);
    Ok(([index_header(index)], ApiJson(page)).into_response())
}

/// One RC with its labels and status.
///
/// Served from the server's mirror of the store unless `?consistent=true` (see `X-Index`).
/// Blocks with `?index=&wait=` until the RC, its labels, its pods' labels or its conditions
/// change.
#[utoipa::path(
    get,
    path = "/rcs/{id}",
    tag = TAG,
    params(RcPath, ReadParams),
    responses(
        (status = OK, description = "The RC", body = RcView,
            headers(("ETag" = String, description = "The RC's version"),
                    ("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = NOT_FOUND, description = "No such RC", body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for the RC to come back"))),
        (status = UNPROCESSABLE_ENTITY, description = "The id is not a UUID, or a bad index or wait", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The stored RC cannot be decoded (reason `UnreadableDocument`); DELETE removes it", body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for it to be mended"))),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody),
    )
)]
async fn get_rc(
    State(app): State<AppState>,
    OriginalUri(target): OriginalUri,
    query: ReadQuery,
    ApiPath(RcPath { id }): ApiPath<RcPath>,
) -> Result<Response, ApiError> {
    let id = id.to_string();
    let spans = view_spans(&id);
    let blocking = match source(&app, &VIEW_TREES, &spans, query.consistent, query.blocking).await {
        Source::Mirror(mirror) => {
            let build = || async {
                let index = mirror_index(mirror, &VIEW_TREES);
                let Some(entry) = mirror.get(&layout::rc(&id)) else {
                    return Ok(error_at(no_such_rc(&id), index));
                };
                let record = match rcs::from_entry(&entry) {
                    Ok(record) => record,
                    Err(why) => {
                        let unreadable = unreadable_rc(&id, &rcs::unreadable(&id, &why));
                        return Ok(error_at(unreadable, index));
                    }
                };
                Ok(answer(&record, mirrored_view(mirror, &record), index))
            };
            return app
                .answers
                .get_or_build(mirror, &VIEW_TREES, &target, query.blocking, build)
                .await;
        }
        Source::Store(blocking) => blocking,
    };
    // Held until the RC's view changes, as a read from the mirror is.
    let claimed = block_on_store(&app, &VIEW_TREES, &spans, blocking).await?;
    let kv: Arc<dyn KvStore> = app.store_reads.clone();
    // Taken before anything is read: a change landing between the reads is in the answer
    // or above its index, so a client blocking at it misses nothing.
    let index = combined_index(kv.as_ref(), &claimed).await?;
    let record = match read(&RcStore::new(kv.clone()), &id).await {
        Err(e) if e.tells_what_is_stored() => return Ok(error_at(e, index)),
        record => record?,
    };
    let view = stored_view(&kv, &record).await?;
    Ok(answer(&record, view, index))
}

/// Changes an RC with a JSON merge patch of `replicas_desired`, `disabled`,
/// `node_selector`, `pod_labels` (a `null` value removes a key), `manifest` (same pod id)
/// and `allocation_strategy`.
///
/// With `If-Match` the patch applies only to that version; without it, a patch that loses to
/// a concurrent write is re-applied to the newer version, for up to 5 s. Refused while a roll
/// names the RC (as its old or new RC) or someone holds the RC's mutation lock, and while a
/// stored roll that cannot be decoded may name it.
#[utoipa::path(
    patch,
    path = "/rcs/{id}",
    tag = TAG,
    params(RcPath, ("If-Match" = Option<String>, Header, nullable = false, description = "Apply only to this version (an `ETag`)")),
    request_body(description = "A JSON merge patch",
        content((RcPatchDocument = "application/merge-patch+json"), (RcPatchDocument = "application/json"))),
    responses(
        (status = OK, description = "The patched RC", body = RcView,
            headers(("ETag" = String, description = "The RC's new version"),
                    ("X-Index" = u64, description = "The index the answer reflects: what the mirror has read, which may be below the RC's new version"))),
        (status = BAD_REQUEST, description = "Malformed JSON or If-Match", body = ErrorBody),
        (status = NOT_FOUND, description = "No such RC", body = ErrorBody),
        (status = CONFLICT, description = "A roll names the RC, someone holds its mutation lock, or it kept changing for 5 s", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The RC changed since the If-Match version", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "Not a JSON merge patch", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Invalid, read-only or unknown fields, all listed", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The stored RC cannot be decoded, or a stored roll that cannot be decoded may name it (reason `UnreadableDocument`); DELETE of that RC or roll removes it", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody),
    )
)]
async fn patch_rc(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(RcPath { id }): ApiPath<RcPath>,
    if_match: IfMatch,
    actor: Actor,
    MergePatch(patch): MergePatch,
) -> Result<Response, ApiError> {
    let id = id.to_string();
    let patch = RcPatch::parse(patch, &app.validation).map_err(ApiError::invalid)?;
    let expected = if_match
        .expected(app.store.as_ref(), &layout::rc(&id), &describe(&id))
        .await?;
    let store = app.rcs();
    let (state, store, id, patch, actor) = (&app, &store, &id, &patch, &actor);
    let record = update_from_mirror(
        &describe(id),
        expected,
        || mirrored_record(state, id),
        || read(store, id),
        |record| async move {
            let mut with = unclaimed(state, id, record.index).await?;
            let mut rc = record.value.clone();
            patch.apply(&mut rc).map_err(|e| ApiError::invalid([e]))?;
            if rc == record.value {
                let key = layout::rc(id);
                return Ok(record.confirmed(state.store.as_ref(), &key).await);
            }
            let recorded = store
                .updated_ops(&record.value, record.index, &rc, actor, &state.mirror)
                .await?;
            with.extend(recorded);
            match store.write(rc, record.index, with).await {
                Ok(Ok(written)) => Ok(Ok(written)),
                Ok(Err(too_large)) => Err(ApiError::invalid([too_large])),
                Err(e) => Ok(Err(e)),
            }
        },
    )
    .await?;
    let (view, index) = applied_view(&app, &record, || {
        app.mirror
            .labels_of(LabelType::ReplicationController, id)
            .unwrap_or_default()
    })
    .await;
    Ok(answer(&record, view, index))
}

/// Deletes an RC and its labels in one transaction; its pods stay where they are.
///
/// Refused while `replicas_desired` is not 0 unless `?force=true`, and (even with
/// `?force=true`) while a roll names the RC or someone holds the RC's mutation lock, and
/// while a stored roll that cannot be decoded may name it. An RC whose stored document
/// cannot be decoded is deleted whatever its replica count: no farm can run it.
#[utoipa::path(
    delete,
    path = "/rcs/{id}",
    tag = TAG,
    params(RcPath, DeleteRcParams, ("If-Match" = Option<String>, Header, nullable = false, description = "Delete only this version (an `ETag`)")),
    responses(
        (status = NO_CONTENT, description = "Deleted"),
        (status = BAD_REQUEST, description = "Malformed query or If-Match", body = ErrorBody),
        (status = NOT_FOUND, description = "No such RC", body = ErrorBody),
        (status = CONFLICT, description = "Replicas still desired, a roll names the RC, someone holds its mutation lock, or it kept changing for 5 s", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The RC changed since the If-Match version", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The id is not a UUID", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "A stored roll that cannot be decoded may name the RC (reason `UnreadableDocument`); DELETE of that roll removes it", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody),
    )
)]
async fn delete_rc(
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<DeleteRcParams>,
    ApiPath(RcPath { id }): ApiPath<RcPath>,
    if_match: IfMatch,
    actor: Actor,
) -> Result<StatusCode, ApiError> {
    let id = id.to_string();
    let expected = if_match
        .expected(app.store.as_ref(), &layout::rc(&id), &describe(&id))
        .await?;
    let store = app.rcs();
    let (state, store, id, actor) = (&app, &store, &id, &actor);
    let read = || async move {
        match store.get(id).await {
            Ok(Some(record)) => Ok(record.map(Some)),
            Ok(None) => Err(ApiError::not_found(format!(
                "no replication controller {id}"
            ))),
            // No farm can run an RC it cannot read, so its replica count protects nothing.
            Err(StoreError::Invalid(why)) => unreadable_version(state, id, &why).await,
            Err(e) => Err(e.into()),
        }
    };
    let write = |current: Versioned<Option<StoredRc>>| async move {
        let mut ops = unclaimed(state, id, current.index).await?;
        // P2 refuses any count but 0: its store writes negative ones too.
        if let Some(rc) = current.value.as_ref().filter(|rc| rc.replicas_desired != 0) {
            if !params.force {
                return Err(ApiError::conflict(format!(
                    "replication controller {id} still wants {} replicas; set \
                     replicas_desired to 0 first or delete with ?force=true",
                    rc.replicas_desired
                )));
            }
        }
        ops.extend(RcStore::delete_ops(id, current.index));
        ops.extend(store.deleted_ops(id, current.value.as_ref(), actor).await?);
        Ok(state.store.txn(&ops).await.map(drop))
    };
    update_with_retry(&describe(id), expected, read, write).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The RC or 404. A stored document that cannot be decoded is no fault of the client's,
/// hence 500 `UnreadableDocument` (rather than the store's 422), saying how to clear it.
async fn read(store: &RcStore, id: &str) -> Result<RcRecord, ApiError> {
    match store.get(id).await {
        Ok(Some(record)) => Ok(record),
        Ok(None) => Err(no_such_rc(id)),
        Err(StoreError::Invalid(why)) => Err(unreadable_rc(id, &why)),
        Err(e) => Err(e.into()),
    }
}

fn no_such_rc(id: &str) -> ApiError {
    ApiError::not_found(format!("no replication controller {id}"))
}

/// 500 `UnreadableDocument` for the RC `id` that cannot be decoded (`why`).
fn unreadable_rc(id: &str, why: &str) -> ApiError {
    ApiError::unreadable(format!("{why}; DELETE /api/v1/rcs/{id} removes it"))
}

/// What one RC's view is made of, within [`VIEW_TREES`]: a read of it blocked on `?index=`
/// is woken by a change of these, not by every change of the fleet.
fn view_spans(id: &str) -> [Span; 5] {
    [
        Span::Prefix(layout::rc(id)),
        Span::Prefix(layout::meta(ObjectKind::Rcs, id)),
        Span::Prefix(layout::labels(LabelType::ReplicationController, id)),
        Span::Labelled {
            label_type: LabelType::Pod,
            label: RC_ID_LABEL.to_owned(),
            value: id.to_owned(),
        },
        Span::Prefix(layout::conditions(ObjectKind::Rcs, id)),
    ]
}

/// The version of an RC document that cannot be decoded, so that it can still be deleted.
async fn unreadable_version(
    app: &AppState,
    id: &str,
    why: &str,
) -> Result<Versioned<Option<StoredRc>>, ApiError> {
    let Some(pair) = app.store.get(&layout::rc(id)).await? else {
        return Err(ApiError::not_found(format!(
            "no replication controller {id}"
        )));
    };
    tracing::warn!(rc = %id, error = %why, "deleting an RC whose document cannot be decoded");
    Ok(Versioned {
        value: None,
        index: pair.modify_index,
    })
}

/// How errors name an RC.
fn describe(id: &str) -> String {
    format!("replication controller {id}")
}

/// The txn ops that keep a write to the RC at `version` atomic with "no roll has it as its
/// new RC or its old one, and nobody holds its mutation lock", or 409 naming the roll that
/// names it (as old or new RC, whether or not a farm runs the roll right now) or else the
/// session holding the lock. A stored roll that cannot be decoded but may name it as its old
/// one (only its bytes can tell) refuses the write too, with 500 `UnreadableDocument` naming
/// the roll to delete, rather than leave a roll over an RC that is gone or changed.
///
/// The rolls and the lock are read from the mirror (from the store while it is unhealthy):
/// a roll naming the RC as its new one, and the lock, are checked again inside the write's
/// transaction, and a refusal is confirmed by the store, so a mirror behind the store
/// refuses nothing it should not. A roll naming the RC as its old one has no key derived
/// from the RC; its creation writes the old RC again instead (`RollCreator`), moving the
/// version the write is check-and-set on, so a roll created after these checks fails the
/// write, whose next attempt finds the roll. One created before `version` is looked for in
/// the store unless the mirror holds every roll change up to `version`, which the store's
/// index of the rolls through `version` tells when the RC's version cannot (from memory on
/// the embedded store).
async fn unclaimed(app: &AppState, id: &str, version: u64) -> Result<Vec<TxnOp>, ApiError> {
    if let Some(mirror) = current_mirror(app) {
        // Taken before the checks read the mirror, which holds at least as much by then.
        let rolls_complete = mirror.versions(&[Tree::Rolls])[0].complete;
        let reader = Arc::new(MirrorReader::new(mirror.clone()));
        if let Ok(ops) = claim_checks(reader, id).await? {
            if rolls_complete >= version
                || app
                    .store
                    .prefix_index_through(layout::ROLLS, version)
                    .await?
                    <= rolls_complete
            {
                return Ok(ops);
            }
            return match RollStore::new(app.store.clone()).naming_as_old(id).await? {
                None => Ok(ops),
                Some(naming) => Err(named_by(id, naming)),
            };
        }
    }
    claim_checks(app.store.clone(), id).await?
}

/// The 409 for a write to the RC `id` that `holder` holds.
fn claimed(id: &str, holder: &str) -> ApiError {
    ApiError::conflict(format!(
        "replication controller {id} cannot be changed now: {holder}"
    ))
}

/// The refusal of a write to the RC `id` that the roll `naming` names, or may name.
fn named_by(id: &str, naming: Naming) -> ApiError {
    match naming {
        Naming::Roll(roll) => claimed(
            id,
            &format!(
                "roll {roll} names it; wait for the roll to finish or cancel it with \
                 DELETE /api/v1/rolls/{roll}"
            ),
        ),
        Naming::Unreadable { id: roll, why } => ApiError::unreadable(format!(
            "stored roll {roll} is unreadable: {why}; it may name replication controller \
             {id} as its old one, which is not changed while the roll is stored; \
             DELETE /api/v1/rolls/{roll} removes it"
        )),
    }
}

/// [`unclaimed`] as `kv` shows it: the ops, or the refusal.
async fn claim_checks(
    kv: Arc<dyn KvStore>,
    id: &str,
) -> Result<Result<Vec<TxnOp>, ApiError>, ApiError> {
    if let Some(naming) = RollStore::new(kv.clone()).naming(id).await? {
        return Ok(Err(named_by(id, naming)));
    }
    Ok(match RcStore::new(kv).mutation_guard(id).await? {
        Ok(guard) => Ok(vec![guard, RollStore::absent_op(id)]),
        Err(session) => Err(claimed(
            id,
            &format!(
                "session {session} holds its mutation lock (a node transfer or another \
                 tool); retry later"
            ),
        )),
    })
}

/// The page of RCs `query` asks for, as the mirror holds them.
fn mirrored_list(mirror: &Mirror, query: &ListQuery<ConsistentFilter>) -> Response {
    let index = mirror_index(mirror, &VIEW_TREES);
    let items = mirror
        .entries(Tree::Rcs)
        .values()
        .filter_map(|entry| {
            let record = rcs::from_entry(entry)
                .map_err(|e| tracing::debug!(key = %entry.pair.key, error = %e, "skipping unreadable RC"))
                .ok()?;
            let id = &record.value.id;
            let selected =
                mirror.labels_match(LabelType::ReplicationController, id, &query.selector);
            selected.then(|| mirrored_view(mirror, &record))
        })
        .collect();
    let page = query.paging.page(items, |view: &RcView| &view.id);
    ([index_header(index)], ApiJson(page)).into_response()
}

/// The RC as the mirror holds it, when it can be trusted and holds the RC. Nothing is
/// waited for: the write checks the version it starts from.
async fn mirrored_record(app: &AppState, id: &str) -> Option<RcRecord> {
    let entry = current_mirror(app)?.get(&layout::rc(id))?;
    let record = rcs::from_entry(&entry).ok()?;
    Some(Versioned {
        value: StoredRc::clone(&record.value),
        index: record.index,
    })
}

/// The view of an RC just written (or found unchanged by a write), and the index it
/// reflects, for the write's answer: from the mirror once it holds the RC at least at
/// `record`'s version, which it does at once for this server's own writes, so that the
/// answer costs the store nothing (at the index the mirror's watches have listed, which may
/// not claim the write yet); from the store while the mirror cannot be trusted or lags (a
/// patch that changed nothing, of an RC last written through another server).
async fn written_view(app: &AppState, record: &RcRecord) -> Result<(RcView, u64), ApiError> {
    if let Some(mirror) = current_mirror(app) {
        let index = mirror_index(mirror, &RC_TREES);
        let held = mirror.get(&layout::rc(&record.value.id));
        if held.is_some_and(|entry| entry.pair.modify_index >= record.index) {
            return Ok((mirrored_view(mirror, record), index));
        }
    }
    // The index of the trees, as from the mirror.
    let index = combined_index(app.store.as_ref(), &RC_TREES.map(|tree| tree.prefix())).await?;
    Ok((stored_view(&app.store, record).await?, index))
}

/// [`written_view`], or, when that cannot be read, the view of what was written with
/// `labels` (and no status) at the write's index ([`read_back`]).
async fn applied_view(
    app: &AppState,
    record: &RcRecord,
    labels: impl FnOnce() -> Labels,
) -> (RcView, u64) {
    read_back("RC", written_view(app, record), || {
        let view = RcView::new(record, labels(), RcStatus::default(), Vec::new());
        (view, record.index)
    })
    .await
}

/// The view of `record` with its labels, status, conditions and times as the mirror holds
/// them.
fn mirrored_view(mirror: &Mirror, record: &Versioned<impl Borrow<StoredRc>>) -> RcView {
    let id = &record.value.borrow().id;
    let labels = mirror
        .labels_of(LabelType::ReplicationController, id)
        .unwrap_or_default();
    let status = RcStatus::mirrored(mirror, id);
    let conditions = mirrored(mirror, ObjectKind::Rcs, id);
    let meta = mirrored_meta(mirror, ObjectKind::Rcs, id);
    RcView::new(record, labels, status, conditions).with_times(meta)
}

/// The view of `record` with its labels, status, conditions and times read from the store
/// through `kv`.
async fn stored_view(kv: &Arc<dyn KvStore>, record: &RcRecord) -> Result<RcView, ApiError> {
    let id = &record.value.id;
    let label_store = LabelStore::new(kv.clone());
    let labels = label_store
        .get(LabelType::ReplicationController, id)
        .await?;
    let owned = Requirement::equals(RC_ID_LABEL, id.as_str()).map_err(ApiError::internal)?;
    let (_, pods) = label_store
        .select(LabelType::Pod, &Selector::from_requirements([owned]))
        .await?;
    let status = RcStatus::from_pods(pods.iter().map(|pod| pod.id.as_str()));
    let conditions = read_conditions(kv.as_ref(), ObjectKind::Rcs, id).await?;
    let meta = read_meta(kv.as_ref(), &layout::meta(ObjectKind::Rcs, id)).await?;
    Ok(RcView::new(record, labels.value, status, conditions).with_times(meta))
}

/// The RC's view with its `ETag` and the `X-Index` it reflects.
fn answer(record: &Versioned<impl Borrow<StoredRc>>, view: RcView, index: u64) -> Response {
    ([etag(record.index), index_header(index)], ApiJson(view)).into_response()
}
