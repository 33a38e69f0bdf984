//! Keeps what this server stores beside P2's trees bounded: events and finished rolls past
//! `--event-retention-count` or `--event-retention-age` are deleted, and so are the times of
//! objects that are gone (deleted by a tool that does not know of them, such as P2's) and
//! the DS farm status records of daemon sets that are gone.
//!
//! It works from the mirror, so a pass that finds nothing to prune costs no store request.
//! Each deletion is a CAS on the index seen (times also check that their object is still
//! absent), fenced on leadership, so nothing newer is ever undone.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::kv::{KvPair, TxnOp, MAX_TXN_OPS};
use crate::layout::{self, LEADER_LOCK};
use crate::model::event::Event;
use crate::model::timestamp::parse_rfc3339;
use crate::state::{Entry, Mirror, Tree};
use crate::store::events::{expired, Dated, Retention};
use crate::store::rolls::decode_finished;

use super::world::World;
use super::{Farm, FarmContext, Retries};

/// The farm's state: the mirror it reads and the bounds it keeps. It retries a failed step
/// on the next pass; its retries hold the steps that failed last time (`prune`,
/// `orphaned-times`), so that its errors and queue depth show them as any farm's do.
pub struct RetentionFarm {
    mirror: Mirror,
    retention: Retention,
    retries: Retries,
}

/// The step deleting events and finished rolls past the retention, in the farm's retries.
const PRUNE: &str = "prune";
/// The step deleting the times of gone objects, in the farm's retries.
const ORPHANED_TIMES: &str = "orphaned-times";

impl RetentionFarm {
    /// Prunes what `mirror` shows past `retention`.
    pub fn new(mirror: Mirror, retention: Retention) -> Self {
        RetentionFarm {
            mirror,
            retention,
            retries: Retries::default(),
        }
    }
}

impl Farm for RetentionFarm {
    const NAME: &'static str = "retention";
    const PACE: Duration = super::HOUSEKEEPING_PACE;

    fn retries(&self) -> &Retries {
        &self.retries
    }

    async fn pass(&mut self, ctx: &FarmContext, _world: &World) -> Option<Instant> {
        let now = SystemTime::now();
        let dated = |tree: Tree, time: &dyn Fn(&str, &KvPair) -> Option<SystemTime>| {
            let prefix = tree.prefix();
            self.mirror
                .entries(tree)
                .values()
                .filter_map(|entry| {
                    // The tree's own folder key, if a tool made one, is no record.
                    let id = entry.pair.key.strip_prefix(prefix.as_str())?;
                    (!id.is_empty()).then(|| Dated {
                        time: time(id, &entry.pair),
                        index: entry.pair.modify_index,
                        item: entry.clone(),
                    })
                })
                .collect::<Vec<Dated<Arc<Entry>>>>()
        };
        // An event's time is its id's, or, under a key that is not an event id, its own.
        let events = dated(Tree::Events, &|id, pair| {
            Event::time_of_id(id)
                .or_else(|| parse_rfc3339(&Event::from_json(&pair.value).ok()?.time))
        });
        let finished = dated(Tree::RollHistory, &|_, pair| {
            parse_rfc3339(&decode_finished(pair)?.value.ended)
        });
        let mut deletes: Vec<TxnOp> = Vec::new();
        for items in [events, finished] {
            deletes.extend(
                expired(items, self.retention, now)
                    .into_iter()
                    .map(|entry| TxnOp::DeleteCas {
                        key: entry.pair.key.clone(),
                        index: entry.pair.modify_index,
                    }),
            );
        }
        for batch in deletes.chunks(MAX_TXN_OPS - 1) {
            if let Err(e) = ctx.commit(LEADER_LOCK, batch.to_vec()).await {
                tracing::warn!(error = %e, "pruning events and finished rolls failed");
                self.retries.failed(PRUNE);
                return None;
            }
        }
        self.retries.succeeded(PRUNE);
        if !deletes.is_empty() {
            tracing::debug!(deleted = deletes.len(), "pruned events and finished rolls");
        }
        self.remove_orphaned_times(ctx).await;
        None
    }
}

impl RetentionFarm {
    /// Deletes the times of objects the mirror no longer holds, and the DS farm status
    /// records of daemon sets it no longer holds (one a farm pass wrote again after the
    /// delete, or left by a tool that deletes daemon sets without it), each only while its
    /// object is still absent from the store.
    async fn remove_orphaned_times(&mut self, ctx: &FarmContext) {
        let times = self.mirror.entries(Tree::Meta);
        let statuses = self.mirror.entries(Tree::DsStatus);
        let times = times.values().filter_map(|entry| {
            let (kind, id) = layout::meta_object(&entry.pair.key)?;
            Some((layout::object(kind, id), entry))
        });
        let statuses = statuses.values().filter_map(|entry| {
            let id = layout::ds_farm_status_owner(&entry.pair.key)?;
            Some((layout::daemon_set(id), entry))
        });
        for (object, entry) in times.chain(statuses) {
            if self.mirror.get(&object).is_some() {
                continue;
            }
            let ops = vec![
                TxnOp::CheckNotExists { key: object },
                TxnOp::DeleteCas {
                    key: entry.pair.key.clone(),
                    index: entry.pair.modify_index,
                },
            ];
            match ctx.commit(LEADER_LOCK, ops).await {
                Ok(_) => {
                    tracing::debug!(key = %entry.pair.key, "removed a record of a gone object")
                }
                // The object exists after all (the mirror had not seen it yet), or the times
                // changed: the next pass looks again.
                Err(e) if e.is_conflict() => {}
                Err(e) => {
                    tracing::warn!(key = %entry.pair.key, error = %e, "removing a record of a gone object failed");
                    self.retries.failed(ORPHANED_TIMES);
                    return;
                }
            }
        }
        self.retries.succeeded(ORPHANED_TIMES);
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::farms::alerts::Alerter;
    use crate::kv::{Cas, SessionSpec};
    use crate::leader::Term;
    use crate::model::event::{new_event_id, Action, Actor, ObjectKind};
    use crate::model::timestamp::format_rfc3339;

    /// A pass whose pruning fails counts as the farm's error and leaves the step waiting
    /// for a retry, so that `p2_farm_errors_total{farm="retention"}` and its queue depth
    /// show a store that refuses every pruning; the next pass that prunes clears it.
    #[tokio::test]
    async fn a_failed_pruning_is_counted_and_waits_until_a_pass_prunes() {
        // The context's leader session holds no lock, so its fenced writes fail.
        let (_dir, ctx, mirror) = crate::farms::fixture::idle_context().await;
        let store = ctx.store.clone();
        let old = layout::event(&new_event_id(UNIX_EPOCH + Duration::from_secs(1)));
        store.put(&old, b"{}", Cas::Any).await.unwrap();
        let (tasks, cancel) = (TaskTracker::new(), CancellationToken::new());
        mirror.start(&tasks, cancel.clone());
        mirror.loaded().await;
        let mut farm = RetentionFarm::new(mirror, Retention::default());
        let world = World::default();

        farm.pass(&ctx, &world).await;
        assert_eq!(farm.retries().failures(), 1);
        assert_eq!(farm.retries().waiting(), 1);
        assert!(store.get(&old).await.unwrap().is_some());

        // Leading now, the farm prunes.
        farm.pass(&leading(&store).await, &world).await;
        assert_eq!(farm.retries().failures(), 1);
        assert_eq!(farm.retries().waiting(), 0);
        assert!(store.get(&old).await.unwrap().is_none());
        cancel.cancel();
    }

    /// A farm context whose leader session holds the leader lock of `store`, so that its
    /// fenced writes land.
    async fn leading(store: &Arc<dyn crate::kv::KvStore>) -> FarmContext {
        let spec = SessionSpec::deleting("test", Duration::from_secs(60));
        let session = store.create_session(&spec).await.unwrap();
        assert!(store.acquire(LEADER_LOCK, b"me", &session).await.unwrap());
        let term = Term {
            leader_session: session.clone(),
            session,
            cancel: CancellationToken::new(),
        };
        FarmContext::new(
            store.clone(),
            &term,
            Arc::new(Alerter::new(None)),
            "me".into(),
        )
    }

    /// Keys of the events' and finished rolls' trees whose time cannot be read from their
    /// key or record count towards `--event-retention-count` and go first, oldest by modify
    /// index, so that they cannot accumulate for ever; one whose time its record tells is
    /// pruned by age too. Nothing outside the two trees is touched.
    #[tokio::test]
    async fn keys_of_no_readable_time_count_and_are_pruned() {
        let (_dir, ctx, mirror) = crate::farms::fixture::idle_context().await;
        let store = ctx.store.clone();
        let now = SystemTime::now();
        let stray = format!("{}stray", layout::EVENTS);
        store.put(&stray, b"not an event", Cas::Any).await.unwrap();
        let mut recent = Vec::new();
        for _ in 0..3 {
            let key = layout::event(&new_event_id(now));
            store.put(&key, b"{}", Cas::Any).await.unwrap();
            recent.push(key);
        }
        // Not an event id, but an event whose own time is a month old.
        let mut aged =
            Actor::farm("test", "me").event(ObjectKind::Rcs, "a", Action::Deleted, vec![]);
        aged.time = format_rfc3339(now - Duration::from_secs(30 * 24 * 3600));
        let renamed = format!("{}renamed", layout::EVENTS);
        store
            .put(&renamed, &aged.to_json(), Cas::Any)
            .await
            .unwrap();
        // Finished rolls whose records cannot be read, the first written the oldest.
        let mut unreadable = Vec::new();
        for i in 0..5 {
            let key = layout::roll_history(format!("00000000-0000-4000-8000-00000000000{i}"));
            store.put(&key, b"{", Cas::Any).await.unwrap();
            unreadable.push(key);
        }
        let outside = format!("{}stray", layout::OURS);
        store.put(&outside, b"x", Cas::Any).await.unwrap();
        let (tasks, cancel) = (TaskTracker::new(), CancellationToken::new());
        mirror.start(&tasks, cancel.clone());
        mirror.loaded().await;
        let retention = Retention {
            count: 4,
            age: Duration::from_secs(7 * 24 * 3600),
        };
        let mut farm = RetentionFarm::new(mirror, retention);

        farm.pass(&leading(&store).await, &World::default()).await;
        let exists = |key: String| {
            let store = store.clone();
            async move { store.get(&key).await.unwrap().is_some() }
        };
        assert!(
            !exists(stray).await,
            "a key that is not an event id was kept past the count"
        );
        assert!(
            !exists(renamed).await,
            "a month-old event under another key was kept"
        );
        for key in recent {
            assert!(exists(key).await, "a recent event was pruned");
        }
        assert!(
            !exists(unreadable[0].clone()).await,
            "the oldest unreadable finished roll was kept past the count"
        );
        for key in &unreadable[1..] {
            assert!(
                exists(key.clone()).await,
                "an unreadable finished roll within the count was pruned"
            );
        }
        assert!(
            exists(outside).await,
            "a key outside the events' trees was pruned"
        );
        cancel.cancel();
    }
}
