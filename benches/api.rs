//! API read benchmark on the embedded store: an in-process server on 127.0.0.1 and a load
//! generator in the same process, 64 connections, each figure measured for a bounded time
//! and printed beside a reference measured in the same run.
//!
//! `cargo bench --bench api` reports requests per second, p50 and p99 of:
//! - `GET /healthz` (the reference: no store, no mirror);
//! - `GET /api/v1/rcs/{id}` with 100 RCs of 10 pods, as a ratio to `/healthz`;
//! - `GET /api/v1/rcs` (100 RCs with status), as a ratio to `/healthz`;
//! - `GET /api/v1/rcs/{id}` with a large fleet (10,000 RCs of 10 pods over 10,000 nodes by
//!   default), as a ratio to the same GET with 100 RCs.
//!
//! Sizes and durations can be changed:
//! `cargo bench --bench api -- --secs 5 --connections 64 --large-rcs 1000`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use p2_apiserver::app::App;
use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{KvStore, TxnOp, MAX_TXN_OPS};
use p2_apiserver::server;
use p2_apiserver::state::{Mirror, MirrorConfig};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Pods per RC, as in the figures.
const PODS_PER_RC: usize = 10;
/// RCs of the small fleet.
const SMALL_RCS: usize = 100;

struct Args {
    secs: u64,
    connections: usize,
    large_rcs: usize,
}

impl Args {
    fn parse() -> Args {
        let mut args = Args {
            secs: 5,
            connections: 64,
            large_rcs: 10_000,
        };
        let mut words = std::env::args().skip(1);
        while let Some(word) = words.next() {
            let mut value = || -> u64 {
                words
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{word} takes a number"))
            };
            match word.as_str() {
                "--secs" => args.secs = value(),
                "--connections" => args.connections = value() as usize,
                "--large-rcs" => args.large_rcs = value() as usize,
                // `cargo bench` passes `--bench`.
                _ => {}
            }
        }
        args
    }
}

/// A server over a fresh store holding `rcs` RCs of [`PODS_PER_RC`] pods each, its mirror
/// loaded; stopped when dropped.
struct Served {
    base: String,
    first_rc: String,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(rcs: usize) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p2.db");
    let store: Arc<dyn KvStore> =
        Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap());
    let nodes = rcs.max(1_000);
    let started = Instant::now();
    let ids = populate(store.as_ref(), rcs, nodes).await;
    let populated = started.elapsed();

    let stop = CancellationToken::new();
    let mirror = Mirror::new(store.clone(), MirrorConfig::default());
    mirror.start(&TaskTracker::new(), stop.clone());
    assert!(
        mirror.wait_for(0, Duration::from_secs(600)).await,
        "the mirror never loaded"
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let state = App::serving(
        store,
        mirror,
        stop.clone(),
        Default::default(),
        Default::default(),
        Default::default(),
    );
    tokio::spawn(server::run(listener, state, stop.clone().cancelled_owned()));
    println!(
        "  fleet: {rcs} RCs x {PODS_PER_RC} pods over {nodes} nodes (written in {:.1}s, mirrored in {:.1}s)",
        populated.as_secs_f64(),
        (started.elapsed() - populated).as_secs_f64()
    );
    Served {
        base,
        first_rc: ids[0].clone(),
        stop,
        _dir: dir,
    }
}

/// Writes `rcs` RCs, their labels and their pods' labels, as the RC farm would leave them.
async fn populate(store: &dyn KvStore, rcs: usize, nodes: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(rcs);
    let mut ops = Vec::new();
    for r in 0..rcs {
        let id = uuid::Uuid::new_v4().to_string();
        let document = serde_json::json!({
            "id": id,
            "manifest": format!("id: app{r}\nlaunchables: {{}}\n"),
            "node_selector": "",
            "pod_labels": {},
            "replicas_desired": PODS_PER_RC,
            "disabled": false,
            "allocation_strategy": "dynamic_strategy",
        });
        ops.push(set(format!("replication_controllers/{id}"), document));
        ops.push(set(
            format!("labels/replication_controller/{id}"),
            serde_json::json!({"pod_id": format!("app{r}")}),
        ));
        for p in 0..PODS_PER_RC {
            let node = (r * PODS_PER_RC + p) % nodes;
            ops.push(set(
                format!("labels/pod/node{node}/app{r}"),
                serde_json::json!({"replication_controller_id": id, "pod_id": format!("app{r}")}),
            ));
        }
        ids.push(id);
    }
    for batch in ops.chunks(MAX_TXN_OPS) {
        store.txn(batch).await.unwrap();
    }
    ids
}

fn set(key: String, value: serde_json::Value) -> TxnOp {
    TxnOp::Set {
        key,
        value: value.to_string().into_bytes(),
    }
}

/// What one figure measured.
struct Figure {
    per_second: f64,
    p50: Duration,
    p99: Duration,
    failed: usize,
}

/// `connections` clients each sending `GET url` back to back for `secs`.
async fn measure(url: &str, connections: usize, secs: u64) -> Figure {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .build()
        .unwrap();
    // Opens the connections before the clock starts.
    let warm: Vec<_> = (0..connections)
        .map(|_| {
            let (client, url) = (client.clone(), url.to_owned());
            tokio::spawn(async move { client.get(&url).send().await.unwrap().bytes().await })
        })
        .collect();
    for warm in warm {
        warm.await.unwrap().unwrap();
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (client, url) = (client.clone(), url.to_owned());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut failed = 0;
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    match client.get(&url).send().await {
                        Ok(response) if response.status().is_success() => {
                            if response.bytes().await.is_err() {
                                failed += 1;
                            }
                        }
                        _ => failed += 1,
                    }
                    latencies.push(sent.elapsed());
                }
                (latencies, failed)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut failed = 0;
    for worker in workers {
        let (mine, my_failed) = worker.await.unwrap();
        latencies.extend(mine);
        failed += my_failed;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    Figure {
        per_second: latencies.len() as f64 / elapsed,
        p50: at(0.50),
        p99: at(0.99),
        failed,
    }
}

fn report(what: &str, figure: &Figure, reference: Option<(&str, &Figure)>) {
    let ratio = reference.map_or_else(String::new, |(name, reference)| {
        format!(
            "  = {:.2}x {name}",
            figure.per_second / reference.per_second
        )
    });
    println!(
        "{what:<44} {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  failed {}{ratio}",
        figure.per_second,
        figure.p50.as_secs_f64() * 1e3,
        figure.p99.as_secs_f64() * 1e3,
        figure.failed,
    );
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (c, secs) = (args.connections, args.secs);
        println!(
            "API reads, embedded store, {c} connections, {secs}s per figure, {} CPUs",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        let small = serve(SMALL_RCS).await;
        let healthz = measure(&format!("{}/healthz", small.base), c, secs).await;
        report("GET /healthz (reference)", &healthz, None);
        let rc_url = format!("{}/api/v1/rcs/{}", small.base, small.first_rc);
        let one = measure(&rc_url, c, secs).await;
        report("GET one RC (100 RCs)", &one, Some(("/healthz", &healthz)));
        let list = measure(&format!("{}/api/v1/rcs", small.base), c, secs).await;
        report(
            "list 100 RCs with status",
            &list,
            Some(("/healthz", &healthz)),
        );
        drop(small);

        let large = serve(args.large_rcs).await;
        let rc_url = format!("{}/api/v1/rcs/{}", large.base, large.first_rc);
        let big = measure(&rc_url, c, secs).await;
        report(
            &format!("GET one RC ({} RCs)", args.large_rcs),
            &big,
            Some(("GET one RC (100 RCs)", &one)),
        );
        let healthz = measure(&format!("{}/healthz", large.base), c, secs).await;
        report("GET /healthz (large fleet, reference)", &healthz, None);
    });
}
