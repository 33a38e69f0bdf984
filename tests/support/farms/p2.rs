//! Doubles of P2's own RC farm and rolling update, written from P2's
//! `pkg/rc` and `pkg/roll` behaviour and working on the same store as the server under test, so that tests
//! can run a fleet that mixes both implementations.
//!
//! Both poll the store every [`POLL`] instead of watching it: P2 re-runs its reconciles on
//! every watch result, timeouts included, so a poll is what it does, only faster. Neither
//! fences its writes by an ownership lock (P2's RC worker does not); the rolling
//! update fences its writes by both mutation locks, as P2's does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use p2_apiserver::kv::{KvStore, SessionSpec, StoreError, StoreResult, TxnOp};
use p2_apiserver::labels::{Labels, Selector};
use p2_apiserver::model::Manifest;
use serde_json::Value;

use super::Harness;
use p2_apiserver::layout;

/// How often the doubles look at the store.
const POLL: Duration = Duration::from_millis(50);

/// A legacy pod: (node, pod id), parsed from its label id as P2's `CurrentPods` does.
type Pod = (String, String);

fn rc_key(id: &str) -> String {
    format!("replication_controllers/{id}")
}

fn mutation_lock(id: &str) -> String {
    format!("lock/replication_controllers/{id}/update")
}

/// A session as P2's farms and tools make them: behaviour `delete`.
async fn session(store: &dyn KvStore, name: &str) -> String {
    let spec = SessionSpec::deleting(name, Duration::from_secs(60));
    store.create_session(&spec).await.unwrap()
}

/// An RC document as read, with its index.
struct Rc {
    doc: Value,
    index: u64,
}

impl Rc {
    async fn get(store: &dyn KvStore, id: &str) -> StoreResult<Option<Rc>> {
        let Some(pair) = store.get(&layout::rc(id)).await? else {
            return Ok(None);
        };
        let doc = serde_json::from_slice(&pair.value)
            .map_err(|e| StoreError::Invalid(format!("RC {id}: {e}")))?;
        Ok(Some(Rc {
            doc,
            index: pair.modify_index,
        }))
    }

    fn manifest(&self) -> Manifest {
        Manifest::parse(self.doc["manifest"].as_str().unwrap()).unwrap()
    }

    fn replicas(&self) -> i64 {
        self.doc["replicas_desired"].as_i64().unwrap()
    }

    fn disabled(&self) -> bool {
        self.doc["disabled"].as_bool().unwrap_or(false)
    }

    /// The CAS op that writes this document changed by `change`.
    fn cas(&self, change: impl FnOnce(&mut Value)) -> TxnOp {
        let mut doc = self.doc.clone();
        change(&mut doc);
        TxnOp::Cas {
            key: layout::rc(doc["id"].as_str().unwrap()),
            value: doc.to_string().into_bytes(),
            index: self.index,
        }
    }
}

/// The pods labelled `replication_controller_id=<id>`, with every pod's labels and index.
async fn current_pods(
    store: &dyn KvStore,
    id: &str,
) -> StoreResult<(BTreeSet<Pod>, BTreeMap<Pod, (Labels, u64)>)> {
    let mut all = BTreeMap::new();
    for pair in store.list("labels/pod/").await?.pairs {
        let rest = pair.key.strip_prefix("labels/pod/").unwrap();
        let Some((node, pod_id)) = rest.split_once('/') else {
            continue;
        };
        let labels: Labels = serde_json::from_slice::<Option<Labels>>(&pair.value)
            .ok()
            .flatten()
            .unwrap_or_default();
        all.insert(
            (node.to_owned(), pod_id.to_owned()),
            (labels, pair.modify_index),
        );
    }
    let current = all
        .iter()
        .filter(|(_, (labels, _))| {
            labels.get("replication_controller_id").map(String::as_str) == Some(id)
        })
        .map(|(pod, _)| pod.clone())
        .collect();
    Ok((current, all))
}

/// P2's RC farm: owns the RCs it creates (their ownership lock is taken before the RC is
/// written, so no other farm claims them) and runs P2's RC worker on each: a
/// disabled RC makes no change; add takes the eligible nodes minus the current ones **in
/// name order** and does not look at what else runs there, so it overwrites another RC's
/// pod of the same id in place; remove takes ineligible nodes first; consistency rewrites
/// intents whose manifest differs. Node transfer is not played (the tests' RCs use the
/// static strategy). Stops when the harness does.
pub struct P2RcFarm {
    store: Arc<dyn KvStore>,
    session: String,
    owned: Arc<Mutex<BTreeSet<String>>>,
}

impl P2RcFarm {
    pub async fn start(h: &Harness) -> P2RcFarm {
        let store = h.store.clone();
        let session = session(store.as_ref(), "p2-rctl-server").await;
        let owned: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let (worker_store, worker_owned) = (store.clone(), owned.clone());
        let shutdown = h.shutdown.clone();
        h.tasks.spawn(async move {
            while !shutdown.is_cancelled() {
                let ids: Vec<String> = worker_owned.lock().unwrap().iter().cloned().collect();
                for id in ids {
                    match meet_desires(worker_store.as_ref(), &id).await {
                        Ok(true) => {}
                        // The RC is gone: P2's farm releases it.
                        Ok(false) => {
                            worker_owned.lock().unwrap().remove(&id);
                            let lock = format!("lock/replication_controllers/{id}");
                            let _ = worker_store.delete(&lock, p2_apiserver::kv::Cas::Any).await;
                        }
                        // P2 logs a failed reconcile; the next watch result retries.
                        Err(e) => {
                            tracing::info!(rc = %id, error = %e, "P2 double: reconcile failed")
                        }
                    }
                }
                tokio::time::sleep(POLL).await;
            }
        });
        P2RcFarm {
            store,
            session,
            owned,
        }
    }

    /// Writes an RC document (plus a fresh id) that this farm owns; returns the id.
    pub async fn put_rc(&self, doc: impl Into<Value>) -> String {
        let mut doc: Value = doc.into();
        let id = uuid::Uuid::new_v4().to_string();
        let lock = format!("lock/replication_controllers/{id}");
        assert!(self.store.acquire(&lock, b"", &self.session).await.unwrap());
        doc["id"] = id.clone().into();
        self.store
            .put(
                &layout::rc(&id),
                doc.to_string().as_bytes(),
                p2_apiserver::kv::Cas::Index(0),
            )
            .await
            .unwrap();
        self.owned.lock().unwrap().insert(id.clone());
        id
    }
}

/// One reconcile of P2's RC worker; `false` when the RC is gone.
async fn meet_desires(store: &dyn KvStore, id: &str) -> StoreResult<bool> {
    let Some(rc) = Rc::get(store, id).await? else {
        return Ok(false);
    };
    if rc.disabled() {
        return Ok(true);
    }
    let manifest = rc.manifest();
    let selector: Selector = rc.doc["node_selector"].as_str().unwrap().parse().unwrap();
    let mut labels: Labels = serde_json::from_value::<Option<Labels>>(rc.doc["pod_labels"].clone())
        .unwrap()
        .unwrap_or_default();
    labels.insert("pod_id".into(), manifest.pod_id().into());
    labels.insert("replication_controller_id".into(), id.into());
    let desired = usize::try_from(rc.replicas()).unwrap();

    let eligible = eligible_nodes(store, &selector).await?;
    let (current, all) = current_pods(store, id).await?;
    if desired > current.len() {
        let taken: BTreeSet<&String> = current.iter().map(|(node, _)| node).collect();
        let candidates: Vec<&String> = eligible.iter().filter(|n| !taken.contains(n)).collect();
        for node in candidates.into_iter().take(desired - current.len()) {
            schedule(store, &all, node, &manifest, &labels).await?;
        }
    } else if desired < current.len() {
        // Ineligible nodes first, then the others in an order P2 leaves arbitrary: reverse
        // name order here, the one that clashes most with add's name order.
        let mut victims: Vec<&Pod> = current.iter().rev().collect();
        victims.sort_by_key(|(node, _)| eligible.contains(node));
        for pod in victims.into_iter().take(current.len() - desired) {
            let (mut remaining, index) = all[pod].clone();
            for key in labels.keys() {
                remaining.remove(key);
            }
            let label_key = format!("labels/pod/{}/{}", pod.0, pod.1);
            let labels_op = if remaining.is_empty() {
                TxnOp::DeleteCas {
                    key: label_key,
                    index,
                }
            } else {
                TxnOp::Cas {
                    key: label_key,
                    value: serde_json::to_vec(&remaining).unwrap(),
                    index,
                }
            };
            let intent = TxnOp::Delete {
                key: format!("intent/{}/{}", pod.0, pod.1),
            };
            store.txn(&[labels_op, intent]).await?;
        }
    }

    // Consistency, on a fresh reading.
    let eligible = eligible_nodes(store, &selector).await?;
    let (current, all) = current_pods(store, id).await?;
    for (node, pod_id) in current.iter().filter(|(node, _)| eligible.contains(node)) {
        let intent = store.get(&format!("intent/{node}/{pod_id}")).await?;
        let same = intent.is_some_and(|pair| {
            std::str::from_utf8(&pair.value)
                .ok()
                .and_then(|text| Manifest::parse(text).ok())
                .is_some_and(|m| m.sha() == manifest.sha())
        });
        if !same {
            schedule(store, &all, node, &manifest, &labels).await?;
        }
    }
    Ok(true)
}

/// The nodes whose labels match `selector`, in name order.
async fn eligible_nodes(store: &dyn KvStore, selector: &Selector) -> StoreResult<BTreeSet<String>> {
    Ok(store
        .list("labels/node/")
        .await?
        .pairs
        .iter()
        .filter_map(|pair| {
            let labels: Labels = serde_json::from_slice(&pair.value).ok()?;
            let node = pair.key.strip_prefix("labels/node/")?;
            selector.matches(&labels).then(|| node.to_owned())
        })
        .collect())
}

/// P2's schedule: merge the RC's labels into the pod's (CAS on the index read) and set the
/// intent, whatever was there.
async fn schedule(
    store: &dyn KvStore,
    all: &BTreeMap<Pod, (Labels, u64)>,
    node: &str,
    manifest: &Manifest,
    labels: &Labels,
) -> StoreResult<()> {
    let pod = (node.to_owned(), manifest.pod_id().to_owned());
    let (mut merged, index) = all.get(&pod).cloned().unwrap_or_default();
    merged.extend(labels.clone());
    let ops = [
        TxnOp::Cas {
            key: format!("labels/pod/{node}/{}", pod.1),
            value: serde_json::to_vec(&merged).unwrap(),
            index,
        },
        TxnOp::Set {
            key: format!("intent/{node}/{}", pod.1),
            value: manifest.raw().as_bytes().to_vec(),
        },
    ];
    store.txn(&ops).await.map(drop)
}

/// A rolling update as `p2-rctl rolling-update` runs it in the CLI process: no roll record,
/// a session of its own.
#[derive(Debug, Clone)]
pub struct P2Roll {
    pub old: String,
    pub new: String,
    pub desired: i64,
    pub minimum: i64,
}

/// Counts of one RC as P2's `countHealthy` makes them.
#[derive(Debug, Default)]
struct Counts {
    desired: i64,
    current: i64,
    healthy: i64,
}

async fn count_healthy(store: &dyn KvStore, id: &str, rc: &Rc) -> StoreResult<Counts> {
    let sha = rc.manifest().sha();
    let (current, _) = current_pods(store, id).await?;
    let mut counts = Counts {
        desired: rc.replicas(),
        current: current.len() as i64,
        healthy: 0,
    };
    for (node, pod_id) in &current {
        let real = store
            .get(&format!("reality/{node}/{pod_id}"))
            .await?
            .is_some_and(|pair| {
                std::str::from_utf8(&pair.value)
                    .ok()
                    .and_then(|text| Manifest::parse(text).ok())
                    .is_some_and(|m| m.sha() == sha)
            });
        let passing = store
            .get(&format!("health/{pod_id}/{node}"))
            .await?
            .and_then(|pair| serde_json::from_slice::<Value>(&pair.value).ok())
            .is_some_and(|record| record["Status"] == "passing");
        if real && passing {
            counts.healthy += 1;
        }
    }
    Ok(counts)
}

/// P2's `rollAlgorithm`: how many replicas to take from the old RC and give the new.
fn roll_algorithm(
    old: i64,
    new: i64,
    old_desired: i64,
    new_desired: i64,
    target: i64,
    min: i64,
) -> (i64, i64) {
    let mut headroom = old + new - min;
    let mut growth = target - (old_desired + new_desired);
    if growth > 0 {
        headroom += growth;
    } else {
        growth = 0;
    }
    let remaining = target - new_desired;
    if remaining <= 0 {
        return (0, 0);
    }
    if new >= min {
        return ((remaining - growth).max(0), remaining);
    }
    if headroom <= 0 {
        return (0, 0);
    }
    let add = remaining.min(headroom);
    ((add - growth).max(0), add)
}

/// Runs `roll` as P2 does: both mutation locks in one txn; the enable step (old RC
/// disabled, new enabled); then, per health reading, the roll algorithm and a CAS transfer
/// of replica counts, every write checking both locks; at the end, waits for the old RC to
/// have no pods and deletes it while releasing the locks, in one txn. `Err` says why it
/// stopped without finishing.
pub async fn rolling_update(store: Arc<dyn KvStore>, roll: P2Roll) -> Result<(), String> {
    let store = store.as_ref();
    let session = session(store, &format!("ru-farm:test:{}", roll.new)).await;
    let locks = [mutation_lock(&roll.new), mutation_lock(&roll.old)];
    let lock_ops: Vec<TxnOp> = locks
        .iter()
        .map(|key| TxnOp::Lock {
            key: key.clone(),
            value: Vec::new(),
            session: session.clone(),
        })
        .collect();
    store
        .txn(&lock_ops)
        .await
        .map_err(|e| format!("taking the mutation locks: {e}"))?;
    let check: Vec<TxnOp> = locks
        .iter()
        .map(|key| TxnOp::CheckSession {
            key: key.clone(),
            session: session.clone(),
        })
        .collect();
    let failed = |what: &str, e: StoreError| format!("{what}: {e}");

    // Enable step.
    let get = |id: String| async move {
        Rc::get(store, &id)
            .await
            .map_err(|e| failed("reading an RC", e))?
            .ok_or(format!("RC {id} is gone"))
    };
    let (old, new) = (get(roll.old.clone()).await?, get(roll.new.clone()).await?);
    if new.disabled() {
        let counts = count_healthy(store, &roll.new, &new)
            .await
            .map_err(|e| failed("counting", e))?;
        if counts.current != counts.desired {
            return Err("the new RC is disabled with pods out of line".into());
        }
    }
    let mut ops = check.clone();
    ops.push(old.cas(|doc| doc["disabled"] = true.into()));
    ops.push(new.cas(|doc| doc["disabled"] = false.into()));
    store
        .txn(&ops)
        .await
        .map_err(|e| failed("the enable step", e))?;

    // Roll loop.
    loop {
        tokio::time::sleep(POLL).await;
        let (old, new) = (get(roll.old.clone()).await?, get(roll.new.clone()).await?);
        let (Ok(old_counts), Ok(new_counts)) = (
            count_healthy(store, &roll.old, &old).await,
            count_healthy(store, &roll.new, &new).await,
        ) else {
            continue;
        };
        if new_counts.desired >= roll.desired {
            if new_counts.current >= roll.desired {
                break;
            }
            continue;
        }
        let (remove, add) = roll_algorithm(
            old_counts.healthy.min(old_counts.desired),
            new_counts.healthy,
            old_counts.desired,
            new_counts.desired,
            roll.desired,
            roll.minimum,
        );
        if remove == 0 && add == 0 {
            continue;
        }
        let mut ops = check.clone();
        ops.push(old.cas(|doc| doc["replicas_desired"] = (old.replicas() - remove).into()));
        ops.push(new.cas(|doc| doc["replicas_desired"] = (new.replicas() + add).into()));
        // A failed transfer is logged and retried at the next reading.
        let _ = store.txn(&ops).await;
    }

    // Completion.
    let old = loop {
        let old = get(roll.old.clone()).await?;
        if old.replicas() != 0 {
            return Err(format!("the old RC wants {} replicas", old.replicas()));
        }
        let (current, _) = current_pods(store, &roll.old)
            .await
            .map_err(|e| failed("listing pods", e))?;
        if current.is_empty() {
            break old;
        }
        tokio::time::sleep(POLL).await;
    };
    let mut ops = Vec::new();
    for op in check {
        let key = op.key().to_owned();
        ops.push(op);
        ops.push(TxnOp::Delete { key });
    }
    ops.push(TxnOp::DeleteCas {
        key: layout::rc(&roll.old),
        index: old.index,
    });
    ops.push(TxnOp::Delete {
        key: format!("labels/replication_controller/{}", roll.old),
    });
    store
        .txn(&ops)
        .await
        .map_err(|e| failed("the cleanup", e))?;
    store
        .destroy_session(&session)
        .await
        .map_err(|e| failed("ending the session", e))?;
    Ok(())
}
