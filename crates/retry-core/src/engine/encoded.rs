//! An operation's command kept encoded ([`super::OperationRequest::new_raw`], issue 9): the
//! caller's BSON bytes, sent as they are, followed by the fields the engine adds (a [`Document`]
//! that replaces any encoded field of the same name; [`crate::bson_write::elements_except`]).
//! The few reads the engine makes of a command (its name, its concerns) look at both, the added
//! fields first. A request in an explicit session, or whose encoded command holds a field the
//! engine removes (`$db`, `lsid`, `txnNumber`, or with a declared Stable API version an API
//! field), is converted to a [`Document`] at its start, so that the transaction and session
//! rules work on one document as before. A command repeating a
//! top-level key, or an added field naming the command (WP-3), is a usage error ([`inspect`]).

use alloc::borrow::Cow;
use alloc::string::String;
use bson::{Bson, Document, RawDocument};
use smallvec::SmallVec;

use crate::bson_read::{self, Elements};
use crate::classify::is_unacknowledged;
use crate::error::OperationError;
use crate::handshake::ServerApi;

/// Fields of a caller's command the engine removes or must see in one document.
const ENGINE_FIELDS: [&[u8]; 3] = [b"$db", b"lsid", b"txnNumber"];

/// What the engine reads of an encoded command at its start, in one pass over its fields.
pub(super) struct Inspected {
    /// It holds a field the engine removes or sets itself (`$db`, `lsid`, `txnNumber`).
    pub(super) engine_field: bool,
    /// It holds a Stable API field (`apiVersion`, `apiStrict`, `apiDeprecationErrors`), which
    /// a declared version replaces (versioned-api spec).
    pub(super) api_field: bool,
    /// SS-9, LB-6: it holds a top-level `$readPreference`, which an attempt's replaces, so that
    /// one cannot simply be appended (review12 finding 6: read here, not again per attempt).
    pub(super) read_preference: bool,
    /// SE-13: its `writeConcern` is unacknowledged (`w: 0`).
    pub(super) unacknowledged: bool,
}

/// Checks an encoded command and reads what [`Inspected`] holds. A usage error, with nothing
/// sent (house rule 11): a command that is not well-formed BSON, or that repeats a top-level key
/// (WP-5: a server refuses a duplicate field, and the conversion to a `Document` that
/// [`OperationRequest::new`](super::OperationRequest::new) takes could not hold it). The keys
/// are compared among themselves only: the cost follows the command's own key count. Also a
/// usage error: a field of `fields` (the request's [`OperationRequest::command`](
/// super::OperationRequest::command)) that names the command, which would replace it after the
/// encoded fields and so move the name off the front (WP-3: the first key names the command).
pub(super) fn inspect(raw: &RawDocument, fields: &Document) -> Result<Inspected, OperationError> {
    let mut inspected = Inspected {
        engine_field: false,
        api_field: false,
        read_preference: false,
        unacknowledged: false,
    };
    let mut keys: SmallVec<[&[u8]; 16]> = SmallVec::new();
    // One pass checks the command and reads its fields.
    bson_read::validate_with(raw, |key, tag, value| {
        keys.push(key);
        if ENGINE_FIELDS.contains(&key) {
            inspected.engine_field = true;
        } else if key == b"writeConcern" {
            inspected.unacknowledged = match bson_read::plain_value(tag, value) {
                Some(Bson::Document(write_concern)) => is_unacknowledged(&write_concern),
                _ => false,
            };
        } else if key.starts_with(b"api") && ServerApi::KEYS.iter().any(|k| k.as_bytes() == key) {
            inspected.api_field = true;
        } else if key == b"$readPreference" {
            inspected.read_preference = true;
        }
    })
    .map_err(|e| {
        OperationError::usage(alloc::format!("the encoded command is not valid BSON: {e}"))
    })?;
    let name = keys.first().map(|key| String::from_utf8_lossy(key));
    if let Some(name) = name.filter(|name| fields.contains_key(name.as_ref())) {
        return Err(OperationError::usage(alloc::format!(
            "`{name}` names the encoded command and cannot be set beside it (WP-3); \
             encode the command with it"
        )));
    }
    if let Some(key) = repeated(&mut keys) {
        return Err(OperationError::usage(alloc::format!(
            "the encoded command holds the field `{}` more than once (WP-5)",
            String::from_utf8_lossy(key)
        )));
    }
    Ok(inspected)
}

/// A key `keys` holds more than once (sorted in place: n log n comparisons of the keys).
fn repeated<'a>(keys: &mut [&'a [u8]]) -> Option<&'a [u8]> {
    keys.sort_unstable();
    keys.windows(2)
        .find(|pair| pair[0] == pair[1])
        .map(|pair| pair[0])
}

/// The command's name (its first key's bytes): the encoded command's, if it has any fields,
/// else the first added field's.
pub(super) fn command_name<'a>(encoded: Option<&'a RawDocument>, fields: &'a Document) -> &'a [u8] {
    // A validated document's first key starts after its length and first type byte.
    let first = encoded
        .map(|raw| raw.as_bytes())
        .filter(|bytes| bytes.len() > 5)
        .and_then(|bytes| {
            let key = &bytes[5..];
            key.iter().position(|&b| b == 0).map(|len| &key[..len])
        });
    first
        .or_else(|| fields.keys().next().map(String::as_bytes))
        .unwrap_or(b"")
}

/// The value of the command's `key`: the added field, else the encoded one (converted).
pub(super) fn field<'a>(
    encoded: Option<&RawDocument>,
    fields: &'a Document,
    key: &str,
) -> Option<Cow<'a, Bson>> {
    if let Some(value) = fields.get(key) {
        return Some(Cow::Borrowed(value));
    }
    // Found by the cheap element walk (`inspect` refused a repeated key); a value of an unusual
    // type is converted by the `bson` crate.
    let raw = encoded?;
    let (_, tag, value) = Elements::of(raw).find(|(k, _, _)| *k == key.as_bytes())?;
    match bson_read::plain_value(tag, value) {
        Some(value) => Some(Cow::Owned(value)),
        None => Bson::try_from(raw.get(key).ok()??).ok().map(Cow::Owned),
    }
}

/// The whole command as one document, in the order it goes on the wire: the encoded fields
/// `fields` does not replace, then `fields`.
pub(super) fn to_document(encoded: &RawDocument, fields: Document) -> Document {
    let document = match bson_read::document(encoded) {
        Ok(document) => document,
        // A command `check` accepted converts; nothing else reaches here.
        Err(_) => Document::new(),
    };
    if fields.is_empty() {
        return document;
    }
    let mut merged: Document = document
        .into_iter()
        .filter(|(key, _)| !fields.contains_key(key))
        .collect();
    merged.extend(fields);
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc};

    #[test]
    fn name_and_fields_read_the_added_fields_first() {
        let raw = rawdoc! { "find": "c", "readConcern": { "level": "local" } };
        let fields = doc! { "readConcern": { "level": "majority" } };
        assert_eq!(command_name(Some(&raw), &fields), b"find");
        assert_eq!(command_name(None, &doc! { "ping": 1 }), b"ping");
        assert_eq!(
            field(Some(&raw), &fields, "readConcern").as_deref(),
            Some(&Bson::Document(doc! { "level": "majority" }))
        );
        assert_eq!(
            field(Some(&raw), &Document::new(), "readConcern").as_deref(),
            Some(&Bson::Document(doc! { "level": "local" }))
        );
        assert_eq!(field(Some(&raw), &fields, "writeConcern"), None);
    }

    #[test]
    fn the_document_is_the_wire_order() {
        let raw = rawdoc! { "find": "c", "maxTimeMS": 5, "filter": {} };
        let merged = to_document(&raw, doc! { "maxTimeMS": 7, "txnNumber": 1_i64 });
        let keys: alloc::vec::Vec<&str> = merged.keys().map(String::as_str).collect();
        assert_eq!(keys, ["find", "filter", "maxTimeMS", "txnNumber"]);
        assert_eq!(merged.get("maxTimeMS"), Some(&Bson::Int32(7)));
    }

    #[test]
    fn inspection_finds_engine_api_and_read_preference_fields_and_an_unacknowledged_write_concern()
    {
        let engine_field =
            |raw: &RawDocument| inspect(raw, &Document::new()).expect("valid").engine_field;
        assert!(engine_field(&rawdoc! { "ping": 1, "$db": "x" }));
        assert!(engine_field(&rawdoc! { "insert": "c", "txnNumber": 1_i64 }));
        assert!(!engine_field(&rawdoc! { "ping": 1 }));
        // Versioned-api spec: a caller's API field is found in the same pass.
        let api_field =
            |raw: &RawDocument| inspect(raw, &Document::new()).expect("valid").api_field;
        assert!(api_field(
            &rawdoc! { "find": "c", "apiDeprecationErrors": true }
        ));
        assert!(api_field(&rawdoc! { "ping": 1, "apiVersion": "1" }));
        assert!(!api_field(&rawdoc! { "find": "c", "api": 1 }));
        // SS-9, LB-6: a caller's top-level `$readPreference` is found in the same pass; a nested
        // one is not the command's.
        let read_preference = |raw: &RawDocument| {
            inspect(raw, &Document::new())
                .expect("valid")
                .read_preference
        };
        assert!(read_preference(
            &rawdoc! { "find": "c", "$readPreference": { "mode": "secondary" } }
        ));
        assert!(!read_preference(
            &rawdoc! { "find": "c", "filter": { "$readPreference": 1 } }
        ));
        assert!(!read_preference(&rawdoc! { "find": "c" }));
        let unacknowledged = |raw: &RawDocument| {
            inspect(raw, &Document::new())
                .expect("valid")
                .unacknowledged
        };
        assert!(unacknowledged(
            &rawdoc! { "insert": "c", "writeConcern": { "w": 0 } }
        ));
        assert!(!unacknowledged(
            &rawdoc! { "insert": "c", "writeConcern": { "w": 1 } }
        ));
        assert!(!unacknowledged(&rawdoc! { "insert": "c" }));
    }

    /// WP-5 (review10 finding 1): a repeated top-level key is a usage error naming it; a
    /// top-level key inside a field's document is no repeat.
    #[test]
    fn wp5_a_repeated_top_level_key_is_refused() {
        let mut bytes = rawdoc! { "find": "c", "maxTimeMS": 5, "filter": { "a": 1 } }.into_bytes();
        // Append `maxTimeMS: 6` again.
        bytes.pop();
        bytes.extend([0x10]);
        bytes.extend(b"maxTimeMS\0");
        bytes.extend(6_i32.to_le_bytes());
        bytes.push(0);
        let len = bytes.len() as i32;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        let raw = bson::RawDocumentBuf::from_bytes(bytes).expect("framed");
        let error = inspect(&raw, &Document::new()).err().expect("refused");
        assert!(matches!(error.kind, crate::error::ErrorKind::Usage { .. }));
        assert!(alloc::format!("{error}").contains("`maxTimeMS`"), "{error}");
        let nested = rawdoc! { "find": "c", "filter": { "find": 1 } };
        assert!(inspect(&nested, &Document::new()).is_ok());
        assert_eq!(repeated(&mut [b"b".as_slice(), b"a", b"c"]), None);
        assert_eq!(
            repeated(&mut [b"b".as_slice(), b"a", b"b"]),
            Some(b"b".as_slice())
        );
    }

    /// WP-3 (review10 finding 3): a field set beside the encoded command that names it is a
    /// usage error; other fields are not.
    #[test]
    fn wp3_a_field_naming_the_encoded_command_is_refused() {
        let raw = rawdoc! { "find": "c", "filter": {} };
        let error = inspect(&raw, &doc! { "find": "d" }).err().expect("refused");
        assert!(alloc::format!("{error}").contains("`find`"), "{error}");
        assert!(inspect(&raw, &doc! { "filter": { "a": 1 } }).is_ok());
        assert!(inspect(&rawdoc! {}, &doc! { "ping": 1 }).is_ok());
    }
}
