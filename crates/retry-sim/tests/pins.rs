//! Load-balanced pins the LB unified tests found wrong, end to end in virtual time: a getMore
//! network error keeps the cursor's connection out until the cursor closes (LB-11), a
//! transaction's first command pins its connection even when it fails (TX-5, TX-4), starting a
//! transaction unpins at once (TX-4 (4)), and a cursor in a transaction shares its connection.

use bson::{doc, Document};
use retry_core::engine::SessionHandle;
use retry_core::engine::{CursorUse, EngineEvent, OperationRequest};
use retry_core::pool::{CloseReason, PoolEvent};
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;
use retry_sim::{address, Role, Sim, SimServer, Step};

fn lb_sim(script: Vec<Step>) -> Sim {
    let mut lb = SimServer::new(Role::LoadBalancer { service_id: true });
    lb.script = script.into_iter().collect();
    Sim::new(vec![(address("lb"), lb)], |o| {
        o.topology.load_balanced = true
    })
}

fn batch(id: i64, field: &str) -> Step {
    Step::reply(doc! { "ok": 1, "cursor": { "id": id, "ns": "test.c", field: [] } })
}

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

/// The pool's check-out, check-in and close events, in order.
fn pool_events(sim: &Sim) -> Vec<&'static str> {
    sim.events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Pool { event, .. } => match event {
                PoolEvent::CheckedOut { .. } => Some("out"),
                PoolEvent::CheckedIn { .. } => Some("in"),
                PoolEvent::ConnectionClosed {
                    reason: CloseReason::Error,
                    ..
                } => Some("closed(error)"),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

const FIRST: OperationKind = OperationKind::InTransaction {
    read: false,
    first: true,
};

/// LB-11 (LB `cursors.json` "pinned connections are not returned after an network error during
/// getMore"): the connection stays checked out after the getMore fails; closing the cursor sends
/// no killCursors and only then checks it in and closes it.
#[test]
fn lb11_a_get_more_network_error_keeps_the_connection_until_the_cursor_closes() {
    let mut sim = lb_sim(vec![batch(42, "firstBatch"), Step::Reset]);
    let find = sim.start_request(request(
        doc! { "find": "c" },
        OperationKind::Read,
        CursorUse::Open,
        None,
    ));
    sim.run(find).unwrap();
    let cursor = sim.cursor_opened(find).expect("a cursor opened");
    let more = sim.start_request(request(
        doc! { "getMore": 42i64, "collection": "c" },
        OperationKind::GetMore,
        CursorUse::GetMore(cursor),
        None,
    ));
    assert!(sim.run(more).is_err());
    assert_eq!(pool_events(&sim), ["out"], "still checked out");
    let close = sim.start_request(request(
        doc! { "killCursors": "c", "cursors": [42i64] },
        OperationKind::RunCommand,
        CursorUse::Close(cursor),
        None,
    ));
    sim.run(close).unwrap();
    assert_eq!(pool_events(&sim), ["out", "in", "closed(error)"]);
    let log: Vec<&str> = sim.servers[&address("lb")]
        .log
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
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
    let op = sim.start_request(request(
        insert.clone(),
        FIRST,
        CursorUse::None,
        Some(session),
    ));
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
    let op = sim.start_request(request(insert, FIRST, CursorUse::None, Some(session)));
    assert!(sim.run(op).is_err());
    assert_eq!(pool_events(&sim), ["out", "in"], "unpinned at once");
}

/// TX-4 (4) (LB `transactions.json` "pinned connection is returned when a new transaction is
/// started"): starting a transaction lets the previous one's connection go before any command.
#[test]
fn tx4_starting_a_transaction_unpins_at_once() {
    let mut sim = lb_sim(Vec::new());
    let session = sim.engine.start_session();
    let op = sim.start_request(request(
        doc! { "insert": "c", "documents": [{}] },
        FIRST,
        CursorUse::None,
        Some(session),
    ));
    sim.run(op).unwrap();
    let commit = sim.start_request(request(
        doc! { "commitTransaction": 1 },
        OperationKind::CommitTransaction { again: false },
        CursorUse::None,
        Some(session),
    ));
    sim.run(commit).unwrap();
    assert_eq!(pool_events(&sim), ["out"], "a commit does not unpin");
    sim.engine
        .start_transaction(session, Default::default(), sim.now)
        .unwrap();
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
    let insert = sim.start_request(request(
        doc! { "insert": "c", "documents": [{}] },
        FIRST,
        CursorUse::None,
        Some(session),
    ));
    sim.run(insert).unwrap();
    let find = sim.start_request(request(
        doc! { "find": "c", "batchSize": 2 },
        OperationKind::InTransaction {
            read: true,
            first: false,
        },
        CursorUse::Open,
        Some(session),
    ));
    sim.run(find).unwrap();
    let cursor = sim.cursor_opened(find).expect("a cursor opened");
    let close = sim.start_request(request(
        doc! { "killCursors": "c", "cursors": [42i64] },
        OperationKind::RunCommand,
        CursorUse::Close(cursor),
        None,
    ));
    sim.run(close).unwrap();
    assert_eq!(pool_events(&sim), ["out"], "the transaction still holds it");
    let abort = sim.start_request(request(
        doc! { "abortTransaction": 1 },
        OperationKind::AbortTransaction,
        CursorUse::None,
        Some(session),
    ));
    sim.run(abort).unwrap();
    assert_eq!(pool_events(&sim), ["out", "in"]);
}
