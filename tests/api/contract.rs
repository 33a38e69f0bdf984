//! What the server really answers, checked against the OpenAPI document generated SDKs are
//! built from: every status it answers is documented for the route with its content type and
//! body schema, and the headers the document names (`ETag`, `X-Index`, `Location`,
//! `Retry-After`) are sent exactly when it names them.

use serde_json::{json, Value};

use crate::support::api::{TestApp, TestResponse};
use p2_apiserver::error::ApiError;
use p2_apiserver::kv::StoreError;
use p2_apiserver::model::timestamp::parse_rfc3339;
use p2_apiserver::router;

/// A request to check: method, route as the document spells it, path, JSON body, headers.
type Probe<'a> = (
    &'a str,
    &'a str,
    String,
    Option<Value>,
    Vec<(&'a str, &'a str)>,
);

/// A request sent with its body as given: method, route and path, body, headers.
type RawProbe<'a> = (
    (&'a str, &'a str, String),
    Option<&'a str>,
    &'a [(&'a str, &'a str)],
);

/// The headers whose presence the document promises or denies.
const CONTRACT_HEADERS: [&str; 4] = ["ETag", "X-Index", "Location", "Retry-After"];

/// Headers of HTTP itself, which a client reads whatever the document says.
const HTTP_HEADERS: [&str; 5] = [
    "content-type",
    "content-length",
    "date",
    "transfer-encoding",
    "cache-control",
];

fn document() -> Value {
    let (_, openapi) = router::api().split_for_parts();
    serde_json::to_value(&openapi).unwrap()
}

/// How `response` to `method route` (`route` as the document spells the path) disagrees
/// with `doc`.
pub fn disagreements(
    doc: &Value,
    method: &str,
    route: &str,
    response: &TestResponse,
) -> Vec<String> {
    let name = format!("{method} {route} -> {}", response.status.as_u16());
    let op = &doc["paths"][route][method.to_ascii_lowercase()];
    assert!(op.is_object(), "{name}: no such operation in the document");
    let Some(documented) = op["responses"].get(response.status.as_str()) else {
        return vec![format!("{name}: status not documented: {response:?}")];
    };
    let mut problems = Vec::new();
    for header in CONTRACT_HEADERS {
        let promised = documented["headers"].get(header).is_some();
        let sent = response.headers.contains_key(header);
        if promised != sent {
            problems.push(format!("{header}: documented {promised}, sent {sent}"));
        }
    }
    let documented_names: Vec<String> = documented["headers"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, _)| name.to_ascii_lowercase())
        .collect();
    for name in response.headers.keys() {
        if !HTTP_HEADERS.contains(&name.as_str())
            && !documented_names.contains(&name.as_str().to_owned())
        {
            problems.push(format!("{name}: sent, not documented"));
        }
    }
    let content_type = response
        .header("content-type")
        .map(|value| value.split(';').next().unwrap().trim().to_owned());
    match (documented["content"].as_object(), &content_type) {
        (None, None) => {}
        (None, Some(sent)) if response.body.is_empty() => {
            problems.push(format!("content type {sent} on an empty body"))
        }
        (None, Some(sent)) => problems.push(format!("undocumented body of type {sent}")),
        (Some(content), sent) => match sent.as_deref().and_then(|sent| content.get(sent)) {
            None => problems.push(format!(
                "content type {sent:?}, documented {:?}",
                content.keys().collect::<Vec<_>>()
            )),
            Some(media) if sent.as_deref() == Some("application/json") => {
                match serde_json::from_slice(&response.body) {
                    Ok(body) => validate(doc, &media["schema"], &body, "body", &mut problems),
                    Err(e) => problems.push(format!("the body is not JSON: {e}")),
                }
            }
            Some(_) => {}
        },
    }
    problems
        .into_iter()
        .map(|problem| format!("{name}: {problem}; {response:?}"))
        .collect()
}

/// Checks `value` against `schema` (the subset of JSON Schema utoipa writes), adding what
/// disagrees to `problems`.
fn validate(doc: &Value, schema: &Value, value: &Value, at: &str, problems: &mut Vec<String>) {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.trim_start_matches("#/components/schemas/");
        return validate(
            doc,
            &doc["components"]["schemas"][name],
            value,
            at,
            problems,
        );
    }
    if let Some(choices) = schema["oneOf"].as_array() {
        let fitting = choices
            .iter()
            .filter(|choice| {
                let mut inner = Vec::new();
                validate(doc, choice, value, at, &mut inner);
                inner.is_empty()
            })
            .count();
        if fitting != 1 {
            problems.push(format!("{at}: {value} fits {fitting} of oneOf {schema}"));
        }
        return;
    }
    if let Some(values) = schema["enum"].as_array() {
        if !values.contains(value) {
            problems.push(format!("{at}: {value} is not one of {values:?}"));
        }
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => return,
    };
    let fits = |kind: &str| match kind {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => true,
    };
    if !types.iter().any(|kind| fits(kind)) {
        problems.push(format!("{at}: {value} is not of type {types:?}"));
        return;
    }
    // The formats a generated SDK parses strings by.
    if let Some(text) = value.as_str() {
        let malformed = match schema["format"].as_str() {
            Some("date-time") => parse_rfc3339(text).is_none(),
            Some("uuid") => uuid::Uuid::parse_str(text).is_err(),
            _ => false,
        };
        if malformed {
            problems.push(format!("{at}: {value} is not a {}", schema["format"]));
        }
    }
    if let Some(items) = value.as_array() {
        for (i, item) in items.iter().enumerate() {
            validate(doc, &schema["items"], item, &format!("{at}[{i}]"), problems);
        }
    }
    if let Some(object) = value.as_object() {
        for field in schema["required"].as_array().into_iter().flatten() {
            if !object.contains_key(field.as_str().unwrap()) {
                problems.push(format!("{at}: required {field} is missing"));
            }
        }
        for (field, inner) in object {
            let at = format!("{at}.{field}");
            match schema["properties"].get(field) {
                Some(property) => validate(doc, property, inner, &at, problems),
                None => match &schema["additionalProperties"] {
                    Value::Bool(false) => problems.push(format!("{at}: undocumented field")),
                    Value::Object(_) => {
                        validate(doc, &schema["additionalProperties"], inner, &at, problems)
                    }
                    _ if schema["properties"].is_object() => {
                        problems.push(format!("{at}: undocumented field"))
                    }
                    _ => {}
                },
            }
        }
    }
}

/// Sends `method path` with an optional JSON body and checks the answer against the
/// document, returning it.
async fn probe(
    app: &TestApp,
    (doc, found): (&Value, &mut Vec<String>),
    (method, route, path): (&str, &str, &str),
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> TestResponse {
    let response = app.json_request(method, path, body, headers).await;
    found.extend(disagreements(doc, method, route, &response));
    response
}

const MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_1.tar.gz\n";

#[tokio::test]
async fn every_route_answers_as_documented() {
    let doc = document();
    let mut found = Vec::new();
    let app = TestApp::new().await;
    let p = |m, r, path| (m, r, path);
    let rc = json!({"manifest": MANIFEST, "node_selector": "role=web", "pod_labels": {},
                    "replicas_desired": 0});
    let created = probe(
        &app,
        (&doc, &mut found),
        p("POST", "/api/v1/rcs", "/api/v1/rcs"),
        Some(&rc),
        &[],
    )
    .await;
    let rc_id = created.json()["id"].as_str().unwrap().to_owned();
    let rc_path = format!("/api/v1/rcs/{rc_id}");
    let rc_route = "/api/v1/rcs/{id}";
    probe(
        &app,
        (&doc, &mut found),
        p("GET", rc_route, &rc_path),
        None,
        &[],
    )
    .await;
    probe(
        &app,
        (&doc, &mut found),
        p("GET", "/api/v1/rcs", "/api/v1/rcs"),
        None,
        &[],
    )
    .await;
    for (method, route, path) in [
        ("GET", "/api/v1/rcs", "/api/v1/rcs?bogus=1"),
        ("GET", "/api/v1/rcs", "/api/v1/rcs?limit=x"),
        ("GET", rc_route, "/api/v1/rcs/not-a-uuid"),
        (
            "GET",
            rc_route,
            "/api/v1/rcs/00000000-0000-4000-8000-000000000009",
        ),
        (
            "GET",
            "/api/v1/rolls/{id}",
            "/api/v1/rolls/00000000-0000-4000-8000-000000000009",
        ),
        (
            "GET",
            "/api/v1/daemonsets/{id}",
            "/api/v1/daemonsets/00000000-0000-4000-8000-000000000009",
        ),
        ("GET", "/api/v1/nodes/{node}", "/api/v1/nodes/nowhere"),
        ("GET", "/api/v1/nodes", "/api/v1/nodes"),
        ("GET", "/api/v1/pods", "/api/v1/pods"),
        ("GET", "/api/v1/events", "/api/v1/events"),
        ("GET", "/api/v1/rolls", "/api/v1/rolls"),
        ("GET", "/api/v1/daemonsets", "/api/v1/daemonsets"),
        ("GET", "/api/v1/leader", "/api/v1/leader"),
        ("GET", "/api/v1/labels/{type}", "/api/v1/labels/node"),
        ("GET", "/api/v1/labels/{type}", "/api/v1/labels/bogus"),
        (
            "GET",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/n1",
        ),
        ("GET", "/api/v1/health/{pod_id}", "/api/v1/health/hello"),
        (
            "GET",
            "/api/v1/health/{pod_id}/{node}",
            "/api/v1/health/hello/n1",
        ),
        (
            "DELETE",
            "/api/v1/health/{pod_id}/{node}",
            "/api/v1/health/hello/n1",
        ),
        (
            "GET",
            "/api/v1/intent/{node}/{pod_id}",
            "/api/v1/intent/n1/hello",
        ),
        (
            "GET",
            "/api/v1/reality/{node}/{pod_id}",
            "/api/v1/reality/n1/hello",
        ),
        (
            "DELETE",
            "/api/v1/reality/{node}/{pod_id}",
            "/api/v1/reality/n1/hello",
        ),
        ("GET", "/api/labels/{type}", "/api/labels/node"),
        ("GET", "/api/labels/{type}", "/api/labels/bogus"),
        ("GET", "/api/labels/{type}/{id}", "/api/labels/node/n1"),
        ("GET", "/api/labels/{type}/{id}", "/api/labels/bogus/n1"),
        ("GET", "/api/select", "/api/select?type=node&selector=a%3Db"),
        ("DELETE", "/api/labels/{type}/{id}", "/api/labels/node/n1"),
        (
            "DELETE",
            "/api/labels/{type}/{id}/{name}",
            "/api/labels/node/n1/a",
        ),
        ("GET", "/healthz", "/healthz"),
        ("GET", "/readyz", "/readyz"),
        ("GET", "/version", "/version"),
        ("GET", "/metrics", "/metrics"),
    ] {
        probe(&app, (&doc, &mut found), (method, route, path), None, &[]).await;
    }
    let writes: Vec<Probe<'_>> = vec![
        (
            "PATCH",
            rc_route,
            rc_path.clone(),
            Some(json!({"replicas_desired": 0})),
            vec![("content-type", "application/merge-patch+json")],
        ),
        (
            "PATCH",
            rc_route,
            rc_path.clone(),
            Some(json!({"replicas_desired": -1})),
            vec![("content-type", "application/merge-patch+json")],
        ),
        (
            "PATCH",
            rc_route,
            rc_path.clone(),
            Some(json!({})),
            vec![
                ("content-type", "application/merge-patch+json"),
                ("if-match", "\"1\""),
            ],
        ),
        (
            "PATCH",
            rc_route,
            rc_path.clone(),
            Some(json!({})),
            vec![("content-type", "text/plain")],
        ),
        (
            "POST",
            "/api/v1/rcs",
            "/api/v1/rcs".into(),
            Some(json!({"manifest": 1})),
            vec![],
        ),
        (
            "PUT",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/n1".into(),
            Some(json!({"labels": {"role": "web"}})),
            vec![],
        ),
        (
            "PATCH",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/n1".into(),
            Some(json!({"az": "a"})),
            vec![("content-type", "application/merge-patch+json")],
        ),
        (
            "PUT",
            "/api/labels/{type}/{id}",
            "/api/labels/node/n2".into(),
            Some(json!({"values": {"role": "web"}})),
            vec![],
        ),
        (
            "PUT",
            "/api/labels/{type}/{id}/{name}",
            "/api/labels/node/n2/az".into(),
            Some(json!({"value": "b"})),
            vec![],
        ),
        (
            "PUT",
            "/api/v1/health/{pod_id}/{node}",
            "/api/v1/health/hello/n1".into(),
            Some(json!({"status": "passing"})),
            vec![],
        ),
        (
            "POST",
            "/api/v1/daemonsets",
            "/api/v1/daemonsets".into(),
            Some(
                json!({"manifest": MANIFEST, "node_selector": "role=web", "min_health": 0, "cluster_name": "c", "timeout": "1m"}),
            ),
            vec![],
        ),
        (
            "POST",
            "/api/v1/rolls",
            "/api/v1/rolls".into(),
            Some(
                json!({"old_rc_id": rc_id, "new_rc_id": rc_id, "desired_replicas": 1, "minimum_replicas": 0}),
            ),
            vec![],
        ),
    ];
    for (method, route, path, body, headers) in &writes {
        probe(
            &app,
            (&doc, &mut found),
            (method, route, path),
            body.as_ref(),
            headers,
        )
        .await;
    }
    let reality = app
        .send_raw(
            "PUT",
            "/api/v1/reality/n1/hello",
            &[("content-type", "application/yaml")],
            MANIFEST,
        )
        .await;
    found.extend(disagreements(
        &doc,
        "PUT",
        "/api/v1/reality/{node}/{pod_id}",
        &reality,
    ));
    for (method, route, path) in [
        (
            "GET",
            "/api/v1/reality/{node}/{pod_id}",
            "/api/v1/reality/n1/hello",
        ),
        (
            "GET",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/n1",
        ),
        ("GET", "/api/labels/{type}/{id}", "/api/labels/node/n2"),
        ("GET", "/api/v1/nodes/{node}", "/api/v1/nodes/n1"),
        (
            "GET",
            "/api/v1/health/{pod_id}/{node}",
            "/api/v1/health/hello/n1",
        ),
        (
            "DELETE",
            "/api/v1/reality/{node}/{pod_id}",
            "/api/v1/reality/n1/hello",
        ),
        (
            "DELETE",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/n1",
        ),
        ("DELETE", rc_route, &rc_path),
    ] {
        probe(&app, (&doc, &mut found), (method, route, path), None, &[]).await;
    }
    assert!(found.is_empty(), "{}", found.join("\n\n"));
}

/// Answers the document might miss: bodies that are not JSON, documents the store holds that
/// do not decode, objects that exist only in part.
#[tokio::test]
async fn unusual_answers_are_documented() {
    let doc = document();
    let mut found = Vec::new();
    let app = TestApp::new().await;
    let bad = "00000000-0000-4000-8000-00000000000b";
    for key in [
        format!("rolls/{bad}"),
        format!("replication_controllers/{bad}"),
        format!("daemon_sets/{bad}"),
        "labels/node/n1".to_owned(),
        "labels/pod/n1/hello".to_owned(),
        "health/hello/n1".to_owned(),
        "intent/n1/hello".to_owned(),
        "reality/n1/hello".to_owned(),
    ] {
        app.put_raw(&key, "{not json").await;
    }
    let p = |m, r, path| (m, r, path);
    let roll = json!({"old_rc_id": bad, "new_rc_id": "00000000-0000-4000-8000-00000000000d",
                      "desired_replicas": 1, "minimum_replicas": 0})
    .to_string();
    let json = [("content-type", "application/json")];
    let yaml = [("content-type", "application/yaml")];
    let text = [("content-type", "text/plain")];
    let probes: Vec<RawProbe<'_>> = vec![
        (
            p("PATCH", "/api/v1/rcs/{id}", format!("/api/v1/rcs/{bad}")),
            Some("{}"),
            &json,
        ),
        (
            p(
                "PATCH",
                "/api/v1/daemonsets/{id}",
                format!("/api/v1/daemonsets/{bad}"),
            ),
            Some("{}"),
            &json,
        ),
        (
            p("POST", "/api/v1/rolls", "/api/v1/rolls".into()),
            Some(&roll),
            &json,
        ),
        (
            p("DELETE", "/api/v1/rcs/{id}", format!("/api/v1/rcs/{bad}")),
            None,
            &[],
        ),
        (
            p(
                "DELETE",
                "/api/v1/daemonsets/{id}",
                format!("/api/v1/daemonsets/{bad}"),
            ),
            None,
            &[],
        ),
        (
            p("GET", "/api/v1/rolls/{id}", format!("/api/v1/rolls/{bad}")),
            None,
            &[],
        ),
        (
            p(
                "DELETE",
                "/api/v1/rolls/{id}",
                format!("/api/v1/rolls/{bad}"),
            ),
            None,
            &[],
        ),
        (
            p("GET", "/api/v1/rcs/{id}", format!("/api/v1/rcs/{bad}")),
            None,
            &[],
        ),
        (
            p(
                "GET",
                "/api/v1/daemonsets/{id}",
                format!("/api/v1/daemonsets/{bad}"),
            ),
            None,
            &[],
        ),
        (p("GET", "/api/v1/rolls", "/api/v1/rolls".into()), None, &[]),
        (p("GET", "/api/v1/rcs", "/api/v1/rcs".into()), None, &[]),
        (
            p("GET", "/api/v1/daemonsets", "/api/v1/daemonsets".into()),
            None,
            &[],
        ),
        (
            p(
                "GET",
                "/api/v1/labels/{type}/{id}",
                "/api/v1/labels/node/n1".into(),
            ),
            None,
            &[],
        ),
        (
            p("GET", "/api/v1/labels/{type}", "/api/v1/labels/node".into()),
            None,
            &[],
        ),
        (
            p("GET", "/api/v1/nodes/{node}", "/api/v1/nodes/n1".into()),
            None,
            &[],
        ),
        (p("GET", "/api/v1/nodes", "/api/v1/nodes".into()), None, &[]),
        (p("GET", "/api/v1/pods", "/api/v1/pods".into()), None, &[]),
        (
            p(
                "GET",
                "/api/labels/{type}/{id}",
                "/api/labels/node/n1".into(),
            ),
            None,
            &[],
        ),
        (
            p("GET", "/api/labels/{type}", "/api/labels/node".into()),
            None,
            &[],
        ),
        (
            p(
                "GET",
                "/api/select",
                "/api/select?type=node&selector=a%3Db".into(),
            ),
            None,
            &[],
        ),
        (
            p(
                "GET",
                "/api/v1/health/{pod_id}/{node}",
                "/api/v1/health/hello/n1".into(),
            ),
            None,
            &[],
        ),
        (
            p(
                "GET",
                "/api/v1/health/{pod_id}",
                "/api/v1/health/hello".into(),
            ),
            None,
            &[],
        ),
        (
            p(
                "GET",
                "/api/v1/intent/{node}/{pod_id}",
                "/api/v1/intent/n1/hello".into(),
            ),
            None,
            &[],
        ),
        (
            p(
                "GET",
                "/api/v1/reality/{node}/{pod_id}",
                "/api/v1/reality/n1/hello".into(),
            ),
            None,
            &[],
        ),
        (
            p(
                "PATCH",
                "/api/v1/labels/{type}/{id}",
                "/api/v1/labels/node/n1".into(),
            ),
            Some("{}"),
            &[("content-type", "application/merge-patch+json")],
        ),
        (
            p(
                "PUT",
                "/api/v1/labels/{type}/{id}",
                "/api/v1/labels/node/n1".into(),
            ),
            Some(r#"{"labels":{}}"#),
            &json,
        ),
        (
            p(
                "PUT",
                "/api/labels/{type}/{id}/{name}",
                "/api/labels/node/n1/a".into(),
            ),
            Some(r#"{"value":"b"}"#),
            &json,
        ),
        (
            p(
                "DELETE",
                "/api/labels/{type}/{id}/{name}",
                "/api/labels/node/n1/a".into(),
            ),
            None,
            &[],
        ),
        (
            p(
                "PUT",
                "/api/v1/health/{pod_id}/{node}",
                "/api/v1/health/hello/n1".into(),
            ),
            Some(r#"{"status":"passing"}"#),
            &json,
        ),
        (
            p("POST", "/api/v1/rcs", "/api/v1/rcs".into()),
            Some("{"),
            &json,
        ),
        (
            p("POST", "/api/v1/rcs", "/api/v1/rcs".into()),
            Some("{}"),
            &text,
        ),
        (
            p(
                "PUT",
                "/api/labels/{type}/{id}",
                "/api/labels/node/n3".into(),
            ),
            Some("{"),
            &json,
        ),
        (
            p(
                "PUT",
                "/api/labels/{type}/{id}",
                "/api/labels/node/n3".into(),
            ),
            Some("{}"),
            &text,
        ),
        (
            p(
                "PUT",
                "/api/labels/{type}/{id}/{name}",
                "/api/labels/node/n3/a".into(),
            ),
            Some("{}"),
            &text,
        ),
        (
            p(
                "PUT",
                "/api/v1/reality/{node}/{pod_id}",
                "/api/v1/reality/n1/hello".into(),
            ),
            Some("id: [ "),
            &yaml,
        ),
        (
            p(
                "PUT",
                "/api/v1/reality/{node}/{pod_id}",
                "/api/v1/reality/n1/hello".into(),
            ),
            Some("{}"),
            &text,
        ),
        (
            p("POST", "/api/v1/rolls", "/api/v1/rolls".into()),
            Some("{"),
            &json,
        ),
        (
            p("GET", "/api/v1/watch", "/api/v1/watch?kinds=bogus".into()),
            None,
            &[],
        ),
        (
            p("GET", "/api/v1/events", "/api/v1/events?kind=bogus".into()),
            None,
            &[],
        ),
        (
            p(
                "GET",
                "/api/v1/rcs/{id}",
                format!("/api/v1/rcs/{bad}?index=1&wait=1ms"),
            ),
            None,
            &[],
        ),
    ];
    for ((method, route, path), body, headers) in probes {
        let body = body.map_or_else(String::new, str::to_owned);
        let response = app.send_raw(method, &path, headers, body).await;
        found.extend(disagreements(&doc, method, route, &response));
    }
    assert!(found.is_empty(), "{}", found.join("\n\n"));
}

/// A roll the store holds that does not decode is answered as an RC or a daemon set that
/// does not decode is: 500 `UnreadableDocument`, saying how to clear it.
#[tokio::test]
async fn an_unreadable_roll_says_so_and_how_to_clear_it() {
    let app = TestApp::new().await;
    let id = "00000000-0000-4000-8000-00000000000b";
    app.put_raw(&format!("rolls/{id}"), "{not json").await;
    let path = format!("/api/v1/rolls/{id}");
    let response = app.get(&path).await;
    let error = response.error();
    assert_eq!(error.reason, "UnreadableDocument", "{error:?}");
    assert!(
        error.message.contains(&format!("DELETE {path}")),
        "{error:?}"
    );
    assert_eq!(
        app.json_request("DELETE", &path, None, &[]).await.status,
        204
    );
    assert_eq!(app.get(&path).await.status, 404);
}

/// Creates two RCs selecting `role=web` (wanting 1 and 0 replicas) and a daemon set of the
/// same pod: their IDs.
async fn two_rcs_and_a_ds(app: &TestApp) -> ([String; 2], String) {
    let id = |created: TestResponse| created.json()["id"].as_str().unwrap().to_owned();
    let rc = |replicas: i64| {
        json!({"manifest": MANIFEST, "node_selector": "role=web",
        "pod_labels": {}, "replicas_desired": replicas})
    };
    let mut rcs = Vec::new();
    for replicas in [1, 0] {
        let created = app
            .json_request("POST", "/api/v1/rcs", Some(&rc(replicas)), &[])
            .await;
        rcs.push(id(created));
    }
    let created_ds = app
        .json_request("POST", "/api/v1/daemonsets", Some(&ds_body()), &[])
        .await;
    (rcs.try_into().unwrap(), id(created_ds))
}

fn ds_body() -> Value {
    json!({"manifest": MANIFEST, "node_selector": "role=web", "min_health": 0,
           "cluster_name": "c", "timeout": "1m"})
}

/// A delete that keeps losing its check-and-set to other writers answers 409 once the
/// contention deadline passes, as its route documents.
#[tokio::test]
async fn deletes_that_keep_losing_races_answer_as_documented() {
    let doc = document();
    let (app, counting) = TestApp::counted().await;
    let (rcs, ds_id) = two_rcs_and_a_ds(&app).await;
    let roll = json!({"old_rc_id": rcs[0], "new_rc_id": rcs[1], "desired_replicas": 1,
                      "minimum_replicas": 0});
    let roll = app
        .json_request("POST", "/api/v1/rolls", Some(&roll), &[])
        .await;
    let roll_path = format!("/api/v1/rolls/{}", roll.json()["id"].as_str().unwrap());
    let ds_path = format!("/api/v1/daemonsets/{ds_id}");
    counting.lose_txns_on(Some(""));
    let (roll_delete, ds_delete) = tokio::join!(
        app.json_request("DELETE", &roll_path, None, &[]),
        app.json_request("DELETE", &ds_path, None, &[]),
    );
    counting.lose_txns_on(None);
    let mut found = Vec::new();
    for (route, response) in [
        ("/api/v1/rolls/{id}", roll_delete),
        ("/api/v1/daemonsets/{id}", ds_delete),
    ] {
        assert_eq!(response.status, 409, "{route}: {response:?}");
        found.extend(disagreements(&doc, "DELETE", route, &response));
    }
    assert!(found.is_empty(), "{}", found.join("\n\n"));
}

/// Writes of reports and labels without `If-Match` that keep losing to other writers
/// answer the 409 each documents once 5 s have passed; all at once, to wait 5 s only once.
#[tokio::test]
async fn report_and_label_writes_that_keep_losing_races_answer_as_documented() {
    let doc = document();
    let (app, counting) = TestApp::counted().await;
    let yaml = [("content-type", "application/yaml")];
    let passing = json!({"status": "passing"});
    let labeled = json!({"labels": {"az": "a"}});
    for (method, path, body) in [
        ("PUT", "/api/v1/health/hello/n2", Some(&passing)),
        ("PUT", "/api/v1/labels/node/a2", Some(&labeled)),
        ("PUT", "/api/v1/labels/node/b3", Some(&labeled)),
        ("PUT", "/api/v1/labels/node/b4", Some(&labeled)),
    ] {
        let response = app.json_request(method, path, body, &[]).await;
        assert_eq!(response.status, 200, "{method} {path}: {response:?}");
    }
    let reported = app
        .send_raw("PUT", "/api/v1/reality/n2/hello", &yaml, MANIFEST)
        .await;
    assert_eq!(reported.status, 204, "{reported:?}");
    counting.lose_txns_on(Some(""));
    let merge = [("content-type", "application/merge-patch+json")];
    let probes: Vec<Probe<'_>> = vec![
        (
            "PUT",
            "/api/v1/health/{pod_id}/{node}",
            "/api/v1/health/hello/n1".into(),
            Some(passing.clone()),
            vec![],
        ),
        (
            "DELETE",
            "/api/v1/health/{pod_id}/{node}",
            "/api/v1/health/hello/n2".into(),
            None,
            vec![],
        ),
        (
            "DELETE",
            "/api/v1/reality/{node}/{pod_id}",
            "/api/v1/reality/n2/hello".into(),
            None,
            vec![],
        ),
        (
            "PUT",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/a1".into(),
            Some(labeled.clone()),
            vec![],
        ),
        (
            "PATCH",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/a3".into(),
            Some(json!({"labels": {"az": "b"}})),
            merge.to_vec(),
        ),
        (
            "DELETE",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/a2".into(),
            None,
            vec![],
        ),
        (
            "PUT",
            "/api/labels/{type}/{id}",
            "/api/labels/node/b1".into(),
            Some(json!({"values": {"role": "web"}})),
            vec![],
        ),
        (
            "PUT",
            "/api/labels/{type}/{id}/{name}",
            "/api/labels/node/b2/az".into(),
            Some(json!({"value": "b"})),
            vec![],
        ),
        (
            "DELETE",
            "/api/labels/{type}/{id}",
            "/api/labels/node/b3".into(),
            None,
            vec![],
        ),
        (
            "DELETE",
            "/api/labels/{type}/{id}/{name}",
            "/api/labels/node/b4/az".into(),
            None,
            vec![],
        ),
    ];
    let app = &app;
    let sent = probes
        .iter()
        .map(|(method, route, path, body, headers)| async move {
            let response = app.json_request(method, path, body.as_ref(), headers).await;
            (*method, *route, response)
        });
    let (reality, answers) = tokio::join!(
        app.send_raw("PUT", "/api/v1/reality/n1/hello", &yaml, MANIFEST),
        futures::future::join_all(sent),
    );
    counting.lose_txns_on(None);
    let mut found = Vec::new();
    let reality = ("PUT", "/api/v1/reality/{node}/{pod_id}", reality);
    for (method, route, response) in answers.into_iter().chain([reality]) {
        if response.status != 409 {
            found.push(format!("{method} {route}: {response:?}"));
        }
        found.extend(disagreements(&doc, method, route, &response));
    }
    assert!(found.is_empty(), "{}", found.join("\n\n"));
}

/// Reads of objects in every state they show, and writes refused for a version or a
/// conflict.
#[tokio::test]
async fn full_and_refused_answers_are_documented() {
    let doc = document();
    let mut found = Vec::new();
    let app = TestApp::new().await;
    app.put_raw("intent/n1/hello", MANIFEST).await;
    app.put_raw("reality/n1/hello", MANIFEST).await;
    app.put_json("labels/pod/n1/hello", &json!({"pod_id": "hello"}))
        .await;
    app.put_json("labels/node/n1", &json!({"role": "web"}))
        .await;
    let health = json!({"Id": "hello", "Node": "n1", "Service": "hello", "Status": "passing",
        "Time": "2020-01-14T11:06:40Z", "Expires": "2120-01-14T11:06:40Z"});
    app.put_json("health/hello/n1", &health).await;
    let (ids, ds_id) = two_rcs_and_a_ds(&app).await;
    let roll = json!({"old_rc_id": ids[0], "new_rc_id": ids[1], "desired_replicas": 1,
                      "minimum_replicas": 0});
    let stale = [("if-match", "\"1\"")];
    let merge = [("content-type", "application/merge-patch+json")];
    let stale_merge = [
        ("content-type", "application/merge-patch+json"),
        ("if-match", "\"1\""),
    ];
    let (rc0, rc1) = (
        format!("/api/v1/rcs/{}", ids[0]),
        format!("/api/v1/rcs/{}", ids[1]),
    );
    let ds_path = format!("/api/v1/daemonsets/{ds_id}");
    let missing = "00000000-0000-4000-8000-00000000000c";
    let probes: Vec<Probe<'_>> = vec![
        (
            "POST",
            "/api/v1/rolls",
            "/api/v1/rolls".into(),
            Some(roll.clone()),
            vec![],
        ),
        (
            "POST",
            "/api/v1/rolls",
            "/api/v1/rolls".into(),
            Some(roll),
            vec![],
        ),
        (
            "POST",
            "/api/v1/daemonsets",
            "/api/v1/daemonsets".into(),
            Some(ds_body()),
            vec![],
        ),
        ("GET", "/api/v1/rolls", "/api/v1/rolls".into(), None, vec![]),
        ("GET", "/api/v1/rcs", "/api/v1/rcs".into(), None, vec![]),
        ("GET", "/api/v1/rcs/{id}", rc0.clone(), None, vec![]),
        (
            "GET",
            "/api/v1/daemonsets",
            "/api/v1/daemonsets".into(),
            None,
            vec![],
        ),
        (
            "GET",
            "/api/v1/daemonsets/{id}",
            ds_path.clone(),
            None,
            vec![],
        ),
        (
            "GET",
            "/api/v1/events",
            "/api/v1/events".into(),
            None,
            vec![],
        ),
        ("GET", "/api/v1/pods", "/api/v1/pods".into(), None, vec![]),
        ("GET", "/api/v1/nodes", "/api/v1/nodes".into(), None, vec![]),
        (
            "GET",
            "/api/v1/nodes/{node}",
            "/api/v1/nodes/n1".into(),
            None,
            vec![],
        ),
        (
            "GET",
            "/api/v1/health/{pod_id}",
            "/api/v1/health/hello".into(),
            None,
            vec![],
        ),
        (
            "GET",
            "/api/v1/health/{pod_id}/{node}",
            "/api/v1/health/hello/n1".into(),
            None,
            vec![],
        ),
        (
            "GET",
            "/api/v1/intent/{node}/{pod_id}",
            "/api/v1/intent/n1/hello".into(),
            None,
            vec![],
        ),
        (
            "GET",
            "/api/v1/labels/{type}",
            "/api/v1/labels/pod".into(),
            None,
            vec![],
        ),
        (
            "GET",
            "/api/labels/{type}",
            "/api/labels/pod".into(),
            None,
            vec![],
        ),
        (
            "PATCH",
            "/api/v1/rcs/{id}",
            rc0.clone(),
            Some(json!({"replicas_desired": 2})),
            merge.to_vec(),
        ),
        ("DELETE", "/api/v1/rcs/{id}", rc0.clone(), None, vec![]),
        (
            "DELETE",
            "/api/v1/rcs/{id}",
            rc1.clone(),
            None,
            stale.to_vec(),
        ),
        (
            "PATCH",
            "/api/v1/daemonsets/{id}",
            ds_path.clone(),
            Some(json!({"min_health": 1})),
            stale_merge.to_vec(),
        ),
        (
            "PATCH",
            "/api/v1/daemonsets/{id}",
            ds_path.clone(),
            Some(json!({"min_health": 1})),
            merge.to_vec(),
        ),
        (
            "DELETE",
            "/api/v1/daemonsets/{id}",
            ds_path.clone(),
            None,
            stale.to_vec(),
        ),
        (
            "PATCH",
            "/api/v1/daemonsets/{id}",
            format!("/api/v1/daemonsets/{missing}"),
            Some(json!({})),
            merge.to_vec(),
        ),
        (
            "DELETE",
            "/api/v1/daemonsets/{id}",
            format!("/api/v1/daemonsets/{missing}"),
            None,
            vec![],
        ),
        (
            "DELETE",
            "/api/v1/rolls/{id}",
            format!("/api/v1/rolls/{missing}"),
            None,
            vec![],
        ),
        (
            "DELETE",
            "/api/v1/rcs/{id}",
            format!("/api/v1/rcs/{missing}"),
            None,
            vec![],
        ),
        (
            "PATCH",
            "/api/v1/rcs/{id}",
            format!("/api/v1/rcs/{missing}"),
            Some(json!({})),
            merge.to_vec(),
        ),
        (
            "PUT",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/n1".into(),
            Some(json!({"labels": {}})),
            stale.to_vec(),
        ),
        (
            "PATCH",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/n1".into(),
            Some(json!({})),
            stale_merge.to_vec(),
        ),
        (
            "DELETE",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/n1".into(),
            None,
            stale.to_vec(),
        ),
        (
            "DELETE",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/n9".into(),
            None,
            vec![],
        ),
        (
            "PATCH",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/bogus/n1".into(),
            Some(json!({})),
            merge.to_vec(),
        ),
        (
            "PUT",
            "/api/v1/health/{pod_id}/{node}",
            "/api/v1/health/hello/n1".into(),
            Some(json!({"status": "passing"})),
            stale.to_vec(),
        ),
        (
            "DELETE",
            "/api/v1/health/{pod_id}/{node}",
            "/api/v1/health/hello/n1".into(),
            None,
            stale.to_vec(),
        ),
        (
            "DELETE",
            "/api/v1/daemonsets/{id}",
            ds_path.clone(),
            None,
            vec![],
        ),
    ];
    let roll_path = format!("/api/v1/rolls/{}", ids[1]);
    let finished: Vec<Probe<'_>> = vec![
        (
            "DELETE",
            "/api/v1/rolls/{id}",
            roll_path.clone(),
            None,
            vec![],
        ),
        ("GET", "/api/v1/rolls/{id}", roll_path, None, vec![]),
        (
            "GET",
            "/api/v1/rolls",
            "/api/v1/rolls?state=all".into(),
            None,
            vec![],
        ),
        (
            "GET",
            "/api/v1/rolls",
            "/api/v1/rolls?state=bogus".into(),
            None,
            vec![],
        ),
    ];
    for (method, route, path, body, headers) in probes.into_iter().chain(finished) {
        let response = app
            .json_request(method, &path, body.as_ref(), &headers)
            .await;
        found.extend(disagreements(&doc, method, route, &response));
    }
    let stream = app
        .open(
            axum::http::Request::get("/api/v1/watch")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await;
    let watched = TestResponse {
        status: stream.status(),
        headers: stream.headers().clone(),
        body: Default::default(),
    };
    found.extend(disagreements(&doc, "GET", "/api/v1/watch", &watched));
    // Each event's data is documented as the component (the stream itself as text).
    let schema = &json!({"$ref": "#/components/schemas/WatchEvent"});
    let events = snapshot(stream.into_body()).await;
    // Two RCs, a node, three label sets, a pod, its reality and health, and `synced`; the
    // daemon set deleted above too until the watch confirms its delete, which it may have.
    assert!(events.len() >= 10, "{events:?}");
    for (name, data) in events {
        validate(&doc, schema, &data, &format!("event {name}"), &mut found);
        if data["type"] != name.as_str() {
            found.push(format!("event {name} has data of type {}", data["type"]));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n\n"));
}

/// The events of a change stream up to its `synced`, each as its name and data.
async fn snapshot(mut body: axum::body::Body) -> Vec<(String, Value)> {
    let events = events_until(&mut body, "synced").await;
    let synced = events.last().is_some_and(|(name, _)| name == "synced");
    assert!(synced, "the stream ended in its snapshot: {events:?}");
    events
}

/// The events of a change stream, each as its name and data, until one named `last` or the
/// end of the stream.
async fn events_until(body: &mut axum::body::Body, last: &str) -> Vec<(String, Value)> {
    use http_body_util::BodyExt;
    let mut text = String::new();
    let mut events = Vec::new();
    loop {
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let field = |name: &str| {
                let prefix = format!("{name}: ");
                block
                    .lines()
                    .find_map(|line| Some(line.strip_prefix(&prefix)?.to_owned()))
            };
            let (Some(name), Some(data)) = (field("event"), field("data")) else {
                continue;
            };
            let done = name == last;
            events.push((name, serde_json::from_str(&data).unwrap()));
            if done {
                return events;
            }
        }
        let frame = tokio::time::timeout(std::time::Duration::from_secs(10), body.frame())
            .await
            .expect("the stream went silent");
        let Some(frame) = frame else {
            return events;
        };
        if let Ok(data) = frame.unwrap().into_data() {
            text.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
}

/// Every type of event the change stream sends (a snapshot's `added` and `synced`, a
/// change's `modified` and `deleted`, `resync` for a position no longer retained, `dropped`
/// for a client too far behind) is one that the `WatchEvent` component's `type` names as a
/// value it takes, and the component names no other: an SDK can match on the type
/// exhaustively. Each event's data is as the component describes, its `type` the SSE name.
#[tokio::test]
async fn every_type_of_change_stream_event_is_documented() {
    use p2_apiserver::state::MirrorConfig;

    let doc = document();
    let config = MirrorConfig {
        retained_changes: 2,
        subscriber_buffer: 4,
        ..MirrorConfig::default()
    };
    let app = TestApp::configured(|store| store, config).await;
    let open = |last: Option<String>| {
        let app = &app;
        async move {
            let mut request = axum::http::Request::get("/api/v1/watch?kinds=nodes");
            if let Some(last) = last {
                request = request.header("last-event-id", last);
            }
            let response = app
                .open(request.body(axum::body::Body::empty()).unwrap())
                .await;
            assert_eq!(response.status(), 200);
            response.into_body()
        }
    };
    let label = |node: &'static str, role: &'static str| {
        let app = &app;
        async move {
            let body = json!({"labels": {"role": role}});
            let path = format!("/api/v1/labels/node/{node}");
            let put = app.json_request("PUT", &path, Some(&body), &[]).await;
            assert_eq!(put.status, 200, "{put:?}");
        }
    };
    let mut events = Vec::new();
    let mut stream = open(None).await;
    let mut slow = open(None).await;
    events.extend(events_until(&mut slow, "synced").await);
    events.extend(events_until(&mut stream, "synced").await);
    let resume_from = events.last().unwrap().1["index"].to_string();
    label("n1", "web").await;
    label("n1", "db").await;
    let deleted = app
        .json_request("DELETE", "/api/v1/labels/node/n1", None, &[])
        .await;
    assert_eq!(deleted.status, 204, "{deleted:?}");
    events.extend(events_until(&mut stream, "deleted").await);
    for node in ["n2", "n3", "n4", "n5", "n6"] {
        label(node, "web").await;
    }
    // Past the retained changes: a stream resumed from before them starts again.
    let mut resumed = open(Some(resume_from)).await;
    events.extend(events_until(&mut resumed, "synced").await);
    // Past the slow client's buffer: it is cut off.
    events.extend(events_until(&mut slow, "dropped").await);
    let schema = json!({"$ref": "#/components/schemas/WatchEvent"});
    let mut found = Vec::new();
    let mut sent = std::collections::BTreeSet::new();
    for (name, data) in &events {
        validate(&doc, &schema, data, &format!("event {name}"), &mut found);
        if data["type"] != name.as_str() {
            found.push(format!("event {name} has data of type {}", data["type"]));
        }
        sent.insert(name.clone());
    }
    let documented: std::collections::BTreeSet<String> = resolved(
        &doc,
        &doc["components"]["schemas"]["WatchEvent"]["properties"]["type"],
    )["enum"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|value| value.as_str().unwrap().to_owned())
        .collect();
    if documented != sent {
        found.push(format!("types sent {sent:?}, documented {documented:?}"));
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// A query parameter taking one of a few values is documented with them, and the server
/// takes each and refuses another: a generated SDK offers exactly what the server takes.
#[tokio::test]
async fn closed_query_values_are_documented_as_enums() {
    let doc = document();
    let app = TestApp::new().await;
    let values = |path: &str, name: &str| {
        let parameters = doc["paths"][path]["get"]["parameters"].as_array().unwrap();
        let parameter = parameters.iter().find(|p| p["name"] == name).unwrap();
        let mut schema = &parameter["schema"];
        if let Some(reference) = schema["$ref"].as_str() {
            let name = reference.trim_start_matches("#/components/schemas/");
            schema = &doc["components"]["schemas"][name];
        }
        let values = schema["enum"].as_array();
        let values = values.unwrap_or_else(|| panic!("{path} {name}: no enum in {schema}"));
        values
            .iter()
            .map(|value| value.as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let states = values("/api/v1/rolls", "state");
    assert_eq!(states, ["active", "finished", "all"]);
    for state in states {
        let response = app.get(&format!("/api/v1/rolls?state={state}")).await;
        assert_eq!(response.status, 200, "{state}: {response:?}");
    }
    assert_eq!(app.get("/api/v1/rolls?state=done").await.status, 422);
    let types = values("/api/select", "type");
    assert_eq!(types.len(), 5, "{types:?}");
    for label_type in types {
        let response = app.get(&format!("/api/select?type={label_type}")).await;
        assert_eq!(response.status, 200, "{label_type}: {response:?}");
    }
    assert_eq!(app.get("/api/select?type=pods").await.status, 400);
}

/// Strings are checked against the formats the document gives them, as an SDK parsing
/// them would be.
#[test]
fn strings_are_checked_against_their_format() {
    let doc = json!({});
    for (format, good, bad) in [
        ("date-time", "2026-12-06T11:40:00.5Z", "yesterday"),
        ("uuid", "00000000-0000-4000-8000-000000000001", "rc-1"),
    ] {
        let schema = json!({"type": "string", "format": format});
        let mut problems = Vec::new();
        validate(&doc, &schema, &json!(good), "value", &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        validate(&doc, &schema, &json!(bad), "value", &mut problems);
        assert_eq!(problems.len(), 1, "{format}");
    }
}

/// Every reference in the document names a schema it defines.
#[test]
fn every_reference_resolves() {
    fn walk(doc: &Value, value: &Value, missing: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(reference)) = map.get("$ref") {
                    let name = reference.trim_start_matches("#/components/schemas/");
                    if doc["components"]["schemas"].get(name).is_none() {
                        missing.push(reference.clone());
                    }
                }
                map.values().for_each(|inner| walk(doc, inner, missing));
            }
            Value::Array(items) => items.iter().for_each(|inner| walk(doc, inner, missing)),
            _ => {}
        }
    }
    let doc = document();
    let mut missing = Vec::new();
    walk(&doc, &doc, &mut missing);
    assert!(missing.is_empty(), "{missing:?}");
}

/// With the store unreachable, every 503 is documented and carries the `Retry-After` the
/// document gives it, as the refusal of a connection past the cap does.
#[tokio::test]
async fn answers_while_the_store_is_unreachable_are_documented() {
    use std::sync::atomic::Ordering;

    use crate::support::switchable;

    let doc = document();
    let (app, switch) = switchable::app(Default::default(), None).await;
    switch.cut.store(true, Ordering::SeqCst);
    let mut found = Vec::new();
    let rc = json!({"manifest": MANIFEST, "node_selector": "role=web", "replicas_desired": 0});
    let probes: Vec<Probe<'_>> = vec![
        ("GET", "/readyz", "/readyz".into(), None, vec![]),
        (
            "POST",
            "/api/v1/rcs",
            "/api/v1/rcs".into(),
            Some(rc),
            vec![],
        ),
        (
            "PUT",
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/node/n1".into(),
            Some(json!({"labels": {}})),
            vec![],
        ),
        (
            "GET",
            "/api/v1/rcs",
            "/api/v1/rcs?consistent=true".into(),
            None,
            vec![],
        ),
        (
            "DELETE",
            "/api/labels/{type}/{id}",
            "/api/labels/node/n1".into(),
            None,
            vec![],
        ),
    ];
    for (method, route, path, body, headers) in probes {
        let response = app
            .json_request(method, &path, body.as_ref(), &headers)
            .await;
        assert_eq!(response.status, 503, "{method} {path}: {response:?}");
        assert_eq!(response.header("retry-after"), Some("1"), "{response:?}");
        found.extend(disagreements(&doc, method, route, &response));
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let unavailable = &op["responses"]["503"];
            assert!(
                unavailable["headers"].get("Retry-After").is_some(),
                "{method} {path}: {unavailable}"
            );
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n\n"));
}

/// Every API operation reads or writes the store, which may refuse the server's own
/// credentials: the 500 that gives is documented on each, with the one error body.
#[test]
fn every_api_operation_documents_the_500_of_a_store_refusing_the_server() {
    let doc = document();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !path.starts_with("/api/") {
            continue;
        }
        for (method, op) in item.as_object().unwrap() {
            let internal = &op["responses"]["500"]["content"]["application/json"]["schema"];
            assert_eq!(
                internal["$ref"], "#/components/schemas/ErrorBody",
                "{method} {path}"
            );
            checked += 1;
        }
    }
    assert!(checked > 30, "only {checked}");
    let refused = ApiError::from(StoreError::Forbidden("ACL not found".into()));
    assert_eq!(refused.status(), 500);
}

/// Every operation that reads a body documents each content type its handler takes, and
/// only those, so that an SDK built from the document may send a patch as
/// `application/json`, or a manifest as `text/yaml`, wherever the server takes it. P2's
/// label routes (`/api/labels/...`) are the exception: as P2's, they read a body as JSON
/// whatever its type, and document the one an SDK should send.
#[tokio::test]
async fn every_body_documents_the_content_types_it_takes() {
    let doc = document();
    let app = TestApp::new().await;
    let mut found = Vec::new();
    let mut checked = 0;
    for (route, item) in doc["paths"].as_object().unwrap() {
        if route.starts_with("/api/labels/") {
            continue;
        }
        for (method, op) in item.as_object().unwrap() {
            let Some(documented) = op["requestBody"]["content"].as_object() else {
                continue;
            };
            let method = method.to_ascii_uppercase();
            let path = sample_path(route, "00000000-0000-4000-8000-000000000009");
            for content_type in [
                "application/merge-patch+json",
                "application/json",
                "application/yaml",
                "application/x-yaml",
                "text/yaml",
                "text/plain",
            ] {
                let headers = [("content-type", content_type)];
                let response = app.send_raw(&method, &path, &headers, "{}").await;
                let taken = response.status != 415;
                if taken != documented.contains_key(content_type) {
                    found.push(format!(
                        "{method} {route} as {content_type}: answered {}, documented {:?}",
                        response.status,
                        documented.keys().collect::<Vec<_>>()
                    ));
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 9, "only {checked} operations read a body");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// `route` with its parameters filled in: a node's labels, `id` for an object's id, pod
/// `hello` on node `n1`, label `a`.
fn sample_path(route: &str, id: &str) -> String {
    route
        .replace("{type}", "node")
        .replace("{id}", id)
        .replace("{pod_id}", "hello")
        .replace("{node}", "n1")
        .replace("{name}", "a")
}

/// `schema` with its `$ref` followed.
fn resolved<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(reference) => {
            &doc["components"]["schemas"][reference.trim_start_matches("#/components/schemas/")]
        }
        None => schema,
    }
}

/// Whether `schema` lets a value be `null`.
fn nullable(doc: &Value, schema: &Value) -> bool {
    let schema = resolved(doc, schema);
    match &schema["type"] {
        Value::String(kind) => kind == "null",
        Value::Array(kinds) => kinds.contains(&"null".into()),
        _ => match schema["oneOf"].as_array() {
            Some(choices) => choices.iter().any(|choice| nullable(doc, choice)),
            None => true,
        },
    }
}

/// Text fields whose grammar the document gives in words: durations and selectors.
const WORDED_GRAMMARS: [&str; 4] = ["timeout", "roll_delay", "node_selector", "old_rc_selector"];

/// `schema` with its `$ref` followed, and of a `oneOf` of `null` and one other, the other.
fn not_null<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    let schema = resolved(doc, schema);
    let choices = schema["oneOf"].as_array().into_iter().flatten();
    let mut others = choices.filter(|choice| choice["type"] != "null");
    match (others.next(), others.next()) {
        (Some(other), None) => resolved(doc, other),
        _ => schema,
    }
}

/// Whether `schema` takes values of type `kind` (`integer`, `string`, ...).
fn is_of_type(schema: &Value, kind: &str) -> bool {
    match &schema["type"] {
        Value::String(one) => one == kind,
        Value::Array(kinds) => kinds.contains(&kind.into()),
        _ => false,
    }
}

/// The fields the causes of a refusal name, each by its top-level field.
fn refused_fields(response: &TestResponse) -> Vec<(String, String)> {
    if response.status.is_success() {
        return Vec::new();
    }
    let error = response.json();
    let causes = error["causes"].as_array().cloned().unwrap_or_default();
    causes
        .iter()
        .map(|cause| {
            let field = cause["field"].as_str().unwrap_or_default();
            let top = field.split(['.', '[']).next().unwrap_or_default();
            (
                top.to_owned(),
                cause["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Every JSON request body is documented as the server reads it, so that an SDK built from
/// the document sends what the server takes: its fields are listed; an unknown field is
/// refused exactly where the schema says `additionalProperties: false`; and `null` is taken
/// for a field (as its absence, or as a value) exactly where the schema says it is nullable.
#[tokio::test]
async fn every_json_request_body_documents_the_fields_the_server_takes() {
    let doc = document();
    let app = TestApp::new().await;
    let ([rc_id, _], ds_id) = two_rcs_and_a_ds(&app).await;
    let mut found = Vec::new();
    let mut checked = 0;
    for (route, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let Some(content) = op["requestBody"]["content"].as_object() else {
                continue;
            };
            let Some((content_type, media)) = content
                .iter()
                .find(|(content_type, _)| content_type.ends_with("json"))
            else {
                continue;
            };
            let id = if route.starts_with("/api/v1/rcs") {
                rc_id.as_str()
            } else if route.starts_with("/api/v1/daemonsets") {
                ds_id.as_str()
            } else {
                "n1"
            };
            let path = sample_path(route, id);
            let method = method.to_ascii_uppercase();
            let name = format!("{method} {route}");
            let headers = [("content-type", content_type.as_str())];
            let send = |body: Value| {
                let (app, method, path) = (&app, &method, &path);
                async move {
                    let response = app.send_raw(method, path, &headers, body.to_string()).await;
                    refused_fields(&response)
                }
            };
            checked += 1;
            let schema = resolved(&doc, &media["schema"]);
            let Some(properties) = schema["properties"].as_object() else {
                found.push(format!(
                    "{name}: the body's fields are not documented: {schema}"
                ));
                continue;
            };
            let unknown = "zz_not_a_field";
            let refused = send(json!({ unknown: 1 })).await;
            let refuses_unknown = refused.iter().any(|(field, _)| field == unknown);
            let documented_closed = schema["additionalProperties"] == false;
            if refuses_unknown != documented_closed {
                found.push(format!(
                    "{name}: an unknown field refused: {refuses_unknown}, documented \
                     additionalProperties: false: {documented_closed}"
                ));
            }
            let required = schema["required"].as_array().cloned().unwrap_or_default();
            let absent = send(json!({})).await;
            // A body whose other fields are valid, as a creation checks its numbers only
            // then; one allowing every documented number in another field (a roll's minimum
            // is at most its target).
            let valid = match (method.as_str(), route.as_str()) {
                ("POST", "/api/v1/rcs") => json!({"manifest": MANIFEST}),
                ("POST", "/api/v1/rolls") => json!({"old_rc_id": rc_id,
                    "new_rc": {"manifest": MANIFEST}, "desired_replicas": 10_000,
                    "minimum_replicas": 0}),
                ("POST", "/api/v1/daemonsets") => {
                    json!({"manifest": MANIFEST, "node_selector": "role=db", "timeout": "1m"})
                }
                _ => json!({}),
            };
            for (field, property) in properties {
                let about = |causes: &[(String, String)]| {
                    causes
                        .iter()
                        .filter(|(named, _)| named == field)
                        .cloned()
                        .collect::<Vec<_>>()
                };
                let is_required = required.contains(&field.as_str().into());
                let takes = |causes: &[(String, String)]| {
                    if is_required {
                        about(causes).is_empty()
                    } else {
                        about(causes) == about(&absent)
                    }
                };
                // Values to send in the field, each with whether the document allows it.
                let shape = not_null(&doc, property);
                let mut trials: Vec<(Value, bool)> = Vec::new();
                if is_of_type(shape, "integer") {
                    let bound = |name: &str| shape[name].as_i64();
                    for number in [-1, 0, 1, 10_000, 10_001, i64::MAX] {
                        let documented = bound("minimum").is_none_or(|least| number >= least)
                            && bound("maximum").is_none_or(|most| number <= most);
                        trials.push((number.into(), documented));
                    }
                }
                if is_of_type(shape, "string") && !WORDED_GRAMMARS.contains(&field.as_str()) {
                    let values = shape["enum"].as_array().cloned();
                    // An enum rules an arbitrary word out, as a pattern not matching it does.
                    let rules_out =
                        |pattern: &str| !regex::Regex::new(pattern).unwrap().is_match("zz");
                    let closed =
                        values.is_some() || shape["pattern"].as_str().is_some_and(rules_out);
                    trials.extend(values.into_iter().flatten().map(|text| (text, true)));
                    trials.push(("zz".into(), !closed));
                }
                for (value, documented) in trials {
                    let mut body = valid.clone();
                    body[field] = value.clone();
                    let answer = send(body).await;
                    if takes(&answer) != documented {
                        found.push(format!(
                            "{name}: {field}: {value} taken: {}, documented: {documented}; {:?}",
                            takes(&answer),
                            about(&answer)
                        ));
                    }
                }
                let nulled = send(json!({ field: null })).await;
                let takes_null = takes(&nulled);
                if takes_null != nullable(&doc, property) {
                    found.push(format!(
                        "{name}: {field}: null taken: {takes_null}, documented nullable: {}; \
                         {:?}",
                        !takes_null,
                        about(&nulled)
                    ));
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} bodies");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Creations, patches and the RC delete that keep losing their check-and-set to other
/// writers answer a status their route documents (the report, label, roll and daemon-set
/// deletes are checked above); all at once, to wait out the contention deadline only once.
#[tokio::test]
async fn creations_and_patches_that_keep_losing_races_answer_as_documented() {
    let doc = document();
    let (app, counting) = TestApp::counted().await;
    let ([rc_id, spare_rc], ds_id) = two_rcs_and_a_ds(&app).await;
    let rc = json!({"manifest": MANIFEST, "node_selector": "role=web", "replicas_desired": 0});
    let roll = json!({"old_rc_id": rc_id, "new_rc": {"manifest": MANIFEST},
                      "desired_replicas": 1, "minimum_replicas": 0});
    let merge = vec![("content-type", "application/merge-patch+json")];
    let (rc_path, spare_path) = (
        format!("/api/v1/rcs/{rc_id}"),
        format!("/api/v1/rcs/{spare_rc}"),
    );
    let probes: Vec<Probe<'_>> = vec![
        (
            "POST",
            "/api/v1/rcs",
            "/api/v1/rcs".into(),
            Some(rc),
            vec![],
        ),
        (
            "PATCH",
            "/api/v1/rcs/{id}",
            rc_path,
            Some(json!({"replicas_desired": 2})),
            merge.clone(),
        ),
        ("DELETE", "/api/v1/rcs/{id}", spare_path, None, vec![]),
        (
            "POST",
            "/api/v1/rolls",
            "/api/v1/rolls".into(),
            Some(roll),
            vec![],
        ),
        (
            "POST",
            "/api/v1/daemonsets",
            "/api/v1/daemonsets".into(),
            Some(json!({"manifest": MANIFEST, "node_selector": "role=db", "timeout": "1m"})),
            vec![],
        ),
        (
            "PATCH",
            "/api/v1/daemonsets/{id}",
            format!("/api/v1/daemonsets/{ds_id}"),
            Some(json!({"min_health": 1})),
            merge,
        ),
    ];
    counting.lose_txns_on(Some(""));
    let app = &app;
    let sent = probes
        .iter()
        .map(|(method, route, path, body, headers)| async move {
            let response = app.json_request(method, path, body.as_ref(), headers).await;
            (*method, *route, response)
        });
    let answers = futures::future::join_all(sent).await;
    counting.lose_txns_on(None);
    let mut found = Vec::new();
    for (method, route, response) in answers {
        assert!(
            !response.status.is_success(),
            "{method} {route}: {response:?}"
        );
        found.extend(disagreements(&doc, method, route, &response));
    }
    assert!(found.is_empty(), "{}", found.join("\n\n"));
}

/// A read of P2's labels whose id has more `/`-separated parts than its type's ids (two
/// for a pod, one for any other) names a label's path, where GET is not taken: the 405 and
/// its `Allow` are documented on the read, which an SDK sends such an id through.
#[tokio::test]
async fn a_p2_label_read_of_a_label_path_is_documented() {
    let doc = document();
    let app = TestApp::new().await;
    let mut found = Vec::new();
    for path in ["/api/labels/node/a%2Fb", "/api/labels/pod/n1/hello/x"] {
        let response = app.get(path).await;
        assert_eq!(response.status, 405, "{response:?}");
        found.extend(disagreements(
            &doc,
            "GET",
            "/api/labels/{type}/{id}",
            &response,
        ));
    }
    assert!(found.is_empty(), "{}", found.join("\n\n"));
}

/// The refusals of authentication and roles are documented with the headers they carry
/// (`WWW-Authenticate` on a 401).
#[tokio::test]
async fn refusals_of_tokens_are_documented() {
    use sha2::{Digest, Sha256};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.yaml");
    let digest = format!("{:x}", Sha256::digest(b"viewer-token"));
    let tokens = format!("tokens:\n  - {{name: viewer, role: viewer, sha256: {digest}}}\n");
    std::fs::write(&path, tokens).unwrap();
    let access = p2_apiserver::auth::Access::new(Some(&path), Vec::new()).unwrap();
    let app = TestApp::secured(std::sync::Arc::new(access)).await;
    let doc = document();
    let mut found = Vec::new();
    let rc = json!({"manifest": MANIFEST});
    for (headers, status) in [
        (vec![], 401),
        (vec![("authorization", "Bearer nobody")], 401),
        (vec![("authorization", "Bearer viewer-token")], 403),
    ] {
        for (method, body) in [("GET", None), ("POST", Some(&rc))] {
            if method == "GET" && status == 403 {
                continue;
            }
            let response = app
                .json_request(method, "/api/v1/rcs", body, &headers)
                .await;
            assert_eq!(response.status, status, "{method}: {response:?}");
            found.extend(disagreements(&doc, method, "/api/v1/rcs", &response));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n\n"));
}

/// A client's `X-Request-Id` is taken (and answered, and named by the events of its
/// changes): every operation documents it as a parameter.
#[tokio::test]
async fn every_operation_documents_the_request_id_it_takes() {
    let doc = document();
    let app = TestApp::new().await;
    let response = app
        .json_request("GET", "/api/v1/rcs", None, &[("x-request-id", "mine-1")])
        .await;
    assert_eq!(
        response.header("x-request-id"),
        Some("mine-1"),
        "{response:?}"
    );
    let mut missing = Vec::new();
    for (route, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let parameters = op["parameters"].as_array().cloned().unwrap_or_default();
            let documented = parameters
                .iter()
                .any(|p| p["name"] == "X-Request-Id" && p["in"] == "header");
            if !documented {
                missing.push(format!("{method} {route}"));
            }
        }
    }
    assert!(missing.is_empty(), "{missing:?}");
}

/// Every path parameter, and every query filter by node or pod id, is documented with the
/// shape the server holds it to: a value with a space in it (which no id takes) is refused
/// exactly where the parameter's schema has a pattern or a closed set of values that rules
/// it out.
#[tokio::test]
async fn every_id_parameter_documents_the_values_the_server_takes() {
    let doc = document();
    let app = TestApp::new().await;
    let good = |name: &str| match name {
        "id" => "00000000-0000-4000-8000-000000000009",
        "type" => "node",
        "name" => "a",
        "pod_id" => "hello",
        _ => "n1",
    };
    let mut found = Vec::new();
    for (route, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let parameters = op["parameters"].as_array().cloned().unwrap_or_default();
            // Path parameters, and the query filters by node and pod id.
            let id_shaped = |p: &&Value| {
                p["in"] == "path"
                    || (p["in"] == "query"
                        && ["node", "pod_id"].contains(&p["name"].as_str().unwrap()))
            };
            for parameter in parameters.iter().filter(id_shaped) {
                let name = parameter["name"].as_str().unwrap();
                // An object id of the label routes is of its label type's shape, one of
                // five, which the parameter gives in words.
                if route.contains("labels/{type}") && ["id", "name"].contains(&name) {
                    continue;
                }
                let schema = resolved(&doc, &parameter["schema"]);
                let closed = schema["pattern"].is_string() || schema["enum"].is_array();
                let mut path = match parameter["in"].as_str() {
                    Some("query") => format!("{route}?{name}=a%20b"),
                    _ => route.replace(&format!("{{{name}}}"), "a%20b"),
                };
                for other in parameters.iter().filter(|p| p["in"] == "path") {
                    let other = other["name"].as_str().unwrap();
                    path = path.replace(&format!("{{{other}}}"), good(other));
                }
                let method = method.to_ascii_uppercase();
                // A body the route takes, so that only the path can be refused.
                let content = op["requestBody"]["content"].as_object();
                let content_type = content
                    .and_then(|types| types.keys().next().cloned())
                    .unwrap_or_else(|| "application/json".to_owned());
                let headers = [("content-type", content_type.as_str())];
                let body = match (method.as_str(), route.as_str()) {
                    _ if content.is_none() => "",
                    ("PUT", "/api/v1/labels/{type}/{id}") => r#"{"labels":{}}"#,
                    ("PUT", "/api/v1/health/{pod_id}/{node}") => r#"{"status":"passing"}"#,
                    ("PUT", "/api/v1/reality/{node}/{pod_id}") => MANIFEST,
                    _ => "{}",
                };
                let response = app.send_raw(&method, &path, &headers, body).await;
                let named = refused_fields(&response)
                    .iter()
                    .any(|(field, _)| field == name)
                    || String::from_utf8_lossy(&response.body).contains("a b");
                let refused = response.status.is_client_error() && named;
                if refused != closed {
                    found.push(format!(
                        "{method} {route}: {name} \"a b\" refused: {refused}, documented \
                         closed: {closed}; {response:?}"
                    ));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Every `If-Match` parameter documents the values the server takes: a value matching its
/// pattern is never refused as a malformed `If-Match`, and one not matching always is, so a
/// tool or SDK checking the header against the document sends what the server reads.
#[tokio::test]
async fn every_if_match_documents_the_values_the_server_takes() {
    let doc = document();
    let app = TestApp::new().await;
    let values = [
        "\"5\"",
        "W/\"5\"",
        "5",
        "*",
        " * ",
        "\"5\", W/\"6\"",
        "\"5\",,\"6\",",
        "\"0\"",
        "\"9223372036854775807\"",
        "",
        ",",
        "W/\"FczOAyF\"",
        "\"+5\"",
        "\"05\"",
        "\"5\" \"6\"",
        "*, \"5\"",
        "\"5",
    ];
    let mut checked = 0;
    let mut found = Vec::new();
    for (route, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let parameters = op["parameters"].as_array().cloned().unwrap_or_default();
            let Some(if_match) = parameters.iter().find(|p| p["name"] == "If-Match") else {
                continue;
            };
            let pattern = if_match["schema"]["pattern"].as_str();
            let Some(documented) = pattern.map(|pattern| regex::Regex::new(pattern).unwrap())
            else {
                found.push(format!("{method} {route}: If-Match has no pattern"));
                continue;
            };
            checked += 1;
            let path = sample_path(route, "00000000-0000-4000-8000-000000000009");
            let method = method.to_ascii_uppercase();
            for value in values {
                let headers = [("if-match", value), ("content-type", "application/json")];
                let response = app.send_raw(&method, &path, &headers, "{}").await;
                let refused = response.status == 400
                    && String::from_utf8_lossy(&response.body).contains("If-Match");
                if refused == documented.is_match(value) {
                    found.push(format!(
                        "{method} {route}: If-Match {value:?} refused: {refused}, documented: \
                         {}; {response:?}",
                        documented.is_match(value)
                    ));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    assert!(checked >= 10, "only {checked} operations take If-Match");
}

/// A query parameter that the server refuses empty is documented so that empty is no
/// value of it (an enum without `""`, a pattern or format not taking it, a list of at
/// least one): a tool or SDK sending every value its schema allows sends no `name=` the
/// server refuses.
#[tokio::test]
async fn every_query_parameter_refused_empty_is_documented_so() {
    let doc = document();
    let app = TestApp::new().await;
    let takes_empty = |schema: &Value| {
        let schema = resolved(&doc, schema);
        if let Some(values) = schema["enum"].as_array() {
            return values.contains(&"".into());
        }
        let pattern = schema["pattern"].as_str();
        !is_of_type(schema, "array")
            && schema["format"].is_null()
            && schema["minLength"].as_u64().unwrap_or(0) == 0
            && pattern.is_none_or(|pattern| regex::Regex::new(pattern).unwrap().is_match(""))
    };
    let mut checked = 0;
    let mut found = Vec::new();
    for (route, item) in doc["paths"].as_object().unwrap() {
        // The change stream, whose answer never ends, has its `kinds` checked in `watch`.
        let Some(parameters) = item["get"]["parameters"].as_array() else {
            continue;
        };
        if route == "/api/v1/watch" {
            continue;
        }
        let path = sample_path(route, "00000000-0000-4000-8000-000000000009");
        for parameter in parameters.iter().filter(|p| p["in"] == "query") {
            let name = parameter["name"].as_str().unwrap();
            let schema = &parameter["schema"];
            if !is_of_type(resolved(&doc, schema), "string") && schema["$ref"].is_null() {
                continue;
            }
            checked += 1;
            let other = if route == "/api/select" && name != "type" {
                "&type=node"
            } else {
                ""
            };
            let response = app.get(&format!("{path}?{name}={other}")).await;
            let refused = refused_fields(&response)
                .iter()
                .any(|(field, _)| field == name)
                || (response.status == 400 && route == "/api/select");
            if refused && takes_empty(schema) {
                found.push(format!(
                    "GET {route}: {name}= refused but documented; {response:?}"
                ));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    assert!(checked >= 20, "only {checked} parameters");
}

/// A body over the limit is refused whether the operation reads one or not, since every
/// request's body is read before its handler runs: the 413 is documented on each.
#[tokio::test]
async fn oversized_bodies_are_refused_as_documented_on_every_operation() {
    let doc = document();
    let app = TestApp::new().await;
    let oversized = "a".repeat(router::MAX_BODY_BYTES + 1);
    let mut found = Vec::new();
    for (route, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let method = method.to_ascii_uppercase();
            let path = sample_path(route, "00000000-0000-4000-8000-000000000009");
            let headers = [("content-type", "application/json")];
            let response = app
                .send_raw(&method, &path, &headers, oversized.clone())
                .await;
            assert_eq!(response.status, 413, "{method} {path}: {response:?}");
            found.extend(disagreements(&doc, &method, route, &response));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Labels the store holds that do not decode are answered as an RC that does not decode is:
/// 500 `UnreadableDocument`, saying how to clear them, by every read of one object's labels
/// (from the mirror and from the store), while listings leave them out. A PUT replaces them.
#[tokio::test]
async fn unreadable_labels_say_so_and_how_to_clear_them() {
    let app = TestApp::new().await;
    app.put_json("labels/node/good", &json!({"role": "web"}))
        .await;
    app.put_raw("labels/node/bad", "{not json").await;
    for path in [
        "/api/v1/labels/node/bad",
        "/api/v1/labels/node/bad?consistent=true",
        "/api/v1/nodes/bad",
        "/api/v1/nodes/bad?consistent=true",
        "/api/labels/node/bad",
    ] {
        let error = app.get(path).await.error();
        assert_eq!(error.reason, "UnreadableDocument", "{path}: {error:?}");
        assert!(
            error.message.contains("PUT /api/v1/labels/node/bad"),
            "{path}: {error:?}"
        );
    }
    let listed = app.get("/api/v1/nodes").await.json();
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");

    let put = app
        .json_request(
            "PUT",
            "/api/v1/labels/node/bad",
            Some(&json!({"labels": {"role": "db"}})),
            &[],
        )
        .await;
    assert_eq!(put.status, 200, "{put:?}");
    let node = app.get("/api/v1/nodes/bad?consistent=true").await.json();
    assert_eq!(node["labels"], json!({"role": "db"}));
}
