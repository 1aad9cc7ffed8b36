//! Issue 9, one operation in flight on tokio: the caller runs the driver's passes itself (it
//! writes the request, and its claimed socket's wake brings it back to read the reply), and a
//! caller that stops polling delays nobody else (CS-4, house rule 8). Counts, not time.

use core::future::Future;
use core::pin::{pin, Pin};
use core::task::{Context, Poll, Waker};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use retry_core::engine::EngineEvent;
use retry_core::monitor::HeartbeatEvent;
use retry_core::retry::OperationKind;
use retry_core::time::Instant;
use retry_driver::{AsyncTimer, BoxFuture, Client, Runtime, Socket};
use retry_scenarios::{bounded, options, Server};
use retry_testkit::Role;
use retry_tokio::TokioRuntime;

const LIMIT: Duration = Duration::from_secs(60);

/// tokio, with the polls of the futures it spawns (the driver's task) counted.
#[derive(Debug)]
struct Counting {
    tokio: TokioRuntime,
    polls: Arc<AtomicUsize>,
}

struct CountPolls {
    future: BoxFuture<()>,
    polls: Arc<AtomicUsize>,
}

impl Future for CountPolls {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.future.as_mut().poll(cx)
    }
}

impl Runtime for Counting {
    fn start() -> io::Result<Counting> {
        Ok(Counting {
            tokio: TokioRuntime::start()?,
            polls: Arc::default(),
        })
    }
    fn now(&self) -> Instant {
        self.tokio.now()
    }
    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        self.tokio.new_timer(at)
    }
    fn spawn(&self, future: BoxFuture<()>) -> io::Result<()> {
        let polls = self.polls.clone();
        self.tokio.spawn(Box::pin(CountPolls { future, polls }))
    }
    fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
        self.tokio.connect(host, port)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

async fn ping<R: Runtime>(client: &Client<R>) {
    client
        .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
        .await
        .expect("ping");
}

/// Issue 9: with one operation in flight the reply is read by its caller (its claimed socket
/// woke it), not by a poll of the driver's task: far fewer task polls than round trips (before:
/// at least one per round trip, for the reply). A reply that wins the race with the claim
/// still goes to the task, so the bound leaves room for those.
#[test]
fn issue9_lone_round_trips_are_read_by_their_callers_not_the_driver_task() {
    runtime().block_on(bounded(LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let runtime = Counting::start().expect("tokio");
        let polls = runtime.polls.clone();
        let mut options = options(&[&server]);
        options.heartbeat_frequency = Duration::from_secs(60);
        let client = Client::connect_on(runtime, options).expect("a client");
        // Warm up: the monitor's checks and the pool's connection.
        for _ in 0..5 {
            ping(&client).await;
        }
        let before = polls.load(Ordering::Relaxed);
        let round_trips = 100;
        for _ in 0..round_trips {
            ping(&client).await;
        }
        let task_polls = polls.load(Ordering::Relaxed) - before;
        assert!(
            task_polls < round_trips / 2,
            "{task_polls} polls of the driver's task for {round_trips} lone round trips"
        );
        client.shutdown().await;
        server.stop().await;
    }));
}

/// CS-4, house rule 8, issue 9: a lone operation's caller claims its socket and then is never
/// polled again (a future kept in a `select` another branch won): its reply is still read, by a
/// pass of the driver's task (the monitor's next heartbeat runs one, and it ends the claim), not
/// by the caller's next poll; the heartbeat and a second operation complete meanwhile (nothing
/// waits on that caller), and the kept future, polled at last, finds its result waiting.
#[test]
fn cs4_a_claiming_caller_that_stops_polling_delays_nobody() {
    runtime().block_on(bounded(LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let runtime = Counting::start().expect("tokio");
        let polls = runtime.polls.clone();
        let client = Client::connect_on(runtime, options(&[&server])).expect("a client");
        ping(&client).await;
        let mut events = client.events();
        let kept = client.run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand);
        let mut kept = pin!(kept);
        // Its first poll starts it alone and claims its socket (unless the reply came at once).
        let first = kept.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        if first.is_ready() {
            // The reply came within that poll: nothing was claimed.
            client.shutdown().await;
            server.stop().await;
            return;
        }
        let task_polls = polls.load(Ordering::Relaxed);
        // Not polled again until the end. The only operation in flight is the kept one, so the
        // first `OperationFinished` is its own: read by a pass of the driver's task. The
        // monitor's next heartbeat (500 ms) runs one if nothing ran before.
        let (mut heartbeat, mut finished) = (false, false);
        for _ in 0..200 {
            match events.next_event().await {
                Some((
                    _,
                    EngineEvent::Heartbeat {
                        event: HeartbeatEvent::Succeeded { .. },
                        ..
                    },
                )) => heartbeat = true,
                Some((_, EngineEvent::OperationFinished { result, .. })) => {
                    result.expect("the kept ping's reply");
                    finished = true;
                }
                Some(_) => {}
                None => panic!("the event stream ended"),
            }
            if heartbeat && finished {
                break;
            }
        }
        assert!(
            heartbeat && finished,
            "within 200 events: heartbeat {heartbeat}, kept reply read {finished}"
        );
        assert!(
            polls.load(Ordering::Relaxed) > task_polls,
            "the driver's task read it"
        );
        ping(&client).await;
        // Its result waits in its slot: ready at the first poll, whatever that poll runs.
        let last = kept.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        let Poll::Ready(result) = last else {
            panic!("the kept ping's result was not waiting");
        };
        result.expect("the kept ping's reply");
        client.shutdown().await;
        server.stop().await;
    }));
}

/// CS-4, house rule 8, issue 9: a lone operation's future first polled with one waker (which its
/// socket's claim then holds) and from then on by another task gets its reply without waiting
/// for a heartbeat (60 s here): polled with another waker, it hands the socket back to the
/// driver's task.
#[test]
fn cs4_a_claimed_future_polled_by_another_task_gets_its_reply() {
    runtime().block_on(bounded(Duration::from_secs(20), async {
        let server = Server::with_role(Role::Standalone).await;
        let mut options = options(&[&server]);
        options.heartbeat_frequency = Duration::from_secs(60);
        let client = retry_tokio::Client::connect(options).expect("a client");
        ping(&client).await;
        for _ in 0..20 {
            let mut moved = Box::pin(client.run_command(
                "admin",
                doc! { "ping": 1 },
                OperationKind::RunCommand,
            ));
            let first = moved.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            if first.is_pending() {
                let result = core::future::poll_fn(|cx| moved.as_mut().poll(cx)).await;
                result.expect("the moved ping's reply");
            }
        }
        client.shutdown().await;
        server.stop().await;
    }));
}
