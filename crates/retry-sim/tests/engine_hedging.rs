//! Hedged reads in the engine (issue 12 item 1, gRPC A6 `hedgingPolicy`), in the simulated
//! driver: which operations are hedged, copies on distinct servers (A6-H7), the fast copy wins and
//! the slow ones are cancelled (A6-H3), a cancelled copy's connection drains and is checked in
//! after its reply or closed at the deadline, each copy has its own implicit session (SE-9), and
//! the command events balance (EV-1).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bson::{doc, Bson, Document, Timestamp};
use retry_core::engine::{CommandEvent, ConnId, EngineEvent, OpId, OperationRequest};
use retry_core::error::ErrorKind;
use retry_core::hedging::{CopyId, CopyStage, HedgingEvent};
use retry_core::pool::PoolEvent;
use retry_core::retry::{OperationKind, RetryEvent};
use retry_core::selection::SelectionCriteria;
use retry_core::service_config::ServiceConfig;
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::{SdamEvent, ServerType};
use retry_sim::{address, overload, Role, Sim, SimServer, Step};

const SLOW: Duration = Duration::from_millis(1_000);

fn ms(n: u64) -> Instant {
    Instant::ZERO.saturating_add(Duration::from_millis(n))
}

/// `find` hedged with `maxAttempts` and `hedgingDelay`, 462 non-fatal.
fn hedging_config(max_attempts: i32, delay: &str) -> ServiceConfig {
    ServiceConfig::from_document(&doc! { "methodConfig": [{
    "name": [{ "service": "mongodb", "method": "find" }],
    "hedgingPolicy": { "maxAttempts": max_attempts, "hedgingDelay": delay,
                       "nonFatalStatusCodes": [462] } }] })
    .expect("valid config")
}

/// Three mongos; `m3` answers at once, `m1` and `m2` after [`SLOW`]. Every reply names its server.
/// The topology is discovered before the test starts.
fn cluster(config: ServiceConfig, seed: u64) -> Sim {
    let servers = ["m1", "m2", "m3"]
        .into_iter()
        .map(|host| {
            let mut server = SimServer::new(Role::Mongos);
            let delay = if host == "m3" { Duration::ZERO } else { SLOW };
            let body = doc! { "ok": 1, "server": host, "cursor": { "id": 0_i64, "ns": "test.c", "firstBatch": [] } };
            server.script = (0..4).map(|_| Step::Reply { body: body.clone(), delay }).collect();
            server.record_commands = true;
            (address(host), server)
        })
        .collect();
    let mut sim = Sim::new(servers, |o| {
        o.service_config = Some(config);
        o.command_monitoring = true;
        o.seed = seed;
    });
    assert!(sim.advance_to(ms(100)));
    sim
}

fn hedging_events(sim: &Sim, op: OpId) -> Vec<(Instant, HedgingEvent)> {
    sim.events
        .iter()
        .filter_map(|(at, e)| match e {
            EngineEvent::Hedging { op: o, event } if *o == op => Some((*at, event.clone())),
            _ => None,
        })
        .collect()
}

fn started(sim: &Sim, op: OpId) -> Vec<(CopyId, String)> {
    hedging_events(sim, op)
        .into_iter()
        .filter_map(|(_, e)| match e {
            HedgingEvent::CopyStarted { copy, address } => Some((copy, address.host().to_string())),
            _ => None,
        })
        .collect()
}

fn finish_time(sim: &Sim, op: OpId) -> Instant {
    sim.events
        .iter()
        .find_map(|(at, e)| {
            matches!(e, EngineEvent::OperationFinished { op: o, .. } if *o == op).then_some(*at)
        })
        .expect("finished")
}

/// The connection (driver side) each hedged copy's command went on, by host.
fn command_connections(sim: &Sim) -> BTreeMap<String, ConnId> {
    sim.events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Command(command) => match &**command {
                CommandEvent::Started { info, .. } => {
                    Some((info.address.host().to_string(), info.connection))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// EV-1: every started command has exactly one end, with the same request id and connection.
fn assert_command_events_balance(sim: &Sim) {
    let mut open = BTreeSet::new();
    for (at, event) in &sim.events {
        let EngineEvent::Command(event) = event else {
            continue;
        };
        match &**event {
            CommandEvent::Started { info, .. } => {
                assert!(
                    open.insert((info.connection, info.request_id)),
                    "{at}: started twice"
                );
            }
            CommandEvent::Succeeded { info, .. } | CommandEvent::Failed { info, .. } => {
                assert!(
                    open.remove(&(info.connection, info.request_id)),
                    "{at}: an end without its start: {info:?}"
                );
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "commands without an end: {open:?}");
}

/// A6-H1, A6-H3, A6-H7, EV-1: with a zero delay the three copies go at once to the three mongos;
/// `m3`'s reply wins after one round trip, the two slow copies are cancelled in flight, their
/// commands end with the cancelled error, and their connections stay checked out until their
/// replies arrive a second later, then are checked in (not closed).
#[test]
fn a6_h3_the_fast_copy_wins_and_the_slow_copies_drain_and_are_checked_in() {
    let mut sim = cluster(hedging_config(3, "0s"), 7);
    let start = sim.now;
    let op = sim.read(doc! { "find": "c" });
    let reply = sim.run(op).expect("m3 answers");
    assert_eq!(reply.get_str("server").ok(), Some("m3"));
    let done = finish_time(&sim, op);
    // A new connection's handshake (1 ms), then the round trip's reply (1 ms).
    assert_eq!(done, start.saturating_add(Duration::from_millis(2)));

    let copies = started(&sim, op);
    let hosts: BTreeSet<&str> = copies.iter().map(|(_, h)| h.as_str()).collect();
    assert_eq!(copies.len(), 3, "{copies:?}");
    assert_eq!(hosts.len(), 3, "A6-H7: distinct servers: {copies:?}");
    let events = hedging_events(&sim, op);
    let cancelled: Vec<_> = events
        .iter()
        .filter_map(|(_, e)| match e {
            HedgingEvent::CopyCancelled {
                stage: CopyStage::InFlight(a),
                ..
            } => Some(a.host().to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(cancelled.len(), 2, "{events:?}");
    assert!(!cancelled.contains(&"m3".to_string()));

    // EV-1: the cancelled copies' commands failed with the cancelled error when cancelled.
    let failed: Vec<_> = sim
        .events
        .iter()
        .filter_map(|(at, e)| match e {
            EngineEvent::Command(command) => match &**command {
                CommandEvent::Failed { info, failure, .. } => {
                    Some((*at, info.address.host().to_string(), failure.kind.clone()))
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    for (at, _, kind) in &failed {
        assert_eq!(*kind, ErrorKind::Cancelled);
        assert!(*at <= done);
    }

    // The slow connections are still checked out; nothing closed them.
    let conns = command_connections(&sim);
    let slow: Vec<ConnId> = ["m1", "m2"].iter().map(|h| conns[*h]).collect();
    assert!(slow.iter().all(|c| sim.sockets.contains_key(c)));
    let checked_in_before = checked_in(&sim, &["m1", "m2"]);
    assert!(sim.advance_to(
        start
            .saturating_add(SLOW)
            .saturating_add(Duration::from_millis(50))
    ));
    let checked_in_after = checked_in(&sim, &["m1", "m2"]);
    assert_eq!(
        checked_in_after - checked_in_before,
        2,
        "both drained and checked in"
    );
    assert!(
        slow.iter().all(|c| sim.sockets.contains_key(c)),
        "not closed"
    );
    assert!(!sim.events.iter().any(|(_, e)| matches!(
        e,
        EngineEvent::Pool {
            event: PoolEvent::ConnectionClosed { .. },
            ..
        }
    )));
    assert_command_events_balance(&sim);
    assert_eq!(
        sim.events
            .iter()
            .filter(|(_, e)| matches!(e, EngineEvent::OperationFinished { .. }))
            .count(),
        1
    );
}

fn checked_in(sim: &Sim, hosts: &[&str]) -> usize {
    sim.events
        .iter()
        .filter(|(_, e)| match e {
            EngineEvent::Pool {
                address,
                event: PoolEvent::CheckedIn { .. },
            } => hosts.contains(&address.host()),
            _ => false,
        })
        .count()
}

/// A drained connection is lent to nobody until its reply: with one connection per pool, the next
/// read to a slow server waits for the drained reply (then reuses the connection).
#[test]
fn a_draining_connection_is_not_lent_until_its_reply() {
    let servers = ["m1", "m2"]
        .into_iter()
        .map(|host| {
            let mut server = SimServer::new(Role::Mongos);
            let delay = if host == "m2" { Duration::ZERO } else { SLOW };
            server.script = (0..4)
                .map(|_| Step::Reply {
                    body: doc! { "ok": 1, "server": host },
                    delay,
                })
                .collect();
            (address(host), server)
        })
        .collect();
    let mut sim = Sim::new(servers, |o| {
        o.service_config = Some(hedging_config(2, "0s"));
        o.topology.pool.max_pool_size = 1;
    });
    assert!(sim.advance_to(ms(100)));
    let first = sim.read(doc! { "find": "c" });
    assert_eq!(sim.run(first).unwrap().get_str("server").ok(), Some("m2"));
    // The second read's copies go to both servers again; m1's waits for the drained connection.
    let second = sim.read(doc! { "find": "c" });
    assert_eq!(sim.run(second).unwrap().get_str("server").ok(), Some("m2"));
    let m1_connections = sim
        .events
        .iter()
        .filter(|(_, e)| matches!(e, EngineEvent::Pool { address, event: PoolEvent::ConnectionCreated { .. } } if address.host() == "m1"))
        .count();
    assert_eq!(
        m1_connections, 1,
        "the drained connection is reused, not replaced"
    );
}

/// CS-5, A6-H3: a cancelled copy whose reply does not come by the operation's deadline has its
/// connection closed then (by the connection's own deadline), and checked in as closed.
#[test]
fn cs_5_a_drained_connection_without_a_reply_by_the_deadline_is_closed() {
    let mut sim = cluster(hedging_config(3, "0s"), 7);
    let start = sim.now;
    let mut request = retry_sim::read_request(doc! { "find": "c" });
    request.timeout = OperationTimeout::from_timeout_ms(start, Duration::from_millis(200));
    let op = sim.start_request(request);
    assert_eq!(sim.run(op).unwrap().get_str("server").ok(), Some("m3"));
    assert!(sim.advance_to(start.saturating_add(Duration::from_millis(300))));
    let closed: Vec<_> = sim
        .events
        .iter()
        .filter_map(|(at, e)| match e {
            EngineEvent::Pool {
                address,
                event: PoolEvent::ConnectionClosed { .. },
            } => Some((*at, address.host().to_string())),
            _ => None,
        })
        .collect();
    let deadline = start.saturating_add(Duration::from_millis(200));
    assert_eq!(closed.len(), 2, "{closed:?}");
    assert!(
        closed.iter().all(|(at, h)| *at == deadline && h != "m3"),
        "{closed:?}"
    );
    assert_command_events_balance(&sim);
}

/// SE-9, SE-7: each copy carries its own implicit session, so two copies never use one server
/// session at the same time.
#[test]
fn se_9_each_copy_has_its_own_implicit_session() {
    let mut sim = cluster(hedging_config(3, "0s"), 7);
    let op = sim.read(doc! { "find": "c" });
    sim.run(op).unwrap();
    let lsids: BTreeSet<String> = sim
        .servers
        .values()
        .flat_map(|s| &s.commands)
        .filter(|c| c.contains_key("find"))
        .map(|c| format!("{:?}", c.get_document("lsid").expect("an lsid")))
        .collect();
    assert_eq!(lsids.len(), 3);
}

/// Only reads in an implicit session are hedged: a read in an explicit session and a write run
/// under the retry rules, one attempt at a time.
#[test]
fn only_reads_in_implicit_sessions_are_hedged() {
    let config = ServiceConfig::from_document(&doc! { "methodConfig": [{
    "name": [{ "service": "mongodb" }],
    "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0s" } }] })
    .unwrap();
    let mut sim = cluster(config, 7);
    let session = sim.engine.start_session();
    let request = retry_sim::read_request(doc! { "find": "c" }).with_session(session);
    let explicit = sim.start_request(request);
    sim.run(explicit).unwrap();
    let write = sim.start(
        doc! { "insert": "c", "documents": [{ "x": 1 }] },
        OperationKind::RetryableWrite,
        SelectionCriteria::Write,
    );
    sim.run(write).unwrap();
    for op in [explicit, write] {
        assert!(hedging_events(&sim, op).is_empty());
        assert_eq!(sim.attempt_servers(op).len(), 1);
    }
    let implicit = sim.read(doc! { "find": "c" });
    sim.run(implicit).unwrap();
    assert_eq!(started(&sim, implicit).len(), 3);
    assert!(!sim.events.iter().any(|(_, e)| matches!(
        e,
        EngineEvent::Operation { op, event: RetryEvent::CommandStarted { .. } } if *op == implicit
    )));
}

/// A6-H1, A6-H2: with a delay, the second copy starts `hedgingDelay` after the first; a non-fatal
/// failure (462) starts the next copy at once.
#[test]
fn a6_h2_a_non_fatal_failure_starts_the_next_copy_at_once() {
    let servers = ["m1", "m2", "m3"]
        .into_iter()
        .map(|host| {
            let mut server = SimServer::new(Role::Mongos);
            server.always = Some(("find".into(), overload(462)));
            (address(host), server)
        })
        .collect();
    let mut sim = Sim::new(servers, |o| {
        o.service_config = Some(hedging_config(3, "0.5s"));
    });
    assert!(sim.advance_to(ms(100)));
    let start = sim.now;
    let op = sim.read(doc! { "find": "c" });
    let error = sim.run(op).unwrap_err();
    assert_eq!(error.code(), Some(462), "A6-H4: the last failure is raised");
    let starts: Vec<Instant> = hedging_events(&sim, op)
        .into_iter()
        .filter_map(|(at, e)| matches!(e, HedgingEvent::CopyStarted { .. }).then_some(at))
        .collect();
    let at = |n| start.saturating_add(Duration::from_millis(n));
    // Each copy is written 1 ms after it starts (its new connection's handshake) and fails 1 ms
    // later; the next copy starts at once, not 500 ms later.
    assert_eq!(starts, [at(1), at(3), at(5)]);
    let hosts: BTreeSet<String> = started(&sim, op).into_iter().map(|(_, h)| h).collect();
    assert_eq!(hosts.len(), 3, "A6-H7");
}

/// Cancelling a hedged operation cancels every copy: it finishes once with the cancelled error and
/// the copies in flight drain.
#[test]
fn cancelling_a_hedged_read_drains_its_copies() {
    let mut sim = cluster(hedging_config(2, "0s"), 3);
    // Both copies on slow servers: take m3 out of the picture.
    sim.servers.get_mut(&address("m3")).unwrap().script = (0..4)
        .map(|_| Step::Reply {
            body: doc! { "ok": 1 },
            delay: SLOW,
        })
        .collect();
    let op = sim.read(doc! { "find": "c" });
    assert!(sim.advance_to(sim.now.saturating_add(Duration::from_millis(10))));
    sim.engine.cancel_operation(op, sim.now);
    sim.drain();
    let error = sim.result(op).expect("finished").unwrap_err();
    assert_eq!(error.kind, ErrorKind::Cancelled);
    assert!(sim.advance_to(sim.now.saturating_add(SLOW)));
    assert_command_events_balance(&sim);
    let cancelled = hedging_events(&sim, op)
        .into_iter()
        .filter(|(_, e)| matches!(e, HedgingEvent::CopyCancelled { .. }))
        .count();
    assert_eq!(cancelled, 2);
    let finished = sim
        .events
        .iter()
        .filter(|(_, e)| matches!(e, EngineEvent::OperationFinished { op: o, .. } if *o == op))
        .count();
    assert_eq!(finished, 1);
}

/// Closing the engine with draining connections closes them and finishes; their sessions are
/// ended with the others (SE-15).
#[test]
fn close_closes_draining_connections() {
    let mut sim = cluster(hedging_config(3, "0s"), 7);
    let op = sim.read(doc! { "find": "c" });
    sim.run(op).unwrap();
    let now = sim.now;
    sim.engine.close(now);
    sim.drain();
    assert!(sim.advance_to(now.saturating_add(Duration::from_secs(5))));
    assert!(sim.engine.is_closed());
    assert!(
        sim.sockets.is_empty(),
        "{:?}",
        sim.sockets.keys().collect::<Vec<_>>()
    );
    // SE-15: the three copies' sessions (the winner's and the two still draining) are ended.
    let ended: usize = sim
        .servers
        .values()
        .flat_map(|s| &s.commands)
        .filter_map(|c| c.get_array("endSessions").ok())
        .map(|ids| ids.len())
        .sum();
    assert_eq!(ended, 3);
}

/// House rule 2: the same seed and inputs give the same trace.
#[test]
fn the_same_seed_gives_the_same_hedged_trace() {
    let trace = |seed| {
        let mut sim = cluster(hedging_config(3, "0.005s"), seed);
        let op = sim.read(doc! { "find": "c" });
        sim.run(op).unwrap();
        assert!(sim.advance_to(sim.now.saturating_add(SLOW)));
        sim.events
    };
    assert_eq!(trace(11), trace(11));
}

/// The reply carries the winner's fields only.
#[test]
fn the_winner_reply_is_the_result() {
    let mut sim = cluster(hedging_config(2, "0s"), 5);
    let op = sim.read(doc! { "find": "c" });
    let reply = sim.run(op).unwrap();
    let winner = hedging_events(&sim, op)
        .into_iter()
        .find_map(|(_, e)| match e {
            HedgingEvent::CopySucceeded { address, .. } => Some(address.host().to_string()),
            _ => None,
        });
    assert_eq!(reply.get("server").cloned(), winner.map(Bson::String));
    let _: Document = reply;
}

/// A6 retries from the service config: a command's `retryPolicy` runs it under the gRPC retry
/// rules (`maxAttempts` 2: one retry of the overloaded find), and a command named without a
/// policy is not retried at all.
#[test]
fn a6_the_service_config_retry_policy_and_no_policy_apply_per_command() {
    let config = ServiceConfig::from_document(&doc! { "methodConfig": [
    { "name": [{ "service": "mongodb", "method": "find" }],
      "retryPolicy": { "maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
                       "backoffMultiplier": 1, "retryableStatusCodes": [462] } },
    { "name": [{ "service": "mongodb", "method": "count" }] } ] })
    .unwrap();
    let servers = vec![(address("db"), {
        let mut server = SimServer::new(Role::Standalone);
        server.always = Some(("find".into(), overload(462)));
        server
    })];
    let mut sim = Sim::new(servers, |o| o.service_config = Some(config));
    sim.servers.get_mut(&address("db")).unwrap().script =
        std::iter::repeat_n(Step::reply(overload(462)), 8).collect();
    let find = sim.read(doc! { "find": "c" });
    assert_eq!(sim.run(find).unwrap_err().code(), Some(462));
    assert_eq!(sim.attempt_servers(find).len(), 2, "maxAttempts 2");
    let count = sim.read(doc! { "count": "c" });
    assert_eq!(sim.run(count).unwrap_err().code(), Some(462));
    assert_eq!(sim.attempt_servers(count).len(), 1, "no policy: no retries");
    // A command the config does not name keeps the client's retry rules (3 attempts, BP-10).
    let distinct = sim.read(doc! { "distinct": "c", "key": "x" });
    assert_eq!(sim.run(distinct).unwrap_err().code(), Some(462));
    assert_eq!(sim.attempt_servers(distinct).len(), 3);
}

/// A cancelled copy whose drained reply opened a cursor gets it closed: a `killCursors` for that
/// cursor on that server, with the copy's own `lsid` (SE-14), and no operation reports it.
#[test]
fn a_drained_reply_that_opened_a_cursor_is_followed_by_kill_cursors() {
    let mut sim = cluster(hedging_config(3, "0s"), 7);
    for host in ["m1", "m2"] {
        let body = doc! { "ok": 1, "server": host,
        "cursor": { "id": 42_i64, "ns": "test.c", "firstBatch": [{ "x": 1 }] } };
        sim.servers.get_mut(&address(host)).unwrap().script =
            [Step::Reply { body, delay: SLOW }].into_iter().collect();
    }
    let op = sim.read(doc! { "find": "c" });
    assert_eq!(sim.run(op).unwrap().get_str("server").ok(), Some("m3"));
    assert!(sim.advance_to(
        sim.now
            .saturating_add(SLOW)
            .saturating_add(Duration::from_millis(50))
    ));
    for host in ["m1", "m2"] {
        let commands = &sim.servers[&address(host)].commands;
        let find = commands
            .iter()
            .find(|c| c.contains_key("find"))
            .expect("a find");
        let kill = commands
            .iter()
            .find(|c| c.contains_key("killCursors"))
            .unwrap_or_else(|| panic!("{host}: no killCursors in {commands:?}"));
        assert_eq!(kill.get_str("killCursors").ok(), Some("c"));
        assert_eq!(kill.get_array("cursors").unwrap(), &vec![Bson::Int64(42)]);
        assert_eq!(kill.get_str("$db").ok(), Some("test"));
        assert_eq!(
            kill.get("lsid"),
            find.get("lsid"),
            "{host}: the copy's session"
        );
    }
    let finished = sim
        .events
        .iter()
        .filter(|(_, e)| matches!(e, EngineEvent::OperationFinished { .. }))
        .count();
    assert_eq!(finished, 1, "the killCursors are the engine's own");
    assert_command_events_balance(&sim);
}

/// A6 deadline rule, CS-4, A6-H3 (review5 item 10): a late copy that cannot be sent (its
/// remaining time is not more than its server's minimum RTT) is a non-fatal outcome that starts no
/// further copy; the copy in flight still answers before the deadline and is the result.
/// Here (scaled down from the review's 100/60/50 ms, the simulated minimum RTT being 1 ms):
/// timeoutMS 61 ms, hedgingDelay 60 ms, each reply 59.5 ms late (60.5 ms after the request).
#[test]
fn a6_cs4_a_late_copy_that_cannot_be_sent_does_not_fail_the_copy_in_flight() {
    let late = Duration::from_micros(59_500);
    let servers = ["m1", "m2"]
        .into_iter()
        .map(|host| {
            let mut server = SimServer::new(Role::Mongos);
            let body = doc! { "ok": 1, "server": host };
            server.script = (0..4)
                .map(|_| Step::Reply {
                    body: body.clone(),
                    delay: late,
                })
                .collect();
            (address(host), server)
        })
        .collect();
    let mut sim = Sim::new(servers, |o| {
        o.service_config = Some(hedging_config(2, "0.06s"));
        o.heartbeat_frequency = Duration::from_millis(500);
        // Both pools hold an idle connection, so each copy is sent when it is selected.
        o.topology.pool.min_pool_size = 1;
    });
    // Several 1 ms heartbeats: each server's minimum RTT is 1 ms.
    assert!(sim.advance_to(ms(2_000)));
    let start = sim.now;
    let mut request = OperationRequest::new(
        "test",
        doc! { "find": "c" },
        OperationKind::Read,
        SelectionCriteria::Write,
    );
    request.timeout = OperationTimeout::Until(start.saturating_add(Duration::from_millis(61)));
    let op = sim.start_request(request);
    let reply = sim.run(op).expect("copy 1 answers before the deadline");
    assert_eq!(
        finish_time(&sim, op),
        start.saturating_add(Duration::from_micros(60_500)),
        "copy 1's reply: 59.5 ms, then the 1 ms latency"
    );
    let events = hedging_events(&sim, op);
    let copy_1 = events.iter().find_map(|(_, e)| match e {
        HedgingEvent::CopySucceeded { copy, address, .. } => {
            Some((*copy, address.host().to_string()))
        }
        _ => None,
    });
    assert_eq!(
        copy_1
            .as_ref()
            .map(|(c, h)| (*c, reply.get_str("server").ok() == Some(h.as_str()))),
        Some((CopyId(1), true))
    );
    let failed: Vec<(Instant, CopyId, bool)> = events
        .iter()
        .filter_map(|(at, e)| match e {
            HedgingEvent::CopyFailed { copy, fatal, .. } => Some((*at, *copy, *fatal)),
            _ => None,
        })
        .collect();
    assert_eq!(
        failed,
        [(
            start.saturating_add(Duration::from_millis(60)),
            CopyId(2),
            false
        )],
        "copy 2 is not sent and fails non-fatally"
    );
    assert_eq!(started(&sim, op).len(), 1, "only copy 1 was sent");
}

/// SE-16, A6-H3 (review7 finding 6: a drained reply is read in place by the attempts' reply
/// reader, with the same results): a cancelled copy's reply still gossips its `$clusterTime`
/// (the next command carries it) and still reports its state-change error to SDAM
/// (ShutdownInProgress 91: the server is marked Unknown and its pool cleared).
#[test]
fn a_drained_reply_gossips_its_cluster_time_and_reports_its_error() {
    let mut sim = cluster(hedging_config(3, "0s"), 7);
    let time = doc! { "clusterTime": Timestamp { time: 50, increment: 1 }, "signature": { "keyId": 0_i64 } };
    let replies = [
        (
            "m1",
            doc! { "ok": 1, "$clusterTime": time.clone(),
            "cursor": { "id": 0_i64, "ns": "test.c", "firstBatch": [] } },
        ),
        (
            "m2",
            doc! { "ok": 0, "code": 91, "errmsg": "shutting down" },
        ),
    ];
    for (host, body) in replies {
        sim.servers.get_mut(&address(host)).unwrap().script =
            [Step::Reply { body, delay: SLOW }].into_iter().collect();
    }
    let op = sim.read(doc! { "find": "c" });
    assert_eq!(sim.run(op).unwrap().get_str("server").ok(), Some("m3"));
    let won = sim.now;
    assert!(sim.advance_to(
        won.saturating_add(SLOW)
            .saturating_add(Duration::from_millis(50))
    ));
    let after_win = |sim: &Sim| -> Vec<EngineEvent> {
        let events = sim.events.iter().filter(|(at, _)| *at > won);
        events.map(|(_, e)| e.clone()).collect()
    };
    let unknown = after_win(&sim).into_iter().any(|e| {
        matches!(e, EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { address: a, new, .. })
            if a == address("m2") && new.server_type == ServerType::Unknown)
    });
    let cleared = after_win(&sim).into_iter().any(|e| {
        matches!(e, EngineEvent::Pool { address: a, event: PoolEvent::PoolCleared { .. } }
            if a == address("m2"))
    });
    assert!(unknown && cleared, "m2's drained error reached SDAM");
    let ping = sim.read(doc! { "ping": 1 });
    sim.run(ping).unwrap();
    let sent: Vec<&Document> = sim
        .servers
        .values()
        .flat_map(|s| &s.commands)
        .filter(|c| c.contains_key("ping"))
        .collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].get_document("$clusterTime").ok(), Some(&time));
}
