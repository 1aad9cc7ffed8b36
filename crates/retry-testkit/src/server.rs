//! The server: the listener, one task per connection, and the handle tests use at run time.

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bson::oid::ObjectId;
use bson::{Bson, Document, RawDocumentBuf};
use retry_core::rng::EngineRng;
use retry_core::wire::{to_document, FrameDecoder, MsgFlags, OpMsg, RawOpMsg};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinError, JoinHandle, JoinSet};
use tokio::time::{sleep, Duration, Instant};

mod as_sent;
mod awaitable;
mod elements;
mod malformed;
mod raw;
#[cfg(test)]
mod raw_equivalence;

use crate::auth::{ConnectionAuth, UserStore};
use crate::commands::{execute, hello_reply, is_hello, write_key, HelloAsk, HelloContext};
use crate::config::{
    IngressLimit, RateLimit, ReplicaSetMember, Role, ServerConfig, MAX_MESSAGE_SIZE_BYTES,
};
use crate::counters::Counters;
use crate::fail_point::{error_reply, FailCommand, FailPointMode, FailPointRng};

/// The seed of every server's `activationProbability` generator.
const FAIL_POINT_SEED: u64 = 0x5eed_fa11;
use crate::faults::{connection_rng, garbage, oversized_header, Fault, FaultConfig};
use crate::limiter::TokenBucket;
use crate::on_primary_write::{Firing, OnPrimaryWrite};
use crate::store::{AsSent, DataStore, WriteKey};
use crate::tls::ServerTls;

/// TK-15 (review7 finding 1): a real server's default `transactionLifetimeLimitSeconds`: the
/// longest a write outside any transaction without `maxTimeMS` waits for a transaction in
/// progress, counted from that transaction's start (review8 finding 6).
const TRANSACTION_LIFETIME_LIMIT: Duration = Duration::from_secs(60);

/// BP-3: the code of an ingress rate-limiter rejection.
pub const INGRESS_RATE_LIMIT_CODE: i32 = 462;

/// BP-3: the labels of an ingress rate-limiter rejection: a retryable overload error (BP-2).
pub const OVERLOAD_LABELS: [&str; 2] = ["SystemOverloadedError", "RetryableError"];

/// How many of the latest hellos [`ServerHandle::handshakes`] keeps: a server that runs for long
/// (a soak, a monitor's heartbeats every 10 ms) keeps a bounded record, the older ones dropped.
pub const HANDSHAKES_KEPT: usize = 1_000;

/// One handshake the server received: a `hello`, `isMaster` or `ismaster` command, as sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Handshake {
    /// The `connectionId` the server gave the connection.
    pub connection_id: i32,
    /// The command document, `$db` included.
    pub command: Document,
}

/// A recorded handshake's command, as the path that answered it had it (`raw`).
pub(crate) enum Recorded {
    /// Decoded by the Document path.
    Decoded(Document),
    /// Left encoded by the raw path; converted when a test asks for it.
    Raw(RawDocumentBuf),
}

/// The state every connection shares, behind one lock that is never held across an await.
pub(crate) struct State {
    pub(crate) role: Role,
    topology_counter: i64,
    pub(crate) batch_size: u32,
    pub(crate) fail_point: Option<FailCommand>,
    /// TK-11: the `onPrimaryTransactionalWrite` fail point.
    pub(crate) on_primary_write: Option<OnPrimaryWrite>,
    /// Draws for `activationProbability`, seeded with a constant so runs repeat.
    pub(crate) fail_point_rng: FailPointRng,
    ingress: Option<(IngressLimit, TokenBucket)>,
    connection_limit: Option<TokenBucket>,
    faults: FaultConfig,
    /// The data, possibly shared with other servers.
    pub(crate) data: DataStore,
    counters: Counters,
    /// The latest hellos, at most [`HANDSHAKES_KEPT`], oldest first.
    handshakes: VecDeque<(i32, Recorded)>,
    last_connection_id: i32,
    /// TK-2, TK-16: what the server refused as unknown or unsupported, in order.
    unsupported: Vec<String>,
    /// TK-12: the services a load balancer routes new connections to, round robin (empty: one,
    /// the process itself).
    services: Vec<ObjectId>,
    /// How many connections were routed to a service so far.
    routed: usize,
    /// TK-16: every command received, when the log is on (off by default: it grows).
    command_log: Option<Vec<LoggedCommand>>,
    /// SCRAM users (crate `auth`).
    users: UserStore,
    /// The `requireApiVersion` server parameter (crate `parameters`).
    pub(crate) require_api_version: bool,
    /// Requests the raw path answered (`raw`), for its tests.
    #[cfg(test)]
    raw_answers: u64,
}

impl State {
    /// HS-4: records a hello received on connection `connection_id`, dropping the oldest when
    /// [`HANDSHAKES_KEPT`] are kept; both paths record through here.
    pub(crate) fn record_hello(&mut self, connection_id: i32, command: Recorded) {
        if self.handshakes.len() == HANDSHAKES_KEPT {
            self.handshakes.pop_front();
        }
        self.handshakes.push_back((connection_id, command));
    }

    /// BP-3, BP-15: the ingress limiter's rejection, or `None` when the command is admitted
    /// (the clock is read only when a limiter is set).
    fn ingress_rejection(&mut self) -> Option<Document> {
        let (limit, bucket) = self.ingress.as_mut()?;
        if bucket.try_acquire(Instant::now()) {
            return None;
        }
        let mut reply = error_reply(
            INGRESS_RATE_LIMIT_CODE,
            "the ingress request rate limit was exceeded",
        );
        reply.insert("errorLabels", OVERLOAD_LABELS.to_vec());
        if let Some(ms) = limit.base_backoff_ms {
            reply.insert("baseBackoffMS", i64::from(ms));
        }
        self.counters.ingress_rejected += 1;
        Some(reply)
    }

    /// TK-11: whether `onPrimaryTransactionalWrite` fires on the retryable write about to
    /// commit, consuming one of its `times` / `skip` (once per statement: a statement that
    /// waits keeps its firing for its rerun, [`HeldFiring`]).
    fn on_primary_write_firing(&mut self) -> Option<Firing> {
        let fail = self.on_primary_write.as_mut()?;
        let rng = &mut self.fail_point_rng;
        let (fires, stays) = fail.mode.fire(|| rng.next_unit());
        let firing = fail.firing();
        if !stays {
            self.on_primary_write = None;
        }
        fires.then_some(firing)
    }

    /// The fail point's action for this command, consuming one of its `times`.
    fn trigger_fail_point(&mut self, name: &str, app_name: Option<&str>) -> Option<FailCommand> {
        let fail = self.fail_point.as_mut()?;
        if !fail.matches(name, app_name) {
            return None;
        }
        let fired = fail.clone();
        let rng = &mut self.fail_point_rng;
        let (fires, stays) = fail.mode.fire(|| rng.next_unit());
        if !stays {
            self.fail_point = None;
        }
        if !fires {
            return None;
        }
        self.counters.fail_points_triggered += 1;
        Some(fired)
    }
}

/// TK-11 (review8 finding 5): the `onPrimaryTransactionalWrite` firing decided for a statement
/// that then had to wait for a transaction (TK-15); its rerun takes it instead of using up the
/// fail point again, so one write fires it once and a `CommitThenClose` is not lost.
type HeldFiring = Option<Option<Firing>>;

/// Switches the crate's tests set on a server: the Document path alone (to compare the raw path
/// with it), and a fixed `me` and process id (so two servers' replies compare byte for byte).
#[derive(Default)]
struct Internals {
    document_path_only: bool,
    me: Option<String>,
    process_id: Option<ObjectId>,
}

/// What never changes while the server runs, and the lock on what does.
struct Shared {
    me: String,
    /// Whether hot commands take the raw path (`raw`); off only to compare it with the Document
    /// path in tests.
    raw_path: bool,
    process_id: ObjectId,
    seed: u64,
    min_wire_version: i32,
    max_wire_version: i32,
    /// HS-3: whether `hello` is a command of this server ([`ServerConfig::offers_hello`]).
    offers_hello: bool,
    /// The TLS handshake every accepted socket goes through first, if any.
    tls: Option<ServerTls>,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not take the server down with it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a reply to command `name` as a success or a failure by its `ok`.
    fn count_reply(&self, name: &str, reply: &Document) {
        let mut state = self.lock();
        let counts = state.counters.command_mut(name);
        if retry_core::reply::is_ok(reply) {
            counts.succeeded += 1;
        } else {
            counts.failed += 1;
        }
    }
}

/// A running test server on 127.0.0.1. Dropping it stops it too, without waiting.
#[derive(Debug)]
pub struct TestServer {
    address: SocketAddr,
    handle: ServerHandle,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl TestServer {
    /// Binds an ephemeral port on 127.0.0.1 and starts serving. Must be called inside a tokio
    /// runtime; the server's tasks run on it.
    pub async fn start(config: ServerConfig) -> io::Result<TestServer> {
        TestServer::start_with_data(config, DataStore::new()).await
    }

    /// Like [`TestServer::start`], serving `data`, which other servers may share (TK-*).
    pub async fn start_with_data(config: ServerConfig, data: DataStore) -> io::Result<TestServer> {
        TestServer::start_with(config, data, Internals::default()).await
    }

    /// [`TestServer::start_with_data`], with the crate's own switches.
    async fn start_with(
        config: ServerConfig,
        data: DataStore,
        internals: Internals,
    ) -> io::Result<TestServer> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, config.port)).await?;
        let address = listener.local_addr()?;
        let now = Instant::now();
        let state = State {
            role: config.role,
            topology_counter: 0,
            batch_size: config.batch_size,
            fail_point: None,
            fail_point_rng: FailPointRng::new(FAIL_POINT_SEED),
            on_primary_write: None,
            ingress: config
                .ingress_limit
                .map(|limit| (limit, TokenBucket::new(limit.rate, now))),
            connection_limit: config
                .connection_limit
                .map(|rate| TokenBucket::new(rate, now)),
            faults: config.faults,
            data,
            counters: Counters::default(),
            handshakes: VecDeque::new(),
            last_connection_id: 0,
            unsupported: Vec::new(),
            services: Vec::new(),
            routed: 0,
            command_log: None,
            users: UserStore::new(&config.users),
            require_api_version: config.require_api_version,
            #[cfg(test)]
            raw_answers: 0,
        };
        let shared = Arc::new(Shared {
            me: internals.me.unwrap_or_else(|| address.to_string()),
            process_id: internals.process_id.unwrap_or_default(),
            raw_path: !internals.document_path_only,
            seed: config.seed,
            min_wire_version: config.min_wire_version,
            max_wire_version: config.max_wire_version,
            offers_hello: config.offers_hello,
            tls: config.tls,
            state: Mutex::new(state),
        });
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared), stopped));
        Ok(TestServer {
            address,
            handle: ServerHandle { shared },
            stop: Some(stop),
            task,
        })
    }

    /// Starts `count` mongos (at least one) from `config` with the role `Mongos`, sharing one
    /// data store, as the routers of one sharded cluster (TK-*).
    pub async fn start_mongoses(count: usize, config: ServerConfig) -> io::Result<Vec<TestServer>> {
        let data = DataStore::new();
        let mut servers = Vec::with_capacity(count.max(1));
        for _ in 0..count.max(1) {
            let config = ServerConfig {
                role: Role::Mongos,
                ..config.clone()
            };
            servers.push(TestServer::start_with_data(config, data.clone()).await?);
        }
        Ok(servers)
    }

    /// Starts a replica set named `set_name` of `members` servers (at least one) sharing one data
    /// store, each from
    /// `config` with its role replaced: the first is the primary, the others secondaries, and every
    /// member reports all their addresses as `hosts` and the first as `primary`.
    pub async fn start_replica_set(
        set_name: &str,
        members: usize,
        config: ServerConfig,
    ) -> io::Result<Vec<TestServer>> {
        let mut servers = Vec::with_capacity(members.max(1));
        let data = DataStore::new();
        for i in 0..members.max(1) {
            let member = if i == 0 {
                ReplicaSetMember::primary(set_name)
            } else {
                ReplicaSetMember::secondary(set_name)
            };
            let config = ServerConfig {
                role: Role::ReplicaSetMember(member),
                ..config.clone()
            };
            servers.push(TestServer::start_with_data(config, data.clone()).await?);
        }
        let hosts: Vec<String> = servers.iter().map(|s| s.address.to_string()).collect();
        for (i, server) in servers.iter().enumerate() {
            server
                .handle
                .set_role(Role::ReplicaSetMember(ReplicaSetMember {
                    set_name: set_name.into(),
                    primary: i == 0,
                    hosts: hosts.clone(),
                    primary_host: Some(hosts[0].clone()),
                }));
        }
        Ok(servers)
    }

    /// The address it listens on: 127.0.0.1 and an ephemeral port.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// A handle to change its behaviour and read its counters; it outlives the server.
    pub fn handle(&self) -> ServerHandle {
        self.handle.clone()
    }

    /// Stops accepting, closes every connection and waits until all its tasks have ended.
    ///
    /// # Panics
    ///
    /// If a task of the server panicked (a bug in the server, never a client's input), with
    /// that panic, so the test that shuts it down fails.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            // The accept loop may already be gone (it panicked); the join below reports that.
            let _ = stop.send(());
        }
        if let Err(error) = (&mut self.task).await {
            if let Ok(panic) = error.try_into_panic() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Changes a running server's behaviour and reads what it did. Cheap to clone; every change
/// applies to the next command or connection.
#[derive(Clone)]
pub struct ServerHandle {
    shared: Arc<Shared>,
}

impl core::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ServerHandle")
            .field("me", &self.shared.me)
            .finish_non_exhaustive()
    }
}

impl ServerHandle {
    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        self.shared.lock().counters.clone()
    }

    /// Sets every counter back to zero.
    pub fn reset_counters(&self) {
        self.shared.lock().counters = Counters::default();
    }

    /// The hellos received (handshakes and heartbeats), in order: the latest
    /// [`HANDSHAKES_KEPT`].
    pub fn handshakes(&self) -> Vec<Handshake> {
        let state = self.shared.lock();
        state
            .handshakes
            .iter()
            .map(|(connection_id, command)| Handshake {
                connection_id: *connection_id,
                command: match command {
                    Recorded::Decoded(command) => command.clone(),
                    // Validated when it was decoded, so it converts.
                    Recorded::Raw(command) => to_document(command).unwrap_or_default(),
                },
            })
            .collect()
    }

    /// Sets the `failCommand` fail point, or turns it off with `None` (or `Times(0)`); the same as
    /// sending `configureFailPoint`.
    pub fn set_fail_command(&self, fail: Option<FailCommand>) {
        self.shared.lock().fail_point = fail.filter(|f| f.mode != FailPointMode::Times(0));
    }

    /// Sets the `requireApiVersion` server parameter (the same as sending `setParameter`): while
    /// it is on, every command without `apiVersion` is refused with code 498870.
    pub fn set_require_api_version(&self, required: bool) {
        self.shared.lock().require_api_version = required;
    }

    /// The `failCommand` fail point in force, with its remaining `times`.
    pub fn fail_command(&self) -> Option<FailCommand> {
        self.shared.lock().fail_point.clone()
    }

    /// Sets or removes the ingress request rate limiter. Changing the rate of a limiter keeps its
    /// tokens, up to the new burst; a new limiter starts full.
    pub fn set_ingress_limit(&self, limit: Option<IngressLimit>) {
        let now = Instant::now();
        let mut state = self.shared.lock();
        state.ingress = match (state.ingress.take(), limit) {
            (Some((_, mut bucket)), Some(limit)) => {
                bucket.set_rate(limit.rate, now);
                Some((limit, bucket))
            }
            (None, Some(limit)) => Some((limit, TokenBucket::new(limit.rate, now))),
            (_, None) => None,
        };
    }

    /// Sets or removes the connection rate limiter, as [`set_ingress_limit`](Self::set_ingress_limit) does.
    pub fn set_connection_limit(&self, rate: Option<RateLimit>) {
        let now = Instant::now();
        let mut state = self.shared.lock();
        state.connection_limit = match (state.connection_limit.take(), rate) {
            (Some(mut bucket), Some(rate)) => {
                bucket.set_rate(rate, now);
                Some(bucket)
            }
            (None, Some(rate)) => Some(TokenBucket::new(rate, now)),
            (_, None) => None,
        };
    }

    /// Sets the random faults.
    pub fn set_faults(&self, faults: FaultConfig) {
        self.shared.lock().faults = faults;
    }

    /// Changes the role (a step-down, new hosts); increments `topologyVersion.counter`.
    pub fn set_role(&self, role: Role) {
        let mut state = self.shared.lock();
        state.role = role;
        state.topology_counter += 1;
    }

    /// Appends documents to the namespace `ns` (`db.collection`), as an unordered `insert`
    /// does, without counting a command; returns how many went in (a duplicate `_id` is left
    /// out, TK-*; none goes in when one has an `_id` a transaction in progress changed, TK-15).
    pub fn insert(&self, ns: &str, documents: Vec<Document>) -> usize {
        let state = self.shared.lock();
        let mut store = state.data.lock();
        store.begin_statement(None);
        let n = store
            .insert(ns, documents, false)
            .map_or(0, |outcome| outcome.n);
        store.end_statement();
        store.take_blocked();
        n
    }

    /// The documents of the namespace `ns`, in insertion order.
    pub fn documents(&self, ns: &str) -> Vec<Document> {
        self.shared.lock().data.lock().documents(ns)
    }

    /// TK-12: a load balancer in front of `count` mongos: new connections are routed round robin
    /// and report that mongos' `serviceId` (the first is the process id). 1 or 0: one service.
    pub fn set_load_balanced_services(&self, count: usize) {
        let mut services = vec![self.shared.process_id];
        services.extend((1..count).map(|_| ObjectId::new()));
        self.shared.lock().services = if count > 1 { services } else { Vec::new() };
    }

    /// TK-16: turns the command log on (empty) or off. Off by default, as it grows with every
    /// command.
    pub fn set_command_log(&self, on: bool) {
        self.shared.lock().command_log = on.then(Vec::new);
    }

    /// TK-16: every command received since the log was turned on, in order, with its `lsid` and
    /// `txnNumber` (handshakes included); empty when the log is off.
    pub fn command_log(&self) -> Vec<LoggedCommand> {
        self.shared.lock().command_log.clone().unwrap_or_default()
    }

    /// Creates the namespace `ns` (`db.collection`) empty, as `create` does; `false` when it
    /// already exists.
    pub fn create_collection(&self, ns: &str) -> bool {
        self.shared.lock().data.lock().create(ns)
    }

    /// TK-2, TK-16: every command, operator, option or fail point the server refused as unknown
    /// or unsupported (`CommandNotFound` or `TestkitUnsupported`), in order. A test that made the
    /// server refuse something did not test what it meant to (UT-20).
    pub fn unsupported(&self) -> Vec<String> {
        self.shared.lock().unsupported.clone()
    }

    /// How many cursors are open.
    pub fn open_cursors(&self) -> usize {
        self.shared.lock().data.lock().open_cursors()
    }

    /// `topologyVersion.processId`, which a load balancer also reports as `serviceId` (LB-17).
    pub fn process_id(&self) -> ObjectId {
        self.shared.process_id
    }
}

/// Accepts until told to stop, then aborts every connection task and waits for them.
async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            Some(ended) = connections.join_next(), if !connections.is_empty() => {
                propagate_panic(ended);
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Replies are single writes; without Nagle's delay a benchmark measures the
                    // client, not the kernel's timer. A socket that refuses still works.
                    let _ = stream.set_nodelay(true);
                    match admit(&shared) {
                        Some(connection) => match shared.tls.clone() {
                            None => {
                                connections.spawn(serve(Arc::clone(&shared), stream, connection));
                            }
                            Some(tls) => {
                                connections.spawn(serve_tls(
                                    Arc::clone(&shared),
                                    tls,
                                    stream,
                                    connection,
                                ));
                            }
                        },
                        // Over the connection rate: reset it (SO_LINGER 0) as it is dropped. A
                        // socket that refuses the option is closed plainly, still unanswered.
                        None => {
                            let _ = stream.set_zero_linger();
                        }
                    }
                }
                // Out of descriptors or similar: give the process a moment, then go on.
                Err(_) => sleep(Duration::from_millis(10)).await,
            },
        }
    }
    connections.abort_all();
    // Bounded: the set only shrinks once the loop above has stopped adding to it.
    while let Some(ended) = connections.join_next().await {
        propagate_panic(ended);
    }
}

/// A connection task that panicked is a bug in the server: panic the accept loop with it, so
/// [`TestServer::shutdown`] reports it to the test.
fn propagate_panic(ended: Result<(), JoinError>) {
    if let Err(error) = ended {
        if let Ok(panic) = error.try_into_panic() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Counts an accepted socket and asks the connection limiter; `None` means reset it now.
fn admit(shared: &Shared) -> Option<Connection> {
    let mut state = shared.lock();
    state.counters.connections_accepted += 1;
    if let Some(bucket) = &mut state.connection_limit {
        if !bucket.try_acquire(Instant::now()) {
            state.counters.connections_rejected += 1;
            state.counters.connections_closed += 1;
            return None;
        }
    }
    state.last_connection_id = state.last_connection_id.wrapping_add(1).max(1);
    let id = state.last_connection_id;
    Some(Connection {
        id,
        app_name: None,
        service: None,
        rng: connection_rng(shared.seed, id),
        last_request_id: 0,
        out: Vec::new(),
        auth: ConnectionAuth::default(),
        replies: raw::Replies::default(),
        noted_lsid: Vec::new(),
        seen_hello: false,
        ddl_wait: None,
        as_sent: Vec::new(),
    })
}

/// TK-15 (leftovers11, review16 finding 1): a connection's command queued for a lock (a DDL
/// command waiting for a transaction in progress, or a command queued behind one), pending in
/// the data store ([`Store::hold_ddl`](crate::store::Store::hold_ddl)) until it is
/// dropped: when the command runs, fails or its connection goes.
struct DdlWait {
    data: DataStore,
    number: u64,
}

impl Drop for DdlWait {
    fn drop(&mut self) {
        self.data.lock().release_ddl(self.number);
    }
}

/// One client connection's own state.
struct Connection {
    id: i32,
    /// `client.application.name` from its handshake, for the fail point's `appName` filter.
    app_name: Option<String>,
    rng: EngineRng,
    last_request_id: i32,
    /// TK-12: the service a load balancer routed it to, chosen at its first hello.
    service: Option<ObjectId>,
    /// Its authentication (crate `auth`).
    auth: ConnectionAuth,
    /// The encoded reply being written (reused).
    out: Vec<u8>,
    /// The raw path's reply bodies (`raw`).
    replies: raw::Replies,
    /// The plain lsid the raw path noted last in the data store (`raw`), so a connection that
    /// keeps its session does not look it up again.
    noted_lsid: Vec<u8>,
    /// HS-4: a hello was answered on it (a later one may not carry `client`: 186).
    seen_hello: bool,
    /// TK-15: its command queued for a lock ([`DdlWait`]), if any.
    ddl_wait: Option<DdlWait>,
    /// Review34 Y8: the running request's documents to insert as they were sent ([`as_sent`]).
    as_sent: Vec<Option<AsSent>>,
}

/// The "not writable primary" and "node is recovering" codes a replica-set member's error reply
/// carries its `topologyVersion` with (not the shutdown codes 91 and 11600), as a 4.4+ `mongod`
/// does for fail point errors and write concern errors alike.
const NOT_PRIMARY_CODES: [i32; 5] = [10107, 13435, 13436, 189, 11602];

/// Commands that change data: each moves the deployment's clock on (review5 item 11).
const CLOCKED_WRITES: [&str; 14] = [
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "bulkWrite",
    "create",
    "drop",
    "dropDatabase",
    "createIndexes",
    "dropIndexes",
    "renameCollection",
    "commitTransaction",
    "abortTransaction",
];

/// House rule 7: a write acknowledged by more members than the replica set has (`w: <n>` above
/// its size) is applied but cannot satisfy its write concern: a replica-set member answers with
/// `writeConcernError` `UnsatisfiableWriteConcern` (100), "Not enough data-bearing nodes".
fn add_unsatisfiable_write_concern(shared: &Shared, command: &Document, reply: &mut Document) {
    let Ok(write_concern) = command.get_document("writeConcern") else {
        return;
    };
    let Some(w) = write_concern.get("w").and_then(|w| match w {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        Bson::Double(n) => Some(*n as i64),
        _ => None,
    }) else {
        return;
    };
    if !retry_core::reply::is_ok(reply) || reply.contains_key("writeConcernError") {
        return;
    }
    let state = shared.lock();
    let Role::ReplicaSetMember(member) = &state.role else {
        return;
    };
    let members = member.hosts.len().max(1) as i64;
    if w > members {
        reply.insert(
            "writeConcernError",
            bson::doc! {
                "code": 100,
                "codeName": crate::fail_point::code_name_of(100),
                "errmsg": "Not enough data-bearing nodes",
            },
        );
    }
}

/// SE-16, SE-21 (review5 item 11): a replica-set member's or a mongos's reply (not hello) carries
/// `operationTime` and `$clusterTime` from the deployment's logical clock, as a server without
/// authentication gives them (a zero signature); a write that succeeded moves the clock first.
fn add_cluster_time(shared: &Shared, name: &str, reply: &mut Document) {
    if is_hello(name) {
        return;
    }
    let state = shared.lock();
    if state.role == Role::Standalone {
        return;
    }
    let mut store = state.data.lock();
    let ok = retry_core::reply::is_ok(reply);
    let time = if ok && CLOCKED_WRITES.contains(&name) {
        store.tick()
    } else {
        store.cluster_time()
    };
    insert_cluster_time(reply, time);
}

/// SE-16: `operationTime` and `$clusterTime` (with a zero signature) at `time`.
fn insert_cluster_time(reply: &mut Document, time: bson::Timestamp) {
    reply.insert("operationTime", Bson::Timestamp(time));
    reply.insert(
        "$clusterTime",
        bson::doc! {
            "clusterTime": Bson::Timestamp(time),
            "signature": {
                "hash": Bson::Binary(bson::Binary {
                    subtype: bson::spec::BinarySubtype::Generic,
                    bytes: vec![0; 20],
                }),
                "keyId": 0_i64,
            },
        },
    );
}

/// A replica-set member's state-change error reply (top-level code or `writeConcernError` code
/// in [`NOT_PRIMARY_CODES`]) carries the member's current `topologyVersion`, as a real one's does
/// (server monitoring spec: "Always include the server's topologyVersion in ... State Change
/// Error replies"); a client then treats it as stale (equal, not newer) and keeps the server's
/// description.
fn add_topology_version(state: &State, process_id: ObjectId, reply: &mut Document) {
    if !matches!(state.role, Role::ReplicaSetMember(_)) {
        return;
    }
    let code = |d: &Document| match d.get("code") {
        Some(Bson::Int32(c)) => Some(*c),
        _ => None,
    };
    let top = code(reply);
    let wce = match reply.get("writeConcernError") {
        Some(Bson::Document(w)) => code(w),
        _ => None,
    };
    if [top, wce]
        .into_iter()
        .flatten()
        .any(|c| NOT_PRIMARY_CODES.contains(&c))
    {
        reply.insert(
            "topologyVersion",
            bson::doc! { "processId": process_id, "counter": state.topology_counter },
        );
    }
}

/// TK-8: the fail point's `writeConcernError` (with its labels) on a reply that succeeded.
fn add_write_concern_error(
    fired: Option<FailCommand>,
    name: &str,
    command: &Document,
    reply: &mut Document,
) {
    if let Some(fail) = fired.filter(|f| f.write_concern_error.is_some()) {
        if retry_core::reply::is_ok(reply) {
            let labels = fail.write_concern_labels(name, command);
            if let Some(error) = fail.write_concern_error {
                reply.insert("writeConcernError", error);
            }
            if !labels.is_empty() {
                reply.insert("errorLabels", labels);
            }
        }
    }
}

/// TK-15: the session whose transaction in progress the command just run has to wait for, if
/// it has to; a command that queued behind a DDL command (or is one) is queued in `data` from
/// now until `wait` goes, unless it already is (review16 finding 1: it keeps its place).
fn blocked(data: &DataStore, wait: &mut Option<DdlWait>) -> Option<Vec<u8>> {
    let mut store = data.lock();
    let session = store.take_blocked()?;
    if let Some((target, mode)) = store.take_blocked_ddl().filter(|_| wait.is_none()) {
        let number = store.hold_ddl(target, mode, session.clone());
        *wait = Some(DdlWait {
            data: data.clone(),
            number,
        });
    }
    Some(session)
}

/// TK-6: starts the retryable write `key` in its session, or the 225 (TransactionTooOld) reply
/// when the session already used a higher `txnNumber`.
fn begin_write(state: &State, key: &WriteKey) -> Option<Response> {
    if state.data.lock().begin_write(key) {
        return None;
    }
    Some(Response::Reply(error_reply(
        225,
        &format!(
            "Cannot start transaction {} on session because a newer transaction has already \
             started",
            key.txn_number
        ),
    )))
}

/// TK-15: what a command that has to wait keeps across its runs: the
/// `onPrimaryTransactionalWrite` firing it drew (TK-11) and its place in a lock queue
/// ([`DdlWait`], review16 finding 1).
struct Kept<'a> {
    held: &'a mut HeldFiring,
    wait: &'a mut Option<DdlWait>,
}

/// TK-5, TK-11: a retryable `update` / `delete` of several statements, statement by statement:
/// a statement already done (same lsid, txnNumber, stmtId = its index) is not run
/// again, each other one fires `onPrimaryTransactionalWrite` on its own, and the replies are
/// combined as one command's (indexes of `upserted` and `writeErrors` by statement).
fn statement_writes(
    state: &mut State,
    shared: &Shared,
    router: ObjectId,
    name: &str,
    key: &WriteKey,
    statements: Vec<OpMsg>,
    kept: Kept<'_>,
) -> Result<Response, Vec<u8>> {
    let Kept { held, wait } = kept;
    if let Some(refusal) = begin_write(state, key) {
        return Ok(refusal);
    }
    let ordered = crate::commands::ordered(&statements[0].body);
    let (mut n, mut modified) = (0_i64, 0_i64);
    let (mut upserted, mut errors) = (Vec::new(), Vec::new());
    let mut replayed = true;
    for (index, statement) in statements.iter().enumerate() {
        let sub = WriteKey {
            stmt_id: index as i64,
            ..key.clone()
        };
        let known = state.data.lock().write_result(&sub);
        let reply = match known {
            Some(reply) => reply,
            None => {
                replayed = false;
                let firing = held
                    .take()
                    .unwrap_or_else(|| state.on_primary_write_firing());
                if firing == Some(Firing::CloseWithoutCommit) {
                    return Ok(Response::Close);
                }
                let reply = execute(
                    state,
                    name,
                    statement,
                    shared.max_wire_version,
                    router,
                    wait.as_ref().map(|wait| wait.number),
                    // Only `update` and `delete` run statement by statement: nothing to insert.
                    &[],
                );
                // TK-15 (review7 finding 1): the statements done so far are recorded, so the
                // command goes on at this one once it no longer has to wait.
                if let Some(session) = blocked(&state.data, wait) {
                    *held = Some(firing);
                    return Err(session);
                }
                // A known command the test server does not run (TK-2, `commands::KNOWN_NOT_RUN`).
                let reply = reply.unwrap_or_else(|| {
                    crate::commands::unsupported_reply(&format!("command {name}"))
                });
                let done = retry_core::reply::is_ok(&reply) && !reply.contains_key("writeErrors");
                if done {
                    state.data.lock().record_write(sub, reply.clone());
                }
                if firing == Some(Firing::CommitThenClose) {
                    return Ok(Response::Close);
                }
                reply
            }
        };
        if !retry_core::reply::is_ok(&reply) {
            return Ok(Response::Reply(reply));
        }
        let count = |field: &str| match reply.get(field) {
            Some(Bson::Int32(v)) => i64::from(*v),
            Some(Bson::Int64(v)) => *v,
            _ => 0,
        };
        n += count("n");
        modified += count("nModified");
        let reindex = |mut entry: Document| {
            entry.insert("index", index as i32);
            Bson::Document(entry)
        };
        for list in [("upserted", &mut upserted), ("writeErrors", &mut errors)] {
            if let Ok(entries) = reply.get_array(list.0) {
                list.1.extend(
                    entries
                        .iter()
                        .filter_map(Bson::as_document)
                        .cloned()
                        .map(reindex),
                );
            }
        }
        if ordered && !errors.is_empty() {
            break;
        }
    }
    let counts = state.counters.command_mut(name);
    if replayed {
        counts.replayed += 1;
    } else {
        counts.executed += 1;
    }
    let mut reply = bson::doc! { "n": i32::try_from(n).unwrap_or(i32::MAX) };
    if name == "update" {
        reply.insert("nModified", i32::try_from(modified).unwrap_or(i32::MAX));
    }
    if !upserted.is_empty() {
        reply.insert("upserted", upserted);
    }
    if !errors.is_empty() {
        reply.insert("writeErrors", errors);
    }
    reply.insert("ok", 1.0);
    Ok(Response::Reply(reply))
}

/// TK-16: one command as the server received it, for [`ServerHandle::command_log`].
#[derive(Clone, Debug, PartialEq)]
pub struct LoggedCommand {
    /// The command name (the first key of its body).
    pub name: String,
    /// Its `lsid`, if any.
    pub lsid: Option<Document>,
    /// Its `txnNumber`, if any (an int64 on the wire).
    pub txn_number: Option<i64>,
}

/// What to do after a request.
enum Response {
    /// Send this reply, unless the request had `moreToCome`.
    Reply(Document),
    /// Close the connection without a reply.
    Close,
}

/// Counts the connection closed whichever way its task ends, aborts included.
struct ClosedGuard(Arc<Shared>);

impl Drop for ClosedGuard {
    fn drop(&mut self) {
        self.0.lock().counters.connections_closed += 1;
    }
}

const READ_CHUNK: usize = 16 * 1024;

/// A server's socket: plain TCP or TLS over it, reset through the TCP socket beneath.
trait ServerStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Makes the close that follows a reset (SO_LINGER 0).
    fn set_zero_linger(&self) -> io::Result<()>;
}

impl ServerStream for TcpStream {
    fn set_zero_linger(&self) -> io::Result<()> {
        TcpStream::set_zero_linger(self)
    }
}

impl ServerStream for tokio_rustls::server::TlsStream<TcpStream> {
    fn set_zero_linger(&self) -> io::Result<()> {
        self.get_ref().0.set_zero_linger()
    }
}

/// Serves one plain TCP connection ([`serve_stream`]).
async fn serve(shared: Arc<Shared>, stream: TcpStream, connection: Connection) {
    let _closed = ClosedGuard(Arc::clone(&shared));
    serve_stream(&shared, stream, connection).await;
}

/// Runs the TLS handshake, then serves the connection; a failed handshake (the client refused
/// the certificate, or spoke no TLS) closes it.
async fn serve_tls(shared: Arc<Shared>, tls: ServerTls, stream: TcpStream, connection: Connection) {
    let _closed = ClosedGuard(Arc::clone(&shared));
    match tls.acceptor().accept(stream).await {
        Ok(stream) => serve_stream(&shared, stream, connection).await,
        Err(_) => shared.lock().counters.tls_handshakes_failed += 1,
    }
}

/// Serves one connection until the client closes it, sends bytes that do not frame, or a reply
/// ends it (a fail point's `closeConnection`, a fault).
async fn serve_stream<S: ServerStream>(shared: &Shared, mut stream: S, mut connection: Connection) {
    let mut decoder = FrameDecoder::new(MAX_MESSAGE_SIZE_BYTES as u32);
    let mut chunk = vec![0; READ_CHUNK];
    loop {
        let read = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut input = &chunk[..read];
        // Each pass consumes at least one byte or completes a message.
        while !input.is_empty() {
            // A frame starting here that names a hot command may be answered raw (`raw`); every
            // request is decoded raw, so that what the body's conversion to a `Document` hides
            // (a key sent twice) is still seen (`malformed`).
            let hot = shared.raw_path && !decoder.is_mid_frame() && raw::names_hot_command(input);
            let (used, message) = match decoder.decode_raw(input) {
                Ok(decoded) => decoded,
                Err(_) => {
                    shared.lock().counters.protocol_errors += 1;
                    return;
                }
            };
            input = &input[used..];
            let keep = match message {
                Some(request) if hot => connection.respond_raw(shared, &mut stream, request).await,
                Some(request) => {
                    connection
                        .respond_decoded(shared, &mut stream, &request)
                        .await
                }
                None if used == 0 => break,
                None => true,
            };
            if !keep {
                return;
            }
        }
    }
}

impl Connection {
    /// Handles a request on the Document path: converted to a `Document`, with the refusal its
    /// shape draws from a real server ([`malformed`]); `false` means close the connection.
    async fn respond_decoded<S: ServerStream>(
        &mut self,
        shared: &Shared,
        stream: &mut S,
        request: &RawOpMsg,
    ) -> bool {
        let malformed = malformed::refusal(request);
        self.as_sent = as_sent::as_sent(request);
        match raw::decoded(request) {
            Some(decoded) => self.respond(shared, stream, decoded, malformed).await,
            // Cannot happen: `decode_raw` validated the documents as `decode` converts them.
            None => {
                shared.lock().counters.protocol_errors += 1;
                false
            }
        }
    }

    /// Handles one request and writes its reply, `malformed` its refusal for its shape;
    /// `false` means close the connection.
    async fn respond<S: ServerStream>(
        &mut self,
        shared: &Shared,
        stream: &mut S,
        request: OpMsg,
        malformed: Option<malformed::Malformed>,
    ) -> bool {
        if malformed.is_none() {
            if let Some(wait) = awaitable::awaitable(shared, &request) {
                return self.await_hello(shared, stream, request, wait).await;
            }
        }
        let name = request.body.keys().next().map_or("", String::as_str);
        let exempt_from_faults = name == "configureFailPoint";
        match self.handle(shared, name, &request, malformed).await {
            Response::Reply(mut reply) => {
                crate::fail_point::name_for_wire(&mut reply, shared.max_wire_version);
                add_unsatisfiable_write_concern(shared, &request.body, &mut reply);
                add_cluster_time(shared, name, &mut reply);
                shared.count_reply(name, &reply);
                if request.flags.contains(MsgFlags::MORE_TO_COME) {
                    return true;
                }
                self.send(
                    shared,
                    stream,
                    request.request_id,
                    reply,
                    exempt_from_faults,
                )
                .await
            }
            Response::Close => false,
        }
    }

    /// Admission, fail point, execution (see the crate docs for the order).
    async fn handle(
        &mut self,
        shared: &Shared,
        name: &str,
        request: &OpMsg,
        malformed: Option<malformed::Malformed>,
    ) -> Response {
        let command = &request.body;
        let hello = is_hello(name);
        let (fired, invalid_db) = {
            let mut state = shared.lock();
            state.counters.command_mut(name).received += 1;
            if let Some(log) = &mut state.command_log {
                log.push(LoggedCommand {
                    name: name.to_owned(),
                    lsid: command.get_document("lsid").ok().cloned(),
                    txn_number: command.get("txnNumber").and_then(Bson::as_i64),
                });
            }
            if hello {
                self.record_handshake(&mut state, command);
            }
            // Review32 R4: a refusal the server makes while parsing the message comes before
            // anything reads `$db`.
            let malformed = match malformed {
                Some(refusal) if refusal.while_parsing => return Response::Reply(refusal.reply),
                other => other,
            };
            let db = match command.get("$db") {
                None => {
                    return Response::Reply(error_reply(
                        40571,
                        "OP_MSG requests require a $db argument",
                    ))
                }
                Some(Bson::String(db)) => db.as_str(),
                // Review7 finding 3: the server reads `$db` with `checkAndGetStringData`, whose
                // type check is 13111 with this message (the BSON type numbers).
                Some(other) => {
                    let message = format!(
                        "wrong type for field ($db) {} != 2",
                        other.element_type() as u8
                    );
                    return Response::Reply(error_reply(13111, &message));
                }
            };
            if let Some(refusal) = malformed {
                return Response::Reply(refusal.reply);
            }
            // TK-2: the command is looked up before anything else reads the body.
            if !crate::refusals::known_command(name, shared.max_wire_version)
                || (name == "hello" && !shared.offers_hello)
            {
                state.unsupported.push(format!("command {name}"));
                return Response::Reply(crate::refusals::command_not_found(&state.role, name));
            }
            // Review32 R4 (house rule 7): the database name as the server parses the command
            // (`crate::database_name`).
            if let Some(refusal) = crate::database_name::parse_refusal(db) {
                return Response::Reply(refusal);
            }
            if let Some(refusal) = self.auth.refuse(&state.users, name) {
                return Response::Reply(refusal);
            }
            if let Some(refusal) =
                crate::refusals::refusal(&state.role, name, command, shared.max_wire_version)
            {
                return Response::Reply(refusal);
            }
            let required = state.require_api_version;
            if let Some(refusal) = crate::parameters::api_version_refusal(required, command) {
                return Response::Reply(refusal);
            }
            // TK-2: `stmtId` is refused loudly before the command runs (`commands::ENVELOPE`).
            if command.contains_key("stmtId") {
                let refusal = crate::commands::unsupported_reply("the stmtId argument");
                state.unsupported.push(format!("{name}: stmtId"));
                return Response::Reply(refusal);
            }
            // HS-4, review7 finding 3: only the first hello of a connection may carry `client`.
            if hello {
                if self.seen_hello && command.contains_key("client") {
                    return Response::Reply(error_reply(
                        186,
                        "The client metadata document may only be sent in the first hello",
                    ));
                }
                self.seen_hello = true;
                let router = state.role.is_router();
                let metadata = command.get_document("client").ok();
                if let Some(refusal) =
                    metadata.and_then(|c| crate::refusals::client_metadata_refusal(c, router))
                {
                    return Response::Reply(refusal);
                }
            }
            // SE-17 (review6 finding 8): a replica-set member or mongos takes the command's
            // gossiped `$clusterTime` (refusing a malformed one) before it reads
            // `afterClusterTime`.
            if let (false, Some(gossip)) =
                (state.role == Role::Standalone, command.get("$clusterTime"))
            {
                match crate::refusals::gossiped_cluster_time(gossip) {
                    Ok(time) => state.data.lock().advance_clock(time),
                    Err(refusal) => return Response::Reply(refusal),
                }
            }
            let now = state.data.lock().cluster_time();
            if let Some(refusal) =
                crate::refusals::after_cluster_time_refusal(&state.role, name, command, now)
            {
                return Response::Reply(refusal);
            }
            let admin_command = hello || name == "configureFailPoint";
            if !admin_command {
                if let Some(rejection) = state.ingress_rejection() {
                    return Response::Reply(rejection);
                }
            }
            let router = state.role.is_router();
            let invalid_db = crate::database_name::validity_refusal(db, router);
            let fired = if name == "configureFailPoint" {
                None
            } else {
                state.trigger_fail_point(name, self.app_name.as_deref())
            };
            (fired, invalid_db)
        };
        if let Some(fail) = &fired {
            if let Some(block) = fail.block {
                sleep(block).await;
            }
            if fail.close_connection {
                return Response::Close;
            }
            if let Some(mut reply) = fail.error_reply(name, command) {
                let state = shared.lock();
                add_topology_version(&state, shared.process_id, &mut reply);
                return Response::Reply(reply);
            }
        }
        // Review32 R4 (house rule 7): `validDBName`, after the fail point as on a real server
        // (`crate::database_name`).
        if let Some(refusal) = invalid_db {
            return Response::Reply(refusal);
        }
        if let Some(wait) = crate::query::where_sleep(command) {
            sleep(wait).await;
        }
        // TK-15 (review7 finding 1): a write outside any transaction that touches a document a
        // transaction in progress changed waits until that transaction ends, then runs again;
        // `maxTimeMS` bounds the wait (MaxTimeMSExpired, 50), else the transaction lifetime
        // limit counted from the blocking transaction's own start (review8 finding 6), after
        // which that transaction is aborted as a real server's reaper does.
        let ended = shared.lock().data.lock().transaction_ended();
        // Review37 W4: a getMore's `maxTimeMS` is no deadline of the operation (a real server
        // sets none from it, src/mongo/db/service_entry_point_common.cpp, and refuses it on a
        // non-awaitData cursor once the cursor is found): a queued getMore waits without one.
        let max_time = command
            .get("maxTimeMS")
            .filter(|_| name != "getMore")
            .and_then(crate::commands::integer)
            .filter(|ms| *ms > 0)
            .map(|ms| Instant::now() + Duration::from_millis(ms.unsigned_abs()));
        let mut held = None;
        let response = loop {
            let notified = ended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let blocked_by = match self.run(shared, name, request, fired.clone(), &mut held) {
                Ok(response) => break response,
                Err(session) => session,
            };
            // Leftovers12 item 5: a command queued behind a pending DDL command whose
            // transaction has ended waits for that command's turn (told by `notified`), with no
            // deadline of its own but its `maxTimeMS`.
            let deadline = max_time.or_else(|| {
                let started = shared.lock().data.lock().transaction_started(&blocked_by);
                started.map(|s| s + TRANSACTION_LIFETIME_LIMIT)
            });
            let expiry = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut notified => {}
                () = expiry => {
                    if max_time.is_some() {
                        break Response::Reply(error_reply(50, "operation exceeded time limit"));
                    }
                    shared.lock().data.lock().expire_transaction(&blocked_by);
                }
            }
        };
        // TK-15: a DDL command that waited no longer does.
        self.ddl_wait = None;
        response
    }

    /// Runs an admitted command whose fail point (if any) `fired`; `Err` with the session of the
    /// transaction in progress a write outside any transaction ran into (it was undone and must
    /// wait, review7 finding 1).
    fn run(
        &mut self,
        shared: &Shared,
        name: &str,
        request: &OpMsg,
        fired: Option<FailCommand>,
        held: &mut HeldFiring,
    ) -> Result<Response, Vec<u8>> {
        let command = &request.body;
        let hello = is_hello(name);
        let mut state = shared.lock();
        // Review13 finding 1: a `writeConcern` on a command that takes none, after the fail
        // point and before the session is checked out, as a real server checks it.
        if let Some(reply) = crate::refusals::write_concern_refusal(&state.role, name, command) {
            return Ok(Response::Reply(reply));
        }
        // Versioned-api "Transactions": checked as a server checks the session out, after the
        // fail point and before the command (a retryable write's replay included).
        let router = self.router(shared);
        if let Some(reply) = crate::commands::transaction_api_refusal(&state, name, command, router)
        {
            return Ok(Response::Reply(reply));
        }
        let write_key = write_key(name, command);
        let statements = write_key
            .as_ref()
            .and_then(|_| crate::commands::statement_requests(name, request));
        if let (Some(key), Some(statements)) = (&write_key, statements) {
            let router = self.router(shared);
            return Ok(
                match statement_writes(
                    &mut state,
                    shared,
                    router,
                    name,
                    key,
                    statements,
                    Kept {
                        held,
                        wait: &mut self.ddl_wait,
                    },
                )? {
                    Response::Reply(mut reply) => {
                        add_write_concern_error(fired, name, command, &mut reply);
                        add_topology_version(&state, shared.process_id, &mut reply);
                        Response::Reply(reply)
                    }
                    close => close,
                },
            );
        }
        if let Some(mut reply) = write_key
            .as_ref()
            .and_then(|k| state.data.lock().write_result(k))
        {
            state.counters.command_mut(name).replayed += 1;
            // A replayed retry still passes through failCommand: its writeConcernError applies
            // to the replayed reply as to a first execution (RW unified
            // insertOne-errorLabels "fails after multiple retryable writeConcernErrors").
            add_write_concern_error(fired, name, command, &mut reply);
            add_topology_version(&state, shared.process_id, &mut reply);
            return Ok(Response::Reply(reply));
        }
        if let Some(key) = &write_key {
            if let Some(refusal) = begin_write(&state, key) {
                return Ok(refusal);
            }
        }
        let mut close_after_commit = false;
        let mut firing = None;
        if write_key.is_some() {
            firing = held
                .take()
                .unwrap_or_else(|| state.on_primary_write_firing());
            match firing {
                Some(Firing::CloseWithoutCommit) => return Ok(Response::Close),
                Some(Firing::CommitThenClose) => close_after_commit = true,
                Some(Firing::Nothing) | None => {}
            }
        }
        let reply = if hello {
            if let Some(refusal) = crate::commands::hello_refusal(command) {
                return Ok(Response::Reply(refusal));
            }
            let mut reply = self.hello_reply(&mut state, shared, name, HelloAsk::of(command));
            self.auth
                .hello(&state.users, command, &mut reply, &mut self.rng);
            Some(reply)
        } else if let Some(reply) = self
            .auth
            .dispatch(&state.users, name, command, &mut self.rng)
        {
            Some(reply)
        } else {
            execute(
                &mut state,
                name,
                request,
                shared.max_wire_version,
                self.router(shared),
                self.ddl_wait.as_ref().map(|wait| wait.number),
                &self.as_sent,
            )
        };
        if let Some(session) = blocked(&state.data, &mut self.ddl_wait) {
            *held = write_key.is_some().then_some(firing);
            return Err(session);
        }
        let Some(mut reply) = reply else {
            // A known command the test server does not run (TK-2, `commands::KNOWN_NOT_RUN`).
            state.unsupported.push(format!("command {name}"));
            let what = format!("command {name}");
            return Ok(Response::Reply(crate::commands::unsupported_reply(&what)));
        };
        if let Some(what) = crate::commands::refusal(name, &reply) {
            state.unsupported.push(what);
        }
        state.counters.command_mut(name).executed += 1;
        if let Some(key) = write_key {
            if retry_core::reply::is_ok(&reply) {
                state.data.lock().record_write(key, reply.clone());
            }
        }
        if close_after_commit {
            return Ok(Response::Close);
        }
        add_write_concern_error(fired, name, command, &mut reply);
        add_topology_version(&state, shared.process_id, &mut reply);
        Ok(Response::Reply(reply))
    }

    /// HS-3, HS-4, LB-17: the hello reply of this connection ([`Connection::service_id`]);
    /// `helloOk: true` only from a server that offers `hello` ([`Shared::offers_hello`]).
    fn hello_reply(
        &mut self,
        state: &mut State,
        shared: &Shared,
        name: &str,
        mut ask: HelloAsk,
    ) -> Document {
        ask.hello_ok &= shared.offers_hello;
        let context = HelloContext {
            me: &shared.me,
            process_id: shared.process_id,
            service_id: self.service_id(state, shared),
            connection_id: self.id,
            min_wire_version: shared.min_wire_version,
            max_wire_version: shared.max_wire_version,
        };
        hello_reply(name, ask, &state.role, state.topology_counter, &context)
    }

    /// TK-12: the server process a command of this connection runs on, for the cursors it opens
    /// and the transactions it starts: behind a load balancer with several services, the mongos
    /// the connection was routed to (each keeps its own cursors and router state), else this
    /// process.
    fn router(&self, shared: &Shared) -> ObjectId {
        self.service.unwrap_or(shared.process_id)
    }

    /// LB-17, TK-12: the `serviceId` of this connection: the process id, or with several services
    /// behind a load balancer, the one it is routed to at its first hello.
    fn service_id(&mut self, state: &mut State, shared: &Shared) -> ObjectId {
        match (self.service, state.services.len()) {
            (Some(service), _) => service,
            (None, 0) => shared.process_id,
            (None, n) => {
                let service = state.services[state.routed % n];
                state.routed += 1;
                self.service = Some(service);
                service
            }
        }
    }

    /// HS-4: records the handshake and remembers `client.application.name` for `appName`.
    fn record_handshake(&mut self, state: &mut State, command: &Document) {
        state.record_hello(self.id, Recorded::Decoded(command.clone()));
        let app_name = command
            .get_document("client")
            .and_then(|c| c.get_document("application"))
            .and_then(|a| a.get_str("name"));
        // The first hello's metadata stays (a later `client` is refused, 186).
        if let (Ok(name), false) = (app_name, self.seen_hello) {
            self.app_name = Some(name.to_owned());
        }
    }

    /// Encodes and writes a reply, or the random fault that replaces it; `false` means close.
    async fn send<S: ServerStream>(
        &mut self,
        shared: &Shared,
        stream: &mut S,
        response_to: i32,
        reply: Document,
        exempt_from_faults: bool,
    ) -> bool {
        self.last_request_id = self.last_request_id.wrapping_add(1);
        let mut message = OpMsg {
            request_id: self.last_request_id,
            response_to,
            flags: MsgFlags::NONE,
            body: reply,
            sequences: Vec::new(),
        };
        let mut bytes = core::mem::take(&mut self.out);
        bytes.clear();
        if let Err(e) = message.encode(MAX_MESSAGE_SIZE_BYTES as u32, &mut bytes) {
            bytes.clear();
            message.body = error_reply(10334, &format!("the reply does not encode: {e}"));
            if message
                .encode(MAX_MESSAGE_SIZE_BYTES as u32, &mut bytes)
                .is_err()
            {
                return false;
            }
        }
        self.write_reply(shared, stream, response_to, bytes, exempt_from_faults)
            .await
    }

    /// Writes an encoded reply (`bytes`, answering `response_to`), or the random fault that
    /// replaces it; `false` means close. Keeps `bytes` for the next reply.
    async fn write_reply<S: ServerStream>(
        &mut self,
        shared: &Shared,
        stream: &mut S,
        response_to: i32,
        bytes: Vec<u8>,
        exempt_from_faults: bool,
    ) -> bool {
        let (fault, stall_for) = if exempt_from_faults {
            (None, Duration::ZERO)
        } else {
            let mut state = shared.lock();
            let fault = state.faults.choose(&mut self.rng);
            if let Some(fault) = fault {
                state.counters.faults.record(fault);
            }
            (fault, state.faults.stall_for)
        };
        let written = match fault {
            None => stream.write_all(&bytes).await.map(|()| true),
            Some(Fault::Stall) => {
                sleep(stall_for).await;
                stream.write_all(&bytes).await.map(|()| true)
            }
            Some(Fault::ResetMidFrame) => {
                let half = stream.write_all(&bytes[..bytes.len() / 2]).await;
                half.and_then(|()| stream.set_zero_linger()).map(|()| false)
            }
            Some(Fault::Garbage) => {
                let junk = garbage(&mut self.rng);
                stream.write_all(&junk).await.map(|()| false)
            }
            Some(Fault::OversizedLength) => {
                let header = oversized_header(response_to);
                stream.write_all(&header).await.map(|()| false)
            }
        };
        // Kept for the next reply unless it grew large.
        if bytes.capacity() <= READ_CHUNK {
            self.out = bytes;
        }
        written.unwrap_or(false)
    }
}
