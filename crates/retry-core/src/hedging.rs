//! Hedged reads (gRPC A6 `hedgingPolicy`): several copies of one read in flight, the first
//! success wins and every other copy is cancelled.
//!
//! A [`HedgingMachine`] runs one operation under a [`HedgingPolicy`], in the shape of
//! [`crate::retry::RetryMachine`]: inputs are `handle_*(.., now)`, outputs are [`Action`]s from
//! [`HedgingMachine::poll_action`], [`HedgingEvent`]s from [`HedgingMachine::poll_event`] and a
//! wake-up time from [`HedgingMachine::poll_timeout`]. Every action and input names its copy
//! ([`CopyId`]), because several copies are in flight at once.
//!
//! # The rules (A6 "Hedging policy", mapped onto MongoDB)
//!
//! - A6-H1: the first copy starts at once; another starts every `hedgingDelay` while none has
//!   succeeded, up to `maxAttempts` copies in all (the first included). A zero delay starts every
//!   copy at once.
//! - A6-H2: a non-fatal failure (a server code in `nonFatalCodes`, or a network or pool-cleared
//!   error, gRPC's `UNAVAILABLE`) starts the next copy at once; the schedule then resumes
//!   `hedgingDelay` after it.
//! - A6-H3: the first success, or a fatal failure, ends the operation and cancels every other copy.
//! - A6-H4: when every copy has failed the operation fails with the last failure; hedging never
//!   retries.
//! - A6-H5: copies after the first are started only while the throttle's tokens are above its
//!   threshold; a throttled copy is not sent and no later copy is either. Non-fatal failures take a
//!   token, the winning success adds `tokenRatio`.
//! - A6-H6: a pushback of `n` ms on a non-fatal failure starts the next copy exactly `n` ms later
//!   (not at once), later ones `hedgingDelay` apart; a "do not retry" pushback stops further
//!   copies.
//! - A6-H7: copies go to distinct servers where the topology has them: [`HedgingMachine::deprioritized`]
//!   lists every server a copy has used, for the selection of the next copy (SS-11).
//! - Only operations safe to run more than once are hedged: reads ([`hedgeable`]). The caller runs
//!   anything else under the retry rules ([`crate::retry::RetryMachine`]), even when the method has
//!   a hedging policy.
//! - CS-5: with a CSOT deadline, the operation ends with a timeout error when it passes, and every
//!   copy is cancelled.
//!
//! # What the engine does with a cancelled copy
//!
//! [`Action::Cancel`] says how far the copy got ([`CopyStage`]). A copy still selecting is simply
//! dropped; a copy holding a connection it has not written to checks the connection in. A copy in
//! flight keeps its connection until the reply arrives and then checks it in, unused by anyone
//! else meanwhile: closing it would cost a new connection and handshake exactly when the servers
//! are busiest, and a MongoDB server keeps running a read whose client disconnected anyway. Only if
//! the reply has not arrived by the operation's deadline (or the socket timeout) is the connection
//! closed. The machine expects no input for a cancelled copy; the engine reports a late reply to
//! nobody but the pool, and publishes the copy's command-failed event with a cancelled error.

use alloc::sync::Arc;
use core::fmt;
use core::time::Duration;
use smallvec::SmallVec;

use crate::address::ServerAddress;
use crate::budget::GrpcThrottle;
use crate::error::{ErrorKind, ErrorSummary, OperationError, Pushback};
use crate::policy::{OptionError, GRPC_MAX_ATTEMPTS_CAP};
use crate::retry::{OperationKind, Queue};
use crate::time::{Instant, OperationTimeout};

/// The A6 hedging policy of a method, validated.
#[derive(Debug)]
pub struct HedgingPolicy {
    max_attempts: u32,
    delay: Duration,
    non_fatal_codes: SmallVec<[i32; 8]>,
    throttle: Option<Arc<GrpcThrottle>>,
}

impl Clone for HedgingPolicy {
    fn clone(&self) -> HedgingPolicy {
        HedgingPolicy {
            max_attempts: self.max_attempts,
            delay: self.delay,
            non_fatal_codes: self.non_fatal_codes.clone(),
            throttle: self.throttle.clone(),
        }
    }

    /// Copies `source` in place; codes equal to `source`'s and a throttle shared with it are
    /// kept as they are (a restarted hedging machine copies its client's policy: no copy of the
    /// codes and no reference count per operation).
    #[inline]
    fn clone_from(&mut self, source: &HedgingPolicy) {
        self.max_attempts = source.max_attempts;
        self.delay = source.delay;
        if self.non_fatal_codes != source.non_fatal_codes {
            self.non_fatal_codes.clone_from(&source.non_fatal_codes);
        }
        let same = match (&self.throttle, &source.throttle) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if !same {
            self.throttle.clone_from(&source.throttle);
        }
    }
}

impl HedgingPolicy {
    /// A policy from the A6 parameters: `maxAttempts` at least 2 (values above 5 become 5, as for
    /// retries), `hedgingDelay` (zero starts every copy at once) and `nonFatalCodes` (may be
    /// empty: then only network errors are non-fatal).
    pub fn new(
        max_attempts: i64,
        hedging_delay: Duration,
        non_fatal_codes: &[i32],
    ) -> Result<HedgingPolicy, OptionError> {
        if max_attempts < 2 {
            return Err(OptionError::new(
                "maxAttempts",
                "must be an integer of at least 2",
                max_attempts,
            ));
        }
        Ok(HedgingPolicy {
            max_attempts: u32::try_from(max_attempts)
                .unwrap_or(u32::MAX)
                .min(GRPC_MAX_ATTEMPTS_CAP),
            delay: hedging_delay,
            non_fatal_codes: non_fatal_codes.iter().copied().collect(),
            throttle: None,
        })
    }

    /// Throttles copies after the first with `throttle` (A6-H5), shared with the client's retries.
    pub fn with_throttle(mut self, throttle: Arc<GrpcThrottle>) -> HedgingPolicy {
        self.throttle = Some(throttle);
        self
    }

    /// The effective `maxAttempts` (2 to 5).
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// `hedgingDelay`.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// `nonFatalCodes`.
    pub fn non_fatal_codes(&self) -> &[i32] {
        &self.non_fatal_codes
    }

    /// The throttle, if any.
    pub fn throttle(&self) -> Option<&Arc<GrpcThrottle>> {
        self.throttle.as_ref()
    }

    /// A6-H2: whether `error` lets the next copy start rather than ending the operation.
    pub fn is_non_fatal(&self, error: &OperationError) -> bool {
        match &error.kind {
            ErrorKind::Network(_) | ErrorKind::PoolCleared { .. } => true,
            _ => error
                .code()
                .is_some_and(|c| self.non_fatal_codes.contains(&c)),
        }
    }
}

/// Whether operations of `kind` may be hedged: only reads, the one kind that is safe to run more
/// than once and has no session state that two copies could disturb.
pub fn hedgeable(kind: OperationKind) -> bool {
    kind == OperationKind::Read
}

/// One copy of the operation: 1 for the first, up to `maxAttempts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CopyId(pub u32);

impl fmt::Display for CopyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "copy {}", self.0)
    }
}

/// How far a cancelled copy had got, which decides what the engine does with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyStage {
    /// It was selecting a server: stop the selection.
    Selecting,
    /// It held a connection to this server but wrote nothing: check the connection in.
    CheckedOut(ServerAddress),
    /// Its command was written to this server: keep the connection until the reply arrives, then
    /// check it in (close it only if no reply comes by the deadline).
    InFlight(ServerAddress),
}

/// What the caller must do next.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Select a server for this copy, avoiding [`HedgingMachine::deprioritized`] when possible,
    /// then call [`HedgingMachine::handle_server_selected`] or
    /// [`HedgingMachine::handle_selection_failed`].
    SelectServer(CopyId),
    /// Check out a connection to `address` and send the command for this copy.
    Dispatch {
        /// The copy.
        copy: CopyId,
        /// Where to send it.
        address: ServerAddress,
    },
    /// The copy's reply (or failure) was handled: check its connection in, or close it.
    Release {
        /// The copy.
        copy: CopyId,
        /// Whether the connection must be closed (a network error).
        close: bool,
    },
    /// The copy lost: stop it as [`CopyStage`] says. No further input is expected for it.
    Cancel {
        /// The copy.
        copy: CopyId,
        /// How far it had got.
        stage: CopyStage,
    },
    /// The operation is over: the copy whose reply is the result, or the error to raise.
    Finished(Result<CopyId, OperationError>),
}

/// Why a copy after the first is started. More reasons may come: a `match` outside this crate
/// needs a wildcard arm.
///
/// ```compile_fail
/// # use retry_core::hedging::HedgeReason;
/// // Review7 finding 8: non-exhaustive, so this match without a wildcard does not compile.
/// fn name(reason: HedgeReason) -> &'static str {
///     match reason {
///         HedgeReason::Delay => "delay",
///         HedgeReason::NonFatalFailure => "non-fatal failure",
///         HedgeReason::Pushback => "pushback",
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HedgeReason {
    /// `hedgingDelay` passed without a success (A6-H1).
    Delay,
    /// A copy failed with a non-fatal error (A6-H2).
    NonFatalFailure,
    /// A server pushback set the time (A6-H6).
    Pushback,
}

/// Why no further copies are started. More reasons may come: a `match` outside this crate
/// needs a wildcard arm.
///
/// ```compile_fail
/// # use retry_core::hedging::StopReason;
/// // Review7 finding 8: non-exhaustive, so this match without a wildcard does not compile.
/// fn name(reason: StopReason) -> &'static str {
///     match reason {
///         StopReason::Throttled => "throttled",
///         StopReason::Pushback => "pushback",
///         StopReason::SelectionFailed => "selection failed",
///         StopReason::Deadline => "deadline",
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The throttle's tokens are at or below its threshold (A6-H5).
    Throttled,
    /// A server pushback said not to retry (A6-H6).
    Pushback,
    /// Server selection for a copy failed.
    SelectionFailed,
    /// A copy was not sent for lack of time (CS-4): a later one would have even less.
    Deadline,
}

/// A monitoring event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HedgingEvent {
    /// A copy was written to a connection.
    CopyStarted {
        /// The copy.
        copy: CopyId,
        /// Where.
        address: ServerAddress,
    },
    /// A copy succeeded: it is the result.
    CopySucceeded {
        /// The copy.
        copy: CopyId,
        /// Where it ran.
        address: ServerAddress,
        /// From [`HedgingEvent::CopyStarted`] to the reply.
        duration: Duration,
    },
    /// A copy failed.
    CopyFailed {
        /// The copy.
        copy: CopyId,
        /// Where it was sent.
        address: ServerAddress,
        /// From [`HedgingEvent::CopyStarted`] to the failure (zero when nothing was sent).
        duration: Duration,
        /// What it failed with.
        error: ErrorSummary,
        /// Whether the failure ends the operation (A6-H3).
        fatal: bool,
    },
    /// A copy was cancelled because another won, one failed fatally, or the deadline passed.
    CopyCancelled {
        /// The copy.
        copy: CopyId,
        /// How far it had got.
        stage: CopyStage,
    },
    /// The next copy will start at `at`.
    HedgeScheduled {
        /// The copy that will start.
        copy: CopyId,
        /// When.
        at: Instant,
        /// Why.
        reason: HedgeReason,
    },
    /// No further copies will start.
    HedgesStopped {
        /// Why.
        reason: StopReason,
    },
}

/// An input that does not fit the machine's state (a copy that is unknown, cancelled or not at
/// that stage). The machine ignores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnexpectedInput {
    /// The input.
    pub input: &'static str,
    /// The copy it named.
    pub copy: CopyId,
}

impl fmt::Display for UnexpectedInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unexpected input {} for {} of a hedged operation",
            self.input, self.copy
        )
    }
}

impl core::error::Error for UnexpectedInput {}

/// A hedged operation could not be started: its kind is not [`hedgeable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotHedgeable(pub OperationKind);

impl fmt::Display for NotHedgeable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} operations are not safe to run twice and are not hedged; run them under the retry rules",
            self.0
        )
    }
}

impl core::error::Error for NotHedgeable {}

/// A copy's state; its server is an index into [`HedgingMachine::used`], which keeps the machine
/// small.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CopyState {
    Selecting,
    Dispatched(u8),
    InFlight(u8, Instant),
    Done,
}

/// The hedging machine of one read. See the [module docs](self) for the rules.
#[derive(Debug)]
pub struct HedgingMachine {
    policy: HedgingPolicy,
    timeout: OperationTimeout,
    copies: SmallVec<[CopyState; 5]>,
    /// Every server a copy has been sent to, in order (A6-H7).
    used: SmallVec<[ServerAddress; 5]>,
    /// When the next copy starts, if one is scheduled.
    next_at: Option<Instant>,
    stopped: bool,
    finished: bool,
    last_error: Option<OperationError>,
    /// Inline for the usual case; only an end that cancels two copies or more spills to the heap
    /// (the machine stays small enough to sit next to a retry machine in the engine).
    actions: Queue<Action, 3>,
    events: Queue<HedgingEvent, 2>,
    /// Whether monitoring events are recorded (see [`HedgingMachine::without_events`]).
    record_events: bool,
}

impl HedgingMachine {
    /// A machine for one operation of `kind`; the first copy's [`Action::SelectServer`] is ready at
    /// once (with a zero `hedgingDelay`, every copy's). Fails for kinds that are not [`hedgeable`].
    pub fn new(
        kind: OperationKind,
        timeout: OperationTimeout,
        policy: &HedgingPolicy,
        now: Instant,
    ) -> Result<HedgingMachine, NotHedgeable> {
        if !hedgeable(kind) {
            return Err(NotHedgeable(kind));
        }
        let mut machine = HedgingMachine {
            policy: policy.clone(),
            timeout,
            copies: SmallVec::new(),
            used: SmallVec::new(),
            next_at: None,
            stopped: false,
            finished: false,
            last_error: None,
            actions: Queue::new(),
            events: Queue::new(),
            record_events: true,
        };
        machine.start(now);
        Ok(machine)
    }

    /// Makes this machine, finished or not, the machine [`HedgingMachine::new`] would make for
    /// another operation, in place: for a caller that runs many operations one after another (a
    /// simulation). It keeps recording monitoring events or not, as it did
    /// ([`HedgingMachine::without_events`]). Fails, leaving the machine as it was, for kinds that
    /// are not [`hedgeable`].
    pub fn restart(
        &mut self,
        kind: OperationKind,
        timeout: OperationTimeout,
        policy: &HedgingPolicy,
        now: Instant,
    ) -> Result<(), NotHedgeable> {
        if !hedgeable(kind) {
            return Err(NotHedgeable(kind));
        }
        self.policy.clone_from(policy);
        self.timeout = timeout;
        self.copies.clear();
        self.used.clear();
        self.next_at = None;
        self.stopped = false;
        self.finished = false;
        self.last_error = None;
        self.actions.clear();
        self.events.clear();
        self.start(now);
        Ok(())
    }

    /// The first copies of a new operation, or its end when the deadline has already passed.
    fn start(&mut self, now: Instant) {
        if self.timeout.expired(now) {
            self.finish(Err(OperationError::timeout(None)));
        } else {
            self.launch(now);
        }
    }

    /// The next thing to do, in order.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop()
    }

    /// The same machine recording no monitoring events: [`HedgingMachine::poll_event`] then
    /// always returns `None`. For a caller that publishes none (no command-monitoring subscriber,
    /// a simulation). The actions and every decision are the same with or without events.
    #[must_use]
    pub fn without_events(mut self) -> Self {
        self.record_events = false;
        self.events = Queue::new();
        self
    }

    /// The next monitoring event, in order.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<HedgingEvent> {
        self.events.pop()
    }

    /// When [`HedgingMachine::handle_timeout`] must be called: the next copy's start or the
    /// deadline, whichever is first.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.finished {
            return None;
        }
        match (self.next_at, self.timeout.deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A6-H7: the servers copies have used; the next selection avoids them when it can.
    pub fn deprioritized(&self) -> &[ServerAddress] {
        &self.used
    }

    /// Copies started so far (at most `maxAttempts`).
    pub fn copies(&self) -> u32 {
        self.copies.len() as u32
    }

    /// Copies not yet finished or cancelled.
    pub fn live_copies(&self) -> usize {
        self.copies
            .iter()
            .filter(|c| **c != CopyState::Done)
            .count()
    }

    /// Whether `copy` is selecting, dispatched or in flight: the one state in which an input for
    /// it is expected. A caller that learns of a copy's outcome after the machine cancelled it
    /// (the [`Action::Cancel`] not yet handled) drops that input.
    pub fn is_live(&self, copy: CopyId) -> bool {
        !self.finished && self.state(copy).is_some_and(|s| *s != CopyState::Done)
    }

    /// Whether the operation has finished.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The address of a copy's server.
    fn server(&self, server: u8) -> ServerAddress {
        self.used[usize::from(server)].clone()
    }

    fn state(&self, copy: CopyId) -> Option<&CopyState> {
        let index = usize::try_from(copy.0).ok()?.checked_sub(1)?;
        self.copies.get(index)
    }

    fn set(&mut self, copy: CopyId, state: CopyState) {
        self.copies[copy.0 as usize - 1] = state;
    }

    /// A server was selected for `copy`: emits [`Action::Dispatch`].
    pub fn handle_server_selected(
        &mut self,
        copy: CopyId,
        address: ServerAddress,
        _now: Instant,
    ) -> Result<(), UnexpectedInput> {
        if self.finished || self.state(copy) != Some(&CopyState::Selecting) {
            return Err(UnexpectedInput {
                input: "server selected",
                copy,
            });
        }
        let server = match self.used.iter().position(|a| *a == address) {
            Some(i) => i,
            None => {
                self.used.push(address.clone());
                self.used.len() - 1
            }
        };
        // At most `maxAttempts` (5) servers are ever used.
        self.set(copy, CopyState::Dispatched(server as u8));
        self.actions.push(Action::Dispatch { copy, address });
        Ok(())
    }

    /// Selection for `copy` failed. No further copies start; when no copy is left the operation
    /// fails with the last copy's error, or this one.
    ///
    /// Under CSOT, a selection that fails with the deadline passed (its timeout was the remaining
    /// `timeoutMS`, CS-3) ends the operation at once with a timeout error (CS-5; RR-11: with CSOT
    /// the attempts stop when expired) wrapping that same error, whichever of this input and
    /// [`HedgingMachine::handle_timeout`] at the deadline comes first; live copies are cancelled.
    pub fn handle_selection_failed(
        &mut self,
        copy: CopyId,
        error: OperationError,
        now: Instant,
    ) -> Result<(), UnexpectedInput> {
        if self.finished || self.state(copy) != Some(&CopyState::Selecting) {
            return Err(UnexpectedInput {
                input: "selection failed",
                copy,
            });
        }
        self.set(copy, CopyState::Done);
        if self.last_error.is_none() {
            self.last_error = Some(error);
        }
        if self.timeout.expired(now) {
            self.finish_timed_out();
            return Ok(());
        }
        self.stop(StopReason::SelectionFailed);
        self.finish_if_exhausted();
        Ok(())
    }

    /// `copy`'s command was written to its connection.
    pub fn handle_sent(&mut self, copy: CopyId, now: Instant) -> Result<(), UnexpectedInput> {
        let Some(&CopyState::Dispatched(server)) = self.state(copy).filter(|_| !self.finished)
        else {
            return Err(UnexpectedInput {
                input: "sent",
                copy,
            });
        };
        if self.record_events {
            self.events.push(HedgingEvent::CopyStarted {
                copy,
                address: self.server(server),
            });
        }
        self.set(copy, CopyState::InFlight(server, now));
        Ok(())
    }

    /// `copy` succeeded: it is the result (A6-H3); every other copy is cancelled.
    pub fn handle_succeeded(&mut self, copy: CopyId, now: Instant) -> Result<(), UnexpectedInput> {
        let Some(&CopyState::InFlight(server, sent_at)) =
            self.state(copy).filter(|_| !self.finished)
        else {
            return Err(UnexpectedInput {
                input: "succeeded",
                copy,
            });
        };
        if self.record_events {
            self.events.push(HedgingEvent::CopySucceeded {
                copy,
                address: self.server(server),
                duration: now.saturating_duration_since(sent_at),
            });
        }
        self.set(copy, CopyState::Done);
        if let Some(throttle) = &self.policy.throttle {
            throttle.record_success();
        }
        self.actions.push(Action::Release { copy, close: false });
        self.cancel_live();
        self.finish(Ok(copy));
        Ok(())
    }

    /// `copy` failed, before sending (a checkout or connection error) or after. A fatal failure
    /// ends the operation (A6-H3); a non-fatal one starts the next copy (A6-H2, A6-H5, A6-H6).
    pub fn handle_failed(
        &mut self,
        copy: CopyId,
        error: OperationError,
        now: Instant,
    ) -> Result<(), UnexpectedInput> {
        let (address, sent_at) = match self.state(copy).filter(|_| !self.finished) {
            Some(&CopyState::Dispatched(server)) => (self.server(server), None),
            Some(&CopyState::InFlight(server, t)) => (self.server(server), Some(t)),
            _ => {
                return Err(UnexpectedInput {
                    input: "failed",
                    copy,
                })
            }
        };
        self.set(copy, CopyState::Done);
        let fatal = !self.policy.is_non_fatal(&error);
        if self.record_events {
            self.events.push(HedgingEvent::CopyFailed {
                copy,
                address,
                duration: sent_at.map_or(Duration::ZERO, |t| now.saturating_duration_since(t)),
                error: error.summary(),
                fatal,
            });
        }
        let close = matches!(error.kind, ErrorKind::Network(_));
        self.actions.push(Action::Release { copy, close });
        if fatal {
            self.cancel_live();
            let raised = self.raised(error);
            self.finish(Err(raised));
            return Ok(());
        }
        let pushback = error.server_error().and_then(|e| e.pushback);
        self.last_error = Some(error);
        if let Some(throttle) = &self.policy.throttle {
            throttle.record_failure();
        }
        if self.timeout.expired(now) {
            self.finish_timed_out();
            return Ok(());
        }
        match pushback {
            Some(Pushback::DoNotRetry) => self.stop(StopReason::Pushback),
            Some(Pushback::RetryAfter(delay)) => {
                self.next_at = None;
                self.schedule(now, delay, HedgeReason::Pushback);
            }
            None => {
                if self.can_start_more() {
                    self.next_at = None;
                    self.launch(now);
                }
            }
        }
        self.finish_if_exhausted();
        Ok(())
    }

    /// CS-4: `copy` was not sent, as its remaining time is not more than its server's minimum
    /// RTT. A6 deadline rule: a copy that cannot usefully be sent is just not sent; it fails
    /// non-fatally (`CopyFailed { fatal: false }`) and no further copy starts, as any later one
    /// would have even less time. The operation times out now only if no other copy is live;
    /// else a live copy may still answer, and [`HedgingMachine::handle_timeout`] ends it at
    /// the deadline.
    pub fn handle_expired_before_send(
        &mut self,
        copy: CopyId,
        now: Instant,
    ) -> Result<(), UnexpectedInput> {
        let Some(&CopyState::Dispatched(server)) = self.state(copy).filter(|_| !self.finished)
        else {
            return Err(UnexpectedInput {
                input: "expired before send",
                copy,
            });
        };
        let address = self.server(server);
        self.set(copy, CopyState::Done);
        if self.record_events {
            self.events.push(HedgingEvent::CopyFailed {
                copy,
                address,
                duration: Duration::ZERO,
                error: OperationError::timeout(None).summary(),
                fatal: false,
            });
        }
        self.actions.push(Action::Release { copy, close: false });
        self.stop(StopReason::Deadline);
        if self.live_copies() == 0 || self.timeout.expired(now) {
            self.finish_timed_out();
        }
        Ok(())
    }

    /// Time has passed: starts a copy that is due, or ends the operation at its deadline.
    /// Spurious calls are harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.finished {
            return;
        }
        if self.timeout.expired(now) {
            self.finish_timed_out();
            return;
        }
        if self.next_at.is_some_and(|at| now >= at) {
            self.next_at = None;
            self.launch(now);
            self.finish_if_exhausted();
        }
    }

    /// The caller gave up: every copy is cancelled and the operation finishes with
    /// [`ErrorKind::Cancelled`].
    pub fn cancel(&mut self, _now: Instant) {
        if !self.finished {
            self.cancel_live();
            self.finish(Err(OperationError::cancelled()));
        }
    }

    fn can_start_more(&self) -> bool {
        !self.stopped && self.copies() < self.policy.max_attempts
    }

    /// Starts the next copy and schedules the one after it, or, with a zero `hedgingDelay`, starts
    /// every remaining copy at once (A6-H1).
    fn launch(&mut self, now: Instant) {
        if !self.start_copy() {
            return;
        }
        if self.policy.delay.is_zero() {
            while self.start_copy() {}
        } else {
            self.schedule(now, self.policy.delay, HedgeReason::Delay);
        }
    }

    /// Starts the next copy if the cap and the throttle allow it (A6-H1, A6-H5).
    fn start_copy(&mut self) -> bool {
        if !self.can_start_more() {
            return false;
        }
        let throttled = self.copies() >= 1
            && self
                .policy
                .throttle
                .as_ref()
                .is_some_and(|t| !t.allows_retry());
        if throttled {
            self.stop(StopReason::Throttled);
            return false;
        }
        self.copies.push(CopyState::Selecting);
        let copy = CopyId(self.copies());
        self.actions.push(Action::SelectServer(copy));
        true
    }

    /// Schedules the next copy `delay` after `from`, if another may start.
    fn schedule(&mut self, from: Instant, delay: Duration, reason: HedgeReason) {
        if !self.can_start_more() {
            return;
        }
        let at = from.saturating_add(delay);
        self.next_at = Some(at);
        if self.record_events {
            self.events.push(HedgingEvent::HedgeScheduled {
                copy: CopyId(self.copies() + 1),
                at,
                reason,
            });
        }
    }

    fn stop(&mut self, reason: StopReason) {
        self.next_at = None;
        if self.record_events && !self.stopped && self.copies() < self.policy.max_attempts {
            self.events.push(HedgingEvent::HedgesStopped { reason });
        }
        self.stopped = true;
    }

    /// A6-H4: with no copy left and none to come, the last failure is the result.
    fn finish_if_exhausted(&mut self) {
        if self.finished || self.live_copies() > 0 || self.next_at.is_some() {
            return;
        }
        let error = self
            .last_error
            .take()
            .unwrap_or_else(|| OperationError::server_selection("no copy of the read could start"));
        let raised = self.raised(error);
        self.finish(Err(raised));
    }

    /// The error the operation raises for a copy's `error`. CS-7: under `timeoutMS` a
    /// MaxTimeMSExpired (code 50) is the timeout error.
    fn raised(&self, error: OperationError) -> OperationError {
        if self.timeout.is_csot() && error.is_max_time_expired() {
            error.max_time_expired_timeout()
        } else {
            error
        }
    }

    fn cancel_live(&mut self) {
        for index in 0..self.copies.len() {
            let stage = match self.copies[index] {
                CopyState::Done => continue,
                CopyState::Selecting => CopyStage::Selecting,
                CopyState::Dispatched(server) => CopyStage::CheckedOut(self.server(server)),
                CopyState::InFlight(server, _) => CopyStage::InFlight(self.server(server)),
            };
            self.copies[index] = CopyState::Done;
            let copy = CopyId(index as u32 + 1);
            if self.record_events {
                self.events.push(HedgingEvent::CopyCancelled {
                    copy,
                    stage: stage.clone(),
                });
            }
            self.actions.push(Action::Cancel { copy, stage });
        }
    }

    /// CS-5: the deadline passed: cancel everything, raise a timeout wrapping the last failure.
    fn finish_timed_out(&mut self) {
        self.cancel_live();
        let cause = self.last_error.take();
        self.finish(Err(OperationError::timeout(cause)));
    }

    fn finish(&mut self, result: Result<CopyId, OperationError>) {
        self.finished = true;
        self.next_at = None;
        self.actions.push(Action::Finished(result));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::EngineRng;
    use crate::selection::{
        select_server, ReadPreference, ReadPreferenceMode, SelectionCriteria, SelectionSettings,
    };
    use crate::topology::{
        AverageRtt, ServerDescription, ServerType, TopologyDescription, TopologyType,
    };
    use alloc::vec::Vec;
    use bson::doc;
    use proptest::prelude::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn at(ms: u64) -> Instant {
        Instant::ZERO.saturating_add(MS(ms))
    }

    fn addr(i: usize) -> ServerAddress {
        ServerAddress::new("mongos", 27017 + i as u16)
    }

    fn topology(servers: usize) -> TopologyDescription {
        let servers = (0..servers)
            .map(|i| ServerDescription {
                server_type: ServerType::Mongos,
                average_rtt: AverageRtt::from_duration(MS(1)),
                max_wire_version: 21,
                ..ServerDescription::unknown(addr(i))
            })
            .collect();
        TopologyDescription::new(TopologyType::Sharded, servers)
    }

    /// An overload rejection (non-fatal in these tests), with an optional pushback.
    fn overloaded(pushback: Option<i32>) -> OperationError {
        let mut reply = doc! { "ok": 0, "code": 462,
        "errorLabels": ["SystemOverloadedError", "RetryableError"] };
        if let Some(ms) = pushback {
            reply.insert("retryPushbackMS", ms);
        }
        OperationError::from_reply(&reply, &addr(0)).unwrap()
    }

    fn fatal() -> OperationError {
        OperationError::from_reply(&doc! { "ok": 0, "code": 2 }, &addr(0)).unwrap()
    }

    fn policy(max: i64, delay_ms: u64) -> HedgingPolicy {
        HedgingPolicy::new(max, MS(delay_ms), &[462]).unwrap()
    }

    /// What a copy sent to a server gets: after this long, success (`None`) or this error.
    type Reply = (Duration, Option<OperationError>);

    #[derive(Debug, Default)]
    struct Run {
        result: Option<Result<CopyId, OperationError>>,
        /// (time ms, copy, server index) of each dispatch.
        dispatched: Vec<(u64, u32, usize)>,
        released: Vec<u32>,
        cancelled: Vec<(u32, CopyStage)>,
        events: Vec<HedgingEvent>,
        end: u64,
    }

    /// Drives `machine` in virtual time against `servers` servers that answer as `reply` says,
    /// selecting with the real selection pipeline and the machine's deprioritized set. At most
    /// 1000 steps.
    fn drive(
        mut machine: HedgingMachine,
        servers: usize,
        mut reply: impl FnMut(usize, u32) -> Reply,
        mut on_action: impl FnMut(&Action),
    ) -> Run {
        let topology = topology(servers);
        let criteria = SelectionCriteria::Read(
            ReadPreference::new(ReadPreferenceMode::Nearest, Vec::new(), None).unwrap(),
        );
        let settings = SelectionSettings::default();
        let mut rng = EngineRng::from_seed_u64(3);
        let mut run = Run::default();
        let mut now = Instant::ZERO;
        let mut pending: Vec<(Instant, CopyId, Option<OperationError>)> = Vec::new();
        for _ in 0..1000 {
            while let Some(action) = machine.poll_action() {
                on_action(&action);
                match action {
                    Action::SelectServer(copy) => {
                        let server = select_server(
                            &topology,
                            &criteria,
                            machine.deprioritized(),
                            &settings,
                            |_| 0,
                            &mut rng,
                        )
                        .unwrap()
                        .unwrap();
                        machine
                            .handle_server_selected(copy, server.address.clone(), now)
                            .unwrap();
                    }
                    Action::Dispatch { copy, address } => {
                        let index = usize::from(address.port() - 27017);
                        run.dispatched.push((as_ms(now), copy.0, index));
                        machine.handle_sent(copy, now).unwrap();
                        let (latency, outcome) = reply(index, copy.0);
                        pending.push((now.saturating_add(latency), copy, outcome));
                    }
                    Action::Release { copy, .. } => run.released.push(copy.0),
                    Action::Cancel { copy, stage } => {
                        pending.retain(|p| p.1 != copy);
                        run.cancelled.push((copy.0, stage));
                    }
                    Action::Finished(result) => {
                        assert!(run.result.is_none(), "finished twice");
                        run.result = Some(result);
                    }
                }
            }
            while let Some(event) = machine.poll_event() {
                run.events.push(event);
            }
            if machine.is_finished() {
                run.end = as_ms(now);
                return run;
            }
            let reply_at = pending.iter().map(|p| p.0).min();
            match (reply_at, machine.poll_timeout()) {
                (Some(r), t) if t.is_none_or(|t| r <= t) => {
                    now = r;
                    let i = pending.iter().position(|p| p.0 == r).unwrap();
                    let (_, copy, outcome) = pending.remove(i);
                    match outcome {
                        None => machine.handle_succeeded(copy, now).unwrap(),
                        Some(e) => machine.handle_failed(copy, e, now).unwrap(),
                    }
                }
                (_, Some(t)) => {
                    now = t;
                    machine.handle_timeout(now);
                }
                _ => panic!("stalled: nothing pending and no timeout"),
            }
        }
        panic!("did not finish in 1000 steps");
    }

    fn as_ms(t: Instant) -> u64 {
        t.saturating_duration_since(Instant::ZERO).as_millis() as u64
    }

    fn read(policy: &HedgingPolicy) -> HedgingMachine {
        HedgingMachine::new(
            OperationKind::Read,
            OperationTimeout::Off,
            policy,
            Instant::ZERO,
        )
        .unwrap()
    }

    #[test]
    fn a6_max_attempts_at_least_2_and_clamped_to_5() {
        assert_eq!(
            HedgingPolicy::new(1, MS(1), &[]).unwrap_err().option(),
            "maxAttempts"
        );
        assert_eq!(policy(2, 1).max_attempts(), 2);
        assert_eq!(policy(9, 1).max_attempts(), 5);
        assert_eq!(policy(i64::MAX, 1).max_attempts(), 5);
    }

    /// A6-H1, A6-H5: a policy copied in place (as a restarted machine copies its client's) is
    /// the source, whatever codes and throttle it had; a throttle shared with the source stays
    /// the same throttle.
    #[test]
    fn a6_a_policy_copied_in_place_is_the_source() {
        let throttle = Arc::new(GrpcThrottle::new(10.0, 0.1).unwrap());
        let throttled = HedgingPolicy::new(3, MS(10), &[462, 91])
            .unwrap()
            .with_throttle(throttle.clone());
        let other = Arc::new(GrpcThrottle::new(5.0, 0.5).unwrap());
        let sources = [
            throttled.clone(),
            HedgingPolicy::new(2, MS(0), &[]).unwrap(),
            HedgingPolicy::new(4, MS(5), &[462])
                .unwrap()
                .with_throttle(other),
        ];
        for source in &sources {
            for start in &sources {
                let mut copy = start.clone();
                copy.clone_from(source);
                assert_eq!(format!("{copy:?}"), format!("{source:?}"));
            }
        }
        let mut copy = throttled.clone();
        copy.clone_from(&throttled);
        assert!(Arc::ptr_eq(copy.throttle().unwrap(), &throttle));
    }

    #[test]
    fn a6_h1_a_copy_every_delay_until_the_first_success_cancels_the_rest() {
        // Every server answers after 100 ms; copies start at 0, 10 and 20 ms.
        let run = drive(read(&policy(3, 10)), 3, |_, _| (MS(100), None), |_| {});
        let times: Vec<u64> = run.dispatched.iter().map(|d| d.0).collect();
        assert_eq!(times, [0, 10, 20]);
        assert_eq!(run.result, Some(Ok(CopyId(1))));
        assert_eq!(run.end, 100);
        assert_eq!(run.released, [1]);
        assert_eq!(
            run.cancelled,
            [
                (2, CopyStage::InFlight(addr(run.dispatched[1].2))),
                (3, CopyStage::InFlight(addr(run.dispatched[2].2)))
            ]
        );
        assert!(run.events.iter().any(|e| matches!(
            e,
            HedgingEvent::CopyCancelled {
                copy: CopyId(3),
                ..
            }
        )));
    }

    #[test]
    fn a6_h1_zero_delay_starts_every_copy_at_once_and_the_fastest_wins() {
        let run = drive(
            read(&policy(4, 0)),
            4,
            |server, _| (MS(10 + 10 * server as u64), None),
            |_| {},
        );
        assert!(run.dispatched.iter().all(|d| d.0 == 0));
        assert_eq!(run.dispatched.len(), 4);
        let fastest = run.dispatched.iter().find(|d| d.2 == 0).unwrap().1;
        assert_eq!(run.result, Some(Ok(CopyId(fastest))));
        assert_eq!(run.end, 10);
        assert_eq!(run.cancelled.len(), 3);
    }

    #[test]
    fn a6_h2_a_non_fatal_failure_starts_the_next_copy_at_once_and_the_schedule_resumes() {
        // Copy 1 fails after 5 ms; copy 2 starts then, copy 3 20 ms after copy 2.
        let run = drive(
            read(&policy(3, 20)),
            3,
            |_, copy| match copy {
                1 => (MS(5), Some(overloaded(None))),
                _ => (MS(100), None),
            },
            |_| {},
        );
        let times: Vec<u64> = run.dispatched.iter().map(|d| d.0).collect();
        assert_eq!(times, [0, 5, 25]);
        assert_eq!(run.result, Some(Ok(CopyId(2))));
        assert_eq!(run.end, 105);
    }

    #[test]
    fn a6_h3_a_fatal_failure_ends_the_operation_and_cancels_every_copy() {
        let run = drive(
            read(&policy(3, 10)),
            3,
            |_, copy| match copy {
                2 => (MS(5), Some(fatal())),
                _ => (MS(100), None),
            },
            |_| {},
        );
        assert_eq!(
            run.dispatched.len(),
            2,
            "no copy starts after the fatal failure"
        );
        assert_eq!(run.end, 15);
        assert_eq!(run.result.unwrap().unwrap_err().code(), Some(2));
        assert_eq!(run.cancelled.len(), 1);
        assert_eq!(run.cancelled[0].0, 1);
    }

    /// CS-7: under `timeoutMS` a copy's fatal MaxTimeMSExpired (code 50) is raised as the
    /// timeout error wrapping it, at once; without CSOT, as the server error.
    #[test]
    fn cs7_a_fatal_max_time_ms_expired_under_timeout_ms_is_a_timeout_error() {
        let max_time = || OperationError::from_reply(&doc! { "ok": 0, "code": 50 }, &addr(0));
        for timeout in [
            OperationTimeout::from_timeout_ms(Instant::ZERO, MS(250)),
            OperationTimeout::Off,
        ] {
            let m =
                HedgingMachine::new(OperationKind::Read, timeout, &policy(3, 10), Instant::ZERO)
                    .unwrap();
            let run = drive(m, 3, |_, _| (MS(5), max_time()), |_| {});
            assert_eq!(run.end, 5, "{timeout:?}");
            let error = run.result.unwrap().unwrap_err();
            match timeout {
                OperationTimeout::Off => assert_eq!(error.code(), Some(50)),
                _ => assert!(
                    matches!(&error.kind, ErrorKind::Timeout { cause: Some(c) } if c.code() == Some(50)),
                    "{error}"
                ),
            }
        }
    }

    #[test]
    fn a6_h4_when_every_copy_fails_there_is_no_retry() {
        let run = drive(
            read(&policy(2, 10)),
            2,
            |_, _| (MS(3), Some(overloaded(None))),
            |_| {},
        );
        assert_eq!(run.dispatched.len(), 2);
        assert_eq!(run.result.unwrap().unwrap_err().code(), Some(462));
        assert_eq!(run.end, 6);
        assert!(run.cancelled.is_empty());
    }

    #[test]
    fn a6_h5_copies_after_the_first_need_tokens_above_the_threshold() {
        let throttle = Arc::new(GrpcThrottle::new(10.0, 0.1).unwrap());
        for _ in 0..5 {
            throttle.record_failure();
        }
        assert!(!throttle.allows_retry());
        let p = policy(3, 10).with_throttle(throttle.clone());
        let run = drive(read(&p), 3, |_, _| (MS(30), None), |_| {});
        assert_eq!(run.dispatched.len(), 1);
        assert!(run.events.contains(&HedgingEvent::HedgesStopped {
            reason: StopReason::Throttled
        }));
        assert_eq!(run.result, Some(Ok(CopyId(1))));
        // The success added tokenRatio.
        assert_eq!(throttle.millis(), 5100);
    }

    #[test]
    fn a6_h5_non_fatal_failures_take_tokens_and_stop_copies_at_the_threshold() {
        // 6 tokens, threshold 3: after the first failure (5 left) copy 2 starts; after the second
        // (4 left) copy 3; after the third (3 left) copy 4 is throttled.
        let throttle = Arc::new(GrpcThrottle::new(6.0, 0.1).unwrap());
        let p = policy(5, 1000).with_throttle(throttle.clone());
        let run = drive(read(&p), 5, |_, _| (MS(1), Some(overloaded(None))), |_| {});
        assert_eq!(run.dispatched.len(), 3);
        assert_eq!(throttle.millis(), 3000);
        assert!(run.result.unwrap().is_err());
    }

    #[test]
    fn a6_h6_pushback_delays_the_next_copy_by_exactly_its_value() {
        // Copy 1 fails at 5 ms with a 30 ms pushback: copy 2 at 35 ms (not 5, not 10), copy 3
        // hedgingDelay later.
        let run = drive(
            read(&policy(3, 10)),
            3,
            |_, copy| match copy {
                1 => (MS(5), Some(overloaded(Some(30)))),
                _ => (MS(100), None),
            },
            |_| {},
        );
        let times: Vec<u64> = run.dispatched.iter().map(|d| d.0).collect();
        assert_eq!(times, [0, 35, 45]);
        assert!(run.events.contains(&HedgingEvent::HedgeScheduled {
            copy: CopyId(2),
            at: at(35),
            reason: HedgeReason::Pushback
        }));
    }

    #[test]
    fn a6_h6_a_do_not_retry_pushback_stops_further_copies() {
        let run = drive(
            read(&policy(3, 10)),
            3,
            |_, copy| match copy {
                1 => (MS(5), Some(overloaded(Some(-1)))),
                _ => (MS(100), None),
            },
            |_| {},
        );
        assert_eq!(run.dispatched.len(), 1);
        assert!(run.events.contains(&HedgingEvent::HedgesStopped {
            reason: StopReason::Pushback
        }));
        assert_eq!(run.result.unwrap().unwrap_err().code(), Some(462));
    }

    #[test]
    fn a6_h7_copies_go_to_distinct_servers_while_there_are_any() {
        let run = drive(read(&policy(3, 1)), 3, |_, _| (MS(50), None), |_| {});
        let mut servers: Vec<usize> = run.dispatched.iter().map(|d| d.2).collect();
        servers.sort_unstable();
        assert_eq!(servers, [0, 1, 2]);
        // Two servers, three copies: the third reuses one.
        let run = drive(read(&policy(3, 1)), 2, |_, _| (MS(50), None), |_| {});
        assert_eq!(run.dispatched.len(), 3);
        assert_ne!(run.dispatched[0].2, run.dispatched[1].2);
    }

    #[test]
    fn only_reads_are_hedged() {
        for kind in [
            OperationKind::RetryableWrite,
            OperationKind::NonRetryableWrite,
            OperationKind::GetMore,
            OperationKind::RunCommand,
            OperationKind::AbortTransaction,
        ] {
            assert!(!hedgeable(kind));
            let err =
                HedgingMachine::new(kind, OperationTimeout::Off, &policy(2, 1), Instant::ZERO)
                    .unwrap_err();
            assert!(err.to_string().contains("retry rules"));
        }
        assert!(hedgeable(OperationKind::Read));
    }

    #[test]
    fn cs5_the_deadline_cancels_every_copy_with_a_timeout_error() {
        let timeout = OperationTimeout::from_timeout_ms(Instant::ZERO, MS(50));
        let m = HedgingMachine::new(OperationKind::Read, timeout, &policy(3, 10), Instant::ZERO)
            .unwrap();
        let run = drive(m, 3, |_, _| (MS(500), None), |_| {});
        assert_eq!(run.end, 50);
        assert_eq!(run.cancelled.len(), 3);
        assert!(matches!(
            run.result.unwrap().unwrap_err().kind,
            ErrorKind::Timeout { .. }
        ));
    }

    /// CS-4, A6 deadline rule (review5 item 10): a copy not sent for lack of time fails
    /// non-fatally and stops further copies; with another copy live the operation waits for it,
    /// with none it times out at once.
    #[test]
    fn cs4_a_copy_not_sent_for_lack_of_time_is_non_fatal() {
        let timeout = OperationTimeout::from_timeout_ms(Instant::ZERO, MS(100));
        let mut m =
            HedgingMachine::new(OperationKind::Read, timeout, &policy(3, 60), Instant::ZERO)
                .unwrap();
        assert_eq!(m.poll_action(), Some(Action::SelectServer(CopyId(1))));
        m.handle_server_selected(CopyId(1), addr(0), at(0)).unwrap();
        let _ = m.poll_action();
        m.handle_sent(CopyId(1), at(0)).unwrap();
        m.handle_timeout(at(60));
        assert_eq!(m.poll_action(), Some(Action::SelectServer(CopyId(2))));
        m.handle_server_selected(CopyId(2), addr(1), at(60))
            .unwrap();
        let _ = m.poll_action();
        m.handle_expired_before_send(CopyId(2), at(60)).unwrap();
        assert_eq!(
            m.poll_action(),
            Some(Action::Release {
                copy: CopyId(2),
                close: false
            })
        );
        assert_eq!(m.poll_action(), None, "copy 1 is still in flight");
        assert_eq!(
            m.poll_timeout(),
            Some(at(100)),
            "no third copy; the deadline"
        );
        m.handle_succeeded(CopyId(1), at(70)).unwrap();
        assert_eq!(
            m.poll_action(),
            Some(Action::Release {
                copy: CopyId(1),
                close: false
            })
        );
        assert_eq!(m.poll_action(), Some(Action::Finished(Ok(CopyId(1)))));

        let mut m =
            HedgingMachine::new(OperationKind::Read, timeout, &policy(3, 60), Instant::ZERO)
                .unwrap();
        let _ = m.poll_action();
        m.handle_server_selected(CopyId(1), addr(0), at(95))
            .unwrap();
        let _ = m.poll_action();
        m.handle_expired_before_send(CopyId(1), at(95)).unwrap();
        let _ = m.poll_action();
        assert!(matches!(
            m.poll_action(),
            Some(Action::Finished(Err(e))) if matches!(e.kind, ErrorKind::Timeout { .. })
        ));
    }

    /// A6 (hedging events), CS-4: the copy not sent for lack of time stops further copies with a
    /// `HedgesStopped { Deadline }` event, as every other reason to stop does.
    #[test]
    fn a6_cs4_a_copy_not_sent_for_lack_of_time_reports_that_hedges_stopped() {
        let timeout = OperationTimeout::from_timeout_ms(Instant::ZERO, MS(100));
        let mut m =
            HedgingMachine::new(OperationKind::Read, timeout, &policy(3, 60), Instant::ZERO)
                .unwrap();
        let _ = m.poll_action();
        m.handle_server_selected(CopyId(1), addr(0), at(0)).unwrap();
        let _ = m.poll_action();
        m.handle_sent(CopyId(1), at(0)).unwrap();
        m.handle_timeout(at(60));
        let _ = m.poll_action();
        m.handle_server_selected(CopyId(2), addr(1), at(60))
            .unwrap();
        let _ = m.poll_action();
        m.handle_expired_before_send(CopyId(2), at(60)).unwrap();
        let events: Vec<HedgingEvent> = core::iter::from_fn(|| m.poll_event()).collect();
        let stopped: Vec<&HedgingEvent> = events
            .iter()
            .filter(|e| matches!(e, HedgingEvent::HedgesStopped { .. }))
            .collect();
        assert_eq!(
            stopped,
            [&HedgingEvent::HedgesStopped {
                reason: StopReason::Deadline
            }],
            "{events:?}"
        );
    }

    /// CS-5, RR-11 (the retry machine's gaps21 fix, for hedged reads): a copy's selection that
    /// fails with the CSOT deadline passed, before the machine's own timer fired, ends the
    /// operation with a timeout error wrapping the selection error, and cancels the live copy;
    /// before the deadline it is the selection error, as without CSOT.
    #[test]
    fn cs5_rr11_a_selection_failing_at_the_deadline_raises_a_timeout_wrapping_it() {
        let timeout = OperationTimeout::from_timeout_ms(Instant::ZERO, MS(100));
        let selection = || OperationError::server_selection("no suitable server");
        let mut m = HedgingMachine::new(OperationKind::Read, timeout, &policy(2, 0), Instant::ZERO)
            .unwrap();
        assert_eq!(m.poll_action(), Some(Action::SelectServer(CopyId(1))));
        assert_eq!(m.poll_action(), Some(Action::SelectServer(CopyId(2))));
        m.handle_server_selected(CopyId(1), addr(0), at(0)).unwrap();
        let _ = m.poll_action();
        m.handle_sent(CopyId(1), at(0)).unwrap();
        m.handle_selection_failed(CopyId(2), selection(), at(100))
            .unwrap();
        let actions: Vec<Action> = core::iter::from_fn(|| m.poll_action()).collect();
        assert!(
            matches!(
                actions.first(),
                Some(Action::Cancel {
                    copy: CopyId(1),
                    ..
                })
            ),
            "{actions:?}"
        );
        match actions.last() {
            Some(Action::Finished(Err(e))) => match &e.kind {
                ErrorKind::Timeout { cause: Some(cause) } => assert!(
                    matches!(cause.kind, ErrorKind::ServerSelection { .. }),
                    "{cause:?}"
                ),
                _ => panic!("CS-5: a timeout wrapping the selection error: {e:?}"),
            },
            other => panic!("finished: {other:?}"),
        }

        let mut m = HedgingMachine::new(OperationKind::Read, timeout, &policy(2, 0), Instant::ZERO)
            .unwrap();
        let _ = (m.poll_action(), m.poll_action());
        m.handle_selection_failed(CopyId(1), selection(), at(99))
            .unwrap();
        m.handle_selection_failed(CopyId(2), selection(), at(99))
            .unwrap();
        let actions: Vec<Action> = core::iter::from_fn(|| m.poll_action()).collect();
        assert!(
            matches!(actions.last(), Some(Action::Finished(Err(e)))
                if matches!(e.kind, ErrorKind::ServerSelection { .. })),
            "before the deadline: {actions:?}"
        );
    }

    #[test]
    fn inputs_for_cancelled_or_unknown_copies_are_refused() {
        let mut m = read(&policy(2, 0));
        assert_eq!(m.poll_action(), Some(Action::SelectServer(CopyId(1))));
        assert_eq!(m.poll_action(), Some(Action::SelectServer(CopyId(2))));
        assert!(m.handle_sent(CopyId(1), Instant::ZERO).is_err());
        assert!(m.handle_succeeded(CopyId(7), Instant::ZERO).is_err());
        m.cancel(Instant::ZERO);
        assert!(m
            .handle_server_selected(CopyId(1), addr(0), Instant::ZERO)
            .is_err());
        assert_eq!(m.poll_timeout(), None);
    }

    /// How a server answers in the property test.
    #[derive(Clone, Copy, Debug)]
    enum Answer {
        Ok,
        NonFatal,
        Fatal,
        Pushback(i32),
    }

    fn answer() -> impl Strategy<Value = Answer> {
        prop_oneof![
            3 => Just(Answer::Ok),
            3 => Just(Answer::NonFatal),
            1 => Just(Answer::Fatal),
            1 => (-5..40i32).prop_map(Answer::Pushback),
        ]
    }

    proptest! {
        /// A6-H1, A6-H3..H5, A6-H7: at most maxAttempts copies (5 at most), never two copies on one
        /// server while a server no copy has used exists, exactly one result, every copy ends
        /// exactly once (released or cancelled), and a copy after the first starts only while the
        /// throttle is above its threshold.
        #[test]
        fn hedging_invariants(
            max in 2..9i64,
            delay in 0..40u64,
            servers in 1..6usize,
            answers in prop::collection::vec((1..60u64, answer()), 5),
            tokens_spent in 0..8u32,
        ) {
            let throttle = Arc::new(GrpcThrottle::new(8.0, 0.5).unwrap());
            for _ in 0..tokens_spent {
                throttle.record_failure();
            }
            let p = HedgingPolicy::new(max, MS(delay), &[462]).unwrap()
                .with_throttle(throttle.clone());
            let t = throttle.clone();
            let mut throttle_ok = true;
            let run = drive(read(&p), servers, |_, copy| {
                let (latency, a) = answers[copy as usize - 1];
                let error = match a {
                    Answer::Ok => None,
                    Answer::NonFatal => Some(overloaded(None)),
                    Answer::Fatal => Some(fatal()),
                    Answer::Pushback(ms) => Some(overloaded(Some(ms))),
                };
                (MS(latency), error)
            }, |action| {
                if let Action::SelectServer(c) = action {
                    if c.0 > 1 && !t.allows_retry() {
                        throttle_ok = false;
                    }
                }
            });
            prop_assert!(throttle_ok, "a copy started at or below the threshold");
            let copies = run.dispatched.len();
            prop_assert!(copies as i64 <= max.min(5));
            prop_assert!(run.result.is_some());
            for (i, d) in run.dispatched.iter().enumerate() {
                let earlier: Vec<usize> = run.dispatched[..i].iter().map(|e| e.2).collect();
                if earlier.len() < servers {
                    prop_assert!(!earlier.contains(&d.2), "copy {} reused a server", d.1);
                }
            }
            let mut ended: Vec<u32> = run.released.clone();
            ended.extend(run.cancelled.iter().map(|c| c.0));
            ended.sort_unstable();
            let mut all: Vec<u32> = run.dispatched.iter().map(|d| d.1).collect();
            all.sort_unstable();
            prop_assert_eq!(ended, all);
            prop_assert!(throttle.millis() <= 8000);
            if tokens_spent >= 4 {
                prop_assert_eq!(copies, 1);
            }
        }
    }
}
