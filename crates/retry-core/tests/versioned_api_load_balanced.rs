//! LB-7 with the versioned-api spec's `apiStrict` (HS-2): a load-balanced client must send
//! `loadBalanced: true` in its hello and, with a strict Stable API, `apiStrict: true`. A server
//! parses its hello's `loadBalanced` as an unstable field (hello.idl, `stability: unstable`) with
//! the request's `apiStrict`, so it answers every such handshake with APIStrictError (323). The
//! engine refuses that combination when it is made ([`EngineError::LoadBalancedStrictApi`]) and
//! accepts every other one.

use std::error::Error;

use retry_core::address::ServerAddress;
use retry_core::engine::{Engine, EngineError, EngineOptions};
use retry_core::handshake::{load_balanced_refused, ClientMetadata, HandshakeOptions, ServerApi};
use retry_core::time::Instant;
use retry_core::topology::TopologySettings;

fn options(load_balanced: bool, strict: Option<bool>) -> EngineOptions {
    let mut topology = TopologySettings::new(vec![ServerAddress::new("lb", 27017)]);
    topology.load_balanced = load_balanced;
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("versioned-api-lb", "0.1.0");
    handshake.server_api = Some(ServerApi {
        version: "1".into(),
        strict,
        deprecation_errors: None,
    });
    EngineOptions::new(topology, handshake)
}

/// LB-7 + HS-2: `loadBalanced` with `apiStrict: true` is refused at creation, with a message
/// naming both options and the server's refusal.
#[test]
fn lb7_load_balanced_with_a_strict_api_is_refused_when_the_engine_is_made() {
    let error = Engine::new(options(true, Some(true)), Instant::ZERO).expect_err("refused");
    assert_eq!(error, EngineError::LoadBalancedStrictApi);
    let message = error.to_string();
    assert!(message.contains("loadBalanced"), "{message}");
    assert!(message.contains("apiStrict"), "{message}");
    assert!(message.contains("323"), "{message}");
    assert!(error.source().is_none());
}

/// LB-7 + HS-2: without `apiStrict: true` (unset or `false`) a load-balanced engine is made, and a
/// strict API without load balancing is made too.
#[test]
fn lb7_load_balanced_without_a_strict_api_and_strict_without_lb_are_accepted() {
    for (load_balanced, strict) in [(true, None), (true, Some(false)), (false, Some(true))] {
        let made = Engine::new(options(load_balanced, strict), Instant::ZERO);
        assert!(made.is_ok(), "{load_balanced} {strict:?}: {:?}", made.err());
    }
}

/// LB-7 + HS-2: the public rule ([`load_balanced_refused`], which clients check their options
/// with) is the one the engine applies: for every combination, it holds exactly when the engine
/// refuses to be made.
#[test]
fn lb7_the_public_rule_is_the_engines() {
    for load_balanced in [false, true] {
        for strict in [None, Some(false), Some(true)] {
            let options = options(load_balanced, strict);
            let refused =
                load_balanced_refused(load_balanced, options.handshake.server_api.as_ref());
            assert_eq!(refused, load_balanced && strict == Some(true));
            let made = Engine::new(options, Instant::ZERO);
            assert_eq!(
                made.err(),
                refused.then_some(EngineError::LoadBalancedStrictApi),
                "{load_balanced} {strict:?}"
            );
        }
    }
    assert!(!load_balanced_refused(true, None), "no declared version");
}
