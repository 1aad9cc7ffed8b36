//! House rule 10 (review28 U4, review29 V1 and V4, review30 W1): the conformance checks can
//! fail. Each test runs a check on a runtime that delegates to [`TokioRuntime`] but breaks one
//! rule of the contract, and requires the check's `ErrorKind::Other` naming the step and the
//! rule; one (review30 W2) shows a wake that the contract allows is not failed. Only
//! 127.0.0.1; every wait is bounded by the check (1 s per wait for a wake, 10 s in all, on std's
//! clock, house rule 12): each test ends within about 1 s.

use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use retry_core::time::Instant;
use retry_driver::conformance::{check_read_armed, check_timer};
use retry_driver::{AsyncTimer, BoxFuture, Runtime, Socket};
use retry_tokio::TokioRuntime;

/// The rule a [`Breaking`] runtime breaks.
#[derive(Debug, Clone, Copy)]
enum Breaks {
    /// Its short reads say they are armed, but register no waker (review28 U4, house rule 8).
    ArmsWithoutRegistering,
    /// The read of the last bytes before the end of the stream says it is armed, but registers
    /// no waker: as a runtime whose armed wakes come for bytes only, not for the end (review28
    /// U1). Earlier reads are not armed.
    ArmsForBytesOnly,
    /// Its reads that fill the buffer say they are armed too (review28 U3).
    ArmsFullReads,
    /// It does not spawn, and its timers' polls wake their waker before returning (review26
    /// S5, review28 U10; the rule binds only runtimes that do not spawn, review29 V3).
    TimerWakesInPoll,
    /// It does not spawn, and its timers' resets wake the last poll's waker before returning
    /// (review29 V4).
    TimerWakesInReset,
    /// It says it does not spawn, so its timers must not wake the last poll's waker from a
    /// reset to an instant already past either, which tokio's `Sleep` does (review28 U10).
    SpawnsNot,
    /// Its timers are `Ready` at every poll (review29 V4).
    TimerReadyAtOnce,
    /// Its clock runs 1000 times slower than its timers', which fire long before their instant
    /// on it (review29 V4).
    TimerEarly,
    /// Its timers ignore a reset to an instant before they were made (review29 V4).
    TimerIgnoresPastReset,
    /// Its timers never fire (review29 V1).
    TimerNeverFires,
    /// Its timers fire, but are never `Ready`: each poll after firing has its waker woken again
    /// 20 ms later (review29 V1).
    TimerNeverReady,
    /// It does not spawn, and its timers' polls wake the waker they replace, even one that
    /// `will_wake` theirs: the second arming of the driver's watchdog, which polls with one
    /// waker under the lock that waker's wake takes, would deadlock (review30 W1). Its resets
    /// make a new tokio timer, so that tokio's own wake on a reset to the past does not fail
    /// the check first.
    TimerWakesReplaced,
    /// It spawns, and each poll of its timers after a reset wakes its own waker and returns
    /// `Pending` until the executor has run, as tokio's `Sleep` does once its task's coop budget
    /// is spent (review30 W2, review31 X5): allowed, the last step's poll after a reset to the
    /// past included.
    TimerSpentBudget,
    /// It does not spawn, and its timers' resets wake the waker of the last poll when that poll
    /// was `Ready`: only the reset after a firing, the watchdog's re-arming (review30 W3).
    TimerWakesInResetAfterFiring,
    /// Its timers' first poll after each reset wakes its waker, long before the instant (an
    /// early wake, allowed), and no later poll's waker is woken: they never fire (review30 W6,
    /// review31 X2).
    TimerWokenEarlyOnly,
    /// It does not spawn, and its timers have a thread of their own ([`ThreadTimer`]) which
    /// fires them as the contract says (review31 X1: no false failure).
    ThreadTimer,
    /// As [`Breaks::ThreadTimer`], but the timer's thread wakes the waker while holding the
    /// timer's lock: the watchdog's re-arm from within that wake would deadlock on it
    /// (review31 X1, example 1).
    TimerWakesUnderItsLock,
    /// As [`Breaks::ThreadTimer`], but its resets hand the instant to the timer's thread and
    /// wait for its reply, and the thread wakes the waker of the instant it replaces before
    /// replying: a wake that blocks on the watchdog's lock, which the reset's caller holds
    /// (review31 X1, example 2).
    TimerResetWaitsForItsThread,
    /// As [`Breaks::ThreadTimer`], but a reset before the timer's first poll is lost: the
    /// watchdog's timer, made for `Instant::MAX` and first reset unpolled, never fires
    /// (review31 X1).
    TimerIgnoresResetBeforeFirstPoll,
    /// As [`Breaks::ThreadTimer`], but a `Ready` poll drops the waker, and the next poll does
    /// not register its own: the watchdog's arming after a `Ready` one never fires (review31
    /// X1).
    TimerUnregisteredAfterReady,
}

/// tokio, breaking one rule.
#[derive(Debug)]
struct Breaking {
    inner: Arc<TokioRuntime>,
    breaks: Breaks,
}

impl Runtime for Breaking {
    fn start() -> io::Result<Breaking> {
        Ok(Breaking {
            inner: Arc::new(TokioRuntime::start()?),
            breaks: Breaks::ArmsWithoutRegistering,
        })
    }

    fn now(&self) -> Instant {
        let now = self.inner.now();
        match self.breaks {
            Breaks::TimerEarly => Instant::from_nanos(now.as_nanos() / 1000),
            _ => now,
        }
    }

    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        let timer = self.inner.new_timer(at);
        match self.breaks {
            Breaks::TimerWakesInPoll => Box::pin(WakingTimer(timer)),
            Breaks::TimerWakesInReset => Box::pin(ResetWakingTimer {
                inner: timer,
                last: None,
            }),
            Breaks::TimerReadyAtOnce => Box::pin(ReadyTimer),
            Breaks::TimerIgnoresPastReset => Box::pin(ForwardTimer {
                inner: timer,
                made: self.inner.now(),
            }),
            Breaks::TimerNeverFires => Box::pin(SilentTimer),
            Breaks::TimerNeverReady => Box::pin(UnreadyTimer {
                inner: timer,
                fired: false,
            }),
            Breaks::TimerWakesReplaced => Box::pin(ReplacingTimer {
                runtime: self.inner.clone(),
                inner: timer,
                waker: None,
            }),
            Breaks::TimerSpentBudget => Box::pin(BudgetTimer {
                inner: timer,
                renewed: renewal(),
            }),
            Breaks::TimerWakesInResetAfterFiring => Box::pin(FiredResetWakingTimer {
                inner: timer,
                ready: None,
            }),
            Breaks::TimerWokenEarlyOnly => Box::pin(EarlyTimer { polled: false }),
            Breaks::ThreadTimer
            | Breaks::TimerWakesUnderItsLock
            | Breaks::TimerResetWaitsForItsThread
            | Breaks::TimerIgnoresResetBeforeFirstPoll
            | Breaks::TimerUnregisteredAfterReady => {
                Box::pin(ThreadTimer::new(self.inner.clone(), at, self.breaks))
            }
            _ => timer,
        }
    }

    fn spawns(&self) -> bool {
        !matches!(
            self.breaks,
            Breaks::SpawnsNot
                | Breaks::TimerWakesInPoll
                | Breaks::TimerWakesInReset
                | Breaks::TimerWakesReplaced
                | Breaks::TimerWakesInResetAfterFiring
                | Breaks::ThreadTimer
                | Breaks::TimerWakesUnderItsLock
                | Breaks::TimerResetWaitsForItsThread
                | Breaks::TimerIgnoresResetBeforeFirstPoll
                | Breaks::TimerUnregisteredAfterReady
        )
    }

    fn spawn(&self, future: BoxFuture<()>) -> io::Result<()> {
        self.inner.spawn(future)
    }

    fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
        let connect = self.inner.connect(host, port);
        let breaks = self.breaks;
        Box::pin(async move {
            let inner = connect.await?;
            Ok(Box::pin(BreakingSocket {
                inner,
                breaks,
                read: 0,
            }) as Pin<Box<dyn Socket>>)
        })
    }
}

/// The bytes `check_read_armed` has its peer send before it closes (10, then 100: its doc).
const SENT: usize = 110;

struct BreakingSocket {
    inner: Pin<Box<dyn Socket>>,
    breaks: Breaks,
    /// The bytes read so far.
    read: usize,
}

impl Socket for BreakingSocket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.inner.as_mut().poll_read(cx, buf)
    }

    fn poll_read_armed(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<(usize, bool)>> {
        let len = buf.len();
        match self.breaks {
            // A ready tokio read registers nothing.
            Breaks::ArmsWithoutRegistering => self
                .inner
                .as_mut()
                .poll_read(cx, buf)
                .map_ok(|n| (n, n > 0 && n < len)),
            Breaks::ArmsForBytesOnly => {
                let read = self.inner.as_mut().poll_read(cx, buf);
                read.map_ok(|n| {
                    self.read += n;
                    (n, n > 0 && self.read == SENT)
                })
            }
            Breaks::ArmsFullReads => self
                .inner
                .as_mut()
                .poll_read_armed(cx, buf)
                .map_ok(|(n, armed)| (n, armed || n == len)),
            _ => self.inner.as_mut().poll_read_armed(cx, buf),
        }
    }

    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.inner.as_mut().poll_write(cx, buf)
    }
}

/// A timer whose every poll wakes its waker before it returns.
#[derive(Debug)]
struct WakingTimer(Pin<Box<dyn AsyncTimer>>);

impl AsyncTimer for WakingTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        self.0.as_mut().reset(at);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        cx.waker().wake_by_ref();
        self.0.as_mut().poll(cx)
    }
}

/// A timer whose every reset wakes its last poll's waker before it returns.
#[derive(Debug)]
struct ResetWakingTimer {
    inner: Pin<Box<dyn AsyncTimer>>,
    last: Option<Waker>,
}

impl AsyncTimer for ResetWakingTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        if let Some(last) = &self.last {
            last.wake_by_ref();
        }
        self.inner.as_mut().reset(at);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.last = Some(cx.waker().clone());
        self.inner.as_mut().poll(cx)
    }
}

/// A timer `Ready` at every poll.
#[derive(Debug)]
struct ReadyTimer;

impl AsyncTimer for ReadyTimer {
    fn reset(self: Pin<&mut Self>, _: Instant) {}

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        Poll::Ready(())
    }
}

/// A timer that ignores a reset to an instant not after the one it was made at.
#[derive(Debug)]
struct ForwardTimer {
    inner: Pin<Box<dyn AsyncTimer>>,
    made: Instant,
}

impl AsyncTimer for ForwardTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        if at > self.made {
            self.inner.as_mut().reset(at);
        }
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.inner.as_mut().poll(cx)
    }
}

/// A timer that never fires: never `Ready`, its wakers never woken.
#[derive(Debug)]
struct SilentTimer;

impl AsyncTimer for SilentTimer {
    fn reset(self: Pin<&mut Self>, _: Instant) {}

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

/// A timer that fires (tokio's) but is never `Ready`: from its firing on, each poll has its
/// waker woken 20 ms later, by a task of its own.
#[derive(Debug)]
struct UnreadyTimer {
    inner: Pin<Box<dyn AsyncTimer>>,
    fired: bool,
}

impl AsyncTimer for UnreadyTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        self.fired = false;
        self.inner.as_mut().reset(at);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.fired || self.inner.as_mut().poll(cx).is_ready() {
            self.fired = true;
            let waker = cx.waker().clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                waker.wake();
            });
        }
        Poll::Pending
    }
}

/// A naive timer (review30 W1): each poll wakes the waker it replaces, whatever it is. A reset
/// makes a new tokio timer, which wakes nobody.
#[derive(Debug)]
struct ReplacingTimer {
    runtime: Arc<TokioRuntime>,
    inner: Pin<Box<dyn AsyncTimer>>,
    waker: Option<Waker>,
}

impl AsyncTimer for ReplacingTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        self.inner = self.runtime.new_timer(at);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(old) = self.waker.replace(cx.waker().clone()) {
            old.wake();
        }
        self.inner.as_mut().poll(cx)
    }
}

/// tokio's timer, each poll after a reset `Pending` having woken its own waker until a task the
/// reset spawned has run, as after its task's coop budget is spent until the executor runs
/// (review30 W2). On the current-thread runtime that task runs only once the polling task
/// yields: a check that polls again without yielding never sees it `Ready` (review31 X5).
#[derive(Debug)]
struct BudgetTimer {
    inner: Pin<Box<dyn AsyncTimer>>,
    renewed: Arc<AtomicBool>,
}

/// A flag the task it spawns sets when the executor runs it (the renewal of a coop budget).
fn renewal() -> Arc<AtomicBool> {
    let renewed = Arc::new(AtomicBool::new(false));
    let set = renewed.clone();
    tokio::spawn(async move { set.store(true, Ordering::SeqCst) });
    renewed
}

impl AsyncTimer for BudgetTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        self.renewed = renewal();
        self.inner.as_mut().reset(at);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.renewed.load(Ordering::SeqCst) {
            self.inner.as_mut().poll(cx)
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// A timer whose reset wakes the waker of its last poll if that poll was `Ready` (review30 W3).
#[derive(Debug)]
struct FiredResetWakingTimer {
    inner: Pin<Box<dyn AsyncTimer>>,
    ready: Option<Waker>,
}

impl AsyncTimer for FiredResetWakingTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        if let Some(ready) = self.ready.take() {
            ready.wake();
        }
        self.inner.as_mut().reset(at);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let poll = self.inner.as_mut().poll(cx);
        self.ready = poll.is_ready().then(|| cx.waker().clone());
        poll
    }
}

/// A timer never `Ready`, whose first poll after each reset (and its first ever) wakes its own
/// waker before returning `Pending` (an early wake, allowed on this runtime, which spawns), and
/// whose later polls' wakers are never woken (review30 W6, review31 X2: the check's first look
/// at a timer 50 ms ahead is woken early, its second never).
#[derive(Debug)]
struct EarlyTimer {
    polled: bool,
}

impl AsyncTimer for EarlyTimer {
    fn reset(mut self: Pin<&mut Self>, _: Instant) {
        self.polled = false;
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if !core::mem::replace(&mut self.polled, true) {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

/// A timer with a thread of its own, on the runtime's clock: the thread wakes the last
/// `Pending` poll's waker once the timer's instant has passed (after letting the timer's lock
/// go), and a poll is `Ready` once it has; neither `reset` nor `poll` wakes a waker. As
/// `breaks` says, it breaks one of the watchdog's rules (review31 X1), or none.
#[derive(Debug)]
struct ThreadTimer {
    shared: Arc<Shared>,
    breaks: Breaks,
    /// It has been polled.
    polled: bool,
    /// Its last poll was `Ready` (a reset since or not).
    ready: bool,
}

/// What a [`ThreadTimer`] shares with its thread.
#[derive(Debug)]
struct Shared {
    runtime: Arc<TokioRuntime>,
    state: Mutex<TimerState>,
    /// `state` changed.
    changed: Condvar,
    /// The timer was dropped: its thread ends (read without the lock, so that a drop within the
    /// thread's own wake, which may hold it, does not deadlock).
    dropped: AtomicBool,
}

#[derive(Debug)]
struct TimerState {
    at: Instant,
    waker: Option<Waker>,
    /// A reset handed to the thread ([`Breaks::TimerResetWaitsForItsThread`]).
    asked: Option<Instant>,
    /// The thread has answered the last reset handed to it.
    answered: bool,
}

/// How long a [`ThreadTimer`]'s thread lives at most, and how long a reset waits for it
/// (house rule 12: its loop is bounded in time).
const THREAD_LIFE: Duration = Duration::from_secs(20);

/// The longest a [`ThreadTimer`]'s thread waits before looking again (a drop notified without
/// the lock may be missed once).
const THREAD_LOOK: Duration = Duration::from_millis(50);

impl ThreadTimer {
    fn new(runtime: Arc<TokioRuntime>, at: Instant, breaks: Breaks) -> ThreadTimer {
        let shared = Arc::new(Shared {
            runtime,
            state: Mutex::new(TimerState {
                at,
                waker: None,
                asked: None,
                answered: true,
            }),
            changed: Condvar::new(),
            dropped: AtomicBool::new(false),
        });
        let ticks = shared.clone();
        std::thread::spawn(move || tick(&ticks, breaks));
        ThreadTimer {
            shared,
            breaks,
            polled: false,
            ready: false,
        }
    }

    fn state(&self) -> MutexGuard<'_, TimerState> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A [`ThreadTimer`]'s thread, until the timer is dropped ([`THREAD_LIFE`] at most).
fn tick(shared: &Shared, breaks: Breaks) {
    let end = std::time::Instant::now() + THREAD_LIFE;
    let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
    while !shared.dropped.load(Ordering::SeqCst) && std::time::Instant::now() < end {
        if let Some(at) = state.asked.take() {
            // Breaks::TimerResetWaitsForItsThread: the replaced instant's waker is woken (an
            // extra wake, allowed), before the answer.
            state.at = at;
            let replaced = state.waker.take();
            drop(state);
            if let Some(replaced) = replaced {
                replaced.wake();
            }
            state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.answered = true;
            shared.changed.notify_all();
            continue;
        }
        let now = shared.runtime.now();
        if now >= state.at {
            if let Some(waker) = state.waker.take() {
                if matches!(breaks, Breaks::TimerWakesUnderItsLock) {
                    waker.wake();
                } else {
                    drop(state);
                    waker.wake();
                    state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
                }
                continue;
            }
        }
        let left = Duration::from_nanos(state.at.as_nanos().saturating_sub(now.as_nanos()));
        state = shared
            .changed
            .wait_timeout(state, left.clamp(Duration::from_micros(100), THREAD_LOOK))
            .map_or_else(|e| e.into_inner().0, |(state, _)| state);
    }
}

impl Drop for ThreadTimer {
    fn drop(&mut self) {
        self.shared.dropped.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
    }
}

impl AsyncTimer for ThreadTimer {
    fn reset(self: Pin<&mut Self>, at: Instant) {
        match self.breaks {
            Breaks::TimerIgnoresResetBeforeFirstPoll if !self.polled => {}
            Breaks::TimerResetWaitsForItsThread => {
                let mut state = self.state();
                state.asked = Some(at);
                state.answered = false;
                self.shared.changed.notify_all();
                // Until the thread has answered (THREAD_LIFE at most).
                let _answered =
                    self.shared
                        .changed
                        .wait_timeout_while(state, THREAD_LIFE, |state| !state.answered);
            }
            _ => {
                self.state().at = at;
                self.shared.changed.notify_all();
            }
        }
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.polled = true;
        let after_ready = core::mem::take(&mut self.ready);
        let breaks = self.breaks;
        let mut state = self.state();
        if self.shared.runtime.now() >= state.at {
            if matches!(breaks, Breaks::TimerUnregisteredAfterReady) {
                state.waker = None;
            }
            drop(state);
            self.ready = true;
            return Poll::Ready(());
        }
        if !(after_ready && matches!(breaks, Breaks::TimerUnregisteredAfterReady)) {
            state.waker = Some(cx.waker().clone());
        }
        drop(state);
        self.shared.changed.notify_all();
        Poll::Pending
    }
}

/// The error `check` returns on tokio breaking `breaks`.
fn failure<F, T>(breaks: Breaks, check: impl FnOnce(Breaking) -> F) -> io::Error
where
    F: core::future::Future<Output = io::Result<T>>,
    T: core::fmt::Debug,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut runtime = Breaking::start().expect("the runtime");
        runtime.breaks = breaks;
        match check(runtime).await {
            Ok(passed) => panic!("the check passed ({passed:?}) on a runtime that {breaks:?}"),
            Err(e) => e,
        }
    })
}

fn assert_broken(error: &io::Error, check: &str, step: &str, rule: &str) {
    assert_eq!(error.kind(), io::ErrorKind::Other, "{error}");
    let message = error.to_string();
    assert!(
        message.starts_with(&format!("{check}: {step}: ")),
        "{message}"
    );
    assert!(message.contains(rule), "{message}");
}

#[test]
fn review28_u4_an_armed_read_whose_waker_is_never_registered_fails_the_check() {
    let error = failure(Breaks::ArmsWithoutRegistering, |runtime| async move {
        check_read_armed(&runtime).await
    });
    assert_broken(
        &error,
        "check_read_armed",
        "an armed read",
        "its waker was not woken by the bytes after it",
    );
}

#[test]
fn review28_u1_an_armed_read_not_woken_by_the_end_of_the_stream_fails_the_check() {
    let error = failure(Breaks::ArmsForBytesOnly, |runtime| async move {
        check_read_armed(&runtime).await
    });
    assert_broken(
        &error,
        "check_read_armed",
        "an armed read",
        "its waker was not woken by the end of the stream",
    );
}

#[test]
fn review28_u3_a_full_read_that_says_it_is_armed_fails_the_check() {
    let error = failure(Breaks::ArmsFullReads, |runtime| async move {
        check_read_armed(&runtime).await
    });
    assert_broken(
        &error,
        "check_read_armed",
        "a read",
        "a read that filled the buffer said it was armed",
    );
}

#[test]
fn review28_u10_a_timer_that_wakes_from_its_poll_fails_the_check() {
    let error = failure(Breaks::TimerWakesInPoll, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "a poll an hour ahead",
        "the poll woke its waker before returning",
    );
}

#[test]
fn review29_v4_a_timer_that_wakes_from_its_reset_fails_the_check() {
    let error = failure(Breaks::TimerWakesInReset, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "a reset to 50 ms ahead",
        "woke the last poll's waker before returning, on a runtime that does not spawn",
    );
}

#[test]
fn review29_v4_a_timer_ready_at_once_fails_the_check() {
    let error = failure(Breaks::TimerReadyAtOnce, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "a poll an hour ahead",
        "Ready an hour early",
    );
}

/// A timer set 50 ms ahead on the runtime's clock fires within 50 ms, when that clock has moved
/// 50 µs at most: the check fails unless its thread is preempted for about 50 s.
#[test]
fn review29_v4_a_timer_ready_before_its_instant_fails_the_check() {
    let error = failure(Breaks::TimerEarly, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "a timer 50 ms ahead",
        "Ready before its instant",
    );
}

#[test]
fn review29_v4_a_timer_not_ready_after_a_reset_to_the_past_fails_the_check() {
    let error = failure(Breaks::TimerIgnoresPastReset, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "a reset to a past instant",
        "not Ready at once",
    );
}

/// House rule 12: the check's waits do not depend on the timer it checks, so it fails (in about
/// 1 s) instead of hanging.
#[test]
fn review29_v1_a_timer_that_never_fires_fails_the_check() {
    let error = failure(Breaks::TimerNeverFires, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "a timer 50 ms ahead",
        "its waker was not woken when it fired",
    );
}

/// House rule 12: a timer whose waker is woken again and again, but which is never `Ready`,
/// fails the check (in about 1 s) instead of spinning it.
#[test]
fn review29_v1_a_timer_that_wakes_but_is_never_ready_fails_the_check() {
    let error = failure(Breaks::TimerNeverReady, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "a timer 50 ms ahead",
        "its waker was woken after its instant, but it was not Ready 1s after it",
    );
}

/// Review29 V2: the check resets to the instant it started, which tokio's wheel has passed
/// whatever the machine's load, so tokio's `Sleep` wakes synchronously every time.
#[test]
fn review28_u10_tokio_timers_on_a_runtime_that_does_not_spawn_fail_the_past_reset_step() {
    let error = failure(Breaks::SpawnsNot, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "a reset to a past instant",
        "woke the last poll's waker before returning, on a runtime that does not spawn",
    );
}

/// Review30 W1: the naive timer passed the check before (every poll had a waker of its own);
/// the driver's watchdog, which polls with one waker, would deadlock on it. The watchdog's
/// timer is a fresh one (review31 X1): its first poll replaces no waker, its second (the
/// arming after the first firing) the watchdog's own.
#[test]
fn review30_w1_a_timer_that_wakes_the_waker_it_replaces_fails_the_watchdog_step() {
    let error = failure(Breaks::TimerWakesReplaced, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "the watchdog armed again after it fired",
        "the poll woke the waker it was given (the one it was last polled with, and the \
         driver's watchdog's only one) before returning, on a runtime that does not spawn",
    );
}

/// Review30 W2, review31 X5: a timer that yields as tokio's does once the coop budget is spent
/// passes the check on a runtime that spawns (no false failure), and the check yields its task
/// after such a wake (no busy loop): the timer stays `Pending` until a task it spawned has run,
/// which on this current-thread runtime happens only when the check's task yields (without the
/// yield, a look polls it 1000 times and fails). Bounded by the check (house rule 12).
#[test]
fn review30_w2_a_timer_that_wakes_itself_and_is_pending_passes_on_a_runtime_that_spawns() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut runtime = Breaking::start().expect("the runtime");
        runtime.breaks = Breaks::TimerSpentBudget;
        if let Err(e) = check_timer(&runtime).await {
            panic!("{e}");
        }
    });
}

/// Review30 W3: the reset after each firing (the watchdog re-armed by `wake_unclaimed`) is
/// checked for wakes too.
#[test]
fn review30_w3_a_timer_whose_reset_after_firing_wakes_fails_the_check() {
    let error = failure(Breaks::TimerWakesInResetAfterFiring, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "a reset an hour ahead, after it fired 50 ms ahead",
        "woke the last poll's waker before returning, on a runtime that does not spawn",
    );
}

/// Review30 W6, review31 X2: an early wake is allowed; a timer whose only wake was early (the
/// first look's) fails as one whose waker was not woken when it fired, not as one woken but
/// never `Ready` (the message before W6's fix, which counted looks, not wakes after the instant).
#[test]
fn review30_w6_a_timer_woken_only_before_its_instant_fails_as_not_woken() {
    let error = failure(Breaks::TimerWokenEarlyOnly, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "a timer 50 ms ahead",
        "its waker was not woken when it fired",
    );
}

/// Review31 X1 (house rule 8): a timer with a thread of its own that keeps every rule passes
/// the check on a runtime that does not spawn, the watchdog's replay included: its thread's
/// wakes, which may come while the check arms, wait for the arming as the driver's would, and
/// the re-arm from within such a wake returns (no false failure). Bounded by the check.
#[test]
fn review31_x1_a_thread_timer_that_keeps_the_rules_passes_the_watchdog_replay() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut runtime = Breaking::start().expect("the runtime");
        runtime.breaks = Breaks::ThreadTimer;
        if let Err(e) = check_timer(&runtime).await {
            panic!("{e}");
        }
    });
}

/// Review31 X1, example 1: a timer whose thread wakes the waker while holding the timer's lock
/// passed the check before (it re-armed from its own task, after the wake had returned); the
/// driver's watchdog, which re-arms from within that wake, would deadlock on that lock. The
/// check's re-arm within the wake blocks, and it fails in about 1 s instead of hanging.
#[test]
fn review31_x1_a_timer_that_wakes_under_its_own_lock_fails_the_rearm_within_the_wake() {
    let error = failure(Breaks::TimerWakesUnderItsLock, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "the watchdog re-armed from within its waker's wake, after it fired",
        "a reset from within the timer's wake blocked",
    );
}

/// Review31 X1, example 2: a timer whose reset waits for its thread, which wakes the waker
/// first, passed the check before (it counted only wakes on the calling thread); the driver's
/// watchdog would deadlock (that wake blocks on the lock the reset's caller holds). The check's
/// wake waits 1 s for the arming to let its lock go, then fails it.
#[test]
fn review31_x1_a_timer_whose_reset_waits_for_a_wake_on_its_thread_fails_the_arming() {
    let error = failure(Breaks::TimerResetWaitsForItsThread, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "the watchdog armed again before it fired",
        "reset/poll waited for its waker's wake",
    );
}

/// Review31 X1: the watchdog's timer is made for `Instant::MAX` and reset before it is ever
/// polled; a timer that loses that reset passed the check before (it re-used a polled timer).
#[test]
fn review31_x1_a_timer_that_loses_a_reset_before_its_first_poll_fails_the_first_arming() {
    let error = failure(
        Breaks::TimerIgnoresResetBeforeFirstPoll,
        |runtime| async move { check_timer(&runtime).await },
    );
    assert_broken(
        &error,
        "check_timer",
        "the watchdog's first arming, of a timer never polled before",
        "the waker it was polled with was not woken when it fired",
    );
}

/// Review31 X1: the driver arms its watchdog again after an arming that was `Ready` (`arm`,
/// `wake_unclaimed`, `arm`); a timer whose first poll after a `Ready` one registers no waker
/// passed the check before (no arming followed its `Ready` one).
#[test]
fn review31_x1_a_timer_unregistered_after_a_ready_poll_fails_the_arming_after_it() {
    let error = failure(Breaks::TimerUnregisteredAfterReady, |runtime| async move {
        check_timer(&runtime).await
    });
    assert_broken(
        &error,
        "check_timer",
        "the watchdog armed again after an arming that was Ready",
        "the waker it was polled with was not woken when it fired",
    );
}
