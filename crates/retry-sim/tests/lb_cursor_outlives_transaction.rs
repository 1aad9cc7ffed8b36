//! TX-4, TX-5, LB-10, house rule 8: in load-balanced mode a cursor opened in a transaction shares
//! the transaction's pinned connection. When the transaction's pin goes first (a later operation
//! naming the session outside a transaction, TX-4 (5); an abort, TX-4 (1); a new transaction,
//! TX-4 (4)), the connection stays checked out for the cursor and is checked in exactly once,
//! when the cursor ends: it is never lent to another operation while the cursor still uses it.

use bson::doc;
use retry_core::engine::CursorHandle;
use retry_core::engine::SessionHandle;
use retry_core::retry::OperationKind;
use retry_sim::{
    abort, address, commit, cursor_batch, get_more, insert, kill_cursors, open_cursor, pool_of_one,
    request, Sim, Step, FIRST_WRITE, LATER_READ, LATER_WRITE,
};

/// An LB with `maxPoolSize=1`: a transaction's insert pins the only connection and a find in
/// the transaction opens cursor 42 on it; `then` answers the command after the find.
fn cursor_in_a_transaction(then: Vec<Step>) -> (Sim, SessionHandle, CursorHandle) {
    let script = [
        Step::reply(doc! { "ok": 1, "n": 1 }),
        Step::reply(cursor_batch(42, "firstBatch")),
    ];
    let mut sim = Sim::lb(script.into_iter().chain(then), pool_of_one);
    let session = sim.engine.start_session();
    let insert = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(insert).expect("the insert pins the connection");
    let find = sim.start_request(open_cursor(LATER_READ).with_session(session));
    sim.run(find).expect("the find opens a cursor");
    let cursor = sim.cursor_opened(find).expect("a cursor opened");
    (sim, session, cursor)
}

/// The cursor is still open on the only connection: another operation waits for it, and runs
/// once closing the cursor has checked it in (once).
fn assert_cursor_holds_the_connection(mut sim: Sim, cursor: CursorHandle) {
    assert_eq!(
        sim.checkouts_and_checkins(),
        ["out"],
        "the cursor still holds it"
    );
    let other = sim.start_waiting(
        request(doc! { "find": "d" }, OperationKind::Read),
        "the cursor's connection",
    );
    let close = sim.start_request(kill_cursors(42_i64, cursor));
    sim.run(close).expect("the cursor closes");
    sim.run(other).expect("then the other operation runs");
    assert_eq!(
        sim.checkouts_and_checkins(),
        ["out", "in", "out", "in"],
        "one check-in per checkout"
    );
    let log = sim.log("lb");
    assert_eq!(
        log.last(),
        Some(&"find"),
        "the other find ran after the killCursors"
    );
}

/// TX-4 (5), LB-10, house rule 7 (review7 finding 9): after a commit, a getMore naming the
/// session runs outside the transaction (no `txnNumber`) and unpins the session. A real server
/// refuses it for a cursor opened in the transaction (50740, "without a txnNumber"; the test
/// server does the same): the caller gets that error, and the cursor still holds its connection,
/// checked in exactly once when the cursor closes.
#[test]
fn tx4_lb10_a_get_more_naming_the_session_after_a_commit_is_refused_and_keeps_the_cursors_connection(
) {
    let refusal = doc! {
        "ok": 0, "code": 50740, "codeName": "Location50740",
        "errmsg": "Cannot run getMore on cursor 42, which was created in transaction 1, without a txnNumber",
    };
    let (mut sim, session, cursor) =
        cursor_in_a_transaction(vec![Step::reply(doc! { "ok": 1 }), Step::reply(refusal)]);
    let commit = sim.start_request(commit(session));
    sim.run(commit).expect("committed");
    sim.servers.get_mut(&address("lb")).unwrap().record_commands = true;
    let more = sim.start_request(get_more(42_i64, cursor).with_session(session));
    let error = sim
        .run(more)
        .expect_err("the server refuses a getMore without a txnNumber");
    assert_eq!(error.code(), Some(50740), "{error}");
    let sent = sim.received("lb", "getMore");
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].contains_key("lsid") && !sent[0].contains_key("txnNumber"),
        "outside the transaction: {}",
        sent[0]
    );
    assert_eq!(
        sim.engine.session_info(session).and_then(|i| i.pinned),
        None,
        "TX-4 (5): the session is unpinned"
    );
    assert_cursor_holds_the_connection(sim, cursor);
}

/// TX-4 (1), LB-10: an abort unpins the session; the cursor keeps the connection.
#[test]
fn tx4_lb10_an_abort_leaves_the_cursor_its_connection() {
    let (mut sim, session, cursor) = cursor_in_a_transaction(vec![Step::reply(doc! { "ok": 1 })]);
    let abort = sim.start_request(abort(session));
    sim.run(abort).expect("aborted");
    assert_cursor_holds_the_connection(sim, cursor);
}

/// TX-4 (4), LB-10: a new transaction unpins the session; the cursor keeps the connection.
#[test]
fn tx4_lb10_a_new_transaction_leaves_the_cursor_its_connection() {
    let (mut sim, session, cursor) = cursor_in_a_transaction(vec![Step::reply(doc! { "ok": 1 })]);
    let commit = sim.start_request(commit(session));
    sim.run(commit).expect("committed");
    sim.begin_transaction(session);
    sim.drain();
    assert_cursor_holds_the_connection(sim, cursor);
}

/// TX-4 (2), LB-10: a later statement failing with a `TransientTransactionError` unpins the
/// session; the cursor keeps the connection the statement ran on.
#[test]
fn tx4_lb10_a_transient_error_leaves_the_cursor_its_connection() {
    let transient = doc! {
        "ok": 0, "code": 112, "codeName": "WriteConflict", "errmsg": "write conflict",
        "errorLabels": ["TransientTransactionError"],
    };
    let (mut sim, session, cursor) = cursor_in_a_transaction(vec![Step::reply(transient)]);
    let insert = sim.start_request(insert(LATER_WRITE).with_session(session));
    sim.run(insert).expect_err("the write conflict");
    assert_cursor_holds_the_connection(sim, cursor);
}

/// LB-10, TX-5: two cursors of one transaction share its connection; after the abort, the
/// first cursor's end leaves it to the second, whose end checks it in.
#[test]
fn lb10_the_last_of_two_cursors_on_a_connection_checks_it_in() {
    let (mut sim, session, first) =
        cursor_in_a_transaction(vec![Step::reply(cursor_batch(43, "firstBatch"))]);
    let find = sim.start_request(open_cursor(LATER_READ).with_session(session));
    sim.run(find).expect("a second cursor");
    let second = sim.cursor_opened(find).expect("a cursor opened");
    let abort = sim.start_request(abort(session));
    sim.run(abort).expect("aborted");
    let close = sim.start_request(kill_cursors(43_i64, second));
    sim.run(close).expect("the second cursor closes");
    assert_cursor_holds_the_connection(sim, first);
}

/// TX-4 (5), LB-10: after a commit, the killCursors that closes the cursor names the session: it
/// unpins the session, but the connection stays the cursor's until the killCursors is done; an
/// operation started meanwhile waits for it.
#[test]
fn tx4_lb10_a_kill_cursors_naming_the_session_after_a_commit_keeps_the_connection_until_done() {
    let (mut sim, session, cursor) = cursor_in_a_transaction(vec![
        Step::reply(doc! { "ok": 1 }),
        Step::reply(doc! { "ok": 1, "cursorsKilled": [42_i64] }),
    ]);
    let commit = sim.start_request(commit(session));
    sim.run(commit).expect("committed");
    let close = sim.start_request(kill_cursors(42_i64, cursor).with_session(session));
    let other = sim.start_request(request(doc! { "find": "d" }, OperationKind::Read));
    sim.run(close).expect("the cursor closes");
    sim.run(other).expect("then the other operation runs");
    assert_eq!(
        sim.checkouts_and_checkins(),
        ["out", "in", "out", "in"],
        "one check-in per checkout"
    );
    let log = sim.log("lb");
    assert_eq!(log[log.len() - 2..], ["killCursors", "find"]);
}

/// TX-1, LB-10, house rule 8 (engine21's leftover): a killCursors naming the session while its
/// new transaction is starting, of a cursor opened before it, runs outside the transaction (a
/// killCursors is never a transaction's first command: a real server refuses it, 263), on the
/// cursor's connection, which goes back once, when it is done; the transaction pins nothing.
#[test]
fn lb10_a_kill_cursors_while_a_transaction_starts_gives_the_cursors_connection_back() {
    let mut sim = Sim::lb(
        [
            Step::reply(cursor_batch(42, "firstBatch")),
            Step::reply(doc! { "ok": 1, "cursorsKilled": [42_i64] }),
        ],
        pool_of_one,
    );
    let session = sim.engine.start_session();
    let find = sim.start_request(open_cursor(OperationKind::Read).with_session(session));
    sim.run(find).expect("a cursor outside any transaction");
    let cursor = sim.cursor_opened(find).expect("a cursor opened");
    sim.begin_transaction(session);
    let close = sim.start_request(kill_cursors(42_i64, cursor).with_session(session));
    sim.run(close).expect("the cursor closes");
    assert_eq!(
        sim.checkouts_and_checkins(),
        ["out", "in"],
        "the cursor's end checks it in"
    );
    let info = sim.engine.session_info(session).expect("open");
    assert_eq!(info.pinned, None, "the transaction pins nothing");
    assert_eq!(
        info.transaction,
        retry_core::transaction::TransactionState::Starting
    );
    let other = sim.start_request(request(doc! { "find": "d" }, OperationKind::Read));
    sim.run(other).expect("the other operation runs at once");
    assert_eq!(sim.checkouts_and_checkins(), ["out", "in", "out", "in"]);
}

/// LB-11, house rule 8: two cursors of a transaction share its connection; a getMore of one
/// fails on the network: neither cursor sends a killCursors, and closing both checks the dead
/// connection in once (it was never checked in before; the second close used to find its
/// socket gone and left it checked out for ever).
#[test]
fn lb11_a_network_error_under_one_of_two_cursors_on_a_connection_releases_it_once() {
    let (mut sim, session, first) = cursor_in_a_transaction(vec![
        Step::reply(cursor_batch(43, "firstBatch")),
        Step::Reset,
    ]);
    let find = sim.start_request(open_cursor(LATER_READ).with_session(session));
    sim.run(find).expect("a second cursor");
    let second = sim.cursor_opened(find).expect("a cursor opened");
    let more = sim.start_request(get_more(42_i64, first));
    sim.run(more).expect_err("the connection is reset");
    for (cursor, id) in [(first, 42_i64), (second, 43)] {
        let close = sim.start_request(kill_cursors(id, cursor));
        let _ = sim.run(close);
    }
    sim.engine.end_session(session, sim.now);
    sim.drain();
    assert_eq!(
        sim.checkouts_and_checkins(),
        ["out", "in"],
        "checked in once"
    );
    let log = sim.log("lb");
    assert!(
        !log.contains(&"killCursors"),
        "LB-11: no killCursors: {log:?}"
    );
}
