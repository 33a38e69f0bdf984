//! Pods: the legacy intent tree, each pod with its labels (which name its owner) and health.
//!
//! A dashboard or node agent follows the listing with `?index=&wait=`: the request is held
//! until an intent, a pod label or a health record under what it lists changes.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::State;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::blocking::index_header;
use crate::api::extract::ApiJson;
use crate::api::list_query::{ListFilter, ListParams, ListQuery};
use crate::api::paging::Page;
use crate::api::reads::{indexed_source, IndexedReader};
use crate::app::AppState;
use crate::error::{ApiError, ErrorBody, Violations};
use crate::labels::{LabelType, Labels};
use crate::model::{HealthState, NodeName, PodId};
use crate::state::{Span, Tree};
use crate::store::health::{HealthEntry, HealthStore};
use crate::store::pods::{
    decode_entry, pod_labels_prefix, validate_node_name, validate_pod_id, PodStore, PodTree,
};

/// OpenAPI tag of the pod routes.
pub const TAG: &str = "pods";

/// One pod intended on one node.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Pod {
    #[schema(example = "node17.example.com")]
    pub node: String,
    /// The manifest's `id`.
    #[schema(example = "hello")]
    pub pod_id: String,
    /// The pod's labels; `replication_controller_id` or `daemon_set_id` names its owner.
    #[schema(value_type = BTreeMap<String, String>)]
    pub labels: Labels,
    /// The node agent's last report; `unknown` when there is none.
    pub health: HealthState,
    /// SHA of the intended manifest's canonical form; equal SHAs mean the same pod spec.
    pub manifest_sha: String,
}

/// Narrows a pod listing; an empty value means no filter.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PodFilter {
    /// Only pods intended on this node.
    #[param(value_type = Option<NodeName>, inline)]
    pub node: Option<String>,
    /// Only pods with this ID.
    #[param(value_type = Option<PodId>, inline)]
    pub pod_id: Option<String>,
    /// Read through to the store rather than from this server's mirror of it.
    pub consistent: Option<bool>,
}

impl PodFilter {
    /// The node to list, if any.
    fn node(&self) -> Option<&str> {
        self.node.as_deref().filter(|s| !s.is_empty())
    }

    /// The pod ID to list, if any.
    fn pod_id(&self) -> Option<&str> {
        self.pod_id.as_deref().filter(|s| !s.is_empty())
    }

    /// Whether the client asked to read through to the store.
    fn consistent(&self) -> bool {
        self.consistent.unwrap_or(false)
    }
}

impl ListFilter for PodFilter {
    fn check(&self, violations: &mut Violations) {
        if let Some(Err(e)) = self.node().map(validate_node_name) {
            violations.add("node", e);
        }
        if let Some(Err(e)) = self.pod_id().map(validate_pod_id) {
            violations.add("pod_id", e);
        }
    }
}

/// The pod routes, nested under `/api/v1`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_pods))
}

/// Lists the intent tree, sorted by node then pod ID.
///
/// `selector` matches the pod's labels, e.g. `replication_controller_id=<id>`. Blocks with `?index=&wait=` until an intent, pod label or health record it covers changes.
#[utoipa::path(
    get,
    path = "/pods",
    tag = TAG,
    params(PodFilter, ListParams),
    responses(
        (status = OK, description = "One page of pods", body = Page<Pod>,
            headers(("X-Index" = u64, description = "The index the intents, pod labels and health records listed reflect; pass it back as `index` to block"))),
        (status = BAD_REQUEST, description = "The query string does not parse", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "A bad node, pod ID, selector, limit, continue token, index or wait", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store does not answer", body = ErrorBody)
    )
)]
async fn list_pods(
    State(app): State<AppState>,
    query: ListQuery<PodFilter>,
) -> Result<impl IntoResponse, ApiError> {
    let node = query.filter.node();
    let pod_id = query.filter.pod_id();
    // A node's listing shows only its pods' health, which no prefix holds.
    let health = match node {
        Some(node) => Span::NodeHealth {
            node: node.to_owned(),
            pod_id: pod_id.map(str::to_owned),
        },
        None => Span::Prefix(HealthStore::prefix(pod_id)),
    };
    // A pod id's listing shows only its pods' intents and labels, which no prefix holds.
    let of_pods = |prefix: String| match (node, pod_id) {
        (None, Some(pod_id)) => Span::PodIntents {
            prefix,
            pod_id: pod_id.to_owned(),
        },
        _ => Span::Prefix(prefix),
    };
    let spans = [
        of_pods(PodTree::Intent.prefix(node)),
        of_pods(pod_labels_prefix(node)),
        health,
    ];
    let trees = [Tree::Intent, Tree::Labels(LabelType::Pod), Tree::Health];
    // The index is taken before anything is read: a write landing between the reads below
    // is in the answer or above it, never claimed without being shown.
    let (IndexedReader { kv, index }, mirror) = indexed_source(
        &app,
        &trees,
        &spans,
        query.filter.consistent(),
        query.blocking,
    )
    .await?;
    let pods = PodStore::new(kv.clone());
    // A pod id's listing reads its own pods only, by key, where the mirror's index tells
    // their nodes (intents are keyed by node first, so no prefix holds them): its cost is
    // its pods', not the fleet's.
    let (intents, mut labels) = match (node, pod_id, mirror) {
        (None, Some(pod_id), Some(mirror)) => {
            let nodes = mirror.nodes_of_pod(pod_id);
            pods.locate_pod(PodTree::Intent, pod_id, &nodes).await?
        }
        _ => (
            pods.locate(PodTree::Intent, node).await?.1,
            pods.list_labels(node).await?.1,
        ),
    };
    // A node's listing reads the health of its own pods' ids only: its cost is its pods',
    // not the fleet's.
    let health_of = match (node, pod_id) {
        (_, Some(pod_id)) => Some(BTreeSet::from([pod_id])),
        (Some(_), None) => Some(intents.iter().map(|(pod, _)| pod.pod_id()).collect()),
        (None, None) => None,
    };
    let health = read_health(&HealthStore::new(kv), health_of).await?;

    // Keyed so that string order is node-then-pod order: '\0' sorts below any character a
    // node name can hold, unlike '/', which sorts after '-' and '.'. Only the page's
    // manifests are decoded.
    let items: Vec<_> = intents
        .into_iter()
        .filter(|(pod, _)| pod_id.is_none_or(|id| pod.pod_id() == id))
        .filter_map(|(pod, pair)| {
            let pod_labels = labels
                .remove(&pod)
                .map(|record| record.value)
                .unwrap_or_default();
            if !query.selector.matches(&pod_labels) {
                return None;
            }
            let key = format!("{}\0{}", pod.node(), pod.pod_id());
            Some((key, pod, pod_labels, pair))
        })
        .collect();
    let page = query.paging.page_decoded(
        items,
        |(key, ..)| key,
        |(_, pod, labels, pair)| {
            let entry = decode_entry(pod, &pair)?;
            let result = health
                .get(&(entry.pod.pod_id().to_owned(), entry.pod.node().to_owned()))
                .map(HealthEntry::state);
            Some(Pod {
                labels,
                node: entry.pod.node().to_owned(),
                pod_id: entry.pod.pod_id().to_owned(),
                health: HealthState::of(result),
                manifest_sha: entry.manifest.sha(),
            })
        },
    );
    Ok(([index_header(index)], ApiJson(page)))
}

/// Health records keyed by (pod ID, node): of the pod IDs given, else every one.
async fn read_health(
    store: &HealthStore,
    pod_ids: Option<BTreeSet<&str>>,
) -> Result<BTreeMap<(String, String), HealthEntry>, ApiError> {
    let Some(pod_ids) = pod_ids else {
        return Ok(store.list().await?.1);
    };
    let mut keyed = BTreeMap::new();
    for pod_id in pod_ids {
        let (_, by_node) = store.list_for_pod(pod_id).await?;
        let of_pod = by_node.into_iter();
        keyed.extend(of_pod.map(|(node, entry)| ((pod_id.to_owned(), node), entry)));
    }
    Ok(keyed)
}
