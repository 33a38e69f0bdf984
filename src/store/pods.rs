//! The pod store: legacy pods in the intent and reality trees and their pod labels.
//!
//! `intent/<node>/<pod_id>` holds the manifest a node should run (written by RCs, DSs and
//! operators), `reality/<node>/<pod_id>` the manifest the node's preparer last installed, and
//! `labels/pod/<node>/<pod_id>` the pod's labels, which name its owner. Reads skip (and log)
//! what they cannot use: UUID-pod index entries, keys of the wrong depth and undecodable
//! manifests or labels, so one odd key never hides every other pod.
//!
//! Writes are not done here: [`schedule_ops`] and [`unschedule_ops`] build the transaction
//! ops, so a caller can commit them together with its own (an audit record, a lock check).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::labels::{LabelType, Labels};
use crate::model::{Manifest, NodeName, PodId};

use super::labels::{decode_labels, write_op, LabelRecord};
use crate::kv::{KvPair, KvStore, StoreError, StoreResult, TxnOp};
use crate::layout;

/// A node name as it may appear in new keys: [`NodeName`]'s rule.
pub fn validate_node_name(node: &str) -> Result<(), String> {
    NodeName::check(node).map_err(|e| e.to_string())
}

/// A pod ID as it may appear in new keys: [`PodId`]'s rule, which refuses UUIDs, because a
/// UUID as the last segment of an intent key marks a UUID-pod index entry rather than a
/// manifest, so such a pod would be invisible to every reader.
pub fn validate_pod_id(pod_id: &str) -> Result<(), String> {
    PodId::check(pod_id).map_err(|e| e.to_string())
}

/// Whether a key's last segment names a UUID pod (P2's `PodUniqueKeyFromConsulPath`).
fn is_uuid(segment: &str) -> bool {
    uuid::Uuid::parse_str(segment).is_ok()
}

/// Which legacy pod on which node: the pair every pod key is built from.
///
/// Both parts are always single key segments. [`PodLocation::new`] additionally holds new
/// input to [`validate_node_name`] and [`validate_pod_id`]; locations read back from keys
/// are taken as stored, so pods written by other tools can still be unscheduled.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodLocation {
    node: String,
    pod_id: String,
}

impl PodLocation {
    /// Validates both parts, naming the first that is wrong.
    pub fn new(node: &str, pod_id: &str) -> Result<PodLocation, String> {
        validate_node_name(node)?;
        validate_pod_id(pod_id)?;
        Ok(PodLocation {
            node: node.to_owned(),
            pod_id: pod_id.to_owned(),
        })
    }

    /// A location known from stored keys (a farm's view of the trees), taken as stored like
    /// every location read back from a key.
    pub fn stored(node: &str, pod_id: &str) -> PodLocation {
        PodLocation {
            node: node.to_owned(),
            pod_id: pod_id.to_owned(),
        }
    }

    /// A location from two segments of a stored key; `None` for a UUID pod's index entry.
    fn from_key_segments(node: &str, pod_id: &str) -> Option<PodLocation> {
        (!is_uuid(pod_id)).then(|| PodLocation {
            node: node.to_owned(),
            pod_id: pod_id.to_owned(),
        })
    }

    /// Parses a pod label ID, `<node>/<pod_id>`; `None` when it is not one.
    pub fn from_label_id(id: &str) -> Option<PodLocation> {
        let (node, pod_id) = id.split_once('/')?;
        (is_key_segment(node) && is_key_segment(pod_id))
            .then(|| PodLocation::from_key_segments(node, pod_id))
            .flatten()
    }

    /// The node.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The pod ID (the manifest's `id`).
    pub fn pod_id(&self) -> &str {
        &self.pod_id
    }

    /// The pod's ID in the label tree, `<node>/<pod_id>`.
    pub fn label_id(&self) -> String {
        format!("{}/{}", self.node, self.pod_id)
    }

    /// The key of the pod's labels.
    pub fn label_key(&self) -> String {
        layout::labels(LabelType::Pod, &self.label_id())
    }
}

impl fmt::Display for PodLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.node, self.pod_id)
    }
}

/// The two manifest trees, keyed alike by node then pod ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodTree {
    /// What should run: `intent/<node>/<pod_id>`.
    Intent,
    /// What the preparer installed: `reality/<node>/<pod_id>`.
    Reality,
}

impl PodTree {
    fn root(self) -> &'static str {
        match self {
            PodTree::Intent => layout::INTENT,
            PodTree::Reality => layout::REALITY,
        }
    }

    /// The prefix a listing reads, the whole tree or one node's part of it; `node` must be a
    /// single key segment. Blocking queries watch the same prefix.
    pub fn prefix(self, node: Option<&str>) -> String {
        match node {
            Some(node) => format!("{}{node}/", self.root()),
            None => self.root().to_owned(),
        }
    }

    /// The key of one pod's manifest in this tree.
    pub fn key(self, pod: &PodLocation) -> String {
        layout::pod(self.root(), &pod.node, &pod.pod_id)
    }
}

/// The prefix of the pod label tree, whole or one node's part; `node` must be a single key
/// segment.
pub fn pod_labels_prefix(node: Option<&str>) -> String {
    match node {
        Some(node) => format!("{}{node}/", layout::labels_of_type(LabelType::Pod)),
        None => layout::labels_of_type(LabelType::Pod),
    }
}

/// One pod's manifest as read from a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry {
    /// Where it was found.
    pub pod: PodLocation,
    /// The manifest, its raw bytes preserved; compare [`Manifest::sha`] to tell versions apart.
    pub manifest: Manifest,
    /// The key's modify index.
    pub index: u64,
}

/// Reads legacy pods with P2's layout.
#[derive(Clone)]
pub struct PodStore {
    kv: Arc<dyn KvStore>,
}

impl PodStore {
    /// Wraps the KV store.
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        PodStore { kv }
    }

    /// One pod's manifest in `tree`, or `None` when it has none (or an undecodable one,
    /// which a caller must treat like a missing one: rewrite it).
    pub async fn get(&self, tree: PodTree, pod: &PodLocation) -> StoreResult<Option<PodEntry>> {
        let pair = self.kv.get(&tree.key(pod)).await?;
        Ok(pair.and_then(|pair| decode_entry(pod.clone(), &pair)))
    }

    /// The pods in `tree`, all or one node's, sorted by node then pod ID, with the listing's
    /// index for blocking queries.
    pub async fn list(
        &self,
        tree: PodTree,
        node: Option<&str>,
    ) -> StoreResult<(u64, Vec<PodEntry>)> {
        let (index, located) = self.locate(tree, node).await?;
        let pods = located
            .into_iter()
            .filter_map(|(pod, pair)| decode_entry(pod, &pair))
            .collect();
        Ok((index, pods))
    }

    /// [`PodStore::list`] before the manifests are decoded ([`decode_entry`]), so that a
    /// caller answering one page decodes only that page's.
    pub async fn locate(
        &self,
        tree: PodTree,
        node: Option<&str>,
    ) -> StoreResult<(u64, Vec<(PodLocation, KvPair)>)> {
        check_node_filter(node)?;
        let listing = self.kv.list(&tree.prefix(node)).await?;
        let mut located: Vec<(PodLocation, KvPair)> = listing
            .pairs
            .into_iter()
            .filter_map(|pair| Some((location_under(tree.root(), &pair.key)?, pair)))
            .collect();
        located.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((listing.index, located))
    }

    /// What [`PodStore::locate`] and [`PodStore::list_labels`] list of the pods of `pod_id`
    /// on `nodes`, read by key: for a reader that knows where a pod id's intents are (the
    /// mirror's index), as no prefix holds them.
    pub async fn locate_pod(
        &self,
        tree: PodTree,
        pod_id: &str,
        nodes: &[String],
    ) -> StoreResult<(
        Vec<(PodLocation, KvPair)>,
        BTreeMap<PodLocation, LabelRecord>,
    )> {
        let mut located = Vec::with_capacity(nodes.len());
        let mut labels = BTreeMap::new();
        for node in nodes {
            let Some(pod) = PodLocation::from_key_segments(node, pod_id) else {
                continue;
            };
            let Some(pair) = self.kv.get(&tree.key(&pod)).await? else {
                continue;
            };
            let label_key = pod.label_key();
            let label_pair = self.kv.get(&label_key).await?;
            if let Some(value) = label_pair.as_ref().and_then(decode_labels) {
                let index = label_pair.map_or(0, |pair| pair.modify_index);
                labels.insert(pod.clone(), LabelRecord { value, index });
            }
            located.push((pod, pair));
        }
        located.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((located, labels))
    }

    /// The labels of every pod, all or one node's, with the listing's index. A pod without
    /// labels is absent from the map.
    pub async fn list_labels(
        &self,
        node: Option<&str>,
    ) -> StoreResult<(u64, BTreeMap<PodLocation, LabelRecord>)> {
        check_node_filter(node)?;
        let listing = self.kv.list(&pod_labels_prefix(node)).await?;
        let root = layout::labels_of_type(LabelType::Pod);
        let labels = listing
            .pairs
            .iter()
            .filter_map(|pair| {
                let pod = location_under(&root, &pair.key)?;
                let labels = decode_labels(pair)?;
                let index = pair.modify_index;
                Some((
                    pod,
                    LabelRecord {
                        value: labels,
                        index,
                    },
                ))
            })
            .collect();
        Ok((listing.index, labels))
    }
}

/// The ops that schedule `manifest` on `pod`: set the intent to the manifest's raw bytes and
/// merge `labels` into the pod's labels with a CAS on `current`, the record they were read
/// at, so a concurrent label change rolls the whole transaction back. `pod.pod_id()` should
/// be `manifest.pod_id()`, as P2 keys legacy pods by their manifest's `id`.
pub fn schedule_ops(
    pod: &PodLocation,
    manifest: &Manifest,
    labels: &Labels,
    current: &LabelRecord,
) -> Vec<TxnOp> {
    let mut merged = current.value.clone();
    merged.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut ops = Vec::with_capacity(2);
    ops.extend(write_op(
        LabelType::Pod,
        &pod.label_id(),
        &merged,
        current.index,
    ));
    ops.push(TxnOp::Set {
        key: PodTree::Intent.key(pod),
        value: manifest.raw().as_bytes().to_vec(),
    });
    ops
}

/// The ops that unschedule `pod`: delete its intent and remove exactly `label_keys` from its
/// labels (deleting the label key when none remain), with a CAS on `current`. Other owners'
/// labels stay, so a pod shared by tools keeps what they put on it.
pub fn unschedule_ops<'a>(
    pod: &PodLocation,
    label_keys: impl IntoIterator<Item = &'a str>,
    current: &LabelRecord,
) -> Vec<TxnOp> {
    let mut remaining = current.value.clone();
    for key in label_keys {
        remaining.remove(key);
    }
    let mut ops = Vec::with_capacity(2);
    ops.extend(write_op(
        LabelType::Pod,
        &pod.label_id(),
        &remaining,
        current.index,
    ));
    ops.push(TxnOp::Delete {
        key: PodTree::Intent.key(pod),
    });
    ops
}

/// Refuses a node filter that is not one key segment before it becomes part of a prefix.
/// Stored names are not held to [`validate_node_name`], so neither is a filter for reading.
fn check_node_filter(node: Option<&str>) -> StoreResult<()> {
    match node {
        Some(node) if !is_key_segment(node) => Err(StoreError::Invalid(format!(
            "node name {node:?} is not a single key segment"
        ))),
        _ => Ok(()),
    }
}

/// Non-empty, no '/', not '.' or '..', no control characters: what a stored key's segments
/// always are.
fn is_key_segment(s: &str) -> bool {
    !s.is_empty() && !s.contains('/') && s != "." && s != ".." && !s.contains(char::is_control)
}

/// The location of a key `<root><node>/<pod_id>`; `None` (logged) for other depths and
/// `None` (silently: they are expected) for UUID-pod index entries.
fn location_under(root: &str, key: &str) -> Option<PodLocation> {
    let rest = key.strip_prefix(root)?;
    let Some((node, pod_id)) = rest.split_once('/').filter(|(_, p)| !p.contains('/')) else {
        tracing::warn!(%key, "skipping a pod key that is not <node>/<pod_id>");
        return None;
    };
    PodLocation::from_key_segments(node, pod_id)
}

/// The pod `pair` holds at `pod`; `None` (logged) when its manifest does not decode.
pub fn decode_entry(pod: PodLocation, pair: &KvPair) -> Option<PodEntry> {
    let text = match std::str::from_utf8(&pair.value) {
        Ok(text) => text,
        Err(e) => {
            tracing::warn!(key = %pair.key, error = %e, "skipping a manifest that is not UTF-8");
            return None;
        }
    };
    match Manifest::parse(text) {
        Ok(manifest) => Some(PodEntry {
            pod,
            manifest,
            index: pair.modify_index,
        }),
        Err(errors) => {
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            tracing::warn!(key = %pair.key, errors = %errors.join("; "), "skipping an invalid manifest");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_names_for_new_keys() {
        for good in ["node17.example.com", "hello", "p2-log_shipper"] {
            validate_node_name(good).unwrap();
            validate_pod_id(good).unwrap();
        }
        // A pod id is a manifest id, which becomes a label value: ASCII only.
        validate_node_name("ü").unwrap();
        assert!(validate_pod_id("ü").is_err());
        for bad in ["", ".", "..", "a/b", "a b", "a\tb", "a\u{7}", "\u{a0}x"] {
            assert!(validate_node_name(bad).is_err(), "{bad:?}");
            assert!(validate_pod_id(bad).is_err(), "{bad:?}");
        }
        let uuid = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
        validate_node_name(uuid).unwrap();
        assert!(validate_pod_id(uuid).unwrap_err().contains("UUID"));
        assert!(PodLocation::new("node1", "a b").is_err());
        assert!(PodLocation::new("a b", "hello").is_err());
    }

    #[test]
    fn builds_keys_and_label_ids() {
        let pod = PodLocation::new("node1", "hello").unwrap();
        assert_eq!(PodTree::Intent.key(&pod), "intent/node1/hello");
        assert_eq!(PodTree::Reality.key(&pod), "reality/node1/hello");
        assert_eq!(PodTree::Intent.prefix(Some("node1")), "intent/node1/");
        assert_eq!(PodTree::Reality.prefix(None), "reality/");
        assert_eq!(pod_labels_prefix(Some("node1")), "labels/pod/node1/");
        assert_eq!(pod.label_key(), "labels/pod/node1/hello");
        assert_eq!(PodLocation::from_label_id(&pod.label_id()), Some(pod));
        for bad in [
            "hello",
            "a/b/c",
            "/b",
            "a/",
            "../b",
            "a/7c9e6679-7425-40de-944b-e07fc1f90ae7",
        ] {
            assert_eq!(PodLocation::from_label_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn schedule_merges_labels_over_the_record_read() {
        let pod = PodLocation::new("node1", "hello").unwrap();
        let manifest = Manifest::parse(
            "id: hello # kept\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: x\n",
        )
        .unwrap();
        let current = LabelRecord {
            value: Labels::from([("team".into(), "a".into()), ("pod_id".into(), "old".into())]),
            index: 7,
        };
        let ops = schedule_ops(
            &pod,
            &manifest,
            &Labels::from([("pod_id".into(), "hello".into())]),
            &current,
        );
        assert_eq!(
            ops,
            [
                TxnOp::Cas {
                    key: "labels/pod/node1/hello".into(),
                    value: br#"{"pod_id":"hello","team":"a"}"#.to_vec(),
                    index: 7
                },
                TxnOp::Set {
                    key: "intent/node1/hello".into(),
                    value: manifest.raw().as_bytes().to_vec()
                }
            ]
        );
    }

    #[test]
    fn unschedule_removes_exactly_the_given_keys() {
        let pod = PodLocation::new("node1", "hello").unwrap();
        let current = LabelRecord {
            value: Labels::from([
                ("team".into(), "a".into()),
                ("daemon_set_id".into(), "d".into()),
            ]),
            index: 3,
        };
        let ops = unschedule_ops(&pod, ["daemon_set_id", "absent"], &current);
        assert_eq!(
            ops,
            [
                TxnOp::Cas {
                    key: "labels/pod/node1/hello".into(),
                    value: br#"{"team":"a"}"#.to_vec(),
                    index: 3
                },
                TxnOp::Delete {
                    key: "intent/node1/hello".into()
                }
            ]
        );
        let ops = unschedule_ops(&pod, ["team", "daemon_set_id"], &current);
        assert_eq!(
            ops[0],
            TxnOp::DeleteCas {
                key: "labels/pod/node1/hello".into(),
                index: 3
            }
        );
    }
}
