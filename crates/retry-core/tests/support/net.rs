//! The one harness that drives an engine in the engine tests (review23 R6: it was written out in
//! each test file): an in-memory network of scripted servers. Replies arrive at once, time moves
//! only to the engine's next timer (never back: `poll_timeout` naming the past fails the test),
//! every loop is bounded (house rule 12).

use std::collections::BTreeMap;

use bson::{doc, oid::ObjectId, Document};
use retry_core::address::ServerAddress;
use retry_core::engine::{ConnId, Engine, EngineEvent, EngineOptions, OpId, OperationRequest};
use retry_core::error::OperationError;
use retry_core::time::Instant;
use retry_core::wire::{FrameDecoder, DEFAULT_MAX_MESSAGE_SIZE_BYTES};

/// The bound of every loop (house rule 12).
pub const STEPS: usize = 10_000;

/// What a scripted server answers: `None` keeps the command unanswered (in flight).
pub type Script = Box<dyn FnMut(&ServerAddress, &Document) -> Option<Document>>;

/// An engine and the scripted servers it talks to.
pub struct Net {
    pub engine: Engine,
    pub now: Instant,
    /// Open sockets: the server and the decoder of what the engine writes.
    pub sockets: BTreeMap<ConnId, (ServerAddress, FrameDecoder)>,
    /// Every event published, in order.
    pub events: Vec<EngineEvent>,
    pub script: Script,
    /// Every command sent, with its connection, in order.
    pub sent: Vec<(ConnId, Document)>,
    /// The commands the script left unanswered, on sockets still open: connection, request id.
    pub unanswered: Vec<(ConnId, i32)>,
    /// Every transmit, as written: when, on which connection, the bytes.
    pub transmits: Vec<(Instant, ConnId, Vec<u8>)>,
    /// Every close the engine asked for, in order.
    pub closes: Vec<retry_core::engine::Close>,
}

impl Net {
    /// An engine with `options` at time zero, after its first checks.
    pub fn new(options: EngineOptions, script: Script) -> Net {
        let engine = Engine::new(options, Instant::ZERO).expect("valid options");
        let mut net = Net {
            engine,
            now: Instant::ZERO,
            sockets: BTreeMap::new(),
            events: Vec::new(),
            script,
            sent: Vec::new(),
            unanswered: Vec::new(),
            transmits: Vec::new(),
            closes: Vec::new(),
        };
        net.drain();
        // The first checks are due at once.
        net.run_until(Instant::ZERO);
        net
    }

    /// Drains every output; each command is answered at once (or never).
    pub fn drain(&mut self) {
        let mut buf = Vec::new();
        for _ in 0..STEPS {
            let mut progressed = false;
            while let Some(connect) = self.engine.poll_connect() {
                progressed = true;
                let decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
                self.sockets
                    .insert(connect.conn, (connect.address, decoder));
                self.engine.handle_connected(connect.conn, self.now);
            }
            let mut replies = Vec::new();
            while let Some(conn) = self.engine.poll_transmit(&mut buf) {
                progressed = true;
                self.transmits.push((self.now, conn, buf.clone()));
                // Review24 R4 (house rule 8): bytes for a socket the engine never connected, or
                // closed, are output for a socket that is gone: the test fails.
                let Some((address, decoder)) = self.sockets.get_mut(&conn) else {
                    panic!(
                        "the engine wrote {} bytes to socket {conn:?}, which it never connected \
                         or already closed",
                        buf.len()
                    );
                };
                let mut rest = &buf[..];
                while !rest.is_empty() {
                    let (used, message) = decoder.decode(rest).expect("valid OP_MSG");
                    rest = &rest[used..];
                    let Some(request) = message else { continue };
                    self.sent.push((conn, request.body.clone()));
                    match (self.script)(address, &request.body) {
                        Some(body) => {
                            replies.push((conn, super::reply_bytes(request.request_id, body)))
                        }
                        None => self.unanswered.push((conn, request.request_id)),
                    }
                }
                buf.clear();
            }
            while let Some(close) = self.engine.poll_close() {
                let conn = close.conn;
                self.closes.push(close);
                progressed = true;
                self.sockets.remove(&conn);
                self.unanswered.retain(|(c, _)| *c != conn);
            }
            while let Some(event) = self.engine.poll_event() {
                progressed = true;
                self.events.push(event);
            }
            for (conn, bytes) in replies {
                if self.sockets.contains_key(&conn) {
                    self.engine.handle_bytes(conn, &bytes, self.now);
                }
            }
            if !progressed {
                return;
            }
        }
        panic!("the engine kept producing output");
    }

    /// Moves time to the engine's next timer, if it is before `limit`, and fires it.
    pub fn step(&mut self, limit: Instant) -> bool {
        let Some(next) = self.engine.poll_timeout().filter(|t| *t <= limit) else {
            return false;
        };
        assert!(next >= self.now, "poll_timeout named the past");
        self.now = next;
        self.engine.handle_timeout(self.now);
        self.drain();
        true
    }

    /// Runs until `limit` in virtual time (bounded in steps).
    pub fn run_until(&mut self, limit: Instant) {
        for _ in 0..STEPS {
            if !self.step(limit) {
                return;
            }
        }
        panic!("step cap reached");
    }

    /// Starts `request` now and drains what it sets off.
    pub fn start(&mut self, request: OperationRequest) -> OpId {
        let op = self.engine.start_operation(request, self.now);
        self.drain();
        op
    }

    /// Delivers `body` as the reply to `request_id` on `conn` now, and drains.
    pub fn reply_to(&mut self, conn: ConnId, request_id: i32, body: Document) {
        let bytes = super::reply_bytes(request_id, body);
        self.engine.handle_bytes(conn, &bytes, self.now);
        self.drain();
    }

    /// The results `op` finished with (exactly one once it ended: house rule 8).
    pub fn finished(&self, op: OpId) -> Vec<&Result<bson::RawDocumentBuf, OperationError>> {
        self.events
            .iter()
            .filter_map(|e| match e {
                EngineEvent::OperationFinished { op: o, result, .. } if *o == op => Some(result),
                _ => None,
            })
            .collect()
    }

    /// The position of the first event matching `f`.
    pub fn position(&self, f: impl Fn(&EngineEvent) -> bool) -> usize {
        self.events
            .iter()
            .position(f)
            .expect("the event was emitted")
    }
}

/// `host` at the default port.
pub fn address(host: &str) -> ServerAddress {
    ServerAddress::new(host, 27017)
}

/// Whether `body` is a hello (or legacy hello).
pub fn is_hello(body: &Document) -> bool {
    body.keys()
        .next()
        .is_some_and(|k| k == "hello" || k.eq_ignore_ascii_case("ismaster"))
}

/// A hello of the replica set `rs`: `a` is the primary, any other member a secondary; each
/// lists `hosts`.
pub fn member_hello(address: &ServerAddress, hosts: &[&str]) -> Document {
    let hosts: Vec<String> = hosts.iter().map(|h| format!("{h}:27017")).collect();
    let primary = address.host() == "a";
    let mut reply = doc! { "ok": 1, "helloOk": true, "isWritablePrimary": primary,
    "secondary": !primary, "setName": "rs", "hosts": hosts, "maxWireVersion": 25,
    "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30,
    "me": format!("{}:27017", address.host()) };
    if primary {
        reply.insert("setVersion", 1);
        reply.insert(
            "electionId",
            ObjectId::parse_str("7fffffff0000000000000001").expect("valid"),
        );
    }
    reply
}
