//! Explicit sessions (SE-10): [`Client::start_session`] gives a [`Session`] whose operations share
//! one server session (one `lsid`, increasing `txnNumber`s, its own `$clusterTime`); dropping it
//! (or [`Session::end`]) ends it and returns its server session to the client's pool.
//!
//! The engine does the work ([`Engine::start_session`], [`Engine::end_session`]); this module
//! carries the requests to the driver task. Without an explicit session every operation runs in
//! an implicit one the engine takes and returns by itself (SE-9). A deployment without session
//! support fails an explicit session's operations with
//! [`retry_core::session::SESSIONS_UNSUPPORTED`] (SE-8), without sending them.
//!
//! Transactions: [`Session::start_transaction`], the session's commands, then
//! [`Session::commit_transaction`] or [`Session::abort_transaction`]. The transaction's state
//! lives in the engine's session ([`Engine::start_transaction`], TX-2): every operation naming
//! the session, through this module or [`CommandOptions::with_session`], runs as the engine's
//! transaction makes it (`autocommit: false`, `startTransaction`, the `txnNumber`, TX-1); this
//! module forwards, with the client's concerns as the transaction's (TX-1, TX-11), under the
//! session's own defaults ([`SessionOptions`]).
//!
//! Timeouts (TO-14): a session started with [`SessionOptions::default_timeout`]
//! (`defaultTimeoutMS`) runs its `commitTransaction` and `abortTransaction`, and the abort of
//! ending it, under that timeout rather than the client's `timeoutMS`: each of these requests
//! carries it as its own CSOT timeout, which the driver makes the request's
//! [`OperationRequest::timeout`] when it starts it (from then, as the client's); without one
//! they take the client's (the session inherits the client's value). Its other operations always take the client's. There is no
//! `withTransaction` in this driver. The deprecated `maxCommitTimeMS`
//! ([`TransactionOptions::max_commit_time`], TO-6) is sent as the commit's `maxTimeMS` only when
//! neither timeout is set.

use core::fmt;
use core::future::poll_fn;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::sync::{Arc, Mutex};

use bson::Document;
use retry_core::engine::{Engine, OperationRequest, SessionHandle, SessionInfo};
use retry_core::error::{ErrorKind, OperationError};
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;
use retry_core::time::{Instant, OperationTimeout};
use retry_core::transaction::TransactionOptions;

use crate::client::{Client, CommandOptions};
use crate::shared::{lock, Reply};

/// Where the driver's answer to a session request goes: a started session's handle (`None` when
/// the client closed first), or a transaction start's result.
pub(crate) struct SessionStart<T = Option<SessionHandle>> {
    state: Mutex<(Option<T>, Option<Waker>)>,
}

impl<T> Default for SessionStart<T> {
    fn default() -> Self {
        SessionStart {
            state: Mutex::new((None, None)),
        }
    }
}

impl<T> SessionStart<T> {
    fn complete(&self, answer: T) {
        let mut state = lock(&self.state);
        state.0 = Some(answer);
        if let Some(waker) = state.1.take() {
            waker.wake();
        }
    }

    fn poll(&self, cx: &Context<'_>) -> Poll<T> {
        let mut state = lock(&self.state);
        match state.0.take() {
            Some(answer) => Poll::Ready(answer),
            None => {
                state.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// A transaction start's answer.
type TransactionStart = SessionStart<Result<(), OperationError>>;

/// The sessions the client asked the driver to start and to end.
#[derive(Default)]
pub(crate) struct SessionRequests {
    starts: Vec<Arc<SessionStart>>,
    ends: Vec<SessionHandle>,
    /// Sessions starting a transaction (TX-2, TX-4 (4)), each with its options and completion.
    transactions: Vec<(SessionHandle, TransactionOptions, Arc<TransactionStart>)>,
    /// Sessions whose state was asked for, each with its completion.
    infos: Vec<(SessionHandle, Arc<SessionStart<Option<SessionInfo>>>)>,
    /// The `abortTransaction` of an ending session (TX-2: ending a session aborts its
    /// transaction; the engine sends it only when one is in progress), started before the
    /// session ends; its result is not awaited (TX-10: abort errors are ignored). Each with the
    /// session's `defaultTimeoutMS`, if it has one (TO-14).
    aborts: Vec<(OperationRequest, Option<Duration>)>,
}

impl SessionRequests {
    /// Whether nothing is asked for (every round of the driver looks).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.starts.is_empty()
            && self.ends.is_empty()
            && self.transactions.is_empty()
            && self.infos.is_empty()
            && self.aborts.is_empty()
    }

    /// The client closed: the starts not served get no session.
    pub(crate) fn refuse_starts(&mut self) {
        for start in self.starts.drain(..) {
            start.complete(None);
        }
        for (_, _, start) in self.transactions.drain(..) {
            start.complete(Err(OperationError::cancelled()));
        }
        for (_, answer) in self.infos.drain(..) {
            answer.complete(None);
        }
    }
}

/// The driver's side: starts and ends the requested sessions in `engine`, aborting the
/// transactions of the ending ones first (under the session's `defaultTimeoutMS`, else the
/// client's `timeoutMS`, `timeout`; TO-14); whether there were any.
pub(crate) fn serve(
    engine: &mut Engine,
    requests: &mut SessionRequests,
    timeout: Option<core::time::Duration>,
    now: Instant,
) -> bool {
    if requests.is_empty() {
        return false;
    }
    for start in requests.starts.drain(..) {
        start.complete(Some(engine.start_session()));
    }
    for (session, options, start) in requests.transactions.drain(..) {
        start.complete(engine.start_transaction(session, options, now));
    }
    for (session, answer) in requests.infos.drain(..) {
        answer.complete(engine.session_info(session));
    }
    for (mut abort, own) in requests.aborts.drain(..) {
        // TO-14: the session's `defaultTimeoutMS`, else the client's `timeoutMS`.
        if let Some(t) = own.or(timeout) {
            abort.timeout = OperationTimeout::from_timeout_ms(now, t);
        }
        // Nobody waits for it: the engine's `OperationFinished` finds no pending operation.
        engine.start_operation(abort, now);
    }
    // After the aborts: the engine ends a session once its last operation finished (SE-12).
    for session in requests.ends.drain(..) {
        engine.end_session(session, now);
    }
    true
}

/// The options of a session, given to [`Client::start_session_with`] and fixed for its life
/// (SE-10). Built with [`Default`] and the `with_*` methods.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct SessionOptions {
    /// TO-14: `defaultTimeoutMS`, the timeout of the session's `commitTransaction` and
    /// `abortTransaction` and of the abort of ending it (each call gets the whole of it, from
    /// the call), in place of the client's `timeoutMS`; zero for no limit (CSOT on, no
    /// `maxTimeMS`, TO-7). `None` (the default): the client's `timeoutMS`, if any (the session
    /// takes the client's value). It does not apply to the session's other operations. Under
    /// it `maxCommitTimeMS` is ignored (TO-8).
    pub default_timeout: Option<Duration>,
    /// The `defaultTransactionOptions`: the options of the session's transactions, field by
    /// field under those given to [`Session::start_transaction_with`] and over the client's
    /// concerns (`maxCommitTimeMS`, TO-6, included).
    pub default_transaction_options: TransactionOptions,
}

impl SessionOptions {
    /// These options with `defaultTimeoutMS` = `timeout` ([`SessionOptions::default_timeout`]).
    pub fn with_default_timeout(mut self, timeout: Duration) -> SessionOptions {
        self.default_timeout = Some(timeout);
        self
    }

    /// TO-14: these options with `defaultTimeoutMS` given in milliseconds: a usage error for a
    /// negative value (CS-1: a negative timeout is an error), never a panic.
    pub fn with_default_timeout_ms(self, ms: i64) -> Result<SessionOptions, OperationError> {
        match u64::try_from(ms) {
            Ok(ms) => Ok(self.with_default_timeout(Duration::from_millis(ms))),
            Err(_) => Err(OperationError::usage(format!(
                "defaultTimeoutMS must not be negative (got {ms})"
            ))),
        }
    }

    /// These options with `options` as the session's `defaultTransactionOptions`.
    pub fn with_default_transaction_options(
        mut self,
        options: TransactionOptions,
    ) -> SessionOptions {
        self.default_transaction_options = options;
        self
    }
}

/// `over`'s fields where set, else `under`'s (the transactions spec's inheritance, field by
/// field).
fn merged(under: TransactionOptions, over: TransactionOptions) -> TransactionOptions {
    let mut merged = under;
    if let Some(read_concern) = over.read_concern {
        merged = merged.with_read_concern(read_concern);
    }
    if let Some(write_concern) = over.write_concern {
        merged = merged.with_write_concern(write_concern);
    }
    if let Some(max_commit_time) = over.max_commit_time {
        merged = merged.with_max_commit_time(max_commit_time);
    }
    merged
}

impl<R> Client<R> {
    /// Starts an explicit session (SE-10) with the default [`SessionOptions`]: its commit and
    /// abort run under the client's `timeoutMS` (TO-14). Fails with
    /// [`OperationError::cancelled`] once the client is shut down (with a usage error once the
    /// runtime it was created on has shut down, review32 R5). The server session is taken at the
    /// first operation, after its connection is checked out (SE-7).
    pub async fn start_session(&self) -> Result<Session<R>, OperationError> {
        self.start_session_with(SessionOptions::default()).await
    }

    /// [`Client::start_session`] with `options` (`defaultTimeoutMS`, TO-14;
    /// `defaultTransactionOptions`), fixed for the session's life.
    pub async fn start_session_with(
        &self,
        options: SessionOptions,
    ) -> Result<Session<R>, OperationError> {
        let start = Arc::new(SessionStart::default());
        {
            let mut state = lock(&self.shared().state);
            if state.closing {
                return Err(state.closed_error());
            }
            state.sessions.starts.push(start.clone());
            state.wake_driver();
        }
        let waiter = self.waiter();
        let handle = poll_fn(|cx| {
            crate::client::drive(&waiter, cx);
            start.poll(cx)
        })
        .await;
        match handle {
            Some(handle) => Ok(Session {
                client: self.clone(),
                handle,
                options,
            }),
            None => Err(lock(&self.shared().state).closed_error()),
        }
    }
}

/// An explicit session of a [`Client`]: run several operations in it, then drop it (or call
/// [`Session::end`]) to end it. Its operations carry one `lsid`; its retryable writes get
/// increasing `txnNumber`s; after [`Session::end`] the engine refuses its handle (SE-10). It is
/// causally consistent (SE-21, always on: there is no option to turn it off): the engine sends
/// its `find`, `aggregate`, `count` and `distinct` reads (and a transaction's first command)
/// with `readConcern.afterClusterTime`, the latest `operationTime` of its replies; generic
/// commands ([`OperationKind::RunCommand`]) get
/// none. A session keeps its client alive. Sessions are not meant for concurrent use (SE-10).
pub struct Session<R> {
    client: Client<R>,
    handle: SessionHandle,
    /// Its options (SE-10: fixed).
    options: SessionOptions,
}

impl<R> fmt::Debug for Session<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl<R> Session<R> {
    /// The engine's handle for this session (for [`CommandOptions::session`]).
    pub fn handle(&self) -> SessionHandle {
        self.handle
    }

    /// The options it was started with.
    pub fn options(&self) -> &SessionOptions {
        &self.options
    }

    /// [`Client::run_command`] in this session.
    pub async fn run_command(
        &self,
        db: &str,
        command: Document,
        kind: OperationKind,
    ) -> Result<Document, OperationError> {
        let reply = self
            .run(db, command, kind, CommandOptions::default())
            .await?;
        Ok(reply.document)
    }

    /// [`Client::command`] in this session: the client's write and read concern where they
    /// apply, outside a transaction (inside one the engine drops them: the transaction's own
    /// apply, TX-1), and the kind [`Client::classify`] gives.
    pub async fn command(&self, db: &str, command: Document) -> Result<Document, OperationError> {
        let (command, kind) = self.client.with_concerns(command);
        let options = CommandOptions::default().with_concerns_inherited();
        let reply = self.run(db, command, kind, options).await?;
        Ok(reply.document)
    }

    /// [`Client::run`] in this session (its `options.session` is replaced by this one). Inside
    /// a transaction the engine runs the command as [`OperationKind::InTransaction`] on a
    /// writable server (with `txnNumber` and `autocommit: false`, TX-1); a `readConcern` or
    /// `writeConcern` of its own is then a usage error, inherited ones
    /// ([`CommandOptions::concerns_inherited`]) are dropped. A command outside a transaction
    /// ends a committed or aborted one (TX-2, TX-4 (5)).
    pub async fn run(
        &self,
        db: &str,
        command: Document,
        kind: OperationKind,
        options: CommandOptions,
    ) -> Result<Reply, OperationError> {
        let options = CommandOptions {
            session: Some(self.handle),
            ..options
        };
        self.client.run(db, command, kind, options).await
    }

    /// Starts a transaction (TX-2: an error while one is in progress) with the session's
    /// `defaultTransactionOptions` ([`SessionOptions::default_transaction_options`]), and where
    /// they leave a field unset the client's read concern level on its first command and its
    /// write concern on commit and abort (TX-1, TX-11). A connection or mongos the session was
    /// pinned to is let go now (TX-4 (4)); the first command written starts the transaction on
    /// the server. Fails with [`OperationError::cancelled`] once the client is shut down.
    pub async fn start_transaction(&self) -> Result<(), OperationError> {
        self.start_transaction_with(TransactionOptions::default())
            .await
    }

    /// What the engine knows of this session ([`Engine::session_info`]: its `lsid` once its
    /// first command took a server session, whether that is dirty, its transaction's pin and
    /// state); `None` once the client is shut down.
    pub async fn info(&self) -> Option<SessionInfo> {
        let answer = Arc::new(SessionStart::<Option<SessionInfo>>::default());
        {
            let mut state = lock(&self.client.shared().state);
            if state.closing {
                return None;
            }
            state.sessions.infos.push((self.handle, answer.clone()));
            state.wake_driver();
        }
        let waiter = self.client.waiter();
        poll_fn(|cx| {
            crate::client::drive(&waiter, cx);
            answer.poll(cx)
        })
        .await
    }

    /// [`Session::start_transaction`] with these options in place of the session's defaults
    /// and the client's concerns, field by field: a field left `None` keeps the session's
    /// default, else the client's (the transactions spec's inheritance). TO-6: a
    /// `max_commit_time` above `i32::MAX` ms is a usage error.
    pub async fn start_transaction_with(
        &self,
        options: TransactionOptions,
    ) -> Result<(), OperationError> {
        let defaults = merged(
            self.client.transaction_options(),
            self.options.default_transaction_options.clone(),
        );
        let options = merged(defaults, options);
        let start = Arc::new(TransactionStart::default());
        {
            let mut state = lock(&self.client.shared().state);
            if state.closing {
                return Err(state.closed_error());
            }
            state
                .sessions
                .transactions
                .push((self.handle, options, start.clone()));
            state.wake_driver();
        }
        let waiter = self.client.waiter();
        poll_fn(|cx| {
            crate::client::drive(&waiter, cx);
            start.poll(cx)
        })
        .await
    }

    /// Commits the transaction (TX-2): nothing is sent when it wrote no command; a second commit
    /// runs again with majority write concern (TX-11). The engine retries it once (TX-10) and
    /// labels its errors (TX-8). The transaction is committed afterwards whatever the result.
    /// It runs under the session's `defaultTimeoutMS`, else the client's `timeoutMS` (TO-14);
    /// under neither, the transaction's `maxCommitTimeMS` is its `maxTimeMS` (TO-6).
    pub async fn commit_transaction(&self) -> Result<(), OperationError> {
        self.end_transaction(
            "commitTransaction",
            OperationKind::CommitTransaction { again: false },
        )
        .await
    }

    /// Aborts the transaction (TX-2): nothing is sent when it wrote no command; the engine
    /// retries `abortTransaction` once (TX-10) and its server and network errors are ignored
    /// (TX-10); a call in the wrong state fails with its usage error. The transaction is aborted
    /// afterwards. It runs under the session's `defaultTimeoutMS`, else the client's
    /// `timeoutMS` (TO-14).
    pub async fn abort_transaction(&self) -> Result<(), OperationError> {
        match self
            .end_transaction("abortTransaction", OperationKind::AbortTransaction)
            .await
        {
            Err(error) if matches!(error.kind, ErrorKind::Cancelled | ErrorKind::Usage { .. }) => {
                Err(error)
            }
            _ => Ok(()),
        }
    }

    /// Sends `name` on `admin`; the engine decides whether it is sent (TX-2). TO-14: under the
    /// session's `defaultTimeoutMS` as the request's own timeout, else the client's `timeoutMS`.
    async fn end_transaction(&self, name: &str, kind: OperationKind) -> Result<(), OperationError> {
        let mut command = Document::new();
        command.insert(name, 1);
        let options = CommandOptions {
            criteria: Some(SelectionCriteria::Write),
            session: Some(self.handle),
            ..CommandOptions::default()
        };
        let timeout = self.options.default_timeout;
        self.client
            .run_with_timeout("admin", command, kind, options, timeout)
            .await
            .map(|_| ())
    }

    /// Ends the session now (as dropping it does): a transaction in progress is aborted (TX-2),
    /// under the session's `defaultTimeoutMS`, else the client's `timeoutMS` (TO-14), then its
    /// server session goes back to the pool.
    pub fn end(self) {}
}

impl<R> Drop for Session<R> {
    /// Ends the session; a transaction in progress is aborted first (TX-2: ending a session
    /// aborts its transaction), without waiting for the reply.
    fn drop(&mut self) {
        let mut state = lock(&self.client.shared().state);
        if !state.closing {
            // The engine sends it only when the transaction is in progress (TX-2).
            let mut command = Document::new();
            command.insert("abortTransaction", 1);
            let mut request = OperationRequest::new(
                "admin",
                command,
                OperationKind::AbortTransaction,
                SelectionCriteria::Write,
            );
            request.session = Some(self.handle);
            // TO-14: ending the session is covered by its `defaultTimeoutMS`.
            let timeout = self.options.default_timeout;
            state.sessions.aborts.push((request, timeout));
            state.sessions.ends.push(self.handle);
            state.wake_driver();
        }
    }
}
