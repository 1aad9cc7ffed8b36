//! SE-10, house rule 8 (review item 5): in load-balanced mode a transaction pins its session to
//! one connection (TX-5); a second operation of that session sent while the first is on the
//! connection fails with a usage error and leaves the connection, and the first's reply, alone.

use std::time::Duration;

use bson::{doc, Document};
use retry_core::engine::{OpId, OperationRequest, SessionHandle};
use retry_core::error::ErrorKind;
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;

use retry_sim::{address, Role, Sim, SimServer, Step};

fn statement(sim: &mut Sim, session: SessionHandle, first: bool) -> OpId {
    let request = OperationRequest::new(
        "test",
        doc! { "insert": "c", "documents": [{}] },
        OperationKind::InTransaction { read: false, first },
        SelectionCriteria::Write,
    )
    .with_session(session);
    sim.start_request(request)
}

#[test]
fn se10_a_busy_pinned_connection_fails_the_second_operation_not_the_first() {
    let mut lb = SimServer::new(Role::LoadBalancer { service_id: true });
    lb.record_commands = true;
    lb.script.extend([
        Step::reply(doc! { "ok": 1 }),
        Step::Reply {
            body: doc! { "ok": 1, "n": 1 },
            delay: Duration::from_secs(1),
        },
    ]);
    let mut sim = Sim::new(vec![(address("lb"), lb)], |o| {
        o.topology.load_balanced = true
    });
    let session = sim.engine.start_session();
    let first = statement(&mut sim, session, true);
    sim.run(first)
        .expect("the transaction starts and pins its connection");
    let slow = statement(&mut sim, session, false);
    sim.advance_to(sim.now.saturating_add(Duration::from_millis(100)));
    assert!(sim.result(slow).is_none(), "on the pinned connection");
    let concurrent = statement(&mut sim, session, false);
    let error = sim.run(concurrent).expect_err("the connection is busy");
    assert!(
        matches!(&error.kind, ErrorKind::Usage { message } if message.contains("in use")),
        "{error}"
    );
    let reply: Document = sim.run(slow).expect("the first keeps its reply");
    assert_eq!(reply.get_i32("n").ok(), Some(1));
    let inserts = sim.servers[&address("lb")].commands.len();
    assert_eq!(inserts, 2, "the refused operation sent nothing");
}
