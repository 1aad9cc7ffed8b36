//! The engine end to end against scripted in-memory servers, in virtual time: a bounded simulated
//! driver in the style of quinn-proto's `Pair`. Every loop is capped in steps.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};
use retry_core::address::ServerAddress;
use retry_core::engine::{ConnId, Engine, EngineEvent, EngineOptions, OpId, OperationRequest};
use retry_core::error::NetworkErrorKind;
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::pool::PoolEvent;
use retry_core::retry::{OperationKind, RetryEvent};
use retry_core::selection::SelectionCriteria;
use retry_core::time::{Instant, OperationTimeout};
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
    fn answer(&mut self, request: &Document, handshake: bool) -> Option<Document> {
        let name = request.keys().next().cloned().unwrap_or_default();
        if name == "hello" || name.eq_ignore_ascii_case("ismaster") {
            if handshake && self.reset_handshakes > 0 {
                self.reset_handshakes -= 1;
                return None;
            }
            return Some(self.hello(request));
        }
        *self.executed.entry(name.clone()).or_default() += 1;
        if let Some((command, reply)) = &self.always {
            if *command == name {
                return Some(reply.clone());
            }
        }
        Some(self.script.pop_front().unwrap_or_else(|| doc! { "ok": 1 }))
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
            match server.answer(&request.body, handshake) {
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
        let request = OperationRequest {
            db: "test".into(),
            command,
            kind,
            criteria,
            timeout: OperationTimeout::Off,
            txn_number: None,
        };
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
