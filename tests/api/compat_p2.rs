//! Compatibility with P2's own tools: what the API stores is byte for byte what P2 writes,
//! and documents P2 wrote survive reads and patches unchanged apart from the patched fields.

use axum::http::StatusCode;
use p2_apiserver::kv::Cas;
use p2_apiserver::model::StoredRc;
use serde_json::{json, Value};

use crate::support::api::{TestApp, TestResponse};

// ---- Replication controllers ----

/// P2's example RC exactly as P2 writes it: one line, struct order.
const P2_RC: &str = r#"{"id":"5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11","manifest":"id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_3881c78e.tar.gz\nconfig:\n  ENVIRONMENT: production\nstatus:\n  port: 43770\n  http: true\n","node_selector":"availability_zone=us-west-2a,role in (web,worker)","pod_labels":{"availability_zone":"us-west-2a","cluster_name":"production"},"replicas_desired":3,"disabled":false,"allocation_strategy":"static_strategy"}"#;
const P2_RC_ID: &str = "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11";
/// The RC's labels as P2's label applicator writes them.
const P2_RC_LABELS: &str = r#"{"pod_id":"hello"}"#;

async fn raw(app: &TestApp, key: &str) -> String {
    let pair = app.store.get(key).await.unwrap().expect("key exists");
    String::from_utf8(pair.value.to_vec()).unwrap()
}

async fn patch_rc(app: &TestApp, id: &str, body: Value) -> TestResponse {
    let response = app
        .json_request(
            "PATCH",
            &format!("/api/v1/rcs/{id}"),
            Some(&body),
            &[("content-type", "application/merge-patch+json")],
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    response
}

#[tokio::test]
async fn created_rcs_are_stored_exactly_as_p2_writes_them() {
    let app = TestApp::new().await;
    let manifest = "id: hello\n# a comment P2 keeps\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello.tar.gz\n";
    let response = app
        .json_request(
            "POST",
            "/api/v1/rcs",
            Some(&json!({
                "manifest": manifest,
                "node_selector": "role in (worker,web),availability_zone=us-west-2a",
                "replicas_desired": 3,
                "allocation_strategy": "static_strategy",
                "labels": {"owner": "ops"},
                "availability_zone": "us-west-2a",
                "cluster_name": "production",
            })),
            &[],
        )
        .await;
    assert_eq!(response.status, StatusCode::CREATED, "{response:?}");
    let id = response.json()["id"].as_str().unwrap().to_owned();

    let expected = format!(
        r#"{{"id":"{id}","manifest":{manifest},"node_selector":"availability_zone=us-west-2a,role in (web,worker)","pod_labels":{{"availability_zone":"us-west-2a","cluster_name":"production"}},"replicas_desired":3,"disabled":false,"allocation_strategy":"static_strategy"}}"#,
        manifest = serde_json::to_string(manifest).unwrap()
    );
    let stored = raw(&app, &format!("replication_controllers/{id}")).await;
    assert_eq!(stored, expected);
    let decoded = StoredRc::from_json(stored.as_bytes()).unwrap();
    assert_eq!(decoded.manifest.raw(), manifest);

    assert_eq!(
        raw(&app, &format!("labels/replication_controller/{id}")).await,
        r#"{"owner":"ops","pod_id":"hello"}"#
    );
}

#[tokio::test]
async fn a_p2_rc_survives_get_and_patch_unchanged_but_for_the_patched_fields() {
    let app = TestApp::new().await;
    let key = format!("replication_controllers/{P2_RC_ID}");
    app.store
        .put(&key, P2_RC.as_bytes(), Cas::Index(0))
        .await
        .unwrap();
    app.store
        .put(
            &format!("labels/replication_controller/{P2_RC_ID}"),
            P2_RC_LABELS.as_bytes(),
            Cas::Index(0),
        )
        .await
        .unwrap();
    app.mirrored(&key).await;
    app.mirrored(&format!("labels/replication_controller/{P2_RC_ID}"))
        .await;
    let original: Value = serde_json::from_str(P2_RC).unwrap();

    let got = app.get(&format!("/api/v1/rcs/{P2_RC_ID}")).await;
    assert_eq!(got.status, StatusCode::OK);
    let view = got.json();
    for field in [
        "id",
        "manifest",
        "node_selector",
        "pod_labels",
        "replicas_desired",
        "disabled",
        "allocation_strategy",
    ] {
        assert_eq!(view[field], original[field], "{field}");
    }
    assert_eq!(view["labels"], json!({"pod_id": "hello"}));
    assert_eq!(raw(&app, &key).await, P2_RC, "a read wrote");

    let changes = [
        ("replicas_desired", json!(5)),
        ("disabled", json!(true)),
        ("allocation_strategy", json!("dynamic_strategy")),
    ];
    let mut expected = original.clone();
    for (field, value) in changes {
        patch_rc(&app, P2_RC_ID, json!({ field: value.clone() })).await;
        expected[field] = value;
        let stored: Value = serde_json::from_str(&raw(&app, &key).await).unwrap();
        assert_eq!(stored, expected, "after patching {field}");
    }
    patch_rc(&app, P2_RC_ID, json!({"pod_labels": {"team": "edge"}})).await;
    expected["pod_labels"]["team"] = json!("edge");
    let stored = raw(&app, &key).await;
    assert_eq!(serde_json::from_str::<Value>(&stored).unwrap(), expected);
    // Byte for byte too: one line, P2's key order, sorted label keys.
    assert_eq!(
        stored,
        P2_RC
            .replace(r#""replicas_desired":3"#, r#""replicas_desired":5"#)
            .replace(r#""disabled":false"#, r#""disabled":true"#)
            .replace(r#""static_strategy""#, r#""dynamic_strategy""#)
            .replace(
                r#""cluster_name":"production"}"#,
                r#""cluster_name":"production","team":"edge"}"#
            )
    );
    assert_eq!(
        raw(&app, &format!("labels/replication_controller/{P2_RC_ID}")).await,
        P2_RC_LABELS
    );
}

#[tokio::test]
async fn a_p2_rc_with_nil_pod_labels_keeps_them_null() {
    let app = TestApp::new().await;
    let id = "9c41f7a2-0d3e-4b6a-8f1c-2e7d5a9b3c60";
    let document = format!(
        r#"{{"id":"{id}","manifest":"id: hello\n","node_selector":"","pod_labels":null,"replicas_desired":0,"disabled":false,"allocation_strategy":""}}"#
    );
    let key = format!("replication_controllers/{id}");
    app.store
        .put(&key, document.as_bytes(), Cas::Index(0))
        .await
        .unwrap();
    app.mirrored(&key).await;
    let view = app.get(&format!("/api/v1/rcs/{id}")).await.json();
    assert_eq!(view["pod_labels"], json!({}));
    assert_eq!(view["labels"], json!({}));
    patch_rc(&app, id, json!({"disabled": true})).await;
    assert_eq!(
        raw(&app, &key).await,
        document.replace(r#""disabled":false"#, r#""disabled":true"#)
    );
}

/// P2 stores whatever `allocation_strategy` string it is given on create (only
/// `update-strategy` checks the value) and its Go type is a plain string, so P2's tools read
/// such an RC back and its farm runs it (as a non-dynamic RC). It must not become an
/// unreadable document here, and a patch must keep the string.
#[tokio::test]
async fn a_p2_rc_with_an_allocation_strategy_p2_does_not_check_is_read_and_kept() {
    let app = TestApp::new().await;
    let key = format!("replication_controllers/{P2_RC_ID}");
    let document = P2_RC.replace(r#""static_strategy""#, r#""manual_strategy""#);
    app.store
        .put(&key, document.as_bytes(), Cas::Index(0))
        .await
        .unwrap();
    app.mirrored(&key).await;

    let got = app.get(&format!("/api/v1/rcs/{P2_RC_ID}")).await;
    assert_eq!(got.status, StatusCode::OK, "{got:?}");
    assert_eq!(got.json()["allocation_strategy"], "manual_strategy");

    patch_rc(&app, P2_RC_ID, json!({"replicas_desired": 4})).await;
    assert_eq!(
        raw(&app, &key).await,
        document.replace(r#""replicas_desired":3"#, r#""replicas_desired":4"#)
    );
}

// ---- Daemon sets ----

/// P2's example daemon set as P2 writes it, with a negative `timeout`: P2's replicator reads
/// a negative timeout as "no timeout" (it gives up on a node only for zero or a positive
/// value), and the DS store writes any `time.Duration` it is given.
const P2_DS_ID: &str = "1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e";
const P2_DS_NO_TIMEOUT: &str = r#"{"id":"1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e","disabled":false,"manifest":"id: p2-log-shipper\nlaunchables:\n  shipper:\n    launchable_type: hoist\n    location: https://artifacts.example.com/shipper_ab12.tar.gz\nconfig: {}\n","min_health":0,"cluster_name":"production","node_selector":"role!=db","pod_id":"p2-log-shipper","timeout":-1}"#;

#[tokio::test]
async fn a_p2_daemon_set_without_a_timeout_is_read_and_kept() {
    let app = TestApp::new().await;
    let key = format!("daemon_sets/{P2_DS_ID}");
    app.put_raw(&key, P2_DS_NO_TIMEOUT.as_bytes()).await;

    let got = app.get(&format!("/api/v1/daemonsets/{P2_DS_ID}")).await;
    assert_eq!(got.status, StatusCode::OK, "{got:?}");

    let response = app
        .json_request(
            "PATCH",
            &format!("/api/v1/daemonsets/{P2_DS_ID}"),
            Some(&json!({"min_health": 3})),
            &[("content-type", "application/merge-patch+json")],
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    assert_eq!(
        raw(&app, &key).await,
        P2_DS_NO_TIMEOUT.replace(r#""min_health":0"#, r#""min_health":3"#)
    );
}

/// P2 decodes `status_port` and `status.port` into a Go `int` with yaml.v2, which takes any
/// integer and truncates a float (this server's own SHA canonicalizer models exactly that).
/// A manifest P2 accepts must not make the RC holding it unreadable here.
#[tokio::test]
async fn a_p2_rc_whose_status_port_p2_accepts_is_readable() {
    let app = TestApp::new().await;
    let key = format!("replication_controllers/{P2_RC_ID}");
    for port in ["43770.0", "70000"] {
        let document = P2_RC.replace("port: 43770", &format!("port: {port}"));
        app.store
            .put(&key, document.as_bytes(), Cas::Any)
            .await
            .unwrap();
        app.mirrored(&key).await;
        let got = app.get(&format!("/api/v1/rcs/{P2_RC_ID}")).await;
        assert_eq!(got.status, StatusCode::OK, "port {port}: {got:?}");
    }
}

/// P2 reads manifests with yaml.v2, which takes a mapping that repeats a key (the last value
/// is the one decoded), so an RC P2's tools wrote with such a manifest must be readable here.
#[tokio::test]
async fn a_p2_rc_whose_manifest_repeats_a_key_is_readable() {
    let app = TestApp::new().await;
    let key = format!("replication_controllers/{P2_RC_ID}");
    let document = P2_RC
        .replace(
            r#""manifest":"id: hello\n"#,
            r#""manifest":"id: draft\nid: hello\n"#,
        )
        .replace(
            r"  ENVIRONMENT: production\n",
            r"  ENVIRONMENT: staging\n  ENVIRONMENT: production\n",
        );
    app.put_raw(&key, document.as_bytes()).await;

    let got = app.get(&format!("/api/v1/rcs/{P2_RC_ID}")).await;
    assert_eq!(got.status, StatusCode::OK, "{got:?}");
    let stored: Value = serde_json::from_str(&document).unwrap();
    assert_eq!(got.json()["manifest"], stored["manifest"]);
    let listed = app.get("/api/v1/rcs").await.json();
    assert_eq!(listed["items"][0]["id"], P2_RC_ID, "{listed}");
}

/// P2 reads a clear-signed manifest wherever its armor starts (Go's clearsign looks for it at
/// the start of every line) and from the signed text alone, so an RC P2's tools stored with
/// a comment above the armor must be readable here, with its manifest kept as stored.
#[tokio::test]
async fn a_p2_rc_whose_signed_manifest_has_a_line_above_the_armor_is_readable() {
    let app = TestApp::new().await;
    let key = format!("replication_controllers/{P2_RC_ID}");
    let mut document: Value = serde_json::from_str(P2_RC).unwrap();
    let plaintext = document["manifest"].as_str().unwrap().to_owned();
    let manifest = format!(
        "# signed by the release tool\n-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n\
         {plaintext}-----BEGIN PGP SIGNATURE-----\n\ncDI=\n=ar9S\n-----END PGP SIGNATURE-----\n"
    );
    document["manifest"] = json!(manifest);
    app.put_raw(&key, document.to_string().as_bytes()).await;

    let got = app.get(&format!("/api/v1/rcs/{P2_RC_ID}")).await;
    assert_eq!(got.status, StatusCode::OK, "{got:?}");
    assert_eq!(got.json()["manifest"], json!(manifest));
    let listed = app.get("/api/v1/rcs").await.json();
    assert_eq!(listed["items"][0]["id"], P2_RC_ID, "{listed}");
}

/// P2 stores pod labels unchecked; one this server would refuse can still be removed by
/// name, as a bad label can be removed from any object's labels.
#[tokio::test]
async fn a_pod_label_p2_stored_unchecked_can_be_removed() {
    let app = TestApp::new().await;
    let key = format!("replication_controllers/{P2_RC_ID}");
    let document = P2_RC.replace(
        r#""cluster_name":"production"}"#,
        r#""cluster_name":"production","team name":"edge"}"#,
    );
    app.put_raw(&key, document.as_bytes()).await;

    patch_rc(&app, P2_RC_ID, json!({"pod_labels": {"team name": null}})).await;
    assert_eq!(raw(&app, &key).await, P2_RC);

    let response = app
        .merge_patch(
            &format!("/api/v1/rcs/{P2_RC_ID}"),
            &json!({"pod_labels": {"team name": "edge"}}),
            &[],
        )
        .await;
    assert_eq!(response.unprocessable_fields(), ["pod_labels.team name"]);
}

// ---- Labels ----

/// P2's label applicator stores whatever value it is given, escaped by Go's JSON writer
/// (`&` as `\u0026`); a label added here is written beside it the way Go would write it.
#[tokio::test]
async fn labels_p2_wrote_are_rewritten_as_p2_writes_them() {
    let app = TestApp::new().await;
    let key = "labels/node/node17.example.com";
    let p2_labels = r#"{"owner":"\u003cops\u003e \u0026 sre"}"#;
    app.put_raw(key, p2_labels.as_bytes()).await;

    let response = app
        .merge_patch(
            "/api/v1/labels/node/node17.example.com",
            &json!({"labels": {"role": "web"}}),
            &[],
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    assert_eq!(
        raw(&app, key).await,
        r#"{"owner":"\u003cops\u003e \u0026 sre","role":"web"}"#
    );
}

/// P2's Go code decodes a label set into `map[string]string`, where a `null` value reads as
/// `""`; such a set is read the same way here, so adding a label keeps the others.
#[tokio::test]
async fn a_label_set_with_a_null_value_reads_as_go_reads_it() {
    let app = TestApp::new().await;
    let key = "labels/node/node18.example.com";
    let path = "/api/v1/labels/node/node18.example.com";
    app.put_raw(key, br#"{"a":null,"b":"x"}"#).await;

    let response = app.get(path).await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    assert_eq!(response.json()["labels"], json!({"a": "", "b": "x"}));

    let response = app
        .merge_patch(path, &json!({"labels": {"role": "web"}}), &[])
        .await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    assert_eq!(
        response.json()["labels"],
        json!({"a": "", "b": "x", "role": "web"})
    );
    assert_eq!(raw(&app, key).await, r#"{"a":"","b":"x","role":"web"}"#);
}
