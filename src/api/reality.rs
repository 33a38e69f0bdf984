//! Pod manifests as node agents see them: the intent a node reads and the reality it reports.
//!
//! Both trees hold a manifest's raw YAML bytes (`intent/<node>/<pod_id>`,
//! `reality/<node>/<pod_id>`), so these routes speak raw YAML rather than JSON: a GET answers
//! the stored bytes as `application/yaml`, and a PUT takes the manifest as the body
//! (`application/yaml`, `application/x-yaml`, `text/yaml` or `text/plain`) and stores it byte
//! for byte, signatures included, as P2's preparer does. Errors are the usual JSON body.
//!
//! The intent is read-only here: the farms write it, and a node agent (or the simulator)
//! reads it to learn what to install. Reality writes are unconditional, like the preparer's,
//! unless they carry `If-Match`, and a DELETE of an absent pod succeeds, so an agent may
//! repeat any report.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::{error_at, index_header};
use crate::api::extract::{ApiPath, NoQuery};
use crate::api::preconditions::{etag, unless_stale, IfMatch};
use crate::api::reads::{indexed_reader, IndexedReader, ReadParams, ReadQuery};
use crate::app::AppState;
use crate::error::{ApiError, Cause, ErrorBody, Violations};
use crate::model::event::Actor;
use crate::model::manifest::errors_at;
use crate::model::{Manifest, NodeName, PodId};
use crate::state::{Span, Tree};
use crate::store::pods::{validate_node_name, validate_pod_id, PodLocation, PodTree};
use crate::store::reports::Report;

/// OpenAPI tag of the reality routes (the intent route is under the pods tag).
pub const TAG: &str = "reality";

/// The media type manifests are answered with.
pub const YAML: &str = "application/yaml";

/// Media types a manifest body may be sent as; YAML has had several names. `put_reality`'s
/// request body lists them again for the document, which a contract test holds to these.
const YAML_TYPES: [&str; 4] = [YAML, "application/x-yaml", "text/yaml", "text/plain"];

/// The reality routes and the intent read, nested under `/api/v1`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_reality, put_reality, delete_reality))
        .routes(routes!(get_intent))
}

/// A manifest body: UTF-8 text sent with a YAML media type (`application/yaml`,
/// `application/x-yaml`, `text/yaml` or `text/plain`).
pub struct YamlBody(pub String);

impl<S: Send + Sync> FromRequest<S> for YamlBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let media_type = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_default();
        if !YAML_TYPES.contains(&media_type.as_str()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "a manifest must be sent as raw YAML, with Content-Type one of {}",
                    YAML_TYPES.join(", ")
                ),
            ));
        }
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::new(e.status(), e.body_text()))?;
        String::from_utf8(bytes.into())
            .map(YamlBody)
            .map_err(|_| ApiError::bad_request("a manifest must be UTF-8 text"))
    }
}

const NODE_DOC: &str = "The node name";
const POD_ID_DOC: &str = "The pod ID (the manifest's `id`)";

/// The manifest a node should run, byte for byte as the farms wrote it.
///
/// Node agents read it after the pod listing (`GET /api/v1/pods`, which carries only the
/// manifest's SHA) shows a change. Blocks with `?index=&wait=` until the intent changes.
#[utoipa::path(
    get,
    path = "/intent/{node}/{pod_id}",
    tag = crate::api::pods::TAG,
    params(("node" = inline(NodeName), Path, description = NODE_DOC), ("pod_id" = inline(PodId), Path, description = POD_ID_DOC), ReadParams),
    responses(
        (status = OK, description = "The intended manifest", body = String, content_type = "application/yaml",
            headers(("ETag" = String, description = "The intent's modify index"),
                    ("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = NOT_FOUND, description = "The pod is not intended on this node", body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for the pod to be intended"))),
        (status = UNPROCESSABLE_ENTITY, description = "The node name or pod ID is not valid, or a bad index or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody)
    )
)]
async fn get_intent(
    State(app): State<AppState>,
    query: ReadQuery,
    ApiPath((node, pod_id)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    read(&app, PodTree::Intent, &node, &pod_id, query).await
}

/// The manifest a node last reported installed, byte for byte.
///
/// Blocks with `?index=&wait=` until the report changes.
#[utoipa::path(
    get,
    path = "/reality/{node}/{pod_id}",
    tag = TAG,
    params(("node" = inline(NodeName), Path, description = NODE_DOC), ("pod_id" = inline(PodId), Path, description = POD_ID_DOC), ReadParams),
    responses(
        (status = OK, description = "The installed manifest", body = String, content_type = "application/yaml",
            headers(("ETag" = String, description = "The report's modify index"),
                    ("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = NOT_FOUND, description = "The node reports no such pod", body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a report"))),
        (status = UNPROCESSABLE_ENTITY, description = "The node name or pod ID is not valid, or a bad index or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody)
    )
)]
async fn get_reality(
    State(app): State<AppState>,
    query: ReadQuery,
    ApiPath((node, pod_id)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    read(&app, PodTree::Reality, &node, &pod_id, query).await
}

/// Reports the manifest a node has installed, as P2's preparer does after each install.
///
/// The body is the manifest's YAML, stored byte for byte; it must be a valid manifest whose
/// `id` is the pod ID in the URL. Rolls count a pod as healthy only when this matches the
/// intended manifest and its health is passing. With `If-Match` the report lands only on
/// that version of it.
#[utoipa::path(
    put,
    path = "/reality/{node}/{pod_id}",
    tag = TAG,
    params(("node" = inline(NodeName), Path, description = NODE_DOC), ("pod_id" = inline(PodId), Path, description = POD_ID_DOC),
        ("If-Match" = Option<String>, Header, nullable = false, description = "Write only if the report is still at this ETag")),
    request_body(description = "The manifest's YAML, under any of the names YAML has had",
        content((String = "application/yaml"), (String = "application/x-yaml"), (String = "text/yaml"), (String = "text/plain"))),
    responses(
        (status = NO_CONTENT, description = "Stored",
            headers(("ETag" = String, description = "The report's new modify index"))),
        (status = BAD_REQUEST, description = "The body is not UTF-8, or a malformed If-Match", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The report changed since the If-Match version", body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "The body is not sent as YAML", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "A bad node name, pod ID or manifest, a manifest of another pod, or one too large for the store's one write (the cause, on `manifest`, says how large it may be)", body = ErrorBody),
        (status = CONFLICT, description = "The report kept changing for 5 s", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody)
    )
)]
async fn put_reality(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath((node, pod_id)): ApiPath<(String, String)>,
    if_match: IfMatch,
    actor: Actor,
    YamlBody(text): YamlBody,
) -> Result<Response, ApiError> {
    let mut violations = Violations::new();
    let pod = check_pod(&node, &pod_id, &mut violations);
    let mut causes = Vec::new();
    match Manifest::parse(&text) {
        Ok(manifest) if manifest.pod_id() != pod_id => causes.push(Cause::new(
            "manifest.id",
            format!(
                "is {:?} but the URL names pod {pod_id:?}; a pod is keyed by its manifest's id",
                manifest.pod_id()
            ),
        )),
        Ok(_) => {}
        Err(errors) => causes.extend(errors_at("manifest", errors).into_iter().map(Cause::from)),
    }
    for cause in causes {
        violations.add(cause.field, cause.message);
    }
    violations.finish()?;
    let pod = pod.ok_or_else(|| ApiError::internal("validation passed without a pod"))?;
    let key = PodTree::Reality.key(&pod);
    let what = format!("the report {key:?}");
    let expected = if_match.expected(app.store.as_ref(), &key, &what).await?;

    let written = Report::reality(&pod)
        .write(
            app.store.as_ref(),
            &app.mirror,
            Some(text.into_bytes()),
            expected,
            &actor,
        )
        .await;
    let index =
        unless_stale(written, &what, expected)?.map_err(|cause| ApiError::invalid([cause]))?;
    Ok((StatusCode::NO_CONTENT, [etag(index)]).into_response())
}

/// Reports that a node no longer runs the pod; succeeds whether or not it was reported.
///
/// With `If-Match` only that version is removed.
#[utoipa::path(
    delete,
    path = "/reality/{node}/{pod_id}",
    tag = TAG,
    params(("node" = inline(NodeName), Path, description = NODE_DOC), ("pod_id" = inline(PodId), Path, description = POD_ID_DOC),
        ("If-Match" = Option<String>, Header, nullable = false, description = "Delete only if the report is still at this ETag")),
    responses(
        (status = NO_CONTENT, description = "The report is gone"),
        (status = BAD_REQUEST, description = "Malformed If-Match", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The report changed since the If-Match version", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The node name or pod ID is not valid", body = ErrorBody),
        (status = CONFLICT, description = "The report kept changing for 5 s", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody)
    )
)]
async fn delete_reality(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath((node, pod_id)): ApiPath<(String, String)>,
    if_match: IfMatch,
    actor: Actor,
) -> Result<StatusCode, ApiError> {
    let pod = valid_pod(&node, &pod_id)?;
    let key = PodTree::Reality.key(&pod);
    let what = format!("the report {key:?}");
    let expected = if_match.expected(app.store.as_ref(), &key, &what).await?;
    let deleted = Report::reality(&pod)
        .write(app.store.as_ref(), &app.mirror, None, expected, &actor)
        .await;
    // A removal carries no manifest to refuse.
    unless_stale(deleted, &what, expected)?.map_err(|cause| ApiError::invalid([cause]))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Answers the raw bytes stored for `pod` in `tree`, or 404; from the mirror unless
/// `consistent`.
async fn read(
    app: &AppState,
    tree: PodTree,
    node: &str,
    pod_id: &str,
    query: ReadQuery,
) -> Result<Response, ApiError> {
    let pod = valid_pod(node, pod_id)?;
    let followed = match tree {
        PodTree::Intent => Tree::Intent,
        PodTree::Reality => Tree::Reality,
    };
    let key = tree.key(&pod);
    let spans = [Span::Key(key.clone())];
    let IndexedReader { kv, index } =
        indexed_reader(app, &[followed], &spans, query.consistent, query.blocking).await?;
    let Some(pair) = kv.get(&key).await? else {
        let what = match tree {
            PodTree::Intent => "intended",
            PodTree::Reality => "reported",
        };
        let missing = ApiError::not_found(format!("pod {pod_id:?} is not {what} on node {node:?}"));
        return Ok(error_at(missing, index));
    };
    let content_type = (CONTENT_TYPE, HeaderValue::from_static(YAML));
    let headers = [content_type, etag(pair.modify_index), index_header(index)];
    Ok((headers, pair.value.to_vec()).into_response())
}

/// The pod a URL names, or a 422 listing every bad part.
fn valid_pod(node: &str, pod_id: &str) -> Result<PodLocation, ApiError> {
    let mut violations = Violations::new();
    let pod = check_pod(node, pod_id, &mut violations);
    violations.finish()?;
    pod.ok_or_else(|| ApiError::internal("validation passed without a pod"))
}

/// The pod of a URL, or `None` with every problem added to `violations`.
fn check_pod(node: &str, pod_id: &str, violations: &mut Violations) -> Option<PodLocation> {
    let node_check = validate_node_name(node);
    let pod_check = validate_pod_id(pod_id);
    if let Err(e) = &node_check {
        violations.add("node", e.clone());
    }
    if let Err(e) = &pod_check {
        violations.add("pod_id", e.clone());
    }
    match (node_check, pod_check) {
        (Ok(()), Ok(())) => PodLocation::new(node, pod_id).ok(),
        _ => None,
    }
}
