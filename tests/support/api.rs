//! An in-process server over a store of its own, driven without a socket.
//!
//! The store is a temporary SQLite file unless the environment asks for Consul:
//! `P2_TEST_FAKE_CONSUL=1` runs the apps against one fake Consul agent per test binary (so
//! the Consul client is exercised in CI), and otherwise `CONSUL_HTTP_ADDR` (with
//! `CONSUL_HTTP_TOKEN`) runs them against that Consul. On Consul, real or fake, every app
//! works in a namespace of its own while the tests run side by side, as on a shared agent.

// Each test crate uses its own subset of these helpers.

use super::counting::Counting;
use super::fake_consul;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use p2_apiserver::app::{App, AppState, HttpLimits};
use p2_apiserver::error::ErrorBody;
use p2_apiserver::kv::consul::{
    ConsulConfig, ConsulStore, ConsulTimeouts, DEFAULT_MAX_CONNECTIONS,
};
use p2_apiserver::kv::metered::Metered;
use p2_apiserver::kv::prefixed::Prefixed;
use p2_apiserver::kv::sqlite::SqliteStore;
use p2_apiserver::kv::{Cas, KvPair, KvStore};
use p2_apiserver::labels::Labels;
use p2_apiserver::leader;
use p2_apiserver::model::Limits;
use p2_apiserver::router;
use p2_apiserver::server::{self, Tls};
use p2_apiserver::state::{Mirror, MirrorConfig};
use tempfile::TempDir;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// The real router over a store that lives as long as the app, reading from a started
/// mirror of the store as a served app does.
pub struct TestApp {
    router: Router,
    /// The store the router uses, for arranging and checking state behind the API's back.
    pub store: Arc<dyn KvStore>,
    /// The router's mirror of `store`, loaded before the app is handed out.
    pub mirror: Mirror,
    /// What the router's handlers reach.
    pub state: AppState,
    /// Stops the mirror when the app is dropped.
    _following: DropGuard,
    _backing: Option<Backing>,
}

/// Far longer than the mirror takes to load or to learn of a write; only a mirror that
/// never gets there reaches it.
const MIRROR_PATIENCE: Duration = Duration::from_secs(30);

/// What must outlive an app's store, and what to clear once it is gone.
enum Backing {
    /// The SQLite file.
    Dir(TempDir),
    Namespace(Namespace),
}

/// An app's namespace on Consul, deleted when the app is dropped.
struct Namespace {
    config: ConsulConfig,
    prefix: String,
}

impl TestApp {
    /// A fresh app over an empty store.
    pub async fn new() -> Self {
        Self::wrapping(|store| store).await
    }

    /// A fresh app whose store is `wrap` applied to an empty store; for injecting failures
    /// while keeping real storage underneath.
    pub async fn wrapping(wrap: impl FnOnce(Arc<dyn KvStore>) -> Arc<dyn KvStore>) -> Self {
        Self::configured(wrap, MirrorConfig::default()).await
    }

    /// A fresh app whose store is `wrap` applied to an empty store, mirrored by `config`.
    /// The empty store's operations are measured, as a served store's are.
    pub async fn configured(
        wrap: impl FnOnce(Arc<dyn KvStore>) -> Arc<dyn KvStore>,
        config: MirrorConfig,
    ) -> Self {
        Self::built(wrap, config, Default::default(), Limits::default()).await
    }

    /// A fresh app over an empty store that lets requests through as `access` says.
    pub async fn secured(access: Arc<p2_apiserver::auth::Access>) -> Self {
        Self::built(
            |store| store,
            MirrorConfig::default(),
            access,
            Limits::default(),
        )
        .await
    }

    /// A fresh app over an empty store whose validation applies `validation`, as the server's
    /// command line sets it.
    pub async fn validating(validation: Limits) -> Self {
        Self::built(
            |store| store,
            MirrorConfig::default(),
            Default::default(),
            validation,
        )
        .await
    }

    async fn built(
        wrap: impl FnOnce(Arc<dyn KvStore>) -> Arc<dyn KvStore>,
        config: MirrorConfig,
        access: Arc<p2_apiserver::auth::Access>,
        validation: Limits,
    ) -> Self {
        let (store, backing): (Arc<dyn KvStore>, _) = match consul() {
            None => {
                let dir = tempfile::tempdir().expect("temp dir");
                let path = dir.path().join("p2.db");
                let sqlite = SqliteStore::open(path.to_str().expect("utf-8 temp path"))
                    .await
                    .expect("open sqlite store");
                (
                    Metered::wrap(Arc::new(sqlite), backend()),
                    Backing::Dir(dir),
                )
            }
            Some(config) => {
                let consul: Arc<dyn KvStore> = Arc::new(consul_store(config.clone()));
                let prefix = format!("p2-apiserver-test/{}/", uuid::Uuid::new_v4());
                let store = Prefixed::new(consul, prefix).expect("a valid namespace");
                let namespace = Namespace {
                    config: config.clone(),
                    prefix: store.prefix().to_owned(),
                };
                (
                    Metered::wrap(Arc::new(store), backend()),
                    Backing::Namespace(namespace),
                )
            }
        };
        let store = wrap(store);
        Self::serving(
            store.clone(),
            store,
            config,
            access,
            validation,
            Some(backing),
        )
        .await
    }

    /// A second server over this app's store, as two servers share one store, with its own
    /// router and its own mirror, which follows the store through `wrap` (the server's
    /// requests go to the store directly).
    pub async fn beside(
        &self,
        wrap: impl FnOnce(Arc<dyn KvStore>) -> Arc<dyn KvStore>,
        config: MirrorConfig,
    ) -> Self {
        let followed = wrap(self.store.clone());
        Self::serving(
            self.store.clone(),
            followed,
            config,
            Default::default(),
            Limits::default(),
            None,
        )
        .await
    }

    /// [`TestApp::beside`], its mirror following the store through a counting store, whose
    /// watches can be held back or made to fail.
    pub async fn beside_counted(&self) -> (Self, Arc<Counting>) {
        let mut counting = None;
        let wrap = |store| {
            let store = Counting::new(store);
            counting = Some(store.clone());
            store as Arc<dyn KvStore>
        };
        let app = self.beside(wrap, MirrorConfig::default()).await;
        (app, counting.unwrap())
    }

    /// A fresh app over a counting store, for injecting another writer's changes between a
    /// read and the write made from it.
    pub async fn counted() -> (Self, Arc<Counting>) {
        let mut counting = None;
        let app = Self::wrapping(|store| {
            let store = Counting::new(store);
            counting = Some(store.clone());
            store
        })
        .await;
        (app, counting.unwrap())
    }

    /// An app serving `store` through a mirror of `followed` started with `config`, letting
    /// requests through as `access` says; `backing` is what the store needs to outlive it, for
    /// the app that created the store.
    async fn serving(
        store: Arc<dyn KvStore>,
        followed: Arc<dyn KvStore>,
        config: MirrorConfig,
        access: Arc<p2_apiserver::auth::Access>,
        validation: Limits,
        backing: Option<Backing>,
    ) -> Self {
        let mirror = Mirror::new(followed, config);
        let following = CancellationToken::new();
        mirror.start(&TaskTracker::new(), following.clone());
        assert!(
            mirror.wait_for(0, MIRROR_PATIENCE).await,
            "the mirror never loaded"
        );
        let state = App::serving(
            store.clone(),
            mirror.clone(),
            CancellationToken::new(),
            HttpLimits::default(),
            validation,
            access,
        );
        TestApp {
            router: router::build(state.clone()),
            state,
            store,
            mirror,
            _following: following.drop_guard(),
            _backing: backing,
        }
    }

    /// Waits until the mirror holds what the store holds at `key` (or knows it is gone),
    /// as it eventually does after a write behind the API's back.
    pub async fn mirrored(&self, key: &str) {
        let index = match self.stored(key).await {
            Some(pair) => pair.modify_index,
            None => {
                self.store
                    .keys(key, Some('/'))
                    .await
                    .expect("read the store")
                    .0
            }
        };
        assert!(
            self.mirror.wait_for(index, MIRROR_PATIENCE).await,
            "the mirror never learnt of {key}"
        );
    }

    /// Sends one request through the whole router, middleware included.
    pub async fn send(&self, request: Request<Body>) -> TestResponse {
        call(&self.router, request).await
    }

    /// Sends one request through the whole router, leaving the answer's body unread: for a
    /// stream, which never ends.
    pub async fn open(&self, request: Request<Body>) -> axum::response::Response {
        self.router
            .clone()
            .oneshot(request)
            .await
            .expect("infallible")
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> TestResponse {
        self.send(Request::get(path).body(Body::empty()).unwrap())
            .await
    }

    /// Every page of the list at `path` (which has a query), following each page's
    /// `continue` token until a page has none; fails on an error or a list that never ends.
    pub async fn pages(&self, path: &str) -> Vec<serde_json::Value> {
        let mut pages = Vec::new();
        let mut next = path.to_owned();
        loop {
            let response = self.get(&next).await;
            assert_eq!(response.status, StatusCode::OK, "GET {next}");
            let page = response.json();
            let token = page["continue"].as_str().map(str::to_owned);
            pages.push(page);
            let Some(token) = token else {
                return pages;
            };
            assert!(pages.len() < MOST_PAGES, "{path} never ran out of pages");
            next = format!("{path}&continue={token}");
        }
    }
}

/// More pages than any test's list has: [`TestApp::pages`] stops a token that repeats.
const MOST_PAGES: usize = 1_000;

/// The backend the apps use, as the store metrics name it.
pub fn backend() -> &'static str {
    if consul().is_some() {
        "consul"
    } else {
        "sqlite"
    }
}

/// An app served on a real socket, stopped when dropped.
pub struct Served {
    pub addr: SocketAddr,
    /// `http://ADDR` or `https://ADDR`.
    pub url: String,
    _serving: DropGuard,
}

impl TestApp {
    /// Serves this app's store and mirror on a free loopback port with `limits`, over HTTPS
    /// when given `tls`, as the binary does.
    pub async fn serve(&self, tls: Option<Arc<Tls>>, limits: HttpLimits) -> Served {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let addr = listener.local_addr().expect("the bound address");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let shutdown = CancellationToken::new();
        let state = App::serving(
            self.store.clone(),
            self.mirror.clone(),
            shutdown.clone(),
            limits,
            Limits::default(),
            Default::default(),
        );
        tokio::spawn(server::run_with(
            listener,
            tls,
            state,
            shutdown.clone().cancelled_owned(),
        ));
        Served {
            addr,
            url: format!("{scheme}://{addr}"),
            _serving: shutdown.drop_guard(),
        }
    }
}

/// The Consul the apps use, or `None` for SQLite. Read from the environment once, and said
/// past the test harness's capture, so that a run against SQLite cannot pass for one
/// against Consul.
fn consul() -> Option<&'static ConsulConfig> {
    static CONSUL: OnceLock<Option<ConsulConfig>> = OnceLock::new();
    CONSUL
        .get_or_init(|| {
            let (config, notice) = if std::env::var("P2_TEST_FAKE_CONSUL").is_ok_and(|v| v == "1") {
                let addr = shared_fake();
                let notice = format!("a fake Consul agent at {addr} (P2_TEST_FAKE_CONSUL=1)");
                (Some(fake_config(&addr)), notice)
            } else if let Some(config) = ConsulConfig::from_env() {
                let config = config.unwrap_or_else(|why| panic!("{why}"));
                let notice = format!("the Consul at {} (CONSUL_HTTP_ADDR)", config.base_url);
                (Some(config), notice)
            } else {
                let notice = "SQLite; set CONSUL_HTTP_ADDR to use Consul".to_string();
                (None, notice)
            };
            let _ = writeln!(std::io::stderr(), "API tests: the store is {notice}");
            config
        })
        .as_ref()
}

/// The fake agent listening at `addr`.
fn fake_config(addr: &str) -> ConsulConfig {
    ConsulConfig {
        base_url: format!("http://{addr}"),
        token: None,
        datacenter: None,
    }
}

/// How many servers a test runs over one store at most ([`TestApp::beside`]): they share
/// its Consul client, as they share its namespace.
const SERVERS_PER_STORE: usize = 3;

/// A client for the apps of one test, keeping a connection for each blocking watch of every
/// server that shares it: a server's own client keeps one for each of its watches, and
/// servers beside it that share a budget kept for one would each have a tree's watch wait
/// for a connection until another's whole blocking wait is over (a minute), so that a
/// change reached one server's mirror only then.
fn consul_store(config: ConsulConfig) -> ConsulStore {
    let own_watches = SERVERS_PER_STORE * (Mirror::WATCHES + leader::WATCHES);
    ConsulStore::with_limits(
        config,
        ConsulTimeouts::default(),
        DEFAULT_MAX_CONNECTIONS,
        own_watches,
    )
    .expect("a Consul client")
}

/// Starts the fake agent that every app of this test binary shares, as they would share a
/// real one. Each test has a runtime of its own that ends with it, so the agent runs on a
/// thread and runtime of its own until the binary exits.
fn shared_fake() -> String {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the fake Consul");
        runtime.block_on(async {
            let dir = fake_consul_dir();
            // Held by this never-ending block, so the agent serves until the binary exits.
            let fake = fake_consul::start_in(dir).await;
            let addr = fake.addr.to_string();
            // A key outside every namespace, so that even a lone test does not see the
            // indexes of an empty store.
            consul_store(fake_config(&addr))
                .put("p2-apiserver-test-neighbour", b"", Cas::Any)
                .await
                .expect("write to the fake Consul");
            sender
                .send(addr)
                .expect("the tests wait for the fake Consul");
            std::future::pending::<()>().await;
        });
    });
    receiver.recv().expect("the fake Consul started")
}

/// A folder for the shared agent's files, which outlive the process that ends without
/// dropping it. It is named after the process, so that each run clears what finished runs
/// left without touching a live one's; where process ids cannot be checked (no `/proc`),
/// the folders stay until `cargo clean`.
fn fake_consul_dir() -> TempDir {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake-consul");
    std::fs::create_dir_all(&root).expect("a folder for the fake Consul");
    if Path::new("/proc/self").exists() {
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name.split('-').next().unwrap_or_default();
            if !pid.is_empty() && !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    tempfile::Builder::new()
        .prefix(&format!("{}-", std::process::id()))
        .tempdir_in(&root)
        .expect("a folder for the fake Consul")
}

impl Drop for Namespace {
    /// Best effort: a failure is reported, not raised, since the test has already decided.
    /// The test's runtime may be single-threaded and is blocked here, so the delete runs
    /// on a thread with a runtime and a client of its own.
    fn drop(&mut self) {
        let config = self.config.clone();
        let prefix = std::mem::take(&mut self.prefix);
        let cleared = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let timeouts = ConsulTimeouts {
                request: Duration::from_secs(5),
                ..ConsulTimeouts::default()
            };
            let consul = ConsulStore::with_timeouts(config, timeouts).map_err(|e| e.to_string())?;
            runtime
                .block_on(consul.delete_prefix(&prefix))
                .map_err(|e| format!("{prefix}: {e}"))
        })
        .join();
        if let Ok(Err(e)) = cleared {
            let _ = writeln!(std::io::stderr(), "API tests: could not clear {e}");
        }
    }
}

/// Sends one request to any router, e.g. a test-only one wrapped with
/// `router::with_middleware`.
pub async fn call(router: &Router, request: Request<Body>) -> TestResponse {
    let response = router.clone().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    TestResponse {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("read body").to_bytes(),
    }
}

/// A response read to the end.
#[derive(Debug)]
pub struct TestResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl TestResponse {
    /// The body as JSON, checking the content type says so.
    pub fn json(&self) -> serde_json::Value {
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "{self:?}"
        );
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// The body as the API's error shape, checking its code matches the status.
    pub fn error(&self) -> ErrorBody {
        let body: ErrorBody = serde_json::from_value(self.json()).expect("an error body");
        assert_eq!(body.code, self.status.as_u16(), "{body:?}");
        body
    }

    /// The fields the error's causes name, in the order given.
    pub fn cause_fields(&self) -> Vec<String> {
        self.error().causes.into_iter().map(|c| c.field).collect()
    }

    /// The fields a 422 names, checking the status is 422.
    pub fn unprocessable_fields(&self) -> Vec<String> {
        assert_eq!(self.status, StatusCode::UNPROCESSABLE_ENTITY, "{self:?}");
        self.cause_fields()
    }

    /// The `X-Index` header, which every list and get answers with.
    pub fn x_index(&self) -> u64 {
        self.header("x-index")
            .expect("X-Index")
            .parse()
            .expect("a numeric X-Index")
    }

    /// Checks that the answer, read through to the store, claims no index below `index`,
    /// the `X-Index` of the mirror's answer to `read` before it.
    pub fn assert_not_behind(&self, index: u64, read: &str) {
        let claimed = self.x_index();
        assert!(
            claimed >= index,
            "{read} from the store claims {claimed} below the mirror's {index}"
        );
    }

    /// Checks a create's answer: 201, the new resource's URL in `Location` and `version` in
    /// `ETag`.
    pub fn assert_created(&self, location: &str, version: impl std::fmt::Display) {
        assert_eq!(self.status, StatusCode::CREATED, "{self:?}");
        assert_eq!(self.header("etag"), Some(format!("\"{version}\"").as_str()));
        assert_eq!(self.header("location"), Some(location));
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("text header"))
    }
}

/// An RC of no replicas over no nodes, as `POST /api/v1/rcs` takes it.
pub fn empty_rc_spec() -> serde_json::Value {
    let manifest = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_1.tar.gz\n";
    serde_json::json!({"manifest": manifest, "node_selector": "", "replicas_desired": 0})
}

/// Requests with a body and headers, for the write routes.
impl TestApp {
    /// Creates [`empty_rc_spec`]'s RC through the server; its id.
    pub async fn create_empty_rc(&self) -> String {
        let created = self
            .send_json("POST", "/api/v1/rcs", &[], &empty_rc_spec())
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
        created.json()["id"].as_str().unwrap().to_owned()
    }

    /// `method path` with `body` sent as `application/json` and the extra `headers`.
    pub async fn send_json(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
    ) -> TestResponse {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.send_raw(method, path, &all, body.to_string()).await
    }

    /// `method path` with a body sent exactly as given (headers include any content type),
    /// for malformed and mislabeled bodies.
    pub async fn send_raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Body>,
    ) -> TestResponse {
        let mut request = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request.body(body.into()).unwrap()).await
    }
}

impl TestApp {
    /// `method path` with an optional JSON body (sent as `application/json` unless
    /// `headers` name another content type) and extra headers.
    pub async fn json_request(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
        headers: &[(&str, &str)],
    ) -> TestResponse {
        let mut all = Vec::with_capacity(headers.len() + 1);
        if body.is_some()
            && !headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        {
            all.push(("content-type", "application/json"));
        }
        all.extend_from_slice(headers);
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        self.send_raw(method, path, &all, body).await
    }

    /// `PATCH path` with `body` sent as a JSON merge patch and the extra `headers`.
    pub async fn merge_patch(
        &self,
        path: &str,
        body: &serde_json::Value,
        headers: &[(&str, &str)],
    ) -> TestResponse {
        let mut all = vec![("content-type", "application/merge-patch+json")];
        all.extend_from_slice(headers);
        self.json_request("PATCH", path, Some(body), &all).await
    }

    /// Every key in the store with its value, to check that a request wrote nothing.
    pub async fn dump(&self) -> Vec<(String, Vec<u8>)> {
        let listing = self.store.list("").await.expect("list the store");
        listing
            .pairs
            .into_iter()
            .map(|p| (p.key, p.value.to_vec()))
            .collect()
    }

    /// Every key under `prefix`, sorted.
    pub async fn keys(&self, prefix: &str) -> Vec<String> {
        self.store
            .keys(prefix, None)
            .await
            .expect("list the keys")
            .1
    }

    /// The pair stored at `key`, if any.
    pub async fn stored(&self, key: &str) -> Option<KvPair> {
        self.store.get(key).await.expect("read the store")
    }

    /// The value stored at `key` as JSON, if any.
    pub async fn stored_json(&self, key: &str) -> Option<serde_json::Value> {
        let pair = self.stored(key).await?;
        Some(serde_json::from_slice(&pair.value).expect("a JSON value"))
    }

    /// The value stored at `key` as text, if any.
    pub async fn stored_text(&self, key: &str) -> Option<String> {
        let pair = self.stored(key).await?;
        Some(String::from_utf8(pair.value.to_vec()).expect("a text value"))
    }

    /// Writes `value` at `key` behind the API's back, as P2 or another tool would, and
    /// waits until the mirror has learnt of it.
    pub async fn put_raw(&self, key: &str, value: impl AsRef<[u8]>) {
        self.store
            .put(key, value.as_ref(), Cas::Any)
            .await
            .expect("write the store");
        self.mirrored(key).await;
    }

    /// Writes `value` as JSON at `key` behind the API's back.
    pub async fn put_json(&self, key: &str, value: &serde_json::Value) {
        self.put_raw(key, value.to_string()).await;
    }
}

/// A `GET` held by a blocking list, running in the background until a change wakes it.
pub struct Held(tokio::task::JoinHandle<TestResponse>);

impl TestApp {
    /// Starts `GET path` in the background and checks, after 50ms, that it is held.
    pub async fn get_held(self: &Arc<Self>, path: String) -> Held {
        let held = Held::start(self, path).await;
        held.assert_held("the request did not block");
        held
    }
}

impl Held {
    /// Starts `GET path` in the background and gives it 50ms to be answered.
    pub async fn start(app: &Arc<TestApp>, path: String) -> Held {
        let app = app.clone();
        let held = Held(tokio::spawn(async move { app.get(&path).await }));
        tokio::time::sleep(Duration::from_millis(50)).await;
        held
    }

    /// Whether the request was answered already rather than held.
    pub fn is_answered(&self) -> bool {
        self.0.is_finished()
    }

    /// Panics with `why` unless the request is still held.
    pub fn assert_held(&self, why: &str) {
        assert!(!self.is_answered(), "{why}");
    }

    /// The answer, once a change has woken the request; panics with `why` after 20s: long
    /// enough for a loaded machine, and well short of the 30s most held reads wait, so that
    /// a wake-up that never comes still fails rather than times out into an answer.
    pub async fn woken(self, why: &str) -> TestResponse {
        tokio::time::timeout(Duration::from_secs(20), self.0)
            .await
            .expect(why)
            .expect("the request task")
    }
}

/// A blocking `GET {path}index=N&wait=200ms` (`path` ends in `?` or `&`) from `index` on:
/// the answer that timed out at its index, and how long it was held. An index taken before
/// the mirror held every write made just before (its watches slow on a loaded machine) is
/// answered at once at a newer one; the read blocks again at that one, a few times at most.
pub async fn times_out_at_its_index(
    app: &TestApp,
    path: &str,
    mut index: u64,
) -> (TestResponse, Duration) {
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let response = app.get(&format!("{path}index={index}&wait=200ms")).await;
        if response.x_index() == index {
            return (response, started.elapsed());
        }
        index = response.x_index();
    }
    panic!("{path}: answered at once at a newer index again and again");
}

/// The `id` of every item of a list answer's page, in order.
pub fn item_ids(page: &serde_json::Value) -> Vec<String> {
    page["items"]
        .as_array()
        .expect("a page of items")
        .iter()
        .map(|item| item["id"].as_str().expect("an item id").to_owned())
        .collect()
}

/// Checks that the OpenAPI document names each `(path, method, operation id)` and tags it
/// `tag`; returns the operations for further checks.
pub fn assert_operations<'a>(
    document: &'a serde_json::Value,
    tag: &str,
    operations: &[(&str, &str, &str)],
) -> Vec<&'a serde_json::Value> {
    operations
        .iter()
        .map(|(path, method, id)| {
            let operation = &document["paths"][*path][*method];
            assert_eq!(operation["operationId"], *id, "{method} {path}");
            assert_eq!(
                operation["tags"],
                serde_json::json!([tag]),
                "{method} {path}"
            );
            operation
        })
        .collect()
}

/// A label set from literal pairs.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
