//! RR-11 at the retry machine: a PoolClearedError at checkout (nothing sent) is always retried,
//! is kept as the "previous" error when it is the operation's first, and stops the operation
//! when it expires the CSOT deadline or, without CSOT, when the operation was already retrying.
//! (That SDAM is not updated for it is asserted end to end in retry-sim's `bp23_rw15_rr11.rs`.)
//! Virtual time, pinned jitter, exact assertions.

mod support;

use core::time::Duration;
use retry_core::address::ServerAddress;
use retry_core::error::{ErrorKind, OperationError};
use retry_core::retry::{DenyReason, OperationKind, OperationSpec, RetryReason};
use retry_core::scenario::{Script, StepOutcome};
use retry_core::time::{Instant, OperationTimeout};
use support::*;

/// A PoolClearedError from the primary's pool, `cause` telling one from another.
fn cleared(cause: &str) -> OperationError {
    OperationError::pool_cleared(ServerAddress::new("primary", 27017), cause)
}

fn at_checkout(cause: &str) -> StepOutcome {
    StepOutcome::FailBeforeSend(cleared(cause))
}

/// The cause of a PoolClearedError.
fn cleared_cause(error: &OperationError) -> Option<&str> {
    match &error.kind {
        ErrorKind::PoolCleared { cause } => Some(cause),
        _ => None,
    }
}

fn read() -> OperationSpec {
    OperationSpec::new(OperationKind::Read)
}

fn write() -> OperationSpec {
    OperationSpec::new(OperationKind::RetryableWrite).with_txn_number(3)
}

/// RR-11 (RW-9 for the write, which gets `RetryableWriteError`): a read and a retryable write
/// whose first checkout fails with a PoolClearedError are retried at once (no backoff: not an
/// overload error) and succeed; only the retry is written, the write's with its `txnNumber`.
#[test]
fn rr11_a_pool_cleared_checkout_is_always_retried() {
    let script = Script::new()
        .then(at_checkout("cleared"))
        .then(StepOutcome::Succeed);
    for spec in [read(), write()] {
        let trace = on_primary(spec, &script, JITTER_ZERO);
        assert_eq!(trace.result(), Some(&Ok(())), "{spec:?}");
        assert_eq!(
            trace.retries_scheduled().collect::<Vec<_>>(),
            [(Duration::ZERO, RetryReason::Retryable)],
            "{spec:?}"
        );
        assert_eq!(trace.dispatches().count(), 2);
        assert_eq!(
            trace.commands_started(),
            1,
            "the first attempt sent nothing"
        );
        let txn: Vec<_> = trace.dispatches().map(|a| a.txn_number).collect();
        let expected = spec.txn_number;
        assert_eq!(txn, [expected, expected]);
    }
}

/// RR-11, RR-6, RW-14: when the PoolClearedError is the first error it is the one raised if the
/// retry then fails without showing an attempt: its selection fails, or its own checkout fails.
#[test]
fn rr11_a_first_pool_cleared_error_is_kept_as_the_previous_error() {
    let after = [
        StepOutcome::SelectionFails(OperationError::server_selection("no server")),
        StepOutcome::FailBeforeSend(OperationError::checkout(
            "the wait queue timed out",
            ServerAddress::new("primary", 27017),
        )),
    ];
    for spec in [read(), write()] {
        for second in &after {
            let script = Script::new()
                .then(at_checkout("first"))
                .then(second.clone());
            let trace = on_primary(spec, &script, JITTER_ZERO);
            let raised = raised(&trace);
            assert_eq!(cleared_cause(raised), Some("first"), "{spec:?} {second:?}");
            assert_eq!(trace.commands_started(), 0);
        }
    }
}

/// RR-11 without CSOT: a PoolClearedError while already retrying stops the operation (the retry
/// cap of one); the error raised is the previous one: the sent error before it (RR-9), or the
/// first PoolClearedError when nothing was ever sent.
#[test]
fn rr11_without_csot_a_pool_cleared_retry_stops_the_operation() {
    let script = Script::new()
        .then(fail(91, &["RetryableWriteError"]))
        .then(at_checkout("second"));
    for spec in [read(), write()] {
        let trace = on_primary(spec, &script, JITTER_ZERO);
        assert_eq!(trace.dispatches().count(), 2, "{spec:?}");
        assert_eq!(raised(&trace).code(), Some(91), "{spec:?}");
        assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Cap]);
    }
    let script = Script::new()
        .then(at_checkout("first"))
        .then(at_checkout("second"));
    for spec in [read(), write()] {
        let trace = on_primary(spec, &script, JITTER_ZERO);
        assert_eq!(trace.dispatches().count(), 2, "{spec:?}");
        assert_eq!(cleared_cause(raised(&trace)), Some("first"), "{spec:?}");
        assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Cap]);
    }
}

/// RR-11 with CSOT (RR/RW-21, CS-5): PoolClearedErrors are retried for as long as the deadline
/// allows, not once: each checkout fails 30 ms after dispatch, so attempts start at 0, 30, 60 and
/// 90 ms; the failure at 120 ms is past the 100 ms deadline and the operation raises a timeout
/// error wrapping the first PoolClearedError (nothing was ever sent), at 120 ms.
#[test]
fn rr11_with_csot_pool_cleared_errors_are_retried_until_the_deadline() {
    let script = Script::new().then_after(Duration::from_millis(30), at_checkout("cleared"));
    for spec in [read(), write()] {
        let spec = spec.with_timeout(OperationTimeout::Until(Instant::from_millis(100)));
        let trace = on_primary(spec, &script, JITTER_ZERO);
        assert_eq!(trace.dispatches().count(), 4, "{spec:?}");
        assert_eq!(trace.commands_started(), 0);
        assert_eq!(trace.finished_at(), Some(Instant::from_millis(120)));
        let raised = raised(&trace);
        match &raised.kind {
            ErrorKind::Timeout { cause: Some(cause) } => {
                assert_eq!(cleared_cause(cause), Some("cleared"), "{raised}")
            }
            _ => panic!("CS-5: a timeout error, got {raised}"),
        }
        assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Deadline]);
    }
}

/// RR-11 with CSOT, CS-5 (CSOT "Server Selection" and "Retryability"): the retry after a
/// PoolClearedError waits in server selection, whose timeout under CSOT is what remains of
/// `timeoutMS` (CS-3). Failing at the 100 ms deadline, it ends the operation with a timeout error
/// wrapping the PoolClearedError (was: the PoolClearedError itself, not a timeout); failing
/// before it (its own `serverSelectionTimeoutMS`), it raises the PoolClearedError (RW-14).
#[test]
fn rr11_cs5_a_retry_selection_failing_at_the_deadline_is_a_timeout() {
    let no_server = || StepOutcome::SelectionFails(OperationError::server_selection("no server"));
    let at = |ms: u64| {
        Script::new()
            .then_after(Duration::from_millis(10), at_checkout("first"))
            .then_after(Duration::from_millis(ms - 10), no_server())
    };
    for spec in [read(), write()] {
        let spec = spec.with_timeout(OperationTimeout::Until(Instant::from_millis(100)));
        let trace = on_primary(spec, &at(100), JITTER_ZERO);
        assert_eq!(trace.finished_at(), Some(Instant::from_millis(100)));
        let error = raised(&trace);
        match &error.kind {
            ErrorKind::Timeout { cause: Some(cause) } => {
                assert_eq!(cleared_cause(cause), Some("first"), "{error}")
            }
            _ => panic!("CS-5: a timeout error, got {error}"),
        }
        assert_eq!(trace.denials().collect::<Vec<_>>(), [DenyReason::Deadline]);
        let trace = on_primary(spec, &at(99), JITTER_ZERO);
        assert_eq!(cleared_cause(raised(&trace)), Some("first"), "RW-14");
    }
}

/// CS-5 (CSOT "Server Selection": the selection loop fails with a timeout error once
/// `timeoutMS` expires): a first selection failing at the deadline raises a timeout error
/// wrapping the selection error; one failing before it (its own `serverSelectionTimeoutMS`)
/// raises the selection error as is (RR-6, RW-11), as does any without CSOT.
#[test]
fn cs5_a_first_selection_failing_at_the_deadline_is_a_timeout() {
    let fails_after = |ms: u64| {
        Script::new().then_after(
            Duration::from_millis(ms),
            StepOutcome::SelectionFails(OperationError::server_selection("no server")),
        )
    };
    let deadline = OperationTimeout::Until(Instant::from_millis(100));
    let trace = on_primary(
        read().with_timeout(deadline),
        &fails_after(100),
        JITTER_ZERO,
    );
    let raised_at_deadline = raised(&trace);
    assert!(
        matches!(&raised_at_deadline.kind, ErrorKind::Timeout { cause: Some(c) }
            if matches!(c.kind, ErrorKind::ServerSelection { .. })),
        "{raised_at_deadline}"
    );
    assert!(raised_at_deadline.to_string().contains("no server"));
    let trace = on_primary(read().with_timeout(deadline), &fails_after(99), JITTER_ZERO);
    assert!(matches!(
        raised(&trace).kind,
        ErrorKind::ServerSelection { .. }
    ));
    let trace = on_primary(read(), &fails_after(100), JITTER_ZERO);
    assert!(matches!(
        raised(&trace).kind,
        ErrorKind::ServerSelection { .. }
    ));
}
