//! Pod health: node agents report each pod's health here, and rolls and daemon sets read it.
//!
//! Reports are stored at `health/<pod_id>/<node>` exactly as P2's preparer writes them (Go
//! field names, `Time` now, `Expires` a century ahead), so P2's own farms read them too.
//! Unlike the preparer's, these records are written without a session: they stay until the
//! next report or a DELETE, so an agent must keep reporting, and withdraw a stopped pod's
//! record, rather than rely on its record vanishing.

use std::time::SystemTime;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::{error_at, index_header};
use crate::api::extract::{ApiJson, ApiPath, NoQuery};
use crate::api::list_query::{ListParams, ListQuery};
use crate::api::paging::Page;
use crate::api::preconditions::{etag, unless_stale, IfMatch};
use crate::api::reads::{indexed_reader, ConsistentFilter, IndexedReader, ReadParams, ReadQuery};
use crate::app::AppState;
use crate::error::{ApiError, ErrorBody, Violations};
use crate::kv::StoreError;
use crate::labels::{LabelType, Labels};
use crate::layout;
use crate::model::event::Actor;
use crate::model::{HealthState, NodeName, PodId};
use crate::state::{Span, Tree};
use crate::store::health::{HealthEntry, HealthStore};
use crate::store::labels::LabelStore;
use crate::store::pods::{validate_node_name, validate_pod_id, PodLocation};

/// OpenAPI tag of the pod health routes (`health` is the probes').
pub const TAG: &str = "pod-health";

/// A report from a node agent: `{"status": ...}`, or P2's own record, whose `Status` is read
/// and whose times are ignored (the server sets them). The URL names the pod and node: a
/// record naming others is a misrouted report, refused rather than stored as this pod's.
#[derive(Debug, Deserialize, ToSchema)]
pub struct HealthReport {
    /// Exactly one of `passing`, `warning`, `critical` or `unknown`.
    #[serde(alias = "Status")]
    #[schema(value_type = HealthState)]
    pub status: String,
    /// P2's record form: the pod ID; if given and not empty, the URL's.
    #[serde(rename = "Id", alias = "id", default)]
    pub id: Option<String>,
    /// P2's record form: the node; if given and not empty, the URL's.
    #[serde(rename = "Node", alias = "node", default)]
    pub node: Option<String>,
    /// P2's record form: the pod ID again; if given and not empty, the URL's.
    #[serde(rename = "Service", alias = "service", default)]
    pub service: Option<String>,
}

impl HealthReport {
    /// Adds to `violations` each pod or node the report names that the URL does not.
    fn check_names(&self, pod_id: &str, node: &str, violations: &mut Violations) {
        let named = [
            ("Id", &self.id, pod_id),
            ("Node", &self.node, node),
            ("Service", &self.service, pod_id),
        ];
        for (field, named, expected) in named {
            match named.as_deref() {
                Some(named) if !named.is_empty() && named != expected => violations.add(
                    field,
                    format!("names {named:?}, but the URL names {expected:?}"),
                ),
                _ => {}
            }
        }
    }
}

/// One pod's health on one node.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PodHealth {
    #[schema(example = "hello")]
    pub pod_id: String,
    #[schema(example = "node17.example.com")]
    pub node: String,
    pub status: HealthState,
    /// When the result was taken (RFC 3339).
    #[schema(example = "2020-01-14T19:06:40Z")]
    pub time: String,
    /// When it goes stale (RFC 3339); a century ahead, as P2's preparer writes it.
    #[schema(example = "2119-12-21T19:06:40Z")]
    pub expires: String,
    /// The record's modify index; also its `ETag`.
    pub resource_version: String,
}

impl From<HealthEntry> for PodHealth {
    fn from(entry: HealthEntry) -> Self {
        PodHealth {
            status: entry.state(),
            time: entry.record.time,
            expires: entry.record.expires,
            resource_version: entry.index.to_string(),
            pod_id: entry.pod_id,
            node: entry.node,
        }
    }
}

/// The pod health routes, nested under `/api/v1`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_pod_health, put_pod_health, delete_pod_health))
        .routes(routes!(list_pod_health))
}

/// A pod's health on one node.
///
/// Blocks with `?index=&wait=` until the record changes.
#[utoipa::path(
    get,
    path = "/health/{pod_id}/{node}",
    tag = TAG,
    params(
        ("pod_id" = inline(PodId), Path, description = "The pod ID"),
        ("node" = inline(NodeName), Path, description = "The node name"),
        ReadParams
    ),
    responses(
        (status = OK, description = "The last report", body = PodHealth,
            headers(("ETag" = String, description = "The record's modify index"),
                    ("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = NOT_FOUND, description = "No report for this pod on this node", body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a report"))),
        (status = UNPROCESSABLE_ENTITY, description = "The pod ID or node name is not valid, or a bad index or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody)
    )
)]
async fn get_pod_health(
    State(app): State<AppState>,
    query: ReadQuery,
    ApiPath((pod_id, node)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let mut violations = Violations::new();
    let pod = check_pod(&pod_id, &node, &mut violations);
    violations.finish()?;
    let Some(pod) = pod else {
        return Err(ApiError::internal("validation passed without a pod"));
    };
    let spans = [Span::Key(HealthStore::key(&pod))];
    let IndexedReader { kv, index } = indexed_reader(
        &app,
        &[Tree::Health],
        &spans,
        query.consistent,
        query.blocking,
    )
    .await?;
    // A record at the key naming another node is that node's result, not this one's.
    let Some(entry) = HealthStore::new(kv).get(&pod).await? else {
        let missing =
            ApiError::not_found(format!("no health report for pod {pod_id:?} on {node:?}"));
        return Ok(error_at(missing, index));
    };
    let headers = [etag(entry.index), index_header(index)];
    Ok((headers, ApiJson(PodHealth::from(entry))).into_response())
}

/// Reports a pod's health on one node, as a node agent does after every check that changes
/// it.
///
/// Stored in P2's health-tree format. With `If-Match` the report lands only on that
/// version of the record.
#[utoipa::path(
    put,
    path = "/health/{pod_id}/{node}",
    tag = TAG,
    params(
        ("pod_id" = inline(PodId), Path, description = "The pod ID"),
        ("node" = inline(NodeName), Path, description = "The node name"),
        ("If-Match" = Option<String>, Header, nullable = false, description = "Write only if the record is still at this ETag")
    ),
    request_body = HealthReport,
    responses(
        (status = OK, description = "The report as stored", body = PodHealth,
            headers(("ETag" = String, description = "The record's new modify index"))),
        (status = BAD_REQUEST, description = "Malformed JSON or If-Match", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The record changed since the If-Match version", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "The body is not application/json", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "A bad pod ID, node name or status, or a record naming another pod or node", body = ErrorBody),
        (status = CONFLICT, description = "The report kept changing for 5 s", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody)
    )
)]
async fn put_pod_health(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath((pod_id, node)): ApiPath<(String, String)>,
    if_match: IfMatch,
    actor: Actor,
    ApiJson(report): ApiJson<HealthReport>,
) -> Result<impl IntoResponse, ApiError> {
    let mut violations = Violations::new();
    let pod = check_pod(&pod_id, &node, &mut violations);
    let state = parse_status(&report.status, &mut violations);
    report.check_names(&pod_id, &node, &mut violations);
    violations.finish()?;
    let what = format!("health of {pod_id:?} on {node:?}");
    let expected = if_match
        .expected(app.store.as_ref(), &layout::health(&pod_id, &node), &what)
        .await?;
    let (Some(pod), Some(state)) = (pod, state) else {
        return Err(ApiError::internal(
            "validation passed without a pod or a status",
        ));
    };

    let written = app
        .health()
        .put(
            &app.mirror,
            &pod,
            state,
            SystemTime::now(),
            expected,
            &actor,
        )
        .await;
    let entry = unless_stale(written, &what, expected)?;
    Ok(([etag(entry.index)], ApiJson(PodHealth::from(entry))))
}

/// Withdraws a pod's health on one node, as a node agent does once the pod stops.
///
/// Succeeds whether or not there was a report; with `If-Match` only that version is
/// removed.
#[utoipa::path(
    delete,
    path = "/health/{pod_id}/{node}",
    tag = TAG,
    params(
        ("pod_id" = inline(PodId), Path, description = "The pod ID"),
        ("node" = inline(NodeName), Path, description = "The node name"),
        ("If-Match" = Option<String>, Header, nullable = false, description = "Delete only if the record is still at this ETag")
    ),
    responses(
        (status = NO_CONTENT, description = "The report is gone"),
        (status = BAD_REQUEST, description = "Malformed If-Match", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The record changed since the If-Match version", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The pod ID or node name is not valid", body = ErrorBody),
        (status = CONFLICT, description = "The report kept changing for 5 s", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody)
    )
)]
async fn delete_pod_health(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath((pod_id, node)): ApiPath<(String, String)>,
    if_match: IfMatch,
    actor: Actor,
) -> Result<StatusCode, ApiError> {
    let mut violations = Violations::new();
    let pod = check_pod(&pod_id, &node, &mut violations);
    violations.finish()?;
    let what = format!("health of {pod_id:?} on {node:?}");
    let expected = if_match
        .expected(app.store.as_ref(), &layout::health(&pod_id, &node), &what)
        .await?;
    let Some(pod) = pod else {
        return Err(ApiError::internal("validation passed without a pod"));
    };
    let deleted = app
        .health()
        .delete(&app.mirror, &pod, expected, &actor)
        .await;
    unless_stale(deleted, &what, expected)?;
    Ok(StatusCode::NO_CONTENT)
}

/// A pod's health on every node that reported it, sorted by node.
///
/// `selector` matches the labels of the pod on each node. Blocks with `?index=&wait=` until
/// one of the pod's records changes (or, with a selector, the pod's labels on a node a
/// record names), even at an index other pods' changes have moved past.
#[utoipa::path(
    get,
    path = "/health/{pod_id}",
    tag = TAG,
    params(("pod_id" = inline(PodId), Path, description = "The pod ID"), ListParams, ConsistentFilter),
    responses(
        (status = OK, description = "One page of reports", body = Page<PodHealth>,
            headers(("X-Index" = u64, description = "Index of the pod's health records; pass it back as `index` to block"))),
        (status = BAD_REQUEST, description = "The query string does not parse", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "A bad pod ID, selector, limit, continue token, index or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody)
    )
)]
async fn list_pod_health(
    State(app): State<AppState>,
    ApiPath(pod_id): ApiPath<String>,
    query: Result<ListQuery<ConsistentFilter>, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    let mut violations = Violations::new();
    if let Err(e) = validate_pod_id(&pod_id) {
        violations.add("pod_id", e);
    }
    let query = violations.finish_with(query)?;

    let by_labels = !query.selector.is_everything();
    let mut spans = vec![Span::Prefix(HealthStore::prefix(Some(&pod_id)))];
    let mut trees = vec![Tree::Health];
    if by_labels {
        spans.push(Span::ReportedPodLabels {
            pod_id: pod_id.clone(),
        });
        trees.push(Tree::Labels(LabelType::Pod));
    }
    // The index is taken before anything is read: a write landing between the reads below
    // is in the answer or above it, never claimed without being shown.
    let IndexedReader { kv, index } = indexed_reader(
        &app,
        &trees,
        &spans,
        query.filter.consistent(),
        query.blocking,
    )
    .await?;
    let (_, by_node) = HealthStore::new(kv.clone()).list_for_pod(&pod_id).await?;
    let mut reports: Vec<PodHealth> = by_node.into_values().map(PodHealth::from).collect();
    if by_labels {
        // The labels of the reported pods only, each read by key: the pod's cost, not the
        // fleet's. A pod without labels (or with unreadable ones, or a record's node no key
        // can name) has the empty set, which a selector such as `!k` matches.
        let labels = LabelStore::new(kv);
        let mut matching = Vec::with_capacity(reports.len());
        for report in reports {
            let pod = PodLocation::stored(&report.node, &report.pod_id);
            let pod_labels = match labels.get(LabelType::Pod, &pod.label_id()).await {
                Ok(record) => record.value,
                Err(StoreError::Invalid(_)) => Labels::new(),
                Err(e) => return Err(e.into()),
            };
            if query.selector.matches(&pod_labels) {
                matching.push(report);
            }
        }
        reports = matching;
    }
    let page = query
        .paging
        .page(reports, |report: &PodHealth| &report.node);
    Ok(([index_header(index)], ApiJson(page)))
}

/// The pod and node of a URL, or `None` with every problem added to `violations`.
fn check_pod(pod_id: &str, node: &str, violations: &mut Violations) -> Option<PodLocation> {
    match (validate_pod_id(pod_id), validate_node_name(node)) {
        (Ok(()), Ok(())) => PodLocation::new(node, pod_id).ok(),
        (pod_check, node_check) => {
            if let Err(e) = pod_check {
                violations.add("pod_id", e);
            }
            if let Err(e) = node_check {
                violations.add("node", e);
            }
            None
        }
    }
}

/// A reported status; only the four states P2 knows, spelled exactly, are accepted.
fn parse_status(status: &str, violations: &mut Violations) -> Option<HealthState> {
    let state = match status {
        "passing" => HealthState::Passing,
        "warning" => HealthState::Warning,
        "critical" => HealthState::Critical,
        "unknown" => HealthState::Unknown,
        other => {
            violations.add(
                "status",
                format!("must be passing, warning, critical or unknown, not {other:?}"),
            );
            return None;
        }
    };
    Some(state)
}
