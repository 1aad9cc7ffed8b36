//! Review24 R4: the shared engine harness (`support/net.rs`) itself. It must fail a test when the
//! engine writes to a socket it does not know (house rule 8: no output for a socket that is
//! gone), as engine_pool_events' own harness did before review23 R6 shared it.

mod support;

use bson::{doc, Document};
use retry_core::engine::{EngineOptions, OperationRequest};
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::topology::TopologySettings;
use support::net::{address, is_hello, Net, Script};

fn mongos() -> Script {
    Box::new(|_, body| {
        Some(if is_hello(body) {
            doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true, "msg": "isdbgrid",
            "maxWireVersion": 25, "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30 }
        } else {
            doc! { "ok": 1 }
        })
    })
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

fn net() -> Net {
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("engine-harness", "0.1.0");
    let settings = TopologySettings::new(vec![address("m")]);
    Net::new(EngineOptions::new(settings, handshake), mongos())
}

/// Review24 R4: the harness answers on the sockets it knows (the control for the test below).
#[test]
fn review24_r4_a_command_on_a_known_socket_is_answered() {
    let mut net = net();
    let op = net.start(ping());
    assert_eq!(net.finished(op).len(), 1);
    assert!(net.finished(op)[0].is_ok());
    let pings: Vec<&Document> = net
        .sent
        .iter()
        .map(|(_, body)| body)
        .filter(|body| body.contains_key("ping"))
        .collect();
    assert_eq!(pings.len(), 1);
}

/// Review24 R4: a transmit on a socket the harness does not know (here: forgotten by the
/// harness, as if the engine wrote to a socket it had closed) fails the test, naming the socket.
#[test]
#[should_panic(expected = "bytes to socket ConnId(")]
fn review24_r4_bytes_for_an_unknown_socket_fail_the_test() {
    let mut net = net();
    let first = net.start(ping());
    assert_eq!(net.finished(first).len(), 1);
    // The pooled connection stays checked in; the harness forgets every socket.
    net.sockets.clear();
    net.start(ping());
}
