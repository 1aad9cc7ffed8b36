//! The retry eligibility matrix as a table: operation kind × options × error labels × topology →
//! retried or not (and why not), backed off or not, deprioritized or not. Each row cites the rule.

mod support;

use retry_core::address::ServerAddress;
use retry_core::error::{NetworkErrorKind, NetworkPhase, OperationError};
use retry_core::policy::{RetryOptions, RetryPolicy};
use retry_core::retry::{
    AttemptServer, DenyReason, OperationKind, OperationSpec, RetryEvent, RetryMachine,
};
use retry_core::rng::FixedRng;
use retry_core::time::Instant;
use retry_core::topology::{ServerType, TopologyType};
use support::*;

#[derive(Debug, PartialEq)]
enum Expect {
    Retry { backoff: bool, deprioritize: bool },
    Deny(DenyReason),
}

const RETRY: Expect = Expect::Retry {
    backoff: false,
    deprioritize: false,
};
const RETRY_BACKOFF: Expect = Expect::Retry {
    backoff: true,
    deprioritize: false,
};
const RETRY_DEPRIORITIZE: Expect = Expect::Retry {
    backoff: false,
    deprioritize: true,
};
const RETRY_BACKOFF_DEPRIORITIZE: Expect = Expect::Retry {
    backoff: true,
    deprioritize: true,
};
const NOT_RETRYABLE: Expect = Expect::Deny(DenyReason::NotRetryable);
const DISABLED: Expect = Expect::Deny(DenyReason::DisabledByOption);
const CAP: Expect = Expect::Deny(DenyReason::Cap);

const RWE: [&str; 1] = ["RetryableWriteError"];
const OVERLOAD_ONLY: [&str; 1] = ["SystemOverloadedError"];

fn defaults() -> RetryOptions {
    RetryOptions::default()
}

fn standalone() -> AttemptServer {
    server("standalone", ServerType::Standalone, TopologyType::Single)
}

fn pre_4_4_primary() -> AttemptServer {
    AttemptServer {
        max_wire_version: 8,
        ..primary()
    }
}

fn load_balancer() -> AttemptServer {
    AttemptServer {
        sessions_supported: false,
        ..server("lb", ServerType::LoadBalancer, TopologyType::LoadBalanced)
    }
}

fn network(phase: NetworkPhase) -> OperationError {
    OperationError::network(NetworkErrorKind::Reset, phase, ServerAddress::new("x", 1))
}

/// Runs the first attempt of `kind` on `server`, fails it with `error`, and reports the decision.
fn decide(
    kind: OperationKind,
    options: &RetryOptions,
    server: AttemptServer,
    error: OperationError,
) -> Expect {
    let spec = OperationSpec::new(kind).with_txn_number(1);
    let mut m = RetryMachine::with_rng(spec, options, FixedRng(u64::MAX), Instant::ZERO);
    assert_eq!(
        m.poll_action(),
        Some(retry_core::retry::Action::SelectServer)
    );
    m.handle_server_selected(server, Instant::ZERO).unwrap();
    m.handle_sent(Instant::ZERO).unwrap();
    m.handle_failed(error, Instant::ZERO).unwrap();
    while let Some(event) = m.poll_event() {
        match event {
            RetryEvent::RetryScheduled {
                delay,
                deprioritized,
                ..
            } => {
                return Expect::Retry {
                    backoff: !delay.is_zero(),
                    deprioritize: deprioritized.is_some(),
                };
            }
            RetryEvent::RetryDenied { reason, .. } => return Expect::Deny(reason),
            _ => {}
        }
    }
    panic!("no retry decision was emitted");
}

#[test]
fn eligibility_matrix() {
    use OperationKind::*;
    let base = defaults();
    let no_reads = defaults().retry_reads(false);
    let no_writes = defaults().retry_writes(false);
    let retarget = defaults().enable_overload_retargeting(true);
    let zero = defaults().max_adaptive_retries(0).unwrap();
    let bucket = defaults().policy(RetryPolicy::token_bucket());
    let commit = CommitTransaction { again: false };
    let txn_read = InTransaction {
        read: true,
        first: false,
    };
    let txn_write = InTransaction {
        read: false,
        first: true,
    };

    #[rustfmt::skip]
    let rows: Vec<(&str, OperationKind, &RetryOptions, AttemptServer, OperationError, Expect)> = vec![
        ("RR-2 read, retryable code",                   Read, &base, primary(), error(91, &[]), RETRY),
        ("RR-2 read, other code",                       Read, &base, primary(), error(2, &[]), NOT_RETRYABLE),
        ("RR-5 read, retryReads=false",                 Read, &no_reads, primary(), error(91, &[]), DISABLED),
        ("RR-2 read, network error after send",         Read, &base, primary(), network(NetworkPhase::AfterSend), RETRY),
        ("HS-9 read, handshake network error",          Read, &base, primary(), network(NetworkPhase::Handshake), RETRY_BACKOFF),
        ("RR-2 read, pool cleared",                     Read, &base, primary(), OperationError::pool_cleared(ServerAddress::new("p", 1), "x"), RETRY),
        ("BP-9 read, retryable overload",               Read, &base, primary(), error(2, &OVERLOAD), RETRY_BACKOFF),
        ("BP-2 read, overload label alone",             Read, &base, primary(), error(2, &OVERLOAD_ONLY), NOT_RETRYABLE),
        ("BP-13 read, retryable code + overload label", Read, &base, primary(), error(91, &OVERLOAD_ONLY), RETRY_BACKOFF),
        ("BP-22 maxAdaptiveRetries=0 stops that too",   Read, &zero, primary(), error(91, &OVERLOAD_ONLY), CAP),
        ("BP-10 maxAdaptiveRetries=0, overload",        Read, &zero, primary(), error(2, &OVERLOAD), CAP),
        ("BP-9 read overload, retryReads=false",        Read, &no_reads, primary(), error(2, &OVERLOAD), DISABLED),
        ("BP-19 read overload, retargeting on",         Read, &retarget, primary(), error(2, &OVERLOAD), RETRY_BACKOFF_DEPRIORITIZE),
        ("RR-7 read, retargeting on, not overload",     Read, &retarget, primary(), error(91, &[]), RETRY),
        ("BP-20 sharded read, retryable code",          Read, &base, mongos("m"), error(91, &[]), RETRY_DEPRIORITIZE),
        ("BP-20 sharded read overload, retargeting off", Read, &base, mongos("m"), error(2, &OVERLOAD), RETRY_BACKOFF_DEPRIORITIZE),
        ("LB is not sharded",                           Read, &base, load_balancer(), error(91, &[]), RETRY),
        ("TB-6 token bucket always deprioritizes",      Read, &bucket, primary(), error(2, &OVERLOAD), RETRY_BACKOFF_DEPRIORITIZE),
        ("RW-8 write, RetryableWriteError",             RetryableWrite, &base, primary(), error(91, &RWE), RETRY),
        ("RW-9 write, 4.4+ code without label",         RetryableWrite, &base, primary(), error(91, &[]), NOT_RETRYABLE),
        ("RW-9 write, pre-4.4 code gets the label",     RetryableWrite, &base, pre_4_4_primary(), error(91, &[]), RETRY),
        ("RW-9 write, pre-4.4 134 is not a write code", RetryableWrite, &base, pre_4_4_primary(), error(134, &[]), NOT_RETRYABLE),
        ("RW-9 write, network error gets the label",    RetryableWrite, &base, primary(), network(NetworkPhase::AfterSend), RETRY),
        ("RW-1 write, retryWrites=false",               RetryableWrite, &no_writes, primary(), error(91, &RWE), DISABLED),
        ("RW-2 write on a standalone",                  RetryableWrite, &base, standalone(), error(91, &RWE), NOT_RETRYABLE),
        ("RW-2 LB supports retryable writes",           RetryableWrite, &base, load_balancer(), error(91, &RWE), RETRY),
        ("BP-5 standalone write, overload",             RetryableWrite, &base, standalone(), error(2, &OVERLOAD), RETRY_BACKOFF),
        ("BP-9 write overload, retryWrites=false",      RetryableWrite, &no_writes, primary(), error(2, &OVERLOAD), DISABLED),
        ("RW-4 updateMany, RetryableWriteError",        NonRetryableWrite, &base, primary(), error(91, &RWE), NOT_RETRYABLE),
        ("BP-5 updateMany, overload",                   NonRetryableWrite, &base, primary(), error(2, &OVERLOAD), RETRY_BACKOFF),
        ("RR-4 getMore, retryable code",                GetMore, &base, primary(), error(91, &[]), NOT_RETRYABLE),
        ("BP-5 getMore, overload",                      GetMore, &base, primary(), error(2, &OVERLOAD), RETRY_BACKOFF),
        ("BP-9 getMore overload, retryReads=false",     GetMore, &no_reads, primary(), error(2, &OVERLOAD), DISABLED),
        ("BP-11 runCommand, overload",                  RunCommand, &base, primary(), error(2, &OVERLOAD), RETRY_BACKOFF),
        ("BP-11 runCommand, retryReads=false",          RunCommand, &no_reads, primary(), error(2, &OVERLOAD), DISABLED),
        ("BP-11 runCommand, retryWrites=false",         RunCommand, &no_writes, primary(), error(2, &OVERLOAD), DISABLED),
        ("RW-5 runCommand, retryable code",             RunCommand, &base, primary(), error(91, &RWE), NOT_RETRYABLE),
        ("TX-10 commit, retryWrites=false",             commit, &no_writes, primary(), error(91, &RWE), RETRY),
        ("TX-10 abort, network error",                  AbortTransaction, &no_writes, primary(), network(NetworkPhase::AfterSend), RETRY),
        ("TX-10 commit, not retryable",                 commit, &base, primary(), error(2, &[]), NOT_RETRYABLE),
        ("RR-5 read in a transaction",                  txn_read, &base, primary(), error(91, &[]), NOT_RETRYABLE),
        ("TX-12 read in a transaction, overload",       txn_read, &base, primary(), error(2, &OVERLOAD), RETRY_BACKOFF),
        ("TX-9 write in a transaction",                 txn_write, &base, primary(), error(91, &RWE), NOT_RETRYABLE),
        ("TX-12 write in a transaction, overload",      txn_write, &base, primary(), error(2, &OVERLOAD), RETRY_BACKOFF),
        ("TX-12 transaction write, retryWrites=false",  txn_write, &no_writes, primary(), error(2, &OVERLOAD), DISABLED),
    ];
    let mut failures = Vec::new();
    for (name, kind, options, server, error, expected) in rows {
        let got = decide(kind, options, server, error);
        if got != expected {
            failures.push(format!("{name}: expected {expected:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
