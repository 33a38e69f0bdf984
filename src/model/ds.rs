//! Daemon sets as stored at `daemon_sets/<ds-id>`, in P2's `RawDaemonSet` shape.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::timeout_nanos;
use super::gojson::{self, Folded};
use super::{join_errors, DecodeError, FieldError, Manifest};
use crate::labels::{Labels, CLUSTER_NAME_LABEL, POD_ID_LABEL};

/// One daemon set: a pod run on every node matching a selector. Field order is P2's write
/// order; `node_selector` is kept as selector text and validated by the label layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Folded<RawDaemonSet>")]
pub struct StoredDaemonSet {
    /// A UUID (v7 when this server made it, v4 when P2 did), also the key's last segment.
    pub id: String,
    /// Pauses the daemon set.
    pub disabled: bool,
    /// The pod manifest, written as its raw YAML string.
    pub manifest: Manifest,
    /// Nodes that must stay healthy while the farm replaces pods with a new manifest; P2's
    /// farm does not use it.
    pub min_health: i64,
    /// Free-form name such as `production`.
    pub cluster_name: String,
    /// Selector text; `""` selects every node.
    pub node_selector: String,
    /// Must equal the manifest's `id` (see [`StoredDaemonSet::validate`]).
    pub pod_id: String,
    /// Per-node replication timeout; stored as nanoseconds, negative (P2's "none") read as
    /// [`super::duration::NO_TIMEOUT`].
    #[serde(with = "timeout_nanos")]
    pub timeout: Duration,
}

impl StoredDaemonSet {
    /// Decodes a stored daemon set; a document without a manifest is refused, as P2 does.
    /// The pod-ID invariant is not rechecked on read, only on writes.
    pub fn from_json(bytes: &[u8]) -> Result<StoredDaemonSet, DecodeError> {
        let raw: Folded<RawDaemonSet> = serde_json::from_slice(bytes).map_err(decode_error)?;
        StoredDaemonSet::try_from(raw).map_err(decode_error)
    }

    /// The labels a listing's selector matches. P2 has no daemon-set label type, so they are
    /// the daemon set's own `pod_id` and `cluster_name`, under the keys RC and pod-cluster
    /// labels give the same facts.
    pub fn labels(&self) -> Labels {
        Labels::from([
            (POD_ID_LABEL.to_owned(), self.pod_id.clone()),
            (CLUSTER_NAME_LABEL.to_owned(), self.cluster_name.clone()),
        ])
    }

    /// Encodes the daemon set exactly as P2 writes it.
    pub fn to_json(&self) -> Vec<u8> {
        gojson::to_vec(self)
    }

    /// The invariant P2 checks on create and on every change: `pod_id` is set and equals
    /// the manifest's `id`, so the pods a daemon set schedules are the pods it owns.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        if self.pod_id.is_empty() {
            return Err(vec![FieldError::new("pod_id", "is required")]);
        }
        if self.pod_id != self.manifest.pod_id() {
            return Err(vec![FieldError::new(
                "pod_id",
                format!(
                    "must equal the manifest's id ({:?}), not {:?}",
                    self.manifest.pod_id(),
                    self.pod_id
                ),
            )]);
        }
        Ok(())
    }
}

fn decode_error(message: impl fmt::Display) -> DecodeError {
    DecodeError::new("daemon set", message)
}

#[derive(Deserialize)]
struct RawDaemonSet {
    #[serde(default)]
    id: String,
    #[serde(default)]
    disabled: bool,
    #[serde(default)]
    manifest: String,
    #[serde(default)]
    min_health: i64,
    #[serde(default)]
    cluster_name: String,
    #[serde(default)]
    node_selector: String,
    #[serde(default)]
    pod_id: String,
    #[serde(default, with = "timeout_nanos")]
    timeout: Duration,
}

impl TryFrom<Folded<RawDaemonSet>> for StoredDaemonSet {
    type Error = String;

    fn try_from(Folded(raw): Folded<RawDaemonSet>) -> Result<Self, Self::Error> {
        if raw.manifest.is_empty() {
            return Err("daemon set has no manifest".to_owned());
        }
        let manifest = Manifest::parse(&raw.manifest)
            .map_err(|errors| format!("invalid manifest: {}", join_errors(&errors)))?;
        Ok(StoredDaemonSet {
            id: raw.id,
            disabled: raw.disabled,
            manifest,
            min_health: raw.min_health,
            cluster_name: raw.cluster_name,
            node_selector: raw.node_selector,
            pod_id: raw.pod_id,
            timeout: raw.timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    /// P2's example daemon set, on one line as Go writes it.
    const EXAMPLE: &str = r#"{"id":"1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e","disabled":false,"manifest":"id: p2-log-shipper\nlaunchables:\n  shipper:\n    launchable_type: hoist\n    location: https://artifacts.example.com/shipper_ab12.tar.gz\nconfig: {}\n","min_health":0,"cluster_name":"production","node_selector":"role!=db","pod_id":"p2-log-shipper","timeout":600000000000}"#;

    fn example_value() -> Value {
        serde_json::from_str(EXAMPLE).unwrap()
    }

    fn decode(value: &Value) -> Result<StoredDaemonSet, DecodeError> {
        StoredDaemonSet::from_json(value.to_string().as_bytes())
    }

    #[test]
    fn decodes_and_re_encodes_the_p2_example_byte_for_byte() {
        let ds = StoredDaemonSet::from_json(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(ds.id, "1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e");
        assert!(!ds.disabled);
        assert_eq!(ds.manifest.pod_id(), "p2-log-shipper");
        assert_eq!(ds.min_health, 0);
        assert_eq!(ds.cluster_name, "production");
        assert_eq!(ds.node_selector, "role!=db");
        assert_eq!(ds.pod_id, "p2-log-shipper");
        assert_eq!(ds.timeout, Duration::from_secs(600));
        assert_eq!(String::from_utf8(ds.to_json()).unwrap(), EXAMPLE);
        assert_eq!(serde_json::to_value(&ds).unwrap(), example_value());
        assert_eq!(ds.validate(), Ok(()));
    }

    #[test]
    fn rejects_documents_without_a_manifest() {
        let mut value = example_value();
        value["manifest"] = json!("");
        assert_eq!(
            decode(&value).unwrap_err().message,
            "daemon set has no manifest"
        );
        value.as_object_mut().unwrap().remove("manifest");
        assert_eq!(
            decode(&value).unwrap_err().message,
            "daemon set has no manifest"
        );
        value["manifest"] = json!("id: [x]\n");
        assert!(decode(&value)
            .unwrap_err()
            .message
            .starts_with("invalid manifest"));
    }

    #[test]
    fn reads_keys_case_insensitively_and_ignores_unknown_ones() {
        let mut value = example_value();
        let object = value.as_object_mut().unwrap();
        let pod_id = object.remove("pod_id").unwrap();
        object.insert("POD_ID".into(), pod_id);
        object.remove("timeout");
        object.insert("Timeout".into(), json!(1));
        object.insert("extra".into(), json!(true));
        let ds = decode(&value).unwrap();
        assert_eq!(ds.pod_id, "p2-log-shipper");
        assert_eq!(ds.timeout, Duration::from_nanos(1));
    }

    #[test]
    fn checks_the_pod_id_invariant() {
        let mut ds = StoredDaemonSet::from_json(EXAMPLE.as_bytes()).unwrap();
        ds.pod_id = String::new();
        assert_eq!(
            ds.validate().unwrap_err()[0].to_string(),
            "pod_id: is required"
        );
        ds.pod_id = "other".into();
        assert_eq!(
            ds.validate().unwrap_err()[0].to_string(),
            "pod_id: must equal the manifest's id (\"p2-log-shipper\"), not \"other\""
        );
        let mismatched = EXAMPLE.replace(r#""pod_id":"p2-log-shipper""#, r#""pod_id":"x""#);
        assert!(StoredDaemonSet::from_json(mismatched.as_bytes()).is_ok());
    }
}
