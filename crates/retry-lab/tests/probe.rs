//! `probe` against test servers on 127.0.0.1, and its answers to bad input.

use std::time::Duration;

use retry_lab::probe::{probe, ProbeError};
use retry_testkit::{FailCommand, FailPointMode, Role, ServerConfig, TestServer};

/// Far above any probe here (one backoff of at most 400 ms, a 200 ms selection timeout): only a
/// hang reaches it. Nothing is asserted about how long a probe takes.
const HANG_GUARD: Duration = Duration::from_secs(60);

async fn probe_text(uri: &str) -> (Result<bool, ProbeError>, String) {
    let mut out = Vec::new();
    let result = tokio::time::timeout(HANG_GUARD, probe(uri, &mut out))
        .await
        .expect("the probe does not hang");
    (result, String::from_utf8(out).expect("UTF-8 output"))
}

#[tokio::test]
async fn a_ping_against_a_standalone_prints_the_handshake_and_the_command() {
    let server = TestServer::start(ServerConfig::new(Role::Standalone))
        .await
        .unwrap();
    let address = server.address();
    let (result, text) = probe_text(&format!("mongodb://{address}")).await;
    assert!(result.unwrap(), "{text}");
    for expected in [
        format!("heartbeat {address}: Started"),
        format!("heartbeat {address}: Succeeded"),
        format!("server {address}: Unknown -> Standalone"),
        format!("operation 1: attempt 1 started on {address}"),
        format!("operation 1: attempt 1 succeeded on {address}"),
        // EV-1, EV-2: the command events, one line each (the handshake publishes none, EV-8).
        format!(" started on {address}"),
        "command ping request ".to_string(),
        " succeeded in ".to_string(),
        "operation 1 finished: { \"ok\": 1".to_string(),
        "ping succeeded".to_string(),
    ] {
        assert!(text.contains(&expected), "no {expected:?} in\n{text}");
    }
    assert!(!text.contains("retry"), "{text}");
    // EV-8: no command events for handshakes or heartbeats.
    assert!(!text.contains("command hello"), "{text}");
    assert!(!text.contains("command isMaster"), "{text}");
    // The server saw one ping; each connection's first handshake (the one with the client
    // metadata; later heartbeats are plain hellos) announced backpressure support (BP-25).
    let handle = server.handle();
    assert_eq!(handle.counters().command("ping").executed, 1);
    let initial: Vec<_> = handle
        .handshakes()
        .into_iter()
        .filter(|h| h.command.contains_key("client"))
        .collect();
    assert!(!initial.is_empty());
    for handshake in initial {
        assert_eq!(
            handshake.command.get_str("backpressure").ok(),
            Some("2"),
            "{handshake:?}"
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn an_overloaded_ping_is_retried_and_every_attempt_is_printed() {
    let server = TestServer::start(ServerConfig::new(Role::Standalone))
        .await
        .unwrap();
    server.handle().set_fail_command(Some(
        FailCommand::new(FailPointMode::Times(1), ["ping"])
            .with_error_code(462)
            .with_error_labels(["SystemOverloadedError", "RetryableError"]),
    ));
    let address = server.address();
    let (result, text) = probe_text(&format!("mongodb://{address}/?appName=probe-test")).await;
    assert!(result.unwrap(), "{text}");
    for expected in [
        "operation 1: attempt 1 failed",
        "operation 1: retry 1 in",
        "operation 1: attempt 2 started",
        "operation 1: attempt 2 succeeded",
        // EV-3: the ok:0 reply is a failed command event, the retry a second pair.
        " failed in ",
        "ping succeeded",
    ] {
        assert!(text.contains(expected), "no {expected:?} in\n{text}");
    }
    let pings = server.handle().counters().command("ping");
    assert_eq!((pings.received, pings.executed), (2, 1));
    server.shutdown().await;
}

#[tokio::test]
async fn a_ping_that_keeps_failing_is_reported_as_failed() {
    let server = TestServer::start(ServerConfig::new(Role::Standalone))
        .await
        .unwrap();
    server.handle().set_fail_command(Some(
        FailCommand::new(FailPointMode::AlwaysOn, ["ping"])
            .with_error_code(462)
            .with_error_labels(["SystemOverloadedError", "RetryableError"]),
    ));
    let uri = format!("mongodb://{}/?maxAdaptiveRetries=1", server.address());
    let (result, text) = probe_text(&uri).await;
    assert!(!result.unwrap(), "{text}");
    assert!(text.contains("attempt 2 failed"), "{text}");
    assert!(!text.contains("attempt 3"), "{text}");
    assert!(text.contains("ping failed"), "{text}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_server_that_is_not_there_fails_server_selection() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let uri = format!("mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=200");
    let (result, text) = probe_text(&uri).await;
    assert!(!result.unwrap(), "{text}");
    assert!(
        text.contains(&format!("heartbeat 127.0.0.1:{port}: Failed")),
        "{text}"
    );
    assert!(!text.contains("attempt 1 started"), "{text}");
    assert!(text.contains("ping failed"), "{text}");
    // Item 7: the refused connection says so.
    assert!(text.contains("(ConnectionRefused)"), "{text}");
}

#[tokio::test]
async fn bad_uris_and_options_name_the_option_and_the_value() {
    for (uri, option, value) in [
        ("localhost:27017", "uri", "localhost:27017"),
        (
            "mongodb://127.0.0.1/?maxAdaptiveRetries=-1",
            "maxAdaptiveRetries",
            "-1",
        ),
        (
            "mongodb://127.0.0.1/?retryReads=perhaps",
            "retryReads",
            "perhaps",
        ),
        ("mongodb://127.0.0.1:99999", "host", "127.0.0.1:99999"),
    ] {
        let (result, text) = probe_text(uri).await;
        // Malformed URIs are errors; values a driver would ignore with a warning (URI-7) are
        // refused by the probe.
        let Err(error @ (ProbeError::Options(_) | ProbeError::Ignored(_))) = result else {
            panic!("{uri}: expected an option error, got {result:?}");
        };
        let message = error.to_string();
        assert!(
            message.contains(option) && message.contains(value),
            "{uri}: {message}"
        );
        assert!(text.is_empty(), "{uri}: nothing runs: {text}");
    }
    // An unknown option is refused by name; its value is not shown, as it might be a secret
    // (URI-3, review item 1).
    let (result, text) = probe_text("mongodb://127.0.0.1/?colour=blue").await;
    let Err(error @ ProbeError::Ignored(_)) = result else {
        panic!("an unknown option: expected it refused, got {result:?}");
    };
    let message = error.to_string();
    assert!(
        message.contains("colour") && !message.contains("blue"),
        "{message}"
    );
    assert!(text.is_empty(), "nothing runs: {text}");
}
