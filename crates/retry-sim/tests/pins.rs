//! Load-balanced pins the LB unified tests found wrong, end to end in virtual time: a getMore
//! network error keeps the cursor's connection out until the cursor closes (LB-11), a
//! transaction's first command pins its connection even when it fails (TX-5, TX-4), starting a
//! transaction unpins at once (TX-4 (4)), and a cursor in a transaction shares its connection.

use bson::doc;
use retry_core::engine::CursorUse;
use retry_core::retry::OperationKind;
use retry_sim::{
    abort, commit, cursor_batch, get_more, insert, kill_cursors, request, Sim, Step, FIRST_WRITE,
    LATER_READ,
};

/// A load balancer with `script` and the default pool.
fn lb_sim(script: Vec<Step>) -> Sim {
    Sim::lb(script, |_| {})
}

fn batch(id: i64, field: &str) -> Step {
    Step::reply(cursor_batch(id, field))
}

/// The pool's check-out, check-in and close-after-error events, in order.
fn pool_events(sim: &Sim) -> Vec<&'static str> {
    sim.pool_trace(&["out", "in", "closed(error)"])
}

/// LB-11 (LB `cursors.json` "pinned connections are not returned after an network error during
/// getMore"): the connection stays checked out after the getMore fails; closing the cursor sends
/// no killCursors and only then checks it in and closes it.
#[test]
fn lb11_a_get_more_network_error_keeps_the_connection_until_the_cursor_closes() {
    let mut sim = lb_sim(vec![batch(42, "firstBatch"), Step::Reset]);
    let find = sim.start_request(
        request(doc! { "find": "c" }, OperationKind::Read).with_cursor(CursorUse::Open),
    );
    sim.run(find).unwrap();
    let cursor = sim.cursor_opened(find).expect("a cursor opened");
    let more = sim.start_request(get_more(42i64, cursor));
    assert!(sim.run(more).is_err());
    assert_eq!(pool_events(&sim), ["out"], "still checked out");
    let close = sim.start_request(kill_cursors(42i64, cursor));
    sim.run(close).unwrap();
    assert_eq!(pool_events(&sim), ["out", "in", "closed(error)"]);
    let log = sim.log("lb");
    assert_eq!(log, ["find", "getMore"], "no killCursors after the error");
}

/// TX-5, TX-4 (LB `transactions.json` "pinned connection is not released after a non-transient
/// CRUD error" / "... is released after a transient non-network CRUD error"): a failed first
/// command pins the connection; only a `TransientTransactionError` unpins it.
#[test]
fn tx5_a_failed_first_command_pins_unless_the_error_is_transient() {
    let failure = doc! { "ok": 0, "code": 51, "errmsg": "non-transient" };
    let mut sim = lb_sim(vec![Step::reply(failure)]);
    let session = sim.engine.start_session();
    let insert = doc! { "insert": "c", "documents": [{}] };
    let op = sim.start_request(request(insert.clone(), FIRST_WRITE).with_session(session));
    assert!(sim.run(op).is_err());
    assert_eq!(
        pool_events(&sim),
        ["out"],
        "pinned after a non-transient error"
    );
    sim.engine.end_session(session, sim.now);
    sim.drain();
    assert_eq!(pool_events(&sim), ["out", "in"]);

    let transient = doc! {
        "ok": 0, "code": 24, "errmsg": "lock timeout",
        "errorLabels": ["TransientTransactionError"],
    };
    let mut sim = lb_sim(vec![Step::reply(transient)]);
    let session = sim.engine.start_session();
    let op = sim.start_request(request(insert, FIRST_WRITE).with_session(session));
    assert!(sim.run(op).is_err());
    assert_eq!(pool_events(&sim), ["out", "in"], "unpinned at once");
}

/// TX-4 (4) (LB `transactions.json` "pinned connection is returned when a new transaction is
/// started"): starting a transaction lets the previous one's connection go before any command.
#[test]
fn tx4_starting_a_transaction_unpins_at_once() {
    let mut sim = lb_sim(Vec::new());
    let session = sim.engine.start_session();
    let op = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(op).unwrap();
    let commit = sim.start_request(commit(session));
    sim.run(commit).unwrap();
    assert_eq!(pool_events(&sim), ["out"], "a commit does not unpin");
    sim.begin_transaction(session);
    sim.drain();
    assert_eq!(pool_events(&sim), ["out", "in"]);
}

/// TX-5, LB-10 (LB `transactions.json` "a connection can be shared by a transaction and a
/// cursor"): a cursor opened in the transaction uses its pinned connection, and closing the
/// cursor does not check that connection in; aborting the transaction does.
#[test]
fn tx5_a_cursor_in_a_transaction_shares_its_connection() {
    let mut sim = lb_sim(vec![
        Step::reply(doc! { "ok": 1, "n": 1 }),
        batch(42, "firstBatch"),
    ]);
    let session = sim.engine.start_session();
    let insert = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(insert).unwrap();
    let find = sim.start_request(
        request(doc! { "find": "c", "batchSize": 2 }, LATER_READ)
            .with_cursor(CursorUse::Open)
            .with_session(session),
    );
    sim.run(find).unwrap();
    let cursor = sim.cursor_opened(find).expect("a cursor opened");
    let close = sim.start_request(kill_cursors(42i64, cursor));
    sim.run(close).unwrap();
    assert_eq!(pool_events(&sim), ["out"], "the transaction still holds it");
    let abort = sim.start_request(abort(session));
    sim.run(abort).unwrap();
    assert_eq!(pool_events(&sim), ["out", "in"]);
}
