//! The retry machine's cost per operation: the happy path (one attempt that succeeds) and the
//! three-attempt overload path (two backoffs), against a trivial baseline in the same run.
//!
//! `cargo bench -p retry-core --bench retry_machine`

#![allow(missing_docs)] // criterion's macros generate undocumented functions.

use std::hint::black_box;

use bson::doc;
use criterion::{criterion_group, criterion_main, Criterion};
use retry_core::address::ServerAddress;
use retry_core::error::OperationError;
use retry_core::policy::RetryOptions;
use retry_core::retry::{Action, AttemptServer, OperationKind, OperationSpec, RetryMachine};
use retry_core::time::Instant;
use retry_core::topology::{ServerType, TopologyType};

fn server() -> AttemptServer {
    AttemptServer {
        address: ServerAddress::new("primary", 27017),
        server_type: ServerType::RsPrimary,
        topology_type: TopologyType::ReplicaSetWithPrimary,
        max_wire_version: 25,
        sessions_supported: true,
    }
}

/// Drives one operation to its end, failing each attempt with `errors[i]` while there are errors
/// left; returns the number of attempts.
fn operation(options: &RetryOptions, server: &AttemptServer, errors: &[OperationError]) -> u32 {
    let spec = OperationSpec::new(OperationKind::Read);
    let mut m = RetryMachine::new(spec, options, 7, Instant::ZERO);
    let mut now = Instant::ZERO;
    let mut failures = errors.iter();
    loop {
        match m.poll_action() {
            Some(Action::SelectServer) => {
                let _ = m.handle_server_selected(server.clone(), now);
            }
            Some(Action::Dispatch(_)) => {
                let _ = m.handle_sent(now);
                let _ = match failures.next() {
                    Some(e) => m.handle_failed(e.clone(), now),
                    None => m.handle_succeeded(now),
                };
            }
            Some(Action::Finished(result)) => {
                black_box(result.is_ok());
                break;
            }
            Some(_) => {}
            None => match m.poll_timeout() {
                Some(t) => {
                    now = t;
                    m.handle_timeout(now);
                }
                None => break,
            },
        }
        while let Some(e) = m.poll_event() {
            black_box(e);
        }
    }
    m.attempts()
}

fn benches(c: &mut Criterion) {
    let options = RetryOptions::default();
    let server = server();
    let reply =
        doc! { "ok": 0, "code": 462, "errorLabels": ["SystemOverloadedError", "RetryableError"] };
    let overload = OperationError::from_reply(&reply, &server.address).expect("an error");
    let errors = [overload.clone(), overload];
    assert_eq!(operation(&options, &server, &[]), 1);
    assert_eq!(operation(&options, &server, &errors), 3);

    let mut group = c.benchmark_group("retry_machine");
    group.bench_function("baseline: clone the server", |b| {
        b.iter(|| black_box(server.clone()))
    });
    group.bench_function("happy path (1 attempt)", |b| {
        b.iter(|| operation(&options, &server, &[]))
    });
    group.bench_function("overload path (3 attempts)", |b| {
        b.iter(|| operation(&options, &server, &errors))
    });
    group.finish();
}

criterion_group!(retry_machine, benches);
criterion_main!(retry_machine);
