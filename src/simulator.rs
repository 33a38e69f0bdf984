//! The node simulator: stands in for P2's preparers on N nodes, through the REST API only.
//!
//! Each simulated node is named `<prefix>-0001`, `<prefix>-0002`, ... and is given its node
//! labels once, at start (a PUT that replaces them; later relabelling through the API is left
//! alone). One blocking watch over `GET /api/v1/pods` then follows what is intended on every
//! simulated node, so the load on the server does not grow with the number of nodes. For
//! each (node, pod) whose intended manifest changes, the simulator does what a preparer does:
//!
//! - a new pod: after `start_delay`, report the manifest installed
//!   (`PUT /api/v1/reality/<node>/<pod_id>`) and then its health;
//! - a changed manifest: withdraw the pod's health at once (it is restarting), then as for a
//!   new pod;
//! - a pod no longer intended: withdraw its health and its reality at once (stopping is quick,
//!   starting is not).
//!
//! A node's pods are all `passing`, or all `critical` on the nodes chosen by
//! `unhealthy_fraction`. The manifest bytes come from `GET /api/v1/intent/<node>/<pod_id>`,
//! fetched once per manifest SHA and reused for every node running it.
//!
//! Requests that fail for a reason that may pass (no connection, 5xx, 429) are retried with
//! backoff, so the simulator may start before the server. Nothing is cleaned up on shutdown:
//! a node that stops leaves its reports behind, as a crashed preparer's session-less
//! records would.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use reqwest::{Certificate, Client, ClientBuilder, RequestBuilder, Response, StatusCode, Url};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::labels::{validate_labels, Labels};
use crate::model::HealthState;
use crate::model::Manifest;
use crate::store::pods::validate_node_name;

/// How long one blocking query of the pod listing is held by the server.
const WATCH_WAIT: Duration = Duration::from_secs(30);
/// Items per page of the pod listing (the server's maximum).
const PAGE_LIMIT: usize = 1000;
/// The least time between two listings: the simulator's own health reports wake its watch,
/// and a burst of them should cost one listing, not one each.
const MIN_LIST_INTERVAL: Duration = Duration::from_millis(100);
/// Limit of any request but the blocking watch.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const RETRY_BASE: Duration = Duration::from_millis(100);
const RETRY_CAP: Duration = Duration::from_secs(5);

/// What to simulate and where.
#[derive(Debug, Clone)]
pub struct SimulatorConfig {
    /// The server's base URL, e.g. `http://127.0.0.1:8080`.
    pub server: Url,
    /// How many nodes to simulate.
    pub nodes: usize,
    /// The labels every simulated node gets; at least one, since a node without labels is
    /// unknown to the farms.
    pub labels: Labels,
    /// The share of nodes (0 to 1) whose pods report `critical`: exactly
    /// `floor(nodes × fraction)` of them, spread evenly over the node numbers.
    pub unhealthy_fraction: f64,
    /// How long a pod takes to start before it is reported installed and healthy.
    pub start_delay: Duration,
    /// Node names are `<name_prefix>-0001` and up; several simulators with different
    /// prefixes can share one server.
    pub name_prefix: String,
    /// The most requests in flight at once, the blocking watch aside.
    pub max_in_flight: usize,
    /// PEM certificates to trust for an https:// server, besides the usual public roots.
    pub ca_cert: Option<PathBuf>,
}

impl SimulatorConfig {
    /// The simulated node names, in order.
    pub fn node_names(&self) -> Vec<String> {
        (1..=self.nodes)
            .map(|n| format!("{}-{n:04}", self.name_prefix))
            .collect()
    }

    /// Whether the `n`th node (from 1) reports its pods `critical`: the nodes where
    /// `floor(n × fraction)` steps up, so any prefix of the nodes holds its share.
    pub fn is_unhealthy(&self, n: usize) -> bool {
        let fraction = self.unhealthy_fraction;
        n >= 1 && (n as f64 * fraction).floor() > ((n - 1) as f64 * fraction).floor()
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.nodes == 0 {
            bail!("simulate at least one node");
        }
        if !(0.0..=1.0).contains(&self.unhealthy_fraction) {
            bail!(
                "the unhealthy fraction must be between 0 and 1, not {}",
                self.unhealthy_fraction
            );
        }
        if self.labels.is_empty() {
            bail!(
                "give the nodes at least one label: a node without labels is unknown to the farms"
            );
        }
        if let Some((field, message)) = validate_labels(&self.labels).into_iter().next() {
            bail!("bad node label {field}: {message}");
        }
        let last = self.node_names().pop().unwrap_or_default();
        validate_node_name(&last).map_err(|e| anyhow::anyhow!("bad name prefix: {e}"))?;
        if self.max_in_flight == 0 {
            bail!("allow at least one request in flight");
        }
        if self.server.cannot_be_a_base() {
            bail!("the server URL {} cannot be a base URL", self.server);
        }
        if !matches!(self.server.scheme(), "http" | "https") {
            bail!(
                "the server URL {} is neither http:// nor https://",
                self.server
            );
        }
        Ok(())
    }
}

/// An HTTP client builder that also trusts the PEM certificates in `ca_cert`, such as a
/// private CA's or a server's self-signed one.
pub fn client_trusting(ca_cert: Option<&Path>) -> anyhow::Result<ClientBuilder> {
    let mut builder = Client::builder();
    if let Some(path) = ca_cert {
        let pem = std::fs::read(path)
            .with_context(|| format!("reading the CA certificates {}", path.display()))?;
        let certs = Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("reading the CA certificates {}", path.display()))?;
        if certs.is_empty() {
            bail!("no certificate in {} (PEM expected)", path.display());
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    Ok(builder)
}

/// Runs the simulated nodes until `shutdown`: labels them, then keeps their reality and
/// health in line with what is intended on them. Fails on a bad configuration, or when the
/// server refuses the node labels or the pod listing as wrong (a 4xx), which retrying cannot
/// fix; a pod whose reports are refused is logged and skipped.
pub async fn run(config: SimulatorConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate()?;
    let client = client_trusting(config.ca_cert.as_deref())?
        .connect_timeout(Duration::from_secs(5))
        .build()
        .context("building the HTTP client")?;
    let health = config
        .node_names()
        .into_iter()
        .enumerate()
        .map(|(i, node)| {
            let status = if config.is_unhealthy(i + 1) {
                HealthState::Critical
            } else {
                HealthState::Passing
            };
            (node, status)
        })
        .collect();
    let sim = Arc::new(Sim {
        client,
        in_flight: Semaphore::new(config.max_in_flight),
        health,
        manifests: Mutex::new(HashMap::new()),
        shutdown: shutdown.clone(),
        config,
    });
    tracing::info!(
        server = %sim.config.server,
        nodes = sim.config.nodes,
        prefix = %sim.config.name_prefix,
        "simulating nodes"
    );

    if !sim.label_nodes().await? {
        return Ok(());
    }
    let (desired_tx, desired_rx) = watch::channel(Arc::new(Desired::new()));
    let watcher = tokio::spawn(sim.clone().watch_pods(desired_tx));
    let reconciled = sim.clone().reconcile(desired_rx).await;
    shutdown.cancel();
    let watched = watcher.await.context("the pod watch panicked")?;
    reconciled.and(watched)
}

/// A node and a pod ID.
type PodKey = (String, String);

/// What is intended on the simulated nodes: manifest SHA by (node, pod ID).
type Desired = BTreeMap<PodKey, String>;

/// A finished job: its pod and what is reported there now.
type JobResult = (PodKey, anyhow::Result<Option<String>>);

/// One (node, pod) as the reconciler tracks it.
#[derive(Debug, Default)]
struct Slot {
    /// The intended manifest's SHA; `None` once the pod is no longer intended.
    want: Option<String>,
    /// The SHA last reported installed; `None` when nothing is reported.
    have: Option<String>,
    /// A job is converging this pod; at most one is, so reports never race.
    busy: bool,
}

/// What a request came to.
enum Outcome {
    /// The server answered with this (non-retryable) response.
    Answered(Response),
    /// Shutdown came first.
    Stopped,
}

struct Sim {
    config: SimulatorConfig,
    client: Client,
    in_flight: Semaphore,
    /// The status each simulated node reports for its pods.
    health: HashMap<String, HealthState>,
    /// Manifest text by SHA, so each manifest is fetched once, not once per node.
    manifests: Mutex<HashMap<String, Arc<String>>>,
    shutdown: CancellationToken,
}

/// The pod listing as the simulator reads it.
#[derive(Deserialize)]
struct PodPage {
    items: Vec<PodItem>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
}

#[derive(Deserialize)]
struct PodItem {
    node: String,
    pod_id: String,
    manifest_sha: String,
}

impl Sim {
    /// `<server>/api/v1/<segments...>`, each segment percent-encoded.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.config.server.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(["api", "v1"]).extend(segments);
        }
        url
    }

    /// Sends the request `make` builds, retrying transport errors, 5xx, 408 and 429 with
    /// backoff, holding one of the in-flight permits while it is out.
    async fn call(&self, what: &str, make: impl Fn(&Client) -> RequestBuilder) -> Outcome {
        let mut backoff = Backoff::new(RETRY_BASE, RETRY_CAP);
        loop {
            let sent = async {
                let _permit = self.in_flight.acquire().await;
                make(&self.client).timeout(REQUEST_TIMEOUT).send().await
            };
            let result = tokio::select! {
                () = self.shutdown.cancelled() => return Outcome::Stopped,
                result = sent => result,
            };
            match result {
                Ok(response) if !retryable(response.status()) => {
                    return Outcome::Answered(response)
                }
                Ok(response) => {
                    tracing::debug!(%what, status = %response.status(), "retrying")
                }
                Err(e) => tracing::debug!(%what, error = %e, "retrying"),
            }
            let pause = backoff.next_delay();
            tokio::select! {
                () = self.shutdown.cancelled() => return Outcome::Stopped,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Like [`Sim::call`], and a 4xx other than `allowed` is an error; `None` on shutdown.
    async fn expect(
        &self,
        what: &str,
        allowed: &[StatusCode],
        make: impl Fn(&Client) -> RequestBuilder,
    ) -> anyhow::Result<Option<Response>> {
        match self.call(what, make).await {
            Outcome::Stopped => Ok(None),
            Outcome::Answered(response)
                if response.status().is_success() || allowed.contains(&response.status()) =>
            {
                Ok(Some(response))
            }
            Outcome::Answered(response) => {
                let status = response.status();
                let body = response.text().await.unwrap_or_default();
                bail!("{what}: the server answered {status}: {body}")
            }
        }
    }

    /// Gives every node its labels; `false` if shutdown came first.
    async fn label_nodes(self: &Arc<Self>) -> anyhow::Result<bool> {
        let mut jobs = JoinSet::new();
        for node in self.config.node_names() {
            let sim = self.clone();
            jobs.spawn(async move {
                let url = sim.url(&["labels", "node", &node]);
                let body = json!({ "labels": sim.config.labels });
                let what = format!("labelling {node}");
                let answered = sim
                    .expect(&what, &[], |c| c.put(url.clone()).json(&body))
                    .await?;
                Ok::<bool, anyhow::Error>(answered.is_some())
            });
        }
        let mut all = true;
        while let Some(joined) = jobs.join_next().await {
            all &= joined.context("a labelling task panicked")??;
        }
        Ok(all)
    }

    /// Follows the pod listing with one blocking query at a time and publishes what is
    /// intended on the simulated nodes whenever it changes.
    async fn watch_pods(
        self: Arc<Self>,
        desired: watch::Sender<Arc<Desired>>,
    ) -> anyhow::Result<()> {
        let mut index: Option<u64> = None;
        loop {
            let started = Instant::now();
            let Some((next, pods)) = self.list_pods(index).await? else {
                return Ok(());
            };
            index = Some(next);
            desired.send_if_modified(|current| {
                let changed = **current != pods;
                if changed {
                    *current = Arc::new(pods);
                }
                changed
            });
            tokio::select! {
                () = self.shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep_until(started + MIN_LIST_INTERVAL) => {}
            }
        }
    }

    /// Every page of the pod listing, the first held until the listing's index moves past
    /// `index`; the first page's `X-Index` with what is intended on simulated nodes. `None` on
    /// shutdown.
    async fn list_pods(&self, index: Option<u64>) -> anyhow::Result<Option<(u64, Desired)>> {
        let mut pods = Desired::new();
        let mut first_index = None;
        let mut token: Option<String> = None;
        loop {
            let mut url = self.url(&["pods"]);
            url.query_pairs_mut()
                .append_pair("limit", &PAGE_LIMIT.to_string());
            if let Some(token) = &token {
                url.query_pairs_mut().append_pair("continue", token);
            }
            let mut timeout = REQUEST_TIMEOUT;
            if let (Some(index), None) = (index, &first_index) {
                url.query_pairs_mut()
                    .append_pair("index", &index.to_string())
                    .append_pair("wait", &format!("{}s", WATCH_WAIT.as_secs()));
                timeout += WATCH_WAIT;
            }
            let Some(response) = self.watch_request(url, timeout).await? else {
                return Ok(None);
            };
            let page_index = response
                .headers()
                .get("x-index")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .context("the pod listing carries no X-Index")?;
            first_index.get_or_insert(page_index);
            let page: PodPage = response.json().await.context("decoding the pod listing")?;
            for pod in page.items {
                if self.health.contains_key(&pod.node) {
                    pods.insert((pod.node, pod.pod_id), pod.manifest_sha);
                }
            }
            match page.continue_token {
                Some(next) => token = Some(next),
                None => return Ok(first_index.map(|index| (index, pods))),
            }
        }
    }

    /// One page of the listing, retried until it answers; outside the in-flight limit, so
    /// a held query never keeps reports waiting.
    async fn watch_request(&self, url: Url, timeout: Duration) -> anyhow::Result<Option<Response>> {
        let mut backoff = Backoff::new(RETRY_BASE, RETRY_CAP);
        loop {
            let sent = self.client.get(url.clone()).timeout(timeout).send();
            let result = tokio::select! {
                () = self.shutdown.cancelled() => return Ok(None),
                result = sent => result,
            };
            match result {
                Ok(response) if response.status().is_success() => return Ok(Some(response)),
                Ok(response) if !retryable(response.status()) => {
                    let status = response.status();
                    let body = response.text().await.unwrap_or_default();
                    bail!("listing pods: the server answered {status}: {body}");
                }
                Ok(response) => {
                    tracing::warn!(status = %response.status(), "listing pods failed; retrying")
                }
                Err(e) => tracing::warn!(error = %e, "listing pods failed; retrying"),
            }
            let pause = backoff.next_delay();
            tokio::select! {
                () = self.shutdown.cancelled() => return Ok(None),
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Keeps one job per (node, pod) whose report differs from its intent until shutdown.
    async fn reconcile(
        self: Arc<Self>,
        mut desired: watch::Receiver<Arc<Desired>>,
    ) -> anyhow::Result<()> {
        let mut slots: HashMap<PodKey, Slot> = HashMap::new();
        let mut jobs: JoinSet<JobResult> = JoinSet::new();
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return Ok(()),
                changed = desired.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    let current = desired.borrow_and_update().clone();
                    for (key, slot) in &mut slots {
                        slot.want = current.get(key).cloned();
                    }
                    for (key, sha) in current.iter() {
                        slots.entry(key.clone()).or_default().want = Some(sha.clone());
                    }
                }
                Some(joined) = jobs.join_next() => {
                    let (key, result) = joined.context("a pod job panicked")?;
                    let Some(slot) = slots.get_mut(&key) else { continue };
                    slot.busy = false;
                    match result {
                        Ok(have) => slot.have = have,
                        Err(e) => {
                            // Refused as wrong, so retrying cannot help; the next change
                            // to this pod's intent tries again.
                            tracing::warn!(node = %key.0, pod_id = %key.1, error = %e, "giving up on a pod");
                            slot.have = slot.want.clone();
                        }
                    }
                }
            }
            slots.retain(|_, slot| slot.busy || slot.want.is_some() || slot.have.is_some());
            for (key, slot) in &mut slots {
                if slot.busy || slot.want == slot.have {
                    continue;
                }
                slot.busy = true;
                let (sim, key, want, had) = (
                    self.clone(),
                    key.clone(),
                    slot.want.clone(),
                    slot.have.clone(),
                );
                jobs.spawn(async move {
                    let result = sim.converge(&key.0, &key.1, want, had).await;
                    (key, result)
                });
            }
        }
    }

    /// Brings one pod's reports to `want` from `had`; returns what is reported afterwards.
    async fn converge(
        &self,
        node: &str,
        pod_id: &str,
        want: Option<String>,
        had: Option<String>,
    ) -> anyhow::Result<Option<String>> {
        let Some(want) = want else {
            self.withdraw_health(node, pod_id).await?;
            let url = self.url(&["reality", node, pod_id]);
            let what = format!("withdrawing {pod_id} on {node}");
            self.expect(&what, &[], |c| c.delete(url.clone())).await?;
            return Ok(None);
        };
        if had.is_some() {
            self.withdraw_health(node, pod_id).await?;
        }
        tokio::select! {
            () = self.shutdown.cancelled() => return Ok(had),
            () = tokio::time::sleep(self.config.start_delay) => {}
        }
        let Some((sha, text)) = self.manifest(node, pod_id, &want).await? else {
            // No longer intended: the next listing says so, and the pod is withdrawn then.
            return Ok(had);
        };
        let url = self.url(&["reality", node, pod_id]);
        let what = format!("reporting {pod_id} installed on {node}");
        let put = |c: &Client| {
            c.put(url.clone())
                .header(reqwest::header::CONTENT_TYPE, crate::api::reality::YAML)
                .body(text.as_str().to_owned())
        };
        if self.expect(&what, &[], put).await?.is_none() {
            return Ok(had);
        }
        let status = self
            .health
            .get(node)
            .copied()
            .unwrap_or(HealthState::Passing);
        let url = self.url(&["health", pod_id, node]);
        let what = format!("reporting {pod_id}'s health on {node}");
        let body = json!({ "status": status });
        self.expect(&what, &[], |c| c.put(url.clone()).json(&body))
            .await?;
        Ok(Some(sha))
    }

    async fn withdraw_health(&self, node: &str, pod_id: &str) -> anyhow::Result<()> {
        let url = self.url(&["health", pod_id, node]);
        let what = format!("withdrawing {pod_id}'s health on {node}");
        self.expect(&what, &[], |c| c.delete(url.clone())).await?;
        Ok(())
    }

    /// The manifest intended for the pod, with its SHA: from the cache when `sha` was seen
    /// before, else read from the intent. `None` when it is no longer intended.
    async fn manifest(
        &self,
        node: &str,
        pod_id: &str,
        sha: &str,
    ) -> anyhow::Result<Option<(String, Arc<String>)>> {
        if let Some(text) = self.cached(sha) {
            return Ok(Some((sha.to_owned(), text)));
        }
        let url = self.url(&["intent", node, pod_id]);
        let what = format!("reading the intent of {pod_id} on {node}");
        let Some(response) = self
            .expect(&what, &[StatusCode::NOT_FOUND], |c| c.get(url.clone()))
            .await?
        else {
            return Ok(None);
        };
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let text = response.text().await.with_context(|| what.clone())?;
        let sha = Manifest::parse(&text)
            .map_err(|errors| anyhow::anyhow!("{what}: not a valid manifest: {errors:?}"))?
            .sha();
        let text = Arc::new(text);
        self.lock_manifests().insert(sha.clone(), text.clone());
        Ok(Some((sha, text)))
    }

    fn cached(&self, sha: &str) -> Option<Arc<String>> {
        self.lock_manifests().get(sha).cloned()
    }

    fn lock_manifests(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<String>>> {
        // The map is only ever inserted into whole; a panic elsewhere cannot leave it torn.
        self.manifests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Statuses worth another try: the server or the store may recover.
fn retryable(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::net::TcpListener;

    use super::*;
    use crate::app::App;
    use crate::kv::sqlite::SqliteStore;
    use crate::kv::{Cas, KvStore};

    fn config(server: Url, nodes: usize, unhealthy_fraction: f64) -> SimulatorConfig {
        SimulatorConfig {
            server,
            nodes,
            labels: Labels::from([("role".into(), "web".into())]),
            unhealthy_fraction,
            start_delay: Duration::from_millis(50),
            name_prefix: "web".into(),
            max_in_flight: 4,
            ca_cert: None,
        }
    }

    fn local() -> Url {
        "http://127.0.0.1:1/".parse().unwrap()
    }

    #[test]
    fn names_nodes_by_number() {
        assert_eq!(
            config(local(), 3, 0.0).node_names(),
            ["web-0001", "web-0002", "web-0003"]
        );
    }

    #[test]
    fn spreads_the_unhealthy_share_evenly() {
        let unhealthy = |nodes: usize, fraction: f64| -> Vec<usize> {
            let config = config(local(), nodes, fraction);
            (1..=nodes).filter(|&n| config.is_unhealthy(n)).collect()
        };
        assert_eq!(unhealthy(8, 0.0), Vec::<usize>::new());
        assert_eq!(unhealthy(8, 0.25), [4, 8]);
        assert_eq!(unhealthy(10, 0.5), [2, 4, 6, 8, 10]);
        assert_eq!(unhealthy(3, 1.0), [1, 2, 3]);
        assert_eq!(unhealthy(1000, 0.1).len(), 100);
    }

    #[test]
    fn refuses_bad_configurations() {
        let good = config(local(), 2, 0.5);
        good.validate().unwrap();
        let bad = [
            SimulatorConfig {
                nodes: 0,
                ..good.clone()
            },
            SimulatorConfig {
                unhealthy_fraction: 1.5,
                ..good.clone()
            },
            SimulatorConfig {
                labels: Labels::new(),
                ..good.clone()
            },
            SimulatorConfig {
                labels: Labels::from([("role".into(), "a b".into())]),
                ..good.clone()
            },
            SimulatorConfig {
                name_prefix: "a/b".into(),
                ..good.clone()
            },
            SimulatorConfig {
                max_in_flight: 0,
                ..good.clone()
            },
            SimulatorConfig {
                server: "data:text".parse().unwrap(),
                ..good.clone()
            },
            SimulatorConfig {
                server: "ftp://h:1/".parse().unwrap(),
                ..good.clone()
            },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }

    #[test]
    fn builds_urls_under_the_api_with_encoded_segments() {
        let sim = |server: &str| Sim {
            config: config(server.parse().unwrap(), 1, 0.0),
            client: Client::new(),
            in_flight: Semaphore::new(1),
            health: HashMap::new(),
            manifests: Mutex::new(HashMap::new()),
            shutdown: CancellationToken::new(),
        };
        assert_eq!(
            sim("http://h:1").url(&["reality", "n 1", "a?b"]).as_str(),
            "http://h:1/api/v1/reality/n%201/a%3Fb"
        );
        assert_eq!(
            sim("http://h:1/p2/").url(&["pods"]).as_str(),
            "http://h:1/p2/api/v1/pods"
        );
    }

    fn manifest(version: u32) -> String {
        format!(
            "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_{version}.tar.gz\n"
        )
    }

    /// Polls `check` until it holds, failing after a few seconds.
    async fn eventually<F, Fut>(what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check().await {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn value(store: &Arc<dyn KvStore>, key: &str) -> Option<String> {
        let pair = store.get(key).await.unwrap()?;
        Some(String::from_utf8(pair.value).unwrap())
    }

    async fn status(store: &Arc<dyn KvStore>, pod: &str, node: &str) -> Option<String> {
        let record = value(store, &format!("health/{pod}/{node}")).await?;
        let record: serde_json::Value = serde_json::from_str(&record).unwrap();
        Some(record["Status"].as_str().unwrap().to_owned())
    }

    #[tokio::test]
    async fn follows_intents_with_reality_and_health() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.db").display().to_string();
        let store: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server: Url = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let shutdown = CancellationToken::new();
        let serving = tokio::spawn(crate::server::run(
            listener,
            App::new(store.clone()),
            shutdown.clone().cancelled_owned(),
        ));
        let simulating = tokio::spawn(run(config(server, 2, 0.5), shutdown.clone()));

        eventually("node labels", || async {
            value(&store, "labels/node/web-0002").await.as_deref() == Some(r#"{"role":"web"}"#)
        })
        .await;
        // A node the simulator does not own is left alone.
        for node in ["web-0001", "web-0002", "other"] {
            store
                .put(
                    &format!("intent/{node}/hello"),
                    manifest(1).as_bytes(),
                    Cas::Any,
                )
                .await
                .unwrap();
        }
        eventually("reports on both nodes", || async {
            status(&store, "hello", "web-0001").await.as_deref() == Some("passing")
                && status(&store, "hello", "web-0002").await.as_deref() == Some("critical")
        })
        .await;
        for node in ["web-0001", "web-0002"] {
            assert_eq!(
                value(&store, &format!("reality/{node}/hello")).await,
                Some(manifest(1))
            );
        }
        assert_eq!(value(&store, "reality/other/hello").await, None);
        assert_eq!(status(&store, "hello", "other").await, None);

        store
            .put("intent/web-0001/hello", manifest(2).as_bytes(), Cas::Any)
            .await
            .unwrap();
        store
            .delete("intent/web-0002/hello", Cas::Any)
            .await
            .unwrap();
        eventually(
            "the new manifest reported and the removed pod withdrawn",
            || async {
                value(&store, "reality/web-0001/hello").await == Some(manifest(2))
                    && status(&store, "hello", "web-0001").await.as_deref() == Some("passing")
                    && value(&store, "reality/web-0002/hello").await.is_none()
                    && status(&store, "hello", "web-0002").await.is_none()
            },
        )
        .await;

        shutdown.cancel();
        simulating.await.unwrap().unwrap();
        serving.await.unwrap().unwrap();
    }
}
