//! `/api/v1/daemonsets`: create, list, read (with rollout status), patch and delete daemon sets.
//!
//! What is stored is exactly P2's daemon-set document (§1.5), so P2's DS farm and `p2-dsctl`
//! work on the same store. Every change carries an audit record naming the user, taken from
//! the optional `X-P2-User` header (default `p2-apiserver`). Because P2's farm disables any
//! daemon set that is created or changed into contention (§4.10), the API refuses such a write
//! with 409 instead, naming the other daemon set, unless the daemon set is stored disabled.
//! The check and the write are not one transaction: two racing writes can both pass it, in
//! which case the farm's own check disables the later one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, StatusCode};
use axum::response::IntoResponse;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::api::blocking::index_header;
use crate::api::extract::{ApiJson, ApiPath, MergePatch, NoQuery};
use crate::api::list_query::{ListFilter, ListParams, ListQuery};
use crate::api::paging::Page;
use crate::api::preconditions::{etag, stale, IfMatch};
use crate::api::responses::created;
use crate::app::AppState;
use crate::error::{ApiError, Cause, ErrorBody, Violations};
use crate::kv::{KvStore, StoreResult};
use crate::labels::{LabelType, Requirement, Selector, DS_ID_LABEL};
use crate::model::duration::{format_duration, parse_duration};
use crate::model::{FieldError, HealthCounts, HealthState, Manifest, PodHealth, StoredDaemonSet};
use crate::store::daemon_sets::{
    parse_daemon_set_id, DaemonSetError, DaemonSetFarmStatus, DaemonSetRecord, DaemonSetStore,
};
use crate::store::health::HealthStore;
use crate::store::labels::LabelStore;
use crate::store::layout;
use crate::store::pods::{PodLocation, PodStore, PodTree};

/// OpenAPI tag of the daemon-set routes.
pub const TAG: &str = "daemonsets";

/// The header naming who makes a change, recorded in its audit record.
pub const USER_HEADER: HeaderName = HeaderName::from_static("x-p2-user");

/// The audit user when a request names none.
pub const DEFAULT_USER: &str = "p2-apiserver";

/// The longest audit user name accepted.
const MAX_USER_CHARS: usize = 256;

/// Fields a client reads but never writes.
const READ_ONLY_FIELDS: [&str; 4] = ["id", "pod_id", "resource_version", "status"];

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
    /// Shown only: P2's farm does not act on it.
    pub min_health: i64,
    /// Free-form name such as `production`; plays no part in scheduling.
    pub cluster_name: String,
    /// The manifest's `id`; fixed for the life of the daemon set.
    pub pod_id: String,
    /// How long the farm waits for one node to become healthy, e.g. `10m0s`.
    #[schema(example = "10m0s")]
    pub timeout: String,
    /// Whether the daemon set is paused.
    pub disabled: bool,
    /// The stored document's modify index, also sent as the `ETag`.
    pub resource_version: String,
    /// The rollout as seen now; given for a single daemon set, absent in lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<DaemonSetStatus>,
}

/// Where a daemon set's rollout stands, computed when asked from node labels, pod labels and
/// health records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DaemonSetStatus {
    /// Nodes its selector matches now.
    pub nodes_targeted: usize,
    /// Pods labelled `daemon_set_id=<id>`, i.e. nodes it has been scheduled on.
    pub nodes_scheduled: usize,
    /// Of those running the daemon set's pod id, the ones whose node reports running its
    /// intended manifest with health `passing`: the nodes the farm counts for `min_health`.
    pub nodes_healthy: usize,
    /// What the DS farm last published about the rollout; `null` until it has.
    pub farm: Option<DaemonSetFarmStatus>,
}

/// The body of `POST /api/v1/daemonsets`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreateDaemonSet {
    /// The pod manifest: YAML text, or a JSON object (stored as its YAML rendering). Its `id`
    /// becomes the daemon set's `pod_id`.
    #[schema(schema_with = manifest_schema)]
    pub manifest: Value,
    /// Selector of the nodes to run on; required, and `""` explicitly selects every node.
    pub node_selector: String,
    /// At least 0; default 0.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub min_health: i64,
    /// Free-form name such as `production`; default `""`.
    #[serde(default)]
    pub cluster_name: String,
    /// Per-node timeout as duration text such as `10m`; must be positive.
    #[schema(example = "10m")]
    pub timeout: String,
    /// Store the daemon set paused; a disabled daemon set may contend with others.
    #[serde(default)]
    pub disabled: bool,
}

/// The body of `PATCH /api/v1/daemonsets/{id}`: a JSON merge patch of these fields; absent
/// fields stay as they are and none may be `null`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct DaemonSetPatch {
    /// A whole new manifest (YAML text or JSON object); its `id` must equal the daemon set's
    /// `pod_id`.
    #[schema(schema_with = manifest_schema)]
    pub manifest: Option<Value>,
    /// A new node selector; `""` selects every node.
    pub node_selector: Option<String>,
    /// At least 0.
    #[schema(minimum = 0)]
    pub min_health: Option<i64>,
    /// Free-form name such as `production`.
    pub cluster_name: Option<String>,
    /// Duration text such as `10m`; must be positive.
    #[schema(example = "10m")]
    pub timeout: Option<String>,
    /// Pause (`true`) or resume (`false`) the daemon set.
    pub disabled: Option<bool>,
}

/// The filter of `GET /api/v1/daemonsets`.
#[derive(Debug, Default, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DaemonSetFilter {
    /// Only daemon sets running this pod ID.
    pub pod_id: Option<String>,
}

impl ListFilter for DaemonSetFilter {}

/// `manifest` is YAML text or a JSON object.
fn manifest_schema() -> impl Into<RefOr<Schema>> {
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(ObjectBuilder::new().schema_type(Type::Object))
        .description(Some(
            "Pod manifest as YAML text (kept byte for byte) or as a JSON object",
        ))
}

/// Who makes a change, for its audit record: the `X-P2-User` header, or [`DEFAULT_USER`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditUser(pub String);

impl<S: Send + Sync> FromRequestParts<S> for AuditUser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(&USER_HEADER) else {
            return Ok(AuditUser(DEFAULT_USER.to_owned()));
        };
        let user = value
            .to_str()
            .map(str::trim)
            .ok()
            .filter(|user| !user.is_empty() && user.chars().count() <= MAX_USER_CHARS)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "{USER_HEADER} must be a printable name of 1 to {MAX_USER_CHARS} characters"
                ))
            })?;
        Ok(AuditUser(user.to_owned()))
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
            DaemonSetError::Invalid(problems) => ApiError::invalid(problems.into_iter().map(cause)),
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
/// `cluster_name` as labels, e.g. `cluster_name in (production,staging)`. Blocks with `?index=&wait=` until the daemon-set tree changes; `X-Index` carries its
/// index. Items carry no `status`; read one daemon set for it.
#[utoipa::path(
    get,
    path = "/daemonsets",
    tag = TAG,
    params(DaemonSetFilter, ListParams),
    responses(
        (status = OK, description = "One page of daemon sets", body = Page<DaemonSet>,
            headers(("X-Index" = u64, description = "Index of the daemon-set tree, for ?index="))),
        (status = BAD_REQUEST, description = "Malformed query string", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Bad selector, limit, continue token, index or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn list_daemon_sets(
    State(app): State<AppState>,
    query: ListQuery<DaemonSetFilter>,
) -> Result<impl IntoResponse, ApiError> {
    query
        .blocking
        .block(&app, &[layout::DAEMON_SETS.to_owned()])
        .await?;
    let (index, records) = app.daemon_sets().list().await?;
    let pod_id = query.filter.pod_id.as_ref();
    let items = records
        .iter()
        .filter(|r| pod_id.is_none_or(|pod| &r.value.pod_id == pod))
        .filter(|r| query.selector.matches(&r.value.labels()))
        .map(|r| daemon_set(r, None))
        .collect();
    let page = query.paging.page(items, |ds: &DaemonSet| ds.id.as_str());
    Ok(([index_header(index)], ApiJson(page)))
}

/// Creates a daemon set; `pod_id` is the manifest's `id`.
///
/// Every bad field is reported at once (422). An enabled daemon set that would contend with
/// another (same pod ID, overlapping nodes) is refused with 409 naming the other; send
/// `"disabled": true` to store it anyway, paused.
#[utoipa::path(
    post,
    path = "/daemonsets",
    tag = TAG,
    params(("X-P2-User" = Option<String>, Header, description = "Who makes the change, for the audit record; default p2-apiserver")),
    request_body = CreateDaemonSet,
    responses(
        (status = CREATED, description = "The new daemon set", body = DaemonSet,
            headers(("ETag" = String, description = "The version, for If-Match"),
                    ("Location" = String, description = "URL of the new daemon set"))),
        (status = BAD_REQUEST, description = "Malformed JSON or X-P2-User", body = ErrorBody),
        (status = CONFLICT, description = "It would contend with another daemon set", body = ErrorBody),
        (status = PAYLOAD_TOO_LARGE, description = "The body is over 1 MiB", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "The body is not JSON", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Invalid fields, all listed", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn create_daemon_set(
    State(app): State<AppState>,
    _: NoQuery,
    AuditUser(user): AuditUser,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<impl IntoResponse, ApiError> {
    let ds = new_daemon_set(body)?;
    let store = app.daemon_sets();
    let labels = app.labels();
    if let Some(other) = store.find_contender(&ds, &labels).await? {
        return Err(contention_error(&other));
    }
    let record = store.create(ds, &user).await?;
    let id = parse_daemon_set_id(&record.value.id).map_err(ApiError::internal)?;
    // The daemon set exists now: a failure to read its status must not turn into an error
    // that makes the client create it again.
    let status = match rollout_status(&app.store, id, &record).await {
        Ok(status) => Some(status),
        Err(e) => {
            tracing::warn!(error = %e, "reading a new daemon set's status failed");
            None
        }
    };
    created(
        &format!("/api/v1/daemonsets/{id}"),
        record.index,
        daemon_set(&record, status),
    )
}

/// Reads one daemon set with its rollout status.
#[utoipa::path(
    get,
    path = "/daemonsets/{id}",
    tag = TAG,
    params(("id" = String, Path, description = "Daemon set ID (UUID)")),
    responses(
        (status = OK, description = "The daemon set", body = DaemonSet,
            headers(("ETag" = String, description = "The version, for If-Match"))),
        (status = NOT_FOUND, description = "No such daemon set", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The ID is not a UUID", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The stored daemon set cannot be decoded (reason `UnreadableDocument`); DELETE removes it", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn get_daemon_set(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let id = path_id(&id)?;
    let record = app
        .daemon_sets()
        .get(id)
        .await?
        .ok_or(DaemonSetError::NotFound(id))?;
    let status = rollout_status(&app.store, id, &record).await?;
    Ok((
        [etag(record.index)],
        ApiJson(daemon_set(&record, Some(status))),
    ))
}

/// Changes a daemon set with a JSON merge patch of `manifest`, `node_selector`,
/// `min_health`, `cluster_name`, `timeout` and `disabled`.
///
/// With `If-Match` the patch applies only to that version (412 otherwise); without it, it is
/// re-applied to the latest version while it loses to concurrent writes (for up to 5 s), so
/// concurrent patches of different fields all take effect. A patch that changes nothing
/// answers 200 with the daemon set unchanged. A change leaving the daemon set enabled and
/// contending with another is refused with 409.
#[utoipa::path(
    patch,
    path = "/daemonsets/{id}",
    tag = TAG,
    params(
        ("id" = String, Path, description = "Daemon set ID (UUID)"),
        ("If-Match" = Option<String>, Header, description = "Apply only to this version (an ETag)"),
        ("X-P2-User" = Option<String>, Header, description = "Who makes the change, for the audit record; default p2-apiserver")
    ),
    request_body(content = DaemonSetPatch, content_type = "application/merge-patch+json",
        description = "A JSON merge patch; application/json is accepted too"),
    responses(
        (status = OK, description = "The daemon set after the patch", body = DaemonSet,
            headers(("ETag" = String, description = "The version, for If-Match"))),
        (status = BAD_REQUEST, description = "Malformed JSON, If-Match or X-P2-User", body = ErrorBody),
        (status = NOT_FOUND, description = "No such daemon set", body = ErrorBody),
        (status = CONFLICT, description = "It would contend with another daemon set, or it kept changing for 5 s", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "If-Match is stale", body = ErrorBody),
        (status = PAYLOAD_TOO_LARGE, description = "The body is over 1 MiB", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "The body is not a JSON merge patch", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Invalid fields, all listed", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The stored daemon set cannot be decoded (reason `UnreadableDocument`); DELETE removes it", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn patch_daemon_set(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(id): ApiPath<String>,
    IfMatch(expected): IfMatch,
    AuditUser(user): AuditUser,
    MergePatch(body): MergePatch,
) -> Result<impl IntoResponse, ApiError> {
    let id = path_id(&id)?;
    let store = app.daemon_sets();
    let labels = app.labels();
    let (changes, mut violations) = parse_patch(body);
    if !violations.is_empty() {
        // Report a manifest for the wrong pod along with the other problems.
        if let (Some(manifest), Ok(Some(current))) = (&changes.manifest, store.get(id).await) {
            check_pod_id(manifest, &current.value, &mut violations);
        }
        violations.finish()?;
    }
    let record = store
        .update(id, expected, &user, |current| {
            let (changes, store, labels) = (&changes, &store, &labels);
            async move {
                let next = changes.apply(&current.value)?;
                if next != current.value {
                    if let Some(other) = store.find_contender(&next, labels).await? {
                        return Err(contention_error(&other));
                    }
                }
                Ok::<_, ApiError>(next)
            }
        })
        .await?;
    let status = rollout_status(&app.store, id, &record).await?;
    Ok((
        [etag(record.index)],
        ApiJson(daemon_set(&record, Some(status))),
    ))
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
        ("id" = String, Path, description = "Daemon set ID (UUID)"),
        ("If-Match" = Option<String>, Header, description = "Delete only this version (an ETag)"),
        ("X-P2-User" = Option<String>, Header, description = "Who makes the change, for the audit record; default p2-apiserver")
    ),
    responses(
        (status = NO_CONTENT, description = "Deleted"),
        (status = BAD_REQUEST, description = "Malformed If-Match or X-P2-User", body = ErrorBody),
        (status = NOT_FOUND, description = "No such daemon set", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "If-Match is stale", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The ID is not a UUID", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn delete_daemon_set(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(id): ApiPath<String>,
    IfMatch(expected): IfMatch,
    AuditUser(user): AuditUser,
) -> Result<StatusCode, ApiError> {
    let id = path_id(&id)?;
    app.daemon_sets().delete(id, expected, &user).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A validated patch, ready to apply to whatever version is current.
#[derive(Debug, Default)]
struct Changes {
    manifest: Option<Manifest>,
    node_selector: Option<String>,
    min_health: Option<i64>,
    cluster_name: Option<String>,
    timeout: Option<Duration>,
    disabled: Option<bool>,
}

impl Changes {
    /// `ds` with the changes applied; refuses a manifest for another pod, since the pod ID
    /// of a daemon set never changes (P2's invariant).
    fn apply(&self, ds: &StoredDaemonSet) -> Result<StoredDaemonSet, ApiError> {
        let mut next = ds.clone();
        if let Some(manifest) = &self.manifest {
            let mut violations = Violations::new();
            check_pod_id(manifest, ds, &mut violations);
            violations.finish()?;
            next.manifest = manifest.clone();
        }
        if let Some(selector) = &self.node_selector {
            next.node_selector.clone_from(selector);
        }
        if let Some(min_health) = self.min_health {
            next.min_health = min_health;
        }
        if let Some(name) = &self.cluster_name {
            next.cluster_name.clone_from(name);
        }
        if let Some(timeout) = self.timeout {
            next.timeout = timeout;
        }
        if let Some(disabled) = self.disabled {
            next.disabled = disabled;
        }
        Ok(next)
    }
}

fn check_pod_id(manifest: &Manifest, ds: &StoredDaemonSet, violations: &mut Violations) {
    if manifest.pod_id() != ds.pod_id {
        violations.add(
            "manifest.id",
            format!(
                "must equal the daemon set's pod_id {:?}, not {:?}",
                ds.pod_id,
                manifest.pod_id()
            ),
        );
    }
}

/// The stored daemon set a create body describes, with a fresh ID. The body is read field by
/// field so that every bad field is reported at once, not only the first.
fn new_daemon_set(body: Map<String, Value>) -> Result<StoredDaemonSet, ApiError> {
    let mut fields = Fields::new(body);
    let manifest = fields.required::<Value>("manifest", "a YAML string or a JSON object");
    let node_selector = fields.required::<String>(
        "node_selector",
        "a selector string (\"\" selects every node)",
    );
    let min_health = fields.optional::<i64>("min_health", "an integer");
    let cluster_name = fields.optional::<String>("cluster_name", "a string");
    let timeout = fields.required::<String>("timeout", "duration text such as \"10m\"");
    let disabled = fields.optional::<bool>("disabled", "true or false");
    let mut violations = fields.into_violations();
    let manifest = manifest.and_then(|m| valid_manifest(&m, &mut violations));
    let node_selector = node_selector.and_then(|s| valid_selector(&s, &mut violations));
    let timeout = timeout.and_then(|t| valid_timeout(&t, &mut violations));
    let min_health = min_health.unwrap_or_default();
    check_min_health(min_health, &mut violations);
    violations.finish()?;
    let (Some(manifest), Some(node_selector), Some(timeout)) = (manifest, node_selector, timeout)
    else {
        unreachable!("missing or invalid required fields are violations");
    };
    Ok(StoredDaemonSet {
        id: Uuid::new_v4().to_string(),
        disabled: disabled.unwrap_or_default(),
        pod_id: manifest.pod_id().to_owned(),
        manifest,
        min_health,
        cluster_name: cluster_name.unwrap_or_default(),
        node_selector,
        timeout,
    })
}

/// Reads and validates a merge patch: what could be read, and every problem found, to which
/// the caller adds the checks that need the stored daemon set.
fn parse_patch(body: Map<String, Value>) -> (Changes, Violations) {
    let mut fields = Fields::new(body);
    let patch = DaemonSetPatch {
        manifest: fields.optional("manifest", "a YAML string or a JSON object"),
        node_selector: fields.optional("node_selector", "a selector string"),
        min_health: fields.optional("min_health", "an integer"),
        cluster_name: fields.optional("cluster_name", "a string"),
        timeout: fields.optional("timeout", "duration text such as \"10m\""),
        disabled: fields.optional("disabled", "true or false"),
    };
    let mut violations = fields.into_violations();
    let changes = Changes {
        manifest: patch
            .manifest
            .as_ref()
            .and_then(|m| valid_manifest(m, &mut violations)),
        node_selector: patch
            .node_selector
            .as_deref()
            .and_then(|s| valid_selector(s, &mut violations)),
        min_health: patch
            .min_health
            .inspect(|&n| check_min_health(n, &mut violations)),
        cluster_name: patch.cluster_name,
        timeout: patch
            .timeout
            .as_deref()
            .and_then(|t| valid_timeout(t, &mut violations)),
        disabled: patch.disabled,
    };
    (changes, violations)
}

/// A JSON object read one field at a time, collecting a violation for each bad one.
struct Fields {
    body: Map<String, Value>,
    violations: Violations,
}

impl Fields {
    fn new(body: Map<String, Value>) -> Self {
        Fields {
            body,
            violations: Violations::new(),
        }
    }

    /// The field if present; `null` and values of the wrong type are violations.
    fn optional<T: DeserializeOwned>(&mut self, name: &str, expected: &str) -> Option<T> {
        let value = self.body.remove(name)?;
        if value.is_null() {
            self.violations
                .add(name, "must not be null; this field cannot be removed");
            return None;
        }
        serde_json::from_value(value)
            .map_err(|_| self.violations.add(name, format!("must be {expected}")))
            .ok()
    }

    /// The field, which must be present.
    fn required<T: DeserializeOwned>(&mut self, name: &str, expected: &str) -> Option<T> {
        if !self.body.contains_key(name) {
            self.violations.add(name, "is required");
            return None;
        }
        self.optional(name, expected)
    }

    /// Every problem found, with each field not read counted as one.
    fn into_violations(mut self) -> Violations {
        for name in self.body.keys() {
            if READ_ONLY_FIELDS.contains(&name.as_str()) {
                self.violations
                    .add(name.as_str(), "is set by the server and cannot be written");
            } else {
                self.violations
                    .add(name.as_str(), "is not a field of a daemon set");
            }
        }
        self.violations
    }
}

fn valid_manifest(value: &Value, violations: &mut Violations) -> Option<Manifest> {
    let parsed = match value {
        Value::String(text) => Manifest::parse(text),
        Value::Object(_) => Manifest::from_json_value(value),
        _ => Err(vec![FieldError::new(
            "manifest",
            "must be a YAML string or a JSON object",
        )]),
    };
    match parsed {
        Ok(manifest) => {
            // The pod ID becomes a key segment (`intent/<node>/<pod_id>`, `health/<pod_id>/…`).
            if let Err(why) = check_key_segment(manifest.pod_id()) {
                violations.add("manifest.id", why);
                return None;
            }
            Some(manifest)
        }
        Err(problems) => {
            for problem in problems {
                let field = if problem.field == "manifest" {
                    problem.field
                } else {
                    format!("manifest.{}", problem.field)
                };
                violations.add(field, problem.message);
            }
            None
        }
    }
}

/// The selector in canonical form, as stored.
fn valid_selector(text: &str, violations: &mut Violations) -> Option<String> {
    text.parse::<Selector>()
        .map(|selector| selector.to_string())
        .map_err(|e| violations.add("node_selector", e.to_string()))
        .ok()
}

/// A positive duration: P2's replicator times a node out at once with a zero timeout.
fn valid_timeout(text: &str, violations: &mut Violations) -> Option<Duration> {
    match parse_duration(text) {
        Ok(timeout) if timeout.is_zero() => {
            violations.add("timeout", "must be positive");
            None
        }
        Ok(timeout) => Some(timeout),
        Err(e) => {
            violations.add("timeout", e);
            None
        }
    }
}

fn check_min_health(min_health: i64, violations: &mut Violations) {
    if min_health < 0 {
        violations.add("min_health", "must not be negative");
    }
}

/// Refuses text that cannot be one key segment: empty, `.`, `..`, or holding `/`,
/// whitespace or control characters.
fn check_key_segment(text: &str) -> Result<(), String> {
    if text.is_empty() || text == "." || text == ".." {
        return Err(format!("{text:?} cannot name a key"));
    }
    if text
        .chars()
        .any(|c| c == '/' || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "{text:?} cannot name a key: it holds '/', whitespace or a control character"
        ));
    }
    Ok(())
}

fn path_id(text: &str) -> Result<Uuid, ApiError> {
    parse_daemon_set_id(text).map_err(|why| ApiError::invalid([Cause::new("id", why)]))
}

fn cause(problem: FieldError) -> Cause {
    Cause::new(problem.field, problem.message)
}

fn contention_error(other: &StoredDaemonSet) -> ApiError {
    ApiError::conflict(format!(
        "daemon set {} (node_selector {:?}) already runs pod {:?} on nodes this daemon set \
         would select; change the node selector, or store this one with \"disabled\": true",
        other.id, other.node_selector, other.pod_id
    ))
}

fn daemon_set(record: &DaemonSetRecord, status: Option<DaemonSetStatus>) -> DaemonSet {
    let ds = &record.value;
    DaemonSet {
        id: ds.id.clone(),
        manifest: ds.manifest.raw().to_owned(),
        node_selector: ds.node_selector.clone(),
        min_health: ds.min_health,
        cluster_name: ds.cluster_name.clone(),
        pod_id: ds.pod_id.clone(),
        timeout: format_duration(ds.timeout),
        disabled: ds.disabled,
        resource_version: record.index.to_string(),
        status,
    }
}

/// Counts, now, the nodes a daemon set targets, the nodes it has pods on, and the healthy ones.
async fn rollout_status(
    kv: &Arc<dyn KvStore>,
    id: Uuid,
    record: &DaemonSetRecord,
) -> Result<DaemonSetStatus, ApiError> {
    let labels = LabelStore::new(kv.clone());
    // Writes keep the selector parsable; one that is not (written by another tool) cannot
    // be acted on by the farm, so it targets nothing.
    let nodes_targeted = match record.value.node_selector.parse::<Selector>() {
        Ok(selector) => labels.select(LabelType::Node, &selector).await?.1.len(),
        Err(_) => 0,
    };
    let owned = Requirement::equals(DS_ID_LABEL, id.to_string()).map_err(ApiError::internal)?;
    let (_, pods) = labels
        .select(LabelType::Pod, &Selector::from_requirements([owned]))
        .await?;
    // Healthy as the farm counts nodes for `min_health`: by the one rule, against what the
    // node is meant to run (its intent, the daemon set's manifest or not yet).
    let health = pod_health(kv, &record.value.pod_id).await?;
    let manifests = PodStore::new(kv.clone());
    let mut counts = HealthCounts::default();
    for pod in pods
        .iter()
        .filter_map(|pod| PodLocation::from_label_id(&pod.id))
    {
        if pod.pod_id() != record.value.pod_id {
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
        nodes_targeted,
        nodes_scheduled: pods.len(),
        nodes_healthy: counts.healthy as usize,
        farm,
    })
}

/// Every health result of one pod ID, by node (the record's `Node` field, as P2 keys them).
async fn pod_health(
    kv: &Arc<dyn KvStore>,
    pod_id: &str,
) -> StoreResult<HashMap<String, HealthState>> {
    if check_key_segment(pod_id).is_err() {
        return Ok(HashMap::new());
    }
    let (_, by_node) = HealthStore::new(kv.clone()).list_for_pod(pod_id).await?;
    Ok(by_node
        .into_iter()
        .map(|(node, entry)| (node, entry.state()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn create_lists_every_bad_field() {
        let body = object(serde_json::json!({
            "manifest": "id: a/b\n",
            "node_selector": "role in (",
            "min_health": -1,
            "disabled": "yes",
            "pod_id": "x",
            "colour": "red"
        }));
        let err = new_daemon_set(body).unwrap_err().body();
        let fields: Vec<&str> = err.causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "timeout",
                "disabled",
                "colour",
                "pod_id",
                "manifest.id",
                "node_selector",
                "min_health"
            ]
        );
    }

    #[test]
    fn key_segments_refuse_what_would_change_a_key() {
        for bad in ["", ".", "..", "a/b", "a b", "a\u{7}"] {
            assert!(check_key_segment(bad).is_err(), "{bad:?}");
        }
        assert!(check_key_segment("p2-log-shipper").is_ok());
    }
}
