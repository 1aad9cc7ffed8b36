//! RR-10, RW-18 (review33 G6): the error an operation raises names the server that produced it.
//! After a retry that moved to another server, that is the last attempt's server; when the
//! retry's selection fails, the previous error is raised with its own server (RR-6, RW-14). On
//! the engine, whose errors take their address from the connection the reply came on.

mod support;

use std::cell::Cell;
use std::rc::Rc;

use bson::doc;
use retry_core::engine::{EngineOptions, OperationRequest};
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, SelectionCriteria};
use retry_core::time::Instant;
use retry_core::topology::TopologySettings;
use support::net::{address, is_hello, member_hello, Net, Script};

fn handshake() -> HandshakeOptions {
    let mut options = HandshakeOptions::new();
    options.metadata = ClientMetadata::new("error-address", "0.1.0");
    options
}

fn find() -> OperationRequest {
    OperationRequest::new(
        "test",
        doc! { "find": "c" },
        OperationKind::Read,
        SelectionCriteria::Read(ReadPreference::PRIMARY),
    )
}

/// The retryable read error each mongos answers `find` with: HostUnreachable (6) from `m1`,
/// HostNotFound (7) from `m2`; neither marks the server Unknown.
fn code_of(host: &str) -> i32 {
    if host == "m1" {
        6
    } else {
        7
    }
}

/// RR-10, RW-18 (prose 2.1 shape): on a sharded cluster the retry moves to the other mongos
/// (RR-7) and fails there too; the raised error is the retry's, naming the retry's mongos.
#[test]
fn rr10_rw18_an_error_after_a_retry_on_another_mongos_names_that_mongos() {
    let script: Script = Box::new(|address, body| {
        Some(if is_hello(body) {
            doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true, "msg": "isdbgrid",
            "maxWireVersion": 25, "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30 }
        } else {
            let code = code_of(address.host());
            doc! { "ok": 0, "code": code, "errmsg": format!("failpoint {code}") }
        })
    });
    let settings = TopologySettings::new(vec![address("m1"), address("m2")]);
    let mut net = Net::new(EngineOptions::new(settings, handshake()), script);
    let op = net.start(find());
    let finds: Vec<_> = net
        .sent
        .iter()
        .filter(|(_, body)| body.contains_key("find"))
        .map(|(conn, _)| net.sockets[conn].0.clone())
        .collect();
    assert_eq!(finds.len(), 2, "one retry: {finds:?}");
    assert_ne!(
        finds[0], finds[1],
        "RR-7: the retry went to the other mongos"
    );
    let [Err(error)] = &net.finished(op)[..] else {
        panic!("one error: {:?}", net.finished(op));
    };
    assert_eq!(error.address.as_ref(), Some(&finds[1]), "{error}");
    assert_eq!(error.code(), Some(code_of(finds[1].host())), "{error}");
}

/// RR-10, RR-6 (RW-14 for writes): a primary's NotWritablePrimary (10107) marks it Unknown; its
/// next hello says it is a secondary, so the retry finds no primary and its selection times out.
/// The raised error is the first attempt's, naming the primary it came from, not the selection
/// error (which names no server).
#[test]
fn rr10_rr6_when_the_retry_cannot_select_the_first_error_keeps_its_server() {
    let stepped_down = Rc::new(Cell::new(false));
    let down = stepped_down.clone();
    let script: Script = Box::new(move |address, body| {
        if is_hello(body) {
            let mut hello = member_hello(address, &["a"]);
            if down.get() {
                hello.insert("isWritablePrimary", false);
                hello.insert("secondary", true);
                hello.remove("electionId");
            }
            return Some(hello);
        }
        down.set(true);
        Some(doc! { "ok": 0, "code": 10107, "errmsg": "not primary" })
    });
    let mut settings = TopologySettings::new(vec![address("a")]);
    settings.replica_set = Some("rs".into());
    let mut net = Net::new(EngineOptions::new(settings, handshake()), script);
    let op = net.start(find());
    net.run_until(Instant::from_millis(60_000));
    let finds = net
        .sent
        .iter()
        .filter(|(_, body)| body.contains_key("find"))
        .count();
    assert_eq!(finds, 1, "the retry never found a server");
    let [Err(error)] = &net.finished(op)[..] else {
        panic!("one error: {:?}", net.finished(op));
    };
    assert_eq!(error.code(), Some(10107), "{error}");
    assert_eq!(error.address, Some(address("a")), "{error}");
}
