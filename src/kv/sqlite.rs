//! The embedded backend: SQLite through sqlx, schema in `migrations/`.
//!
//! Every write runs on a single writer connection, so writes are serialized within a process
//! by its lock and across processes by SQLite's own lock; each committed write takes the
//! next value of one monotonic index.
//!
//! Group commit: the writes that queue while a commit is being made durable go into one
//! `BEGIN IMMEDIATE` transaction, and the batch is committed with one fsync by a flusher
//! task. Transactions of ops queue for one task, which runs all those queued on one hold of
//! the writer: it reads the rows they concern together (seeing the batch's earlier writes),
//! then checks each transaction in memory, in turn, and leaves the rows of each that passed
//! all its checks with the batch. The batch writes them at its commit, a few hundred to a
//! statement. Every statement is a round trip to SQLite's thread while every other write
//! waits, so a transaction run this way makes none of its own; both tasks run on a thread of
//! their own, so that the writer never waits for a turn behind the server's other work. Each
//! write stays all-or-nothing; one that fails partway through changing the database (only
//! deleting a prefix or ending a session change it at once) rolls back the whole batch. A
//! write is answered only once its batch is durable; if the commit fails, every write of the
//! batch fails. Each committed batch tells the watches which keys it touched, so a commit
//! wakes only the watches it concerns; other processes' commits, noticed by polling the
//! index, wake every watch. Should the writer's tasks stop (a panic), the store is not
//! ready and every write is answered at once.
//! A background task expires sessions and reaps old tombstones.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::migrate::MigrateError;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqliteConnection};
use tokio::sync::broadcast::{
    self,
    error::{RecvError, TryRecvError},
};
use tokio::sync::{oneshot, Mutex, Notify, OwnedMutexGuard};
use tokio_util::sync::CancellationToken;

use super::sent::{Claim, Withdraw};
use super::{
    validate_key, validate_prefix, validate_txn, validate_value, Cas, Changes, HeldWrites, KvPair,
    KvStore, Listing, Lock, PrefixUpdate, SessionBehavior, SessionInfo, SessionSpec, StoreError,
    StoreResult, TxnFailure, TxnOp, WatchTarget, MAX_WATCH_WAIT,
};
use crate::metrics::{self, WriterStage};

mod recent;
use recent::Write;

/// How often other processes' writes and expired sessions are looked for.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How often expired sessions are invalidated.
const SESSION_SWEEP_INTERVAL: Duration = Duration::from_millis(500);
/// Tombstones older than this are reaped; watchers older than this see a reset instead.
const TOMBSTONE_TTL: Duration = Duration::from_secs(3600);
const TOMBSTONE_SWEEP_INTERVAL: Duration = Duration::from_secs(600);
/// How many committed batches a watch may fall behind before it has to probe blindly.
const BATCH_BACKLOG: usize = 1024;
/// Rows written by one statement: 6 parameters each, well under SQLite's 32,766.
const ROWS_PER_STATEMENT: usize = 500;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The SQLite store. Cheap to share behind an `Arc`; dropping it stops its background task.
pub struct SqliteStore {
    inner: Arc<Inner>,
    background: CancellationToken,
    /// Stops the writer's tasks alone (tests); they stop with `background` too.
    #[cfg_attr(not(test), allow(dead_code))]
    writer_stop: CancellationToken,
}

struct Inner {
    reader: SqlitePool,
    writer: Arc<Mutex<Writer>>,
    /// Wakes the flusher: a write has left the batch.
    flush: Arc<Notify>,
    /// Transactions waiting for the writer, run together by [`run_queued`]; and what wakes it.
    /// Shared with [`WriterExit`], which empties it as the writer stops.
    queued: Arc<std::sync::Mutex<Vec<Queued>>>,
    queued_ready: Arc<Notify>,
    /// What each committed batch touched; watches wait on it.
    batches: broadcast::Sender<Arc<Touched>>,
    /// The highest index whose changes have been announced on `batches` (raised only once
    /// they have been): a commit found above it that this process did not make is another
    /// process's, whose keys are read from the change indexes ([`touched_by_others`]).
    announced: AtomicU64,
    /// Held by a batch's commit from before its `COMMIT` until it is announced, and by the
    /// poll for other processes' commits ([`announce_others_commits`]), which so never takes
    /// a commit of this process's for another's. Not the writer itself: the poll would then
    /// wait, and the watches with it, for as long as the writer waits for the file's write
    /// lock (another process's commits meanwhile going unannounced) or is stuck.
    committing: Mutex<()>,
    /// The reaped index as last seen: reaping takes no index of its own, and another
    /// process's is known only by this rising.
    reaped: AtomicU64,
    /// The indexes of prefixes read lately, each kept until a batch that may have touched
    /// it is announced ([`Inner::announce`]). A quiet prefix's index is asked for again at
    /// each change elsewhere (the mirror waiting for its trees to catch up), and reading it
    /// visits every key of the prefix.
    prefix_indexes: std::sync::Mutex<HashMap<String, u64>>,
    /// This process's latest writes, as the prefixes followed that each touched: a watch of
    /// the state mirror reads changes only past the writes it holds.
    recent: Arc<recent::Shared>,
    /// Another process held the database's write lock past [`BUSY_TIMEOUT`] when the writer
    /// last tried to take it ([`Writer::locked_out`]): no write can commit, though reads do.
    locked_out: Arc<AtomicBool>,
    /// A ping is trying to take the write lock while locked out, or to write while writes
    /// fail for want of a writable disk; the next waits for none.
    probing: AtomicBool,
    /// The primary result code with which a write failed for want of a writable disk
    /// ([`WRITES_CANNOT_LAND`]) since a batch of writes that changed a row last committed,
    /// else 0 ([`Writer::cannot_write`]): the store is not ready until one commits again.
    cannot_write: Arc<AtomicI32>,
    /// Cancelled once the writer's tasks have stopped (panicked, or their loops ended): no
    /// write can commit again, so the store is not ready and every write is answered at once
    /// rather than left waiting for them ([`writer_stopped`]).
    writer_stopped: CancellationToken,
}

/// The most keys of other processes' commits read to tell the watches which moved
/// ([`touched_by_others`]); beyond, they are told that anything may have.
const OTHERS_KEYS_READ: usize = 10_000;

/// The most prefix indexes [`Inner::prefix_indexes`] keeps: the mirror's trees and then
/// some.
const KNOWN_PREFIX_INDEXES: usize = 64;

impl Inner {
    fn known_prefix_indexes(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.prefix_indexes
            .lock()
            .expect("the known prefix indexes are never left half-changed")
    }

    /// Tells the watches what a committed batch touched, and its writes, forgetting first
    /// the prefix indexes it may have changed: all under the lock of those indexes, so that
    /// an index read before the batch's commit is either forgotten here or never kept
    /// ([`Inner::prefix_index`]), and a watch woken by the batch reads the new one and finds
    /// its writes among the recent ones.
    fn announce(&self, touched: Touched, written: Vec<Write>) {
        let mut known = self.known_prefix_indexes();
        {
            let mut recent = self.recent.lock();
            if touched.everything {
                recent.forget();
            }
            recent.committed(written);
        }
        if touched.is_empty() {
            return;
        }
        known.retain(|prefix, _| !touched.touches_prefix(prefix));
        let _ = self.batches.send(Arc::new(touched));
    }

    /// The index of `prefix`, kept from an earlier read when no batch announced since may
    /// have touched it and every commit made so far has been announced: another process's
    /// commits are announced only once polled for, and an index asked for must hold every
    /// commit made before it was asked.
    async fn prefix_index(&self, prefix: &str) -> StoreResult<u64> {
        if self.every_commit_announced().await? {
            if let Some(&index) = self.known_prefix_indexes().get(prefix) {
                return Ok(index);
            }
        }
        // Subscribed before the read: a batch committed after the read's snapshot began is
        // announced after this.
        let mut batches = self.batches.subscribe();
        let index = read_prefix_index(&self.reader, prefix).await?;
        let mut known = self.known_prefix_indexes();
        loop {
            match batches.try_recv() {
                Ok(batch) if !batch.touches_prefix(prefix) => {}
                Err(TryRecvError::Empty) => break,
                // It may have changed since the read.
                Ok(_) | Err(TryRecvError::Lagged(_) | TryRecvError::Closed) => return Ok(index),
            }
        }
        if known.len() < KNOWN_PREFIX_INDEXES {
            known.insert(prefix.to_owned(), index);
        }
        Ok(index)
    }

    /// Whether every commit and reaping made in the database so far, by this process or
    /// another, has been announced.
    async fn every_commit_announced(&self) -> StoreResult<bool> {
        let (last, reaped): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT value FROM meta WHERE name = 'last_index'),
                    (SELECT value FROM meta WHERE name = 'reaped_index')",
        )
        .fetch_one(&self.reader)
        .await
        .map_err(unavailable)?;
        Ok(self.announced.load(Ordering::Acquire) >= last as u64
            && self.reaped.load(Ordering::Acquire) >= reaped as u64)
    }
}

/// What a write, or a committed batch of writes, changed: enough for a watch to tell,
/// without reading the store, whether its keys may have moved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Touched {
    /// Keys written or deleted.
    keys: BTreeSet<String>,
    /// Prefixes deleted as a whole.
    ranges: Vec<String>,
    /// Changes whose keys are unknown (another process's commits, reaped tombstones).
    everything: bool,
}

impl Touched {
    /// Changes whose keys are unknown: every watch and kept index may have moved.
    fn everything() -> Self {
        Touched {
            everything: true,
            ..Touched::default()
        }
    }

    fn is_empty(&self) -> bool {
        !self.everything && self.keys.is_empty() && self.ranges.is_empty()
    }

    fn merge(&mut self, other: Touched) {
        self.keys.extend(other.keys);
        self.ranges.extend(other.ranges);
        self.everything |= other.everything;
    }

    /// Whether anything under `prefix` may have changed.
    fn touches_prefix(&self, prefix: &str) -> bool {
        self.everything
            || self
                .keys
                .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
                .next()
                .is_some_and(|k| k.starts_with(prefix))
            || self
                .ranges
                .iter()
                .any(|r| r.starts_with(prefix) || prefix.starts_with(r.as_str()))
    }

    /// Whether what `target` covers may have changed.
    fn touches(&self, target: &WatchTarget) -> bool {
        self.everything
            || match target {
                WatchTarget::Key(key) => {
                    self.keys.contains(key) || self.ranges.iter().any(|r| key.starts_with(r))
                }
                WatchTarget::Prefix(prefix) => self.touches_prefix(prefix),
            }
    }
}

/// How long a connection waits for another one (of this process or another) holding the
/// database file locked.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies migrations.
    pub async fn open(path: &str) -> StoreResult<Self> {
        check_database_file(path)?;
        // The URL's database part is percent-decoded and ends at a `?`: both are escaped, so
        // that the file opened is the one named, never another one created empty. SQLite
        // reads a name beginning `file:` as a URI, and `:memory:` as its in-memory database,
        // so such a relative path is given from `./`.
        let escaped = path.replace('%', "%25").replace('?', "%3F");
        let escaped = if escaped.starts_with("file:") || escaped == ":memory:" {
            format!("./{escaped}")
        } else {
            escaped
        };
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{escaped}"))
            .map_err(|e| StoreError::Invalid(format!("bad sqlite path {path:?}: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT);
        // The writer keeps its statement journals in memory: each upsert of hundreds of rows
        // into the open batch journals the pages it changes, and SQLite spills a journal
        // past 64 KiB to a temporary file, one write per page. It checkpoints the log every
        // 8,192 pages rather than SQLite's 1,000: a page the batches keep changing is copied
        // into the database file once per 8,192 pages of log rather than once per 1,000.
        let writer_options = options
            .clone()
            .pragma("temp_store", "memory")
            .pragma("wal_autocheckpoint", "8192");
        let unopened = |e| opening_failed(path, e);
        let writer = open_writer(writer_options).await.map_err(unopened)?;
        // Readers keep small page caches (256 KiB each rather than SQLite's 2 MiB): they
        // read little beside the mirror, and what they read is in the OS's cache anyway.
        // They are not pinged before each use, as pooled connections are by default: a
        // connection to a file cannot have dropped, and each ping was a round trip to its
        // thread.
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .connect_with(options.read_only(true).pragma("cache_size", "-256"))
            .await
            .map_err(|e| unopened(unavailable(e)))?;
        let last = meta(&reader, "last_index").await?;
        let reaped = meta(&reader, "reaped_index").await?;
        let conn = writer.acquire().await.map_err(unavailable)?;
        let flush = Arc::new(Notify::new());
        let queued_ready = Arc::new(Notify::new());
        let locked_out = Arc::new(AtomicBool::new(false));
        let cannot_write = Arc::new(AtomicI32::new(0));
        let inner = Arc::new(Inner {
            reader,
            writer: Arc::new(Mutex::new(Writer {
                conn,
                open: false,
                last_index: 0,
                changes_at_open: 0,
                dirty: false,
                failed: false,
                pending: Vec::new(),
                taken: None,
                touched: Touched::default(),
                written: Vec::new(),
                staged: HashMap::new(),
                rows_written: 0,
                locked_out: locked_out.clone(),
                cannot_write: cannot_write.clone(),
            })),
            flush: flush.clone(),
            queued: Arc::default(),
            queued_ready: queued_ready.clone(),
            batches: broadcast::Sender::new(BATCH_BACKLOG),
            announced: AtomicU64::new(last),
            committing: Mutex::new(()),
            reaped: AtomicU64::new(reaped),
            prefix_indexes: std::sync::Mutex::default(),
            recent: Arc::default(),
            locked_out,
            probing: AtomicBool::new(false),
            cannot_write,
            writer_stopped: CancellationToken::new(),
        });
        let background = CancellationToken::new();
        tokio::spawn(run_background(Arc::downgrade(&inner), background.clone()));
        // The writer's tasks run on a thread of their own: on the server's runtime, the writer
        // waited after each round trip to SQLite's thread for its turn behind every other
        // runnable task, while all the other writes waited for the writer.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Unavailable(format!("starting the writer's runtime: {e}")))?;
        let writer_stop = background.child_token();
        let (weak, stop) = (Arc::downgrade(&inner), writer_stop.clone());
        let stopped = WriterExit {
            stopped: inner.writer_stopped.clone(),
            queued: inner.queued.clone(),
        };
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || {
                let _stopped = stopped;
                runtime.block_on(async move {
                    tokio::join!(
                        run_flusher(weak.clone(), flush, stop.clone()),
                        run_queued(weak, queued_ready, stop),
                    )
                })
            })
            .map_err(|e| StoreError::Unavailable(format!("starting the writer's thread: {e}")))?;
        Ok(SqliteStore {
            inner,
            background,
            writer_stop,
        })
    }

    /// Tries, in the background and one at a time, a write that changes nothing the store
    /// serves (the reaped index raised and put back in one transaction), which like any
    /// write that changes a row clears [`Inner::cannot_write`] once it commits: a server
    /// nobody writes to (run with `--no-farms`, or one whose clients a load balancer sends
    /// elsewhere while it is not ready) would otherwise stay unready after its disk takes
    /// writes again. The value changes on the way: SQLite leaves a page whose bytes a
    /// statement keeps clean, and a commit with no page to write succeeds on a full or
    /// read-only disk.
    fn try_a_write(&self) {
        if self.inner.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let written = async {
                let mut txn = WriteTxn::begin(&inner).await?;
                for change in ["value + 1", "value - 1"] {
                    sqlx::query(&format!(
                        "UPDATE meta SET value = {change} WHERE name = 'reaped_index'"
                    ))
                    .execute(txn.tx.writing())
                    .await
                    .map_err(|e| txn.tx.failed(e))?;
                }
                txn.commit(&inner).await
            };
            if let Err(e) = written.await {
                tracing::debug!(error = %e, "the store still takes no writes");
            }
            inner.probing.store(false, Ordering::Release);
        });
    }

    /// Stops the writer's tasks, as if they had died, and waits until they have.
    #[cfg(test)]
    pub(crate) async fn stop_writer(&self) {
        self.writer_stop.cancel();
        self.inner.writer_stopped.cancelled().await;
    }

    /// Runs a write on its own task so that a caller dropping its future (a client hanging
    /// up) can never leave the writer connection inside a half-done transaction. A caller
    /// that gives up before the write's transaction began withdraws it ([`Claim`]): it is
    /// then never applied.
    async fn write<T, F, Fut>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Inner>, WriteTxn) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = StoreResult<T>> + Send + 'static,
    {
        let inner = self.inner.clone();
        let claim = Claim::sent();
        let _withdraw = Withdraw(claim.clone());
        tokio::spawn(async move {
            let txn = WriteTxn::begin(&inner).await?;
            if !claim.take() {
                return Err(withdrawn());
            }
            f(inner, txn).await
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("write task failed: {e}")))?
    }
}

impl SqliteStore {
    /// Waits until what `target` covers has an index other than `index`, or `wait` passes.
    /// Only a committed batch that touched the target wakes it; a batch may concern the
    /// target without moving its index (another process's commit, a deleted range beside
    /// it), so a wake-up reads only the index. For a key that read is its snapshot,
    /// returned when it moved.
    async fn wait_for_change(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Option<Listing>> {
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WATCH_WAIT);
        // Subscribed before the first probe: a commit the probe misses is announced after it.
        let mut batches = self.inner.batches.subscribe();
        let reader = &self.inner.reader;
        loop {
            match target {
                WatchTarget::Key(key) => {
                    let probe = read_key(reader, key).await?;
                    if probe.index != index {
                        return Ok(Some(probe));
                    }
                }
                WatchTarget::Prefix(prefix) => {
                    if self.inner.prefix_index(prefix).await? != index {
                        return Ok(None);
                    }
                }
            }
            if !touched_before(&mut batches, target, deadline).await {
                return Ok(None);
            }
        }
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.background.cancel();
    }
}

/// Opens the file at `path` for reading and writing, creating it if missing, as SQLite is
/// about to: a path it cannot open (a directory, in a directory that does not exist, on a
/// read-only file system, not permitted) is refused with the reason, where SQLite only
/// says "unable to open database file".
fn check_database_file(path: &str) -> StoreResult<()> {
    let refused = |why: String| {
        StoreError::Unavailable(format!("cannot open the database file {path:?}: {why}"))
    };
    if std::fs::metadata(path).is_ok_and(|meta| meta.is_dir()) {
        return Err(refused("it is a directory".into()));
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(refused("its directory does not exist".into()))
        }
        Err(e) => Err(refused(e.to_string())),
    }
}

/// A failure to open the database, naming the file and the two SQLite keeps beside it:
/// SQLite's words name none of them, and creating those two is what fails where this
/// process may write the file but not its directory ("attempt to write a readonly
/// database").
fn opening_failed(path: &str, e: StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(why) => StoreError::Unavailable(format!(
            "opening the database file {path:?} and its log beside it \
             ({path}-wal and {path}-shm, which SQLite creates in its directory): {why}"
        )),
        other => other,
    }
}

/// Connects the writer and migrates the file. Processes starting together on a fresh file
/// race: turning it to WAL mode takes a lock SQLite does not wait for, and each applies the
/// migrations the others have not recorded yet, failing on what a winner made meanwhile. A
/// loser tries again, and finds the winner's work done, for up to [`BUSY_TIMEOUT`]; a file
/// a newer server migrated is refused at once.
async fn open_writer(options: SqliteConnectOptions) -> StoreResult<SqlitePool> {
    let started = Instant::now();
    loop {
        let connected = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await;
        let failed = match connected {
            Ok(writer) => match MIGRATOR.run(&writer).await {
                Ok(()) => return Ok(writer),
                Err(e) => {
                    writer.close().await;
                    let raced = matches!(
                        e,
                        MigrateError::Execute(_) | MigrateError::ExecuteMigration(..)
                    );
                    let e = StoreError::Unavailable(format!("migrating the database: {e}"));
                    if !raced {
                        return Err(e);
                    }
                    e
                }
            },
            Err(e) if is_busy(&e) => unavailable(e),
            Err(e) => return Err(unavailable(e)),
        };
        if started.elapsed() >= BUSY_TIMEOUT {
            return Err(failed);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether SQLite refused for a lock another connection holds (`SQLITE_BUSY`,
/// `SQLITE_LOCKED` and their extended codes).
fn is_busy(e: &sqlx::Error) -> bool {
    primary_code(e).is_some_and(|code| matches!(code, 5 | 6))
}

/// SQLite's primary result code of a failure, without its extended part.
fn primary_code(e: &sqlx::Error) -> Option<i32> {
    let code = e.as_database_error().and_then(|e| e.code());
    code.and_then(|code| code.parse::<i32>().ok())
        .map(|code| code & 0xff)
}

/// What a write withdrawn by its caller before the writer took it is answered, should
/// anyone still be waiting: it was never applied.
fn withdrawn() -> StoreError {
    StoreError::Unavailable("the write was withdrawn before it began".into())
}

/// Dropped as the writer's thread ends, whether its tasks returned or panicked: marks the
/// writer stopped ([`Inner::writer_stopped`]), logs a panic, which no request would
/// otherwise show but as a 503, and answers the transactions still queued for the writer
/// ([`Inner::queued`]) that it stopped: none reached SQLite. It marks the writer stopped
/// under the queue's lock, and empties and answers the queue before letting go of it;
/// [`run_txn`] queues only while the writer has not stopped, told under the queue's lock:
/// none is left queued, nor unanswered once the writer is seen stopped.
struct WriterExit {
    stopped: CancellationToken,
    queued: Arc<std::sync::Mutex<Vec<Queued>>>,
}

impl Drop for WriterExit {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!(
                "the embedded store's writer panicked: no write can commit until the server restarts"
            );
        }
        // A panic elsewhere while the queue was held is no reason to leave it full.
        let mut queue = self
            .queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Marked stopped under the queue's lock, and the queue emptied and answered before
        // it is let go: whoever sees the writer stopped and then looks at the queue finds it
        // empty and its transactions answered.
        self.stopped.cancel();
        for queued in queue.drain(..) {
            let _ = queued.answer.send((Err(writer_stopped()), Durable(None)));
        }
    }
}

/// What a write is refused once the writer's tasks have stopped ([`Inner::writer_stopped`]),
/// and why the store is then not ready.
fn writer_stopped() -> StoreError {
    StoreError::Unavailable(
        "the store's writer has stopped (it panicked or its loop ended): no write can commit \
         until the server restarts"
            .into(),
    )
}

fn unavailable(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(format!("sqlite: {e}"))
}

/// The failures that say no write can land, by primary result code, as the readiness probe
/// words them: a full disk, a file or file system turned read-only (or the file removed), a
/// disk that fails.
const WRITES_CANNOT_LAND: [(i32, &str); 3] = [
    (13, "the database is full (SQLITE_FULL: the disk, most likely)"),
    (
        8,
        "the database cannot be written (SQLITE_READONLY: its file or file system, or the file removed)",
    ),
    (10, "the database's disk fails (SQLITE_IOERR)"),
];

/// The failure of a statement of the writer's, noted on `cannot_write` when it says that no
/// write can land ([`WRITES_CANNOT_LAND`]).
fn failed_write(cannot_write: &AtomicI32, e: sqlx::Error) -> StoreError {
    if let Some(code) = primary_code(&e) {
        if WRITES_CANNOT_LAND.iter().any(|(known, _)| *known == code) {
            cannot_write.store(code, Ordering::Release);
        }
    }
    unavailable(e)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// A counter of the `meta` table: `last_index` or `reaped_index`.
async fn meta<'e>(db: impl sqlx::SqliteExecutor<'e>, name: &str) -> StoreResult<u64> {
    let value: i64 = sqlx::query_scalar("SELECT value FROM meta WHERE name = ?1")
        .bind(name)
        .fetch_one(db)
        .await
        .map_err(unavailable)?;
    Ok(value as u64)
}

/// The smallest byte string greater than every key starting with `prefix`, or `None` when
/// the prefix is empty (no upper bound).
fn prefix_end(prefix: &str) -> Option<Vec<u8>> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A key as stored (a blob, so that keys sort by byte).
fn key_from_bytes(key: Vec<u8>) -> StoreResult<String> {
    String::from_utf8(key).map_err(|e| StoreError::Unavailable(e.to_string()))
}

fn pair_from_row(row: &SqliteRow) -> StoreResult<KvPair> {
    Ok(KvPair {
        key: key_from_bytes(row.get("key"))?,
        value: row.get::<&[u8], _>("value").into(),
        create_index: row.get::<i64, _>("create_index") as u64,
        modify_index: row.get::<i64, _>("modify_index") as u64,
        lock: Lock::of(row.get::<i64, _>("lock_index") as u64, row.get("session")),
    })
}

const PAIR_COLUMNS: &str = "key, value, create_index, modify_index, lock_index, session";

/// Reads what a prefix holds and its index in one snapshot.
async fn read_prefix(pool: &SqlitePool, prefix: &str, with_values: bool) -> StoreResult<Listing> {
    let mut tx = pool.begin().await.map_err(unavailable)?;
    let columns = if with_values {
        PAIR_COLUMNS
    } else {
        "key, x'' AS value, create_index, modify_index, lock_index, session"
    };
    let (range, start, end) = prefix_range(prefix);
    let rows = sqlx::query(&format!(
        "SELECT {columns} FROM kv WHERE {range} ORDER BY key"
    ))
    .bind(&start)
    .bind(&end)
    .fetch_all(&mut *tx)
    .await
    .map_err(unavailable)?;
    let index = prefix_index(&mut tx, prefix).await?;
    tx.commit().await.map_err(unavailable)?;
    let pairs = rows.iter().map(pair_from_row).collect::<StoreResult<_>>()?;
    Ok(Listing { index, pairs })
}

/// The index of a prefix, read in a transaction of its own so that its snapshot ends with it.
async fn read_prefix_index(pool: &SqlitePool, prefix: &str) -> StoreResult<u64> {
    let mut tx = pool.begin().await.map_err(unavailable)?;
    let index = prefix_index(&mut tx, prefix).await?;
    tx.commit().await.map_err(unavailable)?;
    Ok(index)
}

/// What changed under `prefix` after `index`, in one snapshot, but the pairs written by the
/// transactions at the indexes `held` (each transaction has an index of its own, so they
/// are left out by their index before their rows are read); `None` when tombstones of
/// deletes after `index` may have been reaped, so only a listing can tell.
async fn read_changes(
    pool: &SqlitePool,
    prefix: &str,
    index: u64,
    held: &[u64],
) -> StoreResult<Option<Changes>> {
    let mut tx = pool.begin().await.map_err(unavailable)?;
    if index < meta(&mut *tx, "reaped_index").await? {
        return Ok(None);
    }
    let (range, start, end) = prefix_range(prefix);
    let bounds = (range, start.as_slice(), end.as_deref());
    let changed = ROWS.changed_since(&mut tx, index, bounds).await?;
    let rows = sqlx::query(&format!(
        "SELECT {PAIR_COLUMNS} FROM {changed} AND {range}
            AND modify_index NOT IN (SELECT value FROM json_each(?4)) ORDER BY key"
    ))
    .bind(&start)
    .bind(&end)
    .bind(index as i64)
    .bind(serde_json::to_string(held).expect("indexes serialize"))
    .fetch_all(&mut *tx)
    .await
    .map_err(unavailable)?;
    let deleted = TOMBSTONES.changed_since(&mut tx, index, bounds).await?;
    let deleted: Vec<(Vec<u8>, i64)> = sqlx::query_as(&format!(
        "SELECT key, delete_index FROM {deleted} AND {range} ORDER BY key"
    ))
    .bind(&start)
    .bind(&end)
    .bind(index as i64)
    .fetch_all(&mut *tx)
    .await
    .map_err(unavailable)?;
    let now = prefix_index(&mut tx, prefix).await?;
    tx.commit().await.map_err(unavailable)?;
    let deleted = deleted
        .into_iter()
        .map(|(key, at)| Ok((key_from_bytes(key)?, at as u64)))
        .collect::<StoreResult<_>>()?;
    Ok(Some(Changes {
        index: now,
        changed: rows.iter().map(pair_from_row).collect::<StoreResult<_>>()?,
        deleted,
    }))
}

/// How many of the newest entries of a change index a read of a prefix's index looks through
/// before it reads the prefix's keys instead: a busy prefix's latest changes are among them,
/// and a quiet prefix costs this much more than reading its keys. Also the first limit to
/// which a read of changes counts (see [`ChangeTable::changed_since`]).
const RECENT_CHANGES: i64 = 1024;

/// A table whose entries carry the index of their last change, with two indexes holding
/// both (`migrations/0003_change_indexes.sql`, `0004_key_change_indexes.sql`; for the rows,
/// `0006_one_key_index.sql` makes the second their only index by key), so that a
/// prefix's changes and its newest change are found without visiting the prefix's rows.
struct ChangeTable {
    table: &'static str,
    /// By change index, then key: the newest changes of every prefix.
    by_change: &'static str,
    /// By key, then change index: every change index of one prefix.
    by_key_change: &'static str,
    column: &'static str,
}

const ROWS: ChangeTable = ChangeTable {
    table: "kv",
    by_change: "kv_by_change",
    by_key_change: "kv_by_key_change",
    column: "modify_index",
};

const TOMBSTONES: ChangeTable = ChangeTable {
    table: "tombstones",
    by_change: "tombstones_by_change",
    by_key_change: "tombstones_by_key_change",
    column: "delete_index",
};

impl ChangeTable {
    /// An SQL expression for the highest index under the prefix `range` (0 if none), `?3`
    /// bound to [`RECENT_CHANGES`]: looked for among the newest entries of the change index,
    /// and only if none is under the prefix, among the prefix's keys (SQLite's `coalesce`
    /// stops at its first non-null argument).
    fn newest(&self, range: &str) -> String {
        let ChangeTable {
            table,
            by_change,
            by_key_change,
            column,
        } = self;
        format!(
            "coalesce(
                (SELECT max({column}) FROM (SELECT key, {column} FROM {table} INDEXED BY {by_change}
                    ORDER BY {column} DESC LIMIT ?3) WHERE {range}),
                (SELECT max({column}) FROM {table} INDEXED BY {by_key_change} WHERE {range}),
                0)"
        )
    }

    /// `FROM ... WHERE <entries changed after ?3>`, to be narrowed to the prefix `range`
    /// (bounds `start` and `end`): through the change index when fewer entries of any prefix
    /// changed after `index` than the prefix holds, else through the prefix's keys in the key
    /// index; either way only the rows that changed are read. Which is fewer is found by
    /// counting both up to a limit that grows fourfold until one falls short, so that
    /// telling costs about what the cheaper way does: a large busy prefix (the pods of a
    /// fleet being scheduled) has fewer changes since its last read than keys, a small quiet
    /// one fewer keys than the store's changes since.
    async fn changed_since(
        &self,
        conn: &mut SqliteConnection,
        index: u64,
        (range, start, end): (&str, &[u8], Option<&[u8]>),
    ) -> StoreResult<String> {
        let ChangeTable {
            table,
            by_change,
            by_key_change,
            column,
        } = self;
        let mut limit = RECENT_CHANGES;
        let through = loop {
            let changes: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM (SELECT 1 FROM {table} INDEXED BY {by_change}
                    WHERE {column} > ?1 LIMIT ?2)"
            ))
            .bind(index as i64)
            .bind(limit)
            .fetch_one(&mut *conn)
            .await
            .map_err(unavailable)?;
            if changes < limit {
                break by_change;
            }
            let keys: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM (SELECT 1 FROM {table} INDEXED BY {by_key_change}
                    WHERE {range} LIMIT ?3)"
            ))
            .bind(start)
            .bind(end)
            .bind(limit)
            .fetch_one(&mut *conn)
            .await
            .map_err(unavailable)?;
            if keys < limit {
                break by_key_change;
            }
            limit *= 4;
        };
        Ok(format!("{table} INDEXED BY {through} WHERE {column} > ?3"))
    }
}

/// The condition selecting the keys under `prefix` (a byte range served by the key index),
/// with its two bounds to bind as `?1` and `?2`.
fn prefix_range(prefix: &str) -> (&'static str, Vec<u8>, Option<Vec<u8>>) {
    let end = prefix_end(prefix);
    let range = if end.is_some() {
        "key >= ?1 AND key < ?2"
    } else {
        "key >= ?1"
    };
    (range, prefix.as_bytes().to_vec(), end)
}

/// The index of a prefix: the highest index of any change under it (deletes included),
/// computed inside SQLite, so asking returns no row of the prefix.
async fn prefix_index(conn: &mut SqliteConnection, prefix: &str) -> StoreResult<u64> {
    let (range, start, end) = prefix_range(prefix);
    let (rows, tombstones) = (ROWS.newest(range), TOMBSTONES.newest(range));
    let index: i64 = sqlx::query_scalar(&format!(
        "SELECT max({rows}, {tombstones}, (SELECT value FROM meta WHERE name = 'reaped_index'), 1)"
    ))
    .bind(&start)
    .bind(&end)
    .bind(RECENT_CHANGES)
    .fetch_one(conn)
    .await
    .map_err(unavailable)?;
    Ok(index as u64)
}

async fn read_key(pool: &SqlitePool, key: &str) -> StoreResult<Listing> {
    let mut tx = pool.begin().await.map_err(unavailable)?;
    let row = sqlx::query(&format!("SELECT {PAIR_COLUMNS} FROM kv WHERE key = ?1"))
        .bind(key.as_bytes())
        .fetch_optional(&mut *tx)
        .await
        .map_err(unavailable)?;
    let listing = match row {
        Some(row) => {
            let pair = pair_from_row(&row)?;
            Listing {
                index: pair.modify_index,
                pairs: vec![pair],
            }
        }
        None => {
            let index: i64 = sqlx::query_scalar(
                "SELECT max(
                    coalesce((SELECT delete_index FROM tombstones WHERE key = ?1), 0),
                    (SELECT value FROM meta WHERE name = 'reaped_index'),
                    1)",
            )
            .bind(key.as_bytes())
            .fetch_one(&mut *tx)
            .await
            .map_err(unavailable)?;
            Listing {
                index: index as u64,
                pairs: Vec::new(),
            }
        }
    };
    tx.commit().await.map_err(unavailable)?;
    Ok(listing)
}

/// The writer connection and the batch of writes it holds open.
struct Writer {
    conn: PoolConnection<Sqlite>,
    /// A `BEGIN IMMEDIATE` is open: the batch.
    open: bool,
    /// The index of the batch's last write: read when the batch begins (nobody else writes
    /// while it holds the database), stored when it commits.
    last_index: u64,
    /// The rows the connection had changed when the batch began (SQLite's `total_changes()`),
    /// so that its commit tells whether it changed any ([`Writer::changed_rows`]).
    changes_at_open: i64,
    /// A write began changing the database and did not finish (it failed or was abandoned):
    /// its changes cannot be undone apart from the batch's, so the batch is rolled back
    /// before anything else runs.
    dirty: bool,
    /// A statement of the batch failed. SQLite rolls a transaction back by itself after some
    /// failures (a full disk, an I/O error, no memory), and the batch's later statements
    /// would then each commit on their own: so the batch is rolled back whole, its writes
    /// failed, before anything else runs.
    failed: bool,
    /// The writes released into the batch, waiting for its commit: where to say how it went.
    pending: Vec<oneshot::Sender<StoreResult<()>>>,
    /// The first and last index taken by the writes released into the batch.
    taken: Option<(u64, u64)>,
    /// What the writes released into the batch touched.
    touched: Touched,
    /// Those writes, each as the followed prefixes it touched.
    written: Vec<Write>,
    /// The rows the writes released into the batch changed, by key: the database holds them
    /// only once [`Writer::write_staged`] runs, at the batch's commit or before a statement
    /// that reads the table.
    staged: HashMap<String, Staged>,
    /// How many staged rows the batch has written into the database: counted in the metrics
    /// once it commits, forgotten if it is rolled back.
    rows_written: usize,
    /// Whether the last `BEGIN IMMEDIATE` found the write lock held by another process for
    /// all of [`BUSY_TIMEOUT`].
    locked_out: Arc<AtomicBool>,
    /// Why a statement failed for want of a writable disk since a batch that changed
    /// anything last committed ([`failed_write`]).
    cannot_write: Arc<AtomicI32>,
}

/// A row changed by a write of the batch and not yet in the database.
enum Staged {
    Written(KvPair),
    /// Deleted at `index`, at `at_ms`: what its tombstone records.
    Deleted {
        index: u64,
        at_ms: i64,
    },
}

impl Staged {
    fn row(&self) -> Option<KvPair> {
        match self {
            Staged::Written(pair) => Some(pair.clone()),
            Staged::Deleted { .. } => None,
        }
    }
}

impl Writer {
    async fn run(&mut self, sql: &str) -> StoreResult<()> {
        sqlx::query(sql)
            .execute(&mut *self.conn)
            .await
            .map(drop)
            .map_err(|e| failed_write(&self.cannot_write, e))
    }

    /// Rolls the batch back if a write left it half-done or a statement of it failed.
    async fn settle(&mut self) {
        if self.dirty || self.failed {
            let cause = if self.dirty {
                "a write failed partway through"
            } else {
                "a statement of the batch failed"
            };
            self.abort(StoreError::Unavailable(cause.into())).await;
        }
    }

    /// Opens a batch, if none is open, and reads the index it starts from.
    async fn open(&mut self) -> StoreResult<()> {
        if self.open {
            return Ok(());
        }
        let began = sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *self.conn)
            .await;
        let locked_out = began.as_ref().err().is_some_and(is_busy);
        self.locked_out.store(locked_out, Ordering::Release);
        began.map_err(|e| failed_write(&self.cannot_write, e))?;
        self.open = true;
        let opened: Result<(i64, i64), _> =
            sqlx::query_as("SELECT value, total_changes() FROM meta WHERE name = 'last_index'")
                .fetch_one(&mut *self.conn)
                .await
                .map_err(unavailable);
        match opened {
            Ok((last, changes)) => {
                self.last_index = last as u64;
                self.changes_at_open = changes;
                Ok(())
            }
            Err(e) => {
                self.abort(e.clone()).await;
                Err(e)
            }
        }
    }

    /// Rolls the batch back, failing every write in it.
    async fn abort(&mut self, cause: StoreError) {
        if let Err(e) = self.run("ROLLBACK").await {
            tracing::warn!(error = %e, "rolling back a failed batch of writes failed");
        }
        self.open = false;
        self.dirty = false;
        self.failed = false;
        self.taken = None;
        self.touched = Touched::default();
        self.written.clear();
        self.staged.clear();
        self.rows_written = 0;
        for waiter in self.pending.drain(..) {
            let _ = waiter.send(Err(cause.clone()));
        }
    }

    /// Makes the database hold the batch's staged rows: the written ones, each key's old row
    /// deleted first, in one insert per [`ROWS_PER_STATEMENT`], their tombstones cleared as
    /// many at a time, the deleted ones tombstoned and deleted as many at a time.
    async fn write_staged(&mut self) -> StoreResult<()> {
        if self.staged.is_empty() {
            return Ok(());
        }
        let staged = std::mem::take(&mut self.staged);
        let mut written = Vec::new();
        let mut deleted = Vec::new();
        for (key, row) in &staged {
            match row {
                Staged::Written(pair) => written.push(pair),
                Staged::Deleted { index, at_ms } => deleted.push((key.as_bytes(), *index, *at_ms)),
            }
        }
        // In key order, neighbouring rows of a statement fall on the same pages of the key
        // indexes, which the writer's small page cache then reads once rather than per row.
        written.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        deleted.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for rows in written.chunks(ROWS_PER_STATEMENT) {
            // One row per key: the key's old row goes before the new one is inserted.
            self.delete_keys("kv", rows.iter().map(|pair| pair.key.as_bytes()))
                .await?;
            let values = vec!["(?, ?, ?, ?, ?, ?)"; rows.len()].join(", ");
            let sql = format!(
                "INSERT INTO kv (key, value, create_index, modify_index, lock_index, session)
                 VALUES {values}"
            );
            let mut query = sqlx::query(&sql);
            for pair in rows {
                query = query
                    .bind(pair.key.as_bytes())
                    .bind(&pair.value[..])
                    .bind(pair.create_index as i64)
                    .bind(pair.modify_index as i64)
                    .bind(pair.lock_index() as i64)
                    .bind(pair.session());
            }
            (query.execute(&mut *self.conn).await)
                .map_err(|e| failed_write(&self.cannot_write, e))?;
            // A key written again is no longer deleted.
            let keys = rows.iter().map(|pair| pair.key.as_bytes());
            self.delete_keys("tombstones", keys).await?;
        }
        for rows in deleted.chunks(ROWS_PER_STATEMENT) {
            let values = vec!["(?, ?, ?)"; rows.len()].join(", ");
            let sql = format!(
                "INSERT INTO tombstones (key, delete_index, deleted_at_ms) VALUES {values}
                 ON CONFLICT (key) DO UPDATE SET delete_index = excluded.delete_index,
                    deleted_at_ms = excluded.deleted_at_ms"
            );
            let mut tombstones = sqlx::query(&sql);
            for &(key, index, at_ms) in rows {
                tombstones = tombstones.bind(key).bind(index as i64).bind(at_ms);
            }
            tombstones
                .execute(&mut *self.conn)
                .await
                .map_err(|e| failed_write(&self.cannot_write, e))?;
            self.delete_keys("kv", rows.iter().map(|&(key, _, _)| key))
                .await?;
        }
        self.rows_written += staged.len();
        Ok(())
    }

    /// Deletes the rows of `table` at `keys`, in one statement.
    async fn delete_keys<'k>(
        &mut self,
        table: &str,
        keys: impl ExactSizeIterator<Item = &'k [u8]>,
    ) -> StoreResult<()> {
        let placeholders = vec!["?"; keys.len()].join(", ");
        let sql = format!("DELETE FROM {table} WHERE key IN ({placeholders})");
        let mut query = sqlx::query(&sql);
        for key in keys {
            query = query.bind(key);
        }
        query
            .execute(&mut *self.conn)
            .await
            .map(drop)
            .map_err(|e| failed_write(&self.cannot_write, e))
    }

    /// Whether a statement of the open batch changed a row. One that changed none (deleting
    /// what is not there, a sweep with nothing to sweep) leaves every page clean, and its
    /// commit, writing nothing, succeeds on a full or read-only disk: it is no sign that the
    /// disk takes writes again. (A row written as it was counts as changed, though its page
    /// stays clean: no write here does that, the tombstone sweep writing the reaped index
    /// only when it raises it.)
    async fn changed_rows(&mut self) -> bool {
        let changes: Result<i64, _> = sqlx::query_scalar("SELECT total_changes()")
            .fetch_one(&mut *self.conn)
            .await;
        changes.is_ok_and(|changes| changes != self.changes_at_open)
    }

    /// Commits the batch, if one is open, and answers its writes; tells the watches what it
    /// touched.
    async fn commit_batch(&mut self, inner: &Inner) {
        self.settle().await;
        if !self.open {
            return;
        }
        let started = Instant::now();
        if let Err(e) = self.write_staged().await {
            self.abort(e).await;
            return;
        }
        metrics::sqlite_writer_stage(WriterStage::Write, started.elapsed());
        let started = Instant::now();
        if self.taken.is_some() {
            let stored = sqlx::query("UPDATE meta SET value = ?1 WHERE name = 'last_index'")
                .bind(self.last_index as i64)
                .execute(&mut *self.conn)
                .await;
            if let Err(e) = stored {
                let e = failed_write(&self.cannot_write, e);
                self.abort(e).await;
                return;
            }
        }
        let _committing = inner.committing.lock().await;
        if let Some((first, _)) = self.taken {
            // The indexes below `first` that were never announced are other processes'
            // commits, made before this batch took the database's write lock.
            let announced = inner.announced.load(Ordering::Acquire);
            if announced + 1 < first {
                let theirs = touched_by_others(&mut self.conn, announced, first).await;
                self.touched.merge(theirs);
            }
        }
        // Asked only while writes fail, of a batch that took no index (a renewal, a sweep).
        let wrote = self.taken.is_some()
            || (self.cannot_write.load(Ordering::Acquire) != 0 && self.changed_rows().await);
        if let Err(e) = self.run("COMMIT").await {
            self.abort(e).await;
            return;
        }
        if wrote {
            // Written (a key, or only a session's renewal): the disk takes writes again.
            self.cannot_write.store(0, Ordering::Release);
        }
        metrics::sqlite_writer_stage(WriterStage::Commit, started.elapsed());
        metrics::sqlite_rows_written(std::mem::take(&mut self.rows_written));
        self.open = false;
        let touched = std::mem::take(&mut self.touched);
        let taken = self.taken.take();
        inner.announce(touched, std::mem::take(&mut self.written));
        if let Some((_, last)) = taken {
            inner.announced.fetch_max(last, Ordering::AcqRel);
        }
        for waiter in self.pending.drain(..) {
            let _ = waiter.send(Ok(()));
        }
    }
}

/// Commits the batches of writes until the store is dropped.
async fn run_flusher(inner: Weak<Inner>, flush: Arc<Notify>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = flush.notified() => {}
            () = stop.cancelled() => return,
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        // Writes that queued for the writer before this lock was asked for join the batch.
        let mut writer = inner.writer.clone().lock_owned().await;
        writer.commit_batch(&inner).await;
    }
}

/// One write transaction within the batch; every change it makes carries `index`.
struct WriteTxn {
    tx: Held,
    index: u64,
    now_ms: i64,
    wrote: bool,
    /// What this write changed; joins the batch's only when the write is released into it.
    touched: Touched,
    /// The keys of `touched` it deleted, listed as it deletes them: a write that then
    /// deletes a range hands its staged rows to the batch before it is released.
    deleted: Vec<String>,
    /// Where the write is described once released ([`Writer::written`]).
    recent: Arc<recent::Shared>,
    /// This write's view of the rows of the keys it read or wrote (`None`: absent). Its ops
    /// are checked against it and change it; the batch takes the changed rows only when the
    /// write is committed ([`WriteTxn::release_rows`]).
    rows: HashMap<String, Option<KvPair>>,
    /// The keys whose row in `rows` this write changed.
    staged: BTreeSet<String>,
    /// The sessions this write looked up (`None`: none live), and the lock-delays of the keys
    /// it may lock (`None`: no delay), each read once: a leader taking a thousand locks
    /// in its transactions of 64 would otherwise ask SQLite's thread twice per lock while
    /// holding the writer.
    sessions: HashMap<String, Option<SessionInfo>>,
    lock_delays: HashMap<String, Option<i64>>,
    flush: Arc<Notify>,
}

/// The writer, held for one write: derefs to its connection.
struct Held(OwnedMutexGuard<Writer>);

impl std::ops::Deref for Held {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.0.conn
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.0.conn
    }
}

impl Held {
    /// The connection, for a statement that changes the database: from here until the
    /// write is released, a failure leaves the batch to be rolled back.
    fn writing(&mut self) -> &mut SqliteConnection {
        self.0.dirty = true;
        &mut self.0.conn
    }

    /// What a statement that reads the batch's state gave; its failure leaves the batch to
    /// be rolled back ([`Writer::failed`]).
    fn checked<T>(&mut self, outcome: Result<T, sqlx::Error>) -> StoreResult<T> {
        outcome.map_err(|e| {
            self.0.failed = true;
            self.failed(e)
        })
    }

    /// A statement's failure, noted if it says no write can land ([`failed_write`]).
    fn failed(&self, e: sqlx::Error) -> StoreError {
        failed_write(&self.0.cannot_write, e)
    }
}

impl Drop for WriteTxn {
    /// Whether committed or abandoned, the batch is left for the flusher to commit (after
    /// rolling it back if this write left it half-done).
    fn drop(&mut self) {
        self.flush.notify_one();
    }
}

impl WriteTxn {
    async fn begin(inner: &Inner) -> StoreResult<Self> {
        let mut writer = inner.writer.clone().lock_owned().await;
        // Its batch would never commit, and the write never be answered.
        if inner.writer_stopped.is_cancelled() {
            return Err(writer_stopped());
        }
        writer.settle().await;
        writer.open().await?;
        Ok(WriteTxn {
            index: writer.last_index + 1,
            tx: Held(writer),
            now_ms: now_ms(),
            wrote: false,
            touched: Touched::default(),
            deleted: Vec::new(),
            recent: inner.recent.clone(),
            rows: HashMap::new(),
            staged: BTreeSet::new(),
            sessions: HashMap::new(),
            lock_delays: HashMap::new(),
            flush: inner.flush.clone(),
        })
    }

    /// Releases the write into the batch, frees the writer and waits until the batch is
    /// durable. A write that changed nothing waits too when the batch holds others' writes,
    /// which it may have read.
    async fn commit(mut self, inner: &Inner) -> StoreResult<()> {
        let durable = self.release();
        // Dropping the transaction frees the writer and wakes the flusher.
        drop(self);
        durable.wait(inner).await
    }

    /// Gives the write up, having changed nothing, once the writes of the batch it read are
    /// durable: what it read of them decides its answer only if they are.
    async fn abandon(mut self, inner: &Inner) -> StoreResult<()> {
        let durable = self.discard();
        // Dropping the transaction frees the writer and wakes the flusher.
        drop(self);
        durable.wait(inner).await
    }

    /// Releases the write into the batch, and makes this transaction the next write on the
    /// same writer. A write that changed the database without taking an index (a renewal,
    /// a reaping) waits for the batch too: the batch may yet be rolled back, and it with it.
    fn release(&mut self) -> Durable {
        self.release_rows();
        let writer = &mut self.tx.0;
        let changed = std::mem::replace(&mut writer.dirty, false);
        let deleted = std::mem::take(&mut self.deleted);
        if self.wrote {
            let keys = self.touched.keys.iter().map(String::as_str);
            let ranges = self.touched.ranges.iter().map(String::as_str);
            let write = self.recent.lock().describe(
                self.index,
                keys,
                deleted.iter().map(String::as_str).chain(ranges),
            );
            writer.written.push(write);
        }
        writer.touched.merge(std::mem::take(&mut self.touched));
        if self.wrote {
            writer.last_index = self.index;
            let first = writer.taken.map_or(self.index, |(first, _)| first);
            writer.taken = Some((first, self.index));
        }
        let durable = if self.wrote || changed || !writer.pending.is_empty() {
            let (done, waiter) = oneshot::channel();
            writer.pending.push(done);
            Durable(Some(waiter))
        } else {
            Durable(None)
        };
        self.index = writer.last_index + 1;
        self.wrote = false;
        durable
    }

    /// Forgets what the write changed (none of it reached the batch), and makes this
    /// transaction the next write on the same writer. Its failure stands only once the
    /// writes of the batch it may have read are durable: a check failed on a row the batch
    /// then rolls back failed on nothing the store ever held.
    fn discard(&mut self) -> Durable {
        for key in std::mem::take(&mut self.staged) {
            self.rows.remove(&key);
        }
        self.touched = Touched::default();
        self.deleted.clear();
        self.wrote = false;
        let writer = &mut self.tx.0;
        if writer.pending.is_empty() {
            return Durable(None);
        }
        let (done, waiter) = oneshot::channel();
        writer.pending.push(done);
        Durable(Some(waiter))
    }

    async fn row(&mut self, key: &str) -> StoreResult<Option<KvPair>> {
        if let Some(row) = self.rows.get(key) {
            return Ok(row.clone());
        }
        if let Some(staged) = self.tx.0.staged.get(key) {
            let row = staged.row();
            self.rows.insert(key.to_owned(), row.clone());
            return Ok(row);
        }
        let row = sqlx::query(&format!("SELECT {PAIR_COLUMNS} FROM kv WHERE key = ?1"))
            .bind(key.as_bytes())
            .fetch_optional(&mut *self.tx)
            .await;
        let row = self.tx.checked(row)?;
        let row = row.as_ref().map(pair_from_row).transpose()?;
        self.rows.insert(key.to_owned(), row.clone());
        Ok(row)
    }

    /// Reads the rows of every key of `ops` and the lock-delays of the keys they lock, a
    /// statement per [`ROWS_PER_STATEMENT`] keys.
    async fn prefetch(&mut self, ops: &[&TxnOp]) -> StoreResult<()> {
        let locked = ops.iter().filter(|op| matches!(op, TxnOp::Lock { .. }));
        self.read_lock_delays(locked.map(|op| op.key())).await?;
        let mut keys = BTreeSet::new();
        for key in ops.iter().map(|op| op.key()) {
            if self.rows.contains_key(key) {
                continue;
            }
            match self.tx.0.staged.get(key) {
                Some(staged) => {
                    self.rows.insert(key.to_owned(), staged.row());
                }
                None => {
                    keys.insert(key);
                }
            }
        }
        if keys.is_empty() {
            return Ok(());
        }
        let keys: Vec<&str> = keys.into_iter().collect();
        for keys in keys.chunks(ROWS_PER_STATEMENT) {
            let placeholders = vec!["?"; keys.len()].join(", ");
            let sql = format!("SELECT {PAIR_COLUMNS} FROM kv WHERE key IN ({placeholders})");
            let mut query = sqlx::query(&sql);
            for key in keys {
                query = query.bind(key.as_bytes());
            }
            let rows = query.fetch_all(&mut *self.tx).await;
            let rows = self.tx.checked(rows)?;
            for key in keys {
                self.rows.insert((*key).to_owned(), None);
            }
            for row in &rows {
                let pair = pair_from_row(row)?;
                self.rows.insert(pair.key.clone(), Some(pair));
            }
        }
        Ok(())
    }

    /// Writes `value` at `key`, keeping its creation index; `lock` replaces the lock state.
    async fn store(
        &mut self,
        key: &str,
        value: &[u8],
        lock: Option<(u64, Option<&str>)>,
    ) -> StoreResult<KvPair> {
        let existing = self.row(key).await?;
        let lock = match lock {
            Some((lock_index, session)) => Lock::of(lock_index, session.map(str::to_owned)),
            None => existing.as_ref().and_then(|e| e.lock.clone()),
        };
        let pair = KvPair {
            key: key.to_owned(),
            value: value.into(),
            create_index: existing.map_or(self.index, |e| e.create_index),
            modify_index: self.index,
            lock,
        };
        self.wrote = true;
        self.touched.keys.insert(pair.key.clone());
        self.staged.insert(pair.key.clone());
        self.rows.insert(pair.key.clone(), Some(pair.clone()));
        Ok(pair)
    }

    async fn remove(&mut self, key: &str) -> StoreResult<()> {
        if self.row(key).await?.is_some() {
            self.wrote = true;
            self.touched.keys.insert(key.to_owned());
            self.deleted.push(key.to_owned());
            self.staged.insert(key.to_owned());
            self.rows.insert(key.to_owned(), None);
        }
        Ok(())
    }

    /// Makes the database hold this write's changed rows, and the batch's: for a statement
    /// that reads or changes the table itself. From here on, the write failing leaves the
    /// batch to be rolled back.
    async fn flush(&mut self) -> StoreResult<()> {
        self.tx.0.dirty = true;
        self.release_rows();
        self.tx.0.write_staged().await
    }

    /// Leaves the rows this write changed with the batch.
    fn release_rows(&mut self) {
        for key in std::mem::take(&mut self.staged) {
            let staged = match &self.rows[&key] {
                Some(pair) => Staged::Written(pair.clone()),
                None => Staged::Deleted {
                    index: self.index,
                    at_ms: self.now_ms,
                },
            };
            self.tx.0.staged.insert(key, staged);
        }
    }

    /// Deletes the rows `filter` selects (over parameters `?1` onwards, bound from `params`),
    /// leaving tombstones so that watches see the deletes; how many it deleted.
    async fn tombstone_where(
        &mut self,
        filter: &str,
        params: &[Option<&[u8]>],
    ) -> StoreResult<u64> {
        let (index, now) = (params.len() + 1, params.len() + 2);
        let tombstone = format!(
            "INSERT INTO tombstones (key, delete_index, deleted_at_ms)
             SELECT key, ?{index}, ?{now} FROM kv WHERE {filter}
             ON CONFLICT (key) DO UPDATE SET delete_index = excluded.delete_index,
                deleted_at_ms = excluded.deleted_at_ms"
        );
        let delete = format!("DELETE FROM kv WHERE {filter}");
        let mut tombstones = sqlx::query(&tombstone);
        let mut deletes = sqlx::query(&delete);
        for param in params {
            tombstones = tombstones.bind(*param);
            deletes = deletes.bind(*param);
        }
        let tombstones = tombstones.bind(self.index as i64).bind(self.now_ms);
        let tombstoned = tombstones
            .execute(self.tx.writing())
            .await
            .map_err(|e| self.tx.failed(e))?
            .rows_affected();
        if tombstoned > 0 {
            (deletes.execute(self.tx.writing()).await).map_err(|e| self.tx.failed(e))?;
        }
        Ok(tombstoned)
    }

    /// Deletes every key under `prefix`, leaving tombstones so that watches see the deletes.
    async fn remove_prefix(&mut self, prefix: &str) -> StoreResult<()> {
        self.flush().await?;
        let (range, start, end) = prefix_range(prefix);
        if self
            .tombstone_where(range, &[Some(&start), end.as_deref()])
            .await?
            > 0
        {
            self.wrote = true;
            self.touched.ranges.push(prefix.to_owned());
        }
        self.rows.retain(|key, _| !key.starts_with(prefix));
        Ok(())
    }

    async fn session(&mut self, id: &str) -> StoreResult<Option<SessionInfo>> {
        if let Some(session) = self.sessions.get(id) {
            return Ok(session.clone());
        }
        let row = sqlx::query(
            "SELECT id, name, ttl_ms, lock_delay_ms, behavior, create_index FROM sessions
             WHERE id = ?1 AND expires_at_ms > ?2",
        )
        .bind(id)
        .bind(self.now_ms)
        .fetch_optional(&mut *self.tx)
        .await;
        let row = self.tx.checked(row)?;
        let session = row.as_ref().map(session_from_row).transpose()?;
        self.sessions.insert(id.to_owned(), session.clone());
        Ok(session)
    }

    /// Reads the lock-delays of those of `keys` not read yet, in one statement.
    async fn read_lock_delays<'k>(
        &mut self,
        keys: impl IntoIterator<Item = &'k str>,
    ) -> StoreResult<()> {
        let keys: BTreeSet<&str> = keys
            .into_iter()
            .filter(|key| !self.lock_delays.contains_key(*key))
            .collect();
        let keys: Vec<&str> = keys.into_iter().collect();
        for keys in keys.chunks(ROWS_PER_STATEMENT) {
            let placeholders = vec!["?"; keys.len()].join(", ");
            let sql =
                format!("SELECT key, until_ms FROM lock_delays WHERE key IN ({placeholders})");
            let mut query = sqlx::query_as::<_, (Vec<u8>, i64)>(&sql);
            for key in keys {
                query = query.bind(key.as_bytes());
            }
            let delays = query.fetch_all(&mut *self.tx).await;
            let delays = self.tx.checked(delays)?;
            for key in keys {
                self.lock_delays.insert((*key).to_owned(), None);
            }
            for (key, until) in delays {
                self.lock_delays.insert(key_from_bytes(key)?, Some(until));
            }
        }
        Ok(())
    }

    async fn lock_delayed(&mut self, key: &str) -> StoreResult<bool> {
        self.read_lock_delays([key]).await?;
        let until = self.lock_delays[key];
        Ok(until.is_some_and(|until| until > self.now_ms))
    }

    /// Applies one op as Consul's state store does; `Err(what)` is a failed check.
    async fn apply(&mut self, op: &TxnOp) -> StoreResult<Result<Option<KvPair>, String>> {
        let key = op.key();
        let existing = self.row(key).await?;
        let failed = |what: String| Ok(Err(what));
        match op {
            TxnOp::Set { value, .. } => Ok(Ok(Some(self.store(key, value, None).await?))),
            TxnOp::Cas { value, index, .. } => {
                let current = existing.as_ref().map_or(0, |e| e.modify_index);
                if current != *index {
                    return failed(format!(
                        "failed to set key {key:?}, index is stale (current {current}, expected {index})"
                    ));
                }
                let pair = self.store(key, value, None).await?;
                Ok(Ok(Some(pair)))
            }
            TxnOp::Get { .. } => match existing {
                Some(pair) => Ok(Ok(Some(pair))),
                None => failed(format!("key {key:?} doesn't exist")),
            },
            TxnOp::Delete { .. } => {
                self.remove(key).await?;
                Ok(Ok(None))
            }
            TxnOp::DeleteCas { index, .. } => match existing {
                Some(e) if e.modify_index != *index => failed(format!(
                    "failed to delete key {key:?}, index is stale (current {}, expected {index})",
                    e.modify_index
                )),
                _ => {
                    self.remove(key).await?;
                    Ok(Ok(None))
                }
            },
            TxnOp::CheckIndex { index, .. } => match existing {
                Some(e) if e.modify_index == *index => Ok(Ok(Some(e))),
                Some(e) => failed(format!(
                    "current modify index {} != {index} for key {key:?}",
                    e.modify_index
                )),
                None => failed(format!("key {key:?} doesn't exist")),
            },
            TxnOp::CheckNotExists { .. } => match existing {
                Some(_) => failed(format!("key {key:?} exists")),
                None => Ok(Ok(None)),
            },
            TxnOp::Lock { value, session, .. } => {
                if self.session(session).await?.is_none() {
                    return failed(format!(
                        "failed to lock key {key:?}: invalid session {session:?}"
                    ));
                }
                let held_by = existing.as_ref().and_then(KvPair::session);
                let lock_index = existing.as_ref().map_or(0, KvPair::lock_index);
                match held_by {
                    Some(holder) if holder == session => {
                        let pair = self.store(key, value, None).await?;
                        Ok(Ok(Some(pair)))
                    }
                    Some(_) => failed(format!("failed to lock key {key:?}, lock is already held")),
                    None if self.lock_delayed(key).await? => {
                        failed(format!("failed to lock key {key:?}, lock-delay in effect"))
                    }
                    None => {
                        let lock = Some((lock_index + 1, Some(session.as_str())));
                        let pair = self.store(key, value, lock).await?;
                        Ok(Ok(Some(pair)))
                    }
                }
            }
            TxnOp::Unlock { value, session, .. } => {
                let e = existing.as_ref();
                if e.and_then(KvPair::session) != Some(session.as_str()) {
                    return failed(format!(
                        "failed to unlock key {key:?}, lock isn't held, or is held by another session"
                    ));
                }
                let lock = Some((e.map_or(0, KvPair::lock_index), None));
                let pair = self.store(key, value, lock).await?;
                Ok(Ok(Some(pair)))
            }
            TxnOp::CheckSession { session, .. } => {
                let current = existing.as_ref().and_then(KvPair::session);
                if current == Some(session.as_str()) {
                    Ok(Ok(existing))
                } else {
                    failed(format!(
                        "failed session check for key {key:?}, current session {:?} != {session:?}",
                        current.unwrap_or_default()
                    ))
                }
            }
        }
    }

    /// Applies every op of one transaction: its results, or, when any check failed, a
    /// conflict naming each failure (the caller then discards the write).
    async fn apply_all(&mut self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        let mut results = Vec::with_capacity(ops.len());
        let mut failures = Vec::new();
        for (op_index, op) in ops.iter().enumerate() {
            match self.apply(op).await? {
                Ok(result) => results.push(result),
                Err(what) => failures.push(TxnFailure { op_index, what }),
            }
        }
        if failures.is_empty() {
            return Ok(results);
        }
        let message = failures
            .iter()
            .map(|f| format!("op {}: {}", f.op_index, f.what))
            .collect::<Vec<_>>()
            .join("; ");
        Err(StoreError::Conflict { message, failures })
    }

    /// Ends a session, applying its behavior and lock-delay to every key it holds.
    async fn invalidate_session(&mut self, id: &str) -> StoreResult<()> {
        // It releases or deletes the keys the session holds, whichever they are.
        self.flush().await?;
        self.rows.clear();
        self.sessions.remove(id);
        self.lock_delays.clear();
        let row = sqlx::query("SELECT lock_delay_ms, behavior FROM sessions WHERE id = ?1")
            .bind(id)
            .fetch_optional(&mut *self.tx)
            .await;
        let row = self.tx.checked(row)?;
        let Some(row) = row else { return Ok(()) };
        let lock_delay_ms: i64 = row.get("lock_delay_ms");
        let behavior: String = row.get("behavior");
        // The rows it holds, read in one statement and their lock-delays written in another:
        // a leader's session may hold thousands, and ending it holds the database meanwhile.
        let held = sqlx::query(&format!("SELECT {PAIR_COLUMNS} FROM kv WHERE session = ?1"))
            .bind(id)
            .fetch_all(&mut *self.tx)
            .await;
        let held = self.tx.checked(held)?;
        let held = held
            .iter()
            .map(pair_from_row)
            .collect::<StoreResult<Vec<_>>>()?;
        if lock_delay_ms > 0 && !held.is_empty() {
            sqlx::query(
                "INSERT INTO lock_delays (key, until_ms) SELECT key, ?2 FROM kv WHERE session = ?1
                 ON CONFLICT (key) DO UPDATE SET until_ms = excluded.until_ms",
            )
            .bind(id)
            .bind(self.now_ms + lock_delay_ms)
            .execute(self.tx.writing())
            .await
            .map_err(|e| self.tx.failed(e))?;
        }
        if behavior == SessionBehavior::Delete.as_str() {
            for pair in held {
                let key = pair.key.clone();
                self.rows.insert(key.clone(), Some(pair));
                self.remove(&key).await?;
            }
        } else if !held.is_empty() {
            sqlx::query("UPDATE kv SET session = NULL, modify_index = ?2 WHERE session = ?1")
                .bind(id)
                .bind(self.index as i64)
                .execute(self.tx.writing())
                .await
                .map_err(|e| self.tx.failed(e))?;
            self.wrote = true;
            self.touched
                .keys
                .extend(held.into_iter().map(|pair| pair.key));
        }
        sqlx::query("DELETE FROM sessions WHERE id = ?1")
            .bind(id)
            .execute(self.tx.writing())
            .await
            .map_err(|e| self.tx.failed(e))?;
        self.wrote = true;
        Ok(())
    }
}

fn session_from_row(row: &SqliteRow) -> StoreResult<SessionInfo> {
    let behavior: String = row.get("behavior");
    Ok(SessionInfo {
        id: row.get("id"),
        name: row.get("name"),
        ttl: Duration::from_millis(row.get::<i64, _>("ttl_ms") as u64),
        lock_delay: Duration::from_millis(row.get::<i64, _>("lock_delay_ms") as u64),
        behavior: if behavior == "delete" {
            SessionBehavior::Delete
        } else {
            SessionBehavior::Release
        },
        create_index: row.get::<i64, _>("create_index") as u64,
    })
}

/// A transaction waiting for the writer, and where to answer it: its results, or its
/// failure, once released into the batch or discarded; the batch says whether it became
/// durable, and with it the results or the failure.
struct Queued {
    ops: Vec<TxnOp>,
    answer: oneshot::Sender<(StoreResult<Vec<Option<KvPair>>>, Durable)>,
    /// Taken once the writer holds the batch's transaction, before it applies the ops; a
    /// caller that gave up first withdrew it, and the transaction is dropped unapplied.
    claim: Arc<Claim>,
}

/// Whether the batch a write was released into became durable (`None`: the write need not
/// wait, having neither changed the database nor read others' writes).
struct Durable(Option<oneshot::Receiver<StoreResult<()>>>);

impl Durable {
    /// The batch's outcome; of unknown outcome if the writer stops first, as it may have
    /// stopped committing the batch.
    async fn wait(self, inner: &Inner) -> StoreResult<()> {
        let Some(waiter) = self.0 else {
            return Ok(());
        };
        tokio::select! {
            biased;
            answered = waiter => answered
                .unwrap_or_else(|_| Err(StoreError::Unavailable("the store was closed".into()))),
            () = inner.writer_stopped.cancelled() => Err(StoreError::OutcomeUnknown(
                "the store's writer stopped before the write's batch was committed".into(),
            )),
        }
    }
}

/// Runs `ops` in one write transaction: all applied, or none and every failure reported.
/// The transaction queues for [`run_queued`], so a caller dropping this future leaves the
/// writer alone; dropped before the writer took the transaction, it withdraws it, and the
/// transaction is never applied.
async fn run_txn(inner: &Inner, ops: Vec<TxnOp>) -> StoreResult<Vec<Option<KvPair>>> {
    let (answer, answered) = oneshot::channel();
    let claim = Claim::sent();
    let _withdraw = Withdraw(claim.clone());
    {
        let mut queue = inner
            .queued
            .lock()
            .expect("the queue of transactions is never left half-changed");
        // Told under the queue's lock: the writer, once stopped, empties the queue under it
        // ([`WriterExit`]), so nothing queued after that would ever be taken out.
        if inner.writer_stopped.is_cancelled() {
            return Err(writer_stopped());
        }
        queue.push(Queued {
            ops,
            answer,
            claim: claim.clone(),
        });
    }
    inner.queued_ready.notify_one();
    let closed = || StoreError::Unavailable("the store was closed".into());
    let (results, durable) = tokio::select! {
        biased;
        answered = answered => answered.map_err(|_| closed())?,
        // Stopped before it took the transaction, the writer never will; after, it may
        // have died applying it or committing its batch.
        () = inner.writer_stopped.cancelled() => return Err(if claim.withdraw() {
            writer_stopped()
        } else {
            StoreError::OutcomeUnknown(
                "the store's writer stopped before the transaction was answered".into(),
            )
        }),
    };
    durable.wait(inner).await?;
    results
}

/// Runs the queued transactions until the store is dropped, all those queued at once on one
/// hold of the writer: their keys are read together, a few statements for all of them, and
/// each is then checked and applied in memory, in the order queued. Taken one at a time,
/// each would hold the writer across its own round trip to SQLite's thread, and its wait for
/// the runtime to run it again, while every other write waited.
async fn run_queued(inner: Weak<Inner>, ready: Arc<Notify>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = ready.notified() => {}
            () = stop.cancelled() => return,
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let queue = || {
            inner
                .queued
                .lock()
                .expect("the queue of transactions is never left half-changed")
        };
        if queue().is_empty() {
            continue;
        }
        let began = WriteTxn::begin(&inner).await;
        // Those queued while the writer was waited for join the others; those whose callers
        // gave up meanwhile (the write lock held elsewhere past their deadline) are dropped.
        let mut queued = std::mem::take(&mut *queue());
        if began.is_ok() {
            queued.retain(|queued| queued.claim.take());
        }
        let mut txn = match began {
            Ok(txn) => txn,
            Err(e) => {
                for queued in queued {
                    let _ = queued.answer.send((Err(e.clone()), Durable(None)));
                }
                continue;
            }
        };
        let all: Vec<&TxnOp> = queued.iter().flat_map(|q| &q.ops).collect();
        let started = Instant::now();
        let read = txn.prefetch(&all).await;
        metrics::sqlite_writer_stage(WriterStage::Read, started.elapsed());
        let started = Instant::now();
        for Queued { ops, answer, .. } in queued {
            let applied = match &read {
                Ok(()) => txn.apply_all(&ops).await,
                Err(e) => Err(e.clone()),
            };
            let answered = match applied {
                Ok(results) => (Ok(results), txn.release()),
                Err(e) => (Err(e), txn.discard()),
            };
            let _ = answer.send(answered);
        }
        metrics::sqlite_writer_stage(WriterStage::Check, started.elapsed());
    }
}

/// Waits for a committed batch that may have touched `target`, skipping the others without
/// reading the store; `false` once `deadline` passes first.
async fn touched_before(
    batches: &mut broadcast::Receiver<Arc<Touched>>,
    target: &WatchTarget,
    deadline: tokio::time::Instant,
) -> bool {
    loop {
        match tokio::time::timeout_at(deadline, batches.recv()).await {
            Ok(Ok(batch)) if batch.touches(target) => return true,
            Ok(Ok(_)) => {}
            // Batches were missed: any of them may have touched the target.
            Ok(Err(RecvError::Lagged(_))) => return true,
            Ok(Err(RecvError::Closed)) | Err(_) => return false,
        }
    }
}

/// Polls for other processes' commits, and beside it expires sessions and reaps tombstones,
/// until the store is dropped. The sweeps wait for the writer (up to the busy timeout while
/// another process holds the file's write lock); the poll does not wait with them, or
/// another process's commits would go unannounced, and no watch woken, meanwhile.
async fn run_background(inner: Weak<Inner>, stop: CancellationToken) {
    tokio::join!(
        poll_others_commits(inner.clone(), stop.clone()),
        sweep(inner, stop)
    );
}

/// Announces other processes' commits every [`POLL_INTERVAL`] until the store is dropped.
async fn poll_others_commits(inner: Weak<Inner>, stop: CancellationToken) {
    let mut poll = tokio::time::interval(POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = poll.tick() => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        if let Err(e) = announce_others_commits(&inner).await {
            tracing::warn!(error = %e, "reading other processes' commits failed");
        }
    }
}

/// Expires sessions every [`SESSION_SWEEP_INTERVAL`], and reaps tombstones every
/// [`TOMBSTONE_SWEEP_INTERVAL`], until the store is dropped.
async fn sweep(inner: Weak<Inner>, stop: CancellationToken) {
    let first = tokio::time::Instant::now() + SESSION_SWEEP_INTERVAL;
    let mut sweep = tokio::time::interval_at(first, SESSION_SWEEP_INTERVAL);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_tombstone_sweep = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sweep.tick() => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        if let Err(e) = expire_sessions(&inner).await {
            tracing::warn!(error = %e, "expiring sessions failed");
        }
        if last_tombstone_sweep.elapsed() >= TOMBSTONE_SWEEP_INTERVAL {
            last_tombstone_sweep = tokio::time::Instant::now();
            if let Err(e) = reap_tombstones(&inner).await {
                tracing::warn!(error = %e, "reaping tombstones failed");
            }
        }
    }
}

/// Announces what other processes committed, or reaped, since this process last looked.
async fn announce_others_commits(inner: &Inner) -> StoreResult<()> {
    let index = meta(&inner.reader, "last_index").await?;
    let reaped = meta(&inner.reader, "reaped_index").await?;
    if inner.announced.load(Ordering::Acquire) >= index
        && inner.reaped.load(Ordering::Acquire) >= reaped
    {
        return Ok(());
    }
    // This process's own commit may be between its `COMMIT` and its announcement: once no
    // batch is being committed, an index still unannounced is another's.
    let _committing = inner.committing.lock().await;
    let announced = inner.announced.load(Ordering::Acquire);
    let touched = if inner.reaped.fetch_max(reaped, Ordering::AcqRel) < reaped {
        // A prefix's index never falls below the reaped index.
        Touched::everything()
    } else if announced < index {
        let mut conn = inner.reader.acquire().await.map_err(unavailable)?;
        touched_by_others(&mut conn, announced, u64::MAX).await
    } else {
        return Ok(());
    };
    inner.announce(touched, Vec::new());
    inner.announced.fetch_max(index, Ordering::AcqRel);
    Ok(())
}

/// What other processes' commits with indexes strictly between `after` and `before` touched:
/// the keys they wrote or deleted, read through the change indexes (a key written again
/// since is among the newer rows, a deleted one among the tombstones); anything when more
/// than [`OTHERS_KEYS_READ`] changed, or when reading them failed.
async fn touched_by_others(conn: &mut SqliteConnection, after: u64, before: u64) -> Touched {
    let before = before.min(i64::MAX as u64);
    let keys: Result<Vec<Vec<u8>>, _> = sqlx::query_scalar(
        "SELECT key FROM kv INDEXED BY kv_by_change WHERE modify_index > ?1 AND modify_index < ?2
         UNION ALL
         SELECT key FROM tombstones INDEXED BY tombstones_by_change
            WHERE delete_index > ?1 AND delete_index < ?2
         LIMIT ?3",
    )
    .bind(after as i64)
    .bind(before as i64)
    .bind(OTHERS_KEYS_READ as i64 + 1)
    .fetch_all(conn)
    .await;
    let keys = match keys {
        Ok(keys) if keys.len() <= OTHERS_KEYS_READ => keys.into_iter().map(key_from_bytes),
        _ => return Touched::everything(),
    };
    match keys.collect() {
        Ok(keys) => Touched {
            keys,
            ..Touched::default()
        },
        Err(_) => Touched::everything(),
    }
}

async fn expire_sessions(inner: &Inner) -> StoreResult<()> {
    let expired: Vec<String> =
        sqlx::query_scalar("SELECT id FROM sessions WHERE expires_at_ms <= ?1")
            .bind(now_ms())
            .fetch_all(&inner.reader)
            .await
            .map_err(unavailable)?;
    for id in expired {
        let mut txn = WriteTxn::begin(inner).await?;
        // Renewed by someone else between the read and the write lock: keep it.
        let still_expired: Result<Option<i64>, _> =
            sqlx::query_scalar("SELECT 1 FROM sessions WHERE id = ?1 AND expires_at_ms <= ?2")
                .bind(&id)
                .bind(txn.now_ms)
                .fetch_optional(&mut *txn.tx)
                .await;
        if txn.tx.checked(still_expired)?.is_some() {
            tracing::info!(session = %id, "session expired");
            txn.invalidate_session(&id).await?;
        }
        txn.commit(inner).await?;
    }
    Ok(())
}

async fn reap_tombstones(inner: &Inner) -> StoreResult<()> {
    let mut txn = WriteTxn::begin(inner).await?;
    let cutoff = txn.now_ms - TOMBSTONE_TTL.as_millis() as i64;
    // Written only when raised: a row written as it was would count as a change
    // ([`Writer::changed_rows`]).
    sqlx::query(
        "UPDATE meta SET value = (SELECT max(delete_index) FROM tombstones WHERE deleted_at_ms < ?1)
         WHERE name = 'reaped_index'
            AND value < (SELECT coalesce(max(delete_index), 0) FROM tombstones
                WHERE deleted_at_ms < ?1)",
    )
    .bind(cutoff)
    .execute(txn.tx.writing())
    .await
    .map_err(|e| txn.tx.failed(e))?;
    let reaped = sqlx::query("DELETE FROM tombstones WHERE deleted_at_ms < ?1")
        .bind(cutoff)
        .execute(txn.tx.writing())
        .await
        .map_err(|e| txn.tx.failed(e))?;
    // Raising the reaped index may raise the index of any prefix or absent key.
    txn.touched.everything = reaped.rows_affected() > 0;
    sqlx::query("DELETE FROM lock_delays WHERE until_ms < ?1")
        .bind(txn.now_ms)
        .execute(txn.tx.writing())
        .await
        .map_err(|e| txn.tx.failed(e))?;
    let reaped_index = meta(&mut *txn.tx, "reaped_index").await?;
    txn.commit(inner).await?;
    // Announced already: the poll need not take it for another process's.
    inner.reaped.fetch_max(reaped_index, Ordering::AcqRel);
    Ok(())
}

#[async_trait]
impl KvStore for SqliteStore {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        validate_key(key)?;
        Ok(read_key(&self.inner.reader, key).await?.pairs.pop())
    }

    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        validate_prefix(prefix)?;
        read_prefix(&self.inner.reader, prefix, true).await
    }

    async fn prefix_index(&self, prefix: &str) -> StoreResult<u64> {
        validate_prefix(prefix)?;
        self.inner.prefix_index(prefix).await
    }

    async fn prefix_index_through(&self, prefix: &str, through: u64) -> StoreResult<u64> {
        validate_prefix(prefix)?;
        // Read first: every change up to it has been announced, so a kept index, forgotten
        // by any of them that touched the prefix, holds each that did.
        if self.inner.announced.load(Ordering::Acquire) >= through {
            if let Some(&index) = self.inner.known_prefix_indexes().get(prefix) {
                return Ok(index);
            }
        }
        self.inner.prefix_index(prefix).await
    }

    async fn current_index(&self, probe: &str) -> StoreResult<Option<u64>> {
        validate_key(probe)?;
        Ok(Some(meta(&self.inner.reader, "last_index").await?))
    }

    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        validate_prefix(prefix)?;
        let listing = read_prefix(&self.inner.reader, prefix, false).await?;
        let mut keys: Vec<String> = Vec::with_capacity(listing.pairs.len());
        for pair in listing.pairs {
            let key = match separator {
                Some(sep) => match pair.key[prefix.len()..].find(sep) {
                    Some(at) => pair.key[..prefix.len() + at + sep.len_utf8()].to_owned(),
                    None => pair.key,
                },
                None => pair.key,
            };
            if keys.last() != Some(&key) {
                keys.push(key);
            }
        }
        Ok((listing.index, keys))
    }

    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        validate_key(key)?;
        validate_value(value)?;
        let op = match cas {
            Cas::Any => TxnOp::Set {
                key: key.into(),
                value: value.into(),
            },
            Cas::Index(index) => TxnOp::Cas {
                key: key.into(),
                value: value.into(),
                index,
            },
        };
        run_txn(&self.inner, vec![op]).await.map(drop)
    }

    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        validate_key(key)?;
        let op = match cas {
            Cas::Any => TxnOp::Delete { key: key.into() },
            Cas::Index(index) => TxnOp::DeleteCas {
                key: key.into(),
                index,
            },
        };
        run_txn(&self.inner, vec![op]).await.map(drop)
    }

    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        validate_prefix(prefix)?;
        let prefix = prefix.to_owned();
        self.write(move |inner, mut txn| async move {
            txn.remove_prefix(&prefix).await?;
            txn.commit(&inner).await
        })
        .await
    }

    fn key_prefix_len(&self) -> usize {
        0
    }

    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        validate_txn(ops)?;
        run_txn(&self.inner, ops.to_vec()).await
    }

    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String> {
        spec.validate()?;
        let spec = spec.clone();
        self.write(move |inner, mut txn| async move {
            let id = uuid::Uuid::new_v4().to_string();
            sqlx::query(
                "INSERT INTO sessions (id, name, ttl_ms, lock_delay_ms, behavior, create_index,
                    expires_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .bind(&id)
            .bind(&spec.name)
            .bind(spec.ttl.as_millis() as i64)
            // Kept in milliseconds, rounded up: a lock-delay asked for is never dropped.
            .bind(spec.lock_delay.as_micros().div_ceil(1000) as i64)
            .bind(spec.behavior.as_str())
            .bind(txn.index as i64)
            .bind(txn.now_ms + spec.ttl.as_millis() as i64)
            .execute(txn.tx.writing())
            .await
            .map_err(|e| txn.tx.failed(e))?;
            txn.wrote = true;
            txn.commit(&inner).await?;
            Ok(id)
        })
        .await
    }

    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo> {
        let id = id.to_owned();
        self.write(move |inner, mut txn| async move {
            let Some(info) = txn.session(&id).await? else {
                txn.invalidate_session(&id).await?;
                txn.commit(&inner).await?;
                return Err(StoreError::NotFound(format!("session {id:?}")));
            };
            sqlx::query("UPDATE sessions SET expires_at_ms = ?2 WHERE id = ?1")
                .bind(&id)
                .bind(txn.now_ms + info.ttl.as_millis() as i64)
                .execute(txn.tx.writing())
                .await
                .map_err(|e| txn.tx.failed(e))?;
            txn.commit(&inner).await?;
            Ok(info)
        })
        .await
    }

    async fn destroy_session(&self, id: &str) -> StoreResult<()> {
        let id = id.to_owned();
        self.write(move |inner, mut txn| async move {
            txn.invalidate_session(&id).await?;
            txn.commit(&inner).await
        })
        .await
    }

    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>> {
        let row = sqlx::query(
            "SELECT id, name, ttl_ms, lock_delay_ms, behavior, create_index FROM sessions
             WHERE id = ?1 AND expires_at_ms > ?2",
        )
        .bind(id)
        .bind(now_ms())
        .fetch_optional(&self.inner.reader)
        .await
        .map_err(unavailable)?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool> {
        validate_key(key)?;
        validate_value(value)?;
        let op = TxnOp::Lock {
            key: key.into(),
            value: value.into(),
            session: session.into(),
        };
        let session = session.to_owned();
        self.write(move |inner, mut txn| async move {
            if txn.session(&session).await?.is_none() {
                txn.abandon(&inner).await?;
                return Err(StoreError::NotFound(format!("invalid session {session:?}")));
            }
            let taken = txn.apply(&op).await?.is_ok();
            txn.commit(&inner).await?;
            Ok(taken)
        })
        .await
    }

    async fn release(&self, key: &str, session: &str) -> StoreResult<bool> {
        validate_key(key)?;
        let (key, session) = (key.to_owned(), session.to_owned());
        self.write(move |inner, mut txn| async move {
            let value = match txn.row(&key).await? {
                Some(pair) => pair.value.to_vec(),
                None => {
                    txn.abandon(&inner).await?;
                    return Ok(false);
                }
            };
            let released = txn
                .apply(&TxnOp::Unlock {
                    key,
                    value,
                    session,
                })
                .await?
                .is_ok();
            txn.commit(&inner).await?;
            Ok(released)
        })
        .await
    }

    async fn watch(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Listing> {
        match target {
            WatchTarget::Key(key) => validate_key(key)?,
            WatchTarget::Prefix(prefix) => validate_prefix(prefix)?,
        }
        if let Some(probe) = self.wait_for_change(target, index, wait).await? {
            return Ok(probe);
        }
        match target {
            WatchTarget::Key(key) => read_key(&self.inner.reader, key).await,
            WatchTarget::Prefix(prefix) => read_prefix(&self.inner.reader, prefix, true).await,
        }
    }

    async fn watch_changes(
        &self,
        prefix: &str,
        index: u64,
        wait: Duration,
        held: HeldWrites<'_>,
    ) -> StoreResult<PrefixUpdate> {
        validate_prefix(prefix)?;
        let target = WatchTarget::Prefix(prefix.to_owned());
        self.wait_for_change(&target, index, wait).await?;
        let held = held();
        // What moved the prefix up to `from` is writes the caller holds: the changes are
        // read past it, and not at all when that is everything.
        let now = self.inner.prefix_index(prefix).await?;
        let from = self
            .inner
            .recent
            .lock()
            .held_through(prefix, index, now, &held);
        if from == now {
            return Ok(PrefixUpdate::Since(Changes {
                index: now,
                changed: Vec::new(),
                deleted: Vec::new(),
            }));
        }
        let reader = &self.inner.reader;
        match read_changes(reader, prefix, from, &held).await? {
            Some(changes) => Ok(PrefixUpdate::Since(changes)),
            None => Ok(PrefixUpdate::Whole(
                read_prefix(reader, prefix, true).await?,
            )),
        }
    }

    /// Reads answer through a reader, which a full or read-only disk does not stop: after a
    /// write failed for want of a writable disk the store is not ready until one commits
    /// again. Once the writer's tasks have stopped, no write ever commits: the store is not
    /// ready again. A ping waits for the writer, as a write does: one stuck in a statement
    /// holds it unanswered. While another process has held the write lock past the busy
    /// timeout, no write commits, so the store is not ready until the writer takes the lock
    /// again. A ping then tries to take it, one at a time, on a task of its own (as a write
    /// runs), so that a ping given up on never leaves the writer mid-statement.
    async fn ping(&self) -> StoreResult<()> {
        if self.inner.writer_stopped.is_cancelled() {
            return Err(writer_stopped());
        }
        meta(&self.inner.reader, "last_index").await?;
        let cannot_write = self.inner.cannot_write.load(Ordering::Acquire);
        if let Some((_, why)) = WRITES_CANNOT_LAND
            .iter()
            .find(|(code, _)| *code == cannot_write)
        {
            self.try_a_write();
            return Err(StoreError::Unavailable(format!(
                "{why}: writes fail; ready again once one commits"
            )));
        }
        if !self.inner.locked_out.load(Ordering::Acquire) {
            // A writer stuck in a statement (a disk that stops answering) holds the writer,
            // and every write waits behind it: the ping waits its turn too, so that a probe
            // given up on past its timeout says the store hangs, where the reads alone
            // answer. The write it waited behind may have found the lock held elsewhere.
            drop(self.inner.writer.lock().await);
            if !self.inner.locked_out.load(Ordering::Acquire) {
                return Ok(());
            }
        }
        let locked_out = || {
            StoreError::Unavailable(
                "another process holds the database's write lock: writes cannot commit".into(),
            )
        };
        if self.inner.probing.swap(true, Ordering::AcqRel) {
            return Err(locked_out());
        }
        let inner = self.inner.clone();
        let probe = tokio::spawn(async move {
            // Taken, the lock goes back as the empty batch commits.
            let began = WriteTxn::begin(&inner).await.map(drop);
            inner.probing.store(false, Ordering::Release);
            began
        });
        match probe.await {
            Ok(Ok(())) => Ok(()),
            _ => Err(locked_out()),
        }
    }

    /// Commits the open batch, if any, then copies the log into the database file and
    /// empties it. Left to SQLite, the log would stay beside the file until the next start
    /// (a process that exits does not close its connections). Another process reading or
    /// writing the file holds the checkpoint back: it waits for that a second at most, not
    /// `BUSY_TIMEOUT`, which it then restores.
    async fn shut_down(&self) {
        let mut writer = self.inner.writer.clone().lock_owned().await;
        if self.inner.writer_stopped.is_cancelled() {
            // The writer may have stopped partway through the batch: none of it is kept.
            writer.abort(writer_stopped()).await;
        } else {
            writer.commit_batch(&self.inner).await;
        }
        let checkpointed = async {
            writer.run("PRAGMA busy_timeout = 1000").await?;
            // (busy, pages in the log, pages checkpointed); busy when held back.
            let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
                .fetch_one(&mut *writer.conn)
                .await
                .map_err(unavailable)?;
            let usual = format!("PRAGMA busy_timeout = {}", BUSY_TIMEOUT.as_millis());
            writer.run(&usual).await?;
            Ok::<_, StoreError>(busy == 0)
        };
        match checkpointed.await {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                "another process held the log at shutdown: it stays beside the database file"
            ),
            Err(e) => tracing::warn!(error = %e, "checkpointing the log at shutdown failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::MAX_TXN_OPS;

    #[test]
    fn prefix_end_bounds_every_key_with_the_prefix() {
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("ab").unwrap(), b"ac".to_vec());
        assert_eq!(prefix_end("labels/").unwrap(), b"labels0".to_vec());
    }

    /// What changed under `prefix` after `index`, but the pairs of the transactions at
    /// `held`, as a watch that need not wait answers; a whole listing fails the test.
    async fn changes_since(store: &SqliteStore, prefix: &str, index: u64, held: &[u64]) -> Changes {
        let held = held.to_vec();
        let update = store
            .watch_changes(prefix, index, Duration::ZERO, &move || held.clone())
            .await
            .unwrap();
        let PrefixUpdate::Since(changes) = update else {
            panic!("a listing where the changes were asked for: {update:?}");
        };
        changes
    }

    /// An op setting `key` to `v`.
    fn set(key: &str) -> TxnOp {
        TxnOp::Set {
            key: key.into(),
            value: b"v".to_vec(),
        }
    }

    #[tokio::test]
    async fn changes_leave_out_the_pairs_of_the_transactions_the_watcher_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.txn(&[set("k/gone")]).await.unwrap();
        let listed = store.list("k/").await.unwrap();
        let held = store.txn(&[set("k/a"), set("k/b")]).await.unwrap();
        let held = held[0].as_ref().unwrap().modify_index;
        store.txn(&[set("k/c")]).await.unwrap();
        store
            .txn(&[
                set("k/a"),
                TxnOp::Delete {
                    key: "k/gone".into(),
                },
            ])
            .await
            .unwrap();
        let rewritten = store.get("k/a").await.unwrap().unwrap().modify_index;

        let changes = changes_since(&store, "k/", listed.index, &[held]).await;
        // k/b is left out; k/a was written again after the held transaction.
        let changed: Vec<&str> = changes.changed.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(changed, ["k/a", "k/c"]);
        assert_eq!(changes.deleted, [("k/gone".to_owned(), rewritten)]);
        assert_eq!(changes.index, rewritten);

        // A delete in a held transaction is still told: the watcher confirms it by it.
        let changes = changes_since(&store, "k/", listed.index, &[rewritten]).await;
        let changed: Vec<&str> = changes.changed.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(changed, ["k/b", "k/c"]);
        assert_eq!(changes.deleted, [("k/gone".to_owned(), rewritten)]);
    }

    /// Once a prefix is watched, a watch woken only by transactions the watcher holds
    /// answers with no changes at the prefix's index, without reading: a tombstone slipped
    /// into the file behind the store's back is not seen. The changes are read from the
    /// first write it does not hold, or the first delete under the prefix.
    #[tokio::test]
    async fn a_watch_woken_only_by_held_transactions_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        let index_of = |results: Vec<Option<KvPair>>| results[0].as_ref().unwrap().modify_index;
        let listed = store.list("k/").await.unwrap().index;
        assert!(changes_since(&store, "k/", listed, &[])
            .await
            .changed
            .is_empty());
        let a = index_of(store.txn(&[set("k/a")]).await.unwrap());
        store.txn(&[set("other/x")]).await.unwrap();
        let b = index_of(store.txn(&[set("k/b"), set("other/y")]).await.unwrap());
        let mut behind = connect_beside(&dir).await;
        sqlx::query("INSERT INTO tombstones (key, delete_index, deleted_at_ms) VALUES (?1, ?2, 0)")
            .bind(b"k/sneaked".as_slice())
            .bind(b as i64)
            .execute(&mut behind)
            .await
            .unwrap();

        let changes = changes_since(&store, "k/", listed, &[a, b]).await;
        assert_eq!(
            (changes.index, changes.changed, changes.deleted),
            (b, vec![], vec![])
        );

        // Holding only the first, what follows it is read, the tombstone with it.
        let changes = changes_since(&store, "k/", listed, &[a]).await;
        let changed: Vec<&str> = changes.changed.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(changed, ["k/b"]);
        assert_eq!(changes.deleted, [("k/sneaked".to_owned(), b)]);

        // A held transaction that deletes under the prefix is read.
        let c = index_of(
            store
                .txn(&[set("k/c"), TxnOp::Delete { key: "k/a".into() }])
                .await
                .unwrap(),
        );
        let changes = changes_since(&store, "k/", b, &[c]).await;
        assert!(changes.changed.is_empty());
        assert_eq!(changes.deleted, [("k/a".to_owned(), c)]);
    }

    /// Random histories against two stores on one file: batches of concurrent transactions
    /// (sets, deletes, locks and unlocks), ranges deleted, sessions ended (releasing or
    /// deleting what they hold), locks taken and freed, batches rolled back after a write
    /// was released into them, and the other process's commits. After each step, a watch
    /// of each prefix from many indexes, holding most of its own transactions as the mirror
    /// does, answers exactly what a read of every change would (up to the index it
    /// answers at), whether or not it skipped past the writes it holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_skipping_held_writes_answers_what_a_full_read_does() {
        let mut skipped = 0;
        for seed in 0..2 {
            skipped += random_history(seed).await;
        }
        assert!(skipped > 0, "no watch ever skipped past a held write");
    }

    /// The prefixes the random histories write under, and those their watches follow.
    const WRITTEN: [&str; 4] = ["a/", "a/x/", "b/", "c/"];
    const WATCHED: [&str; 6] = ["a/", "a/x/", "b/", "c/", "a", "d/"];

    /// Runs one random history (see above); how many watches skipped past held writes.
    async fn random_history(seed: u64) -> usize {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        use std::collections::BTreeMap;

        let rng = &mut StdRng::seed_from_u64(seed);
        let key =
            |rng: &mut StdRng| format!("{}k{}", WRITTEN[rng.gen_range(0..4)], rng.gen_range(0..4));
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open_in(&dir).await);
        let other = open_in(&dir).await;
        let mut held: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
        let mut sessions: Vec<String> = Vec::new();
        let mut skipped = 0;
        for step in 0..120 {
            match rng.gen_range(0..100) {
                0..45 => {
                    let mut writes = Vec::new();
                    for _ in 0..rng.gen_range(1..5) {
                        let ops: Vec<TxnOp> = (0..rng.gen_range(1..4))
                            .map(|_| {
                                let key = key(rng);
                                let session = (!sessions.is_empty())
                                    .then(|| sessions[rng.gen_range(0..sessions.len())].clone());
                                match (rng.gen_range(0..10), session) {
                                    (6..=7, _) => TxnOp::Delete { key },
                                    (8, Some(session)) => TxnOp::Lock {
                                        key,
                                        value: b"l".to_vec(),
                                        session,
                                    },
                                    (9, Some(session)) => TxnOp::Unlock {
                                        key,
                                        value: b"u".to_vec(),
                                        session,
                                    },
                                    _ => TxnOp::Set {
                                        key,
                                        value: vec![step as u8],
                                    },
                                }
                            })
                            .collect();
                        let store = store.clone();
                        writes.push(tokio::spawn(async move { (store.txn(&ops).await, ops) }));
                    }
                    if rng.gen_bool(0.2) {
                        let (store, prefix) = (store.clone(), WRITTEN[rng.gen_range(0..4)]);
                        writes.push(tokio::spawn(async move {
                            (
                                store.delete_prefix(prefix).await.map(|()| Vec::new()),
                                Vec::new(),
                            )
                        }));
                    }
                    if rng.gen_bool(0.2) && !sessions.is_empty() {
                        let (store, id) = (
                            store.clone(),
                            sessions.remove(rng.gen_range(0..sessions.len())),
                        );
                        writes.push(tokio::spawn(async move {
                            (
                                store.destroy_session(&id).await.map(|()| Vec::new()),
                                Vec::new(),
                            )
                        }));
                    }
                    // The mirror holds a transaction's index for the prefixes it wrote under,
                    // though not always yet.
                    for write in writes {
                        let (Ok(results), ops) = write.await.unwrap() else {
                            continue;
                        };
                        let Some(index) = crate::state::OwnWrite::txn_index(&ops, &results) else {
                            continue;
                        };
                        for op in ops.iter().filter(|op| op.value().is_some()) {
                            for prefix in WATCHED {
                                if op.key().starts_with(prefix) && rng.gen_bool(0.9) {
                                    held.entry(prefix).or_default().insert(index);
                                }
                            }
                        }
                    }
                }
                45..55 => {
                    let key = key(rng);
                    let op = if rng.gen_bool(0.7) {
                        TxnOp::Set {
                            key,
                            value: b"o".to_vec(),
                        }
                    } else {
                        TxnOp::Delete { key }
                    };
                    other.txn(&[op]).await.unwrap();
                }
                55..65 => {
                    let behavior = if rng.gen_bool(0.5) {
                        SessionBehavior::Delete
                    } else {
                        SessionBehavior::Release
                    };
                    let spec = SessionSpec {
                        name: "s".into(),
                        ttl: Duration::from_secs(30),
                        lock_delay: Duration::ZERO,
                        behavior,
                    };
                    sessions.push(store.create_session(&spec).await.unwrap());
                }
                65..72 => {
                    let mut txn = WriteTxn::begin(&store.inner).await.unwrap();
                    let op = TxnOp::Set {
                        key: key(rng),
                        value: b"r".to_vec(),
                    };
                    txn.apply(&op).await.unwrap().unwrap();
                    let durable = txn.release();
                    txn.tx.0.dirty = true;
                    drop(txn);
                    assert!(
                        durable.wait(&store.inner).await.is_err(),
                        "a rolled-back write was answered"
                    );
                }
                72..80 if !sessions.is_empty() => {
                    let session = &sessions[rng.gen_range(0..sessions.len())];
                    let key = key(rng);
                    if rng.gen_bool(0.5) {
                        let _ = store.acquire(&key, b"q", session).await;
                    } else {
                        let _ = store.release(&key, session).await;
                    }
                }
                // Time for the poll to announce the other process's commits.
                80..83 => tokio::time::sleep(Duration::from_millis(150)).await,
                _ => {}
            }
            let last = meta(&store.inner.reader, "last_index").await.unwrap();
            // Some prefixes are first watched late.
            let followed: Vec<&str> = WATCHED.into_iter().filter(|_| rng.gen_bool(0.7)).collect();
            for prefix in followed {
                let mut afters: BTreeSet<u64> = (last.saturating_sub(4).max(1)..=last).collect();
                afters.extend((0..6).map(|_| rng.gen_range(1..=last)));
                for after in afters {
                    let holds: Vec<u64> = held
                        .get(prefix)
                        .map(|held| held.range(after + 1..).copied().collect())
                        .unwrap_or_default();
                    let now = store.inner.prefix_index(prefix).await.unwrap();
                    let skips = store
                        .inner
                        .recent
                        .lock()
                        .held_through(prefix, after, now, &holds)
                        > after;
                    let watched = changes_since(&store, prefix, after, &holds).await;
                    let read = read_changes(&store.inner.reader, prefix, after, &holds)
                        .await
                        .unwrap()
                        .expect("nothing is reaped in these histories");
                    let upto = |changes: &Changes| {
                        let changed = changes
                            .changed
                            .iter()
                            .map(|pair| (pair.key.clone(), pair.modify_index));
                        let deleted = changes.deleted.iter().cloned();
                        let upto = watched.index;
                        (
                            changed.filter(|c| c.1 <= upto).collect::<Vec<_>>(),
                            deleted.filter(|d| d.1 <= upto).collect::<Vec<_>>(),
                        )
                    };
                    assert_eq!(
                        upto(&watched),
                        upto(&read),
                        "seed {seed}, step {step}: {prefix} after {after}, holding {holds:?}"
                    );
                    skipped += usize::from(skips);
                }
            }
        }
        skipped
    }

    #[tokio::test]
    async fn a_watch_brings_only_what_changed_unless_tombstones_were_reaped_past_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        for i in 0..50 {
            store
                .put(&format!("k/{i:02}"), b"v", Cas::Any)
                .await
                .unwrap();
        }
        store.put("other/x", b"v", Cas::Any).await.unwrap();
        let listed = store.list("k/").await.unwrap();
        store.put("k/07", b"new", Cas::Any).await.unwrap();
        store.delete("k/08", Cas::Any).await.unwrap();
        store.put("other/y", b"v", Cas::Any).await.unwrap();
        let deleted_at = store.get("k/07").await.unwrap().unwrap().modify_index + 1;

        let changes = changes_since(&store, "k/", listed.index, &[]).await;
        let changed: Vec<&str> = changes.changed.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(changed, ["k/07"]);
        assert_eq!(changes.deleted, [("k/08".to_owned(), deleted_at)]);
        assert_eq!(changes.index, store.list("k/").await.unwrap().index);

        // Written again, the key is a change and no longer a delete.
        store.put("k/08", b"back", Cas::Any).await.unwrap();
        let changes = changes_since(&store, "k/", listed.index, &[]).await;
        let changed: Vec<&str> = changes.changed.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(changed, ["k/07", "k/08"]);
        assert_eq!(changes.deleted, []);

        // Once the delete's tombstone may be gone, only a listing can tell what changed.
        let mut writer = store.inner.writer.lock().await;
        writer
            .run(
                "UPDATE meta SET value = (SELECT value FROM meta WHERE name = 'last_index')
                 WHERE name = 'reaped_index'",
            )
            .await
            .unwrap();
        drop(writer);
        let update = store
            .watch_changes("k/", listed.index, Duration::ZERO, &Vec::new)
            .await
            .unwrap();
        assert!(matches!(update, PrefixUpdate::Whole(l) if l.pairs.len() == 50));
    }

    /// A busy prefix's index and changes are found among the newest changes of the store; a
    /// prefix behind more than `RECENT_CHANGES` newer writes and deletes elsewhere is read
    /// through its keys instead. Both ways give the same answers.
    #[tokio::test]
    async fn a_quiet_prefix_behind_many_newer_changes_elsewhere_keeps_its_index_and_changes() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("quiet/a", b"v", Cas::Any).await.unwrap();
        store.put("quiet/b", b"v", Cas::Any).await.unwrap();
        let listed = store.list("quiet/").await.unwrap().index;
        store.put("quiet/a", b"new", Cas::Any).await.unwrap();
        store.delete("quiet/b", Cas::Any).await.unwrap();
        let recent_index = store.prefix_index("quiet/").await.unwrap();
        let recent_changes = store
            .watch_changes("quiet/", listed, Duration::ZERO, &Vec::new)
            .await
            .unwrap();
        assert!(
            matches!(&recent_changes, PrefixUpdate::Since(c) if c.changed.len() == 1 && c.deleted.len() == 1)
        );

        let busy = (0..RECENT_CHANGES + 10).map(|i| format!("busy/{i:05}"));
        for keys in busy.collect::<Vec<_>>().chunks(MAX_TXN_OPS) {
            let ops = keys.iter().map(|key| TxnOp::Set {
                key: key.clone(),
                value: b"v".to_vec(),
            });
            store.txn(&ops.collect::<Vec<_>>()).await.unwrap();
        }
        let written = store.prefix_index("busy/").await.unwrap();
        store.delete_prefix("busy/").await.unwrap();
        let busy_index = store.prefix_index("busy/").await.unwrap();
        assert!(busy_index > written);

        // Read from the database, not from the indexes kept.
        let quiet_index = read_prefix_index(&store.inner.reader, "quiet/").await;
        assert_eq!(quiet_index.unwrap(), recent_index);
        let quiet_changes = store
            .watch_changes("quiet/", listed, Duration::ZERO, &Vec::new)
            .await
            .unwrap();
        assert_eq!(quiet_changes, recent_changes);
        let busy_changes = changes_since(&store, "busy/", written, &[]).await;
        assert_eq!(busy_changes.index, busy_index);
        assert_eq!(busy_changes.deleted.len() as i64, RECENT_CHANGES + 10);
    }

    fn touched(keys: &[&str], ranges: &[&str]) -> Touched {
        Touched {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            ranges: ranges.iter().map(|r| r.to_string()).collect(),
            everything: false,
        }
    }

    fn key(key: &str) -> WatchTarget {
        WatchTarget::Key(key.into())
    }

    fn prefix(prefix: &str) -> WatchTarget {
        WatchTarget::Prefix(prefix.into())
    }

    #[test]
    fn a_written_key_touches_itself_and_the_prefixes_above_it() {
        let batch = touched(&["pods/node-1/a"], &[]);
        for target in [
            key("pods/node-1/a"),
            prefix("pods/node-1/a"),
            prefix("pods/node-1/"),
            prefix("pods/"),
            prefix(""),
        ] {
            assert!(batch.touches(&target), "{target:?}");
        }
        for target in [
            key("pods/node-1/ab"),
            key("pods/node-1/"),
            prefix("pods/node-1/a/"),
            prefix("pods/node-2/"),
            prefix("rcs/"),
        ] {
            assert!(!batch.touches(&target), "{target:?}");
        }
    }

    #[test]
    fn keys_sorted_around_a_prefix_do_not_touch_it() {
        // "pods/node-10/x" is the first key at or after "pods/node-1/" but not under it.
        let batch = touched(&["a", "pods/node-0", "pods/node-10/x", "z"], &[]);
        assert!(!batch.touches(&prefix("pods/node-1/")));
        assert!(!batch.touches(&key("pods/node-1")));
        assert!(batch.touches(&prefix("pods/node-1")));
        assert!(batch.touches(&prefix("pods/node-10/")));
        assert!(batch.touches(&key("z")));
    }

    #[test]
    fn a_deleted_range_touches_what_it_covers_and_what_covers_it() {
        let batch = touched(&[], &["rcs/abc/"]);
        for target in [
            key("rcs/abc/x"),
            prefix("rcs/abc/x/"),
            prefix("rcs/abc/"),
            prefix("rcs/ab"),
            prefix(""),
        ] {
            assert!(batch.touches(&target), "{target:?}");
        }
        for target in [
            key("rcs/abc"),
            key("rcs/abcd/x"),
            prefix("rcs/abcd"),
            prefix("rcs/abd/"),
            prefix("pods/"),
        ] {
            assert!(!batch.touches(&target), "{target:?}");
        }
        let all = touched(&[], &[""]);
        assert!(all.touches(&key("x")));
        assert!(all.touches(&prefix("y/")));
    }

    #[test]
    fn unknown_changes_touch_every_target_and_no_change_none() {
        let unknown = Touched {
            everything: true,
            ..Touched::default()
        };
        let nothing = Touched::default();
        assert!(nothing.is_empty() && !unknown.is_empty());
        for target in [key("a"), prefix("a/"), prefix("")] {
            assert!(unknown.touches(&target), "{target:?}");
            assert!(!nothing.touches(&target), "{target:?}");
        }
    }

    #[test]
    fn a_batch_touches_what_any_of_its_writes_touched() {
        let mut batch = touched(&["a/1"], &[]);
        batch.merge(touched(&["b/1"], &["c/"]));
        assert_eq!(batch, touched(&["a/1", "b/1"], &["c/"]));
        batch.merge(Touched {
            everything: true,
            ..Touched::default()
        });
        assert!(batch.touches(&prefix("d/")));
    }

    fn announce(batches: &broadcast::Sender<Arc<Touched>>, keys: &[&str], times: usize) {
        for _ in 0..times {
            batches.send(Arc::new(touched(keys, &[]))).unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_watch_skips_the_batches_beside_it() {
        let batches = broadcast::Sender::new(BATCH_BACKLOG);
        let mut watching = batches.subscribe();
        let target = prefix("a/");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        announce(&batches, &["b/1", "ab"], 3);
        batches.send(Arc::new(touched(&[], &["a0/"]))).unwrap();
        assert!(!touched_before(&mut watching, &target, deadline).await);
        announce(&batches, &["b/1"], 3);
        announce(&batches, &["a/1"], 1);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        assert!(touched_before(&mut watching, &target, deadline).await);
        assert!(watching.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_fell_behind_probes() {
        let batches = broadcast::Sender::new(BATCH_BACKLOG);
        let mut watching = batches.subscribe();
        announce(&batches, &["b/1"], BATCH_BACKLOG + 1);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        assert!(touched_before(&mut watching, &prefix("a/"), deadline).await);
    }

    /// Writes whose callers give up while another process holds the file's write lock are
    /// withdrawn, and never land once it is let go, whether queued for the writer (a put)
    /// or waiting on a task of their own (a session); a write the writer took stays taken.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_given_up_before_the_writer_took_it_is_never_applied() {
        use crate::kv::sent::{scope, Sent};
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        let done = Arc::new(Sent::default());
        scope(done.clone(), store.put("before", b"v", Cas::Any))
            .await
            .unwrap();
        assert!(!done.all_withdrawn(), "a write the writer took");

        let mut other = connect_beside(&dir).await;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut other)
            .await
            .unwrap();
        let cut = Duration::from_millis(200);
        let sent = Arc::new(Sent::default());
        let put = tokio::time::timeout(cut, store.put("k", b"v", Cas::Any));
        assert!(scope(sent.clone(), put).await.is_err());
        let spec = SessionSpec::deleting("cut", Duration::from_secs(60));
        let created = tokio::time::timeout(cut, store.create_session(&spec));
        assert!(scope(sent.clone(), created).await.is_err());
        assert!(sent.all_withdrawn());

        sqlx::query("COMMIT").execute(&mut other).await.unwrap();
        store.put("after", b"v", Cas::Any).await.unwrap();
        assert_eq!(store.get("k").await.unwrap(), None);
        let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions")
            .fetch_one(&mut other)
            .await
            .unwrap();
        assert_eq!(sessions, 0);
    }

    async fn open_in(dir: &tempfile::TempDir) -> SqliteStore {
        let path = dir.path().join("kv.db").display().to_string();
        SqliteStore::open(&path).await.unwrap()
    }

    /// A path SQLite cannot open is refused at once with the reason, not only SQLite's
    /// "unable to open database file", and nothing is created.
    #[tokio::test]
    async fn a_path_that_cannot_hold_the_database_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().display().to_string();
        let Err(refused) = SqliteStore::open(&folder).await else {
            panic!("a directory was opened as the database");
        };
        assert!(refused.to_string().contains("is a directory"), "{refused}");
        assert!(refused.to_string().contains(&folder), "{refused}");

        let missing = dir.path().join("missing").join("kv.db");
        let missing = missing.display().to_string();
        let Err(refused) = SqliteStore::open(&missing).await else {
            panic!("a database was opened in a directory that does not exist");
        };
        let reason = refused.to_string();
        assert!(reason.contains("directory does not exist"), "{reason}");
        assert!(!dir.path().join("missing").exists());
    }

    /// A file SQLite can open but whose log it cannot create beside it (here a directory
    /// is in the way; in a directory this process may not write, SQLite says "attempt to
    /// write a readonly database") is refused naming the file and the log.
    #[tokio::test]
    async fn a_database_whose_log_cannot_be_created_is_refused_naming_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.db").display().to_string();
        std::fs::write(&path, b"").unwrap();
        std::fs::create_dir(format!("{path}-wal")).unwrap();
        let Err(refused) = SqliteStore::open(&path).await else {
            panic!("a database was opened without its log");
        };
        let reason = refused.to_string();
        assert!(reason.contains(&format!("{path:?}")), "{reason}");
        assert!(reason.contains(&format!("{path}-wal")), "{reason}");
    }

    /// The rows' only key index is not unique by key (`migrations/0006_one_key_index.sql`):
    /// the writer keeps one row per key, whether a key is written again in one batch, in
    /// later ones, by concurrent writers, with a lock, or after a delete.
    #[tokio::test]
    async fn a_key_written_again_keeps_one_row() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        let writes = (0..200).map(|i| {
            let store = &store;
            async move {
                let key = format!("k/{}", i % 7);
                store.put(&key, format!("{i}").as_bytes(), Cas::Any).await
            }
        });
        for written in futures::future::join_all(writes).await {
            written.unwrap();
        }
        for round in 0..3 {
            for i in 0..7 {
                store
                    .put(&format!("k/{i}"), b"again", Cas::Any)
                    .await
                    .unwrap();
            }
            store.delete("k/3", Cas::Any).await.unwrap();
            store
                .put("k/3", format!("{round}").as_bytes(), Cas::Index(0))
                .await
                .unwrap();
        }
        let spec = SessionSpec {
            behavior: SessionBehavior::Release,
            ..SessionSpec::deleting("test", Duration::from_secs(30))
        };
        let session = store.create_session(&spec).await.unwrap();
        assert!(store.acquire("k/4", b"held", &session).await.unwrap());
        store.destroy_session(&session).await.unwrap();

        let duplicated: Vec<(Vec<u8>, i64)> =
            sqlx::query_as("SELECT key, count(*) FROM kv GROUP BY key HAVING count(*) > 1")
                .fetch_all(&store.inner.reader)
                .await
                .unwrap();
        assert_eq!(duplicated, vec![]);
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM kv")
            .fetch_one(&store.inner.reader)
            .await
            .unwrap();
        assert_eq!(rows, 7);
        assert_eq!(store.get("k/3").await.unwrap().unwrap().value[..], b"2"[..]);
        assert_eq!(
            store.get("k/4").await.unwrap().unwrap().value[..],
            b"held"[..]
        );
    }

    /// A database file from before the one key index keeps every row, with its indexes,
    /// once opened by this version.
    #[tokio::test]
    async fn a_database_from_before_the_one_key_index_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.db").display().to_string();
        let earlier = tempfile::tempdir().unwrap();
        for migration in std::fs::read_dir("migrations").unwrap() {
            let migration = migration.unwrap().path();
            let name = migration.file_name().unwrap().to_str().unwrap().to_owned();
            if name.as_str() < "0006" {
                std::fs::copy(&migration, earlier.path().join(name)).unwrap();
            }
        }
        {
            let options = SqliteConnectOptions::from_str(&format!("sqlite://{path}"))
                .unwrap()
                .create_if_missing(true);
            let db = SqlitePool::connect_with(options).await.unwrap();
            let earlier = sqlx::migrate::Migrator::new(earlier.path()).await.unwrap();
            earlier.run(&db).await.unwrap();
            for (key, create, modify) in [("a/1", 2, 5), ("a/2", 3, 3), ("b/1", 4, 4)] {
                sqlx::query(
                    "INSERT INTO kv (key, value, create_index, modify_index) VALUES (?1, ?1, ?2, ?3)",
                )
                .bind(key.as_bytes())
                .bind(create)
                .bind(modify)
                .execute(&db)
                .await
                .unwrap();
            }
            sqlx::query("UPDATE meta SET value = 5 WHERE name = 'last_index'")
                .execute(&db)
                .await
                .unwrap();
            db.close().await;
        }

        let store = SqliteStore::open(&path).await.unwrap();
        let listing = store.list("a/").await.unwrap();
        let rows: Vec<_> = listing
            .pairs
            .iter()
            .map(|p| (p.key.as_str(), p.create_index, p.modify_index))
            .collect();
        assert_eq!(rows, vec![("a/1", 2, 5), ("a/2", 3, 3)]);
        assert_eq!(listing.index, 5);
        assert_eq!(
            store.get("b/1").await.unwrap().unwrap().value[..],
            b"b/1"[..]
        );
        store.put("a/2", b"new", Cas::Index(3)).await.unwrap();
        let a2 = store.get("a/2").await.unwrap().unwrap();
        assert_eq!((a2.create_index, a2.modify_index), (3, 6));
    }

    /// A file a newer server migrated further is refused, with the migration named, and
    /// left as it was.
    #[tokio::test]
    async fn a_database_of_a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("k", b"v", Cas::Any).await.unwrap();
        store.shut_down().await;
        drop(store);
        let path = dir.path().join("kv.db").display().to_string();
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{path}")).unwrap();
        let db = SqlitePool::connect_with(options.clone()).await.unwrap();
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (9999, 'a newer server', 1, x'00', 0)",
        )
        .execute(&db)
        .await
        .unwrap();
        db.close().await;

        let Err(refused) = SqliteStore::open(&path).await else {
            panic!("a newer schema was opened");
        };
        assert!(refused.to_string().contains("9999"), "{refused}");
        let db = SqlitePool::connect_with(options.read_only(true))
            .await
            .unwrap();
        let value: Vec<u8> = sqlx::query_scalar("SELECT value FROM kv WHERE key = x'6b'")
            .fetch_one(&db)
            .await
            .unwrap();
        assert_eq!(value, b"v");
    }

    /// After a shutdown, the database file alone holds every write: a copy of it without
    /// the log reads them all.
    #[tokio::test]
    async fn a_shutdown_leaves_every_write_in_the_database_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        for i in 0..100 {
            store.put(&format!("k/{i}"), b"v", Cas::Any).await.unwrap();
        }
        let log = dir.path().join("kv.db-wal");
        assert!(std::fs::metadata(&log).unwrap().len() > 0);

        store.shut_down().await;
        assert_eq!(std::fs::metadata(&log).map_or(0, |m| m.len()), 0);
        let copy = tempfile::tempdir().unwrap();
        std::fs::copy(dir.path().join("kv.db"), copy.path().join("kv.db")).unwrap();
        let copied = open_in(&copy).await;
        assert_eq!(copied.list("k/").await.unwrap().pairs.len(), 100);
        // The store goes on after a checkpoint.
        store.put("k/100", b"v", Cas::Any).await.unwrap();
        assert!(store.get("k/100").await.unwrap().is_some());
    }

    /// Another process reading the file holds the checkpoint back: the shutdown waits for it
    /// a second at most and leaves the log, which the next start replays.
    #[tokio::test]
    async fn a_shutdown_beside_a_reader_of_the_file_is_prompt() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("k/0", b"v", Cas::Any).await.unwrap();
        let mut reader = connect_beside(&dir).await;
        sqlx::query("BEGIN").execute(&mut reader).await.unwrap();
        sqlx::query("SELECT count(*) FROM kv")
            .execute(&mut reader)
            .await
            .unwrap();
        store.put("k/1", b"v", Cas::Any).await.unwrap();

        let started = std::time::Instant::now();
        store.shut_down().await;
        assert!(started.elapsed() < Duration::from_secs(5));
        let log = dir.path().join("kv.db-wal");
        assert!(std::fs::metadata(log).unwrap().len() > 0);
        drop(reader);
        drop(store);
        assert_eq!(open_in(&dir).await.list("k/").await.unwrap().pairs.len(), 2);
    }

    /// While another process holds the write lock past the busy timeout, writes fail and the
    /// store is not ready, though reads answer; once the lock is let go, a ping takes it
    /// and the store is ready again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_lock_held_by_another_process_keeps_the_store_unready_until_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("k/0", b"v", Cas::Any).await.unwrap();
        store.ping().await.unwrap();
        let mut other = connect_beside(&dir).await;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut other)
            .await
            .unwrap();

        let refused = store.put("k/1", b"v", Cas::Any).await;
        assert!(
            matches!(refused, Err(StoreError::Unavailable(_))),
            "{refused:?}"
        );
        assert!(
            store.get("k/0").await.unwrap().is_some(),
            "reads still answer"
        );
        let pinged = tokio::time::timeout(Duration::from_secs(1), store.ping()).await;
        assert!(!matches!(pinged, Ok(Ok(()))), "ready while locked out");
        let again = store.ping().await;
        assert!(
            matches!(&again, Err(StoreError::Unavailable(why)) if why.contains("write lock")),
            "a ping beside one trying the lock answers at once: {again:?}"
        );

        sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
        until_ready(&store)
            .await
            .expect("ready once the lock is let go");
        store.put("k/1", b"v", Cas::Any).await.unwrap();
    }

    /// A writer stuck in a statement (a disk that stops answering; here the writer held)
    /// commits nothing, and every write waits for it: the store is not ready while it is
    /// stuck, though reads answer, and ready again once it moves.
    #[tokio::test]
    async fn a_stuck_writer_keeps_the_store_unready_until_it_moves() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("k/0", b"v", Cas::Any).await.unwrap();
        store.ping().await.unwrap();

        let stuck = store.inner.writer.clone().lock_owned().await;
        assert!(store.get("k/0").await.unwrap().is_some(), "reads answer");
        let pinged = tokio::time::timeout(Duration::from_secs(1), store.ping()).await;
        assert!(
            !matches!(pinged, Ok(Ok(()))),
            "ready while the writer is stuck"
        );

        drop(stuck);
        store.ping().await.unwrap();
        store.put("k/1", b"v", Cas::Any).await.unwrap();
    }

    /// A writer whose tasks have stopped (here stopped as they stop with the store; a panic
    /// ends them too) makes the store unready, naming the writer, and every write after it
    /// is refused at once, never applied. Before, the store answered ready and every write
    /// waited for a writer that would never take it.
    #[tokio::test]
    async fn a_stopped_writer_makes_the_store_unready_and_refuses_every_write_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("k/0", b"v", Cas::Any).await.unwrap();
        store.ping().await.unwrap();

        fn for_want_of_the_writer<T: std::fmt::Debug>(answer: StoreResult<T>) {
            assert!(
                matches!(&answer, Err(StoreError::Unavailable(why)) if why.contains("writer")),
                "{answer:?}"
            );
        }

        store.stop_writer().await;
        for_want_of_the_writer(store.ping().await);
        // A transaction of ops (queued for the writer) and a write of its own (a session).
        for_want_of_the_writer(store.put("k/1", b"v", Cas::Any).await);
        let spec = SessionSpec::deleting("test", Duration::from_secs(30));
        for_want_of_the_writer(store.create_session(&spec).await);
        assert!(
            store.get("k/0").await.unwrap().is_some(),
            "reads still answer"
        );
        assert!(store.get("k/1").await.unwrap().is_none());
    }

    /// A transaction queued for the writer but not yet taken into a batch when it stops never
    /// reached SQLite: its caller is answered that the writer stopped (503), and the queue
    /// is left empty rather than holding it, and its answer, for as long as the store lives.
    #[tokio::test]
    async fn a_transaction_queued_when_the_writer_stops_is_answered_and_leaves_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        // Queued as `run_txn` queues it, the writer not yet woken to take it.
        let (answer, mut answered) = oneshot::channel();
        store.inner.queued.lock().unwrap().push(Queued {
            ops: vec![set("k/0")],
            answer,
            claim: Claim::sent(),
        });
        store.stop_writer().await;
        assert_eq!(store.inner.queued.lock().unwrap().len(), 0, "left queued");
        let answer = answered.try_recv().map(|(results, _)| results);
        assert!(
            matches!(&answer, Ok(Err(StoreError::Unavailable(why))) if why.contains("writer")),
            "{answer:?}"
        );
        assert!(store.get("k/0").await.unwrap().is_none());
    }

    /// A write already in the batch when the writer stops is answered at once that its
    /// outcome is unknown (the writer may have died committing it), not left waiting for a
    /// commit that never comes; a shutdown then rolls the batch back.
    #[tokio::test]
    async fn a_write_in_the_batch_when_the_writer_stops_is_answered_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        let inner = store.inner.clone();
        let mut txn = WriteTxn::begin(&inner).await.unwrap();
        store.stop_writer().await;
        txn.store("k/0", b"v", None).await.unwrap();
        // A guard against the hang this test is about; the answer comes at once.
        let answered = tokio::time::timeout(Duration::from_secs(30), txn.commit(&inner)).await;
        assert!(
            matches!(&answered, Ok(Err(StoreError::OutcomeUnknown(why))) if why.contains("writer")),
            "{answered:?}"
        );
        store.shut_down().await;
        assert!(store.get("k/0").await.unwrap().is_none());
    }

    /// A write that fails for lack of space (`SQLITE_FULL`, as on a full disk; here the
    /// writer's database is capped at the pages it has) makes the store unready, saying so,
    /// until a write commits again. Before, the readiness probe read the database, which a
    /// full disk does not stop, and answered ready while every write failed.
    #[tokio::test]
    async fn a_write_failing_for_lack_of_space_keeps_the_store_unready_until_one_commits() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("k/0", b"v", Cas::Any).await.unwrap();
        store.ping().await.unwrap();
        let cap = |pages: u64| {
            let inner = store.inner.clone();
            async move {
                let mut writer = inner.writer.lock().await;
                let pragma = format!("PRAGMA max_page_count = {pages}");
                writer.run(&pragma).await.unwrap();
            }
        };
        // Capped at the pages it has: SQLite sets no lower cap than that.
        cap(1).await;

        let big = vec![b'x'; 256 << 10];
        let refused = store.put("k/big", &big, Cas::Any).await;
        assert!(
            matches!(&refused, Err(StoreError::Unavailable(why)) if why.contains("full")),
            "{refused:?}"
        );
        assert!(
            store.get("k/0").await.unwrap().is_some(),
            "reads still answer"
        );
        let pinged = store.ping().await;
        assert!(
            matches!(&pinged, Err(StoreError::Unavailable(why)) if why.contains("SQLITE_FULL")),
            "ready while writes fail for lack of space: {pinged:?}"
        );

        cap(u64::from(u32::MAX) - 1).await;
        store.put("k/big", &big, Cas::Any).await.unwrap();
        store.ping().await.unwrap();
    }

    /// A write that changes nothing (the tombstone sweep with nothing to reap, deleting an
    /// empty prefix, ending a session that does not exist) commits without writing a page,
    /// as it would on a full disk, so it leaves the store unready. Before, its commit
    /// cleared the mark, and the sweep every ten minutes made the store ready while every
    /// write still failed for lack of space.
    #[tokio::test]
    async fn a_write_that_changes_nothing_leaves_a_full_disk_unready() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("k/0", b"v", Cas::Any).await.unwrap();
        {
            let mut writer = store.inner.writer.lock().await;
            writer.run("PRAGMA max_page_count = 1").await.unwrap();
        }
        let big = vec![b'x'; 256 << 10];
        assert!(store.put("k/big", &big, Cas::Any).await.is_err());

        reap_tombstones(&store.inner).await.unwrap();
        store.delete_prefix("nothing/").await.unwrap();
        store.destroy_session("no-such-session").await.unwrap();
        let pinged = store.ping().await;
        assert!(
            matches!(&pinged, Err(StoreError::Unavailable(why)) if why.contains("SQLITE_FULL")),
            "ready while writes fail for lack of space: {pinged:?}"
        );
    }

    /// Makes the writer's connection query-only, as a file system turned read-only would,
    /// or lets it write again.
    async fn query_only(store: &SqliteStore, on: bool) {
        let mut writer = store.inner.writer.lock().await;
        writer
            .run(&format!("PRAGMA query_only = {on}"))
            .await
            .unwrap();
    }

    /// Pings until the store is ready; gives up past twice the busy timeout, a guard
    /// against a store that never is.
    async fn until_ready(store: &SqliteStore) -> Result<(), tokio::time::error::Elapsed> {
        let ready = async {
            while store.ping().await.is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(BUSY_TIMEOUT * 2, ready).await
    }

    /// A database that takes no writes (its file system turned read-only; here the
    /// writer's connection made query-only) makes the store unready, saying so, until a
    /// write commits again: reads alone, which still answer, would say it is ready.
    #[tokio::test]
    async fn a_database_that_takes_no_writes_keeps_the_store_unready_until_one_commits() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("k/0", b"v", Cas::Any).await.unwrap();
        let spec = SessionSpec::deleting("test", Duration::from_secs(30));
        let session = store.create_session(&spec).await.unwrap();
        query_only(&store, true).await;

        let refused = store.put("k/1", b"v", Cas::Any).await;
        assert!(
            matches!(refused, Err(StoreError::Unavailable(_))),
            "{refused:?}"
        );
        let pinged = store.ping().await;
        assert!(
            matches!(&pinged, Err(StoreError::Unavailable(why)) if why.contains("SQLITE_READONLY")),
            "ready while no write lands: {pinged:?}"
        );

        query_only(&store, false).await;
        // A session's renewal, as a leader makes every few seconds, is a write like any.
        store.renew_session(&session).await.unwrap();
        store.ping().await.unwrap();
    }

    /// A store whose disk takes writes again is ready again without a client's write: the
    /// readiness probe tries one of its own. A server nobody writes to (run with
    /// `--no-farms`, or one whose clients a load balancer sent elsewhere because it was not
    /// ready) would otherwise stay unready for good.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_whose_disk_takes_writes_again_is_ready_without_a_clients_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("k/0", b"v", Cas::Any).await.unwrap();
        query_only(&store, true).await;
        assert!(store.put("k/1", b"v", Cas::Any).await.is_err());
        for _ in 0..2 {
            let pinged = store.ping().await;
            assert!(
                matches!(&pinged, Err(StoreError::Unavailable(why)) if why.contains("SQLITE_READONLY")),
                "ready while no write lands: {pinged:?}"
            );
        }

        query_only(&store, false).await;
        until_ready(&store)
            .await
            .expect("ready once writes land, with no write but the probe's");
        assert!(store.get("k/1").await.unwrap().is_none());
        assert_eq!(&store.get("k/0").await.unwrap().unwrap().value[..], b"v");
    }

    /// The readiness probe's write reaches the disk: SQLite leaves a page whose bytes a
    /// statement leaves as they were clean, so a write that changes no byte commits without
    /// writing anything, and would succeed on a full disk or a read-only file system,
    /// making the store ready while every client's write still fails.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_readiness_probes_write_reaches_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("k/0", b"v", Cas::Any).await.unwrap();
        let log = dir.path().join("kv.db-wal");
        {
            let mut writer = store.inner.writer.lock().await;
            writer.run("PRAGMA wal_checkpoint(TRUNCATE)").await.unwrap();
        }
        assert_eq!(
            std::fs::metadata(&log).unwrap().len(),
            0,
            "the log is not empty"
        );
        // As a write that found the disk full leaves it.
        store.inner.cannot_write.store(13, Ordering::Release);

        until_ready(&store)
            .await
            .expect("ready once the probe's write commits");
        assert!(
            std::fs::metadata(&log).unwrap().len() > 0,
            "the probe's write committed without writing anything"
        );
        assert_eq!(meta(&store.inner.reader, "reaped_index").await.unwrap(), 0);
    }

    /// A write that fails after it began changing the database takes its batch down: none
    /// of it is committed, its index is not used up, and the store goes on.
    #[tokio::test]
    async fn a_write_failing_partway_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        store.put("x", b"1", Cas::Any).await.unwrap();
        let before = store.get("x").await.unwrap().unwrap();
        let mut other = connect_beside(&dir).await;
        sqlx::query(
            "CREATE TRIGGER refuse BEFORE DELETE ON kv WHEN OLD.key = X'78'
             BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
        .execute(&mut other)
        .await
        .unwrap();

        // The set is written first, then the delete fails.
        let ops = [
            TxnOp::Set {
                key: "a".into(),
                value: b"1".to_vec(),
            },
            TxnOp::Delete { key: "x".into() },
        ];
        let failed = store.txn(&ops).await;
        assert!(
            matches!(failed, Err(StoreError::Unavailable(_))),
            "{failed:?}"
        );

        store.put("b", b"1", Cas::Any).await.unwrap();
        assert_eq!(store.get("a").await.unwrap(), None);
        assert_eq!(store.get("x").await.unwrap(), Some(before.clone()));
        let b = store.get("b").await.unwrap().unwrap();
        assert_eq!(b.modify_index, before.modify_index + 1);
    }

    /// A statement that fails may have rolled the batch back inside SQLite, after which the
    /// batch's later statements would each commit on their own: so a failed read rolls the
    /// whole batch back, the writes released into it before included, and the store goes on.
    /// The read made to fail here is of the lock-delays, renamed away behind the store.
    #[tokio::test]
    async fn a_read_failing_within_a_batch_fails_the_writes_already_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        let spec = SessionSpec::deleting("test", Duration::from_secs(30));
        let session = store.create_session(&spec).await.unwrap();
        run_beside(&dir, "ALTER TABLE lock_delays RENAME TO lock_delays_away").await;

        let mut txn = WriteTxn::begin(&store.inner).await.unwrap();
        txn.apply(&set("k/released")).await.unwrap().unwrap();
        let durable = txn.release();
        let lock = TxnOp::Lock {
            key: "k/locked".into(),
            value: b"v".to_vec(),
            session,
        };
        let failed = txn.apply(&lock).await;
        assert!(
            matches!(failed, Err(StoreError::Unavailable(_))),
            "{failed:?}"
        );
        txn.discard();
        drop(txn);
        let answered = durable.wait(&store.inner).await;
        assert!(
            matches!(answered, Err(StoreError::Unavailable(_))),
            "{answered:?}"
        );
        assert_eq!(store.get("k/released").await.unwrap(), None);

        run_beside(&dir, "ALTER TABLE lock_delays_away RENAME TO lock_delays").await;
        store.put("k/after", b"v", Cas::Any).await.unwrap();
        assert!(store.get("k/after").await.unwrap().is_some());
    }

    /// Writes queued behind one another share a batch: each sees the rows the ones before it
    /// changed, though the database holds none of them until the batch commits, and none that
    /// a write failing its checks changed; a key created and deleted within the batch leaves
    /// a tombstone like any other.
    #[tokio::test]
    async fn writes_of_one_batch_see_each_others_rows_and_commit_together() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open_in(&dir).await);
        store.put("a/y", b"1", Cas::Any).await.unwrap();
        let before = store.get("a/y").await.unwrap().unwrap().modify_index;
        let mut batches = store.inner.batches.subscribe();

        let held = store.inner.writer.clone().lock_owned().await;
        let set = |key: &str, value: &str| TxnOp::Set {
            key: key.into(),
            value: value.into(),
        };
        let cas = |key: &str, value: &str, index| TxnOp::Cas {
            key: key.into(),
            value: value.into(),
            index,
        };
        let delete = |key: &str| TxnOp::Delete { key: key.into() };
        let writes = vec![
            (vec![cas("a/x", "1", 0)], true),
            // Fails its check: its set is seen by no later write, and takes no index.
            (vec![set("a/x", "lost"), cas("a/w", "1", 7)], false),
            (vec![cas("a/x", "2", before + 1)], true),
            (vec![delete("a/y")], true),
            (vec![set("a/z", "1")], true),
            (vec![delete("a/z")], true),
        ];
        let mut tasks = Vec::new();
        for (ops, passes) in writes {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                assert_eq!(store.txn(&ops).await.is_ok(), passes, "{ops:?}");
            }));
        }
        // Every write queues for the writer, in order, before it is let go.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }

        let x = store.get("a/x").await.unwrap().unwrap();
        assert_eq!(&x.value[..], b"2");
        assert_eq!((x.create_index, x.modify_index), (before + 1, before + 2));
        let changes = changes_since(&store, "a/", before, &[]).await;
        assert_eq!(changes.changed, vec![x]);
        let deleted = [
            ("a/y".to_owned(), before + 3),
            ("a/z".to_owned(), before + 5),
        ];
        assert_eq!(changes.deleted, deleted);
        assert_eq!(
            *batches.try_recv().unwrap(),
            touched(&["a/x", "a/y", "a/z"], &[])
        );
        assert!(batches.is_empty(), "one batch");
    }

    #[tokio::test]
    async fn each_commit_announces_the_keys_its_writes_touched() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        let mut batches = store.inner.batches.subscribe();
        let mut next = || {
            let batch = batches.try_recv().unwrap();
            assert!(batches.is_empty(), "one batch per sequential write");
            batch
        };

        store.put("b/x", b"1", Cas::Any).await.unwrap();
        let batch = next();
        assert_eq!(*batch, touched(&["b/x"], &[]));
        assert!(!batch.touches(&prefix("a/")));

        // A write rolled back by a failed check announces nothing, nor does deleting an
        // absent key.
        let ops = [
            TxnOp::Set {
                key: "a/x".into(),
                value: b"1".to_vec(),
            },
            TxnOp::CheckNotExists { key: "b/x".into() },
        ];
        assert!(store.txn(&ops).await.is_err());
        store.delete("a/absent", Cas::Any).await.unwrap();
        store.delete("b/x", Cas::Any).await.unwrap();
        assert_eq!(*next(), touched(&["b/x"], &[]));

        store.put("b/y", b"1", Cas::Any).await.unwrap();
        next();
        store.delete_prefix("b/").await.unwrap();
        assert_eq!(*next(), touched(&[], &["b/"]));
    }

    #[tokio::test]
    async fn an_ended_session_announces_the_keys_it_held() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir).await;
        let mut batches = store.inner.batches.subscribe();
        for (behavior, key) in [
            (SessionBehavior::Delete, "a/lock"),
            (SessionBehavior::Release, "b/lock"),
        ] {
            let session = store
                .create_session(&SessionSpec {
                    name: "s".into(),
                    ttl: Duration::from_secs(10),
                    lock_delay: Duration::ZERO,
                    behavior,
                })
                .await
                .unwrap();
            assert!(store.acquire(key, b"held", &session).await.unwrap());
            assert_eq!(*batches.try_recv().unwrap(), touched(&[key], &[]));
            store.destroy_session(&session).await.unwrap();
            assert_eq!(*batches.try_recv().unwrap(), touched(&[key], &[]));
            assert!(batches.is_empty());
        }
    }

    /// A connection of its own to the store's file in `dir`, as a tool beside the store opens.
    async fn connect_beside(dir: &tempfile::TempDir) -> SqliteConnection {
        use sqlx::Connection;
        let path = dir.path().join("kv.db").display().to_string();
        SqliteConnection::connect(&format!("sqlite://{path}"))
            .await
            .unwrap()
    }

    /// Runs `sql` on the store's file in `dir` through a connection of its own, as a tool
    /// beside the store would.
    async fn run_beside(dir: &tempfile::TempDir, sql: &str) {
        let mut other = connect_beside(dir).await;
        sqlx::query(sql).execute(&mut other).await.unwrap();
    }

    /// The next announcement of a batch that touched `key`, or of unknown changes.
    async fn announcement_of(
        batches: &mut broadcast::Receiver<Arc<Touched>>,
        key: &str,
    ) -> Arc<Touched> {
        let next = async {
            loop {
                let batch = batches.recv().await.unwrap();
                if batch.everything || batch.keys.contains(key) {
                    return batch;
                }
            }
        };
        let announced = tokio::time::timeout(Duration::from_secs(10), next).await;
        announced.expect("the change announced")
    }

    /// A prefix's index, once read, is kept until a batch that may have moved it is
    /// announced: a write under the prefix, a deleted range over it, another process's
    /// commit under it; writes elsewhere, another process's too, leave it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_prefix_index_is_forgotten_by_any_change_that_may_have_moved_it() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = (open_in(&dir).await, open_in(&dir).await);
        let kept = |store: &SqliteStore| store.inner.known_prefix_indexes().get("a/").copied();
        ours.put("a/x", b"1", Cas::Any).await.unwrap();
        let written = ours.prefix_index("a/").await.unwrap();
        assert_eq!(kept(&ours), Some(written));
        ours.put("b/x", b"1", Cas::Any).await.unwrap();
        assert_eq!(kept(&ours), Some(written));
        assert_eq!(ours.prefix_index("a/").await.unwrap(), written);

        ours.put("a/y", b"1", Cas::Any).await.unwrap();
        assert_eq!(kept(&ours), None);
        let rewritten = ours.prefix_index("a/").await.unwrap();
        assert!(rewritten > written);
        ours.delete_prefix("").await.unwrap();
        let deleted = ours.prefix_index("a/").await.unwrap();
        assert!(deleted > rewritten);

        let mut batches = ours.inner.batches.subscribe();
        theirs.put("b/y", b"1", Cas::Any).await.unwrap();
        announcement_of(&mut batches, "b/y").await;
        assert_eq!(kept(&ours), Some(deleted));

        // Asked for right after their commit, before our poll may have announced it, the
        // index holds it.
        theirs.put("a/z", b"1", Cas::Any).await.unwrap();
        let theirs_index = theirs.prefix_index("a/").await.unwrap();
        assert_eq!(ours.prefix_index("a/").await.unwrap(), theirs_index);
    }

    /// A prefix's index through an index up to which every commit has been announced is the
    /// one kept, read from memory even while every reader is busy; through another
    /// process's commit not yet announced, it holds that commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prefix_index_through_announced_changes_is_answered_from_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = (open_in(&dir).await, open_in(&dir).await);
        ours.put("a/x", b"1", Cas::Any).await.unwrap();
        let kept = ours.prefix_index("a/").await.unwrap();
        ours.put("b/x", b"1", Cas::Any).await.unwrap();
        let elsewhere = ours.prefix_index("b/").await.unwrap();
        assert!(elsewhere > kept);

        let mut readers = Vec::new();
        for _ in 0..ours.inner.reader.options().get_max_connections() {
            readers.push(ours.inner.reader.acquire().await.unwrap());
        }
        let through = ours.prefix_index_through("a/", elsewhere);
        let through = tokio::time::timeout(Duration::from_secs(10), through).await;
        assert_eq!(through.expect("answered without a reader").unwrap(), kept);
        drop(readers);

        theirs.put("a/z", b"1", Cas::Any).await.unwrap();
        let theirs_index = theirs.prefix_index("a/").await.unwrap();
        let through = ours.prefix_index_through("a/", theirs_index).await;
        assert_eq!(through.unwrap(), theirs_index);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_processs_commits_announce_the_keys_they_changed() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = (open_in(&dir).await, open_in(&dir).await);
        let mut batches = ours.inner.batches.subscribe();
        theirs.put("a/x", b"1", Cas::Any).await.unwrap();
        assert_eq!(*batches.recv().await.unwrap(), touched(&["a/x"], &[]));
        theirs.delete("a/x", Cas::Any).await.unwrap();
        assert_eq!(*batches.recv().await.unwrap(), touched(&["a/x"], &[]));

        // Their commit and then ours, before our poll may have noticed theirs: it is
        // announced by the time ours is, by the poll or with ours.
        theirs.put("a/y", b"1", Cas::Any).await.unwrap();
        ours.put("b/z", b"1", Cas::Any).await.unwrap();
        let mut announced = Vec::new();
        while !announced
            .iter()
            .any(|batch: &Touched| batch.keys.contains("b/z"))
        {
            announced.push(Touched::clone(&batches.try_recv().unwrap()));
        }
        let theirs_then_ours = [touched(&["a/y"], &[]), touched(&["b/z"], &[])];
        assert!(announced == theirs_then_ours || announced == [touched(&["a/y", "b/z"], &[])]);
    }

    /// Another process's commit wakes a watch while this process's writer waits for the
    /// file (here held, as while its `BEGIN IMMEDIATE` waits for the other's write lock):
    /// the watch does not wait on the writer to learn of it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_processs_commit_wakes_a_watch_while_the_writer_waits() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = (Arc::new(open_in(&dir).await), open_in(&dir).await);
        let waiting = ours.inner.writer.clone().lock_owned().await;
        let watch = watch_k(&ours).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        theirs.put("k/a", b"1", Cas::Any).await.unwrap();

        assert_woken_by_their_key(watch, waiting).await;
    }

    /// A watch of `k/` on `ours` from its index now, for a minute, on a task of its own.
    async fn watch_k(ours: &Arc<SqliteStore>) -> tokio::task::JoinHandle<StoreResult<Listing>> {
        let index = ours.list("k/").await.unwrap().index;
        let ours = ours.clone();
        tokio::spawn(async move {
            let target = WatchTarget::Prefix("k/".into());
            ours.watch(&target, index, Duration::from_secs(60)).await
        })
    }

    /// Checks that `watch` is woken within 5 s, listing the one key another process wrote,
    /// while `waiting` holds the writer; lets the writer go either way.
    async fn assert_woken_by_their_key(
        watch: tokio::task::JoinHandle<StoreResult<Listing>>,
        waiting: tokio::sync::OwnedMutexGuard<Writer>,
    ) {
        let woken = tokio::time::timeout(Duration::from_secs(5), watch).await;
        drop(waiting);
        let listing = woken
            .expect("the watch was not woken by the other process's commit")
            .unwrap()
            .unwrap();
        assert_eq!(listing.pairs.len(), 1, "{listing:?}");
    }

    /// Nor does it wait on a sweep that waits for the writer: an expired session to end
    /// (here one a server that crashed left in the file).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_processs_commit_wakes_a_watch_while_a_sweep_waits_for_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let ours = Arc::new(open_in(&dir).await);
        let waiting = ours.inner.writer.clone().lock_owned().await;
        run_beside(
            &dir,
            "INSERT INTO sessions (id, name, ttl_ms, lock_delay_ms, behavior, create_index,
                expires_at_ms) VALUES ('crashed', 'crashed', 10000, 0, 'delete', 1, 0)",
        )
        .await;
        let watch = watch_k(&ours).await;
        // Our sweep finds the session expired, and waits for the writer to end it.
        tokio::time::sleep(SESSION_SWEEP_INTERVAL * 3).await;
        let theirs = open_in(&dir).await;
        theirs.put("k/a", b"1", Cas::Any).await.unwrap();

        assert_woken_by_their_key(watch, waiting).await;
    }

    /// Reaping takes no index: another process's is seen by the reaped index rising, and
    /// may have moved any prefix's index.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_processs_reaping_announces_unknown_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = (open_in(&dir).await, open_in(&dir).await);
        theirs.put("a/x", b"1", Cas::Any).await.unwrap();
        theirs.delete("a/x", Cas::Any).await.unwrap();
        let deleted = meta(&theirs.inner.reader, "last_index").await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while ours.inner.announced.load(Ordering::Acquire) < deleted {
            assert!(
                tokio::time::Instant::now() < deadline,
                "their delete never seen"
            );
            tokio::time::sleep(POLL_INTERVAL / 4).await;
        }
        ours.prefix_index("b/").await.unwrap();
        assert!(ours.inner.known_prefix_indexes().contains_key("b/"));
        let mut batches = ours.inner.batches.subscribe();

        run_beside(&dir, "UPDATE tombstones SET deleted_at_ms = 0").await;
        reap_tombstones(&theirs.inner).await.unwrap();
        let announced = tokio::time::timeout(Duration::from_secs(10), batches.recv()).await;
        assert!(
            announced
                .expect("their reaping announced")
                .unwrap()
                .everything
        );
        assert!(ours.inner.known_prefix_indexes().is_empty());
    }

    /// A session that expires while two processes write ends cleanly whichever process's
    /// sweep ends it: its keys go, and both processes go on writing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_expiring_between_two_processes_leaves_both_writing() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = (open_in(&dir).await, open_in(&dir).await);
        let session = theirs
            .create_session(&SessionSpec {
                name: "s".into(),
                ttl: Duration::from_secs(10),
                lock_delay: Duration::from_secs(5),
                behavior: SessionBehavior::Delete,
            })
            .await
            .unwrap();
        let locks: Vec<TxnOp> = (0..64)
            .map(|i| TxnOp::Lock {
                key: format!("lock/{i}"),
                value: b"held".to_vec(),
                session: session.clone(),
            })
            .collect();
        theirs.txn(&locks).await.unwrap();
        run_beside(&dir, "UPDATE sessions SET expires_at_ms = 0").await;

        let writes = async {
            let mut i = 0;
            while !ours.list("lock/").await.unwrap().pairs.is_empty() {
                ours.put(&format!("a/{i}"), b"1", Cas::Any).await.unwrap();
                theirs.put(&format!("b/{i}"), b"1", Cas::Any).await.unwrap();
                i += 1;
            }
            ours.put("a/after", b"1", Cas::Any).await.unwrap();
            theirs.put("b/after", b"1", Cas::Any).await.unwrap();
        };
        tokio::time::timeout(Duration::from_secs(60), writes)
            .await
            .expect("both processes still write");
    }
}
