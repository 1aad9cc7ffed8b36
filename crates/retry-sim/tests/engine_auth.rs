//! Authentication in the engine (AU-2, AU-5, AU-11, HS-9), in virtual time against a scripted
//! server, with a toy SASL mechanism (the core has no cryptography; SCRAM is tested in
//! retry-auth and end to end in retry-scenarios).

use std::sync::Arc;

use bson::spec::BinarySubtype;
use bson::{doc, Binary, Document};
use retry_core::auth::{AuthError, AuthOptions, Mechanism, MechanismStart, SaslConversation};
use retry_core::engine::EngineEvent;
use retry_core::error::{ErrorKind, NetworkPhase};
use retry_core::pool::PoolEvent;
use retry_core::topology::{SdamEvent, ServerType};
use retry_sim::{address, Role, Sim, SimServer, Step};

/// Sends "hello", is satisfied once the server answers "welcome".
#[derive(Debug)]
struct Toy;

#[derive(Debug)]
struct ToyConversation(bool);

impl Mechanism for Toy {
    fn name(&self) -> &str {
        "TOY"
    }
    fn speculative(&self) -> bool {
        false
    }
    fn start(&self) -> Result<MechanismStart, AuthError> {
        Ok(MechanismStart::Sasl {
            payload: b"hello".to_vec(),
            conversation: Box::new(ToyConversation(false)),
        })
    }
}

impl SaslConversation for ToyConversation {
    fn step(&mut self, server: &[u8]) -> Result<Vec<u8>, AuthError> {
        match server {
            b"welcome" => {
                self.0 = true;
                Ok(Vec::new())
            }
            b"" if self.0 => Ok(Vec::new()),
            _ => Err(AuthError::new("TOY", "unexpected payload")),
        }
    }
    fn is_complete(&self) -> bool {
        self.0
    }
}

fn sasl(payload: &[u8], done: bool) -> Document {
    let payload = Binary {
        subtype: BinarySubtype::Generic,
        bytes: payload.to_vec(),
    };
    doc! { "ok": 1, "conversationId": 1, "payload": payload, "done": done }
}

fn sim(script: Vec<Step>) -> Sim {
    let mut server = SimServer::new(Role::Standalone);
    server.script = script.into();
    Sim::new(vec![(address("db"), server)], |options| {
        options.auth = Some(AuthOptions::new("admin", Arc::new(Toy)));
    })
}

fn log(sim: &Sim) -> Vec<String> {
    sim.servers[&address("db")]
        .log
        .iter()
        .map(|(name, _)| name.clone())
        .collect()
}

#[test]
fn au2_au5_a_pooled_connection_authenticates_before_its_first_command() {
    let mut sim = sim(vec![
        Step::reply(sasl(b"welcome", false)),
        Step::reply(sasl(b"", true)),
    ]);
    let op = sim.read(doc! { "find": "c" });
    sim.run(op).expect("authenticated");
    assert_eq!(log(&sim), ["saslStart", "saslContinue", "find"]);
    let conns: Vec<_> = sim.servers[&address("db")]
        .log
        .iter()
        .map(|(_, c)| *c)
        .collect();
    assert!(conns.windows(2).all(|w| w[0] == w[1]), "one connection");
    // The connection is ready only after authentication: no check-out before it.
    let ready = sim
        .events
        .iter()
        .filter(|(_, e)| {
            matches!(
                e,
                EngineEvent::Pool {
                    event: PoolEvent::ConnectionReady { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(ready, 1);
}

/// AU-11, HS-9: a refused authentication fails the operation with the server's error and no
/// labels; exactly one pool clear and one Unknown description; the next operation authenticates
/// again and works. Run twice: the same inputs give the same trace (house rule 2).
#[test]
fn au11_an_authentication_failure_clears_the_pool_and_marks_the_server_unknown() {
    let trace = || {
        let mut sim = sim(vec![
            Step::reply(
                doc! { "ok": 0, "code": 18, "codeName": "AuthenticationFailed",
                "errmsg": "Authentication failed.", "errorLabels": ["SystemOverloadedError", "RetryableError"] },
            ),
            Step::reply(sasl(b"welcome", false)),
            Step::reply(sasl(b"", true)),
        ]);
        let op = sim.read(doc! { "find": "c" });
        let error = sim.run(op).expect_err("refused");
        assert_eq!(error.server_error().and_then(|e| e.code), Some(18));
        assert!(error.labels.is_empty(), "HS-9: {error}");
        let cleared = sim
            .events
            .iter()
            .filter(|(_, e)| {
                matches!(
                    e,
                    EngineEvent::Pool {
                        event: PoolEvent::PoolCleared { .. },
                        ..
                    }
                )
            })
            .count();
        let unknown = sim
            .events
            .iter()
            .filter(|(_, e)| {
                matches!(e, EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { new, .. })
                    if new.server_type == ServerType::Unknown)
            })
            .count();
        assert_eq!((cleared, unknown), (1, 1));
        let op = sim.read(doc! { "find": "c" });
        sim.run(op).expect("the next operation authenticates");
        assert_eq!(
            log(&sim),
            ["saslStart", "saslStart", "saslContinue", "find"]
        );
        format!("{:?}", sim.events)
    };
    assert_eq!(trace(), trace());
}

/// AU-11: the server resetting the connection mid-conversation is a network error of the
/// authentication phase, without overload labels (HS-9).
#[test]
fn au11_a_reset_mid_conversation_is_an_unlabelled_authentication_network_error() {
    let mut sim = sim(vec![Step::reply(sasl(b"welcome", false)), Step::Reset]);
    let op = sim.start(
        doc! { "ping": 1 },
        retry_core::retry::OperationKind::RunCommand,
        retry_sim::primary(),
    );
    let error = sim.run(op).expect_err("reset");
    assert!(
        matches!(&error.kind, ErrorKind::Network(n) if n.phase == NetworkPhase::Authentication),
        "{error}"
    );
    assert!(error.labels.is_empty(), "{error}");
}

/// Versioned-api spec (every command) with AU-2, AU-5: with a declared Stable API version the
/// conversation's `saslStart` and `saslContinue` carry `apiVersion` too, once each, so a server
/// that requires one (`requireApiVersion`, 498870) lets the connection authenticate.
#[test]
fn au5_the_conversation_carries_the_declared_api_version() {
    let mut server = SimServer::new(Role::Standalone);
    server.script = vec![
        Step::reply(sasl(b"welcome", false)),
        Step::reply(sasl(b"", true)),
    ]
    .into();
    server.record_raw = true;
    server.require_api_version = true;
    let mut sim = Sim::new(vec![(address("db"), server)], |options| {
        options.auth = Some(AuthOptions::new("admin", Arc::new(Toy)));
        options.handshake.server_api = Some(retry_core::handshake::ServerApi {
            version: "1".into(),
            strict: None,
            deprecation_errors: None,
        });
    });
    let op = sim.read(doc! { "find": "c" });
    sim.run(op).expect("authenticated");
    assert_eq!(log(&sim), ["saslStart", "saslContinue", "find"]);
    for command in &sim.servers[&address("db")].raw_commands {
        let versions: Vec<_> = command
            .iter()
            .filter_map(Result::ok)
            .filter(|(key, _)| key.as_str() == "apiVersion")
            .map(|(_, value)| value.as_str())
            .collect();
        assert_eq!(versions, [Some("1")], "{command:?}");
    }
}

/// LB-14, CM-5 (review38 L5): in load-balanced mode an authentication failure after the hello
/// clears its serviceId even after that service was cleared once before: the connection is
/// judged by the service's generation it would have taken, not the pool's base one. A pinned
/// cursor keeps the service's entry (generation 1 after a network error) alive meanwhile.
#[test]
fn lb14_an_authentication_failure_after_a_clear_of_its_service_clears_it_again() {
    let mut lb = SimServer::new(Role::LoadBalancer { service_id: true });
    let service = lb.service_id;
    lb.script = vec![
        // The cursor's connection.
        Step::reply(sasl(b"welcome", false)),
        Step::reply(sasl(b"", true)),
        Step::reply(retry_sim::cursor_batch(42, "firstBatch")),
        // A second connection, reset under its command: the service's first clear.
        Step::reply(sasl(b"welcome", false)),
        Step::reply(sasl(b"", true)),
        Step::Reset,
        // A third connection's authentication is refused: the second clear.
        Step::reply(
            doc! { "ok": 0, "code": 18, "codeName": "AuthenticationFailed", "errmsg": "Authentication failed." },
        ),
    ]
    .into();
    let mut sim = Sim::new(vec![(address("lb"), lb)], |options| {
        options.topology.load_balanced = true;
        options.auth = Some(AuthOptions::new("admin", Arc::new(Toy)));
    });
    let cleared = |sim: &Sim| {
        sim.events
            .iter()
            .filter(|(_, e)| {
                matches!(
                    e,
                    EngineEvent::Pool {
                        event: PoolEvent::PoolCleared { service_id, .. },
                        ..
                    } if *service_id == Some(service)
                )
            })
            .count()
    };
    let find = sim.start_request(retry_sim::open_cursor(
        retry_core::retry::OperationKind::Read,
    ));
    sim.run(find).expect("the cursor opens");
    assert!(sim.cursor_opened(find).is_some(), "a pinned cursor");
    let ping = || doc! { "ping": 1 };
    let kind = retry_core::retry::OperationKind::RunCommand;
    let reset = sim.start(ping(), kind, retry_sim::primary());
    sim.run(reset).expect_err("reset");
    assert_eq!(
        cleared(&sim),
        1,
        "LB-15: the network error clears the service"
    );
    let refused = sim.start(ping(), kind, retry_sim::primary());
    let error = sim.run(refused).expect_err("refused");
    assert_eq!(error.server_error().and_then(|e| e.code), Some(18));
    assert_eq!(
        cleared(&sim),
        2,
        "LB-14: the authentication failure clears the service again"
    );
    assert_eq!(
        log_of(&sim, "lb"),
        [
            "saslStart",
            "saslContinue",
            "find",
            "saslStart",
            "saslContinue",
            "ping",
            "saslStart"
        ]
    );
}

fn log_of(sim: &Sim, host: &str) -> Vec<String> {
    sim.servers[&address(host)]
        .log
        .iter()
        .map(|(name, _)| name.clone())
        .collect()
}
