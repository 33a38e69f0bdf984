//! The replication controller routes: create, list (selectors, paging, blocking), get with
//! status, patch (merge patch, If-Match, retries, the mutation lock) and delete.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use p2_apiserver::kv::{Cas, SessionBehavior, SessionSpec};
use p2_apiserver::model::Manifest;
use p2_apiserver::router::MAX_BODY_BYTES;
use serde_json::{json, Value};

use crate::support::api::{assert_operations, item_ids, TestApp, TestResponse};

const MANIFEST: &str = "id: hello\n# kept verbatim\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_1.tar.gz\n";

fn spec() -> Value {
    json!({
        "manifest": MANIFEST,
        "node_selector": "role in (worker,web),az=a",
        "pod_labels": {"team": "edge"},
        "replicas_desired": 2,
        "allocation_strategy": "static_strategy",
        "labels": {"owner": "ops"},
        "availability_zone": "us-west-2a",
        "cluster_name": "production",
    })
}

async fn create(app: &TestApp, body: &Value) -> Value {
    let response = app
        .json_request("POST", "/api/v1/rcs", Some(body), &[])
        .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    response.json()
}

/// Creates an RC from `spec()` and returns its ID.
async fn create_id(app: &TestApp) -> String {
    create(app, &spec()).await["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn patch(app: &TestApp, id: &str, body: &Value, headers: &[(&str, &str)]) -> TestResponse {
    app.merge_patch(&format!("/api/v1/rcs/{id}"), body, headers)
        .await
}

/// Holds the RC's mutation lock with a fresh session, as a running roll does.
async fn hold_mutation_lock(app: &TestApp, rc_id: &str) -> String {
    let session = app
        .store
        .create_session(&SessionSpec {
            name: "roll farm".into(),
            ttl: Duration::from_secs(10),
            lock_delay: Duration::from_millis(1),
            behavior: SessionBehavior::Delete,
        })
        .await
        .unwrap();
    let key = format!("lock/replication_controllers/{rc_id}/update");
    assert!(app.store.acquire(&key, b"roll", &session).await.unwrap());
    session
}

#[tokio::test]
async fn create_answers_201_and_stores_the_rc_and_its_labels() {
    let app = TestApp::new().await;
    let response = app
        .json_request("POST", "/api/v1/rcs", Some(&spec()), &[])
        .await;
    let body = response.json();
    let id = body["id"].as_str().unwrap().to_owned();
    assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 7);
    let version = body["resource_version"].as_str().unwrap();
    response.assert_created(&format!("/api/v1/rcs/{id}"), version);
    assert_eq!(
        body,
        json!({
            "id": id,
            "manifest": MANIFEST,
            "node_selector": "az=a,role in (web,worker)",
            "pod_labels": {"availability_zone": "us-west-2a", "cluster_name": "production", "team": "edge"},
            "replicas_desired": 2,
            "disabled": false,
            "allocation_strategy": "static_strategy",
            "labels": {"owner": "ops", "pod_id": "hello"},
            "resource_version": version,
            "status": {"current_replicas": 0, "nodes": []},
            "conditions": [],
            "created": body["created"],
            "modified": body["created"],
        })
    );
    assert!(body["created"].is_string());
    let rc = app
        .store
        .get(&format!("replication_controllers/{id}"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rc.modify_index.to_string(), version);
    assert_eq!(
        app.stored_json(&format!("labels/replication_controller/{id}"))
            .await,
        Some(json!({"owner": "ops", "pod_id": "hello"}))
    );

    let got = app.get(&format!("/api/v1/rcs/{id}")).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.json(), body);
    assert_eq!(got.header("etag"), response.header("etag"));
}

#[tokio::test]
async fn create_takes_a_json_manifest_and_p2_defaults() {
    let app = TestApp::new().await;
    let body = create(
        &app,
        &json!({"manifest": {"id": "hello", "config": {"a": 1}}}),
    )
    .await;
    assert_eq!(body["replicas_desired"], 0);
    assert_eq!(body["disabled"], false);
    assert_eq!(body["allocation_strategy"], "");
    assert_eq!(body["node_selector"], "");
    assert_eq!(body["pod_labels"], json!({}));
    assert_eq!(body["labels"], json!({"pod_id": "hello"}));
    let manifest = body["manifest"].as_str().unwrap();
    assert!(manifest.contains("id: hello\n"), "{manifest}");
    assert!(manifest.contains("config:\n  a: 1\n"), "{manifest}");
}

/// A JSON manifest's strings stay strings for P2, whose YAML (1.1) reads a plain `yes`, `on`,
/// `NO` or `1_000` as a boolean or a number.
#[tokio::test]
async fn a_json_manifest_keeps_its_strings_strings_for_p2() {
    let app = TestApp::new().await;
    let config = json!({"a": "yes", "b": "on", "c": "NO", "d": "off", "e": "y", "f": "1_000", "g": "1:20", "h": 1.5, "i": 7, "j": true});
    let body = create(
        &app,
        &json!({"manifest": {"id": "hello", "config": config}}),
    )
    .await;
    let stored = Manifest::parse(body["manifest"].as_str().unwrap()).unwrap();
    let as_sent = "id: hello\nconfig:\n  a: \"yes\"\n  b: \"on\"\n  c: \"NO\"\n  d: \"off\"\n  e: \"y\"\n  f: \"1_000\"\n  g: \"1:20\"\n  h: 1.5\n  i: 7\n  j: true\n";
    assert_eq!(
        stored.sha(),
        Manifest::parse(as_sent).unwrap().sha(),
        "{}",
        stored.raw()
    );
}

/// A manifest holding a number float32 cannot hold (P2 takes it, and writes it as infinity
/// in the form its SHA hashes) is taken, as YAML text or as JSON, and one P2 stored is read;
/// before, reading such a manifest panicked.
#[tokio::test]
async fn a_manifest_with_a_number_beyond_float32_is_taken_and_read() {
    let app = TestApp::new().await;
    let text = "id: hello\nconfig:\n  big: 1e300\n";
    let from_text = create(&app, &json!({"manifest": text})).await;
    assert_eq!(from_text["manifest"], text);
    create(
        &app,
        &json!({"manifest": {"id": "hello", "config": {"big": 1e300}}}),
    )
    .await;
    let id = uuid::Uuid::new_v4().to_string();
    let key = format!("replication_controllers/{id}");
    let doc = json!({
        "id": id, "manifest": text, "node_selector": "", "pod_labels": null,
        "replicas_desired": 1, "disabled": false, "allocation_strategy": "static_strategy"
    });
    app.put_json(&key, &doc).await;
    app.mirrored(&key).await;
    let read = app.get(&format!("/api/v1/rcs/{id}")).await;
    assert_eq!(read.status, StatusCode::OK, "{read:?}");
    assert_eq!(read.json()["manifest"], text);
}

#[tokio::test]
async fn create_lists_every_problem_and_writes_nothing() {
    let app = TestApp::new().await;
    let response = app
        .json_request(
            "POST",
            "/api/v1/rcs",
            Some(&json!({
                "manifest": "launchables:\n  app:\n    launchable_type: hoist\n",
                "node_selector": "role in (web",
                "pod_labels": {"-bad": "v"},
                "labels": {"ok": "not ok!"},
                "replicas_desired": -3,
                "allocation_strategy": "whenever",
            })),
            &[],
        )
        .await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.error().reason, "Invalid");
    assert_eq!(
        response.cause_fields(),
        [
            "manifest.id",
            "manifest.launchables.app.location",
            "node_selector",
            "pod_labels.-bad",
            "labels.ok",
            "replicas_desired",
            "allocation_strategy",
        ]
    );
    assert_eq!(app.dump().await, []);
}

#[tokio::test]
async fn create_refuses_unusable_bodies() {
    let app = TestApp::new().await;
    let post = |content_type: &'static str, body: Vec<u8>| {
        Request::post("/api/v1/rcs")
            .header("content-type", content_type)
            .body(Body::from(body))
            .unwrap()
    };
    let cases = [
        (
            post("application/json", b"{\"manifest\": ".to_vec()),
            StatusCode::BAD_REQUEST,
        ),
        (
            post("text/plain", spec().to_string().into_bytes()),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            post("application/json", vec![b' '; MAX_BODY_BYTES + 1]),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            post(
                "application/json",
                json!({"manifest": MANIFEST, "replica": 1})
                    .to_string()
                    .into_bytes(),
            ),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            post("application/json", b"{\"node_selector\": \"\"}".to_vec()),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (request, status) in cases {
        let response = app.send(request).await;
        assert_eq!(response.status, status, "{response:?}");
        response.error();
    }
    assert_eq!(app.dump().await, []);
}

#[tokio::test]
async fn get_refuses_bad_ids_and_answers_404_for_missing_rcs() {
    let app = TestApp::new().await;
    for id in [
        "not-a-uuid",
        "..",
        "5a0e3b8c-6f2d-4c1e-9a57",
        "%2E%2E%2Fnode",
    ] {
        let response = app.get(&format!("/api/v1/rcs/{id}")).await;
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{id}");
        assert_eq!(response.cause_fields(), ["id"]);
    }
    let missing = uuid::Uuid::new_v4();
    let response = app.get(&format!("/api/v1/rcs/{missing}")).await;
    assert_eq!(response.status, StatusCode::NOT_FOUND);
    assert!(response.error().message.contains(&missing.to_string()));
}

#[tokio::test]
async fn get_reads_the_status_from_pod_labels() {
    let app = TestApp::new().await;
    let id = create_id(&app).await;
    let mine = json!({"pod_id": "hello", "replication_controller_id": id});
    for node in ["node2", "node1"] {
        app.put_json(&format!("labels/pod/{node}/hello"), &mine)
            .await;
    }
    let other =
        json!({"pod_id": "hello", "replication_controller_id": uuid::Uuid::new_v4().to_string()});
    app.put_json("labels/pod/node3/hello", &other).await;

    let body = app.get(&format!("/api/v1/rcs/{id}")).await.json();
    assert_eq!(
        body["status"],
        json!({"current_replicas": 2, "nodes": ["node1", "node2"]})
    );
    let listed = app.get("/api/v1/rcs").await.json();
    assert_eq!(listed["items"][0]["status"], body["status"]);
}

#[tokio::test]
async fn list_filters_by_rc_labels_and_pages_by_id() {
    let app = TestApp::new().await;
    let mut ids = Vec::new();
    for (n, owner) in ["ops", "dev", "ops"].iter().enumerate() {
        let mut body = spec();
        body["labels"] = json!({"owner": owner, "n": n.to_string()});
        ids.push(create(&app, &body).await["id"].as_str().unwrap().to_owned());
    }
    let listing = app.get("/api/v1/rcs").await;
    assert_eq!(listing.status, StatusCode::OK);
    let index: u64 = listing.header("x-index").unwrap().parse().unwrap();
    assert!(index > 0);
    let body = listing.json();
    let mut sorted = ids.clone();
    sorted.sort();
    let listed = item_ids(&body);
    assert_eq!(listed, sorted);
    assert_eq!(body["continue"], Value::Null);

    let ops = app.get("/api/v1/rcs?selector=owner%3Dops").await.json();
    let mut expected = vec![ids[0].as_str(), ids[2].as_str()];
    expected.sort();
    let listed = item_ids(&ops);
    assert_eq!(listed, expected);

    let first = app.get("/api/v1/rcs?limit=2").await.json();
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let token = first["continue"].as_str().unwrap();
    let rest = app
        .get(&format!("/api/v1/rcs?limit=2&continue={token}"))
        .await
        .json();
    assert_eq!(rest["items"][0]["id"], sorted[2]);
    assert_eq!(rest["continue"], Value::Null);

    let bad = app.get("/api/v1/rcs?selector=owner%20in%20(").await;
    assert_eq!(bad.unprocessable_fields(), ["selector"]);
    // Refused at once, not after the wait.
    let bad = tokio::time::timeout(
        Duration::from_secs(5),
        app.get(&format!("/api/v1/rcs?limit=0&index={index}&wait=10m")),
    )
    .await
    .expect("answered without waiting");
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    let bad = app.get("/api/v1/rcs?index=1&wait=11m").await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    let bad = app.get("/api/v1/rcs?limit=many").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_blocking_list_wakes_on_a_change_and_times_out_unchanged() {
    let app = Arc::new(TestApp::new().await);
    create(&app, &spec()).await;
    // A pod and conditions of no RC here, so that every tree the listing watches is in use:
    // on Consul an empty tree reads at the index of the whole KV store, which any write
    // anywhere moves.
    app.put_raw("labels/pod/node9/other", br#"{"pod_id": "other"}"#)
        .await;
    app.put_raw(
        "p2-apiserver/conditions/rcs/other",
        br#"{"conditions": []}"#,
    )
    .await;
    let index = app
        .get("/api/v1/rcs")
        .await
        .header("x-index")
        .unwrap()
        .to_owned();

    let unchanged = app
        .get(&format!("/api/v1/rcs?index={index}&wait=50ms"))
        .await;
    assert_eq!(unchanged.status, StatusCode::OK);
    assert_eq!(unchanged.header("x-index"), Some(index.as_str()));

    let waiting = app
        .get_held(format!("/api/v1/rcs?index={index}&wait=10s"))
        .await;
    let new = create(&app, &spec()).await;
    let woken = waiting.woken("the blocked list woke").await;
    assert_eq!(woken.status, StatusCode::OK);
    assert_ne!(woken.header("x-index"), Some(index.as_str()));
    let items = woken.json()["items"].as_array().unwrap().clone();
    assert!(items.iter().any(|rc| rc["id"] == new["id"]));
}

#[tokio::test]
async fn patch_changes_only_the_given_fields() {
    let app = TestApp::new().await;
    let created = create(&app, &spec()).await;
    let id = created["id"].as_str().unwrap();
    let new_manifest = MANIFEST.replace("hello_1", "hello_2");
    let response = patch(
        &app,
        id,
        &json!({
            "replicas_desired": 5,
            "disabled": true,
            "node_selector": "b=2, a=1",
            "pod_labels": {"team": null, "tier": "web"},
            "manifest": new_manifest,
            "allocation_strategy": "dynamic_strategy",
        }),
        &[],
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    let body = response.json();
    let version = body["resource_version"].as_str().unwrap();
    assert_ne!(version, created["resource_version"].as_str().unwrap());
    assert_eq!(
        response.header("etag"),
        Some(format!("\"{version}\"").as_str())
    );
    let mut expected = created.clone();
    expected["replicas_desired"] = json!(5);
    expected["disabled"] = json!(true);
    expected["node_selector"] = json!("a=1,b=2");
    expected["pod_labels"] =
        json!({"availability_zone": "us-west-2a", "cluster_name": "production", "tier": "web"});
    expected["manifest"] = json!(new_manifest);
    expected["allocation_strategy"] = json!("dynamic_strategy");
    expected["resource_version"] = json!(version);
    expected["modified"] = body["modified"].clone();
    assert_eq!(body, expected);
    assert_eq!(app.get(&format!("/api/v1/rcs/{id}")).await.json(), expected);

    let cleared = patch(&app, id, &json!({"pod_labels": null}), &[]).await;
    assert_eq!(cleared.json()["pod_labels"], json!({}));
    let raw = app
        .stored_json(&format!("replication_controllers/{id}"))
        .await
        .unwrap();
    assert_eq!(raw["pod_labels"], Value::Null);

    // A plain JSON body works too, and an empty patch changes nothing.
    let plain = app
        .json_request("PATCH", &format!("/api/v1/rcs/{id}"), Some(&json!({})), &[])
        .await;
    assert_eq!(plain.status, StatusCode::OK);
    assert_eq!(plain.header("etag"), cleared.header("etag"));
}

#[tokio::test]
async fn patch_lists_every_bad_field_and_writes_nothing() {
    let app = TestApp::new().await;
    let id = create_id(&app).await;
    let before = app.dump().await;
    let response = patch(
        &app,
        &id,
        &json!({
            "replicas_desired": -1,
            "disabled": "yes",
            "node_selector": "a in (",
            "pod_labels": {"ok": 3, "bad key!": "v"},
            "manifest": "launchables: 3\n",
            "allocation_strategy": "",
            "labels": {"a": "b"},
            "id": "x",
            "status": {},
            "spec": 1,
        }),
        &[],
    )
    .await;
    let mut got = response.unprocessable_fields();
    got.sort();
    let mut expected = [
        "allocation_strategy",
        "disabled",
        "id",
        "labels",
        "manifest.id",
        "manifest.launchables",
        "node_selector",
        "pod_labels.bad key!",
        "pod_labels.ok",
        "replicas_desired",
        "spec",
        "status",
    ];
    expected.sort();
    assert_eq!(got, expected);

    for body in [
        json!({"replicas_desired": null}),
        json!({"manifest": {"id": "other"}}),
        json!({"replicas_desired": 1.5}),
    ] {
        let response = patch(&app, &id, &body, &[]).await;
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    }
    let response = patch(&app, &id, &json!({"manifest": {"id": "other"}}), &[]).await;
    assert_eq!(response.cause_fields(), ["manifest.id"]);
    assert_eq!(app.dump().await, before);
}

#[tokio::test]
async fn patch_refuses_unusable_requests() {
    let app = TestApp::new().await;
    let id = create_id(&app).await;
    let before = app.dump().await;
    let path = format!("/api/v1/rcs/{id}");
    let request = |content_type: &str, body: Vec<u8>| {
        Request::patch(path.as_str())
            .header("content-type", content_type)
            .body(Body::from(body))
            .unwrap()
    };
    let cases = [
        (
            request("application/merge-patch+json", b"{".to_vec()),
            StatusCode::BAD_REQUEST,
        ),
        (
            request("application/json", b"[1]".to_vec()),
            StatusCode::BAD_REQUEST,
        ),
        (
            request("text/plain", b"{\"disabled\": true}".to_vec()),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            request("application/json", vec![b' '; MAX_BODY_BYTES + 1]),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ];
    for (request, status) in cases {
        let response = app.send(request).await;
        assert_eq!(response.status, status, "{response:?}");
        response.error();
    }
    let missing = patch(
        &app,
        &uuid::Uuid::new_v4().to_string(),
        &json!({"disabled": true}),
        &[],
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let bad_id = patch(&app, "nope", &json!({"disabled": true}), &[]).await;
    assert_eq!(bad_id.status, StatusCode::UNPROCESSABLE_ENTITY);
    let bad_etag = patch(
        &app,
        &id,
        &json!({"disabled": true}),
        &[("if-match", "\"v1\"")],
    )
    .await;
    assert_eq!(bad_etag.status, StatusCode::BAD_REQUEST);
    assert_eq!(app.dump().await, before);
}

#[tokio::test]
async fn if_match_makes_patch_and_delete_conditional() {
    let app = TestApp::new().await;
    let created = create(&app, &spec()).await;
    let id = created["id"].as_str().unwrap();
    let first = format!("\"{}\"", created["resource_version"].as_str().unwrap());

    let ok = patch(
        &app,
        id,
        &json!({"replicas_desired": 0}),
        &[("if-match", &first)],
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
    let before = app.dump().await;
    let stale = patch(
        &app,
        id,
        &json!({"disabled": true}),
        &[("if-match", &first)],
    )
    .await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED);
    assert_eq!(stale.error().reason, "PreconditionFailed");
    let path = format!("/api/v1/rcs/{id}");
    let stale = app
        .json_request("DELETE", &path, None, &[("if-match", &first)])
        .await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED);
    assert_eq!(app.dump().await, before);

    let current = ok.header("etag").unwrap().to_owned();
    let deleted = app
        .json_request("DELETE", &path, None, &[("if-match", &current)])
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
}

/// A list of ETags lets a patch through if the RC is at any of them, weak or not; `*` lets
/// it through to whatever version is stored, while the RC exists.
#[tokio::test]
async fn if_match_takes_a_list_of_etags_or_any_version_of_an_rc_that_exists() {
    let app = TestApp::new().await;
    let created = create(&app, &spec()).await;
    let id = created["id"].as_str().unwrap();
    let version: u64 = created["resource_version"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let current = format!("\"{version}\"");
    let (later, latest) = (version + 1, version + 2);

    let before = app.dump().await;
    let stale = patch(
        &app,
        id,
        &json!({"replicas_desired": 0}),
        &[("if-match", &format!("\"{later}\", W/\"{latest}\""))],
    )
    .await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED, "{stale:?}");
    assert_eq!(stale.error().reason, "PreconditionFailed");
    assert_eq!(app.dump().await, before);

    let listed = format!("\"{later}\", W/{current}");
    let ok = patch(
        &app,
        id,
        &json!({"replicas_desired": 0}),
        &[("if-match", &listed)],
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
    let any = patch(&app, id, &json!({"disabled": true}), &[("if-match", "*")]).await;
    assert_eq!(any.status, StatusCode::OK, "{any:?}");
    assert_eq!(any.json()["disabled"], true);

    let path = format!("/api/v1/rcs/{id}");
    let deleted = app
        .json_request("DELETE", &path, None, &[("if-match", "*")])
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    let gone = patch(&app, id, &json!({"disabled": false}), &[("if-match", "*")]).await;
    assert_eq!(gone.status, StatusCode::PRECONDITION_FAILED, "{gone:?}");
    gone.error();
}

#[tokio::test]
async fn delete_needs_zero_replicas_or_force_and_removes_the_labels_too() {
    let app = TestApp::new().await;
    let id = create_id(&app).await;
    let path = format!("/api/v1/rcs/{id}");
    let before = app.dump().await;
    let refused = app.json_request("DELETE", &path, None, &[]).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert!(refused.error().message.contains("force"));
    assert_eq!(app.dump().await, before);

    let deleted = app
        .json_request("DELETE", &format!("{path}?force=true"), None, &[])
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert!(deleted.body.is_empty());
    let left: Vec<String> = app.dump().await.into_iter().map(|(key, _)| key).collect();
    assert!(
        left.iter()
            .all(|key| key.starts_with("p2-apiserver/events/")),
        "only the events are left: {left:?}"
    );
    assert_eq!(app.get(&path).await.status, StatusCode::NOT_FOUND);
    let again = app.json_request("DELETE", &path, None, &[]).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);

    let zero = create(&app, &json!({"manifest": MANIFEST})).await;
    let path = format!("/api/v1/rcs/{}", zero["id"].as_str().unwrap());
    assert_eq!(
        app.json_request("DELETE", &path, None, &[]).await.status,
        StatusCode::NO_CONTENT
    );
    let bad = app
        .json_request("DELETE", "/api/v1/rcs/x?force=maybe", None, &[])
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let bad = app
        .json_request("DELETE", "/api/v1/rcs/..", None, &[])
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn the_mutation_lock_refuses_patch_and_delete_naming_the_roll() {
    let app = TestApp::new().await;
    let old = create_id(&app).await;
    let new = uuid::Uuid::new_v4().to_string();
    let roll = json!({"OldRC": old, "NewRC": new, "DesiredReplicas": 2, "MinimumReplicas": 1,
                      "LeaveOld": false, "RollDelay": 0});
    app.store
        .put(
            &format!("rolls/{new}"),
            roll.to_string().as_bytes(),
            Cas::Index(0),
        )
        .await
        .unwrap();
    let session = hold_mutation_lock(&app, &old).await;
    let before = app.dump().await;

    let patched = patch(&app, &old, &json!({"replicas_desired": 0}), &[]).await;
    assert_eq!(patched.status, StatusCode::CONFLICT);
    assert!(
        patched.error().message.contains(&format!("roll {new}")),
        "{patched:?}"
    );
    let deleted = app
        .json_request(
            "DELETE",
            &format!("/api/v1/rcs/{old}?force=true"),
            None,
            &[],
        )
        .await;
    assert_eq!(deleted.status, StatusCode::CONFLICT);
    assert!(deleted.error().message.contains(&new));
    assert_eq!(app.dump().await, before);

    // Without a roll record the holder is named by its session.
    app.store
        .delete(&format!("rolls/{new}"), Cas::Any)
        .await
        .unwrap();
    let patched = patch(&app, &old, &json!({"replicas_desired": 0}), &[]).await;
    assert_eq!(patched.status, StatusCode::CONFLICT);
    assert!(patched.error().message.contains(&session));

    // Once the lock is released, the same requests go through.
    app.store
        .release(
            &format!("lock/replication_controllers/{old}/update"),
            &session,
        )
        .await
        .unwrap();
    let patched = patch(&app, &old, &json!({"replicas_desired": 0}), &[]).await;
    assert_eq!(patched.status, StatusCode::OK);
    let deleted = app
        .json_request("DELETE", &format!("/api/v1/rcs/{old}"), None, &[])
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_if_match_increments_all_land() {
    let app = Arc::new(TestApp::new().await);
    let mut body = spec();
    body["replicas_desired"] = json!(7);
    let id = create(&app, &body).await["id"].as_str().unwrap().to_owned();
    let clients = (0..20).map(|_| {
        let app = app.clone();
        let id = id.clone();
        tokio::spawn(async move {
            for _ in 0..10 {
                loop {
                    let current = app.get(&format!("/api/v1/rcs/{id}")).await;
                    let replicas = current.json()["replicas_desired"].as_i64().unwrap();
                    let version = current.header("etag").unwrap().to_owned();
                    let response = patch(
                        &app,
                        &id,
                        &json!({"replicas_desired": replicas + 1}),
                        &[("if-match", &version)],
                    )
                    .await;
                    match response.status {
                        StatusCode::OK => break,
                        StatusCode::PRECONDITION_FAILED => continue,
                        other => panic!("unexpected {other}: {response:?}"),
                    }
                }
            }
        })
    });
    for client in clients.collect::<Vec<_>>() {
        client.await.unwrap();
    }
    let body = app.get(&format!("/api/v1/rcs/{id}")).await.json();
    assert_eq!(body["replicas_desired"], 207);
}

/// Sends every patch at once without If-Match, each from its own task, and checks that every
/// one answers 200: a patch that loses a race is re-applied to the newer version, never
/// refused as "kept changing" or as the store being unavailable.
async fn patch_concurrently(app: &Arc<TestApp>, id: &str, patches: Vec<Value>) {
    let clients: Vec<_> = patches
        .into_iter()
        .map(|body| {
            let (app, id) = (app.clone(), id.to_owned());
            tokio::spawn(async move { patch(&app, &id, &body, &[]).await })
        })
        .collect();
    for client in clients {
        let response = client.await.unwrap();
        assert_eq!(response.status, StatusCode::OK, "{response:?}");
    }
}

/// `writers` patches each adding its own pod label, all at once; every label lands.
async fn concurrent_pod_label_patches_all_land(writers: usize) {
    let app = Arc::new(TestApp::new().await);
    let id = create_id(&app).await;
    let patches = (0..writers)
        .map(|n| json!({"pod_labels": {format!("key{n}"): format!("value{n}")}}))
        .collect();
    patch_concurrently(&app, &id, patches).await;
    let body = app.get(&format!("/api/v1/rcs/{id}")).await.json();
    let labels = body["pod_labels"].as_object().unwrap();
    for n in 0..writers {
        assert_eq!(labels[&format!("key{n}")], format!("value{n}"));
    }
    assert_eq!(labels["team"], "edge");
    assert_eq!(labels.len(), writers + 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_patches_of_different_pod_labels_all_land() {
    concurrent_pod_label_patches_all_land(16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_patches_of_different_pod_labels_all_land() {
    concurrent_pod_label_patches_all_land(50).await;
}

/// Sixteen patches at once, each changing a different field or adding or removing a
/// different pod label: every change is in the RC at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_patches_of_different_fields_all_land() {
    let app = Arc::new(TestApp::new().await);
    let id = create_id(&app).await;
    let manifest = format!("{MANIFEST}# patched\n");
    let mut patches = vec![
        json!({"replicas_desired": 7}),
        json!({"disabled": true}),
        json!({"node_selector": "role=web"}),
        json!({"manifest": manifest}),
        json!({"allocation_strategy": "dynamic_strategy"}),
        json!({"pod_labels": {"team": null}}),
    ];
    patches.extend((0..10).map(|n| json!({"pod_labels": {format!("key{n}"): "v"}})));
    assert_eq!(patches.len(), 16);
    patch_concurrently(&app, &id, patches).await;
    let rc = app.get(&format!("/api/v1/rcs/{id}")).await.json();
    assert_eq!(rc["replicas_desired"], 7);
    assert_eq!(rc["disabled"], true);
    assert_eq!(rc["node_selector"], "role=web");
    assert_eq!(rc["manifest"], manifest);
    assert_eq!(rc["allocation_strategy"], "dynamic_strategy");
    let labels = rc["pod_labels"].as_object().unwrap();
    assert!(labels.get("team").is_none(), "{labels:?}");
    for n in 0..10 {
        assert_eq!(labels[&format!("key{n}")], "v");
    }
    assert_eq!(labels.len(), 12);
}

#[tokio::test]
async fn the_openapi_document_describes_every_rc_route() {
    let app = TestApp::new().await;
    let document = app.get("/openapi.json").await.json();
    let operations = [
        ("/api/v1/rcs", "post", "create_rc"),
        ("/api/v1/rcs", "get", "list_rcs"),
        ("/api/v1/rcs/{id}", "get", "get_rc"),
        ("/api/v1/rcs/{id}", "patch", "patch_rc"),
        ("/api/v1/rcs/{id}", "delete", "delete_rc"),
    ];
    let documented = assert_operations(&document, "replication_controllers", &operations);
    for (operation, (path, method, _)) in documented.iter().zip(operations) {
        assert!(operation["responses"]["422"].is_object(), "{path} {method}");
    }
    let schemas = &document["components"]["schemas"];
    for schema in ["RcSpec", "RcView", "RcStatus"] {
        assert!(schemas[schema].is_object(), "{schema} missing");
    }
    assert_eq!(
        schemas["RcView"]["properties"]["pod_labels"]["additionalProperties"],
        json!({"type": "string"})
    );
}

/// A stored document that cannot be decoded reads as 500 `UnreadableDocument` saying how to
/// clear it, stays out of lists, and can be deleted whatever it once wanted.
#[tokio::test]
async fn an_undecodable_rc_is_reported_and_can_be_deleted() {
    let app = TestApp::new().await;
    let good = create_id(&app).await;
    let id = uuid::Uuid::new_v4().to_string();
    let key = format!("replication_controllers/{id}");
    app.put_raw(&key, r#"{"id":"x","replicas_desired":"three"}"#)
        .await;
    app.put_raw(
        &format!("labels/replication_controller/{id}"),
        r#"{"pod_id":"hello"}"#,
    )
    .await;

    for response in [
        app.get(&format!("/api/v1/rcs/{id}")).await,
        patch(&app, &id, &json!({"replicas_desired": 0}), &[]).await,
    ] {
        assert_eq!(response.status, StatusCode::INTERNAL_SERVER_ERROR);
        let error = response.error();
        assert_eq!(error.reason, "UnreadableDocument");
        assert!(
            error.message.contains(&format!("DELETE /api/v1/rcs/{id}")),
            "{error:?}"
        );
    }
    assert_eq!(
        item_ids(&app.get("/api/v1/rcs").await.json()),
        [good.as_str()]
    );

    let index = app.stored(&key).await.unwrap().modify_index;
    let stale = app
        .json_request(
            "DELETE",
            &format!("/api/v1/rcs/{id}"),
            None,
            &[("if-match", &format!("\"{}\"", index + 1))],
        )
        .await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED);
    let deleted = app
        .json_request("DELETE", &format!("/api/v1/rcs/{id}"), None, &[])
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    assert!(app.stored(&key).await.is_none());
    assert!(app
        .stored(&format!("labels/replication_controller/{id}"))
        .await
        .is_none());
    assert!(app
        .stored(&format!("replication_controllers/{good}"))
        .await
        .is_some());
}

/// P2's store refuses to delete an RC whose `replicas_desired` is anything but 0 without
/// `force`, and its store writes any count (`SetDesiredReplicas`): a negative count left by
/// another tool is no licence to delete the RC unforced.
#[tokio::test]
async fn delete_refuses_a_negative_replica_count_without_force() {
    let app = TestApp::new().await;
    let id = uuid::Uuid::new_v4().to_string();
    let key = format!("replication_controllers/{id}");
    let stored = json!({"id": id, "manifest": MANIFEST, "node_selector": "", "pod_labels": null,
                        "replicas_desired": -1, "disabled": false, "allocation_strategy": ""});
    app.put_raw(&key, &stored.to_string()).await;
    let before = app.dump().await;
    let path = format!("/api/v1/rcs/{id}");

    let refused = app.json_request("DELETE", &path, None, &[]).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    assert!(
        refused.error().message.contains("-1 replicas"),
        "{refused:?}"
    );
    assert_eq!(app.dump().await, before);

    let forced = app
        .json_request("DELETE", &format!("{path}?force=true"), None, &[])
        .await;
    assert_eq!(forced.status, StatusCode::NO_CONTENT, "{forced:?}");
    assert!(app.stored(&key).await.is_none());
}

/// A stored roll that cannot be decoded may still name an RC as its old one: its bytes hold
/// the RC's id. Such an RC is neither changed nor deleted while the roll is stored (500
/// `UnreadableDocument` naming the roll and the `DELETE` that clears it) rather than leave
/// the roll over an RC that is gone. An RC whose id the roll's bytes do not hold is changed
/// and deleted as before.
#[tokio::test]
async fn an_rc_an_unreadable_roll_may_name_is_neither_changed_nor_deleted() {
    let app = TestApp::new().await;
    let named = create_id(&app).await;
    let other = create_id(&app).await;
    let bad = uuid::Uuid::new_v4().to_string();
    let roll = json!({"OldRC": named, "NewRC": bad, "DesiredReplicas": "two",
                      "MinimumReplicas": 1, "LeaveOld": false, "RollDelay": 0});
    app.put_raw(&format!("rolls/{bad}"), roll.to_string()).await;
    let before = app.dump().await;

    let deleted = app
        .json_request(
            "DELETE",
            &format!("/api/v1/rcs/{named}?force=true"),
            None,
            &[],
        )
        .await;
    let patched = patch(&app, &named, &json!({"replicas_desired": 0}), &[]).await;
    for response in [deleted, patched] {
        assert_eq!(
            response.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{response:?}"
        );
        let error = response.error();
        assert_eq!(error.reason, "UnreadableDocument");
        assert!(
            error
                .message
                .contains(&format!("DELETE /api/v1/rolls/{bad}")),
            "{error:?}"
        );
    }
    assert_eq!(app.dump().await, before);

    let patched = patch(&app, &other, &json!({"replicas_desired": 0}), &[]).await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    let deleted = app
        .json_request("DELETE", &format!("/api/v1/rcs/{other}"), None, &[])
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
}

/// The label naming a pod's daemon set is no label an RC may put on its pods: the DS farms
/// would take them as that daemon set's (and remove them, or clean them up as a deleted
/// daemon set's) as soon as no enabled RC claims them, a disabled RC's included. Creating
/// such an RC, patching one into it, or creating one with a roll is refused, and writes
/// nothing; a label left by another tool can still be removed.
#[tokio::test]
async fn an_rcs_pods_cannot_carry_a_daemon_set_label() {
    let app = TestApp::new().await;
    let ds = "00000000-0000-4000-8000-0000000000d5";
    let refused = |response: TestResponse, field: &str| {
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{field}");
        assert_eq!(response.cause_fields(), [field]);
    };
    let before = app.dump().await;
    let body = json!({"manifest": MANIFEST, "pod_labels": {"daemon_set_id": ds}});
    let created = app
        .json_request("POST", "/api/v1/rcs", Some(&body), &[])
        .await;
    refused(created, "pod_labels.daemon_set_id");
    assert_eq!(app.dump().await, before);

    let id = create_id(&app).await;
    let before = app.dump().await;
    let labels = json!({"pod_labels": {"daemon_set_id": ds}});
    refused(
        patch(&app, &id, &labels, &[]).await,
        "pod_labels.daemon_set_id",
    );
    let roll = json!({"old_rc_id": id, "desired_replicas": 1, "minimum_replicas": 0,
                      "new_rc": body});
    let rolled = app
        .json_request("POST", "/api/v1/rolls", Some(&roll), &[])
        .await;
    refused(rolled, "new_rc.pod_labels.daemon_set_id");
    assert_eq!(app.dump().await, before);

    let removed = patch(
        &app,
        &id,
        &json!({"pod_labels": {"daemon_set_id": null}}),
        &[],
    )
    .await;
    assert_eq!(removed.status, StatusCode::OK);
}

/// An RC is the one its key names, as the farms run it, whatever its document says: a
/// document naming another id (or none) was shown as that other RC, and a patch was written
/// to the other id's key, where its version never matched, so that it failed after 5 s as
/// "kept changing". It is shown under its key's id, and a patch writes it back so.
#[tokio::test]
async fn an_rc_whose_document_names_another_id_is_the_rc_its_key_names() {
    let app = TestApp::new().await;
    let id = uuid::Uuid::new_v4().to_string();
    let other = uuid::Uuid::new_v4().to_string();
    let key = format!("replication_controllers/{id}");
    for (named, replicas) in [(other.as_str(), 2), ("", 3)] {
        let doc = json!({"id": named, "manifest": MANIFEST, "node_selector": "",
            "pod_labels": null, "replicas_desired": 1, "disabled": false,
            "allocation_strategy": ""});
        app.put_raw(&key, &doc.to_string()).await;
        app.mirrored(&key).await;
        for read in [
            app.get(&format!("/api/v1/rcs/{id}")).await,
            app.get(&format!("/api/v1/rcs/{id}?consistent=true")).await,
        ] {
            assert_eq!(read.status, StatusCode::OK, "{read:?}");
            assert_eq!(read.json()["id"], json!(id));
        }
        for listing in ["/api/v1/rcs", "/api/v1/rcs?consistent=true"] {
            assert_eq!(item_ids(&app.get(listing).await.json()), [id.as_str()]);
        }

        let patched = patch(&app, &id, &json!({"replicas_desired": replicas}), &[]).await;
        assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
        assert_eq!(patched.json()["id"], json!(id));
        let stored = app.stored_json(&key).await.unwrap();
        assert_eq!(stored["id"], json!(id));
        assert_eq!(stored["replicas_desired"], json!(replicas));
        assert_eq!(
            app.keys("replication_controllers/").await,
            std::slice::from_ref(&key)
        );
    }
}

/// A create takes `""` as an allocation strategy (as older RCs hold) and a patch does not:
/// each one's refusal of another value lists exactly what it takes.
#[tokio::test]
async fn an_allocation_strategy_refused_is_told_what_each_write_takes() {
    let app = TestApp::new().await;
    let mut body = spec();
    body["allocation_strategy"] = json!("sometimes");
    let created = app
        .json_request("POST", "/api/v1/rcs", Some(&body), &[])
        .await;
    assert_eq!(created.unprocessable_fields(), ["allocation_strategy"]);
    assert_eq!(
        created.error().causes[0].message,
        "unknown allocation strategy \"sometimes\"; expected \"dynamic_strategy\", \
         \"static_strategy\" or \"\" (as older RCs; behaves as static)"
    );
    body["allocation_strategy"] = json!("");
    let id = create(&app, &body).await["id"].as_str().unwrap().to_owned();
    let patched = patch(&app, &id, &json!({"allocation_strategy": "sometimes"}), &[]).await;
    assert_eq!(patched.unprocessable_fields(), ["allocation_strategy"]);
    assert_eq!(
        patched.error().causes[0].message,
        "unknown allocation strategy \"sometimes\"; expected \"dynamic_strategy\" or \
         \"static_strategy\""
    );
    let unset = patch(&app, &id, &json!({"allocation_strategy": ""}), &[]).await;
    assert_eq!(unset.unprocessable_fields(), ["allocation_strategy"]);
}
