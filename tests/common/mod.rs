//! An in-process server over a temporary SQLite store, driven without a socket.

// Each test crate uses its own subset of these helpers.
#![allow(dead_code)]

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use p2_apiserver::app::App;
use p2_apiserver::error::ErrorBody;
use p2_apiserver::router;
use p2_apiserver::store::sqlite::SqliteStore;
use p2_apiserver::store::KvStore;
use tempfile::TempDir;
use tower::ServiceExt;

/// The real router over a store in a temporary file that lives as long as the app.
pub struct TestApp {
    router: Router,
    /// The store the router uses, for arranging and checking state behind the API's back.
    pub store: Arc<dyn KvStore>,
    _dir: TempDir,
}

impl TestApp {
    /// A fresh app over an empty SQLite store.
    pub async fn new() -> Self {
        Self::wrapping(|store| store).await
    }

    /// A fresh app whose store is `wrap` applied to an empty SQLite store; for injecting
    /// failures while keeping real storage underneath.
    pub async fn wrapping(wrap: impl FnOnce(Arc<dyn KvStore>) -> Arc<dyn KvStore>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("p2.db");
        let sqlite = SqliteStore::open(path.to_str().expect("utf-8 temp path"))
            .await
            .expect("open sqlite store");
        let store = wrap(Arc::new(sqlite));
        TestApp {
            router: router::build(App::new(store.clone())),
            store,
            _dir: dir,
        }
    }

    /// Sends one request through the whole router, middleware included.
    pub async fn send(&self, request: Request<Body>) -> TestResponse {
        call(&self.router, request).await
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> TestResponse {
        self.send(Request::get(path).body(Body::empty()).unwrap())
            .await
    }
}

/// Sends one request to any router, e.g. a test-only one wrapped with
/// `router::with_middleware`.
pub async fn call(router: &Router, request: Request<Body>) -> TestResponse {
    let response = router.clone().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    TestResponse {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("read body").to_bytes(),
    }
}

/// A response read to the end.
#[derive(Debug)]
pub struct TestResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl TestResponse {
    /// The body as JSON, checking the content type says so.
    pub fn json(&self) -> serde_json::Value {
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "{self:?}"
        );
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// The body as the API's error shape, checking its code matches the status.
    pub fn error(&self) -> ErrorBody {
        let body: ErrorBody = serde_json::from_value(self.json()).expect("an error body");
        assert_eq!(body.code, self.status.as_u16(), "{body:?}");
        body
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("text header"))
    }
}

/// Requests with a body and headers, for the write routes.
impl TestApp {
    /// `method path` with `body` sent as `application/json` and the extra `headers`.
    pub async fn send_json(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
    ) -> TestResponse {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.send_raw(method, path, &all, body.to_string()).await
    }

    /// `method path` with a body sent exactly as given (headers include any content type),
    /// for malformed and mislabeled bodies.
    pub async fn send_raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Body>,
    ) -> TestResponse {
        let mut request = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request.body(body.into()).unwrap()).await
    }
}

/// A request with extra headers and, optionally, a JSON body sent with the given content
/// type (such as `application/json` or `application/merge-patch+json`).
pub fn request_with(
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<(&str, &serde_json::Value)>,
) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    match body {
        Some((content_type, json)) => builder
            .header("content-type", content_type)
            .body(Body::from(json.to_string())),
        None => builder.body(Body::empty()),
    }
    .expect("a valid test request")
}

impl TestApp {
    /// `method path` with an optional JSON body (sent as `application/json` unless
    /// `headers` name another content type) and extra headers.
    pub async fn json_request(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
        headers: &[(&str, &str)],
    ) -> TestResponse {
        let mut request = Request::builder().method(method).uri(path);
        if body.is_some()
            && !headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        {
            request = request.header("content-type", "application/json");
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        self.send(request.body(body).unwrap()).await
    }

    /// Every key in the store with its value as text, to check that a request wrote nothing.
    pub async fn dump(&self) -> Vec<(String, String)> {
        let listing = self.store.list("").await.expect("list the store");
        listing
            .pairs
            .into_iter()
            .map(|p| (p.key, String::from_utf8_lossy(&p.value).into_owned()))
            .collect()
    }
}
