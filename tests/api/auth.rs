//! Bearer tokens and roles: every documented operation against every role, agents held to
//! their nodes, `?force=true`, CORS preflights, and through the real binary the refusal to
//! serve without tokens off loopback and token rotation on SIGHUP.

use std::cell::RefCell;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use axum::Router;
use p2_apiserver::app::App;
use p2_apiserver::auth::Access;

use crate::contract::disagreements;
use p2_apiserver::router;
use sha2::{Digest, Sha256};
use tempfile::TempDir;

use crate::support::api::{call, TestApp, TestResponse};

/// The roles, each with its token.
const ROLES: [(&str, &str); 4] = [
    ("viewer", "viewer-token"),
    ("deployer", "deployer-token"),
    ("agent", "agent-token"),
    ("admin", "admin-token"),
];

/// The roles allowed an operation needing `required`, spelled out independently of the code.
fn allowed(required: &str) -> &'static [&'static str] {
    match required {
        "viewer" => &["viewer", "deployer", "agent", "admin"],
        "deployer" => &["deployer", "admin"],
        "agent" => &["agent", "admin"],
        "admin" => &["admin"],
        other => panic!("unknown role {other:?}"),
    }
}

/// A token file line: name, role, the token itself (only its digest is written), nodes.
pub(crate) fn token_file(path: &Path, tokens: &[(&str, &str, &str, Option<&str>)]) {
    let mut text = String::from("tokens:\n");
    for (name, role, token, nodes) in tokens {
        let digest = format!("{:x}", Sha256::digest(token.as_bytes()));
        text += &format!("  - name: {name}\n    role: {role}\n    sha256: {digest}\n");
        if let Some(nodes) = nodes {
            text += &format!("    nodes: [{nodes}]\n");
        }
    }
    std::fs::write(path, text).unwrap();
}

/// Tokens a test revokes one of while its requests are under way: a viewer's,
/// `watcher-token`, and a deployer's, `writer-token`, in a token file of their own.
pub(crate) struct Revocable {
    pub app: TestApp,
    path: std::path::PathBuf,
    _dir: TempDir,
}

impl Revocable {
    const WRITER: (&str, &str, &str, Option<&str>) = ("writer", "deployer", "writer-token", None);

    pub async fn new() -> Revocable {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        let watcher = ("watcher", "viewer", "watcher-token", None);
        token_file(&path, &[watcher, Self::WRITER]);
        let access = Access::new(Some(&path), Vec::new()).unwrap();
        let app = TestApp::secured(Arc::new(access)).await;
        Revocable {
            app,
            path,
            _dir: dir,
        }
    }

    /// Re-reads the token file without `watcher-token`.
    pub fn revoke_watcher(&self) {
        token_file(&self.path, &[Self::WRITER]);
        assert_eq!(self.app.state.access.reload().unwrap().unwrap(), 1);
    }
}

/// The real router over a test store, with the tokens of [`ROLES`] and an agent held to
/// `node-1`.
struct Secured {
    router: Router,
    _app: TestApp,
    _dir: TempDir,
}

impl Secured {
    async fn new(cors_origins: &[&str]) -> Self {
        Self::serving(cors_origins, false).await
    }

    /// With the metrics and the version public when `metrics_public`.
    async fn serving(cors_origins: &[&str], metrics_public: bool) -> Self {
        let app = TestApp::new().await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        let mut tokens: Vec<_> = ROLES
            .iter()
            .map(|&(role, token)| (role, role, token, None))
            .collect();
        tokens.push(("agent-1", "agent", "node-1-token", Some("node-1")));
        token_file(&path, &tokens);
        let origins = cors_origins
            .iter()
            .map(|o| HeaderValue::from_str(o).unwrap())
            .collect();
        let mut state = App::new(app.store.clone());
        Arc::get_mut(&mut state).unwrap().access = Arc::new(
            Access::new(Some(&path), origins)
                .unwrap()
                .with_metrics_public(metrics_public),
        );
        Secured {
            router: router::build(state),
            _app: app,
            _dir: dir,
        }
    }

    async fn send(&self, method: &str, uri: &str, token: Option<&str>) -> TestResponse {
        call(&self.router, probe(method, uri, token)).await
    }
}

/// A request of `method` to `uri` with `token`, its body (for a write) `{}`.
fn probe(method: &str, uri: &str, token: Option<&str>) -> Request<Body> {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if matches!(method, "POST" | "PUT" | "PATCH") {
        request = request.header("content-type", "application/json");
    }
    request.body(Body::from("{}")).unwrap()
}

/// A plausible value for each path parameter of the document.
fn fill(path: &str) -> String {
    path.split('/')
        .map(|segment| match segment {
            "{type}" => "node",
            "{id}" => "3f8a1c2e-4b5d-4e6f-8a9b-0c1d2e3f4a5b",
            "{node}" => "node-1",
            "{pod_id}" => "web",
            "{name}" => "color",
            s if s.starts_with('{') => panic!("no value for the parameter {s} of {path}"),
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn assert_denied(response: &TestResponse, status: StatusCode, what: &str) {
    assert_eq!(response.status, status, "{what}: {response:?}");
    assert!(!response.error().message.is_empty(), "{what}");
    if status == StatusCode::UNAUTHORIZED {
        assert_eq!(
            response.header("www-authenticate"),
            Some(r#"Bearer realm="p2-apiserver""#),
            "{what}"
        );
    }
}

fn assert_let_through(response: &TestResponse, what: &str) {
    assert!(
        ![StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&response.status),
        "{what}: {response:?}"
    );
}

// Every request carries a query parameter no route takes, so that a request let through is
// refused with 400 by its handler and changes nothing.
#[tokio::test]
async fn every_documented_operation_needs_its_role() {
    let secured = Secured::new(&[]).await;
    let document = secured.send("GET", "/openapi.json", None).await.json();
    assert!(document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer");
    let mut checked = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let method = method.to_uppercase();
            let what = format!("{method} {path}");
            let required = operation["x-required-role"]
                .as_str()
                .unwrap_or_else(|| panic!("{what} has no entry in the roles table"));
            let uri = format!("{}?auth_probe=1", fill(path));
            if required == "none" {
                assert!(operation.get("security").is_none(), "{what}");
                assert_let_through(&secured.send(&method, &uri, None).await, &what);
                continue;
            }
            assert_eq!(operation["security"][0]["bearer"], serde_json::json!([]));
            let response = secured.send(&method, &uri, None).await;
            assert_denied(&response, StatusCode::UNAUTHORIZED, &what);
            let found = disagreements(&document, &method, path, &response);
            assert!(found.is_empty(), "{found:#?}");
            let response = secured.send(&method, &uri, Some("unknown")).await;
            assert_denied(&response, StatusCode::UNAUTHORIZED, &what);
            let mut refused = false;
            for (role, token) in ROLES {
                let response = secured.send(&method, &uri, Some(token)).await;
                let found = disagreements(&document, &method, path, &response);
                assert!(found.is_empty(), "{found:#?}");
                let what = format!("{what} as {role}");
                if allowed(required).contains(&role) {
                    assert_let_through(&response, &what);
                } else {
                    assert_denied(&response, StatusCode::FORBIDDEN, &what);
                    refused = true;
                }
            }
            // A 403 is documented where a role is refused (or `?force=true` needs `admin`),
            // and only there.
            let forceable = operation["parameters"]
                .as_array()
                .is_some_and(|params| params.iter().any(|p| p["name"] == "force"));
            let documented = operation["responses"].get("403").is_some();
            assert_eq!(documented, refused || forceable, "{what}: its 403");
            checked += 1;
        }
    }
    assert!(checked > 30, "only {checked} operations checked");
}

#[tokio::test]
async fn reads_answer_head_and_public_routes_need_no_token() {
    let secured = Secured::new(&[]).await;
    let response = secured.send("HEAD", "/api/v1/rcs?auth_probe=1", None).await;
    assert_eq!(response.status, StatusCode::UNAUTHORIZED);
    let response = secured
        .send("HEAD", "/api/v1/rcs?auth_probe=1", Some("viewer-token"))
        .await;
    assert_let_through(&response, "HEAD as viewer");
    for uri in ["/healthz", "/openapi.json", "/docs/"] {
        assert_eq!(secured.send("GET", uri, None).await.status, 200, "{uri}");
    }
    // An unknown route is a 404 to anyone.
    assert_eq!(secured.send("GET", "/nowhere", None).await.status, 404);
}

#[tokio::test]
async fn metrics_and_version_need_a_viewer_unless_public() {
    let secured = Secured::new(&[]).await;
    for uri in ["/metrics", "/version"] {
        let response = secured.send("GET", uri, None).await;
        assert_denied(&response, StatusCode::UNAUTHORIZED, uri);
        let response = secured.send("GET", uri, Some("viewer-token")).await;
        assert_eq!(response.status, StatusCode::OK, "{uri}: {response:?}");
    }
    let public = Secured::serving(&[], true).await;
    for uri in ["/metrics", "/version"] {
        let response = public.send("GET", uri, None).await;
        assert_eq!(response.status, StatusCode::OK, "{uri}: {response:?}");
    }
    // Only they are public.
    let response = public.send("GET", "/api/v1/rcs", None).await;
    assert_denied(&response, StatusCode::UNAUTHORIZED, "/api/v1/rcs");
}

/// The document a server serves tells what it asks: with `--metrics-public`, `/metrics` and
/// `/version` need no token there (no security requirement, no 401 or 403, `x-required-role`
/// none), as the probes; every other operation, and both without the flag, as documented.
#[tokio::test]
async fn the_served_document_tells_whether_the_metrics_are_public() {
    async fn document(secured: &Secured) -> serde_json::Value {
        let response = secured.send("GET", "/openapi.json", None).await;
        assert_eq!(response.status, StatusCode::OK, "{response:?}");
        serde_json::from_slice(&response.body).unwrap()
    }
    let mut default = document(&Secured::new(&[]).await).await;
    let mut public = document(&Secured::serving(&[], true).await).await;
    for path in ["/metrics", "/version"] {
        let taken = |doc: &mut serde_json::Value| {
            let paths = doc["paths"].as_object_mut().unwrap();
            paths.remove(path).unwrap()["get"].take()
        };
        let (default, public) = (taken(&mut default), taken(&mut public));
        assert_eq!(default["x-required-role"], "viewer", "{path}: {default}");
        assert!(
            default["responses"].get("401").is_some(),
            "{path}: {default}"
        );
        assert_eq!(public["x-required-role"], "none", "{path}: {public}");
        assert_eq!(public.get("security"), None, "{path}: {public}");
        for status in ["401", "403"] {
            assert_eq!(public["responses"].get(status), None, "{path}: {public}");
        }
        let description = public["description"].as_str().unwrap_or_default();
        assert!(
            !description.contains("Needs a token"),
            "{path}: {description}"
        );
        assert!(
            description.contains("--metrics-public"),
            "{path}: {description}"
        );
    }
    assert_eq!(public, default);
}

/// The document a server without `--auth-tokens` serves tells that it lets every request
/// through: no bearer scheme, and no operation with a security requirement, a 401 or 403 or a
/// role (`x-required-role` none, the role sentence of its description saying why), `?force`
/// included, as the server answers; `--metrics-public` changes nothing there. Every other part
/// of the document is as served with tokens.
#[tokio::test]
async fn the_served_document_tells_when_no_token_is_needed() {
    let no_tokens = TestApp::new().await;
    let mut open = no_tokens.get("/openapi.json").await.json();
    let secured = Secured::new(&[]).await;
    let mut tokened = secured.send("GET", "/openapi.json", None).await.json();

    let mut opened = 0;
    for (path, item) in tokened["paths"].as_object_mut().unwrap() {
        for (method, needing) in item.as_object_mut().unwrap() {
            let what = format!("{} {path}", method.to_uppercase());
            let operation = &mut open["paths"][path.as_str()][method.as_str()];
            assert_eq!(operation["x-required-role"], "none", "{what}");
            assert_eq!(operation.get("security"), None, "{what}");
            for status in ["401", "403"] {
                let answer = operation["responses"].get(status);
                assert_eq!(answer, None, "{what}");
            }
            let force = if what == "DELETE /api/v1/rcs/{id}" {
                "&force=true"
            } else {
                ""
            };
            let uri = format!("{}?auth_probe=1{force}", fill(path));
            let response = no_tokens
                .send(probe(&method.to_uppercase(), &uri, None))
                .await;
            assert_let_through(&response, &what);
            if needing["x-required-role"] == "none" {
                assert_eq!(operation, needing, "{what}");
                continue;
            }
            let described = needing["description"].as_str().unwrap();
            let (text, sentence) = described.rsplit_once("Needs a token").unwrap();
            assert!(!sentence.contains("\n\n"), "{what}: {described:?}");
            let told = format!("{text}Needs no token: this server runs without `--auth-tokens`.");
            assert_eq!(operation["description"], told.as_str(), "{what}");
            for taken in ["description", "x-required-role", "security"] {
                needing.as_object_mut().unwrap().remove(taken);
                operation.as_object_mut().unwrap().remove(taken);
            }
            for status in ["401", "403"] {
                needing["responses"].as_object_mut().unwrap().remove(status);
            }
            assert_eq!(operation, needing, "{what}");
            opened += 1;
        }
    }
    assert!(opened > 30, "only {opened} operations opened");
    let schemes = open["components"]
        .as_object_mut()
        .unwrap()
        .remove("securitySchemes");
    assert_eq!(schemes, None, "the bearer scheme");
    let schemes = tokened["components"]
        .as_object_mut()
        .unwrap()
        .remove("securitySchemes");
    assert!(schemes.unwrap()["bearer"].is_object());
    assert_eq!(open, tokened);
    let served = no_tokens.get("/openapi.json").await.json();
    let public = Arc::new(Access::default().with_metrics_public(true));
    let public = TestApp::secured(public).await.get("/openapi.json").await;
    assert!(
        public.json() == served,
        "--metrics-public changed the document"
    );
}

/// A method a route does not take is 405 to anyone, with or without a token, as an unknown
/// route is 404: P2's label routes, whose own 405 says which of their two paths takes what,
/// as any other.
#[tokio::test]
async fn a_method_no_route_takes_is_405_whatever_the_token() {
    let secured = Secured::new(&[]).await;
    let label_path = ["POST", "PATCH"];
    for (path, methods, allow) in [
        (
            "/api/v1/rcs/3f8a1c2e-4b5d-4e6f-8a9b-0c1d2e3f4a5b",
            ["POST", "PUT"],
            None,
        ),
        (
            "/api/labels/node/node-1",
            label_path,
            Some("GET,HEAD,PUT,DELETE"),
        ),
        (
            "/api/labels/node/node-1/color",
            label_path,
            Some("PUT,DELETE"),
        ),
    ] {
        for method in methods {
            for token in [None, Some("viewer-token"), Some("deployer-token")] {
                let what = format!("{method} {path} with {token:?}");
                let response = secured.send(method, path, token).await;
                assert_eq!(
                    response.status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{what}: {response:?}"
                );
                assert_eq!(response.error().reason, "MethodNotAllowed", "{what}");
                if let Some(allow) = allow {
                    assert_eq!(response.header("allow"), Some(allow), "{what}");
                }
            }
        }
    }
}

#[tokio::test]
async fn force_deletes_need_admin() {
    let secured = Secured::new(&[]).await;
    let uri = format!("{}?force=true", fill("/api/v1/rcs/{id}"));
    let response = secured.send("DELETE", &uri, Some("deployer-token")).await;
    assert_denied(&response, StatusCode::FORBIDDEN, "force as deployer");
    let response = secured.send("DELETE", &uri, Some("admin-token")).await;
    assert_eq!(response.status, StatusCode::NOT_FOUND, "{response:?}");
}

/// `force` on an operation that does not take it is an unknown query parameter: a malformed
/// request, 400 whatever the token's role, not 403 as though it asked for `admin`.
#[tokio::test]
async fn force_where_no_operation_takes_it_is_an_unknown_parameter() {
    let secured = Secured::new(&[]).await;
    let readers = ["viewer-token", "deployer-token"];
    for (method, path, tokens) in [
        ("GET", "/api/v1/rcs", &readers[..]),
        ("GET", "/api/v1/rcs/{id}", &readers),
        ("DELETE", "/api/v1/rolls/{id}", &["deployer-token"]),
    ] {
        let uri = format!("{}?force=true", fill(path));
        for &token in tokens {
            let response = secured.send(method, &uri, Some(token)).await;
            assert_eq!(
                response.status,
                StatusCode::BAD_REQUEST,
                "{method} {uri} as {token}: {response:?}"
            );
            assert!(
                response.error().message.contains("force"),
                "{method} {uri} as {token}: {response:?}"
            );
        }
    }
}

#[tokio::test]
async fn an_agent_listing_nodes_reports_only_for_them() {
    let secured = Secured::new(&[]).await;
    let token = Some("node-1-token");
    for (method, ours, theirs) in [
        (
            "PUT",
            "/api/v1/reality/node-1/web",
            "/api/v1/reality/node-2/web",
        ),
        (
            "DELETE",
            "/api/v1/reality/node-1/web",
            "/api/v1/reality/node-2/web",
        ),
        (
            "PUT",
            "/api/v1/health/web/node-1",
            "/api/v1/health/web/node-2",
        ),
        (
            "DELETE",
            "/api/v1/health/web/node-1",
            "/api/v1/health/web/node-2",
        ),
    ] {
        let ours = format!("{ours}?auth_probe=1");
        let theirs = format!("{theirs}?auth_probe=1");
        assert_let_through(&secured.send(method, &ours, token).await, &ours);
        let response = secured.send(method, &theirs, token).await;
        assert_denied(&response, StatusCode::FORBIDDEN, &theirs);
        // Reading is not reporting.
        assert_let_through(&secured.send("GET", &theirs, token).await, &theirs);
    }
}

#[tokio::test]
async fn cors_preflights_are_answered_for_allowed_origins_only() {
    let secured = Secured::new(&["https://dash.example"]).await;
    let preflight = |origin: &'static str| {
        Request::options("/api/v1/rcs")
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type",
            )
            .body(Body::empty())
            .unwrap()
    };
    let response = call(&secured.router, preflight("https://dash.example")).await;
    assert!(response.status.is_success(), "{response:?}");
    assert_eq!(
        response.header("access-control-allow-origin"),
        Some("https://dash.example")
    );
    let methods = response.header("access-control-allow-methods").unwrap();
    assert!(methods.contains("POST"), "{methods}");
    let headers = response.header("access-control-allow-headers").unwrap();
    assert!(headers.contains("authorization"), "{headers}");

    // Without Access-Control-Allow-Origin naming it, the browser refuses the call.
    let response = call(&secured.router, preflight("https://elsewhere.example")).await;
    assert_eq!(response.header("access-control-allow-origin"), None);

    // Actual requests from the allowed origin get the header too, with the answer's.
    let request = Request::get("/healthz")
        .header("origin", "https://dash.example")
        .body(Body::empty())
        .unwrap();
    let response = call(&secured.router, request).await;
    assert_eq!(
        response.header("access-control-allow-origin"),
        Some("https://dash.example")
    );
}

/// Only an OPTIONS naming the method a page means to use (`Access-Control-Request-Method`)
/// is a preflight: any other is answered by the routes as it is without `--cors-origin`, a
/// route's 405 or an unknown route's 404, with the JSON body.
#[tokio::test]
async fn an_options_request_that_is_no_preflight_is_answered_by_the_routes() {
    let secured = Secured::new(&["https://dash.example"]).await;
    for (path, status) in [
        ("/api/v1/rcs", StatusCode::METHOD_NOT_ALLOWED),
        ("/nowhere", StatusCode::NOT_FOUND),
    ] {
        let response = secured.send("OPTIONS", path, None).await;
        assert_eq!(response.status, status, "{path}: {response:?}");
        assert_eq!(response.error().code, status.as_u16(), "{path}");
    }
}

#[tokio::test]
async fn cors_preflights_get_a_request_id_like_every_request() {
    let secured = Secured::new(&["https://dash.example"]).await;
    let preflight = |id: Option<&str>| {
        let mut request = Request::options("/api/v1/rcs")
            .header("origin", "https://dash.example")
            .header("access-control-request-method", "POST");
        if let Some(id) = id {
            request = request.header("x-request-id", id);
        }
        request.body(Body::empty()).unwrap()
    };
    let response = call(&secured.router, preflight(None)).await;
    assert!(response.status.is_success(), "{response:?}");
    let id = response.header("x-request-id").expect("a request id");
    uuid::Uuid::parse_str(id).expect("a UUID");
    let response = call(&secured.router, preflight(Some("preflight-7"))).await;
    assert_eq!(response.header("x-request-id"), Some("preflight-7"));
}

#[tokio::test]
async fn cors_answers_let_pages_read_the_headers_the_api_answers_with() {
    let secured = Secured::new(&["https://dash.example"]).await;
    let request = Request::get("/api/v1/labels/node/node-1")
        .header("origin", "https://dash.example")
        .header("authorization", "Bearer viewer-token")
        .body(Body::empty())
        .unwrap();
    let response = call(&secured.router, request).await;
    assert!(response.header("etag").is_some(), "{response:?}");
    let exposed = response.header("access-control-expose-headers").unwrap();
    let exposed: Vec<_> = exposed.split(',').map(str::trim).collect();
    // An ETag a page cannot read is no use to it for If-Match.
    for header in ["etag", "x-index", "x-request-id", "location", "retry-after"] {
        assert!(exposed.contains(&header), "{header} in {exposed:?}");
    }
}

// The real binary.

/// A `p2-apiserver serve` process without farms, killed when dropped; its stdout lines arrive
/// on `log`.
struct Server {
    child: Child,
    addr: String,
    log: mpsc::Receiver<String>,
    /// Every line read from `log` so far.
    seen: RefCell<Vec<String>>,
}

impl Server {
    fn start(store: &TempDir, args: &[&str]) -> Server {
        let store = format!("sqlite://{}", store.path().join("p2.db").display());
        let mut child = Command::new(env!("CARGO_BIN_EXE_p2-apiserver"))
            .args(["serve", "--store", &store, "--no-farms"])
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("P2_AUTH_TOKENS")
            .env_remove("P2_INSECURE_NO_AUTH")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Server {
            child,
            addr: String::new(),
            log,
            seen: RefCell::default(),
        };
        let line = server.wait_for_log("listening on ");
        let (_, addr) = line.split_once("listening on ").unwrap();
        // A wildcard address is reached on loopback.
        server.addr = addr.trim().replace("0.0.0.0", "127.0.0.1");
        server
    }

    /// The first log line from now on containing `text`.
    fn wait_for_log(&self, text: &str) -> String {
        loop {
            let line = self
                .log
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("the server never logged {text:?}"));
            self.seen.borrow_mut().push(line.clone());
            if line.contains(text) {
                return line;
            }
        }
    }

    /// Every line logged, once the server has exited.
    fn seen(&self) -> Vec<String> {
        let mut seen = self.seen.borrow_mut();
        seen.extend(self.log.iter());
        seen.clone()
    }

    /// The status of `GET path` with `token`.
    fn status(&self, path: &str, token: Option<&str>) -> u16 {
        let mut conn = TcpStream::connect(&self.addr).unwrap();
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: test\r\n{auth}Connection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        conn.read_to_string(&mut response).unwrap();
        response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {response:?}"))
    }

    fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn without_tokens_the_binary_serves_off_loopback_only_when_told_insecure() {
    let store = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", store.path().join("p2.db").display());
    let output = Command::new(env!("CARGO_BIN_EXE_p2-apiserver"))
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--store",
            &url,
            "--no-farms",
        ])
        .env_remove("P2_AUTH_TOKENS")
        .env_remove("P2_INSECURE_NO_AUTH")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("without authentication"), "{stderr}");
    assert!(stderr.contains("--insecure-no-auth"), "{stderr}");
    assert!(stderr.contains("--auth-tokens"), "{stderr}");

    let server = Server::start(&store, &["--listen", "0.0.0.0:0", "--insecure-no-auth"]);
    assert_eq!(server.status("/api/v1/rcs", None), 200);
}

#[test]
fn sighup_rereads_the_token_file_and_keeps_it_when_the_new_one_is_bad() {
    let store = tempfile::tempdir().unwrap();
    let tokens = store.path().join("tokens.yaml");
    token_file(&tokens, &[("ci", "viewer", "old-token", None)]);
    let mut server = Server::start(
        &store,
        &[
            "--listen",
            "127.0.0.1:0",
            "--auth-tokens",
            tokens.to_str().unwrap(),
        ],
    );
    assert_eq!(server.status("/api/v1/rcs", Some("old-token")), 200);
    assert_eq!(server.status("/api/v1/rcs", Some("new-token")), 401);

    token_file(&tokens, &[("ci", "viewer", "new-token", None)]);
    server.signal("HUP");
    server.wait_for_log("token file re-read: 1 tokens");
    assert_eq!(server.status("/api/v1/rcs", Some("new-token")), 200);
    assert_eq!(server.status("/api/v1/rcs", Some("old-token")), 401);

    std::fs::write(&tokens, "tokens: [unterminated").unwrap();
    server.signal("HUP");
    server.wait_for_log("keeping the previous tokens");
    assert_eq!(server.status("/api/v1/rcs", Some("new-token")), 200);

    // Requests are logged with the token's name, never the token.
    server.signal("TERM");
    let status = server.child.wait().unwrap();
    assert!(status.success());
    let log = server.seen();
    assert!(
        log.iter().any(|line| line.contains("subject=ci")),
        "{log:#?}"
    );
    for token in ["old-token", "new-token"] {
        assert!(!log.iter().any(|line| line.contains(token)), "{log:#?}");
    }
}

/// A read may wait long (a blocking query, up to ten minutes) while its token was checked
/// only as it began: once the token file is re-read without that token, the waiting read
/// is answered 401 at once, rather than with the change that comes after.
#[tokio::test]
async fn a_blocking_read_is_refused_once_its_token_is_revoked() {
    let tokens = Revocable::new().await;
    let app = &tokens.app;
    let request = |method: &str, path: &str, token: &str, body: &'static str| {
        Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    };
    let listed = app
        .send(request("GET", "/api/v1/labels/node", "watcher-token", ""))
        .await;
    assert_eq!(listed.status, StatusCode::OK);
    let index = listed.header("x-index").unwrap().to_owned();
    let blocking = format!("/api/v1/labels/node?index={index}&wait=30s");
    let blocked = app.send(request("GET", &blocking, "watcher-token", ""));
    let revoke_then_change = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        tokens.revoke_watcher();
        let body = r#"{"labels": {"role": "web"}}"#;
        let labelled = app
            .send(request(
                "PUT",
                "/api/v1/labels/node/node1",
                "writer-token",
                body,
            ))
            .await;
        assert_eq!(labelled.status, StatusCode::OK);
    };
    let (answer, ()) = tokio::join!(blocked, revoke_then_change);
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{answer:?}");
    assert!(answer.header("www-authenticate").is_some());
}
