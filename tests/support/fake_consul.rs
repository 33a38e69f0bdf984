//! A fake Consul agent for tests: the part of HTTP API v1 the Consul store uses, answered as
//! Consul documents it, with its state in the embedded SQLite store.
//!
//! The wire format (paths, query flags, status codes, headers, JSON shapes, base64 values,
//! which txn ops answer an entry, the limits and their 413s) follows Consul's own HTTP
//! handlers, so the real Consul client can run whole suites against it. The state semantics
//! are SQLite's, which mirror Consul's with these differences: a TTL session expires at its
//! TTL rather than up to twice it; a blocking query also returns early when the index went
//! backwards, and one answered at the KV table's index wakes on any write (unless
//! [`EmptyReads::lazy`]); tombstones are
//! kept for an hour; sessions without a TTL and the `get-tree` and `delete-tree` txn verbs
//! are not supported (400). Txn verbs Consul 0.7 lacks fail their op (409), as they do there.
//!
//! Reads answer at Consul's index: a key's modify index, a prefix's highest modify or
//! delete index, and, as Consul's state store does, the KV table's index (the store's
//! highest) for a missing key and for a prefix with neither keys nor tombstones. So a test
//! that waits on an empty prefix sees what it would see on Consul: the index moves with
//! every write anywhere.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, put};
use axum::{Json, Router};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{
    Cas, KvPair, KvStore, Listing, SessionBehavior, SessionInfo, SessionSpec, StoreError,
    StoreResult, TxnOp, WatchTarget,
};
use rand::Rng as _;
use serde::Deserialize;
use serde_json::{json, Value};

/// Consul's default `kv_max_value_size`, which is also the default `txn_max_req_len`.
const MAX_BODY: usize = 512 * 1024;
/// Consul's `maxTxnOps`.
const MAX_OPS: usize = 64;
/// The KV verbs of Consul 0.7, the oldest Consul the client works with. Its state store fails
/// an op of any other verb (`check-not-exists` came in 0.8), so this agent does too: a client
/// sending one passes no test here that it would fail there.
const VERBS: [&str; 11] = [
    "set",
    "cas",
    "lock",
    "unlock",
    "get",
    "get-tree",
    "check-index",
    "check-session",
    "delete",
    "delete-tree",
    "delete-cas",
];
/// The only datacenter this agent knows.
const DATACENTER: &str = "dc1";
/// Consul's blocking-query wait when none (or zero) is asked for, and its cap.
const DEFAULT_WAIT: Duration = Duration::from_secs(300);
const MAX_WAIT: Duration = Duration::from_secs(600);

type Store = Arc<SqliteStore>;
type Params = HashMap<String, String>;
/// `Err` lets handlers stop early with `?`.
type Reply = Result<Response, Refusal>;

/// An error answer: its status and Consul's text for it.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

/// A running fake agent. Its server task lives as long as the test's runtime.
pub struct FakeConsul {
    pub addr: SocketAddr,
    /// Holds the SQLite file, so it must live as long as the store is used.
    pub dir: tempfile::TempDir,
    /// The requests being answered now, and the most there ever were at once: what a real
    /// agent's `limits.http_max_conns_per_client` would count against one client.
    pub in_flight: Arc<InFlight>,
    /// Transactions held unanswered, as by an agent slow to commit them.
    pub txns: Arc<TxnHold>,
    /// Transactions applied, then answered with the connection cut partway through.
    pub cut_answers: Arc<AnswerCut>,
    /// What wakes a blocking query answered at the KV table's index.
    pub empty_reads: Arc<EmptyReads>,
}

/// What wakes a blocking query answered at the KV table's index (an empty prefix, a missing
/// key): any write by default, or, once [`EmptyReads::lazy`], only a change of what it
/// reads or the end of its wait. Consul may do either: it watches the node of its radix
/// tree nearest the prefix, which a write elsewhere touches or not depending on the keys
/// around it, though the table's index, which the query answers at, moves with every write.
/// And whether a write elsewhere follows each such answer ([`EmptyReads::overtaken`]).
#[derive(Debug, Default)]
pub struct EmptyReads {
    lazy: std::sync::atomic::AtomicBool,
    overtaken: std::sync::atomic::AtomicBool,
}

impl EmptyReads {
    /// Wakes such queries only when what they read changes (`true`), or on any write.
    pub fn lazy(&self, on: bool) {
        self.lazy.store(on, Ordering::SeqCst);
    }

    /// Follows each answer at the KV table's index with a write elsewhere (`true`), made
    /// before the answer is sent: a store written to faster than a client's round trip,
    /// where no read answered at that index finds it where the one before left it.
    pub fn overtaken(&self, on: bool) {
        self.overtaken.store(on, Ordering::SeqCst);
    }
}

/// The key [`EmptyReads::overtaken`] writes: under no prefix a client reads.
const ELSEWHERE: &str = "fake-consul/elsewhere";

/// Cuts the connection partway through the answer of every transaction while it is on
/// ([`AnswerCut::cut`]), once the transaction is applied: what a client sees of a
/// connection lost mid-body, which leaves it unable to tell whether its write landed.
#[derive(Debug, Default)]
pub struct AnswerCut(std::sync::atomic::AtomicBool);

impl AnswerCut {
    /// Cuts the answers of transactions from now on (`true`), or answers them whole again.
    pub fn cut(&self, on: bool) {
        self.0.store(on, Ordering::SeqCst);
    }
}

async fn cut_txn_answers(
    State(cut): State<Arc<AnswerCut>>,
    request: Request,
    next: Next,
) -> Response {
    let cut = request.uri().path() == "/v1/txn" && cut.0.load(Ordering::SeqCst);
    let response = next.run(request).await;
    if !cut {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let whole = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let half = whole.slice(..whole.len() / 2);
    let chunks = [Ok(half), Err(std::io::Error::other("connection cut"))];
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(
        parts,
        axum::body::Body::from_stream(futures::stream::iter(chunks)),
    )
}

/// Transactions the agent holds unanswered while it is on ([`TxnHold::hold`]).
#[derive(Debug)]
pub struct TxnHold {
    on: tokio::sync::watch::Sender<bool>,
    /// How many it holds now.
    held: tokio::sync::watch::Sender<usize>,
}

impl Default for TxnHold {
    fn default() -> Self {
        TxnHold {
            on: tokio::sync::watch::Sender::new(false),
            held: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl TxnHold {
    /// Holds every transaction from now on (`true`), or answers them again (`false`).
    pub fn hold(&self, on: bool) {
        self.on.send_replace(on);
    }

    /// Waits until it holds at least `count` transactions.
    pub async fn holding(&self, count: usize) {
        let mut held = self.held.subscribe();
        held.wait_for(|held| *held >= count).await.unwrap();
    }
}

async fn hold_txns(State(hold): State<Arc<TxnHold>>, request: Request, next: Next) -> Response {
    /// Counts a held transaction out however it ends, its client hanging up included.
    struct Held<'a>(&'a TxnHold);
    impl Drop for Held<'_> {
        fn drop(&mut self) {
            self.0.held.send_modify(|held| *held -= 1);
        }
    }
    if request.uri().path() == "/v1/txn" && *hold.on.borrow() {
        hold.held.send_modify(|held| *held += 1);
        let _held = Held(&hold);
        let mut on = hold.on.subscribe();
        let _ = on.wait_for(|on| !*on).await;
    }
    next.run(request).await
}

/// Requests the agent is answering, a blocking query for the whole of its wait.
#[derive(Debug, Default)]
pub struct InFlight {
    now: AtomicUsize,
    peak: AtomicUsize,
}

impl InFlight {
    /// The most requests that were in flight at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

async fn count_in_flight(
    State(in_flight): State<Arc<InFlight>>,
    request: Request,
    next: Next,
) -> Response {
    /// Counts a request out however it ends, a client hanging up included.
    struct Answering(Arc<InFlight>);
    impl Drop for Answering {
        fn drop(&mut self) {
            self.0.now.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let now = in_flight.now.fetch_add(1, Ordering::SeqCst) + 1;
    in_flight.peak.fetch_max(now, Ordering::SeqCst);
    let _answering = Answering(in_flight);
    next.run(request).await
}

/// Starts a fake agent with an empty store on a free port of 127.0.0.1.
pub async fn start() -> FakeConsul {
    start_in(tempfile::tempdir().unwrap()).await
}

/// Like [`start`], keeping the store's files in `dir`.
pub async fn start_in(dir: tempfile::TempDir) -> FakeConsul {
    let path = dir.path().join("consul.db").display().to_string();
    let store: Store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let in_flight = Arc::new(InFlight::default());
    let txns = Arc::new(TxnHold::default());
    let cut_answers = Arc::new(AnswerCut::default());
    let empty_reads = Arc::new(EmptyReads::default());
    let app = Router::new()
        .route("/v1/kv/", any(kv))
        .route("/v1/kv/{*key}", any(kv))
        .route("/v1/txn", put(txn))
        .route("/v1/session/create", put(session_create))
        .route("/v1/session/renew/{id}", put(session_renew))
        .route("/v1/session/destroy/{id}", put(session_destroy))
        .route("/v1/session/info/{id}", get(session_info))
        .route(
            "/v1/status/leader",
            get(|| async { Json("127.0.0.1:8300") }),
        )
        .layer(middleware::from_fn_with_state(txns.clone(), hold_txns))
        .layer(middleware::from_fn_with_state(
            cut_answers.clone(),
            cut_txn_answers,
        ))
        .layer(middleware::from_fn(datacenter))
        .layer(axum::Extension(empty_reads.clone()))
        .layer(middleware::from_fn_with_state(
            in_flight.clone(),
            count_in_flight,
        ))
        .with_state(store);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    FakeConsul {
        addr,
        dir,
        in_flight,
        txns,
        cut_answers,
        empty_reads,
    }
}

/// Consul forwards `?dc=` to that datacenter's servers; this agent knows no other.
async fn datacenter(request: Request, next: Next) -> Response {
    let query = request.uri().query().unwrap_or_default().as_bytes();
    let dc = url::form_urlencoded::parse(query).find(|(name, _)| name == "dc");
    match dc {
        Some((_, dc)) if !dc.is_empty() && dc != DATACENTER => {
            internal("No path to datacenter").into_response()
        }
        _ => next.run(request).await,
    }
}

async fn kv(
    State(store): State<Store>,
    axum::Extension(empty_reads): axum::Extension<Arc<EmptyReads>>,
    method: Method,
    key: Option<Path<String>>,
    Query(params): Query<Params>,
    body: Bytes,
) -> Reply {
    let key = key.map(|Path(key)| key).unwrap_or_default();
    match method {
        Method::GET if params.contains_key("keys") => {
            kv_keys(&store, &empty_reads, &key, &params).await
        }
        Method::GET => kv_get(&store, &empty_reads, &key, &params).await,
        Method::PUT => kv_put(&store, &key, &params, body).await,
        Method::DELETE => kv_delete(&store, &key, &params).await,
        _ => Err(Refusal(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed".into(),
        )),
    }
}

async fn kv_get(store: &SqliteStore, empty: &EmptyReads, key: &str, params: &Params) -> Reply {
    let target = if params.contains_key("recurse") {
        WatchTarget::Prefix(key.into())
    } else if key.is_empty() {
        return Err(missing_key());
    } else {
        WatchTarget::Key(key.into())
    };
    let (index, wait) = blocking(params)?;
    let listing = consul_read(store, empty, &target, index, wait).await?;
    if listing.pairs.is_empty() {
        return Ok(with_index(listing.index, StatusCode::NOT_FOUND));
    }
    let entries: Vec<Value> = listing.pairs.iter().map(|p| entry(p, true)).collect();
    Ok(with_index(listing.index, Json(entries)))
}

/// `?keys`: Consul cuts each key after the first separator past the prefix, dropping a cut
/// key only when it repeats the cut key before it, and answers 404 for an empty non-root list.
async fn kv_keys(store: &SqliteStore, empty: &EmptyReads, prefix: &str, params: &Params) -> Reply {
    let separator = params
        .get("separator")
        .or_else(|| params.get("seperator"))
        .map_or("", String::as_str);
    let (index, wait) = blocking(params)?;
    let target = WatchTarget::Prefix(prefix.into());
    let listing = consul_read(store, empty, &target, index, wait).await?;
    let (index, mut keys, mut previous) = (listing.index, Vec::new(), String::new());
    for key in listing.pairs.into_iter().map(|pair| pair.key) {
        match key[prefix.len()..].find(separator) {
            Some(at) if !separator.is_empty() => {
                let cut = key[..prefix.len() + at + separator.len()].to_owned();
                if cut != previous {
                    keys.push(cut.clone());
                    previous = cut;
                }
            }
            _ => keys.push(key),
        }
    }
    if keys.is_empty() && !prefix.is_empty() {
        return Ok(with_index(index, StatusCode::NOT_FOUND));
    }
    Ok(with_index(index, Json(keys)))
}

/// A KV read at Consul's index, blocking as Consul does when `index` is not 0: the read is
/// run again whenever what its index depends on changes (`empty` says what that is for a
/// read answered at the table's index), until the index differs from `index` or `wait`
/// passes.
async fn consul_read(
    store: &SqliteStore,
    empty: &EmptyReads,
    target: &WatchTarget,
    index: u64,
    wait: Duration,
) -> Result<Listing, Refusal> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let table = store.keys("", Some('/')).await.map_err(rpc_error)?.0;
        let mut listing = store
            .watch(target, 0, Duration::ZERO)
            .await
            .map_err(rpc_error)?;
        let own_index = listing.index;
        // SQLite reads an empty prefix at its newest tombstone, or at 1 without one.
        let at_table =
            listing.pairs.is_empty() && (matches!(target, WatchTarget::Key(_)) || own_index <= 1);
        if at_table {
            listing.index = table;
        }
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if index == 0 || listing.index != index || remaining.is_zero() {
            if at_table && empty.overtaken.load(Ordering::SeqCst) {
                store
                    .put(ELSEWHERE, b"", Cas::Any)
                    .await
                    .map_err(rpc_error)?;
            }
            return Ok(listing);
        }
        let (follow, at) = if at_table && !empty.lazy.load(Ordering::SeqCst) {
            (WatchTarget::Prefix(String::new()), table)
        } else {
            (target.clone(), own_index)
        };
        store
            .watch(&follow, at, remaining)
            .await
            .map_err(rpc_error)?;
    }
}

async fn kv_put(store: &SqliteStore, key: &str, params: &Params, body: Bytes) -> Reply {
    if key.is_empty() {
        return Err(missing_key());
    }
    conflicting(params, &["cas", "acquire", "release"])?;
    if body.len() > MAX_BODY {
        let size = body.len();
        return Err(too_large(format!(
            "Request body({size} bytes) too large, max size: {MAX_BODY} bytes"
        )));
    }
    let applied = if let Some(session) = params.get("acquire") {
        store.acquire(key, &body, session).await
    } else if let Some(session) = params.get("release") {
        // Consul's release writes the request body as the key's new value.
        let unlock = TxnOp::Unlock {
            key: key.into(),
            value: body.to_vec(),
            session: session.clone(),
        };
        applied(store.txn(&[unlock]).await)
    } else if let Some(cas) = params.get("cas") {
        applied(store.put(key, &body, Cas::Index(parse_u64(cas)?)).await)
    } else {
        store.put(key, &body, Cas::Any).await.map(|()| true)
    };
    Ok(Json(applied.map_err(rpc_error)?).into_response())
}

async fn kv_delete(store: &SqliteStore, key: &str, params: &Params) -> Reply {
    conflicting(params, &["recurse", "cas"])?;
    let applied = if params.contains_key("recurse") {
        store.delete_prefix(key).await.map(|()| true)
    } else if key.is_empty() {
        return Err(missing_key());
    } else if let Some(cas) = params.get("cas") {
        applied(store.delete(key, Cas::Index(parse_u64(cas)?)).await)
    } else {
        store.delete(key, Cas::Any).await.map(|()| true)
    };
    Ok(Json(applied.map_err(rpc_error)?).into_response())
}

/// A conditional KV write answers `false`, not an error, when its condition fails.
fn applied<T>(result: StoreResult<T>) -> StoreResult<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(StoreError::Conflict { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

#[derive(Deserialize)]
struct TxnOpIn {
    #[serde(rename = "KV")]
    kv: Option<KvOpIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct KvOpIn {
    verb: String,
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    index: u64,
    #[serde(default)]
    session: String,
}

async fn txn(State(store): State<Store>, body: Bytes) -> Reply {
    if body.len() > MAX_BODY {
        return Err(too_large(format!(
            "Request body too large, max size: {MAX_BODY} bytes"
        )));
    }
    let ops: Vec<TxnOpIn> =
        serde_json::from_slice(&body).map_err(|e| bad(format!("Failed to parse body: {e}")))?;
    if ops.len() > MAX_OPS {
        let count = ops.len();
        return Err(too_large(format!(
            "Transaction contains too many operations ({count} > {MAX_OPS})"
        )));
    }
    let ops = (ops
        .into_iter()
        .map(|op| op.kv.ok_or_else(|| bad("the fake runs KV ops only"))))
    .collect::<Result<Vec<_>, _>>()?;
    let unknown: Vec<Value> = (ops.iter().enumerate())
        .filter(|(_, op)| !VERBS.contains(&op.verb.as_str()))
        .map(|(i, op)| json!({ "OpIndex": i, "What": format!("unknown KV verb {:?}", op.verb) }))
        .collect();
    if !unknown.is_empty() {
        let answer = json!({ "Results": null, "Errors": unknown });
        return Ok((StatusCode::CONFLICT, Json(answer)).into_response());
    }
    let verbs: Vec<String> = ops.iter().map(|op| op.verb.clone()).collect();
    let ops = ops.into_iter().map(kv_op).collect::<Result<Vec<_>, _>>()?;
    let (status, mut answer) = match store.txn(&ops).await {
        Ok(results) => {
            let mut entries = Vec::new();
            for (verb, result) in verbs.iter().zip(results) {
                // Consul answers an entry for every op but deletes; only `get` keeps the
                // value.
                if matches!(verb.as_str(), "delete" | "delete-cas") {
                    continue;
                }
                let pair = result.ok_or_else(|| internal(format!("no entry for a {verb}")))?;
                entries.push(json!({ "KV": entry(&pair, verb == "get") }));
            }
            (
                StatusCode::OK,
                json!({ "Results": entries, "Errors": null }),
            )
        }
        Err(StoreError::Conflict { failures, .. }) => {
            let errors: Vec<Value> = failures
                .iter()
                .map(|f| json!({ "OpIndex": f.op_index, "What": f.what }))
                .collect();
            (
                StatusCode::CONFLICT,
                json!({ "Results": null, "Errors": errors }),
            )
        }
        Err(e) => return Err(rpc_error(e)),
    };
    // A txn without writes takes Consul's read path, whose answer carries the query meta.
    let writes = ["set", "cas", "delete", "delete-cas", "lock", "unlock"];
    if !verbs.iter().any(|v| writes.contains(&v.as_str())) {
        answer["Index"] = json!(0);
        answer["LastContact"] = json!(0);
        answer["KnownLeader"] = json!(true);
    }
    Ok((status, Json(answer)).into_response())
}

fn kv_op(op: KvOpIn) -> Result<TxnOp, Refusal> {
    let (key, index, session) = (op.key, op.index, op.session);
    let value = match &op.value {
        None => Vec::new(),
        Some(value) => BASE64
            .decode(value)
            .map_err(|e| bad(format!("Failed to parse body: failed to decode value: {e}")))?,
    };
    if value.len() > MAX_BODY {
        let size = value.len();
        return Err(too_large(format!(
            "Value for key {key:?} is too large ({size} > {MAX_BODY} bytes)"
        )));
    }
    Ok(match op.verb.as_str() {
        "set" => TxnOp::Set { key, value },
        "cas" => TxnOp::Cas { key, value, index },
        "get" => TxnOp::Get { key },
        "delete" => TxnOp::Delete { key },
        "delete-cas" => TxnOp::DeleteCas { key, index },
        "check-index" => TxnOp::CheckIndex { key, index },
        "lock" => TxnOp::Lock {
            key,
            value,
            session,
        },
        "unlock" => TxnOp::Unlock {
            key,
            value,
            session,
        },
        "check-session" => TxnOp::CheckSession { key, session },
        other => return Err(bad(format!("the fake does not run KV verb {other:?}"))),
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SessionIn {
    #[serde(default)]
    name: String,
    #[serde(rename = "TTL", default)]
    ttl: String,
    lock_delay: Option<Value>,
    #[serde(default)]
    behavior: String,
}

async fn session_create(State(store): State<Store>, body: Bytes) -> Reply {
    let body = if body.is_empty() {
        &b"{}"[..]
    } else {
        &body[..]
    };
    let session: SessionIn =
        serde_json::from_slice(body).map_err(|e| bad(format!("Request decode failed: {e}")))?;
    if session.ttl.is_empty() {
        return Err(bad("the fake runs TTL sessions only"));
    }
    let ttl = go_duration(&session.ttl)
        .ok_or_else(|| internal(format!("Session TTL '{}' invalid", session.ttl)))?;
    let lock_delay = match &session.lock_delay {
        None => Some(Duration::from_secs(15)),
        Some(Value::String(delay)) => go_duration(delay),
        Some(Value::Number(nanos)) => nanos.as_u64().map(Duration::from_nanos),
        Some(_) => None,
    }
    .ok_or_else(|| bad("Request decode failed: LockDelay is not a duration"))?;
    // Consul reads a lock-delay below 1000ns as seconds: a client sending 5 means 5s.
    let lock_delay = if lock_delay < Duration::from_nanos(1000) {
        Duration::from_secs(lock_delay.as_nanos() as u64)
    } else {
        lock_delay
    };
    let behavior = match session.behavior.as_str() {
        "" | "release" => SessionBehavior::Release,
        "delete" => SessionBehavior::Delete,
        other => return Err(internal(format!("Invalid Behavior setting '{other}'"))),
    };
    let spec = SessionSpec {
        name: session.name,
        ttl,
        lock_delay,
        behavior,
    };
    let id = store.create_session(&spec).await.map_err(rpc_error)?;
    Ok(Json(json!({ "ID": id })).into_response())
}

async fn session_renew(State(store): State<Store>, Path(id): Path<String>) -> Reply {
    match store.renew_session(&id).await {
        Ok(info) => Ok(Json(json!([session(&info)])).into_response()),
        Err(StoreError::NotFound(_)) => {
            let message = format!("Session id '{id}' not found");
            Err(Refusal(StatusCode::NOT_FOUND, message))
        }
        Err(e) => Err(rpc_error(e)),
    }
}

async fn session_destroy(State(store): State<Store>, Path(id): Path<String>) -> Reply {
    store.destroy_session(&id).await.map_err(rpc_error)?;
    Ok(Json(true).into_response())
}

/// An unknown session is an empty list, not a 404.
async fn session_info(State(store): State<Store>, Path(id): Path<String>) -> Reply {
    let info = store.session_info(&id).await.map_err(rpc_error)?;
    let index = info.as_ref().map_or(1, |i| i.create_index);
    let sessions: Vec<Value> = info.iter().map(session).collect();
    Ok(with_index(index, Json(sessions)))
}

/// A session as Consul lists it: LockDelay in nanoseconds, TTL as Go duration text.
fn session(info: &SessionInfo) -> Value {
    json!({
        "ID": info.id,
        "Name": info.name,
        "Node": "fake-consul",
        "NodeChecks": [],
        "ServiceChecks": null,
        "LockDelay": info.lock_delay.as_nanos() as u64,
        "Behavior": info.behavior.as_str(),
        "TTL": go_duration_text(info.ttl),
        "CreateIndex": info.create_index,
        "ModifyIndex": info.create_index,
    })
}

/// A KV entry as Consul encodes it: base64 value (`null` when empty), `Session` only when
/// the key is locked.
fn entry(pair: &KvPair, with_value: bool) -> Value {
    let value = (with_value && !pair.value.is_empty()).then(|| BASE64.encode(&pair.value));
    let mut entry = json!({
        "LockIndex": pair.lock_index(),
        "Key": pair.key,
        "Flags": 0,
        "Value": value,
        "CreateIndex": pair.create_index,
        "ModifyIndex": pair.modify_index,
    });
    if let Some(session) = pair.session() {
        entry["Session"] = json!(session);
    }
    entry
}

/// `?index=` and `?wait=` as Consul reads them: no index means no blocking; a zero wait
/// means 5 minutes; waits are capped at 10 minutes and get up to 1/16 of random jitter.
fn blocking(params: &Params) -> Result<(u64, Duration), Refusal> {
    let wait = match params.get("wait").filter(|w| !w.is_empty()) {
        None => Duration::ZERO,
        Some(wait) => go_duration(wait).ok_or_else(|| bad("Invalid wait time"))?,
    };
    let index = match params.get("index").filter(|i| !i.is_empty()) {
        None => 0,
        Some(index) => index.parse().map_err(|_| bad("Invalid index"))?,
    };
    if index == 0 {
        return Ok((0, Duration::ZERO));
    }
    let wait = if wait.is_zero() {
        DEFAULT_WAIT
    } else {
        wait.min(MAX_WAIT)
    };
    let jitter = wait.mul_f64(rand::thread_rng().gen_range(0.0..1.0 / 16.0));
    Ok((index, wait + jitter))
}

/// Consul's KV flags that cannot be combined.
fn conflicting(params: &Params, flags: &[&str]) -> Result<(), Refusal> {
    if flags.iter().filter(|f| params.contains_key(**f)).count() > 1 {
        return Err(bad("Conflicting flags"));
    }
    Ok(())
}

fn parse_u64(text: &str) -> Result<u64, Refusal> {
    (text.parse()).map_err(|_| internal(format!("strconv.ParseUint: parsing {text:?}")))
}

fn missing_key() -> Refusal {
    bad("Missing key name")
}

/// Consul answers an error raised by its servers with 500 and the error's text.
fn rpc_error(e: StoreError) -> Refusal {
    let message = match e {
        StoreError::NotFound(m)
        | StoreError::Unavailable(m)
        | StoreError::OutcomeUnknown(m)
        | StoreError::Invalid(m)
        | StoreError::Forbidden(m) => m,
        StoreError::Conflict { message, .. } => message,
    };
    internal(message)
}

fn bad(message: impl Into<String>) -> Refusal {
    Refusal(StatusCode::BAD_REQUEST, message.into())
}

fn too_large(message: impl Into<String>) -> Refusal {
    Refusal(StatusCode::PAYLOAD_TOO_LARGE, message.into())
}

fn internal(message: impl Into<String>) -> Refusal {
    Refusal(StatusCode::INTERNAL_SERVER_ERROR, message.into())
}

/// The query meta headers of a read.
fn with_index(index: u64, answer: impl IntoResponse) -> Response {
    let mut response = answer.into_response();
    let headers = response.headers_mut();
    headers.insert("X-Consul-Index", HeaderValue::from(index));
    headers.insert("X-Consul-KnownLeader", HeaderValue::from_static("true"));
    headers.insert("X-Consul-LastContact", HeaderValue::from_static("0"));
    response
}

/// Go's `time.ParseDuration` for non-negative durations: `0`, or numbers with units.
fn go_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let (mut rest, mut seconds) = (text, 0.0);
    while !rest.is_empty() {
        let number = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .filter(|&n| n > 0)?;
        let unit = rest[number..]
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .map_or(rest.len(), |u| number + u);
        let scale = match &rest[number..unit] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        seconds += rest[..number].parse::<f64>().ok()? * scale;
        rest = &rest[unit..];
    }
    (!text.is_empty()).then(|| Duration::from_secs_f64(seconds))
}

/// Go's `time.Duration.String()` for durations of whole milliseconds from one second up.
fn go_duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    let (hours, minutes, ms) = (ms / 3_600_000, ms / 60_000 % 60, ms % 60_000);
    let seconds = format!("{}.{:03}", ms / 1000, ms % 1000);
    let seconds = seconds.trim_end_matches('0').trim_end_matches('.');
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, _) => format!("{minutes}m{seconds}s"),
        _ => format!("{hours}h{minutes}m{seconds}s"),
    }
}
