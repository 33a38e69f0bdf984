//! The daemon-set store: `daemon_sets/<uuid>` documents in P2's format, each change audited in
//! the same transaction, plus the contention rule (P2's `DSContends`) the API and the DS farm
//! share, and whose write made a contention, which the DS farm acts on.
//!
//! Reads skip (and log) what they cannot decode, so one bad document never hides the others.
//! Writes check P2's invariants first: the ID is a UUID and never changes, `pod_id` equals the
//! manifest's `id`, and the node selector parses.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::labels::{LabelType, LabelValues, Labeled, Selector};
use crate::model::event::{diff, ds_changes, ds_fields, Action, Actor, ObjectKind};
use crate::model::{
    AuditRecord, DaemonSetEvent, DaemonSetId, DecodeError, FieldError, IdError, StoredDaemonSet,
};

use super::events::{deleted_ops, meta_delete_op, record_ops, record_update_ops};
use super::labels::LabelStore;
use super::update::{update_from_mirror, update_with_retry, Expected, UpdateError};
use super::{manifest_too_large, Versioned};
use crate::kv::{KvPair, KvStore, StoreError, StoreResult, TxnOp};
use crate::layout;
use crate::state::{Entry, Mirror, View};

/// Parses a daemon-set ID by [`DaemonSetId`]'s rule, so that every ID names exactly one key
/// and the key's segment reads back as the same ID.
pub fn parse_daemon_set_id(text: &str) -> Result<Uuid, IdError> {
    text.parse::<DaemonSetId>().map(DaemonSetId::uuid)
}

/// One daemon set and the modify index it was read at (the CAS token and the API's ETag).
pub type DaemonSetRecord = Versioned<StoredDaemonSet>;

/// What the DS farm publishes about a rollout at `status/daemon_sets/<id>/daemon_set_farm`,
/// in P2's JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DaemonSetFarmStatus {
    /// SHA of the manifest being rolled out.
    #[serde(default)]
    #[schema(required = true)]
    pub manifest_sha: String,
    /// Nodes that completed this manifest; reset on a manifest change.
    #[serde(default)]
    #[schema(required = true)]
    pub nodes_deployed: i64,
    /// Whether nodes are still being worked on.
    #[serde(default)]
    #[schema(required = true)]
    pub replication_in_progress: bool,
}

/// Why a daemon-set operation failed; callers map each kind to their own answer (the API to
/// 404, 412, 500, 422 or the store error's status).
#[derive(Debug, thiserror::Error)]
pub enum DaemonSetError {
    /// No document at the daemon set's key.
    #[error("no daemon set {0}")]
    NotFound(Uuid),
    /// The caller asked for a write at an index the daemon set is no longer at (or at any,
    /// and it is gone); `what` names it.
    #[error("{what} is no longer at {expected}")]
    Stale { what: String, expected: Expected },
    /// The stored document cannot be decoded, so it cannot be changed safely either.
    #[error("daemon set {id} cannot be decoded: {source}")]
    Undecodable {
        id: Uuid,
        #[source]
        source: DecodeError,
    },
    /// The daemon set to write breaks one of P2's invariants.
    #[error("invalid daemon set: {}", join(.0))]
    Invalid(Vec<FieldError>),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl UpdateError for DaemonSetError {
    fn stale(what: &str, expected: Expected) -> Self {
        DaemonSetError::Stale {
            what: what.to_owned(),
            expected,
        }
    }
}

fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Reads and writes daemon sets with P2's layout and JSON, auditing every change.
#[derive(Clone)]
pub struct DaemonSetStore {
    kv: Arc<dyn KvStore>,
}

impl DaemonSetStore {
    /// Wraps the KV store.
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        DaemonSetStore { kv }
    }

    /// One daemon set, or `None` when there is no document at its key.
    pub async fn get(&self, id: Uuid) -> Result<Option<DaemonSetRecord>, DaemonSetError> {
        let Some(pair) = self.kv.get(&layout::daemon_set(id)).await? else {
            return Ok(None);
        };
        StoredDaemonSet::from_json(&pair.value)
            .map(|ds| {
                Some(DaemonSetRecord {
                    value: ds,
                    index: pair.modify_index,
                })
            })
            .map_err(|source| DaemonSetError::Undecodable { id, source })
    }

    /// Every readable daemon set, sorted by ID, with the listing's index for blocking
    /// queries. Keys that are not canonical UUIDs, documents that do not decode and documents
    /// whose `id` disagrees with their key are logged and skipped.
    pub async fn list(&self) -> StoreResult<(u64, Vec<DaemonSetRecord>)> {
        let listing = self.kv.list(layout::DAEMON_SETS).await?;
        let records = listing.pairs.iter().filter_map(decode_pair).collect();
        Ok((listing.index, records))
    }

    /// Creates a daemon set whose `id` the caller chose (normally
    /// [`DaemonSetId::generate`]'s): one transaction writes it only if the key is absent,
    /// together with its `DAEMON_SET_CREATED` audit record naming `actor`, and its event and
    /// times.
    pub async fn create(
        &self,
        ds: StoredDaemonSet,
        actor: &Actor,
    ) -> Result<DaemonSetRecord, DaemonSetError> {
        let id = parse_daemon_set_id(&ds.id)
            .map_err(|e| DaemonSetError::Invalid(vec![FieldError::new("id", e.to_string())]))?;
        check_invariants(&ds)?;
        let mut ops = vec![
            TxnOp::Cas {
                key: layout::daemon_set(id),
                value: ds.to_json(),
                index: 0,
            },
            audit_op(DaemonSetEvent::Created, &ds, &actor.name),
        ];
        let changes = diff(&serde_json::Value::Null, &ds_fields(&ds));
        let event = actor.event(ObjectKind::Daemonsets, &ds.id, Action::Created, changes);
        ops.extend(record_ops(self.kv.as_ref(), &event).await?);
        // Its document and its audit record each hold the manifest.
        let what =
            "a daemon set, with its audit record (which holds the manifest again) and its event";
        if let Some(cause) = manifest_too_large(self.kv.as_ref(), what, ds.manifest.raw(), 2, &ops)
        {
            return Err(DaemonSetError::Invalid(vec![cause]));
        }
        let results = self.kv.txn(&ops).await?;
        Ok(DaemonSetRecord {
            index: written_index(&results),
            value: ds,
        })
    }

    /// Read-modify-write of one daemon set, by the rule of [`update_from_mirror`] (its first
    /// attempt starts from the record `mirror` holds). `change`
    /// receives the latest record and returns the daemon set it should become (or an error,
    /// which ends the update). The write replaces the record only at the index it was read
    /// at, with one audit record per kind of change (manifest, node selector, enabled,
    /// disabled, anything else) naming `actor`, and the change's event and times (the times
    /// kept so far taken from `mirror` when it holds those of the version replaced, by the
    /// rule of [`record_update_ops`]), in the same transaction; nothing is written when
    /// `change` changes nothing (the store confirms the version then, as the write's
    /// check-and-set would). With `expected` it happens only at that index
    /// ([`DaemonSetError::Stale`] otherwise); without it a concurrent change makes `change`
    /// run again on the newer record, so concurrent updates of different fields all take
    /// effect.
    pub async fn update<E, F, Fut>(
        &self,
        id: Uuid,
        expected: Option<Expected>,
        actor: &Actor,
        mirror: &Mirror,
        mut change: F,
    ) -> Result<DaemonSetRecord, E>
    where
        E: UpdateError + From<DaemonSetError>,
        F: FnMut(DaemonSetRecord) -> Fut,
        Fut: Future<Output = Result<StoredDaemonSet, E>>,
    {
        let mirrored = || async move {
            let record = from_entry(&*mirror.get(&layout::daemon_set(id))?)?;
            Some(Versioned {
                value: StoredDaemonSet::clone(&record.value),
                index: record.index,
            })
        };
        update_from_mirror(
            &describe(id),
            expected,
            mirrored,
            || async { Ok(self.get(id).await?.ok_or(DaemonSetError::NotFound(id))?) },
            |current| {
                let next = change(current.clone());
                async move {
                    let next = next.await?;
                    if next.id != current.value.id {
                        return Err(DaemonSetError::Invalid(vec![FieldError::new(
                            "id",
                            "cannot be changed",
                        )])
                        .into());
                    }
                    check_invariants(&next)?;
                    let events = change_events(&current.value, &next);
                    if events.is_empty() {
                        let key = layout::daemon_set(id);
                        return Ok(current.confirmed(self.kv.as_ref(), &key).await);
                    }
                    let mut ops = vec![TxnOp::Cas {
                        key: layout::daemon_set(id),
                        value: next.to_json(),
                        index: current.index,
                    }];
                    let audits = events.len();
                    ops.extend(
                        events
                            .into_iter()
                            .map(|event| audit_op(event, &next, &actor.name)),
                    );
                    let changes = ds_changes(&current.value, &next);
                    let event =
                        actor.event(ObjectKind::Daemonsets, &next.id, Action::Updated, changes);
                    let kv = self.kv.as_ref();
                    ops.extend(record_update_ops(kv, &event, mirror, current.index).await?);
                    // Its document and each audit record hold the manifest.
                    let what = "a daemon set, with its audit records (each holding the \
                                manifest again) and its event";
                    if let Some(cause) =
                        manifest_too_large(kv, what, next.manifest.raw(), 1 + audits, &ops)
                    {
                        return Err(DaemonSetError::Invalid(vec![cause]).into());
                    }
                    Ok(self.kv.txn(&ops).await.map(|results| DaemonSetRecord {
                        index: written_index(&results),
                        value: next,
                    }))
                }
            },
        )
        .await
    }

    /// Deletes a daemon set (at `expected` only, when given, by the rule of
    /// [`update_with_retry`]), writing a `DAEMON_SET_DELETED` audit record of its last state
    /// naming `actor`, and the deletion's event, and removing its times and its DS farm
    /// status record, in the same transaction; returns that state. Its pods stay until the farm's
    /// dangling-pod cleanup removes them, as in P2.
    ///
    /// A stored document that cannot be decoded is deleted too, so a corrupt one can always
    /// be cleared; `None` then, and no audit record, as there is no daemon set to record.
    pub async fn delete(
        &self,
        id: Uuid,
        expected: Option<Expected>,
        actor: &Actor,
    ) -> Result<Option<StoredDaemonSet>, DaemonSetError> {
        let key = &layout::daemon_set(id);
        let read = || async {
            let pair = self
                .kv
                .get(key)
                .await?
                .ok_or(DaemonSetError::NotFound(id))?;
            Ok(Versioned {
                value: StoredDaemonSet::from_json(&pair.value),
                index: pair.modify_index,
            })
        };
        let write = |current: Versioned<Result<StoredDaemonSet, DecodeError>>| async move {
            if let Err(e) = &current.value {
                tracing::warn!(%id, error = %e, "deleting a daemon set whose document cannot be decoded");
            }
            // Consul's delete-cas succeeds on an absent key; the check makes a concurrent
            // delete roll this one back instead of auditing the deletion twice.
            let mut ops = vec![
                TxnOp::CheckIndex {
                    key: key.clone(),
                    index: current.index,
                },
                TxnOp::DeleteCas {
                    key: key.clone(),
                    index: current.index,
                },
            ];
            ops.push(meta_delete_op(ObjectKind::Daemonsets, &id.to_string()));
            // The DS farm's status record goes with it: P2 reads it only for a daemon set
            // that exists, and leaving it would keep it forever.
            ops.push(TxnOp::Delete {
                key: layout::ds_farm_status(id),
            });
            let before = match &current.value {
                Ok(ds) => {
                    ops.push(audit_op(DaemonSetEvent::Deleted, ds, &actor.name));
                    ds_fields(ds)
                }
                Err(_) => serde_json::Value::Null,
            };
            let kind = ObjectKind::Daemonsets;
            let id = id.to_string();
            ops.extend(deleted_ops(self.kv.as_ref(), kind, &id, &before, actor).await?);
            Ok(self.kv.txn(&ops).await.map(|_| current.value.ok()))
        };
        update_with_retry(&describe(id), expected, read, write).await
    }

    /// The first enabled daemon set that contends with `ds`, reading the daemon sets
    /// now stored and, only when a selector intersection must be evaluated, the node labels,
    /// with the nodes both select (none named when a selector selects every node or the two
    /// are the same). `None` when `ds` is disabled or nothing contends. This is the check the
    /// API makes before storing an enabled daemon set.
    pub async fn find_contender(
        &self,
        ds: &StoredDaemonSet,
        labels: &LabelStore,
    ) -> StoreResult<Option<(StoredDaemonSet, BTreeSet<String>)>> {
        if ds.disabled {
            return Ok(None);
        }
        let (_, others) = self.list().await?;
        let mut nodes: Option<Vec<Labeled>> = None;
        for other in others.into_iter().map(|record| record.value) {
            if !may_contend(ds, &other) {
                continue;
            }
            if selectors_overlap_everywhere(ds, &other) {
                return Ok(Some((other, BTreeSet::new())));
            }
            if nodes.is_none() {
                nodes = Some(labels.list(LabelType::Node).await?.1);
            }
            let nodes = nodes
                .iter()
                .flatten()
                .map(|node| (node.id.as_str(), &node.labels));
            let both: BTreeSet<String> = selected_by_both(ds, &other, nodes)
                .map(str::to_owned)
                .collect();
            if !both.is_empty() {
                return Ok(Some((other, both)));
            }
        }
        Ok(None)
    }

    /// The status record the DS farm last published for a daemon set; `None` when there is
    /// none or it cannot be decoded (logged).
    pub async fn farm_status(&self, id: Uuid) -> StoreResult<Option<DaemonSetFarmStatus>> {
        let Some(pair) = self.kv.get(&layout::ds_farm_status(id)).await? else {
            return Ok(None);
        };
        match serde_json::from_slice(&pair.value) {
            Ok(status) => Ok(Some(status)),
            Err(e) => {
                tracing::warn!(key = %pair.key, error = %e, "skipping undecodable daemon set status");
                Ok(None)
            }
        }
    }
}

/// Whether two daemon sets contend (P2's `DSContends`), given every node's labels: both
/// enabled, the same `pod_id`, different IDs, and either selector selects every node, the two
/// selectors are the same (compared in canonical form), or some node matches both now. A
/// selector that does not parse selects no node: P2's worker cannot run such a daemon set,
/// so it schedules nothing. The nodes are looked at only when the selectors alone do not
/// decide.
pub fn contends<'a, L: LabelValues + 'a>(
    ds: &StoredDaemonSet,
    other: &StoredDaemonSet,
    nodes: impl IntoIterator<Item = &'a L>,
) -> bool {
    if !may_contend(ds, other) {
        return false;
    }
    if selectors_overlap_everywhere(ds, other) {
        return true;
    }
    let nodes = nodes.into_iter().map(|labels| ((), labels));
    selected_by_both(ds, other, nodes).next().is_some()
}

/// Who made two daemon sets contend, and so what the DS farm does about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contention<'a> {
    /// They do not contend.
    None,
    /// The write of the one written last made it: a selector selecting every node, equal
    /// selectors, or a node matching both whose labels were already as they are when that
    /// write was made. That daemon set is disabled, as P2 disables the one that just
    /// appeared or changed.
    Written,
    /// Only nodes whose labels changed after both daemon sets were written match both
    /// (these, by name): a label write made it, which is no reason to disable either
    /// daemon set fleet-wide. Each node is left to the one running there, or to neither.
    Relabelled(Vec<&'a str>),
}

/// Who made two daemon sets contend ([`Contention`]), given each at the index it was last
/// written and every node with its labels and the index they were last written at (one index
/// space: the store's). A node label write in the same transaction as the later daemon set's
/// write counts as older, so a tie keeps P2's rule.
pub fn contention<'a, L: LabelValues + 'a>(
    (ds, ds_index): (&StoredDaemonSet, u64),
    (other, other_index): (&StoredDaemonSet, u64),
    nodes: impl IntoIterator<Item = (&'a str, &'a L, u64)>,
) -> Contention<'a> {
    if !may_contend(ds, other) {
        return Contention::None;
    }
    if selectors_overlap_everywhere(ds, other) {
        return Contention::Written;
    }
    let written = ds_index.max(other_index);
    let nodes = nodes
        .into_iter()
        .map(|(node, labels, index)| ((node, index), labels));
    let mut relabelled = Vec::new();
    for (node, index) in selected_by_both(ds, other, nodes) {
        if index <= written {
            return Contention::Written;
        }
        relabelled.push(node);
    }
    match relabelled.is_empty() {
        true => Contention::None,
        false => Contention::Relabelled(relabelled),
    }
}

/// The nodes (each given with its labels) that both daemon sets' selectors match; none when
/// either selector does not parse (it selects no node: P2's worker cannot run such a daemon
/// set, so it schedules nothing).
fn selected_by_both<'a, N, L: LabelValues + 'a, I: IntoIterator<Item = (N, &'a L)>>(
    ds: &StoredDaemonSet,
    other: &StoredDaemonSet,
    nodes: I,
) -> impl Iterator<Item = N> + use<'a, N, L, I> {
    let parsed = |ds: &StoredDaemonSet| ds.node_selector.parse::<Selector>().ok();
    let both = parsed(ds).zip(parsed(other));
    nodes.into_iter().filter_map(move |(node, labels)| {
        let (mine, theirs) = both.as_ref()?;
        (mine.matches(labels) && theirs.matches(labels)).then_some(node)
    })
}

/// The conditions under which two daemon sets could schedule the same pod on one node.
fn may_contend(ds: &StoredDaemonSet, other: &StoredDaemonSet) -> bool {
    !ds.disabled && !other.disabled && ds.pod_id == other.pod_id && ds.id != other.id
}

/// The rules that need no node labels: a selector selecting everything, or equal selectors.
fn selectors_overlap_everywhere(ds: &StoredDaemonSet, other: &StoredDaemonSet) -> bool {
    selects_every_node(&ds.node_selector)
        || selects_every_node(&other.node_selector)
        || canonical(&ds.node_selector) == canonical(&other.node_selector)
}

/// Whether a node selector selects every node (it has no requirement).
pub fn selects_every_node(selector: &str) -> bool {
    canonical(selector).is_empty()
}

/// The canonical text of a selector, or the text itself when it does not parse.
fn canonical(selector: &str) -> String {
    selector
        .parse::<Selector>()
        .map_or_else(|_| selector.to_owned(), |s| s.to_string())
}

/// The invariants P2 checks on every write, plus a parsable selector (which the farm needs).
fn check_invariants(ds: &StoredDaemonSet) -> Result<(), DaemonSetError> {
    let mut problems = ds.validate().err().unwrap_or_default();
    if let Err(e) = ds.node_selector.parse::<Selector>() {
        problems.push(FieldError::new("node_selector", e.to_string()));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(DaemonSetError::Invalid(problems))
    }
}

/// The audit events a change from `old` to `new` is recorded as, in a stable order; empty
/// when nothing changed.
fn change_events(old: &StoredDaemonSet, new: &StoredDaemonSet) -> Vec<DaemonSetEvent> {
    let mut events = Vec::new();
    if old.manifest != new.manifest {
        events.push(DaemonSetEvent::ManifestUpdated);
    }
    if old.node_selector != new.node_selector {
        events.push(DaemonSetEvent::NodeSelectorUpdated);
    }
    match (old.disabled, new.disabled) {
        (true, false) => events.push(DaemonSetEvent::Enabled),
        (false, true) => events.push(DaemonSetEvent::Disabled),
        _ => {}
    }
    if old.min_health != new.min_health
        || old.timeout != new.timeout
        || old.cluster_name != new.cluster_name
        || old.pod_id != new.pod_id
    {
        events.push(DaemonSetEvent::Modified);
    }
    events
}

/// A `set` of a new audit record, for the transaction of the change it describes.
fn audit_op(event: DaemonSetEvent, ds: &StoredDaemonSet, user: &str) -> TxnOp {
    let record = AuditRecord::daemon_set(event, ds, user, SystemTime::now());
    TxnOp::Set {
        key: layout::new_audit_log(),
        value: record.to_json(),
    }
}

/// The modify index a committed transaction gave the daemon set, its first op.
fn written_index(results: &[Option<KvPair>]) -> u64 {
    results
        .first()
        .and_then(Option::as_ref)
        .map_or(0, |pair| pair.modify_index)
}

/// How messages name the daemon set `id`.
pub fn describe(id: Uuid) -> String {
    format!("daemon set {id}")
}

fn decode_pair(pair: &KvPair) -> Option<DaemonSetRecord> {
    let segment = key_id(&pair.key)?;
    let ds = match StoredDaemonSet::from_json(&pair.value) {
        Ok(ds) => ds,
        Err(e) => {
            tracing::warn!(key = %pair.key, error = %e, "skipping undecodable daemon set");
            return None;
        }
    };
    named_by_key(&pair.key, segment, &ds).then_some(DaemonSetRecord {
        value: ds,
        index: pair.modify_index,
    })
}

/// The daemon set a mirrored entry holds, if a listing of the store would show it (the
/// same rules as [`DaemonSetStore::list`]); shared with the mirror, not copied.
pub fn from_entry(entry: &Entry) -> Option<Versioned<Arc<StoredDaemonSet>>> {
    let segment = key_id(&entry.pair.key)?;
    let View::DaemonSet(ds) = &entry.view else {
        tracing::warn!(key = %entry.pair.key, "skipping undecodable daemon set");
        return None;
    };
    named_by_key(&entry.pair.key, segment, ds).then(|| Versioned {
        value: ds.clone(),
        index: entry.pair.modify_index,
    })
}

/// The id segment of a daemon-set key, if it is an id (a key that is not is logged).
fn key_id(key: &str) -> Option<&str> {
    let segment = key.strip_prefix(layout::DAEMON_SETS)?;
    if let Err(e) = parse_daemon_set_id(segment) {
        tracing::warn!(key = %key, error = %e, "skipping a daemon set key that is not an ID");
        return None;
    }
    Some(segment)
}

/// Whether `ds` has the id its key names (one that does not is logged).
fn named_by_key(key: &str, segment: &str, ds: &StoredDaemonSet) -> bool {
    if ds.id != segment {
        tracing::warn!(key = %key, id = %ds.id, "skipping a daemon set whose id disagrees with its key");
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::labels::Labels;
    use crate::model::Manifest;

    fn ds(id: &str, pod: &str, selector: &str, disabled: bool) -> StoredDaemonSet {
        StoredDaemonSet {
            id: id.into(),
            disabled,
            manifest: Manifest::parse(&format!("id: {pod}\n")).unwrap(),
            min_health: 0,
            cluster_name: "production".into(),
            node_selector: selector.into(),
            pod_id: pod.into(),
            timeout: Duration::from_secs(600),
        }
    }

    fn node(name: &str, pairs: &[(&str, &str)]) -> Labeled {
        let labels: Labels = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Labeled {
            label_type: LabelType::Node,
            id: name.into(),
            labels,
        }
    }

    #[test]
    fn ids_must_be_canonical_uuids() {
        let id = "1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e";
        assert_eq!(parse_daemon_set_id(id).unwrap().to_string(), id);
        for bad in [
            "",
            "..",
            "1F6B2C9D-3E4A-4F5B-8C7D-9E0A1B2C3D4E",
            "1f6b2c9d3e4a4f5b8c7d9e0a1b2c3d4e",
            "{1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e}",
            "1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e/x",
        ] {
            assert!(parse_daemon_set_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn keys_follow_p2s_layout() {
        let id = parse_daemon_set_id("1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e").unwrap();
        assert_eq!(
            layout::daemon_set(id),
            "daemon_sets/1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e"
        );
        assert_eq!(
            layout::ds_farm_status(id),
            "status/daemon_sets/1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e/daemon_set_farm"
        );
    }

    #[test]
    fn contention_follows_p2s_rules() {
        let nodes = [
            node("n1", &[("role", "web"), ("az", "a")]),
            node("n2", &[("role", "db"), ("az", "b")]),
        ];
        let web = ds("a", "shipper", "role=web", false);
        let cases = [
            (ds("b", "shipper", "", false), true, "everything"),
            (
                ds("b", "shipper", "role = web", false),
                true,
                "same canonical",
            ),
            (ds("b", "shipper", "az=a", false), true, "nodes intersect"),
            (ds("b", "shipper", "az=b", false), false, "disjoint nodes"),
            (ds("b", "shipper", "az=c", false), false, "matches nothing"),
            (ds("b", "other", "", false), false, "other pod"),
            (ds("b", "shipper", "", true), false, "other disabled"),
            (ds("a", "shipper", "", false), false, "same id"),
            (ds("b", "shipper", "role in (", false), false, "unparsable"),
        ];
        for (other, expected, why) in cases {
            let labels = || nodes.iter().map(|node| &node.labels);
            assert_eq!(contends(&web, &other, labels()), expected, "{why}");
            assert_eq!(
                contends(&other, &web, labels()),
                expected,
                "{why}, reversed"
            );
        }
        let everywhere = ds("a", "shipper", "", false);
        assert!(contends(
            &everywhere,
            &ds("b", "shipper", "az=c", false),
            &[] as &[Labels]
        ));
        let disabled = ds("a", "shipper", "", true);
        assert!(!contends(
            &disabled,
            &ds("b", "shipper", "", false),
            &[] as &[Labels]
        ));
    }

    #[test]
    fn contention_a_node_relabelled_since_both_writes_made_is_told_apart() {
        let both = node("n1", &[("role", "web"), ("az", "a")]);
        let web = ds("a", "shipper", "role=web", false);
        let zoned = ds("b", "shipper", "az=a", false);
        let at = |index| [(both.id.as_str(), &both.labels, index)];
        // Labels as they are when the later daemon set was written (or written with it).
        assert_eq!(
            contention((&web, 10), (&zoned, 20), at(15)),
            Contention::Written
        );
        assert_eq!(
            contention((&web, 10), (&zoned, 20), at(20)),
            Contention::Written
        );
        // Labels written since both, either way round.
        let relabelled = Contention::Relabelled(vec!["n1"]);
        assert_eq!(contention((&web, 10), (&zoned, 20), at(30)), relabelled);
        assert_eq!(contention((&zoned, 20), (&web, 10), at(30)), relabelled);
        // A node older than the later write among relabelled ones: that write made it.
        let older = node("n0", &[("role", "web"), ("az", "a")]);
        let nodes = [
            (older.id.as_str(), &older.labels, 5),
            (both.id.as_str(), &both.labels, 30),
        ];
        assert_eq!(
            contention((&web, 10), (&zoned, 20), nodes),
            Contention::Written
        );
        // No node labels make a selector that selects every node contend, nor undo it.
        let everywhere = ds("c", "shipper", "", false);
        assert_eq!(
            contention((&everywhere, 10), (&zoned, 20), at(30)),
            Contention::Written
        );
        let elsewhere = ds("b", "shipper", "az=b", false);
        assert_eq!(
            contention((&web, 10), (&elsewhere, 20), at(30)),
            Contention::None
        );
        let disabled = ds("b", "shipper", "az=a", true);
        assert_eq!(
            contention((&web, 10), (&disabled, 20), at(30)),
            Contention::None
        );
    }

    #[test]
    fn changes_map_to_p2s_audit_events() {
        let old = ds("a", "shipper", "role=web", false);
        assert!(change_events(&old, &old).is_empty());
        let mut new = old.clone();
        new.manifest = Manifest::parse("id: shipper\nconfig: {}\n").unwrap();
        new.node_selector = "role=db".into();
        new.disabled = true;
        new.timeout = Duration::from_secs(1);
        assert_eq!(
            change_events(&old, &new),
            [
                DaemonSetEvent::ManifestUpdated,
                DaemonSetEvent::NodeSelectorUpdated,
                DaemonSetEvent::Disabled,
                DaemonSetEvent::Modified
            ]
        );
        assert_eq!(change_events(&new, &old)[2], DaemonSetEvent::Enabled);
        for change in [
            |d: &mut StoredDaemonSet| d.min_health = 3,
            |d: &mut StoredDaemonSet| d.cluster_name = "staging".into(),
        ] {
            let mut new = old.clone();
            change(&mut new);
            assert_eq!(change_events(&old, &new), [DaemonSetEvent::Modified]);
        }
    }

    #[test]
    fn invariants_cover_pod_id_and_selector() {
        let mut bad = ds("a", "shipper", "role in (", false);
        bad.pod_id = "other".into();
        let DaemonSetError::Invalid(problems) = check_invariants(&bad).unwrap_err() else {
            panic!("expected Invalid");
        };
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["pod_id", "node_selector"]);
    }

    #[test]
    fn farm_status_reads_p2s_json() {
        let status: DaemonSetFarmStatus = serde_json::from_str(
            r#"{"manifest_sha":"ab12","nodes_deployed":12,"replication_in_progress":true}"#,
        )
        .unwrap();
        assert_eq!(
            status,
            DaemonSetFarmStatus {
                manifest_sha: "ab12".into(),
                nodes_deployed: 12,
                replication_in_progress: true
            }
        );
    }
}
