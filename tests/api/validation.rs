//! Rules every resource shares: one id rule per kind, bounded ids and label keys, duplicate
//! JSON keys, and the replica maximum.

use axum::http::StatusCode;
use p2_apiserver::model::{Limits, DEFAULT_MAX_REPLICAS, REPLICA_COUNTS};
use serde_json::json;

use crate::support::api::{TestApp, TestResponse};

const MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello.tar.gz\n";

/// The 422 for a malformed id: one cause on `field`, and the message of the one UUID rule.
fn assert_malformed_uuid(response: &TestResponse, field: &str, what: &str) {
    assert_eq!(
        response.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{what}: {response:?}"
    );
    let error = response.error();
    assert_eq!(error.reason, "Invalid", "{what}");
    assert_eq!(response.cause_fields(), [field], "{what}");
    assert!(
        error.causes[0]
            .message
            .starts_with("must be a lower-case hyphenated UUID"),
        "{what}: {error:?}"
    );
}

#[tokio::test]
async fn every_single_object_route_answers_ids_the_same_way() {
    let app = TestApp::new().await;
    let unknown = uuid::Uuid::new_v4().to_string();
    let upper = unknown.to_uppercase();
    // Paths stop at 8 KiB (414), so this is about as long as an id in a path gets.
    let long = "a".repeat(8_000);
    let patch = json!({"disabled": true});
    for resource in ["rcs", "rolls", "daemonsets"] {
        let mut methods = vec!["GET", "DELETE"];
        if resource != "rolls" {
            methods.push("PATCH");
        }
        for method in methods {
            let send = |id: &str| {
                let path = format!("/api/v1/{resource}/{id}");
                let body = (method == "PATCH").then_some(&patch);
                let app = &app;
                async move { app.json_request(method, &path, body, &[]).await }
            };
            for bad in [upper.as_str(), "not-a-uuid", "..", long.as_str()] {
                let what = format!("{method} {resource} {:.40}", bad);
                assert_malformed_uuid(&send(bad).await, "id", &what);
            }
            let missing = send(&unknown).await;
            assert_eq!(
                missing.status,
                StatusCode::NOT_FOUND,
                "{method} {resource}: {missing:?}"
            );
            assert_eq!(missing.error().reason, "NotFound");
            assert!(missing.error().message.contains(&unknown));
        }
    }
    assert_eq!(app.dump().await, []);
}

#[tokio::test]
async fn ids_in_bodies_follow_the_same_rule() {
    let app = TestApp::new().await;
    let upper = uuid::Uuid::new_v4().to_string().to_uppercase();
    let response = app
        .json_request(
            "POST",
            "/api/v1/rolls",
            Some(&json!({
                "old_rc_id": upper,
                "new_rc_id": uuid::Uuid::new_v4().to_string(),
                "desired_replicas": 1,
                "minimum_replicas": 0,
            })),
            &[],
        )
        .await;
    assert_malformed_uuid(&response, "old_rc_id", "roll body");
}

#[tokio::test]
async fn long_node_names_pod_ids_and_label_ids_are_refused() {
    let app = TestApp::new().await;
    // Paths stop at 8 KiB (414), so this is about as long as an id in a path gets.
    let long = "n".repeat(8_000);
    for path in [
        format!("/api/v1/nodes/{long}"),
        format!("/api/v1/intent/{long}/hello"),
        format!("/api/v1/intent/node1/{long}"),
        format!("/api/v1/labels/node/{long}"),
    ] {
        let response = app.get(&path).await;
        assert_eq!(
            response.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{:.40}: {response:?}",
            path
        );
    }
    let response = app
        .json_request(
            "PUT",
            &format!("/api/v1/labels/node/{long}"),
            Some(&json!({"labels": {"a": "b"}})),
            &[],
        )
        .await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    let response = app
        .json_request(
            "PUT",
            "/api/v1/labels/node/node1",
            Some(&json!({"labels": {"k".repeat(10_000): "b"}})),
            &[],
        )
        .await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        response.error().causes[0]
            .message
            .contains("at most 317 characters"),
        "{response:?}"
    );
    assert_eq!(app.dump().await, []);
}

#[tokio::test]
async fn rcs_and_daemon_sets_take_the_same_manifest_ids() {
    let app = TestApp::new().await;
    for id in ["a:b", "ü", "-x", "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11"] {
        let manifest = format!("id: {id:?}\n");
        let rc = app
            .json_request(
                "POST",
                "/api/v1/rcs",
                Some(&json!({"manifest": manifest})),
                &[],
            )
            .await;
        let ds = app
            .json_request(
                "POST",
                "/api/v1/daemonsets",
                Some(&json!({"manifest": manifest, "node_selector": "", "timeout": "1m"})),
                &[],
            )
            .await;
        for (what, response) in [("rc", &rc), ("daemon set", &ds)] {
            assert_eq!(
                response.status,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{what} {id:?}: {response:?}"
            );
            assert_eq!(response.cause_fields(), ["manifest.id"], "{what} {id:?}");
        }
        assert_eq!(rc.error().causes, ds.error().causes, "{id:?}");
    }
    assert_eq!(app.dump().await, []);
}

/// A body read into a fixed shape that it does not have (a value of the wrong type at any
/// depth, a field missing or unknown) is 422 naming the field in `causes`, as every other
/// invalid body is; before, the framework's message came with no cause at all.
#[tokio::test]
async fn a_body_of_the_wrong_shape_names_the_field() {
    let app = TestApp::new().await;
    let roll = json!({
        "old_rc_selector": "pod_id=hello",
        "new_rc": {"manifest": MANIFEST, "node_selector": ""},
        "desired_replicas": 1,
        "minimum_replicas": 0,
    });
    let with = |field: &str, value: serde_json::Value| {
        let mut body = roll.clone();
        body[field] = value;
        body
    };
    let mut missing = roll.clone();
    missing.as_object_mut().unwrap().remove("desired_replicas");
    let cases = [
        (
            "POST",
            "/api/v1/rolls",
            with("desired_replicas", json!("3")),
            "desired_replicas",
        ),
        (
            "POST",
            "/api/v1/rolls",
            with("labels", json!({"a": 1})),
            "labels.a",
        ),
        (
            "POST",
            "/api/v1/rolls",
            with("colour", json!("red")),
            "colour",
        ),
        ("POST", "/api/v1/rolls", missing, "desired_replicas"),
        (
            "PUT",
            "/api/v1/labels/node/node1",
            json!({"labels": {"a": 1}}),
            "labels.a",
        ),
        ("PUT", "/api/v1/labels/node/node1", json!({}), "labels"),
        // P2's own label routes, which read their bodies as JSON whatever the content type.
        (
            "PUT",
            "/api/labels/node/node1",
            json!({"values": {"a": ["b"]}}),
            "values.a",
        ),
        (
            "PUT",
            "/api/labels/node/node1/a",
            json!({"value": null}),
            "value",
        ),
    ];
    for (method, path, body, field) in cases {
        let response = app.json_request(method, path, Some(&body), &[]).await;
        assert_eq!(
            response.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{method} {path} {body}: {response:?}"
        );
        assert_eq!(
            response.cause_fields(),
            [field],
            "{method} {path} {body}: {response:?}"
        );
    }
    assert_eq!(app.dump().await, []);
}

/// A JSON array where a body, or a field of it, is an object is of the wrong shape too: a
/// positional list of an RC's fields was read as the RC and created one.
#[tokio::test]
async fn an_array_where_an_object_goes_is_of_the_wrong_shape() {
    let app = TestApp::new().await;
    let rc = json!([MANIFEST, "", {}, 1, false, "", {}, null, null]);
    let roll = json!({
        "old_rc_selector": "pod_id=hello",
        "new_rc": [MANIFEST, "", {}, 1, false, "", {}, null, null],
        "desired_replicas": 1,
        "minimum_replicas": 0,
    });
    for (method, path, body, field) in [
        ("POST", "/api/v1/rcs", rc, "body"),
        ("POST", "/api/v1/rolls", roll, "new_rc"),
        (
            "PUT",
            "/api/v1/health/hello/node1",
            json!(["passing"]),
            "body",
        ),
    ] {
        let response = app.json_request(method, path, Some(&body), &[]).await;
        assert_eq!(
            response.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{path}: {response:?}"
        );
        assert_eq!(response.cause_fields(), [field], "{path}: {response:?}");
        let message = &response.error().causes[0].message;
        assert!(message.contains("expected an object"), "{path}: {message}");
    }
    assert_eq!(app.dump().await, []);
}

/// A number field sent something else says what it takes in words, not as a Rust type
/// (`expected i64`).
#[tokio::test]
async fn a_number_field_says_it_takes_a_whole_number() {
    let app = TestApp::new().await;
    for (value, expected) in [
        (
            json!("3"),
            "invalid type: string \"3\", expected a whole number",
        ),
        (
            json!(1.5),
            "invalid type: floating point `1.5`, expected a whole number",
        ),
        (
            json!(u64::MAX),
            "invalid value: integer `18446744073709551615`, expected a whole number",
        ),
    ] {
        let body = json!({"manifest": MANIFEST, "replicas_desired": value});
        let response = app
            .json_request("POST", "/api/v1/rcs", Some(&body), &[])
            .await;
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{value}");
        assert_eq!(response.cause_fields(), ["replicas_desired"], "{value}");
        let message = &response.error().causes[0].message;
        assert!(message.starts_with(expected), "{value}: {message}");
    }
    assert_eq!(app.dump().await, []);
}

#[tokio::test]
async fn duplicate_keys_are_refused_at_every_depth() {
    let app = TestApp::new().await;
    let manifest = serde_json::to_string(MANIFEST).unwrap();
    let cases = [
        (
            "POST",
            "/api/v1/rcs",
            format!(r#"{{"manifest": {manifest}, "labels": {{"a": "1", "a": "2"}}}}"#),
            "labels",
        ),
        (
            "POST",
            "/api/v1/rcs",
            format!(r#"{{"manifest": {manifest}, "manifest": {manifest}}}"#),
            "body",
        ),
        (
            "POST",
            "/api/v1/daemonsets",
            r#"{"manifest": {"id": "hello", "config": {"x": 1, "x": 2}}, "node_selector": "", "timeout": "1m"}"#
                .to_owned(),
            "manifest.config",
        ),
        (
            "PATCH",
            &format!("/api/v1/rcs/{}", uuid::Uuid::new_v4()),
            r#"{"pod_labels": {"a": "1", "a": null}}"#.to_owned(),
            "pod_labels",
        ),
        (
            "PUT",
            "/api/v1/labels/node/node1",
            r#"{"labels": {"a": "1"}, "x": [{"k": 1, "k": 2}]}"#.to_owned(),
            "x[0]",
        ),
        // An array element is named as a shape error names it, `[index]` after its array.
        (
            "POST",
            "/api/v1/daemonsets",
            r#"{"manifest": {"id": "hello", "config": {"l": [1, {"k": 1, "k": 2}]}}, "node_selector": "", "timeout": "1m"}"#
                .to_owned(),
            "manifest.config.l[1]",
        ),
        // P2's own label routes, which read their bodies as JSON whatever the content type.
        (
            "PUT",
            "/api/labels/node/node1",
            r#"{"values": {"a": "1", "a": "2"}}"#.to_owned(),
            "values",
        ),
        (
            "PUT",
            "/api/labels/node/node1/color",
            r#"{"value": "red", "value": "blue"}"#.to_owned(),
            "body",
        ),
    ];
    for (method, path, body, field) in cases {
        let content_type = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        let response = app
            .send_raw(
                method,
                path,
                &[("content-type", content_type)],
                body.clone(),
            )
            .await;
        assert_eq!(
            response.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {response:?}"
        );
        assert_eq!(response.cause_fields(), [field], "{body}");
        assert!(response.error().causes[0].message.contains("twice"));
    }
    assert_eq!(app.dump().await, []);
}

#[tokio::test]
async fn replica_counts_have_a_maximum() {
    let app = TestApp::new().await;
    let response = app
        .json_request(
            "POST",
            "/api/v1/rcs",
            Some(&json!({"manifest": MANIFEST, "replicas_desired": 10_001})),
            &[],
        )
        .await;
    assert_over_max(&response, "replicas_desired");

    let at_max = app
        .json_request(
            "POST",
            "/api/v1/rcs",
            Some(&json!({"manifest": MANIFEST, "replicas_desired": 10_000})),
            &[],
        )
        .await;
    assert_eq!(at_max.status, StatusCode::CREATED, "{at_max:?}");
    let id = at_max.json()["id"].as_str().unwrap().to_owned();
    let before = app.dump().await;
    let response = app
        .merge_patch(
            &format!("/api/v1/rcs/{id}"),
            &json!({"replicas_desired": 1_000_000}),
            &[],
        )
        .await;
    assert_over_max(&response, "replicas_desired");

    let old = app
        .json_request(
            "POST",
            "/api/v1/rcs",
            Some(&json!({"manifest": MANIFEST})),
            &[],
        )
        .await
        .json()["id"]
        .clone();
    let before_roll = app.dump().await;
    let response = app
        .json_request(
            "POST",
            "/api/v1/rolls",
            Some(&json!({
                "old_rc_id": old,
                "new_rc_id": id,
                "desired_replicas": 10_001,
                "minimum_replicas": 0,
            })),
            &[],
        )
        .await;
    assert_over_max(&response, "desired_replicas");
    assert_eq!(app.dump().await, before_roll);
    assert_ne!(before, before_roll);
}

/// A server run with `--max-replicas` serves a document that gives each replica count that
/// maximum, and takes exactly what its document allows.
#[tokio::test]
async fn the_served_document_gives_the_servers_own_replica_maximum() {
    let app = TestApp::validating(Limits { max_replicas: 7 }).await;
    let document = app.get("/openapi.json").await.json();
    for (schema, property) in REPLICA_COUNTS {
        let count = &document["components"]["schemas"][schema]["properties"][property];
        assert_eq!(count["maximum"], 7, "{schema}.{property}: {count}");
    }
    let app = &app;
    let create = |replicas: i64| async move {
        let body = json!({"manifest": MANIFEST, "replicas_desired": replicas});
        app.json_request("POST", "/api/v1/rcs", Some(&body), &[])
            .await
    };
    let past = create(8).await;
    assert_eq!(past.status, StatusCode::UNPROCESSABLE_ENTITY, "{past:?}");
    assert!(
        past.error().causes[0].message.contains("must be at most 7"),
        "{past:?}"
    );
    assert_eq!(app.dump().await, []);
    let at_max = create(7).await;
    assert_eq!(at_max.status, StatusCode::CREATED, "{at_max:?}");
}

/// The replica counts the served document gives the server's maximum are every property the
/// default document bounds by the default maximum: a count added to a request body without
/// being listed would keep the default's maximum whatever `--max-replicas` says.
#[tokio::test]
async fn every_replica_count_takes_the_servers_maximum() {
    let document = TestApp::new().await.get("/openapi.json").await.json();
    let mut bounded = Vec::new();
    for (schema, definition) in document["components"]["schemas"].as_object().unwrap() {
        for (property, value) in definition["properties"].as_object().into_iter().flatten() {
            if value["maximum"] == DEFAULT_MAX_REPLICAS {
                bounded.push((schema.as_str(), property.as_str()));
            }
        }
    }
    let mut listed = REPLICA_COUNTS.to_vec();
    listed.sort();
    bounded.sort();
    assert_eq!(bounded, listed);
}

fn assert_over_max(response: &TestResponse, field: &str) {
    assert_eq!(
        response.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{response:?}"
    );
    assert_eq!(response.cause_fields(), [field]);
    assert!(
        response.error().causes[0]
            .message
            .contains("must be at most 10000"),
        "{response:?}"
    );
}

/// A manifest too large for the store's one write of an RC or a daemon set (its values in
/// base64, a daemon set's manifest stored twice, in its document and its audit record) is a
/// 422 whose cause names `manifest` and says how large it may be, not the store's refusal
/// of a transaction; nothing is written, and one a little smaller is taken.
#[tokio::test]
async fn a_manifest_too_large_for_the_store_is_refused_naming_it() {
    let app = TestApp::new().await;
    let manifest = format!("{MANIFEST}# {}\n", "x".repeat(400_000));
    let rc = json!({"manifest": manifest, "node_selector": "", "replicas_desired": 0});
    let ds = json!({"manifest": manifest, "node_selector": "", "timeout": "1s"});
    for (path, body) in [("/api/v1/rcs", rc), ("/api/v1/daemonsets", ds)] {
        let before = app.keys("").await;
        let response = app.json_request("POST", path, Some(&body), &[]).await;
        assert_eq!(app.keys("").await, before, "{path}");
        assert_eq!(
            response.unprocessable_fields(),
            ["manifest"],
            "{path}: {response:?}"
        );
        let message = &response.error().causes[0].message;
        assert!(message.contains("at most"), "{path}: {message}");
        assert!(!message.contains("transaction"), "{path}: {message}");
        // The size it may have: at most the one given, near it for a manifest of few lines
        // (within base64's rounding), whether or not the store's keys take a prefix, as the
        // tests' Consul's do.
        let largest: usize = message
            .split("may be at most ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{path}: {message}"));
        let mut fitting = body.clone();
        let pad = largest - ROUNDING - MANIFEST.len() - 3;
        fitting["manifest"] = json!(format!("{MANIFEST}# {}\n", "x".repeat(pad)));
        let created = app.json_request("POST", path, Some(&fitting), &[]).await;
        assert_eq!(created.status, StatusCode::CREATED, "{path}: {created:?}");
    }
}

/// How far under the size a manifest is told it may have one of few lines surely fits:
/// base64 rounds each value up to 4 bytes.
const ROUNDING: usize = 16;

/// Every key and value the store holds, to tell that a refused write wrote nothing.
async fn stored(app: &TestApp) -> Vec<(String, Vec<u8>)> {
    let listing = app.store.list("").await.unwrap();
    let pairs = listing.pairs.into_iter();
    pairs.map(|pair| (pair.key, pair.value.to_vec())).collect()
}

/// Asserts `response` is a 422 naming only `field` as a manifest too large for the store,
/// not the store's refusal of a transaction; answers the size it says the manifest may be.
fn largest_allowed(response: &TestResponse, field: &str) -> usize {
    assert_eq!(response.unprocessable_fields(), [field], "{response:?}");
    let message = &response.error().causes[0].message;
    assert!(!message.contains("transaction"), "{message}");
    message
        .split("may be at most ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{message}"))
}

/// A manifest of about `bytes` bytes, of few lines.
fn manifest_of(bytes: usize) -> String {
    format!("{MANIFEST}# {}\n", "x".repeat(bytes - MANIFEST.len() - 3))
}

/// A PATCH of an RC's manifest too large for the store's one write is refused as its
/// create is, naming `manifest`, nothing written; one a little under the size given is
/// taken.
#[tokio::test]
async fn an_rc_patched_with_a_manifest_too_large_for_the_store_is_refused_naming_it() {
    let app = TestApp::new().await;
    let rc = json!({"manifest": MANIFEST, "node_selector": "", "replicas_desired": 0});
    let created = app
        .json_request("POST", "/api/v1/rcs", Some(&rc), &[])
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let path = format!("/api/v1/rcs/{}", created.json()["id"].as_str().unwrap());
    let patch = |manifest: String| json!({ "manifest": manifest });
    let write = ("PATCH", path.as_str(), "manifest");
    refused_too_large_then_taken_fitting(&app, write, patch, StatusCode::OK).await;
}

/// Checks that a write (`method` of `path`) of `body` with a manifest too large for the
/// store's one write is refused naming `field`, nothing written, and that one a little under
/// the size the refusal gives is answered `taken`. Returns the refusal.
async fn refused_too_large_then_taken_fitting(
    app: &TestApp,
    (method, path, field): (&str, &str, &str),
    body: impl Fn(String) -> serde_json::Value,
    taken: StatusCode,
) -> TestResponse {
    let before = stored(app).await;
    let refused = app
        .json_request(method, path, Some(&body(manifest_of(400_000))), &[])
        .await;
    assert_eq!(stored(app).await, before, "{refused:?}");
    let largest = largest_allowed(&refused, field);
    let fitting = body(manifest_of(largest - ROUNDING));
    let answered = app.json_request(method, path, Some(&fitting), &[]).await;
    assert_eq!(answered.status, taken, "{answered:?}");
    refused
}

/// A PATCH of a daemon set's manifest too large for the store's one write (its document
/// and the change's audit record each holding it) is refused as its create is, naming
/// `manifest`, nothing written; one a little under the size given is taken.
#[tokio::test]
async fn a_daemon_set_patched_with_a_manifest_too_large_for_the_store_is_refused_naming_it() {
    let app = TestApp::new().await;
    let ds = json!({"manifest": MANIFEST, "node_selector": "", "timeout": "1s"});
    let created = app
        .json_request("POST", "/api/v1/daemonsets", Some(&ds), &[])
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let path = format!(
        "/api/v1/daemonsets/{}",
        created.json()["id"].as_str().unwrap()
    );
    let patch = |manifest: String| json!({ "manifest": manifest });
    let write = ("PATCH", path.as_str(), "manifest");
    refused_too_large_then_taken_fitting(&app, write, patch, StatusCode::OK).await;
}

/// A roll creating its new RC with a manifest too large for the store's one write (the
/// roll's, which holds it once more in a stand-in old RC) is refused naming
/// `new_rc.manifest`, nothing written; one a little under the size given is taken.
#[tokio::test]
async fn a_roll_creating_an_rc_with_a_manifest_too_large_for_the_store_is_refused_naming_it() {
    let app = TestApp::new().await;
    let rc = json!({"manifest": MANIFEST, "node_selector": "", "replicas_desired": 0});
    let created = app
        .json_request("POST", "/api/v1/rcs", Some(&rc), &[])
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let old_rc_id = created.json()["id"].as_str().unwrap().to_owned();
    let by_id = json!({"old_rc_id": old_rc_id, "desired_replicas": 0, "minimum_replicas": 0});
    let stand_in = json!({"old_rc_selector": "nothing=here", "desired_replicas": 0,
        "minimum_replicas": 0});
    for old in [by_id, stand_in] {
        let roll = |manifest: String| {
            let mut roll = old.clone();
            roll["new_rc"] = json!({"manifest": manifest, "node_selector": ""});
            roll
        };
        let write = ("POST", "/api/v1/rolls", "new_rc.manifest");
        refused_too_large_then_taken_fitting(&app, write, roll, StatusCode::CREATED).await;
    }
}

/// A node's report of a manifest too large for the store's one write (its value in base64)
/// is refused as an RC's is, naming `manifest`, nothing written; one a little under the
/// size given is taken.
#[tokio::test]
async fn a_reality_report_of_a_manifest_too_large_for_the_store_is_refused_naming_it() {
    let app = TestApp::new().await;
    let yaml = [("content-type", "application/yaml")];
    let path = "/api/v1/reality/n1/hello";
    let before = stored(&app).await;
    let refused = app.send_raw("PUT", path, &yaml, manifest_of(450_000)).await;
    assert_eq!(stored(&app).await, before, "{refused:?}");
    let largest = largest_allowed(&refused, "manifest");
    let reported = app
        .send_raw("PUT", path, &yaml, manifest_of(largest - ROUNDING))
        .await;
    assert_eq!(reported.status, StatusCode::NO_CONTENT, "{reported:?}");
}

/// A roll over an existing old RC that creates its new RC writes the old RC again, unchanged,
/// in its one write (to claim it): a new manifest too large for that write is told so with
/// the old RC named as what else that write holds, its manifest included, and one a little
/// under the size given is taken beside it.
#[tokio::test]
async fn a_roll_creating_an_rc_beside_a_large_old_rc_is_told_the_old_rc_is_written_too() {
    let app = TestApp::new().await;
    let rc = json!({"manifest": manifest_of(200_000), "node_selector": "",
        "replicas_desired": 0});
    let created = app
        .json_request("POST", "/api/v1/rcs", Some(&rc), &[])
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let old_rc_id = created.json()["id"].as_str().unwrap().to_owned();
    let roll = |manifest: String| {
        json!({"old_rc_id": old_rc_id, "desired_replicas": 0, "minimum_replicas": 0,
            "new_rc": {"manifest": manifest, "node_selector": ""}})
    };
    let write = ("POST", "/api/v1/rolls", "new_rc.manifest");
    let refused =
        refused_too_large_then_taken_fitting(&app, write, roll, StatusCode::CREATED).await;
    let message = &refused.error().causes[0].message;
    assert!(
        message.contains(&format!("the old RC {old_rc_id}, written again")),
        "{message}"
    );
    assert!(
        message.contains("its manifest of 200000 bytes"),
        "{message}"
    );
}
