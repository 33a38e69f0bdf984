//! What every route shares: probes, JSON errors, request ids, the body limit, and the
//! binary's start and graceful stop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use p2_apiserver::api::extract::{ApiJson, ApiPath, ApiQuery};
use p2_apiserver::kv::{
    Cas, KvPair, KvStore, Listing, SessionInfo, SessionSpec, StoreError, StoreResult, TxnOp,
    WatchTarget,
};
use p2_apiserver::router::{self, MAX_BODY_BYTES};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::support::api::{call, TestApp};

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
    let ids: Vec<&str> = [&first, &second]
        .iter()
        .map(|r| r.header("x-request-id").expect("a request id"))
        .collect();
    for id in &ids {
        uuid::Uuid::parse_str(id).expect("a UUID");
    }
    assert_ne!(ids[0], ids[1]);
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
    #[derive(Deserialize)]
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
    router::with_middleware(routes)
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
        store
            .get(p2_apiserver::store::layout::LEADER_LOCK)
            .await
            .unwrap()
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
    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        self.inner.put(key, value, cas).await
    }
    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        self.inner.delete(key, cas).await
    }
    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        self.inner.delete_prefix(prefix).await
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
