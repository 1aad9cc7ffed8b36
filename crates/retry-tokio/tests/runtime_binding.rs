//! Review34 Y2: a client's sockets are its runtime's, whoever runs the pass that opens them. An
//! operation alone in flight runs a pass of the driver in the caller's task (the inline pass),
//! which polls the pooled connection's connect; before, tokio registered that socket with the
//! caller's runtime (lost when it ends) and, on a thread with no runtime, panicked ("there is no
//! reactor running").

use core::future::Future;
use core::pin::pin;
use core::task::{Context, Poll, Waker};
use std::sync::Arc;
use std::task::Wake;
use std::time::{Duration, Instant};

use retry_core::engine::EngineEvent;
use retry_core::monitor::HeartbeatEvent;
use retry_core::pool::{CloseReason, PoolEvent};
use retry_core::retry::OperationKind;
use retry_scenarios::Server;
use retry_testkit::Role;
use retry_tokio::{Client, Events};

const LIMIT: Duration = Duration::from_secs(10);

fn ping(
    client: &Client,
) -> impl Future<Output = Result<bson::Document, retry_core::error::OperationError>> + '_ {
    client.run_command("admin", bson::doc! { "ping": 1 }, OperationKind::RunCommand)
}

/// Runtime A, which stays alive: a multi-thread runtime with one worker, where the client's
/// driver runs.
fn runtime_a() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A server and a client of it created on `a`, with its event stream, once its monitor has
/// found the server (so the next operation opens the pooled connection in its own pass).
fn client_on(a: &tokio::runtime::Runtime) -> (Server, Client, Events) {
    a.block_on(async {
        let server = Server::with_role(Role::Standalone).await;
        let uri = format!("mongodb://{}/?timeoutMS=5000", server.address);
        let client = Client::with_uri(&uri).expect("a client");
        let mut events = client.events();
        tokio::time::timeout(LIMIT, async {
            loop {
                let event = events.next_event().await.expect("events go on");
                if let EngineEvent::Heartbeat {
                    event: HeartbeatEvent::Succeeded { .. },
                    ..
                } = event.1
                {
                    break;
                }
            }
        })
        .await
        .expect("the server is found");
        (server, client, events)
    })
}

/// On `a`: a ping succeeds on the one pooled connection, opened by the operation before, and
/// no connection was closed but by the client's shutdown and no pool cleared (a connection
/// registered with a runtime that ended fails its I/O, which clears the pool).
fn still_usable_on(a: &tokio::runtime::Runtime, client: &Client, mut events: Events) {
    a.block_on(async {
        let reply = tokio::time::timeout(LIMIT, ping(client))
            .await
            .expect("no hang");
        assert!(reply.is_ok(), "{reply:?}");
        tokio::time::timeout(LIMIT, client.shutdown())
            .await
            .expect("shutdown returns");
        let mut created = 0;
        while let Some((_, event)) = events.next_event().await {
            let EngineEvent::Pool { event, .. } = event else {
                continue;
            };
            match event {
                PoolEvent::ConnectionCreated { .. } => created += 1,
                PoolEvent::PoolCleared { .. } => panic!("{event:?}"),
                PoolEvent::ConnectionClosed { reason, .. } => {
                    assert_eq!(reason, CloseReason::PoolClosed, "{event:?}")
                }
                _ => {}
            }
        }
        assert_eq!(created, 1, "one pooled connection, for both pings");
    });
}

/// Review34 Y2 (the mirror of review32 R5): a client created on A, its first pooled connection
/// opened by an operation alone in flight on runtime B; B ends; the connection still works on
/// A. Fails (the ping on A gets a network error and the pool is cleared) if the socket is B's.
#[test]
fn review34_y2_a_connection_opened_from_another_runtime_is_the_clients_runtimes() {
    let a = runtime_a();
    let (server, client, events) = client_on(&a);
    let b = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // A's worker is held while the operation starts, so that its pass (the one that opens the
    // pooled connection) runs in B's task, not in the driver's.
    let (held, holding) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    a.spawn(async move {
        held.send(()).expect("the test waits");
        let _ = released.recv_timeout(LIMIT);
    });
    holding.recv_timeout(LIMIT).expect("A's worker is held");
    let reply = b.block_on(async {
        let mut op = pin!(ping(&client));
        let first = core::future::poll_fn(|cx| Poll::Ready(op.as_mut().poll(cx))).await;
        assert!(first.is_pending(), "the reply comes later");
        release.send(()).expect("A's worker waits");
        tokio::time::timeout(LIMIT, op).await
    });
    assert!(reply.expect("no hang").is_ok());
    drop(b);
    still_usable_on(&a, &client, events);
    drop(server);
}

/// A waker that unparks the thread that blocks on the future.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` on this thread (no tokio runtime here) until it is ready, at most `LIMIT`.
fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    let end = Instant::now() + LIMIT;
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        let now = Instant::now();
        assert!(now < end, "no hang");
        std::thread::park_timeout(end - now);
    }
}

/// Review34 Y2 (c): the operation alone in flight from a thread without a tokio runtime (an
/// executor of its own) opens the pooled connection in its pass without a panic, on the
/// client's runtime. Fails ("there is no reactor running") if the connect runs under the
/// caller's context.
#[test]
fn review34_y2_an_operation_from_a_thread_without_a_runtime_does_not_panic() {
    let a = runtime_a();
    let (server, client, events) = client_on(&a);
    let reply = std::thread::scope(|scope| {
        scope
            .spawn(|| block_on(ping(&client)))
            .join()
            .expect("no panic")
    });
    assert!(reply.is_ok(), "{reply:?}");
    still_usable_on(&a, &client, events);
    drop(server);
}
