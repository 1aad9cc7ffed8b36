//! The engine end to end against scripted in-memory servers, in virtual time, with the bounded
//! simulated driver of `support/sim.rs`.

use std::collections::VecDeque;
use std::time::Duration;

use bson::{doc, Bson};
use retry_core::engine::EngineEvent;
use retry_core::pool::PoolEvent;
use retry_core::retry::RetryEvent;
use retry_core::time::Instant;

#[path = "support/sim.rs"]
mod sim;

use sim::{address, overload, Role, Sim, SimServer, Step};

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
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Operation {
                event: RetryEvent::RetryScheduled { delay, .. },
                ..
            } => Some(*delay),
            _ => None,
        })
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
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Operation {
                event: RetryEvent::RetryScheduled { reason, .. },
                ..
            } => Some(*reason),
            _ => None,
        })
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
