//! Leader election and fencing on the embedded store.

#[allow(dead_code)]
use crate::support::severable;

use crate::support::counting::Counting;
use crate::support::farms::rc_doc;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use p2_apiserver::farms::alerts::Alerter;
use p2_apiserver::farms::{self, FarmContext, FarmError, FarmOptions};
use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{Cas, KvStore, SessionBehavior, SessionSpec, StoreError, TxnOp};
use p2_apiserver::layout::LEADER_LOCK;
use p2_apiserver::leader::{self, current_leader, LeaderConfig, Term};
use p2_apiserver::state::{Mirror, MirrorConfig};
use severable::Severable;
use tokio_util::sync::CancellationToken;

fn config(holder: &str) -> LeaderConfig {
    LeaderConfig {
        holder: holder.into(),
        session_ttl: Duration::from_secs(10),
        lock_delay: Duration::from_secs(1),
        behavior: SessionBehavior::Delete,
    }
}

/// A store in a fresh SQLite file, kept as long as the directory answered with it.
async fn sqlite_store() -> (tempfile::TempDir, Arc<dyn KvStore>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leader.db").display().to_string();
    (dir, Arc::new(SqliteStore::open(&path).await.unwrap()))
}

/// Runs a server's campaign over `store` as `holder` until `shutdown`, leading each term it
/// wins by doing nothing until the term ends.
fn campaign_idle(
    store: Arc<dyn KvStore>,
    holder: &str,
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let idle = |term: Term| async move { term.cancel.cancelled().await };
    tokio::spawn(leader::campaign(
        store,
        config(holder),
        || Ok(()),
        shutdown.clone(),
        idle,
    ))
}

/// Asks the server `campaign` to stop through `shutdown`, and checks that it stops within
/// seconds.
async fn stops_promptly(shutdown: CancellationToken, campaign: tokio::task::JoinHandle<()>) {
    let asked = tokio::time::Instant::now();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(8), campaign)
        .await
        .unwrap_or_else(|_| panic!("still stopping {:?} after asked to", asked.elapsed()))
        .unwrap();
}

async fn wait_for(mut check: impl AsyncFnMut() -> bool) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(40);
    while !check().await {
        assert!(tokio::time::Instant::now() < give_up, "timed out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a server's campaign over `store` as "a" until `shutdown`, with sessions long enough
/// (their TTL, returned) that the store's expiry of them comes well after an outage a test
/// makes, leading each term by doing nothing until it ends. Returns once it leads, with the
/// terms it has begun (kept up to date).
async fn campaign_recording_terms(
    store: Arc<dyn KvStore>,
    shutdown: &CancellationToken,
) -> (
    Duration,
    Arc<std::sync::Mutex<Vec<Term>>>,
    tokio::task::JoinHandle<()>,
) {
    let config = LeaderConfig {
        session_ttl: Duration::from_secs(30),
        ..config("a")
    };
    let ttl = config.session_ttl;
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let began = terms.clone();
    let campaign = tokio::spawn(leader::campaign(
        store,
        config,
        || Ok(()),
        shutdown.clone(),
        move |term: Term| {
            began.lock().unwrap().push(term.clone());
            async move { term.cancel.cancelled().await }
        },
    ));
    wait_for(async || !terms.lock().unwrap().is_empty()).await;
    (ttl, terms, campaign)
}

/// Two servers campaign; when the leader's session dies (as on a crash), its term ends and
/// the other takes over after the lock-delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_and_the_old_term_ends() {
    let (_dir, store) = sqlite_store().await;
    let shutdown = CancellationToken::new();
    let terms = Arc::new(AtomicUsize::new(0));
    let ended = Arc::new(AtomicUsize::new(0));
    let mut servers = Vec::new();
    for name in ["a", "b"] {
        let (terms, ended) = (terms.clone(), ended.clone());
        servers.push(tokio::spawn(leader::campaign(
            store.clone(),
            config(name),
            || Ok(()),
            shutdown.clone(),
            move |term: Term| {
                terms.fetch_add(1, Ordering::SeqCst);
                let ended = ended.clone();
                async move {
                    term.cancel.cancelled().await;
                    ended.fetch_add(1, Ordering::SeqCst);
                }
            },
        )));
    }
    wait_for(async || current_leader(&*store).await.unwrap().is_some()).await;
    let first = current_leader(&*store).await.unwrap().unwrap();
    assert_eq!(terms.load(Ordering::SeqCst), 1, "exactly one server leads");

    // The leader's session is invalidated behind its back.
    store.destroy_session(&first.session).await.unwrap();
    wait_for(async || ended.load(Ordering::SeqCst) == 1).await;
    wait_for(async || {
        current_leader(&*store)
            .await
            .unwrap()
            .is_some_and(|now| now.session != first.session)
    })
    .await;
    let second = current_leader(&*store).await.unwrap().unwrap();
    assert!(second.holder == "a" || second.holder == "b");

    shutdown.cancel();
    for server in servers {
        server.await.unwrap();
    }
    // Shutting down destroys the sessions, which deletes the lock at once.
    assert_eq!(store.get(LEADER_LOCK).await.unwrap(), None);
}

/// A deposed leader's late write is rolled back by the store, and a cancelled term writes
/// nothing at all. Writes fenced on the farms' locks check the term's session; writes fenced
/// on the leader lock check the leader's.
#[tokio::test]
async fn farm_writes_are_fenced_by_the_session() {
    let (_dir, store) = sqlite_store().await;
    let spec = |name: &str, behavior| SessionSpec {
        name: name.into(),
        ttl: Duration::from_secs(10),
        lock_delay: Duration::ZERO,
        behavior,
    };
    let leader = store
        .create_session(&spec("leader", SessionBehavior::Release))
        .await
        .unwrap();
    let session = store
        .create_session(&spec("farms", SessionBehavior::Delete))
        .await
        .unwrap();
    assert!(store.acquire(LEADER_LOCK, b"", &leader).await.unwrap());
    let lock = "lock/replication_controllers/x";
    assert!(store.acquire(lock, b"", &session).await.unwrap());
    let term = Term {
        leader_session: leader.clone(),
        session: session.clone(),
        cancel: CancellationToken::new(),
    };
    let ctx = FarmContext::new(
        store.clone(),
        &term,
        Arc::new(Alerter::new(None)),
        "t".into(),
    );
    let write = || {
        vec![TxnOp::Set {
            key: "intent/n1/hello".into(),
            value: b"id: hello\n".to_vec(),
        }]
    };
    ctx.commit(lock, write()).await.unwrap();
    ctx.commit(LEADER_LOCK, write()).await.unwrap();

    // The farms' session dies (it expired, say) while the farm still runs: its write is
    // refused.
    store.destroy_session(&session).await.unwrap();
    store
        .delete("intent/n1/hello", p2_apiserver::kv::Cas::Any)
        .await
        .unwrap();
    assert!(matches!(
        ctx.commit(lock, write()).await,
        Err(FarmError::Store(StoreError::Conflict { .. }))
    ));
    assert_eq!(store.get("intent/n1/hello").await.unwrap(), None);

    // So is a write fenced on leadership once the leader's session dies.
    store.destroy_session(&leader).await.unwrap();
    assert!(matches!(
        ctx.commit(LEADER_LOCK, write()).await,
        Err(FarmError::Store(StoreError::Conflict { .. }))
    ));
    assert_eq!(store.get("intent/n1/hello").await.unwrap(), None);

    // After the term is cancelled nothing is even sent.
    term.cancel.cancel();
    assert!(matches!(
        ctx.commit(lock, write()).await,
        Err(FarmError::TermEnded)
    ));
}

/// A leader that stops renewing (crashed, or cut off from the store) is replaced on SQLite
/// no sooner than TTL plus lock-delay after its last renewal, and no later than the bound
/// `--help` gives (TTL + lock-delay + 1s after the crash). The upper check allows 5s more
/// for a loaded machine: still well short of the 2×TTL Consul may take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leader_is_replaced_within_the_documented_bound() {
    let (_dir, store) = sqlite_store().await;
    let severable = Severable::new(store.clone());
    let shutdown = CancellationToken::new();
    let a = campaign_idle(severable.clone(), "a", &shutdown);
    wait_for(async || current_leader(&*store).await.unwrap().is_some()).await;
    let first = current_leader(&*store).await.unwrap().unwrap();
    assert_eq!(first.holder, "a");
    let b = campaign_idle(store.clone(), "b", &shutdown);

    severable.cut();
    let crashed = tokio::time::Instant::now();
    let renewed = severable.last_renewal(&first.session);
    wait_for(async || {
        current_leader(&*store)
            .await
            .unwrap()
            .is_some_and(|now| now.holder == "b")
    })
    .await;
    let replaced = tokio::time::Instant::now();

    let (ttl, lock_delay) = (config("a").session_ttl, config("a").lock_delay);
    // The store counts whole milliseconds.
    let granularity = Duration::from_millis(5);
    assert!(
        replaced - renewed + granularity >= ttl + lock_delay,
        "replaced {:?} after the last renewal",
        replaced - renewed
    );
    let bound = ttl + lock_delay + Duration::from_secs(1);
    assert!(
        replaced - crashed <= bound + Duration::from_secs(5),
        "replaced {:?} after the crash",
        replaced - crashed
    );

    shutdown.cancel();
    a.await.unwrap();
    b.await.unwrap();
}

/// A leader cut off from the store for two thirds of its TTL steps down, and cannot end its
/// sessions then. Once the store answers again it ends them, so the leader lock and the
/// farms' locks are free after the lock-delay rather than held until the store expires
/// those sessions (on Consul, up to twice the TTL after a renewal that may come late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_a_step_down_could_not_end_are_ended_once_the_store_answers() {
    let (_dir, store) = sqlite_store().await;
    let severable = Severable::new(store.clone());
    let shutdown = CancellationToken::new();
    let (ttl, terms, a) = campaign_recording_terms(severable.clone(), &shutdown).await;
    let first = current_leader(&*store).await.unwrap().unwrap();
    let farms = terms.lock().unwrap()[0].session.clone();
    let lock = "lock/replication_controllers/x";
    assert!(store.acquire(lock, b"a", &farms).await.unwrap());

    severable.cut();
    let expiry = severable.last_renewal(&first.session) + ttl;
    let term = terms.lock().unwrap()[0].cancel.clone();
    wait_for(async || term.is_cancelled()).await;
    // Its attempts to end the sessions as it stepped down have failed by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    severable.mend();
    let mended = tokio::time::Instant::now();
    wait_for(async || {
        current_leader(&*store)
            .await
            .unwrap()
            .is_some_and(|now| now.session != first.session)
    })
    .await;
    // Left to expire, the old leader session would hold the lock until `expiry` at least.
    let led_again = tokio::time::Instant::now();
    assert!(
        led_again < expiry,
        "led again {:?} after the store answered again, which it did {:?} before the old \
         leader session expired: the old sessions were left to expire",
        led_again - mended,
        expiry.saturating_duration_since(mended)
    );
    assert_eq!(store.session_info(&farms).await.unwrap(), None);
    assert_eq!(store.get(lock).await.unwrap(), None);

    shutdown.cancel();
    a.await.unwrap();
}

/// A server asked to stop while the store takes its session calls and never answers them
/// stops within seconds: a leader neither waits out a renewal nor waits on the store to
/// destroy its sessions, which the store then expires; a server still creating its session
/// gives up on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stops_promptly_while_the_store_does_not_answer() {
    let (_dir, store) = sqlite_store().await;
    let severable = Severable::new(store.clone());
    let shutdown = CancellationToken::new();
    let a = campaign_idle(severable.clone(), "a", &shutdown);
    wait_for(async || current_leader(&*store).await.unwrap().is_some()).await;
    // Past the first renewals, so that the next ones are under way when the stop comes.
    tokio::time::sleep(config("a").session_ttl / 3 + Duration::from_millis(500)).await;

    severable.stall();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stops_promptly(shutdown, a).await;

    let shutdown = CancellationToken::new();
    let b = campaign_idle(severable.clone(), "b", &shutdown);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stops_promptly(shutdown, b).await;
    severable.mend();
}

/// A server asked to stop while it waits on the store to answer its bid for the leader
/// lock stops within seconds, rather than after the store's request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stops_promptly_while_the_store_does_not_answer_its_bid_for_the_lock() {
    let (_dir, store) = sqlite_store().await;
    let severable = Severable::new(store.clone());
    severable.stall_acquires();
    let shutdown = CancellationToken::new();
    let a = campaign_idle(severable.clone(), "a", &shutdown);
    wait_for(async || severable.acquiring() > 0).await;

    stops_promptly(shutdown, a).await;
    severable.mend();
    assert_eq!(current_leader(&*store).await.unwrap(), None);
}

/// A leader asked to stop while the store leaves its farms' writes unanswered stops within
/// seconds: a pass waiting on the store is given up once the term ends (every write is
/// fenced, and the next term plans afresh), rather than holding up the step-down, the end of
/// the sessions and so the server's exit for as long as the store takes to answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stops_promptly_while_the_store_does_not_answer_its_farms_writes() {
    use p2_apiserver::farms::{self, FarmOptions};
    use p2_apiserver::kv::Cas;
    use p2_apiserver::state::{Mirror, MirrorConfig};
    use tokio_util::task::TaskTracker;

    let (_dir, store) = sqlite_store().await;
    let severable = Severable::new(store.clone());
    // An RC for the RC farm to claim: the claim is a transaction, which the store never answers.
    let id = uuid::Uuid::new_v4().to_string();
    let rc = rc_doc("id: hello\n", "role=web", 1).id(&id);
    store
        .put(
            &format!("replication_controllers/{id}"),
            rc.to_string().as_bytes(),
            Cas::Index(0),
        )
        .await
        .unwrap();
    severable.stall_txns();
    let tasks = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let mirror = Mirror::new(store.clone(), MirrorConfig::default());
    mirror.start(&tasks, shutdown.clone());
    let farm_store: Arc<dyn KvStore> = severable.clone();
    let lead = move |term: Term| {
        farms::run_term(
            farm_store.clone(),
            mirror.clone(),
            term,
            Arc::new(Alerter::new(None)),
            "a".into(),
            FarmOptions::default(),
        )
    };
    let a = tokio::spawn(leader::campaign(
        severable.clone(),
        config("a"),
        || Ok(()),
        shutdown.clone(),
        lead,
    ));
    wait_for(async || severable.transacting() > 0).await;

    stops_promptly(shutdown, a).await;
    // It ended its sessions as it stopped, which freed the leader lock.
    assert_eq!(current_leader(&*store).await.unwrap(), None);
    severable.mend();
    tasks.close();
    tasks.wait().await;
}

/// Once its term has ended a farm posts no more alerts. A pass that found a great many RCs
/// short of nodes (their node labels wiped, say) went on posting an alert for each, through
/// a webhook that may take seconds to answer, before its writes found the term over: the
/// server could neither step down nor stop meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_alert_is_posted_once_the_term_has_ended() {
    use p2_apiserver::farms::{self, FarmOptions, CONCURRENT_OBJECTS};
    use p2_apiserver::kv::Cas;
    use p2_apiserver::state::{Mirror, MirrorConfig};
    use tokio_util::task::TaskTracker;

    let webhook = crate::support::farms::slow_alert_webhook(Duration::from_secs(3)).await;
    let (_dir, store) = sqlite_store().await;
    let session = |name: &'static str| {
        let store = store.clone();
        async move {
            let spec = SessionSpec::deleting(name, Duration::from_secs(60));
            store.create_session(&spec).await.unwrap()
        }
    };
    let term = Term {
        leader_session: session("leader").await,
        session: session("farms").await,
        cancel: CancellationToken::new(),
    };
    assert!(store
        .acquire(LEADER_LOCK, b"", &term.leader_session)
        .await
        .unwrap());
    // RCs whose selector matches no node: each is short of nodes, and alerted about.
    let rcs = 3 * CONCURRENT_OBJECTS;
    for _ in 0..rcs {
        let id = uuid::Uuid::new_v4().to_string();
        let rc = rc_doc("id: hello\n", "role=none", 1).id(&id);
        let key = format!("replication_controllers/{id}");
        store
            .put(&key, rc.to_string().as_bytes(), Cas::Index(0))
            .await
            .unwrap();
    }
    let tasks = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let mirror = Mirror::new(store.clone(), MirrorConfig::default());
    mirror.start(&tasks, shutdown.clone());
    let farms = tokio::spawn(farms::run_term(
        store.clone(),
        mirror,
        term.clone(),
        Arc::new(Alerter::new(Some(webhook.uri()))),
        "t".into(),
        FarmOptions::default(),
    ));
    wait_for(async || !webhook.received_requests().await.unwrap().is_empty()).await;

    term.cancel.cancel();
    tokio::time::timeout(Duration::from_secs(120), farms)
        .await
        .expect("the farms stop")
        .unwrap();
    let posted = webhook.received_requests().await.unwrap().len();
    assert!(
        posted <= CONCURRENT_OBJECTS,
        "{posted} alerts posted, only those under way when the term ended may be"
    );
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
}

/// Sessions a step-down could not end, the store not answering, are ended once it answers
/// again even when what it answers first is this server's new session: the next bid ends
/// them, rather than the next step-down. Before, a new term found the old term's locks (and,
/// when the old leader session still held it, the leader lock) held until the store
/// expired those sessions, a TTL later (on Consul, up to twice that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_a_step_down_could_not_end_are_ended_before_the_next_bid() {
    use p2_apiserver::kv::Cas;

    let (_dir, store) = sqlite_store().await;
    let severable = Severable::new(store.clone());
    let shutdown = CancellationToken::new();
    let (ttl, terms, a) = campaign_recording_terms(severable.clone(), &shutdown).await;
    let first: Term = terms.lock().unwrap()[0].clone();
    let lock = "lock/replication_controllers/x";
    assert!(store.acquire(lock, b"a", &first.session).await.unwrap());

    // The store stops answering session calls, and the leader lock leaves the server (an
    // operator deleted it, say): it steps down, and cannot end its sessions.
    severable.stall();
    store.delete(LEADER_LOCK, Cas::Any).await.unwrap();
    wait_for(async || first.cancel.is_cancelled()).await;
    let expiry = severable.last_renewal(&first.session) + ttl;
    // Past its attempts to end them: it waits on the store to create its next session.
    tokio::time::sleep(Duration::from_secs(8)).await;
    severable.mend();
    let mended = tokio::time::Instant::now();
    assert!(
        expiry - mended > ttl / 4,
        "the store answers again too late"
    );
    wait_for(async || terms.lock().unwrap().len() == 2).await;
    wait_for(async || store.get(lock).await.unwrap().is_none()).await;
    let freed = mended.elapsed();
    assert!(
        freed < ttl / 4,
        "the old term's lock was freed {freed:?} after the store answered again: its session was left to expire"
    );
    assert_eq!(store.session_info(&first.session).await.unwrap(), None);
    assert_eq!(
        store.session_info(&first.leader_session).await.unwrap(),
        None
    );

    shutdown.cancel();
    a.await.unwrap();
}

/// A session's TTL runs from when the store made it, not from when the answer came back: a
/// leader whose session's creation was answered most of a TTL late, and which is then cut off
/// from the store (so that it cannot see the leader lock go either), steps down before the store expires that session and a standby takes
/// over. Before, it counted the TTL from the answer and led on for seconds beside the new
/// leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_session_was_answered_late_steps_down_before_a_standby_leads() {
    use std::sync::Mutex;
    use tokio::time::Instant;

    let (_dir, store) = sqlite_store().await;
    let severable = Severable::new(store.clone());
    let shutdown = CancellationToken::new();
    severable.answer_next_creation_late(config("a").session_ttl * 4 / 5);
    let a_began = Arc::new(AtomicUsize::new(0));
    let a_ended = Arc::new(Mutex::new(None));
    let (began, ended) = (a_began.clone(), a_ended.clone());
    let a = tokio::spawn(leader::campaign(
        severable.clone(),
        config("a"),
        || Ok(()),
        shutdown.clone(),
        move |term: Term| {
            began.fetch_add(1, Ordering::SeqCst);
            let ended = ended.clone();
            async move {
                term.cancel.cancelled().await;
                ended.lock().unwrap().get_or_insert(Instant::now());
            }
        },
    ));
    wait_for(async || a_began.load(Ordering::SeqCst) > 0).await;
    severable.cut();
    severable.cut_watches();
    let b_began = Arc::new(Mutex::new(None));
    let began = b_began.clone();
    let b = tokio::spawn(leader::campaign(
        store.clone(),
        config("b"),
        || Ok(()),
        shutdown.clone(),
        move |term: Term| {
            began.lock().unwrap().get_or_insert(Instant::now());
            async move { term.cancel.cancelled().await }
        },
    ));
    wait_for(async || b_began.lock().unwrap().is_some()).await;
    wait_for(async || a_ended.lock().unwrap().is_some()).await;
    let b_began = b_began.lock().unwrap().unwrap();
    let a_ended = a_ended.lock().unwrap().unwrap();
    assert!(
        a_ended <= b_began,
        "a led on {:?} after b began to lead",
        a_ended - b_began
    );

    shutdown.cancel();
    a.await.unwrap();
    b.await.unwrap();
}

/// A server whose every term ends at once (a farm that fails as it starts) bids ever less
/// often, the pauses between its sessions doubling (by the backoff's jitter, the fourth is
/// 2 s at least). Before, each new session reset the backoff, and it bid, led and stepped
/// down every 0.25 to 0.5 s for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_terms_end_at_once_bids_ever_less_often() {
    use std::sync::Mutex;
    use tokio::time::Instant;

    let (_dir, store) = sqlite_store().await;
    let shutdown = CancellationToken::new();
    let began = Arc::new(Mutex::new(Vec::new()));
    let terms = began.clone();
    // No lock-delay, whose wait would blur the pauses the test measures.
    let config = LeaderConfig {
        lock_delay: Duration::ZERO,
        ..config("a")
    };
    let a = tokio::spawn(leader::campaign(
        store,
        config,
        || Ok(()),
        shutdown.clone(),
        move |term: Term| {
            terms.lock().unwrap().push(Instant::now());
            async move { term.cancel.cancel() }
        },
    ));
    wait_for(async || began.lock().unwrap().len() >= 5).await;
    let began = began.lock().unwrap().clone();
    let gap = began[4] - began[3];
    assert!(
        gap >= Duration::from_secs(2),
        "the fifth term began {gap:?} after the fourth: {:?}",
        began.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>()
    );

    shutdown.cancel();
    a.await.unwrap();
}

/// Farms that stop before their term ends (a panic outside any one farm, say) end the term:
/// the server steps down, freeing the leader lock, rather than leading on with nothing
/// reconciling and no standby able to take over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn farms_that_stop_before_their_term_ends_end_it() {
    let (_dir, store) = sqlite_store().await;
    let shutdown = CancellationToken::new();
    let terms = Arc::new(AtomicUsize::new(0));
    let began = terms.clone();
    let a = tokio::spawn(leader::campaign(
        store.clone(),
        config("a"),
        || Ok(()),
        shutdown.clone(),
        move |term: Term| {
            began.fetch_add(1, Ordering::SeqCst);
            async move {
                drop(term);
                panic!("the farms failed to start");
            }
        },
    ));
    // The first term ended, and the server bid again.
    wait_for(async || terms.load(Ordering::SeqCst) >= 2).await;

    shutdown.cancel();
    a.await.unwrap();
}

/// Waits until `holder` holds the leader lock of `store`.
async fn wait_for_leader(store: &dyn KvStore, holder: &str) {
    wait_for(async || {
        let leader = current_leader(store).await.unwrap();
        leader.is_some_and(|leader| leader.holder == holder)
    })
    .await;
}

/// Runs a server's campaign as `holder` over `store` with the farms on a mirror of it (its
/// tree watches counted lost after `lost_after`), as the server does, until `shutdown`;
/// gives the mirror.
fn campaign_with_farms(
    store: Arc<dyn KvStore>,
    holder: &'static str,
    lost_after: Duration,
    shutdown: &CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> Mirror {
    let following = MirrorConfig {
        lost_after,
        ..MirrorConfig::default()
    };
    let mirror = Mirror::new(store.clone(), following);
    mirror.start(tasks, shutdown.clone());
    let alerts = Arc::new(Alerter::new(None));
    let farm_store = store.clone();
    let farm_mirror = mirror.clone();
    let lead = move |term: Term| {
        let options = FarmOptions::default();
        let (store, mirror) = (farm_store.clone(), farm_mirror.clone());
        farms::run_term(store, mirror, term, alerts.clone(), holder.into(), options)
    };
    let ready = {
        let mirror = mirror.clone();
        move || farms::could_lead(&mirror)
    };
    tasks.spawn(leader::campaign(
        store,
        config(holder),
        ready,
        shutdown.clone(),
        lead,
    ));
    mirror
}

/// The leader's mirror loses a tree's watch (its agent's blocking queries fail, say) while
/// its sessions and writes go on: the farms do not act on a tree known to be behind, so
/// leading on would hold the lock while nothing reconciles. The leader steps down, and a
/// server whose mirror follows the store takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_mirror_has_lost_the_store_steps_down() {
    let (_dir, store) = sqlite_store().await;
    let (shutdown, tasks) = (
        CancellationToken::new(),
        tokio_util::task::TaskTracker::new(),
    );
    let blind = Counting::new(store.clone());
    let lost_after = Duration::from_secs(1);
    campaign_with_farms(blind.clone(), "a", lost_after, &shutdown, &tasks);
    wait_for(async || current_leader(&*store).await.unwrap().is_some()).await;
    campaign_with_farms(store.clone(), "b", lost_after, &shutdown, &tasks);

    blind.fail_watches_of(Some("labels/pod/"));
    wait_for_leader(&*store, "b").await;
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
}

/// A server whose mirror has lost the store does not bid for leadership until it follows
/// the store again: it would take the lock only to step down a second later, again and
/// again, keeping out any server whose mirror follows the store. Before, it stepped down
/// and bid again after its pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_mirror_has_lost_the_store_bids_only_once_it_follows_again() {
    let (_dir, store) = sqlite_store().await;
    let (shutdown, tasks) = (
        CancellationToken::new(),
        tokio_util::task::TaskTracker::new(),
    );
    let blind = Counting::new(store.clone());
    blind.fail_watches_of(Some("labels/pod/"));
    let mirror = campaign_with_farms(
        blind.clone(),
        "a",
        Duration::from_secs(1),
        &shutdown,
        &tasks,
    );
    wait_for(async || farms::could_lead(&mirror).is_err()).await;
    // Whatever term it won before its mirror counted the tree lost has ended.
    wait_for(async || current_leader(&*store).await.unwrap().is_none()).await;

    // Several of its pauses between bids (half a second, doubling), and it does not lead.
    for _ in 0..40 {
        let leader = current_leader(&*store).await.unwrap();
        assert!(
            leader.is_none(),
            "a server blind to the store leads: {leader:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Its watch answers again, at the next change of the tree.
    blind.fail_watches_of(None);
    let label = "labels/pod/n1/unscheduled";
    store.put(label, b"{}", Cas::Any).await.unwrap();
    wait_for_leader(&*store, "a").await;
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
}

/// A server that steps down as its mirror loses the store, and cannot end its sessions then,
/// ends them once the store answers again even while it may not lead: their locks (the
/// leader lock among them) would otherwise keep out a server that could lead until the store
/// expired them. Before, it ended them only once it could lead again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_a_step_down_could_not_end_are_ended_while_the_server_may_not_lead() {
    let (_dir, store) = sqlite_store().await;
    let severable = Severable::new(store.clone());
    let shutdown = CancellationToken::new();
    let config = LeaderConfig {
        session_ttl: Duration::from_secs(30),
        ..config("a")
    };
    let ttl = config.session_ttl;
    let could_lead = Arc::new(AtomicBool::new(true));
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (ready, began, farms_see) = (could_lead.clone(), terms.clone(), could_lead.clone());
    let a = tokio::spawn(leader::campaign(
        severable.clone(),
        config,
        move || {
            if ready.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err("the mirror has lost the store".into())
            }
        },
        shutdown.clone(),
        move |term: Term| {
            began.lock().unwrap().push(term.clone());
            let farms_see = farms_see.clone();
            // The farms end their term once the server could no longer lead.
            async move {
                while farms_see.load(Ordering::SeqCst) && !term.cancel.is_cancelled() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        },
    ));
    wait_for(async || !terms.lock().unwrap().is_empty()).await;
    let first: Term = terms.lock().unwrap()[0].clone();
    let lock = "lock/replication_controllers/x";
    assert!(store.acquire(lock, b"a", &first.session).await.unwrap());

    // Cut off from the store, its mirror loses it and its term ends; it cannot end its
    // sessions.
    severable.cut();
    could_lead.store(false, Ordering::SeqCst);
    wait_for(async || first.cancel.is_cancelled()).await;
    let expiry = severable.last_renewal(&first.leader_session) + ttl;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(current_leader(&*store).await.unwrap().is_some());

    // The store answers again; the server's mirror has yet to follow it.
    severable.mend();
    wait_for(async || current_leader(&*store).await.unwrap().is_none()).await;
    let freed = tokio::time::Instant::now();
    assert!(
        freed < expiry,
        "the leader lock was freed only {:?} after the old leader session's expiry: its \
         sessions were left to expire",
        freed - expiry
    );
    assert_eq!(store.session_info(&first.session).await.unwrap(), None);
    assert_eq!(store.get(lock).await.unwrap(), None);
    assert_eq!(terms.lock().unwrap().len(), 1, "it led while it could not");

    shutdown.cancel();
    a.await.unwrap();
}

/// A server asked to stop while sessions its step-down could not end wait for the next
/// attempt (here: the store answers again just as the stop comes, while the server waits to
/// be able to lead) ends them before it stops. Before, it stopped without trying again,
/// leaving the leader lock and the farms' locks to the store's expiry of the sessions: the
/// next leader waited a TTL and the lock-delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopping_ends_the_sessions_its_step_down_could_not_end() {
    let (_dir, store) = sqlite_store().await;
    let severable = Severable::new(store.clone());
    let shutdown = CancellationToken::new();
    let stopping = Arc::new(AtomicBool::new(false));
    let ready = {
        let (severable, shutdown, stopping) =
            (severable.clone(), shutdown.clone(), stopping.clone());
        move || {
            if !stopping.load(Ordering::SeqCst) {
                return Ok(());
            }
            // The store answers again, and the server is asked to stop, while it waits.
            severable.mend();
            shutdown.cancel();
            Err("the mirror has lost the store".to_owned())
        }
    };
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let began = terms.clone();
    let a = tokio::spawn(leader::campaign(
        severable.clone(),
        config("a"),
        ready,
        shutdown.clone(),
        move |term: Term| {
            began.lock().unwrap().push(term.clone());
            async move { term.cancel.cancelled().await }
        },
    ));
    wait_for(async || !terms.lock().unwrap().is_empty()).await;
    let first: Term = terms.lock().unwrap()[0].clone();
    let lock = "lock/replication_controllers/x";
    assert!(store.acquire(lock, b"a", &first.session).await.unwrap());

    // The store stops answering and the term ends (its mirror lost the store, say): the
    // step-down cannot end the sessions.
    severable.cut();
    stopping.store(true, Ordering::SeqCst);
    first.cancel.cancel();
    a.await.unwrap();

    assert_eq!(current_leader(&*store).await.unwrap(), None);
    assert_eq!(store.get(lock).await.unwrap(), None);
    assert_eq!(
        store.session_info(&first.leader_session).await.unwrap(),
        None
    );
    assert_eq!(store.session_info(&first.session).await.unwrap(), None);
}
