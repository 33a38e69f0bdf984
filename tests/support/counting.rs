//! A store that counts what it is asked, to check what reads cost the store, and whose
//! watches can be made to fail, as for a server that lost its watch of the store (and its
//! reads, as for a store lost right after a write).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use p2_apiserver::kv::{
    Cas, KvPair, KvStore, Listing, SessionInfo, SessionSpec, StoreError, StoreResult, TxnOp,
    WatchTarget,
};

pub struct Counting {
    inner: Arc<dyn KvStore>,
    /// Every call but watches.
    calls: AtomicUsize,
    /// The prefix of every listing (of pairs or keys), in order.
    listed: Mutex<Vec<String>>,
    /// The prefix of every listing of pairs, in order.
    listed_pairs: Mutex<Vec<String>>,
    /// The key of every single-key read, in order.
    read: Mutex<Vec<String>>,
    /// The prefix or key of every blocking watch (one given a wait), in order.
    watched: Mutex<Vec<String>>,
    /// Watches waiting for the store's answer now, and the most there have been at once.
    watching: AtomicUsize,
    most_watching: AtomicUsize,
    /// Watches of prefixes under this one fail (`""`: every watch) until it is cleared.
    failing: Mutex<Option<String>>,
    /// Watches of prefixes under this one keep their answers until it is cleared.
    delayed: Mutex<Option<String>>,
    /// Watches of prefixes under this one keep answers past this index until cleared.
    held_past: Mutex<Option<(String, u64)>>,
    /// The next listing of a prefix under this one first commits these ops.
    interjected: Mutex<Option<(String, Vec<TxnOp>)>>,
    /// The next read of a key under this one commits these ops once it has read.
    after_get: Mutex<Option<(String, Vec<TxnOp>)>>,
    /// Reads fail once the next transaction has committed (armed), and from then on
    /// (failing), until cleared.
    reads_fail_after_txn: AtomicBool,
    reads_failing: AtomicBool,
    /// Single-key reads wait, unanswered, while it holds `true`.
    key_reads_stalled: AtomicBool,
    /// Transactions acting on a key under this one lose their check-and-set, unapplied,
    /// until it is cleared.
    losing: Mutex<Option<String>>,
    /// The next transaction acting on a key under this one waits for its release.
    txn_hold: Mutex<Option<(String, Arc<TxnHold>)>>,
    /// Listings of prefixes under this one wait until the gate opens.
    listing_gate: Mutex<Option<(String, Arc<ListingGate>)>>,
    /// Transactions are applied, then answered `OutcomeUnknown`, while it holds `true`.
    txn_answers_lost: AtomicBool,
}

/// Listings held, unanswered, until it opens ([`Counting::hold_listings_of`]).
pub struct ListingGate {
    open: tokio::sync::watch::Sender<bool>,
    /// How many listings it holds now.
    held: tokio::sync::watch::Sender<usize>,
}

impl ListingGate {
    /// How many listings it holds now.
    pub fn held(&self) -> usize {
        *self.held.borrow()
    }

    /// Waits until it holds a listing.
    pub async fn reached(&self) {
        let mut held = self.held.subscribe();
        held.wait_for(|held| *held > 0).await.unwrap();
    }

    /// Answers the listings it holds, and lets the next ones through.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    async fn pass(&self) {
        self.held.send_modify(|held| *held += 1);
        let mut open = self.open.subscribe();
        open.wait_for(|open| *open).await.unwrap();
        self.held.send_modify(|held| *held -= 1);
    }
}

/// A transaction held before it is sent ([`Counting::hold_next_txn_on`]).
#[derive(Default)]
pub struct TxnHold {
    reached: tokio::sync::Notify,
    released: tokio::sync::Notify,
}

impl TxnHold {
    /// Waits until the held transaction is waiting.
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Sends the held transaction on.
    pub fn release(&self) {
        self.released.notify_one();
    }
}

impl Counting {
    pub fn new(inner: Arc<dyn KvStore>) -> Arc<Counting> {
        Arc::new(Counting {
            inner,
            calls: AtomicUsize::new(0),
            listed: Mutex::default(),
            listed_pairs: Mutex::default(),
            read: Mutex::default(),
            watched: Mutex::default(),
            watching: AtomicUsize::new(0),
            most_watching: AtomicUsize::new(0),
            failing: Mutex::default(),
            delayed: Mutex::default(),
            held_past: Mutex::default(),
            interjected: Mutex::default(),
            after_get: Mutex::default(),
            reads_fail_after_txn: AtomicBool::new(false),
            reads_failing: AtomicBool::new(false),
            key_reads_stalled: AtomicBool::new(false),
            losing: Mutex::default(),
            txn_hold: Mutex::default(),
            listing_gate: Mutex::default(),
            txn_answers_lost: AtomicBool::new(false),
        })
    }

    /// How many calls other than watches the store has had.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The keys read one by one so far, in order.
    pub fn read(&self) -> Vec<String> {
        self.read.lock().unwrap().clone()
    }

    /// The prefix or key of every blocking watch (one given a wait) so far, in order.
    pub fn watched(&self) -> Vec<String> {
        self.watched.lock().unwrap().clone()
    }

    /// The prefixes listed so far (pairs or keys), in order.
    pub fn listed(&self) -> Vec<String> {
        self.listed.lock().unwrap().clone()
    }

    /// The prefixes whose pairs were listed so far, in order.
    pub fn listed_pairs(&self) -> Vec<String> {
        self.listed_pairs.lock().unwrap().clone()
    }

    fn list_of(&self, prefix: &str) {
        self.count();
        self.listed.lock().unwrap().push(prefix.to_owned());
    }

    /// The most watches that have waited at once.
    pub fn most_watching(&self) -> usize {
        self.most_watching.load(Ordering::SeqCst)
    }

    /// Whether watches fail (`true`: at once, and those already waiting when they return) or
    /// go through (`false`) from now on.
    pub fn fail_watches(&self, fail: bool) {
        self.fail_watches_of(fail.then_some(""));
    }

    /// Makes the watches of prefixes under `prefix` fail, as [`Counting::fail_watches`] does
    /// every watch, until called again with another prefix, or `None`.
    pub fn fail_watches_of(&self, prefix: Option<&str>) {
        *self.failing.lock().unwrap() = prefix.map(str::to_owned);
    }

    fn fails(&self, target: &WatchTarget) -> bool {
        let failing = self.failing.lock().unwrap();
        let watched = match target {
            WatchTarget::Prefix(prefix) => prefix,
            WatchTarget::Key(key) => key,
        };
        failing
            .as_deref()
            .is_some_and(|failing| watched.starts_with(failing))
    }

    /// Makes the watches of prefixes under `prefix` keep their answers (as a watch slow to
    /// deliver) until called again with another prefix, or `None`.
    pub fn delay_watches_of(&self, prefix: Option<&str>) {
        *self.delayed.lock().unwrap() = prefix.map(str::to_owned);
    }

    /// Makes the watches of prefixes under `prefix` keep any answer past `index` (as a watch
    /// slow to deliver its next change) until called again.
    pub fn hold_watches_past(&self, held: Option<(&str, u64)>) {
        *self.held_past.lock().unwrap() = held.map(|(p, i)| (p.to_owned(), i));
    }

    /// Makes the next listing of a prefix under `prefix` first commit `ops`, as another
    /// writer's transaction landing between the listings a read makes.
    pub fn before_next_listing_of(&self, prefix: &str, ops: Vec<TxnOp>) {
        *self.interjected.lock().unwrap() = Some((prefix.to_owned(), ops));
    }

    /// Makes the next single-key read of a key under `prefix` commit `ops` once it has read,
    /// as another writer's transaction landing between a read and the write made from it.
    pub fn after_next_get_of(&self, prefix: &str, ops: Vec<TxnOp>) {
        *self.after_get.lock().unwrap() = Some((prefix.to_owned(), ops));
    }

    /// Makes every transaction acting on a key under `prefix` lose its check-and-set
    /// (a `Conflict`, nothing applied), as to writers elsewhere that always land first,
    /// until called again with another prefix, or `None`.
    pub fn lose_txns_on(&self, prefix: Option<&str>) {
        *self.losing.lock().unwrap() = prefix.map(str::to_owned);
    }

    /// Makes every transaction be applied, then answered `OutcomeUnknown` (as one whose
    /// answer was lost), until called again with `false`.
    pub fn lose_txn_answers(&self, lose: bool) {
        self.txn_answers_lost.store(lose, Ordering::SeqCst);
    }

    /// Makes the next transaction acting on a key under `prefix` wait, unsent, until the
    /// returned hold releases it, as a write whose checks were read long before it lands.
    pub fn hold_next_txn_on(&self, prefix: &str) -> Arc<TxnHold> {
        let hold = Arc::new(TxnHold::default());
        *self.txn_hold.lock().unwrap() = Some((prefix.to_owned(), hold.clone()));
        hold
    }

    /// Makes every listing of a prefix under `prefix` wait, unanswered, until the returned
    /// gate opens, as a store slow to answer them.
    pub fn hold_listings_of(&self, prefix: &str) -> Arc<ListingGate> {
        let gate = Arc::new(ListingGate {
            open: tokio::sync::watch::channel(false).0,
            held: tokio::sync::watch::channel(0).0,
        });
        *self.listing_gate.lock().unwrap() = Some((prefix.to_owned(), gate.clone()));
        gate
    }

    /// Makes every read (of a key, a prefix or its index) fail once the next transaction
    /// has committed, as a store lost right after it applied a write (`true`); or lets reads
    /// through again (`false`).
    pub fn fail_reads_after_next_txn(&self, fail: bool) {
        self.reads_fail_after_txn.store(fail, Ordering::SeqCst);
        self.reads_failing.store(false, Ordering::SeqCst);
    }

    /// Makes single-key reads and reads of the store's index wait, unanswered, as a store
    /// that takes them and never replies (`true`); or answers them again, those waiting
    /// included (`false`).
    pub fn stall_key_reads(&self, stall: bool) {
        self.key_reads_stalled.store(stall, Ordering::SeqCst);
    }

    fn read_fails(&self) -> StoreResult<()> {
        if self.reads_failing.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the store was lost".into()));
        }
        Ok(())
    }

    /// The ops armed in `slot` for a read of `key` (a key or a listed prefix), taken.
    fn armed_for(slot: &Mutex<Option<(String, Vec<TxnOp>)>>, key: &str) -> Option<Vec<TxnOp>> {
        let mut slot = slot.lock().unwrap();
        match &*slot {
            Some((armed, _)) if key.starts_with(armed.as_str()) => slot.take().map(|(_, ops)| ops),
            _ => None,
        }
    }

    fn holds(&self, target: &WatchTarget, answered: u64) -> bool {
        let held = self.held_past.lock().unwrap();
        match (&*held, target) {
            (Some((held, past)), WatchTarget::Prefix(prefix)) => {
                prefix.starts_with(held.as_str()) && answered > *past
            }
            _ => false,
        }
    }

    fn delays(&self, target: &WatchTarget) -> bool {
        let delayed = self.delayed.lock().unwrap();
        match (&*delayed, target) {
            (Some(delayed), WatchTarget::Prefix(prefix)) => prefix.starts_with(delayed.as_str()),
            _ => false,
        }
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

/// Counts a watch as waiting while it lives.
struct Watching<'a>(&'a Counting);

impl<'a> Watching<'a> {
    fn start(counting: &'a Counting) -> Self {
        let now = counting.watching.fetch_add(1, Ordering::SeqCst) + 1;
        counting.most_watching.fetch_max(now, Ordering::SeqCst);
        Watching(counting)
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.0.watching.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl KvStore for Counting {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        self.count();
        self.read_fails()?;
        while self.key_reads_stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.read.lock().unwrap().push(key.to_owned());
        let read = self.inner.get(key).await;
        if let Some(ops) = Self::armed_for(&self.after_get, key) {
            self.inner.txn(&ops).await?;
        }
        read
    }
    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        self.list_of(prefix);
        self.listed_pairs.lock().unwrap().push(prefix.to_owned());
        self.read_fails()?;
        if let Some(ops) = Self::armed_for(&self.interjected, prefix) {
            self.inner.txn(&ops).await?;
        }
        let gate = self.listing_gate.lock().unwrap().clone();
        if let Some((_, gate)) = gate.filter(|(held, _)| prefix.starts_with(held.as_str())) {
            gate.pass().await;
        }
        self.inner.list(prefix).await
    }
    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        self.list_of(prefix);
        self.read_fails()?;
        self.inner.keys(prefix, separator).await
    }
    async fn prefix_index(&self, prefix: &str) -> StoreResult<u64> {
        self.count();
        self.read_fails()?;
        self.inner.prefix_index(prefix).await
    }
    async fn prefix_index_through(&self, prefix: &str, through: u64) -> StoreResult<u64> {
        self.count();
        self.read_fails()?;
        self.inner.prefix_index_through(prefix, through).await
    }
    async fn current_index(&self, probe: &str) -> StoreResult<Option<u64>> {
        self.count();
        self.read_fails()?;
        while self.key_reads_stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.inner.current_index(probe).await
    }
    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        self.count();
        self.inner.put(key, value, cas).await
    }
    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        self.count();
        self.inner.delete(key, cas).await
    }
    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        self.count();
        self.inner.delete_prefix(prefix).await
    }
    fn key_prefix_len(&self) -> usize {
        self.inner.key_prefix_len()
    }
    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        self.count();
        let losing = self.losing.lock().unwrap().clone();
        if let Some(losing) =
            losing.filter(|losing| ops.iter().any(|op| op.key().starts_with(losing.as_str())))
        {
            return Err(StoreError::conflict(format!(
                "another write to {losing} landed first"
            )));
        }
        let held = {
            let mut slot = self.txn_hold.lock().unwrap();
            match &*slot {
                Some((prefix, _)) if ops.iter().any(|op| op.key().starts_with(prefix.as_str())) => {
                    slot.take().map(|(_, hold)| hold)
                }
                _ => None,
            }
        };
        if let Some(hold) = held {
            hold.reached.notify_one();
            hold.released.notified().await;
        }
        let results = self.inner.txn(ops).await?;
        if self.reads_fail_after_txn.swap(false, Ordering::SeqCst) {
            self.reads_failing.store(true, Ordering::SeqCst);
        }
        if self.txn_answers_lost.load(Ordering::SeqCst) {
            return Err(StoreError::OutcomeUnknown("the answer was lost".into()));
        }
        Ok(results)
    }
    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String> {
        self.count();
        self.inner.create_session(spec).await
    }
    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo> {
        self.count();
        self.inner.renew_session(id).await
    }
    async fn destroy_session(&self, id: &str) -> StoreResult<()> {
        self.count();
        self.inner.destroy_session(id).await
    }
    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>> {
        self.count();
        self.inner.session_info(id).await
    }
    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool> {
        self.count();
        self.inner.acquire(key, value, session).await
    }
    async fn release(&self, key: &str, session: &str) -> StoreResult<bool> {
        self.count();
        self.inner.release(key, session).await
    }
    async fn watch(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Listing> {
        if self.fails(target) {
            return Err(StoreError::Unavailable("the watch was lost".into()));
        }
        if !wait.is_zero() {
            let (WatchTarget::Prefix(watched) | WatchTarget::Key(watched)) = target;
            self.watched.lock().unwrap().push(watched.clone());
        }
        let answer = {
            let _watching = Watching::start(self);
            self.inner.watch(target, index, wait).await
        };
        let answered = answer.as_ref().map_or(0, |listing| listing.index);
        while self.delays(target) || self.holds(target, answered) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if self.fails(target) {
            return Err(StoreError::Unavailable("the watch was lost".into()));
        }
        answer
    }
    async fn ping(&self) -> StoreResult<()> {
        self.count();
        self.inner.ping().await
    }
}
