//! The retryable-writes prose tests 4, 5 and 6 (cases 1–5) against the retry machine, plus prose 3
//! (writeConcernError then NoWritesPerformed).

mod support;

use bson::doc;
use retry_core::address::ServerAddress;
use retry_core::error::{Labels, OperationError};
use retry_core::policy::RetryOptions;
use retry_core::retry::{OperationKind, OperationSpec};
use retry_core::scenario::{Script, StepOutcome};
use support::*;

const NWP_OVERLOAD: [&str; 3] = [
    "RetryableError",
    "SystemOverloadedError",
    "NoWritesPerformed",
];

fn insert_one() -> OperationSpec {
    OperationSpec::new(OperationKind::RetryableWrite).with_txn_number(7)
}

/// Prose 3 (RW-17): a writeConcernError 91 with RetryableWriteError, then 10107 with
/// NoWritesPerformed: the 91 is raised.
#[test]
fn prose_3_rw17_no_writes_performed_after_wce_raises_the_wce() {
    let wce = doc! { "ok": 1, "writeConcernError": { "code": 91, "errmsg": "shutdown" }, "errorLabels": ["RetryableWriteError"] };
    let wce = OperationError::from_reply(&wce, &ServerAddress::new("unset", 1)).unwrap();
    let script = Script::new()
        .then(StepOutcome::Fail(wce))
        .then(fail(10107, &["RetryableWriteError", "NoWritesPerformed"]));
    let trace = on_primary(insert_one(), &script, JITTER_ZERO);
    let e = raised(&trace);
    assert_eq!(
        e.server_error()
            .unwrap()
            .write_concern_error
            .as_ref()
            .unwrap()
            .code,
        Some(91)
    );
}

/// Prose 4 (RW-13): on a sharded cluster the retry goes to the other mongos.
#[test]
fn prose_4_rw13_sharded_write_retry_goes_to_another_mongos() {
    let script = Script::new().then(fail(6, &["RetryableWriteError"]));
    let trace = run_spec(
        insert_one(),
        &RetryOptions::default(),
        &[mongos("m1"), mongos("m2")],
        &script,
        JITTER_ZERO,
    );
    assert_eq!(hosts(&trace), ["m1", "m2"]);
    assert!(raised(&trace).is_retryable_write());
}

/// Prose 5 (RW-9, RW-13): one mongos that closes the connection: the driver labels the network
/// error, retries on the same mongos, and succeeds.
#[test]
fn prose_5_rw9_network_error_is_retried_on_the_same_mongos() {
    use retry_core::error::{NetworkErrorKind, NetworkPhase};
    let closed = OperationError::network(
        NetworkErrorKind::Closed,
        NetworkPhase::AfterSend,
        ServerAddress::new("m1", 27017),
    );
    let script = Script::new()
        .then(StepOutcome::Fail(closed))
        .then(StepOutcome::Succeed);
    let trace = run_spec(
        insert_one(),
        &RetryOptions::default(),
        &[mongos("m1")],
        &script,
        JITTER_ZERO,
    );
    assert_eq!(hosts(&trace), ["m1", "m1"]);
    assert_eq!(trace.result(), Some(&Ok(())));
    assert!(
        trace.dispatches().all(|a| a.txn_number == Some(7)),
        "RW-7: the same txnNumber"
    );
}

/// Prose 6 case 1 (RW-17): only errors without NoWritesPerformed: the latest (10107) is raised.
#[test]
fn prose_6_case_1_rw17_latest_error_without_no_writes_performed() {
    let script = Script::new()
        .then(fail(91, &OVERLOAD))
        .then(fail(10107, &OVERLOAD));
    let trace = on_primary(insert_one(), &script, JITTER_ZERO);
    assert_eq!(raised(&trace).code(), Some(10107));
}

/// Prose 6 case 2 (RW-17): every error has NoWritesPerformed: the first (91) is raised.
#[test]
fn prose_6_case_2_rw17_all_no_writes_performed_raises_the_first() {
    let script = Script::new()
        .then(fail(91, &NWP_OVERLOAD))
        .then(fail(10107, &NWP_OVERLOAD));
    let trace = on_primary(insert_one(), &script, JITTER_ZERO);
    assert_eq!(trace.commands_started(), 3);
    assert_eq!(raised(&trace).code(), Some(91));
}

/// Prose 6 case 3 (RW-17): a 91 without NoWritesPerformed, then 91s with it: the raised 91 has no
/// NoWritesPerformed label.
#[test]
fn prose_6_case_3_rw17_mixed_raises_the_error_that_shows_a_write() {
    let script = Script::new()
        .then(fail(91, &OVERLOAD))
        .then(fail(91, &NWP_OVERLOAD));
    let trace = on_primary(insert_one(), &script, JITTER_ZERO);
    let e = raised(&trace);
    assert_eq!(e.code(), Some(91));
    assert!(!e.has_label(Labels::NO_WRITES_PERFORMED));
}

/// Prose 6 case 4 (BP-22): an overload error, then RetryableWriteError errors: MAX_RETRIES + 1 = 3
/// attempts.
#[test]
fn prose_6_case_4_bp22_overload_cap_sticks_for_writes() {
    let script = Script::new()
        .then(fail(91, &OVERLOAD))
        .then(fail(91, &["RetryableWriteError"]));
    let trace = on_primary(insert_one(), &script, JITTER_ZERO);
    assert_eq!(trace.commands_started(), 3);
}

/// Prose 6 case 5 (BP-13): in the same setup the backoff is applied exactly once.
#[test]
fn prose_6_case_5_bp13_backoff_applies_once() {
    let script = Script::new()
        .then(fail(91, &OVERLOAD))
        .then(fail(91, &["RetryableWriteError"]));
    let trace = on_primary(insert_one(), &script, JITTER_MAX);
    assert_eq!(
        trace.waits().collect::<Vec<_>>(),
        [core::time::Duration::from_millis(200)]
    );
}
