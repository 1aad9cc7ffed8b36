//! A proptest of the whole engine on random input sequences, in the simulated driver of
//! `retry-sim` (issue 9 item 2, house rule 8). Topologies: a standalone; a sharded cluster of one
//! to three mongos that go down and come back; a load balancer (down and back too); a replica set
//! of four members, one to three of them in the initial config, with members added and removed by
//! the config the primary reports (`hosts`, each change with the next `setVersion`), primaries
//! stepping down to another member with a new or the same `electionId` and `setVersion`, members
//! going down and coming back, and secondaries refusing commands with NotWritablePrimary.
//! Random server scripts (replies, overload and retryable errors, resets in the middle of a command
//! and during handshakes, bytes that are not OP_MSG, slow replies, handshakes slower than the
//! connect timeout), random operations of every kind with random CSOT timeouts, random
//! `heartbeatFrequencyMS`, random early socket closes, time that advances by random amounts or not
//! at all, spurious `handle_timeout` calls, and events for connections the engine never gave out
//! or already closed.
//!
//! Invariants: nothing panics; every started operation gets exactly one `OperationFinished`, within
//! a bounded virtual time (every loop is capped in steps), and by its CSOT deadline if it has one
//! (CS-2); every `CommandStarted` gets exactly one succeeded or failed partner before the next
//! attempt starts and before the operation finishes (BP-26); `poll_timeout` never names a past
//! instant, and names the present one only for a few more `handle_timeout` calls; pool accounting
//! is consistent (no check-out of a closed or already checked-out connection, no check-in of one
//! not out, no pool over `maxPoolSize` open or checked out, nothing left checked out once every
//! operation finished); the same case run twice gives the same trace.
//!
//! Load-balanced cases (review38 L10 item 7) may share one session among their transaction
//! commands, so a transaction runs several commands on its pinned connection, with finds that open
//! cursors and getMores that follow them; every cursor is closed and the session ended at the end.
//!
//! Hedged reads (issue 12 item 1): half the cases hedge `find` (a service config with a random
//! `maxAttempts` and `hedgingDelay`, 462 non-fatal) and turn command monitoring on. Then also: no
//! hedged read starts more than `maxAttempts` copies (A6-H1); every copy that was sent ends
//! exactly once (succeeded, failed or cancelled) and at most one succeeds, which is the result
//! (A6-H3); in a sharded cluster a copy goes to a server an earlier copy used only if no other
//! mongos was known throughout (A6-H7); every command-started event has exactly one end (EV-1);
//! and once the cancelled copies' connections have drained, nothing is left checked out.
//!
//! Cases: 1,000 by default (about 15 s in a debug build on the shared 2-core machine, 1-2 s in release); `PROPTEST_CASES=N` for a
//! long run. One run of 100,000 cases (152 s, release): `docs/benchmarks.md`, "Engine property test".

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bson::{doc, Document};
use proptest::prelude::*;
use retry_core::address::ServerAddress;
use retry_core::engine::{
    CommandEvent, ConnId, CursorHandle, CursorUse, EngineEvent, OpId, OperationRequest,
    SessionHandle,
};
use retry_core::error::NetworkErrorKind;
use retry_core::hedging::{CopyStage, HedgingEvent};
use retry_core::pool::{ConnectionId, PoolEvent};
use retry_core::retry::{OperationKind, RetryEvent};
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::service_config::ServiceConfig;
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::{SdamEvent, ServerType};

use retry_sim::{address, overload, Role, Sim, SimServer, Step};

/// How long, in virtual time after the last input, every operation has to finish. The slowest
/// legitimate operation: three attempts, each with up to 5 s of selection, 10 s to connect, 5 s of
/// slow reply and up to 10 s of backoff, behind others in a one-connection wait queue.
const SETTLE: Duration = Duration::from_secs(15 * 60);

#[derive(Clone, Copy, Debug)]
enum Topology {
    Standalone,
    /// A sharded cluster: this many mongos (of `SERVERS`) seeded; they go down and come back.
    Mongos(usize),
    LoadBalanced,
    /// A replica set: `SERVERS` members exist, this many of them are in the initial config
    /// (`hosts`) and seeded, the first one primary. Members are added and removed by the
    /// primary's `hosts`, primaries step down, `setVersion` and `electionId` change.
    ReplicaSet(usize),
}

/// How many simulated servers a case has (members of a replica set, mongos, ...).
const SERVERS: usize = 4;

/// One scripted answer to a command.
#[derive(Clone, Debug)]
enum ScriptStep {
    Ok,
    /// An overload error (code 462 with both labels).
    Overload,
    /// A server error with a retryable code, with or without the `RetryableWriteError` label.
    Retryable(i32, bool),
    /// The connection is reset instead of a reply.
    Reset,
    /// A frame whose header is invalid: `messageLength` below the header's 16 bytes.
    Garbage(Vec<u8>),
    /// `{ok: 1}` after this many extra milliseconds.
    Slow(u64),
}

impl ScriptStep {
    fn step(&self) -> Step {
        match self {
            ScriptStep::Ok => Step::reply(doc! { "ok": 1 }),
            ScriptStep::Overload => Step::reply(overload(462)),
            ScriptStep::Retryable(code, label) => {
                let labels: Vec<&str> = if *label {
                    vec!["RetryableWriteError"]
                } else {
                    Vec::new()
                };
                Step::reply(
                    doc! { "ok": 0, "code": *code, "errmsg": "scripted", "errorLabels": labels },
                )
            }
            ScriptStep::Reset => Step::Reset,
            ScriptStep::Garbage(bytes) => Step::Garbage(bytes.clone()),
            ScriptStep::Slow(ms) => Step::Reply {
                body: doc! { "ok": 1 },
                delay: Duration::from_millis(*ms),
            },
        }
    }
}

#[derive(Clone, Debug)]
struct ServerScript {
    steps: Vec<ScriptStep>,
    reset_handshakes: u32,
    /// When set, every handshake reply comes this many milliseconds after `connectTimeoutMS`, so
    /// that every connection to this server fails with a connect timeout. Handshakes that are slow
    /// but in time are not drawn: a checkout can then adopt a connection that was pending across a
    /// pool clear, and never completes when that connection turns out stale (reported on issue 5;
    /// draw any delay once fixed).
    late_handshake_ms: Option<u64>,
}

#[derive(Clone, Debug)]
enum Input {
    /// Start an operation of kind `kind` (an index into `KINDS`); `timeout_ms`: `None` is CSOT off,
    /// `Some(0)` CSOT without a limit, else a deadline this far away.
    Start {
        kind: usize,
        timeout_ms: Option<u64>,
        /// Reads (find, getMore, runCommand) with read preference nearest instead of primary,
        /// so they also go to secondaries and mongos alike.
        nearest: bool,
    },
    /// Advance virtual time by this many milliseconds (0: the same instant again).
    Advance(u64),
    /// `handle_timeout` at the current instant, whether or not anything is due.
    SpuriousTimeout,
    /// One of the open sockets (an index into them, in id order) closes with this error.
    Close(usize, NetworkErrorKind),
    /// Bytes for a connection that is closed or was never given out.
    UnknownBytes(u64, Vec<u8>),
    /// `handle_closed` for a connection that is closed or was never given out.
    UnknownClosed(u64),
    /// A server (an index into them) goes down (`true`: resets every connection at its first
    /// command, hello included) or comes back: a mongos, a load balancer or a member.
    Down(usize, bool),
    /// Replica sets: the primary steps down and the current member at index `to` of `hosts`
    /// becomes primary, with a new `electionId` and `setVersion` or the same ones.
    StepDown {
        to: usize,
        new_election: bool,
        new_set_version: bool,
    },
    /// Replica sets: the set's config adds (`true`) or removes a member (never the primary, never
    /// the last one), with the next `setVersion`.
    Reconfig(usize, bool),
}

#[derive(Clone, Debug)]
struct Case {
    topology: Topology,
    scripts: Vec<ServerScript>,
    max_pool_size: u32,
    seed: u64,
    selection_timeout_ms: u64,
    connect_timeout_ms: u64,
    socket_timeout_ms: Option<u64>,
    inputs: Vec<Input>,
    /// `heartbeatFrequencyMS`: how soon the monitors see a server go down or the set change.
    heartbeat_ms: u64,
    /// Hedge `find`: `(maxAttempts, hedgingDelay in ms)`.
    hedging: Option<(u32, u64)>,
    /// Load-balanced only (review38 L10 item 7; TX-3..TX-5, LB-10..LB-13): the transaction
    /// commands share one session, so a transaction has several commands on its pinned
    /// connection; finds open cursors (the `Ok` steps answer with cursor 42) and getMores
    /// follow the last one opened. After the inputs every cursor is closed and the session
    /// ended, so that nothing stays checked out.
    lb_session: bool,
}

const KINDS: [OperationKind; 10] = [
    OperationKind::Read,
    OperationKind::RetryableWrite,
    OperationKind::NonRetryableWrite,
    OperationKind::GetMore,
    OperationKind::RunCommand,
    OperationKind::CommitTransaction { again: false },
    OperationKind::CommitTransaction { again: true },
    OperationKind::AbortTransaction,
    OperationKind::InTransaction {
        read: true,
        first: true,
    },
    OperationKind::InTransaction {
        read: false,
        first: false,
    },
];

fn request(kind: OperationKind, timeout: OperationTimeout) -> OperationRequest {
    let (command, criteria) = match kind {
        OperationKind::Read => (doc! { "find": "c" }, retry_sim::primary()),
        OperationKind::GetMore => (
            doc! { "getMore": 1_i64, "collection": "c" },
            retry_sim::primary(),
        ),
        OperationKind::RunCommand => (doc! { "ping": 1 }, retry_sim::primary()),
        OperationKind::RetryableWrite => (
            doc! { "insert": "c", "documents": [{ "x": 1 }] },
            SelectionCriteria::Write,
        ),
        OperationKind::NonRetryableWrite => (
            doc! { "delete": "c", "deletes": [{ "q": {}, "limit": 0 }] },
            SelectionCriteria::Write,
        ),
        OperationKind::CommitTransaction { .. } => {
            (doc! { "commitTransaction": 1 }, SelectionCriteria::Write)
        }
        OperationKind::AbortTransaction => {
            (doc! { "abortTransaction": 1 }, SelectionCriteria::Write)
        }
        OperationKind::InTransaction { read: true, .. } => {
            (doc! { "find": "c" }, retry_sim::primary())
        }
        OperationKind::InTransaction { read: false, .. } => (
            doc! { "insert": "c", "documents": [{ "x": 2 }] },
            SelectionCriteria::Write,
        ),
    };
    let mut request = OperationRequest::new("test", command, kind, criteria);
    request.timeout = timeout;
    request
}

fn script_step() -> impl Strategy<Value = ScriptStep> {
    // Retryable codes (RR-2) and SDAM state-change codes; 462 is covered by Overload.
    let codes = prop::sample::select(vec![6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 13436]);
    let garbage =
        (0..16_i32, prop::collection::vec(any::<u8>(), 12..40)).prop_map(|(len, rest)| {
            let mut bytes = len.to_le_bytes().to_vec();
            bytes.extend(rest);
            bytes
        });
    prop_oneof![
        3 => Just(ScriptStep::Ok),
        2 => Just(ScriptStep::Overload),
        1 => (codes, any::<bool>()).prop_map(|(c, l)| ScriptStep::Retryable(c, l)),
        1 => Just(ScriptStep::Reset),
        1 => garbage.prop_map(ScriptStep::Garbage),
        1 => (1..5_000_u64).prop_map(ScriptStep::Slow),
    ]
}

/// How an early close is reported. `NetworkErrorKind::Timeout` is not drawn: an idle pooled
/// connection closed with it stays available in its pool, and the next operation that checks it
/// out never finishes (reported on issue 5 with its reproduction; add it here once fixed).
fn close_kind() -> impl Strategy<Value = NetworkErrorKind> {
    prop::sample::select(vec![
        NetworkErrorKind::Closed,
        NetworkErrorKind::Reset,
        NetworkErrorKind::Io,
        NetworkErrorKind::Timeout,
    ])
}

fn input() -> impl Strategy<Value = Input> {
    let timeout = prop_oneof![Just(None), Just(Some(0)), (1..20_000_u64).prop_map(Some),];
    prop_oneof![
        4 => (0..KINDS.len(), timeout, any::<bool>()).prop_map(|(kind, timeout_ms, nearest)| Input::Start { kind, timeout_ms, nearest }),
        4 => prop_oneof![Just(0_u64), 0..50_u64, 0..15_000_u64].prop_map(Input::Advance),
        1 => Just(Input::SpuriousTimeout),
        1 => (any::<usize>(), close_kind()).prop_map(|(pick, kind)| Input::Close(pick, kind)),
        1 => (any::<u64>(), prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(c, b)| Input::UnknownBytes(c, b)),
        1 => any::<u64>().prop_map(Input::UnknownClosed),
        1 => (0..SERVERS, any::<bool>()).prop_map(|(pick, down)| Input::Down(pick, down)),
        1 => (0..SERVERS, any::<bool>(), any::<bool>()).prop_map(|(to, new_election, new_set_version)| {
            Input::StepDown { to, new_election, new_set_version }
        }),
        1 => (0..SERVERS, any::<bool>()).prop_map(|(pick, add)| Input::Reconfig(pick, add)),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let topology = prop_oneof![
        1 => Just(Topology::Standalone),
        1 => (1..=3_usize).prop_map(Topology::Mongos),
        1 => Just(Topology::LoadBalanced),
        2 => (1..=3_usize).prop_map(Topology::ReplicaSet),
    ];
    let late_handshake = prop_oneof![3 => Just(None), 1 => (0..2_000_u64).prop_map(Some)];
    let script = (
        prop::collection::vec(script_step(), 0..8),
        0..3_u32,
        late_handshake,
    )
        .prop_map(
            |(steps, reset_handshakes, late_handshake_ms)| ServerScript {
                steps,
                reset_handshakes,
                late_handshake_ms,
            },
        );
    (
        topology,
        prop::collection::vec(script, SERVERS),
        1..=3_u32,
        any::<u64>(),
        0..5_000_u64,
        100..10_000_u64,
        prop::option::of(100..10_000_u64),
        prop::collection::vec(input(), 1..40),
        prop::sample::select(vec![500_u64, 2_000, 10_000]),
        prop::option::of((
            2..=5_u32,
            prop_oneof![Just(0_u64), 1..50_u64, 50..3_000_u64],
        )),
        any::<bool>(),
    )
        .prop_map(
            |(
                topology,
                scripts,
                max_pool_size,
                seed,
                selection_timeout_ms,
                connect_timeout_ms,
                socket_timeout_ms,
                inputs,
                heartbeat_ms,
                hedging,
                lb_session,
            )| Case {
                topology,
                scripts,
                max_pool_size,
                seed,
                selection_timeout_ms,
                connect_timeout_ms,
                socket_timeout_ms,
                inputs,
                heartbeat_ms,
                hedging,
                lb_session,
            },
        )
}

/// A connection that is not open: one the simulation saw closed (even `pick`), else one the
/// engine never gave out.
fn unknown_conn(sim: &Sim, pick: u64) -> ConnId {
    let retired: Vec<ConnId> = sim.retired.iter().copied().collect();
    if pick.is_multiple_of(2) && !retired.is_empty() {
        retired[(pick / 2) as usize % retired.len()]
    } else {
        ConnId(u64::MAX - pick / 2)
    }
}

/// `poll_timeout` never names a past instant.
fn check_timeout(sim: &Sim) -> Result<(), TestCaseError> {
    let timeout = sim.engine.poll_timeout();
    prop_assert!(
        timeout.is_none_or(|t| t >= sim.now),
        "poll_timeout {timeout:?} is before now, {}",
        sim.now
    );
    Ok(())
}

/// How many `handle_timeout` calls at one instant may be needed before nothing is due: a timer
/// handled at an instant can make another machine's timer due at that same instant (a failed
/// monitor check schedules the next one for now), which the next call handles.
const CALLS_PER_INSTANT: usize = 4;

/// Right after `handle_timeout(now)`: calling it again at the same instant, as the driving rule
/// says while `poll_timeout` names now, soon leaves nothing due (no busy loop).
fn settle_instant(sim: &mut Sim) -> Result<(), TestCaseError> {
    for _ in 0..CALLS_PER_INSTANT {
        if sim.engine.poll_timeout().is_none_or(|t| t > sim.now) {
            return Ok(());
        }
        sim.engine.handle_timeout(sim.now);
        sim.drain();
    }
    let timeout = sim.engine.poll_timeout();
    prop_assert!(
        timeout.is_none_or(|t| t > sim.now),
        "poll_timeout {timeout:?} still names {} after {CALLS_PER_INSTANT} more handle_timeout calls",
        sim.now
    );
    Ok(())
}

/// The replica set's current config: the primary's (else the newest member's) `hosts`,
/// `setVersion` and the highest `electionId` counter any member has had.
fn set_config(sim: &Sim) -> (Vec<String>, i32, u32) {
    let members = sim.servers.values().map(|s| &s.member);
    let newest = members
        .clone()
        .max_by_key(|m| (m.primary, m.set_version))
        .expect("a replica set has members");
    let election = members.map(|m| m.election).max().unwrap_or(1);
    (newest.hosts.clone(), newest.set_version, election)
}

/// Every member takes the config `hosts` at `set_version` (what a reconfig propagates).
fn apply_config(sim: &mut Sim, hosts: &[String], set_version: i32) {
    for server in sim.servers.values_mut() {
        server.member.hosts = hosts.to_vec();
        server.member.set_version = set_version;
    }
}

/// The primary steps down; member `to` of the config becomes primary.
fn step_down(sim: &mut Sim, to: usize, new_election: bool, new_set_version: bool) {
    let (hosts, set_version, election) = set_config(sim);
    let set_version = set_version + i32::from(new_set_version);
    apply_config(sim, &hosts, set_version);
    let next = &hosts[to % hosts.len()];
    for (address, server) in sim.servers.iter_mut() {
        server.member.primary = address.to_string() == *next;
        if server.member.primary {
            server.member.election = election + u32::from(new_election);
        }
    }
}

/// The config adds or removes member `pick` (never the primary nor the last member).
fn reconfig(sim: &mut Sim, pick: usize, add: bool) {
    let (mut hosts, set_version, _) = set_config(sim);
    let Some((address, server)) = sim.servers.iter().nth(pick) else {
        return;
    };
    let member = address.to_string();
    let present = hosts.contains(&member);
    if add && !present {
        hosts.push(member);
    } else if !add && present && !server.member.primary && hosts.len() > 1 {
        hosts.retain(|h| *h != member);
    } else {
        return;
    }
    apply_config(sim, &hosts, set_version + 1);
}

/// An operation the case started, with its CSOT deadline if it has one.
struct Started {
    op: OpId,
    at: Instant,
    deadline: Option<Instant>,
}

/// Runs one case and returns the simulation and the operations it started.
fn run(case: &Case) -> Result<(Sim, Vec<Started>), TestCaseError> {
    let (role, hosts, seeded): (Role, Vec<String>, usize) = match case.topology {
        Topology::Standalone => (Role::Standalone, vec!["db".into()], 1),
        Topology::Mongos(n) => (Role::Mongos, (1..=n).map(|i| format!("m{i}")).collect(), n),
        Topology::LoadBalanced => (
            Role::LoadBalancer { service_id: true },
            vec!["lb".into()],
            1,
        ),
        Topology::ReplicaSet(n) => (
            Role::Member,
            (0..SERVERS).map(|i| format!("r{i}")).collect(),
            n,
        ),
    };
    let shared = case.lb_session && matches!(case.topology, Topology::LoadBalanced);
    let config: Vec<String> = hosts[..seeded]
        .iter()
        .map(|h| address(h).to_string())
        .collect();
    let servers: Vec<(ServerAddress, SimServer)> = hosts
        .iter()
        .zip(&case.scripts)
        .enumerate()
        .map(|(i, (host, script))| {
            let mut server = SimServer::new(role);
            server.member.hosts = config.clone();
            server.member.primary = i == 0;
            server.script = script
                .steps
                .iter()
                .map(|step| match step {
                    // Review38 L10 item 7: finds open cursors.
                    ScriptStep::Ok if shared => Step::reply(cursor_reply()),
                    step => step.step(),
                })
                .collect();
            server.reset_handshakes = script.reset_handshakes;
            if let Some(late) = script.late_handshake_ms {
                server.handshake_delay = Duration::from_millis(late * 3);
            }
            (address(host), server)
        })
        .collect();
    let seeds: Vec<ServerAddress> = servers[..seeded].iter().map(|(a, _)| a.clone()).collect();
    let mut sim = Sim::new(servers, |o| {
        o.topology.seeds = seeds;
        o.heartbeat_frequency = Duration::from_millis(case.heartbeat_ms);
        o.seed = case.seed;
        o.topology.load_balanced = matches!(case.topology, Topology::LoadBalanced);
        o.topology.pool.max_pool_size = case.max_pool_size;
        if shared {
            // Review38 L10 item 7: the shared session used concurrently (SE-10) can leave a
            // checkout waiting for the connection its own transaction or cursor holds until the
            // session ends, which waits for that checkout (CMAP lets it wait without a limit);
            // it gives up after 1 s, as in `lb_pins_properties.rs`.
            o.topology.pool.wait_queue_timeout = Some(Duration::from_secs(1));
        }
        o.selection.server_selection_timeout = Duration::from_millis(case.selection_timeout_ms);
        o.connect_timeout = Duration::from_millis(case.connect_timeout_ms);
        o.socket_timeout = case.socket_timeout_ms.map(Duration::from_millis);
        if let Some((max_attempts, delay_ms)) = case.hedging {
            o.service_config = Some(hedging_config(max_attempts, delay_ms));
            o.command_monitoring = true;
        }
    });
    let mut ops = Vec::new();
    // The explicit session of each transaction command, ended as soon as the command has
    // (TX-4 (6)): a load-balanced transaction keeps its connection until then.
    let mut sessions: Vec<(OpId, SessionHandle)> = Vec::new();
    // Review38 L10 item 7: the one session of every transaction command, when shared.
    let shared = shared.then(|| sim.engine.start_session());
    for input in &case.inputs {
        match input {
            Input::Start {
                kind,
                timeout_ms,
                nearest,
            } => {
                let timeout = match timeout_ms {
                    None => OperationTimeout::Off,
                    Some(ms) => {
                        OperationTimeout::from_timeout_ms(sim.now, Duration::from_millis(*ms))
                    }
                };
                let mut request = request(KINDS[*kind], timeout);
                if *nearest && matches!(request.criteria, SelectionCriteria::Read(_)) {
                    let nearest =
                        ReadPreference::new(ReadPreferenceMode::Nearest, Vec::new(), None)
                            .expect("valid");
                    request.criteria = SelectionCriteria::Read(nearest);
                }
                // TX-1: a transaction's commands run in an explicit session.
                let transaction = matches!(
                    request.kind,
                    OperationKind::InTransaction { .. }
                        | OperationKind::CommitTransaction { .. }
                        | OperationKind::AbortTransaction
                );
                if let Some(shared) = shared {
                    // Review38 L10 item 7: one session; a first statement starts its transaction
                    // (refused while one is in progress: the statement then joins it).
                    if let OperationKind::InTransaction { first: true, .. } = request.kind {
                        let _ = sim
                            .engine
                            .start_transaction(shared, Default::default(), sim.now);
                        sim.drain();
                    }
                    request.session = transaction.then_some(shared);
                    request.cursor = match request.kind {
                        OperationKind::Read | OperationKind::InTransaction { read: true, .. } => {
                            CursorUse::Open
                        }
                        OperationKind::GetMore => {
                            last_cursor(&sim).map_or(CursorUse::None, CursorUse::GetMore)
                        }
                        _ => CursorUse::None,
                    };
                } else if transaction {
                    request.session = Some(sim.engine.start_session());
                }
                let session = request.session.filter(|_| shared.is_none());
                let op = sim.start_request(request);
                sessions.extend(session.map(|s| (op, s)));
                ops.push(Started {
                    op,
                    at: sim.now,
                    deadline: timeout.deadline(),
                });
            }
            Input::Advance(ms) => {
                let until = sim.now.saturating_add(Duration::from_millis(*ms));
                prop_assert!(sim.advance_to(until), "step cap reached before {until}");
            }
            Input::SpuriousTimeout => {
                sim.engine.handle_timeout(sim.now);
                sim.drain();
            }
            Input::Close(pick, kind) => {
                let open: Vec<ConnId> = sim.sockets.keys().copied().collect();
                if !open.is_empty() {
                    sim.peer_close(open[pick % open.len()], *kind);
                }
            }
            Input::UnknownBytes(pick, bytes) => {
                let conn = unknown_conn(&sim, *pick);
                sim.engine.handle_bytes(conn, bytes, sim.now);
                sim.drain();
            }
            Input::UnknownClosed(pick) => {
                let conn = unknown_conn(&sim, *pick);
                sim.engine
                    .handle_closed(conn, NetworkErrorKind::Closed, None, sim.now);
                sim.drain();
            }
            Input::Down(pick, down) => {
                if let Some(server) = sim.servers.values_mut().nth(*pick) {
                    server.down = *down;
                }
            }
            Input::StepDown {
                to,
                new_election,
                new_set_version,
            } => {
                if matches!(case.topology, Topology::ReplicaSet(_)) {
                    step_down(&mut sim, *to, *new_election, *new_set_version);
                }
            }
            Input::Reconfig(pick, add) => {
                if matches!(case.topology, Topology::ReplicaSet(_)) {
                    reconfig(&mut sim, *pick, *add);
                }
            }
        }
        end_finished_sessions(&mut sim, &mut sessions);
        check_timeout(&sim)?;
        if matches!(input, Input::Advance(_) | Input::SpuriousTimeout) {
            settle_instant(&mut sim)?;
        }
    }
    settle(&mut sim, &ops, &mut sessions)?;
    // Review38 L10 item 7: every cursor is closed (a killCursors of one already ended is a usage
    // error, which ends at once) and the shared session ended; they settle in turn.
    if let Some(shared) = shared {
        let opened: Vec<CursorHandle> = sim
            .events
            .iter()
            .filter_map(|(_, e)| match e {
                EngineEvent::CursorOpened { cursor, .. } => Some(*cursor),
                _ => None,
            })
            .collect();
        for cursor in opened {
            let mut close = request(OperationKind::RunCommand, OperationTimeout::Off);
            close.command = doc! { "killCursors": "c", "cursors": [42_i64] };
            let op = sim.start_request(close.with_cursor(CursorUse::Close(cursor)));
            ops.push(Started {
                op,
                at: sim.now,
                deadline: None,
            });
        }
        sim.engine.end_session(shared, sim.now);
        sim.drain();
        settle(&mut sim, &ops, &mut sessions)?;
    }
    // A cancelled copy's connection drains until its reply (at most 5 s slow) or its timeout.
    if case.hedging.is_some() {
        let until = sim.now.saturating_add(Duration::from_secs(6));
        prop_assert!(sim.advance_to(until), "step cap reached while draining");
    }
    Ok((sim, ops))
}

/// Every operation must end within SETTLE, step by step (the monitors' timers never stop).
fn settle(
    sim: &mut Sim,
    ops: &[Started],
    sessions: &mut Vec<(OpId, SessionHandle)>,
) -> Result<(), TestCaseError> {
    let limit = sim.now.saturating_add(SETTLE);
    for _ in 0..retry_sim::MAX_STEPS {
        let finished = finished_ops(sim);
        if ops.iter().all(|s| finished.contains_key(&s.op)) {
            break;
        }
        if !sim.step(limit) {
            break;
        }
        end_finished_sessions(sim, sessions);
        check_timeout(sim)?;
    }
    Ok(())
}

/// A reply that serves every command and opens (or keeps) cursor 42 for a cursor command.
fn cursor_reply() -> Document {
    doc! {
        "ok": 1, "n": 1,
        "cursor": { "id": 42_i64, "ns": "test.c", "firstBatch": [], "nextBatch": [] },
    }
}

/// The cursor opened last, if any (a getMore of one already ended is a usage error).
fn last_cursor(sim: &Sim) -> Option<CursorHandle> {
    sim.events.iter().rev().find_map(|(_, e)| match e {
        EngineEvent::CursorOpened { cursor, .. } => Some(*cursor),
        _ => None,
    })
}

/// `find` hedged with these parameters, 462 non-fatal.
fn hedging_config(max_attempts: u32, delay_ms: u64) -> ServiceConfig {
    ServiceConfig::from_document(&doc! { "methodConfig": [{
    "name": [{ "service": "mongodb", "method": "find" }],
    "hedgingPolicy": { "maxAttempts": max_attempts as i32,
                       "hedgingDelay": format!("{}.{:03}s", delay_ms / 1000, delay_ms % 1000),
                       "nonFatalStatusCodes": [462] } }] })
    .expect("a valid config")
}

/// A hedged read's copy, from its events.
#[derive(Default, Debug)]
struct CopyTrace {
    address: Option<ServerAddress>,
    started: Option<Instant>,
    ends: usize,
    succeeded: bool,
}

/// The hedging invariants (see the module docs): A6-H1, A6-H3, A6-H7 and EV-1.
fn check_hedging(
    sim: &Sim,
    ops: &[Started],
    max_attempts: u32,
    sharded: bool,
) -> Result<(), TestCaseError> {
    let mut copies: BTreeMap<OpId, BTreeMap<u32, CopyTrace>> = BTreeMap::new();
    // The mongos known at each description change, in order.
    let mut known: Vec<(Instant, BTreeSet<ServerAddress>)> = Vec::new();
    let mut commands = BTreeSet::new();
    // When a checkout started on which server: a selected copy's checkout starts at once.
    let mut checkouts: Vec<(Instant, ServerAddress)> = Vec::new();
    for (at, event) in &sim.events {
        match event {
            EngineEvent::Topology(SdamEvent::TopologyDescriptionChanged { new, .. }) => {
                let mongos = new
                    .servers
                    .iter()
                    .filter(|s| s.server_type == ServerType::Mongos)
                    .map(|s| s.address.clone())
                    .collect();
                known.push((*at, mongos));
            }
            EngineEvent::Command(command) => match &**command {
                CommandEvent::Started { info, .. } => {
                    prop_assert!(commands.insert((info.connection, info.request_id)));
                }
                CommandEvent::Succeeded { info, .. } | CommandEvent::Failed { info, .. } => {
                    prop_assert!(
                        commands.remove(&(info.connection, info.request_id)),
                        "EV-1: an end at {} without its start: {:?}",
                        at,
                        info
                    );
                }
                _ => {}
            },
            EngineEvent::Pool {
                address,
                event: PoolEvent::CheckOutStarted { .. },
            } => checkouts.push((*at, address.clone())),
            EngineEvent::Hedging { op, event } => {
                let (copy, address, end) = match event {
                    HedgingEvent::CopyStarted { copy, address } => {
                        let trace = copies.entry(*op).or_default().entry(copy.0).or_default();
                        prop_assert!(trace.started.is_none(), "{copy} of {op:?} started twice");
                        trace.started = Some(*at);
                        (copy, Some(address), false)
                    }
                    HedgingEvent::CopySucceeded { copy, address, .. } => {
                        let trace = copies.entry(*op).or_default().entry(copy.0).or_default();
                        trace.succeeded = true;
                        (copy, Some(address), true)
                    }
                    HedgingEvent::CopyFailed { copy, address, .. } => (copy, Some(address), true),
                    HedgingEvent::CopyCancelled { copy, stage } => match stage {
                        CopyStage::Selecting => (copy, None, true),
                        CopyStage::CheckedOut(a) | CopyStage::InFlight(a) => (copy, Some(a), true),
                    },
                    _ => continue,
                };
                let trace = copies.entry(*op).or_default().entry(copy.0).or_default();
                if let Some(address) = address {
                    prop_assert!(trace.address.as_ref().is_none_or(|a| a == address));
                    trace.address = Some(address.clone());
                }
                if end {
                    trace.ends += 1;
                }
            }
            _ => {}
        }
    }
    prop_assert!(
        commands.is_empty(),
        "EV-1: commands without an end: {:?}",
        commands
    );
    for (op, traces) in &copies {
        let most = traces.keys().max().copied().unwrap_or(0);
        prop_assert!(
            most <= max_attempts,
            "A6-H1: {op:?} started copy {most} of {max_attempts}"
        );
        let wins = traces.values().filter(|t| t.succeeded).count();
        let ok = sim.result(*op).is_some_and(|r| r.is_ok());
        prop_assert_eq!(wins, usize::from(ok), "A6-H3: {:?} {:?}", op, traces);
        for (copy, trace) in traces {
            prop_assert!(
                trace.ends <= 1,
                "copy {copy} of {op:?} ended twice: {trace:?}"
            );
            if trace.started.is_some() {
                prop_assert_eq!(trace.ends, 1, "copy {} of {:?} never ended", copy, op);
            }
        }
        if !sharded {
            continue;
        }
        // A6-H7: a server used again while another mongos, unused by earlier copies, was known
        // throughout the time this copy's selection may have ended: from the first checkout
        // started on its server since the operation began to the copy's start.
        let Some(start) = ops.iter().find(|s| s.op == *op).map(|s| s.at) else {
            continue;
        };
        for (copy, trace) in traces {
            let (Some(address), Some(sent)) = (&trace.address, trace.started) else {
                continue;
            };
            let earlier: BTreeSet<&ServerAddress> = traces
                .range(..copy)
                .filter_map(|(_, t)| t.address.as_ref())
                .collect();
            if !earlier.contains(address) {
                continue;
            }
            let Some(selected) = checkouts
                .iter()
                .find(|(at, a)| *at >= start && *at <= sent && a == address)
                .map(|(at, _)| *at)
            else {
                continue;
            };
            let before = known
                .iter()
                .rev()
                .find(|(at, _)| *at < selected)
                .map(|(_, k)| k);
            let mut stable: BTreeSet<ServerAddress> = before.cloned().unwrap_or_default();
            for (_, k) in known
                .iter()
                .filter(|(at, _)| *at >= selected && *at <= sent)
            {
                stable.retain(|a| k.contains(a));
            }
            let free: Vec<_> = stable.iter().filter(|a| !earlier.contains(a)).collect();
            prop_assert!(
                free.is_empty(),
                "A6-H7: copy {} of {:?} went to {} again while {:?} was free",
                copy,
                op,
                address,
                free
            );
        }
    }
    Ok(())
}

/// Ends the sessions whose operation has finished.
fn end_finished_sessions(sim: &mut Sim, sessions: &mut Vec<(OpId, SessionHandle)>) {
    let finished = finished_ops(sim);
    let now = sim.now;
    sessions.retain(|(op, session)| {
        let done = finished.contains_key(op);
        if done {
            sim.engine.end_session(*session, now);
        }
        !done
    });
    sim.drain();
}

fn finish_time(sim: &Sim, op: OpId) -> Option<Instant> {
    sim.events.iter().find_map(|(at, e)| {
        matches!(e, EngineEvent::OperationFinished { op: o, .. } if *o == op).then_some(*at)
    })
}

fn finished_ops(sim: &Sim) -> BTreeMap<OpId, usize> {
    let mut finished = BTreeMap::new();
    for (_, event) in &sim.events {
        if let EngineEvent::OperationFinished { op, .. } = event {
            *finished.entry(*op).or_insert(0) += 1;
        }
    }
    finished
}

/// BP-26: per operation, `CommandStarted` then exactly one succeeded or failed event of the same
/// attempt, before the next attempt and before the operation finishes.
fn check_command_events(sim: &Sim) -> Result<(), TestCaseError> {
    let mut in_flight: BTreeMap<OpId, (u32, ServerAddress)> = BTreeMap::new();
    for (at, event) in &sim.events {
        match event {
            EngineEvent::Operation {
                op,
                event: RetryEvent::CommandStarted { attempt, address },
            } => {
                let earlier = in_flight.insert(*op, (*attempt, address.clone()));
                prop_assert!(
                    earlier.is_none(),
                    "{op:?} started attempt {attempt} at {at} while {earlier:?} was in flight"
                );
            }
            EngineEvent::Operation {
                op,
                event:
                    RetryEvent::CommandSucceeded {
                        attempt, address, ..
                    }
                    | RetryEvent::CommandFailed {
                        attempt, address, ..
                    },
            } => {
                let started = in_flight.remove(op);
                prop_assert_eq!(
                    started,
                    Some((*attempt, address.clone())),
                    "{:?}: a command outcome at {} without its CommandStarted",
                    op,
                    at
                );
            }
            EngineEvent::OperationFinished { op, .. } => {
                prop_assert!(
                    !in_flight.contains_key(op),
                    "{op:?} finished at {at} with a command in flight"
                );
            }
            _ => {}
        }
    }
    Ok(())
}

/// Pool accounting (CMAP): a connection is created once, checked out only while open and not
/// already out, checked in only while out; no pool has more than `maxPoolSize` connections open,
/// or checked out, at any time; and once every operation has finished, no connection is left
/// checked out (`settled`: nothing leaks a check-out).
fn check_pools(sim: &Sim, max_pool_size: u32, settled: bool) -> Result<(), TestCaseError> {
    #[derive(Default)]
    struct Counts {
        open: BTreeSet<ConnectionId>,
        in_use: BTreeSet<ConnectionId>,
    }
    let max = max_pool_size as usize;
    let mut pools: BTreeMap<ServerAddress, Counts> = BTreeMap::new();
    for (at, event) in &sim.events {
        let EngineEvent::Pool { address, event } = event else {
            continue;
        };
        let pool = pools.entry(address.clone()).or_default();
        match event {
            PoolEvent::PoolCreated => *pool = Counts::default(),
            PoolEvent::ConnectionCreated { connection } => {
                prop_assert!(pool.open.insert(*connection));
            }
            PoolEvent::ConnectionClosed { connection, .. } => {
                prop_assert!(pool.open.remove(connection));
                pool.in_use.remove(connection);
            }
            PoolEvent::CheckedOut { connection, .. } => {
                prop_assert!(
                    pool.open.contains(connection),
                    "{address}: {connection:?} checked out at {at} but not open"
                );
                prop_assert!(
                    pool.in_use.insert(*connection),
                    "{address}: {connection:?} checked out twice at {at}"
                );
            }
            PoolEvent::CheckedIn { connection } => {
                prop_assert!(
                    pool.in_use.remove(connection),
                    "{address}: {connection:?} checked in at {at} but not checked out"
                );
            }
            _ => {}
        }
        prop_assert!(
            pool.open.len() <= max && pool.in_use.len() <= max,
            "{address} at {at}: {} open, {} in use, maxPoolSize {max}",
            pool.open.len(),
            pool.in_use.len()
        );
    }
    if settled {
        for (address, pool) in &pools {
            prop_assert!(
                pool.in_use.is_empty(),
                "{address}: {:?} still checked out after every operation finished",
                pool.in_use
            );
        }
    }
    Ok(())
}

/// The number of cases: `PROPTEST_CASES` if set, else 1,000.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

proptest! {
    // 1,000 cases by default (about N s in CI); `PROPTEST_CASES` sets another count for a long run.
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn the_engine_ends_every_operation_once_and_keeps_its_invariants(case in case()) {
        let (sim, ops) = run(&case)?;
        let finished = finished_ops(&sim);
        for Started { op, deadline, .. } in &ops {
            prop_assert_eq!(
                finished.get(op).copied(),
                Some(1),
                "{:?} must finish exactly once by {} (SETTLE after the last input)",
                op,
                sim.now
            );
            // CS-2. Only without late handshakes: the engine does not yet cap the establishment
            // of a connection by the CSOT deadline of the operation waiting for it (CS-3), so such
            // an operation ends up to connectTimeoutMS late (reported on issue 5; drop this
            // condition once fixed).
            {
                let at = finish_time(&sim, *op);
                prop_assert!(
                    deadline.is_none_or(|d| at.is_some_and(|at| at <= d)),
                    "{op:?} finished at {at:?}, after its CSOT deadline {deadline:?} (CS-2)"
                );
            }
        }
        prop_assert_eq!(finished.len(), ops.len(), "only started operations finish");
        check_command_events(&sim)?;
        check_pools(&sim, case.max_pool_size, true)?;
        if let Some((max_attempts, _)) = case.hedging {
            let sharded = matches!(case.topology, Topology::Mongos(_));
            check_hedging(&sim, &ops, max_attempts, sharded)?;
        }

        let (again, _) = run(&case)?;
        prop_assert!(sim.events == again.events, "the same case gave another trace");
    }
}

/// The invariant checks above can fail: a trace with an outcome but no start, and a pool over its
/// size, are caught.
#[test]
fn the_checks_catch_broken_traces() {
    let mut sim = Sim::new(
        vec![(address("db"), SimServer::new(Role::Standalone))],
        |_| {},
    );
    let db = address("db");
    sim.events.push((
        Instant::ZERO,
        EngineEvent::Operation {
            op: OpId(1),
            event: RetryEvent::CommandSucceeded {
                attempt: 1,
                address: db.clone(),
                duration: Duration::ZERO,
            },
        },
    ));
    assert!(check_command_events(&sim).is_err());

    let mut sim = Sim::new(
        vec![(address("db"), SimServer::new(Role::Standalone))],
        |_| {},
    );
    for connection in [ConnectionId(1), ConnectionId(2)] {
        sim.events.push((
            Instant::ZERO,
            EngineEvent::Pool {
                address: db.clone(),
                event: PoolEvent::ConnectionCreated { connection },
            },
        ));
    }
    assert!(check_pools(&sim, 2, true).is_ok());
    assert!(check_pools(&sim, 1, true).is_err());
    sim.events.push((
        Instant::ZERO,
        EngineEvent::Pool {
            address: db.clone(),
            event: PoolEvent::CheckedOut {
                checkout: retry_core::pool::CheckoutId(1),
                connection: ConnectionId(1),
                duration: Duration::ZERO,
            },
        },
    ));
    assert!(check_pools(&sim, 2, false).is_ok());
    assert!(check_pools(&sim, 2, true).is_err(), "a leaked check-out");
}

/// Review38 L10 item 7, TX-5, LB-10: the shared-session load-balanced shape does what it is
/// for. A transaction's find opens a cursor on the pinned connection, a getMore follows it, a
/// later insert and the commit run on the same connection, and at the end the cursor is closed
/// and the session ended: every operation ends once, and one connection was checked out and in
/// once.
#[test]
fn an_lb_transaction_with_a_cursor_runs_on_one_connection() {
    let start = |kind| Input::Start {
        kind,
        timeout_ms: None,
        nearest: false,
    };
    let case = Case {
        topology: Topology::LoadBalanced,
        scripts: vec![
            ServerScript {
                steps: vec![ScriptStep::Ok; 6],
                reset_handshakes: 0,
                late_handshake_ms: None,
            };
            SERVERS
        ],
        max_pool_size: 2,
        seed: 1,
        selection_timeout_ms: 1_000,
        connect_timeout_ms: 1_000,
        socket_timeout_ms: None,
        heartbeat_ms: 10_000,
        hedging: None,
        lb_session: true,
        // The transaction's first find, a getMore, a later insert, the commit.
        inputs: vec![
            start(8),
            Input::Advance(100),
            start(3),
            Input::Advance(100),
            start(9),
            Input::Advance(100),
            start(5),
        ],
    };
    let (sim, ops) = run(&case).expect("runs");
    let finished = finished_ops(&sim);
    for started in &ops {
        assert_eq!(finished.get(&started.op), Some(&1), "{:?}", started.op);
        let result = sim.result(started.op).expect("finished");
        assert!(result.is_ok(), "{:?}: {result:?}", started.op);
    }
    let log: Vec<_> = sim.servers[&address("lb")].log.iter().collect();
    let names: Vec<&str> = log.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "find",
            "getMore",
            "insert",
            "commitTransaction",
            "killCursors"
        ]
    );
    assert!(log.windows(2).all(|w| w[0].1 == w[1].1), "one connection");
    assert!(check_pools(&sim, 2, true).is_ok());
    let out = sim
        .events
        .iter()
        .filter(|(_, e)| {
            matches!(
                e,
                EngineEvent::Pool {
                    event: PoolEvent::CheckedOut { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(out, 1, "one check-out");
}

/// A sanity run of the generator's shape that must succeed: one read on each topology.
#[test]
fn one_read_finishes_on_every_topology() {
    for topology in [
        Topology::Standalone,
        Topology::Mongos(3),
        Topology::LoadBalanced,
        Topology::ReplicaSet(1),
        Topology::ReplicaSet(3),
    ] {
        let case = Case {
            topology,
            scripts: vec![
                ServerScript {
                    steps: Vec::new(),
                    reset_handshakes: 0,
                    late_handshake_ms: None,
                };
                SERVERS
            ],
            max_pool_size: 1,
            seed: 1,
            selection_timeout_ms: 1_000,
            connect_timeout_ms: 1_000,
            socket_timeout_ms: None,
            heartbeat_ms: 10_000,
            hedging: None,
            lb_session: false,
            inputs: vec![Input::Start {
                kind: 0,
                timeout_ms: None,
                nearest: false,
            }],
        };
        let (sim, ops) = run(&case).expect("runs");
        let result = sim.result(ops[0].op).expect("finished");
        let reply: Document = result.expect("a read on a healthy deployment succeeds");
        assert_eq!(reply.get_i32("ok").ok(), Some(1), "{topology:?}");
    }
}

/// The minimal case the widened proptest found on the merged routed engine (saved seed
/// c749765a…): a two-member replica set; a primary read, then a nearest read with `timeoutMS=0`
/// while the primary goes down and a socket closes. Without `$readPreference` on the wire the
/// secondary refused the nearest read with NotPrimaryNoSecondaryOk, and with `timeoutMS=0` (no
/// limit, RR-21) it was retried forever; SS-9 sends `nearest`, so the secondary answers.
#[test]
fn a_nearest_read_while_the_primary_goes_down_finishes() {
    let script = |reset_handshakes| ServerScript {
        steps: Vec::new(),
        reset_handshakes,
        late_handshake_ms: None,
    };
    let case = Case {
        topology: Topology::ReplicaSet(2),
        scripts: vec![script(0), script(1), script(0), script(0)],
        max_pool_size: 1,
        seed: 0,
        selection_timeout_ms: 499,
        connect_timeout_ms: 100,
        socket_timeout_ms: None,
        heartbeat_ms: 500,
        hedging: None,
        lb_session: false,
        inputs: vec![
            Input::Start {
                kind: 0,
                timeout_ms: None,
                nearest: false,
            },
            Input::Advance(4),
            Input::Start {
                kind: 0,
                timeout_ms: Some(0),
                nearest: true,
            },
            Input::Down(0, true),
            Input::Close(289229729320967555, NetworkErrorKind::Closed),
        ],
    };
    assert_case_finishes(&case);
}

/// Every operation `case` starts finishes exactly once.
fn assert_case_finishes(case: &Case) {
    let (sim, ops) = run(case).expect("runs");
    if std::env::var_os("DEBUG_TRACE").is_some() {
        for (at, event) in sim.events.iter().take(400) {
            eprintln!("{at:?} {event:?}");
        }
    }
    let finished = finished_ops(&sim);
    for started in &ops {
        assert_eq!(finished.get(&started.op), Some(&1), "{:?}", started.op);
    }
}

/// The second minimal case of the same cause (saved seed 0da5ad1d…): a two-member replica set whose
/// second member's handshakes all time out; it becomes primary (same `electionId` and
/// `setVersion`), then a nearest read with `timeoutMS=0` goes to the remaining secondary, which
/// must accept it because the command carries `$readPreference: nearest` (SS-9).
#[test]
fn a_nearest_read_after_a_step_down_to_an_unreachable_member_finishes() {
    let script = |late_handshake_ms| ServerScript {
        steps: Vec::new(),
        reset_handshakes: 0,
        late_handshake_ms,
    };
    let case = Case {
        topology: Topology::ReplicaSet(2),
        scripts: vec![script(None), script(Some(1112)), script(None), script(None)],
        max_pool_size: 1,
        seed: 0,
        selection_timeout_ms: 500,
        connect_timeout_ms: 100,
        socket_timeout_ms: None,
        heartbeat_ms: 500,
        hedging: None,
        lb_session: false,
        inputs: vec![
            Input::StepDown {
                to: 1,
                new_election: false,
                new_set_version: false,
            },
            Input::Start {
                kind: 0,
                timeout_ms: Some(0),
                nearest: true,
            },
        ],
    };
    assert_case_finishes(&case);
}

/// TX-4 (1)-(3), house rule 8 (lb21): the shared load-balanced session case that looped for ever
/// (and ran out of memory). A commit under `timeoutMS=0` kept its pinned connection after the
/// session's pin went (a command of the session run alongside unpinned it) and the connection
/// died: every retry failed before sending, at once. Its retry now selects anew; every operation
/// ends once and nothing stays checked out.
#[test]
fn tx4_a_commit_whose_session_lost_its_pin_selects_anew_and_finishes() {
    let case = Case {
        topology: Topology::LoadBalanced,
        scripts: vec![
            ServerScript {
                steps: vec![],
                reset_handshakes: 1,
                late_handshake_ms: None,
            },
            ServerScript {
                steps: vec![
                    ScriptStep::Ok,
                    ScriptStep::Ok,
                    ScriptStep::Garbage(vec![
                        6, 0, 0, 0, 242, 216, 191, 203, 245, 128, 114, 53, 151, 72, 243, 210, 159,
                        241, 160, 117, 197, 231, 140, 45,
                    ]),
                ],
                reset_handshakes: 1,
                late_handshake_ms: Some(118),
            },
            ServerScript {
                steps: vec![
                    ScriptStep::Ok,
                    ScriptStep::Ok,
                    ScriptStep::Reset,
                    ScriptStep::Overload,
                    ScriptStep::Overload,
                    ScriptStep::Overload,
                ],
                reset_handshakes: 2,
                late_handshake_ms: None,
            },
            ServerScript {
                steps: vec![],
                reset_handshakes: 2,
                late_handshake_ms: None,
            },
        ],
        max_pool_size: 1,
        seed: 231419354508945955,
        selection_timeout_ms: 461,
        connect_timeout_ms: 2803,
        socket_timeout_ms: Some(3814),
        inputs: vec![
            Input::Start {
                kind: 1,
                timeout_ms: Some(0),
                nearest: true,
            },
            Input::UnknownClosed(11415266897567901140_u64),
            Input::Start {
                kind: 8,
                timeout_ms: Some(19850),
                nearest: true,
            },
            Input::Start {
                kind: 1,
                timeout_ms: Some(0),
                nearest: true,
            },
            Input::Start {
                kind: 1,
                timeout_ms: Some(0),
                nearest: true,
            },
            Input::Start {
                kind: 2,
                timeout_ms: Some(15225),
                nearest: false,
            },
            Input::Start {
                kind: 2,
                timeout_ms: Some(10045),
                nearest: true,
            },
            Input::Advance(31),
            Input::UnknownClosed(2342739014165610418_u64),
            Input::Advance(0),
            Input::Reconfig(0, false),
            Input::UnknownClosed(9394865601017437729_u64),
            Input::Advance(0),
            Input::Down(1, false),
            Input::Start {
                kind: 1,
                timeout_ms: Some(0),
                nearest: true,
            },
            Input::Start {
                kind: 4,
                timeout_ms: Some(8420),
                nearest: true,
            },
            Input::Start {
                kind: 7,
                timeout_ms: Some(14298),
                nearest: false,
            },
            Input::Advance(0),
            Input::Close(7163210839395780794_usize, NetworkErrorKind::Io),
            Input::Reconfig(1, true),
            Input::Start {
                kind: 8,
                timeout_ms: None,
                nearest: false,
            },
            Input::Start {
                kind: 4,
                timeout_ms: None,
                nearest: false,
            },
            Input::Advance(8116),
            Input::Start {
                kind: 2,
                timeout_ms: Some(1761),
                nearest: false,
            },
            Input::Start {
                kind: 4,
                timeout_ms: Some(0),
                nearest: false,
            },
            Input::Down(0, true),
            Input::Start {
                kind: 1,
                timeout_ms: Some(0),
                nearest: true,
            },
            Input::Start {
                kind: 6,
                timeout_ms: Some(0),
                nearest: false,
            },
            Input::Start {
                kind: 8,
                timeout_ms: None,
                nearest: true,
            },
            Input::Advance(0),
            Input::StepDown {
                to: 2,
                new_election: false,
                new_set_version: false,
            },
            Input::SpuriousTimeout,
            Input::SpuriousTimeout,
        ],
        heartbeat_ms: 2000,
        hedging: Some((2, 2325)),
        lb_session: true,
    };
    let (sim, ops) = run(&case).expect("runs");
    let finished = finished_ops(&sim);
    for started in &ops {
        assert_eq!(finished.get(&started.op), Some(&1), "{:?}", started.op);
    }
    assert!(check_pools(&sim, case.max_pool_size, true).is_ok());
}
