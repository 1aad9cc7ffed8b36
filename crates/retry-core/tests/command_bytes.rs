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
//! decoded and checked against the rules. Besides the bytes, each test decodes every command
//! and asserts the fields the rules govern, with their IDs, so that the tests state the rules
//! and not only the bytes.

mod support;

use std::time::Duration;

use bson::{doc, spec::BinarySubtype, Binary, Bson, Document, Timestamp};
use retry_core::engine::{EngineOptions, OpId, OperationRequest};
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::OperationTimeout;
use retry_core::topology::{TagSet, TopologySettings};
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
    assert_eq!(actual, EXPECTED, "the commands' bytes changed");

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
    assert_eq!(actual, EXPECTED_MORE, "the commands' bytes changed");

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
    assert_eq!(actual, EXPECTED_PREFERENCE, "the commands' bytes changed");

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
}
