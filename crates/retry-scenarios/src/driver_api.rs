//! Scenarios of the driver's API on every runtime (issue #10 items 4, 7, 8): command
//! classification by default, errors that keep their cause, cursors and write errors.

use std::time::Duration;

use bson::{doc, Bson, Document};
use retry_core::engine::EngineEvent;
use retry_core::error::{ErrorKind, OperationError};
use retry_core::monitor::{HeartbeatEvent, ServerMonitoringMode};
use retry_core::retry::OperationKind;
use retry_core::topology::SdamEvent;
use retry_driver::{Client, ClientOptions, Runtime};
use retry_testkit::{FailCommand, FailPointMode, Role};

use super::{bounded, connect, options, ping, servers_runtime, Server, SCENARIO_LIMIT};

/// A ping's error from a client of `uri` with a short selection timeout.
async fn ping_error<R: Runtime>(uri: &str) -> OperationError {
    let mut options = ClientOptions::parse(uri).expect("a valid URI");
    options.server_selection_timeout = Duration::from_millis(500);
    let client = connect::<R>(options);
    let error = client
        .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
        .await
        .expect_err("nothing answers");
    client.shutdown().await;
    error
}

/// Item 7, HS-9: a DNS failure, a refused connection and an HTTP server each give an error that
/// says so (the topology's error names the I/O error's kind and message, or the decoder's
/// reason); a DNS failure has no overload labels.
pub async fn errors_say_their_cause<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let dns = ping_error::<R>("mongodb://no-such-host.invalid:27017").await;
        let message = dns.to_string();
        assert!(message.contains("Dns during Connect"), "{message}");
        assert!(message.contains("no-such-host.invalid"), "{message}");
        assert!(
            !message.contains("SystemOverloadedError"),
            "HS-9: {message}"
        );

        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            listener.local_addr().expect("its address").port()
        };
        let refused = ping_error::<R>(&format!("mongodb://127.0.0.1:{port}")).await;
        let message = refused.to_string();
        assert!(message.contains("(ConnectionRefused)"), "{message}");

        let http = servers_runtime()
            .spawn(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .await
            .expect("the bind task")
            .expect("a listener");
        let port = http.local_addr().expect("its address").port();
        let server = servers_runtime().spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            // Bounded: a monitor and its retry connect a few times in 500 ms.
            for _ in 0..64 {
                let Ok((mut socket, _)) = http.accept().await else {
                    return;
                };
                let mut request = [0; 512];
                let _ = socket.read(&mut request).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
        });
        let not_mongodb = ping_error::<R>(&format!("mongodb://127.0.0.1:{port}")).await;
        server.abort();
        let message = not_mongodb.to_string();
        assert!(
            message.contains("bad message length") && message.contains("HTTP"),
            "{message}"
        );
    })
    .await
}

fn documents(n: i32) -> Vec<Document> {
    (0..n).map(|i| doc! { "_id": i }).collect()
}

/// Item 8, RR-4, SE-14: a cursor returns every document over its batches with `getMore`s on its
/// server, ends on cursor id 0 without `killCursors`; one dropped early is killed, and one closed
/// early is killed before `close` returns.
pub async fn cursors_fetch_batches_and_are_killed_when_dropped<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        server.handle.insert("test.items", documents(5));
        let client = connect::<R>(options(&[&server]));
        let mut cursor = client
            .cursor("test", doc! { "find": "items", "batchSize": 2 })
            .await
            .expect("find opens a cursor");
        assert_ne!(cursor.id(), 0);
        let mut seen = Vec::new();
        while let Some(document) = cursor.next().await.expect("every batch arrives") {
            seen.push(document);
        }
        assert_eq!(seen, documents(5));
        assert!(cursor.is_exhausted());
        let counters = server.handle.counters();
        assert_eq!(counters.command("getMore").executed, 2, "batches 2 + 2 + 1");
        drop(cursor);
        ping(&client).await;
        assert_eq!(
            server.handle.counters().command("killCursors").received,
            0,
            "an exhausted cursor is not killed"
        );

        let mut closed = client
            .cursor("test", doc! { "find": "items", "batchSize": 2 })
            .await
            .expect("find opens a cursor");
        assert_eq!(closed.next_batch().await.expect("the first batch").len(), 2);
        closed.close().await.expect("killCursors succeeds");
        assert_eq!(server.handle.counters().command("killCursors").executed, 1);

        let mut dropped = client
            .cursor("test", doc! { "find": "items", "batchSize": 2 })
            .await
            .expect("find opens a cursor");
        assert!(dropped.next().await.expect("a document").is_some());
        drop(dropped);
        // Bounded: the queued killCursors runs while the client is driven.
        for _ in 0..200 {
            if server.handle.counters().command("killCursors").received == 2 {
                break;
            }
            ping(&client).await;
        }
        assert_eq!(server.handle.counters().command("killCursors").executed, 2);
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// Review37 W3: a cursor opened with `batchSize: 0` (an `aggregate`'s `cursor.batchSize`, a
/// `find`'s) sends no `batchSize` on its getMores: the test server, like a real one, refuses a
/// getMore's `batchSize` of 0 (BadValue), so iterating it fails unless the driver leaves it out.
/// Review37 W15: the getMores name the namespace of the replies' `cursor.ns`. Review38 L9: after
/// a getMore error the cursor is closed on the client side: `next` returns `Ok(None)` and sends
/// no second getMore; dropping it still kills the server's cursor.
pub async fn w3_l9_cursor_get_more_fields_and_close_after_an_error<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        server.handle.insert("test.items", documents(5));
        let client = connect::<R>(options(&[&server]));
        for open in [
            doc! { "aggregate": "items", "pipeline": [], "cursor": { "batchSize": 0 } },
            doc! { "find": "items", "batchSize": 0 },
        ] {
            let mut cursor = client.cursor("test", open).await.expect("opens a cursor");
            assert_ne!(
                cursor.id(),
                0,
                "an empty first batch leaves the cursor open"
            );
            let mut seen = Vec::new();
            while let Some(document) = cursor.next().await.expect("every getMore is accepted") {
                seen.push(document);
            }
            assert_eq!(seen, documents(5));
        }

        server.handle.reset_counters();
        let mut cursor = client
            .cursor("test", doc! { "find": "items", "batchSize": 2 })
            .await
            .expect("find opens a cursor");
        assert_eq!(cursor.next_batch().await.expect("the first batch").len(), 2);
        server.handle.set_fail_command(Some(
            // 2 (BadValue): not retryable, no overload labels.
            FailCommand::new(FailPointMode::Times(1), ["getMore"]).with_error_code(2),
        ));
        cursor.next().await.expect_err("the getMore fails");
        assert!(cursor.has_failed());
        assert_eq!(cursor.next().await.expect("closed: no error"), None);
        assert!(cursor.next_batch().await.expect("closed").is_empty());
        assert_eq!(
            server.handle.counters().command("getMore").received,
            1,
            "L9: no getMore after the failed one"
        );
        drop(cursor);
        // Bounded: the queued killCursors runs while the client is driven.
        for _ in 0..200 {
            if server.handle.counters().command("killCursors").received == 1 {
                break;
            }
            ping(&client).await;
        }
        assert_eq!(
            server.handle.counters().command("killCursors").executed,
            1,
            "the failed cursor is still killed on the server"
        );
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// Item 8, RW-3: a write reply with `writeErrors` is a typed error keeping the reply (never
/// retried); a `writeConcernError` is a server error keeping the reply.
pub async fn write_errors_are_errors_that_keep_the_reply<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        server.handle.insert("test.items", documents(1));
        let client = connect::<R>(options(&[&server]));
        let error = client
            .command(
                "test",
                doc! { "insert": "items", "documents": [{ "_id": 0 }, { "_id": 7 }] },
            )
            .await
            .expect_err("a duplicate key");
        let ErrorKind::Write(write) = &error.kind else {
            panic!("{error:?}")
        };
        assert_eq!(write.errors.len(), 1);
        assert_eq!(write.errors[0].code, Some(11000));
        // Ordered: the insert stopped at the duplicate.
        assert_eq!(write.reply.get_i32("n").ok(), Some(0), "the reply is kept");
        assert_eq!(write.errors[0].index, Some(0));
        assert_eq!(server.handle.counters().command("insert").received, 1);

        server.handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(1), ["insert"])
                .with_write_concern_error(doc! { "code": 100, "errmsg": "not satisfied" }),
        ));
        let error = client
            .command(
                "test",
                doc! { "insert": "items", "documents": [{ "_id": 8 }] },
            )
            .await
            .expect_err("a write concern error");
        let server_error = error.server_error().expect("a server error");
        let wce = server_error.write_concern_error.as_ref().expect("kept");
        assert_eq!(wce.code, Some(100));
        assert!(server_error.raw.contains_key("writeConcernError"));
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// Item 4, RR-3, RW-4: [`retry_driver::Client::command`] classifies by default: a `find` is a retryable read
/// (retried once after a retryable error), an `aggregate` with `$out` is a write that is not
/// retryable (run once); the caller's explicit kind still wins.
pub async fn commands_are_classified_by_default<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let client = connect::<R>(options(&[&server]));
        let fail = |name: &str| {
            Some(
                // 91 (ShutdownInProgress): retryable for reads and writes, no overload labels.
                FailCommand::new(FailPointMode::Times(1), [name.to_owned()]).with_error_code(91),
            )
        };
        server.handle.set_fail_command(fail("find"));
        client
            .command("test", doc! { "find": "items" })
            .await
            .expect("RR-3: the find is retried");
        assert_eq!(server.handle.counters().command("find").received, 2);

        server.handle.set_fail_command(fail("aggregate"));
        let out = doc! { "aggregate": "items", "pipeline": [{ "$out": "copy" }], "cursor": {} };
        assert_eq!(client.classify(&out), OperationKind::NonRetryableWrite);
        let error = client
            .command("test", out)
            .await
            .expect_err("RW-4: not retried");
        assert_eq!(error.code(), Some(91));
        assert_eq!(server.handle.counters().command("aggregate").received, 1);

        // Explicit: a find run as a generic command is not retried.
        server.handle.set_fail_command(fail("find"));
        let error = client
            .run_command("test", doc! { "find": "items" }, OperationKind::RunCommand)
            .await
            .expect_err("not retried");
        assert_eq!(error.code(), Some(91));
        assert_eq!(server.handle.counters().command("find").received, 3);
        client.shutdown().await;

        // RW-4: the client's `w: 0` is inherited: an insert is not a retryable write.
        let mut unacknowledged = options(&[&server]);
        unacknowledged.write_concern = Some(doc! { "w": 0 });
        let client = connect::<R>(unacknowledged);
        let insert = doc! { "insert": "items", "documents": [Bson::Document(doc! {})] };
        assert_eq!(client.classify(&insert), OperationKind::NonRetryableWrite);
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// MO-1, MO-12, MO-2: the monitor's first check is its connection's handshake (no second
/// `hello` follows it): a ping costs two `hello`s, the monitor's handshake and the application
/// connection's.
pub async fn the_monitors_first_check_is_its_handshake<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let mut options = options(&[&server]);
        // No second check during the test, and no stream after the handshake.
        options.heartbeat_frequency = Duration::from_secs(600);
        options.server_monitoring_mode = ServerMonitoringMode::Poll;
        let client = connect::<R>(options);
        ping(&client).await;
        // Selection waited for the monitor's check: had it sent a hello after its handshake,
        // the server would have received it before the ping.
        let counters = server.handle.counters();
        let hellos = counters.command("hello").received + counters.command("isMaster").received;
        assert_eq!(hellos, 2, "the monitor's handshake and the pool's");
        assert_eq!(server.handle.handshakes().len(), 2);
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// House rule 8, SDAM monitoring events: a stream from `Client::connect_with_events` is
/// subscribed before monitoring starts, so its first topology event is `TopologyOpening` and it
/// sees the server's `ServerOpening`, whatever the monitor's first check did meanwhile (a
/// stream from `events()` after `connect` can start later; the race made a scenario wait for
/// ever, once in about 170 runs).
pub async fn events_from_connect_start_with_the_topology_opening<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let (client, mut events) =
            Client::<R>::connect_with_events(options(&[&server])).expect("the client starts");
        ping(&client).await;
        client.shutdown().await;
        let topology: Vec<SdamEvent> = events
            .drain()
            .into_iter()
            .filter_map(|(_, event)| match event {
                EngineEvent::Topology(event) => Some(event),
                _ => None,
            })
            .collect();
        assert_eq!(topology.first(), Some(&SdamEvent::TopologyOpening));
        assert!(
            topology
                .iter()
                .any(|e| matches!(e, SdamEvent::ServerOpening { .. })),
            "the server's opening is in the stream: {topology:?}"
        );
        server.stop().await;
    })
    .await
}

/// Heartbeat events from `events` until `count` succeeded ones with `awaited` arrived (bounded by
/// the scenario's limit).
async fn heartbeats_until(
    events: &mut retry_driver::Events,
    awaited: bool,
    count: usize,
) -> Vec<HeartbeatEvent> {
    let mut seen = Vec::new();
    let mut matching = 0;
    while matching < count {
        let Some((_, event)) = events.next_event().await else {
            panic!("the client closed; heartbeats so far: {seen:?}");
        };
        if let EngineEvent::Heartbeat { event, .. } = event {
            if matches!(event, HeartbeatEvent::Succeeded { awaited: a, .. } if a == awaited) {
                matching += 1;
            }
            seen.push(event);
        }
    }
    seen
}

/// The hellos the server received that were awaitable (MO-8), and the connections that sent a
/// handshake (`client` metadata, HS-5).
fn hellos(server: &Server) -> (Vec<Document>, usize) {
    let handshakes = server.handle.handshakes();
    let awaitable = handshakes
        .iter()
        .filter(|h| h.command.contains_key("maxAwaitTimeMS"))
        .map(|h| h.command.clone())
        .collect();
    let mut connections: Vec<i32> = handshakes
        .iter()
        .filter(|h| h.command.contains_key("client"))
        .map(|h| h.connection_id)
        .collect();
    connections.dedup();
    (awaitable, connections.len())
}

/// MO-7..MO-12, MO-15: with `serverMonitoringMode` `stream` (as `auto` outside FaaS) the monitor
/// streams after its handshake: an awaitable `hello` with the server's `topologyVersion` and
/// `maxAwaitTimeMS` = `heartbeatFrequencyMS`, sent with `exhaustAllowed`; the server pushes replies
/// (awaited heartbeats), and a separate RTT connection is opened. With `poll`, no awaitable hello
/// and no RTT connection.
pub async fn monitoring_streams_or_polls_as_the_mode_says<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let mut streaming = options(&[&server]);
        streaming.server_monitoring_mode = ServerMonitoringMode::Stream;
        let client = connect::<R>(streaming);
        let mut events = client.events();
        // Two pushed replies: the stream goes on with moreToCome (MO-9).
        let seen = heartbeats_until(&mut events, true, 2).await;
        assert!(
            seen.contains(&HeartbeatEvent::Started { awaited: true }),
            "{seen:?}"
        );
        ping(&client).await;
        let (awaitable, connections) = hellos(&server);
        assert!(!awaitable.is_empty());
        let hello = &awaitable[0];
        assert_eq!(hello.get_i64("maxAwaitTimeMS").ok(), Some(500), "{hello}");
        let version = hello.get_document("topologyVersion").expect("MO-8");
        assert_eq!(
            version.get_object_id("processId").ok(),
            Some(server.handle.process_id())
        );
        assert!(
            !hello.contains_key("lsid") && !hello.contains_key("$clusterTime"),
            "MO-3"
        );
        // The monitor's, the RTT connection's (MO-12) and the pool's.
        assert_eq!(connections, 3);
        client.shutdown().await;
        server.stop().await;

        let server = Server::with_role(Role::Standalone).await;
        let mut polling = options(&[&server]);
        polling.server_monitoring_mode = ServerMonitoringMode::Poll;
        let client = connect::<R>(polling);
        let mut events = client.events();
        let seen = heartbeats_until(&mut events, false, 2).await;
        assert!(
            !seen.iter().any(|e| matches!(
                e,
                HeartbeatEvent::Started { awaited: true }
                    | HeartbeatEvent::Succeeded { awaited: true, .. }
            )),
            "{seen:?}"
        );
        let (awaitable, connections) = hellos(&server);
        assert!(awaitable.is_empty(), "{awaitable:?}");
        assert_eq!(connections, 1, "MO-7: no RTT connection when polling");
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// Issue 9, WP-5, RW-3, house rule 11: a command handed over encoded
/// ([`retry_driver::Client::run_command_encoded`]) runs as its `Document` twin does: an insert
/// stores its documents (a retryable write, the engine adding `lsid` and `txnNumber`), a
/// duplicate key is a write error that keeps the reply, a read returns its batch, and bytes that
/// are not BSON fail with a usage error before anything is sent.
pub async fn encoded_commands_run_as_their_documents_do<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let client = connect::<R>(options(&[&server]));
        let insert = bson::rawdoc! { "insert": "items", "documents": [{ "_id": 1 }, { "_id": 2 }] };
        let reply = client
            .run_command_encoded("test", insert, OperationKind::RetryableWrite)
            .await
            .expect("the insert");
        assert_eq!(reply.get_i32("n").ok(), Some(2));
        let duplicate = bson::rawdoc! { "insert": "items", "documents": [{ "_id": 2 }] };
        let error = client
            .run_command_encoded("test", duplicate, OperationKind::RetryableWrite)
            .await
            .expect_err("a duplicate key");
        let ErrorKind::Write(write) = &error.kind else {
            panic!("{error:?}")
        };
        assert_eq!(write.errors[0].code, Some(11000));
        assert_eq!(write.reply.get_i32("n").ok(), Some(0), "the reply is kept");
        let find = bson::rawdoc! { "find": "items", "filter": { "_id": 2 } };
        let reply = client
            .run_command_encoded("test", find, OperationKind::Read)
            .await
            .expect("the find");
        let batch = reply
            .get_document("cursor")
            .and_then(|cursor| cursor.get_array("firstBatch"))
            .expect("a first batch");
        assert_eq!(batch.into_iter().count(), 1);
        let counts = server.handle.counters().command("insert");
        assert_eq!((counts.received, counts.executed), (2, 2));

        // A length prefix and terminator around an element whose string length is wrong.
        // House rule 10 (review10 finding 10): nothing but heartbeats may reach the server. Every
        // frame the test server reads either parses, and is counted under its command's name
        // (an unknown or empty name included), or does not, and counts as a protocol error: so
        // the counters without the hellos stay as they were.
        let beyond_heartbeats = || {
            let mut counters = server.handle.counters();
            counters
                .commands
                .retain(|name, _| !matches!(name.as_str(), "hello" | "isMaster" | "ismaster"));
            (counters.commands, counters.protocol_errors)
        };
        let before = beyond_heartbeats();
        let mut bytes = bson::rawdoc! { "ping": "x" }.into_bytes();
        bytes[10] = 0x7f;
        let broken = bson::RawDocumentBuf::from_bytes(bytes).expect("framing is checked only");
        let error = client
            .run_command_encoded("admin", broken, OperationKind::RunCommand)
            .await
            .expect_err("not BSON");
        assert!(matches!(error.kind, ErrorKind::Usage { .. }), "{error:?}");
        assert_eq!(beyond_heartbeats(), before, "nothing sent");
        client.shutdown().await;
        server.stop().await;
    })
    .await
}
