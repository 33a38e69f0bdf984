//! Labels on nodes, pods, RCs, rolls and pod clusters, and the selectors that query them.
//!
//! Pure types and rules only; reading and writing `labels/<type>/<id>` keys is the label
//! store's job.

mod compact;
pub mod selector;
pub mod validation;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};

pub use compact::CompactLabels;
pub use selector::{Operator, ParseSelectorError, Requirement, Selector};
pub use validation::{
    label_key_problem, label_value_problem, validate_label_key, validate_label_value,
    validate_labels, validate_labels_in, MAX_ID_BYTES,
};

/// A label set. Ordered, so its JSON and its printed form are stable.
pub type Labels = BTreeMap<String, String>;

/// What a selector asks of a label set, however it is kept: the value of one key.
pub trait LabelValues {
    fn value(&self, key: &str) -> Option<&str>;
}

impl LabelValues for Labels {
    fn value(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// An object without a label set has no labels: a selector such as `!k` matches it.
impl<L: LabelValues + ?Sized> LabelValues for Option<&L> {
    fn value(&self, key: &str) -> Option<&str> {
        self.as_ref()?.value(key)
    }
}

/// A label set as P2 stores it: a JSON object, or `null` for a nil map (an empty set). A
/// `null` value is read as `""`, as Go's JSON reads it into P2's `map[string]string`, so a
/// set P2's tools can read is readable here too.
pub fn from_json(bytes: &[u8]) -> serde_json::Result<Labels> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let set = go_labels(&mut deserializer)?;
    deserializer.end()?;
    Ok(set.unwrap_or_default())
}

/// Reads a label set as Go reads it into a `map[string]string` (for `serde(deserialize_with)`,
/// such as an RC's `pod_labels`): `None` for `null`, and a `null` value as `""`.
pub fn go_labels<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Labels>, D::Error> {
    Ok(Option::<GoLabels>::deserialize(deserializer)?.map(|set| set.0))
}

/// A label set read straight into [`Labels`], each `null` value as `""`: the mirror reads
/// every pod's labels, so no second map is built on the way.
struct GoLabels(Labels);

impl<'de> Deserialize<'de> for GoLabels {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = Labels;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a label set: an object of strings")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Labels, A::Error> {
                let mut labels = Labels::new();
                while let Some((key, value)) = map.next_entry::<String, Option<String>>()? {
                    labels.insert(key, value.unwrap_or_default());
                }
                Ok(labels)
            }
        }
        deserializer.deserialize_map(Entries).map(GoLabels)
    }
}

/// Put on every pod an RC schedules; names the pod (its manifest `id`).
pub const POD_ID_LABEL: &str = "pod_id";
/// Put on every pod an RC schedules; the RC finds its pods by it.
pub const RC_ID_LABEL: &str = "replication_controller_id";
/// The only label a DS puts on its pods; the DS finds its pods by it.
pub const DS_ID_LABEL: &str = "daemon_set_id";
/// Zone an RC's pods run in; read back by roll audit records.
pub const AVAILABILITY_ZONE_LABEL: &str = "availability_zone";
/// Cluster an RC's pods belong to; read back by roll audit records.
pub const CLUSTER_NAME_LABEL: &str = "cluster_name";

/// The kinds of labeled object; the type string is the second segment of a label key, so
/// only these five exist (P2 has no daemon-set label type).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LabelType {
    /// Hosts, labeled by node name.
    Node,
    /// Legacy pods, labeled by `<node>/<pod_id>`.
    Pod,
    /// RCs, labeled by RC ID (singular, unlike the RC tree).
    ReplicationController,
    /// Rolling updates, labeled by RU ID.
    Rolls,
    /// Pod clusters, labeled by pod cluster ID.
    PodClusters,
}

impl LabelType {
    /// Every label type, in the order P2 documents them.
    pub const ALL: [LabelType; 5] = [
        LabelType::Node,
        LabelType::Pod,
        LabelType::ReplicationController,
        LabelType::Rolls,
        LabelType::PodClusters,
    ];

    /// The type string used in keys, URLs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            LabelType::Node => "node",
            LabelType::Pod => "pod",
            LabelType::ReplicationController => "replication_controller",
            LabelType::Rolls => "rolls",
            LabelType::PodClusters => "pod_clusters",
        }
    }

    /// Checks an object ID before it becomes part of a key: non-empty, no whitespace or
    /// control characters, no empty, `.` or `..` segment, no segment over
    /// [`MAX_ID_BYTES`] bytes, and a `/` only in a pod's `<node>/<pod_id>`, so every ID maps
    /// to exactly one key and back.
    pub fn validate_id(self, id: &str) -> Result<(), String> {
        if id.is_empty() {
            return Err("id must not be empty".to_string());
        }
        if let Some(long) = id.split('/').find(|segment| segment.len() > MAX_ID_BYTES) {
            return Err(format!(
                "id must be at most {MAX_ID_BYTES} bytes per '/'-separated part (a part has {})",
                long.len()
            ));
        }
        if let Some(c) = id.chars().find(|c| c.is_control()) {
            return Err(format!(
                "id must not contain control characters (found {c:?})"
            ));
        }
        if let Some(c) = id.chars().find(|c| c.is_whitespace()) {
            return Err(format!("id must not contain whitespace (found {c:?})"));
        }
        let segments: Vec<&str> = id.split('/').collect();
        match (self, segments.len()) {
            (LabelType::Pod, 2) => {}
            (LabelType::Pod, _) => {
                return Err(format!(
                    "pod label ids have the form <node>/<pod_id>, but {id:?} has {} '/'",
                    segments.len() - 1
                ))
            }
            (_, 1) => {}
            (_, _) => return Err(format!("{} label ids must not contain '/'", self.as_str())),
        }
        for segment in segments {
            match segment {
                "" => {
                    return Err(
                        "pod label ids have the form <node>/<pod_id> with both parts non-empty"
                            .to_string(),
                    )
                }
                "." | ".." => {
                    return Err(format!("id must not have a {segment:?} segment"));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl fmt::Display for LabelType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A type string that names no label type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid type provided: {given:?} (valid types: node, pod, replication_controller, rolls, pod_clusters)")]
pub struct ParseLabelTypeError {
    /// The rejected input.
    pub given: String,
}

impl FromStr for LabelType {
    type Err = ParseLabelTypeError;

    /// Exact, case-sensitive match, as P2's `AsType`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LabelType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| ParseLabelTypeError {
                given: s.to_string(),
            })
    }
}

/// One labeled object in P2's API form, `{"type", "id", "labels"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Labeled {
    /// What kind of object this is.
    #[serde(rename = "type")]
    pub label_type: LabelType,
    /// The object's ID within its type.
    pub id: String,
    /// Its labels; `null` (Go's nil map) reads as empty.
    #[serde(default, deserialize_with = "null_as_empty")]
    #[schema(value_type = BTreeMap<String, String>, required = true)]
    pub labels: Labels,
}

/// P2 writes an unlabeled object's labels as `null`; accept it as the empty set.
fn null_as_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Labels, D::Error> {
    Ok(Option::<Labels>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_set_reads_as_go_reads_it() {
        assert_eq!(from_json(b"null").unwrap(), Labels::new());
        let set = from_json(br#"{"a":null,"b":"x"}"#).unwrap();
        assert_eq!(
            set,
            Labels::from([("a".into(), "".into()), ("b".into(), "x".into())])
        );
        assert!(from_json(br#"{"a":1}"#).is_err());
    }

    #[test]
    fn type_strings_round_trip() {
        let expected = [
            "node",
            "pod",
            "replication_controller",
            "rolls",
            "pod_clusters",
        ];
        for (t, s) in LabelType::ALL.into_iter().zip(expected) {
            assert_eq!(t.as_str(), s);
            assert_eq!(t.to_string(), s);
            assert_eq!(s.parse::<LabelType>(), Ok(t));
            assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{s}\""));
            assert_eq!(
                serde_json::from_str::<LabelType>(&format!("\"{s}\"")).unwrap(),
                t
            );
        }
    }

    #[test]
    fn unknown_types_are_rejected() {
        for s in [
            "",
            "Node",
            "nodes",
            "replication_controllers",
            "daemon_set",
            "roll",
            " pod",
        ] {
            let e = s.parse::<LabelType>().unwrap_err();
            assert_eq!(e.given, s);
            let message = e.to_string();
            assert!(message.starts_with("Invalid type provided"), "{message}");
            assert!(message.contains("node, pod, replication_controller, rolls, pod_clusters"));
        }
        assert!(serde_json::from_str::<LabelType>("\"daemon_set\"").is_err());
    }

    #[test]
    fn valid_ids() {
        for t in LabelType::ALL {
            if t != LabelType::Pod {
                for id in [
                    "node17.example.com",
                    "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11",
                    "a",
                    "..a",
                    "a..",
                ] {
                    assert_eq!(t.validate_id(id), Ok(()), "{t} {id}");
                }
            }
        }
        for id in ["node17.example.com/hello", "n/p", "n.../.p"] {
            assert_eq!(LabelType::Pod.validate_id(id), Ok(()), "{id}");
        }
    }

    #[test]
    fn invalid_ids() {
        let err = |t: LabelType, id: &str| t.validate_id(id).expect_err(id);
        for t in LabelType::ALL {
            assert!(err(t, "").contains("must not be empty"));
            assert!(err(t, "a\u{0}b").contains("control characters"));
            assert!(err(t, "a\nb").contains("control characters"));
            assert!(err(t, "a b").contains("whitespace (found ' ')"));
            assert!(err(t, "a\u{a0}").contains("whitespace"));
        }
        let long = "n".repeat(MAX_ID_BYTES + 1);
        assert!(err(LabelType::Node, &long).contains("at most 253 bytes"));
        assert!(err(LabelType::Pod, &format!("{long}/p")).contains("at most 253 bytes"));
        LabelType::Pod
            .validate_id(&format!("{}/p", &long[1..]))
            .unwrap();
        assert!(err(LabelType::Node, "a/b").contains("node label ids must not contain '/'"));
        assert!(err(LabelType::Rolls, "/").contains("rolls label ids must not contain '/'"));
        assert!(err(LabelType::Node, ".").contains("\".\" segment"));
        assert!(err(LabelType::ReplicationController, "..").contains("\"..\" segment"));

        assert!(err(LabelType::Pod, "hello").contains("<node>/<pod_id>"));
        assert!(err(LabelType::Pod, "a/b/c").contains("has 2 '/'"));
        assert!(err(LabelType::Pod, "a/").contains("both parts non-empty"));
        assert!(err(LabelType::Pod, "/b").contains("both parts non-empty"));
        assert!(err(LabelType::Pod, "../b").contains("\"..\" segment"));
        assert!(err(LabelType::Pod, "a/.").contains("\".\" segment"));
    }

    #[test]
    fn labeled_json_shape() {
        let labeled = Labeled {
            label_type: LabelType::Pod,
            id: "node1/hello".to_string(),
            labels: [(POD_ID_LABEL.to_string(), "hello".to_string())].into(),
        };
        let json = serde_json::to_value(&labeled).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type": "pod", "id": "node1/hello", "labels": {"pod_id": "hello"}})
        );
        assert_eq!(serde_json::from_value::<Labeled>(json).unwrap(), labeled);
    }

    #[test]
    fn labeled_accepts_null_or_missing_labels() {
        for json in [
            r#"{"type":"node","id":"n1","labels":null}"#,
            r#"{"type":"node","id":"n1"}"#,
        ] {
            let labeled: Labeled = serde_json::from_str(json).unwrap();
            assert!(labeled.labels.is_empty(), "{json}");
        }
        assert!(serde_json::from_str::<Labeled>(r#"{"type":"nodes","id":"n1"}"#).is_err());
    }

    #[test]
    fn reserved_keys_are_valid_label_keys() {
        for key in [
            POD_ID_LABEL,
            RC_ID_LABEL,
            DS_ID_LABEL,
            AVAILABILITY_ZONE_LABEL,
            CLUSTER_NAME_LABEL,
        ] {
            assert_eq!(validate_label_key(key), Ok(()), "{key}");
        }
        assert_eq!(AVAILABILITY_ZONE_LABEL, "availability_zone");
        assert_eq!(CLUSTER_NAME_LABEL, "cluster_name");
    }
}
