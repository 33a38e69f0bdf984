//! The key-value engine: one trait with Consul's semantics, and its backends. It knows
//! nothing of P2: the repositories that give keys their meaning live in [`crate::store`].
//!
//! Everything the server keeps lives in a [`KvStore`]. The trait is deliberately small and
//! mirrors Consul's KV API (versioned keys, check-and-set, transactions, sessions, locks and
//! blocking watches) so that the repositories built on it behave the same on Consul and on
//! the embedded SQLite backend.

pub mod consul;
pub mod keys;
pub mod metered;
pub mod open;
pub mod prefixed;
pub mod sent;
pub mod shared_listings;
pub mod sqlite;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use keys::{validate_key, validate_prefix, validate_value, MAX_VALUE_BYTES};
pub use open::{open_store, ConsulOptions, StoreUrl};

/// The most operations one transaction may hold: Consul 0.7 refuses more than 64.
pub const MAX_TXN_OPS: usize = 64;
/// The most bytes one transaction may take as Consul's `/v1/txn` body (its ops as JSON, values
/// in base64), by [`TxnOp::encoded_len`]: Consul refuses a longer body (`txn_max_req_len`,
/// 512 KiB), as older agents refuse values adding up to more than that, with a 413.
pub const MAX_TXN_BYTES: usize = 512 * 1024;
/// The longest a blocking watch may wait, as in Consul (which caps `wait` at 10 minutes).
pub const MAX_WATCH_WAIT: Duration = Duration::from_secs(600);
/// Shortest session TTL Consul accepts.
pub const MIN_SESSION_TTL: Duration = Duration::from_secs(10);
/// Longest session TTL Consul accepts.
pub const MAX_SESSION_TTL: Duration = Duration::from_secs(86_400);
/// Longest lock-delay Consul applies.
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);
/// Shortest lock-delay but zero that Consul takes as given: it reads one under 1000ns as
/// that many seconds (its `lockDelayMinThreshold`, for clients that send 5 meaning 5s).
pub const MIN_LOCK_DELAY: Duration = Duration::from_micros(1);

/// What keeps `delay` from being a lock-delay every store takes, `None` when nothing does:
/// over 60s, or under a microsecond but not zero, which Consul would hold locks for as many
/// seconds as it has nanoseconds. (The embedded store keeps it to the millisecond, rounded
/// up.)
pub fn lock_delay_problem(delay: Duration) -> Option<String> {
    if delay > MAX_LOCK_DELAY {
        Some(format!("lock-delay must be at most 60s, got {delay:?}"))
    } else if !delay.is_zero() && delay < MIN_LOCK_DELAY {
        Some(format!(
            "lock-delay must be 0 or at least 1µs (Consul reads a shorter one as seconds), \
             got {delay:?}"
        ))
    } else {
        None
    }
}

/// Why a store operation failed; callers branch on the kind, never on the message.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// The key or session does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A check-and-set missed or a transaction rolled back; `failures` names each failing op.
    #[error("conflict: {message}")]
    Conflict {
        message: String,
        failures: Vec<TxnFailure>,
    },
    /// The store could not be reached or could not answer (transport, 5xx, no leader).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A write was sent but its answer was lost, and what the store holds now does not tell
    /// whether it was applied: it may land (or have landed) or not. Unlike `Unavailable`,
    /// retrying blindly may apply it twice or overwrite a newer write; re-read first.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The request itself is wrong (bad key, oversized value, too many ops, bad TTL).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The store refused the credentials (Consul ACL).
    #[error("forbidden: {0}")]
    Forbidden(String),
}

impl StoreError {
    /// A conflict with no per-op detail, as for a plain CAS miss.
    pub fn conflict(message: impl Into<String>) -> Self {
        StoreError::Conflict {
            message: message.into(),
            failures: Vec::new(),
        }
    }
}

/// Result alias for store operations.
pub type StoreResult<T> = Result<T, StoreError>;

/// One failing operation of a rolled-back transaction, as Consul reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnFailure {
    /// Position of the op in the transaction, from 0.
    pub op_index: usize,
    /// Why it failed.
    pub what: String,
}

/// One stored key with Consul's bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPair {
    pub key: String,
    /// Shared rather than copied: the mirror keeps one copy of a value many keys hold.
    pub value: Arc<[u8]>,
    /// Index of the write that created the key.
    pub create_index: u64,
    /// Index of the last write to the key; the CAS token.
    pub modify_index: u64,
    /// The key's lock bookkeeping; `None` for a key never acquired nor held. Out of line,
    /// since few keys are ever locked and the mirror keeps hundreds of thousands of pairs.
    pub lock: Option<Box<Lock>>,
}

/// A key's lock bookkeeping, as Consul keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    /// How many times the key has been acquired as a lock.
    pub index: u64,
    /// Session holding the key as a lock, if any.
    pub session: Option<String>,
}

impl Lock {
    /// The bookkeeping of a key acquired `index` times and held by `session`: `None` for a
    /// key never acquired nor held, so that equal pairs compare equal.
    pub fn of(index: u64, session: Option<String>) -> Option<Box<Lock>> {
        (index != 0 || session.is_some()).then(|| Box::new(Lock { index, session }))
    }
}

impl KvPair {
    /// How many times the key has been acquired as a lock.
    pub fn lock_index(&self) -> u64 {
        self.lock.as_ref().map_or(0, |lock| lock.index)
    }

    /// Session holding the key as a lock, if any.
    pub fn session(&self) -> Option<&str> {
        self.lock.as_ref()?.session.as_deref()
    }
}

/// A consistent read of a prefix: its pairs and the index to pass to the next watch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Highest index of any change under the prefix (deletes included), never below 1.
    pub index: u64,
    pub pairs: Vec<KvPair>,
}

impl Listing {
    /// What `decode` makes of each pair, skipping (and logging) the pairs it cannot read:
    /// one bad document must not hide the rest of a tree, as it does in P2. `what` names
    /// the kind of document in the log.
    pub fn decode_readable<T, E: std::fmt::Display>(
        &self,
        what: &str,
        decode: impl Fn(&KvPair) -> Result<T, E>,
    ) -> Vec<T> {
        self.pairs
            .iter()
            .filter_map(|pair| match decode(pair) {
                Ok(item) => Some(item),
                Err(e) => {
                    tracing::warn!(key = %pair.key, error = %e, "skipping unreadable {what}");
                    None
                }
            })
            .collect()
    }
}

/// Condition of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cas {
    /// Write whatever is stored.
    Any,
    /// Write only if the key's modify index equals this; 0 means "only if absent".
    Index(u64),
}

/// One operation of a transaction; the names follow Consul's txn verbs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    Set {
        key: String,
        value: Vec<u8>,
    },
    Cas {
        key: String,
        value: Vec<u8>,
        index: u64,
    },
    Get {
        key: String,
    },
    Delete {
        key: String,
    },
    DeleteCas {
        key: String,
        index: u64,
    },
    CheckIndex {
        key: String,
        index: u64,
    },
    CheckNotExists {
        key: String,
    },
    Lock {
        key: String,
        value: Vec<u8>,
        session: String,
    },
    Unlock {
        key: String,
        value: Vec<u8>,
        session: String,
    },
    CheckSession {
        key: String,
        session: String,
    },
}

impl TxnOp {
    /// The key the op acts on.
    pub fn key(&self) -> &str {
        match self {
            TxnOp::Set { key, .. }
            | TxnOp::Cas { key, .. }
            | TxnOp::Get { key }
            | TxnOp::Delete { key }
            | TxnOp::DeleteCas { key, .. }
            | TxnOp::CheckIndex { key, .. }
            | TxnOp::CheckNotExists { key }
            | TxnOp::Lock { key, .. }
            | TxnOp::Unlock { key, .. }
            | TxnOp::CheckSession { key, .. } => key,
        }
    }

    /// The value the op writes, if it writes one.
    pub fn value(&self) -> Option<&[u8]> {
        match self {
            TxnOp::Set { value, .. }
            | TxnOp::Cas { value, .. }
            | TxnOp::Lock { value, .. }
            | TxnOp::Unlock { value, .. } => Some(value),
            _ => None,
        }
    }

    /// An upper bound of the bytes the op takes in a Consul `/v1/txn` body: its value in
    /// base64, its key and session as JSON strings (at most twice their length, as keys and
    /// sessions hold no control characters), and room for the field names, verb and index.
    pub fn encoded_len(&self) -> usize {
        const FRAMING: usize = 128;
        let value = self.value().map_or(0, |value| value.len().div_ceil(3) * 4);
        let session = match self {
            TxnOp::Lock { session, .. }
            | TxnOp::Unlock { session, .. }
            | TxnOp::CheckSession { session, .. } => session.len(),
            _ => 0,
        };
        FRAMING + 2 * (self.key().len() + session) + value
    }

    /// Whether Consul answers this op with the key's entry (deletes and check-not-exists
    /// answer nothing), which is how results are lined up with ops.
    pub fn returns_entry(&self) -> bool {
        !matches!(
            self,
            TxnOp::Delete { .. } | TxnOp::DeleteCas { .. } | TxnOp::CheckNotExists { .. }
        )
    }
}

/// How many bytes `ops` take in a Consul `/v1/txn` body, at most ([`TxnOp::encoded_len`]):
/// what [`MAX_TXN_BYTES`] bounds.
pub fn txn_bytes(ops: &[TxnOp]) -> usize {
    ops.iter().map(TxnOp::encoded_len).sum()
}

/// How many bytes `ops` take in the `/v1/txn` body `kv` sends, at most: [`txn_bytes`] of
/// their keys as the store names them, each with its [`KvStore::key_prefix_len`] bytes
/// more (counted twice, as [`TxnOp::encoded_len`] counts a key).
pub fn txn_bytes_on(kv: &dyn KvStore, ops: &[TxnOp]) -> usize {
    txn_bytes(ops) + ops.len() * 2 * kv.key_prefix_len()
}

/// Checks what every backend must refuse before touching storage: too many ops, bad keys,
/// oversized values, more than [`MAX_TXN_BYTES`] in all.
pub fn validate_txn(ops: &[TxnOp]) -> StoreResult<()> {
    if ops.is_empty() {
        return Err(StoreError::Invalid(
            "a transaction needs at least one op".into(),
        ));
    }
    if ops.len() > MAX_TXN_OPS {
        return Err(StoreError::Invalid(format!(
            "a transaction holds at most {MAX_TXN_OPS} ops, got {}",
            ops.len()
        )));
    }
    for (i, op) in ops.iter().enumerate() {
        validate_key(op.key()).map_err(|e| StoreError::Invalid(format!("op {i}: {e}")))?;
        if let Some(value) = op.value() {
            validate_value(value).map_err(|e| StoreError::Invalid(format!("op {i}: {e}")))?;
        }
    }
    let bytes = txn_bytes(ops);
    if bytes > MAX_TXN_BYTES {
        return Err(StoreError::Invalid(format!(
            "a transaction carries at most {MAX_TXN_BYTES} bytes (512 KiB) as Consul encodes it, \
             got about {bytes}"
        )));
    }
    Ok(())
}

/// What happens to the keys a session holds when it is invalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionBehavior {
    /// The locks are released; the keys stay.
    Release,
    /// The keys are deleted.
    Delete,
}

impl SessionBehavior {
    /// Consul's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionBehavior::Release => "release",
            SessionBehavior::Delete => "delete",
        }
    }
}

/// How to create a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSpec {
    pub name: String,
    /// Between 10 s and 24 h.
    pub ttl: Duration,
    /// How long a lock the session held stays unacquirable after the session is invalidated.
    pub lock_delay: Duration,
    pub behavior: SessionBehavior,
}

impl SessionSpec {
    /// A session as P2's farms and tools take their locks with: behavior delete, so that
    /// its locks go with it, and no lock-delay.
    pub fn deleting(name: impl Into<String>, ttl: Duration) -> SessionSpec {
        SessionSpec {
            name: name.into(),
            ttl,
            lock_delay: Duration::ZERO,
            behavior: SessionBehavior::Delete,
        }
    }

    /// Refuses TTLs and lock-delays outside what Consul takes as given, so both backends
    /// accept the same specs.
    pub fn validate(&self) -> StoreResult<()> {
        if self.ttl < MIN_SESSION_TTL || self.ttl > MAX_SESSION_TTL {
            return Err(StoreError::Invalid(format!(
                "session TTL must be between 10s and 24h, got {:?}",
                self.ttl
            )));
        }
        match lock_delay_problem(self.lock_delay) {
            Some(problem) => Err(StoreError::Invalid(problem)),
            None => Ok(()),
        }
    }
}

/// A live session as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: String,
    pub name: String,
    pub ttl: Duration,
    pub lock_delay: Duration,
    pub behavior: SessionBehavior,
    pub create_index: u64,
}

/// What changed under a prefix after an index, deletes included: what a follower of the
/// prefix needs to bring its copy from that index to [`Changes::index`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// The prefix's index now, as a listing of it would carry.
    pub index: u64,
    /// The pairs written after the index, sorted by key.
    pub changed: Vec<KvPair>,
    /// The keys deleted after the index, each with the index of its deletion.
    pub deleted: Vec<(String, u64)>,
}

/// What a watch of a prefix brings: the prefix whole, or only what changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixUpdate {
    Whole(Listing),
    Since(Changes),
}

impl PrefixUpdate {
    /// The index the update brings the prefix to.
    pub fn index(&self) -> u64 {
        match self {
            PrefixUpdate::Whole(listing) => listing.index,
            PrefixUpdate::Since(changes) => changes.index,
        }
    }
}

/// What a watch follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchTarget {
    /// One key; the snapshot holds it or nothing.
    Key(String),
    /// Every key under a prefix.
    Prefix(String),
}

/// The indexes of transactions whose writes a watcher already holds (the server's own,
/// applied to its mirror as they committed), asked for once a watch wakes: reading them
/// back would cost as much as the writes did.
pub type HeldWrites<'a> = &'a (dyn Fn() -> Vec<u64> + Send + Sync);

/// The store every part of the server is written against.
///
/// Errors are [`StoreError`] kinds; a CAS miss or rollback is always `Conflict`.
#[async_trait]
pub trait KvStore: Send + Sync + 'static {
    /// One key, or `None` if it does not exist.
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>>;

    /// Every key under `prefix` with its value, sorted by key.
    async fn list(&self, prefix: &str) -> StoreResult<Listing>;

    /// The keys under `prefix`, sorted; with a separator, keys are cut after the first
    /// separator following the prefix and deduplicated, as Consul's `?keys&separator=`.
    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)>;

    /// The index a listing of `prefix` would carry, without its pairs: what a reader asks to
    /// learn whether it has caught up. By default the index of its keys cut at the first
    /// `/`: Consul sends no values, but still visits every key under the prefix.
    async fn prefix_index(&self, prefix: &str) -> StoreResult<u64> {
        Ok(self.keys(prefix, Some('/')).await?.0)
    }

    /// [`KvStore::prefix_index`] counting only the changes up to `through`: at least the
    /// index of the prefix's newest change at or below `through` (later changes may count
    /// too), for a reader that needs to know only whether it holds every change up to an
    /// index it has. The embedded store answers from memory when it has heard of every
    /// commit up to `through`; by default, and on Consul, the prefix's index now.
    async fn prefix_index_through(&self, prefix: &str, through: u64) -> StoreResult<u64> {
        let _ = through;
        self.prefix_index(prefix).await
    }

    /// The store's index now: at least that of every write it has committed, so that a
    /// reader holding a higher index learns the store went backwards (restored from a
    /// snapshot) while its watches wait, as Consul's do, for an index the store has not
    /// reached. `probe` is a key nobody writes, that the caller may read: Consul answers the
    /// read of a missing key at its KV table's index. `None` when the store cannot tell
    /// (on Consul, once someone has written the probe).
    async fn current_index(&self, probe: &str) -> StoreResult<Option<u64>>;

    /// How many bytes this store puts before each key it is given, as it sends the key on
    /// (a namespace's prefix, [`prefixed`]): what [`txn_bytes_on`] adds to measure a
    /// transaction as the store's own [`validate_txn`] will. A store wrapping another
    /// answers its inner store's, plus its own. No default, so that a wrapper cannot leave
    /// its inner store's prefix uncounted (a manifest told it fits then refused by the store).
    fn key_prefix_len(&self) -> usize;

    /// Writes `value` at `key` if `cas` holds; a CAS miss is `Conflict`.
    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()>;

    /// Deletes `key` if `cas` holds; deleting an absent key with `Cas::Any` succeeds.
    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()>;

    /// Deletes every key under `prefix`.
    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()>;

    /// Applies all ops or none. On success returns, for each op in order, the entry Consul
    /// would answer (`None` for deletes and check-not-exists); on rollback `Conflict` with
    /// the failing ops.
    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>>;

    /// Creates a session and returns its id.
    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String>;

    /// Resets the session's TTL; `NotFound` once it has expired or been destroyed.
    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo>;

    /// Invalidates the session, applying its behavior to the keys it holds.
    async fn destroy_session(&self, id: &str) -> StoreResult<()>;

    /// The session, or `None` if it no longer exists.
    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>>;

    /// Takes `key` as a lock for `session`, writing `value`. `false` when another session
    /// holds it or its lock-delay has not passed; `NotFound` when the session does not exist.
    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool>;

    /// Releases `key` if `session` holds it; `false` otherwise.
    async fn release(&self, key: &str, session: &str) -> StoreResult<bool>;

    /// Blocks until what `target` covers has an index other than `index`, or `wait` passes,
    /// then returns a snapshot. At the timeout the snapshot carries the same index. An index
    /// lower than `index` means the store went backwards: start again from 0.
    async fn watch(&self, target: &WatchTarget, index: u64, wait: Duration)
        -> StoreResult<Listing>;

    /// [`KvStore::watch`] of `prefix` that, where the store can, answers with only what
    /// changed after `index` rather than the whole prefix, so following a large tree costs
    /// its changes. By default, and wherever the store cannot tell (Consul keeps no
    /// deletes; tombstones reaped past `index`), the prefix whole. The changes may leave out
    /// the pairs written by the transactions `held` names once the watch wakes.
    async fn watch_changes(
        &self,
        prefix: &str,
        index: u64,
        wait: Duration,
        held: HeldWrites<'_>,
    ) -> StoreResult<PrefixUpdate> {
        let _ = held;
        let target = WatchTarget::Prefix(prefix.to_owned());
        Ok(PrefixUpdate::Whole(self.watch(&target, index, wait).await?))
    }

    /// Whether the store answers, and can take writes as far as it can tell without one;
    /// used by `/readyz`.
    async fn ping(&self) -> StoreResult<()>;

    /// Called as the server stops, once nothing else writes: leaves what the store holds
    /// complete where an operator would copy it from. The embedded store checkpoints its
    /// write-ahead log into the database file, so that the file alone holds every write.
    async fn shut_down(&self) {}
}
