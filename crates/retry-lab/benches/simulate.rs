//! Simulated attempts per second of `retry-lab simulate`'s model, one run on one core.
//!
//! `cargo bench -p retry-lab --bench simulate` reports the throughput in attempts (elements) per
//! second. For instructions per attempt, run the `callgrind` mode under valgrind (see
//! docs/benchmarks.md): `cargo bench -p retry-lab --bench simulate --no-run`, then
//! `valgrind --tool=callgrind <bench binary> callgrind <policy>`; it prints the attempts it
//! simulated, and callgrind the instructions.

use std::time::Duration;

use criterion::{Criterion, Throughput};
use retry_lab::simulate::model::{run, Cluster, Load, RunSpec};
use retry_lab::simulate::policy::SimPolicy;

fn spec(policy: SimPolicy) -> RunSpec {
    RunSpec {
        policy,
        load: Load::Steady(2.0),
        duration: Duration::from_secs(2),
        warmup: Duration::from_secs(1),
        bucket: Duration::from_millis(250),
        seed: 1,
    }
}

fn attempts_per_second(c: &mut Criterion) {
    let cluster = Cluster::default();
    let mut group = c.benchmark_group("simulate");
    group.sample_size(10);
    for policy in [
        SimPolicy::NoRetries,
        SimPolicy::Current,
        SimPolicy::GrpcHedging,
        SimPolicy::AwsStandard,
    ] {
        let spec = spec(policy);
        let attempts = run(&cluster, &spec).total_attempts;
        group.throughput(Throughput::Elements(attempts));
        group.bench_function(policy.name(), |b| b.iter(|| run(&cluster, &spec)));
    }
    group.finish();
}

/// Private, so the function the macro generates needs no documentation.
mod group {
    criterion::criterion_group!(benches, super::attempts_per_second);
}

fn main() {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("callgrind") {
        let name = args.next().unwrap_or_else(|| "current".into());
        let policy = SimPolicy::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .unwrap_or(SimPolicy::Current);
        let result = run(&Cluster::default(), &spec(policy));
        println!("{} attempts ({})", result.total_attempts, policy.name());
        return;
    }
    group::benches();
    Criterion::default().configure_from_args().final_summary();
}
