//! What the farms record beside P2's trees: their events (with the farm and the leader as
//! the actor), the finished record of the rolls they end, and the retention of both.

use std::time::{Duration, SystemTime};

use crate::support::farms::{rc_doc, Harness, MANIFEST, NEW_MANIFEST};
use p2_apiserver::kv::Cas;
use p2_apiserver::labels::LabelType;
use p2_apiserver::model::event::{new_event_id, Event};
use p2_apiserver::store::events::Retention;
use serde_json::{json, Value};

/// Every stored event, oldest first.
async fn events(h: &Harness) -> Vec<Event> {
    let listing = h.store.list("p2-apiserver/events/").await.unwrap();
    listing
        .pairs
        .iter()
        .map(|pair| Event::from_json(&pair.value).unwrap())
        .collect()
}

/// The finished record of roll `id`, once there is one.
async fn finished(h: &Harness, id: &str) -> Value {
    let key = format!("p2-apiserver/history/rolls/{id}");
    h.wait_until(|| async {
        let pair = h.store.get(&key).await.unwrap()?;
        Some(serde_json::from_slice::<Value>(&pair.value).unwrap())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_the_farm_completes_is_recorded_as_succeeded_with_farm_events() {
    let h = Harness::start().await;
    let old = h.healthy_rc(3, 2).await;
    let new = h.put_rc(rc_doc(NEW_MANIFEST, "role=web", 0)).await;
    h.put_roll(&old, &new, 2, 1).await;

    let done = finished(&h, &new).await;
    assert_eq!(done["outcome"], "succeeded");
    assert_eq!(done["roll"]["old_rc"], old.as_str());
    assert_eq!(done["progress"]["new"]["desired"], 2);
    assert!(done["ended"].is_string());
    // Created behind this server's back: no start time is known.
    assert!(done["started"].is_null());

    let events = events(&h).await;
    let by = |actor: &str, action: &str, kind: &str, id: &str| {
        events.iter().any(|e| {
            e.actor == actor
                && serde_json::to_value(e.action).unwrap() == action
                && e.kind.as_str() == kind
                && e.object_id == id
        })
    };
    assert!(by("farm:rc@test", "scheduled", "rcs", &old), "{events:#?}");
    assert!(by("farm:rc@test", "scheduled", "rcs", &new));
    assert!(by("farm:roll@test", "updated", "rcs", &new));
    assert!(by("farm:roll@test", "deleted", "rcs", &old));
    assert!(by("farm:roll@test", "succeeded", "rolls", &new));
    let step = events
        .iter()
        .find(|e| e.actor == "farm:roll@test" && e.object_id == new)
        .unwrap();
    assert!(step.request_id.is_none());
    // P2's completion record is still written where P2 writes it.
    let audit = h.store.list("audit_logs/").await.unwrap();
    assert!(audit.pairs.iter().any(|pair| {
        let record: Value = serde_json::from_slice(&pair.value).unwrap();
        record["event_type"] == "ROLLING_UPDATE_COMPLETION"
            && record["event_details"]["succeeded"] == true
    }));
}

/// A roll to fewer replicas than the old RC wants leaves it some, which the farm sets to 0
/// at completion: a change of the RC's document like any step, with its event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retiring_a_shrinking_rolls_old_rc_is_recorded() {
    let h = Harness::start().await;
    let old = h.healthy_rc(3, 3).await;
    let new = h.put_rc(rc_doc(NEW_MANIFEST, "role=web", 0)).await;
    h.put_roll(&old, &new, 2, 1).await;

    assert_eq!(finished(&h, &new).await["outcome"], "succeeded");
    let events = events(&h).await;
    let retired = events.iter().any(|e| {
        e.actor == "farm:roll@test"
            && e.object_id == old
            && serde_json::to_value(e.action).unwrap() == "updated"
            && e.changes
                .iter()
                .any(|c| c.field == "replicas_desired" && c.after == 0)
    });
    assert!(
        retired,
        "no event sets the old RC's count to 0: {events:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_whose_rc_is_deleted_underneath_is_recorded_as_failed() {
    let h = Harness::start().await;
    h.web_nodes(2).await;
    let old = h.put_rc(rc_doc(MANIFEST, "role=web", 0)).await;
    let new = h.put_rc(rc_doc(NEW_MANIFEST, "role=web", 0)).await;
    h.put_roll(&old, &new, 5, 5).await;
    h.store
        .delete(&format!("replication_controllers/{old}"), Cas::Any)
        .await
        .unwrap();

    let done = finished(&h, &new).await;
    assert_eq!(done["outcome"], "failed");
    assert!(done["progress"]["old"]["desired"].is_null());
    let failed = events(&h)
        .await
        .into_iter()
        .find(|e| e.object_id == new && e.kind.as_str() == "rolls");
    let failed = failed.expect("an event of the roll");
    assert_eq!(serde_json::to_value(failed.action).unwrap(), "failed");
    assert_eq!(failed.actor, "farm:roll@test");
    assert!(failed.message.unwrap().contains("deleted"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_prunes_by_count_and_age_and_removes_times_of_gone_objects() {
    let retention = Retention {
        count: 3,
        age: Duration::from_secs(3600),
    };
    let h = Harness::start_with_retention(retention).await;
    let now = SystemTime::now();
    let put_event = |time: SystemTime| {
        let id = new_event_id(time);
        let store = h.store.clone();
        async move {
            let event = json!({"id": id, "time": "", "actor": "someone", "action": "updated",
                               "kind": "rcs", "object_id": "x", "request_id": null, "changes": []});
            store
                .put(
                    &format!("p2-apiserver/events/{id}"),
                    event.to_string().as_bytes(),
                    Cas::Any,
                )
                .await
                .unwrap();
            id
        }
    };
    // Two past the age, then five recent ones: only the newest three recent ones stay.
    put_event(now - Duration::from_secs(7200)).await;
    put_event(now - Duration::from_secs(4000)).await;
    let mut recent = Vec::new();
    for i in (1..=5).rev() {
        recent.push(put_event(now - Duration::from_secs(i * 10)).await);
    }
    // Times of an RC that does not exist, as P2's tools leave them by deleting the RC.
    let orphan = "p2-apiserver/meta/rcs/5a0e3b8c-1f2d-4e5f-8a9b-0c1d2e3f4a5b";
    h.store
        .put(
            orphan,
            br#"{"created":null,"modified":"2024-01-01T00:00:00Z"}"#,
            Cas::Any,
        )
        .await
        .unwrap();

    let kept = h
        .wait_until(|| async {
            let ids: Vec<String> = events(&h).await.into_iter().map(|e| e.id).collect();
            (ids.len() == 3).then_some(ids)
        })
        .await;
    assert_eq!(kept, recent[2..]);
    h.wait_until(|| async { h.store.get(orphan).await.unwrap().is_none().then_some(()) })
        .await;

    // Finished rolls are kept within the same bounds.
    for (i, ended) in ["2001-01-01T00:00:00Z", "2099-01-01T00:00:00Z"]
        .iter()
        .enumerate()
    {
        let record = json!({"roll": {"old_rc": "a", "new_rc": "b", "desired_replicas": 1,
                                     "minimum_replicas": 0, "leave_old": false, "roll_delay": "0s"},
                            "labels": {}, "outcome": "succeeded", "started": null,
                            "ended": ended, "progress": {
                                "old": {"desired": 0, "current": 0, "real": 0, "healthy": 0, "unknown": 0, "unhealthy": 0},
                                "new": {"desired": 1, "current": 1, "real": 1, "healthy": 1, "unknown": 0, "unhealthy": 0}}});
        h.store
            .put(
                &format!("p2-apiserver/history/rolls/{i}"),
                record.to_string().as_bytes(),
                Cas::Any,
            )
            .await
            .unwrap();
    }
    h.wait_until(|| async {
        let listing = h.store.list("p2-apiserver/history/rolls/").await.unwrap();
        let keys: Vec<String> = listing.pairs.into_iter().map(|p| p.key).collect();
        (keys == ["p2-apiserver/history/rolls/1"]).then_some(())
    })
    .await;
}

/// The `nodes` change of each `scheduled` event of `kind` object `id`, oldest first: the
/// nodes it left and those it was placed on, each sorted.
async fn moves(h: &Harness, kind: &str, id: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let sorted = |nodes: &Value| {
        let mut nodes: Vec<String> = serde_json::from_value(nodes.clone()).unwrap();
        nodes.sort();
        nodes
    };
    events(h)
        .await
        .iter()
        .filter(|e| {
            serde_json::to_value(e.action).unwrap() == "scheduled"
                && serde_json::to_value(e.kind).unwrap() == kind
                && e.object_id == id
        })
        .map(|e| {
            assert_eq!(e.changes.len(), 1, "{e:?}");
            assert_eq!(e.changes[0].field, "nodes");
            (sorted(&e.changes[0].before), sorted(&e.changes[0].after))
        })
        .collect()
}

/// A `scheduled` event names the nodes that changed, not every node its RC or daemon set is
/// on: an object on thousands of nodes would otherwise write events of thousands of names for
/// every batch of its rollout (and pass what a Consul transaction may carry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_event_names_only_the_nodes_that_changed() {
    let h = Harness::start().await;
    h.web_nodes(4).await;
    let id = h.put_rc(rc_doc(MANIFEST, "role=web", 2)).await;
    let first = h.wait_for_rc_nodes(&id, 2).await;
    h.set_replicas(&id, 3).await;
    let grown = h.wait_for_rc_nodes(&id, 3).await;
    h.set_replicas(&id, 1).await;
    let kept = h.wait_for_rc_nodes(&id, 1).await;
    let not_in = |all: &[String], some: &[String]| -> Vec<String> {
        all.iter().filter(|n| !some.contains(n)).cloned().collect()
    };
    assert_eq!(
        moves(&h, "rcs", &id).await,
        [
            (vec![], first.clone()),
            (vec![], not_in(&grown, &first)),
            (not_in(&grown, &kept), vec![]),
        ]
    );

    let ds = json!({"disabled": false, "manifest": NEW_MANIFEST, "min_health": 0,
                    "cluster_name": "production", "node_selector": "role=db",
                    "pod_id": "hello", "timeout": 60_000_000_000_u64});
    h.label(LabelType::Node, "db1", json!({"role": "db"})).await;
    h.label(LabelType::Node, "db2", json!({"role": "db"})).await;
    let ds = h.put_ds(ds).await;
    h.wait_until(|| async {
        (h.labelled_nodes("daemon_set_id", &ds).await.len() == 2).then_some(())
    })
    .await;
    h.label(LabelType::Node, "db3", json!({"role": "db"})).await;
    h.wait_until(|| async {
        (h.labelled_nodes("daemon_set_id", &ds).await.len() == 3).then_some(())
    })
    .await;
    let both = vec!["db1".to_owned(), "db2".to_owned()];
    assert_eq!(
        moves(&h, "daemonsets", &ds).await,
        [(vec![], both), (vec![], vec!["db3".to_owned()])]
    );
}
