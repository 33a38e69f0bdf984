//! P2's own label routes (`/api/labels/...`, `/api/select`), so P2 tools pointed at this
//! server as their HTTP label applicator keep working.
//!
//! Paths, bodies, answers and the 400s for a bad type, id, name or selector are P2's
//! (pkg/labels/label_http_server.go), with these differences:
//! - A bad body is a 4xx with the JSON error body instead of P2's 503: 400 when malformed,
//!   422 when of the wrong shape or when a label breaks Kubernetes' rules (P2 stores such
//!   labels unchecked; they can never be selected). As in P2, the body is read as JSON
//!   whatever its `Content-Type`, or without one.
//! - As in P2, the path after the type is query-unescaped once more after the usual
//!   decoding, because P2's client query-escapes ids and names before putting them in the
//!   path: its `node9%252Fhello` is the pod id `node9/hello`. A `%` in an id or name must
//!   therefore be sent as `%2525` and a `+` as `%252B` (a bare `+` reads as a space); the
//!   `/api/v1/labels` routes decode once.
//! - A pod id `<node>/<pod_id>` works in the path, its `/` sent as is or encoded. A pod id
//!   always has two parts and any other id one, so `/api/labels/pod/{node}/{pod_id}/{name}`
//!   is unambiguous; a label name may carry its prefix's `/` as is or encoded. GET and HEAD
//!   on a label's path answer 405 with `Allow: PUT,DELETE`, as any other method there does.
//! - Writes re-apply themselves on concurrent changes until they land, where P2 gives up
//!   with a 503 after its first check-and-set miss.
//! - `/api/select` over a type with no labels at all answers `[]`: nothing matches an empty
//!   tree, and P2's 404 there keeps its RC farm from ever placing a first pod.
//! - Reads come from the mirror while it follows the store (this server's own writes in it
//!   at once), else from the store, whatever `cachedMatch` and `stale` say: both are accepted
//!   and ignored.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::header::ALLOW;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::index_header;
use crate::api::extract::{
    malformed_json, refuse_duplicate_keys, shaped, ApiJson, ApiPath, ApiQuery, NoQuery,
};
use crate::api::labels::{pod_id_label_doc, shown_labels, UNREADABLE_LABELS_DOC};
use crate::api::reads::{indexed_source, IndexedReader};
use crate::app::AppState;
use crate::error::{ApiError, ErrorBody, Violations};
use crate::labels::validation::{LabelSet, LabelValue};
use crate::labels::{
    label_key_problem, label_value_problem, validate_labels_in, LabelType, Labeled, Labels,
    ParseLabelTypeError, ParseSelectorError, Selector,
};
use crate::model::event::Actor;
use crate::state::Tree;
use crate::store::labels::LabelStore;

/// OpenAPI tag of these routes.
pub const TAG: &str = "p2-labels";

/// One object's labels in P2's shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct P2ObjectLabels {
    /// What kind of object this is.
    #[serde(rename = "type")]
    pub label_type: LabelType,
    /// The object's id within its type.
    pub id: String,
    /// The labels; `{}` when the object has none.
    #[schema(value_type = BTreeMap<String, String>)]
    pub labels: Labels,
    /// The labels' modify index; 0 when no label set is stored (an empty one P2 stored, `{}`
    /// or `null`, has its own).
    pub index: u64,
}

/// Body of `PUT /api/labels/{type}/{id}`: labels to merge into the object's set.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct SetLabelsRequest {
    /// Set on the object, keeping its other labels; `null` (what a Go client sends for a nil
    /// map) changes nothing, but the field must be there.
    #[serde(deserialize_with = "required_nullable")]
    #[schema(value_type = Option<LabelSet>, required = true)]
    pub values: Option<Labels>,
}

/// Body of `PUT /api/labels/{type}/{id}/{name}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct SetLabelRequest {
    /// The label's new value.
    #[schema(value_type = LabelValue)]
    pub value: String,
}

/// Query of `/api/select`.
#[derive(Debug, Default, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SelectParams {
    /// Kubernetes label selector; absent or empty selects every object of the type.
    pub selector: Option<String>,
    /// Label type to search: node, pod, replication_controller, rolls or pod_clusters.
    #[serde(rename = "type")]
    #[param(rename = "type", required = true, value_type = LabelType)]
    pub label_type: Option<String>,
    /// Sent by P2's clients and ignored, whatever its value, as P2's server does.
    #[serde(rename = "cachedMatch")]
    #[param(rename = "cachedMatch")]
    pub cached_match: Option<String>,
}

/// Query of `GET /api/labels/{type}/{id}`.
#[derive(Debug, Default, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReadParams {
    /// Accepted for P2's clients and ignored, whatever its value.
    pub stale: Option<String>,
}

/// With `deserialize_with`, serde treats a missing field as an error even for an `Option`.
fn required_nullable<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Labels>, D::Error> {
    Option::deserialize(deserializer)
}

/// The route of an object's labels and of one label: the paths `{id}` and `{id}/{name}`,
/// told apart by `split_tail`.
pub const OBJECT_ROUTE: &str = "/api/labels/{type}/{*tail}";

/// P2's label routes. The routes on one object take the rest of the path as a catch-all, so
/// a pod's `/` survives, and split it into id and label name by the type's id shape.
pub fn router() -> OpenApiRouter<AppState> {
    // OpenAPI has no catch-all parameter: the object routes are documented at `{id}` and
    // `{id}/{name}`, as the `#[utoipa::path]` of each operation says, and served at `{*tail}`.
    // Any other method is answered by the router's 405, with the Allow of [`allowed_on`].
    let object_routes = OpenApiRouter::with_openapi(ObjectRoutes::openapi()).route(
        OBJECT_ROUTE,
        get(get_p2_labels)
            .put(put_p2_target)
            .delete(delete_p2_target),
    );
    OpenApiRouter::new()
        .routes(routes!(select_p2_labels))
        .routes(routes!(list_p2_labels))
        .merge(object_routes)
}

/// The documentation of the routes on one object.
#[derive(OpenApi)]
#[openapi(paths(
    get_p2_labels,
    put_p2_labels,
    put_p2_label,
    delete_p2_labels,
    delete_p2_label
))]
struct ObjectRoutes;

/// Objects of a type whose labels match a selector, as P2's `/api/select`.
///
/// `cachedMatch`, which P2 clients send, is ignored, as P2's server does. A type with no
/// labels at all answers `[]` (P2 answers 404).
#[utoipa::path(
    get,
    path = "/api/select",
    tag = TAG,
    params(SelectParams),
    responses(
        (status = OK, description = "The matching objects", body = Vec<Labeled>,
            headers(("X-Index" = u64, description = "The index the answer reflects"))),
        (status = BAD_REQUEST, description = "Bad type or selector", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn select_p2_labels(
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<SelectParams>,
) -> Result<impl IntoResponse, ApiError> {
    let label_type = label_type(params.label_type.as_deref().unwrap_or_default())?;
    let selector: Selector = params
        .selector
        .as_deref()
        .unwrap_or_default()
        .parse()
        .map_err(|e: ParseSelectorError| ApiError::bad_request(e.to_string()))?;
    let (labels, index) = mirrored(&app, label_type).await?;
    let matches = labels.matching(label_type, &selector).await?;
    Ok(([index_header(index)], ApiJson(matches)))
}

/// Every labeled object of a type, as P2's `GET /api/labels/{type}`.
///
/// 404 when the type has no labels at all, as in P2.
#[utoipa::path(
    get,
    path = "/api/labels/{type}",
    tag = TAG,
    params(("type" = LabelType, Path, description = "Label type")),
    responses(
        (status = OK, description = "Every labeled object of the type", body = Vec<Labeled>,
            headers(("X-Index" = u64, description = "The index the answer reflects"))),
        (status = BAD_REQUEST, description = "Bad type", body = ErrorBody),
        (status = NOT_FOUND, description = "The type has no labels at all", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn list_p2_labels(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath(type_name): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let label_type = label_type(&type_name)?;
    let (labels, index) = mirrored(&app, label_type).await?;
    let (_, all) = labels.list(label_type).await?;
    if all.is_empty() {
        return Err(ApiError::not_found(format!(
            "no labels found for type {label_type}"
        )));
    }
    Ok(([index_header(index)], ApiJson(all)))
}

/// One object's labels and their index, as P2's `GET /api/labels/{type}/{id}`.
///
/// An object without labels answers `{}` at index 0. `stale` is ignored.
#[utoipa::path(
    get,
    path = "/api/labels/{type}/{id}",
    tag = TAG,
    params(
        ("type" = LabelType, Path, description = "Label type"),
        ("id" = String, Path, description = ID_DOC, min_length = 1),
        ReadParams
    ),
    responses(
        (status = OK, description = "The object's labels", body = P2ObjectLabels,
            headers(("X-Index" = u64, description = "The index the answer reflects"))),
        (status = BAD_REQUEST, description = "Bad type or id", body = ErrorBody),
        (status = METHOD_NOT_ALLOWED, description = "The id has more `/`-separated parts than the type's ids (two for a pod, one for any other type), so the path names a label, which GET does not read", body = ErrorBody,
            headers(("Allow" = String, description = "`PUT,DELETE`, what a label's path takes"))),
        (status = INTERNAL_SERVER_ERROR, description = UNREADABLE_LABELS_DOC, body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn get_p2_labels(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    ApiPath((type_name, tail)): ApiPath<(String, String)>,
    query: Result<ApiQuery<ReadParams>, ApiError>,
) -> Result<Response, ApiError> {
    let label_type = label_type(&type_name)?;
    let (id, name) = split_tail(label_type, &tail)?;
    if name.is_some() {
        // A label's path, whatever its id and name hold: the method is wrong before they are.
        return Ok(not_allowed_on(LABEL_PATH_ALLOWS, method, uri));
    }
    query?;
    check_id(label_type, &id)?;
    let (labels, index) = mirrored(&app, label_type).await?;
    let record = shown_labels(&labels, label_type, &id).await?;
    let labels = P2ObjectLabels {
        label_type,
        id,
        labels: record.value,
        index: record.index,
    };
    Ok(([index_header(index)], ApiJson(labels)).into_response())
}

/// `PUT /api/labels/{type}/{tail}`: one label when the tail names one, else a set. The
/// body is JSON whatever its content type, as P2's server reads it.
async fn put_p2_target(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath((type_name, tail)): ApiPath<(String, String)>,
    actor: Actor,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let target = Target::parse(&type_name, &tail)?;
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    // Read without `ApiJson` (the content type is not checked), but under the same rule on
    // keys named twice: the value kept would be whichever the parser picks.
    refuse_duplicate_keys(&body)?;
    let body: Value = serde_json::from_slice(&body).map_err(malformed_json)?;
    match target.name {
        None => put_p2_labels(&app, &actor, target.label_type, &target.id, shaped(body)?).await,
        Some(name) => {
            let body = shaped(body)?;
            put_p2_label(&app, &actor, target.label_type, &target.id, &name, body).await
        }
    }
}

/// `DELETE /api/labels/{type}/{tail}`: one label when the tail names one, else all of them.
async fn delete_p2_target(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath((type_name, tail)): ApiPath<(String, String)>,
    actor: Actor,
) -> Result<StatusCode, ApiError> {
    let target = Target::parse(&type_name, &tail)?;
    match target.name {
        None => delete_p2_labels(&app, &actor, target.label_type, &target.id).await,
        Some(name) => delete_p2_label(&app, &actor, target.label_type, &target.id, &name).await,
    }
}

/// Merge labels into an object's set, as P2's `PUT /api/labels/{type}/{id}`.
///
/// This **merges**: labels not named in `values` are kept (P2's client calls it a replace;
/// its server, like this one, merges). Use `PUT /api/v1/labels/{type}/{id}` to replace.
#[utoipa::path(
    put,
    path = "/api/labels/{type}/{id}",
    tag = TAG,
    params(
        ("type" = LabelType, Path, description = "Label type"),
        ("id" = String, Path, description = ID_DOC, min_length = 1)
    ),
    request_body = SetLabelsRequest,
    responses(
        (status = NO_CONTENT, description = "The labels are set"),
        (status = BAD_REQUEST, description = "Bad type or id, or malformed JSON", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY,
            description = concat!("Bad body shape or labels; or ", pod_id_label_doc!()),
            body = ErrorBody),
        (status = CONFLICT, description = "The labels kept changing for 5 s", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn put_p2_labels(
    app: &AppState,
    actor: &Actor,
    label_type: LabelType,
    id: &str,
    body: SetLabelsRequest,
) -> Result<StatusCode, ApiError> {
    let values = body.values.unwrap_or_default();
    let mut violations = Violations::new();
    for (field, message) in validate_labels_in("values", &values) {
        violations.add(field, message);
    }
    violations.finish()?;
    store(app)
        .update(label_type, id, None, actor, |labels| {
            labels.extend(values.clone())
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Set one label, as P2's `PUT /api/labels/{type}/{id}/{name}`; the others are kept.
#[utoipa::path(
    put,
    path = "/api/labels/{type}/{id}/{name}",
    tag = TAG,
    params(
        ("type" = LabelType, Path, description = "Label type"),
        ("id" = String, Path, description = ID_DOC, min_length = 1),
        ("name" = String, Path, description = NAME_DOC, min_length = 1)
    ),
    request_body = SetLabelRequest,
    responses(
        (status = NO_CONTENT, description = "The label is set"),
        (status = BAD_REQUEST, description = "Bad type, id or name, or malformed JSON",
            body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY,
            description = concat!("Bad body shape, label name or value; or ", pod_id_label_doc!()),
            body = ErrorBody),
        (status = CONFLICT, description = "The labels kept changing for 5 s", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn put_p2_label(
    app: &AppState,
    actor: &Actor,
    label_type: LabelType,
    id: &str,
    name: &str,
    body: SetLabelRequest,
) -> Result<StatusCode, ApiError> {
    let mut violations = Violations::new();
    if let Some(problem) = label_key_problem(name) {
        violations.add("name", problem);
    }
    if let Some(problem) = label_value_problem(&body.value) {
        violations.add("value", problem);
    }
    violations.finish()?;
    store(app)
        .update(label_type, id, None, actor, |labels| {
            labels.insert(name.to_string(), body.value.clone());
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Remove every label of an object, as P2's `DELETE /api/labels/{type}/{id}`.
#[utoipa::path(
    delete,
    path = "/api/labels/{type}/{id}",
    tag = TAG,
    params(
        ("type" = LabelType, Path, description = "Label type"),
        ("id" = String, Path, description = ID_DOC, min_length = 1)
    ),
    responses(
        (status = NO_CONTENT, description = "The object has no labels any more"),
        (status = BAD_REQUEST, description = "Bad type or id", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = concat!("Refused: ", pod_id_label_doc!()), body = ErrorBody),
        (status = CONFLICT, description = "The labels kept changing for 5 s", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn delete_p2_labels(
    app: &AppState,
    actor: &Actor,
    label_type: LabelType,
    id: &str,
) -> Result<StatusCode, ApiError> {
    store(app).delete(label_type, id, None, actor).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Remove one label, as P2's `DELETE /api/labels/{type}/{id}/{name}`.
///
/// The name is not checked against Kubernetes' rules, so a bad label written by an older
/// tool can still be removed.
#[utoipa::path(
    delete,
    path = "/api/labels/{type}/{id}/{name}",
    tag = TAG,
    params(
        ("type" = LabelType, Path, description = "Label type"),
        ("id" = String, Path, description = ID_DOC, min_length = 1),
        ("name" = String, Path, description = NAME_DOC, min_length = 1)
    ),
    responses(
        (status = NO_CONTENT, description = "The object does not have the label any more"),
        (status = BAD_REQUEST, description = "Bad type, id or name", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = concat!("Refused: ", pod_id_label_doc!()), body = ErrorBody),
        (status = CONFLICT, description = "The labels kept changing for 5 s", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn delete_p2_label(
    app: &AppState,
    actor: &Actor,
    label_type: LabelType,
    id: &str,
    name: &str,
) -> Result<StatusCode, ApiError> {
    store(app)
        .update(label_type, id, None, actor, |labels| {
            labels.remove(name);
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

const ID_DOC: &str = "Object id, query-escaped once more as P2's client sends it (a pod's \
    `node9/hello` as `node9%252Fhello`; `%2F` and a plain `/` work too)";

const NAME_DOC: &str = "Label name (key), query-escaped once more as P2's client sends it; a \
    prefix's `/` may also be sent as is or as `%2F`";

/// The object (and label name, if any) a write names, from the path after the type.
#[derive(Debug)]
struct Target {
    label_type: LabelType,
    id: String,
    name: Option<String>,
}

impl Target {
    /// The id and name as [`split_tail`] finds them, both checked.
    fn parse(type_name: &str, tail: &str) -> Result<Target, ApiError> {
        let label_type = label_type(type_name)?;
        let (id, name) = split_tail(label_type, tail)?;
        check_id(label_type, &id)?;
        if name.as_deref() == Some("") {
            return Err(ApiError::bad_request(
                "Name was not passed: the label name is empty",
            ));
        }
        Ok(Target {
            label_type,
            id,
            name,
        })
    }
}

/// Splits the path after the type (query-unescaped, see the module documentation) into an
/// object id and, when more follows, a label name; this alone decides whether a request is
/// on an object's path (`{id}`: GET, HEAD, PUT, DELETE) or a label's (`{id}/{name}`: PUT,
/// DELETE). An id has as many `/`-separated parts as its type's ids have, two for a pod
/// (`<node>/<pod_id>`) and one for any other type, so whatever follows them is the name,
/// which may hold a prefix's `/`. A `/` sent encoded, once or twice, separates parts as a
/// plain one does. The split looks only at the shape: an id or name that breaks its rules
/// is refused afterwards, so a label's path answers 405 to GET even when its id is bad.
/// The type must be known to tell the shape: a bad type is 400 on every method.
fn split_tail(label_type: LabelType, tail: &str) -> Result<(String, Option<String>), ApiError> {
    let tail = query_unescape(tail)?;
    let id_parts = if label_type == LabelType::Pod { 2 } else { 1 };
    let parts: Vec<&str> = tail.splitn(id_parts + 1, '/').collect();
    Ok(match parts.as_slice() {
        [ids @ .., name] if ids.len() == id_parts => (ids.join("/"), Some(name.to_string())),
        _ => (tail, None),
    })
}

/// What a label's path (`{id}/{name}`) takes: GET reads only an object's labels.
const LABEL_PATH_ALLOWS: &str = "PUT,DELETE";

/// What an object's path (`{id}`) takes.
const OBJECT_PATH_ALLOWS: &str = "GET,HEAD,PUT,DELETE";

/// The `Allow` of a path of [`OBJECT_ROUTE`] (see `split_tail`): the route takes GET on
/// both paths, but a label's path answers it 405.
pub fn allowed_on(type_name: &str, tail: &str) -> &'static str {
    let names_a_label = label_type(type_name)
        .and_then(|label_type| split_tail(label_type, tail))
        .is_ok_and(|(_, name)| name.is_some());
    if names_a_label {
        LABEL_PATH_ALLOWS
    } else {
        OBJECT_PATH_ALLOWS
    }
}

/// The documented 405, with `allow` as its `Allow`.
fn not_allowed_on(allow: &'static str, method: Method, uri: Uri) -> Response {
    let error = ApiError::method_not_allowed(&method, uri.path());
    ([(ALLOW, allow)], error).into_response()
}

/// Undoes the query-escaping P2's client applies to ids and names before the path's own
/// encoding, as P2's server does with Go's `url.QueryUnescape`: `%XX` is a byte and `+` a
/// space. A `%` not followed by two hex digits is a 400, as in P2.
fn query_unescape(text: &str) -> Result<String, ApiError> {
    let bad = || ApiError::bad_request(format!("invalid URL escape in {text:?}"));
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|hex| hex.iter().all(u8::is_ascii_hexdigit))
                    .ok_or_else(bad)?;
                let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| ApiError::bad_request(format!("{text:?} does not decode to UTF-8")))
}

fn store(app: &AppState) -> LabelStore {
    app.labels()
}

/// The labels of a type as read by P2's clients, which ask for no consistency: from the
/// mirror while it is healthy (with the server's own writes; a selection through its label
/// index), else from the store; with the index an answer read from them reflects.
async fn mirrored(app: &AppState, label_type: LabelType) -> Result<(LabelStore, u64), ApiError> {
    let trees = [Tree::Labels(label_type)];
    let (IndexedReader { kv, index }, mirror) =
        indexed_source(app, &trees, &[], false, Default::default()).await?;
    Ok((LabelStore::reading(kv, mirror), index))
}

/// A bad type is 400 in P2's label API, with P2's message.
fn label_type(name: &str) -> Result<LabelType, ApiError> {
    name.parse()
        .map_err(|e: ParseLabelTypeError| ApiError::bad_request(e.to_string()))
}

fn check_id(label_type: LabelType, id: &str) -> Result<(), ApiError> {
    label_type
        .validate_id(id)
        .map_err(|e| ApiError::bad_request(format!("bad {label_type} id {id:?}: {e}")))
}
