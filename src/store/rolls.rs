//! The roll store: `rolls/<new-rc-id>` in P2's PascalCase JSON, labeled as type `rolls`.

use std::sync::Arc;

use std::collections::BTreeMap;

use crate::labels::LabelType;
use crate::model::event::{
    diff, roll_fields, Action, Actor, FinishedRoll, ObjectKind, RollOutcome, RollProgress,
};
use crate::model::{json_may_hold, StoredRc, StoredRoll};

use super::events::{meta_delete_op, read_meta, record_ops};
use super::labels::{LabelRecord, LabelStore};
use super::Versioned;
use crate::kv::{validate_key, KvPair, KvStore, StoreError, StoreResult, TxnOp};
use crate::layout;

/// A roll and the modify index it was read at.
pub type RollRecord = Versioned<StoredRoll>;

/// What a roll's deletion reads ([`RollStore::get_for_delete`]): its document, `None` when
/// it cannot be decoded, and its labels as stored.
pub struct RollToDelete {
    pub roll: Option<StoredRoll>,
    pub labels: LabelRecord,
}

/// A roll that names an RC, as [`RollStore::naming`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Naming {
    /// The roll with this id names the RC.
    Roll(String),
    /// The roll `id` cannot be decoded (`why` says so) and its bytes may name the RC as its
    /// old one.
    Unreadable { id: String, why: String },
}

/// Typed access to rolls.
#[derive(Clone)]
pub struct RollStore {
    kv: Arc<dyn KvStore>,
}

impl RollStore {
    /// Wraps the KV store.
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        RollStore { kv }
    }

    /// One roll; `None` when absent (unlike P2, which cannot tell absent from empty).
    pub async fn get(&self, id: &str) -> StoreResult<Option<RollRecord>> {
        match self.kv.get(&layout::roll(id)).await? {
            None => Ok(None),
            Some(pair) => decode(&pair)
                .map(Some)
                .map_err(|e| StoreError::Invalid(format!("stored roll {id} is unreadable: {e}"))),
        }
    }

    /// Every readable roll, sorted by id, with the tree's index.
    pub async fn list(&self) -> StoreResult<(u64, Vec<RollRecord>)> {
        let listing = self.kv.list(layout::ROLLS).await?;
        let records = listing.decode_readable("roll", decode);
        Ok((listing.index, records))
    }

    /// The roll, if any, that moves replicas from or to the RC `rc_id`. A roll document
    /// stored for `rc_id` as its new RC counts even when it cannot be decoded.
    pub async fn naming(&self, rc_id: &str) -> StoreResult<Option<Naming>> {
        if self.kv.get(&layout::roll(rc_id)).await?.is_some() {
            return Ok(Some(Naming::Roll(rc_id.to_owned())));
        }
        self.naming_as_old(rc_id).await
    }

    /// The roll, if any, that moves replicas from the RC `rc_id`: a readable one that does,
    /// else one that cannot be decoded whose bytes may name it (they hold its id, escape a
    /// character or are not UTF-8), for only its bytes can tell what it names.
    pub async fn naming_as_old(&self, rc_id: &str) -> StoreResult<Option<Naming>> {
        let listing = self.kv.list(layout::ROLLS).await?;
        let mut unreadable = None;
        for pair in &listing.pairs {
            match decode(pair) {
                Ok(record) if record.value.old_rc == rc_id => {
                    return Ok(Some(Naming::Roll(record.value.new_rc)));
                }
                Ok(_) => {}
                Err(why) if unreadable.is_none() && json_may_hold(&pair.value, rc_id) => {
                    let id = roll_id(pair).to_owned();
                    unreadable = Some(Naming::Unreadable { id, why });
                }
                Err(_) => {}
            }
        }
        Ok(unreadable)
    }

    /// The id of a stored roll whose document cannot be decoded, if any, and why: such a
    /// roll may name any RC as its old one.
    pub async fn unreadable(&self) -> StoreResult<Option<(String, String)>> {
        let listing = self.kv.list(layout::ROLLS).await?;
        Ok(listing.pairs.iter().find_map(|pair| {
            let why = decode(pair).err()?;
            Some((roll_id(pair).to_owned(), why))
        }))
    }

    /// A txn op that holds only while no roll has `rc_id` as its new RC, the one roll key a
    /// write to that RC can check atomically.
    pub fn absent_op(rc_id: &str) -> TxnOp {
        TxnOp::CheckNotExists {
            key: layout::roll(rc_id),
        }
    }

    /// The op that creates the roll, only if no roll for its new RC exists.
    pub fn create_op(roll: &StoredRoll) -> TxnOp {
        TxnOp::Cas {
            key: layout::roll(&roll.new_rc),
            value: roll.to_json(),
            index: 0,
        }
    }

    /// A roll as its deletion reads it: its document, `None` (logged) when it cannot be
    /// decoded, so that a corrupt document can always be cleared, and the index it was read
    /// at; `None` when there is no roll. The deletion's record and its check-and-set
    /// ([`RollStore::delete_at_ops`]) both come from this one read, which reads the roll's
    /// labels (a key of their own) too, so the record carries the labels the delete removes.
    pub async fn get_for_delete(&self, id: &str) -> StoreResult<Option<Versioned<RollToDelete>>> {
        let Some(pair) = self.kv.get(&layout::roll(id)).await? else {
            return Ok(None);
        };
        let roll = match decode(&pair) {
            Ok(record) => Some(record.value),
            Err(e) => {
                tracing::warn!(roll = %id, error = %e, "deleting a roll whose document cannot be decoded");
                None
            }
        };
        let labels = LabelStore::new(self.kv.clone())
            .get(LabelType::Rolls, id)
            .await?;
        Ok(Some(Versioned {
            value: RollToDelete { roll, labels },
            index: pair.modify_index,
        }))
    }

    /// The ops that delete the roll at `index` with its labels (still at the index `read`
    /// read them at) and times, leaving both RCs (a running roll is cancelled by the farm
    /// that sees it vanish); a `Conflict` when the roll is no longer at `index`, as when it
    /// was deleted and created again, or its labels changed since.
    pub fn delete_at_ops(id: &str, read: &Versioned<RollToDelete>) -> Vec<TxnOp> {
        let mut ops = vec![
            TxnOp::CheckIndex {
                key: layout::roll(id),
                index: read.index,
            },
            LabelStore::unchanged_op(LabelType::Rolls, id, read.value.labels.index),
        ];
        ops.extend(Self::delete_ops(id));
        ops
    }

    /// The ops that delete a roll, its labels and its times.
    pub fn delete_ops(id: &str) -> Vec<TxnOp> {
        vec![
            TxnOp::Delete {
                key: layout::roll(id),
            },
            TxnOp::Delete {
                key: layout::labels(LabelType::Rolls, id),
            },
            meta_delete_op(ObjectKind::Rolls, id),
        ]
    }

    /// The `replicas_desired` of `roll`'s old and new RC as the store holds them now
    /// (`None` for one absent or unreadable), and the ops that hold only while each RC is
    /// still that version: what a record of the counts a roll leaves its RCs at is made of
    /// and checked by, since a farm's step moves them without writing the roll. An id no
    /// key can hold (none, as a tool may store it) names an RC that is absent for good.
    pub async fn desired_now(
        &self,
        roll: &StoredRoll,
    ) -> StoreResult<([Option<i64>; 2], Vec<TxnOp>)> {
        let mut desired = [None, None];
        let mut unchanged = Vec::with_capacity(2);
        for (side, rc) in [&roll.old_rc, &roll.new_rc].into_iter().enumerate() {
            let key = layout::rc(rc);
            if validate_key(&key).is_err() {
                continue;
            }
            match self.kv.get(&key).await? {
                Some(pair) => {
                    desired[side] = StoredRc::from_json(&pair.value)
                        .ok()
                        .map(|rc| rc.replicas_desired);
                    unchanged.push(TxnOp::CheckIndex {
                        key,
                        index: pair.modify_index,
                    });
                }
                None => unchanged.push(TxnOp::CheckNotExists { key }),
            }
        }
        Ok((desired, unchanged))
    }

    /// The ops recording that `roll` ended with `outcome` (by `actor`, for the reason in
    /// `message` if any): its finished record, kept for the retention period, with its
    /// labels, start time (when it was recorded) and `progress`, and the event.
    pub async fn finished_ops(
        &self,
        roll: &StoredRoll,
        labels: &BTreeMap<String, String>,
        outcome: RollOutcome,
        progress: RollProgress,
        actor: &Actor,
        message: Option<String>,
    ) -> StoreResult<Vec<TxnOp>> {
        let id = &roll.new_rc;
        let started = read_meta(self.kv.as_ref(), &layout::meta(ObjectKind::Rolls, id))
            .await?
            .and_then(|meta| meta.created);
        let action = match outcome {
            RollOutcome::Succeeded => Action::Succeeded,
            RollOutcome::Cancelled => Action::Cancelled,
            RollOutcome::Failed => Action::Failed,
        };
        let changes = diff(&roll_fields(roll), &serde_json::Value::Null);
        let mut event = actor.event(ObjectKind::Rolls, id, action, changes);
        event.message = message;
        let finished = FinishedRoll {
            roll: roll.into(),
            labels: labels.clone(),
            outcome,
            started,
            ended: event.time.clone(),
            progress,
        };
        let mut ops = vec![TxnOp::Set {
            key: layout::roll_history(id),
            value: finished.to_json(),
        }];
        ops.extend(record_ops(self.kv.as_ref(), &event).await?);
        Ok(ops)
    }

    /// The finished roll `id`, if one is kept.
    pub async fn finished(&self, id: &str) -> StoreResult<Option<Versioned<FinishedRoll>>> {
        Ok(self
            .kv
            .get(&layout::roll_history(id))
            .await?
            .and_then(|pair| decode_finished(&pair)))
    }
}

/// The id of the roll stored at `pair`: its key below the roll tree.
fn roll_id(pair: &KvPair) -> &str {
    pair.key.strip_prefix(layout::ROLLS).unwrap_or(&pair.key)
}

fn decode(pair: &KvPair) -> Result<RollRecord, String> {
    let roll = StoredRoll::from_json(&pair.value).map_err(|e| e.to_string())?;
    Ok(RollRecord {
        value: roll,
        index: pair.modify_index,
    })
}

/// A finished roll as stored; `None` (logged) when it cannot be read.
pub fn decode_finished(pair: &KvPair) -> Option<Versioned<FinishedRoll>> {
    match FinishedRoll::from_json(&pair.value) {
        Ok(finished) => Some(Versioned {
            value: finished,
            index: pair.modify_index,
        }),
        Err(e) => {
            tracing::warn!(key = %pair.key, error = %e, "skipping an unreadable finished roll");
            None
        }
    }
}
