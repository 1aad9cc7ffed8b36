//! BSON encoding straight into an output buffer: the bytes the `bson` crate's
//! `Document::to_writer` produces, without its intermediate buffer per document (one allocation
//! and up to five reallocations for a small command) or its `String` per array index. The wire
//! codec writes every OP_MSG body and sequence document with it (the engine's `$db` and `lsid`
//! are appended by `wire::append_db` / `wire::append_lsid`, without building documents).
//!
//! Layout (bsonspec.org): a document is its int32 length, its elements, and a 0 byte; an element
//! is its type byte, its key as a NUL-terminated string, and its value. A key with a NUL byte, or
//! a document longer than `i32::MAX`, is an error, as in the `bson` crate.

use alloc::vec::Vec;
use bson::spec::BinarySubtype;
use bson::{Bson, Document};

/// Why a value could not be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WriteError {
    /// A key (or a regular expression's pattern or options) contains a NUL byte.
    Nul,
    /// A length does not fit BSON's int32.
    TooLong(usize),
}

/// Appends `doc` to `out`. On error `out` may hold a partial document; the caller truncates it.
pub(crate) fn document(doc: &Document, out: &mut Vec<u8>) -> Result<(), WriteError> {
    let start = open(out);
    for (key, value) in doc {
        element(key, value, out)?;
    }
    close(start, out)
}

/// Appends one element: `value`'s type byte, `key`, the value.
pub(crate) fn element(key: &str, value: &Bson, out: &mut Vec<u8>) -> Result<(), WriteError> {
    // The usual scalars of a command are written in one step (issue 9).
    match value {
        Bson::Int32(v) => scalar(0x10, key, &v.to_le_bytes(), out),
        Bson::Int64(v) => scalar(0x12, key, &v.to_le_bytes(), out),
        Bson::Double(v) => scalar(0x01, key, &v.to_le_bytes(), out),
        Bson::Boolean(b) => scalar(0x08, key, &[u8::from(*b)], out),
        Bson::String(text) => {
            let len = int32(text.len() + 1)?;
            scalar(0x02, key, &len.to_le_bytes(), out)?;
            out.extend_from_slice(text.as_bytes());
            out.push(0);
            Ok(())
        }
        _ => {
            self::key(value.element_type() as u8, key, out)?;
            self::value(value, out)
        }
    }
}

/// One element of a fixed-size type: its type byte, `key` and the value's bytes, with one
/// reservation.
#[inline(always)]
fn scalar(element_type: u8, key: &str, value: &[u8], out: &mut Vec<u8>) -> Result<(), WriteError> {
    let key = key.as_bytes();
    if key.contains(&0) {
        return Err(WriteError::Nul);
    }
    out.reserve(key.len() + 2 + value.len());
    out.push(element_type);
    out.extend_from_slice(key);
    out.push(0);
    out.extend_from_slice(value);
    Ok(())
}

/// Appends the elements of the encoded document `raw`, which [`crate::bson_read::validate`]
/// accepted, except those whose key `except` has (issue 9: an operation's command kept encoded,
/// sent with the engine's fields, which replace the command's own of the same name). With
/// nothing to leave out, its elements are one copy.
pub(crate) fn elements_except(raw: &bson::RawDocument, except: &Document, out: &mut Vec<u8>) {
    let bytes = raw.as_bytes();
    if except.is_empty() {
        out.extend_from_slice(&bytes[4..bytes.len() - 1]);
        return;
    }
    for (key, tag, value) in crate::bson_read::Elements::of(raw) {
        if except.keys().any(|k| k.as_bytes() == key) {
            continue;
        }
        out.push(tag);
        out.extend_from_slice(key);
        out.push(0);
        out.extend_from_slice(value);
    }
}

/// Reserves a document's length and returns where it starts.
fn open(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    start
}

/// Ends the document opened at `start`: its 0 byte, then its length.
fn close(start: usize, out: &mut Vec<u8>) -> Result<(), WriteError> {
    out.push(0);
    let len = int32(out.len() - start)?;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

fn int32(len: usize) -> Result<i32, WriteError> {
    i32::try_from(len).map_err(|_| WriteError::TooLong(len))
}

fn key(element_type: u8, key: &str, out: &mut Vec<u8>) -> Result<(), WriteError> {
    out.push(element_type);
    cstring(key, out)
}

fn cstring(s: &str, out: &mut Vec<u8>) -> Result<(), WriteError> {
    if s.as_bytes().contains(&0) {
        return Err(WriteError::Nul);
    }
    out.extend_from_slice(s.as_bytes());
    out.push(0);
    Ok(())
}

fn string(s: &str, out: &mut Vec<u8>) -> Result<(), WriteError> {
    out.extend_from_slice(&int32(s.len() + 1)?.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    out.push(0);
    Ok(())
}

fn binary(subtype: BinarySubtype, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), WriteError> {
    // The old binary subtype (2) repeats the length inside the value.
    let old = subtype == BinarySubtype::BinaryOld;
    let len = int32(bytes.len() + if old { 4 } else { 0 })?;
    out.extend_from_slice(&len.to_le_bytes());
    out.push(subtype.into());
    if old {
        out.extend_from_slice(&(len - 4).to_le_bytes());
    }
    out.extend_from_slice(bytes);
    Ok(())
}

fn value(value: &Bson, out: &mut Vec<u8>) -> Result<(), WriteError> {
    match value {
        Bson::Double(v) => out.extend_from_slice(&v.to_le_bytes()),
        Bson::String(s) | Bson::JavaScriptCode(s) | Bson::Symbol(s) => string(s, out)?,
        Bson::Array(values) => {
            let start = open(out);
            let mut digits = [0u8; 20];
            for (i, v) in values.iter().enumerate() {
                out.push(v.element_type() as u8);
                out.extend_from_slice(decimal(i, &mut digits));
                out.push(0);
                self::value(v, out)?;
            }
            close(start, out)?;
        }
        Bson::Document(doc) => document(doc, out)?,
        Bson::Boolean(b) => out.push(u8::from(*b)),
        Bson::Null | Bson::Undefined | Bson::MaxKey | Bson::MinKey => {}
        Bson::RegularExpression(regex) => {
            cstring(regex.pattern.as_str(), out)?;
            cstring(regex.options.as_str(), out)?;
        }
        Bson::JavaScriptCodeWithScope(code) => {
            let start = open(out);
            string(&code.code, out)?;
            document(&code.scope, out)?;
            let len = int32(out.len() - start)?;
            out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        }
        Bson::Int32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Bson::Int64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Bson::Timestamp(ts) => {
            out.extend_from_slice(&ts.increment.to_le_bytes());
            out.extend_from_slice(&ts.time.to_le_bytes());
        }
        Bson::Binary(bin) => binary(bin.subtype, &bin.bytes, out)?,
        Bson::ObjectId(id) => out.extend_from_slice(&id.bytes()),
        Bson::DateTime(at) => out.extend_from_slice(&at.timestamp_millis().to_le_bytes()),
        Bson::Decimal128(d) => out.extend_from_slice(&d.bytes()),
        Bson::DbPointer(_) => {
            // Deprecated, and its fields are private: the bson crate encodes it, as the only
            // element of a document whose framing is then dropped (the element's key is
            // already written).
            let mut doc = Document::new();
            doc.insert("", value.clone());
            let bytes = doc.to_vec().map_err(|_| WriteError::Nul)?;
            // 4 length bytes, type, empty key's NUL ... value ..., final 0.
            out.extend_from_slice(&bytes[6..bytes.len() - 1]);
        }
    }
    Ok(())
}

/// The decimal digits of `n`, written at the end of `buf`.
fn decimal(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;
    use alloc::vec;
    use bson::oid::ObjectId;
    use bson::{doc, Binary, DateTime, Decimal128, JavaScriptCodeWithScope, Regex, Timestamp};
    use proptest::prelude::*;

    fn written(doc: &Document) -> Vec<u8> {
        let mut out = Vec::new();
        document(doc, &mut out).expect("writable");
        out
    }

    /// Every BSON type, nested, byte for byte as the bson crate writes it (WP-2: the body is one
    /// BSON document).
    #[test]
    fn wp2_every_bson_type_is_written_as_the_bson_crate_writes_it() {
        let pointer = bson::Document::try_from(
            bson::RawDocument::from_bytes(&[
                30, 0, 0, 0, 0x0c, b'p', 0, 6, 0, 0, 0, b'd', b'b', b'.', b'c', b'o', 0, 1, 2, 3,
                4, 5, 6, 7, 8, 9, 10, 11, 12, 0,
            ])
            .unwrap(),
        )
        .unwrap();
        let doc = doc! {
            "double": 1.5, "string": "héllo\0x", "array": [1, "two", [3], { "four": 4 }],
            "doc": { "a": { "b": null } }, "true": true, "false": false, "null": null,
            "regex": Regex {
                pattern: String::from("^a.*").try_into().unwrap(),
                options: String::from("imx").try_into().unwrap(),
            }, "code": Bson::JavaScriptCode("f()".into()),
            "scope": JavaScriptCodeWithScope { code: "g()".into(), scope: doc! { "x": 1 } },
            "int32": -7, "int64": 1_i64 << 40, "ts": Timestamp { time: 5, increment: 9 },
            "binary": Binary { subtype: BinarySubtype::Uuid, bytes: vec![1; 16] },
            "old": Binary { subtype: BinarySubtype::BinaryOld, bytes: vec![2, 3] },
            "user": Binary { subtype: BinarySubtype::UserDefined(0x80), bytes: vec![] },
            "oid": ObjectId::from_bytes([7; 12]), "date": DateTime::from_millis(-1),
            "symbol": Bson::Symbol("s".into()), "dec": Decimal128::from_bytes([4; 16]),
            "undefined": Bson::Undefined, "max": Bson::MaxKey, "min": Bson::MinKey,
            "pointer": pointer.get("p").unwrap().clone(), "": "empty key",
        };
        assert_eq!(written(&doc), doc.to_vec().unwrap());
        let long: Vec<Bson> = (0..1001).map(Bson::from).collect();
        let doc = doc! { "long": long };
        assert_eq!(written(&doc), doc.to_vec().unwrap());
    }

    /// A key with a NUL byte is refused, as by the bson crate, at any depth and whatever its
    /// value (issue 9: the usual scalars and strings are written by their own path).
    #[test]
    fn a_key_with_a_nul_byte_is_an_error() {
        let mut out = Vec::new();
        for value in [
            Bson::Int32(1),
            Bson::Int64(1),
            Bson::Double(1.0),
            Bson::Boolean(true),
            Bson::String("s".into()),
            Bson::Null,
        ] {
            let doc = doc! { "a\0b": value };
            assert_eq!(document(&doc, &mut out), Err(WriteError::Nul), "{doc:?}");
            assert!(doc.to_vec().is_err());
        }
        assert_eq!(
            document(&doc! { "x": { "a\0b": 1 } }, &mut out),
            Err(WriteError::Nul)
        );
    }

    fn leaf() -> impl Strategy<Value = Bson> {
        prop_oneof![
            any::<f64>().prop_map(Bson::Double),
            ".{0,8}".prop_map(Bson::String),
            any::<bool>().prop_map(Bson::Boolean),
            Just(Bson::Null),
            any::<i32>().prop_map(Bson::Int32),
            any::<i64>().prop_map(Bson::Int64),
            (any::<u32>(), any::<u32>())
                .prop_map(|(time, increment)| Bson::Timestamp(Timestamp { time, increment })),
            proptest::collection::vec(any::<u8>(), 0..20).prop_map(|bytes| Bson::Binary(Binary {
                subtype: BinarySubtype::Generic,
                bytes
            })),
            any::<i64>().prop_map(|ms| Bson::DateTime(DateTime::from_millis(ms))),
        ]
    }

    fn bson() -> impl Strategy<Value = Bson> {
        leaf().prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Bson::Array),
                proptest::collection::vec(("[a-z$]{0,6}", inner), 0..6).prop_map(|fields| {
                    Bson::Document(fields.into_iter().collect::<Document>())
                }),
            ]
        })
    }

    proptest! {
        /// Any document of the common types is written as the bson crate writes it.
        #[test]
        fn any_document_is_written_as_the_bson_crate_writes_it(
            fields in proptest::collection::vec(("[a-zA-Z$_]{0,8}", bson()), 0..8)
        ) {
            let doc: Document = fields.into_iter().collect();
            prop_assert_eq!(written(&doc), doc.to_vec().unwrap());
        }
    }
}
