//! House rule 8 with a session or cursor used by two operations at once (SE-10 says not to; the
//! engine must still end every operation and check every connection in once), load-balanced:
//! the cases `lb_pins_properties` found. A TX-4 unpin or a cursor's close never takes a
//! connection from under a command in flight on it; a second first command of a transaction
//! never replaces the first one's pin (which leaked its connection); an abort that finds the pin
//! made by a command that ran alongside it gives that connection back.

use std::time::Duration;

use bson::{doc, Document};
use retry_core::engine::SessionHandle;
use retry_core::engine::{EngineEvent, OperationRequest};
use retry_core::pool::PoolEvent;
use retry_core::retry::OperationKind;
use retry_sim::{
    abort, commit, cursor_batch, get_more, insert, kill_cursors, open_cursor, Sim, Step,
};

/// A load balancer with `script` and a pool of two connections.
fn lb(script: Vec<Step>) -> Sim {
    Sim::lb(script, |o| o.topology.pool.max_pool_size = 2)
}

fn slow(body: Document) -> Step {
    Step::Reply {
        body,
        delay: Duration::from_millis(10),
    }
}

fn retryable_insert(session: Option<SessionHandle>) -> OperationRequest {
    insert(OperationKind::RetryableWrite).with_session(session)
}

/// Check-outs minus check-ins: the connections still out.
fn out(sim: &Sim) -> i64 {
    sim.events
        .iter()
        .map(|(_, e)| match e {
            EngineEvent::Pool {
                event: PoolEvent::CheckedOut { .. },
                ..
            } => 1,
            EngineEvent::Pool {
                event: PoolEvent::CheckedIn { .. },
                ..
            } => -1,
            _ => 0,
        })
        .sum()
}

/// TX-4 (5), house rule 8: a commit is in flight on the pinned connection when another
/// operation names the session outside the transaction and unpins it: the commit still gets
/// its reply, and the connection goes back once, after it.
#[test]
fn tx4_an_unpin_while_the_commit_is_in_flight_leaves_the_commit_its_reply() {
    let mut sim = lb(vec![
        Step::reply(doc! { "ok": 1, "n": 1 }),
        slow(doc! { "ok": 1 }),
    ]);
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(retryable_insert(Some(session)));
    sim.run(first).expect("pinned");
    let commit = sim.start_request(commit(session));
    let after = sim.start_request(retryable_insert(Some(session)));
    sim.run(commit).expect("the commit gets its reply");
    sim.run(after).expect("the insert after it runs");
    assert_eq!(out(&sim), 0, "every connection back once");
}

/// TX-4 (1), house rule 8: an abort runs alongside the transaction's first command, which pins
/// its own connection after the abort went out; the abort's end gives that connection back.
#[test]
fn tx4_an_abort_gives_back_the_pin_a_first_command_made_alongside_it() {
    let mut sim = lb(vec![slow(doc! { "ok": 1, "n": 1 }), slow(doc! { "ok": 1 })]);
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(retryable_insert(Some(session)));
    sim.advance_to(sim.now.saturating_add(Duration::from_millis(3)));
    let abort = sim.start_request(abort(session));
    sim.run(first).expect("the insert");
    sim.run(abort).expect("the abort");
    assert_eq!(sim.engine.session_info(session).unwrap().pinned, None);
    assert_eq!(out(&sim), 0, "the insert's pinned connection went back");
}

/// TX-3, TX-5, house rule 8: two first commands of one transaction are started at once; the
/// first one written pins, the second is refused before it is sent (TX-1: one command starts a
/// transaction, review6 finding 2) and pins nothing, and a cursor the first opened keeps its
/// connection until it is closed, which checks it in.
#[test]
fn tx5_a_second_first_command_does_not_replace_the_pin() {
    let mut sim = lb(vec![Step::reply(cursor_batch(42, "firstBatch"))]);
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let find = sim.start_request(open_cursor(OperationKind::Read).with_session(session));
    let second = sim.start_request(retryable_insert(Some(session)));
    sim.run(find).expect("the find opens a cursor and pins");
    let cursor = sim.cursor_opened(find).expect("a cursor opened");
    let refused = sim.run(second).expect_err("refused");
    assert!(refused.to_string().contains("already started"), "{refused}");
    let close = sim.start_request(kill_cursors(42_i64, cursor));
    sim.run(close).expect("closed");
    assert_eq!(out(&sim), 1, "TX-5: the transaction's pin holds it");
    let abort = sim.start_request(abort(session));
    sim.run(abort).expect("the abort");
    assert_eq!(
        out(&sim),
        0,
        "the find's connection went back with its cursor and the transaction's end"
    );
}

/// LB-10, house rule 8: a getMore and a killCursors of one cursor at once: the killCursors
/// finds the connection busy and fails, and the getMore still gets its reply; the connection
/// goes back once.
#[test]
fn lb10_a_close_alongside_a_get_more_leaves_the_get_more_its_reply() {
    let mut sim = lb(vec![
        Step::reply(cursor_batch(42, "firstBatch")),
        slow(cursor_batch(42, "nextBatch")),
    ]);
    let find = sim.start_request(open_cursor(OperationKind::Read));
    sim.run(find).expect("a cursor");
    let cursor = sim.cursor_opened(find).expect("a cursor opened");
    let more = sim.start_request(get_more(42_i64, cursor));
    let close = sim.start_request(kill_cursors(42_i64, cursor));
    let _ = sim.run(close);
    sim.run(more).expect("the getMore gets its reply");
    assert_eq!(out(&sim), 0, "the cursor's connection went back once");
}
