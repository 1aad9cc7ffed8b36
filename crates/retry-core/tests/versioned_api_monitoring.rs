//! Versioned-api spec ("Command Syntax": `apiVersion` on every command sent, `apiStrict` /
//! `apiDeprecationErrors` when the user set them) for the monitors' streaming commands (review11
//! finding 8): with `ServerMonitoringMode::Stream` and a server whose hello carries a
//! `topologyVersion` (MO-7, MO-8), the awaitable hello (MO-9) and the RTT connection's hello
//! (MO-12) each carry the declared fields exactly once. Checked on the transmitted OP_MSG bytes,
//! where a repeated key would show (a decoded `Document` keeps one). A scripted server answers at
//! once, time moves only to the engine's next timer, every loop is bounded (house rule 12).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Document, RawDocument};
use retry_core::address::ServerAddress;
use retry_core::engine::{ConnId, Engine, EngineOptions};
use retry_core::handshake::{ClientMetadata, HandshakeOptions, ServerApi};
use retry_core::monitor::ServerMonitoringMode;
use retry_core::time::Instant;
use retry_core::topology::TopologySettings;
use retry_core::wire::{FrameDecoder, DEFAULT_MAX_MESSAGE_SIZE_BYTES};

const STEPS: usize = 10_000;
const HEARTBEAT: Duration = Duration::from_secs(10);

/// One command as transmitted: its connection, its OP_MSG flags and body bytes.
struct Sent {
    conn: ConnId,
    exhaust_allowed: bool,
    body: Vec<u8>,
}

impl Sent {
    fn body(&self) -> &RawDocument {
        RawDocument::from_bytes(&self.body).expect("a BSON body")
    }

    /// The body's first key (the command name).
    fn name(&self) -> String {
        let (key, _) = self
            .body()
            .into_iter()
            .next()
            .expect("a field")
            .expect("valid");
        key.as_str().to_owned()
    }

    /// How many times the body holds the top-level `key`.
    fn count(&self, key: &str) -> usize {
        self.body()
            .into_iter()
            .filter(|element| element.as_ref().expect("valid").0 == key)
            .count()
    }
}

/// The OP_MSG `flagBits` and the kind-0 body section of one transmitted message (no document
/// sequences: a hello has none).
fn split_op_msg(frame: &[u8]) -> (u32, Vec<u8>) {
    const HEADER: usize = 16;
    let flags = u32::from_le_bytes(frame[HEADER..HEADER + 4].try_into().expect("4 bytes"));
    assert_eq!(frame[HEADER + 4], 0, "a kind-0 body section first");
    let body = &frame[HEADER + 5..];
    let len = i32::from_le_bytes(body[..4].try_into().expect("4 bytes")) as usize;
    (flags, body[..len].to_vec())
}

fn hello_reply(process_id: ObjectId) -> Document {
    doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true, "maxWireVersion": 25,
    "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30, "connectionId": 7,
    "topologyVersion": { "processId": process_id, "counter": 0_i64 } }
}

/// Runs a streaming engine against one standalone until `limit`: every hello is answered at
/// once except the awaitable ones (`exhaustAllowed`), which stay in flight. Returns every command
/// transmitted, in order.
fn run(options: EngineOptions, limit: Instant) -> Vec<Sent> {
    let mut engine = Engine::new(options, Instant::ZERO).expect("valid options");
    let process_id = ObjectId::parse_str("65a0000000000000000000aa").expect("valid");
    let mut sockets: BTreeMap<ConnId, FrameDecoder> = BTreeMap::new();
    let mut sent = Vec::new();
    let mut now = Instant::ZERO;
    let mut buf = Vec::new();
    for _ in 0..STEPS {
        let mut progressed = false;
        while let Some(connect) = engine.poll_connect() {
            progressed = true;
            sockets.insert(
                connect.conn,
                FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES),
            );
            engine.handle_connected(connect.conn, now);
        }
        let mut replies = Vec::new();
        while let Some(conn) = engine.poll_transmit(&mut buf) {
            progressed = true;
            let decoder = sockets.get_mut(&conn).expect("an open socket");
            let mut rest = &buf[..];
            while !rest.is_empty() {
                let (used, message) = decoder.decode(rest).expect("valid OP_MSG");
                let frame = &rest[..used];
                rest = &rest[used..];
                let Some(request) = message else { continue };
                let (flags, body) = split_op_msg(frame);
                let exhaust_allowed = flags & (1 << 16) != 0;
                sent.push(Sent {
                    conn,
                    exhaust_allowed,
                    body,
                });
                if !exhaust_allowed {
                    replies.push((
                        conn,
                        support::reply_bytes(request.request_id, hello_reply(process_id)),
                    ));
                }
            }
            buf.clear();
        }
        while let Some(close) = engine.poll_close() {
            progressed = true;
            sockets.remove(&close.conn);
        }
        while engine.poll_event().is_some() {
            progressed = true;
        }
        for (conn, bytes) in replies {
            if sockets.contains_key(&conn) {
                engine.handle_bytes(conn, &bytes, now);
            }
        }
        if progressed {
            continue;
        }
        match engine.poll_timeout().filter(|at| *at <= limit) {
            Some(at) => {
                now = at;
                engine.handle_timeout(now);
            }
            None => return sent,
        }
    }
    panic!("step cap reached");
}

/// Versioned-api spec, "Command Syntax"; MO-9 (awaitable hello), MO-12 (RTT connection).
#[test]
fn versioned_api_awaitable_and_rtt_hellos_carry_the_fields_once() {
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("versioned-api-monitoring", "0.1.0");
    handshake.server_api = Some(ServerApi {
        version: "1".into(),
        strict: Some(true),
        deprecation_errors: Some(false),
    });
    let settings = TopologySettings::new(vec![ServerAddress::new("s", 27017)]);
    let mut options = EngineOptions::new(settings, handshake);
    options.server_monitoring_mode = ServerMonitoringMode::Stream;
    options.heartbeat_frequency = HEARTBEAT;
    // Past the first RTT sample after the RTT connection's handshake (one heartbeat later), and
    // before the awaited reply's socket timeout (connectTimeoutMS + heartbeat, MO-4).
    let limit = Instant::ZERO.saturating_add(HEARTBEAT + HEARTBEAT / 2);
    let sent = run(options, limit);

    let handshakes = |s: &&Sent| s.body().get("client").ok().flatten().is_some();
    let awaitable: Vec<&Sent> = sent.iter().filter(|s| s.exhaust_allowed).collect();
    let monitor = awaitable.first().expect("MO-8: the monitor streams").conn;
    assert!(awaitable.iter().all(|s| s.conn == monitor));
    let rtt: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.conn != monitor && !s.exhaust_allowed && !handshakes(s))
        .collect();
    assert!(!rtt.is_empty(), "MO-12: an RTT hello after its handshake");
    for hello in awaitable.iter().chain(&rtt) {
        assert_eq!(
            hello.name(),
            "hello",
            "HS-2: `hello` under a declared version"
        );
        for key in ["apiVersion", "apiStrict", "apiDeprecationErrors"] {
            let decoded = Document::try_from(hello.body()).ok();
            assert_eq!(hello.count(key), 1, "{key} once in {decoded:?}");
        }
        let body = hello.body();
        assert_eq!(body.get_str("apiVersion").ok(), Some("1"));
        assert_eq!(body.get_bool("apiStrict").ok(), Some(true));
        assert_eq!(body.get_bool("apiDeprecationErrors").ok(), Some(false));
    }
    // MO-9: the awaitable one is the streaming hello, not a polling one.
    let first = awaitable[0].body();
    assert!(first.get_document("topologyVersion").is_ok(), "{first:?}");
    assert!(
        first.get("maxAwaitTimeMS").ok().flatten().is_some(),
        "{first:?}"
    );
    // The handshakes (HS-2) carry them once too, the RTT connection's included.
    let rtt_conn = rtt[0].conn;
    assert!(sent
        .iter()
        .any(|s| s.conn == rtt_conn && handshakes(&s) && s.count("apiVersion") == 1));
}
