//! `/metrics` scraped and read with a Prometheus text parser, and `/version`.
//!
//! The metrics are the process's, shared by every test of this binary, and others run beside
//! these: so each test looks at what its own requests add to counters (which only grow),
//! under labels its requests decide. The end-to-end tests check the gauges of a server alone
//! in its process.

use std::process::Command;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use p2_apiserver::app::HttpLimits;
use p2_apiserver::kv::{Cas, StoreError, TxnOp};
use p2_apiserver::metrics::WriterStage;
use p2_apiserver::model::timestamp::format_rfc3339;

use crate::support::api::{backend, TestApp};
use crate::support::scrape::Metrics;

const HTTP: &str = "p2_http_request_duration_seconds";
const STORE: &str = "p2_store_operation_duration_seconds";
const SSE: &str = "p2_sse_clients";
const WRITER: &str = "p2_sqlite_writer_stage_duration_seconds";
const ROWS_WRITTEN: &str = "p2_sqlite_rows_written_total";

/// The app's `/metrics`, parsed.
pub(crate) async fn scrape(app: &TestApp) -> Metrics {
    let response = app.get("/metrics").await;
    assert_eq!(response.status, StatusCode::OK, "{response:?}");
    assert_eq!(
        response.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    Metrics::parse(std::str::from_utf8(&response.body).expect("UTF-8"))
}

#[tokio::test]
async fn requests_are_counted_by_route_template_method_and_status() {
    let app = TestApp::new().await;
    let id = uuid::Uuid::new_v4().to_string();
    let before = scrape(&app).await;
    for _ in 0..3 {
        let response = app.get(&format!("/api/v1/rcs/{id}")).await;
        assert_eq!(response.status, StatusCode::NOT_FOUND);
    }
    let response = app.get(&format!("/nowhere/{id}")).await;
    assert_eq!(response.status, StatusCode::NOT_FOUND);
    let after = scrape(&app).await;

    let rc = [
        ("route", "/api/v1/rcs/{id}"),
        ("method", "GET"),
        ("status", "404"),
    ];
    assert!(after.count(HTTP, &rc) - before.count(HTTP, &rc) >= 3.0);
    // A histogram: cumulative buckets up to +Inf, which holds every request.
    let buckets = after.buckets(HTTP, &rc);
    assert!(buckets.len() > 10, "{buckets:?}");
    assert!(buckets.windows(2).all(|w| w[0].count <= w[1].count));
    let last = buckets.last().unwrap();
    assert!(last.le.is_infinite(), "{buckets:?}");
    // Reads served from memory take tens of microseconds: the buckets tell them apart.
    assert!(buckets[0].le <= 0.0001, "{buckets:?}");
    assert_eq!(last.count, after.count(HTTP, &rc));
    assert!(after.help(HTTP).is_some());

    // A path no route takes is counted under one label, never as itself.
    let unmatched = [("route", "unmatched"), ("method", "GET"), ("status", "404")];
    assert!(after.count(HTTP, &unmatched) - before.count(HTTP, &unmatched) >= 1.0);
    let routes = after.label_values("route");
    assert!(
        routes.iter().all(|route| !route.contains(&id)),
        "{routes:?}"
    );
}

#[tokio::test]
async fn store_operations_are_counted_by_backend_operation_and_outcome() {
    let app = TestApp::new().await;
    let key = format!("metrics-test/{}", uuid::Uuid::new_v4());
    let before = scrape(&app).await;
    app.store.put(&key, b"1", Cas::Index(0)).await.unwrap();
    let refused = app.store.put(&key, b"2", Cas::Index(0)).await;
    assert!(
        matches!(refused, Err(StoreError::Conflict { .. })),
        "{refused:?}"
    );
    // The API's own reads go through the same measured store.
    let response = app.get("/api/v1/leader").await;
    assert_eq!(response.status, StatusCode::NOT_FOUND);
    let after = scrape(&app).await;

    for (operation, outcome) in [("put", "ok"), ("put", "conflict"), ("get", "ok")] {
        let labels = [
            ("backend", backend()),
            ("operation", operation),
            ("outcome", outcome),
        ];
        let added = after.count(STORE, &labels) - before.count(STORE, &labels);
        assert!(added >= 1.0, "{labels:?}: {added}");
        assert!(!after.buckets(STORE, &labels).is_empty(), "{labels:?}");
    }
}

/// An operation given up before the store answers (a request cut by its deadline, a farm
/// pass given up as its term ends) is counted as `abandoned`: under a store that does not
/// answer, that is every operation, and the histogram would otherwise show no sign of it.
#[tokio::test]
async fn store_operations_given_up_before_the_store_answers_are_counted_as_abandoned() {
    use p2_apiserver::kv::metered::Metered;

    let app = TestApp::new().await;
    let stalled = crate::support::severable::Severable::new(app.store.clone());
    stalled.stall_txns();
    // A backend label of its own: other tests of this binary add nothing under it.
    let store = Metered::wrap(stalled.clone(), "stalled");
    let labels = [
        ("backend", "stalled"),
        ("operation", "txn"),
        ("outcome", "abandoned"),
    ];
    let before = scrape(&app).await;
    let ops = [TxnOp::Set {
        key: format!("metrics-test/{}", uuid::Uuid::new_v4()),
        value: b"1".to_vec(),
    }];
    let cut = tokio::time::timeout(Duration::from_millis(50), store.txn(&ops)).await;
    assert!(cut.is_err(), "{cut:?}");
    let after = scrape(&app).await;
    assert_eq!(
        after.count(STORE, &labels) - before.count(STORE, &labels),
        1.0
    );
    stalled.mend();
}

#[tokio::test]
async fn the_embedded_stores_writer_is_timed_by_stage_and_counts_its_rows() {
    let app = TestApp::new().await;
    let before = scrape(&app).await;
    let ops: Vec<TxnOp> = (0..3)
        .map(|i| TxnOp::Set {
            key: format!("metrics-test/{}/{i}", uuid::Uuid::new_v4()),
            value: b"1".to_vec(),
        })
        .collect();
    app.store.txn(&ops).await.unwrap();
    let after = scrape(&app).await;

    if backend() == "consul" {
        // Consul writes for itself; the embedded writer has nothing to say.
        return;
    }
    let rows = |metrics: &Metrics| metrics.value(ROWS_WRITTEN, &[]).unwrap_or(0.0);
    let written = rows(&after) - rows(&before);
    assert!(written >= 3.0, "{written}");
    for stage in WriterStage::ALL {
        let labels = [("stage", stage.label())];
        let added = after.count(WRITER, &labels) - before.count(WRITER, &labels);
        assert!(added >= 1.0, "{stage:?}: {added}");
    }
    assert!(after.help(WRITER).is_some());
    assert!(after.help(ROWS_WRITTEN).is_some());
}

/// A request whose client hangs up before its answer is counted as it ends, under status
/// `499` (as nginx logs it): a blocking query dropped by its client, as a client's own
/// timeout drops it, would otherwise show in no series at all.
#[tokio::test]
async fn requests_whose_client_hangs_up_are_counted_as_499() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let app = TestApp::new().await;
    let served = app.serve(None, HttpLimits::default()).await;
    let hung_up = [
        ("route", "/api/v1/daemonsets"),
        ("method", "GET"),
        ("status", "499"),
    ];
    let mut index = app.get("/api/v1/daemonsets").await.x_index();
    // Held by the blocking query, then given up. Whether the server had begun it when the
    // client left cannot be seen from outside (on a loaded machine it may not have read the
    // request yet, or have just answered it), so it is tried again until one is counted, a
    // few times at most. An answer may claim less than the change it shows until every
    // tree's watch has listed past it, and a read blocked there is answered at once, at a
    // newer index: the next try blocks at that one.
    for _ in 0..5 {
        let before = scrape(&app).await;
        let mut client = tokio::net::TcpStream::connect(served.addr).await.unwrap();
        let request =
            format!("GET /api/v1/daemonsets?index={index}&wait=5m HTTP/1.1\r\nHost: test\r\n\r\n");
        client.write_all(request.as_bytes()).await.unwrap();
        let mut head = vec![0; 8192];
        if let Ok(read) =
            tokio::time::timeout(Duration::from_millis(200), client.read(&mut head)).await
        {
            let head = String::from_utf8_lossy(&head[..read.unwrap()]).to_ascii_lowercase();
            index = head
                .lines()
                .find_map(|line| line.strip_prefix("x-index:"))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or_else(|| panic!("an answer without X-Index: {head}"));
            continue;
        }
        drop(client);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::time::Instant::now() < deadline {
            let added = scrape(&app).await.count(HTTP, &hung_up) - before.count(HTTP, &hung_up);
            if added >= 1.0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    panic!("no hung-up request was counted in five tries");
}

/// A request whose handler panics is the server's fault: answered and counted as a 500,
/// never as the client's 499.
#[tokio::test]
async fn requests_whose_handler_panics_are_counted_as_500() {
    use tower::ServiceExt;

    let app = TestApp::new().await;
    let routes = axum::Router::new().route(
        "/test/panics",
        axum::routing::get(|| async { panic!("a handler's bug") as &'static str }),
    );
    let router = p2_apiserver::router::with_middleware(routes, HttpLimits::default());
    let labels = |status| {
        [
            ("route", "/test/panics"),
            ("method", "GET"),
            ("status", status),
        ]
    };
    let before = scrape(&app).await;
    let request = Request::get("/test/panics").body(Body::empty()).unwrap();
    let handled = tokio::spawn(router.oneshot(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(handled.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let after = scrape(&app).await;
    let added = |status| after.count(HTTP, &labels(status)) - before.count(HTTP, &labels(status));
    assert_eq!((added("500"), added("499")), (1.0, 0.0));
}

#[tokio::test]
async fn change_stream_clients_are_counted_while_connected() {
    let app = TestApp::new().await;
    let request = Request::get("/api/v1/watch").body(Body::empty()).unwrap();
    let stream = app.open(request).await;
    assert_eq!(stream.status(), StatusCode::OK);
    let clients = scrape(&app).await.value(SSE, &[]);
    assert!(clients.is_some_and(|clients| clients >= 1.0), "{clients:?}");
    drop(stream);
}

#[tokio::test]
async fn version_names_the_crate_commit_and_build_time() {
    let app = TestApp::new().await;
    let version = app.get("/version").await.json();
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"));
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8(output.stdout).unwrap().trim().to_owned());
    assert_eq!(version["git_commit"], head.as_deref().unwrap_or("unknown"));
    // Whole seconds in UTC, so it compares as text with the time now.
    let built = version["build_time"].as_str().unwrap();
    let since_epoch = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap();
    let now = format_rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(since_epoch.as_secs()));
    assert_eq!(built.len(), now.len(), "{built}");
    assert!(
        built.ends_with('Z') && built > "2024" && built <= now.as_str(),
        "{built}"
    );

    let info = scrape(&app).await.value(
        "p2_build_info",
        &[
            ("version", env!("CARGO_PKG_VERSION")),
            ("git_commit", version["git_commit"].as_str().unwrap()),
        ],
    );
    assert_eq!(info, Some(1.0));
}
