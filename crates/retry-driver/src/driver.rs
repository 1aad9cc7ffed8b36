//! The driving loop, written once for every runtime: it moves bytes between the engine and the
//! runtime's sockets and sleeps until the engine's next timeout. Every decision is the engine's.
//!
//! # Closing a socket
//!
//! A socket that failed is dropped at once, with whatever it was not yet able to write: the
//! engine learns of the failure ([`Engine::handle_closed`]) and answers for those bytes (a
//! request it had not handed over fails before send), and so is one the engine closes under a
//! failed, cancelled or timed-out command (`Close::write_out` false: a truncated message is
//! never run). A healthy socket the engine lets go ([`Engine::poll_close`], `write_out`) first
//! writes out the bytes it was already handed (WP-6, EV-4): the
//! engine may have finished an operation on them, an unacknowledged (`w: 0`) write ends with
//! `{ok: 1}` when [`Engine::poll_transmit`] hands its bytes over, and its connection, stale by
//! then (its pool cleared), is closed in the same call. The driver writes them as far as the
//! socket takes them without waiting; what is left is written as the socket becomes writable,
//! and the socket is dropped once they are out, when a write fails, or [`CLOSE_WRITE_LIMIT`]
//! after the close, whichever comes first (never an unbounded wait, never a blocking one). The
//! engine has forgotten the socket: nothing more is read from it, and its failure is not
//! reported. A client shutting down waits for those writes the same way before it ends.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::task::Wake;

use retry_core::address::ServerAddress;
use retry_core::engine::{Close, ConnId, CursorHandle, Engine, EngineEvent, EventFamilies, OpId};
use retry_core::error::{NetworkCause, NetworkErrorKind, OperationError};
use retry_core::id_table::IdTable;
use retry_core::time::{Instant, OperationTimeout};

use crate::io_error::classify_io_error;
use crate::runtime::{AsyncTimer, BoxFuture, Runtime, Socket};
use crate::shared::{lock, Closed, RawReply, Shared, Slot};
use crate::srv::SrvPolling;

/// Rounds of work in one poll before the driver yields to its executor (tokio's coop budget and
/// fairness to other tasks); it wakes itself to continue.
const ROUNDS_PER_POLL: usize = 64;
/// Reads from one socket in one round, so that one busy socket cannot starve the others.
const READS_PER_ROUND: usize = 8;
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Within this of its deadline the runtime's timer is polled in every round (tokio's timers
/// fire on whole milliseconds).
const TIMER_SLACK: Duration = Duration::from_millis(2);
/// How long after its timer's firing woke the first waiting futures a [`LocalDriver`] waits for
/// one of them to run it before it wakes every waiting future ([`Watchdog`]).
pub(crate) const UNCLAIMED_TIMER_GRACE: Duration = Duration::from_millis(5);
/// WP-6, EV-4: how long a socket the engine closed may take to write out the bytes it was
/// already handed before the driver drops it anyway (see "Closing a socket" in the module docs).
pub(crate) const CLOSE_WRITE_LIMIT: Duration = Duration::from_secs(1);

enum Link {
    Connecting(BoxFuture<io::Result<Pin<Box<dyn Socket>>>>),
    Open(Pin<Box<dyn Socket>>),
}

/// An operation in the engine: where its result goes, the cursor it opened, and the server of
/// its last successful attempt (for the error of a reply with `writeErrors`).
struct Pending {
    slot: Arc<Slot>,
    cursor: Option<CursorHandle>,
    /// CS-7: it runs under CSOT, by its own timeout (TO-14) or the client's `timeoutMS`: its
    /// reply's write errors are read as such ([`RawReply::csot`]).
    csot: bool,
}

struct SocketState {
    link: Link,
    /// The waker its runtime polls are given: it queues this socket in [`ReadySockets`].
    waker: Waker,
    /// This socket's entry in [`ReadySockets`].
    ready: Arc<SocketWaker>,
    /// Bytes the engine asked to write: `outgoing[written..]` are not written yet. The buffer is
    /// reused: it is swapped with the engine's transmit buffer, never copied, when it was empty.
    outgoing: Vec<u8>,
    written: usize,
    /// Its last read returned `Pending` and its runtime has not woken it since: the read waker is
    /// registered and nothing arrived, so a round that polls it only to write (queued by the
    /// driver, not woken) does not read again.
    read_armed: bool,
    /// It is in the driver's list of sockets to write ([`Driver::writes`]).
    listed: bool,
    /// WP-6, EV-4: the engine closed it with bytes left to write. It is only written, never
    /// read, and dropped once they are out, when a write fails, or at its deadline in
    /// [`Driver::closing`]; the engine no longer knows it.
    closing: bool,
}

impl SocketState {
    /// A socket with nothing to write, woken through `ready`.
    fn new(link: Link, ready: Arc<SocketWaker>) -> SocketState {
        SocketState {
            link,
            waker: Waker::from(ready.clone()),
            ready,
            outgoing: Vec::new(),
            written: 0,
            read_armed: false,
            listed: false,
            closing: false,
        }
    }
}

/// The task that owns the engine. Spawned once per client.
pub(crate) struct Driver {
    runtime: Arc<dyn Runtime>,
    engine: Engine,
    shared: Arc<Shared>,
    timer: Pin<Box<dyn AsyncTimer>>,
    timer_at: Option<Instant>,
    /// The runtime's timer was polled for `timer_at` and has not woken since ([`TimerWake`]).
    timer_armed: bool,
    /// The waker the timer's wakes go to, if not the driver task's ([`LocalDriver`]'s, which
    /// tells its timer's wakes from the others).
    timer_waker: Option<Waker>,
    /// What the timer is polled with: it notes each wake of the timer, then passes it on.
    timer_wake: Arc<TimerWake>,
    timer_wake_waker: Waker,
    /// The waker `timer_wake` passes its wakes to, as last set (so it is locked only when
    /// that changes).
    timer_target: Option<Waker>,
    /// By the engine's ids, as `pending` (issue 9: two lookups per round trip, a mask and a
    /// comparison each instead of a hash and a probe).
    sockets: IdTable<ConnId, SocketState>,
    /// By the engine's ids, which it hands out in increasing order ([`IdTable`]: a mask, a load
    /// and a comparison per lookup; issue 9).
    pending: IdTable<OpId, Pending>,
    /// The requests taken from the client's queue in one round, in their slots (reused:
    /// swapped with the queue, so neither allocates again).
    requests: VecDeque<Arc<Slot>>,
    /// `timeoutMS`, for each operation's CSOT deadline.
    timeout: Option<core::time::Duration>,
    read_buffer: Vec<u8>,
    /// Where `Engine::poll_transmit` appends; swapped into an idle socket's `outgoing`.
    transmit: Vec<u8>,
    /// The sockets a round polls: woken by their runtime or given bytes by the engine.
    ready: Arc<ReadySockets>,
    /// The socket ids of one round (reused).
    ids: Vec<ConnId>,
    /// The sockets the engine gave bytes since the last round wrote (each once, in order):
    /// written at the start of the next round's socket polls, before any read.
    writes: Vec<ConnId>,
    /// WP-6, EV-4: the sockets the engine closed that still write out their bytes, with the
    /// instant each is dropped at the latest ([`CLOSE_WRITE_LIMIT`] after its close, so in
    /// order); empty nearly always.
    closing: VecDeque<(Instant, ConnId)>,
    /// SRV polling's name, for a `mongodb+srv` client ([`Driver::with_srv_polling`]).
    srv: Option<SrvPolling>,
    /// The SRV rescan in flight, whose answer goes to the engine.
    srv_lookup: Option<BoxFuture<(Vec<ServerAddress>, Option<Duration>)>>,
    /// The engine was handed something (an operation, bytes, a timeout, ...) since the driver
    /// last took its output: only then can `poll_*` return anything, so
    /// [`Driver::flush_engine`] asks only then (a round's two flushes; one of them usually has
    /// nothing to take).
    unflushed: bool,
    /// Whether the engine publishes command events and the event families, as last set (set
    /// only when a subscriber comes or goes).
    listening: Option<bool>,
    /// Results whose callers are woken for them are counted in
    /// [`Shared::results_to_take`](crate::shared::Shared::results_to_take) (a
    /// [`LocalDriver`]'s, for [`Waiter::defer`]).
    count_results: bool,
}

impl Driver {
    pub(crate) fn new(
        runtime: Arc<dyn Runtime>,
        engine: Engine,
        shared: Arc<Shared>,
        timeout: Option<core::time::Duration>,
    ) -> Driver {
        let timer = runtime.new_timer(Instant::MAX);
        let timer_wake = Arc::new(TimerWake::default());
        Driver {
            runtime,
            engine,
            shared,
            timer,
            timer_at: None,
            timer_armed: false,
            timer_waker: None,
            timer_wake_waker: Waker::from(timer_wake.clone()),
            timer_wake,
            timer_target: None,
            sockets: IdTable::default(),
            pending: IdTable::default(),
            requests: VecDeque::new(),
            timeout,
            read_buffer: vec![0; READ_BUFFER_BYTES],
            transmit: Vec::new(),
            ready: Arc::default(),
            ids: Vec::new(),
            writes: Vec::new(),
            closing: VecDeque::new(),
            srv: None,
            srv_lookup: None,
            // The new engine's first monitor connections.
            unflushed: true,
            listening: None,
            count_results: false,
        }
    }

    /// This driver, making the SRV lookups the engine asks for (`polling`'s name, SP-1..SP-6).
    pub(crate) fn with_srv_polling(mut self, polling: Option<SrvPolling>) -> Driver {
        self.srv = polling;
        self
    }

    /// Starts the SRV rescan the engine asks for and hands its answer back; the engine decides
    /// when and what the hosts do.
    fn poll_srv(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(polling) = &self.srv else {
            return false;
        };
        if self.srv_lookup.is_none() && self.engine.poll_srv_rescan() {
            let (runtime, polling) = (self.runtime.clone(), polling.clone());
            self.srv_lookup = Some(Box::pin(async move {
                crate::srv::rescan(&*runtime, &polling).await
            }));
        }
        let Some(lookup) = &mut self.srv_lookup else {
            return false;
        };
        let Poll::Ready((hosts, ttl)) = lookup.as_mut().poll(cx) else {
            return false;
        };
        self.srv_lookup = None;
        self.engine.handle_srv_hosts(hosts, ttl, self.runtime.now());
        true
    }

    /// Starts the operations the client queued. Returns whether there were any, and whether the
    /// client is closing.
    fn take_requests(&mut self, cx: &mut Context<'_>, now: Instant) -> (bool, bool) {
        let closing = {
            let mut state = lock(&self.shared.state);
            if !state
                .driver
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                state.driver = Some(cx.waker().clone());
            }
            // EV-1: command events cost a copy of each command and reply; publish them only
            // while someone listens.
            let listening = state.subscribers.iter().any(|s| Arc::strong_count(s) > 1);
            if self.listening != Some(listening) {
                self.listening = Some(listening);
                self.engine.set_command_monitoring(listening);
                // Issue 9: pool, SDAM, retry and hedging events only ever go to subscribers
                // (the driver reacts to events the engine always publishes); without one the
                // engine does not queue them.
                self.engine.set_events(if listening {
                    EventFamilies::ALL
                } else {
                    EventFamilies::NONE
                });
            }
            // A dropped `run` future cancels its operation in the engine, before a session
            // dropped after it ends (SE-12: the cancel may make the session dirty).
            let cancels = core::mem::take(&mut state.cancels);
            let cancelled = !cancels.is_empty();
            for op in cancels {
                self.pending.remove(&op);
                self.engine.cancel_operation(op, now);
            }
            state.operations = self.pending.len() + state.requests.len();
            // Explicit sessions to start and end (`session.rs`); none in most rounds.
            let sessions = !state.sessions.is_empty()
                && crate::session::serve(&mut self.engine, &mut state.sessions, self.timeout, now);
            if state.requests.is_empty() {
                return (sessions || cancelled, state.closing);
            }
            core::mem::swap(&mut state.requests, &mut self.requests);
            state.closing
        };
        let timeout = match self.timeout {
            Some(t) => OperationTimeout::from_timeout_ms(now, t),
            None => OperationTimeout::Off,
        };
        while let Some(slot) = self.requests.pop_front() {
            let engine = &mut self.engine;
            let mut csot = false;
            // Not started if its caller gave up on it already; it cannot give up while it starts.
            let started = slot.start(|request, own| {
                // TO-14: a request's own timeout (a session's `defaultTimeoutMS` for its commit
                // or abort) in place of the client's, its deadline from now as the client's.
                let request_timeout = match own {
                    None => timeout,
                    Some(own) => OperationTimeout::from_timeout_ms(now, own),
                };
                // CS-7: the request's own timeout puts it under CSOT, as the client's does.
                csot = request_timeout.is_csot();
                request.as_mut()?.timeout = request_timeout;
                Some(engine.start_operation(request.take()?, now))
            });
            if let Some(op) = started {
                let pending = Pending {
                    slot,
                    cursor: None,
                    csot,
                };
                self.pending.insert(op, pending);
            }
        }
        (true, closing)
    }

    /// Connects, writes and reads, as far as it goes without waiting, the sockets that are ready:
    /// one socket's input costs the same however many others are open (house rule 9).
    /// Returns whether anything moved, and whether the engine was handed something.
    fn poll_sockets(&mut self, cx: &mut Context<'_>, now: Instant) -> (bool, bool) {
        let mut progressed = false;
        let mut fed = false;
        let mut ids = core::mem::take(&mut self.ids);
        ids.clear();
        // The engine's new bytes first, however many sockets wait to be read: a request goes
        // out in the round that made it (issue 9).
        core::mem::swap(&mut ids, &mut self.writes);
        for &conn in &ids {
            let Some(socket) = self.sockets.get_mut(&conn) else {
                continue;
            };
            socket.listed = false;
            let Link::Open(stream) = &mut socket.link else {
                socket.ready.enqueue();
                continue;
            };
            let mut socket_cx = Context::from_waker(&socket.waker);
            let (wrote, failure) = write_outgoing(
                stream,
                &mut socket_cx,
                &mut socket.outgoing,
                &mut socket.written,
            );
            progressed |= wrote;
            if socket.closing {
                // WP-6, EV-4: the engine closed it; it goes once its bytes are out.
                if failure.is_some() || socket.outgoing.is_empty() {
                    self.sockets.remove(&conn);
                }
            } else if let Some((kind, cause)) = failure {
                progressed = true;
                fed = true;
                self.sockets.remove(&conn);
                self.engine.handle_closed(conn, kind, Some(cause), now);
            }
        }
        ids.clear();
        self.ready.take(cx.waker(), &mut ids);
        for &conn in &ids {
            let Some(socket) = self.sockets.get_mut(&conn) else {
                continue;
            };
            // Cleared before the poll: a wake from now on queues the socket again.
            socket.ready.queued.store(false, Ordering::Release);
            if socket.ready.woken.swap(false, Ordering::AcqRel) {
                socket.read_armed = false;
            }
            let mut socket_cx = Context::from_waker(&socket.waker);
            if let Link::Connecting(connecting) = &mut socket.link {
                match connecting.as_mut().poll(&mut socket_cx) {
                    Poll::Pending => continue,
                    Poll::Ready(Ok(stream)) => {
                        socket.link = Link::Open(stream);
                        // Read next round, after the engine has written the handshake.
                        socket.ready.enqueue();
                        self.engine.handle_connected(conn, now);
                    }
                    Poll::Ready(Err(error)) => {
                        self.sockets.remove(&conn);
                        // HS-9: a failed name lookup is a DNS error (no labels).
                        let (kind, cause) = classify_io_error(&error, true);
                        self.engine.handle_closed(conn, kind, Some(cause), now);
                    }
                }
                progressed = true;
                fed = true;
                continue;
            }
            let Link::Open(stream) = &mut socket.link else {
                continue;
            };
            let (wrote, mut failure) = write_outgoing(
                stream,
                &mut socket_cx,
                &mut socket.outgoing,
                &mut socket.written,
            );
            progressed |= wrote;
            if socket.closing {
                // WP-6, EV-4: written, never read; it goes once its bytes are out.
                if failure.is_some() || socket.outgoing.is_empty() {
                    self.sockets.remove(&conn);
                }
                continue;
            }
            let mut read_all = socket.read_armed;
            for _ in 0..READS_PER_ROUND {
                if failure.is_some() || socket.read_armed {
                    break;
                }
                match stream
                    .as_mut()
                    .poll_read_armed(&mut socket_cx, &mut self.read_buffer)
                {
                    Poll::Pending => {
                        read_all = true;
                        socket.read_armed = true;
                        break;
                    }
                    Poll::Ready(Ok((0, _))) => failure = Some(closed_by_peer()),
                    Poll::Ready(Ok((n, armed))) => {
                        progressed = true;
                        fed = true;
                        // Bytes after a frame the engine rejected are ignored by it.
                        self.engine.handle_bytes(conn, &self.read_buffer[..n], now);
                        if armed {
                            // Drained, and the waker registered (issue 9): no read to `Pending`.
                            read_all = true;
                            socket.read_armed = true;
                            break;
                        }
                    }
                    Poll::Ready(Err(error)) => failure = Some(classify_io_error(&error, false)),
                }
            }
            if let Some((kind, cause)) = failure {
                progressed = true;
                fed = true;
                self.sockets.remove(&conn);
                self.engine.handle_closed(conn, kind, Some(cause), now);
            } else if !read_all {
                // Its read budget ran out with bytes left: no waker is armed, poll it again.
                socket.ready.enqueue();
            }
        }
        self.ids = ids;
        (progressed, fed)
    }

    /// Hands the engine's bytes in `transmit` to `conn`'s socket and lists the socket once for
    /// the next round's writes (issue 9); `transmit` is left empty.
    #[inline]
    fn queue_transmit(&mut self, conn: ConnId) {
        if let Some(socket) = self.sockets.get_mut(&conn) {
            if !socket.listed {
                socket.listed = true;
                self.writes.push(conn);
            }
            if socket.outgoing.is_empty() {
                // No copy: the socket takes the bytes' buffer and lends its own.
                core::mem::swap(&mut socket.outgoing, &mut self.transmit);
            } else {
                socket.outgoing.extend_from_slice(&self.transmit);
            }
        }
        self.transmit.clear();
    }

    /// Carries out everything the engine asked for: sockets to open or close, bytes to write,
    /// results and events to deliver (stamped with `now`, the instant of the round that took
    /// them).
    #[inline]
    fn flush_engine(&mut self, now: Instant) -> bool {
        // Inlined: one of a round's two flushes usually has nothing to take (issue 9).
        core::mem::take(&mut self.unflushed) && self.take_engine_output(now)
    }

    /// Starts opening every socket the engine asks for; whether it asked for any.
    fn open_sockets(&mut self) -> bool {
        let mut opened = false;
        while let Some(connect) = self.engine.poll_connect() {
            opened = true;
            let future = self
                .runtime
                .connect(connect.address.host().to_string(), connect.address.port());
            let ready = Arc::new(SocketWaker {
                conn: connect.conn,
                queued: AtomicBool::new(false),
                woken: AtomicBool::new(false),
                sockets: self.ready.clone(),
            });
            ready.enqueue();
            self.sockets.insert(
                connect.conn,
                SocketState::new(Link::Connecting(future), ready),
            );
        }
        opened
    }

    /// [`Driver::flush_engine`] once the engine was handed something.
    fn take_engine_output(&mut self, now: Instant) -> bool {
        let mut progressed = self.open_sockets();
        let mut wrote = false;
        while let Some(conn) = self.engine.poll_transmit(&mut self.transmit) {
            wrote = true;
            self.queue_transmit(conn);
        }
        if wrote {
            progressed = true;
            // WP-6: taking an unacknowledged write's bytes ends its operation, and its
            // connection's check-in may ask for a socket (rarely): it is opened now, not at the
            // next input.
            self.open_sockets();
        }
        while let Some(close) = self.engine.poll_close() {
            progressed = true;
            self.close_socket(close, now);
        }
        let Some(mut event) = self.engine.poll_event() else {
            return progressed;
        };
        // Subscribers get an operation's events before its caller gets its result.
        let mut guard = lock(&self.shared.state);
        let state = &mut *guard;
        // Issue 9: no call for the usual empty list.
        if !state.subscribers.is_empty() {
            state.subscribers.retain(|s| Arc::strong_count(s) > 1);
        }
        let subscribers = &state.subscribers[..];
        loop {
            for subscriber in subscribers {
                subscriber.push((now, event.clone()));
            }
            match event {
                EngineEvent::CursorOpened { op, cursor } => {
                    if let Some(pending) = self.pending.get_mut(&op) {
                        pending.cursor = Some(cursor);
                    }
                }
                EngineEvent::OperationFinished {
                    op,
                    result,
                    address,
                } => {
                    if let Some(pending) = self.pending.remove(&op) {
                        let cursor = pending.cursor;
                        // The caller reads a success's write errors (RW-3, `RawReply`).
                        let result = result.map(|body| RawReply {
                            body,
                            cursor,
                            address,
                            // Issue 9: an emptied command document to build the reply into.
                            document: self.engine.take_document(),
                            // CS-7: its write errors read under CSOT or not, by the
                            // operation's own timeout (TO-14) or the client's.
                            csot: pending.csot,
                        });
                        let results = self.count_results.then_some(&self.shared.results_to_take);
                        pending.slot.complete(result, results);
                        if let Some(name) = self.engine.take_db_name() {
                            if state.spare_names.len() < crate::shared::SPENT_SLOTS {
                                state.spare_names.push(name);
                            }
                        }
                        if state.spent_slots.len() < crate::shared::SPENT_SLOTS {
                            state.spent_slots.push_back(pending.slot);
                        }
                    }
                }
                _ => {}
            }
            // Issue 9: each event moved once out of the engine's queue, not through an
            // `Option` of its own first.
            match self.engine.poll_event() {
                Some(next) => event = next,
                None => break,
            }
        }
        state.operations = self.pending.len();
        true
    }

    /// WP-6, EV-4: the engine closed a socket. One let go healthy ([`Close::write_out`]) with
    /// bytes it was handed and has not written (an unacknowledged write's, which the engine
    /// ended with `{ok: 1}` as it handed them over) writes what it takes now, and if some are
    /// left it stays, only written, until they are out, a write fails, or [`CLOSE_WRITE_LIMIT`]
    /// from `now`; any other is dropped, with its unwritten rest (review39 M3: a command
    /// cancelled or timed out mid-write never reaches the server whole).
    fn close_socket(&mut self, close: Close, now: Instant) {
        let conn = close.conn;
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        if let Link::Open(stream) = &mut socket.link {
            if close.write_out && !socket.outgoing.is_empty() {
                let mut socket_cx = Context::from_waker(&socket.waker);
                let (_, failure) = write_outgoing(
                    stream,
                    &mut socket_cx,
                    &mut socket.outgoing,
                    &mut socket.written,
                );
                if failure.is_none() && !socket.outgoing.is_empty() {
                    // The `Pending` write registered its waker: it is polled again when the
                    // socket can take more.
                    socket.closing = true;
                    self.closing
                        .push_back((now.saturating_add(CLOSE_WRITE_LIMIT), conn));
                    return;
                }
            }
        }
        self.sockets.remove(&conn);
    }

    /// WP-6, EV-4: drops the closed sockets whose [`CLOSE_WRITE_LIMIT`] has passed by `now`
    /// with bytes still unwritten, and forgets the first entries of those that went already:
    /// afterwards the first entry, if any, is a socket still writing.
    fn expire_closing(&mut self, now: Instant) {
        while let Some(&(at, conn)) = self.closing.front() {
            // Ids are never reused: a socket still there under it is this closing one.
            let writing = self.sockets.get(&conn).is_some_and(|s| s.closing);
            if writing && at > now {
                break;
            }
            self.closing.pop_front();
            if writing {
                self.sockets.remove(&conn);
            }
        }
    }

    /// Fires the engine's timers that are due and arms the runtime's timer for the next one.
    ///
    /// The runtime's timer is set for `timer_at`, never later than the engine's earliest
    /// deadline (house rule 8, CS-2): it is re-armed when that deadline moves earlier than
    /// `timer_at`, or when `timer_at` has passed (the timer fired or is due), but not when the
    /// deadline moves later. Each operation's own deadline (`timeoutMS`) moves the earliest one
    /// later when it ends and earlier again (than the heartbeat's) when the next starts; a
    /// re-arm per move would re-register the runtime's timer twice per operation (on async-io a
    /// reactor notification and one more `epoll` wait each, house rule 9, issue 9). A timer set
    /// early costs one extra wake when it fires, which re-arms it for the deadline of then.
    ///
    /// The deadlines of closed sockets still writing ([`Driver::closing`], WP-6) share the
    /// timer: the earliest of theirs and the engine's is armed, and those passed are dropped.
    fn poll_timer(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        let mut next = self.engine.poll_timeout();
        if !self.closing.is_empty() {
            self.expire_closing(now);
            if let Some(&(closing_at, _)) = self.closing.front() {
                next = Some(next.map_or(closing_at, |at| at.min(closing_at)));
            }
        }
        let Some(at) = next else {
            return false;
        };
        if at <= now {
            self.engine.handle_timeout(now);
            return true;
        }
        let fires_at = match self.timer_at {
            Some(set) if set <= at && now < set => set,
            _ => {
                self.timer.as_mut().reset(at);
                self.timer_at = Some(at);
                self.timer_armed = false;
                at
            }
        };
        // Polled already for this instant, not woken since, and the instant is well ahead
        // (more than a runtime's timer granularity): its firing wakes the task, which then
        // finds the instant passed or near and polls it again. Any wake of the timer disarms
        // it ([`TimerWake`], house rule 8).
        if self.timer_armed
            && !self.timer_wake.woken.load(Ordering::Acquire)
            && now.saturating_add(TIMER_SLACK) < fires_at
        {
            return false;
        }
        let target = self.timer_waker.as_ref().unwrap_or(cx.waker());
        if !self
            .timer_target
            .as_ref()
            .is_some_and(|w| w.will_wake(target))
        {
            self.timer_target = Some(target.clone());
            *lock(&self.timer_wake.target) = Some(target.clone());
        }
        // Cleared before the poll: a wake from now on (one the poll itself makes included)
        // disarms the timer again.
        self.timer_wake.woken.store(false, Ordering::Release);
        let fired = self
            .timer
            .as_mut()
            .poll(&mut Context::from_waker(&self.timer_wake_waker));
        if fired.is_ready() {
            self.timer_at = None;
            // Fired for an earlier deadline than the engine's of now: another round re-arms
            // it (the engine has nothing due, so it is not asked).
            let now = self.runtime.now();
            if now < at {
                return true;
            }
            if !self.closing.is_empty() {
                self.expire_closing(now);
            }
            self.engine.handle_timeout(now);
            return true;
        }
        self.timer_armed = true;
        false
    }

    /// Closes the engine (every operation in flight finishes once with its cancellation, the
    /// closing events are delivered), fails the operations still queued, closes every socket and
    /// ends every event stream.
    fn finish(&mut self, now: Instant) {
        self.engine.close(now);
        self.unflushed = true;
        self.flush_engine(now);
        self.sockets = IdTable::default();
        self.release_callers();
    }

    /// Review32 R5: the driver's task was dropped before the driver stopped, which a runtime
    /// does to its tasks when it shuts down (`why` is [`Closed::RuntimeGone`]), and tokio does
    /// to a task whose poll panicked ([`Closed::DriverPanicked`], review34 Y1): the driver's
    /// sockets and timer belong to that runtime, and nothing may poll them again (tokio's timers
    /// panic once their runtime is shut down; the dead task would never be woken either). So
    /// the driver stops without a pass: the operations in flight end cancelled after the
    /// runtime's loss (they may have been sent) or with [`crate::shared::driver_panicked`] after
    /// a panic, the queued ones and every later one with
    /// [`crate::shared::SharedState::closed_error`], event streams end and
    /// [`crate::Client::shutdown`] returns. The engine, sockets and timer go with `self`, on
    /// the thread that dropped the task.
    fn orphan(mut self, why: Closed) {
        {
            let mut state = lock(&self.shared.state);
            state.closed = why;
            state.closing = true;
        }
        self.release_callers();
    }

    /// Ends every caller's wait: the operations in flight end cancelled (with
    /// [`crate::shared::driver_panicked`] after a panic), the queued ones with
    /// [`crate::shared::SharedState::closed_error`], session starts are refused, event streams
    /// end and the client is done. Nothing here panics (locks ignore poisoning): after a panic
    /// it runs while the panic unwinds ([`DriverTask`]'s drop), where a second panic aborts.
    fn release_callers(&mut self) {
        let results = self.count_results.then_some(&self.shared.results_to_take);
        let panicked = lock(&self.shared.state).closed == Closed::DriverPanicked;
        for pending in core::mem::take(&mut self.pending).values() {
            let error = if panicked {
                crate::shared::driver_panicked()
            } else {
                OperationError::cancelled()
            };
            pending.slot.complete_cold(Err(error), results);
        }
        let mut state = lock(&self.shared.state);
        for slot in core::mem::take(&mut state.requests) {
            slot.complete_cold(Err(state.closed_error()), results);
        }
        state.sessions.refuse_starts();
        for subscriber in core::mem::take(&mut state.subscribers) {
            subscriber.close();
        }
        state.done = true;
        for waker in core::mem::take(&mut state.done_wakers) {
            waker.wake();
        }
    }
}

impl Future for Driver {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        for _ in 0..ROUNDS_PER_POLL {
            let now = this.runtime.now();
            let (mut progressed, closing) = this.take_requests(cx, now);
            this.unflushed |= progressed || closing;
            if closing {
                // SE-15: the engine ends its sessions (bounded) before it closes; drive it until
                // it has.
                this.engine.close(now);
                if this.engine.is_closed() {
                    // WP-6, EV-4: the sockets it closed write out what they were handed first
                    // (bounded, [`CLOSE_WRITE_LIMIT`]); the rounds go on until they have.
                    progressed |= this.flush_engine(now);
                    this.expire_closing(now);
                    if this.closing.is_empty() {
                        this.finish(now);
                        return Poll::Ready(());
                    }
                }
            }
            progressed |= this.flush_engine(now);
            let (polled, fed) = this.poll_sockets(cx, now);
            progressed |= polled;
            this.unflushed |= fed;
            progressed |= this.flush_engine(now);
            let timed_out = this.poll_timer(cx, now);
            let srv = this.poll_srv(cx);
            // Taken by the next round's first flush.
            this.unflushed |= timed_out || srv;
            if !progressed && !timed_out && !srv {
                return Poll::Pending;
            }
            // Another round only for work nothing will wake this task for: sockets the engine
            // gave bytes or a connect after they were polled (queued, not woken), what a timeout
            // or an SRV answer made the engine do, and a close still under way. Everything else
            // was carried out above, and every socket, the timer and the client's queue hold this
            // task's waker.
            if !closing && !timed_out && !srv && this.ready.is_empty() && this.writes.is_empty() {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The waker the driver's runtime timer is polled with (house rule 8): each wake sets
/// `woken`, then wakes the driver (its task, or a [`LocalDriver`]'s [`TimerWaker`]). The driver
/// does not poll an armed timer again until its deadline changes or nears, so it must know when
/// a `Pending` poll did not leave the timer armed: a future may return `Pending` and wake its
/// waker at once instead of registering it (tokio's `Sleep` does when the task's coop budget is
/// used up), and a wake of the task does not say by whom. Every wake of the timer disarms it;
/// the next round polls it again.
#[derive(Default)]
struct TimerWake {
    /// The timer woke since the driver last polled it.
    woken: AtomicBool,
    /// Where the wake goes: the waker of the pass that last polled the timer.
    target: Mutex<Option<Waker>>,
}

impl Wake for TimerWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let target = lock(&self.target).clone();
        if let Some(target) = target {
            target.wake();
        }
    }
}

/// A driver with a task of its own (a runtime that spawns, as tokio). The task runs it for every
/// wake; and a caller whose operation is the only one in flight runs a pass itself to start it
/// ([`SpawnedDriver::run_inline`], issue 9): with nothing to batch, the hop to the driver's task
/// would cost a wake and a task poll more per round trip than the write it leads to. An inline
/// pass is polled with the task's waker, so the sockets, the timer and the client's queue wake
/// the task, as after any of its own passes.
///
/// The wake protocol (house rule 8: no lost wakes). Invariant: every wake of the task is
/// followed by a pass of the driver that starts after it, on the task or on a caller. Whoever
/// holds `state`'s lock runs the pass. The task's poll sets `missed`, then (SeqCst fence) tries
/// the lock; a caller lets the lock go, then (SeqCst fence) takes `missed` and, if it was set,
/// wakes the task: of the two fences the later one sees the other side's write, so either the
/// task finds the lock free or the caller sees `missed`. The caller wakes the task through
/// `waker`, a copy of the task's waker kept outside `state` (written with it, under the driver's
/// lock, before `started`): it never waits for another pass to read it (review16 finding 3). A
/// caller takes the lock only once the task has stored its waker (`started`), so no poll is
/// refused that nobody could wake again; and it holds the lock in a [`Claim`], whose drop lets
/// it go and runs that check, so a pass that panics wakes a refused task too (review16 finding
/// 4). Extra wakes are harmless: a wake only makes the task poll, and no wake consumes
/// another's. A pass does not re-arm every waker (it polls only the sockets queued in
/// [`ReadySockets`]), but every waker the driver hands out is either persistent per source (a
/// socket's [`SocketWaker`], whose wake queues the socket for the next pass and wakes the waker
/// [`ReadySockets`] keeps, cloned, never taken; the timer's [`TimerWake`], whose wake makes the
/// next round poll the timer again) or taken by its wake and stored again by the pass that wake
/// causes (the client queue's: `wake_driver` takes it, `take_requests` stores it).
pub(crate) struct SpawnedDriver {
    state: Mutex<SpawnedState>,
    /// The task was polled while a caller ran a pass: that caller wakes it when done.
    missed: AtomicBool,
    /// The task has stored its waker (its first poll): only then may a caller take the lock.
    started: AtomicBool,
    /// The task's waker, as in `state`: what a caller wakes it with after letting the lock go.
    /// Its own lock is held only to store or clone it, never across a pass.
    waker: Mutex<Option<Waker>>,
}

struct SpawnedState {
    /// `None` once it has stopped (shut down).
    driver: Option<Driver>,
    /// The task's waker, from its last poll that ran the driver.
    task: Option<Waker>,
}

/// The driver's lock held by a caller ([`SpawnedDriver::claim`]). Dropping it lets the lock go
/// and wakes the task if it was polled meanwhile (`missed`) or must end (`stopped`): on every
/// path out of a caller's pass, an unwinding panic included (house rule 8).
struct Claim<'a> {
    spawned: &'a SpawnedDriver,
    state: Option<MutexGuard<'a, SpawnedState>>,
    /// The caller's pass stopped the driver: the task must be woken to end.
    stopped: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        drop(self.state.take());
        self.spawned.hand_back(self.stopped);
    }
}

/// The driver's task ([`SpawnedDriver`]): spawned once per client.
pub(crate) struct DriverTask(Arc<SpawnedDriver>);

impl SpawnedDriver {
    pub(crate) fn new(driver: Driver) -> Arc<SpawnedDriver> {
        Arc::new(SpawnedDriver {
            state: Mutex::new(SpawnedState {
                driver: Some(driver),
                task: None,
            }),
            missed: AtomicBool::new(false),
            started: AtomicBool::new(false),
            waker: Mutex::new(None),
        })
    }

    /// The task to spawn.
    pub(crate) fn task(self: &Arc<Self>) -> DriverTask {
        DriverTask(self.clone())
    }

    /// Runs a pass of the driver on the caller's thread, polled with the task's waker, unless
    /// the task or another caller runs it, or the task has not run yet. Returns whether it ran;
    /// if not, the caller wakes the task for its work instead.
    pub(crate) fn run_inline(&self) -> bool {
        let Some(mut claim) = self.claim() else {
            return false;
        };
        let Some(SpawnedState {
            driver,
            task: Some(task),
        }) = claim.state.as_deref_mut()
        else {
            return false;
        };
        let Some(running) = driver.as_mut() else {
            // Stopped: the claim's drop still wakes a task refused meanwhile.
            return false;
        };
        let stopped = Pin::new(running)
            .poll(&mut Context::from_waker(task))
            .is_ready();
        if stopped {
            // The driver (and its engine and sockets) goes now; its task ends when next polled.
            *driver = None;
            claim.stopped = true;
        }
        true
    }

    /// The driver's lock, for a pass on a caller's thread: `None` while the task has not stored
    /// its waker (its first poll must not be refused: nobody could wake it again) or while
    /// someone else holds it.
    fn claim(&self) -> Option<Claim<'_>> {
        if !self.started.load(Ordering::Acquire) {
            return None;
        }
        let state = match self.state.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(Claim {
            spawned: self,
            state: Some(state),
            stopped: false,
        })
    }

    /// After a caller let the lock go ([`Claim`]'s drop): wakes the task if it was polled
    /// meanwhile (`missed`) or must end (`stopped`).
    fn hand_back(&self, stopped: bool) {
        // Pairs with the task's fence: either the task sees the lock free, or this sees `missed`.
        fence(Ordering::SeqCst);
        if self.missed.swap(false, Ordering::Relaxed) || stopped {
            // Rare: the task was polled meanwhile, or must end. Whoever holds the driver's lock
            // now has taken `missed` as cleared, so this wake is needed; its waker is read
            // without that lock, which may be held for a whole pass (review16 finding 3).
            let task = lock(&self.waker).clone();
            if let Some(task) = task {
                task.wake();
            }
        }
    }
}

impl Drop for DriverTask {
    /// Review32 R5: a task dropped before its driver stopped was dropped by its runtime's
    /// shutdown (tokio drops a runtime's tasks before it shuts its timers and sockets down), or
    /// after a panic in its pass (tokio drops a task whose poll panicked while the panic
    /// unwinds): the driver stops here ([`Driver::orphan`]), so no caller's inline pass polls
    /// the dead runtime's timer (a panic) and no operation waits for a task that will never run
    /// (a hang). Review34 Y1, review36 V2: the reason given is the driver's panic when a pass
    /// panicked (every pass runs under the client's state lock, so it is poisoned), else the
    /// runtime's loss, even while this thread unwinds from a panic of its own (a runtime dropped
    /// during a failing test's unwinding); while unwinding, a panic in the stop is caught (a
    /// second panic escaping a drop aborts). It
    /// waits for an inline pass under way to end (a pass never drops this task). Nothing is
    /// added to an operation's path: a client whose driver is gone is closing, which every
    /// operation checks already.
    fn drop(&mut self) {
        let unwinding = std::thread::panicking();
        let why = if self.0.state.is_poisoned() {
            Closed::DriverPanicked
        } else {
            Closed::RuntimeGone
        };
        let driver = lock(&self.0.state).driver.take();
        if let Some(driver) = driver {
            if unwinding {
                let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    driver.orphan(why);
                }));
                // A second panic was printed; the first one goes on unwinding.
                drop(stopped);
            } else {
                driver.orphan(why);
            }
        }
    }
}

impl Future for DriverTask {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let spawned = &self.0;
        spawned.missed.store(true, Ordering::Relaxed);
        // Pairs with `hand_back`'s fence: a caller holding the driver now sees `missed` after
        // it lets go, and wakes this task again.
        fence(Ordering::SeqCst);
        let mut guard = match spawned.state.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Poll::Pending,
        };
        spawned.missed.store(false, Ordering::Relaxed);
        let state = &mut *guard;
        if !state.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            state.task = Some(cx.waker().clone());
            *lock(&spawned.waker) = Some(cx.waker().clone());
            // Under the lock, after the waker: a caller that sees it finds the waker stored.
            spawned.started.store(true, Ordering::Release);
        }
        let Some(driver) = state.driver.as_mut() else {
            return Poll::Ready(());
        };
        if Pin::new(driver).poll(cx).is_ready() {
            state.driver = None;
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// The sockets that have something to do, in the order they became ready (woken by their
/// runtime, given bytes by the engine, newly connected), and the driver's waker to wake for them.
#[derive(Default)]
struct ReadySockets {
    state: Mutex<ReadyState>,
    /// Whether `state.conns` is not empty, written under its lock: the end of a driver round
    /// reads it without taking the lock.
    queued: AtomicBool,
}

#[derive(Default)]
struct ReadyState {
    conns: Vec<ConnId>,
    driver: Option<Waker>,
}

impl ReadySockets {
    /// Whether no socket is queued.
    fn is_empty(&self) -> bool {
        !self.queued.load(Ordering::Acquire)
    }

    /// Moves the ready sockets into `into` and keeps `driver` as the waker to wake for the next.
    fn take(&self, driver: &Waker, into: &mut Vec<ConnId>) {
        let mut state = lock(&self.state);
        if !state.driver.as_ref().is_some_and(|w| w.will_wake(driver)) {
            state.driver = Some(driver.clone());
        }
        core::mem::swap(&mut state.conns, into);
        self.queued.store(false, Ordering::Release);
    }
}

/// One socket's waker: queues the socket once in [`ReadySockets`] and wakes the driver.
struct SocketWaker {
    conn: ConnId,
    /// Whether the socket is in the queue (so a burst of wakes queues it once).
    queued: AtomicBool,
    /// Its runtime woke it since the driver last polled it (not only the driver queued it).
    woken: AtomicBool,
    sockets: Arc<ReadySockets>,
}

impl SocketWaker {
    /// Queues the socket if it is not queued; returns the driver's waker if the queue was empty.
    /// A queue that was not empty has had its wake already: the driver takes the whole queue in
    /// one round, and a driver that queues a socket itself runs another round before it waits
    /// (so at 64 in flight a burst of replies wakes the driver once, not once per socket).
    fn queue(&self) -> Option<Waker> {
        if self.queued.swap(true, Ordering::AcqRel) {
            return None;
        }
        let mut state = lock(&self.sockets.state);
        let first = state.conns.is_empty();
        state.conns.push(self.conn);
        self.sockets.queued.store(true, Ordering::Release);
        if first {
            state.driver.clone()
        } else {
            None
        }
    }

    /// Queues the socket for the driver's next round, from the driver itself (no wake).
    fn enqueue(&self) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            lock(&self.sockets.state).conns.push(self.conn);
            self.sockets.queued.store(true, Ordering::Release);
        }
    }
}

impl Wake for SocketWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        if let Some(driver) = self.queue() {
            driver.wake();
        }
    }
}

/// A driver without a task of its own, for runtimes without a spawn of their own (async-io under
/// `async_std::task::block_on` or `smol::block_on`): the client's futures (operations, event
/// streams, shutdown) drive it on the caller's executor, with no hand-off to another task or
/// thread; an idle client catches up on its next operation.
///
/// Every wake of the driver (a socket ready, its timer due, a cancel, a session request) sets a
/// flag; whoever is polled, finds the flag set and the lock free runs the driver's passes. A wake
/// that comes while a pass runs (`running` set) does nothing more: the pass looks at the flag
/// when it ends, and runs another or hands off (house rule 9, review11 finding 2). Otherwise the
/// wake that sets the flag wakes two waiting futures (the most recently registered); while none
/// of the woken has run the driver (`claimed` clear), each further wake wakes twice as many as
/// the one before (2, 2, 4, 8, ...), and the driver's own timer, firing then, wakes every waiting
/// future (house rule 8, review10 finding 2). A woken future leaves the list until it is
/// polled again, so futures that their callers keep but never poll (a `select` that another
/// branch won) absorb one wake each, once. The bound: with `k` of them registered ahead of a
/// live future, the live one is woken by the `⌈log2(k + 1)⌉`-th wake after a pass, and at the
/// latest by the first firing of the driver's timer (the next engine deadline) after the first
/// such wake. When the timer's firing is itself the first wake after a pass, a [`Watchdog`]
/// timer takes the place of the next firing: if no pass of the driver has started
/// [`UNCLAIMED_TIMER_GRACE`] later, it wakes every waiting future (one timer registration per
/// firing, not a wake per waiter). So an operation whose reply arrived waits past its deadline
/// by at most that grace, and only when its deadline's firing is the first wake after a pass (a
/// firing during a pass is handled by that pass). The common path (a wake, one of the two woken
/// runs the driver) wakes two, however many wait (house rule 9), and a wake during a pass wakes
/// none; more only while woken futures are not polled.
///
/// A first poll may also leave the start of its operation to a pass another future owes
/// ([`Waiter::defer`], issue 9), and that future may be kept and never polled; the watchdog then
/// bounds the wait too (review25 R1): armed by the deferral unless armed already, and armed again
/// when it fires while a pass deferred since its arming is owed and the driver has something to
/// do (review26 S1), it wakes every waiting future if no pass has started within the grace, so
/// the future of an operation whose start was deferred is woken to start it at most twice
/// [`UNCLAIMED_TIMER_GRACE`] after its first poll.
/// Any pass that starts serves the deferral (it takes every queued operation), so nothing waits
/// on a future once a pass ran.
pub(crate) struct LocalDriver {
    driver: Mutex<Option<Driver>>,
    waker: Arc<DriverWaker>,
    /// `waker` as a [`Waker`], the one the driver's sockets and timer hold.
    driver_waker: Waker,
}

/// The waker the driver's sockets and timer hold: "the driver has something to do".
#[derive(Default)]
struct DriverWaker {
    /// Set by every wake, cleared when a pass of the driver starts.
    dirty: AtomicBool,
    /// Set when a pass of the driver starts, cleared when futures are woken to run one: while
    /// it is clear, none of the woken futures has run the driver yet.
    claimed: AtomicBool,
    /// Set while a pass of the driver runs ([`Pass`]), cleared before the pass lets the lock go
    /// and before its runner's last look at `dirty` ([`DriverWaker::end_pass`]): a wake that
    /// finds it set only sets `dirty`, which that look sees (house rule 9, review11 finding 2).
    running: AtomicBool,
    /// Passes of the driver started, counted when `claimed` is set. 64 bits, so that it never
    /// wraps in practice: a count seen again would make a stale `deferred` owed again (review26
    /// S4).
    passes: AtomicU64,
    /// `passes` when the [`Watchdog`] was last armed, written under its lock: it wakes every
    /// waiting future only if no pass has started since, whatever later wakes did to `claimed`
    /// (house rule 9, review12 finding 3).
    watched: AtomicU64,
    waiting: Mutex<Waiting>,
    /// Armed by a firing of the driver's timer that was the first wake after a round, and by
    /// a deferred pass ([`DriverWaker::watch`]).
    watchdog: Mutex<Option<Watchdog>>,
    /// The [`Watchdog`] is armed and has not fired: written under its lock, read without it by
    /// [`DriverWaker::watch`].
    watching: AtomicBool,
    /// A future woke its own task to run the pass that starts the operations queued meanwhile
    /// ([`Waiter::defer`]): `passes` then plus one ([`DriverWaker::owed_now`]), or 0. The pass
    /// is owed until a pass starts (`passes` changes, review25 R1) or the future is polled
    /// again or dropped; meanwhile the futures polled leave that pass to it (or to the first
    /// poll that finds no result left to take).
    deferred: AtomicU64,
}

/// A runtime timer of a [`LocalDriver`]'s own (house rule 8): a firing of the driver's
/// timer that is the first wake after a round wakes two waiting futures, like any such wake, and
/// arms this for [`UNCLAIMED_TIMER_GRACE`] later; if no pass of the driver has started by then
/// (the woken are futures kept but never polled), it wakes every waiting future, as the timer's
/// next firing would, which does not come: the timer is re-armed only by a run of the driver.
/// A deferred pass ([`Waiter::defer`]) arms it too, unless it is armed already
/// ([`DriverWaker::watch`]); when it fires after a pass started, but a pass deferred after that
/// one is owed and the driver has something to do, it is armed again (review25 R1, review26 S1).
struct Watchdog {
    runtime: Arc<dyn Runtime>,
    timer: Pin<Box<dyn AsyncTimer>>,
    /// Its timer's waker: [`WatchdogWaker`].
    waker: Waker,
}

/// The [`Watchdog`]'s timer's waker; weak, as the timer (which keeps it) belongs to the
/// [`DriverWaker`].
struct WatchdogWaker(std::sync::Weak<DriverWaker>);

impl Wake for WatchdogWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(driver) = self.0.upgrade() {
            driver.wake_unclaimed();
        }
    }
}

/// The waker the driver's timer holds: a wake of [`DriverWaker`] that, while no woken future has
/// run the driver, wakes every waiting future ([`DriverWaker::wake_timer`]).
struct TimerWaker(Arc<DriverWaker>);

impl Wake for TimerWaker {
    fn wake(self: Arc<Self>) {
        self.0.wake_timer();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.wake_timer();
    }
}

/// The end of [`Waiting`]'s list.
const NO_SLOT: usize = usize::MAX;

/// Who runs the driver next: one slot per [`Waiter`], and the registered ones in a list, most
/// recent first, from which [`DriverWaker::wake_one`] takes. Registering, leaving and waking
/// cost the same however many futures wait (house rule 9, review6 finding 7).
struct Waiting {
    slots: Vec<WaiterSlot>,
    /// Slots of dropped waiters, for reuse.
    free: Vec<usize>,
    /// The most recently registered slot, or [`NO_SLOT`].
    head: usize,
    /// How many the next wake wakes while no woken future has run the driver (doubles with each
    /// such wake; two again with the first wake after a round).
    escalation: usize,
}

/// A waiter's slot: its task's waker while registered, and its neighbours in the list.
struct WaiterSlot {
    waker: Option<Waker>,
    prev: usize,
    next: usize,
}

impl Default for Waiting {
    fn default() -> Waiting {
        Waiting {
            slots: Vec::new(),
            free: Vec::new(),
            head: NO_SLOT,
            escalation: 2,
        }
    }
}

impl Waiting {
    /// A slot for a new waiter.
    fn open(&mut self) -> usize {
        self.free.pop().unwrap_or_else(|| {
            self.slots.push(WaiterSlot {
                waker: None,
                prev: NO_SLOT,
                next: NO_SLOT,
            });
            self.slots.len() - 1
        })
    }

    /// `slot`'s task waits with `waker`: first in the list when it was not registered.
    fn register(&mut self, slot: usize, waker: &Waker) {
        let head = self.head;
        let entry = &mut self.slots[slot];
        match &mut entry.waker {
            Some(current) => {
                if !current.will_wake(waker) {
                    *current = waker.clone();
                }
            }
            None => {
                entry.waker = Some(waker.clone());
                entry.prev = NO_SLOT;
                entry.next = head;
                if head != NO_SLOT {
                    self.slots[head].prev = slot;
                }
                self.head = slot;
            }
        }
    }

    /// Takes `slot` out of the list, with its waker, if it is registered.
    fn unregister(&mut self, slot: usize) -> Option<Waker> {
        let entry = &mut self.slots[slot];
        let waker = entry.waker.take()?;
        let (prev, next) = (entry.prev, entry.next);
        match prev {
            NO_SLOT => self.head = next,
            prev => self.slots[prev].next = next,
        }
        if next != NO_SLOT {
            self.slots[next].prev = prev;
        }
        Some(waker)
    }

    /// The most recently registered waker, taken out of the list.
    fn pop(&mut self) -> Option<Waker> {
        match self.head {
            NO_SLOT => None,
            head => self.unregister(head),
        }
    }

    /// Frees `slot` for reuse (its waiter is dropped).
    fn close(&mut self, slot: usize) {
        self.unregister(slot);
        self.free.push(slot);
    }
}

impl DriverWaker {
    /// The waker of a new [`LocalDriver`] on `runtime` (whose timer is its [`Watchdog`]'s),
    /// with something to do (the engine's first connections).
    fn new(runtime: Arc<dyn Runtime>) -> Arc<DriverWaker> {
        let waker = Arc::new(DriverWaker {
            dirty: AtomicBool::new(true),
            claimed: AtomicBool::new(false),
            running: AtomicBool::new(false),
            passes: AtomicU64::new(0),
            watched: AtomicU64::new(0),
            waiting: Mutex::new(Waiting::default()),
            watchdog: Mutex::new(None),
            watching: AtomicBool::new(false),
            deferred: AtomicU64::new(0),
        });
        *lock(&waker.watchdog) = Some(Watchdog {
            timer: runtime.new_timer(Instant::MAX),
            runtime,
            waker: Waker::from(Arc::new(WatchdogWaker(Arc::downgrade(&waker)))),
        });
        waker
    }

    /// Wakes one waiting future: it runs the driver when polled (a hand-off from a future that
    /// leaves, or from one that used up its passes, `after_round`: the wakes after it escalate
    /// from two again, as after any round, since the wakes during the round woke nobody).
    fn wake_one(&self, after_round: bool) {
        self.claimed.store(false, Ordering::Release);
        let waker = {
            let mut waiting = lock(&self.waiting);
            if after_round {
                waiting.escalation = 2;
            }
            waiting.pop()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Wakes the futures a wake of the driver wakes: two for the wake that set the flag (`fresh`),
    /// then, while none of them has run the driver, twice as many as the wake before, or every
    /// waiting future (`all`). Each runs the driver when polled.
    fn wake_escalating(&self, fresh: bool, all: bool) {
        self.claimed.store(false, Ordering::Release);
        let mut pair: [Option<Waker>; 2] = [None, None];
        let mut more = Vec::new();
        {
            let mut waiting = lock(&self.waiting);
            if fresh {
                waiting.escalation = 2;
            }
            let count = if all { usize::MAX } else { waiting.escalation };
            if !fresh {
                waiting.escalation = waiting.escalation.saturating_mul(2);
            }
            for slot in &mut pair {
                *slot = waiting.pop();
            }
            if count > 2 {
                while more.len() < count - 2 {
                    match waiting.pop() {
                        Some(waker) => more.push(waker),
                        None => break,
                    }
                }
            }
        }
        for waker in pair.into_iter().flatten().chain(more) {
            waker.wake();
        }
    }

    /// A wake from the driver's timer: like any other, except that while none of the futures
    /// woken before has run the driver it wakes every waiting future, so a deadline is never
    /// missed however many woken futures are never polled (house rule 8).
    ///
    /// A firing during a pass only sets the flag ([`DriverWaker::pass_sees_it`]): the pass
    /// handles the deadline itself.
    fn wake_timer(&self) {
        let fresh = !self.dirty.swap(true, Ordering::AcqRel);
        if (fresh || !self.claimed.load(Ordering::Acquire)) && !self.pass_sees_it() {
            // Armed before the wake: no pass started by a future it wakes is counted as before.
            if fresh {
                self.arm_watchdog();
            }
            self.wake_escalating(fresh, !fresh);
        }
    }

    /// After a wake set `dirty`: whether a pass of the driver runs, which will see the flag
    /// ([`DriverWaker::end_pass`]), so that the wake wakes no future (house rule 9, review11
    /// finding 2: the woken would only find the lock taken).
    fn pass_sees_it(&self) -> bool {
        // Pairs with `end_pass`'s fence: either that pass reads `dirty` as set, or this reads
        // `running` as clear.
        fence(Ordering::SeqCst);
        self.running.load(Ordering::Acquire)
    }

    /// Starts a pass of the driver, whose lock `driver` is: from now on a wake only sets `dirty`,
    /// and the futures woken before have been served (`claimed`).
    fn start_pass<'a>(&'a self, driver: MutexGuard<'a, Option<Driver>>) -> Pass<'a> {
        self.running.store(true, Ordering::Release);
        self.passes.fetch_add(1, Ordering::AcqRel);
        self.claimed.store(true, Ordering::Release);
        self.dirty.store(false, Ordering::Release);
        Pass {
            waker: self,
            driver,
        }
    }

    /// Ends `pass`; returns whether the driver has something to do again (a wake came during the
    /// pass, and only set `dirty`, or since): then its runner runs another pass or hands off.
    ///
    /// The order closes the race at the end of a pass: `running` is cleared, then the lock let
    /// go (both by `Pass`'s drop, in that order), then a SeqCst fence, then `dirty` is read. A
    /// wake writes `dirty`, then a SeqCst fence, then reads `running`
    /// ([`DriverWaker::pass_sees_it`]). Of the two fences, the one later in their single total
    /// order sees the other side's write: either this reads `dirty` set, or the wake reads
    /// `running` clear and wakes futures as when no pass runs. A wake between the clear and the
    /// unlock may read `running` clear while its futures still find the lock held: those return,
    /// and this pass, whose fence then comes after the wake's, reads `dirty` set. No wake goes
    /// unseen, as one read between this read and the clear could. The clear must come before the
    /// unlock: after it, it could overwrite the `running` of a pass another future started.
    fn end_pass(&self, pass: Pass<'_>) -> bool {
        drop(pass);
        fence(Ordering::SeqCst);
        self.dirty.load(Ordering::Acquire)
    }

    /// Arms the [`Watchdog`] for [`UNCLAIMED_TIMER_GRACE`] from now, for the passes started so
    /// far (read under its lock, so a later arming never records an older count).
    fn arm_watchdog(&self) {
        self.arm(lock(&self.watchdog));
    }

    /// Review25 R1: a future waits for a deferred pass ([`Waiter::defer`]), whose future may
    /// never be polled again: the [`Watchdog`] is armed if it is not (one timer setting per
    /// [`UNCLAIMED_TIMER_GRACE`] at most while deferrals come, not one per deferral). With no
    /// pass started by the time it fires, it wakes every waiting future; with one started but
    /// the deferred pass owed since, it is armed again; so the futures waiting for a deferred
    /// pass are woken at most twice that grace after it was deferred.
    ///
    /// Review26 S2: the deferral (`dirty`, `deferred`, the registration) is written before a
    /// SeqCst fence, then `watching` read; a firing ([`DriverWaker::wake_unclaimed`]) clears
    /// `watching`, then a SeqCst fence, then reads `dirty` and `deferred`. As for
    /// [`DriverWaker::pass_sees_it`] and [`DriverWaker::end_pass`], of the two fences the one
    /// later in their single total order sees the other side's writes: either this reads
    /// `watching` clear and arms the watchdog, or the firing reads the deferral and wakes every
    /// waiting future or arms again. With acquire and release alone both could read the old
    /// values (store buffering): a deferral owed with no watchdog armed.
    #[inline]
    fn watch(&self) {
        fence(Ordering::SeqCst);
        if !self.watching.load(Ordering::Acquire) {
            self.arm_unless_armed();
        }
    }

    /// [`DriverWaker::watch`] found the [`Watchdog`] unarmed: armed unless another did it since.
    #[cold]
    fn arm_unless_armed(&self) {
        let watchdog = lock(&self.watchdog);
        if !self.watching.load(Ordering::Acquire) {
            self.arm(watchdog);
        }
    }

    /// Arms the [`Watchdog`], whose lock `watchdog` is, as [`DriverWaker::arm_watchdog`] says.
    fn arm(&self, mut watchdog: MutexGuard<'_, Option<Watchdog>>) {
        self.watched
            .store(self.passes.load(Ordering::Acquire), Ordering::Release);
        let Some(Watchdog {
            runtime,
            timer,
            waker,
        }) = watchdog.as_mut()
        else {
            return;
        };
        self.watching.store(true, Ordering::Release);
        timer
            .as_mut()
            .reset(runtime.now().saturating_add(UNCLAIMED_TIMER_GRACE));
        let fired = timer.as_mut().poll(&mut Context::from_waker(waker));
        drop(watchdog);
        if fired.is_ready() {
            self.wake_unclaimed();
        }
    }

    /// A waiting future leaves (done or dropped): if the driver has something to do and no pass
    /// runs (which would see the flag when it ends), another waiting future runs it, as the one
    /// leaving may have been woken for it. One woken by a wake that found no pass running reads
    /// `running` after that wake did (the wake took it out of the list under the list's lock
    /// first), so it reads no older `running` set.
    ///
    /// While a deferred pass is owed ([`Waiter::defer`]), its future runs it: nobody is woken.
    fn hand_off(&self) {
        if self.dirty.load(Ordering::Acquire)
            && !self.running.load(Ordering::Acquire)
            && !self.owed()
        {
            self.wake_one(false);
        }
    }

    /// Whether a deferred pass is owed ([`Waiter::defer`]): deferred, and no pass of the driver
    /// started since (review25 R1: one that did started the deferred operations).
    fn owed(&self) -> bool {
        self.deferred.load(Ordering::Acquire) == self.owed_now()
    }

    /// What `deferred` holds while a pass deferred since the last pass started is owed: the
    /// count of passes plus one (never 0, "none", before 2^64 passes).
    fn owed_now(&self) -> u64 {
        self.passes.load(Ordering::Acquire).wrapping_add(1)
    }

    /// The [`Watchdog`] fired: every waiting future is woken if the driver has something to do
    /// and no pass of it has started since the watchdog was armed (house rule 9, review12
    /// finding 3: a later wake clears `claimed`, so that flag cannot tell). Otherwise, while a
    /// deferred pass is owed, it is armed again (review25 R1: the pass that started was before
    /// the deferral), but only if the driver has something to do (review26 S1: with `dirty`
    /// clear, the pass that cleared it took the deferred operations, and the wake an arming
    /// prepares needs `dirty`; armed regardless, it fired every grace while the client idled).
    fn wake_unclaimed(&self) {
        let watchdog = lock(&self.watchdog);
        self.watching.store(false, Ordering::Release);
        // Pairs with `watch`'s fence (review26 S2).
        fence(Ordering::SeqCst);
        let dirty = self.dirty.load(Ordering::Acquire);
        if dirty && self.passes.load(Ordering::Acquire) == self.watched.load(Ordering::Acquire) {
            drop(watchdog);
            self.wake_escalating(false, true);
        } else if dirty && self.owed() {
            self.arm(watchdog);
        }
    }
}

impl Wake for DriverWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    /// The wake that sets the flag wakes two waiting futures, so that one its caller never polls
    /// stops nobody (review9 finding 1); while the flag is set, a wake wakes more only if none
    /// of the woken has run the driver yet, twice as many as the wake before (review10 finding
    /// 2): otherwise the one running it re-checks the flag when done (one wake per burst, house
    /// rule 9).
    ///
    /// A wake during a pass of the driver wakes nobody: the pass sees the flag when it ends
    /// (review11 finding 2).
    fn wake_by_ref(self: &Arc<Self>) {
        let fresh = !self.dirty.swap(true, Ordering::AcqRel);
        if (fresh || !self.claimed.load(Ordering::Acquire)) && !self.pass_sees_it() {
            self.wake_escalating(fresh, false);
        }
    }
}

/// Driving passes in one poll, before the poller yields to its executor (it wakes itself when
/// the driver still has something to do).
const PASSES_PER_POLL: usize = 4;

impl LocalDriver {
    pub(crate) fn new(mut driver: Driver) -> LocalDriver {
        let waker = DriverWaker::new(driver.runtime.clone());
        driver.timer_waker = Some(Waker::from(Arc::new(TimerWaker(waker.clone()))));
        driver.count_results = true;
        LocalDriver {
            driver: Mutex::new(Some(driver)),
            driver_waker: Waker::from(waker.clone()),
            waker,
        }
    }

    /// A place among the futures waiting on the driver, for one client future; its slot is
    /// opened when it first registers ([`Waiter::drive`], [`Waiter::defer`]; issue 9: under
    /// that lock, not one of its own).
    pub(crate) fn waiter(self: &Arc<Self>) -> Waiter {
        Waiter {
            local: self.clone(),
            slot: AtomicUsize::new(NO_SLOT),
            deferring: AtomicU64::new(0),
        }
    }

    /// Marks the driver as having something to do without waking anyone: for a future that
    /// queued work and runs the driver itself next ([`Waiter::drive`]). A plain store: a pass
    /// ending meanwhile sees it, or the runner's next look at the lock sees that pass's end
    /// ([`LocalDriver::lock_after_fence`], review28 U5).
    pub(crate) fn mark(&self) {
        self.waker.dirty.store(true, Ordering::Release);
    }

    /// Runs the driver if it has something to do and no one else runs it (that one re-checks
    /// the flag when it is done). Returns whether the driver has stopped (shut down).
    pub(crate) fn run(&self, cx: &Context<'_>) -> bool {
        let waker = &*self.waker;
        let mut driver_cx = Context::from_waker(&self.driver_waker);
        if !waker.dirty.load(Ordering::Acquire) {
            return false;
        }
        for _ in 0..PASSES_PER_POLL {
            let guard = match self.driver.try_lock() {
                Ok(guard) => guard,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => match self.lock_after_fence() {
                    Some(guard) => guard,
                    None => return false,
                },
            };
            let mut pass = waker.start_pass(guard);
            let Some(driver) = pass.driver.as_mut() else {
                return true;
            };
            // Review25 R2: only the results this pass wakes callers for count from now on.
            driver.shared.results_to_take.new_pass();
            if Pin::new(driver).poll(&mut driver_cx).is_ready() {
                // Shut down: the driver (and its engine and sockets) goes now.
                *pass.driver = None;
                drop(pass);
                waker.wake_one(false);
                return true;
            }
            if !waker.end_pass(pass) {
                return false;
            }
        }
        // Passes used up with work left: come back after the executor's other tasks, and hand
        // the work to a waiting future too (no wake comes while the flag is set, and `cx` may be
        // no task's, as when the last client goes).
        cx.waker().wake_by_ref();
        waker.wake_one(true);
        false
    }

    /// [`LocalDriver::run`] found the lock held: tries it once more after a SeqCst fence, and
    /// returns it if it was let go meanwhile (house rule 8, review28 U5; the contended path only).
    ///
    /// The fence pairs with [`DriverWaker::end_pass`]'s. The caller set `dirty` (a wake, or
    /// [`LocalDriver::mark`], a plain store) before this fence; the pass P holding the lock lets
    /// it go, then fences, then reads `dirty`. Of the two fences, the one later in their single
    /// total order sees the other side's write: either P reads `dirty` set and runs another pass
    /// or hands off, or this try sees P's unlock (the lock free, or taken by a later holder,
    /// whose pass starts after the caller queued its work and so takes it, by the state mutex's
    /// order, or which reads `dirty` set at its own end). That second branch assumes what std
    /// does not document (review29 V8): that a `Mutex`'s state is one atomic, which `try_lock`
    /// reads and the unlock writes by a release read-modify-write, so the fence rules hold for
    /// it as for `dirty`. Even that an unlock happens before the lock taken after it is
    /// undocumented (rust-lang/rust issue 126239, "Mutex isn't guaranteed to have atomic
    /// acquire/release semantics", checked in review30 W8), and says nothing of a failed try;
    /// std's futex and pthread mutexes are built as assumed. Without the fence, P could read
    /// `dirty` clear while the failed try saw the lock held: the caller's operation queued and
    /// no one to run the driver, with no timer behind it in load-balanced mode. Acquire and
    /// release alone allow it (store buffering), though x86-64 (a locked compare-exchange) and
    /// ARMv8 (a release store then an acquire load) order it anyway.
    #[cold]
    #[inline(never)]
    fn lock_after_fence(&self) -> Option<MutexGuard<'_, Option<Driver>>> {
        fence(Ordering::SeqCst);
        match self.driver.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// A pass of a [`LocalDriver`]: its lock, held while [`DriverWaker`]'s `running` is set. Its
/// drop (also when the driver panics) clears the flag, then lets the lock go.
struct Pass<'a> {
    waker: &'a DriverWaker,
    driver: MutexGuard<'a, Option<Driver>>,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        // Before the fields: the lock is let go after this.
        self.waker.running.store(false, Ordering::Release);
    }
}

/// One client future's place among those waiting on the driver ([`LocalDriver`]); it leaves
/// when dropped.
pub(crate) struct Waiter {
    local: Arc<LocalDriver>,
    /// Its slot in [`Waiting`], or [`NO_SLOT`] before it first registers ([`Waiter::drive`],
    /// [`Waiter::defer`]; review25 R5). Read and
    /// written under the list's lock (atomic only so that a shared waiter may open it).
    slot: AtomicUsize,
    /// What it set the driver's `deferred` to ([`Waiter::defer`]), if it has not been polled
    /// since, or 0: the pass is its to run.
    deferring: AtomicU64,
}

impl Waiter {
    /// Registers `cx`'s task as waiting (in a slot opened now, the first time) and runs the
    /// driver if it has something to do and no one else runs it.
    pub(crate) fn drive(&self, cx: &Context<'_>) {
        self.resume();
        self.register(cx);
        self.local.run(cx);
    }

    /// Registers `cx`'s task as waiting, in a slot opened now the first time.
    fn register(&self, cx: &Context<'_>) {
        let mut waiting = lock(&self.local.waker.waiting);
        let mut slot = self.slot.load(Ordering::Relaxed);
        if slot == NO_SLOT {
            slot = waiting.open();
            self.slot.store(slot, Ordering::Relaxed);
        }
        waiting.register(slot, cx.waker());
    }

    /// Runs the driver as [`Waiter::drive`] does, without registering `cx`'s task: for a future
    /// whose result is in, which returns it now and waits no more. While another future owes a
    /// deferred pass ([`Waiter::defer`]), it leaves the driver to that one.
    pub(crate) fn run(&self, cx: &Context<'_>) {
        if !self.resume() && self.local.waker.owed() {
            return;
        }
        self.local.run(cx);
    }

    /// For the first poll of an operation queued while other callers have results to take
    /// ([`Shared::results_to_take`](crate::shared::Shared::results_to_take), issue 9): those
    /// callers are about to be polled and may queue operations of their own, and one pass of
    /// the driver can start them all, where each first poll would run a pass of its own (about
    /// 500 instructions besides the starts). The driver is marked ([`LocalDriver::mark`])
    /// first. The first future to defer (one: it claims the pass by a compare-exchange) wakes
    /// its own task, to run the pass when polled again:
    /// the pass is owed (`deferred`) until that poll, its drop, or the start of any pass (which
    /// starts the deferred operations; review25 R1). Meanwhile the futures polled register and
    /// leave the pass to it, as do callers taking their results ([`Waiter::run`]) and leaving
    /// ([`DriverWaker::hand_off`]); a first poll that finds no result left to take runs the
    /// pass itself ([`Waiter::drive`]), starting them all. Dropped before its next poll, the
    /// deferring future hands the pass on ([`Waiter`]'s `Drop`).
    ///
    /// The bound (house rule 8) when the deferring future is kept but never polled again (a
    /// `select` that another branch won): every deferral arms the [`Watchdog`] unless it is
    /// armed ([`DriverWaker::watch`]), so the futures waiting for the pass are woken, and run
    /// it, at most twice [`UNCLAIMED_TIMER_GRACE`] after the deferral, with no other wake of
    /// the driver (none may come: in load-balanced mode nothing else is timed). For the wake
    /// protocol the deferring future is also one a wake of the driver woke (out of the waiting
    /// list, `claimed` clear), so that wakes before the pass escalate as for woken futures
    /// never polled.
    pub(crate) fn defer(&self, cx: &Context<'_>) {
        let waker = &self.local.waker;
        let owed = waker.owed_now();
        let mut seen = waker.deferred.load(Ordering::Acquire);
        #[cfg(test)]
        tests::before_claim();
        // Review26 S3: claimed by a compare-exchange, so that one future owes the pass, and a
        // claim made with a count of passes read before a pass started cannot overwrite the
        // claim of a future that read the newer count. Bounded by the concurrent changes: each
        // failure is another's claim or resume.
        loop {
            // Owed by another future: its pass starts this one's operation too, or one that
            // started since this one read the count did.
            if seen == owed || seen == waker.owed_now() {
                self.register(cx);
                waker.watch();
                return;
            }
            match waker
                .deferred
                .compare_exchange(seen, owed, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
        self.deferring.store(owed, Ordering::Relaxed);
        // As for the first wake after a round: the wakes after it escalate from two.
        lock(&waker.waiting).escalation = 2;
        waker.claimed.store(false, Ordering::Release);
        waker.watch();
        cx.waker().wake_by_ref();
    }

    /// Polled again (or leaving) after deferring a pass ([`Waiter::defer`]): the pass is this
    /// caller's to run or hand on now, and the next first poll may defer again. Returns whether
    /// it had deferred.
    fn resume(&self) -> bool {
        let owed = self.deferring.load(Ordering::Relaxed);
        if owed == 0 {
            return false;
        }
        self.deferring.store(0, Ordering::Relaxed);
        // Unless another future deferred a pass of its own since (after a pass started).
        let _ = self.local.waker.deferred.compare_exchange(
            owed,
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        true
    }

    /// Stops waiting (the future is done); if the driver has something to do, another waiting
    /// future runs it (this one may have been the one woken for it).
    pub(crate) fn leave(&self) {
        self.resume();
        let waker = &self.local.waker;
        {
            let mut waiting = lock(&waker.waiting);
            let slot = self.slot.load(Ordering::Relaxed);
            if slot != NO_SLOT {
                waiting.unregister(slot);
            }
        }
        waker.hand_off();
    }
}

impl Drop for Waiter {
    /// [`Waiter::leave`], and its slot freed, under one lock.
    fn drop(&mut self) {
        self.resume();
        let waker = &self.local.waker;
        let slot = *self.slot.get_mut();
        if slot != NO_SLOT {
            lock(&waker.waiting).close(slot);
        }
        waker.hand_off();
    }
}

/// Writes `outgoing[*written..]` to `stream` as far as it goes without waiting (a `Pending`
/// write registers the socket's waker); emptied once written. Returns whether bytes went out,
/// and the failure that ends the socket, if any.
fn write_outgoing(
    stream: &mut Pin<Box<dyn Socket>>,
    cx: &mut Context<'_>,
    outgoing: &mut Vec<u8>,
    written: &mut usize,
) -> (bool, Option<(NetworkErrorKind, NetworkCause)>) {
    let mut wrote = false;
    while *written < outgoing.len() {
        match stream.as_mut().poll_write(cx, &outgoing[*written..]) {
            Poll::Pending => break,
            Poll::Ready(Ok(0)) => return (wrote, Some(closed_by_peer())),
            Poll::Ready(Ok(n)) => {
                *written += n;
                if *written == outgoing.len() {
                    outgoing.clear();
                    *written = 0;
                }
                wrote = true;
            }
            Poll::Ready(Err(error)) => return (wrote, Some(classify_io_error(&error, false))),
        }
    }
    (wrote, None)
}

/// The peer closed the stream (a read or write of zero bytes).
fn closed_by_peer() -> (NetworkErrorKind, NetworkCause) {
    (
        NetworkErrorKind::Closed,
        NetworkCause::io("UnexpectedEof", "the server closed the connection"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::atomic::AtomicUsize;

    use retry_core::error::ErrorKind;

    thread_local! {
        /// Review28 U6: what [`Waiter::defer`] runs on this thread between its reads (of the
        /// count of passes and of `deferred`) and its claim, once: the interleavings of the
        /// claim loop (review26 S3), made deterministic.
        static BEFORE_CLAIM: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    }

    /// Runs (and clears) the [`BEFORE_CLAIM`] hook, if one is set.
    pub(super) fn before_claim() {
        if let Some(hook) = BEFORE_CLAIM.with(|hook| hook.borrow_mut().take()) {
            hook();
        }
    }

    /// A task's waker that counts its wakes.
    struct Counted(AtomicUsize);

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn tasks(n: usize) -> Vec<Arc<Counted>> {
        (0..n)
            .map(|_| Arc::new(Counted(AtomicUsize::new(0))))
            .collect()
    }

    fn woken(tasks: &[Arc<Counted>]) -> usize {
        tasks.iter().map(|t| t.0.load(Ordering::Relaxed)).sum()
    }

    /// House rule 9: a wake of the driver (a socket ready) wakes two of the tasks waiting on the
    /// client, however many wait; once one of them runs the driver, more wakes before the run
    /// ends wake nobody else (it re-checks the flag when done); the next wake after a run wakes
    /// two more.
    #[test]
    fn a_wake_wakes_two_waiting_tasks_however_many_wait() {
        let driver = Arc::new(DriverWaker::default());
        let tasks = tasks(64);
        for task in &tasks {
            let mut waiting = lock(&driver.waiting);
            let slot = waiting.open();
            waiting.register(slot, &Waker::from(task.clone()));
        }
        let waker = Waker::from(driver.clone());
        waker.wake_by_ref();
        assert_eq!(woken(&tasks), 2);
        assert!(driver.dirty.load(Ordering::Acquire));
        // A woken task ran a pass of the driver (what `LocalDriver::run` does), and a wake comes
        // after it: it sets the flag again, so it wakes two.
        driver.claimed.store(true, Ordering::Release);
        driver.dirty.store(false, Ordering::Release);
        waker.wake_by_ref();
        assert_eq!(woken(&tasks), 4);
        // One of them ran the driver (`claimed`): further wakes while the flag is set wake nobody.
        driver.claimed.store(true, Ordering::Release);
        waker.wake_by_ref();
        waker.wake_by_ref();
        assert_eq!(woken(&tasks), 4, "the running task re-checks the flag");
        assert_eq!(registered(&lock(&driver.waiting)), 60);
    }

    /// Registers `tasks` as waiting on `driver`, in order (the last is the most recent).
    fn register_all(driver: &DriverWaker, tasks: &[Arc<Counted>]) {
        let mut waiting = lock(&driver.waiting);
        for task in tasks {
            let slot = waiting.open();
            waiting.register(slot, &Waker::from(task.clone()));
        }
    }

    /// House rule 8, review9 finding 1, review10 finding 2: the tasks a wake woke may never be
    /// polled (a future kept in a `select` that another branch won): until one of them runs the
    /// driver, every further wake wakes twice as many as the one before (2, 2, 4, 8), so the
    /// others' operations still end; the first wake after a round wakes two again.
    #[test]
    fn woken_tasks_never_polled_stall_nobody() {
        let driver = Arc::new(DriverWaker::default());
        let tasks = tasks(20);
        register_all(&driver, &tasks);
        let waker = Waker::from(driver.clone());
        waker.wake_by_ref();
        assert_eq!(woken(&tasks), 2, "a runner and one more");
        // None runs the driver: each later wake wakes twice as many as the one before.
        for total in [4, 8, 16] {
            waker.wake_by_ref();
            assert_eq!(woken(&tasks), total);
        }
        waker.wake_by_ref();
        assert_eq!(woken(&tasks), 20, "the four left");
        assert_eq!(registered(&lock(&driver.waiting)), 0);
        // All were woken once (each re-registers when polled): nothing more to wake.
        waker.wake_by_ref();
        assert_eq!(woken(&tasks), 20);
        // Ten re-register, a round runs: the next wake wakes two again.
        register_all(&driver, &tasks[..10]);
        driver.claimed.store(true, Ordering::Release);
        driver.dirty.store(false, Ordering::Release);
        waker.wake_by_ref();
        assert_eq!(woken(&tasks), 22, "two again after a round");
    }

    /// House rule 8, review10 finding 2: a live task registered first, then three that
    /// are never polled; a socket's wake, then the deadline timer's wake: the live task is woken
    /// (before, the three absorbed both wakes and the operation outlived its timeoutMS).
    #[test]
    fn cs4_unpolled_woken_futures_cannot_outlast_the_deadline_wake() {
        let driver = Arc::new(DriverWaker::default());
        let live = tasks(1);
        let unpolled = tasks(3);
        register_all(&driver, &live);
        register_all(&driver, &unpolled);
        Waker::from(driver.clone()).wake_by_ref();
        Waker::from(Arc::new(TimerWaker(driver.clone()))).wake_by_ref();
        assert_eq!(woken(&live), 1, "the live task runs the driver");
    }

    /// House rule 8, review10 finding 2: however many never-polled futures are registered
    /// ahead of a live one, the driver's timer firing while none of the woken has run the
    /// driver wakes every waiting future; with a round claimed, it wakes two like any wake.
    #[test]
    fn cs4_the_deadline_timer_wakes_every_waiter_while_unclaimed() {
        let driver = Arc::new(DriverWaker::default());
        let live = tasks(1);
        let unpolled = tasks(100);
        register_all(&driver, &live);
        register_all(&driver, &unpolled);
        let timer = Waker::from(Arc::new(TimerWaker(driver.clone())));
        // A round runs and claims: the timer's wake is the first, it wakes two.
        driver.claimed.store(true, Ordering::Release);
        driver.dirty.store(false, Ordering::Release);
        timer.wake_by_ref();
        assert_eq!(woken(&unpolled), 2);
        assert_eq!(woken(&live), 0);
        // Neither runs the driver; the timer fires again: every waiter is woken.
        timer.wake_by_ref();
        assert_eq!(woken(&unpolled), 100);
        assert_eq!(woken(&live), 1);
        assert_eq!(registered(&lock(&driver.waiting)), 0);
    }

    /// The fake runtimes of these tests differ only in what a poll of one of their timers
    /// does ([`FakeRuntime::poll_timer`]; a timer is a clone of its runtime, sharing its
    /// state): the clock stays at zero, deadlines play no part and no connect ever finishes.
    trait FakeRuntime: Default + Clone + core::fmt::Debug + Send + Sync + 'static {
        /// A poll of one of the runtime's timers.
        fn poll_timer(&self, cx: &mut Context<'_>) -> Poll<()>;
    }

    /// A timer of the fake runtime `R`.
    #[derive(Debug)]
    struct FakeTimer<R>(R);

    impl<R: FakeRuntime> AsyncTimer for FakeTimer<R> {
        fn reset(self: Pin<&mut Self>, _: Instant) {}
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.0.poll_timer(cx)
        }
    }

    impl<R: FakeRuntime> Runtime for R {
        fn start() -> io::Result<R> {
            Ok(R::default())
        }
        fn now(&self) -> Instant {
            Instant::ZERO
        }
        fn new_timer(&self, _: Instant) -> Pin<Box<dyn AsyncTimer>> {
            Box::pin(FakeTimer(self.clone()))
        }
        fn connect(&self, _: String, _: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
            Box::pin(core::future::pending())
        }
    }

    /// A runtime whose timers fire when the test fires them: a polled timer's waker is kept in
    /// `armed`.
    #[derive(Debug, Default, Clone)]
    struct ManualTimers {
        armed: Arc<Mutex<Vec<Waker>>>,
    }

    impl FakeRuntime for ManualTimers {
        fn poll_timer(&self, cx: &mut Context<'_>) -> Poll<()> {
            lock(&self.armed).push(cx.waker().clone());
            Poll::Pending
        }
    }

    /// House rule 8 (the case review10 finding 2 left open): the driver's timer firing is
    /// the first wake after a round, and the two futures it wakes are never polled. The live
    /// future registered before them is woken when the runtime's timers armed meanwhile fire
    /// (the watchdog: one timer per firing, not a wake per waiter), with no other wake of the
    /// driver; before, nothing was armed and it waited for a socket's wake that may never come.
    #[test]
    fn cs4_a_first_wake_by_the_timer_reaches_a_live_future_past_unpolled_ones() {
        let runtime = ManualTimers::default();
        let armed = runtime.armed.clone();
        let driver = DriverWaker::new(Arc::new(runtime));
        let live = tasks(1);
        let unpolled = tasks(50);
        register_all(&driver, &live);
        register_all(&driver, &unpolled);
        let timer = Waker::from(Arc::new(TimerWaker(driver.clone())));
        // A round ran: the timer's firing is the first wake after it.
        driver.claimed.store(true, Ordering::Release);
        driver.dirty.store(false, Ordering::Release);
        timer.wake_by_ref();
        assert_eq!((woken(&live), woken(&unpolled)), (0, 2));
        let fire = || {
            let wakers = core::mem::take(&mut *lock(&armed));
            let count = wakers.len();
            wakers.into_iter().for_each(Waker::wake);
            count
        };
        assert_eq!(fire(), 1, "one timer armed for the firing");
        assert_eq!(woken(&live), 1, "the live future is woken");
        assert_eq!(woken(&unpolled), 50);

        // Next time one of the two woken runs the driver before the watchdog fires: the
        // watchdog wakes nobody more.
        register_all(&driver, &live);
        register_all(&driver, &unpolled);
        driver.dirty.store(false, Ordering::Release);
        timer.wake_by_ref();
        assert_eq!((woken(&live), woken(&unpolled)), (1, 52));
        let driver_lock = Mutex::new(None);
        let pass = driver.start_pass(lock(&driver_lock));
        assert!(!driver.end_pass(pass));
        assert_eq!(fire(), 1);
        assert_eq!((woken(&live), woken(&unpolled)), (1, 52));
    }

    /// House rule 9, review12 finding 3: the driver's timer firing is the first wake after a
    /// pass and arms the watchdog; one of the two it wakes runs a pass; then a socket's wake
    /// wakes two more as usual (and clears `claimed`). The watchdog firing before either of
    /// those runs the driver wakes nobody more: a pass started since it was armed (before, it
    /// woke all 50 waiting, once per such firing).
    #[test]
    fn house_rule_9_the_watchdog_wakes_nobody_after_a_round_ran() {
        let runtime = ManualTimers::default();
        let armed = runtime.armed.clone();
        let driver = DriverWaker::new(Arc::new(runtime));
        let waiting = tasks(50);
        register_all(&driver, &waiting);
        let wake = Waker::from(driver.clone());
        let timer = Waker::from(Arc::new(TimerWaker(driver.clone())));
        let driver_lock = Mutex::new(None);
        let pass = driver.start_pass(lock(&driver_lock));
        assert!(!driver.end_pass(pass));
        timer.wake_by_ref();
        assert_eq!(woken(&waiting), 2);
        assert_eq!(lock(&armed).len(), 1, "the watchdog is armed");
        // One of the two runs a pass; a socket's wake after it wakes two more.
        let pass = driver.start_pass(lock(&driver_lock));
        assert!(!driver.end_pass(pass));
        wake.wake_by_ref();
        assert_eq!(woken(&waiting), 4);
        assert!(!driver.claimed.load(Ordering::Acquire));
        // The watchdog fires while the flag is set and neither of those two has run the driver.
        let wakers = core::mem::take(&mut *lock(&armed));
        assert_eq!(wakers.len(), 1);
        wakers.into_iter().for_each(Waker::wake);
        assert_eq!(woken(&waiting), 4, "no wake of every waiting future");
        assert_eq!(registered(&lock(&driver.waiting)), 46);
    }

    /// House rule 9, review11 finding 2: while a pass of the driver runs, a socket's wake, the
    /// driver's timer firing, a cancel's wake and a waiter leaving only set the flag, which the
    /// pass sees when it ends: no waiting future is woken and no watchdog armed (before, the
    /// socket's wake woke two, and the timer then every one of the 50).
    #[test]
    fn house_rule_9_wakes_during_a_running_round_wake_nobody_more() {
        let runtime = ManualTimers::default();
        let armed = runtime.armed.clone();
        let driver = DriverWaker::new(Arc::new(runtime));
        let waiting = tasks(50);
        register_all(&driver, &waiting);
        // The waker the sockets and the client's queue (cancels, sessions) hold, and the timer's.
        let wake = Waker::from(driver.clone());
        let timer = Waker::from(Arc::new(TimerWaker(driver.clone())));
        let driver_lock = Mutex::new(None);
        let pass = driver.start_pass(lock(&driver_lock));
        wake.wake_by_ref();
        timer.wake_by_ref();
        wake.wake_by_ref();
        driver.hand_off();
        assert_eq!(woken(&waiting), 0);
        assert_eq!(lock(&armed).len(), 0, "no watchdog armed");
        assert!(
            driver.end_pass(pass),
            "the pass sees the wakes when it ends"
        );
        // A pass that takes them ends clean; the next wake, with no pass running, wakes two.
        let pass = driver.start_pass(lock(&driver_lock));
        assert!(!driver.end_pass(pass));
        wake.wake_by_ref();
        assert_eq!(woken(&waiting), 2);
    }

    /// House rule 8, review11 finding 2: a wake at the very end of a pass reaches a live future
    /// in either order. The pass clears `running` before its last look at `dirty`: a wake before
    /// the clear wakes nobody, and the look sees it (its runner, live, runs another pass); a wake
    /// after the look finds `running` clear and wakes two, as when no pass runs, the live future
    /// (registered last) first.
    #[test]
    fn house_rule_8_a_wake_at_the_end_of_a_pass_still_reaches_a_live_future() {
        let driver = Arc::new(DriverWaker::default());
        let unpolled = tasks(3);
        let live = tasks(1);
        register_all(&driver, &unpolled);
        register_all(&driver, &live);
        let wake = Waker::from(driver.clone());
        let driver_lock = Mutex::new(None);
        let pass = driver.start_pass(lock(&driver_lock));
        wake.wake_by_ref();
        assert_eq!((woken(&live), woken(&unpolled)), (0, 0));
        assert!(driver.end_pass(pass), "the runner runs another pass");
        let pass = driver.start_pass(lock(&driver_lock));
        assert!(!driver.end_pass(pass));
        wake.wake_by_ref();
        assert_eq!((woken(&live), woken(&unpolled)), (1, 1));
    }

    /// A runtime that opens no socket and whose timers wake their task whenever polled, without
    /// firing (as a deadline that a pass keeps re-arming).
    #[derive(Debug, Default, Clone)]
    struct RewakingTimers;

    impl FakeRuntime for RewakingTimers {
        fn poll_timer(&self, cx: &mut Context<'_>) -> Poll<()> {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// House rule 9, review11 finding 2, end to end through `LocalDriver::run`: the driver's
    /// timer wakes the driver during each of its passes; the runner sees each wake when the pass
    /// ends and runs the next, and after its last pass hands off to itself and one waiting
    /// future, not to the 50 waiting (before, the first wake woke two and the second all 50).
    #[test]
    fn house_rule_9_a_run_takes_the_wakes_that_come_during_its_passes() {
        let options =
            crate::options::ClientOptions::parse("mongodb://127.0.0.1:27017/?connectTimeoutMS=1")
                .unwrap();
        let engine = Engine::new(options.engine_options().unwrap(), Instant::ZERO).unwrap();
        let driver = Driver::new(
            Arc::new(RewakingTimers),
            engine,
            Arc::new(Shared::default()),
            None,
        );
        let local = LocalDriver::new(driver);
        let waiting = tasks(50);
        register_all(&local.waker, &waiting);
        let runner = tasks(1);
        let runner_waker = Waker::from(runner[0].clone());
        assert!(!local.run(&Context::from_waker(&runner_waker)));
        assert_eq!(woken(&runner), 1, "the runner comes back");
        assert_eq!(woken(&waiting), 1, "and hands off to one");
    }

    /// A runtime that opens no socket and whose timers never fire: the test below drives the
    /// engine's sockets by hand.
    #[derive(Debug, Default, Clone)]
    struct NoIo;

    impl FakeRuntime for NoIo {
        fn poll_timer(&self, _: &mut Context<'_>) -> Poll<()> {
            Poll::Pending
        }
    }

    /// The optional events (EventFamilies: pool, SDAM and heartbeats, retry, hedging) the
    /// engine has queued; the others taken too.
    fn optional_events(engine: &mut Engine) -> usize {
        let mut optional = 0;
        while let Some(event) = engine.poll_event() {
            optional += usize::from(matches!(
                event,
                EngineEvent::Pool { .. }
                    | EngineEvent::Heartbeat { .. }
                    | EngineEvent::Topology(_)
                    | EngineEvent::Hedging { .. }
                    | EngineEvent::Operation { .. }
            ));
        }
        optional
    }

    /// Issue 9, EV-1 (review7 finding 8): the engine queues pool, SDAM, heartbeat, retry and
    /// hedging events only while a client's `events()` stream is alive: each round the driver
    /// turns the families off without one (this fails if `EventFamilies::ALL` were left on) and
    /// on again while one is open.
    #[test]
    fn optional_engine_events_are_queued_only_while_an_events_stream_is_open() {
        let options = crate::options::ClientOptions::parse("mongodb://127.0.0.1:27017").unwrap();
        let engine = Engine::new(options.engine_options().unwrap(), Instant::ZERO).unwrap();
        let shared = Arc::new(Shared::default());
        let mut driver = Driver::new(Arc::new(NoIo), engine, shared.clone(), None);
        let mut cx = Context::from_waker(Waker::noop());
        let at = |ms: u64| Instant::ZERO.saturating_add(Duration::from_millis(ms));
        optional_events(&mut driver.engine);

        // No stream: the monitor connects and sends its hello; no heartbeat event is queued.
        driver.take_requests(&mut cx, at(0));
        driver.engine.handle_timeout(at(0));
        let monitor = driver
            .engine
            .poll_connect()
            .expect("the monitor's socket")
            .conn;
        driver.engine.handle_connected(monitor, at(1));
        assert_eq!(optional_events(&mut driver.engine), 0, "no stream");

        // A stream: its socket closes; heartbeat failed, server and topology changed, pool
        // cleared are queued.
        let stream = Arc::new(crate::shared::EventQueue::default());
        lock(&shared.state).subscribers.push(stream.clone());
        driver.take_requests(&mut cx, at(2));
        driver
            .engine
            .handle_closed(monitor, NetworkErrorKind::Reset, None, at(2));
        assert!(optional_events(&mut driver.engine) > 0, "a stream is open");

        // The stream dropped: the next monitor's socket and hello queue nothing again.
        drop(stream);
        driver.take_requests(&mut cx, at(3));
        let mut now = at(3);
        let monitor = loop {
            driver.engine.handle_timeout(now);
            if let Some(connect) = driver.engine.poll_connect() {
                break connect.conn;
            }
            now = driver.engine.poll_timeout().expect("a monitor timer");
            assert!(now < at(60_000), "the monitor reconnects within a minute");
        };
        driver.engine.handle_connected(monitor, now);
        assert_eq!(
            optional_events(&mut driver.engine),
            0,
            "the stream was dropped"
        );
    }

    /// Issue 9, house rule 9: replies on many sockets in one burst wake the driver once (when its
    /// queue of ready sockets goes from empty to not empty), and every socket is queued once;
    /// after the driver took the queue the next ready socket wakes it again.
    #[test]
    fn a_burst_of_ready_sockets_wakes_the_driver_once() {
        let ready = Arc::new(ReadySockets::default());
        let driver = tasks(1);
        let driver_waker = Waker::from(driver[0].clone());
        let mut taken = Vec::new();
        ready.take(&driver_waker, &mut taken);
        let sockets: Vec<Waker> = (0..64)
            .map(|conn| {
                Waker::from(Arc::new(SocketWaker {
                    conn: ConnId(conn),
                    queued: AtomicBool::new(false),
                    woken: AtomicBool::new(false),
                    sockets: ready.clone(),
                }))
            })
            .collect();
        for socket in sockets.iter().chain(&sockets) {
            socket.wake_by_ref();
        }
        assert_eq!(woken(&driver), 1);
        ready.take(&driver_waker, &mut taken);
        assert_eq!(taken, (0..64).map(ConnId).collect::<Vec<_>>());
        assert!(ready.is_empty());
        // The driver polled them (clearing `queued`); the next reply wakes it again.
        let mut again = Vec::new();
        ready.take(&driver_waker, &mut again);
        let first = Arc::new(SocketWaker {
            conn: ConnId(7),
            queued: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            sockets: ready.clone(),
        });
        Waker::from(first.clone()).wake_by_ref();
        assert_eq!(woken(&driver), 2);
        assert!(
            first.woken.load(Ordering::Acquire),
            "a runtime wake marks the read"
        );
    }

    /// The registered slots, walking the list from its head.
    fn registered(waiting: &Waiting) -> usize {
        let mut count = 0;
        let mut at = waiting.head;
        while at != NO_SLOT && count <= waiting.slots.len() {
            count += 1;
            at = waiting.slots[at].next;
        }
        count
    }

    /// Review6 finding 7, house rule 9: a waiter registers, re-registers, leaves and is woken in
    /// its own slot, without looking at the others: the most recent registration is woken first,
    /// a waiter that left is never woken, and a dropped waiter's slot is reused.
    #[test]
    fn waiters_register_leave_and_wake_in_their_own_slots() {
        let tasks = tasks(3);
        let wakers: Vec<Waker> = tasks.iter().map(|t| Waker::from(t.clone())).collect();
        let mut waiting = Waiting::default();
        let slots: Vec<usize> = (0..3).map(|_| waiting.open()).collect();
        for (slot, waker) in slots.iter().zip(&wakers) {
            waiting.register(*slot, waker);
        }
        waiting.register(slots[0], &wakers[0]);
        assert_eq!(registered(&waiting), 3, "registering again adds nothing");
        assert!(
            waiting.unregister(slots[1]).is_some(),
            "the middle one leaves"
        );
        assert!(waiting.unregister(slots[1]).is_none());
        assert_eq!(registered(&waiting), 2);
        waiting.pop().expect("the last registered").wake();
        assert_eq!(tasks[2].0.load(Ordering::Relaxed), 1);
        waiting.pop().expect("then the first").wake();
        assert_eq!(tasks[0].0.load(Ordering::Relaxed), 1);
        assert!(waiting.pop().is_none());
        assert_eq!(
            tasks[1].0.load(Ordering::Relaxed),
            0,
            "it left: never woken"
        );
        waiting.close(slots[1]);
        assert_eq!(waiting.open(), slots[1], "a freed slot is reused");
        assert_eq!(waiting.slots.len(), 3);
    }

    /// A driver on `runtime` for the client at 127.0.0.1:27017, and what it shares with its
    /// client.
    fn test_driver(runtime: Arc<dyn Runtime>) -> (Driver, Arc<Shared>) {
        let options = crate::options::ClientOptions::parse("mongodb://127.0.0.1:27017").unwrap();
        let engine = Engine::new(options.engine_options().unwrap(), Instant::ZERO).unwrap();
        let shared = Arc::new(Shared::default());
        let driver = Driver::new(runtime, engine, shared.clone(), None);
        (driver, shared)
    }

    /// Polls the driver's task once with `waker`.
    fn poll_task(task: &mut DriverTask, waker: &Waker) -> Poll<()> {
        Pin::new(task).poll(&mut Context::from_waker(waker))
    }

    /// A driver of [`test_driver`] on `runtime`, spawned: what it shares with its client, the
    /// driver, its task (not yet polled), and the waker the executor polls the task with, which
    /// counts its wakes in the one task of the `Vec`.
    fn spawned_task(
        runtime: Arc<dyn Runtime>,
    ) -> (
        Arc<Shared>,
        Arc<SpawnedDriver>,
        DriverTask,
        Vec<Arc<Counted>>,
        Waker,
    ) {
        let (driver, shared) = test_driver(runtime);
        let spawned = SpawnedDriver::new(driver);
        let task = spawned.task();
        let counted = tasks(1);
        let waker = Waker::from(counted[0].clone());
        (shared, spawned, task, counted, waker)
    }

    /// House rule 8 (the start-up gap): the executor polls the task for the first time
    /// while a caller tries an inline pass. The first poll is never refused: before the task
    /// has stored its waker no caller takes the driver's lock (before, a caller held it while it
    /// found no waker and returned, the refused task had given its waker to nobody, and the
    /// client's queue had none yet: no wake ever came).
    #[test]
    fn house_rule_8_the_tasks_first_poll_is_never_refused() {
        let (shared, spawned, mut task, counted, waker) = spawned_task(Arc::new(NoIo));
        // A caller's inline pass starts just as the executor polls the task the first time.
        let claim = spawned.claim();
        assert!(poll_task(&mut task, &waker).is_pending());
        drop(claim);
        let ran = lock(&shared.state).driver.is_some();
        assert!(
            ran || woken(&counted) > 0,
            "the task ran the driver, or is woken to"
        );
        assert!(ran, "the first poll ran the driver");
        assert!(spawned.run_inline(), "callers run passes from then on");
    }

    /// House rule 8: the task is polled while a caller runs an inline pass (its poll is
    /// refused); the caller wakes it when it lets go, and its next poll runs the driver.
    /// A guarantee pin, not evidence for 6584392's fix: it passes without it too. It fails if
    /// the caller's `missed` check after its pass is dropped (checked by removing it).
    #[test]
    fn house_rule_8_a_task_refused_during_an_inline_pass_is_woken_after_it() {
        let (shared, spawned, mut task, counted, waker) = spawned_task(Arc::new(NoIo));
        assert!(poll_task(&mut task, &waker).is_pending());
        let claim = spawned.claim().expect("the driver is free");
        assert!(poll_task(&mut task, &waker).is_pending(), "refused");
        assert_eq!(woken(&counted), 0);
        drop(claim);
        assert_eq!(woken(&counted), 1, "woken when the caller lets go");
        lock(&shared.state).driver = None;
        assert!(poll_task(&mut task, &waker).is_pending());
        assert!(lock(&shared.state).driver.is_some(), "the next poll ran it");
        // No further wake is owed: a clean inline pass wakes nobody.
        assert!(spawned.run_inline());
        assert_eq!(woken(&counted), 1);
    }

    /// A runtime whose timers, like tokio's `Sleep` when the task's coop budget is used up,
    /// refuse a poll while `refuse` is set: they wake the poller and keep no waker, at once, or
    /// with `defer` set, later (the waker goes to `deferred`, which the test wakes after the
    /// task's poll, as tokio defers a coop wake to the end of the task's poll). Otherwise a
    /// polled timer keeps its waker in `armed` (the test fires it).
    #[derive(Debug, Default, Clone)]
    struct RefusingTimers {
        refuse: Arc<AtomicBool>,
        defer: Arc<AtomicBool>,
        deferred: Arc<Mutex<Vec<Waker>>>,
        armed: Arc<Mutex<Vec<Waker>>>,
    }

    impl FakeRuntime for RefusingTimers {
        fn poll_timer(&self, cx: &mut Context<'_>) -> Poll<()> {
            if self.refuse.load(Ordering::Relaxed) {
                if self.defer.load(Ordering::Relaxed) {
                    lock(&self.deferred).push(cx.waker().clone());
                } else {
                    cx.waker().wake_by_ref();
                }
            } else {
                let mut armed = lock(&self.armed);
                armed.retain(|w| !w.will_wake(cx.waker()));
                armed.push(cx.waker().clone());
            }
            Poll::Pending
        }
    }

    /// House rule 8: a poll of the runtime's timer that returns `Pending` and wakes the
    /// task instead of keeping its waker (tokio's coop budget) leaves the timer unarmed; the
    /// task's next poll (that wake's) polls it again, and its firing then wakes the task.
    /// Before, the driver took the refused poll as armed and never polled the timer again for
    /// that deadline: its firing woke nobody and the client stalled (no timer registered).
    #[test]
    fn house_rule_8_a_refused_timer_poll_is_polled_again_after_its_wake() {
        let runtime = RefusingTimers::default();
        let (_shared, _spawned, mut task, counted, waker) = spawned_task(Arc::new(runtime.clone()));
        runtime.refuse.store(true, Ordering::Relaxed);
        assert!(poll_task(&mut task, &waker).is_pending());
        assert!(woken(&counted) > 0, "the refusal woke the task");
        assert!(lock(&runtime.armed).is_empty());
        // The executor polls the task again for that wake, with a fresh budget.
        runtime.refuse.store(false, Ordering::Relaxed);
        let before = woken(&counted);
        assert!(poll_task(&mut task, &waker).is_pending());
        let fired = core::mem::take(&mut *lock(&runtime.armed));
        assert_eq!(fired.len(), 1, "the timer is armed again");
        fired.into_iter().for_each(Waker::wake);
        assert_eq!(woken(&counted), before + 1, "its firing wakes the task");
    }

    /// House rule 8 (review16 finding 5): as the test above, with the refusal's wake deferred to
    /// after the task's poll, as tokio does: the pass ends with the timer taken as armed and not
    /// yet woken, and only then does the wake come. The next poll (that wake's) must poll the
    /// timer again. Fails if the driver forgets a wake that came between two passes (checked by
    /// clearing `TimerWake::woken` at the start of `poll_timer`).
    #[test]
    fn house_rule_8_a_refused_timer_poll_woken_after_the_pass_is_polled_again() {
        let runtime = RefusingTimers::default();
        let (_shared, _spawned, mut task, counted, waker) = spawned_task(Arc::new(runtime.clone()));
        runtime.refuse.store(true, Ordering::Relaxed);
        runtime.defer.store(true, Ordering::Relaxed);
        assert!(poll_task(&mut task, &waker).is_pending());
        assert_eq!(woken(&counted), 0, "no wake during the pass");
        assert!(lock(&runtime.armed).is_empty());
        // The end of the task's poll: the deferred wake.
        let refusals = core::mem::take(&mut *lock(&runtime.deferred));
        assert_eq!(refusals.len(), 1, "the timer was polled once and refused");
        refusals.into_iter().for_each(Waker::wake);
        assert_eq!(woken(&counted), 1, "the refusal woke the task");
        // The executor polls the task again for that wake, with a fresh budget.
        runtime.refuse.store(false, Ordering::Relaxed);
        assert!(poll_task(&mut task, &waker).is_pending());
        let fired = core::mem::take(&mut *lock(&runtime.armed));
        assert_eq!(fired.len(), 1, "the timer is armed again");
        fired.into_iter().for_each(Waker::wake);
        assert_eq!(woken(&counted), 2, "its firing wakes the task");
    }

    /// House rule 8: extra wakes never swallow a later one. A spurious wake of the task
    /// through the client's queue (which takes the queue's waker), its poll refused during a
    /// caller's inline pass, an extra wake of the task itself: afterwards a new operation's wake
    /// and the timer's firing still reach the task, and an inline pass still runs.
    /// A guarantee pin, not evidence for 6584392's fix: it passes without it too. It fails if
    /// the caller's `missed` check after its pass is dropped (checked by removing it).
    #[test]
    fn house_rule_8_extra_wakes_never_swallow_a_later_one() {
        let runtime = RefusingTimers::default();
        let (shared, spawned, mut task, counted, waker) = spawned_task(Arc::new(runtime.clone()));
        assert!(poll_task(&mut task, &waker).is_pending());
        assert_eq!(woken(&counted), 0);

        lock(&shared.state).wake_driver();
        assert_eq!(woken(&counted), 1, "the spurious wake");
        // A caller's pass runs before the task's poll for it, which is refused.
        let mut claim = spawned.claim().expect("the driver is free");
        let SpawnedState {
            driver,
            task: task_waker,
        } = claim.state.as_deref_mut().expect("held");
        let task_waker = task_waker.clone().expect("the task's waker");
        let pass =
            Pin::new(driver.as_mut().expect("running")).poll(&mut Context::from_waker(&task_waker));
        assert!(pass.is_pending());
        assert!(poll_task(&mut task, &waker).is_pending(), "refused");
        drop(claim);
        assert_eq!(woken(&counted), 2, "the refused poll is owed a wake");
        waker.wake_by_ref();
        assert!(poll_task(&mut task, &waker).is_pending());
        assert!(poll_task(&mut task, &waker).is_pending());

        // A later operation's wake reaches the task.
        let before = woken(&counted);
        lock(&shared.state).wake_driver();
        assert_eq!(woken(&counted), before + 1, "a new operation's wake");
        assert!(spawned.run_inline());
        // So does the timer's firing.
        let fired = core::mem::take(&mut *lock(&runtime.armed));
        assert_eq!(fired.len(), 1, "the timer is armed");
        fired.into_iter().for_each(Waker::wake);
        assert_eq!(woken(&counted), before + 2, "the timer's firing");
    }

    /// House rule 8 (review16 finding 3): a caller's check after its pass wakes a refused task
    /// without waiting for the driver's lock, which the task or another caller may hold for a
    /// whole pass (before, it took that lock, blocking, to read the task's waker). Fails (the
    /// bounded wait ends) if `hand_back` reads the waker under the driver's lock again.
    #[test]
    fn house_rule_8_hand_back_wakes_the_task_while_another_pass_holds_the_driver() {
        let (_shared, spawned, mut task, counted, waker) = spawned_task(Arc::new(NoIo));
        assert!(poll_task(&mut task, &waker).is_pending());
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            // Another pass holds the driver; the task's poll meanwhile is refused.
            let held = lock(&spawned.state);
            assert!(poll_task(&mut task, &waker).is_pending(), "refused");
            let spawned = &spawned;
            scope.spawn(move || {
                spawned.hand_back(false);
                done.send(()).expect("the test waits");
            });
            let returned = finished.recv_timeout(Duration::from_secs(30));
            assert!(returned.is_ok(), "hand_back waited for the driver's lock");
            assert_eq!(woken(&counted), 1, "woken while the lock is held");
            drop(held);
        });
    }

    /// The driver a timer of [`PanickingTimers`] polls the task of before it panics, and the waker.
    type PanicHook = Arc<Mutex<Option<(Arc<SpawnedDriver>, Waker)>>>;

    /// A runtime whose timers keep their waker in `armed`; once `panic` holds the driver, a
    /// poll of a timer polls the driver's task (refused: the pass holds the driver) and then
    /// panics, as a bug in a pass would.
    #[derive(Default, Clone)]
    struct PanickingTimers {
        armed: Arc<Mutex<Vec<Waker>>>,
        panic: PanicHook,
    }

    impl core::fmt::Debug for PanickingTimers {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str("PanickingTimers")
        }
    }

    impl FakeRuntime for PanickingTimers {
        fn poll_timer(&self, cx: &mut Context<'_>) -> Poll<()> {
            let panic = lock(&self.panic).take();
            if let Some((spawned, waker)) = panic {
                // A second task value for the same driver, which only this test makes: not
                // dropped (its drop would stop the driver, review32 R5).
                let mut task = core::mem::ManuallyDrop::new(DriverTask(spawned));
                assert!(poll_task(&mut task, &waker).is_pending(), "refused");
                panic!("a bug in the driver's pass (on purpose)");
            }
            lock(&self.armed).push(cx.waker().clone());
            Poll::Pending
        }
    }

    /// House rule 8 (review16 finding 4): an inline pass that panics, with the task's poll
    /// refused during it, still wakes the task: the claim's drop runs the `missed` check while
    /// the panic unwinds. Fails if that check runs only after a pass that returns.
    #[test]
    fn house_rule_8_a_pass_that_panics_still_wakes_a_task_refused_during_it() {
        let runtime = PanickingTimers::default();
        let (shared, spawned, mut task, counted, waker) = spawned_task(Arc::new(runtime.clone()));
        assert!(poll_task(&mut task, &waker).is_pending());
        *lock(&runtime.panic) = Some((spawned.clone(), waker.clone()));
        // The timer fires (waking the task); a caller's pass polls it again first, and panics.
        let fired = core::mem::take(&mut *lock(&runtime.armed));
        assert_eq!(fired.len(), 1, "the timer is armed");
        fired.into_iter().for_each(Waker::wake);
        let before = woken(&counted);
        let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| spawned.run_inline()));
        assert!(pass.is_err(), "the pass panicked");
        assert!(
            lock(&runtime.panic).is_none(),
            "the task's poll was refused during it"
        );
        assert_eq!(woken(&counted), before + 1, "the refused task is woken");
        // Review34 Y1: the runtime dropping the task later (not while panicking) stops the
        // driver with the panic as its reason (the pass left the driver's lock poisoned), not
        // the runtime's loss.
        drop(task);
        let error = lock(&shared.state).closed_error().to_string();
        assert!(error.contains("the client's driver panicked"), "{error}");
    }

    /// A runtime whose clock panics once `panic` is set, as a bug in the task's own pass would
    /// (a pass reads it first); otherwise [`NoIo`].
    #[derive(Debug, Default, Clone)]
    struct ClockPanics {
        panic: Arc<AtomicBool>,
    }

    impl Runtime for ClockPanics {
        fn start() -> io::Result<ClockPanics> {
            Ok(ClockPanics::default())
        }
        fn now(&self) -> Instant {
            if self.panic.load(Ordering::Relaxed) {
                panic!("a bug in the driver's task pass (on purpose)");
            }
            Instant::ZERO
        }
        fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
            NoIo.new_timer(at)
        }
        fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
            NoIo.connect(host, port)
        }
    }

    /// The error `slot`'s operation ended with, if it has ended (it cannot succeed here).
    fn result_of(slot: &Slot, shared: &Shared) -> Option<OperationError> {
        match slot.poll(
            &mut Context::from_waker(Waker::noop()),
            &shared.results_to_take,
        ) {
            Poll::Ready(result) => Some(result.err().expect("no server: it failed")),
            Poll::Pending => None,
        }
    }

    /// Review34 Y1: the task's own pass panics, and the executor drops the task while the panic
    /// unwinds (as tokio does): the operation in flight, and every later one, fail with the
    /// driver's panic, not "the runtime ... has shut down", and the drop does not abort. Fails
    /// (the runtime's message) without the reason taken from the state lock's poison.
    #[test]
    fn review34_y1_a_panic_in_the_tasks_pass_is_reported_as_the_drivers_panic() {
        let runtime = ClockPanics::default();
        let (shared, _spawned, mut task, _counted, waker) = spawned_task(Arc::new(runtime.clone()));
        queue(&shared, 1);
        let in_flight = lock(&shared.state).requests[0].clone();
        assert!(poll_task(&mut task, &waker).is_pending());
        assert_eq!(queued(&shared), 0, "started");
        assert!(result_of(&in_flight, &shared).is_none(), "in flight");
        runtime.panic.store(true, Ordering::Relaxed);
        queue(&shared, 1);
        let queued_slot = lock(&shared.state).requests[0].clone();
        lock(&shared.state).wake_driver();
        // The task goes with the closure's frame, dropped while the panic unwinds.
        let poll = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let mut task = task;
            poll_task(&mut task, &waker)
        }));
        assert!(poll.is_err(), "the pass panicked");
        for slot in [&in_flight, &queued_slot] {
            let error = result_of(slot, &shared).expect("ended");
            assert!(
                matches!(error.kind, ErrorKind::Internal { .. }),
                "{error:?}"
            );
            assert!(
                error.to_string().contains("the client's driver panicked"),
                "{error}"
            );
        }
        let state = lock(&shared.state);
        assert!(state.closing && state.done);
        let later = state.closed_error().to_string();
        assert!(later.contains("the client's driver panicked"), "{later}");
        assert!(!later.contains("runtime"), "{later}");
    }

    /// Review36 V2: a task dropped while its thread unwinds from a panic of its own (a runtime
    /// dropped during a failing test), with no pass having panicked: the client reports the
    /// runtime's loss, not a driver panic. Fails with the reason taken from
    /// `std::thread::panicking()`.
    #[test]
    fn review36_v2_a_task_dropped_during_an_unrelated_panic_reports_the_runtime() {
        let (shared, _spawned, mut task, _counted, waker) = spawned_task(Arc::new(NoIo));
        queue(&shared, 1);
        assert!(poll_task(&mut task, &waker).is_pending());
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _task = task;
            panic!("a test's own failure (on purpose)");
        }));
        assert!(unwound.is_err());
        let state = lock(&shared.state);
        assert!(state.closing && state.done);
        assert_eq!(state.closed, Closed::RuntimeGone);
    }

    /// Review34 Y5 (review32 R5's `orphan`): the task dropped before its driver stopped, not
    /// while panicking (its runtime shut down): the operation in flight ends cancelled, the
    /// queued one with the runtime's loss, later ones are refused with it, events end and the
    /// client is done. Fails if any of them is left waiting or gets another error.
    #[test]
    fn review34_y5_a_task_dropped_by_its_runtime_ends_every_caller_once() {
        let (shared, _spawned, mut task, _counted, waker) = spawned_task(Arc::new(NoIo));
        queue(&shared, 1);
        let in_flight = lock(&shared.state).requests[0].clone();
        assert!(poll_task(&mut task, &waker).is_pending());
        assert!(result_of(&in_flight, &shared).is_none(), "in flight");
        queue(&shared, 1);
        let queued_slot = lock(&shared.state).requests[0].clone();
        let events = Arc::new(crate::shared::EventQueue::default());
        lock(&shared.state).subscribers.push(events.clone());
        drop(task);
        let first = result_of(&in_flight, &shared).expect("ended");
        assert!(matches!(first.kind, ErrorKind::Cancelled), "{first:?}");
        let second = result_of(&queued_slot, &shared).expect("ended");
        assert_eq!(
            second.to_string(),
            crate::shared::runtime_gone().to_string()
        );
        let state = lock(&shared.state);
        assert!(state.closing && state.done && state.subscribers.is_empty());
        assert_eq!(state.closed, Closed::RuntimeGone);
        assert_eq!(state.closed_error().to_string(), second.to_string());
        drop(state);
        let next = events.poll_next(&mut Context::from_waker(Waker::noop()));
        assert!(matches!(next, Poll::Ready(None)), "the event stream ends");
        assert!(result_of(&in_flight, &shared).is_none(), "ended once");
    }

    /// House rule 8 (review16 finding 5): `run_inline` on a stopped driver returns early, and
    /// still wakes a task whose poll it refused: the task had set `missed` and was about to try
    /// the lock when the caller took it (its try then fails). The task must be polled again to
    /// end. Fails if the claim's drop skips the `missed` check on a stopped driver.
    #[test]
    fn house_rule_8_run_inline_on_a_stopped_driver_wakes_a_task_refused_meanwhile() {
        let (_shared, spawned, mut task, counted, waker) = spawned_task(Arc::new(NoIo));
        assert!(poll_task(&mut task, &waker).is_pending());
        lock(&spawned.state).driver = None;
        // The task's poll has begun (`missed` set, the fence passed) when the caller claims.
        spawned.missed.store(true, Ordering::Relaxed);
        assert!(!spawned.run_inline(), "no pass: the driver stopped");
        assert_eq!(woken(&counted), 1, "the refused task is woken to end");
        assert!(poll_task(&mut task, &waker).is_ready(), "and ends");
    }

    /// What the sockets of a test did, in order: `(true, conn)` a write, `(false, conn)` a read.
    type SocketLog = Arc<Mutex<Vec<(bool, ConnId)>>>;

    /// A socket that has nothing to read and takes every write: logs both, keeps its writes.
    struct QuietSocket {
        conn: ConnId,
        log: SocketLog,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Socket for QuietSocket {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut [u8],
        ) -> Poll<io::Result<usize>> {
            lock(&self.log).push((false, self.conn));
            Poll::Pending
        }

        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            lock(&self.log).push((true, self.conn));
            lock(&self.written).extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
    }

    /// Adds an open [`QuietSocket`] as `conn` to `driver`, logging to `log`; returns its waker's
    /// entry and its written bytes.
    fn quiet_socket(
        driver: &mut Driver,
        conn: ConnId,
        log: &SocketLog,
    ) -> (Arc<SocketWaker>, Arc<Mutex<Vec<u8>>>) {
        let written = Arc::new(Mutex::new(Vec::new()));
        let ready = Arc::new(SocketWaker {
            conn,
            queued: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            sockets: driver.ready.clone(),
        });
        let socket = QuietSocket {
            conn,
            log: log.clone(),
            written: written.clone(),
        };
        driver.sockets.insert(
            conn,
            SocketState::new(Link::Open(Box::pin(socket)), ready.clone()),
        );
        (ready, written)
    }

    /// Issue 9: bytes the engine gives a socket are written at the start of the next round's
    /// socket polls, before any ready socket is read and whether or not the socket is ready,
    /// once per socket however often it was given bytes.
    #[test]
    fn the_engines_bytes_are_written_before_the_reads_of_a_round() {
        let (mut driver, _shared) = test_driver(Arc::new(NoIo));
        let task = tasks(1);
        let waker = Waker::from(task[0].clone());
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut driver).poll(&mut cx).is_pending());
        let log = SocketLog::default();
        let (given, ready) = (ConnId(2_000), ConnId(2_001));
        let (_, written) = quiet_socket(&mut driver, given, &log);
        let (ready_waker, _) = quiet_socket(&mut driver, ready, &log);
        ready_waker.enqueue();
        for bytes in [&b"first "[..], b"second"] {
            driver.transmit.extend_from_slice(bytes);
            driver.queue_transmit(given);
        }
        assert_eq!(driver.writes, [given], "listed once");
        let (progressed, fed) = driver.poll_sockets(&mut cx, Instant::ZERO);
        assert!(progressed && !fed);
        assert_eq!(&*lock(&written), b"first second");
        assert_eq!(
            *lock(&log),
            [(true, given), (false, ready)],
            "written first, then the ready socket read; the socket given bytes (not ready) not read"
        );
        assert!(driver.writes.is_empty() && !driver.sockets.get(&given).expect("open").listed);
    }

    /// A [`LocalDriver`] of [`test_driver`] (no socket ever connects), what it shares with its
    /// client, and `n` operations queued in it, not started.
    fn local_driver_with_queued(n: usize) -> (Arc<LocalDriver>, Arc<Shared>) {
        let (driver, shared) = test_driver(Arc::new(NoIo));
        let local = Arc::new(LocalDriver::new(driver));
        queue(&shared, n);
        (local, shared)
    }

    /// Queues `n` operations in `shared`, not started.
    fn queue(shared: &Shared, n: usize) {
        {
            let mut state = lock(&shared.state);
            for _ in 0..n {
                let request = retry_core::engine::OperationRequest::new(
                    "admin",
                    bson::doc! {"ping": 1},
                    retry_core::retry::OperationKind::RunCommand,
                    retry_core::selection::SelectionCriteria::Write,
                );
                let slot = state.slot(request, None, None);
                state.requests.push_back(slot);
            }
        }
    }

    /// Operations queued and not yet taken by a pass of the driver.
    fn queued(shared: &Shared) -> usize {
        lock(&shared.state).requests.len()
    }

    /// House rule 8, issue 9 (one pass starts the operations of several callers): the first
    /// future that defers its operation's start wakes its own task, and its next poll runs the
    /// pass that starts every operation queued meanwhile; the futures that defer after it only
    /// register, and wake nobody. Without the task's own wake, no pass would come: nothing else
    /// wakes anyone.
    #[test]
    fn house_rule_8_a_deferred_start_runs_when_its_future_is_polled_again() {
        let (local, shared) = local_driver_with_queued(3);
        let tasks = tasks(3);
        let wakers: Vec<Waker> = tasks.iter().map(|t| Waker::from(t.clone())).collect();
        let waiters: Vec<Waiter> = (0..3).map(|_| local.waiter()).collect();
        for (waiter, waker) in waiters.iter().zip(&wakers) {
            local.mark();
            waiter.defer(&Context::from_waker(waker));
        }
        assert_eq!(woken(&tasks[..1]), 1, "the first wakes its own task");
        assert_eq!(woken(&tasks[1..]), 0, "the others leave the pass to it");
        assert_eq!(queued(&shared), 3, "nothing started yet");
        assert_eq!(registered(&lock(&local.waker.waiting)), 2);
        // A caller taking its result meanwhile leaves the pass to the deferring future.
        let taker = local.waiter();
        taker.run(&Context::from_waker(Waker::noop()));
        assert_eq!(queued(&shared), 3, "a result's caller does not run it");
        drop(taker);
        assert_eq!(woken(&tasks), 1, "and wakes nobody when it leaves");
        // The deferring future's next poll: one pass starts all three.
        waiters[0].drive(&Context::from_waker(&wakers[0]));
        assert_eq!(queued(&shared), 0, "one pass started them all");
        assert!(!local.waker.owed());
        assert_eq!(woken(&tasks), 1);
    }

    /// House rule 8, issue 9: a deferring future dropped before its next poll hands the pass on
    /// to a waiting future (the operations queued after it would otherwise wait for the next
    /// wake of the driver, which may never come); and a first poll that finds no result left to
    /// take runs the pass itself, starting the deferred operations too.
    #[test]
    fn house_rule_8_a_deferring_future_dropped_hands_its_pass_on() {
        let (local, shared) = local_driver_with_queued(2);
        let tasks = tasks(2);
        let wakers: Vec<Waker> = tasks.iter().map(|t| Waker::from(t.clone())).collect();
        let (first, second) = (local.waiter(), local.waiter());
        local.mark();
        first.defer(&Context::from_waker(&wakers[0]));
        local.mark();
        second.defer(&Context::from_waker(&wakers[1]));
        assert_eq!((woken(&tasks[..1]), woken(&tasks[1..])), (1, 0));
        drop(first);
        assert_eq!(woken(&tasks[1..]), 1, "the waiting one is woken to run it");
        assert!(!local.waker.owed());
        second.drive(&Context::from_waker(&wakers[1]));
        assert_eq!(queued(&shared), 0);

        // No result left to take: the first poll runs the pass (`Waiter::drive`), which starts
        // an operation deferred before it as well.
        let (local, shared) = local_driver_with_queued(2);
        let (deferring, last) = (local.waiter(), local.waiter());
        local.mark();
        deferring.defer(&Context::from_waker(&wakers[0]));
        local.mark();
        last.drive(&Context::from_waker(&wakers[1]));
        assert_eq!(queued(&shared), 0, "both started by one pass");
    }

    /// House rule 8, review10 finding 2 (woken futures never polled): a deferring future counts
    /// as one a wake of the driver woke, so while it has not run the pass, each wake of the
    /// driver (a socket ready) wakes waiting futures, two and then twice as many, as after any
    /// wake that no woken future has answered yet.
    #[test]
    fn house_rule_8_wakes_escalate_while_a_deferred_pass_is_owed() {
        let (local, _shared) = local_driver_with_queued(1);
        let waiting = tasks(8);
        register_all(&local.waker, &waiting);
        // A pass ran (and claimed); then a first poll defers.
        local.waker.claimed.store(true, Ordering::Release);
        let deferring = local.waiter();
        let own = tasks(1);
        local.mark();
        deferring.defer(&Context::from_waker(&Waker::from(own[0].clone())));
        assert_eq!(woken(&own), 1);
        let driver = Waker::from(local.waker.clone());
        driver.wake_by_ref();
        assert_eq!(
            woken(&waiting),
            2,
            "a wake while the pass is owed wakes two"
        );
        driver.wake_by_ref();
        assert_eq!(woken(&waiting), 6, "then twice as many (four more)");
    }

    /// A [`LocalDriver`] as [`local_driver_with_queued`] gives, on [`ManualTimers`]: what it
    /// shares with its client, and the runtime's timers' wakers.
    fn local_driver_on_manual_timers(
        n: usize,
    ) -> (Arc<LocalDriver>, Arc<Shared>, Arc<Mutex<Vec<Waker>>>) {
        let runtime = ManualTimers::default();
        let armed = runtime.armed.clone();
        let (driver, shared) = test_driver(Arc::new(runtime));
        let local = Arc::new(LocalDriver::new(driver));
        queue(&shared, n);
        (local, shared, armed)
    }

    /// Fires `local`'s [`Watchdog`] if it is armed (its waker among the runtime's `armed`, the
    /// driver's own timer left alone); returns whether it was.
    fn fire_watchdog(local: &LocalDriver, armed: &Mutex<Vec<Waker>>) -> bool {
        let watchdog = lock(&local.waker.watchdog)
            .as_ref()
            .expect("a watchdog")
            .waker
            .clone();
        let wakers: Vec<Waker> = {
            let mut armed = lock(armed);
            let (fired, kept) = core::mem::take(&mut *armed)
                .into_iter()
                .partition(|waker| waker.will_wake(&watchdog));
            *armed = kept;
            fired
        };
        let fired = !wakers.is_empty();
        wakers.into_iter().for_each(Waker::wake);
        fired
    }

    /// House rule 8, review25 R1: a future that deferred its operation's start and is then
    /// kept but never polled (a `select` that another branch won) stalls nobody. A first poll
    /// after it only registers, leaving the pass to it; the watchdog its deferral armed wakes
    /// that future when no pass started within the grace, and its poll starts both operations
    /// (before, nothing was armed: with no other wake of the driver, as in load-balanced mode
    /// with nothing in flight, it was never woken). Once a pass has run, a deferral is no
    /// longer owed: the next first poll defers a pass of its own (its own task woken), a
    /// result's caller runs the driver, instead of leaving it to the future never polled.
    #[test]
    fn house_rule_8_a_deferring_future_kept_unpolled_stalls_nobody() {
        let (local, shared, armed) = local_driver_on_manual_timers(2);
        let tasks = tasks(3);
        let wakers: Vec<Waker> = tasks.iter().map(|t| Waker::from(t.clone())).collect();
        let (first, second) = (local.waiter(), local.waiter());
        local.mark();
        first.defer(&Context::from_waker(&wakers[0]));
        local.mark();
        second.defer(&Context::from_waker(&wakers[1]));
        assert_eq!((woken(&tasks[..1]), woken(&tasks[1..2])), (1, 0));
        // `first` is never polled again. The watchdog fires: no pass has started.
        assert!(
            fire_watchdog(&local, &armed),
            "the deferral armed the watchdog"
        );
        assert_eq!(woken(&tasks[1..2]), 1, "the waiting future is woken");
        second.drive(&Context::from_waker(&wakers[1]));
        assert_eq!(queued(&shared), 0, "its pass started both");

        // The pass `first` owed has run: nothing is left to it, and the next first poll defers
        // a pass of its own, which a result's caller respects (review28 U8).
        assert!(!local.waker.owed());
        queue(&shared, 1);
        local.mark();
        let third = local.waiter();
        third.defer(&Context::from_waker(&wakers[2]));
        assert_eq!(woken(&tasks[2..]), 1, "a deferral of its own");
        assert!(local.waker.owed());
        let taker = local.waiter();
        taker.run(&Context::from_waker(Waker::noop()));
        assert_eq!(queued(&shared), 1, "owed: left to `third`");
        // A pass runs (not `third`'s poll: its claim stays in `deferred`, as `first`'s stays in
        // its waiter); neither stale claim is owed once a pass started.
        assert!(!local.run(&Context::from_waker(Waker::noop())));
        assert_eq!(queued(&shared), 0);
        assert!(!local.waker.owed());
        queue(&shared, 1);
        local.mark();
        taker.run(&Context::from_waker(Waker::noop()));
        assert_eq!(queued(&shared), 0, "a result's caller runs the driver");
        drop((first, third));
    }

    /// House rule 8, review25 R1: the watchdog, armed before a pass ran, does not wake every
    /// waiting future for a pass deferred after that pass (it has not waited the grace yet):
    /// it is armed again, and wakes them at its next firing if no pass has started by then.
    #[test]
    fn house_rule_8_the_watchdog_is_armed_again_for_a_pass_deferred_since_it_was_armed() {
        let (local, shared, armed) = local_driver_on_manual_timers(1);
        let tasks = tasks(3);
        let wakers: Vec<Waker> = tasks.iter().map(|t| Waker::from(t.clone())).collect();
        let first = local.waiter();
        local.mark();
        first.defer(&Context::from_waker(&wakers[0]));
        first.drive(&Context::from_waker(&wakers[0]));
        assert_eq!(queued(&shared), 0);
        // A later deferral, while the watchdog is still armed: no new timer setting.
        queue(&shared, 2);
        let (second, third) = (local.waiter(), local.waiter());
        local.mark();
        second.defer(&Context::from_waker(&wakers[1]));
        local.mark();
        third.defer(&Context::from_waker(&wakers[2]));
        assert_eq!((woken(&tasks[1..2]), woken(&tasks[2..])), (1, 0));
        assert!(fire_watchdog(&local, &armed));
        assert_eq!(woken(&tasks[2..]), 0, "a pass ran since it was armed");
        assert!(fire_watchdog(&local, &armed), "armed again");
        assert_eq!(
            woken(&tasks[2..]),
            1,
            "no pass since: the waiting future is woken"
        );
        third.drive(&Context::from_waker(&wakers[2]));
        assert_eq!(queued(&shared), 0);
        assert!(
            !fire_watchdog(&local, &armed),
            "not armed again once it woke them"
        );
        drop(second);
    }

    /// House rule 9, review26 S1: a deferral made while a pass was starting (counted before the
    /// deferral read the count, `dirty` cleared after the driver was marked, the operation
    /// taken) is owed until the next pass starts, but leaves the driver nothing to do: the
    /// watchdog it armed fires once and is not armed again (before, it re-armed every
    /// [`UNCLAIMED_TIMER_GRACE`] for as long as the client idled).
    #[test]
    fn house_rule_9_the_watchdog_is_not_armed_again_while_the_driver_has_nothing_to_do() {
        let (local, shared, armed) = local_driver_on_manual_timers(1);
        let first = local.waiter();
        local.mark();
        // The pass has counted itself (`start_pass`) when the deferral reads the count.
        local.waker.passes.fetch_add(1, Ordering::AcqRel);
        first.defer(&Context::from_waker(Waker::noop()));
        // Then that pass clears `dirty` and takes the operation (review28 U7: the state built,
        // not only described); the deferral stays owed.
        local.waker.dirty.store(false, Ordering::Release);
        {
            let mut driver = lock(&local.driver);
            let driver = driver.as_mut().expect("not shut down");
            let (took, closing) =
                driver.take_requests(&mut Context::from_waker(Waker::noop()), Instant::ZERO);
            assert!(took && !closing);
        }
        assert_eq!(queued(&shared), 0, "taken by the pass");
        assert!(local.waker.owed());
        assert!(
            fire_watchdog(&local, &armed),
            "the deferral armed the watchdog"
        );
        assert!(
            !fire_watchdog(&local, &armed),
            "nothing to do: not armed again"
        );
        drop(first);
    }

    /// House rule 8, review26 S3, review28 U6: a pass starts after a first poll read the count
    /// of passes and before its claim, and another future claims the pass owed since: the
    /// first poll's claim (a compare-exchange, which fails) does not overwrite the newer claim,
    /// whose count it sees is current (`seen == owed_now()`): it registers and wakes nobody,
    /// its operation started by that pass. Without that check it would retry the exchange with
    /// its stale count and win: the newer claim lost, nothing owed, and its future's operation
    /// left to whoever runs the driver next.
    #[test]
    fn house_rule_8_a_claim_after_a_pass_started_keeps_the_newer_claim() {
        let (local, shared) = local_driver_with_queued(1);
        let tasks = tasks(2);
        let wakers: Vec<Waker> = tasks.iter().map(|t| Waker::from(t.clone())).collect();
        let (stale, newer) = (Arc::new(local.waiter()), Arc::new(local.waiter()));
        let hook = {
            let (local, shared, newer, waker) = (
                local.clone(),
                shared.clone(),
                newer.clone(),
                wakers[1].clone(),
            );
            move || {
                assert!(!local.run(&Context::from_waker(Waker::noop())));
                assert_eq!(queued(&shared), 0, "the pass started `stale`'s operation");
                queue(&shared, 1);
                local.mark();
                newer.defer(&Context::from_waker(&waker));
            }
        };
        BEFORE_CLAIM.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
        local.mark();
        stale.defer(&Context::from_waker(&wakers[0]));
        assert_eq!(
            local.waker.deferred.load(Ordering::Acquire),
            local.waker.owed_now(),
            "the newer claim kept"
        );
        assert!(local.waker.owed());
        assert_eq!(stale.deferring.load(Ordering::Relaxed), 0, "no claim");
        assert_eq!(woken(&tasks[..1]), 0, "registered, not woken");
        assert_eq!(woken(&tasks[1..]), 1, "the newer claim's own wake");
        assert_eq!(registered(&lock(&local.waker.waiting)), 1);
        // The newer claim's future runs its pass when polled.
        newer.drive(&Context::from_waker(&wakers[1]));
        assert_eq!(queued(&shared), 0);
        assert!(!local.waker.owed());
    }

    /// House rule 8, review26 S3, review28 U6: a pass starts after a first poll read the count
    /// of passes and before its claim, and no other future claims: the claim is made with the
    /// count read before that pass, so it is not owed (that pass started the operation), and
    /// a result's caller runs the driver instead of leaving it to the claim's future.
    #[test]
    fn house_rule_8_a_claim_made_with_a_count_older_than_a_pass_is_not_owed() {
        let (local, shared) = local_driver_with_queued(1);
        let tasks = tasks(1);
        let waker = Waker::from(tasks[0].clone());
        let claiming = local.waiter();
        let hook = {
            let (local, shared) = (local.clone(), shared.clone());
            move || {
                assert!(!local.run(&Context::from_waker(Waker::noop())));
                assert_eq!(queued(&shared), 0, "the pass started the operation");
            }
        };
        BEFORE_CLAIM.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
        local.mark();
        claiming.defer(&Context::from_waker(&waker));
        assert_eq!(woken(&tasks), 1, "it claimed: its own task woken");
        assert_ne!(claiming.deferring.load(Ordering::Relaxed), 0);
        assert!(
            !local.waker.owed(),
            "a pass started since the count it claimed with"
        );
        queue(&shared, 1);
        local.mark();
        let taker = local.waiter();
        taker.run(&Context::from_waker(Waker::noop()));
        assert_eq!(queued(&shared), 0, "a result's caller runs the driver");
        drop(claiming);
    }

    /// House rule 8, review26 S3, review28 U6: a future that leaves after its claim went stale
    /// (a pass started, and another future claimed since) does not clear the newer claim
    /// ([`Waiter::resume`]'s compare-exchange): the pass stays owed to the newer future, so its
    /// leaving hands the driver to nobody ([`DriverWaker::hand_off`]; cleared, the claim would
    /// wake a waiting future for a pass the newer one runs).
    #[test]
    fn house_rule_8_a_stale_claim_leaving_keeps_the_newer_one() {
        let (local, shared) = local_driver_with_queued(1);
        let tasks = tasks(3);
        let wakers: Vec<Waker> = tasks.iter().map(|t| Waker::from(t.clone())).collect();
        let (stale, newer, waiting) = (local.waiter(), local.waiter(), local.waiter());
        local.mark();
        stale.defer(&Context::from_waker(&wakers[0]));
        assert!(!local.run(&Context::from_waker(Waker::noop())));
        assert_eq!(queued(&shared), 0);
        queue(&shared, 2);
        local.mark();
        newer.defer(&Context::from_waker(&wakers[1]));
        local.mark();
        waiting.defer(&Context::from_waker(&wakers[2]));
        assert_eq!(
            woken(&tasks),
            2,
            "`stale` and `newer` claimed; `waiting` registered"
        );
        let claim = local.waker.deferred.load(Ordering::Acquire);
        drop(stale);
        assert_eq!(local.waker.deferred.load(Ordering::Acquire), claim);
        assert!(local.waker.owed());
        assert_eq!(woken(&tasks[2..]), 0, "nobody handed the pass `newer` owes");
        newer.drive(&Context::from_waker(&wakers[1]));
        assert_eq!(queued(&shared), 0, "`newer`'s pass started both");
        assert_eq!(
            local.waker.deferred.load(Ordering::Acquire),
            0,
            "cleared by its owner"
        );
        drop(waiting);
    }

    /// A socket with a byte to read after each wake, whose reads say it is armed
    /// ([`Socket::poll_read_armed`]): each read registers the waker it is polled with (kept in
    /// `waker`) and logs itself.
    struct ArmedSocket {
        conn: ConnId,
        log: SocketLog,
        waker: Arc<Mutex<Option<Waker>>>,
    }

    impl Socket for ArmedSocket {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut [u8],
        ) -> Poll<io::Result<usize>> {
            unreachable!("the driver reads through poll_read_armed")
        }

        fn poll_read_armed(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<io::Result<(usize, bool)>> {
            lock(&self.log).push((false, self.conn));
            *lock(&self.waker) = Some(cx.waker().clone());
            buf[0] = 0;
            Poll::Ready(Ok((1, true)))
        }

        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            lock(&self.log).push((true, self.conn));
            Poll::Ready(Ok(buf.len()))
        }
    }

    /// Issue 9, house rule 8: a read that leaves the socket's waker registered
    /// ([`Socket::poll_read_armed`]) is not followed by another read in the same round, nor in
    /// a round that polls the socket only to write to it; the waker's wake (bytes arrived) makes
    /// the next round read it again.
    #[test]
    fn an_armed_read_is_read_again_only_after_its_wake() {
        let (mut driver, _shared) = test_driver(Arc::new(NoIo));
        let task = tasks(1);
        let waker = Waker::from(task[0].clone());
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut driver).poll(&mut cx).is_pending());
        let (conn, log) = (ConnId(3_000), SocketLog::default());
        let registered = Arc::new(Mutex::new(None));
        let ready = Arc::new(SocketWaker {
            conn,
            queued: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            sockets: driver.ready.clone(),
        });
        let socket = ArmedSocket {
            conn,
            log: log.clone(),
            waker: registered.clone(),
        };
        driver.sockets.insert(
            conn,
            SocketState::new(Link::Open(Box::pin(socket)), ready.clone()),
        );
        ready.enqueue();
        driver.poll_sockets(&mut cx, Instant::ZERO);
        assert_eq!(
            *lock(&log),
            [(false, conn)],
            "one read: it said it is armed"
        );
        // Given bytes, not woken: written, not read.
        driver.transmit.extend_from_slice(b"request");
        driver.queue_transmit(conn);
        driver.poll_sockets(&mut cx, Instant::ZERO);
        assert_eq!(*lock(&log), [(false, conn), (true, conn)]);
        // Bytes arrive: the registered waker's wake makes the next round read.
        let socket_waker = lock(&registered).take().expect("registered by the read");
        socket_waker.wake();
        assert!(!driver.ready.is_empty(), "queued by the wake");
        driver.poll_sockets(&mut cx, Instant::ZERO);
        assert_eq!(*lock(&log), [(false, conn), (true, conn), (false, conn)]);
    }
}
