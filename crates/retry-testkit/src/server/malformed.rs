//! What a real server refuses about the shape of an OP_MSG request, read from the request as it
//! arrived: once its body is a `Document`, a key sent twice has only its last value left to see.
//! In the order the server checks them (house rule 7: never more forgiving than it):
//!
//! - a document sequence named like a field of the body: 40433, `Duplicate field between body
//!   and document sequence {name}` (while parsing the message);
//! - a field of the body sent twice (`$db` included): FailedToParse (9), `Parsed command object
//!   contains duplicate top level key: {field}` (before the command runs);
//! - a document sequence on a command that takes none: 40472, `The {command} command does not
//!   support document sequences.`; one the command does not take: 40415, `BSON field
//!   '{command}.{name}' is an unknown field.` (as its fields are parsed).
//!
//! Two sequences of one name never get here: the frame decoder refuses the message (WP-3), and
//! the connection closes.

use std::collections::BTreeSet;

use bson::Document;
use retry_core::wire::RawOpMsg;

use crate::fail_point::error_reply;

/// The document sequences each command takes (WP-4), by the array argument each replaces.
const SEQUENCES: [(&str, &[&str]); 4] = [
    ("insert", &["documents"]),
    ("update", &["updates"]),
    ("delete", &["deletes"]),
    ("bulkWrite", &["ops", "nsInfo"]),
];

/// The error reply a real server gives `request` for its shape, if any (see the module docs).
pub(super) fn refusal(request: &RawOpMsg) -> Option<Document> {
    let mut fields = BTreeSet::new();
    let mut duplicate = None;
    for element in request.body.iter() {
        let Ok((key, _)) = element else { break };
        let key = key.as_str();
        if !fields.insert(key) && duplicate.is_none() {
            duplicate = Some(key);
        }
    }
    if let Some(sequence) = request
        .sequences
        .iter()
        .find(|s| fields.contains(s.identifier.as_str()))
    {
        return Some(error_reply(
            40433,
            &format!(
                "Duplicate field between body and document sequence {}",
                sequence.identifier
            ),
        ));
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
