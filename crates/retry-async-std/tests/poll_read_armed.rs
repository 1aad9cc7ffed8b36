//! Review25 R4 (house rule 8): `Socket::poll_read_armed` on async-io, on a 127.0.0.1 pair. An
//! `armed` read says a wake is certain to come when bytes arrive, and the driver then does not
//! read again until it comes: a wrong `true` would hang the socket. So: a short read is armed and
//! the peer's next bytes wake the waker it was polled with; a read that fills the buffer, and the
//! end of the stream, are not armed. Every wait is bounded ([`STEPS`] × [`STEP`], house rule 12).

use std::io::Write;
use std::net::TcpListener;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use retry_async_std::AsyncIoRuntime;
use retry_driver::{Runtime, Socket};

/// The pause between two looks at the socket or the waker's count.
const STEP: Duration = Duration::from_millis(5);

/// Looks at most (10 s in all).
const STEPS: usize = 2_000;

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

/// Reads with `poll_read_armed` and `waker` until the read is ready (the reactor runs between two
/// polls, in the sleeps).
async fn read_armed(
    socket: &mut Pin<Box<dyn Socket>>,
    waker: &Waker,
    buf: &mut [u8],
) -> (usize, bool) {
    for _ in 0..STEPS {
        if let Poll::Ready(read) = socket
            .as_mut()
            .poll_read_armed(&mut Context::from_waker(waker), buf)
        {
            return read.expect("the read");
        }
        async_io::Timer::after(STEP).await;
    }
    panic!("no read ready within {:?}", STEP * STEPS as u32);
}

/// Whether `wakes` counts more than `before` within the bound.
async fn woken_after(wakes: &Wakes, before: usize) -> bool {
    for _ in 0..STEPS {
        if wakes.0.load(Ordering::SeqCst) > before {
            return true;
        }
        async_io::Timer::after(STEP).await;
    }
    false
}

#[test]
fn review25_r4_short_reads_are_armed_full_reads_and_the_end_are_not() {
    async_io::block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
        let port = listener.local_addr().expect("its address").port();
        let runtime = AsyncIoRuntime::start().expect("the runtime");
        let mut socket = runtime
            .connect("127.0.0.1".to_owned(), port)
            .await
            .expect("connected");
        let (mut peer, _) = listener.accept().expect("accepted");
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut buf = [0u8; 64];

        // A short read drained the socket: armed, and the peer's next bytes wake its waker.
        peer.write_all(&[1; 10]).expect("written");
        assert_eq!(read_armed(&mut socket, &waker, &mut buf).await, (10, true));
        let before = wakes.0.load(Ordering::SeqCst);
        peer.write_all(&[2; 100]).expect("written");
        assert!(
            woken_after(&wakes, before).await,
            "an armed read's waker is woken by the next bytes"
        );

        // The next read fills the buffer: more may be there, so it is not armed.
        assert_eq!(read_armed(&mut socket, &waker, &mut buf).await, (64, false));
        assert_eq!(read_armed(&mut socket, &waker, &mut buf).await, (36, true));

        // The end of the stream: nothing more will come, no wake either.
        drop(peer);
        assert_eq!(read_armed(&mut socket, &waker, &mut buf).await, (0, false));
    });
}
