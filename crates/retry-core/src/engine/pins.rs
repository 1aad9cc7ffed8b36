//! Pins: a transaction's session pinned to its mongos or (load-balanced) connection, and a
//! cursor pinned to its server and (load-balanced) connection (TX-3..TX-5, LB-10..LB-13).
//!
//! They decide where an operation goes before selection (`session_route`, `cursor_route`),
//! what a success pins (`transaction_succeeded`, `cursor_replied`) and when a pinned connection
//! goes back to its pool: once, when the last of its holders lets it go (the transaction's pin,
//! the cursors opened on it, an operation whose command is in flight on it; `conn_held`,
//! `keep_for_cursor`, `release_unless_in_flight`), house rule 8.

use bson::RawDocumentBuf;

use super::{ConnId, Cursor, CursorHandle, CursorUse, Engine, OpId, Owner, SessionHandle};
use crate::error::{Labels, OperationError};
use crate::pinning::{
    transaction_labels, CursorClose, CursorPin, CursorStep, Pin, TransactionCommand,
};
use crate::pool::{ConnectionId, Purpose};
use crate::retry::{AttemptServer, OperationKind};
use crate::time::Instant;

impl Engine {
    /// Where a `getMore` or `killCursors` of `handle` goes: the cursor's server and (load-balanced)
    /// connection. `None` when the operation is already over: the cursor is not open (a usage
    /// error), or LB-11 closes it without a `killCursors`.
    pub(super) fn cursor_route(
        &mut self,
        op: OpId,
        internal: bool,
        handle: CursorHandle,
        cursor_use: CursorUse,
        now: Instant,
    ) -> Option<(AttemptServer, Option<ConnId>)> {
        let Some(cursor) = self.cursors.get_mut(&handle) else {
            let error = OperationError::usage(alloc::format!("cursor {} is not open", handle.0));
            self.finished_at_once(op, internal, Err(error));
            return None;
        };
        if let CursorUse::Close(_) = cursor_use {
            // House rule 8: the pin names the connection the cursor holds (while its socket
            // lives).
            let socket = cursor.conn.map(|c| pool_conn(&self.sockets, c));
            match cursor.pin.close() {
                // Nothing pinned, or a close of this cursor already under way (two operations
                // on one cursor at once): its killCursors goes out as before, and the
                // connection goes back once, when the cursor ends.
                CursorClose::Nothing => {}
                // The killCursors goes out on the cursor's connection (returned below); its
                // reply ends the cursor and `cursor_replied` checks the connection in.
                CursorClose::KillCursorsThenRelease(id) => debug_assert!(
                    socket.is_some_and(|s| s.is_none_or(|s| s == id)),
                    "LB-10: the pin names the cursor's connection"
                ),
                CursorClose::ReleaseBroken(id) => {
                    // LB-11: after a network error, no killCursors; the connection, kept
                    // checked out since (its socket is gone), goes back now and is closed.
                    let (conn, address) = (cursor.conn, cursor.server.address.clone());
                    if let Some(cursor) = self.cursors.remove(&handle) {
                        self.cursor_session_ended(cursor.session, now);
                    }
                    if !conn.is_some_and(|c| self.conn_held(c)) {
                        let server = self.server_id(&address);
                        if let Some(pool) = self.pool_mut(server) {
                            pool.check_in(id, false, now);
                        }
                        self.flush_pool_events(server);
                    }
                    self.finished_at_once(op, internal, Ok(RawDocumentBuf::new()));
                    return None;
                }
            }
        }
        Some((cursor.server.clone(), cursor.conn))
    }

    /// Where a session's operation of `kind` must go (TX-3, TX-5), after the TX-4 unpinning rules
    /// that apply before selection: a new transaction (4) and a non-transaction operation (5)
    /// unpin; the later commands of a transaction follow the pin.
    ///
    /// TX-3, TX-7, TX-4 (2) (review38 L6): a statement whose pinned mongos is no longer part of
    /// the topology may not go anywhere else (no other mongos knows its transaction): the error
    /// it fails with at once, nothing sent, is a server-selection error labelled
    /// `TransientTransactionError`, and the session is unpinned. A commit or abort selects
    /// anew instead (it carries the `recoveryToken`, TX-6).
    pub(super) fn session_route(
        &mut self,
        session: SessionHandle,
        kind: OperationKind,
        now: Instant,
    ) -> Result<(Option<AttemptServer>, Option<ConnId>), OperationError> {
        let Some(state) = self.sessions.get_mut(&session) else {
            return Ok((None, None));
        };
        let unpinned = match kind {
            OperationKind::InTransaction { first: true, .. } => state.pin.start_transaction(),
            OperationKind::InTransaction { first: false, .. }
            | OperationKind::CommitTransaction { .. }
            | OperationKind::AbortTransaction => None,
            _ => state.pin.non_transaction_operation(),
        };
        if unpinned.is_some() {
            self.transaction_unpinned(session, unpinned, now);
            return Ok((None, None));
        }
        let Some(state) = self.sessions.get(&session) else {
            return Ok((None, None));
        };
        let (address, conn, mongos) = match state.pin.pinned() {
            Some(Pin::Mongos(address)) => (Some(address.clone()), None, true),
            Some(Pin::Connection(_)) => {
                let socket = state.conn.and_then(|c| self.sockets.get(&c));
                (socket.map(|s| s.address.clone()), state.conn, false)
            }
            None => return Ok((None, None)),
        };
        let topology = self.topology.description();
        let server = address
            .as_ref()
            .and_then(|a| topology.server(a))
            .map(|d| AttemptServer::from_description(d, topology.topology_type));
        match (server, address) {
            (None, Some(address)) if mongos && Engine::is_statement(kind) => {
                Err(self.pinned_mongos_left(session, &address, now))
            }
            (server, _) => Ok((server, conn)),
        }
    }

    /// Whether `kind` is a transaction's statement (neither its commit nor its abort).
    fn is_statement(kind: OperationKind) -> bool {
        matches!(kind, OperationKind::InTransaction { .. })
    }

    /// TX-3, TX-7, TX-4 (2) (review38 L6): the statement of `session`'s transaction cannot reach
    /// its pinned mongos at `address`, which has left the topology: the server-selection error
    /// it ends with, labelled as `fail_attempt` labels one (TransientTransactionError), after
    /// the unpin that label calls for. A mongos pin holds no connection.
    fn pinned_mongos_left(
        &mut self,
        session: SessionHandle,
        address: &crate::address::ServerAddress,
        now: Instant,
    ) -> OperationError {
        let error = OperationError::server_selection(alloc::format!(
            "the transaction's pinned mongos {address} is no longer part of the topology"
        ));
        let labels = transaction_labels(&error, TransactionCommand::Statement);
        let error = error.with_labels(labels);
        let unpinned = self
            .sessions
            .get_mut(&session)
            .and_then(|s| s.pin.command_failed(TransactionCommand::Statement, &error));
        debug_assert!(unpinned.is_some(), "TX-4 (2): a transient error unpins");
        self.transaction_unpinned(session, unpinned, now);
        error
    }

    /// TX-4: the session's transaction pin went before selection, a new transaction or the
    /// session's end (`unpinned`, as [`crate::pinning::TransactionPin`] returned it): a connection
    /// pin's connection goes back to its pool (TX-5); a mongos pin holds nothing (TX-3).
    pub(super) fn transaction_unpinned(
        &mut self,
        session: SessionHandle,
        unpinned: Option<Pin>,
        now: Instant,
    ) {
        if let Some(conn) = self.unpinned_conn(session, unpinned) {
            self.transaction_released(conn, true, now);
        }
    }

    /// TX-4, LB-10: a transaction's pin let its connection go: it goes back to its pool, unless
    /// a cursor opened in the transaction still uses it ([`Engine::keep_for_cursor`]), or a
    /// command of the session is still in flight on it (a session used concurrently, SE-10):
    /// that operation then checks it in when it releases it, and never loses its reply
    /// (house rule 8).
    pub(super) fn transaction_released(&mut self, conn: ConnId, healthy: bool, now: Instant) {
        if !self.keep_for_cursor(conn) {
            self.release_unless_in_flight(conn, healthy, now);
        }
    }

    /// Checks in a pinned connection its holder (a transaction's pin, a closed cursor) let go,
    /// unless another operation still has its command in flight on it (a session or cursor used
    /// concurrently, SE-10): that operation then checks it in when it releases it, and gets its
    /// reply (house rule 8).
    pub(super) fn release_unless_in_flight(&mut self, conn: ConnId, healthy: bool, now: Instant) {
        let in_flight = self.sockets.get(&conn).and_then(|s| match (s.op, s.owner) {
            (Some((op, _)), Owner::Pool(id)) => Some((op, s.server, id)),
            _ => None,
        });
        let Some((op_id, server, id)) = in_flight else {
            self.release(conn, healthy, now);
            return;
        };
        // One that checked it out itself releases it anyway; one pinned to it now does too.
        let Some(op) = self.ops.get_mut(&op_id) else {
            // LB-9, house rule 8 (review38 L1): the command on it belongs to an operation that
            // no longer exists, so nobody would ever check it in: it goes back now, closed (its
            // orphaned reply must reach no later user).
            self.release(conn, false, now);
            return;
        };
        if op.pinned_conn == Some(conn) {
            op.release_pinned = true;
            // Nobody's but that operation's now (LB-13).
            if let Some(pool) = self.pool_mut(server) {
                pool.set_purpose(id, Purpose::Other);
            }
        }
    }

    /// TX-4 (1) (review38 L1, L3): an `abortTransaction` that did not run (cancelled, or refused
    /// before it was sent) unpins all the same; the pinned connection goes back, unless a cursor
    /// of the transaction or a command in flight still holds it.
    pub(super) fn abort_unpinned(&mut self, session: SessionHandle, now: Instant) {
        let unpinned = self
            .sessions
            .get_mut(&session)
            .and_then(|s| s.pin.aborted());
        self.transaction_unpinned(session, unpinned, now);
    }

    /// LB-10, LB-13: whether a cursor still uses `conn`, whose transaction pin went; the cursor
    /// then keeps it, counted as a cursor's, until the cursor ends.
    pub(super) fn keep_for_cursor(&mut self, conn: ConnId) -> bool {
        if self.cursors.on_conn(conn).next().is_none() {
            return false;
        }
        let socket = self.sockets.get(&conn).map(|s| (s.server, s.owner));
        if let Some((server, Owner::Pool(id))) = socket {
            if let Some(pool) = self.pool_mut(server) {
                pool.set_purpose(id, Purpose::Cursor);
            }
        }
        true
    }

    /// TX-5, LB-10: whether a transaction's pin or an open cursor holds `conn`, so that the end
    /// of one of its other holders leaves it checked out.
    pub(super) fn conn_held(&self, conn: ConnId) -> bool {
        self.is_transaction_conn(conn) || self.cursors.on_conn(conn).next().is_some()
    }

    /// The connection a session held for its connection pin `unpinned`, taken from the session.
    /// House rule 8: the session holds a connection exactly while its pin is a connection pin
    /// naming it (`pin_transaction` sets both); a mismatch is a bug, caught by debug builds, and
    /// a held connection is handed back all the same.
    pub(super) fn unpinned_conn(
        &mut self,
        session: SessionHandle,
        unpinned: Option<Pin>,
    ) -> Option<ConnId> {
        let conn = self.sessions.get_mut(&session).and_then(|s| s.conn.take());
        match unpinned {
            Some(Pin::Connection(id)) => debug_assert!(
                conn.is_some_and(|c| pool_conn(&self.sockets, c).is_none_or(|c| c == id)),
                "TX-5: a connection pin's connection is the session's"
            ),
            Some(Pin::Mongos(_)) | None => {
                debug_assert_eq!(conn, None, "TX-3: only a connection pin holds a connection")
            }
        }
        conn
    }

    /// The transaction command an operation is, if it is one.
    pub(super) fn transaction_command(kind: OperationKind) -> Option<TransactionCommand> {
        match kind {
            OperationKind::InTransaction { .. } => Some(TransactionCommand::Statement),
            OperationKind::CommitTransaction { .. } => Some(TransactionCommand::Commit),
            OperationKind::AbortTransaction => Some(TransactionCommand::Abort),
            _ => None,
        }
    }

    /// TX-3, TX-5: a transaction's first command pins its session to the mongos it ran on, or in
    /// load-balanced mode to its connection; abort unpins whatever happened (TX-4 (1)).
    pub(super) fn transaction_succeeded(&mut self, op_id: OpId, conn: ConnId, now: Instant) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        let Some(session) = op.request.session else {
            return;
        };
        match op.request.kind {
            OperationKind::InTransaction { first: true, .. } => self.pin_transaction(op_id, conn),
            OperationKind::AbortTransaction => {
                // TX-4 (1): unpinned. A connection pin's connection is usually the one this
                // abort ran on: the abort's own release checks it in, unless a cursor of the
                // transaction still uses it (LB-10). A first command that ran alongside the
                // abort (a session used concurrently) may have pinned another one since: it
                // goes back now (house rule 8).
                let pinned = op.pinned_conn;
                let unpinned = self
                    .sessions
                    .get_mut(&session)
                    .and_then(|s| s.pin.aborted());
                let release = match self.unpinned_conn(session, unpinned) {
                    Some(c) if Some(c) == pinned => !self.keep_for_cursor(c),
                    Some(c) => {
                        self.transaction_released(c, true, now);
                        false
                    }
                    None => false,
                };
                if let Some(op) = self.ops.get_mut(&op_id) {
                    // Also when a later operation of the session let the pin go meanwhile
                    // (`transaction_released`).
                    op.release_pinned |= release;
                }
            }
            _ => {}
        }
    }

    /// TX-3, TX-5: the transaction's first command got a server error reply on `conn`: the
    /// session is pinned as after a success (the pin was made when the command went out); the
    /// failure's TX-4 rules then unpin it for a `TransientTransactionError` and keep it for any
    /// other error (LB `transactions.json`: "pinned connection is not released after a
    /// non-transient CRUD error"). An overload error, which the retry rules may retry (TX-12),
    /// pins nothing: the retry selects again and its own reply pins.
    pub(super) fn transaction_error_reply(
        &mut self,
        op_id: OpId,
        conn: ConnId,
        error: &OperationError,
    ) {
        if error.has_label(Labels::OVERLOAD_RETRYABLE) {
            return;
        }
        let first = self.ops.get(&op_id).is_some_and(|op| {
            op.request.session.is_some()
                && matches!(
                    op.request.kind,
                    OperationKind::InTransaction { first: true, .. }
                )
        });
        if first {
            self.pin_transaction(op_id, conn);
        }
    }

    /// TX-3, TX-5: pins the operation's session to the mongos it ran on or, load-balanced, to
    /// `conn`, which the pool then counts as a transaction's (LB-13).
    fn pin_transaction(&mut self, op_id: OpId, conn: ConnId) {
        let load_balanced = self.options.topology.load_balanced;
        let Some((server, pool_id)) = self.sockets.get(&conn).and_then(|s| match s.owner {
            Owner::Pool(id) => Some((s.server, id)),
            _ => None,
        }) else {
            return;
        };
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        let Some(state) = op.request.session.and_then(|s| self.sessions.get_mut(&s)) else {
            return;
        };
        // House rule 8: a second first command that ran alongside the first (a session used
        // concurrently, SE-10) pins nothing; the pin, and the connection it holds, stay the
        // first one's, and this operation gives its own connection back.
        if state.pin.pinned().is_some() {
            return;
        }
        if load_balanced {
            // The connection is the transaction's now, even one the operation was to give back.
            // (A killCursors never is a first command: it joins only the transaction its cursor
            // was opened in, `launch`.)
            op.keep_conn = true;
            op.release_pinned = false;
            state.conn = Some(conn);
            state.pin.pin(Pin::Connection(pool_id));
            if let Some(pool) = self.pool_mut(server) {
                pool.set_purpose(pool_id, Purpose::Transaction);
            }
        } else if let Some(address) = op.slots[0]
            .server
            .as_ref()
            .filter(|s| s.topology_type.is_sharded())
            .map(|s| s.address.clone())
        {
            state.pin.pin(Pin::Mongos(address));
        }
    }

    /// TX-5, LB-10: whether `conn` is pinned by a transaction; a cursor opened on it in that
    /// transaction then never checks it in (the transaction's end does).
    pub(super) fn is_transaction_conn(&self, conn: ConnId) -> bool {
        self.sockets.get(&conn).is_some_and(|s| match s.owner {
            Owner::Pool(id) => self
                .pool(s.server)
                .is_some_and(|p| p.purpose(id) == Some(Purpose::Transaction)),
            _ => false,
        })
    }

    /// LB-10: a cursor operation's `slot` (a hedged copy's, or the retry machine's) succeeded
    /// with `cursor_id`: open, keep or end the cursor.
    pub(super) fn cursor_replied(
        &mut self,
        op_id: OpId,
        slot: usize,
        conn: ConnId,
        cursor_id: i64,
    ) {
        let load_balanced = self.options.topology.load_balanced;
        // TX-5, LB-10: a cursor's connection goes back when the cursor ends, unless a
        // transaction or another cursor still holds it.
        let (ended, release) = match self.ops.get(&op_id).map(|op| op.request.cursor) {
            // Not a cursor operation (the usual reply): nothing to open, keep or end.
            None | Some(CursorUse::None) => return,
            Some(CursorUse::GetMore(handle)) if cursor_id == 0 => {
                (self.cursors.remove(&handle), !self.conn_held(conn))
            }
            Some(CursorUse::Close(handle)) => (self.cursors.remove(&handle), !self.conn_held(conn)),
            // Only a cursor that ends reads `release`.
            Some(_) => (None, false),
        };
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
                let Some(server) = op.slots[slot].server.clone() else {
                    return;
                };
                if cursor_id == 0 {
                    return;
                }
                // LB-10, LB-13: the connection is the cursor's now, even one the operation was
                // to give back because its transaction let it go while it ran.
                let let_go = core::mem::take(&mut op.release_pinned);
                let (pin, conn) = match load_balanced {
                    true => {
                        op.keep_conn = true;
                        (CursorPin::pinned(pool_id), Some(conn))
                    }
                    false => (CursorPin::new(), None),
                };
                let handle = CursorHandle(self.next_cursor);
                self.next_cursor += 1;
                op.opened = Some(handle);
                self.cursors.insert(
                    handle,
                    Cursor {
                        server,
                        conn,
                        pin,
                        session: super::OpSession::Never,
                        transaction: op.transaction,
                    },
                );
                if let (true, Some(conn)) = (let_go, conn) {
                    let server = self.sockets.get(&conn).map(|s| s.server);
                    if let Some(pool) = server.and_then(|server| self.pool_mut(server)) {
                        pool.set_purpose(pool_id, Purpose::Cursor);
                    }
                }
            }
            CursorUse::GetMore(_) => {
                if let Some(mut cursor) = ended {
                    // LB-10: id 0 ends the pin; the released connection is the one this getMore
                    // ran on, which the operation's release then checks in.
                    match cursor.pin.get_more_succeeded(0) {
                        CursorStep::Release(id) => {
                            debug_assert_eq!(id, pool_id, "LB-10: the getMore's connection");
                            op.release_pinned = release;
                        }
                        CursorStep::Keep => {
                            debug_assert_eq!(op.pinned_conn, None, "LB-10: nothing pinned");
                        }
                    }
                }
            }
            CursorUse::Close(_) => op.release_pinned = release,
        }
    }
}

/// The pool's id of the pooled connection `conn`, while its socket lives.
fn pool_conn(
    sockets: &crate::id_table::IdTable<ConnId, super::Socket>,
    conn: ConnId,
) -> Option<ConnectionId> {
    match sockets.get(&conn)?.owner {
        Owner::Pool(id) => Some(id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::ServerAddress;
    use crate::engine::EngineOptions;
    use crate::handshake::HandshakeOptions;
    use crate::topology::TopologySettings;

    fn engine() -> Engine {
        let mut settings = TopologySettings::new(alloc::vec![ServerAddress::new("lb", 27017)]);
        settings.load_balanced = true;
        let options = EngineOptions::new(settings, HandshakeOptions::new());
        Engine::new(options, Instant::ZERO).expect("valid")
    }

    /// TX-3, TX-4, house rule 8 (review5 item 13): unpinning a mongos pin hands back no
    /// connection, and an unpinned session none either.
    #[test]
    fn tx4_a_mongos_pin_or_no_pin_holds_no_connection() {
        let mut engine = engine();
        let session = engine.start_session();
        let mongos = Pin::Mongos(ServerAddress::new("m", 27017));
        assert_eq!(engine.unpinned_conn(session, Some(mongos)), None);
        assert_eq!(engine.unpinned_conn(session, None), None);
    }

    /// House rule 8 (review5 item 13): a session that holds a connection without a connection
    /// pin is a bug of the engine's; debug builds stop on it instead of ignoring the pin result.
    #[test]
    #[should_panic(expected = "TX-3: only a connection pin holds a connection")]
    fn tx5_a_connection_held_without_a_connection_pin_is_caught() {
        let mut engine = engine();
        let session = engine.start_session();
        if let Some(state) = engine.sessions.get_mut(&session) {
            state.conn = Some(ConnId(99));
        }
        let _ = engine.unpinned_conn(session, None);
    }

    /// House rule 8 (review5 item 13): a connection pin whose session holds no connection is a
    /// bug of the engine's, caught by debug builds.
    #[test]
    #[should_panic(expected = "TX-5: a connection pin's connection is the session's")]
    fn tx5_a_connection_pin_without_its_connection_is_caught() {
        let mut engine = engine();
        let session = engine.start_session();
        let _ = engine.unpinned_conn(session, Some(Pin::Connection(ConnectionId(3))));
    }
}
