//! House rule 8, review9 finding 1, review10 finding 2: the client's futures drive the engine
//! (`LocalDriver`), and a future whose task never polls it again (a thread blocked on something
//! else, the branch of a `select` that lost) must stop nobody else's operation, nor its deadline.
//! B's operation starts first, then the unpolled futures (A) are polled once each in a task of
//! their own, so they are the waiting futures a wake reaches first. B is polled only when its own
//! waker is woken ([`when_woken`]), so a wake the driver failed to send is not covered up by a
//! spurious poll of the test's task (checked: with one future woken per wake, the first test
//! fails; the deadline tests then still pass, by the driver's watchdog timer).
//!
//! No outcome depends on timing (house rules 2, 5, review11 finding 3): every A is held by the
//! server for an hour and has no deadline, so it is still pending when B ends, however late B's
//! reply or deadline is handled; the assertions have no margin. Each run is bounded in time
//! (`LIMIT`); every poll is explicit or one await; the only loops run over the unpolled futures.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bson::doc;
use retry_core::error::ErrorClass;
use retry_core::monitor::ServerMonitoringMode;
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode};
use retry_driver::ClientOptions;
use retry_scenarios::{bounded, options, Server};
use retry_testkit::{FailCommand, FailPointMode, ReplicaSetMember, Role, ServerConfig};

type Client = retry_async_std::Client;

/// The bound of each run: a stalled driver fails it.
const LIMIT: Duration = Duration::from_secs(20);

/// How long the server holds an A's `find`: past `LIMIT`, so never within a run.
const HELD: Duration = Duration::from_secs(3600);

/// How long the server holds B's `count` (TK-14 `$where` sleep), so that its reply most likely
/// comes after the A's are registered. Only which wake reaches B depends on it, not the outcome.
const B_HELD_MS: u64 = 300;

/// A connected client with `options` (after one ping: the server is known, the pool has its
/// connection), then every `find` held for [`HELD`].
async fn client_with_held_finds(server: &Server, options: ClientOptions) -> Client {
    let client = Client::connect(options).expect("a client");
    // A read, so it follows the client's read preference to the server under test (a generic
    // command goes to the primary, SS-10, and some of these sets have none).
    client
        .run_command("admin", doc! { "ping": 1 }, OperationKind::Read)
        .await
        .expect("ping");
    server.handle.set_fail_command(Some(
        FailCommand::new(FailPointMode::AlwaysOn, ["find"]).with_block(HELD),
    ));
    client
}

/// Polls `a` once in a task of its own that will not poll it again (a thread blocked on something
/// else, or a `select` whose other branch won): it wakes nothing here.
fn poll_once_elsewhere<F: Future>(a: Pin<&mut F>) -> bool {
    a.poll(&mut Context::from_waker(Waker::noop())).is_pending()
}

/// B's waker: records that B was woken, and wakes the test's task.
#[derive(Default)]
struct Woken {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        if let Some(task) = self.task.lock().unwrap().take() {
            task.wake();
        }
    }
}

/// Polls `b` once with `waker`: whether it is pending.
fn poll_as<F: Future>(b: Pin<&mut F>, waker: &Arc<Woken>) -> bool {
    b.poll(&mut Context::from_waker(&Waker::from(waker.clone())))
        .is_pending()
}

/// Awaits `b`, polling it only when its own waker was woken (a strict executor): the test's
/// task is also polled for other reasons (smol's `block_on`, `bounded`'s timer), and a poll of B
/// without a wake of B's would hide a wake the driver failed to send.
async fn when_woken<F: Future>(mut b: Pin<&mut F>, waker: &Arc<Woken>) -> F::Output {
    let b_waker = Waker::from(waker.clone());
    poll_fn(|cx| {
        *waker.task.lock().unwrap() = Some(cx.waker().clone());
        if !waker.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        b.as_mut().poll(&mut Context::from_waker(&b_waker))
    })
    .await
}

/// An A: a find the server holds for [`HELD`].
async fn find(client: &Client) {
    let outcome = client
        .run_command("test", doc! { "find": "items" }, OperationKind::Read)
        .await;
    panic!("an A's find ends only after an hour: {outcome:?}");
}

/// B's reply reaches B while `unpolled` futures registered after it (woken first) are never
/// polled again: B ends with its reply, and every A is still pending. One pool connection, so the
/// A's wait for B's (no socket of theirs wakes anyone); polling monitor every `heartbeat`.
async fn reply_reaches_the_live_future_behind(unpolled: usize, heartbeat: Duration) {
    let server = Server::with_role(Role::Standalone).await;
    let mut options = options(&[&server]);
    options.heartbeat_frequency = heartbeat;
    options.server_monitoring_mode = ServerMonitoringMode::Poll;
    options.pool.max_pool_size = 1;
    let client = client_with_held_finds(&server, options).await;
    let where_sleep = format!("sleep({B_HELD_MS}) || true");
    let mut b = pin!(client.run_command(
        "test",
        doc! { "count": "items", "query": { "$where": where_sleep } },
        OperationKind::Read,
    ));
    let b_waker = Arc::new(Woken::default());
    assert!(poll_as(b.as_mut(), &b_waker), "held by the server");
    let mut a: Vec<_> = (0..unpolled).map(|_| Box::pin(find(&client))).collect();
    for a in &mut a {
        assert!(poll_once_elsewhere(a.as_mut()), "waits for the connection");
    }
    let reply = when_woken(b, &b_waker).await.expect("B's count succeeds");
    assert_eq!(reply.get_i32("n").ok(), Some(0), "{reply}");
    for a in &mut a {
        assert!(
            poll_once_elsewhere(a.as_mut()),
            "held for an hour, with no deadline"
        );
    }
    client.shutdown().await;
    server.stop().await;
}

/// Review9 finding 1 (house rule 8): B's reply reaches B while A, woken by that reply, is never
/// polled. Heartbeats are a minute apart: the reply's own wake (it wakes the two most recently
/// registered futures, A and B) is the one that ends B.
#[test]
fn an_operation_ends_while_a_woken_future_is_left_unpolled() {
    smol::block_on(bounded(
        LIMIT,
        reply_reaches_the_live_future_behind(1, Duration::from_secs(60)),
    ));
}

/// Review10 finding 2, review11 finding 3 (house rule 8): three unpolled futures are registered
/// after B, so B's reply wakes two of them only; the next wake (the monitor's timer, 500 ms at
/// most, or any other) wakes the rest, B included, and B ends with its reply: the live future is
/// woken by the `⌈log2(k + 1)⌉`-th wake after a round, the second here. (Two wakes reach four
/// futures with or without the escalation, so this does not tell the escalation apart; the
/// `DriverWaker` unit tests do.)
#[test]
fn an_operation_ends_behind_three_woken_futures_left_unpolled() {
    smol::block_on(bounded(
        LIMIT,
        reply_reaches_the_live_future_behind(3, Duration::from_millis(500)),
    ));
}

/// B's deadline passes while `unpolled` futures registered after it (woken first) are never
/// polled again: B fails with its server selection timeout (SS-8), and every A is still pending.
/// The server is a secondary with no primary: B, a write, waits for a primary until its
/// deadline; each A, a read on the secondary, is held for an hour and has no deadline (no
/// `timeoutMS`).
async fn deadline_reaches_the_live_future_behind(unpolled: usize) {
    let secondary = Role::ReplicaSetMember(ReplicaSetMember::secondary("rs"));
    let server = Server::start(ServerConfig::new(secondary)).await;
    let mut options = options(&[&server]);
    options.replica_set = Some("rs".into());
    options.read_preference = ReadPreference::from_mode(ReadPreferenceMode::SecondaryPreferred);
    options.heartbeat_frequency = Duration::from_secs(60);
    options.server_selection_timeout = Duration::from_secs(1);
    let client = client_with_held_finds(&server, options).await;
    let mut b = pin!(client.run_command(
        "test",
        doc! { "insert": "items", "documents": [{ "_id": 1 }] },
        OperationKind::RetryableWrite,
    ));
    let b_waker = Arc::new(Woken::default());
    assert!(poll_as(b.as_mut(), &b_waker), "no primary");
    let mut a: Vec<_> = (0..unpolled).map(|_| Box::pin(find(&client))).collect();
    for a in &mut a {
        assert!(poll_once_elsewhere(a.as_mut()), "held by the server");
    }
    let error = when_woken(b, &b_waker)
        .await
        .expect_err("no primary before B's deadline");
    assert_eq!(
        error.summary().class,
        ErrorClass::ServerSelection,
        "{error}"
    );
    for a in &mut a {
        assert!(
            poll_once_elsewhere(a.as_mut()),
            "held for an hour, with no deadline"
        );
    }
    client.shutdown().await;
    server.stop().await;
}

/// Review9 finding 1 (house rule 8, SS-8): B's deadline passes while A, woken by B's deadline
/// timer, is never polled; B fails at its deadline.
#[test]
fn a_deadline_ends_its_operation_while_a_woken_future_is_left_unpolled() {
    smol::block_on(bounded(LIMIT, deadline_reaches_the_live_future_behind(1)));
}

/// Review10 finding 2, review11 finding 3 (house rule 8, SS-8): three unpolled futures
/// are registered after B, so B's deadline timer, when it is the first wake after a round,
/// wakes two of them only; the driver's watchdog (`UNCLAIMED_TIMER_GRACE` later, none of the
/// woken having run the driver) or any later wake reaches B, and B fails at its deadline.
#[test]
fn a_deadline_ends_its_operation_behind_three_woken_futures_left_unpolled() {
    smol::block_on(bounded(LIMIT, deadline_reaches_the_live_future_behind(3)));
}
