//! One tree's entries, sorted by key. Each entry is found by its own pair's key, so a key is
//! kept once rather than again beside its entry: at 100,000 pods, in each of four trees.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use super::trees::Entry;

/// The entries of one tree by key.
#[derive(Debug, Default)]
pub(super) struct Entries(BTreeSet<ByKey>);

/// An entry ordered and found by its key.
#[derive(Debug)]
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
    pub(super) fn get(&self, key: &str) -> Option<&Arc<Entry>> {
        self.0.get(key).map(|found| &found.0)
    }

    /// Puts `entry` at its key, giving back the entry it replaces.
    pub(super) fn insert(&mut self, entry: Arc<Entry>) -> Option<Arc<Entry>> {
        self.0.replace(ByKey(entry)).map(|old| old.0)
    }

    pub(super) fn remove(&mut self, key: &str) -> Option<Arc<Entry>> {
        self.0.take(key).map(|old| old.0)
    }

    /// Every entry, by key.
    pub(super) fn values(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.0.iter().map(|found| &found.0)
    }

    /// The entries whose key starts with `prefix`, by key.
    pub(super) fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Arc<Entry>> {
        self.0
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |found| found.key().starts_with(prefix))
            .map(|found| &found.0)
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
            value: b"id: x".to_vec(),
            create_index: index,
            modify_index: index,
            lock_index: 0,
            session: None,
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
