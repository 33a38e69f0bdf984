//! End to end: the real binary on 127.0.0.1:0 over an SQLite file, simulated nodes in this
//! process, and everything driven and observed through the REST API.
//!
//! The daemon-set tests need the DS farm.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::e2e::{
    eventually, exited_within, labels, manifest, Api, Scratch, Server, Sim, CONVERGE,
};
use p2_apiserver::api::pods::Pod;
use p2_apiserver::api::rcs::RcView;
use p2_apiserver::model::HealthState;
use p2_apiserver::model::Manifest;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const POD: &str = "hello";
const RC_ID_LABEL: &str = "replication_controller_id";
const DS_ID_LABEL: &str = "daemon_set_id";

fn sha(pod_id: &str, version: u32) -> String {
    Manifest::parse(&manifest(pod_id, version)).unwrap().sha()
}

fn nodes_of(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter().map(|p| p.node.clone()).collect()
}

fn describe(pods: &[Pod]) -> String {
    let items: Vec<String> = pods
        .iter()
        .map(|p| format!("{} {:?} {:.8}", p.node, p.health, p.manifest_sha))
        .collect();
    format!("[{}]", items.join(", "))
}

/// Creates an RC of manifest version `version` and returns its id.
pub(crate) async fn create_rc(
    api: &Api,
    version: u32,
    selector: &str,
    replicas: i64,
    strategy: &str,
) -> String {
    let body = json!({
        "manifest": manifest(POD, version),
        "node_selector": selector,
        "replicas_desired": replicas,
        "allocation_strategy": strategy,
    });
    let rc = api
        .expect(Method::POST, "/api/v1/rcs", &body, StatusCode::CREATED)
        .await;
    rc["id"].as_str().unwrap().to_owned()
}

async fn set_replicas(api: &Api, rc: &str, replicas: i64) {
    api.expect(
        Method::PATCH,
        &format!("/api/v1/rcs/{rc}"),
        &json!({ "replicas_desired": replicas }),
        StatusCode::OK,
    )
    .await;
}

/// The pods labelled with `label=value`.
async fn owned_pods(api: &Api, pod_id: &str, label: &str, value: &str) -> Vec<Pod> {
    let mut pods = api.pods(pod_id).await;
    pods.retain(|p| p.labels.get(label).map(String::as_str) == Some(value));
    pods
}

/// Waits until `rc` has exactly `count` pods, all passing on manifest `version`, and no pod
/// of [`POD`] is outside it; returns them.
pub(crate) async fn rc_settles(api: &Api, rc: &str, count: usize, version: u32) -> Vec<Pod> {
    let want_sha = sha(POD, version);
    eventually(
        &format!("RC {rc} at {count} healthy pods"),
        CONVERGE,
        || async {
            let all = api.pods(POD).await;
            let ok = all.len() == count
                && all.iter().all(|p| {
                    p.labels.get(RC_ID_LABEL).map(String::as_str) == Some(rc)
                        && p.health == HealthState::Passing
                        && p.manifest_sha == want_sha
                });
            if ok {
                Ok(all)
            } else {
                Err(describe(&all))
            }
        },
    )
    .await
}

/// Waits until daemon set `ds` runs healthy pods of `pod_id` on exactly `nodes`.
async fn ds_settles(api: &Api, ds: &str, pod_id: &str, nodes: &[&str]) {
    let want: BTreeSet<String> = nodes.iter().map(|n| n.to_string()).collect();
    eventually(
        &format!("daemon set {ds} on {want:?}"),
        CONVERGE,
        || async {
            let pods = owned_pods(api, pod_id, DS_ID_LABEL, ds).await;
            if nodes_of(&pods) == want && pods.iter().all(|p| p.health == HealthState::Passing) {
                Ok(())
            } else {
                Err(describe(&pods))
            }
        },
    )
    .await;
}

async fn create_ds(api: &Api, pod_id: &str, selector: &str) -> String {
    let body = json!({
        "manifest": manifest(pod_id, 1),
        "node_selector": selector,
        "timeout": "1m",
    });
    let ds = api
        .expect(
            Method::POST,
            "/api/v1/daemonsets",
            &body,
            StatusCode::CREATED,
        )
        .await;
    ds["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rc_reaches_its_replica_count() {
    let scratch = Scratch::new();
    let server = Server::start("solo", &scratch.db(), &[]);
    let api = server.api();
    let _web = Sim::start(&api, "web", 5, labels(&[("role", "web")])).await;

    let rc = create_rc(&api, 1, "role=web", 3, "static_strategy").await;
    let pods = rc_settles(&api, &rc, 3, 1).await;
    assert_eq!(nodes_of(&pods).len(), 3);

    // And it stays there.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(api.pods(POD).await.len(), 3);
    }
    let view: RcView = api.get(&format!("/api/v1/rcs/{rc}")).await;
    assert_eq!(view.status.current_replicas, 3);
    assert_eq!(
        view.status.nodes,
        nodes_of(&pods).into_iter().collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_down_removes_pods_from_ineligible_nodes_first() {
    let scratch = Scratch::new();
    let server = Server::start("solo", &scratch.db(), &[]);
    let api = server.api();
    let _web = Sim::start(&api, "web", 5, labels(&[("role", "web")])).await;

    let rc = create_rc(&api, 1, "role=web", 3, "static_strategy").await;
    let before = nodes_of(&rc_settles(&api, &rc, 3, 1).await);
    // The middle node by name, so neither name order nor its reverse picks it by chance.
    let leaving = before.iter().nth(1).unwrap().clone();
    api.label_node(&leaving, labels(&[("role", "db")])).await;
    // A static RC leaves a pod on a node that stops matching...
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(nodes_of(&api.pods(POD).await), before);

    // ...until it has one too many: then that pod goes first.
    set_replicas(&api, &rc, 2).await;
    let after = nodes_of(&rc_settles(&api, &rc, 2, 1).await);
    let mut expected = before.clone();
    expected.remove(&leaving);
    assert_eq!(after, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relabelling_a_node_moves_a_dynamic_rcs_pod() {
    let scratch = Scratch::new();
    let server = Server::start("solo", &scratch.db(), &[]);
    let api = server.api();
    let _web = Sim::start(&api, "web", 4, labels(&[("role", "web")])).await;

    let rc = create_rc(&api, 1, "role=web", 2, "dynamic_strategy").await;
    let before = nodes_of(&rc_settles(&api, &rc, 2, 1).await);
    let leaving = before.iter().next().unwrap().clone();
    api.label_node(&leaving, labels(&[("role", "db")])).await;

    let after = eventually("the pod to move", CONVERGE, || async {
        let pods = api.pods(POD).await;
        let nodes = nodes_of(&pods);
        let moved = pods.len() == 2
            && !nodes.contains(&leaving)
            && pods.iter().all(|p| p.health == HealthState::Passing);
        if moved {
            Ok(nodes)
        } else {
            Err(describe(&pods))
        }
    })
    .await;
    let stayed: Vec<_> = before.iter().filter(|n| **n != leaving).collect();
    assert!(
        stayed.iter().all(|n| after.contains(*n)),
        "{before:?} -> {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_keeps_the_minimum_healthy_and_cleans_up() {
    let scratch = Scratch::new();
    let server = Server::start("solo", &scratch.db(), &[]);
    let api = server.api();
    let _web = Sim::start(&api, "web", 5, labels(&[("role", "web")])).await;

    let old = create_rc(&api, 1, "role=web", 4, "static_strategy").await;
    rc_settles(&api, &old, 4, 1).await;

    // Sample what a client sees: how many of the pod's instances report passing.
    let stop = CancellationToken::new();
    let samples: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
    let sampler = tokio::spawn({
        let (api, stop, samples) = (api.clone(), stop.clone(), samples.clone());
        async move {
            while !stop.is_cancelled() {
                let pods = api.pods(POD).await;
                let healthy = pods
                    .iter()
                    .filter(|p| p.health == HealthState::Passing)
                    .count();
                samples.lock().unwrap().push((healthy, describe(&pods)));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });

    let body = json!({
        "old_rc_id": old,
        "new_rc": {
            "manifest": manifest(POD, 2),
            "node_selector": "role=web",
            "allocation_strategy": "static_strategy",
        },
        "desired_replicas": 4,
        "minimum_replicas": 3,
    });
    let roll = api
        .expect(Method::POST, "/api/v1/rolls", &body, StatusCode::CREATED)
        .await;
    let new = roll["id"].as_str().unwrap().to_owned();

    rc_settles(&api, &new, 4, 2).await;
    eventually(
        "the roll to succeed and the old RC to go",
        CONVERGE,
        || async {
            let (_, roll) = api
                .send(Method::GET, &format!("/api/v1/rolls/{new}"), None)
                .await;
            let old_rc = api.status(&format!("/api/v1/rcs/{old}")).await;
            match (roll["outcome"].as_str(), old_rc) {
                (Some("succeeded"), StatusCode::NOT_FOUND) => Ok(()),
                other => Err(format!("roll outcome, old RC: {other:?}")),
            }
        },
    )
    .await;
    stop.cancel();
    sampler.await.unwrap();

    let samples = std::mem::take(&mut *samples.lock().unwrap());
    assert!(samples.len() > 20, "only {} samples", samples.len());
    if let Some((healthy, pods)) = samples.iter().find(|(healthy, _)| *healthy < 3) {
        panic!("only {healthy} healthy during the roll: {pods}");
    }
    let view: RcView = api.get(&format!("/api/v1/rcs/{new}")).await;
    assert_eq!(view.replicas_desired, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_set_follows_the_nodes_it_selects() {
    let scratch = Scratch::new();
    let server = Server::start("solo", &scratch.db(), &[]);
    let api = server.api();
    let _web = Sim::start(&api, "web", 3, labels(&[("role", "web")])).await;
    let _db = Sim::start(&api, "db", 2, labels(&[("role", "db")])).await;

    let ds = create_ds(&api, "logger", "role=web").await;
    ds_settles(&api, &ds, "logger", &["web-0001", "web-0002", "web-0003"]).await;

    api.label_node("web-0002", labels(&[("role", "db")])).await;
    ds_settles(&api, &ds, "logger", &["web-0001", "web-0003"]).await;
    let everywhere = nodes_of(&api.pods("logger").await);
    assert_eq!(
        everywhere,
        BTreeSet::from(["web-0001".to_owned(), "web-0003".to_owned()])
    );
}

/// A node relabelled into two running daemon sets of one pod id disables neither: the node
/// stays with the daemon set running the pod there, and both say why in `Contended`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_relabelled_into_two_daemon_sets_stays_with_the_one_running_there() {
    let scratch = Scratch::new();
    let server = Server::start("solo", &scratch.db(), &[]);
    let api = server.api();
    let _x = Sim::start(&api, "x", 2, labels(&[("tier", "x")])).await;
    let _y = Sim::start(&api, "y", 2, labels(&[("zone", "y")])).await;

    // Apart, they do not contend, so the API lets both be created enabled.
    let older = create_ds(&api, "logger", "tier=x").await;
    let newer = create_ds(&api, "logger", "zone=y").await;
    ds_settles(&api, &older, "logger", &["x-0001", "x-0002"]).await;
    ds_settles(&api, &newer, "logger", &["y-0001", "y-0002"]).await;

    // A node both select makes them contend.
    api.label_node("y-0001", labels(&[("zone", "y"), ("tier", "x")]))
        .await;
    for ds in [&older, &newer] {
        eventually(
            "both daemon sets to say the node contends",
            CONVERGE,
            || async {
                let seen: Value = api.get(&format!("/api/v1/daemonsets/{ds}")).await;
                let conditions = seen["conditions"].as_array().cloned().unwrap_or_default();
                let contended = conditions.iter().any(|c| {
                    c["type"] == "Contended"
                        && c["status"] == "True"
                        && c["reason"] == "NodeLabelsContend"
                });
                match contended && seen["disabled"] == json!(false) {
                    true => Ok(()),
                    false => Err(seen.to_string()),
                }
            },
        )
        .await;
    }
    ds_settles(&api, &older, "logger", &["x-0001", "x-0002"]).await;
    ds_settles(&api, &newer, "logger", &["y-0001", "y-0002"]).await;
}

/// The holder of the leader lock, as `api` reports it.
async fn leader(api: &Api) -> Result<String, String> {
    match api.send(Method::GET, "/api/v1/leader", None).await {
        (StatusCode::OK, record) => Ok(record["holder"].as_str().unwrap_or_default().to_owned()),
        (status, body) => Err(format!("{status}: {body}")),
    }
}

/// A server stopped with SIGTERM leaves every write in the database file itself: a copy of
/// that file alone, as an operator might back it up, serves them.
#[tokio::test]
async fn a_stopped_servers_database_file_holds_every_write() {
    let scratch = Scratch::new();
    let mut server = Server::start("a", &scratch.db(), &["--no-farms"]);
    let rc = create_rc(&server.api(), 1, "role=web", 3, "static_strategy").await;
    server.stop();
    let log = format!("{}-wal", scratch.db().display());
    assert_eq!(std::fs::metadata(log).map_or(0, |m| m.len()), 0);

    let copy = Scratch::new();
    std::fs::copy(scratch.db(), copy.db()).unwrap();
    let restarted = Server::start("b", &copy.db(), &["--no-farms"]);
    let path = format!("/api/v1/rcs/{rc}");
    assert_eq!(restarted.api().status(&path).await, StatusCode::OK);
}

/// A server whose log output has gone (its pipe's reader exited, as `| head` or a log
/// collector that dies does) still stops on SIGTERM: a log line that cannot be written is
/// dropped, and takes no task down with it, the one that handles the signal included.
#[test]
fn a_server_whose_log_pipe_closed_stops_on_sigterm() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let scratch = Scratch::new();
    let store = format!("sqlite://{}", scratch.db().display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_p2-apiserver"))
        .args(["serve", "--listen", "127.0.0.1:0", "--store", &store])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        assert_ne!(stdout.read_line(&mut line).unwrap(), 0, "the server exited");
    }
    drop(stdout);
    drop(child.stderr.take());
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = exited_within(&mut child, Duration::from_secs(20));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        status.is_some_and(|status| status.success()),
        "not stopped 20 s after SIGTERM: {status:?}"
    );
}

/// A second SIGTERM ends a graceful stop that a client holds up (here one that takes none
/// of the answers it asked for): the server exits at once, with status 1.
#[test]
fn a_second_signal_ends_a_graceful_stop_at_once() {
    use std::io::Write;

    let scratch = Scratch::new();
    let mut server = Server::start(
        "a",
        &scratch.db(),
        &["--no-farms", "--header-read-timeout", "120s"],
    );
    // Answers far larger than the connection's buffers, asked for and never read.
    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut client = std::net::TcpStream::connect(addr).unwrap();
    let asked = "GET /openapi.json HTTP/1.1\r\nHost: p2\r\n\r\n".repeat(64);
    client.write_all(asked.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(500));

    server.signal("TERM");
    let held = server.exited_within(Duration::from_secs(2));
    assert_eq!(
        held, None,
        "the stop was not held up: the test shows nothing"
    );
    server.signal("TERM");
    let status = server.exited_within(Duration::from_secs(20));
    assert_eq!(
        status.and_then(|status| status.code()),
        Some(1),
        "still stopping 20 s after a second SIGTERM"
    );
    assert!(server.logged("a second signal received"));
    drop(client);
}

/// A server started without mimalloc's purge delay set runs with the binary's own, in the
/// process it was started as; one started with it set keeps the value it was given.
#[tokio::test]
async fn a_server_runs_with_the_allocators_purge_delay_unless_given_one() {
    let scratch = Scratch::new();
    let defaulted = Server::start("a", &scratch.db(), &["--no-farms"]);
    let given = Server::start_with_env(
        "b",
        &scratch.db(),
        &["--no-farms"],
        &[("MIMALLOC_PURGE_DELAY", "0")],
    );
    let delays = |server: &Server| -> Vec<String> {
        let environment = server.environment();
        let set = environment
            .iter()
            .filter(|var| var.starts_with("MIMALLOC_PURGE_DELAY="));
        set.cloned().collect()
    };
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        assert_eq!(delays(&defaulted), ["MIMALLOC_PURGE_DELAY=10"]);
    } else {
        println!("skipped the server without the purge delay: the tests run with it set");
    }
    assert_eq!(delays(&given), ["MIMALLOC_PURGE_DELAY=0"]);
}

/// Two servers on one database; the leader is killed with SIGKILL.
///
/// The invariant sampled throughout, through the surviving server: every instance of the
/// RC's pod ID in the intent tree carries the RC's id (no copy exists that the RC does not
/// count, such as one left behind by a write of the dead leader), no node holds two of them
/// (one intent key per node and pod ID makes this structural; the listing is checked
/// anyway), and their number never exceeds `replicas_desired` read just after the listing
/// (replicas only ever grow in this test, so a later read can only be larger).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_when_the_leader_is_killed() {
    const TTL: Duration = Duration::from_secs(10);
    const LOCK_DELAY: Duration = Duration::from_secs(1);
    let flags = ["--leader-ttl", "10s", "--leader-lock-delay", "1s"];
    let scratch = Scratch::new();
    let mut first = Server::start("first", &scratch.db(), &flags);
    let holder = |api: Api, name: &'static str| async move {
        let holder = leader(&api).await?;
        if holder == name {
            Ok(())
        } else {
            Err(format!("{holder} leads"))
        }
    };
    eventually("the first server to lead", CONVERGE, || {
        holder(first.api(), "first")
    })
    .await;
    let second = Server::start("second", &scratch.db(), &flags);
    holder(second.api(), "first").await.unwrap();
    let api = second.api();
    let _web = Sim::start(&api, "web", 6, labels(&[("role", "web")])).await;
    let rc = create_rc(&api, 1, "role=web", 3, "static_strategy").await;
    rc_settles(&api, &rc, 3, 1).await;

    let stop = CancellationToken::new();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let samples = Arc::new(Mutex::new(0usize));
    let sampler = tokio::spawn({
        let (api, rc, stop) = (api.clone(), rc.clone(), stop.clone());
        let (violations, samples) = (violations.clone(), samples.clone());
        async move {
            while !stop.is_cancelled() {
                let pods = api.pods(POD).await;
                let view: RcView = api.get(&format!("/api/v1/rcs/{rc}")).await;
                let mut found = Vec::new();
                if nodes_of(&pods).len() != pods.len() {
                    found.push("a node holds two copies".to_owned());
                }
                if pods.iter().any(|p| p.labels.get(RC_ID_LABEL) != Some(&rc)) {
                    found.push("a copy outside the RC".to_owned());
                }
                if pods.len() as i64 > view.replicas_desired {
                    found.push(format!("more than {} copies", view.replicas_desired));
                }
                if !found.is_empty() {
                    violations.lock().unwrap().push(format!(
                        "{}: {}",
                        found.join(", "),
                        describe(&pods)
                    ));
                }
                *samples.lock().unwrap() += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });

    first.kill9();
    let killed = Instant::now();
    set_replicas(&api, &rc, 5).await;
    let budget = TTL + LOCK_DELAY + Duration::from_secs(5);
    eventually("the second server to lead", budget, || {
        holder(api.clone(), "second")
    })
    .await;
    let took_over = killed.elapsed();
    assert!(took_over <= budget, "took {took_over:?}");

    rc_settles(&api, &rc, 5, 1).await;
    stop.cancel();
    sampler.await.unwrap();
    let violations = violations.lock().unwrap();
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(*samples.lock().unwrap() > 20);
}
