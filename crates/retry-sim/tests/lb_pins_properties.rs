//! House rule 8, TX-4, TX-5, LB-10..LB-13 (the 3a fix's property): random interleavings of two
//! sessions' transactions and cursors on a load balancer with `maxPoolSize=2`, with slow replies,
//! transient errors and dropped connections. Every operation ends exactly once; a connection is
//! never checked out twice at once nor checked in when it is not out; and once every cursor is
//! closed and both sessions ended, nothing stays checked out. Operations are cancelled at random
//! too (review38 L1), and a connection is never closed while checked out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bson::doc;
use proptest::prelude::*;
use retry_core::engine::{CursorHandle, EngineEvent, OpId};
use retry_core::pool::{ConnectionId, PoolEvent};
use retry_core::retry::OperationKind;
use retry_sim::{
    abort, address, get_more, insert, kill_cursors, open_cursor, request, Role, Sim, SimServer,
    Step,
};

#[derive(Clone, Debug)]
enum Op {
    StartTransaction(usize),
    Insert(Option<usize>),
    Find(Option<usize>),
    /// A getMore of the `n`th cursor opened so far; `true` names the cursor's session.
    GetMore(usize, bool),
    /// The killCursors of the `n`th cursor; `true` names its session.
    Close(usize, bool),
    Commit(usize),
    Abort(usize),
    /// Ends the session (SE-12: once its operations in flight finish; later ones are refused).
    EndSession(usize),
    /// Cancels the `n`th operation started so far (review38 L1: one in flight on a pinned
    /// connection closes it).
    Cancel(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let session = 0..2_usize;
    let maybe = prop::option::of(0..2_usize);
    prop_oneof![
        session.clone().prop_map(Op::StartTransaction),
        maybe.clone().prop_map(Op::Insert),
        maybe.prop_map(Op::Find),
        (0..4_usize, any::<bool>()).prop_map(|(c, s)| Op::GetMore(c, s)),
        (0..4_usize, any::<bool>()).prop_map(|(c, s)| Op::Close(c, s)),
        session.clone().prop_map(Op::Commit),
        session.clone().prop_map(Op::Abort),
        session.prop_map(Op::EndSession),
        (0..24_usize).prop_map(Op::Cancel),
    ]
}

/// One server step: mostly a reply that serves every command (a cursor with id 42 for a find or
/// getMore), sometimes a transient error or a dropped connection; each after a delay.
fn step() -> impl Strategy<Value = Step> {
    let reply = doc! {
        "ok": 1, "n": 1,
        "cursor": { "id": 42_i64, "ns": "test.c", "firstBatch": [], "nextBatch": [] },
    };
    let transient = doc! {
        "ok": 0, "code": 112, "codeName": "WriteConflict", "errmsg": "write conflict",
        "errorLabels": ["TransientTransactionError"],
    };
    (0..10_u8, 0..5_u64).prop_map(move |(kind, delay)| match kind {
        0 => Step::Reset,
        1 => Step::Reply {
            body: transient.clone(),
            delay: Duration::from_millis(delay),
        },
        _ => Step::Reply {
            body: reply.clone(),
            delay: Duration::from_millis(delay),
        },
    })
}

/// The cursors opened so far, in order, with the session of the find that opened each.
fn cursors(sim: &Sim, finds: &BTreeMap<OpId, Option<usize>>) -> Vec<(CursorHandle, Option<usize>)> {
    sim.events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::CursorOpened { op, cursor } => Some((*cursor, finds[op])),
            _ => None,
        })
        .collect()
}

/// `close_client`: the client closes right after the operations start (review38 L4: LB-9, LB-11,
/// CM-7), instead of the cursors closing and the sessions ending one by one.
fn run(ops: &[(Op, bool)], script: Vec<Step>, close_client: bool) -> Result<(), TestCaseError> {
    let mut lb = SimServer::new(Role::LoadBalancer { service_id: true });
    lb.script = script.into_iter().collect();
    let mut sim = Sim::new(vec![(address("lb"), lb)], |o| {
        o.topology.load_balanced = true;
        o.topology.pool.max_pool_size = 2;
        // A checkout waiting while cursors and transactions hold both connections (which
        // CMAP lets wait without a limit) gives up after 1 s.
        o.topology.pool.wait_queue_timeout = Some(Duration::from_secs(1));
    });
    let sessions = [sim.engine.start_session(), sim.engine.start_session()];
    let mut started = Vec::new();
    let mut finds = BTreeMap::new();
    for (op, wait) in ops {
        let opened = cursors(&sim, &finds);
        let id = match op {
            Op::EndSession(s) => {
                sim.engine.end_session(sessions[*s], sim.now);
                sim.drain();
                continue;
            }
            Op::Cancel(n) => {
                if let Some(&id) = started.get(*n) {
                    sim.engine.cancel_operation(id, sim.now);
                    sim.drain();
                }
                continue;
            }
            Op::StartTransaction(s) => {
                let _ = sim
                    .engine
                    .start_transaction(sessions[*s], Default::default(), sim.now);
                sim.drain();
                continue;
            }
            Op::Insert(s) => sim.start_request(
                insert(OperationKind::RetryableWrite).with_session(s.map(|s| sessions[s])),
            ),
            Op::Find(s) => {
                let id = sim.start_request(
                    open_cursor(OperationKind::Read).with_session(s.map(|s| sessions[s])),
                );
                finds.insert(id, *s);
                id
            }
            Op::GetMore(n, named) | Op::Close(n, named) => {
                let Some(&(cursor, session)) = opened.get(*n) else {
                    continue;
                };
                let session = session.filter(|_| *named).map(|s| sessions[s]);
                match op {
                    Op::GetMore(..) => {
                        sim.start_request(get_more(42_i64, cursor).with_session(session))
                    }
                    _ => sim.start_request(kill_cursors(42_i64, cursor).with_session(session)),
                }
            }
            Op::Commit(s) => sim.start_request(
                request(
                    doc! { "commitTransaction": 1 },
                    OperationKind::CommitTransaction { again: false },
                )
                .with_session(sessions[*s]),
            ),
            Op::Abort(s) => sim.start_request(abort(sessions[*s])),
        };
        started.push(id);
        if *wait {
            let _ = sim.run(id);
        }
    }
    if close_client {
        sim.engine.close(sim.now);
        sim.drain();
        for _ in 0..100 {
            if sim.engine.is_closed() {
                break;
            }
            let until = sim.now.saturating_add(Duration::from_millis(100));
            prop_assert!(sim.advance_to(until));
        }
        prop_assert!(sim.engine.is_closed(), "closed within 10 s");
    }
    for id in started.clone() {
        let _ = sim.run(id);
    }
    // Close every cursor still open, then end both sessions.
    let mut closed = BTreeSet::new();
    for (cursor, _) in cursors(&sim, &finds).into_iter().filter(|_| !close_client) {
        if closed.insert(cursor) {
            let id = sim.start_request(kill_cursors(42_i64, cursor));
            started.push(id);
            let _ = sim.run(id);
        }
    }
    for session in sessions {
        sim.engine.end_session(session, sim.now);
        sim.drain();
    }
    for id in started.clone() {
        let _ = sim.run(id);
    }
    let until = sim.now.saturating_add(Duration::from_secs(1));
    prop_assert!(sim.advance_to(until));

    // House rule 8: every operation ended exactly once.
    let mut finished: BTreeMap<OpId, usize> = BTreeMap::new();
    for (_, event) in &sim.events {
        if let EngineEvent::OperationFinished { op, .. } = event {
            *finished.entry(*op).or_default() += 1;
        }
    }
    for id in &started {
        prop_assert_eq!(finished.get(id), Some(&1), "{:?}", id);
    }
    // CMAP accounting: out once, in once, nothing out at the end.
    let mut out: BTreeSet<ConnectionId> = BTreeSet::new();
    for (at, event) in &sim.events {
        let EngineEvent::Pool { event, .. } = event else {
            continue;
        };
        match event {
            PoolEvent::CheckedOut { connection, .. } => {
                prop_assert!(out.insert(*connection), "{connection:?} out twice at {at}");
            }
            PoolEvent::CheckedIn { connection } => {
                prop_assert!(
                    out.remove(connection),
                    "{connection:?} in, not out, at {at}"
                );
            }
            // LB-9 (review38 L1): a connection checked out is never closed without its
            // check-in first.
            PoolEvent::ConnectionClosed { connection, .. } => {
                prop_assert!(
                    !out.contains(connection),
                    "{connection:?} closed while checked out at {at}"
                );
            }
            _ => {}
        }
    }
    prop_assert!(out.is_empty(), "still checked out: {out:?}");
    Ok(())
}

proptest! {
    // 300 cases by default; `PROPTEST_CASES` sets another count for a long run.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300),
        ..ProptestConfig::default()
    })]

    #[test]
    fn lb_transactions_and_cursors_check_every_connection_in_once(
        ops in prop::collection::vec((op(), any::<bool>()), 1..24),
        script in prop::collection::vec(step(), 0..40),
        close_client in any::<bool>(),
    ) {
        run(&ops, script, close_client)?;
    }
}
