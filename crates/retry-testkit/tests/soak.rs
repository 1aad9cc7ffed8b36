//! A bounded soak of the server itself: concurrent clients on 127.0.0.1, every random fault on,
//! some clients sending garbage. Every request ends (a reply or an error), the server never panics
//! (shutdown would re-raise it), and its books balance.

use std::time::Duration;

use bson::doc;
use retry_testkit::{
    FailCommand, FailPointMode, FaultConfig, IngressLimit, RateLimit, RawClient, ServerConfig,
    TestServer,
};
use tokio::time::timeout;

const CLIENTS: u64 = 8;
const REQUESTS_PER_CLIENT: u64 = 60;

/// What happened to one client's requests.
#[derive(Default)]
struct Tally {
    replies: u64,
    errors: u64,
    timeouts: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_ends_and_nothing_panics_under_random_faults() {
    timeout(Duration::from_secs(60), soak())
        .await
        .expect("the soak finished within its bound");
}

async fn soak() {
    let config = ServerConfig {
        faults: FaultConfig {
            reset_mid_frame: 0.05,
            stall: 0.05,
            garbage: 0.05,
            oversized_length: 0.05,
            stall_for: Duration::from_millis(20),
        },
        ingress_limit: Some(IngressLimit::new(RateLimit::new(2000.0, 50))),
        seed: 42,
        ..ServerConfig::default()
    };
    let server = TestServer::start(config).await.unwrap();
    let handle = server.handle();
    handle.set_fail_command(Some(
        FailCommand::new(FailPointMode::AlwaysOn, ["find"])
            .with_error_code(462)
            .with_error_labels(["SystemOverloadedError", "RetryableError"]),
    ));
    let address = server.address();

    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        clients.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut connection = None;
            for i in 0..REQUESTS_PER_CLIENT {
                if connection.is_none() {
                    connection = RawClient::connect(address).await.ok();
                }
                let Some(raw) = connection.as_mut() else {
                    tally.errors += 1;
                    continue;
                };
                // One client in four ends every tenth request with garbage of its own.
                if client % 4 == 0 && i % 10 == 9 {
                    let sent = raw.send_raw(&[0xee; 32]).await;
                    let ended = timeout(Duration::from_secs(5), raw.receive()).await;
                    assert!(
                        sent.is_err() || matches!(ended, Ok(Err(_))),
                        "garbage closes"
                    );
                    tally.errors += 1;
                    connection = None;
                    continue;
                }
                let command = match i % 3 {
                    0 => doc! { "ping": 1, "$db": "admin" },
                    1 => doc! { "insert": "c", "documents": [{ "i": i as i64 }], "$db": "db" },
                    _ => doc! { "find": "c", "$db": "db" },
                };
                match timeout(Duration::from_secs(5), raw.command(command)).await {
                    Ok(Ok(_)) => tally.replies += 1,
                    Ok(Err(_)) => {
                        tally.errors += 1;
                        connection = None;
                    }
                    Err(_) => {
                        tally.timeouts += 1;
                        connection = None;
                    }
                }
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for client in clients {
        let tally = client.await.unwrap();
        total.replies += tally.replies;
        total.errors += tally.errors;
        total.timeouts += tally.timeouts;
    }
    assert_eq!(
        total.replies + total.errors + total.timeouts,
        CLIENTS * REQUESTS_PER_CLIENT
    );
    assert_eq!(total.timeouts, 0, "a 20 ms stall never outlasts 5 s");
    assert!(total.replies > 0 && total.errors > 0);

    // The server still serves a clean connection.
    handle.set_faults(FaultConfig::default());
    handle.set_ingress_limit(None);
    let mut clean = RawClient::connect(address).await.unwrap();
    let reply = clean
        .command(doc! { "ping": 1, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
    drop(clean);

    let counters = handle.counters();
    assert!(counters.faults.total() > 0);
    assert!(counters.protocol_errors > 0);
    let finds = counters.command("find");
    assert_eq!(
        finds.executed, 0,
        "the alwaysOn fail point answered every find"
    );
    assert_eq!(finds.received, finds.failed);
    for (name, counts) in &counters.commands {
        assert_eq!(counts.received, counts.succeeded + counts.failed, "{name}");
    }
    server.shutdown().await;
    let counters = handle.counters();
    assert_eq!(counters.connections_accepted, counters.connections_closed);
}
