//! Connection-pool accounting for one server (CMAP): which connections exist, which are free,
//! who waits for one, and when a connection must be opened or closed.
//!
//! The [`Pool`] owns no sockets. It asks the caller to open a connection ([`PoolAction::Establish`])
//! or close one ([`PoolAction::Close`]), and answers checkouts with [`PoolAction::CheckedOut`] or
//! [`PoolAction::CheckoutFailed`]. It emits the CMAP monitoring events ([`PoolEvent`]) in the order
//! the spec gives, and its only timers are wait-queue deadlines and idle expiries
//! ([`Pool::poll_timeout`]).
//!
//! Rules, by ID: connection ids start at 1 and a connection keeps the generation it was created in
//! (CM-1); the pool starts paused, `ready` opens it, `clear` pauses it and fails every waiter with a
//! retryable `PoolClearedError` (CM-2, CM-4); in load-balanced mode generations are kept per
//! `serviceId`, and clearing one service neither pauses the pool nor touches the wait queue (CM-5,
//! LB-15); the wait queue is first in, first out (CM-8); a wait-queue timeout in load-balanced mode
//! names the connections in use by cursors, transactions and other operations (LB-13).

use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use bson::oid::ObjectId;
use core::fmt;
use core::time::Duration;

use crate::address::ServerAddress;
use crate::error::OperationError;
use crate::id_table::IdTable;
use crate::time::Instant;

/// Pool options (CMAP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    /// `maxPoolSize`: connections, in use or not, at most; 0 means no limit. Default 100.
    pub max_pool_size: u32,
    /// `minPoolSize`: connections kept open while the pool is ready. Default 0.
    pub min_pool_size: u32,
    /// `maxConnecting`: connections being established at once, at most. Default 2.
    pub max_connecting: u32,
    /// `maxIdleTimeMS`: an available connection idle this long is closed; `None` keeps it forever.
    pub max_idle_time: Option<Duration>,
    /// `waitQueueTimeoutMS`: how long a checkout may wait when the caller gives no deadline.
    pub wait_queue_timeout: Option<Duration>,
    /// Load-balanced mode: generations per `serviceId` (CM-5).
    pub load_balanced: bool,
}

impl Default for PoolOptions {
    fn default() -> PoolOptions {
        PoolOptions {
            max_pool_size: 100,
            min_pool_size: 0,
            max_connecting: 2,
            max_idle_time: None,
            wait_queue_timeout: None,
            load_balanced: false,
        }
    }
}

/// A connection's id, unique within its pool, from 1 in creation order (CM-1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnectionId(pub u32);

/// One checkout request, as numbered by [`Pool::check_out`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckoutId(pub u64);

/// What a checked-out connection is used for (LB-13 counts them separately).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// Pinned to a cursor (load-balanced mode, LB-10).
    Cursor,
    /// Pinned to a transaction (load-balanced mode, LB-12).
    Transaction,
    /// Any other operation.
    Other,
}

/// Why a connection is closed (CMAP `ConnectionClosedEvent.reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// Its generation is older than the pool's (or its service's).
    Stale,
    /// It was idle longer than `maxIdleTimeMS`.
    Idle,
    /// It failed.
    Error,
    /// The pool was closed.
    PoolClosed,
}

impl CloseReason {
    /// The CMAP name: `stale`, `idle`, `error` or `poolClosed`.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Stale => "stale",
            CloseReason::Idle => "idle",
            CloseReason::Error => "error",
            CloseReason::PoolClosed => "poolClosed",
        }
    }
}

/// Why a checkout failed (CMAP `ConnectionCheckOutFailedEvent.reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckoutFailedReason {
    /// The pool is closed.
    PoolClosed,
    /// The wait queue timed out.
    Timeout,
    /// The pool is paused or was cleared, or establishing the connection failed.
    ConnectionError,
}

impl CheckoutFailedReason {
    /// The CMAP name: `poolClosed`, `timeout` or `connectionError`.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckoutFailedReason::PoolClosed => "poolClosed",
            CheckoutFailedReason::Timeout => "timeout",
            CheckoutFailedReason::ConnectionError => "connectionError",
        }
    }
}

/// Why a checkout failed, with the error to report.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckoutError {
    /// The pool is paused or was cleared: retryable, and it must not mark the server Unknown (CM-2).
    PoolCleared(OperationError),
    /// The pool is closed (CM-3).
    PoolClosed,
    /// The checkout waited past its deadline (CM-3, LB-13); the message says why.
    WaitQueueTimeout(String),
    /// Establishing the connection failed with this error (already labelled by CMAP, HS-9).
    Establishment(OperationError),
}

/// CM-3: the message of a checkout from a closed pool.
pub const POOL_CLOSED_MESSAGE: &str =
    "Attempted to check out a connection from closed connection pool";
/// CM-3: the message of a wait-queue timeout.
pub const WAIT_QUEUE_TIMEOUT_MESSAGE: &str =
    "Timed out while checking out a connection from connection pool";

impl CheckoutError {
    /// The CMAP reason for the checkout-failed event.
    pub fn reason(&self) -> CheckoutFailedReason {
        match self {
            CheckoutError::PoolClosed => CheckoutFailedReason::PoolClosed,
            CheckoutError::WaitQueueTimeout(_) => CheckoutFailedReason::Timeout,
            CheckoutError::PoolCleared(_) | CheckoutError::Establishment(_) => {
                CheckoutFailedReason::ConnectionError
            }
        }
    }

    /// The error as the retry machine sees it. Pool-cleared and establishment errors keep their
    /// retryability; a closed pool and a wait-queue timeout are not retryable.
    pub fn into_operation_error(self, address: &ServerAddress) -> OperationError {
        match self {
            CheckoutError::PoolCleared(e) | CheckoutError::Establishment(e) => e,
            CheckoutError::PoolClosed => {
                OperationError::checkout(POOL_CLOSED_MESSAGE, address.clone())
            }
            CheckoutError::WaitQueueTimeout(message) => {
                OperationError::checkout(message, address.clone())
            }
        }
    }
}

impl fmt::Display for CheckoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckoutError::PoolCleared(e) | CheckoutError::Establishment(e) => write!(f, "{e}"),
            CheckoutError::PoolClosed => f.write_str(POOL_CLOSED_MESSAGE),
            CheckoutError::WaitQueueTimeout(message) => f.write_str(message),
        }
    }
}

/// What the caller must do for the pool.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolAction {
    /// Open a connection to the pool's server and run the handshake, then call
    /// [`Pool::handle_established`] or [`Pool::handle_establish_failed`].
    Establish {
        /// The new connection.
        connection: ConnectionId,
    },
    /// Close this connection's socket.
    Close {
        /// The connection.
        connection: ConnectionId,
        /// Why.
        reason: CloseReason,
    },
    /// CM-4: a clear with `interruptInUseConnections` interrupts this in-use connection: close
    /// its socket so that the operation on it fails with a network error, then check it in
    /// ([`Pool::check_in`], not healthy), which emits `CheckedIn` and closes it.
    Interrupt {
        /// The connection, still in use.
        connection: ConnectionId,
    },
    /// The checkout got this connection.
    CheckedOut {
        /// The checkout.
        checkout: CheckoutId,
        /// The connection, now in use.
        connection: ConnectionId,
    },
    /// The checkout failed.
    CheckoutFailed {
        /// The checkout.
        checkout: CheckoutId,
        /// Why.
        error: CheckoutError,
    },
}

/// A CMAP monitoring event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolEvent {
    /// `PoolCreatedEvent`.
    PoolCreated,
    /// `PoolReadyEvent`.
    PoolReady,
    /// `PoolClearedEvent`, with the service cleared in load-balanced mode (LB-16).
    PoolCleared {
        /// The cleared service, in load-balanced mode.
        service_id: Option<ObjectId>,
        /// Whether in-use connections were interrupted.
        interrupt_in_use_connections: bool,
    },
    /// `PoolClosedEvent`.
    PoolClosed,
    /// `ConnectionCreatedEvent`.
    ConnectionCreated {
        /// The connection.
        connection: ConnectionId,
    },
    /// `ConnectionReadyEvent`.
    ConnectionReady {
        /// The connection.
        connection: ConnectionId,
        /// From creation to ready.
        duration: Duration,
    },
    /// `ConnectionClosedEvent`.
    ConnectionClosed {
        /// The connection.
        connection: ConnectionId,
        /// Why.
        reason: CloseReason,
    },
    /// `ConnectionCheckOutStartedEvent`.
    CheckOutStarted {
        /// The checkout.
        checkout: CheckoutId,
    },
    /// `ConnectionCheckOutFailedEvent`.
    CheckOutFailed {
        /// The checkout.
        checkout: CheckoutId,
        /// Why.
        reason: CheckoutFailedReason,
        /// From the start of the checkout.
        duration: Duration,
    },
    /// `ConnectionCheckedOutEvent`.
    CheckedOut {
        /// The checkout.
        checkout: CheckoutId,
        /// The connection.
        connection: ConnectionId,
        /// From the start of the checkout.
        duration: Duration,
    },
    /// `ConnectionCheckedInEvent`.
    CheckedIn {
        /// The connection.
        connection: ConnectionId,
    },
}

/// The pool's state (CM-2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolState {
    /// Checkouts fail with `PoolClearedError`; the initial state and the state after a clear.
    Paused,
    /// Checkouts are served.
    Ready,
    /// Final.
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnectionState {
    /// Being established, for this checkout if any.
    Pending {
        for_checkout: Option<CheckoutId>,
    },
    Available {
        since: Instant,
    },
    InUse {
        purpose: Purpose,
    },
}

#[derive(Clone, Debug)]
struct Connection {
    id: ConnectionId,
    generation: u32,
    service_id: Option<ObjectId>,
    created: Instant,
    state: ConnectionState,
}

#[derive(Clone, Debug)]
struct Waiter {
    checkout: CheckoutId,
    purpose: Purpose,
    started: Instant,
    /// The caller's deadline (CSOT): it bounds the checkout even while its connection is being
    /// established (CS-3).
    deadline: Option<Instant>,
    /// `waitQueueTimeoutMS`: it bounds only the wait in the queue.
    queue_deadline: Option<Instant>,
    establishing: Option<ConnectionId>,
    /// This waiter's entry in [`Pool`]'s expiry index.
    indexed: Option<Instant>,
}

impl Waiter {
    /// When this checkout fails if it is still waiting.
    fn expiry(&self) -> Option<Instant> {
        let queue = self.queue_deadline.filter(|_| self.establishing.is_none());
        match (self.deadline, queue) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// CM-5: one `serviceId`'s generation and connections (load-balanced mode).
#[derive(Clone, Debug, Default)]
struct ServiceGeneration {
    generation: u32,
    /// The service's connections (those whose handshake named it), by id: their number is the
    /// count CM-5 keeps, and a clear of the service walks only them (review38 L8, house rule 9).
    connections: BTreeSet<ConnectionId>,
}

/// LB-13: the connections in use, by [`Purpose`], kept as connections enter and leave the
/// in-use state (review38 L8, house rule 9: a wait-queue timeout does not recount them).
#[derive(Clone, Copy, Debug, Default)]
struct InUseCounts {
    cursors: u32,
    transactions: u32,
    other: u32,
}

impl InUseCounts {
    #[inline(always)]
    fn slot(&mut self, purpose: Purpose) -> &mut u32 {
        match purpose {
            Purpose::Cursor => &mut self.cursors,
            Purpose::Transaction => &mut self.transactions,
            Purpose::Other => &mut self.other,
        }
    }
}

/// The connection-pool accounting machine of one server. See the [module docs](self).
#[derive(Debug)]
pub struct Pool {
    address: ServerAddress,
    options: PoolOptions,
    state: PoolState,
    generation: u32,
    /// CM-5: the services by `serviceId`, so that the generation check of every check-in,
    /// checkout and handshake is a lookup, not a scan of the services (review38 L8, house rule 9).
    services: BTreeMap<ObjectId, ServiceGeneration>,
    /// LB-13: the in-use connections by purpose, kept by [`Pool::track`] (review38 L8).
    in_use: InUseCounts,
    /// The connections by id, so that one input costs the same however many exist (house rule 9);
    /// ids grow, so iteration is in creation order.
    connections: IdTable<ConnectionId, Connection>,
    /// How many connections are pending (being established).
    pending: usize,
    /// Pending connections no checkout asked for (opened for `minPoolSize`).
    unclaimed: BTreeSet<ConnectionId>,
    /// Available connections by the time they became available, for idle expiry (CM-1); kept
    /// only when `maxIdleTimeMS` is set, the only case that reads it.
    idle: BTreeSet<(Instant, ConnectionId)>,
    /// Available connections, most recently checked in last. A closed connection's id may stay
    /// until it is popped (ids are never reused), so a close does not scan the stack.
    available: Vec<ConnectionId>,
    waiters: VecDeque<Waiter>,
    /// The checkout whose connection's establishment failed, held out of `waiters` (so a clear
    /// does not fail it) until the connection is closed (CM-4).
    failed_establishment: Option<(ConnectionId, Waiter)>,
    /// The waiters' expiries, ordered, so that [`Pool::poll_timeout`] reads the earliest without
    /// scanning the queue. An entry may be earlier than its waiter's expiry (a checkout whose
    /// connection is being established no longer has the queue's deadline): that only makes a
    /// spurious `handle_timeout`.
    expiries: alloc::collections::BTreeSet<(Instant, CheckoutId)>,
    /// The next connection id (CM-1: from 1, never reused); 0 once `u32::MAX` was handed out,
    /// after which no connection is created (review21, house rule 11).
    next_connection: u32,
    next_checkout: u64,
    actions: VecDeque<PoolAction>,
    events: VecDeque<PoolEvent>,
    /// Whether events are recorded ([`Pool::set_record_events`]).
    record_events: bool,
}

impl Pool {
    /// A paused pool for `address` (CM-2); emits [`PoolEvent::PoolCreated`].
    pub fn new(address: ServerAddress, options: PoolOptions) -> Pool {
        let mut events = VecDeque::new();
        events.push_back(PoolEvent::PoolCreated);
        Pool {
            address,
            options,
            state: PoolState::Paused,
            generation: 0,
            services: BTreeMap::new(),
            in_use: InUseCounts::default(),
            connections: IdTable::default(),
            pending: 0,
            unclaimed: BTreeSet::new(),
            idle: BTreeSet::new(),
            available: Vec::new(),
            waiters: VecDeque::new(),
            failed_establishment: None,
            expiries: alloc::collections::BTreeSet::new(),
            next_connection: 1,
            next_checkout: 1,
            actions: VecDeque::new(),
            events,
            record_events: true,
        }
    }

    /// Records the monitoring events ([`Pool::poll_event`]) from now on (`true`, the default)
    /// or not, for an embedder that publishes none: the actions and every decision are the same
    /// either way. Switched off, it drops the events not yet polled, so that it has none until
    /// switched on again (issue 9: a round trip recorded three, each built, queued and then
    /// dropped by [`Pool::discard_events`]).
    pub fn set_record_events(&mut self, on: bool) {
        self.record_events = on;
        if !on {
            self.events.clear();
        }
    }

    /// Whether an event waits to be polled.
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Records `event` when events are recorded.
    #[inline]
    fn emit(&mut self, event: PoolEvent) {
        if self.record_events {
            self.events.push_back(event);
        }
    }

    /// The pool's server.
    pub fn address(&self) -> &ServerAddress {
        &self.address
    }

    /// The options.
    pub fn options(&self) -> &PoolOptions {
        &self.options
    }

    /// The state (CM-2).
    pub fn state(&self) -> PoolState {
        self.state
    }

    /// The pool's generation (CM-1); in load-balanced mode, see [`Pool::service_generation`].
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The generation of `service_id`'s connections (CM-5); 0 for a service never seen. A
    /// lookup in O(log services) (review38 L8, house rule 9).
    pub fn service_generation(&self, service_id: &ObjectId) -> u32 {
        self.services.get(service_id).map_or(0, |s| s.generation)
    }

    /// The generation a connection was created in, and its service, if it exists.
    pub fn connection_generation(
        &self,
        connection: ConnectionId,
    ) -> Option<(u32, Option<ObjectId>)> {
        self.connection(connection)
            .map(|c| (c.generation, c.service_id))
    }

    /// LB-13: what the in-use `connection` serves; `None` when it is not in use.
    pub fn purpose(&self, connection: ConnectionId) -> Option<Purpose> {
        match self.connection(connection)?.state {
            ConnectionState::InUse { purpose } => Some(purpose),
            _ => None,
        }
    }

    /// LB-12, LB-13: the in-use `connection` now serves `purpose` (a transaction pinned it);
    /// a connection not in use is left alone.
    pub fn set_purpose(&mut self, connection: ConnectionId, purpose: Purpose) {
        if let Some(ConnectionState::InUse { .. }) = self.connection(connection).map(|c| c.state) {
            // Through `set_state`, which moves the connection between the LB-13 counts.
            self.set_state(connection, ConnectionState::InUse { purpose });
        }
    }

    /// Connections in use, by purpose: (cursors, transactions, other) (LB-13). Kept as
    /// connections are checked out, checked in, closed and change purpose, so this costs the same
    /// however many connections exist (review38 L8, house rule 9).
    pub fn in_use(&self) -> (u32, u32, u32) {
        let c = self.in_use;
        (c.cursors, c.transactions, c.other)
    }

    /// The number of open or opening connections.
    pub fn total_connections(&self) -> usize {
        self.connections.len()
    }

    /// The next thing to do, in order.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<PoolAction> {
        self.actions.pop_front()
    }

    /// The next monitoring event, in order.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<PoolEvent> {
        self.events.pop_front()
    }

    /// Whether an action waits to be polled ([`Pool::poll_action`]).
    pub(crate) fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// Whether an action or an event waits to be polled.
    pub(crate) fn has_output(&self) -> bool {
        !self.actions.is_empty() || !self.events.is_empty()
    }

    /// Drops the pending events unread, for an embedder that does not publish them: the same
    /// as polling every one and ignoring it.
    pub fn discard_events(&mut self) {
        self.events.clear();
    }

    /// The earliest wait-queue deadline or idle expiry.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let waits = self.expiries.first().map(|(at, _)| *at);
        let idle = self.options.max_idle_time.and_then(|max| {
            let (since, _) = self.idle.first()?;
            Some(since.saturating_add(max))
        });
        waits.into_iter().chain(idle).min()
    }

    /// CM-2: opens a paused pool; emits [`PoolEvent::PoolReady`] unless it was already ready.
    pub fn ready(&mut self, now: Instant) {
        if self.state == PoolState::Paused {
            self.state = PoolState::Ready;
            self.emit(PoolEvent::PoolReady);
            self.serve(now);
        }
    }

    /// Starts a checkout for `purpose` that waits until `deadline` at the latest (or the pool's
    /// `waitQueueTimeoutMS` when `None`). The answer comes as [`PoolAction::CheckedOut`] or
    /// [`PoolAction::CheckoutFailed`], at once or later.
    pub fn check_out(
        &mut self,
        purpose: Purpose,
        deadline: Option<Instant>,
        now: Instant,
    ) -> CheckoutId {
        self.check_out_served(purpose, deadline, now, false).0
    }

    /// [`Pool::check_out`], and when `take` and the checkout is served at once with its
    /// [`PoolAction::CheckedOut`] the only action it leaves waiting, that connection, the action
    /// not queued: for an engine that routes that answer at once (issue 9). Otherwise the
    /// answer is queued as [`Pool::check_out`] queues it.
    pub(crate) fn check_out_served(
        &mut self,
        purpose: Purpose,
        deadline: Option<Instant>,
        now: Instant,
        take: bool,
    ) -> (CheckoutId, Option<ConnectionId>) {
        let checkout = CheckoutId(self.next_checkout);
        self.next_checkout += 1;
        self.emit(PoolEvent::CheckOutStarted { checkout });
        match self.state {
            PoolState::Closed => self.fail(checkout, now, now, CheckoutError::PoolClosed),
            PoolState::Paused => {
                let error = self.pool_cleared_error("the pool is paused");
                self.fail(checkout, now, now, CheckoutError::PoolCleared(error));
            }
            PoolState::Ready => {
                // CM-8: under CSOT the caller's deadline replaces waitQueueTimeoutMS.
                let queue_deadline = match deadline {
                    Some(_) => None,
                    None => self
                        .options
                        .wait_queue_timeout
                        .map(|t| now.saturating_add(t)),
                };
                let waiter = Waiter {
                    checkout,
                    purpose,
                    started: now,
                    deadline,
                    queue_deadline,
                    establishing: None,
                    indexed: None,
                };
                // Issue 9: with nobody waiting ahead (CM-8), an available connection serves the
                // checkout without it entering the wait queue; the same steps `serve` takes.
                if self.waiters.is_empty() {
                    if let Some(connection) = self.take_available(now) {
                        let alone = take && self.actions.is_empty();
                        let answer = self.hand_over(waiter, connection, now);
                        if !alone {
                            self.actions.push_back(answer);
                            self.serve(now);
                            return (checkout, None);
                        }
                        self.serve(now);
                        if self.actions.is_empty() {
                            return (checkout, Some(connection));
                        }
                        // `serve` queued more: the answer goes first, where it was due.
                        self.actions.push_front(answer);
                        return (checkout, None);
                    }
                }
                // A checkout served at once never enters the expiry index; one still waiting
                // gets the entry it would have had from the start.
                let expiry = waiter.expiry();
                self.waiters.push_back(waiter);
                self.serve(now);
                // `serve` only removes waiters, so a new one still waiting is the last.
                let queued = self.waiters.back_mut().filter(|w| w.checkout == checkout);
                if let (Some(at), Some(w)) = (expiry, queued) {
                    if w.indexed.is_none() {
                        w.indexed = Some(at);
                        self.expiries.insert((at, checkout));
                    }
                }
            }
        }
        (checkout, None)
    }

    /// Withdraws a checkout that has not been answered (its operation was cancelled): it leaves
    /// the wait queue without an answer; a connection being established for it stays, for the
    /// next checkout or as an available connection.
    pub fn cancel_checkout(&mut self, checkout: CheckoutId, now: Instant) {
        let Some(index) = self.waiters.iter().position(|w| w.checkout == checkout) else {
            return;
        };
        if let Some(w) = self.remove_waiter(index) {
            if let Some(pending) = w.establishing {
                self.set_state(pending, ConnectionState::Pending { for_checkout: None });
            }
        }
        self.serve(now);
    }

    /// Returns a connection. A connection that failed (`healthy` false), is stale, or belongs to a
    /// closed pool is closed; otherwise it becomes available (CM-1).
    pub fn check_in(&mut self, connection: ConnectionId, healthy: bool, now: Instant) {
        let Some(conn) = self.connection(connection) else {
            return;
        };
        if !matches!(conn.state, ConnectionState::InUse { .. }) {
            return;
        }
        let stale = self.is_stale(conn);
        self.emit(PoolEvent::CheckedIn { connection });
        let reason = if self.state == PoolState::Closed {
            Some(CloseReason::PoolClosed)
        } else if !healthy {
            Some(CloseReason::Error)
        } else if stale {
            Some(CloseReason::Stale)
        } else {
            None
        };
        match reason {
            Some(reason) => self.close_connection(connection, reason),
            None => {
                self.set_state(connection, ConnectionState::Available { since: now });
                self.available.push(connection);
            }
        }
        self.serve(now);
    }

    /// The connection's handshake succeeded (in load-balanced mode with the reply's `serviceId`,
    /// whose generation the connection takes, CM-5). Emits [`PoolEvent::ConnectionReady`] and
    /// hands the connection to the checkout that asked for it, or makes it available.
    pub fn handle_established(
        &mut self,
        connection: ConnectionId,
        service_id: Option<ObjectId>,
        now: Instant,
    ) {
        let Some(conn) = self.connection(connection) else {
            return;
        };
        let ConnectionState::Pending { for_checkout } = conn.state else {
            return;
        };
        let created = conn.created;
        self.emit(PoolEvent::ConnectionReady {
            connection,
            duration: now.saturating_duration_since(created),
        });
        if let (true, Some(service)) = (self.options.load_balanced, service_id) {
            // CM-5: the connection joins its service's entry (made at its first connection).
            let entry = self.services.entry(service).or_default();
            entry.connections.insert(connection);
            let generation = entry.generation;
            if let Some(c) = self.connection_mut(connection) {
                c.generation = generation;
                c.service_id = Some(service);
            }
        }
        let stale = self
            .connection(connection)
            .is_some_and(|c| self.is_stale(c));
        let waiter = for_checkout.and_then(|id| self.waiters.iter().position(|w| w.checkout == id));
        if self.state == PoolState::Closed {
            self.close_connection(connection, CloseReason::PoolClosed);
        } else if stale {
            self.close_connection(connection, CloseReason::Stale);
        } else if let Some(index) = waiter {
            if let Some(w) = self.remove_waiter(index) {
                self.give(w, connection, now);
            }
        } else {
            self.set_state(connection, ConnectionState::Available { since: now });
            self.available.push(connection);
        }
        self.serve(now);
    }

    /// Establishing the connection failed, first step: the checkout that asked for it is taken
    /// out of the queue (a clear does not fail it), and the connection stays pending until
    /// [`Pool::handle_establish_failed`] closes it and fails that checkout with the error. Between
    /// the two the engine runs SDAM error handling, so the events come in the spec's order:
    /// `PoolClearedEvent`, `ConnectionClosedEvent`, `ConnectionCheckOutFailedEvent` (CM-4, LB-14).
    pub fn hold_establishing_checkout(&mut self, connection: ConnectionId) {
        let Some(conn) = self.connection(connection) else {
            return;
        };
        let ConnectionState::Pending { for_checkout } = conn.state else {
            return;
        };
        if let Some(index) =
            for_checkout.and_then(|id| self.waiters.iter().position(|w| w.checkout == id))
        {
            if let Some(w) = self.remove_waiter(index) {
                self.set_state(connection, ConnectionState::Pending { for_checkout: None });
                self.failed_establishment = Some((connection, w));
            }
        }
    }

    /// Establishing the connection failed: it is closed, and the checkout that asked for it
    /// (also when [`Pool::hold_establishing_checkout`] held it) fails with the error.
    pub fn handle_establish_failed(
        &mut self,
        connection: ConnectionId,
        error: OperationError,
        now: Instant,
    ) {
        let held = match self.failed_establishment.take() {
            Some((id, w)) if id == connection => Some(w),
            other => {
                self.failed_establishment = other;
                None
            }
        };
        let Some(conn) = self.connection(connection) else {
            if let Some(w) = held {
                self.fail(
                    w.checkout,
                    w.started,
                    now,
                    CheckoutError::Establishment(error),
                );
            }
            return;
        };
        let ConnectionState::Pending { for_checkout } = conn.state else {
            return;
        };
        self.close_connection(connection, CloseReason::Error);
        let waiting = for_checkout
            .and_then(|id| self.waiters.iter().position(|w| w.checkout == id))
            .and_then(|index| self.remove_waiter(index));
        if let Some(w) = held.or(waiting) {
            self.fail(
                w.checkout,
                w.started,
                now,
                CheckoutError::Establishment(error),
            );
        }
        self.serve(now);
    }

    /// The socket of an established connection failed while no checkout was using it (an idle
    /// connection, or one pinned to a cursor or transaction between operations): it is closed
    /// (reason `error`), after a [`PoolEvent::CheckedIn`] if it was checked out, and its slot is
    /// freed.
    pub fn handle_connection_lost(&mut self, connection: ConnectionId, now: Instant) {
        let Some(conn) = self.connection(connection) else {
            return;
        };
        match conn.state {
            ConnectionState::Pending { .. } => return,
            ConnectionState::InUse { .. } => self.emit(PoolEvent::CheckedIn { connection }),
            ConnectionState::Available { .. } => {}
        }
        self.close_connection(connection, CloseReason::Error);
        self.serve(now);
    }

    /// Clears the pool after `cause` (CM-4): the generation goes up, the pool pauses, every waiter
    /// fails at once with a retryable `PoolClearedError`, available connections are closed as
    /// stale, and [`PoolEvent::PoolCleared`] is emitted only if the pool was not already paused.
    /// With `interrupt_in_use_connections`, in-use and pending connections of older generations are
    /// closed too.
    ///
    /// In load-balanced mode, give the failing connection's `service_id`: only that service's
    /// generation goes up, and the pool neither pauses nor touches its waiters (CM-5, LB-15).
    /// Only that service's connections are walked, so the clear costs the same however many
    /// other services and connections there are (review38 L8, house rule 9).
    pub fn clear(
        &mut self,
        service_id: Option<ObjectId>,
        interrupt_in_use_connections: bool,
        cause: &str,
        now: Instant,
    ) {
        if self.state == PoolState::Closed {
            return;
        }
        let lb_service = service_id.filter(|_| self.options.load_balanced);
        match lb_service {
            Some(service) => {
                let entry = self.services.entry(service).or_default();
                entry.generation = entry.generation.wrapping_add(1);
                self.emit(PoolEvent::PoolCleared {
                    service_id: Some(service),
                    interrupt_in_use_connections,
                });
            }
            None => {
                self.generation += 1;
                let was_ready = self.state == PoolState::Ready;
                self.state = PoolState::Paused;
                if was_ready {
                    self.emit(PoolEvent::PoolCleared {
                        service_id: None,
                        interrupt_in_use_connections,
                    });
                }
            }
        }
        // Available connections of the old generation go now; pending ones too when
        // interrupting, and in-use ones are interrupted: their operations fail, then they are
        // checked in and closed (CM-4; SDAM `interruptInUse-pool-clear.json`: PoolCleared,
        // CheckedIn, ConnectionClosed).
        //
        // A service's clear (CM-5, LB-15) makes only that service's connections stale, so it
        // walks only them, in id (creation) order as the scan of every connection did (L8).
        let selected = |c: &&Connection| {
            interrupt_in_use_connections || matches!(c.state, ConnectionState::Available { .. })
        };
        let stale: Vec<(ConnectionId, bool)> = match lb_service {
            Some(service) => match self.services.get(&service) {
                Some(entry) => entry
                    .connections
                    .iter()
                    .filter_map(|id| self.connections.get(id))
                    .filter(|c| self.is_stale(c))
                    .filter(selected)
                    .map(|c| (c.id, matches!(c.state, ConnectionState::InUse { .. })))
                    .collect(),
                None => Vec::new(),
            },
            None => self
                .connections
                .values()
                .filter(|c| self.is_stale(c))
                .filter(selected)
                .map(|c| (c.id, matches!(c.state, ConnectionState::InUse { .. })))
                .collect(),
        };
        for (id, in_use) in stale {
            if in_use {
                self.actions
                    .push_back(PoolAction::Interrupt { connection: id });
            } else {
                self.close_connection(id, CloseReason::Stale);
            }
        }
        if lb_service.is_none() {
            let error = self.pool_cleared_error(cause);
            self.expiries.clear();
            while let Some(w) = self.waiters.pop_front() {
                if let Some(pending) = w.establishing {
                    self.set_state(pending, ConnectionState::Pending { for_checkout: None });
                }
                self.fail(
                    w.checkout,
                    w.started,
                    now,
                    CheckoutError::PoolCleared(error.clone()),
                );
            }
        }
    }

    /// Closes the pool (CM-2): available connections are closed at once, in-use ones when they
    /// are checked in, waiters fail, and [`PoolEvent::PoolClosed`] is emitted.
    pub fn close(&mut self, now: Instant) {
        if self.state == PoolState::Closed {
            return;
        }
        self.state = PoolState::Closed;
        while let Some(id) = self.available.pop() {
            self.close_connection(id, CloseReason::PoolClosed);
        }
        self.expiries.clear();
        while let Some(w) = self.waiters.pop_front() {
            self.fail(w.checkout, w.started, now, CheckoutError::PoolClosed);
        }
        self.emit(PoolEvent::PoolClosed);
    }

    /// Time has passed: fails checkouts past their deadline and closes idle connections. Spurious
    /// calls are harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(max) = self.options.max_idle_time {
            let mut idle: Vec<ConnectionId> = self
                .idle
                .iter()
                .take_while(|(since, _)| now >= since.saturating_add(max))
                .map(|(_, id)| *id)
                .collect();
            // Closed in creation order, as a scan of the connections would.
            idle.sort_unstable();
            for id in idle {
                self.close_connection(id, CloseReason::Idle);
            }
        }
        // House rule 9: only the waiters with a due entry in the expiry index are looked at, not
        // the whole queue. An entry is never later than its waiter's expiry (it is set from the
        // expiry, and only establishing a connection for the waiter moves that later, without
        // touching the entry), so every waiter due now has one; nearly always there are none.
        if self.expiries.first().is_some_and(|(at, _)| *at <= now) {
            self.expire_waiters(now);
        }
        self.serve(now);
    }

    /// [`Pool::handle_timeout`] with due entries in the expiry index: fails the checkouts past
    /// their expiry, in queue order (CM-3, CM-8: the events and answers of a scan of the queue),
    /// and indexes again the others, whose expiry moved later.
    #[inline(never)]
    fn expire_waiters(&mut self, now: Instant) {
        let mut due: Vec<CheckoutId> = Vec::new();
        while let Some(&(at, checkout)) = self.expiries.first() {
            if at > now {
                break;
            }
            self.expiries.pop_first();
            due.push(checkout);
        }
        // Waiters join the queue only at its back, with increasing checkout ids: queue order is
        // id order, and a waiter is found by a binary search. Deadlines need not follow it (a
        // caller's CSOT deadline, or none, beside `waitQueueTimeoutMS`).
        due.sort_unstable();
        // LB-13: failing a waiter changes no connection, so one message serves the whole batch
        // (review38 L8: made once, from the kept counts).
        let mut message: Option<String> = None;
        for checkout in due {
            let Ok(index) = self.waiters.binary_search_by_key(&checkout, |w| w.checkout) else {
                continue;
            };
            // A checkout that is establishing its own connection is bounded by the caller's
            // deadline and the connect timeout, not by the wait queue's.
            let expiry = self.waiters[index].expiry();
            if expiry.is_some_and(|d| now >= d) {
                // Its entry is out of the index already.
                self.waiters[index].indexed = None;
                if let Some(w) = self.waiters.remove(index) {
                    let message = message
                        .get_or_insert_with(|| self.wait_queue_timeout_message())
                        .clone();
                    self.fail(
                        w.checkout,
                        w.started,
                        now,
                        CheckoutError::WaitQueueTimeout(message),
                    );
                }
            } else {
                // Its expiry moved later: indexed again, at an instant after `now`.
                self.waiters[index].indexed = expiry;
                if let Some(at) = expiry {
                    self.expiries.insert((at, checkout));
                }
            }
        }
    }

    /// Puts the waiter's current expiry in the index (replacing its entry).
    fn index(&mut self, waiter: &mut Waiter) {
        if let Some(old) = waiter.indexed.take() {
            self.expiries.remove(&(old, waiter.checkout));
        }
        waiter.indexed = waiter.expiry();
        if let Some(at) = waiter.indexed {
            self.expiries.insert((at, waiter.checkout));
        }
    }

    /// Takes a waiter out of the queue and the index.
    fn remove_waiter(&mut self, index: usize) -> Option<Waiter> {
        let waiter = self.waiters.remove(index)?;
        if let Some(at) = waiter.indexed {
            self.expiries.remove(&(at, waiter.checkout));
        }
        Some(waiter)
    }

    /// CM-3, LB-13: the wait-queue timeout message; in load-balanced mode it counts the
    /// connections in use by cursors, transactions and other operations (from the kept counts,
    /// review38 L8).
    fn wait_queue_timeout_message(&self) -> String {
        if self.options.load_balanced {
            let (cursors, transactions, other) = self.in_use();
            format!(
                "Timeout waiting for connection from the connection pool. maxPoolSize: {}, connections in use by cursors: {cursors}, connections in use by transactions: {transactions}, connections in use by other operations: {other}",
                self.options.max_pool_size
            )
        } else {
            String::from(WAIT_QUEUE_TIMEOUT_MESSAGE)
        }
    }

    fn pool_cleared_error(&self, cause: &str) -> OperationError {
        OperationError::pool_cleared(self.address.clone(), cause)
    }

    /// Serves waiters in order (CM-8), then keeps `minPoolSize` connections (CMAP background work).
    /// Nearly always nobody waits and the pool holds its `minPoolSize`: nothing to do, found
    /// inline (issue 9: a call per checkout and per check-in).
    #[inline]
    fn serve(&mut self, now: Instant) {
        if self.waiters.is_empty()
            && (self.connections.len() as u64) >= u64::from(self.options.min_pool_size)
        {
            return;
        }
        self.serve_waiters(now);
    }

    /// [`Pool::serve`] with someone waiting or connections to open.
    fn serve_waiters(&mut self, now: Instant) {
        if self.state != PoolState::Ready {
            return;
        }
        let mut index = 0;
        while index < self.waiters.len() {
            if self.waiters[index].establishing.is_some() {
                index += 1;
                continue;
            }
            match self.take_available(now) {
                Some(connection) => {
                    if let Some(w) = self.remove_waiter(index) {
                        self.give(w, connection, now);
                    }
                }
                // A connection being established for nobody (for minPoolSize) is adopted rather
                // than starting another one.
                None if self.unclaimed_pending().is_some() => {
                    let checkout = self.waiters[index].checkout;
                    if let Some(connection) = self.unclaimed_pending() {
                        self.set_state(
                            connection,
                            ConnectionState::Pending {
                                for_checkout: Some(checkout),
                            },
                        );
                        self.waiters[index].establishing = Some(connection);
                    }
                    index += 1;
                }
                None if self.can_create() => {
                    let checkout = self.waiters[index].checkout;
                    let connection = self.create(Some(checkout), now);
                    self.waiters[index].establishing = Some(connection);
                    index += 1;
                }
                // FIFO: later waiters never overtake one that cannot be served yet.
                None => return,
            }
        }
        while (self.connections.len() as u64) < u64::from(self.options.min_pool_size)
            && self.can_create()
        {
            self.create(None, now);
        }
    }

    /// The most recently returned available connection that has not perished; perished ones found
    /// on the way are closed (CM-1).
    fn take_available(&mut self, now: Instant) -> Option<ConnectionId> {
        while let Some(id) = self.available.pop() {
            let Some(conn) = self.connection(id) else {
                continue;
            };
            let idle = match (conn.state, self.options.max_idle_time) {
                (ConnectionState::Available { since }, Some(max)) => {
                    now >= since.saturating_add(max)
                }
                _ => false,
            };
            if self.is_stale(conn) {
                self.close_connection(id, CloseReason::Stale);
            } else if idle {
                self.close_connection(id, CloseReason::Idle);
            } else {
                return Some(id);
            }
        }
        None
    }

    fn unclaimed_pending(&self) -> Option<ConnectionId> {
        self.unclaimed.first().copied()
    }

    fn can_create(&self) -> bool {
        let pending = self.pending;
        let below_max = self.options.max_pool_size == 0
            || (self.connections.len() as u64) < u64::from(self.options.max_pool_size);
        let id_left = self.next_connection != 0;
        id_left && below_max && (pending as u64) < u64::from(self.options.max_connecting.max(1))
    }

    fn create(&mut self, for_checkout: Option<CheckoutId>, now: Instant) -> ConnectionId {
        let id = ConnectionId(self.next_connection);
        self.next_connection = self.next_connection.checked_add(1).unwrap_or(0);
        let state = ConnectionState::Pending { for_checkout };
        self.track(id, state, true);
        self.connections.insert(
            id,
            Connection {
                id,
                generation: self.generation,
                service_id: None,
                created: now,
                state,
            },
        );
        self.emit(PoolEvent::ConnectionCreated { connection: id });
        self.actions
            .push_back(PoolAction::Establish { connection: id });
        id
    }

    fn give(&mut self, w: Waiter, connection: ConnectionId, now: Instant) {
        let answer = self.hand_over(w, connection, now);
        self.actions.push_back(answer);
    }

    /// [`Pool::give`] but for queueing its answer, which it returns.
    #[inline(always)]
    fn hand_over(&mut self, w: Waiter, connection: ConnectionId, now: Instant) -> PoolAction {
        self.set_state(connection, ConnectionState::InUse { purpose: w.purpose });
        self.emit(PoolEvent::CheckedOut {
            checkout: w.checkout,
            connection,
            duration: now.saturating_duration_since(w.started),
        });
        PoolAction::CheckedOut {
            checkout: w.checkout,
            connection,
        }
    }

    fn fail(&mut self, checkout: CheckoutId, started: Instant, now: Instant, error: CheckoutError) {
        self.emit(PoolEvent::CheckOutFailed {
            checkout,
            reason: error.reason(),
            duration: now.saturating_duration_since(started),
        });
        self.actions
            .push_back(PoolAction::CheckoutFailed { checkout, error });
    }

    fn is_stale(&self, conn: &Connection) -> bool {
        match (self.options.load_balanced, conn.service_id) {
            (true, Some(service)) => conn.generation != self.service_generation(&service),
            _ => conn.generation != self.generation,
        }
    }

    fn close_connection(&mut self, id: ConnectionId, reason: CloseReason) {
        let Some(conn) = self.connections.remove(&id) else {
            return;
        };
        self.track(id, conn.state, false);
        // Ids left in `available` by closes are dropped once they outnumber the connections.
        if self.available.len() > 2 * self.connections.len() + 8 {
            let connections = &self.connections;
            self.available.retain(|a| connections.contains_key(a));
        }
        // A checkout that was waiting for this pending connection waits for another.
        let pending = matches!(conn.state, ConnectionState::Pending { .. });
        let establishing = match pending {
            true => self.waiters.iter().position(|w| w.establishing == Some(id)),
            false => None,
        };
        if let Some(index) = establishing {
            if let Some(mut w) = self.waiters.get(index).cloned() {
                w.establishing = None;
                self.index(&mut w);
                self.waiters[index] = w;
            }
        }
        if let Some(service) = conn.service_id {
            if let Some(entry) = self.services.get_mut(&service) {
                entry.connections.remove(&id);
                // CM-5: the entry goes when its last connection does.
                if entry.connections.is_empty() {
                    self.services.remove(&service);
                }
            }
        }
        self.emit(PoolEvent::ConnectionClosed {
            connection: id,
            reason,
        });
        self.actions.push_back(PoolAction::Close {
            connection: id,
            reason,
        });
    }

    fn connection(&self, id: ConnectionId) -> Option<&Connection> {
        self.connections.get(&id)
    }

    fn connection_mut(&mut self, id: ConnectionId) -> Option<&mut Connection> {
        self.connections.get_mut(&id)
    }

    /// Moves connection `id` to `state`, keeping the indexes. Inlined: at a checkout and a
    /// check-in it is a lookup and two `track`s that do nothing (issue 9).
    #[inline(always)]
    fn set_state(&mut self, id: ConnectionId, state: ConnectionState) {
        let Some(c) = self.connections.get_mut(&id) else {
            return;
        };
        let old = core::mem::replace(&mut c.state, state);
        self.track(id, old, false);
        self.track(id, state, true);
    }

    /// Keeps the indexes of `state` (`pending`, `unclaimed`, `idle`) and the LB-13 counts of
    /// in-use connections (review38 L8) as connection `id` enters (`entered`) or leaves it. In
    /// use, and available without `maxIdleTimeMS` (every checkout and check-in), it has only a
    /// count to change: found inline (issue 9).
    #[inline(always)]
    fn track(&mut self, id: ConnectionId, state: ConnectionState, entered: bool) {
        match state {
            ConnectionState::InUse { purpose } => {
                let count = self.in_use.slot(purpose);
                *count = match entered {
                    true => count.saturating_add(1),
                    false => count.saturating_sub(1),
                };
            }
            ConnectionState::Available { .. } if self.options.max_idle_time.is_none() => {}
            _ => self.track_indexed(id, state, entered),
        }
    }

    /// [`Pool::track`] for a state with an index (out of line: `track` stays small).
    #[inline(never)]
    fn track_indexed(&mut self, id: ConnectionId, state: ConnectionState, entered: bool) {
        match state {
            ConnectionState::Pending { for_checkout } => {
                match entered {
                    true => self.pending += 1,
                    false => self.pending = self.pending.saturating_sub(1),
                }
                if for_checkout.is_none() {
                    match entered {
                        true => self.unclaimed.insert(id),
                        false => self.unclaimed.remove(&id),
                    };
                }
            }
            ConnectionState::Available { since } if self.options.max_idle_time.is_some() => {
                match entered {
                    true => self.idle.insert((since, id)),
                    false => self.idle.remove(&(since, id)),
                };
            }
            ConnectionState::Available { .. } | ConnectionState::InUse { .. } => {}
        }
    }
}

#[cfg(test)]
mod connection_id_tests {
    use super::*;

    /// Review21 (CM-1, house rule 11): a connection id is never handed out twice. With the
    /// ids up to `u32::MAX` handed out, the pool creates no more connections (a checkout is
    /// served by the connections there are, or waits out its deadline), where a saturating
    /// counter gave every later connection `u32::MAX` and the table replaced the live one.
    #[test]
    fn review21_cm1_no_connection_id_is_handed_out_twice() {
        let mut pool = Pool::new(ServerAddress::new("a", 27017), PoolOptions::default());
        pool.next_connection = u32::MAX - 1;
        let t0 = Instant::ZERO;
        pool.ready(t0);
        let settle = |pool: &mut Pool| {
            let mut seen = Vec::new();
            while let Some(action) = pool.poll_action() {
                if let PoolAction::Establish { connection } = action {
                    pool.handle_established(connection, None, t0);
                }
                seen.push(action);
                assert!(seen.len() < 100, "bounded");
            }
            seen
        };
        let mut held = Vec::new();
        for _ in 0..2 {
            let checkout = pool.check_out(Purpose::Other, None, t0);
            for action in settle(&mut pool) {
                if let PoolAction::CheckedOut {
                    checkout: c,
                    connection,
                } = action
                {
                    assert_eq!(c, checkout);
                    held.push(connection);
                }
            }
        }
        assert_eq!(held, [ConnectionId(u32::MAX - 1), ConnectionId(u32::MAX)]);
        let deadline = Instant::from_millis(50);
        let waiting = pool.check_out(Purpose::Other, Some(deadline), t0);
        assert_eq!(settle(&mut pool), []);
        assert_eq!(pool.total_connections(), 2);
        pool.handle_timeout(deadline);
        let failed = settle(&mut pool);
        assert!(
            matches!(failed.as_slice(), [PoolAction::CheckoutFailed { checkout, error: CheckoutError::WaitQueueTimeout(_) }] if *checkout == waiting),
            "{failed:?}"
        );
        // The connections there are still serve checkouts.
        pool.check_in(held[0], true, t0);
        let again = pool.check_out(Purpose::Other, None, t0);
        let served = settle(&mut pool);
        assert_eq!(
            served,
            [PoolAction::CheckedOut {
                checkout: again,
                connection: held[0]
            }]
        );
    }

    /// Issue 9 (CM-8's order of answers): a checkout served at once hands its connection back
    /// unqueued only when asked and when its answer would be the one action waiting; otherwise
    /// its `CheckedOut` is queued where `check_out` queues it, behind what was waiting.
    #[test]
    fn a_checkout_served_at_once_is_taken_only_when_its_answer_is_alone() {
        let t0 = Instant::ZERO;
        let mut pool = Pool::new(ServerAddress::new("a", 27017), PoolOptions::default());
        pool.ready(t0);
        // Two connections, established and checked back in.
        let mut conns = Vec::new();
        for _ in 0..2 {
            pool.check_out(Purpose::Other, None, t0);
        }
        while let Some(action) = pool.poll_action() {
            match action {
                PoolAction::Establish { connection } => {
                    pool.handle_established(connection, None, t0)
                }
                PoolAction::CheckedOut { connection, .. } => conns.push(connection),
                other => panic!("{other:?}"),
            }
        }
        for &conn in &conns {
            pool.check_in(conn, true, t0);
        }
        // Asked, alone: the connection, nothing queued.
        let (_, first) = pool.check_out_served(Purpose::Other, None, t0, true);
        let first = first.expect("served at once");
        assert!(!pool.has_actions());
        // Not asked: queued as `check_out` queues it.
        let (second, served) = pool.check_out_served(Purpose::Other, None, t0, false);
        assert_eq!(served, None);
        let other = match pool.poll_action() {
            Some(PoolAction::CheckedOut {
                checkout,
                connection,
            }) if checkout == second => connection,
            other => panic!("{other:?}"),
        };
        // Asked, behind a waiting action: queued after it.
        pool.check_in(first, true, t0);
        pool.check_in(other, true, t0);
        let waiting = pool.check_out(Purpose::Other, None, t0);
        let (third, served) = pool.check_out_served(Purpose::Other, None, t0, true);
        assert_eq!(served, None);
        let answers: Vec<_> = core::iter::from_fn(|| pool.poll_action())
            .map(|action| match action {
                PoolAction::CheckedOut { checkout, .. } => checkout,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(answers, [waiting, third]);
    }

    /// Review24 R5 (CM-8, issue 9): a checkout served at once and asked to be taken, alone when
    /// it is served, but after which `serve` queues more (here: an `Establish` for minPoolSize),
    /// is not taken: its answer is queued in front of what `serve` queued, where it was due.
    /// A load-balanced clear of one service closes its available connection without serving, so
    /// the pool is below minPoolSize with one connection available and no action waiting.
    #[test]
    fn review24_r5_a_checkout_served_before_serve_queues_more_is_answered_first() {
        let t0 = Instant::ZERO;
        let options = PoolOptions {
            min_pool_size: 2,
            load_balanced: true,
            ..PoolOptions::default()
        };
        let mut pool = Pool::new(ServerAddress::new("a", 27017), options);
        pool.ready(t0);
        let mut opened = Vec::new();
        while let Some(action) = pool.poll_action() {
            match action {
                PoolAction::Establish { connection } => opened.push(connection),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(opened.len(), 2, "minPoolSize opens two");
        let (gone, kept) = (ObjectId::from_bytes([1; 12]), ObjectId::from_bytes([2; 12]));
        pool.handle_established(opened[1], Some(kept), t0);
        pool.handle_established(opened[0], Some(gone), t0);
        pool.clear(Some(gone), false, "service gone", t0);
        let closed: Vec<_> = core::iter::from_fn(|| pool.poll_action()).collect();
        assert!(
            matches!(closed[..], [PoolAction::Close { connection, .. }] if connection == opened[0]),
            "{closed:?}"
        );
        assert_eq!(pool.total_connections(), 1);
        let (checkout, served) = pool.check_out_served(Purpose::Other, None, t0, true);
        assert_eq!(served, None, "serve queued an Establish: not taken");
        match pool.poll_action() {
            Some(PoolAction::CheckedOut {
                checkout: answered,
                connection,
            }) => assert_eq!((answered, connection), (checkout, opened[1])),
            other => panic!("the answer first, got {other:?}"),
        }
        assert!(matches!(
            pool.poll_action(),
            Some(PoolAction::Establish { .. })
        ));
        assert_eq!(pool.poll_action(), None);
    }
}
