//! The retryable-reads prose tests 2, 3, 4 and 5 against the retry machine.

mod support;

use retry_core::error::Labels;
use retry_core::policy::RetryOptions;
use retry_core::scenario::{Script, StepOutcome};
use support::*;

/// Prose 2.1 (RR-7, BP-20): on a sharded cluster a retryable read error moves the retry to the
/// other mongos; both fail, on different mongoses.
#[test]
fn prose_2_1_rr7_sharded_retry_goes_to_another_mongos() {
    let script = Script::new()
        .then(fail(6, &[]))
        .then(fail(6, &[]))
        .then(StepOutcome::Succeed);
    let trace = read_on(
        &[mongos("m1"), mongos("m2")],
        &RetryOptions::default(),
        &script,
    );
    assert_eq!(hosts(&trace), ["m1", "m2"]);
    assert_eq!(raised(&trace).code(), Some(6));
}

/// Prose 2.2 (RR-7): with only one mongos the retry goes back to it and succeeds.
#[test]
fn prose_2_2_rr7_single_mongos_retries_on_the_same_mongos() {
    let script = Script::new().then(fail(6, &[])).then(StepOutcome::Succeed);
    let trace = read_on(&[mongos("m1")], &RetryOptions::default(), &script);
    assert_eq!(hosts(&trace), ["m1", "m1"]);
    assert_eq!(trace.result(), Some(&Ok(())));
}

/// Prose 3.1 (BP-19): on a replica set with `enableOverloadRetargeting`, an overload error moves
/// the primaryPreferred read to another server.
#[test]
fn prose_3_1_bp19_overload_retargeting_moves_the_read() {
    let options = RetryOptions::default().enable_overload_retargeting(true);
    let script = Script::new()
        .then(fail(6, &OVERLOAD))
        .then(StepOutcome::Succeed);
    let trace = read_on(&[primary(), secondary()], &options, &script);
    assert_eq!(hosts(&trace), ["primary", "secondary"]);
}

/// Prose 3.2 (RR-7): a `RetryableError` without `SystemOverloadedError` is an ordinary retryable
/// read error (code 6) and does not deprioritize, even with retargeting on. Also BP-4: the label
/// alone adds no overload behaviour.
#[test]
fn prose_3_2_rr7_non_overload_error_retries_on_the_same_server() {
    let options = RetryOptions::default().enable_overload_retargeting(true);
    let script = Script::new()
        .then(fail(6, &["RetryableError"]))
        .then(StepOutcome::Succeed);
    let trace = read_on(&[primary(), secondary()], &options, &script);
    assert_eq!(hosts(&trace), ["primary", "primary"]);
}

/// Prose 3.3 (BP-19, BP-20): with retargeting off (the default) an overload retry on a replica set
/// stays on the same server.
#[test]
fn prose_3_3_bp20_retargeting_off_keeps_the_server() {
    let script = Script::new()
        .then(fail(6, &OVERLOAD))
        .then(StepOutcome::Succeed);
    let trace = read_on(&[primary(), secondary()], &RetryOptions::default(), &script);
    assert_eq!(hosts(&trace), ["primary", "primary"]);
}

/// Prose 4 (BP-22): after an overload error, later non-overload retryable errors count toward
/// `maxAdaptiveRetries`: exactly MAX_RETRIES + 1 = 3 attempts.
#[test]
fn prose_4_bp22_overload_cap_sticks_for_later_errors() {
    let script = Script::new()
        .then(fail(91, &OVERLOAD))
        .then(fail(91, &["RetryableError"]));
    let trace = read(&script, JITTER_MAX);
    assert_eq!(trace.commands_started(), 3);
    assert!(!raised(&trace).has_label(Labels::SYSTEM_OVERLOADED));
}

/// Prose 5 (BP-13): in the same setup, only the retry after the overload error backs off.
#[test]
fn prose_5_bp13_backoff_applies_exactly_once() {
    let script = Script::new()
        .then(fail(91, &OVERLOAD))
        .then(fail(91, &["RetryableError"]));
    let trace = read(&script, JITTER_MAX);
    assert_eq!(trace.waits().count(), 1);
    let delays: Vec<_> = trace.retries_scheduled().map(|(delay, _)| delay).collect();
    assert_eq!(
        delays,
        [
            core::time::Duration::from_millis(200),
            core::time::Duration::ZERO
        ]
    );
}
