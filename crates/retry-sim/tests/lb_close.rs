//! LB-9, LB-11, CM-7 (review38 L4): closing the client checks in the connection of a cursor
//! whose getMore failed with a network error (kept checked out since, LB-11), closed with reason
//! error, before the pool closes; and a healthy cursor's connection goes back too.

use std::time::Duration;

use retry_core::engine::EngineEvent;
use retry_core::pool::PoolEvent;
use retry_core::retry::OperationKind;
use retry_sim::{cursor_batch, get_more, open_cursor, Sim, Step};

/// The pool events of `sim` by short name, closes with their reason.
fn pool_events(sim: &Sim) -> Vec<String> {
    sim.events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Pool { event, .. } => Some(match event {
                PoolEvent::CheckedOut { .. } => "out".to_string(),
                PoolEvent::CheckedIn { .. } => "in".to_string(),
                PoolEvent::ConnectionClosed { reason, .. } => format!("closed({reason:?})"),
                PoolEvent::PoolClosed => "pool closed".to_string(),
                _ => return None,
            }),
            _ => None,
        })
        .collect()
}

/// Closes the client and drives it until it is closed (bounded).
fn close(sim: &mut Sim) {
    sim.engine.close(sim.now);
    sim.drain();
    for _ in 0..100 {
        if sim.engine.is_closed() {
            return;
        }
        let until = sim.now.saturating_add(Duration::from_millis(100));
        assert!(sim.advance_to(until));
    }
    assert!(sim.engine.is_closed(), "closed within 10 s");
}

/// LB-9, LB-11, CM-7 (review38 L4): a cursor's connection that died under a getMore is checked
/// in and closed (reason error) at client close, before `PoolClosed`.
#[test]
fn lb9_lb11_close_checks_in_a_cursor_connection_that_died_under_a_get_more() {
    let mut sim = Sim::lb(
        [Step::reply(cursor_batch(42, "firstBatch")), Step::Reset],
        |_| {},
    );
    let find = sim.start_request(open_cursor(OperationKind::Read));
    sim.run(find).expect("the cursor opens");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    let more = sim.start_request(get_more(42, cursor));
    assert!(sim.run(more).is_err(), "the connection was reset");
    assert_eq!(pool_events(&sim), ["out"], "LB-11: kept for the cursor");
    close(&mut sim);
    assert_eq!(
        pool_events(&sim),
        ["out", "in", "closed(Error)", "pool closed"]
    );
}

/// LB-10, CM-7: a healthy cursor's connection goes back at client close and is closed with the
/// pool (no killCursors is owed by the engine at close).
#[test]
fn lb10_close_checks_in_a_healthy_cursor_connection() {
    let mut sim = Sim::lb([Step::reply(cursor_batch(42, "firstBatch"))], |_| {});
    let find = sim.start_request(open_cursor(OperationKind::Read));
    sim.run(find).expect("the cursor opens");
    close(&mut sim);
    let events = pool_events(&sim);
    assert_eq!(events[..2], ["out", "in"], "{events:?}");
    assert_eq!(events.last().map(String::as_str), Some("pool closed"));
    let (outs, ins) = (
        events.iter().filter(|e| *e == "out").count(),
        events.iter().filter(|e| *e == "in").count(),
    );
    assert_eq!(outs, ins, "{events:?}");
}
