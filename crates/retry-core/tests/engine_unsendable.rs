//! House rule 11, review32 R2, R11, R17: a request the engine cannot or must not send ends
//! exactly once with a usage error naming the reason, nothing written, never retried; a pooled
//! connection it had checked out goes back healthy (no `ConnectionClosed`), and the pool's
//! events stay in causal order with the operation's (BP-27). A mongos whose hello says
//! `maxMessageSizeBytes: 100000` and `maxBsonObjectSize: 1000`; virtual time, bounded loops.

mod support;

use bson::{doc, Document};
use retry_core::engine::{EngineEvent, EngineOptions, EventFamilies, OpId, OperationRequest};
use retry_core::error::ErrorKind;
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::pool::PoolEvent;
use retry_core::retry::{OperationKind, RetryEvent};
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::topology::TopologySettings;
use support::net::{address, is_hello, Net, Script};

fn mongos() -> Script {
    Box::new(|_, body| {
        Some(if is_hello(body) {
            doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true, "msg": "isdbgrid",
            "maxWireVersion": 25, "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30,
            "maxMessageSizeBytes": 100_000, "maxBsonObjectSize": 1000 }
        } else {
            doc! { "ok": 1, "cursor": { "id": 0i64, "ns": "test.c", "firstBatch": [] } }
        })
    })
}

/// An engine publishing every family, after a first `find` warmed its pool (one connection).
fn warm() -> Net {
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("engine-unsendable", "0.1.0");
    let settings = TopologySettings::new(vec![address("m")]);
    let options = EngineOptions::new(settings, handshake).with_events(EventFamilies::ALL);
    let mut net = Net::new(options, mongos());
    let first = net.start(read("test", doc! { "find": "c" }));
    assert!(matches!(net.finished(first)[..], [Ok(_)]));
    net
}

/// A retryable read (RR-1): a network error before sending would be retried.
fn read(db: &str, command: Document) -> OperationRequest {
    let primary =
        ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).expect("valid");
    OperationRequest::new(
        db,
        command,
        OperationKind::Read,
        SelectionCriteria::Read(primary),
    )
}

/// Starts `request` on a warm pool and returns the usage error it ended with (exactly once),
/// after checking that nothing of it was written, nothing retried, no connection closed, a
/// connection it `checks_out` checked in before it ended (BP-27), and that the next operation
/// reuses the same connection.
fn refused(request: OperationRequest, checks_out: bool) -> String {
    let mut net = warm();
    let (sent, events) = (net.sent.len(), net.events.len());
    let op = net.start(request);
    let results = net.finished(op);
    assert_eq!(results.len(), 1, "ends exactly once (house rule 8)");
    let message = match &results[0] {
        Err(e) => match &e.kind {
            ErrorKind::Usage { message } => message.clone(),
            other => panic!("not a usage error: {other:?}"),
        },
        Ok(reply) => panic!("sent: {reply:?}"),
    };
    assert_eq!(net.sent.len(), sent, "nothing written");
    let after = &net.events[events..];
    assert!(!after.iter().any(|e| matches!(
        e,
        EngineEvent::Pool {
            event: PoolEvent::ConnectionClosed { .. },
            ..
        }
    )));
    assert!(!after.iter().any(|e| matches!(
        e,
        EngineEvent::Operation {
            event: RetryEvent::RetryScheduled { .. },
            ..
        }
    )));
    assert!(!after.iter().any(|e| matches!(e, EngineEvent::Command(_))));
    // BP-27: a connection checked out for it is checked in before the operation ends.
    let finished = position(after, |e| {
        matches!(e, EngineEvent::OperationFinished { .. })
    });
    let out = after.iter().position(|e| {
        matches!(
            e,
            EngineEvent::Pool {
                event: PoolEvent::CheckedOut { .. },
                ..
            }
        )
    });
    assert_eq!(out.is_some(), checks_out, "{after:#?}");
    if let Some(out) = out {
        let back = position(after, |e| {
            matches!(
                e,
                EngineEvent::Pool {
                    event: PoolEvent::CheckedIn { .. },
                    ..
                }
            )
        });
        assert!(out < back && back < finished, "{after:#?}");
    }
    let again = net.start(read("test", doc! { "find": "c" }));
    assert!(matches!(net.finished(again)[..], [Ok(_)]));
    let created = net
        .events
        .iter()
        .filter(|e| {
            matches!(
                e,
                EngineEvent::Pool {
                    event: PoolEvent::ConnectionCreated { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(created, 1, "the pooled connection stayed healthy");
    message
}

fn position(events: &[EngineEvent], f: impl Fn(&EngineEvent) -> bool) -> usize {
    events.iter().position(f).expect("the event was emitted")
}

/// Review32 R2: a key holding a NUL byte does not encode.
#[test]
fn r2_a_key_with_a_nul_byte_is_a_usage_error_and_the_connection_stays() {
    let message = refused(
        read("test", doc! { "find": "c", "filter": { "fil\0ter": 1 } }),
        true,
    );
    assert_eq!(
        message,
        "the command cannot be sent: document does not serialize: a key or regular expression \
         contains a NUL byte"
    );
}

/// Review32 R2, WP-7: a message over the connection's `maxMessageSizeBytes` (100000 here).
#[test]
fn r2_wp7_a_message_over_max_message_size_bytes_is_a_usage_error_and_the_connection_stays() {
    let documents: Vec<Document> = (0..200)
        .map(|i| doc! { "_id": i, "pad": "p".repeat(600) })
        .collect();
    let message = refused(
        read("test", doc! { "find": "c", "filter": { "$or": documents } }),
        true,
    );
    assert!(
        message.starts_with("the command cannot be sent: message of ")
            && message.ends_with(" bytes exceeds maxMessageSizeBytes 100000"),
        "{message}"
    );
}

/// Review32 R11, WP-7: a body over the connection's `maxBsonObjectSize` (1000 here) + 16 KiB.
#[test]
fn r11_wp7_a_body_over_max_bson_object_size_is_a_usage_error_naming_the_limit() {
    let message = refused(
        read(
            "test",
            doc! { "find": "c", "filter": { "pad": "p".repeat(17_500) } },
        ),
        true,
    );
    assert!(
        message.starts_with("the command cannot be sent: the command body of ")
            && message.ends_with(" bytes exceeds maxBsonObjectSize 1000 + 16384 bytes (WP-7)"),
        "{message}"
    );
}

/// Review32 R11, WP-7: a body within the allowance goes (the control of the test above).
#[test]
fn r11_wp7_a_body_within_the_allowance_is_sent() {
    let mut net = warm();
    let op: OpId = net.start(read(
        "test",
        doc! { "find": "c", "filter": { "pad": "p".repeat(16_000) } },
    ));
    assert!(matches!(net.finished(op)[..], [Ok(_)]));
}

/// Review32 R17, WP-3: an empty command has no name; the server would answer "no such command".
#[test]
fn r17_wp3_an_empty_command_is_a_usage_error() {
    let message = refused(read("test", Document::new()), false);
    assert_eq!(
        message,
        "the command is empty: its first key must name the command (WP-3)"
    );
    let raw = bson::RawDocumentBuf::new();
    let message = refused(
        OperationRequest::new_raw("test", raw, OperationKind::Read, SelectionCriteria::Write),
        false,
    );
    assert_eq!(
        message,
        "the command is empty: its first key must name the command (WP-3)"
    );
}

/// Review32 R17 (WP-5: `$db` must be a valid database name): the names the server's
/// `validDBName` refuses, as its command dispatch applies it, are refused before sending.
#[test]
fn r17_wp5_an_invalid_database_name_is_a_usage_error() {
    let long = "d".repeat(64);
    for (db, reason) in [
        ("", "it is empty"),
        (
            "te\0st",
            "it holds one of NUL, '/', '\\', '.', ' ' and '\"'",
        ),
        ("a/b", "it holds one of NUL, '/', '\\', '.', ' ' and '\"'"),
        ("a\\b", "it holds one of NUL, '/', '\\', '.', ' ' and '\"'"),
        ("a.b", "it holds one of NUL, '/', '\\', '.', ' ' and '\"'"),
        ("a b", "it holds one of NUL, '/', '\\', '.', ' ' and '\"'"),
        ("a\"b", "it holds one of NUL, '/', '\\', '.', ' ' and '\"'"),
        (long.as_str(), "it is longer than 63 bytes"),
    ] {
        let message = refused(read(db, doc! { "find": "c" }), false);
        assert_eq!(
            message,
            format!("invalid database name {db:?}: {reason} (a server refuses it)")
        );
    }
}

/// Review32 R17: the names a server accepts go: `$` (as in `$external`), 63 bytes, `-`.
#[test]
fn r17_valid_database_names_are_sent() {
    let mut net = warm();
    for db in ["$external", "a-b_c", &"d".repeat(63)] {
        let op = net.start(read(db, doc! { "find": "c" }));
        assert!(matches!(net.finished(op)[..], [Ok(_)]), "{db}");
        assert_eq!(
            net.sent.last().expect("sent").1.get_str("$db").ok(),
            Some(db)
        );
    }
}
