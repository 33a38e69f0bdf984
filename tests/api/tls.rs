//! HTTPS end to end: the server on a real socket with certificates made for the test, and
//! clients that trust (or do not trust) their CA.

use std::sync::Arc;
use std::time::Duration;

use p2_apiserver::app::HttpLimits;
use p2_apiserver::error::ErrorBody;
use p2_apiserver::server::Tls;
use p2_apiserver::simulator::client_trusting;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::support::api::{Served, TestApp};
use crate::support::tls::{PairFiles, TestCa};

/// How long a test waits for the server to answer or close before calling it hung; far
/// longer than any limit the tests set.
const HANG: Duration = Duration::from_secs(30);

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";

/// Serves a fresh app over HTTPS with the pair in `files`.
async fn serve_https(app: &TestApp, files: &PairFiles, limits: HttpLimits) -> (Arc<Tls>, Served) {
    let tls = Arc::new(Tls::load(&files.cert(), &files.key()).expect("a usable pair"));
    let served = app.serve(Some(tls.clone()), limits).await;
    (tls, served)
}

/// `GET url` with a new client, so over a new connection, trusting `ca` when given.
async fn get(ca: Option<&TestCa>, url: &str) -> reqwest::Result<(u16, String)> {
    let client = client_trusting(ca.map(|ca| ca.cert_path()).as_deref())
        .expect("a client")
        .build()?;
    let response = client.get(url).timeout(HANG).send().await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

/// A new TLS connection to `served` for `localhost`, trusting `ca` only.
async fn connect_tls(served: &Served, ca: &TestCa) -> TlsStream<TcpStream> {
    let mut roots = RootCertStore::empty();
    let pem = std::fs::read(ca.cert_path()).unwrap();
    let ca_der = rustls::pki_types::pem::PemObject::from_pem_slice(&pem).unwrap();
    roots.add(ca_der).unwrap();
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = TcpStream::connect(served.addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(
        HANG,
        TlsConnector::from(Arc::new(config)).connect(name, tcp),
    )
    .await
    .expect("the handshake hung")
    .expect("the handshake")
}

/// The certificate the server presents to a new connection.
async fn presented(served: &Served, ca: &TestCa) -> CertificateDer<'static> {
    let conn = connect_tls(served, ca).await;
    conn.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// Everything the server sends until it closes the connection.
async fn read_until_closed(conn: &mut (impl AsyncRead + Unpin)) -> String {
    let mut received = Vec::new();
    let read = tokio::time::timeout(HANG, conn.read_to_end(&mut received))
        .await
        .expect("the server left the connection open");
    // A reset also closes it; what came before still counts.
    if let Err(e) = read {
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
            ),
            "{e}"
        );
    }
    String::from_utf8(received).unwrap()
}

/// The status and error reason of a whole answer that ends the connection.
fn status_and_reason(answer: &str) -> (u16, String) {
    let (head, body) = answer.split_once("\r\n\r\n").expect("a whole answer");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let error: ErrorBody = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (status, error.reason)
}

#[tokio::test]
async fn https_is_served_to_clients_that_trust_the_certificate() {
    let app = TestApp::new().await;
    let ca = TestCa::new("p2 test CA");
    let files = PairFiles::new(&ca.issue());
    let (_tls, served) = serve_https(&app, &files, HttpLimits::default()).await;
    assert!(served.url.starts_with("https://"));

    let (status, body) = get(Some(&ca), &format!("{}/healthz", served.url))
        .await
        .unwrap();
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
    let (status, _) = get(Some(&ca), &format!("{}/api/v1/rcs", served.url))
        .await
        .unwrap();
    assert_eq!(status, 200);
    // The certificate is for localhost and 127.0.0.1 alike.
    let by_name = served.url.replace("127.0.0.1", "localhost");
    assert_eq!(
        get(Some(&ca), &format!("{by_name}/healthz"))
            .await
            .unwrap()
            .0,
        200
    );

    // A client that does not trust the CA refuses the server.
    let untrusting = get(None, &format!("{}/healthz", served.url)).await;
    assert!(untrusting.is_err(), "{untrusting:?}");
}

#[tokio::test]
async fn the_http_layers_own_errors_keep_the_json_body_over_tls() {
    let app = TestApp::new().await;
    let ca = TestCa::new("p2 test CA");
    let files = PairFiles::new(&ca.issue());
    let (_tls, served) = serve_https(&app, &files, HttpLimits::default()).await;
    let mut conn = connect_tls(&served, &ca).await;
    conn.write_all(b"NOT AN HTTP REQUEST\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut conn).await;
    assert_eq!(status_and_reason(&answer), (400, "BadRequest".into()));
}

#[tokio::test]
async fn plain_http_to_the_https_port_is_answered_400_and_closed() {
    let app = TestApp::new().await;
    let ca = TestCa::new("p2 test CA");
    let files = PairFiles::new(&ca.issue());
    let (_tls, served) = serve_https(&app, &files, HttpLimits::default()).await;
    let mut conn = TcpStream::connect(served.addr).await.unwrap();
    conn.write_all(HEALTHZ).await.unwrap();
    let answer = read_until_closed(&mut conn).await;
    assert_eq!(status_and_reason(&answer), (400, "BadRequest".into()));
    assert!(answer.contains("https://"), "{answer}");

    let http_url = served.url.replace("https://", "http://");
    let (status, _) = get(Some(&ca), &format!("{http_url}/healthz"))
        .await
        .unwrap();
    assert_eq!(status, 400);
}

/// Past `--max-connections`, a connection to the HTTPS port is closed unanswered: the
/// plain-HTTP 503 of the HTTP port would reach a TLS client as a corrupt record.
#[tokio::test]
async fn past_the_connection_cap_an_https_connection_is_closed_unanswered() {
    let app = TestApp::new().await;
    let ca = TestCa::new("p2 test CA");
    let files = PairFiles::new(&ca.issue());
    let limits = HttpLimits {
        max_connections: 1,
        // Long enough that the held connection stays for the whole test.
        header_read_timeout: Duration::from_secs(600),
        ..HttpLimits::default()
    };
    let (_tls, served) = serve_https(&app, &files, limits).await;
    let _held = connect_tls(&served, &ca).await;

    let mut refused = TcpStream::connect(served.addr).await.unwrap();
    let answer = read_until_closed(&mut refused).await;
    assert_eq!(answer, "", "plain bytes sent to a TLS client");
}

#[tokio::test]
async fn silent_and_stalled_tls_handshakes_are_closed_at_the_header_read_timeout() {
    let app = TestApp::new().await;
    let ca = TestCa::new("p2 test CA");
    let files = PairFiles::new(&ca.issue());
    let limits = HttpLimits {
        header_read_timeout: Duration::from_millis(200),
        ..HttpLimits::default()
    };
    let (_tls, served) = serve_https(&app, &files, limits).await;
    let mut silent = TcpStream::connect(served.addr).await.unwrap();
    assert_eq!(read_until_closed(&mut silent).await, "");
    // The start of a TLS record (a handshake, version, then a length it never fills).
    let mut stalled = TcpStream::connect(served.addr).await.unwrap();
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    assert_eq!(read_until_closed(&mut stalled).await, "");
    // The server still serves.
    let (status, _) = get(Some(&ca), &format!("{}/healthz", served.url))
        .await
        .unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_reloaded_pair_is_presented_to_new_connections_and_a_bad_one_is_refused() {
    let app = TestApp::new().await;
    let ca = TestCa::new("p2 test CA");
    let (first, second) = (ca.issue(), ca.issue());
    let files = PairFiles::new(&first);
    let (tls, served) = serve_https(&app, &files, HttpLimits::default()).await;
    assert_eq!(presented(&served, &ca).await, first.der);
    let mut open = connect_tls(&served, &ca).await;

    files.swap(&second);
    tls.reload().unwrap();
    assert_eq!(presented(&served, &ca).await, second.der);
    // A connection made before keeps its session.
    open.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut open).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // A certificate with another pair's key, and a file that is no PEM: each refused, the
    // pair in force kept.
    let third = ca.issue();
    std::fs::write(files.cert(), &third.cert_pem).unwrap();
    std::fs::write(files.key(), &first.key_pem).unwrap();
    let error = format!("{:#}", tls.reload().unwrap_err());
    assert!(error.contains("does not go with"), "{error}");
    std::fs::write(files.cert(), "not a certificate").unwrap();
    std::fs::write(files.key(), &third.key_pem).unwrap();
    let error = format!("{:#}", tls.reload().unwrap_err());
    assert!(error.contains("no certificate"), "{error}");
    assert_eq!(presented(&served, &ca).await, second.der);

    // The same refusals when starting.
    assert!(Tls::load(&files.cert(), &files.key()).is_err());
}
