//! Hedged reads end to end (issue 12 item 1, gRPC A6 `hedgingPolicy`): a client whose service
//! config hedges `find` against two retry-testkit mongos, one of which holds every `find` for a
//! while (`blockConnection` / `blockTimeMS`).

use std::time::Duration;

use bson::doc;
use retry_core::engine::{CommandEvent, EngineEvent, OpId};
use retry_core::error::ErrorKind;
use retry_core::hedging::{CopyStage, HedgingEvent};
use retry_core::pool::PoolEvent;
use retry_core::retry::OperationKind;
use retry_driver::{Runtime, TimedEvent};
use retry_testkit::{FailCommand, FailPointMode, Role};

use crate::{bounded, connect, options, Server, SCENARIO_LIMIT};

/// How long the slow mongos holds each `find`.
const BLOCK: Duration = Duration::from_millis(1_500);

/// A6-H1, A6-H3, A6-H7, EV-1: the two copies of a hedged find go to both mongos at once; the
/// fast one's reply is the result; the slow one's copy is cancelled in flight (its command ends
/// with the cancelled error) and its connection stays checked out until the blocked reply
/// arrives, then is checked in, not closed. The slow server ran the find to the end.
pub async fn hedged_read_the_fast_copy_wins_and_the_slow_connection_is_checked_in<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let slow = Server::with_role(Role::Mongos).await;
        let fast = Server::with_role(Role::Mongos).await;
        slow.handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::AlwaysOn, ["find"]).with_block(BLOCK),
        ));
        let mut options = options(&[&slow, &fast]);
        options
            .set_service_config(&doc! { "methodConfig": [{
                "name": [{ "service": "mongodb", "method": "find" }],
                "hedgingPolicy": { "maxAttempts": 2, "hedgingDelay": "0s" } }] })
            .expect("a valid service config");
        let client = connect::<R>(options);
        let (slow_address, fast_address) = (slow.server_address(), fast.server_address());
        // Until both mongos are known the two copies may share one; a few rounds at most.
        for _ in 0..20 {
            slow.handle.reset_counters();
            let mut events = client.events();
            let reply = client
                .run_command("test", doc! { "find": "items" }, OperationKind::Read)
                .await
                .expect("the fast mongos answers");
            assert!(reply.get_document("cursor").is_ok(), "{reply}");
            let mut seen = events.drain();
            let op = finished_op(&seen);
            let copies: Vec<_> = hedging(&seen, op)
                .filter_map(|e| match e {
                    HedgingEvent::CopyStarted { address, .. } => Some(address.clone()),
                    _ => None,
                })
                .collect();
            if !(copies.contains(&slow_address) && copies.contains(&fast_address)) {
                continue;
            }
            assert_eq!(copies.len(), 2, "A6-H1: maxAttempts 2: {copies:?}");
            let winner = hedging(&seen, op).find_map(|e| match e {
                HedgingEvent::CopySucceeded { address, .. } => Some(address.clone()),
                _ => None,
            });
            assert_eq!(winner.as_ref(), Some(&fast_address), "the fast copy wins");
            let cancelled = hedging(&seen, op).any(|e| {
                matches!(e, HedgingEvent::CopyCancelled { stage: CopyStage::InFlight(a), .. } if *a == slow_address)
            });
            assert!(cancelled, "A6-H3: the slow copy is cancelled in flight");
            // EV-1: the slow copy's command ended with the cancelled error.
            let slow_failed = seen.iter().any(|(_, e)| {
                matches!(e, EngineEvent::Command(c) if matches!(&**c,
                    CommandEvent::Failed { info, failure, .. }
                    if info.address == slow_address && failure.kind == ErrorKind::Cancelled))
            });
            assert!(slow_failed, "the slow copy's command failed as cancelled");
            assert_eq!(slow_check_ins(&seen, &slow_address, op), 0, "still draining");
            // The slow connection goes back once its reply is in.
            while slow_check_ins(&seen, &slow_address, op) == 0 {
                let event = events.next_event().await.expect("the client is running");
                seen.push(event);
            }
            let closed = seen.iter().any(|(_, e)| {
                matches!(e, EngineEvent::Pool { address, event: PoolEvent::ConnectionClosed { .. } }
                    if *address == slow_address)
            });
            assert!(!closed, "the drained connection is checked in, not closed");
            let counters = slow.handle.counters();
            assert_eq!(counters.command("find").received, 1);
            assert_eq!(counters.connections_closed, 0, "{counters:?}");
            client.shutdown().await;
            slow.stop().await;
            fast.stop().await;
            return;
        }
        panic!("the two copies never went to both mongos");
    })
    .await
}

/// The operation whose `OperationFinished` is among `events` (the round's one operation).
fn finished_op(events: &[TimedEvent]) -> OpId {
    events
        .iter()
        .find_map(|(_, e)| match e {
            EngineEvent::OperationFinished { op, .. } => Some(*op),
            _ => None,
        })
        .expect("the find finished")
}

fn hedging(events: &[TimedEvent], op: OpId) -> impl Iterator<Item = &HedgingEvent> {
    events.iter().filter_map(move |(_, e)| match e {
        EngineEvent::Hedging { op: o, event } if *o == op => Some(event),
        _ => None,
    })
}

/// Check-ins on `address` after `op` finished.
fn slow_check_ins(
    events: &[TimedEvent],
    address: &retry_core::address::ServerAddress,
    op: OpId,
) -> usize {
    let Some(finished) = events
        .iter()
        .position(|(_, e)| matches!(e, EngineEvent::OperationFinished { op: o, .. } if *o == op))
    else {
        return 0;
    };
    events[finished..]
        .iter()
        .filter(|(_, e)| {
            matches!(e, EngineEvent::Pool { address: a, event: PoolEvent::CheckedIn { .. } } if a == address)
        })
        .count()
}
