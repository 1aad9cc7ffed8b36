//! TO-6 (`maxCommitTimeMS`) and TO-14 (a session's `defaultTimeoutMS`) through the driver's
//! public session API, against a retry-testkit replica-set primary: the `maxTimeMS` of the
//! `commitTransaction` and `abortTransaction` the client writes (EV-2 started events).
//!
//! The timeouts are minutes long, so that a derived `maxTimeMS` (CS-4: the remaining time, less
//! the minimum RTT) is told from `maxCommitTimeMS` (1 s) and from the other timeout however slow
//! the machine: no assertion depends on how long a step takes (house rule 3). The exact values
//! are asserted in virtual time by `retry-sim/tests/transaction_timeouts.rs`.

use std::time::Duration;

use bson::{doc, Bson, Document};
use retry_core::engine::{CommandEvent, EngineEvent};
use retry_core::error::ErrorKind;
use retry_core::retry::OperationKind;
use retry_core::transaction::TransactionOptions;
use retry_driver::SessionOptions;
use retry_testkit::{ServerConfig, TestServer};
use retry_tokio::{Client, ClientOptions, Events, Session};

/// Bounds every test (house rule 3: every wait is bounded).
const LIMIT: Duration = Duration::from_secs(60);

const SESSION_MS: i64 = 600_000;
const CLIENT_MS: u64 = 300_000;

/// A one-member replica set and a client of it, with `timeoutMS` = `timeout`.
async fn primary_and_client(timeout: Option<Duration>) -> (Vec<TestServer>, Client) {
    let servers = TestServer::start_replica_set("rs0", 1, ServerConfig::default())
        .await
        .expect("the replica set starts");
    let address = servers[0].address();
    let host = retry_core::address::ServerAddress::new(&address.ip().to_string(), address.port());
    let mut options = ClientOptions::new(vec![host]);
    options.seed = Some(7);
    options.server_selection_timeout = Duration::from_secs(5);
    options.timeout = timeout;
    let client = Client::connect(options).expect("the client starts");
    (servers, client)
}

/// The commands named `name` the client wrote so far (EV-2), kept in `seen`.
fn started(events: &mut Events, seen: &mut Vec<Document>, name: &str) -> Vec<Document> {
    for (_, event) in events.drain() {
        if let EngineEvent::Command(event) = event {
            if let CommandEvent::Started { command, .. } = &*event {
                seen.push(command.clone());
            }
        }
    }
    seen.iter()
        .filter(|c| c.keys().next().map(String::as_str) == Some(name))
        .cloned()
        .collect()
}

/// The `maxTimeMS` of `command` as a number, `None` without one.
fn max_time(command: &Document) -> Option<i64> {
    match command.get("maxTimeMS")? {
        Bson::Int32(ms) => Some(i64::from(*ms)),
        Bson::Int64(ms) => Some(*ms),
        other => panic!("maxTimeMS is not an integer: {other}"),
    }
}

/// Starts a transaction in `session` and inserts into it.
async fn transaction_with_an_insert(session: &Session) {
    session.start_transaction().await.expect("a transaction");
    session
        .run_command(
            "test",
            doc! { "insert": "c", "documents": [{ "x": 1 }] },
            OperationKind::RetryableWrite,
        )
        .await
        .expect("the insert in the transaction");
}

fn one_second_commits() -> TransactionOptions {
    TransactionOptions::default().with_max_commit_time(Duration::from_millis(1_000))
}

/// TO-14, TO-6, TO-8: a session's `defaultTimeoutMS` (10 min) covers its commit, its abort and
/// the abort of ending it, ahead of the client's `timeoutMS` (5 min): each carries a `maxTimeMS`
/// derived from the session's timeout (more than the client's whole timeout), never the
/// transaction's `maxCommitTimeMS` (1 s, from the session's `defaultTransactionOptions`); the
/// transaction's insert takes the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to14_session_default_timeout_covers_commit_abort_and_end_session() {
    tokio::time::timeout(LIMIT, async {
        let (servers, client) = primary_and_client(Some(Duration::from_millis(CLIENT_MS))).await;
        let mut events = client.events();
        let mut seen = Vec::new();
        let options = SessionOptions::default()
            .with_default_timeout_ms(SESSION_MS)
            .expect("a valid timeout")
            .with_default_transaction_options(one_second_commits());
        let session = client.start_session_with(options).await.expect("a session");
        assert_eq!(
            session.options().default_timeout,
            Some(Duration::from_millis(600_000))
        );
        transaction_with_an_insert(&session).await;
        session.commit_transaction().await.expect("the commit");
        transaction_with_an_insert(&session).await;
        session.abort_transaction().await.expect("the abort");
        transaction_with_an_insert(&session).await;
        drop(session);
        let mut aborts = Vec::new();
        for _ in 0..1_000 {
            aborts = started(&mut events, &mut seen, "abortTransaction");
            if aborts.len() == 2 {
                break;
            }
            client
                .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
                .await
                .expect("ping");
        }
        let commits = started(&mut events, &mut seen, "commitTransaction");
        let inserts = started(&mut events, &mut seen, "insert");
        assert_eq!((commits.len(), aborts.len(), inserts.len()), (1, 2, 3));
        let session_ms = SESSION_MS;
        let client_ms = CLIENT_MS as i64;
        for command in commits.iter().chain(&aborts) {
            let ms = max_time(command).expect("a derived maxTimeMS");
            assert!(
                ms > client_ms && ms <= session_ms,
                "TO-14: the session's timeout, not the client's nor maxCommitTimeMS: {command}"
            );
        }
        for insert in &inserts {
            let ms = max_time(insert).expect("the client's timeoutMS");
            assert!(ms > 1_000 && ms <= client_ms, "{insert}");
        }
        client.shutdown().await;
        for server in servers {
            server.shutdown().await;
        }
    })
    .await
    .expect("within the limit");
}

/// TO-14: without `defaultTimeoutMS` a session's commit takes the client's `timeoutMS` (its
/// `maxTimeMS` derived from it, `maxCommitTimeMS` ignored, TO-8); with `defaultTimeoutMS=0` it
/// runs without a limit and sends no `maxTimeMS` (TO-7), whatever the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to14_without_default_timeout_the_session_takes_the_clients() {
    tokio::time::timeout(LIMIT, async {
        let (servers, client) = primary_and_client(Some(Duration::from_millis(CLIENT_MS))).await;
        let mut events = client.events();
        let mut seen = Vec::new();
        let inherits =
            SessionOptions::default().with_default_transaction_options(one_second_commits());
        let session = client
            .start_session_with(inherits)
            .await
            .expect("a session");
        transaction_with_an_insert(&session).await;
        session.commit_transaction().await.expect("the commit");
        drop(session);
        let unbounded = SessionOptions::default()
            .with_default_timeout(Duration::ZERO)
            .with_default_transaction_options(one_second_commits());
        let session = client
            .start_session_with(unbounded)
            .await
            .expect("a session");
        transaction_with_an_insert(&session).await;
        session.commit_transaction().await.expect("the commit");

        let commits = started(&mut events, &mut seen, "commitTransaction");
        assert_eq!(commits.len(), 2);
        let ms = max_time(&commits[0]).expect("derived from the client's timeoutMS");
        assert!(ms > 1_000 && ms <= CLIENT_MS as i64, "{}", commits[0]);
        assert_eq!(max_time(&commits[1]), None, "{}", commits[1]);
        drop(session);
        client.shutdown().await;
        for server in servers {
            server.shutdown().await;
        }
    })
    .await
    .expect("within the limit");
}

/// TO-6 (`legacy-timeouts.json`): without any `timeoutMS`, `maxCommitTimeMS` is the commit's
/// `maxTimeMS` exactly; `start_transaction_with`'s own value replaces the session's default,
/// and the abort carries none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to6_max_commit_time_is_sent_without_timeout_ms() {
    tokio::time::timeout(LIMIT, async {
        let (servers, client) = primary_and_client(None).await;
        let mut events = client.events();
        let mut seen = Vec::new();
        let options =
            SessionOptions::default().with_default_transaction_options(one_second_commits());
        let session = client.start_session_with(options).await.expect("a session");
        transaction_with_an_insert(&session).await;
        session.commit_transaction().await.expect("the commit");
        let own = TransactionOptions::default()
            .with_max_commit_time_ms(2_500)
            .expect("valid");
        session.start_transaction_with(own).await.unwrap();
        session
            .run_command(
                "test",
                doc! { "insert": "c", "documents": [{ "x": 2 }] },
                OperationKind::RetryableWrite,
            )
            .await
            .unwrap();
        session.commit_transaction().await.expect("the commit");
        transaction_with_an_insert(&session).await;
        session.abort_transaction().await.expect("the abort");

        let commits = started(&mut events, &mut seen, "commitTransaction");
        let aborts = started(&mut events, &mut seen, "abortTransaction");
        let inserts = started(&mut events, &mut seen, "insert");
        assert_eq!(commits.len(), 2);
        assert_eq!(commits[0].get("maxTimeMS"), Some(&Bson::Int32(1_000)));
        assert_eq!(commits[1].get("maxTimeMS"), Some(&Bson::Int32(2_500)));
        assert_eq!(max_time(&aborts[0]), None);
        assert!(inserts.iter().all(|i| max_time(i).is_none()));
        drop(session);
        client.shutdown().await;
        for server in servers {
            server.shutdown().await;
        }
    })
    .await
    .expect("within the limit");
}

/// TO-6, TO-14: negative values are usage errors, never panics; a `maxCommitTimeMS` a server
/// would refuse fails `start_transaction_with` with a usage error and starts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to6_to14_bad_values_are_usage_errors() {
    let usage = |kind: &ErrorKind| matches!(kind, ErrorKind::Usage { .. });
    let error = SessionOptions::default()
        .with_default_timeout_ms(-1)
        .expect_err("negative");
    assert!(usage(&error.kind), "{error:?}");
    assert!(error.to_string().contains("defaultTimeoutMS"), "{error}");
    let error = TransactionOptions::default()
        .with_max_commit_time_ms(-5)
        .expect_err("negative");
    assert!(usage(&error.kind), "{error:?}");
    tokio::time::timeout(LIMIT, async {
        let (servers, client) = primary_and_client(None).await;
        let session = client.start_session().await.expect("a session");
        let too_long =
            TransactionOptions::default().with_max_commit_time(Duration::from_secs(30 * 86_400));
        let error = session
            .start_transaction_with(too_long)
            .await
            .expect_err("refused");
        assert!(usage(&error.kind), "{error:?}");
        assert!(error.to_string().contains("maxCommitTimeMS"), "{error}");
        // Nothing started: a transaction starts now.
        session.start_transaction().await.expect("a transaction");
        drop(session);
        client.shutdown().await;
        for server in servers {
            server.shutdown().await;
        }
    })
    .await
    .expect("within the limit");
}
