//! The state mirror against real stores: SQLite, and the Consul client against the fake
//! agent. After any writes settle the mirror equals the store entry by entry, indexes
//! included; it survives losing its watches and a store whose index goes backwards.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser as _;
use p2_apiserver::config::{Cli, Command};
use p2_apiserver::farms::alerts::Alerter;
use p2_apiserver::farms::world::{pod_key, Trees};
use p2_apiserver::farms::{FarmContext, FarmError};
use p2_apiserver::kv::{
    open_store, Cas, ConsulOptions, KvPair, KvStore, SessionBehavior, SessionSpec, StoreError,
    StoreUrl, TxnOp,
};
use p2_apiserver::labels::{LabelType, Selector};
use p2_apiserver::layout::LEADER_LOCK;
use p2_apiserver::leader::{self, LeaderConfig, Term};
use p2_apiserver::state::{
    ChangeType, Entry, Kind, Mirror, MirrorConfig, OwnWrite, Signal, Tree, TreeSnapshot,
};
use p2_apiserver::store::own_writes::OwnWrites;
use rand::Rng;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::support::fake_consul;
use crate::support::switchable::Switchable;

/// Far longer than the mirror ever needs; only a mirror that never converges reaches it.
const PATIENCE: Duration = Duration::from_secs(30);

/// A store and what must outlive it.
struct Backend {
    store: Arc<dyn KvStore>,
    _dir: tempfile::TempDir,
}

async fn sqlite() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db").display().to_string();
    let store = open_store(&StoreUrl::Sqlite { path }, ConsulOptions::default())
        .await
        .unwrap();
    Backend { store, _dir: dir }
}

async fn consul_fake() -> Backend {
    let fake = fake_consul::start().await;
    let url = format!("consul://{}", fake.addr).parse().unwrap();
    let store = open_store(&url, ConsulOptions::default()).await.unwrap();
    Backend {
        store,
        _dir: fake.dir,
    }
}

/// Both backends, one after the other.
async fn each_backend(test: impl AsyncFn(Backend)) {
    test(sqlite().await).await;
    test(consul_fake().await).await;
}

fn config() -> MirrorConfig {
    MirrorConfig {
        watch_wait: Duration::from_secs(5),
        min_reread_interval: Duration::from_millis(20),
        lost_after: Duration::from_millis(100),
        ..MirrorConfig::default()
    }
}

/// A loaded mirror of `store`, following it until the returned guard is dropped.
async fn started(store: Arc<dyn KvStore>, config: MirrorConfig) -> (Mirror, Running) {
    let mirror = Mirror::new(store, config);
    let running = Running {
        tasks: TaskTracker::new(),
        cancel: CancellationToken::new(),
    };
    mirror.start(&running.tasks, running.cancel.clone());
    assert!(
        mirror.wait_for(0, PATIENCE).await,
        "the mirror never loaded"
    );
    (mirror, running)
}

/// The mirror's tasks, cancelled on drop.
struct Running {
    tasks: TaskTracker,
    cancel: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.tasks.close();
    }
}

/// Puts `value` at `key` in `store`, as another writer would; returns the pair as stored,
/// with the index it was written at.
async fn put_and_get(store: &dyn KvStore, key: &str, value: &[u8]) -> KvPair {
    store.put(key, value, Cas::Any).await.unwrap();
    store.get(key).await.unwrap().unwrap()
}

/// Every pair of every followed tree, as the store holds them.
async fn stored(store: &dyn KvStore) -> Vec<KvPair> {
    let mut pairs = Vec::new();
    for tree in Tree::ALL {
        pairs.extend(store.list(&tree.prefix()).await.unwrap().pairs);
    }
    pairs
}

/// Every pair the mirror holds.
fn mirrored(mirror: &Mirror) -> Vec<KvPair> {
    Tree::ALL
        .into_iter()
        .flat_map(|tree| {
            let entries = mirror.entries(tree);
            let pairs: Vec<KvPair> = entries.values().map(|entry| entry.to_pair()).collect();
            pairs
        })
        .collect()
}

/// Waits until the mirror holds exactly what the store holds, then checks it once more.
async fn assert_converges(mirror: &Mirror, store: &dyn KvStore) {
    let converged = async {
        loop {
            let expected = stored(store).await;
            if mirrored(mirror) == expected {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(PATIENCE, converged).await.is_err() {
        assert_eq!(mirrored(mirror), stored(store).await, "never converged");
    }
}

/// The entries of a tree as a reader holds them.
/// Waits until `done` holds, at most 30 s.
async fn eventually(done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "never happened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn by_key<'a>(entries: impl IntoIterator<Item = &'a Arc<Entry>>) -> BTreeMap<String, Arc<Entry>> {
    let by_key = entries.into_iter().map(|e| (e.pair.key.clone(), e.clone()));
    by_key.collect()
}

/// `before` is still the tree as it was (`was`), and updated by the keys the mirror names
/// as changed since, it is the tree the mirror holds now.
fn assert_catches_up(mirror: &Mirror, before: TreeSnapshot, was: BTreeMap<String, Arc<Entry>>) {
    let tree = before.tree;
    let mut held = by_key(before.entries.values());
    assert_eq!(held, was, "{tree:?}: a snapshot stays as it was taken");
    let Some(since) = mirror.snapshot(tree, Some(before.generation)) else {
        assert_eq!(
            held,
            by_key(mirror.entries(tree).values()),
            "{tree:?} unchanged"
        );
        return;
    };
    let unnamed = mirror.entries_snapshot(tree, Some(before.generation));
    let unnamed = unnamed.unwrap_or_else(|| panic!("{tree:?}: changed"));
    assert_eq!(
        unnamed.changed, None,
        "{tree:?}: changes are named only when asked"
    );
    assert_eq!(
        by_key(unnamed.entries.values()),
        by_key(since.entries.values())
    );
    let changed = since
        .changed
        .unwrap_or_else(|| panic!("{tree:?}: a few changes are named"));
    for key in changed {
        match since.entries.get(&key) {
            Some(entry) => held.insert(key, entry.clone()),
            None => held.remove(&key),
        };
    }
    assert_eq!(held, by_key(mirror.entries(tree).values()), "{tree:?}");
}

fn pod_labels(rc: &str) -> Vec<u8> {
    format!(r#"{{"replication_controller_id":"{rc}","app":"web"}}"#).into_bytes()
}

/// One random write: through this server (`own`, which applies its writes to the mirror at
/// once) a transaction, a delete or a compare-and-delete of the version the mirror holds;
/// or a plain write through another server, which the mirror only learns of by its watch.
async fn random_write(own: &dyn KvStore, other: &dyn KvStore, mirror: &Mirror, writer: usize) {
    let (key, value) = {
        let mut rng = rand::thread_rng();
        let n = rng.gen_range(0..6);
        let rc = format!("rc{}", rng.gen_range(0..3));
        match rng.gen_range(0..5) {
            0 => (format!("labels/pod/node{n}/pod{writer}"), pod_labels(&rc)),
            1 => (
                format!("labels/node/node{n}"),
                br#"{"role":"web"}"#.to_vec(),
            ),
            2 => (
                format!("intent/node{n}/pod{writer}"),
                b"id: hello\n".to_vec(),
            ),
            3 => (
                format!("health/pod{writer}/node{n}"),
                b"{\"Status\":\"passing\"}".to_vec(),
            ),
            _ => (
                format!("rolls/roll{n}"),
                format!("{{\"n\":{writer}}}").into_bytes(),
            ),
        }
    };
    let kind = rand::thread_rng().gen_range(0..5);
    match kind {
        0 | 1 => drop(own.txn(&[TxnOp::Set { key, value }]).await.unwrap()),
        2 => other.put(&key, &value, Cas::Any).await.unwrap(),
        3 => drop(own.txn(&[TxnOp::Delete { key }]).await.unwrap()),
        _ => {
            let Some(held) = mirror.get(&key) else { return };
            match own.delete(&key, Cas::Index(held.pair.modify_index)).await {
                Ok(()) | Err(StoreError::Conflict { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_concurrent_writes_the_mirror_equals_the_store() {
    each_backend(async |backend| {
        let (mirror, _running) = started(backend.store.clone(), config()).await;
        let before: Vec<(TreeSnapshot, BTreeMap<String, Arc<Entry>>)> = Tree::ALL
            .into_iter()
            .map(|tree| {
                let snapshot = mirror.snapshot(tree, None).unwrap();
                let was = by_key(snapshot.entries.values());
                (snapshot, was)
            })
            .collect();
        let writers: Vec<_> = (0..4)
            .map(|writer| {
                let (store, mirror) = (backend.store.clone(), mirror.clone());
                let own = OwnWrites::wrap(store.clone(), mirror.clone());
                tokio::spawn(async move {
                    for _ in 0..40 {
                        random_write(own.as_ref(), store.as_ref(), &mirror, writer).await;
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap();
        }
        assert_converges(&mirror, backend.store.as_ref()).await;

        // A reader that knew each tree before catches up by the changes since.
        for (before, was) in before {
            assert_catches_up(&mirror, before, was);
        }

        // The secondary indexes agree with the entries.
        for rc in ["rc0", "rc1", "rc2"] {
            let selector: Selector = format!("replication_controller_id={rc}").parse().unwrap();
            let selected: Vec<String> = mirror
                .select(LabelType::Pod, &selector)
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            assert_eq!(mirror.pods_of_rc(rc), selected, "{rc}");
        }
        let scanned = mirror.select(LabelType::Pod, &"app".parse().unwrap());
        assert_eq!(
            scanned.len(),
            mirror.entries(Tree::Labels(LabelType::Pod)).len()
        );
    })
    .await;
}

#[tokio::test]
async fn a_write_is_readable_at_once_or_after_waiting_for_its_index() {
    each_backend(async |backend| {
        let store = backend.store.clone();
        let (mirror, _running) = started(store.clone(), config()).await;

        // Through this server: applied at once, no waiting.
        let ops = [TxnOp::Set {
            key: "labels/node/a".into(),
            value: br#"{"role":"web"}"#.to_vec(),
        }];
        let results = store.txn(&ops).await.unwrap();
        mirror.apply_own_writes(OwnWrite::from_txn(&ops, &results), None);
        let written = store.get("labels/node/a").await.unwrap().unwrap();
        assert_eq!(mirror.get("labels/node/a").unwrap().pair, written);
        assert!(mirror.index() >= written.modify_index);

        // Through another server: visible once the mirror reaches the write's index.
        let written = put_and_get(store.as_ref(), "labels/node/b", b"{}").await;
        assert!(mirror.wait_for(written.modify_index, PATIENCE).await);
        assert_eq!(mirror.get("labels/node/b").unwrap().pair, written);
        let labels = mirror.labels_of(LabelType::Node, "a").unwrap();
        assert_eq!(labels["role"], "web");
    })
    .await;
}

#[tokio::test]
async fn the_mirror_does_not_read_back_what_its_own_transactions_wrote() {
    // The SQLite store can leave them out; Consul's watches answer whole listings.
    let backend = sqlite().await;
    let switch = Switchable::new(backend.store.clone());
    switch.changes.store(true, Ordering::SeqCst);
    // Read again only when waited for, so that no read falls between a transaction's commit
    // and the mirror taking its pairs in (it would find them, as it should).
    let paced = MirrorConfig {
        min_reread_interval: Duration::from_secs(3600),
        ..config()
    };
    let (mirror, _running) = started(switch.clone(), paced).await;
    let own = OwnWrites::wrap(switch.clone(), mirror.clone());
    let set = |key: &str| TxnOp::Set {
        key: key.into(),
        value: br#"{"role":"web"}"#.to_vec(),
    };

    own.txn(&[set("labels/node/ours")]).await.unwrap();
    own.txn(&[set("labels/node/ours-too")]).await.unwrap();
    backend
        .store
        .txn(&[set("labels/node/theirs")])
        .await
        .unwrap();
    let theirs = backend
        .store
        .get("labels/node/theirs")
        .await
        .unwrap()
        .unwrap();
    assert!(mirror.wait_for(theirs.modify_index, PATIENCE).await);

    assert_eq!(mirror.get("labels/node/theirs").unwrap().pair, theirs);
    assert!(mirror.get("labels/node/ours").is_some());
    assert_eq!(*switch.changed.lock().unwrap(), ["labels/node/theirs"]);
    assert_converges(&mirror, backend.store.as_ref()).await;
}

#[tokio::test]
async fn a_reader_waiting_for_a_tree_does_not_wait_out_its_reread_interval() {
    each_backend(async |backend| {
        let store = backend.store.clone();
        // Paced far beyond the test's patience: only the wait itself can get the tree read.
        let paced = MirrorConfig {
            min_reread_interval: Duration::from_secs(3600),
            ..config()
        };
        let (mirror, _running) = started(store.clone(), paced).await;
        let written = put_and_get(store.as_ref(), "labels/node/b", b"{}").await;
        assert!(mirror.wait_for(written.modify_index, PATIENCE).await);
        assert_eq!(mirror.get("labels/node/b").unwrap().pair, written);
    })
    .await;
}

#[tokio::test]
async fn a_lost_watch_is_reported_and_recovered_from() {
    each_backend(async |backend| {
        let switch = Switchable::new(backend.store.clone());
        let (mirror, _running) = started(switch.clone(), config()).await;
        assert!(mirror.health().is_healthy());

        switch.cut.store(true, Ordering::SeqCst);
        backend
            .store
            .put("labels/node/a", b"{}", Cas::Any)
            .await
            .unwrap();
        // Other trees' watches may be reported lost too, and before it (a store may wake
        // them all): the one written to must be among them.
        let lost = || -> Vec<String> { mirror.health().lost.into_iter().map(|(p, _)| p).collect() };
        let reported = async {
            while !lost().contains(&"labels/node/".to_owned()) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(PATIENCE, reported)
            .await
            .unwrap_or_else(|_| panic!("the lost watch is never reported: {:?}", lost()));

        switch.cut.store(false, Ordering::SeqCst);
        assert_converges(&mirror, backend.store.as_ref()).await;
        let healthy = async {
            while !mirror.health().is_healthy() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(PATIENCE, healthy)
            .await
            .expect("the mirror never reports healthy again");
    })
    .await;
}

#[tokio::test]
async fn a_store_going_backwards_is_read_afresh_and_subscribers_resync() {
    for (old, fresh) in [
        (sqlite().await, sqlite().await),
        (consul_fake().await, consul_fake().await),
    ] {
        let (switch, mirror, _running) = node_labels_behind_a_switch(&old, &fresh, config()).await;
        let mut subscriber = mirror.subscribe(None, &[Kind::Nodes], &[]).receiver;

        turn_to_fresh(&switch, &old, &fresh).await;

        assert_converges(&mirror, fresh.store.as_ref()).await;
        let resynced = async {
            loop {
                if let Signal::Resync = subscriber.recv().await.unwrap() {
                    return;
                }
            }
        };
        tokio::time::timeout(PATIENCE, resynced)
            .await
            .expect("no resync signal");
    }
}

/// A Consul restored from a snapshot holds the mirror's watches, which wait for an index
/// past the restored one, until their wait runs out: the heartbeat, reading the store's
/// index below what the mirror holds, has every tree read afresh long before. It does so
/// also while the watch of a tree that the restored store holds past its index answers,
/// as one being written to does.
#[tokio::test]
async fn a_store_restored_under_waiting_watches_is_read_afresh_within_heartbeats() {
    for (old, fresh) in [
        (sqlite().await, sqlite().await),
        (consul_fake().await, consul_fake().await),
    ] {
        let pod = "labels/pod/n/p";
        old.store.put(pod, b"{}", Cas::Any).await.unwrap();
        for _ in 0..10 {
            fresh.store.put(pod, b"{}", Cas::Any).await.unwrap();
        }
        let config = MirrorConfig {
            watch_wait: 4 * PATIENCE,
            heartbeat_interval: Duration::from_millis(200),
            ..config()
        };
        let (switch, mirror, _running) = node_labels_behind_a_switch(&old, &fresh, config).await;

        switch.waits_past_its_index.store(true, Ordering::SeqCst);
        turn_to_fresh(&switch, &old, &fresh).await;
        let writing = {
            let fresh = fresh.store.clone();
            tokio::spawn(async move {
                loop {
                    fresh.put(pod, b"{}", Cas::Any).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };

        let converged = async {
            while mirrored(&mirror)
                .iter()
                .any(|pair| pair.key.contains("old"))
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let converged = tokio::time::timeout(PATIENCE, converged).await;
        writing.abort();
        assert!(
            converged.is_ok(),
            "the old store's node labels are still served"
        );
        assert_converges(&mirror, fresh.store.as_ref()).await;
    }
}

/// Consul lists a prefix at the index of its newest change, a delete's while the delete's
/// tombstone lasts; once Consul reaps the tombstone, the prefix's index goes back to that of
/// its newest key, though the store has not gone backwards (Consul's blocking-query notes
/// name "KV list operations where an item with the highest index is removed"). What that
/// tree's watch brings is taken in as any listing: no tree is read whole again, as every
/// one is when the store itself went backwards.
#[tokio::test]
async fn a_tree_whose_index_goes_back_as_consul_reaps_a_tombstone_is_taken_in_alone() {
    let backend = sqlite().await;
    let store = backend.store.clone();
    let newest_key = put_and_get(store.as_ref(), "labels/node/a", b"{}")
        .await
        .modify_index;
    store.put("labels/node/b", b"{}", Cas::Any).await.unwrap();
    store.delete("labels/node/b", Cas::Any).await.unwrap();
    let switch = Switchable::new(store.clone());
    let config = MirrorConfig {
        watch_wait: Duration::from_millis(300),
        ..config()
    };
    let (mirror, _running) = started(switch.clone(), config).await;
    let tree = Tree::Labels(LabelType::Node);
    let listed = || mirror.versions(&[tree])[0].listed;
    assert!(listed() > newest_key, "listed at the delete");
    switch.listed.lock().unwrap().clear();

    *switch.reaped.lock().unwrap() = Some("labels/node/".into());

    // The tree watched again after the lower index, and once more.
    eventually(|| switch.reaped_answers.load(Ordering::SeqCst) >= 3).await;
    assert!(mirror.health().is_healthy());
    let read_again = switch.listed.lock().unwrap().clone();
    assert!(read_again.is_empty(), "trees read again: {read_again:?}");
    assert_converges(&mirror, store.as_ref()).await;
}

/// A tree whose index went back while the store's did not (Consul reaped a tombstone)
/// keeps the server's own writes made while its watch answered: the store holds them, and
/// the listing at the lower index, taken before they were made, is no reason to take them
/// out of the mirror, or to stream their deletion.
#[tokio::test]
async fn a_tree_whose_index_goes_back_alone_keeps_the_servers_own_writes() {
    let backend = sqlite().await;
    let store = backend.store.clone();
    store.put("labels/node/a", b"{}", Cas::Any).await.unwrap();
    store.put("labels/node/b", b"{}", Cas::Any).await.unwrap();
    store.delete("labels/node/b", Cas::Any).await.unwrap();
    let switch = Switchable::new(store.clone());
    let config = MirrorConfig {
        watch_wait: Duration::from_millis(300),
        ..config()
    };
    let (mirror, _running) = started(switch.clone(), config).await;
    let own = OwnWrites::wrap(switch.clone(), mirror.clone());
    let mut subscriber = mirror.subscribe(None, &[Kind::Nodes], &[]).receiver;

    *switch.held_lists.lock().unwrap() = Some("labels/node/".into());
    *switch.reaped.lock().unwrap() = Some("labels/node/".into());
    // The watch's wait ran out at the lower index, and what it brought was taken in: a
    // listing the tree asked for then is kept unanswered, or the tree watches again.
    let answered = || switch.reaped_answers.load(Ordering::SeqCst);
    eventually(|| answered() >= 1).await;
    eventually(|| switch.holding_a_list.load(Ordering::SeqCst) || answered() >= 2).await;
    own.put("labels/node/ours", b"{}", Cas::Any).await.unwrap();
    assert!(mirror.get("labels/node/ours").is_some());
    *switch.held_lists.lock().unwrap() = None;

    eventually(|| !switch.holding_a_list.load(Ordering::SeqCst)).await;
    assert_converges(&mirror, store.as_ref()).await;
    let next = Duration::from_millis(50);
    while let Ok(signal) = tokio::time::timeout(next, subscriber.recv()).await {
        if let Signal::Change(change) = signal.unwrap() {
            assert!(
                !(change.change_type == ChangeType::Deleted
                    && change.entry.pair.key == "labels/node/ours"),
                "the server's own write was streamed as deleted"
            );
        }
    }
}

/// A store restored from a snapshot and written to since may answer its index at or past
/// what the mirror holds, though a tree's listing went back: one that lists a key at a
/// version older than the mirror held before the listing was asked for is of a store that
/// went backwards, and every tree is read again, rather than the older version ignored as
/// stale and the lost one served on.
#[tokio::test]
async fn a_listing_older_than_what_the_mirror_held_is_of_a_store_that_went_backwards() {
    let (old, fresh) = (sqlite().await, sqlite().await);
    for _ in 0..5 {
        old.store
            .put("labels/node/x", b"{}", Cas::Any)
            .await
            .unwrap();
    }
    fresh
        .store
        .put("labels/node/x", br#"{"restored":"yes"}"#, Cas::Any)
        .await
        .unwrap();
    // Written since the restore, outside the trees: the store's index is past the old one's.
    for _ in 0..20 {
        fresh
            .store
            .put("elsewhere/k", b"{}", Cas::Any)
            .await
            .unwrap();
    }
    let switch = Switchable::new(old.store.clone());
    let (mirror, _running) = started(switch.clone(), config()).await;
    assert_converges(&mirror, old.store.as_ref()).await;

    turn_to_fresh(&switch, &old, &fresh).await;

    assert_converges(&mirror, fresh.store.as_ref()).await;
}

/// A key deleted while the tree's watch could not reach the store, the delete's tombstone
/// reaped before it could again: the listing the watch then gets is below what the tree
/// holds, though the store did not go backwards, and lacks the key. It reflects the store
/// as it was after all the tree held was written, so the key goes.
#[tokio::test]
async fn a_key_deleted_unseen_goes_when_its_trees_index_went_back() {
    let backend = sqlite().await;
    let store = backend.store.clone();
    store.put("labels/node/a", b"{}", Cas::Any).await.unwrap();
    store.put("labels/node/k", b"{}", Cas::Any).await.unwrap();
    let switch = Switchable::new(store.clone());
    let config = MirrorConfig {
        watch_wait: Duration::from_millis(300),
        ..config()
    };
    let (mirror, _running) = started(switch.clone(), config).await;
    assert!(mirror.get("labels/node/k").is_some());

    switch.cut.store(true, Ordering::SeqCst);
    store.delete("labels/node/k", Cas::Any).await.unwrap();
    *switch.reaped.lock().unwrap() = Some("labels/node/".into());
    switch.cut.store(false, Ordering::SeqCst);

    assert_converges(&mirror, store.as_ref()).await;
}

/// A mirror by `config` of `old`, given twenty node labels, behind a switch (see
/// [`behind_a_switch`]).
async fn node_labels_behind_a_switch(
    old: &Backend,
    fresh: &Backend,
    config: MirrorConfig,
) -> (Arc<Switchable>, Mirror, Running) {
    for i in 0..20 {
        let key = format!("labels/node/old{i}");
        old.store.put(&key, b"{}", Cas::Any).await.unwrap();
    }
    behind_a_switch(old, fresh, config).await
}

/// Turns `switch` from `old` to `fresh`, and wakes the watches still waiting on `old`, so
/// that they move to `fresh`.
async fn turn_to_fresh(switch: &Switchable, old: &Backend, fresh: &Backend) {
    *switch.inner.write().unwrap() = fresh.store.clone();
    old.store
        .put("labels/node/old0", b"{}", Cas::Any)
        .await
        .unwrap();
}

/// Another writer's change to the node labels, which their watch holds back, then a newer
/// one to the RCs, which the mirror lists; the trees of an answer made of both.
async fn node_labels_held_behind_the_rcs(
    switch: &Switchable,
    store: &dyn KvStore,
    mirror: &Mirror,
) -> [Tree; 2] {
    switch.hold_watches(Some("labels/node/"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.put("labels/node/c", b"{}", Cas::Any).await.unwrap();
    let rc_index = put_and_get(store, "replication_controllers/x", b"{}")
        .await
        .modify_index;
    eventually(|| mirror.listed_index(&[Tree::Rcs]) >= rc_index).await;
    [Tree::Rcs, Tree::Labels(LabelType::Node)]
}

/// A mirror of an old store (50 RCs and a node label) behind a switch, and the fresh store
/// (one other node label, at lower indexes) the switch can turn to.
async fn about_to_go_backwards() -> (Backend, Backend, Arc<Switchable>, Mirror, Running) {
    about_to_go_backwards_with(config()).await
}

/// A store holding `rcs` RCs and one node label, each key named after `name`.
async fn holding(name: &str, rcs: usize) -> Backend {
    let backend = sqlite().await;
    for i in 0..rcs {
        let key = format!("replication_controllers/{name}{i}");
        backend.store.put(&key, b"{}", Cas::Any).await.unwrap();
    }
    let label = format!("labels/node/{name}");
    backend.store.put(&label, b"{}", Cas::Any).await.unwrap();
    backend
}

/// [`about_to_go_backwards`], the mirror configured as `config`.
async fn about_to_go_backwards_with(
    config: MirrorConfig,
) -> (Backend, Backend, Arc<Switchable>, Mirror, Running) {
    let (old, fresh) = (holding("old", 50).await, sqlite().await);
    let (switch, mirror, running) = behind_a_switch(&old, &fresh, config).await;
    (old, fresh, switch, mirror, running)
}

/// A mirror by `config` of `old` behind a switch, once it holds what `old` holds, and
/// `fresh` given one node label (at an index below `old`'s) for the switch to turn to.
async fn behind_a_switch(
    old: &Backend,
    fresh: &Backend,
    config: MirrorConfig,
) -> (Arc<Switchable>, Mirror, Running) {
    fresh
        .store
        .put("labels/node/new", b"{}", Cas::Any)
        .await
        .unwrap();
    let switch = Switchable::new(old.store.clone());
    let (mirror, running) = started(switch.clone(), config).await;
    assert_converges(&mirror, old.store.as_ref()).await;
    (switch, mirror, running)
}

/// A tree read after the store went backwards holds no change up to the old store's index:
/// until every tree is read whole again, the mirror's index is the old store's, and a tree
/// taking it as what its next read holds would pass for caught up with indexes it never saw.
#[tokio::test]
async fn a_tree_read_after_the_store_went_backwards_holds_no_index_of_the_old_store() {
    let (old, fresh, switch, mirror, _running) = about_to_go_backwards().await;
    let old_index = mirror.index();

    // The RC tree's re-read is slow: until it lands, the mirror's index is the old store's.
    switch.slow_lists(Some("replication_controllers/"));
    *switch.inner.write().unwrap() = fresh.store.clone();
    old.store
        .put("labels/node/old", b"{}", Cas::Any)
        .await
        .unwrap();
    eventually(|| mirror.get("labels/node/new").is_some()).await;
    // The node labels' next read (not a fresh one) has begun: a write ends it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    fresh
        .store
        .put("labels/node/b", b"{}", Cas::Any)
        .await
        .unwrap();
    eventually(|| mirror.get("labels/node/b").is_some()).await;
    switch.slow_lists(None);
    assert_converges(&mirror, fresh.store.as_ref()).await;
    assert!(mirror.index() < old_index);

    let trees = node_labels_held_behind_the_rcs(&switch, fresh.store.as_ref(), &mirror).await;
    let caught_up = mirror.catch_up(&trees, Duration::from_millis(500)).await;

    assert!(
        !caught_up || mirror.get("labels/node/c").is_some(),
        "caught up through {} without labels/node/c",
        mirror.listed_index(&trees)
    );
    switch.hold_watches(None);
}

/// The farms' world is built from no tree still holding the old store's entries once the
/// store went backwards, and catches the trees up with each other again from the fresh
/// store's indexes: before, the trees' catch-up was remembered at the old store's index,
/// above every index of the fresh one, so the world came at once, the old store's node
/// labels in it, and no later world waited for its trees to catch up with each other.
#[tokio::test]
async fn the_farms_world_holds_nothing_of_a_store_that_went_backwards() {
    let (old, fresh, switch, mirror, _running) = about_to_go_backwards().await;
    let mut trees = Trees::new(mirror.clone());
    assert!(trees.world().await.nodes.items.contains_key("old"));

    // The node labels' re-read is slow: until it lands, the tree holds the old store's.
    switch.slow_lists(Some("labels/node/"));
    *switch.inner.write().unwrap() = fresh.store.clone();
    old.store
        .put("replication_controllers/old0", b"{}", Cas::Any)
        .await
        .unwrap();
    eventually(|| {
        let loading = mirror.health().loading;
        loading.contains(&"labels/node/".to_owned()) && loading.len() == 1
    })
    .await;
    let (world, ()) = tokio::join!(trees.world(), async {
        tokio::task::yield_now().await;
        switch.slow_lists(None);
    });

    let nodes: Vec<&String> = world.nodes.items.keys().collect();
    assert_eq!(
        nodes,
        ["new"],
        "the world holds the old store's node labels"
    );
}

/// After the store went backwards, the farms' world catches the trees up with each other
/// again however high the fresh store's indexes are: here the fresh store's newest change
/// of the trees (a lock, at the very index the old store's trees were caught up to) is
/// listed while the node label written before it is not yet. Before, the caught-up point
/// was reset only when the trees' newest change went down, so it stayed at the old store's,
/// and the world came at once, holding the lock without the node label.
#[tokio::test]
async fn after_the_store_went_backwards_the_farms_world_catches_up_at_any_fresh_index() {
    let (old, fresh) = (sqlite().await, sqlite().await);
    old.store
        .put("labels/node/old", b"{}", Cas::Any)
        .await
        .unwrap();
    for _ in 0..10 {
        old.store.put("lock/old", b"", Cas::Any).await.unwrap();
    }
    let switch = Switchable::new(old.store.clone());
    let (mirror, _running) = started(switch.clone(), config()).await;
    assert_converges(&mirror, old.store.as_ref()).await;
    let mut trees = Trees::new(mirror.clone());
    assert!(trees.world().await.locks.items.contains_key("lock/old"));
    // What that world's trees were caught up to: the old store's newest change of them.
    let caught_up = mirror.changed_index(&Tree::ALL);

    // The fresh store, written elsewhere up to just below that index.
    let index_of = async |key: &str| fresh.store.get(key).await.unwrap().unwrap().modify_index;
    loop {
        fresh.store.put("elsewhere", b"", Cas::Any).await.unwrap();
        if index_of("elsewhere").await + 2 >= caught_up {
            break;
        }
    }
    assert_eq!(index_of("elsewhere").await + 2, caught_up);

    // The store goes backwards; the lock tree's re-read is slow.
    switch.slow_lists(Some("lock/"));
    turn_to_fresh(&switch, &old, &fresh).await;
    eventually(|| mirror.health().loading == ["lock/"]).await;
    // A node label, which its watch holds back, then a lock, which the lock tree's re-read
    // takes in.
    switch.hold_watches(Some("labels/node/"));
    fresh
        .store
        .put("labels/node/a", b"{}", Cas::Any)
        .await
        .unwrap();
    fresh.store.put("lock/b", b"", Cas::Any).await.unwrap();
    assert_eq!(index_of("lock/b").await, caught_up);
    switch.slow_lists(None);
    eventually(|| mirror.get("lock/b").is_some()).await;
    let (world, ()) = tokio::join!(trees.world(), async {
        tokio::task::yield_now().await;
        switch.hold_watches(None);
    });

    assert!(
        !world.locks.items.contains_key("lock/b") || world.nodes.items.contains_key("a"),
        "the world holds lock/b (at {caught_up}) without labels/node/a, written before it"
    );
}

/// A farms' world waiting on a tree out of touch with the store (its watch failing) is
/// built from trees all read again once the store went backwards during the wait: here
/// the store goes backwards while the world asks it for that tree's index, the tree is
/// read again from the fresh store and the other trees too, but for the node labels,
/// whose re-read is slow. Before, the world was built once that tree had caught up, and
/// held the old store's node labels beside the fresh store's other trees.
#[tokio::test]
async fn a_farms_world_holds_nothing_of_a_store_that_went_backwards_while_it_waited() {
    let (old, fresh, switch, mirror, _running) = about_to_go_backwards().await;
    let mut trees = Trees::new(mirror.clone());
    assert!(trees.world().await.nodes.items.contains_key("old"));
    // Every tree holds every change up to the newest, as after an answer of the API's.
    assert!(mirror.catch_up(&Tree::ALL, PATIENCE).await);

    // The pod labels' watch fails.
    let pod_labels = Tree::Labels(LabelType::Pod);
    switch.panic_on(Some("labels/pod/"));
    old.store
        .put("labels/pod/n/p", b"{}", Cas::Any)
        .await
        .unwrap();
    eventually(|| !mirror.out_of_touch_among(&[pod_labels]).is_empty()).await;
    // The next world asks the store for their index, which is slow to answer.
    *switch.slow_keys.lock().unwrap() = Some("labels/pod/".to_owned());
    let next = tokio::spawn(async move { trees.world().await });
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Meanwhile the store goes backwards: every tree is read again, the node labels
    // slowly.
    switch.panic_on(None);
    switch.slow_lists(Some("labels/node/"));
    turn_to_fresh(&switch, &old, &fresh).await;
    eventually(|| mirror.health().loading == ["labels/node/"]).await;
    *switch.slow_keys.lock().unwrap() = None;
    // It may wait for the node labels to be read again, as long as their re-read is slow.
    let mut next = std::pin::pin!(next);
    let waited = tokio::time::timeout(Duration::from_secs(1), &mut next).await;
    switch.slow_lists(None);
    let world = match waited {
        Ok(world) => world.unwrap(),
        Err(_) => next.await.unwrap(),
    };

    let nodes: Vec<&String> = world.nodes.items.keys().collect();
    assert_eq!(
        nodes,
        ["new"],
        "the world holds the old store's node labels"
    );
}

/// A farm write whose answer is lost (the connection cut mid-body once the agent applied
/// it) may have landed: the farms' next world holds what the store holds, the write
/// included, however late the watches deliver it. Before, the next world came at once
/// from the trees as they were, as no listing had moved, and a farm would plan again
/// without the write it may have made: a pod placed again, on another node.
#[tokio::test]
async fn after_a_farm_write_of_unknown_outcome_the_next_world_holds_what_the_store_holds() {
    let fake = fake_consul::start().await;
    let url = format!("consul://{}", fake.addr).parse().unwrap();
    let store = open_store(&url, ConsulOptions::default()).await.unwrap();
    let switch = Switchable::new(store.clone());
    let (mirror, _running) = started(switch.clone(), config()).await;
    let session = (store.create_session(&SessionSpec::deleting("farms", Duration::from_secs(60))))
        .await
        .unwrap();
    assert!(store.acquire(LEADER_LOCK, b"", &session).await.unwrap());
    let term = Term {
        leader_session: session.clone(),
        session,
        cancel: CancellationToken::new(),
    };
    let writes = OwnWrites::wrap(store.clone(), mirror.clone());
    let ctx = FarmContext::new(writes, &term, Arc::new(Alerter::new(None)), "me".into());
    let mut trees = Trees::new(mirror.clone());
    eventually(|| mirror.get(LEADER_LOCK).is_some()).await;
    trees.world().await;

    // Every tree's watch is slow to deliver; the write's answer is lost once it is applied.
    switch.hold_watches(Some(""));
    fake.cut_answers.cut(true);
    let intent = TxnOp::Set {
        key: "intent/n1/hello".into(),
        value: b"{}".to_vec(),
    };
    let written = ctx.commit(LEADER_LOCK, vec![intent]).await;
    fake.cut_answers.cut(false);
    assert!(
        matches!(
            written,
            Err(FarmError::Store(StoreError::OutcomeUnknown(_)))
        ),
        "{written:?}"
    );
    let (world, ()) = tokio::join!(trees.world(), async {
        tokio::task::yield_now().await;
        switch.hold_watches(None);
    });

    assert!(
        world.intent(&pod_key("n1", "hello")).is_some(),
        "the world lacks the write of unknown outcome"
    );
}

/// Catching up waits for a tree whose watch has yet to deliver another writer's change from
/// below the newest index of the trees asked for.
#[tokio::test]
async fn catching_up_waits_for_a_tree_whose_watch_has_yet_to_deliver() {
    let store = sqlite().await;
    let switch = Switchable::new(store.store.clone());
    let (mirror, _running) = started(switch.clone(), config()).await;
    let trees = node_labels_held_behind_the_rcs(&switch, store.store.as_ref(), &mirror).await;
    let caught_up = mirror.catch_up(&trees, Duration::from_millis(500)).await;
    assert!(!caught_up && mirror.get("labels/node/c").is_none());
    switch.hold_watches(None);
    assert!(mirror.catch_up(&trees, Duration::from_secs(5)).await);
    assert!(mirror.get("labels/node/c").is_some());
}

/// On Consul a tree that holds nothing lists at the KV table's index, which every write
/// anywhere moves, while its blocking read, woken only by its own changes, may wait out its
/// whole wait (a minute): catching it up with a write elsewhere (an answer made of it and
/// the tree written, or any tree after a write of unknown outcome) has that read asked
/// again rather than waited out.
#[tokio::test]
async fn catching_up_a_tree_that_holds_nothing_with_a_write_elsewhere_does_not_wait_out_its_read() {
    let fake = fake_consul::start().await;
    fake.empty_reads.lazy(true);
    let url = format!("consul://{}", fake.addr).parse().unwrap();
    let store = open_store(&url, ConsulOptions::default()).await.unwrap();
    // Blocking reads of a minute, as served; a short pacing, so that each tree's blocking
    // read is under way well within the pause below.
    let config = MirrorConfig {
        min_reread_interval: Duration::from_millis(20),
        ..MirrorConfig::default()
    };
    let (mirror, _running) = started(store.clone(), config).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let written = put_and_get(store.as_ref(), "replication_controllers/x", b"{}").await;
    eventually(|| mirror.listed_index(&[Tree::Rcs]) >= written.modify_index).await;
    let trees = [Tree::Rolls, Tree::Rcs];
    assert!(
        mirror.catch_up(&trees, PATIENCE).await,
        "the rolls, which hold nothing, never caught up with the RCs"
    );

    store.put("elsewhere", b"", Cas::Any).await.unwrap();
    mirror.note_unsure_write();
    assert!(
        mirror.settle(&[Tree::DaemonSets], PATIENCE).await,
        "the daemon sets, which hold nothing, never caught up with the store"
    );
}

/// An answer read through the mirror one tree at a time (as `list_pods` reads intents, then
/// pod labels, then health) takes the highest listing index as its `X-Index`: no listing
/// claims more than the trees held when the reader was made, or a tree listed early could
/// miss a change that a later listing's index claims.
#[tokio::test]
async fn an_answer_read_tree_by_tree_claims_no_index_its_first_listing_lacks() {
    use p2_apiserver::state::MirrorReader;
    let backend = sqlite().await;
    let store = backend.store.clone();
    store.put("intent/node1/a", b"{}", Cas::Any).await.unwrap();
    store
        .put("labels/pod/node1/a", b"{}", Cas::Any)
        .await
        .unwrap();
    let (mirror, _running) = started(store.clone(), config()).await;
    assert_converges(&mirror, store.as_ref()).await;
    let trees = [Tree::Intent, Tree::Labels(LabelType::Pod)];
    assert!(mirror.catch_up(&trees, PATIENCE).await);

    let reader = MirrorReader::answering(mirror.clone(), &trees);
    let intents = reader.list("intent/").await.unwrap();
    // Another writer, between the handler's two listings: an intent, then a pod label.
    let intent_b = put_and_get(store.as_ref(), "intent/node1/b", b"{}")
        .await
        .modify_index;
    store
        .put("labels/pod/node1/b", b"{}", Cas::Any)
        .await
        .unwrap();
    assert_converges(&mirror, store.as_ref()).await;
    assert!(mirror.catch_up(&trees, PATIENCE).await);
    let labels = reader.list("labels/pod/").await.unwrap();

    let x_index = intents.index.max(labels.index);
    let shown = intents
        .pairs
        .iter()
        .any(|pair| pair.key == "intent/node1/b");
    assert!(
        x_index < intent_b || shown,
        "X-Index {x_index} claims intent/node1/b (at {intent_b}) but the answer's intents lack it"
    );
}

/// A reader's probe in flight while the store goes backwards marks no tree as holding the
/// old store's index once the tree has been read whole again.
#[tokio::test]
async fn a_probe_across_a_resync_marks_nothing_of_the_old_store() {
    let (old, fresh, switch, mirror, _running) = about_to_go_backwards().await;
    let trees = [Tree::Rcs, Tree::Labels(LabelType::Node)];

    // A change to the RCs: the node labels are behind it until a reader probes them; the
    // probe is slow.
    let late = put_and_get(old.store.as_ref(), "replication_controllers/late", b"{}")
        .await
        .modify_index;
    eventually(|| mirror.listed_index(&[Tree::Rcs]) >= late).await;
    *switch.slow_keys.lock().unwrap() = Some("labels/node/".to_owned());
    let probing = tokio::spawn({
        let mirror = mirror.clone();
        async move { mirror.catch_up(&trees, PATIENCE).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The store goes backwards; every tree is read again from the fresh one.
    *switch.inner.write().unwrap() = fresh.store.clone();
    old.store
        .put("labels/node/old", b"{}", Cas::Any)
        .await
        .unwrap();
    eventually(|| mirror.get("labels/node/new").is_some()).await;
    assert_converges(&mirror, fresh.store.as_ref()).await;
    // The probe answers now, from the fresh store.
    *switch.slow_keys.lock().unwrap() = None;
    let _ = probing.await.unwrap();

    let trees = node_labels_held_behind_the_rcs(&switch, fresh.store.as_ref(), &mirror).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let claimed = mirror.claimable_index(&trees);
    let has_c = mirror.get("labels/node/c").is_some();
    switch.hold_watches(None);
    assert!(
        has_c
            || claimed
                < fresh
                    .store
                    .get("labels/node/c")
                    .await
                    .unwrap()
                    .unwrap()
                    .modify_index,
        "claims {claimed} without labels/node/c"
    );
}

/// A tree's whole listing answered before the store went backwards but taken in after (a
/// large one is decoded meanwhile) is of the store as it was: it does not count as the
/// tree's read again. Here the store goes backwards twice, and the node labels' listing of
/// the second store, answered, is stalled while the store goes backwards again. Before,
/// it was taken in all the same: the tree held the second store's node label, counted as
/// read again (no longer loading), beside trees read from the third, and the farms' world
/// and the API's reads took it as the store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listing_answered_before_the_store_went_backwards_is_not_taken_in_after() {
    let old = holding("old", 50).await;
    // The second store, at indexes below the first's and above the third's.
    let (middle, fresh) = (holding("middle", 20).await, sqlite().await);
    let (switch, mirror, _running) = behind_a_switch(&old, &fresh, config()).await;

    // The store goes backwards: the node labels' listing of the second store, once
    // answered, is stalled.
    *switch.stalled_lists.lock().unwrap() = Some("labels/node/".into());
    turn_to_fresh(&switch, &old, &middle).await;
    eventually(|| {
        switch.stalling_a_list.load(Ordering::SeqCst) && mirror.health().loading == ["labels/node/"]
    })
    .await;

    // It goes backwards again (the RCs' re-read is slow, so that the mirror is seen reading
    // every tree again), and the node labels' next listing is held.
    switch.slow_lists(Some("replication_controllers/"));
    *switch.held_lists.lock().unwrap() = Some("labels/node/".into());
    *switch.inner.write().unwrap() = fresh.store.clone();
    middle
        .store
        .put("replication_controllers/middle0", b"{}", Cas::Any)
        .await
        .unwrap();
    eventually(|| {
        let loading = mirror.health().loading;
        loading.contains(&"replication_controllers/".to_owned())
    })
    .await;
    // The stalled listing comes back to the node labels' watch, which reads them again.
    *switch.stalled_lists.lock().unwrap() = None;
    eventually(|| switch.holding_a_list.load(Ordering::SeqCst)).await;

    let loading = mirror.health().loading;
    let holds_middle = mirror.get("labels/node/middle").is_some();
    *switch.held_lists.lock().unwrap() = None;
    switch.slow_lists(None);
    assert!(
        loading.contains(&"labels/node/".to_owned()) && !holds_middle,
        "the node labels count as read again (loading: {loading:?}), holding the second \
         store's labels/node/middle: {holds_middle}"
    );
    assert_converges(&mirror, fresh.store.as_ref()).await;
}

/// A store gone backwards that two trees' watches see at once has every tree read again
/// once: the second tree's probe of the store answers after the first tree had every tree
/// read again, and that tree alone is read again (its watch's read was of the old store).
/// Before, each tree that saw the fall had every tree read whole again, and every change
/// stream's subscriber start again, as many times as trees saw it.
#[tokio::test]
async fn a_store_going_backwards_seen_by_two_trees_is_read_again_once() {
    // Only the trees woken below find the fall: the others wait on the old store until
    // every tree is read again, and the heartbeat never comes.
    let config = MirrorConfig {
        watch_wait: Duration::from_secs(600),
        heartbeat_interval: Duration::from_secs(600),
        ..config()
    };
    let (old, fresh, switch, mirror, _running) = about_to_go_backwards_with(config).await;
    let health = Tree::Health.prefix();
    let listings_of_health = || {
        let listed = switch.listed.lock().unwrap();
        listed.iter().filter(|prefix| **prefix == health).count()
    };
    let before = listings_of_health();

    // The RCs' and the node labels' watches come back and find the store's index lower;
    // their probes of the store wait.
    switch.gated_probes.store(true, Ordering::SeqCst);
    *switch.inner.write().unwrap() = fresh.store.clone();
    let ops = [
        TxnOp::Set {
            key: "replication_controllers/old0".into(),
            value: b"{}".to_vec(),
        },
        TxnOp::Set {
            key: "labels/node/old".into(),
            value: b"{}".to_vec(),
        },
    ];
    old.store.txn(&ops).await.unwrap();
    eventually(|| switch.probes_waiting.load(Ordering::SeqCst) == 2).await;

    // One probe answers: every tree is read again, but the other prober's.
    switch.probe_permits.add_permits(1);
    eventually(|| mirror.health().loading.len() == 1).await;
    assert_eq!(listings_of_health(), before + 1);
    // The other answers: its tree is read again.
    switch.probe_permits.add_permits(1);
    eventually(|| mirror.health().loading.is_empty()).await;

    assert_eq!(
        listings_of_health() - before,
        1,
        "the health results were read whole again once per tree that saw the fall"
    );
    assert_converges(&mirror, fresh.store.as_ref()).await;
}

/// The server's own blocking watches of Consul (one per tree its mirror follows, one for
/// its election) each hold a connection for a whole wait. Given the fewest connections its
/// flag accepts, a server must still keep them all open at once: a watch left waiting for
/// a connection that the others hold for their whole waits goes unanswered past its own,
/// so on an idle store its tree counts as lost (`/readyz` fails, the farms wait on the
/// store for it) and the election's watch fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_given_the_fewest_consul_connections_keeps_every_watch_open() {
    let serve = |connections: usize| {
        let argv = ["p2-apiserver", "--consul-max-connections"];
        let argv = argv
            .into_iter()
            .map(str::to_owned)
            .chain([connections.to_string()]);
        match Cli::try_parse_from(argv).map(Cli::into_command) {
            Ok(Command::Serve(args)) => Some(args),
            _ => None,
        }
    };
    let args = (1..).find_map(serve).unwrap();
    let fake = fake_consul::start().await;
    let url = format!("consul://{}", fake.addr).parse().unwrap();
    let store = open_store(&url, args.consul.options()).await.unwrap();
    let wait = Duration::from_secs(4);
    let config = MirrorConfig {
        watch_wait: wait,
        lost_after: Duration::ZERO,
        ..MirrorConfig::default()
    };
    let (mirror, running) = started(store.clone(), config).await;
    let election = LeaderConfig {
        holder: "a".into(),
        session_ttl: Duration::from_secs(10),
        lock_delay: Duration::ZERO,
        behavior: SessionBehavior::Delete,
    };
    let idle = |term: Term| async move { term.cancel.cancelled().await };
    let campaign = leader::campaign(store, election, || Ok(()), running.cancel.clone(), idle);
    running.tasks.spawn(campaign);

    // Several waits of every tree on an idle store: none goes unanswered past its wait.
    let until = tokio::time::Instant::now() + 5 * wait;
    while tokio::time::Instant::now() < until {
        let lost = mirror.health().lost;
        assert!(lost.is_empty(), "watches went unanswered: {lost:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
