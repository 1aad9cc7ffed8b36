//! The retry machine's rules beyond the prose tests: CSOT, selection failures, server
//! eligibility, command modifications, connection release, budgets, the gRPC policy, cancellation
//! and misuse. Virtual time, pinned jitter, exact assertions.

mod support;

use core::time::Duration;
use retry_core::address::ServerAddress;
use retry_core::budget::{GrpcThrottle, TokenBucket};
use retry_core::error::{ErrorKind, Labels, NetworkErrorKind, NetworkPhase, OperationError};
use retry_core::policy::{GrpcPolicy, RetryOptions, RetryPolicy};
use retry_core::retry::{
    Action, AttemptServer, DenyReason, OperationKind, OperationSpec, RetryEvent, RetryMachine,
    RetryReason, WriteConcernRule,
};
use retry_core::rng::FixedRng;
use retry_core::scenario::{Script, StepOutcome};
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::{ServerType, TopologyType};
use std::sync::Arc;
use support::*;

const MS: fn(u64) -> Duration = Duration::from_millis;

fn csot(ms: u64) -> OperationTimeout {
    OperationTimeout::Until(Instant::from_millis(ms))
}

/// RR/RW-21: with CSOT on, ordinary retryable errors are retried until the deadline, not once.
/// Also CS-8: the `retryability-timeoutMS.json` pattern (repeated failures under timeoutMS 100
/// end in a timeout error).
#[test]
fn rr21_csot_retries_ordinary_errors_until_the_deadline() {
    let spec = OperationSpec::new(OperationKind::Read).with_timeout(csot(100));
    let script = Script::new().then_after(MS(30), fail(91, &[]));
    let trace = on_primary(spec, &script, JITTER_ZERO);
    // Attempts end at 30, 60, 90, 120 ms; the failure at 120 ms is past the deadline.
    assert_eq!(trace.commands_started(), 4);
    let e = raised(&trace);
    assert!(
        matches!(&e.kind, ErrorKind::Timeout { cause: Some(c) } if c.code() == Some(91)),
        "CS-5: {e}"
    );
    assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Deadline]);
}

/// BP-12, BP-22: under CSOT the overload cap still applies once an overload error is seen.
#[test]
fn bp12_overload_cap_applies_under_csot() {
    let spec = OperationSpec::new(OperationKind::Read).with_timeout(OperationTimeout::Unbounded);
    let script = Script::new()
        .then(fail(91, &[]))
        .then(fail(91, &[]))
        .then(fail(2, &OVERLOAD));
    let trace = on_primary(spec, &script, JITTER_ZERO);
    // Two ordinary retries, then the overload error makes the cap 2, which is already used.
    assert_eq!(trace.commands_started(), 3);
    assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Cap]);
}

/// BP-16: a backoff that would end past the deadline is not started; the current error is raised
/// as is (not wrapped), at once.
#[test]
fn bp16_no_wait_ends_past_the_deadline() {
    let spec = OperationSpec::new(OperationKind::Read).with_timeout(csot(300));
    let script = Script::new().then_after(MS(10), fail(462, &OVERLOAD));
    let trace = on_primary(spec, &script, JITTER_MAX);
    // t=10 fail, wait 200 → t=210, fail at 220; the next wait (400 ms) would end at 620 > 300.
    assert_eq!(trace.waits().collect::<Vec<_>>(), [MS(200)]);
    assert_eq!(trace.finished_at(), Some(Instant::from_millis(220)));
    assert_eq!(raised(&trace).code(), Some(462));
    assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Deadline]);
}

/// BP-16 forbids only waits that end past the deadline: a wait ending 1 ms before it runs, and so
/// does one ending exactly at it, but then the deadline has passed and the retry never starts
/// (CS-6), so the operation raises a timeout error wrapping the overload error (CS-5).
#[test]
fn bp16_waits_ending_at_or_before_the_deadline_are_allowed() {
    let script = Script::new()
        .then(fail(462, &OVERLOAD))
        .then(StepOutcome::Succeed);
    let spec = OperationSpec::new(OperationKind::Read).with_timeout(csot(201));
    let trace = on_primary(spec, &script, JITTER_MAX);
    assert_eq!(trace.waits().collect::<Vec<_>>(), [MS(200)]);
    assert_eq!(trace.result(), Some(&Ok(())));
    let spec = OperationSpec::new(OperationKind::Read).with_timeout(csot(200));
    let trace = on_primary(spec, &script, JITTER_MAX);
    assert_eq!(trace.waits().collect::<Vec<_>>(), [MS(200)]);
    assert_eq!(trace.commands_started(), 1);
    assert!(
        matches!(&raised(&trace).kind, ErrorKind::Timeout { cause: Some(c) } if c.code() == Some(462))
    );
}

/// CS-6: an operation whose deadline has already passed never starts.
#[test]
fn cs6_expired_deadline_never_starts() {
    let spec = OperationSpec::new(OperationKind::Read).with_timeout(csot(5));
    let mut m = RetryMachine::new(spec, &RetryOptions::default(), 1, Instant::from_millis(5));
    assert!(
        matches!(m.poll_action(), Some(Action::Finished(Err(e))) if matches!(e.kind, ErrorKind::Timeout { cause: None }))
    );
}

/// RR-6, RW-11: a selection failure on the first attempt raises the selection error.
#[test]
fn rr6_first_selection_failure_raises_the_selection_error() {
    let script = Script::new().then(StepOutcome::SelectionFails(
        OperationError::server_selection("no primary"),
    ));
    let trace = read(&script, JITTER_ZERO);
    assert!(matches!(
        raised(&trace).kind,
        ErrorKind::ServerSelection { .. }
    ));
    assert_eq!(trace.commands_started(), 0);
}

/// RR-6, RW-14, BP-21: a selection failure on a retry raises the previous error.
#[test]
fn rw14_selection_failure_on_retry_raises_the_previous_error() {
    let script =
        Script::new()
            .then(fail(91, &["RetryableWriteError"]))
            .then(StepOutcome::SelectionFails(
                OperationError::server_selection("no primary"),
            ));
    let spec = OperationSpec::new(OperationKind::RetryableWrite).with_txn_number(3);
    let trace = on_primary(spec, &script, JITTER_ZERO);
    assert_eq!(raised(&trace).code(), Some(91));
}

/// RR-9, RR-11, BP-21: a pool error on the retry (nothing sent) raises the previous, sent error;
/// without CSOT a pool-cleared error while already retrying stops the operation.
#[test]
fn rr9_pool_error_on_retry_raises_the_previous_error() {
    let cleared = OperationError::pool_cleared(ServerAddress::new("primary", 27017), "boom");
    let script = Script::new()
        .then(fail(91, &[]))
        .then(StepOutcome::FailBeforeSend(cleared));
    let trace = read(&script, JITTER_ZERO);
    assert_eq!(trace.commands_started(), 1);
    assert_eq!(trace.dispatches().count(), 2);
    assert_eq!(raised(&trace).code(), Some(91));
}

/// RW-14: a retry whose server no longer supports retryable writes raises the previous error.
#[test]
fn rw14_ineligible_retry_server_raises_the_previous_error() {
    let mut m = write_machine(&RetryOptions::default());
    let _ = m.poll_action();
    m.handle_server_selected(primary(), Instant::ZERO).unwrap();
    assert!(matches!(m.poll_action(), Some(Action::Dispatch(a)) if a.txn_number == Some(9)));
    m.handle_sent(Instant::ZERO).unwrap();
    m.handle_failed(error(91, &["RetryableWriteError"]), Instant::ZERO)
        .unwrap();
    assert_eq!(
        m.poll_action(),
        Some(Action::ReleaseConnection { close: false })
    );
    assert_eq!(m.poll_action(), Some(Action::SelectServer));
    let old = AttemptServer {
        sessions_supported: false,
        ..secondary()
    };
    m.handle_server_selected(old, Instant::ZERO).unwrap();
    assert!(matches!(m.poll_action(), Some(Action::Finished(Err(e))) if e.code() == Some(91)));
}

/// RW-2 (issue 10 residual a): the server's description supports sessions, but the connection
/// the first attempt was checked out on does not (SE-8), so the write goes without its
/// `txnNumber`: it runs once, a network error gets no `RetryableWriteError` label and is raised.
#[test]
fn rw2_a_first_attempt_without_its_txn_number_is_not_retried() {
    let mut m = write_machine(&RetryOptions::default());
    assert_eq!(m.poll_action(), Some(Action::SelectServer));
    m.handle_server_selected(primary(), Instant::ZERO).unwrap();
    assert!(matches!(m.poll_action(), Some(Action::Dispatch(a)) if a.txn_number == Some(9)));
    m.handle_attempt_without_txn_number(Instant::ZERO).unwrap();
    m.handle_sent(Instant::ZERO).unwrap();
    let reset = reset_after_send("primary");
    m.handle_failed(reset, Instant::ZERO).unwrap();
    assert_eq!(
        m.poll_action(),
        Some(Action::ReleaseConnection { close: true })
    );
    match m.poll_action() {
        Some(Action::Finished(Err(e))) => {
            assert!(matches!(e.kind, ErrorKind::Network(_)), "{e}");
            assert!(!e.has_label(Labels::RETRYABLE_WRITE), "RW-9: {e}");
        }
        other => panic!("finished with the network error, got {other:?}"),
    }
    assert_eq!(m.attempts(), 1);
}

/// RW-2, BP-5: a write that lost its `txnNumber` that way is still retried on a retryable
/// overload error, as a write on a server without retryable writes is.
#[test]
fn rw2_bp5_a_write_without_its_txn_number_keeps_overload_retries() {
    let mut m = write_machine(&RetryOptions::default());
    dispatch_on_primary(&mut m);
    m.handle_attempt_without_txn_number(Instant::ZERO).unwrap();
    m.handle_sent(Instant::ZERO).unwrap();
    m.handle_failed(error(2, &OVERLOAD), Instant::ZERO).unwrap();
    assert_eq!(
        m.poll_action(),
        Some(Action::ReleaseConnection { close: false })
    );
    assert!(matches!(m.poll_action(), Some(Action::Wait { .. })));
}

/// RW-7, RW-14: a retry must carry the first attempt's `txnNumber`; on a connection that cannot
/// (SE-8) it is not sent: the connection goes back and the previous error is raised.
#[test]
fn rw7_rw14_a_retry_that_cannot_carry_its_txn_number_raises_the_previous_error() {
    let mut m = write_machine(&RetryOptions::default());
    dispatch_on_primary(&mut m);
    m.handle_sent(Instant::ZERO).unwrap();
    m.handle_failed(error(91, &["RetryableWriteError"]), Instant::ZERO)
        .unwrap();
    let _ = m.poll_action();
    assert_eq!(m.poll_action(), Some(Action::SelectServer));
    m.handle_server_selected(primary(), Instant::ZERO).unwrap();
    assert!(matches!(m.poll_action(), Some(Action::Dispatch(a)) if a.txn_number == Some(9)));
    m.handle_attempt_without_txn_number(Instant::ZERO).unwrap();
    assert_eq!(
        m.poll_action(),
        Some(Action::ReleaseConnection { close: false })
    );
    assert!(matches!(m.poll_action(), Some(Action::Finished(Err(e))) if e.code() == Some(91)));
    assert!(m.handle_sent(Instant::ZERO).is_err(), "nothing is sent");
}

/// The input changes nothing for an attempt without a `txnNumber`, and is refused outside a
/// dispatched attempt and for a transaction's command (TX-1: it cannot run without one).
#[test]
fn an_attempt_without_txn_number_is_a_no_op_for_reads_and_refused_elsewhere() {
    let mut read = RetryMachine::new(
        OperationSpec::new(OperationKind::Read),
        &RetryOptions::default(),
        1,
        Instant::ZERO,
    );
    assert!(read
        .handle_attempt_without_txn_number(Instant::ZERO)
        .is_err());
    let _ = read.poll_action();
    read.handle_server_selected(primary(), Instant::ZERO)
        .unwrap();
    let _ = read.poll_action();
    read.handle_attempt_without_txn_number(Instant::ZERO)
        .unwrap();
    assert_eq!(read.poll_action(), None);
    let mut commit = RetryMachine::new(
        OperationSpec::new(OperationKind::CommitTransaction { again: false }).with_txn_number(2),
        &RetryOptions::default(),
        1,
        Instant::ZERO,
    );
    let _ = commit.poll_action();
    commit
        .handle_server_selected(primary(), Instant::ZERO)
        .unwrap();
    let _ = commit.poll_action();
    assert!(commit
        .handle_attempt_without_txn_number(Instant::ZERO)
        .is_err());
}

/// RR-8: a command that needs a newer server than the selected one is not sent.
#[test]
fn rr8_server_too_old_for_the_command() {
    let spec = OperationSpec {
        min_wire_version: 30,
        ..OperationSpec::new(OperationKind::Read)
    };
    let trace = on_primary(spec, &Script::new(), JITTER_ZERO);
    assert!(raised(&trace).to_string().contains("wire version 25"));
    assert_eq!(trace.commands_started(), 0);
}

/// RW-2, RW-4: no txnNumber on a standalone, with retryWrites off, or for non-retryable writes;
/// RW-7: the same txnNumber on every retry.
#[test]
fn rw2_rw7_txn_number_rules() {
    let txn = |kind, options: &RetryOptions, server: AttemptServer| {
        let script = Script::new()
            .then(fail(2, &OVERLOAD))
            .then(StepOutcome::Succeed);
        let spec = OperationSpec::new(kind).with_txn_number(42);
        let trace = run_spec(spec, options, &[server], &script, JITTER_ZERO);
        trace.dispatches().map(|a| a.txn_number).collect::<Vec<_>>()
    };
    let defaults = RetryOptions::default();
    assert_eq!(
        txn(OperationKind::RetryableWrite, &defaults, primary()),
        [Some(42), Some(42)]
    );
    let standalone = server(
        "s",
        retry_core::topology::ServerType::Standalone,
        retry_core::topology::TopologyType::Single,
    );
    assert_eq!(
        txn(OperationKind::RetryableWrite, &defaults, standalone),
        [None, None]
    );
    assert_eq!(
        txn(
            OperationKind::RetryableWrite,
            &defaults.clone().retry_writes(false),
            primary()
        ),
        [None]
    );
    assert_eq!(
        txn(OperationKind::NonRetryableWrite, &defaults, primary()),
        [None, None]
    );
    assert_eq!(
        txn(OperationKind::RunCommand, &defaults, primary()),
        [None, None]
    );
}

/// TX-12: a retried first command of a transaction still starts it, with the same txnNumber.
#[test]
fn tx12_retried_first_command_keeps_start_transaction() {
    let spec = OperationSpec::new(OperationKind::InTransaction {
        read: false,
        first: true,
    })
    .with_txn_number(5);
    let script = Script::new()
        .then(fail(2, &OVERLOAD))
        .then(StepOutcome::Succeed);
    let trace = on_primary(spec, &script, JITTER_ZERO);
    let attempts: Vec<_> = trace
        .dispatches()
        .map(|a| (a.start_transaction, a.txn_number))
        .collect();
    assert_eq!(attempts, [(true, Some(5)), (true, Some(5))]);
}

/// TX-11: commit retries switch to majority write concern, except while every failure was a
/// retryable overload error; a second commit by the user uses majority from the start.
#[test]
fn tx11_commit_retry_write_concern() {
    let rules = |kind, script: Script| {
        let spec = OperationSpec::new(kind).with_txn_number(1);
        let options = RetryOptions::default().max_adaptive_retries(3).unwrap();
        let trace = run_spec(spec, &options, &[primary()], &script, JITTER_ZERO);
        trace
            .dispatches()
            .map(|a| a.write_concern)
            .collect::<Vec<_>>()
    };
    use WriteConcernRule::*;
    let commit = OperationKind::CommitTransaction { again: false };
    let overload_then_ok = Script::new()
        .then(fail(2, &OVERLOAD))
        .then(fail(2, &OVERLOAD))
        .then(StepOutcome::Succeed);
    assert_eq!(
        rules(commit, overload_then_ok),
        [AsRequested, AsRequested, AsRequested]
    );
    let retryable_then_ok = Script::new()
        .then(fail(91, &["RetryableWriteError"]))
        .then(StepOutcome::Succeed);
    assert_eq!(rules(commit, retryable_then_ok), [AsRequested, Majority]);
    let mixed = Script::new()
        .then(fail(2, &OVERLOAD))
        .then(fail(91, &["RetryableWriteError"]))
        .then(StepOutcome::Succeed);
    assert_eq!(rules(commit, mixed), [AsRequested, AsRequested, Majority]);
    let again = OperationKind::CommitTransaction { again: true };
    assert_eq!(rules(again, Script::new()), [Majority]);
}

/// BP-27: every dispatched attempt releases its connection before the wait or the next selection.
#[test]
fn bp27_connection_released_before_every_backoff_and_selection() {
    let script = Script::new().then(fail(462, &OVERLOAD));
    let trace = read(&script, JITTER_MAX);
    let kinds: Vec<&str> = trace
        .actions
        .iter()
        .map(|(_, a)| match a {
            Action::SelectServer => "select",
            Action::Dispatch(_) => "dispatch",
            Action::ReleaseConnection { .. } => "release",
            Action::Wait { .. } => "wait",
            Action::Finished(_) => "finished",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "select", "dispatch", "release", "wait", "select", "dispatch", "release", "wait",
            "select", "dispatch", "release", "finished"
        ]
    );
}

/// BP-26, RW-20: each attempt has one started event and exactly one succeeded or failed partner.
#[test]
fn bp26_started_events_pair_with_one_outcome() {
    let script = Script::new()
        .then(fail(462, &OVERLOAD))
        .then(StepOutcome::Succeed);
    let trace = read(&script, JITTER_ZERO);
    let names: Vec<&str> = trace
        .events
        .iter()
        .map(|(_, e)| match e {
            RetryEvent::CommandStarted { .. } => "started",
            RetryEvent::CommandSucceeded { .. } => "succeeded",
            RetryEvent::CommandFailed { .. } => "failed",
            RetryEvent::RetryScheduled { .. } => "retry",
            RetryEvent::RetryDenied { .. } => "denied",
        })
        .collect();
    assert_eq!(
        names,
        ["started", "failed", "retry", "started", "succeeded"]
    );
}

/// TB-2, TB-3, TB-4, TB-5: the token-bucket policy pays 1 token per overload retry, refuses when
/// empty, and credits successes and healthy failures; 5 retries at most with exponent retry − 1.
#[test]
fn tb5_token_bucket_policy_through_the_machine() {
    let bucket = Arc::new(TokenBucket::with_tokens(2));
    let options = RetryOptions::default().policy(RetryPolicy::TokenBucket(bucket.clone()));
    let script = Script::new().then(fail(462, &OVERLOAD));
    let trace = read_with(&options, &script, JITTER_MAX);
    assert_eq!(trace.commands_started(), 3, "2 tokens pay for 2 retries");
    assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Budget]);
    assert_eq!(trace.waits().collect::<Vec<_>>(), [MS(100), MS(200)]);
    assert_eq!(bucket.tenths(), 0);

    let full = Arc::new(TokenBucket::new());
    let options = RetryOptions::default().policy(RetryPolicy::TokenBucket(full.clone()));
    let trace = read_with(&options, &script, JITTER_MAX);
    assert_eq!(trace.commands_started(), 6, "TB-6: 5 retries");
    assert_eq!(full.tenths(), 10_000 - 50);

    let ok_after_retry = Script::new()
        .then(fail(462, &OVERLOAD))
        .then(fail(91, &[]))
        .then(StepOutcome::Succeed);
    let options = RetryOptions::default().policy(RetryPolicy::TokenBucket(bucket.clone()));
    let trace = read_with(&options, &ok_after_retry, JITTER_ZERO);
    // Empty bucket: the overload retry is refused at once.
    assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Budget]);
    assert_eq!(trace.commands_started(), 1);
    bucket.deposit(retry_core::budget::Deposit::RetryFailedWithoutOverload);
    let trace = read_with(&options, &ok_after_retry, JITTER_ZERO);
    assert_eq!(trace.result(), Some(&Ok(())));
    // −1 (overload retry) +1 (retry failed without overload) +1.1 (retry succeeded).
    assert_eq!(bucket.tenths(), 21);
}

fn grpc(max_attempts: i64) -> GrpcPolicy {
    GrpcPolicy::new(max_attempts, MS(100), MS(1000), 2.0, &[91, 462]).unwrap()
}

/// gRPC A6: maxAttempts counts the original; backoff is min(initial·mult^(n−1), max)·U(0.8, 1.2).
#[test]
fn grpc_max_attempts_and_backoff() {
    let options = RetryOptions::default().policy(RetryPolicy::Grpc(Arc::new(grpc(4))));
    let script = Script::new().then(fail(91, &[]));
    let trace = read_with(&options, &script, JITTER_MAX);
    assert_eq!(trace.commands_started(), 4);
    assert_eq!(
        trace.waits().collect::<Vec<_>>(),
        [MS(120), MS(240), MS(480)]
    );
    assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Cap]);
    let trace = read_with(&options, &script, JITTER_ZERO);
    assert_eq!(
        trace.waits().collect::<Vec<_>>(),
        [MS(80), MS(160), MS(320)]
    );
    let not_listed = Script::new().then(fail(11600, &[]));
    let trace = read_with(&options, &not_listed, JITTER_ZERO);
    assert_eq!(
        trace.denials().collect::<Vec<_>>(),
        [DenyReason::NotRetryable]
    );
}

/// gRPC A6 pushback: retry after exactly the pushed delay, then restart the backoff; a negative
/// or unparseable pushback stops retrying.
#[test]
fn grpc_pushback() {
    let options = RetryOptions::default().policy(RetryPolicy::Grpc(Arc::new(grpc(5))));
    let pushed = reply(91, &[], bson::doc! { "retryPushbackMS": 730 });
    let pushed = OperationError::from_reply(&pushed, &ServerAddress::new("p", 1)).unwrap();
    let script = Script::new()
        .then(fail(91, &[]))
        .then(fail(91, &[]))
        .then(StepOutcome::Fail(pushed))
        .then(fail(91, &[]))
        .then(StepOutcome::Succeed);
    let trace = read_with(&options, &script, JITTER_MAX);
    assert_eq!(
        trace.waits().collect::<Vec<_>>(),
        [MS(120), MS(240), MS(730), MS(120)]
    );
    assert_eq!(trace.result(), Some(&Ok(())));

    let stop = reply(91, &[], bson::doc! { "retryPushbackMS": "-1" });
    let stop = OperationError::from_reply(&stop, &ServerAddress::new("p", 1)).unwrap();
    let trace = read_with(
        &options,
        &Script::new().then(StepOutcome::Fail(stop)),
        JITTER_MAX,
    );
    assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Pushback]);
    assert_eq!(trace.commands_started(), 1);
}

/// gRPC A6 throttling: failures drain the throttle; at or below maxTokens/2 retries stop.
#[test]
fn grpc_throttle_through_the_machine() {
    let throttle = Arc::new(GrpcThrottle::new(4.0, 0.5).unwrap());
    let policy = grpc(5).with_throttle(throttle.clone());
    let options = RetryOptions::default().policy(RetryPolicy::Grpc(Arc::new(policy)));
    let script = Script::new().then(fail(91, &[]));
    let trace = read_with(&options, &script, JITTER_ZERO);
    // 4 → 3 (retry), → 2 (2 is not above 4/2: stop).
    assert_eq!(trace.commands_started(), 2);
    assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Budget]);
    assert_eq!(throttle.millis(), 2000);
    let trace = read_with(&options, &Script::new(), JITTER_ZERO);
    assert_eq!(trace.result(), Some(&Ok(())));
    assert_eq!(throttle.millis(), 2500);
}

/// gRPC A6 transparent retries: attempts never sent are retried at once and not counted.
#[test]
fn grpc_transparent_retries_are_not_counted() {
    let throttle = Arc::new(GrpcThrottle::new(10.0, 0.1).unwrap());
    let policy = grpc(2).with_throttle(throttle.clone());
    let options = RetryOptions::default().policy(RetryPolicy::Grpc(Arc::new(policy)));
    let reset = OperationError::network(
        NetworkErrorKind::Reset,
        NetworkPhase::Connect,
        ServerAddress::new("p", 1),
    );
    let script = Script::new()
        .then(StepOutcome::FailBeforeSend(reset.clone()))
        .then(StepOutcome::FailBeforeSend(reset))
        .then(fail(91, &[]))
        .then(StepOutcome::Succeed);
    let trace = read_with(&options, &script, JITTER_ZERO);
    assert_eq!(trace.result(), Some(&Ok(())));
    let reasons: Vec<_> = trace
        .retries_scheduled()
        .map(|(_, reason)| reason)
        .collect();
    assert_eq!(
        reasons,
        [
            RetryReason::Transparent,
            RetryReason::Transparent,
            RetryReason::Retryable
        ]
    );
    assert_eq!(
        trace.commands_started(),
        2,
        "only sent attempts start commands"
    );
    // One counted failure (−1) and one success (+0.1).
    assert_eq!(throttle.millis(), 9100);
}

/// gRPC: a non-idempotent command is retried only when the server did not run it.
#[test]
fn grpc_non_idempotent_commands_need_proof_the_server_skipped_them() {
    let options = RetryOptions::default().policy(RetryPolicy::Grpc(Arc::new(grpc(3))));
    let trace = run(
        OperationKind::NonRetryableWrite,
        &options,
        &[primary()],
        &Script::new().then(fail(91, &[])),
        JITTER_ZERO,
    );
    assert_eq!(
        trace.denials().collect::<Vec<_>>(),
        [DenyReason::NotRetryable]
    );
    let script = Script::new()
        .then(fail(91, &["NoWritesPerformed"]))
        .then(StepOutcome::Succeed);
    let trace = run(
        OperationKind::NonRetryableWrite,
        &options,
        &[primary()],
        &script,
        JITTER_ZERO,
    );
    assert_eq!(trace.result(), Some(&Ok(())));
}

/// RW-2, RW-7, A6 (review5 item 2): under a gRPC policy a `RetryableWrite` is idempotent only
/// when its attempt carried a `txnNumber`. Sent without one (a standalone, which does not support
/// retryable writes, or a connection whose handshake lacks `logicalSessionTimeoutMinutes`), a
/// network error after send ends the operation: no second attempt.
#[test]
fn rw2_grpc_a_write_sent_without_txn_number_is_not_retried_after_send() {
    let options = RetryOptions::default().policy(RetryPolicy::Grpc(Arc::new(grpc(3))));
    let standalone = server("s", ServerType::Standalone, TopologyType::Single);
    for lose_txn_number in [false, true] {
        let mut m = write_machine(&options);
        assert_eq!(m.poll_action(), Some(Action::SelectServer));
        let server = if lose_txn_number {
            primary()
        } else {
            standalone.clone()
        };
        let address = server.address.clone();
        m.handle_server_selected(server, Instant::ZERO).unwrap();
        assert!(matches!(m.poll_action(), Some(Action::Dispatch(_))));
        if lose_txn_number {
            m.handle_attempt_without_txn_number(Instant::ZERO).unwrap();
        }
        m.handle_sent(Instant::ZERO).unwrap();
        let reset =
            OperationError::network(NetworkErrorKind::Reset, NetworkPhase::AfterSend, address);
        m.handle_failed(reset, Instant::ZERO).unwrap();
        assert_eq!(
            m.poll_action(),
            Some(Action::ReleaseConnection { close: true })
        );
        match m.poll_action() {
            Some(Action::Finished(Err(e))) => assert!(matches!(e.kind, ErrorKind::Network(_)), "{e}"),
            other => panic!("finished with the network error (lost txnNumber: {lose_txn_number}), got {other:?}"),
        }
        assert_eq!(m.attempts(), 1, "no second attempt");
    }
    // With its txnNumber the server de-duplicates: the same error is retried.
    let mut m = write_machine(&options);
    let _ = m.poll_action();
    m.handle_server_selected(primary(), Instant::ZERO).unwrap();
    assert!(matches!(m.poll_action(), Some(Action::Dispatch(a)) if a.txn_number == Some(9)));
    m.handle_sent(Instant::ZERO).unwrap();
    let reset = reset_after_send("primary");
    m.handle_failed(reset, Instant::ZERO).unwrap();
    let _ = m.poll_action();
    assert!(
        matches!(m.poll_action(), Some(Action::Wait { .. })),
        "retried"
    );
}

/// Cancellation mid-flight fails the attempt, closes its connection and finishes the operation.
#[test]
fn cancel_in_flight_closes_the_connection() {
    let mut m = RetryMachine::with_rng(
        OperationSpec::new(OperationKind::Read),
        &RetryOptions::default(),
        FixedRng(0),
        Instant::ZERO,
    );
    dispatch_on_primary(&mut m);
    m.handle_sent(Instant::from_millis(1)).unwrap();
    m.cancel(Instant::from_millis(4)).unwrap();
    assert_eq!(
        m.poll_action(),
        Some(Action::ReleaseConnection { close: true })
    );
    assert!(
        matches!(m.poll_action(), Some(Action::Finished(Err(e))) if e.kind == ErrorKind::Cancelled)
    );
    let _started = m.poll_event();
    assert!(
        matches!(m.poll_event(), Some(RetryEvent::CommandFailed { duration, .. }) if duration == MS(3))
    );
    assert!(
        m.cancel(Instant::from_millis(5)).is_err(),
        "a finished operation cannot be cancelled"
    );
}

/// Inputs that do not fit the state are rejected without changing anything.
#[test]
fn unexpected_inputs_are_rejected_and_ignored() {
    let mut m = RetryMachine::new(
        OperationSpec::new(OperationKind::Read),
        &RetryOptions::default(),
        1,
        Instant::ZERO,
    );
    assert!(m.handle_succeeded(Instant::ZERO).is_err());
    assert!(m.handle_sent(Instant::ZERO).is_err());
    assert!(m.handle_failed(error(91, &[]), Instant::ZERO).is_err());
    m.handle_timeout(Instant::MAX);
    assert_eq!(m.poll_action(), Some(Action::SelectServer));
    assert_eq!(m.poll_action(), None);
    let err = m.handle_succeeded(Instant::ZERO).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unexpected input succeeded while the operation is selecting a server"
    );
}

/// BP-18 / determinism: the same seed gives the same trace; different seeds give different jitter.
#[test]
fn same_seed_same_trace() {
    let run_seeded = |seed| {
        let mut m = RetryMachine::new(
            OperationSpec::new(OperationKind::Read),
            &RetryOptions::default(),
            seed,
            Instant::ZERO,
        );
        retry_core::scenario::run(
            &mut m,
            &[primary()],
            &Script::new().then(fail(462, &OVERLOAD)),
            Instant::ZERO,
        )
    };
    assert_eq!(run_seeded(7), run_seeded(7));
    assert_ne!(
        run_seeded(7).waits().collect::<Vec<_>>(),
        run_seeded(8).waits().collect::<Vec<_>>()
    );
}

/// RW-2, RW-6: a retryable write with no transaction number to send runs once: its ordinary
/// retryable errors are not retried (a retry without a txnNumber could write twice), while an
/// overload rejection still is (BP-5).
#[test]
fn rw6_a_retryable_write_without_a_txn_number_is_not_retried_ordinarily() {
    let script = Script::new().then(fail(91, &["RetryableWriteError"]));
    let trace = on_primary(
        OperationSpec::new(OperationKind::RetryableWrite),
        &script,
        JITTER_ZERO,
    );
    assert_eq!(trace.commands_started(), 1);
    assert_eq!(
        trace.denials().collect::<Vec<_>>(),
        [DenyReason::NotRetryable]
    );
    assert!(trace.dispatches().all(|a| a.txn_number.is_none()));
    let overload = Script::new()
        .then(fail(2, &OVERLOAD))
        .then(StepOutcome::Succeed);
    let trace = on_primary(
        OperationSpec::new(OperationKind::RetryableWrite),
        &overload,
        JITTER_ZERO,
    );
    assert_eq!(trace.result(), Some(&Ok(())));
}

/// CS-5: a failure after the deadline ends the operation with a timeout error wrapping it, even
/// when the failure itself is not retryable.
#[test]
fn cs5_a_failure_after_the_deadline_is_a_timeout_error() {
    let spec = OperationSpec::new(OperationKind::Read).with_timeout(csot(100));
    let script = Script::new().then_after(MS(150), fail(2, &[]));
    let trace = on_primary(spec, &script, JITTER_ZERO);
    let e = raised(&trace);
    assert!(
        matches!(&e.kind, ErrorKind::Timeout { cause: Some(c) } if c.code() == Some(2)),
        "{e}"
    );
}

/// CS-7: under `timeoutMS` a MaxTimeMSExpired (code 50) ends the operation with the timeout
/// error at once, long before the deadline, wrapping the 50 (CS-5) and naming its server (RR-10); without
/// CSOT the server error stays as it is.
#[test]
fn cs7_max_time_ms_expired_under_timeout_ms_is_a_timeout_error() {
    let script = Script::new().then_after(MS(10), fail(50, &[]));
    for kind in [OperationKind::Read, OperationKind::RetryableWrite] {
        let spec = OperationSpec::new(kind).with_txn_number(1);
        let trace = on_primary(spec.with_timeout(csot(250)), &script, JITTER_ZERO);
        assert_eq!(trace.commands_started(), 1, "{kind:?}");
        // Review35 Z6: the deadline (250 ms) has not passed at 10 ms: not denied for it.
        assert_eq!(
            trace.denials().collect::<Vec<_>>(),
            [DenyReason::NotRetryable],
            "{kind:?}"
        );
        let e = raised(&trace);
        assert!(
            matches!(&e.kind, ErrorKind::Timeout { cause: Some(c) } if c.code() == Some(50)),
            "{kind:?}: {e}"
        );
        // The server that answered (the scripted error names its own).
        assert_eq!(e.address, Some(ServerAddress::new("unset", 1)), "{kind:?}");
        // `timeoutMS=0`: CSOT on without a deadline, the same.
        let unbounded = spec.with_timeout(OperationTimeout::Unbounded);
        let e = raised(&on_primary(unbounded, &script, JITTER_ZERO)).clone();
        assert!(matches!(e.kind, ErrorKind::Timeout { .. }), "{kind:?}: {e}");
        // No CSOT: the server's error.
        let trace = on_primary(spec, &script, JITTER_ZERO);
        assert!(matches!(raised(&trace).kind, ErrorKind::Server(_)));
        assert_eq!(raised(&trace).code(), Some(50));
    }
}

/// CS-7: a write concern error with code 50 (`ok: 1`) is the timeout error too; another write
/// concern error code is not.
#[test]
fn cs7_a_write_concern_error_50_under_timeout_ms_is_a_timeout_error() {
    let wce = |code: i32| {
        let reply = bson::doc! { "ok": 1, "n": 1,
        "writeConcernError": { "code": code, "errmsg": "waiting for replication" } };
        StepOutcome::Fail(
            OperationError::from_reply(&reply, &ServerAddress::new("unset", 1)).unwrap(),
        )
    };
    let spec = OperationSpec::new(OperationKind::RetryableWrite)
        .with_txn_number(1)
        .with_timeout(csot(250));
    let trace = on_primary(spec, &Script::new().then(wce(50)), JITTER_ZERO);
    assert_eq!(trace.commands_started(), 1);
    let e = raised(&trace);
    assert!(
        matches!(&e.kind, ErrorKind::Timeout { cause: Some(c) }
            if c.server_error().and_then(|s| s.write_concern_error.as_ref())
                .and_then(|w| w.code) == Some(50)),
        "{e}"
    );
    let trace = on_primary(spec, &Script::new().then(wce(100)), JITTER_ZERO);
    assert!(matches!(raised(&trace).kind, ErrorKind::Server(_)));
}

/// CS-7, TX-8: a commit's MaxTimeMSExpired becomes the timeout error with the cause's labels,
/// `UnknownTransactionCommitResult` included (the engine adds it before the machine sees the
/// error), so a caller still knows the commit may have happened.
#[test]
fn cs7_a_commits_timeout_keeps_unknown_transaction_commit_result() {
    let labelled = error(50, &[]).with_labels(Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT);
    let spec = OperationSpec::new(OperationKind::CommitTransaction { again: false })
        .with_txn_number(1)
        .with_timeout(csot(250));
    let script = Script::new().then(StepOutcome::Fail(labelled));
    let trace = on_primary(spec, &script, JITTER_ZERO);
    let e = raised(&trace);
    assert!(matches!(e.kind, ErrorKind::Timeout { .. }), "{e}");
    assert!(
        e.has_label(Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT),
        "{e:?}"
    );
}

/// BP-27 and the module's queue order: a release is taken in the order it was queued, also when
/// the caller has left earlier actions unpolled (the release is kept apart only when nothing is
/// queued before it), and a release due first comes before the next step.
#[test]
fn bp27_a_release_keeps_its_place_among_unpolled_actions() {
    let server = |port: u16| AttemptServer {
        address: ServerAddress::new("a", port),
        server_type: ServerType::RsPrimary,
        topology_type: TopologyType::ReplicaSetWithPrimary,
        max_wire_version: 25,
        sessions_supported: true,
    };
    let overload = || {
        let reply = bson::doc! { "ok": 0, "code": 462,
        "errorLabels": ["SystemOverloadedError", "RetryableError"] };
        OperationError::from_reply(&reply, &ServerAddress::new("a", 1)).expect("an error")
    };
    let spec = OperationSpec::new(OperationKind::Read).with_timeout(csot(60_000));
    let options = RetryOptions::default()
        .max_adaptive_retries(5)
        .expect("a valid cap");
    let now = Instant::from_millis(1);
    let mut m = RetryMachine::with_rng(spec, &options, FixedRng(0), Instant::ZERO);
    assert_eq!(m.poll_action(), Some(Action::SelectServer));
    // The dispatch is left queued while the attempt is sent and fails.
    m.handle_server_selected(server(1), now).expect("selecting");
    m.handle_sent(now).expect("dispatched");
    m.handle_failed(overload(), now).expect("in flight");
    let mut actions = Vec::new();
    while let Some(action) = m.poll_action() {
        actions.push(action);
    }
    assert!(
        matches!(
            actions.as_slice(),
            [
                Action::Dispatch(_),
                Action::ReleaseConnection { close: false },
                Action::SelectServer,
            ]
        ),
        "{actions:?}"
    );
    // Polled as it comes: the release, then the next step.
    m.handle_server_selected(server(2), now).expect("selecting");
    assert!(matches!(m.poll_action(), Some(Action::Dispatch(_))));
    m.handle_sent(now).expect("dispatched");
    m.handle_failed(overload(), now).expect("in flight");
    assert_eq!(
        m.poll_action(),
        Some(Action::ReleaseConnection { close: false })
    );
    assert_eq!(m.poll_action(), Some(Action::SelectServer));
    assert_eq!(m.poll_action(), None);
}
