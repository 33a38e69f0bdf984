//! Removes lock keys left without a session under the farms' lock trees.
//!
//! P2 and this server take the locks there (ownership, mutation, update-creation) only with
//! sessions whose behavior is delete, so such a key vanishes with its session. A key found
//! there without a session was left by a session whose behavior was release (an older run of
//! this server with `--leader-behavior release`, say). Nobody can tell that it is stale but P2's
//! RC farm treats every key in its lock tree as held, so it would never take that RC again.
//! Each such key is deleted with a CAS on the index it was seen at, so that a concurrent
//! acquire is never undone.

use std::time::Duration;

use tokio::time::Instant;

use crate::kv::TxnOp;
use crate::layout::{self, LEADER_LOCK};

use super::world::World;
use super::{Farm, FarmContext, Retries};

/// The farm's state across passes: only backoffs.
#[derive(Default)]
pub struct StaleLockFarm {
    retries: Retries,
}

impl Farm for StaleLockFarm {
    const NAME: &'static str = "stale-locks";
    const PACE: Duration = super::HOUSEKEEPING_PACE;

    fn retries(&self) -> &Retries {
        &self.retries
    }

    async fn pass(&mut self, ctx: &FarmContext, world: &World) -> Option<Instant> {
        for (key, lock) in &world.locks.items {
            if lock.value.is_some() || !session_only(key) || !self.retries.ready(key) {
                continue;
            }
            if ctx.cancel.is_cancelled() {
                return None;
            }
            let delete = vec![TxnOp::DeleteCas {
                key: key.clone(),
                index: lock.index,
            }];
            // Fenced on leadership alone: the key belongs to nobody.
            match ctx.commit(LEADER_LOCK, delete).await {
                Ok(_) => {
                    tracing::info!(%key, "removed a lock key left without a session");
                    self.retries.succeeded(key);
                }
                Err(e) if e.is_conflict() => {
                    // Taken or changed since the farm looked: the next listing shows it.
                    tracing::debug!(%key, "a lock key left without a session changed meanwhile");
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, "removing a lock key left without a session failed");
                    self.retries.failed(key);
                }
            }
        }
        self.retries
            .retain(|key| world.locks.items.contains_key(key));
        None
    }
}

/// Whether `key` is a lock P2 and this server only ever hold with a delete-behavior session:
/// `lock/replication_controllers/<id>` and its `/update` and `/update_creation` locks,
/// `lock/rolls/<id>`, `lock/daemon_sets/<id>`. Other locks there (`/node_transfer`, taken by
/// outside systems, or kinds P2 does not know) are left to whoever takes them.
fn session_only(key: &str) -> bool {
    let single = |prefix: &str| {
        key.strip_prefix(prefix)
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
    };
    if single(layout::ROLL_LOCKS) || single(layout::DS_LOCKS) {
        return true;
    }
    let Some(rest) = key.strip_prefix(layout::RC_LOCKS) else {
        return false;
    };
    match rest.split_once('/') {
        None => !rest.is_empty(),
        Some((id, kind)) => !id.is_empty() && matches!(kind, "update" | "update_creation"),
    }
}

#[cfg(test)]
mod tests {
    use super::session_only;
    use crate::layout;

    #[test]
    fn only_the_locks_taken_with_delete_sessions_count() {
        let id = "0f9e1d2c-3b4a-5968-7a6b-5c4d3e2f1a0b";
        for key in [
            layout::rc_ownership(id),
            layout::rc_mutation(id),
            layout::rc_update_creation(id),
            layout::roll_ownership(id),
            layout::ds_ownership(id),
        ] {
            assert!(session_only(&key), "{key}");
        }
        for key in [
            format!("lock/replication_controllers/{id}/node_transfer"),
            format!("lock/replication_controllers/{id}/other"),
            format!("lock/rolls/{id}/extra"),
            "lock/replication_controllers/".to_owned(),
            "lock/daemon_sets/".to_owned(),
            "lock/p2-apiserver/leader".to_owned(),
            format!("lock/replication/{id}"),
        ] {
            assert!(!session_only(&key), "{key}");
        }
    }
}
