//! TX-1, SE-14, TX-4 (5) (engine21's leftover): a `killCursors` joins its session's transaction
//! only when its cursor was opened in that very transaction, still active, whatever session the
//! request names; it then carries the transaction's `txnNumber` and `autocommit: false`, never
//! `startTransaction` nor `readConcern`. Otherwise it carries only the cursor's `lsid`. A real
//! server allows `killCursors` in a transaction (jstests `kill_cursors_in_transaction.js`), refuses
//! it as a transaction's first command (OperationNotSupportedInTransaction, 263), and kills a
//! transaction's cursor from outside it too (`kill_txn_cursor.js`).

use bson::Document;
use retry_core::error::ErrorKind;
use retry_core::retry::OperationKind;
use retry_core::transaction::TransactionState;
use retry_sim::{
    commit, cursor_batch, insert, kill_cursors, open_cursor, Sim, Step, FIRST_WRITE, LATER_READ,
};

/// A mongos whose first commands (three at most) answer with cursor 42; `{ok: 1}` after.
fn sim() -> Sim {
    Sim::mongos(
        [
            Step::reply(cursor_batch(42, "firstBatch")),
            Step::reply(cursor_batch(42, "firstBatch")),
            Step::reply(cursor_batch(42, "firstBatch")),
        ],
        |_| {},
    )
}

fn assert_outside_a_transaction(kill: &Document) {
    for field in ["txnNumber", "autocommit", "startTransaction", "readConcern"] {
        assert!(!kill.contains_key(field), "{field} on {kill}");
    }
    assert!(kill.contains_key("lsid"), "the cursor's session: {kill}");
}

fn the_kill(sim: &Sim) -> &Document {
    let sent = sim.received("m", "killCursors");
    assert_eq!(sent.len(), 1, "one killCursors");
    sent[0]
}

/// TX-1 (engine21's leftover): the killCursors of a cursor opened in the active transaction joins
/// it, named or not: the transaction's txnNumber and `autocommit: false`, no `startTransaction`,
/// no `readConcern`.
#[test]
fn tx1_a_kill_cursors_of_a_cursor_opened_in_the_transaction_joins_it() {
    for named in [true, false] {
        let mut sim = sim();
        let session = sim.engine.start_session();
        sim.begin_transaction(session);
        let find = sim.start_request(open_cursor(OperationKind::Read).with_session(session));
        sim.run(find).expect("the cursor opens in the transaction");
        let cursor = sim.cursor_opened(find).expect("a cursor");
        let kill = kill_cursors(42, cursor).with_session(named.then_some(session));
        let close = sim.start_request(kill);
        sim.run(close).expect("the killCursors runs");
        let finds = sim.txn_numbers("m", "find");
        let kill = the_kill(&sim);
        assert_eq!(kill.get_i64("txnNumber").ok(), finds.first().copied());
        assert_eq!(kill.get_bool("autocommit").ok(), Some(false), "{kill}");
        assert!(!kill.contains_key("startTransaction"), "{kill}");
        assert!(!kill.contains_key("readConcern"), "{kill}");
        assert_eq!(
            sim.engine.transaction_state(session),
            Some(TransactionState::InProgress)
        );
    }
}

/// TX-1, TX-2 (engine21's leftover): a killCursors naming its session while the session's new
/// transaction is starting, of a cursor opened before it, does not start the transaction (a real
/// server refuses killCursors as a first command, 263): no transaction fields, the cursor's
/// `lsid`; the transaction's next statement is still its first.
#[test]
fn tx1_a_kill_cursors_never_starts_the_sessions_transaction() {
    let mut sim = sim();
    let session = sim.engine.start_session();
    let find = sim.start_request(open_cursor(OperationKind::Read).with_session(session));
    sim.run(find).expect("the cursor opens");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    sim.begin_transaction(session);
    let close = sim.start_request(kill_cursors(42, cursor).with_session(session));
    sim.run(close).expect("the killCursors runs");
    assert_outside_a_transaction(the_kill(&sim));
    assert_eq!(
        sim.engine.transaction_state(session),
        Some(TransactionState::Starting),
        "TX-2: the transaction has not started"
    );
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).expect("the transaction starts");
    let inserts = sim.received("m", "insert");
    assert_eq!(inserts[0].get_bool("startTransaction").ok(), Some(true));
}

/// TX-1, TX-3 (engine21's leftover): with the transaction in progress, the killCursors of a
/// cursor opened before it runs outside it; the transaction keeps its state and its pin.
#[test]
fn tx1_a_kill_cursors_of_a_cursor_from_before_the_transaction_stays_outside_it() {
    let mut sim = sim();
    let session = sim.engine.start_session();
    let find = sim.start_request(open_cursor(OperationKind::Read).with_session(session));
    sim.run(find).expect("the cursor opens");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    sim.begin_transaction(session);
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).expect("the transaction starts");
    let close = sim.start_request(kill_cursors(42, cursor).with_session(session));
    sim.run(close).expect("the killCursors runs");
    assert_outside_a_transaction(the_kill(&sim));
    assert_eq!(
        sim.engine.transaction_state(session),
        Some(TransactionState::InProgress)
    );
    let info = sim.engine.session_info(session).expect("open");
    assert!(
        info.pinned.is_some(),
        "TX-3: the active transaction keeps its pin"
    );
}

/// TX-1, TX-4 (5) (engine21's leftover): after the transaction committed, the killCursors of a
/// cursor opened in it, naming the session, runs outside any transaction and unpins the session.
#[test]
fn tx4_a_kill_cursors_after_the_commit_runs_outside_and_unpins() {
    let mut sim = sim();
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).expect("the transaction starts");
    let find = sim.start_request(open_cursor(LATER_READ).with_session(session));
    sim.run(find).expect("the cursor opens in the transaction");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    let commit = sim.start_request(commit(session));
    sim.run(commit).expect("committed");
    assert!(
        sim.engine
            .session_info(session)
            .is_some_and(|i| i.pinned.is_some()),
        "TX-4: a commit does not unpin"
    );
    let close = sim.start_request(kill_cursors(42, cursor).with_session(session));
    sim.run(close).expect("the killCursors runs");
    assert_outside_a_transaction(the_kill(&sim));
    let info = sim.engine.session_info(session).expect("open");
    assert_eq!(info.pinned, None, "TX-4 (5): unpinned");
    assert!(
        matches!(info.transaction, TransactionState::Committed { .. }),
        "{:?}",
        info.transaction
    );
}

/// SE-14 (engine21's leftover): a killCursors naming another session than its cursor's is
/// refused before anything is sent, and the named session's transaction is left alone.
#[test]
fn se14_a_kill_cursors_naming_another_session_is_refused() {
    let mut sim = sim();
    let (owner, other) = (sim.engine.start_session(), sim.engine.start_session());
    let find = sim.start_request(open_cursor(OperationKind::Read).with_session(owner));
    sim.run(find).expect("the cursor opens");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    sim.begin_transaction(other);
    let close = sim.start_request(kill_cursors(42, cursor).with_session(other));
    let error = sim.run(close).expect_err("refused");
    assert!(matches!(error.kind, ErrorKind::Usage { .. }), "{error}");
    assert!(sim.received("m", "killCursors").is_empty());
    assert_eq!(
        sim.engine.transaction_state(other),
        Some(TransactionState::Starting)
    );
}
