//! [`check_timer`]: an [`AsyncTimer`]'s firings, resets and polls, and the driver's watchdog's
//! own sequence ([`watchdog`]), checked against the timer's contract (review26 S5, review28
//! U10, review29 V1–V3, review30 W1–W3 W6, review31 X1).

use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::io::{self, ErrorKind};
use std::sync::Arc;
use std::time;

use retry_core::time::Instant;

use super::pacing::{calling, no_thread, woken, yield_now, Pacer, Wakes};
use super::{watchdog, BOUND, LOOKS, WAIT};
use crate::runtime::{AsyncTimer, Runtime};

/// [`AsyncTimer`]'s contract (review26 S5, review28 U10, review29 V3, review30 W1 W2, review31
/// X1, house rule 8): on every runtime, a timer is never `Ready` before its instant, it fires
/// (its last `Pending` poll's waker is woken, and it is `Ready` within 1 s of its instant), and
/// polled after a reset to an instant it has already seen pass, it is `Ready` at once, or, on a
/// runtime that spawns, `Pending` having woken its own waker (a spent coop budget) and `Ready`
/// when polled again after the task yielded. On a runtime that does not spawn
/// ([`Runtime::spawns`]), moreover, no reset wakes the last poll's waker and no poll its own
/// waker before it returns, and the driver's watchdog's sequence runs to its end: no reset or
/// poll of it wakes its one waker on the calling thread, or waits for a wake of it on another,
/// and a reset and a poll from within that waker's wake return.
///
/// A timer set an hour ahead is polled (`Pending`), reset to 50 ms ahead and polled until it is
/// `Ready` after wakes of its waker (an early wake is harmless, house rule 8: it is polled
/// again), reset an hour ahead again (the reset after a firing, checked for wakes of the `Ready`
/// poll's and the last `Pending` poll's wakers, review30 W3) and polled; the same with 5 ms
/// ahead (the reset of the driver's watchdog, whose instant may have passed by the time of the
/// reset); then it is reset to the instant the check started, where it must be `Ready`. Each of
/// these polls is given a waker of its own.
///
/// On a runtime that does not spawn, the check then replays the watchdog's own sequence
/// (`LocalDriver`'s `arm`, `WatchdogWaker`, `wake_unclaimed`; review30 W1, review31 X1) on a
/// fresh timer, made for `Instant::MAX` and never polled before its first arming, always with
/// one waker. Each arming resets it to 5 ms ahead and polls it while holding a lock that each
/// wake of that waker takes: a wake on the arming's thread before its call returned fails the
/// check at once, and a wake on another thread waits for the arming to let the lock go, 1 s at
/// most, then fails it ("reset/poll waited for its waker's wake"). The timer is armed and
/// fired; armed again after it fired, and again before it fired; the wake of that firing,
/// holding the lock, re-arms it and waits 1 s at most for the reset and poll to return
/// (else "a reset from within the timer's wake blocked"), and that re-arm fires; it is armed
/// with its instant already past (`Ready` at once, which is followed by a wake, as the driver's
/// `arm` calls `wake_unclaimed` then), and armed again after that `Ready` arming, and fires.
/// What differs from the driver: the re-arm within the wake is made by the check's pacing
/// thread while the wake, on the thread the timer woke it on, waits for it (so that a re-arm
/// that blocks on a lock the waking thread holds fails the check instead of deadlocking the
/// timer's thread for ever), so a timer whose `reset` or `poll` relies on running on that
/// thread (a lock it may take twice, a thread-local) is judged as though called from another;
/// and the instant of that re-arm is read from the runtime's clock at the replay's start plus
/// std's time since, as the check holds its runtime only by reference.
///
/// A wake a call made before it returned (allowed on a runtime that spawns: tokio's coop
/// budget) is followed by one yield of the check's task before the next poll, so that the
/// executor runs and the budget is renewed (review30 W2); every loop is capped in steps too.
/// The whole check ends within 10 s of std's clock; each wait for a wake ends within 1 s of
/// when the wake is due (2 s for the firing whose wake re-arms). Its waits are paced by one
/// thread of its own, not by the timers it checks (review29 V1), joined when the check ends or
/// its future is dropped (review30 W4; left to end by the deadline on its own if dropped on
/// that thread or not ended within 1 s, review31 X3). An arming of the watchdog's replay may
/// block the check's thread for 1 s at most, while a wake holds the lock. It runs on the
/// runtime's executor, whose reactor the timers may need.
///
/// # Errors
///
/// A broken contract as [`ErrorKind::Other`], saying which step and rule; a check that did not
/// end within its bound as [`ErrorKind::TimedOut`]; a thread the check could not start for its
/// waits as the kind [`thread::Builder::spawn`] gave, [`ErrorKind::ResourceBusy`] instead of
/// [`ErrorKind::Other`], saying so (review30 W5).
///
/// [`thread::Builder::spawn`]: std::thread::Builder::spawn
pub async fn check_timer<R: Runtime>(runtime: &R) -> io::Result<()> {
    let deadline = time::Instant::now() + BOUND;
    let pacer = Pacer::start(deadline).map_err(|e| no_thread("check_timer", &e))?;
    let start = runtime.now();
    let spawns = runtime.spawns();
    let ahead = |by| runtime.now().saturating_add(by);
    let mut timer = runtime.new_timer(ahead(HOUR));
    let mut last = hour_ahead(&mut timer, "a poll an hour ahead", spawns)?;
    for (lead, reset, wait, after) in [
        (
            SOON,
            "a reset to 50 ms ahead",
            "a timer 50 ms ahead",
            "a reset an hour ahead, after it fired 50 ms ahead",
        ),
        (
            GRACE,
            "a reset to 5 ms ahead",
            "a timer 5 ms ahead",
            "a reset an hour ahead, after it fired 5 ms ahead",
        ),
    ] {
        let at = ahead(lead);
        reset_unwoken(&mut timer, at, &[&last], spawns, reset)?;
        let until = time::Instant::now() + lead + WAIT;
        let fired = fires(
            runtime,
            &pacer,
            &mut timer,
            at,
            until.min(deadline),
            wait,
            spawns,
        )
        .await?;
        // Review30 W3: the driver's reset after a firing (`wake_unclaimed` arms the watchdog
        // again), checked as the others.
        let polled = [&fired.ready, fired.last.as_ref().unwrap_or(&fired.ready)];
        reset_unwoken(&mut timer, ahead(HOUR), &polled, spawns, after)?;
        last = hour_ahead(&mut timer, "a poll an hour ahead, after firing", spawns)?;
    }
    // Review29 V2: `start` is before the instants the timer has fired at, so it has passed for
    // the runtime's timers too (tokio's wheel), however long this thread was preempted.
    let step = "a reset to a past instant";
    reset_unwoken(&mut timer, start, &[&last], spawns, step)?;
    ready_at_once(&mut timer, step, spawns).await?;
    if spawns {
        Ok(())
    } else {
        drop(timer);
        watchdog::replay(runtime, &pacer, start).await
    }
}

/// The wake-rule message of a reset.
const RESET_WOKE: &str = "woke the last poll's waker before returning";

/// Resets `timer` to `at`, failing `step` if that woke one of `polled` (the wakes of the
/// timer's last polls) before it returned, on a runtime that does not spawn.
fn reset_unwoken(
    timer: &mut Pin<Box<dyn AsyncTimer>>,
    at: Instant,
    polled: &[&Arc<Wakes>],
    spawns: bool,
    step: &str,
) -> io::Result<()> {
    let within = || polled.iter().map(|wakes| wakes.within()).sum::<usize>();
    let before = within();
    calling(|| timer.as_mut().reset(at));
    unwoken(within() - before, spawns, step, RESET_WOKE)
}

/// The last poll of a check after a reset to a past instant: `Ready` at once, or, on a runtime
/// that spawns, `Pending` having woken its own waker (tokio's spent coop budget), then `Ready`
/// when polled after the task yielded (review30 W2).
async fn ready_at_once(
    timer: &mut Pin<Box<dyn AsyncTimer>>,
    step: &str,
    spawns: bool,
) -> io::Result<()> {
    let (poll, wakes) = poll_timer(timer, step, spawns)?;
    if poll.is_ready() {
        return Ok(());
    }
    expect_timer(
        spawns && wakes.within() > 0,
        step,
        "not Ready at once (Pending, and its waker not woken by the poll)",
    )?;
    yield_now().await;
    let (poll, _) = poll_timer(timer, step, spawns)?;
    expect_timer(
        poll.is_ready(),
        step,
        "Pending having woken its own waker, and still not Ready when polled after the task \
         yielded",
    )
}

/// How far ahead [`check_timer`] sets a timer that must not fire during the check.
const HOUR: Duration = Duration::from_secs(3600);

/// How far ahead [`check_timer`] first sets the timer it waits for.
const SOON: Duration = Duration::from_millis(50);

/// How far ahead [`check_timer`] then sets it: the driver's watchdog's reset (review29 V3).
pub(super) const GRACE: Duration = crate::driver::UNCLAIMED_TIMER_GRACE;

/// One poll of `timer`, an hour ahead, which must be `Pending`; returns its waker's wakes.
fn hour_ahead(
    timer: &mut Pin<Box<dyn AsyncTimer>>,
    step: &str,
    spawns: bool,
) -> io::Result<Arc<Wakes>> {
    let (poll, last) = poll_timer(timer, step, spawns)?;
    expect_timer(poll.is_pending(), step, "Ready an hour early")?;
    Ok(last)
}

/// The wakes of the polls of a firing ([`fires`]): the `Ready` one's and the last `Pending`
/// one's, if any.
struct Fired {
    ready: Arc<Wakes>,
    last: Option<Arc<Wakes>>,
}

/// Polls `timer`, set to `at`, until it is `Ready`, each `Pending` poll's waker woken before the
/// next look: not before `at`, and by `until`, the check's deadline at the latest (review29 V1:
/// a timer that never fires, or fires without being `Ready`, fails by then), in [`LOOKS`] polls
/// at most. The error says what happened (review30 W6): no wake at or after `at` (on the
/// runtime's clock, when the wake was seen), or wakes then but no `Ready`.
async fn fires<R: Runtime>(
    runtime: &R,
    pacer: &Pacer,
    timer: &mut Pin<Box<dyn AsyncTimer>>,
    at: Instant,
    until: time::Instant,
    step: &str,
    spawns: bool,
) -> io::Result<Fired> {
    let mut last = None;
    let mut woken_after = false;
    // Each look but the last waits for a wake, which ends by `until`: bounded in time, and in
    // steps by LOOKS.
    for _ in 0..LOOKS {
        let (poll, wakes) = poll_timer(timer, step, spawns)?;
        if poll.is_ready() {
            expect_timer(runtime.now() >= at, step, "Ready before its instant")?;
            return Ok(Fired { ready: wakes, last });
        }
        let rung = woken(pacer, until, &wakes, 0).await;
        last = Some(wakes);
        if !rung {
            return Err(if time::Instant::now() >= pacer.deadline {
                timer_failed(ErrorKind::TimedOut, step, "")
            } else if woken_after {
                timer_failed(
                    ErrorKind::Other,
                    step,
                    &format!(
                        "its waker was woken after its instant, but it was not Ready {WAIT:?} \
                         after it"
                    ),
                )
            } else {
                timer_failed(
                    ErrorKind::Other,
                    step,
                    "its waker was not woken when it fired",
                )
            });
        }
        woken_after |= runtime.now() >= at;
    }
    Err(timer_failed(
        ErrorKind::Other,
        step,
        &format!("its waker was woken {LOOKS} times, and it was never Ready"),
    ))
}

/// One poll of `timer` with a waker of its own, which the poll must not have woken on a runtime
/// that does not spawn (review29 V3).
fn poll_timer(
    timer: &mut Pin<Box<dyn AsyncTimer>>,
    step: &str,
    spawns: bool,
) -> io::Result<(Poll<()>, Arc<Wakes>)> {
    let wakes = Wakes::new();
    let waker = Waker::from(wakes.clone());
    let poll = calling(|| timer.as_mut().poll(&mut Context::from_waker(&waker)));
    unwoken(
        wakes.within(),
        spawns,
        step,
        "the poll woke its waker before returning",
    )?;
    Ok((poll, wakes))
}

/// Fails `step` if a [`calling`] call made `within` wakes before it returned, on a runtime that
/// does not spawn: the only runtimes the rule binds (review29 V3).
fn unwoken(within: usize, spawns: bool, step: &str, why: &str) -> io::Result<()> {
    expect_timer(
        spawns || within == 0,
        step,
        &format!("{why}, on a runtime that does not spawn"),
    )
}

/// A broken [`AsyncTimer`] contract, or a [`check_timer`] step not done by its deadline.
pub(super) fn timer_failed(kind: ErrorKind, step: &str, why: &str) -> io::Error {
    let why = match kind {
        ErrorKind::TimedOut => format!("not done within {BOUND:?}"),
        _ => format!("AsyncTimer broke its contract: {why}"),
    };
    io::Error::new(kind, format!("check_timer: {step}: {why}"))
}

pub(super) fn expect_timer(holds: bool, step: &str, why: &str) -> io::Result<()> {
    if holds {
        Ok(())
    } else {
        Err(timer_failed(ErrorKind::Other, step, why))
    }
}
