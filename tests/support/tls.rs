//! Certificates made at test time, so that no private key is committed: a CA, and server
//! pairs it signs for `localhost` and `127.0.0.1`.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::CertificateDer;
use tempfile::TempDir;

/// A certificate authority whose certificate lies in a file of its own, for clients to trust.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: TempDir,
}

/// A server certificate and its private key, in PEM.
pub struct ServerPair {
    pub cert_pem: String,
    pub key_pem: String,
    /// The certificate as a TLS handshake presents it.
    pub der: CertificateDer<'static>,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("a CA certificate");
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("ca.pem"), issuer.pem()).expect("write the CA");
        TestCa { issuer, dir }
    }

    /// The CA's certificate file (PEM).
    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A new server pair for `localhost` and `127.0.0.1`, signed by this CA.
    pub fn issue(&self) -> ServerPair {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let params = CertificateParams::new(names).expect("server parameters");
        let key = KeyPair::generate().expect("a server key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a server certificate");
        ServerPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }
}

impl ServerPair {
    /// Writes the certificate to `cert` and the key to `key`, replacing what is there.
    pub fn write(&self, cert: &Path, key: &Path) {
        std::fs::write(cert, &self.cert_pem).expect("write the certificate");
        std::fs::write(key, &self.key_pem).expect("write the key");
    }
}

/// Where a test keeps the server's certificate and key files, which it may swap.
pub struct PairFiles {
    dir: TempDir,
}

impl PairFiles {
    /// `pair` written to new files.
    pub fn new(pair: &ServerPair) -> PairFiles {
        let files = PairFiles {
            dir: tempfile::tempdir().expect("temp dir"),
        };
        pair.write(&files.cert(), &files.key());
        files
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// Replaces the files with `pair`, as an operator renewing the certificate would.
    pub fn swap(&self, pair: &ServerPair) {
        pair.write(&self.cert(), &self.key());
    }
}
