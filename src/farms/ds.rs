//! The DS farm: keeps each daemon set's pod on every node its selector matches.
//!
//! Per daemon set this server owns (`lock/daemon_sets/<id>`), each pass:
//! - **contention**: of two enabled daemon sets whose own write made them contend
//!   ([`Contention::Written`]), the one written last (higher modify index, then higher ID) is
//!   disabled with an audited CAS write and a low-urgency alert. Its latest write is what
//!   introduced the contention (P2 disables "the one that just appeared or changed"), and no
//!   extra reads are needed. One that another farm owns is that farm's to disable, and one
//!   no farm owns yet the next owner's; one the farm backs off from (its disabling write
//!   failed, or an earlier reconcile of it) stays enabled until a retry succeeds. The one written before it says so in its `Contended` condition
//!   (`ContenderOwnedElsewhere`, `ContenderNotYetOwned`, `ContenderNotYetDisabled`; while
//!   relabelled nodes make it contend, below, their reason stays and its message names the
//!   other), rather than that nothing contends with it: each pass reconciles the daemon set
//!   written last first, so the older one knows whether its contender was disabled. Where
//!   only nodes relabelled since both were written match both ([`Contention::Relabelled`]),
//!   no write of either made it, and disabling one would take its pods off every node for
//!   one node's labels: neither is disabled, each contended node is left to the daemon set
//!   running the pod there (or to neither), and both say so in their `Contended` condition
//!   (`NodeLabelsContend`), each with an alert as that starts (once, told from the
//!   conditions stored, whichever leader wrote them: only an operator ends it). P2's farm,
//!   which looks at contention only for daemon sets created or changed (and at its start),
//!   disables nothing then either, until it restarts. A disabled daemon set changes no
//!   pods: one whose selector does not parse only says so (its conditions), where an enabled
//!   one's reconcile fails.
//! - **scheduling**: eligible nodes without the pod get it, labelled with
//!   `daemon_set_id` only, in name order and as P2's replicator, at most [`MAX_IN_FLIGHT`]
//!   nodes on their way to healthy at a time (new and replaced alike, below); a node already
//!   running the pod id for another owner is left alone, and so is a pod whose labels name
//!   an enabled RC as well as the daemon set, except that a disabled daemon set's pod is taken over in place, as P2's farm writes over
//!   any pod (disabling one daemon set and creating another is how a pod is handed over), at
//!   the pace of a replacement below. Pods on nodes no longer eligible are removed, except
//!   that a daemon set matching no node at all removes nothing (P2's failsafe), and a node
//!   whose labels cannot be read keeps its pod (P2's node selection fails on such a key, so
//!   its farm changes nothing). These writes hold only while the daemon set is the version
//!   they were planned from.
//! - **replacement**: pods whose intent is not the daemon set's manifest are replaced while
//!   at least `min_health` nodes stay healthy (reality equals intent and health passing), at
//!   most [`MAX_IN_FLIGHT`] nodes at a time. P2 ignores `min_health`; we do not. Unhealthy
//!   pods are replaced first, since that costs no health. A node that is not healthy on the
//!   new manifest within the daemon set's `timeout` is given up on (logged and alerted) and no
//!   longer counts as in flight, but as an unhealthy node it still holds the healthy count
//!   down, so a bad manifest stops the rollout at `min_health` instead of reaching every node.
//!   A node that runs the manifest already but is unwell, and was sent nothing in this
//!   rollout (one that sickened), is not in flight, nor timed, nor keeps the rollout in
//!   progress: nothing is on its way to it, as P2's replicator skips a node whose reality
//!   is the manifest.
//!   A zero timeout means "never give up", as does P2's "no timeout" (stored negative, read
//!   as [`NO_TIMEOUT`](crate::model::duration::NO_TIMEOUT)): P2 times nodes out at once on a
//!   zero one, which is why its tools and our API demand a positive one.
//! - **status**: `status/daemon_sets/<id>/daemon_set_farm` is written when it changes.
//!   `nodes_deployed` counts the nodes healthy on the current manifest now, so it also drops
//!   when a node leaves or sickens (P2 only ever raises it within one manifest). It goes
//!   with its daemon set: the delete removes it, and the retention farm one left behind.
//!
//! Then, for the whole farm, **dangling-pod cleanup**: pods labelled with a daemon set
//! that does not exist lose their intent and their `daemon_set_id` label, fenced by the leader
//! lock. Unlike P2, an empty daemon-set tree only removes pods of daemon sets this term saw
//! exist, a daemon set whose key exists but cannot be decoded keeps its pods, and a daemon
//! set another farm still owns is left to that farm.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, SystemTime};

use imbl::OrdSet;
use serde_json::json;
use tokio::time::Instant;

use crate::kv::TxnOp;
use crate::labels::{Labels, Selector, DS_ID_LABEL};
use crate::layout::{self, LEADER_LOCK};
use crate::model::conditions::{
    ds_conditions, Condition, ContenderOwner, DsFacts, LaterContender, NodeContention, Observed,
    NODE_LABELS_CONTEND,
};
use crate::model::event::{ds_changes, Action, ObjectKind};
use crate::model::{AuditRecord, DaemonSetEvent, Manifest, PodHealth, StoredDaemonSet};
use crate::state::Mirror;
use crate::store::conditions::read_conditions;
use crate::store::daemon_sets::{contends, contention, Contention, DaemonSetFarmStatus};

use super::conditions::Published;
use super::pods::{
    batches, is_free, nodes_moved, pod_health, rc_labelled, relabel_ops, same_manifest,
    schedule_ops, unlabel_ops, unschedule_ops,
};
use super::world::{pod_key, PodKey, Shared, World};
use super::{earliest, Farm, FarmContext, FarmError, FarmResult, Retries};

/// Nodes of one daemon set that may be on their way to healthy at once (given a new pod or a
/// new manifest, not yet healthy on it nor given up on), as in P2.
pub const MAX_IN_FLIGHT: usize = 50;
/// How long a daemon set whose key exists but does not decode protects its pods before the
/// cleanup looks at the key again.
const RECHECK_PRESENT: Duration = Duration::from_secs(60);
/// The prefix of the retry key of a deleted daemon set's pods, before its id.
const DANGLING_RETRY: &str = "dangling/";
/// P2's incident key for contention alerts.
const CONTENTION_INCIDENT: &str = "preemptive_ds_contention";

/// The DS farm's state across the passes of one term.
pub struct DsFarm {
    retries: Retries,
    /// Every daemon set listed during this term: only these may be cleaned up when the
    /// daemon-set tree is empty.
    seen: HashSet<String>,
    /// Per daemon set, the rollout of its current manifest.
    rollouts: HashMap<String, Rollout>,
    /// The status record last read or written per daemon set (`None`: absent or unreadable).
    published: HashMap<String, Option<DaemonSetFarmStatus>>,
    /// Dangling daemon-set IDs whose key exists undecodable, until when to trust that.
    present: HashMap<String, Instant>,
    /// The conditions published per daemon set.
    conditions: Published,
}

impl DsFarm {
    /// A DS farm for one term, its conditions as `mirror` holds them.
    pub fn new(mirror: Mirror) -> Self {
        DsFarm {
            retries: Retries::default(),
            seen: HashSet::new(),
            rollouts: HashMap::new(),
            published: HashMap::new(),
            present: HashMap::new(),
            conditions: Published::new(ObjectKind::Daemonsets, mirror),
        }
    }
}

/// The rollout of one manifest: when each node not yet healthy on it started waiting, the
/// nodes sent the pod or the manifest, and the nodes given up on.
#[derive(Debug, Default)]
struct Rollout {
    sha: String,
    since: HashMap<String, Instant>,
    /// Nodes the farm sent the pod or the manifest to, while they wait: each holds a place
    /// among the [`MAX_IN_FLIGHT`] until it is healthy on it or given up on, though it
    /// already runs it.
    sent: HashSet<String>,
    given_up: BTreeSet<String>,
}

/// What one reconcile of an enabled daemon set does.
#[derive(Debug, Default)]
struct Plan {
    /// Pods to unschedule: on nodes no longer eligible, or of a pod id the daemon set no
    /// longer runs.
    remove: Vec<PodKey>,
    /// Eligible nodes to put the pod on in this pass.
    add: Vec<String>,
    /// Nodes whose pod is rewritten with the current manifest.
    replace: Vec<String>,
    /// Pods of a disabled daemon set taken over in place.
    take_over: Vec<TakeOver>,
    /// Nodes given up on in this reconcile.
    timed_out: Vec<String>,
    /// No node is eligible, so the failsafe keeps the pods the daemon set has.
    stranded: bool,
    /// Nodes the selector matches.
    targeted: usize,
    /// Of the nodes keeping the pod, those healthy on what they are meant to run now.
    healthy: usize,
    /// Nodes on an old manifest left as they are because of `min_health`.
    held_back: usize,
    /// Nodes relabelled into contention with another daemon set that this one does not run
    /// the pod on, so leaves alone.
    contended_left: Vec<String>,
    status: DaemonSetFarmStatus,
    /// The next timeout due.
    wake: Option<Instant>,
}

/// A pod of a disabled daemon set that this one takes over on an eligible node, as P2's farm
/// writes over any pod of its pod id: the way to hand a pod from one daemon set to another is
/// to disable the first and create the second, which then takes each node over at its own
/// pace (so deleting the first afterwards removes nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
struct TakeOver {
    node: String,
    /// The disabled daemon set's id and index: the takeover holds only while it is unchanged
    /// (still disabled).
    from: String,
    index: u64,
    /// Whether the pod already runs this daemon set's manifest: only its label changes.
    relabel_only: bool,
}

impl Farm for DsFarm {
    const NAME: &'static str = FARM;
    const OWNERSHIP_LOCKS: Option<&'static str> = Some(layout::DS_LOCKS);

    fn retries(&self) -> &Retries {
        &self.retries
    }

    async fn pass(&mut self, ctx: &FarmContext, world: &World) -> Option<Instant> {
        self.seen.extend(world.daemon_sets.items.keys().cloned());
        let mut disabled_now = HashSet::new();
        let mut wake = None;
        // The one written last first: of two contending by a write, the later one is disabled
        // (or fails to be) before the earlier one is reconciled, whose conditions then tell
        // whether it still stands ([`contentions`]).
        let mut latest_first: Vec<_> = world.daemon_sets.items.iter().collect();
        latest_first.sort_by(|(a_id, a), (b_id, b)| (b.index, b_id).cmp(&(a.index, a_id)));
        for (id, ds) in latest_first {
            if ctx.cancel.is_cancelled() {
                return None;
            }
            if !ctx
                .claim(world, &mut self.retries, id, &layout::ds_ownership(id))
                .await
            {
                continue;
            }
            let result = self.reconcile(ctx, world, &mut disabled_now, id, ds).await;
            if let Some(at) = self.retries.record("daemon set", id, result) {
                wake = earliest(wake, at);
            }
        }
        self.rollouts
            .retain(|id, _| world.daemon_sets.items.contains_key(id));
        self.published
            .retain(|id, _| world.daemon_sets.items.contains_key(id));
        let removed = self
            .conditions
            .remove_stale(ctx, world, |id| world.daemon_sets.items.contains_key(id))
            .await;
        self.clean_dangling(ctx, world).await;
        // A daemon set's key, or a deleted one's whose pods are still there to clean up.
        let by_ds = world.pods_by_label(DS_ID_LABEL);
        self.retries
            .retain(|key| match key.strip_prefix(DANGLING_RETRY) {
                Some(ds_id) => by_ds.contains_key(ds_id),
                None => world.daemon_sets.items.contains_key(key),
            });
        let released = ctx
            .release_orphaned(world, layout::DS_LOCKS, |id| {
                world.daemon_sets.items.contains_key(id)
            })
            .await;
        self.retries.tidied(removed.and(released));
        wake
    }
}

impl DsFarm {
    /// One daemon set: contention, then its pods, then its status record.
    async fn reconcile(
        &mut self,
        ctx: &FarmContext,
        world: &World,
        disabled_now: &mut HashSet<String>,
        id: &str,
        ds: &Shared<StoredDaemonSet>,
    ) -> FarmResult<Option<Instant>> {
        let lock = layout::ds_ownership(id);
        let mut contended = ContendedNodes::new();
        let mut later_contender = None;
        if !ds.value.disabled {
            let contentions = contentions(world, &ctx.session, disabled_now, id, ds);
            if let Some((rival_id, rival)) = contentions.written_before {
                disable(ctx, id, ds, rival_id, &rival.value).await?;
                disabled_now.insert(id.to_owned());
                return Ok(None);
            }
            contended = contentions.relabelled;
            later_contender = contentions.written_after;
        }
        if ds.value.disabled {
            // Paused: no pod changes, and the rollout starts afresh when it is enabled.
            self.rollouts.remove(id);
            let planned = plan(
                world,
                id,
                &ds.value,
                &mut Rollout::default(),
                &ContendedNodes::new(),
                Instant::now(),
            );
            // Contended: it would contend if it were enabled, so it stays disabled.
            let enabled = StoredDaemonSet {
                disabled: false,
                ..StoredDaemonSet::clone(&ds.value)
            };
            let rival = contender(world, id, &enabled, |other_id, _| {
                !disabled_now.contains(other_id)
            })
            .map(|(rival_id, rival)| (rival_id.to_owned(), rival.value.pod_id.clone()));
            let mut facts = facts(&ds.value, planned.as_ref());
            facts.contender = rival;
            self.publish_conditions(ctx, id, ds, ds_conditions(&facts))
                .await?;
            // A selector that does not parse is told by the conditions, not as a failure:
            // a disabled daemon set changes no pods, so trying again would change nothing
            // until it is written again (which the next pass sees), only log and back off
            // for as long as it stays so. It targets no node, as its view counts it.
            let mut status = match planned {
                Ok(plan) => plan.status,
                Err(_) => DaemonSetFarmStatus {
                    manifest_sha: ds.value.manifest.sha(),
                    ..DaemonSetFarmStatus::default()
                },
            };
            status.replication_in_progress = false;
            self.publish(ctx, id, &lock, status).await?;
            return Ok(None);
        }

        let rollout = self.rollouts.entry(id.to_owned()).or_default();
        let planned = plan(world, id, &ds.value, rollout, &contended, Instant::now());
        let mut facts = facts(&ds.value, planned.as_ref());
        facts.relabelled = node_contention(&ds.value, &contended, planned.as_ref().ok());
        facts.later_contender = later_contender;
        let conditions = ds_conditions(&facts);
        // Alerted once, as it starts (the stored conditions tell it, whichever leader wrote
        // them): no daemon set is disabled for it, so only an operator ends it.
        let relabel_contention = (conditions.iter())
            .find(|c| c.condition_type == "Contended" && c.reason == NODE_LABELS_CONTEND)
            .map(|c| c.message.clone());
        let relabel_contention_starts = match relabel_contention {
            Some(message) if !self.relabel_contended(ctx, id).await? => Some(message),
            _ => None,
        };
        self.publish_conditions(ctx, id, ds, conditions).await?;
        if let Some(message) = relabel_contention_starts {
            let nodes = facts.relabelled.clone().unwrap_or_default();
            ctx.alert(
                FARM,
                (ObjectKind::Daemonsets, id),
                &format!("ds_node_labels_contend/{id}"),
                format!("daemon set {id}: {message}"),
                json!({"daemon_set_id": id, "pod_id": ds.value.pod_id,
                       "contending_daemon_sets": nodes.rivals, "nodes_kept": nodes.kept,
                       "nodes_left": nodes.left, "hostname": ctx.holder}),
            )
            .await;
        }
        let plan = planned?;
        if !plan.timed_out.is_empty() {
            tracing::warn!(ds = %id, nodes = ?plan.timed_out, timeout = ?ds.value.timeout,
                           "nodes did not become healthy on the new manifest in time; giving up on them");
            ctx.alert(
                FARM,
                (ObjectKind::Daemonsets, id),
                &format!("ds_replication_timeout/{id}"),
                format!(
                    "daemon set {id}: {} nodes did not become healthy on the new manifest within {:?}",
                    plan.timed_out.len(),
                    ds.value.timeout
                ),
                json!({"daemon_set_id": id, "pod_id": ds.value.pod_id,
                       "nodes": plan.timed_out, "hostname": ctx.holder}),
            )
            .await;
        }
        if plan.stranded {
            ctx.alert(
                FARM,
                (ObjectKind::Daemonsets, id),
                &format!("ds_no_eligible_nodes/{id}"),
                format!("daemon set {id} matches no node; keeping its pods rather than removing every one"),
                json!({"daemon_set_id": id, "node_selector": ds.value.node_selector,
                       "hostname": ctx.holder}),
            )
            .await;
        }
        apply(ctx, world, id, ds, &plan).await?;
        self.publish(ctx, id, &lock, plan.status).await?;
        Ok(plan.wake)
    }

    /// Whether the conditions stored for daemon set `id` say that nodes relabelled into
    /// contention make it contend: as the mirror holds them, else as the store does. The
    /// mirror holds the farm's own writes at once, but may lag another's: a new leader's may
    /// not hold yet what the last leader wrote before this farm took the daemon set, which
    /// would alert again. Asked only while the farm sees such a contention, so the store is
    /// read only as one starts (or on a new leader's mirror that lags).
    async fn relabel_contended(&self, ctx: &FarmContext, id: &str) -> FarmResult<bool> {
        let mirrored = self.conditions.previous(id).map(|record| record.conditions);
        if relabel_contended(mirrored.as_deref().unwrap_or_default()) {
            return Ok(true);
        }
        let stored = read_conditions(ctx.store.as_ref(), ObjectKind::Daemonsets, id).await?;
        Ok(relabel_contended(&stored))
    }

    /// Publishes a daemon set's conditions ([`ds_conditions`]).
    async fn publish_conditions(
        &self,
        ctx: &FarmContext,
        id: &str,
        ds: &Shared<StoredDaemonSet>,
        conditions: Vec<Observed>,
    ) -> FarmResult<()> {
        let lock = layout::ds_ownership(id);
        self.conditions
            .publish(ctx, &lock, id, conditions, ds.index, None)
            .await
    }

    /// Writes the status record if it differs from what is stored.
    async fn publish(
        &mut self,
        ctx: &FarmContext,
        id: &str,
        lock: &str,
        status: DaemonSetFarmStatus,
    ) -> FarmResult<()> {
        let key = layout::ds_farm_status(id);
        if !self.published.contains_key(id) {
            let stored = ctx
                .store
                .get(&key)
                .await?
                .and_then(|pair| serde_json::from_slice(&pair.value).ok());
            self.published.insert(id.to_owned(), stored);
        }
        if self.published.get(id).and_then(Option::as_ref) == Some(&status) {
            return Ok(());
        }
        let value = serde_json::to_vec(&status).expect("a status always serializes");
        ctx.commit(lock, vec![TxnOp::Set { key, value }]).await?;
        self.published.insert(id.to_owned(), Some(status));
        Ok(())
    }

    /// Unschedules pods labelled with daemon sets that do not exist, with the
    /// failsafes described in the module docs.
    async fn clean_dangling(&mut self, ctx: &FarmContext, world: &World) {
        let by_ds = world.pods_by_label(DS_ID_LABEL);
        let dangling: BTreeMap<&str, &OrdSet<PodKey>> = by_ds
            .iter()
            .filter(|(ds_id, _)| !world.daemon_sets.items.contains_key(*ds_id))
            .map(|(ds_id, pods)| (ds_id.as_str(), pods))
            .collect();
        let now = Instant::now();
        self.present
            .retain(|id, until| *until > now && dangling.contains_key(id.as_str()));
        for (ds_id, pods) in dangling {
            if ctx.cancel.is_cancelled() {
                return;
            }
            let retry_key = format!("{DANGLING_RETRY}{ds_id}");
            if world.daemon_sets.items.is_empty() && !self.seen.contains(ds_id) {
                tracing::debug!(ds = %ds_id, "no daemon sets listed; keeping pods of one never seen");
                continue;
            }
            let owner = world.lock_holder(&layout::ds_ownership(ds_id));
            if owner.is_some_and(|session| session != ctx.session)
                || self.present.contains_key(ds_id)
                || !self.retries.ready(&retry_key)
            {
                continue;
            }
            let pods: Vec<PodKey> = pods.iter().cloned().collect();
            match self.remove_dangling(ctx, world, ds_id, &pods).await {
                Ok(()) => self.retries.succeeded(&retry_key),
                Err(e) => {
                    tracing::warn!(ds = %ds_id, error = %e, "cleaning up dangling pods failed");
                    self.retries.failed(&retry_key);
                }
            }
        }
    }

    /// Unschedules one missing daemon set's pods, unless its key turns out to exist.
    async fn remove_dangling(
        &mut self,
        ctx: &FarmContext,
        world: &World,
        ds_id: &str,
        pods: &[PodKey],
    ) -> FarmResult<()> {
        if ctx.store.get(&layout::daemon_set(ds_id)).await?.is_some() {
            tracing::warn!(ds = %ds_id, "a daemon set that cannot be read keeps its pods");
            self.present
                .insert(ds_id.to_owned(), Instant::now() + RECHECK_PRESENT);
            return Ok(());
        }
        let removals = pods.iter().map(|pod| {
            // A pod whose labels name an RC too is the RC's: only the label goes.
            let ops = match rc_labelled(world, pod) {
                true => unlabel_ops(world, pod, &[DS_ID_LABEL]),
                false => unschedule_ops(world, pod, &[DS_ID_LABEL]),
            };
            (&*pod.0, false, ops)
        });
        write_in_batches(ctx, ds_id, LEADER_LOCK, None, removals).await?;
        tracing::info!(ds = %ds_id, pods = pods.len(), "removed pods of a deleted daemon set");
        Ok(())
    }
}

/// What a daemon set's conditions are made of: what `plan` says, or why it could not plan.
fn facts(ds: &StoredDaemonSet, plan: Result<&Plan, &FarmError>) -> DsFacts {
    let mut facts = DsFacts {
        disabled: ds.disabled,
        min_health: ds.min_health,
        ..DsFacts::default()
    };
    match plan {
        Ok(plan) => {
            facts.targeted = plan.targeted;
            facts.deployed = usize::try_from(plan.status.nodes_deployed).unwrap_or(0);
            facts.healthy = plan.healthy;
            facts.changes =
                plan.remove.len() + plan.add.len() + plan.replace.len() + plan.take_over.len();
            facts.in_progress = plan.status.replication_in_progress;
            facts.stranded = plan.stranded;
            facts.held_back = plan.held_back;
        }
        Err(e) => facts.selector_error = Some(e.to_string()),
    }
    facts
}

/// Nodes relabelled into contention between enabled daemon sets ([`Contention::Relabelled`]),
/// each with the other daemon sets contending for it.
type ContendedNodes<'w> = BTreeMap<&'w str, BTreeSet<&'w str>>;

/// How one enabled daemon set contends with the other enabled ones (those disabled in this
/// pass aside).
#[derive(Default)]
struct Contentions<'w> {
    /// One written before it, in a contention its own write made: it is the one to disable.
    written_before: Option<(&'w str, &'w Shared<StoredDaemonSet>)>,
    /// The nodes relabelled into contention with the others, left to the daemon set running
    /// there.
    relabelled: ContendedNodes<'w>,
    /// One written after it, in a contention that one's write made, still enabled: it is
    /// the one to disable, but not by this farm, which disables only what it owns, or this
    /// farm backs off from a failure reconciling it (its write disabling it, or an earlier
    /// one). Another session's stays enabled until its owner (or
    /// a user) acts; a free one, until a farm takes it (this one, in its next pass); this
    /// farm's, until a retry succeeds.
    written_after: Option<LaterContender>,
}

/// How `ds` contends with the other enabled daemon sets, by [`contention`]'s rule: of two
/// whose write made it, the one written last (higher modify index, then higher ID) is the
/// one to disable, by the farm whose `session` owns it. The pass reconciles the one written
/// last first, so one `session` owns that is not in `disabled_now` was not reconciled this
/// pass (the farm backs off from a failure reconciling it) or failed to be disabled.
fn contentions<'w>(
    world: &'w World,
    session: &str,
    disabled_now: &HashSet<String>,
    id: &str,
    ds: &Shared<StoredDaemonSet>,
) -> Contentions<'w> {
    let mut found = Contentions::default();
    for (other_id, other) in &world.daemon_sets.items {
        if other_id == id || disabled_now.contains(other_id) {
            continue;
        }
        let nodes = world.node_label_records();
        match contention((&ds.value, ds.index), (&other.value, other.index), nodes) {
            Contention::Written if (other.index, other_id.as_str()) < (ds.index, id) => {
                found.written_before = Some((other_id, other));
                return found;
            }
            // The other one, the one to disable, stands enabled.
            Contention::Written => {
                let owner = match world.lock_holder(&layout::ds_ownership(other_id)) {
                    Some(owner) if owner == session => ContenderOwner::ThisFarm,
                    Some(_) => ContenderOwner::Elsewhere,
                    None => ContenderOwner::NoFarmYet,
                };
                found.written_after.get_or_insert_with(|| LaterContender {
                    id: other_id.clone(),
                    pod_id: other.value.pod_id.clone(),
                    owner,
                });
            }
            Contention::None => {}
            Contention::Relabelled(nodes) => {
                for node in nodes {
                    found.relabelled.entry(node).or_default().insert(other_id);
                }
            }
        }
    }
    found
}

/// Whether a daemon set's stored conditions say that nodes relabelled into contention make it
/// contend ([`NODE_LABELS_CONTEND`]).
fn relabel_contended(conditions: &[Condition]) -> bool {
    (conditions.iter()).any(|c| c.condition_type == "Contended" && c.reason == NODE_LABELS_CONTEND)
}

/// What the conditions of `ds` say of the nodes relabelled into contention with it: those
/// it keeps (it runs the pod there) and those it leaves, as `plan` left them.
fn node_contention(
    ds: &StoredDaemonSet,
    contended: &ContendedNodes<'_>,
    plan: Option<&Plan>,
) -> Option<NodeContention> {
    if contended.is_empty() {
        return None;
    }
    let left: BTreeSet<String> = plan.map(|plan| plan.contended_left.iter().cloned().collect())?;
    Some(NodeContention {
        pod_id: ds.pod_id.clone(),
        rivals: contended
            .values()
            .flatten()
            .map(|id| (*id).to_owned())
            .collect(),
        kept: (contended.keys())
            .filter(|node| !left.contains(**node))
            .map(|node| (*node).to_owned())
            .collect(),
        left,
    })
}

/// An enabled daemon set other than `id` that `rival` accepts and that contends with `ds`.
fn contender<'w>(
    world: &'w World,
    id: &str,
    ds: &StoredDaemonSet,
    rival: impl Fn(&str, &Shared<StoredDaemonSet>) -> bool,
) -> Option<(&'w str, &'w Shared<StoredDaemonSet>)> {
    let nodes = || world.node_labels().map(|(_, labels)| labels);
    world
        .daemon_sets
        .items
        .iter()
        .filter(|(other_id, other)| other_id.as_str() != id && rival(other_id, other))
        .find(|(_, other)| contends(ds, &other.value, nodes()))
        .map(|(other_id, other)| (other_id.as_str(), other))
}

/// Disables `ds` with a CAS write and its `DAEMON_SET_DISABLED` audit record, then alerts.
async fn disable(
    ctx: &FarmContext,
    id: &str,
    ds: &Shared<StoredDaemonSet>,
    rival_id: &str,
    rival: &StoredDaemonSet,
) -> FarmResult<()> {
    let mut disabled = StoredDaemonSet::clone(&ds.value);
    disabled.disabled = true;
    let record = AuditRecord::daemon_set(
        DaemonSetEvent::Disabled,
        &disabled,
        &ctx.holder,
        SystemTime::now(),
    );
    let mut ops = vec![
        TxnOp::Cas {
            key: layout::daemon_set(id),
            value: disabled.to_json(),
            index: ds.index,
        },
        TxnOp::Set {
            key: layout::new_audit_log(),
            value: record.to_json(),
        },
    ];
    let description = format!(
        "daemon set {id} contends with {rival_id} for pod {}; disabled {id}",
        ds.value.pod_id
    );
    let changes = ds_changes(&ds.value, &disabled);
    let mut event = ctx
        .actor(FARM)
        .event(ObjectKind::Daemonsets, id, Action::Updated, changes);
    event.message = Some(description.clone());
    ops.extend(ctx.record(&event).await?);
    ctx.commit(&layout::ds_ownership(id), ops).await?;
    tracing::warn!(ds = %id, contends_with = %rival_id, "disabled a contending daemon set");
    let details = json!({"disabled_daemon_set": disabled, "contending_daemon_set": rival,
                         "hostname": ctx.holder});
    ctx.alert(
        FARM,
        (ObjectKind::Daemonsets, id),
        CONTENTION_INCIDENT,
        description,
        details,
    )
    .await;
    Ok(())
}

/// When a node that started waiting at `since` is given up on; `None` for a zero timeout.
fn deadline(timeout: Duration, since: Instant) -> Option<Instant> {
    // A timeout too long to add (P2's negative "no timeout") has no deadline either.
    (!timeout.is_zero())
        .then(|| since.checked_add(timeout))
        .flatten()
}

/// Decides what one enabled daemon set's pods need, updating the rollout's timers.
fn plan(
    world: &World,
    id: &str,
    ds: &StoredDaemonSet,
    rollout: &mut Rollout,
    contended: &ContendedNodes<'_>,
    now: Instant,
) -> FarmResult<Plan> {
    let selector: Selector = ds.node_selector.parse().map_err(|e| {
        FarmError::Unusable(format!("the daemon set's node selector is invalid: {e}"))
    })?;
    let sha = ds.manifest.sha();
    if rollout.sha != sha {
        *rollout = Rollout {
            sha: sha.clone(),
            ..Rollout::default()
        };
    }
    let pod_id = ds.manifest.pod_id();
    let pod = |node: &str| pod_key(node, pod_id);
    let eligible = world.nodes_matching(&ds.node_selector, &selector);
    let mut current = BTreeSet::new();
    let mut strays = Vec::new();
    for labelled in world.pods_labelled(DS_ID_LABEL, id) {
        if rc_labelled(world, &labelled) {
            continue;
        }
        if &*labelled.1 == pod_id {
            current.insert(labelled.0.to_string());
        } else {
            strays.push(labelled);
        }
    }

    let stranded = eligible.is_empty() && !(current.is_empty() && strays.is_empty());
    // A node whose labels cannot be read may be eligible or not: its pod stays, as P2's
    // farm, whose node selection fails on such a key, changes nothing.
    let mut remove = Vec::new();
    if !eligible.is_empty() {
        remove.extend(strays);
        remove.extend(
            current
                .iter()
                .filter(|node| !eligible.contains(node.as_str()) && !world.node_unreadable(node))
                .map(|node| pod(node)),
        );
    }
    // Nodes relabelled into contention with another daemon set are left to the one running
    // there: the others neither place the pod there nor take it over.
    let contended_left: Vec<String> = eligible
        .iter()
        .filter(|node| !current.contains(*node) && contended.contains_key(node.as_str()))
        .cloned()
        .collect();
    let open = || {
        eligible
            .iter()
            .filter(|node| !current.contains(*node) && !contended.contains_key(node.as_str()))
    };
    // In name order, as P2's replicator takes them.
    let missing: Vec<&String> = open().filter(|node| is_free(world, &pod(node))).collect();
    // Eligible nodes whose pod a disabled daemon set holds: taken over like stale pods of
    // this one's own.
    let held: BTreeMap<&String, (&str, u64)> = open()
        .filter_map(|node| Some((node, disabled_holder(world, id, &pod(node))?)))
        .collect();

    // The nodes that keep the pod (or get it in place of a disabled daemon set's), as (node,
    // on the manifest, healthy).
    let staying: Vec<(&String, bool, bool)> = current
        .iter()
        .filter(|node| eligible.contains(node.as_str()))
        .chain(held.keys().copied())
        .map(|node| {
            let key = pod(node);
            let intent = world.intent(&key);
            let on_manifest = intent.is_some_and(|raw| same_manifest(raw, &ds.manifest));
            // Healthy on what the node is meant to run now, the daemon set's manifest or not.
            let wanted = if on_manifest {
                Some(Cow::Borrowed(&ds.manifest))
            } else {
                intent
                    .and_then(|raw| Manifest::parse(std::str::from_utf8(raw).ok()?).ok())
                    .map(Cow::Owned)
            };
            let healthy =
                wanted.is_some_and(|wanted| pod_health(world, &key, &wanted) == PodHealth::Healthy);
            (node, on_manifest, healthy)
        })
        .collect();
    let waiting: HashSet<&str> = staying
        .iter()
        .filter(|(node, on_manifest, healthy)| {
            *on_manifest && !*healthy && !held.contains_key(node)
        })
        .map(|(node, _, _)| node.as_str())
        .collect();
    rollout
        .since
        .retain(|node, _| waiting.contains(node.as_str()));
    rollout.sent.retain(|node| waiting.contains(node.as_str()));
    rollout
        .given_up
        .retain(|node| waiting.contains(node.as_str()));

    // Nodes that run the manifest already, unwell, and were sent nothing in this rollout
    // (ones that sickened) have nothing on their way to them: as P2's replicator skips a
    // node whose reality is the manifest, they hold no place among the in flight, wait for
    // no timeout (no alert says they did not come up on it) and keep no rollout going.
    let sickened: HashSet<&str> = (waiting.iter().copied())
        .filter(|node| {
            !rollout.sent.contains(*node)
                && pod_health(world, &pod(node), &ds.manifest) != PodHealth::NotReal
        })
        .collect();
    let mut wake: Option<Instant> = None;
    let mut timed_out = Vec::new();
    let mut in_flight = 0;
    for node in staying
        .iter()
        .filter(|(node, _, _)| waiting.contains(node.as_str()))
        .map(|(node, _, _)| *node)
    {
        if rollout.given_up.contains(node) || sickened.contains(node.as_str()) {
            continue;
        }
        let since = *rollout.since.entry(node.clone()).or_insert(now);
        match deadline(ds.timeout, since) {
            Some(at) if now >= at => {
                rollout.given_up.insert(node.clone());
                timed_out.push(node.clone());
            }
            at => {
                wake = earliest(wake, at);
                in_flight += 1;
            }
        }
    }

    // New nodes first, while the window has room: a manifest that never comes up reaches
    // at most MAX_IN_FLIGHT nodes before they time out.
    let add: Vec<String> = missing
        .iter()
        .take(MAX_IN_FLIGHT.saturating_sub(in_flight))
        .map(|node| (*node).clone())
        .collect();
    in_flight += add.len();

    let take_over_from = |node: &String, relabel_only: bool| {
        let (from, index) = held[node];
        TakeOver {
            node: node.clone(),
            from: from.to_owned(),
            index,
            relabel_only,
        }
    };
    // A held pod already on the manifest only changes its label, which costs no health.
    let mut take_over: Vec<TakeOver> = staying
        .iter()
        .filter(|(node, on_manifest, _)| *on_manifest && held.contains_key(node))
        .map(|(node, _, _)| take_over_from(node, true))
        .collect();
    // Replace stale pods, unhealthy ones first (they cost no health), while the healthy
    // count stays at least `min_health`.
    let min_health = usize::try_from(ds.min_health).unwrap_or(0);
    let mut healthy_left = staying.iter().filter(|(_, _, healthy)| *healthy).count();
    let mut stale: Vec<(bool, &String)> = staying
        .iter()
        .filter(|(_, on_manifest, _)| !*on_manifest)
        .map(|(node, _, healthy)| (*healthy, *node))
        .collect();
    stale.sort();
    let mut replace = Vec::new();
    let mut held_back = 0;
    for (position, &(healthy, node)) in stale.iter().enumerate() {
        if in_flight >= MAX_IN_FLIGHT {
            break;
        }
        if healthy {
            if healthy_left <= min_health {
                held_back = stale.len() - position;
                break;
            }
            healthy_left -= 1;
        }
        match held.contains_key(node) {
            true => take_over.push(take_over_from(node, false)),
            false => replace.push(node.clone()),
        }
        in_flight += 1;
    }
    let rewritten = take_over
        .iter()
        .filter(|t| !t.relabel_only)
        .map(|t| &t.node);
    for node in add.iter().chain(&replace).chain(rewritten) {
        rollout.since.insert(node.clone(), now);
        rollout.sent.insert(node.clone());
        wake = earliest(wake, deadline(ds.timeout, now));
    }

    let deployed = staying
        .iter()
        .filter(|(_, on_manifest, healthy)| *on_manifest && *healthy)
        .count();
    let done = |node: &String, on_manifest: bool, healthy: bool| {
        (on_manifest && healthy)
            || rollout.given_up.contains(node)
            || sickened.contains(node.as_str())
    };
    let unfinished = staying
        .iter()
        .any(|(node, on_manifest, healthy)| !done(node, *on_manifest, *healthy));
    let status = DaemonSetFarmStatus {
        manifest_sha: sha,
        nodes_deployed: i64::try_from(deployed).unwrap_or(i64::MAX),
        replication_in_progress: unfinished
            || !remove.is_empty()
            || !missing.is_empty()
            || !held.is_empty(),
    };
    Ok(Plan {
        remove,
        add,
        replace,
        take_over,
        timed_out,
        stranded,
        targeted: eligible.len(),
        healthy: staying.iter().filter(|(_, _, healthy)| *healthy).count(),
        held_back,
        contended_left,
        status,
        wake,
    })
}

/// The disabled daemon set other than `id` whose label the intended `pod` carries, and its
/// index, when no enabled RC's labels claim the pod: a pod daemon set `id` may take over.
fn disabled_holder<'w>(world: &'w World, id: &str, pod: &PodKey) -> Option<(&'w str, u64)> {
    world.intent(pod)?;
    if rc_labelled(world, pod) {
        return None;
    }
    let holder = world.pod_labels_of(pod)?.get(DS_ID_LABEL)?;
    let ds = world.daemon_sets.items.get(holder)?;
    (holder != id && ds.value.disabled).then_some((holder, ds.index))
}

/// The farm's name in logs and in the actor of its events.
const FARM: &str = "ds";

/// Writes the plan's pod changes, removals first, in fenced batches ([`batches`]), each with
/// its event. Each batch holds only while the daemon set is still the version `seen` planned
/// from: one paused, edited or deleted meanwhile (a pass writes each daemon set from the world
/// it began with) would otherwise get the pods and manifests it no longer wants; the next
/// pass plans from the daemon set as it is.
async fn apply(
    ctx: &FarmContext,
    world: &World,
    id: &str,
    seen: &Shared<StoredDaemonSet>,
    plan: &Plan,
) -> FarmResult<()> {
    let ds = &*seen.value;
    let unchanged = TxnOp::CheckIndex {
        key: layout::daemon_set(id),
        index: seen.index,
    };
    let lock = layout::ds_ownership(id);
    let labels: Labels = [(DS_ID_LABEL.to_owned(), id.to_owned())].into();
    let pod_id = ds.manifest.pod_id();
    // Each change with the node it places the pod on (`true`) or removes it from.
    let removals = plan.remove.iter().map(|pod| {
        let ops = unschedule_ops(world, pod, &[DS_ID_LABEL]);
        (&*pod.0, false, ops)
    });
    let placements = plan.add.iter().chain(&plan.replace).map(|node| {
        let ops = schedule_ops(world, &pod_key(node, pod_id), &ds.manifest, &labels);
        (node.as_str(), true, ops)
    });
    let take_overs = plan.take_over.iter().map(|t| {
        let pod = pod_key(&t.node, pod_id);
        // Only while the daemon set holding it is still the disabled version seen.
        let mut ops = vec![TxnOp::CheckIndex {
            key: layout::daemon_set(&t.from),
            index: t.index,
        }];
        ops.extend(match t.relabel_only {
            true => relabel_ops(world, &pod, &labels),
            false => schedule_ops(world, &pod, &ds.manifest, &labels),
        });
        (t.node.as_str(), true, ops)
    });
    let changes = removals.chain(placements).chain(take_overs);
    write_in_batches(ctx, id, &lock, Some(unchanged), changes).await?;
    if !(plan.remove.is_empty()
        && plan.add.is_empty()
        && plan.replace.is_empty()
        && plan.take_over.is_empty())
    {
        tracing::info!(ds = %id, removed = plan.remove.len(), added = plan.add.len(),
                       replaced = plan.replace.len(), taken_over = plan.take_over.len(),
                       "daemon set retargeted");
    }
    Ok(())
}

/// Writes daemon set `id`'s pod `changes` (each a node, whether the pod is placed there or
/// leaves it, and its ops) in [`batches`], each fenced on `lock` with its event (the nodes its
/// pods left and those they were placed, or rewritten, on) and after the `check`, when given.
async fn write_in_batches<'a>(
    ctx: &FarmContext,
    id: &str,
    lock: &str,
    check: Option<TxnOp>,
    changes: impl Iterator<Item = (&'a str, bool, Vec<TxnOp>)>,
) -> FarmResult<()> {
    for batch in batches(changes, 0) {
        let change = nodes_moved(&batch.left, &batch.placed);
        let event =
            ctx.actor(FARM)
                .event(ObjectKind::Daemonsets, id, Action::Scheduled, vec![change]);
        let mut ops: Vec<TxnOp> = check.iter().cloned().collect();
        ops.extend(batch.ops);
        ops.extend(ctx.record(&event).await?);
        ctx.commit(lock, ops).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::farms::fixture::Fleet;
    use crate::farms::world::Versioned;
    use crate::model::conditions::{ConditionStatus, ConditionsRecord};
    use crate::model::HealthState;

    const OLD: &str = "id: agent\nconfig: {version: 1}\n";
    const NEW: &str = "id: agent\nconfig: {version: 2}\n";

    fn ds(manifest: &str, min_health: i64, selector: &str) -> StoredDaemonSet {
        StoredDaemonSet {
            id: "ds".into(),
            disabled: false,
            manifest: Manifest::parse(manifest).unwrap(),
            min_health,
            cluster_name: "production".into(),
            node_selector: selector.into(),
            pod_id: "agent".into(),
            timeout: Duration::from_secs(60),
        }
    }

    /// The daemon set's pods: `agent`, labelled `daemon_set_id=ds`.
    impl Fleet {
        fn pod(&mut self, node: &str, manifest: &str, health: HealthState) -> &mut Self {
            self.labelled_pod(
                node,
                "agent",
                &[(DS_ID_LABEL, "ds")],
                manifest,
                Some(health),
            )
        }

        /// Nodes `n00..` labelled `role=web`, each running `manifest` healthy.
        fn web(&mut self, count: usize, manifest: &str) -> &mut Self {
            for i in 0..count {
                let name = format!("n{i:02}");
                self.node(&name, "web")
                    .pod(&name, manifest, HealthState::Passing);
            }
            self
        }
    }

    fn run(world: &World, ds: &StoredDaemonSet, rollout: &mut Rollout, now: Instant) -> Plan {
        plan(world, "ds", ds, rollout, &ContendedNodes::new(), now).unwrap()
    }

    /// A daemon set that failed and is gone since waits for no retry: the farm's queue (its
    /// queue-depth metric) counts only daemon sets that exist, and gone ones leave no trace.
    #[tokio::test]
    async fn a_gone_daemon_set_leaves_no_retry_waiting() {
        let (_dir, ctx, mirror) = crate::farms::fixture::idle_context().await;
        let mut farm = DsFarm::new(mirror);
        farm.retries.failed("00000000-0000-4000-8000-000000000001");
        // And the cleanup of a deleted one's pods, which are gone too.
        farm.retries.failed(&format!(
            "{DANGLING_RETRY}00000000-0000-4000-8000-000000000002"
        ));
        farm.pass(&ctx, &World::default()).await;
        assert_eq!(farm.retries().waiting(), 0);
    }

    /// A daemon set written into contention with an older one, whose ownership lock no farm
    /// holds yet (created since the last pass), stays enabled until a farm takes it and
    /// disables it: the older one says it is contended meanwhile, naming it, rather than
    /// that nothing contends with it.
    #[tokio::test]
    async fn a_contender_no_farm_owns_yet_is_named() {
        const NEWER: &str = "newer";
        let (_dir, store, _term, ctx) = owning_ds().await;
        let owned = layout::ds_ownership("ds");

        let mut fleet = Fleet::new();
        fleet.web(2, OLD).lock(&owned, &ctx.session);
        let older = ds(OLD, 0, "role=web");
        let newer = StoredDaemonSet {
            id: NEWER.into(),
            ..ds(OLD, 0, "role=web")
        };
        for (id, value, index) in [("ds", older, 10), (NEWER, newer, 20)] {
            fleet
                .daemon_sets
                .insert(id.into(), Versioned { value, index });
        }
        let mirror = crate::state::Mirror::new(store.clone(), Default::default());
        DsFarm::new(mirror).pass(&ctx, &fleet.world()).await;

        let key = layout::conditions(ObjectKind::Daemonsets, "ds");
        let stored = store
            .get(&key)
            .await
            .unwrap()
            .expect("no conditions stored");
        let record: ConditionsRecord = serde_json::from_slice(&stored.value).unwrap();
        let contended = (record.conditions.iter())
            .find(|c| c.condition_type == "Contended")
            .unwrap();
        assert_eq!(
            (contended.status, contended.reason.as_str()),
            (ConditionStatus::True, "ContenderNotYetOwned"),
            "{}",
            contended.message
        );
        assert!(contended.message.contains(NEWER), "{}", contended.message);
    }

    /// A daemon set written into contention with an older one, both this farm's, whose
    /// disabling write fails stays enabled while the farm backs off and tries again: the
    /// older one says it is contended meanwhile, naming it, rather than that nothing contends
    /// with it. Once disabled (in the same pass, the one written last being reconciled
    /// first), it is not named.
    #[tokio::test]
    async fn a_contender_whose_disabling_failed_is_named() {
        const NEWER: &str = "newer";
        for fails in [false, true] {
            let (_dir, store, _term, ctx) = own_store().await;
            // Unless the store holds it as the farm sees it, the CAS write disabling it fails
            // (as when it was written again since).
            let fleet = contending_newer_of_ours(store.as_ref(), &ctx, fails).await;
            let mirror = crate::state::Mirror::new(store.clone(), Default::default());
            let mut farm = DsFarm::new(mirror);
            // The pass whose write fails, then one while it backs off.
            for pass in ["first pass", "backing off"] {
                let case = format!("disabling fails: {fails}: {pass}");
                farm.pass(&ctx, &fleet.world()).await;
                assert_eq!(farm.retries.ready(NEWER), !fails, "{case}");
                let stored = read_conditions(store.as_ref(), ObjectKind::Daemonsets, "ds").await;
                let contended = (stored.unwrap().into_iter())
                    .find(|c| c.condition_type == "Contended")
                    .expect("no conditions stored");
                let message = &contended.message;
                let expected = match fails {
                    true => (ConditionStatus::True, "ContenderNotYetDisabled"),
                    false => (ConditionStatus::False, "NoContention"),
                };
                let shown = (contended.status, contended.reason.as_str());
                assert_eq!(shown, expected, "{case}: {message}");
                assert_eq!(message.contains(NEWER), fails, "{case}: {message}");
                if !fails {
                    break;
                }
            }
        }
    }

    /// A daemon set this farm owns, written into contention with an older one while the farm
    /// backs off from a failure reconciling it that was no disabling write (none was made
    /// yet): the older one's condition does not say that the write disabling it failed, but
    /// that the farm is backing off from a failure reconciling it. Once the farm tries again,
    /// it is disabled, and the older one shows no contention.
    #[tokio::test]
    async fn a_contender_backing_off_from_another_failure_is_told_so() {
        const NEWER: &str = "newer";
        let (_dir, store, _term, ctx) = own_store().await;
        // Stored as the farm sees it: the write disabling it succeeds once it is made.
        let fleet = contending_newer_of_ours(store.as_ref(), &ctx, false).await;
        let mirror = crate::state::Mirror::new(store.clone(), Default::default());
        let mut farm = DsFarm::new(mirror);
        // An earlier reconcile of it failed (its pods, say): the farm backs off from it.
        farm.retries.failed(NEWER);
        for backing_off in [true, false] {
            if !backing_off {
                farm.retries.succeeded(NEWER);
            }
            farm.pass(&ctx, &fleet.world()).await;
            let stored = read_conditions(store.as_ref(), ObjectKind::Daemonsets, "ds").await;
            let contended = (stored.unwrap().into_iter())
                .find(|c| c.condition_type == "Contended")
                .expect("no conditions stored");
            let message = &contended.message;
            let shown = (contended.status, contended.reason.as_str());
            if backing_off {
                let expected = (ConditionStatus::True, "ContenderNotYetDisabled");
                assert_eq!(shown, expected, "backing off: {message}");
                assert!(message.contains(NEWER), "{message}");
                assert!(
                    message.contains("backing off from a failure reconciling it"),
                    "backing off: {message}"
                );
            } else {
                let expected = (ConditionStatus::False, "NoContention");
                assert_eq!(shown, expected, "tried again: {message}");
            }
        }
    }

    /// A store of its own (its directory, kept while the test runs) and a term over it.
    type OwnStore = (
        tempfile::TempDir,
        std::sync::Arc<dyn crate::kv::KvStore>,
        crate::leader::Term,
        FarmContext,
    );

    /// A store of its own and a term over it ([`OwnStore`]).
    async fn own_store() -> OwnStore {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db").display().to_string();
        let store = crate::kv::sqlite::SqliteStore::open(&path).await.unwrap();
        let store: std::sync::Arc<dyn crate::kv::KvStore> = std::sync::Arc::new(store);
        let (term, ctx) = crate::farms::fixture::term_over(&store, "me").await;
        (dir, store, term, ctx)
    }

    /// [`own_store`], with daemon set `ds`'s ownership lock held in it.
    async fn owning_ds() -> OwnStore {
        let (dir, store, term, ctx) = own_store().await;
        let owned = layout::ds_ownership("ds");
        assert!(store.acquire(&owned, b"me", &ctx.session).await.unwrap());
        (dir, store, term, ctx)
    }

    /// A fleet of two web nodes and two daemon sets of one selector, both owned by `ctx`'s
    /// farm: `ds`, and `newer`, written after it into contention with it, also stored, where
    /// the fleet shows it at the stored version, or one past it when `moved` (so the CAS
    /// write disabling it fails).
    async fn contending_newer_of_ours(
        store: &dyn crate::kv::KvStore,
        ctx: &FarmContext,
        moved: bool,
    ) -> Fleet {
        const NEWER: &str = "newer";
        let mut fleet = Fleet::new();
        fleet.web(2, OLD);
        for id in ["ds", NEWER] {
            let lock = layout::ds_ownership(id);
            assert!(store.acquire(&lock, b"me", &ctx.session).await.unwrap());
            fleet.lock(&lock, &ctx.session);
        }
        let newer = StoredDaemonSet {
            id: NEWER.into(),
            ..ds(OLD, 0, "role=web")
        };
        let key = layout::daemon_set(NEWER);
        (store.put(&key, &newer.to_json(), crate::kv::Cas::Any).await).unwrap();
        let stored = store.get(&key).await.unwrap().unwrap().modify_index;
        let index = if moved { stored + 1 } else { stored };
        let older = ds(OLD, 0, "role=web");
        for (id, value, index) in [("ds", older, 1), (NEWER, newer, index)] {
            fleet
                .daemon_sets
                .insert(id.into(), Versioned { value, index });
        }
        fleet
    }

    /// Stores a conditions record of daemon set `ds` showing a relabel-made contention, as
    /// written when it started (and was alerted about).
    async fn store_relabel_contention(store: &dyn crate::kv::KvStore) {
        use crate::model::conditions::{stamp, NodeContention};
        let facts = DsFacts {
            relabelled: Some(NodeContention::default()),
            ..DsFacts::default()
        };
        let record = ConditionsRecord {
            conditions: stamp(&[], ds_conditions(&facts), 0, SystemTime::now()),
            progress: None,
        };
        let key = layout::conditions(ObjectKind::Daemonsets, "ds");
        let value = serde_json::to_vec(&record).unwrap();
        (store.put(&key, &value, crate::kv::Cas::Any).await).unwrap();
    }

    /// Nodes relabelled into two daemon sets are alerted about once, as the contention
    /// starts, told by the conditions stored: a new leader whose mirror has yet to read the
    /// record the last leader wrote (here, a mirror that reads nothing) does not alert again;
    /// with no such record stored, it alerts.
    #[tokio::test]
    async fn a_relabel_contention_the_stored_conditions_show_is_not_alerted_again() {
        for recorded in [true, false] {
            let (_dir, store, _term, ctx) = owning_ds().await;
            let owned = layout::ds_ownership("ds");

            // Both written before the node was labelled into both.
            let mut fleet = Fleet::new();
            let both = crate::farms::fixture::labels(&[("role", "web"), ("zone", "a")]);
            fleet.nodes.insert("n00".into(), both);
            fleet.lock(&owned, &ctx.session);
            let zoned = StoredDaemonSet {
                id: "zoned".into(),
                ..ds(OLD, 0, "zone=a")
            };
            for (id, value) in [("ds", ds(OLD, 0, "role=web")), ("zoned", zoned)] {
                fleet
                    .daemon_sets
                    .insert(id.into(), Versioned { value, index: 0 });
            }
            if recorded {
                // The last leader's record, which alerted as the contention started.
                store_relabel_contention(store.as_ref()).await;
            }
            let mirror = crate::state::Mirror::new(store.clone(), Default::default());
            DsFarm::new(mirror).pass(&ctx, &fleet.world()).await;

            let alerted = !ctx.alerts.due("ds_node_labels_contend/ds");
            assert_eq!(alerted, !recorded, "with a record stored: {recorded}");
        }
    }

    /// A daemon set written into contention with one that nodes relabelled into contention
    /// make contend already is disabled by the farm that owns it (another farm, or the one
    /// that takes it in its next pass when no farm holds its lock yet): the relabel
    /// contention, alerted about as it started, stands throughout, so the older one's
    /// conditions go on showing it, naming the newcomer meanwhile, and it is not alerted
    /// again once the newcomer is disabled.
    #[tokio::test]
    async fn a_relabel_contention_is_not_alerted_again_past_a_later_contender() {
        for owned_elsewhere in [true, false] {
            let (_dir, store, _term, ctx) = owning_ds().await;
            let owned = layout::ds_ownership("ds");

            // `ds` and `zoned`, written before the node was labelled into both, and the
            // record of the relabel contention, alerted about as it started.
            store_relabel_contention(store.as_ref()).await;
            let fleet = |newer_disabled: bool| {
                let mut fleet = Fleet::new();
                let both = crate::farms::fixture::labels(&[("role", "web"), ("zone", "a")]);
                fleet.nodes.insert("n00".into(), both);
                fleet.lock(&owned, &ctx.session);
                if owned_elsewhere {
                    fleet.lock(&layout::ds_ownership("newer"), "another farm's session");
                }
                let zoned = StoredDaemonSet {
                    id: "zoned".into(),
                    ..ds(OLD, 0, "zone=a")
                };
                // Written since into contention with `ds`.
                let newer = StoredDaemonSet {
                    id: "newer".into(),
                    disabled: newer_disabled,
                    ..ds(OLD, 0, "role=web")
                };
                for (id, value, index) in [
                    ("ds", ds(OLD, 0, "role=web"), 0),
                    ("zoned", zoned, 0),
                    ("newer", newer, 20),
                ] {
                    fleet
                        .daemon_sets
                        .insert(id.into(), Versioned { value, index });
                }
                fleet
            };
            let contended = || async {
                let stored = read_conditions(store.as_ref(), ObjectKind::Daemonsets, "ds").await;
                (stored.unwrap().into_iter())
                    .find(|c| c.condition_type == "Contended")
                    .unwrap()
            };
            let mirror = crate::state::Mirror::new(store.clone(), Default::default());
            let mut farm = DsFarm::new(mirror);
            // The newcomer, beside it; then disabled by the farm that owns it.
            farm.pass(&ctx, &fleet(false).world()).await;
            let beside = contended().await;
            farm.pass(&ctx, &fleet(true).world()).await;

            let case = format!("owned elsewhere: {owned_elsewhere}");
            assert!(
                ctx.alerts.due("ds_node_labels_contend/ds"),
                "{case}: the relabel contention was alerted about again"
            );
            assert_eq!(contended().await.reason, NODE_LABELS_CONTEND, "{case}");
            // The newcomer, named while it stood beside it.
            let message = &beside.message;
            assert_eq!(beside.reason, NODE_LABELS_CONTEND, "{case}: {message}");
            assert!(message.contains("newer"), "{case}: {message}");
        }
    }

    #[test]
    fn adds_to_eligible_free_nodes_and_removes_from_ineligible_ones() {
        let mut fleet = Fleet::new();
        fleet
            .web(2, OLD)
            .node("db1", "db")
            .pod("db1", OLD, HealthState::Passing);
        fleet.node("taken", "web").node("free", "web");
        fleet
            .intents
            .insert(("taken".into(), "agent".into()), b"id: agent\n".to_vec());
        let plan = run(
            &fleet.world(),
            &ds(OLD, 0, "role=web"),
            &mut Rollout::default(),
            Instant::now(),
        );
        assert_eq!(plan.add, ["free"]);
        assert_eq!(plan.remove, [pod_key("db1", "agent")]);
        assert!(plan.replace.is_empty());
        assert_eq!(plan.status.nodes_deployed, 2);
        assert!(plan.status.replication_in_progress);
    }

    #[test]
    fn a_daemon_set_matching_no_node_removes_nothing() {
        let mut fleet = Fleet::new();
        fleet.web(3, OLD);
        let plan = run(
            &fleet.world(),
            &ds(OLD, 0, "role=db"),
            &mut Rollout::default(),
            Instant::now(),
        );
        assert!(plan.remove.is_empty() && plan.add.is_empty() && plan.replace.is_empty());
        assert!(plan.stranded);
    }

    #[test]
    fn replacement_keeps_min_health_and_takes_unhealthy_pods_first() {
        let mut fleet = Fleet::new();
        fleet.web(5, OLD);
        let now = Instant::now();
        let plan = run(
            &fleet.world(),
            &ds(NEW, 3, ""),
            &mut Rollout::default(),
            now,
        );
        assert_eq!(plan.replace, ["n00", "n01"]);
        assert_eq!(plan.status.nodes_deployed, 0);

        fleet.pod("n03", OLD, HealthState::Critical);
        let plan = run(
            &fleet.world(),
            &ds(NEW, 4, ""),
            &mut Rollout::default(),
            now,
        );
        assert_eq!(plan.replace, ["n03"], "the sick pod costs no health");

        let plan = run(
            &fleet.world(),
            &ds(NEW, 9, ""),
            &mut Rollout::default(),
            now,
        );
        assert_eq!(plan.replace, ["n03"]);
        let plan = run(
            &fleet.world(),
            &ds(NEW, -1, ""),
            &mut Rollout::default(),
            now,
        );
        assert_eq!(plan.replace.len(), 5);
    }

    #[test]
    fn at_most_fifty_nodes_are_in_flight() {
        let mut fleet = Fleet::new();
        fleet.web(60, OLD);
        let mut rollout = Rollout::default();
        let now = Instant::now();
        let plan = run(&fleet.world(), &ds(NEW, 0, ""), &mut rollout, now);
        assert_eq!(plan.replace.len(), MAX_IN_FLIGHT);
        for node in &plan.replace {
            fleet.intents.insert(pod_key(node, "agent"), NEW.into());
        }
        let plan = run(&fleet.world(), &ds(NEW, 0, ""), &mut rollout, now);
        assert!(plan.replace.is_empty(), "{:?}", plan.replace);
        assert!(plan.status.replication_in_progress);
    }

    #[test]
    fn nodes_that_stay_unhealthy_are_given_up_but_hold_the_rollout_at_min_health() {
        let mut fleet = Fleet::new();
        fleet.web(4, OLD);
        let spec = ds(NEW, 2, "");
        let mut rollout = Rollout::default();
        let start = Instant::now();
        let plan = run(&fleet.world(), &spec, &mut rollout, start);
        assert_eq!(plan.replace, ["n00", "n01"]);
        assert_eq!(plan.wake, Some(start + spec.timeout));
        // The new manifest never comes up.
        for node in ["n00", "n01"] {
            fleet
                .intents
                .insert((node.into(), "agent".into()), NEW.into());
        }
        let plan = run(
            &fleet.world(),
            &spec,
            &mut rollout,
            start + spec.timeout / 2,
        );
        assert!(plan.replace.is_empty() && plan.timed_out.is_empty());
        assert_eq!(plan.wake, Some(start + spec.timeout));

        let later = start + spec.timeout * 2;
        let plan = run(&fleet.world(), &spec, &mut rollout, later);
        assert_eq!(plan.timed_out, ["n00", "n01"]);
        assert!(
            plan.replace.is_empty(),
            "the bad pods still count as unhealthy"
        );
        assert!(plan.status.replication_in_progress);
        let plan = run(&fleet.world(), &spec, &mut rollout, later);
        assert!(plan.timed_out.is_empty(), "given up once");

        // A new manifest starts over.
        let newer = ds("id: agent\nconfig: {version: 3}\n", 2, "");
        let plan = run(&fleet.world(), &newer, &mut rollout, later);
        assert_eq!(plan.replace, ["n00", "n01"]);
    }

    /// A new daemon set goes out as P2's replicator sends it: to at most `MAX_IN_FLIGHT`
    /// nodes on their way to healthy at once, in name order, the next ones as those become
    /// healthy or are given up on; a manifest that never comes up does not reach every node
    /// at once.
    #[test]
    fn new_nodes_get_the_pod_at_most_max_in_flight_at_a_time() {
        let mut fleet = Fleet::new();
        let names: Vec<String> = (0..MAX_IN_FLIGHT * 2 + 10)
            .map(|i| format!("n{i:03}"))
            .collect();
        for name in &names {
            fleet.node(name, "web");
        }
        let spec = ds(NEW, 0, "role=web");
        let mut rollout = Rollout::default();
        let start = Instant::now();
        let plan = run(&fleet.world(), &spec, &mut rollout, start);
        assert_eq!(plan.add, names[..MAX_IN_FLIGHT]);
        assert!(plan.status.replication_in_progress);

        // The first window's pods land; ten of them come up healthy.
        for (i, name) in names[..MAX_IN_FLIGHT].iter().enumerate() {
            let health = if i < 10 {
                HealthState::Passing
            } else {
                HealthState::Critical
            };
            fleet.pod(name, NEW, health);
        }
        let plan = run(&fleet.world(), &spec, &mut rollout, start);
        assert_eq!(plan.add, names[MAX_IN_FLIGHT..MAX_IN_FLIGHT + 10]);

        // Those given up on no longer hold the window.
        for name in &names[MAX_IN_FLIGHT..MAX_IN_FLIGHT + 10] {
            fleet.pod(name, NEW, HealthState::Passing);
        }
        let later = start + spec.timeout * 2;
        let plan = run(&fleet.world(), &spec, &mut rollout, later);
        assert_eq!(plan.timed_out.len(), MAX_IN_FLIGHT - 10);
        assert_eq!(plan.add, names[MAX_IN_FLIGHT + 10..]);
    }

    /// A node that runs the manifest but is unwell, and that the rollout sent nothing (one
    /// that sickened), has nothing on its way to it: it holds no place among the in flight,
    /// so new nodes still get the pod, as P2's replicator skips a node whose reality is the
    /// manifest.
    #[test]
    fn nodes_sick_on_the_manifest_do_not_hold_new_nodes_back() {
        let mut fleet = Fleet::new();
        let names: Vec<String> = (0..MAX_IN_FLIGHT + 5).map(|i| format!("n{i:03}")).collect();
        for name in &names {
            fleet.node(name, "web");
        }
        for name in &names[..MAX_IN_FLIGHT] {
            fleet.pod(name, NEW, HealthState::Critical);
        }
        let spec = ds(NEW, 0, "role=web");
        let mut rollout = Rollout::default();
        let start = Instant::now();
        let plan = run(&fleet.world(), &spec, &mut rollout, start);
        assert_eq!(plan.add, names[MAX_IN_FLIGHT..]);

        // Once the new nodes are healthy, the sick ones keep no rollout going, and are
        // never given up on as if they had not come up on a manifest sent them.
        for name in &names[MAX_IN_FLIGHT..] {
            fleet.pod(name, NEW, HealthState::Passing);
        }
        let plan = run(
            &fleet.world(),
            &spec,
            &mut rollout,
            start + spec.timeout * 2,
        );
        assert!(plan.timed_out.is_empty(), "{:?}", plan.timed_out);
        assert_eq!(plan.wake, None);
        assert!(!plan.status.replication_in_progress);
        assert_eq!(plan.status.nodes_deployed, 5);
    }

    #[test]
    fn a_zero_timeout_never_gives_up() {
        let mut fleet = Fleet::new();
        fleet.web(1, OLD).pod("n00", NEW, HealthState::Critical);
        let mut spec = ds(NEW, 0, "");
        spec.timeout = Duration::ZERO;
        let mut rollout = Rollout::default();
        let now = Instant::now();
        run(&fleet.world(), &spec, &mut rollout, now);
        let plan = run(
            &fleet.world(),
            &spec,
            &mut rollout,
            now + Duration::from_secs(3600),
        );
        assert!(plan.timed_out.is_empty());
        assert_eq!(plan.wake, None);
    }

    /// A disabled daemon set's pods on nodes this one selects are taken over in place: one
    /// already on this one's manifest is only relabelled, at once; one on another manifest is
    /// replaced like a stale pod of its own, keeping `min_health`. An enabled one's are left.
    #[test]
    fn a_disabled_daemon_sets_pods_are_taken_over_at_the_pace_of_a_replacement() {
        const OTHER: &str = "00000000-0000-4000-8000-0000000000aa";
        let mut fleet = Fleet::new();
        for (node, manifest) in [("n0", NEW), ("n1", OLD), ("n2", OLD), ("n3", OLD)] {
            fleet.node(node, "web").labelled_pod(
                node,
                "agent",
                &[(DS_ID_LABEL, OTHER)],
                manifest,
                Some(HealthState::Passing),
            );
        }
        let mut other = ds(OLD, 0, "role=web");
        other.id = OTHER.into();
        other.disabled = true;
        fleet.daemon_sets.insert(
            OTHER.into(),
            Versioned {
                value: other.clone(),
                index: 7,
            },
        );
        let spec = ds(NEW, 3, "role=web");
        let plan = run(
            &fleet.world(),
            &spec,
            &mut Rollout::default(),
            Instant::now(),
        );
        let taken: Vec<(&str, bool)> = plan
            .take_over
            .iter()
            .map(|t| (t.node.as_str(), t.relabel_only))
            .collect();
        assert_eq!(taken, [("n0", true), ("n1", false)]);
        assert!(plan
            .take_over
            .iter()
            .all(|t| t.from == OTHER && t.index == 7));
        assert!(plan.add.is_empty() && plan.replace.is_empty());
        assert_eq!(plan.held_back, 2);
        assert!(plan.status.replication_in_progress);

        other.disabled = false;
        fleet.daemon_sets.get_mut(OTHER).unwrap().value = other;
        let plan = run(
            &fleet.world(),
            &spec,
            &mut Rollout::default(),
            Instant::now(),
        );
        assert!(plan.take_over.is_empty(), "{:?}", plan.take_over);
    }

    #[test]
    fn strays_of_another_pod_id_are_removed() {
        let mut fleet = Fleet::new();
        fleet.web(1, OLD);
        let stray = pod_key("n00", "old-agent");
        fleet.labels.insert(
            stray.clone(),
            Versioned {
                value: [(DS_ID_LABEL.into(), "ds".into())].into(),
                index: 1,
            },
        );
        let plan = run(
            &fleet.world(),
            &ds(OLD, 0, ""),
            &mut Rollout::default(),
            Instant::now(),
        );
        assert_eq!(plan.remove, [stray]);
        assert!(plan.status.replication_in_progress);
    }
}
