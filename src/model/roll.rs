//! Rolling updates as stored at `rolls/<new-rc-id>`, their validation, and the roll algorithm.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::duration_nanos;
use super::gojson::{self, Folded};
use super::{DecodeError, FieldError};

/// One rolling update. P2's struct has no JSON tags, so the keys are its Go field names;
/// they are written exactly so and matched case-insensitively on read, as Go does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Folded<RawRoll>")]
pub struct StoredRoll {
    /// The RC losing replicas; deleted at the end unless `leave_old`.
    #[serde(rename = "OldRC")]
    pub old_rc: String,
    /// The RC gaining replicas; also the roll's ID.
    #[serde(rename = "NewRC")]
    pub new_rc: String,
    /// The roll is done when the new RC has this many replicas.
    #[serde(rename = "DesiredReplicas")]
    pub desired_replicas: i64,
    /// Healthy pods that must stay up throughout.
    #[serde(rename = "MinimumReplicas")]
    pub minimum_replicas: i64,
    /// Keep the old RC when done (partial rollouts).
    #[serde(rename = "LeaveOld")]
    pub leave_old: bool,
    /// Pause before each step after the first; stored as nanoseconds.
    #[serde(rename = "RollDelay", with = "duration_nanos")]
    pub roll_delay: Duration,
}

impl StoredRoll {
    /// Decodes a stored roll; absent keys take Go's zero values.
    pub fn from_json(bytes: &[u8]) -> Result<StoredRoll, DecodeError> {
        serde_json::from_slice(bytes).map_err(|e| DecodeError::new("rolling update", e))
    }

    /// Encodes the roll exactly as P2 writes it.
    pub fn to_json(&self) -> Vec<u8> {
        gojson::to_vec(self)
    }

    /// Checks the replica counts; see [`validate_counts`].
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        validate_counts(self.desired_replicas, self.minimum_replicas)
    }
}

#[derive(Deserialize)]
struct RawRoll {
    #[serde(rename = "OldRC", default)]
    old_rc: String,
    #[serde(rename = "NewRC", default)]
    new_rc: String,
    #[serde(rename = "DesiredReplicas", default)]
    desired_replicas: i64,
    #[serde(rename = "MinimumReplicas", default)]
    minimum_replicas: i64,
    #[serde(rename = "LeaveOld", default)]
    leave_old: bool,
    #[serde(rename = "RollDelay", default, with = "duration_nanos")]
    roll_delay: Duration,
}

impl From<Folded<RawRoll>> for StoredRoll {
    fn from(Folded(raw): Folded<RawRoll>) -> Self {
        StoredRoll {
            old_rc: raw.old_rc,
            new_rc: raw.new_rc,
            desired_replicas: raw.desired_replicas,
            minimum_replicas: raw.minimum_replicas,
            leave_old: raw.leave_old,
            roll_delay: raw.roll_delay,
        }
    }
}

/// The one place roll numbers are checked (P2 checks them only in one CLI command):
/// `desired_replicas >= 0` and `0 <= minimum_replicas <= desired_replicas`. Every problem is
/// returned, named by its API field.
pub fn validate_counts(desired: i64, minimum: i64) -> Result<(), Vec<FieldError>> {
    let mut problems = Vec::new();
    if desired < 0 {
        problems.push(FieldError::new("desired_replicas", "must not be negative"));
    }
    if minimum < 0 {
        problems.push(FieldError::new("minimum_replicas", "must not be negative"));
    }
    if minimum > desired {
        problems.push(FieldError::new(
            "minimum_replicas",
            format!("must not exceed desired_replicas ({desired})"),
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// One step of a rolling update: how many replicas to take from the old RC (`remove`) and
/// give to the new RC (`add`), given healthy pod counts, both RCs' current desired counts,
/// the roll's target and its minimum.
///
/// Starting a new pod may stop an old one on the same node, so a step never spends more
/// than the healthy headroom above the minimum, except that growth of the total (target
/// above old + new desired) is added without removing anything. Once the new RC alone has
/// the minimum healthy, everything left moves at once. The result never takes more from the
/// old RC than it has, and never gives the new RC more than the target.
pub fn roll_step(
    old_healthy: i64,
    new_healthy: i64,
    old_desired: i64,
    new_desired: i64,
    target: i64,
    minimum: i64,
) -> (i64, i64) {
    // The RCs' counts are whatever P2's tools stored: a negative one is none, and their sum
    // must not overflow.
    let (old_desired, new_desired) = (old_desired.max(0), new_desired.max(0));
    let growth = target
        .saturating_sub(old_desired.saturating_add(new_desired))
        .max(0);
    let headroom = old_healthy
        .saturating_add(new_healthy)
        .saturating_sub(minimum)
        .saturating_add(growth);
    let remaining = target.saturating_sub(new_desired);
    if remaining <= 0 {
        return (0, 0);
    }
    if new_healthy >= minimum {
        return ((remaining - growth).max(0), remaining);
    }
    if headroom <= 0 {
        return (0, 0);
    }
    let add = remaining.min(headroom);
    ((add - growth).max(0), add)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    /// P2's example rolling update, on one line as Go writes it.
    const EXAMPLE: &str = r#"{"OldRC":"5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11","NewRC":"9c41f7a2-0d3e-4b6a-8f1c-2e7d5a9b3c60","DesiredReplicas":3,"MinimumReplicas":2,"LeaveOld":false,"RollDelay":30000000000}"#;

    #[test]
    fn decodes_and_re_encodes_the_p2_example_byte_for_byte() {
        let roll = StoredRoll::from_json(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(
            roll,
            StoredRoll {
                old_rc: "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11".into(),
                new_rc: "9c41f7a2-0d3e-4b6a-8f1c-2e7d5a9b3c60".into(),
                desired_replicas: 3,
                minimum_replicas: 2,
                leave_old: false,
                roll_delay: Duration::from_secs(30),
            }
        );
        assert_eq!(String::from_utf8(roll.to_json()).unwrap(), EXAMPLE);
        assert_eq!(
            serde_json::to_value(&roll).unwrap(),
            serde_json::from_str::<Value>(EXAMPLE).unwrap()
        );
    }

    #[test]
    fn reads_keys_case_insensitively_and_ignores_unknown_ones() {
        let doc = json!({
            "oldrc": "a", "NEWRC": "b", "desiredReplicas": 4, "minimumreplicas": 1,
            "leaveold": true, "rolldelay": 5, "Extra": "ignored"
        });
        let roll = StoredRoll::from_json(doc.to_string().as_bytes()).unwrap();
        assert_eq!(roll.old_rc, "a");
        assert_eq!(roll.new_rc, "b");
        assert_eq!(roll.desired_replicas, 4);
        assert_eq!(roll.minimum_replicas, 1);
        assert!(roll.leave_old);
        assert_eq!(roll.roll_delay, Duration::from_nanos(5));
        let written = String::from_utf8(roll.to_json()).unwrap();
        assert_eq!(
            written,
            r#"{"OldRC":"a","NewRC":"b","DesiredReplicas":4,"MinimumReplicas":1,"LeaveOld":true,"RollDelay":5}"#
        );
    }

    #[test]
    fn absent_keys_are_zero_and_bad_values_fail() {
        let roll = StoredRoll::from_json(b"{}").unwrap();
        assert_eq!(roll.desired_replicas, 0);
        assert_eq!(roll.roll_delay, Duration::ZERO);
        // P2 only waits for a RollDelay > 0: a negative one is no delay.
        let roll = StoredRoll::from_json(br#"{"RollDelay":-1}"#).unwrap();
        assert_eq!(roll.roll_delay, Duration::ZERO);
        assert!(StoredRoll::from_json(br#"{"DesiredReplicas":"3"}"#).is_err());
        assert!(StoredRoll::from_json(b"[]").is_err());
    }

    #[test]
    fn validates_counts_and_reports_every_problem() {
        assert_eq!(validate_counts(3, 2), Ok(()));
        assert_eq!(validate_counts(0, 0), Ok(()));
        assert_eq!(validate_counts(3, 3), Ok(()));
        let fields = |desired, minimum| -> Vec<String> {
            validate_counts(desired, minimum)
                .unwrap_err()
                .into_iter()
                .map(|e| e.to_string())
                .collect()
        };
        assert_eq!(
            fields(2, 3),
            ["minimum_replicas: must not exceed desired_replicas (2)"]
        );
        assert_eq!(
            fields(-1, -2),
            [
                "desired_replicas: must not be negative",
                "minimum_replicas: must not be negative"
            ]
        );
        assert_eq!(
            fields(-1, 0),
            [
                "desired_replicas: must not be negative",
                "minimum_replicas: must not exceed desired_replicas (-1)"
            ]
        );
        let roll = StoredRoll::from_json(br#"{"DesiredReplicas":1,"MinimumReplicas":2}"#).unwrap();
        assert_eq!(roll.validate().unwrap_err().len(), 1);
    }

    /// The worked examples of the roll algorithm, with old desired = target − new and new
    /// desired = new unless given.
    #[test]
    fn worked_examples() {
        struct Case {
            old: i64,
            new: i64,
            target: i64,
            min: i64,
            desired: Option<(i64, i64)>,
            want: (i64, i64),
        }
        let case = |old, new, target, min, want| Case {
            old,
            new,
            target,
            min,
            desired: None,
            want,
        };
        let cases = [
            case(1, 1, 4, 3, (0, 0)),
            case(1, 1, 4, 2, (0, 0)),
            case(2, 2, 6, 3, (1, 1)),
            case(1, 3, 6, 3, (3, 3)),
            case(3, 0, 6, 0, (6, 6)),
            Case {
                desired: Some((1, 2)),
                ..case(1, 1, 3, 1, (1, 1))
            },
            Case {
                desired: Some((0, 0)),
                ..case(0, 0, 3, 2, (0, 1))
            },
        ];
        for c in cases {
            let (old_desired, new_desired) = c.desired.unwrap_or((c.target - c.new, c.new));
            let got = roll_step(c.old, c.new, old_desired, new_desired, c.target, c.min);
            assert_eq!(
                got, c.want,
                "old={} new={} target={} min={} desired=({old_desired},{new_desired})",
                c.old, c.new, c.target, c.min
            );
        }
    }

    #[test]
    fn never_overshoots_or_drives_old_negative_or_drops_below_minimum() {
        let range = 0..=5i64;
        for old in range.clone() {
            for new in range.clone() {
                for old_desired in range.clone() {
                    for new_desired in range.clone() {
                        for target in range.clone() {
                            for min in range.clone() {
                                let (remove, add) =
                                    roll_step(old, new, old_desired, new_desired, target, min);
                                let at = format!(
                                    "old={old} new={new} od={old_desired} nd={new_desired} t={target} min={min} -> ({remove},{add})"
                                );
                                assert!(remove >= 0 && add >= 0, "{at}");
                                assert!(remove <= add, "{at}");
                                assert!(remove <= old_desired, "old RC driven negative: {at}");
                                assert!(new_desired + add <= target.max(new_desired), "{at}");
                                let growth = (target - old_desired - new_desired).max(0);
                                assert!(remove >= add - growth, "removes too little: {at}");
                                if remove > 0 && new < min {
                                    assert!(old - remove + new >= min, "below minimum: {at}");
                                }
                                if new >= min && target > new_desired {
                                    assert_eq!(add, target - new_desired, "{at}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// An RC's count is whatever P2's tools stored, any i64: a step neither overflows nor
    /// moves more than there is.
    #[test]
    fn counts_at_i64s_ends_neither_overflow_nor_overshoot() {
        let extremes = [i64::MIN, -1, 0, 3, i64::MAX];
        for old_desired in extremes {
            for new_desired in extremes {
                for target in [0, 3, 10_000] {
                    let (remove, add) = roll_step(2, 1, old_desired, new_desired, target, 1);
                    let at = format!("od={old_desired} nd={new_desired} t={target}");
                    assert!((0..=old_desired.max(0)).contains(&remove), "{at}: {remove}");
                    assert!(add >= 0 && add >= remove, "{at}: {add}");
                    assert!(
                        new_desired.saturating_add(add) <= target.max(new_desired),
                        "{at}"
                    );
                }
            }
        }
    }
}
