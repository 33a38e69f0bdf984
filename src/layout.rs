//! The one catalogue of P2's trees and key shapes. Every key this server reads or writes is
//! spelled here and nowhere else, so that "which keys does P2 share with us?" has one answer.
//!
//! Segments passed to the builders must already be valid IDs (see [`crate::model`] and
//! [`crate::labels::LabelType::validate_id`]); these functions only join them.

use std::fmt::Display;

use crate::labels::LabelType;
use crate::model::event::ObjectKind;

/// RC documents: `replication_controllers/<rc-id>`.
pub const RCS: &str = "replication_controllers/";
/// Rolling-update documents, keyed by the new RC's ID: `rolls/<rc-id>`.
pub const ROLLS: &str = "rolls/";
/// Daemon-set documents: `daemon_sets/<ds-id>`.
pub const DAEMON_SETS: &str = "daemon_sets/";
/// Label sets of every type: `labels/<type>/<id>`.
pub const LABELS: &str = "labels/";
/// What should run on each node: `intent/<node>/<pod-id>`, the manifest.
pub const INTENT: &str = "intent/";
/// What the node's preparer installed: `reality/<node>/<pod-id>`, the manifest.
pub const REALITY: &str = "reality/";
/// Health records by service: `health/<pod-id>/<node>`.
pub const HEALTH: &str = "health/";
/// Audit records: `audit_logs/<uuid>`.
pub const AUDIT_LOGS: &str = "audit_logs/";
/// Status records that farms keep per daemon set: `status/daemon_sets/<ds-id>/<namespace>`.
pub const DS_STATUS: &str = "status/daemon_sets/";
/// Every lock, P2's and ours.
pub const LOCKS: &str = "lock/";
/// RC ownership locks and, below each, the mutation and update-creation locks.
pub const RC_LOCKS: &str = "lock/replication_controllers/";
/// Roll ownership locks.
pub const ROLL_LOCKS: &str = "lock/rolls/";
/// Daemon-set ownership locks.
pub const DS_LOCKS: &str = "lock/daemon_sets/";
/// Held by the leader's session; its value names the holder. P2's tools ignore it.
pub const LEADER_LOCK: &str = "lock/p2-apiserver/leader";

/// Everything this server keeps beside P2's trees; P2's tools never read under it.
pub const OURS: &str = "p2-apiserver/";
/// Never written: the server reads it to learn the store's index (on Consul, a read of a
/// missing key answers the KV table's).
pub const INDEX_PROBE: &str = "p2-apiserver/index-probe";
/// Status conditions the farms compute: `p2-apiserver/conditions/<kind>/<id>`.
pub const CONDITIONS: &str = "p2-apiserver/conditions/";
/// Events: `p2-apiserver/events/<sortable id>`.
pub const EVENTS: &str = "p2-apiserver/events/";
/// Created and modified times: `p2-apiserver/meta/<kind>/<id>`, kind `rcs`, `rolls` or
/// `daemon_sets`.
pub const META: &str = "p2-apiserver/meta/";
/// Finished rolls: `p2-apiserver/history/rolls/<id>`.
pub const ROLL_HISTORY: &str = "p2-apiserver/history/rolls/";

/// The namespace under which the DS farm keeps its status record, as P2's DS farm names it.
pub const DS_FARM_STATUS_NAMESPACE: &str = "daemon_set_farm";

/// `replication_controllers/<id>`.
pub fn rc(id: impl Display) -> String {
    format!("{RCS}{id}")
}

/// The RC id a key of the RC tree names (the key itself if it is outside the tree).
pub fn rc_id(key: &str) -> &str {
    key.strip_prefix(RCS).unwrap_or(key)
}

/// `rolls/<id>`: a roll's ID is its new RC's ID.
pub fn roll(id: impl Display) -> String {
    format!("{ROLLS}{id}")
}

/// `daemon_sets/<id>`.
pub fn daemon_set(id: impl Display) -> String {
    format!("{DAEMON_SETS}{id}")
}

/// `status/daemon_sets/<id>/daemon_set_farm`: the DS farm's status record.
pub fn ds_farm_status(id: impl Display) -> String {
    format!("{DS_STATUS}{id}/{DS_FARM_STATUS_NAMESPACE}")
}

/// The daemon set whose DS farm status record is at `key`, if it is one.
pub fn ds_farm_status_owner(key: &str) -> Option<&str> {
    let id = key
        .strip_prefix(DS_STATUS)?
        .strip_suffix(DS_FARM_STATUS_NAMESPACE)?
        .strip_suffix('/')?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// `p2-apiserver/conditions/<kind>/`: the conditions of every object of one kind.
pub fn conditions_of_kind(kind: ObjectKind) -> String {
    format!("{CONDITIONS}{}/", segment(kind))
}

/// `p2-apiserver/conditions/<kind>/<id>`: one object's conditions.
pub fn conditions(kind: ObjectKind, id: impl Display) -> String {
    format!("{CONDITIONS}{}/{id}", segment(kind))
}

/// `labels/<type>/`: every label set of one type, with the trailing `/` so that a prefix
/// listing cannot pick up a sibling type whose name merely starts the same.
pub fn labels_of_type(label_type: LabelType) -> String {
    format!("{LABELS}{}/", label_type.as_str())
}

/// `labels/<type>/<id>`; `id` must have passed [`LabelType::validate_id`].
pub fn labels(label_type: LabelType, id: &str) -> String {
    format!("{LABELS}{}/{id}", label_type.as_str())
}

/// `<tree><node>/<pod-id>` in the intent or reality tree.
pub fn pod(tree: &str, node: &str, pod_id: &str) -> String {
    format!("{tree}{node}/{pod_id}")
}

/// `health/<pod-id>/`: every node's health record for one service.
pub fn health_of_pod(pod_id: &str) -> String {
    format!("{HEALTH}{pod_id}/")
}

/// `health/<pod-id>/<node>`.
pub fn health(pod_id: &str, node: &str) -> String {
    format!("{HEALTH}{pod_id}/{node}")
}

/// A fresh `audit_logs/<uuid>` key, time-ordered (v7) so that new records are appended to
/// the store's key order rather than scattered through it (P2's are v4).
pub fn new_audit_log() -> String {
    format!("{AUDIT_LOGS}{}", uuid::Uuid::now_v7())
}

/// `p2-apiserver/events/<id>`.
pub fn event(id: &str) -> String {
    format!("{EVENTS}{id}")
}

/// `p2-apiserver/meta/<kind>/<id>`: the created and modified times of an object.
pub fn meta(kind: ObjectKind, id: impl Display) -> String {
    format!("{META}{}/{id}", segment(kind))
}

/// The object whose times a meta key holds: its kind and id.
pub fn meta_object(key: &str) -> Option<(ObjectKind, &str)> {
    let (kind, id) = key.strip_prefix(META)?.split_once('/')?;
    let kind = ObjectKind::ALL
        .into_iter()
        .find(|candidate| segment(*candidate) == kind)?;
    Some((kind, id))
}

/// The key segment naming `kind` in the trees beside P2's.
fn segment(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::Rcs => "rcs",
        ObjectKind::Rolls => "rolls",
        ObjectKind::Daemonsets => "daemon_sets",
    }
}

/// The key of the P2 document of `kind` `id`.
pub fn object(kind: ObjectKind, id: impl Display) -> String {
    match kind {
        ObjectKind::Rcs => rc(id),
        ObjectKind::Rolls => roll(id),
        ObjectKind::Daemonsets => daemon_set(id),
    }
}

/// `p2-apiserver/history/rolls/<id>`.
pub fn roll_history(id: impl Display) -> String {
    format!("{ROLL_HISTORY}{id}")
}

/// Which farm runs an RC: `lock/replication_controllers/<id>`.
pub fn rc_ownership(rc_id: impl Display) -> String {
    format!("{RC_LOCKS}{rc_id}")
}

/// Held by a running roll (or a node transfer): nobody else may change the RC's counts.
pub fn rc_mutation(rc_id: impl Display) -> String {
    format!("{RC_LOCKS}{rc_id}/update")
}

/// Held while a roll over the RC is being created, so no two rolls are created over it.
pub fn rc_update_creation(rc_id: impl Display) -> String {
    format!("{RC_LOCKS}{rc_id}/update_creation")
}

/// Which farm runs a roll: `lock/rolls/<id>`.
pub fn roll_ownership(roll_id: impl Display) -> String {
    format!("{ROLL_LOCKS}{roll_id}")
}

/// Which farm runs a daemon set: `lock/daemon_sets/<id>`.
pub fn ds_ownership(ds_id: impl Display) -> String {
    format!("{DS_LOCKS}{ds_id}")
}

/// Which farm runs an object of `kind`: its farm's ownership lock.
pub fn ownership(kind: ObjectKind, id: impl Display) -> String {
    match kind {
        ObjectKind::Rcs => rc_ownership(id),
        ObjectKind::Rolls => roll_ownership(id),
        ObjectKind::Daemonsets => ds_ownership(id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_p2s_shapes() {
        let id = "5a0e3b8c-1f2d-4e5f-8a9b-0c1d2e3f4a5b";
        assert_eq!(rc(id), format!("replication_controllers/{id}"));
        assert_eq!(roll(id), format!("rolls/{id}"));
        assert_eq!(daemon_set(id), format!("daemon_sets/{id}"));
        assert_eq!(
            ds_farm_status(id),
            format!("status/daemon_sets/{id}/daemon_set_farm")
        );
        assert_eq!(ds_farm_status_owner(&ds_farm_status(id)), Some(id));
        assert_eq!(ds_farm_status_owner("status/daemon_sets/x/other"), None);
        assert_eq!(
            labels(LabelType::Pod, "node1/hello"),
            "labels/pod/node1/hello"
        );
        assert_eq!(labels_of_type(LabelType::Node), "labels/node/");
        assert_eq!(
            labels_of_type(LabelType::PodClusters),
            "labels/pod_clusters/"
        );
        assert_eq!(
            labels(LabelType::ReplicationController, "5a0e3b8c"),
            "labels/replication_controller/5a0e3b8c"
        );
        assert_eq!(pod(INTENT, "node1", "hello"), "intent/node1/hello");
        assert_eq!(health("hello", "node1"), "health/hello/node1");
        assert_eq!(
            rc_mutation(id),
            format!("lock/replication_controllers/{id}/update")
        );
        assert_eq!(
            rc_update_creation(id),
            format!("lock/replication_controllers/{id}/update_creation")
        );
        assert!(new_audit_log().starts_with("audit_logs/"));
        assert_eq!(
            conditions(ObjectKind::Daemonsets, id),
            format!("p2-apiserver/conditions/daemon_sets/{id}")
        );
        assert!(conditions(ObjectKind::Rcs, id).starts_with(OURS));
        assert_eq!(
            meta(ObjectKind::Daemonsets, id),
            format!("p2-apiserver/meta/daemon_sets/{id}")
        );
        for kind in ObjectKind::ALL {
            let key = meta(kind, id);
            assert_eq!(meta_object(&key), Some((kind, id)));
        }
        assert_eq!(roll_history(id), format!("p2-apiserver/history/rolls/{id}"));
    }
}
