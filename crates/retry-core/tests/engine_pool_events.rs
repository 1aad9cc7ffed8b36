//! Review22 R5 (house rules 8 and 10; issue 9): `Engine::set_events` switches the pools'
//! CMAP events (EV-3) on and off: the topology's pools, pools of servers discovered later and
//! the pool of a server that leaves after the switch (a pool already retired at the switch is
//! tested in-crate, review23 R5). Pool events are published exactly while the POOL
//! family is on. A replica set `rs` of the primary `a` and the secondary `b` whose hellos list
//! the hosts the test sets; commands other than hellos stay unanswered until the test answers
//! them, so a connection stays checked out as long as it likes. Virtual time, bounded loops.

mod support;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bson::doc;
use retry_core::engine::{EngineEvent, EngineOptions, EventFamilies, OpId, OperationRequest};
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::pool::PoolEvent;
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::topology::TopologySettings;
use support::net::{address, is_hello, member_hello, Net};

/// An engine and the replica set it talks to, on the shared harness ([`Net`], review23 R6).
struct Set {
    net: Net,
    /// The hosts every member's hello lists.
    hosts: Rc<RefCell<Vec<&'static str>>>,
}

impl Set {
    /// An engine publishing `families`, seeded with `a`, after its first checks. Hellos are
    /// answered at once, other commands stay in flight ([`Net::unanswered`]).
    fn new(families: EventFamilies) -> Set {
        let mut settings = TopologySettings::new(vec![address("a")]);
        settings.replica_set = Some("rs".into());
        let mut handshake = HandshakeOptions::new();
        handshake.metadata = ClientMetadata::new("engine-pool-events", "0.1.0");
        let options = EngineOptions::new(settings, handshake).with_events(families);
        let hosts = Rc::new(RefCell::new(vec!["a"]));
        let listed = hosts.clone();
        let script = Box::new(move |address: &_, body: &_| {
            is_hello(body).then(|| member_hello(address, &listed.borrow()))
        });
        Set {
            net: Net::new(options, script),
            hosts,
        }
    }

    /// From now on every member's hello lists `hosts`.
    fn list(&mut self, hosts: &[&'static str]) {
        *self.hosts.borrow_mut() = hosts.to_vec();
    }

    /// Runs the engine's timers for `millis` of virtual time.
    fn run_for(&mut self, millis: u64) {
        let limit = self.net.now.saturating_add(Duration::from_millis(millis));
        self.net.run_until(limit);
        self.net.now = limit;
    }

    /// Starts a `find` read with `mode`; it stays in flight until answered.
    fn read(&mut self, mode: ReadPreferenceMode) -> OpId {
        let preference = ReadPreference::new(mode, Vec::new(), None).expect("valid");
        self.net.start(OperationRequest::new(
            "test",
            doc! { "find": "c" },
            OperationKind::Read,
            SelectionCriteria::Read(preference),
        ))
    }

    /// Answers every command in flight on `host` with an empty cursor.
    fn answer(&mut self, host: &str) {
        let sockets = &self.net.sockets;
        let (on_host, rest) = std::mem::take(&mut self.net.unanswered)
            .into_iter()
            .partition::<Vec<_>, _>(|(conn, _)| sockets[conn].0.host() == host);
        self.net.unanswered = rest;
        assert!(!on_host.is_empty(), "a command in flight on {host}");
        for (conn, request_id) in on_host {
            let reply =
                doc! { "ok": 1, "cursor": { "id": 0i64, "ns": "test.c", "firstBatch": [] } };
            self.net.reply_to(conn, request_id, reply);
        }
    }

    /// A read with `mode`, answered by `host`: it checks a connection out and back in.
    fn round_trip(&mut self, mode: ReadPreferenceMode, host: &str) {
        let op = self.read(mode);
        self.answer(host);
        assert_eq!(self.finished(op), 1, "{op:?} finished once");
    }

    /// How many times `op` finished.
    fn finished(&self, op: OpId) -> usize {
        self.net.finished(op).len()
    }

    /// The pool events published from `from` on (an index into [`Net::events`]), with their
    /// servers' hosts.
    fn pool_events(&self, from: usize) -> Vec<(String, &PoolEvent)> {
        self.net.events[from..]
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Pool { address, event } => Some((address.host().to_owned(), event)),
                _ => None,
            })
            .collect()
    }
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
    set.net
        .engine
        .set_events(EventFamilies::SDAM | EventFamilies::RETRY);
    let from = set.net.events.len();
    set.round_trip(ReadPreferenceMode::Primary, "a");
    assert!(
        set.pool_events(from).is_empty(),
        "{:?}",
        set.pool_events(from)
    );

    // On: `a`'s pool, created while off, publishes its checkouts.
    set.net.engine.set_events(EventFamilies::POOL);
    let from = set.net.events.len();
    set.round_trip(ReadPreferenceMode::Primary, "a");
    assert!(
        checkout_on("a", &set.pool_events(from)),
        "{:?}",
        set.pool_events(from)
    );

    // `b` joins while on (the primary's next check lists it): its pool publishes from its
    // creation on.
    set.list(&["a", "b"]);
    let from = set.net.events.len();
    set.run_for(30_000);
    let joined = set.pool_events(from);
    assert!(
        joined
            .iter()
            .any(|(h, e)| h == "b" && matches!(e, PoolEvent::PoolCreated)),
        "{joined:?}"
    );
    let from = set.net.events.len();
    set.round_trip(ReadPreferenceMode::Secondary, "b");
    assert!(
        checkout_on("b", &set.pool_events(from)),
        "{:?}",
        set.pool_events(from)
    );

    // Off with a connection of `b` checked out: its check-in publishes nothing.
    let op = set.read(ReadPreferenceMode::Secondary);
    set.net.engine.set_events(EventFamilies::NONE);
    let from = set.net.events.len();
    set.answer("b");
    assert_eq!(set.finished(op), 1);
    set.round_trip(ReadPreferenceMode::Primary, "a");
    assert!(
        set.pool_events(from).is_empty(),
        "{:?}",
        set.pool_events(from)
    );

    // On again: both pools publish.
    set.net.engine.set_events(EventFamilies::ALL);
    let from = set.net.events.len();
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
/// that connection's close; switched off, nothing. The switch comes before `b` leaves, so this
/// covers the switch of a topology member's pool and the flag the pool keeps into retirement;
/// the retired pool's last connection is failed and checked in within the call that removes
/// `b`, so no later switch finds it alive. Review23 R5: the switch of a pool already retired is
/// `engine::tests::a_retired_pool_switched_on_publishes_its_close` (in-crate).
#[test]
fn review22_r5_ev3_a_pool_switched_before_it_retires_publishes_its_close_exactly_when_on() {
    for on in [true, false] {
        let (before, after) = if on {
            (EventFamilies::NONE, EventFamilies::POOL)
        } else {
            (EventFamilies::POOL, EventFamilies::NONE)
        };
        let mut set = Set::new(before);
        set.list(&["a", "b"]);
        set.run_for(30_000);
        let op = set.read(ReadPreferenceMode::Secondary);
        assert_eq!(set.finished(op), 0, "in flight on b");
        set.net.engine.set_events(after);
        let from = set.net.events.len();
        set.list(&["a"]);
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
