//! What a real server refuses about the shape of an OP_MSG request, read from the request as it
//! arrived: once its body is a `Document`, a key sent twice has only its last value left to see.
//! In the order the server checks them (house rule 7: never more forgiving than it):
//!
//! - while parsing the message, before it reads `$db` ([`Malformed::while_parsing`]):
//!   - a body or a document-sequence document over `BSONObjMaxInternalSize` (16 MiB + 16 KiB):
//!     BSONObjectTooLarge (10334), `BSONObj size: {n} (0x{N}) is invalid. Size must be between 0
//!     and 16793600(16MB) First element: {element}` (review32 R4; [`oversize`]);
//!   - a document sequence named like a field of the body: 40433, `Duplicate field between body
//!     and document sequence {name}`;
//! - a field of the body sent twice (`$db` included): FailedToParse (9), `Parsed command object
//!   contains duplicate top level key: {field}` (before the command runs);
//! - a document sequence on a command that takes none: 40472, `The {command} command does not
//!   support document sequences.`; one the command does not take: 40415, `BSON field
//!   '{command}.{name}' is an unknown field.` (as its fields are parsed).
//!
//! Two sequences of one name never get here: the frame decoder refuses the message (WP-3), and
//! the connection closes.

use std::collections::BTreeSet;

use bson::{Document, RawBsonRef, RawDocument};
use retry_core::wire::RawOpMsg;

use crate::fail_point::error_reply;

/// `BSONObjMaxInternalSize`, the largest document a server reads from an OP_MSG section:
/// `BSONObjMaxUserSize` (16 MiB) + 16 KiB (`src/mongo/bson/util/builder.h`). The server reads
/// each section's document as a `Validated<BSONObj>` (`OpMsg::parse`, `src/mongo/rpc/op_msg.cpp`),
/// whose `BSONObj` constructor refuses a larger one (`BSONObj::_assertInvalid`,
/// `src/mongo/bson/bsonobj.cpp`: BSONObjectTooLarge, 10334), and the request gets that error
/// reply on a connection that stays open (10334 is not a connection-fatal parse error). The
/// server's development branch reads them against a slightly larger wire-message limit
/// (`WireMessagePayload`, `src/mongo/rpc/wire_message_payload.h`); the released limit is the
/// stricter one, kept here.
pub(super) const MAX_INTERNAL_DOCUMENT_SIZE: usize = 16 * 1024 * 1024 + 16 * 1024;

/// A refusal of a request's shape.
pub(super) struct Malformed {
    /// The error reply.
    pub(super) reply: Document,
    /// Whether the server refuses it while parsing the message, before it reads `$db`.
    pub(super) while_parsing: bool,
}

/// The document sequences each command takes (WP-4), by the array argument each replaces.
const SEQUENCES: [(&str, &[&str]); 4] = [
    ("insert", &["documents"]),
    ("update", &["updates"]),
    ("delete", &["deletes"]),
    ("bulkWrite", &["ops", "nsInfo"]),
];

/// The refusal a real server gives `request` for its shape, if any (see the module docs).
pub(super) fn refusal(request: &RawOpMsg) -> Option<Malformed> {
    let parse = oversize(request).or_else(|| duplicate_sequence(request));
    if let Some(reply) = parse {
        return Some(Malformed {
            reply,
            while_parsing: true,
        });
    }
    command_refusal(request).map(|reply| Malformed {
        reply,
        while_parsing: false,
    })
}

/// Review32 R4: BSONObjectTooLarge (10334) for the first document of `request` over
/// [`MAX_INTERNAL_DOCUMENT_SIZE`], the body's before the sequences' (see the constant's docs for
/// the server source). The message names the document's first element as the server's
/// `BSONElement::toString` renders a short string or an ObjectId (`name: "value"`,
/// `name: ObjectId('hex')`); for a value of another type, or a string over
/// [`RENDERED_STRING_BYTES`] (the message stays short), the element is left out.
fn oversize(request: &RawOpMsg) -> Option<Document> {
    let document = std::iter::once(&request.body)
        .chain(request.sequences.iter().flat_map(|s| &s.documents))
        .find(|d| d.as_bytes().len() > MAX_INTERNAL_DOCUMENT_SIZE)?;
    let size = document.as_bytes().len();
    let mut message = format!(
        "BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 and \
         {MAX_INTERNAL_DOCUMENT_SIZE}(16MB)"
    );
    if let Some(first) = first_element(document) {
        message.push_str(" First element: ");
        message.push_str(&first);
    }
    Some(error_reply(10334, &message))
}

/// The longest string value [`oversize`] names in its message.
const RENDERED_STRING_BYTES: usize = 80;

/// `document`'s first element as the server renders it in 10334's message, for a short string
/// or an ObjectId value.
fn first_element(document: &RawDocument) -> Option<String> {
    let (key, value) = document.iter().next()?.ok()?;
    match value {
        RawBsonRef::String(s) if s.len() <= RENDERED_STRING_BYTES => {
            Some(format!("{}: \"{s}\"", key.as_str()))
        }
        RawBsonRef::ObjectId(id) => Some(format!("{}: ObjectId('{id}')", key.as_str())),
        _ => None,
    }
}

/// 40433: a document sequence named like a field of the body (while parsing the message).
fn duplicate_sequence(request: &RawOpMsg) -> Option<Document> {
    let sequence = request.sequences.iter().find(|s| {
        request
            .body
            .iter()
            .any(|e| e.is_ok_and(|(key, _)| key.as_str() == s.identifier))
    })?;
    Some(error_reply(
        40433,
        &format!(
            "Duplicate field between body and document sequence {}",
            sequence.identifier
        ),
    ))
}

/// The refusals the server makes once the message is parsed (see the module docs).
fn command_refusal(request: &RawOpMsg) -> Option<Document> {
    let mut fields = BTreeSet::new();
    let mut duplicate = None;
    for element in request.body.iter() {
        let Ok((key, _)) = element else { break };
        let key = key.as_str();
        if !fields.insert(key) && duplicate.is_none() {
            duplicate = Some(key);
        }
    }
    if let Some(field) = duplicate {
        return Some(error_reply(
            9,
            &format!("Parsed command object contains duplicate top level key: {field}"),
        ));
    }
    if request.sequences.is_empty() {
        return None;
    }
    let name = request.body.iter().next()?.ok()?.0.as_str();
    let Some((_, taken)) = SEQUENCES.iter().find(|(command, _)| *command == name) else {
        return Some(error_reply(
            40472,
            &format!("The {name} command does not support document sequences."),
        ));
    };
    let unknown = request
        .sequences
        .iter()
        .find(|s| !taken.contains(&s.identifier.as_str()))?;
    Some(error_reply(
        40415,
        &format!(
            "BSON field '{name}.{}' is an unknown field.",
            unknown.identifier
        ),
    ))
}
