//! `/api/v1/labels`: one object's labels (read, replace, merge-patch, delete) and the objects
//! of a type that match a selector.
//!
//! What is particular to labels:
//! - An object with no labels is not missing. P2 never checks that a labeled node or pod
//!   exists and answers an empty set at index 0, so GET answers 200 with `labels: {}` and
//!   `resource_version: "0"`; a 404 would only tell the client that nothing was written yet.
//!   `If-Match: "0"` therefore means "only while no label set is stored". An empty set P2
//!   stored (`{}`, or `null` for a nil map) is a stored set: it reads as `labels: {}` at its
//!   own version, which `If-Match` names as any other, and `*` matches.
//! - The `{type}` segment names a collection, so an unknown type is 404, on every route. An
//!   id that cannot name an object of its type, a bad selector and bad labels are 422, with
//!   one cause per problem.
//! - Pod ids are `<node>/<pod_id>`; the `/` may be sent as is or as `%2F`.
//! - An empty label set is stored as no key at all, as P2 does: PUT of `{}` is a DELETE.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::{error_at, index_header, Blocking};
use crate::api::extract::{ApiJson, ApiPath, MergePatch, NoQuery};
use crate::api::list_query::{ListParams, ListQuery};
use crate::api::paging::Page;
use crate::api::preconditions::{self, etag, IfMatch};
use crate::api::reads::{
    indexed_reader, mirror_index, source_reader, ConsistentFilter, IndexedReader, ReadParams,
    ReadQuery,
};
use crate::app::AppState;
use crate::error::{ApiError, Cause, ErrorBody, Violations};
use crate::labels::validation::LabelSet;
use crate::labels::{
    label_key_problem, label_value_problem, validate_labels, LabelType, Labeled, Labels,
    ParseLabelTypeError, Selector, POD_ID_LABEL,
};
use crate::layout;
use crate::model::event::Actor;
use crate::state::{Span, Tree};
use crate::store::labels::{describe, LabelRecord, LabelStore, LabelWriteError};
use crate::store::update::Expected;

/// OpenAPI tag of these routes.
pub const TAG: &str = "labels";

/// One object's labels, with the version a conditional write must name in `If-Match`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ObjectLabels {
    /// What kind of object this is.
    #[serde(rename = "type")]
    pub label_type: LabelType,
    /// The object's id within its type (`<node>/<pod_id>` for pods).
    #[schema(example = "node17.example.com/hello")]
    pub id: String,
    /// The labels; `{}` when the object has none.
    #[schema(value_type = BTreeMap<String, String>)]
    pub labels: Labels,
    /// The labels' modify index as text, the same as the `ETag`; `"0"` when no label set is
    /// stored (an empty one P2 stored, `{}` or `null`, has its own).
    #[schema(example = "42")]
    pub resource_version: String,
}

impl ObjectLabels {
    fn new(label_type: LabelType, id: String, record: LabelRecord) -> Self {
        ObjectLabels {
            label_type,
            id,
            labels: record.value,
            resource_version: record.index.to_string(),
        }
    }
}

/// The body of a PUT: the complete new label set, and nothing else (a read's
/// `resource_version` sent back here would otherwise be ignored, not checked; `If-Match`
/// carries it).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplaceLabels {
    /// Replaces every label; keys and values follow Kubernetes' rules.
    #[schema(value_type = LabelSet)]
    pub labels: Labels,
}

/// The body of a PATCH, a JSON merge patch (RFC 7386) of [`ObjectLabels`].
#[derive(Debug, Clone, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelsPatch {
    /// A key mapped to a string is set, a key mapped to `null` is removed, others are kept;
    /// `"labels": null` removes every label. Removals are not checked against Kubernetes'
    /// rules, so a bad label written by an older tool can still be removed.
    #[schema(value_type = Option<BTreeMap<String, Option<String>>>)]
    labels: LabelsChange,
}

/// What a patch does to the label set.
#[derive(Debug, Clone)]
enum LabelsChange {
    /// `"labels": null`.
    Clear,
    /// Each key set (`Some`) or removed (`None`); empty when the patch has no `labels`.
    Merge(BTreeMap<String, Option<String>>),
}

impl LabelsPatch {
    /// Reads a merge patch, recording every bad field in `violations`.
    fn parse(patch: Map<String, Value>, violations: &mut Violations) -> LabelsPatch {
        let mut changes = BTreeMap::new();
        let mut clear = false;
        for (field, value) in patch {
            match (field.as_str(), value) {
                ("labels", Value::Null) => clear = true,
                ("labels", Value::Object(labels)) => {
                    for (key, value) in labels {
                        let at = format!("labels.{key}");
                        match value {
                            Value::String(value) => {
                                if let Some(problem) = label_key_problem(&key) {
                                    violations.add(&at, problem);
                                }
                                if let Some(problem) = label_value_problem(&value) {
                                    violations.add(&at, problem);
                                }
                                changes.insert(key, Some(value));
                            }
                            Value::Null => {
                                changes.insert(key, None);
                            }
                            other => violations.add(
                                at,
                                format!("must be a string, or null to remove it; got {other}"),
                            ),
                        }
                    }
                }
                ("labels", other) => violations.add(
                    "labels",
                    format!("must be an object, or null to remove every label; got {other}"),
                ),
                (_, _) => violations.add(field, "unknown field; a labels patch has only `labels`"),
            }
        }
        let labels = if clear {
            LabelsChange::Clear
        } else {
            LabelsChange::Merge(changes)
        };
        LabelsPatch { labels }
    }

    fn apply(&self, labels: &mut Labels) {
        match &self.labels {
            LabelsChange::Clear => labels.clear(),
            LabelsChange::Merge(changes) => {
                for (key, value) in changes {
                    match value {
                        Some(value) => labels.insert(key.clone(), value.clone()),
                        None => labels.remove(key),
                    };
                }
            }
        }
    }
}

/// The label routes; the object routes take the id as a catch-all so a pod's `/` survives.
pub fn router() -> OpenApiRouter<AppState> {
    // OpenAPI has no catch-all parameter: the object routes are documented at `{id}`, which
    // the `#[utoipa::path]` of each handler says, and served at `{*id}`.
    let object_routes = OpenApiRouter::with_openapi(ObjectRoutes::openapi()).route(
        "/labels/{type}/{*id}",
        get(get_labels)
            .put(put_labels)
            .patch(patch_labels)
            .delete(delete_labels),
    );
    OpenApiRouter::new()
        .routes(routes!(list_labels))
        .merge(object_routes)
}

/// The documentation of the routes on one object.
#[derive(OpenApi)]
#[openapi(paths(get_labels, put_labels, patch_labels, delete_labels))]
struct ObjectRoutes;

/// List the objects of a type whose labels match a selector.
///
/// Items are sorted by id. With `index` (the `X-Index` of an earlier answer) the request is
/// held until a label of this type changes or `wait` passes, so clients follow changes
/// without polling.
#[utoipa::path(
    get,
    path = "/labels/{type}",
    tag = TAG,
    params(
        ("type" = LabelType, Path, description = "Label type"),
        ListParams,
        ConsistentFilter
    ),
    responses(
        (status = OK, description = "One page of matching objects", body = Page<Labeled>,
            headers(("X-Index" = u64, description = "Index of the listing, for `index`"))),
        (status = BAD_REQUEST, description = "The query string is malformed", body = ErrorBody),
        (status = NOT_FOUND, description = "No such label type", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "Bad selector, limit, continue, index or wait",
            body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn list_labels(
    State(app): State<AppState>,
    ApiPath(type_name): ApiPath<String>,
    query: Result<ListQuery<ConsistentFilter>, ApiError>,
) -> Result<([(HeaderName, HeaderValue); 1], ApiJson<Page<Labeled>>), ApiError> {
    // An unknown type is 404 whatever the query, as on every label route.
    let label_type = label_type(&type_name)?;
    let query = query?;
    let (index, items) = select_labeled(
        &app,
        label_type,
        &query.selector,
        query.filter.consistent(),
        query.blocking,
    )
    .await?;
    Ok((
        [index_header(index)],
        ApiJson(query.paging.page(items, labeled_id)),
    ))
}

/// The objects of `label_type` that `selector` matches, sorted by id, and the index they
/// reflect, read where [`source_reader`] says: from the mirror, a selector naming a value is
/// answered through its label index, not by decoding every label set of the type.
pub(crate) async fn select_labeled(
    app: &AppState,
    label_type: LabelType,
    selector: &Selector,
    consistent: bool,
    blocking: Blocking,
) -> Result<(u64, Vec<Labeled>), ApiError> {
    let trees = [Tree::Labels(label_type)];
    let (kv, mirror) = source_reader(
        app,
        &trees,
        &[Span::Prefix(layout::labels_of_type(label_type))],
        consistent,
        blocking,
    )
    .await?;
    let (index, mut items) = match mirror {
        Some(mirror) => {
            let index = mirror_index(mirror, &trees);
            let labels = LabelStore::reading(kv, Some(mirror));
            (index, labels.matching(label_type, selector).await?)
        }
        None => LabelStore::new(kv).select(label_type, selector).await?,
    };
    items.sort_by(|a, b| a.id.cmp(&b.id));
    Ok((index, items))
}

/// Read one object's labels.
///
/// An object without labels answers `labels: {}` and `resource_version: "0"`, not 404.
/// Blocks with `?index=&wait=` until the object's labels change.
#[utoipa::path(
    get,
    path = "/labels/{type}/{id}",
    tag = TAG,
    params(
        ("type" = LabelType, Path, description = "Label type"),
        ("id" = String, Path, description = ID_DOC, min_length = 1),
        ReadParams
    ),
    responses(
        (status = OK, description = "The object's labels", body = ObjectLabels,
            headers(("ETag" = String, description = "The labels' version, for `If-Match`"),
                    ("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = NOT_FOUND, description = "No such label type", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "The id is not valid for the type, or a bad index or wait",
            body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = UNREADABLE_LABELS_DOC, body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for it to be mended"))),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn get_labels(
    State(app): State<AppState>,
    query: ReadQuery,
    ApiPath((type_name, id)): ApiPath<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let label_type = label_type(&type_name)?;
    let mut violations = Violations::new();
    check_id(label_type, &id, &mut violations);
    violations.finish()?;
    let trees = [Tree::Labels(label_type)];
    let spans = [Span::Key(layout::labels(label_type, &id))];
    let IndexedReader { kv, index } =
        indexed_reader(&app, &trees, &spans, query.consistent, query.blocking).await?;
    let record = match shown_labels(&LabelStore::new(kv), label_type, &id).await {
        Err(e) if e.tells_what_is_stored() => return Ok(error_at(e, index)),
        record => record?,
    };
    Ok(([index_header(index)], answer(label_type, id, record)).into_response())
}

/// An object's labels as a read shows them: labels stored that cannot be decoded are 500
/// `UnreadableDocument`, saying how to clear them.
pub async fn shown_labels(
    labels: &LabelStore,
    label_type: LabelType,
    id: &str,
) -> Result<LabelRecord, ApiError> {
    labels.shown(label_type, id).await?.map_err(|why| {
        ApiError::unreadable(format!(
            "{why}; PUT /api/v1/labels/{label_type}/{id} replaces them, DELETE removes them"
        ))
    })
}

/// Replace one object's labels.
///
/// Every key and value is checked, and all problems are reported at once. Without
/// `If-Match` the new set is written whatever is stored; with it, only at that version.
#[utoipa::path(
    put,
    path = "/labels/{type}/{id}",
    tag = TAG,
    params(
        ("type" = LabelType, Path, description = "Label type"),
        ("id" = String, Path, description = ID_DOC, min_length = 1),
        ("If-Match" = Option<String>, Header, nullable = false, description = IF_MATCH_DOC)
    ),
    request_body = ReplaceLabels,
    responses(
        (status = OK, description = "The labels as stored", body = ObjectLabels,
            headers(("ETag" = String, description = "The new version"))),
        (status = BAD_REQUEST, description = "Malformed JSON or If-Match", body = ErrorBody),
        (status = NOT_FOUND, description = "No such label type", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The labels changed since If-Match",
            body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "The body is not application/json",
            body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = BAD_WRITE_DOC,
            body = ErrorBody),
        (status = CONFLICT, description = "The labels kept changing for 5 s", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn put_labels(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath((type_name, id)): ApiPath<(String, String)>,
    if_match: IfMatch,
    actor: Actor,
    ApiJson(body): ApiJson<ReplaceLabels>,
) -> Result<([(HeaderName, HeaderValue); 1], ApiJson<ObjectLabels>), ApiError> {
    let label_type = label_type(&type_name)?;
    let mut violations = Violations::new();
    check_id(label_type, &id, &mut violations);
    for (field, message) in validate_labels(&body.labels) {
        violations.add(field, message);
    }
    violations.finish()?;
    let expected = if_match
        .expected(
            app.store.as_ref(),
            &layout::labels(label_type, &id),
            &describe(label_type, &id),
        )
        .await?;
    let record = store(&app)
        .replace(label_type, &id, body.labels, expected, &actor)
        .await
        .map_err(|e| write_error(e, expected, label_type, &id))?;
    Ok(answer(label_type, id, record))
}

/// Merge-patch one object's labels.
///
/// `{"labels": {"k": "v", "gone": null}}` sets `k` and removes `gone`, keeping the rest; the
/// body may be `application/merge-patch+json` or `application/json`. Without `If-Match` the
/// patch is applied to whatever is stored, re-applied while it loses to concurrent writes (for
/// up to 5 s), so patches of different keys all take effect; with it, only at that version.
#[utoipa::path(
    patch,
    path = "/labels/{type}/{id}",
    tag = TAG,
    params(
        ("type" = LabelType, Path, description = "Label type"),
        ("id" = String, Path, description = ID_DOC, min_length = 1),
        ("If-Match" = Option<String>, Header, nullable = false, description = IF_MATCH_DOC)
    ),
    request_body(description = "A JSON merge patch",
        content((LabelsPatch = "application/merge-patch+json"), (LabelsPatch = "application/json"))),
    responses(
        (status = OK, description = "The labels as stored", body = ObjectLabels,
            headers(("ETag" = String, description = "The new version"))),
        (status = BAD_REQUEST, description = "Malformed JSON or If-Match, or not an object",
            body = ErrorBody),
        (status = NOT_FOUND, description = "No such label type", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The labels changed since If-Match",
            body = ErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "The body is not a JSON merge patch",
            body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = BAD_PATCH_DOC,
            body = ErrorBody),
        (status = CONFLICT, description = "The labels kept changing for 5 s", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn patch_labels(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath((type_name, id)): ApiPath<(String, String)>,
    if_match: IfMatch,
    actor: Actor,
    MergePatch(patch): MergePatch,
) -> Result<([(HeaderName, HeaderValue); 1], ApiJson<ObjectLabels>), ApiError> {
    let label_type = label_type(&type_name)?;
    let mut violations = Violations::new();
    check_id(label_type, &id, &mut violations);
    let patch = LabelsPatch::parse(patch, &mut violations);
    violations.finish()?;
    let expected = if_match
        .expected(
            app.store.as_ref(),
            &layout::labels(label_type, &id),
            &describe(label_type, &id),
        )
        .await?;
    let record = store(&app)
        .update(label_type, &id, expected, &actor, |labels| {
            patch.apply(labels)
        })
        .await
        .map_err(|e| write_error(e, expected, label_type, &id))?;
    Ok(answer(label_type, id, record))
}

/// Remove every label of one object.
///
/// Removing the labels of an object that has none succeeds, so a retried DELETE is harmless.
#[utoipa::path(
    delete,
    path = "/labels/{type}/{id}",
    tag = TAG,
    params(
        ("type" = LabelType, Path, description = "Label type"),
        ("id" = String, Path, description = ID_DOC, min_length = 1),
        ("If-Match" = Option<String>, Header, nullable = false, description = IF_MATCH_DOC)
    ),
    responses(
        (status = NO_CONTENT, description = "The object has no labels any more"),
        (status = BAD_REQUEST, description = "Malformed If-Match", body = ErrorBody),
        (status = NOT_FOUND, description = "No such label type", body = ErrorBody),
        (status = PRECONDITION_FAILED, description = "The labels changed since If-Match",
            body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = BAD_DELETE_DOC, body = ErrorBody),
        (status = CONFLICT, description = "The labels kept changing for 5 s", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn delete_labels(
    State(app): State<AppState>,
    _: NoQuery,
    ApiPath((type_name, id)): ApiPath<(String, String)>,
    if_match: IfMatch,
    actor: Actor,
) -> Result<StatusCode, ApiError> {
    let label_type = label_type(&type_name)?;
    let mut violations = Violations::new();
    check_id(label_type, &id, &mut violations);
    violations.finish()?;
    let expected = if_match
        .expected(
            app.store.as_ref(),
            &layout::labels(label_type, &id),
            &describe(label_type, &id),
        )
        .await?;
    store(&app)
        .delete(label_type, &id, expected, &actor)
        .await
        .map_err(|e| write_error(e, expected, label_type, &id))?;
    Ok(StatusCode::NO_CONTENT)
}

/// The 500 of a read of labels stored that cannot be decoded ([`shown_labels`]).
pub const UNREADABLE_LABELS_DOC: &str = "The stored labels cannot be decoded (reason \
    `UnreadableDocument`); PUT of the labels replaces them, DELETE removes them";

const ID_DOC: &str = "Object id; a pod's is `<node>/<pod_id>`, its `/` sent as is or as `%2F`";

/// The end of a label write's 422 description: what it refuses of an RC's labels, their
/// `pod_id` label taken away from the manifest's id ([`LabelWriteError::PodIdLabel`]).
macro_rules! pod_id_label_doc {
    () => {
        "the write would change or remove the `pod_id` label of an existing RC (type \
         `replication_controller`), which is always its manifest's id (cause `labels.pod_id`; \
         nothing is written)"
    };
}
pub(crate) use pod_id_label_doc;

const BAD_WRITE_DOC: &str = concat!("Bad id, body shape or labels; or ", pod_id_label_doc!());
const BAD_PATCH_DOC: &str = concat!("Bad id, fields or labels; or ", pod_id_label_doc!());
const BAD_DELETE_DOC: &str = concat!("The id is not valid for the type; or ", pod_id_label_doc!());

const IF_MATCH_DOC: &str = "Write only if the labels are still at this version (an `ETag` or \
    `resource_version`); `\"0\"` means while no label set is stored for the object (an empty \
    one P2 stored, `{}` or `null`, is at its own version, as a read shows it, and `*` matches \
    it)";

fn store(app: &AppState) -> LabelStore {
    app.labels()
}

/// The type segment names the collection, so an unknown one is 404.
fn label_type(name: &str) -> Result<LabelType, ApiError> {
    name.parse()
        .map_err(|e: ParseLabelTypeError| ApiError::not_found(e.to_string()))
}

fn check_id(label_type: LabelType, id: &str, violations: &mut Violations) {
    if let Err(e) = label_type.validate_id(id) {
        violations.add("id", e);
    }
}

fn labeled_id(labeled: &Labeled) -> &str {
    &labeled.id
}

/// A write's error as answered under `expected`: a store error by
/// [`preconditions::write_error`], a refusal as itself.
fn write_error(
    err: LabelWriteError,
    expected: Option<Expected>,
    label_type: LabelType,
    id: &str,
) -> ApiError {
    match err {
        LabelWriteError::Store(err) => {
            preconditions::write_error(err, &describe(label_type, id), expected)
        }
        refused => refused.into(),
    }
}

/// A refused label write is 422 naming the label; a store error is answered as any other.
impl From<LabelWriteError> for ApiError {
    fn from(err: LabelWriteError) -> Self {
        match err {
            LabelWriteError::PodIdLabel(problem) => {
                ApiError::invalid([Cause::new(format!("labels.{POD_ID_LABEL}"), problem)])
            }
            LabelWriteError::Store(err) => err.into(),
        }
    }
}

fn answer(
    label_type: LabelType,
    id: String,
    record: LabelRecord,
) -> ([(HeaderName, HeaderValue); 1], ApiJson<ObjectLabels>) {
    let index = record.index;
    (
        [etag(index)],
        ApiJson(ObjectLabels::new(label_type, id, record)),
    )
}
