//! SCRAM users in the test server, driven by hand with retry-auth's client side (AU-3..AU-8).

use std::sync::{Arc, Mutex};

use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document};
use retry_auth::{Scram, ScramVersion};
use retry_core::auth::{Credential, Mechanism, MechanismStart, SaslConversation};
use retry_core::rng::EngineRng;
use retry_testkit::{RawClient, Role, ServerConfig, TestServer};

fn bin(bytes: Vec<u8>) -> Binary {
    Binary {
        subtype: BinarySubtype::Generic,
        bytes,
    }
}

fn payload(reply: &Document) -> Vec<u8> {
    match reply.get("payload") {
        Some(Bson::Binary(b)) => b.bytes.clone(),
        other => panic!("no payload: {other:?} in {reply}"),
    }
}

fn start(version: ScramVersion, password: &str) -> (Vec<u8>, Box<dyn SaslConversation>) {
    let credential = Credential::new("alice", password, "admin");
    let rng = Arc::new(Mutex::new(EngineRng::from_seed_u64(1)));
    let scram = Scram::new(version, &credential, rng).unwrap();
    match scram.start().unwrap() {
        MechanismStart::Sasl {
            payload,
            conversation,
        } => (payload, conversation),
        MechanismStart::Command(_) => unreachable!(),
    }
}

async fn server() -> TestServer {
    let config = ServerConfig::new(Role::Standalone).with_user("alice", "pencil", &[]);
    TestServer::start(config).await.unwrap()
}

fn sasl_start(mechanism: &str, payload: Vec<u8>, skip_empty_exchange: bool) -> Document {
    doc! { "saslStart": 1, "mechanism": mechanism, "payload": bin(payload),
    "options": { "skipEmptyExchange": skip_empty_exchange }, "$db": "admin" }
}

fn sasl_continue(id: &Bson, payload: Vec<u8>) -> Document {
    doc! { "saslContinue": 1, "conversationId": id.clone(), "payload": bin(payload), "$db": "admin" }
}

/// Sends `saslStart` with the client's `first` message and `saslContinue` with the
/// conversation's answer to the server's first message; returns the conversation id and the
/// server's reply to that second message.
async fn start_and_continue(
    client: &mut RawClient,
    mechanism: &str,
    first: Vec<u8>,
    skip_empty_exchange: bool,
    conversation: &mut dyn SaslConversation,
) -> (Bson, Document) {
    let reply = client
        .command(sasl_start(mechanism, first, skip_empty_exchange))
        .await
        .unwrap();
    let id = reply.get("conversationId").unwrap().clone();
    let client_final = conversation.step(&payload(&reply)).unwrap();
    let reply = client
        .command(sasl_continue(&id, client_final))
        .await
        .unwrap();
    (id, reply)
}

/// AU-8's long form, then a command that needed authentication; before it, 13 Unauthorized.
#[tokio::test]
async fn au5_au8_two_step_long_form_then_commands_are_allowed() {
    let server = server().await;
    let mut client = RawClient::connect(server.address()).await.unwrap();
    let find = doc! { "find": "c", "$db": "test" };
    let refused = client.command(find.clone()).await.unwrap();
    assert_eq!(refused.get_i32("code").ok(), Some(13), "{refused}");
    assert_eq!(refused.get_str("codeName").ok(), Some("Unauthorized"));
    let ping = client
        .command(doc! { "ping": 1, "$db": "admin" })
        .await
        .unwrap();
    assert_eq!(
        ping.get_f64("ok").ok(),
        Some(1.0),
        "ping needs no authentication"
    );

    let (first, mut conversation) = start(ScramVersion::Sha1, "pencil");
    let (id, reply) =
        start_and_continue(&mut client, "SCRAM-SHA-1", first, false, &mut *conversation).await;
    assert_eq!(reply.get_bool("done").ok(), Some(false), "the long form");
    conversation.step(&payload(&reply)).unwrap();
    assert!(conversation.is_complete(), "the server proved itself");
    let reply = client
        .command(sasl_continue(&id, Vec::new()))
        .await
        .unwrap();
    assert_eq!(reply.get_bool("done").ok(), Some(true), "{reply}");
    let found = client.command(find).await.unwrap();
    assert_eq!(found.get_f64("ok").ok(), Some(1.0), "{found}");
    server.shutdown().await;
}

/// AU-11: a wrong password and an unknown mechanism fail with 18 AuthenticationFailed.
#[tokio::test]
async fn au11_wrong_password_and_unknown_mechanism_fail_with_18() {
    let server = server().await;
    let mut client = RawClient::connect(server.address()).await.unwrap();
    let (first, mut conversation) = start(ScramVersion::Sha256, "wrong");
    let (_, reply) = start_and_continue(
        &mut client,
        "SCRAM-SHA-256",
        first.clone(),
        true,
        &mut *conversation,
    )
    .await;
    assert_eq!(reply.get_i32("code").ok(), Some(18), "{reply}");
    assert_eq!(reply.get_str("codeName").ok(), Some("AuthenticationFailed"));
    let reply = client
        .command(sasl_start("PLAIN", first, true))
        .await
        .unwrap();
    assert_eq!(reply.get_i32("code").ok(), Some(18), "{reply}");
    server.shutdown().await;
}

/// AU-3, AU-4: the hello answers `saslSupportedMechs` and continues a speculative start.
#[tokio::test]
async fn au3_au4_hello_lists_mechanisms_and_answers_a_speculative_start() {
    let server = server().await;
    let mut client = RawClient::connect(server.address()).await.unwrap();
    let (first, mut conversation) = start(ScramVersion::Sha256, "pencil");
    let mut speculative = sasl_start("SCRAM-SHA-256", first, true);
    speculative.remove("$db");
    speculative.insert("db", "admin");
    let hello = client
        .command(doc! { "hello": 1, "saslSupportedMechs": "admin.alice",
        "speculativeAuthenticate": speculative, "$db": "admin" })
        .await
        .unwrap();
    let mechs = hello.get_array("saslSupportedMechs").unwrap();
    assert_eq!(mechs.len(), 2, "{hello}");
    let first_reply = hello.get_document("speculativeAuthenticate").unwrap();
    assert!(
        !first_reply.contains_key("ok"),
        "AU-4: the reply without ok"
    );
    let id = first_reply.get("conversationId").unwrap().clone();
    let client_final = conversation.step(&payload(first_reply)).unwrap();
    let reply = client
        .command(sasl_continue(&id, client_final))
        .await
        .unwrap();
    assert_eq!(reply.get_bool("done").ok(), Some(true), "{reply}");
    conversation.step(&payload(&reply)).unwrap();
    assert!(conversation.is_complete());
    let found = client
        .command(doc! { "find": "c", "$db": "test" })
        .await
        .unwrap();
    assert_eq!(found.get_f64("ok").ok(), Some(1.0), "{found}");
    server.shutdown().await;
}

/// Like a real server, the salt of a user is fixed: a client's key cache (AU-9) serves every
/// connection after its first.
#[tokio::test]
async fn au9_the_salt_is_fixed_so_a_clients_key_cache_hits() {
    let server = server().await;
    let credential = Credential::new("alice", "pencil", "admin");
    let rng = Arc::new(Mutex::new(EngineRng::from_seed_u64(2)));
    let scram = Scram::new(ScramVersion::Sha256, &credential, rng).unwrap();
    for _ in 0..3 {
        let mut client = RawClient::connect(server.address()).await.unwrap();
        let MechanismStart::Sasl {
            payload: first,
            mut conversation,
        } = scram.start().unwrap()
        else {
            unreachable!()
        };
        let (_, reply) = start_and_continue(
            &mut client,
            "SCRAM-SHA-256",
            first,
            true,
            &mut *conversation,
        )
        .await;
        conversation.step(&payload(&reply)).unwrap();
        assert!(conversation.is_complete());
    }
    assert_eq!(scram.cached_keys(), 1);
    server.shutdown().await;
}
