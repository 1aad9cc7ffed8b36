//! Simulated attempts per second of `retry-lab simulate`'s model, one run on one core.
//!
//! `cargo bench -p retry-lab --bench simulate` reports the throughput in attempts (elements) per
//! second. For instructions per attempt, run the `callgrind` mode under valgrind (see
//! docs/benchmarks.md): `cargo bench -p retry-lab --bench simulate --no-run`, then
//! `valgrind --tool=callgrind <bench binary> callgrind <policy>`; it prints the attempts it
//! simulated, and callgrind the instructions. `callgrind default` runs every run of the default
//! `retry-lab simulate --seed 1` (nine policies, ten loads and the episode each) without writing
//! the CSV and SVG files; `callgrind default DIR` also writes them into DIR.

use std::time::Duration;

use clap::Parser;
use criterion::{Criterion, Throughput};
use retry_lab::cli::{Cli, Command};
use retry_lab::simulate::model::{run, Cluster, Load, RunSpec};
use retry_lab::simulate::policy::SimPolicy;
use retry_lab::simulate::{output, simulate, SimulateArgs};

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

/// The options of `retry-lab simulate --seed 1` (its defaults), parsed by the real command line.
fn default_args() -> SimulateArgs {
    let cli = Cli::parse_from(["retry-lab", "simulate", "--seed", "1"]);
    match cli.into_command() {
        Command::Simulate(args) => args,
        _ => unreachable!("`simulate` parses as the simulate command"),
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
        let attempts = run(&cluster, &spec)
            .expect("a valid cluster")
            .total_attempts;
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
        if name == "default" {
            let report = simulate(&default_args()).expect("the defaults are valid");
            println!("{} attempts (default run)", report.total_attempts);
            // `callgrind default DIR` also writes the CSV and SVG files, to compare with `cmp`.
            if let Some(dir) = args.next() {
                output::write(&report, std::path::Path::new(&dir)).expect("the files are written");
            }
            return;
        }
        let policy = SimPolicy::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .unwrap_or(SimPolicy::Current);
        let result = run(&Cluster::default(), &spec(policy)).expect("a valid cluster");
        println!("{} attempts ({})", result.total_attempts, policy.name());
        return;
    }
    group::benches();
    Criterion::default().configure_from_args().final_summary();
}
