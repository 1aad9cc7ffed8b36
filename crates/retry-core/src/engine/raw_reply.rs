//! What the engine reads from an operation's reply, read in place from its encoded bytes: the
//! reply itself stays encoded for the caller ([`super::EngineEvent::OperationFinished`]), so a
//! reply nobody converts costs no document tree.
//!
//! One pass over the top-level fields finds what every reply may carry for the engine: `ok` and
//! `writeConcernError` (whether the error rules must look at it), `$clusterTime` (SE-16),
//! `operationTime` (SE-21), `recoveryToken` (TX-6) and `cursor.id` (the cursor rules); for an
//! attempt's reply it is the decoder's validation pass, which notes them ([`TopFields`], issue
//! 9). Each is the *last* occurrence of its key, the value `Document::get` sees in the
//! converted document (a repeated key keeps its last value there), so reading in place gives
//! the answers the document-based rules give. A reply that is not a plain success goes to those rules whole
//! ([`ReplyFields::error`]).

use bson::raw::RawDocument;
use bson::{Document, Timestamp};

use crate::address::ServerAddress;
use crate::error::OperationError;
use crate::reply::{self, TopFields};

/// The fields of one reply the engine reads on every reply (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ReplyFields<'a> {
    /// `ok` is 1 (any numeric type) or `true`.
    pub(super) ok: bool,
    /// A `writeConcernError` key is present (of any type).
    write_concern_error: bool,
    /// `$clusterTime`, when a document (SE-16).
    pub(super) cluster_time: Option<&'a RawDocument>,
    /// `operationTime`, when a timestamp (SE-21).
    pub(super) operation_time: Option<Timestamp>,
    /// `recoveryToken`, when a document (TX-6).
    pub(super) recovery_token: Option<&'a RawDocument>,
    /// `cursor.id` when `cursor` is a document with an Int64 or Int32 `id`.
    pub(super) cursor_id: Option<i64>,
}

impl<'a> ReplyFields<'a> {
    /// Reads `reply`'s top-level fields once, straight from its bytes. `reply` was validated by
    /// the decoder; an element that cannot be read ends the pass and makes the reply one the
    /// error rules look at whole.
    pub(super) fn read(reply: &'a RawDocument) -> ReplyFields<'a> {
        ReplyFields::noted(reply, &TopFields::read(reply))
    }

    /// The fields of `reply` that the decoder noted as it checked it (`RawOpMsg::top`, issue 9:
    /// the reply is not walked again).
    #[inline]
    pub(super) fn noted(body: &'a RawDocument, top: &TopFields) -> ReplyFields<'a> {
        if top.only_status() {
            // A plain reply (`{ok: 1}`, say): nothing to read from its body (issue 9).
            return ReplyFields {
                ok: top.ok,
                write_concern_error: top.write_concern_error,
                ..ReplyFields::default()
            };
        }
        ReplyFields::read_noted(body, top)
    }

    /// [`ReplyFields::noted`] of a reply with more than its status noted.
    #[inline(never)]
    fn read_noted(body: &'a RawDocument, top: &TopFields) -> ReplyFields<'a> {
        ReplyFields {
            ok: top.ok,
            write_concern_error: top.write_concern_error,
            cluster_time: top.cluster_time(body),
            operation_time: top.operation_time(body),
            recovery_token: top.recovery_token(body),
            cursor_id: top.cursor(body).and_then(reply::encoded_cursor_id),
        }
    }

    /// The error this reply reports: none for a plain success (`ok: 1`, no `writeConcernError`),
    /// else [`OperationError::from_reply`] on the converted reply, so every error, malformed
    /// replies included, is read by the one set of rules.
    #[inline]
    pub(super) fn error(
        &self,
        reply: &RawDocument,
        address: &ServerAddress,
    ) -> Option<OperationError> {
        if self.ok && !self.write_concern_error {
            return None;
        }
        reply_error(reply, address)
    }
}

/// [`OperationError::from_reply`] on the converted `reply`: out of line, a plain success never
/// gets here.
#[inline(never)]
fn reply_error(reply: &RawDocument, address: &ServerAddress) -> Option<OperationError> {
    OperationError::from_reply(&to_document(reply), address)
}

/// The document a decoded reply (or one of its embedded documents) holds. The decoder validated
/// it as this conversion reads it, so the conversion does not fail; if it ever did, the result
/// is an empty document, which every rule reads as a malformed reply (no `ok: 1`).
pub(super) fn to_document(raw: &RawDocument) -> Document {
    let converted = crate::wire::to_document(raw);
    debug_assert!(converted.is_ok(), "a decoded reply converts");
    converted.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Bson, RawDocumentBuf};

    fn raw(document: &Document) -> RawDocumentBuf {
        RawDocumentBuf::try_from(document).expect("encodes")
    }

    /// A reply with a repeated key: the `bson` crate's encoder keeps both, as a server's bytes
    /// may.
    fn with_repeated(first: (&str, Bson), second: (&str, Bson)) -> RawDocumentBuf {
        let mut bytes = raw(&doc! { "a": 1 }).into_bytes();
        bytes.truncate(bytes.len() - 1);
        let mut tail = Vec::new();
        for (key, value) in [first, second] {
            tail.extend(raw(&doc! { key: value }).into_bytes()[4..].iter().copied());
            tail.pop();
        }
        bytes.truncate(4);
        bytes.extend(tail);
        bytes.push(0);
        let len = (bytes.len() as i32).to_le_bytes();
        bytes[..4].copy_from_slice(&len);
        RawDocumentBuf::from_bytes(bytes).expect("valid")
    }

    /// The message `body` arrives in (an OP_MSG of one kind-0 section), decoded as a socket
    /// decodes it.
    fn decoded(body: &RawDocumentBuf) -> crate::wire::RawOpMsg {
        let bytes = body.as_bytes();
        let mut frame = Vec::new();
        frame.extend_from_slice(&((21 + bytes.len()) as i32).to_le_bytes());
        frame.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        frame.extend_from_slice(&2013_i32.to_le_bytes());
        frame.extend_from_slice(&[0, 0, 0, 0, 0]);
        frame.extend_from_slice(bytes);
        let mut decoder =
            crate::wire::FrameDecoder::new(crate::wire::DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let (used, message) = decoder.decode_raw(&frame).expect("decodes");
        assert_eq!(used, frame.len());
        message.expect("one message")
    }

    /// Issue 9 (SE-16, SE-21, TX-6, BP-1): the fields the decoder notes as it validates a
    /// reply's body are the ones a walk of the body reads: last occurrences, values of other
    /// types, and the walk of an unusual document (a Decimal128, which the one-pass check leaves
    /// to the `bson` crate's).
    #[test]
    fn the_decoder_notes_the_fields_a_walk_reads() {
        let time = Timestamp {
            time: 7,
            increment: 2,
        };
        let replies = [
            raw(&doc! { "ok": 1.0 }),
            raw(&doc! { "ok": 0, "errmsg": "no", "code": 2 }),
            raw(&doc! {
                "cursor": { "id": 5_i64, "ns": "db.c", "firstBatch": [] },
                "ok": 1,
                "$clusterTime": { "clusterTime": time },
                "operationTime": time,
                "recoveryToken": { "a": 1 },
            }),
            raw(&doc! {
                "cursor": 1, "$clusterTime": "no", "operationTime": 7, "recoveryToken": [],
                "ok": true, "writeConcernError": { "code": 64 },
            }),
            raw(&doc! {
                "d": bson::Decimal128::from_bytes([0; 16]),
                "cursor": { "id": 3_i32 },
                "operationTime": time,
                "ok": 1.0,
            }),
            with_repeated(("ok", Bson::Int32(1)), ("ok", Bson::Int32(0))),
            with_repeated(
                ("cursor", Bson::Document(doc! { "id": 4_i64 })),
                ("cursor", Bson::Int32(1)),
            ),
            with_repeated(
                ("operationTime", Bson::Timestamp(time)),
                ("operationTime", Bson::Int64(1)),
            ),
        ];
        for reply in &replies {
            let message = decoded(reply);
            assert_eq!(&message.body, reply);
            assert_eq!(message.top, TopFields::read(reply), "{reply:?}");
            let (noted, read) = (
                ReplyFields::noted(&message.body, &message.top),
                ReplyFields::read(reply),
            );
            assert_eq!(format!("{noted:?}"), format!("{read:?}"));
        }
        // A plain reply notes only its status, and reads nothing more (issue 9).
        let plain = decoded(&replies[0]);
        assert!(plain.top.only_status() && !decoded(&replies[2]).top.only_status());
        let plain = ReplyFields::noted(&plain.body, &plain.top);
        assert!(plain.ok && !plain.write_concern_error && plain.cursor_id.is_none());
        assert!(plain.cluster_time.is_none() && plain.operation_time.is_none());
        let rich = decoded(&replies[2]);
        let rich = ReplyFields::noted(&rich.body, &rich.top);
        assert_eq!(
            (rich.ok, rich.cursor_id, rich.operation_time),
            (true, Some(5), Some(time))
        );
        assert!(rich.cluster_time.is_some() && rich.recovery_token.is_some());
        let unusual = decoded(&replies[4]);
        let unusual = ReplyFields::noted(&unusual.body, &unusual.top);
        assert_eq!((unusual.ok, unusual.cursor_id), (true, Some(3)));
        let other = decoded(&replies[3]);
        let other = ReplyFields::noted(&other.body, &other.top);
        assert!(other.ok && other.write_concern_error);
        assert!(other.cursor_id.is_none() && other.cluster_time.is_none());
        assert!(other.operation_time.is_none() && other.recovery_token.is_none());
    }

    /// BP-1 (error facts from the reply): the fields read in place are the ones the document
    /// rules read, the last occurrence of a repeated key included.
    #[test]
    fn reads_the_fields_the_document_rules_read() {
        let time = Timestamp {
            time: 7,
            increment: 2,
        };
        let reply = raw(&doc! {
            "cursor": { "id": 5_i64, "id": 9_i32, "ns": "db.c" },
            "ok": 1.0,
            "$clusterTime": { "clusterTime": time },
            "operationTime": time,
        });
        let fields = ReplyFields::read(&reply);
        assert!(fields.ok);
        assert_eq!(fields.cursor_id, Some(9));
        assert_eq!(fields.operation_time, Some(time));
        assert!(fields.cluster_time.is_some());
        assert!(fields.recovery_token.is_none());
        let address = ServerAddress::new("db", 27017);
        assert!(fields.error(&reply, &address).is_none());

        // The last `ok` decides, as in the converted document.
        let repeated = with_repeated(("ok", Bson::Int32(1)), ("ok", Bson::Int32(0)));
        assert_eq!(to_document(&repeated).get("ok"), Some(&Bson::Int32(0)));
        let fields = ReplyFields::read(&repeated);
        assert!(!fields.ok);
        assert!(fields.error(&repeated, &address).is_some());
        let repeated = with_repeated(("ok", Bson::Int32(0)), ("ok", Bson::Boolean(true)));
        assert!(ReplyFields::read(&repeated)
            .error(&repeated, &address)
            .is_none());
    }

    /// RW-3 / BP-1: every reply that is not a plain success gets the document rules' answer:
    /// `ok: 0`, a `writeConcernError` (even with `ok: 1`, even malformed), a missing or odd `ok`.
    #[test]
    fn a_reply_that_is_not_a_plain_success_gets_the_document_rules_answer() {
        let address = ServerAddress::new("db", 27017);
        for reply in [
            doc! { "ok": 0, "code": 91, "errmsg": "shutting down" },
            doc! { "ok": 1, "writeConcernError": { "code": 64, "errmsg": "wc" } },
            doc! { "ok": 1, "writeConcernError": 3 },
            doc! { "code": 91 },
            doc! { "ok": "1" },
            doc! { "ok": 1.5 },
        ] {
            let encoded = raw(&reply);
            let fields = ReplyFields::read(&encoded);
            assert_eq!(
                fields.error(&encoded, &address),
                OperationError::from_reply(&reply, &address),
                "{reply}"
            );
        }
        for ok in [
            Bson::Int32(1),
            Bson::Int64(1),
            Bson::Double(1.0),
            Bson::Boolean(true),
        ] {
            let reply = doc! { "ok": ok };
            assert!(OperationError::from_reply(&reply, &address).is_none());
            assert!(ReplyFields::read(&raw(&reply))
                .error(&raw(&reply), &address)
                .is_none());
        }
    }
}
