//! The RC farm: P2's meet-desires (§4.2) for every RC this server owns, plus node transfer
//! for `dynamic_strategy` RCs (§4.3).
//!
//! Rolls follow P2's protocol (§4.6, domain notes §10): the old RC is disabled and the new one
//! enabled. As P2's worker does, an enabled RC takes a node that runs its pod id for a
//! *disabled* RC, replacing that pod in place (the intent is overwritten and the pod's labels
//! move to the new RC), and prefers such nodes to free ones. A disabled RC otherwise makes no
//! change, except that while a roll holds its mutation lock (whoever runs the roll) its
//! surplus pods are removed, so a roll completes whether the new pods replaced old ones in
//! place or landed on spare nodes.
//!
//! Differences from P2, on purpose: new pods go to the least-loaded eligible nodes (P2 fills
//! nodes in name order); a node running the same pod id for an enabled RC or another owner is
//! never taken over; an empty pod-label tree simply means "no pods"; every write is fenced by
//! the RC's ownership lock.

use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

use serde_json::json;
use tokio::time::Instant;

use crate::kv::{StoreError, StoreResult, TxnOp};
use crate::labels::{Labels, Selector, POD_ID_LABEL, RC_ID_LABEL};
use crate::model::{AllocationStrategy, AuditRecord, HealthState, Manifest, StoredRc};
use crate::store::layout;

use super::pods::{replace_ops, same_manifest, schedule_ops, unschedule_ops};
use super::world::{PodKey, World};
use super::{Farm, FarmContext, Retries};

/// Nodes changed per transaction: at most 3 ops each (a check, the labels, the intent), plus
/// the fence and the audit record, under the 64-op limit.
const NODES_PER_TXN: usize = 20;

/// The RC farm's state across passes: only backoffs, nothing a restart would miss.
#[derive(Default)]
pub struct RcFarm {
    retries: Retries,
}

impl Farm for RcFarm {
    const NAME: &'static str = "rc";

    async fn pass(&mut self, ctx: &FarmContext, world: &World) -> Option<Instant> {
        let mut load: HashMap<String, usize> = world
            .load_by_node()
            .into_iter()
            .map(|(node, n)| (node.to_owned(), n))
            .collect();
        for (id, rc) in &world.rcs.items {
            if ctx.cancel.is_cancelled() {
                return None;
            }
            if !ctx
                .claim(world, &mut self.retries, id, &layout::rc_ownership(id))
                .await
            {
                continue;
            }
            let result = reconcile(ctx, world, &mut load, id, &rc.value).await;
            self.retries.record("RC", id, result);
        }
        ctx.release_orphaned(world, "lock/replication_controllers/", |id| {
            world.rcs.items.contains_key(id)
        })
        .await;
        self.retries.retain(|id| world.rcs.items.contains_key(id));
        self.retries.next_due()
    }
}

/// The labels an RC puts on its pods.
fn pod_labels(id: &str, rc: &StoredRc) -> Labels {
    let mut labels = rc.pod_labels.clone().unwrap_or_default();
    labels.insert(POD_ID_LABEL.into(), rc.manifest.pod_id().into());
    labels.insert(RC_ID_LABEL.into(), id.into());
    labels
}

/// What one reconcile changes.
enum Change {
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
struct Replaced {
    rc_id: String,
    /// The RC's index: the replacement holds only while it is unchanged (still disabled).
    index: u64,
    /// The label keys it put on its pods, which go with it.
    labels: Vec<String>,
}

/// Where an enabled RC may place its pod on `node`: a free node (`None` inside), or a node
/// whose pod of the same id belongs to a disabled RC; `None` when the node is taken.
fn placement(world: &World, id: &str, node: &str, pod_id: &str) -> Option<Option<Replaced>> {
    let pod = (node.to_owned(), pod_id.to_owned());
    if !world.intents.items.contains_key(&pod) {
        return Some(None);
    }
    let owner = world.pod_labels.items.get(&pod)?.value.get(RC_ID_LABEL)?;
    let rc = world.rcs.items.get(owner)?;
    (owner != id && rc.value.disabled && rc.value.manifest.pod_id() == pod_id).then(|| {
        Some(Replaced {
            rc_id: owner.clone(),
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
        .filter(|(_, pod)| pod == pod_id)
        .map(|(node, _)| node)
        .collect()
}

/// Whether the new RC of a roll (enabled, its mutation lock held) running `pod_id` still has
/// pods to place: it may replace a disabled RC's pods in place, so that RC's surplus must
/// wait, or one step of the roll would stop two pods.
fn placement_pending(world: &World, pod_id: &str) -> bool {
    world.rcs.items.iter().any(|(id, rc)| {
        !rc.value.disabled
            && rc.value.manifest.pod_id() == pod_id
            && world.lock_holder(&layout::rc_mutation(id)).is_some()
            && usize::try_from(rc.value.replicas_desired).unwrap_or(0)
                > current_nodes(world, id, pod_id).len()
    })
}

/// Unschedules `count` of `current`: ineligible nodes first, then the busiest, then by name
/// for determinism.
fn remove(
    load: &mut HashMap<String, usize>,
    eligible: &BTreeSet<&String>,
    current: &BTreeSet<String>,
    count: usize,
) -> Vec<Change> {
    let mut victims: Vec<&String> = current.iter().collect();
    victims.sort_by_key(|node| {
        (
            eligible.contains(node),
            std::cmp::Reverse(load.get(*node).copied().unwrap_or(0)),
            (*node).clone(),
        )
    });
    victims
        .into_iter()
        .take(count)
        .map(|node| {
            if let Some(n) = load.get_mut(node) {
                *n = n.saturating_sub(1);
            }
            Change::Unschedule(node.clone())
        })
        .collect()
}

/// Brings one RC's pods in line with its fields (P2's meet-desires).
async fn reconcile(
    ctx: &FarmContext,
    world: &World,
    load: &mut HashMap<String, usize>,
    id: &str,
    rc: &StoredRc,
) -> StoreResult<()> {
    // A disabled RC changes nothing, unless it is the old RC of a roll.
    let rolling = world.lock_holder(&layout::rc_mutation(id)).is_some();
    if rc.disabled && !rolling {
        return Ok(());
    }
    let pod_id = rc.manifest.pod_id().to_owned();
    let selector: Selector = rc
        .node_selector
        .parse()
        .map_err(|e| StoreError::Invalid(format!("the RC's node selector is invalid: {e}")))?;
    let eligible: BTreeSet<&String> = world
        .nodes
        .items
        .iter()
        .filter(|(_, labels)| selector.matches(labels))
        .map(|(node, _)| node)
        .collect();
    let current = current_nodes(world, id, &pod_id);
    let desired = usize::try_from(rc.replicas_desired.max(0)).unwrap_or(0);

    if rc.disabled {
        // The old RC of a roll gives up its surplus once no new pod may still replace one.
        if desired < current.len() && !placement_pending(world, &pod_id) {
            let changes = remove(load, &eligible, &current, current.len() - desired);
            return apply(ctx, world, id, rc, &current, changes).await;
        }
        return Ok(());
    }

    let mut changes = Vec::new();
    if desired > current.len() {
        // Nodes where the pod replaces a disabled RC's first, then the least loaded.
        let mut candidates: Vec<(&String, Option<Replaced>)> = eligible
            .iter()
            .copied()
            .filter(|node| !current.contains(*node))
            .filter_map(|node| Some((node, placement(world, id, node, &pod_id)?)))
            .collect();
        candidates.sort_by_key(|(node, replaced)| {
            (
                replaced.is_none(),
                load.get(*node).copied().unwrap_or(0),
                (*node).clone(),
            )
        });
        let need = desired - current.len();
        if candidates.len() < need {
            ctx.alerts
                .low(
                    id,
                    format!(
                        "RC {id} wants {desired} replicas of {pod_id} but only {} nodes are eligible and free",
                        current.len() + candidates.len()
                    ),
                    json!({"rc_id": id, "pod_id": pod_id, "node_selector": rc.node_selector,
                           "hostname": ctx.holder}),
                )
                .await;
        }
        for (node, replaced) in candidates.into_iter().take(need) {
            changes.push(match replaced {
                Some(replaced) => Change::Replace(node.clone(), replaced),
                None => {
                    *load.entry(node.clone()).or_insert(0) += 1;
                    Change::Schedule(node.clone())
                }
            });
        }
    } else if desired < current.len() {
        changes = remove(load, &eligible, &current, current.len() - desired);
    } else if rc.allocation_strategy == AllocationStrategy::Dynamic {
        if let Some(done) = transfer_node(ctx, world, load, id, rc, &eligible, &current).await? {
            return Ok(done);
        }
    }

    // Consistency: every current, eligible node's intent carries the RC's manifest.
    let changed: BTreeSet<&String> = changes.iter().map(Change::node).collect();
    let stale: Vec<String> = current
        .iter()
        .filter(|node| eligible.contains(node) && !changed.contains(node))
        .filter(|node| !intent_matches(world, &((*node).clone(), pod_id.clone()), &rc.manifest))
        .cloned()
        .collect();
    changes.extend(stale.into_iter().map(Change::Schedule));

    apply(ctx, world, id, rc, &current, changes).await
}

fn intent_matches(world: &World, pod: &PodKey, manifest: &Manifest) -> bool {
    world
        .intents
        .items
        .get(pod)
        .is_some_and(|raw| same_manifest(raw, manifest))
}

/// Writes `changes` in batches, each with its audit record listing the RC's nodes after it.
async fn apply(
    ctx: &FarmContext,
    world: &World,
    id: &str,
    rc: &StoredRc,
    current: &BTreeSet<String>,
    changes: Vec<Change>,
) -> StoreResult<()> {
    let lock = layout::rc_ownership(id);
    let labels = pod_labels(id, rc);
    let owned: Vec<&str> = labels.keys().map(String::as_str).collect();
    let pod_id = rc.manifest.pod_id();
    let mut nodes: BTreeSet<String> = current.clone();
    for batch in changes.chunks(NODES_PER_TXN) {
        let mut ops = Vec::new();
        for change in batch {
            match change {
                Change::Schedule(node) => {
                    let pod = (node.clone(), pod_id.to_owned());
                    ops.extend(schedule_ops(world, &pod, &rc.manifest, &labels));
                    nodes.insert(node.clone());
                }
                Change::Replace(node, replaced) => {
                    let pod = (node.clone(), pod_id.to_owned());
                    ops.push(TxnOp::CheckIndex {
                        key: layout::rc(&replaced.rc_id),
                        index: replaced.index,
                    });
                    let dropped: Vec<&str> = replaced.labels.iter().map(String::as_str).collect();
                    ops.extend(replace_ops(world, &pod, &rc.manifest, &labels, &dropped));
                    nodes.insert(node.clone());
                }
                Change::Unschedule(node) => {
                    let pod = (node.clone(), pod_id.to_owned());
                    ops.extend(unschedule_ops(world, &pod, &owned));
                    nodes.remove(node);
                }
            }
        }
        ops.push(audit_op(rc, &nodes));
        ctx.commit(&lock, ops).await?;
        tracing::info!(rc = %id, nodes = nodes.len(), "RC retargeted");
    }
    Ok(())
}

fn audit_op(rc: &StoredRc, nodes: &BTreeSet<String>) -> TxnOp {
    let nodes: Vec<String> = nodes.iter().cloned().collect();
    let record = AuditRecord::rc_retarget(rc, &nodes, SystemTime::now());
    TxnOp::Set {
        key: layout::new_audit_log(),
        value: record.to_json(),
    }
}

/// Node transfer (§4.3): moves the pod off the first ineligible current node to the
/// least-loaded eligible free node, in one transaction, when health allows and no roll holds
/// the RC's mutation lock. `Some(())` when it did (the rest of the reconcile waits for the
/// next pass).
async fn transfer_node(
    ctx: &FarmContext,
    world: &World,
    load: &mut HashMap<String, usize>,
    id: &str,
    rc: &StoredRc,
    eligible: &BTreeSet<&String>,
    current: &BTreeSet<String>,
) -> StoreResult<Option<()>> {
    let pod_id = rc.manifest.pod_id().to_owned();
    let Some(leaving) = current.iter().find(|node| !eligible.contains(node)) else {
        return Ok(None);
    };
    let mutation = layout::rc_mutation(id);
    if world.lock_holder(&mutation).is_some() {
        return Ok(None);
    }
    // Moving an unhealthy pod cannot lower health; moving a healthy one needs all healthy.
    let leaving_pod = (leaving.clone(), pod_id.clone());
    if world.health_of(&leaving_pod) == HealthState::Passing
        && !current
            .iter()
            .all(|node| world.health_of(&(node.clone(), pod_id.clone())) == HealthState::Passing)
    {
        return Ok(None);
    }
    let Some(target) = eligible
        .iter()
        .filter(|node| !current.contains(**node))
        .filter(|node| {
            !world
                .intents
                .items
                .contains_key(&((**node).clone(), pod_id.clone()))
        })
        .min_by_key(|node| (load.get(**node).copied().unwrap_or(0), (**node).clone()))
    else {
        return Ok(None);
    };
    let labels = pod_labels(id, rc);
    let owned: Vec<&str> = labels.keys().map(String::as_str).collect();
    // Atomic with the move: nobody took the mutation lock since the farm looked.
    let mut ops = match world.locks.items.get(&mutation) {
        None => vec![TxnOp::CheckNotExists { key: mutation }],
        Some(lock) => vec![TxnOp::CheckIndex {
            key: mutation,
            index: lock.index,
        }],
    };
    ops.extend(unschedule_ops(world, &leaving_pod, &owned));
    let arriving = ((*target).clone(), pod_id.clone());
    ops.extend(schedule_ops(world, &arriving, &rc.manifest, &labels));
    let mut nodes = current.clone();
    nodes.remove(leaving);
    nodes.insert((*target).clone());
    ops.push(audit_op(rc, &nodes));
    ctx.commit(&layout::rc_ownership(id), ops).await?;
    *load.entry((*target).clone()).or_insert(0) += 1;
    tracing::info!(rc = %id, from = %leaving, to = %target, "node transfer");
    Ok(Some(()))
}
