//! The shared retry budgets under real thread contention: no update is lost and the level never
//! leaves `[0, capacity]` (TB-1, gRPC A6 throttling). Threads live only in this test; the library
//! itself never starts one.

use retry_core::budget::{Deposit, GrpcThrottle, TokenBucket};

#[test]
fn tb1_token_bucket_updates_from_two_threads_are_not_lost() {
    let bucket = TokenBucket::with_tokens(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..1000 {
                    bucket.deposit(Deposit::RetryFailedWithoutOverload);
                }
            });
        }
    });
    assert_eq!(
        bucket.tenths(),
        10_000,
        "2 × 1000 deposits of 1 token, capped at 1000"
    );
    let consumed = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..300 {
                    if bucket.try_consume_retry() {
                        consumed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(
        consumed.into_inner(),
        1000,
        "exactly the 1000 tokens there were"
    );
    assert_eq!(bucket.tenths(), 0);
}

#[test]
fn grpc_throttle_updates_from_two_threads_are_not_lost() {
    let throttle = GrpcThrottle::new(100.0, 0.5).unwrap();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..30 {
                    throttle.record_failure();
                }
            });
        }
    });
    assert_eq!(throttle.millis(), 40_000);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..50 {
                    throttle.record_success();
                }
            });
        }
    });
    assert_eq!(throttle.millis(), 90_000);
}
