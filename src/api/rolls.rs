//! Rolling updates over HTTP: create (in P2's three forms), list, read with progress, cancel.
//!
//! Status choices for refused creations:
//! - 422 (`Invalid`, with a cause naming the field) when the request itself cannot work: a
//!   bad field, an RC id that names no RC (the RC is referenced by the body, not addressed by
//!   the URL, so this is not a 404), the same RC on both sides, or `leave_old` when the
//!   selector found no old RC to leave.
//! - 409 (`Conflict`) when the request is fine but the current state is in the way and may
//!   change: another roll over either RC, another creation holding an RC's update-creation
//!   lock, an old-RC selector matching more than one RC, or a change between the checks and
//!   the commit.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::{combined_index, index_header};
use crate::api::extract::{ApiJson, ApiPath, NoQuery};
use crate::api::list_query::{ListParams, ListQuery};
use crate::api::paging::Page;
use crate::api::preconditions::{etag, stale, IfMatch};
use crate::api::rcs::RcSpec;
use crate::api::responses::created;
use crate::app::AppState;
use crate::error::{ApiError, Cause, ErrorBody};
use crate::kv::{KvStore, StoreError};
use crate::labels::{validate_labels_in, LabelType, Labels, Selector, POD_ID_LABEL, RC_ID_LABEL};
use crate::model::duration::{format_duration, parse_duration};
use crate::model::{validate_counts, HealthCounts, HealthState, PodHealth};
use crate::store::health::HealthStore;
use crate::store::labels::LabelStore;
use crate::store::layout;
use crate::store::pods::{PodLocation, PodStore, PodTree};
use crate::store::rcs::RcStore;
use crate::store::roll_creation::{CreateRollError, RcWithLabels, RollPlan, RollRcs};
use crate::store::rolls::RollRecord;

/// OpenAPI tag of the roll routes.
pub const TAG: &str = "rolls";

/// The roll routes.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_roll, list_rolls))
        .routes(routes!(get_roll, delete_roll))
}

/// A request to create a rolling update, in one of P2's three forms:
/// `old_rc_id` + `new_rc_id` (both RCs exist); `old_rc_id` + `new_rc` (the new RC is created
/// with the roll); `old_rc_selector` + `new_rc` (the old RC is the one RC whose labels
/// match; when none does, a stand-in old RC with the new RC's spec and 0 replicas is
/// created).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRoll {
    /// The RC losing replicas, by id.
    #[schema(example = "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11")]
    pub old_rc_id: Option<String>,
    /// Selects the RC losing replicas by its RC labels; must match at most one RC.
    #[schema(example = "pod_id=hello,cluster_name=production")]
    pub old_rc_selector: Option<String>,
    /// The RC gaining replicas, by id; it becomes the roll's id.
    pub new_rc_id: Option<String>,
    /// The RC gaining replicas, created with the roll (with 0 replicas; leave
    /// `replicas_desired` out). Its new id becomes the roll's id.
    pub new_rc: Option<RcSpec>,
    /// The roll is done when the new RC has this many replicas; at least 0.
    #[schema(example = 3)]
    pub desired_replicas: Option<i64>,
    /// Healthy pods that must stay up throughout; between 0 and `desired_replicas`.
    #[schema(example = 2)]
    pub minimum_replicas: Option<i64>,
    /// Keep the old RC when done (partial rollouts).
    #[serde(default)]
    pub leave_old: bool,
    /// Pause before each step after the first, e.g. `30s`; default `0s`.
    #[schema(example = "30s")]
    pub roll_delay: Option<String>,
    /// The roll's own labels (label type `rolls`).
    #[serde(default)]
    #[schema(value_type = BTreeMap<String, String>)]
    pub labels: Labels,
    /// Labels merged into the new RC's labels (and a stand-in old RC's).
    #[serde(default)]
    #[schema(value_type = BTreeMap<String, String>)]
    pub new_rc_labels: Labels,
}

/// A rolling update with its progress.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Roll {
    /// The roll's id, which is the new RC's id.
    pub id: String,
    /// The RC losing replicas.
    pub old_rc_id: String,
    /// The RC gaining replicas.
    pub new_rc_id: String,
    /// The roll is done when the new RC has this many replicas.
    pub desired_replicas: i64,
    /// Healthy pods that must stay up throughout.
    pub minimum_replicas: i64,
    /// Whether the old RC is kept when done.
    pub leave_old: bool,
    /// Pause before each step after the first, e.g. `30s`.
    #[schema(example = "30s")]
    pub roll_delay: String,
    /// The roll's own labels.
    #[schema(value_type = BTreeMap<String, String>)]
    pub labels: Labels,
    /// The roll document's modify index; also its `ETag`.
    pub resource_version: String,
    /// How far the roll has come.
    pub progress: RollProgress,
}

/// Replica counts of both RCs, as they are now.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RollProgress {
    pub old: RcProgress,
    pub new: RcProgress,
}

/// One RC's replica counts. Pods count as the roll farm counts them: only pods running the
/// RC's manifest (per the reality tree) are health-counted.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RcProgress {
    /// The RC's `replicas_desired`; `null` when the RC does not exist (any more).
    pub desired: Option<i64>,
    /// Pods labeled with the RC's id (of the RC's pod id, while the RC exists).
    pub current: u64,
    /// Of those, the pods whose node reports running the RC's manifest.
    pub real: u64,
    /// Of the real ones, those whose health is `passing`.
    pub healthy: u64,
    /// Of the real ones, those whose health is `unknown` or not reported.
    pub unknown: u64,
    /// Of the real ones, those whose health is `warning` or `critical`.
    pub unhealthy: u64,
}

/// Path of one roll.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RollPath {
    /// The roll's id (the new RC's id), a UUID.
    pub id: String,
}

/// Creates a rolling update.
///
/// Takes the update-creation lock of both RCs (as P2 does, so P2's tools and this server
/// never create two rolls over one RC), checks no roll is over either RC, then writes the
/// new RC (if any), a stand-in old RC (if any), the roll and its labels in one transaction.
#[utoipa::path(
    post,
    path = "/api/v1/rolls",
    tag = TAG,
    request_body = CreateRoll,
    responses(
        (status = CREATED, description = "The roll was created", body = Roll,
            headers(("ETag" = String, description = "The roll's modify index"),
                    ("Location" = String, description = "The roll's URL"))),
        (status = BAD_REQUEST, description = "The body is not JSON", body = ErrorBody),
        (status = CONFLICT, description = "Another roll is over, or being created over, one of the RCs; or the old-RC selector is ambiguous", body = ErrorBody),
        (status = PAYLOAD_TOO_LARGE, description = "The body is over 1 MiB", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "The body is not application/json", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Invalid fields, every one listed; a named RC does not exist; or leave_old without an old RC", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn create_roll(
    State(app): State<AppState>,
    _: NoQuery,
    ApiJson(body): ApiJson<CreateRoll>,
) -> Result<Response, ApiError> {
    let plan = validate(body)?;
    let record = app
        .roll_creator()
        .create(plan)
        .await
        .map_err(creation_error)?;
    let view = Views::load(app.store.clone()).await?.view(&record).await?;
    created(&format!("/api/v1/rolls/{}", view.id), record.index, view)
}

/// Lists rolling updates with their progress, sorted by id.
///
/// `selector` matches the roll's labels. Blocks with `?index=&wait=` until a roll, its labels, either RC, their pods or the pods'
/// health or what their nodes run change: everything the answer shows.
#[utoipa::path(
    get,
    path = "/api/v1/rolls",
    tag = TAG,
    params(ListParams),
    responses(
        (status = OK, description = "One page of rolls", body = Page<Roll>,
            headers(("X-Index" = u64, description = "Pass as `index` to wait for a change"))),
        (status = UNPROCESSABLE_ENTITY, description = "Bad selector, limit, continue token or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn list_rolls(State(app): State<AppState>, query: ListQuery) -> Result<Response, ApiError> {
    let prefixes = watched_prefixes();
    query.blocking.block(&app, &prefixes).await?;
    let index = combined_index(app.store.as_ref(), &prefixes).await?;

    let (_, records) = app.rolls().list().await?;
    let mut views = Views::load(app.store.clone()).await?;
    let mut items = Vec::with_capacity(records.len());
    for record in &records {
        let view = views.view(record).await?;
        if query.selector.matches(&view.labels) {
            items.push(view);
        }
    }
    items.sort_by(|a, b| a.id.cmp(&b.id));
    let page = query.paging.page(items, |roll| roll.id.as_str());
    Ok(([index_header(index)], ApiJson(page)).into_response())
}

/// Reads one rolling update with its progress.
#[utoipa::path(
    get,
    path = "/api/v1/rolls/{id}",
    tag = TAG,
    params(RollPath),
    responses(
        (status = OK, description = "The roll", body = Roll,
            headers(("ETag" = String, description = "The roll's modify index"))),
        (status = NOT_FOUND, description = "No such roll", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The id is not a UUID", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn get_roll(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(RollPath { id }): ApiPath<RollPath>,
) -> Result<Response, ApiError> {
    validate_path_id(&id)?;
    let record = match app.rolls().get(&id).await {
        Ok(Some(record)) => record,
        Ok(None) => return Err(not_found(&id)),
        // The document is broken, not the request.
        Err(StoreError::Invalid(why)) => return Err(ApiError::internal(why)),
        Err(e) => return Err(e.into()),
    };
    let view = Views::load(app.store.clone()).await?.view(&record).await?;
    Ok(([etag(record.index)], ApiJson(view)).into_response())
}

/// Cancels a rolling update: deletes the roll and its labels, leaving both RCs as they are.
///
/// A roll farm running it stops; the RCs keep their current replica counts.
#[utoipa::path(
    delete,
    path = "/api/v1/rolls/{id}",
    tag = TAG,
    params(RollPath,
        ("If-Match" = Option<String>, Header, description = "Delete only if the roll's ETag is still this")),
    responses(
        (status = NO_CONTENT, description = "The roll is gone"),
        (status = BAD_REQUEST, description = "If-Match is not an ETag", body = ErrorBody),
        (status = NOT_FOUND, description = "No such roll", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The roll changed since the If-Match version", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The id is not a UUID", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn delete_roll(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(RollPath { id }): ApiPath<RollPath>,
    IfMatch(expected): IfMatch,
) -> Result<StatusCode, ApiError> {
    validate_path_id(&id)?;
    match (app.rolls().delete(&id, expected).await, expected) {
        (Ok(true), _) => Ok(StatusCode::NO_CONTENT),
        (Ok(false), _) => Err(not_found(&id)),
        (Err(StoreError::Conflict { .. }), Some(expected)) => {
            Err(stale(&format!("rolling update {id}"), expected))
        }
        (Err(e), _) => Err(e.into()),
    }
}

/// Everything a roll view shows comes from these trees.
fn watched_prefixes() -> Vec<String> {
    vec![
        layout::ROLLS.to_owned(),
        LabelType::Rolls.key_prefix(),
        layout::RCS.to_owned(),
        LabelType::Pod.key_prefix(),
        layout::REALITY.to_owned(),
        layout::HEALTH.to_owned(),
    ]
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("no rolling update {id} exists"))
}

fn validate_path_id(id: &str) -> Result<(), ApiError> {
    check_uuid(id).map_err(|e| ApiError::invalid([Cause::new("id", e)]))
}

/// RC and roll ids are canonical (lowercase, hyphenated) UUIDs, which is also what makes
/// them safe key segments.
fn check_uuid(id: &str) -> Result<(), String> {
    match uuid::Uuid::parse_str(id) {
        Ok(uuid) if uuid.hyphenated().to_string() == id => Ok(()),
        Ok(uuid) => Err(format!(
            "must be a UUID in lowercase hyphenated form, like {}",
            uuid.hyphenated()
        )),
        Err(_) => Err("must be a UUID (the id of a replication controller)".to_owned()),
    }
}

/// Checks the whole request, reporting every problem at once, and turns it into a plan.
fn validate(body: CreateRoll) -> Result<RollPlan, ApiError> {
    let mut causes = Vec::new();
    let mut id_field = |field: &str, value: &Option<String>| -> Option<String> {
        let value = value.as_ref()?;
        match check_uuid(value) {
            Ok(()) => Some(value.clone()),
            Err(e) => {
                causes.push(Cause::new(field, e));
                None
            }
        }
    };
    let old_rc_id = id_field("old_rc_id", &body.old_rc_id);
    let new_rc_id = id_field("new_rc_id", &body.new_rc_id);

    match (&body.old_rc_id, &body.old_rc_selector) {
        (None, None) => causes.push(Cause::new(
            "old_rc_id",
            "give the old RC, by old_rc_id or by old_rc_selector",
        )),
        (Some(_), Some(_)) => causes.push(Cause::new(
            "old_rc_selector",
            "give old_rc_id or old_rc_selector, not both",
        )),
        _ => {}
    }
    match (&body.new_rc_id, &body.new_rc) {
        (None, None) => causes.push(Cause::new(
            "new_rc_id",
            "give the new RC, by new_rc_id or as a new_rc spec to create",
        )),
        (Some(_), Some(_)) => {
            causes.push(Cause::new("new_rc", "give new_rc_id or new_rc, not both"))
        }
        _ => {}
    }
    if body.old_rc_selector.is_some() && body.new_rc_id.is_some() {
        causes.push(Cause::new(
            "old_rc_selector",
            "needs new_rc: the old RC may have to be stood in for with the new RC's spec",
        ));
    }
    if let (Some(old), Some(new)) = (&old_rc_id, &new_rc_id) {
        if old == new {
            causes.push(Cause::new(
                "new_rc_id",
                "must differ from old_rc_id: a roll moves replicas between two RCs",
            ));
        }
    }
    let selector = body.old_rc_selector.as_ref().and_then(|text| {
        text.parse::<Selector>()
            .map_err(|e| causes.push(Cause::new("old_rc_selector", e.to_string())))
            .ok()
    });

    let new_rc = body.new_rc.and_then(|spec| {
        if spec.replicas_desired != 0 {
            causes.push(Cause::new(
                "new_rc.replicas_desired",
                "a roll's new RC starts with 0 replicas and the roll gives it desired_replicas; leave it out",
            ));
        }
        spec.validate_in("new_rc")
            .map_err(|spec_causes| causes.extend(spec_causes))
            .ok()
    });
    if let Some(new_rc) = &new_rc {
        let pod_id = new_rc.rc.manifest.pod_id();
        if let Some(given) = body.new_rc_labels.get(POD_ID_LABEL) {
            if given != pod_id {
                causes.push(Cause::new(
                    format!("new_rc_labels.{POD_ID_LABEL}"),
                    format!("is always the new RC's manifest id {pod_id:?}; leave it out"),
                ));
            }
        }
    }

    let (desired, minimum) = match (body.desired_replicas, body.minimum_replicas) {
        (Some(desired), Some(minimum)) => {
            if let Err(problems) = validate_counts(desired, minimum) {
                causes.extend(problems.into_iter().map(|p| Cause::new(p.field, p.message)));
            }
            (desired, minimum)
        }
        (desired, minimum) => {
            if desired.is_none() {
                causes.push(Cause::new("desired_replicas", "is required"));
            }
            if minimum.is_none() {
                causes.push(Cause::new("minimum_replicas", "is required"));
            }
            (0, 0)
        }
    };
    let roll_delay = match &body.roll_delay {
        None => std::time::Duration::ZERO,
        Some(text) => parse_duration(text).unwrap_or_else(|e| {
            causes.push(Cause::new("roll_delay", e));
            std::time::Duration::ZERO
        }),
    };
    for (field, labels) in [
        ("labels", &body.labels),
        ("new_rc_labels", &body.new_rc_labels),
    ] {
        for (at, message) in validate_labels_in(field, labels) {
            causes.push(Cause::new(at, message));
        }
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(causes));
    }

    let new_rc = new_rc.map(|n| RcWithLabels {
        rc: n.rc,
        labels: n.labels,
    });
    let rcs = match (old_rc_id, selector, new_rc_id, new_rc) {
        (Some(old_rc_id), None, Some(new_rc_id), None) => RollRcs::Existing {
            old_rc_id,
            new_rc_id,
        },
        (Some(old_rc_id), None, None, Some(new_rc)) => RollRcs::NewRc { old_rc_id, new_rc },
        (None, Some(old_rc_selector), None, Some(new_rc)) => RollRcs::NewRcOverSelector {
            old_rc_selector,
            new_rc,
        },
        _ => return Err(ApiError::internal("validated roll request has no form")),
    };
    Ok(RollPlan {
        rcs,
        desired_replicas: desired,
        minimum_replicas: minimum,
        leave_old: body.leave_old,
        roll_delay,
        roll_labels: body.labels,
        new_rc_labels: body.new_rc_labels,
    })
}

fn creation_error(err: CreateRollError) -> ApiError {
    let message = err.to_string();
    match err {
        CreateRollError::RcMissing { field, .. } => ApiError::invalid([Cause::new(field, message)]),
        CreateRollError::SameRc(_) => ApiError::invalid([Cause::new("new_rc_id", message)]),
        CreateRollError::LeaveOldWithoutOld(_) => {
            ApiError::invalid([Cause::new("leave_old", message)])
        }
        CreateRollError::Ambiguous { .. }
        | CreateRollError::Locked { .. }
        | CreateRollError::InProgress { .. }
        | CreateRollError::Changed(_) => ApiError::conflict(message),
        CreateRollError::Store(e) => e.into(),
    }
}

/// Builds roll views for one request, reading the pod labels once and each pod's health
/// records at most once however many rolls are shown.
struct Views {
    kv: Arc<dyn KvStore>,
    rcs: RcStore,
    roll_labels: BTreeMap<String, Labels>,
    /// Every pod, by the RC id it is labeled with.
    pods_by_rc: HashMap<String, Vec<PodLocation>>,
    /// Health by node, per pod id, filled on first use.
    health: HashMap<String, HashMap<String, HealthState>>,
}

impl Views {
    async fn load(kv: Arc<dyn KvStore>) -> Result<Self, ApiError> {
        let labels = LabelStore::new(kv.clone());
        let (_, pods) = labels.list(LabelType::Pod).await?;
        let mut pods_by_rc: HashMap<String, Vec<PodLocation>> = HashMap::new();
        for pod in pods {
            let Some(rc_id) = pod.labels.get(RC_ID_LABEL) else {
                continue;
            };
            if let Some(location) = PodLocation::from_label_id(&pod.id) {
                pods_by_rc.entry(rc_id.clone()).or_default().push(location);
            }
        }
        let (_, rolls) = labels.list(LabelType::Rolls).await?;
        Ok(Views {
            rcs: RcStore::new(kv.clone()),
            kv,
            roll_labels: rolls.into_iter().map(|l| (l.id, l.labels)).collect(),
            pods_by_rc,
            health: HashMap::new(),
        })
    }

    async fn view(&mut self, record: &RollRecord) -> Result<Roll, ApiError> {
        let roll = &record.value;
        Ok(Roll {
            id: roll.new_rc.clone(),
            old_rc_id: roll.old_rc.clone(),
            new_rc_id: roll.new_rc.clone(),
            desired_replicas: roll.desired_replicas,
            minimum_replicas: roll.minimum_replicas,
            leave_old: roll.leave_old,
            roll_delay: format_duration(roll.roll_delay),
            labels: self
                .roll_labels
                .get(&roll.new_rc)
                .cloned()
                .unwrap_or_default(),
            resource_version: record.index.to_string(),
            progress: RollProgress {
                old: self.progress(&roll.old_rc).await?,
                new: self.progress(&roll.new_rc).await?,
            },
        })
    }

    /// One RC's pods counted by [`PodHealth::of`], as the roll farm counts them; a gone or
    /// unreadable RC wants no manifest, so its labeled pods count, none of them as real.
    async fn progress(&mut self, rc_id: &str) -> Result<RcProgress, ApiError> {
        let rc = match self.rcs.get(rc_id).await {
            Ok(record) => record.map(|r| r.value),
            Err(StoreError::Invalid(why)) => {
                tracing::warn!(rc = %rc_id, %why, "showing an unreadable RC's desired count as unknown");
                None
            }
            Err(e) => return Err(e.into()),
        };
        let pods = self.pods_by_rc.get(rc_id).cloned().unwrap_or_default();
        let reality = PodStore::new(self.kv.clone());
        let mut counts = HealthCounts::default();
        for pod in &pods {
            let Some(rc) = &rc else {
                counts.add(PodHealth::NotReal);
                continue;
            };
            if pod.pod_id() != rc.manifest.pod_id() {
                continue;
            }
            let running = reality
                .get(PodTree::Reality, pod)
                .await?
                .map(|entry| entry.manifest.sha());
            let result = self.health_of(pod.pod_id()).await?.get(pod.node()).copied();
            counts.add(PodHealth::of(
                &rc.manifest.sha(),
                running.as_deref(),
                result,
            ));
        }
        Ok(RcProgress {
            desired: rc.map(|rc| rc.replicas_desired),
            current: counts.current,
            real: counts.real,
            healthy: counts.healthy,
            unknown: counts.unknown,
            unhealthy: counts.unhealthy,
        })
    }

    /// Health by node of one pod id. Records are keyed by their `Node` field, as P2 reads
    /// them; an unreadable record counts as no result.
    async fn health_of(&mut self, pod_id: &str) -> Result<&HashMap<String, HealthState>, ApiError> {
        if !self.health.contains_key(pod_id) {
            let (_, records) = HealthStore::new(self.kv.clone())
                .list_for_pod(pod_id)
                .await?;
            let by_node = records.into_iter().map(|(node, r)| (node, r.state()));
            self.health.insert(pod_id.to_owned(), by_node.collect());
        }
        Ok(&self.health[pod_id])
    }
}
