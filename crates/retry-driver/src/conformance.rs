//! A check of a [`Runtime`]'s sockets against the contract the driver relies on, for the authors
//! of adapters: run it from the adapter's tests, on the adapter's own executor.

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

use crate::runtime::{Runtime, Socket};

/// The pause between two looks at a socket, a listener or a waker's count.
const STEP: Duration = Duration::from_millis(5);

/// How long the whole check may take (house rule 12), on the runtime's clock.
const BOUND: Duration = Duration::from_secs(10);

/// [`Socket::poll_read_armed`] on a 127.0.0.1 pair (review25 R4, house rule 8). A runtime need
/// not arm reads (the default method never does), but an armed read says a wake is certain to
/// come when bytes arrive, and the driver does not read again until it comes: a wrong `true`
/// hangs the socket. Checks that a short read that says it is armed has its waker woken by the
/// peer's next bytes, and that a read filling the buffer and the end of the stream are not
/// armed. Returns whether the runtime armed the short reads (`true` for retry-tokio's and
/// retry-async-std's sockets, whose tests require it).
///
/// The whole check ends within 10 s on the runtime's clock, its waits paced by the runtime's
/// timers, so it runs on the runtime's executor (the listener is polled, never blocked on).
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
    let mut socket = within(runtime, deadline, "connect", connect)
        .await?
        .map_err(step("connect"))?;
    let mut peer = accept(runtime, deadline, &listener).await?;
    let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());

    peer.write_all(&[1; 10]).map_err(step("write 10 bytes"))?;
    let (n, armed) = read_armed(runtime, deadline, &mut socket, &waker, "a short read").await?;
    expect(
        n == 10,
        "a short read",
        &format!("returned {n} bytes, not 10"),
    )?;
    let before = wakes.0.load(Ordering::SeqCst);
    peer.write_all(&[2; 100]).map_err(step("write 100 bytes"))?;
    if armed && !woken_after(runtime, deadline, &wakes, before).await {
        return Err(broken(
            "an armed read",
            "its waker was not woken by the next bytes",
        ));
    }
    let full = read_armed(
        runtime,
        deadline,
        &mut socket,
        &waker,
        "a read that fills the buffer",
    )
    .await?;
    expect(
        full == (64, false),
        "a read that fills the buffer",
        &format!("(bytes, armed) was {full:?}, not (64, false)"),
    )?;
    let (rest, rest_armed) = read_armed(
        runtime,
        deadline,
        &mut socket,
        &waker,
        "the short read of the rest",
    )
    .await?;
    expect(
        rest == 36,
        "the short read of the rest",
        &format!("returned {rest} bytes, not 36"),
    )?;
    expect(
        rest_armed == armed,
        "the short read of the rest",
        "armed differently from the first short read",
    )?;
    drop(peer);
    let end = read_armed(
        runtime,
        deadline,
        &mut socket,
        &waker,
        "the end of the stream",
    )
    .await?;
    expect(
        end == (0, false),
        "the end of the stream",
        &format!("(bytes, armed) was {end:?}, not (0, false)"),
    )?;
    Ok(armed)
}

/// Counts its wakes.
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn failed(kind: ErrorKind, step: &str, why: &str) -> io::Error {
    io::Error::new(kind, format!("check_read_armed: {step}: {why}"))
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

/// Reads with `poll_read_armed` and `waker` until the read is ready, looking every [`STEP`].
async fn read_armed<R: Runtime>(
    runtime: &R,
    deadline: Instant,
    socket: &mut Pin<Box<dyn Socket>>,
    waker: &Waker,
    step: &str,
) -> io::Result<(usize, bool)> {
    let mut buf = [0u8; 64];
    while runtime.now() < deadline {
        let read = socket
            .as_mut()
            .poll_read_armed(&mut Context::from_waker(waker), &mut buf);
        if let Poll::Ready(read) = read {
            return read.map_err(|e| failed(e.kind(), step, &e.to_string()));
        }
        pause(runtime).await;
    }
    Err(timed_out(step))
}

/// Whether `wakes` counts more than `before` by `deadline`.
async fn woken_after<R: Runtime>(
    runtime: &R,
    deadline: Instant,
    wakes: &Wakes,
    before: usize,
) -> bool {
    while runtime.now() < deadline {
        if wakes.0.load(Ordering::SeqCst) > before {
            return true;
        }
        pause(runtime).await;
    }
    false
}
