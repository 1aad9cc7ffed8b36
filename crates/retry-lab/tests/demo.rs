//! The demo end to end: test routers on 127.0.0.1, the tokio client, every policy.
//!
//! The routers' limiters never refill (capacity 0), so each router admits exactly `burst`
//! commands whatever the timing, and an operation refused once is refused on every later attempt
//! to that router: the counts below do not depend on the machine's speed. Each policy runs in its
//! own test, so they run side by side; each is bounded by its operation count and its policy's
//! retry cap.

use std::time::Duration;

use retry_lab::cli::{DemoArgs, PolicyName};
use retry_lab::demo;
use retry_lab::report::{self, PolicyRun};

const OPERATIONS: u32 = 6;
/// Far above any run's length (the token bucket's five backoffs add up to at most 3.1 s): only a
/// hang reaches it. Nothing is asserted about how long a run takes.
const HANG_GUARD: Duration = Duration::from_secs(120);

async fn run(policy: PolicyName, servers: u32, burst: u32) -> PolicyRun {
    let args = DemoArgs {
        operations: OPERATIONS,
        concurrency: OPERATIONS,
        servers,
        capacity: 0,
        burst,
        seed: 42,
        policies: vec![policy],
    };
    let runs = tokio::time::timeout(HANG_GUARD, demo::run(&args, false))
        .await
        .expect("the demo does not hang")
        .expect("the demo runs");
    assert_eq!(runs.len(), 1);
    let run = runs[0];
    assert_eq!(run.policy, policy);
    let s = run.summary;
    // Every operation finished once, with one outcome, and its latency was recorded.
    assert_eq!(s.operations, u64::from(OPERATIONS), "{run:?}");
    assert_eq!(s.successes + s.failures, s.operations, "{run:?}");
    assert_eq!(s.latencies, s.operations, "{run:?}");
    assert!(s.p50 <= s.p99 && s.p99.is_some(), "{run:?}");
    // The client's attempts are the routers' requests; each admitted one succeeded, the others
    // were shed, and no router admitted more than its burst.
    assert_eq!(run.servers.received, s.attempts, "{run:?}");
    assert_eq!(run.servers.executed, s.successes, "{run:?}");
    assert_eq!(run.servers.shed, s.attempts - s.successes, "{run:?}");
    assert!(
        s.successes >= 1 && s.successes <= u64::from(servers * burst),
        "{run:?}"
    );
    // Every attempt after the first of an operation is a scheduled retry.
    assert_eq!(s.attempts, s.operations + s.retries, "{run:?}");
    assert!(s.retargets <= s.retries, "{run:?}");
    // The table has a row for it.
    assert!(report::table(&runs).contains(policy.as_str()));
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_retries_each_operation_has_one_attempt() {
    // One router admitting three: exact counts.
    let s = run(PolicyName::None, 1, 3).await.summary;
    assert_eq!((s.attempts, s.retries, s.retargets), (6, 0, 0));
    assert_eq!((s.successes, s.failures), (3, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_current_spec_retries_each_failure_twice_on_other_routers() {
    let s = run(PolicyName::Current, 3, 1).await.summary;
    // A failed operation made 1 + maxAdaptiveRetries = 3 attempts (BP-10, BP-22).
    assert!(s.failures >= 3, "{s:?}");
    assert!(s.attempts - s.successes >= s.failures * 3, "{s:?}");
    assert!(s.attempts <= s.operations * 3, "{s:?}");
    // Mongos: every retry deprioritizes the router that refused it (BP-20).
    assert!(s.retargets > 0, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_bucket_retries_up_to_five_times() {
    let s = run(PolicyName::TokenBucket, 3, 1).await.summary;
    // TB-6: a failed operation made 1 + 5 attempts.
    assert!(s.failures >= 3, "{s:?}");
    assert!(s.attempts - s.successes >= s.failures * 6, "{s:?}");
    assert!(s.attempts <= s.operations * 6, "{s:?}");
    assert!(s.retargets > 0, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_throttling_stops_retries_after_a_few_failures() {
    let s = run(PolicyName::Grpc, 3, 1).await.summary;
    assert!(s.failures >= 3, "{s:?}");
    // 10 tokens, each failure takes one, retries only above 5: at most 5 retries in all, far
    // fewer than the 4 retries per failed operation that maxAttempts = 5 would allow.
    assert!(s.retries <= 5, "{s:?}");
}
