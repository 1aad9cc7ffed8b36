//! TX-1, SE-14 (review37 W1): a getMore runs in its cursor's session, and inside that session's
//! transaction only when the cursor was opened in it, whatever session the request names. A
//! getMore never starts a transaction (a real server refuses a getMore of a cursor opened outside
//! the transaction, 50739, and `startTransaction` on it makes no sense), and a request naming
//! another session than the cursor's is refused.

use bson::Document;
use retry_core::error::ErrorKind;
use retry_core::retry::OperationKind;
use retry_core::transaction::TransactionState;
use retry_sim::{cursor_batch, get_more, insert, open_cursor, Sim, Step, FIRST_WRITE};

/// A mongos that answers every command (four at most) with cursor 42.
fn sim() -> Sim {
    Sim::mongos(
        [
            Step::reply(cursor_batch(42, "firstBatch")),
            Step::reply(cursor_batch(42, "nextBatch")),
            Step::reply(cursor_batch(42, "nextBatch")),
            Step::reply(cursor_batch(42, "nextBatch")),
        ],
        |_| {},
    )
}

fn assert_outside_a_transaction(get_more: &Document) {
    for field in ["txnNumber", "autocommit", "startTransaction", "readConcern"] {
        assert!(!get_more.contains_key(field), "{field} on {get_more}");
    }
    assert!(
        get_more.contains_key("lsid"),
        "the cursor's session: {get_more}"
    );
}

/// TX-1, SE-14 (review37 W1): a getMore naming its explicit session, whose cursor was opened
/// before the transaction started, goes out without transaction fields, and leaves the
/// transaction starting (the getMore is not its first command).
#[test]
fn tx1_se14_a_get_more_does_not_start_the_sessions_transaction() {
    let mut sim = sim();
    let session = sim.engine.start_session();
    let find = sim.start_request(open_cursor(OperationKind::Read).with_session(session));
    sim.run(find).expect("the cursor opens");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    sim.begin_transaction(session);
    let more = sim.start_request(get_more(42, cursor).with_session(session));
    sim.run(more).expect("the getMore runs");
    let sent = sim.received("m", "getMore");
    assert_eq!(sent.len(), 1);
    assert_outside_a_transaction(sent[0]);
    assert_eq!(
        sim.engine.transaction_state(session),
        Some(TransactionState::Starting),
        "TX-2: the transaction has not started"
    );
}

/// TX-1, SE-14 (review37 W1): with the transaction in progress, a getMore of a cursor opened
/// before it runs outside it (no txnNumber / autocommit); the transaction keeps its state, and
/// its next statement is not its first.
#[test]
fn tx1_se14_a_get_more_of_a_cursor_from_before_the_transaction_stays_outside_it() {
    let mut sim = sim();
    let session = sim.engine.start_session();
    let find = sim.start_request(open_cursor(OperationKind::Read).with_session(session));
    sim.run(find).expect("the cursor opens");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    sim.begin_transaction(session);
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).expect("the transaction starts");
    let more = sim.start_request(get_more(42, cursor).with_session(session));
    sim.run(more).expect("the getMore runs");
    let sent = sim.received("m", "getMore");
    assert_eq!(sent.len(), 1);
    assert_outside_a_transaction(sent[0]);
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

/// TX-1 (review37 W1): a getMore of a cursor opened in the active transaction joins it: the
/// transaction's txnNumber and `autocommit: false`, no `startTransaction`.
#[test]
fn tx1_a_get_more_of_a_cursor_opened_in_the_transaction_joins_it() {
    let mut sim = sim();
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let find = sim.start_request(open_cursor(OperationKind::Read).with_session(session));
    sim.run(find).expect("the cursor opens in the transaction");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    let more = sim.start_request(get_more(42, cursor).with_session(session));
    sim.run(more).expect("the getMore runs");
    let finds = sim.txn_numbers("m", "find");
    let sent = sim.received("m", "getMore");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].get_i64("txnNumber").ok(), finds.first().copied());
    assert_eq!(sent[0].get_bool("autocommit").ok(), Some(false));
    assert!(!sent[0].contains_key("startTransaction"), "{}", sent[0]);
}

/// SE-14 (review37 W1): a getMore naming another session than its cursor's is refused before
/// anything is sent, and the named session's transaction is left alone.
#[test]
fn se14_a_get_more_naming_another_session_is_refused() {
    let mut sim = sim();
    let (owner, other) = (sim.engine.start_session(), sim.engine.start_session());
    let find = sim.start_request(open_cursor(OperationKind::Read).with_session(owner));
    sim.run(find).expect("the cursor opens");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    sim.begin_transaction(other);
    let more = sim.start_request(get_more(42, cursor).with_session(other));
    let error = sim.run(more).expect_err("refused");
    assert!(matches!(error.kind, ErrorKind::Usage { .. }), "{error}");
    assert!(sim.received("m", "getMore").is_empty());
    assert_eq!(
        sim.engine.transaction_state(other),
        Some(TransactionState::Starting)
    );
}
