//! Checks of a [`Runtime`]'s sockets ([`check_read_armed`]) and timers ([`check_timer`]) against
//! the contracts the driver relies on, for the authors of adapters: run them from the adapter's
//! tests, on the adapter's own executor.

use core::cell::Cell;
use core::future::{poll_fn, Future};
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::io::{self, ErrorKind, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Wake;

use retry_core::time::Instant;

use crate::runtime::{AsyncTimer, Runtime, Socket};

/// The pause between two looks at a socket, a listener or a waker's count.
const STEP: Duration = Duration::from_millis(5);

/// How long a whole check may take (house rule 12), on the runtime's clock.
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
/// The whole check ends within 10 s on the runtime's clock, each wait for a wake within 1 s,
/// its waits paced by the runtime's timers, so it runs on the runtime's executor (the listener
/// is polled, never blocked on).
///
/// # Errors
///
/// A failed step of the setup (listen, connect, accept, the peer's writes) or a read error,
/// saying which step; a broken contract as [`ErrorKind::Other`], saying which rule; a check
/// that did not end within its bound as [`ErrorKind::TimedOut`], saying what it waited for.
pub async fn check_read_armed<R: Runtime>(runtime: &R) -> io::Result<bool> {
    let deadline = runtime.now().saturating_add(BOUND);
    let step = |what: &'static str| move |e: io::Error| failed(e.kind(), what, &e.to_string());
    let listener = TcpListener::bind("127.0.0.1:0").map_err(step("listen on 127.0.0.1"))?;
    listener
        .set_nonblocking(true)
        .map_err(step("make the listener non-blocking"))?;
    let port = listener.local_addr().map_err(step("listen"))?.port();
    let connect = runtime.connect("127.0.0.1".to_owned(), port);
    let socket = within(runtime, deadline, "connect", connect)
        .await?
        .map_err(step("connect"))?;
    let mut peer = accept(runtime, deadline, &listener).await?;
    let mut reads = Reads {
        runtime,
        deadline,
        socket,
        armed: None,
        any_armed: false,
    };
    for (byte, len, write) in [(1, 10, "write 10 bytes"), (2, 100, "write 100 bytes")] {
        if reads.armed.is_some() {
            // The bytes come after the registration has settled, as a reply after its request.
            pause(runtime).await;
            pause(runtime).await;
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
struct Reads<'r, R> {
    runtime: &'r R,
    deadline: Instant,
    socket: Pin<Box<dyn Socket>>,
    armed: Option<Arc<Wakes>>,
    any_armed: bool,
}

impl<R: Runtime> Reads<'_, R> {
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
    /// U2: only that waker's wakes count).
    async fn wake_of_armed(&mut self, what: &str) -> io::Result<()> {
        match self.armed.take() {
            Some(wakes) if !woken(self.runtime, self.deadline, &wakes).await => Err(broken(
                "an armed read",
                &format!("its waker was not woken by {what}"),
            )),
            _ => Ok(()),
        }
    }

    /// Reads with `poll_read_armed` until the read is ready, looking every [`STEP`], each poll
    /// with a waker of its own: a wake registered by an earlier `Pending` poll never counts
    /// for the read that returned (review28 U2).
    async fn read(&mut self, step: &str) -> io::Result<(usize, bool, Read)> {
        while self.runtime.now() < self.deadline {
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
            pause(self.runtime).await;
        }
        Err(timed_out(step))
    }
}

/// The bytes a read returned and its waker's wakes.
struct Read {
    buf: [u8; READ],
    wakes: Arc<Wakes>,
}

/// [`AsyncTimer`]'s contract (review26 S5, review28 U10, house rule 8): neither
/// [`AsyncTimer::reset`] to an instant ahead of the clock nor [`AsyncTimer::poll`] wakes a
/// waker before it returns, nor, for a runtime that does not spawn ([`Runtime::spawns`]), a
/// reset to an instant already past; a timer is never `Ready` before its instant, and it fires.
///
/// A timer set an hour ahead is polled (`Pending`), reset to 50 ms ahead, polled until it is
/// `Ready` after a wake of its waker (an early wake is harmless, house rule 8: it is polled
/// again), then set an hour ahead again, polled, and reset to an instant already past, where it
/// must be `Ready` at once. Each poll is given a waker of its own, which it must not wake; each
/// reset must leave the last poll's waker unwoken, but for the reset to the past on a runtime
/// that spawns (tokio's timer wakes it).
///
/// The whole check ends within 10 s on the runtime's clock, each wait for a wake within 1 s,
/// its waits paced by the runtime's timers, so it runs on the runtime's executor.
///
/// # Errors
///
/// A broken contract as [`ErrorKind::Other`], saying which step and rule; a check that did not
/// end within its bound as [`ErrorKind::TimedOut`].
pub async fn check_timer<R: Runtime>(runtime: &R) -> io::Result<()> {
    let deadline = runtime.now().saturating_add(BOUND);
    let ahead = |by| runtime.now().saturating_add(by);
    let mut timer = runtime.new_timer(ahead(HOUR));
    let step = "a poll an hour ahead";
    let (poll, last) = poll_timer(&mut timer, step)?;
    expect_timer(poll.is_pending(), step, "Ready an hour early")?;

    let step = "a reset to 50 ms ahead";
    let soon = ahead(SOON);
    calling(|| timer.as_mut().reset(soon));
    unwoken(&last, step, "woke the last poll's waker before returning")?;
    let step = "a timer 50 ms ahead";
    // Each look takes a wake of the last poll's waker (or fails the check): bounded by the
    // deadline, one WAIT at most per wait.
    loop {
        let (poll, wakes) = poll_timer(&mut timer, step)?;
        if poll.is_ready() {
            expect_timer(runtime.now() >= soon, step, "Ready before its instant")?;
            break;
        }
        if !woken(runtime, deadline, &wakes).await {
            return Err(if runtime.now() < deadline {
                timer_failed(
                    ErrorKind::Other,
                    step,
                    "its waker was not woken when it fired",
                )
            } else {
                timer_failed(ErrorKind::TimedOut, step, "")
            });
        }
    }

    let step = "a poll an hour ahead, after firing";
    calling(|| timer.as_mut().reset(ahead(HOUR)));
    let (poll, last) = poll_timer(&mut timer, step)?;
    expect_timer(poll.is_pending(), step, "Ready an hour early")?;
    let step = "a reset to a past instant";
    let past = runtime.now().saturating_sub(SOON);
    calling(|| timer.as_mut().reset(past));
    if !runtime.spawns() {
        unwoken(
            &last,
            step,
            "woke the last poll's waker before returning, on a runtime that does not spawn",
        )?;
    }
    let (poll, _) = poll_timer(&mut timer, step)?;
    expect_timer(poll.is_ready(), step, "not Ready at once")
}

/// How far ahead [`check_timer`] sets a timer that must not fire during the check.
const HOUR: Duration = Duration::from_secs(3600);

/// How far ahead [`check_timer`] sets the timer it waits for.
const SOON: Duration = Duration::from_millis(50);

/// One poll of `timer` with a waker of its own, which the poll must not have woken.
fn poll_timer(
    timer: &mut Pin<Box<dyn AsyncTimer>>,
    step: &str,
) -> io::Result<(Poll<()>, Arc<Wakes>)> {
    let wakes = Wakes::new();
    let waker = Waker::from(wakes.clone());
    let poll = calling(|| timer.as_mut().poll(&mut Context::from_waker(&waker)));
    unwoken(&wakes, step, "the poll woke its waker before returning")?;
    Ok((poll, wakes))
}

/// Fails `step` if `wakes` counts a wake made by a [`calling`] call before it returned.
fn unwoken(wakes: &Wakes, step: &str, why: &str) -> io::Result<()> {
    expect_timer(wakes.within.load(Ordering::SeqCst) == 0, step, why)
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

/// Counts its wakes.
#[derive(Default)]
struct Wakes {
    all: AtomicUsize,
    /// Those made within a [`calling`] call, before it returned.
    within: AtomicUsize,
}

impl Wakes {
    fn new() -> Arc<Wakes> {
        Arc::default()
    }

    fn count(&self) -> usize {
        self.all.load(Ordering::SeqCst)
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
    }
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

/// One [`STEP`] on the runtime's own timer (its reactor runs meanwhile).
async fn pause<R: Runtime>(runtime: &R) {
    let mut timer = runtime.new_timer(runtime.now().saturating_add(STEP));
    poll_fn(|cx| timer.as_mut().poll(cx)).await;
}

/// `future`'s output, or a [`ErrorKind::TimedOut`] error naming `step` at `deadline`.
async fn within<R: Runtime, T>(
    runtime: &R,
    deadline: Instant,
    step: &str,
    future: impl Future<Output = T>,
) -> io::Result<T> {
    let mut future = core::pin::pin!(future);
    let mut timer = runtime.new_timer(deadline);
    poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        timer.as_mut().poll(cx).map(|()| Err(timed_out(step)))
    })
    .await
}

/// The listener's one connection, looked for every [`STEP`] until `deadline`.
async fn accept<R: Runtime>(
    runtime: &R,
    deadline: Instant,
    listener: &TcpListener,
) -> io::Result<TcpStream> {
    while runtime.now() < deadline {
        match listener.accept() {
            Ok((peer, _)) => {
                // Some systems pass the listener's O_NONBLOCK on: the peer's writes block.
                peer.set_nonblocking(false)
                    .map_err(|e| failed(e.kind(), "accept", &e.to_string()))?;
                return Ok(peer);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => pause(runtime).await,
            Err(e) => return Err(failed(e.kind(), "accept", &e.to_string())),
        }
    }
    Err(timed_out("accept"))
}

/// Whether `wakes` counts a wake within [`WAIT`] (review28 U4: a runtime that never wakes
/// fails in about that), and by `deadline`.
async fn woken<R: Runtime>(runtime: &R, deadline: Instant, wakes: &Wakes) -> bool {
    let until = deadline.min(runtime.now().saturating_add(WAIT));
    // At most WAIT / STEP looks, each a STEP on the runtime's timer.
    while runtime.now() < until {
        if wakes.count() > 0 {
            return true;
        }
        pause(runtime).await;
    }
    wakes.count() > 0
}
