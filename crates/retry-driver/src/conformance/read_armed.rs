//! [`check_read_armed`]: a [`Socket`]'s armed reads on a 127.0.0.1 pair, each checked against
//! the contract of [`Socket::poll_read_armed`] (review25 R4, review28 U1–U4, review30 W2).

use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::io::{self, ErrorKind, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time;

use super::pacing::{no_thread, pause, within, woken, Pacer, Wakes};
use super::{failed, timed_out, BOUND, LOOKS, STEP, WAIT};
use crate::runtime::{Runtime, Socket};

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
///
/// [`thread::Builder::spawn`]: std::thread::Builder::spawn
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
