//! Property tests: random input sequences, valid or not, against the retry machine under every
//! policy. Invariants: no panic; retries never exceed the policy's cap; no wait ends past the
//! deadline; budgets stay within their bounds; every command-started event has exactly one
//! succeeded or failed partner; one `ReleaseConnection` per `Dispatch`; at most one `Finished`,
//! and nothing after it; identical seeds and inputs give identical outputs.

mod support;

use core::time::Duration;
use proptest::prelude::*;
use retry_core::address::ServerAddress;
use retry_core::budget::{GrpcThrottle, TokenBucket};
use retry_core::error::{NetworkErrorKind, NetworkPhase, OperationError};
use retry_core::policy::{GrpcPolicy, RetryOptions, RetryPolicy};
use retry_core::retry::{Action, OperationKind, OperationSpec, RetryEvent, RetryMachine};
use retry_core::time::{Instant, OperationTimeout};
use std::sync::Arc;
use support::*;

#[derive(Clone, Debug)]
enum Input {
    Select(u8),
    SelectionFailed,
    Sent,
    Succeeded,
    Failed(u8),
    Advance(u16),
    Cancel,
    /// Answer the pending action as a real driver would, failing attempts with `sample_error(n)`
    /// (or succeeding when `n` is 12 or more).
    Follow(u8),
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        3 => (0u8..4).prop_map(Input::Select),
        1 => Just(Input::SelectionFailed),
        3 => Just(Input::Sent),
        1 => Just(Input::Succeeded),
        4 => (0u8..12).prop_map(Input::Failed),
        3 => (0u16..1000).prop_map(Input::Advance),
        1 => Just(Input::Cancel),
        12 => (0u8..14).prop_map(Input::Follow),
    ]
}

fn sample_error(i: u8) -> OperationError {
    let addr = ServerAddress::new("x", 1);
    match i {
        0 => error(462, &OVERLOAD),
        1 => error(91, &[]),
        2 => error(91, &["RetryableWriteError"]),
        3 => error(2, &["SystemOverloadedError"]),
        4 => error(
            10107,
            &[
                "RetryableError",
                "SystemOverloadedError",
                "NoWritesPerformed",
            ],
        ),
        5 => OperationError::network(NetworkErrorKind::Reset, NetworkPhase::AfterSend, addr),
        6 => OperationError::network(NetworkErrorKind::Timeout, NetworkPhase::Handshake, addr),
        7 => OperationError::pool_cleared(addr, "x"),
        8 => error(2, &[]),
        9 => OperationError::network(NetworkErrorKind::Dns, NetworkPhase::Connect, addr),
        10 => OperationError::from_reply(
            &reply(462, &OVERLOAD, bson::doc! { "baseBackoffMS": i64::MAX }),
            &ServerAddress::new("x", 1),
        )
        .unwrap(),
        _ => OperationError::from_reply(
            &bson::doc! { "ok": 0, "code": "bad" },
            &ServerAddress::new("x", 1),
        )
        .unwrap(),
    }
}

fn kind(i: u8) -> OperationKind {
    match i % 9 {
        0 => OperationKind::Read,
        1 => OperationKind::RetryableWrite,
        2 => OperationKind::NonRetryableWrite,
        3 => OperationKind::GetMore,
        4 => OperationKind::RunCommand,
        5 => OperationKind::CommitTransaction { again: i > 100 },
        6 => OperationKind::AbortTransaction,
        7 => OperationKind::InTransaction {
            read: true,
            first: false,
        },
        _ => OperationKind::InTransaction {
            read: false,
            first: true,
        },
    }
}

#[derive(Clone, Debug)]
struct Setup {
    kind: u8,
    policy: u8,
    max_adaptive_retries: u8,
    retry_reads: bool,
    retry_writes: bool,
    retargeting: bool,
    timeout: Option<u16>,
    seed: u64,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        any::<u8>(),
        0u8..3,
        0u8..6,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(0u16..5000),
        any::<u64>(),
    )
        .prop_map(
            |(
                kind,
                policy,
                max_adaptive_retries,
                retry_reads,
                retry_writes,
                retargeting,
                timeout,
                seed,
            )| Setup {
                kind,
                policy,
                max_adaptive_retries,
                retry_reads,
                retry_writes,
                retargeting,
                timeout,
                seed,
            },
        )
}

struct Budgets {
    bucket: Arc<TokenBucket>,
    throttle: Arc<GrpcThrottle>,
}

fn options(s: &Setup, budgets: &Budgets) -> RetryOptions {
    let policy = match s.policy {
        0 => RetryPolicy::Current,
        1 => RetryPolicy::TokenBucket(budgets.bucket.clone()),
        _ => RetryPolicy::Grpc(Arc::new(
            GrpcPolicy::new(
                4,
                Duration::from_millis(100),
                Duration::from_secs(2),
                2.0,
                &[91, 462, 10107],
            )
            .unwrap()
            .with_throttle(budgets.throttle.clone()),
        )),
    };
    RetryOptions::default()
        .retry_reads(s.retry_reads)
        .retry_writes(s.retry_writes)
        .enable_overload_retargeting(s.retargeting)
        .max_adaptive_retries(i64::from(s.max_adaptive_retries))
        .unwrap()
        .policy(policy)
}

/// Everything the machine emitted, for comparison between runs.
#[derive(Debug, PartialEq)]
struct Output {
    actions: Vec<(Instant, Action)>,
    events: Vec<(Instant, RetryEvent)>,
    retries: u32,
}

fn drive(s: &Setup, inputs: &[Input]) -> Output {
    let budgets = Budgets {
        bucket: Arc::new(TokenBucket::with_tokens(3)),
        throttle: Arc::new(GrpcThrottle::new(3.0, 0.5).unwrap()),
    };
    let options = options(s, &budgets);
    let timeout = match s.timeout {
        None => OperationTimeout::Off,
        Some(0) => OperationTimeout::Unbounded,
        Some(ms) => OperationTimeout::Until(Instant::from_millis(u64::from(ms))),
    };
    let spec = OperationSpec::new(kind(s.kind))
        .with_txn_number(1)
        .with_timeout(timeout);
    let servers = [primary(), secondary(), mongos("m1"), mongos("m2")];
    let mut now = Instant::ZERO;
    let mut m = RetryMachine::new(spec, &options, s.seed, now);
    let mut out = Output {
        actions: Vec::new(),
        events: Vec::new(),
        retries: 0,
    };
    let drain = |m: &mut RetryMachine, now: Instant, out: &mut Output| {
        while let Some(a) = m.poll_action() {
            out.actions.push((now, a));
        }
        while let Some(e) = m.poll_event() {
            out.events.push((now, e));
        }
    };
    drain(&mut m, now, &mut out);
    for input in inputs {
        // Rejected inputs are part of the property: they must not panic or change anything.
        let _ = match input {
            Input::Select(i) => m.handle_server_selected(servers[usize::from(*i)].clone(), now),
            Input::SelectionFailed => {
                m.handle_selection_failed(OperationError::server_selection("none"), now)
            }
            Input::Sent => m.handle_sent(now),
            Input::Succeeded => m.handle_succeeded(now),
            Input::Failed(i) => m.handle_failed(sample_error(*i), now),
            Input::Advance(ms) => {
                now = now.saturating_add(Duration::from_millis(u64::from(*ms)));
                m.handle_timeout(now);
                Ok(())
            }
            Input::Cancel => m.cancel(now),
            Input::Follow(n) => match out.actions.last().map(|(_, a)| a) {
                Some(Action::SelectServer) => {
                    m.handle_server_selected(servers[usize::from(*n) % 4].clone(), now)
                }
                Some(Action::Dispatch(_)) => {
                    let _ = m.handle_sent(now);
                    now = now.saturating_add(Duration::from_millis(u64::from(*n)));
                    if *n >= 12 {
                        m.handle_succeeded(now)
                    } else {
                        m.handle_failed(sample_error(*n), now)
                    }
                }
                Some(Action::Wait { until }) => {
                    now = now.max(*until);
                    m.handle_timeout(now);
                    Ok(())
                }
                _ => Ok(()),
            },
        };
        drain(&mut m, now, &mut out);
        assert!(budgets.bucket.tenths() <= TokenBucket::CAPACITY * 10);
        assert!(budgets.throttle.millis() <= budgets.throttle.max_millis());
    }
    out.retries = m.retries();
    out
}

fn check(s: &Setup, out: &Output) {
    // Retry caps.
    let cap = match s.policy {
        0 => u32::from(s.max_adaptive_retries).max(1),
        1 => 5,
        _ => 3,
    };
    if s.timeout.is_none() || s.policy == 2 {
        assert!(out.retries <= cap, "{} retries > cap {cap}", out.retries);
    }
    // No wait ends past the deadline.
    if let Some(ms) = s.timeout.filter(|ms| *ms > 0) {
        for (_, a) in &out.actions {
            if let Action::Wait { until } = a {
                assert!(
                    *until <= Instant::from_millis(u64::from(ms)),
                    "wait until {until} past the deadline"
                );
            }
        }
    }
    // Started/outcome pairing.
    let mut open = false;
    for (_, e) in &out.events {
        match e {
            RetryEvent::CommandStarted { .. } => {
                assert!(!open, "two started events without an outcome");
                open = true;
            }
            RetryEvent::CommandSucceeded { .. } | RetryEvent::CommandFailed { .. } => {
                assert!(open, "an outcome without a started event");
                open = false;
            }
            _ => {}
        }
    }
    let finished = out
        .actions
        .iter()
        .filter(|(_, a)| matches!(a, Action::Finished(_)))
        .count();
    assert!(finished <= 1);
    if finished == 1 {
        assert!(!open, "finished with a started command and no outcome");
        assert!(
            matches!(out.actions.last(), Some((_, Action::Finished(_)))),
            "nothing after Finished"
        );
    }
    // One release per dispatch, before the next select, wait or finish.
    let mut holding = false;
    for (_, a) in &out.actions {
        match a {
            Action::Dispatch(_) => {
                assert!(!holding);
                holding = true;
            }
            Action::ReleaseConnection { .. } => {
                assert!(holding, "release without dispatch");
                holding = false;
            }
            Action::SelectServer | Action::Wait { .. } | Action::Finished(_) => {
                assert!(!holding, "{a} while holding a connection")
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_inputs_keep_every_invariant(s in setup(), inputs in proptest::collection::vec(input(), 0..60)) {
        let out = drive(&s, &inputs);
        check(&s, &out);
        prop_assert_eq!(out, drive(&s, &inputs), "identical seeds and inputs must give identical outputs");
    }
}
