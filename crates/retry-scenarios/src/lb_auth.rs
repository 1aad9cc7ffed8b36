//! Authentication in load-balanced mode end to end (AU-2, AU-4, AU-11, LB-14): a client with a
//! SCRAM credential and `loadBalanced=true` against a retry-testkit load balancer with users.

use bson::doc;
use retry_core::auth::Credential;
use retry_core::engine::EngineEvent;
use retry_core::pool::PoolEvent;
use retry_core::retry::OperationKind;
use retry_core::topology::{SdamEvent, ServerType};
use retry_driver::{ClientOptions, Runtime};
use retry_testkit::{Role, ScramVersion, ServerConfig};

use crate::{bounded, connect, options, Server, SCENARIO_LIMIT};

/// A load balancer (with `serviceId`) whose user `alice` / `pencil` holds SCRAM-SHA-256.
async fn balancer_with_alice() -> Server {
    let role = Role::LoadBalancer { service_id: true };
    Server::start(ServerConfig::new(role).with_user("alice", "pencil", &[ScramVersion::Sha256]))
        .await
}

/// A load-balanced client of `server` logging in as `alice` with `password`.
fn load_balanced(server: &Server, password: &str) -> ClientOptions {
    let mut options = options(&[server]);
    options.load_balanced = true;
    options.credential = Some(Credential::new("alice", password, "admin"));
    options
}

/// AU-2, AU-4, LB-14: in load-balanced mode every pooled connection authenticates after its
/// `loadBalanced` hello (speculatively: one `saslContinue`, no `saslStart`); a wrong password
/// fails with 18 and no overload label, clears only that `serviceId`'s connections and leaves the
/// load balancer's description alone (no SDAM Unknown, AU-11 does not apply); the right password
/// then works on the same client's next connection.
pub async fn scram_authenticates_through_a_load_balancer<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = balancer_with_alice().await;
        let client = connect::<R>(load_balanced(&server, "pencil"));
        let reply = client
            .run_command("test", doc! { "find": "items" }, OperationKind::Read)
            .await
            .expect("an authenticated find through the load balancer");
        assert_eq!(reply.get_f64("ok").ok(), Some(1.0), "{reply}");
        client.shutdown().await;
        let counters = server.handle.counters();
        assert_eq!(counters.command("saslStart").received, 0, "speculative");
        assert_eq!(counters.command("saslContinue").received, 1);
        let handshakes = server.handle.handshakes();
        assert_eq!(
            handshakes.len(),
            1,
            "LB-3: no monitor, one pooled connection"
        );
        let hello = &handshakes[0].command;
        assert_eq!(hello.get_bool("loadBalanced").ok(), Some(true), "{hello}");
        assert!(hello.contains_key("speculativeAuthenticate"), "{hello}");

        let client = connect::<R>(load_balanced(&server, "wrong"));
        let mut events = client.events();
        let error = client
            .run_command("test", doc! { "find": "items" }, OperationKind::Read)
            .await
            .expect_err("a wrong password");
        client.shutdown().await;
        assert_eq!(
            error.server_error().and_then(|e| e.code),
            Some(18),
            "{error}"
        );
        assert!(error.labels.is_empty(), "HS-9: {error}");
        assert!(!error.to_string().contains("wrong"), "{error}");
        let events = events.drain();
        let cleared: Vec<_> = events
            .iter()
            .filter_map(|(_, e)| match e {
                EngineEvent::Pool {
                    event: PoolEvent::PoolCleared { service_id, .. },
                    ..
                } => Some(*service_id),
                _ => None,
            })
            .collect();
        assert_eq!(cleared.len(), 1, "LB-14: one clear: {cleared:?}");
        assert!(
            cleared[0].is_some(),
            "LB-14: only the serviceId's connections"
        );
        let not_a_balancer = events.iter().any(|(_, e)| {
            matches!(e, EngineEvent::Topology(SdamEvent::ServerDescriptionChanged { new, .. })
                if new.server_type != ServerType::LoadBalancer)
        });
        assert!(
            !not_a_balancer,
            "LB-14: the load balancer is never marked Unknown"
        );
        assert_eq!(server.handle.counters().command("find").received, 1);
        server.stop().await;
    })
    .await
}
