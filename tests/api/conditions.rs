//! The conditions the leader's farms publish, as the RC, roll and daemon-set views show them.

use axum::http::StatusCode;
use p2_apiserver::layout;
use p2_apiserver::model::conditions::{Condition, ConditionStatus, ConditionsRecord};
use p2_apiserver::model::event::ObjectKind;
use serde_json::{json, Value};

use crate::support::api::TestApp;

const MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_1.tar.gz\n";

async fn created(app: &TestApp, path: &str, body: Value) -> String {
    let response = app.json_request("POST", path, Some(&body), &[]).await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    response.json()["id"].as_str().unwrap().to_owned()
}

async fn rc(app: &TestApp) -> String {
    let body = json!({"manifest": MANIFEST, "node_selector": "role=web", "replicas_desired": 0});
    created(app, "/api/v1/rcs", body).await
}

/// Stores, as a leader's farm would, one condition for an object, computed from its document
/// at `observed_index`; returns it as the views show it.
async fn publish(
    app: &TestApp,
    kind: ObjectKind,
    id: &str,
    reason: &str,
    observed_index: u64,
) -> Value {
    let condition = Condition {
        condition_type: "Progressing".into(),
        status: ConditionStatus::False,
        reason: reason.into(),
        message: format!("{reason} for a test"),
        last_transition_time: "2026-01-01T00:00:00Z".into(),
        observed_index,
    };
    let record = ConditionsRecord {
        conditions: vec![condition.clone()],
        progress: None,
    };
    app.put_json(
        &layout::conditions(kind, id),
        &serde_json::to_value(&record).unwrap(),
    )
    .await;
    json!([condition])
}

async fn get(app: &TestApp, path: &str) -> Value {
    let response = app.get(path).await;
    assert_eq!(response.status, StatusCode::OK, "{path}: {response:?}");
    response.json()
}

/// The conditions of the list item with `id`.
async fn listed(app: &TestApp, path: &str, id: &str) -> Value {
    let page = get(app, path).await;
    let items = page["items"].as_array().unwrap();
    let item = items.iter().find(|item| item["id"] == id).unwrap();
    item["conditions"].clone()
}

#[tokio::test]
async fn views_show_the_conditions_the_farms_published() {
    let app = TestApp::new().await;
    let (old, new) = (rc(&app).await, rc(&app).await);
    let roll = json!({"OldRC": old, "NewRC": new, "DesiredReplicas": 1, "MinimumReplicas": 1,
                      "LeaveOld": false, "RollDelay": 0});
    app.put_json(&layout::roll(&new), &roll).await;
    let observed = app.stored(&layout::roll(&new)).await.unwrap().modify_index;
    let body = json!({"manifest": MANIFEST, "node_selector": "", "min_health": 0,
                      "cluster_name": "production", "timeout": "10m"});
    let ds = created(&app, "/api/v1/daemonsets", body).await;
    let views = [
        (
            ObjectKind::Rcs,
            format!("/api/v1/rcs/{old}"),
            "/api/v1/rcs",
            &old,
        ),
        (
            ObjectKind::Rolls,
            format!("/api/v1/rolls/{new}"),
            "/api/v1/rolls",
            &new,
        ),
        (
            ObjectKind::Daemonsets,
            format!("/api/v1/daemonsets/{ds}"),
            "/api/v1/daemonsets",
            &ds,
        ),
    ];

    // No leader has computed any yet.
    for (_, one, list, id) in &views {
        assert_eq!(get(&app, one).await["conditions"], json!([]), "{one}");
        assert_eq!(listed(&app, list, id).await, json!([]), "{list}");
    }
    for (kind, one, list, id) in &views {
        let shown = publish(&app, *kind, id, "MinimumEqualsDesired", observed).await;
        assert_eq!(get(&app, one).await["conditions"], shown, "{one}");
        assert_eq!(listed(&app, list, id).await, shown, "{list}");
    }
    // Read through to the store, the RC shows them too.
    let consistent = get(&app, &format!("/api/v1/rcs/{old}?consistent=true")).await;
    assert_eq!(
        consistent["conditions"][0]["reason"],
        "MinimumEqualsDesired"
    );
    assert_eq!(
        get(&app, &format!("/api/v1/rcs/{new}")).await["conditions"],
        json!([]),
        "another object's conditions are not shown"
    );
}

/// A roll deleted and created again over the same new RC is another roll: until a farm
/// computes its conditions, it has none, not those of the roll before it, which stay stored
/// until a farm removes them.
#[tokio::test]
async fn a_roll_created_again_shows_none_of_the_conditions_of_the_one_before() {
    let app = TestApp::new().await;
    let (old, new) = (rc(&app).await, rc(&app).await);
    let body = json!({"old_rc_id": old, "new_rc_id": new,
                      "desired_replicas": 0, "minimum_replicas": 0});
    let path = format!("/api/v1/rolls/{new}");
    created(&app, "/api/v1/rolls", body.clone()).await;
    let observed = app.stored(&layout::roll(&new)).await.unwrap().modify_index;
    let shown = publish(&app, ObjectKind::Rolls, &new, "ReplicasMoving", observed).await;
    assert_eq!(get(&app, &path).await["conditions"], shown);

    let response = app.json_request("DELETE", &path, None, &[]).await;
    assert_eq!(response.status, StatusCode::NO_CONTENT, "{response:?}");
    created(&app, "/api/v1/rolls", body).await;
    assert!(app
        .stored(&layout::conditions(ObjectKind::Rolls, &new))
        .await
        .is_some());
    for read in [path.clone(), format!("{path}?consistent=true")] {
        assert_eq!(get(&app, &read).await["conditions"], json!([]), "{read}");
    }
    assert_eq!(listed(&app, "/api/v1/rolls", &new).await, json!([]));
}
