//! Publishing the status conditions a farm computes each pass: stamped, and written (fenced
//! by the object's ownership lock) only when they differ from what is stored; removed
//! (fenced by leadership) once the farm's world knows their object is gone.

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
    /// objects another session has owned since (P2's farm, which writes none: a record left
    /// would be shown as current however the object fares under it): as many to a
    /// transaction as its fence leaves room for, since thousands deleted together would
    /// otherwise hold up the farm's pass for a commit each. Only what `world` knows is
    /// removed: an object it does not show is gone only if it has caught up to the record's
    /// write (a new leader's world may be behind the records the last leader wrote, and
    /// their transition times would start again once rewritten), and a record written
    /// while its object's lock was held by the session holding it now is that session's
    /// own (every record is written fenced by the lock), so a farm's of this server's in an
    /// earlier term, whose session has yet to expire. A failure is logged and returned,
    /// for the farm to try again ([`super::TIDYING`]).
    pub async fn remove_stale(
        &self,
        ctx: &FarmContext,
        world: &World,
        exists: impl Fn(&str) -> bool,
    ) -> FarmResult<()> {
        let prefix = layout::conditions_of_kind(self.kind);
        // Whether a session other than this term's took the object's lock after `written`.
        let taken_over_since = |id: &str, written: u64| {
            let lock = world.locks.items.get(&layout::ownership(self.kind, id));
            lock.is_some_and(|lock| {
                let elsewhere = lock.value.as_deref().is_some_and(|s| s != ctx.session);
                elsewhere && lock.index > written
            })
        };
        let gone: Vec<TxnOp> = self
            .mirror
            .under(&prefix)
            .iter()
            .filter_map(|entry| {
                let id = entry.pair.key.strip_prefix(&prefix)?;
                let written = entry.pair.modify_index;
                let stale = if exists(id) {
                    taken_over_since(id, written)
                } else {
                    world.caught_up >= written
                };
                stale.then(|| ConditionStore::delete_op(self.kind, id))
            })
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::farms::fixture::{rc, term_over, Fleet, HELLO_1};
    use crate::farms::rc::RcFarm;
    use crate::farms::Farm;
    use crate::kv::sqlite::SqliteStore;
    use crate::kv::{Cas, KvPair, KvStore};
    use crate::state::MirrorConfig;
    use crate::store::Versioned;

    const X: &str = "00000000-0000-4000-8000-000000000001";

    /// A term of one server over `store`: its leader session holding the leader lock, and
    /// its farms' session.
    async fn term(store: &Arc<dyn KvStore>, holder: &str) -> FarmContext {
        let (term, ctx) = term_over(store, holder).await;
        let leader = &term.leader_session;
        assert!(store.acquire(LEADER_LOCK, b"leader", leader).await.unwrap());
        ctx
    }

    /// A world caught up to `caught_up`, showing RC `X` at index `rc_at` and its ownership
    /// lock held as `lock` says (the session, at its index), each if given.
    fn world(rc_at: Option<u64>, lock: Option<(&str, u64)>, caught_up: u64) -> World {
        let mut fleet = Fleet::new();
        if let Some(index) = rc_at {
            fleet.put_rc(rc(X, HELLO_1, 0, ""), index);
        }
        if let Some((session, index)) = lock {
            let held = Versioned {
                value: Some(session.to_owned()),
                index,
            };
            fleet.locks.insert(layout::rc_ownership(X), held);
        }
        let mut world = fleet.world();
        world.caught_up = caught_up;
        world
    }

    /// A new leader whose world is behind the conditions the last leader wrote for RC `X`
    /// (it does not show the RC yet, or shows its lock still held by the last leader's farms'
    /// session, which has yet to expire) keeps them, and their transition times with them,
    /// rather than remove them and write them afresh once its world shows the RC as its own.
    /// Once its world knows the RC is gone, it removes them.
    #[tokio::test]
    async fn a_new_leader_behind_the_last_ones_conditions_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db").display().to_string();
        let store: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
        let mirror = Mirror::new(store.clone(), MirrorConfig::default());
        let (tasks, cancel) = (TaskTracker::new(), CancellationToken::new());
        mirror.start(&tasks, cancel.clone());
        mirror.loaded().await;
        let get = |key: String| {
            let store = store.clone();
            async move { store.get(&key).await.unwrap() }
        };
        let index = |pair: Option<KvPair>| pair.unwrap().modify_index;
        // An index past every change so far: what a world caught up with the store is at.
        let current = || {
            let (store, get) = (&store, &get);
            async move {
                store.put("marker", b"", Cas::Any).await.unwrap();
                index(get("marker".into()).await)
            }
        };

        let doc = rc(X, HELLO_1, 0, "").to_json();
        store
            .put(&layout::rc(X), &doc, Cas::Index(0))
            .await
            .unwrap();
        let created = index(get(layout::rc(X)).await);
        let lock = layout::rc_ownership(X);
        let key = layout::conditions(ObjectKind::Rcs, X);

        // The last leader's RC farm writes the RC's conditions.
        let last = term(&store, "last").await;
        assert!(store.acquire(&lock, b"last", &last.session).await.unwrap());
        let taken = index(get(lock.clone()).await);
        let owned = world(Some(created), Some((last.session.as_str(), taken)), taken);
        RcFarm::new(mirror.clone()).pass(&last, &owned).await;
        let written = get(key.clone())
            .await
            .expect("the last leader's conditions");
        assert!(
            mirror
                .wait_for(written.modify_index, Duration::from_secs(10))
                .await
        );

        // Its leader session ends; its farms' session, and the RC's lock, outlive it a while.
        store.destroy_session(&last.leader_session).await.unwrap();
        let new = term(&store, "new").await;
        let mut farm = RcFarm::new(mirror.clone());
        let behind = [
            world(None, None, created - 1),
            world(Some(created), Some((last.session.as_str(), taken)), taken),
        ];
        for lagging in &behind {
            farm.pass(&new, lagging).await;
            let kept = get(key.clone()).await;
            assert_eq!(
                kept.as_ref().map(|pair| pair.modify_index),
                Some(written.modify_index),
                "the last leader's conditions were removed or rewritten"
            );
        }

        // The last farms' session expires; the new leader's farm takes the RC, and finds its
        // conditions as they were, transition times and all.
        store.destroy_session(&last.session).await.unwrap();
        farm.pass(&new, &world(Some(created), None, current().await))
            .await;
        let taken = index(get(lock.clone()).await);
        farm.pass(
            &new,
            &world(Some(created), Some((new.session.as_str(), taken)), taken),
        )
        .await;
        let now = get(key.clone()).await.expect("the RC's conditions");
        assert_eq!(now.modify_index, written.modify_index);
        assert_eq!(now.value, written.value);

        // Gone, the RC's conditions go.
        store.delete(&layout::rc(X), Cas::Any).await.unwrap();
        let caught_up = current().await;
        farm.pass(
            &new,
            &world(None, Some((new.session.as_str(), taken)), caught_up),
        )
        .await;
        assert_eq!(get(key).await, None);
        cancel.cancel();
    }
}
