//! A session's transaction state (TX-2): no transaction, starting, in progress, committed,
//! aborted. [`Transaction`] decides what each call of the transaction API does: which
//! [`OperationKind`] a command of the session runs as (TX-1: the first one starts the
//! transaction), whether commit and abort send a command (TX-2: not while starting) and which
//! commit it is (TX-11: a second commit), and the usage errors of calls in the wrong state. A
//! client-side error never changes the state (TX-2).
//!
//! The engine keeps one per explicit session and maps every operation naming the session through
//! it ([`crate::engine::Engine::start_transaction`], [`crate::engine::Engine::start_operation`]):
//! `start` → each command of the session goes through `statement` (the first is
//! [`OperationKind::InTransaction`] with `first: true`, and stays so until one is actually
//! written: `first_sent` moves starting → in progress, TX-2; the transaction's one `txnNumber`
//! is kept with `set_number`, TX-1) → `commit` or `abort` (a [`Step`]) →
//! `start` again, or a command outside a transaction (`statement` moves to no transaction). The
//! engine does the rest: `startTransaction: true` and the `txnNumber` (TX-1), the pins
//! (TX-3..TX-5), the labels (TX-7, TX-8) and the retries of commit and abort (TX-10).

use core::time::Duration;

use bson::Document;

use crate::error::OperationError;
use crate::max_time::MAX_TIME_MS_LIMIT;
use crate::retry::OperationKind;

/// A transaction's concerns, given at [`crate::engine::Engine::start_transaction`] (a driver
/// passes its session's or client's defaults): the engine puts `read_concern` on the
/// transaction's first command only and `write_concern` on `commitTransaction` and
/// `abortTransaction` only (TX-1; TX-11 makes a commit retry's `w` majority, keeping the rest).
/// A command that carries its own keeps it. `max_commit_time` (TO-6) bounds each
/// `commitTransaction` on the server when `timeoutMS` is not set. Made with [`Default`] and the
/// `with_*` methods.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct TransactionOptions {
    /// The `readConcern` document of the first command (`{level: ...}`), `None` for the
    /// server's default.
    pub read_concern: Option<Document>,
    /// The `writeConcern` document of commit and abort, `None` for the server's default.
    pub write_concern: Option<Document>,
    /// TO-6: the deprecated `maxCommitTimeMS`. Without `timeoutMS` (the commit request's
    /// timeout is [`crate::time::OperationTimeout::Off`]) every `commitTransaction` of the
    /// transaction, its retries included, carries it as `maxTimeMS`, in whole milliseconds
    /// (rounded down; `0` is sent as `0`, which a server reads as no limit). Under `timeoutMS`
    /// (TO-8) it is ignored: the engine derives `maxTimeMS` from the remaining time (CS-4), or
    /// sends none for `timeoutMS=0` (TO-7). `abortTransaction` never carries it. At most
    /// [`MAX_TIME_MS_LIMIT`] ms ([`crate::engine::Engine::start_transaction`] refuses more
    /// with a usage error). `None`: no `maxTimeMS` without `timeoutMS`.
    pub max_commit_time: Option<Duration>,
}

impl TransactionOptions {
    /// These options with `read_concern` on the first command.
    pub fn with_read_concern(mut self, read_concern: Document) -> TransactionOptions {
        self.read_concern = Some(read_concern);
        self
    }

    /// These options with `write_concern` on commit and abort.
    pub fn with_write_concern(mut self, write_concern: Document) -> TransactionOptions {
        self.write_concern = Some(write_concern);
        self
    }

    /// TO-6: these options with `maxCommitTimeMS` = `max_commit_time`
    /// ([`TransactionOptions::max_commit_time`]).
    pub fn with_max_commit_time(mut self, max_commit_time: Duration) -> TransactionOptions {
        self.max_commit_time = Some(max_commit_time);
        self
    }

    /// TO-6: these options with `maxCommitTimeMS` given in milliseconds, as a URI or a test
    /// file gives it: a usage error for a negative value or one above [`MAX_TIME_MS_LIMIT`]
    /// (a server refuses a larger `maxTimeMS`), never a panic.
    pub fn with_max_commit_time_ms(self, ms: i64) -> Result<TransactionOptions, OperationError> {
        Ok(self.with_max_commit_time(max_commit_time_ms(ms)?))
    }

    /// TO-6: the `maxTimeMS` a `commitTransaction` carries without `timeoutMS`; a usage error
    /// for a `max_commit_time` above [`MAX_TIME_MS_LIMIT`] ms.
    pub(crate) fn commit_max_time_ms(&self) -> Result<Option<i32>, OperationError> {
        let Some(time) = self.max_commit_time else {
            return Ok(None);
        };
        let ms = u64::try_from(time.as_millis()).unwrap_or(u64::MAX);
        if ms > MAX_TIME_MS_LIMIT {
            return Err(OperationError::usage(MAX_COMMIT_TIME_TOO_LARGE));
        }
        Ok(Some(i32::try_from(ms).unwrap_or(i32::MAX)))
    }
}

/// TO-6: a `maxCommitTimeMS` above what a server accepts as `maxTimeMS`.
const MAX_COMMIT_TIME_TOO_LARGE: &str =
    "maxCommitTimeMS must be at most 2147483647 (a server refuses a larger maxTimeMS)";

/// TO-6: a `maxCommitTimeMS` in milliseconds as a [`Duration`]: a usage error for a negative
/// value or one above [`MAX_TIME_MS_LIMIT`], never a panic.
pub(crate) fn max_commit_time_ms(ms: i64) -> Result<Duration, OperationError> {
    match u64::try_from(ms) {
        Err(_) => Err(OperationError::usage(alloc::format!(
            "maxCommitTimeMS must not be negative (got {ms})"
        ))),
        Ok(ms) if ms > MAX_TIME_MS_LIMIT => Err(OperationError::usage(MAX_COMMIT_TIME_TOO_LARGE)),
        Ok(ms) => Ok(Duration::from_millis(ms)),
    }
}

/// TX-2: where a session's transaction is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransactionState {
    /// No transaction (never started, or a command ran outside one after it ended).
    #[default]
    None,
    /// Started; no command sent yet.
    Starting,
    /// At least one command sent.
    InProgress,
    /// Committed (`sent`: whether a `commitTransaction` was ever sent, i.e. the transaction had
    /// a command).
    Committed {
        /// Whether the transaction sent a command (a commit then sends `commitTransaction`).
        sent: bool,
    },
    /// Aborted.
    Aborted,
}

/// What a commit or abort call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// TX-2: nothing to send (the transaction never sent a command).
    Nothing,
    /// Send the command with this kind ([`OperationKind::CommitTransaction`] or
    /// [`OperationKind::AbortTransaction`]).
    Send(OperationKind),
}

/// TX-2 messages.
const ALREADY_IN_PROGRESS: &str = "Transaction already in progress";
const NOT_STARTED: &str = "No transaction started";
const COMMIT_AFTER_ABORT: &str = "Cannot call commitTransaction after calling abortTransaction";
const ABORT_AFTER_COMMIT: &str = "Cannot call abortTransaction after calling commitTransaction";
const ABORT_TWICE: &str = "Cannot call abortTransaction twice";

/// One session's transaction state machine (TX-2), with the transaction's `txnNumber` once its
/// first command took one (TX-1: every command of the transaction carries that one number).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transaction {
    state: TransactionState,
    /// Counts the transactions started, so that a command mapped into one transaction is never
    /// sent in a later one.
    generation: u32,
    /// TX-1: the number of the current transaction, once its first command took it.
    number: Option<i64>,
}

impl Transaction {
    /// No transaction.
    pub fn new() -> Transaction {
        Transaction::default()
    }

    /// The current state.
    pub fn state(&self) -> TransactionState {
        self.state
    }

    /// Which transaction (counting from 1) the session is in or last was in; 0 before the first.
    pub(crate) fn generation(&self) -> u32 {
        self.generation
    }

    /// TX-1: the `txnNumber` of the current transaction, once its first command took one.
    pub(crate) fn number(&self) -> Option<i64> {
        self.number
    }

    /// TX-1: the current transaction's first command took `number`; every later command of the
    /// transaction (another first command whose attempt had not been prepared yet included,
    /// review6 finding 2) uses it.
    pub(crate) fn set_number(&mut self, number: i64) {
        self.number = Some(number);
    }

    /// A new transaction: starting, without a number yet.
    fn begin(&mut self) {
        self.state = TransactionState::Starting;
        self.generation = self.generation.wrapping_add(1);
        self.number = None;
    }

    /// Whether a transaction is starting or in progress.
    pub fn is_active(&self) -> bool {
        matches!(
            self.state,
            TransactionState::Starting | TransactionState::InProgress
        )
    }

    /// TX-2: starts a transaction; an error while one is starting or in progress.
    pub fn start(&mut self) -> Result<(), OperationError> {
        if self.is_active() {
            return Err(OperationError::usage(ALREADY_IN_PROGRESS));
        }
        self.begin();
        Ok(())
    }

    /// TX-1, TX-2: the kind a command of the session runs as. Inside a transaction it is
    /// [`OperationKind::InTransaction`] (`first` until a command was written, [`Transaction::first_sent`];
    /// `read` for a read or `getMore`, by `kind`); otherwise `kind` itself, and an ended
    /// transaction moves to no transaction. A caller's own `InTransaction` kind says what it
    /// means: `first: true` starts a transaction (an error while one is in progress), `first:
    /// false` continues the active one (an error when none is).
    pub fn statement(&mut self, kind: OperationKind) -> Result<OperationKind, OperationError> {
        let read = matches!(
            kind,
            OperationKind::Read
                | OperationKind::GetMore
                | OperationKind::InTransaction { read: true, .. }
        );
        let first = OperationKind::InTransaction { read, first: true };
        match (self.state, kind) {
            (TransactionState::InProgress, OperationKind::InTransaction { first: true, .. }) => {
                Err(OperationError::usage(ALREADY_IN_PROGRESS))
            }
            (TransactionState::Starting, _) => Ok(first),
            (TransactionState::InProgress, _) => {
                Ok(OperationKind::InTransaction { read, first: false })
            }
            (_, OperationKind::InTransaction { first: true, .. }) => {
                self.begin();
                Ok(first)
            }
            (_, OperationKind::InTransaction { first: false, .. }) => {
                Err(OperationError::usage(NOT_STARTED))
            }
            _ => {
                self.state = TransactionState::None;
                Ok(kind)
            }
        }
    }

    /// TX-2: the transaction's first command was written: starting → in progress. Until then a
    /// failed first command (not sent) leaves it starting, and the next command starts it.
    pub fn first_sent(&mut self) {
        if self.state == TransactionState::Starting {
            self.state = TransactionState::InProgress;
        }
    }

    /// TX-2, TX-10, TX-11: commits. Starting: nothing to send; in progress: the first commit;
    /// committed: the same transaction again (majority write concern, TX-11). The state is
    /// committed afterwards whatever the command's result (TX-10).
    pub fn commit(&mut self) -> Result<Step, OperationError> {
        let step = match self.state {
            TransactionState::None => return Err(OperationError::usage(NOT_STARTED)),
            TransactionState::Aborted => return Err(OperationError::usage(COMMIT_AFTER_ABORT)),
            TransactionState::Starting | TransactionState::Committed { sent: false } => {
                self.state = TransactionState::Committed { sent: false };
                return Ok(Step::Nothing);
            }
            TransactionState::InProgress => OperationKind::CommitTransaction { again: false },
            TransactionState::Committed { sent: true } => {
                OperationKind::CommitTransaction { again: true }
            }
        };
        self.state = TransactionState::Committed { sent: true };
        Ok(Step::Send(step))
    }

    /// TX-2, TX-10: aborts. Starting: nothing to send; in progress: `abortTransaction`, whose
    /// errors the caller swallows. The state is aborted afterwards.
    pub fn abort(&mut self) -> Result<Step, OperationError> {
        let step = match self.state {
            TransactionState::None => return Err(OperationError::usage(NOT_STARTED)),
            TransactionState::Committed { .. } => {
                return Err(OperationError::usage(ABORT_AFTER_COMMIT))
            }
            TransactionState::Aborted => return Err(OperationError::usage(ABORT_TWICE)),
            TransactionState::Starting => Step::Nothing,
            TransactionState::InProgress => Step::Send(OperationKind::AbortTransaction),
        };
        self.state = TransactionState::Aborted;
        Ok(step)
    }

    /// TX-2 (review38 L3): the `commitTransaction` that [`Transaction::commit`] asked for
    /// (`again`: a second commit) failed with a client-side error before it was sent: the state
    /// goes back to what it was before the call (in progress for a first commit; a second
    /// commit changed nothing).
    pub(crate) fn commit_not_sent(&mut self, again: bool) {
        if !again && self.state == (TransactionState::Committed { sent: true }) {
            self.state = TransactionState::InProgress;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn message(error: OperationError) -> String {
        match error.kind {
            ErrorKind::Usage { message } => message,
            other => panic!("not a usage error: {other:?}"),
        }
    }

    /// TX-1: the first command starts the transaction, later ones continue it; reads stay reads.
    #[test]
    fn tx1_first_command_starts_the_transaction() {
        let mut t = Transaction::new();
        t.start().unwrap();
        let first = OperationKind::InTransaction {
            read: false,
            first: true,
        };
        assert_eq!(t.statement(OperationKind::RetryableWrite).unwrap(), first);
        // TX-2: starting until the first command is written.
        assert_eq!(t.state(), TransactionState::Starting);
        assert_eq!(t.statement(OperationKind::RetryableWrite).unwrap(), first);
        t.first_sent();
        assert_eq!(
            t.statement(OperationKind::Read).unwrap(),
            OperationKind::InTransaction {
                read: true,
                first: false
            }
        );
        assert_eq!(t.state(), TransactionState::InProgress);
    }

    /// TX-2, TX-11: commit sends the first commit, then commits again with `again`; a command
    /// after it runs outside any transaction.
    #[test]
    fn tx2_commit_twice_then_a_plain_command() {
        let mut t = Transaction::new();
        t.start().unwrap();
        t.statement(OperationKind::RetryableWrite).unwrap();
        t.first_sent();
        assert_eq!(
            t.commit().unwrap(),
            Step::Send(OperationKind::CommitTransaction { again: false })
        );
        assert_eq!(
            t.commit().unwrap(),
            Step::Send(OperationKind::CommitTransaction { again: true })
        );
        assert_eq!(
            message(t.abort().unwrap_err()),
            "Cannot call abortTransaction after calling commitTransaction"
        );
        assert_eq!(
            t.statement(OperationKind::RetryableWrite).unwrap(),
            OperationKind::RetryableWrite
        );
        assert_eq!(t.state(), TransactionState::None);
    }

    /// TX-2: commit or abort while starting sends nothing; the wrong-state calls fail with the
    /// spec's messages and change nothing.
    #[test]
    fn tx2_states_and_messages() {
        let mut t = Transaction::new();
        assert_eq!(message(t.commit().unwrap_err()), "No transaction started");
        assert_eq!(message(t.abort().unwrap_err()), "No transaction started");
        t.start().unwrap();
        assert_eq!(
            message(t.start().unwrap_err()),
            "Transaction already in progress"
        );
        assert_eq!(t.state(), TransactionState::Starting);
        assert_eq!(t.abort().unwrap(), Step::Nothing);
        assert_eq!(
            message(t.abort().unwrap_err()),
            "Cannot call abortTransaction twice"
        );
        assert_eq!(
            message(t.commit().unwrap_err()),
            "Cannot call commitTransaction after calling abortTransaction"
        );
        t.start().unwrap();
        assert_eq!(t.commit().unwrap(), Step::Nothing);
        assert_eq!(t.commit().unwrap(), Step::Nothing);
        t.start().unwrap();
        t.statement(OperationKind::Read).unwrap();
        t.first_sent();
        assert_eq!(
            t.abort().unwrap(),
            Step::Send(OperationKind::AbortTransaction)
        );
    }

    /// TX-1, TX-2: a caller's `InTransaction` kind starts (`first: true`) or continues (`first:
    /// false`) a transaction; the wrong state is a usage error that changes nothing.
    #[test]
    fn tx2_explicit_transaction_kinds() {
        let mut t = Transaction::new();
        let continued = OperationKind::InTransaction {
            read: false,
            first: false,
        };
        let starts = OperationKind::InTransaction {
            read: false,
            first: true,
        };
        assert_eq!(
            message(t.statement(continued).unwrap_err()),
            "No transaction started"
        );
        assert_eq!(t.statement(starts).unwrap(), starts);
        assert_eq!(t.state(), TransactionState::Starting);
        assert_eq!(
            t.statement(continued).unwrap(),
            starts,
            "nothing written yet"
        );
        t.first_sent();
        assert_eq!(
            message(t.statement(starts).unwrap_err()),
            "Transaction already in progress"
        );
        assert_eq!(t.statement(continued).unwrap(), continued);
        t.commit().unwrap();
        assert_eq!(t.statement(starts).unwrap(), starts, "a new transaction");
    }
    /// TX-1 (review6 finding 2): each transaction started has its own generation and no number
    /// until its first command takes one; the number stays for the transaction and goes with it.
    #[test]
    fn tx1_one_number_per_transaction() {
        let mut t = Transaction::new();
        assert_eq!((t.generation(), t.number()), (0, None));
        t.start().unwrap();
        assert_eq!((t.generation(), t.number()), (1, None));
        t.set_number(7);
        t.first_sent();
        assert_eq!(t.number(), Some(7));
        t.commit().unwrap();
        assert_eq!(t.number(), Some(7), "a commit again uses it");
        t.start().unwrap();
        assert_eq!((t.generation(), t.number()), (2, None));
        t.abort().unwrap();
        let starts = OperationKind::InTransaction {
            read: false,
            first: true,
        };
        t.statement(starts).unwrap();
        assert_eq!(
            (t.generation(), t.number()),
            (3, None),
            "a caller's own start"
        );
    }
}
