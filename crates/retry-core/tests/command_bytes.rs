//! The session fields an attempt's command carries, byte for byte (issue 9: `prepare_attempt`
//! works on the operation at hand; the commands it writes must not change). On a mongos that
//! gossips `$clusterTime` and `operationTime`: a retryable write in an implicit session and its
//! retry (SE-7, RW-6, RW-7: the same `lsid` and `txnNumber`), a read under CSOT (CS-4:
//! `maxTimeMS`), causal reads in an explicit session (SE-21: `afterClusterTime`), a transaction's
//! first command and its commit (TX-1: `startTransaction`, `autocommit`, `txnNumber`), each with
//! `$clusterTime` (SE-17). Every OP_MSG but the hellos is compared with the bytes the engine
//! wrote before that change (recorded from the build of main at bbd2203).

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
