//! Who may call the API: bearer tokens with roles (`--auth-tokens`), the one table of the role
//! each operation needs, and the browser origins allowed to call it (`--cors-origin`).
//!
//! The token file is YAML (so JSON works too): per token its `name` (the subject logged with
//! each request), its `role`, for an `agent` optionally the `nodes` it may report for, and the
//! hex SHA-256 of the token, never the token itself. A presented token is hashed and its digest
//! compared in constant time (`subtle`) with every configured digest.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use anyhow::{bail, Context};
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::watch;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{HeaderBuilder, ObjectBuilder, RefOr, Type};

use crate::error::{ApiError, ErrorBody};
use crate::model::event::{is_servers_actor_name, Actor, ANONYMOUS};

/// What a token may do. `viewer` reads; `deployer` and `agent` each add their writes to it;
/// `admin` may do everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Every read (GET and HEAD) and the change stream.
    Viewer,
    /// Viewer, plus creating, patching and deleting RCs, rolls and daemon sets, and label
    /// writes.
    Deployer,
    /// Viewer, plus the node agents' reports: reality and health.
    Agent,
    /// Everything, including `?force=true`.
    Admin,
}

impl Role {
    /// Whether this role may do what `needed` may.
    pub fn grants(self, needed: Role) -> bool {
        self == needed || self == Role::Admin || needed == Role::Viewer
    }

    /// Whether every role grants this one, so that no known token is refused it (403).
    fn granted_to_all(self) -> bool {
        [Role::Viewer, Role::Deployer, Role::Agent, Role::Admin]
            .into_iter()
            .all(|role| role.grants(self))
    }

    /// The name used in the token file and in the OpenAPI document.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Deployer => "deployer",
            Role::Agent => "agent",
            Role::Admin => "admin",
        }
    }
}

/// What an operation needs from its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: probes and the API's documentation.
    Nobody,
    /// A token whose role grants this one.
    Role(Role),
    /// `viewer`, or nothing when the server runs with `--metrics-public`: the metrics and
    /// the version, which scrapers may be let read without a token.
    ViewerUnlessPublic,
}

/// The role each operation needs, by method and route template (as the OpenAPI document
/// spells it; a served catch-all such as `{*id}` matches the document's parameters). HEAD
/// needs what GET does. An operation not listed needs `admin`, and `?force=true` needs
/// `admin` on an operation that takes it ([`FORCEABLE`]). An `agent` token listing `nodes`
/// may only do its agent operations on a route whose `node` parameter is one of them.
const RULES: &[(Method, &str, Need)] = &[
    (Method::GET, "/healthz", Need::Nobody),
    (Method::GET, "/readyz", Need::Nobody),
    (Method::GET, "/metrics", Need::ViewerUnlessPublic),
    (Method::GET, "/version", Need::ViewerUnlessPublic),
    (Method::GET, "/openapi.json", Need::Nobody),
    (Method::GET, "/docs", Need::Nobody),
    (Method::GET, "/docs/", Need::Nobody),
    (Method::GET, "/docs/{rest}", Need::Nobody),
    (Method::GET, "/api/v1/labels/{type}", VIEWER),
    (Method::GET, "/api/v1/labels/{type}/{id}", VIEWER),
    (Method::PUT, "/api/v1/labels/{type}/{id}", DEPLOYER),
    (Method::PATCH, "/api/v1/labels/{type}/{id}", DEPLOYER),
    (Method::DELETE, "/api/v1/labels/{type}/{id}", DEPLOYER),
    (Method::GET, "/api/select", VIEWER),
    (Method::GET, "/api/labels/{type}", VIEWER),
    (Method::GET, "/api/labels/{type}/{id}", VIEWER),
    (Method::PUT, "/api/labels/{type}/{id}", DEPLOYER),
    (Method::DELETE, "/api/labels/{type}/{id}", DEPLOYER),
    (Method::PUT, "/api/labels/{type}/{id}/{name}", DEPLOYER),
    (Method::DELETE, "/api/labels/{type}/{id}/{name}", DEPLOYER),
    (Method::GET, "/api/v1/nodes", VIEWER),
    (Method::GET, "/api/v1/nodes/{node}", VIEWER),
    (Method::GET, "/api/v1/pods", VIEWER),
    (Method::GET, "/api/v1/health/{pod_id}", VIEWER),
    (Method::GET, "/api/v1/health/{pod_id}/{node}", VIEWER),
    (Method::PUT, "/api/v1/health/{pod_id}/{node}", AGENT),
    (Method::DELETE, "/api/v1/health/{pod_id}/{node}", AGENT),
    (Method::GET, "/api/v1/intent/{node}/{pod_id}", VIEWER),
    (Method::GET, "/api/v1/reality/{node}/{pod_id}", VIEWER),
    (Method::PUT, "/api/v1/reality/{node}/{pod_id}", AGENT),
    (Method::DELETE, "/api/v1/reality/{node}/{pod_id}", AGENT),
    (Method::GET, "/api/v1/daemonsets", VIEWER),
    (Method::POST, "/api/v1/daemonsets", DEPLOYER),
    (Method::GET, "/api/v1/daemonsets/{id}", VIEWER),
    (Method::PATCH, "/api/v1/daemonsets/{id}", DEPLOYER),
    (Method::DELETE, "/api/v1/daemonsets/{id}", DEPLOYER),
    (Method::GET, "/api/v1/rcs", VIEWER),
    (Method::POST, "/api/v1/rcs", DEPLOYER),
    (Method::GET, "/api/v1/rcs/{id}", VIEWER),
    (Method::PATCH, "/api/v1/rcs/{id}", DEPLOYER),
    (Method::DELETE, "/api/v1/rcs/{id}", DEPLOYER),
    (Method::GET, "/api/v1/rolls", VIEWER),
    (Method::POST, "/api/v1/rolls", DEPLOYER),
    (Method::GET, "/api/v1/rolls/{id}", VIEWER),
    (Method::DELETE, "/api/v1/rolls/{id}", DEPLOYER),
    (Method::GET, "/api/v1/leader", VIEWER),
    (Method::GET, "/api/v1/watch", VIEWER),
    (Method::GET, "/api/v1/events", VIEWER),
];

/// The operations that take `force`, where `?force=true` needs `admin` whatever `RULES`
/// says. On any other, `force` is an unknown query parameter, which its handler refuses
/// 400 as a malformed request whatever the token may do, rather than 403 as though it asked
/// for more. The document's `force` parameters are these (a test holds them to it).
const FORCEABLE: &[(Method, &str)] = &[(Method::DELETE, "/api/v1/rcs/{id}")];

/// Whether the operation takes `force` ([`FORCEABLE`]).
fn forceable(method: &Method, template: &str) -> bool {
    FORCEABLE
        .iter()
        .any(|(m, path)| m == method && template_matches(path, template))
}

const VIEWER: Need = Need::Role(Role::Viewer);
const DEPLOYER: Need = Need::Role(Role::Deployer);
const AGENT: Need = Need::Role(Role::Agent);

/// The table's entry for an operation, `None` when it has none.
pub fn rule(method: &Method, template: &str) -> Option<Need> {
    let method = if method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    RULES
        .iter()
        .find(|(m, path, _)| m == method && template_matches(path, template))
        .map(|&(_, _, need)| need)
}

/// What a request needs: its operation's entry (`admin` without one), raised to `admin` by
/// `?force=true` on an operation that takes it.
fn need(method: &Method, template: Option<&str>, query: Option<&str>) -> Need {
    let need = template
        .and_then(|template| rule(method, template))
        .unwrap_or(Need::Role(Role::Admin));
    let forced = template.is_some_and(|template| forceable(method, template))
        && query.is_some_and(|query| {
            url::form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "force" && v == "true")
        });
    match need {
        Need::Role(_) if forced => Need::Role(Role::Admin),
        need => need,
    }
}

/// Whether a table path matches a route template: segment by segment, a parameter matching
/// any parameter, and a served catch-all (`{*id}`) the rest of the table path's parameters.
fn template_matches(path: &str, template: &str) -> bool {
    let is_param = |s: &str| s.starts_with('{') && s.ends_with('}');
    let mut ours = path.split('/');
    for theirs in template.split('/') {
        if theirs.starts_with("{*") {
            let rest: Vec<&str> = ours.collect();
            return !rest.is_empty() && rest.iter().all(|s| is_param(s));
        }
        match ours.next() {
            Some(s) if s == theirs || (is_param(s) && is_param(theirs)) => {}
            _ => return false,
        }
    }
    ours.next().is_none()
}

/// One configured token.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Token {
    name: String,
    role: Role,
    #[serde(default)]
    nodes: Option<Vec<String>>,
    #[serde(deserialize_with = "hex_digest")]
    sha256: [u8; 32],
}

/// The token file's shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<Token>,
}

fn hex_digest<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
    let text = String::deserialize(d)?;
    let bad = || serde::de::Error::custom("sha256 must be 64 hexadecimal digits");
    // Checked digit by digit: `from_str_radix` would also take a sign, reading `+f` as 15.
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(text.as_bytes().chunks(2)) {
        let pair = std::str::from_utf8(pair).map_err(|_| bad())?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
    }
    Ok(digest)
}

/// Reads and checks a token file.
fn read_tokens(path: &Path) -> anyhow::Result<Vec<Token>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    let file: TokenFile = yaml_serde::from_str(&text)
        .with_context(|| format!("parsing the token file {}", path.display()))?;
    for (i, token) in file.tokens.iter().enumerate() {
        if token.name.trim().is_empty() {
            bail!("token {} in {} has an empty name", i + 1, path.display());
        }
        if is_servers_actor_name(&token.name) {
            bail!(
                "token {:?} in {}: `{ANONYMOUS}` and names starting `farm:` are the server's own \
                 actors' names in events",
                token.name,
                path.display()
            );
        }
        if token.nodes.is_some() && token.role != Role::Agent {
            bail!(
                "token {:?} in {}: only an agent token may list nodes",
                token.name,
                path.display()
            );
        }
        let earlier = &file.tokens[..i];
        if earlier.iter().any(|t| t.name == token.name) {
            bail!(
                "the name {:?} appears twice in {}",
                token.name,
                path.display()
            );
        }
        if earlier.iter().any(|t| t.sha256 == token.sha256) {
            bail!(
                "token {:?} in {} has the same sha256 as another",
                token.name,
                path.display()
            );
        }
    }
    Ok(file.tokens)
}

/// The token file and the tokens last read from it.
#[derive(Debug)]
struct TokenSource {
    path: PathBuf,
    tokens: RwLock<Arc<Vec<Token>>>,
    /// How many times the file has been re-read, for the answers that outlive a request's
    /// check of its token ([`Revocation`]).
    reloads: watch::Sender<u64>,
}

/// Who may call the API, shared by every request: the tokens (none configured means no
/// authentication) and the origins allowed to call from a browser.
#[derive(Debug, Default)]
pub struct Access {
    tokens: Option<TokenSource>,
    cors_origins: Vec<HeaderValue>,
    /// Whether the metrics and the version need no token (`--metrics-public`).
    metrics_public: bool,
}

impl Access {
    /// Tokens read from `tokens` (with none, every request is let through) and browser calls
    /// allowed from `cors_origins`.
    pub fn new(tokens: Option<&Path>, cors_origins: Vec<HeaderValue>) -> anyhow::Result<Self> {
        let tokens = match tokens {
            None => None,
            Some(path) => Some(TokenSource {
                tokens: RwLock::new(Arc::new(read_tokens(path)?)),
                path: path.to_owned(),
                reloads: watch::Sender::new(0),
            }),
        };
        Ok(Access {
            tokens,
            cors_origins,
            metrics_public: false,
        })
    }

    /// The same, with the metrics and the version readable without a token when `public`.
    pub fn with_metrics_public(self, public: bool) -> Self {
        Access {
            metrics_public: public,
            ..self
        }
    }

    /// The role this server asks of a request needing `need`; `None` when it lets the request
    /// through without a token: with no token file, every request; else those needing nobody,
    /// and with `--metrics-public` the metrics and the version.
    fn asks(&self, need: Need) -> Option<Role> {
        self.tokens.as_ref()?;
        match need {
            Need::Role(role) => Some(role),
            Need::ViewerUnlessPublic if !self.metrics_public => Some(Role::Viewer),
            Need::Nobody | Need::ViewerUnlessPublic => None,
        }
    }

    /// Makes `openapi`, as [`document`] left it, say what this server asks (`asks`):
    /// an operation it lets through without a token loses its security requirement and its
    /// 401 and 403 answers, needs the role `none`, as the probes, and its role sentence says
    /// why. Without a token file that is every operation (`?force=true` too), and the bearer
    /// scheme goes; with `--metrics-public`, the metrics and the version. The committed
    /// document is the form with a token file and without the flag.
    pub fn document(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let why = if self.tokens.is_none() {
            if let Some(components) = &mut openapi.components {
                components.security_schemes.remove(SCHEME);
            }
            "Needs no token: this server runs without `--auth-tokens`."
        } else {
            "Needs no token: this server runs with `--metrics-public`."
        };
        each_operation(openapi, |method, path, operation| {
            let (Some(need), Some(sentence)) = (rule(method, path), role_sentence(method, path))
            else {
                return;
            };
            if self.asks(need).is_some() {
                return;
            }
            operation
                .extensions
                .get_or_insert_with(Default::default)
                .insert("x-required-role".to_owned(), "none".into());
            operation.security = None;
            if let Some(description) = &mut operation.description {
                *description = description.replace(&sentence, why);
            }
            for status in ["401", "403"] {
                operation.responses.responses.remove(status);
            }
        });
    }

    /// Re-reads the token file, returning how many tokens it now lists; if the new file is
    /// unreadable or invalid the old tokens stay in force and the error is returned. `None`
    /// without a token file.
    pub fn reload(&self) -> Option<anyhow::Result<usize>> {
        let source = self.tokens.as_ref()?;
        Some(read_tokens(&source.path).map(|tokens| {
            let count = tokens.len();
            *source.tokens.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tokens);
            source.reloads.send_modify(|reloads| *reloads += 1);
            count
        }))
    }

    /// The origins allowed to call from a browser.
    pub fn cors_origins(&self) -> &[HeaderValue] {
        &self.cors_origins
    }

    /// The configured token whose digest is that of `presented`. Every digest is compared, in
    /// constant time, so the time taken does not tell how close a guess came.
    fn find(&self, source: &TokenSource, presented: &str) -> Option<Token> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let tokens = source
            .tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        tokens
            .iter()
            .fold(None, |found, token| {
                let matches: bool = token.sha256.ct_eq(&digest).into();
                found.or(matches.then_some(token))
            })
            .cloned()
    }
}

/// The token a request was let through with, put in its extensions by [`authorize`]: its
/// name, and what tells whether it is still in force ([`Revocation`]).
#[derive(Debug, Clone)]
struct Subject {
    name: String,
    sha256: [u8; 32],
    /// The role the request's operation needed.
    needed: Role,
    access: Arc<Access>,
    /// The re-reads of the token file before the token was checked.
    reloads_before: u64,
}

impl Subject {
    /// Whether the tokens now in force still list this token with a role that grants what
    /// the request needed.
    fn in_force(&self) -> bool {
        let Some(source) = &self.access.tokens else {
            return true;
        };
        let tokens = source.tokens.read().unwrap_or_else(|e| e.into_inner());
        tokens
            .iter()
            .any(|token| token.sha256 == self.sha256 && token.role.grants(self.needed))
    }

    /// What tells whether its token is revoked from the time it was checked on.
    fn revocation(&self) -> Revocation {
        let revocable = self.access.tokens.as_ref().map(|source| Revocable {
            checked: self.reloads_before,
            subject: self.clone(),
            reloads: source.reloads.subscribe(),
        });
        Revocation(revocable)
    }
}

/// Tells an answer that outlives its request's check of the token (the change stream) when
/// that token is revoked: the token file re-read without it, or with a role that no longer
/// grants the operation. A request let through without a token is never revoked.
#[derive(Debug)]
pub struct Revocation(Option<Revocable>);

#[derive(Debug)]
struct Revocable {
    subject: Subject,
    reloads: watch::Receiver<u64>,
    /// The re-read of the token file last looked at.
    checked: u64,
}

impl Revocation {
    /// Whether the token has been revoked; the tokens are looked at only after a re-read.
    pub fn revoked(&mut self) -> bool {
        let Some(revocable) = &mut self.0 else {
            return false;
        };
        let reloads = *revocable.reloads.borrow();
        if reloads == revocable.checked {
            return false;
        }
        revocable.checked = reloads;
        !revocable.subject.in_force()
    }

    /// Waits for the next re-read of the token file (forever without a token); then
    /// [`Revocation::revoked`] tells whether it revoked the token.
    pub async fn reloaded(&mut self) {
        let reread = match &mut self.0 {
            Some(revocable) => revocable.reloads.changed().await.is_ok(),
            None => false,
        };
        if !reread {
            std::future::pending::<()>().await;
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Revocation {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let subject = parts.extensions.get::<Subject>();
        Ok(subject.map_or(Revocation(None), Subject::revocation))
    }
}

/// Header carrying the request id, as most proxies and tracing tools expect: set by the
/// router on every request that lacks one, and recorded with who made it.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Who makes a request, for its events and P2's audit records: the name of its token, or
/// [`ANONYMOUS`] when the server runs without tokens (or the operation needs none); with
/// the request's id.
impl<S: Send + Sync> FromRequestParts<S> for Actor {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let name = parts
            .extensions
            .get::<Subject>()
            .map_or_else(|| ANONYMOUS.to_owned(), |subject| subject.name.clone());
        let request_id = parts
            .headers
            .get(&REQUEST_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok(Actor { name, request_id })
    }
}

/// Lets a request through only with a token whose role grants what its operation needs
/// (`RULES`): 401 without a known token, 403 with one lacking the role. Records the
/// token's name in the request's span and, for the handler, its extensions ([`Actor`],
/// [`Revocation`]). A read whose token is revoked before it is answered (a blocking query
/// waits up to ten minutes) is answered 401 then.
/// With no token file, lets every request through.
pub async fn authorize(
    State(access): State<Arc<Access>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(source) = &access.tokens else {
        return next.run(request).await;
    };
    let template = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned());
    let need = need(request.method(), template.as_deref(), request.uri().query());
    let Some(needed) = access.asks(need) else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let reloads_before = *source.reloads.borrow();
    let Some(token) = presented.and_then(|presented| access.find(source, presented)) else {
        return unauthorized(if presented.is_some() {
            "the bearer token is not known"
        } else {
            "this operation needs a bearer token (Authorization: Bearer TOKEN)"
        });
    };
    tracing::Span::current().record("subject", tracing::field::display(&token.name));
    let subject = Subject {
        name: token.name.clone(),
        sha256: token.sha256,
        needed,
        access: access.clone(),
        reloads_before,
    };
    let revocation = subject.revocation();
    request.extensions_mut().insert(subject);
    if !token.role.grants(needed) {
        return forbidden(format!(
            "{:?} has the role {}; this operation needs {}",
            token.name,
            token.role.as_str(),
            needed.as_str()
        ));
    }
    if let (Role::Agent, Some(nodes)) = (needed, &token.nodes) {
        let (mut parts, body) = request.into_parts();
        let node = RawPathParams::from_request_parts(&mut parts, &())
            .await
            .ok()
            .and_then(|params| {
                params
                    .iter()
                    .find(|(name, _)| *name == "node")
                    .map(|(_, value)| value.to_owned())
            });
        if !node.is_some_and(|node| nodes.contains(&node)) {
            return forbidden(format!(
                "{:?} may only report for the nodes {}",
                token.name,
                nodes.join(", ")
            ));
        }
        request = Request::from_parts(parts, body);
    }
    if matches!(*request.method(), Method::GET | Method::HEAD) {
        return unless_revoked(revocation, next.run(request)).await;
    }
    next.run(request).await
}

/// `answer`, unless the token of the read it answers is revoked first: then 401, at once.
/// Only reads are cut short: a write given up after it was sent to the store may still
/// land, and its client must be told how it ended.
async fn unless_revoked(
    mut revocation: Revocation,
    answer: impl std::future::Future<Output = Response>,
) -> Response {
    tokio::pin!(answer);
    loop {
        if revocation.revoked() {
            return unauthorized(
                "the bearer token was revoked, or lost the role this operation needs, before the \
                 answer was ready",
            );
        }
        tokio::select! {
            response = &mut answer => return response,
            () = revocation.reloaded() => {}
        }
    }
}

fn unauthorized(message: &str) -> Response {
    let mut response = ApiError::new(StatusCode::UNAUTHORIZED, message).into_response();
    response.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static(r#"Bearer realm="p2-apiserver""#),
    );
    response
}

fn forbidden(message: String) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, message).into_response()
}

/// The name of the bearer scheme in the OpenAPI document.
const SCHEME: &str = "bearer";

/// Declares the bearer scheme in the document, and on each operation the role it needs
/// (`x-required-role`, `none` for the public ones, and a sentence of its description), its
/// security requirement, its 401 answer and, where a known token may lack the role (not
/// `viewer`, which every role grants, unless `?force=true` raises it), its 403. An
/// operation missing from `RULES` gets no `x-required-role`, which the tests catch.
pub fn document(openapi: &mut utoipa::openapi::OpenApi) {
    let components = openapi.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        SCHEME,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A token from the server's --auth-tokens file; without that file (only \
                     allowed on loopback or with --insecure-no-auth) no token is needed.",
                ))
                .build(),
        ),
    );
    each_operation(openapi, |method, path, operation| {
        let Some(need) = rule(method, path) else {
            return;
        };
        let role = match need {
            Need::Nobody => None,
            Need::Role(role) => Some(role),
            Need::ViewerUnlessPublic => Some(Role::Viewer),
        };
        operation
            .extensions
            .get_or_insert_with(Default::default)
            .insert(
                "x-required-role".to_owned(),
                role.map_or("none", Role::as_str).into(),
            );
        let (Some(role), Some(sentence)) = (role, role_sentence(method, path)) else {
            return;
        };
        operation.description = Some(match operation.description.take() {
            Some(text) if !text.is_empty() => format!("{text}\n\n{sentence}"),
            _ => sentence,
        });
        operation.security = Some(vec![SecurityRequirement::new(SCHEME, Vec::<String>::new())]);
        let responses = &mut operation.responses.responses;
        let unauthorized = ErrorBody::documented("No bearer token, or an unknown one");
        responses.insert("401".to_owned(), unauthorized);
        // A role every token has is refused to none (`?force=true` aside).
        if forceable(method, path) || !role.granted_to_all() {
            let forbidden = ErrorBody::documented("The token's role does not allow this operation");
            responses.insert("403".to_owned(), forbidden);
        }
        if let Some(RefOr::T(unauthorized)) = responses.get_mut("401") {
            let challenge = HeaderBuilder::new()
                .schema(ObjectBuilder::new().schema_type(Type::String))
                .description(Some(
                    r#"`Bearer realm="p2-apiserver"`: send a bearer token"#,
                ))
                .build();
            unauthorized
                .headers
                .insert("WWW-Authenticate".to_owned(), challenge);
        }
    });
}

/// The sentence of an operation's description naming the role it needs and when it needs
/// another or none; `None` for one that needs no token, or that `RULES` does not list.
fn role_sentence(method: &Method, path: &str) -> Option<String> {
    let (role, tail) = match rule(method, path)? {
        Need::Nobody => return None,
        Need::Role(role) if forceable(method, path) => (role, " (`admin` with `?force=true`)"),
        Need::Role(role) => (role, ""),
        Need::ViewerUnlessPublic => (
            Role::Viewer,
            ", unless the server runs with `--metrics-public`",
        ),
    };
    Some(format!(
        "Needs a token with the `{}` role{tail}.",
        role.as_str()
    ))
}

/// Calls `f` with every operation of the document, its method and its path.
fn each_operation(
    openapi: &mut utoipa::openapi::OpenApi,
    mut f: impl FnMut(&Method, &str, &mut utoipa::openapi::path::Operation),
) {
    for (path, item) in openapi.paths.paths.iter_mut() {
        let operations = [
            (Method::GET, &mut item.get),
            (Method::PUT, &mut item.put),
            (Method::POST, &mut item.post),
            (Method::DELETE, &mut item.delete),
            (Method::PATCH, &mut item.patch),
        ];
        for (method, operation) in operations {
            if let Some(operation) = operation {
                f(&method, path, operation);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_grant_viewer_and_their_own_and_admin_all() {
        use Role::*;
        for role in [Viewer, Deployer, Agent, Admin] {
            assert!(role.grants(Viewer));
            assert!(role.grants(role));
            assert!(Admin.grants(role));
        }
        assert!(!Deployer.grants(Agent));
        assert!(!Agent.grants(Deployer));
        assert!(!Viewer.grants(Deployer));
        assert!(!Deployer.grants(Admin));
    }

    /// A write is never open to a `viewer` nor to a caller without a token, and every read
    /// is open to a `viewer` at least.
    #[test]
    fn only_reads_are_open_to_viewers_and_to_callers_without_a_token() {
        for (method, path, need) in RULES {
            let open = matches!(
                need,
                Need::Nobody | Need::ViewerUnlessPublic | Need::Role(Role::Viewer)
            );
            assert_eq!(
                open,
                *method == Method::GET,
                "{method} {path} needs {need:?}"
            );
        }
    }

    #[test]
    fn served_catch_alls_match_the_documented_parameters() {
        assert!(template_matches(
            "/api/v1/labels/{type}/{id}",
            "/api/v1/labels/{type}/{*id}"
        ));
        assert!(template_matches(
            "/api/labels/{type}/{id}/{name}",
            "/api/labels/{type}/{*tail}"
        ));
        assert!(!template_matches("/api/v1/rcs", "/api/v1/rcs/{id}"));
        assert!(!template_matches("/api/v1/rcs/{id}", "/api/v1/rcs"));
        assert!(!template_matches(
            "/api/v1/labels/{type}",
            "/api/v1/labels/{type}/{*id}"
        ));
    }

    #[test]
    fn unknown_operations_and_force_need_admin() {
        let admin = Need::Role(Role::Admin);
        assert_eq!(need(&Method::POST, Some("/api/v1/nodes"), None), admin);
        assert_eq!(need(&Method::GET, None, None), admin);
        assert_eq!(
            need(
                &Method::DELETE,
                Some("/api/v1/rcs/{id}"),
                Some("force=true")
            ),
            admin
        );
        assert_eq!(
            need(
                &Method::DELETE,
                Some("/api/v1/rcs/{id}"),
                Some("force=false")
            ),
            DEPLOYER
        );
        assert_eq!(need(&Method::HEAD, Some("/api/v1/rcs"), None), VIEWER);
        // Where `force` is not taken, it asks for nothing: the handler refuses it.
        assert_eq!(
            need(&Method::GET, Some("/api/v1/rcs"), Some("force=true")),
            VIEWER
        );
        assert_eq!(
            need(&Method::GET, Some("/healthz"), Some("force=true")),
            Need::Nobody
        );
    }

    #[test]
    fn token_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        let digest = format!("{:x}", Sha256::digest(b"secret"));
        let write = |text: String| std::fs::write(&path, text).unwrap();
        write(format!(
            "tokens:\n  - {{name: a, role: agent, nodes: [n1], sha256: {digest}}}\n"
        ));
        let access = Access::new(Some(&path), Vec::new()).unwrap();
        let source = access.tokens.as_ref().unwrap();
        assert_eq!(access.find(source, "secret").unwrap().name, "a");
        assert!(access.find(source, "other").is_none());

        for bad in [
            format!("tokens:\n  - {{name: a, role: viewer, nodes: [n1], sha256: {digest}}}\n"),
            format!("tokens:\n  - {{name: a, role: root, sha256: {digest}}}\n"),
            "tokens:\n  - {name: a, role: viewer, sha256: 12}\n".to_owned(),
            format!("tokens:\n  - {{name: a, role: viewer, sha256: {}}}\n", "+f".repeat(32)),
            format!(
                "tokens:\n  - {{name: a, role: viewer, sha256: {digest}}}\n  - {{name: a, role: admin, sha256: {}}}\n",
                "0".repeat(64)
            ),
            "not: [yaml".to_owned(),
            format!("tokens:\n  - {{name: anonymous, role: admin, sha256: {digest}}}\n"),
            format!("tokens:\n  - {{name: 'farm:rc@host', role: admin, sha256: {digest}}}\n"),
        ] {
            write(bad.clone());
            assert!(read_tokens(&path).is_err(), "{bad}");
            // A bad new file leaves the old tokens in force.
            assert!(access.reload().unwrap().is_err());
            assert_eq!(access.find(source, "secret").unwrap().name, "a");
        }
    }
}
