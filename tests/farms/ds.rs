//! The DS farm, driven directly against the embedded store (no HTTP).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::farms::{
    alert_webhook, large_pod_labels, rc_doc, warnings, Backend, Harness, MANIFEST, NEW_MANIFEST,
};
use p2_apiserver::kv::{Cas, KvStore, SessionSpec};
use p2_apiserver::labels::LabelType;
use p2_apiserver::layout;
use p2_apiserver::model::event::{Action, Event, ObjectKind};
use p2_apiserver::model::Manifest;
use serde_json::{json, Value};

const DS_ID: &str = "daemon_set_id";
/// Long enough for the farm to have acted on a change it must ignore.
const SETTLE: Duration = Duration::from_millis(600);

fn ds_doc(selector: &str, min_health: i64, timeout: Duration) -> Value {
    json!({"disabled": false, "manifest": MANIFEST, "min_health": min_health,
           "cluster_name": "production", "node_selector": selector, "pod_id": "hello",
           "timeout": timeout.as_nanos() as u64})
}

fn sha(manifest: &str) -> String {
    Manifest::parse(manifest).unwrap().sha()
}

async fn wait_for_ds_nodes(h: &Harness, id: &str, expected: &[&str]) {
    h.wait_until(|| async { (h.labelled_nodes(DS_ID, id).await == expected).then_some(()) })
        .await;
}

/// Intents of pod `hello` holding `manifest`.
async fn intents_with(h: &Harness, manifest: &str) -> usize {
    let listing = h.store.list("intent/").await.unwrap();
    listing
        .pairs
        .iter()
        .filter(|pair| pair.key.ends_with("/hello") && &*pair.value == manifest.as_bytes())
        .count()
}

/// Reports a pod running its intent and passing, as a node agent would.
async fn report_healthy(store: &dyn KvStore, node: &str, pod_id: &str) {
    let intent = store
        .get(&format!("intent/{node}/{pod_id}"))
        .await
        .unwrap()
        .unwrap();
    store
        .put(&format!("reality/{node}/{pod_id}"), &intent.value, Cas::Any)
        .await
        .unwrap();
    let health = json!({"Id": pod_id, "Node": node, "Service": pod_id, "Status": "passing",
                        "Time": "2026-01-01T00:00:00Z", "Expires": "2126-01-01T00:00:00Z"});
    store
        .put(
            &format!("health/{pod_id}/{node}"),
            health.to_string().as_bytes(),
            Cas::Any,
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lands_on_matching_nodes_and_leaves_relabelled_ones_but_never_all() {
    let h = Harness::start().await;
    h.web_nodes(3).await;
    h.label(LabelType::Node, "node4", json!({"role": "db"}))
        .await;
    // A matching node already running pod `hello` for someone else is left alone.
    h.label(LabelType::Node, "node5", json!({"role": "web"}))
        .await;
    h.store
        .put("intent/node5/hello", b"id: hello\n", Cas::Any)
        .await
        .unwrap();

    let id = h
        .put_ds(ds_doc("role=web", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, &id, &["node1", "node2", "node3"]).await;
    let labels = h.pod_labels("node1", "hello").await;
    assert_eq!(labels.len(), 1, "{labels:?}");
    assert_eq!(labels[DS_ID], id);
    assert_eq!(h.intent("node1", "hello").await.as_deref(), Some(MANIFEST));
    assert_eq!(
        h.intent("node5", "hello").await.as_deref(),
        Some("id: hello\n")
    );
    let status = h.wait_until(|| async { h.ds_status(&id).await }).await;
    assert_eq!(status["manifest_sha"], sha(MANIFEST).as_str());
    assert_eq!(status["nodes_deployed"], 0);
    assert_eq!(
        status["replication_in_progress"], true,
        "no node is healthy"
    );

    h.label(LabelType::Node, "node3", json!({"role": "db"}))
        .await;
    wait_for_ds_nodes(&h, &id, &["node1", "node2"]).await;
    assert!(h.intent("node3", "hello").await.is_none());

    // No node matches any more: the failsafe keeps the last pods.
    h.edit_ds(&id, |doc| doc["node_selector"] = "role=cache".into())
        .await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(h.labelled_nodes(DS_ID, &id).await, ["node1", "node2"]);
    assert_eq!(h.intent("node2", "hello").await.as_deref(), Some(MANIFEST));
}

/// A node whose labels cannot be read may or may not be eligible: its pod stays, as P2's
/// farm, whose node selection fails on such a key, changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_labels_cannot_be_read_keeps_its_pod() {
    let h = Harness::start().await;
    h.web_nodes(3).await;
    let id = h
        .put_ds(ds_doc("role=web", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, &id, &["node1", "node2", "node3"]).await;

    h.store
        .put("labels/node/node3", b"{not json", Cas::Any)
        .await
        .unwrap();
    // A node added after it shows that the farm has looked since.
    h.label(LabelType::Node, "node4", json!({"role": "web"}))
        .await;
    wait_for_ds_nodes(&h, &id, &["node1", "node2", "node3", "node4"]).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        h.labelled_nodes(DS_ID, &id).await,
        ["node1", "node2", "node3", "node4"]
    );
    assert_eq!(h.intent("node3", "hello").await.as_deref(), Some(MANIFEST));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_contending_daemon_sets_the_newer_is_disabled() {
    let h = Harness::start().await;
    h.web_nodes(2).await;
    let older = h
        .put_ds(ds_doc("role=web", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, &older, &["node1", "node2"]).await;
    let newer = h.put_ds(ds_doc("", 0, Duration::from_secs(600))).await;

    h.wait_until(|| async { (h.ds(&newer).await["disabled"] == true).then_some(()) })
        .await;
    assert_eq!(h.ds(&older).await["disabled"], false);
    assert!(h.labelled_nodes(DS_ID, &newer).await.is_empty());
    let audit = h.store.list("audit_logs/").await.unwrap();
    let disabled: Vec<Value> = audit
        .pairs
        .iter()
        .map(|pair| serde_json::from_slice::<Value>(&pair.value).unwrap())
        .filter(|record| record["event_type"] == "DAEMON_SET_DISABLED")
        .collect();
    assert_eq!(disabled.len(), 1, "{disabled:?}");
    assert_eq!(
        disabled[0]["event_details"]["daemon_set"]["id"],
        newer.as_str()
    );
    assert_eq!(disabled[0]["event_details"]["daemon_set"]["disabled"], true);
}

/// Nodes relabelled into two daemon sets raise an alert for each, once, as the contention
/// starts: no daemon set is disabled for it, so only an operator ends it. Later passes while
/// it lasts (nodes added to each) raise no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_relabelled_into_two_daemon_sets_raise_an_alert_once() {
    let webhook = alert_webhook().await;
    let h = Harness::start_with_alerts(Some(webhook.uri())).await;
    h.label(LabelType::Node, "node1", json!({"zone": "a"}))
        .await;
    h.label(LabelType::Node, "node2", json!({"tier": "web"}))
        .await;
    let zoned = h
        .put_ds(ds_doc("zone=a", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, &zoned, &["node1"]).await;
    let tiered = h
        .put_ds(ds_doc("tier=web", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, &tiered, &["node2"]).await;

    h.label(
        LabelType::Node,
        "node2",
        json!({"zone": "a", "tier": "web"}),
    )
    .await;
    for (id, rival) in [(&zoned, &tiered), (&tiered, &zoned)] {
        let incident = format!("ds_node_labels_contend/{id}");
        let description = h.alert_about(&webhook, &incident).await;
        assert!(description.contains(rival.as_str()), "{description}");
        assert!(description.contains("node2"), "{description}");
    }
    // Passes since: each daemon set has placed a pod on a node added after the alert.
    h.label(LabelType::Node, "node3", json!({"zone": "a"}))
        .await;
    h.label(LabelType::Node, "node4", json!({"tier": "web"}))
        .await;
    wait_for_ds_nodes(&h, &zoned, &["node1", "node3"]).await;
    wait_for_ds_nodes(&h, &tiered, &["node2", "node4"]).await;
    let posted: Vec<String> = (webhook.received_requests().await.unwrap().into_iter())
        .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap())
        .filter_map(|alert| Some(alert["incident_key"].as_str()?.to_owned()))
        .filter(|key| key.starts_with("ds_node_labels_contend/"))
        .collect();
    assert_eq!(posted.len(), 2, "{posted:?}");
}

/// A daemon set written into contention with an older one, that another farm owns, is that
/// farm's to disable: this farm disables only what it owns. The older one, left enabled
/// beside it, does not claim that nothing contends with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contending_daemon_set_another_farm_owns_is_named_not_disabled() {
    let h = Harness::start().await;
    h.web_nodes(2).await;
    let older = h
        .put_ds(ds_doc("role=web", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, &older, &["node1", "node2"]).await;

    let newer = uuid::Uuid::new_v4().to_string();
    let spec = SessionSpec::deleting("another farm", Duration::from_secs(120));
    let other = h.store.create_session(&spec).await.unwrap();
    let lock = layout::ds_ownership(&newer);
    assert!(h.store.acquire(&lock, b"", &other).await.unwrap());
    let mut doc = ds_doc("", 0, Duration::from_secs(600));
    doc["id"] = newer.clone().into();
    h.store
        .put(
            &format!("daemon_sets/{newer}"),
            doc.to_string().as_bytes(),
            Cas::Index(0),
        )
        .await
        .unwrap();
    // A node added since shows that the older one has been reconciled (its conditions
    // published first) with the newer one in view.
    h.label(LabelType::Node, "node3", json!({"role": "web"}))
        .await;
    wait_for_ds_nodes(&h, &older, &["node1", "node2", "node3"]).await;

    assert_eq!(h.ds(&newer).await["disabled"], false, "not this farm's");
    let Some(condition) = contended(&h, &older).await else {
        let key = layout::conditions(ObjectKind::Daemonsets, &older);
        let stored = h.store.get(&key).await.unwrap().unwrap();
        panic!("{}", String::from_utf8_lossy(&stored.value));
    };
    assert_eq!(
        condition["reason"], "ContenderOwnedElsewhere",
        "{condition}"
    );
    let message = condition["message"].as_str().unwrap();
    assert!(message.contains(&newer), "{message}");
    assert!(message.contains("another farm owns it"), "{message}");
}

/// The `Contended` condition stored for daemon set `id` once it is true.
async fn contended(h: &Harness, id: &str) -> Option<Value> {
    let pair = h
        .store
        .get(&layout::conditions(ObjectKind::Daemonsets, id))
        .await
        .unwrap()?;
    let record: Value = serde_json::from_slice(&pair.value).unwrap();
    let conditions = record["conditions"].as_array()?;
    conditions
        .iter()
        .find(|c| c["type"] == "Contended" && c["status"] == "True")
        .cloned()
}

/// Two daemon sets of one pod id that ran side by side, until nodes were relabelled to match
/// both: their writes made no contention, so neither is disabled (which would take its pods
/// off every node for one node's labels). A contended node stays with the daemon set running
/// there, one neither runs gets neither, and both say so in their conditions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_relabelled_into_two_daemon_sets_disable_neither() {
    let h = Harness::start().await;
    h.label(LabelType::Node, "node1", json!({"zone": "a"}))
        .await;
    h.label(LabelType::Node, "node2", json!({"tier": "web"}))
        .await;
    let zoned = h
        .put_ds(ds_doc("zone=a", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, &zoned, &["node1"]).await;
    let tiered = h
        .put_ds(ds_doc("tier=web", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, &tiered, &["node2"]).await;

    let both = json!({"zone": "a", "tier": "web"});
    h.label(LabelType::Node, "node2", both.clone()).await;
    h.label(LabelType::Node, "node3", both).await;
    let condition = h.wait_until(|| contended(&h, &tiered)).await;
    assert_eq!(
        (
            h.ds(&zoned).await["disabled"].clone(),
            h.ds(&tiered).await["disabled"].clone()
        ),
        (json!(false), json!(false)),
        "neither daemon set is disabled for a node's labels: {condition}"
    );
    for id in [&zoned, &tiered] {
        h.wait_until(|| async {
            let condition = contended(&h, id).await?;
            let message = condition["message"].as_str()?.to_owned();
            (condition["reason"] == "NodeLabelsContend" && message.contains("node3")).then_some(())
        })
        .await;
    }
    // Nodes added since show that both have placed pods after the relabelling.
    h.label(LabelType::Node, "node4", json!({"zone": "a"}))
        .await;
    h.label(LabelType::Node, "node5", json!({"tier": "web"}))
        .await;
    wait_for_ds_nodes(&h, &zoned, &["node1", "node4"]).await;
    wait_for_ds_nodes(&h, &tiered, &["node2", "node5"]).await;
    assert!(h.intent("node3", "hello").await.is_none());

    // A selector edited into contention is the edit's doing: the one edited is disabled.
    h.edit_ds(&tiered, |doc| doc["node_selector"] = "zone=a".into())
        .await;
    h.wait_until(|| async { (h.ds(&tiered).await["disabled"] == true).then_some(()) })
        .await;
    assert_eq!(h.ds(&zoned).await["disabled"], false);
}

/// A pod whose intent went while its labels still name its RC (deleted by hand, say) is the
/// RC's to put back: a daemon set of the same pod id leaves that node alone. Taking it would
/// label the pod for both, and the two farms would rewrite its intent in turn for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_intent_went_is_left_to_the_rc_its_labels_name() {
    let h = Harness::start().await;
    h.web_nodes(3).await;
    let rc = h
        .put_rc(rc_doc(MANIFEST, "role=web", 1).strategy("static_strategy"))
        .await;
    let node = h.wait_for_rc_nodes(&rc, 1).await.remove(0);
    // Its node out of the selector, the static RC keeps the pod but does not put its intent
    // back before the daemon set looks.
    h.label(LabelType::Node, &node, json!({"role": "spare"}))
        .await;
    let intent = format!("intent/{node}/hello");
    h.store.delete(&intent, Cas::Any).await.unwrap();
    let mut doc = ds_doc("", 0, Duration::from_secs(600));
    doc["manifest"] = NEW_MANIFEST.into();
    let ds = h.put_ds(doc).await;
    h.wait_until(|| async { (h.labelled_nodes(DS_ID, &ds).await.len() >= 2).then_some(()) })
        .await;
    tokio::time::sleep(SETTLE).await;
    assert!(!h.labelled_nodes(DS_ID, &ds).await.contains(&node));
    assert_eq!(h.intent(&node, "hello").await, None);

    // In the selector again, the RC puts its pod back, and the pod stays as it put it.
    h.label(LabelType::Node, &node, json!({"role": "web"}))
        .await;
    let index = h
        .wait_until(|| async {
            let pair = h.store.get(&intent).await.unwrap()?;
            (&*pair.value == MANIFEST.as_bytes()).then_some(pair.modify_index)
        })
        .await;
    tokio::time::sleep(SETTLE).await;
    let pair = h.store.get(&intent).await.unwrap().unwrap();
    assert_eq!(
        pair.modify_index, index,
        "the intent is rewritten again and again"
    );
    assert_eq!(h.rc_nodes(&rc).await, [node]);
}

/// A pod labelled for both an RC and a daemon set (as P2's farms may leave one, each placing
/// its pod without looking at the other's labels) is left to the RC: the daemon set does not
/// write its manifest over the RC's, which the RC would write back, for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_labelled_for_an_rc_too_is_left_to_the_rc() {
    let h = Harness::start().await;
    h.label(LabelType::Node, "node1", json!({"role": "web"}))
        .await;
    h.label(LabelType::Node, "node2", json!({"role": "db"}))
        .await;
    let rc = h.put_rc(rc_doc(MANIFEST, "role=web", 1)).await;
    h.wait_for_rc_nodes(&rc, 1).await;
    let mut doc = ds_doc("", 0, Duration::from_secs(600));
    doc["manifest"] = NEW_MANIFEST.into();
    let ds = h.put_ds(doc).await;
    wait_for_ds_nodes(&h, &ds, &["node2"]).await;
    // Another farm placed the daemon set's pod over the RC's, merging its label in.
    h.label(
        LabelType::Pod,
        "node1/hello",
        json!({"pod_id": "hello", "replication_controller_id": rc, DS_ID: ds}),
    )
    .await;
    h.store
        .put("intent/node1/hello", NEW_MANIFEST.as_bytes(), Cas::Any)
        .await
        .unwrap();

    let index = h
        .wait_until(|| async {
            let pair = h.store.get("intent/node1/hello").await.unwrap()?;
            (&*pair.value == MANIFEST.as_bytes()).then_some(pair.modify_index)
        })
        .await;
    tokio::time::sleep(SETTLE).await;
    let pair = h.store.get("intent/node1/hello").await.unwrap().unwrap();
    assert_eq!(
        (String::from_utf8_lossy(&pair.value), pair.modify_index),
        (MANIFEST.into(), index),
        "the daemon set and the RC rewrite the pod's intent in turn"
    );
}

/// When a daemon set is deleted, a pod of its that an RC's labels also name keeps running
/// for the RC: the cleanup takes only the daemon set's label off it, not its intent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_daemon_sets_pod_labelled_for_an_rc_too_keeps_running() {
    let h = Harness::start().await;
    h.web_nodes(1).await;
    let rc = h.put_rc(rc_doc(MANIFEST, "role=web", 1)).await;
    h.wait_for_rc_nodes(&rc, 1).await;
    let ds = h
        .put_ds(ds_doc("role=web", 0, Duration::from_secs(600)))
        .await;
    // Another farm labelled the RC's pod for the daemon set as well.
    h.label(
        LabelType::Pod,
        "node1/hello",
        json!({"pod_id": "hello", "replication_controller_id": rc, DS_ID: ds}),
    )
    .await;
    let intent = h.store.get("intent/node1/hello").await.unwrap().unwrap();
    h.wait_until(|| async { h.ds_status(&ds).await.map(drop) })
        .await;

    h.store
        .delete(&format!("daemon_sets/{ds}"), Cas::Any)
        .await
        .unwrap();
    wait_for_ds_nodes(&h, &ds, &[]).await;
    tokio::time::sleep(SETTLE).await;
    let now = h.store.get("intent/node1/hello").await.unwrap().unwrap();
    assert_eq!(
        (now.create_index, now.modify_index),
        (intent.create_index, intent.modify_index),
        "the RC's pod was removed (and put back)"
    );
    assert_eq!(h.rc_nodes(&rc).await, ["node1"]);
}

/// A daemon set of `min_health` over `nodes` web nodes run by fake agents, once every node
/// runs its pod healthy; returns its id.
async fn deployed_daemon_set(h: &Harness, nodes: usize, min_health: i64) -> String {
    h.web_nodes(nodes).await;
    h.run_fake_nodes(Duration::from_millis(100));
    let id = h
        .put_ds(ds_doc("role=web", min_health, Duration::from_secs(600)))
        .await;
    h.wait_until(|| async { (h.healthy_labelled(DS_ID, &id).await == nodes).then_some(()) })
        .await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_change_rolls_node_by_node_keeping_min_health() {
    let h = Harness::start().await;
    let id = deployed_daemon_set(&h, 5, 4).await;

    h.edit_ds(&id, |doc| doc["manifest"] = NEW_MANIFEST.into())
        .await;
    let lowest = AtomicUsize::new(usize::MAX);
    h.wait_until(|| async {
        let healthy = h.healthy_labelled(DS_ID, &id).await;
        lowest.fetch_min(healthy, Ordering::SeqCst);
        (healthy == 5 && intents_with(&h, NEW_MANIFEST).await == 5).then_some(())
    })
    .await;
    let lowest = lowest.into_inner();
    assert!(lowest >= 4, "healthy pods dropped to {lowest}");
    h.wait_until(|| async {
        let status = h.ds_status(&id).await?;
        (status
            == json!({"manifest_sha": sha(NEW_MANIFEST), "nodes_deployed": 5,
                      "replication_in_progress": false}))
        .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_that_never_comes_up_stops_at_min_health() {
    let h = Harness::start().await;
    h.web_nodes(5).await;
    let id = h
        .put_ds(ds_doc("role=web", 3, Duration::from_millis(200)))
        .await;
    h.wait_until(|| async { (intents_with(&h, MANIFEST).await == 5).then_some(()) })
        .await;
    for i in 1..=5 {
        report_healthy(h.store.as_ref(), &format!("node{i}"), "hello").await;
    }
    h.wait_until(|| async { (h.ds_status(&id).await?["nodes_deployed"] == 5).then_some(()) })
        .await;

    // Nobody runs the new manifest: two nodes are tried, time out, and hold the rest back.
    h.edit_ds(&id, |doc| doc["manifest"] = NEW_MANIFEST.into())
        .await;
    h.wait_until(|| async { (intents_with(&h, NEW_MANIFEST).await == 2).then_some(()) })
        .await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(intents_with(&h, NEW_MANIFEST).await, 2);
    assert_eq!(intents_with(&h, MANIFEST).await, 3);
    let status = h.ds_status(&id).await.unwrap();
    assert_eq!(status["manifest_sha"], sha(NEW_MANIFEST).as_str());
    assert_eq!(status["replication_in_progress"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dangling_pods_are_cleaned_up_but_an_empty_tree_wipes_nothing_unseen() {
    let h = Harness::start().await;
    h.web_nodes(2).await;
    // Pods of a daemon set this term never saw, while no daemon set is listed.
    let unknown = uuid::Uuid::new_v4().to_string();
    h.store
        .put("intent/node1/leftover", b"id: leftover\n", Cas::Any)
        .await
        .unwrap();
    h.label(LabelType::Pod, "node1/leftover", json!({DS_ID: unknown}))
        .await;
    tokio::time::sleep(SETTLE).await;
    assert!(h.intent("node1", "leftover").await.is_some());
    assert_eq!(h.labelled_nodes(DS_ID, &unknown).await, ["node1"]);

    // Once daemon sets are listed, pods of one that is not are dangling.
    let id = h
        .put_ds(ds_doc("role=web", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, &id, &["node1", "node2"]).await;
    h.wait_until(|| async { h.intent("node1", "leftover").await.is_none().then_some(()) })
        .await;
    assert!(h.labelled_nodes(DS_ID, &unknown).await.is_empty());
    let listing = h.store.list("p2-apiserver/events/").await.unwrap();
    let removal = listing
        .pairs
        .iter()
        .map(|pair| Event::from_json(&pair.value).unwrap())
        .find(|event| event.object_id == unknown)
        .expect("removing a gone daemon set's pods is an event");
    assert_eq!(removal.action, Action::Scheduled);
    assert!(removal.actor.starts_with("farm:ds@"), "{removal:?}");
    assert_eq!(
        (&removal.changes[0].before, &removal.changes[0].after),
        (&json!(["node1"]), &json!([]))
    );

    // Deleting the only daemon set empties the tree, but this term saw it exist.
    h.store
        .delete(&format!("daemon_sets/{id}"), Cas::Any)
        .await
        .unwrap();
    wait_for_ds_nodes(&h, &id, &[]).await;
    assert!(h.intent("node1", "hello").await.is_none());
    assert!(h.intent("node2", "hello").await.is_none());
    h.wait_until(|| async {
        let lock = h
            .store
            .get(&format!("lock/daemon_sets/{id}"))
            .await
            .unwrap();
        lock.is_none_or(|pair| pair.session().is_none())
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_set_of_a_large_manifest_is_scheduled_through_consul() {
    let h = Harness::start_on(Backend::FakeConsul, None).await;
    h.web_nodes(20).await;
    // 60 KB: twenty intents of it are more than a transaction may carry.
    let manifest = format!("{MANIFEST}config:\n  blob: {}\n", "x".repeat(60_000));
    let mut doc = ds_doc("role=web", 0, Duration::from_secs(600));
    doc["manifest"] = manifest.clone().into();
    let id = h.put_ds(doc).await;
    h.wait_until(|| async { (h.labelled_nodes(DS_ID, &id).await.len() == 20).then_some(()) })
        .await;
    assert_eq!(intents_with(&h, &manifest).await, 20);
}

/// The cleanup of a deleted daemon set's pods takes its label off pods an RC keeps, writing
/// back their other labels as they are. With an RC's large labels (600, about 45 KB a pod),
/// twenty such pods are more than one transaction may carry, so the cleanup's batches are
/// bounded by their size too, not by their number alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_daemon_sets_label_comes_off_pods_with_large_labels() {
    let h = Harness::start().await;
    h.web_nodes(20).await;
    let labels = large_pod_labels();
    let rc = h
        .put_rc(rc_doc(MANIFEST, "role=web", 20).pod_labels(labels))
        .await;
    let nodes = h.wait_for_rc_nodes(&rc, 20).await;
    // Labelled for a daemon set too while none is listed (so the farm keeps them), then
    // found dangling all at once when another daemon set is.
    let gone = "00000000-0000-4000-8000-0000000000dd";
    for node in &nodes {
        let mut labels = h.pod_labels(node, "hello").await;
        labels.insert(DS_ID.to_owned(), gone.to_owned());
        h.label(LabelType::Pod, &format!("{node}/hello"), json!(labels))
            .await;
    }
    h.put_ds(ds_doc("role=db", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, gone, &[]).await;
    assert_eq!(h.rc_nodes(&rc).await, nodes);
}

/// A daemon set's status record does not outlive it: one left by a delete that did not
/// remove it (P2's tools), or written again by a farm pass that ran during the delete, is
/// removed once the daemon set is gone, and stays gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_record_of_a_deleted_daemon_set_is_removed() {
    let h = Harness::start().await;
    h.web_nodes(1).await;
    let id = h
        .put_ds(ds_doc("role=web", 0, Duration::from_secs(600)))
        .await;
    let status = h.wait_until(|| async { h.ds_status(&id).await }).await;
    h.store
        .delete(&format!("daemon_sets/{id}"), Cas::Any)
        .await
        .unwrap();
    h.wait_until(|| async { h.ds_status(&id).await.is_none().then_some(()) })
        .await;
    // A pass that read the daemon set before its delete publishes its status after it.
    let key = format!("status/daemon_sets/{id}/daemon_set_farm");
    h.store
        .put(&key, status.to_string().as_bytes(), Cas::Any)
        .await
        .unwrap();
    h.wait_until(|| async { h.ds_status(&id).await.is_none().then_some(()) })
        .await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(h.ds_status(&id).await, None);
}

/// P2's way to hand a pod over from one daemon set to another: disable the old one, create
/// the new one over the same nodes (contention allows it then), and P2's farm writes the new
/// daemon set's intent and label over the old one's pods, node by node. The new daemon set
/// must take the old one's pods over in place, keeping `min_health` of them healthy, so that
/// deleting the old one afterwards removes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_daemon_set_takes_over_a_disabled_ones_pods_in_place() {
    let h = Harness::start().await;
    let old = deployed_daemon_set(&h, 4, 0).await;
    h.edit_ds(&old, |doc| doc["disabled"] = true.into()).await;

    let mut doc = ds_doc("role=web", 3, Duration::from_secs(600));
    doc["manifest"] = NEW_MANIFEST.into();
    let new = h.put_ds(doc).await;
    let lowest = AtomicUsize::new(usize::MAX);
    h.wait_until(|| async {
        let healthy = h
            .snapshot()
            .await
            .pods()
            .iter()
            .filter(|(_, ok)| *ok)
            .count();
        lowest.fetch_min(healthy, Ordering::SeqCst);
        (h.healthy_labelled(DS_ID, &new).await == 4).then_some(())
    })
    .await;
    let lowest = lowest.into_inner();
    assert!(lowest >= 3, "healthy pods dropped to {lowest}");
    assert_eq!(intents_with(&h, NEW_MANIFEST).await, 4);
    assert!(h.labelled_nodes(DS_ID, &old).await.is_empty());
}

/// A daemon set disabled (to pause a rollout) while the farm's write of its new manifest is
/// on its way must not get that write: a pass writes each daemon set from the world it began
/// with, and the farm's writes hold only while the daemon set is as the farm read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_paused_while_its_write_was_on_its_way_writes_nothing() {
    let (h, store) = Harness::start_counted().await;
    let id = deployed_daemon_set(&h, 2, 0).await;
    let held = store.hold_next_txn_on("intent/");
    h.edit_ds(&id, |doc| doc["manifest"] = NEW_MANIFEST.into())
        .await;
    held.reached().await;
    h.edit_ds(&id, |doc| doc["disabled"] = true.into()).await;
    held.release();

    // The farm publishes the paused daemon set's status once it has seen it disabled.
    h.wait_until(|| async {
        let status = h.ds_status(&id).await?;
        (status["manifest_sha"] == sha(NEW_MANIFEST).as_str()
            && status["replication_in_progress"] == false)
            .then_some(())
    })
    .await;
    assert_eq!(
        intents_with(&h, NEW_MANIFEST).await,
        0,
        "the paused daemon set's new manifest was written"
    );
    assert_eq!(intents_with(&h, MANIFEST).await, 2);
}

/// A disabled daemon set whose stored selector does not parse (written by another tool)
/// changes no pods, so there is nothing to try again until it is written again: it says
/// why in its conditions, and its status tells no node targeted, but reconciling it is no
/// failure, logged and backed off at every retry for as long as it stays so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_daemon_set_whose_selector_does_not_parse_is_no_failure() {
    let h = Harness::start().await;
    h.web_nodes(1).await;
    let mut doc = ds_doc("role in (web", 0, Duration::from_secs(600));
    doc["disabled"] = true.into();
    let id = h.put_ds(doc).await;
    let conditions = layout::conditions(ObjectKind::Daemonsets, &id);
    let progressing = h
        .wait_until(|| async {
            let pair = h.store.get(&conditions).await.unwrap()?;
            let record: Value = serde_json::from_slice(&pair.value).unwrap();
            let found = record["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Progressing");
            found.cloned()
        })
        .await;
    assert_eq!(
        progressing["reason"], "InvalidNodeSelector",
        "{progressing}"
    );
    assert_eq!(progressing["status"], "False");

    // A daemon set stored now lands in a pass after the one that published those
    // conditions, whose reconcile of the first has ended by then.
    let other = h
        .put_ds(ds_doc("role=web", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, &other, &["node1"]).await;
    let failed = warnings("p2_apiserver::farms", &id);
    assert!(failed.is_empty(), "reconciling it failed: {failed:?}");
    let status = h.wait_until(|| async { h.ds_status(&id).await }).await;
    assert_eq!(status["manifest_sha"], sha(MANIFEST).as_str());
    assert_eq!(status["nodes_deployed"], 0);
    assert_eq!(status["replication_in_progress"], false);
    assert!(h.labelled_nodes(DS_ID, &id).await.is_empty());
}

/// The pods of a gone daemon set whose ownership lock another farm's live session still
/// holds are that farm's to clean up (P2's farm cleans up its own), even when its daemon set
/// reads as gone here: only the pods of one nobody owns are removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_daemon_sets_pods_another_farm_owns_are_left_to_it() {
    let h = Harness::start().await;
    h.web_nodes(1).await;
    // Cleaned up in id order: the owned one comes first, so the other's removal shows that
    // the cleanup has looked at it.
    let owned = "00000000-0000-4000-8000-000000000001";
    let unowned = "ffffffff-ffff-4fff-bfff-ffffffffffff";
    let spec = SessionSpec::deleting("another farm", Duration::from_secs(120));
    let other = h.store.create_session(&spec).await.unwrap();
    let lock = format!("lock/daemon_sets/{owned}");
    assert!(h.store.acquire(&lock, b"", &other).await.unwrap());
    for (pod, ds) in [("owned", owned), ("unowned", unowned)] {
        h.store
            .put(
                &format!("intent/node1/{pod}"),
                format!("id: {pod}\n").as_bytes(),
                Cas::Any,
            )
            .await
            .unwrap();
        h.label(LabelType::Pod, &format!("node1/{pod}"), json!({DS_ID: ds}))
            .await;
    }
    // A daemon set listed, so that the cleanup runs at all.
    let id = h
        .put_ds(ds_doc("role=web", 0, Duration::from_secs(600)))
        .await;
    wait_for_ds_nodes(&h, &id, &["node1"]).await;
    h.wait_until(|| async { h.intent("node1", "unowned").await.is_none().then_some(()) })
        .await;
    assert!(h.intent("node1", "owned").await.is_some());
    assert_eq!(h.labelled_nodes(DS_ID, owned).await, ["node1"]);
}
