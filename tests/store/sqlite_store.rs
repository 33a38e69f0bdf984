//! What only the embedded store promises: several servers may share one database file.

use std::sync::Arc;
use std::time::{Duration, Instant};

use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{Cas, KvStore, SessionSpec, StoreError, TxnOp, WatchTarget};

async fn two_stores_on_one_file() -> (tempfile::TempDir, Arc<SqliteStore>, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db").display().to_string();
    let a = SqliteStore::open(&path).await.unwrap();
    let b = SqliteStore::open(&path).await.unwrap();
    (dir, Arc::new(a), Arc::new(b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_file_stay_cas_correct() {
    let (_dir, a, b) = two_stores_on_one_file().await;
    a.put("counter", b"0", Cas::Index(0)).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store: Arc<dyn KvStore> = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                loop {
                    let pair = store.get("counter").await.unwrap().unwrap();
                    let n: u64 = String::from_utf8(pair.value.to_vec())
                        .unwrap()
                        .parse()
                        .unwrap();
                    let next = (n + 1).to_string();
                    match store
                        .put("counter", next.as_bytes(), Cas::Index(pair.modify_index))
                        .await
                    {
                        Ok(()) => break,
                        Err(StoreError::Conflict { .. }) => continue,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(&*b.get("counter").await.unwrap().unwrap().value, b"200");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_see_the_other_stores_writes() {
    let (_dir, a, b) = two_stores_on_one_file().await;
    a.put("tree/x", b"1", Cas::Any).await.unwrap();
    let index = b.list("tree/").await.unwrap().index;
    let watcher = b.clone();
    let waiter = tokio::spawn(async move {
        let target = WatchTarget::Prefix("tree/".into());
        let snapshot = watcher
            .watch(&target, index, Duration::from_secs(30))
            .await
            .unwrap();
        (snapshot, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.delete("tree/x", Cas::Any).await.unwrap();
    let deleted = Instant::now();
    let (snapshot, woke) = waiter.await.unwrap();
    assert!(snapshot.index > index);
    assert!(snapshot.pairs.is_empty());
    assert!(woke.saturating_duration_since(deleted) < Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_exclusive_across_stores() {
    let (_dir, a, b) = two_stores_on_one_file().await;
    let spec = SessionSpec::deleting("farm", Duration::from_secs(10));
    let sa = a.create_session(&spec).await.unwrap();
    let sb = b.create_session(&spec).await.unwrap();
    assert!(a.acquire("lock/leader", b"a", &sa).await.unwrap());
    assert!(!b.acquire("lock/leader", b"b", &sb).await.unwrap());
    a.destroy_session(&sa).await.unwrap();
    assert!(b.acquire("lock/leader", b"b", &sb).await.unwrap());
}

#[tokio::test]
async fn state_and_index_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p2.db").display().to_string();
    let store = SqliteStore::open(&path).await.unwrap();
    store.put("a", b"1", Cas::Any).await.unwrap();
    store.put("b", b"2", Cas::Any).await.unwrap();
    let before = store.list("").await.unwrap().index;
    drop(store);
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(&*store.get("a").await.unwrap().unwrap().value, b"1");
    store.put("c", b"3", Cas::Any).await.unwrap();
    let after = store.get("c").await.unwrap().unwrap().modify_index;
    assert!(after > before);
}

/// When `session` expires, as the file holds it.
async fn expiry(conn: &mut sqlx::SqliteConnection, session: &str) -> i64 {
    sqlx::query_scalar("SELECT expires_at_ms FROM sessions WHERE id = ?1")
        .bind(session)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Another connection to the file at `path` that makes a batch deleting the key `x` fail
/// as it is written (a trigger), then holds the file's write lock: the transactions started
/// next queue behind it, in order, and go into one batch once it commits.
async fn holding_the_file_and_refusing_to_delete_x(path: &str) -> sqlx::SqliteConnection {
    use sqlx::Connection;
    let mut other = sqlx::SqliteConnection::connect(&format!("sqlite://{path}"))
        .await
        .unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse BEFORE DELETE ON kv WHEN OLD.key = X'78'
         BEGIN SELECT RAISE(ABORT, 'refused'); END",
    )
    .execute(&mut other)
    .await
    .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    other
}

/// A renewal is answered only once the batch it went into is durable: when a later write of
/// the same batch fails and the batch is rolled back, the renewal is rolled back with it and
/// must not be answered as done, or a leader would count on a TTL the store does not hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_rolled_back_with_its_batch_is_not_answered_as_done() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.db").display().to_string();
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let spec = SessionSpec::deleting("leader", Duration::from_secs(60));
    let session = store.create_session(&spec).await.unwrap();
    store.put("x", b"1", Cas::Any).await.unwrap();
    // The renewal and then a write deleting `x` go into one batch, which fails.
    let mut other = holding_the_file_and_refusing_to_delete_x(&path).await;
    let before = expiry(&mut other, &session).await;
    let renewing = {
        let (store, session) = (store.clone(), session.clone());
        tokio::spawn(async move { store.renew_session(&session).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let failing = {
        let store = store.clone();
        tokio::spawn(async move {
            let ops = [
                TxnOp::Set {
                    key: "a".into(),
                    value: b"1".to_vec(),
                },
                TxnOp::Delete { key: "x".into() },
            ];
            store.txn(&ops).await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();

    let failed = failing.await.unwrap();
    assert!(
        matches!(failed, Err(StoreError::Unavailable(_))),
        "{failed:?}"
    );
    let renewed = renewing.await.unwrap();
    let after = expiry(&mut other, &session).await;
    assert!(
        renewed.is_err() || after > before,
        "renewal answered {renewed:?}, but the session still expires at {after} (was {before})"
    );
}

/// The store lives in the file named, whatever its name holds: a `%` or a `?` in it is not
/// read as a URL's escape or query, which would open, or create, another file.
#[tokio::test]
async fn the_store_is_in_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["100%41.db", "what?.db", "a%3Fmode=ro.db"] {
        let path = dir.path().join(name);
        let store = SqliteStore::open(&path.display().to_string()).await;
        let store = store.unwrap_or_else(|e| panic!("{name}: {e}"));
        store.put("k", b"v", Cas::Any).await.unwrap();
        store.shut_down().await;
        drop(store);
        assert!(path.exists(), "{name}: no such file");
    }
    let mut files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".db"))
        .collect();
    files.sort();
    assert_eq!(files, ["100%41.db", "a%3Fmode=ro.db", "what?.db"]);
}

/// Servers starting together on a fresh file all open it: each race to make the schema (the
/// file's turn to WAL mode, each migration) has losers, who find it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn servers_starting_together_on_a_fresh_file_all_open_it() {
    for _ in 0..30 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.db").display().to_string();
        let opening = (0..4).map(|_| {
            let path = path.clone();
            tokio::spawn(async move { SqliteStore::open(&path).await.map(drop) })
        });
        for opened in futures::future::join_all(opening).await {
            opened.unwrap().unwrap();
        }
    }
}

/// A transaction whose check fails against a write of its batch that is not yet durable
/// fails as that write does: when the batch is rolled back, the check failed on nothing the
/// store ever held, and a conflict (a create told the key exists) would be a wrong answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_failed_on_a_write_rolled_back_with_its_batch_is_no_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.db").display().to_string();
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    store.put("x", b"1", Cas::Any).await.unwrap();
    // Both creates go into one batch, which fails on the first's delete of `x`.
    let mut other = holding_the_file_and_refusing_to_delete_x(&path).await;
    let run = |ops: Vec<TxnOp>| {
        let store = store.clone();
        tokio::spawn(async move { store.txn(&ops).await })
    };
    let creating = run(vec![
        TxnOp::Cas {
            key: "a".into(),
            value: b"1".to_vec(),
            index: 0,
        },
        TxnOp::Delete { key: "x".into() },
    ]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let creating_too = run(vec![TxnOp::Cas {
        key: "a".into(),
        value: b"2".to_vec(),
        index: 0,
    }]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();

    let created = creating.await.unwrap();
    assert!(
        matches!(created, Err(StoreError::Unavailable(_))),
        "{created:?}"
    );
    let second = creating_too.await.unwrap();
    let stored = store.get("a").await.unwrap();
    assert!(
        !matches!(second, Err(StoreError::Conflict { .. })) || stored.is_some(),
        "the second create was told {second:?}, but the store holds {stored:?}"
    );
}

/// A release that finds its key deleted by a write of its batch not yet durable answers as
/// that write fails: when the batch is rolled back, the key is still held, and "not held"
/// would be a wrong answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_key_deleted_by_a_write_rolled_back_is_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.db").display().to_string();
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let spec = SessionSpec::deleting("farm", Duration::from_secs(60));
    let session = store.create_session(&spec).await.unwrap();
    assert!(store.acquire("lock/k", b"held", &session).await.unwrap());
    store.put("x", b"1", Cas::Any).await.unwrap();
    // The delete and then the release go into one batch, which fails on deleting `x`.
    let mut other = holding_the_file_and_refusing_to_delete_x(&path).await;
    let deleting = {
        let store = store.clone();
        tokio::spawn(async move {
            let ops = [
                TxnOp::Delete {
                    key: "lock/k".into(),
                },
                TxnOp::Delete { key: "x".into() },
            ];
            store.txn(&ops).await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let releasing = {
        let (store, session) = (store.clone(), session.clone());
        tokio::spawn(async move { store.release("lock/k", &session).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();

    let deleted = deleting.await.unwrap();
    assert!(
        matches!(deleted, Err(StoreError::Unavailable(_))),
        "{deleted:?}"
    );
    let released = releasing.await.unwrap();
    let held = store.get("lock/k").await.unwrap();
    let holder = held.as_ref().and_then(|pair| pair.session());
    assert!(
        !matches!(released, Ok(false)) || holder != Some(session.as_str()),
        "the release was refused, but the key is held by its session: {held:?}"
    );
}

/// A relative store path that begins `file:` is the file of that name in the working
/// directory, as any other relative path is, not a URI naming another file.
#[test]
fn a_relative_path_beginning_file_colon_is_the_file_named() {
    let dir = started_on("file:kv.db");
    assert!(dir.path().join("file:kv.db").metadata().unwrap().len() > 0);
    assert!(!dir.path().join("kv.db").exists(), "kv.db opened instead");
}

/// The store path `:memory:` is the file of that name in the working directory, as any
/// other relative path is, not SQLite's in-memory database, whose every write a stopped
/// server would lose (the file named was created, and left empty).
#[test]
fn the_path_colon_memory_colon_is_the_file_named() {
    let dir = started_on(":memory:");
    let file = dir.path().join(":memory:");
    assert!(file.metadata().unwrap().len() > 0, "{file:?} left empty");
}

/// A folder in which the binary started serving, without farms, on the embedded store at
/// `path` (relative to the folder), and was then killed.
fn started_on(path: &str) -> tempfile::TempDir {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_p2-apiserver"))
        .args(["serve", "--no-farms", "--listen", "127.0.0.1:0"])
        .args(["--store", &format!("sqlite://{path}")])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(server.stdout.take().unwrap());
    let listening = stdout
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("listening on"));
    let _ = server.kill();
    let _ = server.wait();
    assert!(listening, "the server did not start");
    dir
}
