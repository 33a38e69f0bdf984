//! Scheduling a legacy pod on a node, as the RC and DS farms do: the intent key and the
//! pod's labels change together in one transaction, the labels with CAS on the index the
//! farm read, so a concurrent change to the pod rolls the write back.

use crate::labels::{LabelType, Labels};
use crate::model::Manifest;
use crate::store::labels::write_op;
use crate::store::TxnOp;

use super::world::{PodKey, World};

/// The key of a pod's intended manifest.
pub fn intent_key(node: &str, pod_id: &str) -> String {
    format!("intent/{node}/{pod_id}")
}

/// The label id of a legacy pod.
pub fn pod_label_id(node: &str, pod_id: &str) -> String {
    format!("{node}/{pod_id}")
}

/// Ops that set the pod's intent to `manifest` and merge `labels` into its labels.
pub fn schedule_ops(world: &World, pod: &PodKey, manifest: &[u8], labels: &Labels) -> Vec<TxnOp> {
    let (node, pod_id) = pod;
    let current = world.pod_labels.items.get(pod);
    let mut merged = current.map(|v| v.value.clone()).unwrap_or_default();
    merged.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut ops = Vec::new();
    // A pod the farm believes absent must still be absent: never overwrite an intent that
    // someone else wrote since the farm looked.
    if !world.intents.items.contains_key(pod) {
        ops.push(TxnOp::CheckNotExists {
            key: intent_key(node, pod_id),
        });
    }
    ops.push(TxnOp::Set {
        key: intent_key(node, pod_id),
        value: manifest.to_vec(),
    });
    let index = current.map_or(0, |v| v.index);
    ops.extend(write_op(
        LabelType::Pod,
        &pod_label_id(node, pod_id),
        &merged,
        index,
    ));
    ops
}

/// Ops that delete the pod's intent and remove exactly the label keys `owned` from it.
pub fn unschedule_ops(world: &World, pod: &PodKey, owned: &[&str]) -> Vec<TxnOp> {
    let (node, pod_id) = pod;
    let mut ops = vec![TxnOp::Delete {
        key: intent_key(node, pod_id),
    }];
    if let Some(current) = world.pod_labels.items.get(pod) {
        let mut remaining = current.value.clone();
        for key in owned {
            remaining.remove(*key);
        }
        ops.extend(write_op(
            LabelType::Pod,
            &pod_label_id(node, pod_id),
            &remaining,
            current.index,
        ));
    }
    ops
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
