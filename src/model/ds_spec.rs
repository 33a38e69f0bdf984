//! What clients send to create or change a daemon set, and the rules that turn it into a
//! [`StoredDaemonSet`]. Bodies are read field by field, so that every bad field is reported
//! at once, not only the first.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::duration::parse_duration;
use super::manifest::errors_at;
use super::rc_spec::manifest_schema;
use super::{DaemonSetId, FieldError, Manifest, Problems, StoredDaemonSet};
use crate::labels::Selector;

/// Fields a client reads but never writes.
const READ_ONLY_FIELDS: [&str; 4] = ["id", "pod_id", "resource_version", "status"];

/// The body of `POST /api/v1/daemonsets`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDaemonSet {
    /// The pod manifest: YAML text, or a JSON object (stored as its YAML rendering). Its `id`
    /// becomes the daemon set's `pod_id`.
    #[schema(schema_with = manifest_schema)]
    pub manifest: Value,
    /// Selector of the nodes to run on; required, and `""` explicitly selects every node.
    pub node_selector: String,
    /// Nodes that must stay healthy while the farm replaces pods with a new manifest (P2's
    /// farm ignores it); at least 0; default 0.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub min_health: i64,
    /// Free-form name such as `production`; default `""`.
    #[serde(default)]
    pub cluster_name: String,
    /// Per-node timeout as duration text such as `10m`; must be positive. The farm brings
    /// up at most 50 nodes at a time, and gives up on a node not healthy within it.
    #[schema(example = "10m")]
    pub timeout: String,
    /// Store the daemon set paused; a disabled daemon set may contend with others.
    #[serde(default)]
    pub disabled: bool,
}

/// The body of `PATCH /api/v1/daemonsets/{id}`: a JSON merge patch of these fields; absent
/// fields stay as they are and none may be `null`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DaemonSetPatch {
    /// A whole new manifest (YAML text or JSON object); its `id` must equal the daemon set's
    /// `pod_id`.
    #[schema(schema_with = manifest_schema)]
    pub manifest: Option<Value>,
    /// A new node selector; `""` selects every node.
    #[schema(nullable = false)]
    pub node_selector: Option<String>,
    /// At least 0.
    #[schema(minimum = 0, nullable = false)]
    pub min_health: Option<i64>,
    /// Free-form name such as `production`.
    #[schema(nullable = false)]
    pub cluster_name: Option<String>,
    /// Duration text such as `10m`; must be positive.
    #[schema(example = "10m", nullable = false)]
    pub timeout: Option<String>,
    /// Pause (`true`) or resume (`false`) the daemon set.
    #[schema(nullable = false)]
    pub disabled: Option<bool>,
}

/// A validated patch, ready to apply to whatever version is current.
#[derive(Debug, Default)]
pub struct DaemonSetChanges {
    /// A new manifest, for the same pod.
    pub manifest: Option<Manifest>,
    pub node_selector: Option<String>,
    pub min_health: Option<i64>,
    pub cluster_name: Option<String>,
    pub timeout: Option<Duration>,
    pub disabled: Option<bool>,
}

impl DaemonSetChanges {
    /// `ds` with the changes applied; refuses a manifest for another pod, since the pod ID
    /// of a daemon set never changes (P2's invariant).
    pub fn apply(&self, ds: &StoredDaemonSet) -> Result<StoredDaemonSet, FieldError> {
        let mut next = ds.clone();
        if let Some(manifest) = &self.manifest {
            if let Some(problem) = pod_id_problem(manifest, ds) {
                return Err(problem);
            }
            next.manifest = manifest.clone();
        }
        if let Some(selector) = &self.node_selector {
            next.node_selector.clone_from(selector);
        }
        if let Some(min_health) = self.min_health {
            next.min_health = min_health;
        }
        if let Some(name) = &self.cluster_name {
            next.cluster_name.clone_from(name);
        }
        if let Some(timeout) = self.timeout {
            next.timeout = timeout;
        }
        if let Some(disabled) = self.disabled {
            next.disabled = disabled;
        }
        Ok(next)
    }
}

/// A daemon set's pod id never changes (P2's invariant): a manifest for another pod is a
/// problem.
pub fn pod_id_problem(manifest: &Manifest, ds: &StoredDaemonSet) -> Option<FieldError> {
    (manifest.pod_id() != ds.pod_id).then(|| {
        FieldError::new(
            "manifest.id",
            format!(
                "must equal the daemon set's pod_id {:?}, not {:?}",
                ds.pod_id,
                manifest.pod_id()
            ),
        )
    })
}

/// The stored daemon set a create body describes, with a fresh ID. The body is read field by
/// field so that every bad field is reported at once, not only the first.
pub fn new_daemon_set(body: Map<String, Value>) -> Result<StoredDaemonSet, Vec<FieldError>> {
    let mut fields = Fields::new(body);
    let manifest = fields.required::<Value>("manifest", "a YAML string or a JSON object");
    let node_selector = fields.required::<String>(
        "node_selector",
        "a selector string (\"\" selects every node)",
    );
    let min_health = fields.optional::<i64>("min_health", "an integer");
    let cluster_name = fields.optional::<String>("cluster_name", "a string");
    let timeout = fields.required::<String>("timeout", "duration text such as \"10m\"");
    let disabled = fields.optional::<bool>("disabled", "true or false");
    let mut violations = fields.into_violations();
    let manifest = manifest.and_then(|m| valid_manifest(&m, &mut violations));
    let node_selector = node_selector.and_then(|s| valid_selector(&s, &mut violations));
    let timeout = timeout.and_then(|t| valid_timeout(&t, &mut violations));
    let min_health = min_health.unwrap_or_default();
    check_min_health(min_health, &mut violations);
    violations.finish()?;
    let (Some(manifest), Some(node_selector), Some(timeout)) = (manifest, node_selector, timeout)
    else {
        unreachable!("missing or invalid required fields are violations");
    };
    Ok(StoredDaemonSet {
        id: DaemonSetId::generate().to_string(),
        disabled: disabled.unwrap_or_default(),
        pod_id: manifest.pod_id().to_owned(),
        manifest,
        min_health,
        cluster_name: cluster_name.unwrap_or_default(),
        node_selector,
        timeout,
    })
}

/// Reads and validates a merge patch: what could be read, and every problem found, to which
/// the caller adds the checks that need the stored daemon set.
pub fn parse_patch(body: Map<String, Value>) -> (DaemonSetChanges, Problems) {
    let mut fields = Fields::new(body);
    let patch = DaemonSetPatch {
        manifest: fields.optional("manifest", "a YAML string or a JSON object"),
        node_selector: fields.optional("node_selector", "a selector string"),
        min_health: fields.optional("min_health", "an integer"),
        cluster_name: fields.optional("cluster_name", "a string"),
        timeout: fields.optional("timeout", "duration text such as \"10m\""),
        disabled: fields.optional("disabled", "true or false"),
    };
    let mut violations = fields.into_violations();
    let changes = DaemonSetChanges {
        manifest: patch
            .manifest
            .as_ref()
            .and_then(|m| valid_manifest(m, &mut violations)),
        node_selector: patch
            .node_selector
            .as_deref()
            .and_then(|s| valid_selector(s, &mut violations)),
        min_health: patch
            .min_health
            .inspect(|&n| check_min_health(n, &mut violations)),
        cluster_name: patch.cluster_name,
        timeout: patch
            .timeout
            .as_deref()
            .and_then(|t| valid_timeout(t, &mut violations)),
        disabled: patch.disabled,
    };
    (changes, violations)
}

/// A JSON object read one field at a time, collecting a violation for each bad one.
struct Fields {
    body: Map<String, Value>,
    violations: Problems,
}

impl Fields {
    fn new(body: Map<String, Value>) -> Self {
        Fields {
            body,
            violations: Problems::new(),
        }
    }

    /// The field if present; `null` and values of the wrong type are violations.
    fn optional<T: DeserializeOwned>(&mut self, name: &str, expected: &str) -> Option<T> {
        let value = self.body.remove(name)?;
        if value.is_null() {
            self.violations
                .add(name, "must not be null; this field cannot be removed");
            return None;
        }
        serde_json::from_value(value)
            .map_err(|_| self.violations.add(name, format!("must be {expected}")))
            .ok()
    }

    /// The field, which must be present.
    fn required<T: DeserializeOwned>(&mut self, name: &str, expected: &str) -> Option<T> {
        if !self.body.contains_key(name) {
            self.violations.add(name, "is required");
            return None;
        }
        self.optional(name, expected)
    }

    /// Every problem found, with each field not read counted as one.
    fn into_violations(mut self) -> Problems {
        for name in self.body.keys() {
            if READ_ONLY_FIELDS.contains(&name.as_str()) {
                self.violations
                    .add(name.as_str(), "is set by the server and cannot be written");
            } else {
                self.violations
                    .add(name.as_str(), "is not a field of a daemon set");
            }
        }
        self.violations
    }
}

/// The manifest, held to the one rule for new manifests ([`Manifest::from_request`]).
fn valid_manifest(value: &Value, violations: &mut Problems) -> Option<Manifest> {
    Manifest::from_request(value)
        .map_err(|errors| violations.extend(errors_at("manifest", errors)))
        .ok()
}

/// The selector in canonical form, as stored.
fn valid_selector(text: &str, violations: &mut Problems) -> Option<String> {
    text.parse::<Selector>()
        .map(|selector| selector.to_string())
        .map_err(|e| violations.add("node_selector", e.to_string()))
        .ok()
}

/// A positive duration: P2's replicator times a node out at once with a zero timeout.
fn valid_timeout(text: &str, violations: &mut Problems) -> Option<Duration> {
    match parse_duration(text) {
        Ok(timeout) if timeout.is_zero() => {
            violations.add("timeout", "must be positive");
            None
        }
        Ok(timeout) => Some(timeout),
        Err(e) => {
            violations.add("timeout", e);
            None
        }
    }
}

fn check_min_health(min_health: i64, violations: &mut Problems) {
    if min_health < 0 {
        violations.add("min_health", "must not be negative");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn create_lists_every_bad_field() {
        let body = object(serde_json::json!({
            "manifest": "id: a/b\n",
            "node_selector": "role in (",
            "min_health": -1,
            "disabled": "yes",
            "pod_id": "x",
            "colour": "red"
        }));
        let problems = new_daemon_set(body).unwrap_err();
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "timeout",
                "disabled",
                "colour",
                "pod_id",
                "manifest.id",
                "node_selector",
                "min_health"
            ]
        );
    }
}
