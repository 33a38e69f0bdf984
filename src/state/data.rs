//! The mirrored entries, their secondary indexes, and the rules that merge the two sources
//! of change (a tree's listings and the server's own writes) without either undoing the
//! other.
//!
//! A listing reflects its tree up to its index; an own write is already at its own index,
//! which may be past the latest listing. So, unless the listing is authoritative (the first
//! read of a tree, or a re-read after the store went backwards):
//! - a listed pair replaces an entry only if its modify index is higher;
//! - an own write applied after a listing at or past its index is not applied: that
//!   listing took it in already, or what replaced it since (another writer's delete);
//! - an entry the listing lacks is removed only if its modify index is not past the
//!   listing's (else it was written after the listing was taken);
//! - an own delete comes with an index up to which no version of the key is current: it
//!   removes only an entry written at or before that index (a newer one was written after
//!   the delete, by another writer, and the watch may bring it first), and leaves a
//!   tombstone burying every version up to that index, held or not yet, so an older
//!   listing that still holds one does not bring it back; the tombstone goes (and the
//!   deletion is streamed, if the mirror held the key) once a listing no longer holds the
//!   key, or holds a newer version, or once a listing from after the delete is applied, or
//!   once the server itself writes a newer version.
//!
//! The changes since an index (where the store can tell them) follow the same rules, a
//! reported delete standing for a listing's absence: it removes an entry not rewritten
//! since, and confirms an own delete.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use crate::kv::{KvPair, PrefixUpdate};
use crate::labels::{CompactLabels, LabelType};
use crate::model::event::Event;

use super::changes::{ChangeType, Stream};
use super::entries::{ById, Entries, Journal};
use super::trees::{Entry, Tree};
use crate::layout;

/// One tree's entries and bookkeeping.
#[derive(Debug, Default)]
pub(super) struct TreeState {
    /// The highest index the tree's entries reflect (its listings' and own writes').
    pub index: u64,
    /// The index of the newest listing applied: what the tree's watch has shown, the
    /// server's own writes aside.
    pub listed: u64,
    /// Every change to the tree up to this index is in `entries`: `listed`, or higher once a
    /// read of the tree that began after a higher index was committed has been applied
    /// (`Mirror::catch_up`).
    pub complete: u64,
    /// While the tree holds nothing, the index listed as it came to hold nothing (its last
    /// change, a delete, as the store lists an emptied prefix at its newest delete), or as
    /// it was read whole holding nothing: see [`TreeState::changed_index`].
    pub emptied: u64,
    /// Moves on every change of `entries`, so readers can tell a tree changed even when its
    /// index did not (an own delete).
    pub generation: u64,
    pub entries: Entries,
    /// The latest changes of `entries`, by the generation each made.
    pub journal: Journal,
    /// Own deletes not yet confirmed by a listing.
    pub tombstones: HashMap<String, Tombstone>,
    /// The indexes of the server's own transactions past `listed` whose pairs in the tree
    /// were applied as they committed: the tree's watch leaves them out of the changes it
    /// reads. Forgetting one only costs reading its pairs back.
    pub held: BTreeSet<u64>,
    /// Whether a first listing has been applied.
    pub loaded: bool,
    /// While the tree's watch is failing, the time of its last success.
    pub failing_since: Option<Instant>,
    /// While a read of the tree's watch is waiting for its answer, when it is overdue and
    /// the time of the watch's last success.
    pub unanswered: Option<(Instant, Instant)>,
    /// The store's index went backwards and the tree is yet to be read whole again: its
    /// indexes are the old store's.
    pub reread: bool,
    /// How many times the tree has been read whole: such a read may leave its generation
    /// and indexes where they stood, yet claim its index anew (see `Mirror::versions`).
    pub whole_reads: u64,
}

/// An own delete not yet confirmed by a listing.
#[derive(Debug)]
pub(super) struct Tombstone {
    /// The version it removed, streamed as deleted once a listing confirms; `None` when the
    /// mirror held none yet (another writer's, which the watch had not brought).
    pub removed: Option<Arc<Entry>>,
    /// No version written at or before this index is current any more.
    pub through: u64,
}

impl TreeState {
    /// Whether the tree holds no entry, and no own delete waiting for a listing to confirm
    /// it.
    pub fn holds_nothing(&self) -> bool {
        self.entries.is_empty() && self.tombstones.is_empty()
    }

    /// The index of the tree's newest change, as an answer made of the tree counts it (its
    /// `X-Index`) and a read blocked on it waits for it to move: its listed index while it
    /// holds something, else the index listed as it came to hold nothing. A listing that
    /// finds nothing again leaves it: on Consul a prefix with neither keys nor tombstones
    /// lists at the whole store's index, which every write anywhere moves, though nothing
    /// in the tree changed.
    pub fn changed_index(&self) -> u64 {
        if self.holds_nothing() {
            self.emptied
        } else {
            self.listed
        }
    }

    /// The entry at `key`, or the version an own delete not confirmed yet removed from it:
    /// what a blocked read counts there (see `Extent`).
    pub fn held_or_unconfirmed(&self, key: &str) -> Option<&Arc<Entry>> {
        let unconfirmed_delete = || self.tombstones.get(key)?.removed.as_ref();
        self.entries.get(key).or_else(unconfirmed_delete)
    }

    /// The versions own deletes not confirmed yet removed.
    pub fn unconfirmed_deletes(&self) -> impl Iterator<Item = &Arc<Entry>> {
        let tombstones = self.tombstones.values();
        tombstones.filter_map(|tombstone| tombstone.removed.as_ref())
    }

    /// The index up to which an own delete of `key` buries its versions, if one is pending.
    fn buried(&self, key: &str) -> Option<u64> {
        self.tombstones.get(key).map(|tombstone| tombstone.through)
    }

    /// Notes a change of `entry`'s key at index `at` (put, replacing `replaced`, or
    /// removed): the generation moves, and the journal tells readers what changed with it.
    fn changed(&mut self, at: u64, entry: &Arc<Entry>, replaced: Option<&Arc<Entry>>) {
        self.generation += 1;
        let replaced = replaced.cloned();
        self.journal
            .record(self.generation, at, entry.clone(), replaced);
    }
}

/// How many of its own transactions' indexes the mirror keeps per tree between reads of it.
const MOST_HELD: usize = 10_000;

/// `(label type, key, value)` of the inverted label index.
type LabelTerm = (LabelType, String, String);

/// Everything the mirror holds, behind one lock so that reads see all trees at once.
#[derive(Debug)]
pub(super) struct State {
    pub trees: Vec<TreeState>,
    /// Object ids by label: answers "pods of RC x" and narrows label selectors. An object's
    /// id is kept once for all its labels.
    pub by_label: HashMap<LabelTerm, BTreeSet<Arc<str>>>,
    /// The keys of the health records that name another node than their key's, by the
    /// node they name (P2 takes a record as that node's result): the few a node's pod
    /// listing shows from keys not of its pods on it.
    pub health_naming: HashMap<String, BTreeSet<String>>,
    /// The intents by their pod id: answers "the pods of pod id x", which no prefix holds
    /// (intents are keyed by node first).
    pub intents_by_pod: ById,
    /// The events by the id of the object each is about: answers "the events of object x",
    /// which no prefix holds (events are keyed by time).
    pub events_by_object: ById,
    pub stream: Stream,
    /// When the store last answered the mirror: a watch's read, or a heartbeat
    /// ([`super::feed::heartbeat`]).
    pub answered: Instant,
}

/// A listing (or the changes since an index) prepared outside the lock: every key it
/// holds, and the pairs that differ from the mirror already decoded.
pub(super) struct Prepared {
    tree: Tree,
    index: u64,
    authoritative: bool,
    /// Every listed (or changed) key with its modify index, sorted by key.
    listed: Vec<(String, u64)>,
    /// For changes, the keys deleted and when; `None` for a listing, whose deletes are the
    /// keys it lacks.
    deleted: Option<Vec<(String, u64)>>,
    decoded: HashMap<String, Entry>,
}

impl State {
    pub(super) fn new(stream: Stream) -> State {
        State {
            trees: Tree::ALL.iter().map(|_| TreeState::default()).collect(),
            by_label: HashMap::new(),
            health_naming: HashMap::new(),
            intents_by_pod: ById::default(),
            events_by_object: ById::default(),
            stream,
            answered: Instant::now(),
        }
    }

    pub(super) fn tree(&self, tree: Tree) -> &TreeState {
        &self.trees[tree.position()]
    }

    fn tree_mut(&mut self, tree: Tree) -> &mut TreeState {
        &mut self.trees[tree.position()]
    }

    /// The highest index of any tree.
    pub(super) fn index(&self) -> u64 {
        self.trees.iter().map(|t| t.index).max().unwrap_or(0)
    }

    /// Sorts the listing's keys and picks the pairs worth decoding (those whose modify index
    /// the mirror does not hold), to decode outside the lock with [`Prepared::decode`].
    /// [`State::apply`] re-checks what may have changed in between.
    pub(super) fn prepare(
        &self,
        tree: Tree,
        update: PrefixUpdate,
        authoritative: bool,
    ) -> (Prepared, Vec<KvPair>) {
        let current = self.tree(tree);
        let index = update.index();
        let (pairs, deleted) = match update {
            PrefixUpdate::Whole(listing) => (listing.pairs, None),
            PrefixUpdate::Since(changes) => (changes.changed, Some(changes.deleted)),
        };
        let mut listed = Vec::with_capacity(pairs.len());
        let mut to_decode = Vec::new();
        for pair in pairs {
            listed.push((pair.key.clone(), pair.modify_index));
            // An entry at the same index is the same version, unless the store was replaced
            // (an authoritative listing after its index went backwards), which may have
            // reused the index for another value.
            let same = current.entries.get(&pair.key).is_some_and(|held| {
                held.pair.modify_index == pair.modify_index
                    && (!authoritative || held.value()[..] == pair.value[..])
            });
            if !same {
                to_decode.push(pair);
            }
        }
        listed.sort_unstable();
        let prepared = Prepared {
            tree,
            index,
            authoritative,
            listed,
            deleted,
            decoded: HashMap::new(),
        };
        (prepared, to_decode)
    }

    /// Merges a prepared listing in by the rules of the module documentation.
    pub(super) fn apply(&mut self, mut prepared: Prepared) {
        let tree = prepared.tree;
        let (index, authoritative) = (prepared.index, prepared.authoritative);
        let held_something = !self.tree(tree).holds_nothing();
        for (key, modify_index) in &prepared.listed {
            let Some(entry) = prepared.decoded.remove(key) else {
                continue;
            };
            let state = self.tree(tree);
            let held = state.entries.get(key).map(|e| e.pair.modify_index);
            let buried = state.buried(key);
            let newer = held.is_none_or(|held| held < *modify_index)
                && buried.is_none_or(|buried| buried < *modify_index);
            if authoritative {
                self.tree_mut(tree).tombstones.remove(key);
                self.upsert(tree, entry);
            } else if newer {
                self.unbury(tree, &entry);
                self.upsert(tree, entry);
            }
        }
        let gone = match prepared.deleted.take() {
            None => self.unlisted(&prepared),
            Some(deleted) => self.deleted(tree, deleted),
        };
        for (key, at) in gone {
            self.remove(tree, &key, at);
        }
        let state = self.tree_mut(tree);
        if authoritative {
            // It may have replaced pairs of transactions past it.
            state.held.clear();
            state.tombstones.clear();
            state.journal.replaced_at(index);
            state.index = index;
            state.listed = index;
            state.complete = index;
            state.reread = false;
            state.whole_reads += 1;
        } else {
            state.index = state.index.max(index);
            state.listed = state.listed.max(index);
            state.complete = state.complete.max(index);
            state.held = state.held.split_off(&(index + 1));
            // A delete of a key the mirror never held has nothing to stream: once a
            // listing from after it is applied, no older one can bring the key back.
            let listed = state.listed;
            state
                .tombstones
                .retain(|_, tombstone| tombstone.removed.is_some() || tombstone.through > listed);
        }
        if state.holds_nothing() && (authoritative || held_something) {
            state.emptied = state.listed;
        }
        let first = !state.loaded;
        state.loaded = true;
        if first && self.trees.iter().all(|tree| tree.loaded) {
            // Positions from before the mirror's first whole read were never given by this
            // stream: what changed then (a delete, say) is in no listing but its index.
            let listed = Tree::ALL.into_iter().filter(|tree| tree.kind().is_some());
            let listed = listed.map(|tree| self.tree(tree).listed).max();
            self.stream.start_window(listed.unwrap_or(0));
        }
    }

    /// Notes that the pairs the server's transaction at `index` wrote in `tree` are applied,
    /// keeping at most [`MOST_HELD`] such indexes (a tree whose watch fails reads none).
    pub(super) fn hold(&mut self, tree: Tree, index: u64) {
        let held = &mut self.tree_mut(tree).held;
        held.insert(index);
        if held.len() > MOST_HELD {
            held.pop_first();
        }
    }

    /// The indexes of the server's own transactions after `index` whose pairs in `tree`
    /// are applied.
    pub(super) fn held(&self, tree: Tree, index: u64) -> Vec<u64> {
        self.tree(tree).held.range(index + 1..).copied().collect()
    }

    /// What a listing's absences delete, each at the listing's index: entries it lacks
    /// (unless written after it was taken) and own deletes it confirms.
    fn unlisted(&self, listing: &Prepared) -> Vec<(String, u64)> {
        let state = self.tree(listing.tree);
        let listed = |key: &String| {
            listing
                .listed
                .binary_search_by(|(k, _)| k.as_str().cmp(key))
                .is_ok()
        };
        let removed = state.entries.values().filter(|entry| {
            !listed(&entry.pair.key)
                && (listing.authoritative || entry.pair.modify_index <= listing.index)
        });
        let confirmed = state.tombstones.keys().filter(|key| !listed(key));
        removed
            .map(|entry| &entry.pair.key)
            .chain(confirmed)
            .map(|key| (key.clone(), listing.index))
            .collect()
    }

    /// What reported deletes remove: entries not rewritten since (an own write after the
    /// delete), and own deletes they confirm.
    fn deleted(&self, tree: Tree, deleted: Vec<(String, u64)>) -> Vec<(String, u64)> {
        let state = self.tree(tree);
        deleted
            .into_iter()
            .filter(|(key, at)| match state.entries.get(key) {
                Some(entry) => entry.pair.modify_index <= *at,
                None => state.tombstones.contains_key(key),
            })
            .collect()
    }

    /// Applies a pair the server itself wrote, unless the mirror already holds it or a newer
    /// version.
    pub(super) fn apply_own_put(&mut self, tree: Tree, entry: Entry) {
        let modify_index = entry.pair.modify_index;
        let state = self.tree(tree);
        let held = state
            .entries
            .get(&entry.pair.key)
            .map(|e| e.pair.modify_index);
        let buried = state.buried(&entry.pair.key);
        // Taken in by a listing at or past it (see the module documentation), unless that
        // listing was of the store the index went backwards from.
        let listed_past = !state.reread && state.listed >= modify_index;
        if held.is_some_and(|held| held >= modify_index)
            || buried.is_some_and(|buried| buried >= modify_index)
            || listed_past
        {
            return;
        }
        self.unbury(tree, &entry);
        let state = self.tree_mut(tree);
        state.index = state.index.max(modify_index);
        self.upsert(tree, entry);
    }

    /// Drops the tombstone of `entry`'s key, a version written after the own delete that
    /// left it. The deletion of the version it removed is streamed first, as no listing
    /// will confirm it now: a client told the key exists hears of its deletion before the
    /// new version comes as added. It is streamed at the index before the new version was
    /// created, when the key was gone (or, for a version of an older creation, at the
    /// delete's own bound).
    fn unbury(&mut self, tree: Tree, entry: &Entry) {
        let tombstone = self.tree_mut(tree).tombstones.remove(&entry.pair.key);
        let Some(Tombstone {
            removed: Some(removed),
            through,
        }) = tombstone
        else {
            return;
        };
        let gone = entry.pair.create_index.saturating_sub(1).max(through);
        // Journaled again, as when a listing confirms it ([`State::remove`]), at the new
        // version's index, which the delete does not lie past.
        let state = self.tree_mut(tree);
        state.changed(entry.pair.modify_index, &removed, None);
        self.stream.emit(ChangeType::Deleted, tree, gone, removed);
    }

    /// Removes a key the server itself deleted, no version of it written at or before
    /// `through` being current, leaving a tombstone until a listing confirms. An entry
    /// written after `through` is a newer version than the delete removed, and stays.
    pub(super) fn apply_own_delete(&mut self, tree: Tree, key: &str, through: u64) {
        let state = self.tree_mut(tree);
        let held = state.entries.get(key).map(|e| e.pair.modify_index);
        if held.is_some_and(|held| held > through) {
            return;
        }
        // A key the mirror does not hold yet (another writer's) is buried all the same, so
        // that the watch's read from before the delete does not bring it in.
        let removed = state.entries.remove(key);
        if let Some(removed) = &removed {
            state.changed(through, removed, None);
            self.drop_from_indexes(tree, removed);
        }
        // A key deleted again before a listing confirmed the first delete: the version
        // that delete removed is still the one whose deletion is streamed.
        let earlier = self.tree_mut(tree).tombstones.remove(key);
        let (removed, through) = match earlier {
            Some(earlier) => (removed.or(earlier.removed), through.max(earlier.through)),
            None => (removed, through),
        };
        let tombstone = Tombstone { removed, through };
        self.tree_mut(tree)
            .tombstones
            .insert(key.to_owned(), tombstone);
    }

    fn upsert(&mut self, tree: Tree, entry: Entry) {
        let entry = Arc::new(entry);
        let index = entry.pair.modify_index;
        let state = self.tree_mut(tree);
        let old = state.entries.insert(entry.clone());
        // The version replaced is kept in the journal only where a reader selects by value
        // (by labels, by the node a health record names, or by the object an event is
        // about) and the new one selects otherwise: elsewhere the key alone tells what it
        // lay in.
        let reselected = old.as_ref().filter(|old| {
            old.labels() != entry.labels()
                || old.health_named_elsewhere() != entry.health_named_elsewhere()
                || event_object_id(tree, old) != event_object_id(tree, &entry)
        });
        state.changed(index, &entry, reselected);
        let change_type = match old {
            Some(old) => {
                self.drop_from_indexes(tree, &old);
                if old.pair.create_index == entry.pair.create_index {
                    ChangeType::Modified
                } else {
                    // Deleted and created again between two reads: streamed as both, the
                    // deletion at the index before the new version was created.
                    let gone = entry.pair.create_index.saturating_sub(1);
                    let gone = gone.max(old.pair.modify_index);
                    self.stream.emit(ChangeType::Deleted, tree, gone, old);
                    ChangeType::Added
                }
            }
            None => ChangeType::Added,
        };
        self.add_to_indexes(tree, &entry);
        self.stream.emit(change_type, tree, index, entry);
    }

    /// Drops `key` (an entry or a tombstone) and streams its deletion at `index`.
    fn remove(&mut self, tree: Tree, key: &str, index: u64) {
        let state = self.tree_mut(tree);
        let removed = match state.entries.remove(key) {
            Some(entry) => {
                state.changed(index, &entry, None);
                self.drop_from_indexes(tree, &entry);
                entry
            }
            // An own delete confirmed: it was journaled at its bound, which may lie below
            // the delete's own index (a delete-cas alone knows only the version it removed),
            // so a reader at an index past the bound would not see it; journaled again at the
            // index that confirms it, which does not lie below.
            None => match state.tombstones.remove(key).and_then(|t| t.removed) {
                Some(removed) => {
                    state.changed(index, &removed, None);
                    removed
                }
                None => return,
            },
        };
        self.stream.emit(ChangeType::Deleted, tree, index, removed);
    }

    fn add_to_indexes(&mut self, tree: Tree, entry: &Arc<Entry>) {
        if let Some(pod_id) = (tree == Tree::Intent)
            .then(|| intent_pod_id(entry))
            .flatten()
        {
            self.intents_by_pod.insert(pod_id, entry);
        }
        if let Some(object_id) = event_object_id(tree, entry) {
            self.events_by_object.insert(&object_id, entry);
        }
        for (term, id) in terms(tree, entry) {
            self.by_label.entry(term).or_default().insert(id);
        }
        if let Some(named) = (tree == Tree::Health)
            .then(|| entry.health_named_elsewhere())
            .flatten()
        {
            let keys = self.health_naming.entry(named.to_owned()).or_default();
            keys.insert(entry.pair.key.clone());
        }
    }

    fn drop_from_indexes(&mut self, tree: Tree, entry: &Entry) {
        if let Some(pod_id) = (tree == Tree::Intent)
            .then(|| intent_pod_id(entry))
            .flatten()
        {
            self.intents_by_pod.remove(pod_id, &entry.pair.key);
        }
        if let Some(object_id) = event_object_id(tree, entry) {
            self.events_by_object.remove(&object_id, &entry.pair.key);
        }
        for (term, id) in terms(tree, entry) {
            if let Some(ids) = self.by_label.get_mut(&term) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.by_label.remove(&term);
                }
            }
        }
        if let Some(named) = (tree == Tree::Health)
            .then(|| entry.health_named_elsewhere())
            .flatten()
        {
            if let Some(keys) = self.health_naming.get_mut(named) {
                keys.remove(&entry.pair.key);
                if keys.is_empty() {
                    self.health_naming.remove(named);
                }
            }
        }
    }

    /// The labels of `id` of `label_type`.
    pub(super) fn labels_of(&self, label_type: LabelType, id: &str) -> Option<&CompactLabels> {
        self.tree(Tree::Labels(label_type))
            .entries
            .get(&layout::labels(label_type, id))
            .and_then(|entry| entry.labels())
    }
}

impl Prepared {
    /// Decodes the pairs [`State::prepare`] picked: the only decoding a listing costs.
    pub(super) fn decode(mut self, pairs: Vec<KvPair>) -> Prepared {
        let tree = self.tree;
        self.decoded = pairs
            .into_iter()
            .map(|pair| (pair.key.clone(), tree.decode(pair)))
            .collect();
        self
    }
}

/// The id of the object an entry of the events tree is about.
fn event_object_id(tree: Tree, entry: &Entry) -> Option<Cow<'_, str>> {
    (tree == Tree::Events)
        .then(|| Event::object_id_of(&entry.pair.value))
        .flatten()
}

/// The pod id of an intent's key, `intent/<node>/<pod_id>`.
fn intent_pod_id(entry: &Entry) -> Option<&str> {
    let rest = entry.pair.key.strip_prefix(layout::INTENT)?;
    rest.split_once('/').map(|(_, pod_id)| pod_id)
}

/// The inverted-index terms of a label entry, with the object id they point at.
fn terms(tree: Tree, entry: &Entry) -> Vec<(LabelTerm, Arc<str>)> {
    let (Tree::Labels(label_type), Some(labels)) = (tree, entry.labels()) else {
        return Vec::new();
    };
    let Some(id) = entry
        .pair
        .key
        .strip_prefix(&layout::labels_of_type(label_type))
    else {
        return Vec::new();
    };
    let id: Arc<str> = id.into();
    labels
        .iter()
        .map(|(key, value)| ((label_type, key.to_owned(), value.to_owned()), id.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::kv::{Changes, Listing};
    use crate::state::OwnWrite;

    fn pair(key: &str, value: &str, modify_index: u64) -> KvPair {
        KvPair {
            key: key.into(),
            value: value.as_bytes().into(),
            create_index: 1,
            modify_index,
            lock: None,
        }
    }

    fn listing(index: u64, pairs: &[KvPair]) -> PrefixUpdate {
        PrefixUpdate::Whole(Listing {
            index,
            pairs: pairs.to_vec(),
        })
    }

    fn apply(state: &mut State, index: u64, pairs: &[KvPair], authoritative: bool) {
        let tree = Tree::Labels(LabelType::Node);
        let (prepared, pairs) = state.prepare(tree, listing(index, pairs), authoritative);
        state.apply(prepared.decode(pairs));
    }

    fn held(state: &State) -> Vec<(String, u64)> {
        let tree = state.tree(Tree::Labels(LabelType::Node));
        tree.entries
            .values()
            .map(|e| (e.pair.key.clone(), e.pair.modify_index))
            .collect()
    }

    #[test]
    fn an_older_listing_does_not_undo_own_writes() {
        let tree = Tree::Labels(LabelType::Node);
        let mut state = State::new(Stream::new(10, 10));
        let a = pair("labels/node/a", r#"{"r":"x"}"#, 2);
        apply(&mut state, 2, std::slice::from_ref(&a), true);

        state.apply_own_put(tree, tree.decode(pair("labels/node/a", r#"{"r":"y"}"#, 5)));
        state.apply_own_put(tree, tree.decode(pair("labels/node/b", "{}", 6)));
        // Taken before the own writes landed: holds the old `a` and no `b`.
        apply(&mut state, 4, std::slice::from_ref(&a), false);
        assert_eq!(
            held(&state),
            [("labels/node/a".into(), 5), ("labels/node/b".into(), 6)]
        );
        assert_eq!(
            state.labels_of(LabelType::Node, "a").unwrap().get("r"),
            Some("y")
        );

        state.apply_own_delete(tree, "labels/node/a", 7);
        let stale = [
            pair("labels/node/a", r#"{"r":"y"}"#, 5),
            pair("labels/node/b", "{}", 6),
        ];
        apply(&mut state, 6, &stale, false);
        assert_eq!(
            held(&state),
            [("labels/node/b".into(), 6)],
            "a stale listing revived a"
        );
        // The listing that confirms the delete streams it and drops the tombstone.
        apply(&mut state, 8, &[pair("labels/node/b", "{}", 6)], false);
        assert!(state.tree(tree).tombstones.is_empty());
        let deleted = state.stream.replay_from(0).unwrap();
        assert_eq!(deleted.last().unwrap().change_type, ChangeType::Deleted);
        assert_eq!(deleted.last().unwrap().entry.pair.key, "labels/node/a");
    }

    /// A tree that holds nothing counts at the index it came to hold nothing (or was read
    /// whole holding nothing), not at the newer ones a listing finds it empty at again: on
    /// Consul those are the whole store's, moved by every write anywhere.
    #[test]
    fn an_empty_tree_changes_only_when_what_it_holds_does() {
        let tree = Tree::Labels(LabelType::Node);
        let mut state = State::new(Stream::new(10, 10));
        let changed = |state: &State| state.tree(tree).changed_index();
        apply(&mut state, 3, &[], true);
        assert_eq!(changed(&state), 3);
        apply(&mut state, 9, &[], false);
        assert_eq!(changed(&state), 3, "a write elsewhere moved it");

        let a = pair("labels/node/a", "{}", 10);
        apply(&mut state, 10, std::slice::from_ref(&a), false);
        assert_eq!(changed(&state), 10);
        apply(&mut state, 12, std::slice::from_ref(&a), false);
        assert_eq!(changed(&state), 12);

        // The server's own delete counts once a listing confirms it.
        state.apply_own_delete(tree, "labels/node/a", 14);
        apply(&mut state, 13, std::slice::from_ref(&a), false);
        assert_eq!(changed(&state), 13);
        apply(&mut state, 14, &[], false);
        assert_eq!(changed(&state), 14);
        apply(&mut state, 20, &[], false);
        assert_eq!(changed(&state), 14, "a write elsewhere moved it");
        assert_eq!(state.tree(tree).listed, 20);
    }

    #[test]
    fn an_own_delete_known_only_through_the_version_it_removed_is_journaled_past_it() {
        let tree = Tree::Labels(LabelType::Node);
        let touched_past = |state: &State, index| -> Vec<(String, u64)> {
            let journal = &state.tree(tree).journal;
            let touched = journal.touched_past(index).unwrap();
            touched
                .map(|e| (e.pair.key.clone(), e.pair.modify_index))
                .collect()
        };
        let mut state = State::new(Stream::new(10, 10));
        let a = pair("labels/node/a", r#"{"r":"x"}"#, 2);
        let b = pair("labels/node/b", r#"{"r":"x"}"#, 3);
        apply(&mut state, 4, &[a, b], true);
        // Deleted alone by a delete-cas (at 5 and 7 in the store), known gone only through
        // the versions removed; a reader at 4 saw both.
        state.apply_own_delete(tree, "labels/node/a", 2);
        state.apply_own_delete(tree, "labels/node/b", 3);
        // `a`'s delete is confirmed by a listing at 6, `b` is written again at 8 by another
        // writer before any listing confirms its delete.
        apply(
            &mut state,
            6,
            &[pair("labels/node/b", r#"{"r":"x"}"#, 3)],
            false,
        );
        let again = pair("labels/node/b", r#"{"r":"y"}"#, 8);
        apply(&mut state, 8, std::slice::from_ref(&again), false);
        assert_eq!(
            touched_past(&state, 4),
            [
                ("labels/node/a".into(), 2),
                ("labels/node/b".into(), 3),
                ("labels/node/b".into(), 8)
            ],
            "each removed version is journaled past the index its reader saw it at"
        );
    }

    #[test]
    fn an_own_delete_applied_late_keeps_a_newer_version() {
        let tree = Tree::Labels(LabelType::Node);
        let mut state = State::new(Stream::new(10, 10));
        apply(&mut state, 2, &[pair("labels/node/a", "{}", 2)], true);

        // This server deletes `a` at 5; another writer creates it again at 6, and the watch
        // brings that version before the delete is applied.
        let again = pair("labels/node/a", r#"{"r":"y"}"#, 6);
        apply(&mut state, 6, std::slice::from_ref(&again), false);
        state.apply_own_delete(tree, "labels/node/a", 5);
        assert_eq!(held(&state), [("labels/node/a".into(), 6)]);
        assert!(state.tree(tree).tombstones.is_empty());

        // Applied in time, the delete buries the old version only: an older listing does
        // not bring it back, a newer version does come.
        let mut state = State::new(Stream::new(10, 10));
        apply(&mut state, 2, &[pair("labels/node/a", "{}", 2)], true);
        state.apply_own_delete(tree, "labels/node/a", 5);
        apply(&mut state, 4, &[pair("labels/node/a", "{}", 2)], false);
        assert_eq!(held(&state), []);
        apply(&mut state, 6, std::slice::from_ref(&again), false);
        assert_eq!(held(&state), [("labels/node/a".into(), 6)]);
        assert!(state.tree(tree).tombstones.is_empty());
    }

    fn apply_changes(state: &mut State, index: u64, changed: &[KvPair], deleted: &[(&str, u64)]) {
        let changes = Changes {
            index,
            changed: changed.to_vec(),
            deleted: deleted.iter().map(|(k, i)| (k.to_string(), *i)).collect(),
        };
        let tree = Tree::Labels(LabelType::Node);
        let (prepared, pairs) = state.prepare(tree, PrefixUpdate::Since(changes), false);
        state.apply(prepared.decode(pairs));
    }

    #[test]
    fn own_transactions_are_held_until_a_read_passes_them_or_replaces_the_tree() {
        let tree = Tree::Labels(LabelType::Node);
        let mut state = State::new(Stream::new(10, 10));
        apply(&mut state, 2, &[], true);
        for index in [5, 7, 9] {
            state.hold(tree, index);
        }
        assert_eq!(state.held(tree, 2), [5, 7, 9]);
        assert_eq!(state.held(tree, 7), [9]);

        // Read changes up to 7: the read found (or left out) what was written before.
        apply_changes(&mut state, 7, &[], &[]);
        assert_eq!(state.held(tree, 2), [9]);

        // A listing taken as the whole truth may have replaced the pair of 9: read it again.
        apply(&mut state, 8, &[], true);
        assert_eq!(state.held(tree, 2), Vec::<u64>::new());
    }

    #[test]
    fn changes_since_an_index_apply_as_a_listing_would() {
        let tree = Tree::Labels(LabelType::Node);
        let mut state = State::new(Stream::new(10, 10));
        let (a, b, c) = (
            pair("labels/node/a", "{}", 2),
            pair("labels/node/b", "{}", 3),
            pair("labels/node/c", "{}", 4),
        );
        apply(&mut state, 4, &[a, b, c], true);

        // b is deleted at 6, but this server wrote it again at 7 before the changes came.
        state.apply_own_put(tree, tree.decode(pair("labels/node/b", r#"{"r":"x"}"#, 7)));
        // c is deleted by this server, at 8.
        state.apply_own_delete(tree, "labels/node/c", 8);
        let a2 = pair("labels/node/a", r#"{"r":"y"}"#, 5);
        let d = pair("labels/node/d", "{}", 9);
        apply_changes(
            &mut state,
            9,
            &[a2, d],
            &[("labels/node/b", 6), ("labels/node/c", 8)],
        );
        assert_eq!(
            held(&state),
            [
                ("labels/node/a".into(), 5),
                ("labels/node/b".into(), 7),
                ("labels/node/d".into(), 9)
            ]
        );
        assert!(
            state.tree(tree).tombstones.is_empty(),
            "c's delete confirmed"
        );
        assert_eq!(state.index(), 9);
        let streamed = state.stream.replay_from(4).unwrap();
        let deleted: Vec<_> = streamed
            .iter()
            .filter(|change| change.change_type == ChangeType::Deleted)
            .map(|change| (change.entry.pair.key.as_str(), change.index))
            .collect();
        assert_eq!(deleted, [("labels/node/c", 8)]);

        // A delete reported for a key the mirror never held changes nothing.
        apply_changes(&mut state, 10, &[], &[("labels/node/z", 10)]);
        assert_eq!(held(&state).len(), 3);
    }

    #[test]
    fn an_authoritative_listing_replaces_everything() {
        let mut state = State::new(Stream::new(10, 10));
        apply(&mut state, 9, &[pair("labels/node/a", "{}", 9)], true);
        apply(&mut state, 3, &[pair("labels/node/b", "{}", 3)], true);
        assert_eq!(held(&state), [("labels/node/b".into(), 3)]);
        assert_eq!(state.index(), 3);
    }

    #[test]
    fn label_indexes_follow_changes() {
        let tree = Tree::Labels(LabelType::Pod);
        let mut state = State::new(Stream::new(10, 10));
        let labelled = |rc: &str, index| {
            let value = format!(r#"{{"replication_controller_id":"{rc}"}}"#);
            tree.decode(pair("labels/pod/n1/hello", &value, index))
        };
        let term = |rc: &str| {
            (
                LabelType::Pod,
                "replication_controller_id".into(),
                rc.into(),
            )
        };
        state.apply_own_put(tree, labelled("rc1", 2));
        assert!(state.by_label[&term("rc1")].contains("n1/hello"));
        state.apply_own_put(tree, labelled("rc2", 3));
        assert!(!state.by_label.contains_key(&term("rc1")));
        state.apply_own_delete(tree, "labels/pod/n1/hello", 3);
        assert!(state.by_label.is_empty());
    }

    #[test]
    fn the_index_of_intents_by_pod_id_follows_changes() {
        let tree = Tree::Intent;
        let mut state = State::new(Stream::new(10, 10));
        let intents = |state: &State, pod_id: &str| {
            let held = state.intents_by_pod.get(pod_id);
            let mut keys: Vec<(String, u64)> = held
                .iter()
                .map(|e| (e.pair.key.clone(), e.pair.modify_index))
                .collect();
            keys.sort();
            keys
        };
        let put = |state: &mut State, key: &str, index| {
            state.apply_own_put(tree, tree.decode(pair(key, "id: x", index)));
        };
        put(&mut state, "intent/n1/hello", 2);
        put(&mut state, "intent/n2/hello", 3);
        put(&mut state, "intent/n1/other", 4);
        put(&mut state, "intent/n1/hello", 5);
        assert_eq!(
            intents(&state, "hello"),
            [("intent/n1/hello".into(), 5), ("intent/n2/hello".into(), 3)]
        );
        assert_eq!(intents(&state, "other"), [("intent/n1/other".into(), 4)]);

        state.apply_own_delete(tree, "intent/n2/hello", 6);
        assert_eq!(intents(&state, "hello"), [("intent/n1/hello".into(), 5)]);
        // A listing that lacks it removes it too.
        let listed = [pair("intent/n1/other", "id: x", 4)];
        let (prepared, pairs) = state.prepare(tree, listing(7, &listed), false);
        state.apply(prepared.decode(pairs));
        assert_eq!(intents(&state, "hello"), []);
        assert_eq!(state.intents_by_pod.len(), 1);
    }

    /// The index is lean: at 100,000 intents of 10,000 pod ids (the API bench's large
    /// fleet), its map and lists take about 1.2 MiB, well under the 2 MiB the farm run's
    /// memory target leaves.
    #[test]
    fn the_index_of_intents_by_pod_id_costs_little_memory() {
        let tree = Tree::Intent;
        let mut state = State::new(Stream::new(10, 10));
        for node in 0..10_000 {
            for replica in 0..10 {
                let pod_id = (node + replica * 1_000) % 10_000;
                let key = format!("intent/node{node}/app{pod_id}");
                let index = 1 + node * 10 + replica;
                state.apply_own_put(tree, tree.decode(pair(&key, "id: x", index)));
            }
        }
        assert_eq!(state.intents_by_pod.len(), 10_000);
        let mib = state.intents_by_pod.bytes() as f64 / (1024.0 * 1024.0);
        assert!(mib < 1.5, "{mib:.2} MiB");
    }

    #[test]
    fn the_index_of_events_by_object_id_follows_changes() {
        let tree = Tree::Events;
        let mut state = State::new(Stream::new(10, 10));
        let events = |state: &State, object_id: &str| -> Vec<String> {
            let held = state.events_by_object.get(object_id).iter();
            held.map(|e| e.pair.key[layout::EVENTS.len()..].to_owned())
                .collect()
        };
        let put = |state: &mut State, id: &str, object_id: &str, index| {
            let key = layout::event(id);
            let value = format!(r#"{{"id": "{id}", "object_id": "{object_id}"}}"#);
            state.apply_own_put(tree, tree.decode(pair(&key, &value, index)));
        };
        put(&mut state, "3", "rc-a", 2);
        put(&mut state, "1", "rc-a", 3);
        put(&mut state, "2", "rc-b", 4);
        // An escaped id is the same id.
        let escaped = pair(&layout::event("4"), r#"{"object_id": "rc\u002da"}"#, 5);
        state.apply_own_put(tree, tree.decode(escaped));
        state.apply_own_put(tree, tree.decode(pair(&layout::event("5"), "{", 6)));
        assert_eq!(events(&state, "rc-a"), ["1", "3", "4"], "in key order");
        assert_eq!(events(&state, "rc-b"), ["2"]);

        // Rewritten at its key to name another object, an event moves to it, and the
        // version replaced is journaled, for a reader of the first object's events.
        put(&mut state, "3", "rc-b", 7);
        assert_eq!(events(&state, "rc-a"), ["1", "4"]);
        assert_eq!(events(&state, "rc-b"), ["2", "3"]);
        let journal = &state.tree(tree).journal;
        let touched = journal.touched_past(6).unwrap();
        let touched: Vec<Option<Cow<'_, str>>> = touched
            .map(|e| Event::object_id_of(&e.pair.value))
            .collect();
        assert_eq!(touched, [Some("rc-b".into()), Some("rc-a".into())]);
        // Rewritten about the same object, only the new version is journaled.
        put(&mut state, "3", "rc-b", 8);
        assert_eq!(state.tree(tree).journal.touched_past(7).unwrap().count(), 1);
        put(&mut state, "3", "rc-a", 9);

        state.apply_own_delete(tree, &layout::event("1"), 10);
        assert_eq!(events(&state, "rc-a"), ["3", "4"]);
        // A listing that lacks them removes them too.
        let listed = [pair(&layout::event("2"), r#"{"object_id": "rc-b"}"#, 4)];
        let (prepared, pairs) = state.prepare(tree, listing(11, &listed), false);
        state.apply(prepared.decode(pairs));
        assert_eq!(events(&state, "rc-a"), Vec::<String>::new());
        assert_eq!(state.events_by_object.len(), 1);
    }

    /// At the default retention's 10,000 events, each about an object of its own (the
    /// most lists), the index takes well under a MiB.
    #[test]
    fn the_index_of_events_by_object_id_costs_little_memory() {
        let tree = Tree::Events;
        let mut state = State::new(Stream::new(10, 10));
        for n in 0..10_000 {
            let key = layout::event(&format!("{n:020}"));
            let value = format!(r#"{{"object_id": "object-{n}"}}"#);
            state.apply_own_put(tree, tree.decode(pair(&key, &value, 1 + n)));
        }
        assert_eq!(state.events_by_object.len(), 10_000);
        let mib = state.events_by_object.bytes() as f64 / (1024.0 * 1024.0);
        assert!(mib < 1.0, "{mib:.2} MiB");
    }

    /// Another writer creates a key at 10; before the watch brings it, this server deletes
    /// it at 12. The watch's read taken at 11 still holds the key and must not bring it back;
    /// the read that reports the delete confirms it, with nothing to stream.
    #[test]
    fn an_own_delete_of_a_key_not_yet_mirrored_buries_it() {
        let tree = Tree::Labels(LabelType::Node);
        let mut state = State::new(Stream::new(10, 10));
        apply(&mut state, 9, &[], true);
        state.apply_own_delete(tree, "labels/node/a", 12);
        apply_changes(&mut state, 11, &[pair("labels/node/a", "{}", 10)], &[]);
        assert_eq!(held(&state), []);
        apply_changes(&mut state, 12, &[], &[("labels/node/a", 12)]);
        assert_eq!(held(&state), []);
        assert!(state.tree(tree).tombstones.is_empty());
        assert!(state.stream.replay_from(0).unwrap().is_empty());
    }

    /// The server deletes a key at 5 (a label delete), then again at 6 (the delete of the
    /// object, which deletes its labels too) before any listing confirms the first: the
    /// version the first removed is still the one whose deletion is to be streamed and
    /// counted, not forgotten for the second's, which found nothing.
    #[test]
    fn a_second_own_delete_keeps_the_version_the_first_removed() {
        let tree = Tree::Labels(LabelType::Node);
        let mut state = State::new(Stream::new(10, 10));
        apply(
            &mut state,
            2,
            &[pair("labels/node/a", r#"{"r":"x"}"#, 2)],
            true,
        );
        state.apply_own_delete(tree, "labels/node/a", 5);
        state.apply_own_delete(tree, "labels/node/a", 6);
        let unconfirmed: Vec<&str> = state
            .tree(tree)
            .unconfirmed_deletes()
            .map(|entry| entry.pair.key.as_str())
            .collect();
        assert_eq!(unconfirmed, ["labels/node/a"]);

        apply(&mut state, 7, &[], false);
        assert!(state.tree(tree).tombstones.is_empty());
        let streamed = state.stream.replay_from(2).unwrap();
        let deleted: Vec<_> = streamed
            .iter()
            .filter(|change| change.change_type == ChangeType::Deleted)
            .map(|change| (change.entry.pair.key.as_str(), change.index))
            .collect();
        assert_eq!(deleted, [("labels/node/a", 7)], "the deletion is streamed");
    }

    /// Another writer deletes `a` and creates it again between two reads of its tree: the
    /// stream sends its deletion, then the new object as added, not the new one as a
    /// modification of the old, which a client would take for one object changed.
    #[test]
    fn a_key_deleted_and_created_again_between_two_reads_is_streamed_as_both() {
        let mut state = State::new(Stream::new(10, 10));
        apply(
            &mut state,
            2,
            &[pair("labels/node/a", r#"{"r":"x"}"#, 2)],
            true,
        );
        let created_again = KvPair {
            create_index: 8,
            ..pair("labels/node/a", r#"{"r":"y"}"#, 8)
        };
        apply(&mut state, 9, &[created_again], false);

        let streamed = state.stream.replay_from(2).unwrap();
        let streamed: Vec<_> = streamed
            .iter()
            .map(|change| {
                (
                    change.change_type,
                    change.entry.pair.modify_index,
                    change.index,
                )
            })
            .collect();
        assert_eq!(
            streamed,
            [
                (ChangeType::Added, 2, 2),
                (ChangeType::Deleted, 2, 7),
                (ChangeType::Added, 8, 8)
            ],
            "the old version's deletion, before the new one was created, then the new one"
        );
    }

    /// This server writes `a` at 2 and another writer deletes it at 4, and the watch lists
    /// the tree at 4, without `a`, before the server applies its own write: the write, which
    /// that listing has passed, does not bring `a` back (the store answers no listing of an
    /// idle tree that would remove it again).
    #[test]
    fn an_own_write_applied_after_a_listing_past_it_does_not_undo_that_listing() {
        let tree = Tree::Labels(LabelType::Node);
        let mut state = State::new(Stream::new(10, 10));
        apply(&mut state, 1, &[], true);
        apply(&mut state, 4, &[], false);
        state.apply_own_put(tree, tree.decode(pair("labels/node/a", "{}", 2)));
        assert_eq!(held(&state), [], "a deleted key is back");
        assert!(state.stream.replay_from(0).unwrap().is_empty());
    }

    /// A tiny deterministic generator for [`any_history_keeps_the_indexes_and_the_stream`].
    struct Draws(u64);

    impl Draws {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }

        fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
            of[self.below(of.len() as u64) as usize]
        }

        /// A key of `tree` among a few, so that writes meet.
        fn key(&mut self, tree: Tree) -> String {
            let (node, pod) = (self.pick(&["n1", "n2"]), self.pick(&["p", "q"]));
            match tree {
                Tree::Labels(LabelType::Pod) => format!("labels/pod/{node}/{pod}"),
                Tree::Labels(_) => format!("labels/node/{node}"),
                Tree::Health => format!("health/{pod}/{node}"),
                _ => format!("intent/{node}/{pod}"),
            }
        }

        /// A version of a key of `tree`, at an index up to `now`.
        fn pair(&mut self, tree: Tree, now: u64) -> KvPair {
            let value = match tree {
                Tree::Labels(_) => {
                    let sets = ["{}", r#"{"a":"1"}"#, r#"{"a":"2","b":"1"}"#, "null", "nope"];
                    self.pick(&sets).to_owned()
                }
                Tree::Health => {
                    let node = self.pick(&["n1", "n2", ""]);
                    format!(
                        r#"{{"Id":"p","Node":"{node}","Service":"p","Status":"passing","Time":"t","Expires":"e"}}"#
                    )
                }
                _ => "id: x".to_owned(),
            };
            KvPair {
                key: self.key(tree),
                value: value.into_bytes().into(),
                create_index: 1 + self.below(now),
                modify_index: 1 + self.below(now),
                lock: None,
            }
        }

        fn pairs(&mut self, tree: Tree, now: u64) -> Vec<KvPair> {
            let mut pairs: Vec<KvPair> = (0..self.below(4)).map(|_| self.pair(tree, now)).collect();
            pairs.sort_by(|a, b| a.key.cmp(&b.key));
            pairs.dedup_by(|a, b| a.key == b.key);
            pairs
        }
    }

    /// Whatever order own writes, listings and changes come in (indexes drawn at random,
    /// stale or not), the secondary indexes hold exactly what the entries say, and a client
    /// that applied every streamed change holds the entries and the own deletes not
    /// streamed yet.
    #[test]
    fn any_history_keeps_the_indexes_and_the_stream() {
        let trees = [
            Tree::Labels(LabelType::Pod),
            Tree::Labels(LabelType::Node),
            Tree::Intent,
            Tree::Health,
        ];
        for seed in 1..100 {
            let mut draws = Draws(seed * 7919);
            let mut state = State::new(Stream::new(100_000, 10));
            for tree in trees {
                let (prepared, pairs) = state.prepare(tree, listing(1, &[]), true);
                state.apply(prepared.decode(pairs));
            }
            for now in 2..150 {
                let tree = trees[draws.below(4) as usize];
                let update = match draws.below(5) {
                    0 => {
                        let pair = draws.pair(tree, now);
                        state.apply_own_put(tree, tree.decode(pair));
                        None
                    }
                    1 => {
                        let key = draws.key(tree);
                        state.apply_own_delete(tree, &key, draws.below(now));
                        None
                    }
                    2 | 3 => Some(listing(draws.below(now), &draws.pairs(tree, now))),
                    _ => {
                        let deleted =
                            (0..draws.below(2)).map(|_| (draws.key(tree), draws.below(now)));
                        Some(PrefixUpdate::Since(Changes {
                            deleted: deleted.collect(),
                            changed: draws.pairs(tree, now),
                            index: draws.below(now),
                        }))
                    }
                };
                if let Some(update) = update {
                    let (prepared, pairs) = state.prepare(tree, update, false);
                    state.apply(prepared.decode(pairs));
                }
                assert_indexes_follow_the_entries(&state, seed);
                assert_the_stream_follows_the_entries(&state, &trees, seed);
            }
        }
    }

    fn assert_indexes_follow_the_entries(state: &State, seed: u64) {
        let mut by_label: HashMap<LabelTerm, BTreeSet<Arc<str>>> = HashMap::new();
        let mut intents = 0;
        let mut health_naming: HashMap<String, BTreeSet<String>> = HashMap::new();
        for tree in Tree::ALL {
            for entry in state.tree(tree).entries.values() {
                for (term, id) in terms(tree, entry) {
                    by_label.entry(term).or_default().insert(id);
                }
                if let Some(pod_id) = (tree == Tree::Intent).then(|| intent_pod_id(entry)) {
                    let filed = state.intents_by_pod.get(pod_id.unwrap());
                    assert!(
                        filed.iter().any(|held| Arc::ptr_eq(held, entry)),
                        "seed {seed}"
                    );
                    intents += 1;
                }
                if let Some(named) = entry.health_named_elsewhere() {
                    let keys = health_naming.entry(named.to_owned()).or_default();
                    keys.insert(entry.pair.key.clone());
                }
            }
        }
        assert_eq!(state.by_label, by_label, "seed {seed}");
        let filed = ["p", "q"].map(|pod_id| state.intents_by_pod.get(pod_id).len());
        assert_eq!(filed.iter().sum::<usize>(), intents, "seed {seed}");
        assert_eq!(state.health_naming, health_naming, "seed {seed}");
    }

    fn assert_the_stream_follows_the_entries(state: &State, trees: &[Tree], seed: u64) {
        let mut client = BTreeMap::new();
        for change in state.stream.replay_from(0).unwrap() {
            let (key, index) = (
                change.entry.pair.key.clone(),
                change.entry.pair.modify_index,
            );
            let held = match change.change_type {
                ChangeType::Deleted => client.remove(&key).is_some(),
                ChangeType::Added => client.insert(key, index).is_none(),
                ChangeType::Modified => client.insert(key, index).is_some(),
            };
            assert!(
                held,
                "seed {seed}: {change:?} does not follow what came before"
            );
        }
        let mut mirrored = BTreeMap::new();
        for tree in trees {
            let tree = state.tree(*tree);
            for entry in tree.entries.values().chain(tree.unconfirmed_deletes()) {
                mirrored.insert(entry.pair.key.clone(), entry.pair.modify_index);
            }
        }
        assert_eq!(client, mirrored, "seed {seed}");
    }

    /// A store's history as [`any_store_history_is_mirrored_as_it_is`] draws it: each
    /// version of its keys by the index that made it.
    type Stored = BTreeMap<String, KvPair>;

    /// The entries under `prefix`, own deletes not confirmed yet included, each as the
    /// version it is: what a blocked read of the prefix counts.
    fn spanned(tree: &TreeState, prefix: &str) -> BTreeMap<String, *const Entry> {
        let deleted = tree.unconfirmed_deletes();
        let deleted = deleted.filter(|entry| entry.pair.key.starts_with(prefix));
        let entries = tree.entries.under(prefix).chain(deleted);
        entries
            .map(|entry| (entry.pair.key.clone(), Arc::as_ptr(entry)))
            .collect()
    }

    /// Writes of this server and of others to a store, the server's own applied to the
    /// mirror late, and listings of the store in index order, drawn at random: once the
    /// mirror has listed the store's latest index and applied every own write, it holds
    /// what the store holds; and a read claiming an index (as a confirmed view does) is told
    /// by the journal of every change of what it read since.
    #[test]
    fn any_store_history_is_mirrored_as_it_is() {
        let tree = Tree::Labels(LabelType::Node);
        let prefix = "labels/node/n1-";
        for seed in 1..200 {
            let mut draws = Draws(seed * 104_729);
            let mut state = State::new(Stream::new(10, 10));
            apply(&mut state, 1, &[], true);
            let mut store = Stored::new();
            let mut history = vec![(1, Stored::new())];
            let mut own = Vec::new();
            let mut reads = Vec::new();
            for index in 2..120 {
                let key = format!(
                    "labels/node/{}-{}",
                    draws.pick(&["n1", "n2"]),
                    draws.pick(&["p", "q", "r"])
                );
                match draws.below(6) {
                    0 | 1 => {
                        let value = draws.pick(&[r#"{"a":"1"}"#, r#"{"a":"2"}"#]);
                        let create_index = store.get(&key).map_or(index, |held| held.create_index);
                        let pair = KvPair {
                            create_index,
                            ..pair(&key, value, index)
                        };
                        store.insert(key, pair.clone());
                        history.push((index, store.clone()));
                        if draws.below(2) == 0 {
                            own.push(OwnWrite::Put(pair));
                        }
                    }
                    2 => {
                        let Some(removed) = store.remove(&key) else {
                            continue;
                        };
                        history.push((index, store.clone()));
                        if draws.below(2) == 0 {
                            // Known gone through the transaction's index, or (a
                            // delete-cas alone) through the version it removed only.
                            let through = [index, removed.modify_index][draws.below(2) as usize];
                            own.push(OwnWrite::Delete {
                                key,
                                through: Some(through),
                            });
                        }
                    }
                    3 => {
                        for write in own.drain(..) {
                            match write {
                                OwnWrite::Put(pair) => state.apply_own_put(tree, tree.decode(pair)),
                                OwnWrite::Delete { key, through } => {
                                    state.apply_own_delete(tree, &key, through.unwrap())
                                }
                            }
                        }
                    }
                    4 => {
                        // A watch lists past its last listing.
                        let listed = state.tree(tree).listed;
                        let after: Vec<&(u64, Stored)> =
                            history.iter().filter(|(at, _)| *at > listed).collect();
                        if !after.is_empty() {
                            let (at, listing_of) = after[draws.below(after.len() as u64) as usize];
                            let pairs: Vec<KvPair> = listing_of.values().cloned().collect();
                            apply(&mut state, *at, &pairs, false);
                        }
                    }
                    _ => {
                        let held = state.tree(tree);
                        if held.listed >= held.index {
                            reads.push((held.listed, spanned(held, prefix)));
                        }
                    }
                }
                let held = state.tree(tree);
                let latest = history.last().map_or(0, |(at, _)| *at);
                if own.is_empty() && held.listed == latest {
                    let versions = |pairs: Vec<&KvPair>| -> Vec<(String, u64)> {
                        pairs
                            .into_iter()
                            .map(|pair| (pair.key.clone(), pair.modify_index))
                            .collect()
                    };
                    let mirrored =
                        versions(held.entries.values().map(|entry| &entry.pair).collect());
                    assert_eq!(mirrored, versions(store.values().collect()), "seed {seed}");
                }
                let now = spanned(held, prefix);
                for (claimed, _) in reads.iter().filter(|(_, then)| *then != now) {
                    let Some(mut touched) = held.journal.touched_past(*claimed) else {
                        continue;
                    };
                    let told = touched.any(|entry| entry.pair.key.starts_with(prefix));
                    assert!(
                        told,
                        "seed {seed}: a change since {claimed} is not journaled"
                    );
                }
            }
        }
    }

    /// A delete of a key no store ever held is never reported: its tombstone goes once a
    /// read from after the delete is applied, rather than staying for good.
    #[test]
    fn an_own_delete_of_a_key_never_stored_is_forgotten_after_a_later_read() {
        let tree = Tree::Labels(LabelType::Node);
        let mut state = State::new(Stream::new(10, 10));
        apply(&mut state, 9, &[], true);
        state.apply_own_delete(tree, "labels/node/never", 12);
        apply_changes(&mut state, 11, &[], &[]);
        assert_eq!(state.tree(tree).tombstones.len(), 1);
        apply_changes(&mut state, 13, &[], &[]);
        assert!(state.tree(tree).tombstones.is_empty());
    }

    /// A store replaced by another (its index gone backwards) may reuse an index for another
    /// value: the authoritative re-read takes the value it lists.
    #[test]
    fn a_re_read_after_the_store_went_backwards_takes_values_at_reused_indexes() {
        let mut state = State::new(Stream::new(10, 10));
        apply(
            &mut state,
            9,
            &[pair("labels/node/a", r#"{"r":"x"}"#, 5)],
            true,
        );
        apply(
            &mut state,
            6,
            &[pair("labels/node/a", r#"{"r":"y"}"#, 5)],
            true,
        );
        assert_eq!(
            state.labels_of(LabelType::Node, "a").unwrap().get("r"),
            Some("y")
        );
        // The same version listed again is not decoded again.
        let tree = Tree::Labels(LabelType::Node);
        let again = [pair("labels/node/a", r#"{"r":"y"}"#, 5)];
        let (_, to_decode) = state.prepare(tree, listing(6, &again), true);
        assert!(to_decode.is_empty());
    }
}
