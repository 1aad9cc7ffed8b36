//! CM-5, LB-14, LB-15, LB-9, LB-10, TX-5 (review38 L10 items 3 and 4), through the engine with
//! the simulated load balancer:
//! - with two `serviceId`s ([`retry_sim::SimServer::service_ids`]), a clear of one service leaves
//!   the other's pinned connections alone: they keep working and go back healthy, while the
//!   cleared service's pinned connection keeps working too (LB-15: no interruption) and is
//!   closed as stale only when it goes back;
//! - a state-change error (91, ShutdownInProgress) on a pinned connection (a cursor's getMore, a
//!   transaction's statement) clears its service while the connection is still pinned; the
//!   connection is closed as stale when it goes back, with exactly one `CheckedIn`.

use bson::{doc, oid::ObjectId, Document};
use retry_core::engine::{CursorUse, EngineEvent};
use retry_core::pool::{CloseReason, ConnectionId, PoolEvent};
use retry_core::retry::OperationKind;
use retry_sim::{
    abort, address, cursor_batch, get_more, insert, kill_cursors, open_cursor, primary, request,
    Role, Sim, SimServer, Step, FIRST_WRITE, LATER_WRITE,
};

fn service(n: u8) -> ObjectId {
    let mut bytes = [0x5e_u8; 12];
    bytes[11] = n;
    ObjectId::from_bytes(bytes)
}

/// ShutdownInProgress, a state-change error that clears the pool (LB: its service).
fn shutting_down() -> Document {
    doc! { "ok": 0, "code": 91, "codeName": "ShutdownInProgress", "errmsg": "shutting down" }
}

/// The pool's events, in order, reduced to what these tests compare.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Out(ConnectionId),
    In(ConnectionId),
    Closed(ConnectionId, CloseReason),
    Cleared(Option<ObjectId>),
}

fn seen(sim: &Sim) -> Vec<Seen> {
    sim.events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Pool { event, .. } => Some(event),
            _ => None,
        })
        .filter_map(|event| match event {
            PoolEvent::CheckedOut { connection, .. } => Some(Seen::Out(*connection)),
            PoolEvent::CheckedIn { connection } => Some(Seen::In(*connection)),
            PoolEvent::ConnectionClosed { connection, reason } => {
                Some(Seen::Closed(*connection, *reason))
            }
            PoolEvent::PoolCleared { service_id, .. } => Some(Seen::Cleared(*service_id)),
            _ => None,
        })
        .collect()
}

/// The connections checked out, in order.
fn checked_out(sim: &Sim) -> Vec<ConnectionId> {
    seen(sim)
        .into_iter()
        .filter_map(|s| match s {
            Seen::Out(c) => Some(c),
            _ => None,
        })
        .collect()
}

fn count(sim: &Sim, wanted: &Seen) -> usize {
    seen(sim).iter().filter(|s| *s == wanted).count()
}

/// CM-5, LB-15, LB-10 (review38 L10 item 3): cursor A on service 1, cursor B on service 2; a
/// network error on another service-1 connection clears service 1 only. Cursor B's getMore and
/// close use its connection, which goes back healthy (never closed); cursor A's connection, not
/// interrupted, still serves its getMore and is closed as stale once its cursor closes. Each
/// connection is checked in once. Run twice: the same inputs give the same trace (house rule 2).
#[test]
fn lb15_a_clear_of_one_service_leaves_the_other_services_pinned_connections_alone() {
    let trace = || {
        let mut lb = SimServer::new(Role::LoadBalancer { service_id: true });
        lb.service_ids = vec![service(1), service(2)];
        lb.script = vec![
            Step::reply(cursor_batch(42, "firstBatch")),
            Step::reply(cursor_batch(43, "firstBatch")),
            Step::Reset,
            Step::reply(cursor_batch(43, "nextBatch")),
            Step::reply(cursor_batch(42, "nextBatch")),
            Step::reply(doc! { "ok": 1, "cursorsKilled": [43_i64] }),
            Step::reply(doc! { "ok": 1, "cursorsKilled": [42_i64] }),
        ]
        .into();
        let mut sim = Sim::new(vec![(address("lb"), lb)], |o| {
            o.topology.load_balanced = true;
        });
        let find_a = sim.start_request(
            request(doc! { "find": "a" }, OperationKind::Read).with_cursor(CursorUse::Open),
        );
        sim.run(find_a).expect("cursor A opens");
        let a = sim.cursor_opened(find_a).expect("cursor A");
        let find_b = sim.start_request(
            request(doc! { "find": "b" }, OperationKind::Read).with_cursor(CursorUse::Open),
        );
        sim.run(find_b).expect("cursor B opens");
        let b = sim.cursor_opened(find_b).expect("cursor B");
        // A third connection, of service 1 again, reset under a command nobody retries.
        let ping = sim.start(doc! { "ping": 1 }, OperationKind::RunCommand, primary());
        sim.run(ping).expect_err("reset");
        let out = checked_out(&sim);
        assert_eq!(out.len(), 3, "{:?}", seen(&sim));
        let (on_a, on_b, reset) = (out[0], out[1], out[2]);
        let cleared: Vec<_> = seen(&sim)
            .into_iter()
            .filter(|s| matches!(s, Seen::Cleared(_)))
            .collect();
        assert_eq!(
            cleared,
            [Seen::Cleared(Some(service(1)))],
            "LB-15: service 1 only"
        );
        let more_b = sim.start_request(get_more(43, b));
        sim.run(more_b).expect("cursor B is untouched");
        let more_a = sim.start_request(get_more(42, a));
        sim.run(more_a)
            .expect("LB-15: cursor A's connection is not interrupted");
        for (id, cursor) in [(43, b), (42, a)] {
            let close = sim.start_request(kill_cursors(id, cursor));
            sim.run(close).expect("the cursor closes");
        }
        let log: Vec<_> = sim.servers[&address("lb")]
            .log
            .iter()
            .map(|(name, conn)| (name.clone(), *conn))
            .collect();
        let conn_of = |name: &str, nth: usize| {
            log.iter()
                .filter(|(n, _)| n == name)
                .nth(nth)
                .map(|(_, c)| *c)
        };
        assert_eq!(
            conn_of("getMore", 0),
            conn_of("find", 1),
            "B's getMore on B's"
        );
        assert_eq!(
            conn_of("getMore", 1),
            conn_of("find", 0),
            "A's getMore on A's"
        );
        assert_eq!(count(&sim, &Seen::Closed(reset, CloseReason::Error)), 1);
        assert_eq!(count(&sim, &Seen::Closed(on_a, CloseReason::Stale)), 1);
        assert!(
            !seen(&sim)
                .iter()
                .any(|s| matches!(s, Seen::Closed(c, _) if *c == on_b)),
            "service 2's connection stays: {:?}",
            seen(&sim)
        );
        for conn in [on_a, on_b, reset] {
            assert_eq!(count(&sim, &Seen::In(conn)), 1, "{conn:?} in once");
        }
        assert_eq!(checked_out(&sim).len(), 3, "no other checkout");
        format!("{:?}", sim.events)
    };
    assert_eq!(trace(), trace());
}

/// The events of `conn` and the clears, from its check-out on.
fn story(sim: &Sim, conn: ConnectionId) -> Vec<Seen> {
    seen(sim)
        .into_iter()
        .filter(|s| match s {
            Seen::Out(c) | Seen::In(c) | Seen::Closed(c, _) => *c == conn,
            Seen::Cleared(_) => true,
        })
        .collect()
}

/// LB-15, LB-10, LB-9 (review38 L10 item 4): ShutdownInProgress on a cursor's getMore clears
/// the service while the cursor's connection is pinned; the cursor still closes with a
/// killCursors on it (not a network error, LB-11), and the connection is then checked in once
/// and closed as stale.
#[test]
fn lb15_a_state_change_error_on_a_get_more_clears_the_service_and_closes_the_pin_as_stale() {
    let mut sim = Sim::lb(
        [
            Step::reply(cursor_batch(42, "firstBatch")),
            Step::reply(shutting_down()),
            Step::reply(doc! { "ok": 1, "cursorsKilled": [42_i64] }),
        ],
        |_| {},
    );
    let service = sim.servers[&address("lb")].service_id;
    let find = sim.start_request(open_cursor(OperationKind::Read));
    sim.run(find).expect("the cursor opens");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    let more = sim.start_request(get_more(42, cursor));
    let error = sim.run(more).expect_err("shutting down");
    assert_eq!(error.code(), Some(91), "{error}");
    let conn = checked_out(&sim)[0];
    assert_eq!(
        story(&sim, conn),
        [Seen::Out(conn), Seen::Cleared(Some(service))],
        "cleared while pinned"
    );
    let close = sim.start_request(kill_cursors(42, cursor));
    sim.run(close).expect("the cursor closes");
    assert_eq!(sim.log("lb"), ["find", "getMore", "killCursors"]);
    assert_eq!(
        story(&sim, conn),
        [
            Seen::Out(conn),
            Seen::Cleared(Some(service)),
            Seen::In(conn),
            Seen::Closed(conn, CloseReason::Stale),
        ]
    );
}

/// LB-15, TX-5, LB-9 (review38 L10 item 4): ShutdownInProgress on a transaction's statement
/// clears the service while the transaction's connection is pinned; the error carries no
/// TransientTransactionError, so the pin stays (TX-4) and the abort runs on that connection;
/// the abort's unpin then checks it in once, closed as stale.
#[test]
fn lb15_a_state_change_error_on_a_transaction_statement_closes_the_pin_as_stale() {
    let mut sim = Sim::lb(
        [
            Step::reply(doc! { "ok": 1, "n": 1 }),
            Step::reply(shutting_down()),
            Step::reply(doc! { "ok": 1 }),
        ],
        |_| {},
    );
    let service = sim.servers[&address("lb")].service_id;
    let session = sim.engine.start_session();
    sim.begin_transaction(session);
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).expect("the transaction pins its connection");
    let statement = sim.start_request(insert(LATER_WRITE).with_session(session));
    let error = sim.run(statement).expect_err("shutting down");
    assert_eq!(error.code(), Some(91), "{error}");
    let conn = checked_out(&sim)[0];
    assert_eq!(
        story(&sim, conn),
        [Seen::Out(conn), Seen::Cleared(Some(service))],
        "cleared while pinned"
    );
    assert!(
        sim.engine
            .session_info(session)
            .is_some_and(|i| i.pinned.is_some()),
        "TX-4: a non-transient error keeps the pin"
    );
    let aborting = sim.start_request(abort(session));
    sim.run(aborting).expect("aborted");
    assert_eq!(sim.log("lb"), ["insert", "insert", "abortTransaction"]);
    let conns: Vec<_> = sim.servers[&address("lb")]
        .log
        .iter()
        .map(|(_, c)| *c)
        .collect();
    assert!(conns.windows(2).all(|w| w[0] == w[1]), "one connection");
    assert_eq!(
        story(&sim, conn),
        [
            Seen::Out(conn),
            Seen::Cleared(Some(service)),
            Seen::In(conn),
            Seen::Closed(conn, CloseReason::Stale),
        ]
    );
    assert_eq!(checked_out(&sim).len(), 1, "one checkout");
}
