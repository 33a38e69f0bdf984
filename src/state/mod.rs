//! An in-memory mirror of every P2 tree the server reads, kept current by one blocking watch
//! per tree, so that reads cost memory lookups instead of whole-tree reads of the store.
//!
//! Why: without it, every API read and every farm wake-up re-reads whole trees, so their
//! cost grows with the fleet rather than with the answer. The mirror reads each tree once,
//! then reads a tree again only when the store says it changed, at most once per
//! [`MirrorConfig::min_reread_interval`] unless a reader waits for it, taking in only what
//! changed where the store can say (else the tree whole), and decodes only the entries
//! whose modify index changed. What it holds:
//! - every entry of every tree in [`Tree::ALL`] with its create and modify index, and its
//!   typed view ([`View`]);
//! - secondary indexes: object ids by label (the pods of an RC, label selectors over a type),
//!   RCs by the pod id of their manifest; pods, intents and health by node come from key
//!   ranges, the entries being sorted by key;
//! - a change stream ([`Mirror::subscribe`]) for `GET /api/v1/watch`.
//!
//! Consistency: the mirror's index ([`Mirror::index`]) is the highest index it has applied.
//! The server's own writes are applied at once ([`Mirror::apply_own_writes`]), so a read
//! after a write through this server sees it; an answer claims them in its index only once
//! a listing has confirmed them ([`Mirror::listed_index`], [`Mirror::confirm`]), since an
//! own write can overtake another writer's earlier change; and an answer made of several
//! trees claims an index only once each holds every change up to it ([`Mirror::catch_up`]),
//! since each tree's watch delivers on its own. [`Mirror::wait_for`] holds a read (bounded)
//! until the mirror has reached an index, for writes it learns of from its watches. If the
//! store's index goes backwards (a store restarted empty or restored), every tree is
//! re-read, counting as loading until it is ([`Mirror::health`], [`Mirror::read_again`]),
//! and subscribers are told to start again ([`Signal::Resync`]). A tree whose watch
//! is failing, or whose read has gone unanswered past its wait, its last success longer ago
//! than [`MirrorConfig::lost_after`], makes [`Mirror::health`] report it; so does a store
//! that has answered none of the mirror's reads for that long, its heartbeats included.

mod changes;
mod data;
mod entries;
mod feed;
mod reader;
mod trees;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::kv::{KvPair, KvStore, Lock, PrefixUpdate, TxnOp, WatchTarget};
use crate::labels::{
    CompactLabels, LabelType, Labels, Operator, Selector, DS_ID_LABEL, RC_ID_LABEL,
};
use crate::layout;
use crate::model::event::Event;
use crate::model::json_may_hold;

pub use changes::{Change, ChangeType, Receiver, Signal};
pub use entries::Entries;
pub use reader::MirrorReader;
pub use trees::{object_id, Entry, HealthView, Kind, Tree, View};

use changes::Stream;
use data::{State, TreeState};

/// How the mirror follows the store and how much of its change stream it keeps.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    /// How long one blocking watch of a tree waits: the idle store load is the number of
    /// trees divided by this.
    pub watch_wait: Duration,
    /// The least time between two reads of one tree: under a storm of writes a tree is
    /// re-read at most this often, each read taking in every change since the last, unless
    /// a reader waits for the tree to catch up ([`Mirror::wait_for`], a farm's pass), which
    /// costs one read per wait.
    pub min_reread_interval: Duration,
    /// How long after its last success a failing tree watch (or one whose read has gone
    /// unanswered past its wait) makes [`Mirror::health`] report the mirror stale.
    pub lost_after: Duration,
    /// How often the mirror reads the store's index (its heartbeat), to learn that the store
    /// still answers and has not gone backwards: a store that takes requests and never
    /// answers them is then noticed after two such intervals, and lost after
    /// [`MirrorConfig::lost_after`] (at least the two intervals), and a store restored under
    /// waiting watches within one, rather than only once each watch's wait has run out.
    pub heartbeat_interval: Duration,
    /// How many changes the stream keeps for subscribers resuming from a position.
    pub retained_changes: usize,
    /// How many changes of one kind a subscriber may fall behind before it is cut off. A
    /// writer batch reaches the stream at once, so this leaves room for the largest the
    /// farms write: `CONCURRENT_OBJECTS` transactions of up to `MAX_TXN_OPS` ops, 8,192
    /// changes; a client is not slow for not having read those yet.
    pub subscriber_buffer: usize,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            watch_wait: Duration::from_secs(60),
            min_reread_interval: Duration::from_millis(250),
            lost_after: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(10),
            retained_changes: 10_000,
            subscriber_buffer: 8_192,
        }
    }
}

/// A write the server made itself, to apply to the mirror at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnWrite {
    /// The pair as now stored, with the indexes the store answered.
    Put(KvPair),
    /// The key is gone: no version of it written at or before index `through` is current
    /// any more. `None` when the store did not tell such an index: the mirror then leaves
    /// the delete to its watches.
    Delete { key: String, through: Option<u64> },
}

impl OwnWrite {
    /// The index of a successful transaction, as its writes answer it: `None` when it
    /// wrote no value, or when a write went unanswered (its pair is then not known).
    pub fn txn_index(ops: &[TxnOp], results: &[Option<KvPair>]) -> Option<u64> {
        ops.iter()
            .zip(results)
            .filter(|(op, _)| op.value().is_some())
            .map(|(_, result)| Some(result.as_ref()?.modify_index))
            .collect::<Option<Vec<u64>>>()?
            .into_iter()
            .max()
    }

    /// The writes of a successful transaction: each write op's key with the value it wrote
    /// and the indexes the store answered (reads and checks write nothing). A delete is
    /// known gone through the transaction's own index, which its other writes answer; in a
    /// transaction that only deletes, through the index a compare-and-delete named (the
    /// version it removed), and otherwise through no known index.
    pub fn from_txn(ops: &[TxnOp], results: &[Option<KvPair>]) -> Vec<OwnWrite> {
        let txn_index = Self::txn_index(ops, results);
        ops.iter()
            .zip(results)
            .filter_map(|(op, result)| match op {
                TxnOp::Delete { key } => Some(OwnWrite::Delete {
                    key: key.clone(),
                    through: txn_index,
                }),
                TxnOp::DeleteCas { key, index } => Some(OwnWrite::Delete {
                    key: key.clone(),
                    through: Some(txn_index.unwrap_or(*index)),
                }),
                TxnOp::Set { .. }
                | TxnOp::Cas { .. }
                | TxnOp::Lock { .. }
                | TxnOp::Unlock { .. } => {
                    let answered = result.as_ref()?;
                    let session = match op {
                        TxnOp::Lock { session, .. } => Some(session.clone()),
                        TxnOp::Unlock { .. } => None,
                        _ => answered.session().map(str::to_owned),
                    };
                    Some(OwnWrite::Put(KvPair {
                        key: op.key().to_owned(),
                        value: op.value().unwrap_or_default().into(),
                        lock: Lock::of(answered.lock_index(), session),
                        ..answered.clone()
                    }))
                }
                TxnOp::Get { .. }
                | TxnOp::CheckIndex { .. }
                | TxnOp::CheckNotExists { .. }
                | TxnOp::CheckSession { .. } => None,
            })
            .collect()
    }
}

/// One tree as the mirror held it at one moment.
#[derive(Debug, Clone)]
pub struct TreeSnapshot {
    pub tree: Tree,
    /// Moves on every change of the tree's entries.
    pub generation: u64,
    /// The highest index the entries reflect.
    pub index: u64,
    /// Every entry: the mirror's own, kept as they were at no cost.
    pub entries: Entries,
    /// The keys changed since the generation the reader knew, sorted, each once; `None`
    /// when it knew none, one too old to tell, or did not ask.
    pub changed: Option<Vec<String>>,
}

/// Whether the mirror can be trusted, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorHealth {
    /// The prefixes of trees not read yet (or not read again since the store's index went
    /// backwards).
    pub loading: Vec<String>,
    /// The prefixes of trees whose watch has failed for longer than the bound, and for how
    /// long.
    pub lost: Vec<(String, Duration)>,
    /// How long the store has gone without answering the mirror at all, once that is
    /// longer than the bound; every tree is then lost.
    pub silent: Option<Duration>,
}

impl MirrorHealth {
    /// Every tree is read and watched.
    pub fn is_healthy(&self) -> bool {
        self.loading.is_empty() && self.lost.is_empty()
    }
}

/// What the answers read from a tree depend on ([`Mirror::versions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeVersion {
    /// Moves on every change of the tree's entries.
    pub generation: u64,
    /// The index of the newest listing applied.
    pub listed: u64,
    /// Every change to the tree up to this index is in its entries.
    pub complete: u64,
    /// How many times the tree has been read whole (first, after a resync, after a failed
    /// read): such a read may leave the other three where they stood (the store had not
    /// moved) yet claim the tree's index anew, an empty tree's at the index of the read
    /// rather than the one it came to hold nothing at; and an answer built while a resync
    /// waits for it claims what a tree not read yet holds (nothing).
    pub whole_reads: u64,
}

/// What a blocking read has seen of its trees, by [`Mirror::seen`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// By tree asked for, its listed index: what its watch has shown.
    pub listed: Vec<u64>,
    /// By tree asked for, the index of its newest change (`TreeState::changed_index`: its
    /// listed index while it holds something). A tree whose watch lags holds the read's
    /// `X-Index` down while the others' move, and its own delivery moves only its own.
    pub changed: Vec<u64>,
    /// The index an answer made of the trees claims ([`Mirror::claimable_index`]).
    pub claimable: u64,
    /// By span asked for ([`Span`]).
    pub extents: Vec<Extent>,
    /// No own write in the trees is waiting for its watch's confirmation.
    pub confirmed: bool,
}

impl Seen {
    /// The read's `X-Index` ([`Mirror::claimable_index`]).
    pub fn index(&self) -> u64 {
        self.claimable
    }
}

/// What a blocking read waits for a change of, besides its trees' listed indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Span {
    /// Every key under a prefix.
    Prefix(String),
    /// One key, and no other that starts with it (a node's labels, not a longer name's).
    Key(String),
    /// The health results a node's pod listing shows (of one pod id, when given): the
    /// records of the pods intended on the node at their keys on it, and those at other keys
    /// that name the node (P2 takes a record as the result of the node it names). Health is
    /// keyed by pod id first, so no prefix holds one node's: a listing blocked on the whole
    /// tree would wake at every pod's report on every node.
    NodeHealth {
        node: String,
        pod_id: Option<String>,
    },
    /// The keys `<prefix><node>/<pod_id>` of the nodes one pod id is intended on, under
    /// `prefix` (the intent tree's, or the pod label tree's): what a pod id's listing shows.
    /// Intents are keyed by node first, so no prefix holds one pod id's: a listing blocked on
    /// the whole trees would wake at every change of every pod.
    PodIntents { prefix: String, pod_id: String },
    /// The events about one object. Events are keyed by time, so no prefix holds one
    /// object's: a listing blocked on the whole tree would wake at every event.
    ObjectEvents { object_id: String },
    /// The label sets of one type that hold one label: the pods an RC's status counts
    /// (`rc_id=<id>`), which no prefix holds.
    Labelled {
        label_type: LabelType,
        label: String,
        value: String,
    },
    /// What a roll's view counts of its two RCs, as named by the roll's document when the
    /// span is looked at (a change of the document is a change of the roll, which a read of
    /// it spans too): each RC, the pods labelled with either's id, what their nodes run and
    /// every health record of their pod ids. No prefix holds them: a read blocked on the
    /// whole trees would wake at every pod's report on every node.
    RollRcs { roll_id: String },
    /// What a daemon set's rollout status counts of its pods: the pods labelled with its id,
    /// the RCs their labels name (a pod an enabled RC holds too is not counted), their
    /// intents, what their nodes run and every health record of their pod ids. No prefix
    /// holds them, as for [`Span::RollRcs`].
    DaemonSetPods { ds_id: String },
    /// The label sets of one pod id on the nodes its health records name (by their keys or
    /// their `Node` fields): what a pod's health listing filters by a selector. Pod labels are
    /// keyed by node first, so no prefix holds one pod id's: a listing blocked on the whole
    /// tree would wake at every change of every pod's labels.
    ReportedPodLabels { pod_id: String },
}

/// The trees [`Span::RollRcs`] lies in.
const ROLL_RC_TREES: [Tree; 4] = [
    Tree::Rcs,
    Tree::Labels(LabelType::Pod),
    Tree::Reality,
    Tree::Health,
];

/// The trees [`Span::DaemonSetPods`] lies in.
const DS_POD_TREES: [Tree; 5] = [
    Tree::Rcs,
    Tree::Labels(LabelType::Pod),
    Tree::Intent,
    Tree::Reality,
    Tree::Health,
];

impl Span {
    /// What a blocking read served from the store watches for this span: the key of a
    /// [`Span::Key`] (not another that starts with it), else [`Span::prefixes`].
    pub fn targets(&self) -> Vec<WatchTarget> {
        match self {
            Span::Key(key) => vec![WatchTarget::Key(key.clone())],
            _ => self
                .prefixes()
                .into_iter()
                .map(WatchTarget::Prefix)
                .collect(),
        }
    }

    /// The prefixes whose index an answer read from the store for this span claims (a
    /// key's, as the prefix that holds it).
    pub fn prefixes(&self) -> Vec<String> {
        let prefix = match self {
            Span::Prefix(prefix) | Span::Key(prefix) => prefix.clone(),
            Span::NodeHealth { pod_id: None, .. } => layout::HEALTH.to_owned(),
            Span::NodeHealth {
                pod_id: Some(pod_id),
                ..
            } => layout::health_of_pod(pod_id),
            Span::PodIntents { prefix, .. } => prefix.clone(),
            Span::ObjectEvents { .. } => layout::EVENTS.to_owned(),
            Span::Labelled { label_type, .. } => layout::labels_of_type(*label_type),
            Span::ReportedPodLabels { .. } => layout::labels_of_type(LabelType::Pod),
            Span::RollRcs { .. } => {
                return ROLL_RC_TREES.iter().map(|tree| tree.prefix()).collect()
            }
            Span::DaemonSetPods { .. } => {
                return DS_POD_TREES.iter().map(|tree| tree.prefix()).collect()
            }
        };
        vec![prefix]
    }

    /// The tree the span lies in; `None` for a span of several ([`Span::pods`], which
    /// [`Mirror::changed_past`] tells apart).
    fn tree(&self) -> Option<Tree> {
        match self {
            Span::Prefix(key) | Span::Key(key) | Span::PodIntents { prefix: key, .. } => {
                Tree::of_key(key)
            }
            Span::NodeHealth { .. } => Some(Tree::Health),
            Span::ObjectEvents { .. } => Some(Tree::Events),
            Span::Labelled { label_type, .. } => Some(Tree::Labels(*label_type)),
            Span::ReportedPodLabels { .. } => Some(Tree::Labels(LabelType::Pod)),
            Span::RollRcs { .. } | Span::DaemonSetPods { .. } => None,
        }
    }

    /// The pods the span is made of as the mirror holds them now, for a span of several
    /// trees.
    fn pods(&self, state: &State) -> Option<Pods> {
        match self {
            Span::RollRcs { roll_id } => Some(Pods::of_roll(state, roll_id)),
            Span::DaemonSetPods { ds_id } => Some(Pods::of_daemon_set(state, ds_id)),
            _ => None,
        }
    }

    /// Whether a version of `entry`'s key, put or removed, may lie in the span (a superset:
    /// a health record at a key of `node` counts whether or not a pod is intended there).
    fn may_hold(&self, entry: &Entry) -> bool {
        let key = entry.pair.key.as_str();
        match self {
            Span::Prefix(prefix) => key.starts_with(prefix.as_str()),
            Span::Key(span_key) => key == span_key,
            Span::PodIntents { prefix, pod_id } => key
                .strip_prefix(prefix.as_str())
                .and_then(|rest| rest.split_once('/'))
                .is_some_and(|(_, of)| of == pod_id),
            Span::NodeHealth { node, pod_id } => {
                let Some((of, on)) = key
                    .strip_prefix(layout::HEALTH)
                    .and_then(|rest| rest.split_once('/'))
                else {
                    return false;
                };
                pod_id.as_deref().is_none_or(|pod_id| pod_id == of)
                    && (on == node || entry.health_named_elsewhere() == Some(node.as_str()))
            }
            Span::ObjectEvents { object_id } => is_event_of(entry, object_id),
            Span::Labelled { label, value, .. } => entry
                .labels()
                .is_some_and(|labels| labels.get(label) == Some(value)),
            Span::ReportedPodLabels { pod_id } => key
                .strip_prefix(&layout::labels_of_type(LabelType::Pod))
                .and_then(|rest| rest.split_once('/'))
                .is_some_and(|(_, of)| of == pod_id),
            // Told by `Pods::may_hold`, which looks at the mirror.
            Span::RollRcs { .. } | Span::DaemonSetPods { .. } => true,
        }
    }

    fn extent(&self, state: &State) -> Extent {
        match self {
            Span::Prefix(prefix) => extent(state, prefix),
            Span::Key(key) => match Tree::of_key(key) {
                Some(tree) => key_extent(state, tree, key),
                None => (0, 0),
            },
            Span::NodeHealth { node, pod_id } => node_health_extent(state, node, pod_id.as_deref()),
            Span::PodIntents { prefix, pod_id } => pod_intents_extent(state, prefix, pod_id),
            Span::ObjectEvents { object_id } => object_events_extent(state, object_id),
            Span::Labelled {
                label_type,
                label,
                value,
            } => labelled_extent(state, *label_type, label, value),
            Span::RollRcs { roll_id } => Pods::of_roll(state, roll_id).extent(state),
            Span::DaemonSetPods { ds_id } => Pods::of_daemon_set(state, ds_id).extent(state),
            Span::ReportedPodLabels { pod_id } => reported_pod_labels_extent(state, pod_id),
        }
    }
}

/// [`Span::RollRcs`] or [`Span::DaemonSetPods`] as the mirror holds it now: the pods a
/// label picks, and the RCs whose documents count.
struct Pods {
    /// The label that picks the pods, and the values it picks them by.
    label: &'static str,
    values: BTreeSet<String>,
    /// The RCs whose documents the span holds.
    rcs: BTreeSet<String>,
    /// The pods (`<node>/<pod_id>`) picked, an own delete of their labels not confirmed yet
    /// included.
    pods: BTreeSet<String>,
    /// The trees the span lies in.
    trees: &'static [Tree],
}

impl Pods {
    /// [`Span::RollRcs`]: the roll's RCs, and the pods labelled with either's id; none
    /// while the roll has no readable document (a finished roll's view shows its record).
    fn of_roll(state: &State, roll_id: &str) -> Pods {
        let mut rcs = BTreeSet::new();
        let roll = state.tree(Tree::Rolls).entries.get(&layout::roll(roll_id));
        if let Some(View::Roll(roll)) = roll.map(|entry| &entry.view) {
            rcs.insert(roll.old_rc.clone());
            rcs.insert(roll.new_rc.clone());
        }
        let pods = Pods::picked(state, RC_ID_LABEL, &rcs);
        Pods {
            label: RC_ID_LABEL,
            values: rcs.clone(),
            rcs,
            pods,
            trees: &ROLL_RC_TREES,
        }
    }

    /// [`Span::DaemonSetPods`]: the pods labelled with the daemon set's id, and the RCs
    /// their labels name.
    fn of_daemon_set(state: &State, ds_id: &str) -> Pods {
        let values = BTreeSet::from([ds_id.to_owned()]);
        let pods = Pods::picked(state, DS_ID_LABEL, &values);
        let labels = state.tree(Tree::Labels(LabelType::Pod));
        let rcs = pods.iter().filter_map(|pod| {
            let entry = labels.held_or_unconfirmed(&layout::labels(LabelType::Pod, pod))?;
            entry.labels()?.get(RC_ID_LABEL).map(str::to_owned)
        });
        Pods {
            label: DS_ID_LABEL,
            rcs: rcs.collect(),
            values,
            pods,
            trees: &DS_POD_TREES,
        }
    }

    /// The pods whose labels give `label` one of `values`, an own delete of their labels not
    /// confirmed yet included.
    fn picked(state: &State, label: &str, values: &BTreeSet<String>) -> BTreeSet<String> {
        let labels = state.tree(Tree::Labels(LabelType::Pod));
        let pod_labels = layout::labels_of_type(LabelType::Pod);
        let unconfirmed_deletes = labels
            .unconfirmed_deletes()
            .filter(|entry| {
                let value = entry.labels().and_then(|labels| labels.get(label));
                value.is_some_and(|value| values.contains(value))
            })
            .filter_map(|entry| entry.pair.key.strip_prefix(&pod_labels))
            .map(str::to_owned);
        let mut pods: BTreeSet<String> = unconfirmed_deletes.collect();
        for value in values {
            let term = (LabelType::Pod, label.to_owned(), value.clone());
            let ids = state.by_label.get(&term).into_iter().flatten();
            pods.extend(ids.map(|id| id.to_string()));
        }
        pods
    }

    /// The pod ids of [`Pods::pods`], each once.
    fn pod_ids(&self) -> BTreeSet<&str> {
        let ids = self.pods.iter().filter_map(|pod| pod.split_once('/'));
        ids.map(|(_, pod_id)| pod_id).collect()
    }

    /// Whether a version of `entry`'s key may lie in the span: an RC's document, a label
    /// set picked (the version replaced by a put is given too), a pod's intent or what its
    /// node runs, or a health record of a pod's id.
    fn may_hold(&self, entry: &Entry, pod_ids: &BTreeSet<&str>) -> bool {
        let key = entry.pair.key.as_str();
        if let Some(rc) = key.strip_prefix(layout::RCS) {
            return self.rcs.contains(rc);
        }
        if let Some(labels) = entry.labels() {
            let value = labels.get(self.label);
            return value.is_some_and(|value| self.values.contains(value));
        }
        let pod = key.strip_prefix(layout::INTENT);
        if let Some(pod) = pod.or_else(|| key.strip_prefix(layout::REALITY)) {
            return self.pods.contains(pod);
        }
        let pod_id = key
            .strip_prefix(layout::HEALTH)
            .and_then(|rest| rest.split_once('/'));
        pod_id.is_some_and(|(pod_id, _)| pod_ids.contains(pod_id))
    }

    /// Whether a version of anything in the span may have changed at an index past `index`,
    /// as [`Mirror::changed_past`] tells it. The span is looked at now: a pod picked then
    /// but not now (or now but not then) had its labels changed past `index`, and an RC its
    /// labels named then but not now too, which is a change of the span.
    fn changed_past(&self, state: &State, index: u64) -> bool {
        let pod_ids = self.pod_ids();
        self.trees.iter().any(|tree| {
            let Some(mut touched) = state.tree(*tree).journal.touched_past(index) else {
                return true;
            };
            touched.any(|entry| self.may_hold(entry, &pod_ids))
        })
    }

    /// Of every entry in the span (an own delete not confirmed yet included), how many and
    /// the highest modify index: an entry added to it by a change of what names it comes
    /// with that change, which moves the index.
    fn extent(&self, state: &State) -> Extent {
        let rcs = self
            .rcs
            .iter()
            .map(|rc| key_extent(state, Tree::Rcs, &layout::rc(rc)));
        let per_pod = self.trees.iter().filter_map(|tree| match tree {
            Tree::Labels(LabelType::Pod) | Tree::Intent | Tree::Reality => Some(*tree),
            _ => None,
        });
        let per_pod = per_pod.flat_map(|tree| {
            let prefix = tree.prefix();
            self.pods
                .iter()
                .map(move |pod| key_extent(state, tree, &format!("{prefix}{pod}")))
        });
        let health = self.pod_ids().into_iter();
        let health = health.map(|pod_id| extent(state, &layout::health_of_pod(pod_id)));
        summed(rcs.chain(per_pod).chain(health))
    }
}

/// The [`Extent`] of [`Span::ReportedPodLabels`]: of the label sets of `pod_id` on the nodes
/// its health records name (an own delete of a record or a label set not confirmed yet
/// included), each as [`extent`] counts it.
fn reported_pod_labels_extent(state: &State, pod_id: &str) -> Extent {
    let prefix = layout::health_of_pod(pod_id);
    let health = state.tree(Tree::Health);
    let unconfirmed_deletes = health.unconfirmed_deletes();
    let unconfirmed_deletes =
        unconfirmed_deletes.filter(|entry| entry.pair.key.starts_with(&prefix));
    let records = health.entries.under(&prefix).chain(unconfirmed_deletes);
    let mut nodes = BTreeSet::new();
    for record in records {
        if let Some(node) = record.pair.key.strip_prefix(&prefix) {
            nodes.insert(node.to_owned());
        }
        let named = record.health().map(|view| &*view.node);
        nodes.extend(named.filter(|node| !node.is_empty()).map(str::to_owned));
    }
    let labels = nodes.iter().map(|node| {
        let key = layout::labels(LabelType::Pod, &format!("{node}/{pod_id}"));
        key_extent(state, Tree::Labels(LabelType::Pod), &key)
    });
    summed(labels)
}

/// The [`Extent`] of one key of `tree`, an own delete not confirmed yet included.
fn key_extent(state: &State, tree: Tree, key: &str) -> Extent {
    counted(state.tree(tree).held_or_unconfirmed(key))
}

/// The [`Extent`] of `entries`: how many, and the highest modify index among them.
fn counted<'a>(entries: impl IntoIterator<Item = &'a Arc<Entry>>) -> Extent {
    let highest = |(count, highest): Extent, entry: &Arc<Entry>| {
        (count + 1, highest.max(entry.pair.modify_index))
    };
    entries.into_iter().fold((0, 0), highest)
}

/// The [`Extent`] of the parts whose extents are `parts`.
fn summed(parts: impl IntoIterator<Item = Extent>) -> Extent {
    let add = |(count, highest): Extent, (more, high): Extent| (count + more, highest.max(high));
    parts.into_iter().fold((0, 0), add)
}

/// How many entries lie under a prefix, and the highest modify index among them: a write
/// under the prefix that reaches the mirror in index order changes one of the two (an added
/// or changed entry has the newest index; a removal alone lowers the count). A whole
/// tree's is the index of its newest change (`TreeState::changed_index`).
///
/// An own delete counts once a listing confirms it, as it does in the index: until then
/// the removed entry is counted, so that a blocked read whose client may not have seen the
/// delete is woken when it is confirmed.
pub type Extent = (usize, u64);

/// Whether `tree` holds every change up to `index` of the store as it is: not while it is
/// yet to be read whole again since the store went backwards (its indexes are then the old
/// store's).
fn holds_through(state: &State, tree: Tree, index: u64) -> bool {
    let tree = state.tree(tree);
    !tree.reread && tree.complete >= index
}

/// [`Mirror::claimable_index`] in `state`.
fn claimable(state: &State, trees: &[Tree]) -> u64 {
    let trees = || trees.iter().map(|tree| state.tree(*tree));
    let changed = trees().map(TreeState::changed_index).max().unwrap_or(0);
    let complete = trees().map(|tree| tree.complete).min().unwrap_or(0);
    changed.min(complete)
}

fn extent(state: &State, prefix: &str) -> Extent {
    let Some(tree) = Tree::of_key(prefix) else {
        return (0, 0);
    };
    let tree_state = state.tree(tree);
    if tree.prefix() == prefix {
        return (0, tree_state.changed_index());
    }
    let unconfirmed_deletes = tree_state.unconfirmed_deletes();
    let unconfirmed_deletes =
        unconfirmed_deletes.filter(|entry| entry.pair.key.starts_with(prefix));
    counted(tree_state.entries.under(prefix).chain(unconfirmed_deletes))
}

/// The [`Extent`] of [`Span::NodeHealth`]: of the records at the keys of the pods intended
/// on `node` and of those elsewhere naming it, each as [`extent`] counts it.
fn node_health_extent(state: &State, node: &str, pod_id: Option<&str>) -> Extent {
    let on_node = layout::pod(layout::INTENT, node, "");
    let intents = state.tree(Tree::Intent).entries.under(&on_node);
    let pods = intents.filter_map(|entry| entry.pair.key.strip_prefix(&on_node));
    let filed = pods
        .filter(|pod| pod_id.is_none_or(|id| id == *pod))
        .map(|pod| layout::health(pod, node));
    let of_pod = pod_id.map(layout::health_of_pod);
    let naming = state.health_naming.get(node).into_iter().flatten();
    let naming = naming
        .filter(|key| of_pod.as_ref().is_none_or(|prefix| key.starts_with(prefix)))
        .cloned();
    let health = state.tree(Tree::Health);
    let found = filed.chain(naming);
    counted(found.filter_map(|key| health.held_or_unconfirmed(&key)))
}

/// The [`Extent`] of [`Span::ObjectEvents`]: of the events about `object_id`, an own delete
/// not confirmed yet included, as [`extent`] counts them.
fn object_events_extent(state: &State, object_id: &str) -> Extent {
    let events = state.tree(Tree::Events);
    let filed = state.events_by_object.get(object_id).iter();
    let found = filed.chain(events.unconfirmed_deletes());
    counted(found.filter(|entry| is_event_of(entry, object_id)))
}

/// The [`Extent`] of [`Span::Labelled`]: of the label sets of `label_type` holding
/// `label=value`, an own delete of one not confirmed yet included, as [`extent`] counts
/// them.
fn labelled_extent(state: &State, label_type: LabelType, label: &str, value: &str) -> Extent {
    let tree = state.tree(Tree::Labels(label_type));
    let term = (label_type, label.to_owned(), value.to_owned());
    let ids = state.by_label.get(&term).into_iter().flatten();
    let held = ids.filter_map(|id| tree.entries.get(&layout::labels(label_type, id)));
    let unconfirmed_deletes = tree.unconfirmed_deletes();
    let holding = |entry: &&Arc<Entry>| {
        entry
            .labels()
            .is_some_and(|labels| labels.get(label) == Some(value))
    };
    counted(held.chain(unconfirmed_deletes.filter(holding)))
}

/// Whether the event at `entry` is about the object `object_id`.
fn is_event_of(entry: &Entry, object_id: &str) -> bool {
    // Most events are told apart by their bytes alone, without decoding them: a blocked
    // read looks through up to a tree's whole journal under the mirror's lock.
    let bytes = &entry.pair.value;
    json_may_hold(bytes, object_id) && Event::object_id_of(bytes).is_some_and(|of| of == object_id)
}

/// The [`Extent`] of [`Span::PodIntents`]: of the keys under `prefix` of the nodes with an
/// intent of `pod_id`, an own delete of one not confirmed yet included, each as [`extent`]
/// counts it.
fn pod_intents_extent(state: &State, prefix: &str, pod_id: &str) -> Extent {
    let Some(tree) = Tree::of_key(prefix) else {
        return (0, 0);
    };
    let intents = state.tree(Tree::Intent);
    let indexed = state.intents_by_pod.get(pod_id).iter();
    let indexed = indexed.map(|entry| &entry.pair.key);
    let unconfirmed_deletes = intents.unconfirmed_deletes().map(|entry| &entry.pair.key);
    let nodes: BTreeSet<&str> = indexed
        .chain(unconfirmed_deletes)
        .filter_map(|key| {
            let (node, of) = key.strip_prefix(layout::INTENT)?.split_once('/')?;
            (of == pod_id).then_some(node)
        })
        .collect();
    let held = state.tree(tree);
    let keys = nodes
        .into_iter()
        .map(|node| format!("{prefix}{node}/{pod_id}"));
    counted(keys.filter_map(|key| held.held_or_unconfirmed(&key)))
}

/// Where a subscriber starts: what it is sent first, then what its receiver brings.
#[derive(Debug)]
pub struct Subscription {
    pub backlog: Backlog,
    /// Every signal after the backlog about the kinds asked for.
    pub receiver: Receiver,
}

/// What a subscriber is sent first.
#[derive(Debug)]
pub struct Backlog {
    /// The position asked for could not be resumed from: the changes are a fresh snapshot.
    pub resynced: bool,
    /// A snapshot (every entry, and every own delete not streamed yet, as `added`, at the
    /// current position) or the changes retained since the position asked for.
    pub changes: Vec<Arc<Change>>,
    /// The stream's position when the backlog was taken.
    pub position: u64,
}

/// The mirror; cheap to clone, every clone the same mirror.
#[derive(Clone)]
pub struct Mirror {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn KvStore>,
    config: MirrorConfig,
    state: RwLock<State>,
    /// The mirror's index after every change, for [`Mirror::wait_for`] and blocking reads.
    index: watch::Sender<u64>,
    /// Moves when the store went backwards: every tree re-reads.
    epoch: watch::Sender<u64>,
    /// Sent when a tree's watch fails a read, which changes nothing the mirror holds (the
    /// index does not move) but ends the waits that do not wait for a failing tree
    /// ([`Mirror::until`] wakes on it too).
    failed: watch::Sender<()>,
    /// By tree position: someone waits for the tree to catch up, so its next read need
    /// not wait out [`MirrorConfig::min_reread_interval`]. A permit
    /// ([`Notify::notify_one`]), kept when no pause waits: one sent while a read is under
    /// way ends the next pause at once, since that read may bring less than the reader
    /// waits for (the signal tells no index) and the reader must not be left waiting out
    /// the pacing with no read pending; at worst the next read comes one interval early.
    wanted: Vec<Notify>,
    /// By tree position: someone waits for a tree that holds nothing to catch up with the
    /// store's index for it, so its blocking read under way is to be asked again (see
    /// `feed::follow`). Notified to the reads under way only ([`Notify::notify_waiters`]),
    /// storing nothing for a read sent later.
    refresh: Vec<Notify>,
    /// By tree position: held while a reader asks the store for the tree's index and waits
    /// for the tree's watch to list past it ([`Mirror::catch_up`]), so that readers waiting
    /// alike share one call.
    probes: Vec<tokio::sync::Mutex<()>>,
    started: AtomicBool,
    /// How many of the server's own writes had an unknown outcome ([`Mirror::settle`]).
    unsure_writes: AtomicU64,
    /// By tree position: how many of those the tree has caught up with the store since.
    settled: Vec<AtomicU64>,
}

impl Mirror {
    /// How many blocking watches of the store a started mirror keeps open at once: one per
    /// tree, each for a whole wait.
    pub const WATCHES: usize = Tree::ALL.len();

    /// An empty mirror of `store`; [`Mirror::start`] fills it and keeps it current.
    pub fn new(store: Arc<dyn KvStore>, config: MirrorConfig) -> Mirror {
        let stream = Stream::new(config.retained_changes, config.subscriber_buffer);
        Mirror {
            inner: Arc::new(Inner {
                store,
                config,
                state: RwLock::new(State::new(stream)),
                index: watch::channel(0).0,
                epoch: watch::channel(0).0,
                failed: watch::channel(()).0,
                wanted: Tree::ALL.iter().map(|_| Notify::new()).collect(),
                refresh: Tree::ALL.iter().map(|_| Notify::new()).collect(),
                probes: Tree::ALL
                    .iter()
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect(),
                started: AtomicBool::new(false),
                unsure_writes: AtomicU64::new(0),
                settled: Tree::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            }),
        }
    }

    /// Starts one task per tree on `tasks`, each following its tree until `cancel`. Starting
    /// a started mirror does nothing.
    pub fn start(&self, tasks: &TaskTracker, cancel: CancellationToken) {
        if self.inner.started.swap(true, Ordering::SeqCst) {
            return;
        }
        self.store_answered();
        for tree in Tree::ALL {
            tasks.spawn(feed::follow(self.clone(), tree, cancel.clone()));
        }
        tasks.spawn(feed::heartbeat(self.clone(), cancel));
    }

    /// Notes an own write whose outcome is unknown: it may have landed, and the mirror
    /// holds it only once a watch delivers it ([`Mirror::settle`]).
    pub fn note_unsure_write(&self) {
        self.inner.unsure_writes.fetch_add(1, Ordering::SeqCst);
    }

    /// Waits, at most `timeout`, until each of `trees` has caught up with the store as it
    /// is since the server's last own write of unknown outcome ([`Mirror::note_unsure_write`]),
    /// at once for those that have; whether they all have. Such a write may have landed
    /// unseen, and no listing need have moved to tell: a reader acting without it would make
    /// it again (a farm's pod placed once more, on another node; a client told to re-read
    /// before retrying, creating an RC twice).
    pub async fn settle(&self, trees: &[Tree], timeout: Duration) -> bool {
        let unsure = self.inner.unsure_writes.load(Ordering::SeqCst);
        let settled = |tree: &Tree| &self.inner.settled[tree.position()];
        let pending: Vec<Tree> = (trees.iter().copied())
            .filter(|tree| settled(tree).load(Ordering::SeqCst) < unsure)
            .collect();
        if pending.is_empty() {
            return true;
        }
        // Past every index: each tree asks the store for its index as it is now.
        if !self.catch_up_to(&pending, u64::MAX, timeout).await {
            return false;
        }
        for tree in &pending {
            settled(tree).fetch_max(unsure, Ordering::SeqCst);
        }
        true
    }

    /// The mirror's index: the highest index it has applied.
    pub fn index(&self) -> u64 {
        *self.inner.index.borrow()
    }

    /// The change stream's position: the highest index it has reached.
    pub fn position(&self) -> u64 {
        self.read().stream.position()
    }

    /// The highest index `tree`'s entries reflect, own writes included.
    pub fn tree_index(&self, tree: Tree) -> u64 {
        self.read().tree(tree).index
    }

    /// The generation, listed index, complete index and whole reads of each of `trees`,
    /// read together. The generation moves on every change of a tree's entries, own
    /// deletes included, and the two indexes, which decide the index answers claim
    /// ([`Mirror::claimable_index`]), on a listing that confirms own writes without
    /// changing an entry and as the tree is found to hold every change up to a newer index;
    /// between two whole reads none goes back: equal versions mean answers read from the
    /// trees are unchanged, index included.
    pub fn versions(&self, trees: &[Tree]) -> Vec<TreeVersion> {
        let state = self.read();
        trees
            .iter()
            .map(|tree| {
                let tree = state.tree(*tree);
                TreeVersion {
                    generation: tree.generation,
                    listed: tree.listed,
                    complete: tree.complete,
                    whole_reads: tree.whole_reads,
                }
            })
            .collect()
    }

    /// The newest index the watches of `trees` have shown: what a read of them claims to
    /// reflect (its `X-Index`, [`Mirror::claimable_index`]), but for the trees that hold
    /// nothing. The server's own writes are in the entries at once, but they count here
    /// only once a listing confirms them ([`Mirror::confirm`]): another writer's change
    /// from before an own write may not have reached the mirror yet, and the own write's
    /// index alone would claim it. The farms need no other tree to catch up with their own
    /// writes either.
    pub fn listed_index(&self, trees: &[Tree]) -> u64 {
        let state = self.read();
        trees
            .iter()
            .map(|tree| state.tree(*tree).listed)
            .max()
            .unwrap_or(0)
    }

    /// The index of the newest change of `trees` (`TreeState::changed_index`): the newest
    /// their watches have listed ([`Mirror::listed_index`]), a tree that holds nothing
    /// counting at the index it came to hold nothing rather than at its latest listing: on
    /// Consul an empty prefix lists at the whole store's index, which every write anywhere
    /// moves, so trees caught up to that would each make the others' next listing newer
    /// still, for as long as writes go on.
    pub fn changed_index(&self, trees: &[Tree]) -> u64 {
        let state = self.read();
        let trees = trees.iter().map(|tree| state.tree(*tree));
        trees.map(TreeState::changed_index).max().unwrap_or(0)
    }

    /// The index an answer made of `trees` claims (its `X-Index`): the newest their watches
    /// have listed ([`Mirror::listed_index`]), a tree that holds nothing counting at the
    /// index it came to hold nothing (`TreeState::changed_index`), but no newer than every
    /// one of them holds every change up to. Each tree has its own watch, so another
    /// writer's change to one tree can reach the mirror after a newer change to another;
    /// [`Mirror::catch_up`] brings the trees up to their listed index.
    pub fn claimable_index(&self, trees: &[Tree]) -> u64 {
        claimable(&self.read(), trees)
    }

    /// A receiver woken on every change, holding the mirror's index: what blocking reads
    /// wait on.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.index.subscribe()
    }

    /// Waits, at most `timeout`, until every tree is read and holds every change up to
    /// `index`; whether it got there (a store that cannot be asked counts as not).
    ///
    /// A tree's own index only moves when the tree changes, so a tree below `index` may be
    /// current (the change at `index` was elsewhere) or lagging (its watch has yet to
    /// deliver). The store is asked for the index of each such tree, and of each tree out of
    /// touch with it, once, after the write at `index` was made, and the wait lasts until the
    /// mirror has reached those indexes. A store that went backwards meanwhile ends the wait
    /// unreached: those indexes are the old store's.
    pub async fn wait_for(&self, index: u64, timeout: Duration) -> bool {
        self.wait_for_trees(&Tree::ALL, index, timeout).await
    }

    /// [`Mirror::wait_for`] for `trees` only.
    pub async fn wait_for_trees(&self, trees: &[Tree], index: u64, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.reach(trees, index))
            .await
            .unwrap_or(false)
    }

    /// Waits until every tree holds every change up to the store's index for the tree, for
    /// those that do not hold every change up to `index`, and for those out of touch with
    /// the store ([`Mirror::out_of_touch_among`]), whose changes past it no other tree's
    /// index need tell. What a tree holds every change up to is its `complete` index, not
    /// its own index: the server's own writes lift that past another writer's earlier
    /// change that the tree's watch has yet to deliver. Ends unreached once the store went
    /// backwards meanwhile (see [`Mirror::until_in_epoch`]).
    async fn reach(&self, trees: &[Tree], index: u64) -> bool {
        if !self.until(|mirror| mirror.is_loaded()).await {
            return false;
        }
        // Read before the store is asked: its answers are of the store in this epoch.
        let epoch = self.current_epoch();
        let holds = |mirror: &Mirror, tree: Tree| mirror.read().tree(tree).complete;
        let out_of_touch = self.out_of_touch_among(trees);
        let mut targets = Vec::new();
        for &tree in trees {
            if holds(self, tree) < index || out_of_touch.contains(&tree) {
                match self.store().prefix_index(&tree.prefix()).await {
                    Ok(current) => targets.push((tree, current)),
                    Err(_) => return false,
                }
            }
        }
        for (tree, current) in &targets {
            if holds(self, *tree) < *current {
                self.hurry(*tree);
            }
        }
        self.until_in_epoch(epoch, |mirror| {
            targets
                .iter()
                .all(|(tree, current)| holds(mirror, *tree) >= *current)
        })
        .await
    }

    /// Waits, at most `timeout`, until each of `trees` holds every change up to the newest
    /// index their watches have listed, so that an answer made of them claims that index
    /// ([`Mirror::claimable_index`]); whether they all do. A tree that holds nothing counts
    /// at the index it came to hold nothing (`TreeState::changed_index`): on Consul an empty
    /// prefix lists at the whole store's index, which moves with every write anywhere, and
    /// the others would catch up with each. A tree read since that index was committed
    /// holds it; of any other, the store is asked for the tree's index (one call at a time
    /// per tree, shared by the readers waiting), and if it moved, the tree's next read is
    /// made without waiting out its pacing (and, when it holds nothing, its blocking read
    /// under way asked again: see `Mirror::hurry`). A tree whose watch is failing is not
    /// waited for, nor one whose watch fails meanwhile: unless the store says it has not moved, answers claim no more than it
    /// held when its watch last read it. A tree not read whole again since the store went
    /// backwards is waited for to be (its listed index is the old store's, which may lie
    /// past the fresh store's index for it: it would count as caught up with a store it has
    /// not read), unless its watch is failing, or fails that read meanwhile: it has not
    /// caught up. A store that went backwards meanwhile ends the wait unreached: the index
    /// the store was asked for is the old store's.
    pub async fn catch_up(&self, trees: &[Tree], timeout: Duration) -> bool {
        let newest = self.changed_index(trees);
        self.catch_up_to(trees, newest, timeout).await
    }

    /// [`Mirror::catch_up`] up to `index` (bounded by what the store holds): for a client
    /// that has seen `index`, which the watches have listed.
    pub async fn catch_up_to(&self, trees: &[Tree], index: u64, timeout: Duration) -> bool {
        // The common case, answered under one read and without a timer: every read of the
        // mirror asks.
        let complete = |state: &State| trees.iter().all(|tree| holds_through(state, *tree, index));
        if complete(&self.read()) {
            return true;
        }
        let each = trees.iter().map(|tree| self.complete_through(*tree, index));
        let caught_up = futures::future::join_all(each);
        tokio::time::timeout(timeout, caught_up)
            .await
            .is_ok_and(|done| done.into_iter().all(|done| done))
    }

    /// [`Mirror::catch_up`] for one tree.
    async fn complete_through(&self, tree: Tree, index: u64) -> bool {
        let complete = |mirror: &Mirror| holds_through(&mirror.read(), tree, index);
        if complete(self) {
            return true;
        }
        let _probe = self.inner.probes[tree.position()].lock().await;
        if complete(self) {
            return true;
        }
        let epoch = self.current_epoch();
        // Not read whole since the store went backwards, the tree's listed index is the old
        // store's, which the fresh store's index for it may be below: it has caught up with
        // the fresh store once read from it. Unless its watch is failing, which ignores
        // readers until its backoff is over: it is not waited for.
        let read_again_or_failing = |mirror: &Mirror| {
            let state = mirror.read();
            let tree = state.tree(tree);
            !tree.reread || tree.failing_since.is_some()
        };
        if !self.until_in_epoch(epoch, read_again_or_failing).await || self.read().tree(tree).reread
        {
            return false;
        }
        let known = self.committed_index();
        let Ok(current) = self.store().prefix_index(&tree.prefix()).await else {
            return false;
        };
        let listed = |mirror: &Mirror| mirror.listed_index(&[tree]) >= current;
        let failing = |mirror: &Mirror| mirror.read().tree(tree).failing_since.is_some();
        if !listed(self) {
            // A failing watch ignores readers until its backoff is over: not waited for,
            // nor once it fails meanwhile.
            if failing(self) {
                return false;
            }
            self.hurry(tree);
            let listed_or_failing = |mirror: &Mirror| listed(mirror) || failing(mirror);
            if !self.until_in_epoch(epoch, listed_or_failing).await || !listed(self) {
                return false;
            }
        }
        // `known` was the old store's if the store went backwards meanwhile.
        self.read_through(tree, known, epoch)
    }

    /// Waits until `done` holds, checking it after every change and every failed read of a
    /// tree's watch (a failing tree is not waited for).
    async fn until(&self, done: impl Fn(&Mirror) -> bool) -> bool {
        let mut changes = self.changes();
        let mut failed = self.inner.failed.subscribe();
        loop {
            changes.borrow_and_update();
            failed.borrow_and_update();
            if done(self) {
                return true;
            }
            let woken = tokio::select! {
                changed = changes.changed() => changed,
                failed = failed.changed() => failed,
            };
            if woken.is_err() {
                return false;
            }
        }
    }

    /// [`Mirror::until`], but `false` as soon as the store goes backwards (the mirror's
    /// epoch moves past `epoch`, [`Mirror::resync`]): what the wait is for was read of the
    /// old store (the store's index for a tree), which the trees read again from the fresh
    /// one need not reach for long, and the waiter is to start again from the fresh store.
    async fn until_in_epoch(&self, epoch: u64, done: impl Fn(&Mirror) -> bool) -> bool {
        let mut epochs = self.epoch();
        let moved = epochs.wait_for(|now| *now != epoch);
        tokio::select! {
            biased;
            _ = moved => false,
            reached = self.until(done) => reached,
        }
    }

    /// Waits until every tree has been read once.
    pub async fn loaded(&self) {
        self.until(|mirror| mirror.is_loaded()).await;
    }

    /// Whether every tree has been read once.
    pub fn is_loaded(&self) -> bool {
        self.read().trees.iter().all(|tree| tree.loaded)
    }

    /// Waits until each of `trees` has been read whole since the store's index last went
    /// backwards (at once if it never did): until then the tree holds the old store's
    /// entries, which a snapshot of the change stream must not be taken from.
    pub async fn read_again(&self, trees: &[Tree]) -> bool {
        self.until(|mirror| {
            let state = mirror.read();
            trees.iter().all(|tree| !state.tree(*tree).reread)
        })
        .await
    }

    /// Which trees are not read yet, and which have lost their watch for too long.
    pub fn health(&self) -> MirrorHealth {
        let state = self.read();
        let lost_after = self.inner.config.lost_after;
        let silent = self.silent_since(&state).map(|since| since.elapsed());
        let mut health = MirrorHealth {
            loading: Vec::new(),
            lost: Vec::new(),
            silent: silent.filter(|silent| *silent > lost_after),
        };
        for (tree, since) in self.out_of_touch(&state) {
            let tree_state = state.tree(tree);
            // A tree not read again since the store went backwards holds the old store's
            // entries: it is loading the store as it is now.
            if !tree_state.loaded || tree_state.reread {
                health.loading.push(tree.prefix());
            }
            let lost = since.map(|since| since.elapsed());
            if let Some(lost) = lost.filter(|lost| *lost > lost_after) {
                health.lost.push((tree.prefix(), lost));
            }
        }
        health
    }

    /// Sets `p2_mirror_lag_seconds` of every tree to how long it has been out of touch
    /// with the store (0 while in touch): called as the metrics are read, so that the lag
    /// grows while a read goes unanswered rather than only once it fails.
    pub fn publish_lag(&self) {
        let state = self.read();
        for (tree, since) in self.out_of_touch(&state) {
            let lag = since.map_or(Duration::ZERO, |since| since.elapsed());
            crate::metrics::mirror_lag(&tree.prefix(), lag);
        }
    }

    /// Those of `trees` out of touch with the store now (a watch failing, or its read
    /// overdue, as readiness tells it): what the mirror holds of them may be behind the
    /// store by any number of changes, and no listing of another tree need say so.
    pub fn out_of_touch_among(&self, trees: &[Tree]) -> Vec<Tree> {
        let state = self.read();
        self.out_of_touch(&state)
            .filter(|(tree, since)| since.is_some() && trees.contains(tree))
            .map(|(tree, _)| tree)
            .collect()
    }

    /// Since when each tree has been out of touch with the store, `None` while in touch:
    /// its watch failing, or its read overdue, since the watch's last success; or the store
    /// silent to every read of the mirror since its last answer.
    fn out_of_touch<'a>(
        &self,
        state: &'a State,
    ) -> impl Iterator<Item = (Tree, Option<Instant>)> + 'a {
        let silent_since = self.silent_since(state);
        let now = Instant::now();
        Tree::ALL
            .into_iter()
            .zip(&state.trees)
            .map(move |(tree, tree_state)| {
                let overdue = tree_state
                    .unanswered
                    .filter(|(overdue, _)| *overdue <= now)
                    .map(|(_, last_success)| last_success);
                let since = [tree_state.failing_since, overdue, silent_since];
                (tree, since.into_iter().flatten().min())
            })
    }

    /// When the store last answered the mirror, if it has answered none of its reads since
    /// for two heartbeat intervals: a heartbeat is sent one interval after the last one's
    /// answer, and given one interval to be answered.
    fn silent_since(&self, state: &State) -> Option<Instant> {
        let heard = state.answered;
        (heard.elapsed() > 2 * self.inner.config.heartbeat_interval).then_some(heard)
    }

    /// The entry at `key`, if a followed tree holds it.
    pub fn get(&self, key: &str) -> Option<Arc<Entry>> {
        let tree = Tree::of_key(key)?;
        self.read().tree(tree).entries.get(key).cloned()
    }

    /// Every entry whose key starts with `prefix`, sorted by key; `prefix` must lie within
    /// one followed tree (e.g. `intent/<node>/` for the intents of a node).
    pub fn under(&self, prefix: &str) -> Vec<Arc<Entry>> {
        self.listing(prefix)
            .map(|(_, entries)| entries)
            .unwrap_or_default()
    }

    /// The index of the newest change of the tree `prefix` lies in, as an answer made of it
    /// counts it (`TreeState::changed_index`: its listed index while it holds something),
    /// and the entries under `prefix` (as [`Mirror::under`]), read together; `None` for a
    /// prefix in no followed tree.
    pub fn listing(&self, prefix: &str) -> Option<(u64, Vec<Arc<Entry>>)> {
        let tree = Tree::of_key(prefix)?;
        let state = self.read();
        let tree_state = state.tree(tree);
        let entries = tree_state.entries.under(prefix).cloned().collect();
        Some((tree_state.changed_index(), entries))
    }

    /// What a blocking read of `trees` (under `spans`) has seen, read together: their
    /// listed index, each span's [`Extent`], and whether the trees hold no own write their
    /// watches have yet to confirm ([`Mirror::confirm`]). Only a confirmed view is a
    /// baseline to wait for a change from: an unconfirmed own write is in the extents but
    /// not in the index, so a client at the index may not have seen it.
    pub fn seen(&self, trees: &[Tree], spans: &[Span]) -> Seen {
        let state = self.read();
        let confirmed = trees.iter().all(|tree| {
            let tree = state.tree(*tree);
            tree.listed >= tree.index
        });
        Seen {
            listed: trees.iter().map(|tree| state.tree(*tree).listed).collect(),
            changed: (trees.iter())
                .map(|tree| state.tree(*tree).changed_index())
                .collect(),
            claimable: claimable(&state, trees),
            extents: spans.iter().map(|span| span.extent(&state)).collect(),
            confirmed,
        }
    }

    /// Whether anything in `spans` may have changed at an index past `index`: a version put
    /// or removed there, or replaced by one put; true too when the changes past `index` are
    /// no longer all kept. A blocking read at an index its trees have moved past holds on
    /// as long as this is false, as Consul's blocking read of one key holds while that key
    /// is unchanged: a read of one object is not woken by every change of the fleet.
    pub fn changed_past(&self, spans: &[Span], index: u64) -> bool {
        let state = self.read();
        spans.iter().any(|span| {
            if let Some(pods) = span.pods(&state) {
                return pods.changed_past(&state, index);
            }
            let Some(tree) = span.tree() else {
                return true;
            };
            let Some(mut touched) = state.tree(tree).journal.touched_past(index) else {
                return true;
            };
            touched.any(|entry| span.may_hold(entry))
        })
    }

    /// Waits, at most `timeout`, until the watches of `trees` have confirmed every write
    /// this server had applied to them when called, each listing bringing in with it any
    /// other writer's change from before the write; whether they did. Each tree behind is
    /// read at once rather than at its next paced read; a tree whose watch is failing is not
    /// waited for, nor one whose watch fails meanwhile. A store that went backwards meanwhile ends the wait unconfirmed: those
    /// writes were the old store's.
    pub async fn confirm(&self, trees: &[Tree], timeout: Duration) -> bool {
        let (targets, failing, epoch): (Vec<(Tree, u64)>, bool, u64) = {
            let state = self.read();
            let behind: Vec<(Tree, &TreeState)> = trees
                .iter()
                .map(|tree| (*tree, state.tree(*tree)))
                .filter(|(_, state)| state.listed < state.index)
                .collect();
            let failing = behind
                .iter()
                .any(|(_, state)| state.failing_since.is_some());
            let targets = behind
                .into_iter()
                .filter(|(_, state)| state.failing_since.is_none())
                .map(|(tree, state)| (tree, state.index))
                .collect();
            // Under the lock the epoch moves in, so that the targets are of this epoch.
            (targets, failing, self.current_epoch())
        };
        if targets.is_empty() {
            return !failing;
        }
        for (tree, _) in &targets {
            self.wanted(*tree).notify_one();
        }
        let listed = |state: &State| {
            (targets.iter()).all(|(tree, index)| state.tree(*tree).listed >= *index)
        };
        // Nor is a tree waited for once its watch fails meanwhile.
        let failed = |state: &State| {
            (targets.iter()).any(|(tree, _)| state.tree(*tree).failing_since.is_some())
        };
        let ended = self.until_in_epoch(epoch, |mirror| {
            let state = mirror.read();
            listed(&state) || failed(&state)
        });
        let ended = tokio::time::timeout(timeout, ended).await.unwrap_or(false);
        ended && listed(&self.read()) && !failing
    }

    /// `tree`'s index, its entries and the keys changed in it since generation `known`,
    /// read together; `None` while its generation is still `known`. Lets a reader keep what
    /// it derives from a tree up to date by the entries that changed.
    pub fn snapshot(&self, tree: Tree, known: Option<u64>) -> Option<TreeSnapshot> {
        self.read_snapshot(tree, known, true)
    }

    /// As [`Mirror::snapshot`], without the changed keys: for a reader that keeps the
    /// entries as they are, or derives from all of them at once.
    pub fn entries_snapshot(&self, tree: Tree, known: Option<u64>) -> Option<TreeSnapshot> {
        self.read_snapshot(tree, known, false)
    }

    fn read_snapshot(&self, tree: Tree, known: Option<u64>, changes: bool) -> Option<TreeSnapshot> {
        let state = self.read();
        let tree_state = state.tree(tree);
        if known == Some(tree_state.generation) {
            return None;
        }
        let changed = known
            .filter(|_| changes)
            .and_then(|known| tree_state.journal.keys_since(known));
        Some(TreeSnapshot {
            tree,
            generation: tree_state.generation,
            index: tree_state.index,
            entries: tree_state.entries.clone(),
            changed: changed.map(|keys| keys.into_iter().map(str::to_owned).collect()),
        })
    }

    /// Every entry of `tree`, sorted by key.
    pub fn entries(&self, tree: Tree) -> Entries {
        self.read().tree(tree).entries.clone()
    }

    /// The versions of `tree` the server itself deleted whose deletion is not streamed yet,
    /// as they were: a listing has still to confirm it (see [`Mirror::apply_own_writes`]).
    pub fn unstreamed_deletes(&self, tree: Tree) -> Vec<Arc<Entry>> {
        let state = self.read();
        state.tree(tree).unconfirmed_deletes().cloned().collect()
    }

    /// The labels of `id` of `label_type`.
    pub fn labels_of(&self, label_type: LabelType, id: &str) -> Option<Labels> {
        self.read()
            .labels_of(label_type, id)
            .map(CompactLabels::to_labels)
    }

    /// Whether `selector` matches the labels of `id` of `label_type` (an empty set when it
    /// has none), read where the mirror holds them rather than copied out.
    pub fn labels_match(&self, label_type: LabelType, id: &str, selector: &Selector) -> bool {
        selector.matches(&self.read().labels_of(label_type, id))
    }

    /// The pods (`<node>/<pod_id>`) labelled with RC `rc_id`, sorted.
    pub fn pods_of_rc(&self, rc_id: &str) -> Vec<String> {
        let term = (LabelType::Pod, RC_ID_LABEL.to_owned(), rc_id.to_owned());
        self.read()
            .by_label
            .get(&term)
            .map(|ids| ids.iter().map(|id| id.to_string()).collect())
            .unwrap_or_default()
    }

    /// The nodes with an intent of pod id `pod_id`, sorted.
    pub fn nodes_of_pod(&self, pod_id: &str) -> Vec<String> {
        let state = self.read();
        let keys = state.intents_by_pod.get(pod_id).iter();
        let keys = keys.map(|entry| &entry.pair.key);
        // A colliding pod id's intents share the list.
        let nodes = keys.filter_map(|key| {
            let (node, of) = key.strip_prefix(layout::INTENT)?.split_once('/')?;
            (of == pod_id).then(|| node.to_owned())
        });
        let mut nodes: Vec<String> = nodes.collect();
        nodes.sort_unstable();
        nodes
    }

    /// The events about the object `object_id`, by key (oldest first).
    pub fn events_of(&self, object_id: &str) -> Vec<Arc<Entry>> {
        let filed = self.read().events_by_object.get(object_id).to_vec();
        // Filtered outside the lock: a colliding id's events share the list.
        filed
            .into_iter()
            .filter(|entry| is_event_of(entry, object_id))
            .collect()
    }

    /// The objects of `label_type` whose labels `selector` matches, sorted by id. An
    /// equality or `in` requirement narrows the candidates through the label index; other
    /// selectors look at every label set of the type.
    pub fn select(&self, label_type: LabelType, selector: &Selector) -> Vec<(String, Labels)> {
        let state = self.read();
        let narrowing = selector.requirements().iter().find(|r| {
            matches!(
                r.operator(),
                Operator::Equals | Operator::DoubleEquals | Operator::In
            )
        });
        let candidates: Vec<String> = match narrowing {
            Some(requirement) => {
                let ids: BTreeSet<&Arc<str>> = requirement
                    .values()
                    .iter()
                    .filter_map(|value| {
                        let term = (label_type, requirement.key().to_owned(), value.clone());
                        state.by_label.get(&term)
                    })
                    .flatten()
                    .collect();
                ids.into_iter().map(|id| id.to_string()).collect()
            }
            None => {
                let prefix = layout::labels_of_type(label_type);
                let entries = &state.tree(Tree::Labels(label_type)).entries;
                entries
                    .values()
                    .filter_map(|entry| entry.pair.key.strip_prefix(&prefix).map(str::to_owned))
                    .collect()
            }
        };
        candidates
            .into_iter()
            .filter_map(|id| {
                let labels = state.labels_of(label_type, &id)?;
                selector
                    .matches(labels)
                    .then(|| (id.clone(), labels.to_labels()))
            })
            .collect()
    }

    /// Applies the server's own successful writes at once, so reads need not wait for the
    /// watches; keys outside the followed trees are ignored. Deletions reach the change
    /// stream when a listing confirms them, or before a newer version of the key. `txn` is
    /// the index of the transaction that made them all, if they are one transaction's: its
    /// pairs are then not read back when the watches wake.
    pub fn apply_own_writes(&self, writes: impl IntoIterator<Item = OwnWrite>, txn: Option<u64>) {
        /// A write decoded outside the lock.
        enum Decoded {
            Put(Entry),
            Delete { key: String, through: u64 },
        }
        let decoded: Vec<(Tree, Decoded)> = writes
            .into_iter()
            .filter_map(|write| match write {
                OwnWrite::Put(pair) => {
                    let tree = Tree::of_key(&pair.key)?;
                    Some((tree, Decoded::Put(tree.decode(pair))))
                }
                OwnWrite::Delete { key, through } => {
                    let (tree, through) = (Tree::of_key(&key)?, through?);
                    Some((tree, Decoded::Delete { key, through }))
                }
            })
            .collect();
        if decoded.is_empty() {
            return;
        }
        let mut state = self.write();
        for (tree, write) in decoded {
            match write {
                Decoded::Put(entry) => {
                    if let Some(index) = txn {
                        state.hold(tree, index);
                    }
                    state.apply_own_put(tree, entry);
                }
                Decoded::Delete { key, through } => state.apply_own_delete(tree, &key, through),
            }
        }
        self.publish(&state);
    }

    /// Starts a subscriber of `kinds`, and of the changes alone of the label sets of
    /// `label_sets` (which it wants no snapshot of: those that move the objects it follows
    /// into or out of a selector): from `resume` (a position it was given) when the retained
    /// changes cover it, else from a snapshot.
    pub fn subscribe(
        &self,
        resume: Option<u64>,
        kinds: &[Kind],
        label_sets: &[LabelType],
    ) -> Subscription {
        let state = self.read();
        let receiver = state.stream.subscribe(kinds, label_sets);
        let position = state.stream.position();
        let of_kinds = |tree: Tree| tree.kind().is_some_and(|kind| kinds.contains(&kind));
        let followed = |tree: Tree| {
            of_kinds(tree)
                || matches!(tree, Tree::Labels(label_type) if label_sets.contains(&label_type))
        };
        if let Some(changes) = resume.and_then(|from| state.stream.replay_from(from)) {
            let changes = changes.into_iter().filter(|c| followed(c.tree)).collect();
            let backlog = Backlog {
                resynced: false,
                changes,
                position,
            };
            return Subscription { backlog, receiver };
        }
        // The objects the server deleted itself are there until their deletion is
        // streamed: a snapshot holds what the changes before its position said, so that
        // the deletion, when it comes, is of an object the subscriber was sent, and a
        // subscriber resuming from the snapshot's position is told of it.
        let changes = Tree::ALL
            .into_iter()
            .filter(|tree| of_kinds(*tree))
            .flat_map(|tree| {
                let tree_state = state.tree(tree);
                let unstreamed = tree_state.unconfirmed_deletes();
                let mut objects: Vec<_> = tree_state.entries.values().chain(unstreamed).collect();
                objects.sort_by(|a, b| a.pair.key.cmp(&b.pair.key));
                objects.into_iter().map(move |entry| {
                    Arc::new(Change {
                        change_type: ChangeType::Added,
                        tree,
                        index: entry.pair.modify_index,
                        position,
                        entry: entry.clone(),
                        rendered: Default::default(),
                    })
                })
            })
            .collect();
        let backlog = Backlog {
            resynced: resume.is_some(),
            changes,
            position,
        };
        Subscription { backlog, receiver }
    }

    fn config(&self) -> &MirrorConfig {
        &self.inner.config
    }

    fn store(&self) -> &dyn KvStore {
        self.inner.store.as_ref()
    }

    /// A receiver of the mirror's epoch, which moves when the store went backwards
    /// (restarted empty or restored): every tree is then read again, and what readers
    /// knew of the trees before is of the old store.
    pub(crate) fn epoch(&self) -> watch::Receiver<u64> {
        self.inner.epoch.subscribe()
    }

    /// The mirror's epoch now (see [`Mirror::epoch`]).
    pub(crate) fn current_epoch(&self) -> u64 {
        *self.inner.epoch.borrow()
    }

    /// The indexes of this server's transactions after `index` whose pairs in `tree` the
    /// mirror holds.
    fn held(&self, tree: Tree, index: u64) -> Vec<u64> {
        self.read().held(tree, index)
    }

    /// Whether `update` of `tree` lists a key at a version older than one the tree held at
    /// or below `floor` (an index the store had reached before the read was sent): a store
    /// that has not gone backwards never loses a version it had.
    fn lists_lost_versions(&self, tree: Tree, update: &PrefixUpdate, floor: u64) -> bool {
        let pairs = match update {
            PrefixUpdate::Whole(listing) => &listing.pairs,
            PrefixUpdate::Since(changes) => &changes.changed,
        };
        let state = self.read();
        let entries = &state.tree(tree).entries;
        pairs.iter().any(|pair| {
            entries.get(&pair.key).is_some_and(|held| {
                let held = held.pair.modify_index;
                held <= floor && pair.modify_index < held
            })
        })
    }

    /// Merges a listing of `tree`, or what changed in it, decoding outside the lock, unless
    /// the store went backwards since the read was sent, in `epoch`: the read is of the old
    /// store, and a whole one taken in would count the tree as read again. Whether it was.
    fn apply_update(
        &self,
        tree: Tree,
        update: PrefixUpdate,
        authoritative: bool,
        epoch: u64,
    ) -> bool {
        let (prepared, pairs) = self.read().prepare(tree, update, authoritative);
        let prepared = prepared.decode(pairs);
        let mut state = self.write();
        if !self.in_epoch(epoch) {
            return false;
        }
        state.apply(prepared);
        self.publish(&state);
        true
    }

    /// Notified when someone waits for `tree` to catch up (see [`Inner::wanted`]).
    fn wanted(&self, tree: Tree) -> &Notify {
        &self.inner.wanted[tree.position()]
    }

    /// Notified when someone waits for `tree`, which holds nothing, to catch up (see
    /// [`Inner::refresh`]).
    fn refresh(&self, tree: Tree) -> &Notify {
        &self.inner.refresh[tree.position()]
    }

    /// Has `tree`, which a reader waits for, read without waiting out its pacing, and its
    /// blocking read under way asked again when it holds nothing: on Consul such a read
    /// need not be woken by the write elsewhere that moved the index the reader waits for
    /// (see `feed::follow`). Only a read under way is asked again: a read sent after this
    /// finds the index the reader waits for moved and answers at once, while a signal kept
    /// for it would have it sent twice.
    fn hurry(&self, tree: Tree) {
        self.wanted(tree).notify_one();
        if self.read().tree(tree).holds_nothing() {
            self.refresh(tree).notify_waiters();
        }
    }

    /// The store went backwards, as a reader in `epoch` saw: subscribers start again and
    /// every tree re-reads, unless the epoch moved since (another reader saw it first, and
    /// every tree has been read again since, or is being). Whether it did: a fall that
    /// several trees' watches see at once is one resync, not one per tree.
    fn resync(&self, epoch: u64) -> bool {
        let state = &mut *self.write();
        if !self.in_epoch(epoch) {
            return false;
        }
        state.stream.resync();
        for tree in &mut state.trees {
            tree.reread = true;
            tree.complete = 0;
        }
        self.inner.epoch.send_modify(|epoch| *epoch += 1);
        true
    }

    /// Notes that `tree`'s watch has sent a read, which is overdue once `overdue` passes
    /// (never, when `None`): from then on until it is answered, the tree has been out of
    /// touch since the watch's `last_success`, as if the read had failed.
    fn watch_started(&self, tree: Tree, overdue: Option<Instant>, last_success: Instant) {
        self.write().trees[tree.position()].unanswered =
            overdue.map(|overdue| (overdue, last_success));
    }

    fn watch_succeeded(&self, tree: Tree) {
        let mut state = self.write();
        state.answered = Instant::now();
        let tree = &mut state.trees[tree.position()];
        tree.failing_since = None;
        tree.unanswered = None;
    }

    /// Notes that the store has just answered the mirror.
    fn store_answered(&self) {
        self.write().answered = Instant::now();
    }

    /// Notes a failed read of `tree`'s watch, whose last success was at `last_success`: the
    /// tree has been out of touch since then, however long the failed read took to fail.
    /// Wakes the mirror's waits ([`Mirror::until`]), some of which end for a failing tree:
    /// a catch-up waiting for the tree to be read again since the store went backwards
    /// answers at once rather than wait out its timeout for a read the failing watch does
    /// not make until its backoff is over.
    fn watch_failed(&self, tree: Tree, last_success: Instant) {
        let mut state = self.write();
        let tree = &mut state.trees[tree.position()];
        tree.unanswered = None;
        tree.failing_since.get_or_insert(last_success);
        self.inner.failed.send_replace(());
    }

    /// The highest index known to be committed in the store as it is: the trees' own, but
    /// not those of a tree not read whole again since the store's index went backwards
    /// (they are the old store's).
    fn committed_index(&self) -> u64 {
        let state = self.read();
        let current = state.trees.iter().filter(|tree| !tree.reread);
        current.map(|tree| tree.index).max().unwrap_or(0)
    }

    /// Notes that `tree` holds every change up to `known`: a read of it that began once
    /// `known` was committed has been applied. Unless the store went backwards since
    /// `known` was read, in `epoch`: it is the old store's. Whether it was noted.
    fn read_through(&self, tree: Tree, known: u64, epoch: u64) -> bool {
        let mut state = self.write();
        if !self.in_epoch(epoch) {
            return false;
        }
        let tree = &mut state.trees[tree.position()];
        tree.complete = tree.complete.max(known);
        true
    }

    /// Whether the mirror's epoch is still `epoch`: whether the store has not gone backwards
    /// since, so that what was read in it is of the store as it is. Asked with the state's
    /// lock held, it stays so until the lock is let go: [`Mirror::resync`] moves it under
    /// that lock.
    pub(crate) fn in_epoch(&self, epoch: u64) -> bool {
        self.current_epoch() == epoch
    }

    /// Wakes everyone waiting on the mirror's index.
    fn publish(&self, state: &State) {
        self.inner.index.send_replace(state.index());
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.inner.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.inner.state.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{Cas, Listing, SessionInfo, SessionSpec, StoreError, StoreResult};
    use futures::FutureExt as _;

    fn answered(key: &str, modify_index: u64) -> Option<KvPair> {
        Some(KvPair {
            key: key.into(),
            value: Default::default(),
            create_index: 1,
            modify_index,
            lock: None,
        })
    }

    fn deletes(writes: Vec<OwnWrite>) -> Vec<(String, Option<u64>)> {
        writes
            .into_iter()
            .filter_map(|write| match write {
                OwnWrite::Delete { key, through } => Some((key, through)),
                OwnWrite::Put(_) => None,
            })
            .collect()
    }

    /// A mirror (not started) of a new embedded store in a directory that lives as long as
    /// the first value.
    async fn embedded(config: MirrorConfig) -> (tempfile::TempDir, Arc<dyn KvStore>, Mirror) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.db").display().to_string();
        let store: Arc<dyn KvStore> =
            Arc::new(crate::kv::sqlite::SqliteStore::open(&path).await.unwrap());
        let mirror = Mirror::new(store.clone(), config);
        (dir, store, mirror)
    }

    /// A watch that fails only after a long wait (a store that hangs until the read times
    /// out) has been out of touch since its last success, not since it failed.
    #[tokio::test]
    async fn a_tree_is_lost_from_its_watchs_last_success() {
        let config = MirrorConfig {
            lost_after: Duration::from_secs(30),
            ..MirrorConfig::default()
        };
        let (_dir, _, mirror) = embedded(config).await;
        let tree = Tree::Rcs;
        mirror.watch_failed(tree, Instant::now() - Duration::from_secs(31));
        assert_eq!(mirror.health().lost.len(), 1);
        mirror.watch_succeeded(tree);
        mirror.watch_failed(tree, Instant::now());
        assert!(mirror.health().lost.is_empty());
    }

    /// An own write is in the entries at once, but in the listed index (what answers claim)
    /// only once a listing confirms it; a confirmation does not wait out the paced reads,
    /// nor for a failing watch.
    #[tokio::test]
    async fn an_own_write_is_listed_once_its_watch_confirms_it() {
        let config = MirrorConfig {
            min_reread_interval: Duration::from_secs(600),
            ..MirrorConfig::default()
        };
        let (_dir, store, mirror) = embedded(config).await;
        let cancel = CancellationToken::new();
        mirror.start(&TaskTracker::new(), cancel.clone());
        mirror.loaded().await;
        let trees = [Tree::Rcs];
        assert!(mirror.seen(&trees, &[]).confirmed);

        let ops = [TxnOp::Set {
            key: layout::rc("a"),
            value: b"{}".to_vec(),
        }];
        let results = store.txn(&ops).await.unwrap();
        let written = OwnWrite::txn_index(&ops, &results).unwrap();
        mirror.apply_own_writes(OwnWrite::from_txn(&ops, &results), Some(written));
        assert!(mirror.get(&layout::rc("a")).is_some());
        assert_eq!(mirror.tree_index(Tree::Rcs), written);
        let seen = mirror.seen(&trees, &[]);
        assert!(seen.index() < written && !seen.confirmed, "{seen:?}");

        // A failing watch cannot confirm anything: it is not waited for.
        mirror.watch_failed(Tree::Rcs, Instant::now());
        let waited = tokio::time::timeout(
            Duration::from_secs(30),
            mirror.confirm(&trees, Duration::from_secs(600)),
        );
        assert_eq!(waited.await, Ok(false));
        mirror.watch_succeeded(Tree::Rcs);

        assert!(mirror.confirm(&trees, Duration::from_secs(30)).await);
        let seen = mirror.seen(&trees, &[]);
        assert!(seen.index() >= written && seen.confirmed, "{seen:?}");
        cancel.cancel();
    }

    /// The roll farm ends a roll in one transaction that deletes the roll's key twice (a
    /// delete-cas at the version it read, then the roll's own delete ops): the roll's
    /// deletion is still to be streamed once a listing confirms it.
    #[tokio::test]
    async fn a_key_deleted_twice_in_one_transaction_is_streamed_as_deleted() {
        let (_dir, _, mirror) = embedded(MirrorConfig::default()).await;
        let roll = layout::roll("r");
        let put = KvPair {
            key: roll.clone(),
            value: b"{}".as_slice().into(),
            create_index: 3,
            modify_index: 3,
            lock: None,
        };
        mirror.apply_own_writes([OwnWrite::Put(put)], Some(3));
        let history = layout::roll_history("r");
        let ops = [
            TxnOp::CheckIndex {
                key: roll.clone(),
                index: 3,
            },
            TxnOp::DeleteCas {
                key: roll.clone(),
                index: 3,
            },
            TxnOp::Delete { key: roll.clone() },
            TxnOp::Set {
                key: history.clone(),
                value: b"{}".to_vec(),
            },
        ];
        let results = [None, None, None, answered(&history, 9)];
        let txn = OwnWrite::txn_index(&ops, &results);
        mirror.apply_own_writes(OwnWrite::from_txn(&ops, &results), txn);
        assert!(mirror.get(&roll).is_none());
        let unstreamed = mirror.unstreamed_deletes(Tree::Rolls);
        let keys: Vec<&str> = unstreamed.iter().map(|e| e.pair.key.as_str()).collect();
        assert_eq!(keys, [roll]);
    }

    /// A store that holds nothing, whose blocking reads of one tree it counts and answers
    /// one by one when told to ([`HeldReads::answer`]), and whose other blocking reads
    /// never answer. Its index for every prefix is 1, but for the tree's once set
    /// otherwise (`tree_index`), as another writer's change would move it.
    struct HeldReads {
        prefix: String,
        tree_index: AtomicU64,
        sent: watch::Sender<usize>,
        answered: watch::Sender<usize>,
        answers: tokio::sync::Semaphore,
    }

    impl HeldReads {
        fn new(tree: Tree) -> Arc<HeldReads> {
            Arc::new(HeldReads {
                prefix: tree.prefix(),
                tree_index: AtomicU64::new(1),
                sent: watch::channel(0).0,
                answered: watch::channel(0).0,
                answers: tokio::sync::Semaphore::new(0),
            })
        }

        /// How many reads of the tree were sent.
        fn sent(&self) -> usize {
            *self.sent.borrow()
        }

        /// Waits until `n` reads of the tree were sent, for at most a minute.
        async fn until_sent(&self, n: usize) {
            let mut sent = self.sent.subscribe();
            let reached = async move { sent.wait_for(|sent| *sent >= n).await.is_ok() };
            let reached = tokio::time::timeout(Duration::from_secs(60), reached).await;
            assert_eq!(reached, Ok(true), "{} reads sent, not {n}", self.sent());
        }

        /// Answers the read under way, and waits until it has been answered.
        async fn answer(&self) {
            let answered = *self.answered.borrow();
            self.answers.add_permits(1);
            let mut done = self.answered.subscribe();
            done.wait_for(|done| *done > answered).await.unwrap();
        }
    }

    fn unused<T>() -> StoreResult<T> {
        Err(StoreError::Invalid("not used by this test".into()))
    }

    #[async_trait::async_trait]
    impl KvStore for HeldReads {
        async fn get(&self, _: &str) -> StoreResult<Option<KvPair>> {
            unused()
        }
        async fn list(&self, _: &str) -> StoreResult<Listing> {
            Ok(Listing {
                index: 1,
                pairs: Vec::new(),
            })
        }
        async fn keys(&self, prefix: &str, _: Option<char>) -> StoreResult<(u64, Vec<String>)> {
            if prefix == self.prefix {
                return Ok((self.tree_index.load(Ordering::SeqCst), Vec::new()));
            }
            Ok((1, Vec::new()))
        }
        async fn current_index(&self, _: &str) -> StoreResult<Option<u64>> {
            Ok(Some(1))
        }
        async fn put(&self, _: &str, _: &[u8], _: Cas) -> StoreResult<()> {
            unused()
        }
        async fn delete(&self, _: &str, _: Cas) -> StoreResult<()> {
            unused()
        }
        async fn delete_prefix(&self, _: &str) -> StoreResult<()> {
            unused()
        }
        fn key_prefix_len(&self) -> usize {
            0
        }
        async fn txn(&self, _: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
            unused()
        }
        async fn create_session(&self, _: &SessionSpec) -> StoreResult<String> {
            unused()
        }
        async fn renew_session(&self, _: &str) -> StoreResult<SessionInfo> {
            unused()
        }
        async fn destroy_session(&self, _: &str) -> StoreResult<()> {
            unused()
        }
        async fn session_info(&self, _: &str) -> StoreResult<Option<SessionInfo>> {
            unused()
        }
        async fn acquire(&self, _: &str, _: &[u8], _: &str) -> StoreResult<bool> {
            unused()
        }
        async fn release(&self, _: &str, _: &str) -> StoreResult<bool> {
            unused()
        }
        async fn watch(&self, target: &WatchTarget, _: u64, _: Duration) -> StoreResult<Listing> {
            if !matches!(target, WatchTarget::Prefix(prefix) if *prefix == self.prefix) {
                std::future::pending::<()>().await;
            }
            self.sent.send_modify(|sent| *sent += 1);
            self.answers.acquire().await.unwrap().forget();
            self.answered.send_modify(|answered| *answered += 1);
            self.list(&self.prefix).await
        }
        async fn ping(&self) -> StoreResult<()> {
            Ok(())
        }
    }

    /// A reader's ask-again for a tree that holds nothing asks the read under way again,
    /// and only that one: asked while no read was under way (between two), it would
    /// otherwise be kept, and the next read, sent at once for the reader, asked again
    /// after the pacing interval, one read more than the reader needed.
    #[tokio::test(start_paused = true)]
    async fn asking_a_tree_again_between_its_reads_leaves_its_next_read_alone() {
        let tree = Tree::Rolls;
        let store = HeldReads::new(tree);
        let config = MirrorConfig::default();
        let interval = config.min_reread_interval;
        let mirror = Mirror::new(store.clone(), config);
        let cancel = CancellationToken::new();
        mirror.start(&TaskTracker::new(), cancel.clone());
        mirror.loaded().await;
        assert!(mirror.read().tree(tree).holds_nothing());

        // The tree's first blocking read answers: none is under way while it is paced.
        store.until_sent(1).await;
        store.answer().await;
        mirror.hurry(tree);
        store.until_sent(2).await;
        tokio::time::sleep(interval * 4).await;
        assert_eq!(
            store.sent(),
            2,
            "the read sent for the reader was asked again"
        );

        // Asked while a read is under way, that read is asked again once it has had the
        // pacing interval to answer.
        mirror.hurry(tree);
        store.until_sent(3).await;
        cancel.cancel();
    }

    /// A tree read whole again (here after a resync: the store went backwards, or could
    /// not tell) may come back to the generation, listed and complete indexes it stood at,
    /// its index claimed anew: an empty tree counts at the index it was read whole at, no
    /// longer at the one it came to hold nothing. Versions read before then are not those
    /// of the answers read after, or a kept answer would be served with the `X-Index` it
    /// had.
    #[tokio::test]
    async fn versions_read_before_a_resync_are_not_those_after_it() {
        let (_dir, _store, mirror) = embedded(MirrorConfig::default()).await;
        let tree = Tree::Conditions;
        let empty = |index| {
            PrefixUpdate::Whole(Listing {
                index,
                pairs: Vec::new(),
            })
        };
        assert!(mirror.apply_update(tree, empty(3), true, 0));
        assert!(mirror.apply_update(tree, empty(9), false, 0));
        let (before, claimed) = (mirror.versions(&[tree]), mirror.claimable_index(&[tree]));

        assert!(mirror.resync(0));
        assert!(mirror.apply_update(tree, empty(9), true, 1));
        let claimable = mirror.claimable_index(&[tree]);
        assert_eq!((claimed, claimable), (3, 9));
        assert_ne!(
            mirror.versions(&[tree]),
            before,
            "the versions stayed while the X-Index moved from {claimed} to {claimable}"
        );
    }

    /// A reader that asks for a tree while its read is under way has the next read sent
    /// without waiting out the pacing, when the read under way brings less than it waits
    /// for: the signal carries no index, so the watch cannot tell whether that read did,
    /// and only one sent after the reader asked is sure to. Were the signal lost for want
    /// of a pause to wake (`Notify::notify_waiters` to a pause not yet begun), the reader
    /// would wait out the pacing with no read pending.
    #[tokio::test(start_paused = true)]
    async fn a_reader_asking_during_a_read_that_brings_too_little_has_the_next_sent_at_once() {
        let tree = Tree::Rolls;
        let store = HeldReads::new(tree);
        // Far past the minute `HeldReads::until_sent` waits for a read.
        let config = MirrorConfig {
            min_reread_interval: Duration::from_secs(3600),
            ..MirrorConfig::default()
        };
        let mirror = Mirror::new(store.clone(), config);
        let cancel = CancellationToken::new();
        mirror.start(&TaskTracker::new(), cancel.clone());
        mirror.loaded().await;

        // Another writer's change to the tree, at 5: a reader waits for it, and has the
        // tree's first blocking read sent at once.
        store.tree_index.store(5, Ordering::SeqCst);
        let (trees, long) = ([tree], Duration::from_secs(36_000));
        let mut reached = Box::pin(mirror.wait_for_trees(&trees, 5, long));
        assert_eq!((&mut reached).now_or_never(), None);
        store.until_sent(1).await;
        // Another reader asks while that read is under way, which then answers at 1.
        let mut caught_up = Box::pin(mirror.catch_up_to(&trees, 5, long));
        assert_eq!((&mut caught_up).now_or_never(), None);
        store.answer().await;

        store.until_sent(2).await;
        cancel.cancel();
    }

    /// A wait for a tree to catch up with the store's index for it ends as soon as the
    /// store goes backwards: that index is the old store's, which the tree, read again from
    /// the fresh store, need not reach for long, and the waiter starts again from the fresh
    /// store's (as the farms' world does). Before, it waited out its whole timeout.
    #[tokio::test(start_paused = true)]
    async fn a_wait_for_a_tree_to_catch_up_ends_once_the_store_went_backwards() {
        let tree = Tree::Rolls;
        let store = HeldReads::new(tree);
        let mirror = Mirror::new(store.clone(), MirrorConfig::default());
        let cancel = CancellationToken::new();
        mirror.start(&TaskTracker::new(), cancel.clone());
        mirror.loaded().await;

        // Another writer's change to the tree, at 4, which its blocking read holds back,
        // and the server's own write at 5.
        store.until_sent(1).await;
        store.tree_index.store(5, Ordering::SeqCst);
        let own = KvPair {
            value: b"{}".as_slice().into(),
            ..answered(&layout::roll("r"), 5).unwrap()
        };
        mirror.apply_own_writes([OwnWrite::Put(own)], Some(5));
        let (trees, long) = ([tree], Duration::from_secs(3600));
        let mut reached = Box::pin(mirror.wait_for_trees(&trees, 5, long));
        let mut caught_up = Box::pin(mirror.catch_up_to(&trees, 5, long));
        let mut confirmed = Box::pin(mirror.confirm(&trees, long));
        assert_eq!((&mut reached).now_or_never(), None);
        assert_eq!((&mut caught_up).now_or_never(), None);
        assert_eq!((&mut confirmed).now_or_never(), None);

        // The store goes backwards, to a tree at 1.
        store.tree_index.store(1, Ordering::SeqCst);
        assert!(mirror.resync(mirror.current_epoch()));
        let ended = [
            (&mut reached).now_or_never(),
            (&mut caught_up).now_or_never(),
            (&mut confirmed).now_or_never(),
        ];

        assert_eq!(
            ended,
            [Some(false); 3],
            "a wait (wait_for_trees, catch_up_to, confirm) went on past the store going \
             backwards"
        );
        cancel.cancel();
    }

    /// A catch-up asked after the store went backwards waits for the tree to be read again
    /// from the fresh store: until then the tree's listed index is the old store's, which
    /// may lie past the fresh store's index for the tree, and would count the tree as
    /// caught up with a store it has not read since. Before, it answered true at once.
    #[tokio::test(start_paused = true)]
    async fn a_catch_up_after_the_store_went_backwards_waits_for_the_tree_read_again() {
        let tree = Tree::Rolls;
        let store = HeldReads::new(tree);
        let mirror = Mirror::new(store.clone(), MirrorConfig::default());
        let listing = |index| {
            PrefixUpdate::Whole(Listing {
                index,
                pairs: vec![answered(&layout::roll("r"), index).unwrap()],
            })
        };
        assert!(mirror.apply_update(tree, listing(5), true, 0));

        // The store goes backwards, to a tree at 1.
        store.tree_index.store(1, Ordering::SeqCst);
        assert!(mirror.resync(0));
        let (trees, long) = ([tree], Duration::from_secs(3600));
        let mut caught_up = Box::pin(mirror.catch_up(&trees, long));
        assert_eq!(
            (&mut caught_up).now_or_never(),
            None,
            "a catch-up asked once the store went backwards answered before the tree was \
             read again"
        );

        // Read again, from the fresh store.
        assert!(mirror.apply_update(tree, listing(1), true, 1));
        assert_eq!((&mut caught_up).now_or_never(), Some(true));
    }

    /// A mirror over a store of the rolls' tree alone, listed whole at `index` with one roll.
    fn rolls_listed_at(index: u64) -> (Arc<HeldReads>, Mirror) {
        let store = HeldReads::new(Tree::Rolls);
        let mirror = Mirror::new(store.clone(), MirrorConfig::default());
        let listing = PrefixUpdate::Whole(Listing {
            index,
            pairs: vec![answered(&layout::roll("r"), index).unwrap()],
        });
        assert!(mirror.apply_update(Tree::Rolls, listing, true, 0));
        (store, mirror)
    }

    /// Checks that `wait`, pending on the rolls' tree, ends unreached as soon as that tree's
    /// watch fails, not at its timeout (`what` says which wait did not).
    fn ended_by_the_watch_failing(
        mirror: &Mirror,
        wait: impl std::future::Future<Output = bool>,
        what: &str,
    ) {
        let mut wait = Box::pin(wait);
        assert_eq!((&mut wait).now_or_never(), None);
        mirror.watch_failed(Tree::Rolls, Instant::now());
        assert_eq!((&mut wait).now_or_never(), Some(false), "{what}");
    }

    /// A tree whose watch is failing is not waited for, also while it is yet to be read
    /// again since the store went backwards: the catch-up answers at once that it has not
    /// caught up, rather than wait out its timeout for a read the failing watch does not
    /// make until its backoff is over. Before, it waited for the tree's read again.
    #[tokio::test(start_paused = true)]
    async fn a_catch_up_does_not_wait_for_a_failing_tree_to_be_read_again() {
        let tree = Tree::Rolls;
        let (store, mirror) = rolls_listed_at(5);

        // The store goes backwards, and the tree's read again fails.
        store.tree_index.store(1, Ordering::SeqCst);
        assert!(mirror.resync(0));
        mirror.watch_failed(tree, Instant::now());
        let (trees, long) = ([tree], Duration::from_secs(3600));
        let caught_up = mirror.catch_up(&trees, long).now_or_never();
        assert_eq!(
            caught_up,
            Some(false),
            "a catch-up waited for a failing tree to be read again"
        );
    }

    /// A catch-up already waiting for the tree to be read again since the store went
    /// backwards answers as soon as that read fails, as one asked after the failure does,
    /// rather than wait out its timeout for a read the failing watch does not make until
    /// its backoff is over. Before, a failed read woke no waiter.
    #[tokio::test(start_paused = true)]
    async fn a_catch_up_waiting_for_the_tree_read_again_answers_once_that_read_fails() {
        let tree = Tree::Rolls;
        let (store, mirror) = rolls_listed_at(5);

        // The store goes backwards; a catch-up waits for the tree's read again.
        store.tree_index.store(1, Ordering::SeqCst);
        assert!(mirror.resync(0));
        let (trees, long) = ([tree], Duration::from_secs(3600));
        let caught_up = mirror.catch_up(&trees, long);
        // That read fails.
        ended_by_the_watch_failing(
            &mirror,
            caught_up,
            "a catch-up waiting for the tree's read again was not woken by its failure",
        );
    }

    /// A catch-up waiting for a tree's watch to list past the store's index for it answers
    /// as soon as the watch fails, as one asked once it has failed does, rather than wait
    /// out its timeout for a read the failing watch does not make until its backoff is over.
    #[tokio::test(start_paused = true)]
    async fn a_catch_up_waiting_for_the_trees_listing_answers_once_its_watch_fails() {
        let tree = Tree::Rolls;
        let (store, mirror) = rolls_listed_at(1);

        // Another writer's change to the tree, at 5: a catch-up waits for its listing.
        store.tree_index.store(5, Ordering::SeqCst);
        let (trees, long) = ([tree], Duration::from_secs(3600));
        let caught_up = mirror.catch_up_to(&trees, 5, long);
        ended_by_the_watch_failing(
            &mirror,
            caught_up,
            "a catch-up waiting for the tree's listing was not ended by its watch's failure",
        );
    }

    /// A wait for a tree's watch to confirm the server's own write answers unconfirmed as
    /// soon as the watch fails, as one asked once it has failed does, rather than wait out
    /// its timeout for a read the failing watch does not make until its backoff is over.
    #[tokio::test(start_paused = true)]
    async fn a_confirmation_waiting_for_a_tree_ends_once_its_watch_fails() {
        let tree = Tree::Rolls;
        let store = HeldReads::new(tree);
        let mirror = Mirror::new(store.clone(), MirrorConfig::default());
        let own = KvPair {
            value: b"{}".as_slice().into(),
            ..answered(&layout::roll("r"), 5).unwrap()
        };
        mirror.apply_own_writes([OwnWrite::Put(own)], Some(5));
        let (trees, long) = ([tree], Duration::from_secs(3600));
        let confirmed = mirror.confirm(&trees, long);
        ended_by_the_watch_failing(
            &mirror,
            confirmed,
            "a confirmation waiting for the tree was not ended by its watch's failure",
        );
    }

    /// A client cut off resumes from its last position, which must still be retained.
    #[test]
    fn a_subscriber_cut_off_can_resume_from_the_retained_changes() {
        let config = MirrorConfig::default();
        assert!(config.retained_changes >= config.subscriber_buffer);
    }

    #[test]
    fn a_txn_delete_is_gone_through_the_index_its_writes_answer() {
        // A read answers an older index, which says nothing of when the txn ran.
        let ops = [
            TxnOp::Get { key: "a".into() },
            TxnOp::Delete { key: "b".into() },
            TxnOp::Set {
                key: "c".into(),
                value: b"{}".to_vec(),
            },
        ];
        let results = [answered("a", 3), None, answered("c", 9)];
        assert_eq!(
            deletes(OwnWrite::from_txn(&ops, &results)),
            [("b".into(), Some(9))]
        );

        // Deletes only: a compare-and-delete's named version, else no known index.
        let ops = [
            TxnOp::Get { key: "a".into() },
            TxnOp::DeleteCas {
                key: "b".into(),
                index: 4,
            },
            TxnOp::Delete { key: "c".into() },
        ];
        let results = [answered("a", 3), None, None];
        assert_eq!(
            deletes(OwnWrite::from_txn(&ops, &results)),
            [("b".into(), Some(4)), ("c".into(), None)]
        );
    }

    #[test]
    fn a_txn_index_is_known_only_when_every_write_answers_it() {
        let set = |key: &str| TxnOp::Set {
            key: key.into(),
            value: b"{}".to_vec(),
        };
        let ops = [TxnOp::Get { key: "a".into() }, set("b"), set("c")];
        let index = |results: &[Option<KvPair>]| OwnWrite::txn_index(&ops, results);
        assert_eq!(
            index(&[answered("a", 3), answered("b", 9), answered("c", 9)]),
            Some(9)
        );
        // A write without its pair: what else the transaction wrote is not known.
        assert_eq!(index(&[answered("a", 3), answered("b", 9), None]), None);
    }
}
