//! The one read-modify-write loop. Every change that starts from what is stored (an RC or
//! daemon-set patch or delete, a label merge, a roll's deletion) goes through
//! [`update_with_retry`], so they all follow one rule:
//!
//! - With an expected version (`If-Match`), the write applies only to that version; any
//!   other is refused at once as stale (412). With [`Expected::Existing`] (`If-Match: *`) it
//!   applies to whatever version is stored, as a write without one does, but only while
//!   there is one.
//! - Without one, a write that loses its check-and-set to a newer write is applied again to
//!   the newer version, after a short jittered pause, for as long as it keeps losing, up to
//!   [`CONTENTION_DEADLINE`]; past it the answer is a `Conflict` (409) saying so. Losing a
//!   race is never reported as the store being unavailable: only a real store failure is.
//!
//! Updates of one object from this process take turns, so that many clients writing one
//! object make one attempt each instead of making each other lose over and over; the check-
//! and-set still decides against writers elsewhere (farms, other servers, P2's tools). A
//! write whose turn does not come by [`CONTENTION_DEADLINE`] is a `Conflict` only if the
//! store answered the attempts ahead of it meanwhile; if it answered none (it hangs), the
//! store is unavailable.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::Versioned;
use crate::backoff::Backoff;
use crate::kv::{StoreError, StoreResult};

/// How long a write without an expected version keeps re-applying itself while other
/// writers land first: far beyond what any real contention needs, and well under the
/// default request timeout (10 s), so the client hears why rather than a timeout.
pub const CONTENTION_DEADLINE: Duration = Duration::from_secs(5);

/// The first pause after a lost race; pauses double, with jitter, up to [`RETRY_CAP`].
const RETRY_BASE: Duration = Duration::from_millis(2);
/// The longest pause between two attempts.
const RETRY_CAP: Duration = Duration::from_millis(100);

/// What a conditional write must find stored (`If-Match`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// This version and no other.
    Version(u64),
    /// Any version, as long as there is one (an index of 0 is none).
    Existing,
}

impl Expected {
    /// Whether a record stored at `index` (0: none) is what the write expects.
    pub fn holds(self, index: u64) -> bool {
        match self {
            Expected::Version(version) => version == index,
            Expected::Existing => index != 0,
        }
    }
}

/// `version 42`, or `any version`.
impl std::fmt::Display for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expected::Version(version) => write!(f, "version {version}"),
            Expected::Existing => f.write_str("any version"),
        }
    }
}

/// An error an update may end with: any store error, or the refusal of a write whose
/// expected version is no longer the stored one.
pub trait UpdateError: From<StoreError> {
    /// `what` is no longer as `expected`: at another version, or gone.
    fn stale(what: &str, expected: Expected) -> Self;
}

/// Without a richer error type, a stale version is a `Conflict`, like the CAS miss it is,
/// and an object gone from under `If-Match: *` is `NotFound`.
impl UpdateError for StoreError {
    fn stale(what: &str, expected: Expected) -> Self {
        match expected {
            Expected::Version(version) => {
                StoreError::conflict(format!("{what} has changed since version {version}"))
            }
            Expected::Existing => StoreError::NotFound(format!("{what} does not exist")),
        }
    }
}

/// Reads `what` (`read`), then lets `write` decide what to do with that version and try it,
/// until the write lands or fails for another reason than a lost race (see the module doc).
///
/// `write` answers `Err` to stop with that error (a refused change), `Ok(Ok(_))` once done
/// (having written, or found nothing to write), and `Ok(Err(_))` with the store's answer
/// otherwise: a `Conflict` there is a lost race, any other store error ends the update.
pub async fn update_with_retry<T, R, E, Read, ReadFut, Write, WriteFut>(
    what: &str,
    expected: Option<Expected>,
    mut read: Read,
    mut write: Write,
) -> Result<R, E>
where
    E: UpdateError,
    Read: FnMut() -> ReadFut,
    ReadFut: Future<Output = Result<Versioned<T>, E>>,
    Write: FnMut(Versioned<T>) -> WriteFut,
    WriteFut: Future<Output = Result<StoreResult<R>, E>>,
{
    let deadline = Instant::now() + CONTENTION_DEADLINE;
    let turn = turn(what);
    let answered = turn.answered.load(Ordering::Relaxed);
    let _turn = match tokio::time::timeout_at(deadline, turn.lock.lock()).await {
        Ok(held) => held,
        Err(_) if turn.answered.load(Ordering::Relaxed) == answered => {
            return Err(not_answering(what).into());
        }
        Err(_) => return Err(kept_changing(what).into()),
    };
    let mut backoff = Backoff::new(RETRY_BASE, RETRY_CAP);
    loop {
        let current = read().await?;
        if let Some(expected) = expected.filter(|expected| !expected.holds(current.index)) {
            return Err(E::stale(what, expected));
        }
        let written = write(current).await;
        turn.answered.fetch_add(1, Ordering::Relaxed);
        match written? {
            Ok(done) => return Ok(done),
            Err(StoreError::Conflict { .. }) => {
                // Under an expected version the fresh read decides at once: stale, or (when
                // only a guard of the write failed) whatever the next attempt finds.
                let pause = match expected {
                    Some(Expected::Version(_)) => Duration::ZERO,
                    Some(Expected::Existing) | None => backoff.next_delay(),
                };
                if Instant::now() + pause > deadline {
                    return Err(kept_changing(what).into());
                }
                tokio::time::sleep(pause).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// [`update_with_retry`] whose first attempt starts from the version `mirrored` finds in the
/// mirror, rather than from the store: the write's check-and-set refuses a version the store
/// no longer holds, and the attempts after that read the store (`read`). `mirrored` runs
/// once the update's turn has come, so it sees this process's writes before it (they reach
/// the mirror at once). It answers `None` when the mirror cannot tell (it may not hold the
/// object yet); a version other than `expected` may only mean that the mirror lags, so the
/// store is read then too.
pub async fn update_from_mirror<T, R, E, Mirrored, MirroredFut, Read, ReadFut, Write, WriteFut>(
    what: &str,
    expected: Option<Expected>,
    mirrored: Mirrored,
    mut read: Read,
    write: Write,
) -> Result<R, E>
where
    E: UpdateError,
    Mirrored: FnOnce() -> MirroredFut,
    MirroredFut: Future<Output = Option<Versioned<T>>>,
    Read: FnMut() -> ReadFut,
    ReadFut: Future<Output = Result<Versioned<T>, E>>,
    Write: FnMut(Versioned<T>) -> WriteFut,
    WriteFut: Future<Output = Result<StoreResult<R>, E>>,
{
    let mut mirrored = Some(mirrored);
    let read = move || {
        let first = mirrored.take().map(|mirrored| mirrored());
        // Futures do nothing until awaited: the store is read only when needed.
        let stored = read();
        async move {
            if let Some(first) = first {
                let current = first.await.filter(|current| {
                    expected.is_none_or(|expected| expected.holds(current.index))
                });
                if let Some(current) = current {
                    return Ok(current);
                }
            }
            stored.await
        }
    };
    update_with_retry(what, expected, read, write).await
}

/// The answer once [`CONTENTION_DEADLINE`] has passed.
fn kept_changing(what: &str) -> StoreError {
    StoreError::conflict(format!(
        "{what} kept changing: other writes landed first for {}s; retry",
        CONTENTION_DEADLINE.as_secs()
    ))
}

/// The answer to a write whose turn did not come while the store answered none of the
/// attempts ahead of it.
fn not_answering(what: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "{what}: the store answered none of the writes of it ahead of this one for {}s",
        CONTENTION_DEADLINE.as_secs()
    ))
}

/// The turn of the updates of one object in this process, and how many of their attempts
/// the store has answered.
#[derive(Default)]
struct Turn {
    lock: tokio::sync::Mutex<()>,
    answered: AtomicU64,
}

/// The turn of the updates of `what` in this process: one per object being updated,
/// dropped with its last holder.
fn turn(what: &str) -> Arc<Turn> {
    static TURNS: LazyLock<Mutex<HashMap<String, Weak<Turn>>>> = LazyLock::new(Mutex::default);
    let mut turns = TURNS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(turn) = turns.get(what).and_then(Weak::upgrade) {
        return turn;
    }
    turns.retain(|_, turn| turn.strong_count() > 0);
    let turn = Arc::new(Turn::default());
    turns.insert(what.to_owned(), Arc::downgrade(&turn));
    turn
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn lost() -> StoreError {
        StoreError::conflict("check-and-set missed")
    }

    /// A store whose document moves on `conflicts` times before a write lands, and a counter
    /// of the reads the loop made.
    struct Racing {
        /// Unique per test: updates of one name take turns across the tests' runtimes.
        what: &'static str,
        index: Cell<u64>,
        conflicts: Cell<usize>,
        reads: Cell<usize>,
    }

    impl Racing {
        fn new(what: &'static str, conflicts: usize) -> Self {
            Racing {
                what,
                index: Cell::new(7),
                conflicts: Cell::new(conflicts),
                reads: Cell::new(0),
            }
        }

        async fn read(&self) -> StoreResult<Versioned<&'static str>> {
            self.reads.set(self.reads.get() + 1);
            Ok(Versioned {
                value: "doc",
                index: self.index.get(),
            })
        }

        async fn write(&self, current: Versioned<&'static str>) -> StoreResult<StoreResult<u64>> {
            assert_eq!(current.index, self.index.get(), "writes what was just read");
            self.index.set(self.index.get() + 1);
            if self.conflicts.get() > 0 {
                self.conflicts.set(self.conflicts.get() - 1);
                return Ok(Err(lost()));
            }
            Ok(Ok(self.index.get()))
        }

        async fn update(&self, expected: Option<Expected>) -> StoreResult<u64> {
            update_with_retry(self.what, expected, || self.read(), |c| self.write(c)).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_race_is_retried_on_the_newer_version_until_it_lands() {
        let racing = Racing::new("retried", 20);
        let started = Instant::now();
        assert_eq!(racing.update(None).await, Ok(28));
        assert_eq!(racing.reads.get(), 21);
        assert!(started.elapsed() < CONTENTION_DEADLINE);
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_deadline_the_answer_is_a_conflict_saying_so() {
        let racing = Racing::new("deadline", usize::MAX);
        let started = Instant::now();
        let err = racing.update(None).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Conflict { message, .. } if message.contains("kept changing")),
            "{err:?}"
        );
        assert!(started.elapsed() <= CONTENTION_DEADLINE);
        assert!(started.elapsed() + RETRY_CAP >= CONTENTION_DEADLINE);
    }

    #[tokio::test(start_paused = true)]
    async fn an_expected_version_is_written_once_and_a_stale_one_not_at_all() {
        let racing = Racing::new("expected", 0);
        assert_eq!(racing.update(Some(Expected::Version(7))).await, Ok(8));
        let err = racing.update(Some(Expected::Version(7))).await.unwrap_err();
        assert_eq!(err, StoreError::stale("expected", Expected::Version(7)));
        assert_eq!(racing.index.get(), 8, "nothing written");
    }

    #[tokio::test(start_paused = true)]
    async fn under_an_expected_version_a_lost_race_is_stale_at_once() {
        let racing = Racing::new("stale", 1);
        let started = Instant::now();
        assert_eq!(
            racing.update(Some(Expected::Version(7))).await,
            Err(StoreError::stale("stale", Expected::Version(7)))
        );
        assert_eq!(racing.reads.get(), 2);
        assert_eq!(started.elapsed(), Duration::ZERO, "no pause");
    }

    /// An update of a document stored at `stored`, starting from the mirror's `mirrored`
    /// version; counts its reads of the store.
    async fn from_mirror(
        stored: &Cell<u64>,
        reads: &Cell<usize>,
        mirrored: u64,
        expected: Option<Expected>,
    ) -> StoreResult<u64> {
        update_from_mirror(
            "from the mirror",
            expected,
            || async move {
                Some(Versioned {
                    value: (),
                    index: mirrored,
                })
            },
            || async {
                reads.set(reads.get() + 1);
                Ok(Versioned {
                    value: (),
                    index: stored.get(),
                })
            },
            |current: Versioned<()>| async move {
                if current.index != stored.get() {
                    return Ok(Err(lost()));
                }
                stored.set(stored.get() + 1);
                Ok(Ok(stored.get()))
            },
        )
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn an_update_from_the_mirror_reads_the_store_only_once_the_mirror_lags() {
        let (stored, reads) = (Cell::new(7), Cell::new(0));
        assert_eq!(from_mirror(&stored, &reads, 7, None).await, Ok(8));
        assert_eq!(reads.get(), 0, "a current mirror spares the store");
        assert_eq!(from_mirror(&stored, &reads, 7, None).await, Ok(9));
        assert_eq!(
            reads.get(),
            1,
            "a lagging mirror costs a lost race, then a read"
        );
        assert_eq!(
            from_mirror(&stored, &reads, 8, Some(Expected::Version(9))).await,
            Ok(10)
        );
        assert_eq!(
            reads.get(),
            2,
            "another version than expected is read again, not stale"
        );
        assert_eq!(
            from_mirror(&stored, &reads, 9, Some(Expected::Version(9))).await,
            Err(StoreError::stale("from the mirror", Expected::Version(9)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_end_the_update_at_once() {
        for (outer, inner) in [
            (Err(StoreError::Unavailable("down".into())), None),
            (Ok(()), Some(StoreError::Unavailable("down".into()))),
            (Ok(()), Some(StoreError::Invalid("bad".into()))),
        ] {
            let writes = Cell::new(0);
            let result: StoreResult<()> = update_with_retry(
                "failing",
                None,
                || async {
                    Ok(Versioned {
                        value: (),
                        index: 1,
                    })
                },
                |_| {
                    writes.set(writes.get() + 1);
                    let (outer, inner) = (outer.clone(), inner.clone());
                    async move { outer.map(|()| inner.map_or(Ok(()), Err)) }
                },
            )
            .await;
            assert!(result.is_err());
            assert_eq!(writes.get(), 1);
        }
    }

    /// Fifty updates of one object at once, each pausing between its read and its write:
    /// they take turns, so each reads once and none loses a race.
    #[tokio::test(start_paused = true)]
    async fn updates_of_one_object_take_turns() {
        let index = Cell::new(1);
        let reads = Cell::new(0);
        let update = |n: u64| {
            let (index, reads) = (&index, &reads);
            update_with_retry(
                "turns",
                None,
                move || async move {
                    reads.set(reads.get() + 1);
                    let read = index.get();
                    tokio::task::yield_now().await;
                    Ok::<_, StoreError>(Versioned {
                        value: n,
                        index: read,
                    })
                },
                move |current| async move {
                    tokio::task::yield_now().await;
                    if current.index != index.get() {
                        return Ok(Err(lost()));
                    }
                    index.set(index.get() + 1);
                    Ok(Ok(current.value))
                },
            )
        };
        let done = futures::future::join_all((0..50).map(update)).await;
        assert_eq!(done, (0..50).map(Ok).collect::<Vec<_>>());
        assert_eq!(reads.get(), 50);
        assert_eq!(index.get(), 51);
    }

    /// A write whose turn does not come by the deadline is a conflict while the writes
    /// ahead of it keep losing races, and the store being unavailable while it answers none
    /// of them.
    #[tokio::test(start_paused = true)]
    async fn a_turn_that_does_not_come_tells_contention_from_a_store_that_hangs() {
        let racing = Racing::new("contended turn", usize::MAX);
        let (ahead, behind) = tokio::join!(racing.update(None), racing.update(None));
        for err in [ahead.unwrap_err(), behind.unwrap_err()] {
            assert!(matches!(err, StoreError::Conflict { .. }), "{err:?}");
        }

        let hung = update_with_retry(
            "hung turn",
            None,
            || async {
                Ok(Versioned {
                    value: (),
                    index: 1,
                })
            },
            |_| std::future::pending::<StoreResult<StoreResult<()>>>(),
        );
        let behind = Racing::new("hung turn", 0);
        tokio::select! {
            // The hung update first, so that its turn comes first.
            biased;
            _ = hung => unreachable!("the store never answers"),
            answer = behind.update(None) => {
                assert!(matches!(answer, Err(StoreError::Unavailable(_))), "{answer:?}");
            }
        }
    }
}
