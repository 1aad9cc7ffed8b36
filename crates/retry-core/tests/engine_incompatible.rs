//! SS-16 step 2, review32 R3: a server whose wire-version range does not overlap ours is recorded
//! by SDAM from the monitor's handshake (MO-1: the handshake is the first check), so the topology
//! is incompatible and a selection fails at its first poll with the compatibility message, once,
//! instead of waiting `serverSelectionTimeoutMS`. Virtual time, bounded loops.

mod support;

use std::cell::Cell;
use std::rc::Rc;

use bson::doc;
use retry_core::engine::{EngineEvent, EngineOptions, EventFamilies, OperationRequest};
use retry_core::error::ErrorKind;
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::pool::PoolEvent;
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::Instant;
use retry_core::topology::{ServerType, TopologySettings, MAX_SUPPORTED_WIRE_VERSION};
use support::net::{address, is_hello, Net};

/// An engine seeded with `db0`, whose hellos say `minWireVersion` / `maxWireVersion` `range`,
/// after its first check (at time zero).
fn engine(range: (i32, i32)) -> Net {
    engine_with(Rc::new(Cell::new(range)), 0)
}

/// An engine seeded with `db0` and `min_pool_size`, whose hellos report the wire-version range
/// `range` holds when they are answered (a test changes it to "upgrade" the server).
fn engine_with(range: Rc<Cell<(i32, i32)>>, min_pool_size: u32) -> Net {
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("engine-incompatible", "0.1.0");
    let mut settings = TopologySettings::new(vec![address("db0")]);
    settings.pool.min_pool_size = min_pool_size;
    let options = EngineOptions::new(settings, handshake).with_events(EventFamilies::ALL);
    let script = Box::new(move |_: &_, body: &_| {
        let (min, max) = range.get();
        Some(if is_hello(body) {
            doc! { "ok": 1, "isWritablePrimary": true, "minWireVersion": min,
            "maxWireVersion": max }
        } else {
            doc! { "ok": 1 }
        })
    });
    Net::new(options, script)
}

fn count(net: &Net, f: impl Fn(&PoolEvent) -> bool) -> usize {
    net.events
        .iter()
        .filter(|e| matches!(e, EngineEvent::Pool { event, .. } if f(event)))
        .count()
}

fn created(event: &PoolEvent) -> bool {
    matches!(event, PoolEvent::ConnectionCreated { .. })
}

fn read() -> OperationRequest {
    let primary =
        ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).expect("valid");
    OperationRequest::new(
        "test",
        doc! { "find": "c" },
        OperationKind::Read,
        SelectionCriteria::Read(primary),
    )
}

/// SS-16 step 2: a server newer than us (`minWireVersion` 99) fails the read at its first poll.
#[test]
fn ss16_r3_a_too_new_server_fails_selection_at_once_with_the_compatibility_message() {
    let mut net = engine((99, 100));
    assert_eq!(net.now, Instant::ZERO);
    // SDAM recorded the server (its type from the reply) and the topology's incompatibility.
    let topology = net.engine.topology();
    let server = topology.server(&address("db0")).expect("known");
    assert_eq!(server.server_type, ServerType::Standalone);
    let reason = format!(
        "server at db0:27017 requires wire version 99, but this engine only supports up to \
         {MAX_SUPPORTED_WIRE_VERSION}"
    );
    assert_eq!(topology.compatibility_error(), Some(reason.as_str()));
    let op = net.start(read());
    let results = net.finished(op);
    assert_eq!(results.len(), 1, "ends at its first poll, exactly once");
    let Err(error) = results[0] else {
        panic!("succeeded")
    };
    let ErrorKind::ServerSelection { message } = &error.kind else {
        panic!("not a selection error: {error:?}")
    };
    assert!(message.contains(&reason), "{message}");
    assert_eq!(net.now, Instant::ZERO);
    // Nothing was checked out, no pooled connection opened.
    assert!(!net.events.iter().any(|e| matches!(
        e,
        EngineEvent::Pool {
            event: PoolEvent::ConnectionCreated { .. },
            ..
        }
    )));
}

/// SS-16 step 2: a server older than us (`maxWireVersion` 7, MongoDB 4.0) fails the same way.
#[test]
fn ss16_r3_a_too_old_server_fails_selection_at_once_with_the_compatibility_message() {
    let mut net = engine((0, 7));
    let op = net.start(read());
    let results = net.finished(op);
    assert_eq!(results.len(), 1);
    let Err(error) = results[0] else {
        panic!("succeeded")
    };
    assert!(
        error
            .to_string()
            .contains("server at db0:27017 reports wire version 7, but this engine requires"),
        "{error}"
    );
}

/// The control: a compatible server serves the read.
#[test]
fn ss16_r3_a_compatible_server_serves_the_read() {
    let mut net = engine((0, 21));
    assert_eq!(net.engine.topology().compatibility_error(), None);
    let op = net.start(read());
    assert!(matches!(net.finished(op)[..], [Ok(_)]));
}

/// Review35 Z1 (CM-2, SS-16 step 2): with `minPoolSize` 1 the pool of an incompatible server is
/// never readied, so no pooled connection is opened (each would refuse the handshake, mark the
/// server Unknown and drop the compatibility error): after three heartbeats the error stands
/// and a read started at 15 s fails at 15 s.
#[test]
fn ss16_z1_min_pool_size_opens_no_connection_to_an_incompatible_server() {
    let mut net = engine_with(Rc::new(Cell::new((99, 100))), 1);
    let heartbeats = |net: &Net| net.sent.iter().filter(|(_, b)| is_hello(b)).count();
    let first = heartbeats(&net);
    net.run_until(Instant::from_millis(15_000));
    // Between heartbeats: no timer is due until 20 s, the read starts at 15 s.
    net.now = Instant::from_millis(15_000);
    // The monitor polled again at 10 s on its connection (heartbeatFrequencyMS 10 s).
    assert_eq!(heartbeats(&net), first + 1);
    assert_eq!(count(&net, created), 0, "no pooled connection opened");
    assert_eq!(count(&net, |e| matches!(e, PoolEvent::PoolReady)), 0);
    assert_eq!(
        count(&net, |e| matches!(e, PoolEvent::PoolCleared { .. })),
        0
    );
    let topology = net.engine.topology();
    assert!(topology.compatibility_error().is_some());
    assert_eq!(
        topology.server(&address("db0")).expect("known").server_type,
        ServerType::Standalone
    );
    let op = net.start(read());
    let results = net.finished(op);
    assert_eq!(results.len(), 1, "ends at its first poll, exactly once");
    assert!(
        matches!(results[0], Err(e) if matches!(e.kind, ErrorKind::ServerSelection { .. })),
        "{:?}",
        results[0]
    );
    assert_eq!(net.now, Instant::from_millis(15_000));
    net.run_until(Instant::from_millis(35_000));
    assert_eq!(heartbeats(&net), first + 3, "three heartbeats in all");
    assert_eq!(count(&net, created), 0);
    assert!(net.engine.topology().compatibility_error().is_some());
}

/// Review35 Z1 (SDAM, CM-2): the server becomes compatible (upgraded); the next heartbeat's
/// reply clears the compatibility error, readies the pool (which opens its `minPoolSize`
/// connection) and the read is served.
#[test]
fn ss16_z1_a_compatible_reply_clears_the_error_and_readies_the_pool() {
    let range = Rc::new(Cell::new((99, 100)));
    let mut net = engine_with(range.clone(), 1);
    assert!(net.engine.topology().compatibility_error().is_some());
    range.set((0, 21));
    net.run_until(Instant::from_millis(10_000));
    assert_eq!(net.engine.topology().compatibility_error(), None);
    assert_eq!(count(&net, |e| matches!(e, PoolEvent::PoolReady)), 1);
    assert_eq!(count(&net, created), 1, "minPoolSize 1");
    let op = net.start(read());
    assert!(matches!(net.finished(op)[..], [Ok(_)]));
}

/// Review35 Z1 (CM-2): a server that was compatible and reports an incompatible range has its
/// ready pool cleared (paused), so it opens no further connection, and selection fails at once.
#[test]
fn ss16_z1_a_server_turning_incompatible_has_its_pool_paused() {
    let range = Rc::new(Cell::new((0, 21)));
    let mut net = engine_with(range.clone(), 1);
    assert_eq!(count(&net, |e| matches!(e, PoolEvent::PoolReady)), 1);
    range.set((99, 100));
    net.run_until(Instant::from_millis(10_000));
    assert!(net.engine.topology().compatibility_error().is_some());
    let cleared: Vec<_> = net
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
        .collect();
    assert_eq!(cleared.len(), 1, "{cleared:?}");
    // Paused: no PoolReady after the clear.
    let clear = net.position(|e| {
        matches!(
            e,
            EngineEvent::Pool {
                event: PoolEvent::PoolCleared { .. },
                ..
            }
        )
    });
    let readied_after = net.events[clear..].iter().any(|e| {
        matches!(
            e,
            EngineEvent::Pool {
                event: PoolEvent::PoolReady,
                ..
            }
        )
    });
    assert!(!readied_after);
    let op = net.start(read());
    assert!(matches!(net.finished(op)[..], [Err(_)]));
    assert_eq!(net.now, Instant::from_millis(10_000), "at once");
    let before = count(&net, created);
    net.run_until(Instant::from_millis(30_000));
    assert_eq!(
        count(&net, created),
        before,
        "no connection opened while paused"
    );
    assert!(net.engine.topology().compatibility_error().is_some());
}
