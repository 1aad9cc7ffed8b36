//! SE-10, house rule 8 (review item 5): in load-balanced mode a transaction pins its session to
//! one connection (TX-5); a second operation of that session sent while the first is on the
//! connection fails with a usage error and leaves the connection, and the first's reply, alone.
//! Such a refused abort still unpins (TX-4 (1)); a refused commit changes nothing (TX-2).

use std::time::Duration;

use bson::{doc, Document};
use retry_core::engine::{OpId, OperationRequest, SessionHandle};
use retry_core::error::ErrorKind;
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;
use retry_core::transaction::TransactionState;

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

/// The pool's check-outs and check-ins, in order.
fn checkouts(sim: &Sim) -> Vec<&'static str> {
    sim.checkouts_and_checkins()
}

/// A load balancer whose transaction's first statement succeeds at once and whose second
/// answers after 1 s; the session pinned, the second statement in flight.
fn busy_pin() -> (Sim, SessionHandle, OpId) {
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
    sim.engine
        .start_transaction(session, Default::default(), sim.now)
        .expect("starts");
    let first = statement(&mut sim, session, true);
    sim.run(first).expect("pinned");
    let slow = statement(&mut sim, session, false);
    sim.advance_to(sim.now.saturating_add(Duration::from_millis(100)));
    assert!(sim.result(slow).is_none(), "on the pinned connection");
    (sim, session, slow)
}

fn session_command(
    session: SessionHandle,
    command: Document,
    kind: OperationKind,
) -> OperationRequest {
    OperationRequest::new("admin", command, kind, SelectionCriteria::Write).with_session(session)
}

/// TX-4 (1), SE-10 (review38 L3): an abortTransaction refused because the pinned connection is
/// busy unpins all the same; the statement in flight keeps its reply, and the connection is
/// checked in exactly once, when that reply arrives.
#[test]
fn tx4_1_an_abort_refused_on_a_busy_pinned_connection_unpins() {
    let (mut sim, session, slow) = busy_pin();
    let abort = sim.start_request(session_command(
        session,
        doc! { "abortTransaction": 1 },
        OperationKind::AbortTransaction,
    ));
    let error = sim.run(abort).expect_err("the connection is busy");
    assert!(matches!(&error.kind, ErrorKind::Usage { .. }), "{error}");
    let info = sim.engine.session_info(session).expect("open");
    assert_eq!(info.pinned, None, "TX-4 (1): unpinned");
    assert_eq!(info.transaction, TransactionState::Aborted);
    assert_eq!(checkouts(&sim), ["out"], "the statement still uses it");
    sim.run(slow).expect("the statement keeps its reply");
    assert_eq!(checkouts(&sim), ["out", "in"]);
    sim.engine.end_session(session, sim.now);
    sim.drain();
    assert_eq!(checkouts(&sim), ["out", "in"], "checked in once");
    assert_eq!(
        sim.servers[&address("lb")].commands.len(),
        2,
        "no abort sent"
    );
}

/// TX-2, TX-4 (review38 L3): a commitTransaction refused because the pinned connection is busy
/// is a client-side error: the transaction stays in progress and pinned, and a later commit is
/// the first one (no TX-11 retry write concern).
#[test]
fn tx2_a_commit_refused_on_a_busy_pinned_connection_changes_no_state() {
    let (mut sim, session, slow) = busy_pin();
    let commit = sim.start_request(session_command(
        session,
        doc! { "commitTransaction": 1 },
        OperationKind::CommitTransaction { again: false },
    ));
    let error = sim.run(commit).expect_err("the connection is busy");
    assert!(matches!(&error.kind, ErrorKind::Usage { .. }), "{error}");
    let info = sim.engine.session_info(session).expect("open");
    assert_eq!(info.transaction, TransactionState::InProgress, "TX-2");
    assert_eq!(info.pinned, Some(address("lb")), "still pinned");
    sim.run(slow).expect("the statement keeps its reply");
    assert_eq!(checkouts(&sim), ["out"], "the transaction keeps it");
}
