//! Checks of a [`Runtime`] against the contract the driver relies on, for the authors of
//! adapters: run them from the adapter's tests, on its own executor.

use core::future::poll_fn;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::io::{self, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Wake;

use crate::runtime::{Runtime, Socket};

/// The pause between two looks at a socket or a waker's count.
const STEP: Duration = Duration::from_millis(5);

/// Looks at most (10 s in all, house rule 12).
const STEPS: u32 = 2_000;

/// [`Socket::poll_read_armed`] on a 127.0.0.1 pair (review25 R4, house rule 8): an armed read
/// says a wake is certain to come when bytes arrive, and the driver does not read again until it
/// comes, so a wrong `true` hangs the socket. Checks that a short read is armed and the peer's
/// next bytes wake the waker it was polled with, and that a read filling the buffer and the end
/// of the stream are not armed. Every wait is bounded (10 s); the runtime's timers pace the
/// looks, so this runs on the runtime's executor.
///
/// # Errors
///
/// A failed setup (listen, connect, accept, the peer's writes) as it came; a broken contract as
/// an error of kind [`io::ErrorKind::Other`] that says which.
pub async fn check_read_armed<R: Runtime>(runtime: &R) -> io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let mut socket = runtime.connect("127.0.0.1".to_owned(), port).await?;
    let (mut peer, _) = listener.accept()?;
    let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());
    let mut buf = [0u8; 64];

    peer.write_all(&[1; 10])?;
    expect(
        read_armed(runtime, &mut socket, &waker, &mut buf).await?,
        (10, true),
        "a short read",
    )?;
    let before = wakes.0.load(Ordering::SeqCst);
    peer.write_all(&[2; 100])?;
    if !woken_after(runtime, &wakes, before).await {
        return Err(broken(
            "an armed read's waker was not woken by the next bytes",
        ));
    }
    let full = read_armed(runtime, &mut socket, &waker, &mut buf).await?;
    expect(full, (64, false), "a read that fills the buffer")?;
    let rest = read_armed(runtime, &mut socket, &waker, &mut buf).await?;
    expect(rest, (36, true), "the short read of the rest")?;
    drop(peer);
    let end = read_armed(runtime, &mut socket, &waker, &mut buf).await?;
    expect(end, (0, false), "the end of the stream")
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

fn broken(what: &str) -> io::Error {
    io::Error::other(format!("Socket::poll_read_armed: {what}"))
}

fn expect(got: (usize, bool), want: (usize, bool), what: &str) -> io::Result<()> {
    if got == want {
        return Ok(());
    }
    Err(broken(&format!(
        "{what}: (bytes, armed) was {got:?}, not {want:?}"
    )))
}

/// One [`STEP`] on the runtime's own timer (its reactor runs meanwhile).
async fn pause<R: Runtime>(runtime: &R) {
    let mut timer = runtime.new_timer(runtime.now().saturating_add(STEP));
    poll_fn(|cx| timer.as_mut().poll(cx)).await;
}

/// Reads with `poll_read_armed` and `waker` until the read is ready.
async fn read_armed<R: Runtime>(
    runtime: &R,
    socket: &mut Pin<Box<dyn Socket>>,
    waker: &Waker,
    buf: &mut [u8],
) -> io::Result<(usize, bool)> {
    for _ in 0..STEPS {
        let read = socket
            .as_mut()
            .poll_read_armed(&mut Context::from_waker(waker), buf);
        if let Poll::Ready(read) = read {
            return read;
        }
        pause(runtime).await;
    }
    Err(broken(&format!(
        "no read was ready within {:?}",
        STEP * STEPS
    )))
}

/// Whether `wakes` counts more than `before` within the bound.
async fn woken_after<R: Runtime>(runtime: &R, wakes: &Wakes, before: usize) -> bool {
    for _ in 0..STEPS {
        if wakes.0.load(Ordering::SeqCst) > before {
            return true;
        }
        pause(runtime).await;
    }
    false
}
