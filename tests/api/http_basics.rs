//! What every route shares: probes, JSON errors, request ids, the body limit, and the
//! binary's start and graceful stop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Request, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use p2_apiserver::api::extract::{ApiJson, ApiPath, ApiQuery};
use p2_apiserver::app::{App, HttpLimits};
use p2_apiserver::kv::consul::{ConsulConfig, ConsulStore};
use p2_apiserver::kv::shared_listings::SharedListings;
use p2_apiserver::kv::{
    Cas, KvPair, KvStore, Listing, SessionInfo, SessionSpec, StoreError, StoreResult, TxnOp,
    WatchTarget,
};
use p2_apiserver::metrics::HTTP_CONNECTIONS_REFUSED;
use p2_apiserver::router::{self, MAX_BODY_BYTES, MAX_HEADERS, MAX_HEADER_BYTES, MAX_URI_BYTES};
use p2_apiserver::server;
use p2_apiserver::state::{Mirror, MirrorConfig};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use utoipa::IntoParams;
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::api::{call, TestApp};
use crate::support::scrape::Metrics;

#[tokio::test]
async fn healthz_answers_ok() {
    let app = TestApp::new().await;
    let response = app.get("/healthz").await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.json(), json!({"status": "ok"}));
}

#[tokio::test]
async fn readyz_answers_ok_while_the_store_answers() {
    let app = TestApp::new().await;
    let response = app.get("/readyz").await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.json(), json!({"status": "ok"}));
}

#[tokio::test]
async fn readyz_is_503_with_the_reason_when_the_store_fails() {
    let app = TestApp::wrapping(|inner| Arc::new(PingFails { inner })).await;
    let response = app.get("/readyz").await;
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    let error = response.error();
    assert_eq!(error.reason, "ServiceUnavailable");
    assert!(error.message.contains(PING_FAILURE), "{error:?}");
    // Liveness does not depend on the store.
    assert_eq!(app.get("/healthz").await.status, StatusCode::OK);
}

#[tokio::test]
async fn unknown_route_is_404_json() {
    let app = TestApp::new().await;
    let response = app.get("/no/such/thing").await;
    assert_eq!(response.status, StatusCode::NOT_FOUND);
    let error = response.error();
    assert_eq!(error.reason, "NotFound");
    assert!(error.message.contains("/no/such/thing"), "{error:?}");
    assert!(error.causes.is_empty());
}

#[tokio::test]
async fn wrong_method_is_405_json_with_allow() {
    let app = TestApp::new().await;
    let response = app
        .send(Request::delete("/healthz").body(Body::empty()).unwrap())
        .await;
    assert_eq!(response.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(response.error().reason, "MethodNotAllowed");
    let allow = response.header("allow").expect("an Allow header");
    assert!(allow.contains("GET"), "{allow}");
}

#[tokio::test]
async fn request_id_is_generated_when_absent() {
    let app = TestApp::new().await;
    let first = app.get("/healthz").await;
    let second = app.get("/no/such/thing").await;
    let ids = [&first, &second].map(|r| r.header("x-request-id").expect("a request id"));
    for id in &ids {
        uuid::Uuid::parse_str(id).unwrap_or_else(|_| panic!("{id:?} is no UUID"));
    }
    assert_ne!(ids[0], ids[1]);
    // An id that is empty, too long to keep in every event of the request, or not visible
    // ASCII is none.
    let long = "x".repeat(201);
    let unusable: [&[u8]; 4] = [b"", long.as_bytes(), b"two words", "caf\u{e9}".as_bytes()];
    for sent in unusable {
        let request = Request::get("/healthz")
            .header("x-request-id", HeaderValue::from_bytes(sent).unwrap())
            .body(Body::empty())
            .unwrap();
        let response = app.send(request).await;
        let id = response.header("x-request-id").expect("a request id");
        let sent = String::from_utf8_lossy(sent);
        uuid::Uuid::parse_str(id).unwrap_or_else(|_| panic!("{sent:?} kept as {id:?}"));
    }
}

#[tokio::test]
async fn request_id_is_echoed_when_given() {
    let app = TestApp::new().await;
    let request = Request::get("/healthz")
        .header("x-request-id", "client-chosen-42")
        .body(Body::empty())
        .unwrap();
    let response = app.send(request).await;
    assert_eq!(response.header("x-request-id"), Some("client-chosen-42"));
    let longest = "x".repeat(200);
    let request = Request::get("/healthz")
        .header("x-request-id", &longest)
        .body(Body::empty())
        .unwrap();
    let response = app.send(request).await;
    assert_eq!(response.header("x-request-id"), Some(longest.as_str()));
}

#[tokio::test]
async fn openapi_document_lists_the_probes() {
    let app = TestApp::new().await;
    let doc = app.get("/openapi.json").await.json();
    assert_eq!(
        doc["paths"]["/healthz"]["get"]["operationId"],
        "get_healthz"
    );
    assert_eq!(doc["paths"]["/readyz"]["get"]["operationId"], "get_readyz");
    assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
}

/// Routes that exist only here, wrapped exactly like the real ones, to exercise the
/// extractors and the body limit before any real route takes a body.
fn extractor_routes() -> Router {
    #[derive(Deserialize, IntoParams)]
    struct Page {
        limit: u32,
    }
    #[derive(Deserialize)]
    struct Named {
        name: String,
    }
    let routes = Router::new()
        .route(
            "/echo",
            post(|ApiJson(v): ApiJson<Value>| async { ApiJson(v) }),
        )
        .route(
            "/named",
            post(|ApiJson(n): ApiJson<Named>| async move { n.name }),
        )
        .route(
            "/items/{n}",
            get(
                |ApiPath(n): ApiPath<u32>, ApiQuery(p): ApiQuery<Page>| async move {
                    format!("{n}/{}", p.limit)
                },
            ),
        );
    router::with_middleware(routes, HttpLimits::default())
}

/// A JSON POST with its Content-Length, as a real client sends it.
fn post_json(path: &str, body: impl Into<Bytes>) -> Request<Body> {
    let body = body.into();
    Request::post(path)
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .body(Body::from(body))
        .unwrap()
}

/// A JSON string value of exactly `len` bytes.
fn json_of_len(len: usize) -> Vec<u8> {
    let mut body = vec![b'"'; 1];
    body.resize(len - 1, b'a');
    body.push(b'"');
    body
}

#[tokio::test]
async fn bodies_up_to_the_limit_are_accepted() {
    let body = json_of_len(MAX_BODY_BYTES);
    let response = call(&extractor_routes(), post_json("/echo", body)).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(
        response.json().as_str().map(str::len),
        Some(MAX_BODY_BYTES - 2)
    );
}

#[tokio::test]
async fn oversized_body_is_413_json() {
    // With a Content-Length the limit refuses before reading.
    let body = json_of_len(MAX_BODY_BYTES + 1);
    let response = call(&extractor_routes(), post_json("/echo", body.clone())).await;
    assert_eq!(response.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.error().reason, "PayloadTooLarge");

    // Streamed without a length, the extractor hits the limit while reading.
    let chunks = body
        .chunks(64 * 1024)
        .map(|c| Ok::<_, std::io::Error>(Bytes::copy_from_slice(c)))
        .collect::<Vec<_>>();
    let streamed = Request::post("/echo")
        .header("content-type", "application/json")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap();
    let response = call(&extractor_routes(), streamed).await;
    assert_eq!(response.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.error().reason, "PayloadTooLarge");
}

/// A handler that panics (a bug: a manifest that panicked its reading was one) is answered
/// with the JSON error body, its cause logged under the request's id, as any other
/// server-side failure: a read 500, a write `OutcomeUnknown`, as it may have sent a write
/// before it panicked. Before, the panic took the connection down with no answer at all.
#[tokio::test]
async fn a_handler_that_panics_answers_with_the_json_body() {
    async fn panics() {
        panic!("a bug");
    }
    let routes = Router::new().route("/panics", get(panics).post(panics));
    let router = router::with_middleware(routes, HttpLimits::default());
    let response = call(
        &router,
        Request::get("/panics").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(response.status, StatusCode::INTERNAL_SERVER_ERROR);
    let error = response.error();
    assert_eq!(error.reason, "InternalError");
    assert!(!error.message.contains("a bug"), "{error:?}");
    assert!(response.header("x-request-id").is_some());
    let response = call(
        &router,
        Request::post("/panics").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.error().reason, "OutcomeUnknown");
}

#[tokio::test]
async fn bad_json_bodies_are_json_errors() {
    let routes = extractor_routes();

    let response = call(&routes, post_json("/named", r#"{"name": "#)).await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    assert_eq!(response.error().reason, "BadRequest");

    let response = call(&routes, post_json("/named", r#"{"name": 7}"#)).await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.error().reason, "Invalid");

    let request = Request::post("/named")
        .header("content-type", "text/plain")
        .body(Body::from(r#"{"name": "x"}"#))
        .unwrap();
    let response = call(&routes, request).await;
    assert_eq!(response.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(response.error().reason, "UnsupportedMediaType");

    let response = call(&routes, post_json("/named", r#"{"name": "x"}"#)).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(&response.body[..], b"x");
}

#[tokio::test]
async fn bad_path_and_query_are_400_json() {
    let routes = extractor_routes();
    let get = |uri: &str| Request::get(uri).body(Body::empty()).unwrap();

    let response = call(&routes, get("/items/7?limit=3")).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(&response.body[..], b"7/3");

    for uri in ["/items/seven?limit=3", "/items/7?limit=many", "/items/7"] {
        let response = call(&routes, get(uri)).await;
        assert_eq!(response.status, StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(response.error().reason, "BadRequest", "{uri}");
    }
}

/// Stops the child if the test fails before it does.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn binary_serves_and_exits_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("p2.db").display());
    let mut server = Server(
        Command::new(env!("CARGO_BIN_EXE_p2-apiserver"))
            .args(["serve", "--listen", "127.0.0.1:0", "--store", &store])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );

    // Read the log on a thread, and keep reading so the server never blocks on a full pipe.
    let stdout = server.0.stdout.take().unwrap();
    let (addr_tx, addr_rx) = mpsc::channel();
    let log = std::thread::spawn(move || {
        let mut log = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some((_, addr)) = line.split_once("listening on ") {
                let _ = addr_tx.send(addr.trim().to_string());
            }
            log.push(line);
        }
        log
    });
    // The sender drops when the log ends, so a server that dies early fails this at once.
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the server never logged `listening on ADDR`");

    let response = http_get(&addr, "/healthz");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with(r#"{"status":"ok"}"#), "{response}");

    // Once elected, the server holds a session; a blocking query is in flight at shutdown.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !http_get(&addr, "/api/v1/leader").starts_with("HTTP/1.1 200") {
        assert!(Instant::now() < deadline, "the server never became leader");
        std::thread::sleep(Duration::from_millis(50));
    }
    let index = header_value(&http_get(&addr, "/api/v1/rcs"), "x-index").unwrap();
    let blocked_addr = addr.clone();
    let blocked = std::thread::spawn(move || {
        http_get(&blocked_addr, &format!("/api/v1/rcs?index={index}&wait=5m"))
    });
    std::thread::sleep(Duration::from_millis(300));

    let killed = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = log.join().unwrap();
    assert_eq!(status.code(), Some(0), "{}", log.join("\n"));
    let answer = blocked.join().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The leader's session was destroyed, which deletes the lock at once.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let lock = runtime.block_on(async {
        let path = dir.path().join("p2.db").display().to_string();
        let store = p2_apiserver::kv::sqlite::SqliteStore::open(&path)
            .await
            .unwrap();
        store.get(p2_apiserver::layout::LEADER_LOCK).await.unwrap()
    });
    assert_eq!(lock, None, "the leader lock outlived the server");
    assert!(
        log.iter().any(|l| l.contains("SIGTERM received")),
        "{log:?}"
    );
}

const PING_FAILURE: &str = "ping refused by the test";

/// The real store, except that `ping` fails, as when Consul loses its leader.
struct PingFails {
    inner: Arc<dyn KvStore>,
}

#[async_trait]
impl KvStore for PingFails {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        self.inner.list(prefix).await
    }
    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        self.inner.keys(prefix, separator).await
    }
    async fn current_index(&self, probe: &str) -> StoreResult<Option<u64>> {
        self.inner.current_index(probe).await
    }
    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        self.inner.put(key, value, cas).await
    }
    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        self.inner.delete(key, cas).await
    }
    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        self.inner.delete_prefix(prefix).await
    }
    fn key_prefix_len(&self) -> usize {
        self.inner.key_prefix_len()
    }
    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        self.inner.txn(ops).await
    }
    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String> {
        self.inner.create_session(spec).await
    }
    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo> {
        self.inner.renew_session(id).await
    }
    async fn destroy_session(&self, id: &str) -> StoreResult<()> {
        self.inner.destroy_session(id).await
    }
    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>> {
        self.inner.session_info(id).await
    }
    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool> {
        self.inner.acquire(key, value, session).await
    }
    async fn release(&self, key: &str, session: &str) -> StoreResult<bool> {
        self.inner.release(key, session).await
    }
    async fn watch(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Listing> {
        self.inner.watch(target, index, wait).await
    }
    async fn ping(&self) -> StoreResult<()> {
        Err(StoreError::Unavailable(PING_FAILURE.into()))
    }
}

/// One plain HTTP/1.1 GET; the whole response as text.
fn http_get(addr: &str, path: &str) -> String {
    let mut conn = TcpStream::connect(addr).unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    response
}

fn header_value(response: &str, name: &str) -> Option<String> {
    response.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

// A hung store: every request answers 503 within its deadline.

/// The index of [`Frozen`]'s empty store, which never changes.
const FROZEN_INDEX: u64 = 5;

/// A store that stops answering, as a frozen Consul does (its port open, its process
/// stopped): every call waits forever, except, when asked, the reads of an empty store and
/// watches that run their course.
#[derive(Clone, Copy)]
struct Frozen {
    reads: bool,
    watches: bool,
}

impl Frozen {
    const EVERYTHING: Frozen = Frozen {
        reads: false,
        watches: false,
    };

    async fn read<T>(&self, empty: T) -> StoreResult<T> {
        if !self.reads {
            std::future::pending::<()>().await;
        }
        Ok(empty)
    }
}

#[async_trait]
impl KvStore for Frozen {
    async fn get(&self, _: &str) -> StoreResult<Option<KvPair>> {
        self.read(None).await
    }
    async fn list(&self, _: &str) -> StoreResult<Listing> {
        self.read(Listing {
            index: FROZEN_INDEX,
            pairs: Vec::new(),
        })
        .await
    }
    async fn keys(&self, _: &str, _: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        self.read((FROZEN_INDEX, Vec::new())).await
    }
    async fn current_index(&self, _: &str) -> StoreResult<Option<u64>> {
        self.read(Some(FROZEN_INDEX)).await
    }
    async fn put(&self, _: &str, _: &[u8], _: Cas) -> StoreResult<()> {
        std::future::pending().await
    }
    async fn delete(&self, _: &str, _: Cas) -> StoreResult<()> {
        std::future::pending().await
    }
    async fn delete_prefix(&self, _: &str) -> StoreResult<()> {
        std::future::pending().await
    }
    fn key_prefix_len(&self) -> usize {
        0
    }
    async fn txn(&self, _: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        std::future::pending().await
    }
    async fn create_session(&self, _: &SessionSpec) -> StoreResult<String> {
        std::future::pending().await
    }
    async fn renew_session(&self, _: &str) -> StoreResult<SessionInfo> {
        std::future::pending().await
    }
    async fn destroy_session(&self, _: &str) -> StoreResult<()> {
        std::future::pending().await
    }
    async fn session_info(&self, _: &str) -> StoreResult<Option<SessionInfo>> {
        std::future::pending().await
    }
    async fn acquire(&self, _: &str, _: &[u8], _: &str) -> StoreResult<bool> {
        std::future::pending().await
    }
    async fn release(&self, _: &str, _: &str) -> StoreResult<bool> {
        std::future::pending().await
    }
    async fn watch(&self, _: &WatchTarget, index: u64, wait: Duration) -> StoreResult<Listing> {
        if !self.watches {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(wait).await;
        Ok(Listing {
            index,
            pairs: Vec::new(),
        })
    }
    async fn ping(&self) -> StoreResult<()> {
        std::future::pending().await
    }
}

/// The real router over `store` with the default limits.
fn router_over(store: impl KvStore) -> Router {
    router::build(App::new(Arc::new(store)))
}

/// A PUT of `node`'s labels: a read, then a write. Each test names a node no other test
/// writes: updates of one object take turns across the whole test binary, and with time
/// paused, waiting for another test's turn passes the contention deadline at once.
fn put_node_labels(node: &str) -> Request<Body> {
    let mut request = post_json(
        &format!("/api/v1/labels/node/{node}"),
        r#"{"labels": {"role": "web"}}"#,
    );
    *request.method_mut() = axum::http::Method::PUT;
    request
}

// Time is paused: the deadlines pass as soon as nothing else can happen, whatever they are.
#[tokio::test(start_paused = true)]
async fn a_read_from_a_hung_store_answers_503_store_timeout() {
    let routes = router_over(Frozen::EVERYTHING);
    for uri in ["/api/v1/rcs", "/api/v1/labels/node/node1"] {
        let request = Request::get(uri).body(Body::empty()).unwrap();
        let response = call(&routes, request).await;
        assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE, "{uri}");
        assert_eq!(response.error().reason, "StoreTimeout", "{uri}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_write_cut_by_the_deadline_answers_503_outcome_unknown() {
    let response = call(
        &router_over(Frozen::EVERYTHING),
        put_node_labels("hung-write"),
    )
    .await;
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    let error = response.error();
    assert_eq!(error.reason, "OutcomeUnknown");
    assert!(error.message.contains("re-read"), "{error:?}");
}

/// A write of an object waits for the turn of an earlier write of it, which the hung store
/// never answers: it is told the store is not answering, not that the object kept changing.
#[tokio::test(start_paused = true)]
async fn a_write_waiting_behind_one_the_store_never_answers_answers_503() {
    let routes = router_over(Frozen::EVERYTHING);
    let (first, second) = tokio::join!(
        call(&routes, put_node_labels("hung-twice")),
        call(&routes, put_node_labels("hung-twice")),
    );
    for response in [first, second] {
        assert_eq!(
            response.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{response:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn readyz_reports_not_ready_while_the_store_hangs() {
    let routes = router_over(Frozen::EVERYTHING);
    let response = call(
        &routes,
        Request::get("/readyz").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    let error = response.error();
    assert_eq!(error.reason, "StoreTimeout");
    assert!(error.message.contains("store not ready"), "{error:?}");
    let response = call(
        &routes,
        Request::get("/healthz").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_blocking_query_gets_its_wait_on_top_of_the_deadline() {
    // A wait of a minute, far past the 10s deadline: the query runs its course.
    let quiet = Frozen {
        reads: true,
        watches: true,
    };
    let uri = format!("/api/v1/rcs?index={FROZEN_INDEX}&wait=1m");
    let blocking = || Request::get(&uri).body(Body::empty()).unwrap();
    let response = call(&router_over(quiet), blocking()).await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    assert_eq!(response.x_index(), FROZEN_INDEX);

    // A watch that never ends is still cut, once the wait and the deadline have passed.
    let hung_watches = Frozen {
        reads: true,
        watches: false,
    };
    let response = call(&router_over(hung_watches), blocking()).await;
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.error().reason, "StoreTimeout");
}

/// Limits short enough for tests that run on the real clock.
fn short_limits() -> HttpLimits {
    HttpLimits {
        request_timeout: Duration::from_millis(200),
        readiness_timeout: Duration::from_millis(200),
        header_read_timeout: Duration::from_millis(200),
        body_read_timeout: Duration::from_millis(200),
        ..HttpLimits::default()
    }
}

/// The real router over `store` with [`short_limits`].
fn router_with_short_limits(store: Arc<dyn KvStore>) -> Router {
    router::build(Arc::new(App {
        mirror: Mirror::new(store.clone(), MirrorConfig::default()),
        store_reads: SharedListings::wrap(store.clone()),
        store,
        shutdown: CancellationToken::new(),
        limits: short_limits(),
        validation: Default::default(),
        access: Default::default(),
        answers: Default::default(),
    }))
}

fn consul_at(base_url: String) -> ConsulStore {
    ConsulStore::new(ConsulConfig {
        base_url,
        token: None,
        datacenter: None,
    })
    .unwrap()
}

#[tokio::test]
async fn a_frozen_consul_answers_503_within_the_deadline() {
    // Bound but never accepting: the kernel completes the connection, nobody answers.
    let frozen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let store = consul_at(format!("http://{}", frozen.local_addr().unwrap()));
    let routes = router_with_short_limits(Arc::new(store));
    for uri in ["/readyz", "/api/v1/rcs"] {
        let response = call(&routes, Request::get(uri).body(Body::empty()).unwrap()).await;
        assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE, "{uri}");
        assert_eq!(response.error().reason, "StoreTimeout", "{uri}");
    }
    let response = call(&routes, put_node_labels("cut-write")).await;
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.error().reason, "OutcomeUnknown");
}

/// A write the embedded store's writer never took into a transaction, because another
/// process held the file's write lock past the request's deadline, is withdrawn: the answer
/// is a retryable 503, not `OutcomeUnknown`, and the write never lands once the lock is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_never_taken_before_the_deadline_is_withdrawn_and_retryable() {
    use sqlx::{Connection, Executor};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.db").display().to_string();
    let sqlite = p2_apiserver::kv::sqlite::SqliteStore::open(&path);
    let store: Arc<dyn KvStore> = Arc::new(sqlite.await.unwrap());
    let routes = router_with_short_limits(store.clone());
    let before = store.list("").await.unwrap();
    // Another process holding the file's write lock, as `sqlite3` in `BEGIN IMMEDIATE` does.
    let other = sqlx::SqliteConnection::connect(&format!("sqlite://{path}"));
    let mut other = other.await.unwrap();
    other.execute("BEGIN IMMEDIATE").await.unwrap();

    let started = Instant::now();
    let response = call(&routes, put_node_labels("locked-out")).await;
    assert!(started.elapsed() < Duration::from_secs(5), "{response:?}");
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_ne!(response.error().reason, "OutcomeUnknown", "{response:?}");
    assert_eq!(response.header("retry-after"), Some("1"), "{response:?}");

    other.execute("COMMIT").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let keys = |listing: Listing| -> Vec<String> {
        listing.pairs.into_iter().map(|pair| pair.key).collect()
    };
    let after = store.list("").await.unwrap();
    assert_eq!(keys(after), keys(before), "the withdrawn write landed");
}

/// A write still waiting for a connection to Consul when the request's deadline passes was
/// never sent: it is withdrawn, and the answer is a retryable 503 `StoreTimeout`, as for a
/// write the embedded store's writer never took.
#[tokio::test]
async fn a_write_queued_for_a_connection_to_consul_is_withdrawn_and_retryable_at_its_deadline() {
    // Reads are answered (a little late); writes never are.
    let consul = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path_regex("^/v1/kv/"))
        .respond_with(
            ResponseTemplate::new(404)
                .insert_header("X-Consul-Index", "7")
                .set_delay(Duration::from_millis(100)),
        )
        .mount(&consul)
        .await;
    Mock::given(method("PUT"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(600)))
        .mount(&consul)
        .await;
    let store = Arc::new(consul_at(consul.uri()));
    let received = |method: &'static str, count: usize| {
        let consul = &consul;
        async move {
            while consul
                .received_requests()
                .await
                .unwrap()
                .iter()
                .filter(|r| r.method.as_str() == method)
                .count()
                < count
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let hang = |i: usize| {
        let store = store.clone();
        tokio::spawn(async move { store.put(&format!("hung/{i}"), b"", Cas::Any).await })
    };
    // Hung writes hold all but one of the connections the budget (128 by default) keeps for
    // anything but blocking watches and session renewals: half of it, less one.
    for i in 0..62 {
        hang(i);
    }
    received("PUT", 62).await;
    let routes = router_with_short_limits(store.clone());

    // The request's read takes the last connection; one more hung write queues behind it
    // and takes the connection the read lets go, so the request's write queues in turn.
    let response = tokio::spawn(async move { call(&routes, put_node_labels("queued")).await });
    received("GET", 1).await;
    hang(62);
    let response = response.await.unwrap();

    // Never sent, so the client may simply retry.
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.error().reason, "StoreTimeout", "{response:?}");
    assert_eq!(response.header("retry-after"), Some("1"), "{response:?}");
    let sent = consul.received_requests().await.unwrap();
    let reads = sent.iter().filter(|r| r.method.as_str() == "GET").count();
    assert_eq!(reads, 1, "the request's read was sent");
    let writes = sent.iter().filter(|r| r.method.as_str() == "PUT").count();
    assert_eq!(writes, 63, "only the hung writes were sent");
}

#[tokio::test]
async fn a_write_whose_answer_consul_lost_answers_503_outcome_unknown() {
    let consul = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path_regex("^/v1/kv/"))
        .respond_with(ResponseTemplate::new(404).insert_header("X-Consul-Index", "7"))
        .mount(&consul)
        .await;
    // The transaction went out; its answer never came back.
    Mock::given(method("PUT"))
        .and(path("/v1/txn"))
        .respond_with_err(|_: &wiremock::Request| {
            std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection dropped")
        })
        .expect(1)
        .mount(&consul)
        .await;

    let response = call(
        &router_over(consul_at(consul.uri())),
        put_node_labels("consul-write"),
    )
    .await;

    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    let error = response.error();
    assert_eq!(error.reason, "OutcomeUnknown");
    assert!(error.message.contains("re-read"), "{error:?}");
    // The client is told to re-read, not a retry; nothing was sent again.
    let sent = consul.received_requests().await.unwrap();
    assert_eq!(
        sent.iter().filter(|r| r.method.as_str() == "PUT").count(),
        1
    );
}

/// Consul committed the transaction (200) but its answer cannot be read (a proxy's page, a
/// body cut short by one): what it wrote is not known, so the write is not reported as the
/// store being unavailable, which would invite a blind retry.
#[tokio::test]
async fn a_write_whose_committed_answer_is_unreadable_answers_503_outcome_unknown() {
    let consul = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path_regex("^/v1/kv/"))
        .respond_with(ResponseTemplate::new(404).insert_header("X-Consul-Index", "7"))
        .mount(&consul)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/txn"))
        .respond_with(ResponseTemplate::new(200).set_body_string("<html>bad gateway</html>"))
        .expect(1)
        .mount(&consul)
        .await;

    let response = call(
        &router_over(consul_at(consul.uri())),
        put_node_labels("consul-unreadable"),
    )
    .await;

    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    let error = response.error();
    assert_eq!(error.reason, "OutcomeUnknown", "{error:?}");
}

// Connections: the real server on a real socket.

/// How long a test waits for the server to answer or close before calling it hung. Far
/// longer than any limit the tests set, so only a server that never acts reaches it.
const HANG: Duration = Duration::from_secs(30);

/// The server on a free port over a hung store, with `limits`; stops when the token is
/// cancelled (or the test's runtime ends).
async fn serve(limits: HttpLimits) -> (SocketAddr, CancellationToken) {
    let (addr, shutdown, _) = serving(limits).await;
    (addr, shutdown)
}

/// [`serve`], with the server's task, which ends when the server has stopped.
async fn serving(
    limits: HttpLimits,
) -> (
    SocketAddr,
    CancellationToken,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let store: Arc<dyn KvStore> = Arc::new(Frozen::EVERYTHING);
    let app = Arc::new(App {
        mirror: Mirror::new(store.clone(), MirrorConfig::default()),
        store_reads: SharedListings::wrap(store.clone()),
        store,
        shutdown: shutdown.clone(),
        limits,
        validation: Default::default(),
        access: Default::default(),
        answers: Default::default(),
    });
    let served = tokio::spawn(server::run(
        listener,
        app,
        shutdown.clone().cancelled_owned(),
    ));
    (addr, shutdown, served)
}

/// Everything the server sends until it closes the connection.
async fn read_until_closed(conn: &mut tokio::net::TcpStream) -> String {
    let mut received = Vec::new();
    let read = tokio::time::timeout(HANG, conn.read_to_end(&mut received))
        .await
        .expect("the server left the connection open");
    // A reset also closes it; what came before still counts.
    if let Err(e) = read {
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    }
    String::from_utf8(received).unwrap()
}

/// One response: its status line's code and its body, read by Content-Length.
async fn read_response(conn: &mut tokio::net::TcpStream) -> (u16, String) {
    let mut received = Vec::new();
    let mut buf = [0; 4096];
    loop {
        let text = String::from_utf8_lossy(&received).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize =
                header_value(head, "content-length").map_or(0, |l| l.parse().unwrap());
            if body.len() >= length {
                let code = head.split(' ').nth(1).unwrap().parse().unwrap();
                return (code, body[..length].to_owned());
            }
        }
        let n = tokio::time::timeout(HANG, conn.read(&mut buf))
            .await
            .expect("the server never answered")
            .unwrap();
        assert!(n > 0, "closed before a whole response: {text:?}");
        received.extend_from_slice(&buf[..n]);
    }
}

/// The reason of a JSON error body.
fn reason_of(body: &str) -> String {
    let error: p2_apiserver::error::ErrorBody = serde_json::from_str(body).unwrap();
    error.reason
}

async fn connect(addr: SocketAddr) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(addr).await.unwrap()
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n";

#[tokio::test]
async fn silent_and_slow_header_connections_are_closed() {
    let (addr, _shutdown) = serve(short_limits()).await;
    let mut silent = connect(addr).await;
    assert_eq!(read_until_closed(&mut silent).await, "");
    let mut slow = connect(addr).await;
    slow.write_all(b"GET /healthz HT").await.unwrap();
    assert_eq!(read_until_closed(&mut slow).await, "");
}

#[tokio::test]
async fn idle_kept_alive_connections_are_closed() {
    let (addr, _shutdown) = serve(short_limits()).await;
    let mut conn = connect(addr).await;
    conn.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut conn).await.0, 200);
    // Kept alive after the answer, then closed for want of a next request.
    assert_eq!(read_until_closed(&mut conn).await, "");
}

#[tokio::test]
async fn a_trickling_body_is_cut_with_408() {
    let (addr, _shutdown) = serve(short_limits()).await;
    let mut conn = connect(addr).await;
    conn.write_all(
        b"PUT /api/v1/labels/node/node1 HTTP/1.1\r\nHost: test\r\n\
          Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
    )
    .await
    .unwrap();
    let (mut reader, mut writer) = conn.into_split();
    // One byte every 20ms: each arrives well within the body timeout, the whole never does.
    let trickle = tokio::spawn(async move {
        for _ in 0..999 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if writer.write_all(b" ").await.is_err() {
                break;
            }
        }
    });
    let mut received = Vec::new();
    let mut buf = [0; 4096];
    while !String::from_utf8_lossy(&received).contains('}') {
        let n = tokio::time::timeout(HANG, reader.read(&mut buf))
            .await
            .expect("the server kept reading the trickle")
            .unwrap();
        assert!(n > 0, "closed without an answer");
        received.extend_from_slice(&buf[..n]);
    }
    trickle.abort();
    let text = String::from_utf8(received).unwrap();
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(reason_of(body), "RequestTimeout");
}

#[tokio::test]
async fn past_the_connection_cap_a_connection_is_answered_503_at_once() {
    let limits = HttpLimits {
        max_connections: 2,
        // Long enough that the held connections stay for the whole test.
        header_read_timeout: Duration::from_secs(600),
        ..HttpLimits::default()
    };
    let (addr, _shutdown) = serve(limits).await;
    // The process's counter, which other tests' servers may raise too, but never lower.
    let refused = || {
        Metrics::parse(&p2_apiserver::metrics::render())
            .value(HTTP_CONNECTIONS_REFUSED, &[])
            .expect("shown from the start")
    };
    let refused_before = refused();
    let first = connect(addr).await;
    let mut second = connect(addr).await;
    // Answered, so both are surely being served before the next one arrives.
    second.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut second).await.0, 200);

    let mut third = connect(addr).await;
    let answer = read_until_closed(&mut third).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(reason_of(body), "ServiceUnavailable");
    assert!(refused() > refused_before, "the refusal was not counted");

    // Once a slot frees, /healthz answers again.
    drop(first);
    let mut attempts = 0;
    loop {
        let mut conn = connect(addr).await;
        conn.write_all(HEALTHZ).await.unwrap();
        if read_response(&mut conn).await.0 == 200 {
            break;
        }
        attempts += 1;
        assert!(attempts < 100, "the freed slot was never reused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn oversized_request_heads_get_the_json_error_body() {
    let (addr, _shutdown) = serve(HttpLimits::default()).await;
    let long_target = format!(
        "GET /healthz?pad={} HTTP/1.1\r\nHost: test\r\n\r\n",
        "a".repeat(MAX_URI_BYTES)
    );
    let big_header = format!(
        "GET /healthz HTTP/1.1\r\nHost: test\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(MAX_HEADER_BYTES)
    );
    let many_headers = format!(
        "GET /healthz HTTP/1.1\r\nHost: test\r\n{}\r\n",
        (0..MAX_HEADERS)
            .map(|i| format!("X-Pad-{i}: a\r\n"))
            .collect::<String>()
    );
    for (request, code, reason) in [
        (long_target, 414, "URITooLong"),
        (big_header, 431, "RequestHeaderFieldsTooLarge"),
        (many_headers, 431, "RequestHeaderFieldsTooLarge"),
    ] {
        let mut conn = connect(addr).await;
        conn.write_all(request.as_bytes()).await.unwrap();
        let (status, body) = read_response(&mut conn).await;
        assert_eq!((status, reason_of(&body).as_str()), (code, reason));
    }
    // Just within the limits, the request reaches its route, which names the parameter it
    // does not take (the store is frozen here, so only a probe can answer at all).
    let within = format!(
        "GET /healthz?pad={} HTTP/1.1\r\nHost: test\r\n\r\n",
        "a".repeat(MAX_URI_BYTES - "/healthz?pad=".len())
    );
    let mut conn = connect(addr).await;
    conn.write_all(within.as_bytes()).await.unwrap();
    let (status, body) = read_response(&mut conn).await;
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, &body["causes"][0]["field"]), (400, &json!("pad")));
}

#[tokio::test]
async fn a_malformed_request_is_refused_with_the_json_body_and_closed() {
    let (addr, _shutdown) = serve(HttpLimits::default()).await;
    for (request, status) in [
        (&b"NOT AN HTTP REQUEST\r\n\r\n"[..], "400"),
        (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
            "400",
        ),
        (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",
            "400",
        ),
    ] {
        let mut conn = connect(addr).await;
        conn.write_all(request).await.unwrap();
        let answer = read_until_closed(&mut conn).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{answer}"
        );
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        let body: serde_json::Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("not a JSON body ({e}): {answer}"));
        assert_eq!(body["code"], status.parse::<u16>().unwrap(), "{answer}");
        assert!(body["message"].as_str().is_some(), "{answer}");
    }
    // A malformed request after a well-formed one on a kept-alive connection too.
    let mut conn = connect(addr).await;
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nNOT HTTP\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut conn).await;
    let (first, second) = answer.split_once("HTTP/1.1 400").expect(&answer);
    assert!(first.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(second.contains("\"code\":400"), "{answer}");
}

#[tokio::test]
async fn a_request_head_past_the_http_layers_limit_gets_431_with_the_json_body() {
    let (addr, _shutdown) = serve(HttpLimits::default()).await;
    let mut conn = connect(addr).await;
    let mut request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..2000 {
        request.extend_from_slice(format!("X-Filler-{i}: {}\r\n", "v".repeat(40)).as_bytes());
    }
    request.extend_from_slice(b"\r\n");
    // The server may answer and close before it has read everything we send.
    let _ = conn.write_all(&request).await;
    let answer = read_until_closed(&mut conn).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(answer.contains("\"code\":431"), "{answer}");
}

#[tokio::test]
async fn a_client_that_never_reads_its_answers_is_cut_off() {
    let limits = HttpLimits {
        max_connections: 1,
        ..short_limits()
    };
    let (addr, shutdown, served) = serving(limits).await;

    // Asks for far more than the sockets' buffers hold, and reads none of it.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut deaf = socket.connect(addr).await.unwrap();
    let big = b"GET /openapi.json HTTP/1.1\r\nHost: test\r\n\r\n".repeat(400);
    deaf.write_all(&big).await.unwrap();

    // Its slot frees once the server gives up on it.
    let deadline = Instant::now() + HANG;
    loop {
        let mut conn = connect(addr).await;
        conn.write_all(HEALTHZ).await.unwrap();
        if read_response(&mut conn).await.0 == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a client that reads nothing keeps its connection"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nor does it hold up a graceful stop.
    deaf.write_all(&big).await.ok();
    shutdown.cancel();
    tokio::time::timeout(HANG, served)
        .await
        .expect("the server waited on a client that reads nothing")
        .unwrap()
        .unwrap();
    drop(deaf);
}

/// A body sent with a content coding is refused with 415, naming the coding and giving
/// `Accept-Encoding: identity`, and writes nothing: read as JSON, a compressed body was
/// refused as malformed, and an uncompressed one labelled `gzip` was taken. The document
/// gives that 415 on every operation with a body. `identity` is no coding.
#[tokio::test]
async fn a_body_with_a_content_coding_is_refused() {
    let app = TestApp::new().await;
    let spec = json!({"manifest": "id: hello\nlaunchables: {}\n", "node_selector": "",
        "replicas_desired": 1});
    for coding in ["gzip", "identity, br"] {
        let refused = app
            .json_request(
                "POST",
                "/api/v1/rcs",
                Some(&spec),
                &[("content-encoding", coding)],
            )
            .await;
        assert_eq!(
            refused.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{refused:?}"
        );
        assert_eq!(refused.header("accept-encoding"), Some("identity"));
        assert!(refused
            .error()
            .message
            .contains(coding.trim_start_matches("identity, ")));
    }
    assert_eq!(
        app.keys("replication_controllers/").await,
        Vec::<String>::new()
    );
    let taken = app
        .json_request(
            "POST",
            "/api/v1/rcs",
            Some(&spec),
            &[("content-encoding", "identity")],
        )
        .await;
    assert_eq!(taken.status, StatusCode::CREATED, "{taken:?}");

    let doc = app.get("/openapi.json").await.json();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if operation.get("requestBody").is_some() {
                let refused = &operation["responses"]["415"]["description"];
                let refused = refused.as_str().unwrap_or_default();
                assert!(
                    refused.contains("content coding"),
                    "{method} {path}: {refused:?}"
                );
            }
        }
    }
}

/// A body sent without the media type its route takes (as `curl -d` sends a form's) is 415
/// saying which type to send and which was sent, on JSON and merge-patch routes alike.
#[tokio::test]
async fn a_body_of_another_media_type_names_what_to_send() {
    let app = TestApp::new().await;
    let body = r#"{"manifest": "id: hello\n"}"#;
    for (method, path, content_type, message) in [
        (
            "POST",
            "/api/v1/rcs",
            Some("application/x-www-form-urlencoded"),
            "the body must be sent as application/json; got application/x-www-form-urlencoded",
        ),
        (
            "POST",
            "/api/v1/rcs",
            None,
            "the body must be sent as application/json; got no Content-Type",
        ),
        (
            "PATCH",
            "/api/v1/daemonsets/5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11",
            Some("text/plain"),
            "a patch must be sent as application/merge-patch+json or application/json; got text/plain",
        ),
    ] {
        let headers: Vec<(&str, &str)> = content_type
            .map(|value| ("content-type", value))
            .into_iter()
            .collect();
        let response = app.send_raw(method, path, &headers, body).await;
        assert_eq!(
            response.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{path}: {response:?}"
        );
        assert_eq!(response.error().message, message, "{path}");
    }
    assert_eq!(app.dump().await, []);
}
