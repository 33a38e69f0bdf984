//! The Consul backend: Consul's HTTP API v1 through reqwest.

mod http;
mod wire;

use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use tokio::time::Instant;

use self::http::{Http, Lane, WriteFailure};
use super::{
    validate_key, validate_prefix, validate_txn, validate_value, Cas, KvPair, KvStore, Listing,
    SessionInfo, SessionSpec, StoreError, StoreResult, TxnOp, WatchTarget, MAX_WATCH_WAIT,
};

/// Least time between two queries of one watch when Consul returns early with an unchanged
/// index, so a misbehaving agent cannot make us spin.
const MIN_REQUERY_PAUSE: Duration = Duration::from_millis(100);
/// How many requests the store has in flight to the agent at once by default: well under
/// the agent's `limits.http_max_conns_per_client` of 200, which it counts per client address.
pub const DEFAULT_MAX_CONNECTIONS: usize = 128;
/// How often `release` re-reads and tries again when the key changes under it.
const RELEASE_ATTEMPTS: u32 = 3;

/// How to reach Consul.
#[derive(Debug, Clone)]
pub struct ConsulConfig {
    /// `http://HOST:PORT` or `https://HOST:PORT`.
    pub base_url: String,
    /// Sent as `X-Consul-Token`.
    pub token: Option<String>,
    /// Sent as `?dc=`.
    pub datacenter: Option<String>,
}

impl ConsulConfig {
    /// The agent `CONSUL_HTTP_ADDR` names, read as Consul's own tools read it (`HOST:PORT`
    /// or an `http(s)://` URL), with `CONSUL_HTTP_TOKEN`; `None` when it names none.
    pub fn from_env() -> Option<Result<ConsulConfig, String>> {
        let addr = std::env::var("CONSUL_HTTP_ADDR").ok()?;
        let url = if addr.contains("://") {
            addr.replacen("http://", "consul://", 1)
                .replacen("https://", "consul+https://", 1)
        } else {
            format!("consul://{addr}")
        };
        Some(match url.parse() {
            Ok(super::StoreUrl::Consul { base_url }) => Ok(ConsulConfig {
                base_url,
                token: std::env::var("CONSUL_HTTP_TOKEN").ok(),
                datacenter: None,
            }),
            _ => Err(format!(
                "CONSUL_HTTP_ADDR={addr:?} is not HOST:PORT or an http(s) URL"
            )),
        })
    }
}

/// Time limits of the HTTP client, kept apart from [`ConsulConfig`] because only tests and
/// unusual deployments need to change them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsulTimeouts {
    /// Establishing a connection to the agent.
    pub connect: Duration,
    /// A whole request and its answer, the wait for a connection included; blocking watches
    /// get their own, longer limit.
    pub request: Duration,
    /// Added to a watch's wait (after Consul's jitter of wait/16) before a watch request is
    /// given up for lost.
    pub watch_slack: Duration,
}

impl Default for ConsulTimeouts {
    fn default() -> Self {
        ConsulTimeouts {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(30),
            watch_slack: Duration::from_secs(5),
        }
    }
}

/// The Consul store.
#[derive(Debug)]
pub struct ConsulStore {
    http: Http,
}

impl ConsulStore {
    /// Builds the HTTP client; nothing is sent until the first call.
    pub fn new(config: ConsulConfig) -> Result<Self, StoreError> {
        Self::with_timeouts(config, ConsulTimeouts::default())
    }

    /// Like [`ConsulStore::new`] with other time limits.
    pub fn with_timeouts(
        config: ConsulConfig,
        timeouts: ConsulTimeouts,
    ) -> Result<Self, StoreError> {
        Self::with_limits(config, timeouts, DEFAULT_MAX_CONNECTIONS, 0)
    }

    /// Like [`ConsulStore::with_timeouts`], with at most `max_connections` requests in flight
    /// to the agent at once (at least `own_watches` + 2, and 3): a quarter of them, and at
    /// least one for each of the `own_watches` blocking watches the server keeps open at
    /// once, kept for the server's own blocking watches, a quarter (or what is left but one)
    /// for blocking queries made for a request ([`crate::kv::sent::in_request`]: the API's
    /// clients'), the rest for everything else, one of them (when the rest has two or more)
    /// kept for session renewals. A request waits for a free one within its time limit; one
    /// that finds none is not sent and fails `Unavailable`, and a write whose caller gives up
    /// waiting first is withdrawn ([`crate::kv::sent`]), never sent.
    pub fn with_limits(
        config: ConsulConfig,
        timeouts: ConsulTimeouts,
        max_connections: usize,
        own_watches: usize,
    ) -> Result<Self, StoreError> {
        Ok(ConsulStore {
            http: Http::new(config, timeouts, max_connections, own_watches)?,
        })
    }

    /// A KV read of `key` (`?recurse` for a prefix) and the pairs it finds; 404 is empty.
    async fn read_pairs(&self, url: url::Url, what: &str) -> StoreResult<Listing> {
        let answer = self.http.read(url).await?;
        snapshot(what, answer)
    }

    /// After a lost CAS put: a consistent read tells whether the write landed. The key
    /// holding this write's `token` (its flags) proves it did. Nothing a read shows proves
    /// it did not: a request whose answer was lost (a timeout above all) may still be on its
    /// way through Consul's leader and land after the read, even on a key still at the CAS
    /// index; and a key that moved on may have moved after this write landed. So anything
    /// else leaves the outcome unknown.
    async fn put_landed(&self, key: &str, token: u64, lost: String) -> StoreResult<()> {
        match self.consistent_get(key, &lost).await? {
            Some((_, flags)) if flags == token => Ok(()),
            Some(_) => Err(StoreError::OutcomeUnknown(format!(
                "{lost}; a re-read does not show the write, which may still land"
            ))),
            None => Err(StoreError::OutcomeUnknown(format!(
                "{lost}; the key changed since"
            ))),
        }
    }

    /// After a lost delete: a consistent read tells whether the key is gone. A key still
    /// there proves nothing: the delete may still land, or may have landed before another
    /// writer made the key again.
    async fn delete_landed(&self, key: &str, lost: String) -> StoreResult<()> {
        match self.consistent_get(key, &lost).await? {
            None => Ok(()),
            Some(_) => Err(StoreError::OutcomeUnknown(format!(
                "{lost}; a re-read still finds the key, and the delete may still land"
            ))),
        }
    }

    /// The key and its flags, read with `?consistent` so that the answer is the leader's.
    async fn consistent_get(&self, key: &str, lost: &str) -> StoreResult<Option<(KvPair, u64)>> {
        let mut url = self.http.kv_url(key);
        url.query_pairs_mut().append_key_only("consistent");
        let unknown = |e: StoreError| {
            StoreError::OutcomeUnknown(format!("{lost}; re-reading the key failed: {e}"))
        };
        let answer = self.http.read(url).await.map_err(unknown)?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let entries = wire::decode_pairs_with_flags("get", &answer.body).map_err(unknown)?;
        Ok(entries.into_iter().find(|(pair, _)| pair.key == key))
    }

    /// Sends a transaction once and reads its answer, commit or rollback.
    async fn send_txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        let body: Vec<wire::TxnOpBody<'_>> = ops.iter().map(wire::TxnOpBody::from).collect();
        let body = serde_json::to_vec(&body)
            .map_err(|e| StoreError::Invalid(format!("encoding the transaction: {e}")))?;
        match self
            .http
            .write(Method::PUT, self.http.url(["txn"]), Some(body))
            .await
        {
            Ok(answer) => written(
                wire::decode::<wire::TxnAnswer>("txn", &answer.body)
                    .and_then(|committed| committed.into_results(ops)),
            ),
            Err(WriteFailure::Refused(e, answer)) if answer.status == StatusCode::CONFLICT => {
                // The 409 body lists the failing ops; keep Consul's text if it does not parse.
                match wire::decode::<wire::TxnAnswer>("txn", &answer.body) {
                    Ok(rollback) => Err(rollback.into_rollback_error()),
                    Err(_) => Err(e),
                }
            }
            Err(failure) => Err(failure.into_error()),
        }
    }
}

/// Builds a listing from a KV read; 404 (nothing there) is an empty listing at its index.
fn snapshot(what: &str, answer: http::Answer) -> StoreResult<Listing> {
    let index = answer.index(what)?;
    let pairs = if answer.status == StatusCode::NOT_FOUND {
        Vec::new()
    } else {
        wire::decode_pairs(what, &answer.body)?
    };
    Ok(Listing { index, pairs })
}

/// Go duration text for `?wait=`, whole seconds when possible.
fn wait_param(wait: Duration) -> String {
    let wait = Duration::from_millis(wait.as_millis().try_into().unwrap_or(u64::MAX));
    wire::format_duration(wait)
}

fn validate_session_id(id: &str) -> StoreResult<()> {
    if id.is_empty() || id.contains('/') || id.chars().any(char::is_control) {
        return Err(StoreError::Invalid(format!("bad session id {id:?}")));
    }
    Ok(())
}

/// What a write Consul applied (it answered 2xx) reads from its answer. An answer that
/// cannot be read (a proxy's page, say) leaves what the write did unknown: it is not the
/// store being unavailable, which would invite a blind retry.
fn written<T>(read: StoreResult<T>) -> StoreResult<T> {
    read.map_err(|e| match e {
        StoreError::Unavailable(why) => StoreError::OutcomeUnknown(format!(
            "{why}; the write reached Consul, and what it did is not known"
        )),
        other => other,
    })
}

/// The answer of a KV write: `false` is a missed check-and-set.
fn cas_outcome(answer: &http::Answer, what: &str, key: &str) -> StoreResult<()> {
    if answer.boolean(what)? {
        Ok(())
    } else {
        Err(StoreError::conflict(format!(
            "{what} {key:?}: check-and-set failed"
        )))
    }
}

#[async_trait]
impl KvStore for ConsulStore {
    async fn get(&self, key: &str) -> StoreResult<Option<KvPair>> {
        validate_key(key)?;
        let listing = self.read_pairs(self.http.kv_url(key), "get").await?;
        Ok(listing.pairs.into_iter().find(|p| p.key == key))
    }

    async fn list(&self, prefix: &str) -> StoreResult<Listing> {
        validate_prefix(prefix)?;
        let mut url = self.http.kv_url(prefix);
        url.query_pairs_mut().append_key_only("recurse");
        self.read_pairs(url, "list").await
    }

    /// A read of the missing probe is answered at the KV table's index; of a key that
    /// exists, at the key's own.
    async fn current_index(&self, probe: &str) -> StoreResult<Option<u64>> {
        validate_key(probe)?;
        let listing = self.read_pairs(self.http.kv_url(probe), "get").await?;
        Ok(listing.pairs.is_empty().then_some(listing.index))
    }

    async fn keys(&self, prefix: &str, separator: Option<char>) -> StoreResult<(u64, Vec<String>)> {
        validate_prefix(prefix)?;
        let mut url = self.http.kv_url(prefix);
        url.query_pairs_mut().append_key_only("keys");
        if let Some(separator) = separator {
            url.query_pairs_mut()
                .append_pair("separator", separator.encode_utf8(&mut [0; 4]));
        }
        let answer = self.http.read(url).await?;
        let index = answer.index("keys")?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok((index, Vec::new()));
        }
        let keys: Option<Vec<String>> = wire::decode("keys", &answer.body)?;
        Ok((index, keys.unwrap_or_default()))
    }

    async fn put(&self, key: &str, value: &[u8], cas: Cas) -> StoreResult<()> {
        validate_key(key)?;
        validate_value(value)?;
        let mut url = self.http.kv_url(key);
        // A CAS put marks its write with a random token in the flags, so that if its answer
        // is lost a re-read can tell its own write from another writer's.
        let token = rand::random::<u64>() | 1;
        if let Cas::Index(index) = cas {
            url.query_pairs_mut()
                .append_pair("cas", &index.to_string())
                .append_pair("flags", &token.to_string());
        }
        match self
            .http
            .write(Method::PUT, url, Some(value.to_vec()))
            .await
        {
            Ok(answer) => written(cas_outcome(&answer, "put", key)),
            Err(WriteFailure::Lost(lost)) => match cas {
                Cas::Index(_) => self.put_landed(key, token, lost).await,
                Cas::Any => Err(WriteFailure::Lost(lost).into_error()),
            },
            Err(failure) => Err(failure.into_error()),
        }
    }

    async fn delete(&self, key: &str, cas: Cas) -> StoreResult<()> {
        validate_key(key)?;
        let mut url = self.http.kv_url(key);
        if let Cas::Index(index) = cas {
            url.query_pairs_mut().append_pair("cas", &index.to_string());
        }
        match self.http.write(Method::DELETE, url, None).await {
            Ok(answer) => written(cas_outcome(&answer, "delete", key)),
            // Either way the goal was "gone": if it is gone, nothing is left to do.
            Err(WriteFailure::Lost(lost)) => self.delete_landed(key, lost).await,
            Err(failure) => Err(failure.into_error()),
        }
    }

    async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        validate_prefix(prefix)?;
        let mut url = self.http.kv_url(prefix);
        url.query_pairs_mut().append_key_only("recurse");
        match self.http.write(Method::DELETE, url, None).await {
            Ok(_) => Ok(()),
            Err(failure) => Err(failure.into_error()),
        }
    }

    fn key_prefix_len(&self) -> usize {
        0
    }

    async fn txn(&self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        validate_txn(ops)?;
        self.send_txn(ops).await
    }

    async fn create_session(&self, spec: &SessionSpec) -> StoreResult<String> {
        spec.validate()?;
        let body = serde_json::to_vec(&wire::SessionCreate::new(spec))
            .map_err(|e| StoreError::Invalid(format!("encoding the session: {e}")))?;
        let url = self.http.url(["session", "create"]);
        match self.http.write(Method::PUT, url, Some(body)).await {
            Ok(answer) => {
                let created: wire::SessionCreated =
                    written(wire::decode("session create", &answer.body))?;
                Ok(created.id)
            }
            Err(failure) => Err(failure.into_error()),
        }
    }

    async fn renew_session(&self, id: &str) -> StoreResult<SessionInfo> {
        validate_session_id(id)?;
        let url = self.http.url(["session", "renew", id]);
        match self
            .http
            .write_in(Lane::Renewals, Method::PUT, url, None)
            .await
        {
            Ok(answer) => written(wire::decode_session("session renew", &answer.body))?
                .ok_or_else(|| StoreError::NotFound(format!("session {id}"))),
            Err(failure) => Err(failure.into_error()),
        }
    }

    async fn destroy_session(&self, id: &str) -> StoreResult<()> {
        validate_session_id(id)?;
        let url = self.http.url(["session", "destroy", id]);
        match self.http.write(Method::PUT, url, None).await {
            Ok(_) => Ok(()),
            Err(failure) => Err(failure.into_error()),
        }
    }

    async fn session_info(&self, id: &str) -> StoreResult<Option<SessionInfo>> {
        validate_session_id(id)?;
        let answer = self
            .http
            .read(self.http.url(["session", "info", id]))
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        wire::decode_session("session info", &answer.body)
    }

    async fn acquire(&self, key: &str, value: &[u8], session: &str) -> StoreResult<bool> {
        validate_key(key)?;
        validate_value(value)?;
        validate_session_id(session)?;
        let mut url = self.http.kv_url(key);
        url.query_pairs_mut().append_pair("acquire", session);
        match self
            .http
            .write(Method::PUT, url, Some(value.to_vec()))
            .await
        {
            Ok(answer) => written(answer.boolean("acquire")),
            Err(failure) => Err(failure.into_error()),
        }
    }

    /// Consul's `?release=` replaces the value with the request body, so the release is a
    /// transaction that writes back the value just read, guarded by its modify index.
    async fn release(&self, key: &str, session: &str) -> StoreResult<bool> {
        validate_key(key)?;
        validate_session_id(session)?;
        for _ in 0..RELEASE_ATTEMPTS {
            let Some(pair) = self.get(key).await? else {
                return Ok(false);
            };
            if pair.session() != Some(session) {
                return Ok(false);
            }
            let ops = [
                TxnOp::CheckIndex {
                    key: key.to_string(),
                    index: pair.modify_index,
                },
                TxnOp::Unlock {
                    key: key.to_string(),
                    value: pair.value.to_vec(),
                    session: session.to_string(),
                },
            ];
            match self.send_txn(&ops).await {
                Ok(_) => return Ok(true),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::conflict(format!(
            "release {key:?}: the key kept changing during {RELEASE_ATTEMPTS} attempts"
        )))
    }

    async fn watch(
        &self,
        target: &WatchTarget,
        index: u64,
        wait: Duration,
    ) -> StoreResult<Listing> {
        let mut base_url = match target {
            WatchTarget::Key(key) => {
                validate_key(key)?;
                self.http.kv_url(key)
            }
            WatchTarget::Prefix(prefix) => {
                validate_prefix(prefix)?;
                let mut url = self.http.kv_url(prefix);
                url.query_pairs_mut().append_key_only("recurse");
                url
            }
        };
        let wait = wait.min(MAX_WATCH_WAIT);
        if index == 0 || wait < MIN_REQUERY_PAUSE {
            // Nothing to block on: index 0 asks for the current state.
            return self.read_pairs(base_url, "watch").await;
        }
        base_url
            .query_pairs_mut()
            .append_pair("index", &index.to_string());
        let deadline = Instant::now() + wait;
        let mut this_wait = wait;
        loop {
            let started = Instant::now();
            let mut url = base_url.clone();
            url.query_pairs_mut()
                .append_pair("wait", &wait_param(this_wait));
            let answer = self.http.read_blocking(url, this_wait).await?;
            let listing = snapshot("watch", answer)?;
            // A lower index means the store went backwards; the caller starts again from it.
            if listing.index != index {
                return Ok(listing);
            }
            // Consul holds a query that times out for the wait plus up to wait/16, so its
            // answer usually comes after the deadline: count from now, not from the send.
            let resume = (started + MIN_REQUERY_PAUSE).max(Instant::now());
            if resume + MIN_REQUERY_PAUSE > deadline {
                return Ok(listing);
            }
            tokio::time::sleep_until(resume).await;
            // Consul reads `wait=0` as its 5-minute default, so never ask for less than the
            // pause: at that point the wait is over. Told after the pause, which may end late.
            this_wait = deadline.saturating_duration_since(Instant::now());
            if this_wait < MIN_REQUERY_PAUSE {
                return Ok(listing);
            }
        }
    }

    async fn ping(&self) -> StoreResult<()> {
        let answer = self.http.read(self.http.url(["status", "leader"])).await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Err(http::status_error("GET /v1/status/leader", &answer));
        }
        let leader: String = wire::decode("status leader", &answer.body)?;
        if leader.is_empty() {
            return Err(StoreError::Unavailable(
                "Consul has no cluster leader".into(),
            ));
        }
        Ok(())
    }
}
