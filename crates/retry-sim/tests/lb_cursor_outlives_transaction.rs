//! TX-4, TX-5, LB-10, house rule 8: in load-balanced mode a cursor opened in a transaction shares
//! the transaction's pinned connection. When the transaction's pin goes first (a later operation
//! naming the session outside a transaction, TX-4 (5); an abort, TX-4 (1); a new transaction,
//! TX-4 (4)), the connection stays checked out for the cursor and is checked in exactly once,
//! when the cursor ends: it is never lent to another operation while the cursor still uses it.

use bson::{doc, Document};
use retry_core::engine::SessionHandle;
use retry_core::engine::{CursorHandle, CursorUse, OperationRequest};
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;
use retry_sim::{address, Role, Sim, SimServer, Step};

fn request(
    command: Document,
    kind: OperationKind,
    cursor: CursorUse,
    session: Option<SessionHandle>,
) -> OperationRequest {
    let mut request = OperationRequest::new("test", command, kind, SelectionCriteria::Write);
    request.cursor = cursor;
    request.session = session;
    request
}

/// An LB with `maxPoolSize=1`: a transaction's insert pins the only connection and a find in
/// the transaction opens cursor 42 on it; `then` answers the command after the find.
fn cursor_in_a_transaction(then: Vec<Step>) -> (Sim, SessionHandle, CursorHandle) {
    let mut lb = SimServer::new(Role::LoadBalancer { service_id: true });
    lb.script.extend([
        Step::reply(doc! { "ok": 1, "n": 1 }),
        Step::reply(doc! { "ok": 1, "cursor": { "id": 42_i64, "ns": "test.c", "firstBatch": [] } }),
    ]);
    lb.script.extend(then);
    let mut sim = Sim::new(vec![(address("lb"), lb)], |o| {
        o.topology.load_balanced = true;
        o.topology.pool.max_pool_size = 1;
    });
    let session = sim.engine.start_session();
    let insert = sim.start_request(request(
        doc! { "insert": "c", "documents": [{}] },
        OperationKind::InTransaction {
            read: false,
            first: true,
        },
        CursorUse::None,
        Some(session),
    ));
    sim.run(insert).expect("the insert pins the connection");
    let find = sim.start_request(request(
        doc! { "find": "c", "batchSize": 1 },
        OperationKind::InTransaction {
            read: true,
            first: false,
        },
        CursorUse::Open,
        Some(session),
    ));
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
    let other = sim.start_request(request(
        doc! { "find": "d" },
        OperationKind::Read,
        CursorUse::None,
        None,
    ));
    sim.advance_to(sim.now.saturating_add(std::time::Duration::from_millis(10)));
    assert!(
        sim.result(other).is_none(),
        "waits for the cursor's connection"
    );
    let close = sim.start_request(request(
        doc! { "killCursors": "c", "cursors": [42_i64] },
        OperationKind::RunCommand,
        CursorUse::Close(cursor),
        None,
    ));
    sim.run(close).expect("the cursor closes");
    sim.run(other).expect("then the other operation runs");
    assert_eq!(
        sim.checkouts_and_checkins(),
        ["out", "in", "out", "in"],
        "one check-in per checkout"
    );
    let log: Vec<&str> = sim.servers[&address("lb")]
        .log
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        log.last(),
        Some(&"find"),
        "the other find ran after the killCursors"
    );
}

/// TX-4 (5), LB-10: after a commit, a getMore naming the session runs outside the transaction
/// and unpins the session, but the cursor keeps the connection.
#[test]
fn tx4_lb10_a_get_more_naming_the_session_after_a_commit_keeps_the_cursors_connection() {
    let (mut sim, session, cursor) = cursor_in_a_transaction(vec![
        Step::reply(doc! { "ok": 1 }),
        Step::reply(doc! { "ok": 1, "cursor": { "id": 42_i64, "ns": "test.c", "nextBatch": [] } }),
    ]);
    let commit = sim.start_request(request(
        doc! { "commitTransaction": 1 },
        OperationKind::CommitTransaction { again: false },
        CursorUse::None,
        Some(session),
    ));
    sim.run(commit).expect("committed");
    let more = sim.start_request(request(
        doc! { "getMore": 42_i64, "collection": "c" },
        OperationKind::GetMore,
        CursorUse::GetMore(cursor),
        Some(session),
    ));
    sim.run(more)
        .expect("the getMore runs on the cursor's connection");
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
    let abort = sim.start_request(request(
        doc! { "abortTransaction": 1 },
        OperationKind::AbortTransaction,
        CursorUse::None,
        Some(session),
    ));
    sim.run(abort).expect("aborted");
    assert_cursor_holds_the_connection(sim, cursor);
}

/// TX-4 (4), LB-10: a new transaction unpins the session; the cursor keeps the connection.
#[test]
fn tx4_lb10_a_new_transaction_leaves_the_cursor_its_connection() {
    let (mut sim, session, cursor) = cursor_in_a_transaction(vec![Step::reply(doc! { "ok": 1 })]);
    let commit = sim.start_request(request(
        doc! { "commitTransaction": 1 },
        OperationKind::CommitTransaction { again: false },
        CursorUse::None,
        Some(session),
    ));
    sim.run(commit).expect("committed");
    sim.engine
        .start_transaction(session, Default::default(), sim.now)
        .expect("a new transaction");
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
    let insert = sim.start_request(request(
        doc! { "insert": "c", "documents": [{}] },
        OperationKind::InTransaction {
            read: false,
            first: false,
        },
        CursorUse::None,
        Some(session),
    ));
    sim.run(insert).expect_err("the write conflict");
    assert_cursor_holds_the_connection(sim, cursor);
}

/// LB-10, TX-5: two cursors of one transaction share its connection; after the abort, the
/// first cursor's end leaves it to the second, whose end checks it in.
#[test]
fn lb10_the_last_of_two_cursors_on_a_connection_checks_it_in() {
    let (mut sim, session, first) = cursor_in_a_transaction(vec![Step::reply(
        doc! { "ok": 1, "cursor": { "id": 43_i64, "ns": "test.c", "firstBatch": [] } },
    )]);
    let find = sim.start_request(request(
        doc! { "find": "c", "batchSize": 1 },
        OperationKind::InTransaction {
            read: true,
            first: false,
        },
        CursorUse::Open,
        Some(session),
    ));
    sim.run(find).expect("a second cursor");
    let second = sim.cursor_opened(find).expect("a cursor opened");
    let abort = sim.start_request(request(
        doc! { "abortTransaction": 1 },
        OperationKind::AbortTransaction,
        CursorUse::None,
        Some(session),
    ));
    sim.run(abort).expect("aborted");
    let close = sim.start_request(request(
        doc! { "killCursors": "c", "cursors": [43_i64] },
        OperationKind::RunCommand,
        CursorUse::Close(second),
        None,
    ));
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
    let commit = sim.start_request(request(
        doc! { "commitTransaction": 1 },
        OperationKind::CommitTransaction { again: false },
        CursorUse::None,
        Some(session),
    ));
    sim.run(commit).expect("committed");
    let close = sim.start_request(request(
        doc! { "killCursors": "c", "cursors": [42_i64] },
        OperationKind::RunCommand,
        CursorUse::Close(cursor),
        Some(session),
    ));
    let other = sim.start_request(request(
        doc! { "find": "d" },
        OperationKind::Read,
        CursorUse::None,
        None,
    ));
    sim.run(close).expect("the cursor closes");
    sim.run(other).expect("then the other operation runs");
    assert_eq!(
        sim.checkouts_and_checkins(),
        ["out", "in", "out", "in"],
        "one check-in per checkout"
    );
    let log: Vec<&str> = sim.servers[&address("lb")]
        .log
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(log[log.len() - 2..], ["killCursors", "find"]);
}

/// TX-5, LB-10, house rule 8: a killCursors naming the session while its new transaction is
/// starting runs as the transaction's first command, on the cursor's connection, which the
/// transaction then pins: the cursor's end does not check it in under the transaction; the
/// next transaction's start does, once.
#[test]
fn tx5_lb10_a_kill_cursors_that_starts_a_transaction_leaves_it_the_connection() {
    let mut lb = SimServer::new(Role::LoadBalancer { service_id: true });
    lb.script.extend([
        Step::reply(doc! { "ok": 1, "cursor": { "id": 42_i64, "ns": "test.c", "firstBatch": [] } }),
        Step::reply(doc! { "ok": 1, "cursorsKilled": [42_i64] }),
    ]);
    let mut sim = Sim::new(vec![(address("lb"), lb)], |o| {
        o.topology.load_balanced = true;
        o.topology.pool.max_pool_size = 1;
    });
    let session = sim.engine.start_session();
    let find = sim.start_request(request(
        doc! { "find": "c", "batchSize": 1 },
        OperationKind::Read,
        CursorUse::Open,
        Some(session),
    ));
    sim.run(find).expect("a cursor outside any transaction");
    let cursor = sim.cursor_opened(find).expect("a cursor opened");
    sim.engine
        .start_transaction(session, Default::default(), sim.now)
        .expect("a transaction");
    let close = sim.start_request(request(
        doc! { "killCursors": "c", "cursors": [42_i64] },
        OperationKind::RunCommand,
        CursorUse::Close(cursor),
        Some(session),
    ));
    sim.run(close).expect("the cursor closes");
    assert_eq!(
        sim.checkouts_and_checkins(),
        ["out"],
        "the transaction pins it now"
    );
    let other = sim.start_request(request(
        doc! { "find": "d" },
        OperationKind::Read,
        CursorUse::None,
        None,
    ));
    sim.advance_to(sim.now.saturating_add(std::time::Duration::from_millis(10)));
    assert!(
        sim.result(other).is_none(),
        "waits for the pinned connection"
    );
    let commit = sim.start_request(request(
        doc! { "commitTransaction": 1 },
        OperationKind::CommitTransaction { again: false },
        CursorUse::None,
        Some(session),
    ));
    sim.run(commit).expect("committed");
    sim.engine
        .start_transaction(session, Default::default(), sim.now)
        .expect("the next transaction");
    sim.drain();
    sim.run(other).expect("then the other operation runs");
    assert_eq!(sim.checkouts_and_checkins(), ["out", "in", "out", "in"]);
}

/// LB-11, house rule 8: two cursors of a transaction share its connection; a getMore of one
/// fails on the network: neither cursor sends a killCursors, and closing both checks the dead
/// connection in once (it was never checked in before; the second close used to find its
/// socket gone and left it checked out for ever).
#[test]
fn lb11_a_network_error_under_one_of_two_cursors_on_a_connection_releases_it_once() {
    let (mut sim, session, first) = cursor_in_a_transaction(vec![
        Step::reply(doc! { "ok": 1, "cursor": { "id": 43_i64, "ns": "test.c", "firstBatch": [] } }),
        Step::Reset,
    ]);
    let find = sim.start_request(request(
        doc! { "find": "c", "batchSize": 1 },
        OperationKind::InTransaction {
            read: true,
            first: false,
        },
        CursorUse::Open,
        Some(session),
    ));
    sim.run(find).expect("a second cursor");
    let second = sim.cursor_opened(find).expect("a cursor opened");
    let more = sim.start_request(request(
        doc! { "getMore": 42_i64, "collection": "c" },
        OperationKind::GetMore,
        CursorUse::GetMore(first),
        None,
    ));
    sim.run(more).expect_err("the connection is reset");
    for (cursor, id) in [(first, 42_i64), (second, 43)] {
        let close = sim.start_request(request(
            doc! { "killCursors": "c", "cursors": [id] },
            OperationKind::RunCommand,
            CursorUse::Close(cursor),
            None,
        ));
        let _ = sim.run(close);
    }
    sim.engine.end_session(session, sim.now);
    sim.drain();
    assert_eq!(
        sim.checkouts_and_checkins(),
        ["out", "in"],
        "checked in once"
    );
    let log: Vec<&str> = sim.servers[&address("lb")]
        .log
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(
        !log.contains(&"killCursors"),
        "LB-11: no killCursors: {log:?}"
    );
}
