//! Criterion timings of one server selection on 3, 50 and 1000 servers: a tagged replica set read
//! and a sharded write, each with one deprioritized address, against a trivial baseline (one pass
//! over the servers) in the same run (docs/benchmarks.md).

use std::hint::black_box;

use criterion::{criterion_main, BenchmarkId, Criterion};
use retry_core::rng::EngineRng;
use retry_core::selection::{select_server, SelectionSettings};

#[path = "support/topologies.rs"]
mod topologies;

fn selection(c: &mut Criterion) {
    let settings = SelectionSettings::default();
    let mut group = c.benchmark_group("select_server");
    for n in topologies::SIZES {
        for case in [topologies::replica_set_with_tags(n), topologies::sharded(n)] {
            let mut rng = EngineRng::from_seed_u64(1);
            let baseline = format!("baseline-{}", case.shape);
            group.bench_with_input(BenchmarkId::new(baseline, n), &case, |b, case| {
                b.iter(|| {
                    let servers = &black_box(case).topology.servers;
                    servers.iter().filter(|s| s.is_available()).count()
                })
            });
            group.bench_with_input(BenchmarkId::new(case.shape, n), &case, |b, case| {
                b.iter(|| {
                    select_server(
                        black_box(&case.topology),
                        black_box(&case.criteria),
                        black_box(&case.deprioritized),
                        &settings,
                        topologies::operation_count,
                        &mut rng,
                    )
                    .map(|s| s.map(|s| s.address.port()))
                })
            });
        }
    }
    group.finish();
}

/// Private, so the function the macro generates needs no documentation.
mod group {
    criterion::criterion_group!(selection, super::selection);
}
criterion_main!(group::selection);
