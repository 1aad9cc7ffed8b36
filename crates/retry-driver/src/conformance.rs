//! Checks of a [`Runtime`]'s sockets ([`check_read_armed`]) and timers ([`check_timer`]) against
//! the contracts the driver relies on, for the authors of adapters: run them from the adapter's
//! tests, on the adapter's own executor.
//!
//! Each check ends within 10 s of std's clock, each of its waits for a wake within 1 s of when
//! the wake is due (house rule 12), and each of its loops is capped in steps. Its waits are
//! paced by one thread of its own, never by the runtime's timers, so a runtime whose timers
//! never fire, or wake without ever being `Ready`, fails the check instead of hanging it
//! (review29 V1); the thread is joined when the check ends (review30 W4), unless the check's
//! future is dropped on that thread, or the thread does not end within 1 s of being told to: it
//! then ends by the check's deadline on its own (review31 X3). A wake that a poll
//! makes of its own waker before it returns (tokio's, once its task's coop budget is spent) is
//! followed by one yield of the check's task, never by a busy loop (review30 W2).

use core::cell::Cell;
use core::future::{poll_fn, Future};
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::io::{self, ErrorKind, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Wake;
use std::{thread, time};

use retry_core::time::Instant;

use crate::runtime::{AsyncTimer, Runtime, Socket};

/// The pause between two looks at a socket or a listener.
const STEP: Duration = Duration::from_millis(5);

/// How long a whole check may take (house rule 12), on std's clock.
const BOUND: Duration = Duration::from_secs(10);

/// How long one wait for a wake may take (review28 U4), within [`BOUND`].
const WAIT: Duration = Duration::from_secs(1);

/// The size of [`check_read_armed`]'s read buffer.
const READ: usize = 64;

/// [`Socket::poll_read_armed`] on a 127.0.0.1 pair (review25 R4, review28 U1–U4, house rule 8).
/// A runtime need not arm reads (the default method never does), but an armed read says a wake
/// is certain to come when bytes arrive, the stream ends or the socket fails, and the driver
/// does not read again until it comes: a wrong `true` hangs the socket.
///
/// The peer writes 10 bytes, then 100, then closes; the check reads each batch until it is
/// consumed, 64 bytes at most per read, however few each read returns. Each poll gets a waker
/// of its own, so only a wake of the waker a read said it armed counts. Every read must return
/// bytes the peer sent and not yet read; one that fills the buffer must not say it is armed;
/// one that says so must have its waker woken before the next read: by the bytes still unread
/// or next written, or by the end of the stream; the end of the stream is `(0, false)`.
/// Returns whether any read said it was armed (`true` for retry-tokio's and retry-async-std's
/// sockets, whose tests require it).
///
/// The whole check ends within 10 s of std's clock, each wait for a wake within 1 s, each read
/// within 1000 polls, its waits paced by one thread of its own, joined when it ends (unless the
/// check's future is dropped on that thread, or it has not ended within 1 s: it then ends by the
/// deadline on its own; review29 V1, review30 W2 W4, review31 X3). It runs on the runtime's executor, whose reactor the socket
/// needs (the listener is polled, never blocked on).
///
/// # Errors
///
/// A failed step of the setup (listen, connect, accept, the peer's writes) or a read error,
/// saying which step; a broken contract as [`ErrorKind::Other`], saying which rule; a check
/// that did not end within its bound, or a read not ready within 1000 polls, as
/// [`ErrorKind::TimedOut`], saying what it waited for; a thread the check could not start for
/// its waits as the kind [`thread::Builder::spawn`] gave, [`ErrorKind::ResourceBusy`] instead
/// of [`ErrorKind::Other`], saying so (review30 W5).
pub async fn check_read_armed<R: Runtime>(runtime: &R) -> io::Result<bool> {
    let deadline = time::Instant::now() + BOUND;
    let pacer = Pacer::start(deadline).map_err(|e| no_thread("check_read_armed", &e))?;
    let step = |what: &'static str| move |e: io::Error| failed(e.kind(), what, &e.to_string());
    let listener = TcpListener::bind("127.0.0.1:0").map_err(step("listen on 127.0.0.1"))?;
    listener
        .set_nonblocking(true)
        .map_err(step("make the listener non-blocking"))?;
    let port = listener.local_addr().map_err(step("listen"))?.port();
    let connect = runtime.connect("127.0.0.1".to_owned(), port);
    let socket = within(&pacer, "connect", connect)
        .await?
        .map_err(step("connect"))?;
    let mut peer = accept(&pacer, &listener).await?;
    let mut reads = Reads {
        pacer: &pacer,
        socket,
        armed: None,
        any_armed: false,
    };
    for (byte, len, write) in [(1, 10, "write 10 bytes"), (2, 100, "write 100 bytes")] {
        if reads.armed.is_some() {
            // The bytes come after the registration has settled, as a reply after its request
            // (the executor runs its reactor meanwhile).
            pause(&pacer, 2 * STEP).await;
        }
        peer.write_all(&[byte; 100][..len]).map_err(step(write))?;
        reads.consume(byte, len).await?;
    }
    drop(peer);
    reads.wake_of_armed("the end of the stream").await?;
    let (n, armed, _) = reads.read("the end of the stream").await?;
    expect(
        (n, armed) == (0, false),
        "the end of the stream",
        &format!("(bytes, armed) was ({n}, {armed}), not (0, false)"),
    )?;
    Ok(reads.any_armed)
}

/// The reads of [`check_read_armed`]: its socket, and the wakes of the last read's waker if
/// that read said it was armed.
struct Reads<'a> {
    pacer: &'a Pacer,
    socket: Pin<Box<dyn Socket>>,
    armed: Option<Arc<Wakes>>,
    any_armed: bool,
}

impl Reads<'_> {
    /// Reads the `len` bytes `byte` the peer wrote, checking each read (review28 U3).
    async fn consume(&mut self, byte: u8, len: usize) -> io::Result<()> {
        let step = "a read";
        let mut left = len;
        // Each read takes at least one byte (or fails the check): at most `len` reads.
        while left > 0 {
            self.wake_of_armed("the bytes after it").await?;
            let (n, armed, read) = self.read(step).await?;
            expect(
                n > 0,
                step,
                "returned the end of the stream before the peer closed it",
            )?;
            expect(
                n <= READ,
                step,
                &format!("returned {n} bytes into a buffer of {READ}"),
            )?;
            expect(
                n <= left,
                step,
                &format!("returned {n} bytes, more than the {left} sent and not yet read"),
            )?;
            expect(
                read.buf[..n].iter().all(|&b| b == byte),
                step,
                "returned bytes the peer did not send",
            )?;
            expect(
                !(armed && n == READ),
                step,
                "a read that filled the buffer said it was armed (more bytes may be there)",
            )?;
            left -= n;
            if armed {
                self.any_armed = true;
                self.armed = Some(read.wakes);
            }
        }
        Ok(())
    }

    /// If the last read said it was armed, waits for its waker's wake by `what` (review28 U1,
    /// U2: only that waker's wakes count), [`WAIT`] at most.
    async fn wake_of_armed(&mut self, what: &str) -> io::Result<()> {
        let Some(wakes) = self.armed.take() else {
            return Ok(());
        };
        let deadline = self.pacer.deadline;
        if woken(
            self.pacer,
            deadline.min(time::Instant::now() + WAIT),
            &wakes,
            0,
        )
        .await
        {
            Ok(())
        } else if time::Instant::now() >= deadline {
            Err(timed_out(&format!("the wake of an armed read by {what}")))
        } else {
            Err(broken(
                "an armed read",
                &format!("its waker was not woken by {what}"),
            ))
        }
    }

    /// Reads with `poll_read_armed` until the read is ready, looking again at its waker's wake
    /// or after a [`STEP`], each poll with a waker of its own: a wake registered by an earlier
    /// `Pending` poll never counts for the read that returned (review28 U2); [`LOOKS`] polls at
    /// most (review30 W2).
    async fn read(&mut self, step: &str) -> io::Result<(usize, bool, Read)> {
        let deadline = self.pacer.deadline;
        // Each look but the last waits for a wake or a STEP: bounded by the deadline, and in
        // steps by LOOKS.
        for _ in 0..LOOKS {
            if time::Instant::now() >= deadline {
                return Err(timed_out(step));
            }
            let wakes = Wakes::new();
            let waker = Waker::from(wakes.clone());
            let mut buf = [0u8; READ];
            let read = self
                .socket
                .as_mut()
                .poll_read_armed(&mut Context::from_waker(&waker), &mut buf);
            if let Poll::Ready(read) = read {
                let (n, armed) = read.map_err(|e| failed(e.kind(), step, &e.to_string()))?;
                return Ok((n, armed, Read { buf, wakes }));
            }
            woken(
                self.pacer,
                deadline.min(time::Instant::now() + STEP),
                &wakes,
                0,
            )
            .await;
        }
        Err(failed(
            ErrorKind::TimedOut,
            step,
            &format!("not ready after {LOOKS} polls, each after a wake or a {STEP:?} pause"),
        ))
    }
}

/// The bytes a read returned and its waker's wakes.
struct Read {
    buf: [u8; READ],
    wakes: Arc<Wakes>,
}

/// [`AsyncTimer`]'s contract (review26 S5, review28 U10, review29 V3, review30 W1 W2, house
/// rule 8): on every runtime, a timer is never `Ready` before its instant, it fires (its last
/// `Pending` poll's waker is woken, and it is `Ready` within 1 s of its instant), and polled
/// after a reset to an instant it has already seen pass, it is `Ready` at once, or, on a
/// runtime that spawns, `Pending` having woken its own waker (a spent coop budget) and `Ready`
/// when polled again after the task yielded. On a runtime that does not spawn
/// ([`Runtime::spawns`]), moreover, no reset wakes the last poll's waker and no poll its own
/// waker before it returns, and the driver's watchdog's sequence, which polls with one waker,
/// never has that waker woken from within a reset or a poll.
///
/// A timer set an hour ahead is polled (`Pending`), reset to 50 ms ahead and polled until it is
/// `Ready` after wakes of its waker (an early wake is harmless, house rule 8: it is polled
/// again), reset an hour ahead again (the reset after a firing, checked for wakes of the `Ready`
/// poll's and the last `Pending` poll's wakers, review30 W3) and polled; the same with 5 ms
/// ahead (the reset of the driver's watchdog, whose instant may have passed by the time of the
/// reset); then it is reset to the instant the check started, where it must be `Ready`. Each of
/// these polls is given a waker of its own. On a runtime that does not spawn, the check then
/// repeats the watchdog's own sequence with one waker (review30 W1): reset to 5 ms ahead and
/// polled, again before it fired, again after that waker's wake, and reset to the instant the
/// check started and polled (`Ready`).
///
/// A wake a call made before it returned (allowed on a runtime that spawns: tokio's coop
/// budget) is followed by one yield of the check's task before the next poll, so that the
/// executor runs and the budget is renewed (review30 W2); every loop is capped in steps too.
/// The whole check ends within 10 s of std's clock; each wait for a wake ends within 1 s of
/// when the wake is due. Its waits are paced by one thread of its own, not by the timers it
/// checks (review29 V1), joined when the check ends or its future is dropped (review30 W4; left
/// to end by the deadline on its own if dropped on that thread or not ended within 1 s, review31
/// X3). It runs on the runtime's executor, whose reactor the timers may need.
///
/// # Errors
///
/// A broken contract as [`ErrorKind::Other`], saying which step and rule; a check that did not
/// end within its bound as [`ErrorKind::TimedOut`]; a thread the check could not start for its
/// waits as the kind [`thread::Builder::spawn`] gave, [`ErrorKind::ResourceBusy`] instead of
/// [`ErrorKind::Other`], saying so (review30 W5).
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
        watchdog(runtime, &pacer, &mut timer, start).await
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

/// Review30 W1: the driver's watchdog's own sequence, on a runtime that does not spawn
/// (`LocalDriver::arm`, and `wake_unclaimed`, which arms it again after a firing): reset to
/// [`GRACE`] ahead, then polled, always with one waker, whose wake takes the lock held over
/// both calls. A reset or a poll that woke that waker before returning would deadlock it.
async fn watchdog<R: Runtime>(
    runtime: &R,
    pacer: &Pacer,
    timer: &mut Pin<Box<dyn AsyncTimer>>,
    start: Instant,
) -> io::Result<()> {
    let wakes = Wakes::new();
    let waker = Waker::from(wakes.clone());
    let arm = |timer: &mut Pin<Box<dyn AsyncTimer>>, at, step| {
        arm_watchdog(timer, at, &waker, &wakes, step)
    };
    let grace = || runtime.now().saturating_add(GRACE);
    // Pending, or Ready if the thread was preempted past the grace: the driver goes on either way.
    let _first = arm(timer, grace(), "the watchdog's arming")?;
    let seen = wakes.count();
    let step = "the watchdog armed again before it fired";
    let poll = arm(timer, grace(), step)?;
    if poll.is_pending() {
        let until = time::Instant::now() + GRACE + WAIT;
        if !woken(pacer, until.min(pacer.deadline), &wakes, seen).await {
            return Err(if time::Instant::now() >= pacer.deadline {
                timer_failed(ErrorKind::TimedOut, step, "")
            } else {
                timer_failed(
                    ErrorKind::Other,
                    step,
                    "the waker it was polled with was not woken when it fired",
                )
            });
        }
    }
    let _after = arm(timer, grace(), "the watchdog armed again after it fired")?;
    let step = "the watchdog armed with its instant already past";
    let poll = arm(timer, start, step)?;
    expect_timer(poll.is_ready(), step, "not Ready at once")
}

/// One arming of the watchdog ([`watchdog`]): `timer` reset to `at` and polled with `waker`,
/// whose wakes are `wakes`, neither call waking it before it returned.
fn arm_watchdog(
    timer: &mut Pin<Box<dyn AsyncTimer>>,
    at: Instant,
    waker: &Waker,
    wakes: &Wakes,
    step: &str,
) -> io::Result<Poll<()>> {
    let why = "(the one it was last polled with, and the driver's watchdog's only one) before \
               returning, on a runtime that does not spawn: the watchdog would deadlock";
    let before = wakes.within();
    calling(|| timer.as_mut().reset(at));
    expect_timer(
        wakes.within() == before,
        step,
        &format!("the reset woke the waker {why}"),
    )?;
    let poll = calling(|| timer.as_mut().poll(&mut Context::from_waker(waker)));
    expect_timer(
        wakes.within() == before,
        step,
        &format!("the poll woke the waker it was given {why}"),
    )?;
    Ok(poll)
}

/// How far ahead [`check_timer`] sets a timer that must not fire during the check.
const HOUR: Duration = Duration::from_secs(3600);

/// How far ahead [`check_timer`] first sets the timer it waits for.
const SOON: Duration = Duration::from_millis(50);

/// How far ahead [`check_timer`] then sets it: the driver's watchdog's reset (review29 V3).
const GRACE: Duration = crate::driver::UNCLAIMED_TIMER_GRACE;

/// How many `Pending` polls of a timer or a socket, each after a wake (or a pause, for a
/// socket), a check makes before it fails (house rule 12: bounded in steps too).
const LOOKS: usize = 1000;

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

std::thread_local! {
    /// This thread is in a [`calling`] call.
    static CALLING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `call`, counting the wakes it makes before it returns as [`Wakes::within`]: those on
/// this thread meanwhile (a wake from another thread, e.g. a reactor's, is not one of them,
/// however soon it comes).
fn calling<T>(call: impl FnOnce() -> T) -> T {
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

/// Counts its wakes, and passes each on to the task waiting for one ([`woken`]).
#[derive(Default)]
struct Wakes {
    all: AtomicUsize,
    /// Those made within a [`calling`] call, before it returned.
    within: AtomicUsize,
    /// The task of the last [`Wakes::listen`].
    task: Mutex<Option<Waker>>,
}

impl Wakes {
    fn new() -> Arc<Wakes> {
        Arc::default()
    }

    fn count(&self) -> usize {
        self.all.load(Ordering::SeqCst)
    }

    fn within(&self) -> usize {
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
        if CALLING.with(Cell::get) {
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
/// runtime): it wakes the [`Wakes`] of the last [`Pacer::set`] at its instant. One per check
/// (review30 W4: not one per wait); it ends at the check's deadline at the latest, and is told
/// to end and joined when the pacer is dropped, with the check or its future (not if dropped on
/// the thread itself, nor after [`WAIT`] without its end: review31 X3).
struct Pacer {
    deadline: time::Instant,
    alarm: Arc<(Mutex<Alarm>, Condvar)>,
    thread: Option<thread::JoinHandle<()>>,
}

/// The pacing thread's next wake.
#[derive(Default)]
struct Alarm {
    at: Option<time::Instant>,
    rings: Option<Arc<Wakes>>,
    /// The thread has ended, or is to end.
    over: bool,
    /// The thread is returning: nothing of it runs under the lock or rings after this.
    ended: bool,
}

impl Pacer {
    /// A pacer whose thread ends by `deadline`, or why its thread could not be started.
    fn start(deadline: time::Instant) -> io::Result<Pacer> {
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
    /// not ended within [`WAIT`] (a ring's wake blocked): then the thread is left to end by the
    /// check's deadline on its own (review31 X3: never a self-join, never an unbounded wait).
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

/// The pacing thread: rings each alarm at its instant, until `over` or `deadline`. Each turn
/// rings an alarm, waits for its instant or the deadline, or ends: bounded by the deadline.
fn pace(alarm: &Mutex<Alarm>, changed: &Condvar, deadline: time::Instant) {
    let mut next = lock(alarm);
    loop {
        let now = time::Instant::now();
        if next.over {
            next.ended = true;
            drop(next);
            changed.notify_all();
            return;
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
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A thread the check `check` could not start: named as such, and never of the kind
/// [`ErrorKind::Other`], which the checks keep for a broken contract (review30 W5).
fn no_thread(check: &str, e: &io::Error) -> io::Error {
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
async fn woken(pacer: &Pacer, until: time::Instant, wakes: &Wakes, seen: usize) -> bool {
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
async fn yield_now() {
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
async fn pause(pacer: &Pacer, length: Duration) {
    woken(pacer, time::Instant::now() + length, &Wakes::default(), 0).await;
}

/// `future`'s output, or a [`ErrorKind::TimedOut`] error naming `step` at the deadline.
async fn within<T>(pacer: &Pacer, step: &str, future: impl Future<Output = T>) -> io::Result<T> {
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

/// The listener's one connection, looked for every [`STEP`] until `deadline`.
async fn accept(pacer: &Pacer, listener: &TcpListener) -> io::Result<TcpStream> {
    // At most BOUND / STEP looks.
    while time::Instant::now() < pacer.deadline {
        match listener.accept() {
            Ok((peer, _)) => {
                // Some systems pass the listener's O_NONBLOCK on: the peer's writes block.
                peer.set_nonblocking(false)
                    .map_err(|e| failed(e.kind(), "accept", &e.to_string()))?;
                return Ok(peer);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => pause(pacer, STEP).await,
            Err(e) => return Err(failed(e.kind(), "accept", &e.to_string())),
        }
    }
    Err(timed_out("accept"))
}

fn failed(kind: ErrorKind, step: &str, why: &str) -> io::Error {
    io::Error::new(kind, format!("check_read_armed: {step}: {why}"))
}

/// A broken [`AsyncTimer`] contract, or a [`check_timer`] step not done by its deadline.
fn timer_failed(kind: ErrorKind, step: &str, why: &str) -> io::Error {
    let why = match kind {
        ErrorKind::TimedOut => format!("not done within {BOUND:?}"),
        _ => format!("AsyncTimer broke its contract: {why}"),
    };
    io::Error::new(kind, format!("check_timer: {step}: {why}"))
}

fn expect_timer(holds: bool, step: &str, why: &str) -> io::Result<()> {
    if holds {
        Ok(())
    } else {
        Err(timer_failed(ErrorKind::Other, step, why))
    }
}

fn broken(step: &str, why: &str) -> io::Error {
    failed(
        ErrorKind::Other,
        step,
        &format!("Socket::poll_read_armed broke its contract: {why}"),
    )
}

fn expect(holds: bool, step: &str, why: &str) -> io::Result<()> {
    if holds {
        Ok(())
    } else {
        Err(broken(step, why))
    }
}

fn timed_out(step: &str) -> io::Error {
    failed(
        ErrorKind::TimedOut,
        step,
        &format!("not done within {BOUND:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
