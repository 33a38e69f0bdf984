//! HTTPS: the certificate and key come from PEM files and can be re-read while serving.
//!
//! One rustls configuration serves every connection; its certificate resolver hands out the
//! pair read last, so a reload takes effect from the next handshake on while connections
//! already open keep theirs. A pair that cannot be used is refused whole, at start or on
//! reload, and a refused reload leaves the pair in force as it was.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use anyhow::Context;
use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The server's TLS identity, read from `cert` and `key`, and what accepts connections with
/// it.
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    current: Arc<CurrentPair>,
    acceptor: TlsAcceptor,
}

/// How a connection to the HTTPS port began.
pub(super) enum Handshake {
    /// A TLS client, now past the handshake.
    Done(Box<TlsStream<TcpStream>>),
    /// A client speaking something else, most likely plain HTTP, not yet read from.
    NotTls(TcpStream),
}

impl Tls {
    /// Reads the certificate chain (`cert`, PEM, the server's own certificate first) and its
    /// private key (`key`, PEM: PKCS#8, PKCS#1 or SEC1).
    pub fn load(cert: &Path, key: &Path) -> anyhow::Result<Tls> {
        let provider = Arc::new(ring::default_provider());
        let current = Arc::new(CurrentPair(RwLock::new(Arc::new(read_pair(
            cert, key, &provider,
        )?))));
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("setting up TLS")?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        // The server speaks HTTP/1.1 only; saying so lets a client that offers HTTP/2 fall
        // back instead of failing.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Re-reads the certificate and key files; new connections get the new pair. On error
    /// the pair in force stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let provider = ring::default_provider();
        let pair = read_pair(&self.cert, &self.key, &provider)?;
        *self
            .current
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(pair);
        Ok(())
    }

    /// The certificate file, for the log.
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// Runs the server's side of the TLS handshake, unless the client's first byte shows it
    /// is not speaking TLS. The caller bounds the time this takes.
    pub(super) async fn handshake(&self, stream: TcpStream) -> io::Result<Handshake> {
        let mut first = [0; 1];
        // Zero bytes: the client left before saying anything.
        if stream.peek(&mut first).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if first[0] != TLS_HANDSHAKE_RECORD {
            return Ok(Handshake::NotTls(stream));
        }
        let tls = self.acceptor.accept(stream).await?;
        Ok(Handshake::Done(Box::new(tls)))
    }
}

/// The pair every new handshake uses; replaced whole on reload.
#[derive(Debug)]
struct CurrentPair(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentPair {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

/// A certificate chain and the private key of its first certificate, checked to match.
fn read_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> anyhow::Result<CertifiedKey> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading the TLS certificate {}", cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!("no certificate in {} (PEM expected)", cert.display());
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the TLS private key {}", key.display()))?;
    CertifiedKey::from_der(chain, private, provider).with_context(|| {
        format!(
            "the TLS private key {} does not go with the certificate {}",
            key.display(),
            cert.display()
        )
    })
}
