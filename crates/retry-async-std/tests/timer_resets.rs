//! Issue 9, house rule 9: the driver's runtime timer is not re-registered per operation. Under
//! `timeoutMS` (CS-1) every operation has a deadline of its own (CS-2), the engine's earliest;
//! the driver re-arms its runtime timer only when that deadline moves earlier than the instant
//! the timer is set for (or that instant has passed), never when it moves later. On async-io each
//! re-registration notifies the reactor (an `eventfd` write and one more `epoll` wait with
//! polling's four fixed syscalls), so a re-arm per operation would double a round trip's
//! syscalls. Every operation still ends by its deadline (house rule 8): the timer is never set
//! later than the engine's earliest deadline (`csot_deadline_is_respected` in `scenarios.rs`).

use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bson::doc;
use retry_async_std::AsyncIoRuntime;
use retry_core::error::ErrorClass;
use retry_core::retry::OperationKind;
use retry_core::time::Instant;
use retry_driver::{AsyncTimer, BoxFuture, Runtime, Socket};
use retry_scenarios::{bounded, options, Server, SCENARIO_LIMIT};
use retry_testkit::{FailCommand, FailPointMode, Role};

/// async-io, with every timer reset counted and the moment of each kept.
#[derive(Debug)]
struct CountingRuntime {
    inner: AsyncIoRuntime,
    resets: Arc<AtomicUsize>,
    moments: Moments,
}

type Moments = Arc<Mutex<Vec<std::time::Instant>>>;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Debug)]
struct CountingTimer {
    inner: Pin<Box<dyn AsyncTimer>>,
    resets: Arc<AtomicUsize>,
    moments: Moments,
}

impl AsyncTimer for CountingTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        self.resets.fetch_add(1, Ordering::Relaxed);
        lock(&self.moments).push(std::time::Instant::now());
        self.inner.as_mut().reset(at);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.inner.as_mut().poll(cx)
    }
}

impl Runtime for CountingRuntime {
    fn start() -> io::Result<CountingRuntime> {
        Ok(CountingRuntime {
            inner: AsyncIoRuntime::start()?,
            resets: Arc::default(),
            moments: Arc::default(),
        })
    }

    fn now(&self) -> Instant {
        self.inner.now()
    }

    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        Box::pin(CountingTimer {
            inner: self.inner.new_timer(at),
            resets: self.resets.clone(),
            moments: self.moments.clone(),
        })
    }

    fn spawns(&self) -> bool {
        self.inner.spawns()
    }

    fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
        self.inner.connect(host, port)
    }
}

/// Timer resets during `pings` sequential pings (after a warm-up), one in flight, with the
/// given `timeoutMS`.
fn resets_during(pings: usize, timeout: Option<Duration>) -> usize {
    smol::block_on(bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let runtime = CountingRuntime::start().expect("async-io");
        let resets = runtime.resets.clone();
        let mut options = options(&[&server]);
        // No heartbeat within the test: only the operations move the engine's deadlines.
        options.heartbeat_frequency = Duration::from_secs(3_600);
        options.timeout = timeout;
        let client = retry_driver::Client::connect_on(runtime, options).expect("a client");
        let ping = || client.run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand);
        for _ in 0..5 {
            ping().await.expect("ping");
        }
        let before = resets.load(Ordering::Relaxed);
        for _ in 0..pings {
            ping().await.expect("ping");
        }
        let during = resets.load(Ordering::Relaxed) - before;
        client.shutdown().await;
        server.stop().await;
        during
    }))
}

/// CS-2, house rule 9: 200 pings under `timeoutMS=60000`, each with its own deadline, re-arm
/// the runtime's timer once at most (its instant passes only after a minute): not twice per
/// ping, as when every change of the engine's earliest deadline re-registered it.
#[test]
fn per_operation_deadlines_do_not_re_arm_the_timer_per_operation() {
    let resets = resets_during(200, Some(Duration::from_secs(60)));
    assert!(resets <= 1, "{resets} timer resets in 200 pings");
}

/// Without `timeoutMS` the engine's earliest deadline does not move per operation: no reset.
#[test]
fn without_timeout_ms_pings_do_not_reset_the_timer() {
    assert_eq!(resets_during(200, None), 0);
}

/// CS-5, house rule 8: the timer left set for an earlier operation's deadline (a ping's) is not
/// re-armed when a later operation starts (a find the server holds for an hour, whose deadline is
/// later); it fires first, is re-armed for the find's deadline, and the find ends with its
/// timeout, not before its `timeoutMS`.
#[test]
fn a_timer_set_for_an_earlier_deadline_is_re_armed_and_the_later_one_is_met() {
    const TIMEOUT: Duration = Duration::from_millis(200);
    let (class, elapsed, ping_start, moments) = smol::block_on(bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let runtime = CountingRuntime::start().expect("async-io");
        let moments = runtime.moments.clone();
        let mut options = options(&[&server]);
        options.heartbeat_frequency = Duration::from_secs(3_600);
        options.timeout = Some(TIMEOUT);
        let client = retry_driver::Client::connect_on(runtime, options).expect("a client");
        let ping_start = std::time::Instant::now();
        client
            .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
            .await
            .expect("ping");
        server.handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::AlwaysOn, ["find"])
                .with_block(Duration::from_secs(3_600)),
        ));
        // The find's deadline comes clearly after the ping's.
        async_io::Timer::after(Duration::from_millis(20)).await;
        let before = lock(&moments).len();
        let start = std::time::Instant::now();
        let error = client
            .run_command("test", doc! { "find": "items" }, OperationKind::Read)
            .await
            .expect_err("the deadline passes");
        let elapsed = start.elapsed();
        let during = lock(&moments)[before..].to_vec();
        client.shutdown().await;
        server.stop().await;
        (error.summary().class, elapsed, ping_start, during)
    }));
    assert_eq!(class, ErrorClass::Timeout);
    assert!(
        elapsed >= TIMEOUT,
        "ended after {elapsed:?}, before its timeoutMS"
    );
    // No reset before the ping's deadline (at least `TIMEOUT` after the ping started): not when
    // the find started; the first is the re-arm when the timer set for the ping's fired.
    assert!(
        !moments.is_empty(),
        "the timer was re-armed for the find's deadline"
    );
    let early: Vec<_> = moments
        .iter()
        .map(|m| m.duration_since(ping_start))
        .filter(|since| *since < TIMEOUT)
        .collect();
    assert!(
        early.is_empty(),
        "resets before the ping's deadline: {early:?}"
    );
}
