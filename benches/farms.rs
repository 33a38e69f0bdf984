//! Farm benchmark on the embedded store: the server binary and the node simulator, each its
//! own child process, so that the figures are the server's alone.
//!
//! `cargo bench --bench farms` reports:
//! - the time from the farm-running server's start until all 1,000 pods of 100 RCs of 10
//!   replicas exist on 1,000 simulated nodes (and until all report healthy), and how evenly
//!   they spread. The nodes are labelled and the RCs created through the API (and that time
//!   is printed too) by a first server run with `--no-farms`, which is then stopped; the
//!   server started again with its farms on the same database and port is timed from its
//!   start (its mirror's first read and the election included), while the simulator rides
//!   out the restart by retrying; and when every RC's lock was taken, since a new leader
//!   takes them all before it schedules;
//! - the server's RSS now and at its peak (the simulator's apart): once scheduled, every
//!   25 s until all are healthy, after convergence and after each idle phase;
//! - the store requests per second the server makes when nothing changes, from its own
//!   `/metrics` (every store call of the process: the mirror's watches, the farms, the
//!   leader, and the API answering the simulator), with 100 RCs and again with 10, to show
//!   that idle load does not grow with the number of RCs.
//!
//! The bench waits for convergence by reading the database file itself, which the server
//! does not count. Sizes can be changed:
//! `cargo bench --bench farms -- --nodes 200 --rcs 20 --idle 10`; and `--start-delay-ms`
//! makes the simulated pods take that long to start (0 by default: they report while the
//! farm still schedules).
//!
//! `cargo bench --bench farms -- --growth 10` prints instead how the time to schedule grows
//! from 1,000 RCs × 10 over 2,000 nodes to 10,000 RCs × 10 over 10,000 nodes: ten runs of
//! each, alternately, and the ratio of their medians.
//!
//! `cargo bench --bench farms -- --store-growth 8` prints how the same sizes grow on the
//! embedded store alone, in this process (no server, mirror, farms or simulator): each RC's
//! ten intents and ten pod labels in one transaction, as the RC farm's first pass writes
//! them, `CONCURRENT_OBJECTS` RCs at a time. The pods go on the least-loaded nodes by name,
//! as the farm places them, and then, for comparison, on nodes scattered over the fleet.

use std::collections::{BTreeMap, HashMap};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use p2_apiserver::farms::CONCURRENT_OBJECTS;
use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{KvStore, TxnOp, MAX_TXN_OPS};
use p2_apiserver::labels::{LabelType, Labels};
use p2_apiserver::layout;
use p2_apiserver::metrics::{
    WriterStage, SQLITE_ROWS_WRITTEN, SQLITE_WRITER_STAGE_DURATION, SSE_CLIENTS_DROPPED,
    STORE_OPERATION_DURATION,
};
use prom_text_format_parser::{Sample, Scrape, ValueType};

#[path = "support/rss.rs"]
mod rss;
use rss::{rss_mib_of, Rss};

struct Sizes {
    nodes: usize,
    rcs: usize,
    replicas: usize,
    idle: Duration,
    /// How long a simulated pod takes to start before it is reported.
    start_delay: Duration,
    /// `--growth N`: instead of one fleet's figures, the time to schedule the issue's two
    /// sizes, N runs of each.
    growth_runs: Option<usize>,
    /// `--store-growth N`: instead, the same sizes' first writes to the embedded store
    /// alone, N runs of each.
    store_growth_runs: Option<usize>,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            nodes: 1000,
            rcs: 100,
            replicas: 10,
            // The mirror's watches of quiet trees end every 60 s: a shorter window may catch
            // none of them, or all.
            idle: Duration::from_secs(60),
            start_delay: Duration::ZERO,
            growth_runs: None,
            store_growth_runs: None,
        }
    }
}

fn sizes() -> Sizes {
    let mut sizes = Sizes::default();
    let args: Vec<String> = std::env::args().collect();
    for pair in args.windows(2) {
        let value = || pair[1].parse::<u64>().expect("a number");
        match pair[0].as_str() {
            "--nodes" => sizes.nodes = value() as usize,
            "--rcs" => sizes.rcs = value() as usize,
            "--replicas" => sizes.replicas = value() as usize,
            "--idle" => sizes.idle = Duration::from_secs(value()),
            "--start-delay-ms" => sizes.start_delay = Duration::from_millis(value()),
            "--growth" => sizes.growth_runs = Some(value() as usize),
            "--store-growth" => sizes.store_growth_runs = Some(value() as usize),
            _ => {}
        }
    }
    sizes
}

/// A child process of the server binary, killed when dropped, so also when the bench
/// panics. Its log goes to the bench's stderr, leaving stdout to the figures.
struct Child(std::process::Child);

impl Child {
    fn start(args: &[&str]) -> Child {
        let child = Command::new(env!("CARGO_BIN_EXE_p2-apiserver"))
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::from(std::io::stderr()))
            .spawn()
            .expect("start p2-apiserver");
        Child(child)
    }

    fn rss(&self) -> Rss {
        rss_mib_of(self.0.id())
    }

    /// Stops it with SIGTERM, as an operator would, and waits until it has exited cleanly.
    fn stop(mut self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM failed");
        let status = self.0.wait().expect("wait for p2-apiserver");
        assert!(status.success(), "p2-apiserver exited with {status}");
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `serve` on `port` over the SQLite file `db`, with `/metrics` open to the bench.
fn serve(db: &str, port: u16, farms: bool) -> Child {
    let listen = format!("127.0.0.1:{port}");
    let store = format!("sqlite://{db}");
    let mut args = vec![
        "serve",
        "--listen",
        &listen,
        "--store",
        &store,
        "--metrics-public",
    ];
    if !farms {
        args.push("--no-farms");
    }
    Child::start(&args)
}

/// How many keys under a prefix of the database file meet a condition, kept up to date over
/// SQLite's indexes of changes, so that a poll costs the rows changed since the last rather
/// than the whole prefix. Full reads every 20 ms (of 100,000 intents, then of 100,000 health
/// records) cost the bench, which shares the machine with the server, CPU in proportion to
/// the fleet. Nor does the bench hold the store open, whose poll would read each key the
/// server writes.
struct Counted {
    db: sqlx::SqlitePool,
    /// The prefix's key range, `[start, end)`.
    range: (Vec<u8>, Vec<u8>),
    /// An SQL condition on a `kv` row.
    condition: &'static str,
    /// Whether each key now under the prefix meets it.
    meets: HashMap<Vec<u8>, bool>,
    /// How many do.
    count: usize,
    /// The newest change read so far.
    seen: i64,
}

impl Counted {
    fn new(db: &sqlx::SqlitePool, prefix: &str, condition: &'static str) -> Self {
        let start = prefix.as_bytes().to_vec();
        let mut end = start.clone();
        *end.last_mut().unwrap() += 1;
        Counted {
            db: db.clone(),
            range: (start, end),
            condition,
            meets: HashMap::new(),
            count: 0,
            seen: 0,
        }
    }

    async fn count(&mut self) -> usize {
        let (start, end) = &self.range;
        // A key is either a row or a tombstone (whose condition reads as NULL).
        let changed: Vec<(Vec<u8>, Option<bool>, i64)> = sqlx::query_as(&format!(
            "SELECT key, {}, modify_index FROM kv INDEXED BY kv_by_change
             WHERE modify_index > ?1 AND key >= ?2 AND key < ?3
             UNION ALL
             SELECT key, NULL, delete_index FROM tombstones INDEXED BY tombstones_by_change
             WHERE delete_index > ?1 AND key >= ?2 AND key < ?3",
            self.condition
        ))
        .bind(self.seen)
        .bind(start)
        .bind(end)
        .fetch_all(&self.db)
        .await
        .unwrap();
        for (key, meets, index) in changed {
            let before = match meets {
                Some(meets) => self.meets.insert(key, meets),
                None => self.meets.remove(&key),
            };
            self.count =
                self.count + usize::from(meets == Some(true)) - usize::from(before == Some(true));
            self.seen = self.seen.max(index);
        }
        self.count
    }
}

/// The most pods an RC placed on one node.
async fn busiest(db: &sqlx::SqlitePool) -> usize {
    let labels: Vec<(Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT key, value FROM kv WHERE key >= CAST('labels/pod/' AS BLOB)
         AND key < CAST('labels/pod0' AS BLOB)",
    )
    .fetch_all(db)
    .await
    .unwrap();
    let mut per_node: HashMap<Vec<u8>, usize> = HashMap::new();
    for (key, value) in &labels {
        let labels: Labels = serde_json::from_slice(value).unwrap_or_default();
        if labels.contains_key("replication_controller_id") {
            let node = key["labels/pod/".len()..]
                .split(|b| *b == b'/')
                .next()
                .unwrap();
            *per_node.entry(node.to_vec()).or_insert(0) += 1;
        }
    }
    per_node.values().copied().max().unwrap_or(0)
}

async fn wait_for(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// The server's `/metrics`, parsed.
async fn scrape(client: &reqwest::Client, base: &str) -> Scrape {
    let response = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    Scrape::parse(&text).expect("the Prometheus text format")
}

/// The sums of the samples of `metric` of type `value_type`, by what `key` makes of each.
fn sums_by(
    scrape: &Scrape,
    metric: &str,
    value_type: ValueType,
    key: impl Fn(&Sample) -> String,
) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for metric in scrape.metrics.iter().filter(|m| m.name == metric) {
        for sample in metric
            .samples
            .iter()
            .filter(|s| s.value.value_type == value_type)
        {
            *sums.entry(key(sample)).or_insert(0.0) += sample.value.value.as_f64();
        }
    }
    sums
}

/// The value of the sample's label `name`, `""` when it has none.
fn label<'a>(sample: &'a Sample, name: &str) -> &'a str {
    let found = sample.labels.iter().find(|l| l.key == name);
    found.map_or("", |l| l.value.as_str())
}

/// How the server's SQLite writer spent `took`: the time in each of its stages, and per row
/// written.
async fn print_writer(client: &reqwest::Client, base: &str, took: Duration) {
    let scrape = scrape(client, base).await;
    let stages = sums_by(
        &scrape,
        SQLITE_WRITER_STAGE_DURATION,
        ValueType::Sum,
        |sample| label(sample, "stage").to_owned(),
    );
    let rows = sums_by(&scrape, SQLITE_ROWS_WRITTEN, ValueType::Sample, |_| {
        String::new()
    });
    let rows = rows.values().sum::<f64>();
    let busy: f64 = stages.values().sum();
    let each: Vec<String> = WriterStage::ALL
        .into_iter()
        .map(|stage| {
            let took = stages.get(stage.label()).copied().unwrap_or(0.0);
            format!("{} {took:.2} s", stage.label())
        })
        .collect();
    println!(
        "the SQLite writer was busy {busy:.2} s of those {:.2} s ({:.0}%): {}; {rows:.0} rows written, {:.1} us each",
        took.as_secs_f64(),
        100.0 * busy / took.as_secs_f64(),
        each.join(", "),
        1e6 * busy / rows.max(1.0)
    );
    let dropped = sums_by(&scrape, SSE_CLIENTS_DROPPED, ValueType::Sample, |_| {
        String::new()
    });
    println!(
        "change-stream clients cut off for reading too slowly (the simulator's among them): {}",
        dropped.values().sum::<f64>() as u64
    );
}

/// The server's store operations so far, by operation (and outcome, when not `ok`), from
/// the `_count` of its `/metrics` histogram.
async fn store_operations(client: &reqwest::Client, base: &str) -> BTreeMap<String, f64> {
    let scrape = scrape(client, base).await;
    sums_by(
        &scrape,
        STORE_OPERATION_DURATION,
        ValueType::Count,
        |sample| match label(sample, "outcome") {
            "ok" => label(sample, "operation").to_owned(),
            outcome => format!("{}/{outcome}", label(sample, "operation")),
        },
    )
}

/// The server's store requests per second over `idle`, and their number by operation.
async fn idle_rate(
    client: &reqwest::Client,
    base: &str,
    idle: Duration,
) -> (f64, BTreeMap<String, u64>) {
    let before = store_operations(client, base).await;
    tokio::time::sleep(idle).await;
    let after = store_operations(client, base).await;
    let calls: BTreeMap<String, u64> = after
        .into_iter()
        .map(|(name, count)| {
            let added = count - before.get(&name).copied().unwrap_or(0.0);
            (name, added as u64)
        })
        .filter(|(_, added)| *added > 0)
        .collect();
    let total: u64 = calls.values().sum();
    (total as f64 / idle.as_secs_f64(), calls)
}

/// The time to schedule 10,000 RCs × 10 over 10,000 nodes beside 1,000 RCs × 10 over 2,000
/// nodes, as a ratio. The two sizes alternate, `runs` times, so that both see the same
/// drift of a shared machine, and the ratio is of their medians.
async fn growth(runs: usize) {
    let sizes = GROWTH_SIZES.map(|(rcs, nodes)| Sizes {
        nodes,
        rcs,
        ..Sizes::default()
    });
    let mut times: [Vec<Duration>; 2] = Default::default();
    for _ in 0..runs {
        for (sizes, times) in sizes.iter().zip(&mut times) {
            let fleet = Fleet::set_up(sizes).await;
            times.push(fleet.scheduled(sizes).await);
        }
    }
    let [small, large] = times.map(median);
    println!(
        "growth from 1,000 to 10,000 RCs: {:.1}x in time, the medians of {runs} runs each ({large:.2?} against {small:.2?})",
        large.as_secs_f64() / small.as_secs_f64()
    );
}

/// The median of `times`, printed sorted first.
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    println!("{times:.2?}");
    let middle = times.len() / 2;
    if times.len().is_multiple_of(2) {
        (times[middle - 1] + times[middle]) / 2
    } else {
        times[middle]
    }
}

/// The issue's two sizes: (RCs, nodes), each RC of [`Sizes::default`]'s replicas.
const GROWTH_SIZES: [(usize, usize); 2] = [(1_000, 2_000), (10_000, 10_000)];

/// The time the two sizes' first writes take on the embedded store alone, alternately,
/// `runs` times for each placement of the pods, as a ratio of their medians.
async fn store_growth(runs: usize) {
    let replicas = Sizes::default().replicas;
    for scattered in [false, true] {
        let mut times: [Vec<Duration>; 2] = Default::default();
        for _ in 0..runs {
            for (&(rcs, nodes), times) in GROWTH_SIZES.iter().zip(&mut times) {
                times.push(first_writes(rcs, nodes, replicas, scattered).await);
            }
        }
        let [small, large] = times.map(median);
        let placed = if scattered {
            "on nodes scattered over the fleet"
        } else {
            "on the least-loaded nodes by name, as the RC farm places them"
        };
        let rows = |rcs: usize| (2 * rcs * replicas) as f64;
        println!(
            "the store alone, pods {placed}: {:.1}x in time, the medians of {runs} runs each ({large:.2?} against {small:.2?}; {:.1} us against {:.1} us per row)",
            large.as_secs_f64() / small.as_secs_f64(),
            1e6 * large.as_secs_f64() / rows(GROWTH_SIZES[1].0),
            1e6 * small.as_secs_f64() / rows(GROWTH_SIZES[0].0),
        );
    }
}

/// How long a fresh embedded store takes to write the intents and pod labels of `rcs` RCs
/// of `replicas` over `nodes`, `CONCURRENT_OBJECTS` RCs at a time, after the RCs and the
/// nodes' labels the farm would read.
async fn first_writes(rcs: usize, nodes: usize, replicas: usize, scattered: bool) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db").display().to_string();
    let store = SqliteStore::open(&path).await.unwrap();
    let node = |n: usize| format!("node-{n:04}");
    let before = (0..rcs)
        .map(|i| TxnOp::Set {
            key: layout::rc(uuid::Uuid::now_v7()),
            value: format!(
                "{{\"id\": \"app-{i:05}\", \"manifest\": \"{}\"}}",
                "m".repeat(800)
            )
            .into_bytes(),
        })
        .chain((0..nodes).map(|n| TxnOp::Set {
            key: layout::labels(LabelType::Node, &node(n)),
            value: br#"{"pool": "bench"}"#.to_vec(),
        }))
        .collect::<Vec<_>>();
    for ops in before.chunks(MAX_TXN_OPS) {
        store.txn(ops).await.unwrap();
    }
    let started = Instant::now();
    let store = &store;
    futures::stream::iter(0..rcs)
        .for_each_concurrent(CONCURRENT_OBJECTS, |i| async move {
            let pod_id = format!("app-{i:05}");
            let ops: Vec<TxnOp> = (0..replicas)
                .flat_map(|r| {
                    // Scattered: strides of two primes, so that an RC's pods land on
                    // distinct nodes far apart at either size.
                    let n = if scattered {
                        (i * 7919 + r * 104_729) % nodes
                    } else {
                        (i * replicas + r) % nodes
                    };
                    let (node, value) = (node(n), "i".repeat(250).into_bytes());
                    [
                        TxnOp::Set {
                            key: layout::pod(layout::INTENT, &node, &pod_id),
                            value,
                        },
                        TxnOp::Set {
                            key: layout::labels(LabelType::Pod, &format!("{node}/{pod_id}")),
                            value: br#"{"replication_controller_id": "rc"}"#.to_vec(),
                        },
                    ]
                })
                .collect();
            store.txn(&ops).await.unwrap();
        })
        .await;
    started.elapsed()
}

/// How often the server's RSS is printed while the bench waits for every pod to be healthy.
const RSS_REPORT_EVERY: Duration = Duration::from_secs(25);

fn print_rss(when: &str, server: &Child, simulator: &Child) {
    let (ours, sim) = (server.rss(), simulator.rss());
    println!(
        "RSS {when}: the server {:.0} MiB now, {:.0} MiB at its peak; the simulator apart {:.0} MiB now, {:.0} MiB at its peak",
        ours.now, ours.peak, sim.now, sim.peak
    );
}

/// A fleet ready for the farms: the nodes labelled by the simulator and the RCs created
/// through a first server run with `--no-farms`, then the server started again with its
/// farms on the same database and port. Dropping it kills both processes before its
/// database goes.
struct Fleet {
    server: Child,
    simulator: Child,
    client: reqwest::Client,
    base: String,
    /// The database file, read-only, as the bench watches it.
    db: sqlx::SqlitePool,
    /// The RCs, in the order created.
    ids: Vec<String>,
    /// When the farm-running server was started.
    started: Instant,
    _dir: tempfile::TempDir,
}

impl Fleet {
    async fn set_up(sizes: &Sizes) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let db_path = dir.path().join("bench.db").display().to_string();
        // A free port, kept across the restart so that the simulator follows the server.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();

        let server = serve(&db_path, port, false);
        wait_for("the server", Duration::from_secs(30), async || {
            let ready = client.get(format!("{base}/readyz")).send().await;
            ready.is_ok_and(|r| r.status().is_success())
        })
        .await;
        let read_only = format!("sqlite://{db_path}?mode=ro").parse().unwrap();
        let db = sqlx::SqlitePool::connect_with(read_only).await.unwrap();
        let mut node_labels = Counted::new(&db, "labels/node/", "1");
        let nodes = sizes.nodes.to_string();
        let start_delay = format!("{}ms", sizes.start_delay.as_millis());
        let simulator = Child::start(&[
            "simulate",
            "--server",
            &base,
            "--nodes",
            &nodes,
            "--labels",
            "pool=bench",
            "--start-delay",
            &start_delay,
        ]);
        let nodes = wait_for(
            "the simulated nodes",
            Duration::from_secs(120),
            async || node_labels.count().await == sizes.nodes,
        )
        .await;
        println!("{} simulated nodes labelled in {:.2?}", sizes.nodes, nodes);

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

        server.stop();
        let started = Instant::now();
        let server = serve(&db_path, port, true);
        Fleet {
            server,
            simulator,
            client,
            base,
            db,
            ids,
            started,
            _dir: dir,
        }
    }

    /// Waits until every pod is scheduled; how long that took from the farm-running
    /// server's start.
    async fn scheduled(&self, sizes: &Sizes) -> Duration {
        // Intents are written in the same transaction as their pods' labels.
        let mut intents = Counted::new(&self.db, "intent/", "1");
        // A new leader takes every RC's lock before it schedules.
        let mut rc_locks = Counted::new(
            &self.db,
            "lock/replication_controllers/",
            "session IS NOT NULL",
        );
        let want = sizes.rcs * sizes.replicas;
        let mut claimed = None;
        wait_for("every pod", Duration::from_secs(600), async || {
            if claimed.is_none() && rc_locks.count().await == sizes.rcs {
                claimed = Some(self.started.elapsed());
            }
            intents.count().await == want
        })
        .await;
        let scheduled = self.started.elapsed();
        if let Some(claimed) = claimed {
            println!("every RC's lock taken after {claimed:.2?} from the farm-running server's start (its mirror's first read and the election included)");
        }
        println!(
            "{} RCs x {} replicas over {} nodes, from the farm-running server's start: all {want} pods scheduled after {scheduled:.2?}",
            sizes.rcs, sizes.replicas, sizes.nodes
        );
        print_writer(&self.client, &self.base, scheduled).await;
        scheduled
    }
}

#[tokio::main]
async fn main() {
    let sizes = sizes();
    if let Some(runs) = sizes.growth_runs {
        growth(runs).await;
        return;
    }
    if let Some(runs) = sizes.store_growth_runs {
        store_growth(runs).await;
        return;
    }
    let fleet = Fleet::set_up(&sizes).await;
    fleet.scheduled(&sizes).await;
    let want = sizes.rcs * sizes.replicas;
    let mut passing = Counted::new(
        &fleet.db,
        "health/",
        "instr(value, CAST('\"passing\"' AS BLOB)) > 0",
    );
    let mut rcs = Counted::new(&fleet.db, "replication_controllers/", "1");
    print_rss("once scheduled", &fleet.server, &fleet.simulator);
    // The server's peak so far, every so often while the reports come in: at 100,000 pods
    // all healthy is minutes away.
    let mut next_report = RSS_REPORT_EVERY;
    wait_for("every pod healthy", Duration::from_secs(600), async || {
        if fleet.started.elapsed() >= next_report {
            let when = format!("{next_report:.0?} after the farm-running server's start");
            print_rss(&when, &fleet.server, &fleet.simulator);
            next_report += RSS_REPORT_EVERY;
        }
        passing.count().await >= want
    })
    .await;
    let healthy = fleet.started.elapsed();
    let busiest = busiest(&fleet.db).await;
    println!("all healthy after {healthy:.2?}; busiest node runs {busiest} pods");
    print_rss("after convergence", &fleet.server, &fleet.simulator);

    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rate, calls) = idle_rate(&fleet.client, &fleet.base, sizes.idle).await;
    println!(
        "idle with {} RCs: {rate:.2} store requests/s by the server (mirror watches, farms, leader, the simulator's reports through the API) over {:.0?} {calls:?}",
        sizes.rcs, sizes.idle
    );
    print_rss(
        &format!("after idling with {} RCs", sizes.rcs),
        &fleet.server,
        &fleet.simulator,
    );

    // Scale down to a tenth of the RCs and measure again.
    let keep = (sizes.rcs / 10).max(1);
    for id in &fleet.ids[keep..] {
        let response = fleet
            .client
            .delete(format!("{}/api/v1/rcs/{id}?force=true", fleet.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 204);
    }
    wait_for("the farms to settle", Duration::from_secs(60), async || {
        rcs.count().await == keep
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rate, calls) = idle_rate(&fleet.client, &fleet.base, sizes.idle).await;
    println!(
        "idle with {keep} RCs: {rate:.2} store requests/s by the server (mirror watches, farms, leader, the simulator's reports through the API) over {:.0?} {calls:?}",
        sizes.idle
    );
    print_rss(
        &format!("after idling with {keep} RCs"),
        &fleet.server,
        &fleet.simulator,
    );

    fleet.simulator.stop();
    fleet.server.stop();
}
