//! P2's own label routes (`/api/labels`, `/api/select`): P2's shapes and statuses, pod ids
//! with `/`, validation and 4xx for bad bodies.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::support::api::{TestApp, TestResponse};

async fn put(app: &TestApp, path: &str, body: Value) -> TestResponse {
    app.send_json("PUT", path, &[], &body).await
}

async fn delete(app: &TestApp, path: &str) -> TestResponse {
    app.send_raw("DELETE", path, &[], "").await
}

fn ids(response: &TestResponse) -> Vec<String> {
    response
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["id"].as_str().unwrap().to_string())
        .collect()
}

async fn label_nodes(app: &TestApp) {
    app.put_raw("labels/node/n1", r#"{"az":"a","role":"web"}"#)
        .await;
    app.put_raw("labels/node/n2", r#"{"az":"a","role":"db"}"#)
        .await;
    app.put_raw("labels/node/n3", r#"{"az":"b","role":"web"}"#)
        .await;
    app.put_raw("labels/pod/n1/hello", r#"{"role":"web"}"#)
        .await;
}

#[tokio::test]
async fn select_answers_p2s_array_of_labeled_objects() {
    let app = TestApp::new().await;
    label_nodes(&app).await;
    let response = app
        .get("/api/select?selector=role%3Dweb&type=node&cachedMatch=true")
        .await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(
        response.json(),
        json!([
            {"type": "node", "id": "n1", "labels": {"az": "a", "role": "web"}},
            {"type": "node", "id": "n3", "labels": {"az": "b", "role": "web"}}
        ])
    );
    let cases = [
        ("selector=role%20in%20(db)&type=node", vec!["n2"]),
        ("type=node", vec!["n1", "n2", "n3"]),
        (
            "selector=&type=node&cachedMatch=false",
            vec!["n1", "n2", "n3"],
        ),
        ("selector=role%3Dweb&type=pod", vec!["n1/hello"]),
        ("selector=!role&type=node", vec![]),
    ];
    for (query, expected) in cases {
        let response = app.get(&format!("/api/select?{query}")).await;
        assert_eq!(response.status, StatusCode::OK, "{query}");
        assert_eq!(ids(&response), expected, "{query}");
    }
}

#[tokio::test]
async fn select_over_a_type_without_labels_is_empty() {
    let app = TestApp::new().await;
    let response = app.get("/api/select?selector=a%3Db&type=rolls").await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.json(), json!([]));
}

#[tokio::test]
async fn select_refuses_a_bad_type_or_selector_with_400() {
    let app = TestApp::new().await;
    label_nodes(&app).await;
    for (query, message) in [
        ("selector=a%3Db", "Invalid type provided"),
        ("selector=a%3Db&type=nodes", "Invalid type provided"),
        (
            "selector=a%20in%20b&type=node",
            "invalid selector at position",
        ),
        ("selector=%3D%3D&type=node", "invalid selector at position"),
    ] {
        let response = app.get(&format!("/api/select?{query}")).await;
        assert_eq!(response.status, StatusCode::BAD_REQUEST, "{query}");
        let error = response.error();
        assert!(error.message.contains(message), "{query}: {error:?}");
    }
}

#[tokio::test]
async fn list_answers_every_object_or_404_when_the_type_has_none() {
    let app = TestApp::new().await;
    let empty = app.get("/api/labels/node").await;
    assert_eq!(empty.status, StatusCode::NOT_FOUND);
    assert!(empty.error().message.contains("no labels found"));

    label_nodes(&app).await;
    let response = app.get("/api/labels/node").await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(ids(&response), ["n1", "n2", "n3"]);
    assert_eq!(
        response.json()[1],
        json!({"type": "node", "id": "n2", "labels": {"az": "a", "role": "db"}})
    );

    let response = app.get("/api/labels/pods").await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    assert!(response.error().message.contains("Invalid type provided"));
}

#[tokio::test]
async fn get_answers_labels_and_index() {
    let app = TestApp::new().await;
    label_nodes(&app).await;
    let index = app
        .store
        .get("labels/pod/n1/hello")
        .await
        .unwrap()
        .unwrap()
        .modify_index;
    let expected =
        json!({"type": "pod", "id": "n1/hello", "labels": {"role": "web"}, "index": index});
    for path in ["/api/labels/pod/n1/hello", "/api/labels/pod/n1%2Fhello"] {
        let response = app.get(path).await;
        assert_eq!(response.status, StatusCode::OK, "{path}");
        assert_eq!(response.json(), expected, "{path}");
    }
    let absent = app.get("/api/labels/node/nowhere").await;
    assert_eq!(
        absent.json(),
        json!({"type": "node", "id": "nowhere", "labels": {}, "index": 0})
    );
}

#[tokio::test]
async fn bad_types_and_ids_are_400_on_every_object_route_and_write_nothing() {
    let app = TestApp::new().await;
    let cases = [
        ("/api/labels/nodes/n1", "Invalid type provided"),
        ("/api/labels/pod/hello", "<node>/<pod_id>"),
        ("/api/labels/node/..", "\"..\" segment"),
        ("/api/labels/node/%2E%2E", "\"..\" segment"),
        ("/api/labels/node/a%20b", "whitespace"),
        ("/api/labels/pod/n1%2F", "both parts non-empty"),
        ("/api/labels/pod/..%2Fx", "\"..\" segment"),
    ];
    for (path, message) in cases {
        for response in [
            app.get(path).await,
            put(&app, path, json!({"values": {"a": "b"}})).await,
            delete(&app, path).await,
        ] {
            assert_eq!(response.status, StatusCode::BAD_REQUEST, "{path}");
            let error = response.error();
            assert!(error.message.contains(message), "{path}: {error:?}");
        }
    }
    for (path, message) in [
        ("/api/labels/nodes/n1/color", "Invalid type provided"),
        ("/api/labels/pod/n1//color", "both parts non-empty"),
        ("/api/labels/node/../color", "\"..\" segment"),
        ("/api/labels/node/n1/", "Name was not passed"),
        ("/api/labels/pod/n1/hello/", "Name was not passed"),
    ] {
        for response in [
            put(&app, path, json!({"value": "red"})).await,
            delete(&app, path).await,
        ] {
            assert_eq!(response.status, StatusCode::BAD_REQUEST, "{path}");
            let error = response.error();
            assert!(error.message.contains(message), "{path}: {error:?}");
        }
    }
    assert_eq!(app.keys("labels/").await, Vec::<String>::new());
}

#[tokio::test]
async fn put_of_a_set_merges() {
    let app = TestApp::new().await;
    app.put_raw("labels/node/n1", r#"{"a":"1","b":"2"}"#).await;
    let response = put(
        &app,
        "/api/labels/node/n1",
        json!({"values": {"b": "3", "c": "4"}}),
    )
    .await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    assert!(response.body.is_empty());
    // P2's label object, exactly.
    assert_eq!(
        app.stored_text("labels/node/n1").await.as_deref(),
        Some(r#"{"a":"1","b":"3","c":"4"}"#)
    );

    // A Go client's nil map arrives as null and changes nothing.
    let response = put(&app, "/api/labels/node/n1", json!({"values": null})).await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.stored_text("labels/node/n1").await.as_deref(),
        Some(r#"{"a":"1","b":"3","c":"4"}"#)
    );
}

#[tokio::test]
async fn pod_ids_work_with_a_plain_or_encoded_slash() {
    let app = TestApp::new().await;
    let key = "labels/pod/node17.example.com/hello";
    let response = put(
        &app,
        "/api/labels/pod/node17.example.com/hello",
        json!({"values": {"pod_id": "hello"}}),
    )
    .await;
    assert_eq!(response.status, StatusCode::NO_CONTENT, "{response:?}");
    let response = put(
        &app,
        "/api/labels/pod/node17.example.com%2Fhello",
        json!({"values": {"cluster_name": "production"}}),
    )
    .await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    for path in [
        "/api/labels/pod/node17.example.com/hello/color",
        "/api/labels/pod/node17.example.com%2Fhello/size",
    ] {
        let response = put(&app, path, json!({"value": "x"})).await;
        assert_eq!(response.status, StatusCode::NO_CONTENT, "{path}");
    }
    assert_eq!(
        app.stored_text(key).await.as_deref(),
        Some(r#"{"cluster_name":"production","color":"x","pod_id":"hello","size":"x"}"#)
    );
    assert_eq!(app.keys("labels/").await, [key]);

    let response = delete(&app, "/api/labels/pod/node17.example.com%2Fhello/color").await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    let response = delete(&app, "/api/labels/pod/node17.example.com/hello/size").await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.stored_text(key).await.as_deref(),
        Some(r#"{"cluster_name":"production","pod_id":"hello"}"#)
    );
    let response = delete(&app, "/api/labels/pod/node17.example.com%2Fhello").await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    assert_eq!(app.keys("labels/").await, Vec::<String>::new());
}

/// P2's label client query-escapes an id before putting it in the path, so a pod id's `/`
/// arrives as `%252F`, and P2's server unescapes it twice.
#[tokio::test]
async fn pod_ids_escaped_twice_as_p2s_client_sends_them_are_read_and_written() {
    let app = TestApp::new().await;
    app.put_raw("labels/pod/node9/hello", r#"{"pod_id":"hello"}"#)
        .await;
    let response = app.get("/api/labels/pod/node9%252Fhello").await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    assert_eq!(response.json()["id"], "node9/hello");
    assert_eq!(response.json()["labels"], json!({"pod_id": "hello"}));

    let response = put(
        &app,
        "/api/labels/pod/node9%252Fhello",
        json!({"values": {"cluster_name": "production"}}),
    )
    .await;
    assert_eq!(response.status, StatusCode::NO_CONTENT, "{response:?}");
    // A prefixed name escaped the same way.
    let response = put(
        &app,
        "/api/labels/pod/node9%252Fhello/example.com%252Frole",
        json!({"value": "web"}),
    )
    .await;
    assert_eq!(response.status, StatusCode::NO_CONTENT, "{response:?}");
    assert_eq!(
        app.stored_text("labels/pod/node9/hello").await.as_deref(),
        Some(r#"{"cluster_name":"production","example.com/role":"web","pod_id":"hello"}"#)
    );
    let response = delete(&app, "/api/labels/pod/node9%252Fhello/cluster_name").await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    assert_eq!(app.keys("labels/").await, ["labels/pod/node9/hello"]);

    // `%` and `+` in an id travel escaped once more too; a bare `+` is a space.
    let response = put(
        &app,
        "/api/labels/node/100%2525%252Bup",
        json!({"values": {"a": "b"}}),
    )
    .await;
    assert_eq!(response.status, StatusCode::NO_CONTENT, "{response:?}");
    assert_eq!(
        app.get("/api/labels/node/100%2525%252Bup").await.json()["id"],
        "100%+up"
    );
    for path in ["/api/labels/node/a+b", "/api/labels/node/a%25zz"] {
        let response = app.get(path).await;
        assert_eq!(response.status, StatusCode::BAD_REQUEST, "{path}");
        response.error();
    }
    assert_eq!(
        app.keys("labels/").await,
        ["labels/node/100%+up", "labels/pod/node9/hello"]
    );
}

/// P2's server reads a PUT body as JSON whatever its content type, and P2's tools rely on it.
#[tokio::test]
async fn put_bodies_are_read_without_or_with_any_content_type() {
    let app = TestApp::new().await;
    let cases = [
        (&[][..], "/api/labels/node/n1", r#"{"values":{"a":"1"}}"#),
        (&[][..], "/api/labels/node/n1/b", r#"{"value":"2"}"#),
        (
            &[("content-type", "text/plain")][..],
            "/api/labels/node/n1/c",
            r#"{"value":"3"}"#,
        ),
    ];
    for (headers, path, body) in cases {
        let response = app.send_raw("PUT", path, headers, body).await;
        assert_eq!(
            response.status,
            StatusCode::NO_CONTENT,
            "{path}: {response:?}"
        );
    }
    assert_eq!(
        app.stored_text("labels/node/n1").await.as_deref(),
        Some(r#"{"a":"1","b":"2","c":"3"}"#)
    );
    let response = app.send_raw("PUT", "/api/labels/node/n1", &[], "{").await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    response.error();
    let response = app.send_raw("PUT", "/api/labels/node/n1", &[], "{}").await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    response.error();
    assert_eq!(
        app.stored_text("labels/node/n1").await.as_deref(),
        Some(r#"{"a":"1","b":"2","c":"3"}"#)
    );
}

#[tokio::test]
async fn one_label_is_set_and_removed_by_name() {
    let app = TestApp::new().await;
    app.put_raw("labels/node/n1", r#"{"keep":"1"}"#).await;
    // A prefixed name may carry its '/' encoded, as P2's client sends it, or as is.
    for path in [
        "/api/labels/node/n1/color",
        "/api/labels/node/n1/example.com%2Frole",
        "/api/labels/node/n1/example.com/tier",
    ] {
        let response = put(&app, path, json!({"value": "v"})).await;
        assert_eq!(response.status, StatusCode::NO_CONTENT, "{path}");
    }
    assert_eq!(
        app.stored_text("labels/node/n1").await.as_deref(),
        Some(r#"{"color":"v","example.com/role":"v","example.com/tier":"v","keep":"1"}"#)
    );
    for path in [
        "/api/labels/node/n1/color",
        "/api/labels/node/n1/example.com%2Frole",
        "/api/labels/node/n1/example.com/tier",
        "/api/labels/node/n1/never-there",
    ] {
        let response = delete(&app, path).await;
        assert_eq!(response.status, StatusCode::NO_CONTENT, "{path}");
    }
    assert_eq!(
        app.stored_text("labels/node/n1").await.as_deref(),
        Some(r#"{"keep":"1"}"#)
    );
    // Removing the last label removes the key, as P2 does.
    let response = delete(&app, "/api/labels/node/n1/keep").await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    assert_eq!(app.keys("labels/").await, Vec::<String>::new());
}

#[tokio::test]
async fn delete_removes_every_label() {
    let app = TestApp::new().await;
    label_nodes(&app).await;
    for _ in 0..2 {
        let response = delete(&app, "/api/labels/node/n2").await;
        assert_eq!(response.status, StatusCode::NO_CONTENT);
    }
    assert_eq!(
        app.keys("labels/").await,
        ["labels/node/n1", "labels/node/n3", "labels/pod/n1/hello"]
    );
}

#[tokio::test]
async fn a_bad_label_removed_by_name_even_though_it_could_not_be_written() {
    let app = TestApp::new().await;
    app.put_raw("labels/node/n1", r#"{"Bad_":"a b","ok":"1"}"#)
        .await;
    let response = delete(&app, "/api/labels/node/n1/Bad_").await;
    assert_eq!(response.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.stored_text("labels/node/n1").await.as_deref(),
        Some(r#"{"ok":"1"}"#)
    );
}

#[tokio::test]
async fn bad_bodies_are_4xx_and_write_nothing() {
    let app = TestApp::new().await;
    app.put_raw("labels/node/n1", r#"{"keep":"1"}"#).await;
    let json_header = [("content-type", "application/json")];
    for path in ["/api/labels/node/n1", "/api/labels/node/n1/color"] {
        let response = app.send_raw("PUT", path, &json_header, "{\"value").await;
        assert_eq!(response.status, StatusCode::BAD_REQUEST, "{path}");
        response.error();
    }
    for (path, body) in [
        ("/api/labels/node/n1", json!({"labels": {"a": "b"}})),
        ("/api/labels/node/n1", json!({"values": {"a": 1}})),
        ("/api/labels/node/n1", json!({"values": ["a"]})),
        (
            "/api/labels/node/n1/color",
            json!({"values": {"color": "red"}}),
        ),
        ("/api/labels/node/n1/color", json!({"value": 7})),
        ("/api/labels/node/n1/color", json!("red")),
    ] {
        let response = put(&app, path, body.clone()).await;
        assert_eq!(
            response.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{path} {body}"
        );
        response.error();
    }
    assert_eq!(app.keys("labels/").await, ["labels/node/n1"]);
    assert_eq!(
        app.stored_text("labels/node/n1").await.as_deref(),
        Some(r#"{"keep":"1"}"#)
    );
}

#[tokio::test]
async fn bad_labels_are_all_reported_at_once_and_nothing_is_written() {
    let app = TestApp::new().await;
    let response = put(
        &app,
        "/api/labels/node/n1",
        json!({"values": {"ok": "1", "bad key": "x", "fine": "bad value", "-x": "-"}}),
    )
    .await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    let fields: Vec<String> = response
        .error()
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    assert_eq!(
        fields,
        ["values.-x", "values.-x", "values.bad key", "values.fine"]
    );

    let response = put(
        &app,
        "/api/labels/node/n1/bad%20key",
        json!({"value": "bad value"}),
    )
    .await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    let fields: Vec<String> = response
        .error()
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    assert_eq!(fields, ["name", "value"]);

    assert_eq!(app.keys("labels/").await, Vec::<String>::new());
}

/// Fifty of P2's single-label PUTs on one pod at once all answer 204 and all land.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_single_label_puts_all_survive() {
    const WRITERS: usize = 50;
    let app = Arc::new(TestApp::new().await);
    let tasks: Vec<_> = (0..WRITERS)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                put(
                    &app,
                    &format!("/api/labels/pod/n1/hello/k{i}"),
                    json!({"value": "v"}),
                )
                .await
            })
        })
        .collect();
    for task in tasks {
        let response = task.await.unwrap();
        assert_eq!(response.status, StatusCode::NO_CONTENT, "{response:?}");
    }
    let response = app.get("/api/labels/pod/n1/hello").await;
    let keys: BTreeSet<String> = response.json()["labels"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(keys, (0..WRITERS).map(|i| format!("k{i}")).collect());
}

/// A label's path (`{id}/{name}`) takes PUT and DELETE only, and its Allow says so; an
/// object's path takes GET too. A pod's id holds a `/`, so the split depends on the type.
#[tokio::test]
async fn allow_lists_only_what_the_path_takes() {
    let app = TestApp::new().await;
    let cases = [
        ("/api/labels/node/node1", "GET,HEAD,PUT,DELETE"),
        ("/api/labels/node/node1/role", "PUT,DELETE"),
        ("/api/labels/pod/node1/hello", "GET,HEAD,PUT,DELETE"),
        ("/api/labels/pod/node1/hello/role", "PUT,DELETE"),
    ];
    for (path, allowed) in cases {
        let response = app.json_request("OPTIONS", path, None, &[]).await;
        assert_eq!(response.status, StatusCode::METHOD_NOT_ALLOWED, "{path}");
        assert_eq!(response.error().reason, "MethodNotAllowed", "{path}");
        let allow = response.header("allow").expect("an Allow header");
        let allow: Vec<&str> = allow.split(',').map(str::trim).collect();
        let allowed: Vec<&str> = allowed.split(',').collect();
        assert_eq!(
            allow.iter().collect::<BTreeSet<_>>(),
            allowed.iter().collect::<BTreeSet<_>>(),
            "{path}"
        );
    }
}

/// GET and HEAD on a label's path answer 405 with its Allow, as any other method there does,
/// rather than reading the whole rest of the path as an object id. The type's id shape
/// decides which path a request is on, before the id or name are checked; a type that is
/// not one is 400 on every method, since it leaves the shape unknown.
#[tokio::test]
async fn get_and_head_on_a_labels_path_are_405_with_its_allow() {
    let app = TestApp::new().await;
    app.put_raw("labels/pod/node1/hello", r#"{"role":"web"}"#)
        .await;
    let label_paths = [
        "/api/labels/node/node1/role",
        "/api/labels/node/node1/example.com%2Frole",
        "/api/labels/pod/node1/hello/role",
        "/api/labels/pod/node1%2Fhello/role",
        "/api/labels/pod/node1%252Fhello/example.com%252Frole",
        "/api/labels/pod/node1/hello/role?stale=true",
        "/api/labels/node/node1/",
        "/api/labels/node/../role",
    ];
    for path in label_paths {
        for method in ["GET", "HEAD", "OPTIONS"] {
            let response = app.json_request(method, path, None, &[]).await;
            assert_eq!(
                response.status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}"
            );
            assert_eq!(response.header("allow"), Some("PUT,DELETE"), "{path}");
            if method != "HEAD" {
                assert_eq!(response.error().reason, "MethodNotAllowed", "{path}");
            }
        }
    }
    for path in [
        "/api/labels/pod/node1/hello",
        "/api/labels/pod/node1%2Fhello",
    ] {
        assert_eq!(app.get(path).await.status, StatusCode::OK, "{path}");
    }
    let response = app.get("/api/labels/nodes/node1/role").await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    assert!(response.error().message.contains("Invalid type provided"));
    assert_eq!(app.keys("labels/").await, ["labels/pod/node1/hello"]);
}
