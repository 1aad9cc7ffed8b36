//! Issue 9: many operations in flight on one thread's executor (`smol::LocalExecutor` under
//! `smol::block_on`, the arrangement docs/adapters.md recommends), where the callers' own futures
//! drive the engine (`LocalDriver`) and a burst of replies wakes one of them: every operation ends
//! exactly once, also when futures are dropped after one poll (each run is bounded by
//! `SCENARIO_LIMIT`: a stalled driver fails it).

use bson::doc;
use futures_lite::future::poll_once;
use retry_core::retry::OperationKind;
use retry_scenarios::{bounded, options, Server, SCENARIO_LIMIT};
use retry_testkit::Role;

type Client = retry_async_std::Client;

async fn ping(client: &Client) {
    client
        .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
        .await
        .expect("ping");
}

/// Runs `caller(i, client)` for i in 0..64 as tasks of one `smol::LocalExecutor` under
/// `smol::block_on`, bounded by `SCENARIO_LIMIT`, and returns how many pings the server received.
fn sixty_four_callers<F, Fut>(caller: F) -> u64
where
    F: Fn(usize, Client) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    smol::block_on(bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let client = Client::connect(options(&[&server])).expect("a client");
        let executor = smol::LocalExecutor::new();
        executor
            .run(async {
                let tasks: Vec<_> = (0..64)
                    .map(|i| executor.spawn(caller(i, client.clone())))
                    .collect();
                for task in tasks {
                    task.await;
                }
            })
            .await;
        let pings = server.handle.counters().command("ping").received;
        client.shutdown().await;
        server.stop().await;
        pings
    }))
}

/// 64 callers, 20 pings each, on one thread: every ping ends with its reply.
#[test]
fn sixty_four_callers_on_one_thread_all_finish() {
    let pings = sixty_four_callers(|_, client| async move {
        for _ in 0..20 {
            ping(&client).await;
        }
    });
    assert_eq!(pings, 64 * 20);
}

/// After each reply, half of the 64 callers queue a ping, poll it once and drop it (a future that
/// may have been woken to run the driver for everyone), then ping again: the others' operations
/// still start and every kept ping ends.
#[test]
fn futures_dropped_after_one_poll_stall_nobody() {
    let pings = sixty_four_callers(|i, client| async move {
        for _ in 0..10 {
            ping(&client).await;
            if i % 2 == 0 {
                let dropped =
                    client.run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand);
                // Dropped after one poll (which may even have finished it: the reply can come
                // within the driver's pass).
                let _ = poll_once(Box::pin(dropped)).await;
            }
        }
    });
    assert!((640..=640 + 320).contains(&pings), "{pings} pings");
}
