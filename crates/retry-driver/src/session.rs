//! Explicit sessions (SE-10): [`Client::start_session`] gives a [`Session`] whose operations share
//! one server session (one `lsid`, increasing `txnNumber`s, its own `$clusterTime`); dropping it
//! (or [`Session::end`]) ends it and returns its server session to the client's pool.
//!
//! The engine does the work ([`Engine::start_session`], [`Engine::end_session`]); this module
//! carries the requests to the driver task. Without an explicit session every operation runs in
//! an implicit one the engine takes and returns by itself (SE-9). A deployment without session
//! support fails an explicit session's operations with
//! [`retry_core::session::SESSIONS_UNSUPPORTED`] (SE-8), without sending them.

use core::fmt;
use core::future::poll_fn;
use core::task::{Context, Poll, Waker};
use std::sync::{Arc, Mutex};

use bson::Document;
use retry_core::engine::{Engine, SessionHandle};
use retry_core::error::OperationError;
use retry_core::retry::OperationKind;
use retry_core::time::Instant;

use crate::client::{Client, CommandOptions};
use crate::shared::{lock, Reply};

/// Where a started session's handle goes: `Some(None)` when the client closed first.
#[derive(Default)]
pub(crate) struct SessionStart {
    state: Mutex<(Option<Option<SessionHandle>>, Option<Waker>)>,
}

impl SessionStart {
    fn complete(&self, handle: Option<SessionHandle>) {
        let mut state = lock(&self.state);
        state.0 = Some(handle);
        if let Some(waker) = state.1.take() {
            waker.wake();
        }
    }

    fn poll(&self, cx: &Context<'_>) -> Poll<Option<SessionHandle>> {
        let mut state = lock(&self.state);
        match state.0 {
            Some(handle) => Poll::Ready(handle),
            None => {
                state.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// The sessions the client asked the driver to start and to end.
#[derive(Default)]
pub(crate) struct SessionRequests {
    starts: Vec<Arc<SessionStart>>,
    ends: Vec<SessionHandle>,
}

impl SessionRequests {
    /// The client closed: the starts not served get no session.
    pub(crate) fn refuse_starts(&mut self) {
        for start in self.starts.drain(..) {
            start.complete(None);
        }
    }
}

/// The driver's side: starts and ends the requested sessions in `engine`; whether there were any.
pub(crate) fn serve(engine: &mut Engine, requests: &mut SessionRequests, now: Instant) -> bool {
    let any = !requests.starts.is_empty() || !requests.ends.is_empty();
    for start in requests.starts.drain(..) {
        start.complete(Some(engine.start_session()));
    }
    for session in requests.ends.drain(..) {
        engine.end_session(session, now);
    }
    any
}

impl<R> Client<R> {
    /// Starts an explicit session (SE-10). Fails with [`OperationError::cancelled`] once the
    /// client is shut down. The server session is taken at the first operation, after its
    /// connection is checked out (SE-7).
    pub async fn start_session(&self) -> Result<Session<R>, OperationError> {
        let start = Arc::new(SessionStart::default());
        {
            let mut state = lock(&self.shared().state);
            if state.closing {
                return Err(OperationError::cancelled());
            }
            state.sessions.starts.push(start.clone());
            state.wake_driver();
        }
        let handle = poll_fn(|cx| {
            self.drive(cx);
            start.poll(cx)
        })
        .await;
        match handle {
            Some(handle) => Ok(Session {
                client: self.clone(),
                handle,
            }),
            None => Err(OperationError::cancelled()),
        }
    }
}

/// An explicit session of a [`Client`]: run several operations in it, then drop it (or call
/// [`Session::end`]) to end it. Its operations carry one `lsid`; its retryable writes get
/// increasing `txnNumber`s; after [`Session::end`] the engine refuses its handle (SE-10). A
/// session keeps its client alive. Sessions are not meant for concurrent use (SE-10).
pub struct Session<R> {
    client: Client<R>,
    handle: SessionHandle,
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

    /// [`Client::run`] in this session (its `options.session` is replaced by this one).
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

    /// Ends the session now (as dropping it does): its server session goes back to the pool.
    pub fn end(self) {}
}

impl<R> Drop for Session<R> {
    fn drop(&mut self) {
        let mut state = lock(&self.client.shared().state);
        if !state.closing {
            state.sessions.ends.push(self.handle);
            state.wake_driver();
        }
    }
}
