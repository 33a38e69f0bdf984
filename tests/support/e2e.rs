//! What the end-to-end tests share: the real binary as a child process, in-process
//! simulators, a small REST client and a polling helper.

use std::collections::VecDeque;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use p2_apiserver::api::pods::Pod;
use p2_apiserver::labels::Labels;
use p2_apiserver::simulator::{self, SimulatorConfig};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::tls::{PairFiles, TestCa};

/// How long a test waits for the farms to converge before failing.
pub const CONVERGE: Duration = Duration::from_secs(30);

/// How long a simulated pod takes to start: long enough that a pod is visibly not yet
/// healthy for a while, short enough to keep the tests quick.
pub const START_DELAY: Duration = Duration::from_millis(300);

/// Log lines kept per server, printed when a test fails.
const LOG_LINES: usize = 400;

/// A pod manifest; `version` changes its SHA.
pub fn manifest(pod_id: &str, version: u32) -> String {
    format!(
        "id: {pod_id}\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/{pod_id}_{version}.tar.gz\n"
    )
}

/// Labels from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A temporary directory holding the database file the servers share.
pub struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// The SQLite file every server of a test uses.
    pub fn db(&self) -> PathBuf {
        self.dir.path().join("p2.db")
    }
}

/// One `p2-apiserver serve` process, killed when dropped (so also when a test fails); its
/// log is printed then.
pub struct Server {
    pub name: String,
    /// `http://ADDR` (`https://` with TLS), ADDR as the server logged it.
    pub url: String,
    /// The CA certificate clients trust, when serving HTTPS.
    ca_cert: Option<PathBuf>,
    child: Child,
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Server {
    /// Starts a server named `name` (its leader-election holder) on a free port over the
    /// SQLite file `db`, with `extra` flags, and waits until it listens.
    pub fn start(name: &str, db: &Path, extra: &[&str]) -> Server {
        Server::start_with_env(name, db, extra, &[])
    }

    /// Starts a server as [`Server::start`] does, with `env` added to its environment.
    pub fn start_with_env(name: &str, db: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let store = format!("sqlite://{}", db.display());
        let mut child = Command::new(env!("CARGO_BIN_EXE_p2-apiserver"))
            .args(["serve", "--listen", "127.0.0.1:0", "--store", &store])
            .args(["--holder", name])
            .args(extra)
            .env("RUST_LOG", "info,tower_http=warn")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start p2-apiserver");
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (addr_tx, addr_rx) = mpsc::channel();
        // Both pipes are read to the end on threads, so the server never blocks on them.
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        for (pipe, addr_tx) in [
            (
                Box::new(stdout) as Box<dyn std::io::Read + Send>,
                Some(addr_tx),
            ),
            (Box::new(stderr), None),
        ] {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if let (Some(tx), Some((_, addr))) =
                        (&addr_tx, line.split_once("listening on "))
                    {
                        let _ = tx.send(addr.trim().to_owned());
                    }
                    let mut log = log.lock().unwrap();
                    if log.len() == LOG_LINES {
                        log.pop_front();
                    }
                    log.push_back(line);
                }
            });
        }
        let mut server = Server {
            name: name.to_owned(),
            url: String::new(),
            ca_cert: None,
            child,
            log,
        };
        // The sender drops when stdout ends, so a server that dies early fails this at once.
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("server {name} never logged `listening on ADDR`"));
        server.url = format!("http://{addr}");
        server
    }

    /// Starts a server as [`Server::start`] does, serving HTTPS with the pair in `files`,
    /// whose CA is `ca`.
    pub fn start_https(
        name: &str,
        db: &Path,
        files: &PairFiles,
        ca: &TestCa,
        extra: &[&str],
    ) -> Server {
        let (cert, key) = (files.cert(), files.key());
        let mut args = vec![
            "--tls-cert",
            cert.to_str().expect("a UTF-8 path"),
            "--tls-key",
            key.to_str().expect("a UTF-8 path"),
        ];
        args.extend_from_slice(extra);
        let mut server = Server::start(name, db, &args);
        server.url = server.url.replacen("http://", "https://", 1);
        server.ca_cert = Some(ca.cert_path());
        server
    }

    /// The server's environment, as its process holds it now.
    pub fn environment(&self) -> Vec<String> {
        let environ = std::fs::read(format!("/proc/{}/environ", self.child.id())).unwrap();
        environ
            .split(|&b| b == 0)
            .map(|var| String::from_utf8_lossy(var).into_owned())
            .collect()
    }

    /// A client for this server's API.
    pub fn api(&self) -> Api {
        Api::trusting(&self.url, self.ca_cert.clone())
    }

    /// Sends the process the signal `name` (such as `HUP`).
    pub fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{name} failed");
    }

    /// Whether a line of the log kept contains `text`.
    pub fn logged(&self, text: &str) -> bool {
        self.log
            .lock()
            .unwrap()
            .iter()
            .any(|line| line.contains(text))
    }

    /// Stops the process with SIGTERM, as an operator would, and waits until it has exited
    /// cleanly.
    pub fn stop(&mut self) {
        self.signal("TERM");
        let status = self.child.wait().expect("wait for p2-apiserver");
        assert!(
            status.success(),
            "server {} exited with {status}",
            self.name
        );
    }

    /// How the process exited, if it does within `limit`; else `None`, and it runs on.
    pub fn exited_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        exited_within(&mut self.child, limit)
    }

    /// Kills the process with SIGKILL, as a crash would, and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How `child` exited, if it does within `limit`; else `None`, and it runs on.
pub fn exited_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for p2-apiserver") {
            return Some(status);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            let log = self.log.lock().unwrap();
            eprintln!(
                "---- last {} log lines of server {} ----",
                log.len(),
                self.name
            );
            for line in log.iter() {
                eprintln!("{line}");
            }
        }
    }
}

/// A simulator running in this process, stopped when dropped.
pub struct Sim {
    pub nodes: Vec<String>,
    shutdown: CancellationToken,
}

impl Sim {
    /// Simulates `count` nodes named `<prefix>-0001`... with `labels` against `api`, and
    /// waits until they are all labelled.
    pub async fn start(api: &Api, prefix: &str, count: usize, labels: Labels) -> Sim {
        let config = SimulatorConfig {
            server: api.base.parse().expect("server URL"),
            nodes: count,
            labels: labels.clone(),
            unhealthy_fraction: 0.0,
            start_delay: START_DELAY,
            name_prefix: prefix.to_owned(),
            max_in_flight: 16,
            ca_cert: api.ca_cert.clone(),
            token: None,
        };
        let nodes = config.node_names();
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        tokio::spawn(async move {
            if let Err(e) = simulator::run(config, token).await {
                panic!("the simulator failed: {e:#}");
            }
        });
        let sim = Sim { nodes, shutdown };
        for node in &sim.nodes {
            let path = format!("/api/v1/labels/node/{node}");
            eventually(&format!("{node} labelled"), CONVERGE, || async {
                let got: Value = api.get(&path).await;
                let now = got["labels"].clone();
                if now == serde_json::to_value(&labels).unwrap() {
                    Ok(())
                } else {
                    Err(format!("labels {now}"))
                }
            })
            .await;
        }
        sim
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A JSON client for one server's API that fails the test on transport errors.
#[derive(Clone)]
pub struct Api {
    client: reqwest::Client,
    pub base: String,
    /// The CA certificate the client trusts besides the public roots, for HTTPS.
    pub ca_cert: Option<PathBuf>,
}

impl Api {
    pub fn new(base: &str) -> Api {
        Api::trusting(base, None)
    }

    /// A client for the server at `base` that also trusts the certificates in `ca_cert`.
    pub fn trusting(base: &str, ca_cert: Option<PathBuf>) -> Api {
        Api {
            client: simulator::client_trusting(ca_cert.as_deref())
                .expect("the CA certificate")
                .timeout(Duration::from_secs(20))
                .build()
                .expect("HTTP client"),
            base: base.to_owned(),
            ca_cert,
        }
    }

    /// `method path` with an optional JSON body; the status and the body as JSON (`null`
    /// when there is none).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .client
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(body) = body {
            let content_type = if method == Method::PATCH {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            request = request
                .header("content-type", content_type)
                .body(body.to_string());
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status();
        let bytes = response.bytes().await.expect("response body");
        let json = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!("{method} {path}: {e}: {}", String::from_utf8_lossy(&bytes))
            })
        };
        (status, json)
    }

    /// `GET path`, which must answer 200, decoded as `T`.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> T {
        let (status, body) = self.send(Method::GET, path, None).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
        serde_json::from_value(body).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// The status of `GET path`.
    pub async fn status(&self, path: &str) -> StatusCode {
        self.send(Method::GET, path, None).await.0
    }

    /// `method path` with `body`, which must answer `expected`; the answer's body.
    pub async fn expect(
        &self,
        method: Method,
        path: &str,
        body: &Value,
        expected: StatusCode,
    ) -> Value {
        let (status, answer) = self.send(method.clone(), path, Some(body)).await;
        assert_eq!(status, expected, "{method} {path} {body}: {answer}");
        answer
    }

    /// Replaces a node's labels.
    pub async fn label_node(&self, node: &str, labels: Labels) {
        let body = serde_json::json!({ "labels": labels });
        self.expect(
            Method::PUT,
            &format!("/api/v1/labels/node/{node}"),
            &body,
            StatusCode::OK,
        )
        .await;
    }

    /// Every pod with `pod_id`, across pages.
    pub async fn pods(&self, pod_id: &str) -> Vec<Pod> {
        let mut pods = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut url = url::Url::parse(&format!("{}/api/v1/pods", self.base)).expect("URL");
            url.query_pairs_mut()
                .append_pair("pod_id", pod_id)
                .append_pair("limit", "1000");
            if let Some(token) = &token {
                url.query_pairs_mut().append_pair("continue", token);
            }
            let path = &url.as_str()[self.base.len()..];
            let page: Value = self.get(path).await;
            pods.extend(
                serde_json::from_value::<Vec<Pod>>(page["items"].clone()).expect("pod items"),
            );
            match page["continue"].as_str() {
                Some(next) => token = Some(next.to_owned()),
                None => return pods,
            }
        }
    }
}

/// Polls `probe` every 100 ms until it answers `Ok`, failing the test after `timeout` with
/// the last state the probe described.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(state) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last seen: {state}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
