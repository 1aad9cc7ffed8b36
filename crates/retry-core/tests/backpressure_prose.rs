//! The client-backpressure prose tests (1, 3, 4, 5) against the retry machine in virtual time with
//! pinned jitter: every timing assertion is exact.

mod support;

use bson::doc;
use core::time::Duration;
use retry_core::address::ServerAddress;
use retry_core::error::OperationError;
use retry_core::policy::RetryOptions;
use retry_core::retry::OperationKind;
use retry_core::scenario::{Script, StepOutcome};
use retry_core::time::Instant;
use support::*;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Prose 1 (BP-14, BP-18): insertOne against an `alwaysOn` code-2 overload fail point takes exactly
/// 200 ms + 400 ms longer with jitter pinned just below 1 than with jitter 0.
#[test]
fn prose_1_bp14_backoff_with_jitter_near_one_adds_exactly_600ms() {
    let options = RetryOptions::default();
    let script = Script::new().then_after(MS(1), fail(2, &OVERLOAD));
    let servers = [primary()];
    let no_jitter = run(
        OperationKind::RetryableWrite,
        &options,
        &servers,
        &script,
        JITTER_ZERO,
    );
    let full_jitter = run(
        OperationKind::RetryableWrite,
        &options,
        &servers,
        &script,
        JITTER_MAX,
    );
    assert_eq!(
        no_jitter.finished_at(),
        Some(Instant::from_millis(3)),
        "3 attempts of 1 ms, no waits"
    );
    let difference = full_jitter
        .finished_at()
        .unwrap()
        .saturating_duration_since(no_jitter.finished_at().unwrap());
    assert_eq!(difference, MS(600));
    assert_eq!(full_jitter.waits().collect::<Vec<_>>(), [MS(200), MS(400)]);
    assert!(raised(&full_jitter).is_retryable_overload());
}

/// Prose 3 (BP-10, BP-22): find with code 462 `alwaysOn` raises an error with both labels after
/// exactly 3 commands started.
#[test]
fn prose_3_bp10_overload_find_is_attempted_three_times() {
    let script = Script::new().then(fail(462, &OVERLOAD));
    let trace = read(&script, JITTER_ZERO);
    assert_eq!(trace.commands_started(), 3);
    let e = raised(&trace);
    assert!(e.is_overload() && e.is_retryable_overload());
    assert_eq!(e.code(), Some(462));
}

/// Prose 4 (BP-10): `maxAdaptiveRetries=1` gives exactly 2 commands started.
#[test]
fn prose_4_bp10_max_adaptive_retries_one_gives_two_attempts() {
    let options = RetryOptions::default().max_adaptive_retries(1).unwrap();
    let script = Script::new().then(fail(462, &OVERLOAD));
    let trace = read_with(&options, &script, JITTER_ZERO);
    assert_eq!(trace.commands_started(), 2);
}

/// Prose 5 (BP-15): with the server's `baseBackoffMS=50`, the backoffs are bounded by
/// 100 ms + 200 ms = 0.3 s instead of 0.6 s, and the value was parsed from the reply.
#[test]
fn prose_5_bp15_base_backoff_ms_halves_the_backoff() {
    let address = ServerAddress::new("unset", 1);
    let with_base = OperationError::from_reply(
        &reply(462, &OVERLOAD, doc! { "baseBackoffMS": 50 }),
        &address,
    )
    .unwrap();
    assert_eq!(with_base.server_error().unwrap().base_backoff, Some(MS(50)));
    let options = RetryOptions::default();
    let servers = [primary()];
    let base = Script::new().then(StepOutcome::Fail(with_base));
    let plain = Script::new().then(fail(462, &OVERLOAD));
    let with_base = run(OperationKind::Read, &options, &servers, &base, JITTER_MAX);
    let without = run(OperationKind::Read, &options, &servers, &plain, JITTER_MAX);
    assert_eq!(with_base.finished_at(), Some(Instant::from_millis(300)));
    assert_eq!(without.finished_at(), Some(Instant::from_millis(600)));
}
