//! Every operation ends exactly once (issue 9 item 2, house rule 8), the engine's event order
//! (BP-27, item 3) and `Engine::close` (item 5), on a small in-memory network of scripted servers:
//! replies arrive at once, time moves only to the engine's next timer, every loop is bounded.

mod support;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::error::Error as _;
use std::rc::Rc;

use bson::{doc, oid::ObjectId, Document};
use retry_core::address::ServerAddress;
use retry_core::engine::{
    CommandEvent, ConnId, Engine, EngineError, EngineEvent, EngineOptions, EventFamilies, OpId,
    OperationRequest,
};
use retry_core::error::{ErrorKind, NetworkErrorKind};
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::monitor::HeartbeatEvent;
use retry_core::pool::PoolEvent;
use retry_core::retry::{OperationKind, RetryEvent};
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::Instant;
use retry_core::topology::{SdamEvent, ServerType, TopologySettings};
use retry_core::wire::{OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES};
use support::net::{address, is_hello, member_hello, Net, Script};

fn handshake() -> HandshakeOptions {
    let mut options = HandshakeOptions::new();
    options.metadata = ClientMetadata::new("engine-lifecycle", "0.1.0");
    options
}

fn read(mode: ReadPreferenceMode) -> OperationRequest {
    let preference = ReadPreference::new(mode, Vec::new(), None).expect("valid");
    OperationRequest::new(
        "test",
        doc! { "find": "c" },
        OperationKind::Read,
        SelectionCriteria::Read(preference),
    )
}

/// A mongos whose first command fails with an overload error (462, with both labels: BP-1,
/// BP-2) and whose later commands get `then`.
fn overloaded_once(then: Document) -> Script {
    let mut failures = 1;
    mongos_answering(move |_| {
        if failures > 0 {
            failures -= 1;
            return doc! { "ok": 0, "code": 462, "errmsg": "overloaded",
            "errorLabels": ["SystemOverloadedError", "RetryableError"] };
        }
        then.clone()
    })
}

/// A mongos that answers its hellos with [`mongos_hello`] and every other command with `answer`'s
/// reply for the address it reached.
fn mongos_answering(mut answer: impl FnMut(&ServerAddress) -> Document + 'static) -> Script {
    Box::new(move |address, body| {
        Some(if is_hello(body) {
            mongos_hello()
        } else {
            answer(address)
        })
    })
}

/// Members `a` and `b` of the replica set `rs`, with the settings to discover them: the hellos
/// list both until the returned switch is set, then `a` only (a reconfig that removes `b`);
/// every other command gets `answer`'s reply for the member it reached.
fn set_that_removes_b(
    answer: impl Fn(&ServerAddress) -> Option<Document> + 'static,
) -> (Rc<Cell<bool>>, Script, TopologySettings) {
    let removed = Rc::new(Cell::new(false));
    let gone = removed.clone();
    let script: Script = Box::new(move |address, body| {
        if is_hello(body) {
            let hosts: &[&str] = if gone.get() { &["a"] } else { &["a", "b"] };
            return Some(member_hello(address, hosts));
        }
        answer(address)
    });
    let mut settings = TopologySettings::new(vec![address("a"), address("b")]);
    settings.replica_set = Some("rs".into());
    (removed, script, settings)
}

fn mongos_hello() -> Document {
    doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true, "msg": "isdbgrid",
    "maxWireVersion": 25, "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30, "connectionId": 42 }
}

/// Item 2, SDAM: a reconfig removes the secondary `b` while a read is in flight on it. The read's
/// connection is closed under it; the network error goes through the retry rules (RR-2) and the
/// retry runs on the primary; the operation finishes exactly once.
#[test]
fn a_read_in_flight_on_a_member_the_reconfig_removes_finishes_once_by_its_retry() {
    // b never answers: the read stays in flight there.
    let (removed, script, settings) = set_that_removes_b(|address| {
        (address.host() == "a")
            .then(|| doc! { "ok": 1, "cursor": { "id": 0i64, "ns": "test.c", "firstBatch": [] } })
    });
    let mut net = Net::new(EngineOptions::new(settings, handshake()), script);
    let op = net.start(read(ReadPreferenceMode::SecondaryPreferred));
    let started_on_b = net.events.iter().any(|e| {
        matches!(e, EngineEvent::Operation { op: o, event: RetryEvent::CommandStarted { address, .. } }
            if *o == op && address.host() == "b")
    });
    assert!(started_on_b, "the read went to the secondary");
    assert!(net.finished(op).is_empty());
    // The next heartbeat of the primary no longer lists b.
    removed.set(true);
    net.run_until(Instant::from_millis(30_000));
    let results = net.finished(op);
    assert_eq!(results.len(), 1, "finished exactly once: {results:?}");
    assert!(results[0].is_ok(), "the retry on the primary succeeded");
    let closed_b = net.position(
        |e| matches!(e, EngineEvent::Topology(SdamEvent::ServerClosed { address }) if address.host() == "b"),
    );
    let retried_on_a = net.position(|e| {
        matches!(e, EngineEvent::Operation { op: o, event: RetryEvent::CommandStarted { address, attempt: 2, .. } }
            if *o == op && address.host() == "a")
    });
    assert!(closed_b < retried_on_a);
}

/// Item 2, CMAP CM-2: a reconfig removes `b` while one read is in flight on it and another waits
/// in its pool's queue. The closed pool fails the waiting checkout and the in-flight read's
/// connection is closed under it; both go through the retry rules and end exactly once.
#[test]
fn a_checkout_on_a_server_that_leaves_fails_and_the_operation_ends_once() {
    let (removed, script, mut settings) = set_that_removes_b(|_| None);
    // One connection per pool: the second read on b waits in b's queue.
    settings.pool.max_pool_size = 1;
    let mut net = Net::new(EngineOptions::new(settings, handshake()), script);
    let first = net.start(read(ReadPreferenceMode::Secondary));
    let second = net.start(read(ReadPreferenceMode::Secondary));
    assert!(net.finished(first).is_empty() && net.finished(second).is_empty());
    removed.set(true);
    net.run_until(Instant::from_millis(60_000));
    for op in [first, second] {
        let results = net.finished(op);
        assert_eq!(
            results.len(),
            1,
            "{op:?} finished exactly once: {results:?}"
        );
        // No secondary is left for a retry, so the network error of the closed connection (or,
        // for the read still queued, the closed pool's checkout error) is raised (RR-6).
        let error = results[0].as_ref().expect_err("no secondary left");
        assert!(
            matches!(
                error.kind,
                ErrorKind::Network(_) | ErrorKind::Checkout { .. } | ErrorKind::PoolCleared { .. }
            ),
            "{error:?}"
        );
    }
    assert!(net.engine.poll_timeout().is_some(), "monitoring goes on");
}

/// Item 5: a handshake that can never be built is refused when the engine is made, with the
/// cause as the error's source, instead of failing every checkout later.
#[test]
fn an_unbuildable_handshake_is_an_engine_error_with_its_cause() {
    let mut handshake = handshake();
    handshake.metadata = ClientMetadata::new("d".repeat(600), "0.1.0");
    let options = EngineOptions::new(TopologySettings::new(vec![address("a")]), handshake);
    let error = Engine::new(options, Instant::ZERO).expect_err("too large");
    assert!(matches!(error, EngineError::Handshake(_)), "{error:?}");
    assert!(error.source().is_some());
    assert!(!error.to_string().is_empty());
}

/// Review32 R23: a seed that cannot name a server (an empty host, port 0, a host holding its
/// own port) is refused when the engine is made, naming the address, rather than surfacing as
/// connect failures.
#[test]
fn r23_an_invalid_seed_is_an_engine_error() {
    for (seed, text) in [
        (
            ServerAddress::new("", 0),
            "invalid seed: invalid server address \":0\": empty host",
        ),
        (
            ServerAddress::new("host:27017", 27018),
            "invalid seed: invalid server address \"[host:27017]:27018\": the host holds a port: \
             give the host alone and the port separately",
        ),
    ] {
        let settings = TopologySettings::new(vec![address("a"), seed]);
        let options = EngineOptions::new(settings, handshake());
        let error = Engine::new(options, Instant::ZERO).expect_err("refused");
        assert!(matches!(error, EngineError::InvalidSeed(_)), "{error:?}");
        assert_eq!(error.to_string(), text);
        // Review35 Z5 (issue 9 item 5): the wrapped parse error is the source.
        let source = error.source().expect("the parse error");
        assert_eq!(format!("invalid seed: {source}"), text);
    }
}

/// HS-2, review9 finding 7: the engine encodes the handshake once and sockets that do not
/// authenticate copy the bytes. Nothing in the hello may depend on the socket: the first message
/// of the monitor's, the RTT monitor's and a pooled socket is, byte for byte, the command of
/// `HandshakeOptions::command()` encoded fresh as request 1 (so a per-socket field added later
/// fails here instead of being copied silently).
#[test]
fn hs2_monitor_rtt_and_pooled_sockets_send_the_handshake_encoded_fresh() {
    let mut options = handshake();
    options.metadata = options
        .metadata
        .with_application_name("hs2-app")
        .expect("a short name");
    let process = ObjectId::parse_str("7fffffff0000000000000002").expect("valid");
    let script: Script = Box::new(move |_, body| {
        if is_hello(body) {
            // The monitor's awaited (streaming) hello stays in flight.
            if body.contains_key("topologyVersion") {
                return None;
            }
            let mut reply = mongos_hello();
            reply.insert(
                "topologyVersion",
                doc! { "processId": process, "counter": 0_i64 },
            );
            return Some(reply);
        }
        Some(doc! { "ok": 1, "cursor": { "id": 0_i64, "ns": "test.c", "firstBatch": [] } })
    });
    let engine_options =
        EngineOptions::new(TopologySettings::new(vec![address("m")]), options.clone());
    let mut net = Net::new(engine_options, script);
    let op = net.start(read(ReadPreferenceMode::Primary));
    assert_eq!(net.finished(op).len(), 1);
    assert!(net.finished(op)[0].is_ok());

    let mut fresh = Vec::new();
    OpMsg::command(1, options.command().expect("a valid handshake"))
        .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut fresh)
        .expect("encodes");
    // Each connection's first transmit, and what it went on to send.
    let mut first: BTreeMap<ConnId, &[u8]> = BTreeMap::new();
    for (_, conn, bytes) in &net.transmits {
        first.entry(*conn).or_insert(bytes);
    }
    let pooled = net
        .sent
        .iter()
        .find(|(_, body)| body.contains_key("find"))
        .map(|(conn, _)| *conn)
        .expect("the find went out");
    let awaited = net
        .sent
        .iter()
        .find(|(_, body)| body.contains_key("topologyVersion"))
        .map(|(conn, _)| *conn)
        .expect("the monitor streams");
    assert_eq!(first.len(), 3, "monitor, RTT monitor and pool: {first:?}");
    assert_ne!(pooled, awaited);
    for (conn, bytes) in first {
        let socket = match conn {
            c if c == pooled => "pooled",
            c if c == awaited => "monitor",
            _ => "RTT",
        };
        assert_eq!(bytes, &fresh[..], "the {socket} socket's hello");
    }
}

/// BP-27 and item 3: the attempt's `CheckedIn` comes before its `RetryScheduled`, and the last
/// attempt's before `OperationFinished`.
#[test]
fn bp27_checked_in_comes_before_retry_scheduled_and_operation_finished() {
    let script = overloaded_once(doc! { "ok": 1 });
    let settings = TopologySettings::new(vec![address("m1")]);
    let mut net = Net::new(EngineOptions::new(settings, handshake()), script);
    let op = net.start(read(ReadPreferenceMode::Primary));
    net.run_until(Instant::from_millis(10_000));
    assert_eq!(net.finished(op).len(), 1);
    assert!(
        !net.events
            .iter()
            .any(|e| matches!(e, EngineEvent::Command(_))),
        "no command events unless asked for"
    );
    let sequence: Vec<&str> = net
        .events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Pool {
                event: PoolEvent::CheckedOut { .. },
                ..
            } => Some("out"),
            EngineEvent::Pool {
                event: PoolEvent::CheckedIn { .. },
                ..
            } => Some("in"),
            EngineEvent::Operation { event, .. } => Some(match event {
                RetryEvent::CommandStarted { .. } => "started",
                RetryEvent::CommandSucceeded { .. } => "succeeded",
                RetryEvent::CommandFailed { .. } => "failed",
                RetryEvent::RetryScheduled { .. } => "retry",
                RetryEvent::RetryDenied { .. } => "denied",
            }),
            EngineEvent::OperationFinished { .. } => Some("finished"),
            _ => None,
        })
        .collect();
    assert_eq!(
        sequence,
        [
            "out",
            "started",
            "failed",
            "in",
            "retry",
            "out",
            "started",
            "succeeded",
            "in",
            "finished"
        ]
    );
}

/// Item 5: `close` finishes every unfinished operation exactly once with `Cancelled`, whatever it
/// was doing (in flight, waiting in the pool's queue, waiting for a server), closes every socket,
/// publishes the closing SDAM events, and later operations end at once.
#[test]
fn close_fails_every_operation_once_and_publishes_the_closing_events() {
    let script: Script = Box::new(|_, body| is_hello(body).then(mongos_hello));
    let mut settings = TopologySettings::new(vec![address("m1")]);
    settings.pool.max_pool_size = 1;
    let mut net = Net::new(EngineOptions::new(settings, handshake()), script);
    let in_flight = net.start(read(ReadPreferenceMode::Primary));
    let queued = net.start(read(ReadPreferenceMode::Primary));
    // A secondary read on a sharded cluster waits for a suitable server.
    let mut waiting = read(ReadPreferenceMode::Primary);
    waiting.criteria = SelectionCriteria::Read(
        ReadPreference::new(ReadPreferenceMode::Secondary, Vec::new(), None).expect("valid"),
    );
    let waiting = net.start(waiting);
    let open_sockets = net.sockets.len();
    assert!(open_sockets >= 2, "a monitor and a pooled socket");
    net.engine.close(net.now);
    net.drain();
    for op in [in_flight, queued, waiting] {
        let results = net.finished(op);
        assert_eq!(results.len(), 1, "{op:?} finished exactly once");
        let error = results[0].as_ref().expect_err("cancelled");
        assert_eq!(error.kind, ErrorKind::Cancelled);
    }
    assert!(net.sockets.is_empty(), "every socket was closed");
    assert!(net
        .events
        .iter()
        .any(|e| matches!(e, EngineEvent::Topology(SdamEvent::TopologyClosed))));
    assert!(net.events.iter().any(|e| matches!(
        e,
        EngineEvent::Pool {
            event: PoolEvent::PoolClosed,
            ..
        }
    )));
    assert_eq!(net.engine.poll_timeout(), None, "nothing is left to wake");
    let after = net.start(read(ReadPreferenceMode::Primary));
    let results = net.finished(after);
    assert_eq!(results.len(), 1);
    assert_eq!(
        results[0].as_ref().map_err(|e| e.kind.clone()),
        Err(ErrorKind::Cancelled)
    );
    let events = net.events.len();
    net.engine.close(net.now);
    net.drain();
    assert_eq!(net.events.len(), events, "closing twice does nothing");
}

/// EV-1, EV-2, EV-3, EV-8: one started event and exactly one succeeded or failed event per
/// attempt, with the same request id, the operation as `operationId`, the command as sent, the
/// handshake's `connectionId`; none for handshakes and heartbeats.
#[test]
fn ev1_ev2_each_attempt_publishes_one_started_and_one_closing_command_event() {
    let script = overloaded_once(
        doc! { "ok": 1, "cursor": { "id": 0i64, "ns": "test.c", "firstBatch": [] } },
    );
    let settings = TopologySettings::new(vec![address("m1")]);
    let mut options = EngineOptions::new(settings, handshake());
    options.command_monitoring = true;
    let mut net = Net::new(options, script);
    let op = net.start(read(ReadPreferenceMode::Primary));
    net.run_until(Instant::from_millis(10_000));
    assert!(net.finished(op)[0].is_ok());
    let commands = command_events(&net);
    assert_eq!(commands.len(), 4, "two attempts, no hello: {commands:#?}");
    let mut request_ids = Vec::new();
    for pair in commands.chunks(2) {
        let CommandEvent::Started { info, command } = &pair[0] else {
            panic!("started first: {pair:?}");
        };
        assert_eq!(info.command_name, "find");
        assert_eq!(info.database_name, "test");
        assert_eq!(info.operation_id, op);
        assert_eq!(info.server_connection_id, Some(42));
        assert_eq!(command.get_str("$db").ok(), Some("test"));
        let closing = match &pair[1] {
            CommandEvent::Succeeded { info, .. } | CommandEvent::Failed { info, .. } => info,
            other => panic!("a closing event: {other:?}"),
        };
        assert_eq!(
            closing.request_id, info.request_id,
            "EV-1: paired by request id"
        );
        request_ids.push(info.request_id);
    }
    assert!(matches!(commands[1], CommandEvent::Failed { .. }));
    assert!(
        matches!(&commands[3], CommandEvent::Succeeded { reply, .. } if reply.contains_key("cursor"))
    );
    assert_ne!(request_ids[0], request_ids[1]);
}

/// EV-6: a security-sensitive command is published without its command and reply.
#[test]
fn ev6_sensitive_commands_are_redacted() {
    let script = mongos_answering(|_| doc! { "ok": 1, "conversationId": 1, "payload": "secret" });
    let settings = TopologySettings::new(vec![address("m1")]);
    let mut options = EngineOptions::new(settings, handshake());
    options.command_monitoring = true;
    let mut net = Net::new(options, script);
    let mut request = read(ReadPreferenceMode::Primary);
    request.command = doc! { "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": "secret" };
    request.kind = OperationKind::RunCommand;
    request.db = "admin".into();
    let op = net.start(request);
    assert_eq!(net.finished(op).len(), 1);
    let commands = command_events(&net);
    assert!(matches!(&commands[..], [
        CommandEvent::Started { info, command },
        CommandEvent::Succeeded { reply, .. },
    ] if info.command_name == "saslStart" && command.is_empty() && reply.is_empty()));
}

/// The command events so far.
fn command_events(net: &Net) -> Vec<CommandEvent> {
    net.events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Command(c) => Some((**c).clone()),
            _ => None,
        })
        .collect()
}

/// EV-1, EV-2: durations are exact in virtual time, from the write to the failure (a closed
/// socket) or the reply; the retry is a second pair with the same operation id on a new
/// connection whose handshake publishes nothing (EV-8). Turning monitoring off still closes the
/// command in flight (EV-1), and later commands publish nothing.
#[test]
fn ev1_ev2_durations_are_exact_and_a_pending_command_closes_after_monitoring_stops() {
    let script: Script = Box::new(|_, body| is_hello(body).then(mongos_hello));
    let settings = TopologySettings::new(vec![address("m1")]);
    let mut options = EngineOptions::new(settings, handshake());
    options.command_monitoring = true;
    let mut net = Net::new(options, script);
    let op = net.start(read(ReadPreferenceMode::Primary));
    let [CommandEvent::Started { info: first, .. }] = &command_events(&net)[..] else {
        panic!("one started event: {:#?}", command_events(&net));
    };
    assert_eq!(first.operation_id, op);
    assert_eq!(first.address, address("m1"));
    assert_eq!(first.service_id, None);
    // The socket breaks 250 ms after the write.
    net.now = Instant::from_millis(250);
    net.engine
        .handle_closed(first.connection, NetworkErrorKind::Io, None, net.now);
    net.drain();
    // The server is Unknown until its next check (minHeartbeatFrequencyMS after the first, at
    // 500 ms); then the retry runs.
    net.run_until(Instant::from_millis(500));
    let events = command_events(&net);
    let CommandEvent::Failed { info, duration, .. } = &events[1] else {
        panic!("a failed event: {events:#?}");
    };
    assert_eq!(info, first);
    assert_eq!(*duration, std::time::Duration::from_millis(250));
    // The retry's started event, on a new connection (its handshake published nothing).
    let [_, _, CommandEvent::Started { info: second, .. }] = &events[..] else {
        panic!("the retry's started event only: {events:#?}");
    };
    assert_eq!(second.operation_id, op);
    assert_ne!(second.connection, first.connection);
    assert_ne!(second.driver_connection_id, first.driver_connection_id);
    assert_eq!(second.server_connection_id, Some(42));
    net.engine.set_command_monitoring(false);
    net.now = Instant::from_millis(650);
    let reply = doc! { "ok": 1, "cursor": { "id": 0i64, "ns": "test.c", "firstBatch": [] } };
    net.reply_to(second.connection, second.request_id, reply.clone());
    assert!(net.finished(op)[0].is_ok());
    let events = command_events(&net);
    assert_eq!(events.len(), 4, "{events:#?}");
    assert_eq!(
        events[3],
        CommandEvent::Succeeded {
            info: second.clone(),
            duration: std::time::Duration::from_millis(150),
            reply,
        }
    );
    // Monitoring is off: the next operation publishes no command events.
    let next = net.start(read(ReadPreferenceMode::Primary));
    assert!(net.finished(next).is_empty());
    assert_eq!(command_events(&net).len(), 4);
}

/// EV-6: a hello carrying `speculativeAuthenticate` sent as an application command is redacted
/// (command and reply), with the name as sent; a plain hello is not.
#[test]
fn ev6_a_hello_with_speculative_authenticate_is_redacted_a_plain_one_is_not() {
    let script: Script = Box::new(|_, body| is_hello(body).then(mongos_hello));
    let settings = TopologySettings::new(vec![address("m1")]);
    let mut options = EngineOptions::new(settings, handshake());
    options.command_monitoring = true;
    let mut net = Net::new(options, script);
    for (command, redacted) in [
        (
            doc! { "isMaster": 1, "speculativeAuthenticate": { "db": "admin" } },
            true,
        ),
        (doc! { "hello": 1 }, false),
    ] {
        let before = command_events(&net).len();
        let mut request = read(ReadPreferenceMode::Primary);
        request.command = command.clone();
        request.kind = OperationKind::RunCommand;
        request.db = "admin".into();
        let op = net.start(request);
        assert!(net.finished(op)[0].is_ok());
        let events = command_events(&net);
        let [CommandEvent::Started {
            info,
            command: sent,
        }, CommandEvent::Succeeded { reply, .. }] = &events[before..]
        else {
            panic!("one pair: {events:#?}");
        };
        let name = command.keys().next().expect("a name");
        assert_eq!(&info.command_name, name, "EV-6: the name as sent");
        assert_eq!(sent.is_empty(), redacted, "{sent}");
        assert_eq!(reply.is_empty(), redacted, "{reply}");
    }
}

/// MO-11, MO-14 (`cancel-server-check.json`), MO-15, house rule 8: the primary's monitor lost its
/// connection: the server is marked Unknown and its pool cleared at once (MO-11 (2), (3)), then
/// the monitor's one immediate recheck (MO-11 (4)) is sent. A read on the primary that then fails
/// on the network used a connection of the cleared generation: a stale error, neither a second
/// Unknown, nor a second clear, nor a cancel of the recheck. Exactly one Unknown description and
/// one pool clear; every heartbeat started ends once; the read ends once, by its retry once the
/// server is back.
#[test]
fn mo11_a_monitor_failure_marks_unknown_before_its_recheck_and_a_stale_error_changes_nothing() {
    use std::cell::Cell;
    use std::rc::Rc;
    let hellos_hang = Rc::new(Cell::new(false));
    let finds_hang = Rc::new(Cell::new(true));
    let (hello_flag, find_flag) = (hellos_hang.clone(), finds_hang.clone());
    let script: Script = Box::new(move |address, body| {
        if is_hello(body) {
            return (!hello_flag.get()).then(|| member_hello(address, &["a"]));
        }
        (!find_flag.get())
            .then(|| doc! { "ok": 1, "cursor": { "id": 0i64, "ns": "test.c", "firstBatch": [] } })
    });
    let mut settings = TopologySettings::new(vec![address("a")]);
    settings.replica_set = Some("rs".into());
    let mut net = Net::new(EngineOptions::new(settings, handshake()), script);
    let op = net.start(read(ReadPreferenceMode::Primary));
    let pool_conn = net
        .sent
        .iter()
        .find(|(_, body)| body.contains_key("find"))
        .map(|(conn, _)| *conn)
        .expect("the read was sent");
    // The next polling check hangs; its connection then closes: the server is Unknown and its
    // pool cleared at once, then the monitor rechecks at once on a new connection (MO-11 step 4),
    // which the server answers.
    hellos_hang.set(true);
    let sent = net.sent.len();
    net.run_until(Instant::from_millis(10_000));
    let (first_check, _) = net.sent[sent..]
        .iter()
        .find(|(conn, body)| *conn != pool_conn && is_hello(body))
        .cloned()
        .expect("the next check was sent");
    hellos_hang.set(false);
    let seen = net.events.len();
    net.engine
        .handle_closed(first_check, NetworkErrorKind::Reset, None, net.now);
    net.drain();
    let order: Vec<&str> = net.events[seen..]
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Heartbeat {
                event: HeartbeatEvent::Failed { .. },
                ..
            } => Some("failed"),
            EngineEvent::Heartbeat {
                event: HeartbeatEvent::Started { .. },
                ..
            } => Some("started"),
            EngineEvent::Heartbeat {
                event: HeartbeatEvent::Succeeded { .. },
                ..
            } => Some("succeeded"),
            EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { new, .. }) => {
                Some(if new.server_type == ServerType::Unknown {
                    "unknown"
                } else {
                    "known"
                })
            }
            EngineEvent::Pool {
                event: PoolEvent::PoolCleared { .. },
                ..
            } => Some("cleared"),
            _ => None,
        })
        .collect();
    assert_eq!(
        order,
        [
            "failed",
            "started",
            "unknown",
            "cleared",
            "succeeded",
            "known"
        ],
        "MO-11: Unknown and cleared before the recheck's reply"
    );
    let primary = |net: &Net| {
        net.engine
            .topology()
            .server(&address("a"))
            .map(|s| s.server_type)
    };
    // The read's connection (of the cleared generation) fails: a stale error; the read retries.
    finds_hang.set(false);
    net.engine
        .handle_closed(pool_conn, NetworkErrorKind::Reset, None, net.now);
    net.drain();
    assert_eq!(primary(&net), Some(ServerType::RsPrimary), "a stale error");
    net.run_until(Instant::from_millis(40_000));
    let unknown = net
        .events
        .iter()
        .filter(|e| {
            matches!(e, EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { new, .. })
                if new.server_type == ServerType::Unknown)
        })
        .count();
    assert_eq!(unknown, 1, "one Unknown description");
    let cleared = net
        .events
        .iter()
        .filter(|e| {
            matches!(
                e,
                EngineEvent::Pool {
                    event: PoolEvent::PoolCleared { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(cleared, 1, "one pool clear");
    let heartbeats = |f: fn(&HeartbeatEvent) -> bool| {
        net.events
            .iter()
            .filter(|e| matches!(e, EngineEvent::Heartbeat { event, .. } if f(event)))
            .count()
    };
    let started = heartbeats(|e| matches!(e, HeartbeatEvent::Started { .. }));
    let failed = heartbeats(|e| matches!(e, HeartbeatEvent::Failed { .. }));
    let succeeded = heartbeats(|e| matches!(e, HeartbeatEvent::Succeeded { .. }));
    assert_eq!(failed, 1, "the closed check; the recheck succeeded");
    assert_eq!(started, failed + succeeded, "each started check ends once");
    assert_eq!(
        primary(&net),
        Some(ServerType::RsPrimary),
        "back after the next check"
    );
    let results = net.finished(op);
    assert_eq!(results.len(), 1, "finished exactly once: {results:?}");
    assert!(results[0].is_ok(), "the retry succeeded: {results:?}");
}

/// Issue 9: with every optional event family off the engine publishes no pool, SDAM, heartbeat,
/// retry or hedging event (`CommandSucceeded` included) and exactly one `OperationFinished`, which
/// names the server that replied (RW-3: what a driver's write errors name); its transmits (times, connections, bytes) and result are those of an
/// engine publishing everything (house rule 2: events never steer the engine).
#[test]
fn filtered_event_families_are_not_published_and_change_no_transmit() {
    let run = |families: EventFamilies| {
        let script = overloaded_once(doc! { "ok": 1 });
        let settings = TopologySettings::new(vec![address("m1"), address("m2")]);
        let mut options = EngineOptions::new(settings, handshake()).with_events(families);
        options.seed = 7;
        let mut net = Net::new(options, script);
        let op = net.start(read(ReadPreferenceMode::Primary));
        net.run_until(Instant::from_millis(10_000));
        let result = net.finished(op).into_iter().cloned().collect::<Vec<_>>();
        (net, result)
    };
    let (all, all_result) = run(EventFamilies::ALL);
    let (none, none_result) = run(EventFamilies::NONE);
    assert_eq!(all_result.len(), 1, "the operation ends once");
    assert!(all_result[0].is_ok());
    assert_eq!(none_result, all_result, "the same result, once");
    assert_eq!(
        none.transmits, all.transmits,
        "the same bytes at the same times"
    );
    assert!(
        all.transmits.len() > 2,
        "handshakes and two attempts were sent"
    );
    let published =
        |net: &Net, f: fn(&EngineEvent) -> bool| net.events.iter().filter(|e| f(e)).count();
    let pool = |e: &EngineEvent| matches!(e, EngineEvent::Pool { .. });
    let sdam =
        |e: &EngineEvent| matches!(e, EngineEvent::Topology(_) | EngineEvent::Heartbeat { .. });
    let retry = |e: &EngineEvent| matches!(e, EngineEvent::Operation { .. });
    for family in [pool, sdam, retry] {
        assert!(published(&all, family) > 0, "published by default");
        assert_eq!(published(&none, family), 0, "not published when filtered");
    }
    let succeeded: Vec<_> = all
        .events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Operation {
                event: RetryEvent::CommandSucceeded { address, .. },
                ..
            } => Some(address.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(succeeded.len(), 1, "one attempt succeeded");
    let finished_at = |net: &Net| {
        net.events
            .iter()
            .filter_map(|e| match e {
                EngineEvent::OperationFinished { address, .. } => Some(address.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(finished_at(&all), vec![Some(succeeded[0].clone())]);
    assert_eq!(
        finished_at(&none),
        vec![Some(succeeded[0].clone())],
        "the finish names the server that replied, filtered or not"
    );

    // One family on: only it of the optional ones.
    let (pool_only, _) = run(EventFamilies::POOL);
    assert_eq!(published(&pool_only, pool), published(&all, pool));
    assert_eq!(
        published(&pool_only, sdam) + published(&pool_only, retry),
        0
    );
    assert_eq!(pool_only.transmits, all.transmits);
}

/// The command every scripted member answers with: an empty cursor naming the member.
fn cursor_from(address: &ServerAddress) -> Document {
    doc! { "ok": 1, "cursor": { "id": 0i64, "ns": "test.c",
    "firstBatch": [{ "server": address.host() }] } }
}

/// The `$db` of the last command sent that is not a hello.
fn last_db(net: &Net) -> Option<String> {
    net.sent
        .iter()
        .rev()
        .find(|(_, body)| !is_hello(body))
        .and_then(|(_, body)| body.get_str("$db").ok().map(str::to_owned))
}

/// Review19 R6 (issue 9, WP-5: the engine sends `$db` from the request's `db`):
/// `Engine::take_db_name` hands out the name of a finished operation's kept box, empty (a
/// driver appends the next name to it) and at most once; the next operations on other
/// databases, each written into such a reused string, send their own `$db`; a hedged operation,
/// whose box is not kept, gives none.
#[test]
fn a_finished_operations_db_name_is_handed_out_empty_for_the_next_db() {
    let script = mongos_answering(cursor_from);
    let mut options = EngineOptions::new(TopologySettings::new(vec![address("m")]), handshake());
    options.service_config = Some(
        retry_core::service_config::ServiceConfig::from_document(&doc! { "methodConfig": [{
        "name": [{ "service": "mongodb", "method": "find" }],
        "hedgingPolicy": { "maxAttempts": 2, "hedgingDelay": "10s" } }] })
        .expect("valid"),
    );
    let mut net = Net::new(options, script);
    assert_eq!(net.engine.take_db_name(), None, "nothing finished yet");
    let count = |db: String| {
        let preference = ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None);
        OperationRequest::new(
            db,
            doc! { "count": "c" },
            OperationKind::Read,
            SelectionCriteria::Read(preference.expect("valid")),
        )
    };
    let op = net.start(count("first".to_owned()));
    assert_eq!(net.finished(op).len(), 1);
    assert_eq!(last_db(&net).as_deref(), Some("first"));
    for db in ["second", "third"] {
        let mut name = net.engine.take_db_name().expect("the last one's name");
        assert!(name.is_empty(), "handed out empty: {name:?}");
        assert!(name.capacity() >= "first".len(), "its room kept");
        assert_eq!(
            net.engine.take_db_name(),
            None,
            "one per finished operation"
        );
        name.push_str(db);
        let op = net.start(count(name));
        let results = net.finished(op);
        assert_eq!(results.len(), 1, "finished once: {results:?}");
        assert!(results[0].is_ok(), "{results:?}");
        assert_eq!(last_db(&net).as_deref(), Some(db), "its own $db");
    }
    assert!(net.engine.take_db_name().is_some());
    let hedged = net.start(OperationRequest::new(
        "hedged",
        doc! { "find": "c" },
        OperationKind::Read,
        SelectionCriteria::Read(ReadPreference::PRIMARY),
    ));
    let hedged_events = net
        .events
        .iter()
        .any(|e| matches!(e, EngineEvent::Hedging { op, .. } if *op == hedged));
    assert!(hedged_events, "the find ran as hedged copies");
    assert_eq!(net.finished(hedged).len(), 1);
    assert_eq!(last_db(&net).as_deref(), Some("hedged"));
    assert_eq!(net.engine.take_db_name(), None, "a hedged box is not kept");
}

/// Review19 R6 (house rule 9: `Topology::pools_version`; house rule 8): when a member that is
/// not the last of the topology's pools leaves, the pools after it move; an operation on a
/// member whose pool moved, after one that found it at its old position, still goes to that
/// member's pool and ends exactly once.
#[test]
fn an_operation_after_an_earlier_member_left_reaches_its_members_moved_pool() {
    let (removed, script, mut settings) = set_that_removes_b(|address| Some(cursor_from(address)));
    // `b` first: its pool comes before the primary's, which moves when `b` leaves.
    settings.seeds = vec![address("b"), address("a")];
    let mut net = Net::new(EngineOptions::new(settings, handshake()), script);
    let on_a = |net: &Net, op: OpId| {
        let results = net.finished(op);
        assert_eq!(results.len(), 1, "finished exactly once: {results:?}");
        let reply = results[0].as_ref().expect("succeeded");
        let document = Document::try_from(reply.as_ref()).expect("a document");
        let batch = document
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"));
        assert_eq!(
            batch.expect("a batch")[0]
                .as_document()
                .and_then(|d| d.get_str("server").ok()),
            Some("a"),
            "answered by the primary"
        );
    };
    let before = net.start(read(ReadPreferenceMode::Primary));
    on_a(&net, before);
    removed.set(true);
    net.run_until(Instant::from_millis(30_000));
    let closed_b = net.events.iter().any(|e| {
        matches!(e, EngineEvent::Topology(SdamEvent::ServerClosed { address }) if address.host() == "b")
    });
    assert!(closed_b, "b left the topology");
    let after = net.start(read(ReadPreferenceMode::Primary));
    on_a(&net, after);
    let started_on_a = net.events.iter().any(|e| {
        matches!(e, EngineEvent::Operation { op, event: RetryEvent::CommandStarted { address, .. } }
            if *op == after && address.host() == "a")
    });
    assert!(started_on_a);
}
