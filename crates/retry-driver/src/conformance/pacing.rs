//! The pacing of the checks' waits: one thread of a check's own ([`Pacer`]) rings each wait at
//! its instant, never the runtime's timers (review29 V1); it is joined when the check ends
//! (review30 W4), or left to end by the deadline on its own (review31 X3). [`Wakes`] counts a
//! waker's wakes, those made within a [`calling`] call apart (review29 V3), and a wake made
//! before the poll returned is followed by one yield, never a busy loop (review30 W2). A thread
//! that could not be started is named as such ([`no_thread`], review30 W5). The thread also runs
//! the jobs handed to it ([`Hand::run`]): the watchdog's re-arm from within its waker's wake, so
//! that a re-arm that blocks blocks it, not the thread of the runtime under test (review31 X1).

use core::cell::Cell;
use core::future::{poll_fn, Future};
use core::task::{Poll, Waker};
use core::time::Duration;
use std::io::{self, ErrorKind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Wake;
use std::{thread, time};

use super::{timed_out, WAIT};

std::thread_local! {
    /// This thread is in a [`calling`] call.
    static CALLING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `call`, counting the wakes it makes before it returns as [`Wakes::within`]: those on
/// this thread meanwhile (a wake from another thread, e.g. a reactor's, is not one of them,
/// however soon it comes).
pub(super) fn calling<T>(call: impl FnOnce() -> T) -> T {
    /// Ends the call, whether `call` returns or unwinds.
    struct Ends;
    impl Drop for Ends {
        fn drop(&mut self) {
            CALLING.with(|calling| calling.set(false));
        }
    }
    CALLING.with(|calling| calling.set(true));
    let _ends = Ends;
    call()
}

/// Whether this thread is in a [`calling`] call.
pub(super) fn in_call() -> bool {
    CALLING.with(Cell::get)
}

/// Counts its wakes, and passes each on to the task waiting for one ([`woken`]).
#[derive(Default)]
pub(super) struct Wakes {
    all: AtomicUsize,
    /// Those made within a [`calling`] call, before it returned.
    within: AtomicUsize,
    /// The task of the last [`Wakes::listen`].
    task: Mutex<Option<Waker>>,
}

impl Wakes {
    pub(super) fn new() -> Arc<Wakes> {
        Arc::default()
    }

    pub(super) fn count(&self) -> usize {
        self.all.load(Ordering::SeqCst)
    }

    pub(super) fn within(&self) -> usize {
        self.within.load(Ordering::SeqCst)
    }

    /// Has each wake from now on wake `task` too: a wake that a [`Wakes::count`] made after this
    /// call does not see wakes `task` (the lock orders the two).
    fn listen(&self, task: &Waker) {
        let mut listening = lock(&self.task);
        if !listening.as_ref().is_some_and(|old| old.will_wake(task)) {
            *listening = Some(task.clone());
        }
    }
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if in_call() {
            self.within.fetch_add(1, Ordering::SeqCst);
        }
        self.all.fetch_add(1, Ordering::SeqCst);
        let task = lock(&self.task).clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

/// The thread that paces a check's waits (review29 V1: they depend on no timer of the
/// runtime): it wakes the [`Wakes`] of the last [`Pacer::set`] at its instant, and runs the
/// jobs handed to it ([`Hand::run`]). One per check (review30 W4: not one per wait); it ends at
/// the check's deadline at the latest (or, if a job blocks past it, when that job returns: a
/// job is a reset and a poll of the timer under check, review31 X1), and is told
/// to end and joined when the pacer is dropped, with the check or its future (not if dropped on
/// the thread itself, nor after [`WAIT`] without its end: review31 X3).
pub(super) struct Pacer {
    pub(super) deadline: time::Instant,
    alarm: Arc<(Mutex<Alarm>, Condvar)>,
    thread: Option<thread::JoinHandle<()>>,
}

/// A job for the pacing thread ([`Hand::run`]).
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// A handle that hands jobs to a [`Pacer`]'s thread, from any thread (review31 X1).
#[derive(Clone)]
pub(super) struct Hand(Arc<(Mutex<Alarm>, Condvar)>);

impl Hand {
    /// Has the pacing thread run `job` next, before any alarm; `false` (and `job` dropped
    /// unrun) if the thread has ended or is to end.
    pub(super) fn run(&self, job: Job) -> bool {
        let (alarm, changed) = &*self.0;
        let mut next = lock(alarm);
        if next.over {
            return false;
        }
        next.jobs.push(job);
        drop(next);
        changed.notify_all();
        true
    }
}

/// The pacing thread's next wake.
#[derive(Default)]
struct Alarm {
    at: Option<time::Instant>,
    rings: Option<Arc<Wakes>>,
    /// Jobs to run ([`Hand::run`]), first in first out.
    jobs: Vec<Job>,
    /// The thread has ended, or is to end.
    over: bool,
    /// The thread is returning: nothing of it runs under the lock or rings after this.
    ended: bool,
}

impl Pacer {
    /// A pacer whose thread ends by `deadline`, or why its thread could not be started.
    pub(super) fn start(deadline: time::Instant) -> io::Result<Pacer> {
        let alarm = Arc::new((Mutex::new(Alarm::default()), Condvar::new()));
        let paced = alarm.clone();
        let thread = thread::Builder::new()
            .name("conformance-pacer".to_owned())
            .spawn(move || pace(&paced.0, &paced.1, deadline))?;
        Ok(Pacer {
            deadline,
            alarm,
            thread: Some(thread),
        })
    }

    /// A handle that hands the thread jobs ([`Hand::run`]).
    pub(super) fn hand(&self) -> Hand {
        Hand(self.alarm.clone())
    }

    /// Wakes that ring at `at` (the deadline at the latest; at once if the thread has ended),
    /// instead of the last set's.
    fn set(&self, at: time::Instant) -> Arc<Wakes> {
        let rings = Wakes::new();
        let mut alarm = lock(&self.alarm.0);
        if alarm.over {
            drop(alarm);
            rings.wake_by_ref();
        } else {
            alarm.at = Some(at);
            alarm.rings = Some(rings.clone());
            drop(alarm);
            self.alarm.1.notify_all();
        }
        rings
    }
}

impl Drop for Pacer {
    /// Tells the thread to end and joins it, unless this runs on the thread itself (the check's
    /// future dropped from within a ring's wake: a join would be of itself), or the thread has
    /// not ended within [`WAIT`] (a ring's wake or a job blocked): then the thread is left to end
    /// on its own, by the check's deadline or when the job returns (review31 X3: never a
    /// self-join, never an unbounded wait).
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        let (alarm, changed) = &*self.alarm;
        lock(alarm).over = true;
        changed.notify_all();
        if thread.thread().id() == thread::current().id() {
            return;
        }
        let ended = changed
            .wait_timeout_while(lock(alarm), WAIT, |alarm| !alarm.ended)
            .map_or_else(|e| e.into_inner().0, |(alarm, _)| alarm)
            .ended;
        if ended {
            // The thread has set `ended` and only returns (it never panics): a join of
            // microseconds.
            let _ = thread.join();
        }
    }
}

/// The pacing thread: runs each job handed to it and rings each alarm at its instant, until
/// `over` or `deadline`. Each turn runs the jobs handed so far, rings an alarm, waits for its
/// instant or the deadline, or ends: bounded by the deadline (and by the jobs, each of which
/// its hander waits for [`WAIT`] at most; a job left running when the pacer is dropped leaves
/// the thread to end on its own, review31 X3).
fn pace(alarm: &Mutex<Alarm>, changed: &Condvar, deadline: time::Instant) {
    let mut next = lock(alarm);
    loop {
        let now = time::Instant::now();
        if next.over {
            next.ended = true;
            // Jobs never run: their handers see them undone.
            let unrun = core::mem::take(&mut next.jobs);
            drop(next);
            drop(unrun);
            changed.notify_all();
            return;
        }
        if !next.jobs.is_empty() {
            let jobs = core::mem::take(&mut next.jobs);
            drop(next);
            for job in jobs {
                job();
            }
            next = lock(alarm);
            continue;
        }
        let due = next.at.map_or(deadline, |at| at.min(deadline));
        if now >= due {
            next.at = None;
            next.over = now >= deadline;
            let rings = next.rings.take();
            drop(next);
            if let Some(rings) = rings {
                rings.wake_by_ref();
            }
            next = lock(alarm);
        } else {
            next = changed
                .wait_timeout(next, due - now)
                .map_or_else(|e| e.into_inner().0, |(next, _)| next);
        }
    }
}

/// `mutex`'s guard, poisoned or not (nothing under these locks can be left half done).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A thread the check `check` could not start: named as such, and never of the kind
/// [`ErrorKind::Other`], which the checks keep for a broken contract (review30 W5).
pub(super) fn no_thread(check: &str, e: &io::Error) -> io::Error {
    let kind = match e.kind() {
        ErrorKind::Other => ErrorKind::ResourceBusy,
        kind => kind,
    };
    io::Error::new(
        kind,
        format!("{check}: start the thread that paces its waits: {e}"),
    )
}

/// Whether `wakes` counts more than `seen` wakes by `until` (review28 U4: a runtime that never
/// wakes fails by then). The task sleeps until the wake, or until the [`Pacer`] rings at
/// `until`. A wake counted already (one a call made before it returned: tokio's coop budget,
/// review30 W2) is followed by one yield of the task first, so that the executor runs its
/// reactor and renews the budget before the next poll: never a busy loop.
pub(super) async fn woken(pacer: &Pacer, until: time::Instant, wakes: &Wakes, seen: usize) -> bool {
    if wakes.count() > seen {
        yield_now().await;
        return true;
    }
    if time::Instant::now() >= until {
        return false;
    }
    let rings = pacer.set(until);
    poll_fn(|cx| {
        wakes.listen(cx.waker());
        rings.listen(cx.waker());
        if wakes.count() > seen {
            Poll::Ready(true)
        } else if rings.count() > 0 {
            Poll::Ready(false)
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Returns `Pending` once, having woken the task: the executor runs before the next poll.
pub(super) async fn yield_now() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await;
}

/// Waits `length` of std's clock, the deadline at the latest (the [`Pacer`]; the executor runs
/// its reactor meanwhile).
pub(super) async fn pause(pacer: &Pacer, length: Duration) {
    woken(pacer, time::Instant::now() + length, &Wakes::default(), 0).await;
}

/// `future`'s output, or a [`ErrorKind::TimedOut`] error naming `step` at the deadline.
pub(super) async fn within<T>(
    pacer: &Pacer,
    step: &str,
    future: impl Future<Output = T>,
) -> io::Result<T> {
    let mut future = core::pin::pin!(future);
    let rings = pacer.set(pacer.deadline);
    poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            Poll::Ready(Ok(output))
        } else {
            rings.listen(cx.waker());
            if rings.count() > 0 {
                Poll::Ready(Err(timed_out(step)))
            } else {
                Poll::Pending
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{BOUND, STEP};

    /// Review30 W5: a thread the check could not start names the check and the step, and is
    /// never of the kind the checks keep for a broken contract.
    #[test]
    fn review30_w5_a_failed_thread_start_names_the_check_and_is_not_other() {
        let error = no_thread("check_timer", &io::Error::other("no threads left"));
        assert_eq!(error.kind(), ErrorKind::ResourceBusy, "{error}");
        assert_eq!(
            error.to_string(),
            "check_timer: start the thread that paces its waits: no threads left"
        );
        let error = no_thread("check_read_armed", &io::Error::from(ErrorKind::WouldBlock));
        assert_eq!(error.kind(), ErrorKind::WouldBlock, "{error}");
    }

    /// Review30 W4: the pacing thread rings at its instant, and has ended when the dropped
    /// pacer returns (bounded: it rings by the deadline at the latest).
    #[test]
    fn review30_w4_the_pacer_rings_and_its_thread_is_joined_on_drop() {
        let deadline = time::Instant::now() + BOUND;
        let pacer = Pacer::start(deadline).expect("a thread");
        let rings = pacer.set(time::Instant::now() + STEP);
        // Bounded: the pacer rings by `deadline` at the latest.
        while rings.count() == 0 && time::Instant::now() < deadline {
            thread::sleep(STEP);
        }
        assert_eq!(rings.count(), 1);
        let alarm = Arc::downgrade(&pacer.alarm);
        drop(pacer);
        // The thread's share of the alarm is gone: it has ended, not merely been told to.
        assert!(alarm.upgrade().is_none(), "the thread outlived the pacer");
    }

    /// Review31 X1: a job handed to the pacer runs on its thread (not the hander's), and one
    /// handed once the pacer is dropped is refused, not left waiting; bounded by `BOUND`.
    #[test]
    fn review31_x1_the_pacer_runs_a_handed_job_on_its_thread_and_refuses_one_once_dropped() {
        let pacer = Pacer::start(time::Instant::now() + BOUND).expect("a thread");
        let hand = pacer.hand();
        let (ran, on) = std::sync::mpsc::channel();
        assert!(hand.run(Box::new(move || {
            let _ = ran.send(thread::current().id());
        })));
        let on = on.recv_timeout(BOUND).expect("the job ran");
        assert_ne!(
            on,
            thread::current().id(),
            "the job ran on the hander's thread"
        );
        drop(pacer);
        assert!(!hand.run(Box::new(|| {})), "a job handed after the drop");
    }

    /// A waker that runs `on_wake` when woken (review31 X3's tests).
    struct OnWake<F: Fn() + Send + Sync + 'static>(F);

    impl<F: Fn() + Send + Sync + 'static> Wake for OnWake<F> {
        fn wake(self: Arc<Self>) {
            (self.0)();
        }
    }

    /// A pacer set `STEP` ahead, its ring waking `waker`: set again if it rang before `waker`
    /// listened (bounded: 100 tries).
    fn ringing(pacer: &Pacer, waker: &Waker) -> Arc<Wakes> {
        let mut rings = pacer.set(time::Instant::now() + STEP);
        for _ in 0..100 {
            rings.listen(waker);
            if rings.count() == 0 {
                break;
            }
            rings = pacer.set(time::Instant::now() + STEP);
        }
        rings
    }

    /// Review31 X3: a pacer dropped on its own thread, from within a ring's wake (the check's
    /// future dropped with its last waker), does not join itself (std's join of the current
    /// thread panics); bounded by `BOUND`.
    #[test]
    fn review31_x3_a_pacer_dropped_on_its_own_thread_does_not_join_itself() {
        let pacer = Arc::new(Mutex::new(Some(
            Pacer::start(time::Instant::now() + BOUND).expect("a thread"),
        )));
        let (dropped, done) = std::sync::mpsc::channel();
        let held = pacer.clone();
        let waker = Waker::from(Arc::new(OnWake(move || {
            drop(lock(&held).take());
            let _ = dropped.send(());
        })));
        let rings = lock(&pacer).as_ref().map(|pacer| ringing(pacer, &waker));
        assert!(rings.is_some());
        assert!(
            done.recv_timeout(BOUND).is_ok(),
            "the pacer's drop on its own thread did not return"
        );
        assert!(lock(&pacer).is_none());
    }

    /// Review31 X3: a pacer whose ring's wake blocks is dropped within `WAIT` (its thread left
    /// to end on its own), not after the wake returns; bounded by `BOUND`.
    #[test]
    fn review31_x3_a_pacer_whose_ring_blocks_is_dropped_without_waiting_for_it() {
        let pacer = Pacer::start(time::Instant::now() + BOUND).expect("a thread");
        let (entered, in_wake) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Mutex::new(released);
        let returned = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let woke = returned.clone();
        let waker = Waker::from(Arc::new(OnWake(move || {
            let _ = entered.send(());
            // Blocks until the test releases it, `BOUND` at most.
            let _ = lock(&released).recv_timeout(BOUND);
            woke.store(true, Ordering::SeqCst);
        })));
        let _rings = ringing(&pacer, &waker);
        assert!(in_wake.recv_timeout(BOUND).is_ok(), "the pacer never rang");
        drop(pacer);
        assert!(
            !returned.load(Ordering::SeqCst),
            "the drop waited for the blocked wake to return"
        );
        let _ = release.send(());
    }
}
