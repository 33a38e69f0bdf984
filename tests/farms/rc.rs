//! The RC farm, driven directly against the embedded store (no HTTP).

use std::time::Duration;

use crate::support::farms::{large_pod_labels, rc_doc, Backend, Harness, MANIFEST};
use p2_apiserver::kv::Cas;
use p2_apiserver::labels::LabelType;
use p2_apiserver::layout;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_scales_down_and_moves_pods() {
    let h = Harness::start().await;
    for i in 1..=5 {
        let role = if i <= 4 { "web" } else { "db" };
        h.label(LabelType::Node, &format!("node{i}"), json!({"role": role}))
            .await;
    }
    let id = h
        .put_rc(
            rc_doc(MANIFEST, "role=web", 3)
                .pod_labels(json!({"app": "hello"}))
                .strategy("dynamic_strategy"),
        )
        .await;
    let nodes = h.wait_for_rc_nodes(&id, 3).await;
    assert!(nodes.iter().all(|n| n != "node5"), "{nodes:?}");
    let pod = h.pod_labels(&nodes[0], "hello").await;
    assert_eq!(pod["replication_controller_id"], id.as_str());
    assert_eq!(pod["pod_id"], "hello");
    assert_eq!(pod["app"], "hello");
    assert_eq!(
        h.intent(&nodes[0], "hello").await.as_deref(),
        Some(MANIFEST)
    );

    // Relabelling a node moves its pod (dynamic strategy).
    h.label(LabelType::Node, &nodes[0], json!({"role": "db"}))
        .await;
    let moved = h
        .wait_until(|| async {
            let now = h.rc_nodes(&id).await;
            (now.len() == 3 && !now.contains(&nodes[0])).then_some(now)
        })
        .await;
    assert!(h.intent(&nodes[0], "hello").await.is_none());

    // Scaling down removes pods from ineligible nodes first.
    h.label(LabelType::Node, &moved[0], json!({"role": "db"}))
        .await;
    h.set_replicas(&id, 2).await;
    let after = h.wait_for_rc_nodes(&id, 2).await;
    assert!(
        !after.contains(&moved[0]),
        "{after:?} still has {}",
        moved[0]
    );
    assert!(h.audit_records().await >= 3);
    drop(h);
    tokio::time::sleep(Duration::from_millis(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rcs_owned_by_another_farm_are_left_alone() {
    use p2_apiserver::kv::SessionSpec;
    let h = Harness::start().await;
    h.label(LabelType::Node, "node1", json!({"role": "web"}))
        .await;
    let spec = SessionSpec::deleting("another farm", Duration::from_secs(60));
    let other = h.store.create_session(&spec).await.unwrap();
    let rc = rc_doc(MANIFEST, "", 1).pod_labels(serde_json::Value::Null);
    let id = uuid::Uuid::new_v4().to_string();
    let lock = format!("lock/replication_controllers/{id}");
    assert!(h.store.acquire(&lock, b"", &other).await.unwrap());
    h.put_rc_as(&id, rc.clone()).await;
    // A second RC proves the farm is running and has looked at both.
    let mine = h.put_rc(rc).await;
    h.wait_for_rc_nodes(&mine, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(h.rc_nodes(&id).await.is_empty());
    // Once the other farm lets go, this one takes the RC over.
    h.store.destroy_session(&other).await.unwrap();
    h.set_replicas(&mine, 0).await;
    h.wait_for_rc_nodes(&mine, 0).await;
    h.wait_for_rc_nodes(&id, 1).await;
}

/// A node whose pod lost its intent while its labels still name a daemon set is that daemon
/// set's to put back: an RC of the same pod id does not take it as a free node, which would
/// label the pod for both and set the two farms rewriting its intent in turn for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_intent_went_is_left_to_the_daemon_set_its_labels_name() {
    use p2_apiserver::kv::Cas;
    let h = Harness::start().await;
    h.label(LabelType::Node, "node1", json!({"role": "web"}))
        .await;
    let ds = h
        .put_ds(
            json!({"disabled": false, "manifest": MANIFEST, "min_health": 0,
                       "cluster_name": "production", "node_selector": "role=web",
                       "pod_id": "hello", "timeout": 600_000_000_000u64}),
        )
        .await;
    h.wait_until(|| async {
        (h.labelled_nodes("daemon_set_id", &ds).await == ["node1"]).then_some(())
    })
    .await;
    // Matching no node any more, the daemon set keeps its pod but does not put its intent
    // back before the RC looks.
    h.label(LabelType::Node, "node1", json!({"role": "spare"}))
        .await;
    h.store
        .delete("intent/node1/hello", Cas::Any)
        .await
        .unwrap();
    let rc = h.put_rc(rc_doc(MANIFEST, "", 1)).await;
    // The RC has looked once it says it lacks nodes.
    h.wait_until(|| async {
        let key = format!("p2-apiserver/conditions/rcs/{rc}");
        h.store.get(&key).await.unwrap().map(drop)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(h.rc_nodes(&rc).await.is_empty());
    assert_eq!(h.intent("node1", "hello").await, None);

    // Matching it again, the daemon set puts its pod back.
    h.label(LabelType::Node, "node1", json!({"role": "web"}))
        .await;
    h.wait_until(|| async { h.intent("node1", "hello").await })
        .await;
    assert!(h.rc_nodes(&rc).await.is_empty());
}

/// A disabled RC puts nothing back, so the labels it left on a pod whose intent went hold
/// that node for nobody: the new RC of a roll takes it, as it takes the old RC's pods in
/// place, instead of waiting for a node the old RC will never free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_left_without_intent_by_a_disabled_rc_is_taken_by_another() {
    use p2_apiserver::kv::Cas;
    let h = Harness::start().await;
    h.label(LabelType::Node, "node1", json!({"role": "web"}))
        .await;
    let rc = |disabled: bool| rc_doc(MANIFEST, "role=web", 1).disabled(disabled);
    let old = h.put_rc(rc(false)).await;
    h.wait_for_rc_nodes(&old, 1).await;
    h.edit_rc(&old, |doc| doc["disabled"] = true.into()).await;
    h.store
        .delete("intent/node1/hello", Cas::Any)
        .await
        .unwrap();
    let new = h.put_rc(rc(false)).await;
    h.wait_for_rc_nodes(&new, 1).await;
    assert_eq!(h.intent("node1", "hello").await.as_deref(), Some(MANIFEST));
    assert!(h.rc_nodes(&old).await.is_empty());
}

/// A node whose pod label key holds something that is not a label set is skipped: placing a
/// pod there cannot succeed, and the RC's other placements, written with it, failed with it
/// on every pass, so the RC never scaled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_unreadable_pod_labels_does_not_hold_up_the_rc() {
    use p2_apiserver::kv::Cas;
    let h = Harness::start().await;
    h.web_nodes(3).await;
    h.store
        .put("labels/pod/node1/hello", b"not a label set", Cas::Any)
        .await
        .unwrap();
    let id = h.put_rc(rc_doc(MANIFEST, "role=web", 2)).await;
    assert_eq!(h.wait_for_rc_nodes(&id, 2).await, ["node2", "node3"]);
    assert_eq!(h.intent("node1", "hello").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_eligible_nodes_raise_an_alert() {
    use wiremock::matchers::{body_partial_json, method};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let webhook = MockServer::start().await;
    Mock::given(method("POST"))
        .and(body_partial_json(
            json!({"urgency": "low", "event_type": "trigger"}),
        ))
        .respond_with(ResponseTemplate::new(200))
        .expect(1..)
        .mount(&webhook)
        .await;
    let h = Harness::start_with_alerts(Some(webhook.uri())).await;
    h.label(LabelType::Node, "node1", json!({"role": "web"}))
        .await;
    let id = h.put_rc(rc_doc(MANIFEST, "role=web", 2)).await;
    h.wait_for_rc_nodes(&id, 1).await;
    let alert = h
        .wait_until(|| async {
            webhook
                .received_requests()
                .await
                .unwrap_or_default()
                .into_iter()
                .next()
        })
        .await;
    let body: serde_json::Value = serde_json::from_slice(&alert.body).unwrap();
    assert_eq!(body["incident_key"], id.as_str());
    assert_eq!(body["details"]["pod_id"], "hello");
}

/// The farm frees the ownership lock and removes the conditions of each RC deleted under
/// it, however many go at once (more than fit one transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locks_and_conditions_of_deleted_rcs_are_removed() {
    let h = Harness::start().await;
    let rc = rc_doc(MANIFEST, "", 0).pod_labels(serde_json::Value::Null);
    let mut ids = Vec::new();
    for _ in 0..p2_apiserver::kv::MAX_TXN_OPS + 10 {
        ids.push(h.put_rc(rc.clone()).await);
    }
    let store = &h.store;
    let under = |prefix: &'static str| async move {
        let pairs = store.list(prefix).await.unwrap().pairs.into_iter();
        let ids = pairs.filter_map(|pair| {
            let id = pair.key.strip_prefix(prefix)?;
            (!id.contains('/')).then(|| id.to_owned())
        });
        ids.collect::<Vec<_>>()
    };
    let (locks, conditions) = (
        "lock/replication_controllers/",
        "p2-apiserver/conditions/rcs/",
    );
    h.wait_until(|| async {
        let all =
            under(locks).await.len() == ids.len() && under(conditions).await.len() == ids.len();
        all.then_some(())
    })
    .await;
    for id in &ids {
        let key = format!("replication_controllers/{id}");
        h.store
            .delete(&key, p2_apiserver::kv::Cas::Any)
            .await
            .unwrap();
    }
    h.wait_until(|| async {
        let none = under(locks).await.is_empty() && under(conditions).await.is_empty();
        none.then_some(())
    })
    .await;
}

/// Labels nodes `node01` to `node<count>` `role=web`.
async fn label_web_nodes(h: &Harness, count: usize) {
    for i in 1..=count {
        h.label(
            LabelType::Node,
            &format!("node{i:02}"),
            json!({"role": "web"}),
        )
        .await;
    }
}

/// A manifest of 60 KB: twenty intents of it are more than a transaction may carry.
fn large_manifest() -> String {
    format!("{MANIFEST}config:\n  blob: {}\n", "x".repeat(60_000))
}

/// An RC of a large manifest is scheduled in batches the store takes, on every backend.
async fn schedules_a_large_manifest_on(backend: Backend) {
    let h = Harness::start_on(backend, None).await;
    label_web_nodes(&h, 20).await;
    let manifest = large_manifest();
    let id = h
        .put_rc(rc_doc(&manifest, "role=web", 20).strategy("static_strategy"))
        .await;
    let nodes = h.wait_for_rc_nodes(&id, 20).await;
    assert_eq!(
        h.intent(&nodes[0], "hello").await.as_deref(),
        Some(manifest.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rc_of_a_large_manifest_is_scheduled() {
    schedules_a_large_manifest_on(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rc_of_a_large_manifest_is_scheduled_through_consul() {
    schedules_a_large_manifest_on(Backend::FakeConsul).await;
}

/// An RC on so many nodes that its audit record (P2's, listing every node it is on) fills
/// most of a transaction is scheduled in batches small enough to leave room for it, on every
/// backend.
async fn schedules_an_rc_whose_audit_record_fills_most_of_a_transaction_on(backend: Backend) {
    let h = Harness::start_on(backend, None).await;
    // 1,400 names of 250 characters: the audit record is about 470 KB in base64, so twenty
    // intents of a 2 KB manifest beside it are more than a transaction may carry.
    const NODES: usize = 1_400;
    for i in 0..NODES {
        let name = format!("{}{i:04}", "n".repeat(246));
        h.label(LabelType::Node, &name, json!({"role": "web"}))
            .await;
    }
    let manifest = format!("{MANIFEST}config:\n  blob: {}\n", "x".repeat(2_000));
    let id = h.put_rc(rc_doc(&manifest, "role=web", NODES)).await;
    h.wait_for_rc_nodes(&id, NODES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rc_whose_audit_record_fills_most_of_a_transaction_is_scheduled() {
    schedules_an_rc_whose_audit_record_fills_most_of_a_transaction_on(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rc_whose_audit_record_fills_most_of_a_transaction_is_scheduled_through_consul() {
    schedules_an_rc_whose_audit_record_fills_most_of_a_transaction_on(Backend::FakeConsul).await;
}

/// An RC whose pod labels are large (600 labels, about 45 KB, which every pod carries) is
/// scheduled in batches the store takes, on every backend: twenty pods' labels are more
/// than a transaction may carry.
async fn schedules_an_rc_of_large_pod_labels_on(backend: Backend) {
    let h = Harness::start_on(backend, None).await;
    label_web_nodes(&h, 20).await;
    let labels = large_pod_labels();
    let id = h
        .put_rc(rc_doc(MANIFEST, "role=web", 20).pod_labels(labels))
        .await;
    let nodes = h.wait_for_rc_nodes(&id, 20).await;
    assert_eq!(h.pod_labels(&nodes[0], "hello").await.len(), 602);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rc_of_large_pod_labels_is_scheduled() {
    schedules_an_rc_of_large_pod_labels_on(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rc_of_large_pod_labels_is_scheduled_through_consul() {
    schedules_an_rc_of_large_pod_labels_on(Backend::FakeConsul).await;
}

/// An RC scaled to 0 and deleted while the farm's write placing its pod is on its way (a pass
/// over many RCs writes each from the world it began with) must not get that pod: nothing
/// removes the pods of an RC that is gone, so it would run for good with no owner. The
/// farm's writes hold only while the RC is as the farm read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_is_not_placed_for_an_rc_deleted_while_its_placement_was_on_its_way() {
    let (h, store) = Harness::start_counted().await;
    h.label(LabelType::Node, "n1", json!({"role": "web"})).await;
    let held = store.hold_next_txn_on("intent/");
    let id = h.put_rc(rc_doc(MANIFEST, "role=web", 1)).await;
    held.reached().await;
    // As a client would through the API: scaled to 0 (nothing placed yet), then deleted.
    h.set_replicas(&id, 0).await;
    let key = format!("replication_controllers/{id}");
    h.store.delete(&key, Cas::Any).await.unwrap();
    held.release();

    // The farm lets go of the RC once it sees it gone, after its held write.
    let lock = layout::rc_ownership(&id);
    h.wait_until(|| async { h.store.get(&lock).await.unwrap().is_none().then_some(()) })
        .await;
    assert_eq!(
        h.rc_nodes(&id).await,
        Vec::<String>::new(),
        "the deleted RC {id} was given a pod"
    );
    assert_eq!(h.intent("n1", "hello").await, None);
}

/// Through Consul, whose blocking read of a tree that holds nothing (answered at the whole
/// store's index) may wait out its whole wait while other trees change: the farms' worlds,
/// each caught up to the newest index a tree shows, must not wait for that wait to end
/// before they act (the rolls and daemon sets trees here hold nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rc_is_scheduled_and_scaled_through_consul_beside_trees_that_hold_nothing() {
    let h = Harness::start_on(Backend::FakeConsul, None).await;
    an_rc_is_scheduled_and_scaled_on_four_nodes(&h).await;
}

/// Through a Consul written faster than a round trip, beside trees that hold nothing (the
/// rolls, the daemon sets, the pods' reality and health): each lists at the KV table's
/// index, which the writes move between any two listings, so a world caught up to the
/// newest index a listing showed had the other such trees listed again, newer still, round
/// after round, and the farms never acted. Both ways Consul may wake a blocking read of
/// such a tree are tried: on any write, and only on its own changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rc_is_scheduled_and_scaled_through_consul_written_faster_than_a_round_trip() {
    for lazy in [false, true] {
        let h = Harness::start_on(Backend::FakeConsul, None).await;
        let empty_reads = h.empty_reads.as_ref().unwrap();
        empty_reads.lazy(lazy);
        empty_reads.overtaken(true);
        an_rc_is_scheduled_and_scaled_on_four_nodes(&h).await;
    }
}

/// An RC of two pods on four web nodes is scheduled, then scaled to three.
async fn an_rc_is_scheduled_and_scaled_on_four_nodes(h: &Harness) {
    h.web_nodes(4).await;
    let id = h.put_rc(rc_doc(MANIFEST, "role=web", 2)).await;
    h.wait_for_rc_nodes(&id, 2).await;
    h.set_replicas(&id, 3).await;
    h.wait_for_rc_nodes(&id, 3).await;
}
