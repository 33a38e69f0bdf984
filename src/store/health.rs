//! The health store: `health/<pod_id>/<node>` records in P2's format (Go field names).
//!
//! Results are keyed by the record's `Node` field, as P2's readers key them; a record with
//! an empty `Node` falls back to the key's node segment. An unrecognised status reads as
//! `unknown`, and an undecodable record is logged and skipped, which readers treat like a
//! missing one ("no result").
//!
//! Writes here are plain puts without a session. P2's preparer instead acquires the key with
//! a session whose end deletes it, so its records vanish when the preparer dies; a record
//! written through this store stays until it is overwritten or deleted, and whoever reports
//! through it must keep reporting (its `Expires`, a century ahead as the preparer sets it,
//! protects nothing).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use crate::model::{HealthRecord, HealthState};

use super::pods::PodLocation;
use super::reports::Report;
use super::update::Expected;
use crate::kv::{KvPair, KvStore, StoreError, StoreResult};
use crate::layout;
use crate::model::event::Actor;
use crate::state::Mirror;

/// One health record as read, with where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEntry {
    /// The pod ID, from the key.
    pub pod_id: String,
    /// The node, from the record's `Node` (the key's node segment when that is empty).
    pub node: String,
    /// The record as stored.
    pub record: HealthRecord,
    /// The key's modify index.
    pub index: u64,
}

impl HealthEntry {
    /// The reported state; `unknown` for any status this server does not know.
    pub fn state(&self) -> HealthState {
        self.record.status
    }
}

/// Reads and writes health records with P2's layout.
#[derive(Clone)]
pub struct HealthStore {
    kv: Arc<dyn KvStore>,
}

impl HealthStore {
    /// Wraps the KV store.
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        HealthStore { kv }
    }

    /// The prefix a listing reads: every record, or one pod ID's (which must be a single key
    /// segment). Blocking queries watch the same prefix.
    pub fn prefix(pod_id: Option<&str>) -> String {
        match pod_id {
            Some(pod_id) => layout::health_of_pod(pod_id),
            None => layout::HEALTH.to_owned(),
        }
    }

    /// The key of one pod's record on one node.
    pub fn key(pod: &PodLocation) -> String {
        layout::health(pod.pod_id(), pod.node())
    }

    /// The record at `health/<pod_id>/<node>`, or `None` when there is none, it cannot be
    /// decoded, or it names another node (whose result it is, as the listings take it).
    pub async fn get(&self, pod: &PodLocation) -> StoreResult<Option<HealthEntry>> {
        let pair = self.kv.get(&Self::key(pod)).await?;
        let entry = pair.and_then(|pair| decode(pod.pod_id(), pod.node(), &pair));
        Ok(entry.filter(|entry| entry.node == pod.node()))
    }

    /// One pod ID's records keyed by node, with the listing's index for blocking queries;
    /// what rolls count and daemon sets wait on.
    pub async fn list_for_pod(
        &self,
        pod_id: &str,
    ) -> StoreResult<(u64, BTreeMap<String, HealthEntry>)> {
        if pod_id.is_empty() || pod_id.contains('/') {
            return Err(StoreError::Invalid(format!(
                "pod id {pod_id:?} is not a single key segment"
            )));
        }
        let (index, entries) = self.read(&Self::prefix(Some(pod_id))).await?;
        let by_node = entries
            .into_iter()
            .map(|entry| (entry.node.clone(), entry))
            .collect();
        Ok((index, by_node))
    }

    /// Every record keyed by (pod ID, node), with the listing's index.
    pub async fn list(&self) -> StoreResult<(u64, BTreeMap<(String, String), HealthEntry>)> {
        let (index, entries) = self.read(layout::HEALTH).await?;
        let all = entries
            .into_iter()
            .map(|entry| ((entry.pod_id.clone(), entry.node.clone()), entry))
            .collect();
        Ok((index, all))
    }

    /// Records `state` for `pod` as taken at `now`, in the preparer's format, with `actor`'s
    /// event when the status changes (see [`Report`]). With `expected` the write happens
    /// only if the key is still at that modify index (0: only if absent), a `Conflict`
    /// otherwise.
    pub async fn put(
        &self,
        mirror: &Mirror,
        pod: &PodLocation,
        state: HealthState,
        now: SystemTime,
        expected: Option<Expected>,
        actor: &Actor,
    ) -> StoreResult<HealthEntry> {
        let record = HealthRecord::new(pod.pod_id(), pod.node(), state, now);
        let index = Report::health(pod)
            .write(
                self.kv.as_ref(),
                mirror,
                Some(record.to_json()),
                expected,
                actor,
            )
            .await?
            // Only a manifest is refused so, and a health record holds none.
            .map_err(|cause| StoreError::Invalid(cause.to_string()))?;
        Ok(HealthEntry {
            pod_id: pod.pod_id().to_owned(),
            node: pod.node().to_owned(),
            record,
            index,
        })
    }

    /// Removes `pod`'s record, if still at `expected` when given; with `actor`'s event when
    /// there was one.
    pub async fn delete(
        &self,
        mirror: &Mirror,
        pod: &PodLocation,
        expected: Option<Expected>,
        actor: &Actor,
    ) -> StoreResult<()> {
        Report::health(pod)
            .write(self.kv.as_ref(), mirror, None, expected, actor)
            .await
            .map(drop)
    }

    async fn read(&self, prefix: &str) -> StoreResult<(u64, Vec<HealthEntry>)> {
        let listing = self.kv.list(prefix).await?;
        let entries = listing
            .pairs
            .iter()
            .filter_map(|pair| {
                let rest = pair.key.strip_prefix(layout::HEALTH)?;
                let Some((pod_id, node)) =
                    rest.split_once('/').filter(|(_, n)| !n.contains('/'))
                else {
                    tracing::warn!(key = %pair.key, "skipping a health key that is not <pod_id>/<node>");
                    return None;
                };
                decode(pod_id, node, pair)
            })
            .collect();
        Ok((listing.index, entries))
    }
}

fn decode(pod_id: &str, key_node: &str, pair: &KvPair) -> Option<HealthEntry> {
    match HealthRecord::from_json(&pair.value) {
        Ok(record) => Some(HealthEntry {
            pod_id: pod_id.to_owned(),
            node: if record.node.is_empty() {
                key_node.to_owned()
            } else {
                record.node.clone()
            },
            record,
            index: pair.modify_index,
        }),
        Err(e) => {
            tracing::warn!(key = %pair.key, error = %e, "skipping an undecodable health record");
            None
        }
    }
}
