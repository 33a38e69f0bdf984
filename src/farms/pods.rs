//! Scheduling a legacy pod on a node, as the RC and DS farms do: the intent key and the
//! pod's labels change together in one transaction, the labels with CAS on the index the
//! farm read, so a concurrent change to the pod rolls the write back.

use serde_json::json;

use crate::kv::{TxnOp, MAX_TXN_BYTES};
use crate::labels::{CompactLabels, LabelType, Labels, DS_ID_LABEL, RC_ID_LABEL};
use crate::model::event::FieldChange;
use crate::model::{Manifest, PodHealth};
use crate::store::labels::{self, LabelRecord};
use crate::store::pods::{self, PodLocation, PodTree};

use super::world::{PodKey, World};

/// Nodes changed per transaction: at most 3 ops each (a check, the labels, the intent), plus
/// the fence, the event, the owner's check of its own version and an RC's audit record,
/// within the 64-op limit; fewer when their ops are large ([`batches`]).
pub const NODES_PER_TXN: usize = 20;

/// One transaction's worth of an owner's pod changes: the ops of its nodes, the nodes its pods
/// left, and those they were placed (or rewritten) on.
#[derive(Default)]
pub struct Batch<'a> {
    pub ops: Vec<TxnOp>,
    pub left: Vec<&'a str>,
    pub placed: Vec<&'a str>,
}

/// Gathers pod `changes` (each a node, whether the pod is placed there or leaves it, and its
/// ops) into batches: at most [`NODES_PER_TXN`] nodes, and at most half of what a transaction
/// may carry beside `beside` bytes (an RC's audit record, which lists every node it is on),
/// measured on the ops themselves; the rest is left to the event and the fence. Otherwise a
/// large manifest, large labels (an owner's own, or another owner's written back as they
/// are), or an RC on thousands of nodes, makes every batch one the store refuses, and its
/// pods are never placed. A change's ops are built only as its batch is gathered, so a
/// placement over the whole fleet holds a batch of manifests, not one per node.
pub fn batches<'a, I>(changes: I, beside: usize) -> Batches<'a, I>
where
    I: Iterator<Item = PodChange<'a>>,
{
    Batches {
        changes,
        next: None,
        room: MAX_TXN_BYTES.saturating_sub(beside) / 2,
    }
}

/// A node, whether an owner's pod is placed there (or rewritten) rather than leaving it,
/// and the ops of that.
pub type PodChange<'a> = (&'a str, bool, Vec<TxnOp>);

/// The iterator of [`batches`].
pub struct Batches<'a, I> {
    changes: I,
    /// The change that did not fit in the last batch.
    next: Option<PodChange<'a>>,
    /// At most how many bytes of ops one batch holds.
    room: usize,
}

impl<'a, I> Batches<'a, I> {
    /// Whether every change is in the batches returned so far: a batch ends early only
    /// when the next change does not fit, which it keeps for the next batch.
    pub fn done(&self) -> bool {
        self.next.is_none()
    }
}

impl<'a, I: Iterator<Item = PodChange<'a>>> Iterator for Batches<'a, I> {
    type Item = Batch<'a>;

    fn next(&mut self) -> Option<Batch<'a>> {
        let mut batch = Batch::default();
        let mut bytes = 0;
        while let Some((node, places, ops)) = self.next.take().or_else(|| self.changes.next()) {
            let size: usize = ops.iter().map(TxnOp::encoded_len).sum();
            let nodes = batch.left.len() + batch.placed.len();
            // An empty batch takes any node's ops.
            if nodes > 0 && (nodes == NODES_PER_TXN || bytes + size > self.room) {
                self.next = Some((node, places, ops));
                break;
            }
            bytes += size;
            batch.ops.extend(ops);
            match places {
                true => batch.placed.push(node),
                false => batch.left.push(node),
            }
        }
        (!batch.left.is_empty() || !batch.placed.is_empty()).then_some(batch)
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
    let Some(entry) = world.pod_labels.items().get_at(node, pod_id) else {
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

fn names_enabled_rc(world: &World, labels: &CompactLabels) -> bool {
    labels
        .get(RC_ID_LABEL)
        .and_then(|id| world.rcs.items().get(id))
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
    label_ops(world, pod, |labels| {
        for key in owned {
            labels.remove(*key);
        }
    })
}

/// The op that merges `labels` into `pod`'s labels (CAS on the labels the farm saw), leaving
/// its intent: an owner taking over a pod that already runs its manifest.
pub fn relabel_ops(world: &World, pod: &PodKey, labels: &Labels) -> Vec<TxnOp> {
    label_ops(world, pod, |current| {
        current.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    })
}

/// The op writing `pod`'s labels as `change` makes them from those the farm saw (CAS on
/// them).
fn label_ops(world: &World, pod: &PodKey, change: impl FnOnce(&mut Labels)) -> Vec<TxnOp> {
    let (location, mut current) = seen(world, pod);
    change(&mut current.value);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A change on `node` whose one op carries `bytes` of value, as Consul encodes it.
    fn change(node: &str, bytes: usize) -> PodChange<'_> {
        let value = vec![b'x'; bytes / 4 * 3];
        (
            node,
            true,
            vec![TxnOp::Set {
                key: "k".into(),
                value,
            }],
        )
    }

    fn sizes<'a>(batches: impl Iterator<Item = Batch<'a>>) -> Vec<usize> {
        batches.map(|batch| batch.placed.len()).collect()
    }

    #[test]
    fn a_batch_holds_at_most_its_nodes_and_half_a_transaction_beside_what_goes_with_it() {
        let names: Vec<String> = (0..45).map(|i| format!("n{i}")).collect();
        let small = names.iter().map(|node| change(node, 100));
        assert_eq!(sizes(batches(small, 0)), [20, 20, 5]);
        let tenth = MAX_TXN_BYTES / 10;
        let large = names[..7].iter().map(|node| change(node, tenth));
        assert_eq!(sizes(batches(large.clone(), 0)), [4, 3]);
        // The room beside an RC's audit record.
        assert_eq!(sizes(batches(large, MAX_TXN_BYTES / 2)), [2, 2, 2, 1]);
        // A change too large for any batch goes alone, for the store to refuse.
        let huge = names[..2].iter().map(|node| change(node, MAX_TXN_BYTES));
        assert_eq!(sizes(batches(huge, 0)), [1, 1]);
    }

    #[test]
    fn batches_are_done_once_every_change_is_in_one() {
        let names: Vec<String> = (0..40).map(|i| format!("n{i}")).collect();
        let mut batches = batches(names.iter().map(|node| change(node, 100)), 0);
        assert!(batches.next().is_some() && !batches.done());
        assert!(batches.next().is_some() && batches.done());
        assert!(batches.next().is_none());
    }
}
