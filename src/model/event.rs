//! Events: who changed what, when, and how, for `GET /api/v1/events`. They are this server's
//! own records, kept beside P2's trees (P2's audit records stay as P2 writes them), each
//! written in the transaction of the change it describes, so an event exists exactly when
//! its change happened.
//!
//! Also here: the created and modified times kept beside RCs, rolls and daemon sets, and the
//! record of a finished roll, which P2's documents have no room for.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::health::HealthCounts;
use super::manifest::Manifest;
use super::timestamp::format_rfc3339;
use super::{StoredDaemonSet, StoredRc, StoredRoll};
use crate::labels::LabelType;

/// The kinds of object events are about; named as in the change stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ObjectKind {
    Rcs,
    Rolls,
    Daemonsets,
}

impl ObjectKind {
    /// Every kind.
    pub const ALL: [ObjectKind; 3] = [ObjectKind::Rcs, ObjectKind::Rolls, ObjectKind::Daemonsets];

    /// The name used in events and in `?kind=`.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Rcs => "rcs",
            ObjectKind::Rolls => "rolls",
            ObjectKind::Daemonsets => "daemonsets",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<ObjectKind> {
        ObjectKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

/// What an event is about, named and identified as the change stream names the entry that
/// changed: an object of a document kind; a node's labels (`nodes`, by node name) or another
/// object's labels (`labels`, as `<type>/<id>`); the manifest a node reports running
/// (`reality`, as `<node>/<pod_id>`) or a pod's health on a node (`health`, as
/// `<pod_id>/<node>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Rcs,
    Rolls,
    Daemonsets,
    Nodes,
    Labels,
    Reality,
    Health,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 7] = [
        EventKind::Rcs,
        EventKind::Rolls,
        EventKind::Daemonsets,
        EventKind::Nodes,
        EventKind::Labels,
        EventKind::Reality,
        EventKind::Health,
    ];

    /// The name used in events and in `?kind=`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Rcs => "rcs",
            EventKind::Rolls => "rolls",
            EventKind::Daemonsets => "daemonsets",
            EventKind::Nodes => "nodes",
            EventKind::Labels => "labels",
            EventKind::Reality => "reality",
            EventKind::Health => "health",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<EventKind> {
        EventKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }

    /// The document kind, whose objects have times kept beside them; `None` for the others.
    pub fn document(self) -> Option<ObjectKind> {
        ObjectKind::ALL
            .into_iter()
            .find(|kind| EventKind::from(*kind) == self)
    }

    /// The kind and id of the events about the labels of `label_type` `id`.
    pub fn of_labels(label_type: LabelType, id: &str) -> (EventKind, String) {
        match label_type {
            LabelType::Node => (EventKind::Nodes, id.to_owned()),
            _ => (EventKind::Labels, format!("{label_type}/{id}")),
        }
    }
}

impl From<ObjectKind> for EventKind {
    fn from(kind: ObjectKind) -> Self {
        match kind {
            ObjectKind::Rcs => EventKind::Rcs,
            ObjectKind::Rolls => EventKind::Rolls,
            ObjectKind::Daemonsets => EventKind::Daemonsets,
        }
    }
}

/// What happened to the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// It came to be: for labels and reports, the first of them.
    Created,
    /// Its document changed.
    Updated,
    /// It is gone: for labels and reports, the last of them.
    Deleted,
    /// A farm placed or removed its pods (the document is unchanged).
    Scheduled,
    /// A roll reached its target.
    Succeeded,
    /// A roll was deleted before it finished.
    Cancelled,
    /// A roll ended without reaching its target (an RC of it vanished).
    Failed,
    /// A farm cannot do what the object asks; `message` says why.
    Alert,
}

impl Action {
    /// The action of a change to something that may be absent before or after it, such as a
    /// label set or a report: `Created`, `Deleted` or `Updated`.
    pub fn of_change(existed: bool, exists: bool) -> Action {
        match (existed, exists) {
            (false, _) => Action::Created,
            (true, false) => Action::Deleted,
            (true, true) => Action::Updated,
        }
    }
}

/// One field's value before and after a change; `null` where it had none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FieldChange {
    pub field: String,
    /// Any JSON value.
    pub before: Value,
    /// Any JSON value.
    pub after: Value,
}

/// One recorded change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    /// Sortable by time: nanoseconds since the epoch, then a random part.
    #[schema(example = "01717171717171717171-3fa2b1c0")]
    pub id: String,
    /// When it happened (RFC 3339).
    #[schema(format = DateTime)]
    pub time: String,
    /// Who: a token's name, `anonymous` without authentication, or `farm:<farm>@<holder>`
    /// for the leader's farms.
    pub actor: String,
    pub action: Action,
    pub kind: EventKind,
    /// The object's id.
    pub object_id: String,
    /// The `X-Request-Id` of the API request that made the change; `null` for farms.
    #[schema(required = true)]
    pub request_id: Option<String>,
    /// Each changed field of the stored document, before and after (a manifest by its
    /// SHA: a `manifest` whose before and after are the same SHA had only its text changed,
    /// comments or layout, which the SHA ignores); every field for a creation or deletion. A `scheduled` event's one change,
    /// `nodes`, lists only the nodes the pods left (`before`) and those they were placed on
    /// or rewritten on (`after`).
    pub changes: Vec<FieldChange>,
    /// Why, for alerts and farm decisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub message: Option<String>,
}

impl Event {
    /// The time encoded in an event id, `None` for an id that is not one.
    pub fn time_of_id(id: &str) -> Option<SystemTime> {
        let nanos: u64 = id.split_once('-')?.0.parse().ok()?;
        Some(UNIX_EPOCH + Duration::from_nanos(nanos))
    }

    /// The stored JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an event always serializes")
    }

    /// Reads a stored event.
    pub fn from_json(bytes: &[u8]) -> Result<Event, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The id of the object a stored event is about, read without building the rest;
    /// `None` for bytes that are not an event.
    pub fn object_id_of(bytes: &[u8]) -> Option<Cow<'_, str>> {
        #[derive(Deserialize)]
        struct About<'a> {
            #[serde(borrow)]
            object_id: Cow<'a, str>,
        }
        let about: About<'_> = serde_json::from_slice(bytes).ok()?;
        Some(about.object_id)
    }
}

/// A fresh sortable event id for `time`: zero-padded nanoseconds, then 32 random bits so
/// that two servers' events of one instant stay apart.
pub fn new_event_id(time: SystemTime) -> String {
    let nanos = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{nanos:020}-{:08x}", rand::random::<u32>())
}

/// Who makes changes, and in answer to which request: what every event is recorded with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub name: String,
    pub request_id: Option<String>,
}

/// The actor of requests made without authentication (no token file).
pub const ANONYMOUS: &str = "anonymous";

/// The start of every farm's actor name ([`Actor::farm`]).
const FARM_PREFIX: &str = "farm:";

/// Whether `name` is one the server gives its own actors ([`ANONYMOUS`], a farm's), so that
/// no token may take it and pass its changes off as theirs in events and audit records.
pub fn is_servers_actor_name(name: &str) -> bool {
    name == ANONYMOUS || name.starts_with(FARM_PREFIX)
}

impl Actor {
    /// A farm of the leader `holder`, e.g. `farm:rc@host:123`.
    pub fn farm(farm: &str, holder: &str) -> Actor {
        Actor {
            name: format!("{FARM_PREFIX}{farm}@{holder}"),
            request_id: None,
        }
    }

    /// The event of `action` on `kind` `id`, changing `changes`, happening now.
    pub fn event(
        &self,
        kind: impl Into<EventKind>,
        id: &str,
        action: Action,
        changes: Vec<FieldChange>,
    ) -> Event {
        let now = SystemTime::now();
        Event {
            id: new_event_id(now),
            time: format_rfc3339(now),
            actor: self.name.clone(),
            action,
            kind: kind.into(),
            object_id: id.to_owned(),
            request_id: self.request_id.clone(),
            changes,
            message: None,
        }
    }
}

/// The fields that differ between two documents (JSON objects, `null` for none), sorted.
pub fn diff(before: &Value, after: &Value) -> Vec<FieldChange> {
    let empty = Map::new();
    let fields = |v: &Value| v.as_object().cloned().unwrap_or_else(|| empty.clone());
    let (before, after) = (fields(before), fields(after));
    let names: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    names
        .into_iter()
        .filter_map(|name| {
            let old = before.get(name).cloned().unwrap_or(Value::Null);
            let new = after.get(name).cloned().unwrap_or(Value::Null);
            (old != new).then(|| FieldChange {
                field: name.clone(),
                before: old,
                after: new,
            })
        })
        .collect()
}

/// The field of an RC's or daemon set's document holding its manifest.
const MANIFEST_FIELD: &str = "manifest";

/// A stored document as an event records it: its JSON fields, the manifest (often large)
/// by its SHA.
fn summary(json: &[u8], manifest_sha: String) -> Value {
    let mut value: Value = serde_json::from_slice(json).unwrap_or(Value::Null);
    if let Some(fields) = value.as_object_mut() {
        if fields.contains_key(MANIFEST_FIELD) {
            fields.insert(
                MANIFEST_FIELD.into(),
                format!("sha256:{manifest_sha}").into(),
            );
        }
    }
    value
}

/// An RC's fields for events.
pub fn rc_fields(rc: &StoredRc) -> Value {
    summary(&rc.to_json(), rc.manifest.sha())
}

/// A daemon set's fields for events.
pub fn ds_fields(ds: &StoredDaemonSet) -> Value {
    summary(&ds.to_json(), ds.manifest.sha())
}

/// The fields that differ between two versions of an RC ([`diff`] of [`rc_fields`], with
/// `with_manifest_text`).
pub fn rc_changes(before: &StoredRc, after: &StoredRc) -> Vec<FieldChange> {
    let changes = diff(&rc_fields(before), &rc_fields(after));
    with_manifest_text(changes, &before.manifest, &after.manifest)
}

/// The fields that differ between two versions of a daemon set ([`diff`] of [`ds_fields`],
/// with `with_manifest_text`).
pub fn ds_changes(before: &StoredDaemonSet, after: &StoredDaemonSet) -> Vec<FieldChange> {
    let changes = diff(&ds_fields(before), &ds_fields(after));
    with_manifest_text(changes, &before.manifest, &after.manifest)
}

/// `changes` with the manifest listed when its stored text changed though its SHA did not
/// (comments, layout, which P2's SHA ignores), before and after that same SHA: the write
/// changed what is stored, and its event names what, rather than naming no change.
fn with_manifest_text(
    mut changes: Vec<FieldChange>,
    before: &Manifest,
    after: &Manifest,
) -> Vec<FieldChange> {
    let listed = changes.iter().any(|change| change.field == MANIFEST_FIELD);
    if before.raw() != after.raw() && !listed {
        let sha = Value::from(format!("sha256:{}", after.sha()));
        changes.push(FieldChange {
            field: MANIFEST_FIELD.into(),
            before: sha.clone(),
            after: sha,
        });
        changes.sort_by(|a, b| a.field.cmp(&b.field));
    }
    changes
}

/// A roll's fields for events.
pub fn roll_fields(roll: &StoredRoll) -> Value {
    serde_json::from_slice(&roll.to_json()).unwrap_or(Value::Null)
}

/// When an object was created and last changed through this server, kept beside P2's
/// document (which P2 rewrites without unknown fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// `None` for an object created by another tool.
    pub created: Option<String>,
    pub modified: String,
}

impl Meta {
    /// `(created, modified)` for a view: both `None` when nothing is kept.
    pub fn times(meta: Option<Meta>) -> (Option<String>, Option<String>) {
        match meta {
            Some(meta) => (meta.created, Some(meta.modified)),
            None => (None, None),
        }
    }

    /// The stored JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("meta always serializes")
    }

    /// Reads stored meta.
    pub fn from_json(bytes: &[u8]) -> Result<Meta, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// How a roll ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RollOutcome {
    /// The new RC reached the target.
    Succeeded,
    /// Deleted through the API before it finished.
    Cancelled,
    /// An RC of the roll was deleted underneath it.
    Failed,
}

/// One RC's replica counts in a roll. Pods count as the roll farm counts them: only pods
/// running the RC's manifest (per the reality tree) are health-counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RcProgress {
    /// The RC's `replicas_desired`; `null` when the RC does not exist (any more).
    #[schema(required = true)]
    pub desired: Option<i64>,
    /// Pods labeled with the RC's id (of the RC's pod id, while the RC exists).
    pub current: u64,
    /// Of those, the pods whose node reports running the RC's manifest.
    pub real: u64,
    /// Of the real ones, those whose health is `passing`.
    pub healthy: u64,
    /// Of the real ones, those whose health is `unknown` or not reported.
    pub unknown: u64,
    /// Of the real ones, those whose health is `warning` or `critical`.
    pub unhealthy: u64,
}

impl RcProgress {
    /// The progress of an RC wanting `desired` whose pods count as `pods`.
    pub fn new(desired: Option<i64>, pods: HealthCounts) -> RcProgress {
        RcProgress {
            desired,
            current: pods.current,
            real: pods.real,
            healthy: pods.healthy,
            unknown: pods.unknown,
            unhealthy: pods.unhealthy,
        }
    }
}

/// Replica counts of both RCs of a roll.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RollProgress {
    pub old: RcProgress,
    pub new: RcProgress,
}

/// A finished roll, kept for the retention period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishedRoll {
    pub roll: StoredRollFields,
    pub labels: std::collections::BTreeMap<String, String>,
    pub outcome: RollOutcome,
    /// `None` for a roll created by another tool.
    pub started: Option<String>,
    pub ended: String,
    pub progress: RollProgress,
}

/// The roll's own fields, as the API shows them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredRollFields {
    pub old_rc: String,
    pub new_rc: String,
    pub desired_replicas: i64,
    pub minimum_replicas: i64,
    pub leave_old: bool,
    #[serde(with = "super::duration::duration_string")]
    pub roll_delay: Duration,
}

impl From<&StoredRoll> for StoredRollFields {
    fn from(roll: &StoredRoll) -> Self {
        StoredRollFields {
            old_rc: roll.old_rc.clone(),
            new_rc: roll.new_rc.clone(),
            desired_replicas: roll.desired_replicas,
            minimum_replicas: roll.minimum_replicas,
            leave_old: roll.leave_old,
            roll_delay: roll.roll_delay,
        }
    }
}

impl FinishedRoll {
    /// The stored JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a finished roll always serializes")
    }

    /// Reads a stored finished roll.
    pub fn from_json(bytes: &[u8]) -> Result<FinishedRoll, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diff_lists_changed_fields_with_both_values() {
        let before = json!({"a": 1, "b": "x", "c": true});
        let after = json!({"a": 2, "b": "x", "d": null, "e": [1]});
        let changes = diff(&before, &after);
        let fields: Vec<(&str, Value, Value)> = changes
            .iter()
            .map(|c| (c.field.as_str(), c.before.clone(), c.after.clone()))
            .collect();
        assert_eq!(
            fields,
            [
                ("a", json!(1), json!(2)),
                ("c", json!(true), Value::Null),
                ("e", Value::Null, json!([1])),
            ]
        );
        assert_eq!(diff(&Value::Null, &json!({"a": 1})).len(), 1);
    }

    #[test]
    fn event_ids_sort_by_time_and_carry_it() {
        let early = UNIX_EPOCH + Duration::from_secs(1_000);
        let late = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let (a, b) = (new_event_id(early), new_event_id(late));
        assert!(a < b);
        assert_eq!(Event::time_of_id(&a), Some(early));
        assert_eq!(Event::time_of_id("nope"), None);
    }
}
