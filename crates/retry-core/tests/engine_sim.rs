//! The engine end to end against scripted in-memory servers, in virtual time: a bounded simulated
//! driver in the style of quinn-proto's `Pair`. Every loop is capped in steps.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};
use retry_core::address::ServerAddress;
use retry_core::engine::{
    ConnId, CursorHandle, CursorUse, Engine, EngineEvent, EngineOptions, OpId, OperationRequest,
    SessionId,
};
use retry_core::error::NetworkErrorKind;
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::pool::PoolEvent;
use retry_core::retry::{OperationKind, RetryEvent};
use retry_core::selection::SelectionCriteria;
use retry_core::time::Instant;
use retry_core::topology::TopologySettings;
use retry_core::wire::{FrameDecoder, MsgFlags, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES};

const MAX_STEPS: usize = 100_000;
const LATENCY: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Standalone,
    Mongos,
    LoadBalancer { service_id: bool },
}

/// A scripted server: answers hello by its role, and `ping`/`find`/`insert` by its script.
struct SimServer {
    role: Role,
    /// Replies for the next commands (not hello), in order; when empty, `{ok: 1}`.
    script: VecDeque<Document>,
    /// Every command with this name gets this reply (an `alwaysOn` fail point).
    always: Option<(String, Document)>,
    /// Reset every new connection during its handshake, this many times.
    reset_handshakes: u32,
    service_id: ObjectId,
    executed: BTreeMap<String, u32>,
    /// Every command (not hello) with the socket it arrived on.
    log: Vec<(String, ConnId)>,
}

impl SimServer {
    fn new(role: Role) -> SimServer {
        SimServer {
            role,
            script: VecDeque::new(),
            always: None,
            reset_handshakes: 0,
            service_id: ObjectId::parse_str("65a1b2c3d4e5f60718293a4b").unwrap(),
            executed: BTreeMap::new(),
            log: Vec::new(),
        }
    }

    fn hello(&self, request: &Document) -> Document {
        let mut reply = doc! { "ok": 1, "isWritablePrimary": true, "helloOk": true, "maxWireVersion": 25,
        "minWireVersion": 0, "maxBsonObjectSize": 16_777_216, "maxMessageSizeBytes": 48_000_000,
        "maxWriteBatchSize": 100_000, "logicalSessionTimeoutMinutes": 30 };
        match self.role {
            Role::Standalone => {}
            Role::Mongos => {
                reply.insert("msg", "isdbgrid");
            }
            Role::LoadBalancer { service_id } => {
                reply.insert("msg", "isdbgrid");
                if service_id && request.get_bool("loadBalanced").unwrap_or(false) {
                    reply.insert("serviceId", self.service_id);
                }
            }
        }
        reply
    }

    /// The reply to one command, or `None` to reset the connection.
    fn answer(&mut self, request: &Document, handshake: bool, conn: ConnId) -> Option<Document> {
        let name = request.keys().next().cloned().unwrap_or_default();
        if name == "hello" || name.eq_ignore_ascii_case("ismaster") {
            if handshake && self.reset_handshakes > 0 {
                self.reset_handshakes -= 1;
                return None;
            }
            return Some(self.hello(request));
        }
        *self.executed.entry(name.clone()).or_default() += 1;
        self.log.push((name.clone(), conn));
        if let Some((command, reply)) = &self.always {
            if *command == name {
                return Some(reply.clone());
            }
        }
        match self.script.pop_front() {
            // A scripted reset: the connection drops instead of replying.
            Some(reply) if reply.get_bool("$reset").unwrap_or(false) => None,
            Some(reply) => Some(reply),
            None => Some(doc! { "ok": 1 }),
        }
    }
}

struct SimSocket {
    address: ServerAddress,
    decoder: FrameDecoder,
    handshaken: bool,
}

/// The engine, its servers, and the sockets between them, in virtual time.
struct Sim {
    engine: Engine,
    servers: BTreeMap<ServerAddress, SimServer>,
    sockets: BTreeMap<ConnId, SimSocket>,
    /// Deliveries: when, to which socket, what (bytes, or a reset).
    inbox: Vec<(Instant, u64, ConnId, Option<Vec<u8>>)>,
    sequence: u64,
    now: Instant,
    events: Vec<(Instant, EngineEvent)>,
}

fn overload(code: i32) -> Document {
    doc! { "ok": 0, "code": code, "errmsg": "overloaded", "errorLabels": ["SystemOverloadedError", "RetryableError"] }
}

fn handshake() -> HandshakeOptions {
    let metadata = ClientMetadata::new("retry-core-sim", "0.1.0");
    HandshakeOptions {
        metadata,
        load_balanced: false,
        server_api: None,
        compressors: Vec::new(),
    }
}

impl Sim {
    fn new(
        servers: Vec<(ServerAddress, SimServer)>,
        configure: impl FnOnce(&mut EngineOptions),
    ) -> Sim {
        let seeds = servers.iter().map(|(a, _)| a.clone()).collect();
        let mut options = EngineOptions::new(TopologySettings::new(seeds), handshake());
        options.seed = 7;
        configure(&mut options);
        let engine = Engine::new(options, Instant::ZERO).expect("valid options");
        let mut sim = Sim {
            engine,
            servers: servers.into_iter().collect(),
            sockets: BTreeMap::new(),
            inbox: Vec::new(),
            sequence: 0,
            now: Instant::ZERO,
            events: Vec::new(),
        };
        sim.drain();
        sim
    }

    fn deliver_at(&mut self, at: Instant, conn: ConnId, bytes: Option<Vec<u8>>) {
        self.sequence += 1;
        self.inbox.push((at, self.sequence, conn, bytes));
    }

    /// Drains the engine's outputs into the simulated network.
    fn drain(&mut self) {
        for _ in 0..MAX_STEPS {
            let mut progressed = false;
            while let Some(connect) = self.engine.poll_connect() {
                progressed = true;
                self.sockets.insert(
                    connect.conn,
                    SimSocket {
                        address: connect.address,
                        decoder: FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES),
                        handshaken: false,
                    },
                );
                self.engine.handle_connected(connect.conn, self.now);
            }
            while let Some(transmit) = self.engine.poll_transmit() {
                progressed = true;
                self.serve(transmit.conn, &transmit.bytes);
            }
            while let Some(conn) = self.engine.poll_close() {
                progressed = true;
                self.sockets.remove(&conn);
            }
            while let Some(event) = self.engine.poll_event() {
                progressed = true;
                self.events.push((self.now, event));
            }
            if !progressed {
                return;
            }
        }
        panic!("the engine never went quiet");
    }

    fn serve(&mut self, conn: ConnId, mut bytes: &[u8]) {
        let now = self.now;
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        let mut replies = Vec::new();
        while !bytes.is_empty() {
            let (used, message) = socket
                .decoder
                .decode(bytes)
                .expect("the engine sends valid OP_MSG");
            bytes = &bytes[used..];
            let Some(request) = message else { continue };
            let server = self
                .servers
                .get_mut(&socket.address)
                .expect("a known server");
            let handshake = !socket.handshaken;
            socket.handshaken = true;
            match server.answer(&request.body, handshake, conn) {
                Some(body) => {
                    let reply = OpMsg {
                        request_id: 0,
                        response_to: request.request_id,
                        flags: MsgFlags::NONE,
                        body,
                        sequences: Vec::new(),
                    };
                    let mut out = Vec::new();
                    reply
                        .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut out)
                        .expect("encodable reply");
                    replies.push(Some(out));
                }
                None => replies.push(None),
            }
        }
        for reply in replies {
            self.deliver_at(now.saturating_add(LATENCY), conn, reply);
        }
    }

    /// Advances virtual time to the next delivery or engine timer, at most until `limit`.
    fn step(&mut self, limit: Instant) -> bool {
        let next_delivery = self.inbox.iter().map(|(t, ..)| *t).min();
        let next = [next_delivery, self.engine.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(next) = next.filter(|t| *t <= limit) else {
            return false;
        };
        self.now = self.now.max(next);
        self.inbox.sort_by_key(|(t, s, ..)| (*t, *s));
        while let Some(index) = self.inbox.iter().position(|(t, ..)| *t <= self.now) {
            let (_, _, conn, bytes) = self.inbox.remove(index);
            if !self.sockets.contains_key(&conn) {
                continue;
            }
            match bytes {
                Some(bytes) => self.engine.handle_bytes(conn, &bytes, self.now),
                None => {
                    self.sockets.remove(&conn);
                    self.engine
                        .handle_closed(conn, NetworkErrorKind::Reset, self.now);
                }
            }
            self.drain();
        }
        self.engine.handle_timeout(self.now);
        self.drain();
        true
    }

    /// Runs until `op` finishes (bounded in steps and virtual time).
    fn run(&mut self, op: OpId) -> Result<Document, retry_core::error::OperationError> {
        let limit = self.now.saturating_add(Duration::from_secs(120));
        for _ in 0..MAX_STEPS {
            if let Some(result) = self.result(op) {
                return result;
            }
            assert!(
                self.step(limit),
                "operation {op:?} did not finish by {limit}"
            );
        }
        panic!("step cap reached");
    }

    fn result(&self, op: OpId) -> Option<Result<Document, retry_core::error::OperationError>> {
        self.events.iter().find_map(|(_, e)| match e {
            EngineEvent::OperationFinished { op: o, result } if *o == op => Some(result.clone()),
            _ => None,
        })
    }

    fn start(
        &mut self,
        command: Document,
        kind: OperationKind,
        criteria: SelectionCriteria,
    ) -> OpId {
        self.start_request(OperationRequest::new("test", command, kind, criteria))
    }

    fn start_request(&mut self, request: OperationRequest) -> OpId {
        let op = self.engine.start_operation(request, self.now);
        self.drain();
        op
    }

    fn read(&mut self, command: Document) -> OpId {
        use retry_core::selection::{ReadPreference, ReadPreferenceMode};
        let primary =
            ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).expect("valid");
        let criteria = SelectionCriteria::Read(primary);
        self.start(command, OperationKind::Read, criteria)
    }

    /// The servers the attempts of `op` were sent to.
    fn attempt_servers(&self, op: OpId) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|(_, e)| match e {
                EngineEvent::Operation {
                    op: o,
                    event: RetryEvent::CommandStarted { address, .. },
                } if *o == op => Some(address.host().to_string()),
                _ => None,
            })
            .collect()
    }
}

fn address(host: &str) -> ServerAddress {
    ServerAddress::new(host, 27017)
}

#[test]
fn a_ping_on_a_standalone_succeeds_in_one_attempt() {
    let mut sim = Sim::new(
        vec![(address("db"), SimServer::new(Role::Standalone))],
        |_| {},
    );
    let op = sim.read(doc! { "ping": 1 });
    let reply = sim.run(op).expect("ping succeeds");
    assert_eq!(reply.get("ok"), Some(&Bson::Int32(1)));
    assert_eq!(sim.attempt_servers(op), ["db"]);
    assert_eq!(sim.servers[&address("db")].executed.get("ping"), Some(&1));
}

#[test]
fn bp20_an_overloaded_mongos_makes_the_retry_go_to_the_other_one() {
    let mut overloaded = SimServer::new(Role::Mongos);
    overloaded.always = Some(("find".into(), overload(462)));
    let healthy = SimServer::new(Role::Mongos);
    let mut sim = Sim::new(
        vec![(address("m1"), overloaded), (address("m2"), healthy)],
        |_| {},
    );
    // Let both mongos be discovered first.
    let ping = sim.read(doc! { "ping": 1 });
    sim.run(ping).unwrap();
    for _ in 0..20 {
        let op = sim.read(doc! { "find": "c" });
        sim.run(op)
            .expect("the retry on the healthy mongos succeeds");
        let servers = sim.attempt_servers(op);
        if servers[0] == "m1" {
            assert_eq!(
                servers,
                ["m1", "m2"],
                "BP-20: sharded retries always go elsewhere"
            );
            return;
        }
    }
    panic!("the overloaded mongos was never chosen first in 20 tries");
}

#[test]
fn bp27_the_connection_is_checked_in_before_every_backoff() {
    let mut server = SimServer::new(Role::Standalone);
    server.always = Some(("find".into(), overload(462)));
    let mut sim = Sim::new(vec![(address("db"), server)], |_| {});
    let op = sim.read(doc! { "find": "c" });
    let error = sim.run(op).unwrap_err();
    assert!(error.is_retryable_overload());
    // BP-27: each attempt's connection is checked in at the moment the attempt fails, before the
    // backoff, and before the next attempt checks a connection out.
    let failed: Vec<Instant> = sim
        .events
        .iter()
        .filter_map(|(t, e)| matches!(e, EngineEvent::Operation { op: o, event: RetryEvent::CommandFailed { .. } } if *o == op).then_some(*t))
        .collect();
    let pool: Vec<(Instant, &str)> = sim
        .events
        .iter()
        .filter_map(|(t, e)| match e {
            EngineEvent::Pool {
                event: PoolEvent::CheckedOut { .. },
                ..
            } => Some((*t, "out")),
            EngineEvent::Pool {
                event: PoolEvent::CheckedIn { .. },
                ..
            } => Some((*t, "in")),
            _ => None,
        })
        .collect();
    let kinds: Vec<&str> = pool.iter().map(|(_, k)| *k).collect();
    assert_eq!(kinds, ["out", "in", "out", "in", "out", "in"]);
    let checked_in: Vec<Instant> = pool
        .iter()
        .filter(|(_, k)| *k == "in")
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(
        checked_in, failed,
        "checked in when the attempt failed, before any wait"
    );
    let waits: Vec<Duration> = sim
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Operation {
                event: RetryEvent::RetryScheduled { delay, .. },
                ..
            } => Some(*delay),
            _ => None,
        })
        .collect();
    assert!(
        waits.iter().all(|d| !d.is_zero()),
        "the retries did back off: {waits:?}"
    );
}

#[test]
fn hs9_a_server_that_resets_handshakes_is_retried_with_backoff() {
    let mut server = SimServer::new(Role::Standalone);
    let mut sim_server_resets = 0;
    server.reset_handshakes = 0;
    let mut sim = Sim::new(vec![(address("db"), server)], |_| {});
    // Discover the server, then make it reset the next pooled connection's handshake once.
    let ping = sim.read(doc! { "ping": 1 });
    sim.run(ping).unwrap();
    // Force a new pooled connection: clear by closing the idle one is not needed; a second
    // concurrent operation needs a second connection.
    sim.servers
        .get_mut(&address("db"))
        .unwrap()
        .reset_handshakes = 1;
    sim_server_resets += 1;
    let first = sim.read(doc! { "find": "a" });
    let second = sim.read(doc! { "find": "b" });
    sim.run(first).unwrap();
    sim.run(second)
        .expect("the reset handshake is retried (HS-9 labels make it a retryable overload error)");
    let retried: Vec<_> = sim
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Operation {
                event: RetryEvent::RetryScheduled { reason, .. },
                ..
            } => Some(*reason),
            _ => None,
        })
        .collect();
    assert_eq!(retried.len(), sim_server_resets, "{retried:?}");
    assert_eq!(retried[0], retry_core::retry::RetryReason::Overload);
}

#[test]
fn lb_mode_uses_the_service_id_and_fails_with_the_exact_message_without_it() {
    let lb = SimServer::new(Role::LoadBalancer { service_id: true });
    let mut sim = Sim::new(vec![(address("lb"), lb)], |o| {
        o.topology.load_balanced = true
    });
    let op = sim.read(doc! { "ping": 1 });
    sim.run(op).expect("LB mode with serviceId works");

    let no_service = SimServer::new(Role::LoadBalancer { service_id: false });
    let mut sim = Sim::new(vec![(address("lb"), no_service)], |o| {
        o.topology.load_balanced = true
    });
    let op = sim.read(doc! { "ping": 1 });
    let error = sim.run(op).unwrap_err();
    assert!(
        error.to_string().contains("Driver attempted to initialize in load balancing mode, but the server does not support this mode."),
        "{error}"
    );
}

#[test]
fn identical_seeds_give_identical_traces() {
    let trace = || {
        let mut server = SimServer::new(Role::Standalone);
        server.script = VecDeque::from(vec![overload(462), overload(462)]);
        let mut sim = Sim::new(vec![(address("db"), server)], |_| {});
        let op = sim.read(doc! { "find": "c" });
        sim.run(op).unwrap();
        format!("{:?}", sim.events)
    };
    assert_eq!(trace(), trace());
}

fn primary_read() -> SelectionCriteria {
    use retry_core::selection::{ReadPreference, ReadPreferenceMode};
    SelectionCriteria::Read(
        ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).expect("valid"),
    )
}

fn batch(id: i64, field: &str) -> Document {
    doc! { "ok": 1, "cursor": { "id": id, "ns": "test.c", field: [] } }
}

impl Sim {
    fn cursor_of(&self, op: OpId) -> Option<CursorHandle> {
        self.events.iter().find_map(|(_, e)| match e {
            EngineEvent::CursorOpened { op: o, cursor } if *o == op => Some(*cursor),
            _ => None,
        })
    }

    fn cursor_op(&mut self, command: Document, kind: OperationKind, cursor: CursorUse) -> OpId {
        let mut request = OperationRequest::new("test", command, kind, primary_read());
        request.cursor = cursor;
        self.start_request(request)
    }

    fn pool_events(&self) -> Vec<&'static str> {
        self.events
            .iter()
            .filter_map(|(_, e)| match e {
                EngineEvent::Pool {
                    event: PoolEvent::CheckOutStarted { .. },
                    ..
                } => Some("started"),
                EngineEvent::Pool {
                    event: PoolEvent::CheckedOut { .. },
                    ..
                } => Some("out"),
                EngineEvent::Pool {
                    event: PoolEvent::CheckedIn { .. },
                    ..
                } => Some("in"),
                _ => None,
            })
            .collect()
    }
}

fn lb_sim(script: Vec<Document>) -> Sim {
    let mut lb = SimServer::new(Role::LoadBalancer { service_id: true });
    lb.script = VecDeque::from(script);
    Sim::new(vec![(address("lb"), lb)], |o| {
        o.topology.load_balanced = true
    })
}

#[test]
fn lb10_a_load_balanced_cursor_stays_pinned_across_get_mores() {
    let mut sim = lb_sim(vec![
        batch(42, "firstBatch"),
        overload(462),
        batch(42, "nextBatch"),
        batch(0, "nextBatch"),
    ]);
    let find = sim.cursor_op(doc! { "find": "c" }, OperationKind::Read, CursorUse::Open);
    sim.run(find).unwrap();
    let cursor = sim
        .cursor_of(find)
        .expect("a non-zero cursor id opens a cursor");
    // BP-5: the overloaded getMore is retried, on the same pinned connection (C8).
    let more = sim.cursor_op(
        doc! { "getMore": 42i64, "collection": "c" },
        OperationKind::GetMore,
        CursorUse::GetMore(cursor),
    );
    sim.run(more).unwrap();
    let last = sim.cursor_op(
        doc! { "getMore": 42i64, "collection": "c" },
        OperationKind::GetMore,
        CursorUse::GetMore(cursor),
    );
    sim.run(last).unwrap();
    let log = &sim.servers[&address("lb")].log;
    let names: Vec<&str> = log.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["find", "getMore", "getMore", "getMore"]);
    assert!(
        log.iter().all(|(_, c)| *c == log[0].1),
        "every command on the connection that opened the cursor: {log:?}"
    );
    // LB-9: one checkout and one check-in for the cursor's whole life.
    assert_eq!(sim.pool_events(), ["started", "out", "in"]);
    // The exhausted cursor is gone.
    let after = sim.cursor_op(
        doc! { "getMore": 42i64, "collection": "c" },
        OperationKind::GetMore,
        CursorUse::GetMore(cursor),
    );
    let error = sim.run(after).unwrap_err();
    assert!(error.to_string().contains("is not open"), "{error}");
}

#[test]
fn lb10_closing_a_cursor_sends_kill_cursors_on_its_connection_then_checks_it_in() {
    let mut sim = lb_sim(vec![batch(42, "firstBatch")]);
    let find = sim.cursor_op(doc! { "find": "c" }, OperationKind::Read, CursorUse::Open);
    sim.run(find).unwrap();
    let cursor = sim.cursor_of(find).unwrap();
    let kill = sim.cursor_op(
        doc! { "killCursors": "c", "cursors": [42i64] },
        OperationKind::RunCommand,
        CursorUse::Close(cursor),
    );
    sim.run(kill).unwrap();
    let log = &sim.servers[&address("lb")].log;
    assert_eq!(
        log.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["find", "killCursors"]
    );
    assert_eq!(log[0].1, log[1].1);
    assert_eq!(sim.pool_events(), ["started", "out", "in"]);
}

#[test]
fn a_cursor_with_id_zero_pins_nothing() {
    let mut sim = lb_sim(vec![batch(0, "firstBatch")]);
    let find = sim.cursor_op(doc! { "find": "c" }, OperationKind::Read, CursorUse::Open);
    sim.run(find).unwrap();
    assert_eq!(sim.cursor_of(find), None);
    assert_eq!(sim.pool_events(), ["started", "out", "in"]);
}

#[test]
fn lb13_an_exhausted_pool_names_the_connections_in_use() {
    let mut lb = SimServer::new(Role::LoadBalancer { service_id: true });
    lb.script = VecDeque::from(vec![batch(42, "firstBatch")]);
    let mut sim = Sim::new(vec![(address("lb"), lb)], |o| {
        o.topology.load_balanced = true;
        o.topology.pool.max_pool_size = 1;
        o.topology.pool.wait_queue_timeout = Some(Duration::from_millis(100));
    });
    let find = sim.cursor_op(doc! { "find": "c" }, OperationKind::Read, CursorUse::Open);
    sim.run(find).unwrap();
    assert!(sim.cursor_of(find).is_some());
    let ping = sim.read(doc! { "ping": 1 });
    let error = sim.run(ping).unwrap_err();
    assert!(
        error.to_string().contains(
            "maxPoolSize: 1, connections in use by cursors: 1, connections in use by transactions: 0, connections in use by other operations: 0"
        ),
        "{error}"
    );
}

impl Sim {
    fn in_session(&mut self, session: SessionId, command: Document, kind: OperationKind) -> OpId {
        let mut request = OperationRequest::new("test", command, kind, SelectionCriteria::Write);
        request.session = Some(session);
        request.txn_number = Some(1);
        self.start_request(request)
    }
}

fn three_mongos(script_for_all: Vec<Document>) -> Sim {
    let servers = ["m1", "m2", "m3"]
        .into_iter()
        .map(|h| {
            let mut m = SimServer::new(Role::Mongos);
            m.script = VecDeque::from(script_for_all.clone());
            (address(h), m)
        })
        .collect();
    let mut sim = Sim::new(servers, |o| {
        o.selection.local_threshold = Duration::from_secs(1)
    });
    let ping = sim.read(doc! { "ping": 1 });
    sim.run(ping).unwrap();
    sim
}

#[test]
fn tx3_a_sharded_transaction_stays_on_the_mongos_of_its_first_command() {
    use OperationKind::{CommitTransaction, InTransaction};
    let mut sim = three_mongos(Vec::new());
    let session = SessionId(1);
    let first = sim.in_session(
        session,
        doc! { "insert": "c", "documents": [{}] },
        InTransaction {
            read: false,
            first: true,
        },
    );
    sim.run(first).unwrap();
    let pinned = sim.attempt_servers(first)[0].clone();
    for _ in 0..5 {
        let next = sim.in_session(
            session,
            doc! { "insert": "c", "documents": [{}] },
            InTransaction {
                read: false,
                first: false,
            },
        );
        sim.run(next).unwrap();
        assert_eq!(sim.attempt_servers(next), std::slice::from_ref(&pinned));
    }
    let commit = sim.in_session(
        session,
        doc! { "commitTransaction": 1 },
        CommitTransaction { again: false },
    );
    sim.run(commit).unwrap();
    assert_eq!(sim.attempt_servers(commit), std::slice::from_ref(&pinned));
    // TX-4 (4): a new transaction is not bound to the old pin; over many transactions more than one
    // mongos is used (the transactions prose test).
    let mut used = std::collections::BTreeSet::new();
    for n in 0..30 {
        let first = sim.in_session(
            session,
            doc! { "insert": "c", "documents": [{ "n": n }] },
            InTransaction {
                read: false,
                first: true,
            },
        );
        sim.run(first).unwrap();
        used.insert(sim.attempt_servers(first)[0].clone());
    }
    assert!(used.len() > 1, "{used:?}");
}

#[test]
fn tx4_a_commit_with_an_unknown_result_is_unpinned_before_its_retry() {
    use OperationKind::{CommitTransaction, InTransaction};
    let mut sim = three_mongos(Vec::new());
    let session = SessionId(7);
    let first = sim.in_session(
        session,
        doc! { "insert": "c", "documents": [{}] },
        InTransaction {
            read: false,
            first: true,
        },
    );
    sim.run(first).unwrap();
    let pinned = sim.attempt_servers(first)[0].clone();
    // The pinned mongos drops the commit's connection: a network error, UnknownTransactionCommitResult
    // (TX-8) and RetryableWriteError (RW-9); the retry is unpinned and, on a sharded cluster,
    // deprioritizes the failed mongos (BP-20).
    sim.servers
        .get_mut(&address(&pinned))
        .unwrap()
        .script
        .push_back(doc! { "$reset": true });
    let commit = sim.in_session(
        session,
        doc! { "commitTransaction": 1 },
        CommitTransaction { again: false },
    );
    sim.run(commit)
        .expect("the retried commit succeeds elsewhere");
    let servers = sim.attempt_servers(commit);
    assert_eq!(servers.len(), 2);
    assert_eq!(servers[0], pinned);
    assert_ne!(servers[1], pinned);
}

#[test]
fn tx5_a_load_balanced_transaction_keeps_one_connection_until_the_session_ends() {
    use OperationKind::{CommitTransaction, InTransaction};
    let mut sim = lb_sim(Vec::new());
    let session = SessionId(3);
    let first = sim.in_session(
        session,
        doc! { "insert": "c", "documents": [{}] },
        InTransaction {
            read: false,
            first: true,
        },
    );
    sim.run(first).unwrap();
    let second = sim.in_session(
        session,
        doc! { "find": "c" },
        InTransaction {
            read: true,
            first: false,
        },
    );
    sim.run(second).unwrap();
    let commit = sim.in_session(
        session,
        doc! { "commitTransaction": 1 },
        CommitTransaction { again: false },
    );
    sim.run(commit).unwrap();
    let log = &sim.servers[&address("lb")].log;
    assert_eq!(
        log.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["insert", "find", "commitTransaction"]
    );
    assert!(log.iter().all(|(_, c)| *c == log[0].1), "{log:?}");
    // A successful commit does not unpin (TX-4); ending the session does.
    assert_eq!(sim.pool_events(), ["started", "out"]);
    sim.engine.end_session(session, sim.now);
    sim.drain();
    assert_eq!(sim.pool_events(), ["started", "out", "in"]);
}
