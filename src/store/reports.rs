//! Node agents' reports: the manifest a node runs (`reality/<node>/<pod_id>`) and a pod's
//! health on a node (`health/<pod_id>/<node>`), written with check-and-set so that a change
//! in what a report says is recorded as an event in the same transaction.
//!
//! Agents repeat their reports, so only a change is an event: a reality report whose
//! manifest has another SHA, a health report whose status differs. A re-report of the same
//! thing is written (its bytes or time may differ) without one, so events stay a record of
//! changes rather than of heartbeats.

use serde_json::Value;

use super::events::record_ops;
use super::pods::{PodLocation, PodTree};
use super::update::{update_from_mirror, Expected};
use super::{manifest_too_large, Versioned};
use crate::kv::{KvStore, StoreResult, TxnOp};
use crate::layout;
use crate::model::event::{Action, Actor, EventKind, FieldChange};
use crate::model::{FieldError, HealthRecord, Manifest};
use crate::state::Mirror;

/// One report's key, and how its events name and summarize it.
pub struct Report {
    kind: EventKind,
    id: String,
    key: String,
    /// The field an event shows before and after.
    field: &'static str,
    /// What of a stored value an event shows; a change of it is an event.
    summarize: fn(&[u8]) -> Value,
    /// Whether the value is a manifest, so that one too large for the write's transaction
    /// is refused naming it ([`manifest_too_large`]).
    holds_manifest: bool,
}

impl Report {
    /// The manifest `pod`'s node reports running, shown by its P2 SHA.
    pub fn reality(pod: &PodLocation) -> Report {
        Report {
            kind: EventKind::Reality,
            id: pod.label_id(),
            key: PodTree::Reality.key(pod),
            field: "manifest",
            holds_manifest: true,
            summarize: |bytes| {
                let text = String::from_utf8_lossy(bytes);
                Manifest::parse(&text).map_or_else(
                    |_| "unreadable".into(),
                    |m| format!("sha256:{}", m.sha()).into(),
                )
            },
        }
    }

    /// `pod`'s health on its node, shown by its status.
    pub fn health(pod: &PodLocation) -> Report {
        Report {
            kind: EventKind::Health,
            id: format!("{}/{}", pod.pod_id(), pod.node()),
            key: layout::health(pod.pod_id(), pod.node()),
            field: "status",
            holds_manifest: false,
            summarize: |bytes| {
                HealthRecord::from_json(bytes)
                    .map_or_else(|_| "unreadable".into(), |r| r.status.as_str().into())
            },
        }
    }

    /// Stores `value` as the report, or removes it for `None` (nothing to do when there is
    /// none), by the rule of [`update_from_mirror`]: with `expected` only at that index (0:
    /// only while there is none). Returns the report's new modify index, 0 once removed; or,
    /// for a manifest too large for the write's one transaction, the cause naming it
    /// ([`manifest_too_large`]), nothing written.
    ///
    /// The first attempt starts from the report as `mirror` holds it, later ones from the
    /// store: agents report often, and a read of the store for each report cost as much as
    /// its write.
    pub async fn write(
        &self,
        kv: &dyn KvStore,
        mirror: &Mirror,
        value: Option<Vec<u8>>,
        expected: Option<Expected>,
        actor: &Actor,
    ) -> StoreResult<Result<u64, FieldError>> {
        let value = &value;
        update_from_mirror(
            &format!("the {} report {:?}", self.kind.as_str(), self.id),
            expected,
            || async { self.mirrored(mirror, value.is_none()) },
            || async {
                let pair = kv.get(&self.key).await?;
                Ok(pair.map_or_else(Versioned::default, |pair| Versioned {
                    index: pair.modify_index,
                    value: Some(pair.value.to_vec()),
                }))
            },
            |current: Versioned<Option<Vec<u8>>>| async move {
                let key = self.key.clone();
                let mut ops = match value {
                    Some(value) => vec![TxnOp::Cas {
                        key,
                        value: value.clone(),
                        index: current.index,
                    }],
                    None if current.index == 0 => return Ok(Ok(Ok(0))),
                    // A delete-cas succeeds on an absent key (as Consul's does): the check
                    // makes a removal another writer made first a lost race, whose next
                    // attempt finds nothing to remove, rather than a second event.
                    None => vec![
                        TxnOp::CheckIndex {
                            key: key.clone(),
                            index: current.index,
                        },
                        TxnOp::DeleteCas {
                            key,
                            index: current.index,
                        },
                    ],
                };
                let shown =
                    |value: &Option<Vec<u8>>| value.as_deref().map_or(Value::Null, self.summarize);
                let (before, after) = (shown(&current.value), shown(value));
                if before != after {
                    let action = Action::of_change(!before.is_null(), !after.is_null());
                    let change = FieldChange {
                        field: self.field.to_owned(),
                        before,
                        after,
                    };
                    let event = actor.event(self.kind, &self.id, action, vec![change]);
                    ops.extend(record_ops(kv, &event).await?);
                }
                if let Some(manifest) = value.as_deref().filter(|_| self.holds_manifest) {
                    let manifest = String::from_utf8_lossy(manifest);
                    let what = "a node's report, with its event";
                    if let Some(cause) = manifest_too_large(kv, what, &manifest, 1, &ops) {
                        return Ok(Ok(Err(cause)));
                    }
                }
                Ok(kv.txn(&ops).await.map(|results| {
                    Ok(match value {
                        // A removal writes nothing (its first result is the check's).
                        None => 0,
                        Some(_) => results
                            .into_iter()
                            .next()
                            .flatten()
                            .map_or(0, |pair| pair.modify_index),
                    })
                }))
            },
        )
        .await
    }

    /// The report as `mirror` holds it, for the first attempt of [`update_from_mirror`]. The
    /// mirror's word that there is none serves a write (whose check-and-set then requires
    /// that there still be none) once it has loaded, but not a removal, which would end as
    /// "nothing to remove": the store is read then.
    fn mirrored(&self, mirror: &Mirror, removing: bool) -> Option<Versioned<Option<Vec<u8>>>> {
        match mirror.get(&self.key) {
            Some(entry) => Some(Versioned {
                index: entry.pair.modify_index,
                value: Some(entry.value().into_owned()),
            }),
            None if removing || !mirror.is_loaded() => None,
            None => Some(Versioned::default()),
        }
    }
}
