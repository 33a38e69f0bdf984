//! Nodes, pods and pod health over the API, and the pod and health stores under it.

use std::time::{Duration, Instant};

use crate::support::api::{labels, times_out_at_its_index, TestApp, TestResponse};
use axum::body::Body;
use axum::http::StatusCode;
use p2_apiserver::kv::{Cas, StoreError};
use p2_apiserver::model::event::Actor;
use p2_apiserver::model::{HealthState, Manifest};
use p2_apiserver::store::health::HealthStore;
use p2_apiserver::store::labels::LabelRecord;
use p2_apiserver::store::pods::{schedule_ops, unschedule_ops, PodLocation, PodStore, PodTree};
use p2_apiserver::store::update::Expected;
use serde_json::{json, Value};

const UUID: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

fn manifest(pod_id: &str) -> String {
    format!(
        "# deployed by hand\nid: {pod_id}\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/{pod_id}.tar.gz\n"
    )
}

fn sha(pod_id: &str) -> String {
    Manifest::parse(&manifest(pod_id)).unwrap().sha()
}

async fn put_intent(app: &TestApp, node: &str, pod_id: &str) {
    app.put_raw(
        &format!("intent/{node}/{pod_id}"),
        manifest(pod_id).as_bytes(),
    )
    .await;
}

/// Labels the pod as P2's scheduler does. The blocking tests label their pods so that every
/// tree a pod listing watches is in use: on Consul an empty tree reads at the index of the
/// whole KV store, which any write anywhere moves.
async fn label_pod(app: &TestApp, node: &str, pod_id: &str) {
    app.put_json(
        &format!("labels/pod/{node}/{pod_id}"),
        &json!({"pod_id": pod_id}),
    )
    .await;
}

/// A health record as P2's preparer stores it.
async fn put_p2_health(app: &TestApp, pod_id: &str, node: &str, status: &str) {
    let record = json!({"Id": pod_id, "Node": node, "Service": pod_id, "Status": status,
        "Time": "2020-01-14T11:06:40Z", "Expires": "2120-01-14T11:06:40Z"});
    app.put_json(&format!("health/{pod_id}/{node}"), &record)
        .await;
}

/// Places pod `hello` on each of `nodes` as P2 would, labelled and passing: every tree a
/// pod listing reads in use.
async fn place_hello(app: &TestApp, nodes: &[&str]) {
    for node in nodes {
        put_intent(app, node, "hello").await;
        label_pod(app, node, "hello").await;
        put_p2_health(app, "hello", node, "passing").await;
    }
}

/// `PUT path` with a body labelled JSON but sent exactly as given.
async fn put_health_raw(app: &TestApp, path: &str, body: impl Into<Body>) -> TestResponse {
    app.send_raw("PUT", path, &[("content-type", "application/json")], body)
        .await
}

async fn put_health(app: &TestApp, path: &str, body: Value) -> TestResponse {
    put_health_raw(app, path, body.to_string()).await
}

fn pod_names(body: &Value) -> Vec<String> {
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            format!(
                "{}/{}",
                item["node"].as_str().unwrap(),
                item["pod_id"].as_str().unwrap()
            )
        })
        .collect()
}

// ---- nodes ----

#[tokio::test]
async fn lists_nodes_by_name_with_paging_and_selectors() {
    let app = TestApp::new().await;
    app.put_json("labels/node/node2", &json!({"role": "db"}))
        .await;
    app.put_json("labels/node/node1", &json!({"role": "web"}))
        .await;
    app.put_json("labels/node/node3", &json!(null)).await;
    app.put_json("labels/pod/node1/hello", &json!({"pod_id": "hello"}))
        .await;

    let all = app.get("/api/v1/nodes").await;
    assert_eq!(all.status, StatusCode::OK);
    assert!(all.x_index() > 1);
    assert_eq!(
        all.json(),
        json!({"items": [
            {"name": "node1", "labels": {"role": "web"}},
            {"name": "node2", "labels": {"role": "db"}},
            {"name": "node3", "labels": {}}
        ], "continue": null})
    );

    let first = app.get("/api/v1/nodes?limit=2").await.json();
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let token = first["continue"].as_str().unwrap();
    let rest = app
        .get(&format!("/api/v1/nodes?limit=2&continue={token}"))
        .await
        .json();
    assert_eq!(rest["items"][0]["name"], "node3");
    assert_eq!(rest["continue"], Value::Null);

    let web = app.get("/api/v1/nodes?selector=role%3Dweb").await.json();
    assert_eq!(
        web["items"],
        json!([{"name": "node1", "labels": {"role": "web"}}])
    );
    let not_db = app.get("/api/v1/nodes?selector=role%21%3Ddb").await.json();
    assert_eq!(not_db["items"].as_array().unwrap().len(), 2);
}

/// A node listing with a selector answers from the mirror's label index what a read of
/// the store answers, whatever the selector's form, undecodable and empty label sets
/// included.
#[tokio::test]
async fn node_selectors_answer_from_the_mirror_as_from_the_store() {
    let app = TestApp::new().await;
    for (node, labels) in [
        ("node3", json!({"role": "web", "zone": "a"})),
        ("node1", json!({"role": "web"})),
        ("node2", json!({"role": "db", "zone": "b"})),
        ("node4", json!({})),
    ] {
        app.put_json(&format!("labels/node/{node}"), &labels).await;
    }
    app.put_raw("labels/node/node5", b"not json").await;
    for selector in [
        "role%3Dweb",
        "role%3D%3Dweb%2Czone%3Da",
        "role+in+%28web%2Cdb%29",
        "zone",
        "%21zone",
        "role%21%3Dweb",
        "role%3Dnone",
    ] {
        let path = format!("/api/v1/nodes?selector={selector}");
        let mirrored = app.get(&path).await;
        let stored = app.get(&format!("{path}&consistent=true")).await;
        assert_eq!(mirrored.status, StatusCode::OK, "{selector}: {mirrored:?}");
        assert_eq!(mirrored.json(), stored.json(), "{selector}");
    }
    let web = app
        .get("/api/v1/nodes?selector=role%3Dweb&limit=1")
        .await
        .json();
    assert_eq!(web["items"][0]["name"], "node1");
    let token = web["continue"].as_str().unwrap();
    let rest = app
        .get(&format!(
            "/api/v1/nodes?selector=role%3Dweb&limit=1&continue={token}"
        ))
        .await
        .json();
    assert_eq!(rest["items"][0]["name"], "node3");
}

#[tokio::test]
async fn node_listing_refuses_bad_parameters_all_at_once() {
    let app = TestApp::new().await;
    let response = app
        .get("/api/v1/nodes?selector=role%20in%20(&limit=0&index=1&wait=11m")
        .await;
    let mut fields = response.unprocessable_fields();
    fields.sort();
    assert_eq!(fields, ["limit", "selector", "wait"]);

    let response = app.get("/api/v1/nodes?index=soon").await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    response.error();
}

#[tokio::test]
async fn shows_one_node_with_its_intended_pods() {
    let app = TestApp::new().await;
    app.put_json("labels/node/node1", &json!({"role": "web"}))
        .await;
    put_intent(&app, "node1", "hello").await;
    put_intent(&app, "node1", "bye").await;
    put_intent(&app, "node2", "other").await;
    app.put_json(&format!("intent/node1/{UUID}"), &json!({"pod_key": UUID}))
        .await;

    let response = app.get("/api/v1/nodes/node1").await;
    assert_eq!(response.status, StatusCode::OK);
    let index = app
        .store
        .get("labels/node/node1")
        .await
        .unwrap()
        .unwrap()
        .modify_index;
    assert_eq!(
        response.header("etag"),
        Some(format!("\"{index}\"").as_str())
    );
    assert_eq!(
        response.json(),
        json!({"name": "node1", "labels": {"role": "web"}, "pods": ["bye", "hello"],
               "resource_version": index.to_string()})
    );

    // Intents alone do not make a node: it is known by its labels.
    let missing = app.get("/api/v1/nodes/node2").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    missing.error();

    for bad in ["..", "a%20b", "a%2Fb", "%07"] {
        let response = app.get(&format!("/api/v1/nodes/{bad}")).await;
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert_eq!(response.cause_fields(), ["node"], "{bad}");
    }
}

// ---- pods ----

/// Two nodes whose names sort differently as text and as names ("web" < "web-1", but
/// "web-1/…" < "web/…"), pods owned by an RC and a DS, health of every kind.
async fn arrange_pods(app: &TestApp) {
    put_intent(app, "web-1", "hello").await;
    put_intent(app, "web", "hello").await;
    put_intent(app, "web", "shipper").await;
    put_intent(app, "web-1", "shipper").await;
    app.put_json(&format!("intent/web/{UUID}"), &json!({"pod_key": UUID}))
        .await;
    app.put_raw("intent/web/broken", b"id: [unclosed").await;
    app.put_raw("reality/web/hello", manifest("hello").as_bytes())
        .await;

    let rc = "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11";
    app.put_json(
        "labels/pod/web/hello",
        &json!({"pod_id": "hello", "replication_controller_id": rc}),
    )
    .await;
    app.put_json(
        "labels/pod/web-1/hello",
        &json!({"pod_id": "hello", "replication_controller_id": rc}),
    )
    .await;
    app.put_json("labels/pod/web/shipper", &json!({"daemon_set_id": "ds1"}))
        .await;

    put_p2_health(app, "hello", "web", "passing").await;
    put_p2_health(app, "hello", "web-1", "warning").await;
    put_p2_health(app, "shipper", "web", "maintenance").await;
}

#[tokio::test]
async fn lists_pods_with_labels_health_and_manifest_sha() {
    let app = TestApp::new().await;
    arrange_pods(&app).await;

    let response = app.get("/api/v1/pods").await;
    assert_eq!(response.status, StatusCode::OK);
    let highest = app.store.list("").await.unwrap().index;
    assert_eq!(response.x_index(), highest);
    let rc = "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11";
    assert_eq!(
        response.json(),
        json!({"items": [
            {"node": "web", "pod_id": "hello", "health": "passing", "manifest_sha": sha("hello"),
             "labels": {"pod_id": "hello", "replication_controller_id": rc}},
            {"node": "web", "pod_id": "shipper", "health": "unknown", "manifest_sha": sha("shipper"),
             "labels": {"daemon_set_id": "ds1"}},
            {"node": "web-1", "pod_id": "hello", "health": "warning", "manifest_sha": sha("hello"),
             "labels": {"pod_id": "hello", "replication_controller_id": rc}},
            {"node": "web-1", "pod_id": "shipper", "health": "unknown", "manifest_sha": sha("shipper"),
             "labels": {}}
        ], "continue": null})
    );
}

#[tokio::test]
async fn filters_pods_by_node_and_pod_id() {
    let app = TestApp::new().await;
    arrange_pods(&app).await;

    let on_web = app.get("/api/v1/pods?node=web").await.json();
    assert_eq!(pod_names(&on_web), ["web/hello", "web/shipper"]);
    let hello = app.get("/api/v1/pods?pod_id=hello").await.json();
    assert_eq!(pod_names(&hello), ["web/hello", "web-1/hello"]);
    assert_eq!(hello["items"][1]["health"], "warning");
    let one = app.get("/api/v1/pods?node=web-1&pod_id=hello").await.json();
    assert_eq!(pod_names(&one), ["web-1/hello"]);
    assert_eq!(one["items"][0]["labels"]["pod_id"], "hello");
    let none = app.get("/api/v1/pods?node=elsewhere").await;
    assert_eq!(none.status, StatusCode::OK);
    assert_eq!(none.json()["items"], json!([]));
    let unfiltered = app.get("/api/v1/pods?node=&pod_id=").await.json();
    assert_eq!(unfiltered["items"].as_array().unwrap().len(), 4);
}

/// The pods of one pod id, as a listing of the whole fleet filtered by it shows them.
async fn of_pod_id_in_the_fleet(app: &TestApp, pod_id: &str) -> Vec<Value> {
    let fleet = app.get("/api/v1/pods").await.json();
    let items = fleet["items"].as_array().unwrap().iter();
    items
        .filter(|item| item["pod_id"] == pod_id)
        .cloned()
        .collect()
}

/// A pod id's listing shows exactly what a listing of the fleet shows of it, from the
/// mirror and from the store alike: a pod placed by hand with no labels or health, a pod
/// moved to another node, an intent deleted (its labels and health left behind).
#[tokio::test]
async fn a_pod_ids_listing_shows_its_pods_as_the_fleets_listing_does() {
    let app = TestApp::new().await;
    arrange_pods(&app).await;
    put_intent(&app, "bare", "hello").await;
    put_intent(&app, "zeta", "hello-world").await;
    put_p2_health(&app, "hello", "nowhere", "passing").await;
    app.put_json("labels/pod/nowhere/hello", &json!({"pod_id": "hello"}))
        .await;
    let check = |step: &'static str| {
        let app = &app;
        async move {
            let expected = of_pod_id_in_the_fleet(app, "hello").await;
            for path in [
                "/api/v1/pods?pod_id=hello",
                "/api/v1/pods?pod_id=hello&consistent=true",
            ] {
                let got = app.get(path).await.json();
                assert_eq!(got["items"], json!(expected), "{step}: {path}");
            }
            expected
        }
    };
    let shown = check("placed").await;
    let names: Vec<_> = shown
        .iter()
        .map(|p| format!("{}/{}", p["node"], p["health"]))
        .collect();
    assert_eq!(
        names,
        [
            r#""bare"/"unknown""#,
            r#""web"/"passing""#,
            r#""web-1"/"warning""#
        ]
    );
    assert_eq!(shown[0]["labels"], json!({}));

    // Moved from web-1 to web-2, its labels with it.
    app.store
        .delete("intent/web-1/hello", Cas::Any)
        .await
        .unwrap();
    app.store
        .delete("labels/pod/web-1/hello", Cas::Any)
        .await
        .unwrap();
    app.mirrored("intent/web-1/hello").await;
    put_intent(&app, "web-2", "hello").await;
    label_pod(&app, "web-2", "hello").await;
    let shown = check("moved").await;
    assert_eq!(
        pod_names(&json!({"items": shown})),
        ["bare/hello", "web/hello", "web-2/hello"]
    );

    // Deleted: its labels and health stay, but it is not shown.
    app.store
        .delete("intent/web/hello", Cas::Any)
        .await
        .unwrap();
    app.mirrored("intent/web/hello").await;
    let shown = check("deleted").await;
    assert_eq!(
        pod_names(&json!({"items": shown})),
        ["bare/hello", "web-2/hello"]
    );

    let none = app.get("/api/v1/pods?pod_id=absent").await.json();
    assert_eq!(none["items"], json!([]));
}

/// A pod id's listing blocked at its index wakes when one of its pods' intent, labels or
/// health changes, and not at another pod id's pods (its intents are keyed by node first,
/// so no prefix holds them: the whole trees would wake it at every change of the fleet).
#[tokio::test]
async fn blocking_pod_id_listing_wakes_on_its_pods_changes() {
    let app = std::sync::Arc::new(TestApp::new().await);
    place_hello(&app, &["node1", "node2"]).await;
    let wait_for = |app: std::sync::Arc<TestApp>| async move {
        let index = app.get("/api/v1/pods?pod_id=hello").await.x_index();
        app.get_held(format!("/api/v1/pods?pod_id=hello&index={index}&wait=30s"))
            .await
    };

    let held = wait_for(app.clone()).await;
    // Other pod ids' pods, on the same nodes or not: must not wake it.
    put_intent(&app, "node1", "other").await;
    label_pod(&app, "node1", "other").await;
    put_intent(&app, "node9", "hello-world").await;
    label_pod(&app, "node9", "hello").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.assert_held("another pod id's pods woke the listing");
    app.put_json(
        "labels/pod/node2/hello",
        &json!({"pod_id": "hello", "tier": "a"}),
    )
    .await;
    let answer = held.woken("a label change did not wake the listing").await;
    assert_eq!(answer.json()["items"][1]["labels"]["tier"], "a");

    let held = wait_for(app.clone()).await;
    put_p2_health(&app, "hello", "node1", "critical").await;
    let answer = held.woken("a health change did not wake the listing").await;
    assert_eq!(answer.json()["items"][0]["health"], "critical");

    let held = wait_for(app.clone()).await;
    app.store
        .delete("intent/node1/hello", Cas::Any)
        .await
        .unwrap();
    let answer = held
        .woken("a deleted intent did not wake the listing")
        .await;
    assert_eq!(pod_names(&answer.json()), ["node2/hello"]);

    let held = wait_for(app.clone()).await;
    put_intent(&app, "node3", "hello").await;
    let answer = held.woken("a new intent did not wake the listing").await;
    assert_eq!(pod_names(&answer.json()), ["node2/hello", "node3/hello"]);
}

#[tokio::test]
async fn filters_pods_by_a_selector_on_their_labels() {
    let app = TestApp::new().await;
    arrange_pods(&app).await;

    let rc = "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11";
    let of_rc = app
        .get(&format!(
            "/api/v1/pods?selector=replication_controller_id%3D{rc}"
        ))
        .await
        .json();
    assert_eq!(pod_names(&of_rc), ["web/hello", "web-1/hello"]);
    let of_ds = app.get("/api/v1/pods?selector=daemon_set_id").await.json();
    assert_eq!(pod_names(&of_ds), ["web/shipper"]);
    // Unlabeled pods match a selector that asks for a label's absence.
    let unowned = app
        .get("/api/v1/pods?selector=%21replication_controller_id,%21daemon_set_id")
        .await
        .json();
    assert_eq!(pod_names(&unowned), ["web-1/shipper"]);
    // With the other filters and paging.
    let one = app
        .get("/api/v1/pods?selector=pod_id%3Dhello&node=web-1")
        .await
        .json();
    assert_eq!(pod_names(&one), ["web-1/hello"]);
    let first = app
        .get("/api/v1/pods?selector=pod_id%3Dhello&limit=1")
        .await
        .json();
    assert_eq!(pod_names(&first), ["web/hello"]);
    let token = first["continue"].as_str().unwrap();
    let rest = app
        .get(&format!(
            "/api/v1/pods?selector=pod_id%3Dhello&limit=1&continue={token}"
        ))
        .await
        .json();
    assert_eq!(pod_names(&rest), ["web-1/hello"]);
    assert_eq!(rest["continue"], Value::Null);
}

#[tokio::test]
async fn pages_through_pods_in_node_then_pod_order() {
    let app = TestApp::new().await;
    arrange_pods(&app).await;

    let mut seen = Vec::new();
    for page in app.pages("/api/v1/pods?limit=1").await {
        assert_eq!(page["items"].as_array().unwrap().len(), 1);
        seen.extend(pod_names(&page));
    }
    assert_eq!(
        seen,
        ["web/hello", "web/shipper", "web-1/hello", "web-1/shipper"]
    );
}

#[tokio::test]
async fn pod_listing_refuses_bad_filters_all_at_once() {
    let app = TestApp::new().await;
    let response = app
        .get(&format!(
            "/api/v1/pods?node=a%2Fb&pod_id={UUID}&limit=1001&continue=%25"
        ))
        .await;
    let mut fields = response.unprocessable_fields();
    fields.sort();
    assert_eq!(fields, ["continue", "limit", "node", "pod_id"]);

    for query in [
        "node=..",
        "node=a%20b",
        "pod_id=.",
        "pod_id=a%0Ab",
        "index=2&wait=forever",
    ] {
        let response = app.get(&format!("/api/v1/pods?{query}")).await;
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{query}");
    }
    assert_eq!(
        app.get("/api/v1/pods?limit=many").await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn blocking_pod_listing_wakes_on_a_new_intent() {
    let app = TestApp::new().await;
    put_intent(&app, "node1", "hello").await;
    label_pod(&app, "node1", "hello").await;
    put_p2_health(&app, "hello", "node1", "passing").await;
    let first = app.get("/api/v1/pods").await;
    let index = first.x_index();

    let started = Instant::now();
    let path = format!("/api/v1/pods?index={index}&wait=20s");
    let (response, ()) = tokio::join!(app.get(&path), async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        put_intent(&app, "node2", "hello").await;
    });
    let waited = started.elapsed();
    assert_eq!(response.status, StatusCode::OK);
    assert!(
        waited >= Duration::from_millis(150),
        "answered before the write: {waited:?}"
    );
    assert!(waited < Duration::from_secs(10), "did not wake: {waited:?}");
    assert!(response.x_index() > index);
    assert_eq!(pod_names(&response.json()), ["node1/hello", "node2/hello"]);
}

#[tokio::test]
async fn blocking_pod_listing_wakes_on_health_and_ignores_other_trees() {
    let app = TestApp::new().await;
    put_intent(&app, "node1", "hello").await;
    label_pod(&app, "node1", "hello").await;
    put_p2_health(&app, "hello", "node1", "passing").await;
    let index = app.get("/api/v1/pods?node=node1").await.x_index();

    let path = format!("/api/v1/pods?node=node1&index={index}&wait=20s");
    let (response, ()) = tokio::join!(app.get(&path), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Outside what the request lists: must not wake it.
        put_intent(&app, "node2", "hello").await;
        app.put_json("labels/node/node1", &json!({"role": "web"}))
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        put_p2_health(&app, "hello", "node1", "critical").await;
    });
    let body = response.json();
    assert_eq!(body["items"][0]["health"], "critical");
    assert_eq!(pod_names(&body), ["node1/hello"]);
}

/// A node's listing blocked at its index is not woken by another node's health (node
/// agents block on theirs, and health is keyed by pod id first), but is by a record at
/// another key that names the node, which the listing shows as P2 does.
#[tokio::test]
async fn blocking_pod_listing_of_a_node_wakes_only_on_that_nodes_health() {
    let app = std::sync::Arc::new(TestApp::new().await);
    place_hello(&app, &["node1", "node2", "node10"]).await;
    put_intent(&app, "node2", "other").await;
    let index = app.get("/api/v1/pods?node=node1").await.x_index();

    let path = format!("/api/v1/pods?node=node1&index={index}&wait=30s");
    let held = app.get_held(path).await;
    put_p2_health(&app, "hello", "node2", "critical").await;
    put_p2_health(&app, "hello", "node10", "critical").await;
    put_p2_health(&app, "other", "node2", "critical").await;
    app.mirrored("health/other/node2").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.assert_held("another node's health woke node1's listing");

    let record = json!({"Id": "hello", "Node": "node1", "Service": "hello",
        "Status": "critical", "Time": "2020-01-14T11:06:40Z", "Expires": "2120-01-14T11:06:40Z"});
    app.put_json("health/hello/node3", &record).await;
    let answer = held
        .woken("a record naming node1 did not wake its listing")
        .await;
    assert_eq!(
        answer.json()["items"][0]["health"],
        "critical",
        "{answer:?}"
    );
}

/// A read of one node's pods that goes through to the store (`consistent=true`, or while the
/// mirror cannot be trusted) answers the index of its trees, as the mirror does, not the
/// lower one of that node's keys: a client blocking at the mirror's `X-Index` is held until
/// the node's pods change, rather than answered at once with an index gone backwards.
#[tokio::test]
async fn a_node_listing_read_through_to_the_store_is_held_at_the_mirrors_index() {
    let app = std::sync::Arc::new(TestApp::new().await);
    // Another node's pod, written last, moves the trees' index past node1's keys.
    place_hello(&app, &["node1", "node2", "node3"]).await;
    put_intent(&app, "node3", "other").await;
    app.mirrored("intent/node3/other").await;
    let index = app.get("/api/v1/pods?node=node1").await.x_index();
    let stored = app.get("/api/v1/pods?node=node1&consistent=true").await;
    stored.assert_not_behind(index, "node1's pods");

    let path = format!("/api/v1/pods?node=node1&consistent=true&index={index}&wait=30s");
    let held = app.get_held(path).await;
    put_intent(&app, "node2", "other").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.assert_held("another node's pod woke node1's listing");
    put_intent(&app, "node1", "other").await;
    let answer = held.woken("node1's new pod did not wake its listing").await;
    assert!(answer.x_index() > index, "{answer:?}");
    assert_eq!(answer.json()["items"].as_array().unwrap().len(), 2);
}

/// A record whose `Node` names another node than its key is that node's result, as P2 and
/// the listings take it: a read of the key's node finds no report, as its listings do.
#[tokio::test]
async fn a_health_record_naming_another_node_is_not_this_nodes() {
    let app = TestApp::new().await;
    put_intent(&app, "node3", "hello").await;
    let record = json!({"Id": "hello", "Node": "node1", "Service": "hello",
        "Status": "critical", "Time": "2020-01-14T11:06:40Z", "Expires": "2120-01-14T11:06:40Z"});
    app.put_json("health/hello/node3", &record).await;

    let listed = app.get("/api/v1/health/hello").await.json();
    let nodes: Vec<_> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["node"])
        .collect();
    assert_eq!(nodes, [&json!("node1")]);
    let pods = app.get("/api/v1/pods?node=node3").await.json();
    assert_eq!(pods["items"][0]["health"], "unknown", "{pods}");
    let got = app.get("/api/v1/health/hello/node3").await;
    assert_eq!(got.status, StatusCode::NOT_FOUND, "{got:?}");
}

#[tokio::test]
async fn blocking_pod_listing_times_out_with_the_same_index() {
    let app = TestApp::new().await;
    put_intent(&app, "node1", "hello").await;
    label_pod(&app, "node1", "hello").await;
    put_p2_health(&app, "hello", "node1", "passing").await;
    let index = app.get("/api/v1/pods").await.x_index();
    app.put_json("labels/node/node1", &json!({"role": "web"}))
        .await;

    let (response, held) = times_out_at_its_index(&app, "/api/v1/pods?", index).await;
    assert!(held >= Duration::from_millis(200));
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(pod_names(&response.json()), ["node1/hello"]);
}

// ---- pod health ----

#[tokio::test]
async fn health_reports_are_stored_exactly_as_p2_writes_them() {
    let app = TestApp::new().await;
    let response = put_health(
        &app,
        "/api/v1/health/hello/node17.example.com",
        json!({"status": "passing"}),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK);

    let pair = app
        .store
        .get("health/hello/node17.example.com")
        .await
        .unwrap()
        .unwrap();
    let stored: serde_json::Map<String, Value> = serde_json::from_slice(&pair.value).unwrap();
    let keys: Vec<&str> = stored.keys().map(String::as_str).collect();
    let mut expected = vec!["Expires", "Id", "Node", "Service", "Status", "Time"];
    expected.sort();
    let mut keys_sorted = keys.clone();
    keys_sorted.sort();
    assert_eq!(keys_sorted, expected);
    let raw = String::from_utf8(pair.value.to_vec()).unwrap();
    assert!(raw.starts_with(r#"{"Id":"hello","Node":"node17.example.com","Service":"hello","Status":"passing","Time":""#), "{raw}");
    let time = stored["Time"].as_str().unwrap();
    let expires = stored["Expires"].as_str().unwrap();
    let year = |t: &str| t[..4].parse::<u32>().unwrap();
    assert_eq!(year(expires), year(time) + 100);
    assert!(time.ends_with('Z'));

    assert_eq!(
        response.header("etag"),
        Some(format!("\"{}\"", pair.modify_index).as_str())
    );
    assert_eq!(
        response.json(),
        json!({"pod_id": "hello", "node": "node17.example.com", "status": "passing",
               "time": time, "expires": expires, "resource_version": pair.modify_index.to_string()})
    );

    let read = app.get("/api/v1/health/hello/node17.example.com").await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.header("etag"), response.header("etag"));
    assert_eq!(read.json(), response.json());
}

#[tokio::test]
async fn health_accepts_p2s_record_form_and_every_state() {
    let app = TestApp::new().await;
    let record = json!({"Id": "hello", "Node": "node1", "Service": "hello", "Status": "critical",
        "Time": "2020-01-14T11:06:40Z", "Expires": "2120-01-14T11:06:40Z"});
    let response = put_health(&app, "/api/v1/health/hello/node1", record).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.json()["status"], "critical");

    for status in ["passing", "warning", "critical", "unknown"] {
        let response = put_health(
            &app,
            "/api/v1/health/hello/node1",
            json!({"status": status}),
        )
        .await;
        assert_eq!(response.status, StatusCode::OK, "{status}");
        let pair = app.store.get("health/hello/node1").await.unwrap().unwrap();
        let stored: Value = serde_json::from_slice(&pair.value).unwrap();
        assert_eq!(stored["Status"], status);
    }
}

/// P2's record form names its pod and node itself: a record naming another pod or node than
/// the URL is a misrouted report, refused, not stored as the URL's pod's result.
#[tokio::test]
async fn health_refuses_a_record_naming_another_pod_or_node() {
    let app = TestApp::new().await;
    put_p2_health(&app, "hello", "node1", "passing").await;
    let before = app.dump().await;
    let record = |id: &str, node: &str, service: &str| json!({"Id": id, "Node": node, "Service": service, "Status": "critical"});
    for (body, fields) in [
        (record("hello", "node2", "hello"), vec!["Node"]),
        (record("other", "node1", "hello"), vec!["Id"]),
        (record("hello", "node1", "other"), vec!["Service"]),
        (
            record("other", "node2", "other"),
            vec!["Id", "Node", "Service"],
        ),
        (json!({"status": "critical", "node": "node2"}), vec!["Node"]),
    ] {
        let response = put_health(&app, "/api/v1/health/hello/node1", body.clone()).await;
        assert_eq!(
            response.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {response:?}"
        );
        assert_eq!(response.cause_fields(), fields, "{body}");
    }
    assert_eq!(app.dump().await, before);

    // Naming the URL's pod and node, or leaving them empty as some writers do, is taken.
    for body in [record("hello", "node1", "hello"), record("", "", "")] {
        let response = put_health(&app, "/api/v1/health/hello/node1", body.clone()).await;
        assert_eq!(response.status, StatusCode::OK, "{body}");
        assert_eq!(response.json()["status"], "critical", "{body}");
    }
}

#[tokio::test]
async fn health_refuses_bad_reports_and_writes_nothing() {
    let app = TestApp::new().await;
    put_p2_health(&app, "hello", "node1", "passing").await;
    let before = app.dump().await;

    let uuid_path = format!("/api/v1/health/{UUID}/node1");
    let cases = [
        ("/api/v1/health/hello/node1", "PASSING", vec!["status"]),
        ("/api/v1/health/hello/node1", "maintenance", vec!["status"]),
        ("/api/v1/health/..%2Fx/node1", "passing", vec!["pod_id"]),
        ("/api/v1/health/hello/..", "passing", vec!["node"]),
        (
            "/api/v1/health/a%2Fb/node%201",
            "bogus",
            vec!["pod_id", "node", "status"],
        ),
        (uuid_path.as_str(), "passing", vec!["pod_id"]),
        ("/api/v1/health/hello/node%09", "passing", vec!["node"]),
    ];
    for (path, status, fields) in cases {
        let response = put_health(&app, path, json!({"status": status})).await;
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{path}");
        assert_eq!(response.cause_fields(), fields, "{path}");
    }
    let missing = put_health(&app, "/api/v1/health/hello/node1", json!({})).await;
    assert_eq!(missing.status, StatusCode::UNPROCESSABLE_ENTITY);
    missing.error();
    let malformed = put_health_raw(&app, "/api/v1/health/hello/node1", "{\"status\":").await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    malformed.error();
    let text = app
        .send_raw(
            "PUT",
            "/api/v1/health/hello/node1",
            &[("content-type", "text/plain")],
            "passing",
        )
        .await;
    assert_eq!(text.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    text.error();
    let huge = format!(
        "{{\"status\":\"passing\",\"pad\":\"{}\"}}",
        "x".repeat(2 << 20)
    );
    let too_large = put_health_raw(&app, "/api/v1/health/hello/node1", huge).await;
    assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE);
    too_large.error();

    assert_eq!(app.dump().await, before);
}

#[tokio::test]
async fn health_put_honours_if_match() {
    let app = TestApp::new().await;
    let created = put_health(
        &app,
        "/api/v1/health/hello/node1",
        json!({"status": "passing"}),
    )
    .await;
    let etag = created.header("etag").unwrap().to_string();

    let stale_put = |etag: String| {
        let app = &app;
        async move {
            app.json_request(
                "PUT",
                "/api/v1/health/hello/node1",
                Some(&json!({"status": "critical"})),
                &[("if-match", &etag)],
            )
            .await
        }
    };
    let updated = stale_put(etag.clone()).await;
    assert_eq!(updated.status, StatusCode::OK);
    assert_ne!(updated.header("etag"), Some(etag.as_str()));
    let before = app.dump().await;
    let stale = stale_put(etag).await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED);
    stale.error();
    let garbage = stale_put("yesterday".into()).await;
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
    assert_eq!(app.dump().await, before);
    assert_eq!(
        app.get("/api/v1/health/hello/node1").await.json()["status"],
        "critical"
    );
}

#[tokio::test]
async fn health_get_answers_404_and_422() {
    let app = TestApp::new().await;
    let missing = app.get("/api/v1/health/hello/node1").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    missing.error();
    let bad = app.get("/api/v1/health/..%2F/node%20x").await;
    assert_eq!(bad.unprocessable_fields(), ["pod_id", "node"]);
}

#[tokio::test]
async fn unrecognised_stored_status_reads_as_unknown() {
    let app = TestApp::new().await;
    put_p2_health(&app, "hello", "node1", "maintenance").await;
    let read = app.get("/api/v1/health/hello/node1").await.json();
    assert_eq!(read["status"], "unknown");
    assert_eq!(read["time"], "2020-01-14T11:06:40Z");
}

#[tokio::test]
async fn lists_one_pods_health_by_node() {
    let app = TestApp::new().await;
    put_p2_health(&app, "hello", "node2", "critical").await;
    put_p2_health(&app, "hello", "node1", "passing").await;
    put_p2_health(&app, "other", "node1", "warning").await;
    app.put_raw("health/hello/node3", b"not json").await;

    let response = app.get("/api/v1/health/hello").await;
    assert_eq!(response.status, StatusCode::OK);
    let index = response.x_index();
    assert_eq!(index, app.store.list("health/hello/").await.unwrap().index);
    let body = response.json();
    let items = body["items"].as_array().unwrap();
    let summary: Vec<(&str, &str)> = items
        .iter()
        .map(|i| (i["node"].as_str().unwrap(), i["status"].as_str().unwrap()))
        .collect();
    assert_eq!(summary, [("node1", "passing"), ("node2", "critical")]);

    let page = app.get("/api/v1/health/hello?limit=1").await.json();
    assert_eq!(page["items"][0]["node"], "node1");
    assert!(page["continue"].is_string());

    let unchanged = app
        .get(&format!("/api/v1/health/hello?index={index}&wait=100ms"))
        .await;
    assert_eq!(unchanged.x_index(), index);

    let bad = app.get("/api/v1/health/..?limit=0").await;
    assert_eq!(bad.unprocessable_fields(), ["pod_id", "limit"]);
}

#[tokio::test]
async fn filters_one_pods_health_by_a_selector_on_its_labels() {
    let app = TestApp::new().await;
    put_p2_health(&app, "hello", "node1", "passing").await;
    put_p2_health(&app, "hello", "node2", "critical").await;
    put_p2_health(&app, "hello", "node3", "passing").await;
    app.put_json("labels/pod/node1/hello", &json!({"deploy": "canary"}))
        .await;
    app.put_json("labels/pod/node2/hello", &json!({"deploy": "main"}))
        .await;
    app.put_json("labels/pod/node3/other", &json!({"deploy": "canary"}))
        .await;

    let nodes = |body: Value| -> Vec<String> {
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["node"].as_str().unwrap().to_owned())
            .collect()
    };
    let response = app
        .get("/api/v1/health/hello?selector=deploy%3Dcanary")
        .await;
    // The answer depends on the pod labels too, so its index covers them.
    let highest = app.store.list("").await.unwrap().index;
    assert_eq!(response.x_index(), highest);
    assert_eq!(nodes(response.json()), ["node1"]);
    let not_canary = app
        .get("/api/v1/health/hello?selector=deploy%21%3Dcanary")
        .await;
    assert_eq!(nodes(not_canary.json()), ["node2", "node3"]);
}

/// A selector matches the labels of each reported pod, on the node its record names,
/// alike from the mirror and from the store: a pod whose labels cannot be read, or whose
/// record names a node no key can hold, has the empty set.
#[tokio::test]
async fn a_pods_health_selector_reads_the_labels_of_each_reported_pod() {
    let app = TestApp::new().await;
    put_p2_health(&app, "hello", "node1", "passing").await;
    let elsewhere = json!({"Id": "hello", "Node": "node7", "Service": "hello",
        "Status": "passing", "Time": "2020-01-14T11:06:40Z", "Expires": "2120-01-14T11:06:40Z"});
    app.put_json("health/hello/node2", &elsewhere).await;
    put_p2_health(&app, "hello", "node3", "passing").await;
    let dots = json!({"Id": "hello", "Node": "..", "Service": "hello",
        "Status": "passing", "Time": "2020-01-14T11:06:40Z", "Expires": "2120-01-14T11:06:40Z"});
    app.put_json("health/hello/node4", &dots).await;
    app.put_json("labels/pod/node1/hello", &json!({"deploy": "canary"}))
        .await;
    app.put_json("labels/pod/node2/hello", &json!({"deploy": "main"}))
        .await;
    app.put_json("labels/pod/node7/hello", &json!({"deploy": "canary"}))
        .await;
    app.put_raw("labels/pod/node3/hello", "{not json").await;

    for consistent in ["", "&consistent=true"] {
        let nodes = |body: Value| -> Vec<String> {
            let items = body["items"].as_array().unwrap().iter();
            items
                .map(|i| i["node"].as_str().unwrap().to_owned())
                .collect()
        };
        let canary = app
            .get(&format!(
                "/api/v1/health/hello?selector=deploy%3Dcanary{consistent}"
            ))
            .await;
        assert_eq!(nodes(canary.json()), ["node1", "node7"], "{consistent}");
        let unlabeled = app
            .get(&format!(
                "/api/v1/health/hello?selector=%21deploy{consistent}"
            ))
            .await;
        assert_eq!(nodes(unlabeled.json()), ["..", "node3"], "{consistent}");
    }
}

// ---- the stores the farms build on ----

#[tokio::test]
async fn schedule_and_unschedule_ops_keep_other_owners_labels() {
    let app = TestApp::new().await;
    let pods = PodStore::new(app.store.clone());
    let pod = PodLocation::new("node1", "hello").unwrap();
    let manifest = Manifest::parse(&manifest("hello")).unwrap();
    app.put_json("labels/pod/node1/hello", &json!({"team": "a"}))
        .await;

    let (_, current) = pods.list_labels(Some("node1")).await.unwrap();
    let current = current.get(&pod).cloned().unwrap();
    let rc_labels = labels(&[("pod_id", "hello"), ("replication_controller_id", "rc1")]);
    app.store
        .txn(&schedule_ops(&pod, &manifest, &rc_labels, &current))
        .await
        .unwrap();
    let intent = pods.get(PodTree::Intent, &pod).await.unwrap().unwrap();
    assert_eq!(intent.manifest.raw(), manifest.raw());
    assert_eq!(intent.manifest.sha(), manifest.sha());
    let (_, after) = pods.list_labels(None).await.unwrap();
    let after = after.get(&pod).cloned().unwrap();
    assert_eq!(
        after.value,
        labels(&[
            ("pod_id", "hello"),
            ("replication_controller_id", "rc1"),
            ("team", "a")
        ])
    );

    // Ops built from a stale read roll back as a whole: no intent is touched.
    let stale = schedule_ops(&pod, &manifest, &labels(&[("x", "y")]), &current);
    app.store
        .delete("intent/node1/hello", Cas::Any)
        .await
        .unwrap();
    assert!(matches!(
        app.store.txn(&stale).await,
        Err(StoreError::Conflict { .. })
    ));
    assert!(pods.get(PodTree::Intent, &pod).await.unwrap().is_none());
    put_intent(&app, "node1", "hello").await;

    app.store
        .txn(&unschedule_ops(
            &pod,
            ["pod_id", "replication_controller_id"],
            &after,
        ))
        .await
        .unwrap();
    assert!(pods.get(PodTree::Intent, &pod).await.unwrap().is_none());
    let (_, left) = pods.list_labels(None).await.unwrap();
    assert_eq!(left.get(&pod).unwrap().value, labels(&[("team", "a")]));

    // Removing the last labels removes the key; a pod with no labels needs no label op.
    let last = left.get(&pod).cloned().unwrap();
    app.store
        .txn(&unschedule_ops(&pod, ["team"], &last))
        .await
        .unwrap();
    assert!(app
        .store
        .get("labels/pod/node1/hello")
        .await
        .unwrap()
        .is_none());
    let ops = unschedule_ops(&pod, ["team"], &LabelRecord::default());
    assert_eq!(ops.len(), 1);
    app.store.txn(&ops).await.unwrap();
}

#[tokio::test]
async fn pod_store_reads_skip_uuid_pods_and_undecodable_entries() {
    let app = TestApp::new().await;
    put_intent(&app, "node1", "hello").await;
    app.put_json(&format!("intent/node1/{UUID}"), &json!({"pod_key": UUID}))
        .await;
    app.put_raw("intent/node1/bad", &[0xff, 0xfe]).await;
    app.put_raw("intent/node1/deep/er", manifest("er").as_bytes())
        .await;
    app.put_raw("reality/node1/hello", manifest("hello").as_bytes())
        .await;
    app.put_raw(&format!("reality/node1/{UUID}"), b"{}").await;
    app.put_json("labels/pod/node1/hello", &json!(null)).await;
    app.put_json("labels/pod/node1/bad", &json!([1])).await;

    let pods = PodStore::new(app.store.clone());
    let names = |entries: Vec<p2_apiserver::store::pods::PodEntry>| -> Vec<String> {
        entries.into_iter().map(|e| e.pod.to_string()).collect()
    };
    assert_eq!(
        names(pods.list(PodTree::Intent, None).await.unwrap().1),
        ["node1/hello"]
    );
    assert_eq!(
        names(pods.list(PodTree::Reality, Some("node1")).await.unwrap().1),
        ["node1/hello"]
    );
    let (_, labels) = pods.list_labels(None).await.unwrap();
    assert_eq!(
        labels.keys().map(ToString::to_string).collect::<Vec<_>>(),
        ["node1/hello"]
    );
    assert!(matches!(
        pods.list(PodTree::Intent, Some("a/b")).await,
        Err(StoreError::Invalid(_))
    ));
}

#[tokio::test]
async fn health_store_keys_results_by_the_records_node() {
    let app = TestApp::new().await;
    let record = json!({"Id": "hello", "Node": "renamed", "Status": "passing"});
    app.put_json("health/hello/node1", &record).await;
    app.put_json("health/hello/node2", &json!({"Status": "warning"}))
        .await;
    let health = HealthStore::new(app.store.clone());

    let (_, by_node) = health.list_for_pod("hello").await.unwrap();
    let states: Vec<(&str, HealthState)> = by_node
        .iter()
        .map(|(node, e)| (node.as_str(), e.state()))
        .collect();
    assert_eq!(
        states,
        [
            ("node2", HealthState::Warning),
            ("renamed", HealthState::Passing)
        ]
    );
    let (_, all) = health.list().await.unwrap();
    assert!(all.contains_key(&("hello".to_string(), "renamed".to_string())));

    let pod = PodLocation::new("node3", "hello").unwrap();
    let agent = Actor {
        name: "agent".into(),
        request_id: None,
    };
    let written = health
        .put(
            &app.mirror,
            &pod,
            HealthState::Critical,
            std::time::SystemTime::now(),
            Some(Expected::Version(0)),
            &agent,
        )
        .await
        .unwrap();
    assert_eq!(health.get(&pod).await.unwrap(), Some(written));
    assert!(matches!(
        health
            .put(
                &app.mirror,
                &pod,
                HealthState::Passing,
                std::time::SystemTime::now(),
                Some(Expected::Version(0)),
                &agent,
            )
            .await,
        Err(StoreError::Conflict { .. })
    ));
}
