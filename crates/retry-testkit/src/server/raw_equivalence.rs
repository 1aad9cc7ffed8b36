//! House rule 7, issue 9: the raw path (`raw`) answers exactly as the Document path. The same
//! script of valid and invalid commands, fail points, limiter and faults runs against a server
//! with the raw path and one without it (both with the same `me` and process id, so nothing may
//! legitimately differ); every reply frame, byte for byte, every close, and the counters,
//! handshakes, unsupported log and command log must be equal.

use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document, Timestamp};
use retry_core::wire::{DocumentSequence, MsgFlags, OpMsg};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Duration};

use super::{Internals, ServerHandle, TestServer};
use crate::config::{IngressLimit, RateLimit, ReplicaSetMember, Role, ServerConfig};
use crate::fail_point::{FailCommand, FailPointMode};
use crate::faults::FaultConfig;
use crate::store::DataStore;
use crate::ScramVersion;

/// One step of the script.
enum Step {
    /// Send this frame; read its reply unless it has `moreToCome`.
    Send(String, Vec<u8>, bool),
    /// Change the server through its handle.
    Handle(Box<dyn Fn(&ServerHandle)>),
    /// Close the connection and open a new one.
    Reconnect,
}

/// What one step gave.
#[derive(Debug, PartialEq)]
enum Outcome {
    Reply(Vec<u8>),
    NoReply,
    Closed,
    Done,
}

fn binary(subtype: BinarySubtype, byte: u8) -> Bson {
    Bson::Binary(Binary {
        subtype,
        bytes: vec![byte; 16],
    })
}

fn lsid(byte: u8) -> Document {
    doc! { "id": binary(BinarySubtype::Uuid, byte) }
}

/// `body` with the fields of `extra` appended, repeated keys included (a `Document` cannot
/// hold them).
fn appended(body: &Document, extra: &Document) -> Vec<u8> {
    let (mut bytes, extra) = (body.to_vec().unwrap(), extra.to_vec().unwrap());
    bytes.pop();
    bytes.extend_from_slice(&extra[4..]);
    let length = bytes.len() as i32;
    bytes[..4].copy_from_slice(&length.to_le_bytes());
    bytes
}

/// An OP_MSG frame of an encoded body.
fn frame(request_id: i32, flags: MsgFlags, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    let length = (21 + body.len()) as i32;
    for field in [length, request_id, 0, 2013] {
        bytes.extend_from_slice(&field.to_le_bytes());
    }
    bytes.extend_from_slice(&flags.bits().to_le_bytes());
    bytes.push(0);
    bytes.extend_from_slice(body);
    bytes
}

struct Script {
    steps: Vec<Step>,
}

impl Script {
    fn id(&self) -> i32 {
        self.steps.len() as i32 + 1
    }

    fn send(&mut self, label: &str, body: Document) {
        self.send_with(label, body, MsgFlags::NONE, Vec::new());
    }

    fn send_with(
        &mut self,
        label: &str,
        body: Document,
        flags: MsgFlags,
        sequences: Vec<DocumentSequence>,
    ) {
        let message = OpMsg {
            request_id: self.id(),
            response_to: 0,
            flags,
            body,
            sequences,
        };
        let mut bytes = Vec::new();
        message.encode(48_000_000, &mut bytes).unwrap();
        let more_to_come = flags.contains(MsgFlags::MORE_TO_COME);
        self.steps
            .push(Step::Send(label.to_owned(), bytes, !more_to_come));
    }

    fn send_bytes(&mut self, label: &str, body: &[u8]) {
        let bytes = frame(self.id(), MsgFlags::NONE, body);
        self.steps.push(Step::Send(label.to_owned(), bytes, true));
    }

    fn handle(&mut self, change: impl Fn(&ServerHandle) + 'static) {
        self.steps.push(Step::Handle(Box::new(change)));
    }
}

/// The commands: every hot command shape the raw path accepts, and each way one can be refused
/// or must go the Document path.
fn script(role: &Role) -> Script {
    let mut s = Script { steps: Vec::new() };
    let ping = || doc! { "ping": 1, "$db": "admin" };
    let with = |mut body: Document, extra: Document| {
        body.extend(extra);
        body
    };
    let client = |app: &str| {
        doc! {
            "application": { "name": app },
            "driver": { "name": "retry-core", "version": "0" },
            "os": { "type": "linux" },
        }
    };
    // The handshake, then plain pings.
    s.send(
        "hello with client, helloOk, compression, backpressure",
        doc! { "hello": 1, "helloOk": true, "client": client("app1"), "compression": ["zstd"],
        "backpressure": "2", "loadBalanced": true, "$db": "admin" },
    );
    s.send("ping", ping());
    s.send("ping with lsid", with(ping(), doc! { "lsid": lsid(1) }));
    s.send(
        "ping with lsid again",
        with(ping(), doc! { "lsid": lsid(1) }),
    );
    s.send(
        "ping with another lsid",
        with(ping(), doc! { "lsid": lsid(2) }),
    );
    s.send(
        "ping with every accepted field",
        doc! { "ping": 1.0, "lsid": lsid(3), "$clusterTime": { "clusterTime": Timestamp {
        time: 1, increment: 1 }, "signature": { "hash": binary(BinarySubtype::Generic, 0),
        "keyId": 0_i64 } }, "$readPreference": { "mode": "primaryPreferred" },
        "apiVersion": "1", "apiStrict": false, "apiDeprecationErrors": false, "comment": "c",
        "maxTimeMS": 100, "$db": "admin" },
    );
    // SE-17 (review6 finding 8): a later gossiped $clusterTime moves the clock on both paths;
    // a malformed one is refused on both.
    s.send(
        "ping gossiping a later $clusterTime",
        doc! { "ping": 1, "$clusterTime": { "clusterTime": Timestamp { time: 1_800_000_000,
        increment: 7 }, "signature": { "hash": binary(BinarySubtype::Generic, 0),
        "keyId": 0_i64 } }, "$db": "admin" },
    );
    s.send(
        "ping, $clusterTime without a signature",
        doc! { "ping": 1, "$clusterTime": { "clusterTime": Timestamp { time: 1, increment: 1 } },
        "$db": "admin" },
    );
    s.send(
        "ping, $clusterTime keyId an int32",
        doc! { "ping": 1, "$clusterTime": { "clusterTime": Timestamp { time: 1, increment: 1 },
        "signature": { "hash": binary(BinarySubtype::Generic, 0), "keyId": 0 } },
        "$db": "admin" },
    );
    // A connection's hello replies differ by what the request asks.
    s.send("hello without helloOk", doc! { "hello": 1, "$db": "admin" });
    s.send(
        "hello with helloOk",
        doc! { "hello": 1, "helloOk": true, "$db": "admin" },
    );
    s.send(
        "hello with loadBalanced",
        doc! { "hello": 1, "loadBalanced": true, "$db": "admin" },
    );
    s.send(
        "hello with helloOk false",
        doc! { "hello": 1, "helloOk": false, "loadBalanced": false, "$db": "admin" },
    );
    // Refusals and fields the raw path leaves to the Document path.
    s.send("ping without $db", doc! { "ping": 1 });
    s.send("hello without $db", doc! { "hello": 1 });
    // Review32 R4: database names a server refuses (`crate::database_name`), on both paths; a
    // router refuses `local`.
    for db in [
        "",
        "te.st",
        "te\0st",
        "a b",
        "a/b",
        "local",
        &"d".repeat(64),
    ] {
        s.send(&format!("ping on {db:?}"), doc! { "ping": 1, "$db": db });
        s.send(&format!("hello on {db:?}"), doc! { "hello": 1, "$db": db });
    }
    s.send("ping on $external", doc! { "ping": 1, "$db": "$external" });
    s.send(
        "ping, lsid.id not binary",
        with(ping(), doc! { "lsid": { "id": 5 } }),
    );
    s.send("ping, lsid a string", with(ping(), doc! { "lsid": "x" }));
    s.send(
        "ping, lsid with a uid",
        with(
            ping(),
            doc! { "lsid": { "id": binary(BinarySubtype::Uuid, 4), "uid": binary(BinarySubtype::Generic, 1) } },
        ),
    );
    s.send(
        "ping, lsid of subtype BinaryOld",
        with(
            ping(),
            doc! { "lsid": { "id": binary(BinarySubtype::BinaryOld, 5) } },
        ),
    );
    s.send(
        "ping, lsid of subtype Generic",
        with(
            ping(),
            doc! { "lsid": { "id": binary(BinarySubtype::Generic, 6) } },
        ),
    );
    // SE-3 (review6 finding 9): a UUID of 12 bytes is InvalidUUID on both paths.
    s.send(
        "ping, lsid a 12-byte UUID",
        with(
            ping(),
            doc! { "lsid": { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![7; 12] } } },
        ),
    );
    for (label, max_time) in [
        ("-1", Bson::Int32(-1)),
        ("1.5", Bson::Double(1.5)),
        ("string", Bson::String("5".into())),
        ("2^31", Bson::Int64(1 << 31)),
        ("int64 5", Bson::Int64(5)),
        ("double 7", Bson::Double(7.0)),
    ] {
        s.send(
            &format!("ping, maxTimeMS {label}"),
            with(ping(), doc! { "maxTimeMS": max_time }),
        );
    }
    s.send(
        "ping, txnNumber",
        with(ping(), doc! { "lsid": lsid(1), "txnNumber": 1_i64 }),
    );
    s.send(
        "ping, txnNumber int32",
        with(ping(), doc! { "lsid": lsid(1), "txnNumber": 1 }),
    );
    s.send(
        "ping in a transaction",
        with(
            ping(),
            doc! { "lsid": lsid(1), "txnNumber": 2_i64, "autocommit": false,
            "startTransaction": true },
        ),
    );
    s.send(
        "ping, startTransaction alone",
        with(ping(), doc! { "startTransaction": true }),
    );
    s.send(
        "ping, readConcern local",
        with(ping(), doc! { "readConcern": { "level": "local" } }),
    );
    s.send(
        "ping, readConcern unknown level",
        with(ping(), doc! { "readConcern": { "level": "strong" } }),
    );
    s.send(
        "ping, afterClusterTime ahead",
        with(
            ping(),
            doc! { "readConcern": { "afterClusterTime": Timestamp { time: 2_000_000_000,
            increment: 1 } } },
        ),
    );
    s.send(
        "ping, writeConcern w: 5",
        with(ping(), doc! { "writeConcern": { "w": 5 } }),
    );
    // Review37 W9: a `$readPreference` is checked beyond its mode.
    s.send(
        "ping, primary with tags",
        with(
            ping(),
            doc! { "$readPreference": { "mode": "primary", "tags": [{ "dc": "ny" }] } },
        ),
    );
    s.send(
        "ping, maxStalenessSeconds below 90",
        with(
            ping(),
            doc! { "$readPreference": { "mode": "nearest", "maxStalenessSeconds": 10 } },
        ),
    );
    s.send(
        "ping, secondary with tags",
        with(
            ping(),
            doc! { "$readPreference": { "mode": "secondary", "tags": [{ "dc": "ny" }, {}] } },
        ),
    );
    s.send("ping, unknown field", with(ping(), doc! { "foo": 1 }));
    s.send_bytes(
        "ping, $db twice",
        &appended(&ping(), &doc! { "$db": "other" }),
    );
    s.send_bytes(
        "ping, lsid twice, the second bad",
        &appended(
            &with(ping(), doc! { "lsid": lsid(1) }),
            &doc! { "lsid": { "id": 1 } },
        ),
    );
    s.send_bytes(
        "hello, client twice",
        &appended(
            &doc! { "hello": 1, "$db": "admin", "client": client("first") },
            &doc! { "client": client("second") },
        ),
    );
    let mut body = doc! { "ismaster": 1, "$db": "admin" }.to_vec().unwrap();
    let twice = appended(
        &doc! { "application": { "name": "a" } },
        &doc! { "application": { "name": "b" } },
    );
    body.pop();
    body.push(3);
    body.extend_from_slice(b"client\0");
    body.extend_from_slice(&twice);
    body.push(0);
    let length = body.len() as i32;
    body[..4].copy_from_slice(&length.to_le_bytes());
    s.send_bytes("ismaster, client.application twice", &body);
    s.send_with(
        "ping with a document sequence",
        ping(),
        MsgFlags::NONE,
        vec![DocumentSequence {
            identifier: "documents".into(),
            documents: vec![doc! { "x": 1 }],
        }],
    );
    s.send_with(
        "ping with moreToCome",
        with(ping(), doc! { "lsid": lsid(7) }),
        MsgFlags::MORE_TO_COME,
        Vec::new(),
    );
    s.send_with(
        "ping with a checksum",
        ping(),
        MsgFlags::CHECKSUM_PRESENT,
        Vec::new(),
    );
    s.send("Ping (not a command)", doc! { "Ping": 1, "$db": "admin" });
    s.send(
        "isMaster",
        doc! { "isMaster": 1, "helloOk": true, "$db": "admin" },
    );
    s.send("ismaster", doc! { "ismaster": 1, "$db": "admin" });
    s.send(
        "hello, helloOk not a bool",
        doc! { "hello": 1, "helloOk": 1, "$db": "admin" },
    );
    s.send(
        "hello, topologyVersion alone",
        doc! { "hello": 1, "topologyVersion": { "counter": 0_i64 }, "$db": "admin" },
    );
    s.send(
        "awaitable hello of another process",
        doc! { "hello": 1, "topologyVersion": { "processId": bson::oid::ObjectId::from_bytes([9; 12]),
        "counter": 0_i64 }, "maxAwaitTimeMS": 0, "$db": "admin" },
    );
    s.send(
        "hello, saslSupportedMechs",
        doc! { "hello": 1, "saslSupportedMechs": "admin.user", "$db": "admin" },
    );
    s.send(
        "hello, bad lsid",
        doc! { "hello": 1, "lsid": { "id": "x" }, "$db": "admin" },
    );
    s.send(
        "hello, bad maxTimeMS",
        doc! { "hello": 1, "maxTimeMS": -5, "$db": "admin" },
    );
    // A write moves the cluster time on: the next ping's reply carries the new one.
    s.send(
        "retryable insert",
        doc! { "insert": "c", "documents": [{ "_id": 1 }], "lsid": lsid(8), "txnNumber": 1_i64,
        "$db": "db" },
    );
    s.send("ping after a write", with(ping(), doc! { "lsid": lsid(8) }));
    s.send(
        "$listLocalSessions",
        doc! { "aggregate": 1, "pipeline": [{ "$listLocalSessions": {} }], "cursor": {},
        "$db": "admin" },
    );
    // UT-25, TK-15 (review9 finding 2): killing a session closes its cursors on both paths; the
    // session's hot commands (raw path) go on after the kill.
    s.send(
        "insert more",
        doc! { "insert": "c", "documents": [{ "_id": 2 }, { "_id": 3 }], "$db": "db" },
    );
    for session in [10, 11] {
        s.send(
            &format!("find in session {session}"),
            doc! { "find": "c", "batchSize": 1, "lsid": lsid(session), "$db": "db" },
        );
        s.send(
            &format!("ping in session {session}"),
            with(ping(), doc! { "lsid": lsid(session) }),
        );
    }
    s.send(
        "killSessions",
        doc! { "killSessions": [lsid(10)], "$db": "admin" },
    );
    for (session, cursor) in [(10, 1_i64), (11, 2)] {
        s.send(
            &format!("getMore in session {session} after killSessions"),
            doc! { "getMore": cursor, "collection": "c", "batchSize": 1, "lsid": lsid(session),
            "$db": "db" },
        );
        s.send(
            &format!("ping in session {session} after killSessions"),
            with(ping(), doc! { "lsid": lsid(session) }),
        );
    }
    s.send(
        "killAllSessions",
        doc! { "killAllSessions": [], "$db": "admin" },
    );
    s.send(
        "getMore in session 11 after killAllSessions",
        doc! { "getMore": 2_i64, "collection": "c", "lsid": lsid(11), "$db": "db" },
    );
    // Fail points: on ping, on another command, by app name, closing.
    s.handle(|h| {
        h.set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(1), ["ping"])
                .with_error_code(462)
                .with_error_labels(["SystemOverloadedError", "RetryableError"]),
        ))
    });
    s.send("ping, fail point on ping", ping());
    s.send("ping, fail point used up", ping());
    s.handle(|h| {
        h.set_fail_command(Some(
            FailCommand::new(FailPointMode::AlwaysOn, ["insert"]).with_error_code(91),
        ))
    });
    s.send("ping, fail point on insert", ping());
    s.handle(|h| {
        h.set_fail_command(Some(
            FailCommand::new(FailPointMode::AlwaysOn, ["ping", "hello"])
                .with_error_code(10107)
                .with_app_name("app2"),
        ))
    });
    s.send("ping, fail point for app2 on app1", ping());
    s.send(
        "hello naming app2",
        doc! { "hello": 1, "client": client("app2"), "$db": "admin" },
    );
    s.send("ping, fail point for app2 on app2", ping());
    s.handle(|h| {
        h.set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(1), ["ping"]).with_close_connection(),
        ))
    });
    s.send("ping, fail point closes", ping());
    s.steps.push(Step::Reconnect);
    s.handle(|h| {
        h.set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(1), ["ping"])
                .with_write_concern_error(doc! { "code": 64, "errmsg": "wce" }),
        ))
    });
    s.send("ping, fail point writeConcernError", ping());
    s.handle(|h| h.set_fail_command(None));
    // The ingress limiter: two tokens, then rejections (hello is exempt, BP-6).
    s.handle(|h| {
        h.set_ingress_limit(Some(IngressLimit {
            rate: RateLimit::new(0.001, 2),
            base_backoff_ms: Some(25),
        }))
    });
    for i in 0..3 {
        s.send(&format!("ping {i} under the ingress limit"), ping());
    }
    s.send(
        "hello under the ingress limit",
        doc! { "hello": 1, "$db": "admin" },
    );
    s.handle(|h| h.set_ingress_limit(None));
    // The command log.
    s.handle(|h| h.set_command_log(true));
    s.send("ping, logged", with(ping(), doc! { "lsid": lsid(9) }));
    s.send("hello, logged", doc! { "hello": 1, "$db": "admin" });
    s.handle(|h| h.set_command_log(false));
    // A topology change shows in the next hello.
    let same = role.clone();
    s.handle(move |h| h.set_role(same.clone()));
    s.send(
        "hello after a topology change",
        doc! { "hello": 1, "$db": "admin" },
    );
    // Random faults draw from the connection's generator on every reply, raw or not: the
    // garbage (random bytes) shows whether the draws line up.
    s.send("ping before faults", ping());
    for (label, faults) in [
        (
            "garbage",
            FaultConfig {
                garbage: 1.0,
                ..FaultConfig::default()
            },
        ),
        (
            "reset mid-frame",
            FaultConfig {
                reset_mid_frame: 1.0,
                ..FaultConfig::default()
            },
        ),
    ] {
        s.handle(move |h| h.set_faults(faults.clone()));
        s.send(&format!("ping, {label}"), ping());
        s.steps.push(Step::Reconnect);
        s.handle(|h| h.set_faults(FaultConfig::default()));
        s.send("hello after a fault", doc! { "hello": 1, "$db": "admin" });
        s.send("ping after a fault", ping());
    }
    s.handle(|h| {
        h.set_faults(FaultConfig {
            stall: 1.0,
            stall_for: Duration::from_millis(1),
            ..FaultConfig::default()
        })
    });
    s.send("ping, stalled", ping());
    s.handle(|h| h.set_faults(FaultConfig::default()));
    s.send("ping after faults", ping());
    s
}

/// The steps after which the server closes the connection.
fn script_closes(label: &str) -> bool {
    matches!(
        label,
        "ping, fail point closes" | "ping, garbage" | "ping, reset mid-frame"
    )
}

async fn read_frame(stream: &mut TcpStream) -> Outcome {
    let mut header = [0_u8; 4];
    let read = timeout(Duration::from_secs(10), stream.read_exact(&mut header)).await;
    let Ok(Ok(_)) = read else {
        return Outcome::Closed;
    };
    let length = i32::from_le_bytes(header);
    let mut bytes = header.to_vec();
    let Some(rest) = usize::try_from(length).ok().and_then(|l| l.checked_sub(4)) else {
        return Outcome::Reply(bytes);
    };
    if rest > 1 << 20 {
        return Outcome::Reply(bytes);
    }
    bytes.resize(4 + rest, 0);
    match timeout(Duration::from_secs(10), stream.read_exact(&mut bytes[4..])).await {
        Ok(Ok(_)) => Outcome::Reply(bytes),
        // Garbage shorter than its length prefix: what arrived, then the close.
        _ => Outcome::Closed,
    }
}

/// Runs the script on a fresh server in `role`; every step's outcome and the server's records.
async fn run(
    role: &Role,
    with_user: bool,
    raw: bool,
    script: fn(&Role) -> Script,
) -> (Vec<(String, Outcome)>, String, u64) {
    let mut config = ServerConfig::new(role.clone());
    if with_user {
        config = config.with_user("user", "pencil", &[ScramVersion::Sha256]);
    }
    run_config(config, raw, script).await
}

/// [`run`] on a server started from `config`.
async fn run_config(
    config: ServerConfig,
    raw: bool,
    script: fn(&Role) -> Script,
) -> (Vec<(String, Outcome)>, String, u64) {
    let role = &config.role.clone();
    let internals = Internals {
        document_path_only: !raw,
        me: Some("127.0.0.1:27999".into()),
        process_id: Some(bson::oid::ObjectId::from_bytes([7; 12])),
    };
    let server = TestServer::start_with(config, DataStore::new(), internals)
        .await
        .unwrap();
    let handle = server.handle();
    let mut stream = TcpStream::connect(server.address()).await.unwrap();
    let mut outcomes = Vec::new();
    for step in script(role).steps {
        match step {
            Step::Send(label, bytes, reply) => {
                let closes = script_closes(&label);
                let outcome = match stream.write_all(&bytes).await {
                    Err(_) => Outcome::Closed,
                    // Whatever the server sends (a fault's bytes) until it closes.
                    Ok(()) if closes => {
                        let mut rest = Vec::new();
                        let read = stream.read_to_end(&mut rest);
                        match timeout(Duration::from_secs(10), read).await {
                            Ok(_) => Outcome::Reply(rest),
                            Err(_) => Outcome::NoReply,
                        }
                    }
                    Ok(()) if reply => read_frame(&mut stream).await,
                    Ok(()) => Outcome::NoReply,
                };
                outcomes.push((label, outcome));
            }
            Step::Handle(change) => change(&handle),
            Step::Reconnect => {
                stream = TcpStream::connect(server.address()).await.unwrap();
                outcomes.push(("(reconnected)".into(), Outcome::Done));
            }
        }
    }
    drop(stream);
    let records = format!(
        "{:?}\n{:?}\n{:?}\n{:?}",
        handle.counters().commands,
        handle.handshakes(),
        handle.unsupported(),
        handle.command_log(),
    );
    let raw_answers = handle.shared.lock().raw_answers;
    server.shutdown().await;
    (outcomes, records, raw_answers)
}

/// House rule 7, issue 9: the raw path gives the Document path's reply bytes and effects.
#[tokio::test]
async fn raw_path_answers_as_the_document_path() {
    let secondary = ReplicaSetMember {
        primary_host: Some("127.0.0.1:27998".into()),
        ..ReplicaSetMember::secondary("rs0")
    };
    let roles = [
        (Role::Standalone, false),
        (Role::Standalone, true),
        (Role::Mongos, false),
        (
            Role::ReplicaSetMember(ReplicaSetMember::primary("rs0")),
            false,
        ),
        (Role::ReplicaSetMember(secondary), false),
        (Role::LoadBalancer { service_id: true }, false),
    ];
    for (role, with_user) in roles {
        let (raw, raw_records, raw_answers) = run(&role, with_user, true, script).await;
        let (document, document_records, document_answers) =
            run(&role, with_user, false, script).await;
        assert_eq!(raw.len(), document.len());
        for ((label, raw), (_, document)) in raw.iter().zip(&document) {
            assert_eq!(raw, document, "{role:?}, users: {with_user}: {label}");
        }
        assert_eq!(raw_records, document_records, "{role:?}");
        if (&role, with_user) == (&Role::Standalone, false) {
            // UT-25, TK-15 (review9 finding 2): what both paths answered is the kill's effect.
            let code = |label: &str| {
                let (_, outcome) = raw.iter().find(|(l, _)| l == label).unwrap();
                let Outcome::Reply(bytes) = outcome else {
                    panic!("{label}: {outcome:?}");
                };
                let reply = retry_core::wire::parse_frame(bytes).unwrap().body;
                reply.get_i32("code").ok()
            };
            assert_eq!(code("getMore in session 10 after killSessions"), Some(43));
            assert_eq!(code("getMore in session 11 after killSessions"), None);
            assert_eq!(
                code("getMore in session 11 after killAllSessions"),
                Some(43)
            );
            assert_eq!(code("ping in session 10 after killSessions"), None);
        }
        // The comparison means something: the raw path answered the plain commands.
        assert_eq!(document_answers, 0);
        assert!(raw_answers >= 20, "{role:?}: {raw_answers} raw answers");
    }
}

/// Random hot commands: a hot name, then up to seven fields drawn (repeats included) from a
/// palette of the fields the raw path accepts and some it must not, each with values of right and
/// wrong types.
fn random_script(_: &Role) -> Script {
    use rand_core::RngCore;
    let mut rng = retry_core::rng::EngineRng::from_seed_u64(0x7e57_ca5e);
    let mut s = Script { steps: Vec::new() };
    let uuid = |byte| binary(BinarySubtype::Uuid, byte);
    let palette: Vec<(&str, Vec<Bson>)> = vec![
        ("$db", vec!["admin".into(), Bson::Int32(1), Bson::Null]),
        (
            "lsid",
            vec![
                doc! { "id": uuid(1) }.into(),
                doc! { "id": uuid(2) }.into(),
                doc! { "id": binary(BinarySubtype::Generic, 3) }.into(),
                doc! { "id": binary(BinarySubtype::BinaryOld, 4) }.into(),
                doc! { "id": 1 }.into(),
                doc! { "id": uuid(5), "uid": uuid(6) }.into(),
                doc! {}.into(),
                "x".into(),
            ],
        ),
        (
            "$clusterTime",
            vec![doc! { "clusterTime": Timestamp { time: 1, increment: 1 } }.into()],
        ),
        (
            "$readPreference",
            vec![
                doc! { "mode": "secondary" }.into(),
                "x".into(),
                doc! { "mode": "bogus" }.into(),
                doc! {}.into(),
                doc! { "mode": 1 }.into(),
            ],
        ),
        ("apiVersion", vec!["1".into(), Bson::Int32(1), "2".into()]),
        ("apiStrict", vec![true.into(), "true".into()]),
        ("apiDeprecationErrors", vec![false.into(), Bson::Int32(0)]),
        (
            "comment",
            vec!["c".into(), doc! { "a": [1, 2] }.into(), Bson::Null],
        ),
        (
            "maxTimeMS",
            vec![
                Bson::Int32(5),
                Bson::Int32(-1),
                Bson::Int64(1 << 31),
                Bson::Double(2.0),
                Bson::Double(2.5),
                "5".into(),
                Bson::Decimal128(bson::Decimal128::from_bytes([0; 16])),
            ],
        ),
        ("helloOk", vec![true.into(), false.into(), Bson::Int32(1)]),
        (
            "loadBalanced",
            vec![true.into(), false.into(), "yes".into()],
        ),
        (
            "client",
            vec![
                metadata(doc! { "application": { "name": "r1" } }).into(),
                doc! { "application": { "name": "r1" }, "driver": { "name": "d" } }.into(),
                doc! { "application": { "name": 5 } }.into(),
                doc! { "application": "x" }.into(),
                "x".into(),
            ],
        ),
        (
            "compression",
            vec![
                Bson::Array(vec![]),
                "zstd".into(),
                Bson::Array(vec![Bson::Int32(1)]),
                Bson::Array(vec!["zlib".into()]),
            ],
        ),
        ("backpressure", vec!["2".into(), Bson::Int32(2)]),
        ("txnNumber", vec![Bson::Int64(1), Bson::Int32(1)]),
        ("autocommit", vec![false.into(), true.into()]),
        ("startTransaction", vec![true.into()]),
        (
            "readConcern",
            vec![doc! { "level": "local" }.into(), doc! { "level": 1 }.into()],
        ),
        ("writeConcern", vec![doc! { "w": 9 }.into()]),
        ("topologyVersion", vec![doc! { "counter": 0_i64 }.into()]),
        ("saslSupportedMechs", vec!["admin.user".into()]),
        ("foo", vec![Bson::Int32(1)]),
        ("regex", vec![Bson::JavaScriptCode("f()".into())]),
    ];
    let names = ["ping", "hello", "isMaster", "ismaster"];
    let name_values = [Bson::Int32(1), Bson::Double(1.0), true.into(), "x".into()];
    let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
    // The first 14 fields of the palette are the ones the raw path accepts, and the first
    // value of each passes every check: three draws in four take them, so many commands are
    // clean and the rest differ from a clean one by a little.
    let accepted = 14;
    for i in 0..400 {
        let name = names[pick(names.len())];
        let mut body = doc! { name: name_values[pick(name_values.len())].clone() };
        if pick(4) > 0 {
            body.insert("$db", "admin");
        }
        let mut repeated = Document::new();
        for _ in 0..pick(6) {
            let field = if pick(4) > 0 {
                pick(accepted)
            } else {
                pick(palette.len())
            };
            let (key, values) = &palette[field];
            let value = if pick(4) > 0 {
                values[0].clone()
            } else {
                values[pick(values.len())].clone()
            };
            if body.contains_key(*key) {
                repeated.insert(*key, value);
            } else {
                body.insert(*key, value);
            }
        }
        s.send_bytes(
            &format!("random {i}: {body} + {repeated}"),
            &appended(&body, &repeated),
        );
    }
    s
}

/// House rule 7, issue 9: on random hot commands, valid and not, in three roles, the raw path
/// gives the Document path's reply bytes and effects.
#[tokio::test]
async fn raw_path_answers_random_hot_commands_as_the_document_path() {
    let roles = [
        Role::Mongos,
        Role::ReplicaSetMember(ReplicaSetMember::secondary("rs0")),
        Role::LoadBalancer { service_id: true },
    ];
    for role in roles {
        let (raw, raw_records, raw_answers) = run(&role, false, true, random_script).await;
        let (document, document_records, _) = run(&role, false, false, random_script).await;
        for ((label, raw), (_, document)) in raw.iter().zip(&document) {
            assert_eq!(raw, document, "{role:?}: {label}");
        }
        assert_eq!(raw_records, document_records, "{role:?}");
        assert!(raw_answers >= 100, "{role:?}: {raw_answers} raw answers");
    }
}

/// The code of a reply frame's body (`None`: `ok: 1`).
fn reply_code(outcome: &Outcome) -> Option<i32> {
    let Outcome::Reply(bytes) = outcome else {
        panic!("no reply: {outcome:?}");
    };
    let body = Document::from_reader(&bytes[21..]).expect("a reply body");
    if retry_core::reply::is_ok(&body) {
        return None;
    }
    Some(body.get_i32("code").expect("an error code"))
}

/// Review7 finding 3 (house rule 7): the generic fields a hot command carries get a real
/// server's answer on both paths: the expected code of each value (`None`: accepted), from the
/// server's own tests and sources (`refusals::generic_field_refusal`; HS-4: only a connection's
/// first hello may carry `client`, ClientMetadataCannotBeMutated 186).
fn generic_field_cases() -> Vec<(&'static str, Document, Option<i32>)> {
    let ping = |extra: Document| {
        let mut body = doc! { "ping": 1, "$db": "admin" };
        body.extend(extra);
        body
    };
    let hello = |extra: Document| {
        let mut body = doc! { "hello": 1, "$db": "admin" };
        body.extend(extra);
        body
    };
    vec![
        ("apiVersion 1", ping(doc! { "apiVersion": "1" }), None),
        ("apiVersion int", ping(doc! { "apiVersion": 1 }), Some(14)),
        ("apiVersion 2", ping(doc! { "apiVersion": "2" }), Some(322)),
        (
            "apiStrict alone",
            ping(doc! { "apiStrict": true }),
            Some(4886600),
        ),
        (
            "apiDeprecationErrors alone",
            ping(doc! { "apiDeprecationErrors": false }),
            Some(4886600),
        ),
        (
            "apiStrict a string",
            ping(doc! { "apiVersion": "1", "apiStrict": "true" }),
            Some(14),
        ),
        (
            "apiDeprecationErrors a string",
            ping(doc! { "apiVersion": "1", "apiDeprecationErrors": "false" }),
            Some(14),
        ),
        (
            "api all three",
            ping(doc! { "apiVersion": "1", "apiStrict": true, "apiDeprecationErrors": true }),
            None,
        ),
        // APIStrictError 323: a command outside API version 1 with `apiStrict: true`
        // (refusals::API_VERSION_1); with `apiStrict: false` it runs.
        (
            "apiStrict distinct",
            doc! { "distinct": "c", "key": "a", "$db": "test", "apiVersion": "1", "apiStrict": true },
            Some(323),
        ),
        (
            "apiStrict legacy hello",
            doc! { "isMaster": 1, "$db": "admin", "apiVersion": "1", "apiStrict": true },
            Some(323),
        ),
        (
            "apiStrict false distinct",
            doc! { "distinct": "c", "key": "a", "$db": "test", "apiVersion": "1", "apiStrict": false },
            None,
        ),
        // LB-7 under `apiStrict: true`: the hello's unstable `loadBalanced` field is
        // APIStrictError (323) whatever its value; with `apiStrict: false` it runs.
        (
            "apiStrict hello loadBalanced",
            hello(doc! { "loadBalanced": true, "apiVersion": "1", "apiStrict": true }),
            Some(323),
        ),
        (
            "apiStrict hello loadBalanced false",
            hello(doc! { "apiVersion": "1", "apiStrict": true, "loadBalanced": false }),
            Some(323),
        ),
        (
            "apiStrict false hello loadBalanced",
            hello(doc! { "loadBalanced": true, "apiVersion": "1", "apiStrict": false }),
            None,
        ),
        (
            "apiStrict hello",
            hello(doc! { "apiVersion": "1", "apiStrict": true }),
            None,
        ),
        (
            "$readPreference a string",
            ping(doc! { "$readPreference": "x" }),
            Some(14),
        ),
        (
            "$readPreference no mode",
            ping(doc! { "$readPreference": {} }),
            Some(4),
        ),
        (
            "$readPreference mode int",
            ping(doc! { "$readPreference": { "mode": 1 } }),
            Some(14),
        ),
        (
            "$readPreference unknown mode",
            ping(doc! { "$readPreference": { "mode": "bogus" } }),
            Some(2),
        ),
        (
            "$readPreference secondary",
            ping(doc! { "$readPreference": { "mode": "secondaryPreferred" } }),
            None,
        ),
        ("$db an int", doc! { "ping": 1, "$db": 5 }, Some(13111)),
        (
            "hello client a string",
            hello(doc! { "client": "x" }),
            Some(14),
        ),
        (
            "hello compression a string",
            hello(doc! { "compression": "zstd" }),
            Some(14),
        ),
        (
            "hello compression [1]",
            hello(doc! { "compression": [1] }),
            Some(14),
        ),
        (
            "new connection: client without os",
            hello(doc! { "client": { "driver": { "name": "d", "version": "1" } } }),
            Some(183),
        ),
        (
            "new connection: client without driver.version",
            hello(doc! { "client": { "driver": { "name": "d" }, "os": { "type": "t" } } }),
            Some(183),
        ),
        (
            "new connection: client with an int driver.name",
            hello(doc! { "client": metadata(doc! { "driver": { "name": 1, "version": "1" } }) }),
            Some(14),
        ),
        (
            "new connection: client with a string application",
            hello(doc! { "client": metadata(doc! { "application": "a" }) }),
            Some(14),
        ),
        (
            "new connection: client with a 129-byte application name",
            hello(doc! { "client": metadata(doc! { "application": { "name": "a".repeat(129) } }) }),
            Some(184),
        ),
        (
            "new connection: client of 1,100 bytes (mongos: 512 at most)",
            hello(doc! { "client": metadata(doc! { "platform": "p".repeat(1_000) }) }),
            Some(185),
        ),
        (
            "new connection: hello, first with client",
            hello(doc! {
                "client": metadata(doc! { "application": { "name": "a".repeat(128) } }),
                "compression": ["zstd"],
            }),
            None,
        ),
        (
            "hello, again with client",
            hello(doc! { "client": metadata(doc! {}) }),
            Some(186),
        ),
        ("hello, again without client", hello(doc! {}), None),
        // Review13 finding 1 (TK-2): a `writeConcern`, `{}` included, on a command whose
        // `supportsWriteConcern()` is false is InvalidOptions (72), "Command does not support
        // writeConcern" (`getMore` before its cursor is looked up); `aggregate` and the writes
        // take one.
        (
            "ping writeConcern",
            ping(doc! { "writeConcern": { "w": 1 } }),
            Some(72),
        ),
        (
            "ping writeConcern {}",
            ping(doc! { "writeConcern": {} }),
            Some(72),
        ),
        (
            "count writeConcern",
            doc! { "count": "c", "$db": "test", "writeConcern": { "w": "majority" } },
            Some(72),
        ),
        (
            "getMore writeConcern",
            doc! { "getMore": 5_i64, "collection": "c", "$db": "test", "writeConcern": { "w": 1 } },
            Some(72),
        ),
        (
            "find writeConcern",
            doc! { "find": "c", "$db": "test", "writeConcern": { "w": 1 } },
            Some(72),
        ),
        (
            "hello writeConcern",
            hello(doc! { "writeConcern": { "w": 1 } }),
            Some(72),
        ),
        (
            "aggregate writeConcern",
            doc! { "aggregate": "c", "pipeline": [], "cursor": {}, "$db": "test",
            "writeConcern": { "w": 1 } },
            None,
        ),
        // Outside a transaction a write supports only the "local" (and "snapshot") read
        // concern levels: "majority" is InvalidOptions (72), as on a real server.
        (
            "insert readConcern majority",
            doc! { "insert": "c", "documents": [{ "x": 1 }], "$db": "test",
            "readConcern": { "level": "majority" } },
            Some(72),
        ),
        (
            "findAndModify readConcern available",
            doc! { "findAndModify": "c", "query": {}, "remove": true, "$db": "test",
            "readConcern": { "level": "available" } },
            Some(72),
        ),
        (
            "insert readConcern local",
            doc! { "insert": "c", "documents": [{ "x": 1 }], "$db": "test",
            "readConcern": { "level": "local" } },
            None,
        ),
        (
            "insert writeConcern",
            doc! { "insert": "c", "documents": [{ "x": 1 }], "$db": "test",
            "writeConcern": { "w": 1 } },
            None,
        ),
        // Review14 finding 2: `create`, `drop`, `dropDatabase` and the index commands support
        // only "local" (any other level is 72); the reads take "majority".
        (
            "create readConcern majority",
            doc! { "create": "made", "$db": "test", "readConcern": { "level": "majority" } },
            Some(72),
        ),
        (
            "createIndexes readConcern snapshot",
            doc! { "createIndexes": "c", "indexes": [{ "key": { "x": 1 }, "name": "x_1" }],
            "$db": "test", "readConcern": { "level": "snapshot" } },
            Some(72),
        ),
        (
            "drop readConcern local",
            doc! { "drop": "c", "$db": "test", "readConcern": { "level": "local" } },
            None,
        ),
        (
            "find readConcern majority",
            doc! { "find": "c", "$db": "test", "readConcern": { "level": "majority" } },
            None,
        ),
    ]
}

/// HS-4: client metadata a real server takes (driver name and version, os type), with `extra`.
fn metadata(extra: Document) -> Document {
    let mut client = doc! {
        "driver": { "name": "retry-core", "version": "0" },
        "os": { "type": "linux" },
    };
    client.extend(extra);
    client
}

fn generic_field_script(_: &Role) -> Script {
    let mut s = Script { steps: Vec::new() };
    for (label, body, _) in generic_field_cases() {
        if label.starts_with("new connection") {
            s.steps.push(Step::Reconnect);
        }
        s.send(label, body);
    }
    s
}

/// Review7 finding 3 (house rule 7): `raw_equivalence` checks the real server's answers, not
/// only that the two paths agree.
#[tokio::test]
async fn review7_f3_generic_fields_get_a_real_servers_answers_on_both_paths() {
    let role = Role::Mongos;
    for raw in [true, false] {
        let (outcomes, _, _) = run(&role, false, raw, generic_field_script).await;
        let replies = outcomes.iter().filter(|(_, o)| *o != Outcome::Done);
        for ((label, body, expected), (_, outcome)) in generic_field_cases().iter().zip(replies) {
            assert_eq!(
                reply_code(outcome),
                *expected,
                "raw: {raw}: {label}: {body}"
            );
        }
    }
}

/// HS-4 client metadata of exactly `size` bytes (a padded `platform`).
fn metadata_of_size(size: usize) -> Document {
    let base = metadata(doc! { "platform": "" });
    let base_len = base.to_vec().unwrap().len();
    let client = metadata(doc! { "platform": "p".repeat(size - base_len) });
    assert_eq!(client.to_vec().unwrap().len(), size);
    client
}

/// Review8 finding 1 (HS-4): the client-metadata sizes each role takes, as in the server's
/// `client_metadata.cpp`: a mongod up to 1,024 bytes, a mongos (or behind a load balancer) up to
/// 512; one byte more is ClientMetadataDocumentTooLarge (185).
fn metadata_size_cases(role: &Role) -> Vec<(usize, Option<i32>)> {
    let limit = if role.is_router() { 512 } else { 1024 };
    [512, 513, 1024, 1025]
        .into_iter()
        .map(|size| (size, (size > limit).then_some(185)))
        .collect()
}

fn metadata_size_script(role: &Role) -> Script {
    let mut s = Script { steps: Vec::new() };
    for (size, _) in metadata_size_cases(role) {
        s.steps.push(Step::Reconnect);
        let body = doc! { "hello": 1, "$db": "admin", "client": metadata_of_size(size) };
        s.send(&format!("hello with a {size}-byte client"), body);
    }
    s
}

/// Review8 finding 1 (HS-4, house rule 7): a mongod takes 1,024 bytes of client metadata and a
/// mongos 512, on both the raw and the Document path.
#[tokio::test]
async fn review8_f1_client_metadata_size_limit_per_role_on_both_paths() {
    let roles = [
        Role::Standalone,
        Role::ReplicaSetMember(ReplicaSetMember::primary("rs0")),
        Role::Mongos,
        Role::LoadBalancer { service_id: true },
    ];
    for role in roles {
        for raw in [true, false] {
            let (outcomes, _, _) = run(&role, false, raw, metadata_size_script).await;
            let replies = outcomes.iter().filter(|(_, o)| *o != Outcome::Done);
            let cases = metadata_size_cases(&role);
            assert_eq!(replies.clone().count(), cases.len());
            for ((size, expected), (label, outcome)) in cases.into_iter().zip(replies) {
                assert_eq!(
                    reply_code(outcome),
                    expected,
                    "{role:?}, raw: {raw}: {label} ({size})"
                );
            }
        }
    }
}

/// Versioned-api spec, "Backward Compatibility" (crate `parameters`): `requireApiVersion` set
/// with `setParameter` (on `admin` only, 13; a parameter the test server does not know is TK-2's
/// refusal), then every command without `apiVersion` refused with 498870 on both paths, hellos,
/// `setParameter` itself and a `getMore` included; with `apiStrict: true`, `setParameter` (not in
/// API version 1) is APIStrictError (323).
fn require_api_version_cases() -> Vec<(&'static str, Document, Option<i32>)> {
    let v1 = |mut body: Document| {
        body.insert("apiVersion", "1");
        body
    };
    let set = |on: bool, db: &str| doc! { "setParameter": 1, "requireApiVersion": on, "$db": db };
    let ping = || doc! { "ping": 1, "$db": "admin" };
    let hello = || doc! { "hello": 1, "$db": "admin" };
    let get_more = || doc! { "getMore": 1_i64, "collection": "c", "$db": "test" };
    vec![
        ("ping before", ping(), None),
        ("setParameter on test", set(true, "test"), Some(13)),
        (
            "setParameter of an unknown parameter",
            doc! { "setParameter": 1, "logLevel": 1, "$db": "admin" },
            Some(crate::TESTKIT_UNSUPPORTED),
        ),
        ("setParameter on", set(true, "admin"), None),
        ("ping without apiVersion", ping(), Some(498_870)),
        ("hello without apiVersion", hello(), Some(498_870)),
        ("getMore without apiVersion", get_more(), Some(498_870)),
        ("ping with apiVersion", v1(ping()), None),
        ("hello with apiVersion", v1(hello()), None),
        ("getMore with apiVersion", v1(get_more()), Some(43)),
        (
            "setParameter off without apiVersion",
            set(false, "admin"),
            Some(498_870),
        ),
        (
            "setParameter off, strict",
            v1(
                doc! { "setParameter": 1, "requireApiVersion": false, "$db": "admin",
                "apiStrict": true },
            ),
            Some(323),
        ),
        ("setParameter off", v1(set(false, "admin")), None),
        ("ping after", ping(), None),
        ("hello after", hello(), None),
    ]
}

fn require_api_version_script(_: &Role) -> Script {
    let mut s = Script { steps: Vec::new() };
    for (label, body, _) in require_api_version_cases() {
        s.send(label, body);
    }
    s
}

#[tokio::test]
async fn require_api_version_refuses_commands_without_one_on_both_paths() {
    let role = Role::ReplicaSetMember(ReplicaSetMember::primary("rs0"));
    let (raw, raw_records, _) = run(&role, false, true, require_api_version_script).await;
    let (document, document_records, _) =
        run(&role, false, false, require_api_version_script).await;
    assert_eq!(raw, document);
    assert_eq!(raw_records, document_records);
    for ((label, body, expected), (_, outcome)) in require_api_version_cases().iter().zip(&raw) {
        assert_eq!(reply_code(outcome), *expected, "{label}: {body}");
    }
    let Outcome::Reply(bytes) = &raw[3].1 else {
        panic!("{:?}", raw[3]);
    };
    let reply = retry_core::wire::parse_frame(bytes).unwrap().body;
    assert_eq!(reply.get_bool("was").ok(), Some(false), "{reply}");
    let Outcome::Reply(bytes) = &raw[4].1 else {
        panic!("{:?}", raw[4]);
    };
    let reply = retry_core::wire::parse_frame(bytes).unwrap().body;
    assert_eq!(reply.get_str("codeName").ok(), Some("Location498870"));
}

/// Labelled commands and the code each must get (`None`: accepted).
type Cases = Vec<(&'static str, Document, Option<i32>)>;

/// `body` with `apiVersion: "1"` and the `extra` API parameters.
fn with_api(mut body: Document, extra: Document) -> Document {
    body.insert("apiVersion", "1");
    body.extend(extra);
    body
}

/// Versioned-api "Cursors" (house rule 7, TK-15): a getMore whose API parameters are not
/// exactly those of the command that opened its cursor (an absent `apiStrict` is not
/// `apiStrict: false`) is APIMismatchError (347), the cursor staying open; the server's
/// jstests/core/api/api_params_getmore.js. Cursor ids count from 1 on a fresh server.
fn get_more_api_cases(_: &Role) -> Cases {
    let find = || doc! { "find": "c", "batchSize": 1, "$db": "test" };
    let get_more =
        |id: i64| doc! { "getMore": id, "collection": "c", "batchSize": 1, "$db": "test" };
    let strict_off = || doc! { "apiStrict": false };
    vec![
        (
            "insert",
            doc! { "insert": "c", "documents": [{ "_id": 1 }, { "_id": 2 }, { "_id": 3 },
            { "_id": 4 }], "$db": "test" },
            None,
        ),
        ("find with apiVersion", with_api(find(), doc! {}), None),
        ("getMore without", get_more(1), Some(347)),
        (
            "getMore with apiStrict: false",
            with_api(get_more(1), strict_off()),
            Some(347),
        ),
        (
            "getMore with apiDeprecationErrors",
            with_api(get_more(1), doc! { "apiDeprecationErrors": true }),
            Some(347),
        ),
        (
            "getMore with apiVersion",
            with_api(get_more(1), doc! {}),
            None,
        ),
        ("find without", find(), None),
        (
            "getMore with apiVersion",
            with_api(get_more(2), doc! {}),
            Some(347),
        ),
        ("getMore without", get_more(2), None),
        (
            "find with apiStrict: false",
            with_api(find(), strict_off()),
            None,
        ),
        (
            "getMore without apiStrict",
            with_api(get_more(3), doc! {}),
            Some(347),
        ),
        (
            "getMore with apiStrict: false",
            with_api(get_more(3), strict_off()),
            None,
        ),
        (
            "killCursors without (not compared outside a transaction)",
            doc! { "killCursors": "c", "cursors": [3_i64], "$db": "test" },
            None,
        ),
    ]
}

/// Versioned-api "Transactions" (house rule 7, TK-15): every later command of a transaction,
/// commit and abort included, must repeat its first command's API parameters, else
/// APIMismatchError (347) and the transaction goes on; on a mongod a command of a newer
/// transaction number is compared with the one in progress too (the server's session
/// checkout). `startTransaction` here carries `apiStrict: true` (insert is in API version 1).
fn transaction_api_cases(role: &Role) -> Cases {
    let lsid = || lsid(9);
    let statement = |n: i64, body: Document| {
        let mut body = body;
        body.extend(doc! { "lsid": lsid(), "txnNumber": n, "autocommit": false, "$db": "test" });
        body
    };
    let strict = || doc! { "apiStrict": true };
    let insert = |id: i32| doc! { "insert": "c", "documents": [{ "_id": id }] };
    let mut first = with_api(statement(1, insert(1)), strict());
    first.insert("startTransaction", true);
    let commit = |n: i64| {
        let mut body = statement(n, doc! { "commitTransaction": 1 });
        body.insert("$db", "admin");
        body
    };
    let abort = |n: i64| {
        let mut body = statement(n, doc! { "abortTransaction": 1 });
        body.insert("$db", "admin");
        body
    };
    let router = matches!(role, Role::Mongos);
    let retryable = doc! { "insert": "c", "documents": [{ "_id": 9 }], "lsid": lsid(),
    "txnNumber": 2_i64, "$db": "test" };
    vec![
        ("startTransaction, strict", first, None),
        ("insert without", statement(1, insert(2)), Some(347)),
        (
            "insert with apiVersion only",
            with_api(statement(1, insert(2)), doc! {}),
            Some(347),
        ),
        (
            "find with apiStrict: false",
            with_api(
                statement(1, doc! { "find": "c" }),
                doc! { "apiStrict": false },
            ),
            Some(347),
        ),
        ("commit without", commit(1), Some(347)),
        (
            "abort with apiDeprecationErrors",
            with_api(
                abort(1),
                doc! { "apiStrict": true, "apiDeprecationErrors": false },
            ),
            Some(347),
        ),
        // A mongod compares a newer transaction number with the transaction in progress too;
        // a router starts it and its shard does the same.
        (
            "retryable write of a newer number, without",
            retryable,
            Some(347),
        ),
        (
            "insert with the same parameters",
            with_api(statement(1, insert(2)), strict()),
            None,
        ),
        (
            "commit with the same parameters",
            with_api(commit(1), strict()),
            None,
        ),
        // A committed transaction is no longer compared: its commit retried without them.
        (
            "commit retried without",
            commit(1),
            if router { Some(347) } else { None },
        ),
    ]
}

/// Under `apiStrict: true`: `$listLocalSessions` is outside API version 1 (APIStrictError,
/// 323, the stage's `AllowedWithApiStrict::kNeverInVersion1`), and a command the server does
/// not know is CommandNotFound (59) whatever its API parameters, as a real server looks the
/// command up before it validates them (TK-2), while a known one outside API version 1 is 323;
/// the same with `requireApiVersion` on (`enforceRequireAPIVersion` takes the found command): 59
/// for an unknown command, 498870 for a known one.
fn api_strict_cases(_: &Role) -> Cases {
    let sessions = || {
        doc! { "aggregate": 1, "pipeline": [{ "$listLocalSessions": {} }], "cursor": {},
        "$db": "admin" }
    };
    let strict = || doc! { "apiStrict": true };
    vec![
        ("$listLocalSessions", with_api(sessions(), doc! {}), None),
        (
            "$listLocalSessions, strict",
            with_api(sessions(), strict()),
            Some(323),
        ),
        (
            "$listLocalSessions, strict false",
            with_api(sessions(), doc! { "apiStrict": false }),
            None,
        ),
        (
            "unknown command, strict",
            with_api(doc! { "frobnicate": 1, "$db": "test" }, strict()),
            Some(59),
        ),
        (
            "unknown command, API version 2",
            doc! { "frobnicate": 1, "$db": "test", "apiVersion": "2" },
            Some(59),
        ),
        (
            "unknown command, apiStrict alone",
            doc! { "frobnicate": 1, "$db": "test", "apiStrict": true },
            Some(59),
        ),
        (
            "distinct, strict",
            with_api(
                doc! { "distinct": "c", "key": "a", "$db": "test" },
                strict(),
            ),
            Some(323),
        ),
        (
            "getMore, API version 2",
            doc! { "getMore": 1_i64, "collection": "c", "$db": "test", "apiVersion": "2" },
            Some(322),
        ),
        (
            "requireApiVersion on",
            with_api(
                doc! { "setParameter": 1, "requireApiVersion": true, "$db": "admin" },
                doc! {},
            ),
            None,
        ),
        (
            "unknown command without apiVersion, required",
            doc! { "frobnicate": 1, "$db": "test" },
            Some(59),
        ),
        (
            "known command without apiVersion, required",
            doc! { "distinct": "c", "key": "a", "$db": "test" },
            Some(498_870),
        ),
        (
            "requireApiVersion off",
            with_api(
                doc! { "setParameter": 1, "requireApiVersion": false, "$db": "admin" },
                doc! {},
            ),
            None,
        ),
    ]
}

/// Runs `cases` on both paths in `role`: the two agree byte for byte and give the expected
/// codes.
async fn expect_on_both_paths(role: &Role, cases: fn(&Role) -> Cases, script: fn(&Role) -> Script) {
    let (raw, raw_records, _) = run(role, false, true, script).await;
    let (document, document_records, _) = run(role, false, false, script).await;
    assert_eq!(raw, document, "{role:?}");
    assert_eq!(raw_records, document_records, "{role:?}");
    for ((label, body, expected), (_, outcome)) in cases(role).iter().zip(&raw) {
        assert_eq!(reply_code(outcome), *expected, "{role:?}: {label}: {body}");
        let Outcome::Reply(bytes) = outcome else {
            continue;
        };
        let reply = retry_core::wire::parse_frame(bytes).unwrap().body;
        if *expected == Some(347) {
            assert_eq!(reply.get_str("codeName").ok(), Some("APIMismatchError"));
            let message = reply.get_str("errmsg").unwrap_or_default();
            assert!(message.starts_with("API parameter mismatch: "), "{message}");
        }
    }
}

fn script_of(cases: Cases) -> Script {
    let mut s = Script { steps: Vec::new() };
    for (label, body, _) in cases {
        s.send(label, body);
    }
    s
}

fn roles() -> [Role; 2] {
    [
        Role::ReplicaSetMember(ReplicaSetMember::primary("rs0")),
        Role::Mongos,
    ]
}

#[tokio::test]
async fn tk15_versioned_api_get_more_with_other_api_parameters_is_refused() {
    for role in roles() {
        let script = |role: &Role| script_of(get_more_api_cases(role));
        expect_on_both_paths(&role, get_more_api_cases, script).await;
    }
}

#[tokio::test]
async fn tk15_versioned_api_transaction_command_with_other_api_parameters_is_refused() {
    for role in roles() {
        let script = |role: &Role| script_of(transaction_api_cases(role));
        expect_on_both_paths(&role, transaction_api_cases, script).await;
    }
}

#[tokio::test]
async fn versioned_api_strict_refuses_list_local_sessions_and_unknown_commands_are_59() {
    for role in roles() {
        let script = |role: &Role| script_of(api_strict_cases(role));
        expect_on_both_paths(&role, api_strict_cases, script).await;
    }
}

/// HS-3: on a server without `hello` ([`ServerConfig::without_hello`]), `hello` is
/// CommandNotFound (59) in every form (plain, which the raw path would answer, with handshake
/// fields, awaitable), and a legacy hello asking `helloOk: true` is answered without it.
fn without_hello_cases(_: &Role) -> Cases {
    let version = doc! { "processId": bson::oid::ObjectId::from_bytes([7; 12]), "counter": 0_i64 };
    vec![
        ("hello", doc! { "hello": 1, "$db": "admin" }, Some(59)),
        (
            "legacy hello asking helloOk",
            doc! { "isMaster": 1, "helloOk": true, "client": metadata(doc! {}), "$db": "admin" },
            None,
        ),
        (
            "hello with handshake fields",
            doc! { "hello": 1, "helloOk": true, "$db": "admin" },
            Some(59),
        ),
        (
            "awaitable hello",
            doc! { "hello": 1, "topologyVersion": version, "maxAwaitTimeMS": 60_000_i64,
            "$db": "admin" },
            Some(59),
        ),
        (
            "lowercase legacy hello asking helloOk",
            doc! { "ismaster": 1, "helloOk": true, "$db": "admin" },
            None,
        ),
    ]
}

/// HS-3 (house rule 7): a server that does not offer `hello` refuses it as an unknown command
/// on both paths, with a mongod's or a router's message, and never says `helloOk`.
#[tokio::test]
async fn hs3_a_server_without_hello_refuses_it_and_never_says_hello_ok_on_both_paths() {
    for role in roles() {
        let config = ServerConfig::new(role.clone()).without_hello();
        let script = |role: &Role| script_of(without_hello_cases(role));
        let (raw, raw_records, _) = run_config(config.clone(), true, script).await;
        let (document, document_records, _) = run_config(config, false, script).await;
        assert_eq!(raw, document, "{role:?}");
        assert_eq!(raw_records, document_records, "{role:?}");
        for ((label, body, expected), (_, outcome)) in without_hello_cases(&role).iter().zip(&raw) {
            assert_eq!(reply_code(outcome), *expected, "{role:?}: {label}: {body}");
            let Outcome::Reply(bytes) = outcome else {
                continue;
            };
            let reply = retry_core::wire::parse_frame(bytes).unwrap().body;
            assert!(!reply.contains_key("helloOk"), "{label}: {reply}");
            if expected.is_some() {
                let message = if role.is_router() {
                    "no such cmd: hello"
                } else {
                    "no such command: 'hello'"
                };
                assert_eq!(reply.get_str("errmsg").ok(), Some(message), "{label}");
            } else {
                assert!(reply.contains_key("ismaster"), "{label}: {reply}");
            }
        }
    }
    // The same legacy hello on a server that offers `hello` says `helloOk: true` (that case
    // alone: the awaitable hello would wait there).
    let script = |role: &Role| {
        script_of(
            without_hello_cases(role)
                .into_iter()
                .skip(1)
                .take(1)
                .collect(),
        )
    };
    let config = ServerConfig::new(Role::Mongos);
    let (raw, _, _) = run_config(config, true, script).await;
    let Outcome::Reply(bytes) = &raw[0].1 else {
        panic!("{:?}", raw[0]);
    };
    let reply = retry_core::wire::parse_frame(bytes).unwrap().body;
    assert_eq!(reply.get_bool("helloOk").ok(), Some(true), "{reply}");
}
