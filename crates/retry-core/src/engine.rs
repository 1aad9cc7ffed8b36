//! The engine: the retry machines, server selection, the SDAM topology with its pools, the server
//! monitors and the connections, composed behind one sans-IO interface for adapters.
//!
//! # Driving it
//!
//! Inputs take `now`: [`Engine::start_operation`], [`Engine::handle_connected`],
//! [`Engine::handle_bytes`], [`Engine::handle_closed`] and [`Engine::handle_timeout`]. Outputs are
//! polled until `None`: [`Engine::poll_connect`] (open a socket), [`Engine::poll_transmit`] (bytes to
//! write, appended to the caller's buffer), [`Engine::poll_close`] (close a socket),
//! [`Engine::poll_event`] (operation results and monitoring events). After any input, drain every
//! `poll_*`, then wait for the earlier of [`Engine::poll_timeout`] and the next input. A spurious
//! `handle_timeout` is harmless. [`Engine::close`] ends everything.
//!
//! ```text
//! let mut buf = Vec::new();
//! loop {
//!     while let Some(c) = engine.poll_connect()  { open a socket to c.address, then handle_connected(c.conn) }
//!     while let Some(conn) = engine.poll_transmit(&mut buf) { write buf to conn; buf.clear() }
//!     while let Some(c) = engine.poll_close()    { close c }
//!     while let Some(e) = engine.poll_event()    { deliver e }
//!     wait for bytes (handle_bytes), a closed socket (handle_closed) or poll_timeout() (handle_timeout)
//! }
//! ```
//!
//! # The path of one operation
//!
//! `start_operation` creates a [`RetryMachine`]. Its `SelectServer` starts a [`ServerSelection`]
//! over the topology, avoiding the machine's deprioritized addresses; a selected server goes back
//! to the machine, whose `Dispatch` checks a connection out of that server's pool. The command,
//! modified as the attempt says (`txnNumber`, `startTransaction`, write concern, `$db`), is written
//! on the connection, and the reply (or the connection's failure) goes back to the machine, which
//! releases the connection before it backs off, retries or finishes. Errors also go to the
//! topology's error handling, which may mark the server Unknown and clear its pool.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::string::String;
use alloc::vec::Vec;
use bson::{doc, Bson, Document};
use core::time::Duration;
use rand_core::RngCore;

use crate::address::ServerAddress;
use crate::connection::{
    Connection, ConnectionConfig, ConnectionEvent, Request, DEFAULT_CONNECT_TIMEOUT,
};
use crate::error::{NetworkErrorKind, NetworkPhase, OperationError};
use crate::handshake::{HandshakeOptions, HandshakeReply};
use crate::monitor::{HeartbeatEvent, Monitor, MonitorAction, DEFAULT_HEARTBEAT_FREQUENCY};
use crate::pinning::{
    transaction_labels, CursorClose, CursorPin, Pin, TransactionCommand, TransactionPin,
};
use crate::policy::RetryOptions;
use crate::pool::{CheckoutId, ConnectionId, PoolAction, PoolEvent, Purpose};
use crate::retry::{
    Action, Attempt, AttemptServer, OperationKind, OperationSpec, RetryEvent, RetryMachine,
    WriteConcernRule, COMMIT_RETRY_WTIMEOUT,
};
use crate::rng::EngineRng;
use crate::selection::{SelectionCriteria, SelectionSettings, SelectionStep, ServerSelection};
use crate::time::{Instant, OperationTimeout};
use crate::topology::{ErrorContext, SdamEvent, Topology, TopologyAction, TopologySettings};

/// A socket the engine asked for, unique for the engine's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

/// An operation started with [`Engine::start_operation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// Everything the engine needs to know at creation. Made with [`EngineOptions::new`]; every field
/// may then be changed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EngineOptions {
    /// The seeds and the deployment mode (replica set name, direct connection, load balanced) and
    /// the pool options.
    pub topology: TopologySettings,
    /// The retry options and policy.
    pub retry: RetryOptions,
    /// Server selection settings (`localThresholdMS`, `serverSelectionTimeoutMS`).
    pub selection: SelectionSettings,
    /// `heartbeatFrequencyMS`.
    pub heartbeat_frequency: Duration,
    /// `connectTimeoutMS`.
    pub connect_timeout: Duration,
    /// `socketTimeoutMS`, if any.
    pub socket_timeout: Option<Duration>,
    /// The handshake: client metadata, API version, compressors. `load_balanced` is taken from
    /// the topology settings.
    pub handshake: HandshakeOptions,
    /// The seed of the engine's RNG (jitter, the power-of-two choice). Adapters seed it from the OS.
    pub seed: u64,
}

impl EngineOptions {
    /// Options with the defaults for everything but the topology and the handshake.
    pub fn new(topology: TopologySettings, handshake: HandshakeOptions) -> EngineOptions {
        EngineOptions {
            topology,
            retry: RetryOptions::default(),
            selection: SelectionSettings::default(),
            heartbeat_frequency: DEFAULT_HEARTBEAT_FREQUENCY,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            socket_timeout: None,
            handshake,
            seed: 0,
        }
    }
}

/// One operation to run. Made with [`OperationRequest::new`]; every field may then be changed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct OperationRequest {
    /// The database.
    pub db: String,
    /// The command, without `$db`.
    pub command: Document,
    /// What kind of operation it is (the retry rules depend on it).
    pub kind: OperationKind,
    /// Where it may run.
    pub criteria: SelectionCriteria,
    /// Its CSOT timeout.
    pub timeout: OperationTimeout,
    /// The session's transaction number, for retryable writes and transactions.
    pub txn_number: Option<i64>,
    /// How the operation relates to a cursor: a getMore or killCursors goes where its cursor lives.
    pub cursor: CursorUse,
    /// The session, for the transaction pinning rules (TX-3..TX-5): a transaction's commands follow
    /// its first command's mongos (or connection, in load-balanced mode).
    pub session: Option<SessionId>,
}

impl OperationRequest {
    /// A request with no CSOT timeout, no transaction number and no cursor.
    pub fn new(
        db: impl Into<String>,
        command: Document,
        kind: OperationKind,
        criteria: SelectionCriteria,
    ) -> OperationRequest {
        OperationRequest {
            db: db.into(),
            command,
            kind,
            criteria,
            timeout: OperationTimeout::Off,
            txn_number: None,
            cursor: CursorUse::None,
            session: None,
        }
    }
}

/// A session, named by the caller; the engine keeps its transaction pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

/// A cursor the engine keeps between a cursor-creating command and its last `getMore`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CursorHandle(pub u64);

/// How an operation relates to a cursor.
///
/// A cursor lives on one server, so its `getMore`s and its `killCursors` skip server selection and
/// go there. In load-balanced mode they also use the very connection that created the cursor
/// (LB-10): it stays checked out, counted as in use by a cursor (LB-13), until a `getMore` returns
/// cursor id 0 or the cursor is closed. After a network error on that connection, closing the cursor
/// sends no `killCursors` and the connection is closed (LB-11). Running two operations on one cursor
/// at the same time is not supported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum CursorUse {
    /// Not a cursor operation.
    #[default]
    None,
    /// A cursor-creating command (find, aggregate, listCollections, listIndexes): a reply with a
    /// non-zero `cursor.id` opens a cursor, reported by [`EngineEvent::CursorOpened`].
    Open,
    /// A `getMore` of this cursor; a reply with `cursor.id` 0 ends the cursor.
    GetMore(CursorHandle),
    /// The `killCursors` that closes this cursor.
    Close(CursorHandle),
}

/// A socket to open.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Connect {
    /// The engine's id for it.
    pub conn: ConnId,
    /// Where.
    pub address: ServerAddress,
}

/// What the engine reports.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum EngineEvent {
    /// An operation finished: the reply document, or the error the retry rules chose.
    OperationFinished {
        /// The operation.
        op: OpId,
        /// Its result.
        result: Result<Document, OperationError>,
    },
    /// A command monitoring or retry event of an operation.
    Operation {
        /// The operation.
        op: OpId,
        /// The event.
        event: RetryEvent,
    },
    /// A CMAP event of a server's pool.
    Pool {
        /// The server.
        address: ServerAddress,
        /// The event.
        event: PoolEvent,
    },
    /// A heartbeat event of a server's monitor.
    Heartbeat {
        /// The server.
        address: ServerAddress,
        /// The event.
        event: HeartbeatEvent,
    },
    /// An SDAM event.
    Topology(SdamEvent),
    /// A cursor-creating operation opened a cursor (reported just before its
    /// [`EngineEvent::OperationFinished`]); later `getMore`s name it with [`CursorUse::GetMore`].
    CursorOpened {
        /// The operation that created it.
        op: OpId,
        /// The cursor.
        cursor: CursorHandle,
    },
}

/// Who owns a socket.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Owner {
    Pool(ConnectionId),
    Monitor,
}

struct Socket {
    address: ServerAddress,
    owner: Owner,
    machine: Connection,
    /// The operation whose command is on this connection.
    op: Option<OpId>,
    /// Whether the socket is in the engine's transmit queue.
    transmit_queued: bool,
}

struct Operation {
    machine: RetryMachine,
    request: OperationRequest,
    selection: Option<ServerSelection>,
    /// When a waiting selection should look again.
    wake: Option<Instant>,
    server: Option<AttemptServer>,
    attempt: Option<Attempt>,
    /// The pending checkout: checkout ids are per pool, so with its server.
    checkout: Option<(ServerAddress, CheckoutId)>,
    conn: Option<ConnId>,
    reply: Option<Document>,
    /// A cursor operation's server: no selection (LB-10 and ordinary cursor server pinning).
    pinned_server: Option<AttemptServer>,
    /// A load-balanced cursor's connection: no checkout, and no check-in on release (LB-10).
    pinned_conn: Option<ConnId>,
    /// Check the pinned connection in when the operation releases it (the cursor ended).
    release_pinned: bool,
    /// The connection now belongs to the cursor this operation opened.
    keep_conn: bool,
    /// The cursor this operation opened.
    opened: Option<CursorHandle>,
}

/// A session's transaction pin, and in load-balanced mode the pinned connection (TX-3..TX-5).
#[derive(Default)]
struct Session {
    pin: TransactionPin,
    conn: Option<ConnId>,
}

/// A cursor between its creation and its end.
struct Cursor {
    server: AttemptServer,
    /// Load-balanced mode: the pinned connection.
    conn: Option<ConnId>,
    pin: CursorPin,
}

struct MonitorState {
    monitor: Monitor,
    conn: Option<ConnId>,
}

/// The engine. See the [module docs](self).
pub struct Engine {
    options: EngineOptions,
    topology: Topology,
    monitors: BTreeMap<ServerAddress, MonitorState>,
    sockets: BTreeMap<ConnId, Socket>,
    ops: BTreeMap<OpId, Operation>,
    cursors: BTreeMap<CursorHandle, Cursor>,
    next_cursor: u64,
    sessions: BTreeMap<SessionId, Session>,
    rng: EngineRng,
    next_conn: u64,
    next_op: u64,
    /// The handshake command every socket sends, built once (HS-2).
    handshake: Document,
    connects: VecDeque<Connect>,
    /// Sockets with bytes to write, in the order their bytes appeared.
    transmits: VecDeque<ConnId>,
    closes: VecDeque<ConnId>,
    events: VecDeque<EngineEvent>,
    /// Set by [`Engine::close`].
    closed: bool,
}

impl core::fmt::Debug for Engine {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Engine")
            .field("topology_type", &self.topology.description().topology_type)
            .field("servers", &self.topology.description().servers.len())
            .field("operations", &self.ops.len())
            .field("sockets", &self.sockets.len())
            .field("cursors", &self.cursors.len())
            .field("sessions", &self.sessions.len())
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

/// Why an engine could not be created.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineError {
    /// The topology settings are inconsistent (LB-2 conflicts, a direct connection to several
    /// seeds, no seeds).
    Settings(crate::topology::SettingsError),
    /// The client metadata of the handshake cannot be built (HS-5, HS-6), so no socket could ever
    /// be established.
    Handshake(crate::handshake::MetadataError),
    /// The handshake command cannot be encoded (WP-7).
    HandshakeEncoding(crate::wire::EncodeError),
}

impl core::fmt::Display for EngineError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EngineError::Settings(e) => write!(f, "invalid topology settings: {e}"),
            EngineError::Handshake(e) => write!(f, "invalid handshake: {e}"),
            EngineError::HandshakeEncoding(e) => write!(f, "the handshake cannot be encoded: {e}"),
        }
    }
}

impl core::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            EngineError::Settings(e) => Some(e),
            EngineError::Handshake(e) => Some(e),
            EngineError::HandshakeEncoding(e) => Some(e),
        }
    }
}

impl From<crate::topology::SettingsError> for EngineError {
    fn from(e: crate::topology::SettingsError) -> EngineError {
        EngineError::Settings(e)
    }
}

impl Engine {
    /// An engine for `options`, starting at `now`: monitors start at once (none in load-balanced
    /// mode, LB-3).
    pub fn new(mut options: EngineOptions, now: Instant) -> Result<Engine, EngineError> {
        options.handshake.load_balanced = options.topology.load_balanced;
        let topology = Topology::new(options.topology.clone(), now)?;
        // Built and encoded once here, so that opening a socket cannot fail later.
        let handshake = options
            .handshake
            .command()
            .map_err(EngineError::Handshake)?;
        Connection::new(
            ConnectionConfig::new(ServerAddress::new("localhost", 27017)),
            handshake.clone(),
            now,
        )
        .map_err(EngineError::HandshakeEncoding)?;
        let rng = EngineRng::from_seed_u64(options.seed);
        let mut engine = Engine {
            options,
            topology,
            monitors: BTreeMap::new(),
            sockets: BTreeMap::new(),
            ops: BTreeMap::new(),
            cursors: BTreeMap::new(),
            next_cursor: 1,
            sessions: BTreeMap::new(),
            rng,
            next_conn: 1,
            next_op: 1,
            handshake,
            connects: VecDeque::new(),
            transmits: VecDeque::new(),
            closes: VecDeque::new(),
            events: VecDeque::new(),
            closed: false,
        };
        engine.process(now);
        Ok(engine)
    }

    /// The current topology description.
    pub fn topology(&self) -> &crate::topology::TopologyDescription {
        self.topology.description()
    }

    /// Starts an operation; its result comes as [`EngineEvent::OperationFinished`]. After
    /// [`Engine::close`] it finishes at once with [`crate::error::ErrorKind::Cancelled`].
    pub fn start_operation(&mut self, request: OperationRequest, now: Instant) -> OpId {
        let op = OpId(self.next_op);
        self.next_op += 1;
        if self.closed {
            self.events.push_back(EngineEvent::OperationFinished {
                op,
                result: Err(OperationError::cancelled()),
            });
            return op;
        }
        let spec = OperationSpec {
            kind: request.kind,
            timeout: request.timeout,
            txn_number: request.txn_number,
            min_wire_version: 0,
        };
        let machine = RetryMachine::new(spec, &self.options.retry, self.rng.next_u64(), now);
        let (mut pinned_server, mut pinned_conn) = (None, None);
        if let CursorUse::GetMore(handle) | CursorUse::Close(handle) = request.cursor {
            let Some(cursor) = self.cursors.get_mut(&handle) else {
                let error =
                    OperationError::usage(alloc::format!("cursor {} is not open", handle.0));
                self.events.push_back(EngineEvent::OperationFinished {
                    op,
                    result: Err(error),
                });
                return op;
            };
            if let (CursorUse::Close(_), Some(conn)) = (request.cursor, cursor.conn) {
                if let CursorClose::ReleaseBroken(_) = cursor.pin.close() {
                    // LB-11: after a network error, no killCursors; the connection goes back and is
                    // closed.
                    self.cursors.remove(&handle);
                    self.release(conn, false, now);
                    self.events.push_back(EngineEvent::OperationFinished {
                        op,
                        result: Ok(Document::new()),
                    });
                    self.process(now);
                    return op;
                }
            }
            pinned_server = Some(cursor.server.clone());
            pinned_conn = cursor.conn;
        }
        if let Some(session) = request.session {
            let (server, conn) = self.session_route(session, request.kind, now);
            pinned_server = pinned_server.or(server);
            pinned_conn = pinned_conn.or(conn);
        }
        self.ops.insert(
            op,
            Operation {
                machine,
                request,
                selection: None,
                wake: None,
                server: None,
                attempt: None,
                checkout: None,
                conn: None,
                reply: None,
                pinned_server,
                pinned_conn,
                release_pinned: false,
                keep_conn: false,
                opened: None,
            },
        );
        self.process(now);
        op
    }

    /// Gives up on `op`: it finishes with [`crate::error::ErrorKind::Cancelled`], an attempt in
    /// flight is failed and its connection closed, and a pending checkout is withdrawn. Unknown or
    /// finished operations are ignored.
    pub fn cancel_operation(&mut self, op: OpId, now: Instant) {
        let Some(operation) = self.ops.get_mut(&op) else {
            return;
        };
        if let Some((address, checkout)) = operation.checkout.take() {
            if let Some(pool) = self.topology.pool_mut(&address) {
                pool.cancel_checkout(checkout, now);
            }
        }
        if let Some(operation) = self.ops.get_mut(&op) {
            operation.selection = None;
            operation.wake = None;
            let _ = operation.machine.cancel(now);
        }
        self.process(now);
    }

    /// Closes the client: every unfinished operation finishes exactly once with
    /// [`crate::error::ErrorKind::Cancelled`] (an attempt in flight is failed and its connection
    /// closed), cursors and sessions let their connections go, every pool closes (CMAP
    /// `PoolClosed`), every monitor stops, every socket is closed (`poll_close`), and the topology
    /// publishes its closing SDAM events (`ServerClosed` per server, the change to an empty
    /// description, `TopologyClosed`). Afterwards inputs change nothing and
    /// [`Engine::start_operation`] finishes at once with the same error. Closing twice does
    /// nothing.
    pub fn close(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        self.closed = true;
        let ops: Vec<OpId> = self.ops.keys().copied().collect();
        for op in ops {
            self.cancel_operation(op, now);
        }
        debug_assert!(self.ops.is_empty(), "every operation finished on close");
        let sessions: Vec<SessionId> = self.sessions.keys().copied().collect();
        for session in sessions {
            self.unpin_connection(session, true, now);
        }
        self.sessions.clear();
        let cursors: Vec<ConnId> = self.cursors.values().filter_map(|c| c.conn).collect();
        for conn in cursors {
            self.release(conn, true, now);
        }
        self.cursors.clear();
        self.topology.close(now);
        self.process(now);
        self.monitors.clear();
        let sockets: Vec<ConnId> = self.sockets.keys().copied().collect();
        for conn in sockets {
            self.close_socket(conn);
        }
    }

    /// The socket `conn` asked for by [`Engine::poll_connect`] is open.
    pub fn handle_connected(&mut self, conn: ConnId, now: Instant) {
        if let Some(socket) = self.sockets.get_mut(&conn) {
            socket.machine.handle_connected(now);
        }
        self.process(now);
    }

    /// Bytes arrived on `conn`.
    pub fn handle_bytes(&mut self, conn: ConnId, bytes: &[u8], now: Instant) {
        if let Some(socket) = self.sockets.get_mut(&conn) {
            socket.machine.handle_bytes(bytes, now);
        }
        self.process(now);
    }

    /// `conn` closed, or could not be opened, with `kind`.
    pub fn handle_closed(&mut self, conn: ConnId, kind: NetworkErrorKind, now: Instant) {
        if let Some(socket) = self.sockets.get_mut(&conn) {
            socket.machine.handle_closed(kind, now);
        }
        self.process(now);
    }

    /// Time has passed: fires every timer that is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        for socket in self.sockets.values_mut() {
            socket.machine.handle_timeout(now);
        }
        for state in self.monitors.values_mut() {
            state.monitor.handle_timeout(now);
        }
        for pool in self.topology.pools_mut() {
            pool.handle_timeout(now);
        }
        for op in self.ops.values_mut() {
            op.machine.handle_timeout(now);
        }
        self.process(now);
    }

    /// The next socket to open.
    #[must_use]
    pub fn poll_connect(&mut self) -> Option<Connect> {
        self.connects.pop_front()
    }

    /// Appends the next pending bytes of one socket to `buf` and returns that socket; `None` when
    /// nothing is waiting. The caller clears (and reuses) `buf` between calls; bytes for one socket
    /// come out in the order they must be written.
    #[must_use]
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<ConnId> {
        while let Some(conn) = self.transmits.pop_front() {
            if let Some(socket) = self.sockets.get_mut(&conn) {
                socket.transmit_queued = false;
                if socket.machine.poll_transmit(buf) {
                    return Some(conn);
                }
            }
        }
        None
    }

    /// The next socket to close.
    #[must_use]
    pub fn poll_close(&mut self) -> Option<ConnId> {
        self.closes.pop_front()
    }

    /// The next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<EngineEvent> {
        self.events.pop_front()
    }

    /// The earliest instant at which [`Engine::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let sockets = self
            .sockets
            .values()
            .filter_map(|s| s.machine.poll_timeout());
        let monitors = self
            .monitors
            .values()
            .filter_map(|m| m.monitor.poll_timeout());
        let pools = self.topology.pools().filter_map(|p| p.poll_timeout());
        let ops = self
            .ops
            .values()
            .flat_map(|o| o.machine.poll_timeout().into_iter().chain(o.wake));
        sockets.chain(monitors).chain(pools).chain(ops).min()
    }

    /// Runs every machine until none has anything left to do.
    fn process(&mut self, now: Instant) {
        for _ in 0..10_000 {
            let mut progressed = self.drain_topology(now);
            progressed |= self.drain_monitors(now);
            progressed |= self.drain_pools(now);
            progressed |= self.drain_sockets(now);
            progressed |= self.drain_operations(now);
            if !progressed {
                return;
            }
        }
    }

    fn drain_topology(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        let mut changed = false;
        while let Some(event) = self.topology.poll_event() {
            changed |= matches!(event, SdamEvent::TopologyDescriptionChanged { .. });
            self.events.push_back(EngineEvent::Topology(event));
            progressed = true;
        }
        while let Some(action) = self.topology.poll_action() {
            progressed = true;
            match action {
                TopologyAction::StartMonitoring(address) => {
                    let monitor =
                        Monitor::new(address.clone(), self.options.heartbeat_frequency, now);
                    self.monitors.insert(
                        address,
                        MonitorState {
                            monitor,
                            conn: None,
                        },
                    );
                }
                TopologyAction::StopMonitoring { address, .. } => {
                    // The server left the topology: its monitor stops and its (closed) pool's
                    // sockets go.
                    self.monitors.remove(&address);
                    let gone: Vec<ConnId> = self
                        .sockets
                        .iter()
                        .filter(|(_, s)| s.address == address)
                        .map(|(id, _)| *id)
                        .collect();
                    for conn in gone {
                        self.close_socket(conn);
                    }
                }
                TopologyAction::CheckNow(address) => {
                    if let Some(state) = self.monitors.get_mut(&address) {
                        state.monitor.request_immediate_check(now);
                    }
                }
                TopologyAction::CancelCheck(address) => {
                    if let Some(conn) = self.monitors.get_mut(&address).and_then(|s| s.conn.take())
                    {
                        self.close_socket(conn);
                    }
                }
            }
        }
        if changed {
            // A new description: every waiting selection looks again (SS-16).
            for op in self.ops.values_mut() {
                if op.selection.is_some() {
                    op.wake = Some(now);
                }
            }
        }
        progressed
    }

    fn drain_monitors(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        let addresses: Vec<ServerAddress> = self.monitors.keys().cloned().collect();
        for address in addresses {
            while let Some(state) = self.monitors.get_mut(&address) {
                if let Some(event) = state.monitor.poll_event() {
                    self.events.push_back(EngineEvent::Heartbeat {
                        address: address.clone(),
                        event,
                    });
                    progressed = true;
                    continue;
                }
                let Some(MonitorAction::Check) = state.monitor.poll_action() else {
                    break;
                };
                progressed = true;
                let ready = state
                    .conn
                    .and_then(|c| self.sockets.get(&c))
                    .is_some_and(|s| s.machine.handshake().is_some());
                match (state.conn, ready) {
                    (Some(conn), true) => self.send_monitoring_hello(conn, now),
                    (Some(_), false) => {}
                    (None, _) => {
                        let conn = self.open_socket(address.clone(), Owner::Monitor, 0, now);
                        if let Some(state) = self.monitors.get_mut(&address) {
                            state.conn = conn;
                        }
                    }
                }
            }
        }
        progressed
    }

    /// HS-3: checks after the handshake use `hello` (or legacy hello when the server did not say
    /// `helloOk`), without the handshake's arguments.
    fn send_monitoring_hello(&mut self, conn: ConnId, now: Instant) {
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        let hello = socket.machine.handshake().is_some_and(|h| h.hello_ok)
            || self.options.handshake.uses_hello();
        let command = if hello {
            doc! { "hello": 1, "$db": "admin" }
        } else {
            doc! { "isMaster": 1, "$db": "admin" }
        };
        if socket
            .machine
            .send_command(Request::new(command), now)
            .is_err()
        {
            let address = socket.address.clone();
            self.monitor_check_failed(
                &address,
                &OperationError::network(
                    NetworkErrorKind::Io,
                    NetworkPhase::BeforeSend,
                    address.clone(),
                ),
                now,
            );
        }
    }

    fn monitor_check_failed(
        &mut self,
        address: &ServerAddress,
        error: &OperationError,
        now: Instant,
    ) {
        let Some(state) = self.monitors.get_mut(address) else {
            return;
        };
        if let Some(conn) = state.conn.take() {
            self.close_socket(conn);
        }
        let Some(state) = self.monitors.get_mut(address) else {
            return;
        };
        if state.monitor.handle_check_failed(error, now) {
            self.topology.handle_check_failed(address, error, now);
        }
    }

    fn drain_pools(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        let mut work: Vec<(ServerAddress, PoolAction)> = Vec::new();
        for pool in self.topology.pools_mut() {
            while let Some(event) = pool.poll_event() {
                self.events.push_back(EngineEvent::Pool {
                    address: pool.address().clone(),
                    event,
                });
                progressed = true;
            }
            while let Some(action) = pool.poll_action() {
                work.push((pool.address().clone(), action));
            }
        }
        progressed |= !work.is_empty();
        for (address, action) in work {
            match action {
                PoolAction::Establish { connection } => {
                    let generation = self.topology.pool(&address).map_or(0, |p| p.generation());
                    let _ = self.open_socket(address, Owner::Pool(connection), generation, now);
                }
                PoolAction::Close { connection, .. } => {
                    if let Some(conn) = self.find_socket(&address, &Owner::Pool(connection)) {
                        self.close_socket(conn);
                    }
                }
                PoolAction::CheckedOut {
                    checkout,
                    connection,
                } => {
                    let conn = self.find_socket(&address, &Owner::Pool(connection));
                    match (self.op_with_checkout(&address, checkout), conn) {
                        (Some(op_id), Some(conn)) => self.send_attempt(op_id, conn, now),
                        // Its operation is gone (cancelled): the connection goes straight back.
                        (None, _) => {
                            if let Some(pool) = self.topology.pool_mut(&address) {
                                pool.check_in(connection, true, now);
                            }
                        }
                        (Some(_), None) => {}
                    }
                }
                PoolAction::CheckoutFailed { checkout, error } => {
                    if let Some(op_id) = self.op_with_checkout(&address, checkout) {
                        if let Some(op) = self.ops.get_mut(&op_id) {
                            op.checkout = None;
                        }
                        self.fail_attempt(op_id, error.into_operation_error(&address), false, now);
                    }
                }
            }
        }
        progressed
    }

    fn drain_sockets(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        let ids: Vec<ConnId> = self.sockets.keys().copied().collect();
        for conn in ids {
            while let Some(socket) = self.sockets.get_mut(&conn) {
                if !socket.transmit_queued && socket.machine.has_transmit() {
                    socket.transmit_queued = true;
                    self.transmits.push_back(conn);
                    progressed = true;
                    continue;
                }
                let Some(event) = socket.machine.poll_event() else {
                    break;
                };
                progressed = true;
                let (address, owner, op) =
                    (socket.address.clone(), socket.owner.clone(), socket.op);
                let handshaken = socket.machine.handshake().is_some();
                match event {
                    ConnectionEvent::HandshakeComplete { reply, .. } => {
                        self.handshake_complete(conn, &address, &owner, &reply, now)
                    }
                    ConnectionEvent::Reply { reply, .. } => match (&owner, op) {
                        (Owner::Monitor, _) => {
                            if let Some(state) = self.monitors.get_mut(&address) {
                                if let Some(rtt) =
                                    state.monitor.handle_check_succeeded(&reply.body, now)
                                {
                                    self.topology.handle_hello(&address, &reply.body, rtt, now);
                                } else {
                                    self.topology.handle_hello(
                                        &address,
                                        &reply.body,
                                        Duration::ZERO,
                                        now,
                                    );
                                }
                            }
                        }
                        (Owner::Pool(_), Some(op_id)) => {
                            self.attempt_replied(op_id, conn, &address, reply.body, now)
                        }
                        (Owner::Pool(_), None) => {}
                    },
                    ConnectionEvent::Failed(failure) => {
                        let error = failure.to_operation_error(&address);
                        self.sockets.remove(&conn);
                        self.closes.push_back(conn);
                        match owner {
                            Owner::Monitor => self.monitor_check_failed(&address, &error, now),
                            Owner::Pool(id) => {
                                let context =
                                    error_context(&self.topology, &address, id, handshaken);
                                match op {
                                    Some(op_id) => {
                                        self.topology.handle_application_error(
                                            &address, &error, context, now,
                                        );
                                        // LB-11: the cursor stays pinned, but will send no killCursors.
                                        let cursor = self.ops.get(&op_id).map(|o| o.request.cursor);
                                        if let Some(CursorUse::GetMore(handle)) = cursor {
                                            if let Some(cursor) = self.cursors.get_mut(&handle) {
                                                cursor.pin.get_more_failed(&error);
                                            }
                                        }
                                        if let Some(op) = self.ops.get_mut(&op_id) {
                                            op.conn = None;
                                        }
                                        self.fail_attempt(op_id, error, false, now);
                                        if let Some(pool) = self.topology.pool_mut(&address) {
                                            pool.check_in(id, false, now);
                                        }
                                    }
                                    // An established connection no operation was using (idle, or
                                    // pinned between operations) died: no SDAM error handling, as
                                    // no operation saw it; the pool frees its slot, and a cursor
                                    // pinned to it will send no killCursors (LB-11).
                                    None if handshaken => {
                                        for cursor in self
                                            .cursors
                                            .values_mut()
                                            .filter(|c| c.conn == Some(conn))
                                        {
                                            cursor.pin.get_more_failed(&error);
                                        }
                                        if let Some(pool) = self.topology.pool_mut(&address) {
                                            pool.handle_connection_lost(id, now);
                                        }
                                    }
                                    // The handshake failed: SDAM error handling (HS-9), and the
                                    // checkout that wanted the connection fails.
                                    None => {
                                        self.topology.handle_application_error(
                                            &address, &error, context, now,
                                        );
                                        if let Some(pool) = self.topology.pool_mut(&address) {
                                            pool.handle_establish_failed(id, error, now);
                                        }
                                    }
                                }
                            }
                        }
                        break;
                    }
                }
            }
        }
        progressed
    }

    fn handshake_complete(
        &mut self,
        conn: ConnId,
        address: &ServerAddress,
        owner: &Owner,
        reply: &HandshakeReply,
        now: Instant,
    ) {
        match owner {
            Owner::Monitor => self.send_monitoring_hello(conn, now),
            Owner::Pool(id) => {
                if let Some(pool) = self.topology.pool_mut(address) {
                    pool.handle_established(*id, reply.service_id, now);
                }
            }
        }
    }

    fn drain_operations(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        let ids: Vec<OpId> = self.ops.keys().copied().collect();
        for op_id in ids {
            // A waiting selection that is due looks again.
            if self
                .ops
                .get(&op_id)
                .is_some_and(|o| o.wake.is_some_and(|w| now >= w))
            {
                progressed = true;
                self.poll_selection(op_id, now);
            }
            while let Some(op) = self.ops.get_mut(&op_id) {
                if let Some(event) = op.machine.poll_event() {
                    self.events
                        .push_back(EngineEvent::Operation { op: op_id, event });
                    progressed = true;
                    continue;
                }
                let Some(action) = op.machine.poll_action() else {
                    break;
                };
                progressed = true;
                match action {
                    Action::SelectServer if op.pinned_server.is_some() => {
                        // A cursor's operations go where the cursor lives.
                        if let Some(server) = op.pinned_server.clone() {
                            op.server = Some(server.clone());
                            let _ = op.machine.handle_server_selected(server, now);
                        }
                    }
                    Action::SelectServer => {
                        let selection = ServerSelection::new(
                            op.request.criteria.clone(),
                            op.machine.deprioritized(),
                            self.options.selection,
                            op.request.timeout,
                            now,
                        );
                        op.selection = Some(selection);
                        self.poll_selection(op_id, now);
                    }
                    Action::Dispatch(attempt) if op.pinned_conn.is_some() => {
                        op.attempt = Some(attempt);
                        match op.pinned_conn.filter(|c| self.sockets.contains_key(c)) {
                            Some(conn) => self.send_attempt(op_id, conn, now),
                            None => {
                                let address = op
                                    .server
                                    .as_ref()
                                    .map(|s| s.address.clone())
                                    .unwrap_or_else(|| ServerAddress::new("unknown", 0));
                                let error = OperationError::network(
                                    NetworkErrorKind::Closed,
                                    NetworkPhase::BeforeSend,
                                    address,
                                );
                                self.fail_attempt(op_id, error, false, now);
                            }
                        }
                    }
                    Action::Dispatch(attempt) => {
                        let deadline = op.request.timeout.deadline();
                        let address = attempt.address.clone();
                        op.attempt = Some(attempt);
                        // LB-13: a cursor-creating command's connection may stay with its cursor.
                        let purpose = if op.request.cursor == CursorUse::Open
                            && self.options.topology.load_balanced
                        {
                            Purpose::Cursor
                        } else {
                            Purpose::Other
                        };
                        let checkout = self
                            .topology
                            .pool_mut(&address)
                            .map(|p| p.check_out(purpose, deadline, now));
                        let Some(op) = self.ops.get_mut(&op_id) else {
                            break;
                        };
                        match checkout {
                            Some(id) => op.checkout = Some((address, id)),
                            None => {
                                let error = OperationError::server_selection(alloc::format!(
                                    "{address} is no longer part of the topology"
                                ));
                                self.fail_attempt(op_id, error, false, now);
                            }
                        }
                    }
                    Action::ReleaseConnection { close } => {
                        op.checkout = None;
                        op.attempt = None;
                        let conn = op.conn.take();
                        // A pinned connection goes back only when this operation ended its pin;
                        // one this operation's cursor or transaction now owns stays checked out
                        // (LB-10, TX-5); any other goes back (BP-27).
                        let release = match op.pinned_conn {
                            Some(pinned) => op.release_pinned.then_some(pinned),
                            None => conn.filter(|_| !op.keep_conn),
                        };
                        if let Some(conn) = release {
                            self.release(conn, !close, now);
                        }
                    }
                    Action::Wait { .. } => {}
                    Action::Finished(result) => {
                        let reply = op.reply.take();
                        // LB-10: closing a cursor gives its connection back whatever killCursors did.
                        if let (CursorUse::Close(handle), false) =
                            (op.request.cursor, op.release_pinned)
                        {
                            if let Some(conn) = self.cursors.remove(&handle).and_then(|c| c.conn) {
                                self.release(conn, true, now);
                            }
                        }
                        let Some(op) = self.ops.get_mut(&op_id) else {
                            break;
                        };
                        if let Some(cursor) = op.opened.filter(|_| result.is_ok()) {
                            self.events
                                .push_back(EngineEvent::CursorOpened { op: op_id, cursor });
                        }
                        self.ops.remove(&op_id);
                        let result = result.map(|()| reply.unwrap_or_default());
                        self.events
                            .push_back(EngineEvent::OperationFinished { op: op_id, result });
                        break;
                    }
                }
            }
        }
        progressed
    }

    /// Runs one pass of an operation's selection loop.
    fn poll_selection(&mut self, op_id: OpId, now: Instant) {
        let in_flight = self.in_flight_counts();
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        op.wake = None;
        let Some(selection) = op.selection.as_mut() else {
            return;
        };
        let count = |address: &ServerAddress| in_flight.get(address).copied().unwrap_or(0);
        match selection.poll(self.topology.description(), count, &mut self.rng, now) {
            SelectionStep::Selected(server) => {
                let attempt_server = AttemptServer::from_description(
                    server,
                    self.topology.description().topology_type,
                );
                op.selection = None;
                op.server = Some(attempt_server.clone());
                let _ = op.machine.handle_server_selected(attempt_server, now);
            }
            SelectionStep::Wait { until, .. } => {
                op.wake = Some(until);
                let addresses: Vec<ServerAddress> = self.monitors.keys().cloned().collect();
                for address in addresses {
                    if let Some(state) = self.monitors.get_mut(&address) {
                        state.monitor.request_immediate_check(now);
                    }
                }
            }
            SelectionStep::Failed(error) => {
                op.selection = None;
                let error = OperationError::server_selection(error.to_string());
                self.fail_attempt(op_id, error, true, now);
            }
        }
    }

    /// SS-15: operations in flight per server, for the power-of-two choice.
    fn in_flight_counts(&self) -> BTreeMap<ServerAddress, u32> {
        let mut counts = BTreeMap::new();
        for op in self.ops.values() {
            if let (Some(server), true) = (&op.server, op.attempt.is_some()) {
                *counts.entry(server.address.clone()).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Writes the attempt's command on its checked-out connection.
    fn send_attempt(&mut self, op_id: OpId, conn: ConnId, now: Instant) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        op.checkout = None;
        op.conn = Some(conn);
        let Some(attempt) = op.attempt.clone() else {
            return;
        };
        let body = command_for(&op.request, &attempt);
        let mut request = Request::new(body);
        request.deadline = op.request.timeout.deadline();
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        socket.op = Some(op_id);
        match socket.machine.send_command(request, now) {
            Ok(_) => {
                let _ = op.machine.handle_sent(now);
            }
            Err(e) => {
                socket.op = None;
                let address = socket.address.clone();
                let kind = match e {
                    crate::connection::SendError::DeadlinePassed => NetworkErrorKind::Timeout,
                    _ => NetworkErrorKind::Io,
                };
                let error = OperationError::network(kind, NetworkPhase::BeforeSend, address);
                self.fail_attempt(op_id, error, false, now);
            }
        }
    }

    fn attempt_replied(
        &mut self,
        op_id: OpId,
        conn: ConnId,
        address: &ServerAddress,
        body: Document,
        now: Instant,
    ) {
        if let Some(socket) = self.sockets.get_mut(&conn) {
            socket.op = None;
        }
        let error = OperationError::from_reply(&body, address);
        if let Some(error) = &error {
            if let Some(Owner::Pool(id)) = self.sockets.get(&conn).map(|s| s.owner.clone()) {
                let context = error_context(&self.topology, address, id, true);
                self.topology
                    .handle_application_error(address, error, context, now);
            }
        }
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        match error {
            Some(error) => self.fail_attempt(op_id, error, false, now),
            None => {
                let cursor_id = body
                    .get_document("cursor")
                    .ok()
                    .and_then(|c| match c.get("id") {
                        Some(Bson::Int64(id)) => Some(*id),
                        Some(Bson::Int32(id)) => Some(i64::from(*id)),
                        _ => None,
                    });
                op.reply = Some(body);
                let _ = op.machine.handle_succeeded(now);
                self.cursor_replied(op_id, conn, cursor_id.unwrap_or(0));
                self.transaction_succeeded(op_id, conn);
            }
        }
    }

    /// Where a session's operation of `kind` must go (TX-3, TX-5), after the TX-4 unpinning rules
    /// that apply before selection: a new transaction (4) and a non-transaction operation (5)
    /// unpin; the later commands of a transaction follow the pin.
    fn session_route(
        &mut self,
        session: SessionId,
        kind: OperationKind,
        now: Instant,
    ) -> (Option<AttemptServer>, Option<ConnId>) {
        let state = self.sessions.entry(session).or_default();
        let unpinned = match kind {
            OperationKind::InTransaction { first: true, .. } => state.pin.start_transaction(),
            OperationKind::InTransaction { first: false, .. }
            | OperationKind::CommitTransaction { .. }
            | OperationKind::AbortTransaction => None,
            _ => state.pin.non_transaction_operation(),
        };
        if unpinned.is_some() {
            self.unpin_connection(session, true, now);
            return (None, None);
        }
        let Some(state) = self.sessions.get(&session) else {
            return (None, None);
        };
        let (address, conn) = match state.pin.pinned() {
            Some(Pin::Mongos(address)) => (Some(address.clone()), None),
            Some(Pin::Connection(_)) => {
                let socket = state.conn.and_then(|c| self.sockets.get(&c));
                (socket.map(|s| s.address.clone()), state.conn)
            }
            None => return (None, None),
        };
        let topology = self.topology.description();
        let server = address
            .and_then(|a| topology.server(&a))
            .map(|d| AttemptServer::from_description(d, topology.topology_type));
        (server, conn)
    }

    /// Gives a session's pinned load-balanced connection back to its pool, if it has one.
    fn unpin_connection(&mut self, session: SessionId, healthy: bool, now: Instant) {
        if let Some(conn) = self.sessions.get_mut(&session).and_then(|s| s.conn.take()) {
            self.release(conn, healthy, now);
        }
    }

    /// The session ended (TX-4 (6)): its pin goes, and a pinned connection goes back to the pool.
    pub fn end_session(&mut self, session: SessionId, now: Instant) {
        if let Some(state) = self.sessions.get_mut(&session) {
            let _ = state.pin.end_session();
        }
        self.unpin_connection(session, true, now);
        self.sessions.remove(&session);
        self.process(now);
    }

    /// The transaction command an operation is, if it is one.
    fn transaction_command(kind: OperationKind) -> Option<TransactionCommand> {
        match kind {
            OperationKind::InTransaction { .. } => Some(TransactionCommand::Statement),
            OperationKind::CommitTransaction { .. } => Some(TransactionCommand::Commit),
            OperationKind::AbortTransaction => Some(TransactionCommand::Abort),
            _ => None,
        }
    }

    /// Hands a failure to the operation's retry machine, after the transaction rules: the driver's
    /// TX-7/TX-8 labels, and TX-4 (1–3) unpinning before a retry selects a server.
    fn fail_attempt(&mut self, op_id: OpId, error: OperationError, selection: bool, now: Instant) {
        let Some(op) = self.ops.get(&op_id) else {
            return;
        };
        let (kind, session) = (op.request.kind, op.request.session);
        let mut error = error;
        if let (Some(command), Some(session)) = (Engine::transaction_command(kind), session) {
            error = error
                .clone()
                .with_labels(transaction_labels(&error, command));
            let unpinned = self
                .sessions
                .get_mut(&session)
                .and_then(|s| s.pin.command_failed(command, &error));
            if unpinned.is_some() {
                let healthy = !matches!(error.kind, crate::error::ErrorKind::Network(_));
                self.unpin_connection(session, healthy, now);
                if let Some(op) = self.ops.get_mut(&op_id) {
                    op.pinned_server = None;
                    op.pinned_conn = None;
                }
            }
        }
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        let _ = if selection {
            op.machine.handle_selection_failed(error, now)
        } else {
            op.machine.handle_failed(error, now)
        };
    }

    /// TX-3, TX-5: a transaction's first command pins its session to the mongos it ran on, or in
    /// load-balanced mode to its connection; abort unpins whatever happened (TX-4 (1)).
    fn transaction_succeeded(&mut self, op_id: OpId, conn: ConnId) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        let Some(session) = op.request.session else {
            return;
        };
        match op.request.kind {
            OperationKind::InTransaction { first: true, .. } => {
                let load_balanced = self.options.topology.load_balanced;
                let pool_id = match self.sockets.get(&conn).map(|s| &s.owner) {
                    Some(Owner::Pool(id)) => *id,
                    _ => return,
                };
                let state = self.sessions.entry(session).or_default();
                if load_balanced {
                    op.keep_conn = true;
                    state.conn = Some(conn);
                    state.pin.pin(Pin::Connection(pool_id));
                } else if let Some(server) =
                    op.server.as_ref().filter(|s| s.topology_type.is_sharded())
                {
                    state.pin.pin(Pin::Mongos(server.address.clone()));
                }
            }
            OperationKind::AbortTransaction => {
                if let Some(state) = self.sessions.get_mut(&session) {
                    let _ = state.pin.aborted();
                }
                // The abort's own release checks the connection in.
                op.release_pinned = true;
                if let Some(state) = self.sessions.get_mut(&session) {
                    state.conn = None;
                }
            }
            _ => {}
        }
    }

    /// LB-10: a cursor operation succeeded with `cursor_id`: open, keep or end the cursor.
    fn cursor_replied(&mut self, op_id: OpId, conn: ConnId, cursor_id: i64) {
        let load_balanced = self.options.topology.load_balanced;
        let pool_id = match self.sockets.get(&conn).map(|s| &s.owner) {
            Some(Owner::Pool(id)) => *id,
            _ => return,
        };
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        match op.request.cursor {
            CursorUse::None => {}
            CursorUse::Open => {
                let Some(server) = op.server.clone() else {
                    return;
                };
                if cursor_id == 0 {
                    return;
                }
                let mut pin = CursorPin::new();
                let conn = load_balanced.then(|| {
                    pin.created(pool_id, cursor_id);
                    op.keep_conn = true;
                    conn
                });
                let handle = CursorHandle(self.next_cursor);
                self.next_cursor += 1;
                op.opened = Some(handle);
                self.cursors.insert(handle, Cursor { server, conn, pin });
            }
            CursorUse::GetMore(handle) => {
                if cursor_id == 0 {
                    op.release_pinned = true;
                    if let Some(mut cursor) = self.cursors.remove(&handle) {
                        let _ = cursor.pin.get_more_succeeded(0);
                    }
                }
            }
            CursorUse::Close(handle) => {
                op.release_pinned = true;
                self.cursors.remove(&handle);
            }
        }
    }

    /// Checks a connection back in (BP-27: before any backoff), or closes it.
    fn release(&mut self, conn: ConnId, healthy: bool, now: Instant) {
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        socket.op = None;
        let (address, owner) = (socket.address.clone(), socket.owner.clone());
        if let (Owner::Pool(id), Some(pool)) = (owner, self.topology.pool_mut(&address)) {
            pool.check_in(id, healthy, now);
        }
    }

    fn op_with_checkout(&self, address: &ServerAddress, checkout: CheckoutId) -> Option<OpId> {
        self.ops
            .iter()
            .find(|(_, o)| {
                o.checkout
                    .as_ref()
                    .is_some_and(|(a, c)| a == address && *c == checkout)
            })
            .map(|(id, _)| *id)
    }

    fn find_socket(&self, address: &ServerAddress, owner: &Owner) -> Option<ConnId> {
        self.sockets
            .iter()
            .find(|(_, s)| &s.address == address && &s.owner == owner)
            .map(|(id, _)| *id)
    }

    fn open_socket(
        &mut self,
        address: ServerAddress,
        owner: Owner,
        generation: u32,
        now: Instant,
    ) -> Option<ConnId> {
        let mut config = ConnectionConfig::new(address.clone());
        config.generation = generation;
        config.connect_timeout = self.options.connect_timeout;
        config.socket_timeout = self.options.socket_timeout;
        config.load_balanced = self.options.topology.load_balanced;
        let machine = Connection::new(config, self.handshake.clone(), now).ok()?;
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        self.sockets.insert(
            conn,
            Socket {
                address: address.clone(),
                owner,
                machine,
                op: None,
                transmit_queued: false,
            },
        );
        self.connects.push_back(Connect { conn, address });
        Some(conn)
    }

    fn close_socket(&mut self, conn: ConnId) {
        if self.sockets.remove(&conn).is_some() {
            self.closes.push_back(conn);
        }
    }
}

/// What SDAM error handling needs to know about the pooled connection an error happened on: its
/// generation and service (CM-1, CM-5) and whether its handshake had completed (HS-9, LB-14).
fn error_context(
    topology: &Topology,
    address: &ServerAddress,
    id: ConnectionId,
    handshake_completed: bool,
) -> ErrorContext {
    let (generation, service_id) = topology
        .pool(address)
        .and_then(|p| p.connection_generation(id))
        .unwrap_or((0, None));
    ErrorContext {
        generation,
        service_id,
        handshake_completed,
    }
}

/// The command of one attempt: the operation's command with `$db` and the attempt's
/// modifications (RW-6, RW-7, TX-1, TX-11, TX-12).
fn command_for(request: &OperationRequest, attempt: &Attempt) -> Document {
    let mut body = request.command.clone();
    if let Some(n) = attempt.txn_number {
        body.insert("txnNumber", Bson::Int64(n));
    }
    if attempt.start_transaction {
        body.insert("startTransaction", true);
    }
    if attempt.write_concern == WriteConcernRule::Majority {
        let mut wc = match body.get("writeConcern") {
            Some(Bson::Document(d)) => d.clone(),
            _ => Document::new(),
        };
        wc.insert("w", "majority");
        if !wc.contains_key("wtimeout") {
            wc.insert(
                "wtimeout",
                Bson::Int64(COMMIT_RETRY_WTIMEOUT.as_millis() as i64),
            );
        }
        body.insert("writeConcern", wc);
    }
    body.insert("$db", request.db.clone());
    body
}
