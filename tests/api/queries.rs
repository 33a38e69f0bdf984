//! Query strings on every route: the parameters of every listing, checked before any store
//! work or blocking with every problem named at once, and 400 for a parameter a route does
//! not take.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use p2_apiserver::router;
use serde_json::{json, Value};

use crate::support::api::{TestApp, TestResponse};

/// Every list route, each answering `X-Index`.
const LISTS: [&str; 8] = [
    "/api/v1/rcs",
    "/api/v1/rolls",
    "/api/v1/daemonsets",
    "/api/v1/labels/node",
    "/api/v1/pods",
    "/api/v1/nodes",
    "/api/v1/health/hello",
    "/api/v1/events",
];

const LIST_PARAMS: &str = "limit, continue, selector, index, wait";

fn spec() -> Value {
    json!({
        "manifest": "id: hello\nlaunchables: {}\n",
        "node_selector": "role=web",
        "replicas_desired": 0,
    })
}

/// `path` with its query added to any it has.
fn with_query(path: &str, query: &str) -> String {
    let join = if path.contains('?') { '&' } else { '?' };
    format!("{path}{join}{query}")
}

/// Checks a 400 naming exactly `unknown` and saying `accepted`.
fn assert_unknown(response: &TestResponse, unknown: &str, accepted: &str) {
    assert_eq!(response.status, StatusCode::BAD_REQUEST, "{response:?}");
    let error = response.error();
    assert_eq!(
        error.message,
        format!("unknown query parameter `{unknown}`; {accepted}")
    );
    assert_eq!(response.cause_fields(), [unknown]);
}

/// One operation of the document, at a path a request can be sent to.
struct Operation {
    method: String,
    path: String,
    /// `METHOD template`, for messages.
    name: String,
    spec: Value,
}

/// Every operation of the document, its path parameters filled in.
fn operations() -> Vec<Operation> {
    let (_, openapi) = router::api().split_for_parts();
    let document = serde_json::to_value(&openapi).unwrap();
    let mut operations = Vec::new();
    for (template, item) in document["paths"].as_object().unwrap() {
        let path = template
            .replace("{type}", "node")
            .replace("{id}", "node1")
            .replace("{node}", "node1")
            .replace("{pod_id}", "hello")
            .replace("{name}", "role");
        for (method, spec) in item.as_object().unwrap() {
            let method = method.to_uppercase();
            operations.push(Operation {
                name: format!("{method} {template}"),
                method,
                path: path.clone(),
                spec: spec.clone(),
            });
        }
    }
    operations
}

#[tokio::test]
async fn every_operation_refuses_a_parameter_it_does_not_take() {
    let app = TestApp::new().await;
    let mut checked = 0;
    for Operation {
        method,
        path,
        name,
        spec,
    } in operations()
    {
        let response = app
            .json_request(&method, &with_query(&path, "zz_unknown=1"), None, &[])
            .await;
        assert_eq!(
            response.status,
            StatusCode::BAD_REQUEST,
            "{name}: {response:?}"
        );
        let error = response.error();
        assert!(
            error
                .message
                .starts_with("unknown query parameter `zz_unknown`; "),
            "{name}: {error:?}"
        );
        assert_eq!(response.cause_fields(), ["zz_unknown"], "{name}");
        assert!(
            spec["responses"]["400"].is_object(),
            "{name} does not document its 400"
        );
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} operations");
    assert!(app.dump().await.is_empty(), "a refused request wrote");
}

/// What an operation says it accepts when refusing a parameter is what its document offers:
/// no parameter taken but undocumented, none documented but refused.
#[tokio::test]
async fn every_operation_accepts_the_query_parameters_it_documents_and_no_other() {
    let app = TestApp::new().await;
    for operation in operations() {
        let message = refusal_naming(&app, &operation, "zz_unknown=1", "zz_unknown").await;
        let said = message
            .strip_prefix("unknown query parameter `zz_unknown`; ")
            .unwrap_or_else(|| panic!("{}: {message}", operation.name));
        let mut accepted: Vec<&str> = match said.strip_prefix("accepted: ") {
            Some(names) => names.split(", ").collect(),
            None => {
                assert_eq!(said, "this route takes none", "{}", operation.name);
                Vec::new()
            }
        };
        let params = operation.spec["parameters"].as_array().cloned();
        let params = params.unwrap_or_default();
        let mut documented: Vec<&str> = params
            .iter()
            .filter(|p| p["in"] == "query")
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        accepted.sort_unstable();
        documented.sort_unstable();
        assert_eq!(accepted, documented, "{}", operation.name);
    }
}

/// The message of the 400 `operation` answers with `query`, checking it names only `param`.
async fn refusal_naming(app: &TestApp, operation: &Operation, query: &str, param: &str) -> String {
    let Operation {
        method, path, name, ..
    } = operation;
    let response = app
        .json_request(method, &with_query(path, query), None, &[])
        .await;
    assert_eq!(
        response.status,
        StatusCode::BAD_REQUEST,
        "{name} {query}: {response:?}"
    );
    assert_eq!(response.cause_fields(), [param], "{name} {query}");
    response.error().message
}

#[tokio::test]
async fn every_operation_names_a_parameter_given_twice_or_not_of_its_type() {
    let app = TestApp::new().await;
    let mut checked = 0;
    for operation in operations() {
        let params = operation.spec["parameters"].as_array().cloned();
        for param in params
            .unwrap_or_default()
            .iter()
            .filter(|p| p["in"] == "query")
        {
            let name = param["name"].as_str().unwrap();
            // A value of the parameter's type, so that only the repetition is wrong.
            let value = match param["schema"]["type"].as_str() {
                Some("boolean") => "true",
                Some("integer") => "1",
                _ => "a",
            };
            // A list is taken repeated, as SDKs send one ([`QueryProblems`]); `a` is no item.
            let twice = format!("{name}={value}&{name}={value}");
            if param["schema"]["type"] == "array" {
                let response = app
                    .json_request(
                        &operation.method,
                        &with_query(&operation.path, &twice),
                        None,
                        &[],
                    )
                    .await;
                assert_eq!(
                    response.status,
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "{response:?}"
                );
                assert_eq!(response.cause_fields(), [name, name], "{}", operation.name);
                continue;
            }
            let message = refusal_naming(&app, &operation, &twice, name).await;
            assert_eq!(message, format!("{name}: is given more than once"));
            checked += 1;

            // A value of another kind, and what the parameter takes instead.
            let (other, takes) = match param["schema"]["type"].as_str() {
                Some("boolean") => ("yes", "true or false".to_owned()),
                Some("integer") => {
                    let bound = |b: &str| param["schema"][b].as_u64().expect("a bound");
                    let (min, max) = (bound("minimum"), bound("maximum"));
                    ("x", format!("a whole number from {min} to {max}"))
                }
                _ => continue,
            };
            let query = format!("{name}={other}");
            let message = refusal_naming(&app, &operation, &query, name).await;
            assert_eq!(message, format!("{name}: must be {takes}, got \"{other}\""));
            checked += 1;
        }
    }
    assert!(checked >= 50, "only {checked} checks");
    assert!(app.dump().await.is_empty(), "a refused request wrote");
}

#[tokio::test]
async fn unknown_parameters_are_named_with_the_accepted_ones() {
    let app = TestApp::new().await;
    let created = app
        .json_request("POST", "/api/v1/rcs", Some(&spec()), &[])
        .await
        .json();
    let rc = format!("/api/v1/rcs/{}", created["id"].as_str().unwrap());

    // A list route.
    let response = app.get("/api/v1/pods?limitt=5").await;
    assert_unknown(
        &response,
        "limitt",
        &format!("accepted: {LIST_PARAMS}, node, pod_id, consistent"),
    );
    // A single-object read, a route that takes no query at all, and a write.
    let response = app.get(&format!("{rc}?limit=5")).await;
    assert_unknown(&response, "limit", "accepted: index, wait, consistent");
    assert_unknown(
        &app.get("/healthz?verbose").await,
        "verbose",
        "this route takes none",
    );
    let response = app
        .merge_patch(
            &format!("{rc}?dry_run=true"),
            &json!({"replicas_desired": 3}),
            &[],
        )
        .await;
    assert_unknown(&response, "dry_run", "this route takes none");
    // A route with parameters of its own names them.
    let response = app
        .json_request("DELETE", &format!("{rc}?forse=true"), None, &[])
        .await;
    assert_unknown(&response, "forse", "accepted: force");

    // Nothing was changed, and the right spellings are taken.
    let rc_now = app.get(&rc).await.json();
    assert_eq!(rc_now["replicas_desired"], 0);
    let deleted = app
        .json_request("DELETE", &format!("{rc}?force=true"), None, &[])
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);

    let response = app.get("/api/v1/rcs?limitt=5&zz=1").await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        response.error().message,
        format!("unknown query parameters `limitt`, `zz`; accepted: {LIST_PARAMS}, consistent")
    );
}

#[tokio::test]
async fn p2_label_routes_take_what_p2_clients_send_and_nothing_else() {
    let app = TestApp::new().await;
    let ok = app
        .get("/api/select?selector=role%3Dweb&type=node&cachedMatch=true")
        .await;
    assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
    let ok = app.get("/api/labels/node/node1?stale=true").await;
    assert_eq!(ok.status, StatusCode::OK, "{ok:?}");

    let response = app.get("/api/select?type=node&cached=true").await;
    assert_unknown(&response, "cached", "accepted: selector, type, cachedMatch");
    let response = app.get("/api/labels/node?limit=1").await;
    assert_unknown(&response, "limit", "this route takes none");
}

#[tokio::test]
async fn bad_list_parameters_are_refused_at_once_not_after_the_wait() {
    let app = TestApp::new().await;
    for list in LISTS {
        let index = app.get(list).await.x_index();
        let path = format!("{list}?index={index}&wait=30s&limit=0");
        let response = tokio::time::timeout(Duration::from_secs(1), app.get(&path))
            .await
            .unwrap_or_else(|_| panic!("{path} was held"));
        assert_eq!(response.unprocessable_fields(), ["limit"], "{path}");
    }
}

#[tokio::test]
async fn the_daemon_set_listing_refuses_a_bad_limit_before_blocking() {
    let app = Arc::new(TestApp::new().await);
    // A tree in use: on Consul an empty tree reads at the index of the whole KV store.
    let created = app
        .json_request(
            "POST",
            "/api/v1/daemonsets",
            Some(&json!({"manifest": "id: shipper\n", "node_selector": "", "timeout": "1m"})),
            &[],
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let index = app.get("/api/v1/daemonsets").await.x_index();

    // The same request with a good limit is held...
    let held = app
        .get_held(format!("/api/v1/daemonsets?index={index}&wait=30s&limit=1"))
        .await;
    // ...and with a bad one answered at once.
    let bad = format!("/api/v1/daemonsets?index={index}&wait=30s&limit=0");
    let response = tokio::time::timeout(Duration::from_secs(1), app.get(&bad))
        .await
        .expect("answered without waiting");
    assert_eq!(response.unprocessable_fields(), ["limit"]);
    held.assert_held("a refused request woke the held one");
}

#[tokio::test]
async fn index_is_at_most_2_to_the_63_minus_1() {
    let app = TestApp::new().await;
    for list in LISTS {
        let too_high = app.get(&format!("{list}?index=9223372036854775808")).await;
        assert_eq!(too_high.unprocessable_fields(), ["index"], "{list}");
        let error = too_high.error();
        assert!(
            error.message.contains("from 0 to 9223372036854775807"),
            "{error:?}"
        );
        let highest = app
            .get(&format!("{list}?index=9223372036854775807&wait=0s"))
            .await;
        assert_eq!(highest.status, StatusCode::OK, "{list}: {highest:?}");
    }
    let negative = app.get("/api/v1/rcs?index=-1").await;
    assert_eq!(negative.unprocessable_fields(), ["index"]);
}

#[tokio::test]
async fn every_problem_of_a_list_query_is_named_at_once() {
    let app = TestApp::new().await;
    let response = app
        .get(
            "/api/v1/daemonsets?limit=1001&continue=%25&selector=a%20in%20(\
             &index=9223372036854775808&wait=11m",
        )
        .await;
    assert_eq!(
        response.unprocessable_fields(),
        ["limit", "index", "continue", "selector", "wait"]
    );
    // A listing's own filters are checked with the common parameters.
    let response = app.get("/api/v1/pods?node=..&selector=%21&wait=soon").await;
    assert_eq!(
        response.unprocessable_fields(),
        ["selector", "wait", "node"]
    );
    // What cannot be read at all is 400, every such problem named.
    let response = app
        .get("/api/v1/nodes?limitt=5&limit=many&index=soon")
        .await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    assert_eq!(response.cause_fields(), ["limitt", "limit", "index"]);
    let message = response.error().message;
    assert!(
        message.contains("limit: must be a whole number"),
        "{message}"
    );
    assert!(
        message.contains("index: must be a whole number"),
        "{message}"
    );
}

#[tokio::test]
async fn the_document_states_the_real_bounds() {
    let (_, openapi) = router::api().split_for_parts();
    let document = serde_json::to_value(&openapi).unwrap();
    let mut lists = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        let Some(parameters) = item["get"]["parameters"].as_array() else {
            continue;
        };
        let param = |name: &str| parameters.iter().find(|p| p["name"] == name);
        let Some(limit) = param("limit") else {
            continue;
        };
        lists += 1;
        assert_eq!(
            (&limit["schema"]["minimum"], &limit["schema"]["maximum"]),
            (&json!(1), &json!(1000))
        );
        let index = param("index").expect("index beside limit");
        assert_eq!(
            (&index["schema"]["minimum"], &index["schema"]["maximum"]),
            (&json!(0), &json!(i64::MAX))
        );
        for name in ["continue", "wait"] {
            assert!(param(name).is_some(), "{name} beside limit");
        }
        // Every listing but that of events, which have no labels, takes a selector.
        let selects = path != "/api/v1/events";
        assert_eq!(param("selector").is_some(), selects, "{path}");
    }
    assert_eq!(lists, LISTS.len());
}

/// The `(field, message)` of each cause of a refusal with `status`.
fn causes_with(response: &TestResponse, status: StatusCode) -> Vec<(String, String)> {
    assert_eq!(response.status, status, "{response:?}");
    let error = response.error();
    error
        .causes
        .into_iter()
        .map(|c| (c.field, c.message))
        .collect()
}

fn cause(field: &str, message: &str) -> (String, String) {
    (field.to_owned(), message.to_owned())
}

/// A value not of its parameter's kind is described in one wording whatever the kind: what
/// the parameter takes, then the value as sent. A value that cannot be read is 400; one read
/// but out of bounds (and a bad wait or enum name, as before) is 422, worded the same.
#[tokio::test]
async fn a_value_not_of_its_kind_names_what_the_parameter_takes_and_what_came() {
    let app = TestApp::new().await;
    let response = app
        .get("/api/v1/rcs?consistent=yes&limit=x&index=soon")
        .await;
    assert_eq!(
        causes_with(&response, StatusCode::BAD_REQUEST),
        [
            cause("consistent", "must be true or false, got \"yes\""),
            cause("limit", "must be a whole number from 1 to 1000, got \"x\""),
            cause(
                "index",
                "must be a whole number from 0 to 9223372036854775807, got \"soon\""
            ),
        ]
    );
    assert!(
        response
            .error()
            .message
            .contains("consistent: must be true or false, got \"yes\""),
        "{response:?}"
    );
    let response = app
        .json_request(
            "DELETE",
            "/api/v1/rcs/00000000-0000-4000-8000-000000000000?force=1",
            None,
            &[],
        )
        .await;
    assert_eq!(
        causes_with(&response, StatusCode::BAD_REQUEST),
        [cause("force", "must be true or false, got \"1\"")]
    );

    let response = app
        .get("/api/v1/rcs?limit=0&index=9223372036854775808&wait=forever")
        .await;
    assert_eq!(
        causes_with(&response, StatusCode::UNPROCESSABLE_ENTITY),
        [
            cause("limit", "must be a whole number from 1 to 1000, got \"0\""),
            cause(
                "index",
                "must be a whole number from 0 to 9223372036854775807, got \
                 \"9223372036854775808\""
            ),
            cause(
                "wait",
                "must be a duration from 0s to 10m such as 30s, got \"forever\""
            ),
        ]
    );
    // One parameter wrong at a time, of each kind.
    let rc = "/api/v1/rcs/00000000-0000-4000-8000-000000000000";
    for (path, status, field, message) in [
        (
            "/api/v1/nodes/node1?consistent=".to_owned(),
            StatusCode::BAD_REQUEST,
            "consistent",
            r#"must be true or false, got """#,
        ),
        (
            format!("{rc}?index=1&wait=11m"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "wait",
            r#"must be a duration from 0s to 10m such as 30s, got "11m""#,
        ),
        (
            "/api/v1/rolls?state=done".to_owned(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "state",
            r#"must be active, finished or all, got "done""#,
        ),
    ] {
        let response = app.get(&path).await;
        assert_eq!(
            causes_with(&response, status),
            [cause(field, message)],
            "{path}"
        );
    }
    let response = app.get("/api/v1/events?kind=pods").await;
    let causes = causes_with(&response, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(causes.len(), 1);
    let (field, message) = &causes[0];
    assert_eq!(field, "kind");
    assert!(
        message.starts_with("must be rcs, ") && message.ends_with(" or health, got \"pods\""),
        "{message}"
    );
    assert!(app.dump().await.is_empty(), "a refused request wrote");
}
