//! Nothing a client sends panics the server: malformed commands get error replies, and bytes
//! that do not frame close only their own connection. Seeded, bounded, on 127.0.0.1.

use std::time::Duration;

use bson::{doc, Bson, Document};
use rand_core::RngCore;
use retry_core::rng::EngineRng;
use retry_core::wire::{HEADER_LEN, OP_MSG};
use retry_testkit::{RawClient, Role, ServerConfig, TestServer};
use tokio::time::timeout;

const NAMES: [&str; 12] = [
    "hello",
    "isMaster",
    "ping",
    "insert",
    "find",
    "getMore",
    "killCursors",
    "configureFailPoint",
    "buildInfo",
    "endSessions",
    "",
    "nope",
];

const FIELDS: [&str; 16] = [
    "filter",
    "batchSize",
    "limit",
    "singleBatch",
    "collection",
    "cursors",
    "documents",
    "mode",
    "data",
    "client",
    "loadBalanced",
    "helloOk",
    "lsid",
    "txnNumber",
    "autocommit",
    "$db",
];

fn value(rng: &mut EngineRng, depth: u32) -> Bson {
    match rng.next_u32() % if depth == 0 { 7 } else { 9 } {
        0 => Bson::Int32(rng.next_u32() as i32 % 5 - 1),
        1 => Bson::Int64(rng.next_u64() as i64),
        2 => Bson::Double(f64::from(rng.next_u32() % 7) - 2.5),
        3 => Bson::String(String::from(
            ["c", "failCommand", "alwaysOn", "off"][rng.next_u32() as usize % 4],
        )),
        4 => Bson::Boolean(rng.next_u32().is_multiple_of(2)),
        5 => Bson::Null,
        6 => Bson::Double(f64::NAN),
        7 => Bson::Array(
            (0..rng.next_u32() % 3)
                .map(|_| value(rng, depth - 1))
                .collect(),
        ),
        _ => Bson::Document(document(rng, depth - 1)),
    }
}

fn document(rng: &mut EngineRng, depth: u32) -> Document {
    let mut d = Document::new();
    for _ in 0..rng.next_u32() % 4 {
        let field = FIELDS[rng.next_u32() as usize % FIELDS.len()];
        d.insert(field, value(rng, depth));
    }
    d
}

fn command(rng: &mut EngineRng) -> Document {
    let name = NAMES[rng.next_u32() as usize % NAMES.len()];
    let mut d = Document::new();
    if !name.is_empty() {
        d.insert(name, value(rng, 2));
    }
    d.extend(document(rng, 2));
    if !rng.next_u32().is_multiple_of(4) {
        d.insert("$db", "db");
    }
    d
}

#[tokio::test]
async fn malformed_commands_get_replies() {
    timeout(Duration::from_secs(30), async {
        let roles = [Role::Mongos, Role::LoadBalancer { service_id: true }];
        for (seed, role) in roles.into_iter().enumerate() {
            let server = TestServer::start(ServerConfig::new(role)).await.unwrap();
            let mut client = RawClient::connect(server.address()).await.unwrap();
            let mut rng = EngineRng::from_seed_u64(seed as u64);
            for _ in 0..1500 {
                let request = command(&mut rng);
                let reply = client.command(request.clone()).await;
                let reply = reply.unwrap_or_else(|e| panic!("{request}: {e}"));
                assert!(reply.contains_key("ok"), "{request} -> {reply}");
            }
            // A fail point the random commands may have set must not hide the next check.
            let off = doc! { "configureFailPoint": "failCommand", "mode": "off", "$db": "admin" };
            client.command(off).await.unwrap();
            let reply = client
                .command(doc! { "ping": 1, "$db": "admin" })
                .await
                .unwrap();
            assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
            server.shutdown().await;
        }
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn frames_with_random_bodies_close_only_their_connection() {
    timeout(Duration::from_secs(30), async {
        let server = TestServer::start(ServerConfig::default()).await.unwrap();
        let mut rng = EngineRng::from_seed_u64(99);
        for _ in 0..200 {
            let body_len = 6 + rng.next_u32() as usize % 40;
            let mut frame = vec![0; HEADER_LEN + body_len];
            rng.fill_bytes(&mut frame[HEADER_LEN..]);
            let len = frame.len() as i32;
            frame[..4].copy_from_slice(&len.to_le_bytes());
            frame[12..16].copy_from_slice(&OP_MSG.to_le_bytes());
            // flagBits 0: no moreToCome, so a body that happens to parse is answered.
            frame[HEADER_LEN..HEADER_LEN + 4].fill(0);
            let mut client = RawClient::connect(server.address()).await.unwrap();
            client.send_raw(&frame).await.unwrap();
            // Either an error reply to a body that happened to parse, or a close.
            if let Ok(reply) = client.receive().await {
                assert!(reply.body.contains_key("ok"));
            }
        }
        let mut client = RawClient::connect(server.address()).await.unwrap();
        let reply = client
            .command(doc! { "ping": 1, "$db": "admin" })
            .await
            .unwrap();
        assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
        assert!(server.handle().counters().protocol_errors > 0);
        server.shutdown().await;
    })
    .await
    .expect("bounded");
}

/// A frame of `body` (encoded as it is) and `sequences`, with request id 1.
fn frame_of(body: Vec<u8>, sequences: &[(&str, Vec<Document>)]) -> Vec<u8> {
    let mut frame = vec![0; HEADER_LEN + 4];
    for (identifier, documents) in sequences {
        let mut section = identifier.as_bytes().to_vec();
        section.push(0);
        for document in documents {
            section.extend(document.to_vec().unwrap());
        }
        frame.push(1);
        frame.extend(((section.len() + 4) as i32).to_le_bytes());
        frame.extend(section);
    }
    frame.push(0);
    frame.extend(body);
    let len = frame.len() as i32;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    frame[4..8].copy_from_slice(&1_i32.to_le_bytes());
    frame[12..16].copy_from_slice(&OP_MSG.to_le_bytes());
    frame
}

/// `body` encoded with the field `key: value` appended again (a `Document` cannot repeat a key).
fn with_repeated(body: &Document, key: &str, value: &str) -> Vec<u8> {
    let mut bytes = body.to_vec().unwrap();
    bytes.pop();
    bytes.push(2);
    bytes.extend(key.as_bytes());
    bytes.push(0);
    bytes.extend(((value.len() + 1) as i32).to_le_bytes());
    bytes.extend(value.as_bytes());
    bytes.extend([0, 0]);
    let len = bytes.len() as i32;
    bytes[..4].copy_from_slice(&len.to_le_bytes());
    bytes
}

/// House rule 7, TK-2, WP-3, WP-4: what a real server refuses about a message's shape the test
/// server refuses with the same code, on the raw path's commands (ping, hello) as on the others:
/// a body key sent twice is FailedToParse (9), a document sequence on a command that takes none
/// 40472, one named like a body field 40433, one the command does not take 40415; a sequence
/// an insert takes is accepted.
#[tokio::test]
async fn repeated_fields_and_stray_document_sequences_are_refused() {
    timeout(Duration::from_secs(30), async {
        let server = TestServer::start(ServerConfig::new(Role::Mongos))
            .await
            .unwrap();
        let ping = doc! { "ping": 1, "$db": "admin" };
        let hello = doc! { "hello": 1, "$db": "admin" };
        let insert = doc! { "insert": "c", "$db": "db" };
        let documents = vec![doc! { "_id": 1 }];
        let cases = [
            (
                "ping, $db twice",
                frame_of(with_repeated(&ping, "$db", "admin"), &[]),
                Some(9),
            ),
            (
                "hello, $db twice",
                frame_of(with_repeated(&hello, "$db", "db"), &[]),
                Some(9),
            ),
            (
                "insert, comment twice",
                frame_of(
                    with_repeated(
                        &doc! { "insert": "c", "comment": "a", "$db": "db" },
                        "comment",
                        "b",
                    ),
                    &[("documents", documents.clone())],
                ),
                Some(9),
            ),
            (
                "ping with a sequence",
                frame_of(ping.to_vec().unwrap(), &[("documents", documents.clone())]),
                Some(40472),
            ),
            (
                "insert, documents in the body and a sequence",
                frame_of(
                    doc! { "insert": "c", "documents": [], "$db": "db" }
                        .to_vec()
                        .unwrap(),
                    &[("documents", documents.clone())],
                ),
                Some(40433),
            ),
            (
                "insert with a sequence it does not take",
                frame_of(insert.to_vec().unwrap(), &[("updates", documents.clone())]),
                Some(40415),
            ),
            (
                "insert with its documents as a sequence",
                frame_of(
                    insert.to_vec().unwrap(),
                    &[("documents", documents.clone())],
                ),
                None,
            ),
        ];
        for (label, frame, code) in cases {
            let mut client = RawClient::connect(server.address()).await.unwrap();
            client.send_raw(&frame).await.unwrap();
            let reply = client.receive().await.unwrap().body;
            assert_eq!(reply.get_i32("code").ok(), code, "{label}: {reply}");
        }
        assert_eq!(
            server.handle().documents("db.c"),
            documents,
            "only the valid insert ran"
        );
        server.shutdown().await;
    })
    .await
    .expect("bounded");
}
