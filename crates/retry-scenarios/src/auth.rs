//! Authentication end to end (AU-2..AU-11): a client with a SCRAM credential against a
//! retry-testkit server with users, on 127.0.0.1.

use bson::doc;
use retry_core::auth::Credential;
use retry_core::engine::EngineEvent;
use retry_core::error::{ErrorKind, NetworkPhase};
use retry_core::pool::PoolEvent;
use retry_core::retry::OperationKind;
use retry_core::topology::{SdamEvent, ServerType};
use retry_driver::{ClientOptions, Runtime};
use retry_testkit::{FailCommand, FailPointMode, Role, ScramVersion, ServerConfig};

use crate::{bounded, connect, options, Server, SCENARIO_LIMIT};

/// Options for a client of `server` logging in as `user` with `password`.
fn with_credential(server: &Server, user: &str, password: &str) -> ClientOptions {
    let mut options = options(&[server]);
    options.credential = Some(Credential::new(user, password, "admin"));
    options
}

/// A standalone with the user `alice` / `pencil` holding `mechanisms`.
async fn server_with_alice(mechanisms: &[ScramVersion]) -> Server {
    Server::start(ServerConfig::new(Role::Standalone).with_user("alice", "pencil", mechanisms))
        .await
}

/// AU-3, AU-4, AU-6: the right password works, speculatively (SCRAM-SHA-256 in the hello, then
/// one `saslContinue`) and in two steps (a user with SCRAM-SHA-1 only: the speculative start is
/// not answered, `saslSupportedMechs` picks SCRAM-SHA-1, `saslStart` + `saslContinue`). The
/// monitor's hello carries no authentication fields (AU-2).
pub async fn scram_right_password_authenticates<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        for (mechanisms, sasl_starts) in [
            (&[ScramVersion::Sha256, ScramVersion::Sha1][..], 0),
            (&[ScramVersion::Sha1][..], 1),
        ] {
            let server = server_with_alice(mechanisms).await;
            let options = with_credential(&server, "alice", "pencil");
            let client = connect::<R>(options.clone());
            // Listening turns command monitoring on (EV-6: no credential in any event).
            let mut events = client.events();
            let reply = client
                .run_command("test", doc! { "find": "items" }, OperationKind::Read)
                .await
                .expect("an authenticated find");
            assert_eq!(reply.get_f64("ok").ok(), Some(1.0), "{reply}");
            client.shutdown().await;
            let printed = format!("{options:?} {:?}", events.drain());
            assert!(
                printed.contains("CommandStarted"),
                "command monitoring is on"
            );
            assert!(
                !printed.contains("pencil") && !printed.contains("alice"),
                "no credential in Debug or events: {printed}"
            );
            let counters = server.handle.counters();
            assert_eq!(counters.command("saslStart").received, sasl_starts);
            assert_eq!(counters.command("saslContinue").received, 1);
            let handshakes = server.handle.handshakes();
            let speculative = handshakes
                .iter()
                .filter(|h| h.command.contains_key("speculativeAuthenticate"))
                .count();
            assert_eq!(speculative, 1, "one pooled connection speculates");
            let monitor_hello = handshakes
                .iter()
                .find(|h| !h.command.contains_key("speculativeAuthenticate"))
                .expect("the monitor's hello");
            assert!(!monitor_hello.command.contains_key("saslSupportedMechs"));
            server.stop().await;
        }
    })
    .await
}

/// AU-11, HS-9: a wrong password (and an unknown user, prose step 3) fails the operation with
/// the server's 18 AuthenticationFailed, no overload labels and no retry; the pool is cleared and
/// the server marked Unknown.
pub async fn scram_wrong_password_is_a_clear_error<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        for (user, password) in [("alice", "wrong"), ("mallory", "pencil")] {
            wrong_credential::<R>(user, password).await;
        }
    })
    .await
}

async fn wrong_credential<R: Runtime>(user: &str, password: &str) {
    let server = server_with_alice(&[]).await;
    let client = connect::<R>(with_credential(&server, user, password));
    let mut events = client.events();
    let error = client
        .run_command("test", doc! { "find": "items" }, OperationKind::Read)
        .await
        .expect_err("a wrong password");
    client.shutdown().await;
    let text = error.to_string();
    assert!(text.contains("Authentication failed"), "{text}");
    assert!(!text.contains(password) && !text.contains(user), "{text}");
    assert!(error.labels.is_empty(), "HS-9: {error}");
    assert_eq!(error.server_error().and_then(|e| e.code), Some(18));
    assert_eq!(server.handle.counters().command("find").received, 0);
    let events = events.drain();
    assert!(
        events.iter().any(|(_, e)| matches!(
            e,
            EngineEvent::Pool {
                event: PoolEvent::PoolCleared { .. },
                ..
            }
        )),
        "AU-11: the pool is cleared"
    );
    assert!(
        events.iter().any(|(_, e)| matches!(
            e,
            EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { new, .. })
                if new.server_type == ServerType::Unknown
        )),
        "AU-11: the server is marked Unknown"
    );
    server.stop().await;
}

/// AU-11: a server that stops mid-conversation (its connection closed on `saslContinue`) gives a
/// network error of the authentication phase, with no overload labels.
pub async fn scram_server_stopping_mid_conversation_is_a_network_error<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = server_with_alice(&[]).await;
        server.handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(1), ["saslContinue"]).with_close_connection(),
        ));
        let client = connect::<R>(with_credential(&server, "alice", "pencil"));
        let error = client
            .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
            .await
            .expect_err("the connection closed while authenticating");
        assert!(
            matches!(&error.kind, ErrorKind::Network(n) if n.phase == NetworkPhase::Authentication),
            "{error}"
        );
        assert!(error.labels.is_empty(), "HS-9: {error}");
        // The next operation authenticates on a new connection.
        client
            .run_command("test", doc! { "find": "items" }, OperationKind::Read)
            .await
            .expect("authenticated after the failure");
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// AU-11, the SDAM unified `auth-*` cases on the test server: a `saslContinue` failing with 18,
/// 91 (`ShutdownInProgress`), 1 (`InternalError`), a closed connection, or blocked past
/// `connectTimeoutMS` / `socketTimeoutMS` fails a non-retryable write (nothing reaches the
/// server), with exactly one Unknown server description and one pool clear; then the next write
/// authenticates and runs.
///
/// Only the timeout case sets the short timeouts (as the unified test does), and with a wider
/// margin than its 250 ms / 500 ms: on a loaded machine the pooled connection's `hello` alone can
/// take 250 ms, which fails the handshake before authentication starts (a different error, with
/// HS-9's overload labels).
pub async fn scram_sdam_auth_errors_clear_the_pool_once<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let fail = || FailCommand::new(FailPointMode::Times(1), ["saslContinue"]);
        let timeout = std::time::Duration::from_secs(1);
        let cases = [
            ("auth-error", fail().with_error_code(18), None),
            ("auth-shutdown-error", fail().with_error_code(91), None),
            ("auth-misc-command-error", fail().with_error_code(1), None),
            ("auth-network-error", fail().with_close_connection(), None),
            (
                "auth-network-timeout-error",
                fail().with_block(2 * timeout),
                Some(timeout),
            ),
        ];
        for (name, fail_point, timeouts) in cases {
            let server = server_with_alice(&[]).await;
            server.handle.set_fail_command(Some(fail_point));
            let mut options = with_credential(&server, "alice", "pencil");
            options.retry_writes = false;
            if let Some(timeout) = timeouts {
                options.connect_timeout = timeout;
                options.socket_timeout = Some(timeout);
            }
            let client = connect::<R>(options);
            let mut events = client.events();
            let insert = |x: i32| doc! { "insert": "items", "documents": [{ "_id": x }] };
            let error = client
                .run_command("test", insert(1), OperationKind::NonRetryableWrite)
                .await
                .expect_err(name);
            assert!(error.labels.is_empty(), "{name}: HS-9: {error}");
            assert_eq!(server.handle.counters().command("insert").received, 0);
            let events = events.drain();
            let cleared = events
                .iter()
                .filter(|(_, e)| {
                    matches!(
                        e,
                        EngineEvent::Pool {
                            event: PoolEvent::PoolCleared { .. },
                            ..
                        }
                    )
                })
                .count();
            let unknown = events
                .iter()
                .filter(|(_, e)| {
                    matches!(e, EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { new, .. })
                        if new.server_type == ServerType::Unknown)
                })
                .count();
            assert_eq!((cleared, unknown), (1, 1), "{name}: {error}");
            client
                .run_command("test", insert(2), OperationKind::NonRetryableWrite)
                .await
                .unwrap_or_else(|e| panic!("{name}: the next write: {e}"));
            assert_eq!(server.handle.documents("test.items").len(), 1, "{name}");
            client.shutdown().await;
            server.stop().await;
        }
    })
    .await
}
