//! What a client and its driver share: the queue of operations to start and to cancel, each
//! operation's result slot, the event streams, and the shutdown flag. Plain data behind mutexes;
//! the driver (`driver.rs`) fills it and the client (`client.rs`) reads it.

use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bson::{Document, RawDocumentBuf};
use retry_core::address::ServerAddress;
use retry_core::engine::{CursorHandle, EngineEvent, OpId, OperationRequest};
use retry_core::error::OperationError;
use retry_core::time::Instant;

/// An engine event with the instant, on the client's clock (time since its creation), at which
/// the driver took it from the engine.
pub type TimedEvent = (Instant, EngineEvent);

/// A successful command's reply.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The reply document.
    pub document: Document,
    /// The cursor the command opened (with `CursorUse::Open` and a non-zero `cursor.id`).
    pub cursor: Option<CursorHandle>,
}

/// A successful command's reply as the engine gave it, still encoded: converted into a
/// [`Reply`] only for callers that want a document. The engine's success may still carry write
/// errors: an error for the caller, naming the server that replied and keeping the reply (never
/// retried, RW-3), read where the caller takes the reply ([`RawReply::into_reply`],
/// [`RawReply::checked`]), so a converted reply is not walked once more for them.
pub(crate) struct RawReply {
    pub(crate) body: RawDocumentBuf,
    pub(crate) cursor: Option<CursorHandle>,
    /// The server that sent it (RW-3), when the engine names one.
    pub(crate) address: Option<ServerAddress>,
    /// An empty document to build the reply's into ([`Engine::take_document`](
    /// retry_core::engine::Engine::take_document)), when the engine had one.
    pub(crate) document: Option<Document>,
    /// The operation ran under CSOT, by its own timeout (a session's `defaultTimeoutMS` on its
    /// commit or abort, TO-14) or the client's `timeoutMS`: a write error with code 50
    /// (MaxTimeMSExpired) is then the timeout error (CS-7).
    pub(crate) csot: bool,
}

impl RawReply {
    /// The reply with its document converted ([`retry_core::wire::to_document`], which cannot
    /// fail on a reply the engine decoded), built into the reply's emptied command document and
    /// clones of `empty` ([`retry_core::wire::into_document_in`], issue 9: no table allocated or
    /// hasher seed drawn for the top-level document, and a small reply's buffer kept as its
    /// first key); its write errors are the error (RW-3).
    pub(crate) fn into_reply(self, empty: &Document) -> Result<Reply, OperationError> {
        let document = retry_core::wire::into_document_in(self.body, self.document, empty);
        let document = document.map_err(|e| {
            OperationError::internal(format!("a decoded reply did not convert: {e}"))
        })?;
        if document.contains_key("writeErrors") {
            if let Some(error) = write_error(self.address.as_ref(), &document, self.csot) {
                return Err(error);
            }
        }
        Ok(Reply {
            document,
            cursor: self.cursor,
        })
    }

    /// The reply left encoded, or its write errors (RW-3). Only a reply with a top-level
    /// `writeErrors` key is converted to a document for them; any other has none (the rule
    /// reads that key alone).
    pub(crate) fn checked(self) -> Result<RawReply, OperationError> {
        // `true` as well if an element cannot be sized: the full conversion then decides.
        let may_have = retry_core::wire::has_top_level_key(&self.body, b"writeErrors");
        if !may_have.unwrap_or(true) {
            return Ok(self);
        }
        let Ok(document) = retry_core::wire::to_document(&self.body) else {
            return Ok(self);
        };
        match write_error(self.address.as_ref(), &document, self.csot) {
            Some(error) => Err(error),
            None => Ok(self),
        }
    }
}

/// The write errors of a reply converted to `document`, as the error of the server at `address`
/// that sent it (RW-3): the one rule of [`RawReply::into_reply`] and [`RawReply::checked`].
/// CS-7: under `timeoutMS` (`csot`), write errors with a MaxTimeMSExpired (code 50) among them
/// are the timeout error, wrapping them.
fn write_error(
    address: Option<&ServerAddress>,
    document: &Document,
    csot: bool,
) -> Option<OperationError> {
    let error = match address {
        Some(address) => OperationError::from_write_reply(document, address),
        None => OperationError::from_write_reply(document, &unknown_address()),
    }?;
    Some(if csot && error.is_max_time_expired() {
        error.max_time_expired_timeout()
    } else {
        error
    })
}

/// The address of a success the engine names no server for (never, for a reply with write
/// errors: only a server's reply has them).
fn unknown_address() -> ServerAddress {
    ServerAddress::new("unknown", 0)
}

/// What an operation of a client whose driver's runtime has shut down fails with (review32 R5):
/// a usage error (nothing was sent). A client is bound to the runtime current at its connect,
/// which runs its driver's task.
pub(crate) fn runtime_gone() -> OperationError {
    OperationError::usage(RUNTIME_GONE)
}

/// [`runtime_gone`]'s message.
pub(crate) const RUNTIME_GONE: &str = "the runtime this client was created on has shut down: a \
     client is bound to the runtime current at its connect, which runs its driver, and cannot be \
     used once that runtime is gone (create the client on the runtime that uses it)";

/// What an operation of a client whose driver panicked fails with (review34 Y1): an internal
/// error (a bug; one in flight may have been sent), never the runtime's loss.
pub(crate) fn driver_panicked() -> OperationError {
    OperationError::internal(DRIVER_PANICKED)
}

/// [`driver_panicked`]'s message.
pub(crate) const DRIVER_PANICKED: &str = "the client's driver panicked (a bug in the driver; \
     the panic's message was printed where it happened): the client is closed, create a new one";

/// Why a client is closing (review34 Y1): what its operations fail with from then on
/// ([`SharedState::closed_error`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Closed {
    /// [`crate::Client::shutdown`], or the client's last handle dropped: operations fail
    /// [`OperationError::cancelled`].
    #[default]
    Shutdown,
    /// The runtime the driver's task was spawned on dropped the task before the driver stopped
    /// (it has shut down): [`runtime_gone`] (review32 R5).
    RuntimeGone,
    /// A pass of the driver panicked: [`driver_panicked`].
    DriverPanicked,
}

/// Locks `mutex`; a panic elsewhere while it was held does not poison the client.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What an operation ends with.
pub(crate) type OperationResult = Result<RawReply, OperationError>;

struct SlotState {
    /// The operation, queued for the driver to start ([`Slot::start`] takes it).
    request: Option<OperationRequest>,
    /// TO-14: the operation's own CSOT timeout (a session's `defaultTimeoutMS`, for its
    /// `commitTransaction` or `abortTransaction`), which the driver starts it under in place of
    /// the client's `timeoutMS`; `None`: the client's.
    timeout: Option<Duration>,
    /// `Ready` once the operation ended, until the caller takes it: [`Slot::poll`] returns
    /// it as it is (issue 9: one copy of the 152-byte result, not an `Option`'s two).
    result: Poll<OperationResult>,
    waker: Option<Waker>,
    /// The engine's id for the operation, once the driver started it.
    op: Option<OpId>,
    /// The caller dropped its future: the driver must not start it, or must cancel it.
    abandoned: bool,
    /// Its result is counted in [`Shared::results_to_take`] (its caller was woken for it), in
    /// the count numbered here ([`ResultsToTake::count`]).
    counted: Option<u32>,
}

impl Default for SlotState {
    fn default() -> SlotState {
        SlotState {
            request: None,
            timeout: None,
            result: Poll::Pending,
            waker: None,
            op: None,
            abandoned: false,
            counted: None,
        }
    }
}

/// One operation on its way: the request until the driver starts it, then where its result goes,
/// a one-shot slot the caller awaits. The client's queue holds the slots (issue 9: the 232-byte
/// request is written once, into the slot, and taken once, by the driver; a queue of requests
/// copied it into the queue, out of it and into the start).
#[derive(Default)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    /// Its caller is running the driver ([`Slot::driving`]) and polls the slot right after.
    driving: AtomicBool,
    /// A result was stored (set under the lock, after it): a hint for the caller, which takes
    /// the result under the lock ([`Slot::is_completed`]).
    completed: AtomicBool,
}

impl Slot {
    /// Stores the result (the first one) and wakes the caller, after the lock is released: the
    /// woken task, maybe on another thread, does not wait for it. A caller that is running the
    /// driver itself ([`Slot::driving`]) is not woken: it polls the slot when the run ends. A
    /// result its caller gave up on ([`Slot::abandon`]) is not stored but dropped, after the
    /// lock is released: a spent slot kept for reuse holds no reply nobody will read.
    /// A result whose caller is woken for it is counted in `results` when given (a
    /// [`LocalDriver`](crate::driver::LocalDriver)'s [`Shared::results_to_take`]) until its
    /// caller takes it ([`Slot::poll`]) or gives up on it ([`Slot::abandon`]), or a later pass
    /// of the driver completes an operation ([`ResultsToTake`]).
    ///
    /// Inlined into the driver's pass, which calls it once per operation (issue 9: 12–13
    /// instructions fewer per round trip, docs/benchmarks.md, driver25); the cold paths (the
    /// shutdown's cancellations) call [`Slot::complete_cold`], so that it is inlined there only.
    #[inline(always)]
    pub(crate) fn complete(&self, result: OperationResult, results: Option<&ResultsToTake>) {
        if let Some(results) = results {
            results.completing();
        }
        let waker = {
            let mut state = lock(&self.state);
            if state.abandoned {
                drop(state);
                drop(result);
                return;
            }
            // Not started (the client closed first): nobody will start it. Dropped in place
            // (issue 9: a take, or a move into `drop`, copies the 232 bytes even of a `None`).
            state.request = None;
            if state.result.is_pending() {
                state.result = Poll::Ready(result);
                self.completed.store(true, Ordering::Release);
            }
            if self.driving.load(Ordering::Acquire) {
                return;
            }
            let waker = state.waker.take();
            if let (Some(results), Some(_), None) = (results, &waker, state.counted) {
                if state.result.is_ready() {
                    state.counted = Some(results.count());
                }
            }
            waker
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// [`Slot::complete`], not inlined: for the cold paths (review28 U12).
    #[cold]
    #[inline(never)]
    pub(crate) fn complete_cold(&self, result: OperationResult, results: Option<&ResultsToTake>) {
        self.complete(result, results);
    }

    /// Whether a result was stored: its caller's next poll takes it, so it need not register
    /// to be woken again (issue 9: a [`crate::driver::Waiter`] does not re-register a task
    /// that is about to leave).
    pub(crate) fn is_completed(&self) -> bool {
        self.completed.load(Ordering::Acquire)
    }

    /// Runs `drive` (the caller running the driver, which may complete this slot) without the
    /// completion waking the caller's task, which is running it and polls the slot next: one
    /// poll per result, not a second one for a wake of the task by itself (issue 9). The caller
    /// must poll the slot after it.
    pub(crate) fn driving(&self, drive: impl FnOnce()) {
        self.driving.store(true, Ordering::Release);
        drive();
        // A completion from now on (another runner's) wakes the caller; one before it is seen
        // by the caller's poll, which takes the lock after this store.
        self.driving.store(false, Ordering::Release);
    }

    /// Takes the result, or registers `cx` to be woken for it; a taken result counted in
    /// `results` ([`Slot::complete`]) is counted out.
    ///
    /// Inlined into [`ReplyFuture`](crate::client)'s poll, its caller (issue 9: a call less per
    /// poll, two polls per round trip: the pair measured 27–33 instructions fewer per round
    /// trip, docs/benchmarks.md, driver25).
    #[inline(always)]
    pub(crate) fn poll(
        &self,
        cx: &mut Context<'_>,
        results: &ResultsToTake,
    ) -> Poll<OperationResult> {
        let mut state = lock(&self.state);
        if state.result.is_pending() {
            if !state
                .waker
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                state.waker = Some(cx.waker().clone());
            }
            return Poll::Pending;
        }
        // Taken: nothing is left to cancel, and nobody to wake (a spent slot kept for reuse
        // holds no task).
        state.op = None;
        state.waker = None;
        if let Some(pass) = state.counted.take() {
            results.uncount(pass);
        }
        core::mem::replace(&mut state.result, Poll::Pending)
    }

    /// Starts the queued operation with `start` unless the caller gave up on it, and notes its
    /// id (to cancel it if the caller gives up later); the caller cannot give up while it
    /// starts. A request given up on is dropped after the lock is released.
    /// `start` is given the slot's place of the request, to take it from (issue 9: taken
    /// straight into the engine's argument, not first into a local of its own), and the
    /// request's own CSOT timeout, if it has one (TO-14, [`SharedState::slot`]).
    ///
    /// Inlined into the driver's pass, which calls it once per operation (issue 9: 9–29
    /// instructions fewer per round trip, docs/benchmarks.md, driver25).
    #[inline(always)]
    pub(crate) fn start(
        &self,
        start: impl FnOnce(&mut Option<OperationRequest>, Option<Duration>) -> Option<OpId>,
    ) -> Option<OpId> {
        let mut state = lock(&self.state);
        if state.abandoned {
            let request = state.request.take();
            drop(state);
            drop(request);
            return None;
        }
        let state = &mut *state;
        let op = start(&mut state.request, state.timeout)?;
        state.op = Some(op);
        Some(op)
    }

    /// The caller gives up: the engine's operation to cancel, if it started and has no result.
    /// A result already stored is taken out and dropped after the lock is released (the slot
    /// may be kept for reuse, and nobody will read it), and counted out of `results`
    /// ([`Slot::complete`]).
    pub(crate) fn abandon(&self, results: &ResultsToTake) -> Option<OpId> {
        let mut state = lock(&self.state);
        state.abandoned = true;
        state.waker = None;
        match core::mem::replace(&mut state.result, Poll::Pending) {
            Poll::Ready(result) => {
                state.op = None;
                if let Some(pass) = state.counted.take() {
                    results.uncount(pass);
                }
                drop(state);
                drop(result);
                None
            }
            Poll::Pending => state.op,
        }
    }
}

/// The monitoring events of one subscriber, in order.
#[derive(Default)]
pub(crate) struct EventQueue {
    state: Mutex<(VecDeque<TimedEvent>, Option<Waker>, bool)>,
}

impl EventQueue {
    pub(crate) fn push(&self, event: TimedEvent) {
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

/// [`Shared::results_to_take`]: the results that the latest pass of the driver that completed
/// any woke their callers for and that are not taken yet.
///
/// Review25 R2: a caller woken for its result but never polled again (its future kept by a
/// `select` that another branch won) would otherwise be counted until its future goes, and
/// every first poll meanwhile would defer its start
/// ([`Waiter::defer`](crate::driver::Waiter::defer)) for a result nobody is about to take. Its
/// count ends when a later pass completes an operation (counted or not: a lone operation's
/// caller runs the driver and is not woken), as the callers of the earlier pass have been
/// polled since, or are not about to be. Not at every pass: passes run by woken futures between
/// a batch's wake and its callers' polls would end the batch's count early.
#[derive(Default)]
pub(crate) struct ResultsToTake {
    /// The number (wrapping) of the pass whose results count, in the high half; how many of
    /// them are not taken yet, in the low half. A result taken 2^32 counting passes after its
    /// own counts out one of the current pass's (never below 0): that count ends a result
    /// early, and the first polls meanwhile run passes of their own instead of deferring, as
    /// without a count; nothing waits longer (review26 S4).
    counts: AtomicU64,
    /// A pass started and has completed nothing yet: its first completion starts a new count.
    new_pass: AtomicBool,
}

impl ResultsToTake {
    /// Whether callers were woken for results they have not taken yet.
    pub(crate) fn any(&self) -> bool {
        self.counts.load(Ordering::Acquire) as u32 != 0
    }

    /// A pass of the driver starts (under the driver's lock, as every completion is made).
    pub(crate) fn new_pass(&self) {
        self.new_pass.store(true, Ordering::Relaxed);
    }

    /// An operation completes: the first completion of a pass ends the earlier pass's count.
    fn completing(&self) {
        if self.new_pass.load(Ordering::Relaxed) {
            self.new_pass.store(false, Ordering::Relaxed);
            let pass = (self.counts.load(Ordering::Relaxed) >> 32) as u32;
            self.counts
                .store(u64::from(pass.wrapping_add(1)) << 32, Ordering::Release);
        }
    }

    /// Counts a result whose caller is woken for it; returns the pass that counted it.
    fn count(&self) -> u32 {
        (self.counts.fetch_add(1, Ordering::AcqRel) >> 32) as u32
    }

    /// Counts out a result counted by `pass`, unless another pass's count started since.
    fn uncount(&self, pass: u32) {
        let mut current = self.counts.load(Ordering::Acquire);
        // Bounded by the concurrent changes: each failure is another's count, uncount or pass.
        while (current >> 32) as u32 == pass && current as u32 != 0 {
            match self.counts.compare_exchange_weak(
                current,
                current - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(now) => current = now,
            }
        }
    }
}

/// What the client and its driver share.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<SharedState>,
    /// Results the driver stored in their slots and woke their callers for, not taken yet (of
    /// its latest pass that completed any, [`ResultsToTake`]; counted by a
    /// [`LocalDriver`](crate::driver::LocalDriver)'s completions only):
    /// those callers are about to be polled, and may queue operations of their own (issue 9: a
    /// first poll that sees some lets the pass that starts its operation start theirs too,
    /// [`Waiter::defer`](crate::driver::Waiter::defer)).
    pub(crate) results_to_take: ResultsToTake,
    /// The empty document every converted reply's documents are cloned from.
    pub(crate) empty_document: EmptyDocument,
}

/// An empty document ([`retry_core::wire::empty_document`]): the template of the client's
/// reply documents ([`RawReply::into_reply`]), whose clones share its hasher.
pub(crate) struct EmptyDocument(pub(crate) Document);

impl Default for EmptyDocument {
    fn default() -> EmptyDocument {
        EmptyDocument(retry_core::wire::empty_document())
    }
}

#[derive(Default)]
pub(crate) struct SharedState {
    /// The operations the client asked for, in their slots ([`Slot::start`]); the driver sets
    /// each one's CSOT deadline from its own timeout (TO-14), else the client's `timeoutMS`.
    pub(crate) requests: VecDeque<Arc<Slot>>,
    /// The operations the driver had in flight when it last looked, queued ones included (an
    /// estimate for [`SpawnedDriver::run_inline`](crate::driver::SpawnedDriver::run_inline)).
    pub(crate) operations: usize,
    /// Started operations whose callers dropped their futures.
    pub(crate) cancels: Vec<OpId>,
    pub(crate) driver: Option<Waker>,
    /// Shutdown was asked for.
    pub(crate) closing: bool,
    /// Why `closing` is set, once it is (review34 Y1).
    pub(crate) closed: Closed,
    /// The driver has stopped: every operation has its result.
    pub(crate) done: bool,
    pub(crate) done_wakers: Vec<Waker>,
    pub(crate) subscribers: Vec<Arc<EventQueue>>,
    /// Explicit sessions to start and to end.
    pub(crate) sessions: crate::session::SessionRequests,
    /// The slots of finished operations, oldest first, for the next requests once their callers
    /// let go of them ([`SharedState::slot`]).
    pub(crate) spent_slots: VecDeque<Arc<Slot>>,
    /// Empty strings for the next requests' database names ([`Engine::take_db_name`](
    /// retry_core::engine::Engine::take_db_name)), at most [`SPENT_SLOTS`].
    pub(crate) spare_names: Vec<String>,
}

/// Spent slots kept for reuse, at most: the driver keeps the slot of each operation whose
/// result it stored ([`Slot::complete`]).
pub(crate) const SPENT_SLOTS: usize = 64;

impl SharedState {
    /// `db` in a spare string (issue 9: no allocation per operation when the engine gave one
    /// back), or in a new one.
    pub(crate) fn db_name(&mut self, db: &str) -> String {
        let mut name = self.spare_names.pop().unwrap_or_default();
        name.push_str(db);
        name
    }

    /// A slot for a new request: the oldest spent one whose caller let go of it, emptied
    /// (issue 9: no allocation and no free per operation), else a new one. At most four spent
    /// slots are looked at (house rule 9); one whose caller has not taken its result yet goes
    /// to the back, to be looked at again later. With `db`, the request's database name is
    /// written there, in a spare string ([`SharedState::db_name`]; issue 9: in place, the
    /// request not copied once more to be changed first). TO-14: `timeout` is the request's own
    /// CSOT timeout (a session's `defaultTimeoutMS` for its commit or abort), which the driver
    /// starts it under in place of the client's `timeoutMS` ([`Slot::start`]); `None` for the
    /// client's.
    pub(crate) fn slot(
        &mut self,
        request: OperationRequest,
        db: Option<&str>,
        timeout: Option<Duration>,
    ) -> Arc<Slot> {
        let name = db.map(|db| self.db_name(db));
        for _ in 0..4 {
            let Some(mut spent) = self.spent_slots.pop_front() else {
                break;
            };
            if let Some(slot) = Arc::get_mut(&mut spent) {
                // Emptied field by field, the request written in place (a result nobody took
                // is dropped: [`Client::submit`](crate::Client)'s callers let go at once).
                let state = slot.state.get_mut().unwrap_or_else(PoisonError::into_inner);
                let request = state.request.insert(request);
                if let Some(name) = name {
                    request.db = name;
                }
                state.timeout = timeout;
                state.result = Poll::Pending;
                state.waker = None;
                state.op = None;
                state.abandoned = false;
                // Taking or giving up on a result counts it out (`Slot::poll`, `Slot::abandon`):
                // a spent slot holds no count.
                debug_assert!(
                    state.counted.is_none(),
                    "a spent slot's result is counted out"
                );
                *slot.driving.get_mut() = false;
                *slot.completed.get_mut() = false;
                return spent;
            }
            self.spent_slots.push_back(spent);
        }
        let mut slot = Slot::default();
        let state = slot.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let request = state.request.insert(request);
        if let Some(name) = name {
            request.db = name;
        }
        state.timeout = timeout;
        Arc::new(slot)
    }

    /// Why an operation or a session asked for once the client is closing fails, by its
    /// reason ([`Closed`]): [`OperationError::cancelled`] after a shutdown, [`runtime_gone`]
    /// after the runtime the driver ran on shut down (review32 R5), [`driver_panicked`] after a
    /// panic in a pass of the driver (review34 Y1). Read only on that cold path.
    #[cold]
    pub(crate) fn closed_error(&self) -> OperationError {
        match self.closed {
            Closed::Shutdown => OperationError::cancelled(),
            Closed::RuntimeGone => runtime_gone(),
            Closed::DriverPanicked => driver_panicked(),
        }
    }

    /// Wakes the driver, for new work.
    pub(crate) fn wake_driver(&mut self) {
        if let Some(waker) = self.driver.take() {
            waker.wake();
        }
    }
}

impl Shared {
    /// Asks the driver to shut down.
    pub(crate) fn close(&self) {
        let mut state = lock(&self.state);
        state.closing = true;
        state.wake_driver();
    }

    /// The caller of `slot`'s operation gave up on it: the driver cancels it in the engine.
    pub(crate) fn abandon(&self, slot: &Slot) {
        let Some(op) = slot.abandon(&self.results_to_take) else {
            return;
        };
        let mut state = lock(&self.state);
        state.cancels.push(op);
        state.wake_driver();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Counted(AtomicUsize);

    fn ping() -> OperationRequest {
        OperationRequest::new(
            "admin",
            bson::doc! {"ping": 1},
            retry_core::retry::OperationKind::RunCommand,
            retry_core::selection::SelectionCriteria::Write,
        )
    }

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// CS-7, RW-3: a write reply whose `writeErrors` hold a MaxTimeMSExpired (code 50) is the
    /// timeout error under `timeoutMS`, wrapping the write errors and naming the server; without
    /// it, and for other codes, the write error. Both ways of reading a reply agree.
    #[test]
    fn cs7_a_write_error_50_under_timeout_ms_is_the_timeout_error() {
        use retry_core::error::ErrorKind;
        let address = ServerAddress::new("a", 27017);
        let raw = |code: i32, csot: bool| RawReply {
            body: bson::rawdoc! { "ok": 1, "n": 0,
            "writeErrors": [{ "index": 0, "code": code, "errmsg": "operation exceeded time limit" }] },
            cursor: None,
            address: Some(address.clone()),
            document: None,
            csot,
        };
        let empty = Document::new();
        for (code, csot, timeout) in [(50, true, true), (50, false, false), (11000, true, false)] {
            let errors = [
                raw(code, csot).into_reply(&empty).unwrap_err(),
                raw(code, csot).checked().err().expect("an error"),
            ];
            for error in errors {
                assert_eq!(error.address.as_ref(), Some(&address));
                match &error.kind {
                    ErrorKind::Timeout { cause: Some(cause) } => {
                        assert!(timeout, "{code} {csot}: {error}");
                        assert!(matches!(cause.kind, ErrorKind::Write(_)), "{error}");
                    }
                    ErrorKind::Write(_) => assert!(!timeout, "{code} {csot}: {error}"),
                    _ => panic!("{code} {csot}: {error}"),
                }
            }
        }
    }

    /// Issue 9: a result completed while its own caller runs the driver ([`Slot::driving`])
    /// does not wake the caller's task (which polls the slot next and takes it); one completed
    /// after that, by another runner, does.
    #[test]
    fn a_caller_running_the_driver_is_not_woken_for_its_own_result() {
        let task = Arc::new(Counted(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let slot = Slot::default();
        assert!(slot.poll(&mut cx, &ResultsToTake::default()).is_pending());
        assert!(!slot.is_completed());
        slot.driving(|| slot.complete(Err(OperationError::cancelled()), None));
        assert!(slot.is_completed(), "its caller need not register again");
        assert_eq!(task.0.load(Ordering::Relaxed), 0, "no wake of itself");
        assert!(
            slot.poll(&mut cx, &ResultsToTake::default()).is_ready(),
            "its poll takes the result"
        );

        let other = Slot::default();
        assert!(other.poll(&mut cx, &ResultsToTake::default()).is_pending());
        other.driving(|| {});
        other.complete(Err(OperationError::cancelled()), None);
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "woken by another runner");
        assert!(other.poll(&mut cx, &ResultsToTake::default()).is_ready());
    }

    /// How many results `results` counts in its latest pass.
    fn counted(results: &ResultsToTake) -> u32 {
        results.counts.load(Ordering::Relaxed) as u32
    }

    /// A slot whose caller polled it once with a counting waker (registered, no result yet).
    fn waiting_slot(cx: &mut Context<'_>, results: &ResultsToTake) -> Slot {
        let slot = Slot::default();
        assert!(slot.poll(cx, results).is_pending());
        slot
    }

    /// Review25 R3 (issue 9): a result is counted in [`Shared::results_to_take`] when its
    /// caller is woken for it, once however often it is completed, and counted out when the
    /// caller takes it or gives up on it; a result its caller is not woken for (no waker, or
    /// the caller runs the driver itself) is not counted.
    #[test]
    fn review25_r3_results_to_take_counts_callers_woken_for_their_results() {
        let results = ResultsToTake::default();
        let task = Arc::new(Counted(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let cancelled = || Err(OperationError::cancelled());

        let slot = waiting_slot(&mut cx, &results);
        slot.complete(cancelled(), Some(&results));
        assert_eq!(counted(&results), 1, "its caller is woken for it");
        slot.complete(cancelled(), Some(&results));
        assert_eq!(
            counted(&results),
            1,
            "a second completion counts nothing more"
        );
        assert!(slot.poll(&mut cx, &results).is_ready());
        assert_eq!(counted(&results), 0, "taken");

        let slot = waiting_slot(&mut cx, &results);
        slot.complete(cancelled(), Some(&results));
        assert_eq!(slot.abandon(&results), None);
        assert_eq!(counted(&results), 0, "given up on");

        let slot = waiting_slot(&mut cx, &results);
        slot.driving(|| slot.complete(cancelled(), Some(&results)));
        assert_eq!(
            counted(&results),
            0,
            "its caller runs the driver: not woken"
        );
        assert!(slot.poll(&mut cx, &results).is_ready());

        Slot::default().complete(cancelled(), Some(&results));
        assert_eq!(counted(&results), 0, "nobody to wake");
        assert!(!results.any());
    }

    /// Review25 R2 (issue 9): a result whose caller is never polled counts until a later pass
    /// completes an operation, whether that result is counted (its caller woken) or not (its
    /// caller running the driver); taking it later counts out nothing of the later pass.
    #[test]
    fn review25_r2_a_result_counts_until_a_later_pass_completes_one() {
        let results = ResultsToTake::default();
        let task = Arc::new(Counted(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let kept = waiting_slot(&mut cx, &results);
        kept.complete(Err(OperationError::cancelled()), Some(&results));
        results.new_pass();
        assert!(
            results.any(),
            "a pass that completes nothing keeps the count"
        );
        let fresh = waiting_slot(&mut cx, &results);
        fresh.complete(Err(OperationError::cancelled()), Some(&results));
        assert_eq!(counted(&results), 1, "only the later pass's result counts");
        assert!(kept.poll(&mut cx, &results).is_ready());
        assert_eq!(
            counted(&results),
            1,
            "taking the earlier one counts out nothing"
        );
        assert!(fresh.poll(&mut cx, &results).is_ready());
        assert_eq!(counted(&results), 0);

        let kept = waiting_slot(&mut cx, &results);
        kept.complete(Err(OperationError::cancelled()), Some(&results));
        results.new_pass();
        let lone = waiting_slot(&mut cx, &results);
        lone.driving(|| lone.complete(Err(OperationError::cancelled()), Some(&results)));
        assert!(
            !results.any(),
            "ended by a completion its caller ran the driver for"
        );
        drop(kept);
    }

    /// Review25 R3, review26 S10: a slot is reused once its caller let go of it, after taking
    /// its result or giving up on it (both count it out): its next caller's wake for a new
    /// result counts, as for a new slot (a slot given up on must not drop the new result).
    #[test]
    fn review25_r3_a_reused_slot_counts_its_new_result() {
        let results = ResultsToTake::default();
        let task = Arc::new(Counted(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        for give_up in [false, true] {
            let mut state = SharedState::default();
            let spent = Arc::new(waiting_slot(&mut cx, &results));
            spent.complete(Err(OperationError::cancelled()), Some(&results));
            assert_eq!(counted(&results), 1);
            if give_up {
                assert_eq!(spent.abandon(&results), None);
            } else {
                assert!(spent.poll(&mut cx, &results).is_ready());
            }
            assert_eq!(counted(&results), 0, "counted out ({give_up})");
            state.spent_slots.push_back(spent);
            let reused = state.slot(ping(), None, None);
            assert!(state.spent_slots.is_empty(), "reused ({give_up})");
            assert!(reused.poll(&mut cx, &results).is_pending());
            reused.complete(Err(OperationError::cancelled()), Some(&results));
            assert_eq!(counted(&results), 1, "its new result counts ({give_up})");
            assert!(reused.poll(&mut cx, &results).is_ready());
        }
    }

    /// Issue 9: a spent slot is reused, emptied, once its caller let go of it; one its caller
    /// still holds is not reused under it (a new one is made) and is looked at again later.
    #[test]
    fn a_spent_slot_is_reused_once_its_caller_let_go() {
        let mut state = SharedState::default();
        let held = Arc::new(Slot::default());
        held.complete(Err(OperationError::cancelled()), None);
        state.spent_slots.push_back(held.clone());
        let fresh = state.slot(ping(), None, None);
        assert!(
            !Arc::ptr_eq(&fresh, &held),
            "a slot its caller holds is not reused"
        );
        assert_eq!(state.spent_slots.len(), 1, "kept for later");
        drop(held);

        let address = Arc::as_ptr(&state.spent_slots[0]);
        let reused = state.slot(ping(), None, None);
        assert_eq!(Arc::as_ptr(&reused), address, "reused");
        assert!(!reused.is_completed(), "no result yet");
        let state = lock(&reused.state);
        assert!(state.result.is_pending() && state.op.is_none() && !state.abandoned);
        assert!(state.request.is_some(), "holds its request");
    }

    /// TO-14: a request's own CSOT timeout (a session's `defaultTimeoutMS` for its commit or
    /// abort) is handed to the driver's start with it; a slot reused for a request without one
    /// hands none (the client's `timeoutMS` applies), not the earlier request's.
    #[test]
    fn to14_a_slot_hands_its_requests_own_timeout_to_the_start() {
        let own = Duration::from_millis(600_000);
        let mut state = SharedState::default();
        let slot = state.slot(ping(), None, Some(own));
        let mut given = None;
        let started = slot.start(|request, timeout| {
            assert!(request.take().is_some(), "its request");
            given = Some(timeout);
            Some(OpId(1))
        });
        assert_eq!(started, Some(OpId(1)));
        assert_eq!(given, Some(Some(own)));
        slot.complete(Err(OperationError::cancelled()), None);
        let results = ResultsToTake::default();
        assert!(slot.abandon(&results).is_none());
        state.spent_slots.push_back(slot);

        let reused = state.slot(ping(), None, None);
        assert!(state.spent_slots.is_empty(), "reused");
        let mut given = None;
        reused.start(|_, timeout| {
            given = Some(timeout);
            Some(OpId(2))
        });
        assert_eq!(
            given,
            Some(None),
            "the earlier request's timeout is not kept"
        );
    }

    /// A result, and a second handle on its error's reply: the result is dropped once the
    /// handle is the only one left.
    fn watched_result() -> (OperationResult, Arc<retry_core::error::ServerError>) {
        let reply = bson::doc! {"ok": 0, "code": 1, "errmsg": "watched"};
        let error = OperationError::from_reply(&reply, &ServerAddress::new("a", 1)).unwrap();
        let retry_core::error::ErrorKind::Server(server) = &error.kind else {
            unreachable!("a server error");
        };
        let handle = server.clone();
        (Err(error), handle)
    }

    /// review19 R1 (issue 9): a result whose caller gave up on it is not kept in its slot,
    /// which the driver may keep for reuse: completed then abandoned, the result is dropped by
    /// the abandon; abandoned then completed, it is never stored.
    #[test]
    fn an_abandoned_slot_keeps_no_result() {
        let slot = Slot::default();
        let (result, reply) = watched_result();
        slot.complete(result, None);
        assert_eq!(
            slot.abandon(&ResultsToTake::default()),
            None,
            "nothing to cancel: it finished"
        );
        assert_eq!(Arc::strong_count(&reply), 1, "dropped by the abandon");
        assert!(lock(&slot.state).result.is_pending());

        let slot = Slot::default();
        lock(&slot.state).request = Some(ping());
        assert_eq!(slot.start(|_, _| Some(OpId(7))), Some(OpId(7)));
        assert_eq!(
            slot.abandon(&ResultsToTake::default()),
            Some(OpId(7)),
            "to cancel"
        );
        let (result, reply) = watched_result();
        slot.complete(result, None);
        assert_eq!(Arc::strong_count(&reply), 1, "dropped by the completion");
        assert!(lock(&slot.state).result.is_pending());
    }

    /// review23 R1 (house rule 8): a caller that gives up before the driver starts its
    /// operation (a `ReplyFuture` dropped before its first poll: `run_request` queues at the
    /// call) leaves nothing to cancel, and the driver never starts it; its request is dropped.
    #[test]
    fn a_slot_given_up_before_its_start_is_never_started() {
        let slot = Slot::default();
        lock(&slot.state).request = Some(ping());
        assert_eq!(
            slot.abandon(&ResultsToTake::default()),
            None,
            "not started: nothing to cancel"
        );
        let started = slot.start(|_, _| panic!("an abandoned operation was started"));
        assert_eq!(started, None);
        assert!(
            lock(&slot.state).request.is_none(),
            "its request is dropped"
        );
    }
}
