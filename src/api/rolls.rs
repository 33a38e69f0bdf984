//! Rolling updates over HTTP: create (in P2's three forms), list, read with progress, cancel.
//!
//! Status choices for refused creations:
//! - 422 (`Invalid`, with a cause naming the field) when the request itself cannot work: a
//!   bad field, an RC id that names no RC (the RC is referenced by the body, not addressed by
//!   the URL, so this is not a 404), the same RC on both sides, a `pod_id` in
//!   `new_rc_labels` other than the existing new RC's manifest id, or `leave_old` when the
//!   selector found no old RC to leave.
//! - 409 (`Conflict`) when the request is fine but the current state is in the way and may
//!   change: another roll over either RC, another creation holding an RC's update-creation
//!   lock, an old-RC selector matching more than one RC, or a change between the checks and
//!   the commit.
//! - 500 (`UnreadableDocument`) when an RC the roll would be over is stored but cannot be
//!   decoded, as for every other request over that RC: the request is fine, the document is
//!   not, and deleting the RC clears it. So too while any stored roll cannot be decoded (it
//!   may name either RC as its old one; P2 refuses every creation then): deleting the roll
//!   clears it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::{error_at, index_header};
use crate::api::extract::{ApiJson, ApiPath, NoQuery};
use crate::api::list_query::{ListFilter, ListParams, ListQuery};
use crate::api::paging::Page;
use crate::api::preconditions::{etag, IfMatch};
use crate::api::query_values::{not_of_kind, one_of};
use crate::api::reads::{
    current_mirror, current_reader, indexed_source, IndexedReader, ReadParams, ReadQuery,
};
use crate::api::responses::{created, read_back};
use crate::app::AppState;
use crate::error::{ApiError, Cause, ErrorBody, Violations};
use crate::kv::{KvStore, StoreError};
use crate::labels::{LabelType, Labels, RC_ID_LABEL};
use crate::layout;
use crate::model::conditions::Condition;
use crate::model::duration::format_duration;
use crate::model::event::{
    Actor, FinishedRoll, ObjectKind, RcProgress, RollOutcome, RollProgress, StoredRollFields,
};
use crate::model::{CreateRoll, HealthCounts, HealthState, PodHealth, RollId};
use crate::state::{Mirror, Span, Tree};
use crate::store::conditions::read_conditions;
use crate::store::events::{deleted_ops, read_meta};
use crate::store::health::HealthStore;
use crate::store::labels::LabelStore;
use crate::store::pods::{PodLocation, PodStore, PodTree};
use crate::store::rcs::RcStore;
use crate::store::roll_creation::CreateRollError;
use crate::store::rolls::{decode_finished, RollRecord, RollStore, RollToDelete};
use crate::store::update::update_with_retry;
use crate::store::Versioned;

/// OpenAPI tag of the roll routes.
pub const TAG: &str = "rolls";

/// The roll routes.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_roll, list_rolls))
        .routes(routes!(get_roll, delete_roll))
}

/// A rolling update with its progress: a running one, or a finished one (kept for
/// `--event-retention-age`) with its outcome and final progress.
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
    /// The roll document's modify index; also its `ETag`. For a finished roll, that of its
    /// finished record.
    pub resource_version: String,
    /// How far the roll has come; for a finished roll, how far it came.
    pub progress: RollProgress,
    /// `Progressing` and `Stalled`, as the leader's roll farm last computed them; empty until
    /// a leader's farm has looked at the roll (or when another farm owns it).
    #[serde(default)]
    #[schema(required = true)]
    pub conditions: Vec<Condition>,
    /// When the roll was created (it started then), if through this server.
    #[schema(format = DateTime, required = true)]
    pub created: Option<String>,
    /// When the roll document last changed through this server; for a finished roll,
    /// when it ended.
    #[schema(format = DateTime, required = true)]
    pub modified: Option<String>,
    /// `null` while the roll runs; how it ended once finished.
    #[schema(required = true)]
    pub outcome: Option<RollOutcome>,
    /// When it ended; `null` while it runs.
    #[schema(format = DateTime, required = true)]
    pub ended: Option<String>,
}

/// Which rolls a listing shows.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RollFilter {
    /// `active` (the default: rolls still running), `finished` (kept for the retention
    /// period) or `all`.
    #[param(inline, value_type = Option<RollState>)]
    state: Option<String>,
    /// Read through to the store rather than from this server's mirror of it.
    consistent: Option<bool>,
}

/// Which rolls a listing shows: those running, those finished, or all.
// Only for the document: the filter takes the text, so that any other value is listed
// with the query's other faults.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
enum RollState {
    Active,
    Finished,
    All,
}

impl ListFilter for RollFilter {
    fn check(&self, violations: &mut Violations) {
        const STATES: [&str; 3] = ["active", "finished", "all"];
        if let Some(state) = self.state.as_deref().filter(|s| !STATES.contains(s)) {
            violations.add("state", not_of_kind(one_of(&STATES), state));
        }
    }
}

impl RollFilter {
    fn active(&self) -> bool {
        matches!(self.state.as_deref(), None | Some("active" | "all"))
    }

    fn finished(&self) -> bool {
        matches!(self.state.as_deref(), Some("finished" | "all"))
    }

    fn consistent(&self) -> bool {
        self.consistent.unwrap_or(false)
    }
}

impl Roll {
    /// The view of `roll` at `index` with its `labels` and `progress`; as for a running roll
    /// with no conditions or times known, which the callers add.
    fn of(roll: &StoredRollFields, labels: Labels, index: u64, progress: RollProgress) -> Roll {
        Roll {
            id: roll.new_rc.clone(),
            old_rc_id: roll.old_rc.clone(),
            new_rc_id: roll.new_rc.clone(),
            desired_replicas: roll.desired_replicas,
            minimum_replicas: roll.minimum_replicas,
            leave_old: roll.leave_old,
            roll_delay: format_duration(roll.roll_delay),
            labels,
            resource_version: index.to_string(),
            progress,
            conditions: Vec::new(),
            created: None,
            modified: None,
            outcome: None,
            ended: None,
        }
    }

    /// The view of a finished roll.
    fn finished(record: &Versioned<FinishedRoll>) -> Roll {
        let done = &record.value;
        Roll {
            created: done.started.clone(),
            modified: Some(done.ended.clone()),
            outcome: Some(done.outcome),
            ended: Some(done.ended.clone()),
            ..Roll::of(
                &done.roll,
                done.labels.clone(),
                record.index,
                done.progress.clone(),
            )
        }
    }
}

/// Path of one roll.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RollPath {
    /// The roll's id (the new RC's id).
    #[param(inline)]
    pub id: RollId,
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
        (status = CONFLICT, description = "Another roll is over, or being created over, one of the RCs; the old-RC selector is ambiguous; or an RC the roll is over was changed or deleted between the checks and the commit, and nothing was written", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "The body is not application/json", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Invalid fields, every one listed; a named RC does not exist; leave_old without an old RC; or a new_rc.manifest too large for the roll's one write, which also holds an existing old RC again, its manifest included (the cause says how large it may be)", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "An RC named, or matched by the old-RC selector, or any stored roll cannot be decoded (reason `UnreadableDocument`); DELETE of that RC or roll removes it", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn create_roll(
    State(app): State<AppState>,
    _: NoQuery,
    actor: Actor,
    ApiJson(body): ApiJson<CreateRoll>,
) -> Result<Response, ApiError> {
    let plan = body.validate(&app.validation).map_err(ApiError::invalid)?;
    let labels = plan.roll_labels.clone();
    let record = app
        .roll_creator()
        .create(plan, &actor)
        .await
        .map_err(creation_error)?;
    let view = read_back("roll", current_view(&app, &record), || {
        let spec = (&record.value).into();
        Roll::of(&spec, labels, record.index, RollProgress::default())
    })
    .await;
    created(&format!("/api/v1/rolls/{}", view.id), record.index, view)
}

/// Lists rolling updates with their progress, sorted by id: the running ones, or with
/// `state` the finished ones or both (a finished roll whose id a running roll has again is
/// left out).
///
/// `selector` matches the roll's labels. Blocks with `?index=&wait=` until a roll, its
/// labels, its times, either RC, their pods or the pods' health or what their nodes run
/// change: everything the answer shows. Served from the server's mirror of the store unless
/// `?consistent=true` (see `X-Index`).
#[utoipa::path(
    get,
    path = "/api/v1/rolls",
    tag = TAG,
    params(RollFilter, ListParams),
    responses(
        (status = OK, description = "One page of rolls", body = Page<Roll>,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Bad state, selector, limit, continue token or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn list_rolls(
    State(app): State<AppState>,
    query: ListQuery<RollFilter>,
) -> Result<Response, ApiError> {
    let finished = query.filter.finished();
    let (IndexedReader { kv, index }, mirror) = indexed_source(
        &app,
        &roll_trees(finished),
        &[],
        query.filter.consistent(),
        query.blocking,
    )
    .await?;
    let (_, records) = RollStore::new(kv.clone()).list().await?;
    let mut views = Views::of_every_roll(kv.clone(), mirror).await?;
    let mut items = Vec::with_capacity(records.len());
    if query.filter.active() {
        for record in &records {
            items.push(views.view(record).await?);
        }
    }
    if finished {
        let running: Vec<&str> = records.iter().map(|r| r.value.new_rc.as_str()).collect();
        let listing = kv.list(layout::ROLL_HISTORY).await?;
        items.extend(
            listing
                .pairs
                .iter()
                .filter_map(decode_finished)
                .map(|record| Roll::finished(&record))
                .filter(|roll| !running.contains(&roll.id.as_str())),
        );
    }
    items.retain(|roll| query.selector.matches(&roll.labels));
    items.sort_by(|a, b| a.id.cmp(&b.id));
    let page = query.paging.page(items, |roll| roll.id.as_str());
    Ok(([index_header(index)], ApiJson(page)).into_response())
}

/// Reads one rolling update with its progress: a running one, else a finished one kept
/// for the retention period, with its outcome.
///
/// Served from the server's mirror of the store unless `?consistent=true` (see `X-Index`).
/// Blocks with `?index=&wait=` until the roll, its labels, its conditions, its finished
/// record, either RC, their pods' labels, what the pods' nodes run or the pods' health
/// change: not at other rolls' or pods' changes, even at an index they have moved past.
#[utoipa::path(
    get,
    path = "/api/v1/rolls/{id}",
    tag = TAG,
    params(RollPath, ReadParams),
    responses(
        (status = OK, description = "The roll", body = Roll,
            headers(("ETag" = String, description = "The roll's modify index"),
                    ("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = NOT_FOUND, description = "No such roll", body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for the roll to come back"))),
        (status = UNPROCESSABLE_ENTITY, description = "The id is not a UUID, or a bad index or wait", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The stored roll cannot be decoded (reason `UnreadableDocument`); DELETE removes it", body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for it to be mended"))),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn get_roll(
    State(app): State<AppState>,
    query: ReadQuery,
    ApiPath(RollPath { id }): ApiPath<RollPath>,
) -> Result<Response, ApiError> {
    let id = id.to_string();
    let (IndexedReader { kv, index }, mirror) = indexed_source(
        &app,
        &roll_trees(true),
        &view_spans(&id),
        query.consistent,
        query.blocking,
    )
    .await?;
    let rolls = RollStore::new(kv.clone());
    let (version, view) = match rolls.get(&id).await {
        Ok(Some(record)) => (record.index, Views::new(kv, mirror).view(&record).await?),
        Ok(None) => {
            let Some(finished) = rolls.finished(&id).await? else {
                return Ok(error_at(not_found(&id), index));
            };
            (finished.index, Roll::finished(&finished))
        }
        // The document is broken, not the request.
        Err(StoreError::Invalid(why)) => {
            let message = format!("{why}; DELETE /api/v1/rolls/{id} removes it");
            return Ok(error_at(ApiError::unreadable(message), index));
        }
        Err(e) => return Err(e.into()),
    };
    Ok(([etag(version), index_header(index)], ApiJson(view)).into_response())
}

/// Cancels a rolling update: deletes the roll and its labels, leaving both RCs as they are.
///
/// A roll farm running it stops; the RCs keep their current replica counts. The roll stays
/// readable as finished, `cancelled`, with its progress at the time, for the retention
/// period.
#[utoipa::path(
    delete,
    path = "/api/v1/rolls/{id}",
    tag = TAG,
    params(RollPath,
        ("If-Match" = Option<String>, Header, nullable = false, description = "Delete only if the roll's ETag is still this")),
    responses(
        (status = NO_CONTENT, description = "The roll is gone"),
        (status = BAD_REQUEST, description = "If-Match is not an ETag", body = ErrorBody),
        (status = NOT_FOUND, description = "No running roll of that id (the message says so of one that has finished)", body = ErrorBody),
        (status = CONFLICT, description = "It kept changing for 5 s", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The roll changed since the If-Match version", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The id is not a UUID", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn delete_roll(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(RollPath { id }): ApiPath<RollPath>,
    if_match: IfMatch,
    actor: Actor,
) -> Result<StatusCode, ApiError> {
    let id = id.to_string();
    let what = format!("rolling update {id}");
    let expected = if_match
        .expected(app.store.as_ref(), &layout::roll(&id), &what)
        .await?;
    let rolls = app.rolls();
    let (state, rolls, id, actor) = (&app, &rolls, &id, &actor);
    let read = || async move {
        match rolls.get_for_delete(id).await? {
            Some(current) => Ok(current),
            None => Err(not_running(rolls, id).await),
        }
    };
    // The record and the check-and-set come from one read: a roll deleted and created again
    // since is another roll, which the next attempt reads and records.
    let write = |current: Versioned<RollToDelete>| async move {
        let mut ops = RollStore::delete_at_ops(id, &current);
        // An unreadable roll leaves no finished record, there being no roll to keep; its
        // deletion is an event all the same, as an unreadable RC's or daemon set's is.
        if let Some(roll) = current.value.roll {
            let record = RollRecord {
                value: roll,
                index: current.index,
            };
            // The pods as the view counts them; the RCs' counts as the store holds them,
            // checked in the transaction: those the cancel leaves them at.
            let mut progress = current_view(state, &record).await?.progress;
            let (desired, unchanged) = rolls.desired_now(&record.value).await?;
            [progress.old.desired, progress.new.desired] = desired;
            ops.extend(unchanged);
            ops.extend(
                rolls
                    .finished_ops(
                        &record.value,
                        &current.value.labels.value,
                        RollOutcome::Cancelled,
                        progress,
                        actor,
                        None,
                    )
                    .await?,
            );
        } else {
            let none = serde_json::Value::Null;
            let kind = ObjectKind::Rolls;
            ops.extend(deleted_ops(state.store.as_ref(), kind, id, &none, actor).await?);
        }
        Ok(state.store.txn(&ops).await.map(drop))
    };
    update_with_retry(&what, expected, read, write).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The trees a roll's view is made of (its document and labels, both RCs, their pods,
/// what the nodes run, the pods' health, and the farms' conditions, written after the pass
/// that saw the rest change or once a deadline passes with nothing else changing), and the
/// finished rolls' when they are shown (only then: a read that does not show them is not
/// woken by their changes). A read's `X-Index` is what they hold (`reads::mirror_index`).
/// The rolls' times too: written with a roll, but delivered by a watch of their own tree,
/// maybe after it, so that an answer claims a roll's change only with them.
fn roll_trees(finished: bool) -> Vec<Tree> {
    let mut trees = vec![
        Tree::Rolls,
        Tree::Meta,
        Tree::Labels(LabelType::Rolls),
        Tree::Rcs,
        Tree::Labels(LabelType::Pod),
        Tree::Reality,
        Tree::Health,
        Tree::Conditions,
    ];
    if finished {
        trees.push(Tree::RollHistory);
    }
    trees
}

/// What one roll's view is made of, within [`roll_trees`]: a read of it blocked on
/// `?index=` is woken by a change of these (its times among them), not by every change of
/// the fleet.
fn view_spans(id: &str) -> [Span; 6] {
    [
        Span::Prefix(layout::roll(id)),
        Span::Prefix(layout::meta(ObjectKind::Rolls, id)),
        Span::Prefix(layout::labels(LabelType::Rolls, id)),
        Span::Prefix(layout::conditions(ObjectKind::Rolls, id)),
        Span::Prefix(layout::roll_history(id)),
        Span::RollRcs {
            roll_id: id.to_owned(),
        },
    ]
}

/// The view of a roll just read or written for a write's answer or record, from the mirror
/// (which holds this server's own writes at once) unless it cannot be trusted.
async fn current_view(app: &AppState, record: &RollRecord) -> Result<Roll, ApiError> {
    Views::new(current_reader(app), current_mirror(app))
        .view(record)
        .await
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("no rolling update {id} exists"))
}

/// The 404 of a cancel finding no running roll: one that has finished, which a GET still
/// shows, is named as finished rather than as unknown.
async fn not_running(rolls: &RollStore, id: &str) -> ApiError {
    let outcome = match rolls.finished(id).await {
        Ok(Some(finished)) => finished.value.outcome,
        Ok(None) => return not_found(id),
        Err(e) => return e.into(),
    };
    let outcome = match outcome {
        RollOutcome::Succeeded => "succeeded",
        RollOutcome::Cancelled => "cancelled",
        RollOutcome::Failed => "failed",
    };
    ApiError::not_found(format!(
        "rolling update {id} has already finished ({outcome}): there is nothing to cancel"
    ))
}

fn creation_error(err: CreateRollError) -> ApiError {
    let message = err.to_string();
    match err {
        CreateRollError::RcMissing { field, .. } => ApiError::invalid([Cause::new(field, message)]),
        CreateRollError::UnreadableRc { id, .. } => {
            ApiError::unreadable(format!("{message}; DELETE /api/v1/rcs/{id} removes it"))
        }
        CreateRollError::UnreadableRoll { id, .. } => {
            ApiError::unreadable(format!("{message}; DELETE /api/v1/rolls/{id} removes it"))
        }
        CreateRollError::SameRc(_) => ApiError::invalid([Cause::new("new_rc_id", message)]),
        CreateRollError::PodIdLabel(_) => {
            ApiError::invalid([Cause::new("new_rc_labels.pod_id", message)])
        }
        CreateRollError::LeaveOldWithoutOld(_) => {
            ApiError::invalid([Cause::new("leave_old", message)])
        }
        CreateRollError::Ambiguous { .. }
        | CreateRollError::Locked { .. }
        | CreateRollError::InProgress { .. }
        | CreateRollError::Changed(_) => ApiError::conflict(message),
        CreateRollError::ManifestTooLarge(cause) => {
            ApiError::invalid([Cause::new(format!("new_rc.{}", cause.field), cause.message)])
        }
        CreateRollError::Store(e) => e.into(),
    }
}

/// Builds roll views for one request, each RC's pods and each pod's health records read at
/// most once however many rolls are shown. A view costs what its two RCs' pods cost: from
/// the mirror, they are found through its index of pods by RC; the store has no such index,
/// so one listing of the pod labels, read on first use, serves every RC shown.
struct Views {
    kv: Arc<dyn KvStore>,
    rcs: RcStore,
    /// Every roll's labels, when a listing shows them all; else each roll's read by key.
    roll_labels: Option<BTreeMap<String, Labels>>,
    /// Where each RC's pods are found.
    pods: PodsByRc,
    /// Health by node, per pod id, filled on first use.
    health: HashMap<String, HashMap<String, HealthState>>,
}

/// Where [`Views`] finds the pods labeled with an RC's id.
enum PodsByRc {
    /// The mirror's index of pods by RC.
    Mirror(Mirror),
    /// Every pod, by the RC id it is labeled with, once listed from the store.
    Listed(Option<HashMap<String, Vec<PodLocation>>>),
}

impl Views {
    /// Views of single rolls read through `kv`, which reads `mirror` when given.
    fn new(kv: Arc<dyn KvStore>, mirror: Option<&Mirror>) -> Self {
        Views {
            rcs: RcStore::new(kv.clone()),
            kv,
            roll_labels: None,
            pods: match mirror {
                Some(mirror) => PodsByRc::Mirror(mirror.clone()),
                None => PodsByRc::Listed(None),
            },
            health: HashMap::new(),
        }
    }

    /// As [`Views::new`], for a listing of every roll: their labels read in one listing.
    async fn of_every_roll(
        kv: Arc<dyn KvStore>,
        mirror: Option<&Mirror>,
    ) -> Result<Self, ApiError> {
        let (_, rolls) = LabelStore::new(kv.clone()).list(LabelType::Rolls).await?;
        Ok(Views {
            roll_labels: Some(rolls.into_iter().map(|l| (l.id, l.labels)).collect()),
            ..Views::new(kv, mirror)
        })
    }

    /// The labels of the roll `id`.
    async fn roll_labels(&self, id: &str) -> Result<Labels, ApiError> {
        Ok(match &self.roll_labels {
            Some(all) => all.get(id).cloned().unwrap_or_default(),
            None => {
                let labels = LabelStore::new(self.kv.clone());
                labels.get(LabelType::Rolls, id).await?.value
            }
        })
    }

    /// The pods labeled with the RC `rc_id`, sorted.
    async fn pods_of_rc(&mut self, rc_id: &str) -> Result<Vec<PodLocation>, ApiError> {
        let listed = match &mut self.pods {
            PodsByRc::Mirror(mirror) => {
                let ids = mirror.pods_of_rc(rc_id);
                return Ok(ids
                    .iter()
                    .filter_map(|id| PodLocation::from_label_id(id))
                    .collect());
            }
            PodsByRc::Listed(listed) => listed,
        };
        if listed.is_none() {
            let (_, pods) = LabelStore::new(self.kv.clone())
                .list(LabelType::Pod)
                .await?;
            let mut by_rc: HashMap<String, Vec<PodLocation>> = HashMap::new();
            for pod in pods {
                let Some(rc_id) = pod.labels.get(RC_ID_LABEL) else {
                    continue;
                };
                if let Some(location) = PodLocation::from_label_id(&pod.id) {
                    by_rc.entry(rc_id.clone()).or_default().push(location);
                }
            }
            *listed = Some(by_rc);
        }
        let pods = listed.as_ref().and_then(|by_rc| by_rc.get(rc_id));
        Ok(pods.cloned().unwrap_or_default())
    }

    async fn view(&mut self, record: &RollRecord) -> Result<Roll, ApiError> {
        let roll = &record.value;
        let meta = read_meta(
            self.kv.as_ref(),
            &layout::meta(ObjectKind::Rolls, &roll.new_rc),
        )
        .await?;
        let labels = self.roll_labels(&roll.new_rc).await?;
        let progress = RollProgress {
            old: self.progress(&roll.old_rc).await?,
            new: self.progress(&roll.new_rc).await?,
        };
        // A roll's document is written once, when it is created (neither P2 nor this server
        // rewrites it), so its index tells it from an earlier roll over the same new RC.
        let conditions = read_conditions(self.kv.as_ref(), ObjectKind::Rolls, &roll.new_rc)
            .await?
            .into_iter()
            .filter(|c| c.is_of(record.index))
            .collect();
        Ok(Roll {
            conditions,
            created: meta.as_ref().and_then(|m| m.created.clone()),
            modified: meta.map(|m| m.modified),
            ..Roll::of(&roll.into(), labels, record.index, progress)
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
        let pods = self.pods_of_rc(rc_id).await?;
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
        Ok(RcProgress::new(rc.map(|rc| rc.replicas_desired), counts))
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
