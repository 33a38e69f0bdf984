//! The roll farm: moves replicas from a roll's old RC to its new one in steps that keep at
//! least `minimum_replicas` healthy, then deletes the old RC (unless `leave_old`)
//! and the roll.
//!
//! While a roll runs this server holds both RCs' mutation locks, so API writes to their
//! counts are refused, and every write is fenced by the roll's ownership lock and checks both
//! mutation locks, as P2's do, and the roll itself, so nothing lands once it is cancelled.
//! The protocol is P2's, so that any RC farm (ours or P2's) can own the RCs: the old RC is
//! disabled and the new one enabled for the roll's duration (the old one is never enabled
//! again), the counts move between them, and the new RC's pods replace the old ones in place
//! or land on spare nodes; the roll completes when the old RC has no pods left (with
//! `leave_old`, none beyond the count the roll left it, when our RC farm owns it). A roll that
//! cannot move on its own raises an alert saying why.
//! Differences from P2, on purpose: at completion an old RC whose count a human raised is set
//! to 0 (once the new RC's healthy pods alone keep the minimum) instead of blocking the roll
//! forever; a roll whose RCs vanish is always cleaned up; an RC's healthy pods count towards
//! the minimum less those beyond its count, which are going and may be the healthy ones (P2
//! counts the old RC's up to its count, and every healthy pod of the new RC).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, SystemTime};

use serde_json::json;
use tokio::time::Instant;

use crate::kv::{StoreError, TxnOp};
use crate::labels::{LabelType, RC_ID_LABEL};
use crate::layout;
use crate::model::conditions::{
    ending_completed_roll, ending_for_missing_rcs, roll_conditions, ConditionStatus, RollActivity,
    RollStuck, RollWait,
};
use crate::model::event::{ObjectKind, RcProgress, RollOutcome, RollProgress};
use crate::model::{roll_step, AuditRecord, HealthCounts, StoredRc, StoredRoll};
use crate::state::{Mirror, View};
use crate::store::labels::LabelStore;
use crate::store::rcs::RcStore;
use crate::store::rolls::RollStore;

use super::conditions::{changed_from, Published};
use super::pods::pod_health;
use super::world::{Shared, World};
use super::{earliest, Farm, FarmContext, FarmError, FarmResult, Retries};

/// The farm's name in logs and in the actor of its events.
const FARM: &str = "roll";

/// The roll farm's state across passes: since when each roll has been able to take its next
/// step (for `roll_delay`), backoffs, and the conditions it published (with each roll's last
/// progress, so that a new term goes on counting towards the stall deadline); a restart only
/// makes a roll wait its delay once more.
pub struct RollFarm {
    retries: Retries,
    /// Since when (on both clocks) each roll waiting out its `roll_delay` has been able to
    /// step.
    ready_since: HashMap<String, Moment>,
    conditions: Published,
    /// How long a roll may go without progress before it is stalled.
    stall_deadline: Duration,
    /// The RC mutation locks this term's session took for rolls and has not released: the
    /// only ones a gone roll can leave, so a pass looks at these rather than at every lock
    /// the session holds (the RC farm's ownership of each RC among them).
    mutation_locks: BTreeSet<String>,
    /// The mirror the farms' world follows, which holds the times written with each RC.
    mirror: Mirror,
}

impl RollFarm {
    /// A roll farm for one term, its conditions as `mirror` holds them; rolls without
    /// progress for `stall_deadline` are stalled.
    pub fn new(stall_deadline: Duration, mirror: Mirror) -> RollFarm {
        RollFarm {
            retries: Retries::default(),
            ready_since: HashMap::new(),
            conditions: Published::new(ObjectKind::Rolls, mirror.clone()),
            stall_deadline,
            mutation_locks: BTreeSet::new(),
            mirror,
        }
    }
}

/// One moment as both clocks read it: the monotonic one, for when to wake up, and the wall
/// clock, for the times the roll's conditions publish. A delay's end on both comes from the
/// one moment its roll was first seen able to step, so every pass of the delay publishes the
/// same end, where converting the monotonic end to the wall clock on each pass need not (the
/// clocks' readings drift apart between passes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moment {
    pub instant: Instant,
    pub wall: SystemTime,
}

impl Moment {
    /// Now, on both clocks.
    pub fn now() -> Moment {
        Moment {
            instant: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// The moment `duration` later, on both clocks.
    fn after(self, duration: Duration) -> Moment {
        Moment {
            instant: self.instant + duration,
            wall: self.wall + duration,
        }
    }
}

/// Replica counts of one RC as the roll sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// The RC's `replicas_desired`; a negative one, which P2's tools may store, is none.
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

    /// Of the healthy pods, as many as are sure to stay. The pods beyond the RC's count are
    /// going (an old RC's once a step lowered its count, a new RC's scaled down just before
    /// the roll), and the RC farms pick which go (or which a new pod replaces) by node, not by
    /// health: at worst every one of them is a healthy one.
    pub fn staying_healthy(&self) -> i64 {
        self.healthy().saturating_sub(self.beyond_count()).max(0)
    }

    /// The pods beyond the RC's count, which its farm is to remove.
    pub fn beyond_count(&self) -> i64 {
        self.current().saturating_sub(self.desired).max(0)
    }

    /// Pods still on their way: not placed yet (`desired` above `current`), not running the
    /// RC's manifest yet, or without a health result.
    pub fn settling(&self) -> i64 {
        let pods = &self.pods;
        // `desired` is whatever P2's tools stored, up to i64's end.
        let unplaced = self.desired.saturating_sub(self.current()).max(0);
        unplaced.saturating_add((pods.current - pods.real + pods.unknown) as i64)
    }
}

/// Counts an RC's pods in `world`.
pub fn count(world: &World, id: &str, rc: &StoredRc) -> Counts {
    let pod_id = rc.manifest.pod_id();
    let pods = world
        .pods_labelled(RC_ID_LABEL, id)
        .into_iter()
        .filter(|(_, pod)| &**pod == pod_id)
        .map(|pod| pod_health(world, &pod, &rc.manifest))
        .collect();
    Counts {
        desired: rc.replicas_desired.max(0),
        pods,
    }
}

impl Farm for RollFarm {
    const NAME: &'static str = FARM;
    const OWNERSHIP_LOCKS: Option<&'static str> = Some(layout::ROLL_LOCKS);

    fn retries(&self) -> &Retries {
        &self.retries
    }

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
            let now = Moment::now();
            let ready_since = self.ready_since.get(id).copied();
            let action = plan(world, &ctx.session, id, &roll.value, ready_since, now);
            let rc_missing = matches!(action, Action::RcMissing(_));
            let activity = activity(&action, &roll.value);
            let doing = doing(&action, activity.as_ref());
            let applied = self.apply(ctx, world, id, roll, action, now).await;
            let activity = match &applied {
                // The ending's read failed on an RC that cannot be decoded (the roll's other
                // RC held): not an ending that failed otherwise, which can be tried again.
                Err(Failure::Read(FarmError::Unusable(_))) if rc_missing => self
                    .unreadable_rc(world, &roll.value)
                    .map_or(activity, |stuck| Some(RollActivity::Stuck(stuck))),
                _ => activity,
            };
            let published = match (&applied, &activity) {
                // A record written for an ended roll would outlive it.
                (Ok(Applied::Ended), _) => Ok(None),
                // What the roll goes on doing; or an RC that cannot be decoded, which fails the
                // read for the roll's ending as its conditions say.
                (Ok(Applied::Going(_) | Applied::Unseen), Some(activity))
                | (Err(_), Some(activity @ RollActivity::Stuck(RollStuck::RcUnreadable { .. }))) => {
                    self.publish(ctx, world, id, roll, activity).await
                }
                // What the roll was to do did not happen, or may not have: its conditions say
                // so, not what it would have been doing.
                (Err(e), _) => {
                    let failed = failed(doing, e);
                    self.publish(ctx, world, id, roll, &failed).await
                }
                // Only the roll's ending shows nothing, and it ends the roll or fails.
                (Ok(_), None) => Ok(None),
            };
            let result = (applied.map_err(Failure::into_error))
                .and_then(|applied| Ok(earliest(applied.wake(), published?)));
            if let Some(at) = self.retries.record("roll", id, result) {
                wake = earliest(wake, at);
            }
        }
        self.ready_since
            .retain(|id, _| world.rolls.items.contains_key(id));
        self.retries.retain(|id| world.rolls.items.contains_key(id));
        let removed = self
            .conditions
            .remove_stale(ctx, world, |id| world.rolls.items.contains_key(id))
            .await;
        let released = ctx
            .release_orphaned(world, layout::ROLL_LOCKS, |id| {
                world.rolls.items.contains_key(id)
            })
            .await;
        let freed = self.release_stale_mutation_locks(ctx, world).await;
        self.retries.tidied(removed.and(released).and(freed));
        wake
    }
}

/// Why a roll's action did not happen, or may not have: a read of the store it needed
/// failed (nothing was written), or its write failed or its answer was lost, or, of a write
/// of both RCs in two commits, the first landed and the second failed or its answer was lost.
#[derive(Debug)]
enum Failure {
    Read(FarmError),
    Write(FarmError),
    /// `landed` ("the old RC") names the RC whose write landed.
    PartlyWritten {
        landed: &'static str,
        error: FarmError,
    },
}

impl Failure {
    fn into_error(self) -> FarmError {
        match self {
            Failure::Read(e) | Failure::Write(e) => e,
            Failure::PartlyWritten { error, .. } => error,
        }
    }
}

/// What carrying out a roll's action left of it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Applied {
    /// The roll goes on; when to run again, if it waits on time.
    Going(Option<Instant>),
    /// The roll goes on: the store holds the RCs of it that the world lacks (its RC tree
    /// lags the store), so the world tells nothing of the roll until it shows them.
    Unseen,
    /// The roll was ended (and deleted).
    Ended,
}

impl Applied {
    /// When to run the roll again, if it waits on time.
    fn wake(self) -> Option<Instant> {
        match self {
            Applied::Going(at) => at,
            Applied::Unseen | Applied::Ended => None,
        }
    }
}

/// An RC document to write, at the index it was read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RcWrite {
    pub rc: StoredRc,
    pub index: u64,
}

/// What one reconcile of one roll does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the trees change: the RC farms or the pods' health have to move.
    Wait(RollWait),
    /// These RCs of the roll (one, or both, the old one first) are not in the RC tree: the
    /// roll ends once the store confirms that an RC of it is gone.
    RcMissing(Vec<String>),
    /// Another session holds this mutation lock of the roll's RCs.
    Locked(String),
    /// Take these free mutation locks, held for the whole roll.
    TakeLocks(Vec<String>),
    /// Write the RCs, checking both mutation locks; `step` is the roll step `(remove, add)`
    /// this is, if it is one (else the enable step).
    Write {
        rcs: Vec<RcWrite>,
        step: Option<(i64, i64)>,
    },
    /// Set the old RC's count to 0 once the new RC has its replicas, like a write (boxed:
    /// an RC document is large).
    Retire(Box<RcWrite>),
    /// Wait out `roll_delay` until then (to wake at, and to publish) before the next step.
    Delay(Moment),
    /// The roll cannot move on its own; why, for the alert.
    Stuck(RollStuck),
    /// End the roll, deleting the old RC at this index unless `None` (`leave_old`).
    Finish { retire_old: Option<u64> },
}

/// Decides the next move of roll `id` from `world`, where this farm's term holds `session`;
/// `ready_since` is since when this term has seen the roll able to take the step it would
/// take now, if it has.
pub fn plan(
    world: &World,
    session: &str,
    id: &str,
    spec: &StoredRoll,
    ready_since: Option<Moment>,
    now: Moment,
) -> Action {
    let old = world.rcs.items().get(&spec.old_rc);
    let new = world.rcs.items().get(&spec.new_rc);
    let (Some(old), Some(new)) = (old, new) else {
        let mut missing = Vec::new();
        for (rc, seen) in [(&spec.old_rc, old), (&spec.new_rc, new)] {
            if seen.is_none() && !missing.contains(rc) {
                missing.push(rc.clone());
            }
        }
        return Action::RcMissing(missing);
    };

    if let Some(refused) = refusal(spec) {
        return Action::Stuck(refused);
    }

    // P2 runs each roll under a session of its own, so of two rolls over one RC (which no
    // creation makes, but a write of the roll tree can) one waits on the other's mutation
    // lock. This farm holds every roll's locks in its one session, where a lock held for
    // one roll stops no other: of the rolls sharing an RC, the one under way goes on alone,
    // which a roll written over its RCs since must not stop midway: the one the store shows
    // past its enable step (`enabled_new_rc`, which a new term after a failover, holding
    // no lock yet, sees too), else the one whose RCs' mutation locks this term holds (a
    // lock held for another roll over the same RC counts as well); of rolls alike in both,
    // the one whose id sorts first (the one a new term takes the locks for first), also of
    // two stored under other ids than their one new RC's. A roll the farm refuses
    // (`refusal`) moves nothing, however its RCs look, so it goes after every other. Only
    // the rolls naming one of its RCs are looked at, not every roll: a pass plans every roll.
    let rank = |roll: &StoredRoll, roll_id: &str| {
        let refused = refusal(roll).is_some();
        let not_enabled = !enabled_new_rc(world, roll);
        let waits = !holds_mutation_locks(world, session, roll);
        (refused, not_enabled, waits, roll_id.to_owned())
    };
    let ours = rank(spec, id);
    let first = [&spec.old_rc, &spec.new_rc]
        .into_iter()
        .filter_map(|rc| world.rolls_over(rc))
        .filter_map(|ids| {
            (ids.iter())
                .filter_map(|other| Some(rank(&world.rolls.items.get(other)?.value, other)))
                .filter(|other| *other < ours)
                .min()
        })
        .min();
    if let Some((_, _, _, roll)) = first {
        return Action::Stuck(RollStuck::AnotherRoll { roll });
    }

    // Hold both RCs' mutation locks for the whole roll.
    let mut take = Vec::new();
    for lock in [
        layout::rc_mutation(&spec.old_rc),
        layout::rc_mutation(&spec.new_rc),
    ] {
        match world.lock_holder(&lock) {
            Some(holder) if holder == session => {}
            Some(_) => return Action::Locked(lock),
            None => take.push(lock),
        }
    }
    if !take.is_empty() {
        return Action::TakeLocks(take);
    }

    // P2's enable step: the old RC disabled (its pods are then replaced or removed by
    // whichever RC farm owns it), the new one enabled.
    if !enabled_new_rc(world, spec) {
        let new_counts = count(world, &spec.new_rc, &new.value);
        // Enabling a disabled new RC whose pods are not its count would make its farm add or
        // remove pods outside the roll's steps (P2's check). An enabled one short of its count
        // (the old RC holds the nodes it would take) would, once the old RC is disabled, take
        // the old pods it is short of at once, whatever the roll's minimum.
        let out_of_step = match new.value.disabled {
            true => new_counts.current() != new_counts.desired,
            false => new_counts.current() < new_counts.desired,
        };
        if out_of_step {
            return Action::Stuck(RollStuck::NewRcOutOfStep {
                pods: new_counts.current(),
                desired: new_counts.desired,
                disabled: new.value.disabled,
            });
        }
        let rcs = [(old, true), (new, false)]
            .into_iter()
            .filter(|(rc, disabled)| rc.value.disabled != *disabled)
            .map(|(rc, disabled)| RcWrite {
                rc: StoredRc {
                    disabled,
                    ..StoredRc::clone(&rc.value)
                },
                index: rc.index,
            })
            .collect();
        return Action::Write { rcs, step: None };
    }

    let old_counts = count(world, &spec.old_rc, &old.value);
    let new_counts = count(world, &spec.new_rc, &new.value);
    let target = spec.desired_replicas;
    if new_counts.desired >= target {
        if new_counts.current() < target {
            return Action::Wait(RollWait::Placement {
                placed: new_counts.current(),
                target,
            });
        }
        return complete(world, session, spec, old, old_counts, new_counts);
    }
    let old_healthy = old_counts.staying_healthy();
    let new_healthy = new_counts.staying_healthy();
    let (remove, add) = roll_step(
        old_healthy,
        new_healthy,
        old_counts.desired,
        new_counts.desired,
        target,
        spec.minimum_replicas,
    );
    if remove == 0 && add == 0 {
        if new_counts.settling() > 0 {
            return Action::Wait(RollWait::NewPods {
                healthy: new_counts.healthy(),
                desired: new_counts.desired,
            });
        }
        if old_counts.settling() > 0 {
            return Action::Wait(RollWait::OldPods {
                settling: old_counts.settling(),
            });
        }
        if let Some(wait) = new_pod_removal(new_counts) {
            return wait;
        }
        // The old RC's pods beyond its count, which a step counts on none of, are going:
        // the roll waits for them rather than alert, unless they stay.
        if let Some(wait) = old_pod_removal(world, session, spec, old_counts) {
            return wait;
        }
        if spec.minimum_replicas >= target {
            return Action::Stuck(RollStuck::MinimumEqualsDesired {
                minimum: spec.minimum_replicas,
                desired: target,
            });
        }
        return Action::Stuck(RollStuck::NoHealthyHeadroom {
            old_healthy,
            new_healthy,
            minimum: spec.minimum_replicas,
        });
    }
    if new_counts.desired > 0 && !spec.roll_delay.is_zero() {
        // As in P2, the delay runs from when the roll could step again (the last step's new
        // pods healthy, when the minimum needs them), not from the last step: the pods are
        // seen healthy for a whole delay, however long they took to start, before the next
        // step. Not knowing since when (a new term), wait one whole delay.
        let due = ready_since.unwrap_or(now).after(spec.roll_delay);
        if now.instant < due.instant {
            return Action::Delay(due);
        }
    }
    let mut old_rc = StoredRc::clone(&old.value);
    let mut new_rc = StoredRc::clone(&new.value);
    old_rc.replicas_desired = (old_rc.replicas_desired - remove).max(0);
    // The step counts a negative count P2's tools stored as none.
    new_rc.replicas_desired = new_rc.replicas_desired.max(0) + add;
    Action::Write {
        rcs: vec![
            RcWrite {
                rc: old_rc,
                index: old.index,
            },
            RcWrite {
                rc: new_rc,
                index: new.index,
            },
        ],
        step: Some((remove, add)),
    }
}

/// Why the farm will not carry out `spec` at all, whatever the store holds, if it will not:
/// it takes no lock for it and writes nothing of it, so no other roll waits for it.
fn refusal(spec: &StoredRoll) -> Option<RollStuck> {
    // Disabling the old RC and enabling the new one would undo each other, on every pass.
    if spec.old_rc == spec.new_rc {
        return Some(RollStuck::SameRc);
    }
    // P2's `schedule-update` stores any counts. Taken as given, a negative target is met at
    // once, and retiring the old RC then takes every one of its pods down.
    let problems = spec.validate().err()?;
    let problems = problems.iter().map(ToString::to_string).collect::<Vec<_>>();
    Some(RollStuck::InvalidCounts {
        problems: problems.join("; "),
    })
}

/// Whether `world` shows `spec` past its enable step (P2's first write of a roll): its old RC
/// disabled and its new one enabled, as a roll under way leaves them whichever term wrote it.
fn enabled_new_rc(world: &World, spec: &StoredRoll) -> bool {
    let (old, new) = (
        world.rcs.items().get(&spec.old_rc),
        world.rcs.items().get(&spec.new_rc),
    );
    spec.old_rc != spec.new_rc
        && old.is_some_and(|old| old.value.disabled)
        && new.is_some_and(|new| !new.value.disabled)
}

/// Whether the term (`session`) holds both of `spec`'s RCs' mutation locks, which it takes
/// for a roll before its first write and keeps until the roll ends.
fn holds_mutation_locks(world: &World, session: &str, spec: &StoredRoll) -> bool {
    [&spec.old_rc, &spec.new_rc]
        .into_iter()
        .all(|rc| world.lock_holder(&layout::rc_mutation(rc)) == Some(session))
}

/// The wait for the new RC's pods beyond its count (it was scaled down), which a step
/// counts none of and may be the healthy ones: its RC farm, whichever it is, removes them,
/// the new RC being enabled.
fn new_pod_removal(new_counts: Counts) -> Option<Action> {
    let remaining = new_counts.beyond_count();
    (remaining > 0).then_some(Action::Wait(RollWait::NewPodRemoval { remaining }))
}

/// The wait for the old RC's pods beyond its count, unless they stay ([`old_pods_kept`]).
fn old_pod_removal(
    world: &World,
    session: &str,
    spec: &StoredRoll,
    old_counts: Counts,
) -> Option<Action> {
    let remaining = old_counts.beyond_count();
    (remaining > 0 && !old_pods_kept(world, session, spec))
        .then_some(Action::Wait(RollWait::OldPodRemoval { remaining }))
}

/// Whether the old RC's pods beyond its count stay: our RC farm removes a rolling disabled
/// RC's, P2's (another session owning the old RC) never does.
fn old_pods_kept(world: &World, session: &str, spec: &StoredRoll) -> bool {
    let owner = world.lock_holder(&layout::rc_ownership(&spec.old_rc));
    owner.is_some_and(|owner| owner != session)
}

/// The new RC has its replicas: retire the old RC (unless `leave_old`) and the roll.
fn complete(
    world: &World,
    session: &str,
    spec: &StoredRoll,
    old: &Shared<StoredRc>,
    old_counts: Counts,
    new_counts: Counts,
) -> Action {
    if spec.leave_old {
        // The old RC stays at the count the steps left it. Its pods beyond that (those the
        // new RC did not replace in place) go only while the roll holds its mutation lock:
        // once the roll ends, the disabled RC changes nothing and they would run for good.
        // Another RC farm leaves them anyway, and the roll ends as P2's does.
        if let Some(wait) = old_pod_removal(world, session, spec, old_counts) {
            return wait;
        }
        return Action::Finish { retire_old: None };
    }
    if old_counts.desired != 0 {
        // Retiring removes every old pod at once: the new ones alone must keep the minimum,
        // as for a step that moves everything left (a roll to fewer replicas than the old
        // RC wants leaves it some).
        if new_counts.staying_healthy() < spec.minimum_replicas {
            if new_counts.settling() > 0 {
                return Action::Wait(RollWait::NewPods {
                    healthy: new_counts.healthy(),
                    desired: new_counts.desired,
                });
            }
            if let Some(wait) = new_pod_removal(new_counts) {
                return wait;
            }
            return Action::Stuck(RollStuck::NoHealthyHeadroom {
                old_healthy: old_counts.staying_healthy(),
                new_healthy: new_counts.staying_healthy(),
                minimum: spec.minimum_replicas,
            });
        }
        let retired = StoredRc {
            replicas_desired: 0,
            ..StoredRc::clone(&old.value)
        };
        return Action::Retire(Box::new(RcWrite {
            rc: retired,
            index: old.index,
        }));
    }
    if old_counts.current() > 0 {
        if old_pods_kept(world, session, spec) {
            return Action::Stuck(RollStuck::OldPodsKept {
                remaining: old_counts.current(),
                target: spec.desired_replicas,
            });
        }
        return Action::Wait(RollWait::OldPodRemoval {
            remaining: old_counts.current(),
        });
    }
    Action::Finish {
        retire_old: Some(old.index),
    }
}

impl RollFarm {
    /// Carries out `action` for roll `id`; returns whether the roll goes on (and when to run
    /// again if it waits on time) or was ended.
    async fn apply(
        &mut self,
        ctx: &FarmContext,
        world: &World,
        id: &str,
        roll: &Shared<StoredRoll>,
        action: Action,
        now: Moment,
    ) -> Result<Applied, Failure> {
        let spec = &roll.value;
        let fence = layout::roll_ownership(id);
        // Only a roll that keeps being able to step keeps counting towards its delay; a step
        // that did not land is tried again without a new delay.
        if !matches!(
            action,
            Action::Delay(_) | Action::Write { step: Some(_), .. }
        ) {
            self.ready_since.remove(id);
        }
        match action {
            Action::Wait(_) => {}
            Action::RcMissing(_) => {
                let ending = ending_for_missing_rc(ctx, world, id, roll).await;
                let Some(ops) = ending.map_err(Failure::Read)? else {
                    return Ok(Applied::Unseen);
                };
                tracing::warn!(roll = %id, "an RC of the roll is gone; deleting the roll");
                ctx.commit(&fence, ops).await.map_err(Failure::Write)?;
                return Ok(Applied::Ended);
            }
            Action::Locked(lock) => {
                tracing::info!(roll = %id, %lock, "an RC of the roll is locked by someone else");
            }
            Action::TakeLocks(locks) => {
                // Noted before the commit, so that one whose outcome is unknown is looked at too.
                self.mutation_locks.extend(locks.iter().cloned());
                let take = locks
                    .into_iter()
                    .map(|key| TxnOp::Lock {
                        key,
                        value: ctx.holder.as_bytes().to_vec(),
                        session: ctx.session.clone(),
                    })
                    .collect();
                ctx.commit(&fence, take).await.map_err(Failure::Write)?;
            }
            Action::Retire(write) => {
                self.write_rcs(ctx, world, id, roll, &[*write]).await?;
            }
            Action::Write { rcs, step } => {
                self.write_rcs(ctx, world, id, roll, &rcs).await?;
                if let Some((remove, add)) = step {
                    self.ready_since.remove(id);
                    let desired = |rc: &str| {
                        rcs.iter()
                            .find(|w| w.rc.id == rc)
                            .map_or(0, |w| w.rc.replicas_desired)
                    };
                    tracing::info!(roll = %id, remove, add, old = desired(&spec.old_rc),
                                   new = desired(&spec.new_rc), "roll step");
                }
            }
            Action::Delay(due) => {
                self.ready_since.entry(id.to_owned()).or_insert(now);
                return Ok(Applied::Going(Some(due.instant)));
            }
            Action::Stuck(why) => stuck(ctx, id, spec, why.message()).await,
            Action::Finish { retire_old } => {
                let ops = finish_ops(ctx, world, id, roll, retire_old, RollOutcome::Succeeded)
                    .await
                    .map_err(Failure::Read)?;
                ctx.commit(&fence, ops).await.map_err(Failure::Write)?;
                tracing::info!(roll = %id, "roll complete");
                return Ok(Applied::Ended);
            }
        }
        Ok(Applied::Going(None))
    }

    /// Writes roll `id`'s RCs as `rcs` says, each at the index it was read at, with the
    /// records of each change (a step, the enable step or the old RC's retirement alike): in
    /// one transaction, or one per RC, in order, when both RCs' documents (their manifests)
    /// are more than a transaction carries, as the store would refuse that write on every
    /// pass and the roll never move. The old RC comes first, and either write alone is safe:
    /// a step's removal keeps the minimum without the pods it adds, the old RC is disabled
    /// before the new one is enabled, and the next pass plans from whatever landed (the first
    /// landing alone is [`Failure::PartlyWritten`], which the roll's conditions say).
    async fn write_rcs(
        &self,
        ctx: &FarmContext,
        world: &World,
        id: &str,
        roll: &Shared<StoredRoll>,
        rcs: &[RcWrite],
    ) -> Result<(), Failure> {
        let mut writes = Vec::with_capacity(rcs.len());
        for write in rcs {
            let ops = self.rc_write_ops(ctx, world, write).await;
            writes.push(ops.map_err(Failure::Read)?);
        }
        let fenced = |ops: Vec<TxnOp>| {
            let mut all = roll_checks(ctx, id, roll);
            all.extend(ops);
            all
        };
        let together = fenced(writes.iter().flatten().cloned().collect());
        let lock = layout::roll_ownership(id);
        if ctx.fits(&lock, &together) {
            ctx.commit(&lock, together).await.map_err(Failure::Write)?;
            return Ok(());
        }
        let mut landed = None;
        for (write, ops) in rcs.iter().zip(writes) {
            if let Err(error) = ctx.commit(&lock, fenced(ops)).await {
                return Err(match landed {
                    None => Failure::Write(error),
                    Some(landed) => Failure::PartlyWritten { landed, error },
                });
            }
            landed = Some(match write.rc.id == roll.value.old_rc {
                true => "the old RC",
                false => "the new RC",
            });
        }
        Ok(())
    }

    /// The ops writing one RC of a roll with the records of its change.
    async fn rc_write_ops(
        &self,
        ctx: &FarmContext,
        world: &World,
        write: &RcWrite,
    ) -> FarmResult<Vec<TxnOp>> {
        let mut ops = vec![RcStore::write_op(&write.rc, write.index)];
        if let Some(before) = world.rcs.items().get(&write.rc.id) {
            let store = RcStore::new(ctx.store.clone());
            let actor = ctx.actor(FARM);
            ops.extend(
                store
                    .updated_ops(&before.value, write.index, &write.rc, &actor, &self.mirror)
                    .await?,
            );
        }
        Ok(ops)
    }
}

/// Ops that make a write of roll `id`'s RCs hold only while the roll is still the one read
/// (a roll cancelled since leaves both RCs at their counts of the moment, as its finished
/// record shows them, although this session holds its locks until the next pass) and this
/// session holds both RCs' mutation locks.
fn roll_checks(ctx: &FarmContext, id: &str, roll: &Shared<StoredRoll>) -> Vec<TxnOp> {
    let spec = &roll.value;
    let mut ops = vec![TxnOp::CheckIndex {
        key: layout::roll(id),
        index: roll.index,
    }];
    ops.extend(
        [&spec.old_rc, &spec.new_rc]
            .into_iter()
            .map(|rc| TxnOp::CheckSession {
                key: layout::rc_mutation(rc),
                session: ctx.session.clone(),
            }),
    );
    ops
}

/// What `action` is doing with the roll, for its conditions; none for the ending of a
/// roll whose new RC has its pods, which ends it (an ended roll keeps no conditions) or
/// fails (which its conditions show, [`doing`]). An ending for RCs the world lacks shows
/// only if the store holds them, as the wait for the world to show them.
fn activity(action: &Action, spec: &StoredRoll) -> Option<RollActivity> {
    Some(match action {
        Action::Wait(wait) => RollActivity::Waiting(wait.clone()),
        Action::RcMissing(rcs) => RollActivity::Waiting(RollWait::UnseenRc { rcs: rcs.clone() }),
        Action::Locked(lock) => {
            RollActivity::Stuck(RollStuck::MutationLockHeld { lock: lock.clone() })
        }
        Action::TakeLocks(_) => RollActivity::TakingLocks,
        Action::Write { rcs, step: Some(_) } => {
            let desired = |rc: &str| {
                rcs.iter()
                    .find(|w| w.rc.id == rc)
                    .map_or(0, |w| w.rc.replicas_desired)
            };
            RollActivity::Stepping {
                old: desired(&spec.old_rc),
                new: desired(&spec.new_rc),
            }
        }
        Action::Write { step: None, .. } => RollActivity::Enabling,
        Action::Retire(_) => RollActivity::RetiringOld,
        Action::Delay(due) => RollActivity::Delaying {
            delay: spec.roll_delay,
            until: due.wall,
        },
        Action::Stuck(stuck) => RollActivity::Stuck(stuck.clone()),
        Action::Finish { .. } => return None,
    })
}

/// What the farm does with `action`, whose `activity` its conditions show if it goes
/// through (none: the roll's ending), as the conditions say it of an attempt that failed,
/// or may have.
fn doing(action: &Action, activity: Option<&RollActivity>) -> String {
    match (action, activity) {
        (Action::RcMissing(rcs), _) => ending_for_missing_rcs(rcs),
        (_, Some(activity)) => activity.doing(),
        (_, None) => ending_completed_roll(),
    }
}

/// What a roll's conditions say of `doing` when carrying it out failed: that a read it
/// needed failed, that its write failed, or, for a write whose answer was lost, that it may
/// have landed (the next pass, from a world caught up with the store, sees whether it did).
fn failed(doing: String, failure: &Failure) -> RollActivity {
    match failure {
        Failure::Read(e) => RollActivity::ReadFailed {
            doing,
            error: e.to_string(),
        },
        Failure::Write(e) if e.is_outcome_unknown() => RollActivity::OutcomeUnknown {
            doing,
            error: e.to_string(),
        },
        Failure::Write(e) => RollActivity::Failed {
            doing,
            error: e.to_string(),
        },
        Failure::PartlyWritten { landed, error } => RollActivity::PartlyWritten {
            doing,
            landed,
            error: error.to_string(),
            outcome_unknown: error.is_outcome_unknown(),
        },
    }
}

/// A roll's replica counts, both RCs': any change of them is progress.
fn progress_mark(world: &World, spec: &StoredRoll) -> Vec<i64> {
    [&spec.old_rc, &spec.new_rc]
        .into_iter()
        .filter_map(|id| Some((id, &world.rcs.items().get(id)?.value)))
        .flat_map(|(id, rc)| {
            let counts = count(world, id, rc);
            [counts.desired, counts.current(), counts.healthy()]
        })
        .collect()
}

impl RollFarm {
    /// Why an RC of `spec` that `world` lacks is not gone, if it is not: the mirror holds
    /// its document, which cannot be decoded (and the store, asked before the roll is
    /// ended, answers the same).
    fn unreadable_rc(&self, world: &World, spec: &StoredRoll) -> Option<RollStuck> {
        [&spec.old_rc, &spec.new_rc].into_iter().find_map(|rc| {
            if world.rcs.items().contains_key(rc) {
                return None;
            }
            match &self.mirror.get(&layout::rc(rc))?.view {
                View::Unreadable(why) => Some(RollStuck::RcUnreadable {
                    rc: rc.clone(),
                    why: why.to_string(),
                }),
                _ => None,
            }
        })
    }

    /// Publishes roll `id`'s conditions for `activity`; a roll newly stalled is logged, and
    /// a stalled one alerted (the alerter keeps repeats apart). Returns when the roll stalls
    /// if it has not yet.
    async fn publish(
        &self,
        ctx: &FarmContext,
        world: &World,
        id: &str,
        roll: &Shared<StoredRoll>,
        activity: &RollActivity,
    ) -> FarmResult<Option<Instant>> {
        // The record of an earlier roll over the same new RC, not yet removed, is none of
        // this roll's: neither its transition times nor how long it stood still.
        let previous = self.conditions.previous(id).filter(|p| p.is_of(roll.index));
        let was_stalled = previous.as_ref().is_some_and(|p| {
            p.conditions
                .iter()
                .any(|c| c.condition_type == "Stalled" && c.status == ConditionStatus::True)
        });
        let now = SystemTime::now();
        let (observed, progress) = roll_conditions(
            activity,
            progress_mark(world, &roll.value),
            previous.as_ref().and_then(|p| p.progress.as_ref()),
            self.stall_deadline,
            now,
        );
        let stalled = observed
            .iter()
            .find(|c| c.condition_type == "Stalled" && c.status == ConditionStatus::True)
            .map(|c| c.message.clone());
        let still = now.duration_since(progress.at()).unwrap_or_default();
        let stalls_at = self
            .stall_deadline
            .checked_sub(still)
            .map(|left| Instant::now() + left);
        if let Some(record) = changed_from(previous, observed, roll.index, Some(progress)) {
            // Written only while the roll is the one read: a record of a roll gone since (its
            // ending landed though its answer was lost, or it was cancelled) would outlive it
            // until the stale records' cleanup.
            let still = TxnOp::CheckIndex {
                key: layout::roll(id),
                index: roll.index,
            };
            let lock = layout::roll_ownership(id);
            ctx.commit(&lock, vec![still, self.conditions.put_op(id, &record)])
                .await?;
        }
        let Some(why) = stalled else {
            return Ok(stalls_at);
        };
        if !was_stalled {
            tracing::warn!(roll = %id, "roll stalled: {why}");
        }
        let details = json!({"roll_id": id, "old_rc": roll.value.old_rc,
                             "new_rc": roll.value.new_rc, "hostname": ctx.holder});
        ctx.alert(
            FARM,
            (ObjectKind::Rolls, id),
            &format!("roll_stalled/{id}"),
            format!("roll {id} stalled: {why}"),
            details,
        )
        .await;
        Ok(None)
    }
}

/// Ops that end a roll: release the mutation locks this session holds, delete the old RC
/// at `retire_old` (when given), the roll and its labels, with P2's completion audit record,
/// and this server's finished record of the roll (its progress as the farm last saw it)
/// and events.
/// The roll is deleted at the index the farm read, which also makes the next pass wait until
/// the rolls tree shows it gone rather than try to end it again.
async fn finish_ops(
    ctx: &FarmContext,
    world: &World,
    id: &str,
    roll: &Shared<StoredRoll>,
    retire_old: Option<u64>,
    outcome: RollOutcome,
) -> FarmResult<Vec<TxnOp>> {
    let spec = &roll.value;
    let actor = ctx.actor(FARM);
    let rcs = RcStore::new(ctx.store.clone());
    // A delete-cas succeeds on an absent key: the check makes a roll deleted since (cancelled
    // through the API) a conflict rather than a second ending.
    let mut ops = vec![
        TxnOp::CheckIndex {
            key: layout::roll(id),
            index: roll.index,
        },
        TxnOp::DeleteCas {
            key: layout::roll(id),
            index: roll.index,
        },
    ];
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
        let before = world.rcs.items().get(&spec.old_rc).map(|rc| &*rc.value);
        ops.extend(rcs.deleted_ops(&spec.old_rc, before, &actor).await?);
    }
    // The records carry the labels the delete removes, as a cancel's do: read at an index
    // the transaction checks.
    let labels = LabelStore::new(ctx.store.clone())
        .get(LabelType::Rolls, id)
        .await?;
    ops.push(LabelStore::unchanged_op(LabelType::Rolls, id, labels.index));
    let labels = labels.value;
    ops.extend(RollStore::delete_ops(id));
    let progress = |rc_id: &str| {
        world
            .rcs
            .items()
            .get(rc_id)
            .map_or_else(RcProgress::default, |rc| {
                let counts = count(world, rc_id, &rc.value);
                RcProgress::new(Some(counts.desired), counts.pods)
            })
    };
    let progress = RollProgress {
        old: progress(&spec.old_rc),
        new: progress(&spec.new_rc),
    };
    let message = (outcome == RollOutcome::Failed)
        .then(|| "an RC of the roll was deleted before the roll finished".to_owned());
    let finished = RollStore::new(ctx.store.clone())
        .finished_ops(spec, &labels, outcome, progress, &actor, message)
        .await?;
    ops.extend(finished);
    let succeeded = outcome == RollOutcome::Succeeded;
    let record = AuditRecord::ru_completion(id, &labels, succeeded, !succeeded, SystemTime::now());
    ops.push(TxnOp::Set {
        key: layout::new_audit_log(),
        value: record.to_json(),
    });
    Ok(ops)
}

/// Ops that end roll `id` as failed for an RC of it that the store does not hold, or `None`
/// when the store holds both: the RC tree may simply not show an RC written with the roll
/// yet. The ending holds only while the RCs the store did not hold are still absent, so that
/// none written since the farm asked is left without its roll. An RC stored but that cannot
/// be decoded is held: it fails the read ([`FarmError::Unusable`]), as the roll's conditions
/// say (`RcUnreadable`), only when the roll's other RC is held too.
async fn ending_for_missing_rc(
    ctx: &FarmContext,
    world: &World,
    id: &str,
    roll: &Shared<StoredRoll>,
) -> FarmResult<Option<Vec<TxnOp>>> {
    let store = RcStore::new(ctx.store.clone());
    let mut absent = Vec::new();
    let mut unreadable = None;
    for rc in [&roll.value.old_rc, &roll.value.new_rc] {
        match store.get(rc).await {
            Ok(Some(_)) => {}
            Ok(None) => absent.push(TxnOp::CheckNotExists {
                key: layout::rc(rc),
            }),
            Err(StoreError::Invalid(why)) => unreadable = unreadable.or(Some(why)),
            Err(e) => return Err(e.into()),
        }
    }
    if absent.is_empty() {
        return match unreadable {
            Some(why) => Err(FarmError::Unusable(why)),
            None => Ok(None),
        };
    }
    let mut ops = finish_ops(ctx, world, id, roll, None, RollOutcome::Failed).await?;
    ops.extend(absent);
    Ok(Some(ops))
}

/// Raises the alert that roll `id` cannot move on its own, and why.
async fn stuck(ctx: &FarmContext, id: &str, spec: &StoredRoll, why: String) {
    let details = json!({"roll_id": id, "old_rc": spec.old_rc, "new_rc": spec.new_rc,
                         "hostname": ctx.holder});
    let description = format!("roll {id} cannot move: {why}");
    ctx.alert(FARM, (ObjectKind::Rolls, id), id, description, details)
        .await;
}

impl RollFarm {
    /// Releases the RC mutation locks this term took for rolls that are gone (a cancelled
    /// roll leaves both RCs free for API writes again). One the mirror shows free or held by
    /// another session is only forgotten: a finished roll deleted it. A failure is logged and
    /// returned, for the farm to try again ([`super::TIDYING`]).
    async fn release_stale_mutation_locks(
        &mut self,
        ctx: &FarmContext,
        world: &World,
    ) -> FarmResult<()> {
        if self.mutation_locks.is_empty() {
            return Ok(());
        }
        let rolling: HashSet<String> = world
            .rolls
            .items
            .values()
            .flat_map(|r| [&r.value.old_rc, &r.value.new_rc])
            .map(|rc| layout::rc_mutation(rc.as_str()))
            .collect();
        let stale: Vec<String> = self
            .mutation_locks
            .iter()
            .filter(|key| !rolling.contains(*key))
            .cloned()
            .collect();
        let mut released = Ok(());
        for key in stale {
            if world.lock_holder(&key) == Some(ctx.session.as_str()) {
                if let Err(e) = ctx.release_lock(&key).await {
                    tracing::warn!(%key, error = %e, "releasing a roll lock failed");
                    released = Err(e);
                    continue;
                }
            }
            self.mutation_locks.remove(&key);
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::farms::fixture::{rc, Fleet, HELLO_1, HELLO_2};
    use crate::farms::world::pod_key;
    use crate::model::conditions::Condition;
    use crate::model::HealthState;
    use crate::store::Versioned;
    use std::time::UNIX_EPOCH;

    const OLD: &str = "00000000-0000-4000-8000-000000000001";
    const NEW: &str = "00000000-0000-4000-8000-000000000002";
    const ME: &str = "my-session";

    fn roll(target: i64, min: i64) -> StoredRoll {
        StoredRoll {
            old_rc: OLD.into(),
            new_rc: NEW.into(),
            desired_replicas: target,
            minimum_replicas: min,
            leave_old: false,
            roll_delay: Duration::ZERO,
        }
    }

    /// A running roll (locks held, old RC disabled, new enabled): the old RC wants
    /// `old_desired` and has `old_healthy` healthy pods, the rest critical; likewise the new.
    fn rolling(old_desired: i64, old_healthy: i64, new_desired: i64, new_healthy: i64) -> Fleet {
        let mut fleet = Fleet::new();
        let mut old = rc(OLD, HELLO_1, old_desired, "");
        old.disabled = true;
        fleet
            .put_rc(old, 10)
            .put_rc(rc(NEW, HELLO_2, new_desired, ""), 11);
        let mut node = 0;
        for (id, desired, healthy) in [
            (OLD, old_desired, old_healthy),
            (NEW, new_desired, new_healthy),
        ] {
            for i in 0..desired {
                node += 1;
                let health = if i < healthy {
                    HealthState::Passing
                } else {
                    HealthState::Critical
                };
                fleet.rc_pod(id, &format!("n{node}"), Some(health));
            }
        }
        fleet
            .lock(&layout::rc_mutation(OLD), ME)
            .lock(&layout::rc_mutation(NEW), ME);
        fleet
    }

    fn run(fleet: &Fleet, spec: &StoredRoll) -> Action {
        run_as(fleet, &spec.new_rc, spec)
    }

    /// The plan of `spec` stored as the roll `id`.
    fn run_as(fleet: &Fleet, id: &str, spec: &StoredRoll) -> Action {
        plan(&fleet.world(), ME, id, spec, None, Moment::now())
    }

    /// A step's `(remove, add)` and the counts it writes, `(old, new)`.
    type Step = ((i64, i64), (i64, i64));

    /// The step `action` is, or the action when it is no step.
    fn step(action: Action) -> Result<Step, Action> {
        match action {
            Action::Write {
                rcs,
                step: Some(step),
            } => Ok((
                step,
                (rcs[0].rc.replicas_desired, rcs[1].rc.replicas_desired),
            )),
            other => Err(other),
        }
    }

    #[test]
    fn steps_follow_the_roll_algorithm_table() {
        // (old healthy, new healthy, target, min, old desired, new desired) -> (remove, add)
        let cases = [
            (1, 1, 4, 3, 3, 1, (0, 0)),
            (1, 1, 4, 2, 3, 1, (0, 0)),
            (2, 2, 6, 3, 4, 2, (1, 1)),
            (1, 3, 6, 3, 3, 3, (3, 3)),
            (3, 0, 6, 0, 6, 0, (6, 6)),
            (1, 1, 3, 1, 1, 2, (1, 1)),
            (0, 0, 3, 2, 0, 0, (0, 1)),
        ];
        for (old, new, target, min, old_desired, new_desired, (remove, add)) in cases {
            let fleet = rolling(old_desired, old, new_desired, new);
            let action = run(&fleet, &roll(target, min));
            let case = format!("old {old} new {new} target {target} min {min}");
            if (remove, add) == (0, 0) {
                assert!(matches!(action, Action::Stuck(_)), "{case}: {action:?}");
            } else {
                let written = ((old_desired - remove).max(0), new_desired + add);
                assert_eq!(step(action), Ok(((remove, add), written)), "{case}");
            }
        }
    }

    /// An RC's count is whatever P2's tools stored, any i64: a roll over one is planned
    /// without overflowing, and a negative one is read as none and written as at least none.
    #[test]
    fn counts_p2_stored_at_i64s_ends_are_planned_over() {
        let extremes = [i64::MIN, -1, 0, 3, i64::MAX];
        for old_desired in extremes {
            for new_desired in extremes {
                // The new RC's pod healthy, or not reporting yet (settling).
                for (target, min, reporting) in
                    [(4, 1, true), (4, 3, true), (0, 0, true), (3, 3, false)]
                {
                    let mut fleet = rolling(3, 3, 1, 1);
                    let mut old = rc(OLD, HELLO_1, old_desired, "");
                    old.disabled = true;
                    fleet
                        .put_rc(old, 12)
                        .put_rc(rc(NEW, HELLO_2, new_desired, ""), 13);
                    if !reporting {
                        fleet.health.remove(&pod_key("n4", "hello"));
                    }
                    let action = run(&fleet, &roll(target, min));
                    let case = format!("od={old_desired} nd={new_desired} t={target} m={min}");
                    match step(action) {
                        Ok((_, (old, new))) => assert!(old >= 0 && new >= 0, "{case}"),
                        // What the roll's condition will say of it.
                        Err(Action::Wait(wait)) => drop(wait.message()),
                        Err(Action::Stuck(stuck)) => drop(stuck.message()),
                        Err(_) => {}
                    }
                }
            }
        }
    }

    #[test]
    fn a_blocked_roll_waits_without_alerting_while_pods_are_settling() {
        let mut fleet = rolling(3, 1, 1, 1);
        fleet.health.remove(&pod_key("n2", "hello"));
        assert!(matches!(run(&fleet, &roll(4, 3)), Action::Wait(_)));
        // A pod whose node does not run the RC's manifest yet is settling too.
        let mut fleet = rolling(3, 1, 1, 1);
        fleet.reality.insert(pod_key("n4", "hello"), HELLO_1.into());
        assert!(matches!(run(&fleet, &roll(4, 3)), Action::Wait(_)));
    }

    #[test]
    fn a_blocked_roll_says_exactly_why() {
        // Every old pod healthy, but the minimum leaves no room for a step.
        assert_eq!(
            run(&rolling(3, 3, 0, 0), &roll(3, 3)),
            Action::Stuck(RollStuck::MinimumEqualsDesired {
                minimum: 3,
                desired: 3
            })
        );
        // A critical old pod leaves no room above a lower minimum either.
        assert_eq!(
            run(&rolling(3, 2, 0, 0), &roll(3, 2)),
            Action::Stuck(RollStuck::NoHealthyHeadroom {
                old_healthy: 2,
                new_healthy: 0,
                minimum: 2
            })
        );
        // A new pod still starting is waited for, and counted.
        let mut fleet = rolling(2, 2, 1, 0);
        fleet.health.remove(&pod_key("n3", "hello"));
        assert_eq!(
            run(&fleet, &roll(3, 2)),
            Action::Wait(RollWait::NewPods {
                healthy: 0,
                desired: 1
            })
        );
    }

    #[test]
    fn a_pod_passing_on_another_manifest_is_not_healthy() {
        // The new RC's pod passes, but its node still runs the old manifest.
        let mut fleet = rolling(2, 2, 1, 1);
        fleet.reality.insert(pod_key("n3", "hello"), HELLO_1.into());
        assert_eq!(
            count(&fleet.world(), NEW, &fleet.rcs[NEW].value).healthy(),
            0
        );
        // 2 old healthy against a minimum of 2: no headroom until the new pod is real.
        assert!(matches!(run(&fleet, &roll(3, 2)), Action::Wait(_)));
    }

    #[test]
    fn takes_free_mutation_locks_and_stops_at_anothers() {
        let mut fleet = rolling(2, 2, 0, 0);
        fleet.locks.clear();
        assert_eq!(
            run(&fleet, &roll(2, 1)),
            Action::TakeLocks(vec![layout::rc_mutation(OLD), layout::rc_mutation(NEW)])
        );
        fleet.lock(&layout::rc_mutation(NEW), "someone-else");
        assert_eq!(
            run(&fleet, &roll(2, 1)),
            Action::Locked(layout::rc_mutation(NEW))
        );
    }

    /// Two rolls over one RC (which no creation makes, but a write of the roll tree can):
    /// P2 runs each under a session of its own, so one waits on the other's mutation lock.
    /// This farm holds every roll's locks in one session, so a lock it holds for one roll
    /// must not let the other take the same RC's replicas too.
    #[test]
    fn of_two_rolls_over_one_rc_one_goes_at_a_time() {
        const THIRD: &str = "00000000-0000-4000-8000-000000000003";
        let mut fleet = rolling(2, 2, 0, 0);
        fleet.put_rc(rc(THIRD, HELLO_2, 0, ""), 12);
        let first = roll(2, 1);
        let second = StoredRoll {
            new_rc: THIRD.into(),
            ..roll(2, 1)
        };
        for (id, spec) in [(NEW, &first), (THIRD, &second)] {
            fleet.put_roll(id, spec.clone(), 20);
        }
        fleet.lock(&layout::rc_mutation(THIRD), ME);
        assert!(step(run(&fleet, &first)).is_ok());
        assert_eq!(
            run(&fleet, &second),
            Action::Stuck(RollStuck::AnotherRoll { roll: NEW.into() }),
            "the second roll takes the old RC's replicas too"
        );
    }

    /// Two rolls stored under different ids over one new RC (a write of the roll tree can
    /// store a roll under an id other than its new RC's): the one whose id sorts first goes
    /// on alone, as for any two rolls sharing an RC, not both, each taking the new RC's
    /// replicas as its own.
    #[test]
    fn of_two_rolls_to_one_new_rc_under_other_ids_one_goes_at_a_time() {
        const THIRD: &str = "00000000-0000-4000-8000-000000000003";
        const FIRST: &str = "00000000-0000-4000-9000-000000000001";
        const SECOND: &str = "00000000-0000-4000-9000-000000000002";
        let mut fleet = rolling(2, 2, 0, 0);
        let mut third = rc(THIRD, HELLO_1, 2, "");
        third.disabled = true;
        fleet.put_rc(third, 12);
        for node in ["n8", "n9"] {
            fleet.rc_pod(THIRD, node, Some(HealthState::Passing));
        }
        fleet.lock(&layout::rc_mutation(THIRD), ME);
        let first = roll(2, 1);
        let second = StoredRoll {
            old_rc: THIRD.into(),
            ..roll(2, 1)
        };
        for (id, spec) in [(FIRST, &first), (SECOND, &second)] {
            fleet.put_roll(id, spec.clone(), 20);
        }
        assert!(step(run_as(&fleet, FIRST, &first)).is_ok());
        assert_eq!(
            run_as(&fleet, SECOND, &second),
            Action::Stuck(RollStuck::AnotherRoll { roll: FIRST.into() }),
            "the second roll moves replicas into the same new RC too"
        );
    }

    /// A roll written over an RC that a running roll moves (by a tool that does not check,
    /// as P2's), whose id sorts first: the running roll, which holds its RCs' mutation locks,
    /// goes on, and the newcomer waits for it, rather than stop it midway.
    #[test]
    fn a_roll_written_over_a_running_roll_waits_for_it_whatever_its_id() {
        const NEWCOMER: &str = "00000000-0000-4000-7000-000000000001";
        let mut fleet = rolling(2, 1, 1, 1);
        fleet.put_rc(rc(NEWCOMER, HELLO_2, 0, ""), 12);
        let running = roll(2, 1);
        let newcomer = StoredRoll {
            new_rc: NEWCOMER.into(),
            ..roll(2, 1)
        };
        for (id, spec) in [(NEW, &running), (NEWCOMER, &newcomer)] {
            fleet.put_roll(id, spec.clone(), 20);
        }
        let going = run(&fleet, &running);
        assert!(step(going.clone()).is_ok(), "the running roll: {going:?}");
        assert_eq!(
            run(&fleet, &newcomer),
            Action::Stuck(RollStuck::AnotherRoll { roll: NEW.into() }),
            "the newcomer takes the running roll's old RC's replicas too"
        );
    }

    /// The same after a failover: the new term holds no mutation lock yet, neither the running
    /// roll's nor the newcomer's, but the store shows which roll is under way (its old RC
    /// disabled and its new one enabled), and that one takes its locks and goes on, the
    /// newcomer, whose id sorts first, waiting for it rather than stop it midway.
    #[test]
    fn after_a_failover_the_running_roll_still_goes_first() {
        const NEWCOMER: &str = "00000000-0000-4000-7000-000000000001";
        let mut fleet = rolling(2, 1, 1, 1);
        for lock in [OLD, NEW] {
            fleet.locks.remove(&layout::rc_mutation(lock));
        }
        let mut third = rc(NEWCOMER, HELLO_2, 0, "");
        third.disabled = true;
        fleet.put_rc(third, 12);
        let running = roll(2, 1);
        let newcomer = StoredRoll {
            new_rc: NEWCOMER.into(),
            ..roll(2, 1)
        };
        for (id, spec) in [(NEW, &running), (NEWCOMER, &newcomer)] {
            fleet.put_roll(id, spec.clone(), 20);
        }
        assert_eq!(
            run(&fleet, &running),
            Action::TakeLocks(vec![layout::rc_mutation(OLD), layout::rc_mutation(NEW)]),
            "the running roll"
        );
        assert_eq!(
            run(&fleet, &newcomer),
            Action::Stuck(RollStuck::AnotherRoll { roll: NEW.into() }),
            "the newcomer"
        );
    }

    /// Of rolls that are each past their enable step and hold their RCs' mutation locks, a
    /// roll waits only for a roll whose id sorts before its own and that names one of its
    /// own RCs (as its old or new RC, under its own id or another), the first such by id;
    /// rolls over other RCs, and those sorting after it, stop it not.
    #[test]
    fn a_roll_waits_for_the_first_earlier_roll_sharing_an_rc() {
        const UNRELATED: &str = "00000000-0000-4000-7000-000000000001";
        const FROM_NEW: &str = "00000000-0000-4000-7000-000000000002";
        const FROM_OLD: &str = "00000000-0000-4000-7000-000000000003";
        const LATER: &str = "00000000-0000-4000-9000-000000000001";
        let mut fleet = rolling(2, 2, 0, 0);
        fleet.put_rc(rc(LATER, HELLO_2, 0, ""), 12);
        let put = |fleet: &mut Fleet, old: &str, new: &str| {
            let spec = StoredRoll {
                old_rc: old.into(),
                new_rc: new.into(),
                ..roll(2, 1)
            };
            fleet.put_roll(new, spec.clone(), 20);
            spec
        };
        let ours = put(&mut fleet, OLD, NEW);
        put(
            &mut fleet,
            "00000000-0000-4000-7000-0000000000ff",
            UNRELATED,
        );
        let later = put(&mut fleet, OLD, LATER);
        assert!(
            step(run(&fleet, &ours)).is_ok(),
            "no earlier roll shares an RC"
        );
        assert_eq!(
            run(&fleet, &later),
            Action::Stuck(RollStuck::AnotherRoll { roll: NEW.into() })
        );

        // Past their enable steps as well, with their locks held: alike but for their ids.
        put(&mut fleet, OLD, FROM_OLD);
        fleet.put_rc(rc(FROM_OLD, HELLO_2, 0, ""), 13);
        let mut disabled = rc(FROM_NEW, HELLO_1, 0, "");
        disabled.disabled = true;
        fleet.put_rc(disabled, 14);
        let over_new = StoredRoll {
            old_rc: FROM_NEW.into(),
            ..roll(2, 1)
        };
        let stored = Versioned {
            value: over_new,
            index: 20,
        };
        fleet.rolls.insert(FROM_NEW.into(), stored);
        fleet
            .lock(&layout::rc_mutation(FROM_OLD), ME)
            .lock(&layout::rc_mutation(FROM_NEW), ME);
        assert_eq!(
            run(&fleet, &ours),
            Action::Stuck(RollStuck::AnotherRoll {
                roll: FROM_NEW.into()
            })
        );
        assert_eq!(
            run(&fleet, &later),
            Action::Stuck(RollStuck::AnotherRoll {
                roll: FROM_OLD.into()
            })
        );
    }

    /// A roll the farm refuses to carry out (invalid counts, or one RC as both its old and
    /// its new RC) moves nothing, so no roll waits for it, however its RCs look and whatever
    /// its id: a valid roll over the same old RC, its locks taken and its enable step next,
    /// goes on, and the refused roll says why it does not.
    #[test]
    fn a_roll_the_farm_cannot_carry_out_does_not_go_first() {
        const REFUSED: &str = "00000000-0000-4000-7000-000000000001";
        let valid = roll(2, 1);
        let refused = [
            (
                StoredRoll {
                    new_rc: REFUSED.into(),
                    ..roll(2, 3)
                },
                "invalid counts",
            ),
            (
                StoredRoll {
                    new_rc: OLD.into(),
                    ..roll(2, 1)
                },
                "the same RC",
            ),
        ];
        for (spec, case) in refused {
            let mut fleet = rolling(2, 2, 0, 0);
            // The valid roll took its locks; its new RC is still disabled.
            fleet.rcs.get_mut(NEW).unwrap().value.disabled = true;
            // The refused roll's new RC is enabled, its old RC disabled: past its enable
            // step, as the store shows it.
            fleet.put_rc(rc(REFUSED, HELLO_2, 0, ""), 12);
            fleet.put_roll(NEW, valid.clone(), 20);
            fleet.put_roll(REFUSED, spec.clone(), 20);
            let action = run(&fleet, &valid);
            assert!(
                matches!(action, Action::Write { step: None, .. }),
                "the valid roll, beside a roll of {case}: {action:?}"
            );
            let action = run_as(&fleet, REFUSED, &spec);
            assert!(
                matches!(
                    action,
                    Action::Stuck(RollStuck::InvalidCounts { .. } | RollStuck::SameRc)
                ),
                "the roll of {case}: {action:?}"
            );
        }
    }

    /// A roll naming one RC as both its old and its new RC (P2's `schedule-update` makes one
    /// when given the same id twice; the API refuses it) cannot move: disabling the old RC
    /// and enabling the new one are the same write undone, which would go on every pass.
    #[test]
    fn a_roll_from_an_rc_to_itself_does_not_flip_it() {
        let mut fleet = rolling(2, 2, 0, 0);
        fleet.rcs.remove(NEW);
        let spec = StoredRoll {
            new_rc: OLD.into(),
            ..roll(2, 1)
        };
        for disabled in [false, true] {
            fleet.rcs.get_mut(OLD).unwrap().value.disabled = disabled;
            let action = run(&fleet, &spec);
            assert!(
                !matches!(action, Action::Write { .. }),
                "the RC (disabled: {disabled}) is written: {action:?}"
            );
        }
    }

    /// Counts P2's `schedule-update` stores unchecked move nothing, not even the enable step.
    #[test]
    fn a_roll_of_invalid_counts_is_stuck() {
        let fleet = rolling(2, 2, 0, 0);
        for (target, min) in [(-1, 0), (2, -1), (2, 3)] {
            let action = run(&fleet, &roll(target, min));
            assert!(
                matches!(action, Action::Stuck(RollStuck::InvalidCounts { .. })),
                "target {target} min {min}: {action:?}"
            );
        }
    }

    #[test]
    fn a_missing_rc_is_reported() {
        let mut fleet = rolling(2, 2, 0, 0);
        fleet.rcs.remove(OLD);
        assert_eq!(
            run(&fleet, &roll(2, 1)),
            Action::RcMissing(vec![OLD.into()])
        );
        // Both, when both are missing.
        fleet.rcs.remove(NEW);
        let both = Action::RcMissing(vec![OLD.into(), NEW.into()]);
        assert_eq!(run(&fleet, &roll(2, 1)), both);
    }

    #[test]
    fn the_enable_step_disables_the_old_rc_and_enables_the_new() {
        let mut fleet = rolling(2, 2, 0, 0);
        fleet.rcs.get_mut(OLD).unwrap().value.disabled = false;
        fleet.rcs.get_mut(NEW).unwrap().value.disabled = true;
        let Action::Write { rcs, step: None } = run(&fleet, &roll(2, 1)) else {
            panic!("no enable step");
        };
        let written: Vec<(&str, bool, u64)> = rcs
            .iter()
            .map(|w| (w.rc.id.as_str(), w.rc.disabled, w.index))
            .collect();
        assert_eq!(written, [(OLD, true, 10), (NEW, false, 11)]);

        // A disabled new RC whose pods do not match its count is not enabled.
        fleet.rcs.get_mut(NEW).unwrap().value.replicas_desired = 1;
        assert!(matches!(run(&fleet, &roll(2, 1)), Action::Stuck(_)));

        // Nor is the old RC disabled while an enabled new RC is short of its count: it would
        // take the old pods it is short of at once.
        fleet.rcs.get_mut(NEW).unwrap().value.disabled = false;
        assert_eq!(
            run(&fleet, &roll(2, 1)),
            Action::Stuck(RollStuck::NewRcOutOfStep {
                pods: 0,
                desired: 1,
                disabled: false
            })
        );
    }

    #[test]
    fn a_step_after_the_first_waits_for_the_roll_delay() {
        let fleet = rolling(2, 2, 1, 1);
        let mut spec = roll(4, 1);
        spec.roll_delay = Duration::from_secs(30);
        let last = Moment::now();
        let now = last.after(Duration::from_secs(10));
        let world = fleet.world();
        assert_eq!(
            plan(&world, ME, NEW, &spec, None, now),
            Action::Delay(now.after(spec.roll_delay)),
            "a new term waits one whole delay"
        );
        assert_eq!(
            plan(&world, ME, NEW, &spec, Some(last), now),
            Action::Delay(last.after(spec.roll_delay))
        );
        let due = plan(
            &world,
            ME,
            NEW,
            &spec,
            Some(last),
            last.after(spec.roll_delay),
        );
        assert!(step(due).is_ok());
        // The first step does not wait.
        let fleet = rolling(2, 2, 0, 0);
        assert!(step(plan(&fleet.world(), ME, NEW, &spec, None, now)).is_ok());
    }

    /// As in P2, `roll_delay` is a pause between a roll becoming able to step and the step,
    /// so new pods are seen healthy for that long before the next step: pods that take
    /// longer than the delay to become healthy are not stepped over the moment they are.
    #[tokio::test]
    async fn the_roll_delay_runs_from_when_the_roll_can_step_again() {
        let (_dir, store, ctx) = term().await;
        let spec = StoredRoll {
            roll_delay: Duration::from_secs(30),
            ..roll(2, 1)
        };
        let seen = store_roll(store.as_ref(), spec.clone()).await;
        let write = store_rcs(store.as_ref(), &ctx).await;
        let mut farm = farm(&store);
        let world = Fleet::new().world();
        let stepped = Moment::now();
        let step = Action::Write {
            rcs: vec![write(OLD, 1), write(NEW, 1)],
            step: Some((1, 1)),
        };
        farm.apply(&ctx, &world, NEW, &seen, step, stepped)
            .await
            .unwrap();
        // The new pod takes longer than the delay to become healthy.
        let waiting = Action::Wait(RollWait::NewPods {
            healthy: 0,
            desired: 1,
        });
        let later = stepped.after(Duration::from_secs(10));
        farm.apply(&ctx, &world, NEW, &seen, waiting, later)
            .await
            .unwrap();
        let healthy = stepped.after(Duration::from_secs(40));
        let fleet = rolling(1, 1, 1, 1);
        let since = farm.ready_since.get(NEW).copied();
        assert_eq!(
            plan(&fleet.world(), ME, NEW, &spec, since, healthy),
            Action::Delay(healthy.after(spec.roll_delay)),
            "the next step must wait a whole delay once the new pod is healthy"
        );
    }

    /// Every pass of one delay publishes the same end, so that the wait's conditions are
    /// written once: the end the first pass recorded the start of, not one from each pass's
    /// own clock readings, which here drift a millisecond either way between the clocks from
    /// a start at x.5 s, where an end converted to the wall clock and rounded to the second
    /// falls on either side.
    #[tokio::test]
    async fn every_pass_of_a_roll_delay_publishes_the_same_end() {
        let (_dir, store, ctx) = term().await;
        let spec = StoredRoll {
            roll_delay: Duration::from_secs(30),
            ..roll(4, 1)
        };
        let seen = store_roll(store.as_ref(), spec.clone()).await;
        let mut farm = farm(&store);
        let world = rolling(2, 2, 1, 1).world();
        let started = Moment {
            instant: Instant::now(),
            wall: UNIX_EPOCH + Duration::from_millis(1_700_000_000_500),
        };
        let millisecond = Duration::from_millis(1);
        let passes = [
            started,
            Moment {
                instant: started.instant + Duration::from_secs(1),
                wall: started.wall + Duration::from_secs(1) - millisecond,
            },
            Moment {
                instant: started.instant + Duration::from_secs(2),
                wall: started.wall + Duration::from_secs(2) + millisecond,
            },
        ];
        let expected = RollActivity::Delaying {
            delay: spec.roll_delay,
            until: started.wall + spec.roll_delay,
        };
        for now in passes {
            let since = farm.ready_since.get(NEW).copied();
            let action = plan(&world, ME, NEW, &spec, since, now);
            assert_eq!(
                activity(&action, &spec),
                Some(expected.clone()),
                "pass at {now:?}"
            );
            farm.apply(&ctx, &world, NEW, &seen, action, now)
                .await
                .unwrap();
        }
    }

    /// A roll to fewer replicas than the old RC wants: its own step leaves the old RC a
    /// replica once the new RC has the target. Retiring that replica must keep the roll's
    /// minimum healthy, as every step does: not while the new pods are not yet healthy.
    #[test]
    fn a_shrinking_roll_does_not_retire_the_old_rc_below_the_minimum() {
        let spec = roll(2, 1);
        // Three healthy old pods, no new one: one step moves the whole target.
        let fleet = rolling(3, 3, 0, 0);
        assert_eq!(step(run(&fleet, &spec)), Ok(((2, 2), (1, 2))));
        // The new RC's two pods are placed (in place of two old ones), not yet healthy; the
        // old RC keeps its one healthy pod, the only one.
        let fleet = rolling(1, 1, 2, 0);
        let action = run(&fleet, &spec);
        assert!(
            !matches!(action, Action::Retire(_)),
            "retiring the old RC now leaves no pod healthy, below the minimum of 1: {action:?}"
        );
    }

    #[test]
    fn completion_retires_the_old_rc_then_finishes() {
        let spec = roll(2, 1);
        // The new RC has its count but not yet its pods.
        let mut fleet = rolling(0, 0, 2, 2);
        fleet.labels.remove(&pod_key("n2", "hello"));
        assert_eq!(
            run(&fleet, &spec),
            Action::Wait(RollWait::Placement {
                placed: 1,
                target: 2
            })
        );

        // The old RC's count goes to 0 first.
        let mut fleet = rolling(1, 1, 2, 2);
        let Action::Retire(write) = run(&fleet, &spec) else {
            panic!("the old RC is not retired");
        };
        assert_eq!((write.rc.id.as_str(), write.rc.replicas_desired), (OLD, 0));

        // Then its pods go: ours are removed by our RC farm; another's never are.
        fleet.rcs.get_mut(OLD).unwrap().value.replicas_desired = 0;
        assert_eq!(
            run(&fleet, &spec),
            Action::Wait(RollWait::OldPodRemoval { remaining: 1 })
        );
        fleet.lock(&layout::rc_ownership(OLD), "p2-rc-farm");
        assert!(matches!(run(&fleet, &spec), Action::Stuck(_)));

        let fleet = rolling(0, 0, 2, 2);
        assert_eq!(
            run(&fleet, &spec),
            Action::Finish {
                retire_old: Some(10)
            }
        );
        let leave_old = StoredRoll {
            leave_old: true,
            ..spec
        };
        let fleet = rolling(1, 1, 2, 2);
        assert_eq!(run(&fleet, &leave_old), Action::Finish { retire_old: None });
    }

    /// The new RC's healthy pods beyond its count (it was scaled down just before the roll,
    /// and its farm has yet to remove them) are going: a step must not count on them to keep
    /// the minimum, as it does not count on the old RC's beyond its count.
    #[test]
    fn a_step_does_not_count_on_new_pods_beyond_the_new_rcs_count() {
        // The old RC wants 5 and has 2 healthy; the new RC wants none and still runs 3.
        let mut fleet = rolling(5, 2, 3, 3);
        fleet.rcs.get_mut(NEW).unwrap().value.replicas_desired = 0;
        let spec = roll(5, 4);
        if let Ok(((remove, add), (_, new_desired))) = step(run(&fleet, &spec)) {
            // At worst the old RC's removal takes healthy pods, and the new RC keeps only
            // its count of its healthy ones.
            let left = (2 - remove) + 3.min(new_desired);
            assert!(
                left >= spec.minimum_replicas,
                "step ({remove}, {add}) leaves {left} healthy against a minimum of {}",
                spec.minimum_replicas
            );
        }
    }

    /// Right after a step, before the RC farms have acted on it, the old RC still runs the
    /// pods the step took from it, and which of them go is not up to health: a second step
    /// must count on no more of its healthy pods than may stay.
    #[test]
    fn a_step_does_not_count_on_old_pods_the_last_step_took() {
        // 4 old pods, 3 healthy; the last step lowered the old RC to 3 and raised the new
        // RC to 1, which has placed nothing yet.
        let mut fleet = rolling(4, 3, 0, 0);
        fleet.rcs.get_mut(OLD).unwrap().value.replicas_desired = 3;
        fleet.rcs.get_mut(NEW).unwrap().value.replicas_desired = 1;
        let spec = roll(4, 2);
        if let Ok(((remove, add), (old_desired, _))) = step(run(&fleet, &spec)) {
            // At worst the old pods that go are healthy ones; no new pod is healthy yet.
            let left = (3 - (4 - old_desired)).max(0);
            assert!(
                left >= spec.minimum_replicas,
                "step ({remove}, {add}) leaves {left} healthy against a minimum of {}",
                spec.minimum_replicas
            );
        }
    }

    /// Right after a step, the old RC's pods beyond its lowered count, which a step counts
    /// on none of, hold the next step back until they go: the roll waits for them, rather
    /// than alert that it is stuck.
    #[test]
    fn a_roll_waits_rather_than_alerts_while_the_old_rcs_surplus_goes() {
        // 4 old pods, 3 healthy, the old RC lowered to 3; the new RC's one pod healthy.
        let mut fleet = rolling(4, 3, 1, 1);
        fleet.rcs.get_mut(OLD).unwrap().value.replicas_desired = 3;
        assert_eq!(
            run(&fleet, &roll(4, 3)),
            Action::Wait(RollWait::OldPodRemoval { remaining: 1 })
        );
        // Another RC farm, owning the old RC, leaves them: the roll is stuck.
        fleet.lock(&layout::rc_ownership(OLD), "another-session");
        assert!(matches!(
            run(&fleet, &roll(4, 3)),
            Action::Stuck(RollStuck::NoHealthyHeadroom { .. })
        ));
    }

    /// The new RC's pods beyond its count (it was scaled down), which a step counts on none
    /// of, are going too, whichever RC farm owns it (it is enabled): the roll waits for them
    /// rather than alert, for the pods that stay may be the healthy ones.
    #[test]
    fn a_roll_waits_rather_than_alerts_while_the_new_rcs_surplus_goes() {
        // The old RC's 3 pods healthy; the new RC wants 1 and runs 2, one of them failing.
        let mut fleet = rolling(3, 3, 1, 1);
        fleet.rc_pod(NEW, "n9", Some(HealthState::Critical));
        fleet.lock(&layout::rc_ownership(NEW), "another-session");
        assert_eq!(
            run(&fleet, &roll(4, 3)),
            Action::Wait(RollWait::NewPodRemoval { remaining: 1 }),
            "the roll alerts while the new RC's farm may yet remove its failing pod"
        );
        // The same at the end, before the old RC is retired.
        let mut fleet = rolling(1, 1, 3, 3);
        fleet.rc_pod(NEW, "n9", Some(HealthState::Critical));
        assert_eq!(
            run(&fleet, &roll(3, 3)),
            Action::Wait(RollWait::NewPodRemoval { remaining: 1 })
        );
    }

    /// A roll that leaves the old RC keeps it at the count its steps left it: its surplus
    /// pods (here on nodes the new RC does not select, so none was replaced in place) go
    /// while the roll holds its mutation lock, for once the roll is over the disabled RC
    /// changes nothing, and they would run beside the new RC's for good.
    #[test]
    fn a_roll_leaving_the_old_rc_waits_for_its_surplus_to_go() {
        let spec = StoredRoll {
            leave_old: true,
            ..roll(2, 1)
        };
        // The step moved 2 of the old RC's 3 replicas: it wants 1 and still runs 3; the new
        // RC runs its 2 elsewhere.
        let mut fleet = rolling(3, 3, 2, 2);
        fleet.rcs.get_mut(OLD).unwrap().value.replicas_desired = 1;
        let action = run(&fleet, &spec);
        assert_eq!(
            action,
            Action::Wait(RollWait::OldPodRemoval { remaining: 2 }),
            "the roll ends with the old RC running 3 pods where it wants 1"
        );
        // Ended, the roll leaves the disabled old RC to no one: its farm removes nothing.
        fleet.locks.clear();
        let world = fleet.world();
        let old = &world.rcs.items()[OLD].value;
        let mut load = crate::farms::rc::Load::of(&world);
        let plan = crate::farms::rc::plan(&world, &mut load, OLD, old).unwrap();
        assert!(plan.changes.is_empty());

        // Once they are gone the roll ends; so it does at once when another RC farm, which
        // leaves a disabled RC's pods in place, owns the old RC, as P2's roll does.
        let mut fleet = rolling(1, 1, 2, 2);
        assert_eq!(run(&fleet, &spec), Action::Finish { retire_old: None });
        let mut kept = rolling(3, 3, 2, 2);
        kept.rcs.get_mut(OLD).unwrap().value.replicas_desired = 1;
        kept.lock(&layout::rc_ownership(OLD), "p2-rc-farm");
        assert_eq!(run(&kept, &spec), Action::Finish { retire_old: None });
        fleet.lock(&layout::rc_ownership(OLD), "p2-rc-farm");
        assert_eq!(run(&fleet, &spec), Action::Finish { retire_old: None });
    }

    /// A farm's context for one term over a fresh embedded store (kept in the directory
    /// returned), holding the ownership lock of the roll `NEW`.
    async fn term() -> (
        tempfile::TempDir,
        std::sync::Arc<dyn crate::kv::KvStore>,
        FarmContext,
    ) {
        use crate::kv::sqlite::SqliteStore;
        use crate::kv::KvStore;
        use std::sync::Arc;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db").display().to_string();
        let store: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
        let (term, ctx) = crate::farms::fixture::term_over(&store, "me").await;
        let fence = layout::roll_ownership(NEW);
        assert!(store.acquire(&fence, b"me", &term.session).await.unwrap());
        (dir, store, ctx)
    }

    /// Stores `spec` as the roll `NEW`; answers it as the farm's world then holds it.
    async fn store_roll(store: &dyn crate::kv::KvStore, spec: StoredRoll) -> Shared<StoredRoll> {
        let key = layout::roll(NEW);
        store
            .put(&key, &spec.to_json(), crate::kv::Cas::Any)
            .await
            .unwrap();
        let index = store.get(&key).await.unwrap().unwrap().modify_index;
        Shared {
            value: std::sync::Arc::new(spec),
            index,
        }
    }

    /// Stores the roll's two RCs (`OLD` with 2 replicas, `NEW` with none) with both mutation
    /// locks held by the term, and answers a write of each at the index stored.
    async fn store_rcs(
        store: &dyn crate::kv::KvStore,
        ctx: &FarmContext,
    ) -> impl Fn(&str, i64) -> RcWrite {
        let mut stored = HashMap::new();
        for (id, manifest, replicas) in [(OLD, HELLO_1, 2), (NEW, HELLO_2, 0)] {
            let written = rc(id, manifest, replicas, "");
            let key = layout::rc(id);
            store
                .put(&key, &written.to_json(), crate::kv::Cas::Any)
                .await
                .unwrap();
            let index = store.get(&key).await.unwrap().unwrap().modify_index;
            stored.insert(id.to_owned(), (written, index));
            let lock = layout::rc_mutation(id);
            assert!(store.acquire(&lock, b"me", &ctx.session).await.unwrap());
        }
        move |id, replicas| {
            let (rc, index) = &stored[id];
            RcWrite {
                rc: StoredRc {
                    replicas_desired: replicas,
                    ..rc.clone()
                },
                index: *index,
            }
        }
    }

    /// The roll farm of a term over `store`.
    fn farm(store: &std::sync::Arc<dyn crate::kv::KvStore>) -> RollFarm {
        use crate::state::{Mirror, MirrorConfig};
        let mirror = Mirror::new(store.clone(), MirrorConfig::default());
        RollFarm::new(Duration::from_secs(600), mirror)
    }

    /// A roll that failed and is gone since (cancelled, say) waits for no retry: the farm's
    /// queue (its queue-depth metric) counts only rolls that exist.
    #[tokio::test]
    async fn a_gone_roll_leaves_no_retry_waiting() {
        let (_dir, ctx, mirror) = crate::farms::fixture::idle_context().await;
        let mut farm = RollFarm::new(Duration::from_secs(600), mirror);
        farm.retries.failed(NEW);
        farm.pass(&ctx, &World::default()).await;
        assert_eq!(farm.retries().waiting(), 0);
    }

    /// A fleet holding roll `NEW` as stored at `index`, its ownership lock held by `ctx`'s
    /// session.
    fn owned_roll(ctx: &FarmContext, index: u64) -> Fleet {
        let mut fleet = Fleet::new();
        let value = roll(2, 1);
        fleet.rolls.insert(NEW.into(), Versioned { value, index });
        fleet.lock(&layout::roll_ownership(NEW), &ctx.session);
        fleet
    }

    /// The conditions stored for roll `NEW`, if any.
    async fn stored_conditions(
        store: &dyn crate::kv::KvStore,
    ) -> Option<crate::model::conditions::ConditionsRecord> {
        let key = layout::conditions(ObjectKind::Rolls, NEW);
        let pair = store.get(&key).await.unwrap()?;
        Some(serde_json::from_slice(&pair.value).unwrap())
    }

    /// The `Progressing` condition stored for the roll.
    async fn stored_progressing(store: &dyn crate::kv::KvStore) -> Condition {
        let record = stored_conditions(store)
            .await
            .expect("no conditions were stored");
        (record.conditions.into_iter())
            .find(|c| c.condition_type == "Progressing")
            .unwrap()
    }

    /// A roll whose RC is gone is ended by the pass that finds it so, which writes it no
    /// conditions: a record written for it then would outlive it, until a later pass.
    #[tokio::test]
    async fn a_roll_ended_for_a_missing_rc_is_left_no_conditions() {
        let (_dir, store, ctx) = term().await;
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let fleet = owned_roll(&ctx, seen.index);
        farm(&store).pass(&ctx, &fleet.world()).await;
        let ended = store.get(&layout::roll(NEW)).await.unwrap().is_none();
        assert!(ended, "the roll was not ended");
        let record = stored_conditions(store.as_ref()).await;
        assert_eq!(record, None, "conditions were written for the ended roll");
    }

    /// A roll gone since the farm read it (cancelled, say) fails its ending, which checks the
    /// roll: no conditions are written for it, which would outlive it until the stale
    /// records' cleanup.
    #[tokio::test]
    async fn a_roll_gone_since_its_ending_was_planned_is_left_no_conditions() {
        let (_dir, store, ctx) = term().await;
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let fleet = owned_roll(&ctx, seen.index);
        let key = layout::roll(NEW);
        let cancel = crate::kv::Cas::Index(seen.index);
        store.delete(&key, cancel).await.unwrap();

        farm(&store).pass(&ctx, &fleet.world()).await;
        let record = stored_conditions(store.as_ref()).await;
        assert_eq!(record, None, "conditions were written for the gone roll");
    }

    /// A roll whose new RC the farm's world does not show yet, though the store holds it (the
    /// RC tree lags the store), goes on: its conditions say that the farm waits to see the
    /// RC, not that the roll is ending.
    #[tokio::test]
    async fn a_roll_over_an_rc_the_world_does_not_show_yet_is_not_published_as_ending() {
        let (_dir, store, ctx) = term().await;
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let write = store_rcs(store.as_ref(), &ctx).await;
        let mut fleet = owned_roll(&ctx, seen.index);
        fleet.put_rc(rc(OLD, HELLO_1, 2, ""), write(OLD, 2).index);

        farm(&store).pass(&ctx, &fleet.world()).await;
        let going = store.get(&layout::roll(NEW)).await.unwrap().is_some();
        assert!(going, "the roll was ended though the store holds both RCs");
        let progressing = stored_progressing(store.as_ref()).await;
        let shown = (progressing.status, progressing.reason.as_str());
        let message = &progressing.message;
        assert_eq!(shown, (ConditionStatus::True, "WaitingForRc"), "{message}");
        assert!(message.contains(NEW), "{message}");
    }

    /// A roll whose two RCs the farm's world lacks, though the store holds both, waits to see
    /// both: its conditions name each RC the world lacks, not only the old one.
    #[tokio::test]
    async fn a_roll_over_two_rcs_the_world_does_not_show_yet_names_both() {
        let (_dir, store, ctx) = term().await;
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let _both_stored = store_rcs(store.as_ref(), &ctx).await;
        let fleet = owned_roll(&ctx, seen.index);

        farm(&store).pass(&ctx, &fleet.world()).await;
        let progressing = stored_progressing(store.as_ref()).await;
        let shown = (progressing.status, progressing.reason.as_str());
        let message = &progressing.message;
        assert_eq!(shown, (ConditionStatus::True, "WaitingForRc"), "{message}");
        for rc in [OLD, NEW] {
            assert!(message.contains(rc), "{rc} is not named: {message}");
        }
    }

    /// A write whose answer was lost may have landed: the roll's conditions say that it is
    /// not known whether it did, not that it failed, as they say of a write that lost to a
    /// change made since the farm looked.
    #[test]
    fn a_write_of_unknown_outcome_is_not_published_as_failed() {
        let lost = StoreError::OutcomeUnknown("the answer was lost".into());
        let conflict = StoreError::conflict("the RC was written since");
        for (error, shown) in [
            (lost, (ConditionStatus::Unknown, "WriteOutcomeUnknown")),
            (conflict, (ConditionStatus::False, "WriteFailed")),
        ] {
            let failure = Failure::Write(FarmError::Store(error));
            let activity = failed(RollActivity::Enabling.doing(), &failure);
            let deadline = Duration::from_secs(600);
            let (observed, _) =
                roll_conditions(&activity, vec![], None, deadline, SystemTime::now());
            let progressing = (observed.iter())
                .find(|c| c.condition_type == "Progressing")
                .unwrap();
            let message = &progressing.message;
            assert_eq!((progressing.status, progressing.reason), shown, "{message}");
        }
    }

    /// A step whose write failed (the old RC was written again since the farm read it) has
    /// not happened: the roll's conditions say that it failed, and why, not that it is under
    /// way.
    #[tokio::test]
    async fn a_step_whose_write_failed_is_not_published_as_under_way() {
        let (_dir, store, ctx) = term().await;
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let write = store_rcs(store.as_ref(), &ctx).await;
        // Both RCs enabled, as before the roll's first step.
        let mut fleet = owned_roll(&ctx, seen.index);
        fleet
            .put_rc(rc(OLD, HELLO_1, 2, ""), write(OLD, 2).index)
            .put_rc(rc(NEW, HELLO_2, 0, ""), write(NEW, 0).index)
            .lock(&layout::rc_mutation(OLD), &ctx.session)
            .lock(&layout::rc_mutation(NEW), &ctx.session);
        let old = layout::rc(OLD);
        let again = rc(OLD, HELLO_1, 2, "").to_json();
        store.put(&old, &again, crate::kv::Cas::Any).await.unwrap();

        farm(&store).pass(&ctx, &fleet.world()).await;
        let pair = store.get(&old).await.unwrap().unwrap();
        let disabled = StoredRc::from_json(&pair.value).unwrap().disabled;
        assert!(!disabled, "the step landed");
        let progressing = stored_progressing(store.as_ref()).await;
        let shown = (progressing.status, progressing.reason.as_str());
        let message = &progressing.message;
        assert_eq!(shown, (ConditionStatus::False, "WriteFailed"), "{message}");
        assert!(
            message.starts_with("disabling the old RC and enabling the new one, which failed ("),
            "{message}"
        );
    }

    /// A write of a roll's RCs too large for one transaction (here the enable step) is two
    /// commits: when the old RC's lands and the new RC's fails (the new RC was written again
    /// since the farm read it), the roll's conditions say that it was partly written, naming
    /// what landed, not that nothing happened.
    #[tokio::test]
    async fn a_write_in_two_commits_of_which_one_landed_says_so() {
        let (_dir, store, ctx) = term().await;
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let large = |version: u8| {
            let blob = "x".repeat(200_000);
            format!("id: hello\nconfig: {{version: {version}, blob: {blob}}}\n")
        };
        let old = rc(OLD, &large(1), 2, "");
        let mut new = rc(NEW, &large(2), 0, "");
        new.disabled = true;
        let mut fleet = owned_roll(&ctx, seen.index);
        for written in [old, new] {
            let key = layout::rc(&written.id);
            let json = written.to_json();
            store.put(&key, &json, crate::kv::Cas::Any).await.unwrap();
            let index = store.get(&key).await.unwrap().unwrap().modify_index;
            let lock = layout::rc_mutation(&written.id);
            assert!(store.acquire(&lock, b"me", &ctx.session).await.unwrap());
            fleet.put_rc(written, index).lock(&lock, &ctx.session);
        }
        // The new RC written again since the farm read it: its write, the second, fails.
        let key = layout::rc(NEW);
        let again = store.get(&key).await.unwrap().unwrap().value;
        store.put(&key, &again, crate::kv::Cas::Any).await.unwrap();

        farm(&store).pass(&ctx, &fleet.world()).await;
        let stored = |id: &str| {
            let store = store.clone();
            let key = layout::rc(id);
            async move {
                let pair = store.get(&key).await.unwrap().unwrap();
                StoredRc::from_json(&pair.value).unwrap().disabled
            }
        };
        assert!(stored(OLD).await, "the old RC's write did not land");
        assert!(stored(NEW).await, "the new RC's write landed");
        let progressing = stored_progressing(store.as_ref()).await;
        let message = &progressing.message;
        assert_eq!(progressing.reason, "PartlyWritten", "{message}");
        assert!(message.contains("the old RC's write landed"), "{message}");
    }

    /// A roll the API cancelled after the farm read it (the cancel's finished record and
    /// `cancelled` event are written) must not be finished again by the farm: its
    /// delete-cas succeeds on the absent roll, so without a check of the roll's index the
    /// farm's commit lands too, recording a second ending (`succeeded`) and overwriting the
    /// finished record's outcome.
    #[tokio::test]
    async fn a_roll_cancelled_since_the_farm_read_it_is_not_finished_again() {
        let (_dir, store, ctx) = term().await;
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let cancel = async {
            let key = layout::roll(NEW);
            let at = crate::kv::Cas::Index(seen.index);
            store.delete(&key, at).await.unwrap();
        };
        assert!(
            !ends_despite(store.as_ref(), &ctx, &seen, cancel).await,
            "the farm finished a roll that was already gone: its commit landed"
        );
    }

    /// A roll's labels changed after the farm read them to end it: its finished record and
    /// P2's completion record (which takes the pod id, zone and cluster from them) would name
    /// labels the roll no longer had, and the change would be deleted unrecorded. The ending
    /// fails instead, for the next pass to read them again.
    #[tokio::test]
    async fn a_roll_whose_labels_changed_since_the_farm_read_them_is_not_ended_with_them() {
        let (_dir, store, ctx) = term().await;
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let labels = layout::labels(LabelType::Rolls, NEW);
        let set = |value: &'static [u8]| {
            let (store, labels) = (store.clone(), labels.clone());
            async move {
                store
                    .put(&labels, value, crate::kv::Cas::Any)
                    .await
                    .unwrap()
            }
        };
        set(br#"{"pod_id":"hello"}"#).await;
        let relabel = set(br#"{"pod_id":"goodbye"}"#);
        assert!(
            !ends_despite(store.as_ref(), &ctx, &seen, relabel).await,
            "the roll was ended with labels it no longer had"
        );
    }

    /// A roll ended for an RC the store did not hold is not ended once the RC is written
    /// after the farm asked: the roll would be gone from over an RC that exists.
    #[tokio::test]
    async fn a_roll_is_not_ended_for_an_rc_written_since_the_store_was_asked() {
        let (_dir, store, ctx) = term().await;
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let world = Fleet::new().world();
        let ops = ending_for_missing_rc(&ctx, &world, NEW, &seen).await;
        let ops = ops.unwrap().expect("the store holds neither RC");
        let written = rc(NEW, HELLO_2, 0, "").to_json();
        let key = layout::rc(NEW);
        store
            .put(&key, &written, crate::kv::Cas::Any)
            .await
            .unwrap();
        let committed = ctx.commit(&layout::roll_ownership(NEW), ops).await;
        assert!(
            committed.is_err(),
            "the roll was ended over an RC stored since"
        );
        let going = store.get(&layout::roll(NEW)).await.unwrap().is_some();
        assert!(going, "the roll is gone");
    }

    /// A roll over an RC that cannot be decoded and one that is gone can end: when its
    /// ending fails (here a mutation lock the world shows held is not), its conditions say
    /// that the ending failed, not that the roll can neither move nor end.
    #[tokio::test]
    async fn a_failed_ending_over_an_unreadable_rc_is_published_as_failed() {
        use crate::state::{Mirror, MirrorConfig};
        use tokio_util::sync::CancellationToken;
        use tokio_util::task::TaskTracker;

        let (_dir, store, ctx) = term().await;
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let key = layout::rc(OLD);
        store
            .put(&key, b"not an RC", crate::kv::Cas::Any)
            .await
            .unwrap();
        let mirror = Mirror::new(store.clone(), MirrorConfig::default());
        let cancel = CancellationToken::new();
        mirror.start(&TaskTracker::new(), cancel.clone());
        mirror.loaded().await;
        let mut fleet = owned_roll(&ctx, seen.index);
        fleet.lock(&layout::rc_mutation(NEW), &ctx.session);

        let mut farm = RollFarm::new(Duration::from_secs(600), mirror);
        farm.pass(&ctx, &fleet.world()).await;
        cancel.cancel();
        let going = store.get(&layout::roll(NEW)).await.unwrap().is_some();
        assert!(going, "the ending landed though a check of it fails");
        let progressing = stored_progressing(store.as_ref()).await;
        let shown = (progressing.status, progressing.reason.as_str());
        let message = &progressing.message;
        assert_eq!(shown, (ConditionStatus::False, "WriteFailed"), "{message}");
    }

    /// A stored roll, owned by the returned context's term, whose labels that context cannot
    /// read (the store it writes through fails every read of them).
    async fn a_roll_whose_labels_cannot_be_read() -> (
        tempfile::TempDir,
        std::sync::Arc<dyn crate::kv::KvStore>,
        FarmContext,
        Shared<StoredRoll>,
    ) {
        use crate::kv::sqlite::SqliteStore;
        use crate::kv::KvStore;
        use std::sync::Arc;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db").display().to_string();
        let store: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let failing: Arc<dyn KvStore> = Arc::new(crate::farms::fixture::FailingGet {
            inner: store.clone(),
            key: layout::labels(LabelType::Rolls, NEW),
        });
        let (term, ctx) = crate::farms::fixture::term_over(&failing, "me").await;
        let fence = layout::roll_ownership(NEW);
        assert!(store.acquire(&fence, b"me", &term.session).await.unwrap());
        (dir, store, ctx, seen)
    }

    /// A roll whose ending failed because a read it needed did (here of the roll's labels),
    /// not because its write did, is published as a failed read: nothing was written.
    #[tokio::test]
    async fn an_ending_whose_read_failed_is_published_as_a_failed_read() {
        let (_dir, store, ctx, seen) = a_roll_whose_labels_cannot_be_read().await;
        let fleet = owned_roll(&ctx, seen.index);

        farm(&store).pass(&ctx, &fleet.world()).await;
        let going = store.get(&layout::roll(NEW)).await.unwrap().is_some();
        assert!(
            going,
            "the roll was ended though a read for its ending failed"
        );
        let progressing = stored_progressing(store.as_ref()).await;
        let shown = (progressing.status, progressing.reason.as_str());
        let message = &progressing.message;
        assert_eq!(shown, (ConditionStatus::False, "ReadFailed"), "{message}");
        let ending = ending_for_missing_rcs(&[OLD.into(), NEW.into()]);
        assert!(message.starts_with(&ending), "{message}");
    }

    /// A roll written over the old RC of a running roll (by a tool that does not check, as
    /// P2's), under an id that sorts first: in one pass over both, the running roll, which
    /// holds its RCs' mutation locks, takes its step, and the newcomer is published waiting
    /// for it, naming it.
    #[tokio::test]
    async fn a_running_roll_steps_and_a_roll_written_over_it_is_published_waiting() {
        const NEWCOMER: &str = "00000000-0000-4000-7000-000000000001";
        let (_dir, store, ctx) = term().await;
        let running = store_roll(store.as_ref(), roll(2, 1)).await;
        let newcomer = StoredRoll {
            new_rc: NEWCOMER.into(),
            ..roll(2, 1)
        };
        let key = layout::roll(NEWCOMER);
        (store.put(&key, &newcomer.to_json(), crate::kv::Cas::Any))
            .await
            .unwrap();
        let newcomer_index = store.get(&key).await.unwrap().unwrap().modify_index;
        let fence = layout::roll_ownership(NEWCOMER);
        assert!(store.acquire(&fence, b"me", &ctx.session).await.unwrap());

        let mut fleet = Fleet::new();
        let mut old = rc(OLD, HELLO_1, 2, "");
        old.disabled = true;
        let mut third = rc(NEWCOMER, HELLO_2, 0, "");
        third.disabled = true;
        for written in [old, rc(NEW, HELLO_2, 1, ""), third] {
            let key = layout::rc(&written.id);
            let json = written.to_json();
            store.put(&key, &json, crate::kv::Cas::Any).await.unwrap();
            let index = store.get(&key).await.unwrap().unwrap().modify_index;
            fleet.put_rc(written, index);
        }
        for id in [OLD, NEW] {
            let lock = layout::rc_mutation(id);
            assert!(store.acquire(&lock, b"me", &ctx.session).await.unwrap());
            fleet.lock(&lock, &ctx.session);
        }
        fleet
            .rc_pod(OLD, "n1", Some(HealthState::Passing))
            .rc_pod(OLD, "n2", Some(HealthState::Critical))
            .rc_pod(NEW, "n3", Some(HealthState::Passing));
        for (id, spec, index) in [
            (NEW, roll(2, 1), running.index),
            (NEWCOMER, newcomer, newcomer_index),
        ] {
            fleet
                .rolls
                .insert(id.into(), Versioned { value: spec, index });
            fleet.lock(&layout::roll_ownership(id), &ctx.session);
        }

        farm(&store).pass(&ctx, &fleet.world()).await;
        let progressing = |id: &str| {
            let store = store.clone();
            let key = layout::conditions(ObjectKind::Rolls, id);
            async move {
                let pair = store.get(&key).await.unwrap().expect("no conditions");
                let record: crate::model::conditions::ConditionsRecord =
                    serde_json::from_slice(&pair.value).unwrap();
                (record.conditions.into_iter())
                    .find(|c| c.condition_type == "Progressing")
                    .unwrap()
            }
        };
        let going = progressing(NEW).await;
        let message = &going.message;
        assert_eq!(
            going.reason, "ReplicasMoving",
            "the running roll: {message}"
        );
        let pair = store.get(&layout::rc(OLD)).await.unwrap().unwrap();
        let stepped = StoredRc::from_json(&pair.value).unwrap().replicas_desired;
        assert_eq!(
            stepped, 1,
            "the old RC's count after the running roll's step"
        );
        let waiting = progressing(NEWCOMER).await;
        let message = &waiting.message;
        assert_eq!(waiting.reason, "AnotherRoll", "the newcomer: {message}");
        assert!(message.starts_with(&format!("roll {NEW} ")), "{message}");
    }

    /// The ending of a roll whose new RC has its pods shows only when it fails: here a read
    /// it needed (of the roll's labels), published as that read failing while ending it.
    #[tokio::test]
    async fn a_completed_roll_whose_ending_failed_says_what_it_was_doing() {
        let (_dir, store, ctx, seen) = a_roll_whose_labels_cannot_be_read().await;
        let fence = layout::roll_ownership(NEW);
        let mut fleet = rolling(0, 0, 2, 2);
        let index = seen.index;
        (fleet.rolls).insert(
            NEW.into(),
            Versioned {
                value: roll(2, 1),
                index,
            },
        );
        fleet
            .lock(&fence, &ctx.session)
            .lock(&layout::rc_mutation(OLD), &ctx.session)
            .lock(&layout::rc_mutation(NEW), &ctx.session);
        let world = fleet.world();
        let planned = plan(&world, &ctx.session, NEW, &roll(2, 1), None, Moment::now());
        assert!(matches!(planned, Action::Finish { .. }), "{planned:?}");

        farm(&store).pass(&ctx, &world).await;
        let progressing = stored_progressing(store.as_ref()).await;
        let shown = (progressing.status, progressing.reason.as_str());
        let message = &progressing.message;
        assert_eq!(shown, (ConditionStatus::False, "ReadFailed"), "{message}");
        assert!(message.starts_with(&ending_completed_roll()), "{message}");
    }

    /// A roll over an RC that cannot be decoded and one that is gone ends, whichever of the
    /// two is gone; over two stored RCs, one of which cannot be decoded, it does not.
    #[tokio::test]
    async fn a_roll_over_an_unreadable_rc_ends_once_its_other_rc_is_gone() {
        for (unreadable, gone) in [(OLD, Some(NEW)), (NEW, Some(OLD)), (OLD, None)] {
            let (_dir, store, ctx) = term().await;
            let seen = store_roll(store.as_ref(), roll(2, 1)).await;
            let key = layout::rc(unreadable);
            store
                .put(&key, b"not an RC", crate::kv::Cas::Any)
                .await
                .unwrap();
            let readable = [OLD, NEW].into_iter().find(|rc| *rc != unreadable).unwrap();
            if gone.is_none() {
                let written = rc(readable, HELLO_1, 2, "").to_json();
                let key = layout::rc(readable);
                store
                    .put(&key, &written, crate::kv::Cas::Any)
                    .await
                    .unwrap();
            }
            let world = Fleet::new().world();
            let ending = ending_for_missing_rc(&ctx, &world, NEW, &seen).await;
            let case = format!("{unreadable} unreadable, {gone:?} gone");
            match gone {
                Some(_) => assert!(matches!(ending, Ok(Some(_))), "{case}: {ending:?}"),
                None => assert!(ending.is_err(), "{case}: {ending:?}"),
            }
        }
    }

    /// Whether roll `seen` ends, its finished record kept, when `meanwhile` happens after the
    /// farm built the ending and before it commits it.
    async fn ends_despite(
        store: &dyn crate::kv::KvStore,
        ctx: &FarmContext,
        seen: &Shared<StoredRoll>,
        meanwhile: impl std::future::Future<Output = ()>,
    ) -> bool {
        let world = Fleet::new().world();
        let ops = finish_ops(ctx, &world, NEW, seen, None, RollOutcome::Succeeded)
            .await
            .unwrap();
        meanwhile.await;
        let committed = ctx.commit(&layout::roll_ownership(NEW), ops).await;
        let history = store.get(&layout::roll_history(NEW)).await.unwrap();
        assert_eq!(committed.is_ok(), history.is_some());
        committed.is_ok()
    }

    /// A cancelled roll leaves both RCs at their counts of the moment (its finished record
    /// shows them): a step or a retirement the farm planned from the roll before the cancel
    /// must not land after it, although the farm still holds the roll's locks until its
    /// next pass.
    #[tokio::test]
    async fn a_roll_cancelled_since_the_farm_read_it_moves_no_replica() {
        let (_dir, store, ctx) = term().await;
        let seen = store_roll(store.as_ref(), roll(2, 1)).await;
        let write = store_rcs(store.as_ref(), &ctx).await;
        // Cancelled through the API meanwhile.
        let key = layout::roll(NEW);
        store
            .delete(&key, crate::kv::Cas::Index(seen.index))
            .await
            .unwrap();
        let planned = [
            Action::Write {
                rcs: vec![write(OLD, 1), write(NEW, 1)],
                step: Some((1, 1)),
            },
            Action::Retire(Box::new(write(OLD, 0))),
        ];
        let mut farm = farm(&store);
        let world = Fleet::new().world();
        for action in planned {
            let at = format!("{action:?}");
            let applied = farm
                .apply(&ctx, &world, NEW, &seen, action, Moment::now())
                .await;
            assert!(applied.is_err(), "landed after the cancel: {at}");
        }
        for (id, replicas) in [(OLD, 2), (NEW, 0)] {
            let pair = store.get(&layout::rc(id)).await.unwrap().unwrap();
            let stored = StoredRc::from_json(&pair.value).unwrap();
            assert_eq!(stored.replicas_desired, replicas, "RC {id}");
        }
    }
}
