//! TLS for every runtime (TL-1, TL-2): the `tls*` URI options, the rustls client configuration
//! they make, and one TLS layer over any runtime's [`Socket`].
//!
//! rustls's connection is itself sans-IO, so the layer is written once here and both adapters
//! get it unchanged (rule 4): [`TlsRuntime`] wraps a runtime and runs the TLS handshake, with SNI,
//! inside `connect`, so certificate and host-name errors fail the connect. Those errors, and every
//! other TLS protocol error, are reported as [`TlsError`] inside an `io::Error`, which
//! [`crate::classify_io_error`] turns into [`NetworkErrorKind::TlsCertificate`]: never labelled as
//! overload (HS-9), and its message names the cause.
//!
//! Roots: the certificates of `tlsCAFile` if given, else Mozilla's (`webpki-roots`), the same on
//! every platform. rustls checks neither OCSP nor revocation lists, so
//! `tlsDisableOCSPEndpointCheck` and `tlsDisableCertificateRevocationCheck` change nothing.
//!
//! [`NetworkErrorKind::TlsCertificate`]: retry_core::error::NetworkErrorKind::TlsCertificate

use core::fmt;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use retry_core::time::Instant;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore,
};

use crate::options::OptionsError;
use crate::runtime::{AsyncTimer, BoxFuture, Runtime, Socket};
use crate::srv::SrvRecord;

/// The TLS settings of a client (TL-2). [`Default`] is the secure default: Mozilla's roots,
/// certificates and host names verified, no client certificate.
///
/// Built with [`Default`] (or [`TlsOptions::insecure`]) and the `with_*` methods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsOptions {
    /// `tlsCAFile`: PEM certificates to trust instead of the default roots.
    pub ca_file: Option<PathBuf>,
    /// `tlsCertificateKeyFile`: the client's PEM certificate chain and private key, in one file.
    pub certificate_key_file: Option<PathBuf>,
    /// `tlsAllowInvalidCertificates`: accept any server certificate (expired, self-signed, from
    /// an unknown CA, for another host). The handshake's signatures are still checked against the
    /// key the certificate holds.
    pub allow_invalid_certificates: bool,
    /// `tlsAllowInvalidHostnames`: accept a certificate valid for another host name; everything
    /// else is still verified.
    pub allow_invalid_hostnames: bool,
}

impl TlsOptions {
    /// These options, trusting the PEM certificates of `path` instead of the default roots
    /// (`tlsCAFile`).
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> TlsOptions {
        self.ca_file = Some(path.into());
        self
    }

    /// These options, presenting the PEM certificate chain and key of `path`
    /// (`tlsCertificateKeyFile`).
    pub fn with_certificate_key_file(mut self, path: impl Into<PathBuf>) -> TlsOptions {
        self.certificate_key_file = Some(path.into());
        self
    }

    /// These options, accepting any server certificate or not (`tlsAllowInvalidCertificates`).
    pub fn with_allow_invalid_certificates(mut self, allow: bool) -> TlsOptions {
        self.allow_invalid_certificates = allow;
        self
    }

    /// These options, accepting a certificate for another host name or not
    /// (`tlsAllowInvalidHostnames`).
    pub fn with_allow_invalid_hostnames(mut self, allow: bool) -> TlsOptions {
        self.allow_invalid_hostnames = allow;
        self
    }

    /// `tlsInsecure=true`: both relaxations at once (TL-2; OCSP is never checked).
    pub fn insecure() -> TlsOptions {
        TlsOptions {
            allow_invalid_certificates: true,
            allow_invalid_hostnames: true,
            ..TlsOptions::default()
        }
    }

    /// The rustls configuration of these options: reads `tlsCAFile` and `tlsCertificateKeyFile`;
    /// errors name the option, the file and what is wrong with it.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, OptionsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        match &self.ca_file {
            Some(path) => {
                let certificates = read_certificates("tlsCAFile", path)?;
                let (added, _) = roots.add_parsable_certificates(certificates);
                if added == 0 {
                    return Err(file_error("tlsCAFile", path, "no usable CA certificate"));
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| OptionsError::new("tls", "true", e.to_string()))?;
        let verifier = Arc::new(Verifier {
            webpki,
            allow_invalid_certificates: self.allow_invalid_certificates,
            allow_invalid_hostnames: self.allow_invalid_hostnames,
        });
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| OptionsError::new("tls", "true", e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &self.certificate_key_file {
            Some(path) => {
                let chain = read_certificates("tlsCertificateKeyFile", path)?;
                if chain.is_empty() {
                    return Err(file_error("tlsCertificateKeyFile", path, "no certificate"));
                }
                let key = PrivateKeyDer::from_pem_file(path).map_err(|e| {
                    file_error(
                        "tlsCertificateKeyFile",
                        path,
                        format!("no private key: {e}"),
                    )
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| file_error("tlsCertificateKeyFile", path, e.to_string()))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }
}

fn file_error(option: &str, path: &Path, reason: impl fmt::Display) -> OptionsError {
    OptionsError::new(option, &path.display().to_string(), reason.to_string())
}

fn read_certificates(
    option: &str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, OptionsError> {
    CertificateDer::pem_file_iter(path)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|e| file_error(option, path, e))
}

/// The server certificate check: webpki's, with the relaxations the options allow (TL-2).
#[derive(Debug)]
struct Verifier {
    webpki: Arc<WebPkiServerVerifier>,
    allow_invalid_certificates: bool,
    allow_invalid_hostnames: bool,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.allow_invalid_certificates {
            return Ok(ServerCertVerified::assertion());
        }
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.allow_invalid_hostnames => Ok(ServerCertVerified::assertion()),
            result => result,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A TLS failure (certificate, host name, or protocol), carried inside an `io::Error` of kind
/// `InvalidData`. HS-9: a non-I/O TLS error, never labelled as overload.
#[derive(Debug)]
pub struct TlsError {
    peer: String,
    cause: rustls::Error,
}

impl TlsError {
    /// The rustls error.
    pub fn cause(&self) -> &rustls::Error {
        &self.cause
    }

    /// Whether `error` carries a [`TlsError`].
    pub fn is_tls(error: &io::Error) -> bool {
        error.get_ref().is_some_and(|inner| inner.is::<TlsError>())
    }
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TLS with {} failed: {}", self.peer, self.cause)
    }
}

impl std::error::Error for TlsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.cause)
    }
}

/// A runtime whose sockets speak TLS: `connect` opens the inner runtime's TCP socket and completes
/// the TLS handshake (SNI = the host name, TL-2) before it returns.
pub struct TlsRuntime {
    inner: Arc<dyn Runtime>,
    config: Arc<ClientConfig>,
}

impl TlsRuntime {
    /// `inner` with TLS configured by `config` on every socket.
    pub fn new(inner: Arc<dyn Runtime>, config: Arc<ClientConfig>) -> TlsRuntime {
        TlsRuntime { inner, config }
    }
}

impl fmt::Debug for TlsRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsRuntime")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl Runtime for TlsRuntime {
    /// A TLS runtime wraps a started runtime ([`TlsRuntime::new`]); it cannot start alone.
    fn start() -> io::Result<TlsRuntime> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a TlsRuntime wraps another runtime: start that one and use TlsRuntime::new",
        ))
    }

    fn now(&self) -> Instant {
        self.inner.now()
    }

    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        self.inner.new_timer(at)
    }

    fn spawns(&self) -> bool {
        self.inner.spawns()
    }

    fn spawn(&self, future: BoxFuture<()>) -> io::Result<()> {
        self.inner.spawn(future)
    }

    fn resolve_srv(&self, name: String) -> BoxFuture<io::Result<Vec<SrvRecord>>> {
        self.inner.resolve_srv(name)
    }

    fn resolve_txt(&self, name: String) -> BoxFuture<io::Result<Vec<Vec<String>>>> {
        self.inner.resolve_txt(name)
    }

    fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
        let tcp = self.inner.connect(host.clone(), port);
        let config = self.config.clone();
        Box::pin(async move {
            let name = ServerName::try_from(host.clone()).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("TLS server name {host}: {e}"),
                )
            })?;
            let connection = ClientConnection::new(config, name).map_err(|cause| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    TlsError {
                        peer: format!("{host}:{port}"),
                        cause,
                    },
                )
            })?;
            let mut socket = TlsSocket {
                inner: tcp.await?,
                connection,
                peer: format!("{host}:{port}"),
                incoming: Vec::new(),
                consumed: 0,
                outgoing: Vec::new(),
                written: 0,
            };
            core::future::poll_fn(|cx| socket.poll_handshake(cx)).await?;
            Ok(Box::pin(socket) as Pin<Box<dyn Socket>>)
        })
    }
}

const TLS_READ_BYTES: usize = 16 * 1024;

/// A socket with rustls between the driver and the runtime's TCP stream. Ciphertext read but not
/// yet taken by rustls waits in `incoming[consumed..]`; ciphertext rustls produced waits in
/// `outgoing[written..]`. Reads also send what waits, since the driver polls every open socket's
/// read side each round.
struct TlsSocket {
    inner: Pin<Box<dyn Socket>>,
    connection: ClientConnection,
    peer: String,
    incoming: Vec<u8>,
    consumed: usize,
    outgoing: Vec<u8>,
    written: usize,
}

impl TlsSocket {
    fn tls_error(&self, cause: rustls::Error) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            TlsError {
                peer: self.peer.clone(),
                cause,
            },
        )
    }

    /// Writes every ciphertext byte rustls has: ready once all are written.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.written == self.outgoing.len() {
                self.outgoing.clear();
                self.written = 0;
                if !self.connection.wants_write() {
                    return Poll::Ready(Ok(()));
                }
                self.connection.write_tls(&mut self.outgoing)?;
                continue;
            }
            match self
                .inner
                .as_mut()
                .poll_write(cx, &self.outgoing[self.written..])
            {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Gives rustls more ciphertext: what waits, else what the socket has. `Ok(false)` at the end
    /// of the stream.
    fn poll_receive(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        if self.consumed == self.incoming.len() {
            self.incoming.resize(TLS_READ_BYTES, 0);
            self.consumed = 0;
            match self.inner.as_mut().poll_read(cx, &mut self.incoming) {
                Poll::Ready(Ok(n)) => self.incoming.truncate(n),
                Poll::Ready(Err(e)) => {
                    self.incoming.clear();
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => {
                    self.incoming.clear();
                    return Poll::Pending;
                }
            }
            if self.incoming.is_empty() {
                return Poll::Ready(Ok(false));
            }
        }
        let mut waiting = &self.incoming[self.consumed..];
        let before = waiting.len();
        self.connection.read_tls(&mut waiting)?;
        self.consumed += before - waiting.len();
        if let Err(cause) = self.connection.process_new_packets() {
            // Tell the peer why (the alert rustls queued), as far as the socket takes it now.
            let _ = self.poll_send(cx);
            return Poll::Ready(Err(self.tls_error(cause)));
        }
        Poll::Ready(Ok(true))
    }

    /// Drives the handshake to its end; the connect's error if it fails.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let sent = self.poll_send(cx)?;
            if !self.connection.is_handshaking() {
                return sent.map(Ok);
            }
            match self.poll_receive(cx)? {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(true) => {}
                Poll::Ready(false) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "{} closed the connection during the TLS handshake",
                            self.peer
                        ),
                    )))
                }
            }
        }
    }
}

impl Socket for TlsSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Poll::Ready(Err(e)) = this.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        loop {
            match this.connection.reader().read(buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            match this.poll_receive(cx) {
                Poll::Ready(Ok(true)) => {}
                Poll::Ready(Ok(false)) => return Poll::Ready(Ok(0)),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let mut accepted = this.connection.writer().write(buf)?;
        if accepted == 0 && !buf.is_empty() {
            // rustls's buffer is full: send some of it first.
            match this.poll_send(cx) {
                Poll::Ready(Ok(())) => accepted = this.connection.writer().write(buf)?,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        // What the socket does not take now goes with the next read or write.
        if let Poll::Ready(Err(e)) = this.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(accepted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tl2_insecure_is_both_relaxations_and_the_default_verifies_everything() {
        let insecure = TlsOptions::insecure();
        assert!(insecure.allow_invalid_certificates && insecure.allow_invalid_hostnames);
        let secure = TlsOptions::default();
        assert!(!secure.allow_invalid_certificates && !secure.allow_invalid_hostnames);
        secure.client_config().unwrap();
    }

    #[test]
    fn tl2_unreadable_files_are_errors_that_name_the_option_and_the_file() {
        let options = TlsOptions {
            ca_file: Some(PathBuf::from("/nonexistent/ca.pem")),
            ..TlsOptions::default()
        };
        let error = options.client_config().unwrap_err();
        assert_eq!(error.option(), "tlsCAFile");
        assert_eq!(error.value(), "/nonexistent/ca.pem");
        let options = TlsOptions {
            certificate_key_file: Some(PathBuf::from("/nonexistent/client.pem")),
            ..TlsOptions::default()
        };
        let error = options.client_config().unwrap_err();
        assert_eq!(error.option(), "tlsCertificateKeyFile");
    }

    #[test]
    fn the_key_file_password_never_appears_in_debug_output() {
        let cs = crate::ConnectionString::parse(
            "mongodb://x/?tls=true&tlsCertificateKeyFilePassword=hunter2&proxyHost=p\
             &proxyUsername=u&proxyPassword=swordfish",
        )
        .unwrap();
        let debug = format!("{cs:?}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("swordfish"),
            "{debug}"
        );
        assert!(debug.contains("tlsCertificateKeyFilePassword"), "{debug}");
    }

    #[test]
    fn hs9_tls_errors_are_recognised_inside_io_errors() {
        let error = io::Error::new(
            io::ErrorKind::InvalidData,
            TlsError {
                peer: "db:27017".into(),
                cause: rustls::Error::InvalidCertificate(CertificateError::Expired),
            },
        );
        assert!(TlsError::is_tls(&error));
        assert!(error.to_string().contains("db:27017"), "{error}");
        assert!(
            error.to_string().to_lowercase().contains("expired"),
            "{error}"
        );
        assert!(!TlsError::is_tls(&io::Error::from(
            io::ErrorKind::InvalidData
        )));
    }
}
