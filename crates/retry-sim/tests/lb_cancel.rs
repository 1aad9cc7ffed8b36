//! LB-9, LB-11, TX-4, house rule 8 (review38 L1): cancelling an operation whose command is in
//! flight on a pinned load-balanced connection (a cursor's getMore, a transaction's statement or
//! abort) closes that connection, as if the peer had closed it. It no longer stays busy with an
//! orphaned command whose reply nobody reads, and the pool gets it back exactly once, even when
//! the cursor or session that held it lets it go before the orphaned reply would have arrived.

use std::time::Duration;

use bson::doc;
use retry_core::error::ErrorKind;
use retry_core::transaction::TransactionState;
use retry_sim::{
    abort, cursor_batch, get_more, insert, kill_cursors, open_cursor, Sim, Step, FIRST_WRITE,
    LATER_WRITE,
};

/// A reply that arrives `secs` seconds late.
fn slow(body: bson::Document, secs: u64) -> Step {
    Step::Reply {
        body,
        delay: Duration::from_secs(secs),
    }
}

/// The pool's check-outs, check-ins and closes after an error, in order.
fn pool_events(sim: &Sim) -> Vec<&'static str> {
    sim.pool_trace(&["out", "in", "closed(error)"])
}

fn later(sim: &mut Sim, millis: u64) {
    let until = sim.now.saturating_add(Duration::from_millis(millis));
    assert!(sim.advance_to(until));
}

/// LB-9, LB-11 (review38 L1 test a): a getMore cancelled in flight closes the cursor's
/// connection; the cursor's close then sends no killCursors, and the connection is checked in
/// once and closed with reason error, before and after the orphaned reply's time.
#[test]
fn lb9_lb11_a_get_more_cancelled_in_flight_closes_the_pinned_connection() {
    let mut sim = Sim::lb(
        [
            Step::reply(cursor_batch(42, "firstBatch")),
            slow(cursor_batch(42, "nextBatch"), 5),
        ],
        |_| {},
    );
    let find = sim.start_request(open_cursor(retry_core::retry::OperationKind::Read));
    sim.run(find).expect("the cursor opens");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    let more = sim.start_request(get_more(42, cursor));
    later(&mut sim, 100);
    assert!(sim.result(more).is_none(), "in flight");
    sim.engine.cancel_operation(more, sim.now);
    sim.drain();
    let cancelled = sim.result(more).expect("finished").expect_err("cancelled");
    assert!(
        matches!(cancelled.kind, ErrorKind::Cancelled),
        "{cancelled}"
    );
    let close = sim.start_request(kill_cursors(42, cursor));
    sim.run(close)
        .expect("LB-11: the close of a broken cursor succeeds at once");
    later(&mut sim, 6_000);
    assert_eq!(sim.log("lb"), ["find", "getMore"], "no killCursors");
    assert_eq!(pool_events(&sim), ["out", "in", "closed(error)"]);
}

/// TX-4 (2), LB-9 (review38 L1 test b): a transaction statement cancelled in flight closes the
/// pinned connection; ending the session before the orphaned reply's time leaks nothing, and the
/// connection is checked in exactly once.
#[test]
fn tx4_lb9_a_statement_cancelled_in_flight_then_the_session_ends_checks_in_once() {
    let mut sim = Sim::lb(
        [
            Step::reply(doc! { "ok": 1, "n": 1 }),
            slow(doc! { "ok": 1, "n": 1 }, 5),
        ],
        |_| {},
    );
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).expect("the transaction pins its connection");
    let statement = sim.start_request(insert(LATER_WRITE).with_session(session));
    later(&mut sim, 100);
    sim.engine.cancel_operation(statement, sim.now);
    sim.drain();
    assert!(sim.result(statement).is_some_and(|r| r.is_err()));
    sim.engine.end_session(session, sim.now);
    sim.drain();
    later(&mut sim, 6_000);
    assert_eq!(pool_events(&sim), ["out", "in", "closed(error)"]);
}

/// TX-4 (2), TX-7 (review38 L1): after the cancelled statement closed the pinned connection, the
/// transaction's next statement fails with a network error labelled TransientTransactionError
/// without being sent, and unpins; nothing stays checked out.
#[test]
fn tx4_the_statement_after_a_cancelled_one_fails_transiently_and_unpins() {
    let mut sim = Sim::lb(
        [
            Step::reply(doc! { "ok": 1, "n": 1 }),
            slow(doc! { "ok": 1, "n": 1 }, 5),
        ],
        |_| {},
    );
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).expect("pinned");
    let statement = sim.start_request(insert(LATER_WRITE).with_session(session));
    later(&mut sim, 100);
    sim.engine.cancel_operation(statement, sim.now);
    sim.drain();
    let next = sim.start_request(insert(LATER_WRITE).with_session(session));
    let error = sim.run(next).expect_err("the pinned connection is gone");
    assert!(
        error.has_label(retry_core::error::Labels::TRANSIENT_TRANSACTION),
        "{error}"
    );
    let info = sim.engine.session_info(session).expect("open");
    assert_eq!(info.pinned, None, "TX-4 (2): unpinned");
    later(&mut sim, 6_000);
    assert_eq!(
        sim.log("lb"),
        ["insert", "insert"],
        "the third was not sent"
    );
    assert_eq!(pool_events(&sim), ["out", "in", "closed(error)"]);
}

/// TX-4 (1) (review38 L1 step 8): an abortTransaction cancelled in flight unpins at once; the
/// session's connection is checked in once, and the session is aborted.
#[test]
fn tx4_1_an_abort_cancelled_in_flight_unpins() {
    let mut sim = Sim::lb(
        [
            Step::reply(doc! { "ok": 1, "n": 1 }),
            slow(doc! { "ok": 1 }, 5),
        ],
        |_| {},
    );
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).expect("pinned");
    let aborting = sim.start_request(abort(session));
    later(&mut sim, 100);
    sim.engine.cancel_operation(aborting, sim.now);
    sim.drain();
    assert!(sim.result(aborting).is_some_and(|r| r.is_err()));
    let info = sim.engine.session_info(session).expect("open");
    assert_eq!(info.pinned, None, "TX-4 (1): unpinned");
    assert_eq!(info.transaction, TransactionState::Aborted);
    assert_eq!(pool_events(&sim), ["out", "in", "closed(error)"]);
    later(&mut sim, 6_000);
    sim.engine.end_session(session, sim.now);
    sim.drain();
    assert_eq!(pool_events(&sim), ["out", "in", "closed(error)"]);
}
