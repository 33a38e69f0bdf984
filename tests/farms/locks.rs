//! The farms' locks under P2's lock trees: they vanish with their session whatever
//! `--leader-behavior` says for the leader lock, and keys an older run left there without a
//! session are removed. Each test runs on SQLite and through the Consul client against the
//! fake Consul agent.

#[allow(dead_code)]
use crate::support::fake_consul;
#[allow(dead_code)]
use crate::support::severable;

use crate::support::farms::{rc_doc, MANIFEST};

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use p2_apiserver::farms::{self, alerts::Alerter};
use p2_apiserver::kv::consul::{ConsulConfig, ConsulStore};
use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{Cas, KvPair, KvStore, SessionBehavior, SessionSpec};
use p2_apiserver::layout::{self, LEADER_LOCK};
use p2_apiserver::leader::{self, current_leader, LeaderConfig};
use p2_apiserver::state::{Mirror, MirrorConfig};
use serde_json::json;
use severable::Severable;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const TTL: Duration = Duration::from_secs(10);
/// How long a test waits for something the server or the store must do; past every TTL.
const PATIENCE: Duration = Duration::from_secs(40);

/// A store and what must outlive it (a SQLite file, a fake agent).
struct Backend {
    store: Arc<dyn KvStore>,
    _keep: Box<dyn Any>,
}

async fn sqlite() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("farms.db").display().to_string();
    Backend {
        store: Arc::new(SqliteStore::open(&path).await.unwrap()),
        _keep: Box::new(dir),
    }
}

async fn fake_consul() -> Backend {
    let fake = fake_consul::start().await;
    let config = ConsulConfig {
        base_url: format!("http://{}", fake.addr),
        token: None,
        datacenter: None,
    };
    Backend {
        store: Arc::new(ConsulStore::new(config).unwrap()),
        _keep: Box::new(fake),
    }
}

/// One server campaigning with the farms, as `serve` runs them.
struct Server {
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    mirror: TaskTracker,
}

impl Server {
    fn start(store: Arc<dyn KvStore>, behavior: SessionBehavior) -> Server {
        Server::start_with_ttl(store, behavior, TTL)
    }

    /// [`Server::start`] with sessions of `ttl`.
    fn start_with_ttl(store: Arc<dyn KvStore>, behavior: SessionBehavior, ttl: Duration) -> Server {
        Server::start_with_config(
            store,
            LeaderConfig {
                holder: "test".into(),
                session_ttl: ttl,
                lock_delay: Duration::ZERO,
                behavior,
            },
        )
    }

    fn start_with_config(store: Arc<dyn KvStore>, config: LeaderConfig) -> Server {
        let shutdown = CancellationToken::new();
        let alerts = Arc::new(Alerter::new(None));
        let farm_store = store.clone();
        let tasks = TaskTracker::new();
        let mirror = Mirror::new(store.clone(), MirrorConfig::default());
        mirror.start(&tasks, shutdown.clone());
        tasks.close();
        let task = tokio::spawn(leader::campaign(
            store,
            config,
            || Ok(()),
            shutdown.clone(),
            move |term| {
                farms::run_term(
                    farm_store.clone(),
                    mirror.clone(),
                    term,
                    alerts.clone(),
                    "test".into(),
                    farms::FarmOptions::default(),
                )
            },
        ));
        Server {
            shutdown,
            task,
            mirror: tasks,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap();
        self.mirror.wait().await;
    }
}

async fn wait_until<F, Fut>(what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let give_up = tokio::time::Instant::now() + PATIENCE;
    while !check().await {
        assert!(tokio::time::Instant::now() < give_up, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn put_json(store: &dyn KvStore, key: &str, doc: impl Into<serde_json::Value>) {
    let doc: serde_json::Value = doc.into();
    store
        .put(key, doc.to_string().as_bytes(), Cas::Any)
        .await
        .unwrap();
}

/// Stores an RC of `replicas` pods on the web nodes, with id `id`.
async fn put_rc(store: &dyn KvStore, id: &str, replicas: usize) {
    let doc = rc_doc(MANIFEST, "role=web", replicas).id(id);
    put_json(store, &format!("replication_controllers/{id}"), doc).await;
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// An RC, a daemon set and a roll over two RCs on one web node: every kind of lock the farms
/// take under P2's trees. Returns those lock keys.
async fn objects_with_locks(store: &dyn KvStore) -> Vec<String> {
    put_json(store, "labels/node/node1", json!({"role": "web"})).await;
    let (old, new, ds) = (new_id(), new_id(), new_id());
    put_rc(store, &old, 1).await;
    put_rc(store, &new, 0).await;
    let roll = json!({"OldRC": old, "NewRC": new, "DesiredReplicas": 1, "MinimumReplicas": 1,
                      "LeaveOld": false, "RollDelay": 0});
    put_json(store, &format!("rolls/{new}"), roll).await;
    let ds_doc = json!({"id": ds, "disabled": false, "manifest": MANIFEST, "min_health": 0,
                        "cluster_name": "production", "node_selector": "role=db",
                        "pod_id": "hello", "timeout": 0});
    put_json(store, &format!("daemon_sets/{ds}"), ds_doc).await;
    vec![
        layout::rc_ownership(&old),
        layout::rc_ownership(&new),
        layout::rc_mutation(&old),
        layout::rc_mutation(&new),
        layout::roll_ownership(&new),
        layout::ds_ownership(&ds),
    ]
}

/// The session holding the lock `key`, if any.
async fn holder(store: &dyn KvStore, key: &str) -> Option<String> {
    let pair = store.get(key).await.unwrap()?;
    pair.session().map(str::to_owned)
}

/// The farms' session, once it holds every one of `keys`; it is never the leader's.
async fn wait_for_farm_locks(store: &dyn KvStore, keys: &[String]) -> String {
    wait_until("the farms hold their locks", || async {
        let mut holders = Vec::new();
        for key in keys {
            holders.push(holder(store, key).await);
        }
        holders.iter().all(|h| h.is_some() && *h == holders[0])
    })
    .await;
    let farm = holder(store, &keys[0]).await.unwrap();
    let leader = current_leader(store).await.unwrap().unwrap();
    assert_ne!(
        farm, leader.session,
        "the farms' locks are not the leader's"
    );
    farm
}

/// The keys under `lock/`.
async fn lock_keys(store: &dyn KvStore) -> Vec<KvPair> {
    store.list("lock/").await.unwrap().pairs
}

/// A server with `--leader-behavior release` stops: the leader lock is released and stays,
/// while every lock the farms held is deleted.
async fn farm_locks_vanish_when_the_sessions_are_destroyed(backend: Backend) {
    let store = backend.store;
    let keys = objects_with_locks(&*store).await;
    let server = Server::start(store.clone(), SessionBehavior::Release);
    wait_for_farm_locks(&*store, &keys).await;
    server.stop().await;
    let left = lock_keys(&*store).await;
    assert_eq!(
        left.iter().map(|p| p.key.as_str()).collect::<Vec<_>>(),
        [LEADER_LOCK]
    );
    assert_eq!(left[0].session(), None, "the leader lock is only released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn farm_locks_vanish_when_the_sessions_are_destroyed_on_sqlite() {
    farm_locks_vanish_when_the_sessions_are_destroyed(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn farm_locks_vanish_when_the_sessions_are_destroyed_on_consul() {
    farm_locks_vanish_when_the_sessions_are_destroyed(fake_consul().await).await;
}

/// A server that stops gracefully lets its locks go before ending its sessions, so that a
/// standby leads, and its farms take every lock, at once rather than after the lock-delay
/// (here longer than the test waits).
async fn a_standby_takes_every_lock_at_once_after_a_graceful_stop(backend: Backend) {
    let store = backend.store;
    let keys = objects_with_locks(&*store).await;
    let config = LeaderConfig {
        holder: "test".into(),
        session_ttl: TTL,
        lock_delay: Duration::from_secs(60),
        behavior: SessionBehavior::Delete,
    };
    assert!(config.lock_delay > PATIENCE);
    let first = Server::start_with_config(store.clone(), config.clone());
    let farm = wait_for_farm_locks(&*store, &keys).await;
    let standby = Server::start_with_config(store.clone(), config);
    first.stop().await;
    assert_ne!(wait_for_farm_locks(&*store, &keys).await, farm);
    standby.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_every_lock_at_once_after_a_graceful_stop_on_sqlite() {
    a_standby_takes_every_lock_at_once_after_a_graceful_stop(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_every_lock_at_once_after_a_graceful_stop_on_consul() {
    a_standby_takes_every_lock_at_once_after_a_graceful_stop(fake_consul().await).await;
}

/// A server with `--leader-behavior release` can no longer renew its sessions, which the
/// store then expires: the leader lock is left released, and every lock the farms held is
/// gone (nothing leads meanwhile, so nothing else removes them).
async fn farm_locks_vanish_when_the_sessions_expire(backend: Backend) {
    let store = backend.store;
    let keys = objects_with_locks(&*store).await;
    let severable = Severable::new(store.clone());
    let server = Server::start(severable.clone(), SessionBehavior::Release);
    let farm = wait_for_farm_locks(&*store, &keys).await;
    severable.cut();
    wait_until("the farms' session expires", || async {
        store.session_info(&farm).await.unwrap().is_none()
    })
    .await;
    wait_until("the leader's session expires", || async {
        current_leader(&*store).await.unwrap().is_none()
    })
    .await;
    // A session past its TTL is swept shortly after, with the keys it holds.
    wait_until("only the leader lock is left", || async {
        let left = lock_keys(&*store).await;
        left.iter().map(|p| p.key.as_str()).eq([LEADER_LOCK])
    })
    .await;
    let left = lock_keys(&*store).await;
    assert_eq!(left[0].session(), None, "the leader lock is only released");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn farm_locks_vanish_when_the_sessions_expire_on_sqlite() {
    farm_locks_vanish_when_the_sessions_expire(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn farm_locks_vanish_when_the_sessions_expire_on_consul() {
    farm_locks_vanish_when_the_sessions_expire(fake_consul().await).await;
}

/// The term's session ended by the store (an operator destroyed it, say) while the leader's
/// lives on: the farms find their locks gone and the session refused when they take them
/// again, and the term ends then, not at the session's next renewal (a third of a TTL
/// long enough that the two cannot be mistaken for each other).
async fn a_term_whose_session_is_gone_ends_at_once(backend: Backend) {
    const TTL: Duration = Duration::from_secs(60);
    let store = backend.store;
    let keys = objects_with_locks(&*store).await;
    let server = Server::start_with_ttl(store.clone(), SessionBehavior::Delete, TTL);
    let farm = wait_for_farm_locks(&*store, &keys).await;
    let leader = current_leader(&*store).await.unwrap().unwrap();
    // Made moments ago: its first renewal is most of a third of the TTL away.
    store.destroy_session(&farm).await.unwrap();
    let destroyed = tokio::time::Instant::now();
    wait_until("the term ends", || async {
        current_leader(&*store)
            .await
            .unwrap()
            .is_none_or(|now| now.session != leader.session)
    })
    .await;
    let ended = destroyed.elapsed();
    assert!(
        ended < TTL / 6,
        "the term ended {ended:?} after its session"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_whose_session_is_gone_ends_at_once_on_sqlite() {
    a_term_whose_session_is_gone_ends_at_once(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_whose_session_is_gone_ends_at_once_on_consul() {
    a_term_whose_session_is_gone_ends_at_once(fake_consul().await).await;
}

/// Keys an older run left without a session under P2's lock trees are removed (or, for an
/// RC that exists, taken over by the farm that then runs it); a lock a live session holds,
/// and a kind of lock the farms do not take, are left alone.
async fn sessionless_locks_are_removed(backend: Backend) {
    let store = backend.store;
    put_json(&*store, "labels/node/node1", json!({"role": "web"})).await;
    let (ours, foreign, gone) = (new_id(), new_id(), new_id());
    put_rc(&*store, &ours, 1).await;
    put_rc(&*store, &foreign, 1).await;
    let stale = [
        layout::rc_ownership(&ours),
        layout::rc_ownership(&gone),
        layout::rc_mutation(&gone),
        layout::rc_update_creation(&gone),
        layout::roll_ownership(&gone),
        layout::ds_ownership(&gone),
    ];
    for key in &stale {
        store.put(key, b"", Cas::Any).await.unwrap();
    }
    let outsiders = format!("lock/replication_controllers/{gone}/node_transfer");
    store.put(&outsiders, b"", Cas::Any).await.unwrap();
    let spec = SessionSpec::deleting("another farm", Duration::from_secs(120));
    let other = store.create_session(&spec).await.unwrap();
    let held = layout::rc_ownership(&foreign);
    assert!(store.acquire(&held, b"", &other).await.unwrap());
    let held_before = store.get(&held).await.unwrap().unwrap();

    let server = Server::start(store.clone(), SessionBehavior::Delete);
    wait_until("our RC runs its pod", || async {
        let labels = store.get("labels/pod/node1/hello").await.unwrap();
        labels.is_some_and(|pair| {
            let labels: serde_json::Value = serde_json::from_slice(&pair.value).unwrap();
            labels["replication_controller_id"] == ours.as_str()
        })
    })
    .await;
    wait_until("the stale keys are gone", || async {
        let keys: Vec<String> = lock_keys(&*store)
            .await
            .into_iter()
            .map(|p| p.key)
            .collect();
        stale[1..].iter().all(|key| !keys.contains(key))
    })
    .await;
    let leader = current_leader(&*store).await.unwrap().unwrap();
    let owner = holder(&*store, &stale[0]).await;
    assert!(owner.is_some_and(|owner| owner != leader.session && owner != other));
    assert_eq!(store.get(&held).await.unwrap(), Some(held_before));
    let outsiders = store.get(&outsiders).await.unwrap().unwrap();
    assert_eq!(outsiders.session(), None);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessionless_locks_are_removed_on_sqlite() {
    sessionless_locks_are_removed(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessionless_locks_are_removed_on_consul() {
    sessionless_locks_are_removed(fake_consul().await).await;
}
