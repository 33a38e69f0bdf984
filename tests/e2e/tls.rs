//! The binary serving HTTPS: the simulator and the API client over TLS, and the certificate
//! swapped on disk and re-read on SIGHUP.

use p2_apiserver::simulator::client_trusting;

use crate::scenarios::{create_rc, rc_settles};
use crate::support::e2e::{eventually, labels, Scratch, Server, Sim, CONVERGE};
use crate::support::tls::{PairFiles, TestCa};

/// Whether a new client trusting only `ca` gets 200 from `GET url`.
async fn trusted_by(ca: &TestCa, url: &str) -> bool {
    let client = client_trusting(Some(&ca.cert_path()))
        .unwrap()
        .build()
        .unwrap();
    match client.get(url).send().await {
        Ok(response) => response.status() == reqwest::StatusCode::OK,
        Err(_) => false,
    }
}

/// Waits until the server has logged `text`.
async fn logs(server: &Server, text: &str) {
    eventually(&format!("the log line {text:?}"), CONVERGE, || async {
        if server.logged(text) {
            Ok(())
        } else {
            Err("not logged yet".to_owned())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_works_over_https_and_sighup_swaps_the_certificate() {
    let scratch = Scratch::new();
    let (old_ca, new_ca) = (TestCa::new("old CA"), TestCa::new("new CA"));
    let files = PairFiles::new(&old_ca.issue());
    let server = Server::start_https("solo", &scratch.db(), &files, &old_ca, &[]);
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let api = server.api();
    let _web = Sim::start(&api, "web", 2, labels(&[("role", "web")])).await;
    let rc = create_rc(&api, 1, "role=web", 2, "static_strategy").await;
    rc_settles(&api, &rc, 2, 1).await;

    let healthz = format!("{}/healthz", server.url);
    assert!(trusted_by(&old_ca, &healthz).await);
    assert!(!trusted_by(&new_ca, &healthz).await);
    files.swap(&new_ca.issue());
    server.signal("HUP");
    logs(&server, "TLS certificate and key re-read").await;
    assert!(trusted_by(&new_ca, &healthz).await);
    assert!(!trusted_by(&old_ca, &healthz).await);

    // An unusable pair is logged and leaves the new one in force.
    std::fs::write(files.key(), "not a key").unwrap();
    server.signal("HUP");
    logs(&server, "keeping the previous TLS certificate").await;
    assert!(trusted_by(&new_ca, &healthz).await);
}
