//! OP_MSG encode and decode of a 1 KB and a 1 MB message, each next to a plain copy of the same
//! bytes, measured in the same run so the ratio is meaningful on a shared machine.
//!
//! `cargo bench -p retry-core --bench wire_codec`

#![allow(missing_docs)] // criterion's macros generate undocumented functions.

use bson::{doc, Document};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use retry_core::wire::{DocumentSequence, FrameDecoder, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES};
use std::hint::black_box;

/// A document of about 1 KB: a few scalar fields and a 900-byte string.
fn record(i: i32) -> Document {
    doc! { "_id": i, "name": "x".repeat(900), "qty": i64::from(i) * 3, "price": 9.5, "tags": ["a", "b"] }
}

/// A ~1 KB `find` reply, and a ~1 MB `insert` of 1024 records in a kind-1 sequence.
fn messages() -> Vec<(&'static str, OpMsg)> {
    let small = OpMsg::command(
        7,
        doc! { "cursor": { "firstBatch": [record(1)], "id": 0_i64, "ns": "db.c" }, "ok": 1.0 },
    );
    let mut large = OpMsg::command(8, doc! { "insert": "c", "ordered": true, "$db": "db" });
    large.sequences.push(DocumentSequence {
        identifier: "documents".into(),
        documents: (0..1024).map(record).collect(),
    });
    vec![("1KB", small), ("1MB", large)]
}

fn codec(c: &mut Criterion) {
    let mut group = c.benchmark_group("wire_codec");
    for (name, message) in messages() {
        let mut bytes = Vec::new();
        message
            .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut bytes)
            .unwrap();
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
