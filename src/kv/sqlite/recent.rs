//! This process's latest writes, each as the followed prefixes it wrote or deleted keys
//! under: enough to tell a watch woken by transactions its caller already holds (the state mirror
//! applies the server's own transactions as they commit) that it need not read past them,
//! where reading visits every change of every prefix since its last read.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

/// The most prefixes described; the state mirror follows 17 trees.
const MOST_PREFIXES: usize = 64;

/// The most writes remembered: seconds of the farms' busiest writing, in 32 bytes each.
const MOST_WRITES: usize = 16_384;

/// The recent writes, as the store's watches and its writer share them.
#[derive(Default)]
pub(super) struct Shared(Mutex<RecentWrites>);

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, RecentWrites> {
        self.0
            .lock()
            .expect("the recent writes are never left half-changed")
    }
}

/// The prefixes followed and the latest writes, in index order.
#[derive(Default)]
pub(super) struct RecentWrites {
    /// The prefixes [`RecentWrites::held_through`] was asked about; bit `i` of a write's masks
    /// is `prefixes[i]`.
    prefixes: Vec<String>,
    /// Every index after `from`, up to the last of `writes`, is one of `writes`.
    from: u64,
    writes: VecDeque<Write>,
}

/// One committed write, as the prefixes it touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Write {
    index: u64,
    /// The prefixes it wrote or deleted a key under.
    touched: u64,
    /// The prefixes it deleted a key or a range from.
    deleted: u64,
    /// How many prefixes were followed when it was described: it tells of no later one.
    known: usize,
}

impl RecentWrites {
    /// Describes the write at `index` that wrote or deleted the keys `touched`, and of those
    /// deleted the keys `deleted`, or deleted the ranges among them.
    pub fn describe<'a>(
        &self,
        index: u64,
        touched: impl IntoIterator<Item = &'a str>,
        deleted: impl IntoIterator<Item = &'a str>,
    ) -> Write {
        let mask = |keys: &mut dyn Iterator<Item = &str>, under: fn(&str, &str) -> bool| {
            keys.fold(0, |mask, key| {
                self.prefixes
                    .iter()
                    .enumerate()
                    .filter(|(_, prefix)| under(key, prefix))
                    .fold(mask, |mask, (bit, _)| mask | 1 << bit)
            })
        };
        Write {
            index,
            touched: mask(&mut touched.into_iter(), |key, prefix| {
                key.starts_with(prefix)
            }),
            // A range covers the prefix, or lies under it.
            deleted: mask(&mut deleted.into_iter(), |key, prefix| {
                key.starts_with(prefix) || prefix.starts_with(key)
            }),
            known: self.prefixes.len(),
        }
    }

    /// Takes in the writes of a committed batch; an index missing before them (another
    /// process's commit) leaves the earlier ones out.
    pub fn committed(&mut self, writes: impl IntoIterator<Item = Write>) {
        for write in writes {
            if write.index != self.last() + 1 {
                self.writes.clear();
                self.from = write.index - 1;
            }
            self.writes.push_back(write);
            if self.writes.len() > MOST_WRITES {
                self.writes.pop_front();
                self.from += 1;
            }
        }
    }

    /// Forgets every write so far: something changed that they do not describe.
    pub fn forget(&mut self) {
        self.from = self.last();
        self.writes.clear();
    }

    /// The index of the last write remembered, or below which none is.
    fn last(&self) -> u64 {
        self.from + self.writes.len() as u64
    }

    /// The highest index up to `through` such that what changed under `prefix` after
    /// `after` up to it is only what the writes at the indexes `held` (ascending) put there:
    /// just before the first write that deleted there, or put there and is not held, or
    /// that this cannot tell of. `after` when nothing is known; a prefix not asked about
    /// before is followed from now on.
    pub fn held_through(&mut self, prefix: &str, after: u64, through: u64, held: &[u64]) -> u64 {
        let Some(bit) = self.prefixes.iter().position(|p| p == prefix) else {
            if self.prefixes.len() < MOST_PREFIXES {
                self.prefixes.push(prefix.to_owned());
            }
            return after;
        };
        if after < self.from || after >= through {
            return after;
        }
        let end = through.min(self.last());
        if end <= after {
            return after;
        }
        let flag = 1 << bit;
        let (start, stop) = ((after - self.from) as usize, (end - self.from) as usize);
        for write in self.writes.range(start..stop) {
            let unheld = write.touched & flag != 0 && held.binary_search(&write.index).is_err();
            if write.known <= bit || write.deleted & flag != 0 || unheld {
                return write.index - 1;
            }
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recent writes following `prefixes`, from index 10.
    fn following(prefixes: &[&str]) -> RecentWrites {
        let mut recent = RecentWrites {
            from: 10,
            ..RecentWrites::default()
        };
        for prefix in prefixes {
            assert_eq!(
                recent.held_through(prefix, 10, 11, &[11]),
                10,
                "not followed yet"
            );
        }
        recent
    }

    #[test]
    fn a_prefix_moved_only_by_held_puts_is_held_through_its_index() {
        let mut recent = following(&["intent/", "labels/pod/"]);
        let writes = [
            recent.describe(11, ["intent/n1/a", "labels/pod/n1/a"], []),
            recent.describe(12, ["events/1"], []),
            recent.describe(13, ["intent/n2/b"], []),
        ];
        recent.committed(writes);
        assert_eq!(recent.held_through("intent/", 10, 13, &[11, 13]), 13);
        // Write 13 is not held: what comes from it on must be read.
        assert_eq!(recent.held_through("intent/", 10, 13, &[11]), 12);
        assert_eq!(recent.held_through("intent/", 10, 12, &[11]), 12);
        assert_eq!(recent.held_through("labels/pod/", 10, 13, &[11]), 13);
        assert_eq!(recent.held_through("labels/pod/", 10, 13, &[]), 10);
    }

    #[test]
    fn a_delete_or_a_range_deleted_under_the_prefix_is_read() {
        let mut recent = following(&["intent/", "labels/pod/", "lock/"]);
        let writes = [
            recent.describe(11, ["intent/n1/a"], ["intent/n1/b"]),
            recent.describe(12, [], ["labels/"]),
            recent.describe(13, ["lock/x"], ["lock/y/"]),
        ];
        recent.committed(writes);
        assert_eq!(recent.held_through("intent/", 10, 11, &[11]), 10);
        // A range over the prefix deletes from it.
        assert_eq!(recent.held_through("labels/pod/", 11, 12, &[12]), 11);
        // A range under it too.
        assert_eq!(recent.held_through("lock/", 12, 13, &[13]), 12);
    }

    #[test]
    fn what_is_not_remembered_is_read() {
        let mut recent = following(&["intent/"]);
        let first = recent.describe(11, ["intent/a"], []);
        recent.committed([first]);
        // Beyond the last write, or before the first remembered.
        assert_eq!(recent.held_through("intent/", 10, 12, &[11, 12]), 11);
        assert_eq!(recent.held_through("intent/", 9, 11, &[11]), 9);
        // Past the last write (the watcher read another process's commits since).
        assert_eq!(recent.held_through("intent/", 12, 14, &[13, 14]), 12);
        // Index 12 is another process's commit: what came before is forgotten.
        let later = recent.describe(13, ["intent/b"], []);
        recent.committed([later]);
        assert_eq!(recent.held_through("intent/", 10, 13, &[11, 13]), 10);
        assert_eq!(recent.held_through("intent/", 12, 13, &[13]), 13);
        recent.forget();
        assert_eq!(recent.held_through("intent/", 12, 13, &[13]), 12);
    }

    #[test]
    fn a_write_described_before_a_prefix_was_followed_tells_nothing_of_it() {
        let mut recent = following(&["intent/"]);
        let before = recent.describe(11, ["labels/pod/a"], []);
        assert_eq!(recent.held_through("labels/pod/", 10, 10, &[]), 10);
        let after = recent.describe(12, ["intent/a"], []);
        recent.committed([before, after]);
        assert_eq!(recent.held_through("labels/pod/", 10, 12, &[12]), 10);
        assert_eq!(recent.held_through("labels/pod/", 11, 12, &[]), 12);
    }

    #[test]
    fn the_oldest_writes_are_forgotten_past_the_bound() {
        let mut recent = following(&["intent/"]);
        let writes: Vec<Write> = (11..11 + MOST_WRITES as u64 + 5)
            .map(|index| recent.describe(index, ["intent/a"], []))
            .collect();
        let last = writes.last().unwrap().index;
        recent.committed(writes);
        let held: Vec<u64> = (0..=last).collect();
        assert_eq!(recent.held_through("intent/", 10, last, &held), 10);
        assert_eq!(recent.held_through("intent/", 15, last, &held), last);
    }
}
