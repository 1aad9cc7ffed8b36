//! Prints, in virtual time, the attempt timeline of the client-backpressure prose scenarios under
//! each retry policy: attempt, start time, server, outcome, backoff and deadline.
//!
//! Run with `cargo run -p retry-core --example timeline`. Everything is deterministic: jitter is
//! pinned (just below 1, the worst case, unless a scenario says otherwise) and time is virtual, so
//! the output is the same on every run.

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson};
use retry_core::address::ServerAddress;
use retry_core::budget::GrpcThrottle;
use retry_core::error::{ErrorClass, OperationError};
use retry_core::policy::{GrpcPolicy, RetryOptions, RetryPolicy};
use retry_core::retry::{AttemptServer, OperationKind, OperationSpec, RetryEvent, RetryMachine};
use retry_core::rng::FixedRng;
use retry_core::scenario::{self, Script, StepOutcome, Trace};
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::{ServerType, TopologyType};

/// Each attempt takes this long in virtual time.
const LATENCY: Duration = Duration::from_millis(5);

struct Scenario {
    title: &'static str,
    kind: OperationKind,
    error: OperationError,
    timeout_ms: Option<u64>,
    max_adaptive_retries: i64,
    jitter: FixedRng,
}

fn overload(code: i32, extra: bson::Document) -> OperationError {
    let labels = vec![
        Bson::from("SystemOverloadedError"),
        Bson::from("RetryableError"),
    ];
    let mut reply = doc! { "ok": 0, "code": code, "errmsg": "overloaded", "errorLabels": labels };
    reply.extend(extra);
    OperationError::from_reply(&reply, &ServerAddress::new("primary", 27017))
        .expect("an error reply")
}

fn policies() -> Vec<(&'static str, RetryOptions)> {
    let grpc = GrpcPolicy::new(
        5,
        Duration::from_millis(100),
        Duration::from_secs(10),
        2.0,
        &[2, 91, 462],
    )
    .expect("valid gRPC policy")
    .with_throttle(Arc::new(
        GrpcThrottle::new(10.0, 0.1).expect("valid throttle"),
    ));
    vec![
        (
            "no retries",
            RetryOptions::default()
                .retry_reads(false)
                .retry_writes(false),
        ),
        ("current (default)", RetryOptions::default()),
        (
            "token bucket (v0/v1)",
            RetryOptions::default().policy(RetryPolicy::token_bucket()),
        ),
        (
            "gRPC A6 + throttle",
            RetryOptions::default().policy(RetryPolicy::Grpc(Arc::new(grpc))),
        ),
    ]
}

fn main() {
    let primary = AttemptServer {
        address: ServerAddress::new("primary", 27017),
        server_type: ServerType::RsPrimary,
        topology_type: TopologyType::ReplicaSetWithPrimary,
        max_wire_version: 25,
        sessions_supported: true,
    };
    let scenarios = [
        Scenario {
            title: "prose 1: insertOne, alwaysOn overload (code 2), jitter 0",
            kind: OperationKind::RetryableWrite,
            error: overload(2, doc! {}),
            timeout_ms: None,
            max_adaptive_retries: 2,
            jitter: FixedRng(0),
        },
        Scenario {
            title: "prose 1: insertOne, alwaysOn overload (code 2), jitter just below 1",
            kind: OperationKind::RetryableWrite,
            error: overload(2, doc! {}),
            timeout_ms: None,
            max_adaptive_retries: 2,
            jitter: FixedRng(u64::MAX),
        },
        Scenario {
            title: "prose 3: find, alwaysOn 462 IngressRequestRateLimitExceeded",
            kind: OperationKind::Read,
            error: overload(462, doc! {}),
            timeout_ms: None,
            max_adaptive_retries: 2,
            jitter: FixedRng(u64::MAX),
        },
        Scenario {
            title: "prose 4: find, alwaysOn 462, maxAdaptiveRetries=1",
            kind: OperationKind::Read,
            error: overload(462, doc! {}),
            timeout_ms: None,
            max_adaptive_retries: 1,
            jitter: FixedRng(u64::MAX),
        },
        Scenario {
            title: "prose 5: find, alwaysOn 462 with baseBackoffMS=50",
            kind: OperationKind::Read,
            error: overload(462, doc! { "baseBackoffMS": 50 }),
            timeout_ms: None,
            max_adaptive_retries: 2,
            jitter: FixedRng(u64::MAX),
        },
        Scenario {
            title: "find, alwaysOn 462 under CSOT timeoutMS=300",
            kind: OperationKind::Read,
            error: overload(462, doc! {}),
            timeout_ms: Some(300),
            max_adaptive_retries: 2,
            jitter: FixedRng(u64::MAX),
        },
    ];
    for scenario in &scenarios {
        println!("== {}", scenario.title);
        for (name, options) in policies() {
            let options = options
                .max_adaptive_retries(scenario.max_adaptive_retries)
                .expect("valid option");
            let timeout = match scenario.timeout_ms {
                Some(ms) => {
                    OperationTimeout::from_timeout_ms(Instant::ZERO, Duration::from_millis(ms))
                }
                None => OperationTimeout::Off,
            };
            let spec = OperationSpec::new(scenario.kind)
                .with_txn_number(1)
                .with_timeout(timeout);
            let mut machine =
                RetryMachine::with_rng(spec, &options, scenario.jitter, Instant::ZERO);
            let script =
                Script::new().then_after(LATENCY, StepOutcome::Fail(scenario.error.clone()));
            let trace = scenario::run(
                &mut machine,
                std::slice::from_ref(&primary),
                &script,
                Instant::ZERO,
            );
            print_timeline(name, &trace, timeout);
        }
        println!();
    }
}

fn print_timeline(policy: &str, trace: &Trace, timeout: OperationTimeout) {
    let deadline = match timeout.deadline() {
        Some(t) => t.to_string(),
        None => "none".to_string(),
    };
    println!("  -- policy: {policy}");
    println!(
        "     {:<8} {:<10} {:<16} {:<48} {:<22} deadline",
        "attempt", "start", "server", "outcome", "backoff"
    );
    let mut row: Option<(u32, Instant, String, String)> = None;
    let flush = |row: &mut Option<(u32, Instant, String, String)>, backoff: &str| {
        if let Some((attempt, start, server, outcome)) = row.take() {
            println!(
                "     {attempt:<8} {:<10} {server:<16} {outcome:<48} {backoff:<22} {deadline}",
                start.to_string()
            );
        }
    };
    for (at, event) in &trace.events {
        match event {
            RetryEvent::CommandStarted { attempt, address } => {
                flush(&mut row, "-");
                row = Some((*attempt, *at, address.to_string(), String::new()));
            }
            RetryEvent::CommandSucceeded { .. } => {
                if let Some(r) = row.as_mut() {
                    r.3 = "ok".into();
                }
            }
            RetryEvent::CommandFailed { error, .. } => {
                if let Some(r) = row.as_mut() {
                    r.3 = match (error.class, error.code) {
                        (ErrorClass::Server, Some(code)) => {
                            format!("error {code} {}", labels(error.labels))
                        }
                        (class, _) => format!("{class:?} {}", labels(error.labels)),
                    };
                }
            }
            RetryEvent::RetryScheduled { delay, .. } => flush(&mut row, &millis(*delay)),
            RetryEvent::RetryDenied { reason, .. } => flush(&mut row, &format!("stop: {reason}")),
        }
    }
    flush(&mut row, "-");
    let outcome = match trace.result() {
        Some(Ok(())) => "succeeded".to_string(),
        Some(Err(e)) => format!(
            "failed with {}",
            e.summary()
                .code
                .map_or_else(|| format!("{:?}", e.summary().class), |c| c.to_string())
        ),
        None => "did not finish".to_string(),
    };
    let finished = trace
        .finished_at()
        .map_or_else(|| "-".to_string(), |t| t.to_string());
    println!(
        "     => {outcome} after {} attempts, at {finished}",
        trace.commands_started()
    );
}

fn labels(labels: retry_core::error::Labels) -> String {
    format!("[{}]", labels.names().collect::<Vec<_>>().join(", "))
}

fn millis(d: Duration) -> String {
    if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.3} ms", d.as_secs_f64() * 1000.0)
    }
}
