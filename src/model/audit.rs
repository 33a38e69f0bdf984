//! Audit log records at `audit_logs/<uuid>`, written in the same transaction as the change.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::gojson;
use super::timestamp::format_rfc3339;
use super::{DecodeError, StoredDaemonSet, StoredRc};

/// The only audit schema P2 writes.
pub const SCHEMA_VERSION: i64 = 1;

const RC_RETARGET: &str = "REPLICATION_CONTROLLER_RETARGET";
const RU_COMPLETION: &str = "ROLLING_UPDATE_COMPLETION";
const POD_ID: &str = "pod_id";
const AVAILABILITY_ZONE: &str = "availability_zone";
const CLUSTER_NAME: &str = "cluster_name";

/// One audit record. `event_type` stays a string so records written by other tools (with
/// types this server does not produce) still list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Such as `REPLICATION_CONTROLLER_RETARGET`.
    pub event_type: String,
    /// Event-specific JSON.
    pub event_details: serde_json::Value,
    /// RFC 3339 time of the change.
    pub timestamp: String,
    /// Always [`SCHEMA_VERSION`] for records written here.
    pub schema_version: i64,
}

/// Daemon-set changes that are audited, each with its own event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DaemonSetEvent {
    /// `DAEMON_SET_CREATED`.
    Created,
    /// `DAEMON_SET_MANIFEST_UPDATED`.
    ManifestUpdated,
    /// `DAEMON_SET_NODE_SELECTOR_UPDATED`.
    NodeSelectorUpdated,
    /// `DAEMON_SET_DELETED`; the record carries the state before deletion.
    Deleted,
    /// `DAEMON_SET_ENABLED`.
    Enabled,
    /// `DAEMON_SET_DISABLED`.
    Disabled,
    /// `DAEMON_SET_MODIFIED`, for any other change (min health, timeout, name).
    Modified,
}

impl DaemonSetEvent {
    /// The stored event type.
    pub fn event_type(self) -> &'static str {
        match self {
            DaemonSetEvent::Created => "DAEMON_SET_CREATED",
            DaemonSetEvent::ManifestUpdated => "DAEMON_SET_MANIFEST_UPDATED",
            DaemonSetEvent::NodeSelectorUpdated => "DAEMON_SET_NODE_SELECTOR_UPDATED",
            DaemonSetEvent::Deleted => "DAEMON_SET_DELETED",
            DaemonSetEvent::Enabled => "DAEMON_SET_ENABLED",
            DaemonSetEvent::Disabled => "DAEMON_SET_DISABLED",
            DaemonSetEvent::Modified => "DAEMON_SET_MODIFIED",
        }
    }
}

impl AuditRecord {
    fn new(event_type: &str, event_details: serde_json::Value, now: SystemTime) -> AuditRecord {
        AuditRecord {
            event_type: event_type.to_owned(),
            event_details,
            timestamp: format_rfc3339(now),
            schema_version: SCHEMA_VERSION,
        }
    }

    /// Written with every RC scheduling transaction: `nodes` is every node the RC is on
    /// once the transaction commits; zone and cluster come from the RC's pod labels.
    pub fn rc_retarget(rc: &StoredRc, nodes: &[String], now: SystemTime) -> AuditRecord {
        let label = |key: &str| {
            rc.pod_labels
                .as_ref()
                .and_then(|labels| labels.get(key))
                .cloned()
                .unwrap_or_default()
        };
        let details = json!({
            POD_ID: rc.manifest.pod_id(),
            AVAILABILITY_ZONE: label(AVAILABILITY_ZONE),
            CLUSTER_NAME: label(CLUSTER_NAME),
            "nodes": nodes,
        });
        AuditRecord::new(RC_RETARGET, details, now)
    }

    /// Written when a rolling update is deleted; pod ID, zone and cluster come from the
    /// roll's labels, by P2's convention.
    pub fn ru_completion(
        roll_id: &str,
        roll_labels: &BTreeMap<String, String>,
        succeeded: bool,
        canceled: bool,
        now: SystemTime,
    ) -> AuditRecord {
        let label = |key: &str| roll_labels.get(key).cloned().unwrap_or_default();
        let details = json!({
            POD_ID: label(POD_ID),
            AVAILABILITY_ZONE: label(AVAILABILITY_ZONE),
            CLUSTER_NAME: label(CLUSTER_NAME),
            "rolling_update_id": roll_id,
            "succeeded": succeeded,
            "canceled": canceled,
        });
        AuditRecord::new(RU_COMPLETION, details, now)
    }

    /// Written with every daemon-set change: the daemon set after the change (before it,
    /// for a delete) and the user who made it.
    pub fn daemon_set(
        event: DaemonSetEvent,
        ds: &StoredDaemonSet,
        user: &str,
        now: SystemTime,
    ) -> AuditRecord {
        let details = json!({"daemon_set": ds, "user": user});
        AuditRecord::new(event.event_type(), details, now)
    }

    /// Decodes a stored record.
    pub fn from_json(bytes: &[u8]) -> Result<AuditRecord, DecodeError> {
        serde_json::from_slice(bytes).map_err(|e| DecodeError::new("audit record", e))
    }

    /// Encodes the record in P2's key order.
    pub fn to_json(&self) -> Vec<u8> {
        gojson::to_vec(self)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use serde_json::Value;

    use super::*;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_579_000_000)
    }

    fn rc(pod_labels: Option<BTreeMap<String, String>>) -> StoredRc {
        StoredRc {
            id: "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11".into(),
            manifest: crate::model::Manifest::parse("id: hello\n").unwrap(),
            node_selector: String::new(),
            pod_labels,
            replicas_desired: 2,
            disabled: false,
            allocation_strategy: Default::default(),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn rc_retarget_reads_zone_and_cluster_from_pod_labels() {
        let rc = rc(Some(labels(&[
            ("availability_zone", "us-west-2a"),
            ("cluster_name", "production"),
        ])));
        let nodes = vec!["node1".to_owned(), "node2".to_owned()];
        let record = AuditRecord::rc_retarget(&rc, &nodes, now());
        let out = String::from_utf8(record.to_json()).unwrap();
        assert_eq!(
            out,
            r#"{"event_type":"REPLICATION_CONTROLLER_RETARGET","event_details":{"availability_zone":"us-west-2a","cluster_name":"production","nodes":["node1","node2"],"pod_id":"hello"},"timestamp":"2020-01-14T11:06:40Z","schema_version":1}"#
        );
        assert_eq!(AuditRecord::from_json(out.as_bytes()).unwrap(), record);
    }

    #[test]
    fn rc_retarget_without_labels_has_empty_zone_and_cluster() {
        let record = AuditRecord::rc_retarget(&rc(None), &[], now());
        assert_eq!(record.event_details["availability_zone"], "");
        assert_eq!(record.event_details["cluster_name"], "");
        assert_eq!(record.event_details["nodes"], Value::Array(vec![]));
    }

    #[test]
    fn ru_completion_reads_the_roll_labels() {
        let roll_labels = labels(&[("pod_id", "hello"), ("cluster_name", "production")]);
        let record = AuditRecord::ru_completion("ru-1", &roll_labels, true, false, now());
        assert_eq!(record.event_type, "ROLLING_UPDATE_COMPLETION");
        assert_eq!(
            record.event_details,
            json!({
                "pod_id": "hello", "availability_zone": "", "cluster_name": "production",
                "rolling_update_id": "ru-1", "succeeded": true, "canceled": false
            })
        );
        assert_eq!(record.schema_version, 1);
    }

    #[test]
    fn daemon_set_events_carry_the_daemon_set_and_user() {
        let ds = StoredDaemonSet::from_json(
            br#"{"id":"d1","disabled":true,"manifest":"id: shipper\n","min_health":0,"cluster_name":"prod","node_selector":"","pod_id":"shipper","timeout":1000}"#,
        )
        .unwrap();
        let cases = [
            (DaemonSetEvent::Created, "DAEMON_SET_CREATED"),
            (
                DaemonSetEvent::ManifestUpdated,
                "DAEMON_SET_MANIFEST_UPDATED",
            ),
            (
                DaemonSetEvent::NodeSelectorUpdated,
                "DAEMON_SET_NODE_SELECTOR_UPDATED",
            ),
            (DaemonSetEvent::Deleted, "DAEMON_SET_DELETED"),
            (DaemonSetEvent::Enabled, "DAEMON_SET_ENABLED"),
            (DaemonSetEvent::Disabled, "DAEMON_SET_DISABLED"),
            (DaemonSetEvent::Modified, "DAEMON_SET_MODIFIED"),
        ];
        for (event, name) in cases {
            let record = AuditRecord::daemon_set(event, &ds, "alice", now());
            assert_eq!(record.event_type, name);
            assert_eq!(record.event_details["user"], "alice");
            assert_eq!(
                record.event_details["daemon_set"],
                serde_json::to_value(&ds).unwrap()
            );
        }
    }
}
