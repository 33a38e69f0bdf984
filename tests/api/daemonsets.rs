//! `/api/v1/daemonsets`: every route, its errors, P2's stored format, audit records,
//! contention, rollout status and concurrent writers.

use std::time::Duration;

use axum::http::StatusCode;
use futures::future::join_all;
use p2_apiserver::kv::KvPair;
use p2_apiserver::model::CreateDaemonSet;
use p2_apiserver::model::{AuditRecord, HealthRecord, HealthState};
use serde_json::{json, Value};

use crate::support::api::{assert_operations, item_ids, TestApp, TestResponse};

const MANIFEST: &str = "id: p2-log-shipper\nlaunchables:\n  shipper:\n    launchable_type: hoist\n    location: https://artifacts.example.com/shipper_ab12.tar.gz\nconfig: {}\n";

/// P2's example daemon set as P2 writes it (one line, Go's key order), under a fixed ID.
const P2_ID: &str = "1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e";
const P2_DOCUMENT: &str = r#"{"id":"1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e","disabled":false,"manifest":"id: p2-log-shipper\nlaunchables:\n  shipper:\n    launchable_type: hoist\n    location: https://artifacts.example.com/shipper_ab12.tar.gz\nconfig: {}\n","min_health":0,"cluster_name":"production","node_selector":"role!=db","pod_id":"p2-log-shipper","timeout":600000000000}"#;

/// A create body, built from the request type an SDK would serialize.
fn body(selector: &str) -> Value {
    serde_json::to_value(CreateDaemonSet {
        manifest: json!(MANIFEST),
        node_selector: selector.into(),
        min_health: 2,
        cluster_name: "production".into(),
        timeout: "10m".into(),
        disabled: false,
    })
    .unwrap()
}

fn manifest_for(pod: &str) -> String {
    format!("id: {pod}\nconfig: {{}}\n")
}

async fn post(app: &TestApp, body: &Value, headers: &[(&str, &str)]) -> TestResponse {
    app.json_request("POST", "/api/v1/daemonsets", Some(body), headers)
        .await
}

/// Creates a daemon set and returns its ID.
async fn create(app: &TestApp, body: &Value) -> String {
    let response = post(app, body, &[]).await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    response.json()["id"].as_str().unwrap().to_owned()
}

async fn patch(app: &TestApp, id: &str, patch: &Value, headers: &[(&str, &str)]) -> TestResponse {
    app.merge_patch(&format!("/api/v1/daemonsets/{id}"), patch, headers)
        .await
}

async fn delete(app: &TestApp, id: &str, headers: &[(&str, &str)]) -> TestResponse {
    app.json_request("DELETE", &format!("/api/v1/daemonsets/{id}"), None, headers)
        .await
}

async fn stored(app: &TestApp, id: &str) -> Option<KvPair> {
    app.stored(&format!("daemon_sets/{id}")).await
}

async fn audit_records(app: &TestApp) -> Vec<(AuditRecord, u64)> {
    let listing = app.store.list("audit_logs/").await.unwrap();
    let mut records: Vec<(AuditRecord, u64)> = listing
        .pairs
        .iter()
        .map(|pair| {
            (
                AuditRecord::from_json(&pair.value).unwrap(),
                pair.modify_index,
            )
        })
        .collect();
    records.sort_by(|a, b| (a.1, &a.0.event_type).cmp(&(b.1, &b.0.event_type)));
    records
}

async fn label_node(app: &TestApp, node: &str, labels: Value) {
    app.put_json(&format!("labels/node/{node}"), &labels).await;
}

/// The fields a 422 names, sorted.
fn causes(response: &TestResponse) -> Vec<String> {
    let mut fields = response.unprocessable_fields();
    fields.sort();
    fields
}

#[tokio::test]
async fn create_stores_p2s_document_with_its_audit_record_in_one_transaction() {
    let app = TestApp::new().await;
    label_node(&app, "n1", json!({"role": "web"})).await;
    label_node(&app, "n2", json!({"role": "db"})).await;
    let response = post(&app, &body("role != db"), &[]).await;
    let ds = response.json();
    let id = ds["id"].as_str().unwrap();
    let pair = stored(&app, id).await.unwrap();
    response.assert_created(&format!("/api/v1/daemonsets/{id}"), pair.modify_index);
    assert_eq!(
        ds,
        json!({
            "id": id, "manifest": MANIFEST, "node_selector": "role!=db", "min_health": 2,
            "cluster_name": "production", "pod_id": "p2-log-shipper", "timeout": "10m0s",
            "disabled": false, "resource_version": pair.modify_index.to_string(),
            "status": {"nodes_targeted": 1, "nodes_scheduled": 0, "nodes_healthy": 0, "farm": null},
            "conditions": [],
            "created": ds["created"], "modified": ds["created"]
        })
    );
    let expected = format!(
        r#"{{"id":"{id}","disabled":false,"manifest":{},"min_health":2,"cluster_name":"production","node_selector":"role!=db","pod_id":"p2-log-shipper","timeout":600000000000}}"#,
        serde_json::to_string(MANIFEST).unwrap()
    );
    assert_eq!(String::from_utf8(pair.value.to_vec()).unwrap(), expected);

    let audits = audit_records(&app).await;
    assert_eq!(audits.len(), 1);
    let (record, index) = &audits[0];
    assert_eq!(record.event_type, "DAEMON_SET_CREATED");
    assert_eq!(record.schema_version, 1);
    // Without tokens the actor is anonymous (see events.rs for a token's name).
    assert_eq!(record.details()["user"], "anonymous");
    assert_eq!(
        record.details()["daemon_set"],
        serde_json::from_slice::<Value>(&pair.value).unwrap()
    );
    assert_eq!(*index, pair.modify_index, "written in the same transaction");
}

#[tokio::test]
async fn create_accepts_a_manifest_object_and_defaults_optional_fields() {
    let app = TestApp::new().await;
    let response = post(
        &app,
        &json!({"manifest": {"id": "hello", "config": {}}, "node_selector": "", "timeout": "90s"}),
        &[],
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    let ds = response.json();
    assert_eq!(ds["pod_id"], "hello");
    assert_eq!(ds["timeout"], "1m30s");
    assert_eq!(ds["min_health"], 0);
    assert_eq!(ds["cluster_name"], "");
    assert_eq!(ds["disabled"], false);
    assert!(ds["manifest"].as_str().unwrap().contains("id: hello"));
    let audits = audit_records(&app).await;
    assert_eq!(audits[0].0.details()["user"], "anonymous");
}

#[tokio::test]
async fn create_lists_every_bad_field_and_writes_nothing() {
    let app = TestApp::new().await;
    let response = post(
        &app,
        &json!({
            "manifest": "id: p2-log-shipper\nlaunchables: 3\n",
            "node_selector": "role in (web",
            "min_health": -1,
            "timeout": "0s",
            "disabled": "no",
            "id": P2_ID,
            "nodeselector": "x"
        }),
        &[],
    )
    .await;
    assert_eq!(
        causes(&response),
        [
            "disabled",
            "id",
            "manifest.launchables",
            "min_health",
            "node_selector",
            "nodeselector",
            "timeout"
        ]
    );
    let response = post(&app, &json!({}), &[]).await;
    assert_eq!(causes(&response), ["manifest", "node_selector", "timeout"]);
    let response = post(
        &app,
        &json!({"manifest": 7, "node_selector": null, "timeout": "soon", "min_health": 1.5}),
        &[],
    )
    .await;
    assert_eq!(
        causes(&response),
        ["manifest", "min_health", "node_selector", "timeout"]
    );
    let response = post(
        &app,
        &json!({"manifest": "id: a/b\n", "node_selector": "", "timeout": "1s"}),
        &[],
    )
    .await;
    assert_eq!(causes(&response), ["manifest.id"]);
    assert!(app.keys("").await.is_empty());
}

#[tokio::test]
async fn create_rejects_unreadable_requests() {
    let app = TestApp::new().await;
    let malformed = app
        .send(
            axum::http::Request::post("/api/v1/daemonsets")
                .header("content-type", "application/json")
                .body(axum::body::Body::from("{\"manifest\":"))
                .unwrap(),
        )
        .await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    malformed.error();
    let not_json = app
        .json_request(
            "POST",
            "/api/v1/daemonsets",
            Some(&body("")),
            &[("content-type", "text/plain")],
        )
        .await;
    assert_eq!(not_json.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    not_json.error();
    let array = post(&app, &json!([1]), &[]).await;
    assert_eq!(array.status, StatusCode::UNPROCESSABLE_ENTITY);
    array.error();
    assert!(app.keys("").await.is_empty());
}

#[tokio::test]
async fn contention_is_refused_naming_the_other_daemon_set() {
    let app = TestApp::new().await;
    label_node(&app, "n1", json!({"role": "web", "az": "a"})).await;
    label_node(&app, "n2", json!({"role": "db", "az": "b"})).await;
    let web = create(&app, &body("role=web")).await;
    let before = app.keys("").await;
    // The nodes both select are named only where the selectors alone do not decide; else
    // the answer says whose selector selects every node, or that the two are the same.
    // `role == web` is not the same as `role=web` (their canonical texts differ, as P2
    // compares them), so the nodes decide.
    let intersect = "selects nodes this daemon set would select (n1)";
    for (selector, why, says) in [
        (
            "",
            "selects every node",
            "this daemon set's node selector selects every node",
        ),
        ("role == web", "equivalent selector", intersect),
        (
            "role=web",
            "same selector",
            "the two node selectors are the same",
        ),
        ("az=a", "nodes intersect", intersect),
    ] {
        let response = post(&app, &body(selector), &[]).await;
        assert_eq!(response.status, StatusCode::CONFLICT, "{why}: {response:?}");
        let message = response.error().message;
        assert!(message.contains(&web), "{why}: {message}");
        assert!(message.contains(says), "{why}: {message}");
        assert_eq!(
            message.contains("(n1)"),
            says == intersect,
            "{why}: {message}"
        );
    }
    assert_eq!(app.keys("").await, before, "nothing written on 409");

    // Storing it disabled is allowed; so are disjoint nodes and another pod.
    let mut disabled = body("");
    disabled["disabled"] = json!(true);
    let response = post(&app, &disabled, &[]).await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    assert_eq!(response.json()["disabled"], true);
    create(&app, &body("az=b")).await;
    let mut other_pod = body("");
    other_pod["manifest"] = json!(manifest_for("other"));
    create(&app, &other_pod).await;
}

/// A daemon set refused because the other one's selector selects every node is told so,
/// and that changing its own selector would not help; one whose own selector selects every
/// node is told it is its own.
#[tokio::test]
async fn contention_with_a_selector_of_every_node_says_whose_it_is() {
    let app = TestApp::new().await;
    label_node(&app, "n1", json!({"role": "web"})).await;
    let everywhere = create(&app, &body("")).await;

    let response = post(&app, &body("role=web"), &[]).await;
    assert_eq!(response.status, StatusCode::CONFLICT, "{response:?}");
    let message = response.error().message;
    assert!(message.contains(&everywhere), "{message}");
    assert!(
        message.contains("its node selector selects every node; change its node selector"),
        "{message}"
    );

    let response = patch(&app, &everywhere, &json!({"disabled": true}), &[]).await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    let web = create(&app, &body("role=web")).await;
    let response = patch(&app, &everywhere, &json!({"disabled": false}), &[]).await;
    assert_eq!(response.status, StatusCode::CONFLICT, "{response:?}");
    let message = response.error().message;
    assert!(message.contains(&web), "{message}");
    assert!(
        message.contains("this daemon set's node selector selects every node"),
        "{message}"
    );
}

#[tokio::test]
async fn patch_into_contention_is_refused_unless_disabled() {
    let app = TestApp::new().await;
    label_node(&app, "n1", json!({"role": "web", "az": "a"})).await;
    label_node(&app, "n2", json!({"role": "db", "az": "b"})).await;
    let web = create(&app, &body("role=web")).await;
    let db = create(&app, &body("az=b")).await;
    let before = stored(&app, &db).await.unwrap();

    let response = patch(&app, &db, &json!({"node_selector": "az=a"}), &[]).await;
    assert_eq!(response.status, StatusCode::CONFLICT);
    assert!(response.error().message.contains(&web));
    assert_eq!(stored(&app, &db).await.unwrap(), before);

    let response = patch(
        &app,
        &db,
        &json!({"node_selector": "az=a", "disabled": true}),
        &[],
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    assert_eq!(response.json()["node_selector"], "az=a");

    // Re-enabling it would contend again.
    let response = patch(&app, &db, &json!({"disabled": false}), &[]).await;
    assert_eq!(response.status, StatusCode::CONFLICT);
    assert!(response.error().message.contains(&web));
    // Disabling the other one first makes room.
    let response = patch(&app, &web, &json!({"disabled": true}), &[]).await;
    assert_eq!(response.status, StatusCode::OK);
    let response = patch(&app, &db, &json!({"disabled": false}), &[]).await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
}

/// While a node relabelled into both makes two daemon sets contend, any change leaving either
/// enabled, a `min_health` alone included, is refused: the write would make the contention
/// its own, for which the farm disables it. The answer names the node, so that its labels
/// (or a selector) can be fixed, after which the change is made.
#[tokio::test]
async fn a_change_while_a_node_relabelled_into_both_contends_names_the_node() {
    let app = TestApp::new().await;
    label_node(&app, "n1", json!({"role": "web"})).await;
    label_node(&app, "n2", json!({"az": "b"})).await;
    let web = create(&app, &body("role=web")).await;
    let zoned = create(&app, &body("az=b")).await;
    label_node(&app, "n2", json!({"role": "web", "az": "b"})).await;

    let response = patch(&app, &zoned, &json!({"min_health": 3}), &[]).await;
    assert_eq!(response.status, StatusCode::CONFLICT, "{response:?}");
    let message = response.error().message;
    assert!(message.contains(&web), "{message}");
    assert!(
        message.contains("(n2); change a node selector or those nodes' labels"),
        "{message}"
    );

    label_node(&app, "n2", json!({"az": "b"})).await;
    let response = patch(&app, &zoned, &json!({"min_health": 3}), &[]).await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
}

#[tokio::test]
async fn get_reports_rollout_status_from_labels_and_health() {
    let app = TestApp::new().await;
    for (node, role) in [("n1", "web"), ("n2", "web"), ("n3", "db")] {
        label_node(&app, node, json!({"role": role})).await;
    }
    let id = create(&app, &body("role=web")).await;
    for node in ["n1", "n2"] {
        app.put_json(
            &format!("labels/pod/{node}/p2-log-shipper"),
            &json!({"daemon_set_id": id}),
        )
        .await;
    }
    app.put_json(
        "labels/pod/n3/other",
        &json!({"daemon_set_id": "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11"}),
    )
    .await;
    // Healthy as the farm counts it: running the intended manifest and passing. n2 passes
    // its check but still runs an older manifest, n3's pod is not the daemon set's.
    let older = MANIFEST.replace("ab12", "0001");
    for (node, running) in [("n1", MANIFEST), ("n2", older.as_str())] {
        app.put_raw(&format!("intent/{node}/p2-log-shipper"), MANIFEST)
            .await;
        app.put_raw(&format!("reality/{node}/p2-log-shipper"), running)
            .await;
    }
    let now = std::time::SystemTime::now();
    for (node, pod_id) in [
        ("n1", "p2-log-shipper"),
        ("n2", "p2-log-shipper"),
        ("n3", "other"),
    ] {
        let record = HealthRecord::new(pod_id, node, HealthState::Passing, now);
        app.put_raw(&format!("health/{pod_id}/{node}"), &record.to_json())
            .await;
    }
    app.put_json(
        &format!("status/daemon_sets/{id}/daemon_set_farm"),
        &json!({"manifest_sha": "ab12", "nodes_deployed": 1, "replication_in_progress": true}),
    )
    .await;

    let response = app.get(&format!("/api/v1/daemonsets/{id}")).await;
    assert_eq!(response.status, StatusCode::OK);
    let pair = stored(&app, &id).await.unwrap();
    assert_eq!(
        response.header("etag").unwrap(),
        format!("\"{}\"", pair.modify_index)
    );
    let ds = response.json();
    assert_eq!(ds["resource_version"], pair.modify_index.to_string());
    assert_eq!(
        ds["status"],
        json!({
            "nodes_targeted": 2, "nodes_scheduled": 2, "nodes_healthy": 1,
            "farm": {"manifest_sha": "ab12", "nodes_deployed": 1, "replication_in_progress": true}
        })
    );

    // A node the selector no longer matches is on its way to losing the pod: the farm no
    // longer counts it healthy, and neither does the status.
    label_node(&app, "n1", json!({"role": "db"})).await;
    let status = app.get(&format!("/api/v1/daemonsets/{id}")).await.json()["status"].clone();
    assert_eq!(
        (
            &status["nodes_targeted"],
            &status["nodes_scheduled"],
            &status["nodes_healthy"]
        ),
        (&json!(1), &json!(2), &json!(0)),
        "{status}"
    );
}

/// A pod labelled for an enabled RC as well as the daemon set is the RC's: the farm leaves
/// it alone and counts it for nothing, so the status does not count it healthy either.
#[tokio::test]
async fn get_counts_no_pod_an_enabled_rc_also_labels_as_healthy() {
    let app = TestApp::new().await;
    label_node(&app, "n1", json!({"role": "web"})).await;
    let id = create(&app, &body("role=web")).await;
    let rc = json!({"manifest": MANIFEST, "node_selector": "role=web", "replicas_desired": 0});
    let rc = app
        .json_request("POST", "/api/v1/rcs", Some(&rc), &[])
        .await;
    assert_eq!(rc.status, StatusCode::CREATED, "{rc:?}");
    let rc_id = rc.json()["id"].as_str().unwrap().to_owned();
    app.put_json(
        "labels/pod/n1/p2-log-shipper",
        &json!({"daemon_set_id": id, "replication_controller_id": rc_id}),
    )
    .await;
    app.put_raw("intent/n1/p2-log-shipper", MANIFEST).await;
    app.put_raw("reality/n1/p2-log-shipper", MANIFEST).await;
    let record = HealthRecord::new(
        "p2-log-shipper",
        "n1",
        HealthState::Passing,
        std::time::SystemTime::now(),
    );
    app.put_raw("health/p2-log-shipper/n1", &record.to_json())
        .await;

    let status = app.get(&format!("/api/v1/daemonsets/{id}")).await.json()["status"].clone();
    assert_eq!(status["nodes_healthy"], 0, "{status}");
}

#[tokio::test]
async fn get_answers_404_and_422_for_bad_ids() {
    let app = TestApp::new().await;
    let response = app.get(&format!("/api/v1/daemonsets/{P2_ID}")).await;
    assert_eq!(response.status, StatusCode::NOT_FOUND);
    assert!(response.error().message.contains(P2_ID));
    for bad in [
        "..",
        "not-a-uuid",
        "1F6B2C9D-3E4A-4F5B-8C7D-9E0A1B2C3D4E",
        "%2E%2E",
    ] {
        let response = app.get(&format!("/api/v1/daemonsets/{bad}")).await;
        assert_eq!(causes(&response), ["id"], "{bad}");
    }
}

#[tokio::test]
async fn list_pages_filters_and_skips_bad_documents() {
    let app = TestApp::new().await;
    let mut ids = Vec::new();
    for pod in ["a", "b", "a"] {
        let mut request = body("");
        request["manifest"] = json!(manifest_for(pod));
        request["disabled"] = json!(true);
        ids.push(create(&app, &request).await);
    }
    app.put_json("daemon_sets/not-a-uuid", &json!({})).await;
    app.put_json(
        "daemon_sets/5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11",
        &json!({"id": "x"}),
    )
    .await;
    let index = app.store.list("daemon_sets/").await.unwrap().index;

    let response = app.get("/api/v1/daemonsets").await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-index").unwrap(), index.to_string());
    let page = response.json();
    let mut sorted = ids.clone();
    sorted.sort();
    let listed = item_ids(&page);
    assert_eq!(listed, sorted);
    assert_eq!(page["continue"], Value::Null);
    assert!(page["items"][0].get("status").is_none());

    let page = app.get("/api/v1/daemonsets?pod_id=a").await.json();
    let mut only_a = vec![ids[0].clone(), ids[2].clone()];
    only_a.sort();
    let listed = item_ids(&page);
    assert_eq!(listed, only_a);

    let first = app.get("/api/v1/daemonsets?limit=2").await.json();
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let token = first["continue"].as_str().unwrap();
    let rest = app
        .get(&format!("/api/v1/daemonsets?limit=2&continue={token}"))
        .await
        .json();
    assert_eq!(rest["items"][0]["id"], sorted[2]);
    assert_eq!(rest["continue"], Value::Null);

    let response = app.get("/api/v1/daemonsets?limit=0").await;
    assert_eq!(causes(&response), ["limit"]);
    let response = app.get("/api/v1/daemonsets?limit=x").await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    response.error();
}

#[tokio::test]
async fn list_filters_by_a_selector_on_pod_id_and_cluster_name() {
    let app = TestApp::new().await;
    let mut ids = Vec::new();
    for (pod, cluster) in [("a", "production"), ("b", "production"), ("a", "staging")] {
        let mut request = body("");
        request["manifest"] = json!(manifest_for(pod));
        request["cluster_name"] = json!(cluster);
        request["disabled"] = json!(true);
        ids.push(create(&app, &request).await);
    }
    let listed = |path: String| {
        let app = &app;
        async move {
            let response = app.get(&path).await;
            assert_eq!(response.status, StatusCode::OK, "{response:?}");
            let mut ids = item_ids(&response.json());
            ids.sort();
            ids
        }
    };
    let sorted = |mut ids: Vec<String>| {
        ids.sort();
        ids
    };

    assert_eq!(
        listed("/api/v1/daemonsets?selector=cluster_name%3Dproduction".into()).await,
        sorted(vec![ids[0].clone(), ids[1].clone()])
    );
    assert_eq!(
        listed("/api/v1/daemonsets?selector=pod_id%3Da,cluster_name%21%3Dproduction".into()).await,
        [ids[2].clone()]
    );
    assert_eq!(
        listed("/api/v1/daemonsets?selector=pod_id%20in%20(a,b)&pod_id=b".into()).await,
        [ids[1].clone()]
    );
    assert!(listed("/api/v1/daemonsets?selector=team%3Dedge".into())
        .await
        .is_empty());
    let response = app.get("/api/v1/daemonsets?selector=pod_id%20in%20(").await;
    assert_eq!(causes(&response), ["selector"]);
}

/// The `pod_id` filter takes what the pods listing's does: a pod id, or empty for no filter;
/// a value no pod id can be is refused, not answered with an empty page.
#[tokio::test]
async fn list_refuses_a_pod_id_filter_that_is_no_pod_id() {
    let app = TestApp::new().await;
    let id = create(&app, &body("")).await;
    for bad in ["a%2Fb", "..", "-a", "a%20b"] {
        let response = app.get(&format!("/api/v1/daemonsets?pod_id={bad}")).await;
        assert_eq!(causes(&response), ["pod_id"], "{bad}: {response:?}");
        assert!(
            response.error().causes[0]
                .message
                .starts_with("must be a pod id"),
            "{bad}: {response:?}"
        );
    }
    let every = app.get("/api/v1/daemonsets?pod_id=").await;
    assert_eq!(every.status, StatusCode::OK, "{every:?}");
    assert_eq!(item_ids(&every.json()), [id]);
}

#[tokio::test]
async fn list_blocks_until_the_tree_changes() {
    let app = TestApp::new().await;
    // Start from trees in use (the daemon sets' and the conditions'): on Consul an empty
    // tree reads at the index of the whole KV store, which any write anywhere moves.
    app.put_raw(
        "p2-apiserver/conditions/daemon_sets/other",
        br#"{"conditions": []}"#,
    )
    .await;
    let mut other = body("");
    other["manifest"] = json!(manifest_for("shipper"));
    let other = create(&app, &other).await;
    let index: u64 = app
        .get("/api/v1/daemonsets")
        .await
        .header("x-index")
        .unwrap()
        .parse()
        .unwrap();
    let quiet = app
        .get(&format!("/api/v1/daemonsets?index={index}&wait=50ms"))
        .await;
    assert_eq!(quiet.header("x-index").unwrap(), index.to_string());

    let blocking_path = format!("/api/v1/daemonsets?index={index}&wait=10s");
    let blocked = app.get(&blocking_path);
    let change = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        create(&app, &body("")).await
    };
    let (response, id) = tokio::join!(blocked, change);
    assert!(response.header("x-index").unwrap().parse::<u64>().unwrap() > index);
    let mut listed = item_ids(&response.json());
    listed.sort();
    let mut expected = vec![other, id];
    expected.sort();
    assert_eq!(listed, expected);

    let response = app.get("/api/v1/daemonsets?index=1&wait=11m").await;
    assert_eq!(causes(&response), ["wait"]);
}

#[tokio::test]
async fn patch_changes_fields_with_one_audit_record_per_kind_of_change() {
    let app = TestApp::new().await;
    let id = create(&app, &body("role=web")).await;
    let new_manifest = format!("{MANIFEST}# v2\n");
    let response = patch(
        &app,
        &id,
        &json!({
            "manifest": new_manifest, "node_selector": "role in (web, api)", "disabled": true,
            "timeout": "1h30m", "min_health": 5, "cluster_name": "staging"
        }),
        &[],
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    let pair = stored(&app, &id).await.unwrap();
    assert_eq!(
        response.header("etag").unwrap(),
        format!("\"{}\"", pair.modify_index)
    );
    let ds = response.json();
    assert_eq!(ds["manifest"], new_manifest);
    assert_eq!(ds["node_selector"], "role in (api,web)");
    assert_eq!(ds["timeout"], "1h30m0s");
    assert_eq!(ds["resource_version"], pair.modify_index.to_string());
    let doc: Value = serde_json::from_slice(&pair.value).unwrap();
    assert_eq!(doc["timeout"], 5_400_000_000_000u64);
    assert_eq!(doc["min_health"], 5);
    assert_eq!(doc["cluster_name"], "staging");
    assert_eq!(doc["disabled"], true);

    let audits = audit_records(&app).await;
    let changes: Vec<&str> = audits
        .iter()
        .filter(|(_, index)| *index == pair.modify_index)
        .map(|(record, _)| record.event_type.as_str())
        .collect();
    assert_eq!(
        changes,
        [
            "DAEMON_SET_DISABLED",
            "DAEMON_SET_MANIFEST_UPDATED",
            "DAEMON_SET_MODIFIED",
            "DAEMON_SET_NODE_SELECTOR_UPDATED"
        ]
    );
    for (record, index) in &audits {
        if *index == pair.modify_index {
            assert_eq!(record.details()["user"], "anonymous");
            assert_eq!(record.details()["daemon_set"], doc);
        }
    }

    // A patch that changes nothing writes nothing.
    let response = patch(&app, &id, &json!({"min_health": 5}), &[]).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(stored(&app, &id).await.unwrap(), pair);
    assert_eq!(audit_records(&app).await.len(), audits.len());
    let response = patch(&app, &id, &json!({"disabled": false}), &[]).await;
    assert_eq!(response.status, StatusCode::OK);
    let last = audit_records(&app).await.pop().unwrap().0;
    assert_eq!(last.event_type, "DAEMON_SET_ENABLED");
}

#[tokio::test]
async fn patch_lists_every_bad_field_and_writes_nothing() {
    let app = TestApp::new().await;
    let id = create(&app, &body("")).await;
    let before = app.keys("").await;
    let pair = stored(&app, &id).await.unwrap();
    let response = patch(
        &app,
        &id,
        &json!({
            "manifest": manifest_for("other"), "node_selector": "!", "timeout": "-1s",
            "min_health": -3, "cluster_name": null, "pod_id": "other", "colour": "red"
        }),
        &[],
    )
    .await;
    assert_eq!(
        causes(&response),
        [
            "cluster_name",
            "colour",
            "manifest.id",
            "min_health",
            "node_selector",
            "pod_id",
            "timeout"
        ]
    );
    let response = patch(&app, &id, &json!({"manifest": manifest_for("other")}), &[]).await;
    assert_eq!(causes(&response), ["manifest.id"]);
    assert_eq!(app.keys("").await, before);
    assert_eq!(stored(&app, &id).await.unwrap(), pair);
}

#[tokio::test]
async fn patch_rejects_unreadable_requests_and_unknown_ids() {
    let app = TestApp::new().await;
    let id = create(&app, &body("")).await;
    let response = app
        .json_request(
            "PATCH",
            &format!("/api/v1/daemonsets/{id}"),
            Some(&json!({})),
            &[("content-type", "text/plain")],
        )
        .await;
    assert_eq!(response.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    response.error();
    let response = patch(&app, &id, &json!([]), &[]).await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    response.error();
    let response = patch(&app, &id, &json!({}), &[("if-match", "yesterday")]).await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    response.error();
    let response = patch(&app, P2_ID, &json!({"min_health": 1}), &[]).await;
    assert_eq!(response.status, StatusCode::NOT_FOUND);
    response.error();
    let response = patch(&app, "..", &json!({"min_health": 1}), &[]).await;
    assert_eq!(causes(&response), ["id"]);
    // Plain JSON is accepted as a merge patch.
    let response = app
        .json_request(
            "PATCH",
            &format!("/api/v1/daemonsets/{id}"),
            Some(&json!({"min_health": 7})),
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.json()["min_health"], 7);
}

#[tokio::test]
async fn stale_if_match_is_412_and_current_if_match_applies() {
    let app = TestApp::new().await;
    let id = create(&app, &body("")).await;
    let first = app.get(&format!("/api/v1/daemonsets/{id}")).await;
    let old_etag = first.header("etag").unwrap().to_owned();
    let response = patch(
        &app,
        &id,
        &json!({"min_health": 3}),
        &[("if-match", &old_etag)],
    )
    .await;
    assert_eq!(response.status, StatusCode::OK);
    let new_etag = response.header("etag").unwrap().to_owned();
    assert_ne!(new_etag, old_etag);

    let before = stored(&app, &id).await.unwrap();
    let response = patch(
        &app,
        &id,
        &json!({"min_health": 4}),
        &[("if-match", &old_etag)],
    )
    .await;
    assert_eq!(response.status, StatusCode::PRECONDITION_FAILED);
    response.error();
    let response = delete(&app, &id, &[("if-match", &old_etag)]).await;
    assert_eq!(response.status, StatusCode::PRECONDITION_FAILED);
    response.error();
    assert_eq!(stored(&app, &id).await.unwrap(), before);

    let response = delete(&app, &id, &[("if-match", &new_etag)]).await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    assert!(stored(&app, &id).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_patches_of_different_fields_all_take_effect() {
    let app = TestApp::new().await;
    let id = create(&app, &body("")).await;
    let new_manifest = format!("{MANIFEST}# patched\n");
    let patches = [
        json!({"min_health": 9}),
        json!({"cluster_name": "staging"}),
        json!({"timeout": "42s"}),
        json!({"node_selector": "role=web"}),
        json!({"manifest": new_manifest}),
        json!({"disabled": true}),
    ];
    let responses = join_all(patches.iter().map(|p| patch(&app, &id, p, &[]))).await;
    for response in &responses {
        assert_eq!(response.status, StatusCode::OK, "{response:?}");
    }
    let ds = app.get(&format!("/api/v1/daemonsets/{id}")).await.json();
    assert_eq!(ds["min_health"], 9);
    assert_eq!(ds["cluster_name"], "staging");
    assert_eq!(ds["timeout"], "42s");
    assert_eq!(ds["node_selector"], "role=web");
    assert_eq!(ds["manifest"], new_manifest);
    assert_eq!(ds["disabled"], true);
}

#[tokio::test]
async fn delete_removes_the_document_with_its_audit_record_in_one_transaction() {
    let app = TestApp::new().await;
    let id = create(&app, &body("")).await;
    let doc: Value = serde_json::from_slice(&stored(&app, &id).await.unwrap().value).unwrap();
    let response = delete(&app, &id, &[]).await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    assert!(stored(&app, &id).await.is_none());
    let deleted_at = app.store.list("daemon_sets/").await.unwrap().index;
    let (record, index) = audit_records(&app).await.pop().unwrap();
    assert_eq!(record.event_type, "DAEMON_SET_DELETED");
    assert_eq!(record.details()["user"], "anonymous");
    assert_eq!(record.details()["daemon_set"], doc);
    assert_eq!(index, deleted_at, "written in the same transaction");

    let response = delete(&app, &id, &[]).await;
    assert_eq!(response.status, StatusCode::NOT_FOUND);
    response.error();
    let response = delete(&app, "nope", &[]).await;
    assert_eq!(causes(&response), ["id"]);
}

/// The DS farm's status record goes with its daemon set, in the same transaction, rather
/// than staying forever.
#[tokio::test]
async fn delete_removes_the_farm_status_record_with_the_document() {
    let app = TestApp::new().await;
    let id = create(&app, &body("")).await;
    let status = format!("status/daemon_sets/{id}/daemon_set_farm");
    app.put_json(
        &status,
        &json!({"manifest_sha": "ab12", "nodes_deployed": 1, "replication_in_progress": false}),
    )
    .await;
    let response = delete(&app, &id, &[]).await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    assert!(stored(&app, &id).await.is_none());
    assert_eq!(app.stored(&status).await, None, "the status record is left");
}

#[tokio::test]
async fn a_p2_written_document_survives_get_and_patch() {
    let app = TestApp::new().await;
    app.put_raw(&format!("daemon_sets/{P2_ID}"), P2_DOCUMENT.as_bytes())
        .await;
    let ds = app.get(&format!("/api/v1/daemonsets/{P2_ID}")).await.json();
    assert_eq!(ds["manifest"], MANIFEST);
    assert_eq!(ds["node_selector"], "role!=db");
    assert_eq!(ds["timeout"], "10m0s");
    assert_eq!(ds["pod_id"], "p2-log-shipper");
    assert_eq!(
        &*stored(&app, P2_ID).await.unwrap().value,
        P2_DOCUMENT.as_bytes()
    );

    let response = patch(&app, P2_ID, &json!({"min_health": 3}), &[]).await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    let expected = P2_DOCUMENT.replace(r#""min_health":0"#, r#""min_health":3"#);
    assert_eq!(
        String::from_utf8(stored(&app, P2_ID).await.unwrap().value.to_vec()).unwrap(),
        expected
    );
    let response = patch(&app, P2_ID, &json!({"timeout": "1m"}), &[]).await;
    assert_eq!(response.status, StatusCode::OK);
    let expected = expected.replace("600000000000", "60000000000");
    assert_eq!(
        String::from_utf8(stored(&app, P2_ID).await.unwrap().value.to_vec()).unwrap(),
        expected
    );
}

#[tokio::test]
async fn an_undecodable_stored_document_is_500_on_read() {
    let app = TestApp::new().await;
    app.put_json(&format!("daemon_sets/{P2_ID}"), &json!({"id": P2_ID}))
        .await;
    let response = app.get(&format!("/api/v1/daemonsets/{P2_ID}")).await;
    assert_eq!(response.status, StatusCode::INTERNAL_SERVER_ERROR);
    response.error();
    let response = app.get("/api/v1/daemonsets").await;
    assert_eq!(response.json()["items"], json!([]));
}

#[tokio::test]
async fn the_openapi_document_describes_every_route() {
    let app = TestApp::new().await;
    let doc = app.get("/openapi.json").await.json();
    assert_operations(
        &doc,
        "daemonsets",
        &[
            ("/api/v1/daemonsets", "get", "list_daemon_sets"),
            ("/api/v1/daemonsets", "post", "create_daemon_set"),
            ("/api/v1/daemonsets/{id}", "get", "get_daemon_set"),
            ("/api/v1/daemonsets/{id}", "patch", "patch_daemon_set"),
            ("/api/v1/daemonsets/{id}", "delete", "delete_daemon_set"),
        ],
    );
}

/// A stored document that cannot be decoded reads as 500 `UnreadableDocument` saying how to
/// clear it, stays out of lists, and can be deleted (there is nothing to audit).
#[tokio::test]
async fn an_undecodable_daemon_set_is_reported_and_can_be_deleted() {
    let app = TestApp::new().await;
    let good = create(&app, &body("")).await;
    let id = "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11";
    app.put_raw(&format!("daemon_sets/{id}"), "{\"id\": 7")
        .await;
    let audits = audit_records(&app).await.len();

    for response in [
        app.get(&format!("/api/v1/daemonsets/{id}")).await,
        patch(&app, id, &json!({"disabled": true}), &[]).await,
    ] {
        assert_eq!(response.status, StatusCode::INTERNAL_SERVER_ERROR);
        let error = response.error();
        assert_eq!(error.reason, "UnreadableDocument", "{error:?}");
        assert!(
            error
                .message
                .contains(&format!("DELETE /api/v1/daemonsets/{id}")),
            "{error:?}"
        );
    }
    assert_eq!(
        item_ids(&app.get("/api/v1/daemonsets").await.json()),
        [good.as_str()]
    );

    let stale = delete(&app, id, &[("if-match", "\"1\"")]).await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED);
    let response = delete(&app, id, &[]).await;
    assert_eq!(response.status, StatusCode::NO_CONTENT, "{response:?}");
    assert!(stored(&app, id).await.is_none());
    assert!(stored(&app, &good).await.is_some());
    assert_eq!(audit_records(&app).await.len(), audits);
}

/// A daemon set is stored beside its audit record, which holds it again: a manifest too
/// large for both in one Consul transaction (512 KiB, values in base64) is refused with 422
/// on either store, and nothing is written.
#[tokio::test]
async fn a_manifest_too_large_for_one_transaction_is_422_and_writes_nothing() {
    let app = TestApp::new().await;
    let mut doc = body("role=web");
    doc["manifest"] = format!("{MANIFEST}blob: {}\n", "x".repeat(250_000)).into();
    let response = post(&app, &doc, &[]).await;
    assert_eq!(
        response.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{response:?}"
    );
    assert!(
        response.json()["message"]
            .as_str()
            .unwrap()
            .contains("512 KiB"),
        "{response:?}"
    );
    assert!(app.keys("").await.is_empty());
}
