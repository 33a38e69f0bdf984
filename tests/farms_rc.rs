//! The RC farm, driven directly against the embedded store (no HTTP).

mod farm_support;

use std::time::Duration;

use farm_support::{Harness, MANIFEST};
use p2_apiserver::labels::LabelType;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_scales_down_and_moves_pods() {
    let h = Harness::start().await;
    for i in 1..=5 {
        let role = if i <= 4 { "web" } else { "db" };
        h.label(LabelType::Node, &format!("node{i}"), json!({"role": role}))
            .await;
    }
    let id = h
        .put_rc(json!({"manifest": MANIFEST, "node_selector": "role=web", "pod_labels": {"app": "hello"},
                       "replicas_desired": 3, "disabled": false, "allocation_strategy": "dynamic_strategy"}))
        .await;
    let nodes = h.wait_for_rc_nodes(&id, 3).await;
    assert!(nodes.iter().all(|n| n != "node5"), "{nodes:?}");
    let pod = h.pod_labels(&nodes[0], "hello").await;
    assert_eq!(pod["replication_controller_id"], id.as_str());
    assert_eq!(pod["pod_id"], "hello");
    assert_eq!(pod["app"], "hello");
    assert_eq!(
        h.intent(&nodes[0], "hello").await.as_deref(),
        Some(MANIFEST)
    );

    // Relabelling a node moves its pod (dynamic strategy).
    h.label(LabelType::Node, &nodes[0], json!({"role": "db"}))
        .await;
    let moved = h
        .wait_until(|| async {
            let now = h.rc_nodes(&id).await;
            (now.len() == 3 && !now.contains(&nodes[0])).then_some(now)
        })
        .await;
    assert!(h.intent(&nodes[0], "hello").await.is_none());

    // Scaling down removes pods from ineligible nodes first.
    h.label(LabelType::Node, &moved[0], json!({"role": "db"}))
        .await;
    h.set_replicas(&id, 2).await;
    let after = h.wait_for_rc_nodes(&id, 2).await;
    assert!(
        !after.contains(&moved[0]),
        "{after:?} still has {}",
        moved[0]
    );
    assert!(h.audit_records().await >= 3);
    drop(h);
    tokio::time::sleep(Duration::from_millis(10)).await;
}
