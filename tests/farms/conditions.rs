//! The conditions the farms publish beside P2's documents, driven against the embedded store.

use std::time::{Duration, SystemTime};

use crate::support::farms::{
    alert_webhook, rc_doc, warnings, Backend, Harness, MANIFEST, NEW_MANIFEST,
};
use p2_apiserver::farms::FarmOptions;
use p2_apiserver::kv::{Cas, SessionSpec, TxnOp};
use p2_apiserver::labels::LabelType;
use p2_apiserver::layout;
use p2_apiserver::model::event::{Action, Event, ObjectKind};
use p2_apiserver::model::{HealthRecord, HealthState};
use serde_json::{json, Value};

/// The conditions stored for an object, if any.
async fn conditions(h: &Harness, kind: ObjectKind, id: &str) -> Option<Vec<Value>> {
    let pair = h.store.get(&layout::conditions(kind, id)).await.unwrap()?;
    let record: Value = serde_json::from_slice(&pair.value).unwrap();
    Some(record["conditions"].as_array().unwrap().clone())
}

/// Waits until the object has no conditions stored.
async fn until_no_conditions(h: &Harness, kind: ObjectKind, id: &str) {
    h.wait_until(|| async { conditions(h, kind, id).await.is_none().then_some(()) })
        .await;
}

/// Waits until the object's condition `kind` has `status` and `reason`; returns it.
async fn wait_for(
    h: &Harness,
    kind: ObjectKind,
    id: &str,
    condition: &str,
    status: &str,
    reason: &str,
) -> Value {
    h.wait_until(|| async {
        conditions(h, kind, id)
            .await?
            .into_iter()
            .find(|c| c["type"] == condition && c["status"] == status && c["reason"] == reason)
    })
    .await
}

/// Waits until roll `id` is not progressing, for `reason`; returns why, as its message says.
async fn not_progressing_for(h: &Harness, id: &str, reason: &str) -> String {
    let progressing = wait_for(h, ObjectKind::Rolls, id, "Progressing", "False", reason).await;
    progressing["message"].as_str().unwrap().to_owned()
}

fn ds(selector: &str, min_health: i64) -> Value {
    json!({"disabled": false, "manifest": MANIFEST, "min_health": min_health,
           "cluster_name": "production", "node_selector": selector, "pod_id": "hello",
           "timeout": 60_000_000_000_u64})
}

/// Three web nodes running pods, an old RC with `replicas` of them healthy, and a new RC
/// with none, to roll between; returns the old RC's id and the new one's.
async fn rcs_to_roll(h: &Harness, replicas: usize) -> (String, String) {
    let old = h.healthy_rc(3, replicas).await;
    let new = h.put_rc(rc_doc(NEW_MANIFEST, "role=web", 0)).await;
    (old, new)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_with_minimum_equal_to_desired_is_stalled_and_alerted() {
    let webhook = alert_webhook().await;
    let options = FarmOptions {
        roll_stall_deadline: Duration::from_secs(1),
        ..FarmOptions::default()
    };
    let h = Harness::start_with(Backend::Sqlite, Some(webhook.uri()), options).await;
    let (old, new) = rcs_to_roll(&h, 3).await;
    h.put_roll(&old, &new, 3, 3).await;

    let why = not_progressing_for(&h, &new, "MinimumEqualsDesired").await;
    assert!(
        why.starts_with("minimum_replicas (3) is not below desired_replicas (3)"),
        "{why}"
    );
    let stalled = wait_for(
        &h,
        ObjectKind::Rolls,
        &new,
        "Stalled",
        "True",
        "MinimumEqualsDesired",
    )
    .await;
    assert_eq!(stalled["message"], format!("no progress for 1s: {why}"));
    let alert = h
        .alert_about(&webhook, &format!("roll_stalled/{new}"))
        .await;
    assert_eq!(
        alert,
        format!("roll {new} stalled: no progress for 1s: {why}")
    );
    assert!(!warnings("p2_apiserver::farms::roll", "roll stalled").is_empty());
    // The stall is an event too, recorded once the alert has gone out.
    h.wait_until(|| async {
        let events = h.store.list("p2-apiserver/events/").await.unwrap().pairs;
        events
            .iter()
            .map(|pair| Event::from_json(&pair.value).unwrap())
            .any(|event| {
                event.action == Action::Alert
                    && event.object_id == new
                    && event.actor == "farm:roll@test"
                    && event.message.as_deref() == Some(alert.as_str())
            })
            .then_some(())
    })
    .await;

    // Cancelling the roll removes its conditions.
    h.store.delete(&layout::roll(&new), Cas::Any).await.unwrap();
    until_no_conditions(&h, ObjectKind::Rolls, &new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rc_selecting_too_few_nodes_is_degraded_until_it_goes() {
    let h = Harness::start().await;
    h.web_nodes(2).await;
    h.label(LabelType::Node, "db1", json!({"role": "db"})).await;
    let id = h.put_rc(rc_doc(MANIFEST, "role=web", 5)).await;
    let degraded = wait_for(
        &h,
        ObjectKind::Rcs,
        &id,
        "Degraded",
        "True",
        "TooFewEligibleNodes",
    )
    .await;
    assert_eq!(
        degraded["message"],
        "2 of 5 desired nodes match the selector"
    );
    let ready = wait_for(
        &h,
        ObjectKind::Rcs,
        &id,
        "Ready",
        "False",
        "ReplicasNotReady",
    )
    .await;
    assert!(ready["observed_index"].as_u64().unwrap() > 0);

    // Fewer replicas fit: no longer degraded.
    h.set_replicas(&id, 2).await;
    wait_for(&h, ObjectKind::Rcs, &id, "Degraded", "False", "EnoughNodes").await;

    h.set_replicas(&id, 0).await;
    h.wait_for_rc_nodes(&id, 0).await;
    h.store.delete(&layout::rc(&id), Cas::Any).await.unwrap();
    until_no_conditions(&h, ObjectKind::Rcs, &id).await;
}

/// An RC another session's farm owns (P2's, which writes no conditions) shows none: those
/// this server's farm computed while it owned the RC are removed, not left to be shown as
/// current however the RC fares under the other farm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_of_an_rc_another_farm_owns_are_removed() {
    let h = Harness::start().await;
    let id = h.put_rc(rc_doc(MANIFEST, "", 0)).await;
    wait_for(
        &h,
        ObjectKind::Rcs,
        &id,
        "Ready",
        "True",
        "AllReplicasHealthy",
    )
    .await;

    // P2's RC farm takes the RC over: the lock passes to its session in one transaction.
    let spec = SessionSpec::deleting("p2-rc-farm", Duration::from_secs(60));
    let session = h.store.create_session(&spec).await.unwrap();
    let lock = layout::rc_ownership(&id);
    let handover = [
        TxnOp::Delete { key: lock.clone() },
        TxnOp::Lock {
            key: lock,
            value: Vec::new(),
            session,
        },
    ];
    h.store.txn(&handover).await.unwrap();
    until_no_conditions(&h, ObjectKind::Rcs, &id).await;
}

/// Waits until RC `id` of one replica has its pod placed, as the pass after the placement
/// sees it; returns the index its conditions were then written at.
async fn placed(h: &Harness, id: &str) -> u64 {
    let key = layout::conditions(ObjectKind::Rcs, id);
    h.wait_until(|| async {
        let pair = h.store.get(&key).await.unwrap()?;
        let record: Value = serde_json::from_slice(&pair.value).unwrap();
        let ready = record["conditions"].as_array()?.iter().any(|c| {
            c["type"] == "Ready" && c["message"] == "0 of 1 desired pods are healthy (1 pod placed)"
        });
        ready.then_some(pair.modify_index)
    })
    .await
}

/// A pass that only places pods writes the RC's conditions in their transaction, telling
/// the RC as the placement leaves it, so the next pass has nothing to rewrite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_written_with_a_placement_tell_the_pods_placed() {
    let h = Harness::start().await;
    h.web_nodes(2).await;
    let id = h.put_rc(rc_doc(MANIFEST, "role=web", 1)).await;
    let written = placed(&h, &id).await;
    let intents = h.store.list(layout::INTENT).await.unwrap().pairs;
    let placed_at: Vec<u64> = intents.iter().map(|pair| pair.modify_index).collect();
    assert_eq!(placed_at, [written]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_that_still_hold_are_not_written_again() {
    let h = Harness::start().await;
    h.web_nodes(2).await;
    let first = h.put_rc(rc_doc(MANIFEST, "role=web", 1)).await;
    let settled = placed(&h, &first).await;
    // Every pass looks at every RC: those that place a later RC, and the one after, find
    // the first RC's conditions as stored.
    let later = h.put_rc(rc_doc(MANIFEST, "role=web", 1)).await;
    placed(&h, &later).await;
    let pair = h
        .store
        .get(&layout::conditions(ObjectKind::Rcs, &first))
        .await;
    assert_eq!(pair.unwrap().unwrap().modify_index, settled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_changed_by_one_write_are_stored_in_one_transaction() {
    let h = Harness::start().await;
    h.web_nodes(3).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(h.put_rc(rc_doc(MANIFEST, "role=web", 1)).await);
    }
    for id in &ids {
        placed(&h, id).await;
    }
    // Every pod installed and healthy at once: the next pass finds every RC's conditions
    // changed, and nothing else to write for them.
    let intents = h.store.list(layout::INTENT).await.unwrap().pairs;
    assert_eq!(intents.len(), 3);
    let reports: Vec<TxnOp> = intents
        .iter()
        .flat_map(|pair| {
            let node = pair.key[layout::INTENT.len()..].split('/').next().unwrap();
            let record = HealthRecord::new("hello", node, HealthState::Passing, SystemTime::now());
            [
                TxnOp::Set {
                    key: format!("{}{node}/hello", layout::REALITY),
                    value: pair.value.to_vec(),
                },
                TxnOp::Set {
                    key: format!("{}hello/{node}", layout::HEALTH),
                    value: record.to_json(),
                },
            ]
        })
        .collect();
    h.store.txn(&reports).await.unwrap();
    let mut written = Vec::new();
    for id in &ids {
        wait_for(
            &h,
            ObjectKind::Rcs,
            id,
            "Ready",
            "True",
            "AllReplicasHealthy",
        )
        .await;
        let key = layout::conditions(ObjectKind::Rcs, id);
        written.push(h.store.get(&key).await.unwrap().unwrap().modify_index);
    }
    written.dedup();
    assert_eq!(written.len(), 1, "written at {written:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contending_daemon_set_says_with_which() {
    let h = Harness::start().await;
    h.web_nodes(2).await;
    let first = h.put_ds(ds("role=web", 0)).await;
    wait_for(
        &h,
        ObjectKind::Daemonsets,
        &first,
        "Contended",
        "False",
        "NoContention",
    )
    .await;
    let second = h.put_ds(ds("", 0)).await;
    let contended = wait_for(
        &h,
        ObjectKind::Daemonsets,
        &second,
        "Contended",
        "True",
        "ContendsWithDaemonSet",
    )
    .await;
    let message = contended["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("daemon set {first} is enabled for pod hello too")),
        "{message}"
    );
    wait_for(
        &h,
        ObjectKind::Daemonsets,
        &second,
        "Progressing",
        "False",
        "Disabled",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_set_held_by_min_health_is_blocked() {
    let h = Harness::start().await;
    h.web_nodes(2).await;
    h.run_fake_nodes(Duration::from_millis(50));
    let id = h.put_ds(ds("role=web", 2)).await;
    wait_for(
        &h,
        ObjectKind::Daemonsets,
        &id,
        "Progressing",
        "False",
        "Complete",
    )
    .await;
    // A new manifest: replacing either healthy node would leave fewer than 2 healthy.
    h.edit_ds(&id, |doc| doc["manifest"] = NEW_MANIFEST.into())
        .await;
    let blocked = wait_for(
        &h,
        ObjectKind::Daemonsets,
        &id,
        "Blocked",
        "True",
        "MinHealth",
    )
    .await;
    assert_eq!(
        blocked["message"],
        "2 pods wait for the new manifest: 2 of 2 nodes are healthy and replacing another would go below min_health (2)"
    );
}

/// A roll waiting out its delay counts as progressing, but that is no change to write: its
/// conditions are written once when the wait begins, not on every pass, each of which the
/// write itself would set off again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_waiting_out_its_delay_writes_its_conditions_once() {
    let h = Harness::start().await;
    let (old, new) = rcs_to_roll(&h, 2).await;
    let roll = json!({"OldRC": old, "NewRC": new, "DesiredReplicas": 2, "MinimumReplicas": 1,
                      "LeaveOld": false, "RollDelay": 3_600_000_000_000u64});
    h.store
        .put(
            &layout::roll(&new),
            roll.to_string().as_bytes(),
            Cas::Index(0),
        )
        .await
        .unwrap();
    wait_for(
        &h,
        ObjectKind::Rolls,
        &new,
        "Progressing",
        "True",
        "RollDelay",
    )
    .await;
    let key = layout::conditions(ObjectKind::Rolls, &new);
    let index = || async { h.store.get(&key).await.unwrap().unwrap().modify_index };
    let waiting = index().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        index().await,
        waiting,
        "rewritten while waiting out the delay"
    );
}

/// A roll deleted and created again over the same new RC before a farm pass removed the
/// earlier roll's conditions is another roll: none of its conditions dates from the earlier
/// roll's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_created_again_keeps_nothing_of_the_conditions_before_it() {
    let h = Harness::start().await;
    let (old, new) = rcs_to_roll(&h, 3).await;
    h.put_roll(&old, &new, 3, 3).await;
    let key = layout::roll(&new);
    let stalled_at = |index: u64| {
        let h = &h;
        let new = &new;
        async move {
            h.wait_until(|| async {
                conditions(h, ObjectKind::Rolls, new)
                    .await?
                    .into_iter()
                    .find(|c| c["type"] == "Stalled" && c["observed_index"] == index)
            })
            .await
        }
    };
    let first = h.store.get(&key).await.unwrap().unwrap();
    let earlier = stalled_at(first.modify_index).await;

    h.store
        .txn(&[
            TxnOp::Delete { key: key.clone() },
            TxnOp::Set {
                key: key.clone(),
                value: first.value.to_vec(),
            },
        ])
        .await
        .unwrap();
    let again = h.store.get(&key).await.unwrap().unwrap().modify_index;
    let stalled = stalled_at(again).await;
    assert_eq!(stalled["status"], "False", "{stalled}");
    assert_ne!(
        stalled["last_transition_time"], earlier["last_transition_time"],
        "{stalled}"
    );
}

/// A roll whose RC is stored but cannot be decoded does not end (the RC is there), so its
/// conditions say the RC cannot be read rather than that it is gone and the roll ending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_over_an_unreadable_rc_says_so_rather_than_that_it_is_ending() {
    let h = Harness::start().await;
    let old = h.put_rc(rc_doc(MANIFEST, "role=web", 0)).await;
    let new = h.put_rc(rc_doc(NEW_MANIFEST, "role=web", 0)).await;
    h.store
        .put(&layout::rc(&old), b"not an RC", Cas::Any)
        .await
        .unwrap();
    h.put_roll(&old, &new, 1, 0).await;

    let why = not_progressing_for(&h, &new, "RcUnreadable").await;
    assert!(why.contains(&old), "{why}");
    assert!(h.store.get(&layout::roll(&new)).await.unwrap().is_some());
}
