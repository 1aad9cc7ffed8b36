//! WP-6, EV-4, RW-4, SE-13: an unacknowledged write (`writeConcern: {w: 0}`) driven through the
//! engine. It is written with `moreToCome` (OP_MSG flag bit 1) and no reply is awaited: the
//! operation ends, once, with `{ok: 1}`, when the caller takes its bytes
//! (`Engine::poll_transmit`); its `CommandSucceeded` carries `{ok: 1}` (no `n`) and its
//! connection is checked in, ready for the next command. A socket that fails before the bytes
//! were taken fails the operation (nothing was sent); one that fails after leaves its result
//! alone. A sharded cluster of one mongos with sessions, on the shared harness ([`Net`]): the
//! script answers every command but an unacknowledged one, as a server does.

mod support;

use bson::{doc, rawdoc, Bson, Document};
use retry_core::engine::{
    CommandEvent, ConnId, EngineEvent, EngineOptions, OpId, OperationRequest,
};
use retry_core::error::{ErrorKind, NetworkErrorKind, NetworkPhase};
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::pool::PoolEvent;
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::topology::TopologySettings;
use retry_core::wire::{FrameDecoder, MsgFlags, DEFAULT_MAX_MESSAGE_SIZE_BYTES};
use std::time::Duration;
use support::net::{address, is_hello, Net};

/// `socketTimeoutMS`: the deadline of a command waiting for its reply, shorter than any other
/// timer of the engine.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(1);

/// A command with an unacknowledged write concern.
fn unacknowledged(body: &Document) -> bool {
    body.get_document("writeConcern")
        .is_ok_and(|w| matches!(w.get("w"), Some(Bson::Int32(0))))
}

/// A mongos that supports sessions; it answers every command but an unacknowledged write (which
/// it never answers, as a server does for `moreToCome`).
fn net() -> Net {
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("engine-unacknowledged", "0.1.0");
    let settings = TopologySettings::new(vec![address("m")]);
    let mut options = EngineOptions::new(settings, handshake);
    options.command_monitoring = true;
    // An awaited reply has a deadline of `SOCKET_TIMEOUT` (TO-3): none is set for a w:0 write.
    options.socket_timeout = Some(SOCKET_TIMEOUT);
    let script = Box::new(|_: &_, body: &Document| {
        if is_hello(body) {
            return Some(
                doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true, "msg": "isdbgrid",
                "maxWireVersion": 25, "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30 },
            );
        }
        (!unacknowledged(body)).then(|| doc! { "ok": 1, "n": 1 })
    });
    Net::new(options, script)
}

/// An insert of one document with `write_concern`; a retryable write by its kind, so that only
/// RW-4 keeps a `txnNumber` off the unacknowledged one.
fn insert(write_concern: Option<Document>) -> OperationRequest {
    let mut command = doc! { "insert": "c", "documents": [{ "_id": 1 }] };
    if let Some(write_concern) = write_concern {
        command.insert("writeConcern", write_concern);
    }
    OperationRequest::new(
        "test",
        command,
        OperationKind::RetryableWrite,
        SelectionCriteria::Write,
    )
}

fn ping() -> OperationRequest {
    let primary =
        ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).expect("valid");
    OperationRequest::new(
        "admin",
        doc! { "ping": 1 },
        OperationKind::Read,
        SelectionCriteria::Read(primary),
    )
}

/// Every message written on `net`'s sockets whose command is named `name`: its connection, its
/// flag bits as on the wire (bytes 16..20) and its body.
fn written(net: &Net, name: &str) -> Vec<(ConnId, u32, Document)> {
    let mut out = Vec::new();
    let mut decoders = std::collections::BTreeMap::new();
    for (_, conn, bytes) in &net.transmits {
        let decoder = decoders
            .entry(*conn)
            .or_insert_with(|| FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES));
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let (used, message) = decoder.decode(rest).expect("valid OP_MSG");
            let frame = &rest[..used];
            rest = &rest[used..];
            let Some(message) = message else { continue };
            if message.body.keys().next().map(String::as_str) == Some(name) {
                let flags = u32::from_le_bytes(frame[16..20].try_into().expect("a header"));
                assert_eq!(
                    flags,
                    message.flags.bits(),
                    "the decoder reads the flag bits"
                );
                out.push((*conn, flags, message.body));
            }
        }
    }
    out
}

/// The positions of `op`'s command events: started, succeeded, failed (each a list).
fn command_events(net: &Net, op: OpId) -> [Vec<(usize, &CommandEvent)>; 3] {
    let mut out = [Vec::new(), Vec::new(), Vec::new()];
    for (i, event) in net.events.iter().enumerate() {
        let EngineEvent::Command(event) = event else {
            continue;
        };
        let (info, list) = match &**event {
            CommandEvent::Started { info, .. } => (info, 0),
            CommandEvent::Succeeded { info, .. } => (info, 1),
            CommandEvent::Failed { info, .. } => (info, 2),
            _ => continue,
        };
        if info.operation_id == op {
            out[list].push((i, &**event));
        }
    }
    out
}

/// The position of the first pool event after `from` matching `f`.
fn pool_event(net: &Net, from: usize, f: impl Fn(&PoolEvent) -> bool) -> usize {
    from + net.events[from..]
        .iter()
        .position(|e| matches!(e, EngineEvent::Pool { event, .. } if f(event)))
        .expect("the pool event")
}

/// `op`'s `OperationFinished` position.
fn finished_at(net: &Net, op: OpId) -> usize {
    net.position(|e| matches!(e, EngineEvent::OperationFinished { op: o, .. } if *o == op))
}

/// WP-6, EV-4, RW-4, SE-13: the w:0 insert goes out with `moreToCome` (flag bit 1 alone) and
/// no `lsid` or `txnNumber`, its write concern in the published command; with no reply fed, it
/// ends exactly once with `{ok: 1}` (no `n`), as does its `CommandSucceeded`; the events come
/// in causal order (checked out, started, succeeded, checked in, finished); and the connection
/// is reused, ready, by the next acknowledged insert, which has a session, a `txnNumber`, no
/// `moreToCome`, and waits for its reply as before.
#[test]
fn wp6_ev4_an_unacknowledged_write_ends_once_with_ok_1_when_its_bytes_are_taken() {
    let mut net = net();
    let op = net.start(insert(Some(doc! { "w": 0 })));
    let results = net.finished(op);
    assert_eq!(results.len(), 1, "exactly once: {results:?}");
    let reply = results[0].as_ref().expect("a success");
    assert_eq!(
        reply.as_bytes(),
        rawdoc! { "ok": 1 }.as_bytes(),
        "EV-4: no n"
    );
    // WP-6: on the wire, flag bit 1 alone; the script left it unanswered and nothing was fed.
    let inserts = written(&net, "insert");
    assert_eq!(inserts.len(), 1);
    let (conn, flags, body) = &inserts[0];
    assert_eq!(*flags, MsgFlags::MORE_TO_COME.bits());
    assert_eq!(*flags, 1 << 1);
    assert_eq!(net.unanswered.len(), 1, "no reply was awaited, none came");
    // RW-4, SE-13: no session and no transaction number on a w:0 write.
    assert!(!body.contains_key("txnNumber"), "RW-4: {body}");
    assert!(!body.contains_key("lsid"), "SE-13: {body}");
    assert_eq!(
        body.get_document("writeConcern").ok(),
        Some(&doc! { "w": 0 })
    );
    // EV-4, EV-2: started with the write concern, succeeded with `{ok: 1}`, both once.
    let [started, succeeded, failed] = command_events(&net, op);
    assert_eq!((started.len(), succeeded.len(), failed.len()), (1, 1, 0));
    let CommandEvent::Started { command, info } = started[0].1 else {
        unreachable!()
    };
    assert_eq!(
        command.get_document("writeConcern").ok(),
        Some(&doc! { "w": 0 })
    );
    assert_eq!(info.connection, *conn);
    let CommandEvent::Succeeded {
        reply,
        info: succeeded_info,
        ..
    } = succeeded[0].1
    else {
        unreachable!()
    };
    assert_eq!(reply, &doc! { "ok": 1 });
    assert_eq!(succeeded_info.request_id, info.request_id);
    // BP-26, BP-27: checked out, started, succeeded, checked in, finished.
    let checked_out = net.position(|e| {
        matches!(e, EngineEvent::Pool { event: PoolEvent::CheckedOut { connection, .. }, .. }
            if connection.0 == info.driver_connection_id)
    });
    let checked_in = pool_event(
        &net,
        succeeded[0].0,
        |e| matches!(e, PoolEvent::CheckedIn { connection } if connection.0 == info.driver_connection_id),
    );
    let done = finished_at(&net, op);
    assert!(
        checked_out < started[0].0 && started[0].0 < succeeded[0].0,
        "{:?}",
        net.events
    );
    assert!(succeeded[0].0 < checked_in && checked_in < done);
    // No reply awaited: no socket deadline (TO-3) was set for one.
    let socket_deadline = net.now.saturating_add(SOCKET_TIMEOUT);
    assert!(
        net.engine
            .poll_timeout()
            .is_none_or(|t| t > socket_deadline),
        "{:?}",
        net.engine.poll_timeout()
    );

    // The same connection, ready: an acknowledged insert goes out on it and waits for its reply.
    let acknowledged = net.start(insert(None));
    assert_eq!(net.finished(acknowledged).len(), 1);
    let reply = net.finished(acknowledged)[0].as_ref().expect("a success");
    assert_eq!(reply.as_bytes(), rawdoc! { "ok": 1, "n": 1 }.as_bytes());
    let inserts = written(&net, "insert");
    assert_eq!(inserts.len(), 2);
    let (second_conn, second_flags, second) = &inserts[1];
    assert_eq!(
        second_conn, conn,
        "the connection was checked in and reused"
    );
    assert_eq!(*second_flags, 0, "WP-6: moreToCome only on w:0 writes");
    assert!(second.contains_key("lsid") && second.contains_key("txnNumber"));
    let created = net
        .events
        .iter()
        .filter(|e| {
            matches!(
                e,
                EngineEvent::Pool {
                    event: PoolEvent::ConnectionCreated { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(created, 1, "one pooled connection served both");
}

/// WP-6 (issue 9 path): an encoded command (`OperationRequest::new_raw`) with `w: 0` is sent
/// with `moreToCome` too and ends with `{ok: 1}`; a `w: 0` with `j: true` is acknowledged.
#[test]
fn wp6_an_encoded_unacknowledged_write_is_sent_with_more_to_come() {
    let mut net = net();
    let raw = rawdoc! { "insert": "c", "documents": [{ "_id": 2 }], "writeConcern": { "w": 0 } };
    let op = net.start(OperationRequest::new_raw(
        "test",
        raw,
        OperationKind::RetryableWrite,
        SelectionCriteria::Write,
    ));
    let results = net.finished(op);
    assert_eq!(results.len(), 1);
    let reply = results[0].as_ref().expect("a success");
    assert_eq!(reply.as_bytes(), rawdoc! { "ok": 1 }.as_bytes());
    let inserts = written(&net, "insert");
    assert_eq!(inserts[0].1, MsgFlags::MORE_TO_COME.bits());
    assert!(!inserts[0].2.contains_key("txnNumber"), "RW-4");
    // `j: true` makes `w: 0` acknowledged (RW-4's reading): an ordinary round trip.
    let journaled = net.start(insert(Some(doc! { "w": 0, "j": true })));
    // The script leaves every `w: 0` unanswered: this one waits for its reply, under the
    // socket timeout (the control of the first test's deadline check).
    assert!(net.finished(journaled).is_empty(), "it awaits a reply");
    assert_eq!(
        net.engine.poll_timeout(),
        Some(net.now.saturating_add(SOCKET_TIMEOUT))
    );
    let inserts = written(&net, "insert");
    assert_eq!(inserts[1].1, 0);
    assert!(inserts[1].2.contains_key("txnNumber"));
    let (conn, request_id) = *net.unanswered.last().expect("in flight");
    net.reply_to(conn, request_id, doc! { "ok": 1, "n": 1 });
    assert_eq!(net.finished(journaled).len(), 1);
}

/// Starts `request` without draining, so that its bytes wait in the engine; returns the
/// operation and the pooled connection its command was written on (the one a warm-up ping used).
fn start_undrained(net: &mut Net, request: OperationRequest) -> (OpId, ConnId) {
    let warm = net.start(ping());
    assert_eq!(net.finished(warm).len(), 1);
    let conn = written(net, "ping").last().expect("the ping").0;
    let op = net.engine.start_operation(request, net.now);
    (op, conn)
}

/// WP-6: the socket fails before the caller took the w:0 write's bytes: they are dropped unsent,
/// and the operation ends once with a network error before sending (no retry, RW-4), its
/// command failed (EV-1), no success; the connection is closed and a later w:0 write goes out on
/// a new one.
#[test]
fn wp6_a_socket_failing_before_the_bytes_were_taken_fails_the_unacknowledged_write() {
    let mut net = net();
    let (op, conn) = start_undrained(&mut net, insert(Some(doc! { "w": 0 })));
    assert!(net.finished(op).is_empty(), "not ended before the hand-off");
    net.engine
        .handle_closed(conn, NetworkErrorKind::Reset, None, net.now);
    net.drain();
    assert!(written(&net, "insert").is_empty(), "nothing was written");
    let results = net.finished(op);
    assert_eq!(results.len(), 1, "exactly once: {results:?}");
    let error = results[0].as_ref().expect_err("a failure");
    let ErrorKind::Network(network) = &error.kind else {
        panic!("a network error: {error}");
    };
    assert_eq!(network.phase, NetworkPhase::BeforeSend);
    let [started, succeeded, failed] = command_events(&net, op);
    assert_eq!((started.len(), succeeded.len(), failed.len()), (1, 0, 1));
    assert!(!net.sockets.contains_key(&conn), "closed");
    // The server is rediscovered; the next w:0 write goes out on a new connection.
    let limit = net.now.saturating_add(Duration::from_secs(60));
    net.run_until(limit);
    let next = net.start(insert(Some(doc! { "w": 0 })));
    assert_eq!(net.finished(next).len(), 1);
    assert!(net.finished(next)[0].is_ok());
    let inserts = written(&net, "insert");
    assert_eq!(inserts.len(), 1);
    assert_ne!(inserts[0].0, conn);
    assert_eq!(inserts[0].1, MsgFlags::MORE_TO_COME.bits());
}

/// WP-6: once the bytes were taken the operation is over: a socket failing afterwards closes
/// an idle pooled connection and leaves the result (`{ok: 1}`) and the events alone.
#[test]
fn wp6_a_socket_failing_after_the_hand_off_leaves_the_result_alone() {
    let mut net = net();
    let op = net.start(insert(Some(doc! { "w": 0 })));
    assert_eq!(net.finished(op).len(), 1);
    let conn = written(&net, "insert")[0].0;
    let events = net.events.len();
    net.engine
        .handle_closed(conn, NetworkErrorKind::Reset, None, net.now);
    net.drain();
    assert_eq!(net.finished(op).len(), 1, "still exactly once");
    assert!(net.finished(op)[0].is_ok());
    let [_, succeeded, failed] = command_events(&net, op);
    assert_eq!((succeeded.len(), failed.len()), (1, 0));
    assert!(net.events[events..].iter().all(|e| !matches!(
        e,
        EngineEvent::Command(_) | EngineEvent::OperationFinished { .. }
    )));
}

/// WP-6, house rule 8: a w:0 write cancelled before its bytes were taken ends once, cancelled;
/// its bytes are never written (its connection is closed under it, as for any command in
/// flight).
#[test]
fn wp6_an_unacknowledged_write_cancelled_before_the_hand_off_is_never_written() {
    let mut net = net();
    let (op, conn) = start_undrained(&mut net, insert(Some(doc! { "w": 0 })));
    net.engine.cancel_operation(op, net.now);
    net.drain();
    let results = net.finished(op);
    assert_eq!(results.len(), 1);
    let error = results[0].as_ref().expect_err("cancelled");
    assert!(matches!(error.kind, ErrorKind::Cancelled), "{error}");
    assert!(written(&net, "insert").is_empty());
    assert!(!net.sockets.contains_key(&conn), "closed");
    let [started, succeeded, failed] = command_events(&net, op);
    assert_eq!((started.len(), succeeded.len(), failed.len()), (1, 0, 1));
}

/// WP-6 (review39 M9): `moreToCome` is for unacknowledged writes only (`insert`, `update`,
/// `delete` run as writes). A `findAndModify` with `w: 0`, or an `insert` with `w: 0` run as a
/// generic command, is sent as an ordinary request, awaits its reply and ends with the server's
/// reply, not a made-up `{ok: 1}`.
#[test]
fn wp6_only_unacknowledged_writes_are_sent_with_more_to_come() {
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("engine-unacknowledged", "0.1.0");
    let mut options = EngineOptions::new(TopologySettings::new(vec![address("m")]), handshake);
    options.socket_timeout = Some(SOCKET_TIMEOUT);
    // This server answers everything: nothing below is sent with `moreToCome`.
    let script = Box::new(|_: &_, body: &Document| {
        Some(if is_hello(body) {
            doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true, "msg": "isdbgrid",
            "maxWireVersion": 25, "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30 }
        } else {
            doc! { "ok": 1, "n": 1, "value": Bson::Null }
        })
    });
    let mut net = Net::new(options, script);
    let find_and_modify = OperationRequest::new(
        "test",
        doc! { "findAndModify": "c", "query": {}, "remove": true, "writeConcern": { "w": 0 } },
        OperationKind::RetryableWrite,
        SelectionCriteria::Write,
    );
    let mut run_command = insert(Some(doc! { "w": 0 }));
    run_command.kind = OperationKind::RunCommand;
    for (request, name) in [(find_and_modify, "findAndModify"), (run_command, "insert")] {
        let op = net.start(request);
        let results = net.finished(op);
        assert_eq!(results.len(), 1, "{name}: exactly once: {results:?}");
        let reply = results[0].as_ref().expect("a success");
        assert_eq!(
            reply.as_bytes(),
            rawdoc! { "ok": 1, "n": 1, "value": bson::RawBson::Null }.as_bytes(),
            "{name}: the server's reply"
        );
        let sent = written(&net, name);
        assert_eq!(sent.len(), 1, "{name}");
        assert_eq!(sent[0].1, 0, "{name}: no moreToCome");
    }
    assert!(net.unanswered.is_empty(), "every request was answered");
}

/// WP-6, review39 M3: `Close::write_out` tells the caller whether to write out the bytes it
/// already took before closing: not for a socket closed under a cancelled command (its unwritten
/// rest must not reach the server), but for a healthy connection let go (here at
/// `Engine::close`, after the endSessions).
#[test]
fn wp6_m3_only_a_healthy_close_writes_out_what_was_taken() {
    // This server never answers an insert: the acknowledged one stays in flight.
    let script = Box::new(|_: &_, body: &Document| {
        if is_hello(body) {
            return Some(
                doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true, "msg": "isdbgrid",
                "maxWireVersion": 25, "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30 },
            );
        }
        (!body.contains_key("insert")).then(|| doc! { "ok": 1 })
    });
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("engine-unacknowledged", "0.1.0");
    let options = EngineOptions::new(TopologySettings::new(vec![address("m")]), handshake);
    let mut net = Net::new(options, script);
    let op = net.start(insert(None));
    let (conn, _) = *net
        .unanswered
        .last()
        .expect("the insert waits for its reply");
    net.engine.cancel_operation(op, net.now);
    net.drain();
    let cancelled: Vec<_> = net.closes.iter().filter(|c| c.conn == conn).collect();
    assert_eq!(cancelled.len(), 1, "closed once: {:?}", net.closes);
    assert!(!cancelled[0].write_out, "closed under a cancelled command");
    // A healthy pooled connection, then the engine's close lets it go.
    let ping = net.start(ping());
    assert_eq!(net.finished(ping).len(), 1);
    let pooled = net
        .sent
        .iter()
        .rev()
        .find(|(_, body)| body.contains_key("ping"))
        .map(|(conn, _)| *conn)
        .expect("the ping was sent");
    net.engine.close(net.now);
    net.drain();
    let let_go: Vec<_> = net.closes.iter().filter(|c| c.conn == pooled).collect();
    assert_eq!(let_go.len(), 1, "closed once: {:?}", net.closes);
    assert!(
        let_go[0].write_out,
        "a healthy connection let go (poolClosed)"
    );
}
