//! Events of the changes made through the API (with the token's name as actor), their
//! listing, the created and modified times beside P2's documents, and finished rolls.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use p2_apiserver::auth::Access;
use p2_apiserver::kv::{Cas, TxnOp};
use p2_apiserver::labels::LabelType;
use p2_apiserver::layout;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tempfile::TempDir;

use crate::support::api::{item_ids, TestApp, TestResponse};

const MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_1.tar.gz\n";
const NEW_MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_2.tar.gz\n";

/// An app whose tokens are `alice` (deployer, token `alice-token`), `viewer`
/// (`viewer-token`) and `agent1` (agent, `agent1-token`).
async fn secured() -> (TestApp, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.yaml");
    let mut text = String::from("tokens:\n");
    for (name, role) in [
        ("alice", "deployer"),
        ("viewer", "viewer"),
        ("agent1", "agent"),
    ] {
        let digest = format!("{:x}", Sha256::digest(format!("{name}-token").as_bytes()));
        text += &format!("  - {{name: {name}, role: {role}, sha256: {digest}}}\n");
    }
    std::fs::write(&path, text).unwrap();
    let access = Access::new(Some(&path), Vec::new()).unwrap();
    (TestApp::secured(Arc::new(access)).await, dir)
}

const ALICE: (&str, &str) = ("authorization", "Bearer alice-token");
const VIEWER: (&str, &str) = ("authorization", "Bearer viewer-token");
const AGENT: (&str, &str) = ("authorization", "Bearer agent1-token");

fn rc_spec() -> Value {
    json!({"manifest": MANIFEST, "node_selector": "", "replicas_desired": 1, "labels": {}})
}

async fn send(
    app: &TestApp,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> TestResponse {
    let response = if method == "PATCH" {
        app.merge_patch(path, body.unwrap(), headers).await
    } else {
        app.json_request(method, path, body, headers).await
    };
    assert!(
        response.status.is_success(),
        "{method} {path}: {response:?}"
    );
    response
}

async fn events(app: &TestApp, query: &str, headers: &[(&str, &str)]) -> Vec<Value> {
    let response = app
        .json_request("GET", &format!("/api/v1/events{query}"), None, headers)
        .await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    response.json()["items"].as_array().unwrap().clone()
}

fn summary(event: &Value) -> (String, String, String) {
    let text = |field: &str| event[field].as_str().unwrap().to_owned();
    (text("actor"), text("action"), text("kind"))
}

#[tokio::test]
async fn api_changes_are_events_by_the_tokens_name_in_the_changes_transaction() {
    let (app, _dir) = secured().await;
    let rc = send(
        &app,
        "POST",
        "/api/v1/rcs",
        Some(&rc_spec()),
        &[ALICE, ("x-request-id", "req-1")],
    )
    .await
    .json();
    let rc_id = rc["id"].as_str().unwrap();
    let rc_path = format!("/api/v1/rcs/{rc_id}");
    send(
        &app,
        "PATCH",
        &rc_path,
        Some(&json!({"replicas_desired": 3})),
        &[ALICE],
    )
    .await;
    let ds = json!({"manifest": MANIFEST, "node_selector": "role=web", "cluster_name": "c", "timeout": "1m"});
    let ds = send(&app, "POST", "/api/v1/daemonsets", Some(&ds), &[ALICE])
        .await
        .json();
    let ds_path = format!("/api/v1/daemonsets/{}", ds["id"].as_str().unwrap());
    send(
        &app,
        "PATCH",
        &ds_path,
        Some(&json!({"min_health": 1})),
        &[ALICE],
    )
    .await;
    send(&app, "DELETE", &ds_path, None, &[ALICE]).await;
    send(
        &app,
        "PATCH",
        &rc_path,
        Some(&json!({"replicas_desired": 0})),
        &[ALICE],
    )
    .await;
    send(&app, "DELETE", &rc_path, None, &[ALICE]).await;

    let listed = events(&app, "", &[VIEWER]).await;
    let seen: Vec<(String, String, String)> = listed.iter().map(summary).collect();
    let alice = |action: &str, kind: &str| ("alice".to_owned(), action.to_owned(), kind.to_owned());
    assert_eq!(
        seen,
        [
            alice("deleted", "rcs"),
            alice("updated", "rcs"),
            alice("deleted", "daemonsets"),
            alice("updated", "daemonsets"),
            alice("created", "daemonsets"),
            alice("updated", "rcs"),
            alice("created", "rcs"),
        ],
        "newest first"
    );
    let created = &listed[6];
    assert_eq!(created["object_id"], rc_id);
    assert_eq!(created["request_id"], "req-1");
    assert!(created["time"].as_str().unwrap().ends_with('Z'));
    let patched = &listed[5];
    assert_eq!(
        patched["changes"],
        json!([{"field": "replicas_desired", "before": 1, "after": 3}])
    );
    assert!(
        patched["request_id"].is_string(),
        "the generated request id"
    );
    let manifest = created["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["field"] == "manifest")
        .unwrap();
    assert!(manifest["after"].as_str().unwrap().starts_with("sha256:"));
    assert!(listed[0]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["after"].is_null()));

    // P2's audit records of the daemon set name the token too.
    let audit = app.store.list("audit_logs/").await.unwrap();
    assert_eq!(audit.pairs.len(), 3);
    for pair in &audit.pairs {
        let record: Value = serde_json::from_slice(&pair.value).unwrap();
        assert_eq!(record["event_details"]["user"], "alice", "{record}");
    }
}

#[tokio::test]
async fn events_filter_by_kind_id_actor_and_time_and_page_newest_first() {
    let app = TestApp::new().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let rc = send(&app, "POST", "/api/v1/rcs", Some(&rc_spec()), &[])
            .await
            .json();
        ids.push(rc["id"].as_str().unwrap().to_owned());
    }
    let ds =
        json!({"manifest": MANIFEST, "node_selector": "", "cluster_name": "c", "timeout": "1m"});
    send(&app, "POST", "/api/v1/daemonsets", Some(&ds), &[]).await;

    let all = events(&app, "", &[]).await;
    assert_eq!(all.len(), 4);
    assert!(all.iter().all(|e| e["actor"] == "anonymous"));
    let object_ids = |events: &[Value]| -> Vec<String> {
        events
            .iter()
            .map(|e| e["object_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let rcs = events(&app, "?kind=rcs", &[]).await;
    assert_eq!(
        object_ids(&rcs),
        [ids[2].clone(), ids[1].clone(), ids[0].clone()]
    );
    assert_eq!(
        object_ids(&events(&app, &format!("?id={}", ids[1]), &[]).await),
        [ids[1].clone()]
    );
    assert_eq!(
        events(&app, "?actor=anonymous&kind=daemonsets", &[])
            .await
            .len(),
        1
    );
    assert!(events(&app, "?actor=alice", &[]).await.is_empty());

    let oldest = all[3]["time"].as_str().unwrap();
    let newest = all[0]["time"].as_str().unwrap();
    let since = events(&app, &format!("?since={}", newest.replace('+', "%2B")), &[]).await;
    assert_eq!(since.len(), 1);
    let until = events(&app, &format!("?until={oldest}"), &[]).await;
    assert!(until.is_empty(), "until is exclusive");
    assert!(events(&app, "?since=2999-01-01T00:00:00Z", &[])
        .await
        .is_empty());
    assert_eq!(
        events(&app, "?since=2000-01-01T00:00:00%2B01:00", &[])
            .await
            .len(),
        4
    );
    // Any `date-time` the document allows: before the epoch, as Go's zero time, and with
    // more fraction digits than a nanosecond's.
    assert_eq!(
        events(&app, "?since=0001-01-01T00:00:00Z", &[]).await.len(),
        4
    );
    assert!(events(&app, "?until=1969-12-31T23:59:59Z", &[])
        .await
        .is_empty());
    assert_eq!(
        events(&app, "?since=2000-01-01T00:00:00.1234567891234Z", &[])
            .await
            .len(),
        4
    );

    let first = app.get("/api/v1/events?limit=3").await.json();
    assert_eq!(item_ids(&first).len(), 3);
    let token = first["continue"].as_str().unwrap();
    let rest = app
        .get(&format!("/api/v1/events?limit=3&continue={token}"))
        .await
        .json();
    let mut paged = item_ids(&first);
    paged.extend(item_ids(&rest));
    let listed: Vec<String> = all
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(paged, listed);
    assert!(rest["continue"].is_null());

    for (query, field) in [
        ("kind=pods", "kind"),
        ("since=yesterday", "since"),
        ("until=2024-13-01T00:00:00Z", "until"),
        (
            "since=2024-05-02T00:00:00Z&until=2024-05-01T23:59:59Z",
            "until",
        ),
    ] {
        let response = app.get(&format!("/api/v1/events?{query}")).await;
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{query}");
        assert_eq!(response.unprocessable_fields(), [field], "{query}");
    }
}

/// Events have no labels, so their listing takes no `selector`: the document offers none, and
/// one sent, even empty, is a parameter the route does not take (400), as anywhere else.
#[tokio::test]
async fn the_events_listing_offers_no_selector_and_takes_none() {
    let app = TestApp::new().await;
    let doc = app.get("/openapi.json").await.json();
    let params = doc["paths"]["/api/v1/events"]["get"]["parameters"]
        .as_array()
        .expect("the listing's parameters")
        .clone();
    let names: Vec<&str> = params.iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(names.contains(&"limit"), "{names:?}");
    assert!(!names.contains(&"selector"), "{names:?}");

    for query in ["selector=a%3Db", "selector="] {
        let response = app.get(&format!("/api/v1/events?{query}")).await;
        assert_eq!(
            response.status,
            StatusCode::BAD_REQUEST,
            "{query}: {response:?}"
        );
        assert_eq!(response.cause_fields(), ["selector"], "{query}");
        let message = response.error().message;
        assert!(
            message.starts_with(
                "unknown query parameter `selector`; accepted: limit, continue, index, wait, kind"
            ),
            "{message}"
        );
    }
}

/// One object's events are found by the id in their stored bytes before any is decoded:
/// an event whose JSON escapes a character of the id (as another writer may write it) is
/// still that object's, and one whose object id only contains the id is not.
#[tokio::test]
async fn an_objects_events_are_those_naming_it_however_their_json_spells_it() {
    let app = TestApp::new().await;
    let rc = send(&app, "POST", "/api/v1/rcs", Some(&rc_spec()), &[])
        .await
        .json();
    let id = rc["id"].as_str().unwrap().to_owned();
    let event = |event_id: &str, object_id: &str| {
        format!(
            r#"{{"id":"{event_id}","time":"2026-12-05T00:00:00Z","actor":"p2-tool","action":"updated","kind":"rcs","object_id":"{object_id}","request_id":null,"changes":[]}}"#
        )
    };
    // The id's first hyphen escaped, as JSON allows (`\u002d` ends in no `-`).
    let escaped = id.replacen('-', "\\u002d", 1);
    let spelled = "01700000000000000001-00000001";
    app.put_raw(&layout::event(spelled), event(spelled, &escaped))
        .await;
    let longer = "01700000000000000002-00000002";
    app.put_raw(
        &layout::event(longer),
        event(longer, &format!("{id}-other")),
    )
    .await;

    let listed: Vec<String> = events(&app, &format!("?id={id}"), &[])
        .await
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[1], spelled, "the escaped event is the oldest");
    assert!(!listed.iter().any(|listed| listed == longer));
}

/// Creates an RC (which records its `created` event); its id.
async fn create_rc(app: &TestApp) -> String {
    let rc = send(app, "POST", "/api/v1/rcs", Some(&rc_spec()), &[]).await;
    rc.json()["id"].as_str().unwrap().to_owned()
}

/// One object's listing blocked at its index wakes at that object's events, added or
/// pruned, and not at another object's (events are keyed by time, so no prefix holds one
/// object's: the whole tree would wake it at every change anywhere).
#[tokio::test]
async fn blocking_event_listing_of_one_object_wakes_only_on_its_events() {
    let app = Arc::new(TestApp::new().await);
    let (watched, other) = (create_rc(&app).await, create_rc(&app).await);
    let held = |app: Arc<TestApp>, id: String| async move {
        let index = app.get(&format!("/api/v1/events?id={id}")).await.x_index();
        app.get_held(format!("/api/v1/events?id={id}&index={index}&wait=30s"))
            .await
    };
    let scale = |id: &str, replicas: u64| {
        let path = format!("/api/v1/rcs/{id}");
        let body = json!({"replicas_desired": replicas});
        let app = app.clone();
        async move { send(&app, "PATCH", &path, Some(&body), &[]).await }
    };

    let waiting = held(app.clone(), watched.clone()).await;
    scale(&other, 2).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    waiting.assert_held("another object's event woke the listing");
    scale(&watched, 3).await;
    let answer = waiting
        .woken("the object's own event did not wake the listing")
        .await;
    let items = answer.json()["items"].clone();
    assert_eq!(items.as_array().unwrap().len(), 2, "{items}");
    assert_eq!(items[0]["action"], "updated");

    // Pruned (as the retention farm deletes events): it wakes too.
    let waiting = held(app.clone(), watched.clone()).await;
    let oldest = items[1]["id"].as_str().unwrap();
    app.store
        .txn(&[TxnOp::Delete {
            key: layout::event(oldest),
        }])
        .await
        .unwrap();
    let answer = waiting
        .woken("a pruned event did not wake the listing")
        .await;
    assert_eq!(answer.json()["items"].as_array().unwrap().len(), 1);
}

/// An event rewritten at its key (by another writer) to name another object leaves the
/// first object's events: a listing of them blocked at an index from before the rewrite
/// answers at once without it, as does one held when the rewrite comes, and the event is
/// the other object's.
#[tokio::test]
async fn blocking_event_listing_of_one_object_wakes_when_its_event_is_rewritten_to_another() {
    let app = Arc::new(TestApp::new().await);
    let (watched, other) = (create_rc(&app).await, create_rc(&app).await);
    let path = format!("/api/v1/events?id={watched}");
    // Rewrites the watched object's newest event to name the other object, behind the
    // server's back; that event's id.
    let move_newest = |listing: TestResponse| {
        let app = app.clone();
        let other = other.clone();
        async move {
            let items = listing.json()["items"].clone();
            assert_eq!(items.as_array().unwrap().len(), 1, "{items}");
            let event_id = items[0]["id"].as_str().unwrap().to_owned();
            let key = layout::event(&event_id);
            let mut rewritten = app.stored_json(&key).await.unwrap();
            rewritten["object_id"] = json!(other);
            app.put_json(&key, &rewritten).await;
            event_id
        }
    };

    // Rewritten before the read is sent.
    let listing = app.get(&path).await;
    let index = listing.x_index();
    let moved = move_newest(listing).await;
    let blocking = format!("{path}&index={index}&wait=30s");
    let answer = tokio::time::timeout(Duration::from_secs(5), app.get(&blocking))
        .await
        .expect("an event rewritten to name another object since the read's index did not answer it at once");
    assert_eq!(answer.json()["items"], json!([]), "{answer:?}");
    assert!(answer.x_index() > index, "{answer:?}");

    // Rewritten while the read is held.
    send(
        &app,
        "PATCH",
        &format!("/api/v1/rcs/{watched}"),
        Some(&json!({"replicas_desired": 2})),
        &[],
    )
    .await;
    let listing = app.get(&path).await;
    let held = app
        .get_held(format!("{path}&index={}&wait=30s", listing.x_index()))
        .await;
    let moved_while_held = move_newest(listing).await;
    let answer = held
        .woken("an event rewritten to name another object did not wake the listing")
        .await;
    assert_eq!(answer.json()["items"], json!([]), "{answer:?}");

    let others = events(&app, &format!("?id={other}"), &[]).await;
    let others: Vec<&str> = others.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(others.len(), 3, "{others:?}");
    for moved in [moved, moved_while_held] {
        assert!(others.contains(&moved.as_str()), "{others:?}");
    }
}

#[tokio::test]
async fn times_are_shown_updated_kept_out_of_p2s_documents_and_removed_with_the_object() {
    let app = TestApp::new().await;
    let rc = send(&app, "POST", "/api/v1/rcs", Some(&rc_spec()), &[])
        .await
        .json();
    let id = rc["id"].as_str().unwrap();
    let (created, modified) = (
        rc["created"].as_str().unwrap(),
        rc["modified"].as_str().unwrap(),
    );
    assert_eq!(created, modified);
    let path = format!("/api/v1/rcs/{id}");
    let patched = send(
        &app,
        "PATCH",
        &path,
        Some(&json!({"replicas_desired": 0})),
        &[],
    )
    .await
    .json();
    assert_eq!(patched["created"], created);
    assert!(patched["modified"].as_str().unwrap() > modified);
    for read in [
        app.get(&path).await.json(),
        app.get(&format!("{path}?consistent=true")).await.json(),
    ] {
        assert_eq!(read["modified"], patched["modified"]);
    }
    let listed = app.get("/api/v1/rcs").await.json();
    assert_eq!(listed["items"][0]["created"], created);

    // P2 rewrites its documents without unknown fields, so nothing is added to them.
    let stored = app
        .stored_json(&format!("replication_controllers/{id}"))
        .await
        .unwrap();
    for field in ["created", "modified"] {
        assert!(stored.get(field).is_none(), "{stored}");
    }
    let meta = format!("p2-apiserver/meta/rcs/{id}");
    assert!(app.stored(&meta).await.is_some());
    send(&app, "DELETE", &path, None, &[]).await;
    assert!(
        app.stored(&meta).await.is_none(),
        "the times go with the RC"
    );

    let ds =
        json!({"manifest": MANIFEST, "node_selector": "", "cluster_name": "c", "timeout": "1m"});
    let ds = send(&app, "POST", "/api/v1/daemonsets", Some(&ds), &[])
        .await
        .json();
    let ds_id = ds["id"].as_str().unwrap();
    assert!(ds["created"].is_string());
    let ds_path = format!("/api/v1/daemonsets/{ds_id}");
    let patched = send(
        &app,
        "PATCH",
        &ds_path,
        Some(&json!({"disabled": true})),
        &[],
    )
    .await
    .json();
    assert_eq!(patched["created"], ds["created"]);
    assert!(patched["modified"].as_str().unwrap() > ds["modified"].as_str().unwrap());
    let stored = app
        .stored_json(&format!("daemon_sets/{ds_id}"))
        .await
        .unwrap();
    assert!(stored.get("created").is_none() && stored.get("modified").is_none());
    send(&app, "DELETE", &ds_path, None, &[]).await;
    assert!(app
        .stored(&format!("p2-apiserver/meta/daemon_sets/{ds_id}"))
        .await
        .is_none());

    // An RC another tool created has no known times.
    let foreign = uuid::Uuid::new_v4().to_string();
    let doc = json!({"id": foreign, "manifest": MANIFEST, "node_selector": "",
                     "pod_labels": null, "replicas_desired": 0, "disabled": false,
                     "allocation_strategy": ""});
    app.put_json(&format!("replication_controllers/{foreign}"), &doc)
        .await;
    app.mirrored(&format!("replication_controllers/{foreign}"))
        .await;
    let read = app.get(&format!("/api/v1/rcs/{foreign}")).await.json();
    assert!(
        read["created"].is_null() && read["modified"].is_null(),
        "{read}"
    );
}

#[tokio::test]
async fn a_cancelled_roll_stays_readable_as_finished() {
    let app = TestApp::new().await;
    let old = send(&app, "POST", "/api/v1/rcs", Some(&rc_spec()), &[])
        .await
        .json();
    let roll = json!({"old_rc_id": old["id"], "new_rc": {"manifest": NEW_MANIFEST},
                      "desired_replicas": 1, "minimum_replicas": 0, "labels": {"team": "edge"}});
    let roll = send(&app, "POST", "/api/v1/rolls", Some(&roll), &[])
        .await
        .json();
    let id = roll["id"].as_str().unwrap();
    assert!(roll["created"].is_string());
    assert!(roll["outcome"].is_null() && roll["ended"].is_null());
    let roll_doc = app.stored_json(&format!("rolls/{id}")).await.unwrap();
    assert!(roll_doc.get("created").is_none());

    let path = format!("/api/v1/rolls/{id}");
    send(&app, "DELETE", &path, None, &[]).await;
    assert!(app
        .stored(&format!("p2-apiserver/meta/rolls/{id}"))
        .await
        .is_none());
    let done = app.get(&path).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    let done = done.json();
    assert_eq!(done["outcome"], "cancelled");
    assert_eq!(done["created"], roll["created"]);
    assert!(done["ended"].as_str().unwrap() >= roll["created"].as_str().unwrap());
    assert_eq!(done["labels"]["team"], "edge");
    assert_eq!(done["progress"]["old"]["desired"], 1);
    assert_eq!(done["old_rc_id"], old["id"]);

    let ids = |query: &str| {
        let app = &app;
        let query = query.to_owned();
        async move { item_ids(&app.get(&format!("/api/v1/rolls{query}")).await.json()) }
    };
    assert!(ids("").await.is_empty());
    assert!(ids("?state=active").await.is_empty());
    assert_eq!(ids("?state=finished").await, [id]);
    assert_eq!(ids("?state=all").await, [id]);
    let bad = app.get("/api/v1/rolls?state=done").await;
    assert_eq!(bad.unprocessable_fields(), ["state"]);

    let cancelled = events(&app, "?kind=rolls", &[]).await;
    let actions: Vec<&str> = cancelled
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["cancelled", "created"]);
}

/// Each event's action, kind, id and changes as `field: before -> after`, oldest first.
fn changes(events: &[Value]) -> Vec<(String, String, String, Vec<String>)> {
    let text = |event: &Value, field: &str| event[field].as_str().unwrap().to_owned();
    events
        .iter()
        .rev()
        .map(|event| {
            let changes = event["changes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    format!(
                        "{}: {} -> {}",
                        c["field"].as_str().unwrap(),
                        c["before"],
                        c["after"]
                    )
                })
                .collect();
            (
                text(event, "action"),
                text(event, "kind"),
                text(event, "object_id"),
                changes,
            )
        })
        .collect()
}

fn change(
    action: &str,
    kind: &str,
    id: &str,
    changes: &[&str],
) -> (String, String, String, Vec<String>) {
    let changes = changes.iter().map(|c| c.to_string()).collect();
    (action.to_owned(), kind.to_owned(), id.to_owned(), changes)
}

#[tokio::test]
async fn label_writes_through_both_label_apis_are_events_and_unchanged_sets_are_not() {
    let (app, _dir) = secured().await;
    let v1 = "/api/v1/labels/pod/node1%2Fhello";
    let set = json!({"labels": {"app": "hello", "tier": "web"}});
    send(
        &app,
        "PUT",
        v1,
        Some(&set),
        &[ALICE, ("x-request-id", "req-9")],
    )
    .await;
    send(&app, "PUT", v1, Some(&set), &[ALICE]).await;
    let patch = json!({"labels": {"tier": null, "zone": "a"}});
    send(&app, "PATCH", v1, Some(&patch), &[ALICE]).await;
    let p2 = "/api/labels/node/node1";
    send(
        &app,
        "PUT",
        p2,
        Some(&json!({"values": {"role": "web"}})),
        &[ALICE],
    )
    .await;
    send(
        &app,
        "PUT",
        &format!("{p2}/rack"),
        Some(&json!({"value": "r1"})),
        &[ALICE],
    )
    .await;
    send(&app, "DELETE", &format!("{p2}/role"), None, &[ALICE]).await;
    send(&app, "DELETE", p2, None, &[ALICE]).await;
    send(&app, "DELETE", p2, None, &[ALICE]).await;
    send(&app, "DELETE", v1, None, &[ALICE]).await;

    let listed = events(&app, "", &[VIEWER]).await;
    assert!(listed.iter().all(|e| e["actor"] == "alice"), "{listed:?}");
    assert_eq!(listed.last().unwrap()["request_id"], "req-9");
    let pod = "pod/node1/hello";
    assert_eq!(
        changes(&listed),
        [
            change(
                "created",
                "labels",
                pod,
                &[r#"app: null -> "hello""#, r#"tier: null -> "web""#]
            ),
            change(
                "updated",
                "labels",
                pod,
                &[r#"tier: "web" -> null"#, r#"zone: null -> "a""#]
            ),
            change("created", "nodes", "node1", &[r#"role: null -> "web""#]),
            change("updated", "nodes", "node1", &[r#"rack: null -> "r1""#]),
            change("updated", "nodes", "node1", &[r#"role: "web" -> null"#]),
            change("deleted", "nodes", "node1", &[r#"rack: "r1" -> null"#]),
            change(
                "deleted",
                "labels",
                pod,
                &[r#"app: "hello" -> null"#, r#"zone: "a" -> null"#]
            ),
        ]
    );
    assert_eq!(
        events(&app, "?kind=nodes&id=node1", &[VIEWER]).await.len(),
        4
    );
    assert!(app.keys("p2-apiserver/meta/").await.is_empty());
}

#[tokio::test]
async fn agent_reports_are_events_when_what_they_say_changes() {
    let (app, _dir) = secured().await;
    let yaml = [("content-type", "application/yaml"), AGENT];
    let reality = "/api/v1/reality/node1/hello";
    for manifest in [MANIFEST, MANIFEST, NEW_MANIFEST] {
        let put = app
            .send_raw("PUT", reality, &yaml, manifest.to_owned())
            .await;
        assert_eq!(put.status, StatusCode::NO_CONTENT, "{put:?}");
    }
    for _ in 0..2 {
        send(&app, "DELETE", reality, None, &[AGENT]).await;
    }
    let health = "/api/v1/health/hello/node1";
    for status in ["passing", "passing", "critical"] {
        send(
            &app,
            "PUT",
            health,
            Some(&json!({"status": status})),
            &[AGENT],
        )
        .await;
    }
    for _ in 0..2 {
        send(&app, "DELETE", health, None, &[AGENT]).await;
    }

    let listed = events(&app, "", &[VIEWER]).await;
    assert!(listed.iter().all(|e| e["actor"] == "agent1"), "{listed:?}");
    let sha = |manifest: &str| {
        let parsed = p2_apiserver::model::Manifest::parse(manifest).unwrap();
        format!("\"sha256:{}\"", parsed.sha())
    };
    let (old, new) = (sha(MANIFEST), sha(NEW_MANIFEST));
    assert_eq!(
        changes(&listed),
        [
            change(
                "created",
                "reality",
                "node1/hello",
                &[&format!("manifest: null -> {old}")]
            ),
            change(
                "updated",
                "reality",
                "node1/hello",
                &[&format!("manifest: {old} -> {new}")]
            ),
            change(
                "deleted",
                "reality",
                "node1/hello",
                &[&format!("manifest: {new} -> null")]
            ),
            change(
                "created",
                "health",
                "hello/node1",
                &[r#"status: null -> "passing""#]
            ),
            change(
                "updated",
                "health",
                "hello/node1",
                &[r#"status: "passing" -> "critical""#]
            ),
            change(
                "deleted",
                "health",
                "hello/node1",
                &[r#"status: "critical" -> null"#]
            ),
        ]
    );
    let response = app
        .json_request("GET", "/api/v1/events?kind=pods", None, &[VIEWER])
        .await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
}

/// The events the store holds (not a mirror's view of them), oldest first.
async fn stored_events(app: &TestApp) -> Vec<Value> {
    let listing = app
        .store
        .list(layout::EVENTS)
        .await
        .expect("list the events");
    listing
        .pairs
        .iter()
        .map(|pair| serde_json::from_slice(&pair.value).expect("an event"))
        .collect()
}

/// Two servers on one store, as the README documents. A report removed through one is gone
/// from the store while the other's mirror, whose watch has not delivered the removal yet,
/// still shows it: a removal through the other then removes nothing, and must record no
/// second `deleted` event for a change that did not happen.
#[tokio::test]
async fn removing_a_report_another_server_already_removed_is_no_event() {
    let first = TestApp::new().await;
    let (second, counting) = first.beside_counted().await;
    let health = "/api/v1/health/hello/node1";
    send(
        &first,
        "PUT",
        health,
        Some(&json!({"status": "passing"})),
        &[],
    )
    .await;
    let reality = "/api/v1/reality/node1/hello";
    let yaml = [("content-type", "application/yaml")];
    let put = first
        .send_raw("PUT", reality, &yaml, MANIFEST.to_owned())
        .await;
    assert_eq!(put.status, StatusCode::NO_CONTENT, "{put:?}");
    second.mirrored("health/hello/node1").await;
    second.mirrored("reality/node1/hello").await;

    // The second server's mirror stops hearing of changes, as when its watch lags.
    counting.fail_watches(true);
    for path in [health, reality] {
        send(&first, "DELETE", path, None, &[]).await;
        send(&second, "DELETE", path, None, &[]).await;
    }
    assert!(first.stored("health/hello/node1").await.is_none());
    assert!(first.stored("reality/node1/hello").await.is_none());

    let deleted: Vec<(String, String)> = stored_events(&first)
        .await
        .iter()
        .filter(|e| e["action"] == "deleted")
        .map(|e| {
            let text = |field: &str| e[field].as_str().unwrap().to_owned();
            (text("kind"), text("object_id"))
        })
        .collect();
    assert_eq!(
        deleted,
        [
            ("health".to_owned(), "hello/node1".to_owned()),
            ("reality".to_owned(), "node1/hello".to_owned()),
        ],
        "each report was removed once"
    );
}

/// Emptying an object's labels reads them and then deletes them at the index read. Another
/// writer (a second server, or one of P2's tools) that empties them in between leaves
/// nothing to delete: the delete must then record no `deleted` event for a change this
/// server did not make (a delete-cas of an absent key succeeds, in Consul as here).
#[tokio::test]
async fn emptying_labels_another_writer_emptied_meanwhile_is_no_event() {
    let (app, counting) = TestApp::counted().await;
    let path = "/api/v1/labels/node/node1";
    let set = app
        .json_request("PUT", path, Some(&json!({"labels": {"pool": "web"}})), &[])
        .await;
    assert_eq!(set.status, StatusCode::OK, "{set:?}");
    let key = layout::labels(LabelType::Node, "node1");
    let stored = app.store.get(&key).await.unwrap().expect("the labels");

    counting.after_next_get_of(
        &key,
        vec![TxnOp::DeleteCas {
            key: key.clone(),
            index: stored.modify_index,
        }],
    );
    let delete = app.json_request("DELETE", path, None, &[]).await;
    assert_eq!(delete.status, StatusCode::NO_CONTENT, "{delete:?}");

    assert!(app.store.get(&key).await.unwrap().is_none());
    let actions: Vec<Value> = stored_events(&app)
        .await
        .iter()
        .filter(|e| e["kind"] == "nodes" && e["object_id"] == "node1")
        .map(|e| e["action"].clone())
        .collect();
    assert_eq!(
        actions,
        [json!("created")],
        "the labels were emptied elsewhere"
    );
}

/// Labels stored that cannot be decoded (written by another tool) read as a 500 saying that
/// DELETE removes them and PUT replaces them. Either changes what is stored, and is an event
/// as any label write is, of a set that was there before: as the removal of an unreadable RC
/// or the replacement of an unreadable report is.
#[tokio::test]
async fn removing_or_replacing_unreadable_labels_is_an_event() {
    let app = TestApp::new().await;
    for node in ["node1", "node2"] {
        let key = layout::labels(LabelType::Node, node);
        let stored = app.store.put(&key, b"not a label set", Cas::Any).await;
        stored.expect("an unreadable label set");
    }
    let delete = app
        .json_request("DELETE", "/api/v1/labels/node/node1", None, &[])
        .await;
    assert_eq!(delete.status, StatusCode::NO_CONTENT, "{delete:?}");
    let body = json!({"labels": {"pool": "web"}});
    let put = app
        .json_request("PUT", "/api/v1/labels/node/node2", Some(&body), &[])
        .await;
    assert_eq!(put.status, StatusCode::OK, "{put:?}");
    assert!(app
        .stored(&layout::labels(LabelType::Node, "node1"))
        .await
        .is_none());

    let mut recorded = stored_events(&app).await;
    recorded.reverse();
    assert_eq!(
        changes(&recorded),
        [
            change("deleted", "nodes", "node1", &[]),
            change("updated", "nodes", "node2", &[r#"pool: null -> "web""#]),
        ]
    );
}

/// A document stored that cannot be decoded (written by another tool) can still be deleted,
/// whichever kind it is, and its removal is an event like any deletion's: a `deleted` one,
/// with no field to show, since none could be read.
#[tokio::test]
async fn deleting_an_unreadable_document_is_an_event_of_every_kind() {
    let app = TestApp::new().await;
    let ids: Vec<(&str, String, String)> = [
        ("rcs", layout::RCS),
        ("daemonsets", layout::DAEMON_SETS),
        ("rolls", layout::ROLLS),
    ]
    .into_iter()
    .map(|(kind, tree)| {
        let id = uuid::Uuid::new_v4().to_string();
        (kind, id.clone(), format!("{tree}{id}"))
    })
    .collect();
    for (kind, id, key) in &ids {
        app.put_raw(key, b"not a document").await;
        let path = format!("/api/v1/{kind}/{id}");
        let deleted = app.json_request("DELETE", &path, None, &[]).await;
        assert_eq!(
            deleted.status,
            StatusCode::NO_CONTENT,
            "{path}: {deleted:?}"
        );
        assert!(app.stored(key).await.is_none(), "{key}");
    }

    let mut recorded = stored_events(&app).await;
    recorded.reverse();
    let expected: Vec<_> = ids
        .iter()
        .map(|(kind, id, _)| change("deleted", kind, id, &[]))
        .collect();
    assert_eq!(changes(&recorded), expected);
}

/// A roll over two existing RCs with `new_rc_labels` merges them into the new RC's labels in
/// its transaction: a label write like any other, so an event of the new RC's labels, as the
/// label APIs record one.
#[tokio::test]
async fn new_rc_labels_merged_into_an_existing_rc_by_a_roll_are_an_event() {
    let app = TestApp::new().await;
    let old = send(&app, "POST", "/api/v1/rcs", Some(&rc_spec()), &[])
        .await
        .json();
    let mut spec = rc_spec();
    spec["manifest"] = json!(NEW_MANIFEST);
    spec["replicas_desired"] = json!(0);
    let new = send(&app, "POST", "/api/v1/rcs", Some(&spec), &[])
        .await
        .json();
    let new_id = new["id"].as_str().unwrap();
    let roll = json!({"old_rc_id": old["id"], "new_rc_id": new_id,
                      "desired_replicas": 1, "minimum_replicas": 0,
                      "new_rc_labels": {"team": "edge"}});
    send(&app, "POST", "/api/v1/rolls", Some(&roll), &[]).await;
    let labels = app
        .stored_json(&format!("labels/replication_controller/{new_id}"))
        .await;
    assert_eq!(labels, Some(json!({"pod_id": "hello", "team": "edge"})));

    let object_id = format!("replication_controller/{new_id}");
    let listed = events(&app, &format!("?kind=labels&id={object_id}"), &[]).await;
    assert_eq!(
        changes(&listed),
        [change(
            "updated",
            "labels",
            &object_id,
            &[r#"team: null -> "edge""#]
        )],
        "{listed:?}"
    );
}

/// A time that is not one is named as every other query value is: what the parameter takes,
/// and what was sent.
#[tokio::test]
async fn a_time_that_is_not_one_is_named_with_what_was_sent() {
    let app = TestApp::new().await;
    for field in ["since", "until"] {
        let response = app.get(&format!("/api/v1/events?{field}=yesterday")).await;
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{field}");
        assert_eq!(
            response.error().causes[0].message,
            "must be an RFC 3339 time such as 2024-05-01T12:00:00Z, got \"yesterday\"",
            "{field}"
        );
    }
}

/// A PATCH that only reformats the manifest (a comment, another layout) keeps its SHA, but
/// the stored text changes: its event lists the manifest as changed, before and after the
/// same SHA, rather than an `updated` event naming no change.
#[tokio::test]
async fn a_manifest_reformatted_under_the_same_sha_is_listed_as_changed() {
    let app = TestApp::new().await;
    let id = create_rc(&app).await;
    let path = format!("/api/v1/rcs/{id}");
    let reformatted = format!("# reformatted\n{}", MANIFEST.replace("  ", "    "));
    let patched = send(
        &app,
        "PATCH",
        &path,
        Some(&json!({"manifest": reformatted})),
        &[],
    )
    .await
    .json();
    assert_eq!(patched["manifest"], reformatted.as_str());
    let listed = events(&app, &format!("?kind=rcs&id={id}"), &[]).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    let updated = &listed[0];
    assert_eq!(updated["action"], "updated");
    // The creation's event states the manifest by its SHA.
    let created = listed[1]["changes"].as_array().unwrap();
    let stated = &created.iter().find(|c| c["field"] == "manifest").unwrap()["after"];
    assert_eq!(
        updated["changes"],
        json!([{"field": "manifest", "before": stated, "after": stated}]),
        "{updated}"
    );
}
