//! Audit log records at `audit_logs/<uuid>`, written in the same transaction as the change.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Such as `REPLICATION_CONTROLLER_RETARGET`.
    pub event_type: String,
    /// Event-specific JSON, kept as written: P2 writes each kind's details from a Go struct,
    /// in its field order, which a JSON value would not keep. See [`AuditRecord::details`].
    pub event_details: Box<RawValue>,
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

impl PartialEq for AuditRecord {
    fn eq(&self, other: &Self) -> bool {
        self.event_type == other.event_type
            && self.event_details.get() == other.event_details.get()
            && self.timestamp == other.timestamp
            && self.schema_version == other.schema_version
    }
}

/// `REPLICATION_CONTROLLER_RETARGET` details, in P2's field order.
#[derive(Serialize)]
struct RcRetargetDetails<'a> {
    pod_id: &'a str,
    availability_zone: String,
    cluster_name: String,
    nodes: &'a [String],
}

/// `ROLLING_UPDATE_COMPLETION` details, in P2's field order.
#[derive(Serialize)]
struct RuCompletionDetails<'a> {
    pod_id: String,
    availability_zone: String,
    cluster_name: String,
    rolling_update_id: &'a str,
    succeeded: bool,
    canceled: bool,
}

/// Daemon-set event details, in P2's field order.
#[derive(Serialize)]
struct DaemonSetDetails<'a> {
    daemon_set: &'a StoredDaemonSet,
    user: &'a str,
}

impl AuditRecord {
    fn new(event_type: &str, details: &impl Serialize, now: SystemTime) -> AuditRecord {
        let details = String::from_utf8(gojson::to_vec(details)).expect("JSON is UTF-8");
        AuditRecord {
            event_type: event_type.to_owned(),
            event_details: RawValue::from_string(details).expect("details are one JSON value"),
            timestamp: format_rfc3339(now),
            schema_version: SCHEMA_VERSION,
        }
    }

    /// The details as a JSON value, to read them.
    pub fn details(&self) -> serde_json::Value {
        serde_json::from_str(self.event_details.get()).expect("a raw value is valid JSON")
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
        let details = RcRetargetDetails {
            pod_id: rc.manifest.pod_id(),
            availability_zone: label(AVAILABILITY_ZONE),
            cluster_name: label(CLUSTER_NAME),
            nodes,
        };
        AuditRecord::new(RC_RETARGET, &details, now)
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
        let details = RuCompletionDetails {
            pod_id: label(POD_ID),
            availability_zone: label(AVAILABILITY_ZONE),
            cluster_name: label(CLUSTER_NAME),
            rolling_update_id: roll_id,
            succeeded,
            canceled,
        };
        AuditRecord::new(RU_COMPLETION, &details, now)
    }

    /// Written with every daemon-set change: the daemon set after the change (before it,
    /// for a delete) and the user who made it.
    pub fn daemon_set(
        event: DaemonSetEvent,
        ds: &StoredDaemonSet,
        user: &str,
        now: SystemTime,
    ) -> AuditRecord {
        let details = DaemonSetDetails {
            daemon_set: ds,
            user,
        };
        AuditRecord::new(event.event_type(), &details, now)
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
            r#"{"event_type":"REPLICATION_CONTROLLER_RETARGET","event_details":{"pod_id":"hello","availability_zone":"us-west-2a","cluster_name":"production","nodes":["node1","node2"]},"timestamp":"2020-01-14T11:06:40Z","schema_version":1}"#
        );
        assert_eq!(AuditRecord::from_json(out.as_bytes()).unwrap(), record);
    }

    #[test]
    fn rc_retarget_without_labels_has_empty_zone_and_cluster() {
        let record = AuditRecord::rc_retarget(&rc(None), &[], now());
        assert_eq!(record.details()["availability_zone"], "");
        assert_eq!(record.details()["cluster_name"], "");
        assert_eq!(record.details()["nodes"], Value::Array(vec![]));
    }

    #[test]
    fn ru_completion_reads_the_roll_labels() {
        let roll_labels = labels(&[("pod_id", "hello"), ("cluster_name", "production")]);
        let record = AuditRecord::ru_completion("ru-1", &roll_labels, true, false, now());
        assert_eq!(record.event_type, "ROLLING_UPDATE_COMPLETION");
        assert!(
            String::from_utf8(record.to_json()).unwrap().contains(
                r#""event_details":{"pod_id":"hello","availability_zone":"","cluster_name":"production","rolling_update_id":"ru-1","succeeded":true,"canceled":false}"#
            ),
            "P2's field order"
        );
        assert_eq!(
            record.details(),
            serde_json::json!({
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
        let written = String::from_utf8(
            AuditRecord::daemon_set(DaemonSetEvent::Created, &ds, "a<b", now()).to_json(),
        )
        .unwrap();
        assert!(
            written.contains(&format!(
                r#""event_details":{{"daemon_set":{},"user":"a\u003cb"}}"#,
                String::from_utf8(ds.to_json()).unwrap()
            )),
            "the daemon set as P2 writes it: {written}"
        );
        for (event, name) in cases {
            let record = AuditRecord::daemon_set(event, &ds, "alice", now());
            assert_eq!(record.event_type, name);
            assert_eq!(record.details()["user"], "alice");
            assert_eq!(
                record.details()["daemon_set"],
                serde_json::to_value(&ds).unwrap()
            );
        }
    }
}
