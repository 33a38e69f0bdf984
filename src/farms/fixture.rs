//! Worlds built by hand, for unit tests of the farms' plans.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use imbl::OrdMap;

use crate::kv::KvPair;
use crate::labels::{LabelType, Labels, POD_ID_LABEL, RC_ID_LABEL};
use crate::model::{
    AllocationStrategy, HealthRecord, HealthState, Manifest, StoredDaemonSet, StoredRc, StoredRoll,
};
use crate::state::{self, Entry};

use super::world::{
    pod_key, HealthResults, IndexedPodLabels, IndexedRcs, PodEntries, PodKey, Shared, Tree,
    Versioned, World,
};

/// The trees of a [`World`], each filled as a test needs.
#[derive(Default)]
pub struct Fleet {
    pub rcs: BTreeMap<String, Versioned<StoredRc>>,
    pub rolls: BTreeMap<String, Versioned<StoredRoll>>,
    pub daemon_sets: BTreeMap<String, Versioned<StoredDaemonSet>>,
    pub nodes: BTreeMap<String, Labels>,
    /// Nodes whose label key holds something other than a label set.
    pub unreadable_nodes: BTreeMap<String, Vec<u8>>,
    pub labels: BTreeMap<PodKey, Versioned<Labels>>,
    pub intents: BTreeMap<PodKey, Vec<u8>>,
    pub reality: BTreeMap<PodKey, Vec<u8>>,
    pub health: HashMap<PodKey, HealthState>,
    pub locks: BTreeMap<String, Versioned<Option<String>>>,
}

/// `key=value` pairs as labels.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

impl Fleet {
    pub fn new() -> Fleet {
        Fleet::default()
    }

    /// A node labelled `role=<role>`.
    pub fn node(&mut self, name: &str, role: &str) -> &mut Self {
        self.unreadable_nodes.remove(name);
        self.nodes.insert(name.into(), labels(&[("role", role)]));
        self
    }

    /// A node whose label key holds no label set, as a tool writing garbage leaves it.
    pub fn unreadable_node(&mut self, name: &str) -> &mut Self {
        self.nodes.remove(name);
        self.unreadable_nodes
            .insert(name.into(), b"{not json".to_vec());
        self
    }

    /// Pod `pod_id` on `node` with `pod_labels`, intended and running `manifest`, whose
    /// health is `health` (`None`: no result).
    pub fn labelled_pod(
        &mut self,
        node: &str,
        pod_id: &str,
        pod_labels: &[(&str, &str)],
        manifest: &str,
        health: Option<HealthState>,
    ) -> &mut Self {
        let key = pod_key(node, pod_id);
        self.labels.insert(
            key.clone(),
            Versioned {
                value: labels(pod_labels),
                index: 1,
            },
        );
        self.intents.insert(key.clone(), manifest.into());
        self.reality.insert(key.clone(), manifest.into());
        match health {
            Some(state) => self.health.insert(key, state),
            None => self.health.remove(&key),
        };
        self
    }

    /// Lock `key` held by `session`.
    pub fn lock(&mut self, key: &str, session: &str) -> &mut Self {
        self.locks.insert(
            key.to_owned(),
            Versioned {
                value: Some(session.to_owned()),
                index: 7,
            },
        );
        self
    }

    pub fn world(&self) -> World {
        fn tree<T>(items: T) -> Arc<Tree<T>> {
            Arc::new(Tree::new(1, items))
        }
        fn shared<T: Clone>(
            documents: &BTreeMap<String, Versioned<T>>,
        ) -> OrdMap<String, Shared<T>> {
            documents
                .iter()
                .map(|(id, document)| (id.clone(), document.clone().map(Arc::new)))
                .collect()
        }
        fn manifests(tree: state::Tree, pods: &BTreeMap<PodKey, Vec<u8>>) -> PodEntries {
            let entries = pods
                .iter()
                .map(|(pod, raw)| entry(tree, &pod_name(pod), raw.clone(), 1));
            PodEntries::new(tree, entries.collect())
        }
        let node_labels = state::Tree::Labels(LabelType::Node);
        let pod_labels = state::Tree::Labels(LabelType::Pod);
        let pod_label_entries = self.labels.iter().map(|(pod, labels)| {
            let value = json(&labels.value);
            entry(pod_labels, &pod_name(pod), value, labels.index)
        });
        let pod_label_entries = PodEntries::new(pod_labels, pod_label_entries.collect());
        World {
            rcs: IndexedRcs::new(tree(shared(&self.rcs))),
            rolls: tree(shared(&self.rolls)),
            daemon_sets: tree(shared(&self.daemon_sets)),
            nodes: tree(
                self.nodes
                    .iter()
                    .map(|(node, labels)| (node.clone(), json(labels)))
                    .chain(self.unreadable_nodes.clone())
                    .map(|(node, raw)| {
                        let entry = entry(node_labels, &node, raw, 1);
                        (node, entry)
                    })
                    .collect(),
            ),
            pod_labels: IndexedPodLabels::new(tree(pod_label_entries)),
            intents: tree(manifests(state::Tree::Intent, &self.intents)),
            reality: tree(manifests(state::Tree::Reality, &self.reality)),
            health: tree(HealthResults::new(
                self.health
                    .iter()
                    .map(|((node, pod_id), state)| {
                        let record = HealthRecord::new(pod_id, node, *state, SystemTime::now());
                        let id = format!("{pod_id}/{node}");
                        entry(state::Tree::Health, &id, record.to_json(), 1)
                    })
                    .collect(),
            )),
            locks: tree(self.locks.clone().into_iter().collect()),
            // As far as its trees' own index.
            caught_up: 1,
        }
    }
}

/// A mirror entry of `tree` for object `id` (its key below the tree's prefix), decoded as
/// the mirror decodes it.
fn entry(tree: state::Tree, id: &str, value: Vec<u8>, index: u64) -> Arc<Entry> {
    let pair = KvPair {
        key: format!("{}{id}", tree.prefix()),
        value: value.into(),
        create_index: index,
        modify_index: index,
        lock: None,
    };
    Arc::new(tree.decode(pair))
}

/// `<node>/<pod_id>`, as pod keys name a pod.
fn pod_name((node, pod_id): &PodKey) -> String {
    format!("{node}/{pod_id}")
}

fn json(labels: &Labels) -> Vec<u8> {
    serde_json::to_vec(labels).expect("labels serialize")
}

/// Pod `hello`, version 1.
pub const HELLO_1: &str = "id: hello\nconfig: {version: 1}\n";
/// Pod `hello`, version 2.
pub const HELLO_2: &str = "id: hello\nconfig: {version: 2}\n";

/// An enabled RC running `manifest` on nodes matching `selector`.
pub fn rc(id: &str, manifest: &str, replicas: i64, selector: &str) -> StoredRc {
    StoredRc {
        id: id.into(),
        manifest: Manifest::parse(manifest).expect("a test manifest parses"),
        node_selector: selector.into(),
        pod_labels: None,
        replicas_desired: replicas,
        disabled: false,
        allocation_strategy: AllocationStrategy::Static,
    }
}

impl Fleet {
    /// Stores `rc` under its id at index `index`.
    pub fn put_rc(&mut self, rc: StoredRc, index: u64) -> &mut Self {
        self.rcs
            .insert(rc.id.clone(), Versioned { value: rc, index });
        self
    }

    /// Stores the roll `spec` under `id` at index `index`.
    pub fn put_roll(&mut self, id: &str, spec: StoredRoll, index: u64) -> &mut Self {
        let roll = Versioned { value: spec, index };
        self.rolls.insert(id.into(), roll);
        self
    }

    /// `rc`'s pod on `node`, labelled as the RC labels it, running its manifest.
    pub fn rc_pod(&mut self, rc: &str, node: &str, health: Option<HealthState>) -> &mut Self {
        let manifest = self.rcs[rc].value.manifest.clone();
        let pod_id = manifest.pod_id().to_owned();
        self.labelled_pod(
            node,
            &pod_id,
            &[(RC_ID_LABEL, rc), (POD_ID_LABEL, &pod_id)],
            manifest.raw(),
            health,
        )
    }
}

/// A term's context over an empty store of its own (kept in the returned directory), for a
/// pass over a world built by hand that writes nothing.
pub async fn idle_context() -> (tempfile::TempDir, super::FarmContext, crate::state::Mirror) {
    use crate::kv::sqlite::SqliteStore;
    use crate::kv::KvStore;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db").display().to_string();
    let store: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let mirror = crate::state::Mirror::new(store.clone(), crate::state::MirrorConfig::default());
    (dir, context(store), mirror)
}

/// A term's context over `store`, with sessions the store need not know (`term` for the
/// farms), for a pass over a world built by hand.
pub fn context(store: Arc<dyn crate::kv::KvStore>) -> super::FarmContext {
    let term = crate::leader::Term {
        leader_session: "leader".into(),
        session: "term".into(),
        cancel: tokio_util::sync::CancellationToken::new(),
    };
    let alerts = Arc::new(super::alerts::Alerter::new(None));
    super::FarmContext::new(store, &term, alerts, "me".into())
}

/// A term of `holder`'s over `store` (its leader session and its farms' session, named
/// after it, neither holding a lock yet) and the farms' context of it.
pub async fn term_over(
    store: &Arc<dyn crate::kv::KvStore>,
    holder: &str,
) -> (crate::leader::Term, super::FarmContext) {
    let session = |name: String| async move {
        let spec = crate::kv::SessionSpec::deleting(name, std::time::Duration::from_secs(60));
        store.create_session(&spec).await.unwrap()
    };
    let term = crate::leader::Term {
        leader_session: session(format!("{holder} leader")).await,
        session: session(format!("{holder} term")).await,
        cancel: tokio_util::sync::CancellationToken::new(),
    };
    let alerts = Arc::new(super::alerts::Alerter::new(None));
    let ctx = super::FarmContext::new(store.clone(), &term, alerts, holder.into());
    (term, ctx)
}

/// A store whose reads of one key fail as a store that did not answer, every other call
/// going to `inner`: for a farm's read that fails while its writes would not.
pub struct FailingGet {
    pub inner: Arc<dyn crate::kv::KvStore>,
    pub key: String,
}

#[async_trait::async_trait]
impl crate::kv::KvStore for FailingGet {
    async fn get(&self, key: &str) -> crate::kv::StoreResult<Option<KvPair>> {
        if key == self.key {
            return Err(crate::kv::StoreError::Unavailable(format!(
                "{key} unanswered"
            )));
        }
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> crate::kv::StoreResult<crate::kv::Listing> {
        self.inner.list(prefix).await
    }
    async fn keys(
        &self,
        prefix: &str,
        separator: Option<char>,
    ) -> crate::kv::StoreResult<(u64, Vec<String>)> {
        self.inner.keys(prefix, separator).await
    }
    async fn current_index(&self, probe: &str) -> crate::kv::StoreResult<Option<u64>> {
        self.inner.current_index(probe).await
    }
    async fn put(
        &self,
        key: &str,
        value: &[u8],
        cas: crate::kv::Cas,
    ) -> crate::kv::StoreResult<()> {
        self.inner.put(key, value, cas).await
    }
    async fn delete(&self, key: &str, cas: crate::kv::Cas) -> crate::kv::StoreResult<()> {
        self.inner.delete(key, cas).await
    }
    async fn delete_prefix(&self, prefix: &str) -> crate::kv::StoreResult<()> {
        self.inner.delete_prefix(prefix).await
    }
    fn key_prefix_len(&self) -> usize {
        self.inner.key_prefix_len()
    }
    async fn txn(&self, ops: &[crate::kv::TxnOp]) -> crate::kv::StoreResult<Vec<Option<KvPair>>> {
        self.inner.txn(ops).await
    }
    async fn create_session(
        &self,
        spec: &crate::kv::SessionSpec,
    ) -> crate::kv::StoreResult<String> {
        self.inner.create_session(spec).await
    }
    async fn renew_session(&self, id: &str) -> crate::kv::StoreResult<crate::kv::SessionInfo> {
        self.inner.renew_session(id).await
    }
    async fn destroy_session(&self, id: &str) -> crate::kv::StoreResult<()> {
        self.inner.destroy_session(id).await
    }
    async fn session_info(
        &self,
        id: &str,
    ) -> crate::kv::StoreResult<Option<crate::kv::SessionInfo>> {
        self.inner.session_info(id).await
    }
    async fn acquire(
        &self,
        key: &str,
        value: &[u8],
        session: &str,
    ) -> crate::kv::StoreResult<bool> {
        self.inner.acquire(key, value, session).await
    }
    async fn release(&self, key: &str, session: &str) -> crate::kv::StoreResult<bool> {
        self.inner.release(key, session).await
    }
    async fn watch(
        &self,
        target: &crate::kv::WatchTarget,
        index: u64,
        wait: std::time::Duration,
    ) -> crate::kv::StoreResult<crate::kv::Listing> {
        self.inner.watch(target, index, wait).await
    }
    async fn ping(&self) -> crate::kv::StoreResult<()> {
        self.inner.ping().await
    }
}
