//! The records this server keeps beside P2's trees (see [`crate::model::event`]): the ops
//! that record a change in the change's own transaction, and which of them retention drops.
//!
//! An object's times are deleted by the ops that delete the object (each repository's delete
//! ops), so they go with it; times left by an object another tool deleted are removed by the
//! retention farm ([`crate::farms::retention`]).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use crate::kv::{KvStore, StoreResult, TxnOp};
use crate::model::event::{diff, Action, Actor, Event, Meta, ObjectKind};
use crate::state::Mirror;

use crate::layout;

/// How many events and finished rolls are kept, and for how long (`--event-retention-count`,
/// `--event-retention-age`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// At most this many of each; the oldest go first.
    pub count: usize,
    /// None older than this.
    pub age: Duration,
}

impl Default for Retention {
    /// The command line's defaults.
    fn default() -> Self {
        Retention {
            count: 10_000,
            age: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// The ops that record `event` in its change's transaction: the event, and for a creation or
/// a change of the document the object's created and modified times (reading the times kept
/// so far, for a change).
pub async fn record_ops(kv: &dyn KvStore, event: &Event) -> StoreResult<Vec<TxnOp>> {
    record_ops_keeping(kv, event, None).await
}

/// The ops recording that `actor` deleted the `kind` document `id`, whose fields were
/// `before` (as [`crate::model::event`] shows them; `null` for a document that could not
/// be decoded, whose deletion is recorded all the same, with no field to show).
pub async fn deleted_ops(
    kv: &dyn KvStore,
    kind: ObjectKind,
    id: &str,
    before: &serde_json::Value,
    actor: &Actor,
) -> StoreResult<Vec<TxnOp>> {
    let changes = diff(before, &serde_json::Value::Null);
    let event = actor.event(kind, id, Action::Deleted, changes);
    record_ops(kv, &event).await
}

/// [`record_ops`] for a change of the object's document from its version at index
/// `replaced`, taking the times kept so far from `mirror` when it holds those written with
/// that version, which saves a read of the store.
///
/// Times are written only in transactions that write their document, and deleted with it,
/// so times at the replaced version's index belong to that version's object however far the
/// mirror lags; and the change's check-and-set on that version fails if the object has gone
/// since. Otherwise (the mirror lags, or another tool wrote the version) they are read from
/// the store.
pub async fn record_update_ops(
    kv: &dyn KvStore,
    event: &Event,
    mirror: &Mirror,
    replaced: u64,
) -> StoreResult<Vec<TxnOp>> {
    let kept = event
        .kind
        .document()
        .and_then(|kind| mirror.get(&layout::meta(kind, &event.object_id)))
        .filter(|entry| entry.pair.modify_index == replaced)
        .and_then(|entry| Meta::from_json(&entry.pair.value).ok());
    record_ops_keeping(kv, event, kept).await
}

/// [`record_ops`], with the times kept so far when already known.
async fn record_ops_keeping(
    kv: &dyn KvStore,
    event: &Event,
    kept: Option<Meta>,
) -> StoreResult<Vec<TxnOp>> {
    let mut ops = vec![TxnOp::Set {
        key: layout::event(&event.id),
        value: event.to_json(),
    }];
    let Some(kind) = event.kind.document() else {
        return Ok(ops);
    };
    let key = layout::meta(kind, &event.object_id);
    let created = match event.action {
        Action::Created => Some(event.time.clone()),
        Action::Updated => match kept {
            Some(meta) => meta.created,
            None => read_meta(kv, &key).await?.and_then(|meta| meta.created),
        },
        _ => return Ok(ops),
    };
    let meta = Meta {
        created,
        modified: event.time.clone(),
    };
    ops.push(TxnOp::Set {
        key,
        value: meta.to_json(),
    });
    Ok(ops)
}

/// The times kept at `key`; `None` when absent or unreadable.
pub async fn read_meta(kv: &dyn KvStore, key: &str) -> StoreResult<Option<Meta>> {
    Ok(kv
        .get(key)
        .await?
        .and_then(|pair| Meta::from_json(&pair.value).ok()))
}

/// The times the mirror holds for `kind` `id`.
pub fn mirrored_meta(mirror: &Mirror, kind: ObjectKind, id: &str) -> Option<Meta> {
    let entry = mirror.get(&layout::meta(kind, id))?;
    Meta::from_json(&entry.pair.value).ok()
}

/// The times of every object of `kind` the store holds, by id.
pub async fn list_meta(kv: &dyn KvStore, kind: ObjectKind) -> StoreResult<HashMap<String, Meta>> {
    let prefix = layout::meta(kind, "");
    let listing = kv.list(&prefix).await?;
    Ok(listing
        .pairs
        .iter()
        .filter_map(|pair| {
            let id = pair.key.strip_prefix(&prefix)?;
            Some((id.to_owned(), Meta::from_json(&pair.value).ok()?))
        })
        .collect())
}

/// The op that removes the times of the object whose P2 document is deleted.
pub fn meta_delete_op(kind: ObjectKind, id: &str) -> TxnOp {
    TxnOp::Delete {
        key: layout::meta(kind, id),
    }
}

/// One record retention may drop: its time, `None` where none can be told (a key that is not
/// an event id, a record that cannot be read), and its store modify index, which every key
/// has.
pub struct Dated<T> {
    pub time: Option<SystemTime>,
    pub index: u64,
    pub item: T,
}

/// Which of `items` retention drops at `now`: all but the newest `count`, and every one
/// older than `age`. A record of no time counts towards `count` as older than any with a
/// time (those of no time oldest first by modify index) and is dropped by `count` alone, so
/// that such records cannot accumulate past the bound.
pub fn expired<T>(mut items: Vec<Dated<T>>, retention: Retention, now: SystemTime) -> Vec<T> {
    items.sort_by_key(|dated| (dated.time, dated.index));
    let over = items.len().saturating_sub(retention.count);
    let cutoff = now.checked_sub(retention.age);
    items
        .into_iter()
        .enumerate()
        .filter_map(|(i, dated)| {
            let old = cutoff.is_some_and(|cutoff| dated.time.is_some_and(|time| time < cutoff));
            (i < over || old).then_some(dated.item)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn retention_drops_the_oldest_beyond_the_count_and_all_past_the_age() {
        let items = || -> Vec<Dated<u64>> {
            (1..=5)
                .map(|s| Dated {
                    time: Some(UNIX_EPOCH + Duration::from_secs(s * 100)),
                    index: 10 - s,
                    item: s,
                })
                .collect()
        };
        let now = UNIX_EPOCH + Duration::from_secs(1000);
        let dropped = |count, age| expired(items(), Retention { count, age }, now);
        assert_eq!(dropped(3, Duration::from_secs(10_000)), [1, 2]);
        assert_eq!(dropped(10, Duration::from_secs(750)), [1, 2]);
        assert_eq!(dropped(4, Duration::from_secs(650)), [1, 2, 3]);
        assert!(dropped(10, Duration::from_secs(10_000)).is_empty());
    }

    /// Records of no time count towards the count, go first, oldest by modify index, and
    /// are never dropped by age.
    #[test]
    fn records_of_no_time_count_and_go_first_by_modify_index() {
        let mut items: Vec<Dated<u64>> = (1..=3)
            .map(|s| Dated {
                time: Some(UNIX_EPOCH + Duration::from_secs(s * 100)),
                index: s,
                item: s,
            })
            .collect();
        for (index, item) in [(20, 20), (10, 10)] {
            items.push(Dated {
                time: None,
                index,
                item,
            });
        }
        let now = UNIX_EPOCH + Duration::from_secs(1000);
        let age = Duration::from_secs(10_000);
        let dropped = expired(items, Retention { count: 2, age }, now);
        assert_eq!(dropped, [10, 20, 1]);
        let untimed = vec![Dated {
            time: None,
            index: 1,
            item: 1,
        }];
        let tight = Retention {
            count: 10,
            age: Duration::from_secs(1),
        };
        assert!(expired(untimed, tight, now).is_empty());
    }
}
