//! Replication controllers over HTTP: create, list, read (with status), patch and delete.
//!
//! Stored documents keep P2's exact shape (`crate::model::StoredRc`); what clients see is
//! [`RcView`], which adds the RC's own labels, its `resource_version` and a status read from
//! the pod labels the RC farm writes. List items carry the status too, so a dashboard needs
//! one request; that is why a list's `X-Index` also follows the pod label tree.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::index_header;
use crate::api::extract::{ApiJson, ApiPath, ApiQuery, MergePatch, NoQuery};
use crate::api::list_query::{ListParams, ListQuery};
use crate::api::paging::Page;
use crate::api::preconditions::{etag, stale, IfMatch};
use crate::api::responses::created;
use crate::app::AppState;
use crate::error::{ApiError, ErrorBody};
use crate::kv::{StoreError, TxnOp};
use crate::labels::{LabelType, Labeled, Labels, Requirement, Selector, RC_ID_LABEL};
use crate::model::{NewRc, RcId, RcPatch, RcSpec};
use crate::store::layout;
use crate::store::rcs::{RcRecord, RcStore};
use crate::store::rolls::RollStore;

/// OpenAPI tag of the RC routes.
pub const TAG: &str = "replication_controllers";

/// How often a write is re-applied to a newer version before the server gives up; each miss
/// means another writer landed, so this only runs out under extreme contention.
const MAX_WRITE_ATTEMPTS: usize = 64;

/// P2's store retries an id collision this many times.
const MAX_CREATE_ATTEMPTS: usize = 3;

/// An RC as clients see it: the stored document plus its labels, version and status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RcView {
    /// UUID v4, assigned on creation.
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
    /// The view of `record` with its labels and the pod labels that name it.
    pub fn new(record: &RcRecord, labels: Labels, status: RcStatus) -> Self {
        let rc = &record.rc;
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
        }
    }
}

impl RcStatus {
    /// The status of the RC that `pods` (pod label entries) belong to.
    fn from_pods<'a>(pods: impl IntoIterator<Item = &'a Labeled>) -> Self {
        let mut nodes: Vec<String> = pods
            .into_iter()
            .map(|pod| {
                pod.id
                    .split_once('/')
                    .map_or(&*pod.id, |(node, _)| node)
                    .to_owned()
            })
            .collect();
        let current_replicas = nodes.len();
        nodes.sort();
        nodes.dedup();
        RcStatus {
            current_replicas,
            nodes,
        }
    }
}

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
    /// Delete even while `replicas_desired` is above 0 (the pods stay where they are).
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
        (status = PAYLOAD_TOO_LARGE, description = "Body over 1 MiB", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "Not JSON", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Invalid fields, all listed", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody),
    )
)]
async fn create_rc(
    State(app): State<AppState>,
    _: NoQuery,
    ApiJson(spec): ApiJson<RcSpec>,
) -> Result<Response, ApiError> {
    let NewRc { mut rc, labels } = spec.validate(&app.validation).map_err(ApiError::invalid)?;
    let store = app.rcs();
    let mut attempt = 1;
    let record = loop {
        match store.create(rc.clone(), &labels).await {
            Ok(record) => break record,
            Err(StoreError::Conflict { .. }) if attempt < MAX_CREATE_ATTEMPTS => {
                attempt += 1;
                rc.id = uuid::Uuid::new_v4().to_string();
            }
            Err(e) => return Err(e.into()),
        }
    };
    let view = RcView::new(&record, labels, RcStatus::default());
    created(&format!("/api/v1/rcs/{}", record.rc.id), record.index, view)
}

/// Lists RCs, with their labels and status, sorted by id.
///
/// `selector` matches the RC's own labels, e.g. `pod_id=hello`. Blocks with `?index=&wait=` until an RC, an RC label or a pod label changes.
#[utoipa::path(
    get,
    path = "/rcs",
    tag = TAG,
    params(ListParams),
    responses(
        (status = OK, description = "One page of RCs", body = Page<RcView>,
            headers(("X-Index" = u64, description = "Pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Bad selector, limit, token or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody),
    )
)]
async fn list_rcs(State(app): State<AppState>, query: ListQuery) -> Result<Response, ApiError> {
    let prefixes = [
        layout::RCS.to_owned(),
        LabelType::ReplicationController.key_prefix(),
        LabelType::Pod.key_prefix(),
    ];
    query.blocking.block(&app, &prefixes).await?;

    let store = app.rcs();
    let label_store = app.labels();
    let (rcs_index, records) = store.list().await?;
    let (labels_index, rc_labels) = label_store.list(LabelType::ReplicationController).await?;
    let (pods_index, pods) = label_store.list(LabelType::Pod).await?;

    let mut labels_by_rc: BTreeMap<String, Labels> = rc_labels
        .into_iter()
        .map(|labeled| (labeled.id, labeled.labels))
        .collect();
    let mut pods_by_rc: BTreeMap<&str, Vec<&Labeled>> = BTreeMap::new();
    for pod in &pods {
        if let Some(rc_id) = pod.labels.get(RC_ID_LABEL) {
            pods_by_rc.entry(rc_id).or_default().push(pod);
        }
    }
    let items = records
        .iter()
        .filter_map(|record| {
            let labels = labels_by_rc.remove(&record.rc.id).unwrap_or_default();
            query.selector.matches(&labels).then(|| {
                let pods = pods_by_rc.get(record.rc.id.as_str());
                let status = RcStatus::from_pods(pods.into_iter().flatten().copied());
                RcView::new(record, labels, status)
            })
        })
        .collect();
    let page = query.paging.page(items, |view: &RcView| &view.id);
    let index = rcs_index.max(labels_index).max(pods_index);
    Ok(([index_header(index)], ApiJson(page)).into_response())
}

/// One RC with its labels and status.
#[utoipa::path(
    get,
    path = "/rcs/{id}",
    tag = TAG,
    params(RcPath),
    responses(
        (status = OK, description = "The RC", body = RcView,
            headers(("ETag" = String, description = "The RC's version"))),
        (status = NOT_FOUND, description = "No such RC", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The id is not a UUID", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The stored RC cannot be decoded (reason `UnreadableDocument`); DELETE removes it", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody),
    )
)]
async fn get_rc(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(RcPath { id }): ApiPath<RcPath>,
) -> Result<Response, ApiError> {
    let id = id.to_string();
    let store = app.rcs();
    let record = read(&store, &id).await?;
    view_response(&app, record).await
}

/// Changes an RC with a JSON merge patch of `replicas_desired`, `disabled`,
/// `node_selector`, `pod_labels` (a `null` value removes a key), `manifest` (same pod id)
/// and `allocation_strategy`.
///
/// With `If-Match` the patch applies only to that version; without it, it is re-applied to
/// the latest version until it lands. Refused while a roll names the RC (as its old or new
/// RC) or someone holds the RC's mutation lock.
#[utoipa::path(
    patch,
    path = "/rcs/{id}",
    tag = TAG,
    params(RcPath, ("If-Match" = Option<String>, Header, description = "Apply only to this version (an `ETag`)")),
    request_body(description = "A JSON merge patch",
        content((Object = "application/merge-patch+json"), (Object = "application/json"))),
    responses(
        (status = OK, description = "The patched RC", body = RcView,
            headers(("ETag" = String, description = "The RC's new version"))),
        (status = BAD_REQUEST, description = "Malformed JSON or If-Match", body = ErrorBody),
        (status = NOT_FOUND, description = "No such RC", body = ErrorBody),
        (status = CONFLICT, description = "A roll names the RC, or someone holds its mutation lock", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The RC changed since the If-Match version", body = ErrorBody),
        (status = PAYLOAD_TOO_LARGE, description = "Body over 1 MiB", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "Not a JSON merge patch", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Invalid, read-only or unknown fields, all listed", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The stored RC cannot be decoded (reason `UnreadableDocument`); DELETE removes it", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody),
    )
)]
async fn patch_rc(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(RcPath { id }): ApiPath<RcPath>,
    IfMatch(expected): IfMatch,
    MergePatch(patch): MergePatch,
) -> Result<Response, ApiError> {
    let id = id.to_string();
    let patch = RcPatch::parse(patch, &app.validation).map_err(ApiError::invalid)?;
    let store = app.rcs();
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let record = read(&store, &id).await?;
        check_version(&record, expected)?;
        let guards = unclaimed(&app, &store, &id).await?;
        let mut rc = record.rc.clone();
        patch.apply(&mut rc).map_err(|e| ApiError::invalid([e]))?;
        if rc == record.rc {
            return view_response(&app, record).await;
        }
        match store.write(rc, record.index, guards).await {
            Ok(written) => return view_response(&app, written).await,
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(busy(&id))
}

/// Deletes an RC and its labels in one transaction; its pods stay where they are.
///
/// Refused while `replicas_desired` is above 0 unless `?force=true`, and (even with
/// `?force=true`) while a roll names the RC or someone holds the RC's mutation lock. An RC
/// whose stored document cannot be decoded is deleted whatever its replica count: no farm
/// can run it.
#[utoipa::path(
    delete,
    path = "/rcs/{id}",
    tag = TAG,
    params(RcPath, DeleteRcParams, ("If-Match" = Option<String>, Header, description = "Delete only this version (an `ETag`)")),
    responses(
        (status = NO_CONTENT, description = "Deleted"),
        (status = BAD_REQUEST, description = "Malformed query or If-Match", body = ErrorBody),
        (status = NOT_FOUND, description = "No such RC", body = ErrorBody),
        (status = CONFLICT, description = "Replicas still desired, a roll names the RC, or someone holds its mutation lock", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The RC changed since the If-Match version", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The id is not a UUID", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody),
    )
)]
async fn delete_rc(
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<DeleteRcParams>,
    ApiPath(RcPath { id }): ApiPath<RcPath>,
    IfMatch(expected): IfMatch,
) -> Result<StatusCode, ApiError> {
    let id = id.to_string();
    let store = app.rcs();
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let mut ops = unclaimed(&app, &store, &id).await?;
        let index = match store.get(&id).await {
            Ok(Some(record)) => {
                check_version(&record, expected)?;
                if record.rc.replicas_desired > 0 && !params.force {
                    return Err(ApiError::conflict(format!(
                        "replication controller {id} still wants {} replicas; set \
                         replicas_desired to 0 first or delete with ?force=true",
                        record.rc.replicas_desired
                    )));
                }
                record.index
            }
            Ok(None) => {
                return Err(ApiError::not_found(format!(
                    "no replication controller {id}"
                )))
            }
            // No farm can run an RC it cannot read, so its replica count protects nothing.
            Err(StoreError::Invalid(why)) => unreadable_index(&app, &id, expected, &why).await?,
            Err(e) => return Err(e.into()),
        };
        ops.extend(RcStore::delete_ops(&id, index));
        match app.store.txn(&ops).await {
            Ok(_) => return Ok(StatusCode::NO_CONTENT),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(busy(&id))
}

/// The RC or 404. A stored document that cannot be decoded is no fault of the client's,
/// hence 500 `UnreadableDocument` (rather than the store's 422), saying how to clear it.
async fn read(store: &RcStore, id: &str) -> Result<RcRecord, ApiError> {
    match store.get(id).await {
        Ok(Some(record)) => Ok(record),
        Ok(None) => Err(ApiError::not_found(format!(
            "no replication controller {id}"
        ))),
        Err(StoreError::Invalid(why)) => Err(ApiError::unreadable(format!(
            "{why}; DELETE /api/v1/rcs/{id} removes it"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// The index of an RC document that cannot be decoded, so that it can still be deleted;
/// 412 unless it is at the version the client expects.
async fn unreadable_index(
    app: &AppState,
    id: &str,
    expected: Option<u64>,
    why: &str,
) -> Result<u64, ApiError> {
    let Some(pair) = app.store.get(&layout::rc(id)).await? else {
        return Err(ApiError::not_found(format!(
            "no replication controller {id}"
        )));
    };
    if let Some(expected) = expected.filter(|expected| *expected != pair.modify_index) {
        return Err(stale(&format!("replication controller {id}"), expected));
    }
    tracing::warn!(rc = %id, error = %why, "deleting an RC whose document cannot be decoded");
    Ok(pair.modify_index)
}

/// 412 unless the RC is at the version the client expects.
fn check_version(record: &RcRecord, expected: Option<u64>) -> Result<(), ApiError> {
    match expected {
        Some(expected) if expected != record.index => Err(stale(
            &format!("replication controller {}", record.rc.id),
            expected,
        )),
        _ => Ok(()),
    }
}

/// The txn ops that keep a write to the RC atomic with "no roll has it as its new RC and
/// nobody holds its mutation lock", or 409 naming the roll that names it (as old or new RC,
/// whether or not a farm runs the roll right now) or else the session holding the lock.
///
/// A roll naming the RC as its old one has no key derived from the RC, so it is looked for
/// just before the write rather than inside its transaction: a roll created in between goes
/// unseen (a delete then makes the roll's creation fail, as it needs both RCs present).
async fn unclaimed(app: &AppState, store: &RcStore, id: &str) -> Result<Vec<TxnOp>, ApiError> {
    let cannot = |holder: String| {
        ApiError::conflict(format!(
            "replication controller {id} cannot be changed now: {holder}"
        ))
    };
    if let Some(roll) = app.rolls().naming(id).await? {
        return Err(cannot(format!(
            "roll {roll} names it; wait for the roll to finish or cancel it with \
             DELETE /api/v1/rolls/{roll}"
        )));
    }
    match store.mutation_guard(id).await? {
        Ok(guard) => Ok(vec![guard, RollStore::absent_op(id)]),
        Err(session) => Err(cannot(format!(
            "session {session} holds its mutation lock (a node transfer or another tool); \
             retry later"
        ))),
    }
}

fn busy(id: &str) -> ApiError {
    ApiError::conflict(format!(
        "replication controller {id} kept changing while this request tried to apply; retry"
    ))
}

/// The RC as a response: its view with labels and status, and its `ETag`.
async fn view_response(app: &AppState, record: RcRecord) -> Result<Response, ApiError> {
    let label_store = app.labels();
    let labels = label_store
        .get(LabelType::ReplicationController, &record.rc.id)
        .await?
        .labels;
    let owned =
        Requirement::equals(RC_ID_LABEL, record.rc.id.as_str()).map_err(ApiError::internal)?;
    let (_, pods) = label_store
        .select(LabelType::Pod, &Selector::from_requirements([owned]))
        .await?;
    let view = RcView::new(&record, labels, RcStatus::from_pods(&pods));
    Ok(([etag(record.index)], ApiJson(view)).into_response())
}
