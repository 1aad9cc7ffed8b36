//! The messages the wire-codec measurements use, shared by `benches/wire_codec.rs` and
//! `examples/wire_codec_calls.rs`.

use bson::{doc, Document};
use retry_core::wire::{DocumentSequence, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES};

/// A document of about 1 KB: a few scalar fields and a 900-byte string.
fn record(i: i32) -> Document {
    doc! { "_id": i, "name": "x".repeat(900), "qty": i64::from(i) * 3, "price": 9.5, "tags": ["a", "b"] }
}

/// The message of a size class: `"1KB"` is a `find` reply with one record; `"1MB"` is an `insert`
/// of 1024 records in a kind-1 sequence.
pub fn message(size: &str) -> Option<OpMsg> {
    match size {
        "1KB" => Some(OpMsg::command(
            7,
            doc! { "cursor": { "firstBatch": [record(1)], "id": 0_i64, "ns": "db.c" }, "ok": 1.0 },
        )),
        "1MB" => {
            let mut large = OpMsg::command(8, doc! { "insert": "c", "ordered": true, "$db": "db" });
            large.sequences.push(DocumentSequence {
                identifier: "documents".into(),
                documents: (0..1024).map(record).collect(),
            });
            Some(large)
        }
        _ => None,
    }
}

/// The encoded bytes of `message`.
pub fn encoded(message: &OpMsg) -> Vec<u8> {
    let mut bytes = Vec::new();
    message
        .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut bytes)
        .expect("the benchmark messages encode");
    bytes
}
