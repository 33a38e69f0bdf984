//! The store as the server's handlers use it: every write that succeeds is applied to the
//! state mirror at once, so that a client that wrote through this server and then reads
//! from it sees its write without waiting for the mirror's watches (read-your-writes).
//!
//! A transaction's results carry the indexes the store gave, so they are applied as they
//! are; a plain put or lock answers no index, so the key is read back once and the pair
//! applied. A delete is applied with an index up to which no version of the key is current
//! any more (so that a newer version, written after it by another writer, is never taken
//! for the one it removed): the transaction's own index when its other writes answer it,
//! the version a compare-and-delete named, or else the index of a read of the key's
//! absence. Reads and watches go straight through.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::kv::{
    Cas, HeldWrites, KvPair, KvStore, Listing, PrefixUpdate, SessionInfo, SessionSpec, StoreError,
    StoreResult, TxnOp, WatchTarget,
};
use crate::state::{Mirror, OwnWrite};

/// A store that tells `mirror` of its own successful writes.
pub struct OwnWrites {
    kv: Arc<dyn KvStore>,
    mirror: Mirror,
}

impl OwnWrites {
    /// `kv`, telling `mirror` of each write made through it.
    pub fn wrap(kv: Arc<dyn KvStore>, mirror: Mirror) -> Arc<dyn KvStore> {
        Arc::new(OwnWrites { kv, mirror })
    }

    /// Applies what is now stored at `key`: the pair, or its absence at the index of a
    /// listing that lacks it. A key written again between the two reads, or a failed read,
    /// is left to the watches.
    async fn read_back(&self, key: &str) {
        let write = match self.kv.get(key).await {
            Ok(Some(pair)) => OwnWrite::Put(pair),
            Ok(None) => match self.kv.keys(key, Some('/')).await {
                Ok((index, keys)) if !keys.iter().any(|listed| listed == key) => OwnWrite::Delete {
                    key: key.to_owned(),
                    through: Some(index),
                },
                _ => return,
            },
            Err(_) => return,
        };
        self.mirror.apply_own_writes([write], None);
    }

    /// Makes `write`, noting in the mirror one of unknown outcome ([`Mirror::settle`]): one
    /// the store answered so, and one whose caller gave up on it before its answer (its
    /// future dropped, as by the request's deadline).
    async fn noted<T>(&self, write: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        /// Notes the write unless its answer came and was not `OutcomeUnknown`.
        struct Unanswered<'a>(&'a Mirror, bool);
        impl Drop for Unanswered<'_> {
            fn drop(&mut self) {
                if self.1 {
                    self.0.note_unsure_write();
                }
            }
        }
        let mut unanswered = Unanswered(&self.mirror, true);
        let written = write.await;
        unanswered.1 = matches!(written, Err(StoreError::OutcomeUnknown(_)));
        written
    }

    /// Applies `writes` (of the transaction at `txn`, if they are one's), reading back the
    /// deleted keys whose index the store did not tell.
    async fn apply(&self, writes: Vec<OwnWrite>, txn: Option<u64>) {
        let unindexed: Vec<String> = writes
            .iter()
            .filter_map(|write| match write {
                OwnWrite::Delete { key, through: None } => Some(key.clone()),
                _ => None,
            })
            .collect();
        self.mirror.apply_own_writes(writes, txn);
        for key in unindexed {
            self.read_back(&key).await;
        }
    }
}

#[async_trait]
impl KvStore for OwnWrites {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        self.kv.get(key).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        self.kv.list(prefix).await
    }

    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        self.kv.keys(prefix, separator).await
    }

    async fn prefix_index(&self, prefix: &str) -> StoreResult<u64> {
        self.kv.prefix_index(prefix).await
    }

    async fn prefix_index_through(&self, prefix: &str, through: u64) -> StoreResult<u64> {
        self.kv.prefix_index_through(prefix, through).await
    }

    async fn current_index(&self, probe: &str) -> StoreResult<Option<u64>> {
        self.kv.current_index(probe).await
    }

    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        self.noted(self.kv.put(key, value, cas)).await?;
        self.read_back(key).await;
        Ok(())
    }

    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        self.noted(self.kv.delete(key, cas)).await?;
        match cas {
            Cas::Index(version) => self.mirror.apply_own_writes(
                [OwnWrite::Delete {
                    key: key.to_owned(),
                    through: Some(version),
                }],
                None,
            ),
            Cas::Any => self.read_back(key).await,
        }
        Ok(())
    }

    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        self.noted(self.kv.delete_prefix(prefix)).await?;
        if let Ok((index, left)) = self.kv.keys(prefix, None).await {
            let gone = self.mirror.under(prefix);
            let gone = gone.iter().filter(|entry| !left.contains(&entry.pair.key));
            self.mirror.apply_own_writes(
                gone.map(|entry| OwnWrite::Delete {
                    key: entry.pair.key.clone(),
                    through: Some(index),
                }),
                None,
            );
        }
        Ok(())
    }

    fn key_prefix_len(&self) -> usize {
        self.kv.key_prefix_len()
    }

    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        let results = self.noted(self.kv.txn(ops)).await?;
        let txn = OwnWrite::txn_index(ops, &results);
        self.apply(OwnWrite::from_txn(ops, &results), txn).await;
        Ok(results)
    }

    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String> {
        self.kv.create_session(spec).await
    }

    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo> {
        self.kv.renew_session(id).await
    }

    async fn destroy_session(&self, id: &str) -> StoreResult<()> {
        self.kv.destroy_session(id).await
    }

    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>> {
        self.kv.session_info(id).await
    }

    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool> {
        let acquired = self.noted(self.kv.acquire(key, value, session)).await?;
        if acquired {
            self.read_back(key).await;
        }
        Ok(acquired)
    }

    async fn release(&self, key: &str, session: &str) -> StoreResult<bool> {
        let released = self.noted(self.kv.release(key, session)).await?;
        if released {
            self.read_back(key).await;
        }
        Ok(released)
    }

    async fn watch(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Listing> {
        self.kv.watch(target, index, wait).await
    }

    async fn watch_changes(
        &self,
        prefix: &str,
        index: u64,
        wait: Duration,
        held: HeldWrites<'_>,
    ) -> StoreResult<PrefixUpdate> {
        self.kv.watch_changes(prefix, index, wait, held).await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.kv.ping().await
    }

    async fn shut_down(&self) {
        self.kv.shut_down().await
    }
}
