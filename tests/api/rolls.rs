//! The rolling-update API: the three creation forms, P2's preconditions, validation,
//! progress, listing, cancelling, and compatibility with rolls written by P2.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use crate::support::api::{assert_operations, item_ids, labels, TestApp, TestResponse};
use axum::http::StatusCode;
use p2_apiserver::farms::roll;
use p2_apiserver::farms::world::Trees;
use p2_apiserver::kv::{Cas, SessionSpec, TxnOp};
use p2_apiserver::labels::LabelType;
use p2_apiserver::layout;
use p2_apiserver::model::event::Actor;
use p2_apiserver::model::{HealthRecord, HealthState, StoredRc};
use p2_apiserver::state::{Mirror, MirrorConfig};
use p2_apiserver::store::rcs::RcStore;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_2.tar.gz\n";

async fn post(app: &TestApp, body: Value) -> TestResponse {
    app.json_request("POST", "/api/v1/rolls", Some(&body), &[])
        .await
}

async fn delete(app: &TestApp, id: &str, if_match: Option<&str>) -> TestResponse {
    let headers: Vec<_> = if_match
        .map(|etag| ("if-match", etag))
        .into_iter()
        .collect();
    app.json_request("DELETE", &format!("/api/v1/rolls/{id}"), None, &headers)
        .await
}

/// The manifest of the RCs [`arrange_rc`] stores.
const ARRANGED_MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_1.tar.gz\n";

/// Stores an RC for pod `hello` behind the API's back, as P2 would have, and waits until
/// the mirror has it.
async fn arrange_rc(app: &TestApp, replicas: i64, rc_labels: &[(&str, &str)]) -> String {
    arrange_rc_of(app, ARRANGED_MANIFEST, replicas, rc_labels).await
}

/// Like [`arrange_rc`], with `manifest`.
async fn arrange_rc_of(
    app: &TestApp,
    manifest: &str,
    replicas: i64,
    rc_labels: &[(&str, &str)],
) -> String {
    let id = uuid::Uuid::new_v4().to_string();
    let doc = json!({
        "id": id, "manifest": manifest,
        "node_selector": "", "pod_labels": null, "replicas_desired": replicas,
        "disabled": false, "allocation_strategy": "static_strategy"
    });
    let rc = StoredRc::from_json(doc.to_string().as_bytes()).unwrap();
    RcStore::new(app.store.clone())
        .create(rc, &labels(rc_labels), &Actor::farm("test", "arranged"))
        .await
        .unwrap()
        .unwrap();
    app.mirrored(&format!("replication_controllers/{id}")).await;
    id
}

/// A refused or finished creation leaves no lock behind (its session is gone).
async fn assert_no_locks(app: &TestApp) {
    assert_eq!(app.keys("lock/").await, Vec::<String>::new());
}

fn p2_roll_json(
    old: &str,
    new: &str,
    desired: i64,
    minimum: i64,
    leave_old: bool,
    delay_ns: u64,
) -> String {
    format!(
        r#"{{"OldRC":"{old}","NewRC":"{new}","DesiredReplicas":{desired},"MinimumReplicas":{minimum},"LeaveOld":{leave_old},"RollDelay":{delay_ns}}}"#
    )
}

#[tokio::test]
async fn form_a_rolls_between_existing_rcs_in_one_transaction() {
    let app = TestApp::new().await;
    let old = arrange_rc(&app, 3, &[("pod_id", "hello")]).await;
    let new = arrange_rc(&app, 0, &[("pod_id", "hello"), ("stage", "canary")]).await;

    let response = post(
        &app,
        json!({
            "old_rc_id": old, "new_rc_id": new, "desired_replicas": 3, "minimum_replicas": 2,
            "roll_delay": "30s", "labels": {"deployer": "alice"},
            "new_rc_labels": {"release": "r2"}
        }),
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    let body = response.json();
    assert_eq!(body["id"], json!(new));
    assert_eq!(body["old_rc_id"], json!(old));
    assert_eq!(body["new_rc_id"], json!(new));
    assert_eq!(body["desired_replicas"], 3);
    assert_eq!(body["minimum_replicas"], 2);
    assert_eq!(body["leave_old"], false);
    assert_eq!(body["roll_delay"], "30s");
    assert_eq!(body["labels"], json!({"deployer": "alice"}));
    let version = body["resource_version"].as_str().unwrap();
    response.assert_created(&format!("/api/v1/rolls/{new}"), version);
    assert_eq!(
        body["progress"],
        json!({"old": {"desired": 3, "current": 0, "real": 0, "healthy": 0, "unknown": 0, "unhealthy": 0},
               "new": {"desired": 0, "current": 0, "real": 0, "healthy": 0, "unknown": 0, "unhealthy": 0}})
    );

    assert_eq!(
        app.stored_text(&format!("rolls/{new}")).await.unwrap(),
        p2_roll_json(&old, &new, 3, 2, false, 30_000_000_000)
    );
    assert_eq!(
        app.stored_json(&format!("labels/rolls/{new}"))
            .await
            .unwrap(),
        json!({"deployer": "alice"})
    );
    assert_eq!(
        app.stored_json(&format!("labels/replication_controller/{new}"))
            .await
            .unwrap(),
        json!({"pod_id": "hello", "release": "r2", "stage": "canary"})
    );
    let roll = app.stored(&format!("rolls/{new}")).await.unwrap();
    let roll_labels = app.stored(&format!("labels/rolls/{new}")).await.unwrap();
    let rc_labels = app
        .stored(&format!("labels/replication_controller/{new}"))
        .await
        .unwrap();
    assert_eq!(roll.modify_index.to_string(), version);
    assert_eq!(
        roll_labels.modify_index, roll.modify_index,
        "one transaction"
    );
    assert_eq!(rc_labels.modify_index, roll.modify_index, "one transaction");
    assert_eq!(app.keys("replication_controllers/").await.len(), 2);
    assert_no_locks(&app).await;
}

#[tokio::test]
async fn form_b_creates_the_new_rc_with_the_roll() {
    let app = TestApp::new().await;
    let old = arrange_rc(&app, 3, &[("pod_id", "hello")]).await;

    let response = post(
        &app,
        json!({
            "old_rc_id": old,
            "new_rc": {"manifest": MANIFEST, "node_selector": "role = web",
                       "labels": {"stage": "canary"}, "cluster_name": "production",
                       "allocation_strategy": "dynamic_strategy"},
            "desired_replicas": 3, "minimum_replicas": 0, "leave_old": true,
            "new_rc_labels": {"release": "r2"}
        }),
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    let body = response.json();
    let new = body["id"].as_str().unwrap().to_owned();
    assert!(uuid::Uuid::parse_str(&new).is_ok());
    assert_ne!(new, old);
    assert_eq!(body["new_rc_id"], json!(new));
    assert_eq!(body["roll_delay"], "0s");
    assert_eq!(body["progress"]["new"]["desired"], 0);

    assert_eq!(
        app.stored_text(&format!("rolls/{new}")).await.unwrap(),
        p2_roll_json(&old, &new, 3, 0, true, 0)
    );
    assert_eq!(
        app.stored_text(&format!("replication_controllers/{new}"))
            .await
            .unwrap(),
        format!(
            r#"{{"id":"{new}","manifest":{},"node_selector":"role=web","pod_labels":{{"cluster_name":"production"}},"replicas_desired":0,"disabled":false,"allocation_strategy":"dynamic_strategy"}}"#,
            json!(MANIFEST)
        ),
        "P2's RC format, field order included"
    );
    assert_eq!(
        app.stored_json(&format!("labels/replication_controller/{new}"))
            .await
            .unwrap(),
        json!({"pod_id": "hello", "release": "r2", "stage": "canary"})
    );
    // No roll labels were asked for, so none are written.
    assert!(app.stored(&format!("labels/rolls/{new}")).await.is_none());
    let roll = app.stored(&format!("rolls/{new}")).await.unwrap();
    for key in [
        format!("replication_controllers/{new}"),
        format!("labels/replication_controller/{new}"),
    ] {
        assert_eq!(
            app.stored(&key).await.unwrap().modify_index,
            roll.modify_index,
            "{key} written in the roll's transaction"
        );
    }
    assert_no_locks(&app).await;
}

#[tokio::test]
async fn form_c_uses_the_one_matching_rc() {
    let app = TestApp::new().await;
    let old = arrange_rc(&app, 2, &[("pod_id", "hello"), ("cluster", "a")]).await;
    arrange_rc(&app, 2, &[("pod_id", "hello"), ("cluster", "b")]).await;

    let response = post(
        &app,
        json!({
            "old_rc_selector": "pod_id=hello,cluster=a",
            "new_rc": {"manifest": MANIFEST},
            "desired_replicas": 2, "minimum_replicas": 1,
            "new_rc_labels": {"cluster": "a"}
        }),
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    let body = response.json();
    assert_eq!(body["old_rc_id"], json!(old));
    assert_eq!(body["progress"]["old"]["desired"], 2);
    assert_eq!(app.keys("replication_controllers/").await.len(), 3);
}

#[tokio::test]
async fn form_c_creates_a_stand_in_old_rc_when_nothing_matches() {
    let app = TestApp::new().await;
    let response = post(
        &app,
        json!({
            "old_rc_selector": "pod_id=hello,cluster=a",
            "new_rc": {"manifest": MANIFEST, "labels": {"cluster": "a"}},
            "desired_replicas": 2, "minimum_replicas": 1
        }),
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    let body = response.json();
    let old = body["old_rc_id"].as_str().unwrap().to_owned();
    let new = body["new_rc_id"].as_str().unwrap().to_owned();
    assert_ne!(old, new);
    assert_eq!(
        body["progress"]["old"],
        json!({"desired": 0, "current": 0, "real": 0, "healthy": 0, "unknown": 0, "unhealthy": 0})
    );

    let old_rc = app
        .stored_json(&format!("replication_controllers/{old}"))
        .await
        .unwrap();
    let mut new_rc = app
        .stored_json(&format!("replication_controllers/{new}"))
        .await
        .unwrap();
    assert_eq!(old_rc["id"], json!(old));
    assert_eq!(old_rc["replicas_desired"], 0);
    new_rc["id"] = json!(old);
    assert_eq!(old_rc, new_rc, "the stand-in has the new RC's spec");
    let rc_labels = json!({"cluster": "a", "pod_id": "hello"});
    for id in [&old, &new] {
        assert_eq!(
            app.stored_json(&format!("labels/replication_controller/{id}"))
                .await
                .unwrap(),
            rc_labels
        );
    }
    assert_eq!(
        app.stored_text(&format!("rolls/{new}")).await.unwrap(),
        p2_roll_json(&old, &new, 2, 1, false, 0)
    );
    let index = app
        .stored(&format!("rolls/{new}"))
        .await
        .unwrap()
        .modify_index;
    for key in [
        format!("replication_controllers/{old}"),
        format!("labels/replication_controller/{old}"),
        format!("replication_controllers/{new}"),
    ] {
        assert_eq!(app.stored(&key).await.unwrap().modify_index, index, "{key}");
    }

    // As in P2, the stand-in and the new RC both match now, so the selector is ambiguous.
    let again = post(
        &app,
        json!({
            "old_rc_selector": "cluster=a",
            "new_rc": {"manifest": MANIFEST},
            "desired_replicas": 2, "minimum_replicas": 1
        }),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{again:?}");
    let message = again.error().message;
    assert!(
        message.contains(&old) && message.contains(&new),
        "{message}"
    );
    assert_no_locks(&app).await;
}

/// Everything a refused creation must not have written.
async fn assert_nothing_written(app: &TestApp, rcs_before: usize) {
    assert_eq!(app.keys("rolls/").await, Vec::<String>::new());
    assert_eq!(app.keys("labels/rolls/").await, Vec::<String>::new());
    assert_eq!(app.keys("replication_controllers/").await.len(), rcs_before);
    assert_no_locks(app).await;
}

#[tokio::test]
async fn another_roll_on_either_rc_is_409_naming_it() {
    let app = TestApp::new().await;
    let a = arrange_rc(&app, 3, &[]).await;
    let b = arrange_rc(&app, 0, &[]).await;
    let c = arrange_rc(&app, 0, &[]).await;
    let first = post(
        &app,
        json!({"old_rc_id": a, "new_rc_id": b, "desired_replicas": 3, "minimum_replicas": 1}),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");

    // Over the first roll's old RC, and over its new RC (as the old side).
    for (old, new, busy) in [(&a, &c, &a), (&b, &c, &b)] {
        let response = post(
            &app,
            json!({"old_rc_id": old, "new_rc_id": new, "desired_replicas": 1, "minimum_replicas": 0}),
        )
        .await;
        assert_eq!(response.status, StatusCode::CONFLICT, "{response:?}");
        let error = response.error();
        assert_eq!(error.reason, "Conflict");
        assert!(
            error.message.contains(&b),
            "names the roll: {}",
            error.message
        );
        assert!(error.message.contains(busy.as_str()), "{}", error.message);
    }
    // With a new RC spec too: nothing of the new RC is written.
    let response = post(
        &app,
        json!({"old_rc_id": a, "new_rc": {"manifest": MANIFEST},
               "desired_replicas": 1, "minimum_replicas": 0}),
    )
    .await;
    assert_eq!(response.status, StatusCode::CONFLICT, "{response:?}");
    assert_eq!(app.keys("rolls/").await, [format!("rolls/{b}")]);
    assert_eq!(app.keys("replication_controllers/").await.len(), 3);
    assert_no_locks(&app).await;
}

#[tokio::test]
async fn a_held_update_creation_lock_is_409() {
    let app = TestApp::new().await;
    let old = arrange_rc(&app, 3, &[]).await;
    let session = app
        .store
        .create_session(&SessionSpec::deleting(
            "RU create lock for p2-rctl",
            Duration::from_secs(15),
        ))
        .await
        .unwrap();
    let lock = layout::rc_update_creation(&old);
    assert!(app
        .store
        .acquire(&lock, b"p2-rctl", &session)
        .await
        .unwrap());

    let response = post(
        &app,
        json!({"old_rc_id": old, "new_rc": {"manifest": MANIFEST},
               "desired_replicas": 1, "minimum_replicas": 0}),
    )
    .await;
    assert_eq!(response.status, StatusCode::CONFLICT, "{response:?}");
    let message = response.error().message;
    assert!(
        message.contains(&old) && message.contains("being created"),
        "{message}"
    );
    assert_eq!(app.keys("rolls/").await, Vec::<String>::new());
    assert_eq!(app.keys("replication_controllers/").await.len(), 1);
    assert_eq!(
        app.keys("lock/").await,
        std::slice::from_ref(&lock),
        "the other holder keeps its lock"
    );

    app.store.destroy_session(&session).await.unwrap();
    let response = post(
        &app,
        json!({"old_rc_id": old, "new_rc": {"manifest": MANIFEST},
               "desired_replicas": 1, "minimum_replicas": 0}),
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
}

#[tokio::test]
async fn an_ambiguous_selector_is_409_naming_the_matches() {
    let app = TestApp::new().await;
    let one = arrange_rc(&app, 1, &[("pod_id", "hello")]).await;
    let two = arrange_rc(&app, 1, &[("pod_id", "hello")]).await;
    let response = post(
        &app,
        json!({"old_rc_selector": "pod_id=hello", "new_rc": {"manifest": MANIFEST},
               "desired_replicas": 1, "minimum_replicas": 0}),
    )
    .await;
    assert_eq!(response.status, StatusCode::CONFLICT, "{response:?}");
    let message = response.error().message;
    assert!(
        message.contains(&one) && message.contains(&two),
        "{message}"
    );
    assert_nothing_written(&app, 2).await;
}

#[tokio::test]
async fn labels_of_a_deleted_rc_do_not_make_a_match() {
    let app = TestApp::new().await;
    let live = arrange_rc(&app, 1, &[("pod_id", "hello")]).await;
    let gone = uuid::Uuid::new_v4().to_string();
    app.put_raw(
        &layout::labels(LabelType::ReplicationController, &gone),
        br#"{"pod_id":"hello"}"#,
    )
    .await;
    let response = post(
        &app,
        json!({"old_rc_selector": "pod_id=hello", "new_rc": {"manifest": MANIFEST},
               "desired_replicas": 1, "minimum_replicas": 0}),
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    assert_eq!(response.json()["old_rc_id"], json!(live));
}

#[tokio::test]
async fn leave_old_without_an_old_rc_is_422() {
    let app = TestApp::new().await;
    let response = post(
        &app,
        json!({"old_rc_selector": "pod_id=nothing", "new_rc": {"manifest": MANIFEST},
               "desired_replicas": 1, "minimum_replicas": 0, "leave_old": true}),
    )
    .await;
    assert_eq!(response.unprocessable_fields(), ["leave_old"]);
    assert_nothing_written(&app, 0).await;
}

#[tokio::test]
async fn missing_rcs_are_422_naming_the_field() {
    let app = TestApp::new().await;
    let existing = arrange_rc(&app, 1, &[]).await;
    let missing = uuid::Uuid::new_v4().to_string();
    for (body, field) in [
        (
            json!({"old_rc_id": missing, "new_rc_id": existing}),
            "old_rc_id",
        ),
        (
            json!({"old_rc_id": existing, "new_rc_id": missing}),
            "new_rc_id",
        ),
        (
            json!({"old_rc_id": missing, "new_rc": {"manifest": MANIFEST}}),
            "old_rc_id",
        ),
    ] {
        let mut body = body;
        body["desired_replicas"] = json!(1);
        body["minimum_replicas"] = json!(0);
        let response = post(&app, body).await;
        assert_eq!(response.unprocessable_fields(), [field]);
        assert!(response.error().message.contains(&missing));
    }
    assert_nothing_written(&app, 1).await;
}

/// An existing new RC's `pod_id` label is its manifest's id, as for a new RC: a roll that
/// would label it with another pod id is refused, so a selector over `pod_id` never finds an
/// RC running another pod.
#[tokio::test]
async fn new_rc_labels_cannot_give_an_existing_new_rc_another_pod_id() {
    let app = TestApp::new().await;
    let old = arrange_rc(&app, 1, &[("pod_id", "hello")]).await;
    let new = arrange_rc(&app, 0, &[("pod_id", "hello")]).await;
    let response = post(
        &app,
        json!({"old_rc_id": old, "new_rc_id": new, "desired_replicas": 1, "minimum_replicas": 0,
               "new_rc_labels": {"pod_id": "billing"}}),
    )
    .await;
    assert_eq!(response.unprocessable_fields(), ["new_rc_labels.pod_id"]);
    assert_eq!(
        app.stored_json(&format!("labels/replication_controller/{new}"))
            .await
            .unwrap(),
        json!({"pod_id": "hello"})
    );
    assert_eq!(app.keys("rolls/").await, Vec::<String>::new());
    assert_no_locks(&app).await;

    // Its own pod id may be given, as for a new RC.
    let response = post(
        &app,
        json!({"old_rc_id": old, "new_rc_id": new, "desired_replicas": 1, "minimum_replicas": 0,
               "new_rc_labels": {"pod_id": "hello"}}),
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
}

#[tokio::test]
async fn the_same_rc_on_both_sides_is_422() {
    let app = TestApp::new().await;
    let rc = arrange_rc(&app, 1, &[]).await;
    let response = post(
        &app,
        json!({"old_rc_id": rc, "new_rc_id": rc, "desired_replicas": 1, "minimum_replicas": 0}),
    )
    .await;
    assert_eq!(response.unprocessable_fields(), ["new_rc_id"]);
    assert_nothing_written(&app, 1).await;
}

#[tokio::test]
async fn validation_lists_every_bad_field_and_writes_nothing() {
    let app = TestApp::new().await;
    let response = post(
        &app,
        json!({
            "old_rc_id": "not-a-uuid",
            "desired_replicas": -1, "minimum_replicas": -2,
            "roll_delay": "soon",
            "labels": {"bad key!": "v"},
            "new_rc_labels": {"k": "bad value!"}
        }),
    )
    .await;
    let fields: BTreeSet<String> = response.unprocessable_fields().into_iter().collect();
    for expected in [
        "old_rc_id",
        "new_rc_id",
        "desired_replicas",
        "minimum_replicas",
        "roll_delay",
        "labels.bad key!",
        "new_rc_labels.k",
    ] {
        assert!(
            fields.contains(expected),
            "{expected} missing from {fields:?}"
        );
    }

    let response = post(
        &app,
        json!({
            "old_rc_id": "5A0E3B8C-6F2D-4C1E-9A57-0C8E2F4B7D11",
            "old_rc_selector": "a in (",
            "new_rc_id": uuid::Uuid::new_v4().to_string(),
            "new_rc": {"manifest": "launchables: {}\n", "replicas_desired": 2},
            "desired_replicas": 1, "minimum_replicas": 2
        }),
    )
    .await;
    let fields: BTreeSet<String> = response.unprocessable_fields().into_iter().collect();
    for expected in [
        "old_rc_id",
        "old_rc_selector",
        "new_rc",
        "new_rc.replicas_desired",
        "new_rc.manifest.id",
        "minimum_replicas",
    ] {
        assert!(
            fields.contains(expected),
            "{expected} missing from {fields:?}"
        );
    }

    let response = post(&app, json!({"old_rc_selector": "a=b"})).await;
    assert_eq!(
        response.cause_fields(),
        ["new_rc_id", "desired_replicas", "minimum_replicas"]
    );

    let response = post(
        &app,
        json!({"old_rc_selector": "a=b", "new_rc_id": uuid::Uuid::new_v4().to_string(),
               "desired_replicas": 1, "minimum_replicas": 0}),
    )
    .await;
    assert_eq!(response.cause_fields(), ["old_rc_selector"]);

    let response = post(
        &app,
        json!({"old_rc_selector": "a=b", "new_rc": {"manifest": MANIFEST},
               "new_rc_labels": {"pod_id": "other"},
               "desired_replicas": 1, "minimum_replicas": 0}),
    )
    .await;
    assert_eq!(response.cause_fields(), ["new_rc_labels.pod_id"]);

    let response = post(
        &app,
        json!({"old_rc_selector": "a=b", "new_rc": {"manifest": MANIFEST},
               "desired_replicas": 1, "minimum_replicas": 0, "surprise": true}),
    )
    .await;
    assert_eq!(
        response.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{response:?}"
    );
    assert!(response.error().message.contains("surprise"));
    assert_nothing_written(&app, 0).await;
}

async fn put_pod(app: &TestApp, node: &str, rc: &str) {
    app.put_json(
        &layout::labels(LabelType::Pod, &format!("{node}/hello")),
        &json!({"pod_id": "hello", "replication_controller_id": rc}),
    )
    .await;
}

async fn put_health(app: &TestApp, key_node: &str, node: &str, status: HealthState) {
    let record = HealthRecord::new("hello", node, status, UNIX_EPOCH + Duration::from_secs(1));
    app.put_raw(&format!("health/hello/{key_node}"), &record.to_json())
        .await;
}

/// Puts `manifest` in the pod's reality, as if its node ran it.
async fn put_reality(app: &TestApp, node: &str, manifest: &str) {
    app.put_raw(&format!("reality/{node}/hello"), manifest)
        .await;
}

#[tokio::test]
async fn progress_counts_pods_and_passing_health() {
    let app = TestApp::new().await;
    let old = arrange_rc(&app, 3, &[]).await;
    let new = arrange_rc(&app, 1, &[]).await;
    let created = post(
        &app,
        json!({"old_rc_id": old, "new_rc_id": new, "desired_replicas": 4, "minimum_replicas": 2}),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED);
    put_pod(&app, "n1", &old).await;
    put_pod(&app, "n2", &old).await;
    put_pod(&app, "n3", &old).await;
    put_pod(&app, "n4", &new).await;
    put_pod(&app, "n5", &new).await;
    for node in ["n1", "n2", "n3", "n4", "n5"] {
        put_reality(&app, node, ARRANGED_MANIFEST).await;
    }
    put_health(&app, "n1", "n1", HealthState::Passing).await;
    put_health(&app, "n2", "n2", HealthState::Critical).await;
    put_health(&app, "n3", "n3", HealthState::Warning).await;
    // Results are keyed by the record's Node field, not by the key.
    put_health(&app, "elsewhere", "n4", HealthState::Passing).await;
    put_health(&app, "n5", "n9", HealthState::Passing).await;
    // A pod of another pod id on the same node is not counted.
    app.put_json(
        "labels/pod/n6/other",
        &json!({"replication_controller_id": "x"}),
    )
    .await;

    let response = app.get(&format!("/api/v1/rolls/{new}")).await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    let body = response.json();
    assert_eq!(
        body["progress"],
        json!({"old": {"desired": 3, "current": 3, "real": 3, "healthy": 1, "unknown": 0, "unhealthy": 2},
               "new": {"desired": 1, "current": 2, "real": 2, "healthy": 1, "unknown": 1, "unhealthy": 0}})
    );
    assert_eq!(
        response.header("etag"),
        Some(format!("\"{}\"", body["resource_version"].as_str().unwrap()).as_str())
    );

    // Once an RC is gone its desired count is unknown, and so is the manifest its pods
    // should run: they still count, none as real.
    let key = format!("replication_controllers/{old}");
    app.store.delete(&key, Cas::Any).await.unwrap();
    app.mirrored(&key).await;
    let body = app.get(&format!("/api/v1/rolls/{new}")).await.json();
    assert_eq!(
        body["progress"]["old"],
        json!({"desired": null, "current": 3, "real": 0, "healthy": 0, "unknown": 0, "unhealthy": 0})
    );
}

/// Roll progress counts pods exactly as the roll farm does: a pod passing its health check
/// while its node still runs another manifest is not healthy for either (the API used to
/// count it, showing a roll healthy that the farm was still waiting on).
#[tokio::test]
async fn progress_agrees_with_the_roll_farms_count() {
    let app = TestApp::new().await;
    let old = arrange_rc(&app, 2, &[]).await;
    let new = arrange_rc_of(&app, MANIFEST, 3, &[]).await;
    let created = post(
        &app,
        json!({"old_rc_id": old, "new_rc_id": new, "desired_replicas": 5, "minimum_replicas": 2}),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let pods = [
        ("stale", Some(ARRANGED_MANIFEST), Some(HealthState::Passing)),
        ("ready", Some(MANIFEST), Some(HealthState::Passing)),
        ("silent", Some(MANIFEST), None),
        ("failing", Some(MANIFEST), Some(HealthState::Critical)),
        ("empty", None, Some(HealthState::Passing)),
    ];
    for (node, running, health) in pods {
        put_pod(&app, node, &new).await;
        if let Some(manifest) = running {
            put_reality(&app, node, manifest).await;
        }
        if let Some(state) = health {
            put_health(&app, node, node, state).await;
        }
    }
    app.put_json(
        "labels/pod/stale/other",
        &json!({"replication_controller_id": new}),
    )
    .await;

    let progress = app.get(&format!("/api/v1/rolls/{new}")).await.json()["progress"]["new"].clone();
    assert_eq!(
        progress,
        json!({"desired": 3, "current": 5, "real": 3, "healthy": 1, "unknown": 1, "unhealthy": 1})
    );

    let tasks = TaskTracker::new();
    let cancel = CancellationToken::new();
    let mirror = Mirror::new(app.store.clone(), MirrorConfig::default());
    mirror.start(&tasks, cancel.clone());
    mirror.loaded().await;
    let world = Trees::new(mirror).world().await;
    cancel.cancel();
    let rc = &world.rcs.items()[&new].value;
    let counts = roll::count(&world, &new, rc);
    assert_eq!(
        json!({"desired": counts.desired, "current": counts.pods.current,
               "real": counts.pods.real, "healthy": counts.pods.healthy,
               "unknown": counts.pods.unknown, "unhealthy": counts.pods.unhealthy}),
        progress
    );
    tasks.close();
    tasks.wait().await;
}

/// A roll's view is the same from the mirror (found through its index of pods by RC), from
/// the store, and in the listing: its own labels, not another roll's, and only the pods of
/// its two RCs, by the RC id they are labeled with, counted whether or not the RC is there.
#[tokio::test]
async fn a_roll_reads_the_same_from_the_mirror_the_store_and_the_listing() {
    let app = TestApp::new().await;
    let (old, new) = create_between_new_rcs(&app, json!({"team": "a"})).await;
    let (other_old, other_new) = create_between_new_rcs(&app, json!({"team": "b"})).await;
    for (node, rc) in [("n1", &old), ("n2", &old), ("n3", &new), ("n4", &other_old)] {
        put_pod(&app, node, rc).await;
        put_reality(&app, node, ARRANGED_MANIFEST).await;
        put_health(&app, node, node, HealthState::Passing).await;
    }
    put_pod(&app, "n5", &other_new).await;
    app.put_json(
        "labels/pod/n3/other",
        &json!({"replication_controller_id": new}),
    )
    .await;
    app.put_raw("labels/pod/n6/hello", "{not json").await;

    let views = |id: String| {
        let app = &app;
        async move {
            let shown = |body: &Value| {
                json!([
                    body["id"],
                    body["labels"],
                    body["progress"],
                    body["resource_version"]
                ])
            };
            let mirrored = app.get(&format!("/api/v1/rolls/{id}")).await.json();
            let stored = app
                .get(&format!("/api/v1/rolls/{id}?consistent=true"))
                .await
                .json();
            let listing = app.get("/api/v1/rolls").await.json();
            let items = listing["items"].as_array().unwrap();
            let listed = items.iter().find(|roll| roll["id"] == json!(id)).unwrap();
            assert_eq!(shown(&mirrored), shown(&stored));
            assert_eq!(shown(&mirrored), shown(listed));
            mirrored
        }
    };
    let body = views(new.clone()).await;
    assert_eq!(body["labels"], json!({"team": "a"}));
    assert_eq!(
        body["progress"],
        json!({"old": {"desired": 2, "current": 2, "real": 2, "healthy": 2, "unknown": 0, "unhealthy": 0},
               "new": {"desired": 0, "current": 1, "real": 0, "healthy": 0, "unknown": 0, "unhealthy": 0}})
    );
    let body = views(other_new.clone()).await;
    assert_eq!(body["labels"], json!({"team": "b"}));
    assert_eq!(body["progress"]["old"]["current"], json!(1));
    assert_eq!(body["progress"]["new"]["current"], json!(1));

    // A gone RC's labeled pods of any pod id count, none as real.
    let key = format!("replication_controllers/{new}");
    app.store.delete(&key, Cas::Any).await.unwrap();
    app.mirrored(&key).await;
    let body = views(new).await;
    assert_eq!(
        body["progress"]["new"],
        json!({"desired": null, "current": 2, "real": 0, "healthy": 0, "unknown": 0, "unhealthy": 0})
    );
}

#[tokio::test]
async fn get_of_an_unknown_or_malformed_id() {
    let app = TestApp::new().await;
    let response = app
        .get(&format!("/api/v1/rolls/{}", uuid::Uuid::new_v4()))
        .await;
    assert_eq!(response.status, StatusCode::NOT_FOUND, "{response:?}");
    assert_eq!(response.error().reason, "NotFound");
    for bad in ["not-a-uuid", "..", "5A0E3B8C-6F2D-4C1E-9A57-0C8E2F4B7D11"] {
        let response = app.get(&format!("/api/v1/rolls/{bad}")).await;
        assert_eq!(
            response.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad}: {response:?}"
        );
        assert_eq!(response.cause_fields(), ["id"]);
        let response = delete(&app, bad, None).await;
        assert_eq!(
            response.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad}: {response:?}"
        );
    }
}

async fn create_between_new_rcs(app: &TestApp, roll_labels: Value) -> (String, String) {
    let old = arrange_rc(app, 2, &[]).await;
    let response = post(
        app,
        json!({"old_rc_id": old, "new_rc": {"manifest": MANIFEST},
               "desired_replicas": 2, "minimum_replicas": 1, "labels": roll_labels}),
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    (old, response.json()["id"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn list_pages_filters_and_reports_the_index() {
    let app = TestApp::new().await;
    let mut ids = Vec::new();
    for team in ["a", "b", "a"] {
        ids.push(create_between_new_rcs(&app, json!({"team": team})).await.1);
    }
    ids.sort();

    let response = app.get("/api/v1/rolls").await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    let index: u64 = response.header("x-index").unwrap().parse().unwrap();
    assert!(index > 1);
    let body = response.json();
    let listed = item_ids(&body);
    assert_eq!(listed, ids);
    assert_eq!(body["continue"], Value::Null);
    assert!(body["items"][0]["progress"]["old"]["desired"].is_i64());

    let first = app.get("/api/v1/rolls?limit=2").await.json();
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let token = first["continue"].as_str().unwrap();
    let second = app
        .get(&format!("/api/v1/rolls?limit=2&continue={token}"))
        .await
        .json();
    assert_eq!(second["items"][0]["id"], json!(ids[2]));
    assert_eq!(second["continue"], Value::Null);

    let team_a = app.get("/api/v1/rolls?selector=team%3Da").await.json();
    assert_eq!(team_a["items"].as_array().unwrap().len(), 2);
    let response = app.get("/api/v1/rolls?selector=team%20in%20(").await;
    assert_eq!(response.cause_fields(), ["selector"]);
    let response = app.get("/api/v1/rolls?limit=0").await;
    assert_eq!(response.cause_fields(), ["limit"]);
}

#[tokio::test]
async fn list_blocks_until_progress_changes() {
    let app = Arc::new(TestApp::new().await);
    let (old, id) = create_between_new_rcs(&app, json!({"team": "a"})).await;
    // Every tree the listing watches is in use: on Consul an empty tree reads at the index
    // of the whole KV store, which any write anywhere moves.
    put_pod(&app, "n9", &old).await;
    put_reality(&app, "n9", ARRANGED_MANIFEST).await;
    put_health(&app, "n9", "n9", HealthState::Passing).await;
    app.put_raw(
        "p2-apiserver/conditions/rolls/other",
        br#"{"conditions": []}"#,
    )
    .await;
    let index = app
        .get("/api/v1/rolls")
        .await
        .header("x-index")
        .unwrap()
        .to_owned();

    // Nothing changes: the wait runs out and the index is the same.
    let response = app
        .get(&format!("/api/v1/rolls?index={index}&wait=100ms"))
        .await;
    assert_eq!(response.header("x-index"), Some(index.as_str()));

    let waiting = app
        .get_held(format!("/api/v1/rolls?index={index}&wait=30s"))
        .await;
    put_pod(&app, "n1", &id).await;
    let response = waiting.woken("a pod label change wakes the request").await;
    assert_eq!(response.status, StatusCode::OK);
    let new_index: u64 = response.header("x-index").unwrap().parse().unwrap();
    assert!(new_index > index.parse().unwrap());
    assert_eq!(response.json()["items"][0]["progress"]["new"]["current"], 1);

    let response = app.get("/api/v1/rolls?index=1&wait=11m").await;
    assert_eq!(response.cause_fields(), ["wait"]);
}

/// A DELETE of a roll that has finished, which a GET still shows, says so rather than that
/// no such roll exists.
#[tokio::test]
async fn delete_of_a_finished_roll_says_it_finished() {
    let app = TestApp::new().await;
    let (_, id) = create_between_new_rcs(&app, json!({})).await;
    assert_eq!(delete(&app, &id, None).await.status, StatusCode::NO_CONTENT);

    let response = delete(&app, &id, None).await;
    assert_eq!(response.status, StatusCode::NOT_FOUND, "{response:?}");
    assert_eq!(
        response.error().message,
        format!("rolling update {id} has already finished (cancelled): there is nothing to cancel")
    );
    let unknown = uuid::Uuid::new_v4().to_string();
    let response = delete(&app, &unknown, None).await;
    assert_eq!(
        response.error().message,
        format!("no rolling update {unknown} exists")
    );
}

#[tokio::test]
async fn delete_cancels_the_roll_and_leaves_both_rcs() {
    let app = TestApp::new().await;
    let (old, id) = create_between_new_rcs(&app, json!({"team": "a"})).await;
    let rc_keys = [
        format!("replication_controllers/{old}"),
        format!("replication_controllers/{id}"),
        format!("labels/replication_controller/{id}"),
    ];
    let mut before = Vec::new();
    for key in &rc_keys {
        before.push(app.stored(key).await.unwrap());
    }
    let etag = app
        .get(&format!("/api/v1/rolls/{id}"))
        .await
        .header("etag")
        .unwrap()
        .to_owned();

    let response = delete(&app, &id, Some("\"1\"")).await;
    assert_eq!(
        response.status,
        StatusCode::PRECONDITION_FAILED,
        "{response:?}"
    );
    assert!(app.stored(&format!("rolls/{id}")).await.is_some());
    let response = delete(&app, &id, Some("nonsense")).await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST, "{response:?}");

    let response = delete(&app, &id, Some(&etag)).await;
    assert_eq!(response.status, StatusCode::NO_CONTENT, "{response:?}");
    assert!(app.stored(&format!("rolls/{id}")).await.is_none());
    assert!(app.stored(&format!("labels/rolls/{id}")).await.is_none());
    for (key, was) in rc_keys.iter().zip(before) {
        assert_eq!(app.stored(key).await, Some(was), "{key} untouched");
    }

    let response = delete(&app, &id, None).await;
    assert_eq!(response.status, StatusCode::NOT_FOUND, "{response:?}");
    let response = app.get(&format!("/api/v1/rolls/{id}")).await;
    assert_eq!(response.json()["outcome"], "cancelled", "kept as finished");

    // Without If-Match, and the RCs are free for a new roll afterwards.
    let response = post(
        &app,
        json!({"old_rc_id": old, "new_rc_id": id, "desired_replicas": 2, "minimum_replicas": 1}),
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    assert_eq!(delete(&app, &id, None).await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.keys("rolls/").await, Vec::<String>::new());
}

/// A delete reads the roll, records it as finished and deletes it. A roll deleted and
/// created again over the same new RC between that read and the write is another roll: the
/// delete must not remove it under the record of the one it read.
#[tokio::test]
async fn a_roll_recreated_while_deleted_is_recorded_as_the_one_deleted() {
    let (app, counting) = TestApp::counted().await;
    let (old, id) = create_between_new_rcs(&app, json!({})).await;
    let key = layout::roll(&id);
    counting.after_next_get_of(
        &key,
        vec![
            TxnOp::Delete { key: key.clone() },
            TxnOp::Set {
                key: key.clone(),
                value: p2_roll_json(&old, &id, 3, 0, false, 0).into_bytes(),
            },
        ],
    );

    let response = delete(&app, &id, None).await;
    assert_eq!(response.status, StatusCode::NO_CONTENT, "{response:?}");
    assert!(app.stored(&key).await.is_none());
    let finished = app
        .stored_json(&layout::roll_history(&id))
        .await
        .expect("the roll's finished record");
    let response = app.get(&format!("/api/v1/rolls/{id}")).await;
    let body = response.json();
    assert_eq!(body["outcome"], "cancelled", "{body}");
    assert_eq!(
        (
            body["desired_replicas"].clone(),
            body["minimum_replicas"].clone()
        ),
        (json!(3), json!(0)),
        "the roll deleted is the one recorded: {finished}"
    );
}

/// The finished record of a deleted roll carries the labels the delete removes: labels
/// another writer changed, which this server's mirror has not seen yet, are the ones
/// recorded, not the earlier ones the mirror still holds.
#[tokio::test]
async fn a_deleted_roll_is_recorded_with_the_labels_it_deletes() {
    let (app, counting) = TestApp::counted().await;
    let (_, id) = create_between_new_rcs(&app, json!({"team": "a"})).await;
    counting.delay_watches_of(Some(&layout::labels_of_type(LabelType::Rolls)));
    app.store
        .put(
            &layout::labels(LabelType::Rolls, &id),
            br#"{"team": "b"}"#,
            Cas::Any,
        )
        .await
        .unwrap();

    let response = delete(&app, &id, None).await;
    counting.delay_watches_of(None);
    assert_eq!(response.status, StatusCode::NO_CONTENT, "{response:?}");
    assert!(app
        .stored(&layout::labels(LabelType::Rolls, &id))
        .await
        .is_none());
    let finished = app
        .stored_json(&layout::roll_history(&id))
        .await
        .expect("the roll's finished record");
    assert_eq!(finished["labels"], json!({"team": "b"}), "{finished}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creations_over_one_old_rc_have_exactly_one_winner() {
    let app = Arc::new(TestApp::new().await);
    let old = arrange_rc(&app, 3, &[]).await;
    let attempts = (0..8).map(|_| {
        let app = app.clone();
        let old = old.clone();
        tokio::spawn(async move {
            post(
                &app,
                json!({"old_rc_id": old, "new_rc": {"manifest": MANIFEST},
                       "desired_replicas": 3, "minimum_replicas": 1}),
            )
            .await
        })
    });
    let mut created = Vec::new();
    for attempt in attempts {
        let response = attempt.await.unwrap();
        match response.status {
            StatusCode::CREATED => created.push(response.json()["id"].as_str().unwrap().to_owned()),
            StatusCode::CONFLICT => {}
            other => panic!("unexpected {other}: {response:?}"),
        }
    }
    assert_eq!(created.len(), 1, "exactly one winner");
    assert_eq!(app.keys("rolls/").await, [format!("rolls/{}", created[0])]);
    // The losers wrote no RC either.
    assert_eq!(app.keys("replication_controllers/").await.len(), 2);
    assert_no_locks(&app).await;
}

/// P2's example rolling update, byte for byte as P2 writes it.
const P2_ROLL: &str = r#"{"OldRC":"5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11","NewRC":"9c41f7a2-0d3e-4b6a-8f1c-2e7d5a9b3c60","DesiredReplicas":3,"MinimumReplicas":2,"LeaveOld":false,"RollDelay":30000000000}"#;

#[tokio::test]
async fn a_roll_written_by_p2_reads_and_deletes() {
    let app = TestApp::new().await;
    let old = "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11";
    let new = "9c41f7a2-0d3e-4b6a-8f1c-2e7d5a9b3c60";
    for (id, replicas) in [(old, 3), (new, 0)] {
        let doc = format!(
            r#"{{"id":"{id}","manifest":"id: hello\n","node_selector":"","pod_labels":null,"replicas_desired":{replicas},"disabled":false,"allocation_strategy":""}}"#
        );
        app.put_raw(&format!("replication_controllers/{id}"), doc.as_bytes())
            .await;
    }
    app.store
        .put(&format!("rolls/{new}"), P2_ROLL.as_bytes(), Cas::Index(0))
        .await
        .unwrap();
    app.mirrored(&format!("rolls/{new}")).await;

    let response = app.get(&format!("/api/v1/rolls/{new}")).await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    let body = response.json();
    let index = app
        .stored(&format!("rolls/{new}"))
        .await
        .unwrap()
        .modify_index;
    assert_eq!(
        body,
        json!({
            "id": new, "old_rc_id": old, "new_rc_id": new,
            "desired_replicas": 3, "minimum_replicas": 2, "leave_old": false,
            "roll_delay": "30s", "labels": {}, "resource_version": index.to_string(),
            "progress": {"old": {"desired": 3, "current": 0, "real": 0, "healthy": 0, "unknown": 0, "unhealthy": 0},
                         "new": {"desired": 0, "current": 0, "real": 0, "healthy": 0, "unknown": 0, "unhealthy": 0}},
            "conditions": [],
            "created": null, "modified": null, "outcome": null, "ended": null
        })
    );
    assert_eq!(app.get("/api/v1/rolls").await.json()["items"][0], body);
    assert_eq!(
        app.stored_text(&format!("rolls/{new}")).await.unwrap(),
        P2_ROLL,
        "reading changes nothing"
    );

    let response = delete(&app, new, None).await;
    assert_eq!(response.status, StatusCode::NO_CONTENT, "{response:?}");
    assert!(app.stored(&format!("rolls/{new}")).await.is_none());
    assert_eq!(app.keys("replication_controllers/").await.len(), 2);
}

#[tokio::test]
async fn an_unreadable_roll_is_skipped_in_lists_and_can_be_deleted() {
    let app = TestApp::new().await;
    let (_, good) = create_between_new_rcs(&app, json!({})).await;
    let bad = uuid::Uuid::new_v4().to_string();
    app.put_raw(&format!("rolls/{bad}"), br#"{"DesiredReplicas":"3"}"#)
        .await;

    let body = app.get("/api/v1/rolls").await.json();
    assert_eq!(body["items"].as_array().unwrap().len(), 1);
    assert_eq!(body["items"][0]["id"], json!(good));
    let response = app.get(&format!("/api/v1/rolls/{bad}")).await;
    assert_eq!(response.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        delete(&app, &bad, None).await.status,
        StatusCode::NO_CONTENT
    );
    assert!(app.stored(&format!("rolls/{bad}")).await.is_none());
}

#[tokio::test]
async fn the_openapi_document_describes_every_roll_route() {
    let app = TestApp::new().await;
    let doc = app.get("/openapi.json").await.json();
    let paths = &doc["paths"];
    assert_operations(
        &doc,
        "rolls",
        &[
            ("/api/v1/rolls", "post", "create_roll"),
            ("/api/v1/rolls", "get", "list_rolls"),
            ("/api/v1/rolls/{id}", "get", "get_roll"),
            ("/api/v1/rolls/{id}", "delete", "delete_roll"),
        ],
    );
    for schema in ["CreateRoll", "Roll", "RollProgress", "RcProgress", "RcSpec"] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    let create = &paths["/api/v1/rolls"]["post"]["responses"];
    for status in ["201", "400", "409", "413", "415", "422", "503"] {
        assert!(create[status].is_object(), "create_roll documents {status}");
    }
    // A change between the checks and the commit is a 409 too (see
    // `a_new_rc_deleted_between_a_creations_checks_and_its_commit_fails_it`).
    let conflict = create["409"]["description"].as_str().unwrap();
    assert!(conflict.contains("changed or deleted"), "{conflict}");
    let delete = &paths["/api/v1/rolls/{id}"]["delete"]["responses"];
    for status in ["204", "400", "404", "412", "422", "503"] {
        assert!(delete[status].is_object(), "delete_roll documents {status}");
    }
    if std::env::var_os("DUMP_OPENAPI").is_some() {
        println!("{}", serde_json::to_string_pretty(&doc).unwrap());
    }
}

/// A roll's RCs are refused every write, with no farm running (so nobody holds their
/// mutation locks): otherwise the roll farm would later find them changed or gone.
#[tokio::test]
async fn writes_to_either_rc_of_a_roll_are_refused_naming_the_roll_without_any_lock() {
    let app = TestApp::new().await;
    let old = arrange_rc(&app, 3, &[("pod_id", "hello")]).await;
    let new = arrange_rc(&app, 0, &[("pod_id", "hello")]).await;
    let response = post(
        &app,
        json!({"old_rc_id": old, "new_rc_id": new, "desired_replicas": 3, "minimum_replicas": 2}),
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    assert_no_locks(&app).await;
    let before = app.dump().await;

    for rc in [&old, &new] {
        let path = format!("/api/v1/rcs/{rc}");
        let patched = app
            .merge_patch(&path, &json!({"replicas_desired": 0}), &[])
            .await;
        let deleted = app.json_request("DELETE", &path, None, &[]).await;
        let forced = app
            .json_request("DELETE", &format!("{path}?force=true"), None, &[])
            .await;
        for response in [patched, deleted, forced] {
            assert_eq!(response.status, StatusCode::CONFLICT, "{rc}: {response:?}");
            let message = response.error().message;
            assert!(
                message.contains(&format!("roll {new} names it")),
                "{message}"
            );
        }
    }
    assert_eq!(app.dump().await, before);

    // Once the roll is cancelled, the RCs are free again.
    assert_eq!(
        delete(&app, &new, None).await.status,
        StatusCode::NO_CONTENT
    );
    let patched = app
        .merge_patch(
            &format!("/api/v1/rcs/{old}"),
            &json!({"replicas_desired": 0}),
            &[],
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
}

/// A roll document that cannot be decoded still names its new RC by its key.
#[tokio::test]
async fn an_unreadable_roll_still_guards_its_new_rc() {
    let app = TestApp::new().await;
    let new = arrange_rc(&app, 0, &[("pod_id", "hello")]).await;
    app.put_raw(&format!("rolls/{new}"), "{not json").await;
    let response = app
        .json_request("DELETE", &format!("/api/v1/rcs/{new}"), None, &[])
        .await;
    assert_eq!(response.status, StatusCode::CONFLICT, "{response:?}");
    assert!(response.error().message.contains(&format!("roll {new}")));
    assert!(app
        .stored(&format!("replication_controllers/{new}"))
        .await
        .is_some());
}

/// ...and from being another roll's old RC: the one rule of which roll names an RC holds
/// for a roll's creation as for the RC's writes.
#[tokio::test]
async fn an_unreadable_roll_still_guards_its_new_rc_from_another_roll() {
    let app = TestApp::new().await;
    let busy = arrange_rc(&app, 3, &[("pod_id", "hello")]).await;
    let other = arrange_rc(&app, 0, &[("pod_id", "hello")]).await;
    app.put_raw(&format!("rolls/{busy}"), "{not json").await;
    let response = post(
        &app,
        json!({"old_rc_id": busy, "new_rc_id": other, "desired_replicas": 3, "minimum_replicas": 1}),
    )
    .await;
    assert_eq!(response.status, StatusCode::CONFLICT, "{response:?}");
    assert!(response
        .error()
        .message
        .contains(&format!("rolling update {busy}")));
    assert_eq!(app.keys("rolls/").await, [format!("rolls/{busy}")]);
    assert_no_locks(&app).await;
}

/// A creation naming an RC whose document cannot be decoded, by id or through the old-RC
/// selector, is refused as every request over that RC is: 500 `UnreadableDocument` naming
/// it and how to clear it, never a 422 blaming a request that is well-formed. Nothing is
/// written.
#[tokio::test]
async fn an_unreadable_rc_is_refused_as_unreadable_not_as_an_invalid_request() {
    let app = TestApp::new().await;
    let good = arrange_rc(&app, 0, &[("pod_id", "hello")]).await;
    let bad = uuid::Uuid::new_v4().to_string();
    app.put_raw(&layout::rc(&bad), "{not json").await;
    app.put_raw(
        &layout::labels(LabelType::ReplicationController, &bad),
        br#"{"pod_id":"broken"}"#,
    )
    .await;
    for body in [
        json!({"old_rc_id": bad, "new_rc_id": good}),
        json!({"old_rc_id": good, "new_rc_id": bad}),
        json!({"old_rc_id": bad, "new_rc": {"manifest": MANIFEST}}),
        json!({"old_rc_selector": "pod_id=broken", "new_rc": {"manifest": MANIFEST}}),
    ] {
        assert_refused_as_unreadable(&app, body, &format!("rcs/{bad}")).await;
    }
    assert_nothing_written(&app, 2).await;
}

/// A creation cut short (by its request's deadline) while it ends its session still ends it:
/// the update-creation locks of both RCs go at once, rather than staying until the store
/// expires the session, refusing other creations over the RCs meanwhile (and holding the new
/// RC away from P2's RC farm, which takes any key under its lock tree as held).
#[tokio::test]
async fn a_creation_cut_short_while_ending_its_session_still_releases_its_locks() {
    use p2_apiserver::model::{CreateRoll, Limits};
    use p2_apiserver::store::roll_creation::RollCreator;

    let app = TestApp::new().await;
    let old = arrange_rc(&app, 1, &[]).await;
    let store = crate::support::severable::Severable::new(app.store.clone());
    let request: CreateRoll = serde_json::from_value(json!({
        "old_rc_id": old, "new_rc": {"manifest": MANIFEST},
        "desired_replicas": 1, "minimum_replicas": 0
    }))
    .unwrap();
    let plan = request.validate(&Limits::default()).unwrap();

    // Held at its first lock, after its session exists; then session calls stall, so its
    // session's destruction waits once the roll is written.
    store.stall_acquires();
    let creator = RollCreator::new(store.clone());
    let creation = tokio::spawn(async move {
        creator
            .create(plan, &Actor::farm("test", "creation"))
            .await
            .map(|record| record.value.new_rc)
    });
    while store.acquiring() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    store.stall();
    store.mend_acquires();
    while app.keys("rolls/").await.is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(app.keys("lock/").await.len(), 2, "both RCs locked");

    creation.abort();
    assert!(creation.await.unwrap_err().is_cancelled());
    store.mend();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while !app.keys("lock/").await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the locks outlived the creation: {:?}",
            app.keys("lock/").await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An RC delete checks that no roll names the RC before its transaction. A roll created over
/// the RC as its old one between that check and the transaction claims the RC: the delete
/// must not then remove it (the roll farm would end the roll as failed), but find the roll
/// and refuse.
#[tokio::test]
async fn an_rc_claimed_by_a_roll_between_its_checks_and_its_delete_stays() {
    let (app, counting) = TestApp::counted().await;
    let app = Arc::new(app);
    let old = arrange_rc(&app, 0, &[]).await;
    let hold = counting.hold_next_txn_on(&layout::rc(&old));
    let deleting = {
        let (app, old) = (app.clone(), old.clone());
        tokio::spawn(async move { delete_rc_forced(&app, &old).await })
    };
    hold.reached().await;

    let roll = create_over(&app, &old).await;
    hold.release();

    let deleted = deleting.await.unwrap();
    assert_eq!(deleted.status, StatusCode::CONFLICT, "{deleted:?}");
    let message = deleted.error().message;
    assert!(message.contains(&roll), "{message}");
    assert!(app.stored(&layout::rc(&old)).await.is_some());
}

/// A roll created through another server claims its old RC at once: a server whose mirror
/// has not seen the roll yet refuses to delete the RC rather than removing it from under
/// the roll.
#[tokio::test]
async fn an_rc_claimed_by_a_roll_another_server_created_is_not_deleted_by_a_lagging_one() {
    let app = TestApp::new().await;
    let (lagging, counting) = app.beside_counted().await;
    let old = arrange_rc(&app, 0, &[]).await;
    lagging.mirrored(&layout::rc(&old)).await;
    counting.delay_watches_of(Some(layout::ROLLS));

    create_over(&app, &old).await;
    let deleted = delete_rc_forced(&lagging, &old).await;
    counting.delay_watches_of(None);
    assert_eq!(deleted.status, StatusCode::CONFLICT, "{deleted:?}");
    assert!(app.stored(&layout::rc(&old)).await.is_some());
}

/// An existing new RC is checked again by the creation's transaction: one deleted between
/// the creation's checks and its commit (its deletion finds no roll yet) fails the creation,
/// rather than leaving a roll over an RC that is gone.
#[tokio::test]
async fn a_new_rc_deleted_between_a_creations_checks_and_its_commit_fails_it() {
    let (app, counting) = TestApp::counted().await;
    let app = Arc::new(app);
    let old = arrange_rc(&app, 2, &[]).await;
    let new = arrange_rc(&app, 0, &[]).await;
    let hold = counting.hold_next_txn_on(&layout::roll(&new));
    let creating = {
        let (app, old, new) = (app.clone(), old.clone(), new.clone());
        tokio::spawn(async move {
            post(
                &app,
                json!({"old_rc_id": old, "new_rc_id": new,
                       "desired_replicas": 2, "minimum_replicas": 1}),
            )
            .await
        })
    };
    hold.reached().await;

    let deleted = app
        .json_request("DELETE", &format!("/api/v1/rcs/{new}"), None, &[])
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    hold.release();

    let created = creating.await.unwrap();
    assert_eq!(created.status, StatusCode::CONFLICT, "{created:?}");
    let message = created.error().message;
    assert!(
        message.contains(&format!("the new replication controller {new} was deleted")),
        "{message}"
    );
    assert_eq!(app.keys("rolls/").await, Vec::<String>::new());
    assert!(app.stored(&layout::rc(&new)).await.is_none());
    assert_no_locks(&app).await;
}

/// Creates a roll from the RC `old` to a new RC; its id.
async fn create_over(app: &TestApp, old: &str) -> String {
    let response = post(
        app,
        json!({"old_rc_id": old, "new_rc": {"manifest": MANIFEST},
               "desired_replicas": 2, "minimum_replicas": 1}),
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    response.json()["id"].as_str().unwrap().to_owned()
}

async fn delete_rc_forced(app: &TestApp, id: &str) -> TestResponse {
    let path = format!("/api/v1/rcs/{id}?force=true");
    app.json_request("DELETE", &path, None, &[]).await
}

/// A roll whose document cannot be decoded may name any RC as its old one, so no roll is
/// created while one is stored, as P2's creation refuses: 500 `UnreadableDocument` naming
/// it and how to clear it, rather than a second roll over its old RC. Nothing is written.
#[tokio::test]
async fn no_roll_is_created_while_a_roll_cannot_be_decoded() {
    let app = TestApp::new().await;
    let old = arrange_rc(&app, 2, &[("app", "old")]).await;
    let new = arrange_rc(&app, 0, &[("app", "new")]).await;
    let bad = uuid::Uuid::new_v4().to_string();
    app.put_raw(&layout::roll(&bad), "{not json").await;
    for body in [
        json!({"old_rc_id": old, "new_rc_id": new}),
        json!({"old_rc_id": old, "new_rc": {"manifest": MANIFEST}}),
        json!({"old_rc_selector": "app=old", "new_rc": {"manifest": MANIFEST}}),
        json!({"old_rc_selector": "app=nothing", "new_rc": {"manifest": MANIFEST}}),
    ] {
        assert_refused_as_unreadable(&app, body, &format!("rolls/{bad}")).await;
    }
    assert_eq!(app.keys("rolls/").await, [layout::roll(&bad)]);
    assert_eq!(app.keys("replication_controllers/").await.len(), 2);
    assert_no_locks(&app).await;
}

/// Posts `body` as a roll of 1 replica and checks it is refused as 500
/// `UnreadableDocument`, naming `DELETE /api/v1/<clearing>` as the way to clear it.
async fn assert_refused_as_unreadable(app: &TestApp, mut body: Value, clearing: &str) {
    body["desired_replicas"] = json!(1);
    body["minimum_replicas"] = json!(0);
    let response = post(app, body.clone()).await;
    assert_eq!(
        response.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{body}: {response:?}"
    );
    let error = response.error();
    assert_eq!(error.reason, "UnreadableDocument", "{body}");
    let delete = format!("DELETE /api/v1/{clearing}");
    assert!(error.message.contains(&delete), "{}", error.message);
}

/// The document's example of a roll request is one the server takes, and no field examples
/// name the old RC both ways (a request giving both is refused).
#[tokio::test]
async fn the_documented_roll_request_example_is_taken() {
    let (_, openapi) = p2_apiserver::router::api().split_for_parts();
    let document = serde_json::to_value(&openapi).unwrap();
    let schema = &document["components"]["schemas"]["CreateRoll"];
    let with_example: Vec<&str> = schema["properties"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, property)| property.get("example").is_some())
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(
        !(with_example.contains(&"old_rc_id") && with_example.contains(&"old_rc_selector")),
        "{with_example:?}"
    );

    let app = TestApp::new().await;
    let created = post(&app, schema["example"].clone()).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
}

/// A roll a tool stored naming an RC by no id a key can hold (none, as Go's zero value
/// leaves it, or `..`) is cancelled as any other: its RCs' counts are read where a key can
/// name them, and one that none can is absent, as the farms take it.
#[tokio::test]
async fn a_roll_naming_an_rc_no_key_can_hold_is_cancelled() {
    let app = TestApp::new().await;
    let new = arrange_rc(&app, 0, &[]).await;
    for old in ["", ".."] {
        let key = format!("rolls/{new}");
        app.put_raw(&key, p2_roll_json(old, &new, 1, 0, false, 0).as_bytes())
            .await;
        app.mirrored(&key).await;

        let response = delete(&app, &new, None).await;
        assert_eq!(
            response.status,
            StatusCode::NO_CONTENT,
            "{old:?}: {response:?}"
        );
        assert!(app.stored(&key).await.is_none());
    }
}
