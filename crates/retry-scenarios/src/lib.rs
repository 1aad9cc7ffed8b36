//! # retry-scenarios
//!
//! The adapters' scenario suite, written once and run on every runtime: each scenario is an
//! `async fn` generic over a [`retry_driver::Runtime`], and [`suite!`] turns the list into `#[test]`s
//! for one runtime and one executor. The test servers (retry-testkit, which runs on tokio) live on
//! a small tokio runtime of their own, so the client side can be tokio, async-std, smol or
//! anything else; everything the client awaits from them is a runtime-agnostic future.
//!
//! Scenarios assert counts and orders, never wall-clock durations. Each one is bounded: the
//! engine's own timeouts end every operation, and [`bounded`] fails a scenario that runs past
//! [`SCENARIO_LIMIT`].
#![warn(missing_docs)]

use core::future::{poll_fn, Future};
use core::pin::pin;
use core::task::Poll;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use bson::{doc, Bson, Document};
use retry_core::address::ServerAddress;
use retry_core::engine::{CursorUse, EngineEvent};
use retry_core::error::{ErrorClass, OperationError};
use retry_core::pool::PoolEvent;
use retry_core::retry::{OperationKind, RetryEvent, RetryReason};
use retry_core::time::Instant;
use retry_core::topology::{SdamEvent, ServerType};
use retry_driver::{Client, ClientOptions, CommandOptions, Runtime};
use retry_testkit::{
    FailCommand, FailPointMode, RateLimit, Role, ServerConfig, ServerHandle, TestServer,
    OVERLOAD_LABELS,
};

mod dns;
mod driver_api;
mod hedging;
pub use hedging::hedged_read_the_fast_copy_wins_and_the_slow_connection_is_checked_in;
mod idle_sockets;
mod lb_auth;
mod server_api;
pub use server_api::stable_api_declared_version_reaches_a_server_that_requires_one;
mod sessions;
mod soak;
mod tls;
pub use driver_api::{
    commands_are_classified_by_default, cursors_fetch_batches_and_are_killed_when_dropped,
    encoded_commands_run_as_their_documents_do, errors_say_their_cause,
    events_from_connect_start_with_the_topology_opening,
    monitoring_streams_or_polls_as_the_mode_says, the_monitors_first_check_is_its_handshake,
    w3_l9_cursor_get_more_fields_and_close_after_an_error,
    write_errors_are_errors_that_keep_the_reply,
};
mod auth;
pub use auth::{
    scram_right_password_authenticates, scram_sdam_auth_errors_clear_the_pool_once,
    scram_server_stopping_mid_conversation_is_a_network_error,
    scram_wrong_password_is_a_clear_error,
};
pub use dns::{
    srv_polling_follows_the_records, srv_seedlist_through_a_dns_server, Accelerated, DnsRecords,
    DnsServer,
};
pub use idle_sockets::idle_sockets_are_not_polled;
pub use lb_auth::scram_authenticates_through_a_load_balancer;
pub use sessions::{
    a_sessions_second_read_is_after_the_previous_operation_time,
    client_concerns_reach_command_and_cursor, ending_a_session_aborts_its_transaction,
    explicit_session_runs_several_operations, max_time_ms_is_on_every_attempt_under_timeout_ms,
    retried_insert_runs_once_with_one_lsid_and_txn_number,
    secondary_read_carries_read_preference_and_lsid,
    sessions_and_transactions_inherit_the_client_concerns,
    socket_timeout_bounds_a_server_that_never_answers,
    ss10_a_generic_command_ignores_the_client_read_preference,
};
pub use soak::{fault_soak, SOAK_OPERATIONS_DEFAULT};
pub use tls::{
    srv_seedlist_connects_with_tls_to_its_target, tls_client_certificate_from_the_key_file,
    tls_expired_certificate_is_refused_unless_insecure, tls_with_the_test_ca_works,
    tls_wrong_host_certificate_is_refused_unless_allowed,
};

/// The longest any scenario may run before it fails.
pub const SCENARIO_LIMIT: Duration = Duration::from_secs(60);

/// The seed every scenario pins.
pub const SEED: u64 = 7;

/// LB-8: the exact message of a load-balanced handshake without `serviceId`.
pub const LB8_MESSAGE: &str =
    "Driver attempted to initialize in load balancing mode, but the server does not support this mode.";

fn servers_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("retry-scenarios-servers")
            .enable_all()
            .build()
            .expect("a tokio runtime for the test servers")
    })
}

/// A retry-testkit server on the servers' runtime.
pub struct Server {
    server: Option<TestServer>,
    /// Its fail points, limiters and counters.
    pub handle: ServerHandle,
    /// Its 127.0.0.1 address.
    pub address: SocketAddr,
}

impl Server {
    /// Starts a server with `config`.
    pub async fn start(config: ServerConfig) -> Server {
        let server = servers_runtime()
            .spawn(TestServer::start(config))
            .await
            .expect("the server task")
            .expect("the server starts");
        Server {
            handle: server.handle(),
            address: server.address(),
            server: Some(server),
        }
    }

    /// A server with `role` and the default configuration.
    pub async fn with_role(role: Role) -> Server {
        Server::start(ServerConfig::new(role)).await
    }

    /// Its address for a client.
    pub fn server_address(&self) -> ServerAddress {
        ServerAddress::new(&self.address.ip().to_string(), self.address.port())
    }

    /// Stops it, re-raising any panic of its tasks.
    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            servers_runtime()
                .spawn(server.shutdown())
                .await
                .expect("the server shut down cleanly");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _context = servers_runtime().enter();
        self.server.take();
    }
}

/// Runs `future`, failing if it takes longer than `limit` (measured on the servers' runtime, so a
/// paused client runtime does not stop the clock).
pub async fn bounded<F: Future>(limit: Duration, future: F) -> F::Output {
    let mut future = pin!(future);
    // The sleep is created on the servers' runtime, whatever runtime the caller runs on.
    let mut timer = servers_runtime().spawn(async move { tokio::time::sleep(limit).await });
    poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        match core::pin::Pin::new(&mut timer).poll(cx) {
            Poll::Ready(_) => panic!("ran past its limit of {limit:?}"),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// Options for a client of `servers` with the pinned seed and a short selection timeout.
pub fn options(servers: &[&Server]) -> ClientOptions {
    let mut options = ClientOptions::new(servers.iter().map(|s| s.server_address()).collect());
    options.seed = Some(SEED);
    options.server_selection_timeout = Duration::from_secs(5);
    options.heartbeat_frequency = Duration::from_millis(500);
    options
}

/// `{ok: 0, code: 462}` with both overload labels on every command in `names`.
pub fn overload(mode: FailPointMode, names: &[&str]) -> FailCommand {
    FailCommand::new(mode, names.iter().copied())
        .with_error_code(retry_testkit::INGRESS_RATE_LIMIT_CODE)
        .with_error_labels(OVERLOAD_LABELS)
}

/// Waits (bounded by the scenario's limit) for an SDAM event `wanted` accepts.
async fn wait_for(events: &mut retry_driver::Events, mut wanted: impl FnMut(&SdamEvent) -> bool) {
    loop {
        match events.next_event().await {
            Some((_, EngineEvent::Topology(event))) if wanted(&event) => return,
            Some(_) => {}
            None => panic!("the event stream ended first"),
        }
    }
}

fn connect<R: Runtime>(options: ClientOptions) -> Client<R> {
    Client::<R>::connect(options).expect("the client starts")
}

async fn ping<R>(client: &Client<R>) {
    client
        .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
        .await
        .expect("ping succeeds");
}

fn retry_delays(events: &[(Instant, EngineEvent)]) -> Vec<(u32, Duration)> {
    events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Operation {
                event: RetryEvent::RetryScheduled { retry, delay, .. },
                ..
            } => Some((*retry, *delay)),
            _ => None,
        })
        .collect()
}

fn started(events: &[(Instant, EngineEvent)]) -> usize {
    events
        .iter()
        .filter(|(_, e)| {
            matches!(
                e,
                EngineEvent::Operation {
                    event: RetryEvent::CommandStarted { .. },
                    ..
                }
            )
        })
        .count()
}

/// BP-25, HS-4: every handshake carries `backpressure: "2"` and the application name.
pub async fn handshake_carries_backpressure<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let mut options = options(&[&server]);
        options.app_name = Some("scenarios".into());
        let client = connect::<R>(options);
        ping(&client).await;
        client.shutdown().await;
        // The first hello of each connection is its handshake; later ones are heartbeats.
        let mut firsts = std::collections::BTreeMap::new();
        for handshake in server.handle.handshakes() {
            firsts
                .entry(handshake.connection_id)
                .or_insert(handshake.command);
        }
        assert!(
            firsts.len() >= 2,
            "a monitor and a pooled connection: {firsts:?}"
        );
        for command in firsts.values() {
            assert_eq!(command.get_str("backpressure").ok(), Some("2"), "{command}");
            let name = command
                .get_document("client")
                .and_then(|c| c.get_document("application"))
                .and_then(|a| a.get_str("name"));
            assert_eq!(name.ok(), Some("scenarios"), "{command}");
        }
        server.stop().await;
    })
    .await
}

/// One overloaded find under `max_adaptive_retries`: the error, the attempts the server
/// received, and the retry events.
async fn overloaded_find<R: Runtime>(
    server: &Server,
    max_adaptive_retries: u32,
) -> (OperationError, u64, Vec<(Instant, EngineEvent)>) {
    let mut options = options(&[server]);
    options.max_adaptive_retries = max_adaptive_retries;
    let client = connect::<R>(options);
    ping(&client).await;
    server.handle.reset_counters();
    let mut events = client.events();
    let error = client
        .run_command("test", doc! { "find": "items" }, OperationKind::Read)
        .await
        .expect_err("every find is overloaded");
    // The find's events, without the shutdown's `endSessions` (SE-15).
    let events = events.drain();
    client.shutdown().await;
    let received = server.handle.counters().command("find").received;
    (error, received, events)
}

/// BP-8, BP-10: overload on every find gives 3 attempts with backoffs jitter·200 ms and
/// jitter·400 ms; the same seed gives the same jitter.
pub async fn overload_gives_three_attempts<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        server
            .handle
            .set_fail_command(Some(overload(FailPointMode::AlwaysOn, &["find"])));
        let (error, received, events) = overloaded_find::<R>(&server, 2).await;
        assert!(error.is_retryable_overload(), "{error}");
        assert_eq!(error.code(), Some(462));
        assert_eq!(received, 3);
        assert_eq!(started(&events), 3);
        let delays = retry_delays(&events);
        assert_eq!(delays.iter().map(|d| d.0).collect::<Vec<_>>(), [1, 2]);
        assert!(delays[0].1 <= Duration::from_millis(200), "{delays:?}");
        assert!(delays[1].1 <= Duration::from_millis(400), "{delays:?}");
        let (_, _, again) = overloaded_find::<R>(&server, 2).await;
        assert_eq!(
            retry_delays(&again),
            delays,
            "the pinned seed pins the jitter"
        );
        server.stop().await;
    })
    .await
}

/// BP-10: `maxAdaptiveRetries=1` gives 2 attempts.
pub async fn max_adaptive_retries_one_gives_two_attempts<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        server
            .handle
            .set_fail_command(Some(overload(FailPointMode::AlwaysOn, &["find"])));
        let (error, received, events) = overloaded_find::<R>(&server, 1).await;
        assert!(error.is_retryable_overload(), "{error}");
        assert_eq!(received, 2);
        assert_eq!(started(&events), 2);
        assert_eq!(retry_delays(&events).len(), 1);
        server.stop().await;
    })
    .await
}

/// BP-20: with two mongos, the retry of an overloaded attempt goes to the other one.
pub async fn two_mongos_retry_goes_to_the_other<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let overloaded = Server::with_role(Role::Mongos).await;
        let healthy = Server::with_role(Role::Mongos).await;
        overloaded
            .handle
            .set_fail_command(Some(overload(FailPointMode::AlwaysOn, &["find"])));
        // SS-5 is not what this tests: a loaded machine can make one hello take longer than
        // the other by more than the default 15 ms window, which would leave the overloaded
        // mongos out of every selection until the averages converge. A wide window and both
        // mongos known before the first find leave the random choice to pick either.
        let mut options = options(&[&overloaded, &healthy]);
        options.local_threshold = Duration::from_secs(60);
        // Subscribed before the monitors start: `events()` after `connect` can miss a fast
        // first check's ServerDescriptionChanged, and then this wait never ends.
        let (client, mut events) =
            Client::<R>::connect_with_events(options).expect("the client starts");
        let mut known = std::collections::HashSet::new();
        wait_for(&mut events, |event| {
            if let SdamEvent::ServerDescriptionChanged { address, new, .. } = event {
                if new.server_type == ServerType::Mongos {
                    known.insert(address.clone());
                }
            }
            known.len() == 2
        })
        .await;
        let mut seen_overloaded_first = false;
        for _ in 0..40 {
            overloaded.handle.reset_counters();
            healthy.handle.reset_counters();
            client
                .run_command("test", doc! { "find": "items" }, OperationKind::Read)
                .await
                .expect("the retry on the healthy mongos succeeds");
            let first = overloaded.handle.counters().command("find").received;
            let second = healthy.handle.counters().command("find").received;
            if first == 1 {
                assert_eq!(second, 1, "the retry went to the other mongos");
                seen_overloaded_first = true;
                break;
            }
            assert_eq!((first, second), (0, 1));
        }
        assert!(
            seen_overloaded_first,
            "the overloaded mongos was never tried first"
        );
        client.shutdown().await;
        overloaded.stop().await;
        healthy.stop().await;
    })
    .await
}

/// LB-8: load-balanced mode works with `serviceId` and fails with the exact message without it.
pub async fn load_balanced_needs_service_id<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let lb = Server::with_role(Role::LoadBalancer { service_id: true }).await;
        let mut with = options(&[&lb]);
        with.load_balanced = true;
        let client = connect::<R>(with);
        ping(&client).await;
        client.shutdown().await;
        let handshake = lb.handle.handshakes().remove(0).command;
        assert_eq!(
            handshake.get_bool("loadBalanced").ok(),
            Some(true),
            "{handshake}"
        );

        let no_service = Server::with_role(Role::LoadBalancer { service_id: false }).await;
        let mut without = options(&[&no_service]);
        without.load_balanced = true;
        let client = connect::<R>(without);
        let error = client
            .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
            .await
            .expect_err("no serviceId");
        assert!(error.to_string().contains(LB8_MESSAGE), "{error}");
        client.shutdown().await;
        lb.stop().await;
        no_service.stop().await;
    })
    .await
}

/// HS-9: a connection rate limiter that resets handshakes gives errors labelled
/// `SystemOverloadedError` and `RetryableError`, and they are retried.
pub async fn reset_handshakes_are_labelled_and_retried<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        // One socket is admitted (the monitor's); every pooled connection is reset.
        let mut config = ServerConfig::new(Role::Standalone);
        config.connection_limit = Some(RateLimit::new(0.0, 1));
        let server = Server::start(config).await;
        let client = connect::<R>(options(&[&server]));
        let mut events = client.events();
        let error = client
            .run_command("test", doc! { "find": "items" }, OperationKind::Read)
            .await
            .expect_err("every pooled connection is reset");
        client.shutdown().await;
        assert!(error.is_retryable_overload(), "HS-9 labels: {error}");
        assert_eq!(error.summary().class, ErrorClass::Network, "{error}");
        let retries = retry_delays(&events.drain());
        assert_eq!(
            retries.len(),
            2,
            "retried up to maxAdaptiveRetries: {retries:?}"
        );
        let rejected = server.handle.counters().connections_rejected;
        assert!(rejected >= 3, "one reset per attempt: {rejected}");
        assert_eq!(server.handle.counters().command("find").received, 0);
        server.stop().await;
    })
    .await
}

/// HS-9: once the connection limiter lets sockets through again, the overload retry of a reset
/// handshake succeeds.
pub async fn reset_handshake_retry_succeeds_once_admitted<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let mut config = ServerConfig::new(Role::Standalone);
        config.connection_limit = Some(RateLimit::new(0.0, 1));
        let server = Server::start(config).await;
        let mut options = options(&[&server]);
        // Room for a retry that races the lift below.
        options.max_adaptive_retries = 5;
        let client = connect::<R>(options);
        let mut events = client.events();
        let find = client.run_command("test", doc! { "find": "items" }, OperationKind::Read);
        let mut find = pin!(find);
        let handle = server.handle.clone();
        // Lift the limiter when the first retry is scheduled (read from the event stream).
        let mut lift = pin!(async {
            let mut seen = Vec::new();
            while let Some((_, event)) = events.next_event().await {
                let retry = matches!(
                    event,
                    EngineEvent::Operation {
                        event: RetryEvent::RetryScheduled { .. },
                        ..
                    }
                );
                seen.push(event);
                if retry {
                    handle.set_connection_limit(None);
                    break;
                }
            }
            seen
        });
        let mut lifted = None;
        let result = poll_fn(|cx| {
            if lifted.is_none() {
                if let Poll::Ready(seen) = lift.as_mut().poll(cx) {
                    lifted = Some(seen);
                }
            }
            find.as_mut().poll(cx)
        })
        .await;
        result.expect("the retry after the limiter lifts succeeds");
        let seen = lifted.expect("a retry was scheduled before the find succeeded");
        let reasons: Vec<RetryReason> = seen
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Operation {
                    event: RetryEvent::RetryScheduled { reason, .. },
                    ..
                } => Some(*reason),
                _ => None,
            })
            .collect();
        assert_eq!(reasons, [RetryReason::Overload], "HS-9: an overload retry");
        let counters = server.handle.counters();
        assert!(counters.connections_rejected >= 1, "{counters:?}");
        assert_eq!(counters.command("find").executed, 1);
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// RW-4: a non-retryable write whose connection is closed runs once and is not retried.
pub async fn non_retryable_write_runs_once<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let client = connect::<R>(options(&[&server]));
        ping(&client).await;
        server.handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::AlwaysOn, ["insert"]).with_close_connection(),
        ));
        let error = client
            .run_command(
                "test",
                doc! { "insert": "items", "documents": [{ "x": 1 }] },
                OperationKind::NonRetryableWrite,
            )
            .await
            .expect_err("the connection closes");
        assert_eq!(error.summary().class, ErrorClass::Network, "{error}");
        assert_eq!(server.handle.counters().command("insert").received, 1);
        server.handle.set_fail_command(None);
        let reply = client
            .run_command(
                "test",
                doc! { "insert": "items", "documents": [{ "x": 2 }] },
                OperationKind::NonRetryableWrite,
            )
            .await
            .expect("the next write runs");
        assert_eq!(reply.get_i32("n").ok(), Some(1));
        let counts = server.handle.counters().command("insert");
        assert_eq!((counts.received, counts.executed), (2, 1));
        assert_eq!(server.handle.documents("test.items").len(), 1);
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// CS-5: a CSOT deadline ends an operation the server holds far longer.
pub async fn csot_deadline_is_respected<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let mut options = options(&[&server]);
        options.timeout = Some(Duration::from_millis(300));
        let client = connect::<R>(options);
        ping(&client).await;
        // Held for an hour: only the client's deadline can end the find within the limit.
        server.handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::AlwaysOn, ["find"])
                .with_block(Duration::from_secs(3600)),
        ));
        let error = client
            .run_command("test", doc! { "find": "items" }, OperationKind::Read)
            .await
            .expect_err("the deadline passes");
        assert_eq!(error.summary().class, ErrorClass::Timeout, "{error}");
        assert_eq!(server.handle.counters().command("find").received, 1);
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// BP-5, C8: a getMore failing with an overload error is retried, on its cursor's mongos (the
/// engine's cursor pinning, through [`retry_driver::CommandOptions::cursor`]).
pub async fn overloaded_get_more_is_retried<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let first = Server::with_role(Role::Mongos).await;
        let second = Server::with_role(Role::Mongos).await;
        for server in [&first, &second] {
            let documents = (0..5).map(|i| doc! { "_id": i }).collect::<Vec<Document>>();
            server.handle.insert("test.items", documents);
            server
                .handle
                .set_fail_command(Some(overload(FailPointMode::Times(1), &["getMore"])));
        }
        let client = connect::<R>(options(&[&first, &second]));
        let find = CommandOptions::default().with_cursor(CursorUse::Open);
        let command = doc! { "find": "items", "batchSize": 2 };
        let opened = client
            .run("test", command, OperationKind::Read, find)
            .await
            .expect("find succeeds");
        let cursor = opened
            .cursor
            .expect("the engine reports the cursor it opened");
        let id = retry_core::reply::cursor_id(&opened.document).expect("a cursor id");
        let (owner, other) = if first.handle.counters().command("find").received == 1 {
            (&first, &second)
        } else {
            (&second, &first)
        };
        let get_more = CommandOptions::default().with_cursor(CursorUse::GetMore(cursor));
        let command = doc! { "getMore": id, "collection": "items", "batchSize": 2 };
        let next = client
            .run("test", command, OperationKind::GetMore, get_more)
            .await
            .expect("the getMore is retried");
        let batch = next
            .document
            .get_document("cursor")
            .and_then(|c| c.get_array("nextBatch"))
            .expect("a next batch");
        let expected = vec![
            Bson::Document(doc! { "_id": 2 }),
            Bson::Document(doc! { "_id": 3 }),
        ];
        assert_eq!(batch, &expected);
        let counts = owner.handle.counters().command("getMore");
        assert_eq!(
            (counts.received, counts.executed),
            (2, 1),
            "both on the cursor's mongos"
        );
        assert_eq!(other.handle.counters().command("getMore").received, 0);
        client.shutdown().await;
        first.stop().await;
        second.stop().await;
    })
    .await
}

/// BP-27: each attempt's connection is checked in before the backoff and the next check-out.
pub async fn connection_is_checked_in_between_attempts<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        server
            .handle
            .set_fail_command(Some(overload(FailPointMode::AlwaysOn, &["find"])));
        let (_, received, events) = overloaded_find::<R>(&server, 2).await;
        assert_eq!(received, 3);
        let pool: Vec<(Instant, &str)> = events
            .iter()
            .filter_map(|(at, e)| match e {
                EngineEvent::Pool {
                    event: PoolEvent::CheckedOut { .. },
                    ..
                } => Some((*at, "out")),
                EngineEvent::Pool {
                    event: PoolEvent::CheckedIn { .. },
                    ..
                } => Some((*at, "in")),
                _ => None,
            })
            .collect();
        let kinds: Vec<&str> = pool.iter().map(|(_, k)| *k).collect();
        assert_eq!(kinds, ["out", "in", "out", "in", "out", "in"]);
        let failed: Vec<Instant> = events
            .iter()
            .filter_map(|(at, e)| {
                matches!(
                    e,
                    EngineEvent::Operation {
                        event: RetryEvent::CommandFailed { .. },
                        ..
                    }
                )
                .then_some(*at)
            })
            .collect();
        let checked_in: Vec<Instant> = pool
            .iter()
            .filter(|(_, k)| *k == "in")
            .map(|(at, _)| *at)
            .collect();
        assert_eq!(
            checked_in, failed,
            "checked in at the instant the attempt failed, before the backoff"
        );
        // Every attempt reused the connection the ping checked in (counters reset after it).
        let counters = server.handle.counters();
        assert_eq!(
            counters.connections_accepted, 0,
            "no new connection: {counters:?}"
        );
        server.stop().await;
    })
    .await
}

/// Shutdown fails every operation in flight with a cancellation, ends the event stream, and
/// fails later operations at once.
pub async fn shutdown_fails_operations_in_flight<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        server.handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::AlwaysOn, ["find"])
                .with_block(Duration::from_secs(3600)),
        ));
        let client = connect::<R>(options(&[&server]));
        let mut events = client.events();
        let held = client.run_command("test", doc! { "find": "items" }, OperationKind::Read);
        let mut held = pin!(held);
        let handle = server.handle.clone();
        // Poll the find until the server holds it, then shut down.
        let mut shutdown = pin!(async {
            for _ in 0..10_000 {
                if handle.counters().command("find").received == 1 {
                    break;
                }
                yield_now().await;
            }
            client.shutdown().await;
        });
        let result = poll_fn(|cx| {
            if let Poll::Ready(result) = held.as_mut().poll(cx) {
                return Poll::Ready(result);
            }
            let _ = shutdown.as_mut().poll(cx);
            Poll::Pending
        })
        .await;
        let error = result.expect_err("cancelled by the shutdown");
        assert_eq!(error.summary().class, ErrorClass::Cancelled, "{error}");
        while events.next_event().await.is_some() {}
        let late = client
            .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
            .await
            .expect_err("the client is shut down");
        assert_eq!(late.summary().class, ErrorClass::Cancelled);
        server.stop().await;
    })
    .await
}

/// `(op, class)` of every `OperationFinished` in `events`, in order.
fn finished(
    events: &[(Instant, EngineEvent)],
) -> Vec<(retry_core::engine::OpId, Option<ErrorClass>)> {
    events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::OperationFinished { op, result, .. } => Some((
                *op,
                result.as_ref().err().map(|error| error.summary().class),
            )),
            _ => None,
        })
        .collect()
}

/// A `find` the server holds for an hour.
fn held_find(server: &Server) {
    server.handle.set_fail_command(Some(
        FailCommand::new(FailPointMode::AlwaysOn, ["find"]).with_block(Duration::from_secs(3600)),
    ));
}

/// Polls `future` (without finishing it) until the server has received `finds` `find`s.
async fn poll_until_received<F: Future>(
    handle: &ServerHandle,
    finds: u64,
    future: &mut core::pin::Pin<&mut F>,
) {
    for _ in 0..100_000 {
        if handle.counters().command("find").received >= finds {
            return;
        }
        let _ = poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_ready())).await;
        yield_now().await;
    }
    panic!("the server never received {finds} finds");
}

/// Dropping a `run` future cancels its operation in the engine: it finishes once with a
/// cancellation (an `OperationFinished` event, the attempt in flight failed), and the client
/// goes on serving other operations.
pub async fn dropped_run_cancels_its_operation<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        held_find(&server);
        let client = connect::<R>(options(&[&server]));
        let mut events = client.events();
        {
            let held = client.run_command("test", doc! { "find": "items" }, OperationKind::Read);
            let mut held = pin!(held);
            poll_until_received(&server.handle, 1, &mut held).await;
        }
        // The ping runs after the cancellation was handed over: its result comes after the
        // find's end.
        ping(&client).await;
        let ends = finished(&events.drain());
        assert_eq!(ends.len(), 2, "{ends:?}");
        assert_eq!(ends[0].1, Some(ErrorClass::Cancelled), "{ends:?}");
        assert_eq!(ends[1].1, None, "{ends:?}");
        client.shutdown().await;
        let late = finished(&events.drain());
        assert!(late.is_empty(), "the cancelled find ended once: {late:?}");
        server.stop().await;
    })
    .await
}

/// Shutdown ends every operation in flight exactly once, through the engine's close: each caller
/// gets a cancellation, and the event stream carries one `OperationFinished` per operation.
pub async fn shutdown_ends_every_operation_once<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        held_find(&server);
        let client = connect::<R>(options(&[&server]));
        let mut events = client.events();
        let find = || client.run_command("test", doc! { "find": "items" }, OperationKind::Read);
        let mut held = pin!(async {
            let (a, b, c) = (find(), find(), find());
            let (mut a, mut b, mut c) = (pin!(a), pin!(b), pin!(c));
            let mut results = [None, None, None];
            poll_fn(|cx| {
                for (slot, future) in results.iter_mut().zip([
                    a.as_mut().poll(cx),
                    b.as_mut().poll(cx),
                    c.as_mut().poll(cx),
                ]) {
                    if let Poll::Ready(result) = future {
                        slot.get_or_insert(result);
                    }
                }
                if results.iter().all(Option::is_some) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            results.map(Option::unwrap)
        });
        poll_until_received(&server.handle, 3, &mut held).await;
        let mut shutdown = pin!(client.shutdown());
        let mut shut = false;
        let results = poll_fn(|cx| {
            shut = shut || shutdown.as_mut().poll(cx).is_ready();
            held.as_mut().poll(cx)
        })
        .await;
        for result in results {
            let error = result.expect_err("cancelled by the shutdown");
            assert_eq!(error.summary().class, ErrorClass::Cancelled, "{error}");
        }
        if !shut {
            shutdown.await;
        }
        let mut all = Vec::new();
        while let Some(event) = events.next_event().await {
            all.push(event);
        }
        let ends = finished(&all);
        assert_eq!(ends.len(), 3, "{ends:?}");
        let mut ops: Vec<_> = ends.iter().map(|(op, _)| *op).collect();
        ops.sort();
        ops.dedup();
        assert_eq!(ops.len(), 3, "each operation ends once: {ends:?}");
        assert!(ends
            .iter()
            .all(|(_, class)| *class == Some(ErrorClass::Cancelled)));
        server.stop().await;
    })
    .await
}

/// Yields once to the executor.
async fn yield_now() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// `#[test]`s for every scenario on the runtime `$runtime`, each run by `$block_on` (a function
/// from a future to its output).
#[macro_export]
macro_rules! suite {
    ($runtime:ty, $block_on:expr) => {
        $crate::suite!(@tests $runtime, $block_on;
            handshake_carries_backpressure,
            overload_gives_three_attempts,
            max_adaptive_retries_one_gives_two_attempts,
            two_mongos_retry_goes_to_the_other,
            stable_api_declared_version_reaches_a_server_that_requires_one,
            load_balanced_needs_service_id,
            reset_handshakes_are_labelled_and_retried,
            reset_handshake_retry_succeeds_once_admitted,
            non_retryable_write_runs_once,
            csot_deadline_is_respected,
            overloaded_get_more_is_retried,
            connection_is_checked_in_between_attempts,
            shutdown_fails_operations_in_flight,
            dropped_run_cancels_its_operation,
            shutdown_ends_every_operation_once,
            fault_soak,
            tls_with_the_test_ca_works,
            tls_expired_certificate_is_refused_unless_insecure,
            tls_wrong_host_certificate_is_refused_unless_allowed,
            srv_seedlist_connects_with_tls_to_its_target,
            tls_client_certificate_from_the_key_file,
            errors_say_their_cause,
            cursors_fetch_batches_and_are_killed_when_dropped,
            w3_l9_cursor_get_more_fields_and_close_after_an_error,
            write_errors_are_errors_that_keep_the_reply,
            encoded_commands_run_as_their_documents_do,
            commands_are_classified_by_default,
            the_monitors_first_check_is_its_handshake,
            events_from_connect_start_with_the_topology_opening,
            monitoring_streams_or_polls_as_the_mode_says,
            scram_right_password_authenticates,
            scram_wrong_password_is_a_clear_error,
            scram_server_stopping_mid_conversation_is_a_network_error,
            scram_sdam_auth_errors_clear_the_pool_once,
            scram_authenticates_through_a_load_balancer,
            // What the client sends (sessions.rs).
            retried_insert_runs_once_with_one_lsid_and_txn_number,
            secondary_read_carries_read_preference_and_lsid,
            ss10_a_generic_command_ignores_the_client_read_preference,
            max_time_ms_is_on_every_attempt_under_timeout_ms,
            socket_timeout_bounds_a_server_that_never_answers,
            explicit_session_runs_several_operations,
            // Hedged reads (hedging.rs).
            hedged_read_the_fast_copy_wins_and_the_slow_connection_is_checked_in,
            client_concerns_reach_command_and_cursor,
            ending_a_session_aborts_its_transaction,
            sessions_and_transactions_inherit_the_client_concerns,
            a_sessions_second_read_is_after_the_previous_operation_time,
            // The driver polls only ready sockets (idle_sockets.rs).
            idle_sockets_are_not_polled,
        );
    };
    (@tests $runtime:ty, $block_on:expr; $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                ($block_on)($crate::$name::<$runtime>())
            }
        )*
    };
}
