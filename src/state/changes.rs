//! The mirror's changes as a stream: every change is broadcast to the subscribers and kept in
//! a bounded log, so that a subscriber that reconnects can resume where it stopped.
//!
//! Each tree has a watch of its own, so changes to different trees may arrive out of index
//! order (a change at 97 to one tree after a change at 100 to another). A change's
//! `position` is therefore not its index but the highest index the stream has reached when
//! it was emitted (at least one past the index the mirror's first whole read listed, see
//! [`Stream::start_window`]): positions never go down, every change emitted after a
//! subscriber's last one has a position at least as high, and resuming from a position
//! replays every retained change at or past it. Once the store has gone backwards, a
//! position is the index plus an offset that keeps it above every earlier position, so
//! positions still rise with the new store's indexes. A subscriber may see the changes of
//! its last position again, never miss one.
//!
//! Each kind is broadcast on a channel of its own, so that a subscriber's buffer bound counts
//! only the changes it asked for: a dashboard following RCs is not cut off by a storm of pod
//! changes. Each label type's sets are broadcast on a channel of their own too, for a
//! subscriber that follows one type's sets to tell which objects enter or leave its selector
//! (an RC's, not every pod's). A subscriber of several channels merges them back into the
//! order the changes were emitted (see [`Receiver`]).

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use futures::future::select_all;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use super::trees::{Entry, Kind, Tree};
use crate::labels::LabelType;

/// What happened to an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
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

/// A signal and its place in the order the signals were sent, counted from 1.
type Sequenced = (u64, Signal);

/// The broadcasts, a channel per kind, and the retained log.
#[derive(Debug)]
pub(super) struct Stream {
    /// By kind, in the order of [`Kind::ALL`]; each made when first subscribed to, as a
    /// channel holds its whole buffer from the start and most kinds may never be watched.
    senders: Vec<OnceLock<broadcast::Sender<Sequenced>>>,
    /// By label type, in the order of [`LabelType::ALL`]: the changes of that type's label
    /// sets alone, made as `senders` are.
    label_senders: Vec<OnceLock<broadcast::Sender<Sequenced>>>,
    /// The capacity of each channel.
    buffer: usize,
    /// The last signal's place.
    sequence: u64,
    log: VecDeque<Arc<Change>>,
    retain: usize,
    /// The highest position given.
    position: u64,
    /// What is added to an index to make its position: nothing until the store first goes
    /// backwards, then enough to keep the new store's positions above every earlier one,
    /// rising with its indexes.
    offset: u64,
    /// Every change at or past this position is still in the log.
    window_start: u64,
}

impl Stream {
    /// A stream keeping the last `retain` changes, whose subscribers may fall `buffer`
    /// signals of one kind behind before they are cut off.
    pub(super) fn new(retain: usize, buffer: usize) -> Stream {
        Stream {
            senders: Kind::ALL.iter().map(|_| OnceLock::new()).collect(),
            label_senders: LabelType::ALL.iter().map(|_| OnceLock::new()).collect(),
            buffer: buffer.max(1),
            sequence: 0,
            log: VecDeque::new(),
            retain: retain.max(1),
            position: 0,
            offset: 0,
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
        let Some(kind) = tree.kind() else {
            return;
        };
        self.position = self.position.max(self.offset + index);
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
        self.sequence += 1;
        let label_sender = match tree {
            Tree::Labels(label_type) => self.label_senders[label_position(label_type)].get(),
            _ => None,
        };
        let senders = self.senders[kind.position()].get().into_iter();
        for sender in senders.chain(label_sender) {
            let _ = sender.send((self.sequence, Signal::Change(change.clone())));
        }
    }

    /// Makes the positions given so far, and `index` (the highest the mirror's first whole
    /// read listed), positions no subscriber may resume from: they came before the stream
    /// started and are not in its log. The listed index counts as well as the entries' own:
    /// a delete before the read (another server's client may have stopped just before it)
    /// is in no entry, only in the index of the tree's listing. And so does that index
    /// itself: the server before a restart may have given it (its own write's) while its
    /// own delete at a lower index was not streamed yet, a delete in no listing either. The
    /// stream's own positions start one past it.
    pub(super) fn start_window(&mut self, index: u64) {
        self.position = self.position.max(self.offset + index) + 1;
        self.window_start = self.window_start.max(self.position);
    }

    /// Voids every position given so far: the log is emptied and the positions given from
    /// now on are above all of them, so no old position can resume.
    pub(super) fn resync(&mut self) {
        self.log.clear();
        self.position += 1;
        self.offset = self.position;
        self.window_start = self.position;
        // On every channel, so that every subscriber hears it; they hear it once, as one
        // place in the order.
        self.sequence += 1;
        let senders = self.senders.iter().chain(&self.label_senders);
        for sender in senders.filter_map(OnceLock::get) {
            let _ = sender.send((self.sequence, Signal::Resync));
        }
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

    /// A receiver of every signal from now on about `kinds` and the label sets of
    /// `label_types`.
    pub(super) fn subscribe(&self, kinds: &[Kind], label_types: &[LabelType]) -> Receiver {
        let of_kinds = (Kind::ALL.iter().zip(&self.senders))
            .filter(|(kind, _)| kinds.contains(kind))
            .map(|(_, sender)| sender);
        let of_label_types = (LabelType::ALL.iter().zip(&self.label_senders))
            .filter(|(label_type, _)| label_types.contains(label_type))
            .map(|(_, sender)| sender);
        let receivers: Vec<_> = of_kinds
            .chain(of_label_types)
            .map(|sender| {
                let sender = sender.get_or_init(|| broadcast::channel(self.buffer).0);
                sender.subscribe()
            })
            .collect();
        Receiver {
            heads: receivers.iter().map(|_| None).collect(),
            receivers,
            given: 0,
        }
    }
}

/// The position of `label_type` in [`LabelType::ALL`].
fn label_position(label_type: LabelType) -> usize {
    (LabelType::ALL.iter())
        .position(|of| *of == label_type)
        .expect("every label type is in LabelType::ALL")
}

/// A subscriber's channels, one per kind (or label type) it asked for, read as one stream in
/// the order the signals were sent. They are sent one after another under the mirror's lock,
/// so once a signal has been received, every signal sent before it is already in its channel:
/// after each receipt the receiver looks at the head of every channel and gives the earliest.
#[derive(Debug)]
pub struct Receiver {
    receivers: Vec<broadcast::Receiver<Sequenced>>,
    /// The signal read from each channel and not given yet.
    heads: Vec<Option<Sequenced>>,
    /// The place of the last signal given: a resync, sent on every channel, is given once.
    given: u64,
}

impl Receiver {
    /// The next signal; [`RecvError::Lagged`] when the subscriber fell more than its buffer
    /// behind on one of its kinds (or label types). Cancel-safe: a signal read is kept until it is given.
    pub async fn recv(&mut self) -> Result<Signal, RecvError> {
        loop {
            for (receiver, head) in self.receivers.iter_mut().zip(&mut self.heads) {
                // A head already given (a resync heard on another channel) is dropped.
                while head.as_ref().is_none_or(|(place, _)| *place <= self.given) {
                    match receiver.try_recv() {
                        Ok(signal) => *head = Some(signal),
                        Err(TryRecvError::Empty) => {
                            *head = None;
                            break;
                        }
                        Err(TryRecvError::Lagged(missed)) => return Err(RecvError::Lagged(missed)),
                        Err(TryRecvError::Closed) => return Err(RecvError::Closed),
                    }
                }
            }
            let earliest = (self.heads.iter().enumerate())
                .filter_map(|(at, head)| Some((head.as_ref()?.0, at)))
                .min();
            if let Some((_, at)) = earliest {
                let (place, signal) = self.heads[at].take().expect("the earliest head is there");
                self.given = place;
                return Ok(signal);
            }
            if self.receivers.is_empty() {
                return std::future::pending().await;
            }
            let waiting = self.receivers.iter_mut().map(|r| Box::pin(r.recv()));
            let (signal, at, _) = select_all(waiting).await;
            self.heads[at] = Some(signal?);
        }
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

    /// The stream starts where the mirror's first whole read left it: a position from before
    /// (another server's, or this one's before a restart) is refused, since what changed
    /// then, a delete say, is in no listing.
    #[test]
    fn a_position_from_before_the_stream_started_cannot_resume() {
        let mut stream = Stream::new(10, 10);
        stream.emit(ChangeType::Added, Tree::Rolls, 3, entry("rolls/a", 3));
        stream.emit(ChangeType::Added, Tree::Rolls, 12, entry("rolls/b", 12));
        stream.start_window(12);
        assert!(stream.replay_from(10).is_none());
        stream.emit(ChangeType::Modified, Tree::Rolls, 13, entry("rolls/a", 13));
        assert_eq!(positions(&stream.replay_from(13).unwrap()), [(13, 13)]);
        // The listed index itself may be the last position of the server before a restart,
        // which had not streamed all it knew of up to it (its own deletes).
        assert!(stream.replay_from(12).is_none());
    }

    /// A delete before the first whole read is in no entry, only in the index it listed:
    /// a position below that index may have missed it.
    #[test]
    fn a_position_below_the_first_reads_listed_index_cannot_resume() {
        let mut stream = Stream::new(10, 10);
        stream.emit(ChangeType::Added, Tree::Rolls, 12, entry("rolls/a", 12));
        stream.start_window(14);
        assert!(stream.replay_from(12).is_none());
        assert!(stream.replay_from(14).is_none());
        assert_eq!(stream.position(), 15);
        assert!(stream.replay_from(15).unwrap().is_empty());
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
        assert_eq!(positions(&stream.replay_from(6).unwrap()), [(2, 8)]);
    }

    /// After the store went backwards, positions rise with its indexes again, so that a
    /// subscriber resumes from where it stopped rather than from the reset, and is not sent
    /// `resync` again once the changes since the reset outnumber those retained.
    #[test]
    fn after_a_resync_positions_rise_with_the_new_stores_indexes() {
        let mut stream = Stream::new(2, 10);
        stream.emit(ChangeType::Added, Tree::Rolls, 5, entry("rolls/a", 5));
        stream.resync();
        for index in [2, 3, 4] {
            stream.emit(
                ChangeType::Added,
                Tree::Rolls,
                index,
                entry("rolls/a", index),
            );
        }
        let last = stream.position();
        assert_eq!(positions(&stream.replay_from(last).unwrap()), [(4, last)]);
        stream.resync();
        assert!(stream.replay_from(last).is_none());
        stream.emit(ChangeType::Added, Tree::Rolls, 1, entry("rolls/a", 1));
        assert!(stream.position() > last);
    }

    fn rc(index: u64) -> Arc<Entry> {
        entry(&format!("replication_controllers/{index}"), index)
    }

    /// The indexes of the changes `receiver` has ready, until it has none.
    async fn received(receiver: &mut Receiver) -> Result<Vec<u64>, RecvError> {
        let mut indexes = Vec::new();
        let ready = std::time::Duration::from_millis(50);
        while let Ok(signal) = tokio::time::timeout(ready, receiver.recv()).await {
            match signal? {
                Signal::Change(change) => indexes.push(change.index),
                Signal::Resync => indexes.push(0),
            }
        }
        Ok(indexes)
    }

    #[tokio::test]
    async fn a_subscriber_of_several_kinds_gets_their_changes_in_the_order_emitted() {
        let mut stream = Stream::new(10, 10);
        let mut receiver = stream.subscribe(&[Kind::Rcs, Kind::Rolls], &[]);
        stream.emit(ChangeType::Added, Tree::Rolls, 100, entry("rolls/a", 100));
        stream.emit(ChangeType::Added, Tree::Rcs, 97, rc(97));
        stream.emit(ChangeType::Added, Tree::Intent, 98, entry("intent/n/p", 98));
        stream.emit(
            ChangeType::Modified,
            Tree::Rolls,
            101,
            entry("rolls/a", 101),
        );
        stream.emit(ChangeType::Added, Tree::Rcs, 102, rc(102));
        assert_eq!(received(&mut receiver).await.unwrap(), [100, 97, 101, 102]);
        stream.resync();
        assert_eq!(received(&mut receiver).await.unwrap(), [0]);
    }

    #[tokio::test]
    async fn only_changes_of_the_kinds_asked_for_count_against_the_buffer() {
        let mut stream = Stream::new(10, 2);
        let mut rcs = stream.subscribe(&[Kind::Rcs], &[]);
        let mut everything = stream.subscribe(&Kind::ALL, &[]);
        for index in 1..=5 {
            let pod = entry(&format!("intent/n/p{index}"), index);
            stream.emit(ChangeType::Added, Tree::Intent, index, pod);
        }
        stream.emit(ChangeType::Added, Tree::Rcs, 6, rc(6));
        assert_eq!(received(&mut rcs).await.unwrap(), [6]);
        assert!(matches!(
            received(&mut everything).await,
            Err(RecvError::Lagged(_))
        ));
        for index in 7..=9 {
            stream.emit(ChangeType::Added, Tree::Rcs, index, rc(index));
        }
        assert!(matches!(
            received(&mut rcs).await,
            Err(RecvError::Lagged(_))
        ));
    }

    #[tokio::test]
    async fn a_kinds_channel_is_made_when_first_subscribed_to() {
        let mut stream = Stream::new(10, 10);
        stream.emit(ChangeType::Added, Tree::Rcs, 1, rc(1));
        assert!(stream.senders.iter().all(|sender| sender.get().is_none()));
        let mut rcs = stream.subscribe(&[Kind::Rcs], &[]);
        stream.emit(ChangeType::Added, Tree::Rcs, 2, rc(2));
        assert_eq!(received(&mut rcs).await.unwrap(), [2]);
        let made = stream
            .senders
            .iter()
            .filter(|sender| sender.get().is_some());
        assert_eq!(made.count(), 1);
    }

    #[test]
    fn locks_and_status_records_are_not_streamed() {
        let mut stream = Stream::new(10, 10);
        stream.emit(ChangeType::Added, Tree::Locks, 5, entry("lock/a", 5));
        assert_eq!(stream.position(), 0);
        assert!(stream.replay_from(0).unwrap().is_empty());
    }
}
