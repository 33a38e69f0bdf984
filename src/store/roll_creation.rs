//! Creating rolling updates as P2's roll store does: update-creation locks on every RC
//! involved, a check for rolls already over them, then one transaction.
//!
//! The three request forms of P2 (both RCs exist; the old one exists and the new one is
//! created; the old one is found by selector, or stood in for, and the new one is created)
//! share this one path, so the locks, checks and the transaction are the same for all.

use std::sync::Arc;
use std::time::Duration;

use crate::labels::{LabelType, Labels, Selector, POD_ID_LABEL};
use crate::model::event::{diff, roll_fields, Action, Actor, ObjectKind};
pub use crate::model::roll_request::{RollPlan, RollRcs};
pub use crate::model::NewRc as RcWithLabels;
use crate::model::{foreign_pod_id, FieldError, RcId, StoredRc, StoredRoll};

use super::events::record_ops;
use super::labels::{write_op, LabelStore};
use super::manifest_too_large;
use super::rcs::RcStore;
use super::rolls::{Naming, RollRecord, RollStore};
use crate::kv::{KvPair, KvStore, SessionSpec, StoreError, TxnFailure, TxnOp};
use crate::layout;

/// Name of the creation session, which is also the value of the locks it takes: P2 names
/// its session this way and lock values only tell people who holds the lock.
pub const CREATION_SESSION_NAME: &str = "RU create lock for p2-apiserver";
/// TTL of the creation session, as in P2. A creation takes far less; if the server dies
/// mid-way, the locks vanish with the session at the latest after this long.
pub const CREATION_SESSION_TTL: Duration = Duration::from_secs(15);

/// Why a roll was not created. Every variant but `Store` is a refusal the client can act
/// on; the API maps each to its status.
#[derive(Debug, thiserror::Error)]
pub enum CreateRollError {
    /// The RC named by the request's `field` does not exist.
    #[error("no replication controller {id} exists")]
    RcMissing { field: &'static str, id: String },
    /// An RC the roll would be over is stored but cannot be decoded (`why` says so).
    #[error("{why}")]
    UnreadableRc { id: String, why: String },
    /// A stored roll cannot be decoded (`why` says so): it may name either RC as its old
    /// one, so no roll is created while it is stored, as in P2, whose check lists them all.
    #[error("{why}; it may name either replication controller, so no rolling update is created while it is stored")]
    UnreadableRoll { id: String, why: String },
    /// Both sides name the same RC.
    #[error("the old and the new replication controller are the same ({0})")]
    SameRc(String),
    /// `new_rc_labels` gives the existing new RC a `pod_id` label other than its manifest's
    /// id, which is always its `pod_id` label.
    #[error("the new RC's pod_id label {0}")]
    PodIdLabel(String),
    /// The old-RC selector matches more than one RC.
    #[error("the old RC selector {selector:?} matches {} replication controllers ({}); it must match at most one", matches.len(), matches.join(", "))]
    Ambiguous {
        selector: String,
        matches: Vec<String>,
    },
    /// `leave_old` asks to keep an old RC that does not exist.
    #[error("leave_old is set but no replication controller matches the old RC selector {0:?}, so there is no old RC to leave")]
    LeaveOldWithoutOld(String),
    /// Another request is creating a roll over the RC right now.
    #[error("another rolling update over replication controller {rc_id} is being created right now ({lock} is held); retry shortly")]
    Locked { rc_id: String, lock: String },
    /// A roll already moves replicas from or to the RC.
    #[error("rolling update {roll_id} is already in progress over replication controller {rc_id}; delete it or wait for it to finish")]
    InProgress { roll_id: String, rc_id: String },
    /// The final transaction was rolled back: something changed between the checks and the
    /// commit. The message says what.
    #[error("the rolling update was not created because the stored state changed meanwhile: {0}")]
    Changed(String),
    /// The new RC's manifest makes the creation's one transaction too large for the store
    /// ([`manifest_too_large`]): the cause, on `manifest`, says how large it may be.
    #[error("{0}")]
    ManifestTooLarge(FieldError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Creates rolls; cheap to build per request.
#[derive(Clone)]
pub struct RollCreator {
    kv: Arc<dyn KvStore>,
    rcs: RcStore,
    rolls: RollStore,
    labels: LabelStore,
}

impl RollCreator {
    /// Wraps the KV store.
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        RollCreator {
            rcs: RcStore::new(kv.clone()),
            rolls: RollStore::new(kv.clone()),
            labels: LabelStore::new(kv.clone()),
            kv,
        }
    }

    /// Creates the roll described by `plan` (and the RCs it asks for) in one transaction,
    /// after taking the update-creation lock of every RC involved and checking no roll is
    /// over them. The locks' session is destroyed before returning, whatever the outcome.
    /// The transaction records each creation as made by `actor`.
    pub async fn create(
        &self,
        plan: RollPlan,
        actor: &Actor,
    ) -> Result<RollRecord, CreateRollError> {
        let resolved = self.resolve(plan).await?;
        let session = CreationSession::open(self.kv.clone()).await?;
        let result = self.create_locked(&session, resolved, actor).await;
        session.close().await;
        result
    }

    /// Reads what the plan refers to and decides which RCs the roll is over.
    async fn resolve(&self, plan: RollPlan) -> Result<Resolved, CreateRollError> {
        let (old, new) = match plan.rcs {
            RollRcs::Existing {
                old_rc_id,
                new_rc_id,
            } => {
                self.require_rc("old_rc_id", &old_rc_id).await?;
                let new_rc = self.require_rc("new_rc_id", &new_rc_id).await?;
                // As for a new RC, checked with the request.
                if let Some(fault) = foreign_pod_id(&plan.new_rc_labels, &new_rc.manifest) {
                    return Err(CreateRollError::PodIdLabel(fault));
                }
                (OldSide::Existing(old_rc_id), NewSide::Existing(new_rc_id))
            }
            RollRcs::NewRc { old_rc_id, new_rc } => {
                self.require_rc("old_rc_id", &old_rc_id).await?;
                (
                    OldSide::Existing(old_rc_id),
                    NewSide::Create(Box::new(new_rc.prepared(&plan.new_rc_labels))),
                )
            }
            RollRcs::NewRcOverSelector {
                old_rc_selector,
                new_rc,
            } => {
                let new_rc = new_rc.prepared(&plan.new_rc_labels);
                let mut matches = self.matching_rcs(&old_rc_selector).await?;
                let old = match matches.len() {
                    1 => OldSide::Existing(matches.remove(0)),
                    0 if plan.leave_old => {
                        return Err(CreateRollError::LeaveOldWithoutOld(
                            old_rc_selector.to_string(),
                        ))
                    }
                    0 => new_rc.stand_in(),
                    _ => {
                        return Err(CreateRollError::Ambiguous {
                            selector: old_rc_selector.to_string(),
                            matches,
                        })
                    }
                };
                (old, NewSide::Create(Box::new(new_rc)))
            }
        };
        if old.id() == new.id() {
            return Err(CreateRollError::SameRc(new.id().to_owned()));
        }
        let roll = StoredRoll {
            old_rc: old.id().to_owned(),
            new_rc: new.id().to_owned(),
            desired_replicas: plan.desired_replicas,
            minimum_replicas: plan.minimum_replicas,
            leave_old: plan.leave_old,
            roll_delay: plan.roll_delay,
        };
        Ok(Resolved {
            old,
            new,
            roll,
            roll_labels: plan.roll_labels,
            new_rc_labels: plan.new_rc_labels,
        })
    }

    /// The ids of the existing RCs whose labels match; labels left behind by a deleted RC
    /// do not count.
    async fn matching_rcs(&self, selector: &Selector) -> Result<Vec<String>, CreateRollError> {
        let (_, labeled) = self
            .labels
            .select(LabelType::ReplicationController, selector)
            .await?;
        let mut ids = Vec::new();
        for item in labeled {
            if self.read_rc(&item.id).await?.is_some() {
                ids.push(item.id);
            } else {
                tracing::warn!(rc = %item.id, "ignoring labels of a replication controller that does not exist");
            }
        }
        Ok(ids)
    }

    async fn require_rc(&self, field: &'static str, id: &str) -> Result<StoredRc, CreateRollError> {
        match self.read_rc(id).await? {
            Some(rc) => Ok(rc),
            None => Err(CreateRollError::RcMissing {
                field,
                id: id.to_owned(),
            }),
        }
    }

    /// The RC `id`, if stored; one that cannot be decoded is `UnreadableRc`, not a fault of
    /// the request.
    async fn read_rc(&self, id: &str) -> Result<Option<StoredRc>, CreateRollError> {
        match self.rcs.get(id).await {
            Ok(record) => Ok(record.map(|r| r.value)),
            Err(StoreError::Invalid(why)) => Err(CreateRollError::UnreadableRc {
                id: id.to_owned(),
                why,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Everything after the session exists: locks, conflict check, the transaction.
    async fn create_locked(
        &self,
        session: &CreationSession,
        resolved: Resolved,
        actor: &Actor,
    ) -> Result<RollRecord, CreateRollError> {
        let mut ids = vec![resolved.old.id().to_owned(), resolved.new.id().to_owned()];
        // Sorted as P2 sorts them, so identical requests contend on the same first lock.
        ids.sort();
        for id in &ids {
            session.lock(id).await?;
        }
        for id in &ids {
            // A roll that cannot be decoded refuses the creation below whatever it names.
            if let Some(Naming::Roll(roll_id)) = self.rolls.naming(id).await? {
                return Err(CreateRollError::InProgress {
                    roll_id,
                    rc_id: id.clone(),
                });
            }
        }
        if let Some((id, why)) = self.rolls.unreadable().await? {
            let why = format!("stored roll {id} is unreadable: {why}");
            return Err(CreateRollError::UnreadableRoll { id, why });
        }

        let mut txn = Txn::default();
        for id in &ids {
            txn.push(
                session.check_op(id),
                format!("the update-creation lock of replication controller {id} was lost"),
            );
        }
        // The existing old RC and the size of its manifest, which its claim writes again.
        let mut claimed = None;
        if let Some(id) = resolved.old.existing() {
            let (claim, manifest) = self.claim_op(id).await?;
            claimed = Some((id, manifest));
            txn.push(
                claim,
                format!("the old replication controller {id} was deleted or changed"),
            );
        }
        if let Some(id) = resolved.new.existing() {
            txn.push(
                TxnOp::Get {
                    key: layout::rc(id),
                },
                format!("the new replication controller {id} was deleted"),
            );
        }
        match &resolved.new {
            NewSide::Create(new_rc) => {
                self.push_rc_creation(&mut txn, "new", new_rc, actor)
                    .await?
            }
            NewSide::Existing(id) if !resolved.new_rc_labels.is_empty() => {
                let current = self
                    .labels
                    .get(LabelType::ReplicationController, id)
                    .await?;
                let mut merged = current.value.clone();
                merged.extend(resolved.new_rc_labels.clone());
                if let Some(op) =
                    write_op(LabelType::ReplicationController, id, &merged, current.index)
                {
                    txn.push(
                        op,
                        format!("the labels of replication controller {id} changed"),
                    );
                }
                if merged != current.value {
                    // A label write like any other: its event in the same transaction.
                    let event = super::labels::event(
                        actor,
                        LabelType::ReplicationController,
                        id,
                        &current.value,
                        &merged,
                    );
                    for op in record_ops(self.kv.as_ref(), &event).await? {
                        txn.push(
                            op,
                            format!("the records of replication controller {id} changed"),
                        );
                    }
                }
            }
            NewSide::Existing(_) => {}
        }
        if let OldSide::StandIn(stand_in) = &resolved.old {
            self.push_rc_creation(&mut txn, "stand-in old", stand_in, actor)
                .await?;
        }
        let roll_id = resolved.roll.new_rc.clone();
        let roll_op = txn.push(
            RollStore::create_op(&resolved.roll),
            format!("a rolling update {roll_id} already exists"),
        );
        let current = self.labels.get(LabelType::Rolls, &roll_id).await?;
        if let Some(op) = write_op(
            LabelType::Rolls,
            &roll_id,
            &resolved.roll_labels,
            current.index,
        ) {
            txn.push(
                op,
                format!("the labels of rolling update {roll_id} changed"),
            );
        }
        let changes = diff(&serde_json::Value::Null, &roll_fields(&resolved.roll));
        let event = actor.event(ObjectKind::Rolls, &roll_id, Action::Created, changes);
        for op in record_ops(self.kv.as_ref(), &event).await? {
            txn.push(
                op,
                format!("the records of rolling update {roll_id} changed"),
            );
        }

        if let NewSide::Create(new_rc) = &resolved.new {
            // A stand-in old RC holds the new RC's manifest again; an existing one, claimed,
            // its own, which leaves the new one that much less room.
            let (copies, what) = match claimed {
                Some((id, manifest)) => (
                    1,
                    format!(
                        "a rolling update, with the RC it creates, its labels and its events, \
                         and the old RC {id}, written again unchanged to claim it (its \
                         manifest of {manifest} bytes included)"
                    ),
                ),
                None => (
                    2,
                    "a rolling update, with the RC it creates and a stand-in old RC holding \
                     its manifest again, their labels and its events"
                        .to_owned(),
                ),
            };
            if let Some(cause) = manifest_too_large(
                self.kv.as_ref(),
                &what,
                new_rc.rc.manifest.raw(),
                copies,
                &txn.ops,
            ) {
                return Err(CreateRollError::ManifestTooLarge(cause));
            }
        }
        let results = txn.commit(self.kv.as_ref()).await?;
        let index = results
            .get(roll_op)
            .cloned()
            .flatten()
            .map_or(0, |pair| pair.modify_index);
        Ok(RollRecord {
            value: resolved.roll,
            index,
        })
    }

    /// The op that claims the existing old RC `id` for the roll: its document written again
    /// unchanged, at the version read now. No roll key is derived from an old RC, so a write
    /// removing or changing it checks the rolls naming it just before its transaction; this
    /// moves the RC's version, which that write is check-and-set on, so a roll committed
    /// after those checks fails the write, whose next attempt finds the roll. An RC changed
    /// or deleted since it was read fails the creation instead. Answered with the size of
    /// the old RC's manifest, which the op holds again.
    async fn claim_op(&self, id: &str) -> Result<(TxnOp, usize), CreateRollError> {
        let key = layout::rc(id);
        let Some(pair) = self.kv.get(&key).await? else {
            return Err(CreateRollError::Changed(format!(
                "the old replication controller {id} was deleted"
            )));
        };
        let manifest = StoredRc::from_stored(id, &pair.value)
            .map_err(|e| CreateRollError::UnreadableRc {
                id: id.to_owned(),
                why: super::rcs::unreadable(id, &e),
            })?
            .manifest
            .raw()
            .len();
        let op = TxnOp::Cas {
            key,
            value: pair.value.to_vec(),
            index: pair.modify_index,
        };
        Ok((op, manifest))
    }

    async fn push_rc_creation(
        &self,
        txn: &mut Txn,
        which: &str,
        RcWithLabels { rc, labels }: &RcWithLabels,
        actor: &Actor,
    ) -> Result<(), CreateRollError> {
        let current = self
            .labels
            .get(LabelType::ReplicationController, &rc.id)
            .await?;
        for op in RcStore::create_ops(rc, labels, current.index) {
            txn.push(
                op,
                format!(
                    "the {which} replication controller {} or its labels appeared meanwhile",
                    rc.id
                ),
            );
        }
        for op in self.rcs.created_ops(rc, actor).await? {
            txn.push(
                op,
                format!("the records of replication controller {} changed", rc.id),
            );
        }
        Ok(())
    }
}

/// The plan with its RCs decided.
struct Resolved {
    old: OldSide,
    new: NewSide,
    roll: StoredRoll,
    roll_labels: Labels,
    new_rc_labels: Labels,
}

enum OldSide {
    Existing(String),
    StandIn(Box<RcWithLabels>),
}

impl OldSide {
    fn id(&self) -> &str {
        match self {
            OldSide::Existing(id) => id,
            OldSide::StandIn(stand_in) => &stand_in.rc.id,
        }
    }

    fn existing(&self) -> Option<&str> {
        match self {
            OldSide::Existing(id) => Some(id),
            OldSide::StandIn(_) => None,
        }
    }
}

enum NewSide {
    Existing(String),
    Create(Box<RcWithLabels>),
}

impl RcWithLabels {
    /// The RC as the roll creates it: no replicas, the roll's extra RC labels, and the
    /// `pod_id` label P2 gives every RC.
    fn prepared(self, extra_labels: &Labels) -> RcWithLabels {
        let RcWithLabels { mut rc, mut labels } = self;
        rc.replicas_desired = 0;
        labels.extend(extra_labels.clone());
        labels.insert(POD_ID_LABEL.to_owned(), rc.manifest.pod_id().to_owned());
        RcWithLabels { rc, labels }
    }

    /// A stand-in old RC: this spec and these labels under a fresh id, as P2 makes it.
    fn stand_in(&self) -> OldSide {
        let mut rc = self.rc.clone();
        rc.id = RcId::generate().to_string();
        OldSide::StandIn(Box::new(RcWithLabels {
            rc,
            labels: self.labels.clone(),
        }))
    }
}

impl NewSide {
    fn id(&self) -> &str {
        match self {
            NewSide::Existing(id) => id,
            NewSide::Create(new_rc) => &new_rc.rc.id,
        }
    }

    fn existing(&self) -> Option<&str> {
        match self {
            NewSide::Existing(id) => Some(id),
            NewSide::Create(_) => None,
        }
    }
}

/// The final transaction, with what each op's failure would mean, so a rollback can be
/// reported as its reason rather than as store internals.
#[derive(Default)]
struct Txn {
    ops: Vec<TxnOp>,
    meanings: Vec<String>,
}

impl Txn {
    /// Adds an op; returns its position.
    fn push(&mut self, op: TxnOp, meaning: String) -> usize {
        self.ops.push(op);
        self.meanings.push(meaning);
        self.ops.len() - 1
    }

    async fn commit(self, kv: &dyn KvStore) -> Result<Vec<Option<KvPair>>, CreateRollError> {
        match kv.txn(&self.ops).await {
            Ok(results) => Ok(results),
            Err(StoreError::Conflict { message, failures }) => {
                Err(CreateRollError::Changed(self.explain(&message, &failures)))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn explain(&self, message: &str, failures: &[TxnFailure]) -> String {
        let mut reasons: Vec<&str> = failures
            .iter()
            .filter_map(|f| self.meanings.get(f.op_index).map(String::as_str))
            .collect();
        reasons.dedup();
        if reasons.is_empty() {
            message.to_owned()
        } else {
            reasons.join("; ")
        }
    }
}

/// The short-lived session holding the update-creation locks. Its behavior is delete, so
/// destroying it removes every lock it took; if the request is abandoned before
/// [`CreationSession::close`], dropping it destroys the session in the background.
struct CreationSession {
    kv: Arc<dyn KvStore>,
    id: String,
    closed: bool,
}

impl CreationSession {
    async fn open(kv: Arc<dyn KvStore>) -> Result<Self, StoreError> {
        // No lock-delay: nothing should wait to re-lock once a creation is over.
        let spec = SessionSpec::deleting(CREATION_SESSION_NAME, CREATION_SESSION_TTL);
        let id = kv.create_session(&spec).await?;
        Ok(CreationSession {
            kv,
            id,
            closed: false,
        })
    }

    /// Takes the RC's update-creation lock; held by someone else is `Locked`.
    async fn lock(&self, rc_id: &str) -> Result<(), CreateRollError> {
        let key = layout::rc_update_creation(rc_id);
        if self
            .kv
            .acquire(&key, CREATION_SESSION_NAME.as_bytes(), &self.id)
            .await?
        {
            Ok(())
        } else {
            Err(CreateRollError::Locked {
                rc_id: rc_id.to_owned(),
                lock: key,
            })
        }
    }

    /// The op that fails the transaction unless this session still holds the RC's lock.
    fn check_op(&self, rc_id: &str) -> TxnOp {
        TxnOp::CheckSession {
            key: layout::rc_update_creation(rc_id),
            session: self.id.clone(),
        }
    }

    /// Destroys the session, releasing (deleting) its locks. A failure is only logged: the
    /// session's TTL ends it soon anyway. Only an answer marks it closed: a close cut short
    /// (its request's deadline passing while the store is slow) leaves the destruction to
    /// [`Drop`], rather than the locks to the TTL.
    async fn close(mut self) {
        if let Err(e) = self.kv.destroy_session(&self.id).await {
            tracing::warn!(session = %self.id, error = %e, "could not destroy the roll-creation session; it expires with its TTL");
        }
        self.closed = true;
    }
}

impl Drop for CreationSession {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let kv = self.kv.clone();
        let id = std::mem::take(&mut self.id);
        runtime.spawn(async move {
            if let Err(e) = kv.destroy_session(&id).await {
                tracing::warn!(session = %id, error = %e, "could not destroy an abandoned roll-creation session; it expires with its TTL");
            }
        });
    }
}
