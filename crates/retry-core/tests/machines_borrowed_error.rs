//! `handle_failed_ref`: handing the retry machine a borrowed error gives the same actions, events,
//! raised errors and machine state as `handle_failed` with an owned copy (BP-8, BP-13, RR-6, RW-9,
//! RW-17).

mod support;

use retry_core::error::{NetworkErrorKind, NetworkPhase, OperationError};
use retry_core::policy::RetryOptions;
use retry_core::retry::{self, OperationKind, OperationSpec, RetryMachine};
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::{ServerType, TopologyType};
use support::{member, member_server, overload_from};

/// The errors an attempt fails with, in turn: the same shared overload error several times
/// (kept once), another member's, a network error (RW-9 labels it for retryable writes), the
/// shared one without its address (the machine adds the server's), then the shared one again.
fn errors() -> Vec<OperationError> {
    let shared = overload_from(0);
    let mut without_address = shared.clone();
    without_address.address = None;
    vec![
        shared.clone(),
        shared.clone(),
        overload_from(1),
        shared.clone(),
        OperationError::network(NetworkErrorKind::Reset, NetworkPhase::AfterSend, member(2)),
        without_address,
        shared,
    ]
}

/// What a run gave: every action, every event (formatted), the machine at the end.
type Trace = (Vec<retry::Action>, Vec<String>, String);

/// Drives a retry machine through [`errors`] (then a success) on three mongoses in turn,
/// handing borrowed errors when `in_place`, owned copies otherwise.
fn drive_retry(mut m: RetryMachine, in_place: bool) -> Trace {
    let mongos =
        |failed: usize| member_server(failed as u16 % 3, ServerType::Mongos, TopologyType::Sharded);
    let (actions, events) = support::drive_retry(&mut m, mongos, &errors(), in_place);
    (actions, events, format!("{m:?}"))
}

/// Reads and writes, with and without CSOT (unlimited ordinary retries, RW-12), enough
/// adaptive retries to reach every error, events on and off: borrowed and owned errors agree.
#[test]
fn bp8_rw17_a_borrowed_error_gives_the_same_run() {
    let options = RetryOptions::default()
        .max_adaptive_retries(10)
        .expect("a valid cap");
    let kinds = [
        OperationKind::Read,
        OperationKind::RetryableWrite,
        OperationKind::CommitTransaction { again: false },
    ];
    for kind in kinds {
        for timeout in [
            OperationTimeout::Off,
            OperationTimeout::Until(Instant::from_millis(60_000)),
        ] {
            for events in [true, false] {
                let make = || {
                    let spec = OperationSpec::new(kind)
                        .with_timeout(timeout)
                        .with_txn_number(5);
                    let m = RetryMachine::new(spec, &options, 11, Instant::from_millis(0));
                    if events {
                        m
                    } else {
                        m.without_events()
                    }
                };
                let by_value = drive_retry(make(), false);
                let in_place = drive_retry(make(), true);
                assert_eq!(by_value, in_place, "{kind:?} {timeout:?} events {events}");
                assert!(
                    by_value.0.len() > 6,
                    "{kind:?}: the run retries ({:?})",
                    by_value.0
                );
            }
        }
    }
}
