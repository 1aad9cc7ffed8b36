//! # retry-tokio
//!
//! retry-core's engine on tokio. [`TokioRuntime`] gives retry-driver tokio's clock
//! (`tokio::time::Instant`, so paused-time tests see virtual time), tokio timers, `tokio::spawn`
//! on the runtime current at connect, and tokio's TCP (with its resolver). The driving loop and
//! the client live in `retry-driver`; [`Client`] is its client on this runtime.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use retry_tokio::bson::doc;
//! use retry_tokio::retry_core::retry::OperationKind;
//! use retry_tokio::Client;
//!
//! // An option or value `ClientOptions::parse` would drop with a warning is an error here.
//! let client = Client::with_uri("mongodb://127.0.0.1:27017/?retryReads=true&timeoutMS=5000")?;
//! let reply = client
//!     .run_command("test", doc! { "ping": 1 }, OperationKind::RunCommand)
//!     .await?;
//! assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
//! client.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! An application needs only this crate: it re-exports the [`retry_core`] and [`bson`] it was
//! built with, and the types of the client's API (review32 R12):
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use retry_tokio::bson::doc;
//! use retry_tokio::{
//!     Client, ClientOptions, Cursor, Nameservers, Runtime, ServerApi, ServerApiVersion, Session,
//!     TokioRuntime,
//! };
//!
//! // The lenient path: what the URI-options spec ignores with a warning is kept to be logged.
//! let mut options = ClientOptions::parse("mongodb://127.0.0.1:27017/?appName=example")?;
//! for warning in &options.warnings {
//!     eprintln!("{warning}");
//! }
//! options.server_api = Some(ServerApi::new(ServerApiVersion::V1));
//! let runtime = TokioRuntime::start()?.with_nameservers(Nameservers::System);
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
//! use retry_tokio::{ClientOptions, ConnectionString, Host, HostKind, OptionValue, SrvPolling};
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
//! `Client::connect` must be called inside a tokio runtime (it spawns the driver there); outside
//! one it returns [`ConnectError::Runtime`]. The client is bound to that runtime: once it has
//! shut down, the client's operations fail (see [`Client`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::io;

use hickory_resolver::net::runtime::TokioRuntimeProvider;
use retry_core::time::Instant;
use retry_driver::{
    lookup_ip, lookup_srv, lookup_txt, timer_deadline, AsyncTimer, BoxFuture, Socket, SrvRecord,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

// Review32 R12: what this crate's API and docs/adapters.md use, so that an application needs
// only this crate (and gets the `retry_core` and `bson` it was built with).
pub use bson;
pub use retry_core;
pub use retry_driver::{
    ClientOptions, CommandOptions, ConnectError, ConnectionString, Events, Host, HostKind,
    Nameservers, OptionValue, OptionsError, Reply, Runtime, ServerApi, ServerApiVersion,
    SrvPolling, TimedEvent, TlsError, TlsOptions,
};

/// A client driven on tokio.
///
/// A client is bound to the tokio runtime current at its connect ([`Runtime::start`]): its
/// driver is a task spawned there, and its sockets, timers and DNS lookups are that runtime's,
/// whichever task or thread runs the operation that opens them (review34 Y2). Use it from any
/// runtime, or from a thread with none, while that one runs and is driven (a current-thread
/// runtime makes progress, and fires deadlines, only inside its `block_on`, review36 V5); once
/// that runtime has shut down, every operation (and
/// [`Client::start_session`](retry_driver::Client::start_session)) fails at once with a usage
/// error, "the runtime this client was created on has shut down: ...", never a panic or a
/// hang, and [`Client::shutdown`](retry_driver::Client::shutdown) returns (review32 R5). So a client kept in a `static` and used from `#[tokio::test]`s, each with a
/// runtime of its own, works only while the test that created it runs: create a client per
/// runtime instead.
pub type Client = retry_driver::Client<TokioRuntime>;

/// An explicit session of a [`Client`] ([`Client::start_session`](retry_driver::Client::start_session)).
pub type Session = retry_driver::Session<TokioRuntime>;

/// A cursor of a [`Client`] ([`Client::cursor`](retry_driver::Client::cursor)).
pub type Cursor = retry_driver::Cursor<TokioRuntime>;

/// tokio as a [`Runtime`]: the current runtime's handle, the clock's origin and where SRV and
/// TXT queries go.
#[derive(Debug)]
pub struct TokioRuntime {
    handle: tokio::runtime::Handle,
    origin: tokio::time::Instant,
    nameservers: Nameservers,
}

impl TokioRuntime {
    /// `future`, each poll of it inside the client's runtime (review34 Y2): a connect or a DNS
    /// lookup is polled by whoever runs the driver's pass, the caller's task for an inline pass
    /// (on another runtime, or on a thread with none), and tokio registers sockets and spawns
    /// the resolver's tasks on the runtime current at the poll. Entering the handle costs a
    /// thread-local write per poll of a connect or a lookup, never one of an operation.
    fn on_handle<T: Send + 'static>(
        &self,
        future: impl Future<Output = T> + Send + 'static,
    ) -> BoxFuture<T> {
        Box::pin(OnHandle {
            handle: self.handle.clone(),
            future: Box::pin(future),
        })
    }

    /// This runtime, with its DNS queries (SRV and TXT records, and host names) sent to
    /// `nameservers` through hickory, instead of the system's ([`Runtime::start`]'s default).
    pub fn with_nameservers(mut self, nameservers: Nameservers) -> TokioRuntime {
        self.nameservers = nameservers;
        self
    }
}

impl Runtime for TokioRuntime {
    fn start() -> io::Result<TokioRuntime> {
        let handle = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        Ok(TokioRuntime {
            handle,
            origin: tokio::time::Instant::now(),
            nameservers: Nameservers::System,
        })
    }

    fn now(&self) -> Instant {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.origin);
        Instant::ZERO.saturating_add(elapsed)
    }

    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        // The client's runtime's timer, whichever thread asks (review34 Y2).
        let _entered = self.handle.enter();
        Box::pin(Timer {
            sleep: Box::pin(tokio::time::sleep_until(timer_deadline(self.origin, at))),
            origin: self.origin,
        })
    }

    fn spawn(&self, future: BoxFuture<()>) -> io::Result<()> {
        self.handle.spawn(future);
        Ok(())
    }

    /// SRV-2: hickory's resolver on tokio, configured from the system (`/etc/resolv.conf`) unless
    /// [`TokioRuntime::with_nameservers`] says otherwise.
    fn resolve_srv(&self, name: String) -> BoxFuture<io::Result<Vec<SrvRecord>>> {
        let nameservers = self.nameservers.clone();
        self.on_handle(async move {
            lookup_srv(TokioRuntimeProvider::default(), &nameservers, &name).await
        })
    }

    /// SRV-5: each TXT record's strings, in order.
    fn resolve_txt(&self, name: String) -> BoxFuture<io::Result<Vec<Vec<String>>>> {
        let nameservers = self.nameservers.clone();
        self.on_handle(async move {
            lookup_txt(TokioRuntimeProvider::default(), &nameservers, &name).await
        })
    }

    /// tokio's own name resolution (the system's), or hickory's when
    /// [`TokioRuntime::with_nameservers`] named the name servers. Run under the client's
    /// runtime (each poll enters it, review34 Y2): the socket is that runtime's.
    fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
        let nameservers = self.nameservers.clone();
        self.on_handle(async move {
            let stream = match nameservers {
                Nameservers::Fixed(_) if host.parse::<std::net::IpAddr>().is_err() => {
                    let ips =
                        lookup_ip(TokioRuntimeProvider::default(), &nameservers, &host).await?;
                    let addresses: Vec<std::net::SocketAddr> = ips
                        .into_iter()
                        .map(|ip| std::net::SocketAddr::new(ip, port))
                        .collect();
                    TcpStream::connect(addresses.as_slice()).await?
                }
                _ => TcpStream::connect((host.as_str(), port)).await?,
            };
            stream.set_nodelay(true)?;
            Ok(Box::pin(Stream(stream)) as Pin<Box<dyn Socket>>)
        })
    }
}

/// A future polled inside a runtime ([`TokioRuntime::on_handle`]).
struct OnHandle<F> {
    handle: tokio::runtime::Handle,
    future: Pin<Box<F>>,
}

impl<F: Future> Future for OnHandle<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let _entered = this.handle.enter();
        this.future.as_mut().poll(cx)
    }
}

#[derive(Debug)]
struct Timer {
    sleep: Pin<Box<Sleep>>,
    origin: tokio::time::Instant,
}

impl AsyncTimer for Timer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        let deadline = timer_deadline(self.origin, at);
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

    /// A read shorter than `buf` drained the socket, and tokio cleared its read readiness:
    /// its waker is registered at once (`poll_read_ready`, which is what the read that would
    /// return `Pending` next does), so the driver need not read again to register it (issue 9).
    fn poll_read_armed(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<(usize, bool)>> {
        let len = buf.len();
        let n = match self.as_mut().poll_read(cx, buf) {
            Poll::Ready(Ok(n)) => n,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        };
        let armed = n > 0 && n < len && self.0.poll_read_ready(cx).is_pending();
        Poll::Ready(Ok((n, armed)))
    }

    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
}
