//! Pins: a transaction's session pinned to its mongos or (load-balanced) connection, and a
//! cursor pinned to its server and (load-balanced) connection (TX-3..TX-5, LB-10..LB-13).
//!
//! They decide where an operation goes before selection (`session_route`, `cursor_route`),
//! what a success pins (`transaction_succeeded`, `cursor_replied`) and when a pinned connection
//! goes back to its pool.

use bson::RawDocumentBuf;

use super::{
    ConnId, Cursor, CursorHandle, CursorUse, Engine, EngineEvent, OpId, Owner, SessionHandle,
};
use crate::error::{Labels, OperationError};
use crate::pinning::{CursorClose, CursorPin, Pin, TransactionCommand};
use crate::pool::Purpose;
use crate::retry::{AttemptServer, OperationKind};
use crate::time::Instant;

impl Engine {
    /// Where a `getMore` or `killCursors` of `handle` goes: the cursor's server and (load-balanced)
    /// connection. `None` when the operation is already over: the cursor is not open (a usage
    /// error), or LB-11 closes it without a `killCursors`.
    pub(super) fn cursor_route(
        &mut self,
        op: OpId,
        handle: CursorHandle,
        cursor_use: CursorUse,
        now: Instant,
    ) -> Option<(AttemptServer, Option<ConnId>)> {
        let Some(cursor) = self.cursors.get_mut(&handle) else {
            let error = OperationError::usage(alloc::format!("cursor {} is not open", handle.0));
            self.events.push_back(EngineEvent::OperationFinished {
                op,
                result: Err(error),
            });
            return None;
        };
        if let (CursorUse::Close(_), Some(conn)) = (cursor_use, cursor.conn) {
            if let CursorClose::ReleaseBroken(pool_id) = cursor.pin.close() {
                // LB-11: after a network error, no killCursors; the connection, kept checked out
                // since (its socket is gone), goes back now and is closed.
                let address = cursor.server.address.clone();
                if let Some(cursor) = self.cursors.remove(&handle) {
                    self.cursor_session_ended(cursor.session, now);
                }
                if !self.is_transaction_conn(conn) {
                    let server = self.server_id(&address);
                    if let Some(pool) = self.pool_mut(server) {
                        pool.check_in(pool_id, false, now);
                    }
                    self.flush_pool_events(server);
                }
                self.events.push_back(EngineEvent::OperationFinished {
                    op,
                    result: Ok(RawDocumentBuf::new()),
                });
                return None;
            }
        }
        Some((cursor.server.clone(), cursor.conn))
    }

    /// Where a session's operation of `kind` must go (TX-3, TX-5), after the TX-4 unpinning rules
    /// that apply before selection: a new transaction (4) and a non-transaction operation (5)
    /// unpin; the later commands of a transaction follow the pin.
    pub(super) fn session_route(
        &mut self,
        session: SessionHandle,
        kind: OperationKind,
        now: Instant,
    ) -> (Option<AttemptServer>, Option<ConnId>) {
        let Some(state) = self.sessions.get_mut(&session) else {
            return (None, None);
        };
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
    pub(super) fn unpin_connection(&mut self, session: SessionHandle, healthy: bool, now: Instant) {
        if let Some(conn) = self.sessions.get_mut(&session).and_then(|s| s.conn.take()) {
            self.release(conn, healthy, now);
        }
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
    pub(super) fn transaction_succeeded(&mut self, op_id: OpId, conn: ConnId) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        let Some(session) = op.request.session else {
            return;
        };
        match op.request.kind {
            OperationKind::InTransaction { first: true, .. } => self.pin_transaction(op_id, conn),
            OperationKind::AbortTransaction => {
                if let Some(state) = self.sessions.get_mut(&session) {
                    // TX-4 (1): unpinned. A connection pin's connection is the one this abort
                    // ran on; `release_pinned` below makes the abort's own release check it in.
                    let _unpinned = state.pin.aborted();
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
        if load_balanced {
            op.keep_conn = true;
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
        // TX-5: a connection a transaction pins stays out when its cursor ends.
        let shared = load_balanced && self.is_transaction_conn(conn);
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
                let mut pin = CursorPin::new();
                let conn = load_balanced.then(|| {
                    pin.created(pool_id, cursor_id);
                    op.keep_conn = true;
                    conn
                });
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
                    },
                );
            }
            CursorUse::GetMore(handle) => {
                if cursor_id == 0 {
                    op.release_pinned = !shared;
                    if let Some(mut cursor) = self.cursors.remove(&handle) {
                        // LB-10: id 0 ends the pin; a `Release` connection is the operation's
                        // pinned connection, which `release_pinned` above checks in.
                        let _ended = cursor.pin.get_more_succeeded(0);
                    }
                }
            }
            CursorUse::Close(handle) => {
                op.release_pinned = !shared;
                self.cursors.remove(&handle);
            }
        }
    }
}
