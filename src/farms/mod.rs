//! The farms: reconcilers that make stored desired state true, run by the leader only.
//!
//! - [`world`]: the farms' view of the server's mirror of the store, shared by all farms.
//! - [`rc`]: keeps each RC at its replica count on eligible nodes (P2's meet-desires).
//! - [`roll`]: moves replicas from old RCs to new ones, keeping a minimum healthy.
//! - [`ds`]: keeps each daemon set's pod on every matching node, honouring `min_health`.
//! - [`stale_locks`]: removes lock keys left without a session in the farms' lock trees.
//! - [`retention`]: prunes events and finished rolls, and times left by deleted objects.
//! - [`alerts`]: the webhook the farms call when they cannot do what is asked.
//! - [`conditions`]: the status conditions each farm publishes for the objects it owns.
//!
//! Each farm is a loop of idempotent passes over every object it owns, woken by tree changes
//! and re-run periodically as a safety net. Objects are reconciled one at a time, so at most
//! one reconcile per object is ever in flight. Every write is one transaction that starts
//! with a `check-session` on a lock this term holds (fencing), and no write is started once
//! the term is cancelled. The farms take their locks with the term's own session, whose
//! behavior is always delete (see [`crate::leader`]). A committed write is applied to the
//! mirror at once, so the next pass sees it without waiting for the tree's watch; the
//! mirror is only ever a hint for what to try, every write being fenced and CAS'd against
//! the store itself.

pub mod alerts;
pub mod conditions;
pub mod ds;
#[cfg(test)]
mod fixture;
pub mod pods;
pub mod rc;
pub mod retention;
pub mod roll;
pub mod stale_locks;
pub mod world;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::kv::{validate_txn, KvPair, KvStore, StoreError, TxnOp, MAX_TXN_OPS};
use crate::layout::LEADER_LOCK;
use crate::leader::Term;
use crate::metrics::FarmPass;
use crate::model::event::{Action, Actor, Event, ObjectKind};
use crate::state::Mirror;
use crate::store::events::{record_ops, Retention};
use crate::store::own_writes::OwnWrites;

use alerts::Alerter;
use world::{Trees, World};

/// How often every object is reconciled even when nothing changed: the safety net for a
/// missed watch result or a failed write.
pub const RESYNC: Duration = Duration::from_secs(30);

/// How many objects a farm's pass writes for at once: their transactions then share the
/// store's commits (SQLite's group commit, Consul's raft batches) instead of each waiting
/// for the one before, and hold their own among the API's writes. Under the 200
/// connections a Consul agent allows one client by default.
pub const CONCURRENT_OBJECTS: usize = 128;

/// The [`Farm::PACE`] of the farms that keep the store tidy (stale locks, retention): work
/// that can wait a second.
pub const HOUSEKEEPING_PACE: Duration = Duration::from_secs(1);

/// Settings of the farms that come from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FarmOptions {
    /// How long a roll may go without progress before it is `Stalled` (and alerted).
    pub roll_stall_deadline: Duration,
    /// How many events and finished rolls are kept, and for how long.
    pub retention: Retention,
}

impl Default for FarmOptions {
    fn default() -> Self {
        FarmOptions {
            roll_stall_deadline: Duration::from_secs(600),
            retention: Retention::default(),
        }
    }
}

/// Why a farm could not reconcile an object (or do one write); the object is logged and
/// backs off, then is reconciled again.
#[derive(Debug, thiserror::Error)]
pub enum FarmError {
    /// The store failed, or a write lost to a change made since the farm looked.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The leadership term has ended, so the farm writes nothing more.
    #[error("the leadership term has ended")]
    TermEnded,
    /// A free lock cannot be taken yet: its lock-delay runs after a failover.
    #[error("{0} is free but cannot be taken yet (lock-delay)")]
    LockDelay(String),
    /// The object as stored cannot be acted on, e.g. a node selector that does not parse.
    #[error("{0}")]
    Unusable(String),
}

impl FarmError {
    /// Whether a write lost to a change made since the farm looked (the next pass sees it).
    pub fn is_conflict(&self) -> bool {
        matches!(self, FarmError::Store(StoreError::Conflict { .. }))
    }

    /// Whether a write was sent but its answer lost: it may have landed, or land yet.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, FarmError::Store(StoreError::OutcomeUnknown(_)))
    }
}

/// The result of a farm's step.
pub type FarmResult<T> = Result<T, FarmError>;

/// What every farm needs during one leadership term.
pub struct FarmContext {
    pub store: Arc<dyn KvStore>,
    /// The term's session: the farms' locks are taken and fenced with it.
    pub session: String,
    /// The session holding [`LEADER_LOCK`], for writes fenced on leadership alone.
    leader_session: String,
    /// Cancelled when the term ends; checked before every write.
    pub cancel: CancellationToken,
    pub alerts: Arc<Alerter>,
    /// The alerts being posted, and room for the posts at once.
    alert_posts: TaskTracker,
    alert_slots: Arc<Semaphore>,
    /// Names this server in lock values and audit records.
    pub holder: String,
}

/// How many alerts are posted to the webhook at once.
pub const ALERTS_IN_FLIGHT: usize = CONCURRENT_OBJECTS;

impl FarmContext {
    /// The context for one term.
    pub fn new(store: Arc<dyn KvStore>, term: &Term, alerts: Arc<Alerter>, holder: String) -> Self {
        FarmContext {
            store,
            session: term.session.clone(),
            leader_session: term.leader_session.clone(),
            cancel: term.cancel.clone(),
            alerts,
            alert_posts: TaskTracker::new(),
            alert_slots: Arc::new(Semaphore::new(ALERTS_IN_FLIGHT)),
            holder,
        }
    }

    /// Commits `ops` fenced by `check-session` on `lock` (one of the term's locks, or
    /// [`LEADER_LOCK`]), unless the term has ended.
    pub async fn commit(&self, lock: &str, ops: Vec<TxnOp>) -> FarmResult<Vec<Option<KvPair>>> {
        let mut fenced = Vec::with_capacity(ops.len() + 1);
        fenced.push(self.fence(lock));
        fenced.extend(ops);
        self.commit_fenced(&fenced).await
    }

    /// Whether `ops`, fenced on `lock` as [`FarmContext::commit`] sends them, are few and
    /// small enough for one transaction ([`validate_txn`]).
    pub fn fits(&self, lock: &str, ops: &[TxnOp]) -> bool {
        let mut fenced = Vec::with_capacity(ops.len() + 1);
        fenced.push(self.fence(lock));
        fenced.extend_from_slice(ops);
        validate_txn(&fenced).is_ok()
    }

    /// Commits several ops in one transaction, each fenced by `check-session` on its own lock
    /// (as for [`FarmContext::commit`]), unless the term has ended: all are written or none.
    pub async fn commit_each(
        &self,
        writes: Vec<(String, TxnOp)>,
    ) -> FarmResult<Vec<Option<KvPair>>> {
        let fenced: Vec<TxnOp> = writes
            .into_iter()
            .flat_map(|(lock, op)| [self.fence(&lock), op])
            .collect();
        self.commit_fenced(&fenced).await
    }

    /// The `check-session` op fencing a write on `lock` with the session that holds it.
    fn fence(&self, lock: &str) -> TxnOp {
        let session = if lock == LEADER_LOCK {
            &self.leader_session
        } else {
            &self.session
        };
        TxnOp::CheckSession {
            key: lock.to_owned(),
            session: session.clone(),
        }
    }

    async fn commit_fenced(&self, ops: &[TxnOp]) -> FarmResult<Vec<Option<KvPair>>> {
        if self.cancel.is_cancelled() {
            return Err(FarmError::TermEnded);
        }
        Ok(self.store.txn(ops).await?)
    }

    /// Takes `lock` with the term's session if it is free; `false` when someone else has
    /// it. The lock value names this server. A free lock that cannot be taken yet (its
    /// lock-delay runs after a failover) is [`FarmError::LockDelay`], so the farm retries it
    /// soon rather than at the next change. A session the store no longer knows ends the
    /// term at once: its locks are gone, and the next renewal would only find it out later.
    pub async fn take_lock(&self, world: &World, lock: &str) -> FarmResult<bool> {
        match world.lock_holder(lock) {
            Some(holder) if holder == self.session => return Ok(true),
            Some(_) => return Ok(false),
            None => {}
        }
        if self.cancel.is_cancelled() {
            return Ok(false);
        }
        match self
            .store
            .acquire(lock, self.holder.as_bytes(), &self.session)
            .await
        {
            Ok(true) => Ok(true),
            Ok(false) => Err(FarmError::LockDelay(lock.to_owned())),
            Err(StoreError::NotFound(e)) => {
                tracing::warn!(session = %self.session, error = %e, "the term's session is gone; the term ends");
                self.cancel.cancel();
                Err(FarmError::TermEnded)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Whether to reconcile object `id` now: it is not backing off, and `world` shows `lock`
    /// (its ownership lock) held by this session. A free lock is taken, and the object
    /// reconciled from the next world, which holds every change up to the taking
    /// ([`Trees::world`]): `world` may be older than it, and miss what the lock's previous
    /// holder wrote just before letting it go (a pod placed, which no check-and-set of ours
    /// would catch: the RC would be placed on another node as well). P2's workers likewise
    /// read their object's pods only once they hold its lock. Failures are logged and backed
    /// off; an object someone else owns is simply skipped.
    pub async fn claim(&self, world: &World, retries: &mut Retries, id: &str, lock: &str) -> bool {
        if !retries.ready(id) {
            return false;
        }
        let held = self.holds(world, lock);
        let taken = self.take_lock(world, lock).await;
        settle_claim(retries, id, taken) && held
    }

    /// Whether `world` shows `lock` held by this term's session.
    fn holds(&self, world: &World, lock: &str) -> bool {
        world.lock_holder(lock) == Some(self.session.as_str())
    }

    /// [`FarmContext::claim`] over `ids` (each with its ownership lock from `lock_of`); the
    /// ids to reconcile now (those whose lock `world` shows held by this session), in the
    /// order given. Free locks are taken many to a
    /// transaction, up to [`CONCURRENT_OBJECTS`] transactions at once, so that a new leader
    /// of ten thousand RCs takes their locks in a few of the store's commits; a batch that
    /// fails (one of its locks taken meanwhile, or in its lock-delay) is taken lock by lock,
    /// as are the others, up to [`CONCURRENT_OBJECTS`] at once.
    pub async fn claim_all<'a>(
        &self,
        world: &World,
        retries: &mut Retries,
        ids: impl IntoIterator<Item = &'a str>,
        lock_of: impl Fn(&str) -> String,
    ) -> Vec<&'a str> {
        let ready: Vec<(&str, String)> = ids
            .into_iter()
            .filter(|id| retries.ready(id))
            .map(|id| (id, lock_of(id)))
            .collect();
        let free: Vec<&(&str, String)> = ready
            .iter()
            .filter(|(_, lock)| world.lock_holder(lock).is_none())
            .collect();
        let batches: Vec<_> = free
            .chunks(MAX_TXN_OPS)
            .map(|batch| async move { self.take_free_locks(batch).await })
            .collect();
        let taken: HashSet<&str> = stream::iter(batches)
            .buffer_unordered(CONCURRENT_OBJECTS)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .flatten()
            .collect();
        let claims: Vec<_> = ready
            .iter()
            .map(|(id, lock)| async {
                if taken.contains(id) {
                    return (*id, Ok(true));
                }
                (*id, self.take_lock(world, lock).await)
            })
            .collect();
        let claimed: Vec<(&str, FarmResult<bool>)> = stream::iter(claims)
            .buffered(CONCURRENT_OBJECTS)
            .collect()
            .await;
        let held: HashSet<&str> = ready
            .iter()
            .filter(|(_, lock)| self.holds(world, lock))
            .map(|(id, _)| *id)
            .collect();
        claimed
            .into_iter()
            .filter_map(|(id, taken)| {
                (settle_claim(retries, id, taken) && held.contains(id)).then_some(id)
            })
            .collect()
    }

    /// Takes the free locks of `batch` (ids with their locks) in one transaction: the ids
    /// whose lock it took, all or none.
    async fn take_free_locks<'a>(&self, batch: &[&(&'a str, String)]) -> Vec<&'a str> {
        if self.cancel.is_cancelled() {
            return Vec::new();
        }
        let take: Vec<TxnOp> = batch
            .iter()
            .map(|(_, lock)| TxnOp::Lock {
                key: lock.clone(),
                value: self.holder.as_bytes().to_vec(),
                session: self.session.clone(),
            })
            .collect();
        match self.store.txn(&take).await {
            Ok(_) => batch.iter().map(|(id, _)| *id).collect(),
            Err(e) => {
                tracing::debug!(error = %e, "a batch of free locks was not taken at once");
                Vec::new()
            }
        }
    }

    /// The actor the farm named `farm` records its events as: `farm:<farm>@<holder>`.
    pub fn actor(&self, farm: &str) -> Actor {
        Actor::farm(farm, &self.holder)
    }

    /// The ops recording `event` in its change's transaction (see
    /// [`crate::store::events::record_ops`]).
    pub async fn record(&self, event: &Event) -> FarmResult<Vec<TxnOp>> {
        Ok(record_ops(self.store.as_ref(), event).await?)
    }

    /// Raises a low-urgency alert from the farm named `farm` about `kind` `id` and, when it is
    /// not a repeat ([`Alerter::due`]), records it as an event. The webhook is posted to in
    /// the background, [`ALERTS_IN_FLIGHT`] at a time: a pass awaiting each post in turn held
    /// up every object after the alerted ones for as long as the webhook took to answer,
    /// seconds each. Nothing is sent once the term has ended, and posts still in flight then
    /// are dropped: a pass over many objects would otherwise go on posting to the webhook
    /// and hold up the server's stepping down or stopping.
    pub async fn alert(
        &self,
        farm: &str,
        (kind, id): (ObjectKind, &str),
        incident_key: &str,
        description: String,
        details: serde_json::Value,
    ) {
        if self.cancel.is_cancelled() || !self.alerts.due(incident_key) {
            return;
        }
        let (alerts, slots, cancel) = (
            self.alerts.clone(),
            self.alert_slots.clone(),
            self.cancel.clone(),
        );
        let (key, text) = (incident_key.to_owned(), description.clone());
        self.alert_posts.spawn(async move {
            tokio::select! {
                () = async {
                    let _slot = slots.acquire().await;
                    alerts.send_low(key, text, details).await;
                } => {}
                () = cancel.cancelled() => {}
            }
        });
        let mut event = self.actor(farm).event(kind, id, Action::Alert, Vec::new());
        event.message = Some(description);
        let written = match self.record(&event).await {
            Ok(ops) => self.commit(LEADER_LOCK, ops).await.map(drop),
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::warn!(%id, error = %e, "recording an alert as an event failed");
        }
    }

    /// Waits for the alerts posted in the background to be sent, or dropped as the term
    /// ends.
    pub async fn alerts_sent(&self) {
        self.alert_posts.close();
        self.alert_posts.wait().await;
    }

    /// Frees a lock this session holds (ownership of an object that is gone); a lock that
    /// is already gone is fine.
    pub async fn release_lock(&self, lock: &str) -> FarmResult<()> {
        let ops = [
            TxnOp::CheckSession {
                key: lock.to_owned(),
                session: self.session.clone(),
            },
            TxnOp::Delete {
                key: lock.to_owned(),
            },
        ];
        match self.store.txn(&ops).await {
            Ok(_) => Ok(()),
            Err(StoreError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Frees this session's ownership locks `<prefix><id>` of objects that no longer exist,
    /// up to [`CONCURRENT_OBJECTS`] at once: thousands of objects deleted together would
    /// otherwise hold up the farm's pass for a round trip each. A failure is logged and
    /// returned, for the farm to try again ([`TIDYING`]).
    pub async fn release_orphaned(
        &self,
        world: &World,
        prefix: &str,
        exists: impl Fn(&str) -> bool,
    ) -> FarmResult<()> {
        let orphaned: Vec<String> = self
            .owned(world, prefix)
            .filter(|(_, id)| !exists(id))
            .map(|(key, _)| key.to_owned())
            .collect();
        let released: Vec<FarmResult<()>> = stream::iter(orphaned)
            .map(|key| async move {
                let released = self.release_lock(&key).await;
                if let Err(e) = &released {
                    tracing::warn!(%key, error = %e, "releasing an ownership lock failed");
                }
                released
            })
            .buffer_unordered(CONCURRENT_OBJECTS)
            .collect()
            .await;
        released.into_iter().collect()
    }

    /// The ownership locks `<prefix><id>` this session holds, each with its object's id
    /// (a lock under an object's own, such as its mutation lock, is not one).
    fn owned<'a>(
        &'a self,
        world: &'a World,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let held = world.locks_under(prefix);
        held.filter(|(_, holder)| *holder == Some(self.session.as_str()))
            .filter_map(move |(key, _)| {
                let id = key.strip_prefix(prefix)?;
                (!id.contains('/')).then_some((key, id))
            })
    }
}

/// One farm: a pass over everything it owns.
pub trait Farm: Send {
    /// For logs and metrics.
    const NAME: &'static str;

    /// The lock tree of the objects it owns, if it owns any (for the owned-objects metric).
    const OWNERSHIP_LOCKS: Option<&'static str> = None;

    /// The shortest time from one pass to the next: a farm whose work is not urgent looks
    /// at a storm of changes a few times, rather than once per change (each pass reads
    /// whole trees of the mirror).
    const PACE: Duration = Duration::ZERO;

    /// Its per-object backoff (for the error and queue metrics).
    fn retries(&self) -> &Retries;

    /// Reconciles every object once against `world`; returns when it wants to run again
    /// at the latest for reasons of its own (a roll delay, a stall deadline), if sooner
    /// than [`RESYNC`]. The retries of objects that failed are [`drive`]'s to wake for.
    fn pass(
        &mut self,
        ctx: &FarmContext,
        world: &World,
    ) -> impl std::future::Future<Output = Option<Instant>> + Send;
}

/// Runs `farm` until the term ends: a pass on every change of the mirror (the farms' own
/// writes included, applied at once) and at least every [`RESYNC`].
pub async fn drive<F: Farm>(mut farm: F, ctx: Arc<FarmContext>, mut trees: Trees) {
    tracing::info!(farm = F::NAME, "farm started");
    let _running = crate::metrics::FarmRunning::started(F::NAME, F::OWNERSHIP_LOCKS.is_some());
    let mut failures = farm.retries().failures();
    loop {
        let world = tokio::select! {
            world = trees.world() => world,
            () = ctx.cancel.cancelled() => break,
        };
        if ctx.cancel.is_cancelled() {
            break;
        }
        let started = Instant::now();
        // A pass is given up when the term ends: one waiting on a store that does not
        // answer would otherwise hold up the step-down (and the server's stop) for as long
        // as the store takes, a request timeout per call. Nothing is lost: each write is one
        // fenced transaction, applied whole or not at all, and the next term plans afresh.
        let planned = tokio::select! {
            planned = farm.pass(&ctx, &world) => planned,
            () = ctx.cancel.cancelled() => break,
        };
        let retries = farm.retries();
        let planned = earliest(planned, retries.due_after(started));
        let wake = planned.map_or(Instant::now() + RESYNC, |at| {
            at.min(Instant::now() + RESYNC)
        });
        crate::metrics::farm_pass(
            F::NAME,
            FarmPass {
                took: started.elapsed(),
                new_errors: retries.failures() - failures,
                waiting: retries.waiting(),
                owned: F::OWNERSHIP_LOCKS.map(|prefix| ctx.owned(&world, prefix).count()),
            },
        );
        failures = retries.failures();
        if !F::PACE.is_zero() {
            tokio::select! {
                () = tokio::time::sleep_until(started + F::PACE) => {}
                () = ctx.cancel.cancelled() => break,
            }
        }
        tokio::select! {
            () = trees.changed() => {}
            () = tokio::time::sleep_until(wake) => {}
            () = ctx.cancel.cancelled() => break,
        }
    }
    tracing::info!(farm = F::NAME, "farm stopped");
}

/// Whether a claim of object `id` that `taken` its lock (see [`FarmContext::take_lock`])
/// lets the pass reconcile it; someone else's lock clears the object's backoff, an error
/// starts or extends it.
fn settle_claim(retries: &mut Retries, id: &str, taken: FarmResult<bool>) -> bool {
    match taken {
        Ok(true) => true,
        Ok(false) => {
            // Someone else owns it now; any backoff of ours is moot.
            retries.succeeded(id);
            false
        }
        Err(e) => {
            tracing::debug!(%id, error = %e, "cannot take the ownership lock yet");
            retries.failed(id);
            false
        }
    }
}

/// The sooner of two optional wake-up times.
pub fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The key a farm's [`Retries`] keep its own tidying under when a step of it failed
/// (freeing the locks, and removing the conditions, of objects gone): no object of its own
/// would wake the farm to try again, and a lock left held keeps every other farm, this
/// server's next term's or P2's, from the object until the next change or [`RESYNC`].
pub const TIDYING: &str = "tidying";

/// Per-object backoff after failed reconciles, with jitter.
#[derive(Default)]
pub struct Retries {
    failing: HashMap<String, (Backoff, Instant)>,
    /// Failures recorded so far.
    failures: u64,
}

impl Retries {
    /// Whether the object may be reconciled now.
    pub fn ready(&self, id: &str) -> bool {
        self.failing
            .get(id)
            .is_none_or(|(_, not_before)| Instant::now() >= *not_before)
    }

    /// Records a failure; returns when to try again.
    pub fn failed(&mut self, id: &str) -> Instant {
        self.failures += 1;
        let (backoff, not_before) = self.failing.entry(id.to_owned()).or_insert_with(|| {
            (
                Backoff::new(Duration::from_millis(500), Duration::from_secs(60)),
                Instant::now(),
            )
        });
        *not_before = Instant::now() + backoff.next_delay();
        *not_before
    }

    /// Records how reconciling `id` (a `what`) went: its value on success; on failure the
    /// error is logged and the object backs off.
    pub fn record<T>(&mut self, what: &str, id: &str, result: FarmResult<T>) -> Option<T> {
        match result {
            Ok(value) => {
                self.succeeded(id);
                Some(value)
            }
            Err(e) => {
                tracing::warn!(%id, error = %e, "reconciling the {what} failed");
                self.failed(id);
                None
            }
        }
    }

    /// Records a success.
    pub fn succeeded(&mut self, id: &str) {
        self.failing.remove(id);
    }

    /// The earliest retry falling due after `since`, the start of the pass that recorded
    /// it, even if already past: one that fell due while that pass still ran had no pass to
    /// take it, and would otherwise wait for the next change or [`RESYNC`]. One due before
    /// the pass began was that pass's to take; if it did not, its object is gone, and it
    /// must not make the farm spin.
    pub fn due_after(&self, since: Instant) -> Option<Instant> {
        self.failing
            .values()
            .map(|(_, at)| *at)
            .filter(|at| *at > since)
            .min()
    }

    /// How many failures have been recorded.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// How many objects wait to be retried after a failure.
    pub fn waiting(&self) -> usize {
        self.failing.len()
    }

    /// Forgets the objects that no longer exist (the farm's tidying is kept).
    pub fn retain(&mut self, exists: impl Fn(&str) -> bool) {
        self.failing.retain(|id, _| id == TIDYING || exists(id));
    }

    /// Records how the farm's tidying went ([`TIDYING`]), whose failures are logged where
    /// they happen.
    pub fn tidied(&mut self, result: FarmResult<()>) {
        match result {
            Ok(()) => self.succeeded(TIDYING),
            Err(_) => {
                self.failed(TIDYING);
            }
        }
    }
}

/// Runs every farm for one term on `mirror` (a started mirror of `store`, shared with the
/// API) once it has read every tree, with `options`; returns when the term ends and every
/// farm task has stopped.
pub async fn run_term(
    store: Arc<dyn KvStore>,
    mirror: Mirror,
    term: Term,
    alerts: Arc<Alerter>,
    holder: String,
    options: FarmOptions,
) {
    let tasks = TaskTracker::new();
    tasks.spawn(end_term_once_lost(mirror.clone(), term.cancel.clone()));
    tokio::select! {
        () = mirror.loaded() => {}
        () = term.cancel.cancelled() => {
            tasks.close();
            tasks.wait().await;
            return;
        }
    }
    let trees = Trees::new(mirror.clone());
    // Every write of the farms reaches the mirror at once, as the API's do.
    let store = OwnWrites::wrap(store, mirror.clone());
    let ctx = Arc::new(FarmContext::new(store, &term, alerts, holder));
    spawn_farm(
        &tasks,
        &term,
        drive(rc::RcFarm::new(mirror.clone()), ctx.clone(), trees.clone()),
    );
    spawn_farm(
        &tasks,
        &term,
        drive(
            roll::RollFarm::new(options.roll_stall_deadline, mirror.clone()),
            ctx.clone(),
            trees.clone(),
        ),
    );
    spawn_farm(
        &tasks,
        &term,
        drive(ds::DsFarm::new(mirror.clone()), ctx.clone(), trees.clone()),
    );
    spawn_farm(
        &tasks,
        &term,
        drive(
            stale_locks::StaleLockFarm::default(),
            ctx.clone(),
            trees.clone(),
        ),
    );
    spawn_farm(
        &tasks,
        &term,
        drive(
            retention::RetentionFarm::new(mirror, options.retention),
            ctx.clone(),
            trees.clone(),
        ),
    );
    tasks.close();
    term.cancel.cancelled().await;
    tasks.wait().await;
    ctx.alerts_sent().await;
}

/// How often a term looks at whether the mirror still follows the store.
const MIRROR_CHECK: Duration = Duration::from_secs(1);

/// Whether the farms could lead on `mirror`: not once it has lost the store for a tree they
/// read, as `/readyz` tells it (the tree's watch failing, or the store silent to every
/// read, past the mirror's bound), since they do not act on trees known to be behind.
/// Leading then would hold the leader lock while nothing reconciles, and keep out a server
/// whose mirror follows the store. `Err` says why not.
pub fn could_lead(mirror: &Mirror) -> Result<(), String> {
    let health = mirror.health();
    if let Some(silent) = health.silent {
        return Err(format!(
            "the store has not answered the mirror for {silent:.1?}"
        ));
    }
    let followed: Vec<String> = Trees::FOLLOWED.iter().map(|tree| tree.prefix()).collect();
    let lost: Vec<String> = health
        .lost
        .into_iter()
        .filter(|(prefix, _)| followed.contains(prefix))
        .map(|(prefix, lost_for)| format!("{prefix} for {lost_for:.1?}"))
        .collect();
    if lost.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the mirror has lost the store's watch of {}",
        lost.join(", ")
    ))
}

/// Ends the term once the farms could no longer lead on the mirror ([`could_lead`]). The
/// server then bids again only once they could.
async fn end_term_once_lost(mirror: Mirror, cancel: CancellationToken) {
    loop {
        if let Err(why) = could_lead(&mirror) {
            tracing::warn!(%why, "the term ends");
            cancel.cancel();
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(MIRROR_CHECK) => {}
            () = cancel.cancelled() => return,
        }
    }
}

/// Runs one farm; if it ever stops before the term ends (a panic, say), the term ends too,
/// so that this server steps down instead of leading with a farm missing.
fn spawn_farm(
    tasks: &TaskTracker,
    term: &Term,
    farm: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let handle = tokio::spawn(farm);
    let cancel = term.cancel.clone();
    tasks.spawn(async move {
        if let Err(e) = handle.await {
            tracing::error!(error = %e, "a farm failed; stepping down");
        }
        cancel.cancel();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::sqlite::SqliteStore;
    use crate::kv::SessionSpec;

    async fn session(store: &dyn KvStore, name: &str) -> String {
        let spec = SessionSpec::deleting(name, Duration::from_secs(60));
        store.create_session(&spec).await.unwrap()
    }

    /// A writer batch reaches the change stream at once: the largest the farms write must
    /// not cut off a subscriber that has yet to read any of it.
    #[test]
    fn a_change_stream_subscriber_has_room_for_the_farms_largest_batch() {
        let buffer = crate::state::MirrorConfig::default().subscriber_buffer;
        assert!(
            buffer >= CONCURRENT_OBJECTS * crate::kv::MAX_TXN_OPS,
            "{buffer}"
        );
    }

    /// A farm whose first pass fails object `a` and then runs on past the retry's due time;
    /// it counts its passes.
    struct SlowlyFailing {
        retries: Retries,
        passes: tokio::sync::watch::Sender<usize>,
    }

    impl Farm for SlowlyFailing {
        const NAME: &'static str = "slowly-failing";

        fn retries(&self) -> &Retries {
            &self.retries
        }

        async fn pass(&mut self, _ctx: &FarmContext, _world: &World) -> Option<Instant> {
            if *self.passes.borrow() == 0 {
                self.retries.failed("a");
                tokio::time::sleep(Duration::from_secs(1)).await;
            } else {
                self.retries.succeeded("a");
            }
            self.passes.send_modify(|passes| *passes += 1);
            None
        }
    }

    /// A retry that falls due while the pass that recorded it still runs is taken at once,
    /// not at the next change of the trees or [`RESYNC`] (a roll whose step failed on a
    /// busy server could wait that long to be finished).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retry_due_while_its_pass_ran_is_taken_at_once() {
        let (_dir, ctx, mirror) = crate::farms::fixture::idle_context().await;
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        mirror.start(&tasks, stop.clone());
        // Nothing changes in the trees from here on: no change wakes the farm.
        mirror.loaded().await;
        let (passes, mut counted) = tokio::sync::watch::channel(0);
        let farm = SlowlyFailing {
            retries: Retries::default(),
            passes,
        };
        let ctx = Arc::new(ctx);
        tasks.spawn(drive(farm, ctx.clone(), Trees::new(mirror)));
        let retried = tokio::time::timeout(RESYNC / 3, counted.wait_for(|passes| *passes >= 2));
        assert!(
            retried.await.is_ok(),
            "the retry waited for the next resync"
        );
        ctx.cancel.cancel();
        stop.cancel();
    }

    /// A farm that fails object `a` in its first pass and panics in the next (a bug of its
    /// own).
    struct PanicsOnRetry {
        retries: Retries,
        passes: usize,
    }

    impl Farm for PanicsOnRetry {
        const NAME: &'static str = "panics-on-retry";
        const OWNERSHIP_LOCKS: Option<&'static str> = Some("lock/panics-on-retry/");

        fn retries(&self) -> &Retries {
            &self.retries
        }

        async fn pass(&mut self, _ctx: &FarmContext, _world: &World) -> Option<Instant> {
            self.passes += 1;
            assert!(self.passes < 2, "a farm's bug");
            self.retries.failed("a");
            None
        }
    }

    /// A farm that panics ends its term ([`spawn_farm`]), its locks going with the term's
    /// session: it reports owning and waiting for nothing, as a farm stopped with its term
    /// does, not what its last pass saw, so that a server that no longer leads shows none of
    /// the farm's work as its own.
    #[tokio::test]
    async fn a_farm_that_panics_reports_owning_and_waiting_for_nothing() {
        use prom_text_format_parser::Scrape;

        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // This test's runtime runs every task on this thread: they all record here.
        let _recording = ::metrics::set_default_local_recorder(&recorder);
        let (_dir, ctx, mirror) = crate::farms::fixture::idle_context().await;
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        mirror.start(&tasks, stop.clone());
        mirror.loaded().await;
        let farm = PanicsOnRetry {
            retries: Retries::default(),
            passes: 0,
        };
        let driven = tokio::spawn(drive(farm, Arc::new(ctx), Trees::new(mirror)));
        let ended = driven.await;
        assert!(ended.as_ref().is_err_and(|e| e.is_panic()), "{ended:?}");
        let text = handle.render();
        let scrape = Scrape::parse(&text).expect("the Prometheus text format");
        let gauge = |name: &str| {
            let metric = scrape.metrics.iter().find(|metric| metric.name == name)?;
            let sample = metric.samples.iter().find(|sample| {
                (sample.labels.iter()).any(|l| l.key == "farm" && l.value == PanicsOnRetry::NAME)
            })?;
            Some(sample.value.value.as_f64())
        };
        let gauges = [
            crate::metrics::FARM_QUEUE_DEPTH,
            crate::metrics::FARM_OWNED_OBJECTS,
        ];
        assert_eq!(gauges.map(gauge), [Some(0.0), Some(0.0)], "{text}");
        stop.cancel();
    }

    /// The farms' context of a term of its own, on an embedded store in `dir`.
    async fn term_context(dir: &tempfile::TempDir) -> FarmContext {
        let path = dir.path().join("store.db").display().to_string();
        let store: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
        fixture::term_over(&store, "me").await.1
    }

    #[tokio::test]
    async fn a_batch_of_free_locks_that_fails_is_taken_lock_by_lock() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = term_context(&dir).await;
        let store = ctx.store.clone();
        // The world saw every lock free, but another farm has since taken the lock of `b`.
        let other = session(store.as_ref(), "another farm").await;
        assert!(store.acquire("lock/b", b"", &other).await.unwrap());
        let world = World::default();
        let mut retries = Retries::default();
        let ids = ["a", "b", "c"];
        let claimed = ctx
            .claim_all(&world, &mut retries, ids, |id| format!("lock/{id}"))
            .await;
        // Taken, but reconciled only from a world that shows them held.
        assert!(claimed.is_empty(), "{claimed:?}");
        for (id, holder) in [("a", &ctx.session), ("b", &other), ("c", &ctx.session)] {
            let lock = store.get(&format!("lock/{id}")).await.unwrap().unwrap();
            assert_eq!(lock.session(), Some(holder.as_str()), "{id}");
        }
        let mut fleet = crate::farms::fixture::Fleet::new();
        fleet.lock("lock/a", &ctx.session).lock("lock/b", &other);
        fleet.lock("lock/c", &ctx.session);
        let claimed = ctx
            .claim_all(&fleet.world(), &mut retries, ids, |id| format!("lock/{id}"))
            .await;
        assert_eq!(claimed, ["a", "c"]);
    }

    /// An object whose lock a pass takes is not reconciled from that pass's world, which may
    /// be older than the taking and miss what the lock's last holder wrote; it is from a
    /// world that shows the lock held.
    #[tokio::test]
    async fn an_object_is_reconciled_only_from_a_world_showing_its_lock_held() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = term_context(&dir).await;
        let mut retries = Retries::default();
        let world = World::default();
        assert!(!ctx.claim(&world, &mut retries, "a", "lock/a").await);
        let lock = ctx.store.get("lock/a").await.unwrap().unwrap();
        assert_eq!(lock.session(), Some(ctx.session.as_str()));
        assert!(retries.ready("a"), "a lock taken is no failure");
        let mut fleet = crate::farms::fixture::Fleet::new();
        fleet.lock("lock/a", &ctx.session);
        assert!(ctx.claim(&fleet.world(), &mut retries, "a", "lock/a").await);
    }
}
