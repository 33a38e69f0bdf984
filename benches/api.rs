//! API read benchmark on the embedded store: an in-process server on 127.0.0.1 and a load
//! generator in the same process, 64 connections, each figure measured for a bounded time
//! and printed beside a reference measured in the same run.
//!
//! `cargo bench --bench api` reports requests per second, p50 and p99 of:
//! - `GET /healthz` (the reference: no store, no mirror);
//! - `GET /api/v1/rcs/{id}` with 100 RCs of 10 pods, as a ratio to `/healthz` (the two
//!   measured in turns);
//! - `GET /api/v1/rcs` (100 RCs with status), as a ratio to `/healthz`;
//! - `PATCH /api/v1/rcs/{id}` (a CAS read-modify-write, durable), each connection patching
//!   an RC of its own, as a ratio to `/healthz`;
//! - the same PATCH of one hot RC by 16 connections at once: every request must succeed;
//! - `GET /api/v1/watch?kinds=rcs` (Server-Sent Events): 1,000 watchers of every RC on one
//!   server while RCs are patched 50 times a second; how many changes each watcher missed
//!   and the delay from sending a PATCH to each watcher receiving its change, beside the
//!   PATCH's own round trip in the same run;
//! - `GET /api/v1/rcs/{id}` with a large fleet (10,000 RCs of 10 pods over 10,000 nodes by
//!   default), as a ratio to the same GET with 100 RCs measured again in turns with it;
//! - `GET /api/v1/pods?node=` (one node's pods with their health) in that large fleet, as a
//!   ratio to the same listing in the small one, measured in turns with it;
//! - `GET /api/v1/pods?pod_id=` (one pod id's ten pods, on ten nodes) likewise;
//! - `GET /api/v1/rolls/{id}` (a roll over two of the fleet's RCs, with their pods' progress)
//!   in that large fleet, as a ratio to the same read in the small one, measured in turns
//!   with it;
//! - `GET /api/v1/events?kind=rcs&id=` (one RC's events, its creation's among the fleet's
//!   one event per RC) in that large fleet, as a ratio to GET one RC of the same fleet
//!   measured in turns with it;
//! - writes of one object in either fleet in turns, each connection writing one of its own
//!   (the same ones in both fleets), each write a change with its event: `PUT
//!   /api/v1/health/{pod_id}/{node}`, `PUT /api/v1/labels/pod/{node}/{pod_id}` and `PATCH
//!   /api/v1/rcs/{id}`, the large fleet's as a ratio to the small one's;
//! - with `CONSUL_HTTP_ADDR` set (and `CONSUL_HTTP_TOKEN` if the agent needs one): GET one
//!   RC (100 RCs) from a server on that Consul, as a ratio to a raw Consul KV GET of the
//!   same key.
//!
//! Sizes and durations can be changed:
//! `cargo bench --bench api -- --secs 5 --connections 64 --watchers 100 --large-rcs 1000`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use p2_apiserver::app::{App, HttpLimits};
use p2_apiserver::kv::consul::{ConsulConfig, ConsulStore};
use p2_apiserver::kv::prefixed::Prefixed;
use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{KvStore, TxnOp, MAX_TXN_OPS};
use p2_apiserver::layout;
use p2_apiserver::server;
use p2_apiserver::state::{Mirror, MirrorConfig};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[path = "support/rss.rs"]
mod rss;
use rss::rss_mib;

/// The allocator the server binary runs with (`src/main.rs`), with the same purge delay
/// (`p2_apiserver::allocator`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Pods per RC, as in the issue's figures.
const PODS_PER_RC: usize = 10;
/// RCs of the small fleet.
const SMALL_RCS: usize = 100;

struct Args {
    secs: u64,
    connections: usize,
    large_rcs: usize,
    watchers: usize,
}

impl Args {
    fn parse() -> Args {
        let mut args = Args {
            secs: 5,
            connections: 64,
            large_rcs: 10_000,
            watchers: 1_000,
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
                "--watchers" => args.watchers = value() as usize,
                // `cargo bench` passes `--bench`.
                _ => {}
            }
        }
        args
    }
}

/// A server over a fresh store holding `rcs` RCs of [`PODS_PER_RC`] pods each and a roll
/// between the last two, its mirror loaded; stopped when dropped.
struct Served {
    base: String,
    store: Arc<dyn KvStore>,
    first_rc: String,
    /// The RCs no roll names, which can be patched.
    rcs: Vec<String>,
    /// The roll's id (its new RC's).
    roll: String,
    stop: CancellationToken,
    _dir: Option<tempfile::TempDir>,
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
    serve_on(store, rcs, Some(dir)).await
}

/// [`serve`] on `store`; `dir` (where the store lives, if anywhere) is kept as long.
async fn serve_on(store: Arc<dyn KvStore>, rcs: usize, dir: Option<tempfile::TempDir>) -> Served {
    let nodes = rcs.max(1_000);
    let started = Instant::now();
    let mut ids = populate(store.as_ref(), rcs, nodes).await;
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
    let limits = HttpLimits {
        // Room for the change stream's watchers.
        max_connections: 4_096,
        ..Default::default()
    };
    let state = App::serving(
        store.clone(),
        mirror,
        stop.clone(),
        limits,
        Default::default(),
        Default::default(),
    );
    tokio::spawn(server::run(listener, state, stop.clone().cancelled_owned()));
    println!(
        "  fleet: {rcs} RCs x {PODS_PER_RC} pods over {nodes} nodes (written in {:.1}s, mirrored in {:.1}s)",
        populated.as_secs_f64(),
        (started.elapsed() - populated).as_secs_f64()
    );
    let roll = ids.pop().unwrap();
    ids.pop();
    Served {
        base,
        store,
        first_rc: ids[0].clone(),
        rcs: ids,
        roll,
        stop,
        _dir: dir,
    }
}

/// Writes `rcs` RCs, their labels and their creations' events, and their pods' intents and
/// labels, as the RC farm would leave them, a passing health result for each pod, and a
/// roll from the last but one RC to the last (`rcs` must be at least 2), as P2 writes it.
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
            ops.push(TxnOp::Set {
                key: format!("intent/node{node}/app{r}"),
                value: format!("id: app{r}\nlaunchables: {{}}\n").into_bytes(),
            });
            ops.push(set(
                format!("health/app{r}/node{node}"),
                serde_json::json!({"Id": format!("app{r}"), "Node": format!("node{node}"),
                    "Service": format!("app{r}"), "Status": "passing",
                    "Time": "2026-12-05T00:00:00Z", "Expires": "2126-12-05T00:00:00Z"}),
            ));
        }
        // Its creation's event, as the server records it.
        let event = format!("{:020}-{r:08x}", 1_764_892_800_000_000_000u64 + r as u64);
        ops.push(set(
            layout::event(&event),
            serde_json::json!({"id": event, "time": "2025-12-05T00:00:00Z",
            "actor": "anonymous", "action": "created", "kind": "rcs", "object_id": id,
            "request_id": null, "changes": [
                created("allocation_strategy", "dynamic_strategy".into()),
                created("disabled", false.into()),
                created("manifest", format!("sha256:{:064x}", r).into()),
                created("node_selector", "".into()),
                created("pod_labels", serde_json::json!({})),
                created("replicas_desired", PODS_PER_RC.into()),
            ]}),
        ));
        ids.push(id);
    }
    if let [.., old, new] = ids.as_slice() {
        ops.push(set(
            format!("rolls/{new}"),
            serde_json::json!({"OldRC": old, "NewRC": new, "DesiredReplicas": PODS_PER_RC,
                "MinimumReplicas": PODS_PER_RC / 2, "LeaveOld": false, "RollDelay": 0}),
        ));
    }
    for batch in ops.chunks(MAX_TXN_OPS) {
        store.txn(batch).await.unwrap();
    }
    ids
}

/// An event's change of `field` from nothing to `after`, as a creation's event holds it.
fn created(field: &str, after: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"field": field, "before": null, "after": after})
}

fn set(key: String, value: serde_json::Value) -> TxnOp {
    TxnOp::Set {
        key,
        value: value.to_string().into_bytes(),
    }
}

/// With `CONSUL_HTTP_ADDR` set: GET one RC from a server on that Consul (its fleet written
/// under a prefix of its own, deleted afterwards), beside a raw Consul KV GET of the same key.
async fn measure_consul(connections: usize, secs: u64) {
    let Some(config) = ConsulConfig::from_env() else {
        println!("GET one RC on Consul: skipped, CONSUL_HTTP_ADDR is not set");
        return;
    };
    let config = config.unwrap_or_else(|why| panic!("{why}"));
    let agent = config.base_url.clone();
    let token = config.token.clone();
    let consul: Arc<dyn KvStore> = Arc::new(ConsulStore::new(config).unwrap());
    let prefix = format!("p2-apiserver-bench/{}/", uuid::Uuid::new_v4());
    let store = Arc::new(Prefixed::new(consul.clone(), prefix.clone()).unwrap());
    let served = serve_on(store, SMALL_RCS, None).await;
    let key = format!("{prefix}replication_controllers/{}", served.first_rc);
    let raw_url = format!("{agent}/v1/kv/{key}");
    let token = token.map(|token| ("X-Consul-Token", token));
    let rc_url = format!("{}/api/v1/rcs/{}", served.base, served.first_rc);
    let [raw, one] = measure_alternately(
        [(&raw_url, token.as_slice()), (&rc_url, &[])],
        connections,
        secs,
    )
    .await;
    report("raw Consul KV GET of one RC (reference)", &raw, None);
    report(
        "GET one RC on Consul (100 RCs)",
        &one,
        Some(("raw Consul KV GET", &raw)),
    );
    drop(served);
    consul.delete_prefix(&prefix).await.unwrap();
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
    measure_get(url, &[], connections, Duration::from_secs(secs))
        .await
        .figure()
}

/// How many turns each of the GETs [`measure_alternately`] compares gets.
const TURNS: u32 = 3;

/// Each of `gets` (a URL and the headers to send) as [`measure_get`] sends it, in turns of
/// `secs / TURNS` each, so that a figure and its reference see the same changes in the speed
/// of a shared machine.
async fn measure_alternately<const N: usize>(
    gets: [(&str, &[(&'static str, String)]); N],
    connections: usize,
    secs: u64,
) -> [Figure; N] {
    let turn = Duration::from_secs(secs) / TURNS;
    let mut samples: [Samples; N] = std::array::from_fn(|_| Samples::default());
    for _ in 0..TURNS {
        for ((url, headers), samples) in gets.iter().zip(&mut samples) {
            samples.add(measure_get(url, headers, connections, turn).await);
        }
    }
    samples.map(Samples::figure)
}

/// `connections` clients each sending `GET url` with `headers` back to back for `time`, each
/// on an HTTP/1.1 connection of its own through hyper's connection API: no pool to check
/// out from and no URL to parse per request, so that the load generator, which shares the
/// machine's cores with the server, takes as little of them as it can.
async fn measure_get(
    url: &str,
    headers: &[(&'static str, String)],
    connections: usize,
    time: Duration,
) -> Samples {
    let url: hyper::Uri = url.parse().unwrap();
    assert_eq!(
        url.scheme_str(),
        Some("http"),
        "the load generator speaks plain HTTP"
    );
    let authority = url.authority().unwrap().to_string();
    let mut sent_headers = hyper::HeaderMap::new();
    sent_headers.insert(hyper::header::HOST, authority.parse().unwrap());
    for (name, value) in headers {
        sent_headers.insert(*name, value.parse().unwrap());
    }
    // Sent in origin form, as a client does to a server: the path and query alone.
    let origin: hyper::Uri = url.path_and_query().unwrap().as_str().parse().unwrap();
    let request = Arc::new((origin, sent_headers));
    // Opens the connections, each answering one request, before the clock starts.
    let mut senders = Vec::new();
    for _ in 0..connections {
        let stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(connection);
        assert!(get(&mut sender, &request).await, "GET {url} failed");
        senders.push(sender);
    }
    let started = Instant::now();
    let deadline = started + time;
    let workers: Vec<_> = senders
        .into_iter()
        .map(|mut sender| {
            let request = request.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut failed = 0;
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    if !get(&mut sender, &request).await {
                        failed += 1;
                    }
                    latencies.push(sent.elapsed());
                }
                (latencies, failed)
            })
        })
        .collect();
    gather(workers, started).await
}

/// Sends a GET of `(uri, headers)` on `sender`'s connection and reads the whole answer:
/// whether it was a success.
async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<http_body_util::Empty<hyper::body::Bytes>>,
    (uri, headers): &(hyper::Uri, hyper::HeaderMap),
) -> bool {
    use http_body_util::BodyExt;
    let mut sent = hyper::Request::new(http_body_util::Empty::new());
    *sent.uri_mut() = uri.clone();
    *sent.headers_mut() = headers.clone();
    if sender.ready().await.is_err() {
        return false;
    }
    match sender.send_request(sent).await {
        Ok(response) => {
            let success = response.status().is_success();
            response.into_body().collect().await.is_ok() && success
        }
        Err(_) => false,
    }
}

/// `connections` clients each sending the request `request` makes (given the client's
/// number) back to back for `secs`.
async fn measure_with(
    connections: usize,
    secs: u64,
    request: impl Fn(&reqwest::Client, usize) -> reqwest::RequestBuilder + Send + Sync + 'static,
) -> Figure {
    send_back_to_back(connections, Duration::from_secs(secs), Arc::new(request))
        .await
        .figure()
}

/// Each of `requests` as [`measure_with`] sends it, in turns of `secs / TURNS` each, as
/// [`measure_alternately`] measures GETs.
async fn measure_with_alternately<const N: usize, F>(
    requests: [F; N],
    connections: usize,
    secs: u64,
) -> [Figure; N]
where
    F: Fn(&reqwest::Client, usize) -> reqwest::RequestBuilder + Send + Sync + 'static,
{
    let requests = requests.map(Arc::new);
    let turn = Duration::from_secs(secs) / TURNS;
    let mut samples: [Samples; N] = std::array::from_fn(|_| Samples::default());
    for _ in 0..TURNS {
        for (request, samples) in requests.iter().zip(&mut samples) {
            samples.add(send_back_to_back(connections, turn, request.clone()).await);
        }
    }
    samples.map(Samples::figure)
}

/// `connections` clients each sending the request `request` makes (given the client's
/// number) back to back for `time`.
async fn send_back_to_back<F>(connections: usize, time: Duration, request: Arc<F>) -> Samples
where
    F: Fn(&reqwest::Client, usize) -> reqwest::RequestBuilder + Send + Sync + 'static,
{
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .build()
        .unwrap();
    // Opens the connections before the clock starts.
    let warm: Vec<_> = (0..connections)
        .map(|worker| {
            let (client, request) = (client.clone(), request.clone());
            tokio::spawn(
                async move { request(&client, worker).send().await.unwrap().bytes().await },
            )
        })
        .collect();
    for warm in warm {
        warm.await.unwrap().unwrap();
    }
    let started = Instant::now();
    let deadline = started + time;
    let workers: Vec<_> = (0..connections)
        .map(|worker| {
            let (client, request) = (client.clone(), request.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut failed = 0;
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    match request(&client, worker).send().await {
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
    gather(workers, started).await
}

/// The requests the `workers` started at `started` made.
async fn gather(
    workers: Vec<tokio::task::JoinHandle<(Vec<Duration>, usize)>>,
    started: Instant,
) -> Samples {
    let mut latencies = Vec::new();
    let mut failed = 0;
    for worker in workers {
        let (mine, my_failed) = worker.await.unwrap();
        latencies.extend(mine);
        failed += my_failed;
    }
    Samples {
        latencies,
        failed,
        elapsed: started.elapsed(),
    }
}

/// Requests measured: how long each took, how many failed, and over how long.
#[derive(Default)]
struct Samples {
    latencies: Vec<Duration>,
    failed: usize,
    elapsed: Duration,
}

impl Samples {
    fn add(&mut self, more: Samples) {
        self.latencies.extend(more.latencies);
        self.failed += more.failed;
        self.elapsed += more.elapsed;
    }

    /// The figure of these requests.
    fn figure(self) -> Figure {
        let Samples {
            mut latencies,
            failed,
            elapsed,
        } = self;
        latencies.sort_unstable();
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
        Figure {
            per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
            p50: at(0.50),
            p99: at(0.99),
            failed,
        }
    }
}

/// A PATCH of RC `id`'s replica count, as a merge patch: to a value no PATCH before it in
/// the last thousand set, so that each one changes the RC.
fn patch_rc(client: &reqwest::Client, base: &str, id: &str) -> reqwest::RequestBuilder {
    static TURN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let replicas = 1 + TURN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 1_000;
    client
        .patch(format!("{base}/api/v1/rcs/{id}"))
        .header("content-type", "application/merge-patch+json")
        .body(format!(r#"{{"replicas_desired":{replicas}}}"#))
}

/// A PUT of the health of RC `rc`'s first pod (`app<rc>` on `node<rc * PODS_PER_RC>`, the
/// same pod in either fleet), its status flipped from what the pod's last PUT from this
/// process sent, so that each one is a change with its event.
fn put_health(
    client: &reqwest::Client,
    base: &str,
    rc: usize,
    turns: &[std::sync::atomic::AtomicU64],
) -> reqwest::RequestBuilder {
    let turn = turns[rc].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let status = if turn.is_multiple_of(2) {
        "critical"
    } else {
        "passing"
    };
    let node = rc * PODS_PER_RC;
    client
        .put(format!("{base}/api/v1/health/app{rc}/node{node}"))
        .json(&serde_json::json!({ "status": status }))
}

/// A PUT replacing the labels of RC `rc`'s first pod (as [`put_health`] names it) with its
/// RC's and pod id's and a label no PUT before it from this process set, so that each one
/// is a change with its event.
fn put_pod_labels(
    client: &reqwest::Client,
    base: &str,
    (rc, rc_id): (usize, &str),
    turns: &[std::sync::atomic::AtomicU64],
) -> reqwest::RequestBuilder {
    let turn = turns[rc].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let node = rc * PODS_PER_RC;
    client
        .put(format!("{base}/api/v1/labels/pod/node{node}/app{rc}"))
        .json(&serde_json::json!({ "labels": {
            "replication_controller_id": rc_id,
            "pod_id": format!("app{rc}"),
            "turn": turn.to_string(),
        }}))
}

/// `writers` tasks each writing its own key back to back for `secs`, every write a CAS on
/// the index it last wrote: what the store's durable commits sustain without HTTP.
async fn measure_store_cas(store: &Arc<dyn KvStore>, writers: usize, secs: u64) -> Figure {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = format!("bench/cas/{writer}");
                let (mut index, mut latencies, mut failed) = (0, Vec::new(), 0);
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    let ops = [TxnOp::Cas {
                        key: key.clone(),
                        value: b"x".to_vec(),
                        index,
                    }];
                    match store.txn(&ops).await {
                        Ok(results) => index = results[0].as_ref().map_or(0, |p| p.modify_index),
                        Err(_) => failed += 1,
                    }
                    latencies.push(sent.elapsed());
                }
                (latencies, failed)
            })
        })
        .collect();
    gather(tasks, started).await.figure()
}

/// Changes per second the change-stream figure makes.
const CHANGES_PER_SECOND: u64 = 50;

/// `watchers` clients on `GET /api/v1/watch?kinds=rcs` while one writer patches the RCs
/// [`CHANGES_PER_SECOND`] times a second for `secs`: prints how many changes the watchers
/// missed and the delay from sending each PATCH to each watcher receiving its change, beside
/// the PATCH round trip.
async fn measure_watch(served: &Served, watchers: usize, secs: u64) {
    let client = reqwest::Client::new();
    let url = format!("{}/api/v1/watch?kinds=rcs", served.base);
    let stop = CancellationToken::new();
    let (synced_tx, mut synced_rx) = tokio::sync::mpsc::channel::<()>(watchers);
    let tasks: Vec<_> = (0..watchers)
        .map(|_| {
            let (client, url, stop, synced) =
                (client.clone(), url.clone(), stop.clone(), synced_tx.clone());
            tokio::spawn(async move { watch_changes(&client, &url, &stop, &synced).await })
        })
        .collect();
    drop(synced_tx);
    for _ in 0..watchers {
        synced_rx
            .recv()
            .await
            .expect("a watcher failed before its snapshot");
    }

    // index of each change -> when its PATCH was sent
    let mut sent = std::collections::HashMap::new();
    let mut round_trips = Vec::new();
    // Every change is written after this index. A patch setting the value an RC already holds
    // changes nothing, and its answer carries the RC's older index: it is sent again with the
    // next value, so that each turn makes one change.
    let mut newest = client
        .get(format!("{}/api/v1/rcs/{}", served.base, served.rcs[0]))
        .send()
        .await
        .unwrap()
        .headers()["x-index"]
        .to_str()
        .unwrap()
        .parse::<u64>()
        .unwrap();
    let mut tick = tokio::time::interval(Duration::from_millis(1_000 / CHANGES_PER_SECOND));
    for turn in 0..secs * CHANGES_PER_SECOND {
        tick.tick().await;
        let id = &served.rcs[turn as usize % served.rcs.len()];
        let started = Instant::now();
        let index = loop {
            let response = patch_rc(&client, &served.base, id).send().await.unwrap();
            assert!(response.status().is_success(), "{}", response.status());
            let etag = response.headers()["etag"]
                .to_str()
                .unwrap()
                .trim_matches('"');
            let index = etag.parse::<u64>().unwrap();
            if index > newest {
                break index;
            }
        };
        newest = index;
        round_trips.push(started.elapsed());
        sent.insert(index, started);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();

    let mut delays = Vec::new();
    let mut missed = 0;
    for task in tasks {
        let received = task.await.unwrap();
        missed += sent
            .keys()
            .filter(|index| !received.contains_key(*index))
            .count();
        delays.extend(
            received
                .iter()
                .filter_map(|(index, at)| Some(at.duration_since(*sent.get(index)?))),
        );
    }
    let quantiles = |mut values: Vec<Duration>| {
        values.sort_unstable();
        let at = |q: f64| values[((values.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
        format!("p50 {:>6.2} ms  p99 {:>6.2} ms", at(0.5), at(0.99))
    };
    println!(
        "{:<44} {} changes x {watchers} watchers, missed {missed}, delivery {}  (PATCH round trip, reference: {})",
        format!("SSE: {watchers} watchers, {CHANGES_PER_SECOND} changes/s"),
        sent.len(),
        quantiles(delays),
        quantiles(round_trips),
    );
}

/// Follows the change stream at `url` until `stop`, saying on `synced` when its snapshot is
/// in; returns when each `modified` event arrived, by index.
async fn watch_changes(
    client: &reqwest::Client,
    url: &str,
    stop: &CancellationToken,
    synced: &tokio::sync::mpsc::Sender<()>,
) -> std::collections::HashMap<u64, Instant> {
    let mut response = client.get(url).send().await.unwrap();
    assert!(response.status().is_success());
    let mut received = std::collections::HashMap::new();
    let mut buffer = String::new();
    loop {
        let chunk = tokio::select! {
            chunk = response.chunk() => chunk.unwrap(),
            () = stop.cancelled() => return received,
        };
        let Some(chunk) = chunk else {
            return received;
        };
        let at = Instant::now();
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let Some(data) = event.lines().find_map(|line| line.strip_prefix("data:")) else {
                continue;
            };
            let data: serde_json::Value = serde_json::from_str(data.trim()).unwrap();
            match data["type"].as_str() {
                Some("synced") => synced.send(()).await.unwrap(),
                Some("modified") => {
                    received.insert(data["index"].as_u64().unwrap(), at);
                }
                _ => {}
            }
        }
    }
}

/// Reports `what` in the small fleet and in the large one (of `large_rcs` RCs), the large
/// fleet's as a ratio to the small one's.
fn report_fleets(what: &str, large_rcs: usize, [small, large]: &[Figure; 2]) {
    let small_name = format!("{what} ({SMALL_RCS} RCs)");
    report(&small_name, small, None);
    let large_name = format!("{what} ({large_rcs} RCs)");
    report(&large_name, large, Some((&small_name, small)));
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
    p2_apiserver::allocator::start_again_with_allocator_options();
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
        let rc_url = format!("{}/api/v1/rcs/{}", small.base, small.first_rc);
        let healthz_url = format!("{}/healthz", small.base);
        let [healthz, one] =
            measure_alternately([(&healthz_url, &[]), (&rc_url, &[])], c, secs).await;
        report("GET /healthz (reference)", &healthz, None);
        report("GET one RC (100 RCs)", &one, Some(("/healthz", &healthz)));
        let list = measure(&format!("{}/api/v1/rcs", small.base), c, secs).await;
        report(
            "list 100 RCs with status",
            &list,
            Some(("/healthz", &healthz)),
        );
        let (base, rcs) = (small.base.clone(), small.rcs.clone());
        let distinct = measure_with(c, secs, move |client, worker| {
            patch_rc(client, &base, &rcs[worker % rcs.len()])
        })
        .await;
        report(
            &format!("CAS PATCH distinct RCs ({c} writers)"),
            &distinct,
            Some(("/healthz", &healthz)),
        );
        let store_cas = measure_store_cas(&small.store, c, secs).await;
        report(
            &format!("CAS txn distinct keys, store only ({c} writers)"),
            &store_cas,
            Some(("/healthz", &healthz)),
        );
        let (base, hot) = (small.base.clone(), small.first_rc.clone());
        let contended =
            measure_with(16, secs, move |client, _| patch_rc(client, &base, &hot)).await;
        report(
            "CAS PATCH one hot RC (16 writers)",
            &contended,
            Some(("/healthz", &healthz)),
        );
        measure_watch(&small, args.watchers, secs).await;

        println!(
            "RSS of the process before the large fleet: {:.0} MiB",
            rss_mib().now
        );
        let large = serve(args.large_rcs).await;
        println!(
            "RSS of the process with this fleet mirrored, before its load: {:.0} MiB",
            rss_mib().now
        );
        // The small fleet's GET again, in turns with the large one's.
        let large_url = format!("{}/api/v1/rcs/{}", large.base, large.first_rc);
        let [one, big] = measure_alternately([(&rc_url, &[]), (&large_url, &[])], c, secs).await;
        report("GET one RC (100 RCs), again", &one, None);
        report(
            &format!("GET one RC ({} RCs)", args.large_rcs),
            &big,
            Some(("GET one RC (100 RCs), again", &one)),
        );
        // One node's pods: the small fleet has one on each node, the large ten.
        let node_pods = |served: &Served| format!("{}/api/v1/pods?node=node0", served.base);
        let (small_node, large_node) = (node_pods(&small), node_pods(&large));
        let [small_node, large_node] =
            measure_alternately([(&small_node, &[]), (&large_node, &[])], c, secs).await;
        report("list one node's pods (100 RCs)", &small_node, None);
        report(
            &format!("list one node's pods ({} RCs)", args.large_rcs),
            &large_node,
            Some(("list one node's pods (100 RCs)", &small_node)),
        );
        // One pod id's pods: ten on ten nodes in either fleet.
        let id_pods = |served: &Served| format!("{}/api/v1/pods?pod_id=app0", served.base);
        let (small_id, large_id) = (id_pods(&small), id_pods(&large));
        let [small_id, large_id] =
            measure_alternately([(&small_id, &[]), (&large_id, &[])], c, secs).await;
        report("list one pod id's pods (100 RCs)", &small_id, None);
        report(
            &format!("list one pod id's pods ({} RCs)", args.large_rcs),
            &large_id,
            Some(("list one pod id's pods (100 RCs)", &small_id)),
        );
        // One roll over two RCs of ten pods each, in either fleet.
        let roll = |served: &Served| format!("{}/api/v1/rolls/{}", served.base, served.roll);
        let (small_roll, large_roll) = (roll(&small), roll(&large));
        let [small_roll, large_roll] =
            measure_alternately([(&small_roll, &[]), (&large_roll, &[])], c, secs).await;
        report("GET one roll (100 RCs)", &small_roll, None);
        report(
            &format!("GET one roll ({} RCs)", args.large_rcs),
            &large_roll,
            Some(("GET one roll (100 RCs)", &small_roll)),
        );
        // One RC's events (its creation's) among the fleet's, one per RC, before any write
        // adds more: in turns with GET one RC of the same fleet.
        let (_, events) = large.store.keys(layout::EVENTS, None).await.unwrap();
        let rc_events = format!(
            "{}/api/v1/events?kind=rcs&id={}",
            large.base, large.first_rc
        );
        let [large_one, large_events] =
            measure_alternately([(&large_url, &[]), (&rc_events, &[])], c, secs).await;
        report(
            &format!("GET one RC ({} RCs), again", args.large_rcs),
            &large_one,
            None,
        );
        report(
            &format!("list one RC's events ({} held)", events.len()),
            &large_events,
            Some(("GET one RC", &large_one)),
        );
        // Writes of one object, in either fleet in turns: each connection writes an object
        // of its own among the small fleet's (the same ones in the large fleet).
        let writers = c.min(SMALL_RCS);
        let health = |served: &Served| {
            let base = served.base.clone();
            let turns: Vec<_> = (0..writers).map(|_| Default::default()).collect();
            move |client: &reqwest::Client, worker: usize| {
                put_health(client, &base, worker % writers, &turns)
            }
        };
        let figures =
            measure_with_alternately([health(&small), health(&large)], writers, secs).await;
        report_fleets("PUT one pod's health", args.large_rcs, &figures);
        let pod_labels = |served: &Served| {
            let (base, rcs) = (served.base.clone(), served.rcs.clone());
            let turns: Vec<_> = (0..writers).map(|_| Default::default()).collect();
            move |client: &reqwest::Client, worker: usize| {
                let rc = worker % writers;
                put_pod_labels(client, &base, (rc, &rcs[rc]), &turns)
            }
        };
        let figures =
            measure_with_alternately([pod_labels(&small), pod_labels(&large)], writers, secs).await;
        report_fleets("PUT one pod's labels", args.large_rcs, &figures);
        let patch = |served: &Served| {
            let (base, rcs) = (served.base.clone(), served.rcs.clone());
            move |client: &reqwest::Client, worker: usize| {
                patch_rc(client, &base, &rcs[worker % writers])
            }
        };
        let figures = measure_with_alternately([patch(&small), patch(&large)], writers, secs).await;
        report_fleets("CAS PATCH distinct RCs", args.large_rcs, &figures);
        drop(small);
        let healthz = measure(&format!("{}/healthz", large.base), c, secs).await;
        report("GET /healthz (large fleet, reference)", &healthz, None);
        println!(
            "peak RSS of the process (server, mirror and load generator): {:.0} MiB",
            rss_mib().peak
        );
        drop(large);
        measure_consul(c, secs).await;
    });
}
