//! Status conditions: which conditions hold for an RC, a roll or a daemon set, given what its
//! farm saw in one pass, and the record the farms keep of them.
//!
//! They follow the Kubernetes API conventions for conditions: a `type`, a `status` of
//! `True`, `False` or `Unknown`, a `reason` (one CamelCase word a program can match on), a
//! `message` (the sentence for a human), the time the status last changed, and the modify
//! index of the document they were computed from. The field names are snake_case like the
//! rest of this API. Pure: the farms gather the facts, these functions name the conditions.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::duration::format_duration;
use super::timestamp::format_rfc3339;
use ConditionStatus::{False, True, Unknown};

/// Whether a condition holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum ConditionStatus {
    True,
    False,
    /// The farm cannot tell (e.g. a disabled RC's nodes are not looked at).
    Unknown,
}

/// One condition of an object, as shown in its view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Condition {
    /// `Ready`, `Progressing`, `Degraded` (RCs); `Progressing`, `Stalled` (rolls);
    /// `Progressing`, `Blocked`, `Contended` (daemon sets).
    #[serde(rename = "type")]
    pub condition_type: String,
    pub status: ConditionStatus,
    /// Why, as one CamelCase word, e.g. `TooFewEligibleNodes`.
    #[schema(example = "TooFewEligibleNodes")]
    pub reason: String,
    /// Why, as a sentence, e.g. `2 of 5 desired nodes match the selector`.
    pub message: String,
    /// When `status` last changed (RFC 3339).
    #[schema(format = DateTime)]
    pub last_transition_time: String,
    /// The modify index of the object's document the condition was computed from.
    pub observed_index: u64,
}

impl Condition {
    /// Whether it was computed for the object whose document was written at `written`,
    /// rather than for an earlier object under the same key (a roll deleted and created
    /// again over the same new RC), whose record stays until a farm replaces or removes it.
    pub fn is_of(&self, written: u64) -> bool {
        self.observed_index >= written
    }
}

/// A condition as one pass finds it, before it is stamped with times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub condition_type: &'static str,
    pub status: ConditionStatus,
    pub reason: &'static str,
    pub message: String,
}

impl Observed {
    fn new(
        condition_type: &'static str,
        status: ConditionStatus,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Observed {
        Observed {
            condition_type,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// What the farms store per object beside P2's documents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionsRecord {
    pub conditions: Vec<Condition>,
    /// Rolls only: the last progress, kept here so that a new leader knows how long a roll
    /// has been standing still.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
}

impl ConditionsRecord {
    /// Whether it was computed for the object whose document was written at `written`
    /// ([`Condition::is_of`]).
    pub fn is_of(&self, written: u64) -> bool {
        self.conditions.iter().all(|c| c.is_of(written))
    }
}

/// A roll's last progress: the counts it had then, and when (milliseconds since the epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub mark: Vec<i64>,
    pub at_unix_ms: u64,
}

impl Progress {
    fn new(mark: Vec<i64>, now: SystemTime) -> Progress {
        let at_unix_ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Progress { mark, at_unix_ms }
    }

    /// When it was.
    pub fn at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.at_unix_ms)
    }
}

/// Turns what a pass observed into conditions: a condition whose status is unchanged keeps
/// its transition time from `previous`, so that only real changes change the record.
pub fn stamp(
    previous: &[Condition],
    observed: Vec<Observed>,
    index: u64,
    now: SystemTime,
) -> Vec<Condition> {
    observed
        .into_iter()
        .map(|o| {
            let since = previous
                .iter()
                .find(|c| c.condition_type == o.condition_type && c.status == o.status)
                .map_or_else(|| format_rfc3339(now), |c| c.last_transition_time.clone());
            Condition {
                condition_type: o.condition_type.to_owned(),
                status: o.status,
                reason: o.reason.to_owned(),
                message: o.message,
                last_transition_time: since,
                observed_index: index,
            }
        })
        .collect()
}

/// "1 pod", "2 pods".
fn pods(n: impl Into<i64>) -> String {
    match n.into() {
        1 => "1 pod".to_owned(),
        n => format!("{n} pods"),
    }
}

/// What the RC farm saw of one RC in a pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RcFacts {
    pub desired: i64,
    pub disabled: bool,
    /// A roll holds its mutation lock (a disabled RC then still gives up its surplus).
    pub rolling: bool,
    /// Why the node selector cannot be used (a sentence), if it cannot.
    pub selector_error: Option<String>,
    /// Nodes the selector matches.
    pub eligible: usize,
    /// When the RC cannot have all its pods: how many it can have (the nodes it is on plus
    /// the eligible nodes free for it).
    pub available: Option<usize>,
    /// Pods labelled with the RC's id.
    pub current: usize,
    /// Of those, pods running the RC's manifest and passing.
    pub healthy: usize,
    /// Pod changes the farm makes in this pass (placements, removals, rewrites).
    pub changes: usize,
    /// Whether the farm moves a pod off an ineligible node in this pass.
    pub transfer: bool,
}

/// An RC's `Ready`, `Progressing` and `Degraded` conditions.
pub fn rc_conditions(f: &RcFacts) -> Vec<Observed> {
    let desired = f.desired.max(0);
    let ready = if f.current as i64 == desired && f.healthy as i64 >= desired {
        Observed::new(
            "Ready",
            True,
            "AllReplicasHealthy",
            format!("{} of {desired} desired pods are healthy", f.healthy),
        )
    } else {
        Observed::new(
            "Ready",
            False,
            "ReplicasNotReady",
            format!(
                "{} of {desired} desired pods are healthy ({} placed)",
                f.healthy,
                pods(f.current as i64)
            ),
        )
    };

    let degraded = if let Some(error) = &f.selector_error {
        Observed::new("Degraded", True, "InvalidNodeSelector", error.clone())
    } else if f.disabled && !f.rolling {
        Observed::new(
            "Degraded",
            Unknown,
            "Disabled",
            "the RC is disabled, so its nodes are not looked at",
        )
    } else if (f.eligible as i64) < desired {
        Observed::new(
            "Degraded",
            True,
            "TooFewEligibleNodes",
            format!(
                "{} of {desired} desired nodes match the selector",
                f.eligible
            ),
        )
    } else if let Some(available) = f.available.filter(|a| (*a as i64) < desired) {
        Observed::new(
            "Degraded",
            True,
            "TooFewFreeNodes",
            format!(
                "{} nodes match the selector but only {available} of the {desired} desired can run the pod: the others run the same pod id for another owner",
                f.eligible
            ),
        )
    } else {
        Observed::new(
            "Degraded",
            False,
            "EnoughNodes",
            format!(
                "{} nodes match the selector for {desired} desired pods",
                f.eligible
            ),
        )
    };

    let progressing = if degraded.reason == "InvalidNodeSelector" {
        Observed::new(
            "Progressing",
            False,
            "InvalidNodeSelector",
            degraded.message.clone(),
        )
    } else if f.transfer {
        Observed::new(
            "Progressing",
            True,
            "NodeTransfer",
            "moving a pod off a node the selector no longer matches",
        )
    } else if f.changes > 0 {
        Observed::new(
            "Progressing",
            True,
            "PodsChanging",
            format!("placing, removing or updating {}", pods(f.changes as i64)),
        )
    } else if f.disabled && !f.rolling {
        Observed::new(
            "Progressing",
            False,
            "Disabled",
            "the RC is disabled, so it changes no pods",
        )
    } else if degraded.status == True {
        Observed::new(
            "Progressing",
            False,
            "TooFewNodes",
            format!(
                "every pod that can be placed is placed: {}",
                degraded.message
            ),
        )
    } else if ready.status == False {
        Observed::new(
            "Progressing",
            True,
            "WaitingForHealthyPods",
            format!(
                "waiting for {} to become healthy: {}",
                pods(f.current.saturating_sub(f.healthy) as i64),
                ready.message
            ),
        )
    } else {
        Observed::new(
            "Progressing",
            False,
            "Complete",
            "every desired pod is placed with the RC's manifest and healthy",
        )
    };
    vec![ready, progressing, degraded]
}

/// What a roll waits for while it cannot take a step, which should come on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollWait {
    /// The new RC's pods are starting: `healthy` of its `desired` pass.
    NewPods { healthy: i64, desired: i64 },
    /// The old RC's pods are starting or have no health result.
    OldPods { settling: i64 },
    /// The new RC has its count; its RC farm has placed `placed` of the `target` pods.
    Placement { placed: i64, target: i64 },
    /// The old RC's farm still has `remaining` pods beyond the old RC's count to remove: the
    /// pods a step took, which the next step counts none of, or at the end those beyond the
    /// count a roll leaving the old RC left it (else 0).
    OldPodRemoval { remaining: i64 },
    /// The new RC's farm still has `remaining` pods beyond the new RC's count (it was scaled
    /// down) to remove, which a step counts none of.
    NewPodRemoval { remaining: i64 },
    /// The store holds the roll's RCs `rcs` (one, or both), which the farm's view of the
    /// store does not show yet: the roll is planned once it does.
    UnseenRc { rcs: Vec<String> },
}

/// Why a roll cannot move at all until something outside it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollStuck {
    /// `minimum_replicas` equals (or exceeds) `desired_replicas`: the roll replaces pods
    /// rather than adding extra ones, so any step would go below the minimum.
    MinimumEqualsDesired { minimum: i64, desired: i64 },
    /// Too few healthy pods for a step to keep the minimum, and none is still starting.
    NoHealthyHeadroom {
        old_healthy: i64,
        new_healthy: i64,
        minimum: i64,
    },
    /// The new RC is disabled with pods that do not match its count, or enabled with fewer
    /// pods than its count.
    NewRcOutOfStep {
        pods: i64,
        desired: i64,
        disabled: bool,
    },
    /// The old RC's remaining pods are on an RC farm (another session) that leaves them.
    OldPodsKept { remaining: i64, target: i64 },
    /// Another session holds this mutation lock of the roll's RCs.
    MutationLockHeld { lock: String },
    /// Another roll over one of its RCs goes first: the one under way (past its enable step,
    /// its old RC disabled and new one enabled, else holding its RCs' mutation locks), or, of
    /// two alike, the one whose id sorts first; never one stuck for `SameRc` or
    /// `InvalidCounts`, which moves nothing.
    AnotherRoll { roll: String },
    /// The roll names one RC as both its old and its new RC.
    SameRc,
    /// An RC of the roll is stored but cannot be decoded (`why`): the roll neither moves
    /// nor ends.
    RcUnreadable { rc: String, why: String },
    /// The roll's counts are not a roll's (stored by a tool that does not check them, as
    /// P2's `schedule-update`): what is wrong with them.
    InvalidCounts { problems: String },
}

/// What the roll farm does with a roll in one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollActivity {
    TakingLocks,
    Enabling,
    /// A step: the counts the RCs move to.
    Stepping {
        old: i64,
        new: i64,
    },
    /// Waiting out `roll_delay` before the next step, which is due at `until`.
    Delaying {
        delay: Duration,
        until: SystemTime,
    },
    RetiringOld,
    Waiting(RollWait),
    Stuck(RollStuck),
    /// What the farm was `doing` (a sentence: [`RollActivity::doing`],
    /// [`ending_for_missing_rcs`] or [`ending_completed_roll`]) failed (`error`: its write), to be tried again: nothing of
    /// it is known to have happened.
    Failed {
        doing: String,
        error: String,
    },
    /// A read of the store that what the farm was `doing` (a sentence, as for `Failed`)
    /// needed failed (`error`), so nothing of it was written; to be tried again.
    ReadFailed {
        doing: String,
        error: String,
    },
    /// What the farm was `doing` (a sentence, as for `Failed`), a write of both RCs too large
    /// for one transaction, was written in two: the first, of `landed` ("the old RC"),
    /// landed, the second failed (`error`), or its answer was lost (`outcome_unknown`). The
    /// roll moved, and the next pass plans from what is stored.
    PartlyWritten {
        doing: String,
        landed: &'static str,
        error: String,
        outcome_unknown: bool,
    },
    /// What the farm was `doing` (a sentence, as for `Failed`) was written but the store's
    /// answer was lost (`error`): it may have landed, or land yet, which the next pass, from
    /// a view caught up with the store, sees.
    OutcomeUnknown {
        doing: String,
        error: String,
    },
}

impl RollActivity {
    /// What the farm is doing, as a sentence: the message of its `Progressing` condition,
    /// which says so of an attempt that failed, or may have.
    pub fn doing(&self) -> String {
        progressing_condition(self).message
    }
}

/// What the farm is doing with a roll whose RCs `rcs` (one, or both) its view of the store
/// lacks: ending it, unless the store, asked first, still holds them. Shown only as what
/// failed, or may have ([`RollActivity::Failed`] and the like): an ended roll keeps no
/// conditions, and one whose RCs the store holds waits for the view to show them
/// ([`RollWait::UnseenRc`]).
pub fn ending_for_missing_rcs(rcs: &[String]) -> String {
    format!(
        "the farm's view of the store has no {}, so the roll is ending unless the store still holds {}",
        rcs_named(rcs),
        if rcs.len() == 1 { "it" } else { "them" }
    )
}

/// What the farm is doing with a roll whose new RC has its pods: ending it. Shown only as
/// what failed, or may have ([`RollActivity::Failed`] and the like): an ended roll keeps no
/// conditions.
pub fn ending_completed_roll() -> String {
    "the new RC has its pods; ending the roll".to_owned()
}

impl RollWait {
    pub fn reason(&self) -> &'static str {
        match self {
            RollWait::NewPods { .. } => "WaitingForNewPods",
            RollWait::OldPods { .. } => "WaitingForOldPods",
            RollWait::Placement { .. } => "WaitingForPlacement",
            RollWait::OldPodRemoval { .. } => "WaitingForOldPodRemoval",
            RollWait::NewPodRemoval { .. } => "WaitingForNewPodRemoval",
            RollWait::UnseenRc { .. } => "WaitingForRc",
        }
    }

    pub fn message(&self) -> String {
        match self {
            RollWait::NewPods { healthy, desired } => format!(
                "waiting for {} more healthy pod{} on the new RC: {healthy} of {desired} passing",
                desired - healthy,
                if desired - healthy == 1 { "" } else { "s" }
            ),
            RollWait::OldPods { settling } => format!(
                "waiting for {} of the old RC to start or report health",
                pods(*settling)
            ),
            RollWait::Placement { placed, target } => format!(
                "waiting for the new RC's farm to place {}: {placed} of {target} placed",
                pods(target - placed)
            ),
            RollWait::OldPodRemoval { remaining } => format!(
                "waiting for the old RC's farm to remove the {} it no longer wants",
                pods(*remaining)
            ),
            RollWait::NewPodRemoval { remaining } => format!(
                "waiting for the new RC's farm to remove the {} it no longer wants",
                pods(*remaining)
            ),
            RollWait::UnseenRc { rcs } => format!(
                "waiting for the farm's view of the store to show {}, which the store holds",
                rcs_named(rcs)
            ),
        }
    }
}

impl RollStuck {
    pub fn reason(&self) -> &'static str {
        match self {
            RollStuck::MinimumEqualsDesired { .. } => "MinimumEqualsDesired",
            RollStuck::NoHealthyHeadroom { .. } => "NoHealthyHeadroom",
            RollStuck::NewRcOutOfStep { .. } => "NewRcOutOfStep",
            RollStuck::OldPodsKept { .. } => "OldPodsKept",
            RollStuck::MutationLockHeld { .. } => "MutationLockHeld",
            RollStuck::AnotherRoll { .. } => "AnotherRoll",
            RollStuck::SameRc => "SameRc",
            RollStuck::RcUnreadable { .. } => "RcUnreadable",
            RollStuck::InvalidCounts { .. } => "InvalidCounts",
        }
    }

    pub fn message(&self) -> String {
        match self {
            RollStuck::MinimumEqualsDesired { minimum, desired } => format!(
                "minimum_replicas ({minimum}) is not below desired_replicas ({desired}): a roll replaces pods rather than adding extra ones, so every step would go below the minimum; lower minimum_replicas or cancel the roll"
            ),
            RollStuck::NoHealthyHeadroom {
                old_healthy,
                new_healthy,
                minimum,
            } => format!(
                "{} healthy (old RC {old_healthy}, new RC {new_healthy}) against a minimum of {minimum}, and none is still starting, so a step would go below the minimum",
                pods(old_healthy + new_healthy)
            ),
            RollStuck::NewRcOutOfStep {
                pods: n,
                desired,
                disabled: true,
            } => format!(
                "the new RC is disabled with {} for {desired} replicas, so enabling it would change its pods outside the roll's steps",
                pods(*n)
            ),
            RollStuck::NewRcOutOfStep {
                pods: n,
                desired,
                disabled: false,
            } => format!(
                "the new RC has {} of its {desired} replicas, so once the old RC is disabled it would take the old pods it is short of at once, outside the roll's steps; cancel the roll, set the new RC's replicas_desired to its pods and roll again",
                pods(*n)
            ),
            RollStuck::OldPodsKept { remaining, target } => format!(
                "the new RC has its {} but the old RC still has {remaining}, which the RC farm owning it (another session) leaves in place while the RC is disabled",
                pods(*target)
            ),
            RollStuck::MutationLockHeld { lock } => {
                format!("another session holds {lock}, so the roll cannot change the RC's counts")
            }
            RollStuck::AnotherRoll { roll } => format!(
                "roll {roll} moves the replicas of one of its RCs too, and one roll at a time does; cancel one of them"
            ),
            RollStuck::SameRc => "the roll names one RC as both its old and its new RC, so there are no replicas to move; cancel it".into(),
            RollStuck::RcUnreadable { rc, why } => format!(
                "the stored RC {rc} cannot be decoded ({why}), so the roll can neither move nor end; cancel the roll, then DELETE /api/v1/rcs/{rc} removes it"
            ),
            RollStuck::InvalidCounts { problems } => format!(
                "the roll's counts cannot be rolled to ({problems}), so it moves nothing; cancel it"
            ),
        }
    }
}

/// A roll's `Progressing` and `Stalled` conditions, and its progress record.
///
/// Progress is any change of `mark` (the roll's replica counts); a roll waiting out its
/// `roll_delay` counts as progressing until the delay ends. A roll with no progress for `deadline` is stalled,
/// for the reason it is not moving now.
pub fn roll_conditions(
    activity: &RollActivity,
    mark: Vec<i64>,
    previous: Option<&Progress>,
    deadline: Duration,
    now: SystemTime,
) -> (Vec<Observed>, Progress) {
    let progressing = progressing_condition(activity);
    let progress = match (previous, activity) {
        // Progress up to the delay's end, recorded as of then: the same record on every pass
        // of the wait (each a pass that a rewrite would set off again), and the step after
        // it no later than the end of the delay, as far as the stall clock goes.
        (_, RollActivity::Delaying { until, .. }) => Progress::new(mark, *until),
        (Some(p), _) if p.mark == mark => p.clone(),
        _ => Progress::new(mark, now),
    };
    let still = now.duration_since(progress.at()).unwrap_or(Duration::ZERO);
    let stalled = if still >= deadline {
        Observed::new(
            "Stalled",
            True,
            progressing.reason,
            format!(
                "no progress for {}: {}",
                format_duration(deadline),
                progressing.message
            ),
        )
    } else {
        Observed::new(
            "Stalled",
            False,
            "ProgressWithinDeadline",
            format!(
                "the roll has progressed within the last {}",
                format_duration(deadline)
            ),
        )
    };
    (vec![progressing, stalled], progress)
}

/// A roll's `Progressing` condition for `activity`.
fn progressing_condition(activity: &RollActivity) -> Observed {
    match activity {
        RollActivity::TakingLocks => Observed::new(
            "Progressing",
            True,
            "TakingLocks",
            "taking both RCs' mutation locks",
        ),
        RollActivity::Enabling => Observed::new(
            "Progressing",
            True,
            "EnablingNewRc",
            "disabling the old RC and enabling the new one",
        ),
        RollActivity::Stepping { old, new } => Observed::new(
            "Progressing",
            True,
            "ReplicasMoving",
            format!("moving replicas: the old RC to {old}, the new RC to {new}"),
        ),
        RollActivity::Delaying { delay, .. } => Observed::new(
            "Progressing",
            True,
            "RollDelay",
            format!(
                "waiting out the roll delay of {} before the next step",
                format_duration(*delay)
            ),
        ),
        RollActivity::RetiringOld => Observed::new(
            "Progressing",
            True,
            "RetiringOldRc",
            "the new RC has its replicas; setting the old RC's to 0",
        ),
        RollActivity::Waiting(wait) => {
            Observed::new("Progressing", True, wait.reason(), wait.message())
        }
        RollActivity::Stuck(stuck) => {
            Observed::new("Progressing", False, stuck.reason(), stuck.message())
        }
        // What the farm tried, not as though it had happened.
        RollActivity::Failed { doing, error } => Observed::new(
            "Progressing",
            False,
            "WriteFailed",
            format!(
                "{}, which failed ({error}); the farm tries again",
                doing
            ),
        ),
        // What landed moved the roll: not a write that failed whole.
        RollActivity::PartlyWritten {
            doing,
            landed,
            error,
            outcome_unknown,
        } => Observed::new(
            "Progressing",
            True,
            "PartlyWritten",
            format!(
                "{doing}, written in two transactions for its size: {landed}'s write landed, the other RC's {} ({error}); the next pass plans from what is stored",
                match outcome_unknown {
                    false => "failed",
                    true => "may or may not have",
                }
            ),
        ),
        // Nothing was sent: not a write that failed.
        RollActivity::ReadFailed { doing, error } => Observed::new(
            "Progressing",
            False,
            "ReadFailed",
            format!(
                "{}, for which a read of the store failed ({error}), so nothing was written; the farm tries again",
                doing
            ),
        ),
        // Neither that it happened nor that it did not.
        RollActivity::OutcomeUnknown { doing, error } => Observed::new(
            "Progressing",
            Unknown,
            "WriteOutcomeUnknown",
            format!(
                "{}, which may or may not have happened ({error}); the farm looks again once its view has caught up with the store",
                doing
            ),
        ),
    }
}

/// "RC a", "RCs a and b": the RCs of a roll a message names.
fn rcs_named(rcs: &[String]) -> String {
    match rcs {
        [rc] => format!("RC {rc}"),
        [first @ .., last] => format!("RCs {} and {last}", first.join(", ")),
        [] => "no RC".to_owned(),
    }
}

/// What the DS farm saw of one daemon set in a pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DsFacts {
    pub disabled: bool,
    /// Why the node selector cannot be used (a sentence), if it cannot.
    pub selector_error: Option<String>,
    /// Nodes the selector matches.
    pub targeted: usize,
    /// Targeted nodes healthy on the current manifest.
    pub deployed: usize,
    /// Targeted nodes healthy on what they are meant to run now.
    pub healthy: usize,
    pub min_health: i64,
    /// Pod changes the farm makes in this pass.
    pub changes: usize,
    /// Whether the rollout is unfinished.
    pub in_progress: bool,
    /// No node matches, so the daemon set keeps the pods it has.
    pub stranded: bool,
    /// Nodes on an old manifest left as they are because replacing them would go below
    /// `min_health`.
    pub held_back: usize,
    /// An enabled daemon set it contends with (or would, were it enabled): its id and their
    /// pod id.
    pub contender: Option<(String, String)>,
    /// Nodes whose labels changed to match other enabled daemon sets of its pod id too,
    /// after they were all written: a contention neither one is disabled for.
    pub relabelled: Option<NodeContention>,
    /// An enabled daemon set written after it into contention with it, so the one to
    /// disable, that stands enabled: this farm does not own it, so does not disable it, or
    /// backs off from a failure reconciling it. While `relabelled` is shown, it is named in its message rather than shown
    /// in its place.
    pub later_contender: Option<LaterContender>,
}

/// An enabled daemon set written after another into contention with it, so the one to
/// disable, that stands enabled after the farm of the other has reconciled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaterContender {
    pub id: String,
    /// Their pod id.
    pub pod_id: String,
    /// Who owns it, so why it is not disabled yet.
    pub owner: ContenderOwner,
}

/// Who owns a [`LaterContender`], which tells why it still stands enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContenderOwner {
    /// Another farm (of another session), which this farm leaves it to.
    Elsewhere,
    /// No farm yet (it was written since the farm's last pass): the farm that takes it
    /// disables it.
    NoFarmYet,
    /// This farm, which backs off from a failure reconciling it: its write disabling it, or
    /// an earlier failure (of its pods, say) that kept the farm from reconciling it since it
    /// was written into contention. It tries again.
    ThisFarm,
}

/// Nodes relabelled into contention between enabled daemon sets, as one of them sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeContention {
    pub pod_id: String,
    /// The other daemon sets whose selectors match the nodes, by id.
    pub rivals: BTreeSet<String>,
    /// The nodes it runs the pod on, and keeps.
    pub kept: BTreeSet<String>,
    /// The nodes it places nothing on: another daemon set runs the pod there, or none does.
    pub left: BTreeSet<String>,
}

/// What a daemon set says of `rival`, written after it into contention with it: the one to
/// disable, which still stands enabled.
fn later_contender(rival: &LaterContender) -> String {
    format!(
        "daemon set {} is enabled for pod {} too, and selects nodes this one selects; its \
         write made the contention, so it is the one to disable, but {}",
        rival.id,
        rival.pod_id,
        match rival.owner {
            ContenderOwner::Elsewhere => {
                "another farm owns it, and this farm disables only the daemon sets it owns: \
                 both stay enabled until its owner or a user disables one"
            }
            ContenderOwner::NoFarmYet => "no farm owns it yet: the farm that takes it disables it",
            ContenderOwner::ThisFarm => {
                "this farm is backing off from a failure reconciling it (its write disabling \
                 it, or an earlier one): both stay enabled until the farm tries again and \
                 disables it"
            }
        }
    )
}

/// At most the first few `names`, then how many more: a message stays short on any fleet.
pub fn some_of(names: &BTreeSet<String>) -> String {
    const SHOWN: usize = 5;
    let mut text = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.is_empty() {
        text.push_str("none");
    } else if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// The reason of a daemon set's `Contended` condition while nodes relabelled into contention
/// with another make it contend, which the DS farm alerts about as it starts.
pub const NODE_LABELS_CONTEND: &str = "NodeLabelsContend";

/// A daemon set's `Progressing`, `Blocked` and `Contended` conditions.
pub fn ds_conditions(f: &DsFacts) -> Vec<Observed> {
    let contended = match (&f.contender, &f.later_contender, &f.relabelled) {
        (Some((rival, pod_id)), _, _) => Observed::new(
            "Contended",
            True,
            "ContendsWithDaemonSet",
            format!(
                "daemon set {rival} is enabled for pod {pod_id} too, and selects nodes this one \
                 selects{}",
                if f.disabled {
                    "; this one stays disabled"
                } else {
                    ""
                }
            ),
        ),
        // Nodes relabelled into contention, which only an operator ends and which is alerted
        // about once as it starts (told from the conditions stored), go on being shown while
        // a later contender stands (naming it, below), or it would be alerted about again
        // once that one is disabled.
        (None, later, Some(nodes)) => Observed::new(
            "Contended",
            True,
            NODE_LABELS_CONTEND,
            // The others are enabled for the pod, which they need not run on these nodes.
            format!(
                "nodes were relabelled to match {} {} too, which {} enabled for pod {} as well; \
                 no daemon set is disabled for a node's labels: this one keeps the nodes it \
                 runs the pod on ({}) and places nothing on the others ({}); while this lasts, \
                 a change to this daemon set that leaves it enabled and contending is refused \
                 (409), as it would make the contention its own; change the nodes' labels or a selector, \
                 or disable one of the daemon sets{}",
                match nodes.rivals.len() {
                    1 => "daemon set",
                    _ => "daemon sets",
                },
                some_of(&nodes.rivals),
                match nodes.rivals.len() {
                    1 => "is",
                    _ => "are",
                },
                nodes.pod_id,
                some_of(&nodes.kept),
                some_of(&nodes.left),
                match later {
                    Some(rival) => format!("; besides, {}", later_contender(rival)),
                    None => String::new(),
                }
            ),
        ),
        // Its write made the contention, so it is the one to disable, but it stands: not
        // this farm's (another's, or no farm's yet: both are enabled until one takes it, in
        // its next pass), or this farm backs off from a failure reconciling it (until a
        // retry succeeds).
        (None, Some(rival), None) => Observed::new(
            "Contended",
            True,
            match rival.owner {
                ContenderOwner::Elsewhere => "ContenderOwnedElsewhere",
                ContenderOwner::NoFarmYet => "ContenderNotYetOwned",
                ContenderOwner::ThisFarm => "ContenderNotYetDisabled",
            },
            later_contender(rival),
        ),
        (None, None, None) => Observed::new(
            "Contended",
            False,
            "NoContention",
            "no enabled daemon set runs the same pod on the nodes this one selects",
        ),
    };
    // A disabled daemon set replaces nothing, so no replacement waits on min_health, though
    // its plan (made as if enabled) may hold some back.
    let blocked = if f.disabled {
        Observed::new(
            "Blocked",
            False,
            "Disabled",
            "the daemon set is disabled, so no replacement waits",
        )
    } else if f.held_back > 0 {
        Observed::new(
            "Blocked",
            True,
            "MinHealth",
            format!(
                "{} wait for the new manifest: {} of {} nodes are healthy and replacing another would go below min_health ({})",
                pods(f.held_back as i64),
                f.healthy,
                f.targeted,
                f.min_health
            ),
        )
    } else {
        Observed::new(
            "Blocked",
            False,
            "NotBlocked",
            format!("min_health ({}) holds no replacement back", f.min_health),
        )
    };
    let progressing = if let Some(error) = &f.selector_error {
        Observed::new("Progressing", False, "InvalidNodeSelector", error.clone())
    } else if f.disabled {
        Observed::new(
            "Progressing",
            False,
            "Disabled",
            "the daemon set is disabled, so it changes no pods",
        )
    } else if f.stranded {
        Observed::new(
            "Progressing",
            False,
            "NoEligibleNodes",
            "no node matches the selector; the pods it has are kept rather than all removed",
        )
    } else if f.in_progress || f.changes > 0 {
        Observed::new(
            "Progressing",
            True,
            "Replicating",
            format!(
                "{} of {} targeted nodes are healthy on the current manifest",
                f.deployed, f.targeted
            ),
        )
    } else {
        let message = if f.deployed < f.targeted {
            // Nodes no daemon set runs the pod on, left alone for a node-label contention.
            let contended_left = f.relabelled.as_ref().is_some_and(|n| !n.left.is_empty());
            format!(
                "{} of {} targeted nodes are healthy on the current manifest; the farm has \
                 nothing left to change on the others (another owner runs the pod there, {}\
                 they were given up on past the timeout)",
                f.deployed,
                f.targeted,
                match contended_left {
                    true =>
                        "nodes relabelled into contention with another daemon set are \
                             left alone (see Contended), or ",
                    false => "or ",
                }
            )
        } else {
            format!(
                "all {} targeted nodes are healthy on the current manifest",
                f.targeted
            )
        };
        Observed::new("Progressing", False, "Complete", message)
    };
    vec![progressing, blocked, contended]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn find<'a>(conditions: &'a [Observed], kind: &str) -> &'a Observed {
        conditions
            .iter()
            .find(|c| c.condition_type == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
    }

    fn rc(f: RcFacts) -> Vec<Observed> {
        rc_conditions(&f)
    }

    fn settled_rc() -> RcFacts {
        RcFacts {
            desired: 3,
            eligible: 5,
            current: 3,
            healthy: 3,
            ..RcFacts::default()
        }
    }

    #[test]
    fn an_rc_with_every_pod_healthy_is_ready_and_complete() {
        let c = rc(settled_rc());
        assert_eq!(
            find(&c, "Ready"),
            &Observed::new(
                "Ready",
                True,
                "AllReplicasHealthy",
                "3 of 3 desired pods are healthy"
            )
        );
        assert_eq!(find(&c, "Progressing").reason, "Complete");
        assert_eq!(find(&c, "Degraded").reason, "EnoughNodes");
        assert_eq!(find(&c, "Degraded").status, False);
    }

    #[test]
    fn an_rc_waiting_for_health_is_progressing_and_not_ready() {
        let c = rc(RcFacts {
            healthy: 1,
            ..settled_rc()
        });
        let ready = find(&c, "Ready");
        assert_eq!((ready.status, ready.reason), (False, "ReplicasNotReady"));
        assert_eq!(
            ready.message,
            "1 of 3 desired pods are healthy (3 pods placed)"
        );
        let progressing = find(&c, "Progressing");
        assert_eq!(
            (progressing.status, progressing.reason),
            (True, "WaitingForHealthyPods")
        );
        assert!(progressing.message.starts_with("waiting for 2 pods"));
    }

    #[test]
    fn an_rc_placing_pods_or_moving_one_is_progressing() {
        let c = rc(RcFacts {
            current: 1,
            healthy: 1,
            changes: 2,
            ..settled_rc()
        });
        assert_eq!(find(&c, "Progressing").reason, "PodsChanging");
        let c = rc(RcFacts {
            transfer: true,
            ..settled_rc()
        });
        assert_eq!(find(&c, "Progressing").reason, "NodeTransfer");
    }

    #[test]
    fn an_rc_matching_too_few_nodes_is_degraded() {
        let c = rc(RcFacts {
            desired: 5,
            eligible: 2,
            available: Some(2),
            current: 2,
            healthy: 2,
            ..RcFacts::default()
        });
        let degraded = find(&c, "Degraded");
        assert_eq!(
            (degraded.status, degraded.reason, degraded.message.as_str()),
            (
                True,
                "TooFewEligibleNodes",
                "2 of 5 desired nodes match the selector"
            )
        );
        assert_eq!(find(&c, "Progressing").reason, "TooFewNodes");
        assert_eq!(find(&c, "Ready").status, False);
    }

    #[test]
    fn an_rc_whose_nodes_run_the_pod_for_another_owner_is_degraded() {
        let c = rc(RcFacts {
            available: Some(2),
            current: 2,
            healthy: 2,
            ..settled_rc()
        });
        let degraded = find(&c, "Degraded");
        assert_eq!(
            (degraded.status, degraded.reason),
            (True, "TooFewFreeNodes")
        );
        assert!(
            degraded.message.contains("only 2 of the 3"),
            "{}",
            degraded.message
        );
    }

    #[test]
    fn an_rc_with_a_bad_selector_is_degraded_and_not_progressing() {
        let c = rc(RcFacts {
            selector_error: Some("unexpected token".into()),
            ..settled_rc()
        });
        for kind in ["Degraded", "Progressing"] {
            assert_eq!(find(&c, kind).reason, "InvalidNodeSelector");
        }
        assert_eq!(find(&c, "Degraded").status, True);
        assert_eq!(find(&c, "Progressing").status, False);
    }

    #[test]
    fn a_disabled_rc_is_not_progressing_and_its_nodes_are_unknown() {
        let c = rc(RcFacts {
            disabled: true,
            eligible: 0,
            ..settled_rc()
        });
        assert_eq!(find(&c, "Progressing").reason, "Disabled");
        let degraded = find(&c, "Degraded");
        assert_eq!((degraded.status, degraded.reason), (Unknown, "Disabled"));
        // The old RC of a roll still gives up its surplus.
        let c = rc(RcFacts {
            disabled: true,
            rolling: true,
            changes: 1,
            ..settled_rc()
        });
        assert_eq!(find(&c, "Progressing").reason, "PodsChanging");
    }

    const DEADLINE: Duration = Duration::from_secs(600);

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seconds)
    }

    fn roll(activity: RollActivity) -> Vec<Observed> {
        roll_conditions(&activity, vec![1], None, DEADLINE, at(0)).0
    }

    /// Every kind of roll activity, with the status and reason of its `Progressing`.
    fn roll_activities() -> Vec<(RollActivity, ConditionStatus, &'static str)> {
        vec![
            (RollActivity::TakingLocks, True, "TakingLocks"),
            (RollActivity::Enabling, True, "EnablingNewRc"),
            (
                RollActivity::Stepping { old: 2, new: 1 },
                True,
                "ReplicasMoving",
            ),
            (
                RollActivity::Delaying {
                    delay: Duration::from_secs(30),
                    until: at(30),
                },
                True,
                "RollDelay",
            ),
            (RollActivity::RetiringOld, True, "RetiringOldRc"),
            (
                RollActivity::Waiting(RollWait::NewPods {
                    healthy: 2,
                    desired: 3,
                }),
                True,
                "WaitingForNewPods",
            ),
            (
                RollActivity::Waiting(RollWait::OldPods { settling: 1 }),
                True,
                "WaitingForOldPods",
            ),
            (
                RollActivity::Waiting(RollWait::Placement {
                    placed: 2,
                    target: 3,
                }),
                True,
                "WaitingForPlacement",
            ),
            (
                RollActivity::Waiting(RollWait::OldPodRemoval { remaining: 1 }),
                True,
                "WaitingForOldPodRemoval",
            ),
            (
                RollActivity::Waiting(RollWait::NewPodRemoval { remaining: 1 }),
                True,
                "WaitingForNewPodRemoval",
            ),
            (
                RollActivity::Waiting(RollWait::UnseenRc {
                    rcs: vec!["rc".into()],
                }),
                True,
                "WaitingForRc",
            ),
            (
                RollActivity::Stuck(RollStuck::NoHealthyHeadroom {
                    old_healthy: 1,
                    new_healthy: 1,
                    minimum: 2,
                }),
                False,
                "NoHealthyHeadroom",
            ),
            (
                RollActivity::Stuck(RollStuck::NewRcOutOfStep {
                    pods: 1,
                    desired: 2,
                    disabled: true,
                }),
                False,
                "NewRcOutOfStep",
            ),
            (
                RollActivity::Stuck(RollStuck::OldPodsKept {
                    remaining: 1,
                    target: 2,
                }),
                False,
                "OldPodsKept",
            ),
            (
                RollActivity::Stuck(RollStuck::MutationLockHeld { lock: "l".into() }),
                False,
                "MutationLockHeld",
            ),
            (
                RollActivity::Stuck(RollStuck::AnotherRoll { roll: "r".into() }),
                False,
                "AnotherRoll",
            ),
            (RollActivity::Stuck(RollStuck::SameRc), False, "SameRc"),
            (
                RollActivity::Stuck(RollStuck::MinimumEqualsDesired {
                    minimum: 3,
                    desired: 3,
                }),
                False,
                "MinimumEqualsDesired",
            ),
            (
                RollActivity::Stuck(RollStuck::InvalidCounts {
                    problems: "desired_replicas is negative".into(),
                }),
                False,
                "InvalidCounts",
            ),
            (
                RollActivity::Stuck(RollStuck::RcUnreadable {
                    rc: "rc".into(),
                    why: "not JSON".into(),
                }),
                False,
                "RcUnreadable",
            ),
            (
                RollActivity::Failed {
                    doing: RollActivity::Stepping { old: 2, new: 1 }.doing(),
                    error: "the store is unavailable".into(),
                },
                False,
                "WriteFailed",
            ),
            (
                RollActivity::PartlyWritten {
                    doing: RollActivity::Enabling.doing(),
                    landed: "the old RC",
                    error: "the store is unavailable".into(),
                    outcome_unknown: false,
                },
                True,
                "PartlyWritten",
            ),
            (
                RollActivity::ReadFailed {
                    doing: ending_for_missing_rcs(&["rc".into()]),
                    error: "the store is unavailable".into(),
                },
                False,
                "ReadFailed",
            ),
            (
                RollActivity::OutcomeUnknown {
                    doing: RollActivity::Stepping { old: 2, new: 1 }.doing(),
                    error: "the answer was lost".into(),
                },
                Unknown,
                "WriteOutcomeUnknown",
            ),
        ]
    }

    #[test]
    fn each_roll_activity_has_its_progressing_reason() {
        for (activity, status, reason) in roll_activities() {
            let c = roll(activity.clone());
            let progressing = find(&c, "Progressing");
            assert_eq!(
                (progressing.status, progressing.reason),
                (status, reason),
                "{activity:?}"
            );
            assert_eq!(find(&c, "Stalled").status, False, "{activity:?}");
        }
    }

    #[test]
    fn a_roll_over_two_rcs_the_view_lacks_names_both() {
        let rcs = vec!["a".to_owned(), "b".to_owned()];
        let c = roll(RollActivity::Waiting(RollWait::UnseenRc {
            rcs: rcs.clone(),
        }));
        assert_eq!(
            find(&c, "Progressing").message,
            "waiting for the farm's view of the store to show RCs a and b, which the store holds"
        );
        let c = roll(RollActivity::Failed {
            doing: ending_for_missing_rcs(&rcs),
            error: "the store is unavailable".into(),
        });
        assert_eq!(
            find(&c, "Progressing").message,
            "the farm's view of the store has no RCs a and b, so the roll is ending unless the store still holds them, which failed (the store is unavailable); the farm tries again"
        );
    }

    #[test]
    fn the_wait_for_new_pods_says_how_many_more() {
        let c = roll(RollActivity::Waiting(RollWait::NewPods {
            healthy: 2,
            desired: 3,
        }));
        assert_eq!(
            find(&c, "Progressing").message,
            "waiting for 1 more healthy pod on the new RC: 2 of 3 passing"
        );
    }

    #[test]
    fn a_roll_with_minimum_equal_to_desired_says_so() {
        let stuck = RollActivity::Stuck(RollStuck::MinimumEqualsDesired {
            minimum: 3,
            desired: 3,
        });
        let c = roll(stuck);
        let progressing = find(&c, "Progressing");
        assert_eq!(
            (progressing.status, progressing.reason),
            (False, "MinimumEqualsDesired")
        );
        assert!(progressing
            .message
            .starts_with("minimum_replicas (3) is not below desired_replicas (3)"));
    }

    #[test]
    fn a_roll_without_progress_for_the_deadline_is_stalled_for_its_reason() {
        let stuck = RollActivity::Stuck(RollStuck::MinimumEqualsDesired {
            minimum: 3,
            desired: 3,
        });
        let (_, first) = roll_conditions(&stuck, vec![3, 0], None, DEADLINE, at(0));
        assert_eq!(first.at(), at(0));
        // Just before the deadline: not stalled, and the progress record is unchanged.
        let (c, kept) = roll_conditions(&stuck, vec![3, 0], Some(&first), DEADLINE, at(599));
        assert_eq!(kept, first);
        assert_eq!(find(&c, "Stalled").reason, "ProgressWithinDeadline");
        let (c, _) = roll_conditions(&stuck, vec![3, 0], Some(&first), DEADLINE, at(600));
        let stalled = find(&c, "Stalled");
        assert_eq!(
            (stalled.status, stalled.reason),
            (True, "MinimumEqualsDesired")
        );
        assert!(stalled
            .message
            .starts_with("no progress for 10m0s: minimum_replicas"));

        // A waiting roll stalls too, for what it waits on.
        let waiting = RollActivity::Waiting(RollWait::NewPods {
            healthy: 2,
            desired: 3,
        });
        let (c, _) = roll_conditions(&waiting, vec![3, 0], Some(&first), DEADLINE, at(900));
        assert_eq!(find(&c, "Stalled").reason, "WaitingForNewPods");
    }

    #[test]
    fn a_change_of_counts_or_a_roll_delay_is_progress() {
        let waiting = RollActivity::Waiting(RollWait::OldPods { settling: 1 });
        let (_, first) = roll_conditions(&waiting, vec![3, 0], None, DEADLINE, at(0));
        let (c, moved) = roll_conditions(&waiting, vec![2, 1], Some(&first), DEADLINE, at(700));
        assert_eq!(moved.at(), at(700));
        assert_eq!(find(&c, "Stalled").status, False);
        let delay = RollActivity::Delaying {
            delay: Duration::from_secs(900),
            until: at(1700),
        };
        let (c, delayed) = roll_conditions(&delay, vec![3, 0], Some(&first), DEADLINE, at(800));
        assert_eq!(delayed.at(), at(1700));
        assert_eq!(find(&c, "Stalled").status, False);
        // Every later pass of the wait finds the same record, so nothing to write.
        let (later, again) =
            roll_conditions(&delay, vec![3, 0], Some(&delayed), DEADLINE, at(1600));
        assert_eq!((&later, &again), (&c, &delayed));
        // The step after the delay is no stall, however long the delay was.
        let stepping = RollActivity::Stepping { old: 2, new: 1 };
        let (c, _) = roll_conditions(&stepping, vec![3, 0], Some(&again), DEADLINE, at(1701));
        assert_eq!(find(&c, "Stalled").status, False);
    }

    fn settled_ds() -> DsFacts {
        DsFacts {
            targeted: 4,
            deployed: 4,
            healthy: 4,
            min_health: 3,
            ..DsFacts::default()
        }
    }

    /// Complete with nodes left to other owners (or given up on) says how many are healthy,
    /// not "all".
    #[test]
    fn a_daemon_set_complete_short_of_some_nodes_says_how_many_are_healthy() {
        let c = ds_conditions(&DsFacts {
            deployed: 3,
            healthy: 3,
            ..settled_ds()
        });
        let progressing = find(&c, "Progressing");
        assert_eq!(progressing.reason, "Complete");
        assert!(
            progressing
                .message
                .starts_with("3 of 4 targeted nodes are healthy"),
            "{}",
            progressing.message
        );
    }

    /// Nodes relabelled into contention that no daemon set runs the pod on are neither
    /// another owner's nor given up on: Complete says they are left alone.
    #[test]
    fn a_daemon_set_complete_short_of_contended_nodes_says_they_are_left_alone() {
        let c = ds_conditions(&DsFacts {
            deployed: 3,
            healthy: 3,
            relabelled: Some(NodeContention {
                left: ["n4".to_owned()].into(),
                ..NodeContention::default()
            }),
            ..settled_ds()
        });
        let progressing = find(&c, "Progressing");
        assert_eq!(progressing.reason, "Complete");
        assert!(
            progressing
                .message
                .contains("relabelled into contention with another daemon set are left alone"),
            "{}",
            progressing.message
        );
    }

    #[test]
    fn a_rolled_out_daemon_set_is_complete_unblocked_and_uncontended() {
        let c = ds_conditions(&settled_ds());
        assert_eq!(find(&c, "Progressing").reason, "Complete");
        assert_eq!(
            find(&c, "Progressing").message,
            "all 4 targeted nodes are healthy on the current manifest"
        );
        assert_eq!(find(&c, "Blocked").reason, "NotBlocked");
        assert_eq!(find(&c, "Contended").reason, "NoContention");
        assert!(c.iter().all(|c| c.status == False));
    }

    #[test]
    fn a_daemon_set_held_back_by_min_health_is_blocked() {
        let c = ds_conditions(&DsFacts {
            deployed: 0,
            held_back: 1,
            healthy: 3,
            in_progress: true,
            ..settled_ds()
        });
        let blocked = find(&c, "Blocked");
        assert_eq!((blocked.status, blocked.reason), (True, "MinHealth"));
        assert_eq!(
            blocked.message,
            "1 pod wait for the new manifest: 3 of 4 nodes are healthy and replacing another would go below min_health (3)"
        );
        assert_eq!(find(&c, "Progressing").reason, "Replicating");
    }

    #[test]
    fn a_disabled_daemon_set_is_not_blocked_by_min_health() {
        let c = ds_conditions(&DsFacts {
            disabled: true,
            held_back: 1,
            ..settled_ds()
        });
        let blocked = find(&c, "Blocked");
        assert_eq!((blocked.status, blocked.reason), (False, "Disabled"));
        assert_eq!(find(&c, "Progressing").reason, "Disabled");
    }

    #[test]
    fn a_daemon_set_contending_with_another_says_which() {
        let c = ds_conditions(&DsFacts {
            disabled: true,
            contender: Some(("rival".into(), "agent".into())),
            ..settled_ds()
        });
        let contended = find(&c, "Contended");
        assert_eq!(
            (contended.status, contended.reason),
            (True, "ContendsWithDaemonSet")
        );
        // It need not run the pod on those nodes (yet): it is enabled for them.
        assert!(
            contended.message.starts_with(
                "daemon set rival is enabled for pod agent too, and selects nodes this one selects"
            ),
            "{}",
            contended.message
        );
        assert_eq!(find(&c, "Progressing").reason, "Disabled");
    }

    #[test]
    fn a_daemon_set_with_nodes_relabelled_into_contention_says_which_it_keeps() {
        let names = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
        let c = ds_conditions(&DsFacts {
            relabelled: Some(NodeContention {
                pod_id: "agent".into(),
                rivals: names(&["rival"]),
                kept: names(&["n1"]),
                left: names(&["n2", "n3", "n4", "n5", "n6", "n7", "n8"]),
            }),
            ..settled_ds()
        });
        let contended = find(&c, "Contended");
        assert_eq!(
            (contended.status, contended.reason),
            (True, "NodeLabelsContend")
        );
        let message = &contended.message;
        // The rival is enabled for the pod; it need not run it on the nodes this one leaves.
        assert!(
            message.contains("daemon set rival too, which is enabled for pod agent as well"),
            "{message}"
        );
        assert!(!message.contains("runs pod"), "{message}");
        assert!(
            message.contains("keeps the nodes it runs the pod on (n1)"),
            "{message}"
        );
        assert!(
            message.contains(
                "while this lasts, a change to this daemon set that leaves it enabled and \
                 contending is refused (409)"
            ),
            "{message}"
        );
        assert!(
            message.contains("(n2, n3, n4, n5, n6 and 2 more)"),
            "{message}"
        );
        assert_eq!(find(&c, "Progressing").reason, "Complete");
    }

    #[test]
    fn a_daemon_set_matching_no_node_or_with_a_bad_selector_is_not_progressing() {
        let c = ds_conditions(&DsFacts {
            targeted: 0,
            stranded: true,
            ..settled_ds()
        });
        assert_eq!(find(&c, "Progressing").reason, "NoEligibleNodes");
        let c = ds_conditions(&DsFacts {
            selector_error: Some("bad".into()),
            ..settled_ds()
        });
        assert_eq!(find(&c, "Progressing").reason, "InvalidNodeSelector");
    }

    #[test]
    fn stamping_keeps_the_transition_time_while_the_status_holds() {
        let observed = |status, message: &str| vec![Observed::new("Ready", status, "R", message)];
        let first = stamp(&[], observed(False, "a"), 5, at(0));
        assert_eq!(first[0].last_transition_time, format_rfc3339(at(0)));
        assert_eq!(first[0].observed_index, 5);
        let same = stamp(&first, observed(False, "b"), 6, at(10));
        assert_eq!(same[0].last_transition_time, first[0].last_transition_time);
        assert_eq!((same[0].message.as_str(), same[0].observed_index), ("b", 6));
        let flipped = stamp(&same, observed(True, "c"), 6, at(20));
        assert_eq!(flipped[0].last_transition_time, format_rfc3339(at(20)));
    }

    /// The cells of the README's row of conditions for `object`.
    fn readme_row(object: &str) -> Vec<&'static str> {
        let readme = include_str!("../../README.md");
        let row = readme
            .lines()
            .find(|line| line.starts_with(&format!("| {object} |")))
            .unwrap_or_else(|| panic!("no README row for {object}"));
        row.split('|').map(str::trim).collect()
    }

    /// The words of `text` in backquotes.
    fn quoted(text: &str) -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    /// The README's row of conditions for `object`: its types, and for each type (in the
    /// same order, `;` between them) the reasons it lists.
    fn documented(object: &str) -> Vec<(String, Vec<String>)> {
        let cells = readme_row(object);
        let row = cells.join(" | ");
        let types = quoted(cells[2]);
        let reasons: Vec<Vec<String>> = cells[3].split(';').map(quoted).collect();
        assert_eq!(types.len(), reasons.len(), "{row}");
        types.into_iter().zip(reasons).collect()
    }

    /// Every reason the conditions of `object` give for `observed` (the conditions of many
    /// situations) is listed in the README under its type, and every one listed there is given.
    fn assert_documented(object: &str, observed: &[Vec<Observed>]) {
        let documented = documented(object);
        for (condition_type, reasons) in &documented {
            let given: BTreeSet<&str> = observed
                .iter()
                .flatten()
                .filter(|o| o.condition_type == condition_type)
                .map(|o| o.reason)
                .collect();
            let listed: BTreeSet<&str> = reasons.iter().map(String::as_str).collect();
            assert_eq!(
                given, listed,
                "{object} {condition_type}: given, then listed"
            );
        }
        let types: BTreeSet<&str> = documented.iter().map(|(t, _)| t.as_str()).collect();
        for o in observed.iter().flatten() {
            assert!(types.contains(o.condition_type), "{object}: {o:?}");
        }
    }

    /// Every reason a roll's conditions give (each activity published as it is, stalled or
    /// not) is listed in the README's row for rolls, and every one listed there is given.
    /// The row says in words which status each reason comes with, rather than a list per
    /// type: it is held to the reasons of both types together.
    #[test]
    fn the_readme_lists_each_roll_reason() {
        let cells = readme_row("Roll");
        let types = quoted(cells[2]);
        let listed: BTreeSet<String> = (quoted(cells[3]).into_iter())
            .filter(|word| !types.contains(word) && !word.starts_with("--"))
            .collect();
        let stalled_since = Progress::new(vec![1], at(0));
        let mut given = BTreeSet::new();
        for (activity, ..) in roll_activities() {
            let now = at(0) + DEADLINE;
            let (stalled, _) =
                roll_conditions(&activity, vec![1], Some(&stalled_since), DEADLINE, now);
            for observed in roll(activity.clone()).into_iter().chain(stalled) {
                assert!(
                    types.contains(&observed.condition_type.to_owned()),
                    "{observed:?}"
                );
                given.insert(observed.reason.to_owned());
            }
        }
        assert_eq!(given, listed, "given, then listed");
    }

    #[test]
    fn the_readme_lists_each_rc_reason_under_its_type() {
        let settled = settled_rc();
        let situations = [
            settled.clone(),
            RcFacts {
                healthy: 1,
                ..settled.clone()
            },
            RcFacts {
                changes: 2,
                ..settled.clone()
            },
            RcFacts {
                transfer: true,
                ..settled.clone()
            },
            RcFacts {
                disabled: true,
                ..settled.clone()
            },
            RcFacts {
                disabled: true,
                rolling: true,
                ..settled.clone()
            },
            RcFacts {
                selector_error: Some("the selector is invalid".into()),
                ..settled.clone()
            },
            RcFacts {
                eligible: 2,
                current: 2,
                healthy: 2,
                ..settled.clone()
            },
            RcFacts {
                available: Some(2),
                current: 2,
                healthy: 2,
                ..settled.clone()
            },
        ];
        let observed: Vec<Vec<Observed>> = situations.iter().map(rc_conditions).collect();
        assert_documented("RC", &observed);
    }

    #[test]
    fn the_readme_lists_each_daemon_set_reason_under_its_type() {
        let settled = DsFacts {
            targeted: 3,
            deployed: 3,
            healthy: 3,
            min_health: 1,
            ..DsFacts::default()
        };
        let situations = [
            settled.clone(),
            DsFacts {
                disabled: true,
                ..settled.clone()
            },
            DsFacts {
                selector_error: Some("the selector is invalid".into()),
                ..settled.clone()
            },
            DsFacts {
                stranded: true,
                ..settled.clone()
            },
            DsFacts {
                in_progress: true,
                held_back: 1,
                ..settled.clone()
            },
            DsFacts {
                contender: Some(("other".into(), "web".into())),
                ..settled.clone()
            },
            DsFacts {
                relabelled: Some(NodeContention::default()),
                ..settled.clone()
            },
        ];
        let later = [
            ContenderOwner::Elsewhere,
            ContenderOwner::NoFarmYet,
            ContenderOwner::ThisFarm,
        ]
        .map(|owner| DsFacts {
            later_contender: Some(LaterContender {
                id: "other".into(),
                pod_id: "web".into(),
                owner,
            }),
            ..settled.clone()
        });
        let observed: Vec<Vec<Observed>> = (situations.iter().chain(&later))
            .map(ds_conditions)
            .collect();
        assert_documented("Daemon set", &observed);
    }
}
