//! The Consul backend against recorded Consul HTTP exchanges: what it sends and how it
//! reads the answers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use p2_apiserver::kv::consul::{ConsulConfig, ConsulStore, ConsulTimeouts};
use p2_apiserver::kv::{
    Cas, KvPair, KvStore, Lock, SessionBehavior, SessionSpec, StoreError, TxnFailure, TxnOp,
    WatchTarget, MAX_VALUE_BYTES,
};
use serde_json::json;
use wiremock::matchers::{
    body_json, body_string, header, method, path, query_param, query_param_is_missing,
};
use wiremock::{Mock, MockBuilder, MockServer, Request, Respond, ResponseTemplate};

fn config(server: &MockServer) -> ConsulConfig {
    ConsulConfig {
        base_url: server.uri(),
        token: None,
        datacenter: None,
    }
}

fn store(server: &MockServer) -> ConsulStore {
    ConsulStore::new(config(server)).unwrap()
}

/// `Value` is base64 in every KV answer.
fn entry(key: &str, value: &str, modify_index: u64) -> serde_json::Value {
    use base64::Engine as _;
    json!({
        "Key": key,
        "Value": base64::engine::general_purpose::STANDARD.encode(value),
        "CreateIndex": 3,
        "ModifyIndex": modify_index,
        "LockIndex": 0,
        "Flags": 0,
        "Session": null,
    })
}

fn pair(key: &str, value: &str, modify_index: u64) -> KvPair {
    KvPair {
        key: key.into(),
        value: value.as_bytes().into(),
        create_index: 3,
        modify_index,
        lock: None,
    }
}

fn kv_answer(index: u64, body: serde_json::Value) -> ResponseTemplate {
    ResponseTemplate::new(200)
        .insert_header("X-Consul-Index", index.to_string().as_str())
        .set_body_json(body)
}

/// Consul's answer to a transaction it rolled back: 409 with each failing op in `errors`.
fn rolled_back(errors: serde_json::Value) -> ResponseTemplate {
    ResponseTemplate::new(409).set_body_json(json!({"Results": null, "Errors": errors}))
}

fn missing(index: u64) -> ResponseTemplate {
    ResponseTemplate::new(404).insert_header("X-Consul-Index", index.to_string().as_str())
}

fn boolean(answer: bool) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_string(answer.to_string())
}

/// What a dropped connection looks like from the client: the request went out, no answer.
fn drop_connection(_: &Request) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection dropped")
}

async fn requests(server: &MockServer) -> Vec<Request> {
    server.received_requests().await.unwrap()
}

/// Expects the one consistent read with which the store learns whether a write whose
/// answer was lost landed.
async fn expect_check_read(server: &MockServer, key: &str, answer: ResponseTemplate) {
    Mock::given(method("GET"))
        .and(path(format!("/v1/kv/{key}")))
        .and(query_param("consistent", ""))
        .respond_with(answer)
        .expect(1)
        .mount(server)
        .await;
}

#[tokio::test]
async fn get_sends_token_and_datacenter_and_decodes_the_entry() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/labels/pod/node1/hello"))
        .and(header("X-Consul-Token", "secret"))
        .and(query_param("dc", "dc2"))
        .respond_with(kv_answer(
            42,
            json!([{
                "Key": "labels/pod/node1/hello", "Value": "aGVsbG8=", "CreateIndex": 7,
                "ModifyIndex": 42, "LockIndex": 2, "Flags": 0, "Session": "s-1"
            }]),
        ))
        .expect(1)
        .mount(&server)
        .await;
    let store = ConsulStore::new(ConsulConfig {
        token: Some("secret".into()),
        datacenter: Some("dc2".into()),
        ..config(&server)
    })
    .unwrap();

    let got = store.get("labels/pod/node1/hello").await.unwrap();

    assert_eq!(
        got,
        Some(KvPair {
            key: "labels/pod/node1/hello".into(),
            value: b"hello".as_slice().into(),
            create_index: 7,
            modify_index: 42,
            lock: Lock::of(2, Some("s-1".into())),
        })
    );
}

#[tokio::test]
async fn a_missing_key_is_none() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/rolls/nope"))
        .respond_with(missing(12))
        .mount(&server)
        .await;
    assert_eq!(store(&server).get("rolls/nope").await.unwrap(), None);
}

#[tokio::test]
async fn keys_are_percent_encoded_segment_by_segment() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/a%20b/c%3Fd%23e%25"))
        .respond_with(kv_answer(4, json!([entry("a b/c?d#e%", "", 4)])))
        .expect(1)
        .mount(&server)
        .await;
    let got = store(&server).get("a b/c?d#e%").await.unwrap().unwrap();
    assert_eq!(got.key, "a b/c?d#e%");
}

#[tokio::test]
async fn list_recurses_and_reads_the_index() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/intent/"))
        .and(query_param("recurse", ""))
        .respond_with(kv_answer(
            99,
            json!([entry("intent/n1/a", "x", 50), entry("intent/n2/b", "y", 60)]),
        ))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/empty/"))
        .and(query_param("recurse", ""))
        .respond_with(missing(0))
        .mount(&server)
        .await;
    let store = store(&server);

    let listing = store.list("intent/").await.unwrap();
    assert_eq!(listing.index, 99);
    assert_eq!(
        listing.pairs,
        vec![pair("intent/n1/a", "x", 50), pair("intent/n2/b", "y", 60)]
    );

    // Consul's blocking-query rules: an index of 0 is treated as 1.
    let empty = store.list("empty/").await.unwrap();
    assert_eq!((empty.index, empty.pairs), (1, vec![]));
}

/// Consul leaves out of a listing the keys the token may not read, and says so only in
/// `X-Consul-Results-Filtered-By-ACLs`: such a listing is not the tree, and is refused as the
/// token's fault rather than taken for a tree without those keys (by the mirror, the
/// farms, the API), whether listed, listed by key or watched.
#[tokio::test]
async fn a_listing_consul_filtered_by_acls_is_forbidden() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/intent/"))
        .respond_with(
            kv_answer(99, json!([entry("intent/n1/a", "x", 50)]))
                .insert_header("X-Consul-Results-Filtered-By-ACLs", "true"),
        )
        .mount(&server)
        .await;
    let store = store(&server);

    let listed = store.list("intent/").await;
    assert!(
        matches!(listed, Err(StoreError::Forbidden(_))),
        "{listed:?}"
    );
    let keys = store.keys("intent/", Some('/')).await;
    assert!(matches!(keys, Err(StoreError::Forbidden(_))), "{keys:?}");
    let target = WatchTarget::Prefix("intent/".into());
    let watched = store.watch(&target, 98, Duration::from_secs(1)).await;
    assert!(
        matches!(watched, Err(StoreError::Forbidden(_))),
        "{watched:?}"
    );
}

#[tokio::test]
async fn keys_send_the_separator() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/labels/"))
        .and(query_param("keys", ""))
        .and(query_param("separator", "/"))
        .respond_with(kv_answer(8, json!(["labels/node/", "labels/pod/"])))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/nothing/"))
        .and(query_param("keys", ""))
        .and(query_param_is_missing("separator"))
        .respond_with(missing(5))
        .expect(1)
        .mount(&server)
        .await;
    let store = store(&server);

    let (index, keys) = store.keys("labels/", Some('/')).await.unwrap();
    assert_eq!(
        (index, keys),
        (8, vec!["labels/node/".into(), "labels/pod/".into()])
    );
    assert_eq!(store.keys("nothing/", None).await.unwrap(), (5, vec![]));
}

#[tokio::test]
async fn put_sends_cas_and_a_false_answer_is_a_conflict() {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param("cas", "0"))
        .and(body_string("first"))
        .respond_with(boolean(true))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param("cas", "17"))
        .respond_with(boolean(false))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param_is_missing("cas"))
        .and(body_string("any"))
        .respond_with(boolean(true))
        .expect(1)
        .mount(&server)
        .await;
    let store = store(&server);

    store.put("rc/1", b"first", Cas::Index(0)).await.unwrap();
    let missed = store.put("rc/1", b"second", Cas::Index(17)).await;
    assert!(
        matches!(missed, Err(StoreError::Conflict { .. })),
        "{missed:?}"
    );
    store.put("rc/1", b"any", Cas::Any).await.unwrap();
}

#[tokio::test]
async fn delete_sends_cas_and_delete_prefix_recurses() {
    let server = MockServer::start().await;
    Mock::given(method("DELETE"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param("cas", "9"))
        .respond_with(boolean(false))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .and(path("/v1/kv/rc/2"))
        .and(query_param_is_missing("cas"))
        .respond_with(boolean(true))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .and(path("/v1/kv/intent/node1/"))
        .and(query_param("recurse", ""))
        .respond_with(boolean(true))
        .expect(1)
        .mount(&server)
        .await;
    let store = store(&server);

    let missed = store.delete("rc/1", Cas::Index(9)).await;
    assert!(
        matches!(missed, Err(StoreError::Conflict { .. })),
        "{missed:?}"
    );
    store.delete("rc/2", Cas::Any).await.unwrap();
    store.delete_prefix("intent/node1/").await.unwrap();
}

#[tokio::test]
async fn acquire_sends_the_session_and_reads_the_answer() {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path("/v1/kv/lock/rolls/r1"))
        .and(query_param("acquire", "sess-1"))
        .and(body_string("farm"))
        .respond_with(boolean(true))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/kv/lock/rolls/r1"))
        .and(query_param("acquire", "sess-1"))
        .respond_with(boolean(false))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/kv/lock/rolls/r2"))
        .and(query_param("acquire", "gone"))
        .respond_with(ResponseTemplate::new(500).set_body_string("invalid session \"gone\""))
        .expect(1)
        .mount(&server)
        .await;
    let store = store(&server);

    assert!(store
        .acquire("lock/rolls/r1", b"farm", "sess-1")
        .await
        .unwrap());
    assert!(!store
        .acquire("lock/rolls/r1", b"farm", "sess-1")
        .await
        .unwrap());
    let gone = store.acquire("lock/rolls/r2", b"", "gone").await;
    assert!(matches!(gone, Err(StoreError::NotFound(_))), "{gone:?}");
}

#[tokio::test]
async fn release_keeps_the_value_with_a_guarded_unlock() {
    let server = MockServer::start().await;
    let held = json!([{
        "Key": "lock/rc/1", "Value": "ZmFybQ==", "CreateIndex": 3, "ModifyIndex": 30,
        "LockIndex": 1, "Flags": 0, "Session": "sess-1"
    }]);
    Mock::given(method("GET"))
        .and(path("/v1/kv/lock/rc/1"))
        .respond_with(kv_answer(30, held))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/txn"))
        .and(body_json(json!([
            {"KV": {"Verb": "check-index", "Key": "lock/rc/1", "Index": 30}},
            {"KV": {"Verb": "unlock", "Key": "lock/rc/1", "Value": "ZmFybQ==", "Session": "sess-1"}},
        ])))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "Results": [
                {"KV": {"Key": "lock/rc/1", "Value": null, "CreateIndex": 3, "ModifyIndex": 30, "LockIndex": 1}},
                {"KV": {"Key": "lock/rc/1", "Value": null, "CreateIndex": 3, "ModifyIndex": 31, "LockIndex": 1}},
            ],
            "Errors": null,
        })))
        .expect(1)
        .mount(&server)
        .await;
    let store = store(&server);

    assert!(store.release("lock/rc/1", "sess-1").await.unwrap());
    // Held by another session: nothing is written.
    assert!(!store.release("lock/rc/1", "sess-2").await.unwrap());
}

#[tokio::test]
async fn txn_sends_consul_verbs_and_lines_results_up_with_ops() {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path("/v1/txn"))
        .and(query_param("dc", "east"))
        .and(body_json(json!([
            {"KV": {"Verb": "set", "Key": "a", "Value": "MQ=="}},
            {"KV": {"Verb": "delete", "Key": "b"}},
            {"KV": {"Verb": "get", "Key": "c"}},
            {"KV": {"Verb": "delete-cas", "Key": "d", "Index": 0}},
            {"KV": {"Verb": "cas", "Key": "e", "Value": "", "Index": 0}},
            {"KV": {"Verb": "delete-cas", "Key": "f", "Index": 4}},
            {"KV": {"Verb": "lock", "Key": "g", "Value": "", "Session": "s"}},
            {"KV": {"Verb": "check-session", "Key": "g", "Session": "s"}},
        ])))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "Results": [
                {"KV": {"Key": "a", "Value": null, "CreateIndex": 3, "ModifyIndex": 50, "LockIndex": 0, "Flags": 0}},
                {"KV": entry("c", "stored", 20)},
                {"KV": {"Key": "e", "Value": null, "CreateIndex": 3, "ModifyIndex": 50, "LockIndex": 0, "Flags": 0}},
                {"KV": {"Key": "g", "Value": null, "CreateIndex": 3, "ModifyIndex": 50, "LockIndex": 1, "Flags": 0, "Session": "s"}},
                {"KV": {"Key": "g", "Value": null, "CreateIndex": 3, "ModifyIndex": 50, "LockIndex": 1, "Flags": 0, "Session": "s"}},
            ],
            "Errors": null,
        })))
        .expect(1)
        .mount(&server)
        .await;
    let store = ConsulStore::new(ConsulConfig {
        datacenter: Some("east".into()),
        ..config(&server)
    })
    .unwrap();
    let ops = [
        TxnOp::Set {
            key: "a".into(),
            value: b"1".to_vec(),
        },
        TxnOp::Delete { key: "b".into() },
        TxnOp::Get { key: "c".into() },
        TxnOp::CheckNotExists { key: "d".into() },
        TxnOp::Cas {
            key: "e".into(),
            value: vec![],
            index: 0,
        },
        TxnOp::DeleteCas {
            key: "f".into(),
            index: 4,
        },
        TxnOp::Lock {
            key: "g".into(),
            value: vec![],
            session: "s".into(),
        },
        TxnOp::CheckSession {
            key: "g".into(),
            session: "s".into(),
        },
    ];

    let results = store.txn(&ops).await.unwrap();

    let keys: Vec<Option<&str>> = results
        .iter()
        .map(|r| r.as_ref().map(|p| p.key.as_str()))
        .collect();
    assert_eq!(
        keys,
        [
            Some("a"),
            None,
            Some("c"),
            None,
            Some("e"),
            None,
            Some("g"),
            Some("g")
        ]
    );
    assert_eq!(
        &*results[0].as_ref().unwrap().value,
        b"1",
        "a write result carries its value"
    );
    assert_eq!(results[2], Some(pair("c", "stored", 20)));
    assert_eq!(results[6].as_ref().unwrap().session(), Some("s"));
}

#[tokio::test]
async fn a_rolled_back_txn_is_a_conflict_naming_each_failing_op() {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path("/v1/txn"))
        .respond_with(rolled_back(json!([
            {"OpIndex": 1, "What": "current modify index 7 does not match 3"},
        ])))
        .mount(&server)
        .await;
    let ops = [
        TxnOp::Set {
            key: "a".into(),
            value: vec![],
        },
        TxnOp::Cas {
            key: "b".into(),
            value: vec![],
            index: 3,
        },
    ];

    let err = store(&server).txn(&ops).await.unwrap_err();

    let StoreError::Conflict { failures, .. } = err else {
        panic!("not a conflict: {err:?}");
    };
    assert_eq!(
        failures,
        vec![TxnFailure {
            op_index: 1,
            what: "current modify index 7 does not match 3".into()
        }]
    );
}

/// Consul checks a txn's ACLs op by op and answers a denied write as a rolled-back op
/// (409, `What: "Permission denied"`, with details in later versions), not as a 403: no
/// retry can make it pass.
#[tokio::test]
async fn a_txn_consul_denies_by_acl_is_forbidden_not_a_conflict() {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path("/v1/txn"))
        .respond_with(rolled_back(json!([
            {"OpIndex": 0, "What": "Permission denied"},
            {"OpIndex": 1, "What": "Permission denied: token with AccessorID 'x' lacks permission 'key:write' on \"b\""},
        ])))
        .mount(&server)
        .await;
    let set = |key: &str| TxnOp::Set {
        key: key.into(),
        value: vec![],
    };
    let ops = [set("a"), set("b")];

    let err = store(&server).txn(&ops).await.unwrap_err();

    assert!(matches!(err, StoreError::Forbidden(_)), "{err:?}");
}

#[tokio::test]
async fn invalid_requests_are_refused_before_anything_is_sent() {
    let server = MockServer::start().await;
    let store = store(&server);
    let too_big = vec![0u8; MAX_VALUE_BYTES + 1];
    let too_many: Vec<TxnOp> = (0..65)
        .map(|i| TxnOp::Get {
            key: format!("k{i}"),
        })
        .collect();

    for result in [
        store.put("rc/1", &too_big, Cas::Any).await,
        store.acquire("lock/x", &too_big, "s").await.map(drop),
        store.txn(&too_many).await.map(drop),
        store.put("a//b", b"", Cas::Any).await,
        store
            .txn(&[TxnOp::Set {
                key: "a".into(),
                value: too_big.clone(),
            }])
            .await
            .map(drop),
    ] {
        assert!(matches!(result, Err(StoreError::Invalid(_))), "{result:?}");
    }
    assert!(requests(&server).await.is_empty());
}

#[tokio::test]
async fn status_codes_map_to_error_kinds() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/secret"))
        .respond_with(ResponseTemplate::new(403).set_body_string("Permission denied"))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/kv/no/leader"))
        .respond_with(ResponseTemplate::new(500).set_body_string("No cluster leader"))
        // A write is never retried blindly.
        .expect(1)
        .mount(&server)
        .await;
    // Consul's rate limiter refuses a write with 503 before it reaches Raft.
    Mock::given(method("PUT"))
        .and(path("/v1/kv/rate/limited"))
        .respond_with(
            ResponseTemplate::new(503).set_body_string("rate limit exceeded, try again later"),
        )
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/kv/big"))
        .respond_with(
            ResponseTemplate::new(413)
                .set_body_string("Request body(600000 bytes) too large, max size: 524288 bytes"),
        )
        .mount(&server)
        .await;
    let store = store(&server);

    let forbidden = store.get("secret").await;
    assert!(
        matches!(forbidden, Err(StoreError::Forbidden(_))),
        "{forbidden:?}"
    );
    let no_leader = store.put("no/leader", b"x", Cas::Any).await;
    assert!(
        matches!(&no_leader, Err(StoreError::Unavailable(m)) if m.contains("No cluster leader")),
        "{no_leader:?}"
    );
    let limited = store.put("rate/limited", b"x", Cas::Any).await;
    assert!(
        matches!(&limited, Err(StoreError::Unavailable(m)) if m.contains("rate limit")),
        "{limited:?}"
    );
    let too_large = store.put("big", b"x", Cas::Any).await;
    assert!(
        matches!(&too_large, Err(StoreError::Invalid(m)) if m.contains("too large")),
        "{too_large:?}"
    );
}

/// A client agent that knows no server yet (restarted, before it joins the cluster again)
/// answers every write 500 "No known Consul servers": it had nowhere to send it, so the
/// write was not applied, and the store is unavailable rather than the outcome unknown.
#[tokio::test]
async fn a_write_an_agent_without_servers_refuses_is_unavailable() {
    let server = MockServer::start().await;
    let no_servers = || ResponseTemplate::new(500).set_body_string("No known Consul servers");
    Mock::given(method("PUT"))
        .and(path("/v1/kv/rc/1"))
        .respond_with(no_servers())
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/txn"))
        .respond_with(no_servers())
        .expect(1)
        .mount(&server)
        .await;
    let store = store(&server);

    let put = store.put("rc/1", b"x", Cas::Any).await;
    assert!(matches!(put, Err(StoreError::Unavailable(_))), "{put:?}");
    let ops = [TxnOp::Set {
        key: "rc/1".into(),
        value: b"x".to_vec(),
    }];
    let txn = store.txn(&ops).await;
    assert!(matches!(txn, Err(StoreError::Unavailable(_))), "{txn:?}");
}

#[tokio::test]
async fn a_read_is_retried_after_a_server_error() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/rc/1"))
        .respond_with(ResponseTemplate::new(500).set_body_string("No cluster leader"))
        .up_to_n_times(1)
        .expect(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/rc/1"))
        .respond_with(kv_answer(21, json!([entry("rc/1", "v", 21)])))
        .expect(1)
        .mount(&server)
        .await;

    let got = store(&server).get("rc/1").await.unwrap();

    assert_eq!(got, Some(pair("rc/1", "v", 21)));
}

/// Answers a consistent read of `rc/1` with whatever flags the lost PUT carried, as Consul
/// does when that PUT was applied.
struct LandedRead(Arc<Mutex<Option<String>>>);

impl Respond for LandedRead {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let flags: u64 = self.0.lock().unwrap().as_deref().unwrap().parse().unwrap();
        let mut stored = entry("rc/1", "new", 25);
        stored["Flags"] = flags.into();
        kv_answer(25, json!([stored]))
    }
}

/// Expects the one `PUT /v1/kv/rc/1`, and drops its connection: the put went out, and its
/// answer was lost.
async fn lose_put_of_rc_1(server: &MockServer) {
    Mock::given(method("PUT"))
        .and(path("/v1/kv/rc/1"))
        .respond_with_err(drop_connection)
        .expect(1)
        .mount(server)
        .await;
}

#[tokio::test]
async fn a_lost_cas_put_that_landed_is_a_success() {
    let server = MockServer::start().await;
    let sent_flags = Arc::new(Mutex::new(None));
    let recorder = sent_flags.clone();
    Mock::given(method("PUT"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param("cas", "20"))
        .respond_with_err(move |request: &Request| {
            let flags = request.url.query_pairs().find(|(k, _)| k == "flags");
            *recorder.lock().unwrap() = flags.map(|(_, v)| v.into_owned());
            drop_connection(request)
        })
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param("consistent", ""))
        .respond_with(LandedRead(sent_flags))
        .expect(1)
        .mount(&server)
        .await;

    store(&server)
        .put("rc/1", b"new", Cas::Index(20))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_lost_cas_put_overtaken_by_another_writer_has_an_unknown_outcome() {
    let server = MockServer::start().await;
    lose_put_of_rc_1(&server).await;
    // The same value at a newer index, but written by someone else (other flags).
    expect_check_read(
        &server,
        "rc/1",
        kv_answer(25, json!([entry("rc/1", "new", 25)])),
    )
    .await;

    let result = store(&server).put("rc/1", b"new", Cas::Index(20)).await;

    assert!(
        matches!(&result, Err(StoreError::OutcomeUnknown(_))),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_lost_cas_put_not_seen_by_the_check_has_an_unknown_outcome() {
    let server = MockServer::start().await;
    lose_put_of_rc_1(&server).await;
    expect_check_read(
        &server,
        "rc/1",
        kv_answer(20, json!([entry("rc/1", "old", 20)])),
    )
    .await;

    let result = store(&server).put("rc/1", b"new", Cas::Index(20)).await;

    assert!(
        matches!(&result, Err(StoreError::OutcomeUnknown(m)) if m.contains("may still land")),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_lost_cas_put_whose_check_cannot_be_read_has_an_unknown_outcome() {
    let server = MockServer::start().await;
    lose_put_of_rc_1(&server).await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param("consistent", ""))
        .respond_with(ResponseTemplate::new(500).set_body_string("No cluster leader"))
        .mount(&server)
        .await;

    let result = store(&server).put("rc/1", b"new", Cas::Index(20)).await;

    assert!(
        matches!(&result, Err(StoreError::OutcomeUnknown(m)) if m.contains("No cluster leader")),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_plain_put_whose_answer_times_out_has_an_unknown_outcome() {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path("/v1/kv/rc/1"))
        .respond_with(boolean(true).set_delay(Duration::from_secs(2)))
        .expect(1)
        .mount(&server)
        .await;
    let timeouts = ConsulTimeouts {
        request: Duration::from_millis(200),
        ..ConsulTimeouts::default()
    };
    let store = ConsulStore::with_timeouts(config(&server), timeouts).unwrap();

    let result = store.put("rc/1", b"new", Cas::Any).await;

    assert!(
        matches!(&result, Err(StoreError::OutcomeUnknown(_))),
        "{result:?}"
    );
    // Nothing is re-read or re-sent for an unconditional put.
    assert_eq!(requests(&server).await.len(), 1);
}

/// Expects the one `DELETE /v1/kv/rc/1?cas=20`, and drops its connection: the delete went
/// out, and its answer was lost.
async fn lose_cas_delete_of_rc_1(server: &MockServer) {
    Mock::given(method("DELETE"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param("cas", "20"))
        .respond_with_err(drop_connection)
        .expect(1)
        .mount(server)
        .await;
}

#[tokio::test]
async fn a_lost_cas_delete_is_checked_by_reading_the_key() {
    let server = MockServer::start().await;
    lose_cas_delete_of_rc_1(&server).await;
    expect_check_read(&server, "rc/1", missing(26)).await;

    store(&server).delete("rc/1", Cas::Index(20)).await.unwrap();
}

/// A 404 without `X-Consul-Index` is not Consul's "no such key" (Consul's KV answers carry
/// their index, found or not): a proxy or a wrong address in front of the agent answers so.
/// Read as the key being gone, it would tell a lost delete that it landed.
#[tokio::test]
async fn a_404_without_consuls_index_is_not_taken_for_a_missing_key() {
    let server = MockServer::start().await;
    lose_cas_delete_of_rc_1(&server).await;
    expect_check_read(&server, "rc/1", ResponseTemplate::new(404)).await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/rc/2"))
        .respond_with(ResponseTemplate::new(404).set_body_string("404 page not found"))
        .mount(&server)
        .await;
    let store = store(&server);

    let deleted = store.delete("rc/1", Cas::Index(20)).await;
    let read = store.get("rc/2").await;

    assert!(
        matches!(&deleted, Err(StoreError::OutcomeUnknown(_))),
        "{deleted:?}"
    );
    assert!(matches!(&read, Err(StoreError::Unavailable(_))), "{read:?}");
}

/// Consul's KV and transaction writes never answer 404: one comes from in front of the agent,
/// so the write was not applied and the store is unavailable, not the key missing. (Session
/// renewal's own 404, that the session is gone, is in
/// `sessions_are_created_renewed_read_and_destroyed`.)
#[tokio::test]
async fn a_404_to_a_write_is_not_taken_for_a_missing_key() {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path("/v1/txn"))
        .respond_with(ResponseTemplate::new(404).set_body_string("404 page not found"))
        .mount(&server)
        .await;

    let written = store(&server)
        .txn(&[TxnOp::Delete { key: "rc/1".into() }])
        .await;

    assert!(
        matches!(&written, Err(StoreError::Unavailable(_))),
        "{written:?}"
    );
}

/// Sends a one-op transaction to a Consul whose `PUT /v1/txn` answers as `answer` makes it,
/// once, and checks that its outcome is unknown.
async fn assert_txn_outcome_unknown(answer: impl FnOnce(MockBuilder) -> Mock) {
    let server = MockServer::start().await;
    answer(Mock::given(method("PUT")).and(path("/v1/txn")))
        .expect(1)
        .mount(&server)
        .await;

    let result = store(&server)
        .txn(&[TxnOp::Set {
            key: "a".into(),
            value: vec![],
        }])
        .await;

    assert!(
        matches!(&result, Err(StoreError::OutcomeUnknown(_))),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_lost_txn_answer_has_an_unknown_outcome() {
    assert_txn_outcome_unknown(|put| put.respond_with_err(drop_connection)).await;
}

#[tokio::test]
async fn a_watch_blocks_with_index_and_wait_until_the_index_changes() {
    let server = MockServer::start().await;
    // Consul may return early with the same index; the watch must ask again.
    Mock::given(method("GET"))
        .and(path("/v1/kv/daemon_sets/"))
        .and(query_param("recurse", ""))
        .and(query_param("index", "40"))
        .respond_with(kv_answer(40, json!([entry("daemon_sets/a", "old", 40)])))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/daemon_sets/"))
        .and(query_param("recurse", ""))
        .and(query_param("index", "40"))
        .respond_with(kv_answer(41, json!([entry("daemon_sets/a", "new", 41)])))
        .mount(&server)
        .await;
    let target = WatchTarget::Prefix("daemon_sets/".into());
    let started = Instant::now();

    let listing = store(&server)
        .watch(&target, 40, Duration::from_secs(30))
        .await
        .unwrap();

    assert_eq!(listing.index, 41);
    assert_eq!(listing.pairs, vec![pair("daemon_sets/a", "new", 41)]);
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "re-queried without a pause"
    );
    let waits: Vec<String> = requests(&server)
        .await
        .iter()
        .map(|r| {
            r.url
                .query_pairs()
                .find(|(k, _)| k == "wait")
                .unwrap()
                .1
                .into_owned()
        })
        .collect();
    assert_eq!(waits.len(), 2);
    assert_eq!(waits[0], "30s");
    assert!(
        waits[1].ends_with("ms"),
        "second wait {:?} should be what is left",
        waits[1]
    );
}

/// Consul answers the read of a missing key at its KV table's index, and of a key that
/// exists at the key's own, which says nothing of the table's.
#[tokio::test]
async fn the_current_index_is_read_from_a_missing_probe_only() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/probe"))
        .respond_with(missing(42))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/probe"))
        .respond_with(kv_answer(7, json!([entry("probe", "v", 7)])))
        .mount(&server)
        .await;
    let store = store(&server);

    assert_eq!(store.current_index("probe").await.unwrap(), Some(42));
    assert_eq!(store.current_index("probe").await.unwrap(), None);
}

#[tokio::test]
async fn a_watch_returns_at_once_when_the_index_goes_backwards() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param("index", "500"))
        .and(query_param("wait", "10s"))
        .respond_with(kv_answer(7, json!([entry("rc/1", "v", 7)])))
        .expect(1)
        .mount(&server)
        .await;
    let target = WatchTarget::Key("rc/1".into());

    let listing = store(&server)
        .watch(&target, 500, Duration::from_secs(10))
        .await
        .unwrap();

    assert_eq!(listing.index, 7);
}

#[tokio::test]
async fn a_watch_that_times_out_returns_the_same_index_without_spinning() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param("index", "9"))
        .respond_with(missing(9))
        .mount(&server)
        .await;
    let target = WatchTarget::Key("rc/1".into());
    let started = Instant::now();

    let listing = store(&server)
        .watch(&target, 9, Duration::from_millis(300))
        .await
        .unwrap();

    assert_eq!((listing.index, listing.pairs), (9, vec![]));
    assert!(started.elapsed() < Duration::from_secs(2));
    // At most one query per pause; only one when the first answer came too late for a
    // pause and another query to fit in the wait (a round trip over 200ms on a busy machine).
    let sent = requests(&server).await.len();
    assert!((1..=3).contains(&sent), "{sent} queries in 300ms");
}

/// A watch woken from its pause between two queries past its deadline (its thread held up
/// meanwhile) returns what it has: what is left of its wait is nothing, and Consul reads
/// `wait=0s` as its 5-minute default, which the client would give up on as lost.
#[tokio::test(flavor = "current_thread")]
async fn a_watch_held_up_past_its_deadline_asks_consul_no_more() {
    struct Answer(Arc<tokio::sync::Notify>);
    impl Respond for Answer {
        fn respond(&self, _: &Request) -> ResponseTemplate {
            self.0.notify_one();
            missing(9)
        }
    }
    let server = MockServer::start().await;
    let answered = Arc::new(tokio::sync::Notify::new());
    Mock::given(method("GET"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param("index", "9"))
        .respond_with(Answer(answered.clone()))
        .mount(&server)
        .await;
    // Holds the runtime's one thread while the watch pauses after the first answer.
    let holdup = tokio::spawn(async move {
        answered.notified().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        std::thread::sleep(Duration::from_millis(600));
    });
    let target = WatchTarget::Key("rc/1".into());

    let listing = store(&server)
        .watch(&target, 9, Duration::from_millis(300))
        .await
        .unwrap();

    holdup.await.unwrap();
    assert_eq!((listing.index, listing.pairs), (9, vec![]));
    let waits: Vec<String> = requests(&server)
        .await
        .iter()
        .filter_map(|r| r.url.query_pairs().find(|(k, _)| k == "wait"))
        .map(|(_, wait)| wait.into_owned())
        .collect();
    assert_eq!(waits, vec!["300ms".to_string()]);
}

#[tokio::test]
async fn a_first_watch_reads_without_blocking() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param_is_missing("index"))
        .and(query_param_is_missing("wait"))
        .respond_with(kv_answer(3, json!([entry("rc/1", "v", 3)])))
        .expect(1)
        .mount(&server)
        .await;
    let target = WatchTarget::Key("rc/1".into());

    let listing = store(&server)
        .watch(&target, 0, Duration::from_secs(30))
        .await
        .unwrap();

    assert_eq!(listing.index, 3);
}

#[tokio::test]
async fn sessions_are_created_renewed_read_and_destroyed() {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path("/v1/session/create"))
        .and(body_json(json!({
            "Name": "rc-farm", "TTL": "15s", "LockDelay": "5s", "Behavior": "delete", "Checks": []
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"ID": "sess-1"})))
        .expect(1)
        .mount(&server)
        .await;
    let session = json!([{
        "ID": "sess-1", "Name": "rc-farm", "Node": "agent", "Checks": [],
        "LockDelay": 5_000_000_000u64, "Behavior": "delete", "TTL": "15s",
        "CreateIndex": 11, "ModifyIndex": 11
    }]);
    Mock::given(method("PUT"))
        .and(path("/v1/session/renew/sess-1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(session.clone()))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/session/renew/gone"))
        .respond_with(ResponseTemplate::new(404).set_body_string("Session id 'gone' not found"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/session/info/sess-1"))
        .respond_with(kv_answer(11, session))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/session/info/gone"))
        .respond_with(kv_answer(12, json!(null)))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/session/destroy/sess-1"))
        .respond_with(boolean(true))
        .expect(1)
        .mount(&server)
        .await;
    let store = store(&server);
    let spec = SessionSpec {
        name: "rc-farm".into(),
        ttl: Duration::from_secs(15),
        lock_delay: Duration::from_secs(5),
        behavior: SessionBehavior::Delete,
    };

    let id = store.create_session(&spec).await.unwrap();
    assert_eq!(id, "sess-1");
    let renewed = store.renew_session(&id).await.unwrap();
    assert_eq!(
        (
            renewed.ttl,
            renewed.lock_delay,
            renewed.behavior,
            renewed.create_index
        ),
        (
            Duration::from_secs(15),
            Duration::from_secs(5),
            SessionBehavior::Delete,
            11
        )
    );
    assert_eq!(store.session_info(&id).await.unwrap(), Some(renewed));
    let gone = store.renew_session("gone").await;
    assert!(matches!(gone, Err(StoreError::NotFound(_))), "{gone:?}");
    assert_eq!(store.session_info("gone").await.unwrap(), None);
    store.destroy_session(&id).await.unwrap();
}

#[tokio::test]
async fn a_session_outside_consuls_ttl_range_is_refused_locally() {
    let server = MockServer::start().await;
    let spec = SessionSpec {
        name: "x".into(),
        ttl: Duration::from_secs(5),
        lock_delay: Duration::ZERO,
        behavior: SessionBehavior::Release,
    };
    let result = store(&server).create_session(&spec).await;
    assert!(matches!(result, Err(StoreError::Invalid(_))), "{result:?}");
    assert!(requests(&server).await.is_empty());
}

#[tokio::test]
async fn ping_needs_a_leader() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/status/leader"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!("10.0.0.1:8300")))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/status/leader"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!("")))
        .mount(&server)
        .await;
    let store = store(&server);

    store.ping().await.unwrap();
    let leaderless = store.ping().await;
    assert!(
        matches!(leaderless, Err(StoreError::Unavailable(_))),
        "{leaderless:?}"
    );
}

#[tokio::test]
async fn an_unreachable_agent_is_unavailable() {
    // A port that was just free: nothing listens there, so the connection is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = ConsulStore::new(ConsulConfig {
        base_url: format!("http://127.0.0.1:{port}"),
        token: None,
        datacenter: None,
    })
    .unwrap();
    let result = store.put("a", b"", Cas::Index(0)).await;
    assert!(
        matches!(&result, Err(StoreError::Unavailable(m)) if m.contains("not applied")),
        "{result:?}"
    );
}

#[test]
fn a_bad_address_or_token_is_refused_when_building() {
    for (base_url, token) in [
        ("not a url", None),
        ("ftp://h:1", None),
        ("http://h:1", Some("a\nb")),
    ] {
        let result = ConsulStore::new(ConsulConfig {
            base_url: base_url.into(),
            token: token.map(String::from),
            datacenter: None,
        });
        assert!(
            matches!(result, Err(StoreError::Invalid(_))),
            "{base_url} accepted"
        );
    }
}

/// A CAS put whose answer times out while Consul is still applying it (its RPC to the
/// leader goes on without the client): the check read comes before the write lands, so it
/// shows the key still at the CAS index, and yet the write lands a moment later.
struct ApplyLater(Arc<Mutex<Option<u64>>>);

impl Respond for ApplyLater {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let flags: u64 = request
            .url
            .query_pairs()
            .find(|(k, _)| k == "flags")
            .map(|(_, v)| v.parse().unwrap())
            .unwrap();
        let landed = self.0.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            *landed.lock().unwrap() = Some(flags);
        });
        boolean(true).set_delay(Duration::from_secs(2))
    }
}

/// What a read of `rc/1` finds: the old entry until the put above lands, then its own.
struct KeyState(Arc<Mutex<Option<u64>>>);

impl Respond for KeyState {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        match *self.0.lock().unwrap() {
            None => kv_answer(20, json!([entry("rc/1", "old", 20)])),
            Some(flags) => {
                let mut stored = entry("rc/1", "new", 25);
                stored["Flags"] = flags.into();
                kv_answer(25, json!([stored]))
            }
        }
    }
}

#[tokio::test]
async fn a_timed_out_cas_put_still_in_flight_is_not_reported_as_unapplied() {
    let server = MockServer::start().await;
    let landed = Arc::new(Mutex::new(None));
    Mock::given(method("PUT"))
        .and(path("/v1/kv/rc/1"))
        .and(query_param("cas", "20"))
        .respond_with(ApplyLater(landed.clone()))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/rc/1"))
        .respond_with(KeyState(landed))
        .mount(&server)
        .await;
    let timeouts = ConsulTimeouts {
        request: Duration::from_millis(150),
        ..ConsulTimeouts::default()
    };
    let store = ConsulStore::with_timeouts(config(&server), timeouts).unwrap();

    let result = store.put("rc/1", b"new", Cas::Index(20)).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let now = store.get("rc/1").await.unwrap().unwrap();

    // The write did land: "not applied" (Unavailable, safe to redo) was wrong.
    assert_eq!(&*now.value, b"new");
    assert!(
        matches!(&result, Err(StoreError::OutcomeUnknown(_))),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_write_refused_with_leadership_lost_has_an_unknown_outcome() {
    // Raft's ErrLeadershipLost: the leader was deposed while committing the entry, which the
    // next leader may still commit. Consul's agent answers 500 with the error's text.
    let lost = ResponseTemplate::new(500)
        .set_body_string("rpc error making call: leadership lost while committing log");
    assert_txn_outcome_unknown(|put| put.respond_with(lost)).await;
}

#[tokio::test]
async fn a_lost_cas_delete_of_a_key_written_again_since_has_an_unknown_outcome() {
    let server = MockServer::start().await;
    lose_cas_delete_of_rc_1(&server).await;
    // The key is there, but no longer at index 20: the delete may have landed and another
    // writer created the key again (CreateIndex 30), or it may not have; nothing tells.
    let mut again = entry("rc/1", "other", 30);
    again["CreateIndex"] = 30.into();
    expect_check_read(&server, "rc/1", kv_answer(30, json!([again]))).await;

    let result = store(&server).delete("rc/1", Cas::Index(20)).await;

    assert!(
        matches!(&result, Err(StoreError::OutcomeUnknown(_))),
        "{result:?}"
    );
}

/// A proxy set in the environment (`HTTP_PROXY`, as many hosts set for their way out) is not
/// used for an agent on a loopback address, as Consul's own clients use none there (Go's
/// `ProxyFromEnvironment`): the proxy cannot reach this host's loopback, and would see the
/// ACL token of every request. Run in a child process of this test binary, so that the
/// variables reach no other test.
#[tokio::test]
async fn a_loopback_agent_is_reached_past_the_environments_proxy() {
    const CHILD: &str = "P2_TEST_PROXIED_CHILD";
    if std::env::var_os(CHILD).is_none() {
        // A port nothing listens on: a request sent through the proxy is refused.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let test = "consul_http::a_loopback_agent_is_reached_past_the_environments_proxy";
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("HTTP_PROXY", &proxy)
            .env("http_proxy", &proxy)
            .env("ALL_PROXY", &proxy)
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .output()
            .unwrap();
        let output = String::from_utf8_lossy(&child.stdout);
        assert!(
            child.status.success() && output.contains("1 passed"),
            "{output}{}",
            String::from_utf8_lossy(&child.stderr)
        );
        return;
    }
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/kv/a"))
        .respond_with(kv_answer(5, json!([entry("a", "v", 5)])))
        .mount(&server)
        .await;

    let got = store(&server).get("a").await;

    assert_eq!(got, Ok(Some(pair("a", "v", 5))));
}
