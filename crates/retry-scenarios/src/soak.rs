//! The fault soak: many operations through one client while the server injects random faults.

use core::future::{poll_fn, Future};
use core::pin::Pin;
use core::task::Poll;
use std::collections::BTreeMap;
use std::time::Duration;

use bson::doc;
use retry_core::engine::EngineEvent;
use retry_core::error::ErrorClass;
use retry_core::retry::OperationKind;
use retry_driver::{Client, Runtime};
use retry_testkit::{FaultConfig, Role, ServerConfig};

use crate::{bounded, options, Server};

/// Operations per soak when `RETRY_SOAK_OPERATIONS` is not set; set it to `10000` for the full
/// soak.
pub const SOAK_OPERATIONS_DEFAULT: usize = 1_000;
/// Operations in flight at once.
const CONCURRENCY: usize = 32;
/// The soak's bound: 60 s plus 50 ms per operation (each fault that clears the pool stalls every
/// operation until the monitor sees the server again), generous on 2 cores.
fn soak_limit(operations: usize) -> Duration {
    Duration::from_secs(60)
        + Duration::from_millis(50).saturating_mul(u32::try_from(operations).unwrap_or(u32::MAX))
}

fn operations() -> usize {
    std::env::var("RETRY_SOAK_OPERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(SOAK_OPERATIONS_DEFAULT)
}

/// Runs `RETRY_SOAK_OPERATIONS` (default [`SOAK_OPERATIONS_DEFAULT`]) finds and inserts, 32 at a
/// time, against a server that resets replies mid-frame, stalls them past the operation's
/// deadline, and sends garbage or oversized frames. Every operation ends with exactly one outcome
/// (one result to its caller, one `OperationFinished` event), every failure is a network, timeout,
/// checkout, selection, pool-cleared or overload error, nothing panics, and the whole run ends
/// within its bound.
pub async fn fault_soak<R: Runtime>() {
    let total = operations();
    bounded(soak_limit(total), async {
        let mut config = ServerConfig::new(Role::Standalone);
        config.seed = crate::SEED;
        config.faults = FaultConfig {
            reset_mid_frame: 0.02,
            stall: 0.005,
            garbage: 0.02,
            oversized_length: 0.01,
            stall_for: Duration::from_secs(2),
        };
        let server = Server::start(config).await;
        let mut options = options(&[&server]);
        options.timeout = Some(Duration::from_millis(500));
        let client = Client::<R>::connect(options).expect("the client starts");
        let mut events = client.events();
        let mut outcomes: BTreeMap<&'static str, usize> = BTreeMap::new();
        let mut workers: Vec<Pin<Box<dyn Future<Output = Vec<&'static str>> + '_>>> = (0
            ..CONCURRENCY)
            .map(|w| {
                let client = &client;
                let share = (total + CONCURRENCY - 1 - w) / CONCURRENCY;
                Box::pin(async move {
                    let mut results = Vec::with_capacity(share);
                    for i in 0..share {
                        results.push(one_operation(client, w * 1_000_000 + i).await);
                    }
                    results
                }) as Pin<Box<dyn Future<Output = Vec<&'static str>>>>
            })
            .collect();
        let mut finished_workers = 0;
        poll_fn(|cx| {
            for worker in workers.iter_mut() {
                if let Poll::Ready(results) = worker.as_mut().poll(cx) {
                    finished_workers += 1;
                    for outcome in results {
                        *outcomes.entry(outcome).or_default() += 1;
                    }
                    *worker = Box::pin(core::future::pending());
                }
            }
            if finished_workers == CONCURRENCY {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        client.shutdown().await;
        assert_eq!(outcomes.values().sum::<usize>(), total, "{outcomes:?}");
        let mut finished: BTreeMap<u64, usize> = BTreeMap::new();
        while let Some(event) = events.next_event().await {
            if let (_, EngineEvent::OperationFinished { op, .. }) = event {
                *finished.entry(op.0).or_default() += 1;
            }
        }
        assert_eq!(finished.len(), total, "one OperationFinished per operation");
        assert!(
            finished.values().all(|n| *n == 1),
            "exactly one outcome each"
        );
        assert!(outcomes.get("ok").is_some_and(|n| *n > 0), "{outcomes:?}");
        let faults = server.handle.counters().faults;
        assert!(faults.total() > 0, "faults were injected: {faults:?}");
        server.stop().await;
    })
    .await
}

/// One operation: odd ones insert (a non-retryable write), even ones find.
async fn one_operation<R>(client: &Client<R>, i: usize) -> &'static str {
    let result = if i.is_multiple_of(2) {
        client
            .run_command(
                "test",
                doc! { "find": "items", "limit": 1 },
                OperationKind::Read,
            )
            .await
    } else {
        let insert = doc! { "insert": "items", "documents": [{ "i": i as i64 }] };
        client
            .run_command("test", insert, OperationKind::NonRetryableWrite)
            .await
    };
    match result {
        Ok(_) => "ok",
        Err(error) => match error.summary().class {
            ErrorClass::Network => "network",
            ErrorClass::Timeout => "timeout",
            ErrorClass::ServerSelection => "selection",
            ErrorClass::PoolCleared => "pool cleared",
            // A CSOT deadline that passes while waiting for a connection.
            ErrorClass::Checkout => "checkout",
            ErrorClass::Server if error.is_overload() => "overload",
            other => panic!("unexpected {other:?}: {error}"),
        },
    }
}
