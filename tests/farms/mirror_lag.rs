//! The farms on a mirror whose tree watches lag or fail: a farm must not act on a view in
//! which one tree shows a change (a lock freed) that came after another writer's change to
//! another tree (the pods that lock's holder placed) which the mirror does not hold yet.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use p2_apiserver::farms::alerts::Alerter;
use p2_apiserver::farms::world::{pod_key, Trees};
use p2_apiserver::farms::{self, FarmOptions};
use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{Cas, KvStore, SessionBehavior, SessionSpec, TxnOp};
use p2_apiserver::labels::LabelType;
use p2_apiserver::layout;
use p2_apiserver::leader::{self, LeaderConfig, Term};
use p2_apiserver::model::HealthState;
use p2_apiserver::state::{Mirror, MirrorConfig, Tree};
use p2_apiserver::store::own_writes::OwnWrites;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::support::counting::Counting;
use crate::support::farms::{rc_doc, Harness, RcDoc, MANIFEST};

/// An RC of one replica of `manifest` on the web nodes.
fn rc(manifest: &str) -> RcDoc {
    rc_doc(manifest, "role=web", 1).strategy("static_strategy")
}

/// Nodes `n1` to `n3` labelled `role=web`, and the farms seen scheduling an RC there (so
/// that they are known to run).
async fn web_nodes(h: &Harness) {
    for node in ["n1", "n2", "n3"] {
        h.label(LabelType::Node, node, json!({"role": "web"})).await;
    }
    let other = h
        .put_rc(rc(&MANIFEST.replace("id: hello", "id: other")))
        .await;
    h.wait_for_rc_nodes(&other, 1).await;
}

/// RC `x` of one replica, owned by another farm's session (a leader of a term before this
/// one, or P2's RC farm), once this server's mirror shows it locked; `x` and the session.
async fn rc_owned_elsewhere(h: &Harness) -> (String, String) {
    let spec = SessionSpec::deleting("previous leader", Duration::from_secs(10));
    let session = h.store.create_session(&spec).await.unwrap();
    let x = uuid::Uuid::new_v4().to_string();
    let lock = layout::rc_ownership(&x);
    assert!(h.store.acquire(&lock, b"previous", &session).await.unwrap());
    h.put_rc_as(&x, rc(MANIFEST)).await;
    h.wait_until(|| async {
        let locked = h.mirror.get(&lock);
        let held = locked.is_some_and(|e| e.pair.session() == Some(session.as_str()));
        (h.mirror.get(&layout::rc(&x)).is_some() && held).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        h.rc_nodes(&x).await.is_empty(),
        "its owner has not placed it yet"
    );
    (x, session)
}

/// The pod-label watch lags (its answers held back for a moment, well under the farms'
/// catch-up bound), and meanwhile this server writes a pod's labels itself (an API label
/// write). Its own write lifts the tree's index in the mirror past the other writer's
/// change the watch has yet to deliver: the farms must not take the tree as caught up, or
/// once the RC's lock is free they see RC `x` without its pod and place a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_write_does_not_pass_for_a_lagging_tree_having_caught_up() {
    let (h, store) = Harness::start_counted().await;
    web_nodes(&h).await;
    let (x, session) = rc_owned_elsewhere(&h).await;

    store.delay_watches_of(Some("labels/pod/"));
    placed_on(h.store.as_ref(), &x, &session, "n1").await;
    // A label written through this server's API, after the other farm's write.
    let api = OwnWrites::wrap(h.store.clone(), h.mirror.clone());
    let misc = layout::labels(LabelType::Pod, "n3/misc");
    api.put(&misc, br#"{"team":"a"}"#, Cas::Any).await.unwrap();
    h.store.destroy_session(&session).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;

    let placed = h.rc_nodes(&x).await;
    store.delay_watches_of(None);
    assert_eq!(placed, ["n1"], "RC {x} of one replica was placed twice");
}

/// The pod-label watch fails, so the mirror never gets the pod another farm placed. The
/// farms must not act on trees they know to be behind, however long they wait for them to
/// catch up (2 s at a time), or they place RC `x` a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_farm_does_not_act_on_a_tree_whose_watch_fails() {
    let (h, store) = Harness::start_counted().await;
    web_nodes(&h).await;
    let (x, session) = rc_owned_elsewhere(&h).await;

    store.fail_watches_of(Some("labels/pod/"));
    placed_on(h.store.as_ref(), &x, &session, "n1").await;
    h.store.destroy_session(&session).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;

    let placed = h.rc_nodes(&x).await;
    store.fail_watches_of(None);
    assert_eq!(placed, ["n1"], "RC {x} of one replica was placed twice");
}

/// A health record of pod `hello` on `node`, as a node's agent writes it.
fn health(node: &str, status: &str) -> Vec<u8> {
    json!({"Id": "hello", "Node": node, "Service": "hello", "Status": status,
           "Time": "2026-01-01T00:00:00Z", "Expires": "2126-01-01T00:00:00Z"})
    .to_string()
    .into_bytes()
}

/// The health watch fails just as a pod goes critical, and no other tree changes, so no
/// newer index elsewhere tells the farms that a tree is behind. Their world must not show the
/// pod passing still: a roll waiting out its delay would then take its next step on health
/// the mirror can no longer vouch for, and go below its minimum. A tree out of touch with
/// the store is asked of the store, and waited for when it moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_farms_world_waits_for_a_tree_whose_watch_fails_when_nothing_else_moves() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db").display().to_string();
    let store = Counting::new(Arc::new(SqliteStore::open(&path).await.unwrap()));
    let key = layout::health("hello", "n1");
    store
        .put(&key, &health("n1", "passing"), Cas::Any)
        .await
        .unwrap();
    let config = MirrorConfig {
        lost_after: Duration::ZERO,
        ..MirrorConfig::default()
    };
    let mirror = Mirror::new(store.clone(), config);
    let (tasks, cancel) = (TaskTracker::new(), CancellationToken::new());
    mirror.start(&tasks, cancel.clone());
    mirror.loaded().await;
    let mut trees = Trees::new(mirror.clone());
    let pod = pod_key("n1", "hello");
    assert_eq!(trees.world().await.health_of(&pod), HealthState::Passing);

    store.fail_watches_of(Some("health/"));
    store
        .put(&key, &health("n1", "critical"), Cas::Any)
        .await
        .unwrap();
    while !mirror
        .health()
        .lost
        .iter()
        .any(|(tree, _)| tree == "health/")
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut next = Box::pin(trees.world());
    if let Poll::Ready(world) = futures::poll!(&mut next) {
        assert_eq!(
            world.health_of(&pod),
            HealthState::Critical,
            "the farms' world showed the pod as its failed health watch last saw it"
        );
    }
    store.fail_watches_of(None);
    assert_eq!(next.await.health_of(&pod), HealthState::Critical);
    cancel.cancel();
}

/// This server takes over as leader while its mirror lags behind the store: the leader
/// before it took RC `x`'s lock, placed its pod on n2 and stepped down, none of which the
/// mirror holds yet. The new term's farms find `x`'s lock free and take it; they must not
/// act on `x` from a view older than their taking of its lock (as P2's RC worker reads the
/// RC's pods only once it holds the lock), or they see it without its pod and place a
/// second one, on n1, where no check-and-set of theirs can catch it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_does_not_act_on_an_object_from_a_view_older_than_its_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db").display().to_string();
    let store: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    for node in ["n1", "n2"] {
        let key = layout::labels(LabelType::Node, node);
        store
            .put(&key, br#"{"role":"web"}"#, Cas::Any)
            .await
            .unwrap();
    }
    let x = uuid::Uuid::new_v4().to_string();
    let doc = rc(MANIFEST).id(&x).to_string();
    store
        .put(&layout::rc(&x), doc.as_bytes(), Cas::Index(0))
        .await
        .unwrap();
    // The leader before this server.
    let spec = SessionSpec::deleting("previous leader", Duration::from_secs(30));
    let previous = store.create_session(&spec).await.unwrap();
    let record = json!({"holder": "previous", "session": previous,
                        "since": "2026-01-01T00:00:00Z"});
    let record = record.to_string().into_bytes();
    assert!(store
        .acquire(layout::LEADER_LOCK, &record, &previous)
        .await
        .unwrap());

    // This server stands by, its farms on a mirror that shows RC `x` unplaced and unlocked.
    let slow = Counting::new(store.clone());
    let mirror = Mirror::new(slow.clone(), MirrorConfig::default());
    let (tasks, shutdown) = (TaskTracker::new(), CancellationToken::new());
    mirror.start(&tasks, shutdown.clone());
    mirror.loaded().await;
    assert!(mirror.get(&layout::rc(&x)).is_some());
    // As a read of the API's makes it: every tree holds every change up to the newest.
    assert!(mirror.catch_up(&Tree::ALL, Duration::from_secs(5)).await);
    let config = LeaderConfig {
        holder: "next".into(),
        session_ttl: Duration::from_secs(10),
        lock_delay: Duration::ZERO,
        behavior: SessionBehavior::Delete,
    };
    let (farm_store, farm_mirror) = (slow.clone(), mirror.clone());
    let alerts = Arc::new(Alerter::new(None));
    let lead = move |term: Term| {
        let (store, mirror) = (farm_store.clone(), farm_mirror.clone());
        let options = FarmOptions::default();
        farms::run_term(store, mirror, term, alerts.clone(), "next".into(), options)
    };
    tasks.spawn(leader::campaign(
        slow.clone(),
        config,
        || Ok(()),
        shutdown.clone(),
        lead,
    ));

    // The mirror's watches lag from here on; the previous leader's last term runs RC `x`.
    slow.delay_watches_of(Some(""));
    let term = store.create_session(&spec).await.unwrap();
    let lock = layout::rc_ownership(&x);
    assert!(store.acquire(&lock, b"previous", &term).await.unwrap());
    placed_on(&*store, &x, &term, "n2").await;
    store.destroy_session(&term).await.unwrap();
    store.destroy_session(&previous).await.unwrap();
    let mut led = false;
    for _ in 0..100 {
        let leader = leader::current_leader(&*store).await.unwrap();
        if leader.is_some_and(|leader| leader.holder == "next") {
            led = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(led, "this server did not take over");
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let placed = nodes_of(&*store, &x).await;
    slow.delay_watches_of(None);
    assert_eq!(placed, ["n2"], "RC {x} of one replica was placed twice");
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
}

/// Places RC `x`'s pod on `node`, fenced on its lock held by `session`, as a farm does.
async fn placed_on(store: &dyn KvStore, x: &str, session: &str, node: &str) {
    let labels = json!({"pod_id": "hello", "replication_controller_id": x});
    let placed = [
        TxnOp::CheckSession {
            key: layout::rc_ownership(x),
            session: session.to_owned(),
        },
        TxnOp::Cas {
            key: layout::labels(LabelType::Pod, &format!("{node}/hello")),
            value: labels.to_string().into_bytes(),
            index: 0,
        },
        TxnOp::Set {
            key: format!("intent/{node}/hello"),
            value: MANIFEST.as_bytes().to_vec(),
        },
    ];
    store.txn(&placed).await.unwrap();
}

/// The nodes whose pod labels name RC `x`, sorted, as the store has them.
async fn nodes_of(store: &dyn KvStore, x: &str) -> Vec<String> {
    let listing = store.list("labels/pod/").await.unwrap();
    let mut nodes: Vec<String> = (listing.pairs.iter())
        .filter(|pair| {
            let labels: serde_json::Value = serde_json::from_slice(&pair.value).unwrap();
            labels["replication_controller_id"] == x
        })
        .filter_map(|pair| {
            let rest = pair.key.strip_prefix("labels/pod/")?;
            Some(rest.split('/').next()?.to_owned())
        })
        .collect();
    nodes.sort();
    nodes
}

/// A farms' world is built from the trees as they are once they have caught up with each
/// other, and not from a listing that lands meanwhile: here, while the world waits for the
/// trees to settle after a write of unknown outcome (its node labels' watch slow), another
/// farm places RC `x`'s pod (its pod labels' watch lagging) and then lets `x`'s lock go
/// (the lock tree's watch prompt). The world must not show the lock free without the pod,
/// the mix on which a farm would place the RC a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_farms_world_holds_no_listing_that_landed_while_it_waited() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db").display().to_string();
    let store = Counting::new(Arc::new(SqliteStore::open(&path).await.unwrap()));
    let x = uuid::Uuid::new_v4().to_string();
    let lock = layout::rc_ownership(&x);
    let spec = SessionSpec::deleting("another farm", Duration::from_secs(30));
    let owner = store.create_session(&spec).await.unwrap();
    assert!(store.acquire(&lock, b"other", &owner).await.unwrap());
    let node = layout::labels(LabelType::Node, "n1");
    store
        .put(&node, br#"{"role":"web"}"#, Cas::Any)
        .await
        .unwrap();
    let mirror = Mirror::new(store.clone(), MirrorConfig::default());
    let (tasks, cancel) = (TaskTracker::new(), CancellationToken::new());
    mirror.start(&tasks, cancel.clone());
    mirror.loaded().await;
    let mut trees = Trees::new(mirror.clone());
    assert!(trees.world().await.lock_holder(&lock).is_some());

    // The node labels change, their watch holding back the change; a write of this
    // server's has an unknown outcome, so the next world waits for every tree to catch up
    // with the store, the node labels among them.
    let held = mirror.tree_index(Tree::Labels(LabelType::Node));
    store.hold_watches_past(Some(("labels/node/", held)));
    store
        .put(&node, br#"{"role":"db"}"#, Cas::Any)
        .await
        .unwrap();
    mirror.note_unsure_write();
    let next = tokio::spawn(async move { trees.world().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !next.is_finished(),
        "the world did not wait for the node labels"
    );

    // Meanwhile the other farm places `x`'s pod, then lets its lock go.
    store.delay_watches_of(Some("labels/pod/"));
    placed_on(store.as_ref(), &x, &owner, "n1").await;
    store.destroy_session(&owner).await.unwrap();
    while mirror.get(&lock).is_some() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.hold_watches_past(None);
    // It may wait for the pod labels to catch up, as long as their watch lags.
    let mut next = std::pin::pin!(next);
    let waited = tokio::time::timeout(Duration::from_secs(1), &mut next).await;
    store.delay_watches_of(None);
    let world = match waited {
        Ok(world) => world.unwrap(),
        Err(_) => next.await.unwrap(),
    };
    let pods = world.pods_labelled("replication_controller_id", &x);
    assert!(
        world.lock_holder(&lock).is_some() || !pods.is_empty(),
        "the world shows RC {x}'s lock free and none of the pods its owner placed before"
    );
    cancel.cancel();
}
