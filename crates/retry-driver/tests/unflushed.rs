//! The driver takes the engine's output (`flush_engine`) only when an input was handed over
//! since it last did (its `unflushed` flag, issue 9). Every input path must set that flag: one
//! that forgot would leave the engine's answer to it (an operation's end, an event, a socket to
//! open) untaken until some unrelated input came, and a caller would wait for nothing (house
//! rule 8: every operation ends exactly once, bounded by its deadline).
//!
//! Each test hands the driver one kind of input (a timer firing, a cancelled operation, a
//! session ending, a socket connecting, a socket's bytes) on a runtime whose clock moves only when the
//! test says and whose driver runs only inside the client's futures (`spawns() == false`), and
//! requires the engine's answer after one poll. Before the input the answer is not there, so the
//! poll that delivers it is the one that handled the input. Each test fails when its path's
//! flag is left out of `Driver::poll` / `take_requests` / `poll_sockets` (checked by removing
//! each in turn). Not covered here: an SRV rescan's answer (it needs a `mongodb+srv` client and
//! a resolver; it shares the timer's line in `Driver::poll`) and a new operation (its start
//! alone gives no output before a server is known; `take_requests` flags it unconditionally).
//!
//! The last test runs the same client on a runtime that spawns the driver and polls its task
//! once inside `spawn`: the first pass, and its flush of `TopologyOpening`, happen before
//! `connect` returns (review17 finding 4).

mod support;

use core::future::Future;
use core::pin::{pin, Pin};
use core::task::{Context, Poll, Waker};
use std::io;
use std::sync::{Arc, Mutex};

use bson::doc;
use retry_core::engine::EngineEvent;
use retry_core::error::ErrorKind;
use retry_core::monitor::HeartbeatEvent;
use retry_core::time::Instant;
use retry_core::topology::SdamEvent;
use retry_core::wire::{MsgFlags, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES, HEADER_LEN};
use retry_driver::{AsyncTimer, BoxFuture, Client, ClientOptions, Events, Runtime, Socket};
use support::clock::Clock;

/// How a [`TestRuntime`]'s connects end.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Connects {
    /// Never.
    #[default]
    Hang,
    /// At once, with a [`Wire`] socket (the test plays the server).
    Open,
}

/// The server's side of a [`WireSocket`]: what the client wrote, what it will read.
#[derive(Debug, Default)]
struct Wire {
    written: Vec<u8>,
    to_read: Vec<u8>,
    reader: Option<Waker>,
}

impl Wire {
    /// Queues `reply` for the client and wakes its read, as a runtime's reactor would.
    fn reply(&mut self, reply: &OpMsg) {
        reply
            .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut self.to_read)
            .unwrap();
        if let Some(waker) = self.reader.take() {
            waker.wake();
        }
    }
}

struct WireSocket(Arc<Mutex<Wire>>);

impl Socket for WireSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let mut wire = self.0.lock().unwrap();
        if wire.to_read.is_empty() {
            wire.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = buf.len().min(wire.to_read.len());
        buf[..n].copy_from_slice(&wire.to_read[..n]);
        wire.to_read.drain(..n);
        Poll::Ready(Ok(n))
    }

    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.lock().unwrap().written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
}

/// A runtime without an executor (the client's futures drive the engine) on a [`Clock`]; its
/// connects end as `connects` says (one [`Wire`] for all its sockets).
#[derive(Debug, Default)]
struct TestRuntime {
    clock: Arc<Clock>,
    connects: Connects,
    wire: Arc<Mutex<Wire>>,
}

impl Runtime for TestRuntime {
    fn start() -> io::Result<TestRuntime> {
        Ok(TestRuntime::default())
    }

    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        self.clock.timer(at)
    }

    fn spawns(&self) -> bool {
        false
    }

    fn connect(&self, _: String, _: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
        match self.connects {
            Connects::Hang => Box::pin(core::future::pending()),
            Connects::Open => {
                let socket: Pin<Box<dyn Socket>> = Box::pin(WireSocket(self.wire.clone()));
                Box::pin(async move { Ok(socket) })
            }
        }
    }
}

fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// A client on 127.0.0.1 (one server, no RTT monitor's second socket) whose server selection
/// gives up after 100 ms, with its clock and its sockets' wire.
fn client(connects: Connects) -> (Client<TestRuntime>, Arc<Clock>, Arc<Mutex<Wire>>) {
    let runtime = TestRuntime {
        connects,
        ..TestRuntime::default()
    };
    let (clock, wire) = (runtime.clock.clone(), runtime.wire.clone());
    let options = ClientOptions::parse(
        "mongodb://127.0.0.1:27017/?serverSelectionTimeoutMS=100&serverMonitoringMode=poll",
    )
    .unwrap();
    (Client::connect_on(runtime, options).unwrap(), clock, wire)
}

/// The events one poll of `events` delivers (the poll runs the driver), then those queued.
fn delivered(events: &mut Events) -> Vec<EngineEvent> {
    let mut taken = Vec::new();
    if let Poll::Ready(Some((_, event))) = poll_once(pin!(events.next_event())) {
        taken.push(event);
    }
    taken.extend(events.drain().into_iter().map(|(_, event)| event));
    taken
}

fn finished(events: &[EngineEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, EngineEvent::OperationFinished { .. }))
        .count()
}

/// SS-8 (the selection timeout), issue 9 `unflushed`: the poll in which the engine's timer
/// fires also delivers what the timeout did, the operation's server selection error.
#[test]
fn a_timer_firing_is_flushed_in_the_same_poll() {
    let (client, clock, _) = client(Connects::Hang);
    let mut ping = pin!(client.command("admin", doc! { "ping": 1 }));
    assert!(poll_once(ping.as_mut()).is_pending(), "no server yet");
    clock.advance_to(50);
    assert!(poll_once(ping.as_mut()).is_pending(), "before the timeout");
    clock.advance_to(200);
    match poll_once(ping.as_mut()) {
        Poll::Ready(Err(error)) => {
            assert!(
                matches!(error.kind, ErrorKind::ServerSelection { .. }),
                "{error:?}"
            )
        }
        other => panic!("the selection timeout, delivered at once: {other:?}"),
    }
}

/// House rule 8 (an operation ends exactly once), issue 9 `unflushed`: a dropped operation's
/// cancellation is handed to the engine, and its end is delivered by the same poll.
#[test]
fn a_cancelled_operation_is_flushed_in_the_same_poll() {
    let (client, _, _) = client(Connects::Hang);
    let mut events = client.events();
    {
        let mut ping = pin!(client.command("admin", doc! { "ping": 1 }));
        assert!(
            poll_once(ping.as_mut()).is_pending(),
            "started, no server yet"
        );
    }
    // Dropped before it finished: cancelled (nothing else happens in between).
    let taken = delivered(&mut events);
    assert_eq!(
        finished(&taken),
        1,
        "the cancelled operation ended: {taken:?}"
    );
}

/// TX-2 / SE-12 (ending a session aborts its transaction first), issue 9 `unflushed`: the
/// `abortTransaction` a dropped session hands over is answered by the engine at once (no
/// transaction is in progress, so nothing is sent), and that end is delivered by the same poll.
#[test]
fn a_session_request_is_flushed_in_the_same_poll() {
    let (client, _, _) = client(Connects::Hang);
    let mut events = client.events();
    let session = match poll_once(pin!(client.start_session())) {
        Poll::Ready(session) => session.unwrap(),
        Poll::Pending => panic!("a session starts without a server"),
    };
    let before = delivered(&mut events);
    assert_eq!(finished(&before), 0, "{before:?}");
    drop(session);
    let taken = delivered(&mut events);
    assert_eq!(finished(&taken), 1, "the session's abort ended: {taken:?}");
}

/// HS-1 (the handshake is the connection's first message), issue 9 `unflushed`: a socket's
/// connect handed to the engine is answered (the hello written) in the same poll; the hello's
/// reply read in a later poll is answered (the monitor's heartbeat) in that poll.
#[test]
fn a_socket_connect_and_read_are_flushed_in_the_same_poll() {
    let (client, _, wire) = client(Connects::Open);
    let mut events = client.events();
    let taken = delivered(&mut events);
    let request_id = {
        let wire = wire.lock().unwrap();
        assert!(
            wire.written.len() > HEADER_LEN,
            "the monitor's hello was written: {taken:?}"
        );
        i32::from_le_bytes(wire.written[4..8].try_into().unwrap())
    };
    assert!(
        !taken.iter().any(|e| matches!(
            e,
            EngineEvent::Heartbeat {
                event: HeartbeatEvent::Succeeded { .. },
                ..
            }
        )),
        "no reply yet: {taken:?}"
    );
    wire.lock().unwrap().reply(&OpMsg {
        request_id: 1,
        response_to: request_id,
        flags: MsgFlags::NONE,
        body: doc! {
            "isWritablePrimary": true,
            "maxWireVersion": 25,
            "minWireVersion": 0,
            "maxBsonObjectSize": 16_777_216,
            "maxMessageSizeBytes": 48_000_000,
            "maxWriteBatchSize": 100_000,
            "ok": 1,
        },
        sequences: Vec::new(),
    });
    let taken = delivered(&mut events);
    assert!(
        taken.iter().any(|e| matches!(
            e,
            EngineEvent::Heartbeat {
                event: HeartbeatEvent::Succeeded { .. },
                ..
            }
        )),
        "the hello's reply was handled and answered: {taken:?}"
    );
}

/// A [`TestRuntime`] that gives the driver a task of its own and polls it once inside `spawn`,
/// as an executor with an idle thread may run it before `spawn` returns; the task is then kept,
/// never woken (its connects hang).
#[derive(Default)]
struct PollingSpawn {
    runtime: TestRuntime,
    tasks: Mutex<Vec<BoxFuture<()>>>,
}

impl core::fmt::Debug for PollingSpawn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PollingSpawn").finish_non_exhaustive()
    }
}

impl Runtime for PollingSpawn {
    fn start() -> io::Result<PollingSpawn> {
        Ok(PollingSpawn::default())
    }

    fn now(&self) -> Instant {
        self.runtime.now()
    }

    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        self.runtime.new_timer(at)
    }

    fn spawn(&self, mut task: BoxFuture<()>) -> io::Result<()> {
        assert!(poll_once(task.as_mut()).is_pending(), "the driver runs on");
        self.tasks.lock().unwrap().push(task);
        Ok(())
    }

    fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
        self.runtime.connect(host, port)
    }
}

/// SDAM monitoring (`TopologyOpening` first, as in LB-4's order), house rule 10 (review17
/// finding 4): with the driver's first pass run inside `connect`, deterministically, a stream
/// from `events()` after `connect` misses `TopologyOpening` (the race `connect_with_events`
/// exists for), and the stream of `connect_with_events`, subscribed before the driver is
/// spawned, starts with it.
#[test]
fn connect_with_events_keeps_the_topology_opening_of_a_first_pass_run_inside_connect() {
    let options = || ClientOptions::parse("mongodb://127.0.0.1:27017/").unwrap();
    let topology = |events: &mut Events| -> Vec<SdamEvent> {
        let taken = events.drain().into_iter().map(|(_, event)| event);
        taken
            .filter_map(|event| match event {
                EngineEvent::Topology(event) => Some(event),
                _ => None,
            })
            .collect()
    };
    let late = Client::<PollingSpawn>::connect(options()).unwrap();
    let missed = topology(&mut late.events());
    assert!(
        !missed.contains(&SdamEvent::TopologyOpening),
        "the first pass ran before events(): {missed:?}"
    );
    let (_client, mut events) = Client::<PollingSpawn>::connect_with_events(options()).unwrap();
    let seen = topology(&mut events);
    assert_eq!(seen.first(), Some(&SdamEvent::TopologyOpening), "{seen:?}");
}
