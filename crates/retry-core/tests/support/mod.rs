//! Shared helpers for the retry machine's integration tests: servers, error replies, and runs.
#![allow(dead_code)]

pub mod net;

use bson::{doc, Bson, Document};
use retry_core::address::ServerAddress;
use retry_core::error::{NetworkErrorKind, NetworkPhase, OperationError};
use retry_core::policy::RetryOptions;
use retry_core::retry::{self, AttemptServer, OperationKind, OperationSpec, RetryMachine};
use retry_core::rng::FixedRng;
use retry_core::scenario::{self, Script, StepOutcome, Trace};
use retry_core::time::Instant;
use retry_core::topology::{ServerType, TopologyType};
use retry_core::wire::{MsgFlags, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES};
use std::time::Duration;

pub const OVERLOAD: [&str; 2] = ["SystemOverloadedError", "RetryableError"];

pub fn server(host: &str, server_type: ServerType, topology_type: TopologyType) -> AttemptServer {
    AttemptServer {
        address: ServerAddress::new(host, 27017),
        server_type,
        topology_type,
        max_wire_version: 25,
        sessions_supported: true,
    }
}

pub fn primary() -> AttemptServer {
    server(
        "primary",
        ServerType::RsPrimary,
        TopologyType::ReplicaSetWithPrimary,
    )
}

pub fn secondary() -> AttemptServer {
    server(
        "secondary",
        ServerType::RsSecondary,
        TopologyType::ReplicaSetWithPrimary,
    )
}

pub fn mongos(host: &str) -> AttemptServer {
    server(host, ServerType::Mongos, TopologyType::Sharded)
}

/// A command error reply with `code` and `labels`, and any extra fields.
pub fn reply(code: i32, labels: &[&str], extra: Document) -> Document {
    let mut d = doc! { "ok": 0, "code": code, "errmsg": format!("failpoint {code}"),
    "errorLabels": labels.iter().map(|l| Bson::String((*l).into())).collect::<Vec<_>>() };
    d.extend(extra);
    d
}

/// The error a server at `host` returns with `code` and `labels`.
pub fn error(code: i32, labels: &[&str]) -> OperationError {
    OperationError::from_reply(
        &reply(code, labels, doc! {}),
        &ServerAddress::new("unset", 1),
    )
    .unwrap()
}

pub fn fail(code: i32, labels: &[&str]) -> StepOutcome {
    StepOutcome::Fail(error(code, labels))
}

pub const JITTER_ZERO: FixedRng = FixedRng(0);
pub const JITTER_MAX: FixedRng = FixedRng(u64::MAX);

/// Runs one operation of `kind` from t=0 with pinned jitter.
pub fn run(
    kind: OperationKind,
    options: &RetryOptions,
    servers: &[AttemptServer],
    script: &Script,
    jitter: FixedRng,
) -> Trace {
    run_spec(OperationSpec::new(kind), options, servers, script, jitter)
}

pub fn run_spec(
    spec: OperationSpec,
    options: &RetryOptions,
    servers: &[AttemptServer],
    script: &Script,
    jitter: FixedRng,
) -> Trace {
    let mut machine = RetryMachine::with_rng(spec, options, jitter, Instant::ZERO);
    let trace = scenario::run(&mut machine, servers, script, Instant::ZERO);
    assert!(machine.is_finished(), "the run must finish: {trace:#?}");
    trace
}

/// Runs `spec` on a replica-set primary with the default options, from t=0 with pinned jitter.
pub fn on_primary(spec: OperationSpec, script: &Script, jitter: FixedRng) -> Trace {
    run_spec(spec, &RetryOptions::default(), &[primary()], script, jitter)
}

/// Runs a read on a replica-set primary with `options`.
pub fn read_with(options: &RetryOptions, script: &Script, jitter: FixedRng) -> Trace {
    run(OperationKind::Read, options, &[primary()], script, jitter)
}

/// Runs a read on `servers` with `options` and zero jitter.
pub fn read_on(servers: &[AttemptServer], options: &RetryOptions, script: &Script) -> Trace {
    run(OperationKind::Read, options, servers, script, JITTER_ZERO)
}

/// Runs a read on a replica-set primary with the default options.
pub fn read(script: &Script, jitter: FixedRng) -> Trace {
    read_with(&RetryOptions::default(), script, jitter)
}

/// A retryable write's machine: `txnNumber` 9, `options`, seed 1, started at t=0.
pub fn write_machine(options: &RetryOptions) -> RetryMachine {
    RetryMachine::new(
        OperationSpec::new(OperationKind::RetryableWrite).with_txn_number(9),
        options,
        1,
        Instant::ZERO,
    )
}

/// Takes the machine's next action (a server selection), answers it with the primary at t=0 and
/// takes the next (the attempt's dispatch), without looking at either.
pub fn dispatch_on_primary<R: rand_core::RngCore>(m: &mut RetryMachine<R>) {
    let _ = m.poll_action();
    m.handle_server_selected(primary(), Instant::ZERO).unwrap();
    let _ = m.poll_action();
}

/// A connection reset after the command was sent, at `host`.
pub fn reset_after_send(host: &str) -> OperationError {
    OperationError::network(
        NetworkErrorKind::Reset,
        NetworkPhase::AfterSend,
        ServerAddress::new(host, 27017),
    )
}

/// The error the operation raised.
pub fn raised(trace: &Trace) -> &OperationError {
    match trace.result() {
        Some(Err(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The addresses of the dispatched attempts, in order.
pub fn hosts(trace: &Trace) -> Vec<String> {
    trace
        .dispatches()
        .map(|a| a.address.host().to_string())
        .collect()
}

/// Member `i` of a test deployment: `member:{27017 + i}`.
pub fn member(i: u16) -> ServerAddress {
    ServerAddress::new("member", 27017 + i)
}

/// Member `i` as a server of `server_type` in a topology of `topology_type`.
pub fn member_server(
    i: u16,
    server_type: ServerType,
    topology_type: TopologyType,
) -> AttemptServer {
    AttemptServer {
        address: member(i),
        ..server("member", server_type, topology_type)
    }
}

/// BP-2: a retryable overload error (462 with both labels) from member `i`.
pub fn overload_from(i: u16) -> OperationError {
    let reply = doc! { "ok": 0, "code": 462,
    "errorLabels": ["SystemOverloadedError", "RetryableError"] };
    OperationError::from_reply(&reply, &member(i)).expect("an error")
}

/// Drives a retry machine from t=0, for at most 200 actions: its `n`-th server selection (`n`
/// failures so far) gets `server(n)`; each dispatch is sent and, 3 ms later, fails with the next
/// of `failures` (handed borrowed when `in_place`, an owned copy otherwise, RW-17), or succeeds
/// once they are used up; each wait runs to its end. Returns every action and every event
/// (formatted), in order.
pub fn drive_retry(
    m: &mut RetryMachine,
    server: impl Fn(usize) -> AttemptServer,
    failures: &[OperationError],
    in_place: bool,
) -> (Vec<retry::Action>, Vec<String>) {
    let (mut actions, mut events, mut failed) = (Vec::new(), Vec::new(), 0);
    let mut now = Instant::from_millis(0);
    for _ in 0..200 {
        while let Some(event) = m.poll_event() {
            events.push(format!("{event:?}"));
        }
        let Some(action) = m.poll_action() else {
            break;
        };
        actions.push(action.clone());
        match action {
            retry::Action::SelectServer => {
                m.handle_server_selected(server(failed), now)
                    .expect("selecting");
            }
            retry::Action::Dispatch(_) => {
                m.handle_sent(now).expect("dispatched");
                now = now.saturating_add(Duration::from_millis(3));
                match failures.get(failed) {
                    Some(error) => {
                        failed += 1;
                        let handled = if in_place {
                            m.handle_failed_ref(error, now)
                        } else {
                            m.handle_failed(error.clone(), now)
                        };
                        handled.expect("in flight");
                    }
                    None => m.handle_succeeded(now).expect("in flight"),
                }
            }
            retry::Action::Wait { until } => {
                now = until;
                m.handle_timeout(now);
            }
            retry::Action::ReleaseConnection { .. } | retry::Action::Finished(_) => {}
        }
    }
    (actions, events)
}

/// `body` encoded as an OP_MSG reply to the request `response_to`: what a server writes back to
/// an engine under test.
pub fn reply_bytes(response_to: i32, body: Document) -> Vec<u8> {
    let reply = OpMsg {
        request_id: 0,
        response_to,
        flags: MsgFlags::NONE,
        body,
        sequences: Vec::new(),
    };
    let mut bytes = Vec::new();
    reply
        .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut bytes)
        .expect("encodable");
    bytes
}
