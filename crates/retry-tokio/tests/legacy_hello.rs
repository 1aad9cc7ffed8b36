//! HS-3 end to end on tokio: a client's monitor keeps the legacy hello (`isMaster`) for its
//! checks when the handshake's reply did not say `helloOk: true`, and switches to `hello` when
//! it did; a check after the handshake carries none of the handshake's arguments. The test
//! server plays a server that does not offer `hello` with `ServerConfig::without_hello` (its
//! legacy hello never says `helloOk`, and `hello` is CommandNotFound 59, as on a real server
//! that does not know it). Bounded, on 127.0.0.1.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{doc, Document};
use retry_core::address::ServerAddress;
use retry_core::monitor::ServerMonitoringMode;
use retry_core::retry::OperationKind;
use retry_testkit::{Role, ServerConfig, TestServer};
use retry_tokio::{Client, ClientOptions};
use tokio::time::{sleep, timeout};

/// The handshake's arguments (HS-4, HS-5, BP-25, AU-*): none may be on a later check.
const HANDSHAKE_ARGUMENTS: [&str; 7] = [
    "client",
    "helloOk",
    "compression",
    "backpressure",
    "loadBalanced",
    "saslSupportedMechs",
    "speculativeAuthenticate",
];

/// How many checks after its handshake the busiest connection must have sent.
const CHECKS: usize = 2;

/// The hellos a client with monitoring `mode` sent to a standalone started from `config`, by
/// connection, in order (each connection's first is its handshake), once one connection sent
/// [`CHECKS`] checks after its handshake; and how many `hello` commands the server received.
async fn hellos(
    config: ServerConfig,
    mode: ServerMonitoringMode,
) -> (BTreeMap<i32, Vec<Document>>, u64) {
    let server = TestServer::start(config).await.expect("a test server");
    let handle = server.handle();
    let address = server.address();
    let mut options = ClientOptions::new(vec![ServerAddress::new(
        &address.ip().to_string(),
        address.port(),
    )]);
    options.server_selection_timeout = Duration::from_secs(5);
    // The shortest interval the spec allows (minHeartbeatFrequencyMS).
    options.heartbeat_frequency = Duration::from_millis(500);
    options.server_monitoring_mode = mode;
    let client = Client::connect(options).expect("the client starts");
    client
        .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
        .await
        .expect("ping succeeds");
    let by_connection = || {
        let mut by_connection: BTreeMap<i32, Vec<Document>> = BTreeMap::new();
        for handshake in handle.handshakes() {
            by_connection
                .entry(handshake.connection_id)
                .or_default()
                .push(handshake.command);
        }
        by_connection
    };
    // At most 10 s (200 steps of 50 ms); a check is due every 500 ms.
    for _ in 0..200 {
        if by_connection().values().any(|h| h.len() > CHECKS) {
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    client.shutdown().await;
    let received = handle.counters().command("hello").received;
    let hellos = by_connection();
    server.shutdown().await;
    assert!(
        hellos.values().any(|h| h.len() > CHECKS),
        "{CHECKS} checks after a handshake: {hellos:?}"
    );
    (hellos, received)
}

/// The command name of a hello (its first key).
fn name(hello: &Document) -> &str {
    hello.keys().next().map_or("", String::as_str)
}

/// HS-2, HS-4: every connection's first hello is its handshake: legacy hello with
/// `helloOk: true` and the client's metadata (no Stable API version is declared).
fn assert_handshakes(hellos: &BTreeMap<i32, Vec<Document>>) {
    for (connection, hellos) in hellos {
        let handshake = &hellos[0];
        assert_eq!(name(handshake), "isMaster", "{connection}: {handshake}");
        assert_eq!(
            handshake.get_bool("helloOk").ok(),
            Some(true),
            "{handshake}"
        );
        assert!(handshake.contains_key("client"), "{handshake}");
    }
}

/// HS-3: the checks after a handshake carry none of its arguments.
fn assert_checks_are_bare(hellos: &BTreeMap<i32, Vec<Document>>) {
    for (connection, hellos) in hellos {
        for check in &hellos[1..] {
            for argument in HANDSHAKE_ARGUMENTS {
                assert!(
                    !check.contains_key(argument),
                    "{connection}: a check carries {argument}: {check}"
                );
            }
        }
    }
}

/// HS-3: against a server that does not offer `hello` (its legacy hello reply has no
/// `helloOk`), the monitor keeps the legacy hello for every check, polling or streaming: the
/// server receives no `hello` command at all, and every check is a bare `isMaster`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hs3_without_hello_ok_the_monitor_keeps_the_legacy_hello() {
    for mode in [ServerMonitoringMode::Poll, ServerMonitoringMode::Stream] {
        let config = ServerConfig::new(Role::Standalone).without_hello();
        let (hellos, received) = timeout(Duration::from_secs(30), hellos(config, mode))
            .await
            .expect("bounded");
        assert_handshakes(&hellos);
        assert_eq!(received, 0, "{mode:?}: no hello command: {hellos:?}");
        for (connection, hellos) in &hellos {
            for check in &hellos[1..] {
                assert_eq!(name(check), "isMaster", "{mode:?} {connection}: {check}");
            }
        }
        assert_checks_are_bare(&hellos);
    }
}

/// HS-3: against a server whose legacy hello reply says `helloOk: true`, the monitor's checks
/// in `mode` after the handshake are `hello`, with none of the handshake's arguments.
async fn with_hello_ok_the_monitor_switches_to_hello(mode: ServerMonitoringMode) {
    let config = ServerConfig::new(Role::Standalone);
    let (hellos, received) = timeout(Duration::from_secs(30), hellos(config, mode))
        .await
        .expect("bounded");
    assert_handshakes(&hellos);
    let checks: Vec<&Document> = hellos.values().flat_map(|h| &h[1..]).collect();
    assert!(checks.len() >= CHECKS, "{mode:?}: {hellos:?}");
    for check in &checks {
        assert_eq!(name(check), "hello", "{mode:?}: {check}");
    }
    assert_eq!(received, checks.len() as u64, "{mode:?}: {hellos:?}");
    assert_checks_are_bare(&hellos);
}

/// HS-3: polling, the monitor switches to `hello` after a handshake reply with `helloOk: true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hs3_with_hello_ok_a_polling_monitor_switches_to_hello() {
    with_hello_ok_the_monitor_switches_to_hello(ServerMonitoringMode::Poll).await;
}

/// HS-3, MO-8: streaming, the awaitable checks are `hello` after a handshake reply with
/// `helloOk: true` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hs3_with_hello_ok_a_streaming_monitor_switches_to_hello() {
    with_hello_ok_the_monitor_switches_to_hello(ServerMonitoringMode::Stream).await;
}
