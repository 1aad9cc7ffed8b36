//! `without_events`: a retry or hedging machine that records no monitoring events takes the same
//! actions, in the same order, as one that does (the decisions never read the events). `restart`:
//! a used machine restarted in place is the machine `new` makes, and then acts as it does.

mod support;

use retry_core::hedging::{self, CopyId, HedgingMachine, HedgingPolicy};
use retry_core::policy::RetryOptions;
use retry_core::retry::{self, OperationKind, OperationSpec, RetryMachine};
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::{ServerType, TopologyType};
use std::time::Duration;
use support::{member, member_server, overload_from};

/// Drives a retry machine on a primary: two overload failures, then a success. Returns its
/// actions and how many events it recorded.
fn drive_retry(m: &mut RetryMachine) -> (Vec<retry::Action>, usize) {
    let primary = |_| {
        member_server(
            0,
            ServerType::RsPrimary,
            TopologyType::ReplicaSetWithPrimary,
        )
    };
    let failures = [overload_from(0), overload_from(0)];
    let (actions, events) = support::drive_retry(m, primary, &failures, false);
    (actions, events.len())
}

/// BP-8, BP-13: the backoffs, retries and result are the same without events.
#[test]
fn a_retry_machine_without_events_takes_the_same_actions() {
    let make = || {
        RetryMachine::new(
            OperationSpec::new(OperationKind::Read)
                .with_timeout(OperationTimeout::Until(Instant::from_millis(10_000))),
            &RetryOptions::default(),
            7,
            Instant::from_millis(0),
        )
    };
    let (with, recorded) = drive_retry(&mut make());
    let (without, none) = drive_retry(&mut make().without_events());
    assert_eq!(with, without);
    assert!(matches!(with.last(), Some(retry::Action::Finished(Ok(())))));
    assert_eq!(
        with.iter()
            .filter(|a| matches!(a, retry::Action::Wait { .. }))
            .count(),
        2
    );
    assert!(recorded > 0);
    assert_eq!(none, 0);
}

/// Drives a hedging machine: copy 1 fails non-fatally, copy 2 (started at once, A6-H2) is left
/// in flight, copy 3 starts after the delay and succeeds, cancelling copy 2 (A6-H3).
fn drive_hedging(m: &mut HedgingMachine) -> (Vec<String>, usize) {
    let (mut actions, mut events) = (Vec::new(), 0);
    let mut now = Instant::from_millis(0);
    for _ in 0..50 {
        while m.poll_event().is_some() {
            events += 1;
        }
        let Some(action) = m.poll_action() else {
            match m.poll_timeout() {
                Some(at) if !m.is_finished() => {
                    now = at;
                    m.handle_timeout(now);
                    continue;
                }
                _ => break,
            }
        };
        actions.push(format!("{action:?}"));
        match action {
            hedging::Action::SelectServer(copy) => {
                let server = member(copy.0 as u16);
                m.handle_server_selected(copy, server, now)
                    .expect("selecting");
            }
            hedging::Action::Dispatch { copy, .. } => {
                m.handle_sent(copy, now).expect("dispatched");
                if copy == CopyId(1) {
                    m.handle_failed(copy, overload_from(1), now)
                        .expect("in flight");
                } else if copy == CopyId(3) {
                    m.handle_succeeded(copy, now).expect("in flight");
                }
            }
            _ => {}
        }
    }
    (actions, events)
}

/// A6-H2, A6-H3: the copies, cancellations and result are the same without events.
#[test]
fn a_hedging_machine_without_events_takes_the_same_actions() {
    let policy = HedgingPolicy::new(3, Duration::from_millis(10), &[462]).expect("valid");
    let make = || {
        HedgingMachine::new(
            OperationKind::Read,
            OperationTimeout::Until(Instant::from_millis(1_000)),
            &policy,
            Instant::from_millis(0),
        )
        .expect("reads are hedgeable")
    };
    let (with, recorded) = drive_hedging(&mut make());
    let (without, none) = drive_hedging(&mut make().without_events());
    assert_eq!(with, without);
    assert!(with.iter().any(|a| a.starts_with("Cancel")), "{with:?}");
    assert!(
        with.last().is_some_and(|a| a.starts_with("Finished(Ok")),
        "{with:?}"
    );
    assert!(recorded > 0);
    assert_eq!(none, 0);
}

/// BP-8, BP-19: a machine restarted after an operation (finished, or left midway with a
/// deprioritized server and an error to raise) is exactly the new machine, with or without events,
/// and takes the same actions.
#[test]
fn a_restarted_retry_machine_is_a_new_machine() {
    let spec = OperationSpec::new(OperationKind::Read)
        .with_timeout(OperationTimeout::Until(Instant::from_millis(10_000)));
    let retarget = RetryOptions::default().enable_overload_retargeting(true);
    let current = RetryOptions::default();
    let t0 = Instant::from_millis(0);
    for events in [true, false] {
        let make = |options: &RetryOptions, seed| {
            let m = RetryMachine::new(spec, options, seed, t0);
            if events {
                m
            } else {
                m.without_events()
            }
        };
        // Finished: restarted with other options and another seed.
        let mut used = make(&retarget, 3);
        drive_retry(&mut used);
        assert!(used.is_finished());
        used.restart(spec, &current, 7, t0);
        assert_eq!(format!("{used:?}"), format!("{:?}", make(&current, 7)));
        assert_eq!(drive_retry(&mut used), drive_retry(&mut make(&current, 7)));
        // Midway: backing off after an overload failure, its server deprioritized.
        let mut midway = make(&retarget, 3);
        let _ = midway.poll_action();
        midway
            .handle_server_selected(
                member_server(
                    2,
                    ServerType::RsSecondary,
                    TopologyType::ReplicaSetWithPrimary,
                ),
                t0,
            )
            .expect("selecting");
        midway.handle_sent(t0).expect("dispatched");
        midway
            .handle_failed(overload_from(2), t0)
            .expect("in flight");
        assert_eq!(midway.deprioritized(), [member(2)]);
        midway.restart(spec, &current, 7, t0);
        assert_eq!(format!("{midway:?}"), format!("{:?}", make(&current, 7)));
    }
}

/// A6-H2, A6-H3: a hedging machine restarted after an operation, or midway with copies in
/// flight, is exactly the new machine and takes the same actions; a kind that cannot be hedged
/// is refused and changes nothing.
#[test]
fn a_restarted_hedging_machine_is_a_new_machine() {
    let policy = HedgingPolicy::new(3, Duration::from_millis(10), &[462]).expect("valid");
    let other = HedgingPolicy::new(4, Duration::from_millis(5), &[462]).expect("valid");
    let burst = HedgingPolicy::new(2, Duration::ZERO, &[]).expect("valid");
    let timeout = OperationTimeout::Until(Instant::from_millis(1_000));
    let t0 = Instant::from_millis(0);
    for events in [true, false] {
        let make = |policy: &HedgingPolicy| {
            let m = HedgingMachine::new(OperationKind::Read, timeout, policy, t0)
                .expect("reads are hedgeable");
            if events {
                m
            } else {
                m.without_events()
            }
        };
        let mut used = make(&other);
        drive_hedging(&mut used);
        used.restart(OperationKind::Read, timeout, &policy, t0)
            .expect("reads are hedgeable");
        assert_eq!(format!("{used:?}"), format!("{:?}", make(&policy)));
        assert_eq!(drive_hedging(&mut used), drive_hedging(&mut make(&policy)));
        // Midway: two copies selected at once (zero delay), none finished.
        let mut midway = make(&burst);
        while let Some(hedging::Action::SelectServer(copy)) = midway.poll_action() {
            midway
                .handle_server_selected(copy, member(copy.0 as u16), t0)
                .expect("selecting");
        }
        let before = format!("{midway:?}");
        assert!(midway
            .restart(OperationKind::RetryableWrite, timeout, &policy, t0)
            .is_err());
        assert_eq!(format!("{midway:?}"), before);
        midway
            .restart(OperationKind::Read, timeout, &policy, t0)
            .expect("reads are hedgeable");
        assert_eq!(format!("{midway:?}"), format!("{:?}", make(&policy)));
    }
}
