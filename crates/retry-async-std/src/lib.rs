//! # retry-async-std
//!
//! retry-core's engine on [`async-io`](async_io), the reactor async-std sat on and smol sits on
//! (async-std itself is discontinued, RUSTSEC-2025-0052). [`AsyncIoRuntime`] gives retry-driver
//! `std::time::Instant` as its clock, timers (a timerfd on Linux) and `Async<TcpStream>` sockets, and no spawn:
//! the client's own futures (operations, event streams, shutdown) drive the engine on the
//! caller's executor, whichever of them is polled, with no task or thread of its own and no
//! hand-off between threads. A [`Client`] works under any executor: `async_std::task::block_on`,
//! `smol::block_on`, or `futures_lite::future::block_on`. Server monitoring runs while one of
//! those futures is polled (an idle client catches up on its next operation).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use retry_async_std::bson::doc;
//! use retry_async_std::retry_core::retry::OperationKind;
//! use retry_async_std::Client;
//!
//! futures_lite::future::block_on(async {
//!     // An option or value `ClientOptions::parse` would drop with a warning is an error here.
//!     let client = Client::with_uri("mongodb://127.0.0.1:27017/?maxAdaptiveRetries=1")?;
//!     let reply = client
//!         .run_command("test", doc! { "ping": 1 }, OperationKind::RunCommand)
//!         .await?;
//!     println!("{reply}");
//!     client.shutdown().await;
//!     Ok(())
//! })
//! # }
//! ```
//!
//! An application needs only this crate (and an executor): it re-exports the [`retry_core`]
//! and [`bson`] it was built with, and the types of the client's API (review32 R12):
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use retry_async_std::bson::doc;
//! use retry_async_std::{
//!     AsyncIoRuntime, Client, ClientOptions, Cursor, Nameservers, Runtime, ServerApi,
//!     ServerApiVersion, Session,
//! };
//!
//! // The lenient path: what the URI-options spec ignores with a warning is kept to be logged.
//! let mut options = ClientOptions::parse("mongodb://127.0.0.1:27017/?appName=example")?;
//! for warning in &options.warnings {
//!     eprintln!("{warning}");
//! }
//! options.server_api = Some(ServerApi::new(ServerApiVersion::V1));
//! let runtime = AsyncIoRuntime::start()?.with_nameservers(Nameservers::System);
//! let client = Client::connect_on(runtime, options)?;
//! let session: Session = client.start_session().await?;
//! session
//!     .command("test", doc! { "insert": "items", "documents": [{ "x": 1 }] })
//!     .await?;
//! let mut cursor: Cursor = client.cursor("test", doc! { "find": "items" }).await?;
//! while let Some(item) = cursor.next().await? {
//!     println!("{item}");
//! }
//! client.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! A parsed URI's parts, and `ClientOptions::srv`, have their types here too (review34 Y12):
//!
//! ```
//! use retry_async_std::{ClientOptions, ConnectionString, Host, HostKind, OptionValue, SrvPolling};
//!
//! let cs = ConnectionString::parse("mongodb://127.0.0.1:27017/?appName=example")?;
//! let first: &Host = &cs.hosts[0];
//! assert_eq!((first.kind, first.port), (HostKind::Ipv4, Some(27017)));
//! assert_eq!(cs.option("appName"), Some(&OptionValue::Str("example".into())));
//! let options = ClientOptions::from_connection_string(&cs)?;
//! let srv: Option<&SrvPolling> = options.srv.as_ref();
//! assert!(srv.is_none(), "not a mongodb+srv URI");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Host names, and the SRV and TXT records of `mongodb+srv` URIs ([`Client::with_uri_async`]),
//! are looked up with hickory-resolver on async-io's sockets (the `dns` module), never with a
//! blocking lookup that would stall the driver; the system's resolver configuration by default,
//! or the name servers of [`AsyncIoRuntime::with_nameservers`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use core::pin::Pin;
use core::task::{Context, Poll};
use std::io;
use std::io::Read;
use std::net::TcpStream;

use async_io::Async;
use futures_lite::AsyncWrite;
use retry_core::time::Instant;
use retry_driver::{
    literal_address, lookup_ip, lookup_srv, lookup_txt, timer_deadline, AsyncTimer, BoxFuture,
    Socket, SrvRecord,
};

mod dns;
mod timer;

use timer::IoTimer;

// Review32 R12: what this crate's API and docs/adapters.md use, so that an application needs
// only this crate (and gets the `retry_core` and `bson` it was built with).
pub use bson;
pub use retry_core;
pub use retry_driver::{
    ClientOptions, CommandOptions, ConnectError, ConnectionString, Events, Host, HostKind,
    Nameservers, OptionValue, OptionsError, Reply, Runtime, ServerApi, ServerApiVersion,
    SrvPolling, TimedEvent, TlsError, TlsOptions,
};

/// A client driven by async-io.
pub type Client = retry_driver::Client<AsyncIoRuntime>;

/// An explicit session of a [`Client`] ([`Client::start_session`](retry_driver::Client::start_session)).
pub type Session = retry_driver::Session<AsyncIoRuntime>;

/// A cursor of a [`Client`] ([`Client::cursor`](retry_driver::Client::cursor)).
pub type Cursor = retry_driver::Cursor<AsyncIoRuntime>;

/// async-io as a [`Runtime`]: the clock's origin and where DNS queries go.
#[derive(Debug)]
pub struct AsyncIoRuntime {
    origin: std::time::Instant,
    nameservers: Nameservers,
}

impl AsyncIoRuntime {
    /// This runtime, with its DNS queries (host names, SRV and TXT records) sent to
    /// `nameservers` instead of the system's ([`Runtime::start`]'s default).
    pub fn with_nameservers(mut self, nameservers: Nameservers) -> AsyncIoRuntime {
        self.nameservers = nameservers;
        self
    }
}

impl Runtime for AsyncIoRuntime {
    fn start() -> io::Result<AsyncIoRuntime> {
        Ok(AsyncIoRuntime {
            origin: std::time::Instant::now(),
            nameservers: Nameservers::System,
        })
    }

    fn now(&self) -> Instant {
        Instant::ZERO.saturating_add(self.origin.elapsed())
    }

    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        Box::pin(RuntimeTimer {
            timer: IoTimer::at(timer_deadline(self.origin, at)),
            origin: self.origin,
        })
    }

    /// async-io has no executor: the client's futures drive the engine on the caller's (no task,
    /// no thread, no hand-off).
    fn spawns(&self) -> bool {
        false
    }

    /// IP literals and `localhost` directly; other names through hickory, each address in turn.
    fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
        let nameservers = self.nameservers.clone();
        Box::pin(async move {
            let addresses = match literal_address(&host, port) {
                Ok(address) => vec![address],
                Err(_) => {
                    let provider = dns::Provider::default();
                    let lookup = lookup_ip(provider.clone(), &nameservers, &host);
                    dns::drive(&provider, lookup)
                        .await?
                        .into_iter()
                        .map(|ip| std::net::SocketAddr::new(ip, port))
                        .collect()
                }
            };
            let mut failure = None;
            for address in addresses {
                match Async::<TcpStream>::connect(address).await {
                    Ok(stream) => {
                        stream.get_ref().set_nodelay(true)?;
                        return Ok(Box::pin(Stream {
                            io: stream,
                            drained: false,
                        }) as Pin<Box<dyn Socket>>);
                    }
                    Err(e) => failure = Some(e),
                }
            }
            Err(failure.unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{host} has no addresses"))
            }))
        })
    }

    /// SRV-2: hickory on async-io.
    fn resolve_srv(&self, name: String) -> BoxFuture<io::Result<Vec<SrvRecord>>> {
        let nameservers = self.nameservers.clone();
        Box::pin(async move {
            let provider = dns::Provider::default();
            let lookup = lookup_srv(provider.clone(), &nameservers, &name);
            dns::drive(&provider, lookup).await
        })
    }

    /// SRV-5: hickory on async-io.
    fn resolve_txt(&self, name: String) -> BoxFuture<io::Result<Vec<Vec<String>>>> {
        let nameservers = self.nameservers.clone();
        Box::pin(async move {
            let provider = dns::Provider::default();
            let lookup = lookup_txt(provider.clone(), &nameservers, &name);
            dns::drive(&provider, lookup).await
        })
    }
}

/// A timer on the engine's clock ([`timer::IoTimer`]: a timerfd on Linux).
#[derive(Debug)]
struct RuntimeTimer {
    timer: IoTimer,
    origin: std::time::Instant,
}

impl AsyncTimer for RuntimeTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        let deadline = timer_deadline(self.origin, at);
        self.timer.set_at(deadline);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.timer.poll(cx)
    }
}

/// A TCP stream on async-io's reactor that does not read when it knows there is nothing to read:
/// `Async::poll_read` always tries the read first (a `recv` that fails with `EAGAIN` after every
/// reply, and another right after each request is written), so this one reads only after a
/// readiness event once a read came back short or empty.
struct Stream {
    io: Async<TcpStream>,
    /// The last read emptied the socket's receive buffer (it returned less than asked, or would
    /// block): wait for readiness before reading again.
    drained: bool,
}

impl Socket for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        // At most: a stale readiness, a read that would block, the registration.
        loop {
            if self.drained {
                match self.io.poll_readable(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(())) => self.drained = false,
                }
            }
            match self.io.get_ref().read(buf) {
                Ok(n) => {
                    self.drained = n < buf.len();
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.drained = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// A read that drained the socket registers for its readiness at once (`poll_readable`,
    /// which is what the read that would return `Pending` next does), so the driver need not
    /// read again to register (issue 9). Readiness already there (bytes came meanwhile) is kept
    /// for the next read, which then reads at once.
    fn poll_read_armed(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<(usize, bool)>> {
        let n = match self.as_mut().poll_read(cx, buf) {
            Poll::Ready(Ok(n)) => n,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        };
        let mut armed = false;
        if n > 0 && self.drained {
            match self.io.poll_readable(cx) {
                Poll::Pending => armed = true,
                Poll::Ready(Ok(())) => self.drained = false,
                Poll::Ready(Err(_)) => {}
            }
        }
        Poll::Ready(Ok((n, armed)))
    }

    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
}
