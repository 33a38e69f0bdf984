//! The roll farm, driven directly against the embedded store (no HTTP).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::farms::{
    alert_webhook, rc_doc, slow_alert_webhook, Backend, Harness, Snapshot, MANIFEST, NEW_MANIFEST,
};
use p2_apiserver::kv::Cas;
use p2_apiserver::labels::LabelType;
use p2_apiserver::layout;
use p2_apiserver::model::event::ObjectKind;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolls_keep_the_minimum_healthy_and_clean_up() {
    let h = Harness::start().await;
    let old = h.healthy_rc(5, 4).await;
    let new = h.put_rc(rc_doc(NEW_MANIFEST, "role=web", 0)).await;
    h.put_roll(&old, &new, 4, 3).await;

    let lowest = AtomicUsize::new(usize::MAX);
    h.wait_until(|| async {
        let healthy = h.healthy_by_rc().await;
        let total = healthy.values().sum::<usize>();
        lowest.fetch_min(total, Ordering::SeqCst);
        let done = h
            .store
            .get(&format!("rolls/{new}"))
            .await
            .unwrap()
            .is_none();
        done.then_some(())
    })
    .await;
    let lowest = lowest.into_inner();
    assert!(lowest >= 3, "healthy pods dropped to {lowest}");
    assert!(h
        .store
        .get(&format!("replication_controllers/{old}"))
        .await
        .unwrap()
        .is_none());
    assert_eq!(h.wait_for_rc_nodes(&new, 4).await.len(), 4);
    assert!(h.rc_nodes(&old).await.is_empty());
    assert!(h
        .store
        .list("lock/replication_controllers/")
        .await
        .unwrap()
        .pairs
        .iter()
        .all(|p| !p.key.ends_with("/update")));
}

/// Starts a roll from `old` (4 replicas) to a fresh RC and waits until the farm holds both
/// RCs' mutation locks; returns the new RC's id.
async fn start_roll(h: &Harness, old: &str, minimum: i64) -> String {
    let new = h.put_rc(rc_doc(NEW_MANIFEST, "role=web", 0)).await;
    let roll = json!({"OldRC": old, "NewRC": new, "DesiredReplicas": 4, "MinimumReplicas": minimum,
                      "LeaveOld": false, "RollDelay": 3_600_000_000_000u64});
    h.put_roll_doc(roll).await;
    h.wait_until(|| async { (mutation_locks(h).await == 2).then_some(()) })
        .await;
    new
}

async fn mutation_locks(h: &Harness) -> usize {
    let locks = h.store.list("lock/replication_controllers/").await.unwrap();
    locks
        .pairs
        .iter()
        .filter(|p| p.key.ends_with("/update"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_roll_frees_both_rcs() {
    let h = Harness::start().await;
    h.web_nodes(5).await;
    let old = h.put_rc(rc_doc(MANIFEST, "role=web", 4)).await;
    h.wait_for_rc_nodes(&old, 4).await;
    // Minimum 4 with nothing healthy: the roll holds its locks but cannot take a step.
    let new = start_roll(&h, &old, 4).await;
    h.store
        .delete(&format!("rolls/{new}"), Cas::Any)
        .await
        .unwrap();
    h.wait_until(|| async { (mutation_locks(&h).await == 0).then_some(()) })
        .await;
    // Both RCs stay as they were.
    assert_eq!(h.rc_nodes(&old).await.len(), 4);
    assert!(h
        .store
        .get(&format!("replication_controllers/{new}"))
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_whose_rc_vanishes_is_cleaned_up() {
    let h = Harness::start().await;
    h.label(LabelType::Node, "node1", json!({"role": "web"}))
        .await;
    let old = h.put_rc(rc_doc(MANIFEST, "role=web", 1)).await;
    let new = start_roll(&h, &old, 1).await;
    h.store
        .delete(&format!("replication_controllers/{old}"), Cas::Any)
        .await
        .unwrap();
    h.wait_until(|| async {
        let gone = h
            .store
            .get(&format!("rolls/{new}"))
            .await
            .unwrap()
            .is_none();
        (gone && mutation_locks(&h).await == 0).then_some(())
    })
    .await;
    let audits = h.store.list("audit_logs/").await.unwrap();
    assert!(audits.pairs.iter().any(|p| {
        let text = String::from_utf8_lossy(&p.value);
        text.contains("ROLLING_UPDATE_COMPLETION") && text.contains("\"canceled\":true")
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_held_at_its_minimum_raises_an_alert() {
    let webhook = alert_webhook().await;
    let h = Harness::start_with_alerts(Some(webhook.uri())).await;
    let old = h.healthy_rc(3, 3).await;
    // A minimum equal to every pod there is: no step can keep it.
    let new = h.put_rc(rc_doc(NEW_MANIFEST, "role=web", 0)).await;
    h.put_roll(&old, &new, 3, 3).await;
    let description = h.alert_about(&webhook, &new).await;
    assert!(
        description.contains("minimum_replicas (3) is not below desired_replicas (3)"),
        "{description}"
    );
    assert_eq!(h.rc_nodes(&old).await.len(), 3);
}

/// A roll between two RCs whose documents, each stored on its own, are too large for one
/// transaction together (manifests of 200 KB: two RC documents pass Consul's 512 KiB in
/// base64) still steps and completes, on every backend.
async fn rolls_rcs_too_large_to_write_together_on(backend: Backend) {
    let h = Harness::start_on(backend, None).await;
    h.web_nodes(2).await;
    h.run_fake_nodes(Duration::from_millis(100));
    let large = |manifest: &str| format!("{manifest}config:\n  blob: {}\n", "x".repeat(200_000));
    let old = h.put_rc(rc_doc(&large(MANIFEST), "role=web", 1)).await;
    h.wait_for_rc_nodes(&old, 1).await;
    let new = h.put_rc(rc_doc(&large(NEW_MANIFEST), "role=web", 0)).await;
    h.put_roll(&old, &new, 1, 0).await;
    let store = &h.store;
    h.wait_until(|| async {
        let roll = store.get(&format!("rolls/{new}")).await.unwrap();
        let old_rc = store
            .get(&format!("replication_controllers/{old}"))
            .await
            .unwrap();
        (roll.is_none() && old_rc.is_none()).then_some(())
    })
    .await;
    assert_eq!(h.wait_for_rc_nodes(&new, 1).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_of_rcs_too_large_to_write_together_completes() {
    rolls_rcs_too_large_to_write_together_on(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_of_rcs_too_large_to_write_together_completes_through_consul() {
    rolls_rcs_too_large_to_write_together_on(Backend::FakeConsul).await;
}

/// A webhook slow to answer holds up no roll: the rolls that cannot move are alerted about
/// while the others go on. Each alert awaited in turn, ten rolls stuck behind another roll
/// over their RC held every roll sorting after them for half a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_alert_webhook_holds_up_no_other_roll() {
    let webhook = slow_alert_webhook(Duration::from_secs(3)).await;
    let h = Harness::start_with_alerts(Some(webhook.uri())).await;
    h.web_nodes(2).await;
    h.run_fake_nodes(Duration::from_millis(50));
    // Eleven rolls from one RC, sorting first: all but the first wait for it, and alert.
    let shared = h.put_rc(rc_doc(MANIFEST, "role=none", 0)).await;
    for i in 0..11 {
        let new = format!("00000000-0000-4000-8000-{i:012}");
        h.put_rc_as(&new, rc_doc(NEW_MANIFEST, "role=none", 0))
            .await;
        h.put_roll(&shared, &new, 1, 0).await;
    }
    let old = h.put_rc(rc_doc(MANIFEST, "role=web", 1)).await;
    h.wait_for_rc_nodes(&old, 1).await;
    let new = "ffffffff-0000-4000-8000-000000000000";
    h.put_rc_as(new, rc_doc(NEW_MANIFEST, "role=web", 0)).await;
    h.put_roll(&old, new, 1, 0).await;
    let store = &h.store;
    h.wait_until(|| async {
        let roll = store.get(&format!("rolls/{new}")).await.unwrap();
        roll.is_none().then_some(())
    })
    .await;
}

/// A roll whose counts are not a roll's (here a negative `DesiredReplicas`, which P2's
/// `schedule-update` stores unchecked) moves nothing: it is stuck, saying why. P2's run of it
/// finishes at once and then refuses to delete an old RC that still wants replicas; this
/// farm, which retires such an old RC, took every one of its pods down and deleted it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_of_impossible_counts_moves_nothing() {
    let h = Harness::start().await;
    let old = h.healthy_rc(2, 2).await;
    let new = h.put_rc(rc_doc(NEW_MANIFEST, "role=web", 0)).await;
    h.put_roll_doc(json!({"OldRC": old, "NewRC": new, "DesiredReplicas": -1,
                          "MinimumReplicas": 0, "LeaveOld": false, "RollDelay": 0}))
        .await;
    let conditions = layout::conditions(ObjectKind::Rolls, &new);
    h.follow(|snapshot| {
        let old_rc = snapshot.rc(&old).expect("the old RC was deleted");
        assert_eq!(old_rc["replicas_desired"], 2, "the old RC was retired");
        assert_eq!(
            snapshot.rc_pods(&old).0,
            2,
            "the old RC's pods were removed"
        );
        let record: serde_json::Value = serde_json::from_slice(snapshot.get(&conditions)?).ok()?;
        let reasons = record["conditions"].as_array()?.iter();
        reasons
            .into_iter()
            .any(|c| c["reason"] == "InvalidCounts")
            .then_some(())
    })
    .await;
}

/// A roll to a new RC that already wants its replicas but has none of them (enabled while
/// the old RC held every node, so its farm could place none) must not disable the old RC:
/// the new RC would then take every old pod at once, below the roll's minimum. It is stuck,
/// saying why; cancelled and created again once the new RC wants no more pods than it has,
/// it keeps the minimum and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_to_a_new_rc_short_of_its_count_keeps_the_minimum() {
    let h = Harness::start().await;
    let old = h.healthy_rc(3, 3).await;
    let new = h.put_rc(rc_doc(NEW_MANIFEST, "role=web", 3)).await;
    h.put_roll(&old, &new, 3, 2).await;
    let conditions = layout::conditions(ObjectKind::Rolls, &new);
    let keeps_the_minimum = |snapshot: &Snapshot| {
        let healthy = snapshot.pods().iter().filter(|(_, ok)| *ok).count();
        assert!(healthy >= 2, "healthy pods dropped to {healthy}");
        healthy
    };
    h.follow(|snapshot| {
        keeps_the_minimum(snapshot);
        let record = snapshot.get(&conditions)?;
        String::from_utf8_lossy(record)
            .contains("\"NewRcOutOfStep\"")
            .then_some(())
    })
    .await;
    assert_eq!(h.rc_nodes(&old).await.len(), 3);

    h.store.delete(&layout::roll(&new), Cas::Any).await.unwrap();
    h.set_replicas(&new, 0).await;
    h.put_roll(&old, &new, 3, 2).await;
    h.follow(|snapshot| {
        let healthy = keeps_the_minimum(snapshot);
        let done = snapshot.get(&layout::roll(&new)).is_none() && snapshot.rc(&old).is_none();
        (done && healthy == 3).then_some(())
    })
    .await;
}

/// A roll that leaves the old RC, to a new RC on other nodes (so no new pod replaces an old
/// one in place), ends with the old RC running its count and no more: once the roll is over
/// the disabled old RC changes nothing, so its pods beyond its count must be gone by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_leaving_the_old_rc_ends_with_it_at_its_count() {
    let h = Harness::start().await;
    let old = h.healthy_rc(3, 3).await;
    for i in 1..=2 {
        h.label(
            LabelType::Node,
            &format!("next{i}"),
            json!({"role": "next"}),
        )
        .await;
    }
    let new = h.put_rc(rc_doc(NEW_MANIFEST, "role=next", 0)).await;
    h.put_roll_doc(json!({"OldRC": old, "NewRC": new, "DesiredReplicas": 2,
                          "MinimumReplicas": 1, "LeaveOld": true, "RollDelay": 0}))
        .await;
    let (desired, pods) = h
        .follow(|snapshot| {
            snapshot.get(&layout::roll(&new)).is_none().then(|| {
                let old_rc = snapshot.rc(&old).expect("the old RC was deleted");
                (old_rc["replicas_desired"].clone(), snapshot.rc_pods(&old).0)
            })
        })
        .await;
    assert_eq!(
        (desired, pods),
        (json!(1), 1),
        "the old RC's count and pods"
    );
    assert_eq!(h.wait_for_rc_nodes(&new, 2).await.len(), 2);
}
