//! `probe` with a `mongodb+srv` URI (SRV-2..SRV-6), its records served by a DNS server on
//! 127.0.0.1 and looked up by the tokio runtime's real resolver.

use std::net::Ipv4Addr;
use std::time::Duration;

use retry_driver::Runtime;
use retry_lab::probe::{probe_on, ProbeError};
use retry_scenarios::{DnsRecords, DnsServer};
use retry_testkit::{Role, ServerConfig, TestServer};
use retry_tokio::TokioRuntime;

/// Only a hang reaches it; nothing is asserted about how long a probe takes.
const HANG_GUARD: Duration = Duration::from_secs(60);

async fn probe_text(dns: &DnsServer, uri: &str) -> (Result<bool, ProbeError>, String) {
    let runtime = TokioRuntime::start()
        .expect("inside tokio")
        .with_nameservers(dns.nameservers());
    let mut out = Vec::new();
    let result = tokio::time::timeout(HANG_GUARD, probe_on(runtime, uri, &mut out))
        .await
        .expect("the probe does not hang");
    (result, String::from_utf8(out).expect("UTF-8 output"))
}

#[tokio::test]
async fn srv2_a_mongodb_srv_probe_prints_its_seed_list_and_pings_the_target() {
    let server = TestServer::start(ServerConfig::new(Role::Mongos))
        .await
        .unwrap();
    let port = server.address().port();
    let dns = DnsServer::start();
    dns.set(
        "_mongodb._tcp.probe.test.local",
        DnsRecords {
            srv: vec![("node.test.local".into(), port, 600)],
            ..DnsRecords::default()
        },
    );
    dns.set(
        "node.test.local",
        DnsRecords {
            a: vec![Ipv4Addr::LOCALHOST],
            ..DnsRecords::default()
        },
    );
    let (result, text) = probe_text(
        &dns,
        "mongodb+srv://probe.test.local/?tls=false&serverSelectionTimeoutMS=5000",
    )
    .await;
    assert!(result.expect("the probe runs"), "{text}");
    for expected in [
        format!("seed list from DNS: node.test.local:{port}"),
        format!("server node.test.local:{port}: Unknown -> Mongos"),
        "ping succeeded".to_string(),
    ] {
        assert!(text.contains(&expected), "no {expected:?} in\n{text}");
    }
    assert_eq!(server.handle().counters().command("ping").executed, 1);

    // SRV-2: a name without records is refused before anything connects, naming the query.
    let error = probe_text(&dns, "mongodb+srv://missing.test.local/?tls=false")
        .await
        .0
        .unwrap_err();
    assert!(matches!(error, ProbeError::Options(_)), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("_mongodb._tcp.missing.test.local"),
        "{error}"
    );
    server.shutdown().await;
}
