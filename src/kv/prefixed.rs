//! A namespace inside a shared store: every key lives under one fixed prefix.
//!
//! The server's key layout is P2's and fixed, so two servers (or two test cases) on one
//! Consul would read and write each other's keys. Wrapping the store in [`Prefixed`] gives
//! each of them a namespace of its own: keys are prefixed on the way in and stripped on the
//! way out, and error messages name keys as the caller knows them. Sessions are not keys and
//! pass through unchanged. The API's own tests use it to share one Consul, and it serves
//! equally to run several environments in one Consul.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{
    validate_key, validate_prefix, validate_txn, Cas, Changes, HeldWrites, KvPair, KvStore,
    Listing, PrefixUpdate, SessionInfo, SessionSpec, StoreError, StoreResult, TxnFailure, TxnOp,
    WatchTarget,
};

/// A store whose keys all live under `prefix` of `inner`.
pub struct Prefixed {
    inner: Arc<dyn KvStore>,
    prefix: String,
}

impl Prefixed {
    /// Wraps `inner`. The prefix must be a valid key prefix ending in `/`, so that no other
    /// namespace's keys can start with it.
    pub fn new(inner: Arc<dyn KvStore>, prefix: impl Into<String>) -> StoreResult<Self> {
        let prefix = prefix.into();
        if prefix.is_empty() || !prefix.ends_with('/') {
            return Err(StoreError::Invalid(format!(
                "a namespace prefix must end in '/', got {prefix:?}"
            )));
        }
        validate_prefix(&prefix)?;
        Ok(Prefixed { inner, prefix })
    }

    /// The namespace, for whoever has to clear it through the inner store.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The inner key of a caller's key, refusing bad keys before they are joined.
    fn key(&self, key: &str) -> StoreResult<String> {
        validate_key(key)?;
        Ok(format!("{}{key}", self.prefix))
    }

    /// The inner prefix of a caller's prefix; the empty prefix is the whole namespace.
    fn under(&self, prefix: &str) -> StoreResult<String> {
        validate_prefix(prefix)?;
        Ok(format!("{}{prefix}", self.prefix))
    }

    /// The caller's key of an inner key; a key outside the namespace is the inner store
    /// breaking its contract, so it is an error rather than a leak.
    fn strip(&self, key: String) -> StoreResult<String> {
        match key.strip_prefix(&self.prefix) {
            Some(own) => Ok(own.to_string()),
            None => Err(StoreError::Unavailable(format!(
                "the store answered key {key:?} outside the namespace {:?}",
                self.prefix
            ))),
        }
    }

    fn strip_pair(&self, pair: KvPair) -> StoreResult<KvPair> {
        Ok(KvPair {
            key: self.strip(pair.key)?,
            ..pair
        })
    }

    fn strip_listing(&self, listing: Listing) -> StoreResult<Listing> {
        let pairs = listing
            .pairs
            .into_iter()
            .map(|pair| self.strip_pair(pair))
            .collect::<StoreResult<_>>()?;
        Ok(Listing {
            index: listing.index,
            pairs,
        })
    }

    /// The error with the namespace taken out of its text, since the inner store names the
    /// keys it was given. The kind and a conflict's op indexes are kept.
    fn strip_error(&self, error: StoreError) -> StoreError {
        let clean = |text: String| text.replace(&self.prefix, "");
        match error {
            StoreError::NotFound(m) => StoreError::NotFound(clean(m)),
            StoreError::Unavailable(m) => StoreError::Unavailable(clean(m)),
            StoreError::OutcomeUnknown(m) => StoreError::OutcomeUnknown(clean(m)),
            StoreError::Invalid(m) => StoreError::Invalid(clean(m)),
            StoreError::Forbidden(m) => StoreError::Forbidden(clean(m)),
            StoreError::Conflict { message, failures } => StoreError::Conflict {
                message: clean(message),
                failures: failures
                    .into_iter()
                    .map(|f| TxnFailure {
                        op_index: f.op_index,
                        what: clean(f.what),
                    })
                    .collect(),
            },
        }
    }

    /// The op with its key moved into the namespace.
    fn op(&self, op: &TxnOp) -> StoreResult<TxnOp> {
        let key = self.key(op.key())?;
        let mut op = op.clone();
        match &mut op {
            TxnOp::Set { key: k, .. }
            | TxnOp::Cas { key: k, .. }
            | TxnOp::Get { key: k }
            | TxnOp::Delete { key: k }
            | TxnOp::DeleteCas { key: k, .. }
            | TxnOp::CheckIndex { key: k, .. }
            | TxnOp::CheckNotExists { key: k }
            | TxnOp::Lock { key: k, .. }
            | TxnOp::Unlock { key: k, .. }
            | TxnOp::CheckSession { key: k, .. } => *k = key,
        }
        Ok(op)
    }
}

#[async_trait]
impl KvStore for Prefixed {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        let pair = self
            .inner
            .get(&self.key(key)?)
            .await
            .map_err(|e| self.strip_error(e))?;
        pair.map(|pair| self.strip_pair(pair)).transpose()
    }

    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        let listing = self
            .inner
            .list(&self.under(prefix)?)
            .await
            .map_err(|e| self.strip_error(e))?;
        self.strip_listing(listing)
    }

    /// The separator cuts keys after the caller's prefix, which lies inside the namespace,
    /// so the cut keys all keep the namespace and strip like whole keys.
    async fn prefix_index(&self, prefix: &str) -> StoreResult<u64> {
        self.inner
            .prefix_index(&self.under(prefix)?)
            .await
            .map_err(|e| self.strip_error(e))
    }

    async fn prefix_index_through(&self, prefix: &str, through: u64) -> StoreResult<u64> {
        self.inner
            .prefix_index_through(&self.under(prefix)?, through)
            .await
            .map_err(|e| self.strip_error(e))
    }

    async fn current_index(&self, probe: &str) -> StoreResult<Option<u64>> {
        self.inner
            .current_index(&self.key(probe)?)
            .await
            .map_err(|e| self.strip_error(e))
    }

    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        let (index, keys) = self
            .inner
            .keys(&self.under(prefix)?, separator)
            .await
            .map_err(|e| self.strip_error(e))?;
        let keys = keys
            .into_iter()
            .map(|key| self.strip(key))
            .collect::<StoreResult<_>>()?;
        Ok((index, keys))
    }

    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        let key = self.key(key)?;
        self.inner
            .put(&key, value, cas)
            .await
            .map_err(|e| self.strip_error(e))
    }

    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        let key = self.key(key)?;
        self.inner
            .delete(&key, cas)
            .await
            .map_err(|e| self.strip_error(e))
    }

    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        let prefix = self.under(prefix)?;
        self.inner
            .delete_prefix(&prefix)
            .await
            .map_err(|e| self.strip_error(e))
    }

    fn key_prefix_len(&self) -> usize {
        self.prefix.len() + self.inner.key_prefix_len()
    }

    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        // Checked on the caller's keys, so a refusal names them and the op count.
        validate_txn(ops)?;
        let ops = ops
            .iter()
            .map(|op| self.op(op))
            .collect::<StoreResult<Vec<_>>>()?;
        let results = self
            .inner
            .txn(&ops)
            .await
            .map_err(|e| self.strip_error(e))?;
        results
            .into_iter()
            .map(|result| result.map(|pair| self.strip_pair(pair)).transpose())
            .collect()
    }

    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String> {
        self.inner.create_session(spec).await
    }

    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo> {
        self.inner.renew_session(id).await
    }

    async fn destroy_session(&self, id: &str) -> StoreResult<()> {
        self.inner.destroy_session(id).await
    }

    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>> {
        self.inner.session_info(id).await
    }

    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool> {
        let key = self.key(key)?;
        self.inner
            .acquire(&key, value, session)
            .await
            .map_err(|e| self.strip_error(e))
    }

    async fn release(&self, key: &str, session: &str) -> StoreResult<bool> {
        let key = self.key(key)?;
        self.inner
            .release(&key, session)
            .await
            .map_err(|e| self.strip_error(e))
    }

    async fn watch(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Listing> {
        let target = match target {
            WatchTarget::Key(key) => WatchTarget::Key(self.key(key)?),
            WatchTarget::Prefix(prefix) => WatchTarget::Prefix(self.under(prefix)?),
        };
        let listing = self
            .inner
            .watch(&target, index, wait)
            .await
            .map_err(|e| self.strip_error(e))?;
        self.strip_listing(listing)
    }

    async fn watch_changes(
        &self,
        prefix: &str,
        index: u64,
        wait: Duration,
        held: HeldWrites<'_>,
    ) -> StoreResult<PrefixUpdate> {
        let update = self
            .inner
            .watch_changes(&self.under(prefix)?, index, wait, held)
            .await
            .map_err(|e| self.strip_error(e))?;
        Ok(match update {
            PrefixUpdate::Whole(listing) => PrefixUpdate::Whole(self.strip_listing(listing)?),
            PrefixUpdate::Since(changes) => PrefixUpdate::Since(Changes {
                index: changes.index,
                changed: changes
                    .changed
                    .into_iter()
                    .map(|pair| self.strip_pair(pair))
                    .collect::<StoreResult<_>>()?,
                deleted: changes
                    .deleted
                    .into_iter()
                    .map(|(key, index)| Ok((self.strip(key)?, index)))
                    .collect::<StoreResult<_>>()?,
            }),
        })
    }

    async fn ping(&self) -> StoreResult<()> {
        self.inner.ping().await
    }

    async fn shut_down(&self) {
        self.inner.shut_down().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::sqlite::SqliteStore;
    use crate::kv::SessionBehavior;

    const NS: &str = "p2-apiserver-test/ns/";

    /// A namespace and the bare store under it, to look behind the namespace's back.
    struct Fixture {
        store: Prefixed,
        inner: Arc<dyn KvStore>,
        _dir: tempfile::TempDir,
    }

    async fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db").display().to_string();
        let inner: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
        Fixture {
            store: Prefixed::new(inner.clone(), NS).unwrap(),
            inner,
            _dir: dir,
        }
    }

    fn keys_of(listing: &Listing) -> Vec<&str> {
        listing.pairs.iter().map(|p| p.key.as_str()).collect()
    }

    #[tokio::test]
    async fn refuses_a_prefix_that_could_overlap_another() {
        let f = fixture().await;
        for bad in ["", "ns", "ns//", "../"] {
            assert!(
                Prefixed::new(f.inner.clone(), bad).is_err(),
                "{bad:?} accepted"
            );
        }
    }

    #[tokio::test]
    async fn keys_round_trip_through_the_namespace() {
        let f = fixture().await;
        f.store.put("rcs/a", b"one", Cas::Index(0)).await.unwrap();
        f.inner.put("rcs/outside", b"x", Cas::Any).await.unwrap();

        let pair = f.store.get("rcs/a").await.unwrap().unwrap();
        assert_eq!((pair.key.as_str(), &pair.value[..]), ("rcs/a", &b"one"[..]));
        let behind = f.inner.get(&format!("{NS}rcs/a")).await.unwrap().unwrap();
        assert_eq!(behind.modify_index, pair.modify_index);
        assert_eq!(f.store.get("rcs/outside").await.unwrap(), None);

        f.store
            .put("rcs/a", b"two", Cas::Index(pair.modify_index))
            .await
            .unwrap();
        let stale = f
            .store
            .put("rcs/a", b"three", Cas::Index(pair.modify_index));
        match stale.await {
            Err(StoreError::Conflict { message, .. }) => {
                assert!(!message.contains(NS), "{message}")
            }
            other => panic!("expected a conflict, got {other:?}"),
        }

        assert_eq!(keys_of(&f.store.list("").await.unwrap()), ["rcs/a"]);
        f.store.delete("rcs/a", Cas::Any).await.unwrap();
        assert_eq!(f.store.get("rcs/a").await.unwrap(), None);
        assert!(f.inner.get("rcs/outside").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn keys_with_a_separator_cut_inside_the_namespace() {
        let f = fixture().await;
        for key in [
            "labels/pod/n1/a",
            "labels/pod/n2/b",
            "labels/node/n1",
            "top",
        ] {
            f.store.put(key, b"", Cas::Any).await.unwrap();
        }
        let (_, all) = f.store.keys("", None).await.unwrap();
        assert_eq!(
            all,
            [
                "labels/node/n1",
                "labels/pod/n1/a",
                "labels/pod/n2/b",
                "top"
            ]
        );
        let (_, top) = f.store.keys("", Some('/')).await.unwrap();
        assert_eq!(top, ["labels/", "top"]);
        let (_, types) = f.store.keys("labels/", Some('/')).await.unwrap();
        assert_eq!(types, ["labels/node/", "labels/pod/"]);
        let (_, nodes) = f.store.keys("labels/pod/", Some('/')).await.unwrap();
        assert_eq!(nodes, ["labels/pod/n1/", "labels/pod/n2/"]);
    }

    #[tokio::test]
    async fn delete_prefix_stays_inside_the_namespace() {
        let f = fixture().await;
        f.store.put("rcs/a", b"", Cas::Any).await.unwrap();
        f.store.put("rolls/a", b"", Cas::Any).await.unwrap();
        f.inner.put("rcs/b", b"", Cas::Any).await.unwrap();
        f.store.delete_prefix("rcs/").await.unwrap();
        assert_eq!(keys_of(&f.store.list("").await.unwrap()), ["rolls/a"]);
        f.store.delete_prefix("").await.unwrap();
        assert_eq!(keys_of(&f.inner.list("").await.unwrap()), ["rcs/b"]);
    }

    #[tokio::test]
    async fn txn_results_name_the_callers_keys() {
        let f = fixture().await;
        f.store.put("b", b"old", Cas::Any).await.unwrap();
        let results = f
            .store
            .txn(&[
                TxnOp::Set {
                    key: "a".into(),
                    value: b"new".to_vec(),
                },
                TxnOp::Delete { key: "b".into() },
                TxnOp::Get { key: "a".into() },
            ])
            .await
            .unwrap();
        let keys: Vec<Option<&str>> = results
            .iter()
            .map(|r| r.as_ref().map(|p| p.key.as_str()))
            .collect();
        assert_eq!(keys, [Some("a"), None, Some("a")]);
        assert_eq!(&*results[2].as_ref().unwrap().value, b"new");
        assert!(f.inner.get(&format!("{NS}a")).await.unwrap().is_some());
        assert!(f.inner.get(&format!("{NS}b")).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn txn_failures_keep_their_op_indexes() {
        let f = fixture().await;
        f.store.put("taken", b"", Cas::Any).await.unwrap();
        let ops = [
            TxnOp::Set {
                key: "fine".into(),
                value: b"x".to_vec(),
            },
            TxnOp::CheckNotExists {
                key: "taken".into(),
            },
        ];
        match f.store.txn(&ops).await {
            Err(StoreError::Conflict { failures, .. }) => {
                assert_eq!(failures.len(), 1, "{failures:?}");
                assert_eq!(failures[0].op_index, 1);
                assert!(!failures[0].what.contains(NS), "{failures:?}");
            }
            other => panic!("expected a rollback, got {other:?}"),
        }
        assert_eq!(f.store.get("fine").await.unwrap(), None);
    }

    #[tokio::test]
    async fn bad_keys_are_refused_as_the_caller_wrote_them() {
        let f = fixture().await;
        match f.store.put("a//b", b"", Cas::Any).await {
            Err(StoreError::Invalid(message)) => {
                assert!(message.contains("\"a//b\""), "{message}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(matches!(f.store.get("").await, Err(StoreError::Invalid(_))));
        let bad = [TxnOp::Get { key: "../x".into() }];
        assert!(matches!(
            f.store.txn(&bad).await,
            Err(StoreError::Invalid(_))
        ));
        assert_eq!(f.inner.list("").await.unwrap().pairs, []);
    }

    #[tokio::test]
    async fn watch_wakes_on_the_namespaced_key() {
        let f = fixture().await;
        let target = WatchTarget::Prefix("rcs/".into());
        let start = f.store.watch(&target, 0, Duration::ZERO).await.unwrap();
        let store = Arc::new(f.store);
        let watcher = {
            let store = store.clone();
            let target = target.clone();
            tokio::spawn(async move {
                store
                    .watch(&target, start.index, Duration::from_secs(5))
                    .await
            })
        };
        f.inner.put("rcs/a", b"outside", Cas::Any).await.unwrap();
        store.put("rcs/a", b"inside", Cas::Any).await.unwrap();
        let woken = watcher.await.unwrap().unwrap();
        assert!(woken.index > start.index);
        assert_eq!(keys_of(&woken), ["rcs/a"]);
        assert_eq!(&*woken.pairs[0].value, b"inside");

        let key = WatchTarget::Key("rcs/a".into());
        let one = store.watch(&key, 0, Duration::ZERO).await.unwrap();
        assert_eq!(keys_of(&one), ["rcs/a"]);
    }

    #[tokio::test]
    async fn watched_changes_name_the_callers_keys() {
        let f = fixture().await;
        f.store.put("rcs/a", b"a", Cas::Any).await.unwrap();
        f.store.put("rcs/b", b"b", Cas::Any).await.unwrap();
        let start = f.store.list("rcs/").await.unwrap();
        f.store.put("rcs/a", b"a2", Cas::Any).await.unwrap();
        f.store.delete("rcs/b", Cas::Any).await.unwrap();
        let update = f
            .store
            .watch_changes("rcs/", start.index, Duration::ZERO, &Vec::new)
            .await
            .unwrap();
        let PrefixUpdate::Since(changes) = update else {
            panic!("SQLite answers with the changes: {update:?}");
        };
        assert_eq!(
            keys_of(&Listing {
                index: 0,
                pairs: changes.changed
            }),
            ["rcs/a"]
        );
        let deleted: Vec<&str> = changes.deleted.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(deleted, ["rcs/b"]);
    }

    #[tokio::test]
    async fn locks_and_sessions_work_through_the_namespace() {
        let f = fixture().await;
        let spec = SessionSpec {
            name: "test".into(),
            ttl: Duration::from_secs(10),
            lock_delay: Duration::ZERO,
            behavior: SessionBehavior::Release,
        };
        let session = f.store.create_session(&spec).await.unwrap();
        assert!(f.store.session_info(&session).await.unwrap().is_some());
        assert!(f.store.acquire("lock", b"me", &session).await.unwrap());
        let held = f.inner.get(&format!("{NS}lock")).await.unwrap().unwrap();
        assert_eq!(held.session(), Some(session.as_str()));
        let ops = [TxnOp::CheckSession {
            key: "lock".into(),
            session: session.clone(),
        }];
        f.store.txn(&ops).await.unwrap();
        assert!(f.store.release("lock", &session).await.unwrap());
        assert_eq!(f.store.get("lock").await.unwrap().unwrap().session(), None);
        f.store.destroy_session(&session).await.unwrap();
        assert_eq!(f.store.session_info(&session).await.unwrap(), None);
    }
}
