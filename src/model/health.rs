//! Health records at `health/<pod-id>/<node>` and the ordering of health states.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Deserializer, Serialize};

use super::gojson::{self, Folded};
use super::timestamp::format_rfc3339;
use super::DecodeError;

/// How far ahead P2's preparer sets `Expires`: a century, so liveness comes from the
/// preparer's session rather than from the record.
const EXPIRES_AFTER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A health state; ordered worst to best so the worst of several results is their `min`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthState {
    /// The check failed.
    Critical,
    /// No usable result, including any status string this server does not know.
    #[default]
    Unknown,
    /// Degraded; rolls count it as unhealthy.
    Warning,
    /// The check succeeded; the only state counted as healthy.
    Passing,
}

impl HealthState {
    /// Reads a status string; anything unrecognised is `Unknown`, as in P2.
    pub fn from_status(status: &str) -> HealthState {
        match status {
            "critical" => HealthState::Critical,
            "warning" => HealthState::Warning,
            "passing" => HealthState::Passing,
            _ => HealthState::Unknown,
        }
    }

    /// The stored string.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Critical => "critical",
            HealthState::Unknown => "unknown",
            HealthState::Warning => "warning",
            HealthState::Passing => "passing",
        }
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for HealthState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(|status| HealthState::from_status(&status))
    }
}

/// One health result for one pod on one node, with P2's Go field names. Times are kept as
/// the RFC 3339 strings they are stored as; P2 does not act on them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Folded<RawHealth>")]
pub struct HealthRecord {
    /// The pod ID.
    #[serde(rename = "Id")]
    pub id: String,
    /// The node; results are keyed by this field, not by the key.
    #[serde(rename = "Node")]
    pub node: String,
    /// The pod ID again (the health service name).
    #[serde(rename = "Service")]
    pub service: String,
    /// The check result.
    #[serde(rename = "Status")]
    pub status: HealthState,
    /// When the result was taken.
    #[serde(rename = "Time")]
    pub time: String,
    /// When the result goes stale.
    #[serde(rename = "Expires")]
    pub expires: String,
}

impl HealthRecord {
    /// A record as P2's preparer writes it at `now`, expiring a century later.
    pub fn new(pod_id: &str, node: &str, status: HealthState, now: SystemTime) -> HealthRecord {
        HealthRecord {
            id: pod_id.to_owned(),
            node: node.to_owned(),
            service: pod_id.to_owned(),
            status,
            time: format_rfc3339(now),
            expires: format_rfc3339(now + EXPIRES_AFTER),
        }
    }

    /// Decodes a stored record with Go's field matching.
    pub fn from_json(bytes: &[u8]) -> Result<HealthRecord, DecodeError> {
        serde_json::from_slice(bytes).map_err(|e| DecodeError::new("health record", e))
    }

    /// Encodes the record as P2 writes it.
    pub fn to_json(&self) -> Vec<u8> {
        gojson::to_vec(self)
    }
}

#[derive(Deserialize)]
struct RawHealth {
    #[serde(rename = "Id", default)]
    id: String,
    #[serde(rename = "Node", default)]
    node: String,
    #[serde(rename = "Service", default)]
    service: String,
    #[serde(rename = "Status", default)]
    status: HealthState,
    #[serde(rename = "Time", default)]
    time: String,
    #[serde(rename = "Expires", default)]
    expires: String,
}

impl From<Folded<RawHealth>> for HealthRecord {
    fn from(Folded(raw): Folded<RawHealth>) -> Self {
        HealthRecord {
            id: raw.id,
            node: raw.node,
            service: raw.service,
            status: raw.status,
            time: raw.time,
            expires: raw.expires,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    const EXAMPLE: &str = r#"{"Id":"hello","Node":"node17.example.com","Service":"hello","Status":"passing","Time":"2020-01-14T11:06:40.123456789-08:00","Expires":"2120-01-14T11:06:40.123456789-08:00"}"#;

    #[test]
    fn states_order_worst_to_best() {
        use HealthState::*;
        assert!(Critical < Unknown && Unknown < Warning && Warning < Passing);
        assert_eq!(
            [Passing, Critical, Warning].into_iter().min(),
            Some(Critical)
        );
    }

    #[test]
    fn unrecognised_status_reads_as_unknown() {
        for (text, state) in [
            ("critical", HealthState::Critical),
            ("warning", HealthState::Warning),
            ("passing", HealthState::Passing),
            ("unknown", HealthState::Unknown),
            ("PASSING", HealthState::Unknown),
            ("maintenance", HealthState::Unknown),
            ("", HealthState::Unknown),
        ] {
            let read: HealthState = serde_json::from_value(serde_json::json!(text)).unwrap();
            assert_eq!(read, state, "{text}");
        }
        assert_eq!(
            serde_json::to_value(HealthState::Passing).unwrap(),
            "passing"
        );
        assert_eq!(HealthState::Warning.to_string(), "warning");
    }

    #[test]
    fn round_trips_a_p2_record() {
        let record = HealthRecord::from_json(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(record.node, "node17.example.com");
        assert_eq!(record.status, HealthState::Passing);
        assert_eq!(String::from_utf8(record.to_json()).unwrap(), EXAMPLE);
    }

    #[test]
    fn reads_case_insensitively_with_defaults() {
        let record =
            HealthRecord::from_json(br#"{"node":"n1","STATUS":"bogus","other":1}"#).unwrap();
        assert_eq!(record.node, "n1");
        assert_eq!(record.status, HealthState::Unknown);
        assert_eq!(record.id, "");
        assert!(HealthRecord::from_json(b"\"passing\"").is_err());
    }

    #[test]
    fn new_records_look_like_the_preparers() {
        let now = UNIX_EPOCH + Duration::from_secs(1_579_000_000);
        let record = HealthRecord::new("hello", "node1", HealthState::Critical, now);
        assert_eq!(
            String::from_utf8(record.to_json()).unwrap(),
            r#"{"Id":"hello","Node":"node1","Service":"hello","Status":"critical","Time":"2020-01-14T11:06:40Z","Expires":"2119-12-21T11:06:40Z"}"#
        );
    }
}
