//! Review32 R5: a client is bound to the tokio runtime current at its connect. Used after that
//! runtime has shut down (a client kept in a `static` and used from `#[tokio::test]`s, each with
//! a runtime of its own), its operations fail with a clear error: never a panic (the driver's
//! timer belongs to the dead runtime), never a hang (its task will never run again).

use std::time::Duration;

use retry_core::error::ErrorKind;
use retry_core::retry::OperationKind;
use retry_scenarios::Server;
use retry_testkit::Role;
use retry_tokio::Client;

/// A multi-thread runtime with one worker, or a current-thread one.
fn runtime(multi_thread: bool) -> tokio::runtime::Runtime {
    let mut builder = if multi_thread {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(1);
        builder
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().expect("a tokio runtime")
}

fn ping(
    client: &Client,
) -> impl core::future::Future<Output = Result<bson::Document, retry_core::error::OperationError>> + '_
{
    client.run_command("admin", bson::doc! { "ping": 1 }, OperationKind::RunCommand)
}

/// The scenario of R5: created and used on runtime A, A dropped, then used on runtime B under a
/// timeout. Before the fix the first operation on B panicked in the caller's task ("A Tokio 1.x
/// context was found, but it is being shutdown"), polling A's timer in its inline pass; an
/// operation that was not alone in flight waited for A's dead task forever.
fn used_after_its_runtime_shut_down(multi_thread: bool) {
    let a = runtime(multi_thread);
    let (client, server) = a.block_on(async {
        let server = Server::with_role(Role::Standalone).await;
        let uri = format!("mongodb://{}/?timeoutMS=2000", server.address);
        let client = Client::with_uri(&uri).expect("a client");
        ping(&client)
            .await
            .expect("the ping on the runtime it was created on");
        (client, server)
    });
    drop(a);
    let b = runtime(multi_thread);
    b.block_on(async {
        let limit = Duration::from_secs(10);
        // Alone, then two at once, then a session: each refused as it is queued (the client is
        // closed since A dropped the driver's task).
        let error = tokio::time::timeout(limit, ping(&client))
            .await
            .expect("no hang")
            .expect_err("the runtime is gone");
        assert!(matches!(error.kind, ErrorKind::Usage { .. }), "{error:?}");
        assert!(
            error
                .to_string()
                .contains("the runtime this client was created on has shut down"),
            "{error}"
        );
        let (first, second) =
            tokio::time::timeout(limit, async { tokio::join!(ping(&client), ping(&client)) })
                .await
                .expect("no hang");
        assert_eq!(first.unwrap_err().to_string(), error.to_string());
        assert_eq!(second.unwrap_err().to_string(), error.to_string());
        let session = tokio::time::timeout(limit, client.start_session())
            .await
            .expect("no hang");
        assert_eq!(session.unwrap_err().to_string(), error.to_string());
        tokio::time::timeout(limit, client.shutdown())
            .await
            .expect("shutdown returns");
        let mut events = client.events();
        assert!(
            events.next_event().await.is_none(),
            "no events: the client is done"
        );
    });
    drop(server);
}

#[test]
fn review32_r5_a_client_used_after_its_multi_thread_runtime_shut_down_fails_clearly() {
    used_after_its_runtime_shut_down(true);
}

#[test]
fn review32_r5_a_client_used_after_its_current_thread_runtime_shut_down_fails_clearly() {
    used_after_its_runtime_shut_down(false);
}

/// Review34 Y5: an operation in flight (sent, its reply held by the server) when the client's
/// runtime A shuts down, awaited on another runtime's thread: it ends once, bounded, with
/// `Cancelled` (it may have been sent), and the next one fails with the runtime's loss. Fails
/// (a hang until the bound) if the drop of the driver's task leaves an operation in flight
/// waiting.
#[test]
fn review34_y5_an_operation_in_flight_when_the_runtime_shuts_down_ends_cancelled() {
    let limit = Duration::from_secs(10);
    // The server on a runtime of its own, which outlives A.
    let s = runtime(true);
    let server = s.block_on(Server::with_role(Role::Standalone));
    let a = runtime(true);
    let (client, mut events) = a.block_on(async {
        let uri = format!("mongodb://{}/", server.address);
        let client = Client::with_uri(&uri).expect("a client");
        let fail_point = bson::doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["ping"], "blockConnection": true, "blockTimeMS": 60_000 },
        };
        client
            .run_command("admin", fail_point, OperationKind::RunCommand)
            .await
            .expect("the fail point is set");
        let events = client.events();
        (client, events)
    });
    std::thread::scope(|scope| {
        let caller = scope.spawn(|| {
            runtime(false).block_on(async {
                let first = tokio::time::timeout(limit, ping(&client)).await;
                let second = tokio::time::timeout(limit, ping(&client)).await;
                (first, second)
            })
        });
        // The ping was written (its command started) before A goes.
        a.block_on(async {
            tokio::time::timeout(limit, async {
                while let Some((_, event)) = events.next_event().await {
                    if matches!(event, retry_core::engine::EngineEvent::Command(_)) {
                        return;
                    }
                }
                panic!("the events ended first");
            })
            .await
            .expect("the ping is sent");
        });
        drop(a);
        let (first, second) = caller.join().expect("no panic");
        let first = first.expect("no hang").expect_err("cancelled");
        assert!(matches!(first.kind, ErrorKind::Cancelled), "{first:?}");
        let second = second.expect("no hang").expect_err("the runtime is gone");
        assert!(matches!(second.kind, ErrorKind::Usage { .. }), "{second:?}");
        assert!(
            second
                .to_string()
                .contains("the runtime this client was created on has shut down"),
            "{second}"
        );
    });
    drop(server);
    drop(s);
}
