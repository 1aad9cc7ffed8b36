//! # retry-async-std
//!
//! retry-core's engine on [`async-io`](async_io), the reactor async-std sat on and smol sits on
//! (async-std itself is discontinued, RUSTSEC-2025-0052). [`AsyncIoRuntime`] gives retry-driver
//! `std::time::Instant` as its clock, `async_io::Timer`s and `Async<TcpStream>` sockets, and no spawn:
//! the client's own futures (operations, event streams, shutdown) drive the engine on the
//! caller's executor, whichever of them is polled, with no task or thread of its own and no
//! hand-off between threads. A [`Client`] works under any executor: `async_std::task::block_on`,
//! `smol::block_on`, or `futures_lite::future::block_on`. Server monitoring runs while one of
//! those futures is polled (an idle client catches up on its next operation).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use retry_core::retry::OperationKind;
//! use retry_async_std::Client;
//!
//! futures_lite::future::block_on(async {
//!     let client = Client::with_uri("mongodb://127.0.0.1:27017/?maxAdaptiveRetries=1")?;
//!     let reply = client
//!         .run_command("test", bson::doc! { "ping": 1 }, OperationKind::RunCommand)
//!         .await?;
//!     println!("{reply}");
//!     client.shutdown().await;
//!     Ok(())
//! })
//! # }
//! ```
//!
//! Hosts must be IP literals or `localhost`: async-io has no resolver, and a blocking lookup would
//! stall the driver.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::io;
use std::net::TcpStream;

use async_io::{Async, Timer};
use futures_lite::{AsyncRead, AsyncWrite};
use retry_core::time::Instant;
use retry_driver::{literal_address, AsyncTimer, BoxFuture, Runtime, Socket};

pub use retry_driver::{
    ClientOptions, CommandOptions, ConnectError, Events, OptionsError, Reply, TimedEvent,
};

/// A client driven by async-io.
pub type Client = retry_driver::Client<AsyncIoRuntime>;

/// async-io as a [`Runtime`]: the clock's origin.
#[derive(Debug)]
pub struct AsyncIoRuntime {
    origin: std::time::Instant,
}

/// `at` on this runtime's clock.
fn deadline(origin: std::time::Instant, at: Instant) -> std::time::Instant {
    origin + retry_driver::timer_offset(at)
}

impl Runtime for AsyncIoRuntime {
    fn start() -> io::Result<AsyncIoRuntime> {
        Ok(AsyncIoRuntime {
            origin: std::time::Instant::now(),
        })
    }

    fn now(&self) -> Instant {
        Instant::ZERO.saturating_add(self.origin.elapsed())
    }

    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        Box::pin(IoTimer {
            timer: Timer::at(deadline(self.origin, at)),
            origin: self.origin,
        })
    }

    /// async-io has no executor: the client's futures drive the engine on the caller's (no task,
    /// no thread, no hand-off).
    fn spawns(&self) -> bool {
        false
    }

    fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
        Box::pin(async move {
            let stream = Async::<TcpStream>::connect(literal_address(&host, port)?).await?;
            stream.get_ref().set_nodelay(true)?;
            Ok(Box::pin(Stream(stream)) as Pin<Box<dyn Socket>>)
        })
    }
}

#[derive(Debug)]
struct IoTimer {
    timer: Timer,
    origin: std::time::Instant,
}

impl AsyncTimer for IoTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        let deadline = deadline(self.origin, at);
        self.timer.set_at(deadline);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.timer).poll(cx).map(drop)
    }
}

struct Stream(Async<TcpStream>);

impl Socket for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }

    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
}
