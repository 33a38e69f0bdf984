//! `GET /api/v1/watch`: a snapshot then changes as Server-Sent Events, resuming with
//! `Last-Event-ID`, `resync` for a position no longer retained, and a slow client dropped
//! without holding back the others.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use p2_apiserver::app::{App, HttpLimits};
use p2_apiserver::kv::shared_listings::SharedListings;
use p2_apiserver::kv::Cas;
use p2_apiserver::metrics::SSE_CLIENTS_DROPPED;
use p2_apiserver::router;
use p2_apiserver::state::{Mirror, MirrorConfig};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::metrics::scrape;
use crate::support::api::{call, empty_rc_spec, TestApp, TestResponse};
use crate::support::switchable::{self, fresh_store};

/// Far longer than any event takes to come; only a stream that never sends reaches it.
const PATIENCE: Duration = Duration::from_secs(30);

/// The router over a test app's store with a started mirror.
struct Watched {
    app: TestApp,
    mirror: Mirror,
    router: Router,
    cancel: CancellationToken,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Watched {
    async fn new(config: MirrorConfig) -> Watched {
        let app = TestApp::new().await;
        let mirror = Mirror::new(app.store.clone(), config);
        let cancel = CancellationToken::new();
        mirror.start(&TaskTracker::new(), cancel.clone());
        assert!(
            mirror.wait_for(0, PATIENCE).await,
            "the mirror never loaded"
        );
        let state = Arc::new(App {
            store: app.store.clone(),
            store_reads: SharedListings::wrap(app.store.clone()),
            shutdown: CancellationToken::new(),
            limits: HttpLimits::default(),
            mirror: mirror.clone(),
            validation: Default::default(),
            access: Default::default(),
            answers: Default::default(),
        });
        Watched {
            router: router::build(state),
            app,
            mirror,
            cancel,
        }
    }

    /// Opens a stream at `uri`, resuming from `last` if given.
    async fn open(&self, uri: &str, last: Option<&str>) -> Events {
        let mut request = Request::get(uri);
        if let Some(last) = last {
            request = request.header("last-event-id", last);
        }
        let response = self
            .router
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers()["content-type"].to_str().unwrap();
        assert_eq!(content_type, "text/event-stream");
        Events {
            body: response.into_body(),
            buffer: String::new(),
        }
    }

    /// Labels a node behind the server's back; the mirror learns of it by its watch.
    async fn label_node(&self, node: &str, role: &str) {
        let value = format!(r#"{{"role":"{role}"}}"#);
        let key = format!("labels/node/{node}");
        self.app
            .store
            .put(&key, value.as_bytes(), Cas::Any)
            .await
            .unwrap();
    }

    /// Sends `request` with the JSON `body` through the server.
    async fn send(&self, request: axum::http::request::Builder, body: Value) -> TestResponse {
        let request = request
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        call(&self.router, request).await
    }

    /// Creates an RC of no replicas through the server; the answer.
    async fn create_rc(&self) -> TestResponse {
        let created = self
            .send(Request::post("/api/v1/rcs"), empty_rc_spec())
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
        created
    }

    /// Waits until the mirror holds what the store holds at `key`.
    async fn mirrored(&self, key: &str) {
        let index = self.app.stored(key).await.unwrap().modify_index;
        assert!(self.mirror.wait_for(index, PATIENCE).await);
    }
}

/// One event as sent.
#[derive(Debug)]
struct Sse {
    event: String,
    id: String,
    data: Value,
}

/// A stream's events, read as they come.
struct Events {
    body: Body,
    buffer: String,
}

impl Events {
    /// The next event, skipping heartbeats; `None` once the stream ends.
    async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = Sse {
                    event: String::new(),
                    id: String::new(),
                    data: Value::Null,
                };
                for line in block.lines() {
                    if let Some(name) = line.strip_prefix("event: ") {
                        event.event = name.to_owned();
                    } else if let Some(id) = line.strip_prefix("id: ") {
                        event.id = id.to_owned();
                    } else if let Some(data) = line.strip_prefix("data: ") {
                        event.data = serde_json::from_str(data).unwrap();
                    }
                }
                if event.event.is_empty() {
                    continue;
                }
                return Some(event);
            }
            let frame = tokio::time::timeout(PATIENCE, self.body.frame())
                .await
                .expect("the stream went silent");
            match frame {
                Some(frame) => {
                    if let Ok(data) = frame.unwrap().into_data() {
                        self.buffer.push_str(std::str::from_utf8(&data).unwrap());
                    }
                }
                None => return None,
            }
        }
    }

    /// The events up to and including the next `synced`.
    async fn snapshot(&mut self) -> Vec<Sse> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await.expect("the stream ended in its snapshot");
            let done = event.event == "synced";
            events.push(event);
            if done {
                return events;
            }
        }
    }
}

fn summary(events: &[Sse]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|e| {
            let id = e.data["id"].as_str().unwrap_or_default().to_owned();
            (e.event.clone(), id)
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test]
async fn a_stream_sends_a_snapshot_then_changes() {
    let watched = Watched::new(MirrorConfig::default()).await;
    watched.label_node("n1", "web").await;
    watched.label_node("n2", "db").await;
    watched.mirrored("labels/node/n2").await;
    let mut stream = watched.open("/api/v1/watch?kinds=nodes", None).await;
    let snapshot = stream.snapshot().await;
    assert_eq!(
        summary(&snapshot),
        pairs(&[("added", "n1"), ("added", "n2"), ("synced", "")])
    );
    assert_eq!(snapshot[0].data["object"]["role"], "web");
    assert_eq!(snapshot[0].data["kind"], "nodes");
    // Only `synced` has an id: a client cut off amid the snapshot is not resumed past the
    // objects it did not get.
    assert!(snapshot[..2].iter().all(|event| event.id.is_empty()));
    assert_eq!(snapshot[2].id, snapshot[2].data["index"].to_string());

    watched.label_node("n1", "db").await;
    watched
        .app
        .store
        .delete("labels/node/n2", Cas::Any)
        .await
        .unwrap();
    let modified = stream.next().await.unwrap();
    assert_eq!(modified.event, "modified");
    assert_eq!(modified.data["object"]["role"], "db");
    let stored = watched.app.stored("labels/node/n1").await.unwrap();
    assert_eq!(modified.data["index"], stored.modify_index);
    assert_eq!(modified.id, stored.modify_index.to_string());
    let deleted = stream.next().await.unwrap();
    assert_eq!(
        (deleted.event.as_str(), &deleted.data["id"]),
        ("deleted", &Value::from("n2"))
    );
}

#[tokio::test]
async fn a_selector_picks_objects_by_their_labels() {
    let watched = Watched::new(MirrorConfig::default()).await;
    let mut stream = watched
        .open("/api/v1/watch?selector=role%3Dweb", None)
        .await;
    stream.snapshot().await;
    watched.label_node("db1", "db").await;
    watched.label_node("web1", "web").await;
    let event = stream.next().await.unwrap();
    assert_eq!(summary(&[event]), pairs(&[("added", "web1")]));
}

/// With a selector, an object the client holds is sent as deleted when it is deleted or
/// stops matching, and one that starts matching is sent; others' deletions are not.
#[tokio::test]
async fn a_selector_stream_deletes_what_leaves_it() {
    let watched = Watched::new(MirrorConfig::default()).await;
    for (node, role) in [
        ("web1", "web"),
        ("web2", "web"),
        ("db1", "db"),
        ("db2", "db"),
    ] {
        watched.label_node(node, role).await;
    }
    watched.mirrored("labels/node/db2").await;
    let path = "/api/v1/watch?kinds=nodes&selector=role%3Dweb";
    let mut stream = watched.open(path, None).await;
    let snapshot = stream.snapshot().await;
    assert_eq!(
        summary(&snapshot),
        pairs(&[("added", "web1"), ("added", "web2"), ("synced", "")])
    );
    let synced = snapshot.last().unwrap().id.clone();

    let delete = async |node: &str| {
        let key = format!("labels/node/{node}");
        watched.app.store.delete(&key, Cas::Any).await.unwrap();
    };
    delete("db1").await;
    delete("web1").await;
    watched.label_node("web2", "db").await;
    watched.label_node("db2", "web").await;
    let mut events = Vec::new();
    for _ in 0..3 {
        events.push(stream.next().await.unwrap());
    }
    // Own writes reach the mirror at once, the store's deletes through its watch.
    let mut events = summary(&events);
    events.sort();
    assert_eq!(
        events,
        pairs(&[("added", "db2"), ("deleted", "web1"), ("deleted", "web2")])
    );

    // A client resuming from before those changes is told of the objects that left too
    // (a stream that never sends them fails the test by going silent).
    let mut resumed = watched.open(path, Some(&synced)).await;
    let mut seen = Vec::new();
    let left = pairs(&[("deleted", "web1"), ("deleted", "web2")]);
    while !left.iter().all(|event| seen.contains(event)) {
        seen.extend(summary(&[resumed.next().await.unwrap()]));
    }
}

#[tokio::test]
async fn a_stream_resumes_from_the_last_event_id() {
    let watched = Watched::new(MirrorConfig::default()).await;
    let mut stream = watched.open("/api/v1/watch?kinds=nodes", None).await;
    stream.snapshot().await;
    watched.label_node("a", "web").await;
    let last = stream.next().await.unwrap().id;
    drop(stream);
    watched.label_node("b", "web").await;
    watched.label_node("c", "web").await;

    let mut resumed = watched.open("/api/v1/watch?kinds=nodes", Some(&last)).await;
    let mut seen = Vec::new();
    while !seen.contains(&("added".to_owned(), "c".to_owned())) {
        seen.extend(summary(&[resumed.next().await.unwrap()]));
    }
    // The changes at the position itself may come again; none after it is missed, and no
    // snapshot is sent.
    seen.retain(|(_, id)| id != "a");
    assert_eq!(seen, pairs(&[("added", "b"), ("added", "c")]));
}

/// A resumed stream sends the changes since its position, and no snapshot, so no `synced`
/// either; and an open stream is sent `resync`, then a fresh snapshot and `synced`, when the
/// store went backwards (as `after_the_store_went_backwards_a_snapshot_is_of_the_store_...`
/// checks). The document says both, so that a client built from it neither waits for a
/// `synced` that does not come after it resumes, nor takes `resync` for something only a
/// new or resumed stream is sent.
#[tokio::test]
async fn a_resumed_stream_has_no_synced_and_an_open_one_may_resync_as_documented() {
    let watched = Watched::new(MirrorConfig::default()).await;
    let mut stream = watched.open("/api/v1/watch?kinds=nodes", None).await;
    let synced = stream.snapshot().await.pop().unwrap();
    drop(stream);
    watched.label_node("a", "web").await;
    watched.label_node("b", "web").await;
    let mut resumed = watched
        .open("/api/v1/watch?kinds=nodes", Some(&synced.id))
        .await;
    let mut seen = Vec::new();
    while !seen.contains(&("added".to_owned(), "b".to_owned())) {
        seen.extend(summary(&[resumed.next().await.unwrap()]));
    }
    assert_eq!(seen, pairs(&[("added", "a"), ("added", "b")]));

    let (_, openapi) = router::api().split_for_parts();
    let doc = serde_json::to_value(&openapi).unwrap();
    let described = doc["paths"]["/api/v1/watch"]["get"]["description"]
        .as_str()
        .unwrap()
        .replace('\n', " ");
    let mut missing = Vec::new();
    for says in ["no `synced`", "an open stream is sent `resync`"] {
        if !described.contains(says) {
            missing.push(says);
        }
    }
    assert!(missing.is_empty(), "{missing:?} not in {described:?}");
}

#[tokio::test]
async fn a_position_no_longer_retained_gets_resync_and_a_fresh_snapshot() {
    let config = MirrorConfig {
        retained_changes: 2,
        ..MirrorConfig::default()
    };
    let watched = Watched::new(config).await;
    let mut stream = watched.open("/api/v1/watch?kinds=nodes", None).await;
    stream.snapshot().await;
    watched.label_node("a", "web").await;
    let last = stream.next().await.unwrap().id;
    for node in ["b", "c", "d"] {
        watched.label_node(node, "web").await;
        stream.next().await.unwrap();
    }

    let mut resumed = watched.open("/api/v1/watch?kinds=nodes", Some(&last)).await;
    let events = resumed.snapshot().await;
    assert_eq!(
        summary(&events),
        pairs(&[
            ("resync", ""),
            ("added", "a"),
            ("added", "b"),
            ("added", "c"),
            ("added", "d"),
            ("synced", ""),
        ])
    );
}

#[tokio::test]
async fn a_slow_client_is_dropped_without_holding_back_the_others() {
    let config = MirrorConfig {
        subscriber_buffer: 4,
        ..MirrorConfig::default()
    };
    let watched = Watched::new(config).await;
    let dropped = async || scrape(&watched.app).await.value(SSE_CLIENTS_DROPPED, &[]);
    let before = dropped().await.unwrap_or(0.0);
    let mut slow = watched.open("/api/v1/watch?kinds=nodes", None).await;
    let mut fast = watched.open("/api/v1/watch?kinds=nodes", None).await;
    let synced = slow.snapshot().await.pop().unwrap();
    fast.snapshot().await;

    // The slow client reads nothing while ten changes go by.
    for i in 0..10 {
        watched.label_node(&format!("n{i}"), "web").await;
        let event = fast.next().await.unwrap();
        assert_eq!(event.data["id"], format!("n{i}"));
    }

    // What it received before the cut, and the `dropped` event, which has no id: the client
    // resumes from the last change it got, and the changes it missed are still retained.
    let mut received = Vec::new();
    while let Some(event) = slow.next().await {
        received.push(event);
    }
    let last = received.pop().unwrap();
    assert_eq!(last.event, "dropped");
    assert!(last.id.is_empty());
    let resume_from = received.last().unwrap_or(&synced);
    let mut resumed = watched
        .open("/api/v1/watch?kinds=nodes", Some(&resume_from.id))
        .await;
    let mut seen = Vec::new();
    while !seen.contains(&("added".to_owned(), "n9".to_owned())) {
        let event = resumed.next().await.unwrap();
        assert_ne!(event.event, "resync");
        seen.extend(summary(&[event]));
    }
    for i in received.len()..10 {
        let node = format!("n{i}");
        assert!(seen.contains(&("added".to_owned(), node)), "{i}: {seen:?}");
    }
    // The metrics are the process's: other tests may cut off clients of their own.
    let after = dropped().await;
    assert!(
        after.is_some_and(|after| after > before),
        "{before} then {after:?}"
    );
}

#[tokio::test]
async fn bad_queries_are_refused() {
    let watched = Watched::new(MirrorConfig::default()).await;
    let get = |uri: &str| Request::get(uri).body(Body::empty()).unwrap();
    let response = call(&watched.router, get("/api/v1/watch?kinds=rcs,widgets")).await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.cause_fields(), ["kinds"]);
    let response = call(
        &watched.router,
        get("/api/v1/watch?kinds=health&selector=a%3Db"),
    )
    .await;
    assert_eq!(response.cause_fields(), ["kinds"]);
    assert_eq!(
        response.error().causes[0].message,
        "kind \"health\" has no labels to select: a selector applies to rcs, rolls, nodes, labels or pods"
    );
    let response = call(&watched.router, get("/api/v1/watch?selector=a%20in%20(")).await;
    assert_eq!(response.cause_fields(), ["selector"]);
    let request = Request::get("/api/v1/watch")
        .header("last-event-id", "yesterday")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        call(&watched.router, request).await.status,
        StatusCode::BAD_REQUEST
    );
}

/// `kinds` is documented as the list it is: comma-separated (form style, not exploded),
/// of at least one of the `Kind` component's names. The stream takes every name the document
/// lists, together, and refuses an empty list, which the document's `minItems` rules out.
#[tokio::test]
async fn kinds_are_documented_as_a_list_of_at_least_one_kind() {
    let (_, openapi) = router::api().split_for_parts();
    let doc = serde_json::to_value(&openapi).unwrap();
    let parameters = doc["paths"]["/api/v1/watch"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let kinds = parameters.iter().find(|p| p["name"] == "kinds").unwrap();
    let schema = &kinds["schema"];
    assert_eq!(
        (&kinds["style"], &kinds["explode"]),
        (&"form".into(), &false.into()),
        "{kinds}"
    );
    assert_eq!(
        (&schema["type"], &schema["minItems"]),
        (&"array".into(), &1.into()),
        "{kinds}"
    );
    let item = schema["items"]["$ref"].as_str().unwrap_or_default();
    let item = &doc["components"]["schemas"][item.trim_start_matches("#/components/schemas/")];
    let names: Vec<&str> = item["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("{kinds}"))
        .iter()
        .map(|name| name.as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 9, "{names:?}");
    let watched = Watched::new(MirrorConfig::default()).await;
    watched
        .open(&format!("/api/v1/watch?kinds={}", names.join(",")), None)
        .await;
    let empty = Request::get("/api/v1/watch?kinds=")
        .body(Body::empty())
        .unwrap();
    let response = call(&watched.router, empty).await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.cause_fields(), ["kinds"]);
}

/// A list of kinds is taken with the parameter repeated too, one kind each
/// (`kinds=nodes&kinds=rcs`), as SDKs generated from the document send a list whatever its
/// `explode` says: the stream is the one the comma-separated list asks for, and a repeated
/// kind that is no kind is refused as one in the list is.
#[tokio::test]
async fn a_list_of_kinds_is_taken_repeated_as_sdks_send_it() {
    let app = TestApp::new().await;
    label_through(&app, "n1", "web").await;
    let rc = serde_json::json!({"manifest": "id: hello\nlaunchables: {}\n", "node_selector": "",
        "replicas_desired": 0});
    let created = app
        .json_request("POST", "/api/v1/rcs", Some(&rc), &[])
        .await;
    let rc = created.json()["id"].as_str().unwrap().to_owned();
    let mut listed = try_open(&app, "/api/v1/watch?kinds=nodes,rcs", None)
        .await
        .unwrap();
    let listed = summary(&listed.snapshot().await);
    assert_eq!(
        listed,
        pairs(&[("added", &rc), ("added", "n1"), ("synced", "")])
    );
    let mut repeated = try_open(&app, "/api/v1/watch?kinds=nodes&kinds=rcs", None)
        .await
        .unwrap_or_else(|refused| panic!("{refused:?}"));
    assert_eq!(summary(&repeated.snapshot().await), listed);
    let refused = try_open(&app, "/api/v1/watch?kinds=nodes&kinds=widgets", None).await;
    let Err(refused) = refused else {
        panic!("a stream of no kind opened")
    };
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{refused:?}"
    );
    assert_eq!(refused.cause_fields(), ["kinds"]);
}

/// A `Last-Event-ID` past the highest index a store holds is no position the stream gave
/// out: it is refused, as the document's int64 says, rather than taken for a resync.
#[tokio::test]
async fn a_resume_position_past_every_index_is_refused() {
    let watched = Watched::new(MirrorConfig::default()).await;
    for last in ["9223372036854775808", "18446744073709551615"] {
        let request = Request::get("/api/v1/watch")
            .header("last-event-id", last)
            .body(Body::empty())
            .unwrap();
        let response = watched.router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{last}");
    }
    watched
        .open("/api/v1/watch", Some("9223372036854775807"))
        .await;
}

/// A stream position is digits only: `+5` is refused as `yesterday` is, with a cause naming
/// the header, not read as 5. An empty `Last-Event-ID` is no position at all (an SSE client
/// sends none; an empty id resets its last one): the stream starts with a fresh snapshot.
#[tokio::test]
async fn a_resume_position_is_digits_only_and_an_empty_one_is_none() {
    let app = TestApp::new().await;
    label_through(&app, "n1", "web").await;
    for last in ["+5", "-0", "5 5", "0x5", "yesterday"] {
        let refused = try_open(&app, "/api/v1/watch?kinds=nodes", Some(last)).await;
        let Err(refused) = refused else {
            panic!("a stream resuming from {last:?} opened")
        };
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{last}: {refused:?}"
        );
        assert_eq!(
            refused.cause_fields(),
            ["Last-Event-ID"],
            "{last}: {refused:?}"
        );
    }
    let mut stream = open_on(&app, "/api/v1/watch?kinds=nodes", Some("")).await;
    assert_eq!(
        summary(&stream.snapshot().await),
        pairs(&[("added", "n1"), ("synced", "")])
    );
}

#[tokio::test]
async fn events_flow_through_the_stream_when_asked_for() {
    let watched = Watched::new(MirrorConfig::default()).await;
    let mut stream = watched.open("/api/v1/watch?kinds=events", None).await;
    assert_eq!(summary(&stream.snapshot().await), pairs(&[("synced", "")]));
    let created = watched.create_rc().await;
    let event = stream.next().await.unwrap();
    assert_eq!(event.event, "added");
    assert_eq!(event.data["kind"], "events");
    assert_eq!(event.data["object"]["action"], "created");
    assert_eq!(event.data["object"]["object_id"], created.json()["id"]);
    assert_eq!(event.data["id"], event.data["object"]["id"]);
}

/// With a selector over RCs, an RC whose labels change so that it starts matching is sent
/// as `added`, and one that stops matching as `deleted`, although the change is to its
/// label set (another tree) and not to the RC itself.
#[tokio::test]
async fn a_selector_stream_follows_label_changes_of_an_rc() {
    let watched = Watched::new(MirrorConfig::default()).await;
    let created = watched.create_rc().await;
    let id = created.json()["id"].as_str().unwrap().to_owned();
    watched
        .mirrored(&format!("replication_controllers/{id}"))
        .await;

    let path = "/api/v1/watch?kinds=rcs&selector=app%3Dweb";
    let mut stream = watched.open(path, None).await;
    assert_eq!(summary(&stream.snapshot().await), pairs(&[("synced", "")]));

    let label = async |app: &str| {
        let uri = format!("/api/v1/labels/replication_controller/{id}");
        let labels = serde_json::json!({"labels": {"app": app}});
        let response = watched.send(Request::patch(uri), labels).await;
        assert_eq!(response.status, StatusCode::OK, "{response:?}");
    };
    let soon = Duration::from_secs(5);
    label("web").await;
    let entered = tokio::time::timeout(soon, stream.next())
        .await
        .expect("the RC that started matching the selector was never sent")
        .unwrap();
    assert_eq!(summary(&[entered]), pairs(&[("added", &id)]));
    label("db").await;
    let left = tokio::time::timeout(soon, stream.next())
        .await
        .expect("the RC that stopped matching the selector was never sent as deleted")
        .unwrap();
    assert_eq!(summary(&[left]), pairs(&[("deleted", &id)]));
}

/// With a selector over pods, a pod whose intent reaches the mirror before its labels (each
/// tree has its own watch) is sent as `added` once its labels do, and as `deleted` once
/// they are removed.
#[tokio::test]
async fn a_selector_stream_sends_a_pod_once_its_labels_arrive() {
    let watched = Watched::new(MirrorConfig::default()).await;
    let path = "/api/v1/watch?kinds=pods&selector=replication_controller_id%3Drc1";
    let mut stream = watched.open(path, None).await;
    assert_eq!(summary(&stream.snapshot().await), pairs(&[("synced", "")]));

    let store = &watched.app.store;
    let intent = "intent/node1/hello";
    store.put(intent, b"id: hello\n", Cas::Any).await.unwrap();
    watched.mirrored(intent).await;
    let labels = "labels/pod/node1/hello";
    let owned = br#"{"replication_controller_id":"rc1"}"#;
    store.put(labels, owned, Cas::Any).await.unwrap();
    let soon = Duration::from_secs(5);
    let entered = tokio::time::timeout(soon, stream.next())
        .await
        .expect("the pod was never sent once its labels arrived")
        .unwrap();
    assert_eq!(summary(&[entered]), pairs(&[("added", "node1/hello")]));

    store.delete(labels, Cas::Any).await.unwrap();
    let left = tokio::time::timeout(soon, stream.next())
        .await
        .expect("the pod whose labels went was never sent as deleted")
        .unwrap();
    assert_eq!(summary(&[left]), pairs(&[("deleted", "node1/hello")]));
}

/// Opens a stream of `app` at `uri`, resuming from `last` if given.
async fn open_on(app: &TestApp, uri: &str, last: Option<&str>) -> Events {
    let opened = try_open(app, uri, last).await;
    opened.unwrap_or_else(|refused| panic!("{uri} refused: {refused:?}"))
}

/// A client resuming with a selector while the server's own delete of an object it holds
/// is not yet confirmed by the tree's watch is told of the delete once it is.
#[tokio::test]
async fn a_resumed_selector_stream_hears_of_an_own_delete_confirmed_after_it_resumed() {
    let config = MirrorConfig {
        // The tree's watch reads again only when asked to, so the delete stays unconfirmed.
        min_reread_interval: Duration::from_secs(60),
        ..MirrorConfig::default()
    };
    let app = TestApp::configured(|store| store, config).await;
    let label = async |node: &str| {
        let uri = format!("/api/v1/labels/node/{node}");
        let labels = serde_json::json!({"labels": {"role": "web"}});
        let request = Request::put(uri)
            .header("content-type", "application/json")
            .body(Body::from(labels.to_string()))
            .unwrap();
        assert_eq!(app.send(request).await.status, StatusCode::OK);
    };
    label("web1").await;
    let path = "/api/v1/watch?kinds=nodes&selector=role%3Dweb";
    let mut stream = open_on(&app, path, None).await;
    let snapshot = stream.snapshot().await;
    assert_eq!(
        summary(&snapshot),
        pairs(&[("added", "web1"), ("synced", "")])
    );
    // The client's last event is a later change, of another object.
    label("web2").await;
    let last = stream.next().await.unwrap();
    let last_id = last.id.clone();
    assert_eq!(summary(&[last]), pairs(&[("added", "web2")]));
    drop(stream);
    let request = Request::delete("/api/v1/labels/node/web1")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.send(request).await.status, StatusCode::NO_CONTENT);
    assert!(app.mirror.get("labels/node/web1").is_none());
    let mut resumed = open_on(&app, path, Some(&last_id)).await;
    // The tree's watch reads it, confirming the delete.
    app.mirrored("labels/node/web1").await;
    let deleted = async {
        while let Some(event) = resumed.next().await {
            if summary(&[event]) == pairs(&[("deleted", "web1")]) {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), deleted)
        .await
        .expect("the deleted object was never sent as deleted");
}

/// Labels RC `id` `app=web` in the store, without the `pod_id` label, as P2 may have left
/// it: a label write may then remove every label, which it refuses while they hold `pod_id`.
async fn without_pod_id_label(app: &TestApp, id: &str) {
    let key = format!("labels/replication_controller/{id}");
    app.store
        .put(&key, br#"{"app":"web"}"#, Cas::Any)
        .await
        .unwrap();
    app.mirrored(&key).await;
}

/// An app whose trees' watches read again only when a reader asks them to, so that the
/// server's own deletes stay unconfirmed by them.
async fn unconfirmed_app() -> TestApp {
    let config = MirrorConfig {
        min_reread_interval: Duration::from_secs(60),
        ..MirrorConfig::default()
    };
    TestApp::configured(|store| store, config).await
}

/// Labels node `node` as `role` through the server.
async fn label_through(app: &TestApp, node: &str, role: &str) {
    let uri = format!("/api/v1/labels/node/{node}");
    let labels = serde_json::json!({"labels": {"role": role}});
    let request = Request::put(uri)
        .header("content-type", "application/json")
        .body(Body::from(labels.to_string()))
        .unwrap();
    assert_eq!(app.send(request).await.status, StatusCode::OK);
}

/// Deletes node `node`'s labels through the server.
async fn unlabel_through(app: &TestApp, node: &str) {
    let request = Request::delete(format!("/api/v1/labels/node/{node}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.send(request).await.status, StatusCode::NO_CONTENT);
}

/// The next `count` events of `stream`, each within a few seconds.
async fn next_events(stream: &mut Events, count: usize) -> Vec<Sse> {
    let mut events = Vec::new();
    for _ in 0..count {
        let next = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
        let Ok(Some(event)) = next else {
            panic!("the stream sent only {:?}", summary(&events));
        };
        events.push(event);
    }
    events
}

/// The server deletes an object and writes it again before the tree's watch confirms the
/// delete: a client told the object exists hears of its deletion before it is added again,
/// on a plain stream, a selector stream and a stream resumed from before the delete.
#[tokio::test]
async fn an_own_delete_then_write_again_is_streamed_as_deleted_then_added() {
    let app = unconfirmed_app().await;
    label_through(&app, "web1", "web").await;
    let plain = "/api/v1/watch?kinds=nodes";
    let selected = "/api/v1/watch?kinds=nodes&selector=role%3Dweb";
    let mut streams = Vec::new();
    let mut last_id = String::new();
    for path in [plain, selected] {
        let mut stream = open_on(&app, path, None).await;
        let snapshot = stream.snapshot().await;
        assert_eq!(
            summary(&snapshot),
            pairs(&[("added", "web1"), ("synced", "")])
        );
        last_id = snapshot.last().unwrap().id.clone();
        streams.push(stream);
    }
    unlabel_through(&app, "web1").await;
    assert!(app.mirror.get("labels/node/web1").is_none());
    label_through(&app, "web1", "web").await;
    let expected = pairs(&[("deleted", "web1"), ("added", "web1")]);
    for stream in &mut streams {
        let events = next_events(stream, 2).await;
        assert_eq!(summary(&events), expected);
        let index = |event: &Sse| event.data["index"].as_u64().unwrap();
        assert!(index(&events[0]) < index(&events[1]), "{events:?}");
    }
    for path in [plain, selected] {
        let mut resumed = open_on(&app, path, Some(&last_id)).await;
        // The changes of the position resumed from may come again.
        let mut events = next_events(&mut resumed, 1).await;
        events.retain(|event| event.id != last_id);
        let more = 2 - events.len();
        events.extend(next_events(&mut resumed, more).await);
        assert_eq!(summary(&events), expected);
    }
    // The watch's read confirming the delete adds nothing: the next event is a later change.
    app.mirrored("labels/node/web1").await;
    label_through(&app, "web2", "web").await;
    for stream in &mut streams {
        let next = summary(&next_events(stream, 1).await);
        assert_eq!(next, pairs(&[("added", "web2")]));
    }
}

/// A stream opened after the server deleted an object, before the tree's watch confirmed
/// the delete, holds the object until its deletion is streamed: it is sent that deletion,
/// whether the watch confirms it or the object is written again, of an object it was sent,
/// and so is a stream resumed from its snapshot's position.
#[tokio::test]
async fn a_snapshot_holds_an_own_delete_until_its_deletion_is_streamed() {
    let app = unconfirmed_app().await;
    label_through(&app, "web1", "web").await;
    label_through(&app, "web2", "web").await;
    unlabel_through(&app, "web1").await;
    unlabel_through(&app, "web2").await;
    let path = "/api/v1/watch?kinds=nodes";
    let mut stream = open_on(&app, path, None).await;
    let snapshot = stream.snapshot().await;
    assert_eq!(
        summary(&snapshot),
        pairs(&[("added", "web1"), ("added", "web2"), ("synced", "")])
    );
    let synced = snapshot.last().unwrap().id.clone();
    label_through(&app, "web1", "web").await;
    app.mirrored("labels/node/web2").await;
    let expected = pairs(&[("deleted", "web1"), ("added", "web1"), ("deleted", "web2")]);
    assert_eq!(summary(&next_events(&mut stream, 3).await), expected);
    let mut resumed = open_on(&app, path, Some(&synced)).await;
    assert_eq!(summary(&next_events(&mut resumed, 3).await), expected);
}

/// With a selector over pods, a pod scheduled as the RC farm schedules it (its labels, then
/// its intent, in one transaction of this server) is sent once as `added`: its labels bring
/// it in, and its intent, arriving after, comes as `modified`, not as a second `added`.
#[tokio::test]
async fn a_selector_stream_sends_a_pod_scheduled_with_its_labels_once() {
    use p2_apiserver::kv::TxnOp;
    use p2_apiserver::store::own_writes::OwnWrites;

    let app = TestApp::new().await;
    let path = "/api/v1/watch?kinds=pods&selector=replication_controller_id%3Drc1";
    let mut stream = open_on(&app, path, None).await;
    assert_eq!(summary(&stream.snapshot().await), pairs(&[("synced", "")]));
    let store = OwnWrites::wrap(app.store.clone(), app.mirror.clone());
    for node in ["node1", "node2"] {
        let ops = [
            TxnOp::Set {
                key: format!("labels/pod/{node}/hello"),
                value: br#"{"replication_controller_id":"rc1"}"#.to_vec(),
            },
            TxnOp::Set {
                key: format!("intent/{node}/hello"),
                value: b"id: hello\n".to_vec(),
            },
        ];
        store.txn(&ops).await.unwrap();
    }
    let events = next_events(&mut stream, 4).await;
    assert_eq!(
        summary(&events),
        pairs(&[
            ("added", "node1/hello"),
            ("modified", "node1/hello"),
            ("added", "node2/hello"),
            ("modified", "node2/hello")
        ])
    );
}

/// Opens a stream of `app` at `uri`, resuming from `last` if given: its events, or the
/// answer refusing it.
async fn try_open(app: &TestApp, uri: &str, last: Option<&str>) -> Result<Events, TestResponse> {
    let mut request = Request::get(uri);
    if let Some(last) = last {
        request = request.header("last-event-id", last);
    }
    let response = app.open(request.body(Body::empty()).unwrap()).await;
    if response.status() == StatusCode::OK {
        return Ok(Events {
            body: response.into_body(),
            buffer: String::new(),
        });
    }
    let (parts, body) = response.into_parts();
    Err(TestResponse {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    })
}

/// Waits until `/readyz` answers `ready` or not.
async fn until_readyz(app: &TestApp, ready: bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while (app.get("/readyz").await.status == StatusCode::OK) != ready {
        assert!(
            tokio::time::Instant::now() < deadline,
            "readyz never {ready}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// While the watch of a tree is lost past its bound, a new stream (or a resumed one) of a
/// kind in that tree is refused with 503, as the mirror's snapshot of the tree may be
/// arbitrarily old; streams of other kinds open. A stream already open stays open and,
/// once the watch is back, is sent what changed meanwhile, once; and the stream refused
/// opens then, with the change in its snapshot.
#[tokio::test]
async fn a_stream_of_a_tree_whose_watch_is_lost_is_refused_until_it_is_back() {
    use crate::support::counting::Counting;

    let mut counting = None;
    let config = MirrorConfig {
        watch_wait: Duration::from_millis(100),
        lost_after: Duration::ZERO,
        ..MirrorConfig::default()
    };
    let wrap = |store| {
        let store = Counting::new(store);
        counting = Some(store.clone());
        store as Arc<dyn p2_apiserver::kv::KvStore>
    };
    let app = TestApp::configured(wrap, config).await;
    let counting = counting.unwrap();
    label_through(&app, "web1", "web").await;
    let nodes = "/api/v1/watch?kinds=nodes";
    let selected = "/api/v1/watch?kinds=pods&selector=app%3Dweb";
    let mut open = open_on(&app, nodes, None).await;
    let snapshot = open.snapshot().await;
    assert_eq!(
        summary(&snapshot),
        pairs(&[("added", "web1"), ("synced", "")])
    );
    let synced = snapshot.last().unwrap().id.clone();

    counting.fail_watches_of(Some("labels/"));
    until_readyz(&app, false).await;
    // Written behind the server's back: the mirror cannot learn of it.
    let web2 = br#"{"role":"web"}"#;
    app.store
        .put("labels/node/web2", web2, Cas::Any)
        .await
        .unwrap();
    for (uri, last) in [
        (nodes, None),
        (nodes, Some(synced.as_str())),
        (selected, None),
    ] {
        let refused = match try_open(&app, uri, last).await {
            Ok(mut stream) => panic!(
                "{uri} from {last:?} opened: {:?}",
                summary(&next_events(&mut stream, 2).await)
            ),
            Err(refused) => refused,
        };
        assert_eq!(
            refused.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{refused:?}"
        );
        assert_eq!(refused.error().reason, "ServiceUnavailable");
    }
    // The RCs' watch is not lost: their stream opens.
    let mut rcs = open_on(&app, "/api/v1/watch?kinds=rcs", None).await;
    assert_eq!(summary(&rcs.snapshot().await), pairs(&[("synced", "")]));

    counting.fail_watches_of(None);
    until_readyz(&app, true).await;
    assert_eq!(
        summary(&next_events(&mut open, 1).await),
        pairs(&[("added", "web2")])
    );
    let mut reopened = try_open(&app, nodes, None)
        .await
        .expect("refused once back");
    assert_eq!(
        summary(&reopened.snapshot().await),
        pairs(&[("added", "web1"), ("added", "web2"), ("synced", "")])
    );
    // The client refused a resume resumes now, and is sent what changed meanwhile.
    let mut resumed = open_on(&app, nodes, Some(&synced)).await;
    let mut replayed = next_events(&mut resumed, 1).await;
    replayed.retain(|event| event.id != synced);
    if replayed.is_empty() {
        replayed = next_events(&mut resumed, 1).await;
    }
    assert_eq!(summary(&replayed), pairs(&[("added", "web2")]));
    // Nothing came twice: the next event of each is a later change.
    label_through(&app, "web3", "web").await;
    for stream in [&mut open, &mut reopened, &mut resumed] {
        let next = summary(&next_events(stream, 1).await);
        assert_eq!(next, pairs(&[("added", "web3")]));
    }
}

/// The store restarted (its index gone backwards): a stream open is sent `resync`, then a
/// snapshot of the store as it is now, not of the one before, which the mirror holds until
/// it has read each tree again; and a stream opened meanwhile starts from the store as it
/// is now too. Then changes follow, each once.
#[tokio::test]
async fn after_the_store_went_backwards_a_snapshot_is_of_the_store_as_it_is_now() {
    let config = MirrorConfig {
        watch_wait: Duration::from_millis(100),
        ..MirrorConfig::default()
    };
    let (app, switch) = switchable::app(config, None).await;
    for node in ["old1", "old2", "old3", "old4"] {
        label_through(&app, node, "web").await;
    }
    // The node labels' watch has listed them: the fresh store's listing is below it.
    app.mirrored("labels/node/old4").await;
    let (fresh, _dir) = fresh_store().await;
    fresh
        .put("labels/node/new", br#"{"role":"web"}"#, Cas::Any)
        .await
        .unwrap();
    let nodes = "/api/v1/watch?kinds=nodes";
    let mut open = open_on(&app, nodes, None).await;
    assert_eq!(open.snapshot().await.len(), 5);

    // The node labels' whole read of the fresh store is slow.
    switch.slow_lists(Some("labels/node/"));
    *switch.inner.write().unwrap() = fresh;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let release = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        switch.slow_lists(None);
    };
    let (mut opened, ()) = tokio::join!(open_on(&app, nodes, None), release);

    let expected = pairs(&[("added", "new"), ("synced", "")]);
    assert_eq!(
        summary(&next_events(&mut open, 1).await),
        pairs(&[("resync", "")])
    );
    assert_eq!(summary(&open.snapshot().await), expected);
    assert_eq!(summary(&opened.snapshot().await), expected);
    label_through(&app, "web3", "web").await;
    for stream in [&mut open, &mut opened] {
        let next = summary(&next_events(stream, 1).await);
        assert_eq!(next, pairs(&[("added", "web3")]));
    }
}

/// The store restarted while its tree's watch had yet to list the server's own writes
/// (the fresh store's index is past the last listing, below those writes): it went
/// backwards all the same, so a stream is sent `resync` and a snapshot of the fresh store,
/// not the fresh store's objects added beside the old store's.
#[tokio::test]
async fn a_store_restarted_below_the_servers_unlisted_writes_is_read_again() {
    use p2_apiserver::labels::LabelType;
    use p2_apiserver::state::Tree;

    let config = MirrorConfig {
        // The watch reads again only when asked to, so the own writes stay unlisted.
        min_reread_interval: Duration::from_secs(60),
        ..MirrorConfig::default()
    };
    // A store of its own, whose index only this test moves (unlike the fake Consul the
    // tests share).
    let (old, _old_dir) = fresh_store().await;
    let (app, switch) = switchable::app(config, Some(old)).await;
    let nodes = "/api/v1/watch?kinds=nodes";
    let mut open = open_on(&app, nodes, None).await;
    assert_eq!(summary(&open.snapshot().await), pairs(&[("synced", "")]));
    for node in ["old1", "old2", "old3", "old4"] {
        label_through(&app, node, "web").await;
    }
    assert_eq!(next_events(&mut open, 4).await.len(), 4);
    let tree = Tree::Labels(LabelType::Node);
    let (fresh, _dir) = fresh_store().await;
    for key in ["other/a", "other/b", "labels/node/new"] {
        let value = br#"{"role":"web"}"#;
        fresh.put(key, value, Cas::Any).await.unwrap();
    }
    let fresh_index = fresh.prefix_index(&tree.prefix()).await.unwrap();
    assert!(app.mirror.listed_index(&[tree]) <= fresh_index);
    assert!(fresh_index < app.mirror.tree_index(tree));

    *switch.inner.write().unwrap() = fresh;
    // A reader asks for the tree: its watch reads the fresh store.
    app.mirror
        .catch_up_to(&[tree], u64::MAX, Duration::from_secs(1))
        .await;
    let expected = pairs(&[("resync", ""), ("added", "new"), ("synced", "")]);
    assert_eq!(summary(&next_events(&mut open, 3).await), expected);
}

/// The server restarts (a new mirror over the same store) after an object was deleted: a
/// client resuming from a position the server before it gave, whose changes since (the
/// delete) the new server never streamed, is sent `resync` and a fresh snapshot, not the
/// changes of its position alone, which would leave it holding the deleted object.
#[tokio::test]
async fn a_position_from_before_a_restart_gets_resync_rather_than_missing_a_delete() {
    let before = TestApp::new().await;
    // The object deleted is not the newest, so the restarted server's newest object is
    // at the client's position.
    label_through(&before, "gone", "web").await;
    label_through(&before, "kept", "web").await;
    let nodes = "/api/v1/watch?kinds=nodes";
    let mut stream = open_on(&before, nodes, None).await;
    let synced = stream.snapshot().await.pop().unwrap().id;
    drop(stream);
    // Behind the servers' backs, as by P2's tools.
    let store = before.store.clone();
    store.delete("labels/node/gone", Cas::Any).await.unwrap();
    let restarted = TestApp::wrapping(move |_| store).await;

    let resumed = open_on(&restarted, nodes, Some(&synced)).await;
    told_of_delete_or_resync(resumed, "gone").await;
}

/// Reads `stream` until it sends the deletion of `id` or `resync`, failing the test if it
/// does neither within a few seconds.
async fn told_of_delete_or_resync(mut stream: Events, id: &str) {
    let mut seen = Vec::new();
    let delete = pairs(&[("deleted", id)]).remove(0);
    let resync = ("resync".to_owned(), String::new());
    let told = async {
        while let Some(event) = stream.next().await {
            seen.extend(summary(&[event]));
            if seen.contains(&delete) || seen.contains(&resync) {
                return;
            }
        }
    };
    let told = tokio::time::timeout(Duration::from_secs(5), told).await;
    assert!(told.is_ok(), "never told of the delete: {seen:?}");
}

/// An empty `selector` selects everything, as on the listings: the stream is one without a
/// selector, of every kind asked for, those without labels included.
#[tokio::test]
async fn an_empty_selector_is_as_none() {
    let watched = Watched::new(MirrorConfig::default()).await;
    watched.label_node("n1", "web").await;
    watched.mirrored("labels/node/n1").await;
    let mut stream = watched
        .open("/api/v1/watch?kinds=nodes,health&selector=", None)
        .await;
    assert_eq!(
        summary(&stream.snapshot().await),
        pairs(&[("added", "n1"), ("synced", "")])
    );
}

/// A node or a label set relabelled into a selector is sent as `added` and one relabelled
/// out of it as `deleted`, live and to a client resuming from before the change (which
/// never received the object), as RCs, rolls and pods are.
#[tokio::test]
async fn a_node_or_label_set_entering_a_selector_is_added_live_and_on_resume() {
    let watched = Watched::new(MirrorConfig::default()).await;
    let store = &watched.app.store;
    watched.label_node("n1", "db").await;
    let rc_labels = "labels/replication_controller/rc1";
    store
        .put(rc_labels, br#"{"role":"db"}"#, Cas::Any)
        .await
        .unwrap();
    watched.mirrored(rc_labels).await;
    watched.mirrored("labels/node/n1").await;

    for (path, id, relabel) in [
        (
            "/api/v1/watch?kinds=nodes&selector=role%3Dweb",
            "n1",
            "labels/node/n1",
        ),
        (
            "/api/v1/watch?kinds=labels&selector=role%3Dweb",
            "replication_controller/rc1",
            rc_labels,
        ),
    ] {
        let mut live = watched.open(path, None).await;
        let snapshot = live.snapshot().await;
        assert_eq!(summary(&snapshot), pairs(&[("synced", "")]), "{path}");
        let last = snapshot.last().unwrap().id.clone();

        store
            .put(relabel, br#"{"role":"web"}"#, Cas::Any)
            .await
            .unwrap();
        let entered = live.next().await.unwrap();
        assert_eq!(summary(&[entered]), pairs(&[("added", id)]), "{path} live");
        // The changes at the resumed position may come again (as deleted: they do not
        // match); the relabelling is the object's entry into the selector.
        let mut resumed = watched.open(path, Some(&last)).await;
        let entered = loop {
            let event = resumed.next().await.unwrap();
            assert_eq!(event.data["id"], id, "{path} resumed: {event:?}");
            if event.data["object"]["role"] == "web" {
                break event;
            }
            assert_eq!(event.event, "deleted", "{path} resumed: {event:?}");
        };
        assert_eq!(
            summary(&[entered]),
            pairs(&[("added", id)]),
            "{path} resumed"
        );

        store
            .put(relabel, br#"{"role":"db"}"#, Cas::Any)
            .await
            .unwrap();
        let left = live.next().await.unwrap();
        assert_eq!(summary(&[left]), pairs(&[("deleted", id)]), "{path} live");
        let left = resumed.next().await.unwrap();
        assert_eq!(
            summary(&[left]),
            pairs(&[("deleted", id)]),
            "{path} resumed"
        );
    }
}

/// A stream outlives the check of the token it was opened with: once the token file is
/// re-read without that token, the stream ends rather than keep sending to a revoked token.
#[tokio::test]
async fn a_stream_ends_when_its_token_is_revoked() {
    let tokens = crate::auth::Revocable::new().await;
    let app = &tokens.app;
    let open = |token: &str| {
        let request = Request::get("/api/v1/watch?kinds=nodes")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        async {
            let response = app.open(request).await;
            assert_eq!(response.status(), StatusCode::OK);
            let mut stream = Events {
                body: response.into_body(),
                buffer: String::new(),
            };
            stream.snapshot().await;
            stream
        }
    };
    // A change a stream still open is sent.
    let label = |node: &str| {
        let request = Request::put(format!("/api/v1/labels/node/{node}"))
            .header("authorization", "Bearer writer-token")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"labels": {"role": "web"}}"#))
            .unwrap();
        async { assert_eq!(app.send(request).await.status, StatusCode::OK) }
    };

    let mut revoked = open("watcher-token").await;
    let mut kept = open("writer-token").await;
    tokens.revoke_watcher();
    label("node1").await;
    let after = revoked.next().await;
    assert!(after.is_none(), "sent to a revoked token: {after:?}");
    let after = kept
        .next()
        .await
        .expect("the stream of a listed token goes on");
    assert_eq!(summary(&[after]), pairs(&[("added", "node1")]));
}

/// The server deletes an object twice before the tree's watch confirms the first delete
/// (an RC's labels removed, then the RC deleted with its labels): a client sent the object
/// hears of its deletion once the watch confirms it; the second delete, which finds nothing
/// to remove, does not make the mirror forget the version the first removed.
#[tokio::test]
async fn a_second_own_delete_before_the_first_is_confirmed_keeps_its_deletion_streamed() {
    let app = unconfirmed_app().await;
    let id = app.create_empty_rc().await;
    let labels_uri = format!("/api/v1/labels/replication_controller/{id}");
    let label_id = format!("replication_controller/{id}");
    without_pod_id_label(&app, &id).await;

    let mut stream = open_on(&app, "/api/v1/watch?kinds=labels", None).await;
    let snapshot = stream.snapshot().await;
    assert_eq!(
        summary(&snapshot),
        pairs(&[("added", &label_id), ("synced", "")])
    );
    let unlabelled = app.json_request("DELETE", &labels_uri, None, &[]).await;
    assert_eq!(unlabelled.status, StatusCode::NO_CONTENT, "{unlabelled:?}");
    let rc_uri = format!("/api/v1/rcs/{id}");
    let deleted = app.json_request("DELETE", &rc_uri, None, &[]).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    // The labels' watch reads, confirming the delete.
    app.mirrored(&format!("labels/replication_controller/{id}"))
        .await;
    let next = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the deleted label set was never sent as deleted")
        .unwrap();
    assert_eq!(summary(&[next]), pairs(&[("deleted", &label_id)]));
}

/// The server restarts while its own delete of an object is not yet confirmed by the tree's
/// watch, after a later write of its own: a client whose last id is that write's (the
/// restarted server's newest index too) never got the deletion, which the restarted server
/// never streams (its first read of the store lacks the object). Resumed from that id, it
/// is sent `resync` and a fresh snapshot, or the deletion: never nothing.
#[tokio::test]
async fn a_position_past_an_unconfirmed_own_delete_gets_resync_after_a_restart() {
    let before = unconfirmed_app().await;
    label_through(&before, "gone", "web").await;
    let nodes = "/api/v1/watch?kinds=nodes";
    let mut stream = open_on(&before, nodes, None).await;
    stream.snapshot().await;
    unlabel_through(&before, "gone").await;
    label_through(&before, "kept", "web").await;
    let kept = next_events(&mut stream, 1).await.remove(0);
    assert_eq!(
        summary(std::slice::from_ref(&kept)),
        pairs(&[("added", "kept")])
    );
    drop(stream);
    let store = before.store.clone();
    let restarted = TestApp::wrapping(move |_| store).await;

    let resumed = open_on(&restarted, nodes, Some(&kept.id)).await;
    told_of_delete_or_resync(resumed, "gone").await;
}

/// A selector stream of RCs follows the RCs' label sets, not every label set: a storm of
/// pod labels (the farms write one per pod they schedule) does not count against its buffer,
/// so a client a few RC changes behind is not cut off by it.
#[tokio::test]
async fn a_selector_stream_of_rcs_is_not_dropped_for_other_label_sets_changes() {
    let config = MirrorConfig {
        subscriber_buffer: 4,
        ..MirrorConfig::default()
    };
    let watched = Watched::new(config).await;
    let created = watched.create_rc().await;
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let rc_labels = format!("labels/replication_controller/{id}");
    let path = "/api/v1/watch?kinds=rcs&selector=app%3Dweb";
    let mut stream = watched.open(path, None).await;
    assert_eq!(summary(&stream.snapshot().await), pairs(&[("synced", "")]));

    // The client reads nothing while more pod label sets change than its buffer holds.
    let store = &watched.app.store;
    for i in 0..10 {
        let key = format!("labels/pod/node{i}/hello");
        store
            .put(&key, br#"{"app":"web"}"#, Cas::Any)
            .await
            .unwrap();
    }
    watched.mirrored("labels/pod/node9/hello").await;
    store
        .put(&rc_labels, br#"{"app":"web"}"#, Cas::Any)
        .await
        .unwrap();
    let entered = stream.next().await.unwrap();
    assert_eq!(summary(&[entered]), pairs(&[("added", &id)]));
}

/// A client holding an RC through a selector stream resumes after the server removed the
/// RC's labels, before the labels' watch confirmed it: the RC, which stopped matching, is
/// sent as deleted once the removal is streamed, whether or not the stream follows label
/// sets as a kind too.
#[tokio::test]
async fn a_resumed_selector_stream_hears_of_an_object_whose_labels_the_server_removed() {
    for path in [
        "/api/v1/watch?kinds=rcs&selector=app%3Dweb",
        "/api/v1/watch?kinds=rcs,labels&selector=app%3Dweb",
    ] {
        resumed_after_labels_removed(path).await;
    }
}

async fn resumed_after_labels_removed(path: &str) {
    let app = unconfirmed_app().await;
    let ids = [app.create_empty_rc().await, app.create_empty_rc().await];
    let labels_uri = |id: &str| format!("/api/v1/labels/replication_controller/{id}");
    let labels = serde_json::json!({"labels": {"app": "web"}});
    without_pod_id_label(&app, &ids[0]).await;

    let mut stream = open_on(&app, path, None).await;
    let snapshot = summary(&stream.snapshot().await);
    assert!(
        snapshot.contains(&pairs(&[("added", &ids[0])])[0]),
        "{path}: {snapshot:?}"
    );
    // The client's last event is a later change, of another RC.
    let labelled = app
        .send_json("PATCH", &labels_uri(&ids[1]), &[], &labels)
        .await;
    assert_eq!(labelled.status, StatusCode::OK, "{labelled:?}");
    let entered = pairs(&[("added", &ids[1])]);
    let last = loop {
        let event = next_events(&mut stream, 1).await.remove(0);
        if summary(std::slice::from_ref(&event)) == entered {
            break event;
        }
    };
    drop(stream);

    let unlabelled = app
        .json_request("DELETE", &labels_uri(&ids[0]), None, &[])
        .await;
    assert_eq!(unlabelled.status, StatusCode::NO_CONTENT, "{unlabelled:?}");
    let mut resumed = open_on(&app, path, Some(&last.id)).await;
    // The labels' watch reads, confirming the removal.
    app.mirrored(&format!("labels/replication_controller/{}", ids[0]))
        .await;
    let left = pairs(&[("deleted", &ids[0])]);
    let deleted = async {
        while let Some(event) = resumed.next().await {
            if summary(&[event]) == left {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), deleted)
        .await
        .unwrap_or_else(|_| {
            panic!("{path}: the RC whose labels were removed was never sent as deleted")
        });
}

/// With a selector over RCs, an RC that its labels bring into the selector is sent as it
/// is when the stream gets to the label change; changes of the RC older than that version,
/// which the stream gets to after, are not sent: the client never sees it go back.
#[tokio::test]
async fn a_selector_stream_never_sends_an_object_older_than_it_sent() {
    let app = TestApp::new().await;
    let id = app.create_empty_rc().await;
    let path = "/api/v1/watch?kinds=rcs&selector=app%3Dweb";
    let mut stream = open_on(&app, path, None).await;
    assert_eq!(summary(&stream.snapshot().await), pairs(&[("synced", "")]));

    // The client reads nothing while the RC is labelled, then changed twice.
    let labels_uri = format!("/api/v1/labels/replication_controller/{id}");
    let labels = serde_json::json!({"labels": {"app": "web"}});
    let labelled = app.send_json("PATCH", &labels_uri, &[], &labels).await;
    assert_eq!(labelled.status, StatusCode::OK, "{labelled:?}");
    let rc_uri = format!("/api/v1/rcs/{id}");
    for replicas in [1, 2] {
        let patch = serde_json::json!({"replicas_desired": replicas});
        let patched = app.merge_patch(&rc_uri, &patch, &[]).await;
        assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    }
    // Up to the last change's own event.
    let mut seen = Vec::new();
    while seen.last() != Some(&("modified".to_owned(), 2)) {
        let event = next_events(&mut stream, 1).await.remove(0);
        assert_eq!(event.data["id"], id.as_str(), "{event:?}");
        let replicas = event.data["object"]["replicas_desired"].as_u64().unwrap();
        seen.push((event.event, replicas));
    }
    let replicas: Vec<u64> = seen.iter().map(|(_, replicas)| *replicas).collect();
    assert!(replicas.is_sorted(), "the RC went back: {seen:?}");
}

/// A client resuming with a selector over RCs, whose RC was changed while it did not match,
/// then labelled into the selector: the client never held the RC, so the first event of it
/// is `added` (as the relabelled object it is), never a `modified` of an object it was not
/// sent.
#[tokio::test]
async fn a_resumed_selector_stream_sends_an_rc_relabelled_in_as_added_first() {
    let app = TestApp::new().await;
    let id = app.create_empty_rc().await;
    // The stream's position moves past the RC's creation.
    label_through(&app, "n1", "web").await;
    let path = "/api/v1/watch?kinds=rcs&selector=app%3Dweb";
    let mut stream = open_on(&app, path, None).await;
    let snapshot = stream.snapshot().await;
    assert_eq!(summary(&snapshot), pairs(&[("synced", "")]));
    drop(stream);

    // While the client is away, the RC (not matching) is changed, then labelled in.
    change_then_label_web(&app, &id).await;

    let synced = &snapshot[0].id;
    let mut resumed = open_on(&app, path, Some(synced)).await;
    let first = next_events(&mut resumed, 1).await;
    assert_eq!(summary(&first), pairs(&[("added", &id)]));
}

/// Changes RC `id`, then labels it `app=web`.
async fn change_then_label_web(app: &TestApp, id: &str) {
    let rc_uri = format!("/api/v1/rcs/{id}");
    let patch = serde_json::json!({"replicas_desired": 1});
    let patched = app.merge_patch(&rc_uri, &patch, &[]).await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    let labels_uri = format!("/api/v1/labels/replication_controller/{id}");
    let labels = serde_json::json!({"labels": {"app": "web"}});
    let labelled = app.send_json("PATCH", &labels_uri, &[], &labels).await;
    assert_eq!(labelled.status, StatusCode::OK, "{labelled:?}");
}

/// A pod's and a reality report's `object` is its manifest's text, as documented, also for
/// a manifest written in YAML's flow style, which reads as JSON: an SDK decodes the same
/// kind of object whatever style a writer chose.
#[tokio::test]
async fn a_manifest_in_json_form_is_sent_as_its_text() {
    let watched = Watched::new(MirrorConfig::default()).await;
    let manifest = r#"{"id": "hello", "launchables": {}}"#;
    for key in ["intent/node1/hello", "reality/node1/hello"] {
        let store = &watched.app.store;
        store.put(key, manifest.as_bytes(), Cas::Any).await.unwrap();
        watched.mirrored(key).await;
    }
    let mut stream = watched.open("/api/v1/watch?kinds=pods,reality", None).await;
    let snapshot = stream.snapshot().await;
    assert_eq!(
        summary(&snapshot),
        pairs(&[
            ("added", "node1/hello"),
            ("added", "node1/hello"),
            ("synced", "")
        ])
    );
    for event in &snapshot[..2] {
        assert_eq!(event.data["object"], manifest, "{event:?}");
    }
}

/// A client resuming without a selector holds every RC it follows: an RC changed, then
/// labelled, while it was away comes as `modified`, as any change of an object it holds,
/// its labels' change being no selector's bringing it in.
#[tokio::test]
async fn a_resumed_stream_without_a_selector_sends_a_relabelled_rcs_change_as_modified() {
    let app = TestApp::new().await;
    let id = app.create_empty_rc().await;
    // The stream's position moves past the RC's creation.
    label_through(&app, "n1", "web").await;
    let path = "/api/v1/watch?kinds=rcs,labels";
    let mut stream = open_on(&app, path, None).await;
    let snapshot = stream.snapshot().await;
    let synced = &snapshot.last().unwrap().id;
    drop(stream);

    // While the client is away, the RC is changed, then labelled.
    change_then_label_web(&app, &id).await;

    let mut resumed = open_on(&app, path, Some(synced)).await;
    let mut seen = Vec::new();
    while seen.last().is_none_or(|(_, of)| *of != id) {
        seen.extend(summary(&next_events(&mut resumed, 1).await));
    }
    assert_eq!(seen.last().unwrap().0, "modified", "{seen:?}");
}
