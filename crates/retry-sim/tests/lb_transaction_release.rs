//! House rule 8, TX-4, TX-5 (review5 item 1): in load-balanced mode a failed later statement or
//! abort of a transaction, whose TX-4 rules unpin the session, checks its pinned connection in
//! exactly once, so a waiting checkout gets a connection no other command uses.

use std::time::Duration;

use bson::doc;
use retry_core::engine::{OpId, SessionHandle};
use retry_core::error::Labels;
use retry_core::retry::OperationKind;
use retry_sim::{abort, insert, pool_of_one, request, Sim, Step, FIRST_WRITE, LATER_WRITE};

/// An LB with `maxPoolSize=1`: a transaction's first insert succeeds and pins the only
/// connection; an implicit-session `find` (answered 1 s late) then waits for checkout.
fn pinned_with_a_waiting_find(then: Step) -> (Sim, SessionHandle, OpId) {
    let script = [
        Step::reply(doc! { "ok": 1, "n": 1 }),
        then,
        Step::Reply {
            body: doc! { "ok": 1 },
            delay: Duration::from_secs(1),
        },
    ];
    let mut sim = Sim::lb(script, pool_of_one);
    let session = sim.engine.start_session();
    let first = insert(FIRST_WRITE).with_session(session);
    let first = sim.start_request(first);
    sim.run(first)
        .expect("the first statement pins the connection");
    let find = sim.start_waiting(
        request(doc! { "find": "c" }, OperationKind::Read),
        "the pinned connection",
    );
    (sim, session, find)
}

/// After the failure: a third operation waits until the `find` on the connection is done, and
/// every checkout has exactly one check-in.
fn assert_released_once(mut sim: Sim, find: OpId) {
    assert_eq!(
        sim.checkouts_and_checkins(),
        ["out", "in", "out"],
        "the find has it"
    );
    let third = sim.start_request(request(doc! { "find": "d" }, OperationKind::Read));
    sim.run(third)
        .expect("the third operation waits for the find, then runs");
    sim.run(find).expect("the find keeps its reply");
    assert_eq!(
        sim.checkouts_and_checkins(),
        ["out", "in", "out", "in", "out", "in"],
        "one check-in per checkout"
    );
    let log = sim.log("lb");
    assert_eq!(log.last(), Some(&"find"), "the third ran after the find");
}

/// TX-4 (2), TX-5, house rule 8: a later statement failing with a `TransientTransactionError`
/// unpins and checks its connection in once.
#[test]
fn tx4_lb_a_failed_statement_checks_its_pinned_connection_in_once() {
    let transient = doc! {
        "ok": 0, "code": 112, "codeName": "WriteConflict", "errmsg": "write conflict",
        "errorLabels": ["TransientTransactionError"],
    };
    let (mut sim, session, find) = pinned_with_a_waiting_find(Step::reply(transient));
    let second = sim.start_request(insert(LATER_WRITE).with_session(session));
    let error = sim.run(second).expect_err("the write conflict");
    assert!(error.has_label(Labels::TRANSIENT_TRANSACTION), "{error}");
    assert_released_once(sim, find);
}

/// TX-4 (1), TX-5, house rule 8: an abort failing with any error unpins and checks its connection
/// in once (a non-retryable error that is no SDAM state change, so the pool keeps the connection).
#[test]
fn tx4_lb_a_failed_abort_checks_its_pinned_connection_in_once() {
    let lock = doc! { "ok": 0, "code": 24, "codeName": "LockTimeout", "errmsg": "lock timeout" };
    let (mut sim, session, find) = pinned_with_a_waiting_find(Step::reply(lock));
    let abort = sim.start_request(abort(session));
    let error = sim.run(abort).expect_err("the lock timeout");
    assert_eq!(error.code(), Some(24), "{error}");
    assert_released_once(sim, find);
}
