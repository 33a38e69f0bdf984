//! The status conditions the farms compute for RCs, rolls and daemon sets, kept beside P2's
//! trees at `p2-apiserver/conditions/<kind>/<id>` (P2's tools ignore them).
//!
//! Only the leader's farms write them, fenced like their other writes; the API reads them as
//! it reads the rest of an object's view (from the mirror, or from the store when asked).
//! An object no leader has looked at yet has none.

use std::collections::HashMap;
use std::sync::Arc;

use crate::kv::{KvStore, StoreResult, TxnOp};
use crate::model::conditions::{Condition, ConditionsRecord};
use crate::model::event::ObjectKind;
use crate::state::Mirror;

use crate::layout;

/// Typed access to the conditions records.
#[derive(Clone)]
pub struct ConditionStore {
    kv: Arc<dyn KvStore>,
}

impl ConditionStore {
    /// Wraps the KV store.
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        ConditionStore { kv }
    }

    /// Every record of one kind, by object id; `None` for a record that does not decode
    /// (rewritten or removed like any other).
    pub async fn list(
        &self,
        kind: ObjectKind,
    ) -> StoreResult<HashMap<String, Option<ConditionsRecord>>> {
        let prefix = layout::conditions_of_kind(kind);
        let listing = self.kv.list(&prefix).await?;
        Ok(listing
            .pairs
            .into_iter()
            .filter_map(|pair| {
                let id = pair.key.strip_prefix(&prefix)?.to_owned();
                Some((id, serde_json::from_slice(&pair.value).ok()))
            })
            .collect())
    }

    /// The op that writes an object's record.
    pub fn put_op(kind: ObjectKind, id: &str, record: &ConditionsRecord) -> TxnOp {
        TxnOp::Set {
            key: layout::conditions(kind, id),
            value: serde_json::to_vec(record).expect("a conditions record always serializes"),
        }
    }

    /// The op that removes an object's record.
    pub fn delete_op(kind: ObjectKind, id: &str) -> TxnOp {
        TxnOp::Delete {
            key: layout::conditions(kind, id),
        }
    }
}

/// The conditions kept for an object; empty when no leader has computed them yet (or the
/// record cannot be read).
pub async fn read_conditions(
    kv: &dyn KvStore,
    kind: ObjectKind,
    id: &str,
) -> StoreResult<Vec<Condition>> {
    let pair = kv.get(&layout::conditions(kind, id)).await?;
    Ok(pair.map(|pair| decode(&pair.value)).unwrap_or_default())
}

/// The conditions the mirror holds for an object, as [`read_conditions`] reads them.
pub fn mirrored(mirror: &Mirror, kind: ObjectKind, id: &str) -> Vec<Condition> {
    mirror
        .get(&layout::conditions(kind, id))
        .map(|entry| decode(&entry.pair.value))
        .unwrap_or_default()
}

/// The conditions of a stored record; none when it cannot be read.
fn decode(value: &[u8]) -> Vec<Condition> {
    serde_json::from_slice::<ConditionsRecord>(value)
        .map(|record| record.conditions)
        .unwrap_or_default()
}
