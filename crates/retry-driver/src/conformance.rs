//! Checks of a [`Runtime`]'s sockets ([`check_read_armed`]) and timers ([`check_timer`]) against
//! the contracts the driver relies on, for the authors of adapters: run them from the adapter's
//! tests, on the adapter's own executor.
//!
//! Each check ends within 10 s of std's clock, each of its waits for a wake within 1 s (house
//! rule 12). Its waits are paced by a thread of its own, never by the runtime's timers, so a
//! runtime whose timers never fire, or wake without ever being `Ready`, fails the check instead
//! of hanging it (review29 V1).

use core::cell::Cell;
use core::future::{poll_fn, Future};
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::io::{self, ErrorKind, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
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
/// The whole check ends within 10 s of std's clock, each wait for a wake within 1 s, its waits
/// paced by a thread of its own (review29 V1). It runs on the runtime's executor, whose reactor
/// the socket needs (the listener is polled, never blocked on).
///
/// # Errors
///
/// A failed step of the setup (listen, connect, accept, the peer's writes) or a read error,
/// saying which step; a broken contract as [`ErrorKind::Other`], saying which rule; a check
/// that did not end within its bound as [`ErrorKind::TimedOut`], saying what it waited for.
pub async fn check_read_armed<R: Runtime>(runtime: &R) -> io::Result<bool> {
    let deadline = time::Instant::now() + BOUND;
    let step = |what: &'static str| move |e: io::Error| failed(e.kind(), what, &e.to_string());
    let listener = TcpListener::bind("127.0.0.1:0").map_err(step("listen on 127.0.0.1"))?;
    listener
        .set_nonblocking(true)
        .map_err(step("make the listener non-blocking"))?;
    let port = listener.local_addr().map_err(step("listen"))?.port();
    let connect = runtime.connect("127.0.0.1".to_owned(), port);
    let socket = within(deadline, "connect", connect)
        .await?
        .map_err(step("connect"))?;
    let mut peer = accept(deadline, &listener).await?;
    let mut reads = Reads {
        deadline,
        socket,
        armed: None,
        any_armed: false,
    };
    for (byte, len, write) in [(1, 10, "write 10 bytes"), (2, 100, "write 100 bytes")] {
        if reads.armed.is_some() {
            // The bytes come after the registration has settled, as a reply after its request
            // (the executor runs its reactor meanwhile).
            pause(2 * STEP).await?;
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
struct Reads {
    deadline: time::Instant,
    socket: Pin<Box<dyn Socket>>,
    armed: Option<Arc<Wakes>>,
    any_armed: bool,
}

impl Reads {
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
        if woken(self.deadline.min(time::Instant::now() + WAIT), &wakes).await? {
            Ok(())
        } else if time::Instant::now() >= self.deadline {
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
    /// `Pending` poll never counts for the read that returned (review28 U2).
    async fn read(&mut self, step: &str) -> io::Result<(usize, bool, Read)> {
        // Each look but the last waits for a wake or a STEP: bounded by the deadline.
        while time::Instant::now() < self.deadline {
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
            woken(self.deadline.min(time::Instant::now() + STEP), &wakes).await?;
        }
        Err(timed_out(step))
    }
}

/// The bytes a read returned and its waker's wakes.
struct Read {
    buf: [u8; READ],
    wakes: Arc<Wakes>,
}

/// [`AsyncTimer`]'s contract (review26 S5, review28 U10, review29 V3, house rule 8): on every
/// runtime, a timer is never `Ready` before its instant, it fires (its last `Pending` poll's
/// waker is woken, and it is `Ready` within 1 s of its instant), and polled after a reset to an
/// instant it has already seen pass, it is `Ready` at once. On a runtime that does not spawn
/// ([`Runtime::spawns`]), moreover, neither [`AsyncTimer::reset`] nor [`AsyncTimer::poll`]
/// wakes a waker before it returns.
///
/// A timer set an hour ahead is polled (`Pending`), reset to 50 ms ahead and polled until it is
/// `Ready` after wakes of its waker (an early wake is harmless, house rule 8: it is polled
/// again), set an hour ahead again and polled; the same with 5 ms ahead (the reset of the
/// driver's watchdog, whose instant may have passed by the time of the reset); then it is reset
/// to the instant the check started, where it must be `Ready` at once. Each poll is given a
/// waker of its own. On a runtime that does not spawn, no poll may wake its own waker and no
/// reset the last poll's waker before returning.
///
/// The whole check ends within 10 s of std's clock, each wait for a wake within 1 s, its waits
/// paced by a thread of its own, not by the timers it checks (review29 V1). It runs on the
/// runtime's executor, whose reactor the timers may need.
///
/// # Errors
///
/// A broken contract as [`ErrorKind::Other`], saying which step and rule; a check that did not
/// end within its bound as [`ErrorKind::TimedOut`].
pub async fn check_timer<R: Runtime>(runtime: &R) -> io::Result<()> {
    let deadline = time::Instant::now() + BOUND;
    let start = runtime.now();
    let spawns = runtime.spawns();
    let ahead = |by| runtime.now().saturating_add(by);
    let mut timer = runtime.new_timer(ahead(HOUR));
    let mut last = hour_ahead(&mut timer, "a poll an hour ahead", spawns)?;
    for (lead, reset, wait) in [
        (SOON, "a reset to 50 ms ahead", "a timer 50 ms ahead"),
        (GRACE, "a reset to 5 ms ahead", "a timer 5 ms ahead"),
    ] {
        let at = ahead(lead);
        calling(|| timer.as_mut().reset(at));
        unwoken(
            &last,
            spawns,
            reset,
            "woke the last poll's waker before returning",
        )?;
        let until = time::Instant::now() + lead + WAIT;
        fires(
            runtime,
            &mut timer,
            at,
            until.min(deadline),
            deadline,
            wait,
            spawns,
        )
        .await?;
        calling(|| timer.as_mut().reset(ahead(HOUR)));
        last = hour_ahead(&mut timer, "a poll an hour ahead, after firing", spawns)?;
    }
    // Review29 V2: `start` is before the instants the timer has fired at, so it has passed for
    // the runtime's timers too (tokio's wheel), however long this thread was preempted.
    let step = "a reset to a past instant";
    calling(|| timer.as_mut().reset(start));
    unwoken(
        &last,
        spawns,
        step,
        "woke the last poll's waker before returning",
    )?;
    let (poll, _) = poll_timer(&mut timer, step, spawns)?;
    expect_timer(poll.is_ready(), step, "not Ready at once")
}

/// How far ahead [`check_timer`] sets a timer that must not fire during the check.
const HOUR: Duration = Duration::from_secs(3600);

/// How far ahead [`check_timer`] first sets the timer it waits for.
const SOON: Duration = Duration::from_millis(50);

/// How far ahead [`check_timer`] then sets it: the driver's watchdog's reset (review29 V3).
const GRACE: Duration = crate::driver::UNCLAIMED_TIMER_GRACE;

/// How many `Pending` polls of a timer, each after a wake, [`check_timer`] makes before it fails
/// one that wakes without being `Ready` (house rule 12: bounded in steps too).
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

/// Polls `timer`, set to `at`, until it is `Ready`, each `Pending` poll's waker woken before the
/// next look: not before `at`, and by `until`, the check's `deadline` at the latest (review29
/// V1: a timer that never fires, or fires without being `Ready`, fails by then).
async fn fires<R: Runtime>(
    runtime: &R,
    timer: &mut Pin<Box<dyn AsyncTimer>>,
    at: Instant,
    until: time::Instant,
    deadline: time::Instant,
    step: &str,
    spawns: bool,
) -> io::Result<()> {
    // Each look but the last waits for a wake, which ends by `until`: bounded in time, and in
    // steps by LOOKS.
    for looks in 0..LOOKS {
        let (poll, wakes) = poll_timer(timer, step, spawns)?;
        if poll.is_ready() {
            return expect_timer(runtime.now() >= at, step, "Ready before its instant");
        }
        if !woken(until, &wakes).await? {
            return Err(if time::Instant::now() >= deadline {
                timer_failed(ErrorKind::TimedOut, step, "")
            } else if looks == 0 {
                timer_failed(
                    ErrorKind::Other,
                    step,
                    "its waker was not woken when it fired",
                )
            } else {
                never_ready(step)
            });
        }
    }
    Err(never_ready(step))
}

/// A timer woken again and again, but not `Ready` by its wait's end ([`fires`]).
fn never_ready(step: &str) -> io::Error {
    timer_failed(
        ErrorKind::Other,
        step,
        &format!("its waker was woken, but it was not Ready {WAIT:?} after its instant"),
    )
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
        &wakes,
        spawns,
        step,
        "the poll woke its waker before returning",
    )?;
    Ok((poll, wakes))
}

/// Fails `step` if `wakes` counts a wake made by a [`calling`] call before it returned, on a
/// runtime that does not spawn: the only runtimes the rule binds (review29 V3).
fn unwoken(wakes: &Wakes, spawns: bool, step: &str, why: &str) -> io::Result<()> {
    let woken = wakes.within.load(Ordering::SeqCst) > 0;
    expect_timer(
        spawns || !woken,
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

    /// Has each wake from now on wake `task` too: a wake that a [`Wakes::count`] made after this
    /// call does not see wakes `task` (the lock orders the two).
    fn listen(&self, task: &Waker) {
        let mut listening = self.task.lock().unwrap_or_else(PoisonError::into_inner);
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
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

/// A wake at an instant of std's clock, made by a thread of its own: the checks' waits depend on
/// no timer of the runtime (review29 V1). The thread ends at that instant, or at once when the
/// alarm is dropped.
struct Alarm {
    rings: Arc<Wakes>,
    /// Dropped with the alarm, which ends its thread's wait.
    _stop: mpsc::Sender<()>,
}

impl Alarm {
    /// An alarm that rings at `at`, or why no thread could be started for it.
    fn set(at: time::Instant) -> io::Result<Alarm> {
        let rings = Wakes::new();
        let ring = rings.clone();
        let (stop, stopped) = mpsc::channel::<()>();
        thread::Builder::new()
            .name("conformance-alarm".to_owned())
            .spawn(move || {
                // Ends by `at`: each wait lasts until then, or until the alarm is dropped.
                while let Err(RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(at.saturating_duration_since(time::Instant::now()))
                {
                    if time::Instant::now() >= at {
                        ring.wake_by_ref();
                        return;
                    }
                }
            })
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("conformance: start a thread for the check's waits: {e}"),
                )
            })?;
        Ok(Alarm { rings, _stop: stop })
    }

    /// Wakes `task` when the alarm rings; returns whether it has rung.
    fn listen(&self, task: &Waker) -> bool {
        self.rings.listen(task);
        self.rings.count() > 0
    }
}

/// Whether `wakes` counts a wake by `until` (review28 U4: a runtime that never wakes fails by
/// then). The task sleeps until the wake, or until an [`Alarm`] rings at `until`.
async fn woken(until: time::Instant, wakes: &Wakes) -> io::Result<bool> {
    if wakes.count() > 0 || time::Instant::now() >= until {
        return Ok(wakes.count() > 0);
    }
    let alarm = Alarm::set(until)?;
    Ok(poll_fn(|cx| {
        wakes.listen(cx.waker());
        let rang = alarm.listen(cx.waker());
        if wakes.count() > 0 {
            Poll::Ready(true)
        } else if rang {
            Poll::Ready(false)
        } else {
            Poll::Pending
        }
    })
    .await)
}

/// Waits `length` of std's clock (an [`Alarm`]; the executor runs its reactor meanwhile).
async fn pause(length: Duration) -> io::Result<()> {
    woken(time::Instant::now() + length, &Wakes::default())
        .await
        .map(drop)
}

/// `future`'s output, or a [`ErrorKind::TimedOut`] error naming `step` at `deadline`.
async fn within<T>(
    deadline: time::Instant,
    step: &str,
    future: impl Future<Output = T>,
) -> io::Result<T> {
    let mut future = core::pin::pin!(future);
    let alarm = Alarm::set(deadline)?;
    poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            Poll::Ready(Ok(output))
        } else if alarm.listen(cx.waker()) {
            Poll::Ready(Err(timed_out(step)))
        } else {
            Poll::Pending
        }
    })
    .await
}

/// The listener's one connection, looked for every [`STEP`] until `deadline`.
async fn accept(deadline: time::Instant, listener: &TcpListener) -> io::Result<TcpStream> {
    // At most BOUND / STEP looks.
    while time::Instant::now() < deadline {
        match listener.accept() {
            Ok((peer, _)) => {
                // Some systems pass the listener's O_NONBLOCK on: the peer's writes block.
                peer.set_nonblocking(false)
                    .map_err(|e| failed(e.kind(), "accept", &e.to_string()))?;
                return Ok(peer);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => pause(STEP).await?,
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
