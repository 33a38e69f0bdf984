//! The Consul backend's connection budget, against the fake agent: how many requests it has
//! in flight at once, and what a request that finds the budget spent answers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use p2_apiserver::kv::consul::{ConsulConfig, ConsulStore, ConsulTimeouts};
use p2_apiserver::kv::sent::{self, Sent};
use p2_apiserver::kv::{Cas, KvStore, Listing, SessionSpec, StoreResult, TxnOp, WatchTarget};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::fake_consul::{self, FakeConsul};

fn config(addr: &str) -> ConsulConfig {
    ConsulConfig {
        base_url: format!("http://{addr}"),
        token: None,
        datacenter: None,
    }
}

async fn burst_of_puts(store: &Arc<ConsulStore>, count: usize) {
    let puts = (0..count).map(|i| {
        let store = store.clone();
        async move { store.put(&format!("burst/{i}"), b"x", Cas::Any).await }
    });
    for result in join_all(puts).await {
        result.unwrap();
    }
}

/// A watch of a key woken promptly by its change to "1".
async fn assert_woken(watch: JoinHandle<StoreResult<Listing>>) {
    let woken = tokio::time::timeout(Duration::from_secs(5), watch)
        .await
        .expect("a watch wakes at its key's change")
        .unwrap()
        .unwrap();
    assert_eq!(&woken.pairs[0].value[..], b"1");
}

/// A fake agent and a client of it with a budget of `max_connections`.
async fn fake_with_budget(max_connections: usize) -> (FakeConsul, Arc<ConsulStore>) {
    let fake = fake_consul::start().await;
    let timeouts = ConsulTimeouts::default();
    let store =
        ConsulStore::with_limits(config(&fake.addr.to_string()), timeouts, max_connections, 0);
    (fake, Arc::new(store.unwrap()))
}

fn assert_peak_within(fake: &FakeConsul, budget: usize) {
    let peak = fake.in_flight.peak();
    assert!(peak <= budget, "{peak} requests were in flight at once");
}

#[tokio::test]
async fn watches_and_a_burst_of_writes_stay_within_the_default_budget() {
    let fake = fake_consul::start().await;
    let store = Arc::new(ConsulStore::new(config(&fake.addr.to_string())).unwrap());
    store.put("watched", b"0", Cas::Any).await.unwrap();
    let index = store.get("watched").await.unwrap().unwrap().modify_index;

    // More blocking queries than the mirror and the API's clients would hold, beside a
    // burst of writes as the farms make; then the change that wakes the watches.
    let target = WatchTarget::Key("watched".into());
    let watches = (0..200).map(|_| store.watch(&target, index, Duration::from_secs(20)));
    let writes = async {
        burst_of_puts(&store, 300).await;
        store.put("watched", b"1", Cas::Any).await.unwrap();
    };
    let (watched, ()) = tokio::join!(join_all(watches), writes);
    for result in watched {
        assert_eq!(&result.unwrap().pairs[0].value[..], b"1");
    }

    // 128 by default, well under an agent's `limits.http_max_conns_per_client` of 200.
    assert_peak_within(&fake, 128);
}

#[tokio::test]
async fn watches_and_writes_share_a_small_budget_without_starving_each_other() {
    let (fake, store) = fake_with_budget(8).await;
    // Two watches fill the quarter kept for the server's own.
    let mut watches = Vec::new();
    for key in ["watched/a", "watched/b"] {
        store.put(key, b"0", Cas::Any).await.unwrap();
        let index = store.get(key).await.unwrap().unwrap().modify_index;
        let store = store.clone();
        watches.push(tokio::spawn(async move {
            store
                .watch(
                    &WatchTarget::Key(key.into()),
                    index,
                    Duration::from_secs(30),
                )
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Writes go on beside the held watches, and never past the budget.
    let started = Instant::now();
    burst_of_puts(&store, 100).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    // The burst did not hold the watches back: each wakes at its key's change.
    for key in ["watched/a", "watched/b"] {
        store.put(key, b"1", Cas::Any).await.unwrap();
    }
    for watch in watches {
        assert_woken(watch).await;
    }
    assert_peak_within(&fake, 8);
}

#[tokio::test]
async fn a_write_queued_behind_a_spent_budget_is_withdrawn_when_its_caller_gives_up() {
    // An agent that takes connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counting = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counting.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    // Three connections: the server's watches', its clients' and everything else's.
    let store = Arc::new(
        ConsulStore::with_limits(config(&addr.to_string()), ConsulTimeouts::default(), 3, 0)
            .unwrap(),
    );
    let hung = {
        let store = store.clone();
        tokio::spawn(async move { store.put("hung", b"x", Cas::Any).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A request's deadline cuts the write while it waits for the connection.
    let sent = Arc::new(Sent::default());
    let queued = tokio::time::timeout(
        Duration::from_millis(300),
        store.put("queued", b"x", Cas::Any),
    );
    let cut = sent::scope(sent.clone(), queued).await;
    assert!(cut.is_err(), "{cut:?}");

    // Never sent, so nothing is unknown about it.
    assert!(sent.all_withdrawn(), "the queued write was taken");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "the queued write was sent"
    );
    assert!(
        !hung.is_finished(),
        "the first write still holds the connection"
    );
    hung.abort();
}

#[tokio::test]
async fn clients_blocking_queries_do_not_hold_back_the_servers_own_watches() {
    let (fake, store) = fake_with_budget(8).await;
    for key in ["clients", "mirrored"] {
        store.put(key, b"0", Cas::Any).await.unwrap();
    }
    let at = |key: &'static str| {
        let store = store.clone();
        async move { store.get(key).await.unwrap().unwrap().modify_index }
    };
    // Clients' blocking queries (made inside a request's scope), more than their share.
    let clients_at = at("clients").await;
    let mut clients = Vec::new();
    for _ in 0..5 {
        let store = store.clone();
        clients.push(tokio::spawn(sent::scope(
            Arc::new(Sent::default()),
            async move {
                let target = WatchTarget::Key("clients".into());
                store
                    .watch(&target, clients_at, Duration::from_secs(30))
                    .await
            },
        )));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The mirror's watch is still sent, and wakes at its key's change.
    let mirrored_at = at("mirrored").await;
    let mirror = {
        let store = store.clone();
        tokio::spawn(async move {
            let target = WatchTarget::Key("mirrored".into());
            store
                .watch(&target, mirrored_at, Duration::from_secs(30))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    store.put("mirrored", b"1", Cas::Any).await.unwrap();
    assert_woken(mirror).await;
    assert_peak_within(&fake, 8);
    for client in clients {
        client.abort();
    }
}

#[tokio::test]
async fn waiting_for_a_connection_counts_against_a_requests_time_limit() {
    // An agent that takes connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let limit = Duration::from_secs(2);
    let timeouts = ConsulTimeouts {
        request: limit,
        ..ConsulTimeouts::default()
    };
    // One connection for requests, which a first write holds until its limit.
    let store =
        Arc::new(ConsulStore::with_limits(config(&addr.to_string()), timeouts, 3, 0).unwrap());
    let first = {
        let store = store.clone();
        tokio::spawn(async move { store.put("first", b"x", Cas::Any).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A second write waits for that connection, then for its own answer: it is given up
    // within its limit, not after the first's limit and then its own.
    let started = Instant::now();
    let second = store.put("second", b"x", Cas::Any).await;
    let took = started.elapsed();
    assert!(second.is_err(), "{second:?}");
    assert!(
        took < limit + limit / 2,
        "the second write was given up after {took:?}, its limit being {limit:?}"
    );
    first.abort();
}

/// Session renewals keep a connection of their own: a leader whose farms' transactions hold
/// every other connection (a Consul slow to commit them, while a renewal, which Consul
/// answers without a commit, stays quick) still renews its sessions, rather than stepping
/// down for want of a connection its own writes hold.
#[tokio::test]
async fn a_session_renewal_is_sent_while_writes_hold_every_other_connection() {
    let (fake, store) = fake_with_budget(4).await;
    let spec = SessionSpec::deleting("leader", Duration::from_secs(30));
    let session = store.create_session(&spec).await.unwrap();

    // More transactions than there are connections for requests, each held by the agent
    // (for longer than the test waits: the requests' time limit is 30 s).
    fake.txns.hold(true);
    let writes: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let set = TxnOp::Set {
                    key: format!("farm/{i}"),
                    value: b"x".to_vec(),
                };
                store.txn(&[set]).await
            })
        })
        .collect();
    fake.txns.holding(1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let renewal = tokio::time::timeout(Duration::from_secs(10), store.renew_session(&session));
    let renewed = renewal.await;
    fake.txns.hold(false);
    for write in writes {
        write.await.unwrap().unwrap();
    }
    let renewed = renewed.expect("the renewal waited for a connection the writes held");
    assert_eq!(renewed.unwrap().id, session);
    assert_peak_within(&fake, 4);
}
