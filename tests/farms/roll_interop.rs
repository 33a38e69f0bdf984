//! Rolls across implementations: every mix of roll runner and RC farm follows P2's protocol
//! (P2's rolling update and RC worker), keeps the minimum healthy at every observed change of the store,
//! and completes, with and without spare nodes, on SQLite and through the Consul client
//! against the fake agent.
//!
//! - our roll farm with P2's RC farm owning the RCs ([`P2RcFarm`]);
//! - P2's `p2-rctl rolling-update` ([`p2::rolling_update`]) with our RC farm owning them;
//! - our roll farm with our RC farm.

use std::time::Duration;

use crate::support::farms::p2::{self, P2RcFarm, P2Roll};
use crate::support::farms::{
    alert_webhook, rc_doc, warnings, Backend, Harness, RcDoc, Snapshot, MANIFEST, NEW_MANIFEST,
};
use p2_apiserver::labels::LabelType;
use serde_json::json;

/// Replicas of the old RC, and the roll's target.
const REPLICAS: usize = 3;
/// The roll's minimum healthy.
const MINIMUM: usize = 2;
/// How long a fake node takes to start a pod.
const START: Duration = Duration::from_millis(100);

/// An RC document over the web nodes.
fn rc(manifest: &str, replicas: usize) -> RcDoc {
    rc_doc(manifest, "role=web", replicas)
        .pod_labels(json!({"app": "hello"}))
        .strategy("static_strategy")
}

/// The nodes a roll runs on.
#[derive(Debug, Clone, Copy)]
enum Nodes {
    /// Just enough web nodes for the replicas: every new pod replaces an old one in place.
    NoSpare,
    /// Two more web nodes than replicas.
    Spare,
    /// As many web nodes as replicas, and as many other nodes that only the new RC selects:
    /// the old pods have to be removed.
    Elsewhere,
}

/// A harness on `backend` with `nodes`, whose agents run.
async fn fleet(backend: Backend, nodes: Nodes) -> Harness {
    let h = Harness::start_on(backend, None).await;
    let web = match nodes {
        Nodes::NoSpare | Nodes::Elsewhere => REPLICAS,
        Nodes::Spare => REPLICAS + 2,
    };
    h.web_nodes(web).await;
    if let Nodes::Elsewhere = nodes {
        for i in 1..=REPLICAS {
            h.label(
                LabelType::Node,
                &format!("next{i}"),
                json!({"role": "next"}),
            )
            .await;
        }
    }
    h.run_fake_nodes(START);
    h
}

/// The new RC's document (0 replicas) for `nodes`.
fn new_rc(nodes: Nodes) -> serde_json::Value {
    let mut doc: serde_json::Value = rc(NEW_MANIFEST, 0).into();
    if let Nodes::Elsewhere = nodes {
        doc["node_selector"] = "role=next".into();
    }
    doc
}

async fn wait_healthy(h: &Harness, rc: &str, count: usize) {
    h.wait_until(|| async { (h.snapshot().await.rc_pods(rc) == (count, count)).then_some(()) })
        .await;
}

/// Follows the store from now until the roll has completed (the old RC and any roll record
/// gone), checking at every change that old and new together keep the minimum healthy and
/// that the old RC, once disabled, is never enabled again.
async fn follow_roll(h: &Harness, old: &str, new: &str) {
    let mut old_disabled = false;
    h.follow(|snapshot: &Snapshot| {
        let healthy = snapshot.rc_pods(old).1 + snapshot.rc_pods(new).1;
        assert!(
            healthy >= MINIMUM,
            "{healthy} healthy against a minimum of {MINIMUM} at index {}",
            snapshot.index
        );
        let old_rc = snapshot.rc(old);
        if let Some(doc) = &old_rc {
            let disabled = doc["disabled"] == true;
            assert!(
                disabled || !old_disabled,
                "the old RC was enabled again at index {}",
                snapshot.index
            );
            old_disabled |= disabled;
        }
        let roll = snapshot.get(&format!("rolls/{new}"));
        (old_rc.is_none() && roll.is_none()).then_some(())
    })
    .await;
    // The new RC runs every replica, on the new manifest, and nothing else runs the pod.
    wait_healthy(h, new, REPLICAS).await;
    let snapshot = h.snapshot().await;
    assert_eq!(snapshot.rc_pods(old), (0, 0));
    let intents: Vec<_> = h.store.list("intent/").await.unwrap().pairs;
    assert_eq!(intents.len(), REPLICAS, "{intents:?}");
    assert!(intents.iter().all(|p| &*p.value == NEW_MANIFEST.as_bytes()));
    let locks = h.store.list("lock/replication_controllers/").await.unwrap();
    assert!(locks.pairs.iter().all(|p| !p.key.ends_with("/update")));
}

/// After our roll farm completed roll `new`: once it has let go of the roll, it has logged no
/// warning about the roll (no stale second pass tried to end it again).
async fn quiet_after_completion(h: &Harness, new: &str) {
    let lock = format!("lock/rolls/{new}");
    h.wait_until(|| async { h.store.get(&lock).await.unwrap().is_none().then_some(()) })
        .await;
    assert_eq!(
        warnings("p2_apiserver::farms::roll", new),
        Vec::<String>::new()
    );
}

async fn our_roll_with_p2_rc_farm(backend: Backend, nodes: Nodes) {
    let h = fleet(backend, nodes).await;
    let p2 = P2RcFarm::start(&h).await;
    let old = p2.put_rc(rc(MANIFEST, REPLICAS)).await;
    wait_healthy(&h, &old, REPLICAS).await;
    let new = p2.put_rc(new_rc(nodes)).await;
    h.put_roll(&old, &new, REPLICAS, MINIMUM).await;
    follow_roll(&h, &old, &new).await;
    quiet_after_completion(&h, &new).await;
}

async fn p2_rolling_update_with_our_rc_farm(backend: Backend, nodes: Nodes) {
    let h = fleet(backend, nodes).await;
    let old = h.put_rc(rc(MANIFEST, REPLICAS)).await;
    wait_healthy(&h, &old, REPLICAS).await;
    let new = h.put_rc(new_rc(nodes)).await;
    let roll = P2Roll {
        old: old.clone(),
        new: new.clone(),
        desired: REPLICAS as i64,
        minimum: MINIMUM as i64,
    };
    let run = tokio::spawn(p2::rolling_update(h.store.clone(), roll));
    follow_roll(&h, &old, &new).await;
    run.await.unwrap().unwrap();
}

async fn our_roll_with_our_rc_farm(backend: Backend, nodes: Nodes) {
    let h = fleet(backend, nodes).await;
    let old = h.put_rc(rc(MANIFEST, REPLICAS)).await;
    wait_healthy(&h, &old, REPLICAS).await;
    let new = h.put_rc(new_rc(nodes)).await;
    h.put_roll(&old, &new, REPLICAS, MINIMUM).await;
    follow_roll(&h, &old, &new).await;
    quiet_after_completion(&h, &new).await;
}

/// P2's RC worker fills nodes in name order and never removes a disabled RC's pods, so when
/// the new RC lands on a spare node that sorts first, an old pod is left over that nothing
/// will remove: our roll farm says so in an alert, and the minimum still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_left_with_old_pods_p2_will_not_remove_raises_an_alert() {
    let webhook = alert_webhook().await;
    let h = Harness::start_on(Backend::Sqlite, Some(webhook.uri())).await;
    h.web_nodes(REPLICAS).await;
    h.run_fake_nodes(START);
    let p2 = P2RcFarm::start(&h).await;
    let old = p2.put_rc(rc(MANIFEST, REPLICAS)).await;
    wait_healthy(&h, &old, REPLICAS).await;
    h.label(LabelType::Node, "node0", json!({"role": "web"}))
        .await;
    let new = p2.put_rc(rc(NEW_MANIFEST, 0)).await;
    h.put_roll(&old, &new, REPLICAS, MINIMUM).await;
    h.follow(|snapshot| {
        let healthy = snapshot.rc_pods(&old).1 + snapshot.rc_pods(&new).1;
        assert!(
            healthy >= MINIMUM,
            "{healthy} healthy at index {}",
            snapshot.index
        );
        (snapshot.rc_pods(&new) == (REPLICAS, REPLICAS)).then_some(())
    })
    .await;
    let description = h.alert_about(&webhook, &new).await;
    assert!(description.contains("old RC still has 1"), "{description}");
    assert_eq!(h.rc_nodes(&old).await, ["node3"]);
}

/// One test per backend and [`Nodes`] for each mix. P2's RC farm is not run with
/// [`Nodes::Elsewhere`]: it never removes a disabled RC's pods, so P2's own rolls do not
/// complete there either (see the alert test above).
macro_rules! mix {
    ($mix:ident: $($name:ident => $backend:expr, $nodes:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $mix($backend, $nodes).await;
        }
    )*};
}

mix!(our_roll_with_p2_rc_farm:
    our_roll_p2_rc_farm_sqlite_no_spare => Backend::Sqlite, Nodes::NoSpare;
    our_roll_p2_rc_farm_sqlite_spare => Backend::Sqlite, Nodes::Spare;
    our_roll_p2_rc_farm_consul_no_spare => Backend::FakeConsul, Nodes::NoSpare;
    our_roll_p2_rc_farm_consul_spare => Backend::FakeConsul, Nodes::Spare;
);

mix!(p2_rolling_update_with_our_rc_farm:
    p2_roll_our_rc_farm_sqlite_no_spare => Backend::Sqlite, Nodes::NoSpare;
    p2_roll_our_rc_farm_sqlite_spare => Backend::Sqlite, Nodes::Spare;
    p2_roll_our_rc_farm_consul_no_spare => Backend::FakeConsul, Nodes::NoSpare;
    p2_roll_our_rc_farm_consul_spare => Backend::FakeConsul, Nodes::Spare;
    p2_roll_our_rc_farm_sqlite_elsewhere => Backend::Sqlite, Nodes::Elsewhere;
    p2_roll_our_rc_farm_consul_elsewhere => Backend::FakeConsul, Nodes::Elsewhere;
);

mix!(our_roll_with_our_rc_farm:
    our_roll_our_rc_farm_sqlite_no_spare => Backend::Sqlite, Nodes::NoSpare;
    our_roll_our_rc_farm_sqlite_spare => Backend::Sqlite, Nodes::Spare;
    our_roll_our_rc_farm_consul_no_spare => Backend::FakeConsul, Nodes::NoSpare;
    our_roll_our_rc_farm_consul_spare => Backend::FakeConsul, Nodes::Spare;
    our_roll_our_rc_farm_sqlite_elsewhere => Backend::Sqlite, Nodes::Elsewhere;
    our_roll_our_rc_farm_consul_elsewhere => Backend::FakeConsul, Nodes::Elsewhere;
);
