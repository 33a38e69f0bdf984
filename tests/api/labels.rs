//! `/api/v1/labels`: reads, replaces, merge patches, deletes, selector lists with paging and
//! blocking, preconditions, validation, and the stored format.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use p2_apiserver::kv::TxnOp;
use serde_json::{json, Value};

use crate::support::api::{item_ids, times_out_at_its_index, TestApp, TestResponse};

const NODE: &str = "/api/v1/labels/node/node17.example.com";
const POD: &str = "/api/v1/labels/pod/node17.example.com/hello";

async fn put(app: &TestApp, path: &str, labels: Value) -> TestResponse {
    app.send_json("PUT", path, &[], &json!({ "labels": labels }))
        .await
}

async fn patch(app: &TestApp, path: &str, headers: &[(&str, &str)], body: Value) -> TestResponse {
    app.merge_patch(path, &body, headers).await
}

#[tokio::test]
async fn an_object_without_labels_has_an_empty_set_at_version_0() {
    let app = TestApp::new().await;
    let response = app.get(NODE).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("etag"), Some("\"0\""));
    assert_eq!(
        response.json(),
        json!({"type": "node", "id": "node17.example.com", "labels": {}, "resource_version": "0"})
    );
}

#[tokio::test]
async fn put_replaces_the_set_and_stores_p2s_json() {
    let app = TestApp::new().await;
    let first = put(&app, NODE, json!({"role": "web", "az": "us-west-2a"})).await;
    assert_eq!(first.status, StatusCode::OK);
    let pair = app
        .store
        .get("labels/node/node17.example.com")
        .await
        .unwrap()
        .unwrap();
    let version = pair.modify_index.to_string();
    assert_eq!(
        first.json(),
        json!({"type": "node", "id": "node17.example.com",
               "labels": {"az": "us-west-2a", "role": "web"}, "resource_version": version})
    );
    assert_eq!(
        first.header("etag"),
        Some(format!("\"{version}\"").as_str())
    );
    // P2's label object: compact JSON, string to string, keys sorted as Go writes them.
    assert_eq!(&*pair.value, br#"{"az":"us-west-2a","role":"web"}"#);

    let second = put(&app, NODE, json!({"tier": "front"})).await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.json()["labels"], json!({"tier": "front"}));
    let got = app.get(NODE).await;
    assert_eq!(got.json(), second.json());
    assert_eq!(got.header("etag"), second.header("etag"));
    assert_eq!(
        app.stored_text("labels/node/node17.example.com")
            .await
            .as_deref(),
        Some(r#"{"tier":"front"}"#)
    );
}

#[tokio::test]
async fn put_of_an_empty_set_removes_the_key() {
    let app = TestApp::new().await;
    put(&app, NODE, json!({"role": "web"})).await;
    let response = put(&app, NODE, json!({})).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.json()["labels"], json!({}));
    assert_eq!(response.json()["resource_version"], "0");
    assert_eq!(app.keys("labels/").await, Vec::<String>::new());
}

#[tokio::test]
async fn pod_ids_work_with_a_plain_or_encoded_slash() {
    let app = TestApp::new().await;
    let response = put(&app, POD, json!({"pod_id": "hello"})).await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    assert_eq!(response.json()["id"], "node17.example.com/hello");
    assert_eq!(
        app.keys("labels/").await,
        ["labels/pod/node17.example.com/hello"]
    );

    let encoded = "/api/v1/labels/pod/node17.example.com%2Fhello";
    let got = app.get(encoded).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.json(), response.json());

    let patched = patch(&app, encoded, &[], json!({"labels": {"color": "red"}})).await;
    assert_eq!(patched.status, StatusCode::OK);
    assert_eq!(
        patched.json()["labels"],
        json!({"color": "red", "pod_id": "hello"})
    );
    assert_eq!(app.get(POD).await.json(), patched.json());

    let listed = app.get("/api/v1/labels/pod").await;
    assert_eq!(item_ids(&listed.json()), ["node17.example.com/hello"]);

    let deleted = app.send_raw("DELETE", encoded, &[], "").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(app.keys("labels/").await, Vec::<String>::new());
}

#[tokio::test]
async fn every_label_type_works() {
    let app = TestApp::new().await;
    for (label_type, id) in [
        ("node", "node1"),
        ("pod", "node1/hello"),
        (
            "replication_controller",
            "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11",
        ),
        ("rolls", "9c41f7a2-0d3e-4b6a-8f1c-2e7d5a9b3c60"),
        ("pod_clusters", "1f6b2c9d-3e4a-4f5b-8c7d-9e0a1b2c3d4e"),
    ] {
        let path = format!("/api/v1/labels/{label_type}/{id}");
        let response = put(&app, &path, json!({"pod_id": "hello"})).await;
        assert_eq!(response.status, StatusCode::OK, "{label_type}");
        assert_eq!(response.json()["type"], label_type);
        assert!(app
            .stored_text(&format!("labels/{label_type}/{id}"))
            .await
            .is_some());
        let listed = app
            .get(&format!(
                "/api/v1/labels/{label_type}?selector=pod_id%3Dhello"
            ))
            .await;
        assert_eq!(item_ids(&listed.json()), [id], "{label_type}");
    }
}

#[tokio::test]
async fn an_unknown_type_is_404_everywhere_and_writes_nothing() {
    let app = TestApp::new().await;
    for path in [
        "/api/v1/labels/nodes/n1",
        "/api/v1/labels/daemon_set/n1",
        "/api/v1/labels/Node/n1",
    ] {
        for response in [
            app.get(path).await,
            put(&app, path, json!({"a": "b"})).await,
            patch(&app, path, &[], json!({"labels": {"a": "b"}})).await,
            app.send_raw("DELETE", path, &[], "").await,
        ] {
            assert_eq!(response.status, StatusCode::NOT_FOUND, "{path}");
            let error = response.error();
            assert!(error.message.contains("Invalid type provided"), "{error:?}");
            assert!(error.message.contains("pod_clusters"), "{error:?}");
        }
    }
    let listed = app.get("/api/v1/labels/replication_controllers").await;
    assert_eq!(listed.status, StatusCode::NOT_FOUND);
    assert_eq!(app.keys("labels/").await, Vec::<String>::new());
}

#[tokio::test]
async fn bad_ids_are_422_on_every_route_and_write_nothing() {
    let app = TestApp::new().await;
    let cases = [
        ("/api/v1/labels/node/a/b", "must not contain '/'"),
        ("/api/v1/labels/node/a%2Fb", "must not contain '/'"),
        ("/api/v1/labels/node/..", "\"..\" segment"),
        ("/api/v1/labels/node/%2E%2E", "\"..\" segment"),
        ("/api/v1/labels/node/a%00b", "control characters"),
        ("/api/v1/labels/node/a%20b", "whitespace"),
        ("/api/v1/labels/pod/hello", "<node>/<pod_id>"),
        ("/api/v1/labels/pod/n1/hello/extra", "has 2 '/'"),
        ("/api/v1/labels/pod/n1/", "both parts non-empty"),
        ("/api/v1/labels/pod/n1/..", "\"..\" segment"),
        (
            "/api/v1/labels/rolls/..%2F..%2Fsecrets",
            "must not contain '/'",
        ),
    ];
    for (path, message) in cases {
        for response in [
            app.get(path).await,
            put(&app, path, json!({"a": "b"})).await,
            patch(&app, path, &[], json!({"labels": {"a": "b"}})).await,
            app.send_raw("DELETE", path, &[], "").await,
        ] {
            assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{path}");
            let error = response.error();
            assert_eq!(error.causes.len(), 1, "{path}: {error:?}");
            assert_eq!(error.causes[0].field, "id");
            assert!(
                error.causes[0].message.contains(message),
                "{path}: {error:?}"
            );
        }
    }
    assert_eq!(app.keys("labels/").await, Vec::<String>::new());
}

#[tokio::test]
async fn bad_labels_are_all_reported_at_once_and_nothing_is_written() {
    let app = TestApp::new().await;
    put(&app, NODE, json!({"keep": "me"})).await;
    let before = app.stored_text("labels/node/node17.example.com").await;
    let long = "v".repeat(64);
    let bad = json!({
        "ok": "fine",
        "has space": "x",
        "-leading": "x",
        "UPPER.example.com/name": "x",
        "a/b/c": "x",
        "value": "not ok",
        "long": long,
    });
    let expected = [
        "labels.-leading",
        "labels.UPPER.example.com/name",
        "labels.a/b/c",
        "labels.has space",
        "labels.long",
        "labels.value",
    ];

    let response = put(&app, NODE, bad.clone()).await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.error().reason, "Invalid");
    assert_eq!(response.cause_fields(), expected);

    let response = patch(&app, NODE, &[], json!({ "labels": bad })).await;
    assert_eq!(response.unprocessable_fields(), expected);

    // A bad id and bad labels come back together.
    let response = put(&app, "/api/v1/labels/pod/hello", json!({"a b": "c"})).await;
    assert_eq!(response.cause_fields(), ["id", "labels.a b"]);

    assert_eq!(
        app.stored_text("labels/node/node17.example.com").await,
        before
    );
    assert_eq!(
        app.keys("labels/").await,
        ["labels/node/node17.example.com"]
    );
}

#[tokio::test]
async fn malformed_and_mistyped_bodies_are_refused_and_write_nothing() {
    let app = TestApp::new().await;
    let json_header = [("content-type", "application/json")];

    let malformed = app
        .send_raw("PUT", NODE, &json_header, "{\"labels\": ")
        .await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    malformed.error();

    let malformed = app.send_raw("PATCH", NODE, &json_header, "{labels}").await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    malformed.error();

    let not_an_object = patch(&app, NODE, &[], json!(["labels"])).await;
    assert_eq!(not_an_object.status, StatusCode::BAD_REQUEST);

    let text = [("content-type", "text/plain")];
    let body = json!({"labels": {"a": "b"}}).to_string();
    for method in ["PUT", "PATCH"] {
        let response = app.send_raw(method, NODE, &text, body.clone()).await;
        assert_eq!(
            response.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{method}"
        );
        response.error();
        let response = app.send_raw(method, NODE, &[], body.clone()).await;
        assert_eq!(
            response.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{method}"
        );
    }

    for shape in [
        json!({"labels": {"a": 1}}),
        json!({"label": {"a": "b"}}),
        json!({"labels": null}),
    ] {
        let response = app.send_json("PUT", NODE, &[], &shape).await;
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{shape}");
        response.error();
    }

    let response = patch(
        &app,
        NODE,
        &[],
        json!({"labels": {"n": 1, "b": true, "o": {}}, "type": "node"}),
    )
    .await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        response.cause_fields(),
        ["labels.b", "labels.n", "labels.o", "type"]
    );
    let response = patch(&app, NODE, &[], json!({"labels": "a=b"})).await;
    assert_eq!(response.cause_fields(), ["labels"]);

    assert_eq!(app.keys("labels/").await, Vec::<String>::new());
}

/// A PUT body holding more than `labels` (such as a read's `resource_version`, sent back in
/// the hope of a check-and-set) is refused, as a PATCH's is, rather than written unchecked.
#[tokio::test]
async fn put_refuses_fields_besides_labels_and_writes_nothing() {
    let app = TestApp::new().await;
    assert_eq!(
        put(&app, NODE, json!({"a": "b"})).await.status,
        StatusCode::OK
    );
    let before = app.dump().await;
    for extra in [
        json!({"labels": {"a": "c"}, "resource_version": "1"}),
        json!({"labels": {"a": "c"}, "type": "node", "id": "node17.example.com"}),
        json!({"labels": {"a": "c"}, "lables": {}}),
    ] {
        let response = app.send_json("PUT", NODE, &[], &extra).await;
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{extra}");
        response.error();
    }
    assert_eq!(app.dump().await, before);
}

#[tokio::test]
async fn patch_sets_removes_and_keeps() {
    let app = TestApp::new().await;
    put(
        &app,
        NODE,
        json!({"keep": "1", "change": "old", "gone": "x"}),
    )
    .await;
    let response = patch(
        &app,
        NODE,
        &[],
        json!({"labels": {"change": "new", "gone": null, "added": "2", "never-there": null}}),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK);
    let labels = json!({"added": "2", "change": "new", "keep": "1"});
    assert_eq!(response.json()["labels"], labels);
    assert_eq!(app.get(NODE).await.json()["labels"], labels);

    // An empty patch changes nothing; plain application/json is accepted.
    let version = response.json()["resource_version"].clone();
    let response = app.send_json("PATCH", NODE, &[], &json!({})).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.json()["resource_version"], version);
    assert_eq!(response.json()["labels"], labels);

    // `"labels": null` removes the member, that is every label.
    let response = patch(&app, NODE, &[], json!({"labels": null})).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.json()["labels"], json!({}));
    assert_eq!(app.keys("labels/").await, Vec::<String>::new());
}

#[tokio::test]
async fn patch_can_remove_a_bad_label_written_by_another_tool() {
    let app = TestApp::new().await;
    let key = "labels/node/node17.example.com";
    app.put_raw(key, br#"{"bad key":"a b","ok":"1"}"#).await;
    let response = patch(&app, NODE, &[], json!({"labels": {"bad key": null}})).await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    assert_eq!(app.stored_text(key).await.as_deref(), Some(r#"{"ok":"1"}"#));
}

#[tokio::test]
async fn a_document_written_by_p2_survives_get_and_patch() {
    let app = TestApp::new().await;
    let key = "labels/pod/node17.example.com/hello";
    let p2 = r#"{"availability_zone":"us-west-2a","cluster_name":"production","pod_id":"hello","replication_controller_id":"5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11"}"#;
    app.put_raw(key, p2.as_bytes()).await;
    let got = app.get(POD).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(
        got.json()["labels"],
        serde_json::from_str::<Value>(p2).unwrap()
    );
    let response = patch(
        &app,
        POD,
        &[],
        json!({"labels": {"cluster_name": "staging"}}),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(
        app.stored_text(key).await.unwrap(),
        p2.replace("production", "staging")
    );

    // Go writes a nil label map as `null`: an object with no labels.
    app.put_raw(key, b"null").await;
    let index = app.store.get(key).await.unwrap().unwrap().modify_index;
    let got = app.get(POD).await;
    assert_eq!(got.json()["labels"], json!({}));
    assert_eq!(got.json()["resource_version"], index.to_string());
    // A stored set, though empty: "0" is not its version, the one shown is.
    let body = json!({"labels": {"a": "1"}});
    let zero = app
        .send_json("PUT", POD, &[("if-match", "\"0\"")], &body)
        .await;
    assert_eq!(zero.status, StatusCode::PRECONDITION_FAILED, "{zero:?}");
    let shown = format!("\"{index}\"");
    let at_shown = app
        .send_json("PUT", POD, &[("if-match", &shown)], &body)
        .await;
    assert_eq!(at_shown.status, StatusCode::OK, "{at_shown:?}");
}

#[tokio::test]
async fn if_match_guards_every_write() {
    let app = TestApp::new().await;
    // "0" creates only while there is nothing.
    let created = app
        .send_json(
            "PUT",
            NODE,
            &[("if-match", "\"0\"")],
            &json!({"labels": {"a": "1"}}),
        )
        .await;
    assert_eq!(created.status, StatusCode::OK);
    let etag = created.header("etag").unwrap().to_string();
    let again = app
        .send_json(
            "PUT",
            NODE,
            &[("if-match", "\"0\"")],
            &json!({"labels": {"a": "2"}}),
        )
        .await;
    assert_eq!(again.status, StatusCode::PRECONDITION_FAILED);
    assert_eq!(again.error().reason, "PreconditionFailed");

    // A write moves the version on; the old ETag is then stale for every method.
    let updated = app
        .send_json(
            "PUT",
            NODE,
            &[("if-match", &etag)],
            &json!({"labels": {"a": "3"}}),
        )
        .await;
    assert_eq!(updated.status, StatusCode::OK);
    let current = updated.header("etag").unwrap().to_string();
    assert_ne!(current, etag);
    let before = app.stored_text("labels/node/node17.example.com").await;

    let stale_put = app
        .send_json(
            "PUT",
            NODE,
            &[("if-match", &etag)],
            &json!({"labels": {"a": "4"}}),
        )
        .await;
    let stale_patch = patch(
        &app,
        NODE,
        &[("if-match", &etag)],
        json!({"labels": {"a": "4"}}),
    )
    .await;
    let stale_delete = app
        .send_raw("DELETE", NODE, &[("if-match", &etag)], "")
        .await;
    for response in [stale_put, stale_patch, stale_delete] {
        assert_eq!(response.status, StatusCode::PRECONDITION_FAILED);
        assert!(response.error().message.contains("has changed"));
    }
    assert_eq!(
        app.stored_text("labels/node/node17.example.com").await,
        before
    );

    let bad = app
        .send_raw("DELETE", NODE, &[("if-match", "soon")], "")
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    bad.error();

    // The current version lets every write through; weak and bare forms are accepted.
    let bare = current.trim_matches('"');
    let patched = patch(
        &app,
        NODE,
        &[("if-match", &format!("W/{current}"))],
        json!({"labels": {"b": "2"}}),
    )
    .await;
    assert_eq!(patched.status, StatusCode::OK);
    assert_eq!(patched.json()["labels"], json!({"a": "3", "b": "2"}));
    let stale_bare = app
        .send_raw("DELETE", NODE, &[("if-match", bare)], "")
        .await;
    assert_eq!(stale_bare.status, StatusCode::PRECONDITION_FAILED);
    let latest = patched.header("etag").unwrap();
    let deleted = app
        .send_raw("DELETE", NODE, &[("if-match", latest)], "")
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(app.keys("labels/").await, Vec::<String>::new());

    // "0" on an object without labels: a delete that has nothing to do.
    let deleted = app
        .send_raw("DELETE", NODE, &[("if-match", "\"0\"")], "")
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
}

/// An `If-Match` tag other than the digits of a version this server issued (a sign, leading
/// zeros) is malformed, not read as the number it spells: by the tags' strong comparison
/// `"+5"` and `"05"` never match the ETag `"5"`, so no write may be let through by them.
#[tokio::test]
async fn if_match_takes_only_the_digits_of_an_issued_etag() {
    let app = TestApp::new().await;
    let written = put(&app, NODE, json!({"a": "1"})).await;
    let version = written.header("etag").unwrap().trim_matches('"').to_owned();
    let before = app.stored("labels/node/node17.example.com").await;
    for tag in [
        format!("\"+{version}\""),
        format!("\"0{version}\""),
        format!("W/\"+{version}\""),
        format!("+{version}"),
        format!("\"+{version}\", \"{version}\""),
    ] {
        let response = app
            .send_json(
                "PUT",
                NODE,
                &[("if-match", &tag)],
                &json!({"labels": {"a": "2"}}),
            )
            .await;
        assert_eq!(
            response.status,
            StatusCode::BAD_REQUEST,
            "{tag}: {response:?}"
        );
        assert!(
            response.error().message.starts_with("If-Match must be"),
            "{tag}"
        );
    }
    assert_eq!(app.stored("labels/node/node17.example.com").await, before);
}

#[tokio::test]
async fn delete_removes_every_label_and_is_idempotent() {
    let app = TestApp::new().await;
    put(&app, NODE, json!({"a": "1", "b": "2"})).await;
    put(&app, "/api/v1/labels/node/other", json!({"a": "1"})).await;
    for _ in 0..2 {
        let response = app.send_raw("DELETE", NODE, &[], "").await;
        assert_eq!(response.status, StatusCode::NO_CONTENT);
        assert!(response.body.is_empty());
    }
    assert_eq!(app.keys("labels/").await, ["labels/node/other"]);
    assert_eq!(app.get(NODE).await.json()["labels"], json!({}));
}

#[tokio::test]
async fn unsupported_methods_are_405() {
    let app = TestApp::new().await;
    let response = app.send_json("POST", NODE, &[], &json!({})).await;
    assert_eq!(response.status, StatusCode::METHOD_NOT_ALLOWED);
    response.error();
}

async fn label_nodes(app: &TestApp) {
    for (node, labels) in [
        ("n1", json!({"role": "web", "az": "a"})),
        ("n2", json!({"role": "db", "az": "a"})),
        ("n3", json!({"role": "web", "az": "b", "draining": "true"})),
        ("n4", json!({"az": "b"})),
        ("n5", json!({"role": "worker", "az": "b"})),
    ] {
        let response = put(app, &format!("/api/v1/labels/node/{node}"), labels).await;
        assert_eq!(response.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn list_filters_by_selector() {
    let app = TestApp::new().await;
    label_nodes(&app).await;
    put(&app, POD, json!({"role": "web"})).await;
    let cases = [
        ("", vec!["n1", "n2", "n3", "n4", "n5"]),
        ("role%3Dweb", vec!["n1", "n3"]),
        ("role%3D%3Dweb", vec!["n1", "n3"]),
        ("role!%3Dweb", vec!["n2", "n4", "n5"]),
        ("role%20in%20(web,db),!draining", vec!["n1", "n2"]),
        ("role%20notin%20(web)", vec!["n2", "n4", "n5"]),
        ("draining", vec!["n3"]),
        ("az%3Db,role", vec!["n3", "n5"]),
        ("az%3Dc", vec![]),
    ];
    for (selector, expected) in cases {
        let response = app
            .get(&format!("/api/v1/labels/node?selector={selector}"))
            .await;
        assert_eq!(response.status, StatusCode::OK, "{selector}");
        assert_eq!(item_ids(&response.json()), expected, "{selector}");
        assert_eq!(response.json()["continue"], Value::Null);
    }
    let response = app.get("/api/v1/labels/node?selector=role%3Dweb").await;
    assert_eq!(
        response.json()["items"][0],
        json!({"type": "node", "id": "n1", "labels": {"role": "web", "az": "a"}})
    );
    let listing = app.store.list("labels/node/").await.unwrap();
    assert_eq!(response.x_index(), listing.index);
}

#[tokio::test]
async fn bad_selectors_are_422_with_the_parser_message() {
    let app = TestApp::new().await;
    for selector in [
        "role%20in%20web",
        "a%3D%3D%3Db",
        "(",
        "role%3Db%20c",
        "UP%2F%2Fx",
    ] {
        let response = app
            .get(&format!("/api/v1/labels/node?selector={selector}"))
            .await;
        assert_eq!(
            response.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{selector}"
        );
        let error = response.error();
        assert_eq!(error.causes.len(), 1);
        assert_eq!(error.causes[0].field, "selector");
        assert!(
            error.causes[0]
                .message
                .starts_with("invalid selector at position"),
            "{error:?}"
        );
    }
}

#[tokio::test]
async fn list_pages_through_every_match_once() {
    let app = TestApp::new().await;
    label_nodes(&app).await;
    let pages = app.pages("/api/v1/labels/node?limit=2&selector=az").await;
    assert_eq!(pages.len(), 3);
    let mut seen = Vec::new();
    for page in &pages {
        let ids = item_ids(page);
        assert!(ids.len() <= 2);
        seen.extend(ids);
    }
    assert_eq!(seen, ["n1", "n2", "n3", "n4", "n5"]);

    for query in ["limit=0", "limit=1001", "continue=%25%25"] {
        let response = app.get(&format!("/api/v1/labels/node?{query}")).await;
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY, "{query}");
    }
    let response = app.get("/api/v1/labels/node?limit=two").await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    response.error();
}

#[tokio::test]
async fn a_blocking_list_wakes_on_a_change_of_its_type() {
    let app = Arc::new(TestApp::new().await);
    put(&app, NODE, json!({"role": "web"})).await;
    let first = app.get("/api/v1/labels/node?selector=role%3Dweb").await;
    let index = first.x_index();

    let path = format!("/api/v1/labels/node?selector=role%3Dweb&index={index}&wait=5s");
    let waiting = app.get_held(path).await;
    // A change of another type does not wake it.
    put(&app, POD, json!({"role": "web"})).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    waiting.assert_held("another type's change must not wake it");

    put(&app, "/api/v1/labels/node/n2", json!({"role": "web"})).await;
    let response = waiting.woken("woken by the change").await;
    assert_eq!(response.status, StatusCode::OK);
    assert!(response.x_index() > index);
    assert_eq!(item_ids(&response.json()), ["n2", "node17.example.com"]);
}

#[tokio::test]
async fn a_blocking_list_times_out_with_the_same_index() {
    let app = TestApp::new().await;
    put(&app, NODE, json!({"role": "web"})).await;
    let index = app.get("/api/v1/labels/node").await.x_index();
    let (response, held) = times_out_at_its_index(&app, "/api/v1/labels/node?", index).await;
    assert!(held >= Duration::from_millis(200));
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(item_ids(&response.json()), ["node17.example.com"]);

    // An empty type has an index too.
    let empty = app.get("/api/v1/labels/rolls").await;
    assert_eq!(item_ids(&empty.json()), Vec::<String>::new());
    empty.x_index();
    // An emptied one blocks the same way (one never written too:
    // `mirror_reads::an_empty_listing_is_not_woken_by_a_write_elsewhere`).
    let roll = "/api/v1/labels/rolls/r1";
    put(&app, roll, json!({"team": "a"})).await;
    let deleted = app.send_raw("DELETE", roll, &[], "").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    // The store answers a delete without its index: the mirror holds the delete at once and
    // its index once the watch brings it.
    app.mirrored("labels/rolls/r1").await;
    let emptied = app.get("/api/v1/labels/rolls").await;
    assert_eq!(item_ids(&emptied.json()), Vec::<String>::new());
    let index = emptied.x_index();
    let response = app
        .get(&format!("/api/v1/labels/rolls?index={index}&wait=100ms"))
        .await;
    assert_eq!(response.x_index(), index);

    let response = app
        .get(&format!("/api/v1/labels/node?index={index}&wait=11m"))
        .await;
    assert_eq!(response.unprocessable_fields(), ["wait"]);
}

/// Fifty writers adding a key each to one object's labels at once: every write answers 200
/// (losing a check-and-set race is retried, never a 503) and every key is there at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_patches_of_different_keys_all_survive() {
    const WRITERS: usize = 50;
    let app = Arc::new(TestApp::new().await);
    put(&app, NODE, json!({"base": "1"})).await;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                patch(
                    &app,
                    NODE,
                    &[],
                    json!({"labels": {format!("k{i}"): format!("v{i}")}}),
                )
                .await
            })
        })
        .collect();
    for task in tasks {
        let response = task.await.unwrap();
        assert_eq!(response.status, StatusCode::OK, "{response:?}");
    }
    let labels = app.get(NODE).await.json()["labels"].clone();
    let keys: BTreeSet<String> = labels.as_object().unwrap().keys().cloned().collect();
    let mut expected: BTreeSet<String> = (0..WRITERS).map(|i| format!("k{i}")).collect();
    expected.insert("base".to_string());
    assert_eq!(keys, expected);
    for i in 0..WRITERS {
        assert_eq!(labels[format!("k{i}")], format!("v{i}"));
    }
}

/// The 412 of `If-Match: *` on [`NODE`] while it has no label set, which names the label set
/// (not the node, which may well exist) as what must exist.
const NO_LABEL_SET: &str =
    "If-Match: * needs the label set of node \"node17.example.com\" to exist, and it does not";

/// `If-Match` may list ETags, any of which the labels may be at, and `*` asks only that there
/// be labels.
#[tokio::test]
async fn if_match_takes_a_list_of_etags_or_any_version() {
    let app = TestApp::new().await;
    let labels = |value: &str| json!({"labels": {"a": value}});
    let none = app
        .send_json("PUT", NODE, &[("if-match", "*")], &labels("1"))
        .await;
    assert_eq!(none.status, StatusCode::PRECONDITION_FAILED, "{none:?}");
    assert_eq!(none.error().message, NO_LABEL_SET);
    assert_eq!(app.keys("labels/").await, Vec::<String>::new());

    let created = app.send_json("PUT", NODE, &[], &labels("1")).await;
    let first = created.header("etag").unwrap().to_owned();
    let listed = format!("W/\"1\", \"1\", {first}");
    let patched = patch(&app, NODE, &[("if-match", &listed)], labels("2")).await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    assert_eq!(patched.json()["labels"], json!({"a": "2"}));

    let before = app.stored_text("labels/node/node17.example.com").await;
    let stale = patch(&app, NODE, &[("if-match", &listed)], labels("3")).await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED, "{stale:?}");
    assert!(stale.error().message.contains("has changed"));
    assert_eq!(
        app.stored_text("labels/node/node17.example.com").await,
        before
    );

    let any = patch(&app, NODE, &[("if-match", "*")], labels("4")).await;
    assert_eq!(any.status, StatusCode::OK, "{any:?}");
    assert_eq!(any.json()["labels"], json!({"a": "4"}));
    let mixed = app
        .send_raw("DELETE", NODE, &[("if-match", "*, \"1\"")], "")
        .await;
    assert_eq!(mixed.status, StatusCode::BAD_REQUEST, "{mixed:?}");
    mixed.error();
    let deleted = app.send_raw("DELETE", NODE, &[("if-match", "*")], "").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(app.keys("labels/").await, Vec::<String>::new());
}

/// `If-Match: *` asks only that there be labels: another writer's change landing after the
/// condition is read leaves it true, so the patch applies to the newer labels (as one
/// without `If-Match` does) rather than answer 412 for a version the client never named.
#[tokio::test]
async fn if_match_any_holds_while_another_writer_changes_the_labels() {
    let (app, counting) = TestApp::counted().await;
    let created = put(&app, NODE, json!({"a": "1"})).await;
    assert_eq!(created.status, StatusCode::OK, "{created:?}");
    let key = "labels/node/node17.example.com";
    counting.after_next_get_of(
        key,
        vec![TxnOp::Set {
            key: key.to_owned(),
            value: br#"{"a":"1","b":"2"}"#.to_vec(),
        }],
    );
    let patched = patch(
        &app,
        NODE,
        &[("if-match", "*")],
        json!({"labels": {"c": "3"}}),
    )
    .await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    assert_eq!(
        patched.json()["labels"],
        json!({"a": "1", "b": "2", "c": "3"})
    );
    assert_eq!(
        app.stored_json(key).await,
        Some(json!({"a": "1", "b": "2", "c": "3"}))
    );

    // Labels removed meanwhile no longer hold it: 412, and nothing is created.
    counting.after_next_get_of(
        key,
        vec![TxnOp::Delete {
            key: key.to_owned(),
        }],
    );
    let gone = patch(
        &app,
        NODE,
        &[("if-match", "*")],
        json!({"labels": {"d": "4"}}),
    )
    .await;
    assert_eq!(gone.status, StatusCode::PRECONDITION_FAILED, "{gone:?}");
    assert_eq!(gone.error().message, NO_LABEL_SET);
    assert_eq!(app.stored_json(key).await, None);
}

/// A selection of pod labels is the same from the mirror (through its label index when a
/// requirement names a value), from the store, and through P2's `/api/select`: an empty or
/// unreadable set is matched only by what matches the empty set.
#[tokio::test]
async fn a_selection_is_the_same_from_the_mirror_the_store_and_p2s_select() {
    let app = TestApp::new().await;
    app.put_json("labels/pod/n1/a", &json!({"rc": "x", "team": "a"}))
        .await;
    app.put_json("labels/pod/n1/b", &json!({"rc": "y"})).await;
    app.put_raw("labels/pod/n2/a", "null").await;
    app.put_raw("labels/pod/n2/b", "{not json").await;
    app.put_json("labels/pod/n3/a", &json!({"rc": "x", "team": ""}))
        .await;
    let selectors = [
        ("rc%3Dx", vec!["n1/a", "n3/a"]),
        ("rc%20in%20(x%2Cy)", vec!["n1/a", "n1/b", "n3/a"]),
        ("rc%3D%3Dx%2Cteam%3Da", vec!["n1/a"]),
        ("team%3D", vec!["n3/a"]),
        ("%21rc", vec!["n2/a"]),
        ("rc%21%3Dx", vec!["n1/b", "n2/a"]),
        ("team", vec!["n1/a", "n3/a"]),
    ];
    for (selector, expected) in selectors {
        let ids = |items: &Value| -> Vec<String> {
            let items = items.as_array().unwrap().iter();
            items
                .map(|i| i["id"].as_str().unwrap().to_owned())
                .collect()
        };
        let mirrored = app
            .get(&format!("/api/v1/labels/pod?selector={selector}"))
            .await
            .json();
        let stored = app
            .get(&format!(
                "/api/v1/labels/pod?selector={selector}&consistent=true"
            ))
            .await
            .json();
        let p2 = app
            .get(&format!("/api/select?type=pod&selector={selector}"))
            .await
            .json();
        assert_eq!(ids(&mirrored["items"]), expected, "{selector}");
        assert_eq!(mirrored["items"], stored["items"], "{selector}");
        assert_eq!(mirrored["items"], p2, "{selector}");
    }
}

/// The label sets and values a client sends are documented as the server checks them: every
/// body field of labels refers to the `LabelSet` component, whose key pattern and whose
/// values' `LabelValue` pattern take exactly the keys and values the server takes (but a
/// prefix over 253 characters, which the words rule out), so that a tool or SDK checking
/// labels against the document sends none the server refuses with 422.
#[test]
fn label_sets_are_documented_as_the_server_checks_them() {
    use p2_apiserver::labels::{validate_label_key, validate_label_value};
    let (_, openapi) = p2_apiserver::router::api().split_for_parts();
    let doc = serde_json::to_value(&openapi).unwrap();
    let schemas = &doc["components"]["schemas"];
    let set = json!({"$ref": "#/components/schemas/LabelSet"});
    let mut found = Vec::new();
    for (component, field) in [
        ("ReplaceLabels", "labels"),
        ("RcSpec", "pod_labels"),
        ("RcSpec", "labels"),
        ("CreateRoll", "labels"),
        ("CreateRoll", "new_rc_labels"),
        ("SetLabelsRequest", "values"),
    ] {
        let schema = &schemas[component]["properties"][field];
        let choices = schema["oneOf"].as_array().cloned().unwrap_or_default();
        let refers = |schema: &Value| schema["$ref"] == set["$ref"];
        if !refers(schema) && !choices.iter().any(refers) {
            found.push(format!("{component}.{field} is {schema}"));
        }
    }
    let value = &schemas["SetLabelRequest"]["properties"]["value"];
    if value["$ref"] != "#/components/schemas/LabelValue" {
        found.push(format!("SetLabelRequest.value is {value}"));
    }
    let pattern = |schema: &Value| {
        let pattern = schema["pattern"].as_str().unwrap_or("^$never");
        regex::Regex::new(pattern).unwrap()
    };
    let keys = pattern(&schemas["LabelSet"]["propertyNames"]);
    let values = pattern(&schemas["LabelValue"]);
    let name = "n".repeat(63);
    let samples = [
        "",
        "a",
        "A9",
        "a-b_c.d",
        "-a",
        "a-",
        ".a",
        "a.",
        "a b",
        "é",
        "a/b",
        "x.io/a",
        "X.io/a",
        "x..io/a",
        "-x.io/a",
        "x-.io/a",
        "x.io/",
        "/a",
        "a/b/c",
        "x.io/-a",
        &name,
        &format!("{name}n"),
        &format!("x.io/{name}"),
    ];
    for sample in samples {
        let key_taken = validate_label_key(sample).is_ok();
        if keys.is_match(sample) != key_taken {
            found.push(format!("key {sample:?} taken by the server: {key_taken}"));
        }
        let value_taken = validate_label_value(sample).is_ok();
        if values.is_match(sample) != value_taken {
            found.push(format!(
                "value {sample:?} taken by the server: {value_taken}"
            ));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// A label write refused for its `If-Match` names what changed in a sentence that reads.
#[tokio::test]
async fn a_stale_label_write_says_the_label_set_changed() {
    let app = TestApp::new().await;
    let path = "/api/v1/labels/node/node1";
    let created = app
        .send_json("PUT", path, &[], &json!({"labels": {"a": "1"}}))
        .await;
    assert_eq!(created.status, StatusCode::OK);
    let stale = app
        .send_json(
            "PUT",
            path,
            &[("if-match", "\"1\"")],
            &json!({"labels": {"a": "2"}}),
        )
        .await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED);
    assert_eq!(
        stale.error().message,
        "the label set of node \"node1\" has changed since version 1; read it again and retry"
    );
}

#[tokio::test]
async fn an_rcs_pod_id_label_stays_its_manifest_id() {
    let app = TestApp::new().await;
    let spec = json!({"manifest": "id: hello\nlaunchables: {}\n", "node_selector": "",
        "replicas_desired": 0});
    let created = app
        .json_request("POST", "/api/v1/rcs", Some(&spec), &[])
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let v1 = format!("/api/v1/labels/replication_controller/{id}");
    let p2 = format!("/api/labels/replication_controller/{id}");
    let key = format!("labels/replication_controller/{id}");
    let stored = app.store.get(&key).await.unwrap().unwrap();

    // Every route that would change or remove it is refused, naming it, and writes nothing.
    let refused = [
        ("PUT", v1.clone(), Some(json!({"labels": {"team": "a"}}))),
        (
            "PATCH",
            v1.clone(),
            Some(json!({"labels": {"pod_id": "goodbye"}})),
        ),
        (
            "PATCH",
            v1.clone(),
            Some(json!({"labels": {"pod_id": null}})),
        ),
        ("PATCH", v1.clone(), Some(json!({"labels": null}))),
        ("DELETE", v1.clone(), None),
        (
            "PUT",
            p2.clone(),
            Some(json!({"values": {"pod_id": "goodbye"}})),
        ),
        (
            "PUT",
            format!("{p2}/pod_id"),
            Some(json!({"value": "goodbye"})),
        ),
        ("DELETE", format!("{p2}/pod_id"), None),
        ("DELETE", p2.clone(), None),
    ];
    for (method, path, body) in refused {
        let response = if method == "PATCH" {
            patch(&app, &path, &[], body.unwrap()).await
        } else {
            app.json_request(method, &path, body.as_ref(), &[]).await
        };
        assert_eq!(
            response.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{method} {path}: {response:?}"
        );
        assert_eq!(
            response.cause_fields(),
            ["labels.pod_id"],
            "{method} {path}"
        );
        let now = app.store.get(&key).await.unwrap().unwrap();
        assert_eq!(now.modify_index, stored.modify_index, "{method} {path}");
    }

    // Writes that keep it go through.
    let kept = patch(&app, &v1, &[], json!({"labels": {"team": "a"}})).await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
    let kept = put(&app, &v1, json!({"pod_id": "hello", "team": "b"})).await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
    assert_eq!(
        kept.json()["labels"],
        json!({"pod_id": "hello", "team": "b"})
    );

    // An RC that does not exist has no manifest id to keep.
    let missing = "/api/v1/labels/replication_controller/5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11";
    let written = put(&app, missing, json!({"pod_id": "goodbye"})).await;
    assert_eq!(written.status, StatusCode::OK, "{written:?}");
}
