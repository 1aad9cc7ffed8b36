//! TLS for the test server: a certificate authority generated at test time ([`TestCa`]), server
//! certificates it signs (valid for 127.0.0.1 and `localhost`, expired, or for another host), and
//! the server side of the handshake ([`ServerTls`], set in [`crate::ServerConfig::tls`]).
//!
//! Nothing is read from or kept on disk except what a test writes itself (the CA for a client's
//! `tlsCAFile`, [`TestCa::write_ca_file`]).

use std::io;
use std::path::Path;
use std::sync::Arc;

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::TlsAcceptor;

/// A certificate authority made for one test run: its certificate and the key it signs with.
pub struct TestCa {
    certificate: CertificateDer<'static>,
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl core::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// Which server certificate to present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerCertificate {
    /// Valid now, for `127.0.0.1` and `localhost`.
    Valid,
    /// For `127.0.0.1` and `localhost`, but valid only during the year 2000.
    Expired,
    /// Valid now, but for these names only (e.g. `db.example.com`), not for 127.0.0.1.
    ForHosts(Vec<String>),
}

impl TestCa {
    /// A new CA with a fresh key.
    pub fn new() -> Result<TestCa, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "retry-testkit test CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let certificate = params.self_signed(&key)?;
        Ok(TestCa {
            pem: certificate.pem(),
            certificate: certificate.der().clone(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM-encoded (what a client's `tlsCAFile` holds).
    pub fn ca_pem(&self) -> &str {
        &self.pem
    }

    /// The CA certificate, DER-encoded.
    pub fn ca_der(&self) -> &CertificateDer<'static> {
        &self.certificate
    }

    /// Writes [`TestCa::ca_pem`] to `path`.
    pub fn write_ca_file(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, &self.pem)
    }

    /// A server certificate of the given kind, signed by this CA, and its private key.
    pub fn issue(
        &self,
        kind: &ServerCertificate,
    ) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), rcgen::Error> {
        let names = match kind {
            ServerCertificate::Valid | ServerCertificate::Expired => {
                vec!["127.0.0.1".to_string(), "localhost".to_string()]
            }
            ServerCertificate::ForHosts(hosts) => hosts.clone(),
        };
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "retry-testkit server");
        if *kind == ServerCertificate::Expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let certificate = params.signed_by(&key, &self.issuer)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((certificate.der().clone(), key))
    }

    /// A client certificate signed by this CA and its key, PEM-encoded in one string (what a
    /// client's `tlsCertificateKeyFile` holds).
    pub fn client_certificate_key_pem(&self) -> Result<String, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "retry-testkit client");
        let certificate = params.signed_by(&key, &self.issuer)?;
        Ok(format!("{}{}", certificate.pem(), key.serialize_pem()))
    }

    /// Like [`TestCa::server_tls`], and the server requires a client certificate from this CA.
    pub fn server_tls_requiring_client(&self, kind: &ServerCertificate) -> io::Result<ServerTls> {
        let (certificate, key) = self.issue(kind).map_err(io::Error::other)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.certificate.clone())
            .map_err(io::Error::other)?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(io::Error::other)?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![certificate, self.certificate.clone()], key)
            .map_err(io::Error::other)?;
        Ok(ServerTls::from_config(Arc::new(config)))
    }

    /// The server side of TLS with a certificate of the given kind from this CA.
    pub fn server_tls(&self, kind: &ServerCertificate) -> io::Result<ServerTls> {
        let (certificate, key) = self.issue(kind).map_err(io::Error::other)?;
        ServerTls::new(vec![certificate, self.certificate.clone()], key)
    }
}

/// The server side of TLS: a certificate chain and its key. Compared by identity.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: TlsAcceptor,
    config: Arc<rustls::ServerConfig>,
}

impl ServerTls {
    /// A server presenting `chain` (leaf first) with `key`; no client certificate is asked for
    /// ([`TestCa::server_tls_requiring_client`] asks for one).
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> io::Result<ServerTls> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
            .map_err(io::Error::other)?;
        Ok(ServerTls::from_config(Arc::new(config)))
    }

    fn from_config(config: Arc<rustls::ServerConfig>) -> ServerTls {
        ServerTls {
            acceptor: TlsAcceptor::from(config.clone()),
            config,
        }
    }

    /// A server presenting the PEM certificate chain and key in these files (`retry-lab serve
    /// --tls-cert`).
    pub fn from_pem_files(chain: &Path, key: &Path) -> io::Result<ServerTls> {
        use rustls::pki_types::pem::PemObject;
        let chain = CertificateDer::pem_file_iter(chain)
            .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        ServerTls::new(chain, key)
    }

    pub(crate) fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }
}

impl core::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl PartialEq for ServerTls {
    fn eq(&self, other: &ServerTls) -> bool {
        Arc::ptr_eq(&self.config, &other.config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_signs_every_kind_of_server_certificate() {
        let ca = TestCa::new().unwrap();
        assert!(ca.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        for kind in [
            ServerCertificate::Valid,
            ServerCertificate::Expired,
            ServerCertificate::ForHosts(vec!["db.example.com".into()]),
        ] {
            let tls = ca.server_tls(&kind).unwrap();
            assert_eq!(tls, tls.clone());
        }
    }
}
