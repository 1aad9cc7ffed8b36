//! hickory-resolver on async-io, for `mongodb+srv` (SRV-2, SRV-5) and host names.
//!
//! Why hickory: it is the well-kept Rust resolver (system configuration, UDP with TCP fallback,
//! retries over several name servers), it is generic over its runtime, and retry-driver already
//! reads its answers for every adapter. Its async-std flavour (`async-std-resolver`) sits on the
//! discontinued async-std, so [`Provider`] gives it async-io's UDP and TCP sockets and timers
//! directly.
//!
//! hickory runs each name-server connection as a background task. This runtime has no executor
//! (see the crate docs), so [`Provider`]'s spawn queues those tasks and [`drive`] polls them
//! together with the lookup, on the caller's executor; they end with the lookup's resolver.

use core::future::{poll_fn, Future};
use core::pin::{pin, Pin};
use core::task::{ready, Context, Poll};
use core::time::Duration;
use std::io;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::{Arc, Mutex, PoisonError};

use async_io::{Async, Timer};
use futures_lite::{AsyncRead, AsyncWrite};
use hickory_resolver::net::runtime::{DnsTcpStream, DnsUdpSocket, RuntimeProvider, Spawn, Time};
use retry_driver::BoxFuture;

/// How long a TCP connection to a name server may take when hickory sets no limit.
const DNS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// async-io's sockets and timers for hickory, with spawned tasks queued for [`drive`].
#[derive(Clone, Default)]
pub(crate) struct Provider {
    spawned: Spawned,
}

/// The background tasks hickory spawned and [`drive`] has not taken yet.
#[derive(Clone, Default)]
pub(crate) struct Spawned(Arc<Mutex<Vec<BoxFuture<()>>>>);

impl Spawned {
    fn take(&self) -> Vec<BoxFuture<()>> {
        core::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Spawn for Spawned {
    fn spawn_bg(&mut self, future: impl Future<Output = ()> + Send + 'static) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::pin(future));
    }
}

impl RuntimeProvider for Provider {
    type Handle = Spawned;
    type Timer = IoTime;
    type Udp = Udp;
    type Tcp = Tcp;

    fn create_handle(&self) -> Spawned {
        self.spawned.clone()
    }

    fn connect_tcp(
        &self,
        server_addr: SocketAddr,
        bind_addr: Option<SocketAddr>,
        timeout: Option<Duration>,
    ) -> Pin<Box<dyn Send + Future<Output = io::Result<Tcp>>>> {
        Box::pin(async move {
            if let Some(bind_addr) = bind_addr {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("binding DNS connections to {bind_addr} is not supported"),
                ));
            }
            let connect = Async::<TcpStream>::connect(server_addr);
            let stream = IoTime::timeout(timeout.unwrap_or(DNS_CONNECT_TIMEOUT), connect).await??;
            stream.get_ref().set_nodelay(true)?;
            Ok(Tcp(stream))
        })
    }

    fn bind_udp(
        &self,
        local_addr: SocketAddr,
        _server_addr: SocketAddr,
    ) -> Pin<Box<dyn Send + Future<Output = io::Result<Udp>>>> {
        Box::pin(async move { Async::<UdpSocket>::bind(local_addr).map(Udp) })
    }
}

/// Runs `lookup` (made with `provider`) and the tasks it spawns, in this one future.
pub(crate) async fn drive<T>(provider: &Provider, lookup: impl Future<Output = T>) -> T {
    let mut lookup = pin!(lookup);
    let mut running: Vec<BoxFuture<()>> = Vec::new();
    poll_fn(|cx| {
        if let Poll::Ready(output) = lookup.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        // A task polled for the first time may spawn another; each is polled once registered.
        loop {
            let spawned = provider.spawned.take();
            let more = !spawned.is_empty();
            running.extend(spawned);
            running.retain_mut(|task| task.as_mut().poll(cx).is_pending());
            if !more {
                return Poll::Pending;
            }
        }
    })
    .await
}

/// async-io timers for hickory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IoTime;

#[async_trait::async_trait]
impl Time for IoTime {
    async fn delay_for(duration: Duration) {
        Timer::after(duration).await;
    }

    async fn timeout<F: 'static + Future + Send>(
        duration: Duration,
        future: F,
    ) -> Result<F::Output, io::Error> {
        futures_lite::future::or(async { Ok(future.await) }, async {
            Timer::after(duration).await;
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "DNS query timed out",
            ))
        })
        .await
    }
}

/// A UDP socket on async-io's reactor.
pub(crate) struct Udp(Async<UdpSocket>);

impl DnsUdpSocket for Udp {
    type Time = IoTime;

    fn poll_recv_from(
        &self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<(usize, SocketAddr)>> {
        loop {
            match self.0.get_ref().recv_from(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.0.poll_readable(cx))?;
                }
                result => return Poll::Ready(result),
            }
        }
    }

    fn poll_send_to(
        &self,
        cx: &mut Context<'_>,
        buf: &[u8],
        target: SocketAddr,
    ) -> Poll<io::Result<usize>> {
        loop {
            match self.0.get_ref().send_to(buf, target) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.0.poll_writable(cx))?;
                }
                result => return Poll::Ready(result),
            }
        }
    }
}

/// A TCP connection to a name server on async-io's reactor.
pub(crate) struct Tcp(Async<TcpStream>);

impl DnsTcpStream for Tcp {
    type Time = IoTime;
}

impl AsyncRead for Tcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_close(cx)
    }
}
