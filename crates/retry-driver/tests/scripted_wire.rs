//! The driver against a scripted server on a runtime whose clock moves only when the test says
//! and whose driver runs only inside the client's futures (`spawns() == false`): every step is
//! deterministic, the sockets are in-memory (no network), and each loop is bounded in polls.
//!
//! - WP-6, EV-4: a socket the engine closes writes out the bytes it was already handed first.
//!   The engine ends an unacknowledged (`w: 0`) write with `{ok: 1}` when it hands its bytes
//!   over, and closes its connection in the same call when the pool was cleared meanwhile
//!   (stale); the write must still reach the server. Bounded: a socket that takes nothing is
//!   dropped [`CLOSE_WRITE_LIMIT`] after the close, not later, not sooner.
//! - CS-7: a request started under its own CSOT timeout (a session's `defaultTimeoutMS` on its
//!   commit) reads its reply's MaxTimeMSExpired write errors as the timeout error, on a client
//!   without `timeoutMS`.

mod support;

use core::future::Future;
use core::pin::{pin, Pin};
use core::task::{Context, Poll, Waker};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bson::{doc, Document};
use retry_core::engine::EngineEvent;
use retry_core::error::ErrorKind;
use retry_core::pool::{CloseReason, PoolEvent};
use retry_core::time::Instant;
use retry_core::wire::{FrameDecoder, MsgFlags, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES};
use retry_driver::{
    AsyncTimer, BoxFuture, Client, ClientOptions, Events, Runtime, SessionOptions, Socket,
};
use support::clock::Clock;

/// The driver's bound on writing out a closed socket's bytes (`driver::CLOSE_WRITE_LIMIT`).
const CLOSE_WRITE_LIMIT: Duration = Duration::from_secs(1);

/// Polls of one future (each runs the driver once) before a test gives up.
const POLLS: usize = 200;

/// What the server answers to a command (its body), `hello` included.
type Answer = Arc<dyn Fn(&Document) -> Document + Send + Sync>;

/// The server's side of one socket.
struct Conn {
    decoder: FrameDecoder,
    /// The requests the client's bytes held, in order (what reached the server).
    requests: Vec<OpMsg>,
    /// Replies for the client, and those held back while `hold`.
    to_read: Vec<u8>,
    held: Vec<u8>,
    hold: bool,
    /// The next read (once `to_read` is empty) ends the stream.
    eof: bool,
    /// Writes are taken; otherwise they are `Pending` (the waker kept in `writer`).
    accept: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
    /// The client dropped (closed) the socket.
    dropped: bool,
    answer: Answer,
}

impl Conn {
    /// Decodes what the client wrote and answers each request that expects a reply.
    fn take(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let (used, message) = self.decoder.decode(bytes).expect("a well-formed request");
            bytes = &bytes[used..];
            let Some(request) = message else { break };
            if !request.flags.contains(MsgFlags::MORE_TO_COME) {
                let reply = OpMsg {
                    request_id: 0,
                    response_to: request.request_id,
                    flags: MsgFlags::NONE,
                    body: (self.answer)(&request.body),
                    sequences: Vec::new(),
                };
                let out = if self.hold {
                    &mut self.held
                } else {
                    &mut self.to_read
                };
                reply.encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, out).unwrap();
                if let Some(waker) = self.reader.take() {
                    waker.wake();
                }
            }
            self.requests.push(request);
        }
    }

    /// The names of the commands that reached the server, the handshake's (`isMaster` or
    /// `hello`) as `hello`.
    fn commands(&self) -> Vec<String> {
        self.requests
            .iter()
            .filter_map(|r| r.body.keys().next())
            .map(|name| match name.as_str() {
                "isMaster" | "ismaster" => String::from("hello"),
                _ => name.clone(),
            })
            .collect()
    }
}

struct ScriptedSocket(Arc<Mutex<Conn>>);

impl Socket for ScriptedSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let mut conn = lock(&self.0);
        if conn.to_read.is_empty() {
            if conn.eof {
                return Poll::Ready(Ok(0));
            }
            conn.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = buf.len().min(conn.to_read.len());
        buf[..n].copy_from_slice(&conn.to_read[..n]);
        conn.to_read.drain(..n);
        Poll::Ready(Ok(n))
    }

    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut conn = lock(&self.0);
        if !conn.accept {
            conn.writer = Some(cx.waker().clone());
            return Poll::Pending;
        }
        conn.take(buf);
        Poll::Ready(Ok(buf.len()))
    }
}

impl Drop for ScriptedSocket {
    fn drop(&mut self) {
        lock(&self.0).dropped = true;
    }
}

/// Locks `conn`; a failed assertion while it was held does not poison it (the client's
/// sockets are dropped while the test unwinds).
fn lock(conn: &Mutex<Conn>) -> MutexGuard<'_, Conn> {
    conn.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The server: its sockets in the order the client opened them. Those opened from the
/// `hold_from`-th on hold their replies back until released.
struct Server {
    conns: Mutex<Vec<Arc<Mutex<Conn>>>>,
    hold_from: Mutex<usize>,
    answer: Answer,
}

impl Server {
    fn conn(&self, i: usize) -> Arc<Mutex<Conn>> {
        self.conns.lock().unwrap()[i].clone()
    }

    fn opened(&self) -> usize {
        self.conns.lock().unwrap().len()
    }
}

/// Sends the replies `conn` held back, and answers at once from now on.
fn release(conn: &Mutex<Conn>) {
    let mut conn = lock(conn);
    conn.hold = false;
    let held = core::mem::take(&mut conn.held);
    conn.to_read.extend_from_slice(&held);
    if let Some(waker) = conn.reader.take() {
        waker.wake();
    }
}

/// Ends the stream of `conn`, as a server closing it does.
fn end(conn: &Mutex<Conn>) {
    let mut conn = lock(conn);
    conn.eof = true;
    if let Some(waker) = conn.reader.take() {
        waker.wake();
    }
}

/// Lets `conn` take writes again (its kernel buffer drained) and wakes the writer.
fn accept(conn: &Mutex<Conn>) {
    let mut conn = lock(conn);
    conn.accept = true;
    if let Some(waker) = conn.writer.take() {
        waker.wake();
    }
}

#[derive(Clone)]
struct ScriptedRuntime {
    clock: Arc<Clock>,
    server: Arc<Server>,
}

impl core::fmt::Debug for ScriptedRuntime {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ScriptedRuntime").finish_non_exhaustive()
    }
}

impl Runtime for ScriptedRuntime {
    fn start() -> io::Result<ScriptedRuntime> {
        Err(io::Error::other("made by the test"))
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
        let mut conns = self.server.conns.lock().unwrap();
        let conn = Arc::new(Mutex::new(Conn {
            decoder: FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES),
            requests: Vec::new(),
            to_read: Vec::new(),
            held: Vec::new(),
            hold: conns.len() >= *self.server.hold_from.lock().unwrap(),
            eof: false,
            accept: true,
            reader: None,
            writer: None,
            dropped: false,
            answer: self.server.answer.clone(),
        }));
        conns.push(conn.clone());
        let socket: Pin<Box<dyn Socket>> = Box::pin(ScriptedSocket(conn));
        Box::pin(async move { Ok(socket) })
    }
}

/// A client of `uri` (one server on 127.0.0.1, polled: one monitor socket, no RTT socket) on a
/// scripted server answering with `answer`, whose sockets from the `hold_from`-th on hold their
/// replies back.
fn client(
    uri: &str,
    hold_from: usize,
    answer: impl Fn(&Document) -> Document + Send + Sync + 'static,
) -> (Client<ScriptedRuntime>, Arc<Clock>, Arc<Server>) {
    let server = Arc::new(Server {
        conns: Mutex::new(Vec::new()),
        hold_from: Mutex::new(hold_from),
        answer: Arc::new(answer),
    });
    let runtime = ScriptedRuntime {
        clock: Arc::default(),
        server: server.clone(),
    };
    let clock = runtime.clock.clone();
    let options = ClientOptions::parse(uri).unwrap();
    (Client::connect_on(runtime, options).unwrap(), clock, server)
}

fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// Polls `future` until it is ready (each poll runs the driver), at most [`POLLS`] times.
fn ready<F: Future + ?Sized>(mut future: Pin<&mut F>) -> F::Output {
    for _ in 0..POLLS {
        if let Poll::Ready(output) = poll_once(future.as_mut()) {
            return output;
        }
    }
    panic!("not ready after {POLLS} polls");
}

/// Runs the driver once through `events` and returns the events it delivered since the last
/// call, with those queued.
fn run_driver(events: &mut Events) -> Vec<EngineEvent> {
    let mut taken = Vec::new();
    if let Poll::Ready(Some((_, event))) = poll_once(pin!(events.next_event())) {
        taken.push(event);
    }
    taken.extend(events.drain().into_iter().map(|(_, event)| event));
    taken
}

/// A standalone's `hello` reply, and `{ok: 1}` to anything else.
fn standalone(command: &Document) -> Document {
    match command.keys().next().map(String::as_str) {
        Some("hello" | "isMaster" | "ismaster") => doc! {
            "isWritablePrimary": true,
            "maxWireVersion": 25,
            "minWireVersion": 0,
            "maxBsonObjectSize": 16_777_216,
            "maxMessageSizeBytes": 48_000_000,
            "maxWriteBatchSize": 100_000,
            "ok": 1,
        },
        _ => doc! { "ok": 1 },
    }
}

const W0_URI: &str = "mongodb://127.0.0.1:27017/?w=0&serverSelectionTimeoutMS=100\
                      &serverMonitoringMode=poll&heartbeatFrequencyMS=500";

/// The w:0 insert the tests run.
fn insert() -> Document {
    doc! { "insert": "c", "documents": [{ "_id": 1 }] }
}

/// When the monitor's second check starts (`heartbeatFrequencyMS`), and the stale close with it.
const SECOND_CHECK_MS: u64 = 500;

/// Starts `insert` (w:0) on a client whose pool connection (its second socket) holds its
/// handshake reply, while the monitor's second check is in flight (its reply held); then, in one
/// pass of the driver, that connection's handshake completes (the insert is written on it) and,
/// after it, the monitor's socket ends under its check (the server's pool is cleared, SDAM): the
/// pass hands the insert's bytes over, the engine ends the insert with `{ok: 1}` and closes its
/// connection, stale. `writable` says whether that socket takes the bytes then. Returns the
/// insert's result, the events, the pool connection's server side and the client.
#[allow(clippy::type_complexity)]
fn w0_insert_then_stale_close(
    writable: bool,
) -> (
    Result<Document, retry_core::error::OperationError>,
    Vec<EngineEvent>,
    Arc<Mutex<Conn>>,
    Events,
    Client<ScriptedRuntime>,
    Arc<Clock>,
) {
    let (client, clock, server) = client(W0_URI, 1, standalone);
    let mut events = client.events();
    let mut seen = Vec::new();
    // The monitor's first check is answered; its second is held, in flight.
    for _ in 0..POLLS {
        seen.extend(run_driver(&mut events));
        let answered = server.opened() >= 1 && {
            let monitor = server.conn(0);
            let monitor = lock(&monitor);
            monitor.requests.len() == 1 && monitor.to_read.is_empty()
        };
        if answered {
            break;
        }
    }
    let monitor = server.conn(0);
    lock(&monitor).hold = true;
    clock.advance_to(SECOND_CHECK_MS);
    for _ in 0..POLLS {
        seen.extend(run_driver(&mut events));
        if lock(&monitor).requests.len() >= 2 {
            break;
        }
    }
    assert_eq!(lock(&monitor).commands(), ["hello", "hello"], "checks");
    let result = {
        let mut insert = pin!(client.command("test", insert()));
        for _ in 0..POLLS {
            assert!(
                poll_once(insert.as_mut()).is_pending(),
                "its handshake held"
            );
            if server.opened() >= 2 && !lock(&server.conn(1)).requests.is_empty() {
                break;
            }
        }
        let pooled = server.conn(1);
        assert_eq!(lock(&pooled).commands(), ["hello"], "its handshake");
        seen.extend(run_driver(&mut events));
        lock(&pooled).accept = writable;
        // Woken in this order, read in this order in one pass.
        release(&pooled);
        end(&monitor);
        ready(insert)
    };
    seen.extend(run_driver(&mut events));
    let pooled = server.conn(1);
    (result, seen, pooled, events, client, clock)
}

/// The scenario happened as meant: the pool was cleared, and the insert's connection closed
/// stale after the insert succeeded.
fn assert_closed_stale_after_the_insert(events: &[EngineEvent]) {
    let cleared = events.iter().position(|e| {
        matches!(
            e,
            EngineEvent::Pool {
                event: PoolEvent::PoolCleared { .. },
                ..
            }
        )
    });
    let finished = events
        .iter()
        .position(|e| matches!(e, EngineEvent::OperationFinished { .. }));
    let stale = events.iter().position(|e| {
        matches!(
            e,
            EngineEvent::Pool {
                event: PoolEvent::ConnectionClosed {
                    reason: CloseReason::Stale,
                    ..
                },
                ..
            }
        )
    });
    assert!(
        cleared.is_some() && finished.is_some() && stale.is_some() && cleared < finished,
        "cleared {cleared:?}, finished {finished:?}, closed stale {stale:?}: {events:#?}"
    );
}

/// WP-6, EV-4: the engine ends a w:0 insert with `{ok: 1}` as it hands the bytes over and
/// closes its connection (stale) in the same call; the socket writes the insert out before it
/// is closed, so the write the caller was told succeeded reaches the server.
#[test]
fn wp6_ev4_a_w0_insert_on_a_connection_the_engine_closes_at_the_hand_off_still_lands() {
    let (result, events, pooled, _events, _client, _clock) = w0_insert_then_stale_close(true);
    assert_eq!(result.expect("the w:0 insert"), doc! { "ok": 1 }, "EV-4");
    assert_closed_stale_after_the_insert(&events);
    let conn = lock(&pooled);
    assert_eq!(conn.commands(), ["hello", "insert"], "the insert landed");
    let insert = &conn.requests[1];
    assert!(insert.flags.contains(MsgFlags::MORE_TO_COME), "WP-6");
    assert_eq!(
        insert.body.get_document("writeConcern").ok(),
        Some(&doc! { "w": 0 })
    );
    assert!(conn.dropped, "closed once written");
}

/// WP-6, EV-4: a closed socket that cannot take the bytes at once keeps them (the driver goes
/// on meanwhile) and writes them when it becomes writable, then goes.
#[test]
fn wp6_ev4_a_closed_socket_writes_its_bytes_when_it_becomes_writable() {
    let (result, events, pooled, mut events_stream, _client, _clock) =
        w0_insert_then_stale_close(false);
    assert_eq!(result.expect("the w:0 insert"), doc! { "ok": 1 });
    assert_closed_stale_after_the_insert(&events);
    {
        let conn = lock(&pooled);
        assert_eq!(conn.commands(), ["hello"], "nothing taken yet");
        assert!(!conn.dropped, "kept to write the insert");
    }
    accept(&pooled);
    run_driver(&mut events_stream);
    let conn = lock(&pooled);
    assert_eq!(conn.commands(), ["hello", "insert"], "the insert landed");
    assert!(conn.dropped, "closed once written");
}

/// WP-6, EV-4, bounded: a closed socket that takes nothing is dropped `CLOSE_WRITE_LIMIT` after
/// the close (virtual time), not before; the driver never waits for it in between.
#[test]
fn wp6_ev4_a_closed_socket_that_takes_nothing_is_dropped_at_the_limit() {
    let (result, _, pooled, mut events, _client, clock) = w0_insert_then_stale_close(false);
    assert_eq!(result.expect("the w:0 insert"), doc! { "ok": 1 });
    // Closed with the monitor's failed check.
    let limit = SECOND_CHECK_MS + u64::try_from(CLOSE_WRITE_LIMIT.as_millis()).unwrap();
    clock.advance_to(limit - 1);
    run_driver(&mut events);
    assert!(!lock(&pooled).dropped, "before the limit");
    clock.advance_to(limit);
    run_driver(&mut events);
    let conn = lock(&pooled);
    assert!(conn.dropped, "at the limit");
    assert_eq!(conn.commands(), ["hello"], "it never took the insert");
}

/// WP-6, EV-4 at shutdown: a w:0 insert ended as its bytes were handed over, to a socket that
/// could not take them yet; the client's shutdown closes that socket, and waits for the bytes
/// to go out (bounded) before it ends.
#[test]
fn wp6_ev4_shutdown_writes_out_a_w0_insert_handed_over_before_it() {
    let (client, _clock, server) = client(W0_URI, usize::MAX, standalone);
    // The pool's connection, ready for the insert.
    let ping = ready(pin!(client.command("admin", doc! { "ping": 1 })));
    assert_eq!(ping.expect("the ping"), doc! { "ok": 1 });
    let pooled = server.conn(server.opened() - 1);
    assert_eq!(lock(&pooled).commands(), ["hello", "ping"]);
    lock(&pooled).accept = false;
    let inserted = ready(pin!(client.command("test", insert())));
    assert_eq!(inserted.expect("the w:0 insert"), doc! { "ok": 1 });
    let mut shutdown = pin!(client.shutdown());
    for _ in 0..10 {
        assert!(
            poll_once(shutdown.as_mut()).is_pending(),
            "the insert is not written yet"
        );
    }
    assert!(!lock(&pooled).dropped);
    accept(&pooled);
    ready(shutdown);
    let conn = lock(&pooled);
    assert_eq!(
        conn.commands(),
        ["hello", "ping", "insert"],
        "the insert landed"
    );
    assert!(conn.dropped);
}

/// A replica set primary's `hello` reply; an insert in a transaction succeeds, one outside
/// any and a `commitTransaction` report a MaxTimeMSExpired (code 50) write error.
fn primary_with_max_time_write_errors(command: &Document) -> Document {
    let max_time = doc! {
        "ok": 1,
        "n": 0,
        "writeErrors": [{ "index": 0, "code": 50, "errmsg": "operation exceeded time limit" }],
    };
    match command.keys().next().map(String::as_str) {
        Some("hello" | "isMaster" | "ismaster") => doc! {
            "isWritablePrimary": true,
            "setName": "rs0",
            "hosts": ["127.0.0.1:27017"],
            "me": "127.0.0.1:27017",
            "maxWireVersion": 25,
            "minWireVersion": 0,
            "logicalSessionTimeoutMinutes": 30,
            "maxBsonObjectSize": 16_777_216,
            "maxMessageSizeBytes": 48_000_000,
            "maxWriteBatchSize": 100_000,
            "ok": 1,
        },
        Some("insert") if command.contains_key("autocommit") => doc! { "ok": 1, "n": 1 },
        Some("insert" | "commitTransaction") => max_time,
        _ => doc! { "ok": 1 },
    }
}

/// CS-7, TO-14: on a client without `timeoutMS`, a commit under the session's
/// `defaultTimeoutMS` is under CSOT, so a MaxTimeMSExpired write error in its reply is the
/// timeout error (wrapping it); the same reply to a command without a timeout is a write error.
#[test]
fn cs7_a_request_under_its_own_timeout_reads_max_time_write_errors_as_a_timeout() {
    let (client, _clock, _server) = client(
        "mongodb://127.0.0.1:27017/?serverSelectionTimeoutMS=100&serverMonitoringMode=poll",
        usize::MAX,
        primary_with_max_time_write_errors,
    );
    let plain = ready(pin!(client.command("test", insert())));
    match plain {
        Err(error) => assert!(matches!(error.kind, ErrorKind::Write(_)), "{error:?}"),
        Ok(reply) => panic!("a write error: {reply}"),
    }
    let options = SessionOptions::default().with_default_timeout(Duration::from_secs(60));
    let session = ready(pin!(client.start_session_with(options))).expect("a session");
    ready(pin!(session.start_transaction())).expect("the transaction starts");
    let inserted = ready(pin!(session.command("test", insert())));
    assert_eq!(inserted.expect("the insert").get_i32("n").ok(), Some(1));
    let committed = ready(pin!(session.commit_transaction()));
    match committed {
        Err(error) => match &error.kind {
            ErrorKind::Timeout { cause: Some(cause) } => {
                assert!(matches!(cause.kind, ErrorKind::Write(_)), "{cause:?}");
                assert!(cause.is_max_time_expired(), "{cause:?}");
            }
            _ => panic!("CS-7: the timeout error: {error:?}"),
        },
        Ok(()) => panic!("the commit's write error"),
    }
}
