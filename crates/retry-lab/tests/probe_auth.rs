//! `probe` with credentials in the URI against a test server with SCRAM users (AU-1, AU-3,
//! AU-11): the right password pings, a wrong one is a clear failure, and the output never shows
//! the credential.

use std::time::Duration;

use retry_lab::probe::probe;
use retry_testkit::{Role, ServerConfig, TestServer};

/// Only a hang reaches it; nothing is asserted about how long a probe takes.
const HANG_GUARD: Duration = Duration::from_secs(60);

async fn probe_text(uri: &str) -> (bool, String) {
    let mut out = Vec::new();
    let result = tokio::time::timeout(HANG_GUARD, probe(uri, &mut out))
        .await
        .expect("the probe does not hang");
    let text = String::from_utf8(out).expect("UTF-8 output");
    (result.unwrap_or(false), text)
}

#[tokio::test]
async fn au1_au3_au11_probe_authenticates_with_uri_credentials_and_prints_none() {
    let config = ServerConfig::new(Role::Standalone).with_user("alice", "pencil", &[]);
    let server = TestServer::start(config).await.unwrap();
    let address = server.address();
    for mechanism in [
        "",
        "&authMechanism=SCRAM-SHA-256",
        "&authMechanism=SCRAM-SHA-1",
    ] {
        let uri =
            format!("mongodb://alice:pencil@{address}/?serverSelectionTimeoutMS=2000{mechanism}");
        let (ok, text) = probe_text(&uri).await;
        assert!(ok, "{uri}:\n{text}");
        assert!(
            !text.contains("pencil") && !text.contains("alice"),
            "{text}"
        );
    }
    let uri = format!("mongodb://alice:wrong@{address}/?serverSelectionTimeoutMS=2000");
    let (ok, text) = probe_text(&uri).await;
    assert!(!ok, "{text}");
    assert!(text.contains("Authentication failed"), "{text}");
    assert!(!text.contains("wrong") && !text.contains("alice"), "{text}");
    server.shutdown().await;
}
