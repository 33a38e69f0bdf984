//! The farms' view of the store: the server's [`Mirror`] (one blocking watch per tree, each
//! entry decoded once, when it changes), shaped as the maps the farms read. A [`World`] is
//! updated tree by tree, only for the trees that changed since the last one, and only in the
//! entries that changed. Its maps are persistent ([`imbl::OrdMap`]): a new world shares all
//! but the changed paths with the one before, so a farm holding the previous world costs
//! no copy, and catching up costs the changes, not the fleet. The pod trees and health, the
//! largest, are the mirror's own persistent entries ([`PodEntries`], [`HealthResults`]),
//! read by node and pod id.
//!
//! The mirror re-reads each tree on its own schedule, so on its own it may show a change of
//! one tree before an earlier change of another (a pod's new reality before the removal of
//! its old health result). A farm must not act on such a mix, so [`Trees::world`] first
//! waits until every tree it reads holds every change up to the newest the mirror shows (a
//! tree that holds nothing showing the index it came to hold nothing, see
//! [`Mirror::changed_index`]; and [`Mirror::wait_for_trees`]), once per new index, shared by
//! all the farms.

use std::any::Any;
use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use imbl::{OrdMap, OrdSet};
use tokio::sync::watch;

use crate::interner::NAMES;
use crate::labels::{CompactLabels, LabelType, Selector, DS_ID_LABEL, RC_ID_LABEL};
use crate::layout;
use crate::model::{HealthState, StoredDaemonSet, StoredRc, StoredRoll};
use crate::state::{self, Entries, Entry, Mirror, TreeSnapshot, View};
use crate::store::labels::LabelRecord;

/// How long [`Trees::world`] waits for the trees to catch up with each other before it
/// says so in the log and tries again; the farms never act on trees known to be behind.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(2);

/// How long [`Trees::world`] pauses before trying again when the trees did not catch up
/// (a store error answers at once: never spin).
const CATCH_UP_RETRY: Duration = Duration::from_millis(250);

/// A node and a pod id: the identity of a legacy pod (`intent/<node>/<pod_id>`). Shared
/// strings, so that the trees and the indexes derived from them copy pointers, not text.
pub type PodKey = (Arc<str>, Arc<str>);

/// The [`PodKey`] of pod `pod_id` on `node`.
pub fn pod_key(node: &str, pod_id: &str) -> PodKey {
    (node.into(), pod_id.into())
}

pub use crate::store::Versioned;

/// A document as the mirror decoded it (shared, not copied), at its modify index.
pub type Shared<T> = Versioned<Arc<T>>;

/// One tree, decoded: what the farms read instead of the store.
#[derive(Debug, Default)]
pub struct Tree<T> {
    /// The highest index the tree's entries reflect, as the mirror had it.
    pub index: u64,
    pub items: T,
    /// Indexes derived from `items` on first use, by name, kept as long as the tree: a pass
    /// asks the same question of every object it owns, so each is answered once per change
    /// of the tree instead of once per object.
    memo: Mutex<HashMap<String, Arc<dyn Any + Send + Sync>>>,
}

impl<T> Tree<T> {
    pub fn new(index: u64, items: T) -> Tree<T> {
        Tree {
            index,
            items,
            memo: Mutex::default(),
        }
    }

    /// What `derive` makes of the items, made once per `name`.
    fn memo<V: Any + Send + Sync>(&self, name: &str, derive: impl FnOnce(&T) -> V) -> Arc<V> {
        if let Some(known) = self
            .memo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            if let Ok(known) = known.clone().downcast::<V>() {
                return known;
            }
        }
        let derived = Arc::new(derive(&self.items));
        self.memo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned(), derived.clone());
        derived
    }
}

/// Decoded trees, by what they map. Documents and mirror entries are the mirror's own,
/// shared: building a tree copies pointers, and a world costs little beside the mirror.
pub type RcMap = OrdMap<String, Shared<StoredRc>>;
pub type RollMap = OrdMap<String, Shared<StoredRoll>>;
pub type DaemonSetMap = OrdMap<String, Shared<StoredDaemonSet>>;
/// Label entries (read through [`World::node_labels`]).
pub type NodeMap = OrdMap<String, Arc<Entry>>;
pub type LockMap = OrdMap<String, Versioned<Option<String>>>;
/// The RCs whose manifest runs each pod id, sorted.
pub type RcsByPod = OrdMap<String, OrdSet<String>>;
/// The pods carrying each value of one label key, sorted.
pub type PodsByValue = OrdMap<String, OrdSet<PodKey>>;

/// One of the mirror's trees of pods (`<prefix><node>/<pod_id>`: intent, reality, pod
/// labels), read by node and pod id. The mirror's own entries, not a copy: these trees hold
/// an entry per pod.
#[derive(Debug, Clone, Default)]
pub struct PodEntries {
    prefix: String,
    /// Intent and reality hold legacy pods only: UUID-named entries there are new-style
    /// pod indexes.
    legacy_only: bool,
    entries: Entries,
}

impl PodEntries {
    /// The pods of `tree`, one of intent, reality and pod labels, in `entries`.
    pub fn new(tree: state::Tree, entries: Entries) -> PodEntries {
        PodEntries {
            prefix: tree.prefix(),
            legacy_only: tree != state::Tree::Labels(LabelType::Pod),
            entries,
        }
    }

    /// The entry of `pod`.
    pub fn get(&self, (node, pod_id): &PodKey) -> Option<&Arc<Entry>> {
        self.get_at(node, pod_id)
    }

    /// The entry of pod `pod_id` on `node`, for a caller that holds no [`PodKey`] of it.
    pub fn get_at(&self, node: &str, pod_id: &str) -> Option<&Arc<Entry>> {
        if self.legacy_only && is_uuid(pod_id) {
            return None;
        }
        self.entries.get(&format!("{}{node}/{pod_id}", self.prefix))
    }

    /// Every pod as (node, pod id), with its entry.
    pub fn iter(&self) -> impl Iterator<Item = ((&str, &str), &Arc<Entry>)> {
        self.entries.under(&self.prefix).filter_map(|entry| {
            let pod = pod_name(&entry.pair.key[self.prefix.len()..])?;
            (!self.legacy_only || !is_uuid(pod.1)).then_some((pod, entry))
        })
    }
}

/// The health results (`health/<pod_id>/<node>`), read by pod: the mirror's own entries,
/// not a copy, since the tree holds an entry per pod. P2 takes a result as the health of
/// the node its record names, which a hand-written record may give otherwise than its key:
/// those few are also kept by the pod they name, updated change by change.
#[derive(Debug, Clone, Default)]
pub struct HealthResults {
    entries: Entries,
    /// The results whose record names another node than their key, by the pod they name,
    /// each by key.
    misfiled: OrdMap<PodKey, OrdMap<String, HealthState>>,
}

impl HealthResults {
    /// The results in `entries` (the mirror's health tree).
    pub fn new(entries: Entries) -> HealthResults {
        let mut by_pod: OrdMap<PodKey, OrdMap<String, HealthState>> = OrdMap::new();
        for (pod, key, state) in entries.values().filter_map(misfiled) {
            by_pod.entry(pod).or_default().insert(key, state);
        }
        HealthResults {
            entries,
            misfiled: by_pod,
        }
    }

    /// The results of the health tree's `snapshot`: from `was`, by the keys that changed,
    /// when the snapshot names them.
    fn update(was: &HealthResults, snapshot: &TreeSnapshot) -> HealthResults {
        let Some(changed) = &snapshot.changed else {
            return HealthResults::new(snapshot.entries.clone());
        };
        let mut misfiled_now = was.misfiled.clone();
        for key in changed {
            if let Some((pod, key, _)) = was.entries.get(key).and_then(misfiled) {
                if let Some(by_key) = misfiled_now.get_mut(&pod) {
                    by_key.remove(&key);
                    if by_key.is_empty() {
                        misfiled_now.remove(&pod);
                    }
                }
            }
            if let Some((pod, key, state)) = snapshot.entries.get(key).and_then(misfiled) {
                misfiled_now.entry(pod).or_default().insert(key, state);
            }
        }
        HealthResults {
            entries: snapshot.entries.clone(),
            misfiled: misfiled_now,
        }
    }

    /// The health result of `pod`, if there is one: of the results naming it, the last by
    /// key, which is the one a read of the whole tree in key order keeps.
    pub fn get(&self, pod: &PodKey) -> Option<HealthState> {
        let (node, pod_id) = pod;
        let key = layout::health(pod_id, node);
        let filed = self.entries.get(&key).and_then(|entry| {
            let (named, state) = health_result(node, entry);
            (named == &**node).then_some((key.as_str(), state))
        });
        let misfiled = self.misfiled.get(pod).and_then(|by_key| {
            let (key, state) = by_key.get_max()?;
            Some((key.as_str(), *state))
        });
        filed
            .into_iter()
            .chain(misfiled)
            .max_by_key(|(key, _)| *key)
            .map(|(_, state)| state)
    }
}

/// The node a health entry is the result for (its record's `Node`, else its key's node
/// `node_of_key`) and its state (unknown when the record cannot be read).
fn health_result<'a>(node_of_key: &'a str, entry: &'a Entry) -> (&'a str, HealthState) {
    match entry.health() {
        Some(record) if !record.node.is_empty() => (&record.node, record.status),
        Some(record) => (node_of_key, record.status),
        None => (node_of_key, HealthState::Unknown),
    }
}

/// A health entry whose record names another node than its key: the pod it names, its key
/// and its state.
fn misfiled(entry: &Arc<Entry>) -> Option<(PodKey, String, HealthState)> {
    let named = entry.health_named_elsewhere()?;
    let rest = entry.pair.key.strip_prefix(layout::HEALTH)?;
    let (pod_id, _) = pod_name(rest)?;
    let pod = (NAMES.text(named), NAMES.text(pod_id));
    let (_, state) = health_result(named, entry);
    Some((pod, entry.pair.key.clone(), state))
}

/// The label keys the farms find pods by (an RC's pods, a daemon set's): every world
/// indexes its pods by their values.
pub const INDEXED_POD_LABELS: [&str; 2] = [RC_ID_LABEL, DS_ID_LABEL];

/// Everything the farms look at, as of the mirror when it was taken.
#[derive(Clone, Default)]
pub struct World {
    /// The RCs, with their index by pod id ([`World::rcs_running`]).
    pub rcs: IndexedRcs,
    pub rolls: Arc<Tree<RollMap>>,
    pub daemon_sets: Arc<Tree<DaemonSetMap>>,
    /// Node label entries by node, those that cannot be read too ([`World::node_unreadable`]).
    pub nodes: Arc<Tree<NodeMap>>,
    /// Pod labels by (node, pod id), the entry's index the CAS token of label writes, with
    /// their index by the value of each of [`INDEXED_POD_LABELS`] ([`World::pods_by_label`]).
    pub pod_labels: IndexedPodLabels,
    /// Intended manifests (raw bytes) by (node, pod id).
    pub intents: Arc<Tree<PodEntries>>,
    /// Manifests the nodes report running, by (node, pod id).
    pub reality: Arc<Tree<PodEntries>>,
    /// Health by (node, pod id).
    pub health: Arc<Tree<HealthResults>>,
    /// Lock keys under `lock/`, the session holding each (`None` when free) and their index.
    pub locks: Arc<Tree<LockMap>>,
    /// The index up to which every tree of the world holds every change: an object it does
    /// not show was gone at that index, but one a key elsewhere written past it names (a
    /// conditions record another leader wrote) may simply not have reached the world yet.
    pub caught_up: u64,
}

impl World {
    /// The manifest `pod` is intended to run (raw bytes).
    pub fn intent(&self, pod: &PodKey) -> Option<&[u8]> {
        Some(&self.intents.items.get(pod)?.pair.value)
    }

    /// The manifest `pod`'s node reports running (raw bytes).
    pub fn reality_of(&self, pod: &PodKey) -> Option<&[u8]> {
        Some(&self.reality.items.get(pod)?.pair.value)
    }

    /// The labels of `pod`.
    pub fn pod_labels_of(&self, pod: &PodKey) -> Option<&CompactLabels> {
        self.pod_labels.items().get(pod)?.labels()
    }

    /// The labels of `pod` at their index (empty at 0 when it has none), for a CAS write.
    pub fn pod_label_record(&self, pod: &PodKey) -> LabelRecord {
        self.pod_labels
            .items()
            .get(pod)
            .and_then(|entry| {
                Some(LabelRecord {
                    value: entry.labels()?.to_labels(),
                    index: entry.pair.modify_index,
                })
            })
            .unwrap_or_default()
    }

    /// Whether `node` has a label key that holds no label set: no selector can tell whether
    /// it matches the node.
    pub fn node_unreadable(&self, node: &str) -> bool {
        self.nodes
            .items
            .get(node)
            .is_some_and(|entry| entry.labels().is_none())
    }

    /// Every node with its labels.
    pub fn node_labels(&self) -> impl Iterator<Item = (&String, &CompactLabels)> {
        labelled(&self.nodes.items)
    }

    /// Every node with its labels and the index they were last written at.
    pub fn node_label_records(&self) -> impl Iterator<Item = (&str, &CompactLabels, u64)> {
        let nodes = self.nodes.items.iter();
        nodes.filter_map(|(node, entry)| {
            Some((node.as_str(), entry.labels()?, entry.pair.modify_index))
        })
    }

    /// The RCs whose manifest runs `pod_id`, sorted by id.
    pub fn rcs_running<'a>(
        &'a self,
        pod_id: &str,
    ) -> impl Iterator<Item = (&'a String, &'a Shared<StoredRc>)> {
        self.rcs.running(pod_id)
    }

    /// The pods labelled `key=value`, sorted; `key` is one of [`INDEXED_POD_LABELS`].
    pub fn pods_labelled(&self, key: &str, value: &str) -> Vec<PodKey> {
        let pods = self.pods_by_label(key).get(value);
        pods.map(|pods| pods.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The pods that have label `key`, by its value; `key` is one of
    /// [`INDEXED_POD_LABELS`].
    pub fn pods_by_label(&self, key: &str) -> &PodsByValue {
        self.pod_labels.by_label(key)
    }

    /// The nodes whose labels `selector` (parsed from `text`) matches.
    pub fn nodes_matching(&self, text: &str, selector: &Selector) -> Arc<BTreeSet<String>> {
        self.nodes.memo(&format!("selector {text}"), |nodes| {
            labelled(nodes)
                .filter(|(_, labels)| selector.matches(*labels))
                .map(|(node, _)| node.clone())
                .collect()
        })
    }

    /// The nodes intended to run a legacy pod of id `pod_id`.
    pub fn nodes_running(&self, pod_id: &str) -> Option<Arc<BTreeSet<Arc<str>>>> {
        let by_pod = self.intents.memo("by pod id", |intents| {
            let mut by_pod: HashMap<Arc<str>, Arc<BTreeSet<Arc<str>>>> = HashMap::new();
            for ((node, pod_id), _) in intents.iter() {
                let nodes = by_pod.entry(NAMES.text(pod_id)).or_default();
                Arc::make_mut(nodes).insert(NAMES.text(node));
            }
            by_pod
        });
        by_pod.get(pod_id).cloned()
    }

    /// The ids of the rolls naming RC `rc_id` as their old or new RC, sorted: found once
    /// per change of the roll tree, so that each roll of a pass finds those sharing its RCs
    /// without looking at every other roll.
    pub fn rolls_over(&self, rc_id: &str) -> Option<Arc<BTreeSet<String>>> {
        let by_rc = self.rolls.memo("by rc", |rolls| {
            let mut by_rc: HashMap<String, Arc<BTreeSet<String>>> = HashMap::new();
            for (id, roll) in rolls.iter() {
                for rc in [&roll.value.old_rc, &roll.value.new_rc] {
                    Arc::make_mut(by_rc.entry(rc.clone()).or_default()).insert(id.clone());
                }
            }
            by_rc
        });
        by_rc.get(rc_id).cloned()
    }

    /// How many pods each node is intended to run; used to spread new pods.
    pub fn load_by_node(&self) -> HashMap<&str, usize> {
        let mut load = HashMap::new();
        for ((node, _), _) in self.intents.items.iter() {
            *load.entry(node).or_insert(0) += 1;
        }
        load
    }

    /// The lock keys under `prefix`, sorted, with the session holding each.
    pub fn locks_under<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, Option<&'a str>)> + 'a {
        self.locks
            .items
            .range::<_, str>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(key, _)| key.starts_with(prefix))
            .map(|(key, lock)| (key.as_str(), lock.value.as_deref()))
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
        HealthState::of(self.health.items.get(pod))
    }
}

/// The label sets of label entries, by key.
fn labelled(entries: &NodeMap) -> impl Iterator<Item = (&String, &CompactLabels)> {
    entries
        .iter()
        .filter_map(|(key, entry)| Some((key, entry.labels()?)))
}

/// The farms' window on the mirror: the latest [`World`] and what woke them.
#[derive(Clone)]
pub struct Trees {
    mirror: Mirror,
    changes: watch::Receiver<u64>,
    /// The latest world, shared by the clones so that each change is decoded once for all
    /// the farms.
    built: Arc<Mutex<Built>>,
    /// How far the followed trees have caught up with each other; shared by the clones, so
    /// one farm's wait serves all.
    caught_up: Arc<Mutex<CaughtUp>>,
}

/// The newest index every followed tree is known to hold all changes up to, and the
/// mirror's epoch in which the trees were found to: once the store went backwards, the
/// trees read again hold nothing of it, whatever the fresh store's indexes (a restored
/// store's may be at or past it).
#[derive(Default)]
struct CaughtUp {
    epoch: u64,
    index: u64,
}

impl CaughtUp {
    /// The index the trees read in `epoch` are known to have caught up to.
    fn of(&self, epoch: u64) -> u64 {
        if self.epoch == epoch {
            self.index
        } else {
            0
        }
    }

    /// Notes that the trees read in `epoch` hold every change up to `index`.
    fn raise(&mut self, epoch: u64, index: u64) {
        if epoch > self.epoch {
            *self = CaughtUp { epoch, index };
        } else if epoch == self.epoch {
            self.index = self.index.max(index);
        }
    }
}

/// A world and the generation of each mirror tree it was built from, by position in
/// [`Trees::FOLLOWED`].
#[derive(Default)]
struct Built {
    world: World,
    from: [Option<u64>; 9],
}

impl Trees {
    /// The mirror's trees the farms read.
    pub(crate) const FOLLOWED: [state::Tree; 9] = [
        state::Tree::Rcs,
        state::Tree::Rolls,
        state::Tree::DaemonSets,
        state::Tree::Labels(LabelType::Node),
        state::Tree::Labels(LabelType::Pod),
        state::Tree::Intent,
        state::Tree::Reality,
        state::Tree::Health,
        state::Tree::Locks,
    ];

    /// A view of `mirror`, which must be started (and is best loaded, see
    /// [`Mirror::loaded`]).
    pub fn new(mirror: Mirror) -> Trees {
        Trees {
            changes: mirror.changes(),
            mirror,
            built: Arc::default(),
            caught_up: Arc::default(),
        }
    }

    /// The mirror as it is now, marking it seen, once the trees have caught up with each
    /// other (`CATCH_UP_LIMIT` at a time, tried again until they have: the farms never act
    /// on trees known to be behind). A tree has caught up once it holds every change up to
    /// the store's index for it: the server's own writes are in it at once, but they do not
    /// tell that another writer's earlier change has arrived, so a tree the server wrote
    /// has caught up once its watch has read past the write. What comes in during a wait (a
    /// daemon set edited while the health results were being caught up with) is waited for
    /// in turn. A tree out of touch with the store (its watch failing, or its read overdue)
    /// is asked of the store whatever the other trees' indexes, and waited for if it moved:
    /// nothing else tells that it missed a change (a pod gone critical, while no other tree
    /// moves), and a roll would step on the health it last saw. After the store's index
    /// went backwards, no world is built until every tree is read again (until then a tree
    /// holds the old store's entries), and the trees are caught up with each other again
    /// from the fresh store's indexes, whatever the old store's were (a restored store's
    /// may be at or past them; see `Mirror::epoch`). A world is made of trees all read
    /// since the store last went backwards, and made again if it went backwards while the
    /// world waited or was built. After an own write of unknown outcome, every tree
    /// catches up with the store as it is ([`Mirror::settle`]). A lock the farms took is in
    /// the lock tree before its watch lists it: every tree is caught up to its index too,
    /// so that the object it holds is acted on from a world that holds what its previous
    /// holder wrote ([`crate::farms::FarmContext::claim`]). The index a world must be
    /// caught up to is read once it is built, so that a listing that lands while the trees
    /// settle is waited for rather than taken in alone.
    pub async fn world(&mut self) -> World {
        let mut warned = false;
        loop {
            // Read before the trees are: what they caught up to in another epoch is of
            // another store, and a world is returned only if it has not moved since (else
            // it may hold trees read again beside trees not read again yet, which hold the
            // old store's entries).
            let epoch = self.mirror.current_epoch();
            self.mirror.read_again(&Trees::FOLLOWED).await;
            let out_of_touch = !self.mirror.out_of_touch_among(&Trees::FOLLOWED).is_empty();
            let settled = self.mirror.settle(&Trees::FOLLOWED, CATCH_UP_LIMIT).await;
            // The world is built before the index it must be caught up to is read, and
            // checked against what the trees had caught up to before it was built: a
            // listing landing in between (during the settling, say) is then waited for, not
            // taken into a world ahead of an earlier change of another tree.
            let caught_up = self.caught_up().of(epoch);
            let mut world = self.current();
            // A tree that holds nothing counts at the index it came to hold nothing, not at
            // its latest listing (on Consul, the whole store's index): caught up to that,
            // the other trees that hold nothing would list newer still, round after round,
            // while anything anywhere is written.
            let changed = self.mirror.changed_index(&Trees::FOLLOWED);
            // A lock the farms took (or let go) is in the lock tree at once: every tree is
            // caught up to it before a farm acts on the object it holds (see `claim`).
            let newest = changed.max(self.mirror.tree_index(state::Tree::Locks));
            if !self.mirror.in_epoch(epoch) {
                continue;
            }
            if settled && newest <= caught_up && !out_of_touch {
                world.caught_up = caught_up;
                return world;
            }
            if !settled
                || !self
                    .mirror
                    .wait_for_trees(&Trees::FOLLOWED, newest, CATCH_UP_LIMIT)
                    .await
            {
                // The store went backwards, which ends the waits at once: start again, from
                // the trees read again and the fresh store's indexes.
                if !self.mirror.in_epoch(epoch) {
                    continue;
                }
                // A tree known to be behind the others (its watch failing or slow): acting
                // on the mix could place a pod twice (an RC seen without the pods another
                // writer placed for it), and no CAS of the farms' would catch it. Wait.
                if !warned {
                    tracing::warn!(
                        newest,
                        "the mirror's trees have not caught up with each other; the farms wait"
                    );
                    warned = true;
                }
                tokio::time::sleep(CATCH_UP_RETRY).await;
                continue;
            }
            self.caught_up().raise(epoch, newest);
            if out_of_touch {
                // Still out of touch, but holding all the store had when asked.
                let mut world = self.current();
                if self.mirror.in_epoch(epoch) {
                    world.caught_up = newest;
                    return world;
                }
            }
        }
    }

    /// How far the trees have caught up, shared by the clones.
    fn caught_up(&self) -> std::sync::MutexGuard<'_, CaughtUp> {
        self.caught_up.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The mirror as it is now, marking it seen; only the trees that changed are updated,
    /// and only in the entries that changed.
    fn current(&mut self) -> World {
        self.changes.borrow_and_update();
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        let Built { world, from } = &mut *built;
        for (position, tree) in Trees::FOLLOWED.into_iter().enumerate() {
            let known = from[position];
            // The pod trees are the mirror's entries as they are: they need not know the
            // keys that changed.
            let snapshot = match tree {
                state::Tree::Intent | state::Tree::Reality => {
                    self.mirror.entries_snapshot(tree, known)
                }
                _ => self.mirror.snapshot(tree, known),
            };
            let Some(snapshot) = snapshot else {
                continue;
            };
            match tree {
                state::Tree::Rcs => world.rcs.update(&snapshot),
                state::Tree::Rolls => update(&mut world.rolls, &snapshot, uuid_id, shared(roll_of)),
                state::Tree::DaemonSets => update(
                    &mut world.daemon_sets,
                    &snapshot,
                    uuid_id,
                    shared(daemon_set_of),
                ),
                state::Tree::Labels(LabelType::Node) => {
                    update(&mut world.nodes, &snapshot, node_name, every_entry)
                }
                state::Tree::Labels(LabelType::Pod) => world.pod_labels.update(&snapshot),
                state::Tree::Intent => world.intents = pod_tree(&snapshot),
                state::Tree::Reality => world.reality = pod_tree(&snapshot),
                state::Tree::Health => {
                    let results = HealthResults::update(&world.health.items, &snapshot);
                    world.health = Arc::new(Tree::new(snapshot.index, results));
                }
                state::Tree::Locks => update(&mut world.locks, &snapshot, lock_key, lock),
                state::Tree::Labels(_)
                | state::Tree::DsStatus
                | state::Tree::Events
                | state::Tree::Meta
                | state::Tree::RollHistory
                | state::Tree::Conditions => {}
            }
            from[position] = Some(snapshot.generation);
        }
        world.clone()
    }

    /// Waits until the mirror has changed since the last [`Trees::world`].
    pub async fn changed(&mut self) {
        if self.changes.changed().await.is_err() {
            // The mirror lives as long as `self`, so this is never reached; never spin.
            std::future::pending::<()>().await;
        }
    }
}

/// Brings `tree` to the mirror's `snapshot` of it: each entry's item is keyed by `key_of`
/// its key (without the tree's prefix; `None`: no item) and made by `value_of` the entry
/// (`None`: no item). From the changed entries only, when the snapshot names them: the map
/// is persistent, so its previous version, which a farm may hold, is left as it was at the
/// cost of the changed paths alone.
fn update<K: Ord + Clone, V: Clone>(
    tree: &mut Arc<Tree<OrdMap<K, V>>>,
    snapshot: &TreeSnapshot,
    key_of: impl Fn(&str) -> Option<K>,
    value_of: impl Fn(&Arc<Entry>) -> Option<V>,
) {
    let prefix = snapshot.tree.prefix();
    let key_of = |key: &str| key_of(key.strip_prefix(&prefix)?);
    let items = match &snapshot.changed {
        None => snapshot
            .entries
            .values()
            .filter_map(|entry| Some((key_of(&entry.pair.key)?, value_of(entry)?)))
            .collect(),
        Some(changed) => {
            let mut items = tree.items.clone();
            for key in changed {
                let Some(item_key) = key_of(key) else {
                    continue;
                };
                match snapshot.entries.get(key).and_then(&value_of) {
                    Some(value) => items.insert(item_key, value),
                    None => items.remove(&item_key),
                };
            }
            items
        }
    };
    *tree = Arc::new(Tree::new(snapshot.index, items));
}

/// The world's RCs and their index by pod id, kept in step here alone: indexed whole when
/// made ([`IndexedRcs::new`]) and brought to each of the mirror's snapshots change by change,
/// never the one changed without the other.
#[derive(Clone, Default)]
pub struct IndexedRcs {
    tree: Arc<Tree<RcMap>>,
    /// The RCs by their manifest's pod id.
    by_pod: RcsByPod,
}

impl IndexedRcs {
    /// `rcs`, indexed.
    pub fn new(rcs: Arc<Tree<RcMap>>) -> IndexedRcs {
        let by_pod = index_rcs(&rcs.items);
        IndexedRcs { tree: rcs, by_pod }
    }

    /// The RCs by id.
    pub fn items(&self) -> &RcMap {
        &self.tree.items
    }

    /// The RCs whose manifest runs `pod_id`, sorted by id.
    pub fn running<'a>(
        &'a self,
        pod_id: &str,
    ) -> impl Iterator<Item = (&'a String, &'a Shared<StoredRc>)> {
        let ids = self.by_pod.get(pod_id).into_iter().flatten();
        ids.filter_map(|id| Some((id, self.tree.items.get(id)?)))
    }

    /// Brings the RCs, and their index by pod id, to the mirror's `snapshot`.
    fn update(&mut self, snapshot: &TreeSnapshot) {
        let was = self.tree.clone();
        update(&mut self.tree, snapshot, uuid_id, shared(rc_of));
        let Some(changed) = &snapshot.changed else {
            self.by_pod = index_rcs(&self.tree.items);
            return;
        };
        let prefix = snapshot.tree.prefix();
        for id in changed
            .iter()
            .filter_map(|key| uuid_id(key.strip_prefix(&prefix)?))
        {
            if let Some(rc) = was.items.get(&id) {
                let pod_id = rc.value.manifest.pod_id();
                if let Some(ids) = self.by_pod.get_mut(pod_id) {
                    ids.remove(&id);
                    if ids.is_empty() {
                        self.by_pod.remove(pod_id);
                    }
                }
            }
            if let Some(rc) = self.tree.items.get(&id) {
                let pod_id = rc.value.manifest.pod_id().to_owned();
                self.by_pod.entry(pod_id).or_default().insert(id);
            }
        }
    }
}

/// The RCs of `rcs` by their manifest's pod id.
fn index_rcs(rcs: &RcMap) -> RcsByPod {
    let mut index = RcsByPod::new();
    for (id, rc) in rcs {
        let pod_id = rc.value.manifest.pod_id().to_owned();
        index.entry(pod_id).or_default().insert(id.clone());
    }
    index
}

/// The pod tree of the mirror's `snapshot`.
fn pod_tree(snapshot: &TreeSnapshot) -> Arc<Tree<PodEntries>> {
    let pods = PodEntries::new(snapshot.tree, snapshot.entries.clone());
    Arc::new(Tree::new(snapshot.index, pods))
}

/// The pods of `pods` by the value of each of [`INDEXED_POD_LABELS`].
fn index_pods(pods: &PodEntries) -> [PodsByValue; 2] {
    let mut indexes = <[PodsByValue; 2]>::default();
    for ((node, pod_id), entry) in pods.iter() {
        if let Some(labels) = entry.labels() {
            let pod = (NAMES.text(node), NAMES.text(pod_id));
            index_pod(&mut indexes, &pod, labels);
        }
    }
    indexes
}

/// The world's pod labels and their index by the value of each of [`INDEXED_POD_LABELS`],
/// kept in step here alone: indexed whole when made ([`IndexedPodLabels::new`]) and brought
/// to each of the mirror's snapshots change by change, never the one changed without the
/// other.
#[derive(Clone, Default)]
pub struct IndexedPodLabels {
    tree: Arc<Tree<PodEntries>>,
    /// The pods by the value of each of [`INDEXED_POD_LABELS`], in that order.
    by_label: [PodsByValue; 2],
}

impl IndexedPodLabels {
    /// `pods` (the pod-label tree), indexed.
    pub fn new(pods: Arc<Tree<PodEntries>>) -> IndexedPodLabels {
        let by_label = index_pods(&pods.items);
        IndexedPodLabels {
            tree: pods,
            by_label,
        }
    }

    /// The pods' label entries by (node, pod id).
    pub fn items(&self) -> &PodEntries {
        &self.tree.items
    }

    /// The pods that have label `key`, by its value; `key` is one of
    /// [`INDEXED_POD_LABELS`].
    pub fn by_label(&self, key: &str) -> &PodsByValue {
        let position = INDEXED_POD_LABELS
            .iter()
            .position(|indexed| *indexed == key);
        &self.by_label[position.expect("pods are looked up by an indexed label")]
    }

    /// Brings the pod labels, and their index, to the mirror's `snapshot`.
    fn update(&mut self, snapshot: &TreeSnapshot) {
        let now = pod_tree(snapshot);
        match &snapshot.changed {
            Some(changed) => reindex(&mut self.by_label, &self.tree.items, &now.items, changed),
            None => self.by_label = index_pods(&now.items),
        }
        self.tree = now;
    }
}

/// Brings `indexes` of the pod-label tree `was` to `now`, the keys `changed` between them.
fn reindex(indexes: &mut [PodsByValue; 2], was: &PodEntries, now: &PodEntries, changed: &[String]) {
    let prefix = state::Tree::Labels(LabelType::Pod).prefix();
    for key in changed {
        let Some(pod) = key.strip_prefix(&prefix).and_then(split_pod) else {
            continue;
        };
        if let Some(labels) = was.entries.get(key).and_then(|entry| entry.labels()) {
            unindex_pod(indexes, &pod, labels);
        }
        if let Some(labels) = now.entries.get(key).and_then(|entry| entry.labels()) {
            index_pod(indexes, &pod, labels);
        }
    }
}

/// Adds `pod` with its `labels` to `indexes`.
fn index_pod(indexes: &mut [PodsByValue; 2], pod: &PodKey, labels: &CompactLabels) {
    for (index, key) in indexes.iter_mut().zip(INDEXED_POD_LABELS) {
        if let Some(value) = labels.get(key) {
            index
                .entry(value.to_owned())
                .or_default()
                .insert(pod.clone());
        }
    }
}

/// Removes `pod`, which had `labels`, from `indexes`.
fn unindex_pod(indexes: &mut [PodsByValue; 2], pod: &PodKey, labels: &CompactLabels) {
    for (index, key) in indexes.iter_mut().zip(INDEXED_POD_LABELS) {
        let Some(value) = labels.get(key) else {
            continue;
        };
        let Some(pods) = index.get_mut(value) else {
            continue;
        };
        pods.remove(pod);
        if pods.is_empty() {
            index.remove(value);
        }
    }
}

/// RCs, rolls and daemon sets are keyed by UUID.
fn uuid_id(id: &str) -> Option<String> {
    is_uuid(id).then(|| id.to_owned())
}

/// A document with its modify index; `view` picks the document.
fn shared<T>(view: fn(&View) -> Option<&Arc<T>>) -> impl Fn(&Arc<Entry>) -> Option<Shared<T>> {
    move |entry| {
        Some(Versioned {
            value: view(&entry.view)?.clone(),
            index: entry.pair.modify_index,
        })
    }
}

fn rc_of(view: &View) -> Option<&Arc<StoredRc>> {
    match view {
        View::Rc(rc) => Some(rc),
        _ => None,
    }
}

fn roll_of(view: &View) -> Option<&Arc<StoredRoll>> {
    match view {
        View::Roll(roll) => Some(roll),
        _ => None,
    }
}

fn daemon_set_of(view: &View) -> Option<&Arc<StoredDaemonSet>> {
    match view {
        View::DaemonSet(ds) => Some(ds),
        _ => None,
    }
}

fn node_name(node: &str) -> Option<String> {
    Some(node.to_owned())
}

/// Any entry, whatever it holds.
fn every_entry(entry: &Arc<Entry>) -> Option<Arc<Entry>> {
    Some(entry.clone())
}

/// `<node>/<pod_id>` as (node, pod id).
fn pod_name(rest: &str) -> Option<(&str, &str)> {
    let (node, pod_id) = rest.split_once('/')?;
    if node.is_empty() || pod_id.is_empty() || pod_id.contains('/') {
        return None;
    }
    Some((node, pod_id))
}

fn split_pod(rest: &str) -> Option<PodKey> {
    let (node, pod_id) = pod_name(rest)?;
    Some((NAMES.text(node), NAMES.text(pod_id)))
}

fn is_uuid(id: &str) -> bool {
    uuid::Uuid::parse_str(id).is_ok()
}

/// Lock keys are full keys.
fn lock_key(rest: &str) -> Option<String> {
    Some(format!("{}{rest}", state::Tree::Locks.prefix()))
}

/// The session holding a lock.
fn lock(entry: &Arc<Entry>) -> Option<Versioned<Option<String>>> {
    Some(Versioned {
        value: entry.pair.session().map(str::to_owned),
        index: entry.pair.modify_index,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvPair, TxnOp};
    use crate::store::rcs::RcStore;

    fn entry(tree: state::Tree, key: &str, value: &str, index: u64) -> Arc<Entry> {
        let pair = KvPair {
            key: format!("{}{key}", tree.prefix()),
            value: value.as_bytes().into(),
            create_index: index,
            modify_index: index,
            lock: None,
        };
        Arc::new(tree.decode(pair))
    }

    /// `tree` at `index` holding `entries`, the keys `changed` (below the tree's prefix)
    /// named as changed since the generation before.
    fn snapshot(
        tree: state::Tree,
        index: u64,
        entries: &[&Arc<Entry>],
        changed: Option<&[&str]>,
    ) -> TreeSnapshot {
        TreeSnapshot {
            tree,
            generation: index,
            index,
            entries: entries.iter().map(|entry| Arc::clone(entry)).collect(),
            changed: changed.map(|keys| {
                keys.iter()
                    .map(|key| format!("{}{key}", tree.prefix()))
                    .collect()
            }),
        }
    }

    /// The farms take an RC's id from its key, as the API does, whatever its document names
    /// (another id, or none): a roll's step wrote such an RC at the id its document named,
    /// where its version never matched, so that the roll never moved.
    #[test]
    fn an_rcs_id_is_its_keys_whatever_its_document_names() {
        let id = "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11";
        for named in ["0c8e2f4b-6f2d-4c1e-9a57-5a0e3b8c7d11", ""] {
            let document =
                format!(r#"{{"id":"{named}","manifest":"id: a\n","replicas_desired":1}}"#);
            let rc = entry(state::Tree::Rcs, id, &document, 1);
            let mut tree: Arc<Tree<RcMap>> = Arc::default();
            let whole = snapshot(state::Tree::Rcs, 1, &[&rc], None);
            update(&mut tree, &whole, uuid_id, shared(rc_of));
            let held = &tree.items[id].value;
            assert_eq!(held.id, id, "named {named:?}");
            let TxnOp::Cas { key, .. } = RcStore::write_op(held, 1) else {
                panic!("an RC's write is a check-and-set");
            };
            assert_eq!(key, layout::rc(id));
        }
    }

    #[test]
    fn an_update_by_changes_makes_the_tree_a_whole_build_would_and_leaves_the_old_one_alone() {
        let nodes = state::Tree::Labels(LabelType::Node);
        let node =
            |name, role, index| entry(nodes, name, &format!(r#"{{"role":"{role}"}}"#), index);
        let unreadable = entry(nodes, "n0", "not json", 1);
        let (a, b, c) = (
            node("n1", "web", 1),
            node("n2", "web", 1),
            node("n3", "db", 1),
        );
        let mut tree: Arc<Tree<NodeMap>> = Arc::default();
        let whole = snapshot(nodes, 1, &[&unreadable, &a, &b, &c], None);
        update(&mut tree, &whole, node_name, every_entry);
        assert_eq!(
            tree.items.keys().collect::<Vec<_>>(),
            ["n0", "n1", "n2", "n3"]
        );
        let held = tree.clone();

        // `n1` relabelled, `n2` deleted, `n4` added; `n3` and the unreadable `n0` unchanged.
        let (a2, d) = (node("n1", "db", 2), node("n4", "web", 2));
        let now = [&unreadable, &a2, &c, &d];
        let changes = snapshot(nodes, 2, &now, Some(&["n1", "n2", "n4"]));
        update(&mut tree, &changes, node_name, every_entry);
        let mut rebuilt: Arc<Tree<NodeMap>> = Arc::default();
        update(
            &mut rebuilt,
            &snapshot(nodes, 2, &now, None),
            node_name,
            every_entry,
        );
        assert_eq!(tree.index, 2);
        assert_eq!(tree.items, rebuilt.items);
        assert!(Arc::ptr_eq(&tree.items["n3"], &c));

        assert_eq!(held.index, 1);
        assert_eq!(
            held.items.keys().collect::<Vec<_>>(),
            ["n0", "n1", "n2", "n3"]
        );
        assert!(Arc::ptr_eq(&held.items["n1"], &a));
    }

    #[test]
    fn a_pod_tree_is_read_by_node_and_pod_id_and_intents_hold_legacy_pods_only() {
        let uuid = "00000000-0000-4000-8000-000000000001";
        let intents = [
            entry(state::Tree::Intent, &format!("n1/{uuid}"), "x", 1),
            entry(state::Tree::Intent, "n1/a", "a", 1),
            entry(state::Tree::Intent, "n2/a", "b", 1),
        ];
        let pods = PodEntries::new(state::Tree::Intent, intents.iter().cloned().collect());
        let found = |node, pod_id| pods.get(&pod_key(node, pod_id)).map(|e| &*e.pair.value);
        assert_eq!(found("n2", "a"), Some(b"b".as_slice()));
        assert_eq!(found("n1", uuid), None);
        assert_eq!(found("n3", "a"), None);
        let listed: Vec<(&str, &str)> = pods.iter().map(|(pod, _)| pod).collect();
        assert_eq!(listed, [("n1", "a"), ("n2", "a")]);

        let labels = state::Tree::Labels(LabelType::Pod);
        let labelled = entry(labels, &format!("n1/{uuid}"), "{}", 1);
        let pods = PodEntries::new(labels, [labelled].into_iter().collect());
        assert!(pods.get(&pod_key("n1", uuid)).is_some());
    }

    #[test]
    fn health_is_read_by_the_node_a_record_names_and_follows_changes_as_a_whole_read_would() {
        let tree = state::Tree::Health;
        let result = |key_node: &str, named: &str, state: HealthState, index| {
            let record = crate::model::HealthRecord::new("p", named, state, std::time::UNIX_EPOCH);
            let value = String::from_utf8(record.to_json()).unwrap();
            entry(tree, &format!("p/{key_node}"), &value, index)
        };
        let filed = result("n1", "n1", HealthState::Passing, 1);
        let unnamed = result("n2", "", HealthState::Critical, 1);
        let misfiled = result("n3", "n4", HealthState::Passing, 1);
        let own = result("n4", "n4", HealthState::Warning, 1);
        let later = result("n5", "n4", HealthState::Critical, 1);
        let unreadable = entry(tree, "p/n6", "not json", 1);
        let all = [&filed, &unnamed, &misfiled, &own, &later, &unreadable];
        let pods: Vec<PodKey> = (1..=7).map(|n| pod_key(&format!("n{n}"), "p")).collect();
        let states = |results: &HealthResults| -> Vec<Option<HealthState>> {
            pods.iter().map(|pod| results.get(pod)).collect()
        };
        let whole = HealthResults::new(snapshot(tree, 1, &all, None).entries);
        use HealthState::*;
        // n4 has three results naming it: the last by key (n5's) counts.
        assert_eq!(
            states(&whole),
            [
                Some(Passing),
                Some(Critical),
                None,
                Some(Critical),
                None,
                Some(Unknown),
                None
            ]
        );

        // n5's result goes and n3's turns to name n3: n4's own is then the last.
        let renamed = result("n3", "n3", HealthState::Warning, 2);
        let now = [&filed, &unnamed, &renamed, &own, &unreadable];
        let changes = snapshot(tree, 2, &now, Some(&["p/n3", "p/n5"]));
        let updated = HealthResults::update(&whole, &changes);
        let rebuilt = HealthResults::new(snapshot(tree, 2, &now, None).entries);
        assert_eq!(states(&updated), states(&rebuilt));
        assert_eq!(
            states(&updated),
            [
                Some(Passing),
                Some(Critical),
                Some(Warning),
                Some(Warning),
                None,
                Some(Unknown),
                None
            ]
        );
        assert!(updated.misfiled.is_empty());
        assert_eq!(states(&whole)[3], Some(Critical), "the old results changed");
    }

    #[test]
    fn the_index_of_rcs_by_pod_id_follows_the_changes_as_a_whole_index_would() {
        let tree = state::Tree::Rcs;
        let rc = |id: &str, pod_id: &str, index| {
            let document =
                format!(r#"{{"id":"{id}","manifest":"id: {pod_id}\n","replicas_desired":1}}"#);
            entry(tree, id, &document, index)
        };
        let ids = [
            "00000000-0000-4000-8000-000000000001",
            "00000000-0000-4000-8000-000000000002",
            "00000000-0000-4000-8000-000000000003",
        ];
        fn running(world: &World, pod_id: &str) -> Vec<String> {
            world
                .rcs_running(pod_id)
                .map(|(id, _)| id.clone())
                .collect()
        }
        let (a, b, c) = (
            rc(ids[0], "web", 1),
            rc(ids[1], "web", 1),
            rc(ids[2], "db", 1),
        );
        let mut world = World::default();
        world.rcs.update(&snapshot(tree, 1, &[&a, &b, &c], None));
        assert_eq!(running(&world, "web"), [ids[0], ids[1]]);

        // The first RC goes, the second turns to run db.
        let b2 = rc(ids[1], "db", 2);
        world
            .rcs
            .update(&snapshot(tree, 2, &[&b2, &c], Some(&[ids[0], ids[1]])));
        assert_eq!(world.rcs.by_pod, index_rcs(world.rcs.items()));
        assert!(running(&world, "web").is_empty());
        assert_eq!(running(&world, "db"), [ids[1], ids[2]]);
    }

    #[test]
    fn the_pod_label_index_follows_the_changes_as_a_whole_index_would() {
        let tree = state::Tree::Labels(LabelType::Pod);
        let pod = |key, rc: &str, index| {
            entry(tree, key, &format!(r#"{{"{RC_ID_LABEL}":"{rc}"}}"#), index)
        };
        let (a, b, c) = (
            pod("n1/a", "rc1", 1),
            pod("n2/a", "rc1", 1),
            pod("n3/c", "rc2", 1),
        );
        let mut world = World::default();
        world
            .pod_labels
            .update(&snapshot(tree, 1, &[&a, &b, &c], None));
        assert_eq!(world.pods_labelled(RC_ID_LABEL, "rc1").len(), 2);

        // `n2/a` moves to rc2, `n1/a` goes, `n4/d` comes.
        let (b2, d) = (pod("n2/a", "rc2", 2), pod("n4/d", "rc1", 2));
        let changed = ["n1/a", "n2/a", "n4/d"];
        world
            .pod_labels
            .update(&snapshot(tree, 2, &[&b2, &c, &d], Some(&changed)));
        assert_eq!(
            world.pod_labels.by_label,
            index_pods(world.pod_labels.items())
        );
        assert_eq!(
            world.pods_labelled(RC_ID_LABEL, "rc1"),
            [pod_key("n4", "d")]
        );
        assert_eq!(
            world.pods_labelled(RC_ID_LABEL, "rc2"),
            [pod_key("n2", "a"), pod_key("n3", "c")]
        );
    }
}
