//! OP_MSG encode and decode of a 1 KB and a 1 MB message, each next to a plain copy of the same
//! bytes, measured in the same run so the ratio is meaningful on a shared machine.
//!
//! `cargo bench -p retry-core --bench wire_codec`

#![allow(missing_docs)] // criterion's macros generate undocumented functions.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use retry_core::wire::{FrameDecoder, DEFAULT_MAX_MESSAGE_SIZE_BYTES};
use std::hint::black_box;

#[path = "support/wire_messages.rs"]
mod wire_messages;

fn codec(c: &mut Criterion) {
    let mut group = c.benchmark_group("wire_codec");
    for name in ["1KB", "1MB"] {
        let message = wire_messages::message(name).expect("a size class");
        let bytes = wire_messages::encoded(&message);
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_with_input(BenchmarkId::new("copy", name), &bytes, |b, bytes| {
            b.iter(|| black_box(bytes.as_slice()).to_vec())
        });
        group.bench_with_input(BenchmarkId::new("encode", name), &message, |b, m| {
            b.iter(|| {
                let mut out = Vec::new();
                m.encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut out).unwrap();
                out
            })
        });
        group.bench_with_input(BenchmarkId::new("decode", name), &bytes, |b, bytes| {
            b.iter(|| {
                let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
                decoder.decode(black_box(bytes)).unwrap().1.unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
