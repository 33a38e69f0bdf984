//! The one shape every repository reads and writes: a decoded document and the modify index
//! it was read at, which is both the CAS token of the next write and the API's `ETag`.

use crate::kv::{KvStore, StoreResult, TxnOp};

/// A decoded document and the modify index it was read at (0 for a document that is not
/// stored, such as the labels of an object that has none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Versioned<T> {
    pub value: T,
    pub index: u64,
}

impl<T> Versioned<T> {
    /// The same version of something derived from the value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Versioned<U> {
        Versioned {
            value: f(self.value),
            index: self.index,
        }
    }

    /// This version, once the store confirms that `key` is still at it (a `Conflict` when
    /// it has moved on). A change that finds nothing to write answers with the version it
    /// started from, which may be the mirror's, behind the store: a write's check-and-set
    /// would have caught that, and this check stands in for it.
    pub async fn confirmed(self, kv: &dyn KvStore, key: &str) -> StoreResult<Self> {
        let check = TxnOp::CheckIndex {
            key: key.to_owned(),
            index: self.index,
        };
        kv.txn(&[check]).await?;
        Ok(self)
    }
}
