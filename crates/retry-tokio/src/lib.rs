//! # retry-tokio
//!
//! retry-core's engine on tokio. [`TokioRuntime`] gives retry-driver tokio's clock
//! (`tokio::time::Instant`, so paused-time tests see virtual time), tokio timers, `tokio::spawn`
//! on the runtime current at connect, and tokio's TCP (with its resolver). The driving loop and
//! the client live in `retry-driver`; [`Client`] is its client on this runtime.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use retry_core::retry::OperationKind;
//! use retry_tokio::Client;
//!
//! let client = Client::with_uri("mongodb://127.0.0.1:27017/?retryReads=true&timeoutMS=5000")?;
//! let reply = client
//!     .run_command("test", bson::doc! { "ping": 1 }, OperationKind::RunCommand)
//!     .await?;
//! assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
//! client.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! `Client::connect` must be called inside a tokio runtime (it spawns the driver there); outside
//! one it returns [`ConnectError::Runtime`].

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::io;

use hickory_resolver::proto::rr::RData;
use hickory_resolver::TokioResolver;
use retry_core::time::Instant;
use retry_driver::{AsyncTimer, BoxFuture, Runtime, Socket, SrvRecord};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

pub use retry_driver::{
    ClientOptions, CommandOptions, ConnectError, Events, OptionsError, Reply, TimedEvent,
};

/// A client driven on tokio.
pub type Client = retry_driver::Client<TokioRuntime>;

/// tokio as a [`Runtime`]: the current runtime's handle and the clock's origin.
#[derive(Debug)]
pub struct TokioRuntime {
    handle: tokio::runtime::Handle,
    origin: tokio::time::Instant,
}

/// `at` on this runtime's clock.
fn deadline(origin: tokio::time::Instant, at: Instant) -> tokio::time::Instant {
    origin + retry_driver::timer_offset(at)
}

impl Runtime for TokioRuntime {
    fn start() -> io::Result<TokioRuntime> {
        let handle = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        Ok(TokioRuntime {
            handle,
            origin: tokio::time::Instant::now(),
        })
    }

    fn now(&self) -> Instant {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.origin);
        Instant::ZERO.saturating_add(elapsed)
    }

    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        Box::pin(Timer {
            sleep: Box::pin(tokio::time::sleep_until(deadline(self.origin, at))),
            origin: self.origin,
        })
    }

    fn spawn(&self, future: BoxFuture<()>) -> io::Result<()> {
        self.handle.spawn(future);
        Ok(())
    }

    /// SRV-2: hickory's resolver on tokio, configured from the system (`/etc/resolv.conf`).
    fn resolve_srv(&self, name: String) -> BoxFuture<io::Result<Vec<SrvRecord>>> {
        Box::pin(async move {
            let lookup = resolver()?
                .srv_lookup(name.as_str())
                .await
                .map_err(dns_error)?;
            Ok(lookup
                .answers()
                .iter()
                .filter_map(|record| match &record.data {
                    RData::SRV(srv) => Some(SrvRecord {
                        target: srv.target.to_ascii(),
                        port: srv.port,
                    }),
                    _ => None,
                })
                .collect())
        })
    }

    /// SRV-5: each TXT record's strings, in order.
    fn resolve_txt(&self, name: String) -> BoxFuture<io::Result<Vec<Vec<String>>>> {
        Box::pin(async move {
            let lookup = resolver()?
                .txt_lookup(name.as_str())
                .await
                .map_err(dns_error)?;
            Ok(lookup
                .answers()
                .iter()
                .filter_map(|record| match &record.data {
                    RData::TXT(txt) => Some(
                        txt.txt_data
                            .iter()
                            .map(|s| String::from_utf8_lossy(s).into_owned())
                            .collect(),
                    ),
                    _ => None,
                })
                .collect())
        })
    }

    fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
        Box::pin(async move {
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            Ok(Box::pin(Stream(stream)) as Pin<Box<dyn Socket>>)
        })
    }
}

fn resolver() -> io::Result<TokioResolver> {
    TokioResolver::builder_tokio()
        .and_then(|builder| builder.build())
        .map_err(io::Error::other)
}

/// A failed lookup; a name without records of the type is `NotFound`.
fn dns_error(error: hickory_resolver::net::NetError) -> io::Error {
    if error.is_no_records_found() {
        io::Error::new(io::ErrorKind::NotFound, error.to_string())
    } else {
        io::Error::other(error.to_string())
    }
}

#[derive(Debug)]
struct Timer {
    sleep: Pin<Box<Sleep>>,
    origin: tokio::time::Instant,
}

impl AsyncTimer for Timer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        let deadline = deadline(self.origin, at);
        self.sleep.as_mut().reset(deadline);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.sleep.as_mut().poll(cx)
    }
}

struct Stream(TcpStream);

impl Socket for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let mut buf = ReadBuf::new(buf);
        match Pin::new(&mut self.0).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(buf.filled().len())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
}
