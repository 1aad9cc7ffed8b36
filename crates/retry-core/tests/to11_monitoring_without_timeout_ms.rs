//! TO-11 (MO-3, MO-4): monitoring and RTT connections never use `timeoutMS`. Operations run
//! under a 100 ms CSOT timeout while the monitor's checks take longer: the monitor's handshake
//! (held 300 ms), its awaitable hello (held to the end) and the RTT connection's hellos are
//! bounded by `connectTimeoutMS` (+ `heartbeatFrequencyMS` for awaited replies) only, so none of
//! them fails, and no hello carries `maxTimeMS`, while the operations' commands do. The shared
//! engine harness (`support/net.rs`): virtual time, bounded loops.

mod support;

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Document};
use retry_core::engine::{ConnId, EngineEvent, EngineOptions, OperationRequest};
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::monitor::{HeartbeatEvent, ServerMonitoringMode};
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::{SdamEvent, ServerType, TopologySettings};
use support::net::{address, is_hello, Net, Script};

const TIMEOUT_MS: Duration = Duration::from_millis(100);
const HEARTBEAT: Duration = Duration::from_millis(500);

fn ms(n: u64) -> Instant {
    Instant::ZERO.saturating_add(Duration::from_millis(n))
}

/// A mongos whose hello carries a `topologyVersion` (so the monitor streams, MO-7, and opens an
/// RTT connection, MO-12). The first hello (the monitor's handshake) and every awaitable hello
/// (`topologyVersion` in the request, MO-9) are left unanswered; `handshakes` counts hellos.
fn mongos(hellos: Rc<Cell<u32>>) -> Script {
    let process_id = ObjectId::parse_str("65a0000000000000000000bb").expect("valid");
    Box::new(move |_, body| {
        if !is_hello(body) {
            return Some(doc! { "ok": 1 });
        }
        hellos.set(hellos.get() + 1);
        if hellos.get() == 1 || body.contains_key("topologyVersion") {
            return None;
        }
        Some(
            doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true, "msg": "isdbgrid",
            "maxWireVersion": 25, "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30,
            "topologyVersion": { "processId": process_id, "counter": 0_i64 } },
        )
    })
}

/// A ping under a 100 ms CSOT timeout from `now`.
fn ping(now: Instant) -> OperationRequest {
    let primary =
        ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).expect("valid");
    OperationRequest::new(
        "admin",
        doc! { "ping": 1 },
        OperationKind::Read,
        SelectionCriteria::Read(primary),
    )
    .with_timeout(OperationTimeout::from_timeout_ms(now, TIMEOUT_MS))
}

fn heartbeats(net: &Net) -> Vec<&HeartbeatEvent> {
    net.events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Heartbeat { event, .. } => Some(event),
            _ => None,
        })
        .collect()
}

fn failed_heartbeats(net: &Net) -> usize {
    heartbeats(net)
        .into_iter()
        .filter(|e| matches!(e, HeartbeatEvent::Failed { .. }))
        .count()
}

/// TO-11: see the module docs.
#[test]
fn to11_monitoring_and_rtt_connections_do_not_use_timeout_ms() {
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("to11", "0.1.0");
    let mut options = EngineOptions::new(TopologySettings::new(vec![address("m")]), handshake);
    options.heartbeat_frequency = HEARTBEAT;
    options.server_monitoring_mode = ServerMonitoringMode::Stream;
    let hellos = Rc::new(Cell::new(0));
    let mut net = Net::new(options, mongos(hellos.clone()));
    assert_eq!(hellos.get(), 1, "the monitor's handshake, held");
    let (monitor, handshake_id) = net.unanswered[0];

    // An operation under timeoutMS=100 waits for the server to be known and times out at 100 ms
    // (the control: its own timeout applies to it).
    let first = net.start(ping(net.now));
    net.run_until(ms(99));
    assert!(net.finished(first).is_empty());
    net.run_until(ms(100));
    assert!(
        matches!(net.finished(first)[..], [Err(_)]),
        "{:?}",
        net.finished(first)
    );

    // The monitor's handshake is still waiting at 300 ms, three times timeoutMS, and is not
    // failed for it; its reply then completes the check.
    net.run_until(ms(300));
    assert_eq!(failed_heartbeats(&net), 0, "TO-11: {:?}", heartbeats(&net));
    assert_eq!(net.unanswered.first(), Some(&(monitor, handshake_id)));
    net.now = ms(300);
    let reply = doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true, "msg": "isdbgrid",
    "maxWireVersion": 25, "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30,
    "topologyVersion": { "processId": ObjectId::parse_str("65a0000000000000000000bb").unwrap(),
    "counter": 0_i64 } };
    net.reply_to(monitor, handshake_id, reply);
    assert!(
        heartbeats(&net).iter().any(|e| matches!(
            e,
            HeartbeatEvent::Succeeded { duration, awaited: false } if *duration == Duration::from_millis(300)
        )),
        "the 300 ms check succeeded: {:?}",
        heartbeats(&net)
    );
    assert!(net.events.iter().any(|e| matches!(
        e,
        EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { new, .. })
            if new.server_type == ServerType::Mongos
    )));

    // A second operation under timeoutMS=100 runs; the monitor streams (its awaitable hello
    // stays unanswered) and the RTT connection measures, for 2 s.
    let second = net.start(ping(net.now));
    assert!(matches!(net.finished(second)[..], [Ok(_)]));
    net.run_until(ms(2300));
    assert_eq!(failed_heartbeats(&net), 0, "TO-11: {:?}", heartbeats(&net));
    let awaited: Vec<ConnId> = net
        .sent
        .iter()
        .filter(|(_, body)| is_hello(body) && body.contains_key("topologyVersion"))
        .map(|(conn, _)| *conn)
        .collect();
    assert_eq!(awaited, [monitor], "one awaitable hello, still in flight");
    assert!(net.unanswered.iter().any(|(conn, _)| *conn == monitor));
    let ping_conn = net
        .sent
        .iter()
        .find(|(_, body)| body.contains_key("ping"))
        .map(|(conn, _)| *conn)
        .expect("the second ping was sent");
    let rtt_hellos = net
        .sent
        .iter()
        .filter(|(conn, body)| is_hello(body) && *conn != monitor && *conn != ping_conn)
        .count();
    assert!(
        rtt_hellos >= 2,
        "MO-12: the RTT connection's handshake and hellos"
    );

    let hellos: Vec<&Document> = net
        .sent
        .iter()
        .map(|(_, body)| body)
        .filter(|body| is_hello(body))
        .collect();
    assert!(hellos.len() >= 5, "{hellos:?}");
    for hello in hellos {
        assert!(!hello.contains_key("maxTimeMS"), "TO-11: {hello}");
    }
    let pings: Vec<&Document> = net
        .sent
        .iter()
        .map(|(_, body)| body)
        .filter(|body| body.contains_key("ping"))
        .collect();
    assert_eq!(pings.len(), 1);
    assert!(pings[0].contains_key("maxTimeMS"), "CS-4: {}", pings[0]);
}
