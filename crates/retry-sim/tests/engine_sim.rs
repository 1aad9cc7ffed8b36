//! The engine end to end against scripted in-memory servers, in virtual time, with the bounded
//! simulated driver of `retry-sim`.

use std::collections::VecDeque;
use std::time::Duration;

use bson::{doc, Bson, Document};
use retry_core::engine::EngineEvent;
use retry_core::pool::PoolEvent;
use retry_core::retry::{OperationKind, RetryEvent};
use retry_core::selection::SelectionCriteria;
use retry_core::time::Instant;

use retry_sim::{
    address, commit, cursor_batch, get_more, insert, kill_cursors, open_cursor, overload,
    replica_set, request, Role, Sim, SimServer, Step, FIRST_WRITE, LATER_READ, LATER_WRITE,
};

#[test]
fn a_ping_on_a_standalone_succeeds_in_one_attempt() {
    let mut sim = Sim::new(
        vec![(address("db"), SimServer::new(Role::Standalone))],
        |_| {},
    );
    let op = sim.read(doc! { "ping": 1 });
    let reply = sim.run(op).expect("ping succeeds");
    assert_eq!(reply.get("ok"), Some(&Bson::Int32(1)));
    assert_eq!(sim.attempt_servers(op), ["db"]);
    assert_eq!(sim.servers[&address("db")].executed.get("ping"), Some(&1));
}

#[test]
fn bp20_an_overloaded_mongos_makes_the_retry_go_to_the_other_one() {
    let mut overloaded = SimServer::new(Role::Mongos);
    overloaded.always = Some(("find".into(), overload(462)));
    let healthy = SimServer::new(Role::Mongos);
    let mut sim = Sim::new(
        vec![(address("m1"), overloaded), (address("m2"), healthy)],
        |_| {},
    );
    // Let both mongos be discovered first.
    let ping = sim.read(doc! { "ping": 1 });
    sim.run(ping).unwrap();
    for _ in 0..20 {
        let op = sim.read(doc! { "find": "c" });
        sim.run(op)
            .expect("the retry on the healthy mongos succeeds");
        let servers = sim.attempt_servers(op);
        if servers[0] == "m1" {
            assert_eq!(
                servers,
                ["m1", "m2"],
                "BP-20: sharded retries always go elsewhere"
            );
            return;
        }
    }
    panic!("the overloaded mongos was never chosen first in 20 tries");
}

#[test]
fn bp27_the_connection_is_checked_in_before_every_backoff() {
    let mut server = SimServer::new(Role::Standalone);
    server.always = Some(("find".into(), overload(462)));
    let mut sim = Sim::new(vec![(address("db"), server)], |_| {});
    let op = sim.read(doc! { "find": "c" });
    let error = sim.run(op).unwrap_err();
    assert!(error.is_retryable_overload());
    // BP-27: each attempt's connection is checked in at the moment the attempt fails, before the
    // backoff, and before the next attempt checks a connection out.
    let failed: Vec<Instant> = sim
        .events
        .iter()
        .filter_map(|(t, e)| matches!(e, EngineEvent::Operation { op: o, event: RetryEvent::CommandFailed { .. } } if *o == op).then_some(*t))
        .collect();
    let pool: Vec<(Instant, &str)> = sim
        .events
        .iter()
        .filter_map(|(t, e)| match e {
            EngineEvent::Pool {
                event: PoolEvent::CheckedOut { .. },
                ..
            } => Some((*t, "out")),
            EngineEvent::Pool {
                event: PoolEvent::CheckedIn { .. },
                ..
            } => Some((*t, "in")),
            _ => None,
        })
        .collect();
    let kinds: Vec<&str> = pool.iter().map(|(_, k)| *k).collect();
    assert_eq!(kinds, ["out", "in", "out", "in", "out", "in"]);
    let checked_in: Vec<Instant> = pool
        .iter()
        .filter(|(_, k)| *k == "in")
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(
        checked_in, failed,
        "checked in when the attempt failed, before any wait"
    );
    let waits: Vec<Duration> = sim
        .retries_scheduled()
        .into_iter()
        .map(|(delay, _)| delay)
        .collect();
    assert!(
        waits.iter().all(|d| !d.is_zero()),
        "the retries did back off: {waits:?}"
    );
}

#[test]
fn hs9_a_server_that_resets_handshakes_is_retried_with_backoff() {
    let mut server = SimServer::new(Role::Standalone);
    let mut sim_server_resets = 0;
    server.reset_handshakes = 0;
    let mut sim = Sim::new(vec![(address("db"), server)], |_| {});
    // Discover the server, then make it reset the next pooled connection's handshake once.
    let ping = sim.read(doc! { "ping": 1 });
    sim.run(ping).unwrap();
    // Force a new pooled connection: clear by closing the idle one is not needed; a second
    // concurrent operation needs a second connection.
    sim.servers
        .get_mut(&address("db"))
        .unwrap()
        .reset_handshakes = 1;
    sim_server_resets += 1;
    let first = sim.read(doc! { "find": "a" });
    let second = sim.read(doc! { "find": "b" });
    sim.run(first).unwrap();
    sim.run(second)
        .expect("the reset handshake is retried (HS-9 labels make it a retryable overload error)");
    let retried: Vec<_> = sim
        .retries_scheduled()
        .into_iter()
        .map(|(_, reason)| reason)
        .collect();
    assert_eq!(retried.len(), sim_server_resets, "{retried:?}");
    assert_eq!(retried[0], retry_core::retry::RetryReason::Overload);
}

#[test]
fn lb_mode_uses_the_service_id_and_fails_with_the_exact_message_without_it() {
    let lb = SimServer::new(Role::LoadBalancer { service_id: true });
    let mut sim = Sim::new(vec![(address("lb"), lb)], |o| {
        o.topology.load_balanced = true
    });
    let op = sim.read(doc! { "ping": 1 });
    sim.run(op).expect("LB mode with serviceId works");

    let no_service = SimServer::new(Role::LoadBalancer { service_id: false });
    let mut sim = Sim::new(vec![(address("lb"), no_service)], |o| {
        o.topology.load_balanced = true
    });
    let op = sim.read(doc! { "ping": 1 });
    let error = sim.run(op).unwrap_err();
    assert!(
        error.to_string().contains("Driver attempted to initialize in load balancing mode, but the server does not support this mode."),
        "{error}"
    );
}

#[test]
fn identical_seeds_give_identical_traces() {
    let trace = || {
        let mut server = SimServer::new(Role::Standalone);
        server.script =
            VecDeque::from(vec![Step::reply(overload(462)), Step::reply(overload(462))]);
        let mut sim = Sim::new(vec![(address("db"), server)], |_| {});
        let op = sim.read(doc! { "find": "c" });
        sim.run(op).unwrap();
        format!("{:?}", sim.events)
    };
    assert_eq!(trace(), trace());
}

/// The pool's check-out starts, check-outs and check-ins, in order.
fn pool_events(sim: &Sim) -> Vec<&'static str> {
    sim.pool_trace(&["started", "out", "in"])
}

/// A load balancer answering with `script` and the default pool.
fn lb_sim(script: Vec<Document>) -> Sim {
    Sim::lb(script.into_iter().map(Step::reply), |_| {})
}

fn one_connection(sim: &Sim, host: &str) -> bool {
    let log = &sim.servers[&address(host)].log;
    log.iter().all(|(_, c)| *c == log[0].1)
}

#[test]
fn lb10_a_load_balanced_cursor_stays_pinned_across_get_mores() {
    let mut sim = lb_sim(vec![
        cursor_batch(42, "firstBatch"),
        overload(462),
        cursor_batch(42, "nextBatch"),
        cursor_batch(0, "nextBatch"),
    ]);
    let find = sim.start_request(open_cursor(OperationKind::Read));
    sim.run(find).unwrap();
    let cursor = sim
        .cursor_opened(find)
        .expect("a non-zero cursor id opens a cursor");
    // BP-5: the overloaded getMore is retried, on the same pinned connection (C8).
    let more = sim.start_request(get_more(42, cursor));
    sim.run(more).unwrap();
    let last = sim.start_request(get_more(42, cursor));
    sim.run(last).unwrap();
    assert_eq!(sim.log("lb"), ["find", "getMore", "getMore", "getMore"]);
    assert!(
        one_connection(&sim, "lb"),
        "every command on the connection that opened the cursor"
    );
    // LB-9: one checkout and one check-in for the cursor's whole life.
    assert_eq!(pool_events(&sim), ["started", "out", "in"]);
    // The exhausted cursor is gone.
    let after = sim.start_request(get_more(42, cursor));
    let error = sim.run(after).unwrap_err();
    assert!(error.to_string().contains("is not open"), "{error}");
}

#[test]
fn lb10_closing_a_cursor_sends_kill_cursors_on_its_connection_then_checks_it_in() {
    let mut sim = lb_sim(vec![cursor_batch(42, "firstBatch")]);
    let find = sim.start_request(open_cursor(OperationKind::Read));
    sim.run(find).unwrap();
    let cursor = sim.cursor_opened(find).unwrap();
    let kill = sim.start_request(kill_cursors(42, cursor));
    sim.run(kill).unwrap();
    assert_eq!(sim.log("lb"), ["find", "killCursors"]);
    assert!(one_connection(&sim, "lb"));
    assert_eq!(pool_events(&sim), ["started", "out", "in"]);
}

#[test]
fn a_cursor_with_id_zero_pins_nothing() {
    let mut sim = lb_sim(vec![cursor_batch(0, "firstBatch")]);
    let find = sim.start_request(open_cursor(OperationKind::Read));
    sim.run(find).unwrap();
    assert_eq!(sim.cursor_opened(find), None);
    assert_eq!(pool_events(&sim), ["started", "out", "in"]);
}

#[test]
fn lb13_an_exhausted_pool_names_the_connections_in_use() {
    let mut sim = Sim::lb([Step::reply(cursor_batch(42, "firstBatch"))], |o| {
        o.topology.pool.max_pool_size = 1;
        o.topology.pool.wait_queue_timeout = Some(Duration::from_millis(100));
    });
    let find = sim.start_request(open_cursor(OperationKind::Read));
    sim.run(find).unwrap();
    assert!(sim.cursor_opened(find).is_some());
    let ping = sim.read(doc! { "ping": 1 });
    let error = sim.run(ping).unwrap_err();
    assert!(
        error.to_string().contains(
            "maxPoolSize: 1, connections in use by cursors: 1, connections in use by transactions: 0, connections in use by other operations: 0"
        ),
        "{error}"
    );
}

fn three_mongos() -> Sim {
    let servers = ["m1", "m2", "m3"]
        .into_iter()
        .map(|h| (address(h), SimServer::new(Role::Mongos)))
        .collect();
    let mut sim = Sim::new(servers, |o| {
        o.selection.local_threshold = Duration::from_secs(1)
    });
    let ping = sim.read(doc! { "ping": 1 });
    sim.run(ping).unwrap();
    sim
}

#[test]
fn tx3_a_sharded_transaction_stays_on_the_mongos_of_its_first_command() {
    let mut sim = three_mongos();
    let session = sim.engine.start_session();
    let insert = doc! { "insert": "c", "documents": [{}] };
    let first = sim.start_request(request(insert.clone(), FIRST_WRITE).with_session(session));
    sim.run(first).unwrap();
    let pinned = sim.attempt_servers(first)[0].clone();
    for _ in 0..5 {
        let next = sim.start_request(request(insert.clone(), LATER_WRITE).with_session(session));
        sim.run(next).unwrap();
        assert_eq!(sim.attempt_servers(next), std::slice::from_ref(&pinned));
    }
    let commit = sim.start_request(commit(session));
    sim.run(commit).unwrap();
    assert_eq!(sim.attempt_servers(commit), std::slice::from_ref(&pinned));
    // TX-4 (4): a new transaction is not bound to the old pin; over many transactions more than one
    // mongos is used (the transactions prose test).
    let mut used = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let first = sim.start_request(request(insert.clone(), FIRST_WRITE).with_session(session));
        sim.run(first).unwrap();
        used.insert(sim.attempt_servers(first)[0].clone());
        // TX-2: the engine's session refuses a new transaction while this one is in progress.
        let commit = sim.start_request(retry_sim::commit(session));
        sim.run(commit).unwrap();
    }
    assert!(used.len() > 1, "{used:?}");
}

#[test]
fn tx4_a_commit_with_an_unknown_result_is_unpinned_before_its_retry() {
    let mut sim = three_mongos();
    let session = sim.engine.start_session();
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).unwrap();
    let pinned = sim.attempt_servers(first)[0].clone();
    // The pinned mongos drops the commit's connection: a network error, UnknownTransactionCommitResult
    // (TX-8) and RetryableWriteError (RW-9); the retry is unpinned and, on a sharded cluster,
    // deprioritizes the failed mongos (BP-20).
    sim.servers
        .get_mut(&address(&pinned))
        .unwrap()
        .script
        .push_back(Step::Reset);
    let commit = sim.start_request(commit(session));
    sim.run(commit)
        .expect("the retried commit succeeds elsewhere");
    let servers = sim.attempt_servers(commit);
    assert_eq!(servers.len(), 2);
    assert_eq!(servers[0], pinned);
    assert_ne!(servers[1], pinned);
}

/// TX-5; also LB-12 and SS-18 (load-balanced case): every command of the transaction goes to the
/// one pinned connection, which is released only when the session ends.
#[test]
fn tx5_a_load_balanced_transaction_keeps_one_connection_until_the_session_ends() {
    let mut sim = lb_sim(Vec::new());
    let session = sim.engine.start_session();
    let first = sim.start_request(insert(FIRST_WRITE).with_session(session));
    sim.run(first).unwrap();
    let second = sim.start_request(request(doc! { "find": "c" }, LATER_READ).with_session(session));
    sim.run(second).unwrap();
    let commit = sim.start_request(commit(session));
    sim.run(commit).unwrap();
    assert_eq!(sim.log("lb"), ["insert", "find", "commitTransaction"]);
    assert!(one_connection(&sim, "lb"));
    // A successful commit does not unpin (TX-4); ending the session does.
    assert_eq!(pool_events(&sim), ["started", "out"]);
    sim.engine.end_session(session, sim.now);
    sim.drain();
    assert_eq!(pool_events(&sim), ["started", "out", "in"]);
}

#[test]
fn a_cancelled_operation_ends_at_once_and_leaks_no_connection() {
    let mut server = SimServer::new(Role::Standalone);
    // The first find is slow; everything after answers at once.
    server.script = VecDeque::from(vec![Step::Reply {
        body: doc! { "ok": 1 },
        delay: Duration::from_secs(5),
    }]);
    let mut sim = Sim::new(vec![(address("db"), server)], |o| {
        o.topology.pool.max_pool_size = 1
    });
    let slow = sim.read(doc! { "find": "slow" });
    let waiting = sim.read(doc! { "find": "queued" });
    // Let the slow one get its command out and the other queue for the only connection.
    sim.advance_to(sim.now.saturating_add(Duration::from_millis(100)));
    assert!(sim.result(slow).is_none() && sim.result(waiting).is_none());
    sim.engine.cancel_operation(waiting, sim.now);
    sim.drain();
    let error = sim
        .result(waiting)
        .expect("a cancelled operation finishes at once")
        .unwrap_err();
    assert_eq!(error.kind, retry_core::error::ErrorKind::Cancelled);
    sim.engine.cancel_operation(slow, sim.now);
    sim.drain();
    assert!(sim.result(slow).expect("finished").is_err());
    // The in-flight attempt's connection was closed, the queued checkout withdrawn: a new
    // operation still gets a connection.
    let next = sim.read(doc! { "ping": 1 });
    sim.run(next).expect("the pool still serves");
}

/// A two-member replica set (SDAM): writes go to the primary; after it steps down and the other
/// member wins an election (a higher `electionId`), the monitors' next checks move them there.
/// The old primary, now a secondary, would refuse them with NotWritablePrimary.
#[test]
fn writes_follow_the_primary_across_a_step_down() {
    let members = replica_set(&["r0", "r1"]);
    let mut sim = Sim::new(members, |_| {});
    let insert = || doc! { "insert": "c", "documents": [{ "x": 1 }] };
    let op = sim.start(
        insert(),
        OperationKind::RetryableWrite,
        SelectionCriteria::Write,
    );
    sim.run(op).expect("the primary accepts the write");
    assert_eq!(sim.attempt_servers(op), ["r0"]);

    for (i, server) in sim.servers.values_mut().enumerate() {
        server.member.primary = i == 1;
        server.member.election = 2;
    }
    // The default heartbeatFrequencyMS is 10 s: by then both monitors have seen the election.
    let later = sim.now.saturating_add(std::time::Duration::from_secs(11));
    assert!(sim.advance_to(later));
    let op = sim.start(
        insert(),
        OperationKind::RetryableWrite,
        SelectionCriteria::Write,
    );
    sim.run(op).expect("the new primary accepts the write");
    assert_eq!(sim.attempt_servers(op), ["r1"]);
    assert_eq!(sim.servers[&address("r0")].executed.get("insert"), Some(&1));
}

/// Issue 9: a finished operation's command document, emptied, is given away
/// (`Engine::take_document`) once the next operation reuses the finished one's box, and a reply
/// built into it (`wire::to_document_in`) is the reply `wire::to_document` gives.
#[test]
fn issue9_an_emptied_command_document_is_given_for_the_next_reply() {
    let mut sim = Sim::new(
        vec![(address("db"), SimServer::new(Role::Standalone))],
        |_| {},
    );
    assert_eq!(sim.engine.take_document(), None, "nothing finished yet");
    let first = sim.read(doc! { "ping": 1, "comment": "first" });
    sim.run(first).expect("ping succeeds");
    assert_eq!(
        sim.engine.take_document(),
        None,
        "kept until the box is reused"
    );
    let second = sim.read(doc! { "ping": 1 });
    let reply = sim.run(second).expect("ping succeeds");
    let emptied = sim
        .engine
        .take_document()
        .expect("the first command's document");
    assert!(emptied.is_empty(), "its fields were dropped");
    assert_eq!(sim.engine.take_document(), None, "one per reused box");
    let raw = bson::RawDocumentBuf::try_from(&reply).unwrap();
    let template = retry_core::wire::empty_document();
    let built = retry_core::wire::to_document_in(&raw, Some(emptied), &template).unwrap();
    assert_eq!(built, retry_core::wire::to_document(&raw).unwrap());
    assert_eq!(built, reply);
}
