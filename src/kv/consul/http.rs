//! Talking HTTP to Consul: URLs, headers, timeouts, read retries and error kinds.

use std::error::Error as _;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;
use url::Url;

use super::{ConsulConfig, ConsulTimeouts};
use crate::backoff::Backoff;
use crate::kv::sent::{self, Claim, Withdraw};
use crate::kv::{StoreError, StoreResult};

/// How many times an idempotent read is tried again after a transport error or a 5xx.
const READ_RETRIES: u32 = 3;
const READ_RETRY_BASE: Duration = Duration::from_millis(100);
const READ_RETRY_CAP: Duration = Duration::from_secs(2);

/// An answer Consul gave: its status, `X-Consul-Index`, whether ACLs filtered it, and body.
#[derive(Debug)]
pub(super) struct Answer {
    pub(super) status: StatusCode,
    index: Option<u64>,
    /// `X-Consul-Results-Filtered-By-ACLs: true`: Consul left out of a listing the keys the
    /// token may not read, which nothing else in the answer shows.
    filtered: bool,
    pub(super) body: Vec<u8>,
}

impl Answer {
    /// The `X-Consul-Index` of a read, raised to 1: Consul's blocking-query rules say a 0
    /// would make the next blocking query return at once, forever.
    pub(super) fn index(&self, what: &str) -> StoreResult<u64> {
        self.index.map(|i| i.max(1)).ok_or_else(|| {
            StoreError::Unavailable(format!("{what}: Consul's answer has no X-Consul-Index"))
        })
    }

    pub(super) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).trim().to_string()
    }

    /// The `true`/`false` that KV writes answer.
    pub(super) fn boolean(&self, what: &str) -> StoreResult<bool> {
        match self.text().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(StoreError::Unavailable(format!(
                "{what}: expected true or false from Consul, got {other:?}"
            ))),
        }
    }
}

/// Why a write got no usable answer.
#[derive(Debug)]
pub(super) enum WriteFailure {
    /// Consul answered with an error status, so nothing was applied; the answer is kept for
    /// callers that read its body (a txn rollback lists the failing ops).
    Refused(StoreError, Answer),
    /// It never left this process: nothing was applied.
    NotSent(StoreError),
    /// It may have reached Consul but its answer was lost, so it may or may not have landed.
    Lost(String),
}

impl WriteFailure {
    /// The error for callers that cannot learn more; a lost answer is an unknown outcome.
    pub(super) fn into_error(self) -> StoreError {
        match self {
            WriteFailure::Refused(e, _) | WriteFailure::NotSent(e) => e,
            WriteFailure::Lost(lost) => StoreError::OutcomeUnknown(lost),
        }
    }
}

/// The smallest budget beside the server's own watches: a connection for its clients'
/// blocking queries and one for everything else.
const MIN_OTHER_CONNECTIONS: usize = 2;

/// The connections this client may hold to the agent at once, so that the farms, the
/// mirror and the API together stay under the agent's `limits.http_max_conns_per_client`
/// (200 by default), past which it refuses connections with 429.
///
/// Every request holds a permit for its whole life, a blocking query for all of its wait.
/// A quarter of the budget, and at least one connection for each blocking watch the
/// server keeps open at once (its mirror's and its election's, which a watch left waiting
/// for a connection would see answered only once another's whole wait is over, past its
/// own), is kept for the server's own blocking queries, a quarter (or what is left but
/// one) for its clients' (a query made inside a request's scope,
/// [`sent::in_request`]: an API blocking query), the rest for everything else, of which
/// one connection (when the rest has two or more) is kept for session renewals. So a burst
/// of writes cannot starve the watches, many long-held watches cannot starve writes,
/// clients holding blocking queries cannot hold back the mirror, and the leader's own
/// writes (a pass of the farms, slow to commit) cannot hold back the renewals that keep it
/// leader: Consul answers a renewal without a commit, so it stays quick when writes are
/// slow. A request that finds no permit within its time limit is never sent; nor is a
/// write whose caller gave up waiting for one first (its [`Claim`] withdrawn: the
/// request's deadline answers `StoreTimeout`).
#[derive(Debug)]
struct Budget {
    /// Everything but blocking queries (and session renewals, when they have their own).
    requests: Semaphore,
    /// Session renewals, unless the budget is too small to keep them a connection.
    renewals: Option<Semaphore>,
    /// Blocking queries made outside any request: the mirror's and the election's.
    own_watches: Semaphore,
    /// Blocking queries made for a request: the API clients'.
    client_watches: Semaphore,
    max_connections: usize,
}

impl Budget {
    /// A budget of `max_connections` for a server that keeps `own_watches` blocking watches
    /// open at once.
    fn new(max_connections: usize, own_watches: usize) -> StoreResult<Self> {
        let quarter = (max_connections / 4).max(1);
        let own = quarter.max(own_watches);
        let least = own_watches.max(1) + MIN_OTHER_CONNECTIONS;
        if max_connections < least {
            return Err(StoreError::Invalid(format!(
                "at least {least} connections to Consul are needed (one for each of the \
                 server's {own_watches} own blocking watches, at least one, one for its \
                 clients' blocking queries, one for everything else), not {max_connections}"
            )));
        }
        let clients = quarter.min(max_connections - own - 1);
        let rest = max_connections - own - clients;
        let renewals = (rest >= 2).then(|| Semaphore::new(1));
        Ok(Budget {
            requests: Semaphore::new(rest - usize::from(renewals.is_some())),
            renewals,
            own_watches: Semaphore::new(own),
            client_watches: Semaphore::new(clients),
            max_connections,
        })
    }

    /// A permit from `lane`, waited for up to `limit`, and what is left of `limit` once it
    /// came: the wait for a connection counts against the request's own time limit, so that
    /// a request is given up within it however long the queue. A request that gets no
    /// permit was not sent.
    async fn permit(
        &self,
        lane: Lane,
        what: &str,
        limit: Duration,
    ) -> StoreResult<(SemaphorePermit<'_>, Duration)> {
        let (semaphore, whose) = match lane {
            Lane::Renewals => match &self.renewals {
                Some(renewals) => (renewals, "session renewals'"),
                None => (&self.requests, "requests'"),
            },
            Lane::Requests => (&self.requests, "requests'"),
            Lane::Watches if sent::in_request() => (&self.client_watches, "clients' watches'"),
            Lane::Watches => (&self.own_watches, "the server's own watches'"),
        };
        let asked = Instant::now();
        match tokio::time::timeout(limit, semaphore.acquire()).await {
            Ok(Ok(permit)) => Ok((permit, limit.saturating_sub(asked.elapsed()))),
            // `Ok(Err(_))` cannot happen: the semaphores are never closed.
            Ok(Err(_)) | Err(_) => Err(StoreError::Unavailable(format!(
                "{what}: not sent, as every connection to Consul kept for {whose} use stayed \
                 busy (--consul-max-connections is {})",
                self.max_connections
            ))),
        }
    }
}

/// Which share of the [`Budget`] a request takes its permit from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Lane {
    Requests,
    /// Session renewals: what keeps a leader leading.
    Renewals,
    /// Blocking queries: the server's own, or its clients' when made for a request.
    Watches,
}

/// The HTTP side of the Consul store.
#[derive(Debug)]
pub(super) struct Http {
    client: reqwest::Client,
    base: Url,
    datacenter: Option<String>,
    timeouts: ConsulTimeouts,
    budget: Budget,
}

impl Http {
    pub(super) fn new(
        config: ConsulConfig,
        timeouts: ConsulTimeouts,
        max_connections: usize,
        own_watches: usize,
    ) -> StoreResult<Self> {
        let budget = Budget::new(max_connections, own_watches)?;
        let base = Url::parse(&config.base_url).map_err(|e| {
            StoreError::Invalid(format!("Consul address {:?}: {e}", config.base_url))
        })?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(StoreError::Invalid(format!(
                "Consul address {:?} must be http://HOST:PORT or https://HOST:PORT",
                config.base_url
            )));
        }
        let mut headers = HeaderMap::new();
        if let Some(token) = &config.token {
            let mut value = HeaderValue::from_str(token).map_err(|_| {
                StoreError::Invalid("the Consul token is not a valid header".into())
            })?;
            value.set_sensitive(true);
            headers.insert("X-Consul-Token", value);
        }
        let mut client = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(timeouts.connect)
            // The budget bounds the connections in use; this bounds the idle ones kept.
            .pool_max_idle_per_host(max_connections);
        if is_loopback(&base) {
            client = client.no_proxy();
        }
        let client = client
            .build()
            .map_err(|e| StoreError::Invalid(format!("building the HTTP client: {e}")))?;
        Ok(Http {
            client,
            base,
            datacenter: config.datacenter.filter(|dc| !dc.is_empty()),
            timeouts,
            budget,
        })
    }

    /// `/v1/<segments...>` with `?dc=` when a datacenter is set; each segment is
    /// percent-encoded, so keys may hold any character the key rules allow.
    pub(super) fn url<'s>(&self, segments: impl IntoIterator<Item = &'s str>) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("checked in new: the base URL can be a base")
            .pop_if_empty()
            .push("v1")
            .extend(segments);
        url.set_query(None);
        if let Some(dc) = &self.datacenter {
            url.query_pairs_mut().append_pair("dc", dc);
        }
        url
    }

    /// `/v1/kv/<key>`; a prefix ending in `/` keeps its slash.
    pub(super) fn kv_url(&self, key: &str) -> Url {
        self.url(std::iter::once("kv").chain(key.split('/')))
    }

    /// An idempotent GET, tried again with backoff after transport errors and 5xx. Returns
    /// 2xx and 404 answers (404 is a normal "missing" for reads); other statuses become errors.
    pub(super) async fn read(&self, url: Url) -> StoreResult<Answer> {
        let what = describe(&Method::GET, &url);
        let mut backoff = Backoff::new(READ_RETRY_BASE, READ_RETRY_CAP);
        let mut attempt = 0;
        loop {
            // Held for this attempt only, not through the pause before the next.
            let (permit, left) = self.request_permit(&what).await?;
            let sent = self.send(Method::GET, url.clone(), None, left).await;
            drop(permit);
            let failure = match sent {
                Ok(answer) if !is_transient(&answer) => return read_outcome(&what, answer),
                Ok(answer) => status_error(&what, &answer),
                Err(e) => StoreError::Unavailable(format!("{what}: {}", error_chain(&e))),
            };
            if attempt == READ_RETRIES {
                return Err(failure);
            }
            attempt += 1;
            let delay = backoff.next_delay();
            tracing::debug!(%failure, ?delay, attempt, "retrying Consul read");
            tokio::time::sleep(delay).await;
        }
    }

    /// A blocking GET: tried once, with a timeout covering `wait`, the jitter of up to
    /// wait/16 that Consul adds, and some slack.
    pub(super) async fn read_blocking(&self, url: Url, wait: Duration) -> StoreResult<Answer> {
        let what = describe(&Method::GET, &url);
        let timeout = wait + wait / 16 + self.timeouts.watch_slack;
        // The query's length is its `wait`, from when it is sent: its answer gets the whole
        // timeout, however long the permit took.
        let (_permit, _) = self.budget.permit(Lane::Watches, &what, timeout).await?;
        match self.send(Method::GET, url, None, timeout).await {
            Ok(answer) => read_outcome(&what, answer),
            Err(e) => Err(StoreError::Unavailable(format!(
                "{what}: {}",
                error_chain(&e)
            ))),
        }
    }

    /// A write, sent once. A 2xx answer is returned; an error status is `Refused` with its
    /// kind; a transport failure is `Lost` unless the request never left.
    ///
    /// A write is one HTTP request, which Consul applies whole or not at all: a caller that
    /// drops this future (a request cut by its deadline) never leaves a half-done write in
    /// the store, only a lost answer. One dropped while it waits for a connection withdraws
    /// its [`Claim`], as it was never sent.
    pub(super) async fn write(
        &self,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, WriteFailure> {
        self.write_in(Lane::Requests, method, url, body).await
    }

    /// [`Http::write`] with a permit from `lane` of the [`Budget`].
    pub(super) async fn write_in(
        &self,
        lane: Lane,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, WriteFailure> {
        let what = describe(&method, &url);
        let claim = Claim::sent();
        let _withdraw = Withdraw(claim.clone());
        let (_permit, left) = self
            .budget
            .permit(lane, &what, self.timeouts.request)
            .await
            .map_err(WriteFailure::NotSent)?;
        if !claim.take() {
            return Err(WriteFailure::NotSent(StoreError::Unavailable(format!(
                "{what}: not sent, as its caller gave up waiting for a connection to Consul"
            ))));
        }
        match self.send(method, url, body, left).await {
            Ok(answer) if answer.status.is_success() => Ok(answer),
            // A server error may come after the write reached Raft: a leader deposed while
            // committing it ("leadership lost while committing log"), or a forwarded RPC cut
            // off ("rpc error making call: EOF"), and the next leader may still commit it.
            Ok(answer) if answer.status.is_server_error() && !refused_before_applying(&answer) => {
                Err(WriteFailure::Lost(format!(
                    "{what}: {} {}",
                    answer.status.as_u16(),
                    answer.text()
                )))
            }
            Ok(answer)
                if answer.status == StatusCode::NOT_FOUND && !is_unknown_session(&answer) =>
            {
                Err(WriteFailure::Refused(
                    StoreError::Unavailable(format!(
                        "{what}: 404 that is not Consul's (a proxy or a wrong address in \
                         front of the agent?), so the write was not applied: {}",
                        answer.text()
                    )),
                    answer,
                ))
            }
            Ok(answer) => Err(WriteFailure::Refused(status_error(&what, &answer), answer)),
            Err(e) if e.is_connect() || e.is_builder() => {
                Err(WriteFailure::NotSent(StoreError::Unavailable(format!(
                    "{what}: {}; the write was not applied",
                    error_chain(&e)
                ))))
            }
            Err(e) => Err(WriteFailure::Lost(format!("{what}: {}", error_chain(&e)))),
        }
    }

    /// A permit for a request other than a blocking query, waited for up to its time limit,
    /// and what is left of that limit.
    async fn request_permit(&self, what: &str) -> StoreResult<(SemaphorePermit<'_>, Duration)> {
        self.budget
            .permit(Lane::Requests, what, self.timeouts.request)
            .await
    }

    async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> reqwest::Result<Answer> {
        let mut request = self.client.request(method, url).timeout(timeout);
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await?;
        let status = response.status();
        let index = response
            .headers()
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let filtered = response
            .headers()
            .get("X-Consul-Results-Filtered-By-ACLs")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        let body = response.bytes().await?.to_vec();
        Ok(Answer {
            status,
            index,
            filtered,
            body,
        })
    }
}

/// An agent on this host, which Consul's own clients reach without the proxy the environment
/// names (`HTTP_PROXY`, ...), as Go's `ProxyFromEnvironment` does: a proxy cannot reach this
/// host's loopback, and would see every request's ACL token. Others go through it, as theirs.
fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Worth another try: Consul had no leader, was overloaded or failed inside.
fn is_transient(answer: &Answer) -> bool {
    (answer.status.is_server_error() && !is_invalid_session(answer))
        || answer.status == StatusCode::TOO_MANY_REQUESTS
}

/// A read's answer, unless its status is an error, or Consul filtered it by ACLs: a listing
/// short of the keys this server's token may not read is not the tree, and taken for it
/// the mirror, the farms and the API would act on a tree without those keys. A 404 is
/// "missing" only with the `X-Consul-Index` Consul's reads always carry: without it, the
/// answer is a proxy's or another server's, and taken for a missing key it would tell a
/// lost delete that it landed.
fn read_outcome(what: &str, answer: Answer) -> StoreResult<Answer> {
    if answer.filtered {
        return Err(StoreError::Forbidden(format!(
            "{what}: Consul left out keys the token may not read \
             (X-Consul-Results-Filtered-By-ACLs)"
        )));
    }
    if answer.status == StatusCode::NOT_FOUND && answer.index.is_none() {
        return Err(StoreError::Unavailable(format!(
            "{what}: 404 without X-Consul-Index, so not Consul's answer: {}",
            answer.text()
        )));
    }
    if answer.status.is_success() || answer.status == StatusCode::NOT_FOUND {
        Ok(answer)
    } else {
        Err(status_error(what, &answer))
    }
}

/// A server error that Consul raises before the write reaches Raft, so nothing was applied:
/// no leader to forward it to, a client agent that knows no server to send it to (one
/// restarted, until it joins the cluster again), an unknown datacenter, a lock naming an
/// invalid session, or the leader's rate limit for writes (503 "rate limit exceeded, try
/// again later").
fn refused_before_applying(answer: &Answer) -> bool {
    let text = answer.text().to_ascii_lowercase();
    is_invalid_session(answer)
        || text.contains("no cluster leader")
        || text.contains("no known consul servers")
        || text.contains("no path to datacenter")
        || text.contains("rate limit exceeded")
}

/// Consul answers 500 when a lock names a session that does not exist; that is the
/// caller's mistake or an expired session, not an outage.
fn is_invalid_session(answer: &Answer) -> bool {
    answer
        .text()
        .to_ascii_lowercase()
        .contains("invalid session")
}

/// The one 404 Consul gives a write: a session renewal naming a session it does not hold
/// (`Session id '…' not found`). Its KV and transaction writes never answer 404, so any
/// other 404 comes from in front of the agent, and the write never reached Consul.
fn is_unknown_session(answer: &Answer) -> bool {
    let text = answer.text();
    text.starts_with("Session id '") && text.ends_with("' not found")
}

/// The error kind of a non-2xx answer, carrying Consul's own text.
pub(super) fn status_error(what: &str, answer: &Answer) -> StoreError {
    let message = format!("{what}: {} {}", answer.status.as_u16(), answer.text());
    match answer.status {
        StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => StoreError::Forbidden(message),
        StatusCode::NOT_FOUND => StoreError::NotFound(message),
        StatusCode::CONFLICT => StoreError::conflict(message),
        StatusCode::TOO_MANY_REQUESTS => StoreError::Unavailable(message),
        status if status.is_server_error() && is_invalid_session(answer) => {
            StoreError::NotFound(message)
        }
        status if status.is_server_error() => StoreError::Unavailable(message),
        _ => StoreError::Invalid(message),
    }
}

/// `GET /v1/kv/x`: names the call in messages, without the query (which may be long).
fn describe(method: &Method, url: &Url) -> String {
    format!("{method} {}", url.path())
}

/// reqwest's own message hides the cause ("error sending request"); the chain says it.
fn error_chain(e: &reqwest::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
