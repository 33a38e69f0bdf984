//! Publishing the status conditions a farm computes each pass: stamped, and written (fenced
//! by the object's ownership lock) only when they differ from what is stored; removed
//! (fenced by leadership) once their object is gone.

use std::time::SystemTime;

use crate::kv::{TxnOp, MAX_TXN_OPS};
use crate::layout::{self, LEADER_LOCK};
use crate::model::conditions::{stamp, ConditionsRecord, Observed, Progress};
use crate::model::event::ObjectKind;
use crate::state::Mirror;
use crate::store::conditions::ConditionStore;

use super::world::World;
use super::{FarmContext, FarmResult};

/// One farm's conditions records, as the mirror holds them (the farm's own writes reach it
/// at once): each decoded when looked at, rather than all kept decoded beside the mirror.
pub struct Published {
    kind: ObjectKind,
    mirror: Mirror,
}

impl Published {
    /// The records of objects of `kind` in `mirror`.
    pub fn new(kind: ObjectKind, mirror: Mirror) -> Published {
        Published { kind, mirror }
    }

    /// The record stored for object `id`, if any (one that does not decode is rewritten
    /// like a missing one).
    pub fn previous(&self, id: &str) -> Option<ConditionsRecord> {
        let entry = self.mirror.get(&layout::conditions(self.kind, id))?;
        serde_json::from_slice(&entry.pair.value).ok()
    }

    /// Writes object `id`'s conditions, computed from its document at `index`, fenced by
    /// `lock`, unless they are what is stored.
    pub async fn publish(
        &self,
        ctx: &FarmContext,
        lock: &str,
        id: &str,
        observed: Vec<Observed>,
        index: u64,
        progress: Option<Progress>,
    ) -> FarmResult<()> {
        let Some(record) = self.changed(id, observed, index, progress) else {
            return Ok(());
        };
        ctx.commit(lock, vec![self.put_op(id, &record)]).await?;
        Ok(())
    }

    /// Object `id`'s conditions record, computed from its document at `index`, when it
    /// differs from the stored one; `None` when it does not.
    pub fn changed(
        &self,
        id: &str,
        observed: Vec<Observed>,
        index: u64,
        progress: Option<Progress>,
    ) -> Option<ConditionsRecord> {
        changed_from(self.previous(id), observed, index, progress)
    }

    /// The op storing `record` for object `id`, to commit with the object's own changes.
    pub fn put_op(&self, id: &str, record: &ConditionsRecord) -> TxnOp {
        ConditionStore::put_op(self.kind, id, record)
    }

    /// Removes the records of objects that no longer exist, whoever deleted them, and of
    /// objects another session owns (P2's farm, which writes none: a record left would be
    /// shown as current however the object fares under it): as many to a transaction as
    /// its fence leaves room for, since thousands deleted together would otherwise hold up
    /// the farm's pass for a commit each. A failure is logged and returned, for the farm to
    /// try again ([`super::TIDYING`]).
    pub async fn remove_stale(
        &self,
        ctx: &FarmContext,
        world: &World,
        exists: impl Fn(&str) -> bool,
    ) -> FarmResult<()> {
        let prefix = layout::conditions_of_kind(self.kind);
        let owned_elsewhere = |id: &str| {
            let lock = layout::ownership(self.kind, id);
            world
                .lock_holder(&lock)
                .is_some_and(|holder| holder != ctx.session)
        };
        let gone: Vec<TxnOp> = self
            .mirror
            .under(&prefix)
            .iter()
            .filter_map(|entry| entry.pair.key.strip_prefix(&prefix))
            .filter(|id| !exists(id) || owned_elsewhere(id))
            .map(|id| ConditionStore::delete_op(self.kind, id))
            .collect();
        let mut removed = Ok(());
        for ops in gone.chunks(MAX_TXN_OPS - 1) {
            if let Err(e) = ctx.commit(LEADER_LOCK, ops.to_vec()).await {
                tracing::warn!(kind = self.kind.as_str(), records = ops.len(), error = %e, "removing the conditions of gone objects failed");
                removed = Err(e);
            }
        }
        removed
    }
}

/// The conditions record computed from an object's document at `index`, when it differs from
/// `previous`, the one stored ([`Published::previous`]); `None` when it does not.
pub fn changed_from(
    previous: Option<ConditionsRecord>,
    observed: Vec<Observed>,
    index: u64,
    progress: Option<Progress>,
) -> Option<ConditionsRecord> {
    let conditions = stamp(
        previous.as_ref().map_or(&[][..], |p| &p.conditions),
        observed,
        index,
        SystemTime::now(),
    );
    let record = ConditionsRecord {
        conditions,
        progress,
    };
    (previous.as_ref() != Some(&record)).then_some(record)
}
