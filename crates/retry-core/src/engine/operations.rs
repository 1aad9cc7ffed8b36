//! Operations: one retry machine (or hedging machine, see `hedged`) each, with its server
//! selection, checkout, command and reply per attempt slot.
//!
//! A retry machine's actions are routed: `SelectServer` to a [`ServerSelection`] over the topology
//! (or the cursor's or transaction's pinned server), `Dispatch` to a checkout from the server's
//! pool (or the pinned connection), `ReleaseConnection` to a check-in, `Finished` to the
//! operation's one `OperationFinished`. Replies and failures come back from the sockets and pools,
//! named by operation and slot: a retry machine has one slot, reused by each attempt; a hedging
//! machine one per copy.

use bson::RawDocumentBuf;

use super::encoded;
use super::hedged::Made;
use super::raw_reply::{self, ReplyFields};
use super::sessions::{
    append_command_fields, command_as_sent, prepare_attempt, session_timeout,
    socket_supports_sessions, strip_command_fields, AttemptFlags, AttemptSessions, Prepared,
};
use super::{
    command_for, last_server_id, pool_in, ConnId, CursorUse, Engine, EngineEvent, OpId, OpMachine,
    OpSession, Operation, OperationRequest, Owner, RunningRequest, ServerId, Slot, SPARE_OPS,
};
use crate::address::ServerAddress;
use crate::classify::is_unacknowledged;
use crate::connection::{ConnectionState, Request, SendError};
use crate::error::{ErrorKind, NetworkErrorKind, NetworkPhase, OperationError};
use crate::pinning::transaction_labels;
use crate::pool::{CheckoutId, Purpose};
use crate::read_preference_wire::{self, sent_preference, Sent};
use crate::retry::{
    Action, Attempt, AttemptServer, OperationKind, OperationSpec, RetryEvent, WriteConcernRule,
};
use crate::rng::EngineRng;
use crate::selection::{SelectionSettings, SelectionStep, ServerSelection};
use crate::time::Instant;
use crate::wire::append_read_preference;

use super::selection_cache::{SelectionCache, TrackedTopology};
use super::sockets::socket_settled;
use super::worklist::{schedule_pool, Machine, Served};
use alloc::collections::BTreeMap;

/// The usage error of an attempt whose pinned connection another operation is using (SE-10).
const PINNED_CONNECTION_IN_USE: &str =
    "the connection pinned to this session or cursor is in use by another operation";

/// SS-16: `slot` of `op` selected `server` (the selection loop's step, or its first poll from the
/// selection cache): the attempt goes on to its checkout, and `op` no longer waits for a topology
/// change. The caller schedules `op`. Inlined: a call costs the fast path ~40 instructions
/// (callgrind, `engine_scaling`).
#[inline(always)]
fn attempt_selected(
    op: &mut Operation,
    waiting: &mut alloc::collections::BTreeSet<OpId>,
    op_id: OpId,
    slot: usize,
    server: AttemptServer,
    now: Instant,
) {
    let state = &mut op.slots[slot];
    state.selection = None;
    state.wake = None;
    state.server = Some(server.clone());
    op.server_selected(slot, server, now);
    unwait(waiting, op_id);
}

/// SS-16: `op_id` no longer waits for a topology change. Nearly always none waits: the empty set
/// is not searched (issue 9: an out-of-line `BTreeSet::remove` per selection and per finish).
#[inline(always)]
fn unwait(waiting: &mut alloc::collections::BTreeSet<OpId>, op_id: OpId) {
    if !waiting.is_empty() {
        waiting.remove(&op_id);
    }
}

/// BP-27: the retry events held back until the attempt's connection was checked in go out.
/// Nearly always there are none: the check inlined, the rest not (issue 9).
#[inline(always)]
fn emit_held(
    events: &mut alloc::collections::VecDeque<EngineEvent>,
    op: OpId,
    held: &mut alloc::vec::Vec<RetryEvent>,
) {
    if !held.is_empty() {
        emit_held_events(events, op, held);
    }
}

#[inline(never)]
fn emit_held_events(
    events: &mut alloc::collections::VecDeque<EngineEvent>,
    op: OpId,
    held: &mut alloc::vec::Vec<RetryEvent>,
) {
    for event in held.drain(..) {
        events.push_back(EngineEvent::Operation { op, event });
    }
}

/// Issue 9: the first poll of a retry machine's selection for `slot`, from what is kept since
/// the last topology change (`selection_cache.rs`; the same server and draws as the loop's
/// first poll), with the operation at hand; whether it selected a server (the caller schedules
/// the operation). A hedged copy's always runs the loop.
#[inline(always)]
fn cached_selection(
    (cache, topology, rng): (&mut SelectionCache, &TrackedTopology, &mut EngineRng),
    (ids, servers, settings): (
        &BTreeMap<ServerAddress, ServerId>,
        &[super::Server],
        SelectionSettings,
    ),
    (op_id, op, slot): (OpId, &mut Operation, usize),
    waiting: &mut alloc::collections::BTreeSet<OpId>,
    now: Instant,
) -> bool {
    let OpMachine::Retry(machine) = &op.machine else {
        return false;
    };
    // SS-15: operations in flight per server, for the power-of-two choice.
    let count = |address: &ServerAddress| {
        ids.get(address)
            .map_or(0, |id| servers[id.0 as usize].in_flight)
    };
    let selected = cache.select(
        topology,
        &op.request.criteria,
        machine.deprioritized(),
        settings,
        count,
        rng,
    );
    let Some(server) = selected else {
        return false;
    };
    let server = AttemptServer::from_description(server, topology.description().topology_type);
    // CS-3: under CSOT the checkout waits until the selection's deadline at most.
    let timeout = op.request.timeout;
    op.slots[slot].selection_deadline = timeout
        .is_csot()
        .then(|| ServerSelection::deadline_from(&settings, timeout, now));
    attempt_selected(op, waiting, op_id, slot, server, now);
    true
}

/// SS-9, LB-6 (issue 9): where the attempt's `$readPreference` goes. When it is all the attempt
/// adds to the command and the command has none of its own to replace, it is written after the
/// command's fields (first of the appended ones, where inserting it would place it), without
/// building a document or copying the command: `(Some, None)`. Otherwise its document, to insert
/// into a copy of the command: `(None, Some)`. Not inlined: most commands send none.
#[inline(never)]
fn placed<'a>(
    sent: Sent<'a>,
    op: &Operation,
    attempt: &Attempt,
) -> (Option<Sent<'a>>, Option<bson::Document>) {
    let appendable = !attempt.start_transaction
        && attempt.write_concern != WriteConcernRule::Majority
        && !op.wire.body.contains_key("$readPreference")
        && !op.encoded_read_preference;
    match appendable {
        true => (Some(sent), None),
        false => (None, Some(read_preference_wire::to_document(sent))),
    }
}

/// SS-15: `slot`'s attempt is over: it is no longer counted on its server. Takes the slot and the
/// servers apart (disjoint borrows), so callers use the operation at hand (issue 9).
#[inline(always)]
fn end_attempt(slot: &mut Slot, servers: &mut [super::Server]) {
    slot.attempt = None;
    if let Some(server) = slot.counted.take() {
        let entry = &mut servers[server.0 as usize];
        entry.in_flight = entry.in_flight.saturating_sub(1);
    }
}

/// The engine's parts a checkout touches besides the operation: the servers, the topology (its
/// pools), the worklist, the checkout served at once and the pending checkouts.
type CheckoutParts<'a> = (
    &'a mut [super::Server],
    &'a mut TrackedTopology,
    &'a mut alloc::collections::VecDeque<Machine>,
    &'a mut Option<Served>,
    &'a mut super::id_table::Checkouts,
);

/// [`Engine::check_out`] with the operation at hand (issue 9: a retry machine's `Dispatch` checks
/// out without looking the operation up again); `false` when `server` is no longer part of the
/// topology, for the caller to fail the attempt.
#[inline(always)]
fn check_out_slot(
    (servers, topology, work, served, checkouts): CheckoutParts<'_>,
    options: &super::EngineOptions,
    (op_id, op, slot): (OpId, &mut Operation, usize),
    server: ServerId,
    attempt: Attempt,
    now: Instant,
) -> bool {
    let state = &mut op.slots[slot];
    end_attempt(state, servers);
    state.attempt = Some(attempt);
    state.counted = Some(server);
    let entry = &mut servers[server.0 as usize];
    entry.in_flight += 1;
    let (member, pool_queued) = (!entry.left, entry.pool_queued);
    // CS-3: under CSOT (`timeoutMS=0` included, CS-1) selection and checkout share one
    // `computedServerSelectionTimeout` = min(serverSelectionTimeoutMS, remaining), computed
    // when the attempt's selection started (review5 item 8; from now for an attempt that
    // selected nothing, a pinned one), and waitQueueTimeoutMS does not apply (TO-4, TO-8);
    // without CSOT, waitQueueTimeoutMS.
    let timeout = op.request.timeout;
    let selected = state.selection_deadline.take();
    let deadline = timeout.is_csot().then(|| {
        selected.unwrap_or_else(|| ServerSelection::deadline_from(&options.selection, timeout, now))
    });
    // LB-13: a cursor-creating command's connection may stay with its cursor.
    let purpose = if op.request.cursor == CursorUse::Open && options.topology.load_balanced {
        Purpose::Cursor
    } else {
        Purpose::Other
    };
    let Some(pool) = pool_in(servers, topology, server).filter(|_| member) else {
        return false;
    };
    // Issue 9: a retry machine's checkout served at once, with nothing on the worklist, gets
    // its pool's turn right after this one (`Served`), without the worklist and the table of
    // pending checkouts. (A hedged copy's keeps the worklist: its machine may check out
    // several copies in one turn.)
    let next = matches!(op.machine, OpMachine::Retry(_))
        && work.is_empty()
        && served.is_none()
        && !pool_queued;
    let (id, answer) = pool.check_out_served(purpose, deadline, now, next);
    op.slots[slot].checkout = Some((server, id));
    let entry = &mut servers[server.0 as usize];
    match answer {
        Some(connection) => {
            entry.pool_queued = true;
            *served = Some(Served {
                server,
                checkout: id,
                connection,
                op: op_id,
                slot,
            });
        }
        None => {
            checkouts.insert((server, id), (op_id, slot));
            schedule_pool(servers, work, server);
        }
    }
    true
}

/// [`Engine::release`] when nobody subscribes to the pool's events (its pool has none to move),
/// from the parts it touches (issue 9: the drain of a retry machine releases with the operation
/// at hand).
#[inline(always)]
fn release_quiet(
    (sockets, servers, topology): (
        &mut crate::id_table::IdTable<ConnId, super::Socket>,
        &mut [super::Server],
        &mut TrackedTopology,
    ),
    work: &mut alloc::collections::VecDeque<Machine>,
    conn: ConnId,
    healthy: bool,
    now: Instant,
) {
    let Some(socket) = sockets.get_mut(&conn) else {
        return;
    };
    socket.op = None;
    let (server, owner) = (socket.server, socket.owner);
    if let Owner::Pool(id) = owner {
        // Issue 9: what `flush_pool_events` asks of the pool, read with the pool at hand.
        let after = pool_in(servers, topology, server).map(|pool| {
            pool.check_in(id, healthy, now);
            debug_assert!(!pool.has_events(), "a pool records events nobody publishes");
            (pool.has_actions(), pool.poll_timeout())
        });
        let entry = &servers[server.0 as usize];
        let settled = entry.retired_pool.is_none()
            && after.is_some_and(|(actions, at)| !actions && at == entry.pool_timer);
        if !settled {
            schedule_pool(servers, work, server);
        }
    }
}

/// Why a request must not be sent whatever the servers' state (house rule 11, review32 R17): an
/// empty command, which has no name (WP-3), or an invalid database name. A byte scan of the
/// name and a length test of the command: the hot path's cost.
#[inline]
fn refused_request(request: &OperationRequest) -> Option<OperationError> {
    let empty = request.command.is_empty()
        && request
            .encoded
            .as_ref()
            .is_none_or(|raw| raw.as_bytes().len() <= 5);
    if empty {
        return Some(empty_command());
    }
    invalid_db_name(&request.db).map(|reason| bad_db_name(&request.db, reason))
}

/// The longest database name a server accepts, in bytes (its `DatabaseName::kMaxDatabaseNameLength`).
const MAX_DB_NAME_LEN: usize = 63;

/// Why a server refuses `db` as a command's `$db` (`InvalidNamespace`, "Invalid database name"),
/// or `None` when it accepts it: the server's `validDBName` as its command dispatch applies it
/// (`$` allowed, for `$external`): 1 to [`MAX_DB_NAME_LEN`] bytes, none of them NUL, `/`, `\`,
/// `.`, space or `"`. (A server on Windows also refuses `*<>:|?`, which is not checked here.)
fn invalid_db_name(db: &str) -> Option<&'static str> {
    if db.is_empty() {
        Some("it is empty")
    } else if db.len() > MAX_DB_NAME_LEN {
        Some("it is longer than 63 bytes")
    } else if db
        .bytes()
        .any(|b| matches!(b, 0 | b'/' | b'\\' | b'.' | b' ' | b'"'))
    {
        Some("it holds one of NUL, '/', '\\', '.', ' ' and '\"'")
    } else {
        None
    }
}

#[cold]
#[inline(never)]
fn empty_command() -> OperationError {
    OperationError::usage("the command is empty: its first key must name the command (WP-3)")
}

#[cold]
#[inline(never)]
fn bad_db_name(db: &str, reason: &str) -> OperationError {
    OperationError::usage(alloc::format!(
        "invalid database name {db:?}: {reason} (a server refuses it)"
    ))
}

/// The error of an attempt whose command was not sent: nothing was written and the connection
/// is as it was. A command that does not encode (a key holding a NUL byte, a message over
/// `maxMessageSizeBytes`) or breaks the `maxBsonObjectSize` limits (WP-7) is a usage error naming
/// the reason: never retried, and the connection goes back healthy (review32 R2, R11). A passed
/// deadline is a timeout before sending (CS-4); a connection not ready, an I/O error before
/// sending.
#[cold]
#[inline(never)]
fn not_sent(error: &SendError, address: &crate::address::ServerAddress) -> OperationError {
    let kind = match error {
        SendError::Encode(_) | SendError::BsonObjectTooLarge { .. } => {
            return OperationError::usage(alloc::format!("the command cannot be sent: {error}"));
        }
        SendError::DeadlinePassed => NetworkErrorKind::Timeout,
        _ => NetworkErrorKind::Io,
    };
    OperationError::network(kind, NetworkPhase::BeforeSend, address.clone())
}

/// WP-6, SE-13: whether `request` is an unacknowledged write sent with `moreToCome`: an
/// `insert`, `update` or `delete` run as a write whose write concern is unacknowledged (`w: 0`
/// without `j: true`): its `writeConcern`, else the encoded command's (`encoded`, from
/// [`encoded::inspect`]). Any other command with `w: 0` (a `findAndModify`, a generic command, a
/// read) awaits its reply as usual: its result is the server's, not a made-up `{ok: 1}`. Asked only
/// of a command that may carry no session (`launch`).
#[inline(never)]
fn unacknowledged_command(request: &OperationRequest, encoded: bool) -> bool {
    if !matches!(
        request.kind,
        OperationKind::RetryableWrite | OperationKind::NonRetryableWrite
    ) || !matches!(
        encoded::command_name(request.encoded.as_deref(), &request.command),
        b"insert" | b"update" | b"delete"
    ) {
        return false;
    }
    // A `writeConcern` beside an encoded command replaces the encoded one.
    match request.command.get("writeConcern") {
        Some(bson::Bson::Document(write_concern)) => is_unacknowledged(write_concern),
        Some(_) => false,
        None => encoded,
    }
}

/// How an operation's drain ended (`Engine::drain_operation`).
enum Drained {
    /// The operation is gone, or its machine refused nothing and its deadline is registered.
    Settled,
    /// Its refusal and its deadline are still to be seen to.
    Unsettled,
}

impl Engine {
    /// Starts an operation; its result comes as [`EngineEvent::OperationFinished`]. After
    /// [`Engine::close`] it finishes at once with [`crate::error::ErrorKind::Cancelled`]. A
    /// request the session rules refuse (an ended session, SE-10; a transaction without an
    /// explicit session; an explicit session with `w: 0`, SE-13; a transaction call in the wrong
    /// state, TX-2) finishes at once with a usage error. A request naming an explicit session is
    /// mapped through its transaction ([`Engine::start_transaction`]); a commit or abort of a
    /// transaction that wrote nothing finishes at once with an empty reply (TX-2). So does, with
    /// a usage error and nothing sent, a request a server would refuse whatever its state
    /// (house rule 11, review32 R17): an empty command (WP-3: its first key names it) or a
    /// database name a server refuses: empty, longer than 63 bytes, or holding NUL, `/`, `\`,
    /// `.`, space or `"` (the server's `validDBName`; `$` is allowed, for `$external`).
    #[inline]
    pub fn start_operation(&mut self, request: OperationRequest, now: Instant) -> OpId {
        if self.closed {
            let op = self.next_op_id();
            return self.finished_at_once(op, false, Err(OperationError::cancelled()));
        }
        if let Some(error) = refused_request(&request) {
            let op = self.next_op_id();
            return self.finished_at_once(op, false, Err(error));
        }
        self.launch(request, false, now)
    }

    /// Finishes `op` before it reaches any machine (closed engine, refused request, a
    /// transaction command with nothing to do, a cursor that is not open or LB-11 closes): its
    /// only event, with no server (issue 9 item 2: every operation ends exactly once). An
    /// `internal` operation reports none, as in `finish`.
    pub(super) fn finished_at_once(
        &mut self,
        op: OpId,
        internal: bool,
        result: Result<RawDocumentBuf, OperationError>,
    ) -> OpId {
        if !internal {
            self.events.push_back(EngineEvent::OperationFinished {
                op,
                result,
                address: None,
            });
        }
        op
    }

    /// TX-2: puts back the transaction state `before` of an operation that was refused after its
    /// mapping ([`Engine::transaction_request`]); a client-side error never changes the state.
    fn restore_transaction(
        &mut self,
        session: Option<super::SessionHandle>,
        before: Option<crate::transaction::Transaction>,
    ) {
        if let (Some(state), Some(before)) = (
            session.and_then(|handle| self.sessions.get_mut(&handle)),
            before,
        ) {
            state.transaction = before;
        }
    }

    fn next_op_id(&mut self) -> OpId {
        let op = OpId(self.next_op);
        self.next_op += 1;
        op
    }

    /// Starts an operation; `internal` for the engine's own (`endSessions` at close), which
    /// reports no `OperationFinished` and carries no session.
    pub(super) fn launch(
        &mut self,
        mut request: OperationRequest,
        internal: bool,
        now: Instant,
    ) -> OpId {
        let op = self.next_op_id();
        // SE-14, TX-1: a `getMore` runs in the session of the command that opened its cursor, and
        // in that session's transaction only when the cursor was opened in this very transaction
        // and it is still active (review6 finding 4: a real server refuses a getMore of a cursor
        // from outside the transaction, 50739, or from another one, 50741); otherwise it keeps
        // the cursor's own route and pins, without a txnNumber.
        // TX-1, SE-14 (review37 W1): whatever session the request names, membership is decided
        // from the cursor, so a getMore never starts a transaction nor joins one its cursor was
        // not opened in; a request naming another session than the cursor's is refused.
        // TX-1, SE-14 (engine21's leftover): a `killCursors` too. A real server runs one in the
        // transaction its cursor was opened in (its `killCursors` is allowed there, with the
        // transaction's txnNumber and `autocommit: false`), refuses one as a transaction's first
        // command (OperationNotSupportedInTransaction, 263), and kills a transaction's cursor
        // from outside it as well; so a killCursors, whatever session it names, carries the
        // transaction's fields (never `startTransaction`) only for a cursor opened in the
        // active transaction, and otherwise only the cursor's `lsid`.
        if let CursorUse::GetMore(handle) | CursorUse::Close(handle) = request.cursor {
            if let Some((session, opened_in)) = self
                .cursors
                .get_mut(&handle)
                .map(|c| (&c.session, c.transaction))
            {
                let session = match session {
                    OpSession::Explicit(session) => Some(*session),
                    _ => None,
                };
                if request.session.is_some_and(|named| Some(named) != session) {
                    let error = OperationError::usage(
                        "a getMore or killCursors must run in the session of the command that \
                         opened its cursor (SE-14)",
                    );
                    return self.finished_at_once(op, internal, Err(error));
                }
                let (joins, active) =
                    session
                        .and_then(|s| self.sessions.get(&s))
                        .map_or((false, false), |s| {
                            let active = s.transaction.is_active();
                            (
                                active && Some(s.transaction.generation()) == opened_in,
                                active,
                            )
                        });
                // TX-4 (5) (review7 finding 9): a getMore (or killCursors) naming its session
                // after the transaction ended uses the session outside a transaction, which
                // unpins it (the transaction's state stays as it is); an active transaction
                // keeps its pin.
                if let (Some(named), false, false) = (request.session, joins, active) {
                    let unpinned = self
                        .sessions
                        .get_mut(&named)
                        .and_then(|s| s.pin.non_transaction_operation());
                    self.transaction_unpinned(named, unpinned, now);
                }
                request.session = session.filter(|_| joins);
            }
        }
        // Issue 9: an encoded command is checked once, and converted to a document where the
        // session and transaction rules edit it (`encoded.rs`).
        let mut unacknowledged = false;
        let mut encoded_read_preference = false;
        if let Some(raw) = request.encoded.take() {
            let inspected = match encoded::inspect(&raw, &request.command) {
                Ok(inspected) => inspected,
                Err(error) => return self.finished_at_once(op, internal, Err(error)),
            };
            // Versioned-api spec: a caller's API field is replaced, so it must not stay encoded.
            let api_field = self.api.is_some() && inspected.api_field;
            if request.session.is_some() || inspected.engine_field || api_field {
                let fields = core::mem::take(&mut request.command);
                request.command = encoded::to_document(&raw, fields);
            } else {
                unacknowledged = inspected.unacknowledged;
                encoded_read_preference = inspected.read_preference;
                request.encoded = Some(raw);
            }
        }
        // TX-2 (review6 finding 5): a request refused below leaves the transaction as it was.
        let before = request
            .session
            .and_then(|handle| self.sessions.get(&handle))
            .map(|s| s.transaction);
        // TX-1, TX-2: an operation naming a session runs through its transaction.
        match self.transaction_request(&mut request) {
            Ok(true) => {}
            Ok(false) => return self.finished_at_once(op, internal, Ok(RawDocumentBuf::new())),
            Err(error) => return self.finished_at_once(op, internal, Err(error)),
        }
        let (mut session, gossip) = match self.operation_session(&request, unacknowledged) {
            Ok(session) => session,
            Err(error) => {
                self.restore_transaction(request.session, before);
                return self.finished_at_once(op, internal, Err(error));
            }
        };
        // WP-6 (SE-13): only a command that may carry no session can be an unacknowledged write
        // (an acknowledged operation pays this one test).
        let unacknowledged = matches!(session, OpSession::Never)
            && !internal
            && request.session.is_none()
            && unacknowledged_command(&request, unacknowledged);
        if internal {
            session = OpSession::Never;
        }
        let spec = OperationSpec {
            kind: request.kind,
            timeout: request.timeout,
            // RW-6: the engine allocates the number from the session after checkout; the retry
            // machine only says which attempts carry it (RW-2, RW-4), and a write that cannot
            // have a session gets none.
            txn_number: (!matches!(session, OpSession::Never)).then_some(1),
            min_wire_version: 0,
        };
        let (mut pinned_server, mut pinned_conn) = (None, None);
        if let CursorUse::GetMore(handle) | CursorUse::Close(handle) = request.cursor {
            match self.cursor_route(op, internal, handle, request.cursor, now) {
                Some((server, conn)) => {
                    pinned_server = Some(server);
                    pinned_conn = conn;
                    // SE-14: a cursor's commands use the session of the command that opened it.
                    session = self.take_cursor_session(handle);
                }
                None => {
                    self.restore_transaction(request.session, before);
                    self.run(now);
                    return op;
                }
            }
        }
        if let Some(session) = request.session {
            match self.session_route(session, request.kind, now) {
                Ok((server, conn)) => {
                    pinned_server = pinned_server.or(server);
                    pinned_conn = pinned_conn.or(conn);
                }
                // TX-3, TX-7, TX-4 (2) (review38 L6): its pinned mongos left the topology; the
                // statement ends at once, nothing sent, and the session is unpinned.
                Err(error) => {
                    self.finished_at_once(op, internal, Err(error));
                    self.run(now);
                    return op;
                }
            }
        }
        // TX-1, TX-2 (review6 finding 2): the transaction this statement belongs to.
        let transaction = match request.kind {
            OperationKind::InTransaction { .. } => request
                .session
                .and_then(|handle| self.sessions.get(&handle))
                .map(|s| s.transaction.generation()),
            _ => None,
        };
        // Issue 9: a finished operation's box, and its machine, when one is kept.
        let spare = self.spare_ops.pop();
        let machine = self.operation_machine(
            &request,
            &session,
            pinned_server.is_some() || internal,
            spec,
            now,
            spare,
        );
        // The command moves to `wire`, the rest stays (moving it out whole, not taking it, builds
        // no empty document in its place).
        let OperationRequest {
            db,
            command: mut body,
            kind,
            criteria,
            timeout,
            cursor,
            session: explicit,
            concerns_inherited: _,
            encoded,
        } = request;
        let request = RunningRequest {
            db,
            kind,
            criteria,
            timeout,
            cursor,
            session: explicit,
        };
        strip_command_fields(&mut body, self.api.as_ref());
        // RW-2, RW-4, SE-13 (review37 W2): the engine owns `txnNumber`: it sets one on retryable
        // writes and transaction commands only (`prepare_attempt`), so a caller's never reaches
        // the wire (a read or run-command with one is refused by a server, 50768; a standalone
        // refuses any, 20; a write with retryWrites=false would become retryable on the server).
        // Issue 9: one pass over the few top-level keys, no hashing, when there is none.
        if body.keys().any(|key| key == "txnNumber") {
            body.remove("txnNumber");
        }
        self.session_operation_started(&session);
        let slot = Slot {
            session,
            ..Slot::default()
        };
        let operation = match machine {
            Made::InSpare(mut spare) => {
                // Every field but the machine written (the pattern names them all).
                let Operation {
                    machine: _,
                    slots: spare_slots,
                    wire: spare_wire,
                    encoded: spare_encoded,
                    encoded_read_preference: spare_encoded_read_preference,
                    request: spare_request,
                    reply: spare_reply,
                    pinned_server: spare_pinned_server,
                    pinned_conn: spare_pinned_conn,
                    release_pinned: spare_release_pinned,
                    keep_conn: spare_keep_conn,
                    opened: spare_opened,
                    txn_number: spare_txn_number,
                    transaction: spare_transaction,
                    gossip: spare_gossip,
                    internal: spare_internal,
                    timer: spare_timer,
                    refused: spare_refused,
                    queued: spare_queued,
                } = &mut *spare;
                spare_slots.reset(slot);
                // Issue 9: the kept command's emptied document goes to the caller's next reply
                // (`Engine::take_document`).
                // `Request::new(body)` written field by field: the sequences `keep_operation`
                // emptied stay, rather than an empty list replacing them and being dropped.
                let Request {
                    body: spare_body,
                    sequences: spare_sequences,
                    unacknowledged: spare_unacknowledged,
                    exhaust_allowed: spare_exhaust_allowed,
                    deadline: spare_deadline,
                    under_timeout_ms: spare_under_timeout_ms,
                } = spare_wire;
                let emptied = core::mem::replace(spare_body, body);
                spare_sequences.clear();
                *spare_unacknowledged = false;
                *spare_exhaust_allowed = false;
                *spare_deadline = None;
                *spare_under_timeout_ms = false;
                // review23 R7: the refill is `Request::new`'s, whatever its defaults become.
                debug_assert_eq!(*spare_wire, Request::new(spare_wire.body.clone()));
                // WP-6: sent with `moreToCome`, no reply awaited.
                spare_wire.unacknowledged = unacknowledged;
                if self.spare_documents.len() < SPARE_OPS {
                    self.spare_documents.push(emptied);
                }
                *spare_encoded = encoded;
                *spare_encoded_read_preference = encoded_read_preference;
                *spare_request = request;
                *spare_reply = None;
                *spare_pinned_server = pinned_server;
                *spare_pinned_conn = pinned_conn;
                *spare_release_pinned = false;
                *spare_keep_conn = false;
                *spare_opened = None;
                *spare_txn_number = None;
                *spare_transaction = transaction;
                *spare_gossip = gossip;
                *spare_internal = internal;
                *spare_timer = None;
                *spare_refused = None;
                *spare_queued = false;
                spare
            }
            Made::Fresh(machine) => Box::new(Operation {
                machine,
                slots: super::slots::Slots::new(slot),
                wire: {
                    let mut wire = Request::new(body);
                    // WP-6: sent with `moreToCome`, no reply awaited.
                    wire.unacknowledged = unacknowledged;
                    wire
                },
                encoded,
                encoded_read_preference,
                request,
                reply: None,
                pinned_server,
                pinned_conn,
                release_pinned: false,
                keep_conn: false,
                opened: None,
                txn_number: None,
                transaction,
                gossip,
                internal,
                timer: None,
                refused: None,
                queued: false,
            }),
        };
        self.ops.insert(op, operation);
        self.run_input(Machine::Operation(op), now);
        op
    }

    /// Cancels `op` without running the worklist.
    pub(super) fn cancel(&mut self, op: OpId, now: Instant) {
        let Some(operation) = self.ops.get_mut(&op) else {
            return;
        };
        let machine = match &mut operation.machine {
            // A6-H3: the machine cancels every copy; its actions stop them.
            OpMachine::Hedging(machine) => {
                machine.cancel(now);
                self.schedule(Machine::Operation(op));
                return;
            }
            OpMachine::Retry(machine) => machine,
        };
        if let Err(error) = machine.cancel(now) {
            operation
                .refused
                .get_or_insert(super::refused::refusal(error));
        }
        let (pinned, session, kind) = (
            operation.pinned_conn,
            operation.request.session,
            operation.request.kind,
        );
        let slot = &mut operation.slots[0];
        let checkout = slot.checkout.take();
        slot.selection = None;
        slot.wake = None;
        let conn = slot.conn;
        let in_flight = conn
            .and_then(|conn| self.sockets.get_mut(&conn))
            .filter(|socket| socket.op == Some((op, 0)));
        let in_flight = in_flight.map(|socket| socket.command.take());
        if let Some(pending) = in_flight {
            // EV-1: a command in flight gets its failed event.
            if let Some(pending) = pending {
                self.command_failed(pending, &OperationError::cancelled(), now);
            }
            // SE-12: the connection closes under the command, as after a network error.
            self.mark_session_dirty(op, 0);
            // LB-9, LB-11, TX-4 (2), house rule 8 (review38 L1): a pinned connection (a cursor's,
            // a transaction's) is not released by the cancelled operation, so it would stay
            // busy with an orphaned command whose reply nobody reads: it closes now, as if the
            // peer had closed it; its cursors send no killCursors, and a transaction's next
            // command fails with a network error, which unpins it.
            if let Some(conn) = pinned.filter(|p| conn == Some(*p)) {
                self.pinned_attempt_cancelled(conn, now);
            }
        }
        // TX-4 (1) (review38 L1): an abortTransaction unpins whether it ran or not.
        if let (OperationKind::AbortTransaction, Some(session)) = (kind, session) {
            self.abort_unpinned(session, now);
        }
        self.waiting.remove(&op);
        self.schedule(Machine::Operation(op));
        if let Some((server, checkout)) = checkout {
            self.checkouts.remove(&(server, checkout));
            if let Some(pool) = self.pool_mut(server) {
                pool.cancel_checkout(checkout, now);
            }
            self.schedule(Machine::Pool(server));
        }
    }

    /// An operation's turn: its selection wake-ups, events and actions routed, then (house rule
    /// 8) an input its machine refused ends it, and its next deadline is registered. Issue 9: a
    /// retry machine's drain ends with the operation at hand, where it checks for a refusal and
    /// registers the deadline itself (`Drained::Settled`), rather than looking the operation up
    /// twice more; the operation's `queued` flag is cleared by the turn's first lookup.
    pub(super) fn drain_operation(&mut self, op_id: OpId, now: Instant) {
        let previous = self.draining;
        let drained = self.drain_retry(op_id, now);
        self.draining = previous;
        if let Drained::Unsettled = drained {
            // House rule 8: an input refused while draining (or before) ends the operation now.
            self.end_refused(op_id, now);
            self.refresh_operation_timer(op_id);
        }
    }

    /// The start of an operation's turn, with the operation at hand (the drain's first lookup,
    /// issue 9: `drain_operation` does not look it up apart): its flag cleared, then `None` to
    /// drain its retry machine, or how the turn ended: a refusal, a hedging machine (drained
    /// here) or a retry machine after its due selections looked again (drained by the caller,
    /// which looks the operation up again).
    #[inline(never)]
    fn start_drain(&mut self, op_id: OpId, now: Instant) -> Option<Drained> {
        let op = self.ops.get_mut(&op_id)?;
        op.queued = false;
        if op.refused.is_some() {
            return Some(Drained::Unsettled);
        }
        let hedged = matches!(op.machine, OpMachine::Hedging(_));
        // Which slots' waiting selections are due (at most 5).
        let mut due = op
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.wake.is_some_and(|w| now >= w))
            .fold(0_u32, |due, (i, _)| due | 1 << i);
        if due == 0 && !hedged {
            return None;
        }
        // A waiting selection that is due looks again.
        while due != 0 {
            let slot = due.trailing_zeros() as usize;
            due &= due - 1;
            self.poll_selection(op_id, slot, now);
        }
        if hedged {
            self.drain_hedged(op_id, now);
            return Some(Drained::Unsettled);
        }
        Some(Drained::Settled)
    }

    /// Routes a retry machine's events and actions until it has none left (after
    /// [`Engine::start_drain`]); `draining` is the operation meanwhile.
    fn drain_retry(&mut self, op_id: OpId, now: Instant) -> Drained {
        // BP-27: a retry event waits until the attempt's connection is checked in.
        // Issue 9: a `Vec`, which costs nothing until an event is held (only a machine that
        // records events retries with one); an inline array of events is set up and dropped
        // on every turn.
        let mut held: alloc::vec::Vec<RetryEvent> = alloc::vec::Vec::new();
        // Issue 9: the operation is looked up again only after an action that needs the whole
        // engine; the events and the actions done with the operation at hand (a selection the
        // cache or the pin answers, a wait) go on with it.
        let mut fresh = true;
        let drained = 'drain: loop {
            let Some(op) = self.ops.get_mut(&op_id) else {
                // Finished (or gone before its turn): nothing is left to refuse or to wait for.
                break Drained::Settled;
            };
            if fresh {
                fresh = false;
                // The start of the turn, with this lookup: nearly always nothing to do.
                if op.refused.is_some()
                    || matches!(op.machine, OpMachine::Hedging(_))
                    || op.slots.iter().any(|s| s.wake.is_some())
                {
                    let started = self.start_drain(op_id, now);
                    self.draining = Some(op_id);
                    match started {
                        None | Some(Drained::Settled) => continue 'drain,
                        Some(Drained::Unsettled) => break 'drain Drained::Unsettled,
                    }
                }
                op.queued = false;
                self.draining = Some(op_id);
            }
            loop {
                let OpMachine::Retry(machine) = &mut op.machine else {
                    break 'drain Drained::Unsettled;
                };
                if let Some(event) = machine.poll_event() {
                    match event {
                        _ if !self.options.events.publishes_retry() => {}
                        RetryEvent::RetryScheduled { .. } | RetryEvent::RetryDenied { .. } => {
                            held.push(event)
                        }
                        event => self
                            .events
                            .push_back(EngineEvent::Operation { op: op_id, event }),
                    }
                    continue;
                }
                // Issue 9: what the action does to the operation alone is done with the
                // operation at hand, not looked up again; it queues no engine event, so the held
                // events still go out before (or, for a release, after) the rest of the action.
                // One match of the polled option: the action is not moved out of it first.
                match machine.poll_action() {
                    None => {
                        // Issue 9: the operation at hand settles its turn (see
                        // `drain_operation`).
                        if op.refused.is_some() {
                            break 'drain Drained::Unsettled;
                        }
                        let at = op.next_deadline();
                        self.timers
                            .set(Machine::Operation(op_id), &mut op.timer, at);
                        break 'drain Drained::Settled;
                    }
                    Some(Action::SelectServer) => {
                        emit_held(&mut self.events, op_id, &mut held);
                        match op.pinned_server.clone() {
                            // A cursor's or a pinned transaction's operations go where the pin
                            // is.
                            Some(server) => {
                                op.slots[0].server = Some(server.clone());
                                op.server_selected(0, server, now);
                            }
                            None => {
                                // Its `schedule` would do nothing: the operation is being
                                // drained.
                                let selected = cached_selection(
                                    (&mut self.selection_cache, &self.topology, &mut self.rng),
                                    (&self.server_ids, &self.servers, self.options.selection),
                                    (op_id, op, 0),
                                    &mut self.waiting,
                                    now,
                                );
                                if !selected {
                                    self.select(op_id, 0, now);
                                    continue 'drain;
                                }
                            }
                        }
                    }
                    Some(Action::Dispatch(attempt)) => {
                        let pinned = op.pinned_conn;
                        emit_held(&mut self.events, op_id, &mut held);
                        // Issue 9: to the last server an attempt went to (nearly always), the
                        // checkout is made with the operation at hand (`Engine::dispatch`).
                        let last = match pinned {
                            None => last_server_id(&self.last_server, &attempt.address),
                            Some(_) => None,
                        };
                        let Some(server) = last else {
                            self.dispatch(op_id, attempt, pinned, now);
                            continue 'drain;
                        };
                        let parts = (
                            &mut self.servers[..],
                            &mut self.topology,
                            &mut self.work,
                            &mut self.served,
                            &mut self.checkouts,
                        );
                        let slot = (op_id, &mut **op, 0);
                        if !check_out_slot(parts, &self.options, slot, server, attempt, now) {
                            self.server_left(op_id, 0, server, now);
                            continue 'drain;
                        }
                    }
                    Some(Action::ReleaseConnection { close }) => {
                        let slot = &mut op.slots[0];
                        slot.checkout = None;
                        let conn = slot.conn.take();
                        end_attempt(slot, &mut self.servers);
                        // A pinned connection goes back only when this operation ended its pin;
                        // one this operation's cursor or transaction now owns stays checked out
                        // (LB-10, TX-5); any other goes back (BP-27).
                        let release = match op.pinned_conn {
                            Some(pinned) => op.release_pinned.then_some(pinned),
                            None => conn.filter(|_| !op.keep_conn),
                        };
                        let Some(conn) = release else {
                            emit_held(&mut self.events, op_id, &mut held);
                            continue;
                        };
                        // Issue 9: with nobody subscribed to the pool's events, the check-in
                        // touches neither the operations nor the events: the operation stays at
                        // hand.
                        if self.options.events.contains(super::EventFamilies::POOL) {
                            self.release(conn, !close, now);
                            emit_held(&mut self.events, op_id, &mut held);
                            continue 'drain;
                        }
                        let parts = (&mut self.sockets, &mut self.servers[..], &mut self.topology);
                        release_quiet(parts, &mut self.work, conn, !close, now);
                        emit_held(&mut self.events, op_id, &mut held);
                    }
                    Some(Action::Wait { .. }) => emit_held(&mut self.events, op_id, &mut held),
                    Some(Action::Finished(result)) => {
                        let cursor = (op.request.cursor, op.release_pinned);
                        emit_held(&mut self.events, op_id, &mut held);
                        self.finish_with(op_id, result, 0, cursor, now);
                        // Finished: nothing is left to refuse or to wait for (issue 9: no lookup
                        // that would find the operation gone).
                        break 'drain Drained::Settled;
                    }
                }
            }
        };
        emit_held(&mut self.events, op_id, &mut held);
        super::let_go(held);
        drained
    }

    /// A retry machine's `Dispatch`: on the pinned connection, or checked out of the server's
    /// pool.
    #[inline(never)]
    fn dispatch(&mut self, op_id: OpId, attempt: Attempt, pinned: Option<ConnId>, now: Instant) {
        let server = self.server_id(&attempt.address);
        let Some(pinned) = pinned else {
            return self.check_out(op_id, 0, server, attempt, now);
        };
        self.set_attempt(op_id, 0, server, attempt);
        match self.sockets.contains_key(&pinned) {
            true => self.send_attempt(op_id, 0, pinned, now),
            false => {
                let address = self.server(server).address.clone();
                let error = OperationError::network(
                    NetworkErrorKind::Closed,
                    NetworkPhase::BeforeSend,
                    address,
                );
                self.fail_attempt(op_id, 0, error, false, now);
            }
        }
    }

    /// Starts the server selection of `slot`, avoiding the machine's deprioritized servers
    /// (SS-11, A6-H7).
    pub(super) fn start_selection(&mut self, op_id: OpId, slot: usize, now: Instant) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        let selected = cached_selection(
            (&mut self.selection_cache, &self.topology, &mut self.rng),
            (&self.server_ids, &self.servers, self.options.selection),
            (op_id, op, slot),
            &mut self.waiting,
            now,
        );
        match selected {
            true => self.schedule(Machine::Operation(op_id)),
            false => self.select(op_id, slot, now),
        }
    }

    /// [`Engine::start_selection`] after the selection cache had no answer: the selection loop.
    #[inline(never)]
    fn select(&mut self, op_id: OpId, slot: usize, now: Instant) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        let selection = ServerSelection::new(
            op.request.criteria.clone(),
            op.machine.deprioritized(),
            self.options.selection,
            op.request.timeout,
            now,
        );
        op.slots[slot].selection_deadline = Some(selection.deadline());
        op.slots[slot].selection = Some(Box::new(selection));
        self.poll_selection(op_id, slot, now);
    }

    /// Checks a connection to `server` out for `slot`'s `attempt` (SS-15 counts it there).
    /// Issue 9: one lookup of the operation for both.
    pub(super) fn check_out(
        &mut self,
        op_id: OpId,
        slot: usize,
        server: ServerId,
        attempt: Attempt,
        now: Instant,
    ) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        let parts = (
            &mut self.servers[..],
            &mut self.topology,
            &mut self.work,
            &mut self.served,
            &mut self.checkouts,
        );
        if !check_out_slot(
            parts,
            &self.options,
            (op_id, op, slot),
            server,
            attempt,
            now,
        ) {
            self.server_left(op_id, slot, server, now);
        }
    }

    /// The attempt of `slot` checks out of a server that is no longer part of the topology.
    #[inline(never)]
    fn server_left(&mut self, op_id: OpId, slot: usize, server: ServerId, now: Instant) {
        let address = self.server(server).address.clone();
        let error = OperationError::server_selection(alloc::format!(
            "{address} is no longer part of the topology"
        ));
        self.fail_attempt(op_id, slot, error, false, now);
    }

    /// The operation is over: its one `OperationFinished`; the reply is `winner`'s (the slot of
    /// the hedged copy that succeeded; 0 for a retry machine).
    pub(super) fn finish(
        &mut self,
        op_id: OpId,
        result: Result<(), OperationError>,
        winner: usize,
        now: Instant,
    ) {
        let Some(op) = self.ops.get(&op_id) else {
            return;
        };
        let cursor = (op.request.cursor, op.release_pinned);
        self.finish_with(op_id, result, winner, cursor, now);
    }

    /// [`Engine::finish`] of an operation whose cursor use and `release_pinned` the caller read
    /// (issue 9: with the operation at hand).
    fn finish_with(
        &mut self,
        op_id: OpId,
        result: Result<(), OperationError>,
        winner: usize,
        (cursor, release_pinned): (CursorUse, bool),
        now: Instant,
    ) {
        // LB-10: closing a cursor gives its connection back whatever killCursors did.
        if let (CursorUse::Close(handle), false) = (cursor, release_pinned) {
            if let Some(cursor) = self.cursors.remove(&handle) {
                if let Some(conn) = cursor.conn.filter(|c| !self.conn_held(*c)) {
                    self.release_unless_in_flight(conn, true, now);
                }
                self.cursor_session_ended(cursor.session, now);
            }
        }
        unwait(&mut self.waiting, op_id);
        let Some(mut op) = self.ops.remove(&op_id) else {
            return;
        };
        let (servers, checkouts) = (&mut self.servers, &mut self.checkouts);
        op.slots.iter_mut().for_each(|slot| {
            end_attempt(slot, servers);
            if let Some(key) = slot.checkout.take() {
                checkouts.remove(&key);
            }
        });
        self.timers
            .set(Machine::Operation(op_id), &mut op.timer, None);
        self.operation_session_ended(&mut op, winner, result.is_ok(), now);
        // Issue 9: what the event needs is taken out of the box, which is kept for the next
        // operation (`keep_operation`).
        let (internal, opened, reply) = (op.internal, op.opened.take(), op.reply.take());
        // RW-3: the server that sent a success's reply (a reply the engine made has none).
        let address = match (&result, reply.as_ref(), internal) {
            (Ok(()), Some(_), false) => op
                .slots
                .get(winner)
                .and_then(|slot| slot.server.as_ref())
                .map(|server| server.address.clone()),
            _ => None,
        };
        self.keep_operation(op);
        if internal {
            return;
        }
        if let Some(cursor) = opened.filter(|_| result.is_ok()) {
            self.events
                .push_back(EngineEvent::CursorOpened { op: op_id, cursor });
        }
        let result = result.map(|()| reply.unwrap_or_default());
        self.events.push_back(EngineEvent::OperationFinished {
            op: op_id,
            result,
            address,
        });
    }

    /// `slot`'s attempt is on `server` (SS-15 counts it there).
    pub(super) fn set_attempt(
        &mut self,
        op_id: OpId,
        slot: usize,
        server: ServerId,
        attempt: Attempt,
    ) {
        if let Some(op) = self.ops.get_mut(&op_id) {
            let slot = &mut op.slots[slot];
            end_attempt(slot, &mut self.servers);
            slot.attempt = Some(attempt);
            slot.counted = Some(server);
            self.servers[server.0 as usize].in_flight += 1;
        }
    }

    pub(super) fn clear_attempt(&mut self, op_id: OpId, slot: usize) {
        if let Some(op) = self.ops.get_mut(&op_id) {
            end_attempt(&mut op.slots[slot], &mut self.servers);
        }
    }

    /// Runs one pass of the selection loop of an operation's slot.
    fn poll_selection(&mut self, op_id: OpId, slot_index: usize, now: Instant) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        let hedged = matches!(op.machine, OpMachine::Hedging(_));
        let slot = &mut op.slots[slot_index];
        slot.wake = None;
        let Some(selection) = slot.selection.as_mut() else {
            self.waiting.remove(&op_id);
            return;
        };
        let (ids, servers) = (&self.server_ids, &self.servers);
        // SS-15: operations in flight per server, for the power-of-two choice.
        let count = |address: &ServerAddress| {
            ids.get(address)
                .map_or(0, |id| servers[id.0 as usize].in_flight)
        };
        match selection.poll(self.topology.description(), count, &mut self.rng, now) {
            SelectionStep::Selected(server) => {
                let server = AttemptServer::from_description(
                    server,
                    self.topology.description().topology_type,
                );
                attempt_selected(op, &mut self.waiting, op_id, slot_index, server, now);
            }
            SelectionStep::Wait { until, .. } => {
                slot.wake = Some(until);
                self.waiting.insert(op_id);
                // Only the members have monitors: servers that left are not visited.
                let mut members: smallvec::SmallVec<[ServerId; 8]> =
                    self.server_ids.values().copied().collect();
                members.sort_unstable();
                for server in members {
                    if let Some(state) = self.server_mut(server).monitor.as_mut() {
                        state.monitor.request_immediate_check(now);
                        self.schedule(Machine::Monitor(server));
                    }
                }
            }
            SelectionStep::Failed(error) => {
                slot.selection = None;
                self.waiting.remove(&op_id);
                let error = OperationError::server_selection(error.to_string());
                self.fail_attempt(op_id, slot_index, error, true, now);
            }
        }
        self.schedule(Machine::Operation(op_id));
        if hedged {
            self.start_queued_selection(op_id, now);
        }
    }

    /// Writes the command of `slot`'s attempt on its checked-out connection.
    pub(super) fn send_attempt(&mut self, op_id: OpId, slot: usize, conn: ConnId, now: Instant) {
        self.send_checked_out(op_id, slot, conn, None, now);
    }

    /// [`Engine::send_attempt`], when `checkout` is `None` or the slot still waits for that
    /// checkout (issue 9: `run_served` asks with the same lookup); whether it did.
    pub(super) fn send_checked_out(
        &mut self,
        op_id: OpId,
        slot: usize,
        conn: ConnId,
        checkout: Option<(ServerId, CheckoutId)>,
        now: Instant,
    ) -> bool {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return false;
        };
        if checkout.is_some() && op.slots.get(slot).map(|s| s.checkout) != Some(checkout) {
            return false;
        }
        let slot_state = &mut op.slots[slot];
        slot_state.checkout = None;
        slot_state.conn = Some(conn);
        let with_txn_number = slot_state.attempt.as_ref().map(|a| a.txn_number.is_some());
        // A cancelled copy writes nothing; its cancellation checks the connection in.
        if !op.machine.is_live(slot) {
            self.schedule(Machine::Operation(op_id));
            return true;
        }
        // SE-10 (review item 5): a connection pinned to a session or cursor that another
        // operation is using (concurrent use of one session or cursor) is left alone, so that
        // operation keeps its reply; this attempt fails with a usage error, a client-side error
        // that changes no transaction state (TX-2) and dirties no session.
        // One socket lookup for what the attempt needs of its connection: in use, sessions
        // supported (SE-1), and the server's minimum RTT (CS-4); issue 9: the socket and the
        // operation stay at hand until the command is written.
        let load_balanced = self.options.topology.load_balanced;
        let socket = self.sockets.get_mut(&conn);
        let (busy, supports_sessions, min_rtt) = match socket.as_deref() {
            Some(s) => (
                s.op.is_some() || s.machine.state() == ConnectionState::InFlight,
                socket_supports_sessions(s, load_balanced),
                self.servers[s.server.0 as usize]
                    .monitor
                    .as_ref()
                    .map_or(core::time::Duration::ZERO, |m| m.monitor.min_rtt()),
            ),
            None => (false, false, core::time::Duration::ZERO),
        };
        if busy {
            op.slots[slot].conn = None;
            // TX-2 (review38 L3): a commit refused here was never sent; the client-side error
            // leaves the transaction as it was before the call.
            if let (OperationKind::CommitTransaction { again }, Some(session)) =
                (op.request.kind, op.request.session)
            {
                if let Some(state) = self.sessions.get_mut(&session) {
                    state.transaction.commit_not_sent(again);
                }
            }
            // TX-4 (1) (review38 L3): through the transaction rules, so that a refused
            // abortTransaction unpins (a usage error adds no label: statements and commits keep
            // their pin); the operation in flight keeps the connection and checks it in.
            let error = OperationError::usage(PINNED_CONNECTION_IN_USE);
            self.fail_attempt(op_id, slot, error, false, now);
            return true;
        }
        let Some(with_txn_number) = with_txn_number else {
            return true;
        };
        let parts = AttemptSessions {
            timeout: session_timeout(&self.topology, load_balanced),
            load_balanced,
            sessions: &mut self.sessions,
            session_pool: &mut self.session_pool,
            rng: &mut self.rng,
            cluster_clock: &self.cluster_clock,
        };
        let flags = AttemptFlags {
            supports_sessions,
            with_txn_number,
        };
        let lsid = match prepare_attempt(parts, op, slot, flags, min_rtt, now) {
            Prepared::Send(lsid) => lsid,
            Prepared::Expired => {
                // CS-4, TO-10: not sent; the connection goes back and the operation times out.
                op.expired_before_send(slot, now);
                self.schedule(Machine::Operation(op_id));
                return true;
            }
            Prepared::Refused(error) => {
                self.fail_attempt(op_id, slot, error, false, now);
                return true;
            }
            // RW-14: the retry machine released the connection and ended the operation.
            Prepared::Withdrawn => {
                self.schedule(Machine::Operation(op_id));
                return true;
            }
        };
        let Some(attempt) = op.slots[slot].attempt.as_ref() else {
            return true;
        };
        let deadline = op.request.timeout.deadline();
        // SS-9, LB-6: the read preference goes on the wire as the server's type requires.
        let read_preference = op.slots[slot].server.as_ref().and_then(|server| {
            sent_preference(
                &op.request.criteria,
                server.topology_type,
                server.server_type,
            )
        });
        // Issue 9: appended after the command's fields when it is all the attempt adds.
        let (appended, inserted) = match read_preference {
            Some(sent) => placed(sent, op, attempt),
            None => (None, None),
        };
        let mut modified =
            command_for(op.encoded.as_deref(), &op.wire.body, attempt, inserted).map(Request::new);
        let request = match modified.as_mut() {
            Some(request) => {
                // WP-6: a modified command of an unacknowledged write is still sent unacknowledged.
                request.unacknowledged = op.wire.unacknowledged;
                request
            }
            None => &mut op.wire,
        };
        request.deadline = deadline;
        // TO-8: under timeoutMS (0 included) socketTimeoutMS does not apply.
        request.under_timeout_ms = op.request.timeout.is_csot();
        // EV-2: the command as sent, for the started event.
        let published = self.options.command_monitoring.then(|| {
            command_as_sent(
                op.encoded.as_deref(),
                &request.body,
                appended.map(read_preference_wire::to_document),
                &op.request.db,
                lsid,
                self.api.as_ref(),
            )
        });
        let Some(socket) = socket else {
            return true;
        };
        socket.op = Some((op_id, slot));
        let db = op.request.db.as_str();
        let api = self.api.as_ref();
        let sent = socket
            .machine
            .send_with(request, op.encoded.as_deref(), now, |out| {
                if let Some(sent) = appended {
                    append_read_preference(sent, out)?;
                }
                append_command_fields(db, lsid, api, out)
            });
        let failed = match &sent {
            Ok(_) => None,
            Err(e) => {
                socket.op = None;
                Some(not_sent(e, &socket.address))
            }
        };
        // Issue 9: the socket's turn, with the socket at hand (`socket_settled`); it touches
        // neither the operation nor the events, so it may come before the rest.
        let next = self.work.is_empty() && self.served.is_none();
        let socket_done = socket_settled(next, conn, socket, &mut self.transmits, &mut self.timers);
        let mut settled = false;
        if let Ok(request_id) = sent {
            op.sent(slot, now);
            settled = op.settled_after_send();
            // TX-2: a transaction is in progress once its first command is written (only a
            // transaction's first command; issue 9: no lookup for the others).
            if matches!(
                op.request.kind,
                OperationKind::InTransaction { first: true, .. }
            ) {
                self.transaction_command_sent(op_id, slot);
            }
            if let Some(command) = published {
                self.command_started(op_id, conn, request_id, &command, now);
            }
        }
        if !socket_done {
            self.schedule(Machine::Socket(conn));
        }
        // Issue 9: no turn that would do nothing.
        if !settled {
            self.schedule(Machine::Operation(op_id));
        }
        if let Some(error) = failed {
            self.fail_attempt(op_id, slot, error, false, now);
        }
        true
    }

    /// WP-6, EV-4: the caller took the bytes of the unacknowledged write (`moreToCome`) on
    /// `conn`, written at `sent_at` ([`Engine::poll_transmit`]). No reply will come, so the
    /// attempt ends here as if the server had replied `{ok: 1}`: its `CommandSucceeded` carries
    /// that reply (no `n`), the connection is checked in healthy (ready for the next command,
    /// the bytes already handed over stay ahead of it), and the operation finishes with
    /// `{ok: 1}`; then the worklist runs. `poll_transmit` takes no clock: everything is stamped
    /// `sent_at`, the instant of the input that wrote the command. Nothing is done when no
    /// operation waits on the connection (one that was cancelled or timed out closed it).
    #[cold]
    #[inline(never)]
    pub(super) fn unacknowledged_handed_over(&mut self, conn: ConnId, sent_at: Instant) {
        let Some(op) = self
            .sockets
            .get(&conn)
            .filter(|socket| matches!(socket.owner, Owner::Pool(_)))
            .and_then(|socket| socket.op)
        else {
            return;
        };
        let mut top = crate::reply::TopFields::default();
        top.ok = true;
        self.attempt_replied(op, conn, bson::rawdoc! { "ok": 1 }, top, sent_at);
        self.run(sent_at);
    }

    /// A reply to the attempt's command: an error goes to SDAM error handling and the retry rules,
    /// a success to the cursor and transaction pins.
    pub(super) fn attempt_replied(
        &mut self,
        (op_id, slot): (OpId, usize),
        conn: ConnId,
        body: RawDocumentBuf,
        top: crate::reply::TopFields,
        now: Instant,
    ) {
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        socket.op = None;
        let (server, owner) = (socket.server, socket.owner);
        // The reply stays encoded: what the engine needs is read in place (`raw_reply.rs`), where
        // the decoder noted it.
        let fields = ReplyFields::noted(&body, &top);
        let error = fields.error(&body, &socket.address);
        if let Some(pending) = socket.command.take() {
            self.command_replied(pending, &raw_reply::to_document(&body), now);
        }
        if let (Some(error), Owner::Pool(id)) = (&error, owner) {
            let context = self.error_context(server, id, true);
            self.application_error(server, error, context, now);
        }
        let Some(mut op) = self.ops.get_mut(&op_id) else {
            return;
        };
        // SE-16, SE-18, SE-21, TX-6: only an explicit session or a gossiped `$clusterTime` takes
        // anything from the reply (issue 9: no lookups for nothing).
        let explicit = matches!(
            op.slots.get(slot).map(|s| &s.session),
            Some(OpSession::Explicit(_))
        );
        if explicit || (op.gossip && fields.cluster_time.is_some()) {
            self.session_replied(op_id, slot, &fields);
            let Some(again) = self.ops.get_mut(&op_id) else {
                return;
            };
            op = again;
        }
        // A copy cancelled meanwhile: its cancellation checks the connection in.
        if !op.machine.is_live(slot) {
            self.schedule(Machine::Operation(op_id));
            return;
        }
        match error {
            Some(error) => {
                self.transaction_error_reply(op_id, conn, &error);
                self.fail_attempt(op_id, slot, error, false, now);
            }
            None => {
                let cursor_id = fields.cursor_id;
                op.reply = Some(body);
                op.succeeded(slot, now);
                // Issue 9: scheduled with the operation at hand (`Engine::schedule`).
                if self.draining != Some(op_id) && !op.queued {
                    op.queued = true;
                    self.work.push_back(Machine::Operation(op_id));
                }
                // LB-10, TX-3, TX-5: only a cursor's operation, or one in an explicit session,
                // has pins to update (issue 9: no lookups for nothing).
                let (cursor, session) = (op.request.cursor, op.request.session);
                if cursor != CursorUse::None {
                    self.cursor_replied(op_id, slot, conn, cursor_id.unwrap_or(0));
                }
                if session.is_some() {
                    self.transaction_succeeded(op_id, conn, now);
                }
            }
        }
    }

    /// Hands a failure to the operation's retry machine, after the transaction rules: the driver's
    /// TX-7/TX-8 labels, and TX-4 (1–3) unpinning before a retry selects a server.
    pub(super) fn fail_attempt(
        &mut self,
        op_id: OpId,
        slot: usize,
        error: OperationError,
        selection: bool,
        now: Instant,
    ) {
        self.session_failed(op_id, slot, &error);
        let Some(op) = self.ops.get(&op_id) else {
            return;
        };
        let (kind, session) = (op.request.kind, op.request.session);
        let mut error = error;
        if let (Some(command), Some(session)) = (Engine::transaction_command(kind), session) {
            // TX-8, RW-9, TX-4 (3) (review38 L2): a commit's or abort's error from a server older
            // than 4.4, which never labels its errors, is a retryable write error when the driver
            // would label it so (the retry machine adds that label later); the commit's
            // UnknownTransactionCommitResult, and the unpin before its retry, follow from it.
            if command != crate::pinning::TransactionCommand::Statement
                && !error.is_retryable_write()
            {
                let labelled = op.slots[slot].server.as_ref().is_some_and(|server| {
                    let from_mongos = server.server_type == crate::topology::ServerType::Mongos;
                    error.needs_retryable_write_label(server.max_wire_version, from_mongos)
                });
                if labelled {
                    error.labels = error.labels.union(crate::error::Labels::RETRYABLE_WRITE);
                }
            }
            error = error
                .clone()
                .with_labels(transaction_labels(&error, command));
            let unpinned = self
                .sessions
                .get_mut(&session)
                .and_then(|s| s.pin.command_failed(command, &error));
            if unpinned.is_some() {
                // House rule 8 (review5 item 1): the connection this attempt ran on goes back
                // once, by the machine's `ReleaseConnection` after the retry decision (BP-27);
                // only a pinned connection the attempt did not hold is checked in here.
                // A cursor of the transaction still using it keeps it (LB-10).
                let own = self.ops.get(&op_id).and_then(|op| op.slots[slot].conn);
                let pinned = self.unpinned_conn(session, unpinned);
                let healthy = !matches!(error.kind, ErrorKind::Network(_));
                let kept = match pinned {
                    Some(conn) if Some(conn) != own => {
                        self.transaction_released(conn, healthy, now);
                        false
                    }
                    Some(conn) => self.keep_for_cursor(conn),
                    None => false,
                };
                if let Some(op) = self.ops.get_mut(&op_id) {
                    op.pinned_server = None;
                    op.pinned_conn = None;
                    op.keep_conn = false;
                    if kept {
                        op.slots[slot].conn = None;
                    }
                }
            } else if crate::pinning::TransactionPin::unpins(command, &error) {
                // TX-4 (1)-(3), house rule 8 (lb21, found by engine_properties' shared LB
                // session): the session's pin went meanwhile (a command of the session run
                // alongside, SE-10, unpinned it and let its connection go), so this operation's
                // retry selects anew too: kept on a pinned connection whose socket is gone, a
                // commit retried without limit under `timeoutMS=0` failed before sending, at
                // once, for ever.
                if let Some(op) = self.ops.get_mut(&op_id) {
                    op.pinned_server = None;
                    op.pinned_conn = None;
                }
            }
        }
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        if selection {
            op.selection_failed(slot, error, now);
        } else {
            op.failed(slot, error, now);
        }
        self.schedule(Machine::Operation(op_id));
    }

    /// Checks a connection back in (BP-27: before any backoff, and its `CheckedIn` event before
    /// the retry's), or closes it.
    pub(super) fn release(&mut self, conn: ConnId, healthy: bool, now: Instant) {
        if self.options.events.contains(super::EventFamilies::POOL) {
            return self.release_published(conn, healthy, now);
        }
        let parts = (&mut self.sockets, &mut self.servers[..], &mut self.topology);
        release_quiet(parts, &mut self.work, conn, healthy, now);
    }

    /// [`Engine::release`] for a subscriber to the pool's events.
    #[inline(never)]
    fn release_published(&mut self, conn: ConnId, healthy: bool, now: Instant) {
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        socket.op = None;
        let (server, owner) = (socket.server, socket.owner);
        if let Owner::Pool(id) = owner {
            // Issue 9: what `flush_pool_events` asks of the pool, read with the pool at hand.
            let after = pool_in(&mut self.servers, &mut self.topology, server).map(|pool| {
                pool.check_in(id, healthy, now);
                (pool.has_actions(), pool.poll_timeout())
            });
            self.move_pool_events(server);
            let entry = &self.servers[server.0 as usize];
            let settled = entry.retired_pool.is_none()
                && after.is_some_and(|(actions, at)| !actions && at == entry.pool_timer);
            if !settled {
                self.schedule(Machine::Pool(server));
            }
        }
    }
}
