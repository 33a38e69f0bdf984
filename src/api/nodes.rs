//! Nodes: the hosts known from their node labels, and the pods intended on each.
//!
//! A node exists for the API when it has labels (`labels/node/<node>`), because that is how
//! RCs and daemon sets find it; intents on an unlabeled node show up under `/pods` only.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::{error_at, index_header};
use crate::api::extract::{ApiJson, ApiPath};
use crate::api::labels::{select_labeled, shown_labels, UNREADABLE_LABELS_DOC};
use crate::api::list_query::{ListParams, ListQuery};
use crate::api::paging::Page;
use crate::api::preconditions::etag;
use crate::api::reads::{indexed_reader, ConsistentFilter, IndexedReader, ReadParams, ReadQuery};
use crate::app::AppState;
use crate::error::{ApiError, ErrorBody, Violations};
use crate::labels::{LabelType, Labels};
use crate::layout;
use crate::model::NodeName;
use crate::state::{Span, Tree};
use crate::store::labels::LabelStore;
use crate::store::pods::{validate_node_name, PodStore, PodTree};

/// OpenAPI tag of the node routes.
pub const TAG: &str = "nodes";

/// One node in a listing.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Node {
    /// The node name (host name), as pods and intents name it.
    #[schema(example = "node17.example.com")]
    pub name: String,
    /// Its node labels, which RC and daemon-set node selectors match.
    #[schema(value_type = BTreeMap<String, String>)]
    pub labels: Labels,
}

/// One node with the pods intended on it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeDetail {
    #[schema(example = "node17.example.com")]
    pub name: String,
    #[schema(value_type = BTreeMap<String, String>)]
    pub labels: Labels,
    /// IDs of the legacy pods in the node's intent tree, sorted.
    pub pods: Vec<String>,
    /// The modify index of the node's labels; also its `ETag`.
    pub resource_version: String,
}

/// The node routes, nested under `/api/v1`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_nodes))
        .routes(routes!(get_node))
}

/// Lists nodes with their labels, sorted by name.
///
/// `selector` matches the node's labels, e.g. `role=web`. Blocks with `?index=&wait=` until the node label tree changes.
#[utoipa::path(
    get,
    path = "/nodes",
    tag = TAG,
    params(ListParams, ConsistentFilter),
    responses(
        (status = OK, description = "One page of nodes", body = Page<Node>,
            headers(("X-Index" = u64, description = "Index of the node label tree; pass it back as `index` to block"))),
        (status = BAD_REQUEST, description = "The query string does not parse", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "A bad selector, limit, continue token or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody)
    )
)]
async fn list_nodes(
    State(app): State<AppState>,
    query: ListQuery<ConsistentFilter>,
) -> Result<impl IntoResponse, ApiError> {
    // From the mirror, through its label index.
    let (index, nodes) = select_labeled(
        &app,
        LabelType::Node,
        &query.selector,
        query.filter.consistent(),
        query.blocking,
    )
    .await?;
    let nodes = nodes
        .into_iter()
        .map(|labeled| Node {
            name: labeled.id,
            labels: labeled.labels,
        })
        .collect();
    let page = query.paging.page(nodes, |node| &node.name);
    Ok(([index_header(index)], ApiJson(page)))
}

/// One node: its labels and the pods intended on it.
///
/// Blocks with `?index=&wait=` until the node's labels or the pods intended on it change.
#[utoipa::path(
    get,
    path = "/nodes/{node}",
    tag = TAG,
    params(("node" = inline(NodeName), Path, description = "The node name"), ReadParams),
    responses(
        (status = OK, description = "The node", body = NodeDetail,
            headers(("ETag" = String, description = "The modify index of the node's labels"),
                    ("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for a change"))),
        (status = BAD_REQUEST, description = "Malformed query", body = ErrorBody),
        (status = NOT_FOUND, description = "The node has no labels", body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for the node's labels"))),
        (status = UNPROCESSABLE_ENTITY, description = "The node name is not valid, or a bad index or wait", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = UNREADABLE_LABELS_DOC, body = ErrorBody,
            headers(("X-Index" = u64, description = "The index the answer reflects; pass as `index` to wait for it to be mended"))),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody)
    )
)]
async fn get_node(
    State(app): State<AppState>,
    query: ReadQuery,
    ApiPath(node): ApiPath<String>,
) -> Result<Response, ApiError> {
    let mut violations = Violations::new();
    if let Err(e) = validate_node_name(&node) {
        violations.add("node", e);
    }
    violations.finish()?;

    let trees = [Tree::Labels(LabelType::Node), Tree::Intent];
    let spans = [
        Span::Key(layout::labels(LabelType::Node, &node)),
        Span::Prefix(layout::pod(layout::INTENT, &node, "")),
    ];
    let IndexedReader { kv, index } =
        indexed_reader(&app, &trees, &spans, query.consistent, query.blocking).await?;
    let record = match shown_labels(&LabelStore::new(kv.clone()), LabelType::Node, &node).await {
        Err(e) if e.tells_what_is_stored() => return Ok(error_at(e, index)),
        record => record?,
    };
    if record.index == 0 {
        let missing = ApiError::not_found(format!("node {node:?} has no labels"));
        return Ok(error_at(missing, index));
    }
    let (_, intents) = PodStore::new(kv).list(PodTree::Intent, Some(&node)).await?;
    let detail = NodeDetail {
        name: node,
        labels: record.value,
        pods: intents
            .into_iter()
            .map(|entry| entry.pod.pod_id().to_owned())
            .collect(),
        resource_version: record.index.to_string(),
    };
    Ok(([etag(record.index), index_header(index)], ApiJson(detail)).into_response())
}
