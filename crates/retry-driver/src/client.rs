//! The friendly API: [`Client`], its operations, its event stream and its shutdown.

use core::fmt;
use core::future::{poll_fn, Future};
use core::marker::PhantomData;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::io;
use std::sync::Arc;

use bson::{Document, RawDocumentBuf};
use retry_core::engine::{CursorUse, Engine, EngineError, OperationRequest, SessionHandle};
use retry_core::error::OperationError;
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, SelectionCriteria};

use crate::concerns::Concerns;
use crate::connection_string::ConnectionString;
use crate::driver::{Driver, LocalDriver, SpawnedDriver, Waiter};
use crate::options::{ClientOptions, OptionsError};
use crate::runtime::Runtime;
use crate::shared::{lock, EventQueue, RawReply, Reply, Shared, Slot, TimedEvent};
use crate::srv::resolve_seedlist;
use crate::tls::TlsRuntime;

/// How [`Client::run`] runs one command; the default is [`Client::run_command`]'s. Built with
/// [`Default`] and the `with_*` methods.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct CommandOptions {
    /// Where it may run; `None` picks a writable server for writes, the primary for a generic
    /// command (SS-10) and the client's read preference otherwise (SS-2).
    pub criteria: Option<SelectionCriteria>,
    /// How it relates to a cursor.
    pub cursor: CursorUse,
    /// The explicit session (from [`Client::start_session`](crate::Client::start_session));
    /// `None` runs the command in an implicit session (SE-9).
    pub session: Option<SessionHandle>,
    /// The command's `readConcern` / `writeConcern` are inherited defaults (the client's, a
    /// database's or a collection's), not its own: inside a transaction the engine drops them
    /// (TX-1), where its own would be a usage error
    /// ([`OperationRequest::concerns_inherited`]).
    pub concerns_inherited: bool,
}

impl CommandOptions {
    /// These options, run where `criteria` selects.
    pub fn with_criteria(mut self, criteria: SelectionCriteria) -> CommandOptions {
        self.criteria = Some(criteria);
        self
    }

    /// These options, with the command opening, continuing or closing a cursor.
    pub fn with_cursor(mut self, cursor: CursorUse) -> CommandOptions {
        self.cursor = cursor;
        self
    }

    /// These options, in the explicit session `session`.
    pub fn with_session(mut self, session: SessionHandle) -> CommandOptions {
        self.session = Some(session);
        self
    }

    /// These options, the command's concerns being inherited defaults (see
    /// [`CommandOptions::concerns_inherited`]).
    pub fn with_concerns_inherited(mut self) -> CommandOptions {
        self.concerns_inherited = true;
        self
    }
}

/// Why a client could not be created.
///
/// Its text includes the wrapped error's; [`std::error::Error::source`] goes on from there, to
/// the wrapped error's own source, as `io::Error` does for the error it wraps: a chained report
/// (`anyhow`, `eyre`) prints each text once (review32 R15). Match the variant for the wrapped
/// error itself.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectError {
    /// A bad URI or option (e.g. `directConnection=true` with two hosts), or with
    /// [`Client::with_uri`] an option or value [`ClientOptions::parse`] would drop with a
    /// warning (e.g. `maxAdaptiveRetries=-1`; see [`ClientOptions::parse_strict`]).
    Options(OptionsError),
    /// The engine refused the settings of [`ClientOptions`] built or changed by hand (e.g.
    /// `direct_connection` with several hosts, `load_balanced` with a strict Stable API).
    Settings(EngineError),
    /// The runtime could not be used (e.g. no tokio runtime is running).
    Runtime(io::Error),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Options(e) => e.fmt(f),
            ConnectError::Settings(e) => write!(f, "invalid settings: {e}"),
            ConnectError::Runtime(e) => write!(f, "no runtime: {e}"),
        }
    }
}

impl std::error::Error for ConnectError {
    /// The wrapped error's source: its own text is in this error's already.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Options(e) => std::error::Error::source(e),
            ConnectError::Settings(e) => std::error::Error::source(e),
            ConnectError::Runtime(e) => std::error::Error::source(e),
        }
    }
}

impl From<OptionsError> for ConnectError {
    fn from(e: OptionsError) -> ConnectError {
        ConnectError::Options(e)
    }
}

/// Closes the client when the last clone goes.
struct Inner {
    shared: Arc<Shared>,
    /// SS-2: the read preference of reads that name none (`readPreference`, ...).
    read_preference: ReadPreference,
    /// The driver, when the runtime does not spawn it: the client's futures drive it.
    local: Option<Arc<LocalDriver>>,
    /// The driver, when the runtime spawns its task.
    spawned: Option<Arc<SpawnedDriver>>,
    /// The client's write and read concern, inherited by [`Client::command`] and
    /// [`Client::cursor`] commands without their own.
    concerns: Concerns,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.close();
        // A driver without a task of its own closes now: nobody else will poll it.
        if let Some(local) = &self.local {
            local.run(&Context::from_waker(Waker::noop()));
        }
    }
}

/// [`Client::run_request`]'s future: the result of an operation queued by the call. Its first
/// poll starts the operation itself when it is the only one in flight and the driver has a task
/// ([`SpawnedDriver::run_inline`]); each poll runs the driver first when the client's futures
/// drive it ([`Waiter::drive`]), except a first poll while callers woken for their results have
/// them to take ([`Shared::results_to_take`]): it leaves the start to one pass for them all
/// ([`Waiter::defer`]: its own task is woken to run it, and the driver's watchdog bounds the
/// wait if it is never polled again; review25 R1, R5). Dropped before it finished, it cancels
/// its operation in the engine.
struct ReplyFuture<'a> {
    inner: &'a Inner,
    /// Its place among the futures that run the driver, when they do.
    waiter: Option<Waiter>,
    /// The operation's slot; `None` if the client was shut down before it was queued.
    reply: Option<Arc<Slot>>,
    /// The only operation in flight when queued.
    alone: bool,
    /// Its first poll is still to come (where it marks the local driver or starts a lone
    /// operation).
    first: bool,
    /// It returned the result.
    done: bool,
}

impl Future for ReplyFuture<'_> {
    type Output = Result<RawReply, OperationError>;

    fn poll(self: core::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(reply) = &this.reply else {
            // Refused at queueing: the client is closing (cold: its reason is read only now).
            return Poll::Ready(Err(lock(&this.inner.shared.state).closed_error()));
        };
        let results = &this.inner.shared.results_to_take;
        if core::mem::take(&mut this.first) {
            if let Some(local) = &this.inner.local {
                local.mark();
                // Other callers have results to take, and may queue operations next: one pass
                // starts them all (issue 9).
                if let (Some(waiter), true) = (&this.waiter, results.any()) {
                    waiter.defer(cx);
                    let result = reply.poll(cx, results);
                    this.done = result.is_ready();
                    return result;
                }
            }
            if let (true, Some(spawned)) = (this.alone, &this.inner.spawned) {
                // The only operation in flight: this caller starts it, unless the driver is busy.
                reply.driving(|| {
                    if !spawned.run_inline() {
                        lock(&this.inner.shared.state).wake_driver();
                    }
                });
            }
        }
        if let Some(waiter) = &this.waiter {
            if reply.is_completed() {
                // Its result is in: it returns it now and waits no more, so it does not
                // register again (issue 9); it still runs what the driver has to do, unless a
                // pass another future deferred is owed ([`Waiter::run`]).
                reply.driving(|| waiter.run(cx));
            } else {
                reply.driving(|| waiter.drive(cx));
            }
        }
        let result = reply.poll(cx, results);
        this.done = result.is_ready();
        result
    }
}

impl Drop for ReplyFuture<'_> {
    fn drop(&mut self) {
        if let (false, Some(reply)) = (self.done, &self.reply) {
            self.inner.shared.abandon(reply);
        }
    }
}

/// A MongoDB client driven on the runtime `R`. Cheap to clone; dropping the last clone shuts it
/// down as [`Client::shutdown`] does, without waiting.
pub struct Client<R> {
    inner: Arc<Inner>,
    runtime: PhantomData<fn() -> R>,
}

impl<R> Clone for Client<R> {
    fn clone(&self) -> Client<R> {
        Client {
            inner: self.inner.clone(),
            runtime: PhantomData,
        }
    }
}

impl<R> fmt::Debug for Client<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl<R: Runtime> Client<R> {
    /// Creates the engine and its driver on a new `R`: spawned when the runtime spawns (server
    /// monitoring starts at once), otherwise driven by the client's futures on the caller's
    /// executor (monitoring runs while one of them is polled). Nothing waits for a server.
    pub fn connect(options: ClientOptions) -> Result<Client<R>, ConnectError> {
        Client::connect_on(R::start().map_err(ConnectError::Runtime)?, options)
    }

    /// [`Client::connect`] on `runtime`, a started `R` configured beforehand (e.g. the name
    /// servers of an adapter's `with_nameservers`), instead of a new one.
    pub fn connect_on(runtime: R, options: ClientOptions) -> Result<Client<R>, ConnectError> {
        Client::start(runtime, options, None)
    }

    /// [`Client::connect`] with an event stream subscribed before the driver starts, so that it
    /// holds every event from the first one on: the SDAM events of the monitors' first checks
    /// included, which [`Client::events`] called after `connect` can miss (monitoring starts at
    /// once). A runtime that does not spawn runs nothing before the first poll either way.
    pub fn connect_with_events(
        options: ClientOptions,
    ) -> Result<(Client<R>, Events), ConnectError> {
        let queue = Arc::new(EventQueue::default());
        let client = Client::start(
            R::start().map_err(ConnectError::Runtime)?,
            options,
            Some(queue.clone()),
        )?;
        let events = Events {
            queue,
            waiter: client.waiter(),
        };
        Ok((client, events))
    }

    /// Builds the engine and its driver on `runtime`, with `subscriber` (if any) listening
    /// before the driver first runs.
    fn start(
        runtime: R,
        options: ClientOptions,
        subscriber: Option<Arc<EventQueue>>,
    ) -> Result<Client<R>, ConnectError> {
        let mut runtime: Arc<dyn Runtime> = Arc::new(runtime);
        if let Some(tls) = &options.tls {
            runtime = Arc::new(TlsRuntime::new(runtime, tls.client_config()?));
        }
        let engine_options = options.engine_options()?;
        let concerns = Concerns::new(
            options.write_concern.as_ref(),
            options.read_concern_level.as_deref(),
            options.timeout.is_some(),
        );
        let engine = Engine::new(engine_options, runtime.now()).map_err(ConnectError::Settings)?;
        let shared = Arc::new(Shared::default());
        if let Some(subscriber) = subscriber {
            lock(&shared.state).subscribers.push(subscriber);
        }
        let driver = Driver::new(runtime.clone(), engine, shared.clone(), options.timeout)
            .with_srv_polling(options.srv.clone());
        let (local, spawned) = if runtime.spawns() {
            let spawned = SpawnedDriver::new(driver);
            runtime
                .spawn(Box::pin(spawned.task()))
                .map_err(ConnectError::Runtime)?;
            (None, Some(spawned))
        } else {
            (Some(Arc::new(LocalDriver::new(driver))), None)
        };
        Ok(Client {
            inner: Arc::new(Inner {
                shared,
                read_preference: options.read_preference.clone(),
                local,
                spawned,
                concerns,
            }),
            runtime: PhantomData,
        })
    }

    /// [`Client::with_uri`] for `mongodb+srv://` URIs as well: their SRV and TXT records are
    /// looked up through the runtime ([`Runtime::resolve_srv`], [`Runtime::resolve_txt`]) before
    /// anything connects (SRV-2), and the seed list they give is used (SRV-3..SRV-6). As
    /// [`Client::with_uri`], it refuses a URI (or TXT record) with an option or value
    /// [`ClientOptions::parse`] would drop with a warning ([`ClientOptions::parse_strict`],
    /// review32 R1).
    pub async fn with_uri_async(uri: &str) -> Result<Client<R>, ConnectError> {
        Client::with_uri_async_on(R::start().map_err(ConnectError::Runtime)?, uri).await
    }

    /// [`Client::with_uri_async`] on `runtime`, a started `R` configured beforehand, which does
    /// the DNS lookups too.
    pub async fn with_uri_async_on(runtime: R, uri: &str) -> Result<Client<R>, ConnectError> {
        let mut cs = ConnectionString::parse(uri)?;
        if cs.srv {
            cs = resolve_seedlist(&runtime, &cs, crate::options::os_seed()).await?;
        }
        Client::connect_on(runtime, ClientOptions::from_connection_string_strict(&cs)?)
    }

    /// [`Client::connect`] with the options of a `mongodb://` URI, read by
    /// [`ClientOptions::parse_strict`]: what [`ClientOptions::parse`] would drop with a
    /// warning (URI-7: an unknown option, an invalid value, `compressors`,
    /// `serverSelectionTryOnce`, a repeated option's earlier value, a deprecated name shadowed
    /// by its replacement) is a [`ConnectError::Options`] naming the option and the value as
    /// written, never dropped silently (house rule 11, review32 R1), e.g. `invalid
    /// maxAdaptiveRetries "-1": expected an integer from 0 to 2147483647`. A deprecated spelling
    /// that `parse` applies in full (`journal=yes`, `wtimeout=5000`) is accepted (review34 Y3).
    /// To accept what is dropped, as the URI-options spec allows, call [`ClientOptions::parse`],
    /// log its [`ClientOptions::warnings`] and [`Client::connect`].
    pub fn with_uri(uri: &str) -> Result<Client<R>, ConnectError> {
        Client::connect(ClientOptions::parse_strict(uri)?)
    }
}

impl<R> Client<R> {
    /// What the client shares with its driver.
    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// A place among the futures waiting on the driver, for a client future that waits on it
    /// and runs it meanwhile ([`Waiter::drive`]), when the client's futures drive it.
    pub(crate) fn waiter(&self) -> Option<Waiter> {
        self.inner.local.as_ref().map(LocalDriver::waiter)
    }

    /// Runs `command` on `db` as an operation of `kind`: writes go to a writable server, a
    /// generic command ([`OperationKind::RunCommand`]) to the primary whatever the client's read
    /// preference (SS-10; [`Client::run`] takes an explicit one), the rest use the client's read
    /// preference (`readPreference`, primary by default, SS-2). Returns
    /// the reply, or the error the engine's retry rules chose; [`OperationError::cancelled`] once
    /// the client is shut down. The engine adds the session fields (`lsid`, `txnNumber`,
    /// `$clusterTime`), `maxTimeMS`, `$db` and `$readPreference` itself; the run-command spec
    /// leaves a command that holds one of them undefined, and today a field the engine adds
    /// replaces the command's own (each is sent once: a server refuses a duplicate).
    ///
    /// When the client declares a Stable API version ([`ClientOptions::server_api`]), every
    /// command carries the client's `apiVersion` (and `apiStrict` /
    /// `apiDeprecationErrors` when set). A command holding its own such field is not supported
    /// then, and the versioned-api spec ("Generic command helper") leaves its behaviour
    /// undefined; today the client's fields replace the command's.
    pub async fn run_command(
        &self,
        db: &str,
        command: Document,
        kind: OperationKind,
    ) -> Result<Document, OperationError> {
        // Issue 9: `run`'s steps written out, not its future nested (each level copied the
        // command and the request into its own state).
        let operation = self.operation(String::new(), command, kind, CommandOptions::default());
        let reply = self.run_request(operation, db, None).await?;
        Ok(self.reply(reply)?.document)
    }

    /// [`Client::run_command`] returning the reply as the server encoded it: nothing is
    /// converted into a [`Document`] (no tree, no per-field allocation), for callers that read
    /// a few fields in place (`RawDocument::get`) or drop the reply. Convert it with
    /// [`retry_core::wire::to_document`] when needed, which gives [`Client::run_command`]'s
    /// document. A write reply with `writeErrors` is an error here too.
    pub async fn run_command_raw(
        &self,
        db: &str,
        command: Document,
        kind: OperationKind,
    ) -> Result<RawDocumentBuf, OperationError> {
        let operation = self.operation(String::new(), command, kind, CommandOptions::default());
        Ok(self.run_request(operation, db, None).await?.checked()?.body)
    }

    /// [`Client::run_command`] with explicit selection criteria, cursor use and session. The
    /// reply carries the cursor a [`CursorUse::Open`] command opened, for its `getMore`s
    /// ([`CursorUse::GetMore`]) to follow it to its server (with its session, SE-14). Dropping
    /// the future before it finished cancels the operation in the engine (its attempt in flight
    /// is failed and its connection closed).
    pub async fn run(
        &self,
        db: &str,
        command: Document,
        kind: OperationKind,
        options: CommandOptions,
    ) -> Result<Reply, OperationError> {
        let operation = self.operation(String::new(), command, kind, options);
        let reply = self.run_request(operation, db, None).await?;
        self.reply(reply)
    }

    /// [`Client::run`] under the operation's own CSOT `timeout`, when given, in place of the
    /// client's `timeoutMS`: the driver makes it a deadline when it starts the operation, as it
    /// does the client's. For a session's `commitTransaction` and `abortTransaction`, under its
    /// `defaultTimeoutMS` (TO-14).
    pub(crate) async fn run_with_timeout(
        &self,
        db: &str,
        command: Document,
        kind: OperationKind,
        options: CommandOptions,
        timeout: Option<Duration>,
    ) -> Result<Reply, OperationError> {
        let operation = self.operation(String::new(), command, kind, options);
        let reply = self.run_request(operation, db, timeout).await?;
        self.reply(reply)
    }

    /// `raw` converted ([`RawReply::into_reply`]) into clones of the client's empty document.
    fn reply(&self, raw: RawReply) -> Result<Reply, OperationError> {
        raw.into_reply(&self.shared().empty_document.0)
    }

    /// [`Client::run_command_raw`] with the command already encoded (issue 9): its bytes go on
    /// the wire as they are, followed by the fields the engine adds (`$db`, `lsid`,
    /// `$clusterTime`, `maxTimeMS`, ...; [`OperationRequest::new_raw`]), so neither the command
    /// nor the reply is ever a [`Document`]: for callers that build or reuse BSON bytes
    /// (`bson::rawdoc!`). Writes go to a writable server, a generic command to the primary
    /// (SS-10), the rest use the client's read preference (SS-2). The client owns `$db` (WP-5): one in the command is replaced by `db`.
    /// A command holding `$db`, `lsid` or `txnNumber` is converted to a [`Document`] once at
    /// the start, as [`OperationRequest::new_raw`] says. A command that is not well-formed BSON,
    /// or holds a top-level key more than once (a server refuses a duplicate field), fails with
    /// a usage error, nothing sent. A write reply with `writeErrors` is an error here too.
    ///
    /// Under a declared Stable API version the engine adds `apiVersion` (and `apiStrict` /
    /// `apiDeprecationErrors` when set) too. A command holding its own such field is not
    /// supported then (undefined behaviour in the versioned-api spec, as for
    /// [`Client::run_command`]); today it is converted to a [`Document`] once at the start,
    /// losing the encoded path's saving, and the client's fields replace the command's.
    pub async fn run_command_encoded(
        &self,
        db: &str,
        command: RawDocumentBuf,
        kind: OperationKind,
    ) -> Result<RawDocumentBuf, OperationError> {
        let criteria = self.criteria(kind, None);
        let operation = OperationRequest::new_raw(String::new(), command, kind, criteria);
        Ok(self.run_request(operation, db, None).await?.checked()?.body)
    }

    /// Runs `operation` on `db` (its database name, written when it is queued) and waits for
    /// its reply; dropping the future cancels it. `timeout`: the operation's own CSOT timeout,
    /// in place of the client's `timeoutMS` (TO-14, [`Client::run_with_timeout`]). The operation is queued at once, by the call,
    /// and the future only waits (issue 9: the request is never moved into a future's state,
    /// which copied its 232 bytes at each level; and the future is a [`ReplyFuture`], whose
    /// poll hands the slot's result on as it is, not through an `async` block's). Callers call
    /// it from an `async` body, so it is queued on their future's first poll, as if it were an
    /// `async fn`.
    fn run_request(
        &self,
        operation: OperationRequest,
        db: &str,
        timeout: Option<Duration>,
    ) -> ReplyFuture<'_> {
        // A future that drives the engine itself runs it next: no wake.
        let wake = self.inner.local.is_none();
        let queued = self.queue(operation, Some(db), timeout, wake, true);
        let waiter = self.waiter();
        let (reply, alone) = match queued {
            Ok((reply, alone)) => (Some(reply), alone),
            Err(_) => (None, false),
        };
        ReplyFuture {
            inner: &self.inner,
            waiter,
            reply,
            alone,
            first: true,
            done: false,
        }
    }

    /// Item 4 of #10 (RR-3, RR-4, RW-3, RW-4): [`Client::run_command`] with the kind
    /// [`retry_core::classify::classify`] reads from the command and the client's write concern
    /// (`update` with `multi: true`, `delete` with `limit: 0`, `aggregate` with `$out` / `$merge`
    /// and `w: 0` are not retryable writes; `find`, `count`, ... are retryable reads; unknown
    /// commands are neither). A write reply with `writeErrors` is an error
    /// ([`retry_core::error::ErrorKind::Write`], keeping the reply); one with a
    /// `writeConcernError` is a server error, retried by the retryable-writes rules.
    ///
    /// Unlike [`Client::run_command`], it adds the client's write concern (`w`, `journal`,
    /// `wTimeoutMS`; not `wTimeoutMS` under `timeoutMS`, TO-8) to a write and its
    /// `readConcernLevel` to a read that support them and have none of their own (the
    /// read-write-concern spec); so a `w=0` write is sent unacknowledged and without an implicit
    /// session (SE-13).
    ///
    /// Server selection follows the kind (review35 Z4): a command it classifies as a read
    /// (`find`, `count`, `distinct`, `aggregate` without a write stage, ...) inherits the client's
    /// read preference, as a helper that may use a secondary does (SS-10); a write goes to a
    /// writable server; an unclassified command goes to the primary, as the run-command spec
    /// requires of a generic command. So this is not the run-command spec's `runCommand`: for
    /// that (the primary unless a read preference is given, whatever the command; no
    /// `txnNumber`; never retried by the retryable-reads or -writes rules) use
    /// [`Client::run_command`] or [`Client::run`] with [`OperationKind::RunCommand`].
    pub async fn command(&self, db: &str, command: Document) -> Result<Document, OperationError> {
        let (command, kind) = self.with_concerns(command);
        self.run_command(db, command, kind).await
    }

    /// The [`OperationKind`] [`Client::command`] and [`Client::cursor`] give `command`: by the
    /// retryable-reads and retryable-writes specs, with the client's `w` as the inherited write
    /// concern.
    pub fn classify(&self, command: &Document) -> OperationKind {
        retry_core::classify::classify(command, &[], self.inner.concerns.write.as_ref())
    }

    /// TX-1, TX-11: the client's concerns as a transaction's: its read concern level on the
    /// first command, its write concern on commit and abort.
    pub(crate) fn transaction_options(&self) -> retry_core::transaction::TransactionOptions {
        let mut options = retry_core::transaction::TransactionOptions::default();
        if let Some(level) = &self.inner.concerns.read_level {
            options = options.with_read_concern(bson::doc! { "level": level.as_str() });
        }
        if let Some(write) = &self.inner.concerns.write {
            options = options.with_write_concern(write.clone());
        }
        options
    }

    /// `command` with the client's concerns where they apply ([`Client::command`]), and its
    /// kind ([`Client::classify`]).
    pub(crate) fn with_concerns(&self, mut command: Document) -> (Document, OperationKind) {
        self.inner.concerns.apply(&mut command);
        let kind = self.classify(&command);
        (command, kind)
    }

    /// The engine's request for `command`: `options.criteria`, or a writable server for writes
    /// and the client's read preference otherwise (SS-2). Never fails: building a request checks
    /// nothing (review23 R9).
    pub(crate) fn operation(
        &self,
        db: impl Into<String>,
        command: Document,
        kind: OperationKind,
        options: CommandOptions,
    ) -> OperationRequest {
        let criteria = self.criteria(kind, options.criteria);
        let mut operation = OperationRequest::new(db, command, kind, criteria);
        operation.cursor = options.cursor;
        operation.session = options.session;
        operation.concerns_inherited = options.concerns_inherited;
        operation
    }

    /// `criteria`, or a writable server for writes, the primary for a generic command (SS-10:
    /// it ignores the inherited read preference), and the client's read preference otherwise
    /// (SS-2).
    fn criteria(
        &self,
        kind: OperationKind,
        criteria: Option<SelectionCriteria>,
    ) -> SelectionCriteria {
        match criteria {
            Some(criteria) => criteria,
            None if matches!(
                kind,
                OperationKind::RetryableWrite | OperationKind::NonRetryableWrite
            ) =>
            {
                SelectionCriteria::Write
            }
            None if kind == OperationKind::RunCommand => {
                SelectionCriteria::Read(ReadPreference::default())
            }
            None => SelectionCriteria::Read(self.inner.read_preference.clone()),
        }
    }

    /// Queues `operation` for the driver and wakes it; its result will be in the returned slot.
    /// [`OperationError::cancelled`] once the client is shut down.
    pub(crate) fn submit(&self, operation: OperationRequest) -> Result<Arc<Slot>, OperationError> {
        Ok(self.queue(operation, None, None, true, false)?.0)
    }

    /// [`Client::submit`], waking the driver only if `wake`; with `inline` and a spawned driver,
    /// not if the operation is the only one in flight either, which the caller then starts
    /// itself ([`SpawnedDriver::run_inline`]): the second value says so. With `db`, the
    /// operation's database name is written into a spare string
    /// ([`crate::shared::SharedState::db_name`]); `timeout` is its own CSOT timeout (TO-14,
    /// [`crate::shared::SharedState::slot`]).
    #[inline(always)]
    fn queue(
        &self,
        operation: OperationRequest,
        db: Option<&str>,
        timeout: Option<Duration>,
        wake: bool,
        inline: bool,
    ) -> Result<(Arc<Slot>, bool), OperationError> {
        let mut state = lock(&self.inner.shared.state);
        if state.closing {
            return Err(state.closed_error());
        }
        let alone = inline
            && self.inner.spawned.is_some()
            && state.operations == 0
            && state.requests.is_empty();
        let reply = state.slot(operation, db, timeout);
        state.requests.push_back(reply.clone());
        if wake && !alone {
            state.wake_driver();
        }
        Ok((reply, alone))
    }

    /// Every engine event from now on (operation results, command and retry events, CMAP, SDAM
    /// and heartbeat events), in order, each with the instant on the client's clock (time since
    /// its creation) at which the driver took it from the engine. Ends when the client shuts
    /// down. Events queue until taken; drop the stream to stop them. Command events
    /// ([`EngineEvent::Command`](retry_core::engine::EngineEvent::Command), EV-1..EV-6) are
    /// published only while a stream is alive, for commands written from then on; CMAP, SDAM
    /// and heartbeat events ([`EventFamilies`](retry_core::engine::EventFamilies)) only while a
    /// stream is alive. Retry and hedging events are published only while a stream is alive and
    /// only for operations the engine starts after the stream was created: an operation already
    /// in the engine then publishes none, not even for its later attempts. Without a stream the
    /// engine does not queue these events.
    pub fn events(&self) -> Events {
        let queue = Arc::new(EventQueue::default());
        let mut state = lock(&self.inner.shared.state);
        if state.done {
            queue.close();
        } else {
            state.subscribers.push(queue.clone());
        }
        Events {
            queue,
            waiter: self.waiter(),
        }
    }

    /// Shuts the client down: every operation in flight or queued fails with
    /// [`OperationError::cancelled`], every socket closes, every event stream ends. Completes
    /// when the driver has stopped; new operations fail at once, with `cancelled`. If the driver
    /// had already stopped without a shutdown, it returns at once, and the operations ended
    /// with that stop's cause (review34 Y6): after the runtime the client was created on shut
    /// down, the queued and later ones fail with a usage error saying so (those in flight then
    /// end `cancelled`, as they may have been sent); after a panic in the driver (a bug), all
    /// of them fail with an internal error saying so.
    pub async fn shutdown(&self) {
        self.inner.shared.close();
        let waiter = self.waiter();
        poll_fn(|cx| {
            drive(&waiter, cx);
            let mut state = lock(&self.inner.shared.state);
            if state.done {
                Poll::Ready(())
            } else {
                state.done_wakers.push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// A stream of timed [`EngineEvent`](retry_core::engine::EngineEvent)s from [`Client::events`].
pub struct Events {
    queue: Arc<EventQueue>,
    /// Its place among the futures that wait on (and run) the client's driver, when they do.
    waiter: Option<Waiter>,
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// The next event, or `None` once the client has shut down and every event was taken.
    pub fn next_event(&mut self) -> impl Future<Output = Option<TimedEvent>> + '_ {
        poll_fn(|cx| self.poll_next(cx))
    }

    /// Polls for the next event (the `Stream::poll_next` of the futures crates).
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<TimedEvent>> {
        drive(&self.waiter, cx);
        let next = self.queue.poll_next(cx);
        if let (Poll::Ready(_), Some(waiter)) = (&next, &self.waiter) {
            // Waits no more until polled again.
            waiter.leave();
        }
        next
    }

    /// Every event already delivered, without waiting.
    pub fn drain(&mut self) -> Vec<TimedEvent> {
        core::iter::from_fn(|| self.queue.try_next()).collect()
    }
}

/// Lets the driver run, when the client's futures drive it, and registers `cx` for its wakes.
pub(crate) fn drive(waiter: &Option<Waiter>, cx: &Context<'_>) {
    if let Some(waiter) = waiter {
        waiter.drive(cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{AsyncTimer, BoxFuture, Socket};
    use core::pin::Pin;
    use retry_core::time::Instant;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A runtime without an executor of its own (the client's futures drive its
    /// [`LocalDriver`]), whose connects never finish and whose timers never fire.
    #[derive(Debug)]
    struct Idle;

    /// A timer of [`Idle`].
    #[derive(Debug)]
    struct Never;

    impl AsyncTimer for Never {
        fn reset(self: Pin<&mut Self>, _: Instant) {}
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            Poll::Pending
        }
    }

    impl Runtime for Idle {
        fn start() -> io::Result<Idle> {
            Ok(Idle)
        }
        fn now(&self) -> Instant {
            Instant::ZERO
        }
        fn new_timer(&self, _: Instant) -> Pin<Box<dyn AsyncTimer>> {
            Box::pin(Never)
        }
        fn spawns(&self) -> bool {
            false
        }
        fn connect(&self, _: String, _: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>> {
            Box::pin(core::future::pending())
        }
    }

    /// Each text of `error`'s chain ([`std::error::Error::source`]), outermost first.
    fn chain_of(error: &dyn std::error::Error) -> Vec<String> {
        core::iter::successors(Some(error), |e| e.source())
            .map(ToString::to_string)
            .collect()
    }

    /// An error with a cause, as a runtime's may be.
    #[derive(Debug)]
    struct Outer(io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the runtime's own error")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// Review32 R15: a [`ConnectError`]'s chain goes on past it, to the wrapped error's cause,
    /// and prints each text once (its own text includes the wrapped error's). Before, `source()`
    /// was `None` for every variant and the chain stopped at the wrapper.
    #[test]
    fn review32_r15_connect_errors_chain_each_cause_once() {
        let cause = io::Error::new(io::ErrorKind::NotFound, "the cause");
        let error = ConnectError::Runtime(io::Error::other(Outer(cause)));
        assert_eq!(
            chain_of(&error),
            ["no runtime: the runtime's own error", "the cause"]
        );
        let mut options = ClientOptions::new(vec![
            retry_core::address::ServerAddress::new("a", 1),
            retry_core::address::ServerAddress::new("b", 1),
        ]);
        options.direct_connection = true;
        let error = Client::<Idle>::connect(options).unwrap_err();
        let ConnectError::Settings(settings) = &error else {
            panic!("{error:?}")
        };
        let chain = chain_of(&error);
        assert_eq!(chain.len(), 2, "{chain:?}");
        assert_eq!(
            chain[1],
            std::error::Error::source(settings).unwrap().to_string(),
            "past the engine's error, to its cause"
        );
        // An options error has no cause of its own: the chain is its text alone.
        let error = Client::<Idle>::with_uri("mongodb://a/?appName=%ZZ").unwrap_err();
        assert_eq!(chain_of(&error), [error.to_string()]);
    }

    /// A task's waker that counts its wakes.
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A ping's future on `client`, and the waker of the task that polls it.
    fn ping(client: &Client<Idle>) -> (ReplyFuture<'_>, Waker, Arc<Wakes>) {
        let request = OperationRequest::new(
            "admin",
            bson::doc! {"ping": 1},
            OperationKind::RunCommand,
            SelectionCriteria::Write,
        );
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        (
            client.run_request(request, "admin", None),
            Waker::from(wakes.clone()),
            wakes,
        )
    }

    /// Polls `future` with `waker` (it stays pending: nothing connects); returns how often the
    /// poll woke its own task.
    fn poll(future: &mut ReplyFuture<'_>, waker: &Waker, wakes: &Wakes) -> usize {
        let before = wakes.0.load(Ordering::Relaxed);
        let poll = Pin::new(future).poll(&mut Context::from_waker(waker));
        assert!(poll.is_pending());
        wakes.0.load(Ordering::Relaxed) - before
    }

    /// The driver stores `future`'s result and wakes its caller, which does not take it.
    fn result_in(client: &Client<Idle>, future: &ReplyFuture<'_>) {
        let slot = future.reply.as_ref().expect("queued");
        let results = Some(&client.inner.shared.results_to_take);
        slot.complete(Err(OperationError::cancelled()), results);
    }

    /// Review25 R2, R3 (issue 9): a first poll defers its operation's start ([`Waiter::defer`],
    /// its own task woken to run the pass) while callers the latest pass woke have results to
    /// take, and runs the driver at once otherwise: when the caller of the only such result
    /// dropped its future unpolled (its result counted out, [`Slot::abandon`]), and when a later
    /// pass completed an operation while that caller keeps its future unpolled (only the latest
    /// such pass's results count, [`crate::shared::ResultsToTake`]).
    #[test]
    fn review25_r3_a_first_poll_defers_only_for_results_about_to_be_taken() {
        let options = crate::options::ClientOptions::parse("mongodb://127.0.0.1:27017").unwrap();
        let client = Client::<Idle>::connect(options).expect("a client");
        let results = &client.inner.shared.results_to_take;
        let (mut a, a_waker, a_wakes) = ping(&client);
        assert_eq!(
            poll(&mut a, &a_waker, &a_wakes),
            0,
            "no result to take: it drives"
        );
        result_in(&client, &a);
        assert!(results.any());
        let (mut b, b_waker, b_wakes) = ping(&client);
        assert_eq!(
            poll(&mut b, &b_waker, &b_wakes),
            1,
            "deferred: its own task woken"
        );
        drop(a);
        assert!(!results.any(), "a result given up on is counted out");
        let (mut c, c_waker, c_wakes) = ping(&client);
        assert_eq!(
            poll(&mut c, &c_waker, &c_wakes),
            0,
            "no result to take: it drives"
        );

        // A result whose caller keeps its future unpolled counts until the next pass only.
        let (mut d, d_waker, d_wakes) = ping(&client);
        assert_eq!(poll(&mut d, &d_waker, &d_wakes), 0);
        result_in(&client, &d);
        let (mut e, e_waker, e_wakes) = ping(&client);
        assert_eq!(poll(&mut e, &e_waker, &e_wakes), 1, "deferred");
        assert_eq!(poll(&mut e, &e_waker, &e_wakes), 0, "its pass runs");
        // The next pass's completion (E's result, E's caller woken for it and taking it).
        result_in(&client, &e);
        assert!(Pin::new(&mut e)
            .poll(&mut Context::from_waker(&e_waker))
            .is_ready());
        assert!(!results.any(), "the result nobody took no longer counts");
        let (mut f, f_waker, f_wakes) = ping(&client);
        assert_eq!(poll(&mut f, &f_waker, &f_wakes), 0, "it drives");
        drop((b, c, d, f));
    }
}
