//! The RC farm: P2's meet-desires for every RC this server owns, plus node transfer
//! for `dynamic_strategy` RCs.
//!
//! Rolls follow P2's protocol (its `rolling-update`): the old RC is disabled and the new one
//! enabled. As P2's worker does, an enabled RC takes a node that runs its pod id for a
//! *disabled* RC, replacing that pod in place (the intent is overwritten and the pod's labels
//! move to the new RC), and prefers such nodes to free ones; of a rolling RC, only the pods
//! beyond its count, which the roll's minimum has budgeted for. A disabled RC otherwise makes no
//! change, except that while a roll holds its mutation lock (whoever runs the roll) its
//! surplus pods are removed, so a roll completes whether the new pods replaced old ones in
//! place or landed on spare nodes.
//!
//! Differences from P2, on purpose: new pods go to the least-loaded eligible nodes (P2 fills
//! nodes in name order); a node running the same pod id for an enabled RC or another owner is
//! never taken over; an empty pod-label tree simply means "no pods"; every write is fenced by
//! the RC's ownership lock, and holds only while the RC is the version it was planned from.

use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

use futures::future::Either;
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::json;
use tokio::time::Instant;

use crate::kv::{TxnOp, MAX_TXN_OPS};
use crate::labels::{Labels, Selector, POD_ID_LABEL, RC_ID_LABEL};
use crate::layout;
use crate::model::conditions::{rc_conditions, RcFacts};
use crate::model::event::{Action, ObjectKind};
use crate::model::{AllocationStrategy, AuditRecord, HealthState, StoredRc};
use crate::state::Mirror;

use super::conditions::Published;
use super::pods::{
    batches, held_by_labels, is_free, nodes_moved, replace_ops, same_manifest, schedule_ops,
    unschedule_ops,
};
use super::roll::count;
use super::world::{pod_key, Shared, World};
use super::{Farm, FarmContext, FarmError, FarmResult, Retries, CONCURRENT_OBJECTS};

/// The RC farm's state across passes: backoffs, and the conditions it publishes.
pub struct RcFarm {
    retries: Retries,
    conditions: Published,
}

impl RcFarm {
    /// An RC farm for one term, its conditions as `mirror` holds them.
    pub fn new(mirror: Mirror) -> Self {
        RcFarm {
            retries: Retries::default(),
            conditions: Published::new(ObjectKind::Rcs, mirror),
        }
    }
}

impl Farm for RcFarm {
    const NAME: &'static str = FARM;
    const OWNERSHIP_LOCKS: Option<&'static str> = Some(layout::RC_LOCKS);

    fn retries(&self) -> &Retries {
        &self.retries
    }

    /// Claims the RCs, then plans them one after another (the plans share the nodes' load),
    /// each when there is room to write it, up to [`CONCURRENT_OBJECTS`] RCs' changes at once.
    async fn pass(&mut self, ctx: &FarmContext, world: &World) -> Option<Instant> {
        let ids = world.rcs.items().keys().map(String::as_str);
        let claimed = ctx
            .claim_all(world, &mut self.retries, ids, |id| layout::rc_ownership(id))
            .await;
        let conditions = &self.conditions;
        let mut load = Load::of(world);
        // An RC is planned only when its write can start, so a pass over ten thousand RCs
        // holds the plans, facts and conditions of the few being written, not of them all.
        // Not a mapped stream: one mapping through a closure would not be `Send` for every
        // lifetime, as the pass's future must be.
        let mut planned = claimed.into_iter().map(|id| {
            let rc = &world.rcs.items()[id];
            let planned = plan(world, &mut load, id, &rc.value);
            let facts = facts(world, id, &rc.value, planned.as_ref());
            let published = conditions
                .changed(id, rc_conditions(&facts), rc.index, None)
                .map(|record| conditions.put_op(id, &record));
            (id, rc, planned, published)
        });
        let mut writing = FuturesUnordered::new();
        let mut outcomes = Vec::new();
        // The RCs whose only write is their conditions, gathered for one transaction.
        let mut conditions_only = Vec::new();
        loop {
            while writing.len() < CONCURRENT_OBJECTS {
                let Some((id, rc, planned, published)) = planned.next() else {
                    if !conditions_only.is_empty() {
                        let gathered = std::mem::take(&mut conditions_only);
                        writing.push(Either::Right(publish_together(ctx, gathered)));
                    }
                    break;
                };
                match (planned, published) {
                    (Ok(plan), Some(op)) if plan.writes_nothing() => {
                        conditions_only.push((id, op));
                        if conditions_only.len() == CONDITIONS_PER_TXN {
                            let gathered = std::mem::take(&mut conditions_only);
                            writing.push(Either::Right(publish_together(ctx, gathered)));
                        }
                    }
                    (planned, published) => writing.push(Either::Left(async move {
                        vec![write(ctx, world, id, rc, planned, published).await]
                    })),
                }
            }
            let Some(outcome) = writing.next().await else {
                break;
            };
            outcomes.extend(outcome);
        }
        drop(writing);
        if ctx.cancel.is_cancelled() {
            return None;
        }
        for (id, applied) in outcomes {
            self.retries.record("RC", id, applied);
        }
        let removed = self
            .conditions
            .remove_stale(ctx, world, |id| world.rcs.items().contains_key(id))
            .await;
        let released = ctx
            .release_orphaned(world, layout::RC_LOCKS, |id| {
                world.rcs.items().contains_key(id)
            })
            .await;
        self.retries.retain(|id| world.rcs.items().contains_key(id));
        self.retries.tidied(removed.and(released));
        None
    }
}

/// How many pods each node is intended to run, kept up to date by the plans of one pass so
/// that new pods spread over nodes; also ordered by load, so that placing a pod costs the
/// nodes looked at rather than every node.
pub struct Load {
    by_node: HashMap<String, usize>,
    /// `(load, node)` of every node of `by_node` and every labelled node.
    ordered: BTreeSet<(usize, String)>,
    /// How many pods of each disabled RC the pass's plans replace in place, so that the RCs
    /// of a pod id together replace no more of a rolling RC's pods than its [`surplus`].
    replaced: HashMap<String, usize>,
}

impl Load {
    /// The load the intent tree shows.
    pub fn of(world: &World) -> Load {
        let mut by_node: HashMap<String, usize> = world
            .nodes
            .items
            .keys()
            .map(|node| (node.clone(), 0))
            .collect();
        for (node, n) in world.load_by_node() {
            by_node.insert(node.to_owned(), n);
        }
        let ordered = by_node.iter().map(|(node, n)| (*n, node.clone())).collect();
        Load {
            by_node,
            ordered,
            replaced: HashMap::new(),
        }
    }

    fn get(&self, node: &str) -> usize {
        self.by_node.get(node).copied().unwrap_or(0)
    }

    /// The nodes from the least loaded, by name among equals.
    fn least_loaded(&self) -> impl Iterator<Item = &String> {
        self.ordered.iter().map(|(_, node)| node)
    }

    fn set(&mut self, node: &str, n: usize) {
        let old = self.by_node.insert(node.to_owned(), n).unwrap_or(0);
        self.ordered.remove(&(old, node.to_owned()));
        self.ordered.insert((n, node.to_owned()));
    }

    fn add(&mut self, node: &str) {
        self.set(node, self.get(node) + 1);
    }

    fn remove(&mut self, node: &str) {
        if self.by_node.contains_key(node) {
            self.set(node, self.get(node).saturating_sub(1));
        }
    }
}

/// The labels an RC puts on its pods.
fn pod_labels(id: &str, rc: &StoredRc) -> Labels {
    let mut labels = rc.pod_labels.clone().unwrap_or_default();
    labels.insert(POD_ID_LABEL.into(), rc.manifest.pod_id().into());
    labels.insert(RC_ID_LABEL.into(), id.into());
    labels
}

/// What one RC's conditions are made of: what the farm sees of it and what `plan` (or why
/// it could not plan) says.
fn facts(world: &World, id: &str, rc: &StoredRc, plan: Result<&Plan, &FarmError>) -> RcFacts {
    let counts = count(world, id, rc);
    let mut facts = RcFacts {
        desired: rc.replicas_desired,
        disabled: rc.disabled,
        rolling: world.lock_holder(&layout::rc_mutation(id)).is_some(),
        current: usize::try_from(counts.pods.current).unwrap_or(usize::MAX),
        healthy: usize::try_from(counts.pods.healthy).unwrap_or(usize::MAX),
        ..RcFacts::default()
    };
    match plan {
        Ok(plan) => {
            facts.eligible = plan.eligible;
            facts.available = plan.short;
            facts.transfer = plan.transfer.is_some();
            // The conditions are written with the plan's changes. When it only adds pods,
            // they tell how the RC is once those are written, as the next pass will find it
            // and so leave it: that pass rewrote every RC of a newly scheduled fleet, only to
            // say that the pods had been placed.
            if plan
                .changes
                .iter()
                .any(|c| matches!(c, Change::Unschedule(_)))
            {
                facts.changes = plan.changes.len();
            } else {
                // Only a pod on a node the RC is not on yet is one more: a `Schedule` on a
                // current node rewrites that pod's intent.
                facts.current += plan
                    .changes
                    .iter()
                    .filter(|c| !plan.current.contains(c.node()))
                    .count();
            }
        }
        Err(e) => facts.selector_error = Some(e.to_string()),
    }
    facts
}

/// What one reconcile of one RC does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The nodes the RC has its pod on now.
    pub current: BTreeSet<String>,
    /// How many nodes its selector matches (0 for a disabled RC, whose nodes are not looked
    /// at).
    pub eligible: usize,
    /// Pod changes, written in batches.
    pub changes: Vec<Change>,
    /// Or a node transfer, written alone in one transaction.
    pub transfer: Option<Transfer>,
    /// Too few eligible free nodes: how many the RC could have, for the alert.
    pub short: Option<usize>,
}

impl Plan {
    /// Whether applying it writes nothing (nor alerts): no pod changes, no transfer, enough
    /// nodes.
    fn writes_nothing(&self) -> bool {
        self.changes.is_empty() && self.transfer.is_none() && self.short.is_none()
    }
}

/// One pod change.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    Schedule(String),
    /// Schedule on a node whose pod of the same id belongs to a disabled RC.
    Replace(String, Replaced),
    Unschedule(String),
}

impl Change {
    fn node(&self) -> &String {
        match self {
            Change::Schedule(node) | Change::Replace(node, _) | Change::Unschedule(node) => node,
        }
    }
}

/// The disabled RC whose pod is replaced in place, as the farm saw it.
#[derive(Debug, PartialEq, Eq)]
pub struct Replaced {
    pub rc_id: String,
    /// The RC's index: the replacement holds only while it is unchanged (still disabled).
    index: u64,
    /// The label keys it put on its pods, which go with it.
    labels: Vec<String>,
}

/// A node transfer: the pod moves from `leaving` to `arriving`.
#[derive(Debug, PartialEq, Eq)]
pub struct Transfer {
    pub leaving: String,
    pub arriving: String,
    /// The RC's mutation lock's index as seen (`None`: free): the move holds only while
    /// nobody took it since.
    mutation_index: Option<u64>,
}

/// Where an enabled RC may place its pod on `node`: a free node (`None` inside), or a node
/// whose pod of the same id belongs to a disabled RC; `None` when the node is taken.
fn placement(world: &World, id: &str, node: &str, pod_id: &str) -> Option<Option<Replaced>> {
    let pod = pod_key(node, pod_id);
    if world.intent(&pod).is_none() {
        return Some(None);
    }
    let owner = world.pod_labels_of(&pod)?.get(RC_ID_LABEL)?;
    let rc = world.rcs.items().get(owner)?;
    (owner != id && rc.value.disabled && rc.value.manifest.pod_id() == pod_id).then(|| {
        Some(Replaced {
            rc_id: owner.to_owned(),
            index: rc.index,
            labels: pod_labels(owner, &rc.value).into_keys().collect(),
        })
    })
}

/// The pods an RC holds on nodes, by the label naming it.
fn current_nodes(world: &World, id: &str, pod_id: &str) -> BTreeSet<String> {
    world
        .pods_labelled(RC_ID_LABEL, id)
        .into_iter()
        .filter(|(_, pod)| &**pod == pod_id)
        .map(|(node, _)| node.to_string())
        .collect()
}

/// Whether an enabled RC running `pod_id` (the new RC of a roll, or any other: each may
/// replace a disabled RC's surplus in place, [`surplus`]) still has pods to place on one of
/// the nodes `current` (a disabled RC's): it may replace that RC's pods in place, so its
/// surplus must wait, or one step of the roll would stop two pods. An RC whose selector
/// matches none of them (another zone's RC of the same pod id) cannot, and holds nothing up
/// however long it stays short of nodes.
fn placement_pending(world: &World, pod_id: &str, current: &BTreeSet<String>) -> bool {
    world.rcs_running(pod_id).any(|(id, rc)| {
        !rc.value.disabled
            && usize::try_from(rc.value.replicas_desired).unwrap_or(0)
                > current_nodes(world, id, pod_id).len()
            && rc
                .value
                .node_selector
                .parse::<Selector>()
                .is_ok_and(|selector| {
                    let eligible = world.nodes_matching(&rc.value.node_selector, &selector);
                    current.iter().any(|node| eligible.contains(node))
                })
    })
}

/// How many of disabled RC `rc_id`'s pods another RC may replace in place. While a roll
/// holds it, only those it no longer wants (its current pods above its count): P2's roll
/// algorithm spends the replicas a step adds beyond those it removes (a roll to more pods
/// than the old RC had) on nodes neither RC runs, so replacing the pods the old RC keeps
/// would take more down than the roll's minimum allows. Otherwise any of them, as P2's
/// worker overwrites any node's pod.
fn surplus(world: &World, rc_id: &str, pod_id: &str) -> usize {
    let Some(rc) = world.rcs.items().get(rc_id) else {
        return 0;
    };
    if world.lock_holder(&layout::rc_mutation(rc_id)).is_none() {
        return usize::MAX;
    }
    let desired = usize::try_from(rc.value.replicas_desired.max(0)).unwrap_or(0);
    current_nodes(world, rc_id, pod_id)
        .len()
        .saturating_sub(desired)
}

/// At most `need` nodes to place an RC's pod on, best first: those where it replaces a
/// disabled RC's pod ([`surplus`] of them), then free ones, each the least loaded first,
/// then by name, then the other disabled RCs' pods. Fewer only when there are no more.
fn candidates(
    world: &World,
    load: &Load,
    id: &str,
    pod_id: &str,
    eligible: &BTreeSet<String>,
    current: &BTreeSet<String>,
    need: usize,
) -> Vec<(String, Option<Replaced>)> {
    let open = |node: &str| eligible.contains(node) && !current.contains(node);
    let running = world.nodes_running(pod_id).unwrap_or_default();
    let mut replacing: Vec<(String, Replaced)> = running
        .iter()
        .filter(|node| open(node))
        .filter_map(|node| Some((node.to_string(), placement(world, id, node, pod_id)??)))
        .collect();
    replacing.sort_by(|(a, _), (b, _)| (load.get(a), a).cmp(&(load.get(b), b)));
    // How many more pods of each disabled RC may be replaced before a free node is used: a
    // rolling one's surplus only, less what the pass's earlier plans replace.
    let mut replaceable: HashMap<String, usize> = HashMap::new();
    let mut chosen: Vec<(String, Option<Replaced>)> = Vec::new();
    let mut kept = Vec::new();
    for (node, replaced) in replacing {
        if chosen.len() >= need {
            break;
        }
        let left = replaceable
            .entry(replaced.rc_id.clone())
            .or_insert_with(|| {
                let before = load.replaced.get(&replaced.rc_id).copied().unwrap_or(0);
                surplus(world, &replaced.rc_id, pod_id).saturating_sub(before)
            });
        if *left == 0 {
            kept.push((node, replaced));
            continue;
        }
        *left -= 1;
        chosen.push((node, Some(replaced)));
    }
    for node in load.least_loaded() {
        if chosen.len() >= need {
            break;
        }
        // `running` holds every node that intends the pod: only its labels may hold it.
        if open(node) && !running.contains(node.as_str()) && !held_by_labels(world, node, pod_id) {
            chosen.push((node.clone(), None));
        }
    }
    // With no free node left, a pod the old RC still wants is replaced after all, as P2's
    // worker would: otherwise a roll whose old RC is short of nodes never completes.
    let room = need.saturating_sub(chosen.len());
    chosen.extend(
        kept.into_iter()
            .take(room)
            .map(|(node, replaced)| (node, Some(replaced))),
    );
    chosen
}

/// Unschedules `count` of `current`: ineligible nodes first, then the busiest, then by name
/// for determinism.
fn remove(
    load: &mut Load,
    eligible: &BTreeSet<String>,
    current: &BTreeSet<String>,
    count: usize,
) -> Vec<Change> {
    let mut victims: Vec<&String> = current.iter().collect();
    victims.sort_by_key(|node| {
        (
            eligible.contains(*node),
            std::cmp::Reverse(load.get(node)),
            (*node).clone(),
        )
    });
    victims
        .into_iter()
        .take(count)
        .map(|node| {
            load.remove(node);
            Change::Unschedule(node.clone())
        })
        .collect()
}

/// Decides how one RC's pods come in line with its fields (P2's meet-desires), counting
/// the pods it places in `load`.
pub fn plan(world: &World, load: &mut Load, id: &str, rc: &StoredRc) -> FarmResult<Plan> {
    let pod_id = rc.manifest.pod_id().to_owned();
    let current = current_nodes(world, id, &pod_id);
    let mut plan = Plan {
        current,
        ..Plan::default()
    };
    // A disabled RC changes nothing, unless it is the old RC of a roll.
    let rolling = world.lock_holder(&layout::rc_mutation(id)).is_some();
    if rc.disabled && !rolling {
        return Ok(plan);
    }
    let selector: Selector = rc
        .node_selector
        .parse()
        .map_err(|e| FarmError::Unusable(format!("the RC's node selector is invalid: {e}")))?;
    let eligible = world.nodes_matching(&rc.node_selector, &selector);
    plan.eligible = eligible.len();
    let current = &plan.current;
    let desired = usize::try_from(rc.replicas_desired.max(0)).unwrap_or(0);

    if rc.disabled {
        // The old RC of a roll gives up its surplus once no new pod may still replace one.
        if desired < current.len() && !placement_pending(world, &pod_id, current) {
            plan.changes = remove(load, &eligible, current, current.len() - desired);
        }
        return Ok(plan);
    }

    let mut changes = Vec::new();
    if desired > current.len() {
        let need = desired - current.len();
        let candidates = candidates(world, load, id, &pod_id, &eligible, current, need);
        if candidates.len() < need {
            plan.short = Some(current.len() + candidates.len());
        }
        for (node, replaced) in candidates {
            changes.push(match replaced {
                Some(replaced) => {
                    *load.replaced.entry(replaced.rc_id.clone()).or_default() += 1;
                    Change::Replace(node, replaced)
                }
                None => {
                    load.add(&node);
                    Change::Schedule(node)
                }
            });
        }
    } else if desired < current.len() {
        changes = remove(load, &eligible, current, current.len() - desired);
    } else if rc.allocation_strategy == AllocationStrategy::Dynamic {
        if let Some(transfer) = transfer_node(world, load, id, rc, &eligible, current) {
            plan.transfer = Some(transfer);
            return Ok(plan);
        }
    }

    // Consistency: every current, eligible node's intent carries the RC's manifest.
    let changed: BTreeSet<&String> = changes.iter().map(Change::node).collect();
    let stale: Vec<String> = current
        .iter()
        .filter(|node| eligible.contains(*node) && !changed.contains(node))
        .filter(|node| {
            !world
                .intent(&pod_key(node, &pod_id))
                .is_some_and(|raw| same_manifest(raw, &rc.manifest))
        })
        .cloned()
        .collect();
    changes.extend(stale.into_iter().map(Change::Schedule));
    plan.changes = changes;
    Ok(plan)
}

/// Node transfer: moves the pod off the first ineligible current node to the
/// least-loaded eligible free node, when health allows and no roll holds the RC's mutation
/// lock. A node whose labels cannot be read is not known to be ineligible: its pod stays,
/// as P2's RC, whose node selection fails on such a key, moves nothing.
fn transfer_node(
    world: &World,
    load: &mut Load,
    id: &str,
    rc: &StoredRc,
    eligible: &BTreeSet<String>,
    current: &BTreeSet<String>,
) -> Option<Transfer> {
    let pod_id = rc.manifest.pod_id();
    let leaving = current
        .iter()
        .find(|node| !eligible.contains(*node) && !world.node_unreadable(node))?;
    let mutation = layout::rc_mutation(id);
    if world.lock_holder(&mutation).is_some() {
        return None;
    }
    // Moving an unhealthy pod cannot lower health; moving a healthy one needs all healthy.
    let passing = |node: &String| world.health_of(&pod_key(node, pod_id)) == HealthState::Passing;
    if passing(leaving) && !current.iter().all(passing) {
        return None;
    }
    let arriving = eligible
        .iter()
        .filter(|node| !current.contains(*node))
        .filter(|node| is_free(world, &pod_key(node, pod_id)))
        .min_by_key(|node| (load.get(node), *node))?;
    load.add(arriving);
    Some(Transfer {
        leaving: leaving.clone(),
        arriving: arriving.clone(),
        mutation_index: world.locks.items.get(&mutation).map(|lock| lock.index),
    })
}

/// Carries out `plan`: the alert, then the transfer or the changes in batches, each with its
/// audit record listing the RC's nodes after it. `with` (the RC's conditions, when they
/// changed) goes in the last transaction if it has room, else in one of its own, so an RC
/// settled in one batch costs one transaction.
///
/// Each transaction holds only while the RC is still the version `seen` planned from: a pass
/// writes each RC from the world it began with, and an RC scaled down, edited or deleted
/// meanwhile would otherwise get pods it no longer wants (those of a deleted RC run for
/// good, as nothing removes them); the next pass plans from the RC as it is.
async fn apply(
    ctx: &FarmContext,
    world: &World,
    id: &str,
    seen: &Shared<StoredRc>,
    plan: Plan,
    mut with: Option<TxnOp>,
) -> FarmResult<()> {
    let rc = &*seen.value;
    let unchanged = TxnOp::CheckIndex {
        key: layout::rc(id),
        index: seen.index,
    };
    let pod_id = rc.manifest.pod_id();
    if let Some(available) = plan.short {
        let description = format!(
            "RC {id} wants {} replicas of {pod_id} but only {available} nodes are eligible and free",
            rc.replicas_desired
        );
        let details = json!({"rc_id": id, "pod_id": pod_id, "node_selector": rc.node_selector,
                             "hostname": ctx.holder});
        ctx.alert(FARM, (ObjectKind::Rcs, id), id, description, details)
            .await;
    }
    let lock = layout::rc_ownership(id);
    let labels = pod_labels(id, rc);
    let owned: Vec<&str> = labels.keys().map(String::as_str).collect();
    let pod = |node: &str| pod_key(node, pod_id);
    let mut nodes = plan.current;
    if let Some(transfer) = plan.transfer {
        // Atomic with the move: nobody took the mutation lock since the farm looked.
        let key = layout::rc_mutation(id);
        let mut ops = vec![
            unchanged,
            match transfer.mutation_index {
                None => TxnOp::CheckNotExists { key },
                Some(index) => TxnOp::CheckIndex { key, index },
            },
        ];
        ops.extend(unschedule_ops(world, &pod(&transfer.leaving), &owned));
        ops.extend(schedule_ops(
            world,
            &pod(&transfer.arriving),
            &rc.manifest,
            &labels,
        ));
        nodes.remove(&transfer.leaving);
        nodes.insert(transfer.arriving.clone());
        ops.push(audit_op(rc, &nodes));
        ops.extend(scheduled_ops(ctx, id, &[&transfer.leaving], &[&transfer.arriving]).await?);
        ops.extend(with);
        ctx.commit(&lock, ops).await?;
        tracing::info!(rc = %id, from = %transfer.leaving, to = %transfer.arriving, "node transfer");
        return Ok(());
    }
    let changes = plan.changes.iter().map(|change| match change {
        Change::Schedule(node) => {
            let ops = schedule_ops(world, &pod(node), &rc.manifest, &labels);
            (node.as_str(), true, ops)
        }
        Change::Replace(node, replaced) => {
            let mut ops = vec![TxnOp::CheckIndex {
                key: layout::rc(&replaced.rc_id),
                index: replaced.index,
            }];
            let dropped: Vec<&str> = replaced.labels.iter().map(String::as_str).collect();
            ops.extend(replace_ops(
                world,
                &pod(node),
                &rc.manifest,
                &labels,
                &dropped,
            ));
            (node.as_str(), true, ops)
        }
        Change::Unschedule(node) => (
            node.as_str(),
            false,
            unschedule_ops(world, &pod(node), &owned),
        ),
    });
    let beside = audit_bound(rc, &nodes, &plan.changes);
    let mut batches = batches(changes, beside);
    while let Some(batch) = batches.next() {
        for node in &batch.left {
            nodes.remove(*node);
        }
        nodes.extend(batch.placed.iter().map(|node| node.to_string()));
        let mut ops = vec![unchanged.clone()];
        ops.extend(batch.ops);
        ops.push(audit_op(rc, &nodes));
        ops.extend(scheduled_ops(ctx, id, &batch.left, &batch.placed).await?);
        // Room for it and the fence.
        if batches.done() && ops.len() + 2 <= MAX_TXN_OPS {
            ops.extend(with.take());
        }
        ctx.commit(&lock, ops).await?;
        tracing::info!(rc = %id, nodes = nodes.len(), "RC retargeted");
    }
    if let Some(op) = with {
        ctx.commit(&lock, vec![op]).await?;
    }
    Ok(())
}

/// How many RCs' conditions, each fenced by the RC's ownership lock, one transaction
/// stores.
const CONDITIONS_PER_TXN: usize = MAX_TXN_OPS / 2;

/// Stores the conditions of RCs that have nothing else to write in one transaction, each
/// record fenced by its RC's ownership lock: after a pass schedules a thousand RCs, the next
/// records their pods placed, and then each health result coming in changes a count. When
/// the transaction fails (a lock lost, a store error), each RC is written alone, so that
/// one RC's failure backs off only that RC.
async fn publish_together<'a>(
    ctx: &FarmContext,
    gathered: Vec<(&'a str, TxnOp)>,
) -> Vec<(&'a str, FarmResult<()>)> {
    let fenced = gathered
        .iter()
        .map(|(id, op)| (layout::rc_ownership(id), op.clone()))
        .collect();
    match ctx.commit_each(fenced).await {
        Ok(_) => gathered.into_iter().map(|(id, _)| (id, Ok(()))).collect(),
        Err(e) => {
            tracing::debug!(error = %e, "storing the conditions of several RCs at once failed; storing them one by one");
            let mut outcomes = Vec::with_capacity(gathered.len());
            for (id, op) in gathered {
                let lock = layout::rc_ownership(id);
                outcomes.push((id, ctx.commit(&lock, vec![op]).await.map(drop)));
            }
            outcomes
        }
    }
}

/// Writes RC `id`'s planned changes with the op `published` storing its conditions (only
/// that, when it could not be planned).
async fn write<'a>(
    ctx: &FarmContext,
    world: &World,
    id: &'a str,
    rc: &Shared<StoredRc>,
    planned: FarmResult<Plan>,
    published: Option<TxnOp>,
) -> (&'a str, FarmResult<()>) {
    let applied = match planned {
        Ok(plan) => apply(ctx, world, id, rc, plan, published).await,
        // The conditions say why it cannot be planned.
        Err(e) => {
            if let Some(op) = published {
                if let Err(e) = ctx.commit(&layout::rc_ownership(id), vec![op]).await {
                    // The next pass computes them again.
                    tracing::debug!(rc = %id, error = %e, "writing the conditions of an RC failed");
                }
            }
            Err(e)
        }
    };
    (id, applied)
}

/// The farm's name in logs and in the actor of its events.
const FARM: &str = "rc";

/// The ops recording that RC `id`'s pods `left` some nodes and were `placed` on others.
async fn scheduled_ops(
    ctx: &FarmContext,
    id: &str,
    left: &[&str],
    placed: &[&str],
) -> FarmResult<Vec<TxnOp>> {
    let change = nodes_moved(left, placed);
    let event = ctx
        .actor(FARM)
        .event(ObjectKind::Rcs, id, Action::Scheduled, vec![change]);
    ctx.record(&event).await
}

/// At most how many bytes the audit record of any transaction making `changes` takes, as Consul
/// encodes it: it lists every node the RC is on, `current` and those `changes` place it on.
fn audit_bound(rc: &StoredRc, current: &BTreeSet<String>, changes: &[Change]) -> usize {
    let placed = changes.iter().filter_map(|change| match change {
        Change::Schedule(node) | Change::Replace(node, _) => Some(node),
        Change::Unschedule(_) => None,
    });
    let most: BTreeSet<String> = current.iter().chain(placed).cloned().collect();
    audit_op(rc, &most).encoded_len()
}

fn audit_op(rc: &StoredRc, nodes: &BTreeSet<String>) -> TxnOp {
    let nodes: Vec<String> = nodes.iter().cloned().collect();
    let record = AuditRecord::rc_retarget(rc, &nodes, SystemTime::now());
    TxnOp::Set {
        key: layout::new_audit_log(),
        value: record.to_json(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::farms::fixture::{rc, Fleet, HELLO_1, HELLO_2};

    const OLD: &str = "00000000-0000-4000-8000-000000000001";
    const NEW: &str = "00000000-0000-4000-8000-000000000002";
    const OTHER: &str = "00000000-0000-4000-8000-000000000003";

    /// The lock of a gone RC that the store failed to free stays in the farm's retries, so
    /// that the farm wakes to free it on its backoff, rather than at the next change or the
    /// resync: until then no other farm (P2's, or a next term's) can take the RC's id.
    #[tokio::test]
    async fn an_orphaned_lock_the_store_failed_to_free_is_retried() {
        let (_dir, _, mirror) = crate::farms::fixture::idle_context().await;
        // Over a store that refuses every write.
        let read_only = crate::state::MirrorReader::new(mirror.clone());
        let ctx = crate::farms::fixture::context(std::sync::Arc::new(read_only));
        let mut farm = RcFarm::new(mirror);
        let mut gone = Fleet::new();
        gone.lock(&layout::rc_ownership(OLD), &ctx.session);
        let started = Instant::now();
        farm.pass(&ctx, &gone.world()).await;
        assert_eq!(farm.retries().waiting(), 1);
        assert!(farm.retries().due_after(started).is_some());
        // Freed, it is forgotten.
        farm.pass(&ctx, &Fleet::new().world()).await;
        assert_eq!(farm.retries().waiting(), 0);
    }

    /// Web nodes `w1..=wN` and db nodes `d1..=dN`.
    fn fleet(web: usize, db: usize) -> Fleet {
        let mut fleet = Fleet::new();
        for i in 1..=web {
            fleet.node(&format!("w{i}"), "web");
        }
        for i in 1..=db {
            fleet.node(&format!("d{i}"), "db");
        }
        fleet
    }

    /// `web` nodes; a roll holds a disabled old RC wanting `old_desired` pods, with pods on
    /// `w1` and `w2`, and a new RC wanting one.
    fn rolling_pair(web: usize, old_desired: i64) -> Fleet {
        let mut fleet = fleet(web, 0);
        let mut old = rc(OLD, HELLO_1, old_desired, "");
        old.disabled = true;
        fleet.put_rc(old, 4).put_rc(rc(NEW, HELLO_2, 1, ""), 5);
        fleet.rc_pod(OLD, "w1", None).rc_pod(OLD, "w2", None);
        fleet
            .lock(&layout::rc_mutation(OLD), "roll")
            .lock(&layout::rc_mutation(NEW), "roll");
        fleet
    }

    fn run(fleet: &Fleet, id: &str) -> Plan {
        let world = fleet.world();
        let rc = &world.rcs.items()[id].value;
        plan(&world, &mut Load::of(&world), id, rc).unwrap()
    }

    fn nodes(changes: &[Change]) -> Vec<String> {
        changes
            .iter()
            .map(|change| match change {
                Change::Schedule(node) => format!("+{node}"),
                Change::Replace(node, replaced) => format!("{node}<-{}", replaced.rc_id),
                Change::Unschedule(node) => format!("-{node}"),
            })
            .collect()
    }

    #[test]
    fn adds_on_the_least_loaded_eligible_nodes() {
        let mut fleet = fleet(3, 1);
        fleet
            .intents
            .insert(("w1".into(), "other".into()), HELLO_1.into());
        fleet.put_rc(rc(NEW, HELLO_1, 2, "role=web"), 5);
        let plan = run(&fleet, NEW);
        assert_eq!(nodes(&plan.changes), ["+w2", "+w3"]);
        assert_eq!(plan.short, None);
        assert_eq!(plan.transfer, None);
    }

    #[test]
    fn too_few_nodes_places_what_it_can_and_says_so() {
        let mut fleet = fleet(2, 0);
        fleet.put_rc(rc(NEW, HELLO_1, 3, "role=web"), 5);
        let plan = run(&fleet, NEW);
        assert_eq!(nodes(&plan.changes), ["+w1", "+w2"]);
        assert_eq!(plan.short, Some(2));
    }

    #[test]
    fn removes_ineligible_nodes_first() {
        let mut fleet = fleet(2, 1);
        fleet.put_rc(rc(NEW, HELLO_1, 2, "role=web"), 5);
        for node in ["w1", "w2", "d1"] {
            fleet.rc_pod(NEW, node, Some(HealthState::Passing));
        }
        let plan = run(&fleet, NEW);
        assert_eq!(nodes(&plan.changes), ["-d1"]);
    }

    #[test]
    fn rewrites_intents_that_are_not_the_rcs_manifest() {
        let mut fleet = fleet(2, 0);
        fleet.put_rc(rc(NEW, HELLO_1, 2, ""), 5);
        fleet.rc_pod(NEW, "w1", None).rc_pod(NEW, "w2", None);
        fleet
            .intents
            .insert(("w2".into(), "hello".into()), HELLO_2.into());
        assert_eq!(nodes(&run(&fleet, NEW).changes), ["+w2"]);
    }

    #[test]
    fn replaces_a_disabled_rcs_pod_in_place_before_using_a_spare_node() {
        let mut fleet = fleet(3, 0);
        let mut old = rc(OLD, HELLO_1, 2, "");
        old.disabled = true;
        fleet.put_rc(old, 4).put_rc(rc(NEW, HELLO_2, 1, ""), 5);
        fleet.rc_pod(OLD, "w1", None).rc_pod(OLD, "w2", None);
        let plan = run(&fleet, NEW);
        assert_eq!(nodes(&plan.changes), [format!("w1<-{OLD}")]);
        let Change::Replace(_, replaced) = &plan.changes[0] else {
            unreachable!()
        };
        assert_eq!(replaced.index, 4, "only while the old RC is unchanged");
        assert!(replaced.labels.contains(&RC_ID_LABEL.to_owned()));
    }

    /// A roll that grows the pod count (target above the old RC's count) gives the new RC
    /// more replicas than it takes from the old one: P2's roll algorithm spends the extra
    /// on nodes neither RC runs, so the old RC must keep the pods it still wants. Replacing
    /// those in place too took every old pod down at once: 5 old pods rolled to 6 with a
    /// minimum of 1 (the first step: old 5 -> 1, new 0 -> 5) left none healthy.
    #[test]
    fn a_rolling_rc_keeps_the_pods_it_still_wants() {
        let mut fleet = fleet(5, 0);
        fleet.node("s1", "spare");
        let mut old = rc(OLD, HELLO_1, 1, "");
        old.disabled = true;
        fleet.put_rc(old, 4).put_rc(rc(NEW, HELLO_2, 5, ""), 5);
        for node in ["w1", "w2", "w3", "w4", "w5"] {
            fleet.rc_pod(OLD, node, Some(HealthState::Passing));
        }
        fleet
            .lock(&layout::rc_mutation(OLD), "roll")
            .lock(&layout::rc_mutation(NEW), "roll");
        let changes = nodes(&run(&fleet, NEW).changes);
        let replaced = changes.iter().filter(|c| c.contains("<-")).count();
        assert_eq!(replaced, 4, "{changes:?}");
        assert!(changes.contains(&"+s1".to_owned()), "{changes:?}");
    }

    /// An old RC short of nodes (it wants more pods than it has) has no surplus for the
    /// first steps: with no free node either, the new RC still replaces one of its pods, or
    /// the roll would wait for its placement for ever.
    #[test]
    fn a_rolling_rcs_wanted_pod_is_replaced_when_no_node_is_free() {
        let mut fleet = rolling_pair(2, 2);
        assert_eq!(nodes(&run(&fleet, NEW).changes), [format!("w1<-{OLD}")]);
        // A free node is used first.
        fleet.node("w3", "web");
        assert_eq!(nodes(&run(&fleet, NEW).changes), ["+w3"]);
    }

    #[test]
    fn never_takes_an_enabled_rcs_node() {
        let mut fleet = fleet(2, 0);
        fleet
            .put_rc(rc(OTHER, HELLO_1, 1, ""), 4)
            .put_rc(rc(NEW, HELLO_2, 2, ""), 5);
        fleet.rc_pod(OTHER, "w1", None);
        let plan = run(&fleet, NEW);
        assert_eq!(nodes(&plan.changes), ["+w2"]);
        assert_eq!(plan.short, Some(1));
    }

    #[test]
    fn a_disabled_rc_changes_nothing_unless_a_roll_holds_it() {
        let mut fleet = fleet(3, 0);
        let mut old = rc(OLD, HELLO_1, 1, "");
        old.disabled = true;
        fleet.put_rc(old, 4);
        fleet.rc_pod(OLD, "w1", None).rc_pod(OLD, "w2", None);
        fleet
            .intents
            .insert(("w1".into(), "hello".into()), HELLO_2.into());
        assert_eq!(
            run(&fleet, OLD),
            Plan {
                current: ["w1".into(), "w2".into()].into(),
                ..Plan::default()
            }
        );

        // Rolling, it removes its surplus (and only that).
        fleet.lock(&layout::rc_mutation(OLD), "roll");
        assert_eq!(nodes(&run(&fleet, OLD).changes), ["-w1"]);
    }

    #[test]
    fn a_rolling_rcs_surplus_waits_while_the_new_rc_may_replace_it() {
        let mut fleet = rolling_pair(3, 1);
        assert!(run(&fleet, OLD).changes.is_empty());

        // Once the new pod is placed (here on a spare node), the surplus goes.
        fleet.rc_pod(NEW, "w3", None);
        assert_eq!(nodes(&run(&fleet, OLD).changes), ["-w1"]);
    }

    /// Only a new RC that may take one of the old RC's nodes holds its surplus: one rolling
    /// elsewhere (another zone's roll of the same pod id, its selector matching none of the
    /// old RC's nodes), and short of nodes there, held it for as long as it stayed short.
    #[test]
    fn a_rolling_rcs_surplus_waits_for_no_rc_that_cannot_take_its_nodes() {
        let mut fleet = fleet(3, 1);
        let mut old = rc(OLD, HELLO_1, 1, "role=web");
        old.disabled = true;
        fleet
            .put_rc(old, 4)
            .put_rc(rc(NEW, HELLO_2, 1, "role=web"), 5)
            .put_rc(rc(OTHER, HELLO_2, 3, "role=db"), 6);
        fleet
            .rc_pod(OLD, "w1", None)
            .rc_pod(OLD, "w2", None)
            .rc_pod(NEW, "w3", None)
            .rc_pod(OTHER, "d1", None);
        for id in [OLD, NEW, OTHER] {
            fleet.lock(&layout::rc_mutation(id), "roll");
        }
        assert_eq!(nodes(&run(&fleet, OLD).changes), ["-w1"]);

        // One that may take its nodes still holds it.
        let mut wider = rc(OTHER, HELLO_2, 3, "");
        wider.disabled = false;
        fleet.put_rc(wider, 7);
        assert!(run(&fleet, OLD).changes.is_empty());
    }

    /// Any enabled RC of the pod id may replace a rolling RC's surplus in place, not only the
    /// roll's new RC: the surplus must wait for it as well. Removed by the old RC while an
    /// enabled RC that is in no roll replaced as many of its other pods, a rolling RC of 4
    /// pods that wants 2 was left with none: the old RC took its busiest nodes, the other RC
    /// its least loaded, so the two writes did not even conflict.
    #[test]
    fn a_rolling_rcs_surplus_waits_for_any_rc_that_may_replace_it() {
        let mut fleet = fleet(4, 0);
        let mut old = rc(OLD, HELLO_1, 2, "role=web");
        old.disabled = true;
        fleet
            .put_rc(old, 4)
            .put_rc(rc(OTHER, HELLO_2, 2, "role=web"), 6);
        for node in ["w1", "w2", "w3", "w4"] {
            fleet.rc_pod(OLD, node, Some(HealthState::Passing));
        }
        // w1 and w2 run more pods than w3 and w4.
        for node in ["w1", "w2"] {
            for pod in ["other", "third"] {
                fleet
                    .intents
                    .insert((node.into(), pod.into()), HELLO_1.into());
            }
        }
        fleet.lock(&layout::rc_mutation(OLD), "roll");
        let world = fleet.world();
        let mut load = Load::of(&world);
        let mut lost = BTreeSet::new();
        // In the order of a pass.
        for id in world.rcs.items().keys() {
            let planned = plan(&world, &mut load, id, &world.rcs.items()[id].value).unwrap();
            for change in planned.changes {
                match change {
                    Change::Unschedule(node) | Change::Replace(node, _) => lost.insert(node),
                    Change::Schedule(_) => false,
                };
            }
        }
        assert!(
            lost.len() <= 2,
            "the old RC keeps 2 pods, but loses {lost:?}"
        );
    }

    /// Two enabled RCs of the pod id, each short, replace no more of a rolling RC's pods in
    /// one pass than its surplus together: the rest of their pods go to free nodes. Each
    /// replaced as many as the surplus, on nodes of its own (the RCs' selectors differ), so
    /// a rolling RC of 4 pods that wants 2 was left with none.
    #[test]
    fn two_rcs_replace_no_more_than_a_rolling_rcs_surplus_together() {
        let mut fleet = fleet(4, 4);
        let mut old = rc(OLD, HELLO_1, 2, "role in (web, db)");
        old.disabled = true;
        fleet
            .put_rc(old, 4)
            .put_rc(rc(NEW, HELLO_2, 2, "role=web"), 5)
            .put_rc(rc(OTHER, HELLO_2, 2, "role=db"), 6);
        for node in ["w1", "w2", "d1", "d2"] {
            fleet.rc_pod(OLD, node, Some(HealthState::Passing));
        }
        fleet.lock(&layout::rc_mutation(OLD), "roll");
        let world = fleet.world();
        let mut load = Load::of(&world);
        let mut replaced = BTreeSet::new();
        // In the order of a pass.
        for id in world.rcs.items().keys() {
            let planned = plan(&world, &mut load, id, &world.rcs.items()[id].value).unwrap();
            for change in planned.changes {
                if let Change::Replace(node, _) = change {
                    replaced.insert(node);
                }
            }
        }
        assert_eq!(
            replaced.len(),
            2,
            "the old RC keeps 2 of its 4 pods, but {replaced:?} are replaced"
        );
    }

    #[test]
    fn a_dynamic_rc_transfers_a_pod_off_an_ineligible_node() {
        let mut fleet = fleet(2, 1);
        let mut dynamic = rc(NEW, HELLO_1, 2, "role=web");
        dynamic.allocation_strategy = AllocationStrategy::Dynamic;
        fleet.put_rc(dynamic, 5);
        fleet.rc_pod(NEW, "w1", Some(HealthState::Passing)).rc_pod(
            NEW,
            "d1",
            Some(HealthState::Passing),
        );
        let plan = run(&fleet, NEW);
        assert!(plan.changes.is_empty());
        assert_eq!(
            plan.transfer,
            Some(Transfer {
                leaving: "d1".into(),
                arriving: "w2".into(),
                mutation_index: None
            })
        );

        // A healthy pod does not move while another is unhealthy...
        fleet
            .health
            .insert(("w1".into(), "hello".into()), HealthState::Critical);
        assert_eq!(run(&fleet, NEW).transfer, None);
        // ...an unhealthy one does.
        fleet
            .health
            .insert(("d1".into(), "hello".into()), HealthState::Warning);
        assert!(run(&fleet, NEW).transfer.is_some());
        // Nothing moves while a roll holds the RC.
        fleet.lock(&layout::rc_mutation(NEW), "roll");
        assert_eq!(
            run(&fleet, NEW),
            Plan {
                current: ["d1".into(), "w1".into()].into(),
                eligible: 2,
                ..Plan::default()
            }
        );
    }

    /// A node whose labels cannot be read may be eligible or not: a dynamic RC's pod stays
    /// on it, as P2's RC, whose node selection fails on such a key, moves nothing. Read as
    /// ineligible, it had its healthy pod moved off to a free node.
    #[test]
    fn a_dynamic_rc_keeps_its_pod_on_a_node_whose_labels_cannot_be_read() {
        let mut fleet = fleet(3, 0);
        let mut dynamic = rc(NEW, HELLO_1, 2, "role=web");
        dynamic.allocation_strategy = AllocationStrategy::Dynamic;
        fleet.put_rc(dynamic, 5);
        fleet.rc_pod(NEW, "w1", Some(HealthState::Passing)).rc_pod(
            NEW,
            "w2",
            Some(HealthState::Passing),
        );
        fleet.unreadable_node("w2");
        let plan = run(&fleet, NEW);
        assert_eq!(plan.transfer, None);
        assert!(plan.changes.is_empty(), "{:?}", plan.changes);

        // A node known not to match still has its pod moved off.
        fleet.node("w2", "db");
        assert!(run(&fleet, NEW).transfer.is_some());
    }

    #[test]
    fn a_static_rc_keeps_its_pods_on_ineligible_nodes() {
        let mut fleet = fleet(2, 1);
        fleet.put_rc(rc(NEW, HELLO_1, 1, "role=web"), 5);
        fleet.rc_pod(NEW, "d1", Some(HealthState::Passing));
        assert_eq!(run(&fleet, NEW).transfer, None);
        assert!(run(&fleet, NEW).changes.is_empty());
    }

    /// A pass that rewrites the intents of pods the RC already has (its manifest changed, or
    /// another tool rewrote an intent) places no pod: the conditions written with it must
    /// count the pods the RC has, not those plus every rewrite. Counting the rewrites says
    /// "4 pods placed" of an RC of 2, and turns a healthy RC's `Ready` false for one pass
    /// (moving its transition time) only to turn it true again on the next.
    #[test]
    fn conditions_written_with_rewritten_intents_count_the_pods_once() {
        use crate::farms::world::pod_key;
        use crate::model::conditions::ConditionStatus;
        use crate::model::HealthState;

        let ready = |fleet: &Fleet| {
            let world = fleet.world();
            let rc = &world.rcs.items()[OLD].value;
            let planned = plan(&world, &mut Load::of(&world), OLD, rc);
            let facts = facts(&world, OLD, rc, planned.as_ref());
            rc_conditions(&facts)
                .into_iter()
                .find(|c| c.condition_type == "Ready")
                .unwrap()
        };

        // Healthy on both nodes, but another tool rewrote one node's intent.
        let mut drifted = fleet(2, 0);
        drifted.put_rc(rc(OLD, HELLO_1, 2, "role=web"), 10);
        drifted
            .rc_pod(OLD, "w1", Some(HealthState::Passing))
            .rc_pod(OLD, "w2", Some(HealthState::Passing));
        drifted
            .intents
            .insert(pod_key("w1", "hello"), HELLO_2.into());
        assert_eq!(nodes(&run(&drifted, OLD).changes), ["+w1"]);
        let shown = ready(&drifted);
        assert_eq!(
            (shown.status, shown.message.as_str()),
            (ConditionStatus::True, "2 of 2 desired pods are healthy")
        );

        // The RC's manifest changed: both intents are rewritten, still two pods.
        let mut patched = fleet(2, 0);
        patched.put_rc(rc(OLD, HELLO_1, 2, "role=web"), 10);
        patched
            .rc_pod(OLD, "w1", Some(HealthState::Passing))
            .rc_pod(OLD, "w2", Some(HealthState::Passing));
        patched.put_rc(rc(OLD, HELLO_2, 2, "role=web"), 11);
        assert_eq!(nodes(&run(&patched, OLD).changes), ["+w1", "+w2"]);
        let shown = ready(&patched);
        assert_eq!(
            shown.message,
            "0 of 2 desired pods are healthy (2 pods placed)"
        );
    }
}
