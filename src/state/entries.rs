//! One tree's entries, sorted by key, and its latest changes. Each entry is found by its own
//! pair's key, so a key is kept once rather than again beside its entry: at 100,000 pods, in
//! each of four trees. The entries are a persistent set, so a reader (the farms' world) keeps
//! a tree as it was at no cost but the paths the mirror changes after. The latest changes let
//! a reader that knows the tree at one generation catch up by what changed since, not by
//! walking every entry.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::ops::Bound;
use std::sync::Arc;

use imbl::OrdSet;

use super::trees::Entry;

/// The entries of one tree by key; a copy is cheap and stays as it was.
#[derive(Debug, Default, Clone)]
pub struct Entries(OrdSet<ByKey>);

/// An entry ordered and found by its key.
#[derive(Debug, Clone)]
struct ByKey(Arc<Entry>);

impl ByKey {
    fn key(&self) -> &str {
        &self.0.pair.key
    }
}

impl Borrow<str> for ByKey {
    fn borrow(&self) -> &str {
        self.key()
    }
}

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for ByKey {}

impl PartialOrd for ByKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(other.key())
    }
}

impl Entries {
    pub fn get(&self, key: &str) -> Option<&Arc<Entry>> {
        self.0.get(key).map(|found| &found.0)
    }

    /// Puts `entry` at its key, giving back the entry it replaces.
    pub(super) fn insert(&mut self, entry: Arc<Entry>) -> Option<Arc<Entry>> {
        self.0.insert(ByKey(entry)).map(|old| old.0)
    }

    pub(super) fn remove(&mut self, key: &str) -> Option<Arc<Entry>> {
        self.0.remove(key).map(|old| old.0)
    }

    /// Every entry, by key.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Arc<Entry>> {
        self.0.iter().map(|found| &found.0)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries whose key starts with `prefix`, by key.
    pub fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Arc<Entry>> {
        self.0
            .range::<_, str>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |found| found.key().starts_with(prefix))
            .map(|found| &found.0)
    }
}

impl FromIterator<Arc<Entry>> for Entries {
    fn from_iter<I: IntoIterator<Item = Arc<Entry>>>(entries: I) -> Entries {
        Entries(entries.into_iter().map(ByKey).collect())
    }
}

/// Entries found by an id that no prefix of their keys holds (intents by pod id, events by
/// object id): by the id's hash, each list in key order, so that one of a daemon set's
/// thousands of intents is found for a change by a binary search, not a scan. Each entry
/// costs a pointer to what its tree holds anyway; ids whose hashes collide share a list,
/// which a reader filters.
#[derive(Debug, Default)]
pub(super) struct ById(HashMap<u64, Vec<Arc<Entry>>>);

impl ById {
    /// The entries filed under `id`, and under any id of the same hash, by key.
    pub(super) fn get(&self, id: &str) -> &[Arc<Entry>] {
        self.0.get(&id_hash(id)).map_or(&[], Vec::as_slice)
    }

    /// Files `entry` under `id`, replacing the version at its key.
    pub(super) fn insert(&mut self, id: &str, entry: &Arc<Entry>) {
        let list = self.0.entry(id_hash(id)).or_default();
        match list.binary_search_by(|held| held.pair.key.cmp(&entry.pair.key)) {
            Ok(at) => list[at] = entry.clone(),
            Err(at) => {
                // Grown by an eighth at a time: an id's few entries leave little room unused,
                // a daemon set's thousands are still added in amortized constant time.
                if list.len() == list.capacity() {
                    list.reserve_exact(1 + list.len() / 8);
                }
                list.insert(at, entry.clone());
            }
        }
    }

    /// Drops the entry at `key` filed under `id`.
    pub(super) fn remove(&mut self, id: &str, key: &str) {
        let hash = id_hash(id);
        let Some(list) = self.0.get_mut(&hash) else {
            return;
        };
        if let Ok(at) = list.binary_search_by(|held| held.pair.key.as_str().cmp(key)) {
            list.remove(at);
        }
        if list.is_empty() {
            self.0.remove(&hash);
        } else if list.capacity() > list.len() + 1 + list.len() / 4 {
            list.shrink_to_fit();
        }
    }

    /// How many lists are kept (one per id, but for collisions).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// The bytes the map's slots and the lists take.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        let slot = size_of::<(u64, Vec<Arc<Entry>>)>() + 1;
        let lists: usize = self.0.values().map(Vec::capacity).sum();
        self.0.capacity() * slot + lists * size_of::<Arc<Entry>>()
    }
}

/// The key of [`ById`].
fn id_hash(id: &str) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(id)
}

/// How many of a tree's latest changes are kept. The farms catch up several times a second,
/// far fewer changes apart even while a large fleet is scheduled; a reader further behind
/// walks the whole tree instead. Each change keeps its entry (for a removal, the version
/// removed) alive until it drops out.
const JOURNAL_LENGTH: usize = 8192;

/// A tree's latest changes, by the generation each made.
#[derive(Debug, Default)]
pub(super) struct Journal {
    changes: VecDeque<JournalChange>,
    /// Every change made after this generation is in `changes`.
    complete_after: u64,
    /// Every change at an index past this one is in `changes`: the highest index of a
    /// change dropped, or of a listing that replaced the tree whole.
    complete_past: u64,
}

/// One change of a tree's entries.
#[derive(Debug)]
struct JournalChange {
    generation: u64,
    /// The store index the change was made at: a put's modify index, a delete's (or, for an
    /// absence from a listing, the listing's).
    at: u64,
    /// The version put, or the one removed.
    entry: Arc<Entry>,
    /// The version a put replaced, when a reader that selects by value (by labels, say)
    /// may have seen it in another selection than the new one.
    replaced: Option<Arc<Entry>>,
}

impl Journal {
    /// Notes that the change making `generation`, at index `at`, put `entry` (replacing
    /// `replaced`) or removed it.
    pub(super) fn record(
        &mut self,
        generation: u64,
        at: u64,
        entry: Arc<Entry>,
        replaced: Option<Arc<Entry>>,
    ) {
        self.changes.push_back(JournalChange {
            generation,
            at,
            entry,
            replaced,
        });
        if self.changes.len() > JOURNAL_LENGTH {
            if let Some(dropped) = self.changes.pop_front() {
                self.complete_after = dropped.generation;
                self.complete_past = self.complete_past.max(dropped.at);
            }
        }
    }

    /// Notes that the tree was replaced whole by a listing at `index` (the store's index
    /// went backwards, or the tree was read anew): the indexes of the changes before it may
    /// be another store's.
    pub(super) fn replaced_at(&mut self, index: u64) {
        self.complete_past = self.complete_past.max(index);
    }

    /// The keys changed after `generation`, sorted, each once; `None` when changes made
    /// after it are no longer all kept.
    pub(super) fn keys_since(&self, generation: u64) -> Option<Vec<&str>> {
        if generation < self.complete_after {
            return None;
        }
        let first = self
            .changes
            .partition_point(|change| change.generation <= generation);
        let mut keys: Vec<&str> = self
            .changes
            .range(first..)
            .map(|change| change.entry.pair.key.as_str())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        Some(keys)
    }

    /// Every version put, removed or replaced by a change at an index past `index`; `None`
    /// when such changes are no longer all kept.
    pub(super) fn touched_past(&self, index: u64) -> Option<impl Iterator<Item = &Arc<Entry>>> {
        if index < self.complete_past {
            return None;
        }
        let past = self.changes.iter().filter(move |change| change.at > index);
        Some(past.flat_map(|change| std::iter::once(&change.entry).chain(&change.replaced)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvPair;
    use crate::state::Tree;

    fn entry(key: &str, index: u64) -> Arc<Entry> {
        Arc::new(Tree::Intent.decode(KvPair {
            key: key.into(),
            value: b"id: x".as_slice().into(),
            create_index: index,
            modify_index: index,
            lock: None,
        }))
    }

    #[test]
    fn entries_are_found_replaced_and_removed_by_key() {
        let mut entries = Entries::default();
        assert!(entries.insert(entry("intent/b/x", 1)).is_none());
        assert!(entries.insert(entry("intent/a/x", 2)).is_none());
        let old = entries.insert(entry("intent/b/x", 3)).expect("replaced");
        assert_eq!(old.pair.modify_index, 1);
        assert_eq!(entries.get("intent/b/x").unwrap().pair.modify_index, 3);
        let keys: Vec<&str> = entries.values().map(|e| e.pair.key.as_str()).collect();
        assert_eq!(keys, ["intent/a/x", "intent/b/x"]);
        assert_eq!(entries.remove("intent/a/x").unwrap().pair.modify_index, 2);
        assert!(entries.get("intent/a/x").is_none());
    }

    #[test]
    fn the_journal_names_each_key_changed_since_a_generation_while_it_reaches_back() {
        let mut journal = Journal::default();
        journal.record(1, 1, entry("intent/b/x", 1), None);
        journal.record(2, 2, entry("intent/a/x", 2), None);
        journal.record(3, 3, entry("intent/b/x", 3), None);
        assert_eq!(
            journal.keys_since(0),
            Some(vec!["intent/a/x", "intent/b/x"])
        );
        assert_eq!(journal.keys_since(2), Some(vec!["intent/b/x"]));
        assert_eq!(journal.keys_since(3), Some(vec![]));
        for generation in 4..4 + JOURNAL_LENGTH as u64 {
            journal.record(
                generation,
                generation,
                entry("intent/c/x", generation),
                None,
            );
        }
        assert_eq!(journal.keys_since(2), None, "change 3 is no longer kept");
        assert_eq!(journal.keys_since(3), Some(vec!["intent/c/x"]));
    }

    #[test]
    fn the_journal_gives_the_versions_changed_past_an_index_while_it_reaches_back() {
        let mut journal = Journal::default();
        journal.record(1, 5, entry("intent/a/x", 5), None);
        journal.record(2, 9, entry("intent/a/x", 9), Some(entry("intent/a/x", 5)));
        // A removal, at the index of the delete.
        journal.record(3, 12, entry("intent/b/x", 7), None);
        let past = |journal: &Journal, index| {
            let touched = journal.touched_past(index)?;
            Some(touched.map(|e| e.pair.modify_index).collect::<Vec<_>>())
        };
        assert_eq!(past(&journal, 4), Some(vec![5, 9, 5, 7]));
        assert_eq!(
            past(&journal, 9),
            Some(vec![7]),
            "the removed version, at 12"
        );
        assert_eq!(past(&journal, 12), Some(vec![]));

        for generation in 4..4 + JOURNAL_LENGTH as u64 {
            journal.record(generation, 100 + generation, entry("intent/c/x", 1), None);
        }
        assert_eq!(past(&journal, 9), None, "the change at 9 is no longer kept");
        assert_eq!(past(&journal, 12), Some(vec![1; JOURNAL_LENGTH]));
        journal.replaced_at(200);
        assert_eq!(past(&journal, 199), None, "before the tree was read anew");
    }

    #[test]
    fn under_a_prefix_are_the_keys_that_start_with_it() {
        let mut entries = Entries::default();
        for key in ["intent/a/x", "intent/ab/x", "intent/b/x", "intent/a/y"] {
            entries.insert(entry(key, 1));
        }
        let under: Vec<&str> = entries
            .under("intent/a/")
            .map(|e| e.pair.key.as_str())
            .collect();
        assert_eq!(under, ["intent/a/x", "intent/a/y"]);
    }
}
