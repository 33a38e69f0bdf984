//! A store with the leader campaign and the farms running on it, and helpers to arrange and
//! observe state behind their back. The store is SQLite, or the Consul client against the
//! fake agent of `support/fake_consul.rs` ([`Backend`]); [`p2`] holds doubles of P2's own
//! RC worker and rolling update, for tests of a fleet that mixes both implementations.

use super::counting::Counting;
use super::fake_consul;
use p2_apiserver::layout;
pub mod p2;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use p2_apiserver::farms::{self, alerts::Alerter, FarmOptions};
use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{
    open_store, Cas, ConsulOptions, KvStore, Listing, SessionBehavior, WatchTarget,
};
use p2_apiserver::labels::{LabelType, Labels};
use p2_apiserver::leader::{self, LeaderConfig};
use p2_apiserver::state::{Mirror, MirrorConfig};
use p2_apiserver::store::events::Retention;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

/// A pod manifest every test can use.
pub const MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_1.tar.gz\n";
/// The same pod with another launchable, for an RC or daemon set to change to.
pub const NEW_MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_2.tar.gz\n";

/// Pod labels an RC may carry that make each pod's label set large: 600 labels, about 45 KB,
/// so that twenty pods' labels are more than one transaction may carry.
pub fn large_pod_labels() -> serde_json::Map<String, serde_json::Value> {
    (0..600)
        .map(|i| {
            (
                format!("team.example.com/label-{i:04}"),
                serde_json::json!("v".repeat(50)),
            )
        })
        .collect()
}

/// An RC document as P2 stores it, but for its id (which [`Harness::put_rc`] adds):
/// `replicas` pods of `manifest` on the nodes `selector` picks, enabled, with no pod labels
/// and no allocation strategy set (`""`). Its methods set the rest.
pub fn rc_doc(manifest: &str, selector: &str, replicas: usize) -> RcDoc {
    RcDoc(
        serde_json::json!({"manifest": manifest, "node_selector": selector,
                             "pod_labels": {}, "replicas_desired": replicas,
                             "disabled": false, "allocation_strategy": ""}),
    )
}

/// The document [`rc_doc`] builds.
#[derive(Clone)]
pub struct RcDoc(serde_json::Value);

impl RcDoc {
    pub fn id(mut self, id: &str) -> RcDoc {
        self.0["id"] = id.into();
        self
    }

    pub fn pod_labels(mut self, labels: impl Into<serde_json::Value>) -> RcDoc {
        self.0["pod_labels"] = labels.into();
        self
    }

    pub fn disabled(mut self, disabled: bool) -> RcDoc {
        self.0["disabled"] = disabled.into();
        self
    }

    pub fn strategy(mut self, strategy: &str) -> RcDoc {
        self.0["allocation_strategy"] = strategy.into();
        self
    }
}

impl From<RcDoc> for serde_json::Value {
    fn from(doc: RcDoc) -> serde_json::Value {
        doc.0
    }
}

impl std::fmt::Display for RcDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// How long a test waits for the farms to converge before failing: a bound for a test
/// that fails, not a figure, so generous. The heaviest test (an RC on 1,400 nodes whose
/// audit record fills most of each transaction) takes about 11 s on an idle 2-core
/// machine, and went past the old bound of 20 s there beside other builds.
pub const CONVERGE: Duration = Duration::from_secs(60);

/// The store a harness runs on.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Sqlite,
    /// The Consul client against a fake Consul agent started for the test.
    FakeConsul,
}

pub struct Harness {
    pub store: Arc<dyn KvStore>,
    /// The mirror the farms read.
    pub mirror: Mirror,
    /// On the fake Consul agent, how it answers reads at the KV table's index (of a tree
    /// that holds nothing): what wakes them, and whether a write follows each answer.
    pub empty_reads: Option<Arc<fake_consul::EmptyReads>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    _dir: tempfile::TempDir,
}

/// Every warning or error logged by this test binary, with its fields, so that a test can
/// check that what it did logged none.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records warnings and errors into [`WARNINGS`].
struct WarningLog;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WarningLog {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0 += &format!(" {}={value:?}", field.name());
            }
        }
        let mut text = Text(event.metadata().target().to_owned());
        event.record(&mut text);
        WARNINGS.lock().unwrap().push(text.0);
    }
}

/// The warnings and errors logged so far by module `target` that mention `needle`.
pub fn warnings(target: &str, needle: &str) -> Vec<String> {
    let warnings = WARNINGS.lock().unwrap();
    warnings
        .iter()
        .filter(|w| w.split_once(' ').is_some_and(|(t, _)| t == target) && w.contains(needle))
        .cloned()
        .collect()
}

/// Why a wait for the farms failed, with the last warnings logged meanwhile (by any test
/// of the binary: they run side by side), since a test's log is shown only when `RUST_LOG`
/// is set, and a failure that comes once in many runs cannot be run again to see it.
fn not_converged() -> String {
    const SHOWN: usize = 30;
    let warnings = WARNINGS.lock().unwrap();
    let last = &warnings[warnings.len().saturating_sub(SHOWN)..];
    format!(
        "the farms did not converge; the last warnings logged:\n{}",
        last.join("\n")
    )
}

impl Harness {
    /// An empty store with one server campaigning (and so leading) on it.
    pub async fn start() -> Harness {
        Self::start_with_alerts(None).await
    }

    /// Like [`Harness::start`], with alerts posted to `webhook`.
    pub async fn start_with_alerts(webhook: Option<String>) -> Harness {
        Self::start_on(Backend::Sqlite, webhook).await
    }

    /// Like [`Harness::start_with_alerts`], on `backend`.
    pub async fn start_on(backend: Backend, webhook: Option<String>) -> Harness {
        Self::start_with(backend, webhook, FarmOptions::default()).await
    }

    /// Like [`Harness::start`], keeping events and finished rolls within `retention`.
    pub async fn start_with_retention(retention: Retention) -> Harness {
        let options = FarmOptions {
            retention,
            ..FarmOptions::default()
        };
        Self::start_with(Backend::Sqlite, None, options).await
    }

    /// Like [`Harness::start`], on an embedded store behind a counting one, whose watches
    /// can be held back or made to fail.
    pub async fn start_counted() -> (Harness, Arc<Counting>) {
        let mut counting = None;
        let options = FarmOptions::default();
        let harness = Self::start_over(Backend::Sqlite, None, options, |store| {
            let store = Counting::new(store);
            counting = Some(store.clone());
            store
        })
        .await;
        (harness, counting.unwrap())
    }

    /// Like [`Harness::start_on`], with the farms' `options`.
    pub async fn start_with(
        backend: Backend,
        webhook: Option<String>,
        options: FarmOptions,
    ) -> Harness {
        Self::start_over(backend, webhook, options, |store| store).await
    }

    /// Like [`Harness::start_with`], with the store `backend` gives wrapped by `wrap`.
    async fn start_over(
        backend: Backend,
        webhook: Option<String>,
        options: FarmOptions,
        wrap: impl FnOnce(Arc<dyn KvStore>) -> Arc<dyn KvStore>,
    ) -> Harness {
        let _ = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_test_writer()
                    .with_filter(tracing_subscriber::EnvFilter::from_default_env()),
            )
            .with(WarningLog.with_filter(tracing_subscriber::filter::LevelFilter::WARN))
            .try_init();
        let (store, dir, empty_reads): (Arc<dyn KvStore>, _, _) = match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("farms.db").display().to_string();
                (Arc::new(SqliteStore::open(&path).await.unwrap()), dir, None)
            }
            Backend::FakeConsul => {
                let fake = fake_consul::start().await;
                // As Consul may: a read of an empty tree is woken by its own changes only.
                fake.empty_reads.lazy(true);
                let url = format!("consul://{}", fake.addr).parse().unwrap();
                let store = open_store(&url, ConsulOptions::default()).await.unwrap();
                (store, fake.dir, Some(fake.empty_reads))
            }
        };
        let store = wrap(store);
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let config = LeaderConfig {
            holder: "test".into(),
            session_ttl: Duration::from_secs(10),
            lock_delay: Duration::ZERO,
            behavior: SessionBehavior::Delete,
        };
        let farm_store = store.clone();
        let alerts = Arc::new(Alerter::new(webhook));
        // The farms read the store through a mirror of it, as under `serve`.
        let mirror = Mirror::new(store.clone(), MirrorConfig::default());
        mirror.start(&tasks, shutdown.clone());
        let farm_mirror = mirror.clone();
        tasks.spawn(leader::campaign(
            store.clone(),
            config,
            || Ok(()),
            shutdown.clone(),
            move |term| {
                farms::run_term(
                    farm_store.clone(),
                    farm_mirror.clone(),
                    term,
                    alerts.clone(),
                    "test".into(),
                    options,
                )
            },
        ));
        Harness {
            store,
            mirror,
            empty_reads,
            shutdown,
            tasks,
            _dir: dir,
        }
    }

    pub async fn label(&self, label_type: LabelType, id: &str, labels: serde_json::Value) {
        let key = layout::labels(label_type, id);
        self.store
            .put(&key, labels.to_string().as_bytes(), Cas::Any)
            .await
            .unwrap();
    }

    /// Labels nodes `node1` to `node<count>` `role=web`.
    pub async fn web_nodes(&self, count: usize) {
        for i in 1..=count {
            let labels = serde_json::json!({"role": "web"});
            self.label(LabelType::Node, &format!("node{i}"), labels)
                .await;
        }
    }

    /// An RC of `replicas` of [`MANIFEST`] over `nodes` web nodes run by fake agents, once
    /// its pods are all healthy; returns its id.
    pub async fn healthy_rc(&self, nodes: usize, replicas: usize) -> String {
        self.web_nodes(nodes).await;
        self.run_fake_nodes(Duration::from_millis(50));
        let id = self.put_rc(rc_doc(MANIFEST, "role=web", replicas)).await;
        self.wait_until(|| async {
            (self.healthy_by_rc().await.get(&id) == Some(&replicas)).then_some(())
        })
        .await;
        id
    }

    /// Stores an RC document as given (plus a fresh id) and returns the id.
    pub async fn put_rc(&self, doc: impl Into<serde_json::Value>) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        self.put_rc_as(&id, doc).await;
        id
    }

    /// Stores an RC document as given, with id `id`.
    pub async fn put_rc_as(&self, id: &str, doc: impl Into<serde_json::Value>) {
        let mut doc: serde_json::Value = doc.into();
        doc["id"] = id.into();
        let key = format!("replication_controllers/{id}");
        self.store
            .put(&key, doc.to_string().as_bytes(), Cas::Index(0))
            .await
            .unwrap();
    }

    /// Stores a roll from `old` to `new` (P2's document, no delay, the old RC deleted at the
    /// end), as `p2-rctl` or the API would.
    pub async fn put_roll(&self, old: &str, new: &str, desired: usize, minimum: usize) {
        let roll = serde_json::json!({"OldRC": old, "NewRC": new, "DesiredReplicas": desired,
                                      "MinimumReplicas": minimum, "LeaveOld": false,
                                      "RollDelay": 0});
        self.put_roll_doc(roll).await;
    }

    /// Stores a roll document as given, at the key of its `NewRC`.
    pub async fn put_roll_doc(&self, roll: serde_json::Value) {
        let new = roll["NewRC"].as_str().unwrap();
        self.store
            .put(
                &layout::roll(new),
                roll.to_string().as_bytes(),
                Cas::Index(0),
            )
            .await
            .unwrap();
    }

    pub async fn set_replicas(&self, id: &str, replicas: i64) {
        let key = format!("replication_controllers/{id}");
        let pair = self.store.get(&key).await.unwrap().unwrap();
        let mut doc: serde_json::Value = serde_json::from_slice(&pair.value).unwrap();
        doc["replicas_desired"] = replicas.into();
        self.store
            .put(
                &key,
                doc.to_string().as_bytes(),
                Cas::Index(pair.modify_index),
            )
            .await
            .unwrap();
    }

    /// Changes an RC's document with CAS, as a user of the store would.
    pub async fn edit_rc(&self, id: &str, change: impl FnOnce(&mut serde_json::Value)) {
        self.edit_json(&format!("replication_controllers/{id}"), change)
            .await;
    }

    /// Changes the JSON document at `key` with CAS.
    async fn edit_json(&self, key: &str, change: impl FnOnce(&mut serde_json::Value)) {
        let pair = self.store.get(key).await.unwrap().unwrap();
        let mut doc: serde_json::Value = serde_json::from_slice(&pair.value).unwrap();
        change(&mut doc);
        self.store
            .put(
                key,
                doc.to_string().as_bytes(),
                Cas::Index(pair.modify_index),
            )
            .await
            .unwrap();
    }

    pub async fn pod_labels(&self, node: &str, pod_id: &str) -> Labels {
        let key = layout::labels(LabelType::Pod, &format!("{node}/{pod_id}"));
        let pair = self.store.get(&key).await.unwrap().unwrap();
        serde_json::from_slice(&pair.value).unwrap()
    }

    pub async fn intent(&self, node: &str, pod_id: &str) -> Option<String> {
        let pair = self
            .store
            .get(&format!("intent/{node}/{pod_id}"))
            .await
            .unwrap()?;
        Some(String::from_utf8(pair.value.to_vec()).unwrap())
    }

    /// The nodes whose pod labels name the RC, sorted.
    pub async fn rc_nodes(&self, id: &str) -> Vec<String> {
        self.labelled_nodes("replication_controller_id", id).await
    }

    pub async fn wait_for_rc_nodes(&self, id: &str, count: usize) -> Vec<String> {
        self.wait_until(|| async {
            let nodes = self.rc_nodes(id).await;
            (nodes.len() == count).then_some(nodes)
        })
        .await
    }

    pub async fn audit_records(&self) -> usize {
        self.store.list("audit_logs/").await.unwrap().pairs.len()
    }

    /// Polls `check` until it yields, failing the test after [`CONVERGE`].
    pub async fn wait_until<T, F, Fut>(&self, check: F) -> T
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let give_up = tokio::time::Instant::now() + CONVERGE;
        loop {
            let checking = tokio::time::Instant::now();
            if let Some(value) = check().await {
                return value;
            }
            assert!(tokio::time::Instant::now() < give_up, "{}", not_converged());
            // A check that reads much (the pod labels of an RC on 1,400 nodes) is spaced
            // out, so that polling takes at most a third of the time, and leaves the rest
            // to the farms it waits for.
            let pause = Duration::from_millis(50).max(checking.elapsed() * 2);
            tokio::time::sleep(pause).await;
        }
    }
}

impl Harness {
    /// Plays every node's agent (P2's preparer): a pod newly intended, or whose intended
    /// manifest changed, has its health withdrawn at once (it is restarting), then after
    /// `delay` is reported running (reality = intent) and passing; pods no longer intended
    /// lose their reality and health.
    pub fn run_fake_nodes(&self, delay: Duration) {
        let store = self.store.clone();
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            // What each pod was last intended to run, and since when.
            let mut seen: HashMap<String, (Arc<[u8]>, tokio::time::Instant)> = HashMap::new();
            while !shutdown.is_cancelled() {
                let intents = store.list("intent/").await.unwrap();
                let mut live = HashSet::new();
                for pair in &intents.pairs {
                    let rest = pair.key.strip_prefix("intent/").unwrap().to_owned();
                    let (node, pod_id) = rest.split_once('/').unwrap();
                    let health = format!("health/{pod_id}/{node}");
                    live.insert(rest.clone());
                    let since = match seen.get(&rest) {
                        Some((manifest, since)) if *manifest == pair.value => *since,
                        _ => {
                            store.delete(&health, Cas::Any).await.unwrap();
                            let now = tokio::time::Instant::now();
                            seen.insert(rest.clone(), (pair.value.clone(), now));
                            now
                        }
                    };
                    let reality = format!("reality/{rest}");
                    let current = store.get(&reality).await.unwrap();
                    if since.elapsed() >= delay && current.map(|p| p.value) != Some(pair.value.clone()) {
                        store.put(&reality, &pair.value, Cas::Any).await.unwrap();
                        let record = serde_json::json!({"Id": pod_id, "Node": node, "Service": pod_id,
                            "Status": "passing", "Time": "2026-01-01T00:00:00Z", "Expires": "2126-01-01T00:00:00Z"});
                        store.put(&health, record.to_string().as_bytes(), Cas::Any).await.unwrap();
                    }
                }
                seen.retain(|pod, _| live.contains(pod));
                for pair in store.list("reality/").await.unwrap().pairs {
                    let rest = pair.key.strip_prefix("reality/").unwrap();
                    if !live.contains(rest) {
                        let (node, pod_id) = rest.split_once('/').unwrap();
                        store.delete(&pair.key, Cas::Any).await.unwrap();
                        store.delete(&format!("health/{pod_id}/{node}"), Cas::Any).await.unwrap();
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }

    /// Pods passing on the manifest they are intended to run, by owning RC id.
    pub async fn healthy_by_rc(&self) -> HashMap<String, usize> {
        let mut healthy = HashMap::new();
        for (labels, passing) in self.snapshot().await.pods() {
            if let (Some(rc), true) = (labels.get("replication_controller_id"), passing) {
                *healthy.entry(rc.clone()).or_insert(0) += 1;
            }
        }
        healthy
    }

    /// The whole store, read at one index.
    pub async fn snapshot(&self) -> Snapshot {
        Snapshot::from(self.store.list("").await.unwrap())
    }

    /// Reads the store at every change (each reading at one index) and hands each reading
    /// to `check` until it yields; fails the test after [`CONVERGE`].
    pub async fn follow<T>(&self, mut check: impl FnMut(&Snapshot) -> Option<T>) -> T {
        let give_up = tokio::time::Instant::now() + CONVERGE;
        let mut listing = self.store.list("").await.unwrap();
        loop {
            let index = listing.index;
            if let Some(value) = check(&Snapshot::from(listing)) {
                return value;
            }
            let left = give_up.saturating_duration_since(tokio::time::Instant::now());
            assert!(!left.is_zero(), "{}", not_converged());
            let target = WatchTarget::Prefix(String::new());
            listing = self.store.watch(&target, index, left).await.unwrap();
        }
    }

    /// Stores a daemon set document as given (plus a fresh id) and returns the id.
    pub async fn put_ds(&self, mut doc: serde_json::Value) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        doc["id"] = id.clone().into();
        let key = format!("daemon_sets/{id}");
        self.store
            .put(&key, doc.to_string().as_bytes(), Cas::Index(0))
            .await
            .unwrap();
        id
    }

    /// The stored daemon set document.
    pub async fn ds(&self, id: &str) -> serde_json::Value {
        let pair = self
            .store
            .get(&format!("daemon_sets/{id}"))
            .await
            .unwrap()
            .unwrap();
        serde_json::from_slice(&pair.value).unwrap()
    }

    /// Changes a daemon set's document with CAS, as a user of the store would.
    pub async fn edit_ds(&self, id: &str, change: impl FnOnce(&mut serde_json::Value)) {
        self.edit_json(&format!("daemon_sets/{id}"), change).await;
    }

    /// The nodes whose pod labels carry `key=value`, sorted.
    pub async fn labelled_nodes(&self, key: &str, value: &str) -> Vec<String> {
        let listing = self.store.list("labels/pod/").await.unwrap();
        let mut nodes: Vec<String> = listing
            .pairs
            .iter()
            .filter(|pair| {
                let labels: Labels = serde_json::from_slice(&pair.value).unwrap_or_default();
                labels.get(key).map(String::as_str) == Some(value)
            })
            .filter_map(|pair| {
                pair.key
                    .strip_prefix("labels/pod/")?
                    .split('/')
                    .next()
                    .map(str::to_owned)
            })
            .collect();
        nodes.sort();
        nodes
    }

    /// The status record the DS farm published for a daemon set.
    pub async fn ds_status(&self, id: &str) -> Option<serde_json::Value> {
        let pair = self
            .store
            .get(&format!("status/daemon_sets/{id}/daemon_set_farm"))
            .await
            .unwrap()?;
        Some(serde_json::from_slice(&pair.value).unwrap())
    }

    /// How many pods labelled `key=value` run their intended manifest and pass.
    pub async fn healthy_labelled(&self, key: &str, value: &str) -> usize {
        self.snapshot()
            .await
            .pods()
            .iter()
            .filter(|(labels, healthy)| {
                *healthy && labels.get(key).map(String::as_str) == Some(value)
            })
            .count()
    }
}

/// A webhook that accepts every alert posted to it.
pub async fn alert_webhook() -> wiremock::MockServer {
    slow_alert_webhook(Duration::ZERO).await
}

/// A webhook that accepts every alert posted to it, `delay` after it was posted.
pub async fn slow_alert_webhook(delay: Duration) -> wiremock::MockServer {
    use wiremock::{matchers::method, Mock, MockServer, ResponseTemplate};
    let webhook = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(delay))
        .mount(&webhook)
        .await;
    webhook
}

impl Harness {
    /// Waits for an alert about `incident` at `webhook`; returns its description.
    pub async fn alert_about(&self, webhook: &wiremock::MockServer, incident: &str) -> String {
        self.wait_until(|| async {
            webhook
                .received_requests()
                .await
                .unwrap_or_default()
                .into_iter()
                .map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).unwrap())
                .find(|alert| alert["incident_key"] == incident)
                .map(|alert| alert["description"].as_str().unwrap().to_owned())
        })
        .await
    }
}

/// The whole store at one index.
pub struct Snapshot {
    pub index: u64,
    values: BTreeMap<String, Vec<u8>>,
}

impl From<Listing> for Snapshot {
    fn from(listing: Listing) -> Snapshot {
        let values = listing
            .pairs
            .into_iter()
            .map(|pair| (pair.key, pair.value.to_vec()))
            .collect();
        Snapshot {
            index: listing.index,
            values,
        }
    }
}

impl Snapshot {
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.values.get(key).map(Vec::as_slice)
    }

    /// The stored RC document, if the RC exists.
    pub fn rc(&self, id: &str) -> Option<serde_json::Value> {
        let doc = self.get(&format!("replication_controllers/{id}"))?;
        Some(serde_json::from_slice(doc).unwrap())
    }

    /// Every pod's labels, and whether it runs its intended manifest and passes.
    pub fn pods(&self) -> Vec<(Labels, bool)> {
        self.values
            .range("labels/pod/".to_owned()..)
            .take_while(|(key, _)| key.starts_with("labels/pod/"))
            .map(|(key, value)| {
                let labels: Labels = serde_json::from_slice(value).unwrap_or_default();
                let rest = key.strip_prefix("labels/pod/").unwrap();
                let (node, pod_id) = rest.split_once('/').unwrap();
                let reality = self.get(&format!("reality/{rest}"));
                let intent = self.get(&format!("intent/{rest}"));
                let passing = self
                    .get(&format!("health/{pod_id}/{node}"))
                    .is_some_and(|h| String::from_utf8_lossy(h).contains("\"passing\""));
                (labels, passing && reality.is_some() && reality == intent)
            })
            .collect()
    }

    /// How many pods the RC's label names, and how many of them are healthy.
    pub fn rc_pods(&self, id: &str) -> (usize, usize) {
        let pods: Vec<bool> = self
            .pods()
            .into_iter()
            .filter(|(labels, _)| {
                labels.get("replication_controller_id").map(String::as_str) == Some(id)
            })
            .map(|(_, healthy)| healthy)
            .collect();
        (pods.len(), pods.iter().filter(|h| **h).count())
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.tasks.close();
    }
}
