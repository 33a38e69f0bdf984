//! The mirror read as a store, so that a repository's reads serve from memory through the
//! same code that reads the store: an API read has one path whichever source serves it
//! (`api::reads::reader` picks). Only reads: a mirror cannot take writes, sessions or
//! watches, and refuses them as an invalid request.

use std::time::Duration;

use async_trait::async_trait;

use super::{Mirror, Tree};
use crate::kv::{
    Cas, KvPair, KvStore, Listing, SessionInfo, SessionSpec, StoreError, StoreResult, TxnOp,
    WatchTarget,
};

/// Reads of the mirror's trees, answered as the store would answer them at the mirror's
/// index.
#[derive(Clone)]
pub struct MirrorReader {
    mirror: Mirror,
    /// For an answer read through it, what its trees all held when it was made
    /// ([`Mirror::claimable_index`]): no listing's index claims more, so that a tree listed
    /// first is not claimed past by a later listing.
    claims_at_most: Option<u64>,
}

impl MirrorReader {
    pub fn new(mirror: Mirror) -> Self {
        MirrorReader {
            mirror,
            claims_at_most: None,
        }
    }

    /// A reader for an answer made of `trees`, made once they have caught up.
    pub fn answering(mirror: Mirror, trees: &[Tree]) -> Self {
        MirrorReader {
            claims_at_most: Some(mirror.claimable_index(trees)),
            mirror,
        }
    }

    fn listing(&self, prefix: &str) -> StoreResult<Listing> {
        let (mut index, entries) = self.mirror.listing(prefix).ok_or_else(|| {
            StoreError::Invalid(format!("the mirror follows no tree holding {prefix:?}"))
        })?;
        if let Some(cap) = self.claims_at_most {
            index = index.min(cap);
        }
        Ok(Listing {
            index: index.max(1),
            pairs: entries.iter().map(|entry| entry.to_pair()).collect(),
        })
    }
}

fn read_only<T>() -> StoreResult<T> {
    Err(StoreError::Invalid("the mirror is read-only".into()))
}

#[async_trait]
impl KvStore for MirrorReader {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        Ok(self.mirror.get(key).map(|entry| entry.to_pair()))
    }

    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        self.listing(prefix)
    }

    async fn current_index(&self, _probe: &str) -> StoreResult<Option<u64>> {
        Ok(Some(self.mirror.index()))
    }

    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        let listing = self.listing(prefix)?;
        let mut keys: Vec<String> = Vec::with_capacity(listing.pairs.len());
        for pair in listing.pairs {
            let key = match separator.and_then(|sep| {
                let at = pair.key[prefix.len()..].find(sep)?;
                Some(prefix.len() + at + sep.len_utf8())
            }) {
                Some(end) => pair.key[..end].to_owned(),
                None => pair.key,
            };
            if keys.last() != Some(&key) {
                keys.push(key);
            }
        }
        Ok((listing.index, keys))
    }

    async fn put(&self, _key: &str, _value: &[u8], _cas: Cas) -> StoreResult<()> {
        read_only()
    }

    async fn delete(&self, _key: &str, _cas: Cas) -> StoreResult<()> {
        read_only()
    }

    async fn delete_prefix(&self, _prefix: &str) -> StoreResult<()> {
        read_only()
    }

    fn key_prefix_len(&self) -> usize {
        0
    }

    async fn txn(&self, _ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        read_only()
    }

    async fn create_session(&self, _spec: &SessionSpec) -> StoreResult<String> {
        read_only()
    }

    async fn renew_session(&self, _id: &str) -> StoreResult<SessionInfo> {
        read_only()
    }

    async fn destroy_session(&self, _id: &str) -> StoreResult<()> {
        read_only()
    }

    async fn session_info(&self, _id: &str) -> StoreResult<Option<SessionInfo>> {
        read_only()
    }

    async fn acquire(&self, _key: &str, _value: &[u8], _session: &str) -> StoreResult<bool> {
        read_only()
    }

    async fn release(&self, _key: &str, _session: &str) -> StoreResult<bool> {
        read_only()
    }

    async fn watch(
        &self,
        _target: &WatchTarget,
        _index: u64,
        _wait: Duration,
    ) -> StoreResult<Listing> {
        read_only()
    }

    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }
}
