//! The transaction state kept in the engine's session (review5 items 3-6), end to end in virtual
//! time against a scripted mongos: ending a session sends the abort it started even when that
//! abort has to wait, and retries it (TX-2, TX-10); a cursor of an ended session is still killed
//! (SE-13, SE-14); a transaction is "starting" until its first command is written (TX-2); an
//! operation naming the session through a bare request joins its transaction (TX-1).

use std::time::Duration;

use bson::{doc, Bson};
use retry_core::engine::{OpId, OperationRequest, SessionHandle};
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;
use retry_core::transaction::{TransactionOptions, TransactionState};

use retry_sim::{abort, get_more, insert, kill_cursors, open_cursor, request, Sim, Step};

/// One mongos that records what it receives, with `script`, a pool of one connection and a
/// 1 s server selection timeout.
fn mongos(script: Vec<Step>) -> Sim {
    Sim::mongos(script, |o| {
        o.topology.pool.max_pool_size = 1;
        o.selection.server_selection_timeout = Duration::from_secs(1);
    })
}

fn retryable_insert(session: Option<SessionHandle>) -> OperationRequest {
    insert(OperationKind::RetryableWrite).with_session(session)
}

/// TX-2, TX-10, SE-12 (review5 item 3): ending a session with a transaction in progress starts
/// its `abortTransaction`, which here must wait for the pool's only connection (an implicit
/// `find` holds it); the abort is still sent once that connection is free, with the session's
/// lsid, the transaction's txnNumber and `autocommit: false`.
#[test]
fn tx2_ending_a_session_sends_its_abort_after_waiting_for_a_connection() {
    let mut sim = mongos(vec![
        Step::reply(doc! { "ok": 1, "n": 1 }),
        Step::Reply {
            body: doc! { "ok": 1, "cursor": { "id": 0_i64, "ns": "test.c", "firstBatch": [] } },
            delay: Duration::from_millis(500),
        },
    ]);
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(retryable_insert(Some(session)));
    sim.run(first).unwrap();
    let busy = sim.start_request(request(doc! { "find": "c" }, OperationKind::Read));
    sim.drain();
    let aborted = sim.start_request(abort(session));
    sim.engine.end_session(session, sim.now);
    sim.drain();
    assert!(sim.result(aborted).is_none(), "waiting for the connection");
    sim.run(busy).unwrap();
    sim.run(aborted).expect("the abort is sent and answered");
    let aborts = sim.received("m", "abortTransaction");
    assert_eq!(aborts.len(), 1, "{aborts:?}");
    let statement = &sim.received("m", "insert")[0];
    assert_eq!(aborts[0].get("lsid"), statement.get("lsid"));
    assert_eq!(aborts[0].get("txnNumber"), statement.get("txnNumber"));
    assert_eq!(aborts[0].get("autocommit"), Some(&Bson::Boolean(false)));
}

/// TX-10 (review5 item 3): the abort a session's end started is retried once after a network
/// error, although the session is ending.
#[test]
fn tx10_the_abort_of_an_ending_session_is_retried_after_a_network_error() {
    let mut sim = mongos(vec![Step::reply(doc! { "ok": 1, "n": 1 }), Step::Reset]);
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(retryable_insert(Some(session)));
    sim.run(first).unwrap();
    let aborted = sim.start_request(abort(session));
    sim.engine.end_session(session, sim.now);
    sim.drain();
    sim.run(aborted).expect("the retry succeeds");
    assert_eq!(sim.received("m", "abortTransaction").len(), 2);
}

/// SE-13, SE-14 (review5 item 6): a cursor opened in an explicit session that has since ended
/// is still killed: its `killCursors` goes out naming the cursor, without an lsid.
#[test]
fn se13_a_cursor_of_an_ended_session_is_killed_without_an_lsid() {
    let mut sim = mongos(vec![Step::reply(
        doc! { "ok": 1, "cursor": { "id": 42_i64, "ns": "test.c", "firstBatch": [{}] } },
    )]);
    let session = sim.engine.start_session();
    let find = open_cursor(OperationKind::Read).with_session(session);
    let find = sim.start_request(find);
    sim.run(find).unwrap();
    let cursor = sim.cursor_opened(find).expect("a cursor");
    sim.engine.end_session(session, sim.now);
    sim.drain();
    // As `Cursor::drop` and the unified runner send it: naming the (ended) session.
    let close = kill_cursors(42_i64, cursor).with_session(session);
    let close = sim.start_request(close);
    sim.run(close).expect("killCursors sent");
    let kills = sim.received("m", "killCursors");
    assert_eq!(kills.len(), 1);
    assert_eq!(
        kills[0].get_array("cursors").unwrap(),
        &vec![Bson::Int64(42)]
    );
    assert!(
        !kills[0].contains_key("lsid"),
        "SE-13: no lsid of an ended session"
    );
}

/// TX-1, TX-2 (review5 item 4, `errors-client.json` "Client side error in command starting
/// transaction"): a first command that is never written (cancelled while it waits for a
/// connection, as when a caller drops its future) leaves
/// the transaction starting; the next command starts it, with `startTransaction: true` and a
/// txnNumber above every earlier one, and a commit before it would have sent nothing.
#[test]
fn tx2_a_first_command_not_written_leaves_the_transaction_starting() {
    let mut sim = mongos(vec![
        Step::reply(doc! { "ok": 1, "n": 1 }),
        Step::Reply {
            body: doc! { "ok": 1, "cursor": { "id": 0_i64, "ns": "test.c", "firstBatch": [] } },
            delay: Duration::from_secs(5),
        },
    ]);
    let session = sim.engine.start_session();
    let plain = sim.start_request(retryable_insert(Some(session)));
    sim.run(plain).unwrap();
    sim.begin_transaction(session);
    // The pool's only connection is busy for 5 s: the first command waits for it.
    let busy = sim.start_request(request(doc! { "find": "c" }, OperationKind::Read));
    sim.drain();
    let lost = sim.start_request(retryable_insert(Some(session)));
    sim.advance_to(sim.now.saturating_add(Duration::from_millis(100)));
    assert!(sim.result(lost).is_none(), "waiting for the connection");
    sim.engine.cancel_operation(lost, sim.now);
    sim.drain();
    assert!(sim.run(lost).is_err(), "cancelled before it was written");
    assert_eq!(
        sim.engine.transaction_state(session),
        Some(TransactionState::Starting)
    );
    sim.run(busy).unwrap();
    let started = sim.start_request(retryable_insert(Some(session)));
    sim.run(started).unwrap();
    assert_eq!(
        sim.engine.transaction_state(session),
        Some(TransactionState::InProgress)
    );
    let inserts = sim.received("m", "insert");
    let last = inserts.last().unwrap();
    assert_eq!(last.get("startTransaction"), Some(&Bson::Boolean(true)));
    assert_eq!(last.get("autocommit"), Some(&Bson::Boolean(false)));
    let earlier = inserts[0].get_i64("txnNumber").unwrap();
    assert!(last.get_i64("txnNumber").unwrap() > earlier, "{inserts:?}");
}

/// TX-1 (review5 item 5): during a transaction, a `RetryableWrite` sent through a bare request
/// naming the session (not through a driver's session object) runs as a transaction statement:
/// the transaction's txnNumber, `autocommit: false`, no `startTransaction`.
#[test]
fn tx1_a_bare_request_naming_the_session_joins_its_transaction() {
    let mut sim = mongos(Vec::new());
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(retryable_insert(Some(session)));
    sim.run(first).unwrap();
    let bare: OpId = sim.start_request(retryable_insert(Some(session)));
    sim.run(bare).unwrap();
    let inserts = sim.received("m", "insert");
    assert_eq!(inserts.len(), 2);
    assert_eq!(inserts[1].get("txnNumber"), inserts[0].get("txnNumber"));
    assert_eq!(inserts[1].get("autocommit"), Some(&Bson::Boolean(false)));
    assert!(!inserts[1].contains_key("startTransaction"));
    assert_eq!(
        inserts[0].get("startTransaction"),
        Some(&Bson::Boolean(true))
    );
}

/// TX-1 (`commit.json` "multiple commits after empty transaction"): the `txnNumber` is
/// incremented at `startTransaction`, so a transaction that wrote nothing still uses a number:
/// the third transaction's first command carries 3.
#[test]
fn tx1_an_empty_transaction_still_takes_a_txn_number() {
    let mut sim = mongos(Vec::new());
    let session = sim.engine.start_session();
    let commit = || {
        OperationRequest::new(
            "admin",
            doc! { "commitTransaction": 1 },
            OperationKind::CommitTransaction { again: false },
            SelectionCriteria::Write,
        )
    };
    for write in [true, false, true] {
        sim.begin_transaction(session);
        if write {
            let op = sim.start_request(retryable_insert(Some(session)));
            sim.run(op).unwrap();
        }
        let mut end = commit();
        end.session = Some(session);
        let op = sim.start_request(end);
        sim.run(op).unwrap();
    }
    let numbers: Vec<i64> = sim.txn_numbers("m", "insert");
    assert_eq!(numbers, [1, 3]);
    assert_eq!(
        sim.received("m", "commitTransaction").len(),
        2,
        "TX-2: none for the empty one"
    );
}

/// TX-1 (the transactions spec: concerns and read preference in a transaction): an operation's
/// own `writeConcern` in a transaction is a usage error, an inherited one is dropped (here an
/// inherited `w: 0`, which outside a transaction an explicit session refuses, SE-13), and a
/// read preference other than primary is a usage error; none of them changes the transaction.
#[test]
fn tx1_concerns_and_read_preference_inside_a_transaction() {
    let mut sim = mongos(Vec::new());
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let own = |inherited: bool| {
        let mut request = retryable_insert(Some(session));
        request.command.insert("writeConcern", doc! { "w": 0 });
        request.concerns_inherited = inherited;
        request
    };
    let refused = sim.start_request(own(false));
    let error = sim.run(refused).unwrap_err();
    assert!(error.to_string().contains("writeConcern"), "{error}");
    let mut secondary = request(doc! { "find": "c" }, OperationKind::Read).with_session(session);
    secondary.criteria = SelectionCriteria::Read(retry_core::selection::ReadPreference::from_mode(
        retry_core::selection::ReadPreferenceMode::Secondary,
    ));
    let secondary = sim.start_request(secondary);
    let error = sim.run(secondary).unwrap_err();
    assert!(error.to_string().contains("must be primary"), "{error}");
    assert_eq!(
        sim.engine.transaction_state(session),
        Some(TransactionState::Starting)
    );
    let inherited = sim.start_request(own(true));
    sim.run(inherited).expect("the inherited w: 0 is dropped");
    let inserts = sim.received("m", "insert");
    assert_eq!(inserts.len(), 1);
    assert!(!inserts[0].contains_key("writeConcern"), "{}", inserts[0]);
    assert_eq!(
        inserts[0].get("startTransaction"),
        Some(&Bson::Boolean(true))
    );
}

/// SE-14, TX-1: a `getMore` sent without naming the session continues the cursor's session and
/// so its transaction: the transaction's `txnNumber` and `autocommit: false`.
#[test]
fn tx1_a_get_more_of_a_transaction_cursor_joins_the_transaction() {
    let mut sim = mongos(vec![
        Step::reply(
            doc! { "ok": 1, "cursor": { "id": 42_i64, "ns": "test.c", "firstBatch": [{}] } },
        ),
        Step::reply(doc! { "ok": 1, "cursor": { "id": 0_i64, "ns": "test.c", "nextBatch": [] } }),
    ]);
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let find = open_cursor(OperationKind::Read).with_session(session);
    let find = sim.start_request(find);
    sim.run(find).unwrap();
    let cursor = sim.cursor_opened(find).expect("a cursor");
    let get_more = get_more(42_i64, cursor);
    let get_more = sim.start_request(get_more);
    sim.run(get_more).unwrap();
    let finds = sim.received("m", "find");
    let get_mores = sim.received("m", "getMore");
    assert_eq!(get_mores[0].get("txnNumber"), finds[0].get("txnNumber"));
    assert_eq!(get_mores[0].get("autocommit"), Some(&Bson::Boolean(false)));
    assert!(!get_mores[0].contains_key("startTransaction"));
}

/// TX-2 (`write-concern.json` "start with unacknowledged write concern"): a transaction cannot
/// start with `w: 0`; the usage error leaves the session without a transaction.
#[test]
fn tx2_a_transaction_cannot_start_unacknowledged() {
    let mut sim = mongos(Vec::new());
    let session = sim.engine.start_session();
    let options = TransactionOptions::default().with_write_concern(doc! { "w": 0 });
    let error = sim
        .engine
        .start_transaction(session, options, sim.now)
        .unwrap_err();
    assert!(error.to_string().contains("unacknowledged"), "{error}");
    assert_eq!(
        sim.engine.transaction_state(session),
        Some(TransactionState::None)
    );
}
