//! Requirements the coverage audit found without a test asserting them (session 21), end to end
//! through the engine against scripted servers in virtual time:
//!
//! - BP-23: writes retried for overload keep their `lsid` and `txnNumber`; inside a transaction
//!   the same `txnNumber`, and a retried first command still carries `startTransaction: true`.
//! - RW-15: every failed attempt of a retryable write goes through SDAM error handling before the
//!   retry selects a server.
//! - RR-11: a PoolClearedError at checkout is retried, SDAM is not updated for it, and when it is
//!   the first error it is the one kept ("previous"); with CSOT the retries stop at the deadline.

use std::time::Duration;

use bson::{doc, Bson, Document};
use retry_core::engine::{EngineEvent, OpId};
use retry_core::error::ErrorKind;
use retry_core::pool::PoolEvent;
use retry_core::retry::{OperationKind, RetryEvent, RetryReason};
use retry_core::time::OperationTimeout;
use retry_core::topology::{SdamEvent, ServerType};

use retry_sim::{
    address, commit, insert, overload, replica_set, request, Sim, Step, FIRST_WRITE, LATER_WRITE,
};

fn lsid(command: &Document) -> &Document {
    command.get_document("lsid").expect("an lsid")
}

/// The reasons of the retries the engine scheduled, in order.
fn retry_reasons(sim: &Sim) -> Vec<RetryReason> {
    sim.retries_scheduled()
        .into_iter()
        .map(|(_, r)| r)
        .collect()
}

/// BP-23, RW-7 (BP-5 for the second write): a retryable write retried twice for overload
/// (`SystemOverloadedError` + `RetryableError`) sends the same `lsid` and the same `txnNumber` on
/// all three attempts, and the retries use up no number: the session's next write takes the next
/// one. A write that is not a retryable write (`updateMany`, RW-4) is retried for overload too,
/// with the same `lsid` and still without a `txnNumber`.
#[test]
fn bp23_writes_retried_for_overload_keep_their_lsid_and_txn_number() {
    let mut sim = Sim::mongos(
        [
            Step::reply(overload(462)),
            Step::reply(overload(462)),
            Step::reply(doc! { "ok": 1, "n": 1 }),
            Step::reply(overload(462)),
        ],
        |_| {},
    );
    let write = sim.start_request(insert(OperationKind::RetryableWrite));
    sim.run(write).expect("the third attempt succeeds");
    assert_eq!(
        retry_reasons(&sim),
        [RetryReason::Overload, RetryReason::Overload]
    );
    let inserts = sim.received("m", "insert");
    assert_eq!(inserts.len(), 3);
    for attempt in &inserts {
        assert_eq!(lsid(attempt), lsid(inserts[0]), "BP-23: the same lsid");
        assert_eq!(
            attempt.get("txnNumber"),
            Some(&Bson::Int64(1)),
            "BP-23: {attempt}"
        );
    }
    let first_lsid = lsid(inserts[0]).clone();

    let many = sim.start_request(request(
        doc! { "update": "c", "updates": [{ "q": {}, "u": { "$set": { "x": 1 } }, "multi": true }] },
        OperationKind::NonRetryableWrite,
    ));
    sim.run(many).expect("the retry succeeds");
    let updates = sim.received("m", "update");
    assert_eq!(updates.len(), 2, "BP-5: retried for overload");
    for attempt in &updates {
        assert_eq!(lsid(attempt), &first_lsid, "the pooled session, kept");
        assert_eq!(attempt.get("txnNumber"), None, "RW-4: {attempt}");
    }

    let next = sim.start_request(insert(OperationKind::RetryableWrite));
    sim.run(next).unwrap();
    let last = *sim.received("m", "insert").last().unwrap();
    assert_eq!(lsid(last), &first_lsid, "SE-5: the same pooled session");
    assert_eq!(
        last.get("txnNumber"),
        Some(&Bson::Int64(2)),
        "RW-6: the retries took no number"
    );
}

/// BP-23, TX-12, TX-1: inside a transaction, the first command retried for overload is sent
/// again with `startTransaction: true` and the transaction's `txnNumber`; a later command retried
/// for overload keeps that `txnNumber` and carries no `startTransaction`; every attempt has the
/// session's `lsid` and `autocommit: false`, and the commit ends the same transaction.
#[test]
fn bp23_overload_retries_inside_a_transaction_keep_its_txn_number_and_start() {
    let mut sim = Sim::mongos(
        [
            Step::reply(overload(462)),
            Step::reply(doc! { "ok": 1, "n": 1 }),
            Step::reply(overload(462)),
        ],
        |_| {},
    );
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).expect("the retried first command succeeds");
    let later = sim.start_request(insert(LATER_WRITE).with_session(session));
    sim.run(later).expect("the retried later command succeeds");
    let done = sim.start_request(commit(session));
    sim.run(done).expect("the commit succeeds");
    assert_eq!(
        retry_reasons(&sim),
        [RetryReason::Overload, RetryReason::Overload]
    );

    let inserts = sim.received("m", "insert");
    assert_eq!(inserts.len(), 4, "two statements, each retried once");
    let starts: Vec<Option<&Bson>> = inserts.iter().map(|c| c.get("startTransaction")).collect();
    let yes = Some(&Bson::Boolean(true));
    assert_eq!(
        starts,
        [yes, yes, None, None],
        "TX-12: the retried first command still starts the transaction"
    );
    let commits = sim.received("m", "commitTransaction");
    assert_eq!(commits.len(), 1);
    let txn = inserts[0].get("txnNumber").expect("a txnNumber").clone();
    assert!(matches!(txn, Bson::Int64(_)), "{txn}");
    for command in inserts.iter().chain(&commits) {
        assert_eq!(command.get("txnNumber"), Some(&txn), "BP-23: {command}");
        assert_eq!(lsid(command), lsid(inserts[0]), "BP-23: {command}");
        assert_eq!(command.get("autocommit"), Some(&Bson::Boolean(false)));
    }
    assert!(!commits[0].contains_key("startTransaction"));
}

/// The position of the first event at or after `from` matching `f`, if any.
fn find_from(sim: &Sim, from: usize, f: impl Fn(&EngineEvent) -> bool) -> Option<usize> {
    sim.events
        .iter()
        .skip(from)
        .position(|(_, e)| f(e))
        .map(|i| i + from)
}

/// Whether `e` is the `n`-th attempt of `op` being written.
fn started(e: &EngineEvent, op: OpId, n: u32) -> bool {
    matches!(e, EngineEvent::Operation { op: o, event: RetryEvent::CommandStarted { attempt, .. } }
        if *o == op && *attempt == n)
}

/// Whether `e` is the `n`-th attempt of `op` failing.
fn failed(e: &EngineEvent, op: OpId, n: u32) -> bool {
    matches!(e, EngineEvent::Operation { op: o, event: RetryEvent::CommandFailed { attempt, .. } }
        if *o == op && *attempt == n)
}

/// Whether `e` makes the server at `host` Unknown.
fn marked_unknown(e: &EngineEvent, host: &str) -> bool {
    matches!(e, EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { address: a, previous, new })
        if *a == address(host) && previous.server_type != ServerType::Unknown
            && new.server_type == ServerType::Unknown)
}

/// Whether `e` makes the server at `host` the primary.
fn became_primary(e: &EngineEvent, host: &str) -> bool {
    matches!(e, EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { address: a, new, .. })
        if *a == address(host) && new.server_type == ServerType::RsPrimary)
}

/// Whether `e` clears the pool of the server at `host`.
fn pool_cleared(e: &EngineEvent, host: &str) -> bool {
    matches!(e, EngineEvent::Pool { address: a, event: PoolEvent::PoolCleared { .. } }
        if *a == address(host))
}

fn count(sim: &Sim, f: impl Fn(&EngineEvent) -> bool) -> usize {
    sim.events.iter().filter(|(_, e)| f(e)).count()
}

/// A two-member replica set (`r0` primary) whose primary answers the next command with `step`.
fn set_whose_primary_then(step: Step) -> Sim {
    let mut members = replica_set(&["r0", "r1"]);
    members[0].1.script.push_back(step);
    Sim::new(members, |o| {
        o.heartbeat_frequency = Duration::from_secs(1);
    })
}

/// RW-15 (SDAM `handleError`): the first attempt of a retryable write fails on the primary with
/// NotWritablePrimary (10107, labelled `RetryableWriteError` by the 4.4+ server). SDAM error
/// handling marks the primary Unknown as the reply arrives, before the retry rules see the error
/// and so before the retry selects (the retry then waits for the immediate re-check that finds
/// the primary again, and is written after it); the
/// pool of a 4.2+ server is not cleared for a state change that is not a shutdown.
#[test]
fn rw15_a_not_writable_primary_error_marks_the_server_unknown_before_the_retry() {
    let refusal = doc! { "ok": 0, "code": 10107, "codeName": "NotWritablePrimary",
    "errmsg": "not primary", "errorLabels": ["RetryableWriteError"] };
    let mut sim = set_whose_primary_then(Step::reply(refusal));
    let write = sim.start_request(insert(OperationKind::RetryableWrite));
    sim.run(write).expect("the retry succeeds");
    assert_eq!(sim.attempt_servers(write), ["r0", "r0"]);
    assert_eq!(retry_reasons(&sim), [RetryReason::Retryable]);

    let first = find_from(&sim, 0, |e| started(e, write, 1)).expect("attempt 1 written");
    let failure = find_from(&sim, 0, |e| failed(e, write, 1)).expect("attempt 1 failed");
    let unknown = find_from(&sim, 0, |e| marked_unknown(e, "r0")).expect("RW-15: r0 Unknown");
    let back = find_from(&sim, unknown, |e| became_primary(e, "r0")).expect("re-checked");
    let retry = find_from(&sim, 0, |e| started(e, write, 2)).expect("attempt 2 written");
    // SDAM handles the reply's error as it arrives, just before the retry rules see it.
    assert!(
        first < unknown && unknown < failure && failure < back && back < retry,
        "attempt 1 {first}, Unknown {unknown}, failure {failure}, primary again {back}, \
         retry {retry}"
    );
    assert_eq!(count(&sim, |e| marked_unknown(e, "r0")), 1);
    assert_eq!(count(&sim, |e| pool_cleared(e, "r0")), 0, "not a shutdown");
}

/// RW-15 (SDAM `handleError`) on every failed attempt: both attempts of a retryable write lose
/// their connection (a network error after the write). Each failure marks the primary Unknown
/// and clears its pool after its attempt was written and before the operation goes on: the
/// first before the retry is written, the second (on a connection of the new pool generation, so
/// not stale) before the operation ends with the retry's error.
#[test]
fn rw15_each_network_error_marks_the_server_unknown_and_clears_its_pool() {
    let mut sim = set_whose_primary_then(Step::Reset);
    sim.servers
        .get_mut(&address("r0"))
        .unwrap()
        .script
        .push_back(Step::Reset);
    let write = sim.start_request(insert(OperationKind::RetryableWrite));
    let error = sim.run(write).expect_err("both attempts fail");
    assert!(matches!(error.kind, ErrorKind::Network(_)), "{error}");
    assert_eq!(sim.attempt_servers(write), ["r0", "r0"]);

    let finished = find_from(
        &sim,
        0,
        |e| matches!(e, EngineEvent::OperationFinished { op, .. } if *op == write),
    )
    .expect("finished");
    let retry = find_from(&sim, 0, |e| started(e, write, 2)).expect("attempt 2 written");
    for (n, next) in [(1, retry), (2, finished)] {
        let sent = find_from(&sim, 0, |e| started(e, write, n)).expect("written");
        let failure = find_from(&sim, sent, |e| failed(e, write, n)).expect("failed");
        let unknown = find_from(&sim, sent, |e| marked_unknown(e, "r0")).expect("Unknown");
        let cleared = find_from(&sim, sent, |e| pool_cleared(e, "r0")).expect("cleared");
        assert!(
            cleared < next && unknown < next && failure < next,
            "attempt {n} (from {sent}): failure {failure}, Unknown {unknown}, cleared \
             {cleared}, then {next}"
        );
    }
    assert_eq!(count(&sim, |e| marked_unknown(e, "r0")), 2, "RW-15: each");
    assert_eq!(count(&sim, |e| pool_cleared(e, "r0")), 2, "RW-15: each");
}

/// A mongos `m` whose pool holds one connection, with a 1 s selection timeout and a 500 ms
/// heartbeat; its next command's connection is reset.
fn mongos_reset_next() -> Sim {
    Sim::mongos([Step::Reset], |o| {
        o.topology.pool.max_pool_size = 1;
        o.selection.server_selection_timeout = Duration::from_secs(1);
        o.heartbeat_frequency = Duration::from_millis(500);
    })
}

/// Starts a read that takes the only connection and whose command resets it, then a read
/// (`timeout`) that waits for that connection, and runs until the first read's command is sent;
/// returns (the first, the waiting one). When the
/// reset comes, SDAM error handling clears the pool (the first read's network error) and the
/// waiting checkout fails with a PoolClearedError (CM-2).
fn reset_under_a_waiting_checkout(sim: &mut Sim, timeout: OperationTimeout) -> (OpId, OpId) {
    let holder = sim.read(doc! { "find": "c" });
    let waiter =
        sim.start_request(retry_sim::read_request(doc! { "find": "w" }).with_timeout(timeout));
    // Until the first read's command is on the wire (its reset then on the way back).
    let limit = sim.now.saturating_add(Duration::from_secs(1));
    for _ in 0..100 {
        if !sim.log("m").is_empty() {
            break;
        }
        assert!(sim.step(limit), "the first read is sent");
    }
    assert_eq!(sim.log("m"), ["find"]);
    assert!(sim.result(waiter).is_none(), "waits for the connection");
    (holder, waiter)
}

/// Whether `e` is `op`'s retry being scheduled for an ordinary retryable error.
fn retried(e: &EngineEvent, op: OpId) -> bool {
    matches!(e, EngineEvent::Operation { op: o, event: RetryEvent::RetryScheduled { reason: RetryReason::Retryable, .. } }
        if *o == op)
}

/// RR-11: a read whose checkout fails with a PoolClearedError is retried (and succeeds once the
/// mongos is known again), and SDAM is not updated for that error: the mongos is marked Unknown
/// and its pool cleared once, by the other read's network error that cleared the pool, not a
/// second time for the PoolClearedError.
#[test]
fn rr11_a_pool_cleared_checkout_is_retried_without_updating_sdam() {
    let mut sim = mongos_reset_next();
    let (holder, waiter) = reset_under_a_waiting_checkout(&mut sim, OperationTimeout::Off);
    sim.run(waiter).expect("RR-11: retried, then served");
    sim.run(holder).expect("the network error is retried too");
    assert_eq!(count(&sim, |e| retried(e, waiter)), 1);
    // Its first attempt was never written: the retry is the only one the mongos got.
    assert_eq!(
        count(
            &sim,
            |e| matches!(e, EngineEvent::Operation { op, event: RetryEvent::CommandStarted { .. } } if *op == waiter)
        ),
        1
    );
    let unknown = |e: &EngineEvent| {
        matches!(e, EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { address: a, new, .. })
            if *a == address("m") && new.server_type == ServerType::Unknown)
    };
    assert_eq!(count(&sim, unknown), 1, "RR-11: only the network error");
    assert_eq!(count(&sim, |e| pool_cleared(e, "m")), 1, "RR-11");
}

/// RR-11, RR-6: a PoolClearedError that is the operation's first error is the one kept: when the
/// retry's selection then fails (the mongos stays down past the 1 s selection timeout), the read
/// raises the PoolClearedError, not the selection error.
#[test]
fn rr11_a_first_pool_cleared_error_is_kept_as_the_previous_error() {
    let mut sim = mongos_reset_next();
    let (_, waiter) = reset_under_a_waiting_checkout(&mut sim, OperationTimeout::Off);
    sim.servers.get_mut(&address("m")).unwrap().down = true;
    let error = sim.run(waiter).expect_err("the mongos stays down");
    assert!(
        matches!(error.kind, ErrorKind::PoolCleared { .. }),
        "RR-11: {error}"
    );
    assert_eq!(error.address, Some(address("m")), "RR-10");
    assert_eq!(count(&sim, |e| retried(e, waiter)), 1);
}

/// RR-11 with CSOT, CS-5: after a PoolClearedError the read keeps trying until its deadline
/// (500 ms, well within the 1 s selection timeout) and then raises a timeout error wrapping the
/// PoolClearedError, at the deadline.
#[test]
fn rr11_with_csot_a_pool_cleared_read_stops_at_the_deadline() {
    let mut sim = mongos_reset_next();
    let deadline = sim.now.saturating_add(Duration::from_millis(500));
    let (_, waiter) = reset_under_a_waiting_checkout(&mut sim, OperationTimeout::Until(deadline));
    sim.servers.get_mut(&address("m")).unwrap().down = true;
    let error = sim.run(waiter).expect_err("the mongos stays down");
    let finished_at = sim.events.iter().find_map(|(at, e)| {
        matches!(e, EngineEvent::OperationFinished { op, .. } if *op == waiter).then_some(*at)
    });
    assert_eq!(finished_at, Some(deadline), "CSOT: stopped when expired");
    match &error.kind {
        ErrorKind::Timeout { cause: Some(cause) } => assert!(
            matches!(cause.kind, ErrorKind::PoolCleared { .. }),
            "CS-5: {error}"
        ),
        _ => panic!("CS-5: a timeout error, got {error}"),
    }
}

/// CS-5 with TX-7 and TX-8: under CSOT, a transaction's statement and its commit whose replies
/// come after their 100 ms deadline end, at the deadline, with a timeout error wrapping the
/// socket timeout (CS-7), and the timeout keeps the labels the transaction rules gave that
/// network error: `TransientTransactionError` for the statement, `UnknownTransactionCommitResult`
/// (with `RetryableWriteError`) for the commit, so that a caller reading the raised error's labels
/// knows to retry the transaction or the commit.
#[test]
fn cs5_tx7_tx8_a_timeout_keeps_the_transaction_labels_of_its_cause() {
    use retry_core::error::Labels;
    let late = || Step::Reply {
        body: doc! { "ok": 1 },
        delay: Duration::from_secs(1),
    };
    let mut sim = Sim::mongos(
        [Step::reply(doc! { "ok": 1, "n": 1 }), late(), late()],
        |_| {},
    );
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).expect("the first statement succeeds");
    let deadline =
        |sim: &Sim| OperationTimeout::Until(sim.now.saturating_add(Duration::from_millis(100)));
    let statement = insert(LATER_WRITE)
        .with_session(session)
        .with_timeout(deadline(&sim));
    let statement = sim.start_request(statement);
    let error = sim.run(statement).expect_err("the reply comes too late");
    assert!(
        matches!(error.kind, ErrorKind::Timeout { cause: Some(_) }),
        "{error}"
    );
    assert!(
        error.has_label(Labels::TRANSIENT_TRANSACTION),
        "TX-7: {error:?}"
    );

    let done = sim.start_request(commit(session).with_timeout(deadline(&sim)));
    let error = sim.run(done).expect_err("the reply comes too late");
    match &error.kind {
        ErrorKind::Timeout { cause: Some(cause) } => {
            assert!(matches!(cause.kind, ErrorKind::Network(_)), "CS-7: {error}")
        }
        _ => panic!("CS-5: a timeout error, got {error}"),
    }
    assert!(
        error.has_label(Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT),
        "TX-8: {error:?}"
    );
    assert!(error.has_label(Labels::RETRYABLE_WRITE), "RW-9: {error:?}");
}
