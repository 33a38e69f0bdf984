//! The OpenAPI document: generated from the code, committed at `openapi/openapi.json`, served
//! at `/openapi.json`, with Swagger UI at `/docs`.
//!
//! After an intended API change, regenerate the committed copy with
//! `UPDATE_OPENAPI=1 cargo test --test api openapi`.

use std::sync::Arc;

use crate::auth::token_file;
use crate::support::api::TestApp;
use p2_apiserver::auth::Access;
use p2_apiserver::router;
use serde_json::json;

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");

fn generated() -> serde_json::Value {
    let (_, openapi) = router::api().split_for_parts();
    serde_json::to_value(&openapi).unwrap()
}

#[test]
fn committed_document_matches_the_code() {
    let generated = generated();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        let text = serde_json::to_string_pretty(&generated).unwrap() + "\n";
        std::fs::write(COMMITTED, text).unwrap();
    }
    let committed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(COMMITTED).unwrap()).unwrap();
    assert!(
        committed == generated,
        "openapi/openapi.json is stale; run UPDATE_OPENAPI=1 cargo test --test api openapi"
    );
}

/// As a server with tokens serves it; one without says no token is needed
/// (`auth::the_served_document_tells_when_no_token_is_needed`).
#[tokio::test]
async fn served_document_is_the_generated_one() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    token_file(&tokens, &[("viewer", "viewer", "viewer-token", None)]);
    let access = Access::new(Some(&tokens), Vec::new()).unwrap();
    let app = TestApp::secured(Arc::new(access)).await;
    let response = app.get("/openapi.json").await;
    assert_eq!(response.status, 200);
    let served: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(served, generated());
    assert!(served["openapi"].as_str().unwrap().starts_with("3.1"));
}

/// No schema repeats a component's in full: each list page refers to its item's component,
/// so that an SDK generated from the document has one type per kind it lists, not a second,
/// anonymous one for each list of it.
#[test]
fn no_schema_repeats_a_component() {
    fn repeats(
        value: &serde_json::Value,
        at: String,
        components: &serde_json::Map<String, serde_json::Value>,
        found: &mut Vec<String>,
    ) {
        if let Some((name, _)) = components.iter().find(|(_, component)| *component == value) {
            found.push(format!("{at} repeats {name}"));
        }
        match value {
            serde_json::Value::Object(fields) => {
                for (key, field) in fields {
                    repeats(field, format!("{at}/{key}"), components, found);
                }
            }
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    repeats(item, format!("{at}/{i}"), components, found);
                }
            }
            _ => {}
        }
    }
    let doc = generated();
    let components = doc["components"]["schemas"].as_object().unwrap();
    let mut found = Vec::new();
    for (name, component) in components {
        // The component itself aside: what it is made of.
        for (key, part) in component.as_object().unwrap() {
            repeats(part, format!("{name}/{key}"), components, &mut found);
        }
    }
    repeats(&doc["paths"], "paths".into(), components, &mut found);
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn every_operation_is_named_tagged_and_documents_its_errors() {
    let doc = generated();
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 20, "only {} paths", paths.len());
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            let name = format!("{method} {path}");
            assert!(op["operationId"].is_string(), "{name} has no operation id");
            assert!(
                op["tags"].as_array().is_some_and(|t| !t.is_empty()),
                "{name} has no tag"
            );
            let responses = op["responses"].as_object().unwrap();
            let probe = path == "/healthz";
            assert!(
                probe
                    || responses
                        .keys()
                        .any(|code| code.starts_with('4') || code.starts_with('5')),
                "{name} documents no error response"
            );
            // The limits on every request answer on every route, with or without a body.
            for code in ["414", "431", "413", "408"] {
                assert!(
                    responses.contains_key(code),
                    "{name} does not document {code}"
                );
            }
            // Any API route's store may refuse the server's credentials, beside any 500 of
            // the route's own.
            if path.starts_with("/api/") {
                let internal = responses["500"]["description"].as_str().unwrap_or("");
                assert!(
                    internal.contains("refused the server's credentials"),
                    "{name} 500: {internal:?}"
                );
            }
            for (code, response) in responses {
                if code.starts_with('4') || code.starts_with('5') {
                    let schema = &response["content"]["application/json"]["schema"]["$ref"];
                    assert_eq!(schema, "#/components/schemas/ErrorBody", "{name} {code}");
                }
            }
        }
    }
}

/// The change stream's answer is documented as the text it is (an SSE stream of lines, not
/// one JSON value: an SDK decoding it as a `WatchEvent` object fails, and a typed one does
/// not check), and its events' `data` as the `WatchEvent` component.
#[test]
fn the_change_stream_is_documented_as_text_and_its_events_as_a_component() {
    let doc = generated();
    let stream = &doc["paths"]["/api/v1/watch"]["get"]["responses"]["200"]["content"];
    assert_eq!(
        stream["text/event-stream"]["schema"],
        json!({"type": "string"}),
        "{stream}"
    );
    let event = &doc["components"]["schemas"]["WatchEvent"];
    assert!(event["properties"]["type"].is_object(), "{event}");
}

/// Every read of the API documents the `X-Index` it answers with, but the leader (read from
/// its lock, not from P2's trees) and the change stream (whose events carry their indexes).
#[test]
fn every_read_documents_the_index_it_reflects() {
    let doc = generated();
    let paths = doc["paths"].as_object().unwrap();
    let reads = paths
        .iter()
        .filter(|(path, _)| path.starts_with("/api/"))
        .filter(|(path, _)| !["/api/v1/leader", "/api/v1/watch"].contains(&path.as_str()))
        .filter_map(|(path, item)| Some((path, item.get("get")?)));
    let mut checked = 0;
    for (path, op) in reads {
        let headers = &op["responses"]["200"]["headers"];
        assert!(
            headers.get("X-Index").is_some(),
            "GET {path} does not document X-Index"
        );
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} reads");
}

/// What the document says of fields and parameters the server takes or gives otherwise
/// than their Rust types alone would say: an event's `before` and `after` are any JSON
/// value; a daemon set patch refuses `null` (a field cannot be removed); a roll needs its
/// replica counts; P2's select needs its label type, and its ignored flags take any text.
#[test]
fn fields_are_documented_as_the_server_takes_and_gives_them() {
    let doc = generated();
    let schemas = &doc["components"]["schemas"];
    for side in ["before", "after"] {
        let schema = &schemas["FieldChange"]["properties"][side];
        assert!(schema.get("type").is_none(), "{side}: {schema}");
    }
    for (field, schema) in schemas["DaemonSetPatch"]["properties"].as_object().unwrap() {
        let types = schema["type"].as_array().cloned().unwrap_or_default();
        assert!(
            !types.contains(&"null".into()),
            "{field} is nullable: {schema}"
        );
    }
    let roll = &schemas["CreateRoll"];
    for field in ["desired_replicas", "minimum_replicas"] {
        assert!(roll["required"].as_array().unwrap().contains(&field.into()));
        assert_eq!(roll["properties"][field]["type"], "integer");
    }
    let parameter = |path: &str, name: &str| {
        let parameters = doc["paths"][path]["get"]["parameters"].as_array().unwrap();
        let found = parameters.iter().find(|p| p["name"] == name);
        found
            .unwrap_or_else(|| panic!("{path} has no {name}"))
            .clone()
    };
    assert_eq!(parameter("/api/select", "type")["required"], true);
    assert_eq!(
        parameter("/api/select", "cachedMatch")["schema"]["type"],
        "string"
    );
    assert_eq!(
        parameter("/api/labels/{type}/{id}", "stale")["schema"]["type"],
        "string"
    );
}

#[tokio::test]
async fn swagger_ui_is_served_from_the_binary() {
    let app = TestApp::new().await;
    let page = app.get("/docs/").await;
    assert_eq!(page.status, 200);
    assert!(String::from_utf8_lossy(&page.body).contains("swagger-ui"));
    let bundle = app.get("/docs/swagger-ui-bundle.js").await;
    assert_eq!(bundle.status, 200);
    assert!(
        bundle.body.len() > 100_000,
        "the bundle is vendored, not fetched"
    );
}

/// The fields the server leaves out of some answers (a daemon set's `status` in lists, an
/// event's `message` but for alerts and farm decisions, a change stream event's object
/// fields on `synced`, `resync` and `dropped`), each as its schema and property.
const SOMETIMES_LEFT_OUT: [(&str, &str); 5] = [
    ("DaemonSet", "status"),
    ("Event", "message"),
    ("WatchEvent", "id"),
    ("WatchEvent", "kind"),
    ("WatchEvent", "object"),
];

/// The components an answer's schema refers to, directly or through another component.
fn answer_components(doc: &serde_json::Value) -> std::collections::BTreeSet<String> {
    fn refer(
        value: &serde_json::Value,
        doc: &serde_json::Value,
        found: &mut std::collections::BTreeSet<String>,
    ) {
        match value {
            serde_json::Value::Object(fields) => {
                if let Some(reference) = fields.get("$ref").and_then(|r| r.as_str()) {
                    let name = reference.trim_start_matches("#/components/schemas/");
                    if found.insert(name.to_owned()) {
                        refer(&doc["components"]["schemas"][name], doc, found);
                    }
                }
                fields.values().for_each(|field| refer(field, doc, found));
            }
            serde_json::Value::Array(items) => {
                items.iter().for_each(|item| refer(item, doc, found))
            }
            _ => {}
        }
    }
    let mut found = std::collections::BTreeSet::new();
    for operation in doc["paths"].as_object().unwrap().values() {
        for method in operation.as_object().unwrap().values() {
            refer(&method["responses"], doc, &mut found);
        }
    }
    found
}

/// Whether `schema` names `null` among the values it takes (a schema of any value, `{}`, as
/// an event's `object`, names none).
fn names_null(schema: &serde_json::Value) -> bool {
    let null = serde_json::Value::from("null");
    schema["type"] == null
        || schema["type"]
            .as_array()
            .is_some_and(|kinds| kinds.contains(&null))
        || schema["oneOf"]
            .as_array()
            .is_some_and(|choices| choices.iter().any(names_null))
}

/// An answer's field is required exactly when the server always sends it, `null` or not,
/// so that an SDK generated from the document types it as present (`string | null`, not
/// `string | null | undefined`); a field it leaves out of some answers is never `null`,
/// so that absent is the one way it says there is none.
#[test]
fn answer_fields_are_required_unless_left_out() {
    let doc = generated();
    let mut found = Vec::new();
    for name in answer_components(&doc) {
        let schema = &doc["components"]["schemas"][name.as_str()];
        let required = schema["required"].as_array().cloned().unwrap_or_default();
        for (field, property) in schema["properties"].as_object().into_iter().flatten() {
            let left_out = SOMETIMES_LEFT_OUT.contains(&(name.as_str(), field.as_str()));
            let is_required = required.contains(&field.as_str().into());
            if is_required == left_out {
                found.push(format!("{name}.{field}: required {is_required}"));
            }
            if left_out && names_null(property) {
                found.push(format!("{name}.{field}: left out when none, yet nullable"));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// A header or query parameter is sent or not, never `null`: none is documented as
/// nullable, so that an SDK built from the document offers no `None` it would send as text.
#[test]
fn no_parameter_is_nullable() {
    let doc = generated();
    let mut found = Vec::new();
    for (route, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for parameter in op["parameters"].as_array().into_iter().flatten() {
                if names_null(&parameter["schema"]) {
                    found.push(format!("{method} {route}: {}", parameter["name"]));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// A node name's documented pattern takes exactly the names the server takes: a tool or SDK
/// checking names against it sends no name the server refuses, and refuses none it takes.
/// Each character is tried in the middle of a name, through the Basic Multilingual Plane, and
/// names of dots and letters.
#[test]
fn the_node_name_pattern_takes_the_names_the_server_takes() {
    let doc = generated();
    let parameters = doc["paths"]["/api/v1/nodes/{node}"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let node = parameters.iter().find(|p| p["name"] == "node").unwrap();
    let pattern = node["schema"]["pattern"].as_str().unwrap();
    let documented = regex::Regex::new(pattern).unwrap();
    let dotted = [".", "..", "...", ".n", "..n", "n.", "n..", ".n.", "n.n"].map(String::from);
    let mut found = Vec::new();
    let characters = ('\0'..='\u{FFFF}').filter(|c| !c.is_alphanumeric());
    for name in characters.map(|c| format!("n{c}n")).chain(dotted) {
        let taken = p2_apiserver::model::NodeName::check(&name).is_ok();
        if documented.is_match(&name) != taken {
            found.push(format!("{name:?} taken by the server: {taken}"));
        }
    }
    assert!(found.is_empty(), "{pattern}: {}", found.join(", "));
}

/// A node name may hold non-ASCII characters, and the server bounds its length in bytes
/// where the document's `maxLength` counts characters: a name within `maxLength` and the
/// pattern may still be too long for the server, so the schema's description says how the
/// server counts, that a tool checking only `maxLength` knows it is not the whole rule.
#[test]
fn a_node_names_length_is_documented_as_the_server_counts_it() {
    let doc = generated();
    let parameters = doc["paths"]["/api/v1/nodes/{node}"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let node = parameters.iter().find(|p| p["name"] == "node").unwrap();
    let schema = &node["schema"];
    let documented = regex::Regex::new(schema["pattern"].as_str().unwrap()).unwrap();
    let max_length = schema["maxLength"].as_u64().unwrap() as usize;
    let name = "é".repeat(max_length / 2 + 1);
    assert!(documented.is_match(&name) && name.chars().count() <= max_length);
    assert!(p2_apiserver::model::NodeName::check(&name).is_err());
    let description = schema["description"].as_str().unwrap_or_default();
    assert!(
        description.contains(&format!("at most {max_length} bytes of UTF-8"))
            && description.contains("`maxLength` counts characters"),
        "{description}"
    );
}

/// Every write taking `If-Match` documents all the forms the server takes (a list, `*`),
/// not only the one version its own words name, and the 412 of `*` on a missing object.
#[test]
fn every_if_match_documents_its_forms() {
    let doc = generated();
    let mut found = Vec::new();
    for (route, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let parameters = op["parameters"].as_array().into_iter().flatten();
            let Some(if_match) = parameters
                .into_iter()
                .find(|p| p["in"] == "header" && p["name"] == "If-Match")
            else {
                continue;
            };
            let described = if_match["description"].as_str().unwrap_or_default();
            let precondition = op["responses"]["412"]["description"].as_str();
            if !described.contains("`*`")
                || !precondition.is_some_and(|d| d.contains("`If-Match: *`"))
            {
                found.push(format!(
                    "{method} {route}: {described:?}, 412: {precondition:?}"
                ));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// `?force=true` needs `admin` exactly where an operation takes `force` (the table of such
/// operations in `src/auth.rs`, which the role sentence follows): one taking it unlisted
/// would let a deployer force it, one listed not taking it would answer 403 where its handler
/// refuses the unknown parameter 400.
#[test]
fn force_needs_admin_exactly_where_an_operation_takes_it() {
    let doc = generated();
    let mut forceable = Vec::new();
    let mut found = Vec::new();
    for (route, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let mut parameters = op["parameters"].as_array().into_iter().flatten();
            let takes = parameters.any(|p| p["in"] == "query" && p["name"] == "force");
            let description = op["description"].as_str().unwrap_or_default();
            let needs_admin = description.contains("(`admin` with `?force=true`)");
            if takes {
                forceable.push(format!("{method} {route}"));
            }
            if takes != needs_admin {
                found.push(format!(
                    "{method} {route}: takes force {takes}: {description:?}"
                ));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    assert_eq!(forceable, ["delete /api/v1/rcs/{id}"]);
}

/// No component has a field named as the component itself in snake case (`Version` with a
/// `version` field): SDK generators name both the decoded model and that field's value after
/// it, so one overwrites the other and the generated code does not type-check.
#[test]
fn no_component_has_a_field_named_as_itself() {
    fn snake(name: &str) -> String {
        let mut out = String::new();
        for (i, c) in name.chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        }
        out
    }
    let doc = generated();
    let mut found = Vec::new();
    for (name, component) in doc["components"]["schemas"].as_object().unwrap() {
        let own = snake(name);
        let mut parts = vec![component];
        while let Some(part) = parts.pop() {
            if let Some(properties) = part["properties"].as_object() {
                found.extend(
                    properties
                        .keys()
                        .filter(|field| **field == own)
                        .map(|field| format!("{name}.{field}")),
                );
            }
            for key in ["allOf", "oneOf", "anyOf"] {
                parts.extend(part[key].as_array().into_iter().flatten());
            }
        }
    }
    assert_eq!(found, Vec::<String>::new());
}

/// No path parameter is documented as taking empty text: an empty segment names another path
/// (`/api/v1/labels/node/` is no route, answered 404), which an operation does not document.
#[test]
fn no_path_parameter_takes_empty_text() {
    let doc = generated();
    let schemas = &doc["components"]["schemas"];
    let mut found = Vec::new();
    for (path, operations) in doc["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            let parameters = operation["parameters"].as_array().into_iter().flatten();
            for parameter in parameters.filter(|p| p["in"] == "path") {
                let mut schema = &parameter["schema"];
                if let Some(name) = schema["$ref"].as_str() {
                    schema = &schemas[name.trim_start_matches("#/components/schemas/")];
                }
                let closed = schema.get("enum").is_some()
                    || schema["minLength"].as_u64().is_some_and(|n| n >= 1)
                    || schema["pattern"]
                        .as_str()
                        .is_some_and(|p| p.ends_with("+$"));
                if !closed {
                    found.push(format!("{method} {path} {}", parameter["name"]));
                }
            }
        }
    }
    assert_eq!(found, Vec::<String>::new());
}

/// Every `index` parameter says what holds a blocking read: not until its `X-Index` differs
/// from the one sent (a read of one object, or of part of its trees, at an index older than
/// its current `X-Index` is held while its part has not changed since, as
/// `blocking_spans` checks), but while nothing the answer is read from has changed since.
#[test]
fn every_index_parameter_says_what_holds_a_read() {
    let doc = generated();
    let mut found = Vec::new();
    let mut checked = 0;
    for (route, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let parameters = op["parameters"].as_array().into_iter().flatten();
            let Some(index) = parameters
                .into_iter()
                .find(|p| p["in"] == "query" && p["name"] == "index")
            else {
                continue;
            };
            checked += 1;
            let described = index["description"].as_str().unwrap_or_default();
            if described.contains("differs") || !described.contains("older than") {
                found.push(format!("{method} {route}: {described:?}"));
            }
        }
    }
    assert!(checked >= 15, "only {checked} operations take index");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The probes answer `{"status": "ok"}` and nothing else when all is well (failures are error
/// bodies): the document says so with a one-value enum, not an open string, so that generated
/// clients know the one value, and the bodies served are that value.
#[tokio::test]
async fn a_probes_status_is_documented_as_its_one_value() {
    let doc = generated();
    let status = &doc["components"]["schemas"]["Health"]["properties"]["status"];
    assert_eq!(status["type"], json!("string"), "{status}");
    assert_eq!(status["enum"], json!(["ok"]), "{status}");
    let app = TestApp::new().await;
    for probe in ["/healthz", "/readyz"] {
        let response = app.get(probe).await;
        assert_eq!(response.json(), json!({"status": "ok"}), "{probe}");
    }
}
