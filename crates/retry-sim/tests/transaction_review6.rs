//! Review6 findings 2, 4, 5 and 6 on the engine's transactions, end to end in virtual time
//! against a scripted mongos: one `txnNumber` per transaction and one command that starts it
//! (TX-1, TX-2), a cursor's `getMore` inside a transaction only when the cursor was opened in it
//! (TX-1, SE-14), refused requests leave the state alone (TX-2), and the numbers of empty
//! transactions are skipped by every later number (TX-1).

use std::time::Duration;

use bson::{doc, Bson};
use retry_core::engine::{CursorHandle, OpId, OperationRequest, SessionHandle};
use retry_core::retry::OperationKind;
use retry_core::transaction::TransactionState;

use retry_sim::{commit, get_more, insert, open_cursor, request, Sim, Step};

/// One mongos that records what it receives, with `script`, a pool of one connection and a
/// 1 s server selection timeout.
fn mongos(script: Vec<Step>) -> Sim {
    Sim::mongos(script, |o| {
        o.topology.pool.max_pool_size = 1;
        o.selection.server_selection_timeout = Duration::from_secs(1);
    })
}

fn retryable_insert(session: SessionHandle) -> OperationRequest {
    insert(OperationKind::RetryableWrite).with_session(session)
}

/// A `find` without a session whose reply takes `delay`: it holds the pool's only connection.
fn busy(sim: &mut Sim) -> OpId {
    let op = sim.start_request(request(doc! { "find": "c" }, OperationKind::Read));
    sim.drain();
    op
}

fn slow_find_reply() -> Step {
    Step::Reply {
        body: doc! { "ok": 1, "cursor": { "id": 0_i64, "ns": "test.c", "firstBatch": [] } },
        delay: Duration::from_millis(500),
    }
}

/// TX-1, TX-2 (review6 finding 2): two commands mapped while the transaction is starting (both
/// wait for the only connection) do not each take a new `txnNumber` with `startTransaction`
/// (the second would abort the first's server transaction): the first one written starts the
/// transaction, the other is refused before it is sent, and the commit carries the first's
/// number.
#[test]
fn tx1_two_first_commands_in_flight_start_the_transaction_once() {
    let mut sim = mongos(vec![slow_find_reply()]);
    let session = sim.engine.start_session();
    let held = busy(&mut sim);
    sim.begin_transaction(session);
    let a = sim.start_request(retryable_insert(session));
    let b = sim.start_request(retryable_insert(session));
    sim.run(held).unwrap();
    sim.run(a).expect("the first one starts the transaction");
    let error = sim.run(b).unwrap_err();
    assert!(error.to_string().contains("already started"), "{error}");
    let end = sim.start_request(commit(session));
    sim.run(end).unwrap();
    let inserts = sim.received("m", "insert");
    assert_eq!(inserts.len(), 1, "{inserts:?}");
    assert_eq!(
        inserts[0].get("startTransaction"),
        Some(&Bson::Boolean(true))
    );
    let commits = sim.received("m", "commitTransaction");
    assert_eq!(commits[0].get("txnNumber"), inserts[0].get("txnNumber"));
}

/// TX-2 (review6 finding 2): a commit issued while the transaction's first command still waits
/// for a connection sends nothing (the transaction is starting) and the waiting command is then
/// refused instead of opening a server transaction that nobody would commit.
#[test]
fn tx2_a_commit_while_the_first_command_waits_leaves_nothing_open() {
    let mut sim = mongos(vec![slow_find_reply()]);
    let session = sim.engine.start_session();
    let held = busy(&mut sim);
    sim.begin_transaction(session);
    let first = sim.start_request(retryable_insert(session));
    let end = sim.start_request(commit(session));
    sim.run(end).expect("nothing to send");
    sim.run(held).unwrap();
    let error = sim.run(first).unwrap_err();
    assert!(error.to_string().contains("ended before"), "{error}");
    assert!(sim.received("m", "insert").is_empty());
    assert!(sim.received("m", "commitTransaction").is_empty());
    assert_eq!(
        sim.engine.transaction_state(session),
        Some(TransactionState::Committed { sent: false })
    );
}

fn opened_cursor(sim: &mut Sim, session: SessionHandle) -> CursorHandle {
    let find = sim.start_request(open_cursor(OperationKind::Read).with_session(session));
    sim.run(find).unwrap();
    sim.cursor_opened(find).expect("a cursor")
}

fn run_get_more(sim: &mut Sim, cursor: CursorHandle) {
    let op = sim.start_request(get_more(42, cursor));
    sim.run(op).unwrap();
}

fn cursor_reply(batch: &str, id: i64) -> Step {
    Step::reply(doc! { "ok": 1, "cursor": { "id": id, "ns": "test.c", batch: [{}] } })
}

/// TX-1, SE-14 (review6 finding 4): the `getMore` of a cursor opened before the transaction
/// started, or in an earlier transaction, carries the session's lsid but no `txnNumber`,
/// `autocommit` or `startTransaction` (a real server refuses those: 50739, 50741); the getMore of
/// a cursor opened in the current transaction joins it.
#[test]
fn tx1_se14_a_get_more_joins_only_the_transaction_its_cursor_was_opened_in() {
    let mut sim = mongos(vec![
        cursor_reply("firstBatch", 42),
        cursor_reply("nextBatch", 42),
        Step::reply(doc! { "ok": 1, "n": 1 }),
        cursor_reply("firstBatch", 42),
        Step::reply(doc! { "ok": 1 }),
        cursor_reply("nextBatch", 42),
    ]);
    let session = sim.engine.start_session();
    let outside = opened_cursor(&mut sim, session);
    sim.begin_transaction(session);
    run_get_more(&mut sim, outside);
    let first = sim.start_request(retryable_insert(session));
    sim.run(first).unwrap();
    let inside = opened_cursor(&mut sim, session);
    let end = sim.start_request(commit(session));
    sim.run(end).unwrap();
    sim.begin_transaction(session);
    run_get_more(&mut sim, inside);
    let finds = sim.received("m", "find");
    let get_mores = sim.received("m", "getMore");
    assert_eq!(get_mores.len(), 2);
    for g in &get_mores {
        assert_eq!(g.get("lsid"), finds[0].get("lsid"), "SE-14");
        for field in ["txnNumber", "autocommit", "startTransaction"] {
            assert!(!g.contains_key(field), "{field} in {g}");
        }
    }
}

/// TX-2, TX-11 (review5 finding 5): an operation refused after its mapping (an unacknowledged
/// write in the explicit session, SE-13) does not move a committed transaction to "no
/// transaction": commit can still be called again, and sends `commitTransaction`.
#[test]
fn tx2_a_refused_operation_leaves_a_committed_transaction_committed() {
    let mut sim = mongos(Vec::new());
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(retryable_insert(session));
    sim.run(first).unwrap();
    let end = sim.start_request(commit(session));
    sim.run(end).unwrap();
    let mut unacknowledged = retryable_insert(session);
    unacknowledged
        .command
        .insert("writeConcern", doc! { "w": 0 });
    let refused = sim.start_request(unacknowledged);
    assert!(sim.run(refused).is_err(), "SE-13");
    assert_eq!(
        sim.engine.transaction_state(session),
        Some(TransactionState::Committed { sent: true })
    );
    let again = sim.start_request(commit(session));
    sim.run(again).expect("TX-11: commit again");
    assert_eq!(sim.received("m", "commitTransaction").len(), 2);
}

/// TX-1 (review6 finding 6): an empty transaction's number is skipped by a later write outside
/// a transaction too, not only by the next transaction: 1 (transaction), 2 (empty
/// transaction), 3 (retryable write), 4 (transaction).
#[test]
fn tx1_an_empty_transactions_number_is_skipped_by_a_retryable_write() {
    let mut sim = mongos(Vec::new());
    let session = sim.engine.start_session();
    for write in [true, false] {
        sim.begin_transaction(session);
        if write {
            let op = sim.start_request(retryable_insert(session));
            sim.run(op).unwrap();
        }
        let op = sim.start_request(commit(session));
        sim.run(op).unwrap();
    }
    let plain = sim.start_request(retryable_insert(session));
    sim.run(plain).unwrap();
    sim.begin_transaction(session);
    let op = sim.start_request(retryable_insert(session));
    sim.run(op).unwrap();
    let numbers: Vec<i64> = sim.txn_numbers("m", "insert");
    assert_eq!(numbers, [1, 3, 4]);
}
