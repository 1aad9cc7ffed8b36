//! The pool accounting machine's load-balanced rules and establishment failures (the CMAP JSON
//! unit tests in `spec-tests` cover the rest).

use bson::oid::ObjectId;
use retry_core::address::ServerAddress;
use retry_core::error::{ErrorKind, NetworkErrorKind, NetworkPhase, OperationError};
use retry_core::pool::{
    CheckoutError, CheckoutId, CloseReason, ConnectionId, Pool, PoolAction, PoolEvent, PoolOptions,
    PoolState, Purpose,
};
use retry_core::time::Instant;
use std::time::Duration;

fn address() -> ServerAddress {
    ServerAddress::new("lb", 27017)
}

/// Drains the pool's actions, establishing every new connection at once with `service`.
fn settle(pool: &mut Pool, service: Option<ObjectId>, now: Instant) -> Vec<PoolAction> {
    let mut seen = Vec::new();
    for _ in 0..1000 {
        let Some(action) = pool.poll_action() else {
            break;
        };
        if let PoolAction::Establish { connection } = action {
            pool.handle_established(connection, service, now);
        }
        seen.push(action);
    }
    seen
}

fn checked_out(actions: &[PoolAction], checkout: CheckoutId) -> Option<ConnectionId> {
    actions.iter().find_map(|a| match a {
        PoolAction::CheckedOut {
            checkout: c,
            connection,
        } if *c == checkout => Some(*connection),
        _ => None,
    })
}

fn events(pool: &mut Pool) -> Vec<PoolEvent> {
    std::iter::from_fn(|| pool.poll_event()).collect()
}

#[test]
fn lb13_wait_queue_timeout_names_connections_by_purpose() {
    let options = PoolOptions {
        max_pool_size: 3,
        load_balanced: true,
        ..PoolOptions::default()
    };
    let mut pool = Pool::new(address(), options);
    let service = ObjectId::new();
    let t0 = Instant::ZERO;
    pool.ready(t0);
    for purpose in [Purpose::Cursor, Purpose::Transaction, Purpose::Other] {
        let id = pool.check_out(purpose, None, t0);
        assert!(checked_out(&settle(&mut pool, Some(service), t0), id).is_some());
    }
    assert_eq!(pool.in_use(), (1, 1, 1));
    let waiting = pool.check_out(Purpose::Other, Some(Instant::from_millis(50)), t0);
    assert!(settle(&mut pool, Some(service), t0).is_empty());
    assert_eq!(pool.poll_timeout(), Some(Instant::from_millis(50)));
    pool.handle_timeout(Instant::from_millis(50));
    let failed = settle(&mut pool, Some(service), t0);
    let [PoolAction::CheckoutFailed {
        checkout,
        error: CheckoutError::WaitQueueTimeout(message),
    }] = failed.as_slice()
    else {
        panic!("{failed:?}");
    };
    assert_eq!(*checkout, waiting);
    assert!(message.contains(
        "maxPoolSize: 3, connections in use by cursors: 1, connections in use by transactions: 1, connections in use by other operations: 1"
    ));
}

#[test]
fn cm5_lb15_clearing_a_service_bumps_only_its_generation_and_keeps_the_pool_ready() {
    let options = PoolOptions {
        load_balanced: true,
        ..PoolOptions::default()
    };
    let mut pool = Pool::new(address(), options);
    let (a, b) = (ObjectId::new(), ObjectId::new());
    let t0 = Instant::ZERO;
    pool.ready(t0);
    let first = pool.check_out(Purpose::Other, None, t0);
    let conn_a = checked_out(&settle(&mut pool, Some(a), t0), first).unwrap();
    let second = pool.check_out(Purpose::Other, None, t0);
    let conn_b = checked_out(&settle(&mut pool, Some(b), t0), second).unwrap();
    let _ = events(&mut pool);

    let waiter = pool.check_out(Purpose::Other, Some(Instant::from_millis(1000)), t0);
    pool.clear(Some(a), false, "network error", t0);
    assert_eq!(pool.state(), PoolState::Ready, "LB-15: not paused");
    assert_eq!(pool.service_generation(&a), 1);
    assert_eq!(pool.service_generation(&b), 0);
    assert!(events(&mut pool).contains(&PoolEvent::PoolCleared {
        service_id: Some(a),
        interrupt_in_use_connections: false
    }));
    // The waiter was not failed by the clear.
    let after = settle(&mut pool, Some(b), t0);
    assert!(!after
        .iter()
        .any(|x| matches!(x, PoolAction::CheckoutFailed { checkout, .. } if *checkout == waiter)));

    // Checking in: service a's connection is stale and closed, service b's is reused.
    pool.check_in(conn_a, true, t0);
    pool.check_in(conn_b, true, t0);
    let closed = events(&mut pool);
    assert!(closed.contains(&PoolEvent::ConnectionClosed {
        connection: conn_a,
        reason: CloseReason::Stale
    }));
    assert!(!closed.iter().any(
        |e| matches!(e, PoolEvent::ConnectionClosed { connection, .. } if *connection == conn_b)
    ));
}

/// CM-2, CM-4; also RR-11: a pool clear fails waiting checkouts with a retryable
/// `PoolClearedError`.
#[test]
fn cm2_cm4_clear_fails_waiters_with_a_retryable_pool_cleared_error() {
    let options = PoolOptions {
        max_pool_size: 1,
        ..PoolOptions::default()
    };
    let mut pool = Pool::new(address(), options);
    let t0 = Instant::ZERO;
    pool.ready(t0);
    let first = pool.check_out(Purpose::Other, None, t0);
    assert!(checked_out(&settle(&mut pool, None, t0), first).is_some());
    let waiter = pool.check_out(Purpose::Other, None, t0);
    pool.clear(None, false, "monitor failed", t0);
    let actions = settle(&mut pool, None, t0);
    let [PoolAction::CheckoutFailed {
        checkout,
        error: CheckoutError::PoolCleared(e),
    }] = actions.as_slice()
    else {
        panic!("{actions:?}");
    };
    assert_eq!(*checkout, waiter);
    assert!(e.is_retryable_read(), "CM-2: PoolClearedError is retryable");
    assert!(matches!(e.kind, ErrorKind::PoolCleared { .. }));
    assert!(e
        .to_string()
        .contains("was cleared because another operation failed with: monitor failed"));
}

#[test]
fn establishment_failure_fails_its_checkout_with_the_labelled_error() {
    let mut pool = Pool::new(address(), PoolOptions::default());
    let t0 = Instant::ZERO;
    pool.ready(t0);
    let checkout = pool.check_out(Purpose::Other, None, t0);
    let Some(PoolAction::Establish { connection }) = pool.poll_action() else {
        panic!("expected Establish")
    };
    let reset =
        OperationError::network(NetworkErrorKind::Reset, NetworkPhase::Handshake, address());
    pool.handle_establish_failed(connection, reset, Instant::from_millis(3));
    let actions: Vec<_> = std::iter::from_fn(|| pool.poll_action()).collect();
    assert_eq!(
        actions[0],
        PoolAction::Close {
            connection,
            reason: CloseReason::Error
        }
    );
    let PoolAction::CheckoutFailed {
        checkout: c,
        error: CheckoutError::Establishment(e),
    } = &actions[1]
    else {
        panic!("{actions:?}");
    };
    assert_eq!(*c, checkout);
    assert!(
        e.is_retryable_overload(),
        "HS-9: handshake network errors carry both overload labels"
    );
    assert_eq!(
        pool.state(),
        PoolState::Ready,
        "an establishment error alone does not clear the pool"
    );
}

#[test]
fn closed_pool_and_timeout_errors_are_not_retryable() {
    let mut pool = Pool::new(address(), PoolOptions::default());
    pool.close(Instant::ZERO);
    let _ = pool.check_out(Purpose::Other, None, Instant::ZERO);
    let Some(PoolAction::CheckoutFailed { error, .. }) = pool.poll_action() else {
        panic!()
    };
    let e = error.into_operation_error(&address());
    assert!(!e.is_retryable_read() && !e.was_sent());
    assert_eq!(
        e.to_string(),
        "Attempted to check out a connection from closed connection pool from lb:27017"
    );
}

/// A regression found by the engine proptest: a checkout that adopted a connection still pending
/// across a clear is served once that stale connection is closed.
#[test]
fn a_checkout_that_adopts_a_connection_pending_across_a_clear_is_answered() {
    let t = |ms: u64| Instant::ZERO.saturating_add(Duration::from_millis(ms));
    let mut pool = Pool::new(ServerAddress::new("db", 27017), PoolOptions::default());
    pool.ready(t(0));
    let _first = pool.check_out(Purpose::Other, None, t(0));
    // Connection 1 is being established for the first checkout; then the pool is cleared, which
    // fails the first checkout and leaves connection 1 pending for nobody.
    pool.clear(None, false, "network error", t(1));
    pool.ready(t(2));
    let deadline = t(1_000);
    let second = pool.check_out(Purpose::Other, Some(deadline), t(2));
    // Connection 1's handshake completes: it is stale (old generation) and is closed.
    pool.handle_established(retry_core::pool::ConnectionId(1), None, t(3));
    pool.handle_timeout(t(5_000));
    let mut answered = false;
    while let Some(action) = pool.poll_action() {
        match action {
            PoolAction::CheckedOut { checkout, .. }
            | PoolAction::CheckoutFailed { checkout, .. }
                if checkout == second =>
            {
                answered = true
            }
            PoolAction::Establish { connection } if connection.0 > 1 => answered = true,
            _ => {}
        }
    }
    assert!(answered, "checkout {second:?} was neither served, nor given a new connection, nor failed by its deadline");
}

/// CM-4 (SDAM `interruptInUse-pool-clear.json`): a clear with `interruptInUseConnections`
/// closes available connections at once and interrupts in-use ones: the pool asks for the
/// interruption, keeps the connection in use, and its check-in then emits `CheckedIn` before
/// `ConnectionClosed`, after `PoolCleared`.
#[test]
fn cm4_interrupting_a_clear_checks_the_in_use_connection_in_before_closing_it() {
    let mut pool = Pool::new(address(), PoolOptions::default());
    let t0 = Instant::ZERO;
    pool.ready(t0);
    let busy = pool.check_out(Purpose::Other, None, t0);
    let busy = checked_out(&settle(&mut pool, None, t0), busy).unwrap();
    let idle = pool.check_out(Purpose::Other, None, t0);
    let idle = checked_out(&settle(&mut pool, None, t0), idle).unwrap();
    pool.check_in(idle, true, t0);
    let _ = events(&mut pool);

    pool.clear(None, true, "monitor check timed out", t0);
    let actions = settle(&mut pool, None, t0);
    assert!(actions.contains(&PoolAction::Interrupt { connection: busy }));
    assert!(!actions
        .iter()
        .any(|a| matches!(a, PoolAction::Close { connection, .. } if *connection == busy)));
    assert_eq!(pool.in_use(), (0, 0, 1), "still in use until checked in");
    pool.check_in(busy, false, t0);
    assert_eq!(
        events(&mut pool),
        vec![
            PoolEvent::PoolCleared {
                service_id: None,
                interrupt_in_use_connections: true
            },
            PoolEvent::ConnectionClosed {
                connection: idle,
                reason: CloseReason::Stale
            },
            PoolEvent::CheckedIn { connection: busy },
            PoolEvent::ConnectionClosed {
                connection: busy,
                reason: CloseReason::Error
            },
        ]
    );
    assert_eq!(pool.total_connections(), 0);
}

/// LB-13: a connection a transaction pins counts as the transaction's from then on.
#[test]
fn lb13_a_pinned_connection_changes_purpose() {
    let options = PoolOptions {
        load_balanced: true,
        ..PoolOptions::default()
    };
    let mut pool = Pool::new(address(), options);
    let t0 = Instant::ZERO;
    pool.ready(t0);
    let id = pool.check_out(Purpose::Other, None, t0);
    let conn = checked_out(&settle(&mut pool, Some(ObjectId::new()), t0), id).unwrap();
    assert_eq!(pool.purpose(conn), Some(Purpose::Other));
    pool.set_purpose(conn, Purpose::Transaction);
    assert_eq!(pool.in_use(), (0, 1, 0));
    pool.check_in(conn, true, t0);
    assert_eq!(pool.purpose(conn), None);
    pool.set_purpose(conn, Purpose::Cursor);
    assert_eq!(
        pool.in_use(),
        (0, 0, 0),
        "an available connection is left alone"
    );
}

/// CM-1, house rule 9: with the pool's connections indexed by id and by idle time, check-in,
/// close and idle expiry behave as before among many connections: the earliest idle expiry is
/// the timeout, connections expiring together close in creation order, and a connection closed
/// while available is never handed out again.
#[test]
fn cm1_indexed_connections_expire_in_creation_order_and_closed_ones_are_never_handed_out() {
    let options = PoolOptions {
        max_pool_size: 0,
        max_connecting: 100,
        max_idle_time: Some(Duration::from_millis(100)),
        ..PoolOptions::default()
    };
    let mut pool = Pool::new(address(), options);
    let t0 = Instant::ZERO;
    pool.ready(t0);
    let mut held = Vec::new();
    for _ in 0..40 {
        let checkout = pool.check_out(Purpose::Other, None, t0);
        held.push(checked_out(&settle(&mut pool, None, t0), checkout).expect("checked out"));
    }
    // The last half goes back first (at 1 ms), the first half later (at 2 ms).
    for (i, id) in held.iter().enumerate().rev() {
        let at = if i >= 20 { 1 } else { 2 };
        pool.check_in(*id, true, Instant::from_millis(at));
    }
    assert_eq!(pool.poll_timeout(), Some(Instant::from_millis(101)));
    // Closed while available: the most recently returned ones.
    for id in &held[..5] {
        pool.handle_connection_lost(*id, Instant::from_millis(3));
    }
    assert_eq!(pool.total_connections(), 35);
    let _ = events(&mut pool);
    let checkout = pool.check_out(Purpose::Other, None, Instant::from_millis(4));
    let got = checked_out(&settle(&mut pool, None, Instant::from_millis(4)), checkout);
    assert_eq!(
        got,
        Some(held[5]),
        "the most recently returned live connection"
    );
    let _ = events(&mut pool);
    pool.handle_timeout(Instant::from_millis(101));
    let closed: Vec<ConnectionId> = events(&mut pool)
        .into_iter()
        .filter_map(|e| match e {
            PoolEvent::ConnectionClosed {
                connection,
                reason: CloseReason::Idle,
            } => Some(connection),
            _ => None,
        })
        .collect();
    assert_eq!(
        closed,
        held[20..].to_vec(),
        "the 1 ms ones, in creation order"
    );
    assert_eq!(pool.poll_timeout(), Some(Instant::from_millis(102)));
}

/// CM-8 (wait-queue timeout) and CM-1 (idle expiry, `maxIdleTimeMS`): the pool's timer follows
/// its waiters and idle connections. A checkout answered at once leaves no timer; a waiter that
/// starts its own connection keeps its queue deadline as an early, harmless wake-up.
#[test]
fn cm8_cm1_poll_timeout_follows_waiters_and_idle_connections() {
    let options = PoolOptions {
        max_pool_size: 1,
        wait_queue_timeout: Some(Duration::from_millis(100)),
        max_idle_time: Some(Duration::from_millis(1000)),
        ..PoolOptions::default()
    };
    let mut pool = Pool::new(address(), options);
    let t0 = Instant::ZERO;
    pool.ready(t0);
    assert_eq!(pool.poll_timeout(), None);
    let first = pool.check_out(Purpose::Other, None, t0);
    assert_eq!(pool.poll_timeout(), Some(Instant::from_millis(100)));
    let connection = checked_out(&settle(&mut pool, None, t0), first).expect("checked out");
    assert_eq!(pool.poll_timeout(), None);
    pool.check_in(connection, true, Instant::from_millis(10));
    assert_eq!(pool.poll_timeout(), Some(Instant::from_millis(1010)));
    let second = pool.check_out(Purpose::Other, None, Instant::from_millis(20));
    let actions = settle(&mut pool, None, Instant::from_millis(20));
    assert_eq!(checked_out(&actions, second), Some(connection));
    assert_eq!(pool.poll_timeout(), None);
    let third = pool.check_out(Purpose::Other, None, Instant::from_millis(20));
    assert!(settle(&mut pool, None, Instant::from_millis(20)).is_empty());
    assert_eq!(pool.poll_timeout(), Some(Instant::from_millis(120)));
    pool.handle_timeout(Instant::from_millis(120));
    let failed = settle(&mut pool, None, Instant::from_millis(120));
    assert!(
        matches!(failed.as_slice(), [PoolAction::CheckoutFailed { checkout, error: CheckoutError::WaitQueueTimeout(_) }] if *checkout == third),
        "{failed:?}"
    );
    assert_eq!(pool.poll_timeout(), None);
}

/// The checkouts that failed (actions, in order) with their events' checkouts (in order), after
/// `handle_timeout(now)`.
fn timed_out(pool: &mut Pool, now: Instant) -> (Vec<CheckoutId>, Vec<CheckoutId>) {
    pool.handle_timeout(now);
    let actions = settle(pool, None, now)
        .into_iter()
        .map(|a| match a {
            PoolAction::CheckoutFailed {
                checkout,
                error: CheckoutError::WaitQueueTimeout(_),
            } => checkout,
            other => panic!("only wait-queue timeouts: {other:?}"),
        })
        .collect();
    let events = events(pool)
        .into_iter()
        .filter_map(|e| match e {
            PoolEvent::CheckOutFailed { checkout, .. } => Some(checkout),
            _ => None,
        })
        .collect();
    (actions, events)
}

/// CM-3, CM-8, house rule 9 (`Pool::handle_timeout` looks only at the waiters due): waiters
/// whose expiries are not in queue order (a caller's CSOT deadline, none, or
/// `waitQueueTimeoutMS`) fail when due, each once, in queue order when several are due at once;
/// one whose connection is being established (its expiry moved past its index entry) does not
/// fail at the queue's deadline, and is due again at the caller's.
#[test]
fn cm3_cm8_waiters_with_mixed_deadlines_time_out_when_due_in_queue_order() {
    let ms = Instant::from_millis;
    // One connection, in use: every later checkout waits. No queue timeout.
    let mut pool = Pool::new(
        address(),
        PoolOptions {
            max_pool_size: 1,
            ..PoolOptions::default()
        },
    );
    pool.ready(ms(0));
    let busy = pool.check_out(Purpose::Other, None, ms(0));
    assert!(checked_out(&settle(&mut pool, None, ms(0)), busy).is_some());
    let deadlines = [Some(30), Some(10), None, Some(10), Some(20)];
    let ids: Vec<CheckoutId> = deadlines
        .iter()
        .map(|d| pool.check_out(Purpose::Other, d.map(ms), ms(0)))
        .collect();
    assert!(settle(&mut pool, None, ms(0)).is_empty(), "all wait");
    events(&mut pool);
    assert_eq!(pool.poll_timeout(), Some(ms(10)));
    assert_eq!(timed_out(&mut pool, ms(9)), (vec![], vec![]), "spurious");
    let both = vec![ids[1], ids[3]];
    assert_eq!(timed_out(&mut pool, ms(10)), (both.clone(), both));
    assert_eq!(pool.poll_timeout(), Some(ms(20)));
    assert_eq!(timed_out(&mut pool, ms(25)), (vec![ids[4]], vec![ids[4]]));
    assert_eq!(pool.poll_timeout(), Some(ms(30)));
    assert_eq!(timed_out(&mut pool, ms(30)), (vec![ids[0]], vec![ids[0]]));
    assert_eq!(pool.poll_timeout(), None, "the last one has no deadline");

    // All due at once, their deadlines in another order than the queue's.
    let mut pool = Pool::new(
        address(),
        PoolOptions {
            max_pool_size: 1,
            ..PoolOptions::default()
        },
    );
    pool.ready(ms(0));
    let busy = pool.check_out(Purpose::Other, None, ms(0));
    assert!(checked_out(&settle(&mut pool, None, ms(0)), busy).is_some());
    let ids: Vec<CheckoutId> = deadlines
        .iter()
        .map(|d| pool.check_out(Purpose::Other, d.map(ms), ms(0)))
        .collect();
    settle(&mut pool, None, ms(0));
    events(&mut pool);
    let queue_order = vec![ids[0], ids[1], ids[3], ids[4]];
    assert_eq!(
        timed_out(&mut pool, ms(40)),
        (queue_order.clone(), queue_order)
    );

    // CM-3: `waitQueueTimeoutMS` bounds only the wait in the queue. A checkout for which a
    // connection is being established outlives it (its index entry, 10 ms, is left earlier than
    // its expiry, none: it is dropped, not failed); the later waiter without one fails at it.
    let mut pool = Pool::new(
        address(),
        PoolOptions {
            max_pool_size: 2,
            wait_queue_timeout: Some(Duration::from_millis(10)),
            ..PoolOptions::default()
        },
    );
    pool.ready(ms(0));
    let busy = pool.check_out(Purpose::Other, None, ms(0));
    assert!(checked_out(&settle(&mut pool, None, ms(0)), busy).is_some());
    let establishing = pool.check_out(Purpose::Other, None, ms(0));
    let opened = std::iter::from_fn(|| pool.poll_action()).collect::<Vec<_>>();
    assert!(
        matches!(opened.as_slice(), [PoolAction::Establish { .. }]),
        "{opened:?}"
    );
    let queued = pool.check_out(Purpose::Other, None, ms(0));
    events(&mut pool);
    assert_eq!(pool.poll_timeout(), Some(ms(10)));
    assert_eq!(timed_out(&mut pool, ms(10)), (vec![queued], vec![queued]));
    assert_eq!(
        pool.poll_timeout(),
        None,
        "{establishing:?} has no expiry now"
    );
}

/// Issue 9 (CM-1, CM-8, CMAP monitoring): a pool that records no events
/// (`Pool::set_record_events(false)`, what an engine whose embedder publishes no pool events
/// sets) takes the same actions, in the same order, through checkouts that wait, a clear and a
/// close; it records none, and records again once switched back on.
#[test]
fn a_pool_without_events_takes_the_same_actions() {
    let run = |record: bool| {
        let options = PoolOptions {
            max_pool_size: 2,
            ..PoolOptions::default()
        };
        let mut pool = Pool::new(address(), options);
        pool.set_record_events(record);
        let t0 = Instant::ZERO;
        pool.ready(t0);
        let mut actions = Vec::new();
        let mut ids = Vec::new();
        for n in 0..4 {
            let deadline = Some(Instant::from_millis(100 + n));
            ids.push(pool.check_out(Purpose::Other, deadline, t0));
            actions.extend(settle(&mut pool, None, t0));
        }
        // Every connection checked out goes back (one in three unhealthy, so closed), the
        // waiting checkouts served meanwhile.
        let mut next = 0;
        while let Some(action) = actions.get(next).cloned() {
            next += 1;
            if let PoolAction::CheckedOut { connection, .. } = action {
                pool.check_in(connection, next % 3 != 0, Instant::from_millis(10));
                actions.extend(settle(&mut pool, None, Instant::from_millis(10)));
            }
        }
        assert!(ids.iter().all(|id| checked_out(&actions, *id).is_some()));
        pool.clear(None, false, "test", Instant::from_millis(20));
        pool.handle_timeout(Instant::from_millis(200));
        actions.extend(settle(&mut pool, None, Instant::from_millis(200)));
        pool.close(Instant::from_millis(300));
        actions.extend(settle(&mut pool, None, Instant::from_millis(300)));
        let recorded = events(&mut pool);
        pool.set_record_events(true);
        pool.ready(Instant::from_millis(400));
        let _ = pool.check_out(Purpose::Other, None, Instant::from_millis(400));
        (format!("{actions:?}"), recorded.len(), events(&mut pool))
    };
    let (with, recorded, _) = run(true);
    let (without, none, after) = run(false);
    assert_eq!(with, without);
    assert!(
        with.contains("CheckedOut") && with.contains("Close"),
        "{with}"
    );
    // `PoolCreated` comes before the switch, which drops it.
    assert!(recorded > 2);
    assert_eq!(none, 0);
    assert!(after
        .iter()
        .any(|e| matches!(e, PoolEvent::CheckOutStarted { .. })));
}

/// Review38 L8 (CM-5, LB-15, house rule 9: cost follows the work): with 50 services of 4
/// connections each, 2 of them in use, clearing one service closes exactly that service's 2
/// available connections, as stale, in creation order; in-use ones of it and every other
/// service's connection are left alone, and the other services keep their generation.
#[test]
fn l8_cm5_lb15_a_service_clear_among_many_closes_only_its_available_connections() {
    let options = PoolOptions {
        max_pool_size: 0,
        load_balanced: true,
        ..PoolOptions::default()
    };
    let mut pool = Pool::new(address(), options);
    let t0 = Instant::ZERO;
    pool.ready(t0);
    let services: Vec<ObjectId> = (0..50u8)
        .map(|i| ObjectId::from_bytes([i + 1; 12]))
        .collect();
    let mut by_service: Vec<Vec<ConnectionId>> = Vec::new();
    for &service in &services {
        let mut conns = Vec::new();
        for _ in 0..4 {
            let checkout = pool.check_out(Purpose::Other, None, t0);
            let actions = settle(&mut pool, Some(service), t0);
            conns.push(checked_out(&actions, checkout).expect("a new connection"));
        }
        by_service.push(conns);
    }
    // Connections 0 and 1 of each service go back: available. 2 and 3 stay in use.
    for conns in &by_service {
        pool.check_in(conns[0], true, t0);
        pool.check_in(conns[1], true, t0);
    }
    assert_eq!(pool.total_connections(), 200);
    assert_eq!(pool.in_use(), (0, 0, 100));
    let _ = events(&mut pool);

    let target = 17;
    pool.clear(Some(services[target]), false, "network error", t0);
    let actions: Vec<_> = std::iter::from_fn(|| pool.poll_action()).collect();
    let closed: Vec<_> = by_service[target][..2]
        .iter()
        .map(|&connection| PoolAction::Close {
            connection,
            reason: CloseReason::Stale,
        })
        .collect();
    assert_eq!(actions, closed);
    assert_eq!(
        events(&mut pool),
        [
            PoolEvent::PoolCleared {
                service_id: Some(services[target]),
                interrupt_in_use_connections: false,
            },
            PoolEvent::ConnectionClosed {
                connection: by_service[target][0],
                reason: CloseReason::Stale,
            },
            PoolEvent::ConnectionClosed {
                connection: by_service[target][1],
                reason: CloseReason::Stale,
            },
        ]
    );
    assert_eq!(pool.total_connections(), 198);
    assert_eq!(pool.in_use(), (0, 0, 100));
    for (i, service) in services.iter().enumerate() {
        let expected = u32::from(i == target);
        assert_eq!(pool.service_generation(service), expected, "service {i}");
    }
    // The cleared service's in-use connections are stale: closed when checked in; another
    // service's are reused.
    pool.check_in(by_service[target][2], true, t0);
    pool.check_in(by_service[target + 1][2], true, t0);
    assert_eq!(
        std::iter::from_fn(|| pool.poll_action()).collect::<Vec<_>>(),
        [PoolAction::Close {
            connection: by_service[target][2],
            reason: CloseReason::Stale,
        }]
    );
    // Interrupting: the service's last in-use connection is interrupted, nothing else moves.
    pool.clear(Some(services[target]), true, "network error", t0);
    assert_eq!(
        std::iter::from_fn(|| pool.poll_action()).collect::<Vec<_>>(),
        [PoolAction::Interrupt {
            connection: by_service[target][3],
        }]
    );
}

mod l8_counts {
    //! Review38 L8 (LB-13, CM-5, LB-15, house rule 9): the pool keeps its in-use counts and
    //! its per-service connections as it goes; these properties recount them through the public
    //! API after every input of random sequences.

    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const SERVICES: u8 = 3;

    #[derive(Clone, Debug)]
    enum Input {
        CheckOut(Purpose, Option<u64>),
        CheckIn(usize, bool),
        SetPurpose(usize, Purpose),
        Establish(usize, Option<u8>),
        EstablishFailed(usize),
        Lost(usize),
        ClearService(u8, bool),
        ClearAll(bool),
        Ready,
        Advance(u64),
        Cancel(u64),
        Close,
    }

    fn purpose() -> impl Strategy<Value = Purpose> {
        prop_oneof![
            Just(Purpose::Cursor),
            Just(Purpose::Transaction),
            Just(Purpose::Other)
        ]
    }

    fn input() -> impl Strategy<Value = Input> {
        prop_oneof![
            6 => (purpose(), proptest::option::of(1..40u64)).prop_map(|(p, d)| Input::CheckOut(p, d)),
            5 => (any::<usize>(), proptest::bool::weighted(0.8)).prop_map(|(i, h)| Input::CheckIn(i, h)),
            3 => (any::<usize>(), purpose()).prop_map(|(i, p)| Input::SetPurpose(i, p)),
            5 => (any::<usize>(), proptest::option::weighted(0.9, 0..SERVICES)).prop_map(|(i, s)| Input::Establish(i, s)),
            1 => any::<usize>().prop_map(Input::EstablishFailed),
            1 => any::<usize>().prop_map(Input::Lost),
            2 => (0..SERVICES, proptest::bool::weighted(0.3)).prop_map(|(s, i)| Input::ClearService(s, i)),
            1 => any::<bool>().prop_map(Input::ClearAll),
            1 => Just(Input::Ready),
            2 => (1..30u64).prop_map(Input::Advance),
            1 => (1..20u64).prop_map(Input::Cancel),
            1 => proptest::bool::weighted(0.05).prop_map(|close| if close { Input::Close } else { Input::Ready }),
        ]
    }

    fn service(i: u8) -> ObjectId {
        ObjectId::from_bytes([i + 1; 12])
    }

    /// What the test knows: every connection id the pool handed out, and which are pending.
    #[derive(Default)]
    struct Model {
        known: BTreeSet<ConnectionId>,
        pending: BTreeSet<ConnectionId>,
    }

    impl Model {
        fn pick(set: &BTreeSet<ConnectionId>, i: usize) -> Option<ConnectionId> {
            match set.len() {
                0 => None,
                n => set.iter().nth(i % n).copied(),
            }
        }

        fn in_use(&self, pool: &Pool) -> BTreeSet<ConnectionId> {
            self.known
                .iter()
                .copied()
                .filter(|&c| pool.purpose(c).is_some())
                .collect()
        }

        /// LB-13 recounted, connection by connection.
        fn recount(&self, pool: &Pool) -> (u32, u32, u32) {
            let mut counts = (0, 0, 0);
            for &c in &self.known {
                match pool.purpose(c) {
                    Some(Purpose::Cursor) => counts.0 += 1,
                    Some(Purpose::Transaction) => counts.1 += 1,
                    Some(Purpose::Other) => counts.2 += 1,
                    None => {}
                }
            }
            counts
        }

        /// Connections open, established, and not in use.
        fn available(&self, pool: &Pool) -> BTreeSet<ConnectionId> {
            self.known
                .iter()
                .copied()
                .filter(|c| !self.pending.contains(c))
                .filter(|&c| pool.connection_generation(c).is_some() && pool.purpose(c).is_none())
                .collect()
        }

        /// Drains the actions; wait-queue timeouts must carry `counts` (LB-13).
        fn drain(&mut self, pool: &mut Pool, counts: Option<(u32, u32, u32)>) -> Vec<PoolAction> {
            let mut seen = Vec::new();
            for _ in 0..10_000 {
                let Some(action) = pool.poll_action() else {
                    break;
                };
                match &action {
                    PoolAction::Establish { connection } => {
                        assert!(self.known.insert(*connection));
                        self.pending.insert(*connection);
                    }
                    PoolAction::Close { connection, .. } => {
                        self.pending.remove(connection);
                    }
                    PoolAction::CheckoutFailed {
                        error: CheckoutError::WaitQueueTimeout(message),
                        ..
                    } => {
                        let (cursors, transactions, other) =
                            counts.expect("a wait-queue timeout only from handle_timeout");
                        assert_eq!(
                            message,
                            &format!(
                                "Timeout waiting for connection from the connection pool. maxPoolSize: 3, connections in use by cursors: {cursors}, connections in use by transactions: {transactions}, connections in use by other operations: {other}"
                            )
                        );
                    }
                    _ => {}
                }
                seen.push(action);
            }
            seen
        }
    }

    fn run(min_pool_size: u32, inputs: &[Input]) {
        let options = PoolOptions {
            max_pool_size: 3,
            min_pool_size,
            load_balanced: true,
            ..PoolOptions::default()
        };
        let mut pool = Pool::new(address(), options);
        let mut model = Model::default();
        let mut now = Instant::ZERO;
        let mut checkouts = 0u64;
        let error =
            OperationError::network(NetworkErrorKind::Reset, NetworkPhase::Handshake, address());
        pool.ready(now);
        model.drain(&mut pool, None);
        for input in inputs {
            let mut counts = None;
            let mut cleared = None;
            match input {
                Input::CheckOut(purpose, deadline) => {
                    let deadline = deadline.map(|ms| now.saturating_add(Duration::from_millis(ms)));
                    pool.check_out(*purpose, deadline, now);
                    checkouts += 1;
                }
                Input::CheckIn(i, healthy) => {
                    if let Some(c) = Model::pick(&model.in_use(&pool), *i) {
                        pool.check_in(c, *healthy, now);
                    }
                }
                Input::SetPurpose(i, purpose) => {
                    // Any connection, in use or not (a connection not in use is left alone).
                    if let Some(c) = Model::pick(&model.known, *i) {
                        pool.set_purpose(c, *purpose);
                    }
                }
                Input::Establish(i, s) => {
                    if let Some(c) = Model::pick(&model.pending, *i) {
                        model.pending.remove(&c);
                        pool.handle_established(c, s.map(service), now);
                    }
                }
                Input::EstablishFailed(i) => {
                    if let Some(c) = Model::pick(&model.pending, *i) {
                        model.pending.remove(&c);
                        pool.hold_establishing_checkout(c);
                        pool.handle_establish_failed(c, error.clone(), now);
                    }
                }
                Input::Lost(i) => {
                    if let Some(c) = Model::pick(&model.known, *i) {
                        pool.handle_connection_lost(c, now);
                    }
                }
                Input::ClearService(s, interrupt) => {
                    let s = service(*s);
                    // CM-5, LB-15: exactly the service's available connections are closed (and
                    // its in-use ones interrupted when asked), in creation order.
                    let of_service = |c: &ConnectionId| {
                        pool.connection_generation(*c)
                            .is_some_and(|(_, service)| service == Some(s))
                    };
                    let available = model.available(&pool);
                    let in_use = model.in_use(&pool);
                    let expected: Vec<PoolAction> = model
                        .known
                        .iter()
                        .filter(|c| of_service(c))
                        .filter_map(|&connection| {
                            if available.contains(&connection) {
                                Some(PoolAction::Close {
                                    connection,
                                    reason: CloseReason::Stale,
                                })
                            } else if *interrupt && in_use.contains(&connection) {
                                Some(PoolAction::Interrupt { connection })
                            } else {
                                None
                            }
                        })
                        .collect();
                    let closing = pool.state() != PoolState::Closed;
                    pool.clear(Some(s), *interrupt, "network error", now);
                    cleared = Some(if closing { expected } else { Vec::new() });
                }
                Input::ClearAll(interrupt) => pool.clear(None, *interrupt, "monitor", now),
                Input::Ready => pool.ready(now),
                Input::Advance(ms) => {
                    now = now.saturating_add(Duration::from_millis(*ms));
                    // Failing waiters moves no connection: the message counts are these.
                    counts = Some(model.recount(&pool));
                    pool.handle_timeout(now);
                }
                Input::Cancel(back) => {
                    if checkouts > 0 {
                        pool.cancel_checkout(
                            CheckoutId(checkouts.saturating_sub(*back % checkouts).max(1)),
                            now,
                        );
                    }
                }
                Input::Close => pool.close(now),
            }
            let actions = model.drain(&mut pool, counts);
            if let Some(expected) = cleared {
                assert_eq!(actions, expected, "{input:?}");
            }
            assert_eq!(pool.in_use(), model.recount(&pool), "after {input:?}");
            let _ = events(&mut pool);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// L8, LB-13: the kept in-use counts equal a recount after every checkout, check-in,
        /// purpose change, establishment, loss, clear and timeout, and every LB-13 wait-queue
        /// timeout message names the recounted numbers; CM-5/LB-15: a service clear closes
        /// exactly that service's available connections.
        #[test]
        fn l8_lb13_kept_counts_match_a_recount(
            min_pool_size in 0..2u32,
            inputs in proptest::collection::vec(input(), 0..80),
        ) {
            run(min_pool_size, &inputs);
        }
    }
}
