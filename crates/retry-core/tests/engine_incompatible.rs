//! SS-16 step 2, review32 R3: a server whose wire-version range does not overlap ours is recorded
//! by SDAM from the monitor's handshake (MO-1: the handshake is the first check), so the topology
//! is incompatible and a selection fails at its first poll with the compatibility message, once,
//! instead of waiting `serverSelectionTimeoutMS`. Virtual time, bounded loops.

mod support;

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
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("engine-incompatible", "0.1.0");
    let settings = TopologySettings::new(vec![address("db0")]);
    let options = EngineOptions::new(settings, handshake).with_events(EventFamilies::ALL);
    let script = Box::new(move |_: &_, body: &_| {
        Some(if is_hello(body) {
            doc! { "ok": 1, "isWritablePrimary": true, "minWireVersion": range.0,
            "maxWireVersion": range.1 }
        } else {
            doc! { "ok": 1 }
        })
    });
    Net::new(options, script)
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
