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
        // Alone in flight (the inline pass), then two at once (the task's work).
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
