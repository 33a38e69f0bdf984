//! Replication controllers as stored at `replication_controllers/<rc-id>`, in P2's `RawRC` shape.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::gojson::{self, Folded};
use super::{join_errors, DecodeError, Manifest};

/// One replication controller. Field order is P2's write order; `node_selector` is kept as
/// selector text and validated by the label layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Folded<RawRc>")]
pub struct StoredRc {
    /// A UUID (v7 when this server made it, v4 when P2 did), also the key's last segment.
    pub id: String,
    /// The pod manifest, written as its raw YAML string.
    pub manifest: Manifest,
    /// Selector text; `""` selects every node.
    pub node_selector: String,
    /// Labels put on every pod; `None` is written as `null` like Go's nil map.
    pub pod_labels: Option<BTreeMap<String, String>>,
    /// How many pods the RC wants.
    pub replicas_desired: i64,
    /// A disabled RC makes no scheduling changes.
    pub disabled: bool,
    /// Whether pods may move off nodes that stop matching.
    pub allocation_strategy: AllocationStrategy,
}

impl StoredRc {
    /// Decodes a stored RC with P2's rules: `replicas_desired` must be present (so a renamed
    /// or lost field can never read as "0 replicas" and uninstall a fleet), the manifest
    /// must be present and valid, unknown keys are ignored and keys match case-insensitively.
    pub fn from_json(bytes: &[u8]) -> Result<StoredRc, DecodeError> {
        let raw: Folded<RawRc> = serde_json::from_slice(bytes).map_err(decode_error)?;
        StoredRc::try_from(raw).map_err(decode_error)
    }

    /// Decodes the RC stored at the key of RC `id` ([`StoredRc::from_json`]), whose id is
    /// the key's whatever its document names (another id, or none, Go's zero value): P2
    /// writes an RC at its id's key, and such a document would otherwise be shown as that
    /// other RC and changed (by a patch or a roll's step) at its key, where its version never
    /// matches; a change writes it back under its own id.
    pub fn from_stored(id: &str, bytes: &[u8]) -> Result<StoredRc, DecodeError> {
        let mut rc = StoredRc::from_json(bytes)?;
        if rc.id != id {
            tracing::debug!(id, named = %rc.id, "an RC document names another id than its key");
            rc.id = id.to_owned();
        }
        Ok(rc)
    }

    /// Encodes the RC exactly as P2 writes it (one line, struct order, sorted label keys).
    pub fn to_json(&self) -> Vec<u8> {
        gojson::to_vec(self)
    }
}

fn decode_error(message: impl fmt::Display) -> DecodeError {
    DecodeError::new("replication controller", message)
}

/// The stored form before the manifest is checked; every field but `replicas_desired`
/// defaults to Go's zero value when absent.
#[derive(Deserialize)]
struct RawRc {
    #[serde(default)]
    id: String,
    #[serde(default)]
    manifest: String,
    #[serde(default)]
    node_selector: String,
    #[serde(default, deserialize_with = "crate::labels::go_labels")]
    pod_labels: Option<BTreeMap<String, String>>,
    replicas_desired: i64,
    #[serde(default)]
    disabled: bool,
    #[serde(default)]
    allocation_strategy: AllocationStrategy,
}

impl TryFrom<Folded<RawRc>> for StoredRc {
    type Error = String;

    fn try_from(Folded(raw): Folded<RawRc>) -> Result<Self, Self::Error> {
        if raw.manifest.is_empty() {
            return Err("RC has no manifest".to_owned());
        }
        let manifest = Manifest::parse(&raw.manifest)
            .map_err(|errors| format!("invalid manifest: {}", join_errors(&errors)))?;
        Ok(StoredRc {
            id: raw.id,
            manifest,
            node_selector: raw.node_selector,
            pod_labels: raw.pod_labels,
            replicas_desired: raw.replicas_desired,
            disabled: raw.disabled,
            allocation_strategy: raw.allocation_strategy,
        })
    }
}

/// What an RC does when one of its nodes stops matching its selector: `Dynamic` moves the
/// pod to another node, `Static` leaves it. `Unset` is the `""` that older RCs carry and
/// behaves like `Static`. P2's field is a plain Go string that `Create` does not check, so
/// any other stored string is kept as `Other` (behaving like `Static`, as in P2's farm).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum AllocationStrategy {
    /// `"dynamic_strategy"`.
    Dynamic,
    /// `"static_strategy"`.
    Static,
    /// `""`, kept so that stored documents round-trip unchanged.
    #[default]
    Unset,
    /// Any other string P2 stored, kept as is.
    Other(String),
}

impl From<String> for AllocationStrategy {
    fn from(text: String) -> Self {
        text.parse().unwrap_or(AllocationStrategy::Other(text))
    }
}

impl From<AllocationStrategy> for String {
    fn from(strategy: AllocationStrategy) -> Self {
        strategy.as_str().to_owned()
    }
}

impl AllocationStrategy {
    /// The stored string.
    pub fn as_str(&self) -> &str {
        match self {
            AllocationStrategy::Dynamic => "dynamic_strategy",
            AllocationStrategy::Static => "static_strategy",
            AllocationStrategy::Unset => "",
            AllocationStrategy::Other(text) => text,
        }
    }
}

impl fmt::Display for AllocationStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AllocationStrategy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "dynamic_strategy" => Ok(AllocationStrategy::Dynamic),
            "static_strategy" => Ok(AllocationStrategy::Static),
            "" => Ok(AllocationStrategy::Unset),
            // What is expected depends on the write: a create takes `""`, a patch does not.
            other => Err(format!("unknown allocation strategy {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    /// P2's example RC, on one line as Go writes it.
    const EXAMPLE: &str = r#"{"id":"5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11","manifest":"id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_3881c78e.tar.gz\nconfig:\n  ENVIRONMENT: production\nstatus:\n  port: 43770\n  http: true\n","node_selector":"availability_zone=us-west-2a,role in (web,worker)","pod_labels":{"availability_zone":"us-west-2a","cluster_name":"production"},"replicas_desired":3,"disabled":false,"allocation_strategy":"static_strategy"}"#;

    fn example_value() -> Value {
        serde_json::from_str(EXAMPLE).unwrap()
    }

    fn decode(value: &Value) -> Result<StoredRc, DecodeError> {
        StoredRc::from_json(value.to_string().as_bytes())
    }

    #[test]
    fn decodes_and_re_encodes_the_p2_example_byte_for_byte() {
        let rc = StoredRc::from_json(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(rc.id, "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11");
        assert_eq!(rc.manifest.pod_id(), "hello");
        assert_eq!(
            rc.node_selector,
            "availability_zone=us-west-2a,role in (web,worker)"
        );
        assert_eq!(
            rc.pod_labels.as_ref().unwrap()["cluster_name"],
            "production"
        );
        assert_eq!(rc.replicas_desired, 3);
        assert!(!rc.disabled);
        assert_eq!(rc.allocation_strategy, AllocationStrategy::Static);
        assert_eq!(String::from_utf8(rc.to_json()).unwrap(), EXAMPLE);
        assert_eq!(serde_json::to_value(&rc).unwrap(), example_value());
    }

    #[test]
    fn sorts_label_keys_and_writes_null_labels() {
        let mut value = example_value();
        value["pod_labels"] = json!({"zz": "1", "aa": "2"});
        let out = String::from_utf8(decode(&value).unwrap().to_json()).unwrap();
        assert!(out.contains(r#""pod_labels":{"aa":"2","zz":"1"}"#), "{out}");

        value["pod_labels"] = json!({"team": null, "aa": "2"});
        let rc = decode(&value).unwrap();
        let expected = BTreeMap::from([("aa".into(), "2".into()), ("team".into(), "".into())]);
        assert_eq!(rc.pod_labels, Some(expected), "a null value is Go's \"\"");
        value["pod_labels"] = Value::Null;
        let rc = decode(&value).unwrap();
        assert_eq!(rc.pod_labels, None);
        assert!(String::from_utf8(rc.to_json())
            .unwrap()
            .contains(r#""pod_labels":null,"#));

        value.as_object_mut().unwrap().remove("pod_labels");
        assert_eq!(decode(&value).unwrap().pod_labels, None);
    }

    #[test]
    fn requires_replicas_desired() {
        let mut value = example_value();
        value.as_object_mut().unwrap().remove("replicas_desired");
        let err = decode(&value).unwrap_err();
        assert!(err.message.contains("replicas_desired"), "{err}");

        value["replicas_desired"] = Value::Null;
        assert!(decode(&value).is_err());
        value["replicas_desired"] = json!("3");
        assert!(decode(&value).is_err());
        value["replicas_desired"] = json!(0);
        assert_eq!(decode(&value).unwrap().replicas_desired, 0);
    }

    #[test]
    fn rejects_missing_empty_or_invalid_manifests() {
        let mut value = example_value();
        value["manifest"] = json!("");
        assert_eq!(decode(&value).unwrap_err().message, "RC has no manifest");
        value.as_object_mut().unwrap().remove("manifest");
        assert_eq!(decode(&value).unwrap_err().message, "RC has no manifest");
        value["manifest"] = json!("launchables: {}\n");
        assert_eq!(
            decode(&value).unwrap_err().to_string(),
            "cannot decode replication controller: invalid manifest: id: is required"
        );
    }

    #[test]
    fn ignores_unknown_keys_and_matches_names_case_insensitively() {
        let mut value = example_value();
        let object = value.as_object_mut().unwrap();
        let replicas = object.remove("replicas_desired").unwrap();
        object.insert("Replicas_Desired".into(), replicas);
        object.remove("disabled");
        object.insert("DISABLED".into(), json!(true));
        object.insert("future_field".into(), json!({"x": [1, 2]}));
        let rc = decode(&value).unwrap();
        assert_eq!(rc.replicas_desired, 3);
        assert!(rc.disabled);
        assert!(!String::from_utf8(rc.to_json())
            .unwrap()
            .contains("future_field"));
    }

    #[test]
    fn defaults_absent_fields_to_go_zero_values() {
        let rc = StoredRc::from_json(br#"{"manifest":"id: a\n","replicas_desired":1}"#).unwrap();
        assert_eq!(rc.id, "");
        assert_eq!(rc.node_selector, "");
        assert!(!rc.disabled);
        assert_eq!(rc.allocation_strategy, AllocationStrategy::Unset);
        assert_eq!(
            String::from_utf8(rc.to_json()).unwrap(),
            r#"{"id":"","manifest":"id: a\n","node_selector":"","pod_labels":null,"replicas_desired":1,"disabled":false,"allocation_strategy":""}"#
        );
    }

    #[test]
    fn allocation_strategy_round_trips_all_three_values() {
        for (text, strategy) in [
            ("dynamic_strategy", AllocationStrategy::Dynamic),
            ("static_strategy", AllocationStrategy::Static),
            ("", AllocationStrategy::Unset),
        ] {
            assert_eq!(text.parse::<AllocationStrategy>(), Ok(strategy.clone()));
            assert_eq!(strategy.to_string(), text);
            assert_eq!(serde_json::to_value(&strategy).unwrap(), json!(text));
            assert_eq!(
                serde_json::from_value::<AllocationStrategy>(json!(text)).unwrap(),
                strategy
            );
        }
        assert!("dynamic".parse::<AllocationStrategy>().is_err());
        let mut value = example_value();
        value["allocation_strategy"] = json!("bogus");
        let rc = decode(&value).unwrap();
        assert_eq!(rc.allocation_strategy.as_str(), "bogus");
        assert!(String::from_utf8(rc.to_json())
            .unwrap()
            .contains(r#""allocation_strategy":"bogus""#));
    }

    #[test]
    fn escapes_like_go_when_writing() {
        let mut value = example_value();
        value["manifest"] = json!("id: a\nconfig: {x: \"<b>&\"}\n");
        let out = String::from_utf8(decode(&value).unwrap().to_json()).unwrap();
        assert!(out.contains(r#"\"\u003cb\u003e\u0026\""#), "{out}");
    }

    #[test]
    fn deserializes_through_serde_with_the_same_rules() {
        let rc: StoredRc = serde_json::from_str(EXAMPLE).unwrap();
        assert_eq!(rc.replicas_desired, 3);
        assert!(serde_json::from_str::<StoredRc>(r#"{"manifest":"id: a\n"}"#).is_err());
    }
}
