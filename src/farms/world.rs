//! The farms' shared view of the store: one blocking watch per tree, decoded once per change
//! and shared by every reconciler, so idle load does not grow with the number of objects.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::kv::{KvPair, KvStore, Listing, StoreResult, WatchTarget};
use crate::labels::{LabelType, Labels};
use crate::model::{HealthRecord, HealthState, StoredDaemonSet, StoredRc, StoredRoll};
use crate::store::labels::decode_labels;

/// How long one blocking query of a tree waits: the farms' idle request rate is the number
/// of trees divided by this.
pub const TREE_WAIT: Duration = Duration::from_secs(60);

/// A node and a pod id: the identity of a legacy pod (`intent/<node>/<pod_id>`).
pub type PodKey = (String, String);

pub use crate::store::Versioned;

/// One tree, decoded: what the farms read instead of the store.
#[derive(Debug, Default)]
pub struct Tree<T> {
    /// The listing index this was decoded from.
    pub index: u64,
    pub items: T,
}

/// Decoded trees, by what they map.
pub type RcMap = BTreeMap<String, Versioned<StoredRc>>;
pub type RollMap = BTreeMap<String, Versioned<StoredRoll>>;
pub type DaemonSetMap = BTreeMap<String, Versioned<StoredDaemonSet>>;
pub type NodeMap = BTreeMap<String, Labels>;
pub type PodLabelMap = BTreeMap<PodKey, Versioned<Labels>>;
pub type ManifestMap = BTreeMap<PodKey, Vec<u8>>;
pub type HealthMap = HashMap<PodKey, HealthState>;
pub type LockMap = BTreeMap<String, Versioned<Option<String>>>;
type Feed<T> = watch::Receiver<Arc<Tree<T>>>;

/// Everything the farms look at, as of the latest watch results.
#[derive(Clone)]
pub struct World {
    pub rcs: Arc<Tree<RcMap>>,
    pub rolls: Arc<Tree<RollMap>>,
    pub daemon_sets: Arc<Tree<DaemonSetMap>>,
    pub nodes: Arc<Tree<NodeMap>>,
    /// Pod labels by (node, pod id), with the label key's index for CAS writes.
    pub pod_labels: Arc<Tree<PodLabelMap>>,
    /// Intended manifests (raw bytes) by (node, pod id).
    pub intents: Arc<Tree<ManifestMap>>,
    /// Manifests the nodes report running, by (node, pod id).
    pub reality: Arc<Tree<ManifestMap>>,
    /// Health by (node, pod id).
    pub health: Arc<Tree<HealthMap>>,
    /// Lock keys under `lock/`, the session holding each (`None` when free) and their index.
    pub locks: Arc<Tree<LockMap>>,
}

impl World {
    /// The nodes running a pod labelled `key=value`, sorted.
    pub fn pods_labelled(&self, key: &str, value: &str) -> Vec<PodKey> {
        self.pod_labels
            .items
            .iter()
            .filter(|(_, labels)| labels.value.get(key).map(String::as_str) == Some(value))
            .map(|(pod, _)| pod.clone())
            .collect()
    }

    /// How many pods each node is intended to run; used to spread new pods.
    pub fn load_by_node(&self) -> HashMap<&str, usize> {
        let mut load = HashMap::new();
        for (node, _) in self.intents.items.keys() {
            *load.entry(node.as_str()).or_insert(0) += 1;
        }
        load
    }

    /// The lock keys `session` holds.
    pub fn held_by<'a>(&'a self, session: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.locks
            .items
            .iter()
            .filter(move |(_, lock)| lock.value.as_deref() == Some(session))
            .map(|(key, _)| key.as_str())
    }

    /// The session holding `key`, if any.
    pub fn lock_holder(&self, key: &str) -> Option<&str> {
        self.locks
            .items
            .get(key)
            .and_then(|lock| lock.value.as_deref())
    }

    /// The health state of a pod, by [`HealthState::of`].
    pub fn health_of(&self, pod: &PodKey) -> HealthState {
        HealthState::of(self.health.items.get(pod).copied())
    }
}

/// The receiving ends of the tree watches.
#[derive(Clone)]
pub struct Trees {
    rcs: Feed<RcMap>,
    rolls: Feed<RollMap>,
    daemon_sets: Feed<DaemonSetMap>,
    nodes: Feed<NodeMap>,
    pod_labels: Feed<PodLabelMap>,
    intents: Feed<ManifestMap>,
    reality: Feed<ManifestMap>,
    health: Feed<HealthMap>,
    locks: Feed<LockMap>,
}

impl Trees {
    /// Reads every tree once and starts watching each on `tasks` until `cancel`.
    pub async fn start(
        store: &Arc<dyn KvStore>,
        tasks: &TaskTracker,
        cancel: &CancellationToken,
    ) -> StoreResult<Trees> {
        Ok(Trees {
            rcs: follow(store, tasks, cancel, "replication_controllers/", decode_rcs).await?,
            rolls: follow(store, tasks, cancel, "rolls/", decode_rolls).await?,
            daemon_sets: follow(store, tasks, cancel, "daemon_sets/", decode_daemon_sets).await?,
            nodes: follow(store, tasks, cancel, "labels/node/", decode_nodes).await?,
            pod_labels: follow(store, tasks, cancel, "labels/pod/", decode_pod_labels).await?,
            intents: follow(store, tasks, cancel, "intent/", |l| {
                decode_pod_tree(l, "intent/")
            })
            .await?,
            reality: follow(store, tasks, cancel, "reality/", |l| {
                decode_pod_tree(l, "reality/")
            })
            .await?,
            health: follow(store, tasks, cancel, "health/", decode_health).await?,
            locks: follow(store, tasks, cancel, "lock/", decode_locks).await?,
        })
    }

    /// The latest decoded state of every tree, marking it seen.
    pub fn world(&mut self) -> World {
        World {
            rcs: self.rcs.borrow_and_update().clone(),
            rolls: self.rolls.borrow_and_update().clone(),
            daemon_sets: self.daemon_sets.borrow_and_update().clone(),
            nodes: self.nodes.borrow_and_update().clone(),
            pod_labels: self.pod_labels.borrow_and_update().clone(),
            intents: self.intents.borrow_and_update().clone(),
            reality: self.reality.borrow_and_update().clone(),
            health: self.health.borrow_and_update().clone(),
            locks: self.locks.borrow_and_update().clone(),
        }
    }

    /// Waits until any tree has changed since the last [`Trees::world`].
    pub async fn changed(&mut self) {
        tokio::select! {
            _ = self.rcs.changed() => {}
            _ = self.rolls.changed() => {}
            _ = self.daemon_sets.changed() => {}
            _ = self.nodes.changed() => {}
            _ = self.pod_labels.changed() => {}
            _ = self.intents.changed() => {}
            _ = self.reality.changed() => {}
            _ = self.health.changed() => {}
            _ = self.locks.changed() => {}
        }
    }
}

/// Lists `prefix`, then keeps a blocking watch on it, publishing each new listing decoded.
async fn follow<T, D>(
    store: &Arc<dyn KvStore>,
    tasks: &TaskTracker,
    cancel: &CancellationToken,
    prefix: &'static str,
    decode: D,
) -> StoreResult<Feed<T>>
where
    T: Send + Sync + 'static,
    D: Fn(&Listing) -> T + Send + 'static,
{
    let first = store.list(prefix).await?;
    let (tx, rx) = watch::channel(Arc::new(Tree {
        index: first.index,
        items: decode(&first),
    }));
    let (store, cancel) = (store.clone(), cancel.clone());
    tasks.spawn(async move {
        let target = WatchTarget::Prefix(prefix.into());
        let mut index = first.index;
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        loop {
            let result = tokio::select! {
                result = store.watch(&target, index, TREE_WAIT) => result,
                () = cancel.cancelled() => return,
            };
            match result {
                Ok(listing) => {
                    backoff.reset();
                    if listing.index != index {
                        index = listing.index;
                        let items = decode(&listing);
                        tx.send_replace(Arc::new(Tree { index, items }));
                    }
                }
                Err(e) => {
                    tracing::warn!(prefix, error = %e, "watching a tree failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                        () = cancel.cancelled() => return,
                    }
                }
            }
        }
    });
    Ok(rx)
}

fn strip<'a>(pair: &'a KvPair, prefix: &str) -> Option<&'a str> {
    pair.key.strip_prefix(prefix)
}

/// Decodes every document of a tree keyed by UUID, skipping (and logging) the bad ones.
fn decode_by_id<T>(
    listing: &Listing,
    prefix: &str,
    decode: impl Fn(&[u8]) -> Result<T, crate::model::DecodeError>,
) -> BTreeMap<String, Versioned<T>> {
    listing
        .decode_readable("document", |pair| {
            let id = strip(pair, prefix).unwrap_or(&pair.key);
            if uuid::Uuid::parse_str(id).is_err() {
                return Err(format!("{id:?} is not a UUID"));
            }
            let value = decode(&pair.value).map_err(|e| e.to_string())?;
            let versioned = Versioned {
                value,
                index: pair.modify_index,
            };
            Ok((id.to_owned(), versioned))
        })
        .into_iter()
        .collect()
}

fn decode_rcs(listing: &Listing) -> BTreeMap<String, Versioned<StoredRc>> {
    decode_by_id(listing, "replication_controllers/", StoredRc::from_json)
}

fn decode_rolls(listing: &Listing) -> BTreeMap<String, Versioned<StoredRoll>> {
    decode_by_id(listing, "rolls/", StoredRoll::from_json)
}

fn decode_daemon_sets(listing: &Listing) -> BTreeMap<String, Versioned<StoredDaemonSet>> {
    decode_by_id(listing, "daemon_sets/", StoredDaemonSet::from_json)
}

fn decode_nodes(listing: &Listing) -> BTreeMap<String, Labels> {
    let prefix = LabelType::Node.key_prefix();
    listing
        .pairs
        .iter()
        .filter_map(|pair| Some((strip(pair, &prefix)?.to_owned(), decode_labels(pair)?)))
        .collect()
}

fn split_pod(rest: &str) -> Option<PodKey> {
    let (node, pod_id) = rest.split_once('/')?;
    if node.is_empty() || pod_id.is_empty() || pod_id.contains('/') {
        return None;
    }
    Some((node.to_owned(), pod_id.to_owned()))
}

fn decode_pod_labels(listing: &Listing) -> BTreeMap<PodKey, Versioned<Labels>> {
    let prefix = LabelType::Pod.key_prefix();
    listing
        .pairs
        .iter()
        .filter_map(|pair| {
            let pod = split_pod(strip(pair, &prefix)?)?;
            let labels = decode_labels(pair)?;
            Some((
                pod,
                Versioned {
                    value: labels,
                    index: pair.modify_index,
                },
            ))
        })
        .collect()
}

/// `intent/` and `reality/`: legacy pods only; UUID-named entries are new-style pod indexes.
fn decode_pod_tree(listing: &Listing, prefix: &str) -> BTreeMap<PodKey, Vec<u8>> {
    listing
        .pairs
        .iter()
        .filter_map(|pair| {
            let pod = split_pod(strip(pair, prefix)?)?;
            (uuid::Uuid::parse_str(&pod.1).is_err()).then(|| (pod, pair.value.clone()))
        })
        .collect()
}

/// `health/<pod_id>/<node>`, keyed as (node, pod id) by the record's own fields.
fn decode_health(listing: &Listing) -> HashMap<PodKey, HealthState> {
    listing
        .pairs
        .iter()
        .filter_map(|pair| {
            let (pod_id, node) = split_pod(strip(pair, "health/")?)?;
            // P2 keys results by the record's own Node field.
            match HealthRecord::from_json(&pair.value) {
                Ok(record) if !record.node.is_empty() => {
                    Some(((record.node, pod_id), record.status))
                }
                Ok(record) => Some(((node, pod_id), record.status)),
                Err(_) => Some(((node, pod_id), HealthState::Unknown)),
            }
        })
        .collect()
}

fn decode_locks(listing: &Listing) -> LockMap {
    listing
        .pairs
        .iter()
        .map(|pair| {
            let lock = Versioned {
                value: pair.session.clone(),
                index: pair.modify_index,
            };
            (pair.key.clone(), lock)
        })
        .collect()
}

/// The prefix of every tree the farms watch; a tree is named by its prefix.
pub const TREE_PREFIXES: [&str; 9] = [
    "replication_controllers/",
    "rolls/",
    "daemon_sets/",
    "labels/node/",
    "labels/pod/",
    "intent/",
    "reality/",
    "health/",
    "lock/",
];

/// The watched tree a key belongs to, if any.
pub fn tree_of(key: &str) -> Option<&'static str> {
    TREE_PREFIXES
        .iter()
        .copied()
        .find(|prefix| key.starts_with(prefix))
}

impl World {
    /// The listing index a tree was decoded from.
    pub fn index_of(&self, tree: &str) -> u64 {
        match tree {
            "replication_controllers/" => self.rcs.index,
            "rolls/" => self.rolls.index,
            "daemon_sets/" => self.daemon_sets.index,
            "labels/node/" => self.nodes.index,
            "labels/pod/" => self.pod_labels.index,
            "intent/" => self.intents.index,
            "reality/" => self.reality.index,
            "health/" => self.health.index,
            "lock/" => self.locks.index,
            _ => 0,
        }
    }
}
