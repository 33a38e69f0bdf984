//! The metrics of a leading server alone in its process, scraped over HTTP and read with a
//! Prometheus text parser: leadership, the farms, the mirror, the store and the change
//! stream's clients.

use crate::scenarios::{create_rc, rc_settles};
use crate::support::e2e::{eventually, labels, Api, Scratch, Server, Sim, CONVERGE};
use crate::support::scrape::Metrics;

async fn scrape(api: &Api) -> Metrics {
    let response = reqwest::get(format!("{}/metrics", api.base))
        .await
        .expect("GET /metrics");
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    Metrics::parse(&response.text().await.expect("the metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leading_server_reports_its_farms_mirror_store_and_clients() {
    let scratch = Scratch::new();
    let server = Server::start("solo", &scratch.db(), &[]);
    let api = server.api();
    let _web = Sim::start(&api, "web", 3, labels(&[("role", "web")])).await;
    let rc = create_rc(&api, 1, "role=web", 2, "static_strategy").await;
    rc_settles(&api, &rc, 2, 1).await;

    let rc_farm = [("farm", "rc")];
    let metrics = eventually(
        "the RC farm to own the RC, with nothing to retry",
        CONVERGE,
        || async {
            let metrics = scrape(&api).await;
            let owned = metrics.value("p2_farm_owned_objects", &rc_farm);
            let waiting = metrics.value("p2_farm_queue_depth", &rc_farm);
            if owned == Some(1.0) && waiting == Some(0.0) {
                Ok(metrics)
            } else {
                Err(format!("owned {owned:?}, waiting {waiting:?}"))
            }
        },
    )
    .await;
    assert_eq!(metrics.value("p2_leader_is_leader", &[]), Some(1.0));
    assert_eq!(metrics.value("p2_leader_terms_total", &[]), Some(1.0));
    assert!(metrics.count("p2_farm_reconcile_duration_seconds", &rc_farm) >= 1.0);
    assert!(metrics.value("p2_farm_errors_total", &rc_farm).is_some());
    // The daemon-set farm owns nothing here; the stale-lock farm never owns anything.
    assert_eq!(
        metrics.value("p2_farm_owned_objects", &[("farm", "ds")]),
        Some(0.0)
    );
    assert_eq!(
        metrics.value("p2_farm_owned_objects", &[("farm", "stale-locks")]),
        None
    );
    // The farms' writes, in transactions on the SQLite store.
    let txns = [
        ("backend", "sqlite"),
        ("operation", "txn"),
        ("outcome", "ok"),
    ];
    assert!(metrics.count("p2_store_operation_duration_seconds", &txns) >= 1.0);
    // Every tree is followed, none behind.
    let trees = metrics.label_values("tree");
    assert!(
        trees.iter().any(|tree| tree == "replication_controllers/"),
        "{trees:?}"
    );
    for tree in &trees {
        assert_eq!(
            metrics.value("p2_mirror_lag_seconds", &[("tree", tree)]),
            Some(0.0),
            "{tree}"
        );
    }

    // The change stream's clients, counted while connected: the simulator, which follows
    // its pods through the stream, and one more.
    assert_eq!(metrics.value("p2_sse_clients", &[]), Some(1.0));
    let stream = reqwest::get(format!("{}/api/v1/watch", api.base))
        .await
        .expect("GET /api/v1/watch");
    assert_eq!(stream.status(), reqwest::StatusCode::OK);
    assert_eq!(scrape(&api).await.value("p2_sse_clients", &[]), Some(2.0));
    drop(stream);
    eventually("the stream's client to be gone", CONVERGE, || async {
        match scrape(&api).await.value("p2_sse_clients", &[]) {
            Some(1.0) => Ok(()),
            clients => Err(format!("{clients:?}")),
        }
    })
    .await;
}

/// The embedded store's rows written count only rows of batches that committed: a batch
/// whose commit fails (here a trigger refusing to record its index) wrote none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_a_batch_rolled_back_are_not_counted_as_written() {
    use reqwest::{Method, StatusCode};
    use sqlx::{Connection, Executor};
    const ROWS: &str = "p2_sqlite_rows_written_total";
    let scratch = Scratch::new();
    let server = Server::start("solo", &scratch.db(), &[]);
    let api = server.api();
    let rows = |metrics: Metrics| metrics.value(ROWS, &[]).unwrap_or(0.0);
    let body = serde_json::json!({ "labels": { "role": "web" } });
    let put_labels = |node: &'static str| {
        let (api, body) = (api.clone(), body.clone());
        async move {
            let path = format!("/api/v1/labels/node/{node}");
            api.send(Method::PUT, &path, Some(&body)).await
        }
    };
    let (status, answer) = put_labels("before").await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    let db = format!("sqlite://{}", scratch.db().display());
    let mut other = sqlx::SqliteConnection::connect(&db).await.unwrap();
    other
        .execute(
            "CREATE TRIGGER refuse_commits BEFORE UPDATE ON meta WHEN NEW.name = 'last_index'
             BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
        .await
        .unwrap();
    let before = rows(scrape(&api).await);
    let (status, answer) = put_labels("refused").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(rows(scrape(&api).await), before, "rows of a failed batch");

    other.execute("DROP TRIGGER refuse_commits").await.unwrap();
    let (status, answer) = put_labels("after").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(rows(scrape(&api).await) > before);
}
