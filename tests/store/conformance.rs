//! The store conformance suite: the same checks against every backend.
//!
//! `cargo test conformance` runs exactly these. The SQLite backend always runs, and so does
//! the Consul client against the fake agent of `support/fake_consul.rs`; the Consul backend
//! runs when `CONSUL_HTTP_ADDR` is set (for example `127.0.0.1:8500`) and is skipped
//! with a printed reason otherwise. Every test works under its own random key prefix, so the
//! suite can share one Consul with other users.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::fake_consul;

use p2_apiserver::kv::consul::ConsulConfig;
use p2_apiserver::kv::{
    open_store, Cas, ConsulOptions, KvPair, KvStore, Listing, PrefixUpdate, SessionBehavior,
    SessionSpec, StoreError, StoreUrl, TxnOp, WatchTarget, MAX_TXN_BYTES, MAX_TXN_OPS,
    MAX_VALUE_BYTES,
};

/// A backend under test, with a key prefix of its own.
struct Subject {
    store: Arc<dyn KvStore>,
    prefix: String,
    _dir: Option<tempfile::TempDir>,
}

impl Subject {
    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// A new session with a 10s TTL, its ID.
    async fn session(&self, name: &str, behavior: SessionBehavior, lock_delay: Duration) -> String {
        self.store
            .create_session(&spec(name, behavior, lock_delay))
            .await
            .unwrap()
    }

    /// A session of each behavior, each holding a lock under `dir/`: the releasing one's key
    /// and session, then the deleting one's.
    async fn lock_per_behavior(&self, dir: &str) -> [(String, String); 2] {
        let released = self.key(&format!("{dir}/release"));
        let deleted = self.key(&format!("{dir}/delete"));
        let r = self
            .session("r", SessionBehavior::Release, Duration::ZERO)
            .await;
        let d = self
            .session("d", SessionBehavior::Delete, Duration::ZERO)
            .await;
        assert!(self.store.acquire(&released, b"r", &r).await.unwrap());
        assert!(self.store.acquire(&deleted, b"d", &d).await.unwrap());
        [(released, r), (deleted, d)]
    }
}

fn prefix() -> String {
    format!("conformance/{}/", uuid::Uuid::new_v4())
}

async fn sqlite() -> Option<Subject> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db").display().to_string();
    let store = open_store(&StoreUrl::Sqlite { path }, ConsulOptions::default())
        .await
        .unwrap();
    Some(Subject {
        store,
        prefix: prefix(),
        _dir: Some(dir),
    })
}

/// The real Consul client against the fake agent, so every check runs through its HTTP paths.
async fn consul_fake() -> Option<Subject> {
    let fake = fake_consul::start().await;
    let url = format!("consul://{}", fake.addr).parse().unwrap();
    let store = open_store(&url, ConsulOptions::default()).await.unwrap();
    Some(Subject {
        store,
        prefix: prefix(),
        _dir: Some(fake.dir),
    })
}

async fn consul() -> Option<Subject> {
    let Some(config) = ConsulConfig::from_env() else {
        static NOTICE: std::sync::Once = std::sync::Once::new();
        // Written past the test harness's capture so that the skip is always visible.
        NOTICE.call_once(|| {
            let _ = writeln!(
                std::io::stderr(),
                "conformance: skipping the Consul backend: CONSUL_HTTP_ADDR is not set"
            );
        });
        return None;
    };
    let config = config.unwrap_or_else(|why| panic!("{why}"));
    let options = ConsulOptions {
        token: config.token,
        datacenter: None,
        ..ConsulOptions::default()
    };
    let url = StoreUrl::Consul {
        base_url: config.base_url,
    };
    let store = open_store(&url, options).await.unwrap();
    Some(Subject {
        store,
        prefix: prefix(),
        _dir: None,
    })
}

fn is_conflict<T: std::fmt::Debug>(result: Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::Conflict { .. }))
}

fn spec(name: &str, behavior: SessionBehavior, lock_delay: Duration) -> SessionSpec {
    SessionSpec {
        name: name.into(),
        ttl: Duration::from_secs(10),
        lock_delay,
        behavior,
    }
}

async fn create_only_cas(s: Subject) {
    let key = s.key("create-only");
    s.store.put(&key, b"first", Cas::Index(0)).await.unwrap();
    assert!(is_conflict(
        s.store.put(&key, b"second", Cas::Index(0)).await
    ));
    let pair = s.store.get(&key).await.unwrap().unwrap();
    assert_eq!(&*pair.value, b"first");
    assert_eq!(pair.create_index, pair.modify_index);
}

async fn cas_stale_and_fresh(s: Subject) {
    let key = s.key("cas");
    s.store.put(&key, b"v1", Cas::Any).await.unwrap();
    let first = s.store.get(&key).await.unwrap().unwrap();
    s.store
        .put(&key, b"v2", Cas::Index(first.modify_index))
        .await
        .unwrap();
    let second = s.store.get(&key).await.unwrap().unwrap();
    assert!(second.modify_index > first.modify_index);
    assert_eq!(second.create_index, first.create_index);
    assert!(is_conflict(
        s.store
            .put(&key, b"stale", Cas::Index(first.modify_index))
            .await
    ));
    assert_eq!(&*s.store.get(&key).await.unwrap().unwrap().value, b"v2");
}

async fn delete_cas(s: Subject) {
    let key = s.key("delete-cas");
    s.store.put(&key, b"v1", Cas::Any).await.unwrap();
    let first = s.store.get(&key).await.unwrap().unwrap();
    s.store.put(&key, b"v2", Cas::Any).await.unwrap();
    assert!(is_conflict(
        s.store.delete(&key, Cas::Index(first.modify_index)).await
    ));
    let current = s.store.get(&key).await.unwrap().unwrap();
    assert_eq!(&*current.value, b"v2");
    s.store
        .delete(&key, Cas::Index(current.modify_index))
        .await
        .unwrap();
    assert_eq!(s.store.get(&key).await.unwrap(), None);
    // A plain delete of an absent key is not an error.
    s.store.delete(&key, Cas::Any).await.unwrap();
}

async fn txn_all_or_nothing(s: Subject) {
    let existing = s.key("txn/existing");
    s.store.put(&existing, b"old", Cas::Any).await.unwrap();
    let ops = vec![
        TxnOp::Set {
            key: s.key("txn/a"),
            value: b"a".to_vec(),
        },
        TxnOp::Set {
            key: existing.clone(),
            value: b"new".to_vec(),
        },
        TxnOp::Delete {
            key: s.key("txn/b"),
        },
        TxnOp::Cas {
            key: s.key("txn/c"),
            value: b"c".to_vec(),
            index: 999_999_999,
        },
        TxnOp::Set {
            key: s.key("txn/d"),
            value: b"d".to_vec(),
        },
    ];
    match s.store.txn(&ops).await {
        Err(StoreError::Conflict { failures, .. }) => {
            assert_eq!(failures.len(), 1, "{failures:?}");
            assert_eq!(failures[0].op_index, 3);
            assert!(!failures[0].what.is_empty());
        }
        other => panic!("expected a rollback, got {other:?}"),
    }
    let listing = s.store.list(&s.key("txn/")).await.unwrap();
    assert_eq!(listing.pairs.len(), 1, "{:?}", listing.pairs);
    assert_eq!(&*listing.pairs[0].value, b"old");

    // The same ops without the failing one all apply, with results lined up.
    let mut ops = ops;
    ops.remove(3);
    ops.push(TxnOp::Get {
        key: existing.clone(),
    });
    let results = s.store.txn(&ops).await.unwrap();
    assert_eq!(results.len(), ops.len());
    assert!(results[2].is_none(), "a delete answers nothing");
    assert_eq!(&*results[4].as_ref().unwrap().value, b"new");
    let keys = s.store.keys(&s.key("txn/"), None).await.unwrap().1;
    assert_eq!(keys, vec![s.key("txn/a"), s.key("txn/d"), existing]);
}

async fn txn_limits(s: Subject) {
    let ops: Vec<TxnOp> = (0..=MAX_TXN_OPS)
        .map(|i| TxnOp::Set {
            key: s.key(&format!("limits/{i}")),
            value: vec![],
        })
        .collect();
    assert!(matches!(
        s.store.txn(&ops).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(s.store.txn(&ops[..MAX_TXN_OPS]).await.is_ok());
    s.store.delete_prefix(&s.key("limits/")).await.unwrap();
    assert!(s
        .store
        .list(&s.key("limits/"))
        .await
        .unwrap()
        .pairs
        .is_empty());
}

/// Consul refuses a transaction whose body passes 512 KiB, however small each value is, so
/// every backend refuses it too, writing nothing; one just under the limit commits.
async fn txn_size_limit(s: Subject) {
    let ops_of = |each: usize| -> Vec<TxnOp> {
        (0..4)
            .map(|i| TxnOp::Set {
                key: s.key(&format!("size/{i}")),
                value: vec![b'x'; each],
            })
            .collect()
    };
    // Four values of 100 KiB are 533 KiB in base64: each fits, together they do not.
    let result = s.store.txn(&ops_of(100 * 1024)).await.map(|r| r.len());
    assert!(matches!(result, Err(StoreError::Invalid(_))), "{result:?}");
    assert!(s
        .store
        .list(&s.key("size/"))
        .await
        .unwrap()
        .pairs
        .is_empty());
    let fits = MAX_TXN_BYTES / 4 / 4 * 3 - 1024;
    s.store.txn(&ops_of(fits)).await.unwrap();
    s.store.delete_prefix(&s.key("size/")).await.unwrap();
}

async fn bad_keys_and_values_write_nothing(s: Subject) {
    let big = vec![b'x'; MAX_VALUE_BYTES + 1];
    let key = s.key("big");
    assert!(matches!(
        s.store.put(&key, &big, Cas::Any).await,
        Err(StoreError::Invalid(_))
    ));
    let ops = vec![
        TxnOp::Set {
            key: s.key("ok"),
            value: b"1".to_vec(),
        },
        TxnOp::Set {
            key: key.clone(),
            value: big,
        },
    ];
    assert!(matches!(
        s.store.txn(&ops).await,
        Err(StoreError::Invalid(_))
    ));
    for bad in ["a//b", "a/../b", "a/./b", "a/\u{1}"] {
        let result = s.store.put(&s.key(bad), b"v", Cas::Any).await;
        assert!(
            matches!(result, Err(StoreError::Invalid(_))),
            "{bad:?}: {result:?}"
        );
    }
    assert!(s.store.list(&s.prefix).await.unwrap().pairs.is_empty());
}

async fn listing_and_separator(s: Subject) {
    for name in ["tree/a/1", "tree/a/2", "tree/b", "treetop"] {
        s.store
            .put(&s.key(name), name.as_bytes(), Cas::Any)
            .await
            .unwrap();
    }
    let listing = s.store.list(&s.key("tree/")).await.unwrap();
    let keys: Vec<_> = listing.pairs.iter().map(|p| p.key.clone()).collect();
    assert_eq!(
        keys,
        vec![s.key("tree/a/1"), s.key("tree/a/2"), s.key("tree/b")]
    );
    assert_eq!(
        listing.index,
        listing.pairs.iter().map(|p| p.modify_index).max().unwrap()
    );
    let (_, keys) = s.store.keys(&s.key("tree/"), Some('/')).await.unwrap();
    assert_eq!(keys, vec![s.key("tree/a/"), s.key("tree/b")]);
}

/// 20 writers race a CAS on one key for several rounds: exactly one wins each round.
async fn concurrent_cas_one_winner_per_round(s: Subject) {
    let key = s.key("race");
    s.store.put(&key, b"0", Cas::Any).await.unwrap();
    for round in 0..5 {
        let index = s.store.get(&key).await.unwrap().unwrap().modify_index;
        let wins = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for writer in 0..20 {
            let (store, key, wins) = (s.store.clone(), key.clone(), wins.clone());
            tasks.push(tokio::spawn(async move {
                let value = format!("{round}-{writer}");
                match store.put(&key, value.as_bytes(), Cas::Index(index)).await {
                    Ok(()) => {
                        wins.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(StoreError::Conflict { .. }) => {}
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(wins.load(Ordering::SeqCst), 1, "round {round}");
    }
}

/// 16 tasks each add 1 to a counter 50 times through CAS-retry: no update is lost.
async fn counter_with_cas_retry(s: Subject) {
    let key = s.key("counter");
    s.store.put(&key, b"0", Cas::Index(0)).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (store, key) = (s.store.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                loop {
                    let pair = store.get(&key).await.unwrap().unwrap();
                    let n: u64 = std::str::from_utf8(&pair.value).unwrap().parse().unwrap();
                    let next = (n + 1).to_string();
                    match store
                        .put(&key, next.as_bytes(), Cas::Index(pair.modify_index))
                        .await
                    {
                        Ok(()) => break,
                        Err(StoreError::Conflict { .. }) => continue,
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let pair = s.store.get(&key).await.unwrap().unwrap();
    assert_eq!(&*pair.value, b"800");
}

async fn lock_exclusivity(s: Subject) {
    let key = s.key("lock");
    let a = s
        .session("a", SessionBehavior::Release, Duration::ZERO)
        .await;
    let b = s
        .session("b", SessionBehavior::Release, Duration::ZERO)
        .await;
    assert!(s.store.acquire(&key, b"a", &a).await.unwrap());
    assert!(!s.store.acquire(&key, b"b", &b).await.unwrap());
    assert!(!s.store.release(&key, &b).await.unwrap());
    // Re-acquiring by the holder succeeds without a new lock generation.
    let held = s.store.get(&key).await.unwrap().unwrap();
    assert!(s.store.acquire(&key, b"a2", &a).await.unwrap());
    let again = s.store.get(&key).await.unwrap().unwrap();
    assert_eq!(again.lock_index(), held.lock_index());
    assert_eq!(again.session(), Some(a.as_str()));
    // A txn lock by the other session rolls back; check-session passes only for the holder.
    let ops = [TxnOp::Lock {
        key: key.clone(),
        value: b"b".to_vec(),
        session: b.clone(),
    }];
    assert!(is_conflict(s.store.txn(&ops).await));
    let check = [TxnOp::CheckSession {
        key: key.clone(),
        session: b.clone(),
    }];
    assert!(is_conflict(s.store.txn(&check).await));
    let check = [TxnOp::CheckSession {
        key: key.clone(),
        session: a.clone(),
    }];
    s.store.txn(&check).await.unwrap();
    // Once released, the other session takes it.
    assert!(s.store.release(&key, &a).await.unwrap());
    assert!(s.store.acquire(&key, b"b", &b).await.unwrap());
    let taken = s.store.get(&key).await.unwrap().unwrap();
    assert_eq!(taken.session(), Some(b.as_str()));
    assert_eq!(taken.lock_index(), held.lock_index() + 1);
    let unlock = [TxnOp::Unlock {
        key: key.clone(),
        value: b"free".to_vec(),
        session: b.clone(),
    }];
    s.store.txn(&unlock).await.unwrap();
    assert_eq!(s.store.get(&key).await.unwrap().unwrap().session(), None);
    s.store.destroy_session(&a).await.unwrap();
    s.store.destroy_session(&b).await.unwrap();
}

async fn session_lifecycle(s: Subject) {
    let spec = spec("life", SessionBehavior::Delete, Duration::from_secs(1));
    let id = s.store.create_session(&spec).await.unwrap();
    let info = s.store.session_info(&id).await.unwrap().unwrap();
    assert_eq!(info.name, "life");
    assert_eq!(info.behavior, SessionBehavior::Delete);
    assert_eq!(info.ttl, Duration::from_secs(10));
    assert_eq!(s.store.renew_session(&id).await.unwrap().id, id);
    s.store.destroy_session(&id).await.unwrap();
    assert_eq!(s.store.session_info(&id).await.unwrap(), None);
    assert!(matches!(
        s.store.renew_session(&id).await,
        Err(StoreError::NotFound(_))
    ));
    let gone = s.store.acquire(&s.key("life"), b"v", &id).await;
    assert!(matches!(gone, Err(StoreError::NotFound(_))), "{gone:?}");
    let too_short = SessionSpec {
        ttl: Duration::from_secs(5),
        ..spec.clone()
    };
    assert!(matches!(
        s.store.create_session(&too_short).await,
        Err(StoreError::Invalid(_))
    ));
    let too_long = SessionSpec {
        ttl: Duration::from_secs(86_401),
        ..spec
    };
    assert!(matches!(
        s.store.create_session(&too_long).await,
        Err(StoreError::Invalid(_))
    ));
}

/// Consul reads a lock-delay under a microsecond as that many seconds (a client sending 5
/// means 5s to it), so no store takes one but zero: asked for 1ns, Consul would hold the
/// session's locks for a second after it ends, and for 999ns up to its own 60s cap.
async fn sub_microsecond_lock_delays_refused(s: Subject) {
    for delay in [Duration::from_nanos(1), Duration::from_nanos(999)] {
        let result = s
            .store
            .create_session(&spec("tiny", SessionBehavior::Release, delay))
            .await;
        assert!(
            matches!(result, Err(StoreError::Invalid(_))),
            "{delay:?}: {result:?}"
        );
    }
    let id = s
        .session("micro", SessionBehavior::Release, Duration::from_micros(1))
        .await;
    // Taken, and kept: a store that counts in coarser units rounds it up, never to none.
    let info = s.store.session_info(&id).await.unwrap().unwrap();
    assert!(!info.lock_delay.is_zero(), "{info:?}");
    s.store.destroy_session(&id).await.unwrap();
}

async fn destroy_applies_behavior(s: Subject) {
    let [(released, r), (deleted, d)] = s.lock_per_behavior("behavior").await;
    s.store.destroy_session(&r).await.unwrap();
    s.store.destroy_session(&d).await.unwrap();
    let pair = s.store.get(&released).await.unwrap().unwrap();
    assert_eq!(pair.session(), None);
    assert_eq!(&*pair.value, b"r");
    assert_eq!(s.store.get(&deleted).await.unwrap(), None);
}

async fn expiry_applies_behavior(s: Subject) {
    let [(released, r), (deleted, d)] = s.lock_per_behavior("expiry").await;
    // Consul may take up to twice the TTL to expire a session.
    let give_up = Instant::now() + Duration::from_secs(35);
    while s.store.session_info(&r).await.unwrap().is_some()
        || s.store.session_info(&d).await.unwrap().is_some()
        || s.store.get(&deleted).await.unwrap().is_some()
    {
        assert!(Instant::now() < give_up, "sessions did not expire");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let pair = s.store.get(&released).await.unwrap().unwrap();
    assert_eq!(pair.session(), None);
}

async fn lock_delay_honoured(s: Subject) {
    let key = s.key("delay");
    let delay = Duration::from_secs(2);
    let a = s.session("a", SessionBehavior::Release, delay).await;
    let b = s
        .session("b", SessionBehavior::Release, Duration::ZERO)
        .await;
    assert!(s.store.acquire(&key, b"a", &a).await.unwrap());
    // The delay runs from when the store ended the session, some time after this and before
    // the call returns: an acquire answered within `delay` of this was applied within it.
    let asked = Instant::now();
    s.store.destroy_session(&a).await.unwrap();
    let taken = s.store.acquire(&key, b"b", &b).await.unwrap();
    assert!(!taken || asked.elapsed() >= delay, "lock-delay ignored");
    while !s.store.acquire(&key, b"b", &b).await.unwrap() {
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "lock never became free"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The store counts whole milliseconds.
    assert!(asked.elapsed() + Duration::from_millis(5) >= delay);
    // An explicit release applies no lock-delay.
    let c = s.session("c", SessionBehavior::Release, delay).await;
    assert!(s.store.release(&key, &b).await.unwrap());
    assert!(s.store.acquire(&key, b"c", &c).await.unwrap());
    s.store.destroy_session(&b).await.unwrap();
    s.store.destroy_session(&c).await.unwrap();
}

/// Several locks taken in one transaction: each key's lock-delay and the session are
/// checked for every lock, and one lock refused takes none.
async fn txn_locks_each_checked(s: Subject) {
    let keys: Vec<String> = (0..4).map(|i| s.key(&format!("locks/{i}"))).collect();
    let lock = |key: &String, session: &String| TxnOp::Lock {
        key: key.clone(),
        value: b"v".to_vec(),
        session: session.clone(),
    };
    let gone = s
        .session("gone", SessionBehavior::Release, Duration::from_secs(30))
        .await;
    assert!(s.store.acquire(&keys[1], b"gone", &gone).await.unwrap());
    s.store.destroy_session(&gone).await.unwrap();
    let live = s
        .session("live", SessionBehavior::Release, Duration::ZERO)
        .await;

    // The second key is in its lock-delay: nothing is taken.
    let ops: Vec<TxnOp> = keys[..3].iter().map(|k| lock(k, &live)).collect();
    match s.store.txn(&ops).await {
        Err(StoreError::Conflict { failures, .. }) => {
            let refused: Vec<usize> = failures.iter().map(|f| f.op_index).collect();
            assert_eq!(refused, [1], "{failures:?}");
        }
        other => panic!("expected the lock-delay to refuse the transaction, got {other:?}"),
    }
    // A session that ended takes nothing either, whichever key.
    let ops = vec![lock(&keys[0], &gone), lock(&keys[3], &gone)];
    match s.store.txn(&ops).await {
        Err(StoreError::Conflict { failures, .. }) => assert_eq!(failures[0].op_index, 0),
        other => panic!("expected the ended session to be refused, got {other:?}"),
    }
    for key in &keys {
        let held = s.store.get(key).await.unwrap();
        assert_eq!(held.as_ref().and_then(KvPair::session), None, "{key}");
    }

    // Without the delayed key, every lock is taken.
    let free = [&keys[0], &keys[2], &keys[3]];
    let ops: Vec<TxnOp> = free.iter().map(|k| lock(k, &live)).collect();
    s.store.txn(&ops).await.unwrap();
    for key in free {
        let held = s.store.get(key).await.unwrap().unwrap();
        assert_eq!(held.session(), Some(live.as_str()), "{key}");
    }
    s.store.destroy_session(&live).await.unwrap();
}

async fn watch_wakes_on_change(s: Subject) {
    let key = s.key("watched");
    s.store.put(&key, b"1", Cas::Any).await.unwrap();
    let index = s.store.get(&key).await.unwrap().unwrap().modify_index;
    let (store, target) = (s.store.clone(), WatchTarget::Key(key.clone()));
    let waiter = tokio::spawn(async move {
        let snapshot = store
            .watch(&target, index, Duration::from_secs(30))
            .await
            .unwrap();
        (snapshot, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.store.put(&key, b"2", Cas::Any).await.unwrap();
    let written = Instant::now();
    let (snapshot, woke) = waiter.await.unwrap();
    assert!(snapshot.index > index);
    assert_eq!(&*snapshot.pairs[0].value, b"2");
    assert!(woke.saturating_duration_since(written) < Duration::from_secs(1));
}

async fn watch_times_out_unchanged(s: Subject) {
    let key = s.key("quiet");
    s.store.put(&key, b"1", Cas::Any).await.unwrap();
    let target = WatchTarget::Prefix(s.key(""));
    let index = s.store.list(&s.key("")).await.unwrap().index;
    // Writes elsewhere do not end the wait.
    let other = format!("{}-elsewhere", s.prefix.trim_end_matches('/'));
    let store = s.store.clone();
    let noise = tokio::spawn(async move {
        for i in 0..3 {
            store
                .put(&other, i.to_string().as_bytes(), Cas::Any)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        store.delete(&other, Cas::Any).await.unwrap();
    });
    let started = Instant::now();
    let snapshot = s
        .store
        .watch(&target, index, Duration::from_secs(2))
        .await
        .unwrap();
    noise.await.unwrap();
    assert_eq!(snapshot.index, index);
    assert_eq!(snapshot.pairs.len(), 1);
    assert!(started.elapsed() >= Duration::from_millis(1500));
}

async fn prefix_watch_sees_deletes(s: Subject) {
    let prefix = s.key("dir/");
    s.store.put(&s.key("dir/a"), b"a", Cas::Any).await.unwrap();
    s.store.put(&s.key("dir/b"), b"b", Cas::Any).await.unwrap();
    let index = s.store.list(&prefix).await.unwrap().index;
    let (store, target) = (s.store.clone(), WatchTarget::Prefix(prefix.clone()));
    let waiter =
        tokio::spawn(async move { store.watch(&target, index, Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.store.delete(&s.key("dir/b"), Cas::Any).await.unwrap();
    let snapshot = waiter.await.unwrap().unwrap();
    assert!(snapshot.index > index);
    assert_eq!(snapshot.pairs.len(), 1);
    // Deleting the last key still moves the index on.
    let index = snapshot.index;
    s.store.delete_prefix(&prefix).await.unwrap();
    let target = WatchTarget::Prefix(prefix);
    let snapshot = s
        .store
        .watch(&target, index, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(snapshot.index > index);
    assert!(snapshot.pairs.is_empty());
}

/// Makes `change` while a watch on each target waits, after a write beside them that must
/// not end their wait; returns what each watch woke with, checking that its index moved.
async fn watched(
    s: &Subject,
    targets: &[&WatchTarget],
    change: impl std::future::Future<Output = ()>,
) -> Vec<Listing> {
    let mut waiters = Vec::new();
    for &target in targets {
        let index = s
            .store
            .watch(target, 0, Duration::ZERO)
            .await
            .unwrap()
            .index;
        let (store, target) = (s.store.clone(), target.clone());
        let waiter = tokio::spawn(async move {
            store
                .watch(&target, index, Duration::from_secs(30))
                .await
                .unwrap()
        });
        waiters.push((index, waiter));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.store
        .put(&s.key("tree/b/beside"), b"x", Cas::Any)
        .await
        .unwrap();
    change.await;
    let mut woke = Vec::new();
    for (index, waiter) in waiters {
        let snapshot = waiter.await.unwrap();
        assert!(snapshot.index > index, "{snapshot:?} after {index}");
        woke.push(snapshot);
    }
    woke
}

fn keys_of(listing: &Listing) -> Vec<&str> {
    listing.pairs.iter().map(|p| p.key.as_str()).collect()
}

/// Watches on a prefix and on a key under it wake for every kind of change to them: a write,
/// a delete, a deleted parent prefix, and the end of a session that held the key.
async fn watch_wakes_for_each_change_it_covers(s: Subject) {
    let prefix = WatchTarget::Prefix(s.key("tree/a/"));
    let (key, other) = (s.key("tree/a/k"), s.key("tree/a/other"));
    let key_target = WatchTarget::Key(key.clone());
    s.store.put(&other, b"o", Cas::Any).await.unwrap();

    let woke = watched(&s, &[&prefix], async {
        s.store.put(&key, b"1", Cas::Any).await.unwrap();
    })
    .await;
    assert_eq!(keys_of(&woke[0]), [key.as_str(), other.as_str()]);

    let woke = watched(&s, &[&prefix, &key_target], async {
        s.store.delete(&key, Cas::Any).await.unwrap();
    })
    .await;
    assert_eq!(keys_of(&woke[0]), [other.as_str()]);
    assert!(woke[1].pairs.is_empty());

    s.store.put(&key, b"2", Cas::Any).await.unwrap();
    let woke = watched(&s, &[&prefix, &key_target], async {
        s.store.delete_prefix(&s.key("tree/")).await.unwrap();
    })
    .await;
    assert!(woke.iter().all(|listing| listing.pairs.is_empty()));

    s.store.put(&other, b"o", Cas::Any).await.unwrap();
    let session = s
        .session("d", SessionBehavior::Delete, Duration::ZERO)
        .await;
    assert!(s.store.acquire(&key, b"held", &session).await.unwrap());
    let woke = watched(&s, &[&prefix, &key_target], async {
        s.store.destroy_session(&session).await.unwrap();
    })
    .await;
    assert_eq!(keys_of(&woke[0]), [other.as_str()]);
    assert!(woke[1].pairs.is_empty());
}

/// A prefix's index alone is the index a listing of it carries, deletes included.
async fn prefix_index_is_a_listings_index(s: Subject) {
    let prefix = s.key("indexed/");
    let same = |s: &Subject| {
        let (store, prefix) = (s.store.clone(), prefix.clone());
        async move {
            let listed = store.list(&prefix).await.unwrap().index;
            assert_eq!(store.prefix_index(&prefix).await.unwrap(), listed);
            listed
        }
    };
    s.store
        .put(&s.key("indexed/a"), b"a", Cas::Any)
        .await
        .unwrap();
    s.store
        .put(&s.key("indexed/b/c"), b"c", Cas::Any)
        .await
        .unwrap();
    s.store.put(&s.key("other"), b"x", Cas::Any).await.unwrap();
    let written = same(&s).await;
    s.store.delete(&s.key("indexed/a"), Cas::Any).await.unwrap();
    let deleted = same(&s).await;
    assert!(deleted > written);
    s.store.delete_prefix(&prefix).await.unwrap();
    assert!(same(&s).await > deleted);
}

/// The store's current index, read from a missing probe key, is at least that of every
/// write committed before, wherever in the store it landed.
async fn current_index_holds_every_write(s: Subject) {
    let probe = s.key("probe");
    let current = |s: &Subject| {
        let (store, probe) = (s.store.clone(), probe.clone());
        async move { store.current_index(&probe).await.unwrap().unwrap() }
    };
    let key = s.key("indexed/a");
    s.store.put(&key, b"a", Cas::Any).await.unwrap();
    let written = s.store.get(&key).await.unwrap().unwrap().modify_index;
    assert!(current(&s).await >= written);
    s.store.delete(&key, Cas::Any).await.unwrap();
    let deleted = s.store.prefix_index(&s.key("indexed/")).await.unwrap();
    assert!(deleted > written);
    assert!(current(&s).await >= deleted);
}

/// Each op of a transaction sees what the ops before it did.
async fn txn_ops_see_the_ops_before_them(s: Subject) {
    let (a, b) = (s.key("seen/a"), s.key("seen/b"));
    s.store.put(&b, b"old", Cas::Any).await.unwrap();
    let results = s
        .store
        .txn(&[
            TxnOp::Get { key: b.clone() },
            TxnOp::Set {
                key: a.clone(),
                value: b"new".to_vec(),
            },
            TxnOp::Get { key: a.clone() },
            TxnOp::Delete { key: b.clone() },
            TxnOp::CheckNotExists { key: b.clone() },
        ])
        .await
        .unwrap();
    assert_eq!(&*results[0].as_ref().unwrap().value, b"old");
    let set = results[1].as_ref().unwrap();
    assert_eq!(results[2].as_ref().unwrap(), set);
    assert_eq!(&*set.value, b"new");

    let refused = s
        .store
        .txn(&[
            TxnOp::Delete { key: a.clone() },
            TxnOp::Set {
                key: b.clone(),
                value: b"again".to_vec(),
            },
            TxnOp::Cas {
                key: b.clone(),
                value: b"twice".to_vec(),
                index: 0,
            },
        ])
        .await
        .unwrap_err();
    match refused {
        StoreError::Conflict { failures, .. } => {
            assert_eq!(failures.iter().map(|f| f.op_index).collect::<Vec<_>>(), [2]);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(&*s.store.get(&a).await.unwrap().unwrap().value, b"new");
    assert_eq!(s.store.get(&b).await.unwrap(), None);
}

/// Whatever a backend answers (the prefix whole, or only what changed), applying a watch's
/// update to a copy taken at the index it was given leaves exactly what the prefix holds.
async fn watch_changes_bring_a_copy_up_to_date(s: Subject) {
    let prefix = s.key("changing/");
    for name in ["a", "b", "c/d", "c/e"] {
        let key = s.key(&format!("changing/{name}"));
        s.store.put(&key, name.as_bytes(), Cas::Any).await.unwrap();
    }
    let before = s.store.list(&prefix).await.unwrap();
    s.store
        .put(&s.key("changing/a"), b"a2", Cas::Any)
        .await
        .unwrap();
    s.store
        .delete(&s.key("changing/b"), Cas::Any)
        .await
        .unwrap();
    s.store.delete_prefix(&s.key("changing/c/")).await.unwrap();
    s.store
        .put(&s.key("changing/f"), b"f", Cas::Any)
        .await
        .unwrap();
    s.store
        .put(&s.key("unrelated"), b"x", Cas::Any)
        .await
        .unwrap();

    let update = s
        .store
        .watch_changes(&prefix, before.index, Duration::from_secs(5), &Vec::new)
        .await
        .unwrap();
    let now = s.store.list(&prefix).await.unwrap();
    assert_eq!(update.index(), now.index);
    let mut copy: BTreeMap<String, KvPair> = before
        .pairs
        .into_iter()
        .map(|pair| (pair.key.clone(), pair))
        .collect();
    match update {
        PrefixUpdate::Whole(listing) => {
            copy = listing
                .pairs
                .into_iter()
                .map(|p| (p.key.clone(), p))
                .collect();
        }
        PrefixUpdate::Since(changes) => {
            for (key, at) in changes.deleted {
                assert!(at > before.index, "{key} deleted at {at}, before the index");
                copy.remove(&key);
            }
            for pair in changes.changed {
                assert!(pair.modify_index > before.index, "{pair:?} is not a change");
                copy.insert(pair.key.clone(), pair);
            }
        }
    }
    assert_eq!(copy.into_values().collect::<Vec<_>>(), now.pairs);

    // Nothing changed: the watch times out and brings the same index.
    let idle = s
        .store
        .watch_changes(&prefix, now.index, Duration::from_millis(50), &Vec::new)
        .await
        .unwrap();
    assert_eq!(idle.index(), now.index);
}

/// Keys holding what SQL's `LIKE` would read as wildcards (`%`, `_`), and characters of
/// several bytes (up to the last code point, whose prefix's end is its last byte plus one),
/// are listed by their bytes: a prefix lists exactly the keys starting with it.
async fn unusual_keys_list_by_their_bytes(s: Subject) {
    let names = [
        "odd/%/1",
        "odd/%x",
        "odd/_",
        "odd/a",
        "odd/ab",
        "odd/é",
        "odd/é/1",
        "odd/ê",
        "odd/\u{10FFFF}",
        "odd/\u{10FFFF}z",
        "odd/\u{10FFFF}/1",
    ];
    for name in names {
        s.store
            .put(&s.key(name), name.as_bytes(), Cas::Any)
            .await
            .unwrap();
    }
    let listed = |prefix: &'static str| {
        let (store, prefix) = (s.store.clone(), s.key(prefix));
        let strip = s.prefix.clone();
        async move {
            let listing = store.list(&prefix).await.unwrap();
            let (_, keys) = store.keys(&prefix, None).await.unwrap();
            let listed: Vec<String> = listing
                .pairs
                .iter()
                .map(|p| p.key.strip_prefix(&strip).unwrap().to_owned())
                .collect();
            let keyed: Vec<String> = keys
                .iter()
                .map(|k| k.strip_prefix(&strip).unwrap().to_owned())
                .collect();
            assert_eq!(listed, keyed, "{prefix}");
            listed
        }
    };
    assert_eq!(listed("odd/%").await, ["odd/%/1", "odd/%x"]);
    assert_eq!(listed("odd/_").await, ["odd/_"]);
    assert_eq!(listed("odd/a").await, ["odd/a", "odd/ab"]);
    assert_eq!(listed("odd/é").await, ["odd/é", "odd/é/1"]);
    assert_eq!(
        listed("odd/\u{10FFFF}").await,
        ["odd/\u{10FFFF}", "odd/\u{10FFFF}/1", "odd/\u{10FFFF}z"]
    );
    let (_, cut) = s.store.keys(&s.key("odd/"), Some('/')).await.unwrap();
    let cut: Vec<&str> = cut
        .iter()
        .map(|k| k.strip_prefix(&s.prefix).unwrap())
        .collect();
    assert_eq!(
        cut,
        [
            "odd/%/",
            "odd/%x",
            "odd/_",
            "odd/a",
            "odd/ab",
            "odd/é",
            "odd/é/",
            "odd/ê",
            "odd/\u{10FFFF}",
            "odd/\u{10FFFF}/",
            "odd/\u{10FFFF}z",
        ]
    );
    // A separator other than `/`, and a prefix cut inside a segment.
    let (_, cut) = s.store.keys(&s.key("odd"), Some('%')).await.unwrap();
    assert_eq!(
        cut.first().map(String::as_str),
        Some(s.key("odd/%").as_str())
    );
    assert_eq!(cut.len(), 10, "{cut:?}");
    // Deleting a prefix deletes only what starts with it.
    s.store.delete_prefix(&s.key("odd/%")).await.unwrap();
    s.store
        .delete_prefix(&s.key("odd/\u{10FFFF}"))
        .await
        .unwrap();
    assert_eq!(
        listed("odd/").await,
        ["odd/_", "odd/a", "odd/ab", "odd/é", "odd/é/1", "odd/ê"]
    );
}

/// A key deleted and written again is a new key: no index it had before passes a check of
/// it, in a put, a delete or a transaction.
async fn cas_of_a_key_written_again(s: Subject) {
    let key = s.key("again");
    s.store.put(&key, b"1", Cas::Index(0)).await.unwrap();
    let first = s.store.get(&key).await.unwrap().unwrap();
    s.store.delete(&key, Cas::Any).await.unwrap();
    s.store.put(&key, b"2", Cas::Index(0)).await.unwrap();
    let second = s.store.get(&key).await.unwrap().unwrap();
    assert!(
        second.create_index > first.modify_index,
        "{second:?} after {first:?}"
    );
    let old = first.modify_index;
    assert!(is_conflict(s.store.put(&key, b"x", Cas::Index(old)).await));
    assert!(is_conflict(s.store.delete(&key, Cas::Index(old)).await));
    let check = [TxnOp::CheckIndex {
        key: key.clone(),
        index: old,
    }];
    assert!(is_conflict(s.store.txn(&check).await));
    // Deleted and written again within one transaction, the same.
    let ops = [
        TxnOp::Delete { key: key.clone() },
        TxnOp::Set {
            key: key.clone(),
            value: b"3".to_vec(),
        },
    ];
    s.store.txn(&ops).await.unwrap();
    let third = s.store.get(&key).await.unwrap().unwrap();
    assert!(third.modify_index > second.modify_index);
    let stale = second.modify_index;
    assert!(is_conflict(
        s.store.put(&key, b"x", Cas::Index(stale)).await
    ));
    assert_eq!(&*s.store.get(&key).await.unwrap().unwrap().value, b"3");
}

/// A rolled-back transaction names every op that failed, each at its place.
async fn txn_reports_every_failure(s: Subject) {
    let present = s.key("failures/present");
    s.store.put(&present, b"v", Cas::Any).await.unwrap();
    let ops = [
        TxnOp::Get {
            key: s.key("failures/absent"),
        },
        TxnOp::Set {
            key: s.key("failures/new"),
            value: b"n".to_vec(),
        },
        TxnOp::Cas {
            key: present.clone(),
            value: b"x".to_vec(),
            index: 0,
        },
        TxnOp::Delete {
            key: present.clone(),
        },
        TxnOp::CheckIndex {
            key: present.clone(),
            index: 1,
        },
    ];
    match s.store.txn(&ops).await {
        Err(StoreError::Conflict { failures, .. }) => {
            let at: Vec<usize> = failures.iter().map(|f| f.op_index).collect();
            assert_eq!(at, [0, 2, 4], "{failures:?}");
        }
        other => panic!("expected a rollback, got {other:?}"),
    }
    assert_eq!(s.store.get(&s.key("failures/new")).await.unwrap(), None);
    assert_eq!(&*s.store.get(&present).await.unwrap().unwrap().value, b"v");
}

/// A session's lock-delay holds the keys it held as it ended, and no other: not a key it
/// released before, nor one it never held.
async fn lock_delay_only_on_the_keys_held_at_the_end(s: Subject) {
    let (held, released, never) = (s.key("ld/held"), s.key("ld/released"), s.key("ld/never"));
    let a = s
        .session("a", SessionBehavior::Release, Duration::from_secs(30))
        .await;
    let b = s
        .session("b", SessionBehavior::Release, Duration::ZERO)
        .await;
    assert!(s.store.acquire(&held, b"a", &a).await.unwrap());
    assert!(s.store.acquire(&released, b"a", &a).await.unwrap());
    assert!(s.store.release(&released, &a).await.unwrap());
    s.store.destroy_session(&a).await.unwrap();
    assert!(
        !s.store.acquire(&held, b"b", &b).await.unwrap(),
        "lock-delay ignored"
    );
    assert!(s.store.acquire(&released, b"b", &b).await.unwrap());
    assert!(s.store.acquire(&never, b"b", &b).await.unwrap());
    s.store.destroy_session(&b).await.unwrap();
}

/// Transactions sent together (which a store may commit together): those that roll back
/// leave nothing a transaction beside them can see, a write or a delete, and those beside
/// them apply whole.
async fn failing_transactions_leak_nothing_into_their_neighbours(s: Subject) {
    const PAIRS: usize = 20;
    let (kept, written) = (
        |i| s.key(&format!("leak/kept/{i}")),
        |i| s.key(&format!("leak/new/{i}")),
    );
    let mut kept_at = Vec::new();
    for i in 0..PAIRS {
        s.store.put(&kept(i), b"kept", Cas::Any).await.unwrap();
        kept_at.push(s.store.get(&kept(i)).await.unwrap().unwrap().modify_index);
    }
    let mut sent = Vec::new();
    for (i, &at) in kept_at.iter().enumerate() {
        // Writes a key and deletes another, then fails its last check.
        let failing = vec![
            TxnOp::Set {
                key: written(i),
                value: b"lost".to_vec(),
            },
            TxnOp::Delete { key: kept(i) },
            TxnOp::CheckIndex {
                key: kept(i),
                index: at,
            },
        ];
        // Passes only if the failing one left both keys as they were.
        let beside = vec![
            TxnOp::Cas {
                key: written(i),
                value: b"won".to_vec(),
                index: 0,
            },
            TxnOp::CheckIndex {
                key: kept(i),
                index: at,
            },
        ];
        for (ops, passes) in [(failing, false), (beside, true)] {
            let store = s.store.clone();
            sent.push(tokio::spawn(async move { (store.txn(&ops).await, passes) }));
        }
    }
    for txn in sent {
        let (result, passes) = txn.await.unwrap();
        assert_eq!(result.is_ok(), passes, "{result:?}");
    }
    for (i, &at) in kept_at.iter().enumerate() {
        assert_eq!(
            &*s.store.get(&written(i)).await.unwrap().unwrap().value,
            b"won"
        );
        let kept = s.store.get(&kept(i)).await.unwrap().unwrap();
        assert_eq!(kept.modify_index, at);
    }
}

macro_rules! conformance {
    ($backend:ident: $($check:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    if let Some(subject) = super::$backend().await {
                        super::$check(subject).await;
                    }
                }
            )*
        }
    };
}

macro_rules! conformance_suite {
    ($($backend:ident),*) => {
        mod conformance {
            use super::*;
            $(
                conformance!($backend:
                    create_only_cas,
                    cas_stale_and_fresh,
                    delete_cas,
                    txn_all_or_nothing,
                    txn_limits,
                    txn_size_limit,
                    bad_keys_and_values_write_nothing,
                    listing_and_separator,
                    concurrent_cas_one_winner_per_round,
                    counter_with_cas_retry,
                    lock_exclusivity,
                    session_lifecycle,
                    sub_microsecond_lock_delays_refused,
                    destroy_applies_behavior,
                    expiry_applies_behavior,
                    lock_delay_honoured,
                    txn_locks_each_checked,
                    watch_wakes_on_change,
                    watch_times_out_unchanged,
                    prefix_watch_sees_deletes,
                    watch_wakes_for_each_change_it_covers,
                    prefix_index_is_a_listings_index,
                    current_index_holds_every_write,
                    watch_changes_bring_a_copy_up_to_date,
                    txn_ops_see_the_ops_before_them,
                    unusual_keys_list_by_their_bytes,
                    cas_of_a_key_written_again,
                    txn_reports_every_failure,
                    lock_delay_only_on_the_keys_held_at_the_end,
                    failing_transactions_leak_nothing_into_their_neighbours,
                );
            )*
        }
    };
}

conformance_suite!(sqlite, consul_fake, consul);
