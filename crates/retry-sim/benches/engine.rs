//! The engine's full per-operation cost in the simulated driver (select among three mongos, check
//! out, encode, decode the reply, check in, finish), against the codec work of the same OP_MSG
//! round trip alone, measured in the same run (docs/benchmarks.md, "Engine").
//!
//! `cargo bench -p retry-sim --bench engine`

use std::hint::black_box;

use criterion::{criterion_main, Criterion};

use retry_sim::engine_ops;

fn engine(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine");
    let (request, reply) = engine_ops::round_trip_messages();
    group.bench_function("baseline-codec-round-trip", |b| {
        b.iter(|| engine_ops::codec_round_trip(black_box(&request), black_box(&reply)))
    });
    let mut sim = engine_ops::three_mongos();
    group.bench_function("operation-3-mongos", |b| {
        b.iter(|| engine_ops::one_operation(&mut sim))
    });
    group.finish();
}

/// Private, so the function the macro generates needs no documentation.
mod group {
    criterion::criterion_group!(engine, super::engine);
}
criterion_main!(group::engine);
