//! Which trees the mirror follows, what each entry holds, and the kinds of the change stream.
//!
//! A tree is named by its prefix in [`crate::layout`]; an entry keeps the raw pair (so
//! reads can answer with indexes and CAS tokens exactly as the store would) and the typed
//! view decoded once, when the entry changed.

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use serde::Serialize;

use crate::interner::{Interner, NAMES};
use crate::kv::KvPair;
use crate::labels::{self, CompactLabels, LabelType};
use crate::layout;
use crate::model::timestamp::parse_rfc3339;
use crate::model::{HealthRecord, HealthState, StoredDaemonSet, StoredRc, StoredRoll};

/// A tree the mirror follows with one blocking watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tree {
    Rcs,
    Rolls,
    DaemonSets,
    Labels(LabelType),
    Intent,
    Reality,
    Health,
    DsStatus,
    /// The conditions the farms compute, beside P2's trees.
    Conditions,
    Locks,
    /// This server's events, bounded by retention.
    Events,
    /// Created and modified times of RCs, rolls and daemon sets.
    Meta,
    /// Finished rolls, bounded by retention.
    RollHistory,
}

impl Tree {
    /// Every tree the server reads. Audit records are write-only and not mirrored.
    pub const ALL: [Tree; 17] = [
        Tree::Rcs,
        Tree::Rolls,
        Tree::DaemonSets,
        Tree::Labels(LabelType::Node),
        Tree::Labels(LabelType::Pod),
        Tree::Labels(LabelType::ReplicationController),
        Tree::Labels(LabelType::Rolls),
        Tree::Labels(LabelType::PodClusters),
        Tree::Intent,
        Tree::Reality,
        Tree::Health,
        Tree::DsStatus,
        Tree::Conditions,
        Tree::Locks,
        Tree::Events,
        Tree::Meta,
        Tree::RollHistory,
    ];

    /// The tree's key prefix.
    pub fn prefix(self) -> String {
        match self {
            Tree::Labels(label_type) => layout::labels_of_type(label_type),
            other => other.fixed_prefix().to_owned(),
        }
    }

    /// The prefix of a tree other than a label tree, as a constant.
    fn fixed_prefix(self) -> &'static str {
        match self {
            Tree::Rcs => layout::RCS,
            Tree::Rolls => layout::ROLLS,
            Tree::DaemonSets => layout::DAEMON_SETS,
            Tree::Intent => layout::INTENT,
            Tree::Reality => layout::REALITY,
            Tree::Health => layout::HEALTH,
            Tree::DsStatus => layout::DS_STATUS,
            Tree::Conditions => layout::CONDITIONS,
            Tree::Locks => layout::LOCKS,
            Tree::Events => layout::EVENTS,
            Tree::Meta => layout::META,
            Tree::RollHistory => layout::ROLL_HISTORY,
            Tree::Labels(_) => layout::LABELS,
        }
    }

    /// Whether `key` lies in this tree; checked on every read, so it builds no string.
    fn holds(self, key: &str) -> bool {
        let Some(rest) = key.strip_prefix(self.fixed_prefix()) else {
            return false;
        };
        match self {
            Tree::Labels(label_type) => rest
                .strip_prefix(label_type.as_str())
                .is_some_and(|rest| rest.starts_with('/')),
            _ => true,
        }
    }

    /// Its position in [`Tree::ALL`].
    pub fn position(self) -> usize {
        Tree::ALL
            .iter()
            .position(|tree| *tree == self)
            .expect("every tree is in Tree::ALL")
    }

    /// The tree a key belongs to, if the mirror follows it.
    pub fn of_key(key: &str) -> Option<Tree> {
        Tree::ALL.into_iter().find(|tree| tree.holds(key))
    }

    /// The kind its changes have in the change stream; `None` for the farms' bookkeeping
    /// (locks, status records, conditions, times, finished rolls), which is no dashboard's
    /// business: the objects' views, their own changes and the events tell it.
    pub fn kind(self) -> Option<Kind> {
        match self {
            Tree::Rcs => Some(Kind::Rcs),
            Tree::Rolls => Some(Kind::Rolls),
            Tree::DaemonSets => Some(Kind::Daemonsets),
            Tree::Labels(LabelType::Node) => Some(Kind::Nodes),
            Tree::Labels(_) => Some(Kind::Labels),
            Tree::Intent => Some(Kind::Pods),
            Tree::Reality => Some(Kind::Reality),
            Tree::Health => Some(Kind::Health),
            Tree::Events => Some(Kind::Events),
            Tree::DsStatus | Tree::Conditions | Tree::Locks | Tree::Meta | Tree::RollHistory => {
                None
            }
        }
    }

    /// Whether many of its keys hold the same bytes: an RC's replicas carry one manifest
    /// (in intent and again in reality) and one label set.
    fn values_repeat(self) -> bool {
        matches!(self, Tree::Labels(_) | Tree::Intent | Tree::Reality)
    }

    /// Decodes a pair of this tree into its typed view.
    pub fn decode(self, mut pair: KvPair) -> Entry {
        if self.values_repeat() {
            pair.value = VALUES.bytes(pair.value);
        }
        let problem = |e: &dyn std::fmt::Display| View::Unreadable(Arc::new(e.to_string()));
        let view = match self {
            Tree::Rcs => StoredRc::from_stored(layout::rc_id(&pair.key), &pair.value)
                .map_or_else(|e| problem(&e), |rc| View::Rc(Arc::new(rc))),
            Tree::Rolls => StoredRoll::from_json(&pair.value)
                .map_or_else(|e| problem(&e), |roll| View::Roll(Arc::new(roll))),
            Tree::DaemonSets => StoredDaemonSet::from_json(&pair.value)
                .map_or_else(|e| problem(&e), |ds| View::DaemonSet(Arc::new(ds))),
            Tree::Labels(_) => LABEL_SETS
                .share(&pair.value, || {
                    labels::from_json(&pair.value)
                        .ok()
                        .map(|set| Arc::new(set.into()))
                })
                .map_or_else(
                    || View::Unreadable(Arc::new("not a label set".into())),
                    View::Labels,
                ),
            Tree::Health => match HealthRecord::from_json(&pair.value) {
                Err(e) => problem(&e),
                Ok(record) => match HealthParts::of(&record, &pair.value) {
                    Some(parts) => {
                        pair.value = NO_VALUE.clone();
                        View::HealthParts(Box::new(parts))
                    }
                    None => View::Health(HealthView::shared(&record.node, record.status)),
                },
            },
            Tree::Intent
            | Tree::Reality
            | Tree::Events
            | Tree::DsStatus
            | Tree::Conditions
            | Tree::Locks
            | Tree::Meta
            | Tree::RollHistory => View::Raw,
        };
        Entry { pair, view }
    }
}

/// The values of the trees whose values repeat, shared by content: a fleet's intent tree
/// then holds a manifest per RC rather than one per pod.
static VALUES: LazyLock<Interner<[u8]>> = LazyLock::new(Interner::default);

/// The label sets of every mirror, shared by their stored bytes: an RC's replicas carry the
/// same labels, so a fleet's pod-label tree holds a set per RC rather than one per pod.
static LABEL_SETS: LazyLock<Interner<CompactLabels>> = LazyLock::new(Interner::default);

/// The value of a pair whose view encodes it again ([`View::HealthParts`]): one for all.
static NO_VALUE: LazyLock<Arc<[u8]>> = LazyLock::new(|| Arc::from([]));

/// One mirrored key: the pair as the store holds it and its typed view. Read the value
/// through [`Entry::value`] or [`Entry::to_pair`]: a health record the view encodes again
/// is not kept as bytes too, and its pair's value is empty.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub pair: KvPair,
    pub view: View,
}

impl Entry {
    /// The value as stored.
    pub fn value(&self) -> Cow<'_, [u8]> {
        match &self.view {
            View::HealthParts(parts) => Cow::Owned(parts.encode()),
            _ => Cow::Borrowed(&self.pair.value),
        }
    }

    /// The pair as stored.
    pub fn to_pair(&self) -> KvPair {
        match &self.view {
            View::HealthParts(parts) => KvPair {
                value: parts.encode().into(),
                ..self.pair.clone()
            },
            _ => self.pair.clone(),
        }
    }

    /// What a health entry says: the node its record names and its state.
    pub fn health(&self) -> Option<&HealthView> {
        match &self.view {
            View::Health(view) => Some(view),
            View::HealthParts(parts) => Some(&parts.view),
            _ => None,
        }
    }

    /// For a health entry whose record names another node than its key's
    /// (`health/<pod_id>/<node>`), the node it names: P2 takes a result as the health of the
    /// node its record names. `None` for a record naming its key's node or none.
    pub fn health_named_elsewhere(&self) -> Option<&str> {
        let named = &*self.health()?.node;
        let key_node = self.pair.key.rsplit('/').next()?;
        (!named.is_empty() && named != key_node).then_some(named)
    }

    /// The label set, for label entries.
    pub fn labels(&self) -> Option<&CompactLabels> {
        match &self.view {
            View::Labels(labels) => Some(labels),
            _ => None,
        }
    }
}

/// What an entry's value decodes to, decided by its tree. A value that does not decode is
/// kept (reads that need it skip it, as P2 does) with the reason. Every variant holds one
/// pointer at most, so that a view takes two words and the entries of every tree stay
/// small (a health record inline would make each of them 100 bytes larger).
#[derive(Debug, Clone, PartialEq)]
pub enum View {
    Rc(Arc<StoredRc>),
    Roll(Arc<StoredRoll>),
    DaemonSet(Arc<StoredDaemonSet>),
    /// Shared with every entry of the same bytes.
    Labels(Arc<CompactLabels>),
    /// Shared with every entry naming the same node in the same state.
    /// A health record kept as its bytes.
    Health(Arc<HealthView>),
    /// A health record kept as the parts that encode it again, without its bytes.
    HealthParts(Box<HealthParts>),
    /// Manifests, events, status records, conditions, locks, times and finished rolls: read
    /// as bytes by whoever needs them (events are many and read a page at a time).
    Raw,
    /// Why the value does not decode; an `Arc<String>` (one pointer) rather than a `str`.
    Unreadable(Arc<String>),
}

/// What the farms read of a health record: the node it names and its state. Readers of the
/// whole record decode the entry's bytes; kept whole, a fleet's hundred thousand records
/// would cost five strings each.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthView {
    /// The record's own `Node` field (P2 keys results by it, not by the key).
    pub node: Arc<str>,
    pub status: HealthState,
}

/// A health record as this server writes it (P2's format, `Time` given, `Expires` a
/// century on, the pod's id as `Id` and `Service`), kept as its parts: 40 bytes rather than
/// the record's 190. Records another writer stored differently keep their bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthParts {
    pub view: Arc<HealthView>,
    pod_id: Arc<str>,
    time: SystemTime,
}

impl HealthParts {
    /// The parts of `record`, read from `bytes`, when they encode exactly `bytes` again.
    fn of(record: &HealthRecord, bytes: &[u8]) -> Option<HealthParts> {
        let time = parse_rfc3339(&record.time)?;
        let again = HealthRecord::new(&record.id, &record.node, record.status, time);
        (again.to_json() == bytes).then(|| HealthParts {
            view: HealthView::shared(&record.node, record.status),
            pod_id: NAMES.text(&record.id),
            time,
        })
    }

    /// The record's bytes.
    fn encode(&self) -> Vec<u8> {
        let view = &self.view;
        HealthRecord::new(&self.pod_id, &view.node, view.status, self.time).to_json()
    }
}

/// Health views by node and state: a fleet's results name each node in one or two states.
static HEALTH_VIEWS: LazyLock<Interner<HealthView>> = LazyLock::new(Interner::default);

impl HealthView {
    /// The view shared by every result naming `node` in `status`.
    fn shared(node: &str, status: HealthState) -> Arc<HealthView> {
        let found_by = [status.as_str().as_bytes(), b"/", node.as_bytes()].concat();
        HEALTH_VIEWS
            .share(&found_by, || {
                Some(Arc::new(HealthView {
                    node: NAMES.text(node),
                    status,
                }))
            })
            .expect("a health view is always made")
    }
}

/// The kinds of object the change stream (`GET /api/v1/watch`) reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Rcs,
    Rolls,
    Daemonsets,
    /// Nodes, known from their node labels.
    Nodes,
    /// Label sets of the other types, identified as `<type>/<id>`.
    Labels,
    /// Legacy pods in the intent tree, identified as `<node>/<pod_id>`.
    Pods,
    /// Manifests nodes report installed, identified as `<node>/<pod_id>`.
    Reality,
    /// Health records, identified as `<pod_id>/<node>`.
    Health,
    /// This server's events (`GET /api/v1/events`), identified by event id; only when asked
    /// for, as their snapshot is the whole retained history.
    Events,
}

impl Kind {
    /// Every kind, in the order the stream's documentation lists them.
    pub const ALL: [Kind; 9] = [
        Kind::Rcs,
        Kind::Rolls,
        Kind::Daemonsets,
        Kind::Nodes,
        Kind::Labels,
        Kind::Pods,
        Kind::Reality,
        Kind::Health,
        Kind::Events,
    ];

    /// Its position in [`Kind::ALL`].
    pub fn position(self) -> usize {
        Kind::ALL
            .iter()
            .position(|kind| *kind == self)
            .expect("every kind is in Kind::ALL")
    }

    /// The kinds a stream carries when none are asked for: all but events.
    pub fn defaults() -> impl Iterator<Item = Kind> {
        Kind::ALL.into_iter().filter(|kind| *kind != Kind::Events)
    }

    /// The name used in `?kinds=` and in events.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Rcs => "rcs",
            Kind::Rolls => "rolls",
            Kind::Daemonsets => "daemonsets",
            Kind::Nodes => "nodes",
            Kind::Labels => "labels",
            Kind::Pods => "pods",
            Kind::Reality => "reality",
            Kind::Health => "health",
            Kind::Events => "events",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    /// The label type whose sets label objects of this kind, if they have labels. Nodes and
    /// label sets are their own labels.
    pub fn label_type(self) -> Option<LabelType> {
        match self {
            Kind::Rcs => Some(LabelType::ReplicationController),
            Kind::Rolls => Some(LabelType::Rolls),
            Kind::Nodes => Some(LabelType::Node),
            Kind::Pods => Some(LabelType::Pod),
            Kind::Labels => None,
            Kind::Daemonsets | Kind::Reality | Kind::Health | Kind::Events => None,
        }
    }

    /// Whether a label selector applies to objects of this kind.
    pub fn has_labels(self) -> bool {
        self.label_type().is_some() || self == Kind::Labels
    }

    /// The trees whose changes have this kind.
    pub fn trees(self) -> impl Iterator<Item = Tree> {
        Tree::ALL
            .into_iter()
            .filter(move |tree| tree.kind() == Some(self))
    }
}

/// The id an entry of `tree` has in the change stream: its key without the tree's prefix,
/// and for labels of the other types `<type>/<id>`.
pub fn object_id(tree: Tree, key: &str) -> &str {
    let prefix_len = match tree {
        Tree::Labels(_) if tree.kind() == Some(Kind::Labels) => layout::LABELS.len(),
        Tree::Labels(_) => tree.prefix().len(),
        other => other.fixed_prefix().len(),
    };
    key.get(prefix_len..).unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four trees hold an entry per pod: with its shared count, an entry fits the
    /// allocator's 96-byte size class, where one word more would take 112 bytes.
    #[test]
    fn an_entry_is_at_most_80_bytes() {
        assert!(std::mem::size_of::<Entry>() <= 80);
    }

    #[test]
    fn every_key_of_a_followed_tree_finds_its_tree() {
        for tree in Tree::ALL {
            let key = format!("{}x", tree.prefix());
            assert_eq!(Tree::of_key(&key), Some(tree), "{key}");
        }
        assert_eq!(Tree::of_key("audit_logs/x"), None);
        assert_eq!(Tree::of_key("labels/unknown/x"), None);
    }

    fn decode(tree: Tree, key: &str, value: &str) -> Entry {
        tree.decode(KvPair {
            key: key.into(),
            value: value.as_bytes().into(),
            create_index: 1,
            modify_index: 1,
            lock: None,
        })
    }

    #[test]
    fn the_same_manifest_on_two_nodes_is_kept_once_and_an_rc_document_is_not_shared() {
        let a = decode(Tree::Intent, "intent/n1/hello", "id: hello\n");
        let b = decode(Tree::Reality, "reality/n2/hello", "id: hello\n");
        assert!(Arc::ptr_eq(&a.pair.value, &b.pair.value));
        let doc = r#"{"id":"x"}"#;
        let a = decode(Tree::Rcs, "replication_controllers/x", doc);
        let b = decode(Tree::Rcs, "replication_controllers/x", doc);
        assert!(!Arc::ptr_eq(&a.pair.value, &b.pair.value));
    }

    #[test]
    fn results_naming_one_node_in_one_state_share_their_view() {
        let result = |pod: &str, status: &str| {
            let record = format!(
                r#"{{"Id":"{pod}","Node":"n1","Service":"{pod}","Status":"{status}","Time":"t","Expires":"e"}}"#
            );
            match decode(Tree::Health, &format!("health/n1/{pod}"), &record).view {
                View::Health(view) => view,
                other => panic!("not a health view: {other:?}"),
            }
        };
        let a = result("a", "passing");
        assert_eq!((&*a.node, a.status), ("n1", HealthState::Passing));
        assert!(Arc::ptr_eq(&a, &result("b", "passing")));
        let critical = result("c", "critical");
        assert_eq!(critical.status, HealthState::Critical);
        assert!(!Arc::ptr_eq(&a, &critical));
    }

    #[test]
    fn a_record_this_server_writes_is_kept_as_its_parts_and_encodes_the_same_bytes() {
        let now = SystemTime::now();
        let record = HealthRecord::new("hello", "n1", HealthState::Critical, now);
        let bytes = String::from_utf8(record.to_json()).unwrap();
        let entry = decode(Tree::Health, "health/hello/n1", &bytes);
        assert!(
            matches!(entry.view, View::HealthParts(_)),
            "{:?}",
            entry.view
        );
        assert!(entry.pair.value.is_empty(), "the bytes are not kept");
        assert_eq!(entry.value(), bytes.as_bytes());
        assert_eq!(entry.to_pair().value.as_ref(), bytes.as_bytes());
        let view = entry.health().unwrap();
        assert_eq!((&*view.node, view.status), ("n1", HealthState::Critical));

        // P2's preparer writes its local time: kept as written.
        let p2 = r#"{"Id":"hello","Node":"n1","Service":"hello","Status":"passing","Time":"2020-01-14T11:06:40.123456789-08:00","Expires":"2120-01-14T11:06:40.123456789-08:00"}"#;
        let entry = decode(Tree::Health, "health/hello/n1", p2);
        assert!(matches!(entry.view, View::Health(_)), "{:?}", entry.view);
        assert_eq!(entry.value(), p2.as_bytes());
        assert_eq!(entry.health().unwrap().status, HealthState::Passing);
    }

    #[test]
    fn a_view_is_a_pointer_and_its_variant() {
        assert!(std::mem::size_of::<View>() <= 16);
    }

    #[test]
    fn object_ids_drop_the_tree_prefix() {
        assert_eq!(object_id(Tree::Intent, "intent/n1/hello"), "n1/hello");
        assert_eq!(
            object_id(Tree::Labels(LabelType::Node), "labels/node/n1"),
            "n1"
        );
        assert_eq!(
            object_id(Tree::Labels(LabelType::Pod), "labels/pod/n1/hello"),
            "pod/n1/hello"
        );
    }
}
