//! The per-operation retry state machine: one operation, all of its attempts, and the rules that
//! decide whether, when and where each retry runs and which error the operation finally raises.
//!
//! A [`RetryMachine`] is sans-IO. Inputs are `handle_*` methods taking `now`; outputs are
//! [`Action`]s from [`RetryMachine::poll_action`], monitoring [`RetryEvent`]s from
//! [`RetryMachine::poll_event`], and a wake-up time from [`RetryMachine::poll_timeout`].
//!
//! # Driving it
//!
//! ```text
//! loop {
//!     while let Some(action) = machine.poll_action() {
//!         match action {
//!             SelectServer       => select a server avoiding machine.deprioritized(), then
//!                                   handle_server_selected(server) or handle_selection_failed(err)
//!             Dispatch(attempt)  => check out a connection to attempt.address, build the command with
//!                                   attempt's modifications, write it, then handle_sent(); later
//!                                   handle_succeeded() or handle_failed(err). A failure before the
//!                                   write (checkout, connect, handshake) is handle_failed too.
//!             ReleaseConnection  => check the connection in (or close it), before anything else
//!             Wait { until }     => nothing: poll_timeout() returns `until`
//!             Finished(result)   => done
//!         }
//!     }
//!     while let Some(event) = machine.poll_event() { publish it }
//!     wait for the next input or poll_timeout(), then call handle_timeout(now)
//! }
//! ```
//!
//! Exactly one `ReleaseConnection` follows every `Dispatch`, and it comes before the next
//! `SelectServer`, `Wait` or `Finished` (BP-27: a backoff never holds a connection).
//!
//! # The rules, by ID
//!
//! - One attempt counter for every kind of error (BP-8); at most one ordinary retry without CSOT,
//!   unlimited ordinary retries with CSOT (RW-12, RR/RW-21), and once any attempt has failed with an
//!   overload error, at most `maxAdaptiveRetries` retries in all for the rest of the operation
//!   (BP-12, BP-22), so `maxAdaptiveRetries = 0` also stops the ordinary retry of an
//!   overload-labelled error.
//! - A retryable overload error (BP-2) is retried for any command the options allow (BP-9, BP-11);
//!   an ordinary retry needs the read (RR-2, RR-5) or write (RW-8, RW-9) rules, or a commit/abort
//!   (TX-10).
//! - Back off only when the latest error is an overload error (BP-13, BP-14, BP-15); never start a
//!   wait that would end past the deadline, and raise the error instead (BP-16, CS-6).
//! - Deprioritize the failed server on sharded clusters for every retry, elsewhere only for an
//!   overload error with `enableOverloadRetargeting` (BP-19, BP-20, contradiction C6).
//! - The error raised (BP-21, RR-6, RR-9, RW-14, RW-17): the latest error that shows the command
//!   was attempted (sent, and for writes not `NoWritesPerformed`), else the first error. A selection
//!   failure on a retry raises that error, not the selection error. Under CSOT, a failure (a
//!   selection's included) with the deadline passed raises a timeout error wrapping that error and
//!   keeping its labels (CS-5, RR-11, TX-7, TX-8).
//! - Retries keep the `txnNumber` (RW-7, BP-23); a retried first command of a transaction still
//!   starts it (TX-12); commit retries use majority write concern unless every earlier failure was
//!   a retryable overload error (TX-11).

use alloc::borrow::Cow;
use core::fmt;
use core::time::Duration;
use rand_core::RngCore;
use smallvec::SmallVec;

use crate::address::ServerAddress;
use crate::backoff;
use crate::budget::Deposit;
use crate::error::{ErrorKind, ErrorSummary, Labels, OperationError, Pushback};
use crate::policy::{RetryOptions, RetryPolicy, TOKEN_BUCKET_MAX_RETRIES};
use crate::rng::{EngineRng, Jitter};
use crate::time::{Instant, OperationTimeout};
use crate::topology::{ServerDescription, ServerType, TopologyType};

/// What kind of operation is being run: decides which retry rules apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OperationKind {
    /// A retryable read: find, aggregate without `$out`/`$merge`, distinct, count, listX, watch
    /// (RR-3). Retried on retryable read errors when `retryReads` is on.
    Read,
    /// A retryable write: a single-statement insert, update, delete or findAndModify, or a batch
    /// without multi-document statements (RW-3). Carries a `txnNumber` when the server supports it.
    RetryableWrite,
    /// A write that is never retried by the retryable-writes rules: updateMany, deleteMany,
    /// createIndexes, aggregate with `$out`/`$merge`, unacknowledged writes, ... (RW-4). Still
    /// retried on overload (BP-5).
    NonRetryableWrite,
    /// A getMore: never retried by the read rules (RR-4), retried on overload when `retryReads` is on
    /// (BP-5, contradiction C8).
    GetMore,
    /// A generic runCommand: retried only on overload, and only when both `retryReads` and
    /// `retryWrites` are on; counts as a write when picking the error to raise (BP-11, RW-5).
    RunCommand,
    /// commitTransaction: retried once on a retryable write error even when `retryWrites` is off
    /// (TX-10). `again` is true when the user calls commit a second time, which also switches the
    /// write concern to majority (TX-11).
    CommitTransaction {
        /// Whether this commit follows an earlier commit of the same transaction.
        again: bool,
    },
    /// abortTransaction: retried once on a retryable write error even when `retryWrites` is off
    /// (TX-10).
    AbortTransaction,
    /// Any other command inside a transaction: never retried except on overload (RR-5, RW-4,
    /// TX-12). `first` is true for the command that starts the transaction.
    InTransaction {
        /// Whether the command reads (gated by `retryReads`) rather than writes (`retryWrites`).
        read: bool,
        /// Whether this is the transaction's first command (`startTransaction: true`).
        first: bool,
    },
}

impl OperationKind {
    /// Whether the RW-17 write rules pick the error to raise (writes, and runCommand per BP-11).
    fn picks_errors_as_write(self) -> bool {
        !matches!(
            self,
            OperationKind::Read
                | OperationKind::GetMore
                | OperationKind::InTransaction { read: true, .. }
        )
    }

    /// BP-9 (4), BP-11: whether the options allow overload retries of this kind.
    fn overload_retry_enabled(self, retry_reads: bool, retry_writes: bool) -> bool {
        match self {
            OperationKind::Read
            | OperationKind::GetMore
            | OperationKind::InTransaction { read: true, .. } => retry_reads,
            OperationKind::RunCommand => retry_reads && retry_writes,
            _ => retry_writes,
        }
    }

    /// Whether running the command twice is harmless whatever its attempt carried, so that gRPC
    /// may retry it after an error that does not show the server skipped it. A `RetryableWrite`
    /// is not: it is only when its attempt carries a `txnNumber` ([`RetryMachine`] decides, RW-2).
    fn idempotent(self) -> bool {
        matches!(
            self,
            OperationKind::Read
                | OperationKind::CommitTransaction { .. }
                | OperationKind::AbortTransaction
        )
    }
}

/// One operation as the retry machine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperationSpec {
    /// What kind of operation.
    pub kind: OperationKind,
    /// Its client-side operation timeout (CSOT).
    pub timeout: OperationTimeout,
    /// The session's transaction number: for a retryable write the number this write would use
    /// (RW-6), in a transaction the transaction's (TX-1). Attempts carry it when the rules say so.
    pub txn_number: Option<i64>,
    /// The oldest wire version the command can be built for; a server older than this cannot run
    /// the command (RR-8, RW-14). 0 accepts every server.
    pub min_wire_version: i32,
}

impl OperationSpec {
    /// An operation of `kind` with no CSOT, no transaction number and no wire-version floor.
    pub fn new(kind: OperationKind) -> OperationSpec {
        OperationSpec {
            kind,
            timeout: OperationTimeout::Off,
            txn_number: None,
            min_wire_version: 0,
        }
    }

    /// The same operation with a CSOT timeout.
    pub fn with_timeout(mut self, timeout: OperationTimeout) -> OperationSpec {
        self.timeout = timeout;
        self
    }

    /// The same operation with a transaction number.
    pub fn with_txn_number(mut self, txn_number: i64) -> OperationSpec {
        self.txn_number = Some(txn_number);
        self
    }
}

/// The facts about the selected server that the retry rules read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptServer {
    /// Its address.
    pub address: ServerAddress,
    /// Its type.
    pub server_type: ServerType,
    /// The topology's type when it was selected.
    pub topology_type: TopologyType,
    /// Its `maxWireVersion`.
    pub max_wire_version: i32,
    /// Whether its hello reply had `logicalSessionTimeoutMinutes` (sessions are supported).
    pub sessions_supported: bool,
}

impl AttemptServer {
    /// The facts about `server`, selected from a topology of `topology_type`.
    pub fn from_description(
        server: &ServerDescription,
        topology_type: TopologyType,
    ) -> AttemptServer {
        AttemptServer {
            address: server.address.clone(),
            server_type: server.server_type,
            topology_type,
            max_wire_version: server.max_wire_version,
            sessions_supported: server.logical_session_timeout.is_some(),
        }
    }

    /// RW-2: retryable writes need sessions and a server that is not a standalone; in
    /// load-balanced mode sessions are always supported.
    pub fn supports_retryable_writes(&self) -> bool {
        self.topology_type == TopologyType::LoadBalanced
            || (self.sessions_supported && self.server_type != ServerType::Standalone)
    }
}

/// The write concern an attempt sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteConcernRule {
    /// The operation's own write concern, unchanged.
    AsRequested,
    /// TX-11: `w: "majority"`, the other options kept, and `wtimeout: 10000` when none is set.
    Majority,
}

/// TX-11: the `wtimeout` a commit retry adds when its write concern has none.
pub const COMMIT_RETRY_WTIMEOUT: Duration = Duration::from_millis(10_000);

/// One attempt to send: where, and how the command must be modified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first attempt, 2 for the first retry, and so on (transparent retries included).
    pub number: u32,
    /// The server to send it to.
    pub address: ServerAddress,
    /// The `txnNumber` to add, if any; the same on every retry (RW-7, BP-23).
    pub txn_number: Option<i64>,
    /// Whether to add `startTransaction: true`: the first command of a transaction, also when
    /// retried (TX-12).
    pub start_transaction: bool,
    /// The write concern (commits only change it, TX-11).
    pub write_concern: WriteConcernRule,
}

impl Attempt {
    /// Whether this attempt is a retry.
    pub fn is_retry(&self) -> bool {
        self.number > 1
    }
}

/// What the caller must do next.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Select a server, avoiding [`RetryMachine::deprioritized`] when possible, then call
    /// [`RetryMachine::handle_server_selected`] or [`RetryMachine::handle_selection_failed`].
    SelectServer,
    /// Check out a connection to the attempt's server and send the command.
    Dispatch(Attempt),
    /// Check in the attempt's connection, or close it when `close` is true (the command was
    /// interrupted or the connection failed).
    ReleaseConnection {
        /// Whether the connection must be closed rather than reused.
        close: bool,
    },
    /// Back off until this instant ([`RetryMachine::poll_timeout`] returns it).
    Wait {
        /// When the next attempt may start.
        until: Instant,
    },
    /// The operation is over: `Ok` after a successful attempt, or the error to raise.
    Finished(Result<(), OperationError>),
}

/// Why a retry is being made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryReason {
    /// A retryable overload error (BP-2), backed off.
    Overload,
    /// A retryable read or write error (RR-2, RW-8), not backed off (BP-13).
    Retryable,
    /// gRPC: the command was never sent, so it is retried at once and not counted.
    Transparent,
    /// gRPC: the server's pushback set the delay.
    Pushback,
}

/// Why no retry is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DenyReason {
    /// The error is not retryable for this operation. Also a MaxTimeMSExpired (code 50) under
    /// `timeoutMS` before the deadline, which ends the operation at once with a timeout error
    /// (CS-7; review35 Z6: the deadline has not passed).
    NotRetryable,
    /// The error would be retryable, but `retryReads` / `retryWrites` is off.
    DisabledByOption,
    /// The retry cap is reached (one retry, `maxAdaptiveRetries`, or gRPC `maxAttempts`).
    Cap,
    /// The retry budget (token bucket or gRPC throttle) refused it.
    Budget,
    /// The CSOT deadline has passed, or the backoff would end past it (a CS-7 MaxTimeMSExpired
    /// before the deadline is [`DenyReason::NotRetryable`]).
    Deadline,
    /// gRPC: the server's pushback said not to retry.
    Pushback,
    /// The server selected for the retry cannot run the command (RR-8, RW-14).
    ServerIneligible,
}

/// A monitoring event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryEvent {
    /// An attempt was written to a connection (BP-26).
    CommandStarted {
        /// The attempt's number.
        attempt: u32,
        /// Where it was sent.
        address: ServerAddress,
    },
    /// The attempt succeeded.
    CommandSucceeded {
        /// The attempt's number.
        attempt: u32,
        /// Where it ran.
        address: ServerAddress,
        /// From [`RetryEvent::CommandStarted`] to the reply.
        duration: Duration,
    },
    /// The attempt failed.
    CommandFailed {
        /// The attempt's number.
        attempt: u32,
        /// Where it was sent.
        address: ServerAddress,
        /// From [`RetryEvent::CommandStarted`] to the failure.
        duration: Duration,
        /// What it failed with.
        error: ErrorSummary,
    },
    /// A retry will be made.
    RetryScheduled {
        /// The retry's number (BP-8's `attempt`: the first retry is 1).
        retry: u32,
        /// The backoff before it.
        delay: Duration,
        /// Why.
        reason: RetryReason,
        /// The address added to the deprioritized set, if one was.
        deprioritized: Option<ServerAddress>,
    },
    /// No retry will be made; the operation finishes with an error.
    RetryDenied {
        /// Why.
        reason: DenyReason,
        /// The error that was not retried.
        error: ErrorSummary,
    },
}

/// An input that does not fit the machine's state (for example a reply while backing off). The
/// machine ignores it and stays as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnexpectedInput {
    /// The input.
    pub input: &'static str,
    /// The machine's state then.
    pub state: &'static str,
}

impl fmt::Display for UnexpectedInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unexpected input {} while the operation is {}",
            self.input, self.state
        )
    }
}

impl core::error::Error for UnexpectedInput {}

#[derive(Clone, Debug)]
enum State {
    Selecting,
    /// An attempt on `server`: dispatched while `sent_at` is `None`, then in flight since
    /// `sent_at` (one state, so that sending it changes one field and moves no server).
    Attempt {
        server: AttemptServer,
        sent_at: Option<Instant>,
    },
    BackingOff {
        until: Instant,
    },
    Finished,
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Selecting => "selecting a server",
            State::Attempt { sent_at: None, .. } => "dispatched",
            State::Attempt {
                sent_at: Some(_), ..
            } => "in flight",
            State::BackingOff { .. } => "backing off",
            State::Finished => "finished",
        }
    }
}

/// A small first-in first-out queue that stays inline for the usual handful of items: the
/// machines' action and event queues, so that running an operation allocates nothing.
#[derive(Debug)]
pub(crate) struct Queue<T, const N: usize>(SmallVec<[T; N]>);

impl<T, const N: usize> Queue<T, N> {
    pub(crate) fn new() -> Self {
        Queue(SmallVec::new())
    }

    #[inline]
    pub(crate) fn push(&mut self, item: T) {
        self.0.push(item);
    }

    /// Whether nothing is queued.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Drops every item, keeping the storage.
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    #[inline]
    pub(crate) fn pop(&mut self) -> Option<T> {
        match self.0.len() {
            0 => None,
            // The usual case: taking the only item moves nothing else.
            1 => self.0.pop(),
            // Two (a release and the next step): the second takes the first's place, in order.
            2 => Some(self.0.swap_remove(0)),
            _ => Some(self.0.remove(0)),
        }
    }
}

/// The decision taken for one failure.
enum Decision {
    Retry {
        delay: Duration,
        reason: RetryReason,
        deprioritize: bool,
    },
    Deny(DenyReason),
    /// CS-5: the deadline has passed.
    TimedOut,
    /// CS-7: a MaxTimeMSExpired under `timeoutMS`, before the deadline.
    MaxTimeExpired,
}

/// The retry state machine of one operation. See the [module docs](self) for the driving loop and
/// the rules.
///
/// The fields are laid out in the order written (`repr(C)`), the ones every attempt reads first
/// and the monitoring events last: a caller that keeps many machines in flight (a simulation)
/// finds a machine it has not touched for a while in fewer cache lines.
#[derive(Debug)]
#[repr(C)]
pub struct RetryMachine<R: RngCore = EngineRng> {
    state: State,
    spec: OperationSpec,
    options: RetryOptions,
    rng: R,
    /// BP-8: retries made so far (counted ones; gRPC transparent retries are not counted).
    retries: u32,
    /// Attempts dispatched, transparent ones included.
    dispatched: u32,
    /// gRPC: retries since the last pushback, and transparent retries in a row.
    since_pushback: u32,
    transparent_in_a_row: u32,
    /// BP-22: an overload error has been seen; the overload cap applies from now on.
    overload_seen: bool,
    /// TX-11: every failure so far was a retryable overload error.
    only_overload_failures: bool,
    /// RW-2: the first server supports retryable writes (decided on the first dispatch).
    retryable_writes_supported: bool,
    /// RW-2: the retryable write carries a txnNumber (decided on the first dispatch).
    txn_attached: bool,
    /// Whether monitoring events are recorded (see [`RetryMachine::without_events`]).
    record_events: bool,
    /// A `ReleaseConnection` due before every queued action (see [`RetryMachine::push_release`]).
    release: Option<bool>,
    /// The error the operation would raise now (RW-17).
    raised: Option<OperationError>,
    actions: Queue<Action, 3>,
    /// Inline up to three addresses: a three-member replica set, the usual deployment.
    deprioritized: SmallVec<[ServerAddress; 3]>,
    events: Queue<RetryEvent, 3>,
}

impl RetryMachine<EngineRng> {
    /// A machine for one operation whose jitter comes from an [`EngineRng`] seeded with `seed`. The
    /// first action, [`Action::SelectServer`], is ready at once.
    pub fn new(
        spec: OperationSpec,
        options: &RetryOptions,
        seed: u64,
        now: Instant,
    ) -> RetryMachine<EngineRng> {
        RetryMachine::with_rng(spec, options, EngineRng::from_seed_u64(seed), now)
    }

    /// Makes this machine, finished or not, the machine [`RetryMachine::new`] would make for
    /// another operation, in place: for a caller that runs many operations one after another
    /// (a simulation) and would otherwise build, move and drop a whole machine for each. It keeps
    /// recording monitoring events or not, as it did ([`RetryMachine::without_events`]).
    pub fn restart(
        &mut self,
        spec: OperationSpec,
        options: &RetryOptions,
        seed: u64,
        now: Instant,
    ) {
        self.restart_with_rng(spec, options, EngineRng::from_seed_u64(seed), now);
    }
}

impl<R: RngCore> RetryMachine<R> {
    /// A machine drawing jitter from `rng` (for example [`crate::rng::FixedRng`] to pin it).
    pub fn with_rng(
        spec: OperationSpec,
        options: &RetryOptions,
        rng: R,
        now: Instant,
    ) -> RetryMachine<R> {
        let mut machine = RetryMachine {
            spec,
            options: options.clone(),
            rng,
            state: State::Selecting,
            retries: 0,
            dispatched: 0,
            overload_seen: false,
            only_overload_failures: true,
            retryable_writes_supported: false,
            txn_attached: false,
            since_pushback: 0,
            transparent_in_a_row: 0,
            deprioritized: SmallVec::new(),
            raised: None,
            release: None,
            actions: Queue::new(),
            events: Queue::new(),
            record_events: true,
        };
        machine.start(now);
        machine
    }

    /// [`RetryMachine::restart`] drawing jitter from `rng`.
    pub fn restart_with_rng(
        &mut self,
        spec: OperationSpec,
        options: &RetryOptions,
        rng: R,
        now: Instant,
    ) {
        self.spec = spec;
        self.options.clone_from(options);
        self.rng = rng;
        self.state = State::Selecting;
        self.retries = 0;
        self.dispatched = 0;
        self.overload_seen = false;
        self.only_overload_failures = true;
        self.retryable_writes_supported = false;
        self.txn_attached = false;
        self.since_pushback = 0;
        self.transparent_in_a_row = 0;
        self.deprioritized.clear();
        self.raised = None;
        self.release = None;
        self.actions.clear();
        self.events.clear();
        self.start(now);
    }

    /// The first action of a new operation: select a server, or finish when the deadline has
    /// already passed.
    #[inline(always)]
    fn start(&mut self, now: Instant) {
        if self.spec.timeout.expired(now) {
            self.finish(Err(OperationError::timeout(None)));
        } else {
            self.actions.push(Action::SelectServer);
        }
    }

    /// The next thing to do, in order; `None` when there is nothing until the next input.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        // Read, and cleared only when set: most polls find no release kept apart.
        if let Some(close) = self.release {
            self.release = None;
            return Some(Action::ReleaseConnection { close });
        }
        self.actions.pop()
    }

    /// Queues a `ReleaseConnection`. One is nearly always followed by the next step (a retry's
    /// selection or wait, the end), so when nothing is queued it is kept apart, first, and the
    /// next step is then the only queued action: taking each moves nothing else. Otherwise it
    /// is queued behind the others; either way the order of the actions is the order of pushes.
    #[inline]
    fn push_release(&mut self, close: bool) {
        if self.release.is_none() && self.actions.is_empty() {
            self.release = Some(close);
        } else {
            self.actions.push(Action::ReleaseConnection { close });
        }
    }

    /// The same machine recording no monitoring events: [`RetryMachine::poll_event`] then always
    /// returns `None`. For a caller that publishes none (no command-monitoring subscriber, a
    /// simulation), so that it does not pay for building and dropping them. The actions and every
    /// decision are the same with or without events.
    #[must_use]
    pub fn without_events(mut self) -> Self {
        self.record_events = false;
        self.events = Queue::new();
        self
    }

    /// Whether the machine records monitoring events (`false` after
    /// [`RetryMachine::without_events`]); [`RetryMachine::restart`] keeps it.
    #[must_use]
    pub fn records_events(&self) -> bool {
        self.record_events
    }

    /// The next monitoring event, in order.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<RetryEvent> {
        // Issue 9: a machine that records none has none (every push is behind the flag); its
        // drain polls once per action.
        if !self.record_events {
            return None;
        }
        self.events.pop()
    }

    /// When [`RetryMachine::handle_timeout`] must be called: the end of the current backoff.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::BackingOff { until } => Some(until),
            _ => None,
        }
    }

    /// The addresses the next selection should avoid (SS deprioritization).
    pub fn deprioritized(&self) -> &[ServerAddress] {
        &self.deprioritized
    }

    /// Retries made so far (BP-8), not counting gRPC transparent retries.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// Attempts dispatched so far, transparent retries included.
    pub fn attempts(&self) -> u32 {
        self.dispatched
    }

    /// Whether the operation has finished.
    pub fn is_finished(&self) -> bool {
        matches!(self.state, State::Finished)
    }

    /// The operation being run.
    pub fn spec(&self) -> &OperationSpec {
        &self.spec
    }

    fn unexpected(&self, input: &'static str) -> Result<(), UnexpectedInput> {
        Err(UnexpectedInput {
            input,
            state: self.state.name(),
        })
    }

    /// A server was selected for the next attempt. Emits [`Action::Dispatch`], or finishes when
    /// the server cannot run the command: a retry then raises the previous error (RR-8, RW-14).
    pub fn handle_server_selected(
        &mut self,
        server: AttemptServer,
        now: Instant,
    ) -> Result<(), UnexpectedInput> {
        if !matches!(self.state, State::Selecting) {
            return self.unexpected("server selected");
        }
        let first = self.dispatched == 0;
        if self.spec.timeout.expired(now) {
            self.finish_timed_out();
            return Ok(());
        }
        let too_old = server.max_wire_version < self.spec.min_wire_version;
        let lost_retryable_writes =
            !first && self.txn_attached && !server.supports_retryable_writes();
        if too_old || lost_retryable_writes {
            self.finish_ineligible(&server);
            return Ok(());
        }
        if first {
            // RW-2, RW-6: a retryable write needs a server that supports it and a transaction
            // number to send; without one it runs once (only overload retries, BP-5, remain).
            self.retryable_writes_supported =
                server.supports_retryable_writes() && self.spec.txn_number.is_some();
            self.txn_attached = match self.spec.kind {
                // RW-2, RW-4: only with retryWrites on and a server that supports sessions.
                OperationKind::RetryableWrite => {
                    self.options.retry_writes && self.retryable_writes_supported
                }
                OperationKind::CommitTransaction { .. }
                | OperationKind::AbortTransaction
                | OperationKind::InTransaction { .. } => true,
                // RW-4, RW-5: no txnNumber for anything else.
                _ => false,
            };
        }
        self.dispatched += 1;
        let attempt = Attempt {
            number: self.dispatched,
            address: server.address.clone(),
            txn_number: self.spec.txn_number.filter(|_| self.txn_attached),
            start_transaction: matches!(
                self.spec.kind,
                OperationKind::InTransaction { first: true, .. }
            ),
            write_concern: self.write_concern_rule(),
        };
        self.actions.push(Action::Dispatch(attempt));
        self.state = State::Attempt {
            server,
            sent_at: None,
        };
        Ok(())
    }

    /// RR-8, RW-14: a retry on a server that cannot run the command raises the previous error; a
    /// first attempt raises an error naming the server and the wire versions.
    fn finish_ineligible(&mut self, server: &AttemptServer) {
        if let Some(raised) = self.raised.take() {
            self.deny(DenyReason::ServerIneligible, raised.summary());
            self.finish(Err(raised));
            return;
        }
        let message = alloc::format!(
            "server {} has wire version {}, but the operation needs at least {}",
            server.address,
            server.max_wire_version,
            self.spec.min_wire_version
        );
        self.finish(Err(OperationError::server_selection(message)));
    }

    /// TX-11: commits after the first (driver retries, or the user committing again) use majority
    /// write concern, except while every failure so far was a retryable overload error.
    fn write_concern_rule(&self) -> WriteConcernRule {
        match self.spec.kind {
            OperationKind::CommitTransaction { again } => {
                let retried = self.dispatched > 1;
                if again || (retried && !self.only_overload_failures) {
                    WriteConcernRule::Majority
                } else {
                    WriteConcernRule::AsRequested
                }
            }
            _ => WriteConcernRule::AsRequested,
        }
    }

    /// CS-4, TO-10: the dispatched attempt was not sent because the remaining time is not more
    /// than the server's minimum RTT. The connection goes back (not closed) and the operation
    /// ends with a timeout error wrapping the error it had, if any (CS-5).
    pub fn handle_expired_before_send(&mut self, _now: Instant) -> Result<(), UnexpectedInput> {
        if !matches!(self.state, State::Attempt { sent_at: None, .. }) {
            return self.unexpected("expired before send");
        }
        self.push_release(false);
        self.finish_timed_out();
        Ok(())
    }

    /// The dispatched attempt cannot carry its `txnNumber`: the connection it was checked out on
    /// does not support sessions (its own handshake reply lacks `logicalSessionTimeoutMinutes`,
    /// SE-8) although the server's description said it does.
    ///
    /// RW-2: a first attempt then runs as a write without a transaction number, once: no
    /// retryable-write retry and no `RetryableWriteError` label (an overload retry, BP-5, remains,
    /// as for a server that lacks support). A retry must carry the first attempt's `txnNumber`
    /// (RW-7), so it is not sent: the connection goes back and the operation raises the previous
    /// error (RW-14). Nothing changes for an attempt that carries no `txnNumber`. A
    /// transaction's command cannot run without one (TX-1): for those this input is unexpected
    /// (the caller refuses the attempt instead, SE-8).
    pub fn handle_attempt_without_txn_number(
        &mut self,
        _now: Instant,
    ) -> Result<(), UnexpectedInput> {
        let State::Attempt {
            server,
            sent_at: None,
        } = &self.state
        else {
            return self.unexpected("attempt without txnNumber");
        };
        if !self.txn_attached {
            return Ok(());
        }
        if self.spec.kind != OperationKind::RetryableWrite {
            return self.unexpected("attempt without txnNumber");
        }
        if self.dispatched > 1 {
            let server = server.clone();
            self.push_release(false);
            self.finish_ineligible(&server);
            return Ok(());
        }
        self.txn_attached = false;
        self.retryable_writes_supported = false;
        Ok(())
    }

    /// The attempt's command was written to a connection: emits [`RetryEvent::CommandStarted`].
    pub fn handle_sent(&mut self, now: Instant) -> Result<(), UnexpectedInput> {
        let State::Attempt {
            server,
            sent_at: sent_at @ None,
        } = &mut self.state
        else {
            return self.unexpected("sent");
        };
        if self.record_events {
            self.events.push(RetryEvent::CommandStarted {
                attempt: self.dispatched,
                address: server.address.clone(),
            });
        }
        *sent_at = Some(now);
        Ok(())
    }

    /// The attempt succeeded: releases the connection and finishes the operation.
    pub fn handle_succeeded(&mut self, now: Instant) -> Result<(), UnexpectedInput> {
        let State::Attempt {
            server,
            sent_at: Some(sent_at),
        } = &self.state
        else {
            return self.unexpected("succeeded");
        };
        if self.record_events {
            self.events.push(RetryEvent::CommandSucceeded {
                attempt: self.dispatched,
                address: server.address.clone(),
                duration: now.saturating_duration_since(*sent_at),
            });
        }
        match &self.options.policy {
            RetryPolicy::Current => {}
            // TB-2, TB-3.
            RetryPolicy::TokenBucket(bucket) => bucket.deposit(if self.retries == 0 {
                Deposit::FirstAttemptSuccess
            } else {
                Deposit::RetrySuccess
            }),
            RetryPolicy::Grpc(policy) => {
                if let Some(throttle) = &policy.throttle {
                    throttle.record_success();
                }
            }
        }
        self.push_release(false);
        self.finish(Ok(()));
        Ok(())
    }

    /// The attempt failed: after dispatch with `error` (a checkout, connection or handshake error
    /// when nothing was sent), or after [`RetryMachine::handle_sent`] with the server's or the
    /// network's error. Releases the connection, then retries (now or after a [`Action::Wait`]) or
    /// finishes with the error the rules pick.
    pub fn handle_failed(
        &mut self,
        error: OperationError,
        now: Instant,
    ) -> Result<(), UnexpectedInput> {
        self.fail(Cow::Owned(error), now)
    }

    /// [`RetryMachine::handle_failed`] with the error borrowed: the same decisions, actions,
    /// events and raised error. For a caller that hands one error to many operations (a
    /// simulated server's overload error): the machine copies it only when it must change it
    /// (a label or address the driver adds) or keep it, and keeps the error it holds when that
    /// is the same one (the same shared reply, labels and address).
    pub fn handle_failed_ref(
        &mut self,
        error: &OperationError,
        now: Instant,
    ) -> Result<(), UnexpectedInput> {
        self.fail(Cow::Borrowed(error), now)
    }

    /// [`RetryMachine::handle_failed`], the error owned or borrowed.
    fn fail(
        &mut self,
        mut error: Cow<'_, OperationError>,
        now: Instant,
    ) -> Result<(), UnexpectedInput> {
        // The server stays in the state, read in place; every decision below sets the state.
        let (server, sent_at) = match &self.state {
            State::Attempt { server, sent_at } => (server, *sent_at),
            _ => return self.unexpected("failed"),
        };
        self.add_driver_labels(&mut error, server);
        // The labels are final here: the summary the events carry is the error's now (only
        // events carry it: a machine without events does not build it).
        let summary = self.record_events.then(|| error.summary());
        if let (Some(sent_at), Some(summary)) = (sent_at, summary) {
            self.events.push(RetryEvent::CommandFailed {
                attempt: self.dispatched,
                address: server.address.clone(),
                duration: now.saturating_duration_since(sent_at),
                error: summary,
            });
        }
        let sharded = server.topology_type.is_sharded();
        let close = matches!(error.kind, ErrorKind::Network(_));
        self.push_release(close);

        // CS-5: once the deadline has passed, the operation ends with a timeout error. CS-7:
        // under `timeoutMS` so does a MaxTimeMSExpired (code 50), which the server's
        // `maxTimeMS` (CS-4) raises before the deadline.
        let decision = match &self.options.policy {
            _ if self.spec.timeout.expired(now) => Decision::TimedOut,
            _ if self.spec.timeout.is_csot() && error.is_max_time_expired() => {
                Decision::MaxTimeExpired
            }
            RetryPolicy::Grpc(_) => self.decide_grpc(&error, sharded, now),
            _ => self.decide_backpressure(&error, sharded, now),
        };
        self.remember(error);
        match decision {
            Decision::Retry {
                delay,
                reason,
                deprioritize,
            } => {
                // The decisions read the state and never change it: the attempt's server is
                // still where the start of this method found it (SS-11 deprioritizes it).
                let State::Attempt { server, .. } = &self.state else {
                    unreachable!("a retry decision changed the failed attempt's state");
                };
                if deprioritize && !self.deprioritized.contains(&server.address) {
                    self.deprioritized.push(server.address.clone());
                }
                if self.record_events {
                    let deprioritized = deprioritize.then(|| server.address.clone());
                    self.events.push(RetryEvent::RetryScheduled {
                        retry: self.retries,
                        delay,
                        reason,
                        deprioritized,
                    });
                }
                if delay.is_zero() {
                    self.state = State::Selecting;
                    self.actions.push(Action::SelectServer);
                } else {
                    let until = now.saturating_add(delay);
                    self.state = State::BackingOff { until };
                    self.actions.push(Action::Wait { until });
                }
            }
            Decision::Deny(reason) => {
                if let Some(summary) = summary {
                    self.deny(reason, summary);
                }
                if let Some(raised) = self.raised.take() {
                    self.finish(Err(raised));
                }
            }
            Decision::TimedOut => self.finish_timed_out(),
            Decision::MaxTimeExpired => self.finish_with_timeout(DenyReason::NotRetryable),
        }
        Ok(())
    }

    /// Server selection for the next attempt failed. The first attempt raises the selection error
    /// (RR-6, RW-11); a retry raises the previous error (RR-6, RW-14).
    ///
    /// Under CSOT, a selection that fails with the deadline passed (its timeout was the remaining
    /// `timeoutMS`, CS-3) ends the operation with a timeout error (CS-5; RR-11: with CSOT the
    /// retries stop when expired) wrapping that same error: the previous one on a retry, else
    /// the selection error.
    pub fn handle_selection_failed(
        &mut self,
        error: OperationError,
        now: Instant,
    ) -> Result<(), UnexpectedInput> {
        if !matches!(self.state, State::Selecting) {
            return self.unexpected("selection failed");
        }
        let raised = self.raised.take().unwrap_or(error);
        if self.spec.timeout.expired(now) {
            self.raised = Some(raised);
            self.finish_timed_out();
            return Ok(());
        }
        self.finish(Err(raised));
        Ok(())
    }

    /// Time has passed: ends a backoff that is due. Spurious calls are harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let State::BackingOff { until } = self.state {
            if now >= until {
                self.state = State::Selecting;
                self.actions.push(Action::SelectServer);
            }
        }
    }

    /// The caller gave up on the operation: an attempt in flight is failed and its connection
    /// closed, and the operation finishes with [`ErrorKind::Cancelled`].
    pub fn cancel(&mut self, now: Instant) -> Result<(), UnexpectedInput> {
        let error = OperationError::cancelled();
        match &self.state {
            State::Finished => return self.unexpected("cancel"),
            State::Attempt {
                server,
                sent_at: Some(sent_at),
            } => {
                if self.record_events {
                    self.events.push(RetryEvent::CommandFailed {
                        attempt: self.dispatched,
                        address: server.address.clone(),
                        duration: now.saturating_duration_since(*sent_at),
                        error: error.summary(),
                    });
                }
                self.push_release(true);
            }
            State::Attempt { sent_at: None, .. } => self.push_release(false),
            State::Selecting | State::BackingOff { .. } => {}
        }
        self.finish(Err(error));
        Ok(())
    }

    /// RW-9 and TX-10: the driver adds `RetryableWriteError` to network, pool-cleared and pre-4.4
    /// errors of writes that use retryable-write semantics; RW-16 rewrites the "Transaction
    /// numbers" error of a retryable write.
    /// The error is copied (when borrowed) only if one of them changes it.
    fn add_driver_labels(&self, error: &mut Cow<'_, OperationError>, server: &AttemptServer) {
        let labels_writes = match self.spec.kind {
            OperationKind::RetryableWrite => self.options.retry_writes && self.txn_attached,
            OperationKind::CommitTransaction { .. } | OperationKind::AbortTransaction => true,
            _ => false,
        };
        let from_mongos = server.server_type == ServerType::Mongos;
        if labels_writes && error.needs_retryable_write_label(server.max_wire_version, from_mongos)
        {
            let error = error.to_mut();
            error.labels = error.labels.union(Labels::RETRYABLE_WRITE);
        }
        if self.spec.kind == OperationKind::RetryableWrite && self.txn_attached {
            let error = error.to_mut();
            let taken = core::mem::replace(error, OperationError::cancelled());
            *error = taken.rewrite_unsupported_retryable_writes();
        }
        if error.address.is_none() {
            error.to_mut().address = Some(server.address.clone());
        }
    }

    /// Whether the read/write/transaction rules retry this error, given the options.
    fn ordinarily_retryable(
        &self,
        error: &OperationError,
        retry_reads: bool,
        retry_writes: bool,
    ) -> bool {
        match self.spec.kind {
            OperationKind::Read => retry_reads && error.is_retryable_read(),
            OperationKind::RetryableWrite => {
                retry_writes && self.retryable_writes_supported && error.is_retryable_write()
            }
            OperationKind::CommitTransaction { .. } | OperationKind::AbortTransaction => {
                error.is_retryable_write()
            }
            _ => false,
        }
    }

    /// BP-24 with the sharded rule (BP-20) and the sticky cap (BP-22).
    fn decide_backpressure(
        &mut self,
        error: &OperationError,
        sharded: bool,
        now: Instant,
    ) -> Decision {
        let overload = error.is_overload();
        let (retry_reads, retry_writes) = (self.options.retry_reads, self.options.retry_writes);
        let kind = self.spec.kind;
        // Borrowed, not cloned: the decision reads the bucket without a reference count.
        let token_bucket = match &self.options.policy {
            RetryPolicy::TokenBucket(bucket) => Some(&**bucket),
            _ => None,
        };
        // TB-4: a retry that fails with a non-overload error deposits 1 token.
        if let Some(bucket) = token_bucket {
            if self.retries > 0 && !overload {
                bucket.deposit(Deposit::RetryFailedWithoutOverload);
            }
        }
        if overload {
            self.overload_seen = true;
        }
        if !error.is_retryable_overload() {
            self.only_overload_failures = false;
        }
        let overload_retry =
            error.is_retryable_overload() && kind.overload_retry_enabled(retry_reads, retry_writes);
        if !(overload_retry || self.ordinarily_retryable(error, retry_reads, retry_writes)) {
            let retryable_if_enabled =
                error.is_retryable_overload() || self.ordinarily_retryable(error, true, true);
            return Decision::Deny(if retryable_if_enabled {
                DenyReason::DisabledByOption
            } else {
                DenyReason::NotRetryable
            });
        }
        let retry = self.retries + 1;
        let allowed = if self.overload_seen {
            match token_bucket {
                Some(_) => TOKEN_BUCKET_MAX_RETRIES,
                None => self.options.max_adaptive_retries,
            }
        } else if self.spec.timeout.is_csot() {
            u32::MAX
        } else {
            1
        };
        if retry > allowed {
            return Decision::Deny(DenyReason::Cap);
        }
        if self.spec.timeout.expired(now) {
            return Decision::TimedOut;
        }
        let retargeting = token_bucket.is_some() || self.options.enable_overload_retargeting;
        // BP-20, contradiction C6: sharded always; elsewhere overload with retargeting on.
        let deprioritize = sharded || (overload && retargeting);
        let delay = if overload {
            let jitter = Jitter::draw(&mut self.rng);
            match token_bucket {
                Some(_) => backoff::token_bucket_era(retry, jitter),
                None => backoff::current(
                    retry,
                    error.server_error().and_then(|e| e.base_backoff),
                    jitter,
                ),
            }
        } else {
            Duration::ZERO
        };
        if self.spec.timeout.would_pass(now, delay) {
            return Decision::Deny(DenyReason::Deadline);
        }
        // TB-5: the token is taken after the deadline check and before the backoff.
        if overload && token_bucket.is_some_and(|bucket| !bucket.try_consume_retry()) {
            return Decision::Deny(DenyReason::Budget);
        }
        self.retries = retry;
        let reason = if overload {
            RetryReason::Overload
        } else {
            RetryReason::Retryable
        };
        Decision::Retry {
            delay,
            reason,
            deprioritize,
        }
    }

    /// Whether running the command twice is harmless (A6 retries a sent command only then):
    /// a `RetryableWrite` only when its attempt carried a `txnNumber`, so the server
    /// de-duplicates it (RW-2, RW-7); without one (a standalone, or a connection without
    /// sessions, SE-8) a retry could apply the write twice.
    fn idempotent(&self) -> bool {
        match self.spec.kind {
            OperationKind::RetryableWrite => self.txn_attached,
            kind => kind.idempotent(),
        }
    }

    /// gRPC A6, mapped onto MongoDB errors (see [`crate::policy::GrpcPolicy`]).
    fn decide_grpc(&mut self, error: &OperationError, sharded: bool, now: Instant) -> Decision {
        let RetryPolicy::Grpc(policy) = &self.options.policy else {
            return Decision::Deny(DenyReason::NotRetryable);
        };
        let kind = self.spec.kind;
        let enabled =
            kind.overload_retry_enabled(self.options.retry_reads, self.options.retry_writes);
        if !error.was_sent() {
            // A6 transparent retry: the command never left the client.
            if !enabled {
                return Decision::Deny(DenyReason::DisabledByOption);
            }
            self.transparent_in_a_row += 1;
            if self.spec.timeout.deadline().is_none()
                && self.transparent_in_a_row > policy.max_attempts
            {
                return Decision::Deny(DenyReason::Cap);
            }
            if self.spec.timeout.expired(now) {
                return Decision::TimedOut;
            }
            return Decision::Retry {
                delay: Duration::ZERO,
                reason: RetryReason::Transparent,
                deprioritize: sharded,
            };
        }
        self.transparent_in_a_row = 0;
        let pushback = error.server_error().and_then(|e| e.pushback);
        if pushback == Some(Pushback::DoNotRetry) {
            if let Some(throttle) = &policy.throttle {
                throttle.record_failure();
            }
            return Decision::Deny(DenyReason::Pushback);
        }
        let retryable_status = match &error.kind {
            ErrorKind::Network(_) | ErrorKind::PoolCleared { .. } => true,
            _ => error
                .code()
                .is_some_and(|c| policy.retryable_codes.contains(&c)),
        };
        if !retryable_status {
            return Decision::Deny(DenyReason::NotRetryable);
        }
        // Not sent, NoWritesPerformed, or an overload rejection: the server did not run it.
        let skipped_by_server = error.has_label(Labels::NO_WRITES_PERFORMED) || error.is_overload();
        if !(self.idempotent() || skipped_by_server) {
            return Decision::Deny(DenyReason::NotRetryable);
        }
        if !enabled {
            return Decision::Deny(DenyReason::DisabledByOption);
        }
        if let Some(throttle) = &policy.throttle {
            if !throttle.record_failure() {
                return Decision::Deny(DenyReason::Budget);
            }
        }
        if self.retries + 1 >= policy.max_attempts {
            return Decision::Deny(DenyReason::Cap);
        }
        if self.spec.timeout.expired(now) {
            return Decision::TimedOut;
        }
        let (delay, reason) = match pushback {
            Some(Pushback::RetryAfter(delay)) => {
                self.since_pushback = 0;
                (delay, RetryReason::Pushback)
            }
            _ => {
                self.since_pushback += 1;
                let jitter = Jitter::draw(&mut self.rng);
                (
                    policy.backoff.delay(self.since_pushback, jitter),
                    RetryReason::Retryable,
                )
            }
        };
        if self.spec.timeout.would_pass(now, delay) {
            return Decision::Deny(DenyReason::Deadline);
        }
        self.retries += 1;
        let deprioritize =
            sharded || (error.is_overload() && self.options.enable_overload_retargeting);
        Decision::Retry {
            delay,
            reason,
            deprioritize,
        }
    }

    /// RW-17, RR-9: keeps the first error, then replaces it with each later error that shows the
    /// command was attempted (sent; for writes also not `NoWritesPerformed`).
    /// A borrowed error is copied only when it replaces an error that is not the same.
    fn remember(&mut self, error: Cow<'_, OperationError>) {
        // The first error is kept whatever it shows: asked only when one is kept already.
        let shows_attempt = |error: &OperationError| {
            if self.spec.kind.picks_errors_as_write() {
                !error.no_writes_performed()
            } else {
                error.was_sent()
            }
        };
        if self.raised.is_none() || shows_attempt(&error) {
            match error {
                Cow::Owned(error) => self.raised = Some(error),
                // Keeping an error that is the same as the new one keeps what it would keep;
                // another is copied over the kept one (sharing its reply when it can).
                Cow::Borrowed(error) => match &mut self.raised {
                    Some(kept) => {
                        if !kept.is_same(error) {
                            kept.clone_from(error);
                        }
                    }
                    None => self.raised = Some(error.clone()),
                },
            }
        }
    }

    fn deny(&mut self, reason: DenyReason, error: ErrorSummary) {
        if self.record_events {
            self.events.push(RetryEvent::RetryDenied { reason, error });
        }
    }

    /// CS-5: after the deadline, raise a timeout error that wraps the error being handled.
    fn finish_timed_out(&mut self) {
        self.finish_with_timeout(DenyReason::Deadline);
    }

    /// Raises a timeout error wrapping the error being handled (CS-5), recording why it is not
    /// retried: `Deadline`, or `NotRetryable` for a CS-7 MaxTimeMSExpired that came before the
    /// deadline (review35 Z6).
    fn finish_with_timeout(&mut self, reason: DenyReason) {
        let cause = self.raised.take();
        // The summary goes only into the event: not built for a machine that records none.
        if let Some(cause) = cause.as_ref().filter(|_| self.record_events) {
            self.deny(reason, cause.summary());
        }
        // CS-5, CS-7: the timeout keeps its cause's labels (TX-7, TX-8), a MaxTimeMSExpired's
        // as any other's.
        self.finish(Err(OperationError::timeout(cause)));
    }

    fn finish(&mut self, result: Result<(), OperationError>) {
        self.state = State::Finished;
        self.actions.push(Action::Finished(result));
    }

    /// Whether [`RetryMachine::poll_action`] would return an action now: one in the queue or
    /// the `ReleaseConnection` kept apart. A caller that skips polling must see this false
    /// first, or it loses the action (house rule 8; review15 finding 2).
    #[inline]
    pub(crate) fn has_queued_actions(&self) -> bool {
        self.release.is_some() || !self.actions.is_empty()
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt {} to {}", self.number, self.address)?;
        if let Some(n) = self.txn_number {
            write!(f, " txnNumber={n}")?;
        }
        if self.start_transaction {
            f.write_str(" startTransaction")?;
        }
        if self.write_concern == WriteConcernRule::Majority {
            f.write_str(" w=majority")?;
        }
        Ok(())
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DenyReason::NotRetryable => "not retryable",
            DenyReason::DisabledByOption => "disabled by option",
            DenyReason::Cap => "retry cap reached",
            DenyReason::Budget => "retry budget exhausted",
            DenyReason::Deadline => "deadline",
            DenyReason::Pushback => "server pushback",
            DenyReason::ServerIneligible => "server ineligible",
        };
        f.write_str(s)
    }
}

impl RetryReason {
    /// A short name for traces.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::Overload => "overload",
            RetryReason::Retryable => "retryable",
            RetryReason::Transparent => "transparent",
            RetryReason::Pushback => "pushback",
        }
    }
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Formats an [`Action`] for traces.
impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::SelectServer => f.write_str("select server"),
            Action::Dispatch(a) => write!(f, "dispatch {a}"),
            Action::ReleaseConnection { close: false } => f.write_str("check in connection"),
            Action::ReleaseConnection { close: true } => f.write_str("close connection"),
            Action::Wait { until } => write!(f, "wait until {until}"),
            Action::Finished(Ok(())) => f.write_str("finished: ok"),
            Action::Finished(Err(e)) => write!(f, "finished: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::VecDeque;

    /// Review15 finding 2, house rule 8: the `ReleaseConnection` kept apart from the queue counts
    /// as a queued action, as much as one in the queue.
    #[test]
    fn review15_f2_a_release_kept_apart_is_a_queued_action() {
        let spec = OperationSpec::new(OperationKind::Read);
        let mut m = RetryMachine::new(spec, &RetryOptions::default(), 1, Instant::ZERO);
        assert!(m.has_queued_actions(), "the first SelectServer");
        assert_eq!(m.poll_action(), Some(Action::SelectServer));
        assert!(!m.has_queued_actions());
        m.release = Some(false);
        assert!(m.has_queued_actions(), "the release alone");
        assert_eq!(
            m.poll_action(),
            Some(Action::ReleaseConnection { close: false })
        );
        assert!(!m.has_queued_actions());
    }

    /// House rule 8 (no action lost or reordered): the small queue gives its items back first
    /// in, first out, past its inline places and across clears, whatever the pushes and pops
    /// interleaved; checked against a `VecDeque`.
    #[test]
    fn the_action_queue_is_first_in_first_out_past_its_inline_places() {
        let mut queue: Queue<u32, 3> = Queue::new();
        let mut model = VecDeque::new();
        let mut next = 0;
        // A fixed walk of pushes and pops, up to seven items queued at once.
        for step in 0..200_u32 {
            match (step * 7 + step / 5) % 3 {
                0 | 1 if model.len() < 7 => {
                    queue.push(next);
                    model.push_back(next);
                    next += 1;
                }
                _ => assert_eq!(queue.pop(), model.pop_front(), "step {step}"),
            }
            assert_eq!(queue.is_empty(), model.is_empty(), "step {step}");
            if step % 61 == 60 {
                queue.clear();
                model.clear();
            }
        }
        while let Some(item) = model.pop_front() {
            assert_eq!(queue.pop(), Some(item));
        }
        assert_eq!(queue.pop(), None);
    }
}
