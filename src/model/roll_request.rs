//! A request to create a rolling update and the rules that turn it into a [`RollPlan`].

use std::time::Duration;

use serde::Deserialize;
use utoipa::ToSchema;

use super::duration::parse_duration;
use super::{foreign_pod_id, validate_counts, FieldError, Limits, NewRc, RcId, RcSpec};
use crate::labels::validation::LabelSet;
use crate::labels::{validate_labels_in, Labels, Selector, POD_ID_LABEL};

/// A request to create a rolling update, in one of P2's three forms:
/// `old_rc_id` + `new_rc_id` (both RCs exist); `old_rc_id` + `new_rc` (the new RC is created
/// with the roll); `old_rc_selector` + `new_rc` (the old RC is the one RC whose labels
/// match; when none does, a stand-in old RC with the new RC's spec and 0 replicas is
/// created).
// The examples (of the whole request and of its fields) are of the third form: examples of
// `old_rc_id` and `old_rc_selector` together would make a request that is refused.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "old_rc_selector": "pod_id=hello,cluster_name=production",
    "new_rc": {
        "manifest": "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello.tar.gz\n",
        "node_selector": "role=web",
        "cluster_name": "production"
    },
    "desired_replicas": 3,
    "minimum_replicas": 2,
    "roll_delay": "30s"
}))]
pub struct CreateRoll {
    /// The RC losing replicas, by id.
    #[schema(value_type = Option<RcId>, inline)]
    pub old_rc_id: Option<String>,
    /// Selects the RC losing replicas by its RC labels; must match at most one RC.
    #[schema(example = "pod_id=hello,cluster_name=production")]
    pub old_rc_selector: Option<String>,
    /// The RC gaining replicas, by id; it becomes the roll's id.
    #[schema(value_type = Option<RcId>, inline)]
    pub new_rc_id: Option<String>,
    /// The RC gaining replicas, created with the roll (with 0 replicas; leave
    /// `replicas_desired` out). Its new id becomes the roll's id.
    pub new_rc: Option<RcSpec>,
    /// The roll is done when the new RC has this many replicas: 0 to the server's
    /// `--max-replicas` (10,000 unless configured).
    #[schema(
        example = 3,
        minimum = 0,
        maximum = 10000,
        required = true,
        nullable = false
    )]
    pub desired_replicas: Option<i64>,
    /// Healthy pods that must stay up throughout; between 0 and `desired_replicas` (so at
    /// most the server's `--max-replicas` too).
    #[schema(
        example = 2,
        minimum = 0,
        maximum = 10000,
        required = true,
        nullable = false
    )]
    pub minimum_replicas: Option<i64>,
    /// Keep the old RC when done (partial rollouts).
    #[serde(default)]
    pub leave_old: bool,
    /// Pause before each step after the first, e.g. `30s`; default `0s`.
    #[schema(example = "30s")]
    pub roll_delay: Option<String>,
    /// The roll's own labels (label type `rolls`).
    #[serde(default)]
    #[schema(value_type = LabelSet)]
    pub labels: Labels,
    /// Labels merged into the new RC's labels (and a stand-in old RC's).
    #[serde(default)]
    #[schema(value_type = LabelSet)]
    pub new_rc_labels: Labels,
}

impl CreateRoll {
    /// Checks the whole request, reporting every problem at once, and turns it into a plan.
    pub fn validate(self, limits: &Limits) -> Result<RollPlan, Vec<FieldError>> {
        let body = self;
        let mut causes = Vec::new();
        let mut id_field = |field: &str, value: &Option<String>| -> Option<String> {
            let value = value.as_ref()?;
            match value.parse::<RcId>() {
                Ok(id) => Some(id.to_string()),
                Err(e) => {
                    causes.push(FieldError::new(field, e.to_string()));
                    None
                }
            }
        };
        let old_rc_id = id_field("old_rc_id", &body.old_rc_id);
        let new_rc_id = id_field("new_rc_id", &body.new_rc_id);

        match (&body.old_rc_id, &body.old_rc_selector) {
            (None, None) => causes.push(FieldError::new(
                "old_rc_id",
                "give the old RC, by old_rc_id or by old_rc_selector",
            )),
            (Some(_), Some(_)) => causes.push(FieldError::new(
                "old_rc_selector",
                "give old_rc_id or old_rc_selector, not both",
            )),
            _ => {}
        }
        match (&body.new_rc_id, &body.new_rc) {
            (None, None) => causes.push(FieldError::new(
                "new_rc_id",
                "give the new RC, by new_rc_id or as a new_rc spec to create",
            )),
            (Some(_), Some(_)) => causes.push(FieldError::new(
                "new_rc",
                "give new_rc_id or new_rc, not both",
            )),
            _ => {}
        }
        if body.old_rc_selector.is_some() && body.new_rc_id.is_some() {
            causes.push(FieldError::new(
                "old_rc_selector",
                "needs new_rc: the old RC may have to be stood in for with the new RC's spec",
            ));
        }
        if let (Some(old), Some(new)) = (&old_rc_id, &new_rc_id) {
            if old == new {
                causes.push(FieldError::new(
                    "new_rc_id",
                    "must differ from old_rc_id: a roll moves replicas between two RCs",
                ));
            }
        }
        let selector = body.old_rc_selector.as_ref().and_then(|text| {
            text.parse::<Selector>()
                .map_err(|e| causes.push(FieldError::new("old_rc_selector", e.to_string())))
                .ok()
        });

        let new_rc = body.new_rc.and_then(|spec| {
            if spec.replicas_desired != 0 {
                causes.push(FieldError::new(
                    "new_rc.replicas_desired",
                    "a roll's new RC starts with 0 replicas and the roll gives it desired_replicas; leave it out",
                ));
            }
            spec.validate_in("new_rc", limits)
                .map_err(|spec_causes| causes.extend(spec_causes))
                .ok()
        });
        if let Some(new_rc) = &new_rc {
            if let Some(fault) = foreign_pod_id(&body.new_rc_labels, &new_rc.rc.manifest) {
                causes.push(FieldError::new(
                    format!("new_rc_labels.{POD_ID_LABEL}"),
                    fault,
                ));
            }
        }

        let (desired, minimum) = match (body.desired_replicas, body.minimum_replicas) {
            (Some(desired), Some(minimum)) => {
                if let Err(problems) = validate_counts(desired, minimum) {
                    causes.extend(problems);
                }
                // validate_counts has refused a negative count already.
                if let (true, Err(problem)) = (desired >= 0, limits.check_replicas(desired)) {
                    causes.push(FieldError::new("desired_replicas", problem));
                }
                (desired, minimum)
            }
            (desired, minimum) => {
                if desired.is_none() {
                    causes.push(FieldError::new("desired_replicas", "is required"));
                }
                if minimum.is_none() {
                    causes.push(FieldError::new("minimum_replicas", "is required"));
                }
                (0, 0)
            }
        };
        let roll_delay = match &body.roll_delay {
            None => std::time::Duration::ZERO,
            Some(text) => parse_duration(text).unwrap_or_else(|e| {
                causes.push(FieldError::new("roll_delay", e));
                std::time::Duration::ZERO
            }),
        };
        for (field, labels) in [
            ("labels", &body.labels),
            ("new_rc_labels", &body.new_rc_labels),
        ] {
            for (at, message) in validate_labels_in(field, labels) {
                causes.push(FieldError::new(at, message));
            }
        }
        if !causes.is_empty() {
            return Err(causes);
        }

        let rcs = match (old_rc_id, selector, new_rc_id, new_rc) {
            (Some(old_rc_id), None, Some(new_rc_id), None) => RollRcs::Existing {
                old_rc_id,
                new_rc_id,
            },
            (Some(old_rc_id), None, None, Some(new_rc)) => RollRcs::NewRc { old_rc_id, new_rc },
            (None, Some(old_rc_selector), None, Some(new_rc)) => RollRcs::NewRcOverSelector {
                old_rc_selector,
                new_rc,
            },
            _ => unreachable!("a request without one of the three forms has causes"),
        };
        Ok(RollPlan {
            rcs,
            desired_replicas: desired,
            minimum_replicas: minimum,
            leave_old: body.leave_old,
            roll_delay,
            roll_labels: body.labels,
            new_rc_labels: body.new_rc_labels,
        })
    }
}

/// Which RCs a roll is over: P2's three creation forms.
#[derive(Debug, Clone)]
pub enum RollRcs {
    /// Both RCs exist.
    Existing {
        old_rc_id: String,
        new_rc_id: String,
    },
    /// The old RC exists; the new one is created with the roll.
    NewRc { old_rc_id: String, new_rc: NewRc },
    /// The old RC is the one RC whose labels match the selector; when none does, a stand-in
    /// with the new RC's spec and no replicas is created so the roll has something to take
    /// replicas from. The new RC is created with the roll.
    NewRcOverSelector {
        old_rc_selector: Selector,
        new_rc: NewRc,
    },
}

/// Everything needed to create one roll.
#[derive(Debug, Clone)]
pub struct RollPlan {
    pub rcs: RollRcs,
    /// The roll is done when the new RC has this many replicas.
    pub desired_replicas: i64,
    /// Healthy pods that must stay up throughout.
    pub minimum_replicas: i64,
    /// Keep the old RC when done.
    pub leave_old: bool,
    /// Pause before each step after the first.
    pub roll_delay: Duration,
    /// The roll's own labels (type `rolls`).
    pub roll_labels: Labels,
    /// Labels merged into the new RC's labels (and the stand-in's, which P2 gives the same).
    pub new_rc_labels: Labels,
}
