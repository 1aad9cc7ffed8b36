//! Sessions and timeouts on the wire: the server session an operation's commands carry (implicit
//! or explicit), its `txnNumber`, `$clusterTime` gossip, `maxTimeMS`, and `endSessions` at close.
//!
//! The call sequence is the one of [`crate::session`]'s module docs: a session is taken only
//! after checkout, on a connection whose own handshake supports sessions (SE-7, SE-8); every
//! attempt carries its `lsid`, the operation's `txnNumber` (allocated once, RW-6, RW-7) and the
//! greater of the client's and the session's `$clusterTime` (SE-17); every reply advances them
//! (SE-16, SE-18); an explicit session is causally consistent: its replies' `operationTime`
//! goes on its later reads as `readConcern.afterClusterTime` (SE-21); a network error marks the
//! session dirty (SE-12); the operation's end returns it to the pool, or to the cursor it opened
//! (SE-9, SE-14); an explicit session ends after its last operation (SE-12). Each step is a
//! lookup by operation, cursor or session handle: no step looks at unrelated operations.

use bson::raw::RawDocument;
use bson::{Bson, Document};

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use super::api_version::ApiFields;
use super::encoded;
use super::raw_reply::ReplyFields;
use super::selection_cache::TrackedTopology;
use super::{
    Engine, OpId, OpSession, Operation, OperationRequest, Session, SessionHandle, SessionInfo,
};
use crate::classify::is_unacknowledged;
use crate::error::{ErrorKind, OperationError};
use crate::max_time::{get_more_max_time_ms, max_time_ms, MaxTime};
use crate::retry::OperationKind;
use crate::rng::EngineRng;
use crate::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use crate::session::{
    connection_supports_sessions, ClusterClock, ClusterTime, ServerSession, SessionId, SessionPool,
    SessionTimeout, SESSIONS_UNSUPPORTED,
};
use crate::time::{Instant, OperationTimeout};
use crate::transaction::{Step, TransactionOptions, TransactionState};
use crate::wire::{append_db, append_lsid, EncodeError};

/// TX-2 (review6 finding 2): a statement whose transaction was committed or aborted (or replaced
/// by a new one) before it could be sent.
const TRANSACTION_ENDED: &str =
    "the transaction this command belongs to ended before the command could be sent";

/// TX-1 (review6 finding 2): a second command written as a transaction's first one while another
/// first command already started the transaction.
const ALREADY_STARTED: &str = "another command already started this transaction; a \
     transaction's commands must not race to start it (send its first command, then the others)";

/// What [`prepare_attempt`] decided about an attempt about to be written.
pub(super) enum Prepared {
    /// Send it, with the `lsid` of this session id, if any ([`append_command_fields`]).
    Send(Option<SessionId>),
    /// CS-4: the remaining time is not more than the minimum RTT; do not send it.
    Expired,
    /// The retry machine withdrew the attempt (a retry that cannot carry its `txnNumber`, RW-14);
    /// its actions release the connection and end the operation.
    Withdrawn,
    /// It cannot be sent (an ended or unsupported explicit session, SE-8, SE-10).
    Refused(OperationError),
}

/// The fields the engine writes at the end of every operation command's body, pre-encoded
/// instead of inserted into its document (no allocation per attempt): `$db` (WP-5), when the
/// attempt carries a session its `lsid` `{id: UUID}` (SE-3), and the declared Stable API
/// version's fields (`api`, versioned-api spec: on every command, `getMore` and each of a
/// transaction's included). The operation's command never holds them itself
/// ([`strip_command_fields`]).
pub(super) fn append_command_fields(
    db: &str,
    lsid: Option<SessionId>,
    api: Option<&ApiFields>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    append_db(db, out)?;
    if let Some(id) = lsid {
        append_lsid(id.as_bytes(), out);
    }
    if let Some(api) = api {
        out.extend_from_slice(api.elements());
    }
    Ok(())
}

/// Removes from a caller's command the fields [`append_command_fields`] writes: the request's
/// database is the `$db` sent (WP-5), a caller never passes an `lsid`, and a declared API
/// version (`api`) replaces the caller's own API fields (versioned-api spec).
pub(super) fn strip_command_fields(command: &mut Document, api: Option<&ApiFields>) {
    // One pass over the few top-level keys (no hashing) finds whether there is anything to remove.
    if command.keys().any(|key| key == "$db" || key == "lsid") {
        command.remove("$db");
        command.remove("lsid");
    }
    if api.is_some() {
        ApiFields::strip(command);
    }
}

/// EV-2: the command as sent, for the started event: `body` and the appended fields (the
/// `$readPreference` written after the body, when there is one, then
/// [`append_command_fields`]'), in the order they are written.
pub(super) fn command_as_sent(
    encoded: Option<&RawDocument>,
    body: &Document,
    read_preference: Option<Document>,
    db: &str,
    lsid: Option<SessionId>,
    api: Option<&ApiFields>,
) -> Document {
    let mut command = match encoded {
        Some(raw) => encoded::to_document(raw, body.clone()),
        None => body.clone(),
    };
    if let Some(read_preference) = read_preference {
        command.insert("$readPreference", read_preference);
    }
    command.insert("$db", db);
    if let Some(id) = lsid {
        command.insert("lsid", id.lsid());
    }
    if let Some(api) = api {
        api.insert_into(&mut command);
    }
    command
}

impl Engine {
    /// Starts an explicit session (SE-10). Its server session is taken at its first use, after
    /// checkout (SE-7); [`Engine::end_session`] gives it back to the pool.
    pub fn start_session(&mut self) -> SessionHandle {
        let handle = SessionHandle(self.next_session);
        self.next_session += 1;
        self.sessions.insert(handle, Session::default());
        handle
    }

    /// Ends an explicit session: its transaction pin goes (TX-4 (6)), a pinned connection goes
    /// back to its pool, and its server session returns to the pool (SE-5; a dirty one is
    /// discarded, SE-12). Ending it again, or an unknown handle, does nothing (SE-10). From the
    /// call on, new operations in it are refused; operations started before the call (the
    /// `abortTransaction` that ending a session with a transaction in progress starts, TX-2,
    /// included) run all their attempts, TX-10 retries included. While any runs, the session
    /// ends only when the last one finishes, so that its server session is neither shared nor
    /// returned clean while a command that carries its `lsid` may still be cut off (SE-12). A
    /// `killCursors` of a cursor opened in it and closed after it ended goes out without an
    /// `lsid` (SE-13, SE-14).
    pub fn end_session(&mut self, session: SessionHandle, now: Instant) {
        match self.sessions.get_mut(&session) {
            Some(state) if state.in_flight > 0 => state.ending = true,
            Some(_) => self.close_session(session, now),
            None => {}
        }
        self.run(now);
    }

    /// The session's end of [`Engine::end_session`], once no operation of it is in flight.
    fn close_session(&mut self, session: SessionHandle, now: Instant) {
        let unpinned = self
            .sessions
            .get_mut(&session)
            .and_then(|s| s.pin.end_session());
        self.transaction_unpinned(session, unpinned, now);
        if let Some(server) = self.sessions.remove(&session).and_then(|s| s.server) {
            self.release_server_session(server, now);
        }
    }

    /// An operation carrying `session` starts: an explicit session counts it (SE-12).
    pub(super) fn session_operation_started(&mut self, session: &OpSession) {
        if let OpSession::Explicit(handle) = session {
            if let Some(state) = self.sessions.get_mut(handle) {
                state.in_flight += 1;
            }
        }
    }

    /// The explicit session `handle` is usable: started and not being ended (SE-10).
    fn session_open(&self, handle: SessionHandle) -> bool {
        self.sessions.get(&handle).is_some_and(|s| !s.ending)
    }

    /// TX-2, TX-4 (4): starts a transaction in the explicit session `session` with `options`
    /// (TX-1, TX-11, TO-6): a usage error while one is starting or in progress ("Transaction
    /// already in progress"), with an unacknowledged write concern (`w: 0`), with a
    /// `max_commit_time` above [`crate::max_time::MAX_TIME_MS_LIMIT`] ms, or for an unknown or
    /// ended session. The session's pin goes now, before the
    /// transaction's first selection, and a pinned load-balanced connection goes back to its
    /// pool. From now on every operation naming the session runs in the transaction: the first
    /// one written carries `startTransaction` (the transaction is "starting" until then), later
    /// ones continue it with the same `txnNumber` (TX-1; a second command mapped as the first
    /// while the transaction was starting is refused with a usage error when another one has
    /// already started it, and a command whose transaction ended before it could be sent is
    /// refused too), and `commitTransaction` / `abortTransaction` requests
    /// ([`OperationKind::CommitTransaction`], [`OperationKind::AbortTransaction`]) end it,
    /// finishing at once without a command when none was written (TX-2).
    pub fn start_transaction(
        &mut self,
        session: SessionHandle,
        options: TransactionOptions,
        now: Instant,
    ) -> Result<(), OperationError> {
        let Some(state) = self.sessions.get_mut(&session).filter(|s| !s.ending) else {
            return Err(OperationError::usage("the session has ended"));
        };
        // The transactions spec: an unacknowledged write concern cannot commit a transaction.
        if options
            .write_concern
            .as_ref()
            .is_some_and(is_unacknowledged)
        {
            return Err(OperationError::usage(
                "transactions do not support unacknowledged write concern",
            ));
        }
        // TO-6: a `maxCommitTimeMS` a server would refuse as `maxTimeMS`.
        options.commit_max_time_ms()?;
        state.transaction.start()?;
        state.transaction_options = options;
        // TX-1: the `txnNumber` is incremented at `startTransaction`, even for a transaction
        // that never writes a command; the number is taken with the server session, at the
        // transaction's first command.
        state.started_transactions += 1;
        let unpinned = state.pin.start_transaction();
        self.transaction_unpinned(session, unpinned, now);
        self.run(now);
        Ok(())
    }

    /// What the engine knows of an explicit session (for tests and diagnostics); `None` for an
    /// unknown or ended session.
    pub fn session_info(&self, session: SessionHandle) -> Option<SessionInfo> {
        let state = self.sessions.get(&session)?;
        let pinned = match state.pin.pinned() {
            Some(crate::pinning::Pin::Mongos(address)) => Some(address.clone()),
            Some(crate::pinning::Pin::Connection(_)) => state
                .conn
                .and_then(|c| self.sockets.get(&c))
                .map(|s| s.address.clone()),
            None => None,
        };
        Some(SessionInfo {
            lsid: state.server.as_ref().map(|s| s.id().lsid()),
            dirty: state.server.as_ref().is_some_and(ServerSession::is_dirty),
            pinned,
            transaction: state.transaction.state(),
        })
    }

    /// TX-2: where the explicit session's transaction is; `None` for an unknown or ended session.
    pub fn transaction_state(&self, session: SessionHandle) -> Option<TransactionState> {
        self.sessions.get(&session).map(|s| s.transaction.state())
    }

    /// TX-1, TX-2 (review5 items 4, 5): maps a request naming an open explicit session through
    /// its transaction: inside one, any kind runs as [`OperationKind::InTransaction`] on a
    /// writable server (the transaction's read preference is primary: a read preference of
    /// another mode is a usage error), the first command with the
    /// transaction's `readConcern`; commit and abort become the kind their state gives, with the
    /// transaction's `writeConcern` and the request's own timeout (a driver gives a commit or
    /// abort its session's `defaultTimeoutMS` there, TO-14), and on a commit without `timeoutMS`
    /// the transaction's `maxCommitTimeMS` as `maxTimeMS` (TO-6). `Ok(false)`: nothing to send
    /// (commit or abort of a transaction that wrote nothing); an error: a state or concern the
    /// rules refuse, with nothing changed.
    pub(super) fn transaction_request(
        &mut self,
        request: &mut OperationRequest,
    ) -> Result<bool, OperationError> {
        let Some(state) = request
            .session
            .and_then(|handle| self.sessions.get_mut(&handle))
            .filter(|s| !s.ending)
        else {
            return Ok(true);
        };
        // TO-6: checked at `start_transaction`; an error here changes nothing (TX-2).
        let commit_max_time = match request.kind {
            OperationKind::CommitTransaction { .. } => {
                state.transaction_options.commit_max_time_ms()?
            }
            _ => None,
        };
        let step = match request.kind {
            OperationKind::CommitTransaction { .. } => state.transaction.commit()?,
            OperationKind::AbortTransaction => state.transaction.abort()?,
            kind => {
                let joins = state.transaction.is_active()
                    || matches!(kind, OperationKind::InTransaction { .. });
                if joins {
                    for field in ["readConcern", "writeConcern"] {
                        if request.command.contains_key(field) && !request.concerns_inherited {
                            return Err(OperationError::usage(alloc::format!(
                                "{field} cannot be given to an operation in a transaction: the \
                                 transaction's own applies (TX-1)"
                            )));
                        }
                        request.command.remove(field);
                    }
                }
                // The transaction's read preference is primary: an operation's other one is an
                // error (the transactions spec's "read preference in a transaction must be
                // primary"), checked before anything changes.
                let secondary = matches!(
                    &request.criteria,
                    SelectionCriteria::Read(preference)
                        if preference.mode() != ReadPreferenceMode::Primary
                );
                if joins && secondary {
                    return Err(OperationError::usage(
                        "read preference in a transaction must be primary",
                    ));
                }
                let kind = state.transaction.statement(kind)?;
                if let OperationKind::InTransaction { first, .. } = kind {
                    if let (true, Some(read_concern)) =
                        (first, &state.transaction_options.read_concern)
                    {
                        request.command.insert("readConcern", read_concern.clone());
                    }
                    request.criteria = SelectionCriteria::Write;
                }
                request.kind = kind;
                return Ok(true);
            }
        };
        match step {
            Step::Nothing => Ok(false),
            Step::Send(kind) => {
                request.kind = kind;
                if let Some(write_concern) = &state.transaction_options.write_concern {
                    if !request.command.contains_key("writeConcern") {
                        request
                            .command
                            .insert("writeConcern", write_concern.clone());
                    }
                }
                // TO-6: without `timeoutMS`, `maxCommitTimeMS` is the commit's `maxTimeMS`
                // (each attempt's: the retries send the same command, TX-10); under it
                // (TO-8) the attempts derive theirs (CS-4; none for `timeoutMS=0`, TO-7).
                if let (OperationKind::CommitTransaction { .. }, OperationTimeout::Off) =
                    (kind, request.timeout)
                {
                    if let Some(ms) = commit_max_time {
                        request.command.insert("maxTimeMS", Bson::Int32(ms));
                    }
                }
                request.criteria = SelectionCriteria::Write;
                Ok(true)
            }
        }
    }

    /// TX-2: the transaction's first command was written (`op_id`'s attempt in `slot`): the
    /// transaction is in progress from now on.
    pub(super) fn transaction_command_sent(&mut self, op_id: OpId, slot: usize) {
        let Some(op) = self.ops.get(&op_id) else {
            return;
        };
        if let (
            OperationKind::InTransaction { first: true, .. },
            Some(OpSession::Explicit(handle)),
        ) = (op.request.kind, op.slots.get(slot).map(|s| &s.session))
        {
            if let Some(state) = self.sessions.get_mut(handle) {
                state.transaction.first_sent();
            }
        }
    }

    /// The session a new operation's commands carry, and whether they gossip `$clusterTime`;
    /// an error for a request the session rules refuse before anything is sent.
    ///
    /// `encoded_unacknowledged`: the request's encoded command has an unacknowledged
    /// `writeConcern` ([`encoded::inspect`]).
    pub(super) fn operation_session(
        &self,
        request: &OperationRequest,
        encoded_unacknowledged: bool,
    ) -> Result<(OpSession, bool), OperationError> {
        // SE-13, SE-19 (`attaches_session`, `gossips_cluster_time`): one look at the name.
        let sessionless = crate::session::sessionless(encoded::command_name(
            request.encoded.as_deref(),
            &request.command,
        ));
        // A `writeConcern` beside an encoded command replaces the encoded one.
        let unacknowledged = match request.command.get("writeConcern") {
            Some(Bson::Document(write_concern)) => is_unacknowledged(write_concern),
            Some(_) => false,
            None => encoded_unacknowledged,
        };
        let transaction = matches!(
            request.kind,
            OperationKind::InTransaction { .. }
                | OperationKind::CommitTransaction { .. }
                | OperationKind::AbortTransaction
        );
        let closing_cursor = matches!(request.cursor, super::CursorUse::Close(_));
        let session = match request.session {
            // SE-13, SE-14: a cursor's `killCursors` takes the cursor's session (no `lsid` once
            // that ended), so a cursor outlives its ended session without leaking on the server.
            Some(handle) if closing_cursor && !self.session_open(handle) => OpSession::Never,
            // SE-10: an ended (or never started) session.
            Some(handle) if !self.session_open(handle) => {
                return Err(OperationError::usage("the session has ended"));
            }
            // SE-13: an explicit session with an unacknowledged write is an error.
            Some(_) if unacknowledged => {
                return Err(OperationError::usage(
                    "an unacknowledged write (w: 0) cannot run in an explicit session",
                ));
            }
            Some(handle) => OpSession::Explicit(handle),
            // TX-1: a transaction's commands share one session's lsid and txnNumber.
            None if transaction => {
                return Err(OperationError::usage(
                    "a transaction's commands need an explicit session",
                ));
            }
            // SE-9, SE-13: an implicit session unless the command may not carry one.
            None if !unacknowledged && !sessionless => OpSession::Implicit(None),
            None => OpSession::Never,
        };
        // SE-19 (`gossips_cluster_time`).
        Ok((session, !sessionless))
    }
}

/// SE-8 by the connection's own handshake reply (LB-5: always in load-balanced mode).
pub(super) fn socket_supports_sessions(socket: &super::Socket, load_balanced: bool) -> bool {
    socket
        .machine
        .handshake()
        .is_some_and(|h| connection_supports_sessions(h, load_balanced))
}

/// The engine's parts [`prepare_attempt`] reads and changes besides the operation (issue 9).
pub(super) struct AttemptSessions<'a> {
    /// SE-6, LB-5: how long the server keeps an idle session ([`session_timeout`]).
    pub(super) timeout: SessionTimeout,
    pub(super) load_balanced: bool,
    pub(super) sessions: &'a mut BTreeMap<SessionHandle, Session>,
    pub(super) session_pool: &'a mut SessionPool,
    pub(super) rng: &'a mut EngineRng,
    pub(super) cluster_clock: &'a ClusterClock,
}

/// SE-6, LB-5: how long the server keeps an idle session, for the pool's rules (the
/// topology's `logicalSessionTimeoutMinutes`; ignored in load-balanced mode).
#[inline]
pub(super) fn session_timeout(topology: &TrackedTopology, load_balanced: bool) -> SessionTimeout {
    SessionTimeout::new(
        topology.description().logical_session_timeout(),
        load_balanced,
    )
}

/// What the attempt's connection and its retry machine say of it, for [`prepare_attempt`]
/// (review28 U11: named, where a pair of bools could be swapped unnoticed).
#[derive(Clone, Copy, Debug)]
pub(super) struct AttemptFlags {
    /// SE-8: the connection's own handshake reply says it supports sessions
    /// ([`socket_supports_sessions`]; LB-5: always in load-balanced mode).
    pub(super) supports_sessions: bool,
    /// RW-2, RW-6, RW-7, TX-1: the retry machine says the attempt carries a `txnNumber`.
    pub(super) with_txn_number: bool,
}

/// Adds to the operation's command what this attempt carries besides the attempt's own
/// modifications: the `txnNumber` when the retry machine says the attempt has one
/// ([`AttemptFlags::with_txn_number`], RW-2, RW-6, RW-7, TX-1), with `autocommit: false` on
/// every transaction command (TX-1) and the session's `recoveryToken` on commit and abort
/// (TX-6), `$clusterTime` (SE-17) and `maxTimeMS` (CS-4, TO-9; on a `getMore` only its own,
/// capped at the time left, TO-13).
/// The fields go into the operation's own copy of the command, replacing those of the previous
/// attempt. The session's `lsid` (SE-3, SE-7) is not inserted: [`Prepared::Send`] returns its
/// id, which [`append_command_fields`] writes pre-encoded when the command is encoded.
///
/// Issue 9: with the operation at hand (the caller's, which goes on to write the command)
/// and the engine's parts it needs besides ([`AttemptSessions`]).
pub(super) fn prepare_attempt(
    parts: AttemptSessions<'_>,
    op: &mut Operation,
    slot: usize,
    flags: AttemptFlags,
    min_rtt: core::time::Duration,
    now: Instant,
) -> Prepared {
    let AttemptFlags {
        supports_sessions,
        with_txn_number,
    } = flags;
    let AttemptSessions {
        timeout,
        load_balanced,
        sessions,
        session_pool,
        rng,
        cluster_clock,
    } = parts;
    let supported = supports_sessions || load_balanced;
    let kind = op.request.kind;
    let mut recovery_token = None;
    let transaction = op.transaction;
    let numbered = op.txn_number.is_some();
    // TX-1: a new number skips those of the transactions started since the last one was
    // taken (review6 finding 6), or is the transaction's own once its first command took it.
    let mut skipped = 0;
    let mut transaction_number = None;
    let mut numbering = None;
    let mut after_cluster_time = None;
    // Each hedged copy has its own session (SE-9): its `lsid` is appended as it is encoded.
    let Some(slot) = op.slots.get_mut(slot) else {
        return Prepared::Send(None);
    };
    // SE-7, SE-8: the server session, taken now if it was not yet.
    let (server, explicit) = match &mut slot.session {
        OpSession::Never => (None, None),
        OpSession::Implicit(_) if !supported => (None, None),
        OpSession::Implicit(slot) => (
            Some(slot.get_or_insert_with(|| session_pool.acquire(timeout, rng, now))),
            None,
        ),
        // SE-13, SE-14: the `killCursors` of a cursor whose session has ended goes out
        // without an `lsid` (none may be sent for an ended session).
        OpSession::Explicit(handle)
            if !sessions.contains_key(handle)
                && matches!(op.request.cursor, super::CursorUse::Close(_)) =>
        {
            (None, None)
        }
        OpSession::Explicit(handle) => {
            // TX-2, TX-10 (review5 item 3): an operation started before `end_session` runs
            // all its attempts, the abort that ending the session started included; only new
            // operations are refused (`operation_session`).
            let Some(state) = sessions.get_mut(handle) else {
                return Prepared::Refused(OperationError::usage("the session has ended"));
            };
            if !supported {
                return Prepared::Refused(OperationError::usage(SESSIONS_UNSUPPORTED));
            }
            // TX-6: a new transaction starts without a token; commit and abort send it.
            match kind {
                OperationKind::InTransaction { first: true, .. } => {
                    state.recovery_token = None;
                }
                OperationKind::CommitTransaction { .. } | OperationKind::AbortTransaction => {
                    recovery_token = state.recovery_token.clone();
                }
                _ => {}
            }
            if let OperationKind::InTransaction { first, .. } = kind {
                // TX-1, TX-2 (review6 finding 2): a statement goes out only in the
                // transaction it was mapped into (not after that one was committed or
                // aborted), and only one command starts a transaction: a first command not
                // yet numbered while another one already started it is refused (it would
                // start the same transaction again).
                let current = state.transaction.is_active()
                    && transaction == Some(state.transaction.generation());
                if !current {
                    return Prepared::Refused(OperationError::usage(TRANSACTION_ENDED));
                }
                if first && !numbered && state.transaction.state() == TransactionState::InProgress {
                    return Prepared::Refused(OperationError::usage(ALREADY_STARTED));
                }
            }
            // SE-21: read only for an explicit session (an implicit one is not causal).
            let name = encoded::command_name(op.encoded.as_deref(), &op.wire.body);
            if reads_causally(kind, name) {
                after_cluster_time = state.operation_time;
            }
            if with_txn_number && !numbered {
                transaction_number = state.transaction.number();
                match kind {
                    OperationKind::InTransaction { first: true, .. }
                        if transaction_number.is_none() =>
                    {
                        // The current transaction is one of those started.
                        skipped =
                            core::mem::take(&mut state.started_transactions).saturating_sub(1);
                        numbering = Some(*handle);
                    }
                    OperationKind::InTransaction { .. }
                    | OperationKind::CommitTransaction { .. }
                    | OperationKind::AbortTransaction => {}
                    _ => skipped = core::mem::take(&mut state.started_transactions),
                }
            }
            let server = state
                .server
                .get_or_insert_with(|| session_pool.acquire(timeout, rng, now));
            (Some(server), Some(&state.clock))
        }
    };
    let body = &mut op.wire.body;
    let lsid = server.as_ref().map(|server| server.id());
    match server {
        Some(server) => {
            server.mark_used(now);
            slot.lsid_sent = true;
            if with_txn_number {
                let number = *op.txn_number.get_or_insert_with(|| match kind {
                    // TX-1: the commands of a transaction use its number, once taken.
                    OperationKind::InTransaction { .. }
                    | OperationKind::CommitTransaction { .. }
                    | OperationKind::AbortTransaction
                        if numbering.is_none() =>
                    {
                        transaction_number.unwrap_or_else(|| server.txn_number())
                    }
                    // TX-1: each transaction started since the last number took one, the
                    // ones that never wrote a command included.
                    _ => {
                        for _ in 0..skipped {
                            server.next_txn_number();
                        }
                        server.next_txn_number()
                    }
                });
                body.insert("txnNumber", Bson::Int64(number));
                // TX-1: every command of a transaction says `autocommit: false`.
                if Engine::transaction_command(kind).is_some() {
                    body.insert("autocommit", false);
                }
            }
            if let Some(token) = recovery_token {
                body.insert("recoveryToken", token);
            }
            if let Some(time) = after_cluster_time {
                add_after_cluster_time(body, time);
            }
        }
        None => {
            // Never a txnNumber without an lsid: a server refuses it.
            body.remove("txnNumber");
            slot.lsid_sent = false;
            if with_txn_number {
                // RW-2, SE-8: the server's description supports sessions but this
                // connection does not: the attempt is not a retryable write (issue 10 a).
                // Only a retry machine's attempts carry a txnNumber.
                if let super::OpMachine::Retry(machine) = &mut op.machine {
                    if let Err(error) = machine.handle_attempt_without_txn_number(now) {
                        op.refused.get_or_insert(super::refused::refusal(error));
                    }
                    if machine.is_finished() {
                        return Prepared::Withdrawn;
                    }
                }
            }
        }
    }
    if op.gossip {
        let session_time = explicit.and_then(|clock| clock.current());
        if let Some(time) = ClusterTime::greater(cluster_clock.current(), session_time) {
            match body.get("$clusterTime") {
                Some(Bson::Document(sent)) if sent == time.document() => {}
                _ => {
                    body.insert("$clusterTime", time.document().clone());
                }
            }
        }
    }
    // TX-1: the transaction's number, for its other commands.
    if let (Some(handle), Some(number)) = (numbering, op.txn_number) {
        if let Some(state) = sessions.get_mut(&handle) {
            state.transaction.set_number(number);
        }
    }
    if op.internal {
        return Prepared::Send(lsid);
    }
    let max_time = match op.request.cursor {
        // TO-13 (review37 W14): a getMore's own `maxTimeMS` (an awaitData cursor's
        // `maxAwaitTimeMS`) capped at the time left; none derived without one. Looked up only
        // under a deadline: otherwise it goes as given.
        super::CursorUse::GetMore(_) if op.request.timeout.deadline().is_some() => {
            let given = encoded::field(op.encoded.as_deref(), body, "maxTimeMS");
            get_more_max_time_ms(given.as_deref(), op.request.timeout, min_rtt, now)
        }
        super::CursorUse::GetMore(_) => MaxTime::Omit,
        _ => max_time_ms(op.request.timeout, min_rtt, now),
    };
    match max_time {
        MaxTime::Omit => Prepared::Send(lsid),
        MaxTime::Send(ms) => {
            // At most `i32::MAX` (`MAX_TIME_MS_LIMIT`): sent as the Int32 servers parse.
            body.insert(
                "maxTimeMS",
                Bson::Int32(i32::try_from(ms).unwrap_or(i32::MAX)),
            );
            Prepared::Send(lsid)
        }
        MaxTime::Expired => Prepared::Expired,
    }
}

impl Engine {
    /// SE-12: a network error on an attempt that carried the session's `lsid` makes the session
    /// dirty for good.
    pub(super) fn session_failed(&mut self, op_id: OpId, slot: usize, error: &OperationError) {
        if matches!(error.kind, ErrorKind::Network(_)) {
            self.mark_session_dirty(op_id, slot);
        }
    }

    /// SE-12: the operation's session is dirty if its current attempt carried the `lsid`: a
    /// network error, or a cancellation that closes the connection under the command.
    pub(super) fn mark_session_dirty(&mut self, op_id: OpId, slot: usize) {
        let Some(slot) = self
            .ops
            .get_mut(&op_id)
            .and_then(|op| op.slots.get_mut(slot))
        else {
            return;
        };
        if !slot.lsid_sent {
            return;
        }
        match &mut slot.session {
            OpSession::Implicit(Some(server)) => server.mark_dirty(),
            OpSession::Explicit(handle) => {
                if let Some(server) = self
                    .sessions
                    .get_mut(handle)
                    .and_then(|s| s.server.as_mut())
                {
                    server.mark_dirty();
                }
            }
            _ => {}
        }
    }

    /// SE-16, SE-18: a reply's `$clusterTime` advances the client's clock and the explicit
    /// session's (never for SDAM commands, SE-19: those replies do not come here). TX-6: an
    /// `ok: 1` reply to a transaction command leaves its `recoveryToken` with the session.
    pub(super) fn session_replied(&mut self, op_id: OpId, slot: usize, reply: &ReplyFields<'_>) {
        let Some(op) = self.ops.get(&op_id) else {
            return;
        };
        let session = op.slots.get(slot).map(|s| &s.session);
        // SE-21: every reply's `operationTime`, failures included, in an explicit session.
        if let (Some(OpSession::Explicit(handle)), Some(time)) = (session, reply.operation_time) {
            if let Some(state) = self.sessions.get_mut(handle) {
                let newer = state
                    .operation_time
                    .is_none_or(|t| (time.time, time.increment) > (t.time, t.increment));
                if newer {
                    state.operation_time = Some(time);
                }
            }
        }
        if let (Some(OpSession::Explicit(handle)), Some(token)) = (session, reply.recovery_token) {
            if reply.ok && Engine::transaction_command(op.request.kind).is_some() {
                if let Some(state) = self.sessions.get_mut(handle) {
                    state.recovery_token = Some(super::raw_reply::to_document(token));
                }
            }
        }
        if !op.gossip {
            return;
        }
        let explicit = match session {
            Some(OpSession::Explicit(handle)) => Some(*handle),
            _ => None,
        };
        self.gossip_cluster_time(reply.cluster_time, explicit);
    }

    /// SE-16, SE-18: a reply's encoded `$clusterTime` advances the client's clock and the
    /// `explicit` session's; converted only when it advances one (a time seen before is not
    /// copied).
    pub(super) fn gossip_cluster_time(
        &mut self,
        raw: Option<&RawDocument>,
        explicit: Option<SessionHandle>,
    ) {
        let Some(raw) = raw else {
            return;
        };
        let Some(timestamp) = ClusterTime::timestamp_of(raw) else {
            return;
        };
        let advances = |clock: &ClusterClock| {
            clock.current().is_none_or(|c| {
                let current = c.timestamp();
                (timestamp.time, timestamp.increment) > (current.time, current.increment)
            })
        };
        let session_clock = explicit
            .and_then(|h| self.sessions.get(&h))
            .map(|s| &s.clock);
        if !advances(&self.cluster_clock) && !session_clock.is_some_and(advances) {
            return;
        }
        let Some(time) = ClusterTime::from_document(super::raw_reply::to_document(raw)) else {
            return;
        };
        if let Some(state) = explicit.and_then(|h| self.sessions.get_mut(&h)) {
            state.clock.advance(time.clone());
        }
        self.cluster_clock.advance(time);
    }

    /// The operation ended: the implicit session of its `winner` slot goes to the cursor it
    /// opened or continues (SE-14), else back to the pool (SE-9, SE-5); an explicit session stays
    /// with the caller (and with the cursor it opened), or ends now if [`Engine::end_session`]
    /// waited for this operation (SE-12). The sessions of a hedged operation's other copies go
    /// back to the pool.
    pub(super) fn operation_session_ended(
        &mut self,
        op: &mut Operation,
        winner: usize,
        succeeded: bool,
        now: Instant,
    ) {
        for (i, slot) in op.slots.iter_mut().enumerate() {
            if let (true, OpSession::Implicit(server)) = (i != winner, &mut slot.session) {
                if let Some(server) = server.take() {
                    self.release_server_session(server, now);
                }
            }
        }
        let session = core::mem::take(&mut op.slots[winner].session);
        if let OpSession::Explicit(handle) = session {
            if let Some(state) = self.sessions.get_mut(&handle) {
                state.in_flight = state.in_flight.saturating_sub(1);
                if state.ending && state.in_flight == 0 {
                    self.close_session(handle, now);
                }
            }
        }
        let cursor = match (op.opened.filter(|_| succeeded), op.request.cursor) {
            (Some(handle), _) => Some(handle),
            (None, super::CursorUse::GetMore(handle)) => Some(handle),
            _ => None,
        };
        let cursor = cursor.and_then(|handle| self.cursors.get_mut(&handle));
        match (session, cursor) {
            (session @ (OpSession::Implicit(Some(_)) | OpSession::Explicit(_)), Some(cursor)) => {
                cursor.session = session;
            }
            (OpSession::Implicit(Some(server)), None) => self.release_server_session(server, now),
            _ => {}
        }
    }

    /// The session a cursor's `getMore` or `killCursors` takes from its cursor (SE-14): the
    /// implicit one moves to the operation until it ends; none if the cursor's command had none.
    pub(super) fn take_cursor_session(&mut self, handle: super::CursorHandle) -> OpSession {
        let Some(cursor) = self.cursors.get_mut(&handle) else {
            return OpSession::Never;
        };
        match &mut cursor.session {
            OpSession::Implicit(server) => match server.take() {
                Some(server) => OpSession::Implicit(Some(server)),
                None => OpSession::Never,
            },
            OpSession::Explicit(handle) => OpSession::Explicit(*handle),
            OpSession::Never => OpSession::Never,
        }
    }

    /// A cursor ended: its implicit session goes back to the pool (SE-14).
    pub(super) fn cursor_session_ended(&mut self, session: OpSession, now: Instant) {
        if let OpSession::Implicit(Some(server)) = session {
            self.release_server_session(server, now);
        }
    }

    /// A server session goes back to the pool (SE-5; dirty ones are discarded, SE-12).
    pub(super) fn release_server_session(&mut self, server: ServerSession, now: Instant) {
        let timeout = session_timeout(&self.topology, self.options.topology.load_balanced);
        self.session_pool.release(server, timeout, now);
    }

    /// At close: every explicit session's and cursor's server session goes back to the pool.
    pub(super) fn return_sessions(&mut self, now: Instant) {
        let explicit: alloc::vec::Vec<ServerSession> = core::mem::take(&mut self.sessions)
            .into_values()
            .filter_map(|s| s.server)
            .collect();
        let cursors: alloc::vec::Vec<ServerSession> = self
            .cursors
            .take_all()
            .into_values()
            .filter_map(|c| match c.session {
                OpSession::Implicit(server) => server,
                _ => None,
            })
            .collect();
        for server in explicit.into_iter().chain(cursors) {
            self.release_server_session(server, now);
        }
    }

    /// SE-15: starts the `endSessions` operations for the pooled sessions, when a server is
    /// selectable now (none is waited for): on `admin`, primaryPreferred, without a session, as
    /// run commands whose errors are ignored, all bounded by `serverSelectionTimeoutMS` from
    /// `now`. Returns whether any was started ([`Engine::close`] then waits for them; one that
    /// ended at once is caught by the worklist's end-of-run check).
    pub(super) fn end_sessions(&mut self, now: Instant) -> bool {
        let selectable = self
            .topology
            .description()
            .servers
            .iter()
            .any(|s| s.is_data_bearing());
        if self.session_pool.is_empty() || !selectable {
            return false;
        }
        let deadline = now.saturating_add(self.options.selection.server_selection_timeout);
        let criteria = SelectionCriteria::Read(ReadPreference::from_mode(
            ReadPreferenceMode::PrimaryPreferred,
        ));
        let mut started = false;
        for command in self.session_pool.drain_end_sessions() {
            let mut request = OperationRequest::new(
                "admin",
                command,
                OperationKind::RunCommand,
                criteria.clone(),
            );
            request.timeout = OperationTimeout::Until(deadline);
            self.launch(request, true, now);
            started = true;
        }
        started
    }
}

/// SE-21: whether an attempt of `kind` reads causally after its explicit session's earlier
/// operations: a read that takes a read concern (`find`, `aggregate`, `count`, `distinct`, an
/// inline `mapReduce`; never a generic command), an `aggregate` with a write stage or a
/// `mapReduce` classified as a write (review37 W12), a write command that takes `afterClusterTime`
/// (DRIVERS-3274: the read-write-concern spec's "`afterClusterTime`" list, to which the
/// causal-consistency spec's "Causally consistent read and write commands" defers: `insert`,
/// `update`, `delete`, `findAndModify`, `bulkWrite`, `create`, `createIndexes`, `drop`,
/// `dropDatabase`, `dropIndexes`), or a transaction's first command (its `readConcern`, TX-1).
fn reads_causally(kind: OperationKind, name: &[u8]) -> bool {
    match kind {
        // Review37 W12: an inline `mapReduce` reads, and an `aggregate` with `$out` / `$merge`
        // (a write by classify.rs) reads too, so both take a readConcern (SE-21).
        OperationKind::Read => matches!(
            name,
            b"find" | b"aggregate" | b"count" | b"distinct" | b"mapReduce" | b"mapreduce"
        ),
        OperationKind::RetryableWrite | OperationKind::NonRetryableWrite => matches!(
            name,
            b"aggregate"
                | b"mapReduce"
                | b"mapreduce"
                | b"insert"
                | b"update"
                | b"delete"
                | b"findAndModify"
                | b"findandmodify"
                | b"bulkWrite"
                | b"create"
                | b"createIndexes"
                | b"drop"
                | b"dropDatabase"
                | b"dropIndexes"
        ),
        OperationKind::InTransaction { first, .. } => first,
        _ => false,
    }
}

/// SE-21: `readConcern.afterClusterTime` (the level, if any, kept: a transaction's `snapshot`
/// level included, TX-1); not when the command has its own `atClusterTime` (SE-22), which names
/// its own point in time.
fn add_after_cluster_time(body: &mut Document, time: bson::Timestamp) {
    let mut read_concern = match body.get("readConcern") {
        Some(Bson::Document(read_concern)) => read_concern.clone(),
        _ => Document::new(),
    };
    if read_concern.contains_key("atClusterTime") {
        return;
    }
    read_concern.insert("afterClusterTime", Bson::Timestamp(time));
    body.insert("readConcern", read_concern);
}
