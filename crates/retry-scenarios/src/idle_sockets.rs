//! The driver polls only the sockets that have something to do (house rule 9: cost follows the
//! work): many idle pooled connections do not make one operation cost more polls.

use core::pin::Pin;
use core::task::{Context, Poll};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bson::doc;
use retry_core::retry::OperationKind;
use retry_core::time::Instant;
use retry_driver::{AsyncTimer, BoxFuture, Client, Runtime, Socket, SrvRecord};
use retry_testkit::Role;

use crate::{bounded, options, yield_now, Server, SCENARIO_LIMIT};

/// Idle pooled connections kept open (minPoolSize) while the measured operations run.
const IDLE: u32 = 24;
/// Operations measured, one after another.
const MEASURED: usize = 50;

/// `R` with every socket's reads and writes counted.
#[derive(Debug)]
struct Counting<R> {
    inner: R,
    polls: Arc<AtomicUsize>,
    opened: Arc<AtomicUsize>,
}

struct CountedSocket {
    inner: Pin<Box<dyn Socket>>,
    polls: Arc<AtomicUsize>,
}

impl Socket for CountedSocket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll_read(cx, buf)
    }

    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll_write(cx, buf)
    }
}

impl<R: Runtime> Runtime for Counting<R> {
    fn start() -> io::Result<Self> {
        Ok(Counting {
            inner: R::start()?,
            polls: Arc::default(),
            opened: Arc::default(),
        })
    }

    fn now(&self) -> Instant {
        self.inner.now()
    }

    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        self.inner.new_timer(at)
    }

    fn spawns(&self) -> bool {
        self.inner.spawns()
    }

    fn spawn(&self, future: BoxFuture<()>) -> io::Result<()> {
        self.inner.spawn(future)
    }

    fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
        let connecting = self.inner.connect(host, port);
        let (polls, opened) = (self.polls.clone(), self.opened.clone());
        Box::pin(async move {
            let inner = connecting.await?;
            opened.fetch_add(1, Ordering::Relaxed);
            Ok(Box::pin(CountedSocket { inner, polls }) as Pin<Box<dyn Socket>>)
        })
    }

    fn resolve_srv(&self, name: String) -> BoxFuture<io::Result<Vec<SrvRecord>>> {
        self.inner.resolve_srv(name)
    }

    fn resolve_txt(&self, name: String) -> BoxFuture<io::Result<Vec<Vec<String>>>> {
        self.inner.resolve_txt(name)
    }
}

/// With `IDLE` idle pooled connections open, one operation at a time polls a few sockets, not
/// every socket: fewer socket polls per operation than there are idle sockets (a driver that
/// polled every socket each round would make at least one poll per socket per operation).
pub async fn idle_sockets_are_not_polled<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let mut client_options = options(&[&server]);
        client_options.pool.min_pool_size = IDLE;
        client_options.pool.max_pool_size = IDLE + 8;
        let runtime = Counting::<R>::start().expect("the runtime starts");
        let (polls, opened) = (runtime.polls.clone(), runtime.opened.clone());
        let client = Client::connect_on(runtime, client_options).expect("the client starts");
        let ping = || client.run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand);
        // minPoolSize fills the pool in the background (TO-2: background `minPoolSize`
        // connections); wait for it, bounded in steps.
        let mut filled = false;
        for _ in 0..10_000 {
            ping().await.expect("ping succeeds");
            if opened.load(Ordering::Relaxed) >= IDLE as usize {
                filled = true;
                break;
            }
            yield_now().await;
        }
        assert!(filled, "the pool never opened {IDLE} connections");
        // Let the last handshakes finish before counting.
        for _ in 0..20 {
            ping().await.expect("ping succeeds");
        }
        let before = polls.load(Ordering::Relaxed);
        for _ in 0..MEASURED {
            ping().await.expect("ping succeeds");
        }
        let per_operation = (polls.load(Ordering::Relaxed) - before) / MEASURED;
        assert!(
            per_operation < IDLE as usize / 2,
            "{per_operation} socket polls per operation with {IDLE} idle connections"
        );
        client.shutdown().await;
    })
    .await;
}
