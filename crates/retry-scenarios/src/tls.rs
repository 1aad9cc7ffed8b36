//! TLS scenarios (TL-2, HS-9): a client with the test CA in `tlsCAFile` talks to a TLS test
//! server; an expired and a wrong-host certificate each fail with an error that names the cause
//! and carries no overload label; `tlsAllowInvalidHostnames` and `tlsInsecure` accept them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use retry_core::error::{Labels, OperationError};
use retry_core::retry::OperationKind;
use retry_driver::{Client, ClientOptions, Runtime, TlsError, TlsOptions, TlsRuntime};
use retry_testkit::{ServerCertificate, ServerConfig, TestCa};

use crate::{bounded, options, Server, SCENARIO_LIMIT};

/// A CA file written for one scenario, removed when dropped.
struct CaFile(PathBuf);

impl CaFile {
    fn write(ca: &TestCa) -> CaFile {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "retry-scenarios-ca-{}-{}.pem",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        ca.write_ca_file(&path).expect("the CA file is written");
        CaFile(path)
    }
}

impl Drop for CaFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A TLS server presenting `certificate` from `ca`.
async fn tls_server(ca: &TestCa, certificate: ServerCertificate) -> Server {
    let config = ServerConfig {
        tls: Some(ca.server_tls(&certificate).expect("a server certificate")),
        ..ServerConfig::default()
    };
    Server::start(config).await
}

/// A ping from a client with `tls` to `server`.
async fn ping_with<R: Runtime>(server: &Server, tls: TlsOptions) -> Result<(), OperationError> {
    let mut options: ClientOptions = options(&[server]);
    options.server_selection_timeout = Duration::from_millis(1_500);
    options.tls = Some(tls);
    let client = Client::<R>::connect(options).expect("the client starts");
    let result = client
        .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
        .await
        .map(drop);
    client.shutdown().await;
    result
}

/// The error of opening a TLS socket to `server` with `tls`, straight from the TLS layer.
async fn connect_error<R: Runtime>(server: &Server, tls: TlsOptions) -> std::io::Error {
    let runtime = TlsRuntime::new(
        Arc::new(R::start().expect("the runtime")),
        tls.client_config().expect("a TLS config"),
    );
    match runtime
        .connect(server.address.ip().to_string(), server.address.port())
        .await
    {
        Ok(_) => panic!("the TLS handshake with {} succeeded", server.address),
        Err(error) => error,
    }
}

/// HS-9: a certificate error is no overload and marks the server with a TLS error whose message
/// says what was wrong, as the TLS layer's own error does.
async fn assert_certificate_error<R: Runtime>(
    error: &OperationError,
    server: &Server,
    tls: TlsOptions,
    cause: &str,
) {
    assert!(!error.has_label(Labels::SYSTEM_OVERLOADED), "{error}");
    assert!(!error.has_label(Labels::RETRYABLE), "{error}");
    assert!(error.to_string().contains("TlsCertificate"), "{error}");
    // The operation's error keeps the TLS layer's message (item 7 of issue #10).
    assert!(error.to_string().contains(cause), "{error}");
    let io = connect_error::<R>(server, tls).await;
    assert!(TlsError::is_tls(&io), "{io}");
    let message = io.to_string();
    assert!(message.starts_with("TLS with 127.0.0.1:"), "{message}");
    assert!(message.contains(cause), "{message}");
}

/// TL-2: TLS with the generated CA as `tlsCAFile`; SNI and the IP address SAN verify.
pub async fn tls_with_the_test_ca_works<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let ca = TestCa::new().expect("a CA");
        let file = CaFile::write(&ca);
        let server = tls_server(&ca, ServerCertificate::Valid).await;
        let tls = TlsOptions {
            ca_file: Some(file.0.clone()),
            ..TlsOptions::default()
        };
        ping_with::<R>(&server, tls).await.expect("ping over TLS");
        assert_eq!(server.handle.counters().tls_handshakes_failed, 0);
        // Without the CA the certificate is from an unknown issuer (the default roots).
        let error = ping_with::<R>(&server, TlsOptions::default())
            .await
            .unwrap_err();
        assert_certificate_error::<R>(&error, &server, TlsOptions::default(), "UnknownIssuer")
            .await;
        server.stop().await;
    })
    .await;
}

/// TL-2, HS-9: an expired certificate fails with an unlabelled error naming the expiry;
/// `tlsInsecure` and `tlsAllowInvalidCertificates` accept it, `tlsAllowInvalidHostnames` does not.
pub async fn tls_expired_certificate_is_refused_unless_insecure<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let ca = TestCa::new().expect("a CA");
        let file = CaFile::write(&ca);
        let server = tls_server(&ca, ServerCertificate::Expired).await;
        let with_ca = |tls: TlsOptions| TlsOptions {
            ca_file: Some(file.0.clone()),
            ..tls
        };
        let error = ping_with::<R>(&server, with_ca(TlsOptions::default()))
            .await
            .unwrap_err();
        assert_certificate_error::<R>(&error, &server, with_ca(TlsOptions::default()), "expired")
            .await;
        let hostnames_only = TlsOptions {
            allow_invalid_hostnames: true,
            ..TlsOptions::default()
        };
        let error = ping_with::<R>(&server, with_ca(hostnames_only.clone()))
            .await
            .unwrap_err();
        assert_certificate_error::<R>(&error, &server, with_ca(hostnames_only), "expired").await;
        ping_with::<R>(&server, with_ca(TlsOptions::insecure()))
            .await
            .expect("tlsInsecure accepts an expired certificate");
        let certificates = TlsOptions {
            allow_invalid_certificates: true,
            ..TlsOptions::default()
        };
        ping_with::<R>(&server, certificates)
            .await
            .expect("tlsAllowInvalidCertificates accepts it, CA or not");
        server.stop().await;
    })
    .await;
}

/// TL-2, HS-9: a certificate for another host fails with an unlabelled error naming the host
/// mismatch; `tlsAllowInvalidHostnames` and `tlsInsecure` accept it.
pub async fn tls_wrong_host_certificate_is_refused_unless_allowed<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let ca = TestCa::new().expect("a CA");
        let file = CaFile::write(&ca);
        let other_host = ServerCertificate::ForHosts(vec!["db.example.com".into()]);
        let server = tls_server(&ca, other_host).await;
        let with_ca = |tls: TlsOptions| TlsOptions {
            ca_file: Some(file.0.clone()),
            ..tls
        };
        let error = ping_with::<R>(&server, with_ca(TlsOptions::default()))
            .await
            .unwrap_err();
        assert_certificate_error::<R>(
            &error,
            &server,
            with_ca(TlsOptions::default()),
            "not valid for",
        )
        .await;
        let hostnames = TlsOptions {
            allow_invalid_hostnames: true,
            ..TlsOptions::default()
        };
        ping_with::<R>(&server, with_ca(hostnames))
            .await
            .expect("tlsAllowInvalidHostnames accepts a certificate for another host");
        ping_with::<R>(&server, with_ca(TlsOptions::insecure()))
            .await
            .expect("tlsInsecure accepts it");
        server.stop().await;
    })
    .await;
}
