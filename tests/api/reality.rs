//! The intent read, reality reports and health withdrawal, the routes a node agent uses.

use crate::support::api::{TestApp, TestResponse};
use axum::http::StatusCode;
use p2_apiserver::kv::Cas;
use serde_json::json;

/// A manifest with a comment and odd spacing, which must survive byte for byte.
fn manifest(pod_id: &str) -> String {
    format!(
        "# installed by the preparer\nid: {pod_id}\nlaunchables:\n  app:\n    launchable_type:   hoist\n    location: https://artifacts.example.com/{pod_id}.tar.gz\n"
    )
}

async fn put_yaml(app: &TestApp, path: &str, content_type: &str, body: &str) -> TestResponse {
    app.send_raw(
        "PUT",
        path,
        &[("content-type", content_type)],
        body.to_owned(),
    )
    .await
}

async fn delete(app: &TestApp, path: &str, headers: &[(&str, &str)]) -> TestResponse {
    app.send_raw("DELETE", path, headers, "").await
}

async fn stored(app: &TestApp, key: &str) -> Option<Vec<u8>> {
    app.store
        .get(key)
        .await
        .unwrap()
        .map(|pair| pair.value.to_vec())
}

fn causes(response: &TestResponse) -> Vec<String> {
    let mut fields: Vec<String> = response
        .error()
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    fields.sort();
    fields
}

#[tokio::test]
async fn reality_round_trips_byte_for_byte_in_every_yaml_media_type() {
    let app = TestApp::new().await;
    for (n, content_type) in [
        "application/yaml",
        "application/x-yaml",
        "text/yaml",
        "text/plain; charset=utf-8",
    ]
    .into_iter()
    .enumerate()
    {
        let body = format!("{}# report {n}\n", manifest("hello"));
        let put = put_yaml(&app, "/api/v1/reality/node1/hello", content_type, &body).await;
        assert_eq!(
            put.status,
            StatusCode::NO_CONTENT,
            "{content_type}: {put:?}"
        );
        let pair = app.store.get("reality/node1/hello").await.unwrap().unwrap();
        assert_eq!(&*pair.value, body.as_bytes(), "{content_type}");
        assert_eq!(
            put.header("etag"),
            Some(format!("\"{}\"", pair.modify_index).as_str())
        );

        let get = app.get("/api/v1/reality/node1/hello").await;
        assert_eq!(get.status, StatusCode::OK);
        assert_eq!(get.header("content-type"), Some("application/yaml"));
        assert_eq!(get.header("etag"), put.header("etag"));
        assert_eq!(get.body, body.as_bytes());
    }
}

#[tokio::test]
async fn reality_delete_removes_the_report_and_is_repeatable() {
    let app = TestApp::new().await;
    put_yaml(
        &app,
        "/api/v1/reality/node1/hello",
        "application/yaml",
        &manifest("hello"),
    )
    .await;
    for _ in 0..2 {
        let deleted = delete(&app, "/api/v1/reality/node1/hello", &[]).await;
        assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
        assert_eq!(stored(&app, "reality/node1/hello").await, None);
    }
    let get = app.get("/api/v1/reality/node1/hello").await;
    assert_eq!(get.status, StatusCode::NOT_FOUND);
    assert_eq!(get.error().reason, "NotFound");
}

#[tokio::test]
async fn reality_put_refuses_bad_input_and_writes_nothing() {
    let app = TestApp::new().await;
    let before = app.dump().await;

    let wrong_type = app
        .send_json(
            "PUT",
            "/api/v1/reality/node1/hello",
            &[],
            &json!({"manifest": manifest("hello")}),
        )
        .await;
    assert_eq!(wrong_type.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    wrong_type.error();

    let other_pod = put_yaml(
        &app,
        "/api/v1/reality/node1/hello",
        "application/yaml",
        &manifest("other"),
    )
    .await;
    assert_eq!(other_pod.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(causes(&other_pod), ["manifest.id"]);

    let not_a_manifest = put_yaml(
        &app,
        "/api/v1/reality/node1/hello",
        "application/yaml",
        "id: hello\nlaunchables:\n  app:\n    location: x\n",
    )
    .await;
    assert_eq!(not_a_manifest.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        causes(&not_a_manifest)
            .iter()
            .all(|field| field.starts_with("manifest")),
        "{not_a_manifest:?}"
    );

    let bad_ids = put_yaml(
        &app,
        "/api/v1/reality/a%20b/7c9e6679-7425-40de-944b-e07fc1f90ae7",
        "application/yaml",
        &manifest("hello"),
    )
    .await;
    assert_eq!(bad_ids.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(causes(&bad_ids), ["manifest.id", "node", "pod_id"]);

    let not_utf8 = app
        .send_raw(
            "PUT",
            "/api/v1/reality/node1/hello",
            &[("content-type", "application/yaml")],
            vec![0xff, 0xfe],
        )
        .await;
    assert_eq!(not_utf8.status, StatusCode::BAD_REQUEST);
    not_utf8.error();

    assert_eq!(app.dump().await, before);
}

#[tokio::test]
async fn reality_get_and_delete_validate_ids() {
    let app = TestApp::new().await;
    for response in [
        app.get("/api/v1/reality/a%20b/..").await,
        delete(&app, "/api/v1/reality/a%20b/..", &[]).await,
        app.get("/api/v1/intent/a%20b/..").await,
    ] {
        assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(causes(&response), ["node", "pod_id"]);
    }
}

#[tokio::test]
async fn intent_is_answered_as_the_farms_wrote_it() {
    let app = TestApp::new().await;
    let missing = app.get("/api/v1/intent/node1/hello").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    missing.error();

    let raw = manifest("hello");
    app.store
        .put("intent/node1/hello", raw.as_bytes(), Cas::Any)
        .await
        .unwrap();
    let pair = app.store.get("intent/node1/hello").await.unwrap().unwrap();
    app.mirrored("intent/node1/hello").await;
    let got = app.get("/api/v1/intent/node1/hello").await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.header("content-type"), Some("application/yaml"));
    assert_eq!(
        got.header("etag"),
        Some(format!("\"{}\"", pair.modify_index).as_str())
    );
    assert_eq!(got.body, raw.as_bytes());

    let not_writable = put_yaml(&app, "/api/v1/intent/node1/hello", "application/yaml", &raw).await;
    assert_eq!(not_writable.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn health_delete_withdraws_a_report_honouring_if_match() {
    let app = TestApp::new().await;
    let put = app
        .send_json(
            "PUT",
            "/api/v1/health/hello/node1",
            &[],
            &json!({"status": "passing"}),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{put:?}");
    let version = put.header("etag").unwrap().to_owned();

    let stale = delete(&app, "/api/v1/health/hello/node1", &[("if-match", "\"1\"")]).await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED);
    stale.error();
    assert!(stored(&app, "health/hello/node1").await.is_some());

    let deleted = delete(
        &app,
        "/api/v1/health/hello/node1",
        &[("if-match", &version)],
    )
    .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    assert_eq!(stored(&app, "health/hello/node1").await, None);
    assert_eq!(
        app.get("/api/v1/health/hello/node1").await.status,
        StatusCode::NOT_FOUND
    );

    let again = delete(&app, "/api/v1/health/hello/node1", &[]).await;
    assert_eq!(again.status, StatusCode::NO_CONTENT);

    let bad = delete(&app, "/api/v1/health/a%20b/n%20m", &[]).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(causes(&bad), ["node", "pod_id"]);
}

#[tokio::test]
async fn openapi_documents_the_node_agent_routes() {
    let app = TestApp::new().await;
    let doc = app.get("/openapi.json").await.json();
    let paths = &doc["paths"];
    let reality = &paths["/api/v1/reality/{node}/{pod_id}"];
    for method in ["get", "put", "delete"] {
        assert_eq!(reality[method]["tags"], json!(["reality"]), "{method}");
    }
    assert_eq!(
        reality["put"]["operationId"],
        json!("put_reality"),
        "{reality}"
    );
    assert!(paths["/api/v1/intent/{node}/{pod_id}"]["get"].is_object());
    assert!(paths["/api/v1/health/{pod_id}/{node}"]["delete"]["responses"]["412"].is_object());
}

/// An `If-Match` on a report is evaluated (RFC 9110 §13.1.1), never ignored: an agent that
/// names the version it read overwrites or withdraws only that one, not a newer report.
#[tokio::test]
async fn reality_put_and_delete_honour_if_match() {
    let app = TestApp::new().await;
    let path = "/api/v1/reality/node1/hello";
    let put = |if_match: String, body: String| {
        let app = &app;
        async move {
            app.send_raw(
                "PUT",
                path,
                &[
                    ("content-type", "application/yaml"),
                    ("if-match", &if_match),
                ],
                body,
            )
            .await
        }
    };
    let first = put_yaml(&app, path, "application/yaml", &manifest("hello")).await;
    assert_eq!(first.status, StatusCode::NO_CONTENT, "{first:?}");
    let read = first.header("etag").unwrap().to_owned();
    let newer = format!("{}# newer\n", manifest("hello"));
    let second = put_yaml(&app, path, "application/yaml", &newer).await;
    assert_eq!(second.status, StatusCode::NO_CONTENT, "{second:?}");
    let current = second.header("etag").unwrap().to_owned();

    let before = app.dump().await;
    let stale = put(read.clone(), manifest("hello")).await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED, "{stale:?}");
    stale.error();
    let stale = delete(&app, path, &[("if-match", &read)]).await;
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED, "{stale:?}");
    stale.error();
    let absent = delete(&app, "/api/v1/reality/node2/hello", &[("if-match", "*")]).await;
    assert_eq!(absent.status, StatusCode::PRECONDITION_FAILED, "{absent:?}");
    let garbage = put("yesterday".into(), manifest("hello")).await;
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST, "{garbage:?}");
    garbage.error();
    assert_eq!(app.dump().await, before);
    assert_eq!(
        stored(&app, "reality/node1/hello").await,
        Some(newer.into_bytes())
    );

    let updated = put(current.clone(), manifest("hello")).await;
    assert_eq!(updated.status, StatusCode::NO_CONTENT, "{updated:?}");
    let current = updated.header("etag").unwrap().to_owned();
    let deleted = delete(&app, path, &[("if-match", &current)]).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    assert_eq!(stored(&app, "reality/node1/hello").await, None);
}
