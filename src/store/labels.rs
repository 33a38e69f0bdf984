//! The label store: `labels/<type>/<id>` keys holding a JSON object of string to string.
//!
//! Reads never fail on one bad entry: an undecodable label key is logged and skipped, so a
//! single corrupt document cannot hide every other object's labels.

use std::sync::Arc;

use crate::labels::{self, LabelType, Labeled, Labels, Selector};

use super::events::record_ops;
use super::update::{update_with_retry, Expected, UpdateError};
use super::Versioned;
use crate::kv::{KvPair, KvStore, StoreError, StoreResult, TxnOp};
use crate::layout;
use crate::model::event::{diff, Action, Actor, Event, EventKind};
use crate::model::rc::StoredRc;
use crate::model::rc_spec::pod_id_label_change;
use crate::model::to_go_json;
use crate::state::Mirror;

/// One object's labels and the modify index they were read at (0 when it has none).
pub type LabelRecord = Versioned<Labels>;

/// Reads and writes labels with P2's layout and JSON.
#[derive(Clone)]
pub struct LabelStore {
    kv: Arc<dyn KvStore>,
    /// The mirror `kv` reads, if it reads one: [`LabelStore::matching`] narrows through its
    /// label index.
    mirror: Option<Mirror>,
}

impl LabelStore {
    /// Wraps the KV store.
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        LabelStore { kv, mirror: None }
    }

    /// Wraps `kv`, which reads `mirror` when given (`api::reads` says which).
    pub fn reading(kv: Arc<dyn KvStore>, mirror: Option<&Mirror>) -> Self {
        LabelStore {
            kv,
            mirror: mirror.cloned(),
        }
    }

    /// One object's labels; an object without a key has no labels and index 0. A key that
    /// holds no label set reads as none at its index, so that a write replaces it whole.
    pub async fn get(&self, label_type: LabelType, id: &str) -> StoreResult<LabelRecord> {
        let pair = self.kv.get(&layout::labels(label_type, id)).await?;
        Ok(pair.map(|pair| record_from_pair(&pair)).unwrap_or_default())
    }

    /// One object's labels as a read shows them: as [`LabelStore::get`], but a key that
    /// holds no label set is `Err` saying why, as listings leave it out.
    pub async fn shown(
        &self,
        label_type: LabelType,
        id: &str,
    ) -> StoreResult<Result<LabelRecord, String>> {
        let Some(pair) = self.kv.get(&layout::labels(label_type, id)).await? else {
            return Ok(Ok(LabelRecord::default()));
        };
        Ok(match labels::from_json(&pair.value) {
            Ok(value) => Ok(Versioned {
                value,
                index: pair.modify_index,
            }),
            Err(e) => Err(format!(
                "the labels of {label_type} {id:?} cannot be decoded: {e}"
            )),
        })
    }

    /// The op that fails a transaction unless an object's labels are still at `index`, as
    /// [`LabelStore::get`] read them (0: it had none).
    pub fn unchanged_op(label_type: LabelType, id: &str, index: u64) -> TxnOp {
        let key = layout::labels(label_type, id);
        match index {
            0 => TxnOp::CheckNotExists { key },
            index => TxnOp::CheckIndex { key, index },
        }
    }

    /// Every labeled object of a type, with the listing's index for blocking queries.
    pub async fn list(&self, label_type: LabelType) -> StoreResult<(u64, Vec<Labeled>)> {
        let listing = self.kv.list(&layout::labels_of_type(label_type)).await?;
        Ok((listing.index, decode_listing(label_type, &listing.pairs)))
    }

    /// The objects of a type whose labels match `selector`.
    pub async fn select(
        &self,
        label_type: LabelType,
        selector: &Selector,
    ) -> StoreResult<(u64, Vec<Labeled>)> {
        let (index, mut all) = self.list(label_type).await?;
        all.retain(|labeled| selector.matches(&labeled.labels));
        Ok((index, all))
    }

    /// The objects of a type whose labels match `selector`, sorted by id, as
    /// [`LabelStore::select`] finds them; from a mirror, through its label index
    /// ([`Mirror::select`]), so that a selector naming a value costs what it matches, not
    /// every label set of the type.
    pub async fn matching(
        &self,
        label_type: LabelType,
        selector: &Selector,
    ) -> StoreResult<Vec<Labeled>> {
        let Some(mirror) = &self.mirror else {
            return Ok(self.select(label_type, selector).await?.1);
        };
        let found = mirror.select(label_type, selector).into_iter();
        Ok(found
            .map(|(id, labels)| Labeled {
                label_type,
                id,
                labels,
            })
            .collect())
    }

    /// Replaces an object's labels if its index is still `expected` (any index when `None`);
    /// an empty set deletes the key. Returns the new record.
    pub async fn replace(
        &self,
        label_type: LabelType,
        id: &str,
        labels: Labels,
        expected: Option<Expected>,
        actor: &Actor,
    ) -> Result<LabelRecord, LabelWriteError> {
        self.update(label_type, id, expected, actor, move |current| {
            *current = labels.clone()
        })
        .await
    }

    /// Applies `change` to an object's labels with check-and-set, by the rule of
    /// [`update_with_retry`]: with `expected` only at that index (a `Conflict` otherwise);
    /// without it re-applied to the latest labels until it lands, so concurrent writers of
    /// different keys all win. A change that changes something (labels that cannot be
    /// decoded replaced or removed among them) is recorded as `actor`'s event in the same
    /// transaction. A change taking an existing RC's `pod_id` label away from its manifest's
    /// id is refused ([`LabelWriteError::PodIdLabel`]), nothing written. Returns the new
    /// record.
    pub async fn update(
        &self,
        label_type: LabelType,
        id: &str,
        expected: Option<Expected>,
        actor: &Actor,
        change: impl Fn(&mut Labels) + Send + Sync,
    ) -> Result<LabelRecord, LabelWriteError> {
        let change = &change;
        update_with_retry(
            &describe(label_type, id),
            expected,
            || async { Ok(self.held(label_type, id).await?) },
            |current: Versioned<Held>| async move {
                let Versioned { value: held, index } = current;
                let mut labels = held.labels.clone();
                change(&mut labels);
                if label_type == LabelType::ReplicationController {
                    self.check_pod_id_label(id, &held.labels, &labels).await?;
                }
                // A key left empty or unreadable is removed even though no label changes.
                let op = write_op(label_type, id, &labels, index)
                    .filter(|_| labels != held.labels || labels.is_empty());
                let Some(op) = op else {
                    let value = held.labels;
                    return Ok(Ok(Versioned { value, index }));
                };
                // A delete-cas of a key another writer deleted since the read succeeds (as
                // in Consul): checking the index first makes that a conflict, whose fresh
                // read finds nothing left to delete, rather than a second `deleted` event.
                let mut ops = match &op {
                    TxnOp::DeleteCas { key, index } => vec![TxnOp::CheckIndex {
                        key: key.clone(),
                        index: *index,
                    }],
                    _ => Vec::new(),
                };
                let written = ops.len();
                ops.push(op);
                // Unreadable labels replaced or removed are a change whatever the new set.
                if labels != held.labels || held.unreadable {
                    let existed = !held.labels.is_empty() || held.unreadable;
                    let event = event_of(actor, label_type, id, (&held.labels, existed), &labels);
                    ops.extend(record_ops(self.kv.as_ref(), &event).await?);
                }
                Ok(self.kv.txn(&ops).await.map(|results| {
                    let index = results
                        .into_iter()
                        .nth(written)
                        .flatten()
                        .map_or(0, |pair| pair.modify_index);
                    Versioned {
                        value: labels,
                        index,
                    }
                }))
            },
        )
        .await
    }

    /// Refuses a write of RC `id`'s labels from `before` to `after` that takes their
    /// `pod_id` label away from the RC's manifest id ([`pod_id_label_change`]). The RC is
    /// read after the labels were: its creation and its deletion write its labels' key, so
    /// an RC created or deleted since makes the write's check-and-set miss and the check run
    /// again on what it left, and no write changes an RC's manifest id. An RC that does not
    /// exist, or cannot be decoded, has no manifest id to keep: the write goes ahead.
    async fn check_pod_id_label(
        &self,
        id: &str,
        before: &Labels,
        after: &Labels,
    ) -> Result<(), LabelWriteError> {
        if before.get(labels::POD_ID_LABEL) == after.get(labels::POD_ID_LABEL) {
            return Ok(());
        }
        let Some(pair) = self.kv.get(&layout::rc(id)).await? else {
            return Ok(());
        };
        let Ok(rc) = StoredRc::from_stored(id, &pair.value) else {
            return Ok(());
        };
        match pod_id_label_change(before, after, rc.manifest.pod_id()) {
            Some(problem) => Err(LabelWriteError::PodIdLabel(problem)),
            None => Ok(()),
        }
    }

    /// One object's labels as a write finds them, as [`LabelStore::get`] reads them, and
    /// whether the key holds labels that cannot be decoded.
    async fn held(&self, label_type: LabelType, id: &str) -> StoreResult<Versioned<Held>> {
        let pair = self.kv.get(&layout::labels(label_type, id)).await?;
        Ok(pair.map_or_else(Versioned::default, |pair| {
            let decoded = decode_labels(&pair);
            Versioned {
                value: Held {
                    unreadable: decoded.is_none(),
                    labels: decoded.unwrap_or_default(),
                },
                index: pair.modify_index,
            }
        }))
    }

    /// Removes every label of an object (if still at `expected`, when given); removing the
    /// labels of an object that has none succeeds, unless `expected` names a version.
    pub async fn delete(
        &self,
        label_type: LabelType,
        id: &str,
        expected: Option<Expected>,
        actor: &Actor,
    ) -> Result<(), LabelWriteError> {
        self.update(label_type, id, expected, actor, Labels::clear)
            .await
            .map(drop)
    }
}

/// Why a label write was not made.
#[derive(Debug, thiserror::Error)]
pub enum LabelWriteError {
    /// The write would take an RC's `pod_id` label away from its manifest's id; the message
    /// says so, for a cause on that label.
    #[error("{0}")]
    PodIdLabel(String),
    /// The store failed, or the labels were no longer at the expected version.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl UpdateError for LabelWriteError {
    fn stale(what: &str, expected: Expected) -> Self {
        StoreError::stale(what, expected).into()
    }
}

/// An object's labels as a write finds them: the set ([`LabelStore::get`]'s, none for a key
/// that cannot be decoded), and whether the key holds one that cannot be decoded, which the
/// write replaces or removes whole.
#[derive(Debug, Clone, Default)]
struct Held {
    labels: Labels,
    unreadable: bool,
}

/// The event of `actor` changing the labels of `label_type` `id` from `before` to `after`:
/// one change per label.
pub fn event(
    actor: &Actor,
    label_type: LabelType,
    id: &str,
    before: &Labels,
    after: &Labels,
) -> Event {
    event_of(actor, label_type, id, (before, !before.is_empty()), after)
}

/// [`event`], from labels `before` that were stored or not (`existed`): a key that held
/// labels that cannot be decoded had a set, shown as none.
fn event_of(
    actor: &Actor,
    label_type: LabelType,
    id: &str,
    (before, existed): (&Labels, bool),
    after: &Labels,
) -> Event {
    let (kind, object_id) = EventKind::of_labels(label_type, id);
    let as_json = |labels: &Labels| serde_json::to_value(labels).unwrap_or_default();
    let action = Action::of_change(existed, !after.is_empty());
    actor.event(
        kind,
        &object_id,
        action,
        diff(&as_json(before), &as_json(after)),
    )
}

/// The txn op that makes an object's labels `labels`, given the index they were read at:
/// a CAS write (in Go's JSON, as P2's applicator writes it), or a delete-CAS when the set is
/// empty; `None` when there is nothing to do.
pub fn write_op(label_type: LabelType, id: &str, labels: &Labels, index: u64) -> Option<TxnOp> {
    let key = layout::labels(label_type, id);
    if labels.is_empty() {
        return (index != 0).then_some(TxnOp::DeleteCas { key, index });
    }
    let value = to_go_json(labels);
    Some(TxnOp::Cas { key, value, index })
}

fn record_from_pair(pair: &KvPair) -> LabelRecord {
    Versioned {
        value: decode_labels(pair).unwrap_or_default(),
        index: pair.modify_index,
    }
}

/// One label key's object (P2 writes `null` for a nil map); logged and `None` when
/// unreadable.
pub fn decode_labels(pair: &KvPair) -> Option<Labels> {
    match labels::from_json(&pair.value) {
        Ok(labels) => Some(labels),
        Err(e) => {
            tracing::warn!(key = %pair.key, error = %e, "skipping unreadable labels");
            None
        }
    }
}

fn decode_listing(label_type: LabelType, pairs: &[KvPair]) -> Vec<Labeled> {
    let prefix = layout::labels_of_type(label_type);
    pairs
        .iter()
        .filter_map(|pair| {
            let id = pair.key.strip_prefix(&prefix)?.to_owned();
            let labels = decode_labels(pair)?;
            Some(Labeled {
                label_type,
                id,
                labels,
            })
        })
        .collect()
}

/// How a write's messages name an object's labels: "the label set of node \"node1\" has
/// changed since version 4".
pub fn describe(label_type: LabelType, id: &str) -> String {
    format!("the label set of {label_type} {id:?}")
}
