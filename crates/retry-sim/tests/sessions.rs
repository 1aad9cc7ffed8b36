//! Sessions and timeouts on the wire (SE-*, RW-6, RW-7, CS-4, TO-*), end to end through the engine
//! against scripted servers, in virtual time: what every attempt carries, as the server saw it.

use std::time::Duration;

use bson::{doc, Bson, Document, Timestamp};
use retry_core::engine::{CursorUse, EngineEvent, OpId, OperationRequest};
use retry_core::error::{ErrorKind, NetworkErrorKind, OperationError};
use retry_core::pool::PoolEvent;
use retry_core::retry::{OperationKind, RetryEvent};
use retry_core::selection::SelectionCriteria;
use retry_core::session::SESSIONS_UNSUPPORTED;
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::SdamEvent;

use retry_sim::{address, read_request, Role, Sim, SimServer, Step};

/// One mongos that records what it receives.
fn mongos(configure: impl FnOnce(&mut SimServer)) -> Sim {
    let mut server = SimServer::new(Role::Mongos);
    server.record_commands = true;
    configure(&mut server);
    Sim::new(vec![(address("m"), server)], |_| {})
}

fn commands(sim: &Sim) -> &[Document] {
    &sim.servers[&address("m")].commands
}

/// The commands named `name` the mongos received.
fn named<'a>(sim: &'a Sim, name: &str) -> Vec<&'a Document> {
    commands(sim)
        .iter()
        .filter(|c| c.keys().next().map(String::as_str) == Some(name))
        .collect()
}

fn insert(sim: &mut Sim) -> OpId {
    sim.start(
        doc! { "insert": "c", "documents": [{ "x": 1 }] },
        OperationKind::RetryableWrite,
        SelectionCriteria::Write,
    )
}

fn lsid(command: &Document) -> Option<&Document> {
    command.get_document("lsid").ok()
}

fn txn_number(command: &Document) -> Option<&Bson> {
    command.get("txnNumber")
}

fn usage_message(result: Result<Document, OperationError>) -> String {
    match result.map(|_| ()).expect_err("a usage error").kind {
        ErrorKind::Usage { message } => message,
        other => panic!("{other:?}"),
    }
}

/// RW-6, RW-7, SE-12 (`driver-sessions-dirty-session-errors.json`): an insert with no session of
/// the caller's retries after a network error with the same lsid and `txnNumber: 1`; the session
/// is then dirty, so the next insert has a new lsid, and a later one reuses that clean session
/// with the next txnNumber. Also SE-20: the retry reuses the same server session, though it has
/// become dirty.
#[test]
fn rw6_rw7_se12_a_retried_insert_keeps_its_lsid_and_txn_number() {
    let mut sim = mongos(|s| s.script.push_back(Step::Reset));
    let first = insert(&mut sim);
    sim.run(first).expect("the retry succeeds");
    let second = insert(&mut sim);
    sim.run(second).unwrap();
    let third = insert(&mut sim);
    sim.run(third).unwrap();
    let inserts = named(&sim, "insert");
    assert_eq!(inserts.len(), 4, "two attempts, then one each");
    assert!(lsid(inserts[0]).is_some());
    assert_eq!(lsid(inserts[0]), lsid(inserts[1]), "RW-7: same lsid");
    assert_eq!(txn_number(inserts[0]), Some(&Bson::Int64(1)));
    assert_eq!(txn_number(inserts[1]), Some(&Bson::Int64(1)), "RW-7");
    assert_ne!(
        lsid(inserts[2]),
        lsid(inserts[0]),
        "SE-12: dirty, discarded"
    );
    assert_eq!(txn_number(inserts[2]), Some(&Bson::Int64(1)));
    assert_eq!(lsid(inserts[3]), lsid(inserts[2]), "SE-5: pooled, reused");
    assert_eq!(txn_number(inserts[3]), Some(&Bson::Int64(2)), "RW-6");
}

/// SE-3, SE-9, SE-13: reads and commands carry an lsid `{id: UUID}` (binary subtype 4) and no
/// txnNumber (RW-5); an unacknowledged write carries neither.
#[test]
fn se9_se13_which_commands_carry_an_lsid() {
    let mut sim = mongos(|_| {});
    let find = sim.read(doc! { "find": "c" });
    sim.run(find).unwrap();
    let unacknowledged = sim.start(
        doc! { "insert": "c", "documents": [{}], "writeConcern": { "w": 0 } },
        OperationKind::NonRetryableWrite,
        SelectionCriteria::Write,
    );
    sim.run(unacknowledged).unwrap();
    let find = named(&sim, "find")[0];
    match lsid(find).and_then(|l| l.get("id")) {
        Some(Bson::Binary(id)) => {
            assert_eq!(id.subtype, bson::spec::BinarySubtype::Uuid);
            assert_eq!(id.bytes.len(), 16);
            assert_eq!(id.bytes[6] >> 4, 4, "UUID version 4");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(txn_number(find), None, "RW-5: no txnNumber on a read");
    let insert = named(&sim, "insert")[0];
    assert_eq!(lsid(insert), None, "SE-13: never on w:0");
    assert_eq!(txn_number(insert), None);
}

/// SE-8 (prose 18, 19): without `logicalSessionTimeoutMinutes` in the connection's handshake an
/// implicit session is dropped (no lsid, and a retryable write runs without a txnNumber, RW-2),
/// and an explicit session fails with the client error, without sending anything.
#[test]
fn se8_without_session_support_implicit_sessions_are_dropped_and_explicit_ones_fail() {
    let mut sim = mongos(|s| s.sessions = false);
    let find = sim.read(doc! { "find": "c" });
    sim.run(find).unwrap();
    let write = insert(&mut sim);
    sim.run(write).unwrap();
    assert!(commands(&sim).iter().all(|c| lsid(c).is_none()));
    assert!(commands(&sim).iter().all(|c| txn_number(c).is_none()));
    let session = sim.engine.start_session();
    let request = read_request(doc! { "find": "c" }).with_session(session);
    let explicit = sim.start_request(request);
    assert_eq!(usage_message(sim.run(explicit)), SESSIONS_UNSUPPORTED);
    assert_eq!(named(&sim, "find").len(), 1, "nothing was sent");
}

/// RW-2, SE-8 (issue 10 residual a): the monitors saw `logicalSessionTimeoutMinutes`, but the
/// pools' connections' own handshakes do not carry it. The retryable write goes without lsid and
/// txnNumber, so it is not a retryable write: an error labelled `RetryableWriteError` is raised,
/// not retried on the other mongos (whose description still says it supports sessions).
#[test]
fn rw2_se8_a_write_on_a_connection_without_sessions_is_not_retried() {
    let server = || {
        let mut server = SimServer::new(Role::Mongos);
        server.record_commands = true;
        server.script.push_back(Step::reply(doc! { "ok": 0, "code": 262,
        "codeName": "ExceededTimeLimit", "errmsg": "x", "errorLabels": ["RetryableWriteError"] }));
        server
    };
    let mut sim = Sim::new(
        vec![(address("m1"), server()), (address("m2"), server())],
        |_| {},
    );
    // The monitors' checks complete with session support; the pools' handshakes come later.
    assert!(sim.advance_to(Instant::from_millis(5)));
    for server in sim.servers.values_mut() {
        server.sessions = false;
    }
    let write = insert(&mut sim);
    let error = sim.run(write).expect_err("the error is raised");
    assert_eq!(error.code(), Some(262), "{error}");
    let inserts: Vec<&Document> = sim
        .servers
        .values()
        .flat_map(|s| s.commands.iter())
        .filter(|c| c.contains_key("insert"))
        .collect();
    assert_eq!(inserts.len(), 1, "RW-2: not retried");
    assert_eq!(txn_number(inserts[0]), None);
    assert_eq!(lsid(inserts[0]), None);
}

/// SE-10: an explicit session serves several operations with one lsid and increasing
/// txnNumbers; once ended it is refused, and its server session went back to the pool (SE-5).
/// SE-13: an explicit session with `w: 0` and a transaction without a session are refused.
#[test]
fn se10_an_explicit_session_runs_several_operations_then_ends() {
    let mut sim = mongos(|_| {});
    let session = sim.engine.start_session();
    let in_session = |sim: &mut Sim, command: Document, kind| {
        let request = OperationRequest::new("test", command, kind, SelectionCriteria::Write)
            .with_session(session);
        sim.start_request(request)
    };
    for _ in 0..2 {
        let op = in_session(
            &mut sim,
            doc! { "insert": "c", "documents": [{}] },
            OperationKind::RetryableWrite,
        );
        sim.run(op).unwrap();
    }
    let unacknowledged = in_session(
        &mut sim,
        doc! { "insert": "c", "documents": [{}], "writeConcern": { "w": 0 } },
        OperationKind::NonRetryableWrite,
    );
    assert!(usage_message(sim.run(unacknowledged)).contains("unacknowledged"));
    sim.engine.end_session(session, sim.now);
    sim.engine.end_session(session, sim.now);
    let after_end = in_session(&mut sim, doc! { "ping": 1 }, OperationKind::RunCommand);
    assert_eq!(usage_message(sim.run(after_end)), "the session has ended");
    let transaction = sim.start(
        doc! { "insert": "c", "documents": [{}] },
        OperationKind::InTransaction {
            read: false,
            first: true,
        },
        SelectionCriteria::Write,
    );
    assert!(usage_message(sim.run(transaction)).contains("explicit session"));
    let implicit = insert(&mut sim);
    sim.run(implicit).unwrap();
    let inserts = named(&sim, "insert");
    assert_eq!(inserts.len(), 3, "the refused operations sent nothing");
    assert_eq!(lsid(inserts[0]), lsid(inserts[1]));
    assert_eq!(txn_number(inserts[0]), Some(&Bson::Int64(1)));
    assert_eq!(txn_number(inserts[1]), Some(&Bson::Int64(2)));
    assert_eq!(
        lsid(inserts[2]),
        lsid(inserts[0]),
        "the ended session was pooled"
    );
    assert_eq!(txn_number(inserts[2]), Some(&Bson::Int64(3)), "RW-6");
}

/// SE-14 (prose 8, 11): a cursor's getMore carries the lsid of the find that opened it; the
/// session stays with the cursor (another operation meanwhile gets another one) and returns to
/// the pool when a reply shows cursor id 0.
#[test]
fn se14_a_cursors_get_more_uses_its_session_until_cursor_id_zero() {
    let mut sim = mongos(|s| {
        s.script.push_back(Step::reply(
            doc! { "ok": 1, "cursor": { "id": 42_i64, "ns": "test.c", "firstBatch": [] } },
        ));
        s.script.push_back(Step::reply(doc! { "ok": 1 }));
        s.script.push_back(Step::reply(
            doc! { "ok": 1, "cursor": { "id": 0_i64, "ns": "test.c", "nextBatch": [] } },
        ));
    });
    let open = |sim: &mut Sim, command: Document, kind, cursor| {
        let request =
            OperationRequest::new("test", command, kind, retry_sim::primary()).with_cursor(cursor);
        sim.start_request(request)
    };
    let find = open(
        &mut sim,
        doc! { "find": "c", "batchSize": 1 },
        OperationKind::Read,
        CursorUse::Open,
    );
    sim.run(find).unwrap();
    let handle = sim.cursor_opened(find).expect("a cursor");
    let other = sim.read(doc! { "find": "d" });
    sim.run(other).unwrap();
    let get_more = open(
        &mut sim,
        doc! { "getMore": 42_i64, "collection": "c" },
        OperationKind::GetMore,
        CursorUse::GetMore(handle),
    );
    sim.run(get_more).unwrap();
    let after = sim.read(doc! { "find": "e" });
    sim.run(after).unwrap();
    let finds = named(&sim, "find");
    let get_mores = named(&sim, "getMore");
    assert_eq!(lsid(get_mores[0]), lsid(finds[0]), "SE-14");
    assert_ne!(
        lsid(finds[1]),
        lsid(finds[0]),
        "the cursor kept its session"
    );
    assert_eq!(
        lsid(finds[2]),
        lsid(finds[0]),
        "returned at cursor id 0, LIFO"
    );
}

fn cluster_time(seconds: u32) -> Document {
    doc! { "clusterTime": Timestamp { time: seconds, increment: 1 },
    "signature": { "hash": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0; 20] },
                   "keyId": 0_i64 } }
}

/// SE-16, SE-17 (prose 3): the first command sends no `$clusterTime`; each later one sends the
/// highest seen, exactly as received. Also SE-18: cluster time starts null and replies advance it.
#[test]
fn se16_se17_cluster_time_is_gossiped() {
    let mut sim = mongos(|s| s.cluster_time = Some(cluster_time(5)));
    let first = sim.read(doc! { "ping": 1 });
    sim.run(first).unwrap();
    sim.servers.get_mut(&address("m")).unwrap().cluster_time = Some(cluster_time(4));
    for _ in 0..2 {
        let op = sim.read(doc! { "ping": 1 });
        sim.run(op).unwrap();
    }
    let pings = named(&sim, "ping");
    assert_eq!(pings[0].get("$clusterTime"), None);
    let sent = |i: usize| pings[i].get_document("$clusterTime").ok();
    assert_eq!(sent(1), Some(&cluster_time(5)));
    assert_eq!(
        sent(2),
        Some(&cluster_time(5)),
        "a lower time does not replace it"
    );
}

/// SE-15: close ends the pooled sessions with one `endSessions` on `admin` carrying their ids
/// (and no lsid of its own), then closes the pools and the topology.
#[test]
fn se15_close_ends_the_pooled_sessions_before_closing() {
    let mut sim = mongos(|_| {});
    let a = sim.read(doc! { "find": "c" });
    let b = sim.read(doc! { "find": "c" });
    sim.run(a).unwrap();
    sim.run(b).unwrap();
    let ids: Vec<&Document> = named(&sim, "find").iter().filter_map(|c| lsid(c)).collect();
    assert_ne!(ids[0], ids[1], "two sessions in use at once");
    let ids: Vec<Bson> = ids.into_iter().map(|d| Bson::Document(d.clone())).collect();
    sim.engine.close(sim.now);
    sim.drain();
    assert!(!sim.engine.is_closed(), "waiting for endSessions");
    let limit = sim.now.saturating_add(Duration::from_secs(1));
    while !sim.engine.is_closed() {
        assert!(sim.step(limit), "close did not finish");
    }
    let end = named(&sim, "endSessions");
    assert_eq!(end.len(), 1);
    let mut sent = end[0].get_array("endSessions").unwrap().clone();
    let mut expected = ids;
    sent.sort_by_key(|b| b.to_string());
    expected.sort_by_key(|b| b.to_string());
    assert_eq!(sent, expected);
    assert_eq!(end[0].get_str("$db").ok(), Some("admin"));
    assert_eq!(lsid(end[0]), None);
    assert!(sim
        .events
        .iter()
        .any(|(_, e)| matches!(e, EngineEvent::Topology(SdamEvent::TopologyClosed))));
}

/// SE-15: errors of `endSessions` are ignored and close is bounded: a server that never answers
/// holds it exactly `serverSelectionTimeoutMS` (30 s) from the close.
#[test]
fn se15_close_is_bounded_when_end_sessions_never_answers() {
    let mut sim = mongos(|_| {});
    let op = sim.read(doc! { "ping": 1 });
    sim.run(op).unwrap();
    sim.servers
        .get_mut(&address("m"))
        .unwrap()
        .script
        .push_back(Step::Reply {
            body: doc! { "ok": 1 },
            delay: Duration::from_secs(3600),
        });
    let closed_at = sim.now;
    sim.engine.close(sim.now);
    sim.drain();
    let bound = closed_at.saturating_add(Duration::from_secs(30));
    assert!(sim.advance_to(bound.saturating_sub(Duration::from_millis(1))));
    assert!(!sim.engine.is_closed());
    assert!(sim.advance_to(bound));
    assert!(sim.engine.is_closed(), "closed at the bound");
    assert!(sim.sockets.is_empty(), "every socket closed");
    assert_eq!(named(&sim, "endSessions").len(), 1);
}

/// The instants at which `op`'s attempts were written.
fn started_at(sim: &Sim, op: OpId) -> Vec<Instant> {
    sim.events
        .iter()
        .filter_map(|(at, e)| match e {
            EngineEvent::Operation {
                op: o,
                event: RetryEvent::CommandStarted { .. },
            } if *o == op => Some(*at),
            _ => None,
        })
        .collect()
}

/// A recording mongos checked every 500 ms, at 2 s, after a ping and several checks: the
/// minimum RTT of the last ones is the simulated round trip ([`retry_sim::LATENCY`], 1 ms).
fn checked_mongos() -> Sim {
    let mut sim = Sim::mongos([], |o| o.heartbeat_frequency = Duration::from_millis(500));
    let warm = sim.read(doc! { "ping": 1 });
    sim.run(warm).unwrap();
    assert!(sim.advance_to(Instant::from_millis(2_000)));
    sim
}

/// CS-4: under timeoutMS every attempt carries `maxTimeMS = remaining − minRTT` (here the
/// monitor's checks take exactly the simulated round trip, [`retry_sim::LATENCY`]), rounded down
/// and recomputed per attempt; without timeoutMS none (TO-3). Also TO-9: `minRoundTripTime` comes
/// from the topology description.
#[test]
fn cs4_max_time_ms_is_on_every_attempt_under_timeout_ms() {
    let mut sim = checked_mongos();
    sim.servers
        .get_mut(&address("m"))
        .unwrap()
        .script
        .push_back(Step::reply(
            doc! { "ok": 0, "code": 91, "errmsg": "shutting down" },
        ));
    let deadline = sim.now.saturating_add(Duration::from_millis(1_000));
    let request =
        read_request(doc! { "find": "c" }).with_timeout(OperationTimeout::Until(deadline));
    let op = sim.start_request(request);
    sim.run(op).expect("the retry succeeds");
    let finds = named(&sim, "find");
    let at = started_at(&sim, op);
    assert_eq!((finds.len(), at.len()), (2, 2));
    for (find, at) in finds.iter().zip(&at) {
        let remaining = deadline.saturating_duration_since(*at);
        let expected = (remaining - retry_sim::LATENCY).as_millis() as i32;
        assert_eq!(find.get("maxTimeMS"), Some(&Bson::Int32(expected)));
    }
    // The first attempt went out at once on the pooled connection; the retry once the mongos,
    // marked Unknown by the state-change error 91, was checked again 500 ms later.
    assert_eq!(finds[0].get("maxTimeMS"), Some(&Bson::Int32(999)));
    assert_eq!(finds[1].get("maxTimeMS"), Some(&Bson::Int32(497)));
    let legacy = sim.read(doc! { "find": "c" });
    sim.run(legacy).unwrap();
    assert_eq!(named(&sim, "find")[2].get("maxTimeMS"), None, "TO-3");
}

/// CS-4, TO-10: when the remaining time is not more than the server's minimum RTT the attempt is
/// not sent: the connection goes back to the pool (not closed) and the operation fails with a
/// timeout error.
#[test]
fn cs4_an_attempt_with_no_more_time_than_the_min_rtt_is_not_sent() {
    let mut sim = checked_mongos();
    let request = read_request(doc! { "find": "c" }).with_timeout(OperationTimeout::Until(
        sim.now.saturating_add(Duration::from_millis(1)),
    ));
    let events_before = sim.events.len();
    let op = sim.start_request(request);
    let error = sim.run(op).expect_err("a timeout");
    assert!(matches!(error.kind, ErrorKind::Timeout { .. }), "{error:?}");
    assert!(named(&sim, "find").is_empty(), "not sent");
    assert!(started_at(&sim, op).is_empty());
    let pool: Vec<&PoolEvent> = sim.events[events_before..]
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Pool { event, .. } => Some(event),
            _ => None,
        })
        .collect();
    assert!(pool
        .iter()
        .any(|e| matches!(e, PoolEvent::CheckedIn { .. })));
    assert!(!pool
        .iter()
        .any(|e| matches!(e, PoolEvent::ConnectionClosed { .. })));
}

/// TO-1, TO-3, RR-2: without timeoutMS, socketTimeoutMS bounds a command the server never
/// answers: the connection is closed with a network timeout error, the read is retried once on
/// a new connection, and fails the same way; each attempt lasted exactly socketTimeoutMS.
#[test]
fn to3_socket_timeout_bounds_a_server_that_never_answers() {
    let never = || Step::Reply {
        body: doc! { "ok": 1 },
        delay: Duration::from_secs(3600),
    };
    let mut server = SimServer::new(Role::Mongos);
    server.script.extend([never(), never()]);
    let mut sim = Sim::new(vec![(address("m"), server)], |o| {
        o.socket_timeout = Some(Duration::from_millis(200));
    });
    let op = sim.read(doc! { "find": "c" });
    let error = sim.run(op).expect_err("timed out twice");
    match &error.kind {
        ErrorKind::Network(n) => assert_eq!(n.kind, NetworkErrorKind::Timeout),
        other => panic!("{other:?}"),
    }
    let durations: Vec<Duration> = sim
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Operation {
                op: o,
                event: RetryEvent::CommandFailed { duration, .. },
            } if *o == op => Some(*duration),
            _ => None,
        })
        .collect();
    assert_eq!(durations, [Duration::from_millis(200); 2]);
}

/// TO-8: under timeoutMS socketTimeoutMS does not apply: a reply slower than it but within the
/// deadline succeeds.
#[test]
fn to8_socket_timeout_is_ignored_under_timeout_ms() {
    let mut server = SimServer::new(Role::Mongos);
    server.script.push_back(Step::Reply {
        body: doc! { "ok": 1 },
        delay: Duration::from_millis(300),
    });
    let mut sim = Sim::new(vec![(address("m"), server)], |o| {
        o.socket_timeout = Some(Duration::from_millis(100));
    });
    let request = read_request(doc! { "find": "c" }).with_timeout(
        OperationTimeout::from_timeout_ms(sim.now, Duration::from_millis(1_000)),
    );
    let op = sim.start_request(request);
    sim.run(op)
        .expect("slower than socketTimeoutMS, within timeoutMS");
}

/// TO-1, TO-2: `connectTimeoutMS` bounds establishing a connection (TCP and handshake): a load
/// balancer (no monitors) that never answers the handshake fails the connection exactly
/// `connectTimeoutMS` after it was opened, with a network timeout.
#[test]
fn to2_connect_timeout_bounds_a_handshake_that_never_answers() {
    let mut server = SimServer::new(Role::LoadBalancer { service_id: true });
    server.handshake_delay = Duration::from_secs(3600);
    let mut sim = Sim::new(vec![(address("lb"), server)], |o| {
        o.topology.load_balanced = true;
        o.connect_timeout = Duration::from_millis(300);
    });
    let start = sim.now;
    let op = sim.read(doc! { "find": "c" });
    let error = sim.run(op).expect_err("no connection");
    match &error.kind {
        ErrorKind::Network(n) => assert_eq!(n.kind, NetworkErrorKind::Timeout, "{error:?}"),
        other => panic!("{other:?}"),
    }
    let closed: Vec<Instant> = sim
        .events
        .iter()
        .filter_map(|(at, e)| match e {
            EngineEvent::Pool {
                event: PoolEvent::ConnectionClosed { .. },
                ..
            } => Some(*at),
            _ => None,
        })
        .collect();
    assert_eq!(
        closed.first(),
        Some(&start.saturating_add(Duration::from_millis(300)))
    );
}
