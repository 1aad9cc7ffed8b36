//! The fuzz harnesses: one function per target, shared by the cargo-fuzz binaries in
//! `fuzz_targets/` and by `crates/retry-core/tests/fuzz_corpus.rs`, which replays the committed
//! corpora in ordinary `cargo test` runs. Each harness must never panic on any input; the
//! assertions inside state the invariants the fuzzer checks beyond "no panic".

use bson::{doc, Document};
use core::time::Duration;
use retry_core::address::ServerAddress;
use retry_core::connection::{
    Connection, ConnectionConfig, ConnectionEvent, ConnectionState, Request,
};
use retry_core::error::{NetworkErrorKind, OperationError, ServerError};
use retry_core::handshake::validate_reply;
use retry_core::time::Instant;
use retry_core::topology::ServerDescription;
use retry_core::wire::{
    empty_document, into_document_in, to_document, DecodeError, FrameDecoder, OpMsg,
};

/// The limit the decoder harness uses, small enough that length checks are reachable.
const MAX_MESSAGE_SIZE: u32 = 1 << 16;

fn decode_in_chunks(stream: &[u8], chunk: usize) -> (Vec<OpMsg>, Option<DecodeError>) {
    let mut decoder = FrameDecoder::new(MAX_MESSAGE_SIZE);
    let mut messages = Vec::new();
    for mut piece in stream.chunks(chunk) {
        while !piece.is_empty() {
            match decoder.decode(piece) {
                Ok((consumed, message)) => {
                    assert!(consumed > 0 && consumed <= piece.len());
                    piece = &piece[consumed..];
                    messages.extend(message);
                }
                Err(e) => return (messages, Some(e)),
            }
        }
    }
    (messages, None)
}

/// A message's encoding: compares messages bit for bit (documents may hold NaN, which is not
/// equal to itself).
fn encoding(message: &OpMsg) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    message
        .encode(MAX_MESSAGE_SIZE, &mut bytes)
        .ok()
        .map(|_| bytes)
}

/// `op_msg_decoder`: byte 0 picks a chunk size, the rest is the stream. Decoding in those chunks
/// must give exactly what decoding the whole buffer gives, and re-encoding a decoded message must
/// be stable: decode(encode(m)) encodes to the same bytes.
pub fn op_msg_decoder(data: &[u8]) {
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let (whole, whole_error) = decode_in_chunks(stream, stream.len().max(1));
    let (chunked, chunked_error) = decode_in_chunks(stream, usize::from(chunk).max(1));
    assert_eq!(whole_error, chunked_error);
    let whole: Vec<_> = whole.iter().map(encoding).collect();
    assert_eq!(whole, chunked.iter().map(encoding).collect::<Vec<_>>());
    for bytes in whole.into_iter().flatten() {
        let (again, error) = decode_in_chunks(&bytes, bytes.len());
        assert_eq!(error, None);
        assert_eq!(again.len(), 1);
        assert_eq!(encoding(&again[0]).as_ref(), Some(&bytes));
    }
}

/// The reply document the input holds, converted as the engine converts a reply
/// ([`to_document`]): a document nested deeper than a server allows is refused (WP-2) instead of
/// recursing until the stack overflows, which the `bson` crate's conversion would do.
pub fn reply_document(data: &[u8]) -> Option<Document> {
    let raw = bson::RawDocument::from_bytes(data).ok()?;
    let converted = to_document(raw);
    // Issue 9: a reply converted from a buffer given up (kept as the first key when small) is
    // the same document, or the same error; compared encoded (a NaN is not equal to itself).
    let owned = into_document_in(raw.to_owned(), None, &empty_document());
    let encoded = |r: &Result<Document, DecodeError>| r.as_ref().map(|d| d.to_vec().ok()).ok();
    assert_eq!(encoded(&owned), encoded(&converted));
    assert_eq!(owned.as_ref().err(), converted.as_ref().err());
    converted.ok()
}

/// `hello_reply`: the input is a BSON document taken as a handshake reply; the SDAM parser and the
/// handshake validator must agree on what is malformed and never panic.
pub fn hello_reply(data: &[u8]) {
    let Some(reply) = reply_document(data) else {
        return;
    };
    let address = ServerAddress::new("fuzz", 27017);
    let now = Instant::from_millis(5);
    let description = ServerDescription::from_hello(address.clone(), &reply, Duration::ZERO, now);
    for load_balanced in [false, true] {
        match validate_reply(&reply, &address, load_balanced, Duration::ZERO, now) {
            Ok(valid) => {
                assert!(description.error.is_none());
                assert_eq!(valid.description, description);
                assert!(!load_balanced || valid.service_id.is_some());
            }
            Err(e) => {
                let error = e.into_operation_error(&address);
                assert!(!error.was_sent() || error.server_error().is_some());
            }
        }
    }
}

/// `error_reply`: the input is a BSON document taken as a command reply; the classifier must never
/// panic and must agree with itself.
pub fn error_reply(data: &[u8]) {
    let Some(reply) = reply_document(data) else {
        return;
    };
    let address = ServerAddress::new("fuzz", 27017);
    // Compared field by field: the raw reply may hold a NaN, which is not equal to itself.
    let facts = |e: &ServerError| {
        (
            e.code,
            e.code_name.clone(),
            e.message.clone(),
            e.malformed,
            e.base_backoff,
        )
    };
    match OperationError::from_reply(&reply, &address) {
        Some(error) => {
            let (server, labels) = ServerError::from_reply(&reply).expect("the same reply");
            assert_eq!(Some(facts(&server)), error.server_error().map(facts));
            assert_eq!(labels, error.labels);
            let _ = (
                error.is_retryable_read(),
                error.is_retryable_write(),
                error.summary(),
            );
            let _ = error.to_string();
        }
        None => assert!(ServerError::from_reply(&reply).is_none()),
    }
}

/// `connection`: the input is a script for one connection. The machine is connected first, then
/// each step takes a byte: `0` feeds the next `n` bytes (n = the following byte) as received data,
/// `1` sends a `ping`, `2` lets the following byte × 10 ms pass and fires the timer, `3` closes the
/// socket, `5` sends a `hello` with `exhaustAllowed`; anything else takes the outgoing bytes. Invariants: at most one failure, after which the
/// connection is closed with no timer and no output; a closed connection ignores all input.
pub fn connection(data: &[u8]) {
    let mut config = ConnectionConfig::new(ServerAddress::new("fuzz", 27017));
    config.socket_timeout = Some(Duration::from_secs(1));
    let hello = doc! { "isMaster": 1, "helloOk": true, "backpressure": "2", "$db": "admin" };
    let Ok(mut conn) = Connection::new(config, hello, Instant::ZERO) else {
        return;
    };
    let mut now = Instant::ZERO;
    conn.handle_connected(now);
    let mut failures = 0;
    let mut input = data;
    while let Some((&op, rest)) = input.split_first() {
        input = rest;
        match op % 6 {
            0 => {
                let n = input
                    .first()
                    .map_or(0, |&n| usize::from(n))
                    .min(input.len().saturating_sub(1));
                let chunk = input.get(1..1 + n).unwrap_or_default();
                conn.handle_bytes(chunk, now);
                input = input.get(1 + n..).unwrap_or_default();
            }
            1 => {
                let _ = conn.send_command(Request::new(doc! { "ping": 1, "$db": "admin" }), now);
            }
            2 => {
                let step = input.first().map_or(0, |&b| u64::from(b));
                input = input.get(1..).unwrap_or_default();
                now = now.saturating_add(Duration::from_millis(step * 10));
                conn.handle_timeout(now);
            }
            3 => conn.handle_closed(NetworkErrorKind::Reset, None, now),
            5 => {
                let mut request = Request::new(doc! { "hello": 1, "$db": "admin" });
                request.exhaust_allowed = true;
                let _ = conn.send_command(request, now);
            }
            _ => while conn.poll_transmit(&mut Vec::new()) {},
        }
        while let Some(event) = conn.poll_event() {
            if let ConnectionEvent::Failed(e) = event {
                failures += 1;
                let _ = e.to_operation_error(&conn.config().address);
            }
        }
        assert!(failures <= 1);
        if conn.state() == ConnectionState::Closed {
            assert_eq!(failures, 1);
            assert_eq!(conn.poll_timeout(), None);
            assert!(!conn.has_transmit());
        }
    }
}
