//! Scheduling a legacy pod on a node, as the RC and DS farms do: the intent key and the
//! pod's labels change together in one transaction, the labels with CAS on the index the
//! farm read, so a concurrent change to the pod rolls the write back.

use crate::kv::TxnOp;
use crate::labels::Labels;
use crate::model::Manifest;
use crate::store::labels::LabelRecord;
use crate::store::pods::{self, PodLocation, PodTree};

use super::world::{PodKey, World};

/// The pod's location and its labels as the farm last saw them.
fn seen(world: &World, pod: &PodKey) -> (PodLocation, LabelRecord) {
    let current = world.pod_labels.items.get(pod).cloned().unwrap_or_default();
    (PodLocation::stored(&pod.0, &pod.1), current)
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
    if !world.intents.items.contains_key(pod) {
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

/// Whether a node runs what it is intended to: the same bytes, or the same manifest SHA (a
/// preparer may write reality re-rendered).
pub fn runs_intent(reality: &[u8], intent: &[u8]) -> bool {
    reality == intent
        || std::str::from_utf8(intent)
            .ok()
            .and_then(|text| Manifest::parse(text).ok())
            .is_some_and(|intent| same_manifest(reality, &intent))
}

/// Whether stored manifest bytes describe `manifest`: the same bytes, or the same SHA.
pub fn same_manifest(raw: &[u8], manifest: &Manifest) -> bool {
    raw == manifest.raw().as_bytes()
        || std::str::from_utf8(raw)
            .ok()
            .and_then(|text| Manifest::parse(text).ok())
            .is_some_and(|other| other.sha() == manifest.sha())
}
