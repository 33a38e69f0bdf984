//! The mirror's changes as a stream: every change is broadcast to the subscribers and kept in
//! a bounded log, so that a subscriber that reconnects can resume where it stopped.
//!
//! Each tree has a watch of its own, so changes to different trees may arrive out of index
//! order (a change at 97 to one tree after a change at 100 to another). A change's
//! `position` is therefore not its index but the highest index the stream has reached when
//! it was emitted: positions never go down, every change emitted after a subscriber's last
//! one has a position at least as high, and resuming from a position replays every retained
//! change at or past it. A subscriber may see the changes of its last position again, never
//! miss one.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use tokio::sync::broadcast;

use super::trees::{Entry, Tree};

/// What happened to an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    /// The name used in events.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeType::Added => "added",
            ChangeType::Modified => "modified",
            ChangeType::Deleted => "deleted",
        }
    }
}

/// One change to one mirrored entry.
#[derive(Debug)]
pub struct Change {
    pub change_type: ChangeType,
    pub tree: Tree,
    /// The entry's modify index; for a deletion, the index of the listing that no longer
    /// held it.
    pub index: u64,
    /// Where the change is in the stream (see the module documentation): what a subscriber
    /// passes back to resume.
    pub position: u64,
    /// The entry as changed; for a deletion, as it was last seen.
    pub entry: Arc<Entry>,
    /// The change as the API renders it, rendered once for all subscribers.
    pub rendered: OnceLock<String>,
}

/// What subscribers receive.
#[derive(Debug, Clone)]
pub enum Signal {
    Change(Arc<Change>),
    /// The store went backwards (restarted empty or restored): every position given so far
    /// is void and the mirror is re-reading every tree. Start again from a snapshot.
    Resync,
}

/// The broadcast and its retained log.
#[derive(Debug)]
pub(super) struct Stream {
    sender: broadcast::Sender<Signal>,
    log: VecDeque<Arc<Change>>,
    retain: usize,
    /// The highest position given.
    position: u64,
    /// Every change at or past this position is still in the log.
    window_start: u64,
}

impl Stream {
    /// A stream keeping the last `retain` changes, whose subscribers may fall `buffer`
    /// signals behind before they are cut off.
    pub(super) fn new(retain: usize, buffer: usize) -> Stream {
        Stream {
            sender: broadcast::channel(buffer.max(1)).0,
            log: VecDeque::new(),
            retain: retain.max(1),
            position: 0,
            window_start: 0,
        }
    }

    /// The highest position given so far.
    pub(super) fn position(&self) -> u64 {
        self.position
    }

    /// Records and broadcasts a change of `tree` (trees without a kind are not streamed).
    pub(super) fn emit(
        &mut self,
        change_type: ChangeType,
        tree: Tree,
        index: u64,
        entry: Arc<Entry>,
    ) {
        if tree.kind().is_none() {
            return;
        }
        self.position = self.position.max(index);
        let change = Arc::new(Change {
            change_type,
            tree,
            index,
            position: self.position,
            entry,
            rendered: OnceLock::new(),
        });
        if self.log.len() == self.retain {
            if let Some(evicted) = self.log.pop_front() {
                self.window_start = self.window_start.max(evicted.position + 1);
            }
        }
        self.log.push_back(change.clone());
        // No subscriber is not an error.
        let _ = self.sender.send(Signal::Change(change));
    }

    /// Voids every position given so far: the log is emptied and the positions given from
    /// now on are above all of them, so no old position can resume.
    pub(super) fn resync(&mut self) {
        self.log.clear();
        self.position += 1;
        self.window_start = self.position;
        let _ = self.sender.send(Signal::Resync);
    }

    /// The retained changes at or past `position`, or `None` when some of them are no longer
    /// retained (or the position was never given).
    pub(super) fn replay_from(&self, position: u64) -> Option<Vec<Arc<Change>>> {
        if position < self.window_start || position > self.position {
            return None;
        }
        let first = self
            .log
            .partition_point(|change| change.position < position);
        Some(self.log.range(first..).cloned().collect())
    }

    /// A receiver of every signal from now on.
    pub(super) fn subscribe(&self) -> broadcast::Receiver<Signal> {
        self.sender.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvPair;

    fn entry(key: &str, index: u64) -> Arc<Entry> {
        let pair = KvPair {
            key: key.into(),
            value: b"{}".as_slice().into(),
            create_index: index,
            modify_index: index,
            lock: None,
        };
        Arc::new(Tree::Rolls.decode(pair))
    }

    fn positions(changes: &[Arc<Change>]) -> Vec<(u64, u64)> {
        changes.iter().map(|c| (c.index, c.position)).collect()
    }

    #[test]
    fn positions_never_go_down_and_resume_replays_from_a_position() {
        let mut stream = Stream::new(10, 10);
        stream.emit(ChangeType::Added, Tree::Rolls, 100, entry("rolls/a", 100));
        stream.emit(
            ChangeType::Added,
            Tree::Rcs,
            97,
            entry("replication_controllers/b", 97),
        );
        stream.emit(ChangeType::Added, Tree::Rolls, 101, entry("rolls/c", 101));
        let all = stream.replay_from(0).unwrap();
        assert_eq!(positions(&all), [(100, 100), (97, 100), (101, 101)]);
        // A subscriber whose last position was 100 may have missed the change at 97.
        assert_eq!(
            positions(&stream.replay_from(100).unwrap()),
            positions(&all)
        );
        assert_eq!(positions(&stream.replay_from(101).unwrap()), [(101, 101)]);
        assert!(stream.replay_from(102).is_none(), "a position never given");
    }

    #[test]
    fn a_position_whose_changes_were_evicted_cannot_resume() {
        let mut stream = Stream::new(2, 10);
        for index in [5, 6, 7] {
            stream.emit(
                ChangeType::Added,
                Tree::Rolls,
                index,
                entry("rolls/a", index),
            );
        }
        assert!(stream.replay_from(5).is_none());
        assert!(stream.replay_from(6).is_some());
    }

    #[test]
    fn a_resync_voids_every_earlier_position() {
        let mut stream = Stream::new(10, 10);
        stream.emit(ChangeType::Added, Tree::Rolls, 5, entry("rolls/a", 5));
        stream.resync();
        assert!(stream.replay_from(5).is_none());
        stream.emit(ChangeType::Added, Tree::Rolls, 2, entry("rolls/a", 2));
        assert_eq!(positions(&stream.replay_from(6).unwrap()), [(2, 6)]);
    }

    #[test]
    fn locks_and_status_records_are_not_streamed() {
        let mut stream = Stream::new(10, 10);
        stream.emit(ChangeType::Added, Tree::Locks, 5, entry("lock/a", 5));
        assert_eq!(stream.position(), 0);
        assert!(stream.replay_from(0).unwrap().is_empty());
    }
}
