//! CS-3, CS-1 (review item 9): under CSOT a connection checkout waits at most
//! `computedServerSelectionTimeout` = min(serverSelectionTimeoutMS, remaining timeoutMS), also
//! with `timeoutMS=0`, where waitQueueTimeoutMS no longer applies (TO-4, TO-8). In virtual time
//! against a scripted mongos whose one pooled connection stays busy.

use std::time::Duration;

use bson::doc;
use retry_core::engine::{EngineEvent, OpId, OperationRequest};
use retry_core::retry::OperationKind;
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::{SdamEvent, ServerType};

use retry_sim::{address, Role, Sim, SimServer, Step};

const SERVER_SELECTION: Duration = Duration::from_secs(2);

fn finished_at(sim: &Sim, op: OpId) -> Option<Instant> {
    sim.events.iter().find_map(|(at, e)| match e {
        EngineEvent::OperationFinished { op: o, .. } if *o == op => Some(*at),
        _ => None,
    })
}

fn read(sim: &mut Sim, timeout: OperationTimeout) -> OpId {
    let mut request = OperationRequest::new(
        "test",
        doc! { "find": "c" },
        OperationKind::Read,
        retry_sim::primary(),
    );
    request.timeout = timeout;
    sim.start_request(request)
}

#[test]
fn cs3_checkout_is_bounded_by_the_computed_server_selection_timeout() {
    let mut server = SimServer::new(Role::Mongos);
    // The first find holds the only connection for 100 s.
    server.script.push_back(Step::Reply {
        body: doc! { "ok": 1, "cursor": { "id": 0_i64, "ns": "test.c", "firstBatch": [] } },
        delay: Duration::from_secs(100),
    });
    let mut sim = Sim::new(vec![(address("m"), server)], |o| {
        o.topology.pool.max_pool_size = 1;
        o.selection.server_selection_timeout = SERVER_SELECTION;
    });
    let busy = read(&mut sim, OperationTimeout::Off);
    sim.advance_to(sim.now.saturating_add(Duration::from_millis(10)));
    let start = sim.now;
    // timeoutMS=0: no deadline of its own, and no waitQueueTimeoutMS either.
    let unbounded = read(&mut sim, OperationTimeout::Unbounded);
    // timeoutMS=10 s, above serverSelectionTimeoutMS.
    let long = read(
        &mut sim,
        OperationTimeout::Until(start.saturating_add(Duration::from_secs(10))),
    );
    // timeoutMS=1 s, below it: the operation's own deadline bounds the checkout.
    let short = read(
        &mut sim,
        OperationTimeout::Until(start.saturating_add(Duration::from_secs(1))),
    );
    sim.advance_to(start.saturating_add(Duration::from_secs(20)));
    for op in [unbounded, long, short] {
        assert!(sim.result(op).is_some_and(|r| r.is_err()), "{op:?} failed");
    }
    assert_eq!(
        finished_at(&sim, short),
        Some(start.saturating_add(Duration::from_secs(1)))
    );
    assert_eq!(
        finished_at(&sim, long),
        Some(start.saturating_add(SERVER_SELECTION))
    );
    assert_eq!(
        finished_at(&sim, unbounded),
        Some(start.saturating_add(SERVER_SELECTION))
    );
    assert!(
        sim.result(busy).is_none(),
        "still waiting for its slow reply"
    );
}

/// CS-3, CS-1 (review5 item 8): selection and checkout share one computed selection timeout,
/// counted from when selection starts; the checkout gets what is left of it, not a fresh
/// serverSelectionTimeoutMS. A one-member replica set whose primary is seen as a secondary when
/// the reads start and as the primary again at its next check (minHeartbeatFrequencyMS later),
/// and whose only connection a slow read holds: with `timeoutMS=0` and with `timeoutMS` above
/// serverSelectionTimeoutMS (1 s), the checkout fails exactly 1 s after the reads started.
#[test]
fn cs3_checkout_gets_what_is_left_of_the_selection_timeout() {
    let host = "r0";
    let mut server = SimServer::new(Role::Member);
    server.member.hosts = vec![format!("{host}:27017")];
    server.member.primary = true;
    server.script.push_back(Step::Reply {
        body: doc! { "ok": 1, "cursor": { "id": 0_i64, "ns": "test.c", "firstBatch": [] } },
        delay: Duration::from_secs(100),
    });
    let mut sim = Sim::new(vec![(address(host), server)], |o| {
        o.topology.pool.max_pool_size = 1;
        o.selection.server_selection_timeout = Duration::from_secs(1);
        o.heartbeat_frequency = Duration::from_secs(2);
    });
    let busy = read(&mut sim, OperationTimeout::Off);
    sim.advance_to(sim.now.saturating_add(Duration::from_millis(10)));
    assert!(sim.result(busy).is_none(), "holds the only connection");
    // The member steps down; the engine sees it at its next heartbeat.
    sim.servers.get_mut(&address(host)).unwrap().member.primary = false;
    let seen = |sim: &Sim| {
        sim.events.iter().any(|(_, e)| {
            matches!(e, EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { new, .. })
                if new.server_type == ServerType::RsSecondary)
        })
    };
    for _ in 0..100 {
        if seen(&sim) {
            break;
        }
        assert!(sim.step(sim.now.saturating_add(Duration::from_secs(5))));
    }
    assert!(seen(&sim), "the step-down was seen");
    // It is primary again at its next check.
    let member = &mut sim.servers.get_mut(&address(host)).unwrap().member;
    member.primary = true;
    member.election += 1;
    let start = sim.now;
    let unbounded = read(&mut sim, OperationTimeout::Unbounded);
    let long = read(
        &mut sim,
        OperationTimeout::Until(start.saturating_add(Duration::from_secs(10))),
    );
    sim.advance_to(start.saturating_add(Duration::from_secs(5)));
    let selected = sim.events.iter().any(|(at, e)| {
        *at > start
            && matches!(e, EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { new, .. })
                if new.server_type == ServerType::RsPrimary)
    });
    assert!(selected, "the primary came back during the selection");
    for op in [unbounded, long] {
        assert!(sim.result(op).is_some_and(|r| r.is_err()), "{op:?} failed");
        assert_eq!(
            finished_at(&sim, op),
            Some(start.saturating_add(Duration::from_secs(1))),
            "{op:?}"
        );
    }
}
