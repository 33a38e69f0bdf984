//! Farm benchmark on the embedded store, with the node simulator.
//!
//! `cargo bench --bench farms` reports:
//! - the time from the farms' start until all 1,000 pods of 100 RCs of 10 replicas exist
//!   on 1,000 simulated nodes (and until all report healthy), and how evenly they spread.
//!   The RCs are created through the API before the farms start (and that time is printed
//!   too), so that the figure is the farms' own: their mirror's first read, the election,
//!   and every pass until the pods exist;
//! - the store requests per second the farms make when nothing changes (the watches of the
//!   mirror they read included), with 100 RCs and again with 10, to show that idle load does
//!   not grow with the number of RCs.
//!
//! Sizes can be changed: `cargo bench --bench farms -- --nodes 200 --rcs 20 --idle 10`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use p2_apiserver::app::App;
use p2_apiserver::farms::{self, alerts::Alerter};
use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{
    Cas, KvPair, KvStore, Listing, PrefixUpdate, SessionBehavior, SessionInfo, SessionSpec,
    StoreResult, TxnOp, WatchTarget,
};
use p2_apiserver::labels::Labels;
use p2_apiserver::leader::{self, LeaderConfig};
use p2_apiserver::server;
use p2_apiserver::simulator::{self, SimulatorConfig};
use p2_apiserver::state::{Mirror, MirrorConfig};
use tokio_util::sync::CancellationToken;

#[path = "support/rss.rs"]
mod rss;
use rss::rss_mib;

/// The allocator the server binary runs with (`src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Counts every call the farms make to the store, by operation.
struct Counting {
    inner: Arc<dyn KvStore>,
    calls: Mutex<HashMap<&'static str, u64>>,
    total: AtomicU64,
}

impl Counting {
    fn count(&self, op: &'static str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        *self.calls.lock().unwrap().entry(op).or_insert(0) += 1;
    }

    fn reset(&self) -> (u64, BTreeMap<&'static str, u64>) {
        let total = self.total.swap(0, Ordering::Relaxed);
        let calls = std::mem::take(&mut *self.calls.lock().unwrap());
        (total, calls.into_iter().collect())
    }
}

#[async_trait]
impl KvStore for Counting {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        self.count("get");
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        self.count("list");
        self.inner.list(prefix).await
    }
    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        self.count("keys");
        self.inner.keys(prefix, separator).await
    }
    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        self.count("put");
        self.inner.put(key, value, cas).await
    }
    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        self.count("delete");
        self.inner.delete(key, cas).await
    }
    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        self.count("delete_prefix");
        self.inner.delete_prefix(prefix).await
    }
    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        self.count("txn");
        self.inner.txn(ops).await
    }
    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String> {
        self.count("create_session");
        self.inner.create_session(spec).await
    }
    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo> {
        self.count("renew_session");
        self.inner.renew_session(id).await
    }
    async fn destroy_session(&self, id: &str) -> StoreResult<()> {
        self.count("destroy_session");
        self.inner.destroy_session(id).await
    }
    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>> {
        self.count("session_info");
        self.inner.session_info(id).await
    }
    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool> {
        self.count("acquire");
        self.inner.acquire(key, value, session).await
    }
    async fn release(&self, key: &str, session: &str) -> StoreResult<bool> {
        self.count("release");
        self.inner.release(key, session).await
    }
    async fn watch(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Listing> {
        self.count("watch");
        self.inner.watch(target, index, wait).await
    }
    async fn watch_changes(
        &self,
        prefix: &str,
        index: u64,
        wait: Duration,
    ) -> StoreResult<PrefixUpdate> {
        self.count("watch");
        self.inner.watch_changes(prefix, index, wait).await
    }
    async fn ping(&self) -> StoreResult<()> {
        self.count("ping");
        self.inner.ping().await
    }
}

struct Sizes {
    nodes: usize,
    rcs: usize,
    replicas: usize,
    idle: Duration,
}

fn sizes() -> Sizes {
    let mut sizes = Sizes {
        nodes: 1000,
        rcs: 100,
        replicas: 10,
        idle: Duration::from_secs(30),
    };
    let args: Vec<String> = std::env::args().collect();
    for pair in args.windows(2) {
        let value = || pair[1].parse::<u64>().expect("a number");
        match pair[0].as_str() {
            "--nodes" => sizes.nodes = value() as usize,
            "--rcs" => sizes.rcs = value() as usize,
            "--replicas" => sizes.replicas = value() as usize,
            "--idle" => sizes.idle = Duration::from_secs(value()),
            _ => {}
        }
    }
    sizes
}

/// Pods by owning RC, and how many are healthy on their intended manifest.
async fn pods(store: &dyn KvStore) -> (usize, usize, usize) {
    let labels = store.list("labels/pod/").await.unwrap();
    let owned: Vec<&KvPair> = labels
        .pairs
        .iter()
        .filter(|p| {
            let labels: Labels = serde_json::from_slice(&p.value).unwrap_or_default();
            labels.contains_key("replication_controller_id")
        })
        .collect();
    let health = store.list("health/").await.unwrap();
    let passing = health
        .pairs
        .iter()
        .filter(|p| String::from_utf8_lossy(&p.value).contains("\"passing\""))
        .count();
    let mut per_node: HashMap<&str, usize> = HashMap::new();
    for pair in &owned {
        let node = pair
            .key
            .trim_start_matches("labels/pod/")
            .split('/')
            .next()
            .unwrap();
        *per_node.entry(node).or_insert(0) += 1;
    }
    (
        owned.len(),
        passing,
        per_node.values().copied().max().unwrap_or(0),
    )
}

async fn wait_for(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

async fn idle_rate(counting: &Counting, idle: Duration) -> (f64, BTreeMap<&'static str, u64>) {
    counting.reset();
    tokio::time::sleep(idle).await;
    let (total, calls) = counting.reset();
    (total as f64 / idle.as_secs_f64(), calls)
}

#[tokio::main]
async fn main() {
    let sizes = sizes();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db").display().to_string();
    let store: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let counting = Arc::new(Counting {
        inner: store.clone(),
        calls: Mutex::default(),
        total: AtomicU64::new(0),
    });
    let shutdown = CancellationToken::new();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let api = App::draining_on(store.clone(), shutdown.clone());
    let server = tokio::spawn(server::run(
        listener,
        api,
        shutdown.clone().cancelled_owned(),
    ));

    let base = format!("http://{addr}");
    let simulation = SimulatorConfig {
        server: base.parse().unwrap(),
        nodes: sizes.nodes,
        labels: Labels::from([("pool".to_string(), "bench".to_string())]),
        unhealthy_fraction: 0.0,
        start_delay: Duration::ZERO,
        name_prefix: "node".into(),
        max_in_flight: 32,
        ca_cert: None,
    };
    let simulator = tokio::spawn(simulator::run(simulation, shutdown.clone()));
    let nodes = wait_for(
        "the simulated nodes",
        Duration::from_secs(120),
        async || store.list("labels/node/").await.unwrap().pairs.len() == sizes.nodes,
    )
    .await;
    println!("{} simulated nodes labelled in {:.2?}", sizes.nodes, nodes);

    let client = reqwest::Client::new();
    let want = sizes.rcs * sizes.replicas;
    // The RCs are created before the farms start, 16 POSTs at a time, so that convergence
    // measures the farms alone.
    let started = Instant::now();
    let posts = (0..sizes.rcs).map(|i| {
        let client = client.clone();
        let base = base.clone();
        async move {
            let manifest = format!(
                "id: app-{i:03}\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/app-{i:03}_1.tar.gz\n"
            );
            let body = serde_json::json!({"manifest": manifest, "node_selector": "pool=bench",
                                          "replicas_desired": sizes.replicas});
            let response = client
                .post(format!("{base}/api/v1/rcs"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 201, "{}", response.text().await.unwrap());
            let rc: serde_json::Value = response.json().await.unwrap();
            rc["id"].as_str().unwrap().to_owned()
        }
    });
    let ids: Vec<String> = futures::stream::iter(posts).buffered(16).collect().await;
    let created = started.elapsed();
    println!("{} RCs created through the API in {created:.2?}", sizes.rcs);

    let started = Instant::now();
    let farm_store: Arc<dyn KvStore> = counting.clone();
    let config = LeaderConfig {
        holder: "bench".into(),
        session_ttl: Duration::from_secs(15),
        lock_delay: Duration::from_secs(5),
        behavior: SessionBehavior::Delete,
    };
    let alerts = Arc::new(Alerter::new(None));
    // The farms' mirror reads through the counting store, so its watches are counted too.
    let mirror = Mirror::new(farm_store.clone(), MirrorConfig::default());
    let mirror_tasks = tokio_util::task::TaskTracker::new();
    mirror.start(&mirror_tasks, shutdown.clone());
    mirror_tasks.close();
    let farms = tokio::spawn(leader::campaign(
        farm_store.clone(),
        config,
        shutdown.clone(),
        move |term| {
            farms::run_term(
                farm_store.clone(),
                mirror.clone(),
                term,
                alerts.clone(),
                "bench".into(),
                farms::FarmOptions::default(),
            )
        },
    ));

    wait_for("every pod", Duration::from_secs(600), async || {
        pods(&*store).await.0 == want
    })
    .await;
    let scheduled = started.elapsed();
    wait_for("every pod healthy", Duration::from_secs(600), async || {
        pods(&*store).await.1 >= want
    })
    .await;
    let healthy = started.elapsed();
    let (_, _, busiest) = pods(&*store).await;
    println!(
        "{} RCs x {} replicas over {} nodes, from the farms' start: all {want} pods scheduled after {:.2?}; all healthy after {:.2?}; busiest node runs {busiest} pods",
        sizes.rcs, sizes.replicas, sizes.nodes, scheduled, healthy
    );
    let rss = rss_mib();
    println!(
        "RSS of the process (server, mirror, farms and simulated nodes): {:.0} MiB now, {:.0} MiB at its peak",
        rss.now, rss.peak
    );

    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rate, calls) = idle_rate(&counting, sizes.idle).await;
    println!(
        "idle with {} RCs: {rate:.2} store requests/s by the farms over {:.0?} {calls:?}",
        sizes.rcs, sizes.idle
    );

    // Scale down to a tenth of the RCs and measure again.
    let keep = (sizes.rcs / 10).max(1);
    for id in &ids[keep..] {
        let response = client
            .delete(format!("{base}/api/v1/rcs/{id}?force=true"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 204);
    }
    wait_for("the farms to settle", Duration::from_secs(60), async || {
        store
            .list("replication_controllers/")
            .await
            .unwrap()
            .pairs
            .len()
            == keep
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rate, calls) = idle_rate(&counting, sizes.idle).await;
    println!(
        "idle with {keep} RCs: {rate:.2} store requests/s by the farms over {:.0?} {calls:?}",
        sizes.idle
    );

    shutdown.cancel();
    let _ = simulator.await;
    let _ = farms.await;
    mirror_tasks.wait().await;
    let _ = server.await;
}
