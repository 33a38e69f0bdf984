//! The roll farm: moves replicas from a roll's old RC to its new one in steps that keep at
//! least `minimum_replicas` healthy (§4.5–4.7), then deletes the old RC (unless `leave_old`)
//! and the roll.
//!
//! While a roll runs this server holds both RCs' mutation locks, so API writes to their
//! counts are refused, and every write is fenced by the roll's ownership lock and checks both
//! mutation locks, as P2's do. The protocol is P2's, so that any RC farm (ours or P2's) can
//! own the RCs: the old RC is disabled and the new one enabled for the roll's duration (the
//! old one is never enabled again), the counts move between them, and the new RC's pods
//! replace the old ones in place or land on spare nodes; the roll completes when the old RC
//! has no pods left. A roll that cannot move on its own raises an alert saying why.
//! Differences from P2, on purpose: at completion an old RC whose count a human raised is set
//! to 0 instead of blocking the roll forever; a roll whose RCs vanish is always cleaned up.

use std::collections::HashMap;
use std::time::SystemTime;

use serde_json::json;
use tokio::time::Instant;

use crate::kv::{StoreResult, TxnOp};
use crate::labels::{LabelType, RC_ID_LABEL};
use crate::model::{roll_step, AuditRecord, HealthCounts, StoredRc, StoredRoll};
use crate::store::layout;
use crate::store::rcs::RcStore;
use crate::store::rolls::RollStore;

use super::pods::pod_health;
use super::world::{Versioned, World};
use super::{earliest, Farm, FarmContext, Retries};

/// The roll farm's state across passes: when each roll last took a step (for `roll_delay`)
/// and backoffs; a restart only makes a roll wait its delay once more.
#[derive(Default)]
pub struct RollFarm {
    retries: Retries,
    last_step: HashMap<String, Instant>,
}

/// Replica counts of one RC as the roll sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// The RC's `replicas_desired`.
    pub desired: i64,
    /// Its pods of the RC's pod id, counted by the one health rule against its manifest.
    pub pods: HealthCounts,
}

impl Counts {
    /// Pods labelled with the RC's id.
    pub fn current(&self) -> i64 {
        self.pods.current as i64
    }

    /// Of those, pods running the RC's manifest and passing.
    pub fn healthy(&self) -> i64 {
        self.pods.healthy as i64
    }

    /// Pods still on their way: not placed yet (`desired` above `current`), not running the
    /// RC's manifest yet, or without a health result.
    pub fn settling(&self) -> i64 {
        let pods = &self.pods;
        (self.desired - self.current()).max(0) + (pods.current - pods.real + pods.unknown) as i64
    }
}

/// Counts an RC's pods in `world`.
pub fn count(world: &World, id: &str, rc: &StoredRc) -> Counts {
    let pod_id = rc.manifest.pod_id();
    let pods = world
        .pods_labelled(RC_ID_LABEL, id)
        .into_iter()
        .filter(|(_, pod)| pod == pod_id)
        .map(|pod| pod_health(world, &pod, &rc.manifest))
        .collect();
    Counts {
        desired: rc.replicas_desired,
        pods,
    }
}

impl Farm for RollFarm {
    const NAME: &'static str = "roll";

    async fn pass(&mut self, ctx: &FarmContext, world: &World) -> Option<Instant> {
        let mut wake: Option<Instant> = None;
        for (id, roll) in &world.rolls.items {
            if ctx.cancel.is_cancelled() {
                return None;
            }
            if !ctx
                .claim(world, &mut self.retries, id, &layout::roll_ownership(id))
                .await
            {
                continue;
            }
            let result = self.reconcile(ctx, world, id, roll).await;
            if let Some(at) = self.retries.record("roll", id, result) {
                wake = earliest(wake, at);
            }
        }
        self.last_step
            .retain(|id, _| world.rolls.items.contains_key(id));
        release_stale_locks(ctx, world).await;
        earliest(wake, self.retries.next_due())
    }
}

impl RollFarm {
    /// One step of one roll; returns when it wants to run again if it is waiting on time.
    async fn reconcile(
        &mut self,
        ctx: &FarmContext,
        world: &World,
        id: &str,
        roll: &Versioned<StoredRoll>,
    ) -> StoreResult<Option<Instant>> {
        let spec = &roll.value;
        let fence = layout::roll_ownership(id);
        let (Some(old), Some(new)) = (
            world.rcs.items.get(&spec.old_rc),
            world.rcs.items.get(&spec.new_rc),
        ) else {
            // The RC tree may simply not show an RC written with the roll yet: ask the store.
            let store = RcStore::new(ctx.store.clone());
            if store.get(&spec.old_rc).await?.is_some() && store.get(&spec.new_rc).await?.is_some()
            {
                return Ok(None);
            }
            tracing::warn!(roll = %id, "an RC of the roll is gone; deleting the roll");
            let ops = finish_ops(ctx, world, id, roll, None, false).await?;
            ctx.commit(&fence, ops).await?;
            return Ok(None);
        };

        // Hold both RCs' mutation locks for the whole roll.
        let mutation = [
            layout::rc_mutation(&spec.old_rc),
            layout::rc_mutation(&spec.new_rc),
        ];
        let mut take = Vec::new();
        for lock in &mutation {
            match world.lock_holder(lock) {
                Some(holder) if holder == ctx.session => {}
                Some(_) => {
                    tracing::info!(roll = %id, %lock, "an RC of the roll is locked by someone else");
                    return Ok(None);
                }
                None => take.push(TxnOp::Lock {
                    key: lock.clone(),
                    value: ctx.holder.as_bytes().to_vec(),
                    session: ctx.session.clone(),
                }),
            }
        }
        if !take.is_empty() {
            ctx.commit(&fence, take).await?;
            return Ok(None);
        }
        let held: Vec<TxnOp> = mutation
            .iter()
            .map(|lock| TxnOp::CheckSession {
                key: lock.clone(),
                session: ctx.session.clone(),
            })
            .collect();

        // P2's enable step: the old RC disabled (its pods are then replaced or removed by
        // whichever RC farm owns it), the new one enabled.
        if new.value.disabled || !old.value.disabled {
            let new_counts = count(world, &spec.new_rc, &new.value);
            if new.value.disabled && new_counts.current() != new_counts.desired {
                // Enabling it would make its farm add or remove pods outside the roll's steps.
                let why = format!(
                    "the new RC is disabled with {} pods for {} replicas, so enabling it would change its pods outside the roll's steps",
                    new_counts.current(), new_counts.desired
                );
                stuck(ctx, id, spec, why).await;
                return Ok(None);
            }
            let mut ops = held;
            for (rc, disabled) in [(old, true), (new, false)] {
                if rc.value.disabled != disabled {
                    let mut changed = rc.value.clone();
                    changed.disabled = disabled;
                    ops.push(RcStore::write_op(&changed, rc.index));
                }
            }
            ctx.commit(&fence, ops).await?;
            return Ok(None);
        }

        let old_counts = count(world, &spec.old_rc, &old.value);
        let new_counts = count(world, &spec.new_rc, &new.value);
        let target = spec.desired_replicas;
        if new_counts.desired >= target {
            if new_counts.current() < target {
                return Ok(None);
            }
            return self
                .complete(ctx, world, id, roll, old, old_counts, held)
                .await;
        }
        let (remove, add) = roll_step(
            old_counts.healthy().min(old_counts.desired),
            new_counts.healthy(),
            old_counts.desired,
            new_counts.desired,
            target,
            spec.minimum_replicas,
        );
        if remove == 0 && add == 0 {
            if old_counts.settling() == 0 && new_counts.settling() == 0 {
                let why = format!(
                    "{} pods are healthy (old RC {}, new RC {}) against a minimum of {}, and none is still starting, so a step would go below the minimum",
                    old_counts.healthy().min(old_counts.desired) + new_counts.healthy(),
                    old_counts.healthy().min(old_counts.desired),
                    new_counts.healthy(),
                    spec.minimum_replicas
                );
                stuck(ctx, id, spec, why).await;
            }
            return Ok(None);
        }
        if new_counts.desired > 0 && !spec.roll_delay.is_zero() {
            // Not knowing when the last step was (a new term), wait one whole delay.
            let last = *self
                .last_step
                .entry(id.to_owned())
                .or_insert_with(Instant::now);
            let due = last + spec.roll_delay;
            if Instant::now() < due {
                return Ok(Some(due));
            }
        }
        let mut old_rc = old.value.clone();
        let mut new_rc = new.value.clone();
        old_rc.replicas_desired = (old_rc.replicas_desired - remove).max(0);
        new_rc.replicas_desired += add;
        let mut ops = held;
        ops.push(RcStore::write_op(&old_rc, old.index));
        ops.push(RcStore::write_op(&new_rc, new.index));
        ctx.commit(&fence, ops).await?;
        self.last_step.insert(id.to_owned(), Instant::now());
        tracing::info!(roll = %id, remove, add, old = old_rc.replicas_desired,
                       new = new_rc.replicas_desired, "roll step");
        Ok(None)
    }

    /// The new RC has its replicas: retire the old RC (unless `leave_old`) and the roll.
    #[allow(clippy::too_many_arguments)]
    async fn complete(
        &mut self,
        ctx: &FarmContext,
        world: &World,
        id: &str,
        roll: &Versioned<StoredRoll>,
        old: &Versioned<StoredRc>,
        old_counts: Counts,
        held: Vec<TxnOp>,
    ) -> StoreResult<Option<Instant>> {
        let spec = &roll.value;
        let fence = layout::roll_ownership(id);
        if !spec.leave_old {
            if old_counts.desired != 0 {
                let mut retired = old.value.clone();
                retired.replicas_desired = 0;
                let mut ops = held;
                ops.push(RcStore::write_op(&retired, old.index));
                ctx.commit(&fence, ops).await?;
                return Ok(None);
            }
            if old_counts.current() > 0 {
                // Our RC farm removes a rolling disabled RC's pods; P2's never does.
                let owner = world.lock_holder(&layout::rc_ownership(&spec.old_rc));
                if owner.is_some_and(|owner| owner != ctx.session) {
                    let why = format!(
                        "the new RC has its {} pods but the old RC still has {}, which the RC farm owning it (another session) leaves in place while the RC is disabled",
                        spec.desired_replicas, old_counts.current()
                    );
                    stuck(ctx, id, spec, why).await;
                }
                return Ok(None);
            }
        }
        let retire = (!spec.leave_old).then_some(old.index);
        let ops = finish_ops(ctx, world, id, roll, retire, true).await?;
        ctx.commit(&fence, ops).await?;
        tracing::info!(roll = %id, "roll complete");
        Ok(None)
    }
}

/// Ops that end a roll: release the mutation locks this session holds, delete the old RC
/// at `retire_old` (when given), the roll and its labels, with a completion audit record.
/// The roll is deleted at the index the farm read, which also makes the next pass wait until
/// the rolls tree shows it gone rather than try to end it again.
async fn finish_ops(
    ctx: &FarmContext,
    world: &World,
    id: &str,
    roll: &Versioned<StoredRoll>,
    retire_old: Option<u64>,
    succeeded: bool,
) -> StoreResult<Vec<TxnOp>> {
    let spec = &roll.value;
    let mut ops = vec![TxnOp::DeleteCas {
        key: layout::roll(id),
        index: roll.index,
    }];
    for rc in [&spec.old_rc, &spec.new_rc] {
        let lock = layout::rc_mutation(rc);
        if world.lock_holder(&lock) == Some(ctx.session.as_str()) {
            ops.push(TxnOp::CheckSession {
                key: lock.clone(),
                session: ctx.session.clone(),
            });
            ops.push(TxnOp::Delete { key: lock });
        }
    }
    if let Some(index) = retire_old {
        ops.extend(RcStore::delete_ops(&spec.old_rc, index));
    }
    ops.extend(RollStore::delete_ops(id));
    let labels = ctx
        .store
        .get(&LabelType::Rolls.label_key(id))
        .await?
        .and_then(|pair| serde_json::from_slice(&pair.value).ok())
        .unwrap_or_default();
    let record = AuditRecord::ru_completion(id, &labels, succeeded, !succeeded, SystemTime::now());
    ops.push(TxnOp::Set {
        key: layout::new_audit_log(),
        value: record.to_json(),
    });
    Ok(ops)
}

/// Raises the alert that roll `id` cannot move on its own, and why.
async fn stuck(ctx: &FarmContext, id: &str, spec: &StoredRoll, why: String) {
    let details = json!({"roll_id": id, "old_rc": spec.old_rc, "new_rc": spec.new_rc,
                         "hostname": ctx.holder});
    ctx.alerts
        .low(id, format!("roll {id} cannot move: {why}"), details)
        .await;
}

/// Releases locks this session holds for rolls that are gone (a cancelled roll leaves both
/// RCs free for API writes again).
async fn release_stale_locks(ctx: &FarmContext, world: &World) {
    let rolling: Vec<&str> = world
        .rolls
        .items
        .values()
        .flat_map(|r| [r.value.old_rc.as_str(), r.value.new_rc.as_str()])
        .collect();
    for key in world.held_by(&ctx.session) {
        let stale = if let Some(roll) = key.strip_prefix("lock/rolls/") {
            !world.rolls.items.contains_key(roll)
        } else if let Some(rc) = key
            .strip_prefix("lock/replication_controllers/")
            .and_then(|rest| rest.strip_suffix("/update"))
        {
            !rolling.contains(&rc)
        } else {
            false
        };
        if stale {
            if let Err(e) = ctx.release_lock(key).await {
                tracing::warn!(%key, error = %e, "releasing a roll lock failed");
            }
        }
    }
}
