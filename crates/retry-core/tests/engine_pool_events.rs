//! Review22 R5 (house rules 8 and 10; issue 9): `Engine::set_events` switches the pools'
//! CMAP events (EV-3) on and off: the topology's pools, pools of servers discovered later and
//! the retired pool of a server that left. Pool events are published exactly while the POOL
//! family is on. A replica set `rs` of the primary `a` and the secondary `b` whose hellos list
//! the hosts the test sets; commands other than hellos stay unanswered until the test answers
//! them, so a connection stays checked out as long as it likes. Virtual time, bounded loops.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Document};
use retry_core::address::ServerAddress;
use retry_core::engine::{
    ConnId, Engine, EngineEvent, EngineOptions, EventFamilies, OpId, OperationRequest,
};
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::pool::PoolEvent;
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::Instant;
use retry_core::topology::TopologySettings;
use retry_core::wire::{FrameDecoder, DEFAULT_MAX_MESSAGE_SIZE_BYTES};

/// The bound of every loop (house rule 12).
const STEPS: usize = 10_000;

/// An engine and the replica set it talks to.
struct Set {
    engine: Engine,
    now: Instant,
    /// Open sockets: the server and the decoder of what the engine writes.
    sockets: BTreeMap<ConnId, (ServerAddress, FrameDecoder)>,
    /// The hosts every member's hello lists.
    hosts: Vec<&'static str>,
    /// Commands other than hellos, not answered yet: connection, request id, server.
    unanswered: Vec<(ConnId, i32, ServerAddress)>,
    /// Every event published, in order.
    events: Vec<EngineEvent>,
}

impl Set {
    /// An engine publishing `families`, seeded with `a`, after its first checks.
    fn new(families: EventFamilies) -> Set {
        let mut settings = TopologySettings::new(vec![address("a")]);
        settings.replica_set = Some("rs".into());
        let mut handshake = HandshakeOptions::new();
        handshake.metadata = ClientMetadata::new("engine-pool-events", "0.1.0");
        let options = EngineOptions::new(settings, handshake).with_events(families);
        let mut set = Set {
            engine: Engine::new(options, Instant::ZERO).expect("valid options"),
            now: Instant::ZERO,
            sockets: BTreeMap::new(),
            hosts: vec!["a"],
            unanswered: Vec::new(),
            events: Vec::new(),
        };
        set.run_for(0);
        set
    }

    /// Takes every output of the engine; hellos are answered at once, other commands kept.
    fn drain(&mut self) {
        let mut buf = Vec::new();
        for _ in 0..STEPS {
            let mut replies = Vec::new();
            let mut progressed = false;
            while let Some(connect) = self.engine.poll_connect() {
                progressed = true;
                let decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
                self.sockets
                    .insert(connect.conn, (connect.address, decoder));
                self.engine.handle_connected(connect.conn, self.now);
            }
            while let Some(conn) = self.engine.poll_transmit(&mut buf) {
                progressed = true;
                let (address, decoder) = self.sockets.get_mut(&conn).expect("an open socket");
                let mut rest = &buf[..];
                while !rest.is_empty() {
                    let (used, message) = decoder.decode(rest).expect("a valid OP_MSG");
                    rest = &rest[used..];
                    let Some(request) = message else { continue };
                    let hello = request
                        .body
                        .keys()
                        .next()
                        .is_some_and(|k| k == "hello" || k.eq_ignore_ascii_case("ismaster"));
                    if hello {
                        let reply = hello_of(address, &self.hosts);
                        replies.push((conn, request.request_id, reply));
                    } else {
                        self.unanswered
                            .push((conn, request.request_id, address.clone()));
                    }
                }
                buf.clear();
            }
            while let Some(conn) = self.engine.poll_close() {
                progressed = true;
                self.sockets.remove(&conn);
                self.unanswered.retain(|(c, _, _)| *c != conn);
            }
            while let Some(event) = self.engine.poll_event() {
                progressed = true;
                self.events.push(event);
            }
            for (conn, request_id, body) in replies {
                self.reply(conn, request_id, body);
            }
            if !progressed {
                return;
            }
        }
        panic!("the engine kept producing output");
    }

    /// Hands `body` to the engine as the reply to `request_id` on `conn`.
    fn reply(&mut self, conn: ConnId, request_id: i32, body: Document) {
        if !self.sockets.contains_key(&conn) {
            return;
        }
        let bytes = support::reply_bytes(request_id, body);
        self.engine.handle_bytes(conn, &bytes, self.now);
    }

    /// Runs the engine's timers for `millis` of virtual time.
    fn run_for(&mut self, millis: u64) {
        let limit = self.now.saturating_add(Duration::from_millis(millis));
        self.drain();
        for _ in 0..STEPS {
            let Some(next) = self.engine.poll_timeout().filter(|t| *t <= limit) else {
                self.now = limit.max(self.now);
                return;
            };
            self.now = next.max(self.now);
            self.engine.handle_timeout(self.now);
            self.drain();
        }
        panic!("step cap reached");
    }

    /// Starts a `find` read with `mode`; it stays in flight until answered.
    fn read(&mut self, mode: ReadPreferenceMode) -> OpId {
        let preference = ReadPreference::new(mode, Vec::new(), None).expect("valid");
        let request = OperationRequest::new(
            "test",
            doc! { "find": "c" },
            OperationKind::Read,
            SelectionCriteria::Read(preference),
        );
        let op = self.engine.start_operation(request, self.now);
        self.drain();
        op
    }

    /// Answers every command in flight on `host` with an empty cursor.
    fn answer(&mut self, host: &str) {
        let (on_host, rest) = std::mem::take(&mut self.unanswered)
            .into_iter()
            .partition::<Vec<_>, _>(|(_, _, address)| address.host() == host);
        self.unanswered = rest;
        assert!(!on_host.is_empty(), "a command in flight on {host}");
        for (conn, request_id, _) in on_host {
            let reply =
                doc! { "ok": 1, "cursor": { "id": 0i64, "ns": "test.c", "firstBatch": [] } };
            self.reply(conn, request_id, reply);
        }
        self.drain();
    }

    /// A read with `mode`, answered by `host`: it checks a connection out and back in.
    fn round_trip(&mut self, mode: ReadPreferenceMode, host: &str) {
        let op = self.read(mode);
        self.answer(host);
        assert_eq!(self.finished(op), 1, "{op:?} finished once");
    }

    /// How many times `op` finished.
    fn finished(&self, op: OpId) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, EngineEvent::OperationFinished { op: o, .. } if *o == op))
            .count()
    }

    /// The pool events published from `from` on (an index into [`Set::events`]), with their
    /// servers' hosts.
    fn pool_events(&self, from: usize) -> Vec<(String, &PoolEvent)> {
        self.events[from..]
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Pool { address, event } => Some((address.host().to_owned(), event)),
                _ => None,
            })
            .collect()
    }
}

fn address(host: &str) -> ServerAddress {
    ServerAddress::new(host, 27017)
}

/// `a` is the primary, any other member a secondary; each lists `hosts`.
fn hello_of(address: &ServerAddress, hosts: &[&str]) -> Document {
    let primary = address.host() == "a";
    let hosts: Vec<String> = hosts.iter().map(|h| format!("{h}:27017")).collect();
    let mut reply = doc! { "ok": 1, "helloOk": true, "isWritablePrimary": primary,
    "secondary": !primary, "setName": "rs", "hosts": hosts, "maxWireVersion": 25,
    "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30,
    "me": format!("{}:27017", address.host()) };
    if primary {
        reply.insert("setVersion", 1);
        let election = ObjectId::parse_str("7fffffff0000000000000001").expect("valid");
        reply.insert("electionId", election);
    }
    reply
}

/// The CMAP events of one checkout and check-in, in order, on `host`.
fn checkout_on(host: &str, events: &[(String, &PoolEvent)]) -> bool {
    let on_host: Vec<&PoolEvent> = events
        .iter()
        .filter(|(h, _)| h == host)
        .map(|(_, e)| *e)
        .filter(|e| {
            matches!(
                e,
                PoolEvent::CheckOutStarted { .. }
                    | PoolEvent::CheckedOut { .. }
                    | PoolEvent::CheckedIn { .. }
            )
        })
        .collect();
    matches!(
        on_host[..],
        [
            PoolEvent::CheckOutStarted { .. },
            PoolEvent::CheckedOut { .. },
            PoolEvent::CheckedIn { .. }
        ]
    )
}

/// Review22 R5, EV-3 (issue 9): an engine started with no event family publishes no pool
/// event; switched to POOL, the pool created before the switch (`a`) and the one created after
/// it (`b`, discovered later) publish theirs, `PoolCreated` of the later one included; a
/// family other than POOL publishes none; switched off with a connection checked out, its
/// check-in publishes nothing, and switched on again the events come back.
#[test]
fn review22_r5_ev3_pool_events_are_published_exactly_while_pool_is_on() {
    let mut set = Set::new(EventFamilies::NONE);
    set.round_trip(ReadPreferenceMode::Primary, "a");
    assert!(set.pool_events(0).is_empty(), "{:?}", set.pool_events(0));

    // Other families: still no pool event.
    set.engine
        .set_events(EventFamilies::SDAM | EventFamilies::RETRY);
    let from = set.events.len();
    set.round_trip(ReadPreferenceMode::Primary, "a");
    assert!(
        set.pool_events(from).is_empty(),
        "{:?}",
        set.pool_events(from)
    );

    // On: `a`'s pool, created while off, publishes its checkouts.
    set.engine.set_events(EventFamilies::POOL);
    let from = set.events.len();
    set.round_trip(ReadPreferenceMode::Primary, "a");
    assert!(
        checkout_on("a", &set.pool_events(from)),
        "{:?}",
        set.pool_events(from)
    );

    // `b` joins while on (the primary's next check lists it): its pool publishes from its
    // creation on.
    set.hosts = vec!["a", "b"];
    let from = set.events.len();
    set.run_for(30_000);
    let joined = set.pool_events(from);
    assert!(
        joined
            .iter()
            .any(|(h, e)| h == "b" && matches!(e, PoolEvent::PoolCreated)),
        "{joined:?}"
    );
    let from = set.events.len();
    set.round_trip(ReadPreferenceMode::Secondary, "b");
    assert!(
        checkout_on("b", &set.pool_events(from)),
        "{:?}",
        set.pool_events(from)
    );

    // Off with a connection of `b` checked out: its check-in publishes nothing.
    let op = set.read(ReadPreferenceMode::Secondary);
    set.engine.set_events(EventFamilies::NONE);
    let from = set.events.len();
    set.answer("b");
    assert_eq!(set.finished(op), 1);
    set.round_trip(ReadPreferenceMode::Primary, "a");
    assert!(
        set.pool_events(from).is_empty(),
        "{:?}",
        set.pool_events(from)
    );

    // On again: both pools publish.
    set.engine.set_events(EventFamilies::ALL);
    let from = set.events.len();
    set.round_trip(ReadPreferenceMode::Primary, "a");
    set.round_trip(ReadPreferenceMode::Secondary, "b");
    let events = set.pool_events(from);
    assert!(
        checkout_on("a", &events) && checkout_on("b", &events),
        "{events:?}"
    );
}

/// Review22 R5, EV-3: the pool of a server that leaves the topology (SDAM `remove`: the
/// primary's hosts no longer list `b`) while one of its connections is checked out retires
/// with the switch it had: switched on (after it was created, while its connection was in
/// use), the retired pool publishes its close, the check-in of the failed read's connection and
/// that connection's close; switched off, nothing. (Here the retired pool's last connection is
/// failed and checked in within the call that removes `b`, so no later switch finds it
/// holding one.)
#[test]
fn review22_r5_ev3_a_retired_pool_publishes_its_close_exactly_when_on() {
    for on in [true, false] {
        let (before, after) = if on {
            (EventFamilies::NONE, EventFamilies::POOL)
        } else {
            (EventFamilies::POOL, EventFamilies::NONE)
        };
        let mut set = Set::new(before);
        set.hosts = vec!["a", "b"];
        set.run_for(30_000);
        let op = set.read(ReadPreferenceMode::Secondary);
        assert_eq!(set.finished(op), 0, "in flight on b");
        set.engine.set_events(after);
        let from = set.events.len();
        set.hosts = vec!["a"];
        // The primary's next check, then the retry's server selection timeout (no secondary).
        set.run_for(60_000);
        assert_eq!(set.finished(op), 1, "the read on b ended once");
        let events = set.pool_events(from);
        if !on {
            assert!(events.is_empty(), "{events:?}");
            continue;
        }
        let of_b: Vec<&PoolEvent> = events
            .iter()
            .filter(|(h, _)| h == "b")
            .map(|(_, e)| *e)
            .collect();
        assert!(
            matches!(
                of_b[..],
                [
                    PoolEvent::PoolClosed,
                    PoolEvent::CheckedIn { connection: checked_in },
                    PoolEvent::ConnectionClosed { connection: closed, .. },
                ] if checked_in == closed
            ),
            "{events:?}"
        );
    }
}
