//! Counting what a client reports: operations, outcomes, attempts, retargets and latencies.
//!
//! A [`Tally`] reads the engine's events ([`EngineEvent`]) as the client delivers them and the
//! latency the application saw for each operation; [`Tally::summary`] turns them into the
//! [`Summary`] the demo prints. The tally decides nothing: every number is a count of something
//! retry-core reported.

use std::collections::BTreeMap;
use std::time::Duration;

use retry_core::address::ServerAddress;
use retry_core::engine::{EngineEvent, OpId};
use retry_core::retry::RetryEvent;

/// Counts of one run, fed event by event.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    operations: u64,
    successes: u64,
    failures: u64,
    attempts: u64,
    retries: u64,
    retargets: u64,
    /// For each operation with a retry scheduled and not yet started: the server that retry
    /// deprioritized. Entries leave when the retry starts or the operation finishes.
    deprioritized: BTreeMap<OpId, ServerAddress>,
    latencies: Vec<Duration>,
}

impl Tally {
    /// An empty tally.
    pub fn new() -> Tally {
        Tally::default()
    }

    /// Counts one event of the client's event stream.
    ///
    /// - `OperationFinished` is an operation, a success or a failure;
    /// - `CommandStarted` is an attempt (a command written to a server; attempts that failed
    ///   before they were sent are not attempts here, as they have no command events, BP-26);
    /// - `RetryScheduled` is a retry; when it deprioritized a server and the retry's
    ///   `CommandStarted` names another server, it is a retarget.
    ///
    /// Every other event is ignored.
    pub fn observe(&mut self, event: &EngineEvent) {
        match event {
            EngineEvent::OperationFinished { op, result, .. } => {
                self.operations += 1;
                if result.is_ok() {
                    self.successes += 1;
                } else {
                    self.failures += 1;
                }
                self.deprioritized.remove(op);
            }
            EngineEvent::Operation { op, event } => match event {
                RetryEvent::CommandStarted { address, .. } => {
                    self.attempts += 1;
                    if let Some(avoided) = self.deprioritized.remove(op) {
                        if avoided != *address {
                            self.retargets += 1;
                        }
                    }
                }
                RetryEvent::RetryScheduled { deprioritized, .. } => {
                    self.retries += 1;
                    match deprioritized {
                        Some(address) => {
                            self.deprioritized.insert(*op, address.clone());
                        }
                        None => {
                            self.deprioritized.remove(op);
                        }
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }

    /// Records the latency the application saw for one operation, from its call to its result.
    pub fn record_latency(&mut self, latency: Duration) {
        self.latencies.push(latency);
    }

    /// The counts so far, with the latency percentiles.
    pub fn summary(&self) -> Summary {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        Summary {
            operations: self.operations,
            successes: self.successes,
            failures: self.failures,
            attempts: self.attempts,
            retries: self.retries,
            retargets: self.retargets,
            latencies: sorted.len() as u64,
            p50: percentile(&sorted, 50),
            p99: percentile(&sorted, 99),
        }
    }
}

/// What one run counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Operations finished.
    pub operations: u64,
    /// Operations that returned a reply.
    pub successes: u64,
    /// Operations that returned an error.
    pub failures: u64,
    /// Commands written to a server, retries included.
    pub attempts: u64,
    /// Retries scheduled.
    pub retries: u64,
    /// Retries that deprioritized a server and then ran on another one.
    pub retargets: u64,
    /// Latencies recorded.
    pub latencies: u64,
    /// The median latency (nearest rank), if any was recorded.
    pub p50: Option<Duration>,
    /// The 99th-percentile latency (nearest rank), if any was recorded.
    pub p99: Option<Duration>,
}

impl Summary {
    /// Retry amplification: attempts per operation, `None` without operations.
    pub fn amplification(&self) -> Option<f64> {
        (self.operations > 0).then(|| self.attempts as f64 / self.operations as f64)
    }
}

/// The `p`-th percentile of `sorted` by the nearest-rank method: the smallest value with at least
/// `p` percent of the values at or below it. `None` for an empty slice.
pub fn percentile(sorted: &[Duration], p: u32) -> Option<Duration> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (n * p.min(100) as usize).div_ceil(100).max(1);
    Some(sorted[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use retry_core::error::OperationError;
    use retry_core::retry::RetryReason;

    fn a() -> ServerAddress {
        ServerAddress::new("127.0.0.1", 1001)
    }
    fn b() -> ServerAddress {
        ServerAddress::new("127.0.0.1", 1002)
    }

    fn started(op: u64, attempt: u32, address: ServerAddress) -> EngineEvent {
        EngineEvent::Operation {
            op: OpId(op),
            event: RetryEvent::CommandStarted { attempt, address },
        }
    }

    fn retry(op: u64, retry: u32, deprioritized: Option<ServerAddress>) -> EngineEvent {
        EngineEvent::Operation {
            op: OpId(op),
            event: RetryEvent::RetryScheduled {
                retry,
                delay: Duration::from_millis(100),
                reason: RetryReason::Overload,
                deprioritized,
            },
        }
    }

    fn finished(op: u64, ok: bool) -> EngineEvent {
        let result = if ok {
            Ok(bson::RawDocumentBuf::try_from(&doc! { "ok": 1 }).expect("encodes"))
        } else {
            Err(OperationError::usage("scripted failure"))
        };
        EngineEvent::OperationFinished {
            op: OpId(op),
            result,
            address: None,
        }
    }

    #[test]
    fn a_scripted_run_gives_exact_counts() {
        let events = [
            // op 1: one attempt, success.
            started(1, 1, a()),
            finished(1, true),
            // op 2: overloaded on a, retried on b (a retarget), success.
            started(2, 1, a()),
            retry(2, 1, Some(a())),
            started(2, 2, b()),
            finished(2, true),
            // op 3: a deprioritized, but the retry ran on a again (no other server): no
            // retarget; then a retry that deprioritized nothing; then a failure.
            started(3, 1, a()),
            retry(3, 1, Some(a())),
            started(3, 2, a()),
            retry(3, 2, None),
            started(3, 3, b()),
            finished(3, false),
            // op 4: a retry that deprioritized b, but the operation finished before it started.
            started(4, 1, b()),
            retry(4, 1, Some(b())),
            finished(4, false),
            // Events the tally ignores.
            EngineEvent::CursorOpened {
                op: OpId(5),
                cursor: retry_core::engine::CursorHandle(1),
            },
        ];
        let mut tally = Tally::new();
        for event in &events {
            tally.observe(event);
        }
        for ms in [5, 1, 4, 2] {
            tally.record_latency(Duration::from_millis(ms));
        }
        let summary = tally.summary();
        assert_eq!(
            summary,
            Summary {
                operations: 4,
                successes: 2,
                failures: 2,
                attempts: 7,
                retries: 4,
                retargets: 1,
                latencies: 4,
                p50: Some(Duration::from_millis(2)),
                p99: Some(Duration::from_millis(5)),
            }
        );
        assert_eq!(summary.amplification(), Some(7.0 / 4.0));
        assert!(tally.deprioritized.is_empty(), "finished operations leave");
    }

    #[test]
    fn a_retarget_counts_once_per_retry() {
        let mut tally = Tally::new();
        for event in [
            started(1, 1, a()),
            retry(1, 1, Some(a())),
            started(1, 2, b()),
            // The retry's own start was counted; a later attempt without a new retry is not.
            started(1, 3, a()),
            retry(1, 2, Some(b())),
            started(1, 4, a()),
        ] {
            tally.observe(&event);
        }
        assert_eq!(tally.summary().retargets, 2);
        assert_eq!(tally.summary().attempts, 4);
        assert_eq!(tally.summary().operations, 0);
        assert_eq!(tally.summary().amplification(), None);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let ms = Duration::from_millis;
        let hundred: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&hundred, 50), Some(ms(50)));
        assert_eq!(percentile(&hundred, 99), Some(ms(99)));
        assert_eq!(percentile(&hundred, 100), Some(ms(100)));
        assert_eq!(percentile(&hundred, 0), Some(ms(1)));
        assert_eq!(percentile(&[ms(7)], 99), Some(ms(7)));
        let three = [ms(1), ms(2), ms(3)];
        assert_eq!(percentile(&three, 50), Some(ms(2)));
        assert_eq!(percentile(&three, 99), Some(ms(3)));
        assert_eq!(percentile(&[], 50), None);
        assert_eq!(Tally::new().summary().p50, None);
    }
}
