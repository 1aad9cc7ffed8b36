//! The driving loop, written once for every runtime: it moves bytes between the engine and the
//! runtime's sockets and sleeps until the engine's next timeout. Every decision is the engine's.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use retry_core::engine::{ConnId, CursorHandle, Engine, EngineEvent, OpId, OperationRequest};
use retry_core::error::{NetworkErrorKind, OperationError};
use retry_core::time::{Instant, OperationTimeout};

use crate::client::{Reply, TimedEvent};
use crate::runtime::{AsyncTimer, BoxFuture, Runtime, Socket};

/// Rounds of work in one poll before the driver yields to its executor (tokio's coop budget and
/// fairness to other tasks); it wakes itself to continue.
const ROUNDS_PER_POLL: usize = 64;
/// Reads from one socket in one round, so that one busy socket cannot starve the others.
const READS_PER_ROUND: usize = 8;
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Locks `mutex`; a panic elsewhere while it was held does not poison the client.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What an operation ends with.
type OperationResult = Result<Reply, OperationError>;

/// Where one operation's result goes: a one-shot slot the caller awaits.
#[derive(Default)]
pub(crate) struct Slot {
    state: Mutex<(Option<OperationResult>, Option<Waker>)>,
}

impl Slot {
    pub(crate) fn complete(&self, result: OperationResult) {
        let mut state = lock(&self.state);
        if state.0.is_none() {
            state.0 = Some(result);
        }
        if let Some(waker) = state.1.take() {
            waker.wake();
        }
    }

    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<OperationResult> {
        let mut state = lock(&self.state);
        match state.0.take() {
            Some(result) => Poll::Ready(result),
            None => {
                state.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// The monitoring events of one subscriber, in order.
#[derive(Default)]
pub(crate) struct EventQueue {
    state: Mutex<(VecDeque<TimedEvent>, Option<Waker>, bool)>,
}

impl EventQueue {
    fn push(&self, event: TimedEvent) {
        let mut state = lock(&self.state);
        state.0.push_back(event);
        if let Some(waker) = state.1.take() {
            waker.wake();
        }
    }

    /// Ends the stream once its events are taken.
    pub(crate) fn close(&self) {
        let mut state = lock(&self.state);
        state.2 = true;
        if let Some(waker) = state.1.take() {
            waker.wake();
        }
    }

    /// The next event; `None` once the client has shut down and every event was taken.
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<TimedEvent>> {
        let mut state = lock(&self.state);
        if let Some(event) = state.0.pop_front() {
            return Poll::Ready(Some(event));
        }
        if state.2 {
            return Poll::Ready(None);
        }
        state.1 = Some(cx.waker().clone());
        Poll::Pending
    }

    pub(crate) fn try_next(&self) -> Option<TimedEvent> {
        lock(&self.state).0.pop_front()
    }
}

/// An operation the client asked for.
pub(crate) struct Request {
    /// The operation; the driver sets its CSOT deadline from `timeoutMS`.
    pub(crate) operation: OperationRequest,
    pub(crate) reply: Arc<Slot>,
}

/// An operation in the engine: where its result goes, and the cursor it opened.
struct Pending {
    slot: Arc<Slot>,
    cursor: Option<CursorHandle>,
}

/// What the client and its driver share.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<SharedState>,
}

#[derive(Default)]
pub(crate) struct SharedState {
    pub(crate) requests: VecDeque<Request>,
    pub(crate) driver: Option<Waker>,
    /// Shutdown was asked for.
    pub(crate) closing: bool,
    /// The driver has stopped: every operation has its result.
    pub(crate) done: bool,
    pub(crate) done_wakers: Vec<Waker>,
    pub(crate) subscribers: Vec<Arc<EventQueue>>,
}

impl Shared {
    /// Asks the driver to shut down.
    pub(crate) fn close(&self) {
        let mut state = lock(&self.state);
        state.closing = true;
        if let Some(waker) = state.driver.take() {
            waker.wake();
        }
    }
}

enum Link {
    Connecting(BoxFuture<io::Result<Pin<Box<dyn Socket>>>>),
    Open(Pin<Box<dyn Socket>>),
}

struct SocketState {
    link: Link,
    /// Bytes the engine asked to write, not yet written.
    outgoing: VecDeque<u8>,
}

/// The task that owns the engine. Spawned once per client.
pub(crate) struct Driver {
    runtime: Arc<dyn Runtime>,
    engine: Engine,
    shared: Arc<Shared>,
    timer: Pin<Box<dyn AsyncTimer>>,
    timer_at: Option<Instant>,
    sockets: BTreeMap<ConnId, SocketState>,
    pending: BTreeMap<OpId, Pending>,
    /// `timeoutMS`, for each operation's CSOT deadline.
    timeout: Option<core::time::Duration>,
    read_buffer: Vec<u8>,
}

impl Driver {
    pub(crate) fn new(
        runtime: Arc<dyn Runtime>,
        engine: Engine,
        shared: Arc<Shared>,
        timeout: Option<core::time::Duration>,
    ) -> Driver {
        let timer = runtime.new_timer(Instant::MAX);
        Driver {
            runtime,
            engine,
            shared,
            timer,
            timer_at: None,
            sockets: BTreeMap::new(),
            pending: BTreeMap::new(),
            timeout,
            read_buffer: vec![0; READ_BUFFER_BYTES],
        }
    }

    /// Starts the operations the client queued. Returns whether there were any, and whether the
    /// client is closing.
    fn take_requests(&mut self, cx: &mut Context<'_>, now: Instant) -> (bool, bool) {
        let (requests, closing) = {
            let mut state = lock(&self.shared.state);
            state.driver = Some(cx.waker().clone());
            // EV-1: command events cost a copy of each command and reply; publish them only
            // while someone listens.
            let listening = state.subscribers.iter().any(|s| Arc::strong_count(s) > 1);
            self.engine.set_command_monitoring(listening);
            (core::mem::take(&mut state.requests), state.closing)
        };
        let progressed = !requests.is_empty();
        for request in requests {
            let timeout = match self.timeout {
                Some(t) => OperationTimeout::from_timeout_ms(now, t),
                None => OperationTimeout::Off,
            };
            let mut operation = request.operation;
            operation.timeout = timeout;
            let op = self.engine.start_operation(operation, now);
            let pending = Pending {
                slot: request.reply,
                cursor: None,
            };
            self.pending.insert(op, pending);
        }
        (progressed, closing)
    }

    /// Connects, writes and reads every socket as far as it goes without waiting.
    fn poll_sockets(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        let mut progressed = false;
        let ids: Vec<ConnId> = self.sockets.keys().copied().collect();
        for conn in ids {
            let Some(socket) = self.sockets.get_mut(&conn) else {
                continue;
            };
            if let Link::Connecting(connecting) = &mut socket.link {
                match connecting.as_mut().poll(cx) {
                    Poll::Pending => continue,
                    Poll::Ready(Ok(stream)) => {
                        socket.link = Link::Open(stream);
                        self.engine.handle_connected(conn, now);
                    }
                    Poll::Ready(Err(error)) => {
                        self.sockets.remove(&conn);
                        self.engine.handle_closed(conn, error_kind(&error), now);
                    }
                }
                // The engine may have written the handshake, or closed the socket.
                return true;
            }
            let Link::Open(stream) = &mut socket.link else {
                continue;
            };
            let mut failure = None;
            while !socket.outgoing.is_empty() && failure.is_none() {
                let (bytes, _) = socket.outgoing.as_slices();
                match stream.as_mut().poll_write(cx, bytes) {
                    Poll::Pending => break,
                    Poll::Ready(Ok(0)) => failure = Some(NetworkErrorKind::Closed),
                    Poll::Ready(Ok(n)) => {
                        socket.outgoing.drain(..n);
                        progressed = true;
                    }
                    Poll::Ready(Err(error)) => failure = Some(error_kind(&error)),
                }
            }
            for _ in 0..READS_PER_ROUND {
                if failure.is_some() {
                    break;
                }
                match stream.as_mut().poll_read(cx, &mut self.read_buffer) {
                    Poll::Pending => break,
                    Poll::Ready(Ok(0)) => failure = Some(NetworkErrorKind::Closed),
                    Poll::Ready(Ok(n)) => {
                        progressed = true;
                        // Bytes after a frame the engine rejected are ignored by it.
                        self.engine.handle_bytes(conn, &self.read_buffer[..n], now);
                    }
                    Poll::Ready(Err(error)) => failure = Some(error_kind(&error)),
                }
            }
            if let Some(kind) = failure {
                progressed = true;
                self.sockets.remove(&conn);
                self.engine.handle_closed(conn, kind, now);
            }
        }
        progressed
    }

    /// Carries out everything the engine asked for: sockets to open or close, bytes to write,
    /// results and events to deliver (stamped with `now`, the instant of the round that took
    /// them).
    fn flush_engine(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        while let Some(connect) = self.engine.poll_connect() {
            progressed = true;
            let future = self
                .runtime
                .connect(connect.address.host().to_string(), connect.address.port());
            self.sockets.insert(
                connect.conn,
                SocketState {
                    link: Link::Connecting(future),
                    outgoing: VecDeque::new(),
                },
            );
        }
        let mut buf = Vec::new();
        while let Some(conn) = self.engine.poll_transmit(&mut buf) {
            progressed = true;
            if let Some(socket) = self.sockets.get_mut(&conn) {
                socket.outgoing.extend(buf.drain(..));
            }
            buf.clear();
        }
        while let Some(conn) = self.engine.poll_close() {
            progressed = true;
            self.sockets.remove(&conn);
        }
        let events: Vec<EngineEvent> = core::iter::from_fn(|| self.engine.poll_event()).collect();
        if events.is_empty() {
            return progressed;
        }
        // Subscribers get an operation's events before its caller gets its result.
        {
            let mut state = lock(&self.shared.state);
            state.subscribers.retain(|s| Arc::strong_count(s) > 1);
            for subscriber in &state.subscribers {
                for event in &events {
                    subscriber.push((now, event.clone()));
                }
            }
        }
        for event in events {
            match event {
                EngineEvent::CursorOpened { op, cursor } => {
                    if let Some(pending) = self.pending.get_mut(&op) {
                        pending.cursor = Some(cursor);
                    }
                }
                EngineEvent::OperationFinished { op, result } => {
                    if let Some(pending) = self.pending.remove(&op) {
                        let cursor = pending.cursor;
                        pending
                            .slot
                            .complete(result.map(|document| Reply { document, cursor }));
                    }
                }
                _ => {}
            }
        }
        true
    }

    /// Fires the engine's timers that are due and arms the runtime's timer for the next one.
    fn poll_timer(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        let Some(at) = self.engine.poll_timeout() else {
            return false;
        };
        if at <= now {
            self.engine.handle_timeout(now);
            return true;
        }
        // Reset only when the deadline changed: a reset re-registers the timer.
        if self.timer_at != Some(at) {
            self.timer.as_mut().reset(at);
            self.timer_at = Some(at);
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            self.timer_at = None;
            self.engine.handle_timeout(self.runtime.now());
            return true;
        }
        false
    }

    /// Fails every operation in flight or queued with a cancellation, closes every socket and
    /// ends every event stream.
    fn finish(&mut self) {
        self.sockets.clear();
        for (_, pending) in core::mem::take(&mut self.pending) {
            pending.slot.complete(Err(OperationError::cancelled()));
        }
        let mut state = lock(&self.shared.state);
        for request in core::mem::take(&mut state.requests) {
            request.reply.complete(Err(OperationError::cancelled()));
        }
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
            if closing {
                this.finish();
                return Poll::Ready(());
            }
            progressed |= this.flush_engine(now);
            progressed |= this.poll_sockets(cx, now);
            progressed |= this.flush_engine(now);
            progressed |= this.poll_timer(cx, now);
            if !progressed {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The engine's name for an I/O error.
pub(crate) fn error_kind(error: &io::Error) -> NetworkErrorKind {
    match error.kind() {
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
            NetworkErrorKind::Reset
        }
        io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe => NetworkErrorKind::Closed,
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => NetworkErrorKind::Timeout,
        io::ErrorKind::InvalidInput | io::ErrorKind::NotFound => NetworkErrorKind::Dns,
        _ => NetworkErrorKind::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_to_the_engines_kinds() {
        let kind = |k| error_kind(&io::Error::from(k));
        assert_eq!(
            kind(io::ErrorKind::ConnectionReset),
            NetworkErrorKind::Reset
        );
        assert_eq!(kind(io::ErrorKind::UnexpectedEof), NetworkErrorKind::Closed);
        assert_eq!(kind(io::ErrorKind::TimedOut), NetworkErrorKind::Timeout);
        assert_eq!(kind(io::ErrorKind::InvalidInput), NetworkErrorKind::Dns);
        assert_eq!(kind(io::ErrorKind::ConnectionRefused), NetworkErrorKind::Io);
    }
}
