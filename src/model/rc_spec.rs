//! What clients send to create or change a replication controller, and the rules that turn
//! it into a [`StoredRc`]: [`RcSpec`] (creation, also of a roll's new RC) and [`RcPatch`]
//! (a JSON merge patch).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

use super::manifest::errors_at;
use super::{AllocationStrategy, FieldError, Limits, Manifest, Problems, RcId, StoredRc};
use crate::labels::validation::LabelSet;
use crate::labels::{
    label_key_problem, label_value_problem, validate_label_value, validate_labels_in, Labels,
    Selector, AVAILABILITY_ZONE_LABEL, CLUSTER_NAME_LABEL, DS_ID_LABEL, POD_ID_LABEL,
};

/// A new RC as clients describe it. Rolling-update creation reuses it for the RC it makes,
/// so every RC gets the same validation and the same pod labels whichever route made it
/// (P2's two creation paths disagree on the zone and cluster labels).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RcSpec {
    /// The pod manifest: YAML text (stored byte for byte, signatures included) or a JSON
    /// object (stored as its YAML rendering).
    #[schema(schema_with = manifest_schema)]
    pub manifest: serde_json::Value,
    /// Which nodes the RC may schedule on; `""` selects every node. Stored canonically.
    #[serde(default)]
    #[schema(example = "availability_zone=us-west-2a,role in (web,worker)")]
    pub node_selector: String,
    /// Labels put on every pod the RC schedules; not `daemon_set_id`, which names a pod's
    /// daemon set.
    #[serde(default)]
    #[schema(value_type = LabelSet)]
    pub pod_labels: Labels,
    /// How many pods the RC wants: 0 to the server's `--max-replicas` (10,000 unless
    /// configured).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 10000)]
    pub replicas_desired: i64,
    /// A disabled RC makes no scheduling changes.
    #[serde(default)]
    pub disabled: bool,
    #[serde(default)]
    #[schema(schema_with = created_strategy_schema)]
    pub allocation_strategy: String,
    /// The RC's own labels; `pod_id=<manifest id>` is always added.
    #[serde(default)]
    #[schema(value_type = LabelSet)]
    pub labels: Labels,
    /// Added to `pod_labels` as `availability_zone` when given, as `p2-rctl create` does.
    pub availability_zone: Option<String>,
    /// Added to `pod_labels` as `cluster_name` when given, as `p2-rctl create` does.
    pub cluster_name: Option<String>,
}

/// A validated new RC, ready for [`crate::store::rcs::RcStore::create`] or its
/// `create_ops`: the stored document (with a fresh id) and the RC's own labels.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRc {
    pub rc: StoredRc,
    pub labels: Labels,
}

impl RcSpec {
    /// Checks every field and reports every problem at once, with cause fields named as in
    /// the request body.
    pub fn validate(self, limits: &Limits) -> Result<NewRc, Vec<FieldError>> {
        self.validate_in("", limits)
    }

    /// Like [`RcSpec::validate`] for a spec nested in a larger body: cause fields are put
    /// under `at` (for example `new_rc.manifest`); `""` means the top level.
    pub fn validate_in(self, at: &str, limits: &Limits) -> Result<NewRc, Vec<FieldError>> {
        let field = |name: &str| nested(at, name);
        let mut causes = Vec::new();

        let manifest = match Manifest::from_request(&self.manifest) {
            Ok(manifest) => Some(manifest),
            Err(errors) => {
                causes.extend(errors_at(&field("manifest"), errors));
                None
            }
        };

        let node_selector = match self.node_selector.parse::<Selector>() {
            Ok(selector) => selector.to_string(),
            Err(e) => {
                causes.push(FieldError::new(field("node_selector"), e.to_string()));
                String::new()
            }
        };

        let mut pod_labels = self.pod_labels;
        let extra = [
            (
                AVAILABILITY_ZONE_LABEL,
                "availability_zone",
                self.availability_zone,
            ),
            (CLUSTER_NAME_LABEL, "cluster_name", self.cluster_name),
        ];
        for (label, name, value) in extra {
            let Some(value) = value else { continue };
            if let Err(e) = validate_label_value(&value) {
                causes.push(FieldError::new(field(name), e));
            }
            match pod_labels.get(label) {
                Some(existing) if *existing != value => causes.push(FieldError::new(
                    field(&format!("pod_labels.{label}")),
                    format!("contradicts {name} {value:?}; give one or make them equal"),
                )),
                _ => {
                    pod_labels.insert(label.to_owned(), value);
                }
            }
        }
        for (at_field, message) in validate_labels_in(&field("pod_labels"), &pod_labels) {
            causes.push(FieldError::new(at_field, message));
        }
        for key in pod_labels.keys() {
            if let Some(problem) = foreign_owner_problem(key) {
                causes.push(FieldError::new(
                    field(&format!("pod_labels.{key}")),
                    problem,
                ));
            }
        }

        let mut labels = self.labels;
        for (at_field, message) in validate_labels_in(&field("labels"), &labels) {
            causes.push(FieldError::new(at_field, message));
        }
        if let Some(manifest) = &manifest {
            match foreign_pod_id(&labels, manifest) {
                Some(fault) => causes.push(FieldError::new(
                    field(&format!("labels.{POD_ID_LABEL}")),
                    fault,
                )),
                None => {
                    labels.insert(POD_ID_LABEL.to_owned(), manifest.pod_id().to_owned());
                }
            }
        }

        if let Err(problem) = limits.check_replicas(self.replicas_desired) {
            causes.push(FieldError::new(field("replicas_desired"), problem));
        }
        let allocation_strategy = self
            .allocation_strategy
            .parse::<AllocationStrategy>()
            .unwrap_or_else(|e| {
                let message = format!("{e}; expected {CREATED_STRATEGIES}");
                causes.push(FieldError::new(field("allocation_strategy"), message));
                AllocationStrategy::Unset
            });

        match manifest {
            Some(manifest) if causes.is_empty() => Ok(NewRc {
                rc: StoredRc {
                    id: RcId::generate().to_string(),
                    manifest,
                    node_selector,
                    pod_labels: Some(pod_labels),
                    replicas_desired: self.replicas_desired,
                    disabled: self.disabled,
                    allocation_strategy,
                },
                labels,
            }),
            _ => Err(causes),
        }
    }
}

fn nested(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_owned()
    } else {
        format!("{at}.{name}")
    }
}

/// `manifest` is YAML text or a JSON object.
pub(super) fn manifest_schema() -> impl Into<RefOr<Schema>> {
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some("The manifest as YAML text, kept byte for byte")),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .description(Some("The manifest as a JSON object")),
        )
        .description(Some(
            "A P2 pod manifest (`id`, `launchables`, `config`, `status`, ...)",
        ))
        .examples([serde_json::json!(
            "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello.tar.gz\n"
        )])
}

/// The body of `PATCH /api/v1/rcs/{id}` as the document shows it: a JSON merge patch
/// (RFC 7386) of these fields, absent ones staying as they are. Only `pod_labels` may be
/// `null` (removing every pod label), as may each of its labels (removing that one).
// The document's shape only: `RcPatch::parse` reads the patch, reporting every bad field.
#[derive(ToSchema)]
#[schema(as = RcPatch)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct RcPatchDocument {
    /// A whole new manifest (YAML text or JSON object) for the same pod: its `id` must stay
    /// the RC's pod id.
    #[schema(schema_with = manifest_schema)]
    manifest: Option<Value>,
    /// Which nodes the RC may schedule on; `""` selects every node.
    #[schema(nullable = false)]
    node_selector: Option<String>,
    /// How many pods the RC wants: 0 to the server's `--max-replicas` (10,000 unless
    /// configured).
    #[schema(minimum = 0, maximum = 10000, nullable = false)]
    replicas_desired: Option<i64>,
    /// A disabled RC makes no scheduling changes.
    #[schema(nullable = false)]
    disabled: Option<bool>,
    #[schema(schema_with = patched_strategy_schema)]
    allocation_strategy: Option<String>,
    /// A label mapped to a string is set, one mapped to `null` removed, others kept;
    /// `"pod_labels": null` removes every pod label. Not `daemon_set_id`, which names a
    /// pod's daemon set.
    #[schema(value_type = Option<BTreeMap<String, Option<String>>>)]
    pod_labels: Option<Value>,
}

/// The allocation strategies a new RC may have, as its refusal of another lists them: `""`
/// too, as older RCs do.
const CREATED_STRATEGIES: &str =
    "\"dynamic_strategy\", \"static_strategy\" or \"\" (as older RCs; behaves as static)";

/// The allocation strategies a patch may set, as its refusal of another lists them.
const PATCHED_STRATEGIES: &str = "\"dynamic_strategy\" or \"static_strategy\"";

/// The allocation strategies a new RC may have: `""` too, as older RCs do.
fn created_strategy_schema() -> impl Into<RefOr<Schema>> {
    strategy_schema(
        &["dynamic_strategy", "static_strategy", ""],
        " or `\"\"` (as older RCs; behaves as static)",
    )
}

/// The allocation strategies a patch may set (not `""`, which only older RCs hold).
fn patched_strategy_schema() -> impl Into<RefOr<Schema>> {
    strategy_schema(&["dynamic_strategy", "static_strategy"], "")
}

fn strategy_schema(values: &[&str], or_unset: &str) -> impl Into<RefOr<Schema>> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values.iter().copied()))
        .description(Some(format!(
            "`dynamic_strategy` (move pods off nodes that stop matching), `static_strategy` \
             (leave them){or_unset}"
        )))
        .examples([serde_json::json!("static_strategy")])
}

/// The fields of an RC a merge patch may change.
const PATCHABLE: &str =
    "replicas_desired, disabled, node_selector, pod_labels, manifest, allocation_strategy";

/// A merge patch of an RC, checked before anything is read.
#[derive(Debug, Default)]
pub struct RcPatch {
    replicas_desired: Option<i64>,
    disabled: Option<bool>,
    node_selector: Option<String>,
    pod_labels: Option<PodLabelsPatch>,
    manifest: Option<Manifest>,
    allocation_strategy: Option<AllocationStrategy>,
}

/// `pod_labels: null` removes them all; an object sets (string) or removes (`null`) keys.
#[derive(Debug)]
pub enum PodLabelsPatch {
    Clear,
    Merge(BTreeMap<String, Option<String>>),
}

impl RcPatch {
    /// Checks every member of the patch, reporting every problem at once.
    pub fn parse(
        members: serde_json::Map<String, Value>,
        limits: &Limits,
    ) -> Result<RcPatch, Vec<FieldError>> {
        let mut patch = RcPatch::default();
        let mut problems = Problems::new();
        for (name, value) in members {
            let removal = value.is_null();
            match name.as_str() {
                "replicas_desired"
                | "disabled"
                | "node_selector"
                | "manifest"
                | "allocation_strategy"
                    if removal =>
                {
                    problems.add(name, "cannot be removed; give it a value");
                }
                "replicas_desired" => match value.as_i64().map(|n| (n, limits.check_replicas(n))) {
                    Some((n, Ok(()))) => patch.replicas_desired = Some(n),
                    Some((_, Err(problem))) => problems.add(name, problem),
                    None => problems.add(name, "must be an integer"),
                },
                "disabled" => match value {
                    Value::Bool(b) => patch.disabled = Some(b),
                    _ => problems.add(name, "must be true or false"),
                },
                "node_selector" => match value.as_str().map(str::parse::<Selector>) {
                    Some(Ok(selector)) => patch.node_selector = Some(selector.to_string()),
                    Some(Err(e)) => problems.add(name, e.to_string()),
                    None => problems.add(name, "must be a selector string"),
                },
                "pod_labels" => match value {
                    Value::Null => patch.pod_labels = Some(PodLabelsPatch::Clear),
                    Value::Object(entries) => {
                        let mut merge = BTreeMap::new();
                        for (key, value) in entries {
                            let at = format!("pod_labels.{key}");
                            // A removal is not checked, so that a label P2 stored unchecked
                            // can still be removed by name.
                            let problem = label_key_problem(&key)
                                .or_else(|| foreign_owner_problem(&key).map(str::to_owned));
                            if let Some(problem) = problem.filter(|_| !value.is_null()) {
                                problems.add(&at, problem);
                            }
                            match value {
                                Value::Null => {
                                    merge.insert(key, None);
                                }
                                Value::String(text) => {
                                    if let Some(problem) = label_value_problem(&text) {
                                        problems.add(&at, problem);
                                    }
                                    merge.insert(key, Some(text));
                                }
                                _ => problems.add(&at, "must be a string, or null to remove it"),
                            }
                        }
                        patch.pod_labels = Some(PodLabelsPatch::Merge(merge));
                    }
                    _ => problems.add(name, "must be an object of label values, or null"),
                },
                "manifest" => match Manifest::from_request(&value) {
                    Ok(manifest) => patch.manifest = Some(manifest),
                    Err(errors) => problems.extend(errors_at("manifest", errors)),
                },
                "allocation_strategy" => match value.as_str().map(str::parse) {
                    Some(Ok(AllocationStrategy::Unset)) | None => {
                        problems.add(name, format!("can only be set to {PATCHED_STRATEGIES}"))
                    }
                    Some(Ok(strategy)) => patch.allocation_strategy = Some(strategy),
                    Some(Err(e)) => {
                        problems.add(name, format!("{e}; expected {PATCHED_STRATEGIES}"))
                    }
                },
                "labels" => problems.add(
                    name,
                    "is read-only here; change an RC's labels with \
                     /api/v1/labels/replication_controller/{id}",
                ),
                "id" | "resource_version" | "status" => problems.add(name, "is read-only"),
                _ => problems.add(
                    name,
                    format!("is not a field of a replication controller; patchable: {PATCHABLE}"),
                ),
            }
        }
        problems.finish().map(|()| patch)
    }

    /// Applies the patch to `rc`; a manifest for another pod is refused, since the RC's pods,
    /// labels and rolls are all keyed by the pod id.
    pub fn apply(&self, rc: &mut StoredRc) -> Result<(), FieldError> {
        if let Some(manifest) = &self.manifest {
            if manifest.pod_id() != rc.manifest.pod_id() {
                return Err(FieldError::new(
                    "manifest.id",
                    format!(
                        "must stay {:?}, the RC's pod id; create a new RC (and roll to it) to \
                         run another pod",
                        rc.manifest.pod_id()
                    ),
                ));
            }
            rc.manifest = manifest.clone();
        }
        if let Some(n) = self.replicas_desired {
            rc.replicas_desired = n;
        }
        if let Some(disabled) = self.disabled {
            rc.disabled = disabled;
        }
        if let Some(selector) = &self.node_selector {
            rc.node_selector = selector.clone();
        }
        if let Some(strategy) = &self.allocation_strategy {
            rc.allocation_strategy = strategy.clone();
        }
        match &self.pod_labels {
            None => {}
            Some(PodLabelsPatch::Clear) => rc.pod_labels = None,
            Some(PodLabelsPatch::Merge(changes)) => {
                let labels = rc.pod_labels.get_or_insert_with(Labels::new);
                for (key, value) in changes {
                    match value {
                        Some(value) => labels.insert(key.clone(), value.clone()),
                        None => labels.remove(key),
                    };
                }
            }
        }
        Ok(())
    }
}

/// What is wrong with `key` as a label an RC puts on its pods, if it is the label naming a
/// pod's daemon set: an RC's pods would then be that daemon set's too, and the DS farms (P2's
/// and ours) remove or rewrite a daemon set's pods that no enabled RC claims, a disabled RC's
/// among them, or clean them up as a deleted daemon set's.
fn foreign_owner_problem(key: &str) -> Option<&'static str> {
    (key == DS_ID_LABEL).then_some(
        "names the daemon set owning a pod; an RC's pods cannot carry it, or a daemon set \
         would take them as its own",
    )
}

/// What is wrong with an RC's `labels`, if they give it a `pod_id` label other than its
/// manifest's id: that label is always the manifest's id, as the RC farm labels the pods, so
/// that a `pod_id` selector never finds an RC running another pod.
pub fn foreign_pod_id(labels: &Labels, manifest: &Manifest) -> Option<String> {
    let given = labels.get(POD_ID_LABEL)?;
    let pod_id = manifest.pod_id();
    (given != pod_id).then(|| format!("is always the RC's manifest id {pod_id:?}; leave it out"))
}

/// What is wrong with a write of an RC's own labels from `before` to `after`, if it takes
/// their `pod_id` label away from the manifest's id `pod_id`: set to another value, or
/// removed while it held the id. A roll's `old_rc_selector` or any `pod_id` selector would
/// then find an RC running another pod, or lose one running its own. A write that leaves
/// the label as it was (absent, or another value P2 wrote), sets it to the id, or removes
/// another value is let through.
pub fn pod_id_label_change(before: &Labels, after: &Labels, pod_id: &str) -> Option<String> {
    let (was, is) = (before.get(POD_ID_LABEL), after.get(POD_ID_LABEL));
    let refused = was != is
        && is.is_none_or(|value| value != pod_id)
        && (is.is_some() || was.is_some_and(|value| value == pod_id));
    refused.then(|| {
        format!("is always the RC's manifest id {pod_id:?}; it cannot be changed or removed")
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(value: serde_json::Value) -> RcSpec {
        serde_json::from_value(value).unwrap()
    }

    const MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://a.example.com/h.tar.gz\n";

    #[test]
    fn a_minimal_spec_gets_p2_defaults_and_the_pod_id_label() {
        let new = spec(json!({"manifest": MANIFEST}))
            .validate(&Limits::default())
            .unwrap();
        assert!(uuid::Uuid::parse_str(&new.rc.id).is_ok());
        assert_eq!(new.rc.manifest.raw(), MANIFEST);
        assert_eq!(new.rc.replicas_desired, 0);
        assert!(!new.rc.disabled);
        assert_eq!(new.rc.allocation_strategy, AllocationStrategy::Unset);
        assert_eq!(new.rc.node_selector, "");
        assert_eq!(new.rc.pod_labels, Some(Labels::new()));
        assert_eq!(
            new.labels,
            Labels::from([("pod_id".into(), "hello".into())])
        );
    }

    #[test]
    fn zone_and_cluster_join_the_pod_labels_and_the_selector_is_canonical() {
        let new = spec(json!({
            "manifest": {"id": "hello"},
            "node_selector": "role in (worker,web), az=a",
            "availability_zone": "us-west-2a",
            "cluster_name": "",
            "pod_labels": {"team": "x"},
            "allocation_strategy": "dynamic_strategy",
        }))
        .validate(&Limits::default())
        .unwrap();
        assert_eq!(new.rc.node_selector, "az=a,role in (web,worker)");
        assert_eq!(
            new.rc.pod_labels.unwrap(),
            Labels::from([
                ("availability_zone".into(), "us-west-2a".into()),
                ("cluster_name".into(), "".into()),
                ("team".into(), "x".into()),
            ])
        );
        assert_eq!(new.rc.allocation_strategy, AllocationStrategy::Dynamic);
    }

    #[test]
    fn every_problem_is_reported_under_the_given_field() {
        let causes = spec(json!({
            "manifest": "launchables:\n  app: {}\n",
            "node_selector": "a in (",
            "pod_labels": {"bad key!": "v"},
            "labels": {"k": "bad value!"},
            "replicas_desired": -1,
            "allocation_strategy": "sometimes",
            "availability_zone": "no spaces",
        }))
        .validate_in("new_rc", &Limits::default())
        .unwrap_err();
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        for expected in [
            "new_rc.manifest.id",
            "new_rc.manifest.launchables.app.launchable_type",
            "new_rc.node_selector",
            "new_rc.pod_labels.bad key!",
            "new_rc.labels.k",
            "new_rc.replicas_desired",
            "new_rc.allocation_strategy",
            "new_rc.availability_zone",
        ] {
            assert!(
                fields.contains(&expected),
                "{expected} missing from {fields:?}"
            );
        }
    }

    #[test]
    fn contradictions_and_unusable_pod_ids_are_refused() {
        let causes = spec(json!({
            "manifest": {"id": "hello"},
            "labels": {"pod_id": "other"},
            "pod_labels": {"cluster_name": "a"},
            "cluster_name": "b",
        }))
        .validate(&Limits::default())
        .unwrap_err();
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["pod_labels.cluster_name", "labels.pod_id"]);

        let causes = spec(json!({"manifest": {"id": "../etc"}}))
            .validate(&Limits::default())
            .unwrap_err();
        assert_eq!(causes[0].field, "manifest.id");
        let causes = spec(json!({"manifest": 3}))
            .validate(&Limits::default())
            .unwrap_err();
        assert_eq!(causes[0].field, "manifest");
    }

    #[test]
    fn a_label_write_keeps_the_pod_id_label_at_the_manifest_id() {
        let labels = |pod_id: Option<&str>| {
            let mut labels = Labels::from([("team".into(), "a".into())]);
            if let Some(pod_id) = pod_id {
                labels.insert(POD_ID_LABEL.into(), pod_id.into());
            }
            labels
        };
        let refused = |was, is| pod_id_label_change(&labels(was), &labels(is), "hello").is_some();
        assert!(refused(Some("hello"), Some("other")));
        assert!(refused(Some("hello"), None));
        assert!(refused(None, Some("other")));
        assert!(refused(Some("stale"), Some("other")));
        assert!(!refused(Some("hello"), Some("hello")));
        assert!(!refused(None, None));
        assert!(!refused(None, Some("hello")));
        assert!(!refused(Some("stale"), Some("stale")));
        assert!(!refused(Some("stale"), Some("hello")));
        assert!(!refused(Some("stale"), None));
    }

    #[test]
    fn unknown_fields_do_not_deserialize() {
        assert!(
            serde_json::from_value::<RcSpec>(json!({"manifest": MANIFEST, "replica": 1})).is_err()
        );
    }
}
