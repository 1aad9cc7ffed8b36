//! TX-3, TX-7, TX-4 (2) (review38 L6): a sharded transaction pinned to a mongos that has left the
//! topology (SRV polling dropped it). A statement may go to no other mongos (none knows the
//! transaction): it fails at once, nothing sent, with a server-selection error labelled
//! `TransientTransactionError`, and the session is unpinned. A commit still selects another
//! mongos (it carries the `recoveryToken`, TX-6).

use std::time::Duration;

use retry_core::engine::{EngineEvent, SessionHandle};
use retry_core::error::{ErrorKind, Labels};
use retry_core::time::Instant;
use retry_core::topology::SrvPollingOptions;
use retry_sim::{address, commit, insert, Role, Sim, SimServer, FIRST_WRITE, LATER_WRITE};

/// Two mongos found by SRV polling, a transaction started on one of them (returned, with the
/// other), and then the rescan's record set without the pinned one.
fn pinned_mongos_removed() -> (Sim, SessionHandle, String, String) {
    let servers = ["m0", "m1"]
        .map(|h| (address(h), SimServer::new(Role::Mongos)))
        .into_iter()
        .collect();
    let mut sim = Sim::new(servers, |o| {
        o.srv_polling = Some(SrvPollingOptions::new(0, None));
        o.selection.local_threshold = Duration::from_secs(1);
    });
    assert!(sim.advance_to(Instant::from_millis(100)));
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).expect("the transaction starts");
    let pinned = sim.attempt_servers(first)[0].clone();
    let other = if pinned == "m0" { "m1" } else { "m0" }.to_string();
    assert_eq!(
        sim.engine.session_info(session).and_then(|i| i.pinned),
        Some(address(&pinned)),
        "TX-3: pinned"
    );
    // SP-1: the rescan after the minimum interval drops the pinned mongos.
    assert!(sim.advance_to(Instant::from_millis(61_000)));
    assert!(sim.engine.poll_srv_rescan(), "the rescan is due");
    let now = sim.now;
    sim.engine
        .handle_srv_hosts(vec![address(&other)], None, now);
    sim.drain();
    (sim, session, pinned, other)
}

/// TX-3, TX-7, TX-4 (2) (review38 L6): the statement after the pinned mongos left fails at once
/// with a transient server-selection error, reaches no mongos, and unpins the session; it ends
/// exactly once. Run twice: the same inputs give the same trace (house rule 2).
#[test]
fn tx3_tx7_a_statement_whose_pinned_mongos_left_fails_transiently_and_unpins() {
    let trace = || {
        let (mut sim, session, pinned, other) = pinned_mongos_removed();
        let statement = sim.start_request(insert(LATER_WRITE).with_session(session));
        let error = sim.run(statement).expect_err("the pinned mongos is gone");
        assert!(
            matches!(error.kind, ErrorKind::ServerSelection { .. }),
            "{error}"
        );
        assert!(error.has_label(Labels::TRANSIENT_TRANSACTION), "{error}");
        assert!(sim.attempt_servers(statement).is_empty(), "nothing sent");
        assert_eq!(sim.log(&other), Vec::<&str>::new(), "not re-selected");
        assert_eq!(sim.log(&pinned), ["insert"], "only the first statement");
        let info = sim.engine.session_info(session).expect("open");
        assert_eq!(info.pinned, None, "TX-4 (2): unpinned");
        let finished = sim
            .events
            .iter()
            .filter(
                |(_, e)| matches!(e, EngineEvent::OperationFinished { op, .. } if *op == statement),
            )
            .count();
        assert_eq!(finished, 1, "ends exactly once");
        format!("{:?}", sim.events)
    };
    assert_eq!(trace(), trace());
}

/// TX-3, TX-6 (review38 L6): a commit is not bound to the pinned mongos that left; it selects the
/// mongos that is left and succeeds there.
#[test]
fn tx3_a_commit_whose_pinned_mongos_left_selects_another() {
    let (mut sim, session, _pinned, other) = pinned_mongos_removed();
    let commit = sim.start_request(commit(session));
    sim.run(commit).expect("committed on the other mongos");
    assert_eq!(sim.attempt_servers(commit), [other]);
}
