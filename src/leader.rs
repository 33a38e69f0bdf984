//! Leader election: one server at a time runs the farms.
//!
//! Each server keeps one store session and competes for [`LEADER_LOCK`] with it; the lock's
//! value names the holder. The winner runs the farms under a *term* token that is cancelled
//! the moment leadership or a session is in doubt (the lock key changes hands or vanishes,
//! renewals stop succeeding, or a farm taking a lock finds the term's session gone), before
//! the farms can write again.
//!
//! Each term also has a session of its own, whose behavior is always delete: the farms take
//! their ownership and mutation locks with it, so those keys vanish with it as P2's farms'
//! locks do, whatever `--leader-behavior` makes of the leader lock (P2's RC farm treats any
//! key under its lock tree as held, session or not). Every farm write carries a
//! `check-session` on a lock one of the two sessions holds, so a deposed leader's late write
//! is rolled back by the store itself. Standbys watch the lock and take over when it is
//! released (a server whose term ends lets its locks go once its farms have stopped) or its
//! session expires (after the session's lock-delay).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use crate::backoff::Backoff;
use crate::kv::{
    KvStore, SessionBehavior, SessionSpec, StoreError, StoreResult, TxnOp, WatchTarget, MAX_TXN_OPS,
};
use crate::layout::{LEADER_LOCK, LOCKS};
use crate::model::timestamp::format_rfc3339;

/// How many blocking watches of the store a campaigning server keeps open at once: one,
/// of the leader lock.
pub const WATCHES: usize = 1;

/// How long ending a session (letting its locks go, then destroying it) may take before it
/// is left for later (or, on stopping, to the store's expiry).
const END_SESSION_WAIT: Duration = Duration::from_secs(3);

/// The part of [`END_SESSION_WAIT`] letting a session's locks go may take: what is still
/// held after it is freed by the destruction, after its lock-delay.
const LET_GO_WAIT: Duration = Duration::from_secs(1);

/// How many of the transactions letting a session's locks go are sent at once.
const LET_GO_CONCURRENCY: usize = 16;

/// A session to end once its use is over, with the behavior it was created with.
type Ending = (String, SessionBehavior);

/// How long a leader session must have lasted for the pause before the next one to start
/// again from the shortest: a session whose term ends at once (a farm that fails as it
/// starts, a store that loses sessions) makes the pauses grow instead, so that such a
/// server does not bid, lead and step down twice a second.
const HEALTHY_SESSION: Duration = Duration::from_secs(30);

/// How often a server that may not lead looks again.
const READY_CHECK: Duration = Duration::from_secs(1);

/// How a server takes part in the election.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// Names this server in the lock's value and in its session's name.
    pub holder: String,
    pub session_ttl: Duration,
    pub lock_delay: Duration,
    pub behavior: SessionBehavior,
}

impl LeaderConfig {
    /// A session of this server's, named after it (plus `suffix`), with its TTL and
    /// lock-delay.
    fn session_spec(&self, suffix: &str, behavior: SessionBehavior) -> SessionSpec {
        SessionSpec {
            name: format!("p2-apiserver:{}{suffix}", self.holder),
            ttl: self.session_ttl,
            lock_delay: self.lock_delay,
            behavior,
        }
    }
}

/// The value of the leader lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaderRecord {
    /// The server holding the lock.
    pub holder: String,
    /// Its store session.
    pub session: String,
    /// When it took the lock (RFC 3339).
    #[schema(format = DateTime)]
    pub since: String,
}

/// What the farms get while this server leads.
#[derive(Debug, Clone)]
pub struct Term {
    /// The session that holds the leader lock.
    pub leader_session: String,
    /// The term's own session (behavior delete): farms take their locks with it.
    pub session: String,
    /// Cancelled when leadership is lost or in doubt; nothing may be written after that.
    pub cancel: CancellationToken,
}

/// Reads who leads now, if anyone.
pub async fn current_leader(store: &dyn KvStore) -> StoreResult<Option<LeaderRecord>> {
    let Some(pair) = store.get(LEADER_LOCK).await? else {
        return Ok(None);
    };
    if pair.session().is_none() {
        return Ok(None);
    }
    Ok(serde_json::from_slice(&pair.value).ok())
}

/// Campaigns until `shutdown`, running `lead` for every term this server wins, and bidding
/// only while `ready` says it could lead (`Err` says why not): a server that could not
/// lead would take the lock only to step down, keeping out one that could. `lead` must
/// return soon after its term is cancelled; if it returns (or panics) before, the term
/// ends. When a term ends its session is ended: its locks let go, then the session
/// destroyed; on shutdown the leader session is ended too, which frees the leader lock. A
/// session the store could not destroy then (an outage is what ends a term) is destroyed
/// as soon as it answers again, rather than left to hold its locks until the store expires
/// it. A store that does not answer holds up neither stepping down nor stopping: session
/// calls and bids for the lock give way to the end of the session's use, and ending one
/// waits `END_SESSION_WAIT` at most.
pub async fn campaign<F, Fut>(
    store: Arc<dyn KvStore>,
    config: LeaderConfig,
    ready: impl Fn() -> Result<(), String>,
    shutdown: CancellationToken,
    lead: F,
) where
    F: Fn(Term) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut leftover = Vec::new();
    loop {
        // Also the last attempt when a stop comes during a pause: the store may answer by
        // now, and what is not ended here is left to its expiry (a TTL and the lock-delay).
        end_sessions(&*store, &mut leftover).await;
        if shutdown.is_cancelled() {
            break;
        }
        if !wait_until_ready(&*store, &mut leftover, &ready, &shutdown).await {
            break;
        }
        let spec = config.session_spec("", config.behavior);
        let asked = Instant::now();
        let created = tokio::select! {
            created = store.create_session(&spec) => created,
            () = shutdown.cancelled() => break,
        };
        let session = match created {
            Ok(session) => session,
            Err(e) => {
                tracing::warn!(error = %e, "creating the leader session failed");
                sleep_or_cancel(backoff.next_delay(), &shutdown).await;
                continue;
            }
        };
        let began = Instant::now();
        tracing::info!(%session, "leader session created");
        let alive = shutdown.child_token();
        let renewer = tokio::spawn(keep_alive(
            store.clone(),
            session.clone(),
            config.session_ttl,
            asked,
            alive.clone(),
        ));
        let run = hold_or_wait(
            &store,
            &config,
            &session,
            &alive,
            &ready,
            &lead,
            &mut leftover,
        )
        .await;
        if let Err(e) = run {
            tracing::warn!(error = %e, "leader election failed; starting over");
        }
        if began.elapsed() >= HEALTHY_SESSION {
            backoff.reset();
        }
        alive.cancel();
        let _ = renewer.await;
        leftover.push((session, config.behavior));
        end_sessions(&*store, &mut leftover).await;
        if shutdown.is_cancelled() {
            break;
        }
        sleep_or_cancel(backoff.next_delay(), &shutdown).await;
    }
}

/// Waits until `ready` says this server could lead; `false` on `shutdown`. Meanwhile (and
/// once more on `shutdown`) it ends the sessions left in `leftover`: the store may answer
/// again long before this server could lead, and their locks (the leader lock too) would
/// keep out a server that could until the store expired them.
async fn wait_until_ready(
    store: &dyn KvStore,
    leftover: &mut Vec<Ending>,
    ready: &impl Fn() -> Result<(), String>,
    shutdown: &CancellationToken,
) -> bool {
    let mut told = false;
    loop {
        match ready() {
            Ok(()) => return true,
            Err(why) if !told => {
                tracing::warn!(%why, "not bidding for leadership until this server could lead");
                told = true;
            }
            Err(_) => {}
        }
        sleep_or_cancel(READY_CHECK, shutdown).await;
        end_sessions(store, leftover).await;
        if shutdown.is_cancelled() {
            return false;
        }
    }
}

/// With a live session: take the lock when it is free and `ready` says this server could
/// lead, lead while it is ours, wait while it is someone else's, ending the sessions left in
/// `leftover` before each bid. Returns when the session is lost, the lock left us, or this
/// server could no longer lead.
async fn hold_or_wait<F, Fut>(
    store: &Arc<dyn KvStore>,
    config: &LeaderConfig,
    session: &str,
    alive: &CancellationToken,
    ready: &impl Fn() -> Result<(), String>,
    lead: &F,
    leftover: &mut Vec<Ending>,
) -> StoreResult<()>
where
    F: Fn(Term) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let target = WatchTarget::Key(LEADER_LOCK.into());
    let mut index = 0;
    while !alive.is_cancelled() {
        // Sessions a step-down could not end are ended before each bid: the store may answer
        // again first with this session, and the old term's locks (the leader lock too, when
        // its session held it) would otherwise stay held until the store expired them.
        end_sessions(&**store, leftover).await;
        if ready().is_err() {
            return Ok(());
        }
        let record = LeaderRecord {
            holder: config.holder.clone(),
            session: session.into(),
            since: format_rfc3339(SystemTime::now()),
        };
        let value = serde_json::to_vec(&record).expect("a record always serializes");
        // A bid the store leaves unanswered gives way to the end of the session's use; the
        // session is destroyed after, so a bid the store did apply frees the lock with it.
        let acquired = tokio::select! {
            acquired = store.acquire(LEADER_LOCK, &value, session) => acquired?,
            () = alive.cancelled() => return Ok(()),
        };
        if acquired {
            tracing::info!(holder = %config.holder, "elected leader");
            return lead_term(store.clone(), config, session, alive, lead, leftover).await;
        }
        // Refused: someone holds the lock (wait until that changes), or it is free but its
        // lock-delay runs, whose end no watch reports (look again shortly, without blocking).
        let snapshot = tokio::select! {
            snapshot = store.watch(&target, index, Duration::from_secs(30)) => snapshot?,
            () = alive.cancelled() => return Ok(()),
        };
        let free = snapshot
            .pairs
            .first()
            .is_none_or(|pair| pair.session().is_none());
        if free {
            sleep_or_cancel(Duration::from_millis(250), alive).await;
            index = 0;
        } else {
            index = snapshot.index;
        }
    }
    Ok(())
}

/// Leads one term: creates the term's session, runs `lead` until the leader lock leaves
/// `session` or either session is lost, then, once the farms have stopped, leaves the
/// term's session in `leftover` to be destroyed.
async fn lead_term<F, Fut>(
    store: Arc<dyn KvStore>,
    config: &LeaderConfig,
    session: &str,
    alive: &CancellationToken,
    lead: &F,
    leftover: &mut Vec<Ending>,
) -> StoreResult<()>
where
    F: Fn(Term) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let spec = config.session_spec(":farms", SessionBehavior::Delete);
    let asked = Instant::now();
    let farm_session = tokio::select! {
        created = store.create_session(&spec) => created?,
        () = alive.cancelled() => return Ok(()),
    };
    let term = Term {
        leader_session: session.into(),
        session: farm_session.clone(),
        cancel: alive.child_token(),
    };
    // Losing the term's session ends the term, as losing the leader's ends `alive`.
    let renewer = tokio::spawn(keep_alive(
        store.clone(),
        farm_session.clone(),
        config.session_ttl,
        asked,
        term.cancel.clone(),
    ));
    crate::metrics::leading(true);
    let mut farms = tokio::spawn(lead(term.clone()));
    // Farms that stop (or panic) before their term ends end it: leading on without them
    // would hold the lock while nothing reconciles, and no standby could take over.
    let (outcome, stopped) = tokio::select! {
        outcome = watch_while_ours(&*store, session, &term.cancel) => (outcome, false),
        _ = &mut farms => {
            tracing::warn!("the farms stopped before their term ended; stepping down");
            (Ok(()), true)
        }
    };
    term.cancel.cancel();
    if !stopped {
        let _ = farms.await;
    }
    crate::metrics::leading(false);
    let _ = renewer.await;
    // Ended by `campaign` right after, before the leader's.
    leftover.push((farm_session, SessionBehavior::Delete));
    tracing::info!("stepped down");
    outcome
}

/// Returns when the lock no longer belongs to `session` or `term` ends. A failed watch is
/// retried: whether the session still lives is `keep_alive`'s to decide, and the fence on
/// every farm write covers the meantime.
async fn watch_while_ours(
    store: &dyn KvStore,
    session: &str,
    term: &CancellationToken,
) -> StoreResult<()> {
    let target = WatchTarget::Key(LEADER_LOCK.into());
    let mut index = 0;
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        let result = tokio::select! {
            result = store.watch(&target, index, Duration::from_secs(60)) => result,
            () = term.cancelled() => return Ok(()),
        };
        let snapshot = match result {
            Ok(snapshot) => snapshot,
            Err(e) => {
                tracing::warn!(error = %e, "watching the leader lock failed; retrying");
                sleep_or_cancel(backoff.next_delay(), term).await;
                continue;
            }
        };
        backoff.reset();
        let ours = snapshot
            .pairs
            .first()
            .is_some_and(|pair| pair.session() == Some(session));
        if !ours {
            tracing::warn!("the leader lock left this server");
            return Ok(());
        }
        index = snapshot.index;
    }
}

/// Renews the session (whose creation was asked for at `created`) every third of its TTL.
/// Cancels `alive` when the session is gone, or when renewals have failed for two thirds of
/// the TTL: by then the store may expire it at any moment, and the farms must stop before
/// that, not after. The TTL is counted from when the call that last renewed it (or created
/// it) was sent, not from its answer: the store counts it from when it applied the call,
/// which an answer that comes late may follow by most of a TTL.
async fn keep_alive(
    store: Arc<dyn KvStore>,
    session: String,
    ttl: Duration,
    created: Instant,
    alive: CancellationToken,
) {
    let mut last_renewed = created;
    let give_up_after = ttl * 2 / 3;
    loop {
        let next = if last_renewed.elapsed() < ttl / 3 {
            last_renewed + ttl / 3
        } else {
            Instant::now() + Duration::from_secs(1)
        };
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = alive.cancelled() => return,
        }
        // A renewal that hangs must not outlive the point where the farms have to stop, nor
        // hold up the end of the session's use.
        let deadline = last_renewed + give_up_after;
        let sent = Instant::now();
        let renewal = tokio::time::timeout_at(deadline, store.renew_session(&session));
        let renewed = tokio::select! {
            renewed = renewal => renewed,
            () = alive.cancelled() => return,
        };
        let renewed =
            renewed.unwrap_or_else(|_| Err(StoreError::Unavailable("renewal timed out".into())));
        match renewed {
            Ok(_) => last_renewed = sent,
            Err(StoreError::NotFound(_)) => {
                tracing::warn!(%session, "session expired");
                alive.cancel();
                return;
            }
            Err(e) => {
                tracing::warn!(%session, error = %e, "renewing the session failed");
                if last_renewed.elapsed() >= give_up_after {
                    alive.cancel();
                    return;
                }
            }
        }
    }
}

/// Ends `sessions` in order (a term's before the leader's, so that the farms' locks are
/// free again no later than the leader lock): lets their locks go ([`let_go`]), then
/// destroys them, keeping those the store could not destroy for the next attempt. A store
/// that does not answer one within [`END_SESSION_WAIT`] is not asked about the others this
/// time: stepping down and stopping do not wait on it.
async fn end_sessions(store: &dyn KvStore, sessions: &mut Vec<Ending>) {
    let mut kept = Vec::new();
    let mut answering = true;
    for (session, behavior) in sessions.drain(..) {
        if !answering {
            kept.push((session, behavior));
            continue;
        }
        let give_up = Instant::now() + END_SESSION_WAIT;
        let _ = tokio::time::timeout(LET_GO_WAIT, let_go(store, &session, behavior)).await;
        let destroyed = tokio::time::timeout_at(give_up, store.destroy_session(&session))
            .await
            .unwrap_or_else(|_| {
                answering = false;
                Err(StoreError::Unavailable("no answer in time".into()))
            });
        if let Err(e) = destroyed {
            tracing::warn!(%session, error = %e, "destroying a session failed; trying again later");
            kept.push((session, behavior));
        }
    }
    *sessions = kept;
}

/// Frees the locks `session` holds under the lock tree (the leader lock, or a term's farm
/// locks) as its `behavior` would on its destruction, but without the lock-delay a
/// destruction starts. The delay guards against a holder still acting, and a session is
/// ended only once its farms have stopped: so after a graceful stop or a step-down, a
/// standby leads at once and its farms take each object at once. A key that changed hands
/// meanwhile is left alone; what is not freed here is freed by the destruction.
async fn let_go(store: &dyn KvStore, session: &str, behavior: SessionBehavior) {
    let Ok(listing) = store.list(LOCKS).await else {
        return;
    };
    let frees: Vec<Vec<TxnOp>> = listing
        .pairs
        .into_iter()
        .filter(|pair| pair.session() == Some(session))
        .map(|pair| match behavior {
            SessionBehavior::Delete => vec![
                TxnOp::CheckSession {
                    key: pair.key.clone(),
                    session: session.to_owned(),
                },
                TxnOp::Delete { key: pair.key },
            ],
            SessionBehavior::Release => vec![TxnOp::Unlock {
                key: pair.key,
                value: pair.value.to_vec(),
                session: session.to_owned(),
            }],
        })
        .collect();
    let txns = frees.chunks(MAX_TXN_OPS / 2).map(|chunk| chunk.concat());
    stream::iter(txns)
        .for_each_concurrent(LET_GO_CONCURRENCY, |ops| async move {
            if let Err(e) = store.txn(&ops).await {
                tracing::debug!(%session, error = %e, "letting locks go failed; the session's end frees them");
            }
        })
        .await;
}

async fn sleep_or_cancel(pause: Duration, cancel: &CancellationToken) {
    tokio::select! {
        () = tokio::time::sleep(pause) => {}
        () = cancel.cancelled() => {}
    }
}
