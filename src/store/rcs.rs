//! The RC store: `replication_controllers/<uuid>` in P2's JSON, with the RC's own labels
//! (type `replication_controller`) written in the same transaction.
//!
//! Lists skip and log undecodable documents and non-UUID keys (P2 lets one of them break the
//! whole tree). An RC's id is its key's, whatever its document says (`StoredRc::from_stored`).

use std::sync::Arc;

use crate::labels::{LabelType, Labels};
use crate::model::event::{diff, rc_changes, rc_fields, Action, Actor, ObjectKind};
use crate::model::{FieldError, StoredRc};

use super::events::{deleted_ops, meta_delete_op, record_ops, record_update_ops};
use super::labels::{write_op, LabelStore};
use super::{manifest_too_large, Versioned};
use crate::kv::{KvPair, KvStore, StoreError, StoreResult, TxnOp};
use crate::layout;
use crate::state::{Entry, Mirror, View};

/// An RC and the modify index it was read at (its CAS token and ETag).
pub type RcRecord = Versioned<StoredRc>;

/// Typed access to RCs.
#[derive(Clone)]
pub struct RcStore {
    kv: Arc<dyn KvStore>,
    labels: LabelStore,
}

impl RcStore {
    /// Wraps the KV store.
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        RcStore {
            labels: LabelStore::new(kv.clone()),
            kv,
        }
    }

    /// One RC; `None` when absent. An undecodable document is an `Invalid` error naming it.
    pub async fn get(&self, id: &str) -> StoreResult<Option<RcRecord>> {
        match self.kv.get(&layout::rc(id)).await? {
            None => Ok(None),
            Some(pair) => decode(&pair)
                .map(Some)
                .map_err(|e| StoreError::Invalid(unreadable(id, &e))),
        }
    }

    /// Every readable RC, sorted by id, with the tree's index.
    pub async fn list(&self) -> StoreResult<(u64, Vec<RcRecord>)> {
        let listing = self.kv.list(layout::RCS).await?;
        let records = listing.decode_readable("RC", decode);
        Ok((listing.index, records))
    }

    /// The ops that create `rc` (only if absent) and set its labels, given the labels'
    /// current index (0 for none).
    pub fn create_ops(rc: &StoredRc, labels: &Labels, labels_index: u64) -> Vec<TxnOp> {
        let mut ops = vec![TxnOp::Cas {
            key: layout::rc(&rc.id),
            value: rc.to_json(),
            index: 0,
        }];
        ops.extend(write_op(
            LabelType::ReplicationController,
            &rc.id,
            labels,
            labels_index,
        ));
        ops
    }

    /// Creates `rc` and its labels in one transaction, with its event and times; or, when
    /// that transaction would be too large for the store, the cause naming the manifest
    /// ([`manifest_too_large`]), nothing written.
    pub async fn create(
        &self,
        rc: StoredRc,
        labels: &Labels,
        actor: &Actor,
    ) -> StoreResult<Result<RcRecord, FieldError>> {
        let current = self
            .labels
            .get(LabelType::ReplicationController, &rc.id)
            .await?;
        let mut ops = Self::create_ops(&rc, labels, current.index);
        ops.extend(self.created_ops(&rc, actor).await?);
        if let Some(cause) = manifest_too_large(
            self.kv.as_ref(),
            "an RC, with its labels and its event",
            rc.manifest.raw(),
            1,
            &ops,
        ) {
            return Ok(Err(cause));
        }
        let results = self.kv.txn(&ops).await?;
        let index = written_index(&results);
        Ok(Ok(RcRecord { value: rc, index }))
    }

    /// The ops recording that `actor` created `rc`: its event and times.
    pub async fn created_ops(&self, rc: &StoredRc, actor: &Actor) -> StoreResult<Vec<TxnOp>> {
        let changes = diff(&serde_json::Value::Null, &rc_fields(rc));
        let event = actor.event(ObjectKind::Rcs, &rc.id, Action::Created, changes);
        record_ops(self.kv.as_ref(), &event).await
    }

    /// The ops recording that `actor` changed `before` (the version at index `replaced`)
    /// into `after`: its event and times, the times kept so far taken from `mirror` when it
    /// holds those of `before` ([`record_update_ops`]).
    pub async fn updated_ops(
        &self,
        before: &StoredRc,
        replaced: u64,
        after: &StoredRc,
        actor: &Actor,
        mirror: &Mirror,
    ) -> StoreResult<Vec<TxnOp>> {
        let changes = rc_changes(before, after);
        let event = actor.event(ObjectKind::Rcs, &after.id, Action::Updated, changes);
        record_update_ops(self.kv.as_ref(), &event, mirror, replaced).await
    }

    /// The ops recording that `actor` deleted RC `id`, last seen as `before` (`None` when
    /// it could not be read).
    pub async fn deleted_ops(
        &self,
        id: &str,
        before: Option<&StoredRc>,
        actor: &Actor,
    ) -> StoreResult<Vec<TxnOp>> {
        let before = before.map_or(serde_json::Value::Null, rc_fields);
        deleted_ops(self.kv.as_ref(), ObjectKind::Rcs, id, &before, actor).await
    }

    /// The op that writes `rc` if it is still at `index`.
    pub fn write_op(rc: &StoredRc, index: u64) -> TxnOp {
        TxnOp::Cas {
            key: layout::rc(&rc.id),
            value: rc.to_json(),
            index,
        }
    }

    /// Writes `rc` if it is still at `index`, together with `with` (checks that must hold
    /// too, and the change's records); a miss of any is a `Conflict`. When that transaction
    /// would be too large for the store, the cause naming the manifest
    /// ([`manifest_too_large`]), nothing written.
    pub async fn write(
        &self,
        rc: StoredRc,
        index: u64,
        with: Vec<TxnOp>,
    ) -> StoreResult<Result<RcRecord, FieldError>> {
        let mut ops = with;
        ops.push(Self::write_op(&rc, index));
        let what = "an RC, with its event";
        if let Some(cause) = manifest_too_large(self.kv.as_ref(), what, rc.manifest.raw(), 1, &ops)
        {
            return Ok(Err(cause));
        }
        let results = self.kv.txn(&ops).await?;
        Ok(Ok(RcRecord {
            index: results
                .last()
                .cloned()
                .flatten()
                .map_or(0, |p| p.modify_index),
            value: rc,
        }))
    }

    /// The ops that delete the RC at `index`, all its labels and its times.
    pub fn delete_ops(id: &str, index: u64) -> Vec<TxnOp> {
        vec![
            TxnOp::CheckIndex {
                key: layout::rc(id),
                index,
            },
            TxnOp::DeleteCas {
                key: layout::rc(id),
                index,
            },
            TxnOp::Delete {
                key: layout::labels(LabelType::ReplicationController, id),
            },
            meta_delete_op(ObjectKind::Rcs, id),
        ]
    }

    /// The RC's own labels.
    pub fn labels(&self) -> &LabelStore {
        &self.labels
    }

    /// A txn op that holds only while nobody holds the RC's mutation lock, or the session
    /// that holds it when it is held. A lock key left without a session is free.
    pub async fn mutation_guard(&self, id: &str) -> StoreResult<Result<TxnOp, String>> {
        let key = layout::rc_mutation(id);
        Ok(match self.kv.get(&key).await? {
            None => Ok(TxnOp::CheckNotExists { key }),
            Some(pair) => match pair.session() {
                Some(session) => Err(session.to_owned()),
                None => Ok(TxnOp::CheckIndex {
                    key,
                    index: pair.modify_index,
                }),
            },
        })
    }
}

/// Why the stored RC `id` cannot be read.
pub fn unreadable(id: &str, why: &dyn std::fmt::Display) -> String {
    format!("stored RC {id} is unreadable: {why}")
}

/// The RC a mirrored entry holds, by the rules of a read from the store: a key that is not
/// an RC id or a document that does not decode is an error naming the problem.
pub fn from_entry(entry: &Entry) -> Result<Versioned<Arc<StoredRc>>, String> {
    check_key(&entry.pair)?;
    match &entry.view {
        View::Rc(rc) => Ok(Versioned {
            value: rc.clone(),
            index: entry.pair.modify_index,
        }),
        View::Unreadable(why) => Err(why.to_string()),
        _ => Err(format!("key {:?} is not an RC", entry.pair.key)),
    }
}

fn check_key(pair: &KvPair) -> Result<(), String> {
    if uuid::Uuid::parse_str(layout::rc_id(&pair.key)).is_err() {
        return Err(format!("key {:?} is not an RC id", pair.key));
    }
    Ok(())
}

fn decode(pair: &KvPair) -> Result<RcRecord, String> {
    check_key(pair)?;
    let rc =
        StoredRc::from_stored(layout::rc_id(&pair.key), &pair.value).map_err(|e| e.to_string())?;
    Ok(RcRecord {
        value: rc,
        index: pair.modify_index,
    })
}

/// The modify index of the first entry a txn answered (the first op's write).
fn written_index(results: &[Option<KvPair>]) -> u64 {
    results
        .iter()
        .flatten()
        .next()
        .map_or(0, |pair| pair.modify_index)
}
