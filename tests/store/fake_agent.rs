//! The fake Consul agent itself, where it must refuse what Consul 0.7 (the oldest Consul the
//! client works with) refuses: a client sending it would pass every test run through the
//! fake and fail against that Consul.

use serde_json::{json, Value};

use crate::support::fake_consul;

/// Consul 0.7 has no `check-not-exists` (0.8 added it): its state store fails the op as an
/// unknown verb, and the transaction rolls back with 409.
#[tokio::test]
async fn a_txn_verb_consul_0_7_lacks_rolls_the_transaction_back() {
    let fake = fake_consul::start().await;
    let ops = json!([
        {"KV": {"Verb": "set", "Key": "k", "Value": "dg=="}},
        {"KV": {"Verb": "check-not-exists", "Key": "other"}},
    ]);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();

    let answer = client
        .put(format!("http://{}/v1/txn", fake.addr))
        .json(&ops)
        .send()
        .await
        .unwrap();

    assert_eq!(answer.status(), 409);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(
        body["Errors"],
        json!([{"OpIndex": 1, "What": "unknown KV verb \"check-not-exists\""}])
    );
    let read = client
        .get(format!("http://{}/v1/kv/k", fake.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 404, "the rolled back set was applied");
}
