//! The elements of an encoded document that `FrameDecoder::decode_raw` already validated, read
//! straight from its bytes for the raw path (`raw`): a type, a key and the value's bytes, without
//! the `bson` iterator's second validation of every key and value (about 190 instructions per
//! element). Only the value types a driver's hot command carries are read (BSON spec: double,
//! string, document, array, binary, ObjectId, bool, UTC datetime, null, int32, timestamp, int64,
//! decimal128), each sized by retry-core's one element sizer (`retry_core::wire::value_size`);
//! any other type, and any length that does not fit, ends the walk as [`Walk::Unreadable`], and
//! the raw path leaves the request to the Document path.

/// BSON element types (BSON spec).
pub(super) mod kind {
    pub(in crate::server) const DOUBLE: u8 = 0x01;
    pub(in crate::server) const STRING: u8 = 0x02;
    pub(in crate::server) const DOCUMENT: u8 = 0x03;
    pub(in crate::server) const ARRAY: u8 = 0x04;
    pub(in crate::server) const BINARY: u8 = 0x05;
    pub(in crate::server) const BOOLEAN: u8 = 0x08;
    pub(in crate::server) const INT32: u8 = 0x10;
    pub(in crate::server) const TIMESTAMP: u8 = 0x11;
    pub(in crate::server) const INT64: u8 = 0x12;
}

/// The subtype of the old binary format, whose bytes carry a second length.
const BINARY_OLD: u8 = 0x02;

/// One element: its type, key and value bytes.
#[derive(Clone, Copy)]
pub(super) struct Element<'a> {
    pub(super) kind: u8,
    pub(super) key: &'a [u8],
    pub(super) value: &'a [u8],
}

impl<'a> Element<'a> {
    /// The elements of a document value.
    pub(super) fn document(&self) -> Option<Elements<'a>> {
        (self.kind == kind::DOCUMENT).then(|| Elements::of(self.value))
    }

    /// A string value (validated UTF-8 without its terminating NUL).
    pub(super) fn str(&self) -> Option<&'a str> {
        if self.kind != kind::STRING {
            return None;
        }
        let text = self.value.get(4..self.value.len().checked_sub(1)?)?;
        core::str::from_utf8(text).ok()
    }

    /// A bool value.
    pub(super) fn bool(&self) -> Option<bool> {
        match (self.kind, self.value) {
            (kind::BOOLEAN, [0]) => Some(false),
            (kind::BOOLEAN, [1]) => Some(true),
            _ => None,
        }
    }

    /// A binary value's subtype, unless it is the old binary format.
    pub(super) fn binary_subtype(&self) -> Option<u8> {
        let subtype = *self.value.get(4)?;
        (self.kind == kind::BINARY && subtype != BINARY_OLD).then_some(subtype)
    }

    /// An int32, int64 or double value, as the `Bson` a decoded document holds.
    pub(super) fn number(&self) -> Option<bson::Bson> {
        let bytes = self.value;
        Some(match self.kind {
            kind::INT32 => bson::Bson::Int32(i32::from_le_bytes(bytes.try_into().ok()?)),
            kind::INT64 => bson::Bson::Int64(i64::from_le_bytes(bytes.try_into().ok()?)),
            kind::DOUBLE => bson::Bson::Double(f64::from_le_bytes(bytes.try_into().ok()?)),
            _ => return None,
        })
    }
}

/// What the next step of a walk found.
pub(super) enum Walk<'a> {
    Element(Element<'a>),
    End,
    /// A type not sized here, or a length that does not fit: leave the request to the Document
    /// path.
    Unreadable,
}

/// A walk over the elements of one encoded document.
pub(super) struct Elements<'a> {
    document: &'a [u8],
    at: usize,
}

impl<'a> Elements<'a> {
    /// The elements of `document` (its whole encoding, length prefix included).
    pub(super) fn of(document: &'a [u8]) -> Elements<'a> {
        Elements { document, at: 4 }
    }

    /// The next element.
    #[allow(clippy::should_implement_trait)]
    pub(super) fn next(&mut self) -> Walk<'a> {
        self.step().unwrap_or(Walk::Unreadable)
    }

    fn step(&mut self) -> Option<Walk<'a>> {
        let (&kind, rest) = self.document.get(self.at..)?.split_first()?;
        if kind == 0 {
            return rest.is_empty().then_some(Walk::End);
        }
        let key_len = rest.iter().position(|&b| b == 0)?;
        let (key, rest) = (&rest[..key_len], &rest[key_len + 1..]);
        let hot = matches!(
            kind,
            kind::DOUBLE
                | kind::STRING
                | kind::DOCUMENT
                | kind::ARRAY
                | kind::BINARY
                | 0x07
                | kind::BOOLEAN
                | 0x09
                | 0x0A
                | kind::INT32
                | kind::TIMESTAMP
                | kind::INT64
                | 0x13
        );
        // Sized by the engine's one element sizer (review7 finding 5).
        let size = retry_core::wire::value_size(kind, rest).filter(|_| hot)?;
        let value = rest.get(..size)?;
        self.at += 2 + key_len + size;
        Some(Walk::Element(Element { kind, key, value }))
    }

    /// The last element named `key` (a decoded `Document` keeps the last of a repeated key);
    /// `None` when there is none or the walk cannot finish.
    pub(super) fn last(mut self, key: &[u8]) -> Option<Element<'a>> {
        let mut found = None;
        loop {
            match self.next() {
                Walk::Element(element) if element.key == key => found = Some(element),
                Walk::Element(_) => {}
                Walk::End => return found,
                Walk::Unreadable => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Binary, Bson, DateTime, Decimal128, Timestamp};

    /// Every sized type walks to the end with the keys and values `bson` encodes.
    #[test]
    fn walks_every_sized_type() {
        let document = doc! {
            "d": 1.5, "s": "text", "o": { "a": 1 }, "a": [1, 2],
            "b": Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![3; 16] },
            "i": bson::oid::ObjectId::from_bytes([1; 12]), "t": true, "f": false,
            "dt": DateTime::from_millis(5), "n": Bson::Null, "i32": 7, "ts": Timestamp { time: 1,
            increment: 2 }, "i64": 8_i64, "dec": Decimal128::from_bytes([0; 16]),
        };
        let bytes = document.to_vec().unwrap();
        let mut walk = Elements::of(&bytes);
        let mut keys = Vec::new();
        loop {
            match walk.next() {
                Walk::Element(e) => {
                    match e.key {
                        b"s" => assert_eq!(e.str(), Some("text")),
                        b"t" => assert_eq!(e.bool(), Some(true)),
                        b"f" => assert_eq!(e.bool(), Some(false)),
                        b"b" => assert_eq!(e.binary_subtype(), Some(4)),
                        b"i32" => assert_eq!(e.number(), Some(Bson::Int32(7))),
                        b"i64" => assert_eq!(e.number(), Some(Bson::Int64(8))),
                        b"d" => assert_eq!(e.number(), Some(Bson::Double(1.5))),
                        b"o" => assert_eq!(e.document().unwrap().last(b"a").unwrap().kind, 0x10),
                        _ => {}
                    }
                    keys.push(String::from_utf8(e.key.to_vec()).unwrap());
                }
                Walk::End => break,
                Walk::Unreadable => panic!("unreadable"),
            }
        }
        let expected: Vec<String> = document.keys().cloned().collect();
        assert_eq!(keys, expected);
    }

    /// Types not sized here, and truncated or overlong lengths, end the walk as unreadable.
    #[test]
    fn unsized_types_and_bad_lengths_are_unreadable() {
        for unsized_value in [
            Bson::MinKey,
            Bson::JavaScriptCode("f()".into()),
            Bson::Undefined,
        ] {
            let bytes = doc! { "v": unsized_value }.to_vec().unwrap();
            assert!(matches!(Elements::of(&bytes).next(), Walk::Unreadable));
        }
        let mut bytes = doc! { "s": "text" }.to_vec().unwrap();
        bytes[7] = 200; // the string's length past the end
        assert!(matches!(Elements::of(&bytes).next(), Walk::Unreadable));
        let bytes = doc! { "x": 1 }.to_vec().unwrap();
        assert!(Elements::of(&bytes[..bytes.len() - 1]).last(b"x").is_none());
        assert!(Elements::of(&bytes).last(b"x").is_some());
    }
}
