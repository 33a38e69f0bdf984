//! A store whose backing store can be swapped for another, as for a store restarted empty
//! or restored (its index going backwards), whose calls can be cut off, and whose listings
//! and watches of chosen prefixes can be held back; and an app over one.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use p2_apiserver::kv::{
    Cas, HeldWrites, KvPair, KvStore, Listing, PrefixUpdate, SessionInfo, SessionSpec, StoreError,
    StoreResult, TxnOp, WatchTarget,
};
use p2_apiserver::layout;
use p2_apiserver::state::MirrorConfig;
use tokio::sync::Semaphore;

use crate::support::api::TestApp;

/// A store whose calls can fail as if it were unreachable, and whose backing store can be
/// swapped for another, as for a store restarted empty. Its watches answer whole listings,
/// unless `changes` is set: they then answer what the backing store does, and note the keys
/// of the pairs it answered as changed.
pub struct Switchable {
    pub inner: RwLock<Arc<dyn KvStore>>,
    pub cut: AtomicBool,
    pub changes: AtomicBool,
    pub changed: Mutex<Vec<String>>,
    /// Listings of prefixes under this one wait until it is cleared.
    pub slow_lists: Mutex<Option<String>>,
    /// Watches of prefixes under this one keep their answers until it is cleared.
    pub held_watches: Mutex<Option<String>>,
    /// Key listings of prefixes under this one wait until it is cleared.
    pub slow_keys: Mutex<Option<String>>,
    /// Listings and watches of prefixes under this one panic until it is cleared, as a bug
    /// in reading or decoding what they bring would.
    pub panicking: Mutex<Option<String>>,
    /// Watches of an index past the backing store's wait their whole wait, as Consul's
    /// blocking queries do after it was restored from a snapshot.
    pub waits_past_its_index: AtomicBool,
    /// Listings and watches of prefixes under this one answer at the index of their newest
    /// pair, as Consul lists a prefix once it has reaped the tombstones of deletes newer
    /// than every key left there.
    pub reaped: Mutex<Option<String>>,
    /// The prefixes listed whole, in order.
    pub listed: Mutex<Vec<String>>,
    /// Listings of prefixes under this one keep their answers until it is cleared.
    pub held_lists: Mutex<Option<String>>,
    /// Whether a listing's answer is being kept (see `held_lists`).
    pub holding_a_list: AtomicBool,
    /// Listings of prefixes under this one, once answered, hold the thread polling them
    /// until it is cleared, as taking in a large listing holds it: the reader then has the
    /// answer in the very poll that got it, whatever happened meanwhile.
    pub stalled_lists: Mutex<Option<String>>,
    /// Whether a listing's answer is being stalled (see `stalled_lists`).
    pub stalling_a_list: AtomicBool,
    /// While set, each read of the store's index (its probe, `KvStore::current_index`)
    /// waits for a permit of `probe_permits`, as a slow one would.
    pub gated_probes: AtomicBool,
    /// Permits for gated reads of the store's index, one each; none at first.
    pub probe_permits: Semaphore,
    /// How many reads of the store's index wait for a permit.
    pub probes_waiting: AtomicUsize,
    /// How many watches answered at an index lowered as `reaped` asks.
    pub reaped_answers: AtomicUsize,
}

impl Switchable {
    pub fn slow_lists(&self, prefix: Option<&str>) {
        *self.slow_lists.lock().unwrap() = prefix.map(str::to_owned);
    }
    pub fn hold_watches(&self, prefix: Option<&str>) {
        *self.held_watches.lock().unwrap() = prefix.map(str::to_owned);
    }
    pub fn panic_on(&self, prefix: Option<&str>) {
        *self.panicking.lock().unwrap() = prefix.map(str::to_owned);
    }
    fn panic_if_asked(&self, prefix: &str) {
        if Self::under(&self.panicking, prefix) {
            panic!("a bug while reading {prefix:?}");
        }
    }
    fn under(setting: &Mutex<Option<String>>, prefix: &str) -> bool {
        setting
            .lock()
            .unwrap()
            .as_deref()
            .is_some_and(|under| prefix.starts_with(under))
    }
    pub fn new(inner: Arc<dyn KvStore>) -> Arc<Switchable> {
        Arc::new(Switchable {
            inner: RwLock::new(inner),
            cut: AtomicBool::new(false),
            changes: AtomicBool::new(false),
            changed: Mutex::default(),
            slow_lists: Mutex::default(),
            held_watches: Mutex::default(),
            slow_keys: Mutex::default(),
            panicking: Mutex::default(),
            waits_past_its_index: AtomicBool::new(false),
            reaped: Mutex::default(),
            listed: Mutex::default(),
            held_lists: Mutex::default(),
            holding_a_list: AtomicBool::new(false),
            stalled_lists: Mutex::default(),
            stalling_a_list: AtomicBool::new(false),
            gated_probes: AtomicBool::new(false),
            probe_permits: Semaphore::new(0),
            probes_waiting: AtomicUsize::new(0),
            reaped_answers: AtomicUsize::new(0),
        })
    }

    /// `listing` of `prefix`, at the index of its newest pair when asked to.
    fn as_reaped(&self, prefix: &str, mut listing: Listing) -> Listing {
        let newest = listing.pairs.iter().map(|pair| pair.modify_index).max();
        if let Some(newest) = newest.filter(|_| Self::under(&self.reaped, prefix)) {
            listing.index = newest;
        }
        listing
    }

    /// Waits `wait` when asked to and `index` is past the backing store's.
    async fn wait_if_past(&self, index: u64, wait: Duration) -> StoreResult<()> {
        if self.waits_past_its_index.load(Ordering::SeqCst) {
            let now = self.store()?.current_index(layout::INDEX_PROBE).await?;
            if now.is_some_and(|now| index > now) {
                tokio::time::sleep(wait).await;
            }
        }
        Ok(())
    }

    /// The backing store, unless cut off.
    fn store(&self) -> StoreResult<Arc<dyn KvStore>> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("cut off".into()));
        }
        Ok(self.inner.read().unwrap().clone())
    }
}

#[async_trait]
impl KvStore for Switchable {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        self.store()?.get(key).await
    }
    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        self.panic_if_asked(prefix);
        while Self::under(&self.slow_lists, prefix) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.listed.lock().unwrap().push(prefix.to_owned());
        let listing = self.store()?.list(prefix).await?;
        while Self::under(&self.held_lists, prefix) {
            self.holding_a_list.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.holding_a_list.store(false, Ordering::SeqCst);
        if Self::under(&self.stalled_lists, prefix) {
            self.stalling_a_list.store(true, Ordering::SeqCst);
            // The runtime's other tasks go on meanwhile, on another thread.
            tokio::task::block_in_place(|| {
                while Self::under(&self.stalled_lists, prefix) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
            self.stalling_a_list.store(false, Ordering::SeqCst);
        }
        Ok(self.as_reaped(prefix, listing))
    }
    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        while Self::under(&self.slow_keys, prefix) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.store()?.keys(prefix, separator).await
    }
    async fn current_index(&self, probe: &str) -> StoreResult<Option<u64>> {
        if self.gated_probes.load(Ordering::SeqCst) {
            self.probes_waiting.fetch_add(1, Ordering::SeqCst);
            let permit = self.probe_permits.acquire().await;
            permit.expect("the permits are never closed").forget();
            self.probes_waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.store()?.current_index(probe).await
    }
    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        self.store()?.put(key, value, cas).await
    }
    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        self.store()?.delete(key, cas).await
    }
    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        self.store()?.delete_prefix(prefix).await
    }
    fn key_prefix_len(&self) -> usize {
        self.inner.read().unwrap().key_prefix_len()
    }
    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        self.store()?.txn(ops).await
    }
    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String> {
        self.store()?.create_session(spec).await
    }
    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo> {
        self.store()?.renew_session(id).await
    }
    async fn destroy_session(&self, id: &str) -> StoreResult<()> {
        self.store()?.destroy_session(id).await
    }
    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>> {
        self.store()?.session_info(id).await
    }
    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool> {
        self.store()?.acquire(key, value, session).await
    }
    async fn release(&self, key: &str, session: &str) -> StoreResult<bool> {
        self.store()?.release(key, session).await
    }
    async fn watch(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Listing> {
        self.wait_if_past(index, wait).await?;
        let answer = self.store()?.watch(target, index, wait).await;
        if let WatchTarget::Prefix(prefix) = target {
            self.panic_if_asked(prefix);
            while Self::under(&self.held_watches, prefix) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            return answer.map(|listing| {
                let index = listing.index;
                let listing = self.as_reaped(prefix, listing);
                if listing.index != index {
                    self.reaped_answers.fetch_add(1, Ordering::SeqCst);
                }
                listing
            });
        }
        answer
    }
    async fn watch_changes(
        &self,
        prefix: &str,
        index: u64,
        wait: Duration,
        held: HeldWrites<'_>,
    ) -> StoreResult<PrefixUpdate> {
        if !self.changes.load(Ordering::SeqCst) {
            let target = WatchTarget::Prefix(prefix.to_owned());
            return Ok(PrefixUpdate::Whole(self.watch(&target, index, wait).await?));
        }
        self.wait_if_past(index, wait).await?;
        let update = self
            .store()?
            .watch_changes(prefix, index, wait, held)
            .await?;
        self.panic_if_asked(prefix);
        if let PrefixUpdate::Since(changes) = &update {
            let keys = changes.changed.iter().map(|pair| pair.key.clone());
            self.changed.lock().unwrap().extend(keys);
        }
        Ok(update)
    }
    async fn ping(&self) -> StoreResult<()> {
        self.store()?.ping().await
    }
}

/// An empty store of the kind the apps use, to stand for theirs restarted empty.
pub async fn fresh_store() -> (Arc<dyn KvStore>, tempfile::TempDir) {
    use p2_apiserver::kv::{open_store, ConsulOptions, StoreUrl};
    let (url, dir) = match crate::support::api::backend() {
        "sqlite" => {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("fresh.db").display().to_string();
            (StoreUrl::Sqlite { path }, dir)
        }
        _ => {
            let fake = crate::support::fake_consul::start().await;
            (format!("consul://{}", fake.addr).parse().unwrap(), fake.dir)
        }
    };
    let store = open_store(&url, ConsulOptions::default()).await.unwrap();
    (store, dir)
}

/// An app mirrored by `config` over a store that can be swapped for another: `store`, or
/// without one the app's own.
pub async fn app(
    config: MirrorConfig,
    store: Option<Arc<dyn KvStore>>,
) -> (TestApp, Arc<Switchable>) {
    let mut switch = None;
    let wrap = |own| {
        let store = Switchable::new(store.unwrap_or(own));
        switch = Some(store.clone());
        store as Arc<dyn KvStore>
    };
    let app = TestApp::configured(wrap, config).await;
    (app, switch.unwrap())
}
