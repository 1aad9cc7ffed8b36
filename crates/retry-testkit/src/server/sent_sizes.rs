//! The sizes of a request's documents to insert as they arrived (review34 Y8, house rule 7).
//!
//! A real server measures a document to insert by its bytes as sent (`doc.objsize()` in
//! `fixDocumentForInsert`, `src/mongo/db/ops/insert.cpp`; `store::insert_refusal`). Once the
//! request is a `Document`, a key sent twice has only its last value left, and the document
//! measures smaller than it was: so the sizes are read from the encoded request, before it is
//! converted.

use bson::{RawBsonRef, RawDocument};
use retry_core::wire::RawOpMsg;

/// The size in bytes of each document `request` asks to insert, in the order the command
/// reads them: for `insert`, each entry of `documents` (the body's array, then the document
/// sequence's); for `bulkWrite`, each entry of `ops` (the body's, then the sequence's), the size
/// of its `document` when it has one. `None` where an entry holds no document (the command
/// refuses it). Empty for any other command.
pub(super) fn sent_sizes(request: &RawOpMsg) -> Vec<Option<usize>> {
    let name = match request.body.iter().next() {
        Some(Ok((name, _))) => name.as_str(),
        _ => return Vec::new(),
    };
    let (field, measure): (&str, fn(&RawDocument) -> Option<usize>) = match name {
        "insert" => ("documents", |d| Some(d.as_bytes().len())),
        "bulkWrite" => ("ops", |op| {
            op.get_document("document").ok().map(|d| d.as_bytes().len())
        }),
        _ => return Vec::new(),
    };
    let mut sizes = Vec::new();
    if let Ok(Some(RawBsonRef::Array(array))) = request.body.get(field) {
        for item in array {
            sizes.push(match item {
                Ok(RawBsonRef::Document(d)) => measure(d),
                _ => None,
            });
        }
    }
    for sequence in &request.sequences {
        if sequence.identifier == field {
            sizes.extend(sequence.documents.iter().map(|d| measure(d)));
        }
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Document};
    use retry_core::wire::{parse_frame_raw, DocumentSequence, OpMsg};

    /// `request` as it arrives, every key `dupB` of its documents sent as `dupA`: a document
    /// `{dupA: 1, dupB: 2}` arrives with `dupA` twice, and converts to `{dupA: 2}`.
    fn arrived(request: &OpMsg) -> RawOpMsg {
        let mut frame = Vec::new();
        request.encode(48_000_000, &mut frame).unwrap();
        for at in 0..frame.len() - 5 {
            if &frame[at..at + 5] == b"dupB\0" {
                frame[at + 3] = b'A';
            }
        }
        parse_frame_raw(&frame).unwrap()
    }

    fn repeated() -> Document {
        doc! { "dupA": 1, "dupB": 2 }
    }

    /// What `repeated()` measures as sent: the same bytes, one key renamed.
    fn repeated_size() -> usize {
        repeated().to_vec().unwrap().len()
    }

    /// Review34 Y8: an insert's documents are measured as sent, a key sent twice included
    /// (the converted document is smaller), from the body's array and from the document
    /// sequence alike.
    #[test]
    fn an_insert_measures_its_documents_as_sent() {
        let body = doc! { "insert": "c", "documents": [repeated()], "$db": "test" };
        let in_body = arrived(&OpMsg::command(1, body));
        let converted = retry_core::wire::to_document(&in_body.body).unwrap();
        let kept = converted.get_array("documents").unwrap()[0]
            .as_document()
            .unwrap();
        assert!(kept.to_vec().unwrap().len() < repeated_size());
        assert_eq!(sent_sizes(&in_body), vec![Some(repeated_size())]);
        let small = doc! { "_id": 1 };
        let mut request = OpMsg::command(2, doc! { "insert": "c", "$db": "test" });
        request.sequences.push(DocumentSequence {
            identifier: "documents".into(),
            documents: vec![small.clone(), repeated()],
        });
        assert_eq!(
            sent_sizes(&arrived(&request)),
            vec![Some(small.to_vec().unwrap().len()), Some(repeated_size())]
        );
    }

    /// Review34 Y8: a `bulkWrite`'s insert ops are measured by their `document`; other ops
    /// have none, and other commands no sizes.
    #[test]
    fn a_bulk_write_measures_its_insert_ops_documents() {
        let mut request = OpMsg::command(1, doc! { "bulkWrite": 1, "$db": "admin" });
        request.sequences.push(DocumentSequence {
            identifier: "ops".into(),
            documents: vec![
                doc! { "delete": 0, "filter": {} },
                doc! { "insert": 0, "document": repeated() },
            ],
        });
        assert_eq!(
            sent_sizes(&arrived(&request)),
            vec![None, Some(repeated_size())]
        );
        let find = OpMsg::command(1, doc! { "find": "c", "$db": "test" });
        assert!(sent_sizes(&arrived(&find)).is_empty());
    }
}
