//! The roll farm, driven directly against the embedded store (no HTTP).

mod farm_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use farm_support::{Harness, MANIFEST};
use p2_apiserver::labels::LabelType;
use p2_apiserver::store::Cas;
use serde_json::json;

const NEW_MANIFEST: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_2.tar.gz\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolls_keep_the_minimum_healthy_and_clean_up() {
    let h = Harness::start().await;
    for i in 1..=5 {
        h.label(LabelType::Node, &format!("node{i}"), json!({"role": "web"}))
            .await;
    }
    h.run_fake_nodes(Duration::from_millis(100));
    let rc = |manifest: &str, replicas: i64| {
        json!({"manifest": manifest, "node_selector": "role=web", "pod_labels": {},
               "replicas_desired": replicas, "disabled": false, "allocation_strategy": ""})
    };
    let old = h.put_rc(rc(MANIFEST, 4)).await;
    h.wait_for_rc_nodes(&old, 4).await;
    h.wait_until(|| async { (h.healthy_by_rc().await.get(&old) == Some(&4)).then_some(()) })
        .await;
    let new = h.put_rc(rc(NEW_MANIFEST, 0)).await;
    let roll = json!({"OldRC": old, "NewRC": new, "DesiredReplicas": 4, "MinimumReplicas": 3,
                      "LeaveOld": false, "RollDelay": 0});
    h.store
        .put(
            &format!("rolls/{new}"),
            roll.to_string().as_bytes(),
            Cas::Index(0),
        )
        .await
        .unwrap();

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
