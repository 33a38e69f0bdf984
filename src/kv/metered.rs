//! A store that records every operation's backend, name, outcome and duration
//! ([`crate::metrics::STORE_OPERATION_DURATION`]), wrapped around the backend where it is
//! opened so that every caller's operations are counted.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{
    Cas, HeldWrites, KvPair, KvStore, Listing, PrefixUpdate, SessionInfo, SessionSpec, StoreError,
    StoreResult, TxnOp, WatchTarget,
};

/// `inner`, measured under the backend name `backend`.
pub struct Metered {
    inner: Arc<dyn KvStore>,
    backend: &'static str,
}

impl Metered {
    /// Wraps `inner`, whose operations are recorded under `backend` (`sqlite`, `consul`).
    pub fn wrap(inner: Arc<dyn KvStore>, backend: &'static str) -> Arc<dyn KvStore> {
        Arc::new(Metered { inner, backend })
    }

    async fn measure<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let mut timer = Timer {
            backend: self.backend,
            operation,
            started: Instant::now(),
            outcome: ABANDONED,
        };
        let result = call.await;
        timer.outcome = match &result {
            Ok(_) => "ok",
            Err(e) => error_kind(e),
        };
        result
    }
}

/// The outcome of an operation its caller stopped waiting for before the store answered (a
/// request cut by its deadline, a farm pass given up as its term ends, a watch no longer
/// needed). Under a store that does not answer, that is what becomes of every operation the
/// API sends it, since the request deadline comes before the Consul client's own timeout:
/// without it the histogram would show no sign of the hang.
const ABANDONED: &str = "abandoned";

/// Records one operation when it is dropped: once it has an outcome, or as [`ABANDONED`]
/// when its caller gave up on it first.
struct Timer {
    backend: &'static str,
    operation: &'static str,
    started: Instant,
    outcome: &'static str,
}

impl Drop for Timer {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        crate::metrics::store_operation(self.backend, self.operation, self.outcome, took);
    }
}

/// The outcome label of a failed operation: its error kind.
fn error_kind(error: &StoreError) -> &'static str {
    match error {
        StoreError::NotFound(_) => "not_found",
        StoreError::Conflict { .. } => "conflict",
        StoreError::Unavailable(_) => "unavailable",
        StoreError::OutcomeUnknown(_) => "outcome_unknown",
        StoreError::Invalid(_) => "invalid",
        StoreError::Forbidden(_) => "forbidden",
    }
}

#[async_trait]
impl KvStore for Metered {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        self.measure("get", self.inner.get(key)).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        self.measure("list", self.inner.list(prefix)).await
    }

    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        self.measure("keys", self.inner.keys(prefix, separator))
            .await
    }

    async fn prefix_index(&self, prefix: &str) -> StoreResult<u64> {
        self.measure("prefix_index", self.inner.prefix_index(prefix))
            .await
    }

    async fn prefix_index_through(&self, prefix: &str, through: u64) -> StoreResult<u64> {
        let index = self.inner.prefix_index_through(prefix, through);
        self.measure("prefix_index_through", index).await
    }

    async fn current_index(&self, probe: &str) -> StoreResult<Option<u64>> {
        self.measure("current_index", self.inner.current_index(probe))
            .await
    }

    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        self.measure("put", self.inner.put(key, value, cas)).await
    }

    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        self.measure("delete", self.inner.delete(key, cas)).await
    }

    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        self.measure("delete_prefix", self.inner.delete_prefix(prefix))
            .await
    }

    fn key_prefix_len(&self) -> usize {
        self.inner.key_prefix_len()
    }

    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        self.measure("txn", self.inner.txn(ops)).await
    }

    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String> {
        self.measure("create_session", self.inner.create_session(spec))
            .await
    }

    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo> {
        self.measure("renew_session", self.inner.renew_session(id))
            .await
    }

    async fn destroy_session(&self, id: &str) -> StoreResult<()> {
        self.measure("destroy_session", self.inner.destroy_session(id))
            .await
    }

    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>> {
        self.measure("session_info", self.inner.session_info(id))
            .await
    }

    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool> {
        self.measure("acquire", self.inner.acquire(key, value, session))
            .await
    }

    async fn release(&self, key: &str, session: &str) -> StoreResult<bool> {
        self.measure("release", self.inner.release(key, session))
            .await
    }

    async fn watch(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Listing> {
        self.measure("watch", self.inner.watch(target, index, wait))
            .await
    }

    async fn watch_changes(
        &self,
        prefix: &str,
        index: u64,
        wait: Duration,
        held: HeldWrites<'_>,
    ) -> StoreResult<PrefixUpdate> {
        self.measure("watch", self.inner.watch_changes(prefix, index, wait, held))
            .await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.measure("ping", self.inner.ping()).await
    }

    async fn shut_down(&self) {
        self.inner.shut_down().await
    }
}
