//! Health records at `health/<pod-id>/<node>`, the ordering of health states, and the one
//! rule for how a pod counts towards its owner's health ([`PodHealth`], [`HealthCounts`]),
//! which the farms act on and every API view shows.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use super::gojson::{self, Folded};
use super::timestamp::format_rfc3339;
use super::DecodeError;

/// How far ahead P2's preparer sets `Expires`: a century, so liveness comes from the
/// preparer's session rather than from the record.
const EXPIRES_AFTER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A health state, as stored and as the API shows it; ordered worst to best so the worst of
/// several results is their `min`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
#[schema(as = HealthStatus)]
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

    /// A pod's health state from its latest result, if any: no result is `unknown`.
    pub fn of(result: Option<HealthState>) -> HealthState {
        result.unwrap_or(HealthState::Unknown)
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

/// How one pod counts towards its owner's health (P2's `countHealthy`). A pod counts only
/// if it is *real*: the node reports running the manifest its owner wants of it (same SHA).
/// A real pod is healthy only when `passing`; `unknown` or no result is unknown; `warning`
/// and `critical` are unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodHealth {
    /// The node runs another manifest, or reports none: not health-counted.
    NotReal,
    Healthy,
    Unknown,
    Unhealthy,
}

impl PodHealth {
    /// Classifies one pod: `wanted_sha` is the SHA of the manifest its owner wants on the
    /// node (an RC's manifest; a daemon set's node, its intent), `running_sha` the SHA of the
    /// manifest the node reports running (`None`: none, or unreadable), `result` its latest
    /// health result.
    pub fn of(wanted_sha: &str, running_sha: Option<&str>, result: Option<HealthState>) -> Self {
        if running_sha != Some(wanted_sha) {
            return PodHealth::NotReal;
        }
        match HealthState::of(result) {
            HealthState::Passing => PodHealth::Healthy,
            HealthState::Unknown => PodHealth::Unknown,
            HealthState::Warning | HealthState::Critical => PodHealth::Unhealthy,
        }
    }
}

/// The pods of one owner, counted by [`PodHealth`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HealthCounts {
    /// Every pod counted.
    pub current: u64,
    /// Of those, the ones running the wanted manifest.
    pub real: u64,
    /// Real and `passing`.
    pub healthy: u64,
    /// Real without a usable result.
    pub unknown: u64,
    /// Real and `warning` or `critical`.
    pub unhealthy: u64,
}

impl HealthCounts {
    /// Counts one more pod.
    pub fn add(&mut self, pod: PodHealth) {
        self.current += 1;
        let slot = match pod {
            PodHealth::NotReal => return,
            PodHealth::Healthy => &mut self.healthy,
            PodHealth::Unknown => &mut self.unknown,
            PodHealth::Unhealthy => &mut self.unhealthy,
        };
        self.real += 1;
        *slot += 1;
    }
}

impl FromIterator<PodHealth> for HealthCounts {
    fn from_iter<I: IntoIterator<Item = PodHealth>>(pods: I) -> Self {
        let mut counts = HealthCounts::default();
        for pod in pods {
            counts.add(pod);
        }
        counts
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
    fn only_a_real_passing_pod_is_healthy() {
        use HealthState::*;
        let of = |running, result| PodHealth::of("abc", running, result);
        assert_eq!(of(Some("abc"), Some(Passing)), PodHealth::Healthy);
        assert_eq!(of(Some("abc"), Some(Unknown)), PodHealth::Unknown);
        assert_eq!(of(Some("abc"), None), PodHealth::Unknown, "no result");
        assert_eq!(of(Some("abc"), Some(Warning)), PodHealth::Unhealthy);
        assert_eq!(of(Some("abc"), Some(Critical)), PodHealth::Unhealthy);
        for result in [Some(Passing), Some(Critical), None] {
            assert_eq!(of(Some("old"), result), PodHealth::NotReal, "{result:?}");
            assert_eq!(of(None, result), PodHealth::NotReal, "{result:?}");
        }
        assert_eq!(HealthState::of(None), Unknown);
        assert_eq!(HealthState::of(Some(Warning)), Warning);
    }

    #[test]
    fn counts_add_up_by_the_rule() {
        let counts: HealthCounts = [
            PodHealth::Healthy,
            PodHealth::Healthy,
            PodHealth::NotReal,
            PodHealth::Unknown,
            PodHealth::Unhealthy,
        ]
        .into_iter()
        .collect();
        assert_eq!(
            counts,
            HealthCounts {
                current: 5,
                real: 4,
                healthy: 2,
                unknown: 1,
                unhealthy: 1
            }
        );
        assert_eq!(HealthCounts::default().current, 0);
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
