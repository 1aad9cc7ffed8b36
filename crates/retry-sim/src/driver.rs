//! The simulated driver: [`Sim`] (the engine, its servers, the sockets between them and the
//! virtual clock) and [`SimServer`] (one scripted server).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bson::raw::RawBsonRef;
use bson::{doc, oid::ObjectId, Document, RawDocument};
use retry_core::address::ServerAddress;
use retry_core::engine::{
    ConnId, CursorHandle, Engine, EngineEvent, EngineOptions, OpId, OperationRequest,
};
use retry_core::error::{NetworkErrorKind, OperationError};
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::retry::{OperationKind, RetryEvent};
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::Instant;
use retry_core::topology::TopologySettings;
use retry_core::wire::{
    to_document, FrameDecoder, MsgFlags, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES,
};

/// The cap on the steps of every loop of the driver.
pub const MAX_STEPS: usize = 100_000;
/// The one-way delay of the simulated network.
pub const LATENCY: Duration = Duration::from_millis(1);

/// What a simulated server is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A standalone `mongod`.
    Standalone,
    /// A `mongos`.
    Mongos,
    /// A load balancer in front of mongos.
    LoadBalancer {
        /// Whether its hello carries a `serviceId`.
        service_id: bool,
    },
    /// A replica-set member; what its hello says is in [`SimServer::member`].
    Member,
}

/// What a replica-set member's hello says (SDAM): the set's config as this member sees it, and
/// whether it is the primary. Tests change it between steps to move the set.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberState {
    /// `setName`.
    pub set_name: String,
    /// Whether the member is the primary (`isWritablePrimary`); else a secondary.
    pub primary: bool,
    /// `hosts`: the members of the set, as `host:port`.
    pub hosts: Vec<String>,
    /// `setVersion`.
    pub set_version: i32,
    /// The counter of the primary's `electionId` (sent by a primary only).
    pub election: u32,
}

impl Default for MemberState {
    fn default() -> MemberState {
        MemberState {
            set_name: "rs".into(),
            primary: false,
            hosts: Vec::new(),
            set_version: 1,
            election: 1,
        }
    }
}

/// What a scripted server does with one command (hello excluded).
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Reply with `body`, `delay` after the network latency.
    Reply {
        /// The reply document.
        body: Document,
        /// How much later than the network latency the reply arrives.
        delay: Duration,
    },
    /// Reset the connection instead of replying.
    Reset,
    /// Write these bytes, which are not a valid reply, instead of replying.
    Garbage(Vec<u8>),
}

impl Step {
    /// An immediate reply.
    pub fn reply(body: Document) -> Step {
        Step::Reply {
            body,
            delay: Duration::ZERO,
        }
    }
}

/// A scripted server: answers hello by its role, and other commands by its script.
pub struct SimServer {
    /// What `hello` says this server is.
    pub role: Role,
    /// Steps for the next commands (not hello), in order; when empty, `{ok: 1}`.
    pub script: VecDeque<Step>,
    /// Every command with this name gets this reply (an `alwaysOn` fail point).
    pub always: Option<(String, Document)>,
    /// Reset this many new connections during their handshake.
    pub reset_handshakes: u32,
    /// How much later than the network latency handshake replies arrive.
    pub handshake_delay: Duration,
    /// The `serviceId` a load balancer's hello carries (unless [`SimServer::service_ids`] lists
    /// others).
    pub service_id: ObjectId,
    /// LB-14, LB-15 (review38 L10 item 3): when not empty, a load balancer fronting several
    /// mongos: the `n`th connection's handshake (from 0, in the order handshakes arrive) gets
    /// `service_ids[n % len]` instead of [`SimServer::service_id`]. Default empty.
    pub service_ids: Vec<ObjectId>,
    /// Handshakes answered so far (picks the next of [`SimServer::service_ids`]).
    handshakes: usize,
    /// What a [`Role::Member`] says in its hello.
    pub member: MemberState,
    /// While true, the server is down: it resets every connection at its first command (hello
    /// included), so monitors and pools see it unreachable.
    pub down: bool,
    /// Commands executed (not hello), by name.
    pub executed: BTreeMap<String, u32>,
    /// Every command (not hello) with the socket it arrived on, in order.
    pub log: Vec<(String, ConnId)>,
    /// Whether its hello reports `logicalSessionTimeoutMinutes: 30` (SE-8); default true.
    pub sessions: bool,
    /// Keep every command (not hello) as received in [`SimServer::commands`]; default false.
    pub record_commands: bool,
    /// The commands received (not hello), when [`SimServer::record_commands`] is on.
    pub commands: Vec<Document>,
    /// The top-level keys of each of [`SimServer::commands`], read from the bytes received, in
    /// order: a key sent twice is here twice (a `Document` keeps one; house rule 7, WP-5).
    pub command_keys: Vec<Vec<String>>,
    /// A `$clusterTime` document every reply (not hello) carries (SE-16).
    pub cluster_time: Option<Document>,
    /// Keep every command as received, hellos included, in [`SimServer::raw_commands`]; default
    /// false.
    pub record_raw: bool,
    /// The commands received, hellos included, as their bytes, when [`SimServer::record_raw`] is
    /// on (a repeated field stays visible).
    pub raw_commands: Vec<bson::RawDocumentBuf>,
    /// A real server's `requireApiVersion` parameter (versioned-api spec, "Backward
    /// Compatibility"): every command without `apiVersion`, hellos included, is refused with code
    /// 498870, as the server's `enforceRequireAPIVersion` refuses any command of an external
    /// client (only a hello with `internalClient`, which drivers never send, is exempt); a
    /// client without a declared API version cannot even complete its handshake. Default false.
    pub require_api_version: bool,
}

impl SimServer {
    /// A server with an empty script.
    pub fn new(role: Role) -> SimServer {
        SimServer {
            role,
            script: VecDeque::new(),
            always: None,
            reset_handshakes: 0,
            handshake_delay: Duration::ZERO,
            service_id: ObjectId::parse_str("65a1b2c3d4e5f60718293a4b").unwrap(),
            service_ids: Vec::new(),
            handshakes: 0,
            member: MemberState::default(),
            down: false,
            executed: BTreeMap::new(),
            log: Vec::new(),
            sessions: true,
            record_commands: false,
            commands: Vec::new(),
            command_keys: Vec::new(),
            cluster_time: None,
            record_raw: false,
            raw_commands: Vec::new(),
            require_api_version: false,
        }
    }

    /// The `serviceId` a load balancer's hello carries: a handshake takes the next of
    /// [`SimServer::service_ids`], if any.
    fn next_service_id(&mut self, handshake: bool) -> ObjectId {
        if !handshake || self.service_ids.is_empty() {
            return self.service_id;
        }
        let id = self.service_ids[self.handshakes % self.service_ids.len()];
        self.handshakes += 1;
        id
    }

    fn hello(&self, request: &RawDocument, service: ObjectId) -> Document {
        let mut reply = doc! { "ok": 1, "isWritablePrimary": true, "helloOk": true, "maxWireVersion": 25,
        "minWireVersion": 0, "maxBsonObjectSize": 16_777_216, "maxMessageSizeBytes": 48_000_000,
        "maxWriteBatchSize": 100_000 };
        if self.sessions {
            reply.insert("logicalSessionTimeoutMinutes", 30);
        }
        match self.role {
            Role::Standalone => {}
            Role::Member => {
                let member = &self.member;
                reply.insert("isWritablePrimary", member.primary);
                reply.insert("secondary", !member.primary);
                reply.insert("setName", member.set_name.clone());
                reply.insert("hosts", member.hosts.clone());
                reply.insert("setVersion", member.set_version);
                if member.primary {
                    let mut id = [0_u8; 12];
                    id[0] = 0x7f;
                    id[8..].copy_from_slice(&member.election.to_be_bytes());
                    reply.insert("electionId", ObjectId::from_bytes(id));
                }
            }
            Role::Mongos => {
                reply.insert("msg", "isdbgrid");
            }
            Role::LoadBalancer { service_id } => {
                reply.insert("msg", "isdbgrid");
                if service_id && request.get_bool("loadBalanced").unwrap_or(false) {
                    reply.insert("serviceId", service);
                }
            }
        }
        reply
    }

    /// What the server does with one command; `handshake` is true for a socket's first command.
    /// The command is read where it lies, in one pass (a real server does not build a tree
    /// either), and converted only to be recorded. `None` is the plain `{ok: 1}`.
    fn answer(&mut self, request: &RawDocument, handshake: bool, conn: ConnId) -> Option<Step> {
        let fields = Fields::read(request);
        if self.down {
            return Some(Step::Reset);
        }
        if self.record_raw {
            self.raw_commands.push(request.to_owned());
        }
        let name = fields.name;
        if name == "hello" || name.eq_ignore_ascii_case("ismaster") {
            if handshake && self.reset_handshakes > 0 {
                self.reset_handshakes -= 1;
                return Some(Step::Reset);
            }
            let delay = if handshake {
                self.handshake_delay
            } else {
                Duration::ZERO
            };
            let body = match self.api_version_refusal(&fields) {
                Some(refusal) => refusal,
                None => {
                    let service = self.next_service_id(handshake);
                    self.hello(request, service)
                }
            };
            return Some(Step::Reply { body, delay });
        }
        if self.record_commands {
            let command = Document::try_from(request).expect("the codec validated it");
            self.commands.push(command);
            let keys = request.iter().map(|element| {
                let (key, _) = element.expect("the codec validated it");
                key.as_str().to_owned()
            });
            self.command_keys.push(keys.collect());
        }
        let step = self.run_command(&fields, conn);
        let Some(time) = &self.cluster_time else {
            return step;
        };
        let mut step = step.unwrap_or_else(|| Step::reply(doc! { "ok": 1 }));
        if let Step::Reply { body, .. } = &mut step {
            body.insert("$clusterTime", time.clone());
        }
        Some(step)
    }

    /// What a real server refuses before running a command: no `apiVersion` under
    /// [`SimServer::require_api_version`] (498870), a `txnNumber` without an `lsid` (72) or on a
    /// standalone (20).
    fn refusal(&self, fields: &Fields<'_>) -> Option<Document> {
        if let Some(refusal) = self.api_version_refusal(fields) {
            return Some(refusal);
        }
        if !fields.txn_number {
            return None;
        }
        if !fields.lsid {
            return Some(
                doc! { "ok": 0, "code": 72, "codeName": "InvalidOptions", "errmsg": "Transaction number requires a session ID to also be specified" },
            );
        }
        (self.role == Role::Standalone).then(|| doc! { "ok": 0, "code": 20, "codeName": "IllegalOperation", "errmsg": "Transaction numbers are only allowed on a replica set member or mongos" })
    }

    /// [`SimServer::require_api_version`]'s refusal of a command without `apiVersion` (498870),
    /// a hello included.
    fn api_version_refusal(&self, fields: &Fields<'_>) -> Option<Document> {
        (self.require_api_version && !fields.api_version).then(|| {
            doc! { "ok": 0, "code": 498870, "codeName": "Location498870", "errmsg": "The apiVersion parameter is required, please configure your MongoClient's API version" }
        })
    }

    fn run_command(&mut self, fields: &Fields<'_>, conn: ConnId) -> Option<Step> {
        let name = fields.name;
        if let Some(refusal) = self.refusal(fields) {
            return Some(Step::reply(refusal));
        }
        // Counted without cloning the name when it is already there.
        match self.executed.get_mut(name) {
            Some(count) => *count += 1,
            None => {
                self.executed.insert(name.to_owned(), 1);
            }
        }
        self.log.push((name.to_owned(), conn));
        // A secondary serves what carries a non-primary `$readPreference` (SS-9: secondaryOk
        // on OP_MSG) and refuses everything else, as a real one does for a primary read:
        // NotPrimaryNoSecondaryOk, an SDAM state-change error.
        let secondary_ok = fields.read_preference.is_some_and(
            |p| matches!(p.get("mode"), Ok(Some(RawBsonRef::String(m))) if m != "primary"),
        );
        if self.role == Role::Member && !self.member.primary && !secondary_ok {
            // The refusal takes the script's next step for the timing (a slow step is a slow
            // refusal) and the failures (resets, garbage).
            let refusal = doc! { "ok": 0, "code": 13435, "codeName": "NotPrimaryNoSecondaryOk", "errmsg": "not primary and secondaryOk=false" };
            return Some(match self.script.pop_front() {
                Some(Step::Reply { delay, .. }) => Step::Reply {
                    body: refusal,
                    delay,
                },
                None => Step::reply(refusal),
                Some(other) => other,
            });
        }
        if let Some((command, reply)) = &self.always {
            if command == name {
                return Some(Step::reply(reply.clone()));
            }
        }
        self.script.pop_front()
    }
}

/// What the server reads of a command, in one pass over its elements.
struct Fields<'a> {
    /// The command name: the first key.
    name: &'a str,
    txn_number: bool,
    lsid: bool,
    api_version: bool,
    read_preference: Option<&'a RawDocument>,
}

impl<'a> Fields<'a> {
    fn read(request: &'a RawDocument) -> Fields<'a> {
        let mut fields = Fields {
            name: "",
            txn_number: false,
            lsid: false,
            api_version: false,
            read_preference: None,
        };
        for (i, element) in request.iter().enumerate() {
            let Ok((key, value)) = element else { break };
            if i == 0 {
                fields.name = key.as_str();
            }
            match key.as_str() {
                "txnNumber" => fields.txn_number = true,
                "lsid" => fields.lsid = true,
                "apiVersion" => fields.api_version = true,
                "$readPreference" => {
                    if let RawBsonRef::Document(p) = value {
                        fields.read_preference = Some(p);
                    }
                }
                _ => {}
            }
        }
        fields
    }
}

/// The server end of one socket.
pub struct SimSocket {
    /// The server this socket is connected to.
    pub address: ServerAddress,
    decoder: FrameDecoder,
    handshaken: bool,
}

/// What the network delivers to the engine.
enum Delivery {
    Bytes(Vec<u8>),
    Reset,
}

/// The engine, its servers, and the sockets between them, in virtual time.
pub struct Sim {
    /// The engine under test.
    pub engine: Engine,
    /// The scripted servers, by address; a connect to an address not here still succeeds, but
    /// nothing answers on it.
    pub servers: BTreeMap<ServerAddress, SimServer>,
    /// The open sockets, by the engine's connection id.
    pub sockets: BTreeMap<ConnId, SimSocket>,
    /// Sockets that were open and are closed now.
    pub retired: BTreeSet<ConnId>,
    /// Deliveries, by (when, sequence number): to which socket, what.
    inbox: BTreeMap<(Instant, u64), (ConnId, Delivery)>,
    sequence: u64,
    /// The virtual clock.
    pub now: Instant,
    /// Every event the engine emitted, with when.
    pub events: Vec<(Instant, EngineEvent)>,
    /// The buffer `poll_transmit` appends to, reused.
    transmit_buf: Vec<u8>,
    /// The servers' replies to one transmit, before they are scheduled; reused.
    answers: Vec<(Duration, Delivery)>,
    /// The buffer a reply is encoded into before it is copied out at its exact size; reused.
    reply_buf: Vec<u8>,
    /// The plain `{ok: 1}` reply, encoded with `responseTo` 0.
    ok_reply: Vec<u8>,
}

/// An overload error reply with both labels (BP-1, BP-2).
pub fn overload(code: i32) -> Document {
    doc! { "ok": 0, "code": code, "errmsg": "overloaded", "errorLabels": ["SystemOverloadedError", "RetryableError"] }
}

/// The handshake options of the simulated client.
pub fn handshake() -> HandshakeOptions {
    let metadata = ClientMetadata::new("retry-core-sim", "0.1.0");
    let mut options = HandshakeOptions::new();
    options.metadata = metadata;
    options
}

/// `host:27017`.
pub fn address(host: &str) -> ServerAddress {
    ServerAddress::new(host, 27017)
}

/// Read preference primary.
pub fn primary() -> SelectionCriteria {
    let primary =
        ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).expect("valid");
    SelectionCriteria::Read(primary)
}

impl Sim {
    /// An engine seeded with the servers' addresses (seed 7, then `configure`), started at zero
    /// and drained.
    pub fn new(
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
            retired: BTreeSet::new(),
            inbox: BTreeMap::new(),
            sequence: 0,
            now: Instant::ZERO,
            events: Vec::new(),
            transmit_buf: Vec::new(),
            answers: Vec::new(),
            reply_buf: Vec::new(),
            ok_reply: Vec::new(),
        };
        OpMsg::command(0, doc! { "ok": 1 })
            .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut sim.ok_reply)
            .expect("encodable reply");
        sim.drain();
        sim
    }

    fn deliver_at(&mut self, at: Instant, conn: ConnId, delivery: Delivery) {
        self.sequence += 1;
        self.inbox.insert((at, self.sequence), (conn, delivery));
    }

    /// Drains the engine's outputs into the simulated network (connects succeed at once).
    pub fn drain(&mut self) {
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
            let mut buf = core::mem::take(&mut self.transmit_buf);
            while let Some(conn) = self.engine.poll_transmit(&mut buf) {
                progressed = true;
                self.serve(conn, &buf);
                buf.clear();
            }
            self.transmit_buf = buf;
            while let Some(close) = self.engine.poll_close() {
                let conn = close.conn;
                progressed = true;
                if self.sockets.remove(&conn).is_some() {
                    self.retired.insert(conn);
                }
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

    /// The servers read what the engine wrote on `conn` and schedule their answers.
    fn serve(&mut self, conn: ConnId, mut bytes: &[u8]) {
        let now = self.now;
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        let mut answers = std::mem::take(&mut self.answers);
        while !bytes.is_empty() {
            let (used, message) = socket
                .decoder
                .decode_raw(bytes)
                .expect("the engine sends valid OP_MSG");
            bytes = &bytes[used..];
            let Some(request) = message else { continue };
            let server = self
                .servers
                .get_mut(&socket.address)
                .expect("a known server");
            let handshake = !socket.handshaken;
            socket.handshaken = true;
            let step = server.answer(&request.body, handshake, conn);
            let replied = matches!(step, None | Some(Step::Reply { .. }));
            let answer = match step {
                // The plain `{ok: 1}`, encoded once, with this request's `responseTo`.
                None => {
                    let mut bytes = self.ok_reply.clone();
                    bytes[8..12].copy_from_slice(&request.request_id.to_le_bytes());
                    (Duration::ZERO, Delivery::Bytes(bytes))
                }
                Some(Step::Reply { body, delay }) => {
                    let reply = OpMsg {
                        request_id: 0,
                        response_to: request.request_id,
                        flags: MsgFlags::NONE,
                        body,
                        sequences: Vec::new(),
                    };
                    self.reply_buf.clear();
                    reply
                        .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut self.reply_buf)
                        .expect("encodable reply");
                    (delay, Delivery::Bytes(self.reply_buf.as_slice().into()))
                }
                Some(Step::Reset) => (Duration::ZERO, Delivery::Reset),
                Some(Step::Garbage(garbage)) => (Duration::ZERO, Delivery::Bytes(garbage)),
            };
            // WP-6: a request with `moreToCome` (an unacknowledged write) gets no reply, as from
            // a real server; a reset or garbage still reaches the socket.
            if replied && request.flags.contains(MsgFlags::MORE_TO_COME) {
                continue;
            }
            answers.push(answer);
        }
        for (delay, delivery) in answers.drain(..) {
            let at = now.saturating_add(LATENCY).saturating_add(delay);
            self.deliver_at(at, conn, delivery);
        }
        self.answers = answers;
    }

    /// The peer (or the network) closes `conn` now: the engine hears `handle_closed` with `kind`.
    pub fn peer_close(&mut self, conn: ConnId, kind: NetworkErrorKind) {
        if self.sockets.remove(&conn).is_some() {
            self.retired.insert(conn);
            self.engine.handle_closed(conn, kind, None, self.now);
            self.drain();
        }
    }

    /// The next instant something happens: a delivery or an engine timer.
    fn next_instant(&self) -> Option<Instant> {
        let next_delivery = self.inbox.keys().next().map(|(t, _)| *t);
        [next_delivery, self.engine.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Delivers everything due by `now`, in order, then fires the engine's timers.
    fn fire(&mut self) {
        for _ in 0..MAX_STEPS {
            let Some(entry) = self.inbox.first_entry() else {
                break;
            };
            if entry.key().0 > self.now {
                break;
            }
            let (conn, delivery) = entry.remove();
            if !self.sockets.contains_key(&conn) {
                continue;
            }
            match delivery {
                Delivery::Bytes(bytes) => self.engine.handle_bytes(conn, &bytes, self.now),
                Delivery::Reset => {
                    self.sockets.remove(&conn);
                    self.retired.insert(conn);
                    self.engine
                        .handle_closed(conn, NetworkErrorKind::Reset, None, self.now);
                }
            }
            self.drain();
        }
        self.engine.handle_timeout(self.now);
        self.drain();
    }

    /// Advances virtual time to the next delivery or engine timer, if it is at most `limit`.
    /// Returns false when nothing is due by then.
    pub fn step(&mut self, limit: Instant) -> bool {
        let Some(next) = self.next_instant().filter(|t| *t <= limit) else {
            return false;
        };
        self.now = self.now.max(next);
        self.fire();
        true
    }

    /// Advances virtual time to `until` (never backwards), handling everything due on the way.
    /// Returns false if the step cap was reached first.
    pub fn advance_to(&mut self, until: Instant) -> bool {
        for _ in 0..MAX_STEPS {
            if !self.step(until) {
                self.now = self.now.max(until);
                self.fire();
                return true;
            }
        }
        false
    }

    /// Runs until `op` finishes (bounded in steps and 120 s of virtual time).
    pub fn run(&mut self, op: OpId) -> Result<Document, OperationError> {
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

    /// The result of `op`, if it finished, its reply converted to a document.
    pub fn result(&self, op: OpId) -> Option<Result<Document, OperationError>> {
        self.events.iter().find_map(|(_, e)| match e {
            EngineEvent::OperationFinished { op: o, result, .. } if *o == op => Some(
                result
                    .as_ref()
                    .map(|reply| to_document(reply).expect("a decoded reply converts"))
                    .map_err(Clone::clone),
            ),
            _ => None,
        })
    }

    /// The cursor `op` opened (its `CursorOpened` event), if it opened one.
    pub fn cursor_opened(&self, op: OpId) -> Option<CursorHandle> {
        self.events.iter().find_map(|(_, e)| match e {
            EngineEvent::CursorOpened { op: o, cursor } if *o == op => Some(*cursor),
            _ => None,
        })
    }

    /// Every pool's check-outs (`"out"`) and check-ins (`"in"`), in the order they were
    /// published: what tests of CM-/TX-/LB- connection release compare.
    pub fn checkouts_and_checkins(&self) -> Vec<&'static str> {
        self.pool_trace(&["out", "in"])
    }

    /// Starts `request` now and drains the engine.
    pub fn start_request(&mut self, request: OperationRequest) -> OpId {
        let op = self.engine.start_operation(request, self.now);
        self.drain();
        op
    }

    /// Starts `command` on `test` without a CSOT timeout.
    pub fn start(
        &mut self,
        command: Document,
        kind: OperationKind,
        criteria: SelectionCriteria,
    ) -> OpId {
        self.start_request(OperationRequest::new("test", command, kind, criteria))
    }

    /// Starts a read with read preference primary.
    pub fn read(&mut self, command: Document) -> OpId {
        self.start_request(crate::read_request(command))
    }

    /// The servers the attempts of `op` were sent to.
    pub fn attempt_servers(&self, op: OpId) -> Vec<String> {
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
