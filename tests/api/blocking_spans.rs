//! Blocking reads of spans, checked at random: a read blocked at the `X-Index` of an
//! earlier answer and held for its whole wait answers exactly what that answer did, on
//! every route whose blocking reads wait on part of their trees (a missed wake would hold
//! a read whose answer has changed since the index it was given).

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use p2_apiserver::kv::{Cas, TxnOp};
use p2_apiserver::state::MirrorConfig;
use p2_apiserver::store::own_writes::OwnWrites;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::support::api::TestApp;

/// The seeds the check always runs with; a failure names its seed.
const FIXED_SEEDS: [u64; 5] = [1, 7, 42, 1_000_003, 20_261_206];

/// Names the environment variable that repeats a run's drawn seed.
const SEED_VARIABLE: &str = "BLOCKING_SPANS_SEED";

/// The fixed seeds, then one drawn anew each run (or taken from [`SEED_VARIABLE`], to repeat
/// a failed run), so that the runs over time check more histories than the fixed five.
fn seeds() -> Vec<u64> {
    let drawn = match std::env::var(SEED_VARIABLE) {
        Ok(seed) => (seed.parse()).unwrap_or_else(|e| panic!("{SEED_VARIABLE}={seed}: {e}")),
        Err(_) => rand::thread_rng().gen(),
    };
    println!("seeds {FIXED_SEEDS:?} and {drawn} ({SEED_VARIABLE}={drawn} repeats the last)");
    FIXED_SEEDS.into_iter().chain([drawn]).collect()
}

/// How long each read is held at most: a read answered sooner was woken, and is not
/// checked.
const WAIT: Duration = Duration::from_millis(300);

const NODES: [&str; 4] = ["node1", "node2", "node3", "node4"];
const POD_IDS: [&str; 3] = ["hello", "shipper", "web"];

/// The objects the fleet is made of.
struct Fleet {
    /// The roll's old and new RCs first.
    rcs: Vec<String>,
    roll: String,
    ds: String,
}

impl Fleet {
    /// Every read with spans, of the fleet.
    fn reads(&self) -> Vec<String> {
        let mut reads: Vec<String> = self
            .rcs
            .iter()
            .map(|id| format!("/api/v1/rcs/{id}"))
            .collect();
        reads.push(format!("/api/v1/rolls/{}", self.roll));
        reads.push(format!("/api/v1/daemonsets/{}", self.ds));
        for node in NODES {
            reads.push(format!("/api/v1/pods?node={node}"));
        }
        for pod_id in POD_IDS {
            reads.push(format!("/api/v1/pods?pod_id={pod_id}"));
            reads.push(format!("/api/v1/pods?node=node1&pod_id={pod_id}"));
            reads.push(format!("/api/v1/health/{pod_id}"));
            reads.push(format!("/api/v1/health/{pod_id}?selector=team%3Da"));
        }
        let objects = self.rcs.iter().chain([&self.roll, &self.ds]);
        reads.extend(objects.map(|id| format!("/api/v1/events?id={id}")));
        reads
    }
}

async fn create_rc(app: &TestApp, replicas: i64) -> String {
    let spec = json!({"manifest": "id: hello\nlaunchables: {}\n", "node_selector": "",
        "replicas_desired": replicas});
    let created = app
        .json_request("POST", "/api/v1/rcs", Some(&spec), &[])
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    created.json()["id"].as_str().unwrap().to_owned()
}

async fn build(app: &TestApp, rng: &mut StdRng) -> Fleet {
    let mut rcs = Vec::new();
    for replicas in 1..=4 {
        rcs.push(create_rc(app, replicas).await);
    }
    let roll = json!({"old_rc_id": rcs[0], "new_rc_id": rcs[1],
        "desired_replicas": 2, "minimum_replicas": 0});
    let created = app
        .json_request("POST", "/api/v1/rolls", Some(&roll), &[])
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let roll = created.json()["id"].as_str().unwrap().to_owned();
    let spec = json!({"manifest": "id: shipper\nlaunchables: {}\n", "node_selector": "",
        "min_health": 0, "cluster_name": "production", "timeout": "10m", "disabled": false});
    let created = app
        .json_request("POST", "/api/v1/daemonsets", Some(&spec), &[])
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let ds = created.json()["id"].as_str().unwrap().to_owned();
    let fleet = Fleet { rcs, roll, ds };
    for node in NODES {
        put(app, &format!("labels/node/{node}"), json!({"role": "web"})).await;
        for pod_id in POD_IDS {
            let pod = format!("{node}/{pod_id}");
            put(
                app,
                &format!("labels/pod/{pod}"),
                pod_labels(rng, &fleet, pod_id),
            )
            .await;
            put_text(app, &format!("intent/{pod}"), &manifest(pod_id)).await;
            if rng.gen_bool(0.8) {
                put_text(app, &format!("reality/{pod}"), &manifest(pod_id)).await;
            }
            let record = health(rng, pod_id, node);
            put(app, &format!("health/{pod_id}/{node}"), record).await;
        }
    }
    fleet
}

fn manifest(pod_id: &str) -> String {
    format!("id: {pod_id}\nlaunchables: {{}}\n")
}

/// Labels of `pod_id` naming one of the fleet's RCs (or none), its daemon set (the
/// shipper, mostly) and a team.
fn pod_labels(rng: &mut StdRng, fleet: &Fleet, pod_id: &str) -> Value {
    let mut labels = serde_json::Map::new();
    // A daemon set's pod an RC holds too is the RC's, which its status leaves out.
    if rng.gen_bool(if pod_id == "shipper" { 0.3 } else { 0.8 }) {
        let rc = fleet.rcs.choose(rng).unwrap();
        labels.insert("replication_controller_id".into(), json!(rc));
    }
    if pod_id == "shipper" || rng.gen_bool(0.1) {
        labels.insert("daemon_set_id".into(), json!(fleet.ds));
    }
    let team = *["a", "b"].choose(rng).unwrap();
    labels.insert("team".into(), json!(team));
    Value::Object(labels)
}

/// A health record of `pod_id` at `node`'s key, naming that node or, at times, another.
fn health(rng: &mut StdRng, pod_id: &str, node: &str) -> Value {
    let node = match rng.gen_bool(0.7) {
        true => node,
        false => NODES.choose(rng).unwrap(),
    };
    let status = *["passing", "passing", "critical", "warning"]
        .choose(rng)
        .unwrap();
    json!({"Id": pod_id, "Node": node, "Service": pod_id, "Status": status,
        "Time": "2020-01-14T11:06:40Z", "Expires": "2120-01-14T11:06:40Z"})
}

/// Writes `value` at `key` behind the server's back, without waiting for the mirror.
async fn put(app: &TestApp, key: &str, value: Value) {
    put_text(app, key, &value.to_string()).await;
}

async fn put_text(app: &TestApp, key: &str, value: &str) {
    app.store
        .put(key, value.as_bytes(), Cas::Any)
        .await
        .unwrap();
}

async fn delete(app: &TestApp, key: &str) {
    app.store.delete(key, Cas::Any).await.unwrap();
}

/// Writes `value` at `key` behind the server's back, or deletes it when `None`; what it did.
async fn set(app: &TestApp, key: &str, value: Option<Value>) -> String {
    match value {
        Some(value) => {
            put(app, key, value.clone()).await;
            format!("{key} = {value}")
        }
        None => {
            delete(app, key).await;
            format!("delete {key}")
        }
    }
}

fn random_pod(rng: &mut StdRng) -> String {
    format!(
        "{}/{}",
        NODES.choose(rng).unwrap(),
        POD_IDS.choose(rng).unwrap()
    )
}

/// One write at random, behind the server's back, through it or through `other` (another
/// server on its store); what it was.
async fn write(app: &TestApp, other: &TestApp, rng: &mut StdRng, fleet: &Fleet) -> String {
    let (via, server) = match rng.gen_bool(0.5) {
        true => (app, "this server"),
        false => (other, "another server"),
    };
    let pod = random_pod(rng);
    let pod_id = pod.split_once('/').unwrap().1.to_owned();
    let node = NODES.choose(rng).unwrap();
    let rc = fleet.rcs.choose(rng).unwrap().clone();
    match rng.gen_range(0..22) {
        0..=2 => {
            let labels = rng.gen_bool(0.7).then(|| pod_labels(rng, fleet, &pod_id));
            set(app, &format!("labels/pod/{pod}"), labels).await
        }
        3 => {
            let labels = pod_labels(rng, fleet, &pod_id);
            let path = format!("/api/v1/labels/pod/{pod}");
            let answer = via
                .send_json("PUT", &path, &[], &json!({ "labels": labels }))
                .await;
            assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
            format!("PUT {path} {labels} through {server}")
        }
        4 => {
            let path = format!("/api/v1/labels/pod/{pod}");
            let answer = via.json_request("DELETE", &path, None, &[]).await;
            format!("DELETE {path} through {server}: {}", answer.status)
        }
        5..=8 => {
            let key = match rng.gen_bool(0.5) {
                true => format!("intent/{pod}"),
                false => format!("reality/{pod}"),
            };
            if rng.gen_bool(0.5) {
                put_text(app, &key, &manifest(&pod_id)).await;
                key
            } else {
                delete(app, &key).await;
                format!("delete {key}")
            }
        }
        9..=11 => {
            let record = rng.gen_bool(0.7).then(|| health(rng, &pod_id, node));
            set(app, &format!("health/{pod_id}/{node}"), record).await
        }
        12 => {
            let (kind, id) = match rng.gen_range(0..3) {
                0 => ("rcs", rc),
                1 => ("rolls", fleet.roll.clone()),
                _ => ("daemon_sets", fleet.ds.clone()),
            };
            let key = format!("p2-apiserver/conditions/{kind}/{id}");
            if rng.gen_bool(0.7) {
                put(app, &key, json!({"conditions": []})).await;
                key
            } else {
                delete(app, &key).await;
                format!("delete {key}")
            }
        }
        13 => {
            let key = format!("replication_controllers/{rc}");
            let Some(mut stored) = app.stored_json(&key).await else {
                return format!("{key} gone");
            };
            let replicas = rng.gen_range(0..5);
            stored["replicas_desired"] = json!(replicas);
            put(app, &key, stored).await;
            format!("{key} replicas_desired = {replicas}")
        }
        14 => {
            let path = format!("/api/v1/rcs/{rc}");
            let replicas = rng.gen_range(0..5);
            let patch = json!({"replicas_desired": replicas});
            let answer = via.merge_patch(&path, &patch, &[]).await;
            format!("PATCH {path} {patch} through {server}: {}", answer.status)
        }
        15 => {
            let path = format!("/api/v1/daemonsets/{}", fleet.ds);
            let patch = json!({"min_health": rng.gen_range(0..3)});
            let answer = via.merge_patch(&path, &patch, &[]).await;
            format!("PATCH {path} {patch} through {server}: {}", answer.status)
        }
        16 => {
            let path = format!("/api/v1/rolls/{}", fleet.roll);
            let answer = via.json_request("DELETE", &path, None, &[]).await;
            format!("DELETE {path} through {server}: {}", answer.status)
        }
        17 => {
            let (kind, id) = match rng.gen_range(0..4) {
                0 => ("node", node.to_string()),
                1 => ("rolls", fleet.roll.clone()),
                2 => ("replication_controller", rc),
                _ => ("pod", format!("node9/{pod_id}")),
            };
            let key = format!("labels/{kind}/{id}");
            let team = *["a", "b"].choose(rng).unwrap();
            put(app, &key, json!({"team": team})).await;
            format!("{key} team={team}")
        }
        18 => {
            let key = format!("status/daemon_sets/{}/daemon_set_farm", fleet.ds);
            put(app, &key, json!({"manual_replicas": rng.gen_range(0..3)})).await;
            key
        }
        19 => prune_event(app, rng, fleet).await,
        20 => {
            let id = create_rc(via, 1).await;
            format!("created RC {id} through {server}")
        }
        _ => {
            let path = format!("/api/v1/rcs/{rc}");
            let answer = via.json_request("DELETE", &path, None, &[]).await;
            format!("DELETE {path} through {server}: {}", answer.status)
        }
    }
}

/// Prunes one event of an object of the fleet with a lone delete-cas through the server's
/// own writes, as the retention farm does.
async fn prune_event(app: &TestApp, rng: &mut StdRng, fleet: &Fleet) -> String {
    let objects: Vec<&String> = fleet.rcs.iter().chain([&fleet.roll, &fleet.ds]).collect();
    let object = objects.choose(rng).unwrap();
    let listed = app.get(&format!("/api/v1/events?id={object}")).await;
    let items = listed.json()["items"].clone();
    let Some(event) = items.as_array().unwrap().choose(rng) else {
        return format!("no event of {object} to prune");
    };
    let key = p2_apiserver::layout::event(event["id"].as_str().unwrap());
    let Some(pair) = app.stored(&key).await else {
        return format!("{key} gone");
    };
    let store = OwnWrites::wrap(app.store.clone(), app.mirror.clone());
    let prune = TxnOp::DeleteCas {
        key: key.clone(),
        index: pair.modify_index,
    };
    let pruned = store.txn(&[prune]).await;
    format!("pruned {key}: {}", pruned.is_ok())
}

/// An answer kept: the server that gave it (this one, or the other), its status, body and
/// `X-Index`.
struct Kept {
    server: usize,
    path: String,
    status: StatusCode,
    body: Value,
    index: u64,
}

/// Reads every route on both servers, keeping each answer.
async fn read_all(servers: &[Arc<TestApp>; 2], fleet: &Fleet) -> Vec<Kept> {
    let mut kept = Vec::new();
    for (server, app) in servers.iter().enumerate() {
        for path in fleet.reads() {
            let answer = app.get(&path).await;
            kept.push(Kept {
                server,
                index: answer.x_index(),
                status: answer.status,
                body: answer.json(),
                path,
            });
        }
    }
    kept
}

/// Waits until both servers' mirrors hold everything the store does.
async fn settle(servers: &[Arc<TestApp>; 2]) {
    let key = "p2-apiserver/test/settled";
    put_text(&servers[0], key, "x").await;
    for app in servers {
        app.mirrored(key).await;
    }
}

/// Blocks each kept read at its index, on the server that gave it, and checks that one
/// held its whole wait answers what it answered; how many were held.
async fn check(
    servers: &[Arc<TestApp>; 2],
    kept: Vec<Kept>,
    seed: u64,
    writes: &[String],
) -> usize {
    let reads = kept.into_iter().map(|kept| {
        let app = servers[kept.server].clone();
        tokio::spawn(async move {
            let separator = if kept.path.contains('?') { '&' } else { '?' };
            let wait = WAIT.as_millis();
            let blocking = format!("{}{separator}index={}&wait={wait}ms", kept.path, kept.index);
            let started = Instant::now();
            let answer = app.get(&blocking).await;
            (kept, answer, started.elapsed())
        })
    });
    let mut held = 0;
    for read in reads.collect::<Vec<_>>() {
        let (kept, answer, elapsed) = read.await.unwrap();
        if elapsed < WAIT {
            continue;
        }
        held += 1;
        let body = answer.json();
        assert!(
            answer.status == kept.status && body == kept.body,
            "seed {seed}: GET {}?index={} on server {} was held {elapsed:?} but its answer \
             changed\nthen ({}): {}\nnow ({}, X-Index {}): {}\nwrites: {writes:#?}",
            kept.path,
            kept.index,
            kept.server,
            kept.status,
            kept.body,
            answer.status,
            answer.x_index(),
            body,
        );
    }
    held
}

/// Builds a fleet with `seed`, then in a few rounds keeps every read's answer on both
/// servers, changes the fleet at random and checks the kept reads blocked at their indexes.
async fn run(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let app = Arc::new(TestApp::new().await);
    let other = Arc::new(app.beside(|store| store, MirrorConfig::default()).await);
    let servers = [app.clone(), other.clone()];
    let fleet = build(&app, &mut rng).await;
    settle(&servers).await;
    let mut held = 0;
    for _round in 0..3 {
        let mut writes = Vec::new();
        // Some writes the kept answers may or may not show yet.
        for _ in 0..rng.gen_range(0..4) {
            writes.push(write(&app, &other, &mut rng, &fleet).await);
        }
        let kept = read_all(&servers, &fleet).await;
        writes.push("-- answers kept --".to_owned());
        for _ in 0..rng.gen_range(1..6) {
            writes.push(write(&app, &other, &mut rng, &fleet).await);
            if rng.gen_bool(0.2) {
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..20))).await;
            }
        }
        settle(&servers).await;
        held += check(&servers, kept, seed, &writes).await;
    }
    assert!(
        held > 0,
        "seed {seed}: no read was held, so none was checked"
    );
}

/// Every read with spans, held for its whole wait at the index of an earlier answer while
/// the fleet changes at random, answers what that answer did.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_held_its_whole_wait_answers_what_it_did_at_its_index() {
    for seed in seeds() {
        run(seed).await;
    }
}
