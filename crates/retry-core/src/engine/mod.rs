//! The engine: the retry machines, server selection, the SDAM topology with its pools, the server
//! monitors and the connections, composed behind one sans-IO interface for adapters.
//!
//! # Driving it
//!
//! Inputs take `now`: [`Engine::start_operation`], [`Engine::cancel_operation`],
//! [`Engine::handle_connected`], [`Engine::handle_bytes`], [`Engine::handle_closed`],
//! [`Engine::handle_timeout`], [`Engine::start_session`], [`Engine::end_session`] and
//! [`Engine::close`]. Outputs are polled until
//! `None`: [`Engine::poll_connect`] (open a socket), [`Engine::poll_transmit`] (bytes to write,
//! appended to the caller's buffer), [`Engine::poll_close`] (close a socket), [`Engine::poll_event`]
//! (operation results and monitoring events). A `mongodb+srv` client with SRV polling also asks
//! [`Engine::poll_srv_rescan`] and answers with [`Engine::handle_srv_hosts`] (SP-1..SP-6). After any input, drain every `poll_*`, then wait for
//! the earlier of [`Engine::poll_timeout`] and the next input. A spurious `handle_timeout` is
//! harmless. The [crate docs](crate#driving-the-engine) run this loop against a server on a
//! loopback socket.
//!
//! ```text
//! let mut buf = Vec::new();
//! loop {
//!     // Taking transmits can queue more (an unacknowledged write ends there, WP-6): repeat the
//!     // drains until all four are empty.
//!     while let Some(c) = engine.poll_connect()  { open a socket to c.address, then handle_connected(c.conn) }
//!     while let Some(conn) = engine.poll_transmit(&mut buf) { write buf to conn; buf.clear() }
//!     while let Some(c) = engine.poll_close()    { if c.write_out, write out its bytes (bounded); close c.conn }
//!     while let Some(e) = engine.poll_event()    { deliver e }
//!     wait for bytes (handle_bytes), a closed socket (handle_closed) or poll_timeout() (handle_timeout)
//! }
//! ```
//!
//! # Routing
//!
//! An input goes to the one machine it is for. Each machine that has something to do is put once
//! on a first-in, first-out worklist; taking it off, the engine drains its outputs and hands each
//! one straight to its consumer (a pool's `CheckedOut` to the operation that asked for it, a
//! socket's reply to the operation whose command is on it, ...), which is then put on the
//! worklist in turn. Nothing sweeps every machine: an input costs what it touches. Timers are kept
//! in one ordered queue (`worklist`), so `handle_timeout` wakes only the machines that are due and
//! `poll_timeout` reads its head. The same seed and inputs give the same trace, bit for bit.
//!
//! The modules: `operations` (the retry machines, selection, sending and replies), `hedged`
//! (which machine an operation runs, hedged copies and their draining connections), `sockets`
//! (the connection machines), `monitoring` (the topology, its pools and the monitors), `pins`
//! (transaction and cursor pins), `sessions` (server sessions, `txnNumber`, `$clusterTime`,
//! `maxTimeMS` and `endSessions` at close), `commands` (command monitoring events, EV-1..EV-6),
//! `raw_reply` (what the engine reads from a reply left encoded) and `worklist` (the worklist
//! and the timer queue).
//!
//! # Event order
//!
//! Consumers may rely on this order of [`Engine::poll_event`] for one operation (BP-26, BP-27):
//! `CommandStarted` after the pool's `CheckedOut`; then `CommandSucceeded` or `CommandFailed`;
//! then the pool's `CheckedIn` of the attempt's connection (unless a cursor or transaction keeps
//! it); then `RetryScheduled` or `RetryDenied`; the next attempt's events; and last
//! `CursorOpened` (if the operation opened one) and `OperationFinished`, exactly once (for an
//! unacknowledged write, all from the [`Engine::poll_transmit`] that took its bytes). A
//! connection whose socket failed under an attempt is checked in (and closed) as it fails, so its
//! `CheckedIn` comes just before that attempt's `CommandFailed`. Pool events of one pool and SDAM
//! events keep the order their machine produced them in.
//!
//! # The path of one operation
//!
//! `start_operation` creates a [`RetryMachine`] (or, for a read whose command has an A6 hedging
//! policy in [`EngineOptions::service_config`], a [`HedgingMachine`] with one attempt slot per copy:
//! see `engine/hedged.rs` and `docs/hedging.md`). Its `SelectServer` starts a [`ServerSelection`]
//! over the topology, avoiding the machine's deprioritized addresses; a selected server goes back
//! to the machine, whose `Dispatch` checks a connection out of that server's pool. Only then does
//! the operation take a server session (SE-7, SE-8; see [`crate::session`]). The command, with the
//! session's `lsid`, the `txnNumber` the engine allocated (RW-6, the same on every retry, RW-7),
//! `$clusterTime` (SE-17), `maxTimeMS` (CS-4) and what the attempt modifies (`startTransaction`,
//! write concern, `$readPreference`, `$db`), is written on the connection, and the reply (or the connection's failure) goes back to the machine, which
//! releases the connection before it backs off, retries or finishes. Errors also go to the
//! topology's error handling, which may mark the server Unknown and clear its pool.
//!
//! # Unacknowledged writes
//!
//! WP-6, EV-4: an operation whose command has an unacknowledged write concern (`w: 0` without
//! `j: true`) is written with `moreToCome` and awaits no reply. It ends when
//! [`Engine::poll_transmit`] hands the caller the bytes holding its message, the last the engine
//! sees of it: within that call it publishes `CommandSucceeded` with the reply `{ok: 1}` (no
//! `n`), checks the connection in healthy, ready for the next command on the same socket (whose
//! bytes follow on the wire), and finishes with `{ok: 1}`, stamped with the instant the command
//! was written (`poll_transmit` takes no clock). A socket that fails before the bytes were taken
//! drops them: the operation fails once with a network error before sending (never retried: no
//! `txnNumber`, RW-4); one that fails after leaves the result alone. `docs/wire-and-handshake.md`
//! has the details.
//!
//! Every operation ends exactly once: when its server leaves the topology its checkout fails and
//! its connection is closed under it; when a socket cannot be built its checkout fails; after
//! [`Engine::close`] it is cancelled. Each of these failures goes through the retry rules.
//!
//! # Sessions
//!
//! A caller never passes `lsid` or `txnNumber`. An operation without an explicit session gets an
//! implicit one from the engine's [`SessionPool`] after checkout, when the connection's own
//! handshake reply supports sessions and the command may carry one (SE-7, SE-8, SE-13: not for
//! unacknowledged writes); it goes back to the pool when the operation ends, or stays with the
//! cursor the operation opened until the cursor ends (SE-14). A network error makes it dirty: it
//! serves the retries and is then discarded (SE-12). Explicit sessions are
//! [`Engine::start_session`] / [`OperationRequest::session`] / [`Engine::end_session`]; they take
//! their server session the same way, at first use, and an explicit session on a connection
//! without session support fails with [`crate::session::SESSIONS_UNSUPPORTED`]. A session's
//! transaction ([`Engine::start_transaction`]) commits and aborts under the commit or abort
//! request's own [`OperationRequest::timeout`] (a driver gives it the session's
//! `defaultTimeoutMS`, else the client's `timeoutMS`, TO-14); without `timeoutMS` a commit
//! carries `maxCommitTimeMS` as `maxTimeMS` (TO-6). [`Engine::close`]
//! ends the pooled sessions with `endSessions` (SE-15) before it closes the pools.
//!
//! A command holding its own `lsid` or `txnNumber` has them removed at the operation's start: the
//! engine sets the `txnNumber` only where the rules call for one, on retryable writes and
//! transaction commands (RW-2, RW-4, review37 W2).

mod api_version;
mod commands;
mod cursors;
mod encoded;
mod event_families;
mod hedged;
mod id_table;
mod monitoring;
mod operations;
mod pins;
mod raw_reply;
mod refused;
mod request_builders;
mod selection_cache;
mod sessions;
mod slots;
mod sockets;
mod worklist;

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::string::String;
use alloc::vec::Vec;
use bson::{Bson, Document, RawDocumentBuf};
use core::time::Duration;

use crate::address::ServerAddress;
use crate::connection::{Connection, Request, DEFAULT_CONNECT_TIMEOUT};
use crate::error::{NetworkCause, NetworkErrorKind, OperationError};
use crate::handshake::HandshakeOptions;
use crate::hedging::{HedgingEvent, HedgingMachine};
use crate::monitor::{HeartbeatEvent, Monitor, DEFAULT_HEARTBEAT_FREQUENCY};
use crate::pinning::{CursorPin, TransactionPin};
use crate::policy::RetryOptions;
use crate::pool::{CheckoutId, ConnectionId, Pool, PoolEvent};
use crate::retry::{
    Attempt, AttemptServer, OperationKind, RetryEvent, RetryMachine, WriteConcernRule,
    COMMIT_RETRY_WTIMEOUT,
};
use crate::rng::EngineRng;
use crate::selection::{SelectionCriteria, SelectionSettings, ServerSelection};
use crate::service_config::ServiceConfig;
use crate::session::{ClusterClock, ServerSession, SessionPool};
use crate::time::{Instant, OperationTimeout};
use crate::topology::{SdamEvent, Topology, TopologySettings};

use crate::id_table::IdTable;
pub use commands::{CommandEvent, CommandInfo};
pub use event_families::EventFamilies;
use selection_cache::{SelectionCache, TrackedTopology};
use worklist::{Machine, Timers};

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
    /// Server selection settings (`localThresholdMS`, `serverSelectionTimeoutMS`). Their
    /// `heartbeat_frequency` is not read: [`Engine::new`] replaces it with
    /// [`EngineOptions::heartbeat_frequency`].
    pub selection: SelectionSettings,
    /// `heartbeatFrequencyMS`, the one source of truth: the monitors' check interval and,
    /// copied by [`Engine::new`] into [`SelectionSettings::heartbeat_frequency`], the staleness
    /// formulas and the smallest `maxStalenessSeconds` (SS-2, SS-5). Default 10 s.
    pub heartbeat_frequency: Duration,
    /// `connectTimeoutMS` (TO-2): bounds opening a socket and its handshake, default 10 s, zero
    /// for no limit; monitoring connections also use it as their socket timeout (MO-4).
    pub connect_timeout: Duration,
    /// `socketTimeoutMS` (TO-3): bounds each command's round trip on application connections when
    /// the operation has no `timeoutMS` (TO-8); a timeout closes the connection with a network
    /// timeout error, which the retry rules then judge. `None` (the default) or zero for no limit.
    pub socket_timeout: Option<Duration>,
    /// `serverMonitoringMode` (MO-7): whether monitors may stream.
    pub server_monitoring_mode: crate::monitor::ServerMonitoringMode,
    /// The handshake: client metadata, API version, compressors. `load_balanced` is taken from
    /// the topology settings.
    pub handshake: HandshakeOptions,
    /// The seed of the engine's RNG (jitter, the power-of-two choice). [`EngineOptions::new`]
    /// leaves it 0: set it from a per-process random source (the OS), as the adapters do, or
    /// every process draws the same backoff jitter (BP-14) and power-of-two choices (SS-15), and
    /// their retries arrive in step. The engine itself reads
    /// no randomness (house rule 1); a fixed seed is for tests that replay a run (house rule 2).
    pub seed: u64,
    /// AU-2: authenticate every pooled connection after its handshake (monitoring connections
    /// never do); `None` for a server without access control.
    pub auth: Option<crate::auth::AuthOptions>,
    /// Publish [`EngineEvent::Command`] events (EV-1..EV-6). Off by default: each event copies its
    /// command or reply, so turn it on when someone listens (a driver's command listeners, the
    /// unified tests).
    pub command_monitoring: bool,
    /// The optional event families to publish ([`EventFamilies`]); [`EventFamilies::ALL`] by
    /// default. Events that drive operations are always published.
    pub events: EventFamilies,
    /// A gRPC A6 service config: a read whose command has a `hedgingPolicy` runs as hedged copies
    /// ([`crate::hedging`]). `None` (the default): no hedging.
    pub service_config: Option<ServiceConfig>,
    /// SRV polling for mongos discovery, for a client made from a `mongodb+srv` URI (see
    /// [`crate::topology::SrvPoller`]); `None` (the default) for no polling.
    pub srv_polling: Option<crate::topology::SrvPollingOptions>,
}

impl EngineOptions {
    /// Options with the defaults for everything but the topology and the handshake.
    ///
    /// The [`seed`](EngineOptions::seed) defaults to 0 and must be replaced by one from a
    /// per-process random source, or every client made this way jitters its backoffs alike
    /// (BP-14) and their retries arrive together. With std, for example:
    ///
    /// ```
    /// # use retry_core::address::ServerAddress;
    /// # use retry_core::engine::EngineOptions;
    /// # use retry_core::handshake::HandshakeOptions;
    /// # use retry_core::topology::TopologySettings;
    /// use std::hash::BuildHasher;
    ///
    /// let seeds = vec![ServerAddress::new("db0.example.com", 27017)];
    /// let mut options = EngineOptions::new(TopologySettings::new(seeds), HandshakeOptions::new());
    /// // std keys each RandomState from the OS's randomness.
    /// options.seed = std::collections::hash_map::RandomState::new().hash_one("retry-core");
    /// ```
    pub fn new(topology: TopologySettings, handshake: HandshakeOptions) -> EngineOptions {
        EngineOptions {
            topology,
            retry: RetryOptions::default(),
            selection: SelectionSettings::default(),
            heartbeat_frequency: DEFAULT_HEARTBEAT_FREQUENCY,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            socket_timeout: None,
            server_monitoring_mode: crate::monitor::ServerMonitoringMode::Auto,
            handshake,
            seed: 0,
            auth: None,
            command_monitoring: false,
            events: EventFamilies::ALL,
            service_config: None,
            srv_polling: None,
        }
    }

    /// These options publishing only the optional event families in `families` (issue 9: an
    /// embedder that listens to none saves queueing and polling them).
    #[must_use]
    pub fn with_events(mut self, families: EventFamilies) -> EngineOptions {
        self.events = families;
        self
    }
}

/// Lets `list` go: one that never took storage (nearly always, for the lists of a round trip's
/// rare parts: held retry events, document sequences) without the out-of-line drop of its
/// items, which has nothing to do (issue 9: 20-30 instructions per list); any other is dropped.
#[inline(always)]
fn let_go<T>(list: Vec<T>) {
    if list.capacity() == 0 {
        core::mem::forget(list);
    }
}

/// One operation to run. Made with [`OperationRequest::new`]; every field may then be changed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct OperationRequest {
    /// The database.
    pub db: String,
    /// The command, without `$db`. For a request made with [`OperationRequest::new_raw`], only
    /// the fields sent after the encoded command's, replacing any of the same name but its name
    /// (empty unless set).
    pub command: Document,
    /// What kind of operation it is (the retry rules depend on it).
    pub kind: OperationKind,
    /// Where it may run.
    pub criteria: SelectionCriteria,
    /// Its CSOT timeout: every attempt carries `maxTimeMS = remaining − minRTT` (CS-4), but a
    /// getMore: none, or its own `maxTimeMS` (an awaitData cursor's `maxAwaitTimeMS`) capped at
    /// that (TO-13, [`crate::max_time::get_more_max_time_ms`]). TO-14:
    /// a driver gives a session's `commitTransaction` and `abortTransaction` (and the abort of
    /// ending it) the session's `defaultTimeoutMS` here, else the client's `timeoutMS`; under
    /// any CSOT timeout a commit's `maxCommitTimeMS` is ignored (TO-6, TO-8).
    pub timeout: OperationTimeout,
    /// How the operation relates to a cursor: a getMore or killCursors goes where its cursor lives,
    /// with the cursor's session (SE-14). A getMore or killCursors joins that session's
    /// transaction only when its cursor was opened in it and it is still active, and never starts
    /// one (TX-1); one whose [`OperationRequest::session`] names another session than its
    /// cursor's is a usage error (review37 W1, engine21's leftover).
    pub cursor: CursorUse,
    /// The explicit session from [`Engine::start_session`]; `None` runs the operation in an
    /// implicit session (SE-9). Transactions need one: their commands share its `lsid` and
    /// `txnNumber` (TX-1) and follow its pin (TX-3..TX-5). Inside the session's transaction
    /// ([`Engine::start_transaction`]) every operation naming it runs as a transaction command,
    /// whatever its `kind` says (TX-1, TX-2).
    pub session: Option<SessionHandle>,
    /// The command's `readConcern` / `writeConcern` were inherited (from a client, database or
    /// collection default), not given for this operation. Inside a transaction inherited ones
    /// are dropped (the transaction's own apply, TX-1), while an operation's own is a usage error
    /// (the transactions spec: they cannot be given to an operation in a transaction).
    pub concerns_inherited: bool,
    /// The command kept encoded ([`OperationRequest::new_raw`]).
    encoded: Option<RawDocumentBuf>,
}

impl OperationRequest {
    /// A request with no CSOT timeout, no cursor and an implicit session.
    ///
    /// With a declared Stable API version ([`HandshakeOptions::server_api`](
    /// crate::handshake::HandshakeOptions::server_api)) every command carries the client's
    /// `apiVersion` (and `apiStrict` / `apiDeprecationErrors` when set). A command holding its
    /// own such field is not supported then: the versioned-api spec ("Generic command helper")
    /// leaves its behaviour undefined. Today the engine drops the command's fields and sends the
    /// client's. Without a declared version the command's fields go as they are.
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
            cursor: CursorUse::None,
            session: None,
            concerns_inherited: false,
            encoded: None,
        }
    }

    /// A request like [`OperationRequest::new`] whose command is already encoded (issue 9), so
    /// that a caller that builds or reuses BSON bytes never builds a [`Document`]:
    ///
    /// - On the wire: the command's bytes as they are, then the engine's fields (`$db`, `lsid`,
    ///   `txnNumber`, `$clusterTime`, `maxTimeMS`, `$readPreference`, with a declared Stable API
    ///   version `apiVersion`, `apiStrict` and `apiDeprecationErrors`, ...), each replacing an
    ///   encoded field of the same name. The engine owns `$db` (WP-5): one in the command is
    ///   replaced by `db`. What is on the wire is what [`OperationRequest::new`] with the same
    ///   command sends, up to the order of the fields after the first.
    /// - [`OperationRequest::command`] holds only fields to send after the encoded ones (empty
    ///   unless set; read the command itself with [`OperationRequest::raw_command`]); each
    ///   replaces an encoded field of the same name, but one naming the command (its first key,
    ///   WP-3) is a usage error.
    /// - The command is converted to a [`Document`] once, at the operation's start, if the
    ///   request names an explicit [`OperationRequest::session`] or the command holds `$db`,
    ///   `lsid` or `txnNumber`: the session and transaction rules then edit it as they edit
    ///   `new`'s command (the request no longer saves the conversion). So is a command holding
    ///   an API field under a declared Stable API version, which is not supported (undefined
    ///   behaviour in the versioned-api spec; today the client's fields replace it, as for
    ///   [`OperationRequest::new`]).
    /// - A usage error ends the operation at once, nothing sent (house rule 11): a command that
    ///   is not well-formed BSON, or that holds a top-level key more than once (a server refuses
    ///   a duplicate field).
    pub fn new_raw(
        db: impl Into<String>,
        command: RawDocumentBuf,
        kind: OperationKind,
        criteria: SelectionCriteria,
    ) -> OperationRequest {
        OperationRequest {
            encoded: Some(command),
            ..OperationRequest::new(db, Document::new(), kind, criteria)
        }
    }

    /// The encoded command of a request made with [`OperationRequest::new_raw`].
    pub fn raw_command(&self) -> Option<&bson::RawDocument> {
        self.encoded.as_deref()
    }
}

/// What [`Engine::session_info`] reports of an explicit session.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct SessionInfo {
    /// SE-3: the `lsid` (`{id: UUID}`) its commands carry, once its first command took a server
    /// session (SE-7).
    pub lsid: Option<Document>,
    /// SE-12: a network error made its server session dirty.
    pub dirty: bool,
    /// TX-3, TX-5: the mongos (or, load balanced, the pinned connection's server) its
    /// transaction is pinned to.
    pub pinned: Option<ServerAddress>,
    /// TX-2: where its transaction is.
    pub transaction: crate::transaction::TransactionState,
}

/// An explicit session, from [`Engine::start_session`] until [`Engine::end_session`]. The engine
/// keeps its server session (`lsid`, `txnNumber`), its cluster time and its transaction pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionHandle(u64);

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

/// A socket to close ([`Engine::poll_close`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Close {
    /// The engine's id for it.
    pub conn: ConnId,
    /// Whether the caller writes out the bytes it already took for the socket (bounded in time,
    /// without waiting for a reply) before closing it: true for a healthy connection the engine
    /// lets go (idle, stale, its pool closed), whose last operation may have ended on bytes
    /// still in the caller's hands (an unacknowledged write ends as they are taken, WP-6, EV-4);
    /// false for a socket closed under a command that failed, was cancelled or timed out, whose
    /// unwritten rest must not reach the server (a truncated message is never run).
    pub write_out: bool,
}

/// What the engine reports.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum EngineEvent {
    /// An operation finished: the reply, or the error the retry rules chose.
    OperationFinished {
        /// The operation.
        op: OpId,
        /// Its result. The reply stays encoded as the server sent it (validated by the decoder):
        /// read the fields you need in place, or convert it with
        /// [`to_document`](crate::wire::to_document), which cannot fail on it. A reply the caller
        /// drops costs no document tree. A commit or abort of a transaction that wrote nothing
        /// finishes with an empty reply (TX-2).
        result: Result<RawDocumentBuf, OperationError>,
        /// The server that sent the reply of a success, for what the caller reads from it (a
        /// driver's write errors name it, RW-3). `None` for an error (it names its own
        /// server, [`OperationError::address`]) and for a reply the engine made itself (TX-2).
        address: Option<ServerAddress>,
    },
    /// A command monitoring event in the spec's shape (EV-1..EV-6), when
    /// [`EngineOptions::command_monitoring`] is on. Boxed: it is the largest event by far, and
    /// every other event is moved through the event queue at the size of the largest.
    Command(Box<CommandEvent>),
    /// A hedging event of an operation run as hedged copies (A6-H1..A6-H7): copies started,
    /// succeeded, failed or cancelled.
    Hedging {
        /// The operation.
        op: OpId,
        /// The event.
        event: HedgingEvent,
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

/// A server's dense index in the engine's tables, for as long as it is in the topology (a server
/// that leaves and comes back gets a new one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct ServerId(u32);

/// What the engine keeps per server.
struct Server {
    address: ServerAddress,
    /// Its monitor (none in load-balanced mode, LB-3, and none once the server left).
    monitor: Option<MonitorState>,
    /// The pool after the server left the topology: its in-use connections are still checked
    /// into it, and it closes them.
    retired_pool: Option<Box<Pool>>,
    /// The server left the topology: its pool is `retired_pool` (dropped once it has no
    /// connections left), never the topology's pool of a server at the same address that joined
    /// later (review item 12).
    left: bool,
    /// The pool's registered timer.
    pool_timer: Option<Instant>,
    pool_queued: bool,
    /// SS-15: operations with an attempt on this server.
    in_flight: u32,
    /// Where its pool was last found among the topology's, and the topology's
    /// [`Topology::pools_version`] then (see `Engine::pool_mut`).
    pool_at: usize,
    pool_version: u64,
    /// Its pool's connections' sockets. A pool numbers its connections in increasing order
    /// (CM-1), so an [`IdTable`]: a checkout's lookup costs the same however many connections
    /// the pool has (issue 9, house rule 9; the `BTreeMap` by server and connection it replaces
    /// cost about 130 instructions per round trip at 64 connections).
    sockets: IdTable<ConnectionId, ConnId>,
}

/// Who owns a socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Pool(ConnectionId),
    Monitor,
    /// MO-12: a streaming monitor's RTT connection.
    Rtt,
}

struct Socket {
    server: ServerId,
    address: ServerAddress,
    owner: Owner,
    machine: Connection,
    /// The operation, and its slot, whose command is on this connection.
    op: Option<(OpId, usize)>,
    /// A cancelled hedged copy's command is on it: its reply checks the connection in.
    drain: Option<Drain>,
    /// Whether the socket is in the engine's transmit queue.
    transmit_queued: bool,
    /// The command on it, for its closing command event (EV-1).
    command: Option<commands::PendingCommand>,
    timer: Option<Instant>,
    queued: bool,
}

/// A connection kept after its hedged copy was cancelled in flight (A6-H3), until its reply
/// arrives (then checked in) or its deadline or socket timeout passes (then closed). Nobody else
/// uses it meanwhile.
struct Drain {
    /// The copy's implicit server session, back to the pool with the connection (SE-7).
    session: Option<ServerSession>,
    /// The command gossips `$clusterTime`: the late reply's still advances the clock (SE-16).
    gossip: bool,
}

/// The machine an operation runs: the retry rules, or hedged copies of a read (A6-H1..A6-H7).
///
/// Boxed (issue 9): each machine is about 700 bytes, and with one inline an [`Operation`] was
/// 1,600, past the allocator's fast path for small blocks (glibc's thread cache ends at 1,032
/// bytes), so that each operation's allocation and free took its slow path. Two blocks within
/// it cost less than one beyond it.
enum OpMachine {
    Retry(Box<RetryMachine>),
    Hedging(Box<HedgingMachine>),
}

/// One attempt of a retry machine, or one copy of a hedging machine: its selection, server,
/// checkout, connection and server session use.
#[derive(Default)]
struct Slot {
    /// Boxed (issue 9): the selection cache answers nearly every attempt's first look, so
    /// the loop is rare, and a slot of half the size is cheaper to reset for each operation.
    selection: Option<Box<ServerSelection>>,
    /// A hedged copy whose selection waits for the one before it to pick a server, so that it
    /// avoids that server too (A6-H7).
    select_queued: bool,
    /// When a waiting selection should look again.
    wake: Option<Instant>,
    server: Option<AttemptServer>,
    attempt: Option<Attempt>,
    /// The server the attempt is counted on (SS-15).
    counted: Option<ServerId>,
    /// CS-3: the computed selection deadline, min(serverSelectionTimeoutMS, remaining timeoutMS)
    /// from when the attempt's selection started; its checkout waits until it at most.
    selection_deadline: Option<Instant>,
    /// The pending checkout: checkout ids are per pool, so with its server.
    checkout: Option<(ServerId, CheckoutId)>,
    conn: Option<ConnId>,
    /// Its server session (SE-7, SE-9, SE-14); each hedged copy has its own.
    session: OpSession,
    /// The attempt carries the session's `lsid` (a network error makes it dirty, SE-12).
    lsid_sent: bool,
}

struct Operation {
    machine: OpMachine,
    /// The attempt slot of a retry machine; one per copy of a hedging machine (copy `n` in slot
    /// `n - 1`).
    slots: slots::Slots,
    /// The request; its command has moved to `wire`.
    request: RunningRequest,
    /// The command with `$db`, built once and sent as it is by every attempt that modifies
    /// nothing (WP-5). With `encoded`, the fields sent after the encoded command's.
    wire: Request,
    /// The caller's command kept encoded ([`OperationRequest::new_raw`]; issue 9).
    encoded: Option<RawDocumentBuf>,
    /// SS-9, LB-6: `encoded` holds a top-level `$readPreference` ([`encoded::inspect`], read
    /// once at the start rather than per attempt; review12 finding 6).
    encoded_read_preference: bool,
    reply: Option<RawDocumentBuf>,
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
    /// The `txnNumber` its attempts carry, allocated at its first attempt that needs one (RW-6,
    /// RW-7, TX-1).
    txn_number: Option<i64>,
    /// TX-1, TX-2: the transaction (its session's [`crate::transaction::Transaction::generation`])
    /// a transaction statement was mapped into; it is sent only while that one is active.
    transaction: Option<u32>,
    /// The command sends and absorbs `$clusterTime` (SE-16, SE-19).
    gossip: bool,
    /// An `endSessions` of [`Engine::close`]: no `OperationFinished`, no session (SE-15).
    internal: bool,
    /// The first input its machine refused: a bug of the engine's, which finishes the operation
    /// with [`OperationError::internal`] instead of leaving it unfinished (house rule 8).
    refused: Option<String>,
    timer: Option<Instant>,
    queued: bool,
}

/// A running operation's [`OperationRequest`], without its command (moved to `Operation::wire`)
/// and without what only [`Engine::start_operation`] reads.
struct RunningRequest {
    db: String,
    kind: OperationKind,
    criteria: SelectionCriteria,
    timeout: OperationTimeout,
    cursor: CursorUse,
    session: Option<SessionHandle>,
}

/// An explicit session: its server session once used (SE-7), its cluster time (SE-18), its
/// transaction pin and in load-balanced mode the pinned connection (TX-3..TX-5).
#[derive(Default)]
struct Session {
    server: Option<ServerSession>,
    clock: ClusterClock,
    pin: TransactionPin,
    conn: Option<ConnId>,
    /// Its operations that have not finished (SE-12: it ends only after the last one).
    in_flight: u32,
    /// [`Engine::end_session`] was called while operations were in flight.
    ending: bool,
    /// TX-6: the latest `recoveryToken` of the transaction's `ok: 1` replies.
    recovery_token: Option<Document>,
    /// TX-2: its transaction's state, through which every operation naming it is mapped.
    transaction: crate::transaction::Transaction,
    /// TX-1: transactions started since its last `txnNumber` was taken (each takes one).
    started_transactions: u32,
    /// TX-1, TX-11: the concerns of its transaction (from [`Engine::start_transaction`]).
    transaction_options: crate::transaction::TransactionOptions,
    /// SE-21: the greatest `operationTime` of its replies, for `afterClusterTime`.
    operation_time: Option<bson::Timestamp>,
}

/// Which server session an operation's commands carry.
#[derive(Debug, Default)]
enum OpSession {
    /// None: the command may not carry one (SE-13), or the cursor it continues had none.
    #[default]
    Never,
    /// An implicit session, taken from the pool after checkout (SE-7); `None` until then.
    Implicit(Option<ServerSession>),
    /// The caller's explicit session.
    Explicit(SessionHandle),
}

/// A cursor between its creation and its end.
struct Cursor {
    server: AttemptServer,
    /// Load-balanced mode: the pinned connection.
    conn: Option<ConnId>,
    pin: CursorPin,
    /// The session of the command that opened it, for its `getMore`s and `killCursors` (SE-14).
    session: OpSession,
    /// TX-1, SE-14: the transaction (generation) it was opened in; its `getMore`s join the
    /// session's transaction only while that same one is active.
    transaction: Option<u32>,
}

struct MonitorState {
    monitor: Monitor,
    conn: Option<ConnId>,
    /// MO-12: the RTT connection while streaming.
    rtt_conn: Option<ConnId>,
    timer: Option<Instant>,
    queued: bool,
}

/// The engine. See the [module docs](self).
pub struct Engine {
    options: EngineOptions,
    topology: TrackedTopology,
    /// The first look of an attempt's selection between topology changes (issue 9).
    selection_cache: SelectionCache,
    servers: Vec<Server>,
    server_ids: BTreeMap<ServerAddress, ServerId>,
    /// The entry of `server_ids` found last (issue 9: an attempt's server is nearly always the
    /// one before); dropped with the entry.
    last_server: Option<(ServerAddress, ServerId)>,
    sockets: IdTable<ConnId, Socket>,
    /// Boxed: the map's inserts and removals then move a pointer, not the whole operation, so an
    /// operation's cost does not grow with the number in flight (house rule 9, issue 9).
    ops: IdTable<OpId, Box<Operation>>,
    /// Pending checkout → operation.
    checkouts: id_table::Checkouts,
    /// Operations whose selection waits for a topology change (SS-16).
    waiting: BTreeSet<OpId>,
    cursors: cursors::Cursors,
    next_cursor: u64,
    sessions: BTreeMap<SessionHandle, Session>,
    next_session: u64,
    /// The server sessions not in use (SE-1).
    session_pool: SessionPool,
    /// The highest `$clusterTime` seen (SE-16).
    cluster_clock: ClusterClock,
    rng: EngineRng,
    next_conn: u64,
    next_op: u64,
    /// The handshake command every socket sends, built once (HS-2).
    handshake: Document,
    /// `handshake` encoded once (HS-2): sockets that do not authenticate copy these bytes rather
    /// than cloning and encoding the command each (an error only in the tests' unbuildable engine).
    ///
    /// Invariant (review9 finding 7): nothing in the hello depends on the socket unless it
    /// authenticates. A socket that authenticates builds its own (AU-2's speculative start,
    /// `saslSupportedMechs`); every other one (monitor, RTT monitor, pooled without credentials)
    /// sends these bytes, request id 1 included. A per-socket field must not be added here: build
    /// that socket's hello from `handshake` instead. Tested by
    /// `hs2_monitor_rtt_and_pooled_sockets_send_the_handshake_encoded_fresh`.
    encoded_handshake: Result<Vec<u8>, crate::wire::EncodeError>,
    /// The declared Stable API version's fields, added to every command (versioned-api spec).
    api: Option<api_version::ApiFields>,
    /// Machines with something to do, first in, first out; each at most once.
    work: VecDeque<Machine>,
    /// The pool turn of a checkout served at once, due right after the current turn (issue 9).
    served: Option<worklist::Served>,
    topology_queued: bool,
    timers: Timers,
    connects: VecDeque<Connect>,
    /// Sockets with bytes to write, in the order their bytes appeared.
    transmits: VecDeque<ConnId>,
    closes: VecDeque<Close>,
    events: VecDeque<EngineEvent>,
    /// Set by [`Engine::close`].
    closed: bool,
    /// [`Engine::close`] waits for its `endSessions` operations before it closes the pools.
    ending_sessions: bool,
    /// The retry machine being drained: its drain polls it until it has nothing left, so what
    /// is handed to it meanwhile needs no second turn on the worklist.
    draining: Option<OpId>,
    /// SRV polling (`srv_polling.rs`), when the options ask for it.
    srv: Option<crate::topology::SrvPoller>,
    /// Boxes of finished retry-machine operations, with their machines' boxes, reused by the
    /// next operations (issue 9): a burst of finishes would otherwise free each through the
    /// allocator's slow path, its thread cache holding only a few blocks per size. A kept
    /// operation's command is dropped when it is kept; the rest of its request and its attempt
    /// slots wait until the next operation overwrites them (`Engine::keep_operation`). The boxes
    /// are what is kept, so `Box` in a `Vec`.
    #[allow(clippy::vec_box)]
    spare_ops: Vec<Box<Operation>>,
    /// The emptied command documents of kept operations, replaced by the next operation's
    /// command, for [`Engine::take_document`] (at most [`SPARE_OPS`]).
    spare_documents: Vec<Document>,
    /// The emptied database names of kept operations, for [`Engine::take_db_name`] (at most
    /// [`SPARE_OPS`]).
    spare_names: Vec<String>,
}

/// The most finished operations kept for reuse: a burst of 64 (about 100 KB with their
/// machines).
const SPARE_OPS: usize = 64;

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
    /// Load-balanced mode with a strict Stable API (`ServerApi::strict == Some(true)`): the
    /// handshake must carry `loadBalanced: true` (LB-7) and `apiStrict: true` (HS-2, versioned-api
    /// "Command Syntax"), and a server refuses that hello: `loadBalanced` is an unstable field of
    /// the server's hello command (hello.idl, `stability: unstable`), parsed with the request's
    /// `apiStrict`, so every handshake would fail with APIStrictError (323). Neither spec allows
    /// dropping either field, so the engine refuses the combination instead of failing every
    /// connection. `apiStrict: false` or unset works.
    LoadBalancedStrictApi,
    /// A seed cannot name a server ([`ServerAddress::check`](crate::address::ServerAddress::check):
    /// an empty host, port 0, a host holding a port; review32 R23). The parse error is the
    /// `source` (review35 Z5).
    InvalidSeed(crate::address::AddressParseError),
}

impl core::fmt::Display for EngineError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EngineError::Settings(e) => write!(f, "invalid topology settings: {e}"),
            EngineError::Handshake(e) => write!(f, "invalid handshake: {e}"),
            EngineError::HandshakeEncoding(e) => write!(f, "the handshake cannot be encoded: {e}"),
            EngineError::LoadBalancedStrictApi => f.write_str(
                "loadBalanced=true cannot be used with a strict Stable API (apiStrict: true): a \
                 server refuses the handshake's loadBalanced field under apiStrict \
                 (APIStrictError, 323); leave ServerApi::strict unset or false",
            ),
            EngineError::InvalidSeed(e) => write!(f, "invalid seed: {e}"),
        }
    }
}

impl core::error::Error for EngineError {
    /// The wrapped error (issue 9 item 5: `source` wherever an error wraps a cause); its text is
    /// in this error's message too, so one `{error}` is the whole story.
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            EngineError::Settings(e) => Some(e),
            EngineError::Handshake(e) => Some(e),
            EngineError::HandshakeEncoding(e) => Some(e),
            EngineError::InvalidSeed(e) => Some(e),
            EngineError::LoadBalancedStrictApi => None,
        }
    }
}

impl From<crate::topology::SettingsError> for EngineError {
    fn from(e: crate::topology::SettingsError) -> EngineError {
        EngineError::Settings(e)
    }
}

impl Engine {
    /// An engine for `options`, starting at `now`. Its monitors (none in load-balanced mode,
    /// LB-3) are due at `now`: [`Engine::poll_timeout`] returns `now`, and the first
    /// [`Engine::handle_timeout`] starts their checks (MO-1), so the first sockets are asked for
    /// then. [`EngineOptions::heartbeat_frequency`] replaces the selection settings' own.
    ///
    /// Fails when the topology settings are inconsistent, the handshake cannot be built, or
    /// load-balanced mode meets a strict Stable API ([`EngineError::LoadBalancedStrictApi`]), or
    /// a seed cannot name a server ([`EngineError::InvalidSeed`]).
    pub fn new(mut options: EngineOptions, now: Instant) -> Result<Engine, EngineError> {
        for seed in &options.topology.seeds {
            seed.check().map_err(EngineError::InvalidSeed)?;
        }
        options.handshake.load_balanced = options.topology.load_balanced;
        // One heartbeatFrequencyMS for the monitors and the staleness rules (SS-2, SS-5).
        options.selection.heartbeat_frequency = options.heartbeat_frequency;
        if crate::handshake::load_balanced_refused(
            options.topology.load_balanced,
            options.handshake.server_api.as_ref(),
        ) {
            return Err(EngineError::LoadBalancedStrictApi);
        }
        let topology = Topology::new(options.topology.clone(), now)?;
        // Built and encoded once here, so that opening a socket cannot fail later.
        let handshake = options
            .handshake
            .command()
            .map_err(EngineError::Handshake)?;
        let encoded_handshake = crate::connection::encode_handshake(handshake.clone())
            .map_err(EngineError::HandshakeEncoding)?;
        let api = options
            .handshake
            .server_api
            .as_ref()
            .map(api_version::ApiFields::new);
        let rng = EngineRng::from_seed_u64(options.seed);
        let srv = options
            .srv_polling
            .as_ref()
            .map(|srv| crate::topology::SrvPoller::new(srv, options.heartbeat_frequency, now));
        let mut engine = Engine {
            options,
            topology: TrackedTopology::new(topology),
            selection_cache: SelectionCache::default(),
            servers: Vec::new(),
            server_ids: BTreeMap::new(),
            last_server: None,
            sockets: IdTable::default(),
            ops: IdTable::default(),
            checkouts: id_table::Checkouts::default(),
            waiting: BTreeSet::new(),
            cursors: cursors::Cursors::default(),
            next_cursor: 1,
            sessions: BTreeMap::new(),
            next_session: 1,
            session_pool: SessionPool::new(),
            cluster_clock: ClusterClock::new(),
            rng,
            next_conn: 1,
            next_op: 1,
            handshake,
            encoded_handshake: Ok(encoded_handshake),
            api,
            work: VecDeque::new(),
            served: None,
            topology_queued: false,
            timers: Timers::default(),
            connects: VecDeque::new(),
            transmits: VecDeque::new(),
            closes: VecDeque::new(),
            events: VecDeque::new(),
            closed: false,
            ending_sessions: false,
            draining: None,
            srv,
            spare_ops: Vec::new(),
            spare_documents: Vec::new(),
            spare_names: Vec::new(),
        };
        let pool_events = engine.options.events.contains(EventFamilies::POOL);
        engine.topology.set_pool_events(pool_events);
        engine.schedule(Machine::Topology);
        engine.schedule_every_pool();
        engine.run(now);
        Ok(engine)
    }

    /// The current topology description.
    pub fn topology(&self) -> &crate::topology::TopologyDescription {
        self.topology.description()
    }

    /// Gives up on `op`: it finishes with [`crate::error::ErrorKind::Cancelled`], an attempt in
    /// flight is failed and its connection closed, and a pending checkout is withdrawn. Unknown or
    /// finished operations are ignored. A pinned load-balanced connection (a cursor's, a
    /// transaction's) with the attempt in flight closes too (LB-9, review38 L1): its cursors send
    /// no killCursors (LB-11), and its transaction's next command fails with a network error that
    /// unpins it (TX-4 (2)). A cancelled `abortTransaction` unpins its session (TX-4 (1)).
    pub fn cancel_operation(&mut self, op: OpId, now: Instant) {
        self.cancel(op, now);
        self.run(now);
    }

    /// Closes the client: every unfinished operation finishes exactly once with
    /// [`crate::error::ErrorKind::Cancelled`] (an attempt in flight is failed and its connection
    /// closed), cursors and sessions let their connections and server sessions go. Then, when the
    /// pool holds server sessions and a server is selectable, it ends them with `endSessions`
    /// commands on `admin` (primaryPreferred, at most 10,000 ids each, errors ignored, SE-15),
    /// bounded by `serverSelectionTimeoutMS` from now; these are the engine's own operations and
    /// report no `OperationFinished`. Drive the engine as usual until [`Engine::is_closed`]. Once
    /// they have ended, every pool closes (CMAP `PoolClosed`), every monitor stops, every socket
    /// is closed (`poll_close`), and the topology publishes its closing SDAM events
    /// (`ServerClosed` per server, the change to an empty description, `TopologyClosed`).
    /// Afterwards inputs change nothing. From the call on, [`Engine::start_operation`] finishes at
    /// once with the cancellation error. Closing twice does nothing.
    pub fn close(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        self.closed = true;
        let ops: Vec<OpId> = self.ops.keys().collect();
        for op in ops {
            self.cancel(op, now);
        }
        self.run(now);
        debug_assert!(self.ops.is_empty(), "every operation finished on close");
        let sessions: Vec<SessionHandle> = self.sessions.keys().copied().collect();
        for session in sessions {
            // TX-4 (6): the sessions end with the client.
            let unpinned = self
                .sessions
                .get_mut(&session)
                .and_then(|s| s.pin.end_session());
            self.transaction_unpinned(session, unpinned, now);
        }
        // LB-9, LB-11, CM-7 (review38 L4): a cursor's connection goes back by its socket, or,
        // when its socket died under a getMore (kept checked out since, LB-11), by its pool id,
        // closed with reason error.
        let cursors: Vec<(ConnId, Option<crate::pool::ConnectionId>, ServerAddress)> = self
            .cursors
            .pinned()
            .map(|(conn, id, address)| (conn, id, address.clone()))
            .collect();
        for (conn, id, address) in cursors {
            if self.sockets.contains_key(&conn) {
                self.release(conn, true, now);
            } else if let Some(id) = id {
                let server = self.server_id(&address);
                if let Some(pool) = self.pool_mut(server) {
                    pool.check_in(id, false, now);
                }
                self.flush_pool_events(server);
            }
        }
        // SE-15: the sessions of cancelled hedged copies still draining are ended with the rest.
        let drained: Vec<ServerSession> = self
            .sockets
            .values_mut()
            .filter_map(|s| s.drain.as_mut().and_then(|d| d.session.take()))
            .collect();
        for session in drained {
            self.release_server_session(session, now);
        }
        self.return_sessions(now);
        self.ending_sessions = self.end_sessions(now);
        if !self.ending_sessions {
            self.close_pools(now);
        }
        self.run(now);
    }

    /// Whether [`Engine::close`] has finished: its `endSessions` ended and every pool, monitor
    /// and socket is closed.
    pub fn is_closed(&self) -> bool {
        self.closed && !self.ending_sessions
    }

    /// The last step of [`Engine::close`].
    fn close_pools(&mut self, now: Instant) {
        self.topology.input().close(now);
        self.schedule(Machine::Topology);
        self.run(now);
        let sockets: Vec<ConnId> = self.sockets.keys().collect();
        for conn in sockets {
            self.close_socket(conn, false, now);
        }
        // A draining connection (a cancelled hedged copy's) fails and goes back to its pool.
        self.run(now);
    }

    /// The socket `conn` asked for by [`Engine::poll_connect`] is open.
    pub fn handle_connected(&mut self, conn: ConnId, now: Instant) {
        if let Some(socket) = self.sockets.get_mut(&conn) {
            socket.machine.handle_connected(now);
            self.schedule(Machine::Socket(conn));
            self.run(now);
        }
    }

    /// Bytes arrived on `conn`.
    pub fn handle_bytes(&mut self, conn: ConnId, bytes: &[u8], now: Instant) {
        if let Some(socket) = self.sockets.get_mut(&conn) {
            socket.machine.handle_bytes(bytes, now);
            // Queued already: its turn is on the worklist.
            match socket.queued {
                true => self.run(now),
                false => self.run_input(Machine::Socket(conn), now),
            }
        }
    }

    /// `conn` closed, or could not be opened, with `kind`. `cause` is the I/O error behind it (its
    /// kind's name and message, e.g. from `std::io::Error`), when the adapter has one: the
    /// operation error keeps it, prints it and returns it from `source()`.
    pub fn handle_closed(
        &mut self,
        conn: ConnId,
        kind: NetworkErrorKind,
        cause: Option<NetworkCause>,
        now: Instant,
    ) {
        if let Some(socket) = self.sockets.get_mut(&conn) {
            socket.machine.handle_closed(kind, cause, now);
            self.schedule(Machine::Socket(conn));
            self.run(now);
        }
    }

    /// Time has passed: fires the timers that are due, and only those.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(machine) = self.timers.pop_due(now) {
            match machine {
                Machine::Socket(conn) => {
                    if let Some(socket) = self.sockets.get_mut(&conn) {
                        socket.timer = None;
                        socket.machine.handle_timeout(now);
                    }
                }
                Machine::Monitor(server) => {
                    if let Some(state) = self.server_mut(server).monitor.as_mut() {
                        state.timer = None;
                        state.monitor.handle_timeout(now);
                    }
                }
                Machine::Pool(server) => {
                    self.server_mut(server).pool_timer = None;
                    if let Some(pool) = self.pool_mut(server) {
                        pool.handle_timeout(now);
                    }
                }
                Machine::Operation(op) => {
                    if let Some(operation) = self.ops.get_mut(&op) {
                        operation.timer = None;
                        operation.machine.handle_timeout(now);
                    }
                }
                Machine::Topology => {}
            }
            self.schedule(machine);
        }
        if let Some(srv) = &mut self.srv {
            srv.handle_timeout(&self.topology, now);
        }
        self.run(now);
    }

    /// Whether the `mongodb+srv` name must be looked up now for SRV polling; `true` once per
    /// rescan. Answer with [`Engine::handle_srv_hosts`].
    #[must_use]
    pub fn poll_srv_rescan(&mut self) -> bool {
        self.srv.as_mut().is_some_and(|srv| srv.poll_rescan())
    }

    /// The SRV rescan asked by [`Engine::poll_srv_rescan`] ended at `now` with `hosts` (the
    /// targets in the parent domain; empty on a DNS error or no records) whose lowest TTL is
    /// `min_ttl`: the topology follows them ([`crate::topology::SrvPoller::handle_hosts`]).
    pub fn handle_srv_hosts(
        &mut self,
        hosts: Vec<ServerAddress>,
        min_ttl: Option<Duration>,
        now: Instant,
    ) {
        if let Some(srv) = &mut self.srv {
            srv.handle_hosts(self.topology.input(), hosts, min_ttl, &mut self.rng, now);
            self.schedule(Machine::Topology);
            self.run(now);
        }
    }

    /// The next socket to open. Inlined: a driver asks again after taking transmits (WP-6, see
    /// [`Engine::poll_transmit`]), nearly always of an empty queue.
    #[must_use]
    #[inline]
    pub fn poll_connect(&mut self) -> Option<Connect> {
        self.connects.pop_front()
    }

    /// Appends the next pending bytes of one socket to `buf` and returns that socket; `None` when
    /// nothing is waiting. The caller clears (and reuses) `buf` between calls; bytes for one socket
    /// come out in the order they must be written.
    ///
    /// WP-6, EV-4: taking the bytes of an unacknowledged write (`w: 0`, sent with `moreToCome`)
    /// ends its operation: no reply will come, so the hand-off is the last the engine sees of
    /// it (see "Unacknowledged writes" in the [module docs](self)). Its closing events, its
    /// connection's check-in and its `OperationFinished` are queued for [`Engine::poll_event`],
    /// and what the check-in sets off (the next command on that connection, a socket to close
    /// or, rarely, to open) for the other `poll_*`: drain them all again after this one.
    #[must_use]
    #[inline]
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<ConnId> {
        // Issue 9: a driver's last call of a round finds nothing; it costs only this check.
        if self.transmits.is_empty() {
            return None;
        }
        self.take_transmit(buf)
    }

    /// [`Engine::poll_transmit`] with a socket queued.
    #[inline(never)]
    fn take_transmit(&mut self, buf: &mut Vec<u8>) -> Option<ConnId> {
        while let Some(conn) = self.transmits.pop_front() {
            if let Some(socket) = self.sockets.get_mut(&conn) {
                socket.transmit_queued = false;
                if socket.machine.poll_transmit(buf) {
                    // WP-6, EV-4: an unacknowledged write ends as its bytes are handed over.
                    if let Some(sent_at) = socket.machine.take_unacknowledged_handed_over() {
                        self.unacknowledged_handed_over(conn, sent_at);
                    }
                    return Some(conn);
                }
            }
        }
        None
    }

    /// The next socket to close, and whether the bytes the caller already took for it are
    /// written out first ([`Close::write_out`]).
    #[must_use]
    pub fn poll_close(&mut self) -> Option<Close> {
        self.closes.pop_front()
    }

    /// Turns [`EngineOptions::command_monitoring`] on or off from the next command written on;
    /// a command already in flight still gets its closing event (EV-1).
    pub fn set_command_monitoring(&mut self, on: bool) {
        self.options.command_monitoring = on;
    }

    /// Publishes the optional event families in `families` from now on
    /// ([`EngineOptions::events`]); events already queued stay. An operation records its retry
    /// and hedging events only if their family was on when it started (issue 9: a machine whose
    /// events nobody listens to does not build them), so turning one on publishes those of the
    /// operations started from then on.
    pub fn set_events(&mut self, families: EventFamilies) {
        // Issue 9: pools record their events only while they are published (a driver sets the
        // families before every batch of requests: the pools are visited only on a change).
        let pool_events = families.contains(EventFamilies::POOL);
        if pool_events != self.options.events.contains(EventFamilies::POOL) {
            self.topology.set_pool_events(pool_events);
            for pool in self
                .servers
                .iter_mut()
                .filter_map(|s| s.retired_pool.as_mut())
            {
                pool.set_record_events(pool_events);
            }
        }
        self.options.events = families;
    }

    /// An empty document with room for a few fields, when the engine has one: the emptied
    /// command document of a finished operation (its fields were dropped when it finished),
    /// given away instead of freed (issue 9). A driver builds the next reply into it
    /// ([`crate::wire::to_document_in`]), so that a round trip neither frees the command
    /// document's table nor allocates the reply's.
    #[must_use]
    pub fn take_document(&mut self) -> Option<Document> {
        self.spare_documents.pop()
    }

    /// An empty string with room for a database name, when the engine has one: the `db` of a
    /// finished operation, cleared, given away instead of freed (issue 9). A driver writes the
    /// next request's database name into it ([`OperationRequest::db`]), so that a round trip
    /// neither frees one name nor allocates the next.
    #[must_use]
    pub fn take_db_name(&mut self) -> Option<String> {
        self.spare_names.pop()
    }

    /// The next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<EngineEvent> {
        self.events.pop_front()
    }

    /// The earliest instant at which [`Engine::handle_timeout`] has work to do: the head of the
    /// timer queue, or SRV polling's next rescan if sooner.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let srv = self.srv.as_ref().and_then(|srv| srv.poll_timeout());
        match (self.timers.next(), srv) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The server's entry.
    fn server(&self, server: ServerId) -> &Server {
        &self.servers[server.0 as usize]
    }

    fn server_mut(&mut self, server: ServerId) -> &mut Server {
        &mut self.servers[server.0 as usize]
    }

    /// The id of the server at `address` while it is in the topology, made on first use.
    /// Inlined (issue 9): an attempt's server is nearly always the one before; the rest is not.
    #[inline(always)]
    fn server_id(&mut self, address: &ServerAddress) -> ServerId {
        match last_server_id(&self.last_server, address) {
            Some(id) => id,
            None => self.look_up_server(address),
        }
    }

    /// [`Engine::server_id`] past its last server.
    #[inline(never)]
    fn look_up_server(&mut self, address: &ServerAddress) -> ServerId {
        if let Some(id) = self.server_ids.get(address).copied() {
            self.last_server = Some((address.clone(), id));
            return id;
        }
        let id = ServerId(self.servers.len() as u32);
        self.servers.push(Server {
            address: address.clone(),
            monitor: None,
            retired_pool: None,
            left: false,
            pool_timer: None,
            pool_queued: false,
            in_flight: 0,
            pool_at: 0,
            pool_version: u64::MAX,
            sockets: IdTable::default(),
        });
        self.server_ids.insert(address.clone(), id);
        id
    }

    /// The server's pool: the topology's while it is a member, then the retired one. The
    /// topology's is found at the position it had last time while no pool joined or left since
    /// ([`Topology::pools_version`]: one comparison of integers, house rule 9), else looked up
    /// by address and its position kept. Inlined (issue 9): a call's own entry and exit cost
    /// about as much as the comparison.
    #[inline(always)]
    fn pool_mut(&mut self, server: ServerId) -> Option<&mut Pool> {
        pool_in(&mut self.servers, &mut self.topology, server)
    }

    #[inline(always)]
    fn pool(&self, server: ServerId) -> Option<&Pool> {
        let entry = self.server(server);
        match entry.retired_pool.as_deref() {
            Some(pool) => Some(pool),
            None if entry.left => None,
            None if entry.pool_version == self.topology.pools_version() => {
                self.topology.pools().nth(entry.pool_at)
            }
            None => self.topology.pool(&entry.address),
        }
    }
}

/// The id of the server at `address` when it is `last_server`, the last one
/// [`Engine::server_id`] looked up (issue 9: nearly always an attempt's). Takes the field, so
/// that a caller holding an operation asks it too.
#[inline(always)]
fn last_server_id(
    last_server: &Option<(ServerAddress, ServerId)>,
    address: &ServerAddress,
) -> Option<ServerId> {
    match last_server {
        Some((last, id)) if last == address => Some(*id),
        _ => None,
    }
}

/// [`Engine::pool_mut`] from the two fields it reads, for a caller that holds another field
/// (an operation) at the same time (issue 9).
#[inline(always)]
fn pool_in<'a>(
    servers: &'a mut [Server],
    topology: &'a mut TrackedTopology,
    server: ServerId,
) -> Option<&'a mut Pool> {
    let entry = &mut servers[server.0 as usize];
    match entry.retired_pool.as_deref_mut() {
        Some(pool) => Some(pool),
        None if entry.left => None,
        None => {
            let version = topology.pools_version();
            if entry.pool_version != version {
                let address = &entry.address;
                entry.pool_at = topology.pools().position(|p| p.address() == address)?;
                entry.pool_version = version;
            }
            let pool = topology.pools_mut().nth(entry.pool_at);
            debug_assert!(pool.as_ref().is_some_and(|p| p.address() == &entry.address));
            pool
        }
    }
}

/// The command of an attempt that modifies it (TX-11, TX-12) or that carries a `$readPreference`
/// for its server (SS-9, LB-6): the operation's command (`base`, with the session fields) with
/// the attempt's fields (`$db` and `lsid` are appended at encode time); `None` when the attempt
/// modifies nothing and `base` is sent as it is.
/// Inlined (issue 9): nearly every attempt modifies nothing, which only this check sees.
#[inline(always)]
fn command_for(
    encoded: Option<&bson::RawDocument>,
    base: &Document,
    attempt: &Attempt,
    read_preference: Option<Document>,
) -> Option<Document> {
    if !attempt.start_transaction
        && attempt.write_concern != WriteConcernRule::Majority
        && read_preference.is_none()
    {
        return None;
    }
    modified_command(encoded, base, attempt, read_preference)
}

/// [`command_for`] of an attempt that modifies the command.
#[inline(never)]
fn modified_command(
    encoded: Option<&bson::RawDocument>,
    base: &Document,
    attempt: &Attempt,
    read_preference: Option<Document>,
) -> Option<Document> {
    let mut body = base.clone();
    if let Some(read_preference) = read_preference {
        body.insert("$readPreference", read_preference);
    }
    if attempt.start_transaction {
        body.insert("startTransaction", true);
    }
    if attempt.write_concern == WriteConcernRule::Majority {
        let mut wc = match encoded::field(encoded, &body, "writeConcern").as_deref() {
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
    Some(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::HeartbeatEvent;
    use crate::selection::{ReadPreference, ReadPreferenceMode};

    /// An engine whose sockets can never be built: its handshake command no longer encodes (a key
    /// with a NUL byte). `Engine::new` refuses such a handshake, so this is set afterwards.
    fn unbuildable(load_balanced: bool) -> Engine {
        let mut settings = TopologySettings::new(alloc::vec![ServerAddress::new("db", 27017)]);
        settings.load_balanced = load_balanced;
        let mut engine = Engine::new(
            EngineOptions::new(settings, HandshakeOptions::new()),
            Instant::ZERO,
        )
        .expect("valid");
        engine.handshake = bson::doc! { "hel\0lo": 1 };
        engine.encoded_handshake = crate::connection::encode_handshake(engine.handshake.clone());
        assert!(engine.encoded_handshake.is_err());
        engine
    }

    fn events(engine: &mut Engine) -> Vec<EngineEvent> {
        core::iter::from_fn(|| engine.poll_event()).collect()
    }

    /// Issue 9 item 2: a socket that cannot be built fails the pool's pending connection, so the
    /// checkout, and the operation ends exactly once with the handshake error.
    #[test]
    fn a_connection_that_cannot_be_built_fails_its_checkout_once() {
        let mut engine = unbuildable(true);
        let primary = ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).unwrap();
        let request = OperationRequest::new(
            "test",
            bson::doc! { "ping": 1 },
            OperationKind::Read,
            SelectionCriteria::Read(primary),
        );
        let op = engine.start_operation(request, Instant::ZERO);
        assert_eq!(engine.poll_connect(), None, "no socket was asked for");
        let finished: Vec<_> = events(&mut engine)
            .into_iter()
            .filter_map(|e| match e {
                EngineEvent::OperationFinished {
                    op: o,
                    result,
                    address,
                } if o == op => Some((result, address)),
                _ => None,
            })
            .collect();
        assert_eq!(finished.len(), 1);
        // An error names its own server; the finish names none (RW-3 reads a success's).
        assert_eq!(finished[0].1, None);
        let error = finished[0].0.as_ref().unwrap_err();
        assert!(
            matches!(error.kind, crate::error::ErrorKind::Handshake { .. }),
            "{error:?}"
        );
        assert!(engine.ops.is_empty() && engine.checkouts.is_empty());
    }

    /// Review item 12, house rule 9: the pool of a server that left is dropped once it has no
    /// connections, and the server's entry never reaches the pool of a server that joins later
    /// at the same address.
    #[test]
    fn a_retired_pool_without_connections_is_dropped() {
        let (a, b) = (
            ServerAddress::new("a", 27017),
            ServerAddress::new("b", 27017),
        );
        let settings = TopologySettings::new(alloc::vec![a, b.clone()]);
        let options = EngineOptions::new(settings, HandshakeOptions::new());
        let mut engine = Engine::new(options, Instant::ZERO).expect("valid");
        let id = engine.server_id(&b);
        let mut pool = Box::new(Pool::new(b.clone(), crate::pool::PoolOptions::default()));
        pool.close(Instant::ZERO);
        engine.server_removed(&b, pool, Instant::ZERO);
        engine.run(Instant::ZERO);
        let closed = events(&mut engine).into_iter().any(|e| {
            matches!(
                e,
                EngineEvent::Pool {
                    event: PoolEvent::PoolClosed,
                    ..
                }
            )
        });
        assert!(closed, "the retired pool's events were routed first");
        assert!(engine.server(id).retired_pool.is_none());
        assert!(engine.pool(id).is_none());
    }

    /// Review23 R5 (review22 R5, EV-3, house rules 8 and 10): `set_events` switches the pool of
    /// a server that already left (`retired_pool`) too. Retired while POOL was off (its pool
    /// recording nothing), switched on before it closes: its close is published. Without the
    /// switch's loop over retired pools the pool would keep recording nothing and publish no
    /// close. (Driven through the engine's internal calls: no public call sequence was found that
    /// leaves a retired pool alive at a switch, see the commit message.)
    #[test]
    fn a_retired_pool_switched_on_publishes_its_close() {
        let (a, b) = (
            ServerAddress::new("a", 27017),
            ServerAddress::new("b", 27017),
        );
        let settings = TopologySettings::new(alloc::vec![a, b.clone()]);
        let options =
            EngineOptions::new(settings, HandshakeOptions::new()).with_events(EventFamilies::NONE);
        let mut engine = Engine::new(options, Instant::ZERO).expect("valid");
        let id = engine.server_id(&b);
        let mut pool = Box::new(Pool::new(b.clone(), crate::pool::PoolOptions::default()));
        pool.set_record_events(false);
        engine.server_removed(&b, pool, Instant::ZERO);
        engine.set_events(EventFamilies::POOL);
        engine
            .server_mut(id)
            .retired_pool
            .as_mut()
            .expect("retired, not yet dropped")
            .close(Instant::ZERO);
        engine.run(Instant::ZERO);
        let closed = events(&mut engine).into_iter().any(|e| {
            matches!(
                e,
                EngineEvent::Pool {
                    address,
                    event: PoolEvent::PoolClosed,
                } if address == b
            )
        });
        assert!(closed, "the retired pool's close was published");
        assert!(engine.server(id).retired_pool.is_none(), "then dropped");
    }

    /// Issue 9 item 2: a monitor whose socket cannot be built completes its check as failed.
    #[test]
    fn a_monitor_socket_that_cannot_be_built_fails_the_check() {
        let mut engine = unbuildable(false);
        engine.handle_timeout(Instant::ZERO);
        assert_eq!(engine.poll_connect(), None);
        let failed = events(&mut engine).into_iter().any(|e| {
            matches!(
                e,
                EngineEvent::Heartbeat {
                    event: HeartbeatEvent::Failed { .. },
                    ..
                }
            )
        });
        assert!(failed, "the check failed");
        assert!(
            engine.poll_timeout().is_some(),
            "the next check is scheduled"
        );
    }

    /// Review32 R18 (MO-1): `Engine::new` asks for no socket; its monitors are due at `now`, and
    /// the first `handle_timeout(now)` starts their checks.
    #[test]
    fn the_first_handle_timeout_starts_the_monitors() {
        let seeds = alloc::vec![ServerAddress::new("db", 27017)];
        let options = EngineOptions::new(TopologySettings::new(seeds), HandshakeOptions::new());
        let now = Instant::ZERO.saturating_add(Duration::from_secs(5));
        let mut engine = Engine::new(options, now).expect("valid");
        assert_eq!(engine.poll_connect(), None);
        assert_eq!(engine.poll_timeout(), Some(now));
        engine.handle_timeout(now);
        let connect = engine
            .poll_connect()
            .expect("the monitor's check opens a socket");
        assert_eq!(connect.address, ServerAddress::new("db", 27017));
    }

    /// Review32 R14 (SS-2): setting only `EngineOptions::heartbeat_frequency` moves the smallest
    /// `maxStalenessSeconds` (`heartbeatFrequencyMS + idleWritePeriodMS`, at least 90 s) too:
    /// with 100 s a maximum staleness of 100 s is refused at once (minimum 110 s); with the
    /// default 10 s (minimum 90 s) it is valid and the read waits for a secondary.
    #[test]
    fn the_engine_heartbeat_frequency_sets_the_smallest_max_staleness() {
        let read = |heartbeat: Duration| {
            let mut settings = TopologySettings::new(alloc::vec![ServerAddress::new("db", 27017)]);
            settings.replica_set = Some("rs".into());
            let mut options = EngineOptions::new(settings, HandshakeOptions::new());
            options.heartbeat_frequency = heartbeat;
            let mut engine = Engine::new(options, Instant::ZERO).expect("valid");
            let secondary =
                ReadPreference::new(ReadPreferenceMode::Secondary, Vec::new(), Some(100)).unwrap();
            let request = OperationRequest::new(
                "test",
                bson::doc! { "find": "c" },
                OperationKind::Read,
                SelectionCriteria::Read(secondary),
            );
            let op = engine.start_operation(request, Instant::ZERO);
            events(&mut engine).into_iter().find_map(|e| match e {
                EngineEvent::OperationFinished { op: o, result, .. } if o == op => Some(result),
                _ => None,
            })
        };
        assert!(
            read(DEFAULT_HEARTBEAT_FREQUENCY).is_none(),
            "still selecting"
        );
        let error = read(Duration::from_secs(100))
            .expect("ended at once")
            .unwrap_err();
        assert!(
            error.to_string().contains("(110000 ms)"),
            "the minimum follows the engine's heartbeat: {error}"
        );
    }
}
