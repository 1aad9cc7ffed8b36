//! House rule 8, review9 finding 1: the client's futures drive the engine (`LocalDriver`), and a
//! future whose task never polls it again (a thread blocked on something else, the branch of a
//! `select` that lost) must stop nobody else's operation, nor its deadline. B's operation starts
//! first, then A is polled once in a task of its own, so A is the waiting future a wake reaches
//! first. Heartbeats are a minute apart, so the only wakes are the operations' own (a reply, a
//! deadline). Each run is bounded in time (`LIMIT`); every poll is explicit or one await.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::{Context, Waker};
use std::time::Duration;

use bson::doc;
use futures_lite::future::poll_once;
use retry_core::error::ErrorClass;
use retry_core::retry::OperationKind;
use retry_scenarios::{bounded, options, Server};
use retry_testkit::{FailCommand, FailPointMode, Role};

type Client = retry_async_std::Client;

/// The bound of each run: a stalled driver fails it.
const LIMIT: Duration = Duration::from_secs(20);

/// How long after B's operation A is polled (its one poll).
const A_LATER: Duration = Duration::from_secs(1);

/// A client of a standalone that holds every `find` for `block`, with `timeout` as timeoutMS,
/// after one ping (the pool has a connection and the server is known).
async fn client_with_held_finds(block: Duration, timeout: Option<Duration>) -> (Server, Client) {
    let server = Server::with_role(Role::Standalone).await;
    let mut options = options(&[&server]);
    options.heartbeat_frequency = Duration::from_secs(60);
    options.timeout = timeout;
    let client = Client::connect(options).expect("a client");
    client
        .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
        .await
        .expect("ping");
    server.handle.set_fail_command(Some(
        FailCommand::new(FailPointMode::AlwaysOn, ["find"]).with_block(block),
    ));
    (server, client)
}

/// Polls `a` once in a task of its own that will not poll it again (a thread blocked on something
/// else, or a `select` whose other branch won): it wakes nothing here.
fn poll_once_elsewhere<F: Future>(a: Pin<&mut F>) -> bool {
    a.poll(&mut Context::from_waker(Waker::noop())).is_pending()
}

/// A find; a failure must be the operation's timeout.
async fn find(client: &Client) -> Result<bson::Document, String> {
    client
        .run_command("test", doc! { "find": "items" }, OperationKind::Read)
        .await
        .map_err(|error| {
            assert_eq!(error.summary().class, ErrorClass::Timeout, "{error}");
            error.to_string()
        })
}

/// Review9 finding 1 (house rule 8): B's reply reaches B while A, woken by that reply, is never
/// polled; B ends with its reply before A's (a second later) arrives.
#[test]
fn an_operation_ends_while_a_woken_future_is_left_unpolled() {
    smol::block_on(bounded(LIMIT, async {
        let (server, client) = client_with_held_finds(Duration::from_secs(2), None).await;
        let mut b = pin!(find(&client));
        assert!(poll_once(b.as_mut()).await.is_none(), "held by the server");
        async_io::Timer::after(A_LATER).await;
        let mut a = pin!(find(&client));
        assert!(poll_once_elsewhere(a.as_mut()), "held by the server");
        let reply = b.await.expect("B's find succeeds");
        assert!(reply.get_document("cursor").is_ok(), "{reply}");
        assert!(
            poll_once_elsewhere(a.as_mut()),
            "B ended with its own reply, before A's came"
        );
        client.shutdown().await;
        server.stop().await;
    }));
}

/// Review9 finding 1 (house rule 8, CS-4): B's deadline passes while A, woken by B's deadline
/// timer, is never polled; B fails with its timeout at its deadline, before A's (a second later).
#[test]
fn a_deadline_ends_its_operation_while_a_woken_future_is_left_unpolled() {
    smol::block_on(bounded(LIMIT, async {
        let timeout = Duration::from_secs(2);
        let (server, client) =
            client_with_held_finds(Duration::from_secs(3600), Some(timeout)).await;
        let mut b = pin!(find(&client));
        assert!(poll_once(b.as_mut()).await.is_none(), "held by the server");
        async_io::Timer::after(A_LATER).await;
        let mut a = pin!(find(&client));
        assert!(poll_once_elsewhere(a.as_mut()), "held by the server");
        b.await.expect_err("B's deadline passes first");
        assert!(
            poll_once_elsewhere(a.as_mut()),
            "B failed at its own deadline, before A's"
        );
        client.shutdown().await;
        server.stop().await;
    }));
}
