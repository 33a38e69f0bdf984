//! Scheduling a legacy pod on a node, as the RC and DS farms do: the intent key and the
//! pod's labels change together in one transaction, the labels with CAS on the index the
//! farm read, so a concurrent change to the pod rolls the write back.

use serde_json::json;

use crate::kv::{TxnOp, MAX_TXN_BYTES};
use crate::labels::{LabelType, Labels, DS_ID_LABEL, RC_ID_LABEL};
use crate::model::event::FieldChange;
use crate::model::{Manifest, PodHealth};
use crate::store::labels::{self, LabelRecord};
use crate::store::pods::{self, PodLocation, PodTree};

use super::world::{PodKey, World};

/// How many nodes one transaction schedules `manifest` on, with `labels` on each pod: at most
/// `most`, and few enough that their intents and labels (the manifest and the labels each, in
/// base64 as Consul takes them) fill at most half of what a transaction may carry beside
/// `beside` bytes (an RC's audit record, which lists every node it is on), the rest left to
/// the pods' other labels, their checks and the event. Otherwise a large manifest, large pod
/// labels, or an RC on thousands of nodes, makes every batch one the store refuses, and its
/// pods are never placed.
pub fn nodes_per_txn(manifest: &Manifest, labels: &Labels, most: usize, beside: usize) -> usize {
    /// The pods' other labels, their checks and keys that come with each intent, generously.
    const PER_NODE_REST: usize = 1024;
    let labels = serde_json::to_vec(labels).map_or(0, |json| json.len());
    let base64 = |len: usize| len.div_ceil(3) * 4;
    let per_node = base64(manifest.raw().len()) + base64(labels) + PER_NODE_REST;
    (MAX_TXN_BYTES.saturating_sub(beside) / 2 / per_node).clamp(1, most)
}

/// One transaction's worth of pod changes, gathered node by node: at most a number of nodes,
/// and at most half of what a transaction may carry (the rest left to the event and the
/// fence), measured on the ops themselves. So a pod whose labels another owner made large,
/// written back as they are, never makes a batch the store refuses; and a caller that builds
/// each node's ops only as it pushes them holds one batch of manifests, not one per node.
pub struct Batch<'a> {
    /// The ops of the nodes pushed so far.
    pub ops: Vec<TxnOp>,
    /// The nodes their pods left, and those they were placed (or rewritten) on.
    pub left: Vec<&'a str>,
    pub placed: Vec<&'a str>,
    bytes: usize,
    most: usize,
}

impl<'a> Batch<'a> {
    /// An empty batch of at most `most` nodes.
    pub fn new(most: usize) -> Self {
        Batch {
            ops: Vec::new(),
            left: Vec::new(),
            placed: Vec::new(),
            bytes: 0,
            most,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.left.is_empty() && self.placed.is_empty()
    }

    /// Whether one more node's `ops` fit; an empty batch takes any node's.
    pub fn has_room(&self, ops: &[TxnOp]) -> bool {
        let bytes: usize = ops.iter().map(TxnOp::encoded_len).sum();
        self.is_empty()
            || (self.left.len() + self.placed.len() < self.most
                && self.bytes + bytes <= MAX_TXN_BYTES / 2)
    }

    /// Adds `node`'s `ops`: the pod placed (or rewritten) there if `places`, else leaving it.
    pub fn push(&mut self, node: &'a str, places: bool, ops: Vec<TxnOp>) {
        self.bytes += ops.iter().map(TxnOp::encoded_len).sum::<usize>();
        self.ops.extend(ops);
        match places {
            true => self.placed.push(node),
            false => self.left.push(node),
        }
    }
}

/// The `nodes` change of a `scheduled` event: the nodes its pods `left` (`before`) and those
/// they were `placed` on (`after`). Only the nodes that changed, not every node the object is
/// on, so that an event stays small however large its RC or daemon set.
pub fn nodes_moved(left: &[&str], placed: &[&str]) -> FieldChange {
    FieldChange {
        field: "nodes".to_owned(),
        before: json!(left),
        after: json!(placed),
    }
}

/// The pod's location and its labels as the farm last saw them.
fn seen(world: &World, pod: &PodKey) -> (PodLocation, LabelRecord) {
    (
        PodLocation::stored(&pod.0, &pod.1),
        world.pod_label_record(pod),
    )
}

/// Whether an owner may place `pod` as a new pod of its own: nobody intends it, and its
/// labels do not hold it for another owner ([`held_by_labels`]).
pub fn is_free(world: &World, (node, pod_id): &PodKey) -> bool {
    world.intents.items.get_at(node, pod_id).is_none() && !held_by_labels(world, node, pod_id)
}

/// Whether the labels of pod `pod_id` on `node` hold it for an owner: they name an enabled
/// RC or daemon set, or are not a label set at all. A pod whose intent went (deleted by
/// hand, or by a tool that deletes its labels next) while its labels still name its owner is
/// that owner's to put back: another owner placing it would label it for both, and the two
/// farms would then rewrite its intent in turn for ever, each seeing the other's manifest. A
/// disabled owner puts nothing back, so its labels hold the pod for nobody (the new RC of a
/// roll takes such a pod of the old one, as it would replace it in place). A label key that
/// holds no label set cannot be placed on either: a write must CAS on labels it has read, so
/// placing it would fail, and with it every other node of the same transaction, on every
/// pass.
pub fn held_by_labels(world: &World, node: &str, pod_id: &str) -> bool {
    let Some(entry) = world.pod_labels.items.get_at(node, pod_id) else {
        return false;
    };
    let Some(labels) = entry.labels() else {
        return true;
    };
    let ds = labels
        .get(DS_ID_LABEL)
        .and_then(|id| world.daemon_sets.items.get(id));
    names_enabled_rc(world, labels) || ds.is_some_and(|ds| !ds.value.disabled)
}

/// Whether the labels of `pod` name an enabled RC. A daemon set leaves such a pod to the RC:
/// P2's farms place their pods without looking at another owner's labels, so a pod may be
/// labelled for both, and a daemon set and an RC each writing its own manifest over the
/// other's would rewrite its intent in turn for ever.
pub fn rc_labelled(world: &World, pod: &PodKey) -> bool {
    world
        .pod_labels_of(pod)
        .is_some_and(|labels| names_enabled_rc(world, labels))
}

fn names_enabled_rc(world: &World, labels: &Labels) -> bool {
    labels
        .get(RC_ID_LABEL)
        .and_then(|id| world.rcs.items.get(id))
        .is_some_and(|rc| !rc.value.disabled)
}

/// [`pods::schedule_ops`] at the labels the farm saw. A pod the farm believes absent must
/// still be absent: never overwrite an intent that someone else wrote since it looked.
pub fn schedule_ops(
    world: &World,
    pod: &PodKey,
    manifest: &Manifest,
    labels: &Labels,
) -> Vec<TxnOp> {
    let (location, current) = seen(world, pod);
    let mut ops = Vec::new();
    if world.intent(pod).is_none() {
        ops.push(TxnOp::CheckNotExists {
            key: PodTree::Intent.key(&location),
        });
    }
    ops.extend(pods::schedule_ops(&location, manifest, labels, &current));
    ops
}

/// Schedules `pod` over another owner's pod of the same id, replacing it in place: the
/// owner's label keys `dropped` go, `labels` are merged in (CAS on the labels the farm saw,
/// so the pod must still be the owner's) and the intent is overwritten.
pub fn replace_ops(
    world: &World,
    pod: &PodKey,
    manifest: &Manifest,
    labels: &Labels,
    dropped: &[&str],
) -> Vec<TxnOp> {
    let (location, mut current) = seen(world, pod);
    for key in dropped {
        current.value.remove(*key);
    }
    pods::schedule_ops(&location, manifest, labels, &current)
}

/// [`pods::unschedule_ops`] at the labels the farm saw: delete the intent and remove exactly
/// the label keys `owned`.
pub fn unschedule_ops(world: &World, pod: &PodKey, owned: &[&str]) -> Vec<TxnOp> {
    let (location, current) = seen(world, pod);
    pods::unschedule_ops(&location, owned.iter().copied(), &current)
}

/// The op that removes exactly the label keys `owned` from `pod`'s labels (CAS on the labels
/// the farm saw), leaving its intent: an owner letting go of a pod another owner keeps.
pub fn unlabel_ops(world: &World, pod: &PodKey, owned: &[&str]) -> Vec<TxnOp> {
    let (location, mut current) = seen(world, pod);
    for key in owned {
        current.value.remove(*key);
    }
    labels::write_op(
        LabelType::Pod,
        &location.label_id(),
        &current.value,
        current.index,
    )
    .into_iter()
    .collect()
}

/// How `pod` counts towards an owner that wants `wanted` on its node, by the one rule of
/// [`PodHealth::of`].
pub fn pod_health(world: &World, pod: &PodKey, wanted: &Manifest) -> PodHealth {
    let running = world
        .reality_of(pod)
        .and_then(|raw| stored_sha(raw, wanted));
    PodHealth::of(
        &wanted.sha(),
        running.as_deref(),
        world.health.items.get(pod),
    )
}

/// Whether stored manifest bytes describe `manifest`: the same SHA (the same bytes need no
/// SHA at all, which is the usual case on every pass over a converged fleet).
pub fn same_manifest(raw: &[u8], manifest: &Manifest) -> bool {
    raw == manifest.raw().as_bytes()
        || stored_sha(raw, manifest).is_some_and(|sha| sha == manifest.sha())
}

/// The SHA of stored manifest bytes (`None`: not a manifest); bytes equal to `known`'s are
/// not parsed again.
fn stored_sha(raw: &[u8], known: &Manifest) -> Option<String> {
    if raw == known.raw().as_bytes() {
        return Some(known.sha());
    }
    let parsed = Manifest::parse(std::str::from_utf8(raw).ok()?).ok()?;
    Some(parsed.sha())
}
