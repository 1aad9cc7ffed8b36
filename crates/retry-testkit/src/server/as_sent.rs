//! A request's documents to insert as they arrived (review34 Y8, house rule 7).
//!
//! A real server checks a document to insert as it was sent (`fixDocumentForInsert`,
//! `src/mongo/db/ops/insert.cpp`: its `objsize()`, then each element, refusing `_id` twice;
//! `store::insert_refusal`). Once the request is a `Document`, a key sent twice has only its
//! last value left, and the document measures smaller than it was: so both are read from the
//! encoded request, before it is converted.

use bson::{RawBsonRef, RawDocument};
use retry_core::wire::RawOpMsg;

use crate::store::AsSent;

/// Each document `request` asks to insert as it was sent, in the order the command reads them:
/// for `insert`, each entry of `documents` (the body's array, then the document sequence's); for
/// `bulkWrite`, each entry of `ops` (the body's, then the sequence's), its `document` when it has
/// one. `None` where an entry holds no document (the command refuses it). Empty for any other
/// command.
pub(super) fn as_sent(request: &RawOpMsg) -> Vec<Option<AsSent>> {
    let name = match request.body.iter().next() {
        Some(Ok((name, _))) => name.as_str(),
        _ => return Vec::new(),
    };
    let (field, read): (&str, fn(&RawDocument) -> Option<AsSent>) = match name {
        "insert" => ("documents", |d| Some(document(d))),
        "bulkWrite" => ("ops", |op| op.get_document("document").ok().map(document)),
        _ => return Vec::new(),
    };
    let mut documents = Vec::new();
    if let Ok(Some(RawBsonRef::Array(array))) = request.body.get(field) {
        for item in array {
            documents.push(match item {
                Ok(RawBsonRef::Document(d)) => read(d),
                _ => None,
            });
        }
    }
    for sequence in &request.sequences {
        if sequence.identifier == field {
            documents.extend(sequence.documents.iter().map(|d| read(d)));
        }
    }
    documents
}

/// `document` as it was sent: its size, whether it holds `_id` twice, and (review36 V6) the type
/// of an `_id` the server refuses, met before a second `_id` (`store::refused_id_type`).
fn document(document: &RawDocument) -> AsSent {
    let mut sent = AsSent {
        size: document.as_bytes().len(),
        repeated_id: false,
        refused_id: None,
    };
    let ids = document.iter().filter_map(|element| match element {
        Ok((key, value)) if key.as_str() == "_id" => Some(value.element_type()),
        _ => None,
    });
    for (index, kind) in ids.take(2).enumerate() {
        sent.refused_id = crate::store::refused_id_type(kind);
        if sent.refused_id.is_some() {
            break;
        }
        sent.repeated_id = index == 1;
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Document};
    use retry_core::wire::{parse_frame_raw, DocumentSequence, OpMsg};

    /// `request` as it arrives, every key `dupB` of its documents sent as `dupA` and every `_iX`
    /// as `_id`: a document `{dupA: 1, dupB: 2}` arrives with `dupA` twice, and converts to
    /// `{dupA: 2}`.
    fn arrived(request: &OpMsg) -> RawOpMsg {
        let mut frame = Vec::new();
        request.encode(48_000_000, &mut frame).unwrap();
        for at in 0..frame.len() - 5 {
            if &frame[at..at + 5] == b"dupB\0" {
                frame[at + 3] = b'A';
            }
            if &frame[at..at + 4] == b"_iX\0" {
                frame[at + 2] = b'd';
            }
        }
        parse_frame_raw(&frame).unwrap()
    }

    fn repeated() -> Document {
        doc! { "dupA": 1, "dupB": 2 }
    }

    /// `document` as it is sent: the same size, its keys renamed.
    fn sent(document: &Document, repeated_id: bool) -> Option<AsSent> {
        Some(AsSent {
            size: document.to_vec().unwrap().len(),
            repeated_id,
            refused_id: None,
        })
    }

    /// Review34 Y8: an insert's documents are measured as sent, a key sent twice included
    /// (the converted document is smaller), from the body's array and from the document
    /// sequence alike; an `_id` sent twice is seen.
    #[test]
    fn an_insert_reads_its_documents_as_sent() {
        let body = doc! { "insert": "c", "documents": [repeated()], "$db": "test" };
        let in_body = arrived(&OpMsg::command(1, body));
        let converted = retry_core::wire::to_document(&in_body.body).unwrap();
        let kept = converted.get_array("documents").unwrap()[0]
            .as_document()
            .unwrap();
        assert!(kept.to_vec().unwrap().len() < repeated().to_vec().unwrap().len());
        assert_eq!(as_sent(&in_body), vec![sent(&repeated(), false)]);
        let ids = doc! { "_id": 1, "_iX": 2 };
        let mut request = OpMsg::command(2, doc! { "insert": "c", "$db": "test" });
        request.sequences.push(DocumentSequence {
            identifier: "documents".into(),
            documents: vec![ids.clone(), repeated()],
        });
        assert_eq!(
            as_sent(&arrived(&request)),
            vec![sent(&ids, true), sent(&repeated(), false)]
        );
    }

    /// Review34 Y8: a `bulkWrite`'s insert ops are read by their `document`; other ops have
    /// none, and other commands nothing.
    #[test]
    fn a_bulk_write_reads_its_insert_ops_documents() {
        let mut request = OpMsg::command(1, doc! { "bulkWrite": 1, "$db": "admin" });
        request.sequences.push(DocumentSequence {
            identifier: "ops".into(),
            documents: vec![
                doc! { "delete": 0, "filter": {} },
                doc! { "insert": 0, "document": repeated() },
            ],
        });
        assert_eq!(
            as_sent(&arrived(&request)),
            vec![None, sent(&repeated(), false)]
        );
        let find = OpMsg::command(1, doc! { "find": "c", "$db": "test" });
        assert!(as_sent(&arrived(&find)).is_empty());
    }
}
