//! The driver's watchdog's own sequence, replayed by [`check_timer`] on a runtime that does not
//! spawn (review30 W1, review31 X1): a fresh timer, made for `Instant::MAX` and never polled
//! before its first arming; each arming a reset to 5 ms ahead and a poll with the watchdog's one
//! waker, under a lock that waker's wake takes; a re-arm from within that wake after a firing,
//! while the wake holds the lock; and an arming after an arming that was `Ready`.
//!
//! [`check_timer`]: super::check_timer

use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::io::{self, ErrorKind};
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError, Weak};
use std::task::Wake;
use std::time;

use retry_core::time::Instant;

use super::pacing::{calling, in_call, lock, woken, Hand, Pacer, Wakes};
use super::timer::{expect_timer, timer_failed, GRACE};
use super::{LOOKS, WAIT};
use crate::runtime::{AsyncTimer, Runtime};

/// The step of the first arming.
const FIRST: &str = "the watchdog's first arming, of a timer never polled before";

/// The step of an arming after a firing, from the check's task.
const AFTER_FIRING: &str = "the watchdog armed again after it fired";

/// The step of an arming before the last one fired.
const BEFORE_FIRING: &str = "the watchdog armed again before it fired";

/// The step of the re-arm from within the waker's wake, and of its firing.
const WITHIN_WAKE: &str = "the watchdog re-armed from within its waker's wake, after it fired";

/// The step of an arming to an instant already past.
const PAST: &str = "the watchdog armed with its instant already past";

/// The step of the arming after a `Ready` one (the driver's `arm` Ready, `wake_unclaimed`,
/// `arm`).
const AFTER_READY: &str = "the watchdog armed again after an arming that was Ready";

/// The wake-rule message of a firing that did not come.
const NOT_WOKEN: &str = "the waker it was polled with was not woken when it fired";

/// Review30 W1, review31 X1: the driver's watchdog's sequence (`LocalDriver`'s `arm`,
/// `WatchdogWaker`, `wake_unclaimed`), on a fresh timer of `runtime`: armed (reset to [`GRACE`]
/// ahead and polled with the watchdog's one waker) and fired; armed again after it fired, and
/// again before it fired; its firing's wake, holding the lock, re-arms it, and that re-arm fires;
/// armed with its instant past (`Ready` at once); armed again after that `Ready` arming, and
/// fired. Each arming that is `Ready` is followed by a wake, as the driver's `arm` calls
/// `wake_unclaimed` then. `start` is an instant the timers have passed.
pub(super) async fn replay<R: Runtime>(
    runtime: &R,
    pacer: &Pacer,
    start: Instant,
) -> io::Result<()> {
    let clock = Clock {
        runtime: runtime.now(),
        std: time::Instant::now(),
    };
    let watch = Watch::new(runtime.new_timer(Instant::MAX), pacer.hand(), clock);
    let _over = Over(&watch);
    let grace = || runtime.now().saturating_add(GRACE);
    watch.arm_and_fire(pacer, grace(), FIRST).await?;
    // `Pending`, or `Ready` if the thread was preempted past the grace (a wake followed): the
    // driver goes on either way.
    let _armed = watch.arm(grace(), AFTER_FIRING)?;
    // A deferred pass owed: the next wake re-arms the watchdog (`wake_unclaimed`).
    lock(&watch.guarded).rearm = true;
    let _armed = watch.arm(grace(), BEFORE_FIRING)?;
    // The wake may wait `WAIT` for the lock, and its re-arm `WAIT` more.
    let until = time::Instant::now() + GRACE + 2 * WAIT;
    watch
        .wait_for(pacer, until, WITHIN_WAKE, |watch| watch.rearmed.is_some())
        .await?;
    let rearmed = lock(&watch.guarded).rearmed;
    if let Some((Poll::Pending, seen)) = rearmed {
        let until = time::Instant::now() + GRACE + WAIT;
        watch
            .wait_for(pacer, until, WITHIN_WAKE, |watch| watch.woken > seen)
            .await?;
    }
    let poll = watch.arm(start, PAST)?;
    expect_timer(poll.is_ready(), PAST, "not Ready at once")?;
    watch.arm_and_fire(pacer, grace(), AFTER_READY).await
}

/// The runtime's clock as the re-arm within a wake reads it: the check holds its runtime only
/// by reference, so that re-arm (on the pacing thread, [`Watch::rearm`]) reads the runtime's
/// clock at the replay's start plus the time passed since on std's clock.
#[derive(Clone, Copy)]
struct Clock {
    runtime: Instant,
    std: time::Instant,
}

impl Clock {
    fn now(self) -> Instant {
        self.runtime.saturating_add(self.std.elapsed())
    }
}

/// The watchdog as the check models it: its timer, its one waker ([`WatchWaker`]), and its
/// lock, which an arming holds over the reset and the poll, and which each wake of the waker
/// takes (`wake_unclaimed`), holding it over the re-arm it makes.
struct Watch {
    /// The model of the watchdog's lock, and what the wakes saw.
    guarded: Mutex<Guarded>,
    /// `guarded.held` cleared, or `guarded.over` set.
    changed: Condvar,
    /// The waker's wakes: those made within a reset or a poll of an arming (on its thread)
    /// apart; each wake, once it has done what it does, wakes the check's task.
    wakes: Arc<Wakes>,
    /// The watchdog's timer, shared with the re-arm within a wake (taken out when the replay
    /// ends, [`Over`]).
    timer: Arc<WatchTimer>,
    /// The watchdog's one waker: a [`WatchWaker`] of this.
    waker: Waker,
    /// The pacing thread, which makes the re-arm within a wake ([`Watch::rearm`]).
    hand: Hand,
    clock: Clock,
}

/// The watchdog's timer, until the replay ends.
type WatchTimer = Mutex<Option<Pin<Box<dyn AsyncTimer>>>>;

/// What [`Watch::guarded`] guards.
#[derive(Default)]
struct Guarded {
    /// The watchdog's lock is held: by an arming, or by a wake over its re-arm.
    held: bool,
    /// The next wake re-arms the timer (a deferred pass owed, in the driver).
    rearm: bool,
    /// The wakes of the waker that took the lock (each counted once it has done its work).
    woken: usize,
    /// The re-arm within a wake: its poll, and `woken` counting that wake.
    rearmed: Option<(Poll<()>, usize)>,
    /// The first rule a wake saw broken.
    broken: Option<Broken>,
    /// The replay has ended: a wake does nothing.
    over: bool,
}

/// A rule broken in the watchdog's sequence.
#[derive(Debug, Clone, Copy)]
enum Broken {
    /// A reset woke the waker on its own thread before returning.
    ResetWoke,
    /// A poll woke the waker it was given on its own thread before returning.
    PollWoke,
    /// A wake on another thread found the lock held by an arming for [`WAIT`].
    WaitedForWake,
    /// The re-arm within a wake did not return within [`WAIT`].
    RearmBlocked,
    /// The re-arm within a wake panicked.
    RearmPanicked,
    /// The re-arm within a wake could not be made: the check's deadline passed.
    Late,
}

/// Why an arming of the watchdog's timer would deadlock the driver.
const WHY: &str = "(the one it was last polled with, and the driver's watchdog's only one) \
                   before returning, on a runtime that does not spawn: the watchdog would deadlock";

impl Broken {
    /// The check's error for this at `step`.
    fn error(self, step: &str) -> io::Error {
        let why = match self {
            Broken::ResetWoke => format!("the reset woke the waker {WHY}"),
            Broken::PollWoke => format!("the poll woke the waker it was given {WHY}"),
            Broken::WaitedForWake => format!(
                "reset/poll waited for its waker's wake: a wake of the waker on another thread \
                 found the lock the arming holds over both calls still held {WAIT:?} later, on \
                 a runtime that does not spawn: the watchdog would deadlock"
            ),
            Broken::RearmBlocked => format!(
                "a reset from within the timer's wake blocked: the reset and poll that the \
                 wake of the waker makes did not return within {WAIT:?} (a timer that wakes \
                 under a lock its reset or poll takes, or that waits for the waking thread), \
                 on a runtime that does not spawn: the watchdog would deadlock"
            ),
            Broken::RearmPanicked => {
                "the reset or the poll from within the timer's wake panicked".to_owned()
            }
            Broken::Late => return timer_failed(ErrorKind::TimedOut, step, ""),
        };
        timer_failed(ErrorKind::Other, step, &why)
    }
}

/// The waker of the watchdog's timer: weak, as the timer the [`Watch`] holds keeps it.
struct WatchWaker(Weak<Watch>);

impl Wake for WatchWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(watch) = self.0.upgrade() {
            watch.woken();
        }
    }
}

impl Watch {
    fn new(timer: Pin<Box<dyn AsyncTimer>>, hand: Hand, clock: Clock) -> Arc<Watch> {
        Arc::new_cyclic(|watch| Watch {
            guarded: Mutex::default(),
            changed: Condvar::new(),
            wakes: Wakes::new(),
            timer: Arc::new(Mutex::new(Some(timer))),
            waker: Waker::from(Arc::new(WatchWaker(watch.clone()))),
            hand,
            clock,
        })
    }

    /// `guarded`, once the lock it models is free ([`WAIT`] at most) or the replay is over.
    fn free(&self) -> MutexGuard<'_, Guarded> {
        self.changed
            .wait_timeout_while(lock(&self.guarded), WAIT, |guarded| {
                guarded.held && !guarded.over
            })
            .map_or_else(|e| e.into_inner().0, |(guarded, _)| guarded)
    }

    /// A wake of the waker (the driver's `WatchdogWaker`, `wake_unclaimed`). One made within a
    /// reset or a poll of an arming, on its thread, is counted as such (the arming fails: the
    /// driver's lock is held by that thread). Another takes the lock, waiting for an arming
    /// under way [`WAIT`] at most (a reset or a poll that waits for this wake fails the
    /// check instead of deadlocking it), and re-arms the timer under it if a re-arm is due.
    /// Each then wakes the check's task, after writing what it saw.
    fn woken(&self) {
        if in_call() {
            self.wakes.wake_by_ref();
            return;
        }
        let mut guarded = self.free();
        if guarded.over {
            return;
        }
        if guarded.held {
            guarded.broken.get_or_insert(Broken::WaitedForWake);
        } else if core::mem::take(&mut guarded.rearm) {
            guarded.held = true;
            drop(guarded);
            let rearmed = self.rearm();
            guarded = lock(&self.guarded);
            guarded.woken += 1;
            match rearmed {
                Ok(poll) => {
                    guarded.rearmed = Some((poll, guarded.woken));
                    guarded.held = false;
                }
                // The lock stays held: the re-arm may still be under way.
                Err(broken) => {
                    guarded.broken.get_or_insert(broken);
                }
            }
        } else {
            guarded.woken += 1;
        }
        drop(guarded);
        self.changed.notify_all();
        self.wakes.wake_by_ref();
    }

    /// The re-arm within a wake, made by the pacing thread while the wake waits for it
    /// ([`WAIT`] at most): a re-arm that blocks, on a lock the waking thread holds, blocks the
    /// pacing thread until that wake returns, not the runtime's thread for ever.
    fn rearm(&self) -> Result<Poll<()>, Broken> {
        type Done = (Mutex<Option<Result<Poll<()>, Broken>>>, Condvar);
        let done: Arc<Done> = Arc::default();
        let job = {
            let (timer, waker, wakes, done) = (
                self.timer.clone(),
                self.waker.clone(),
                self.wakes.clone(),
                done.clone(),
            );
            let at = self.clock.now().saturating_add(GRACE);
            move || {
                let armed =
                    panic::catch_unwind(AssertUnwindSafe(|| arm_timer(&timer, at, &waker, &wakes)))
                        .unwrap_or(Err(Broken::RearmPanicked));
                *lock(&done.0) = Some(armed);
                done.1.notify_all();
            }
        };
        if !self.hand.run(Box::new(job)) {
            return Err(Broken::Late);
        }
        let armed = done
            .1
            .wait_timeout_while(lock(&done.0), WAIT, |armed| armed.is_none())
            .map_or_else(|e| e.into_inner().0, |(armed, _)| armed)
            .take();
        armed.unwrap_or(Err(Broken::RearmBlocked))
    }

    /// An arming from the check's task (the driver's `arm` from a future): the lock taken
    /// ([`WAIT`] at most), the timer reset to `at` and polled, the lock let go; a wake that
    /// broke a rule meanwhile fails `step`. A `Ready` arming is followed by a wake.
    fn arm(&self, at: Instant, step: &str) -> io::Result<Poll<()>> {
        let mut guarded = self.free();
        if let Some(broken) = guarded.broken {
            return Err(broken.error(step));
        }
        expect_timer(
            !guarded.held,
            step,
            &format!("a wake of the waker held the watchdog's lock for {WAIT:?}"),
        )?;
        guarded.held = true;
        drop(guarded);
        let armed = arm_timer(&self.timer, at, &self.waker, &self.wakes);
        let mut guarded = lock(&self.guarded);
        guarded.held = false;
        let broken = guarded.broken;
        drop(guarded);
        self.changed.notify_all();
        let poll = broken
            .map_or(armed, Err)
            .map_err(|broken| broken.error(step))?;
        if poll.is_ready() {
            self.woken();
        }
        Ok(poll)
    }

    /// [`Watch::arm`], then, if `Pending`, a wait for the firing.
    async fn arm_and_fire(&self, pacer: &Pacer, at: Instant, step: &str) -> io::Result<()> {
        let seen = lock(&self.guarded).woken;
        if self.arm(at, step)?.is_pending() {
            let until = time::Instant::now() + GRACE + WAIT;
            self.wait_for(pacer, until, step, |watch| watch.woken > seen)
                .await?;
        }
        Ok(())
    }

    /// Waits until `done` holds of what the wakes saw, by `until` (the check's deadline at the
    /// latest), failing `step` if a wake saw a rule broken, or none came; [`LOOKS`] wakes at
    /// most. A wake writes what it saw before it counts, and its count is read here before
    /// that: none is missed.
    async fn wait_for(
        &self,
        pacer: &Pacer,
        until: time::Instant,
        step: &str,
        done: impl Fn(&Guarded) -> bool,
    ) -> io::Result<()> {
        for _ in 0..LOOKS {
            let seen = self.wakes.count();
            let (broken, done) = {
                let guarded = lock(&self.guarded);
                (guarded.broken, done(&guarded))
            };
            if let Some(broken) = broken {
                return Err(broken.error(step));
            }
            if done {
                return Ok(());
            }
            if !woken(pacer, until.min(pacer.deadline), &self.wakes, seen).await {
                let kind = if time::Instant::now() >= pacer.deadline {
                    ErrorKind::TimedOut
                } else {
                    ErrorKind::Other
                };
                return Err(timer_failed(kind, step, NOT_WOKEN));
            }
        }
        Err(timer_failed(
            ErrorKind::Other,
            step,
            &format!("its waker was woken {LOOKS} times, and it did not fire"),
        ))
    }
}

/// One arming of `timer`: reset to `at`, then polled with `waker`, whose wakes are `wakes`;
/// neither call may wake it on its own thread before returning.
fn arm_timer(
    timer: &WatchTimer,
    at: Instant,
    waker: &Waker,
    wakes: &Wakes,
) -> Result<Poll<()>, Broken> {
    let mut timer = lock(timer);
    let Some(timer) = timer.as_mut() else {
        // Taken out: the replay is over.
        return Err(Broken::Late);
    };
    let before = wakes.within();
    calling(|| timer.as_mut().reset(at));
    if wakes.within() != before {
        return Err(Broken::ResetWoke);
    }
    let poll = calling(|| timer.as_mut().poll(&mut Context::from_waker(waker)));
    if wakes.within() != before {
        return Err(Broken::PollWoke);
    }
    Ok(poll)
}

/// Ends the replay when dropped: later wakes do nothing, and the timer is dropped on the
/// check's thread unless a re-arm is in it still (it is then dropped where that ends).
struct Over<'a>(&'a Watch);

impl Drop for Over<'_> {
    fn drop(&mut self) {
        lock(&self.0.guarded).over = true;
        self.0.changed.notify_all();
        let timer = match self.0.timer.try_lock() {
            Ok(mut timer) => timer.take(),
            Err(TryLockError::Poisoned(e)) => e.into_inner().take(),
            Err(TryLockError::WouldBlock) => None,
        };
        drop(timer);
    }
}
