//! The session fields an attempt's command carries, byte for byte (issue 9: `prepare_attempt`
//! works on the operation at hand; the commands it writes must not change). On a mongos that
//! gossips `$clusterTime` and `operationTime`: a retryable write in an implicit session and its
//! retry (SE-7, RW-6, RW-7: the same `lsid` and `txnNumber`), a read under CSOT (CS-4:
//! `maxTimeMS`), causal reads in an explicit session (SE-21: `afterClusterTime`), a transaction's
//! first command and its commit (TX-1: `startTransaction`, `autocommit`, `txnNumber`), each with
//! `$clusterTime` (SE-17). Every OP_MSG but the hellos is compared with the bytes the engine
//! wrote before that change (recorded from the build of main at bbd2203). A second test covers
//! the other paths (review26 S6: no sessions, load-balanced, `recoveryToken`, `getMore`,
//! `killCursors` after `end_session`), recorded the same way in `command_bytes_more.hex`.

mod support;

use std::time::Duration;

use bson::{doc, spec::BinarySubtype, Binary, Document, Timestamp};
use retry_core::engine::{EngineOptions, OpId, OperationRequest};
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::OperationTimeout;
use retry_core::topology::TopologySettings;
use retry_core::transaction::TransactionOptions;
use retry_core::wire::{FrameDecoder, DEFAULT_MAX_MESSAGE_SIZE_BYTES};
use support::net::{address, is_hello, Net, Script};

/// The commands' bytes as main at bbd2203 wrote them, in hex, one OP_MSG a line.
const EXPECTED: &str = include_str!("command_bytes.hex");

/// A mongos with sessions whose replies gossip a cluster time; the first insert fails once with
/// a retryable write error (RW-8).
fn mongos() -> Script {
    let mut failed = false;
    Box::new(move |_, body| {
        if is_hello(body) {
            return Some(doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true,
            "msg": "isdbgrid", "maxWireVersion": 25, "minWireVersion": 0,
            "logicalSessionTimeoutMinutes": 30 });
        }
        let time = Timestamp {
            time: 100,
            increment: 7,
        };
        let signature = doc! {
            "hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 20] },
            "keyId": 0_i64,
        };
        let mut reply = doc! { "ok": 1 };
        if body.contains_key("insert") && !failed {
            failed = true;
            reply = doc! { "ok": 0, "code": 91, "errmsg": "shutting down",
            "errorLabels": ["RetryableWriteError"] };
        }
        reply.insert(
            "$clusterTime",
            doc! { "clusterTime": time, "signature": signature },
        );
        reply.insert("operationTime", time);
        Some(reply)
    })
}

fn request(db: &str, command: Document, kind: OperationKind) -> OperationRequest {
    let criteria = match kind {
        OperationKind::Read => SelectionCriteria::Read(
            ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).expect("valid"),
        ),
        _ => SelectionCriteria::Write,
    };
    OperationRequest::new(db, command, kind, criteria)
}

/// Starts `request` and runs until it has settled (a checkout after the pool was cleared waits
/// for the next heartbeat).
fn run(net: &mut Net, request: OperationRequest) -> OpId {
    let op = net.start(request);
    let settled = net.now.saturating_add(Duration::from_secs(30));
    net.run_until(settled);
    op
}

fn find() -> OperationRequest {
    request("test", doc! { "find": "c" }, OperationKind::Read)
}

fn insert() -> OperationRequest {
    let command = doc! { "insert": "c", "documents": [{ "x": 1 }] };
    request("test", command, OperationKind::RetryableWrite)
}

/// Every OP_MSG the engine wrote but the hellos, in hex, one a line.
fn commands(net: &Net) -> String {
    let mut lines = String::new();
    for (_, _, bytes) in &net.transmits {
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let (used, message) = decoder.decode(rest).expect("valid OP_MSG");
            if message.is_some_and(|m| !is_hello(&m.body)) {
                for byte in &rest[..used] {
                    lines.push_str(&format!("{byte:02x}"));
                }
                lines.push('\n');
            }
            rest = &rest[used..];
        }
    }
    lines
}

/// SE-7, SE-17, SE-21, RW-6, RW-7, CS-4, TX-1 (issue 9): the session fields, byte for byte.
#[test]
fn issue9_the_session_fields_of_every_attempt_are_written_as_before() {
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("command-bytes", "0.1.0");
    let settings = TopologySettings::new(vec![address("m")]);
    let mut net = Net::new(EngineOptions::new(settings, handshake), mongos());
    let mut finished = Vec::new();
    // Implicit session: the write, its retry.
    finished.push(run(&mut net, insert()));
    // CSOT: maxTimeMS.
    let mut timed = find();
    timed.timeout = OperationTimeout::from_timeout_ms(net.now, Duration::from_millis(5_000));
    finished.push(run(&mut net, timed));
    // An explicit session: two causal reads, then a transaction and its commit.
    let session = net.engine.start_session();
    for _ in 0..2 {
        let mut read = find();
        read.session = Some(session);
        finished.push(run(&mut net, read));
    }
    net.engine
        .start_transaction(session, TransactionOptions::default(), net.now)
        .expect("a transaction starts");
    let mut write = insert();
    write.session = Some(session);
    finished.push(run(&mut net, write));
    let commit = OperationKind::CommitTransaction { again: false };
    let mut commit = request("admin", doc! { "commitTransaction": 1 }, commit);
    commit.session = Some(session);
    finished.push(run(&mut net, commit));
    for op in finished {
        let results = net.finished(op);
        assert_eq!(results.len(), 1, "finished exactly once");
        assert!(results[0].is_ok(), "{:?}", results[0]);
    }
    let actual = commands(&net);
    assert_eq!(actual.lines().count(), 7, "the attempts written:\n{actual}");
    assert_eq!(actual, EXPECTED, "the commands' bytes changed");
}

/// The paths of `prepare_attempt` the first script does not take, as main at bbd2203 wrote them
/// (review26 S6).
const EXPECTED_MORE: &str = include_str!("command_bytes_more.hex");

/// A mongos (with `load_balanced`, a load balancer: its hello has a `serviceId`) whose hello
/// has `logicalSessionTimeoutMinutes` only with `sessions`; then its replies to a transaction's
/// commands carry a `recoveryToken`, numbered in reply order. Its `find` and `getMore` replies
/// keep cursor 42 open.
fn server(sessions: bool, load_balanced: bool) -> Script {
    let mut tokens = 0;
    Box::new(move |_, body| {
        if is_hello(body) {
            let mut hello = doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true,
            "msg": "isdbgrid", "maxWireVersion": 25, "minWireVersion": 0 };
            if sessions {
                hello.insert("logicalSessionTimeoutMinutes", 30);
            }
            if load_balanced {
                let service = bson::oid::ObjectId::parse_str("65a1b2c3d4e5f60718293a4b");
                hello.insert("serviceId", service.expect("valid"));
            }
            return Some(hello);
        }
        let mut reply = doc! { "ok": 1 };
        if body.contains_key("find") {
            reply.insert(
                "cursor",
                doc! { "id": 42_i64, "ns": "test.c", "firstBatch": [] },
            );
        } else if body.contains_key("getMore") {
            reply.insert(
                "cursor",
                doc! { "id": 42_i64, "ns": "test.c", "nextBatch": [] },
            );
        }
        if sessions && body.contains_key("txnNumber") && body.contains_key("autocommit") {
            tokens += 1;
            reply.insert("recoveryToken", doc! { "token": tokens });
        }
        Some(reply)
    })
}

/// The cursor the last `CursorOpened` event reported.
fn opened(net: &Net) -> retry_core::engine::CursorHandle {
    net.events
        .iter()
        .rev()
        .find_map(|e| match e {
            retry_core::engine::EngineEvent::CursorOpened { cursor, .. } => Some(*cursor),
            _ => None,
        })
        .expect("a cursor opened")
}

/// Review26 S6 (issue 9): the paths of `prepare_attempt` the first script misses, byte for byte.
/// A connection without sessions: a retryable write and a read with neither `lsid` nor
/// `txnNumber` (RW-2, SE-13). Load-balanced: sessions supported without
/// `logicalSessionTimeoutMinutes`, so the write carries both (LB-5). On a mongos: a commit and an
/// abort each with the latest `recoveryToken` of their transaction (TX-6); a `getMore` under
/// `timeoutMS` without `maxTimeMS` (TO-13) and in its cursor's session (SE-14); the
/// `killCursors` of that cursor after its session ended, without `lsid` (SE-13).
#[test]
fn review26_s6_the_other_session_paths_are_written_as_before() {
    let mut actual = String::new();
    let mut finished = Vec::new();
    let options = |load_balanced: bool| {
        let mut handshake = HandshakeOptions::new();
        handshake.metadata = ClientMetadata::new("command-bytes", "0.1.0");
        let mut settings = TopologySettings::new(vec![address("m")]);
        settings.load_balanced = load_balanced;
        EngineOptions::new(settings, handshake)
    };
    let check = |net: &Net, ops: &mut Vec<OpId>| {
        for op in ops.drain(..) {
            let results = net.finished(op);
            assert_eq!(results.len(), 1, "finished exactly once");
            assert!(results[0].is_ok(), "{:?}", results[0]);
        }
    };

    // No sessions: RW-2, SE-13.
    let mut net = Net::new(options(false), server(false, false));
    finished.push(run(&mut net, insert()));
    finished.push(run(&mut net, find()));
    check(&net, &mut finished);
    actual.push_str(&commands(&net));

    // Load-balanced: LB-5.
    let mut net = Net::new(options(true), server(false, true));
    finished.push(run(&mut net, insert()));
    check(&net, &mut finished);
    actual.push_str(&commands(&net));

    // A mongos: recovery tokens, a cursor's getMore and its killCursors after the session ended.
    let mut net = Net::new(options(false), server(true, false));
    let session = net.engine.start_session();
    for end in ["commitTransaction", "abortTransaction"] {
        net.engine
            .start_transaction(session, TransactionOptions::default(), net.now)
            .expect("a transaction starts");
        let kind = OperationKind::InTransaction {
            read: false,
            first: true,
        };
        let mut write = request(
            "test",
            doc! { "insert": "c", "documents": [{ "x": 1 }] },
            kind,
        );
        write.session = Some(session);
        finished.push(run(&mut net, write));
        let kind = match end {
            "commitTransaction" => OperationKind::CommitTransaction { again: false },
            _ => OperationKind::AbortTransaction,
        };
        let mut end = request("admin", doc! { end: 1 }, kind);
        end.session = Some(session);
        finished.push(run(&mut net, end));
    }
    let mut open = find();
    open.session = Some(session);
    open.cursor = retry_core::engine::CursorUse::Open;
    finished.push(run(&mut net, open));
    check(&net, &mut finished);
    let cursor = opened(&net);
    let mut more = request(
        "test",
        doc! { "getMore": 42_i64, "collection": "c" },
        OperationKind::GetMore,
    );
    more.cursor = retry_core::engine::CursorUse::GetMore(cursor);
    more.timeout = OperationTimeout::from_timeout_ms(net.now, Duration::from_millis(5_000));
    finished.push(run(&mut net, more));
    net.engine.end_session(session, net.now);
    let mut kill = request(
        "test",
        doc! { "killCursors": "c", "cursors": [42_i64] },
        OperationKind::RunCommand,
    );
    kill.cursor = retry_core::engine::CursorUse::Close(cursor);
    finished.push(run(&mut net, kill));
    check(&net, &mut finished);
    actual.push_str(&commands(&net));

    assert_eq!(
        actual.lines().count(),
        10,
        "the attempts written:\n{actual}"
    );
    assert_eq!(actual, EXPECTED_MORE, "the commands' bytes changed");
}
