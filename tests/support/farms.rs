//! A store with the leader campaign and the farms running on it, and helpers to arrange and
//! observe state behind their back.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use p2_apiserver::farms::{self, alerts::Alerter};
use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{Cas, KvStore, SessionBehavior};
use p2_apiserver::labels::{LabelType, Labels};
use p2_apiserver::leader::{self, LeaderConfig};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A pod manifest every test can use.
pub const MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_1.tar.gz\n";

/// How long a test waits for the farms to converge before failing.
pub const CONVERGE: Duration = Duration::from_secs(20);

pub struct Harness {
    pub store: Arc<dyn KvStore>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// An empty store with one server campaigning (and so leading) on it.
    pub async fn start() -> Harness {
        Self::start_with_alerts(None).await
    }

    /// Like [`Harness::start`], with alerts posted to `webhook`.
    pub async fn start_with_alerts(webhook: Option<String>) -> Harness {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("farms.db").display().to_string();
        let store: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
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
        tasks.spawn(leader::campaign(
            store.clone(),
            config,
            shutdown.clone(),
            move |term| farms::run_term(farm_store.clone(), term, alerts.clone(), "test".into()),
        ));
        Harness {
            store,
            shutdown,
            tasks,
            _dir: dir,
        }
    }

    pub async fn label(&self, label_type: LabelType, id: &str, labels: serde_json::Value) {
        let key = label_type.label_key(id);
        self.store
            .put(&key, labels.to_string().as_bytes(), Cas::Any)
            .await
            .unwrap();
    }

    /// Stores an RC document as given (plus a fresh id) and returns the id.
    pub async fn put_rc(&self, mut doc: serde_json::Value) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        doc["id"] = id.clone().into();
        let key = format!("replication_controllers/{id}");
        self.store
            .put(&key, doc.to_string().as_bytes(), Cas::Index(0))
            .await
            .unwrap();
        id
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

    pub async fn pod_labels(&self, node: &str, pod_id: &str) -> Labels {
        let key = LabelType::Pod.label_key(&format!("{node}/{pod_id}"));
        let pair = self.store.get(&key).await.unwrap().unwrap();
        serde_json::from_slice(&pair.value).unwrap()
    }

    pub async fn intent(&self, node: &str, pod_id: &str) -> Option<String> {
        let pair = self
            .store
            .get(&format!("intent/{node}/{pod_id}"))
            .await
            .unwrap()?;
        Some(String::from_utf8(pair.value).unwrap())
    }

    /// The nodes whose pod labels name the RC, sorted.
    pub async fn rc_nodes(&self, id: &str) -> Vec<String> {
        let listing = self.store.list("labels/pod/").await.unwrap();
        let mut nodes: Vec<String> = listing
            .pairs
            .iter()
            .filter(|pair| {
                let labels: Labels = serde_json::from_slice(&pair.value).unwrap_or_default();
                labels.get("replication_controller_id").map(String::as_str) == Some(id)
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
            if let Some(value) = check().await {
                return value;
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "the farms did not converge"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Harness {
    /// Plays every node's agent: each intended pod is reported running (reality = intent)
    /// and passing after `delay`; pods no longer intended lose their reality and health.
    pub fn run_fake_nodes(&self, delay: Duration) {
        let store = self.store.clone();
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            let mut seen: std::collections::HashMap<String, tokio::time::Instant> = Default::default();
            while !shutdown.is_cancelled() {
                let intents = store.list("intent/").await.unwrap();
                let mut live = std::collections::HashSet::new();
                for pair in &intents.pairs {
                    let rest = pair.key.strip_prefix("intent/").unwrap().to_owned();
                    live.insert(rest.clone());
                    let first = *seen.entry(rest.clone()).or_insert_with(tokio::time::Instant::now);
                    let reality = format!("reality/{rest}");
                    let current = store.get(&reality).await.unwrap();
                    if first.elapsed() >= delay && current.map(|p| p.value) != Some(pair.value.clone()) {
                        let (node, pod_id) = rest.split_once('/').unwrap();
                        store.put(&reality, &pair.value, Cas::Any).await.unwrap();
                        let health = serde_json::json!({"Id": pod_id, "Node": node, "Service": pod_id,
                            "Status": "passing", "Time": "2026-01-01T00:00:00Z", "Expires": "2126-01-01T00:00:00Z"});
                        store.put(&format!("health/{pod_id}/{node}"), health.to_string().as_bytes(), Cas::Any).await.unwrap();
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
    pub async fn healthy_by_rc(&self) -> std::collections::HashMap<String, usize> {
        let mut healthy = std::collections::HashMap::new();
        for (labels, passing) in self.pods_and_health().await {
            if let (Some(rc), true) = (labels.get("replication_controller_id"), passing) {
                *healthy.entry(rc.clone()).or_insert(0) += 1;
            }
        }
        healthy
    }

    /// Every pod's labels, and whether it runs its intended manifest and passes.
    async fn pods_and_health(&self) -> Vec<(Labels, bool)> {
        let mut pods = Vec::new();
        for pair in self.store.list("labels/pod/").await.unwrap().pairs {
            let labels: Labels = serde_json::from_slice(&pair.value).unwrap_or_default();
            let rest = pair.key.strip_prefix("labels/pod/").unwrap();
            let (node, pod_id) = rest.split_once('/').unwrap();
            let reality = self.store.get(&format!("reality/{rest}")).await.unwrap();
            let intent = self.store.get(&format!("intent/{rest}")).await.unwrap();
            let health = self
                .store
                .get(&format!("health/{pod_id}/{node}"))
                .await
                .unwrap();
            let passing =
                health.is_some_and(|h| String::from_utf8_lossy(&h.value).contains("\"passing\""));
            let runs_intent =
                reality.is_some() && reality.map(|r| r.value) == intent.map(|i| i.value);
            pods.push((labels, passing && runs_intent));
        }
        pods
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
        let key = format!("daemon_sets/{id}");
        let pair = self.store.get(&key).await.unwrap().unwrap();
        let mut doc: serde_json::Value = serde_json::from_slice(&pair.value).unwrap();
        change(&mut doc);
        self.store
            .put(
                &key,
                doc.to_string().as_bytes(),
                Cas::Index(pair.modify_index),
            )
            .await
            .unwrap();
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
        self.pods_and_health()
            .await
            .iter()
            .filter(|(labels, healthy)| {
                *healthy && labels.get(key).map(String::as_str) == Some(value)
            })
            .count()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.tasks.close();
    }
}
