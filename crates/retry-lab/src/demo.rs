//! `retry-lab demo`: the same overload, driven through the tokio client under each retry policy.
//!
//! For each policy the demo starts a fresh [`Cluster`] of test `mongos` routers behind ingress
//! rate limiters, connects a fresh client (seeded with the demo's seed) with that policy, and
//! runs `operations` reads with `concurrency` of them in flight. It counts what the client reports
//! ([`Tally`]) and what the routers counted, and returns one [`PolicyRun`] per policy.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use indicatif::{ProgressBar, ProgressStyle};
use retry_core::budget::GrpcThrottle;
use retry_core::policy::{GrpcPolicy, OptionError, RetryPolicy};
use retry_core::retry::OperationKind;
use retry_tokio::{Client, ClientOptions, ConnectError};
use tokio::task::{JoinError, JoinSet};

use crate::cli::{DemoArgs, PolicyName};
use crate::cluster::Cluster;
use crate::report::PolicyRun;
use crate::stats::Tally;

/// The database and collection the demo reads.
pub const DATABASE: &str = "lab";
/// The collection the demo reads.
pub const COLLECTION: &str = "items";
/// The command the demo runs, as the routers count it.
pub const COMMAND: &str = "find";

/// gRPC A6 parameters of the demo's `grpc` policy: up to 5 attempts (A6's cap), backoff
/// 100 ms · 2ⁿ up to 10 s (the current spec's base and cap), retrying the routers' code 462.
pub const GRPC_MAX_ATTEMPTS: i64 = 5;
/// See [`GRPC_MAX_ATTEMPTS`].
pub const GRPC_INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// See [`GRPC_MAX_ATTEMPTS`].
pub const GRPC_MAX_BACKOFF: Duration = Duration::from_secs(10);
/// See [`GRPC_MAX_ATTEMPTS`].
pub const GRPC_BACKOFF_MULTIPLIER: f64 = 2.0;
/// See [`GRPC_MAX_ATTEMPTS`]: `IngressRequestRateLimitExceeded`.
pub const GRPC_RETRYABLE_CODES: [i32; 1] = [462];
/// The retry throttle of the `grpc` policy: A6's example, 10 tokens and a ratio of 0.1 (retries
/// stop once failures outnumber successes about ten to one).
pub const GRPC_THROTTLE: (f64, f64) = (10.0, 0.1);

/// Why the demo could not run.
#[derive(Debug)]
pub enum DemoError {
    /// A test server could not start.
    Server(io::Error),
    /// A client could not be created.
    Client(ConnectError),
    /// A policy's parameters were refused.
    Policy(OptionError),
    /// A task of the demo panicked or was cancelled.
    Task(JoinError),
}

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DemoError::Server(e) => write!(f, "cannot start a test server: {e}"),
            DemoError::Client(e) => write!(f, "cannot create the client: {e}"),
            DemoError::Policy(e) => write!(f, "bad policy: {e}"),
            DemoError::Task(e) => write!(f, "a demo task failed: {e}"),
        }
    }
}

impl std::error::Error for DemoError {}

/// The client options of `policy` for `cluster`, with the RNG seeded by `seed`.
pub fn client_options(
    policy: PolicyName,
    cluster: &Cluster,
    seed: u64,
) -> Result<ClientOptions, DemoError> {
    let mut options = ClientOptions::new(cluster.seed_list());
    options.seed = Some(seed);
    match policy {
        PolicyName::None => {
            options.retry_reads = false;
            options.retry_writes = false;
        }
        PolicyName::Current => options.policy = RetryPolicy::Current,
        PolicyName::TokenBucket => options.policy = RetryPolicy::token_bucket(),
        PolicyName::Grpc => {
            let (max_tokens, token_ratio) = GRPC_THROTTLE;
            let throttle = GrpcThrottle::new(max_tokens, token_ratio).map_err(DemoError::Policy)?;
            let grpc = GrpcPolicy::new(
                GRPC_MAX_ATTEMPTS,
                GRPC_INITIAL_BACKOFF,
                GRPC_MAX_BACKOFF,
                GRPC_BACKOFF_MULTIPLIER,
                &GRPC_RETRYABLE_CODES,
            )
            .map_err(DemoError::Policy)?
            .with_throttle(Arc::new(throttle));
            options.policy = RetryPolicy::Grpc(Arc::new(grpc));
        }
    }
    Ok(options)
}

/// A progress bar for one policy's run: drawn on standard error when `visible` (and standard
/// error is a terminal), hidden otherwise.
pub fn progress_bar(policy: PolicyName, operations: u32, visible: bool) -> ProgressBar {
    let bar = if visible {
        ProgressBar::new(u64::from(operations))
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix:>13} [{bar:30}] {pos}/{len} ops {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(policy.as_str());
    bar
}

/// Runs every policy of `args` in turn and returns their results, in order.
pub async fn run(args: &DemoArgs, progress: bool) -> Result<Vec<PolicyRun>, DemoError> {
    let mut runs = Vec::with_capacity(args.policies.len());
    for &policy in &args.policies {
        let bar = progress_bar(policy, args.operations, progress);
        runs.push(run_policy(args, policy, &bar).await?);
        bar.finish();
        if !bar.is_hidden() {
            // The finished bar stays on its line; the next output starts below it.
            eprintln!();
        }
    }
    Ok(runs)
}

/// Runs one policy: fresh routers, a fresh client, `args.operations` reads with
/// `args.concurrency` in flight, each finished operation ticking `bar`.
pub async fn run_policy(
    args: &DemoArgs,
    policy: PolicyName,
    bar: &ProgressBar,
) -> Result<PolicyRun, DemoError> {
    let cluster = Cluster::start(args.servers, args.capacity, args.burst, args.seed)
        .await
        .map_err(DemoError::Server)?;
    let client =
        Client::connect(client_options(policy, &cluster, args.seed)?).map_err(DemoError::Client)?;
    let mut events = client.events();
    // Until the demo's last read finished: what the client does at shutdown (its `endSessions`,
    // SE-15) is not one of the demo's reads.
    let reads = u64::from(args.operations);
    let collector = tokio::spawn(async move {
        let mut tally = Tally::new();
        let mut finished = 0;
        while finished < reads {
            let Some((_, event)) = events.next_event().await else {
                break;
            };
            if matches!(
                event,
                retry_core::engine::EngineEvent::OperationFinished { .. }
            ) {
                finished += 1;
            }
            tally.observe(&event);
        }
        tally
    });

    let next = Arc::new(AtomicU32::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..args.concurrency.min(args.operations) {
        let (client, next, bar, operations) =
            (client.clone(), next.clone(), bar.clone(), args.operations);
        workers.spawn(async move {
            let mut latencies = Vec::new();
            // Each turn takes one of the `operations` tickets; the loop ends when none are left.
            while next.fetch_add(1, Ordering::Relaxed) < operations {
                let started = tokio::time::Instant::now();
                let find =
                    doc! { COMMAND: COLLECTION, "filter": {}, "limit": 1, "singleBatch": true };
                // Outcomes are counted from the client's events, not from here.
                let _ = client
                    .run_command(DATABASE, find, OperationKind::Read)
                    .await;
                latencies.push(started.elapsed());
                bar.inc(1);
            }
            latencies
        });
    }
    let mut latencies = Vec::with_capacity(args.operations as usize);
    while let Some(worker) = workers.join_next().await {
        latencies.extend(worker.map_err(DemoError::Task)?);
    }
    let mut tally = collector.await.map_err(DemoError::Task)?;
    let servers = cluster.totals(COMMAND);
    client.shutdown().await;
    for latency in latencies {
        tally.record_latency(latency);
    }
    cluster.shutdown().await;
    Ok(PolicyRun {
        policy,
        summary: tally.summary(),
        servers,
    })
}
