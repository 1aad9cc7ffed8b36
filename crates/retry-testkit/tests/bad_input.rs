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
