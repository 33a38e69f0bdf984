//! Keeps what this server stores beside P2's trees bounded: events and finished rolls past
//! `--event-retention-count` or `--event-retention-age` are deleted, and so are the times of
//! objects that are gone (deleted by a tool that does not know of them, such as P2's).
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
use crate::store::events::{expired, Retention};
use crate::store::rolls::decode_finished;

use super::world::World;
use super::{Farm, FarmContext, Retries};

/// The farm's state: the mirror it reads and the bounds it keeps. It retries a failed pass
/// on the next one, so its backoff stays empty.
pub struct RetentionFarm {
    mirror: Mirror,
    retention: Retention,
    retries: Retries,
}

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
        let timed = |tree: Tree, time: &dyn Fn(&KvPair) -> Option<SystemTime>| {
            let mut items: Vec<(SystemTime, Arc<Entry>)> = self
                .mirror
                .entries(tree)
                .values()
                .filter_map(|entry| Some((time(&entry.pair)?, entry.clone())))
                .collect();
            items.sort_by_key(|item| item.0);
            items
        };
        let events = timed(Tree::Events, &|pair| {
            Event::time_of_id(pair.key.strip_prefix(layout::EVENTS)?)
        });
        let finished = timed(Tree::RollHistory, &|pair| {
            parse_rfc3339(&decode_finished(pair)?.value.ended)
        });
        let mut deletes: Vec<TxnOp> = Vec::new();
        for items in [&events, &finished] {
            deletes.extend(
                expired(items, self.retention, now).map(|entry| TxnOp::DeleteCas {
                    key: entry.pair.key.clone(),
                    index: entry.pair.modify_index,
                }),
            );
        }
        for batch in deletes.chunks(MAX_TXN_OPS - 1) {
            if let Err(e) = ctx.commit(LEADER_LOCK, batch.to_vec()).await {
                tracing::warn!(error = %e, "pruning events and finished rolls failed");
                return None;
            }
        }
        if !deletes.is_empty() {
            tracing::debug!(deleted = deletes.len(), "pruned events and finished rolls");
        }
        self.remove_orphaned_times(ctx).await;
        None
    }
}

impl RetentionFarm {
    /// Deletes the times of objects the mirror no longer holds, each only while its object
    /// is still absent from the store.
    async fn remove_orphaned_times(&self, ctx: &FarmContext) {
        for entry in self.mirror.entries(Tree::Meta).values() {
            let Some((kind, id)) = layout::meta_object(&entry.pair.key) else {
                continue;
            };
            let object = layout::object(kind, id);
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
                    tracing::debug!(key = %entry.pair.key, "removed the times of a gone object")
                }
                // The object exists after all (the mirror had not seen it yet), or the times
                // changed: the next pass looks again.
                Err(e) if e.is_conflict() => {}
                Err(e) => {
                    tracing::warn!(key = %entry.pair.key, error = %e, "removing the times of a gone object failed");
                    return;
                }
            }
        }
    }
}
