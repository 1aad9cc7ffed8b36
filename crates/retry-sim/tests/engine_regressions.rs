//! Regressions found by the engine proptest (tests/engine_properties.rs): each reproduces one
//! engine bug that is now fixed.

use std::time::Duration;

use bson::doc;
use retry_core::engine::{ConnId, EngineEvent, OperationRequest};
use retry_core::error::NetworkErrorKind;
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::SrvPollingOptions;

use retry_sim::{address, primary, replica_set, Role, Sim, SimServer};

fn read_with_csot(sim: &Sim, ms: u64) -> OperationRequest {
    let mut request =
        OperationRequest::new("test", doc! { "find": "c" }, OperationKind::Read, primary());
    request.timeout = OperationTimeout::from_timeout_ms(sim.now, Duration::from_millis(ms));
    request
}

fn finished_at(sim: &Sim, op: retry_core::engine::OpId) -> Option<Instant> {
    sim.events.iter().find_map(|(t, e)| {
        matches!(e, EngineEvent::OperationFinished { op: o, .. } if *o == op).then_some(*t)
    })
}

/// Was bug 1: an idle pooled connection reported closed with NetworkErrorKind::Timeout stays
/// available in its pool (SDAM ignores post-handshake timeouts, and Pool::handle_establish_failed
/// ignores a connection that is not Pending); the next checkout gets it, the engine finds no
/// socket for it, and the operation never finishes, CSOT deadline or not.
#[test]
fn bug1_idle_pooled_connection_closed_with_a_timeout_leaks_the_next_operation() {
    let mut sim = Sim::new(
        vec![(address("db"), SimServer::new(Role::Standalone))],
        |o| o.topology.pool.max_pool_size = 1,
    );
    let first = sim.read(doc! { "find": "c" });
    sim.run(first).unwrap();
    // ConnId(1) is the monitor's socket, ConnId(2) the pooled one, now idle.
    sim.peer_close(ConnId(2), NetworkErrorKind::Timeout);
    let op = sim.start_request(read_with_csot(&sim, 5_000));
    sim.advance_to(sim.now.saturating_add(Duration::from_secs(600)));
    assert!(
        sim.result(op).is_some(),
        "expected the read to finish by its 5 s deadline; it never finished"
    );
}

/// Was bug 2 (CS-3): a connection opened for an operation with a CSOT deadline is bounded by
/// connectTimeoutMS only; the operation finishes when the slow handshake ends (5 s), not by its
/// 500 ms deadline. Load-balanced mode shows it (no monitor gates selection).
#[test]
fn bug2_csot_does_not_cap_connection_establishment() {
    let mut sim = Sim::lb([], |_| {});
    let lb = sim
        .servers
        .get_mut(&address("lb"))
        .expect("the load balancer");
    lb.handshake_delay = Duration::from_secs(5);
    let op = sim.start_request(read_with_csot(&sim, 500));
    sim.advance_to(sim.now.saturating_add(Duration::from_secs(30)));
    let at = finished_at(&sim, op).expect("finishes");
    assert!(
        at <= Instant::ZERO.saturating_add(Duration::from_millis(500)),
        "finished at {at}, expected by its 500 ms CSOT deadline"
    );
}

/// Was bug 4: when a monitor's socket fails, poll_close names it twice (the Failed branch of
/// drain_sockets queues the close, puts the ConnId back in the monitor state, and
/// monitor_check_failed queues it again).
#[test]
fn bug4_a_failed_monitor_socket_is_closed_once() {
    use retry_core::engine::{Engine, EngineOptions};
    use retry_core::topology::TopologySettings;
    let options = EngineOptions::new(
        TopologySettings::new(vec![address("db")]),
        retry_sim::handshake(),
    );
    let mut engine = Engine::new(options, Instant::ZERO).unwrap();
    engine.handle_timeout(Instant::ZERO);
    let connect = engine.poll_connect().expect("the monitor connects");
    engine.handle_connected(connect.conn, Instant::ZERO);
    while engine.poll_transmit(&mut Vec::new()).is_some() {}
    engine.handle_closed(
        connect.conn,
        NetworkErrorKind::Reset,
        None,
        Instant::from_nanos(1_000),
    );
    let mut closes = Vec::new();
    while let Some(close) = engine.poll_close() {
        closes.push(close.conn);
    }
    assert_eq!(closes, [connect.conn], "each socket is closed once");
}

/// Found by the widened engine proptest on main before issue 9 (saved seed 51b4ffe4… in
/// `engine_properties.proptest-regressions`, a replica set whose member is removed with reads in
/// flight on it): an operation dispatched to a member that the primary's `hosts` then removes was
/// never finished; its pool was closed and its socket dropped, and nothing failed it (house rule 8,
/// issue 9 item 2). Now it ends exactly once, by a network error that goes through the retry rules.
#[test]
fn a_read_in_flight_on_a_removed_member_finishes_once() {
    let members = replica_set(&["r0", "r1"]);
    let mut sim = Sim::new(members, |o| {
        o.heartbeat_frequency = Duration::from_millis(500)
    });
    // r1's answer (a refusal, it is a secondary) comes 5 s late, long after the reconfig is seen.
    sim.servers
        .get_mut(&address("r1"))
        .unwrap()
        .script
        .push_back(retry_sim::Step::Reply {
            body: doc! { "ok": 1 },
            delay: Duration::from_secs(5),
        });
    let secondary = ReadPreference::new(ReadPreferenceMode::Secondary, Vec::new(), None).unwrap();
    let op = sim.start(
        doc! { "find": "c" },
        OperationKind::Read,
        SelectionCriteria::Read(secondary),
    );
    assert!(sim.advance_to(Instant::from_millis(100)));
    assert_eq!(
        sim.attempt_servers(op),
        ["r1"],
        "dispatched to the secondary"
    );
    // The set's config drops r1 (setVersion 2); r0's monitor sees it at its next check.
    for server in sim.servers.values_mut() {
        server.member.hosts = vec!["r0:27017".to_string()];
        server.member.set_version = 2;
    }
    assert!(sim.advance_to(Instant::from_millis(60_000)));
    let finishes = sim
        .events
        .iter()
        .filter(|(_, e)| matches!(e, EngineEvent::OperationFinished { op: o, .. } if *o == op))
        .count();
    assert_eq!(
        finishes, 1,
        "the read on the removed member finishes exactly once"
    );
}

/// SP-3, SP-4 with house rule 8: reads in flight on a mongos that an SRV rescan removes from a
/// sharded topology each end exactly once; the retryable read goes to the mongos that is left
/// (RR-5) and succeeds.
#[test]
fn reads_in_flight_on_a_mongos_removed_by_srv_polling_finish_once() {
    let servers = ["m0", "m1"]
        .map(|h| (address(h), SimServer::new(Role::Mongos)))
        .into_iter()
        .collect();
    let mut sim = Sim::new(servers, |o| {
        o.srv_polling = Some(SrvPollingOptions::new(0, None));
    });
    assert!(sim.advance_to(Instant::from_millis(100)));
    // m1 answers its reads two minutes late: they are still in flight at the rescan.
    let m1 = sim.servers.get_mut(&address("m1")).unwrap();
    for _ in 0..8 {
        m1.script.push_back(retry_sim::Step::Reply {
            body: doc! { "ok": 1 },
            delay: Duration::from_secs(120),
        });
    }
    let ops: Vec<_> = (0..8).map(|_| sim.read(doc! { "find": "c" })).collect();
    assert!(sim.advance_to(Instant::from_millis(200)));
    let on_m1: Vec<_> = ops
        .iter()
        .copied()
        .filter(|op| sim.result(*op).is_none())
        .collect();
    assert!(!on_m1.is_empty(), "some reads wait on m1");
    assert!(on_m1.iter().all(|op| sim.attempt_servers(*op) == ["m1"]));
    // SP-1: the rescan is due after the minimum interval; the new record set drops m1.
    assert!(sim.advance_to(Instant::from_millis(61_000)));
    assert!(sim.engine.poll_srv_rescan(), "the rescan is due");
    let now = sim.now;
    sim.engine.handle_srv_hosts(vec![address("m0")], None, now);
    sim.drain();
    assert!(sim.advance_to(Instant::from_millis(200_000)));
    for op in ops {
        let finishes = sim
            .events
            .iter()
            .filter(|(_, e)| matches!(e, EngineEvent::OperationFinished { op: o, .. } if *o == op))
            .count();
        assert_eq!(finishes, 1, "{op:?} ends exactly once");
        assert!(
            sim.result(op).unwrap().is_ok(),
            "{op:?}: {:?}",
            sim.result(op)
        );
    }
    for op in on_m1 {
        assert_eq!(sim.attempt_servers(op), ["m1", "m0"], "RR-5: retried on m0");
    }
}
