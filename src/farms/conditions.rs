//! Publishing the status conditions a farm computes each pass: stamped, and written (fenced
//! by the object's ownership lock) only when they differ from what is stored; removed
//! (fenced by leadership) once their object is gone.

use std::collections::HashMap;
use std::time::SystemTime;

use crate::kv::TxnOp;
use crate::model::conditions::{stamp, ConditionsRecord, Observed, Progress};
use crate::model::event::ObjectKind;
use crate::store::conditions::ConditionStore;
use crate::store::layout::LEADER_LOCK;

use super::{FarmContext, FarmResult};

/// One farm's conditions records, as stored; read once per term.
pub struct Published {
    kind: ObjectKind,
    /// By object id (`None`: stored but unreadable); `None` until read.
    records: Option<HashMap<String, Option<ConditionsRecord>>>,
}

impl Published {
    /// The records of objects of `kind`.
    pub fn new(kind: ObjectKind) -> Published {
        Published {
            kind,
            records: None,
        }
    }

    /// Reads the stored records if not read yet this term; `false` if they cannot be read
    /// now (nothing is published until they are).
    pub async fn load(&mut self, ctx: &FarmContext) -> bool {
        if self.records.is_none() {
            match ConditionStore::new(ctx.store.clone()).list(self.kind).await {
                Ok(records) => self.records = Some(records),
                Err(e) => {
                    tracing::warn!(kind = self.kind.as_str(), error = %e, "reading the stored conditions failed");
                }
            }
        }
        self.records.is_some()
    }

    /// The record stored for object `id`, if any.
    pub fn previous(&self, id: &str) -> Option<&ConditionsRecord> {
        self.records.as_ref()?.get(id)?.as_ref()
    }

    /// Writes object `id`'s conditions, computed from its document at `index`, fenced by
    /// `lock`, unless they are what is stored.
    pub async fn publish(
        &mut self,
        ctx: &FarmContext,
        lock: &str,
        id: &str,
        observed: Vec<Observed>,
        index: u64,
        progress: Option<Progress>,
    ) -> FarmResult<()> {
        if !self.load(ctx).await {
            return Ok(());
        }
        let Some(record) = self.changed(id, observed, index, progress) else {
            return Ok(());
        };
        ctx.commit(lock, vec![self.put_op(id, &record)]).await?;
        self.remember(id, record);
        Ok(())
    }

    /// Object `id`'s conditions record, computed from its document at `index`, when it
    /// differs from the stored one; `None` when it does not, or when the stored records
    /// are not loaded (see [`Published::load`]).
    pub fn changed(
        &self,
        id: &str,
        observed: Vec<Observed>,
        index: u64,
        progress: Option<Progress>,
    ) -> Option<ConditionsRecord> {
        self.records.as_ref()?;
        let previous = self.previous(id);
        let conditions = stamp(
            previous.map_or(&[][..], |p| &p.conditions),
            observed,
            index,
            SystemTime::now(),
        );
        let record = ConditionsRecord {
            conditions,
            progress,
        };
        (previous != Some(&record)).then_some(record)
    }

    /// The op storing `record` for object `id`, to commit with the object's own changes;
    /// [`Published::remember`] it once committed.
    pub fn put_op(&self, id: &str, record: &ConditionsRecord) -> TxnOp {
        ConditionStore::put_op(self.kind, id, record)
    }

    /// Notes that `record` is what is stored for object `id`.
    pub fn remember(&mut self, id: &str, record: ConditionsRecord) {
        if let Some(records) = &mut self.records {
            records.insert(id.to_owned(), Some(record));
        }
    }

    /// Removes the records of objects that no longer exist, whoever deleted them.
    pub async fn remove_gone(&mut self, ctx: &FarmContext, exists: impl Fn(&str) -> bool) {
        let Some(records) = &mut self.records else {
            return;
        };
        let gone: Vec<String> = records.keys().filter(|id| !exists(id)).cloned().collect();
        for id in gone {
            let op = ConditionStore::delete_op(self.kind, &id);
            match ctx.commit(LEADER_LOCK, vec![op]).await {
                Ok(_) => {
                    records.remove(&id);
                }
                Err(e) => {
                    tracing::warn!(kind = self.kind.as_str(), %id, error = %e, "removing the conditions of a gone object failed");
                }
            }
        }
    }
}
