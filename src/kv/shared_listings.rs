//! A store whose listings of one prefix are shared by the reads that ask for it at once:
//! the API's reads that go through to the store (`?consistent=true`, or while the mirror
//! cannot be trusted) list whole trees the store has no index into (every pod's labels, to
//! count one RC's pods), and a crowd of them, which comes when the store may be struggling,
//! would ask it for the same megabytes each.
//!
//! The store sees at most one listing of a prefix in flight. A read joins only a listing
//! sent after it arrived, so that it sees every write acknowledged before it: while one is
//! in flight, every read arriving waits for the next, sent once the one in flight is back,
//! for them all; a read waits at most about two listings. Listings of keys (which such
//! a read learns its index from) are shared alike, by prefix and separator. A listing
//! runs in its own task, so a read given up on (its request dropped) neither cancels it for
//! the others nor leaves the prefix waiting; one every read of which was given up on is
//! dropped, so that one the store hung on holds back no later read. A failed listing fails
//! every read that joined it. Every other operation goes straight through.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::kv::{
    Cas, HeldWrites, KvPair, KvStore, Listing, PrefixUpdate, SessionInfo, SessionSpec, StoreError,
    StoreResult, TxnOp, WatchTarget,
};

/// `store`, its listings shared by concurrent reads (see the module documentation).
pub struct SharedListings {
    store: Arc<dyn KvStore>,
    /// Listings of pairs, by prefix.
    listings: Shared<String, Listing>,
    /// Listings of keys, by prefix and separator: a reader learns a prefix's index so, and
    /// the store visits every key of the prefix for it.
    keys: Shared<(String, Option<char>), (u64, Vec<String>)>,
}

impl SharedListings {
    /// `store`, its listings shared.
    pub fn wrap(store: Arc<dyn KvStore>) -> Arc<SharedListings> {
        Arc::new(SharedListings {
            store,
            listings: Shared::default(),
            keys: Shared::default(),
        })
    }

    /// How many reads wait for the next listing of `prefix`'s pairs, not yet sent.
    pub fn waiting_for_next(&self, prefix: &str) -> usize {
        self.listings.waiting_for_next(prefix)
    }
}

/// One read's answer, once it is back, for every reader that joined it.
type Answer<T> = Option<StoreResult<Arc<T>>>;

/// What is read, with a read of it in flight, each with the read to send next once it is
/// back, if a reader arrived meanwhile.
type Busy<K, T> = HashMap<K, Option<watch::Sender<Answer<T>>>>;

/// A read of the store, sent anew each time it is called.
type Fetch<T> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = StoreResult<T>> + Send>> + Send>;

/// Reads of one kind shared by the readers asking for the same thing at once.
struct Shared<K, T> {
    busy: Arc<Mutex<Busy<K, T>>>,
}

impl<K, T> Default for Shared<K, T> {
    fn default() -> Self {
        Shared {
            busy: Arc::default(),
        }
    }
}

impl<K, T> Shared<K, T>
where
    K: Hash + Eq + Clone + Send + 'static,
    T: Clone + Send + Sync + 'static,
{
    /// The answer of a read of `what` by `fetch` sent from now on: at once if none is in
    /// flight, else the next one.
    async fn read(&self, what: K, fetch: Fetch<T>) -> StoreResult<T> {
        let mut joined = self.join(what, fetch);
        let Ok(answer) = joined.wait_for(Option::is_some).await else {
            return Err(StoreError::Unavailable(
                "a shared read of the store was dropped unanswered".into(),
            ));
        };
        match answer.as_ref() {
            Some(Ok(answer)) => Ok(T::clone(answer)),
            Some(Err(e)) => Err(e.clone()),
            None => unreachable!("waited for an answer"),
        }
    }

    fn join(&self, what: K, fetch: Fetch<T>) -> watch::Receiver<Answer<T>> {
        let mut busy = lock(&self.busy);
        if let Some(next) = busy.get_mut(&what) {
            return next
                .get_or_insert_with(|| watch::channel(None).0)
                .subscribe();
        }
        busy.insert(what.clone(), None);
        // Spawned with the lock let go: a task the runtime drops as it is spawned (shutting
        // down) lets go of `what` at once, under the lock.
        drop(busy);
        let (answer, joined) = watch::channel(None);
        let sending = Sending {
            busy: self.busy.clone(),
            what,
            done: false,
        };
        tokio::spawn(sending.run(fetch, answer));
        joined
    }

    fn waiting_for_next<Q>(&self, what: &Q) -> usize
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let busy = lock(&self.busy);
        let next = busy.get(what).and_then(Option::as_ref);
        next.map_or(0, watch::Sender::receiver_count)
    }
}

fn lock<K, T>(busy: &Mutex<Busy<K, T>>) -> MutexGuard<'_, Busy<K, T>> {
    busy.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends the reads of one thing, one at a time, while readers wait for them.
struct Sending<K: Hash + Eq, T> {
    busy: Arc<Mutex<Busy<K, T>>>,
    what: K,
    /// Whether `what` was let go of: if the task ends otherwise (a panic, a runtime
    /// shutting down), [`Drop`] lets go of it, failing the readers waiting for the next.
    done: bool,
}

impl<K: Hash + Eq, T> Sending<K, T> {
    async fn run(mut self, fetch: Fetch<T>, mut answer: watch::Sender<Answer<T>>) {
        loop {
            // A listing every reader of which was given up on is dropped, so that a store
            // hung on it holds back no read arriving once it answers again.
            tokio::select! {
                read = fetch() => {
                    answer.send_replace(Some(read.map(Arc::new)));
                }
                () = answer.closed() => {}
            }
            let mut busy = lock(&self.busy);
            // Every reader that was waiting for the next read may have been given up on.
            match busy.get_mut(&self.what).and_then(Option::take) {
                Some(next) if next.receiver_count() > 0 => answer = next,
                _ => {
                    busy.remove(&self.what);
                    self.done = true;
                    return;
                }
            }
        }
    }
}

impl<K: Hash + Eq, T> Drop for Sending<K, T> {
    fn drop(&mut self) {
        if !self.done {
            lock(&self.busy).remove(&self.what);
        }
    }
}

#[async_trait]
impl KvStore for SharedListings {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        self.store.get(key).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        let (store, owned) = (self.store.clone(), prefix.to_owned());
        let fetch: Fetch<Listing> = Box::new(move || {
            let (store, prefix) = (store.clone(), owned.clone());
            Box::pin(async move { store.list(&prefix).await })
        });
        self.listings.read(prefix.to_owned(), fetch).await
    }

    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        let (store, owned) = (self.store.clone(), prefix.to_owned());
        let fetch: Fetch<(u64, Vec<String>)> = Box::new(move || {
            let (store, prefix) = (store.clone(), owned.clone());
            Box::pin(async move { store.keys(&prefix, separator).await })
        });
        self.keys.read((prefix.to_owned(), separator), fetch).await
    }

    async fn prefix_index(&self, prefix: &str) -> StoreResult<u64> {
        self.store.prefix_index(prefix).await
    }

    async fn prefix_index_through(&self, prefix: &str, through: u64) -> StoreResult<u64> {
        self.store.prefix_index_through(prefix, through).await
    }

    async fn current_index(&self, probe: &str) -> StoreResult<Option<u64>> {
        self.store.current_index(probe).await
    }

    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        self.store.put(key, value, cas).await
    }

    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        self.store.delete(key, cas).await
    }

    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        self.store.delete_prefix(prefix).await
    }

    fn key_prefix_len(&self) -> usize {
        self.store.key_prefix_len()
    }

    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        self.store.txn(ops).await
    }

    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String> {
        self.store.create_session(spec).await
    }

    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo> {
        self.store.renew_session(id).await
    }

    async fn destroy_session(&self, id: &str) -> StoreResult<()> {
        self.store.destroy_session(id).await
    }

    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>> {
        self.store.session_info(id).await
    }

    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool> {
        self.store.acquire(key, value, session).await
    }

    async fn release(&self, key: &str, session: &str) -> StoreResult<bool> {
        self.store.release(key, session).await
    }

    async fn watch(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Listing> {
        self.store.watch(target, index, wait).await
    }

    async fn watch_changes(
        &self,
        prefix: &str,
        index: u64,
        wait: Duration,
        held: HeldWrites<'_>,
    ) -> StoreResult<PrefixUpdate> {
        self.store.watch_changes(prefix, index, wait, held).await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.store.ping().await
    }

    async fn shut_down(&self) {
        self.store.shut_down().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use tokio::sync::Semaphore;
    use tokio::task::JoinHandle;

    use super::*;

    const PREFIX: &str = "labels/pod/";

    /// A store whose listings carry the index its last write gave when each was sent, and
    /// are answered only as the test releases them, one at a time.
    struct HeldStore {
        index: AtomicU64,
        /// How many listings were sent so far.
        sent: watch::Sender<usize>,
        /// One permit answers one listing.
        answers: Semaphore,
        failing: AtomicBool,
        /// A listing sent while set is never answered, as by a store that hung on it.
        hung: AtomicBool,
    }

    impl HeldStore {
        fn new() -> Arc<HeldStore> {
            Arc::new(HeldStore {
                index: AtomicU64::new(1),
                sent: watch::channel(0).0,
                answers: Semaphore::new(0),
                failing: AtomicBool::new(false),
                hung: AtomicBool::new(false),
            })
        }

        fn sent(&self) -> usize {
            *self.sent.borrow()
        }

        /// Waits until `n` listings were sent.
        async fn until_sent(&self, n: usize) {
            let mut sent = self.sent.subscribe();
            let reached = sent.wait_for(|sent| *sent >= n);
            patiently(reached).await.unwrap();
        }

        fn answer(&self, listings: usize) {
            self.answers.add_permits(listings);
        }
    }

    fn unused<T>() -> StoreResult<T> {
        Err(StoreError::Invalid("not used by these tests".into()))
    }

    #[async_trait]
    impl KvStore for HeldStore {
        async fn get(&self, _: &str) -> StoreResult<Option<KvPair>> {
            unused()
        }
        async fn list(&self, _: &str) -> StoreResult<Listing> {
            let index = self.index.load(Ordering::SeqCst);
            let failing = self.failing.load(Ordering::SeqCst);
            let hung = self.hung.load(Ordering::SeqCst);
            self.sent.send_modify(|sent| *sent += 1);
            if hung {
                std::future::pending::<()>().await;
            }
            self.answers.acquire().await.unwrap().forget();
            if failing {
                return Err(StoreError::Unavailable("the store is struggling".into()));
            }
            Ok(Listing {
                index,
                pairs: Vec::new(),
            })
        }
        async fn keys(&self, _: &str, _: Option<char>) -> StoreResult<(u64, Vec<String>)> {
            Ok((self.list(PREFIX).await?.index, Vec::new()))
        }
        async fn current_index(&self, _: &str) -> StoreResult<Option<u64>> {
            unused()
        }
        async fn put(&self, _: &str, _: &[u8], _: Cas) -> StoreResult<()> {
            self.index.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn delete(&self, _: &str, _: Cas) -> StoreResult<()> {
            unused()
        }
        async fn delete_prefix(&self, _: &str) -> StoreResult<()> {
            unused()
        }
        fn key_prefix_len(&self) -> usize {
            0
        }
        async fn txn(&self, _: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
            unused()
        }
        async fn create_session(&self, _: &SessionSpec) -> StoreResult<String> {
            unused()
        }
        async fn renew_session(&self, _: &str) -> StoreResult<SessionInfo> {
            unused()
        }
        async fn destroy_session(&self, _: &str) -> StoreResult<()> {
            unused()
        }
        async fn session_info(&self, _: &str) -> StoreResult<Option<SessionInfo>> {
            unused()
        }
        async fn acquire(&self, _: &str, _: &[u8], _: &str) -> StoreResult<bool> {
            unused()
        }
        async fn release(&self, _: &str, _: &str) -> StoreResult<bool> {
            unused()
        }
        async fn watch(&self, _: &WatchTarget, _: u64, _: Duration) -> StoreResult<Listing> {
            unused()
        }
        async fn ping(&self) -> StoreResult<()> {
            unused()
        }
    }

    /// Far longer than anything here takes; only a read or listing that never comes
    /// reaches it.
    async fn patiently<T>(until: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(30), until)
            .await
            .expect("never came")
    }

    fn read(shared: &Arc<SharedListings>) -> JoinHandle<StoreResult<Listing>> {
        let shared = shared.clone();
        tokio::spawn(async move { shared.list(PREFIX).await })
    }

    /// Waits until `n` reads wait for the next listing.
    async fn until_waiting(shared: &SharedListings, n: usize) {
        patiently(async {
            while shared.waiting_for_next(PREFIX) != n {
                tokio::task::yield_now().await;
            }
        })
        .await;
    }

    /// Waits until no listing is in flight.
    async fn until_idle(shared: &SharedListings) {
        patiently(async {
            while !lock(&shared.listings.busy).is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await;
    }

    /// `n` reads arriving while no listing is in flight: the first, sent a listing; the
    /// others, waiting for the next.
    async fn crowd(
        store: &HeldStore,
        shared: &Arc<SharedListings>,
        n: usize,
    ) -> Vec<JoinHandle<StoreResult<Listing>>> {
        until_idle(shared).await;
        let sent = store.sent();
        let first = read(shared);
        store.until_sent(sent + 1).await;
        let mut reads = vec![first];
        reads.extend((1..n).map(|_| read(shared)));
        until_waiting(shared, n - 1).await;
        reads
    }

    async fn indexes(reads: Vec<JoinHandle<StoreResult<Listing>>>) -> Vec<u64> {
        let mut indexes = Vec::new();
        for read in reads {
            indexes.push(patiently(read).await.unwrap().unwrap().index);
        }
        indexes
    }

    #[tokio::test]
    async fn concurrent_reads_of_a_prefix_share_the_next_listing() {
        let store = HeldStore::new();
        let shared = SharedListings::wrap(store.clone());
        let reads = crowd(&store, &shared, 32).await;
        assert_eq!(store.sent(), 1, "a listing sent while another is in flight");
        store.answer(2);
        let indexes = indexes(reads).await;
        assert_eq!(store.sent(), 2, "32 reads made {} listings", store.sent());
        assert!(indexes.iter().all(|index| *index == 1));
        assert_eq!(shared.waiting_for_next(PREFIX), 0);
    }

    #[tokio::test]
    async fn a_read_sees_a_write_acknowledged_while_a_listing_was_in_flight() {
        let store = HeldStore::new();
        let shared = SharedListings::wrap(store.clone());
        let before = read(&shared);
        store.until_sent(1).await;
        shared
            .put("labels/pod/node1/hello", b"{}", Cas::Any)
            .await
            .unwrap();
        let after = read(&shared);
        until_waiting(&shared, 1).await;
        store.answer(2);
        assert_eq!(indexes(vec![before, after]).await, [1, 2]);
        assert_eq!(store.sent(), 2);
    }

    #[tokio::test]
    async fn a_read_given_up_on_neither_cancels_the_listing_nor_holds_the_prefix() {
        let store = HeldStore::new();
        let shared = SharedListings::wrap(store.clone());
        // The read of the listing in flight, and three waiting for the next.
        let reads = crowd(&store, &shared, 4).await;
        let [sent, given_up, given_up_later, kept] = <[_; 4]>::try_from(reads).unwrap();
        given_up.abort();
        until_waiting(&shared, 2).await;
        store.answer(1);
        assert_eq!(indexes(vec![sent]).await, [1]);
        // One of the two reads of the listing now in flight given up on.
        store.until_sent(2).await;
        given_up_later.abort();
        store.answer(1);
        assert_eq!(indexes(vec![kept]).await, [1]);
        assert_eq!(store.sent(), 2);

        // Every read waiting for the next listing given up on: it is not sent.
        let [first, waiting] = <[_; 2]>::try_from(crowd(&store, &shared, 2).await).unwrap();
        waiting.abort();
        until_waiting(&shared, 0).await;
        store.answer(1);
        assert_eq!(indexes(vec![first]).await, [1]);
        until_idle(&shared).await;
        let later = read(&shared);
        store.until_sent(4).await;
        store.answer(1);
        assert_eq!(indexes(vec![later]).await, [1]);
        assert_eq!(store.sent(), 4, "a listing sent for no read");
    }

    /// A listing the store hung on, every read of which was given up on (cut by its
    /// deadline), holds back no read once the store answers again: the next is sent at once
    /// for the reads waiting for it, and a read arriving with none waiting is sent its own.
    /// Before, they waited for the hung listing to come back, if ever.
    #[tokio::test]
    async fn a_listing_no_read_waits_for_holds_back_no_later_read() {
        let store = HeldStore::new();
        let shared = SharedListings::wrap(store.clone());
        store.hung.store(true, Ordering::SeqCst);
        let given_up = read(&shared);
        store.until_sent(1).await;
        let waiting = read(&shared);
        until_waiting(&shared, 1).await;
        store.hung.store(false, Ordering::SeqCst);
        given_up.abort();
        store.until_sent(2).await;
        store.answer(1);
        assert_eq!(indexes(vec![waiting]).await, [1]);

        until_idle(&shared).await;
        store.hung.store(true, Ordering::SeqCst);
        let given_up = read(&shared);
        store.until_sent(3).await;
        given_up.abort();
        store.hung.store(false, Ordering::SeqCst);
        let later = read(&shared);
        store.until_sent(4).await;
        store.answer(1);
        assert_eq!(indexes(vec![later]).await, [1]);
        until_idle(&shared).await;
    }

    /// A read arriving as the runtime shuts down, whose listing's task is dropped as it is
    /// spawned, fails: before, the dropped task let go of the prefix under the lock the
    /// read held to spawn it, and the thread deadlocked on itself.
    #[test]
    fn a_read_arriving_as_the_runtime_shuts_down_fails() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        drop(runtime);
        let (answered, answer) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _entered = handle.enter();
            let shared = SharedListings::wrap(HeldStore::new());
            let _ = answered.send(futures::executor::block_on(shared.list(PREFIX)));
        });
        let answer = answer
            .recv_timeout(Duration::from_secs(30))
            .expect("never came");
        assert!(
            matches!(answer, Err(StoreError::Unavailable(_))),
            "{answer:?}"
        );
    }

    #[tokio::test]
    async fn a_failed_listing_fails_every_read_that_joined_it() {
        let store = HeldStore::new();
        let shared = SharedListings::wrap(store.clone());
        let reads = crowd(&store, &shared, 4).await;
        store.failing.store(true, Ordering::SeqCst);
        store.answer(2);
        let [first, joined @ ..] = <[_; 4]>::try_from(reads).unwrap();
        assert_eq!(indexes(vec![first]).await, [1]);
        for read in joined {
            let failed = patiently(read).await.unwrap();
            assert!(
                matches!(failed, Err(StoreError::Unavailable(_))),
                "{failed:?}"
            );
        }
        store.failing.store(false, Ordering::SeqCst);
        let again = read(&shared);
        store.answer(1);
        assert_eq!(indexes(vec![again]).await, [1]);
        assert_eq!(store.sent(), 3);
    }

    #[tokio::test]
    async fn listings_of_keys_are_shared_by_prefix_and_separator() {
        let store = HeldStore::new();
        let shared = SharedListings::wrap(store.clone());
        let keys = |separator| {
            let shared = shared.clone();
            tokio::spawn(async move { shared.keys(PREFIX, separator).await })
        };
        let first = keys(Some('/'));
        store.until_sent(1).await;
        let whole = keys(None);
        store.until_sent(2).await;
        let joined: Vec<_> = (0..3).map(|_| keys(Some('/'))).collect();
        let next = (PREFIX.to_owned(), Some('/'));
        patiently(async {
            while shared.keys.waiting_for_next(&next) != 3 {
                tokio::task::yield_now().await;
            }
        })
        .await;
        store.answer(3);
        for read in [first, whole].into_iter().chain(joined) {
            patiently(read).await.unwrap().unwrap();
        }
        assert_eq!(store.sent(), 3);
    }
}
