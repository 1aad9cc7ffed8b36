//! The policies the simulation compares, and the client-wide state each keeps.
//!
//! Every MongoDB and gRPC policy runs retry-core's own decision code: [`RetryMachine`](retry_core::retry::RetryMachine) (no
//! retries, the current spec with and without `enableOverloadRetargeting`, the token bucket of the
//! first spec versions, gRPC A6 retries with throttling) and [`HedgingMachine`](retry_core::hedging::HedgingMachine) (gRPC A6 hedging).
//! Three baselines no MongoDB driver offers are written here, each in a few lines: naive immediate
//! retries, the AWS SDK standard retry quota (2026 costs) and the SRE book's client-side adaptive
//! throttling.

use std::sync::Arc;
use std::time::Duration;

use rand_core::RngCore;
use retry_core::budget::TokenBucket;
use retry_core::hedging::HedgingPolicy;
use retry_core::policy::{RetryOptions, RetryPolicy};
use retry_core::service_config::MethodPolicy;

/// A policy under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimPolicy {
    /// No retries (`retryReads=false`).
    NoRetries,
    /// Retry at once, up to this many times, on any overload error.
    Naive(u32),
    /// The current client-backpressure spec, `enableOverloadRetargeting=false`.
    Current,
    /// The current spec with `enableOverloadRetargeting=true`.
    CurrentRetarget,
    /// The token bucket of the spec's first versions.
    TokenBucket,
    /// gRPC A6 retries with retry throttling.
    GrpcRetry,
    /// gRPC A6 hedging with retry throttling.
    GrpcHedging,
    /// The AWS SDK standard retry mode with the 2026 retry-quota costs.
    AwsStandard,
    /// The SRE book's client-side adaptive throttling (K = 2).
    SreAdaptive,
}

impl SimPolicy {
    /// Every policy, in the order of the reports.
    pub const ALL: [SimPolicy; 9] = [
        SimPolicy::NoRetries,
        SimPolicy::Naive(3),
        SimPolicy::Current,
        SimPolicy::CurrentRetarget,
        SimPolicy::TokenBucket,
        SimPolicy::GrpcRetry,
        SimPolicy::GrpcHedging,
        SimPolicy::AwsStandard,
        SimPolicy::SreAdaptive,
    ];

    /// The name in the CSV files and chart legends.
    pub fn name(self) -> String {
        match self {
            SimPolicy::NoRetries => "no-retries".into(),
            SimPolicy::Naive(n) => format!("naive-{n}"),
            SimPolicy::Current => "current".into(),
            SimPolicy::CurrentRetarget => "current-retarget".into(),
            SimPolicy::TokenBucket => "token-bucket".into(),
            SimPolicy::GrpcRetry => "grpc-retry".into(),
            SimPolicy::GrpcHedging => "grpc-hedging".into(),
            SimPolicy::AwsStandard => "aws-standard".into(),
            SimPolicy::SreAdaptive => "sre-adaptive".into(),
        }
    }
}

/// The gRPC retry policy of the simulation, as a service config (the throttle is the A6
/// example: 10 tokens, 0.1 per success).
pub const GRPC_RETRY_CONFIG: &str = r#"{
  "methodConfig": [{
    "name": [{ "service": "mongodb", "method": "find" }],
    "retryPolicy": { "maxAttempts": 4, "initialBackoff": "0.05s", "maxBackoff": "1s",
                     "backoffMultiplier": 2,
                     "retryableStatusCodes": ["IngressRequestRateLimitExceeded"] } }],
  "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
}"#;

/// The gRPC hedging policy of the simulation: 3 copies, the next one 12 ms after the last (about
/// the unloaded p95 latency), the same throttle.
pub const GRPC_HEDGING_CONFIG: &str = r#"{
  "methodConfig": [{
    "name": [{ "service": "mongodb", "method": "find" }],
    "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.012s",
                       "nonFatalStatusCodes": ["IngressRequestRateLimitExceeded"] } }],
  "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
}"#;

/// The service configs (JSON) of the two gRPC policies. Each has a policy of its kind for `find`,
/// the command every simulated operation runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcConfigs {
    /// The config of `grpc-retry`.
    pub retry: String,
    /// The config of `grpc-hedging`.
    pub hedging: String,
}

impl Default for GrpcConfigs {
    /// [`GRPC_RETRY_CONFIG`] and [`GRPC_HEDGING_CONFIG`].
    fn default() -> GrpcConfigs {
        GrpcConfigs {
            retry: GRPC_RETRY_CONFIG.into(),
            hedging: GRPC_HEDGING_CONFIG.into(),
        }
    }
}

impl GrpcConfigs {
    /// The defaults with the user's service config in place of the one whose kind it has for
    /// `find` (a `retryPolicy` replaces `grpc-retry`'s, a `hedgingPolicy` `grpc-hedging`'s).
    pub fn with_user_config(json: &str) -> Result<GrpcConfigs, String> {
        let config = crate::service_config::parse_json(json).map_err(|e| e.to_string())?;
        let mut configs = GrpcConfigs::default();
        match config.policy_for("find") {
            Some(MethodPolicy::Retry(_)) => configs.retry = json.into(),
            Some(MethodPolicy::Hedging(_)) => configs.hedging = json.into(),
            _ => {
                return Err(
                    "the service config has no retryPolicy or hedgingPolicy for find, the \
                     command the simulation runs"
                        .into(),
                )
            }
        }
        Ok(configs)
    }
}

/// The overload error code the simulated servers shed with.
pub const OVERLOAD_CODE: i32 = 462;

/// AWS standard mode (2026): at most 3 attempts.
pub const AWS_MAX_ATTEMPTS: u32 = 3;
/// AWS retry quota capacity per client.
pub const AWS_QUOTA: u32 = 500;
/// AWS 2026 retry cost of a throttling error.
pub const AWS_THROTTLING_COST: u32 = 5;
/// AWS 2026 retry cost of a transient error (timeouts included).
pub const AWS_TRANSIENT_COST: u32 = 14;
/// AWS backoff base for throttling errors.
pub const AWS_THROTTLING_BASE: Duration = Duration::from_secs(1);
/// AWS backoff base for other transient errors.
pub const AWS_TRANSIENT_BASE: Duration = Duration::from_millis(50);
/// AWS backoff cap.
pub const AWS_MAX_BACKOFF: Duration = Duration::from_secs(20);

/// SRE adaptive throttling: `K`.
pub const SRE_K: f64 = 2.0;
/// SRE adaptive throttling: the window, in one-second buckets (two minutes).
pub const SRE_WINDOW_SECS: usize = 120;
/// SRE per-request attempt limit.
pub const SRE_MAX_ATTEMPTS: u32 = 3;
/// SRE retries back off with full jitter from this base, doubling.
pub const SRE_BACKOFF_BASE: Duration = Duration::from_millis(50);

/// The client-wide state of a policy: one per simulated client.
pub(crate) enum ClientBudget {
    /// Nothing shared between operations.
    None,
    /// The options every operation's retry machine gets (they hold the shared budget, if any).
    Machine(RetryOptions),
    /// The hedging policy (holding the shared throttle).
    Hedging(HedgingPolicy),
    /// The AWS retry quota.
    Aws { tokens: u32 },
    /// The SRE throttle's two-minute window of (requests, accepts) per second.
    Sre {
        buckets: Box<[(u32, u32); SRE_WINDOW_SECS]>,
        current_sec: u64,
        requests: u64,
        accepts: u64,
    },
}

impl ClientBudget {
    pub(crate) fn new(policy: SimPolicy, configs: &GrpcConfigs) -> ClientBudget {
        // Each client parses its own copy, so each has its own throttle.
        let find = |config: &str| {
            crate::service_config::parse_json(config)
                .expect("the built-in service config is valid")
                .policy_for("find")
                .cloned()
        };
        match policy {
            SimPolicy::NoRetries => ClientBudget::Machine(
                RetryOptions::default()
                    .retry_reads(false)
                    .max_adaptive_retries(0)
                    .expect("0 is valid"),
            ),
            SimPolicy::Naive(_) => ClientBudget::None,
            SimPolicy::Current => ClientBudget::Machine(RetryOptions::default()),
            SimPolicy::CurrentRetarget => {
                ClientBudget::Machine(RetryOptions::default().enable_overload_retargeting(true))
            }
            SimPolicy::TokenBucket => ClientBudget::Machine(
                RetryOptions::default()
                    .policy(RetryPolicy::TokenBucket(Arc::new(TokenBucket::new()))),
            ),
            SimPolicy::GrpcRetry => match find(&configs.retry) {
                Some(MethodPolicy::Retry(policy)) => ClientBudget::Machine(
                    RetryOptions::default().policy(RetryPolicy::Grpc(Arc::new(policy))),
                ),
                _ => unreachable!("GrpcConfigs::retry has a retry policy for find"),
            },
            SimPolicy::GrpcHedging => match find(&configs.hedging) {
                Some(MethodPolicy::Hedging(policy)) => ClientBudget::Hedging(policy),
                _ => unreachable!("GrpcConfigs::hedging has a hedging policy for find"),
            },
            SimPolicy::AwsStandard => ClientBudget::Aws { tokens: AWS_QUOTA },
            SimPolicy::SreAdaptive => ClientBudget::Sre {
                buckets: Box::new([(0, 0); SRE_WINDOW_SECS]),
                current_sec: 0,
                requests: 0,
                accepts: 0,
            },
        }
    }

    /// SRE: moves the window to `now_ns`, dropping buckets older than two minutes.
    fn sre_advance(&mut self, now_ns: u64) {
        if let ClientBudget::Sre {
            buckets,
            current_sec,
            requests,
            accepts,
        } = self
        {
            let sec = now_ns / 1_000_000_000;
            while *current_sec < sec {
                *current_sec += 1;
                let slot = &mut buckets[(*current_sec as usize) % SRE_WINDOW_SECS];
                *requests -= u64::from(slot.0);
                *accepts -= u64::from(slot.1);
                *slot = (0, 0);
                if sec - *current_sec >= SRE_WINDOW_SECS as u64 {
                    // Everything is older than the window.
                    **buckets = [(0, 0); SRE_WINDOW_SECS];
                    *requests = 0;
                    *accepts = 0;
                    *current_sec = sec;
                }
            }
        }
    }

    /// SRE: counts a request and says whether it may be sent: rejected locally with probability
    /// `max(0, (requests − K·accepts) / (requests + 1))`.
    pub(crate) fn sre_admit(&mut self, now_ns: u64, rng: &mut impl RngCore) -> bool {
        self.sre_advance(now_ns);
        let ClientBudget::Sre {
            buckets,
            current_sec,
            requests,
            accepts,
        } = self
        else {
            return true;
        };
        let p = ((*requests as f64 - SRE_K * *accepts as f64) / (*requests as f64 + 1.0)).max(0.0);
        buckets[(*current_sec as usize) % SRE_WINDOW_SECS].0 += 1;
        *requests += 1;
        unit(rng) >= p
    }

    /// SRE: the backend accepted a request.
    pub(crate) fn sre_accepted(&mut self, now_ns: u64) {
        self.sre_advance(now_ns);
        if let ClientBudget::Sre {
            buckets,
            current_sec,
            accepts,
            ..
        } = self
        {
            buckets[(*current_sec as usize) % SRE_WINDOW_SECS].1 += 1;
            *accepts += 1;
        }
    }
}

/// A uniform draw in [0, 1).
pub(crate) fn unit(rng: &mut impl RngCore) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}
