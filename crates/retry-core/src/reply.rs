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

/// Where a reply's top-level fields that every reply is read for are: `ok` and
/// `writeConcernError` (whether the error rules must look at the reply), `$clusterTime` (SE-16),
/// `operationTime` (SE-21), `recoveryToken` (TX-6) and `cursor` (the cursor rules). Noted
/// element by element ([`TopFields::note`]) as the decoder checks a reply's body, so that the
/// engine reads them without walking the reply again (issue 9). Each is the *last* occurrence
/// of its key, the value `Document::get` sees in the converted document. Small (it travels with
/// every decoded message): the others are kept as where their values start in the body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TopFields {
    /// `ok` is 1 (any numeric type) or `true`.
    pub(crate) ok: bool,
    /// A `writeConcernError` key is present (of any type).
    pub(crate) write_concern_error: bool,
    /// Where the values of `$clusterTime`, `operationTime`, `recoveryToken` and `cursor` start,
    /// when of the type read (a document; a timestamp for `operationTime`); 0 otherwise (no
    /// value starts there: a document begins with its length).
    at: [u32; 4],
}

const CLUSTER_TIME: usize = 0;
const OPERATION_TIME: usize = 1;
const RECOVERY_TOKEN: usize = 2;
const CURSOR: usize = 3;

impl TopFields {
    /// Notes one top-level element of the document whose bytes are `document` (its key, type
    /// tag and value bytes, a part of `document`, as [`Elements`] yields them). `ok` inline,
    /// the rest out of line (issue 9: a plain reply's one element costs no call).
    #[inline(always)]
    pub(crate) fn note(&mut self, document: &[u8], key: &[u8], tag: u8, value: &[u8]) {
        match key {
            b"ok" => self.ok = is_ok_element(tag, value),
            _ => self.note_other(document, key, tag, value),
        }
    }

    /// [`TopFields::note`] of an element other than `ok`.
    #[inline(never)]
    fn note_other(&mut self, document: &[u8], key: &[u8], tag: u8, value: &[u8]) {
        let (field, read) = match key {
            b"writeConcernError" => return self.write_concern_error = true,
            b"$clusterTime" => (CLUSTER_TIME, tag == DOCUMENT),
            b"operationTime" => (OPERATION_TIME, tag == TIMESTAMP),
            b"recoveryToken" => (RECOVERY_TOKEN, tag == DOCUMENT),
            b"cursor" => (CURSOR, tag == DOCUMENT),
            _ => return,
        };
        // A value of a message (at most 2^31 bytes) starts within `u32`.
        let start = (value.as_ptr() as usize).wrapping_sub(document.as_ptr() as usize);
        self.at[field] = match read {
            true => u32::try_from(start).unwrap_or(0),
            false => 0,
        };
    }

    /// The fields of the validated document `document`, read from its bytes. An element that
    /// cannot be read ends the walk and makes the reply one the error rules look at whole (no
    /// `ok`).
    pub(crate) fn read(document: &RawDocument) -> TopFields {
        let bytes = document.as_bytes();
        let mut fields = TopFields::default();
        let mut elements = Elements::of(document);
        for (key, tag, value) in elements.by_ref() {
            fields.note(bytes, key, tag, value);
        }
        if elements.broken() {
            fields.ok = false;
        }
        fields
    }

    /// Whether only `ok` and `writeConcernError` were noted: none of the other fields, of
    /// the type read, is in the reply.
    #[inline]
    pub(crate) fn only_status(&self) -> bool {
        self.at == [0; 4]
    }

    /// `$clusterTime` of `document` (the one noted), when a document.
    #[inline]
    pub(crate) fn cluster_time<'a>(&self, document: &'a RawDocument) -> Option<&'a RawDocument> {
        self.embedded(document, CLUSTER_TIME)
    }

    /// `operationTime` of `document`, when a timestamp.
    #[inline]
    pub(crate) fn operation_time(&self, document: &RawDocument) -> Option<bson::Timestamp> {
        let start = self.start(OPERATION_TIME)?;
        let value = document.as_bytes().get(start..start.checked_add(8)?)?;
        crate::bson_read::timestamp(TIMESTAMP, value)
    }

    /// `recoveryToken` of `document`, when a document.
    #[inline]
    pub(crate) fn recovery_token<'a>(&self, document: &'a RawDocument) -> Option<&'a RawDocument> {
        self.embedded(document, RECOVERY_TOKEN)
    }

    /// `cursor` of `document`, when a document.
    #[inline]
    pub(crate) fn cursor<'a>(&self, document: &'a RawDocument) -> Option<&'a RawDocument> {
        self.embedded(document, CURSOR)
    }

    /// Where `field`'s value starts, if the decoder noted one of the type read.
    #[inline(always)]
    fn start(&self, field: usize) -> Option<usize> {
        match self.at[field] {
            0 => None,
            at => usize::try_from(at).ok(),
        }
    }

    /// The embedded document whose value starts at `field`'s place (its length first).
    #[inline(always)]
    fn embedded<'a>(&self, document: &'a RawDocument, field: usize) -> Option<&'a RawDocument> {
        embedded_at(document, self.start(field)?)
    }
}

/// The embedded document whose value starts at `start` of `document` (its length first).
fn embedded_at(document: &RawDocument, start: usize) -> Option<&RawDocument> {
    let bytes = document.as_bytes();
    let len = bytes.get(start..start.checked_add(4)?)?;
    let len = usize::try_from(i32::from_le_bytes([len[0], len[1], len[2], len[3]])).ok()?;
    RawDocument::from_bytes(bytes.get(start..start.checked_add(len)?)?).ok()
}

/// The BSON type tags of an embedded document and a timestamp.
const DOCUMENT: u8 = 0x03;
const TIMESTAMP: u8 = 0x11;

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
