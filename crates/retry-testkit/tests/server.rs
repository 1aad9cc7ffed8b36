//! The test server over real sockets on 127.0.0.1, driven by the raw client. Every test is bounded
//! by a timeout; none asserts a wall-clock duration.

use std::future::Future;
use std::io;
use std::time::Duration;

use bson::{doc, Bson, Document};
use retry_core::address::ServerAddress;
use retry_core::handshake::{validate_reply, LOAD_BALANCER_UNSUPPORTED};
use retry_core::time::Instant;
use retry_core::topology::ServerType::{RsPrimary, RsSecondary};
use retry_core::wire::MsgFlags;
use retry_testkit::{
    FailCommand, FailPointMode, FaultConfig, IngressLimit, RateLimit, RawClient, ReplicaSetMember,
    Role, ServerConfig, TestServer, FAIL_POINT_MESSAGE, HANDSHAKES_KEPT,
};

/// Runs a test body with a generous bound, so a bug hangs nothing.
async fn bounded<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(Duration::from_secs(20), body)
        .await
        .expect("the test finished within its bound");
}

async fn start(config: ServerConfig) -> (TestServer, RawClient) {
    let server = TestServer::start(config).await.expect("server starts");
    let client = RawClient::connect(server.address())
        .await
        .expect("client connects");
    (server, client)
}

/// A later hello on a connection: without `client`, which only the first may carry (HS-4,
/// ClientMetadataCannotBeMutated 186 on a real server).
fn heartbeat() -> Document {
    doc! { "hello": 1, "backpressure": "2", "$db": "admin" }
}

fn hello(app_name: &str) -> Document {
    doc! {
        "hello": 1,
        "backpressure": "2",
        "client": { "application": { "name": app_name },
                    "driver": { "name": "raw", "version": "0" }, "os": { "type": "linux" } },
        "$db": "admin",
    }
}

fn ping() -> Document {
    doc! { "ping": 1, "$db": "admin" }
}

fn code(reply: &Document) -> Option<i32> {
    reply.get_i32("code").ok()
}

fn labels(reply: &Document) -> Vec<String> {
    reply
        .get_array("errorLabels")
        .map(|a| {
            a.iter()
                .filter_map(|l| l.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The connection was closed or reset instead of answered (a write after a reset may also see
/// a broken pipe).
fn is_closed(result: &io::Result<impl std::fmt::Debug>) -> bool {
    matches!(
        result.as_ref().map_err(io::Error::kind),
        Err(io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe)
    )
}

#[tokio::test]
async fn hello_records_each_handshake_and_answers_in_kind() {
    bounded(async {
        let (server, mut client) = start(ServerConfig::default()).await;
        let reply = client.command(hello("lab")).await.unwrap();
        assert_eq!(reply.get_bool("isWritablePrimary").ok(), Some(true));
        assert_eq!(reply.get_f64("ok").ok(), Some(1.0));

        let mut legacy = RawClient::connect(server.address()).await.unwrap();
        let legacy_hello =
            doc! { "isMaster": 1, "helloOk": true, "backpressure": "2", "$db": "admin" };
        let reply = legacy.command(legacy_hello.clone()).await.unwrap();
        assert_eq!(reply.get_bool("ismaster").ok(), Some(true));
        assert_eq!(reply.get_bool("helloOk").ok(), Some(true));

        let handshakes = server.handle().handshakes();
        assert_eq!(handshakes.len(), 2);
        assert_eq!(handshakes[0].command, hello("lab"));
        assert_eq!(handshakes[1].command, legacy_hello);
        assert_eq!(
            handshakes[0].command.get_str("backpressure").ok(),
            Some("2")
        );
        assert_ne!(handshakes[0].connection_id, handshakes[1].connection_id);
        assert_eq!(
            reply.get_i32("connectionId").ok(),
            Some(handshakes[1].connection_id)
        );
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn fail_command_times_then_off() {
    bounded(async {
        let (server, mut client) = start(ServerConfig::default()).await;
        let handle = server.handle();
        handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(2), ["ping"])
                .with_error_code(91)
                .with_error_labels(["SystemOverloadedError", "RetryableError"]),
        ));
        for remaining in [Some(FailPointMode::Times(1)), None] {
            let reply = client.command(ping()).await.unwrap();
            assert_eq!(handle.fail_command().map(|f| f.mode), remaining);
            assert_eq!(code(&reply), Some(91));
            assert_eq!(reply.get_str("errmsg").ok(), Some(FAIL_POINT_MESSAGE));
            assert_eq!(labels(&reply), ["SystemOverloadedError", "RetryableError"]);
        }
        let reply = client.command(ping()).await.unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(0), ["ping"]).with_error_code(91),
        ));
        assert_eq!(handle.fail_command(), None, "times 0 is off");
        assert_eq!(code(&client.command(ping()).await.unwrap()), None);

        let counters = handle.counters();
        let pings = counters.command("ping");
        assert_eq!((pings.received, pings.executed), (4, 2));
        assert_eq!((pings.succeeded, pings.failed), (2, 2));
        assert_eq!(counters.fail_points_triggered, 2);
        server.shutdown().await;
    })
    .await;
}

/// TK-13, TK-16: every hello is recorded, but a long run (heartbeats never stop) keeps only the
/// latest [`HANDSHAKES_KEPT`], in order, on the raw path (hellos) and the Document path (a
/// `saslSupportedMechs` sends a hello there) alike.
#[tokio::test]
async fn tk16_the_handshake_record_keeps_only_the_latest_hellos() {
    bounded(async {
        let (server, mut client) = start(ServerConfig::default()).await;
        let total = HANDSHAKES_KEPT + 5;
        for i in 0..total {
            let mut hello = doc! { "hello": 1, "comment": i as i64, "$db": "admin" };
            if i % 2 == 1 {
                hello.insert("saslSupportedMechs", "admin.nobody");
            }
            client.command(hello).await.unwrap();
        }
        let handshakes = server.handle().handshakes();
        assert_eq!(handshakes.len(), HANDSHAKES_KEPT);
        let comments: Vec<i64> = handshakes
            .iter()
            .map(|h| h.command.get_i64("comment").unwrap())
            .collect();
        let latest: Vec<i64> = (5..total as i64).collect();
        assert_eq!(comments, latest, "the oldest five went, in order");
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_fail_point_can_close_the_handshake() {
    bounded(async {
        let (server, mut client) = start(ServerConfig::new(Role::Mongos)).await;
        let handle = server.handle();
        handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(1), ["hello", "isMaster"])
                .with_close_connection(),
        ));
        let result = client.command(hello("lab")).await;
        assert!(is_closed(&result), "{result:?}");
        let mut again = RawClient::connect(server.address()).await.unwrap();
        assert_eq!(code(&again.command(hello("lab")).await.unwrap()), None);

        assert_eq!(
            handle.handshakes().len(),
            2,
            "both handshakes were recorded"
        );
        let hellos = handle.counters().command("hello");
        assert_eq!((hellos.received, hellos.executed), (2, 1));
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn configure_fail_point_over_the_wire_always_on_then_off() {
    bounded(async {
        let (server, mut client) = start(ServerConfig::default()).await;
        let on = doc! {
            "configureFailPoint": "failCommand", "mode": "alwaysOn",
            "data": { "failCommands": ["find"], "errorCode": 10107 },
            "$db": "admin",
        };
        assert_eq!(
            client.command(on).await.unwrap().get_f64("ok").ok(),
            Some(1.0)
        );
        let find = doc! { "find": "c", "$db": "db" };
        for _ in 0..3 {
            let reply = client.command(find.clone()).await.unwrap();
            assert_eq!(code(&reply), Some(10107));
            assert_eq!(reply.get_str("codeName").ok(), Some("NotWritablePrimary"));
        }
        let off = doc! { "configureFailPoint": "failCommand", "mode": "off", "$db": "admin" };
        client.command(off).await.unwrap();
        let reply = client.command(find).await.unwrap();
        assert_eq!(code(&reply), None, "{reply}");

        let bad = doc! { "configureFailPoint": "failCommand", "mode": "sometimes", "$db": "admin" };
        let reply = client.command(bad).await.unwrap();
        assert_eq!(code(&reply), Some(2));
        assert_eq!(server.handle().counters().command("find").executed, 1);
        server.shutdown().await;
    })
    .await;
}

/// Review24 R1 (house rule 7): a fail point's error and a refusal carry the name the server's
/// `error_codes.yml` gives their code (`AuthenticationFailed` for 18, as the SDAM auth-error spec
/// tests configure it; `NoSuchKey` for a `$readPreference` without `mode`), not `Location<code>`.
#[tokio::test]
async fn review24_r1_replies_carry_the_servers_code_name() {
    bounded(async {
        let (server, mut client) = start(ServerConfig::default()).await;
        let on = doc! {
            "configureFailPoint": "failCommand", "mode": { "times": 1 },
            "data": { "failCommands": ["find"], "errorCode": 18 },
            "$db": "admin",
        };
        assert_eq!(code(&client.command(on).await.unwrap()), None);
        let reply = client
            .command(doc! { "find": "c", "$db": "db" })
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(18), "{reply}");
        assert_eq!(reply.get_str("codeName").ok(), Some("AuthenticationFailed"));
        let no_mode = doc! { "find": "c", "$readPreference": { "tags": [] }, "$db": "db" };
        let reply = client.command(no_mode).await.unwrap();
        assert_eq!(code(&reply), Some(4), "{reply}");
        assert_eq!(reply.get_str("codeName").ok(), Some("NoSuchKey"));
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn close_connection_means_the_write_never_ran() {
    bounded(async {
        let (server, mut client) = start(ServerConfig::new(Role::Mongos)).await;
        let handle = server.handle();
        handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(1), ["insert"]).with_close_connection(),
        ));
        let insert = doc! { "insert": "c", "documents": [{ "_id": 1 }], "$db": "db" };
        let result = client.command(insert.clone()).await;
        assert!(is_closed(&result), "{result:?}");

        let mut again = RawClient::connect(server.address()).await.unwrap();
        let reply = again.command(insert).await.unwrap();
        assert_eq!(reply.get_i32("n").ok(), Some(1));

        let counters = handle.counters();
        let inserts = counters.command("insert");
        assert_eq!((inserts.received, inserts.executed), (2, 1));
        assert_eq!(handle.documents("db.c").len(), 1);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_retried_write_whose_reply_was_lost_runs_once() {
    bounded(async {
        let config = ServerConfig {
            faults: FaultConfig {
                reset_mid_frame: 1.0,
                ..FaultConfig::default()
            },
            ..ServerConfig::new(Role::Mongos)
        };
        let (server, mut client) = start(config).await;
        let handle = server.handle();
        let insert = |txn_number: i64| {
            doc! {
                "insert": "c", "documents": [{ "x": txn_number }],
                "lsid": { "id": Bson::Binary(bson::Binary {
                    subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] }) },
                "txnNumber": txn_number, "$db": "db",
            }
        };
        // The insert runs, then its reply is cut by a reset.
        let result = client.command(insert(1)).await;
        assert!(result.is_err(), "{result:?}");
        handle.set_faults(FaultConfig::default());

        let mut retry = RawClient::connect(server.address()).await.unwrap();
        let reply = retry.command(insert(1)).await.unwrap();
        assert_eq!(reply.get_i32("n").ok(), Some(1));
        assert_eq!(
            handle.documents("db.c").len(),
            1,
            "the retry did not insert again"
        );
        // The next transaction number is a new write.
        retry.command(insert(2)).await.unwrap();
        assert_eq!(handle.documents("db.c").len(), 2);

        let inserts = handle.counters().command("insert");
        assert_eq!(
            (inserts.received, inserts.executed, inserts.replayed),
            (3, 2, 1)
        );
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn block_connection_holds_only_that_command() {
    bounded(async {
        let (server, mut blocked) = start(ServerConfig::default()).await;
        let handle = server.handle();
        handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(1), ["find"]).with_block(Duration::from_secs(1)),
        ));
        let mut other = RawClient::connect(server.address()).await.unwrap();

        blocked
            .send(doc! { "find": "c", "$db": "db" }, MsgFlags::NONE)
            .await
            .unwrap();
        // The find is held: the fail point fired, but the command has not run.
        let mut fired = false;
        for _ in 0..200 {
            if handle.counters().fail_points_triggered == 1 {
                fired = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(fired);
        // A ping on another connection is answered while the find is still held...
        other.command(ping()).await.unwrap();
        assert_eq!(handle.counters().command("find").executed, 0);
        // ...then the find completes normally.
        let reply = blocked.receive().await.unwrap();
        assert!(reply.body.get_document("cursor").is_ok(), "{}", reply.body);
        let counters = handle.counters();
        assert_eq!(counters.command("find").executed, 1);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn app_name_filter_and_write_concern_error() {
    bounded(async {
        let (server, mut lab) = start(ServerConfig::default()).await;
        let mut other = RawClient::connect(server.address()).await.unwrap();
        lab.command(hello("lab")).await.unwrap();
        other.command(hello("other")).await.unwrap();
        server.handle().set_fail_command(Some(
            FailCommand::new(FailPointMode::AlwaysOn, ["insert"])
                .with_app_name("lab")
                .with_write_concern_error(doc! { "code": 91, "errmsg": "shutting down" }),
        ));
        let insert = doc! { "insert": "c", "documents": [{ "x": 1 }], "$db": "db" };
        let reply = other.command(insert.clone()).await.unwrap();
        assert!(!reply.contains_key("writeConcernError"));
        let reply = lab.command(insert).await.unwrap();
        let error = reply.get_document("writeConcernError").unwrap();
        assert_eq!(error.get_i32("code").ok(), Some(91));
        assert_eq!(reply.get_i32("n").ok(), Some(1), "the write ran");
        assert_eq!(server.handle().documents("db.c").len(), 2);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn ingress_limiter_rejects_with_462_and_both_labels_but_never_hello() {
    bounded(async {
        let limit = IngressLimit {
            rate: RateLimit::new(0.0, 2),
            base_backoff_ms: Some(50),
        };
        let config = ServerConfig {
            ingress_limit: Some(limit),
            ..ServerConfig::new(Role::Mongos)
        };
        let (server, mut client) = start(config).await;
        let handle = server.handle();
        for i in 0..5 {
            let body = if i == 0 { hello("lab") } else { heartbeat() };
            let reply = client.command(body).await.unwrap();
            assert_eq!(code(&reply), None, "BP-6: hello is never limited");
        }
        for _ in 0..2 {
            assert_eq!(code(&client.command(ping()).await.unwrap()), None);
        }
        let reply = client.command(ping()).await.unwrap();
        assert_eq!(code(&reply), Some(462));
        assert_eq!(
            reply.get_str("codeName").ok(),
            Some("IngressRequestRateLimitExceeded")
        );
        assert_eq!(labels(&reply), ["SystemOverloadedError", "RetryableError"]);
        assert_eq!(reply.get_i64("baseBackoffMS").ok(), Some(50));

        // A test can still configure fail points under load, and lift the limit at run time.
        let off = doc! { "configureFailPoint": "failCommand", "mode": "off", "$db": "admin" };
        assert_eq!(code(&client.command(off).await.unwrap()), None);
        handle.set_ingress_limit(None);
        assert_eq!(code(&client.command(ping()).await.unwrap()), None);

        let counters = handle.counters();
        assert_eq!(counters.ingress_rejected, 1);
        let pings = counters.command("ping");
        assert_eq!((pings.received, pings.executed, pings.failed), (4, 3, 1));
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn connection_limiter_closes_before_the_handshake() {
    bounded(async {
        let config = ServerConfig {
            connection_limit: Some(RateLimit::new(0.0, 1)),
            ..ServerConfig::default()
        };
        let (server, mut first) = start(config).await;
        assert_eq!(code(&first.command(hello("lab")).await.unwrap()), None);

        let mut second = RawClient::connect(server.address()).await.unwrap();
        let result = second.command(hello("lab")).await;
        assert!(is_closed(&result), "{result:?}");

        let handle = server.handle();
        assert_eq!(handle.handshakes().len(), 1);
        let counters = handle.counters();
        assert_eq!(counters.connections_accepted, 2);
        assert_eq!(counters.connections_rejected, 1);
        assert_eq!(counters.command("hello").received, 1);

        // Lifting the limit at run time admits new connections.
        handle.set_connection_limit(None);
        let mut third = RawClient::connect(server.address()).await.unwrap();
        assert_eq!(code(&third.command(hello("lab")).await.unwrap()), None);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn load_balancer_service_id_only_with_load_balanced() {
    bounded(async {
        let address = ServerAddress::new("127.0.0.1", 1);
        let validate = |reply: &Document| {
            validate_reply(reply, &address, true, Duration::ZERO, Instant::ZERO)
                .map_err(|e| e.to_string())
        };
        let lb_hello = doc! { "hello": 1, "loadBalanced": true, "$db": "admin" };

        let (server, mut client) =
            start(ServerConfig::new(Role::LoadBalancer { service_id: true })).await;
        let reply = client.command(lb_hello.clone()).await.unwrap();
        assert_eq!(
            reply.get_object_id("serviceId").ok(),
            Some(server.handle().process_id())
        );
        let described = validate(&reply).unwrap();
        assert_eq!(described.service_id, Some(server.handle().process_id()));
        let plain = client.command(hello("lab")).await.unwrap();
        assert!(!plain.contains_key("serviceId"));
        server.shutdown().await;

        let (server, mut client) =
            start(ServerConfig::new(Role::LoadBalancer { service_id: false })).await;
        let reply = client.command(lb_hello).await.unwrap();
        assert!(!reply.contains_key("serviceId"));
        assert_eq!(validate(&reply).unwrap_err(), LOAD_BALANCER_UNSUPPORTED);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn find_get_more_kill_cursors_round_trip() {
    bounded(async {
        let (server, mut client) = start(ServerConfig::default()).await;
        let handle = server.handle();
        let documents: Vec<Document> = (0..5).map(|i| doc! { "_id": i }).collect();
        let insert = doc! { "insert": "c", "documents": documents, "$db": "db" };
        assert_eq!(
            client.command(insert).await.unwrap().get_i32("n").ok(),
            Some(5)
        );

        let reply = client
            .command(doc! { "find": "c", "batchSize": 2, "$db": "db" })
            .await
            .unwrap();
        let cursor = reply.get_document("cursor").unwrap();
        assert_eq!(cursor.get_array("firstBatch").unwrap().len(), 2);
        assert_eq!(cursor.get_str("ns").ok(), Some("db.c"));
        let id = cursor.get_i64("id").unwrap();
        assert_ne!(id, 0);

        let get_more = doc! { "getMore": id, "collection": "c", "batchSize": 2, "$db": "db" };
        let reply = client.command(get_more).await.unwrap();
        let cursor = reply.get_document("cursor").unwrap();
        let batch = cursor.get_array("nextBatch").unwrap();
        assert_eq!(batch[0], Bson::Document(doc! { "_id": 2 }));
        let id = cursor.get_i64("id").unwrap();
        assert_ne!(id, 0);
        assert_eq!(handle.open_cursors(), 1);

        let kill = doc! { "killCursors": "c", "cursors": [id], "$db": "db" };
        let reply = client.command(kill).await.unwrap();
        assert_eq!(
            reply.get_array("cursorsKilled").unwrap(),
            &vec![Bson::Int64(id)]
        );
        assert_eq!(handle.open_cursors(), 0);
        let get_more = doc! { "getMore": id, "collection": "c", "$db": "db" };
        let reply = client.command(get_more).await.unwrap();
        assert_eq!(code(&reply), Some(43));

        // Documents seeded through the handle are found like inserted ones, without a command.
        handle.insert("db.seeded", vec![doc! { "_id": "a" }]);
        let reply = client
            .command(doc! { "find": "seeded", "$db": "db" })
            .await
            .unwrap();
        let cursor = reply.get_document("cursor").unwrap();
        assert_eq!(
            cursor.get_array("firstBatch").unwrap(),
            &vec![Bson::Document(doc! { "_id": "a" })]
        );
        assert_eq!(handle.counters().command("insert").received, 1);

        // A batch size that reaches the end returns id 0 at once.
        let find = doc! { "find": "c", "filter": { "_id": 3 }, "batchSize": 10, "$db": "db" };
        let reply = client.command(find).await.unwrap();
        let cursor = reply.get_document("cursor").unwrap();
        assert_eq!(cursor.get_i64("id").ok(), Some(0));
        assert_eq!(cursor.get_array("firstBatch").unwrap().len(), 1);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn bad_requests_get_errors_and_garbage_closes_only_that_connection() {
    bounded(async {
        let (server, mut client) = start(ServerConfig::default()).await;
        let reply = client.command(doc! { "ping": 1 }).await.unwrap();
        assert_eq!(code(&reply), Some(40571), "OP_MSG needs $db");
        let reply = client
            .command(doc! { "frobnicate": 1, "$db": "db" })
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(59));
        let reply = client
            .command(doc! { "find": 1, "$db": "db" })
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(2));

        let mut bad = RawClient::connect(server.address()).await.unwrap();
        bad.send_raw(&[0xff; 40]).await.unwrap();
        let result = bad.receive().await;
        assert!(is_closed(&result), "{result:?}");

        assert_eq!(code(&client.command(ping()).await.unwrap()), None);
        let counters = server.handle().counters();
        assert_eq!(counters.protocol_errors, 1);
        assert_eq!(counters.command("frobnicate").executed, 0);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn more_to_come_requests_get_no_reply() {
    bounded(async {
        let (server, mut client) = start(ServerConfig::default()).await;
        let insert = doc! { "insert": "c", "documents": [{ "x": 1 }], "$db": "db" };
        client.send(insert, MsgFlags::MORE_TO_COME).await.unwrap();
        let request_id = client.send(ping(), MsgFlags::NONE).await.unwrap();
        let reply = client.receive().await.unwrap();
        assert_eq!(
            reply.response_to, request_id,
            "the first reply answers the ping"
        );
        assert_eq!(server.handle().documents("db.c").len(), 1);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn random_faults_break_replies_as_configured() {
    bounded(async {
        let with = |faults: FaultConfig| ServerConfig {
            faults: FaultConfig {
                stall_for: Duration::from_millis(20),
                ..faults
            },
            seed: 11,
            ..ServerConfig::default()
        };
        let none = FaultConfig::default();
        let reset_or_eof = [io::ErrorKind::ConnectionReset, io::ErrorKind::UnexpectedEof];
        let cases = [
            (
                FaultConfig {
                    garbage: 1.0,
                    ..none.clone()
                },
                &[io::ErrorKind::InvalidData][..],
            ),
            (
                FaultConfig {
                    oversized_length: 1.0,
                    ..none.clone()
                },
                &[io::ErrorKind::InvalidData][..],
            ),
            (
                FaultConfig {
                    reset_mid_frame: 1.0,
                    ..none.clone()
                },
                &reset_or_eof[..],
            ),
        ];
        for (faults, expected) in cases {
            let (server, mut client) = start(with(faults)).await;
            let result = client.command(ping()).await;
            let kind = result.as_ref().map_err(io::Error::kind).err();
            assert!(kind.is_some_and(|k| expected.contains(&k)), "{result:?}");
            assert_eq!(server.handle().counters().faults.total(), 1);
            server.shutdown().await;
        }

        // A stall delivers the reply late but whole.
        let (server, mut client) = start(with(FaultConfig { stall: 1.0, ..none })).await;
        let reply = client.command(ping()).await.unwrap();
        assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
        // configureFailPoint is never faulted.
        let off = doc! { "configureFailPoint": "failCommand", "mode": "off", "$db": "admin" };
        client.command(off).await.unwrap();
        assert_eq!(server.handle().counters().faults.stall, 1);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn roles_change_at_run_time_and_bump_the_topology_version() {
    bounded(async {
        let role = Role::ReplicaSetMember(ReplicaSetMember::primary("rs0"));
        let (server, mut client) = start(ServerConfig::new(role)).await;
        let me = server.address().to_string();
        let reply = client.command(hello("lab")).await.unwrap();
        assert_eq!(reply.get_str("setName").ok(), Some("rs0"));
        assert_eq!(reply.get_str("primary").ok(), Some(me.as_str()));
        let counter = |r: &Document| {
            r.get_document("topologyVersion")
                .unwrap()
                .get_i64("counter")
        };
        assert_eq!(counter(&reply).ok(), Some(0));

        server
            .handle()
            .set_role(Role::ReplicaSetMember(ReplicaSetMember {
                hosts: vec![me.clone(), "127.0.0.1:1".into()],
                primary_host: Some("127.0.0.1:1".into()),
                ..ReplicaSetMember::secondary("rs0")
            }));
        let reply = client.command(heartbeat()).await.unwrap();
        assert_eq!(reply.get_bool("isWritablePrimary").ok(), Some(false));
        assert_eq!(reply.get_bool("secondary").ok(), Some(true));
        assert_eq!(reply.get_str("primary").ok(), Some("127.0.0.1:1"));
        assert_eq!(reply.get_array("hosts").unwrap().len(), 2);
        assert_eq!(counter(&reply).ok(), Some(1));
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_replica_set_of_three_reports_its_members() {
    bounded(async {
        let servers = TestServer::start_replica_set("rs0", 3, ServerConfig::default())
            .await
            .unwrap();
        let hosts: Vec<Bson> = servers
            .iter()
            .map(|s| Bson::String(s.address().to_string()))
            .collect();
        let mut types = Vec::new();
        for server in &servers {
            let mut client = RawClient::connect(server.address()).await.unwrap();
            let reply = client.command(hello("lab")).await.unwrap();
            assert_eq!(reply.get_array("hosts").unwrap(), &hosts);
            assert_eq!(reply.get_str("primary").ok(), hosts[0].as_str());
            assert_eq!(
                reply.get_str("me").ok(),
                Some(server.address().to_string().as_str())
            );
            let address = ServerAddress::new("127.0.0.1", server.address().port());
            let described =
                validate_reply(&reply, &address, false, Duration::ZERO, Instant::ZERO).unwrap();
            types.push(described.description.server_type);
        }
        assert_eq!(types, [RsPrimary, RsSecondary, RsSecondary]);
        for server in servers {
            server.shutdown().await;
        }
    })
    .await;
}

#[tokio::test]
async fn shutdown_closes_every_connection_and_counters_reset() {
    bounded(async {
        let (server, mut client) = start(ServerConfig::default()).await;
        let handle = server.handle();
        client.command(ping()).await.unwrap();
        assert_eq!(handle.counters().command("ping").received, 1);
        handle.reset_counters();
        assert_eq!(handle.counters(), Default::default());

        client.command(ping()).await.unwrap();
        let address = server.address();
        server.shutdown().await;
        let result = client.command(ping()).await;
        assert!(result.is_err(), "{result:?}");
        assert!(
            RawClient::connect(address).await.is_err(),
            "no longer listening"
        );
        let counters = handle.counters();
        assert_eq!(
            counters.connections_closed, 1,
            "the aborted connection counted"
        );
    })
    .await;
}

/// TK (faithful errors): a replica-set member's "not writable primary" / "node is recovering"
/// error reply carries its current `topologyVersion`, from `errorCode` and from a
/// `writeConcernError` alike, as a 4.4+ mongod's does; shutdown errors (91) and a standalone's
/// errors do not.
#[tokio::test]
async fn state_change_errors_of_a_member_carry_its_topology_version() {
    bounded(async {
        let role = Role::ReplicaSetMember(ReplicaSetMember::primary("rs0"));
        let (server, mut client) = start(ServerConfig::new(role)).await;
        let hello_reply = client.command(hello("lab")).await.unwrap();
        let current = hello_reply.get_document("topologyVersion").unwrap().clone();
        let fail = |data: Document| {
            doc! { "configureFailPoint": "failCommand", "mode": { "times": 1 }, "data": data,
            "$db": "admin" }
        };
        let insert = doc! { "insert": "c", "documents": [{ "_id": 1 }], "$db": "db" };
        for data in [
            doc! { "failCommands": ["insert"], "errorCode": 10107 },
            doc! { "failCommands": ["insert"], "errorCode": 189 },
            doc! { "failCommands": ["insert"],
            "writeConcernError": { "code": 11602, "errmsg": "x" } },
        ] {
            client.command(fail(data)).await.unwrap();
            let reply = client.command(insert.clone()).await.unwrap();
            assert_eq!(
                reply.get_document("topologyVersion").ok(),
                Some(&current),
                "{reply}"
            );
        }
        client
            .command(fail(doc! { "failCommands": ["insert"], "errorCode": 91 }))
            .await
            .unwrap();
        let reply = client.command(insert.clone()).await.unwrap();
        assert_eq!(code(&reply), Some(91));
        assert!(!reply.contains_key("topologyVersion"), "{reply}");
        server.shutdown().await;

        let (server, mut client) = start(ServerConfig::default()).await;
        client
            .command(fail(
                doc! { "failCommands": ["insert"], "errorCode": 10107 },
            ))
            .await
            .unwrap();
        let reply = client.command(insert).await.unwrap();
        assert_eq!(code(&reply), Some(10107));
        assert!(!reply.contains_key("topologyVersion"), "{reply}");
        server.shutdown().await;
    })
    .await;
}
