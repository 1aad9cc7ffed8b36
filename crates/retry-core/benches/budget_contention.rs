//! The shared retry budgets under 2-thread contention: the lock-free [`TokenBucket`] and
//! [`GrpcThrottle`] against a `Mutex<f64>` version of the specs' pseudocode, measured in the same
//! run; the ratio is printed at the end.
//!
//! `cargo bench -p retry-core --bench budget_contention`

#![allow(missing_docs)] // criterion's macros generate undocumented functions.

use std::hint::black_box;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use retry_core::budget::{Deposit, GrpcThrottle, TokenBucket};

/// Operations per thread per measured batch: one overload retry and one first-attempt success.
const OPS: u64 = 10_000;

/// The token bucket as the spec's pseudocode writes it: a float behind a lock.
struct MutexBucket(Mutex<f64>);

impl MutexBucket {
    fn consume(&self) -> bool {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if *t >= 1.0 {
            *t -= 1.0;
            true
        } else {
            false
        }
    }
    fn deposit(&self, n: f64) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *t = (*t + n).min(1000.0);
    }
}

/// gRPC throttling as grpc-go writes it: a float behind a lock.
struct MutexThrottle {
    tokens: Mutex<f64>,
    max: f64,
    ratio: f64,
}

impl MutexThrottle {
    fn failure(&self) -> bool {
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        *t = (*t - 1.0).max(0.0);
        *t > self.max / 2.0
    }
    fn success(&self) {
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        *t = (*t + self.ratio).min(self.max);
    }
}

/// Runs `op` `OPS` times on each of 2 threads started together; returns the elapsed time.
fn contended(op: &(dyn Fn() + Sync)) -> Duration {
    let barrier = Barrier::new(3);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..OPS {
                    op();
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        // The scope joins both threads before returning.
        start
    })
    .elapsed()
}

fn time_n(iters: u64, op: &(dyn Fn() + Sync)) -> Duration {
    (0..iters).map(|_| contended(op)).sum()
}

struct Subjects {
    bucket: TokenBucket,
    mutex_bucket: MutexBucket,
    throttle: GrpcThrottle,
    mutex_throttle: MutexThrottle,
}

impl Subjects {
    fn new() -> Subjects {
        Subjects {
            bucket: TokenBucket::new(),
            mutex_bucket: MutexBucket(Mutex::new(1000.0)),
            throttle: GrpcThrottle::new(1000.0, 1.0).expect("valid throttle"),
            mutex_throttle: MutexThrottle {
                tokens: Mutex::new(1000.0),
                max: 1000.0,
                ratio: 1.0,
            },
        }
    }
    fn bucket_op(&self) {
        black_box(self.bucket.try_consume_retry());
        self.bucket.deposit(Deposit::RetrySuccess);
    }
    fn mutex_bucket_op(&self) {
        black_box(self.mutex_bucket.consume());
        self.mutex_bucket.deposit(1.1);
    }
    fn throttle_op(&self) {
        black_box(self.throttle.record_failure());
        self.throttle.record_success();
    }
    fn mutex_throttle_op(&self) {
        black_box(self.mutex_throttle.failure());
        self.mutex_throttle.success();
    }
}

fn benches(c: &mut Criterion) {
    let s = Subjects::new();
    let mut group = c.benchmark_group("budget_contention_2_threads");
    group.bench_function("token bucket (atomic)", |b| {
        b.iter_custom(|n| time_n(n, &|| s.bucket_op()))
    });
    group.bench_function("token bucket (Mutex<f64>)", |b| {
        b.iter_custom(|n| time_n(n, &|| s.mutex_bucket_op()))
    });
    group.bench_function("gRPC throttle (atomic)", |b| {
        b.iter_custom(|n| time_n(n, &|| s.throttle_op()))
    });
    group.bench_function("gRPC throttle (Mutex<f64>)", |b| {
        b.iter_custom(|n| time_n(n, &|| s.mutex_throttle_op()))
    });
    group.finish();
}

/// Interleaved runs of both versions, so the printed ratio comes from one run on one machine state.
fn ratios() {
    let s = Subjects::new();
    let rounds = 30;
    let mut totals = [Duration::ZERO; 4];
    for _ in 0..rounds {
        totals[0] += contended(&|| s.bucket_op());
        totals[1] += contended(&|| s.mutex_bucket_op());
        totals[2] += contended(&|| s.throttle_op());
        totals[3] += contended(&|| s.mutex_throttle_op());
    }
    let per_op = |d: Duration| d.as_nanos() as f64 / (rounds as f64 * 2.0 * OPS as f64);
    println!();
    println!("2 threads × {OPS} ops × {rounds} rounds, interleaved (ns per op, wall time):");
    println!(
        "  token bucket:  atomic {:.1} ns, Mutex<f64> {:.1} ns, Mutex/atomic = {:.2}",
        per_op(totals[0]),
        per_op(totals[1]),
        per_op(totals[1]) / per_op(totals[0])
    );
    println!(
        "  gRPC throttle: atomic {:.1} ns, Mutex<f64> {:.1} ns, Mutex/atomic = {:.2}",
        per_op(totals[2]),
        per_op(totals[3]),
        per_op(totals[3]) / per_op(totals[2])
    );
}

criterion_group!(budget_contention, benches);

fn main() {
    budget_contention();
    Criterion::default().configure_from_args().final_summary();
    ratios();
}
