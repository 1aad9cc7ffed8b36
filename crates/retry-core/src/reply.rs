//! The rules for two fields of a server reply: its `ok` ([`ok`], [`is_ok`]) and the id of the
//! cursor it carries ([`cursor_id`]). The engine, the monitors and SDAM, the driver's cursors and
//! the spec-test runner use these functions rather than rules of their own, so they agree on a
//! `true` `ok` or an Int32 cursor id; code that reads `ok` or `cursor.id` another way is not
//! held to them. The engine's reply reader, which reads a reply in place from its bytes, applies
//! the same rules to encoded elements (`is_ok_element`, `encoded_cursor_id`); a test holds the
//! two forms to the same answers.

use bson::raw::RawDocument;
use bson::{Bson, Document};

use crate::bson_read::Elements;

/// `ok` as the server sent it: a number (1 is success, any other value failure) or a boolean;
/// `None` when it is missing or of another type (a malformed reply).
pub fn ok(reply: &Document) -> Option<bool> {
    match reply.get("ok")? {
        Bson::Double(v) => Some(*v == 1.0),
        Bson::Int32(v) => Some(*v == 1),
        Bson::Int64(v) => Some(*v == 1),
        Bson::Boolean(v) => Some(*v),
        _ => None,
    }
}

/// Whether the reply reports success: `ok` is 1 (of any number type) or `true`.
pub fn is_ok(reply: &Document) -> bool {
    ok(reply) == Some(true)
}

/// The id of the cursor a reply carries, `cursor.id`: an Int64, or an Int32 (which some servers
/// and proxies send for small ids); 0 means the cursor is exhausted. `None` when the reply has no
/// `cursor` document or its id is not an integer.
pub fn cursor_id(reply: &Document) -> Option<i64> {
    let Some(Bson::Document(cursor)) = reply.get("cursor") else {
        return None;
    };
    match cursor.get("id")? {
        Bson::Int64(id) => Some(*id),
        Bson::Int32(id) => Some(i64::from(*id)),
        _ => None,
    }
}

/// [`is_ok`] on one encoded element (its BSON type tag and value bytes, as [`Elements`] yields
/// them): 1 as a double, Int32 or Int64, or `true`.
pub(crate) fn is_ok_element(tag: u8, value: &[u8]) -> bool {
    match tag {
        0x01 => value.try_into().is_ok_and(|v| f64::from_le_bytes(v) == 1.0),
        0x10 => value.try_into().is_ok_and(|v| i32::from_le_bytes(v) == 1),
        0x12 => value.try_into().is_ok_and(|v| i64::from_le_bytes(v) == 1),
        0x08 => value == [1],
        _ => false,
    }
}

/// [`cursor_id`] read from the encoded `cursor` document: its last `id` (the one
/// `Document::get` sees after conversion) if an Int64 or an Int32.
pub(crate) fn encoded_cursor_id(cursor: &RawDocument) -> Option<i64> {
    let mut id = None;
    for (key, tag, value) in Elements::of(cursor) {
        if key == b"id" {
            id = match tag {
                0x12 => value.try_into().ok().map(i64::from_le_bytes),
                0x10 => value.try_into().ok().map(i32::from_le_bytes).map(i64::from),
                _ => None,
            };
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    /// EV-3, SDAM: `ok` is success as 1 of any number type or `true`; anything else is a failure,
    /// and a missing or mistyped `ok` is told apart (a malformed reply).
    #[test]
    fn ok_is_one_of_any_number_type_or_true() {
        for success in [
            doc! { "ok": 1 },
            doc! { "ok": 1_i64 },
            doc! { "ok": 1.0 },
            doc! { "ok": true },
        ] {
            assert!(is_ok(&success), "{success}");
        }
        for failure in [doc! { "ok": 0 }, doc! { "ok": 0.0 }, doc! { "ok": false }] {
            assert_eq!(ok(&failure), Some(false), "{failure}");
        }
        for malformed in [doc! {}, doc! { "ok": "1" }] {
            assert_eq!(ok(&malformed), None, "{malformed}");
            assert!(!is_ok(&malformed));
        }
    }

    /// LB-10, review5 item 14: a cursor id is read as an Int64 or an Int32, never as 0 because
    /// of its type.
    #[test]
    fn lb10_a_cursor_id_is_an_int64_or_an_int32() {
        let reply = |id: Bson| doc! { "ok": 1, "cursor": { "id": id, "firstBatch": [] } };
        assert_eq!(cursor_id(&reply(Bson::Int64(1 << 40))), Some(1 << 40));
        assert_eq!(cursor_id(&reply(Bson::Int32(42))), Some(42));
        assert_eq!(cursor_id(&reply(Bson::Int64(0))), Some(0));
        assert_eq!(cursor_id(&reply(Bson::Double(42.0))), None);
        assert_eq!(cursor_id(&doc! { "ok": 1 }), None);
        assert_eq!(cursor_id(&doc! { "ok": 1, "cursor": 5 }), None);
    }

    /// Review 6 (no copied logic): the encoded readers give the answers of the document readers,
    /// for every type `ok` and `cursor.id` come in.
    #[test]
    fn the_encoded_readers_agree_with_the_document_readers() {
        let values = [
            Bson::Int32(1),
            Bson::Int32(0),
            Bson::Int32(42),
            Bson::Int64(1),
            Bson::Int64(1 << 40),
            Bson::Int64(0),
            Bson::Double(1.0),
            Bson::Double(0.5),
            Bson::Boolean(true),
            Bson::Boolean(false),
            Bson::String("1".into()),
            Bson::Null,
        ];
        for value in values {
            let reply = doc! { "ok": value.clone(), "cursor": { "id": value.clone() } };
            let raw = bson::RawDocumentBuf::try_from(&reply).expect("encodes");
            let (mut ok_element, mut cursor) = (None, None);
            for (key, tag, bytes) in Elements::of(&raw) {
                match key {
                    b"ok" => ok_element = Some(is_ok_element(tag, bytes)),
                    b"cursor" => cursor = RawDocument::from_bytes(bytes).ok(),
                    _ => {}
                }
            }
            assert_eq!(ok_element, Some(is_ok(&reply)), "ok: {value}");
            let cursor = cursor.expect("the cursor document");
            assert_eq!(encoded_cursor_id(cursor), cursor_id(&reply), "id: {value}");
        }
    }
}
