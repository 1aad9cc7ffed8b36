//! The session fields an attempt's command carries, byte for byte (issue 9: `prepare_attempt`
//! works on the operation at hand; the commands it writes must not change). On a mongos that
//! gossips `$clusterTime` and `operationTime`: a retryable write in an implicit session and its
//! retry (SE-7, RW-6, RW-7: the same `lsid` and `txnNumber`), a read under CSOT (CS-4:
//! `maxTimeMS`), causal reads in an explicit session (SE-21: `afterClusterTime`), a transaction's
//! first command and its commit (TX-1: `startTransaction`, `autocommit`, `txnNumber`), each with
//! `$clusterTime` (SE-17). Every OP_MSG but the hellos is compared with the bytes the engine
//! wrote before that change (recorded from the build of main at bbd2203). A second test covers
//! the other paths (review26 S6: no sessions, load-balanced, `recoveryToken`, `getMore`,
//! `killCursors` after `end_session`), recorded the same way in `command_bytes_more.hex`. A third
//! covers `$readPreference` and `writeConcern` (review28 U9: SS-9, LB-6, TX-11), recorded from
//! the build of fixes28b at 82a3f20 in `command_bytes_preference.hex` after each command was
//! decoded and checked against the rules. A fourth (review37 W13) covers direct connections to
//! a secondary, a standalone and a mongos (SS-8), a replica set (SS-3, SS-9), a `w: 0` write
//! (WP-6, SE-13), a transaction's later commands and its end (TX-1, TX-11), CSOT on commit,
//! abort and `killCursors` (CS-4, TO-7), `endSessions` (SE-15) and the Stable API, in
//! `command_bytes_topologies.hex`. Besides the bytes, each test decodes every command and
//! asserts the fields the rules govern, with their IDs, so that the tests state the rules and
//! not only the bytes; the bytes are compared last. A golden is re-recorded only on purpose,
//! with [`RECORD`]. A fifth test checks a `getMore`'s own `maxTimeMS` under CSOT (TO-13,
//! review37 W14).

mod support;

use std::time::Duration;

use bson::{doc, spec::BinarySubtype, Binary, Bson, Document, Timestamp};
use retry_core::engine::{EngineOptions, OpId, OperationRequest};
use retry_core::error::ErrorKind;
use retry_core::handshake::{ClientMetadata, HandshakeOptions, ServerApi};
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::OperationTimeout;
use retry_core::topology::{TagSet, TopologySettings};
use retry_core::transaction::TransactionOptions;
use retry_core::wire::{FrameDecoder, MsgFlags, DEFAULT_MAX_MESSAGE_SIZE_BYTES};
use support::net::{address, is_hello, member_hello, Net, Script};

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
        let mut reply = doc! { "ok": 1 };
        if body.contains_key("insert") && !failed {
            failed = true;
            reply = doc! { "ok": 0, "code": 91, "errmsg": "shutting down",
            "errorLabels": ["RetryableWriteError"] };
        }
        reply.insert("$clusterTime", gossiped());
        reply.insert("operationTime", gossiped_time());
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

/// One command the engine wrote (not a hello): its OP_MSG in hex, its body decoded, and the
/// body's keys in the order written (a key written twice is listed twice: a server refuses a
/// duplicate field).
struct Sent {
    hex: String,
    body: Document,
    keys: Vec<String>,
    /// The OP_MSG `flagBits` (WP-2, WP-6).
    flags: MsgFlags,
}

/// Every OP_MSG the engine wrote but the hellos, in order.
fn sent(net: &Net) -> Vec<Sent> {
    let mut sent = Vec::new();
    for (_, _, bytes) in &net.transmits {
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let (used, message) = decoder.decode_raw(rest).expect("valid OP_MSG");
            if let Some(message) = message {
                let body = Document::try_from(message.body.as_ref()).expect("a valid body");
                if !is_hello(&body) {
                    let keys = message.body.iter();
                    let keys = keys.map(|e| e.expect("valid").0.as_str().to_owned());
                    let hex = rest[..used].iter().map(|b| format!("{b:02x}")).collect();
                    sent.push(Sent {
                        hex,
                        body,
                        keys: keys.collect(),
                        flags: message.flags,
                    });
                }
            }
            rest = &rest[used..];
        }
    }
    sent
}

/// The commands' OP_MSGs in hex, one a line.
fn lines(sent: &[Sent]) -> String {
    sent.iter().map(|s| format!("{}\n", s.hex)).collect()
}

/// The environment variable that re-records a golden file on purpose: set to the file's name
/// (`COMMAND_BYTES_RECORD=command_bytes_topologies.hex`), the test that checks that file writes
/// the bytes it saw into it, after its field asserts passed, and then fails, so that a recording
/// run never passes as a check. Review the diff of the file, and the rules each changed command
/// follows, before committing it.
const RECORD: &str = "COMMAND_BYTES_RECORD";

/// Compares `actual` with the golden `expected`, the contents of `tests/<file>`; or, when
/// [`RECORD`] names `file`, records `actual` there and fails.
fn check_golden(file: &str, expected: &str, actual: &str) {
    if std::env::var_os(RECORD).is_some_and(|name| name == file) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests")
            .join(file);
        std::fs::write(&path, actual).expect("the golden file is written");
        panic!(
            "{RECORD}: recorded {}; run again without it",
            path.display()
        );
    }
    assert_eq!(
        actual, expected,
        "the commands' bytes changed ({file}; to re-record it on purpose: {RECORD}={file})"
    );
}

/// The fields the command rules govern (SE-13, SE-17, SE-21, RW-6, TX-1, TX-6, TX-11, CS-4,
/// TO-13, SS-9, LB-6, WP-5), whether the engine adds them or passes them on.
const RULED: [&str; 11] = [
    "txnNumber",
    "autocommit",
    "startTransaction",
    "readConcern",
    "writeConcern",
    "recoveryToken",
    "maxTimeMS",
    "$clusterTime",
    "$readPreference",
    "$db",
    "lsid",
];

/// Checks `sent`: the command `name` first (WP-3), no key twice, the [`RULED`] fields exactly
/// `fields` in that order, and `$db` naming `db` (WP-5) and `lsid` an `{id: UUID}` (SE-3) when
/// present.
fn assert_fields(sent: &Sent, name: &str, db: &str, fields: &[&str]) {
    let body = &sent.body;
    assert_eq!(sent.keys.first().map(String::as_str), Some(name), "{body}");
    let mut keys = sent.keys.clone();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), sent.keys.len(), "a key written twice: {body}");
    let ruled: Vec<&str> = sent
        .keys
        .iter()
        .map(String::as_str)
        .filter(|k| RULED.contains(k))
        .collect();
    assert_eq!(ruled, fields, "the command's fields: {body}");
    assert_eq!(body.get_str("$db").ok(), Some(db), "{body}");
    if let Ok(lsid) = body.get_document("lsid") {
        let uuid = match lsid.get("id") {
            Some(Bson::Binary(b)) => {
                let version = b.bytes.get(6).map(|v| v >> 4);
                b.subtype == BinarySubtype::Uuid && b.bytes.len() == 16 && version == Some(4)
            }
            _ => false,
        };
        assert!(uuid && lsid.len() == 1, "SE-3: {body}");
    }
}

/// The `lsid` `sent` carries.
fn lsid(sent: &Sent) -> &Document {
    sent.body.get_document("lsid").expect("an lsid")
}

/// RW-6: the `txnNumber`, a BSON int64.
fn txn_number(sent: &Sent) -> i64 {
    match sent.body.get("txnNumber") {
        Some(Bson::Int64(n)) => *n,
        other => panic!("RW-6: txnNumber must be an int64, not {other:?}"),
    }
}

/// The `$clusterTime` the scripted mongos gossips (SE-17: sent back exactly as received).
fn gossiped() -> Document {
    let signature = doc! {
        "hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 20] },
        "keyId": 0_i64,
    };
    doc! { "clusterTime": gossiped_time(), "signature": signature }
}

/// The `clusterTime` and `operationTime` the scripted mongos gossips.
fn gossiped_time() -> Timestamp {
    Timestamp {
        time: 100,
        increment: 7,
    }
}

/// SE-17: every `$clusterTime` sent is the one gossiped, as received.
fn assert_cluster_times(sent: &[Sent]) {
    for s in sent.iter().filter(|s| s.body.contains_key("$clusterTime")) {
        let sent = s.body.get_document("$clusterTime").ok();
        assert_eq!(sent, Some(&gossiped()), "SE-17: {}", s.body);
    }
}

/// TX-1: the commands of one transaction: `autocommit: false` on each, one `txnNumber`.
fn assert_transaction(commands: &[Sent]) {
    for s in commands {
        let autocommit = s.body.get("autocommit");
        assert_eq!(autocommit, Some(&Bson::Boolean(false)), "TX-1: {}", s.body);
        assert_eq!(txn_number(s), txn_number(&commands[0]), "TX-1: {}", s.body);
    }
}

/// SE-7, SE-17, SE-20, SE-21, RW-6, RW-7, CS-4, TX-1 (issue 9): the session fields, byte for byte.
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
    let sent = sent(&net);
    let actual = lines(&sent);
    assert_eq!(sent.len(), 7, "the attempts written:\n{actual}");

    // The rules the bytes follow, field by field.
    // SE-7, RW-6: the write in an implicit session; RW-7: its retry with the same `lsid` and
    // `txnNumber`; SE-16, SE-17: the retry sends the cluster time the failure gossiped (the
    // first attempt none: the hellos gossip nothing, SE-19).
    assert_fields(&sent[0], "insert", "test", &["txnNumber", "$db", "lsid"]);
    let retried = ["txnNumber", "$clusterTime", "$db", "lsid"];
    assert_fields(&sent[1], "insert", "test", &retried);
    assert_eq!((txn_number(&sent[0]), txn_number(&sent[1])), (1, 1));
    assert_eq!(lsid(&sent[0]), lsid(&sent[1]));
    // CS-4: maxTimeMS = the time left (5 s: no virtual time passed) minus the minimum RTT (0
    // with fewer than two samples).
    let timed = ["$clusterTime", "maxTimeMS", "$db", "lsid"];
    assert_fields(&sent[2], "find", "test", &timed);
    assert_eq!(sent[2].body.get("maxTimeMS"), Some(&Bson::Int32(5_000)));
    // SE-21: the explicit session's first read has no operationTime to wait for; the second
    // waits for the first's (`afterClusterTime`, no `level`).
    assert_fields(&sent[3], "find", "test", &["$clusterTime", "$db", "lsid"]);
    let causal = ["readConcern", "$clusterTime", "$db", "lsid"];
    assert_fields(&sent[4], "find", "test", &causal);
    let after = doc! { "afterClusterTime": gossiped_time() };
    assert_eq!(sent[4].body.get_document("readConcern").ok(), Some(&after));
    // TX-1: the transaction's first command: a new `txnNumber` (2: the pooled server session
    // keeps its number, RW-6), `autocommit: false`, `startTransaction`, the causal read concern
    // (SE-21); its commit: the same number, `autocommit: false`, no `startTransaction`.
    let first = [
        "txnNumber",
        "autocommit",
        "readConcern",
        "$clusterTime",
        "startTransaction",
        "$db",
        "lsid",
    ];
    assert_fields(&sent[5], "insert", "test", &first);
    assert_eq!(sent[5].body.get_document("readConcern").ok(), Some(&after));
    assert_eq!(
        sent[5].body.get("startTransaction"),
        Some(&Bson::Boolean(true))
    );
    let commit = ["txnNumber", "autocommit", "$clusterTime", "$db", "lsid"];
    assert_fields(&sent[6], "commitTransaction", "admin", &commit);
    assert_eq!((txn_number(&sent[5]), txn_number(&sent[6])), (2, 2));
    assert_transaction(&sent[5..]);
    // SE-7: the explicit session's commands share its `lsid`.
    assert!(sent[3..].iter().all(|s| lsid(s) == lsid(&sent[3])));
    assert_cluster_times(&sent);
    // Last, so that a deliberate re-recording checks the rules first.
    check_golden("command_bytes.hex", EXPECTED, &actual);
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
    let mut all = Vec::new();
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
    all.extend(sent(&net));

    // Load-balanced: LB-5.
    let mut net = Net::new(options(true), server(false, true));
    finished.push(run(&mut net, insert()));
    check(&net, &mut finished);
    all.extend(sent(&net));

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
    all.extend(sent(&net));

    let actual = lines(&all);
    assert_eq!(all.len(), 10, "the attempts written:\n{actual}");

    // The rules the bytes follow, field by field. RW-2, SE-8, SE-13: no sessions, so neither
    // `lsid` nor `txnNumber`, and nothing to gossip.
    assert_fields(&all[0], "insert", "test", &["$db"]);
    assert_fields(&all[1], "find", "test", &["$db"]);
    // LB-5: sessions without `logicalSessionTimeoutMinutes`; RW-6: the write numbered.
    assert_fields(&all[2], "insert", "test", &["txnNumber", "$db", "lsid"]);
    assert_eq!(txn_number(&all[2]), 1);
    // TX-1: each transaction's first command and its end; TX-6: the commit and the abort carry
    // the latest `recoveryToken` of their own transaction (the server numbers its tokens in
    // reply order: the commit's reply gave 2, dropped when the next transaction started).
    let first = ["txnNumber", "autocommit", "startTransaction", "$db", "lsid"];
    let end = ["txnNumber", "autocommit", "recoveryToken", "$db", "lsid"];
    assert_fields(&all[3], "insert", "test", &first);
    assert_fields(&all[4], "commitTransaction", "admin", &end);
    assert_fields(&all[5], "insert", "test", &first);
    assert_fields(&all[6], "abortTransaction", "admin", &end);
    assert_transaction(&all[3..5]);
    assert_transaction(&all[5..7]);
    assert_eq!((txn_number(&all[3]), txn_number(&all[5])), (1, 2));
    for (end, token) in [(&all[4], 1), (&all[6], 3)] {
        let sent = end.body.get_document("recoveryToken").ok();
        assert_eq!(sent, Some(&doc! { "token": token }), "TX-6");
    }
    // SE-14: the `getMore` in its cursor's session; TO-13: no `maxTimeMS` on it under
    // `timeoutMS`; SE-13: the `killCursors` after the session ended, without `lsid`.
    assert_fields(&all[7], "find", "test", &["$db", "lsid"]);
    assert_fields(&all[8], "getMore", "test", &["$db", "lsid"]);
    assert_eq!(lsid(&all[8]), lsid(&all[7]));
    assert_fields(&all[9], "killCursors", "test", &["$db"]);
    // Last, so that a deliberate re-recording checks the rules first.
    check_golden("command_bytes_more.hex", EXPECTED_MORE, &actual);
}

/// The paths of `send_checked_out` and `prepare_attempt` neither script above takes (review28
/// U9): `$readPreference` and `writeConcern`.
const EXPECTED_PREFERENCE: &str = include_str!("command_bytes_preference.hex");

/// A read selected with `mode`, `tags` (one tag set of `dc: <tags>`, if given) and
/// `maxStalenessSeconds`.
fn read_with(
    mode: ReadPreferenceMode,
    tags: Option<&str>,
    staleness: Option<i64>,
) -> OperationRequest {
    let tag_sets = tags
        .map(|dc| {
            let mut set = TagSet::new();
            set.insert("dc", dc);
            vec![set]
        })
        .unwrap_or_default();
    let preference = ReadPreference::new(mode, tag_sets, staleness).expect("valid");
    let criteria = SelectionCriteria::Read(preference);
    OperationRequest::new("test", doc! { "find": "c" }, OperationKind::Read, criteria)
}

/// Review28 U9 (issue 9): the read preference and write concern paths, byte for byte and field
/// by field. On a mongos: a retryable write with its own `writeConcern` and its retry (passed
/// on as given, RW-6, RW-7); a `secondaryPreferred` read (SS-9: `$readPreference` appended as
/// `{mode}`); a `secondary` read with a tag set and `maxStalenessSeconds` (SS-9: `tags`); a
/// read whose command has its own `$readPreference` (replaced, not written twice); a primary
/// read (SS-9: none); a transaction whose commit carries the transaction's write concern and
/// whose commit again carries `w: "majority"` and `wtimeout` (TX-11). On a load balancer: a
/// `secondaryPreferred` read (LB-6, LB-5).
#[test]
fn review28_u9_read_preference_and_write_concern_are_written_as_the_rules_say() {
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("command-bytes", "0.1.0");
    let settings = TopologySettings::new(vec![address("m")]);
    let mut net = Net::new(EngineOptions::new(settings, handshake.clone()), mongos());
    let mut finished = Vec::new();
    let mut write = insert();
    let concern = doc! { "w": "majority", "j": true };
    write.command.insert("writeConcern", concern.clone());
    finished.push(run(&mut net, write));
    let secondary_preferred = ReadPreferenceMode::SecondaryPreferred;
    finished.push(run(&mut net, read_with(secondary_preferred, None, None)));
    let tagged = read_with(ReadPreferenceMode::Secondary, Some("ny"), Some(120));
    finished.push(run(&mut net, tagged));
    let mut own = read_with(secondary_preferred, None, None);
    own.command
        .insert("$readPreference", doc! { "mode": "nearest" });
    own.command.insert("filter", doc! { "x": 1 });
    finished.push(run(&mut net, own));
    finished.push(run(
        &mut net,
        read_with(ReadPreferenceMode::Primary, None, None),
    ));
    let session = net.engine.start_session();
    let options = TransactionOptions::default().with_write_concern(doc! { "w": 1, "j": true });
    net.engine
        .start_transaction(session, options, net.now)
        .expect("a transaction starts");
    let mut write = insert();
    write.session = Some(session);
    finished.push(run(&mut net, write));
    for again in [false, true] {
        let kind = OperationKind::CommitTransaction { again };
        let mut commit = request("admin", doc! { "commitTransaction": 1 }, kind);
        commit.session = Some(session);
        finished.push(run(&mut net, commit));
    }
    for op in finished.drain(..) {
        let results = net.finished(op);
        assert_eq!(results.len(), 1, "finished exactly once");
        assert!(results[0].is_ok(), "{:?}", results[0]);
    }
    let mut all = sent(&net);

    let mut settings = TopologySettings::new(vec![address("m")]);
    settings.load_balanced = true;
    let mut net = Net::new(EngineOptions::new(settings, handshake), server(false, true));
    let op = run(&mut net, read_with(secondary_preferred, None, None));
    let results = net.finished(op);
    assert_eq!(results.len(), 1, "finished exactly once");
    assert!(results[0].is_ok(), "{:?}", results[0]);
    all.extend(sent(&net));

    let actual = lines(&all);
    assert_eq!(all.len(), 10, "the attempts written:\n{actual}");

    // The rules the bytes follow, field by field. RW-6, RW-7: the write and its retry, one
    // `lsid` and `txnNumber`; the `writeConcern` it was given goes out as given on both (SE-16,
    // SE-17: the retry with the failure's cluster time).
    let written = ["writeConcern", "txnNumber", "$db", "lsid"];
    assert_fields(&all[0], "insert", "test", &written);
    let retried = ["writeConcern", "txnNumber", "$clusterTime", "$db", "lsid"];
    assert_fields(&all[1], "insert", "test", &retried);
    assert_eq!((txn_number(&all[0]), txn_number(&all[1])), (1, 1));
    assert_eq!(lsid(&all[0]), lsid(&all[1]));
    for s in &all[..2] {
        assert_eq!(s.body.get_document("writeConcern").ok(), Some(&concern));
    }
    // SS-9: a mongos is told every mode but primary, appended after the command's fields; a
    // tag set as `tags`, with `maxStalenessSeconds`.
    let preferred = ["$clusterTime", "$readPreference", "$db", "lsid"];
    assert_fields(&all[2], "find", "test", &preferred);
    let mode = doc! { "mode": "secondaryPreferred" };
    assert_eq!(
        all[2].body.get_document("$readPreference").ok(),
        Some(&mode)
    );
    assert_fields(&all[3], "find", "test", &preferred);
    let tagged = doc! { "mode": "secondary", "tags": [{ "dc": "ny" }], "maxStalenessSeconds": 120 };
    assert_eq!(
        all[3].body.get_document("$readPreference").ok(),
        Some(&tagged)
    );
    // A command with a `$readPreference` of its own: the one selection used takes its place
    // (after `find`, before `filter`), written once.
    let own = ["$readPreference", "$clusterTime", "$db", "lsid"];
    assert_fields(&all[4], "find", "test", &own);
    assert_eq!(all[4].keys[1], "$readPreference");
    assert_eq!(
        all[4].body.get_document("$readPreference").ok(),
        Some(&mode)
    );
    // SS-9: primary is not sent.
    assert_fields(&all[5], "find", "test", &["$clusterTime", "$db", "lsid"]);
    // TX-1: in a transaction, no write concern on its statements; the transaction's write
    // concern on the commit; TX-11: a commit again with `w: "majority"`, the other options kept
    // and `wtimeout: 10000` added.
    let first = [
        "txnNumber",
        "autocommit",
        "$clusterTime",
        "startTransaction",
        "$db",
        "lsid",
    ];
    assert_fields(&all[6], "insert", "test", &first);
    let commit = [
        "writeConcern",
        "txnNumber",
        "autocommit",
        "$clusterTime",
        "$db",
        "lsid",
    ];
    assert_fields(&all[7], "commitTransaction", "admin", &commit);
    assert_fields(&all[8], "commitTransaction", "admin", &commit);
    assert_transaction(&all[6..9]);
    let given = doc! { "w": 1, "j": true };
    assert_eq!(all[7].body.get_document("writeConcern").ok(), Some(&given));
    let majority = doc! { "w": "majority", "j": true, "wtimeout": 10_000_i64 };
    assert_eq!(
        all[8].body.get_document("writeConcern").ok(),
        Some(&majority)
    );
    assert_cluster_times(&all[..9]);
    // LB-6: a load balancer is told the mode as a mongos is; LB-5: with an `lsid`.
    assert_fields(&all[9], "find", "test", &["$readPreference", "$db", "lsid"]);
    assert_eq!(
        all[9].body.get_document("$readPreference").ok(),
        Some(&mode)
    );
    // Last, so that a deliberate re-recording checks the rules first.
    check_golden("command_bytes_preference.hex", EXPECTED_PREFERENCE, &actual);
}

/// The topologies, transactions, timeouts and Stable API paths the tests above do not take
/// (review37 W13), recorded from the build of wire21 (main at 3a723b1 plus W14) in
/// `command_bytes_topologies.hex` after each command was decoded and checked against the rules
/// below.
const EXPECTED_TOPOLOGIES: &str = include_str!("command_bytes_topologies.hex");

/// What a data-bearing server (a replica-set member, a standalone) answers to a command: no
/// reply to an unacknowledged write (WP-6: it was sent with `moreToCome`); a `find` with a
/// `batchSize` opens cursor 42 (any other closes at once), a `getMore` keeps it open; with
/// `gossip` (a replica set, not a standalone), `$clusterTime` and `operationTime`.
fn data_reply(body: &Document, gossip: bool) -> Option<Document> {
    let unacknowledged = body
        .get_document("writeConcern")
        .is_ok_and(|w| w.get("w") == Some(&Bson::Int32(0)));
    if unacknowledged {
        return None;
    }
    let mut reply = doc! { "ok": 1 };
    if body.contains_key("find") {
        let id = if body.contains_key("batchSize") {
            42_i64
        } else {
            0
        };
        reply.insert(
            "cursor",
            doc! { "id": id, "ns": "test.c", "firstBatch": [] },
        );
    } else if body.contains_key("getMore") {
        reply.insert(
            "cursor",
            doc! { "id": 42_i64, "ns": "test.c", "nextBatch": [] },
        );
    }
    if gossip {
        reply.insert("$clusterTime", gossiped());
        reply.insert("operationTime", gossiped_time());
    }
    Some(reply)
}

/// The hosts that received each command (not the hellos), in order.
type Hosts = std::rc::Rc<std::cell::RefCell<Vec<String>>>;

/// Members of the replica set `rs` (`a` primary, `b` secondary, [`member_hello`]), noting in
/// `hosts` where each command went.
fn replica_set(hosts: &Hosts) -> Script {
    let hosts = hosts.clone();
    Box::new(move |address, body| {
        if is_hello(body) {
            return Some(member_hello(address, &["a", "b"]));
        }
        hosts.borrow_mut().push(address.host().to_owned());
        data_reply(body, true)
    })
}

/// A standalone with sessions (`logicalSessionTimeoutMinutes`): it has no cluster time.
fn standalone() -> Script {
    Box::new(|_, body| {
        if is_hello(body) {
            return Some(doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true,
            "maxWireVersion": 25, "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30 });
        }
        data_reply(body, false)
    })
}

/// A mongos with sessions whose `commitTransaction` fails first with an overload error
/// (`ExceededMemoryLimit`-like 112 with `RetryableError` and `SystemOverloadedError`, as in the
/// transactions spec's `backpressure-retryable-commit.json`), then with a retryable write error
/// (91), then succeeds; a transaction's other replies carry a `recoveryToken`.
fn overloaded_commit() -> Script {
    let mut commits = 0;
    let mut answer = server(true, false);
    Box::new(move |address, body| {
        if body.contains_key("commitTransaction") {
            commits += 1;
            match commits {
                1 => {
                    return Some(doc! { "ok": 0, "code": 112, "errmsg": "overloaded",
                    "errorLabels": ["RetryableError", "SystemOverloadedError"] })
                }
                2 => {
                    return Some(doc! { "ok": 0, "code": 91, "errmsg": "shutting down",
                    "errorLabels": ["RetryableWriteError"] })
                }
                _ => {}
            }
        }
        answer(address, body)
    })
}

/// Engine options for `seeds`: a direct connection (topology Single) with `direct`, the replica
/// set `rs` with `replica_set`; the Stable API version 1 (strict, without deprecation errors)
/// with `api`.
fn topology_options(seeds: &[&str], direct: bool, replica_set: bool, api: bool) -> EngineOptions {
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("command-bytes", "0.1.0");
    if api {
        handshake.server_api = Some(ServerApi {
            version: "1".into(),
            strict: Some(true),
            deprecation_errors: Some(false),
        });
    }
    let mut settings = TopologySettings::new(seeds.iter().map(|h| address(h)).collect());
    settings.direct_connection = direct;
    settings.replica_set = replica_set.then(|| "rs".to_owned());
    EngineOptions::new(settings, handshake)
}

/// Checks that each of `ops` finished exactly once, successfully.
fn succeeded(net: &Net, ops: &mut Vec<OpId>) {
    for op in ops.drain(..) {
        let results = net.finished(op);
        assert_eq!(results.len(), 1, "finished exactly once");
        assert!(results[0].is_ok(), "{:?}", results[0]);
    }
}

/// A request of `kind` on `test` selected for reading with `mode`.
fn read_request(
    command: Document,
    kind: OperationKind,
    mode: ReadPreferenceMode,
) -> OperationRequest {
    let preference = ReadPreference::new(mode, Vec::new(), None).expect("valid");
    OperationRequest::new("test", command, kind, SelectionCriteria::Read(preference))
}

/// A `find` that opens cursor 42 (the scripts keep it open).
fn opening_find() -> OperationRequest {
    let mut open = find();
    open.command.insert("batchSize", 1);
    open.cursor = retry_core::engine::CursorUse::Open;
    open
}

/// The `getMore` of `cursor` (42), in the cursor's session (SE-14), as the driver's cursor sends
/// it.
fn get_more(cursor: retry_core::engine::CursorHandle) -> OperationRequest {
    let command = doc! { "getMore": 42_i64, "collection": "c" };
    request("test", command, OperationKind::GetMore)
        .with_cursor(retry_core::engine::CursorUse::GetMore(cursor))
}

/// The `killCursors` of `cursor` (42).
fn kill_cursors(cursor: retry_core::engine::CursorHandle) -> OperationRequest {
    let command = doc! { "killCursors": "c", "cursors": [42_i64] };
    request("test", command, OperationKind::RunCommand)
        .with_cursor(retry_core::engine::CursorUse::Close(cursor))
}

/// A `commitTransaction` (or `abortTransaction`) request in `session`.
fn end_transaction(session: retry_core::engine::SessionHandle, commit: bool) -> OperationRequest {
    let (command, kind) = match commit {
        true => (
            doc! { "commitTransaction": 1 },
            OperationKind::CommitTransaction { again: false },
        ),
        false => (
            doc! { "abortTransaction": 1 },
            OperationKind::AbortTransaction,
        ),
    };
    request("admin", command, kind).with_session(session)
}

/// Closes the engine (SE-15: `endSessions` for the pooled sessions) and runs until it is closed.
fn close(net: &mut Net) {
    let now = net.now;
    net.engine.close(now);
    net.drain();
    let settled = net.now.saturating_add(Duration::from_secs(30));
    net.run_until(settled);
    assert!(net.engine.is_closed(), "the engine closed");
}

/// The `$readPreference` `sent` carries.
fn preference(sent: &Sent) -> Option<&Document> {
    sent.body.get_document("$readPreference").ok()
}

/// Versioned API: the declared version's fields (`apiVersion`, `apiStrict`,
/// `apiDeprecationErrors`) close the command, once each, as declared.
fn assert_api(sent: &Sent) {
    let tail = &sent.keys[sent.keys.len().saturating_sub(3)..];
    assert_eq!(
        tail,
        ["apiVersion", "apiStrict", "apiDeprecationErrors"],
        "{}",
        sent.body
    );
    assert_eq!(sent.body.get_str("apiVersion").ok(), Some("1"));
    assert_eq!(sent.body.get_bool("apiStrict").ok(), Some(true));
    assert_eq!(sent.body.get_bool("apiDeprecationErrors").ok(), Some(false));
}

/// `maxTimeMS` as sent: an Int32 (CS-4).
fn max_time(sent: &Sent) -> Option<i32> {
    match sent.body.get("maxTimeMS") {
        Some(Bson::Int32(ms)) => Some(*ms),
        None => None,
        Some(other) => panic!("CS-4: maxTimeMS must be an Int32, not {other:?}"),
    }
}

/// Review37 W13 (issue 9): what the tests above miss, byte for byte and field by field.
///
/// - SS-8, a direct connection (topology Single): to a secondary, a primary read (and a
///   primary run-command, SS-10) says `primaryPreferred`, a secondary read its own mode and
///   tags; to a standalone nothing, and a retryable write no `txnNumber` (RW-2); to a mongos a
///   primary read nothing and a `nearest` read its mode (SS-9).
/// - SS-3, SS-9, SS-7 in a replica set: a secondary read goes to the secondary with its mode, a
///   primary read to the primary without one, a `primaryPreferred` read to the primary with
///   its mode, a write without one.
/// - WP-6, SE-13, RW-4: a `w: 0` insert goes with `moreToCome`, without `lsid` or `txnNumber`;
///   in an explicit session it is refused, nothing sent.
/// - SE-21 on writes (DRIVERS-3274): an explicit session's insert after a read waits for it
///   (`readConcern.afterClusterTime`); its run-command does not.
/// - TX-1: the transaction's second statement has no `startTransaction`, `readConcern` or
///   `writeConcern` (an inherited one dropped); a read and a `getMore` in it carry the
///   `txnNumber` and `autocommit: false`, no `readConcern` and no `$readPreference`.
/// - TX-1, TX-11: the transaction's `writeConcern` goes on `commitTransaction` and on
///   `abortTransaction` only; a commit retried after an overload error keeps it (TX-11's
///   backpressure exception), one retried after a retryable write error says `w: "majority"`
///   with `wtimeout`.
/// - CS-4, TO-8: `maxTimeMS` on commit, abort and `killCursors` under `timeoutMS` (a
///   commit's `maxCommitTimeMS` ignored); TO-6: without `timeoutMS`, `maxCommitTimeMS` on every
///   commit attempt; TO-7: no `maxTimeMS` with `timeoutMS=0`.
/// - RW-2, RW-4, SE-13 (review37 W2): a caller's `$db`, `lsid` and `txnNumber` are replaced or
///   dropped.
/// - SE-15: `endSessions` at close, on `admin`, without an `lsid` of its own, `primaryPreferred`
///   to a replica set (SS-3) and to a mongos (SS-9).
/// - Versioned API: the declared version on every command, a `getMore`, a transaction's commands
///   (its commit and abort), `killCursors` and `endSessions` included.
#[test]
fn review37_w13_topologies_transactions_and_timeouts_are_written_as_the_rules_say() {
    let mut all = Vec::new();
    let mut ops = Vec::new();
    let hosts: Hosts = Default::default();

    // SS-8: directly to a secondary.
    let mut net = Net::new(
        topology_options(&["b"], true, false, false),
        replica_set(&hosts),
    );
    ops.push(run(&mut net, find()));
    let mut tagged = read_with(ReadPreferenceMode::Secondary, Some("ny"), None);
    tagged.command.insert("filter", doc! { "x": 1 });
    ops.push(run(&mut net, tagged));
    let list = doc! { "listDatabases": 1 };
    let mut list = read_request(list, OperationKind::RunCommand, ReadPreferenceMode::Primary);
    list.db = "admin".into();
    ops.push(run(&mut net, list));
    succeeded(&net, &mut ops);
    all.extend(sent(&net));

    // SS-8, RW-2: directly to a standalone.
    let mut net = Net::new(topology_options(&["s"], true, false, false), standalone());
    let preferred = ReadPreferenceMode::SecondaryPreferred;
    ops.push(run(&mut net, read_with(preferred, None, None)));
    ops.push(run(&mut net, insert()));
    succeeded(&net, &mut ops);
    all.extend(sent(&net));

    // SS-8, SS-9: directly to a mongos.
    let mut net = Net::new(
        topology_options(&["m"], true, false, false),
        server(true, false),
    );
    ops.push(run(&mut net, find()));
    ops.push(run(
        &mut net,
        read_with(ReadPreferenceMode::Nearest, None, None),
    ));
    succeeded(&net, &mut ops);
    all.extend(sent(&net));
    let direct = all.len();

    // A replica set: reads by mode, writes, w:0, an explicit session and its transactions.
    let mut net = Net::new(
        topology_options(&["a", "b"], false, true, false),
        replica_set(&hosts),
    );
    hosts.borrow_mut().clear();
    ops.push(run(
        &mut net,
        read_with(ReadPreferenceMode::Secondary, None, None),
    ));
    ops.push(run(&mut net, find()));
    ops.push(run(
        &mut net,
        read_with(ReadPreferenceMode::PrimaryPreferred, None, None),
    ));
    ops.push(run(&mut net, insert()));
    let mut unacknowledged = insert();
    unacknowledged
        .command
        .insert("writeConcern", doc! { "w": 0 });
    ops.push(run(&mut net, unacknowledged.clone()));
    succeeded(&net, &mut ops);
    let session = net.engine.start_session();
    // SE-13: an unacknowledged write in an explicit session is refused; nothing is sent.
    let refused = run(&mut net, unacknowledged.with_session(session));
    let results = net.finished(refused);
    assert_eq!(results.len(), 1, "finished exactly once");
    let usage = matches!(&results[0], Err(e) if matches!(e.kind, ErrorKind::Usage { .. }));
    assert!(usage, "SE-13: {:?}", results[0]);
    ops.push(run(&mut net, find().with_session(session)));
    ops.push(run(&mut net, insert().with_session(session)));
    let ping = request("admin", doc! { "ping": 1 }, OperationKind::RunCommand);
    ops.push(run(&mut net, ping.with_session(session)));
    // TO-8: under `timeoutMS` the commit's `maxCommitTimeMS` is ignored.
    let options = TransactionOptions::default()
        .with_read_concern(doc! { "level": "majority" })
        .with_write_concern(doc! { "w": "majority" })
        .with_max_commit_time(Duration::from_secs(30));
    net.engine
        .start_transaction(session, options.clone(), net.now)
        .expect("a transaction starts");
    ops.push(run(&mut net, insert().with_session(session)));
    let mut second = insert().with_session(session);
    second.command.insert("writeConcern", doc! { "w": 1 });
    second.concerns_inherited = true;
    ops.push(run(&mut net, second));
    ops.push(run(&mut net, opening_find().with_session(session)));
    succeeded(&net, &mut ops);
    let cursor = opened(&net);
    ops.push(run(&mut net, get_more(cursor)));
    let csot = |net: &Net| OperationTimeout::from_timeout_ms(net.now, Duration::from_millis(5_000));
    let commit = end_transaction(session, true).with_timeout(csot(&net));
    ops.push(run(&mut net, commit));
    net.engine
        .start_transaction(session, options, net.now)
        .expect("a transaction starts");
    ops.push(run(&mut net, insert().with_session(session)));
    let abort = end_transaction(session, false).with_timeout(csot(&net));
    ops.push(run(&mut net, abort));
    succeeded(&net, &mut ops);
    ops.push(run(&mut net, opening_find()));
    succeeded(&net, &mut ops);
    let cursor = opened(&net);
    let kill = kill_cursors(cursor).with_timeout(csot(&net));
    ops.push(run(&mut net, kill));
    let unbounded = OperationTimeout::from_timeout_ms(net.now, Duration::ZERO);
    ops.push(run(&mut net, find().with_timeout(unbounded)));
    // Review37 W2: a caller's `$db`, `lsid` and `txnNumber`.
    let mut own = find();
    own.command.insert("$db", "other");
    own.command.insert("lsid", doc! { "id": 1 });
    own.command.insert("txnNumber", 5_i64);
    ops.push(run(&mut net, own));
    succeeded(&net, &mut ops);
    net.engine.end_session(session, net.now);
    close(&mut net);
    let replica_set_start = all.len();
    all.extend(sent(&net));
    let rs_hosts = hosts.borrow().clone();

    // The Stable API on a mongos: a cursor, a transaction's commit and another's abort, close.
    let mut net = Net::new(
        topology_options(&["m"], false, false, true),
        server(true, false),
    );
    ops.push(run(&mut net, opening_find()));
    succeeded(&net, &mut ops);
    let cursor = opened(&net);
    ops.push(run(&mut net, get_more(cursor)));
    ops.push(run(&mut net, kill_cursors(cursor)));
    let session = net.engine.start_session();
    for commit in [true, false] {
        net.engine
            .start_transaction(session, TransactionOptions::default(), net.now)
            .expect("a transaction starts");
        ops.push(run(&mut net, insert().with_session(session)));
        ops.push(run(&mut net, end_transaction(session, commit)));
    }
    succeeded(&net, &mut ops);
    net.engine.end_session(session, net.now);
    close(&mut net);
    let api_start = all.len();
    all.extend(sent(&net));

    // TX-11 and its backpressure exception: a commit that fails with an overload error, then
    // with a retryable write error, then succeeds.
    let mut net = Net::new(
        topology_options(&["m"], false, false, false),
        overloaded_commit(),
    );
    let session = net.engine.start_session();
    let options = TransactionOptions::default()
        .with_write_concern(doc! { "w": 1 })
        .with_max_commit_time(Duration::from_millis(2_000));
    net.engine
        .start_transaction(session, options, net.now)
        .expect("a transaction starts");
    ops.push(run(&mut net, insert().with_session(session)));
    ops.push(run(&mut net, end_transaction(session, true)));
    succeeded(&net, &mut ops);
    let overload_start = all.len();
    all.extend(sent(&net));

    let actual = lines(&all);
    assert_eq!(all.len(), 39, "the commands written:\n{actual}");
    assert_eq!(
        (direct, replica_set_start, api_start, overload_start),
        (7, 7, 27, 35)
    );
    let primary_preferred = doc! { "mode": "primaryPreferred" };
    let mode = |mode: &str| doc! { "mode": mode };
    // WP-6: only the w:0 insert (11) has a flag: `moreToCome`, and only it.
    for (i, s) in all.iter().enumerate() {
        let flags = if i == 11 {
            MsgFlags::MORE_TO_COME
        } else {
            MsgFlags::NONE
        };
        assert_eq!(s.flags, flags, "WP-6: {}", s.body);
    }

    // SS-8: directly to a secondary, a primary read says `primaryPreferred` (the secondary
    // refuses it otherwise); a secondary read its own preference, tags included, after the
    // command's fields; a run-command (SS-10: primary) like a primary read.
    assert_fields(&all[0], "find", "test", &["$readPreference", "$db", "lsid"]);
    assert_eq!(preference(&all[0]), Some(&primary_preferred));
    let gossiped_read = ["$clusterTime", "$readPreference", "$db", "lsid"];
    assert_fields(&all[1], "find", "test", &gossiped_read);
    let tagged = doc! { "mode": "secondary", "tags": [{ "dc": "ny" }] };
    assert_eq!(preference(&all[1]), Some(&tagged));
    assert_fields(&all[2], "listDatabases", "admin", &gossiped_read);
    assert_eq!(preference(&all[2]), Some(&primary_preferred));
    // SS-8: directly to a standalone, no `$readPreference` whatever the mode; RW-2: a retryable
    // write without `txnNumber` (a standalone is not eligible), still in a session (SE-13); a
    // standalone has no cluster time to gossip.
    assert_fields(&all[3], "find", "test", &["$db", "lsid"]);
    assert_fields(&all[4], "insert", "test", &["$db", "lsid"]);
    // SS-8, SS-9: directly to a mongos, primary says nothing, another mode is passed through.
    assert_fields(&all[5], "find", "test", &["$db", "lsid"]);
    assert_fields(&all[6], "find", "test", &["$readPreference", "$db", "lsid"]);
    assert_eq!(preference(&all[6]), Some(&mode("nearest")));

    // SS-3, SS-9 in a replica set: a secondary read to the secondary with its mode; a primary
    // read to the primary without one; `primaryPreferred` to the primary, with its mode; SS-7:
    // every write and transaction command to the primary, without one.
    let rs = &all[replica_set_start..api_start];
    let mut expected_hosts = vec!["a"; rs.len()];
    expected_hosts[0] = "b";
    assert_eq!(
        rs_hosts, expected_hosts,
        "SS-3, SS-7: where each command went"
    );
    assert_fields(&rs[0], "find", "test", &["$readPreference", "$db", "lsid"]);
    assert_eq!(preference(&rs[0]), Some(&mode("secondary")));
    assert_fields(&rs[1], "find", "test", &["$clusterTime", "$db", "lsid"]);
    assert_fields(&rs[2], "find", "test", &gossiped_read);
    assert_eq!(preference(&rs[2]), Some(&primary_preferred));
    let write = ["txnNumber", "$clusterTime", "$db", "lsid"];
    assert_fields(&rs[3], "insert", "test", &write);
    assert_eq!(txn_number(&rs[3]), 1);
    // WP-6, SE-13, RW-4: the w:0 insert, with `moreToCome` (above), without `lsid` or
    // `txnNumber`; the explicit session's w:0 insert was refused, so nothing of it was sent.
    let unacknowledged = ["writeConcern", "$clusterTime", "$db"];
    assert_fields(&rs[4], "insert", "test", &unacknowledged);
    assert_eq!(
        rs[4].body.get_document("writeConcern").ok(),
        Some(&doc! { "w": 0 })
    );
    // SE-21: the explicit session's first read waits for nothing; its insert after it waits
    // for the read's `operationTime` (DRIVERS-3274: insert takes `afterClusterTime`); its
    // run-command does not (never on a generic command). RW-6: the pooled server session keeps
    // its number (2).
    let session_lsid = lsid(&rs[5]);
    assert_fields(&rs[5], "find", "test", &["$clusterTime", "$db", "lsid"]);
    let causal_write = ["txnNumber", "readConcern", "$clusterTime", "$db", "lsid"];
    assert_fields(&rs[6], "insert", "test", &causal_write);
    let after = doc! { "afterClusterTime": gossiped_time() };
    assert_eq!(rs[6].body.get_document("readConcern").ok(), Some(&after));
    assert_eq!(txn_number(&rs[6]), 2);
    assert_fields(&rs[7], "ping", "admin", &["$clusterTime", "$db", "lsid"]);
    // TX-1: the first statement: `readConcern` (the transaction's level, and SE-21's
    // `afterClusterTime`), `startTransaction`, a new number (3), no `writeConcern`.
    let first = [
        "readConcern",
        "txnNumber",
        "autocommit",
        "$clusterTime",
        "startTransaction",
        "$db",
        "lsid",
    ];
    assert_fields(&rs[8], "insert", "test", &first);
    let majority_after = doc! { "level": "majority", "afterClusterTime": gossiped_time() };
    assert_eq!(
        rs[8].body.get_document("readConcern").ok(),
        Some(&majority_after)
    );
    assert_eq!(
        rs[8].body.get("startTransaction"),
        Some(&Bson::Boolean(true))
    );
    // TX-1: the second statement: no `startTransaction`, `readConcern` or `writeConcern` (its
    // inherited one dropped); a read and its cursor's `getMore` likewise (no `$readPreference`:
    // the transaction reads from the primary), the getMore in the cursor's session (SE-14).
    let statement = ["txnNumber", "autocommit", "$clusterTime", "$db", "lsid"];
    assert_fields(&rs[9], "insert", "test", &statement);
    assert_fields(&rs[10], "find", "test", &statement);
    assert_fields(&rs[11], "getMore", "test", &statement);
    assert_transaction(&rs[8..12]);
    assert_eq!(txn_number(&rs[8]), 3);
    // TX-1, TX-11: the transaction's `writeConcern` on its commit and on the next one's
    // abort; CS-4: `maxTimeMS` = the 5 s given (no time passed, minimum RTT 0) on both (TO-8:
    // the commit's 30 s `maxCommitTimeMS` ignored; TO-6: never on abort).
    let end = [
        "writeConcern",
        "txnNumber",
        "autocommit",
        "$clusterTime",
        "maxTimeMS",
        "$db",
        "lsid",
    ];
    let majority = doc! { "w": "majority" };
    assert_fields(&rs[12], "commitTransaction", "admin", &end);
    assert_transaction(&rs[8..13]);
    assert_fields(&rs[13], "insert", "test", &first);
    assert_fields(&rs[14], "abortTransaction", "admin", &end);
    assert_transaction(&rs[13..15]);
    assert_eq!(txn_number(&rs[13]), 4);
    for end in [&rs[12], &rs[14]] {
        assert_eq!(end.body.get_document("writeConcern").ok(), Some(&majority));
        assert_eq!(max_time(end), Some(5_000), "CS-4: {}", end.body);
    }
    assert!(rs[5..15].iter().all(|s| lsid(s) == session_lsid), "SE-7");
    // CS-4: `killCursors` under `timeoutMS` carries `maxTimeMS`, in its cursor's implicit
    // session (SE-14); TO-7: a read with `timeoutMS=0` none.
    assert_fields(&rs[15], "find", "test", &["$clusterTime", "$db", "lsid"]);
    let kill = ["$clusterTime", "maxTimeMS", "$db", "lsid"];
    assert_fields(&rs[16], "killCursors", "test", &kill);
    assert_eq!(max_time(&rs[16]), Some(5_000));
    assert_eq!(lsid(&rs[16]), lsid(&rs[15]));
    assert_ne!(
        lsid(&rs[15]),
        session_lsid,
        "SE-9: the explicit session's is not shared"
    );
    assert_fields(&rs[17], "find", "test", &["$clusterTime", "$db", "lsid"]);
    // Review37 W2 (RW-2, RW-4, SE-13, WP-5): the caller's `$db`, `lsid` and `txnNumber` are
    // not sent: the request's database and the engine's session, no number on a read.
    assert_fields(&rs[18], "find", "test", &["$clusterTime", "$db", "lsid"]);
    assert_ne!(lsid(&rs[18]), &doc! { "id": 1 });
    // SE-15: `endSessions` on `admin` naming both server sessions, without an `lsid` of its
    // own, `primaryPreferred` (SS-3: sent to a replica set).
    let end_sessions = ["$clusterTime", "$readPreference", "$db"];
    assert_fields(&rs[19], "endSessions", "admin", &end_sessions);
    assert_eq!(preference(&rs[19]), Some(&primary_preferred));
    let ended = rs[19].body.get_array("endSessions").expect("SE-15: lsids");
    let both = [
        Bson::Document(session_lsid.clone()),
        Bson::Document(lsid(&rs[15]).clone()),
    ];
    assert_eq!(ended.as_slice(), both.as_slice(), "SE-15");

    // Versioned API: every command carries the declared version, `getMore`, `killCursors`, a
    // transaction's commands (commit and abort included) and `endSessions` too.
    let api = &all[api_start..overload_start];
    for s in api {
        assert_api(s);
    }
    assert_fields(&api[0], "find", "test", &["$db", "lsid"]);
    assert_fields(&api[1], "getMore", "test", &["$db", "lsid"]);
    assert_fields(&api[2], "killCursors", "test", &["$db", "lsid"]);
    let first = ["txnNumber", "autocommit", "startTransaction", "$db", "lsid"];
    let end = ["txnNumber", "autocommit", "recoveryToken", "$db", "lsid"];
    assert_fields(&api[3], "insert", "test", &first);
    assert_fields(&api[4], "commitTransaction", "admin", &end);
    assert_fields(&api[5], "insert", "test", &first);
    assert_fields(&api[6], "abortTransaction", "admin", &end);
    assert_transaction(&api[3..5]);
    assert_transaction(&api[5..7]);
    // SE-15, SS-9: to a mongos, `primaryPreferred` is passed through.
    assert_fields(&api[7], "endSessions", "admin", &["$readPreference", "$db"]);
    assert_eq!(preference(&api[7]), Some(&primary_preferred));
    assert_eq!(api.len(), 8, "API: the commands written");

    // TX-11, TX-12: the commit retried after an overload error keeps the write concern of the
    // attempt before (the backpressure exception); once an attempt failed with another error
    // (a retryable write error, TX-10), the retry says `w: "majority"` with `wtimeout: 10000`.
    // All three with the transaction's number and `autocommit: false`, none `startTransaction`.
    let overload = &all[overload_start..];
    let first = ["txnNumber", "autocommit", "startTransaction", "$db", "lsid"];
    assert_fields(&overload[0], "insert", "test", &first);
    // TX-6: each with the token of the insert's reply (failed replies leave it); TO-6: without
    // `timeoutMS`, each with the transaction's `maxCommitTimeMS` as `maxTimeMS`.
    let commit = [
        "writeConcern",
        "maxTimeMS",
        "txnNumber",
        "autocommit",
        "recoveryToken",
        "$db",
        "lsid",
    ];
    for s in &overload[1..] {
        assert_fields(s, "commitTransaction", "admin", &commit);
        let token = s.body.get_document("recoveryToken").ok();
        assert_eq!(token, Some(&doc! { "token": 1 }), "TX-6");
        assert_eq!(max_time(s), Some(2_000), "TO-6: {}", s.body);
    }
    assert_eq!(overload.len(), 4, "the insert and three commit attempts");
    assert_transaction(overload);
    let given = doc! { "w": 1 };
    let majority = doc! { "w": "majority", "wtimeout": 10_000_i64 };
    let concerns: Vec<_> = overload[1..]
        .iter()
        .map(|s| s.body.get_document("writeConcern").ok())
        .collect();
    assert_eq!(
        concerns,
        [Some(&given), Some(&given), Some(&majority)],
        "TX-11"
    );
    assert_cluster_times(&all);

    // Last, so that a deliberate re-recording checks the rules first.
    check_golden("command_bytes_topologies.hex", EXPECTED_TOPOLOGIES, &actual);
}

/// TO-13, CS-4 (review37 W14; the CSOT spec's tailable awaitData cursors: the getMore's
/// `maxTimeMS` is `min(maxAwaitTimeMS, remaining timeoutMS − minRoundTripTime)`): a `getMore`
/// carrying its own `maxTimeMS` (an awaitData cursor's `maxAwaitTimeMS`) under `timeoutMS`
/// sends the smaller of the two (the harness's minimum RTT is 0); without CSOT, or with
/// `timeoutMS=0` (TO-7), its own as given; without its own, none (TO-13). A getMore whose
/// deadline has passed is not sent: a timeout error.
#[test]
fn review37_w14_an_await_data_get_more_takes_the_smaller_of_its_max_time_and_the_time_left() {
    let mut net = Net::new(
        topology_options(&["m"], false, false, false),
        server(true, false),
    );
    let mut ops = vec![run(&mut net, opening_find())];
    succeeded(&net, &mut ops);
    let cursor = opened(&net);
    let ms = Duration::from_millis;
    let cases = [
        (
            Some(Bson::Int32(10_000)),
            Some(ms(500)),
            Some(Bson::Int32(500)),
        ),
        (
            Some(Bson::Int64(100)),
            Some(ms(5_000)),
            Some(Bson::Int32(100)),
        ),
        (Some(Bson::Int32(10_000)), None, Some(Bson::Int32(10_000))),
        (
            Some(Bson::Int64(10_000)),
            Some(Duration::ZERO),
            Some(Bson::Int64(10_000)),
        ),
        (None, Some(ms(500)), None),
    ];
    for (given, timeout, _) in &cases {
        let mut more = get_more(cursor);
        if let Some(given) = given {
            more.command.insert("maxTimeMS", given.clone());
        }
        if let Some(timeout) = timeout {
            more.timeout = OperationTimeout::from_timeout_ms(net.now, *timeout);
        }
        ops.push(run(&mut net, more));
    }
    succeeded(&net, &mut ops);
    let sent = sent(&net);
    assert_eq!(sent.len(), 1 + cases.len(), "the find and its getMores");
    for ((given, timeout, expected), s) in cases.iter().zip(&sent[1..]) {
        assert_fields(s, "getMore", "test", &ruled_get_more(expected.is_some()));
        let what = format!("given {given:?} under {timeout:?}: {}", s.body);
        assert_eq!(
            s.body.get("maxTimeMS"),
            expected.as_ref(),
            "TO-13, CS-4: {what}"
        );
    }

    // CS-4: no time left: not sent, a timeout error.
    let mut late = get_more(cursor);
    late.command.insert("maxTimeMS", 100);
    late.timeout = OperationTimeout::Until(net.now);
    let op = run(&mut net, late);
    let results = net.finished(op);
    assert_eq!(results.len(), 1, "finished exactly once");
    let timed_out = matches!(&results[0], Err(e) if matches!(e.kind, ErrorKind::Timeout { .. }));
    assert!(timed_out, "CS-4: {:?}", results[0]);
    assert_eq!(
        net.sent
            .iter()
            .filter(|(_, b)| b.contains_key("getMore"))
            .count(),
        cases.len()
    );
}

/// The [`RULED`] fields of a getMore in an implicit session on a mongos that does not gossip:
/// `maxTimeMS` (when `with_max_time`), written where the command has it or where the engine
/// appends it, then `$db` and `lsid`.
fn ruled_get_more(with_max_time: bool) -> Vec<&'static str> {
    let mut fields = vec!["$db", "lsid"];
    if with_max_time {
        fields.insert(0, "maxTimeMS");
    }
    fields
}
