//! BSON decoding from a frame's bytes into a [`Document`]: the document, and the errors, of the
//! `bson` crate's `Document::try_from(&RawDocument)`, without its detours. That conversion copies
//! every embedded document and array into an owned `RawDocumentBuf` before converting it, and
//! turns every value into an owned `RawBson` first; here each value goes from the borrowed
//! `RawBsonRef` straight to its `Bson`, walking the same `bson` iterators (so validation and
//! error messages are the crate's own). The wire codec decodes every OP_MSG body and sequence
//! document with it.

use alloc::vec::Vec;
use bson::error::Error;
use bson::raw::{RawArray, RawBsonRef};
use bson::{Bson, Document, RawDocument};

/// The document `raw` holds, or the first error the `bson` crate's conversion would report.
pub(crate) fn document(raw: &RawDocument) -> Result<Document, Error> {
    let mut doc = Document::new();
    for element in raw {
        let (key, raw_value) = element?;
        doc.insert(key.as_str(), value(raw_value)?);
    }
    Ok(doc)
}

/// Checks `raw` as [`document`] reads it, without building anything: the same first error, or
/// none. (Only embedded documents, arrays and code-with-scope scopes can fail to convert once
/// the iterator has read a value.)
pub(crate) fn validate(raw: &RawDocument) -> Result<(), Error> {
    for element in raw {
        let (_, raw_value) = element?;
        validate_value(raw_value)?;
    }
    Ok(())
}

fn validate_value(raw: RawBsonRef<'_>) -> Result<(), Error> {
    match raw {
        RawBsonRef::Document(d) => validate(d),
        RawBsonRef::Array(a) => {
            for element in a {
                validate_value(element?)?;
            }
            Ok(())
        }
        RawBsonRef::JavaScriptCodeWithScope(code) => validate(code.scope),
        _ => Ok(()),
    }
}

fn array(raw: &RawArray) -> Result<Vec<Bson>, Error> {
    let mut values = Vec::new();
    for element in raw {
        values.push(value(element?)?);
    }
    Ok(values)
}

/// One value; the rare types go through the `bson` crate's own conversion.
fn value(raw: RawBsonRef<'_>) -> Result<Bson, Error> {
    Ok(match raw {
        RawBsonRef::Double(v) => Bson::Double(v),
        RawBsonRef::String(s) => Bson::String(s.into()),
        RawBsonRef::Document(d) => Bson::Document(document(d)?),
        RawBsonRef::Array(a) => Bson::Array(array(a)?),
        RawBsonRef::Boolean(b) => Bson::Boolean(b),
        RawBsonRef::Null => Bson::Null,
        RawBsonRef::Int32(v) => Bson::Int32(v),
        RawBsonRef::Int64(v) => Bson::Int64(v),
        RawBsonRef::Timestamp(t) => Bson::Timestamp(t),
        RawBsonRef::ObjectId(id) => Bson::ObjectId(id),
        RawBsonRef::DateTime(at) => Bson::DateTime(at),
        other => Bson::try_from(other)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;
    use alloc::vec;
    use bson::oid::ObjectId;
    use bson::spec::BinarySubtype;
    use bson::{doc, Binary, DateTime, Decimal128, JavaScriptCodeWithScope, Regex, Timestamp};
    use proptest::prelude::*;

    fn both(bytes: &[u8]) -> (Result<Document, String>, Result<Document, String>) {
        let ours = RawDocument::from_bytes(bytes)
            .map_err(|e| alloc::format!("{e}"))
            .and_then(|raw| document(raw).map_err(|e| alloc::format!("{e}")));
        let theirs = RawDocument::from_bytes(bytes)
            .map_err(|e| alloc::format!("{e}"))
            .and_then(|raw| Document::try_from(raw).map_err(|e| alloc::format!("{e}")));
        (ours, theirs)
    }

    /// WP-2: every BSON type, nested, decodes to the document the bson crate decodes.
    #[test]
    fn wp2_every_bson_type_decodes_as_the_bson_crate_decodes_it() {
        let doc = doc! {
            "double": 1.5, "string": "héllo", "array": [1, "two", [3], { "four": 4 }],
            "doc": { "a": { "b": null } }, "true": true, "false": false, "null": null,
            "regex": Regex {
                pattern: String::from("^a.*").try_into().unwrap(),
                options: String::from("imx").try_into().unwrap(),
            }, "code": Bson::JavaScriptCode("f()".into()),
            "scope": JavaScriptCodeWithScope { code: "g()".into(), scope: doc! { "x": 1 } },
            "int32": -7, "int64": 1_i64 << 40, "ts": Timestamp { time: 5, increment: 9 },
            "binary": Binary { subtype: BinarySubtype::Uuid, bytes: vec![1; 16] },
            "old": Binary { subtype: BinarySubtype::BinaryOld, bytes: vec![2, 3] },
            "oid": ObjectId::from_bytes([7; 12]), "date": DateTime::from_millis(-1),
            "symbol": Bson::Symbol("s".into()), "dec": Decimal128::from_bytes([4; 16]),
            "undefined": Bson::Undefined, "max": Bson::MaxKey, "min": Bson::MinKey,
            "": "empty key", "dup": 1,
        };
        let bytes = doc.to_vec().unwrap();
        let (ours, theirs) = both(&bytes);
        assert_eq!(ours, theirs);
        assert_eq!(ours.unwrap(), doc);
    }

    /// A document with a repeated key keeps the last value at the first position, as the bson
    /// crate's conversion does.
    #[test]
    fn a_repeated_key_decodes_as_the_bson_crate_decodes_it() {
        // {a: 1, b: 2, a: 3}
        let bytes = [
            26, 0, 0, 0, 0x10, b'a', 0, 1, 0, 0, 0, 0x10, b'b', 0, 2, 0, 0, 0, 0x10, b'a', 0, 3, 0,
            0, 0, 0,
        ];
        let (ours, theirs) = both(&bytes);
        assert_eq!(ours, theirs);
        assert_eq!(ours.unwrap(), doc! { "a": 3, "b": 2 });
    }

    proptest! {
        /// Any bytes (a valid document with bytes flipped, or noise) give the bson crate's
        /// document or its error.
        #[test]
        fn any_bytes_decode_as_the_bson_crate_decodes_them(
            flips in proptest::collection::vec((0_usize..200, any::<u8>()), 0..4),
            noise in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let doc = doc! {
                "ok": 1.0, "cursor": { "id": 0_i64, "ns": "db.c", "firstBatch": [{ "_id": 1 }] },
                "$clusterTime": { "clusterTime": Timestamp { time: 1, increment: 2 } },
                "errorLabels": ["RetryableError"], "s": "x",
            };
            let mut bytes = doc.to_vec().unwrap();
            for (at, byte) in flips {
                let len = bytes.len();
                bytes[at % len] = byte;
            }
            for bytes in [&bytes, &noise] {
                let (ours, theirs) = both(bytes);
                let checked = RawDocument::from_bytes(bytes)
                    .map_err(|e| alloc::format!("{e}"))
                    .and_then(|raw| validate(raw).map_err(|e| alloc::format!("{e}")));
                prop_assert_eq!(checked.is_ok(), theirs.is_ok());
                prop_assert_eq!(ours, theirs);
            }
        }
    }
}
