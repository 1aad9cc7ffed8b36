//! Pinning: which server or connection a transaction or a load-balanced cursor must keep using.
//!
//! A [`TransactionPin`] holds a sharded transaction's mongos (TX-3) or, in load-balanced mode, its
//! connection (TX-5), and drops it by the TX-4 rules. A [`CursorPin`] holds a load-balanced cursor's
//! connection from the command that created the cursor until the cursor is exhausted or closed
//! (LB-10, LB-11). Both are small pure state machines: the engine asks them where the next command
//! goes and tells them what happened; an operation with a pin never goes through server selection.

use crate::address::ServerAddress;
use crate::error::{ErrorKind, Labels, OperationError};
use crate::pool::ConnectionId;

/// What a transaction or cursor is pinned to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Pin {
    /// A mongos of a sharded cluster (TX-3).
    Mongos(ServerAddress),
    /// A connection to a load balancer (TX-5, LB-10).
    Connection(ConnectionId),
}

/// The kind of command a transaction runs, for the labelling and unpinning rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransactionCommand {
    /// Any command of the transaction other than commit and abort.
    Statement,
    /// `commitTransaction`.
    Commit,
    /// `abortTransaction`.
    Abort,
}

/// UnsatisfiableWriteConcern and UnknownReplWriteConcern: the write-concern errors that are not
/// "unknown commit result" (TX-8).
const DEFINITE_WRITE_CONCERN_ERRORS: [i32; 2] = [100, 79];
/// WriteConcernTimeout, `WriteConcernFailed` before the server renamed it (a write-concern timeout
/// reported at the top level).
const WRITE_CONCERN_FAILED: i32 = 64;

/// The labels the driver adds to an error of a command inside a transaction.
///
/// TX-7: `TransientTransactionError` on network and server-selection errors of every command but
/// commit, and on every `PoolClearedError`. TX-8: `UnknownTransactionCommitResult` on commit
/// failures from server selection, the network, retryable write errors, MaxTimeMSExpired (50), and
/// write-concern failures other than UnsatisfiableWriteConcern (100) and UnknownReplWriteConcern (79).
pub fn transaction_labels(error: &OperationError, command: TransactionCommand) -> Labels {
    let mut labels = Labels::NONE;
    let network_or_selection = matches!(
        error.kind,
        ErrorKind::Network(_) | ErrorKind::ServerSelection { .. }
    );
    if matches!(error.kind, ErrorKind::PoolCleared { .. })
        || (network_or_selection && command != TransactionCommand::Commit)
    {
        labels = labels | Labels::TRANSIENT_TRANSACTION;
    }
    if command == TransactionCommand::Commit {
        let server = error.server_error();
        // CS-7: code 50, at the top level or in the write concern error.
        let max_time = error.is_max_time_expired();
        let write_concern = server.is_some_and(|s| {
            s.write_concern_error.as_ref().is_some_and(|w| {
                !w.code
                    .is_some_and(|c| DEFINITE_WRITE_CONCERN_ERRORS.contains(&c))
            }) || s.code == Some(WRITE_CONCERN_FAILED)
        });
        if network_or_selection || error.is_retryable_write() || max_time || write_concern {
            labels = labels | Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT;
        }
    }
    labels
}

/// The pin of one session's transaction (TX-3..TX-5).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransactionPin {
    pin: Option<Pin>,
}

impl TransactionPin {
    /// No pin.
    pub fn new() -> TransactionPin {
        TransactionPin::default()
    }

    /// Where the transaction's next command must go, if it is pinned: no server selection then.
    pub fn pinned(&self) -> Option<&Pin> {
        self.pin.as_ref()
    }

    /// TX-3, TX-5: the transaction's first command went here; later commands follow it.
    pub fn pin(&mut self, pin: Pin) {
        self.pin = Some(pin);
    }

    /// TX-4 (4): a new transaction starts: unpin before its first selection. Returns the old pin,
    /// whose connection (load-balanced mode) goes back to the pool.
    pub fn start_transaction(&mut self) -> Option<Pin> {
        self.pin.take()
    }

    /// TX-4 (5): the session runs an operation outside a transaction: unpin before selection.
    pub fn non_transaction_operation(&mut self) -> Option<Pin> {
        self.pin.take()
    }

    /// TX-4 (6): the session ends.
    pub fn end_session(&mut self) -> Option<Pin> {
        self.pin.take()
    }

    /// TX-4 (1): the transaction was aborted, whether or not `abortTransaction` succeeded or was
    /// even sent.
    pub fn aborted(&mut self) -> Option<Pin> {
        self.pin.take()
    }

    /// TX-4 (1)-(3): whether a transaction command's failure with `error` (labels applied)
    /// unpins: a `TransientTransactionError`, a commit's `UnknownTransactionCommitResult`, any
    /// abort failure. Its retry then selects anew, also when the session's pin went already.
    pub fn unpins(command: TransactionCommand, error: &OperationError) -> bool {
        error.has_label(Labels::TRANSIENT_TRANSACTION)
            || (command == TransactionCommand::Commit
                && error.has_label(Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT))
            || command == TransactionCommand::Abort
    }

    /// A command of the transaction failed with `error` (labels already applied, see
    /// [`transaction_labels`]). Unpins, before any retry selects a server, on a
    /// `TransientTransactionError` (TX-4 (2)), on a commit's `UnknownTransactionCommitResult`
    /// (TX-4 (3)), and on any abort failure (TX-4 (1)). A successful commit never unpins.
    pub fn command_failed(
        &mut self,
        command: TransactionCommand,
        error: &OperationError,
    ) -> Option<Pin> {
        if TransactionPin::unpins(command, error) {
            self.pin.take()
        } else {
            None
        }
    }
}

/// What to do with a load-balanced cursor's connection after a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CursorStep {
    /// Keep the connection for the next `getMore`.
    Keep,
    /// Check the connection in: the cursor is exhausted (LB-10).
    Release(ConnectionId),
}

/// What closing a load-balanced cursor takes (LB-10, LB-11).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CursorClose {
    /// Nothing pinned: nothing to do.
    Nothing,
    /// Send `killCursors` on this connection, then check it in whatever the result.
    KillCursorsThenRelease(ConnectionId),
    /// The connection had a network error: send no `killCursors`; check it in so the pool closes
    /// it (reason `error`).
    ReleaseBroken(ConnectionId),
}

/// A load-balanced cursor's connection pin (LB-10, LB-11).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CursorPin {
    connection: Option<ConnectionId>,
    network_error: bool,
}

impl CursorPin {
    /// No pin.
    pub fn new() -> CursorPin {
        CursorPin::default()
    }

    /// The connection every `getMore` must use, if pinned.
    pub fn connection(&self) -> Option<ConnectionId> {
        self.connection
    }

    /// LB-10: the pin of a cursor a command opened on `connection` (a reply with a non-zero
    /// cursor id; a cursor with id 0 is exhausted at once and pins nothing).
    pub fn pinned(connection: ConnectionId) -> CursorPin {
        CursorPin {
            connection: Some(connection),
            network_error: false,
        }
    }

    /// LB-10: a `getMore` succeeded with `cursor_id`; id 0 releases the connection.
    pub fn get_more_succeeded(&mut self, cursor_id: i64) -> CursorStep {
        match (cursor_id, self.connection) {
            (0, Some(c)) => {
                self.connection = None;
                CursorStep::Release(c)
            }
            _ => CursorStep::Keep,
        }
    }

    /// LB-11: a `getMore` failed. The cursor stays pinned either way; a network error means no
    /// `killCursors` will be sent on close.
    pub fn get_more_failed(&mut self, error: &OperationError) {
        if matches!(error.kind, ErrorKind::Network(_)) {
            self.network_error = true;
        }
    }

    /// LB-10, LB-11: the cursor is closed.
    pub fn close(&mut self) -> CursorClose {
        match self.connection.take() {
            None => CursorClose::Nothing,
            Some(c) if self.network_error => CursorClose::ReleaseBroken(c),
            Some(c) => CursorClose::KillCursorsThenRelease(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{NetworkErrorKind, NetworkPhase};
    use bson::doc;

    fn addr() -> ServerAddress {
        ServerAddress::new("m1", 27017)
    }

    fn server(reply: bson::Document) -> OperationError {
        OperationError::from_reply(&reply, &addr()).unwrap()
    }

    fn network() -> OperationError {
        OperationError::network(NetworkErrorKind::Reset, NetworkPhase::AfterSend, addr())
    }

    #[test]
    fn tx7_transient_label_on_network_selection_and_pool_cleared_but_not_commit_network() {
        use TransactionCommand::*;
        assert!(transaction_labels(&network(), Statement).contains(Labels::TRANSIENT_TRANSACTION));
        assert!(transaction_labels(&network(), Abort).contains(Labels::TRANSIENT_TRANSACTION));
        assert!(!transaction_labels(&network(), Commit).contains(Labels::TRANSIENT_TRANSACTION));
        let selection = OperationError::server_selection("none");
        assert!(transaction_labels(&selection, Statement).contains(Labels::TRANSIENT_TRANSACTION));
        let cleared = OperationError::pool_cleared(addr(), "x");
        assert!(transaction_labels(&cleared, Commit).contains(Labels::TRANSIENT_TRANSACTION));
        assert!(transaction_labels(&server(doc! { "ok": 0, "code": 2 }), Statement).is_empty());
    }

    #[test]
    fn tx8_unknown_commit_result_rules() {
        use TransactionCommand::Commit;
        let unknown = |e: &OperationError| {
            transaction_labels(e, Commit).contains(Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT)
        };
        assert!(unknown(&network()));
        assert!(unknown(&OperationError::server_selection("none")));
        assert!(unknown(&server(
            doc! { "ok": 0, "code": 91, "errorLabels": ["RetryableWriteError"] }
        )));
        assert!(unknown(&server(doc! { "ok": 0, "code": 50 })));
        assert!(unknown(&server(
            doc! { "ok": 1, "writeConcernError": { "code": 64, "errmsg": "timeout" } }
        )));
        assert!(unknown(&server(
            doc! { "ok": 1, "writeConcernError": { "code": 50, "errmsg": "x" } }
        )));
        assert!(!unknown(&server(
            doc! { "ok": 1, "writeConcernError": { "code": 100, "errmsg": "x" } }
        )));
        assert!(!unknown(&server(
            doc! { "ok": 1, "writeConcernError": { "code": 79, "errmsg": "x" } }
        )));
        assert!(!unknown(&server(doc! { "ok": 0, "code": 2 })));
        assert!(
            !transaction_labels(&network(), TransactionCommand::Statement)
                .contains(Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT)
        );
    }

    #[test]
    fn tx4_unpin_rules() {
        let pin = Pin::Mongos(addr());
        let mut t = TransactionPin::new();
        t.pin(pin.clone());
        // A plain error on a statement keeps the pin; a transient one drops it.
        assert_eq!(
            t.command_failed(
                TransactionCommand::Statement,
                &server(doc! { "ok": 0, "code": 2 })
            ),
            None
        );
        let transient = network().with_labels(Labels::TRANSIENT_TRANSACTION);
        assert_eq!(
            t.command_failed(TransactionCommand::Statement, &transient),
            Some(pin.clone())
        );
        assert_eq!(t.pinned(), None);
        // A commit with an unknown result unpins; a plain commit error does not.
        t.pin(pin.clone());
        assert_eq!(
            t.command_failed(
                TransactionCommand::Commit,
                &server(doc! { "ok": 0, "code": 2 })
            ),
            None
        );
        let unknown = network().with_labels(Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT);
        assert_eq!(
            t.command_failed(TransactionCommand::Commit, &unknown),
            Some(pin.clone())
        );
        // Any abort failure unpins, and so do abort, a new transaction, a non-transaction
        // operation and the end of the session.
        t.pin(pin.clone());
        assert_eq!(
            t.command_failed(
                TransactionCommand::Abort,
                &server(doc! { "ok": 0, "code": 2 })
            ),
            Some(pin.clone())
        );
        for unpin in [
            TransactionPin::aborted,
            TransactionPin::start_transaction,
            TransactionPin::non_transaction_operation,
            TransactionPin::end_session,
        ] {
            t.pin(pin.clone());
            assert_eq!(unpin(&mut t), Some(pin.clone()));
            assert_eq!(t.pinned(), None);
        }
    }

    #[test]
    fn lb10_lb11_cursor_pinning() {
        let c = ConnectionId(7);
        assert_eq!(CursorPin::new().connection(), None);
        assert_eq!(CursorPin::new().close(), CursorClose::Nothing);
        let mut cursor = CursorPin::pinned(c);
        assert_eq!(cursor.connection(), Some(c));
        assert_eq!(cursor.get_more_succeeded(42), CursorStep::Keep);
        assert_eq!(cursor.get_more_succeeded(0), CursorStep::Release(c));
        assert_eq!(cursor.close(), CursorClose::Nothing);

        let mut cursor = CursorPin::pinned(c);
        cursor.get_more_failed(&server(doc! { "ok": 0, "code": 2 }));
        assert_eq!(
            cursor.connection(),
            Some(c),
            "LB-11: still pinned after a server error"
        );
        assert_eq!(cursor.close(), CursorClose::KillCursorsThenRelease(c));

        let mut cursor = CursorPin::pinned(c);
        cursor.get_more_failed(&network());
        assert_eq!(
            cursor.connection(),
            Some(c),
            "LB-11: still pinned after a network error"
        );
        assert_eq!(
            cursor.close(),
            CursorClose::ReleaseBroken(c),
            "LB-11: no killCursors"
        );
    }
}
