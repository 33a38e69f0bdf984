//! A store whose calls can be cut off, as for a server that lost the store or crashed: its
//! sessions are then left for the store to expire. Watches go through (unless cut on their
//! own), so tests can keep watching the same store. Session calls can instead be stalled,
//! left unanswered as by a store that takes them and never replies; and the cut or the
//! stall can be mended, as for a store that answers again after an outage. Lock
//! acquisitions alone can be stalled too, as by a store that answers all but those, and so
//! can transactions. Watches can be cut too, and a session creation answered late.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use p2_apiserver::kv::{
    Cas, KvPair, KvStore, Listing, SessionInfo, SessionSpec, StoreError, StoreResult, TxnOp,
    WatchTarget,
};
use tokio::time::Instant;

pub struct Severable {
    inner: Arc<dyn KvStore>,
    cut: AtomicBool,
    /// Session calls wait while it holds `true`.
    stalled: tokio::sync::watch::Sender<bool>,
    /// Lock acquisitions wait while it holds `true`.
    acquires_stalled: tokio::sync::watch::Sender<bool>,
    /// Lock acquisitions waiting now.
    acquiring: AtomicUsize,
    /// Transactions wait while it holds `true`.
    txns_stalled: tokio::sync::watch::Sender<bool>,
    /// Transactions waiting now.
    transacting: AtomicUsize,
    /// When the last successful create or renewal of each session was sent: its TTL runs
    /// from a moment after that.
    renewed: Mutex<HashMap<String, Instant>>,
    /// Watches fail while it holds `true`, those under way too.
    watches_cut: tokio::sync::watch::Sender<bool>,
    /// How long after the store applied it the next session creation is answered.
    next_creation_late: Mutex<Option<Duration>>,
}

impl Severable {
    pub fn new(inner: Arc<dyn KvStore>) -> Arc<Severable> {
        Arc::new(Severable {
            inner,
            cut: AtomicBool::new(false),
            stalled: tokio::sync::watch::Sender::new(false),
            acquires_stalled: tokio::sync::watch::Sender::new(false),
            acquiring: AtomicUsize::new(0),
            txns_stalled: tokio::sync::watch::Sender::new(false),
            transacting: AtomicUsize::new(0),
            renewed: Mutex::new(HashMap::new()),
            watches_cut: tokio::sync::watch::Sender::new(false),
            next_creation_late: Mutex::new(None),
        })
    }

    /// From now on every call but watches and pings fails as if the store were unreachable.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// From now on every session call waits, unanswered, until [`Severable::mend`].
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// From now on every lock acquisition waits, unanswered, until [`Severable::mend`].
    pub fn stall_acquires(&self) {
        self.acquires_stalled.send_replace(true);
    }

    /// Lock acquisitions go through again, and those stalled are answered; the other
    /// stalls stay.
    pub fn mend_acquires(&self) {
        self.acquires_stalled.send_replace(false);
    }

    /// From now on every transaction waits, unanswered, until [`Severable::mend`].
    pub fn stall_txns(&self) {
        self.txns_stalled.send_replace(true);
    }

    /// From now on every watch fails as if the store were unreachable, those under way
    /// too, until [`Severable::mend`]: with [`Severable::cut`], a server cut off from the
    /// store.
    pub fn cut_watches(&self) {
        self.watches_cut.send_replace(true);
    }

    /// The next session creation is answered `delay` after the store applied it, as by a
    /// store slow to reply: the session's TTL runs from before the answer.
    pub fn answer_next_creation_late(&self, delay: Duration) {
        *self.next_creation_late.lock().unwrap() = Some(delay);
    }

    /// How many transactions are waiting on a stall now.
    pub fn transacting(&self) -> usize {
        self.transacting.load(Ordering::SeqCst)
    }

    /// How many lock acquisitions are waiting on a stall now.
    pub fn acquiring(&self) -> usize {
        self.acquiring.load(Ordering::SeqCst)
    }

    /// From now on session calls, lock acquisitions and transactions go through again, and
    /// those stalled are answered.
    pub fn mend(&self) {
        self.cut.store(false, Ordering::SeqCst);
        self.watches_cut.send_replace(false);
        self.stalled.send_replace(false);
        self.acquires_stalled.send_replace(false);
        self.txns_stalled.send_replace(false);
    }

    /// When the last successful create or renewal of `session` was sent.
    pub fn last_renewal(&self, session: &str) -> Instant {
        self.renewed.lock().unwrap()[session]
    }

    async fn check(&self) -> StoreResult<()> {
        let mut stalled = self.stalled.subscribe();
        let _ = stalled.wait_for(|stalled| !stalled).await;
        self.cut_off()
    }

    /// Fails as an unreachable store would once [`Severable::cut`].
    fn cut_off(&self) -> StoreResult<()> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("cut off".into()));
        }
        Ok(())
    }

    fn renewed(&self, session: &str, sent: Instant) {
        self.renewed.lock().unwrap().insert(session.into(), sent);
    }
}

#[async_trait]
impl KvStore for Severable {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        self.cut_off()?;
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        self.cut_off()?;
        self.inner.list(prefix).await
    }
    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        self.cut_off()?;
        self.inner.keys(prefix, separator).await
    }
    async fn current_index(&self, probe: &str) -> StoreResult<Option<u64>> {
        self.cut_off()?;
        self.inner.current_index(probe).await
    }
    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        self.cut_off()?;
        self.inner.put(key, value, cas).await
    }
    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        self.cut_off()?;
        self.inner.delete(key, cas).await
    }
    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        self.cut_off()?;
        self.inner.delete_prefix(prefix).await
    }
    fn key_prefix_len(&self) -> usize {
        self.inner.key_prefix_len()
    }
    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        let mut stalled = self.txns_stalled.subscribe();
        self.transacting.fetch_add(1, Ordering::SeqCst);
        let _ = stalled.wait_for(|stalled| !stalled).await;
        self.transacting.fetch_sub(1, Ordering::SeqCst);
        self.cut_off()?;
        self.inner.txn(ops).await
    }
    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String> {
        self.check().await?;
        let sent = Instant::now();
        let id = self.inner.create_session(spec).await?;
        self.renewed(&id, sent);
        let late = self.next_creation_late.lock().unwrap().take();
        if let Some(late) = late {
            tokio::time::sleep(late).await;
        }
        Ok(id)
    }
    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo> {
        self.check().await?;
        let sent = Instant::now();
        let info = self.inner.renew_session(id).await?;
        self.renewed(id, sent);
        Ok(info)
    }
    async fn destroy_session(&self, id: &str) -> StoreResult<()> {
        self.check().await?;
        self.inner.destroy_session(id).await
    }
    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>> {
        self.cut_off()?;
        self.inner.session_info(id).await
    }
    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool> {
        let mut stalled = self.acquires_stalled.subscribe();
        self.acquiring.fetch_add(1, Ordering::SeqCst);
        let _ = stalled.wait_for(|stalled| !stalled).await;
        self.acquiring.fetch_sub(1, Ordering::SeqCst);
        self.cut_off()?;
        self.inner.acquire(key, value, session).await
    }
    async fn release(&self, key: &str, session: &str) -> StoreResult<bool> {
        self.cut_off()?;
        self.inner.release(key, session).await
    }
    async fn watch(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Listing> {
        let mut cut = self.watches_cut.subscribe();
        tokio::select! {
            watched = self.inner.watch(target, index, wait) => watched,
            _ = cut.wait_for(|cut| *cut) => Err(StoreError::Unavailable("cut off".into())),
        }
    }
    async fn ping(&self) -> StoreResult<()> {
        self.inner.ping().await
    }
}
