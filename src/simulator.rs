//! The node simulator: stands in for P2's preparers on N nodes, through the REST API only.
//!
//! Each simulated node is named `<prefix>-0001`, `<prefix>-0002`, ... and is given its node
//! labels once, at start (a PUT that replaces them; later relabelling through the API is left
//! alone). One change stream of pods (`GET /api/v1/watch?kinds=pods`) then follows what is
//! intended on every simulated node: a snapshot once, then one event per change, so the load
//! on the server grows with the changes, not with the number of nodes or pods. For each
//! (node, pod) whose intended manifest changes, the simulator does what a preparer does:
//!
//! - a new pod: after `start_delay`, report the manifest installed
//!   (`PUT /api/v1/reality/<node>/<pod_id>`) and then its health;
//! - a changed manifest: withdraw the pod's health at once (it is restarting), then as for a
//!   new pod;
//! - a pod no longer intended: withdraw its health and its reality at once (stopping is quick,
//!   starting is not).
//!
//! A node's pods are all `passing`, or all `critical` on the nodes chosen by
//! `unhealthy_fraction`. The manifest text comes with each event; it is kept once per text,
//! and shared by every node running it. A pod is installed again when its intended text
//! changes; the server, not the simulator, refuses a text that is not a valid manifest.
//!
//! The stream's changes are handed to the reconciler in batches, at most every 100 ms,
//! and the reconciler looks only at the pods a batch names, so one change costs the same
//! at 100 pods as at 100,000. A stream that breaks (the server restarted, or cut off the
//! simulator for reading too slowly) is resumed from the last event's position
//! (`Last-Event-ID`); when the server cannot resume from there it sends a fresh snapshot,
//! which replaces what was intended.
//!
//! Requests that fail for a reason that may pass (no connection, 5xx, 429) are retried with
//! backoff, so the simulator may start before the server. Nothing is cleaned up on shutdown:
//! a node that stops leaves its reports behind, as a crashed preparer's session-less
//! records would.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use eventsource_stream::{Event, Eventsource};
use futures::StreamExt;
use reqwest::{Certificate, Client, ClientBuilder, RequestBuilder, Response, StatusCode, Url};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::labels::{validate_labels, Labels};
use crate::model::HealthState;
use crate::store::pods::validate_node_name;

/// The least time between two batches of intent changes handed to the reconciler: a burst
/// of changes (the simulator's own reports among them) costs it one pass, not one each.
const PUBLISH_INTERVAL: Duration = Duration::from_millis(100);
/// How long the change stream may stay silent before the connection counts as lost: the
/// server sends a comment line every 15 s on an idle stream.
const STREAM_SILENCE: Duration = Duration::from_secs(45);
/// Limit of any request but the change stream.
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
    /// The most requests in flight at once, the change stream aside, and the most pods
    /// being reported at once.
    pub max_in_flight: usize,
    /// PEM certificates to trust for an https:// server, besides the usual public roots.
    pub ca_cert: Option<PathBuf>,
    /// The bearer token sent with every request, for a server run with `--auth-tokens`;
    /// its role must both write node labels and report pods (`admin`).
    pub token: Option<String>,
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
/// server refuses the node labels or the change stream as wrong (a 4xx), which retrying
/// cannot fix; a pod whose reports are refused is logged and skipped.
pub async fn run(config: SimulatorConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate()?;
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = &config.token {
        let mut value = reqwest::header::HeaderValue::try_from(format!("Bearer {token}"))
            .context("the token cannot be sent in a header")?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    let client = client_trusting(config.ca_cert.as_deref())?
        .default_headers(headers)
        .connect_timeout(Duration::from_secs(5))
        .read_timeout(STREAM_SILENCE)
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
        reporting: Semaphore::new(config.max_in_flight),
        health,
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
    let (intents_tx, intents_rx) = mpsc::unbounded_channel();
    let follower = tokio::spawn(sim.clone().follow_pods(intents_tx));
    let reconciled = sim.clone().reconcile(intents_rx).await;
    shutdown.cancel();
    let followed = follower.await.context("following the pods panicked")?;
    reconciled.and(followed)
}

/// A node and a pod ID.
type PodKey = (String, String);

/// A manifest text intended on simulated nodes, reported as the pod's reality once it is
/// installed; one per text, shared by every pod running it.
type Intended = Arc<str>;

/// What the change stream says is intended on the simulated nodes, in batches for the
/// reconciler.
#[derive(Debug)]
enum Intents {
    /// Everything intended now: a pod not in it is no longer intended.
    Snapshot(HashMap<PodKey, Intended>),
    /// What changed since the last batch: the manifest now intended, or `None`.
    Changes(HashMap<PodKey, Option<Intended>>),
}

/// A finished job: its pod and the manifest reported installed there now.
type JobResult = (PodKey, anyhow::Result<Option<Intended>>);

/// One (node, pod) as the reconciler tracks it.
#[derive(Debug, Default)]
struct Slot {
    /// The intended manifest; `None` once the pod is no longer intended.
    want: Option<Intended>,
    /// The manifest last reported installed; `None` when nothing is reported.
    have: Option<Intended>,
    /// A job is converging this pod; at most one is, so reports never race.
    busy: bool,
}

impl Slot {
    /// Whether what is reported differs from what is intended.
    fn diverges(&self) -> bool {
        self.want != self.have
    }
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
    /// Pods being reported, at most `max_in_flight`: a pod's permit is held from its install
    /// to its health report, so that pods come up one after another rather than all
    /// installed before any is healthy (requests are served in the order they queue).
    reporting: Semaphore,
    /// The status each simulated node reports for its pods.
    health: HashMap<String, HealthState>,
    shutdown: CancellationToken,
}

/// The data of a change event of the stream, as the simulator reads it (the server writes a
/// [`crate::api::watch::WatchEvent`]), borrowed from the event's text, so that a manifest
/// already known costs no copy.
#[derive(Deserialize)]
struct PodChange<'a> {
    /// `<node>/<pod_id>`.
    #[serde(borrow)]
    id: Cow<'a, str>,
    /// The manifest text as a JSON string; a JSON value when the text was JSON, which reads
    /// as the same manifest.
    #[serde(borrow)]
    object: &'a RawValue,
}

/// Where the simulator is in the change stream, and what it has read but not yet handed to
/// the reconciler.
struct Follower {
    intents: mpsc::UnboundedSender<Intents>,
    /// Where to resume: the SSE id of the last event read since a snapshot was complete;
    /// `None` before, as a snapshot cut short must start over.
    position: Option<String>,
    /// The snapshot being read, until its `synced` event.
    snapshot: Option<HashMap<PodKey, Intended>>,
    /// Changes read since the last batch.
    changes: HashMap<PodKey, Option<Intended>>,
    /// When the last batch was handed over.
    published: Instant,
    /// The manifests intended, by their JSON in the stream, so that the pods of one manifest
    /// share it and its JSON is decoded once, not once per pod; at each snapshot, those no
    /// longer in use are forgotten.
    manifests: HashMap<Box<str>, Intended>,
}

impl Follower {
    fn new(intents: mpsc::UnboundedSender<Intents>) -> Follower {
        Follower {
            intents,
            position: None,
            snapshot: None,
            changes: HashMap::new(),
            published: Instant::now(),
            manifests: HashMap::new(),
        }
    }

    /// A stream was opened: it starts with a snapshot unless it resumes.
    fn opened(&mut self) {
        if self.position.is_none() {
            self.snapshot = Some(HashMap::new());
        }
    }

    /// Takes in one event; only pods on `nodes` are kept.
    fn read(&mut self, event: &Event, nodes: &HashMap<String, HealthState>) -> anyhow::Result<()> {
        match event.event.as_str() {
            kind @ ("added" | "modified" | "deleted") => {
                let change: PodChange<'_> = serde_json::from_str(&event.data)
                    .with_context(|| format!("decoding a change event: {}", event.data))?;
                let Some((node, pod_id)) = change.id.split_once('/') else {
                    bail!("a pod's change event has the id {:?}", change.id);
                };
                if nodes.contains_key(node) {
                    let key = (node.to_owned(), pod_id.to_owned());
                    let intended = match kind {
                        "deleted" => None,
                        _ => Some(self.intern(change.object)?),
                    };
                    match (&mut self.snapshot, intended) {
                        (Some(snapshot), Some(intended)) => {
                            snapshot.insert(key, intended);
                        }
                        (Some(snapshot), None) => {
                            snapshot.remove(&key);
                        }
                        (None, intended) => {
                            self.changes.insert(key, intended);
                        }
                    }
                }
                if self.snapshot.is_none() {
                    self.position = Some(event.id.clone());
                }
            }
            "synced" => {
                if let Some(snapshot) = self.snapshot.take() {
                    self.manifests
                        .retain(|_, intended| Arc::strong_count(intended) > 1);
                    self.send(Intents::Snapshot(snapshot));
                }
                self.position = Some(event.id.clone());
            }
            "resync" => {
                // Positions are void: a fresh snapshot follows and replaces everything.
                self.position = None;
                self.snapshot = Some(HashMap::new());
                self.changes.clear();
            }
            "dropped" => tracing::info!("cut off by the server for reading too slowly; resuming"),
            _ => {}
        }
        Ok(())
    }

    /// The manifest text an event brings, shared with every pod of the same text.
    fn intern(&mut self, object: &RawValue) -> anyhow::Result<Intended> {
        let json = object.get();
        if let Some(intended) = self.manifests.get(json) {
            return Ok(intended.clone());
        }
        let text: Intended = serde_json::from_str::<String>(json)
            .context("decoding a manifest's text")?
            .into();
        self.manifests.insert(json.into(), text.clone());
        Ok(text)
    }

    /// When the changes read are due to the reconciler; `None` when there are none.
    fn due(&self) -> Option<Instant> {
        (!self.changes.is_empty()).then(|| self.published + PUBLISH_INTERVAL)
    }

    /// Hands the changes read to the reconciler.
    fn publish(&mut self) {
        if !self.changes.is_empty() {
            let changes = std::mem::take(&mut self.changes);
            self.send(Intents::Changes(changes));
        }
    }

    fn send(&mut self, intents: Intents) {
        // Fails only once the reconciler has stopped, and the simulator with it.
        let _ = self.intents.send(intents);
        self.published = Instant::now();
    }
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
            if !self.pause(&mut backoff).await {
                return Outcome::Stopped;
            }
        }
    }

    /// Waits the backoff's next delay; `false` if shutdown came first.
    async fn pause(&self, backoff: &mut Backoff) -> bool {
        tokio::select! {
            () = self.shutdown.cancelled() => false,
            () = tokio::time::sleep(backoff.next_delay()) => true,
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

    /// Follows the change stream of pods until shutdown, handing what is intended on the
    /// simulated nodes to the reconciler; a stream that ends is resumed, after a pause that
    /// grows while streams end before bringing any event.
    async fn follow_pods(
        self: Arc<Self>,
        intents: mpsc::UnboundedSender<Intents>,
    ) -> anyhow::Result<()> {
        let mut follower = Follower::new(intents);
        let mut backoff = Backoff::new(RETRY_BASE, RETRY_CAP);
        loop {
            let Some(response) = self.open_stream(follower.position.as_deref()).await? else {
                return Ok(());
            };
            follower.opened();
            let Some(read) = self.read_stream(response, &mut follower).await? else {
                return Ok(());
            };
            if read > 0 {
                backoff.reset();
            }
            if !self.pause(&mut backoff).await {
                return Ok(());
            }
        }
    }

    /// Opens the change stream of pods, resuming from `position` when given, retrying until
    /// the server answers; outside the in-flight limit, so the stream never keeps reports
    /// waiting. `None` on shutdown.
    async fn open_stream(&self, position: Option<&str>) -> anyhow::Result<Option<Response>> {
        let mut url = self.url(&["watch"]);
        url.query_pairs_mut().append_pair("kinds", "pods");
        let mut backoff = Backoff::new(RETRY_BASE, RETRY_CAP);
        loop {
            let mut request = self.client.get(url.clone());
            if let Some(position) = position {
                request = request.header("last-event-id", position);
            }
            let result = tokio::select! {
                () = self.shutdown.cancelled() => return Ok(None),
                result = request.send() => result,
            };
            match result {
                Ok(response) if response.status().is_success() => return Ok(Some(response)),
                Ok(response) if !retryable(response.status()) => {
                    let status = response.status();
                    let body = response.text().await.unwrap_or_default();
                    bail!("opening the change stream: the server answered {status}: {body}");
                }
                Ok(response) => tracing::warn!(
                    status = %response.status(),
                    "opening the change stream failed; retrying"
                ),
                Err(e) => tracing::warn!(error = %e, "opening the change stream failed; retrying"),
            }
            if !self.pause(&mut backoff).await {
                return Ok(None);
            }
        }
    }

    /// Reads one stream until it ends, handing changes over at most every
    /// [`PUBLISH_INTERVAL`] and at its end; how many events it brought, `None` on shutdown.
    async fn read_stream(
        &self,
        response: Response,
        follower: &mut Follower,
    ) -> anyhow::Result<Option<usize>> {
        let mut events = response.bytes_stream().eventsource();
        let mut read = 0;
        loop {
            let due = follower.due();
            let next = tokio::select! {
                () = self.shutdown.cancelled() => return Ok(None),
                () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    follower.publish();
                    continue;
                }
                next = events.next() => next,
            };
            match next {
                Some(Ok(event)) => {
                    read += 1;
                    follower.read(&event, &self.health)?;
                    if follower.due().is_some_and(|due| due <= Instant::now()) {
                        follower.publish();
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "the change stream broke; resuming");
                    break;
                }
                None => break,
            }
        }
        follower.publish();
        Ok(Some(read))
    }

    /// Keeps one job per (node, pod) whose report differs from its intent until shutdown.
    /// Each turn looks only at the pods whose intent changed or whose job ended, so a change
    /// costs the same however many pods there are.
    async fn reconcile(
        self: Arc<Self>,
        mut intents: mpsc::UnboundedReceiver<Intents>,
    ) -> anyhow::Result<()> {
        let mut slots: HashMap<PodKey, Slot> = HashMap::new();
        let mut jobs: JoinSet<JobResult> = JoinSet::new();
        let mut touched: Vec<PodKey> = Vec::new();
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return Ok(()),
                received = intents.recv() => match received {
                    None => return Ok(()),
                    Some(Intents::Snapshot(mut wanted)) => {
                        for (key, slot) in &mut slots {
                            slot.want = wanted.remove(key);
                            touched.push(key.clone());
                        }
                        for (key, want) in wanted {
                            touched.push(key.clone());
                            slots.entry(key).or_default().want = Some(want);
                        }
                    }
                    Some(Intents::Changes(changes)) => {
                        for (key, want) in changes {
                            touched.push(key.clone());
                            slots.entry(key).or_default().want = want;
                        }
                    }
                },
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
                    touched.push(key);
                }
            }
            for key in touched.drain(..) {
                let Some(slot) = slots.get_mut(&key) else {
                    continue;
                };
                if slot.busy {
                    continue;
                }
                if slot.want.is_none() && slot.have.is_none() {
                    slots.remove(&key);
                    continue;
                }
                if !slot.diverges() {
                    continue;
                }
                slot.busy = true;
                let (sim, want, had) = (self.clone(), slot.want.clone(), slot.have.clone());
                jobs.spawn(async move {
                    let result = sim.converge(&key.0, &key.1, want, had).await;
                    (key, result)
                });
            }
        }
    }

    /// Brings one pod's reports to `want` from `had`; returns the manifest reported
    /// afterwards.
    async fn converge(
        &self,
        node: &str,
        pod_id: &str,
        want: Option<Intended>,
        had: Option<Intended>,
    ) -> anyhow::Result<Option<Intended>> {
        let Some(want) = want else {
            let _reporting = self.reporting.acquire().await;
            self.withdraw_health(node, pod_id).await?;
            let url = self.url(&["reality", node, pod_id]);
            let what = format!("withdrawing {pod_id} on {node}");
            self.expect(&what, &[], |c| c.delete(url.clone())).await?;
            return Ok(None);
        };
        if had.is_some() {
            let _reporting = self.reporting.acquire().await;
            self.withdraw_health(node, pod_id).await?;
        }
        tokio::select! {
            () = self.shutdown.cancelled() => return Ok(had),
            () = tokio::time::sleep(self.config.start_delay) => {}
        }
        let _reporting = self.reporting.acquire().await;
        let url = self.url(&["reality", node, pod_id]);
        let what = format!("reporting {pod_id} installed on {node}");
        let put = |c: &Client| {
            c.put(url.clone())
                .header(reqwest::header::CONTENT_TYPE, crate::api::reality::YAML)
                .body(want.to_string())
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
        Ok(Some(want))
    }

    async fn withdraw_health(&self, node: &str, pod_id: &str) -> anyhow::Result<()> {
        let url = self.url(&["health", pod_id, node]);
        let what = format!("withdrawing {pod_id}'s health on {node}");
        self.expect(&what, &[], |c| c.delete(url.clone())).await?;
        Ok(())
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

    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::app::{App, HttpLimits};
    use crate::kv::sqlite::SqliteStore;
    use crate::kv::{Cas, KvStore, TxnOp};
    use crate::model::Limits;
    use crate::state::{Mirror, MirrorConfig};

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
            token: None,
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
            reporting: Semaphore::new(1),
            health: HashMap::new(),
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

    fn manifest(pod: &str, version: u32) -> String {
        format!(
            "id: {pod}\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/{pod}_{version}.tar.gz\n"
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
        Some(String::from_utf8(pair.value.to_vec()).unwrap())
    }

    async fn status(store: &Arc<dyn KvStore>, pod: &str, node: &str) -> Option<String> {
        let record = value(store, &format!("health/{pod}/{node}")).await?;
        let record: serde_json::Value = serde_json::from_str(&record).unwrap();
        Some(record["Status"].as_str().unwrap().to_owned())
    }

    /// A server over `store` on `listener` until `stop`, with its mirror started with
    /// `mirror`, as `serve` runs it.
    fn serve(
        store: &Arc<dyn KvStore>,
        listener: TcpListener,
        mirror: MirrorConfig,
        stop: &CancellationToken,
    ) -> tokio::task::JoinHandle<std::io::Result<()>> {
        serve_with(store, listener, mirror, stop, Arc::default())
    }

    /// The same, letting through only what `access` allows.
    fn serve_with(
        store: &Arc<dyn KvStore>,
        listener: TcpListener,
        mirror: MirrorConfig,
        stop: &CancellationToken,
        access: Arc<crate::auth::Access>,
    ) -> tokio::task::JoinHandle<std::io::Result<()>> {
        let mirror = Mirror::new(store.clone(), mirror);
        mirror.start(&TaskTracker::new(), stop.clone());
        let app = App::serving(
            store.clone(),
            mirror,
            stop.clone(),
            HttpLimits::default(),
            Limits::default(),
            access,
        );
        tokio::spawn(crate::server::run(
            listener,
            app,
            stop.clone().cancelled_owned(),
        ))
    }

    async fn sqlite(dir: &tempfile::TempDir) -> Arc<dyn KvStore> {
        let path = dir.path().join("sim.db").display().to_string();
        Arc::new(SqliteStore::open(&path).await.unwrap())
    }

    async fn intend(store: &Arc<dyn KvStore>, node: &str, pod: &str, version: u32) {
        let key = format!("intent/{node}/{pod}");
        let manifest = manifest(pod, version);
        store
            .put(&key, manifest.as_bytes(), Cas::Any)
            .await
            .unwrap();
    }

    /// Whether `pod` on `node` is reported installed at `version` and `status`, or, for
    /// `None`, has no report at all.
    async fn reported(
        store: &Arc<dyn KvStore>,
        node: &str,
        pod: &str,
        version_and_status: Option<(u32, &str)>,
    ) -> bool {
        let reality = value(store, &format!("reality/{node}/{pod}")).await;
        let status = status(store, pod, node).await;
        match version_and_status {
            Some((version, expected)) => {
                reality == Some(manifest(pod, version)) && status.as_deref() == Some(expected)
            }
            None => reality.is_none() && status.is_none(),
        }
    }

    #[tokio::test]
    async fn sends_its_token_to_a_server_that_needs_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = sqlite(&dir).await;
        let tokens = dir.path().join("tokens.yaml");
        // The hex SHA-256 of "test".
        std::fs::write(
            &tokens,
            "tokens:\n  - name: sim\n    role: admin\n    sha256: \
             9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n",
        )
        .unwrap();
        let access = Arc::new(crate::auth::Access::new(Some(&tokens), Vec::new()).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server: Url = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let shutdown = CancellationToken::new();
        let serving = serve_with(&store, listener, MirrorConfig::default(), &shutdown, access);

        let refused = run(config(server.clone(), 1, 0.0), shutdown.clone()).await;
        assert!(
            format!("{:#}", refused.unwrap_err()).contains("401"),
            "without a token the server refuses the labels"
        );
        let with_token = SimulatorConfig {
            token: Some("test".into()),
            ..config(server, 1, 0.0)
        };
        let simulating = tokio::spawn(run(with_token, shutdown.clone()));
        intend(&store, "web-0001", "hello", 1).await;
        eventually("the pod reported with the token", || {
            reported(&store, "web-0001", "hello", Some((1, "passing")))
        })
        .await;
        shutdown.cancel();
        simulating.await.unwrap().unwrap();
        serving.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn follows_intents_with_reality_and_health() {
        let dir = tempfile::tempdir().unwrap();
        let store = sqlite(&dir).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server: Url = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let shutdown = CancellationToken::new();
        let serving = serve(&store, listener, MirrorConfig::default(), &shutdown);
        // Intended before the simulator starts: in the stream's snapshot.
        intend(&store, "web-0001", "hello", 1).await;
        let simulating = tokio::spawn(run(config(server, 2, 0.5), shutdown.clone()));

        eventually("node labels", || async {
            value(&store, "labels/node/web-0002").await.as_deref() == Some(r#"{"role":"web"}"#)
        })
        .await;
        // Intended later: changes after the snapshot. A node the simulator does not own is
        // left alone.
        for node in ["web-0002", "other"] {
            intend(&store, node, "hello", 1).await;
        }
        eventually("reports on both nodes", || async {
            reported(&store, "web-0001", "hello", Some((1, "passing"))).await
                && reported(&store, "web-0002", "hello", Some((1, "critical"))).await
        })
        .await;
        assert!(reported(&store, "other", "hello", None).await);

        // A text that is not a manifest: the server refuses its report, and the simulator
        // goes on with the others.
        store
            .put("intent/web-0002/broken", b"id: [", Cas::Any)
            .await
            .unwrap();
        intend(&store, "web-0001", "hello", 2).await;
        store
            .delete("intent/web-0002/hello", Cas::Any)
            .await
            .unwrap();
        eventually(
            "the new manifest reported and the removed pod withdrawn",
            || async {
                reported(&store, "web-0001", "hello", Some((2, "passing"))).await
                    && reported(&store, "web-0002", "hello", None).await
            },
        )
        .await;
        assert!(reported(&store, "web-0002", "broken", None).await);

        shutdown.cancel();
        simulating.await.unwrap().unwrap();
        serving.await.unwrap().unwrap();
    }

    /// Puts (or with `None` deletes) the intent of `pods` on `node` in one transaction, so
    /// the server streams them in one burst.
    async fn burst(store: &Arc<dyn KvStore>, node: &str, pods: &[String], version: Option<u32>) {
        let ops: Vec<TxnOp> = pods
            .iter()
            .map(|pod| {
                let key = format!("intent/{node}/{pod}");
                match version {
                    Some(version) => TxnOp::Set {
                        key,
                        value: manifest(pod, version).into_bytes(),
                    },
                    None => TxnOp::Delete { key },
                }
            })
            .collect();
        store.txn(&ops).await.unwrap();
    }

    async fn all_reported(
        store: &Arc<dyn KvStore>,
        pods: &[String],
        version_and_status: Option<(u32, &str)>,
    ) -> bool {
        for pod in pods {
            if !reported(store, "web-0001", pod, version_and_status).await {
                return false;
            }
        }
        true
    }

    #[tokio::test]
    async fn reports_each_pod_healthy_before_installing_more_than_its_share() {
        let dir = tempfile::tempdir().unwrap();
        let store = sqlite(&dir).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let shutdown = CancellationToken::new();
        let serving = serve(&store, listener, MirrorConfig::default(), &shutdown);
        let config = config(server, 1, 0.0);
        let most = config.max_in_flight;
        let simulating = tokio::spawn(run(config, shutdown.clone()));
        eventually("node labels", || async {
            value(&store, "labels/node/web-0001").await.is_some()
        })
        .await;
        let many: Vec<String> = (0..40).map(|i| format!("pod{i}")).collect();
        burst(&store, "web-0001", &many, Some(1)).await;
        eventually("a burst of new pods", || {
            all_reported(&store, &many, Some((1, "passing")))
        })
        .await;

        // In the order the reports were written, never more pods installed and not yet
        // healthy than may be in flight.
        let mut reports: Vec<(u64, bool)> = Vec::new();
        for (prefix, healthy) in [("reality/", false), ("health/", true)] {
            let listing = store.list(prefix).await.unwrap();
            reports.extend(listing.pairs.iter().map(|p| (p.create_index, healthy)));
        }
        reports.sort_unstable();
        let mut waiting: usize = 0;
        let mut most_waiting = 0;
        for (_, healthy) in reports {
            if healthy {
                waiting -= 1;
            } else {
                waiting += 1;
            }
            most_waiting = most_waiting.max(waiting);
        }
        assert!(
            most_waiting <= most,
            "{most_waiting} pods were installed and not yet healthy at once"
        );

        shutdown.cancel();
        simulating.await.unwrap().unwrap();
        serving.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn resumes_after_a_restart_and_after_being_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let store = sqlite(&dir).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let first = CancellationToken::new();
        let serving = serve(&store, listener, MirrorConfig::default(), &first);
        let shutdown = CancellationToken::new();
        let server = format!("http://{addr}").parse().unwrap();
        let simulating = tokio::spawn(run(config(server, 1, 0.0), shutdown.clone()));
        for pod in ["hello", "gone"] {
            intend(&store, "web-0001", pod, 1).await;
        }
        eventually("both pods reported", || async {
            reported(&store, "web-0001", "hello", Some((1, "passing"))).await
                && reported(&store, "web-0001", "gone", Some((1, "passing"))).await
        })
        .await;

        // The server stops, intents change meanwhile, and a new server comes up at the same
        // address: the simulator resumes from the position it had. This server cuts off a
        // client one change behind, so a burst of changes makes the simulator resume again.
        first.cancel();
        serving.await.unwrap().unwrap();
        intend(&store, "web-0001", "hello", 2).await;
        intend(&store, "web-0001", "new", 1).await;
        let cutting = MirrorConfig {
            subscriber_buffer: 1,
            ..MirrorConfig::default()
        };
        let second = CancellationToken::new();
        let listener = TcpListener::bind(addr).await.unwrap();
        let serving = serve(&store, listener, cutting.clone(), &second);
        eventually("the changes made while the server was down", || async {
            reported(&store, "web-0001", "hello", Some((2, "passing"))).await
                && reported(&store, "web-0001", "new", Some((1, "passing"))).await
        })
        .await;
        store
            .delete("intent/web-0001/gone", Cas::Any)
            .await
            .unwrap();
        eventually("a change after resuming", || {
            reported(&store, "web-0001", "gone", None)
        })
        .await;
        let many: Vec<String> = (0..20).map(|i| format!("pod{i}")).collect();
        burst(&store, "web-0001", &many, Some(1)).await;
        eventually("a burst of new pods", || {
            all_reported(&store, &many, Some((1, "passing")))
        })
        .await;

        // This one also keeps too few changes to resume from: a burst makes the simulator
        // start again from a snapshot, which tells what is no longer intended.
        second.cancel();
        serving.await.unwrap().unwrap();
        let forgetful = MirrorConfig {
            retained_changes: 4,
            ..cutting
        };
        let third = CancellationToken::new();
        let serving = serve(
            &store,
            TcpListener::bind(addr).await.unwrap(),
            forgetful,
            &third,
        );
        burst(&store, "web-0001", &many, None).await;
        eventually("a burst of removed pods", || {
            all_reported(&store, &many, None)
        })
        .await;
        assert!(reported(&store, "web-0001", "hello", Some((2, "passing"))).await);

        shutdown.cancel();
        simulating.await.unwrap().unwrap();
        third.cancel();
        serving.await.unwrap().unwrap();
    }
}
