//! Retry options and policies: what the user configures, validated into typed values.
//!
//! [`RetryOptions`] holds the client options of the retryable-reads, retryable-writes and
//! client-backpressure specs (`retryReads`, `retryWrites`, `maxAdaptiveRetries`,
//! `enableOverloadRetargeting`) and the [`RetryPolicy`]. The default policy is
//! [`RetryPolicy::Current`], the pinned client-backpressure spec. The token bucket of the spec's
//! first versions and gRPC A6 are explicit, non-default alternatives for comparison and simulation.

use alloc::sync::Arc;
use core::time::Duration;
use smallvec::SmallVec;

use crate::backoff::{GrpcBackoff, GrpcJitter};
use crate::budget::{GrpcThrottle, TokenBucket};
pub use crate::option_error::OptionError;

/// The retry options of a client. Build with [`RetryOptions::default`] and the setters.
#[derive(Debug)]
pub struct RetryOptions {
    pub(crate) retry_reads: bool,
    pub(crate) retry_writes: bool,
    pub(crate) max_adaptive_retries: u32,
    pub(crate) enable_overload_retargeting: bool,
    pub(crate) policy: RetryPolicy,
}

impl Clone for RetryOptions {
    fn clone(&self) -> RetryOptions {
        RetryOptions {
            retry_reads: self.retry_reads,
            retry_writes: self.retry_writes,
            max_adaptive_retries: self.max_adaptive_retries,
            enable_overload_retargeting: self.enable_overload_retargeting,
            policy: self.policy.clone(),
        }
    }

    /// Copies `source` in place; a policy that shares `source`'s budget is kept as it is (a
    /// restarted retry machine copies its client's options: no reference count per operation).
    #[inline]
    fn clone_from(&mut self, source: &RetryOptions) {
        self.retry_reads = source.retry_reads;
        self.retry_writes = source.retry_writes;
        self.max_adaptive_retries = source.max_adaptive_retries;
        self.enable_overload_retargeting = source.enable_overload_retargeting;
        let same = match (&self.policy, &source.policy) {
            (RetryPolicy::Current, RetryPolicy::Current) => true,
            (RetryPolicy::TokenBucket(a), RetryPolicy::TokenBucket(b)) => Arc::ptr_eq(a, b),
            (RetryPolicy::Grpc(a), RetryPolicy::Grpc(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if !same {
            self.policy = source.policy.clone();
        }
    }
}

/// BP-10: the default `maxAdaptiveRetries`.
pub const DEFAULT_MAX_ADAPTIVE_RETRIES: u32 = 2;

impl Default for RetryOptions {
    /// `retryReads=true` (RR-1), `retryWrites=true` (RW-1), `maxAdaptiveRetries=2` (BP-10),
    /// `enableOverloadRetargeting=false` (BP-19), [`RetryPolicy::Current`].
    fn default() -> RetryOptions {
        RetryOptions {
            retry_reads: true,
            retry_writes: true,
            max_adaptive_retries: DEFAULT_MAX_ADAPTIVE_RETRIES,
            enable_overload_retargeting: false,
            policy: RetryPolicy::Current,
        }
    }
}

impl RetryOptions {
    /// `retryReads` (RR-1).
    pub fn retry_reads(mut self, on: bool) -> RetryOptions {
        self.retry_reads = on;
        self
    }

    /// `retryWrites` (RW-1).
    pub fn retry_writes(mut self, on: bool) -> RetryOptions {
        self.retry_writes = on;
        self
    }

    /// `maxAdaptiveRetries` (BP-10): a non-negative integer. `0` turns overload retries off, and
    /// also stops the ordinary retry of an error labelled `SystemOverloadedError` (BP-22).
    pub fn max_adaptive_retries(mut self, n: i64) -> Result<RetryOptions, OptionError> {
        self.max_adaptive_retries = u32::try_from(n).map_err(|_| {
            OptionError::new("maxAdaptiveRetries", "must be a non-negative integer", n)
        })?;
        Ok(self)
    }

    /// `enableOverloadRetargeting` (BP-19): deprioritize the overloaded server on retry.
    pub fn enable_overload_retargeting(mut self, on: bool) -> RetryOptions {
        self.enable_overload_retargeting = on;
        self
    }

    /// The retry policy.
    pub fn policy(mut self, policy: RetryPolicy) -> RetryOptions {
        self.policy = policy;
        self
    }

    /// The configured policy.
    pub fn get_policy(&self) -> &RetryPolicy {
        &self.policy
    }
}

/// How failed attempts are retried.
#[derive(Clone, Debug, Default)]
pub enum RetryPolicy {
    /// The pinned client-backpressure spec (default): at most `maxAdaptiveRetries` retries once an
    /// overload error is seen, backoff `jitter · min(10 s, base · 2^retry)` with the server's
    /// `baseBackoffMS`, retargeting only when `enableOverloadRetargeting` is on (BP-8..BP-24).
    #[default]
    Current,
    /// The first versions of the spec (v0/v1, TB-1..TB-6): up to 5 overload retries
    /// (`maxAdaptiveRetries` is ignored), backoff exponent `retry − 1`, the overloaded server always
    /// deprioritized, and a client-wide [`TokenBucket`] that each overload retry must pay for.
    TokenBucket(Arc<TokenBucket>),
    /// gRPC A6 retries mapped onto MongoDB errors; see [`GrpcPolicy`].
    Grpc(Arc<GrpcPolicy>),
}

impl RetryPolicy {
    /// The token-bucket policy with a new full bucket.
    pub fn token_bucket() -> RetryPolicy {
        RetryPolicy::TokenBucket(Arc::new(TokenBucket::new()))
    }

    /// A short name for reports: `current`, `token-bucket` or `grpc`.
    pub fn name(&self) -> &'static str {
        match self {
            RetryPolicy::Current => "current",
            RetryPolicy::TokenBucket(_) => "token-bucket",
            RetryPolicy::Grpc(_) => "grpc",
        }
    }
}

/// TB-6: the token-bucket policy's fixed retry cap.
pub const TOKEN_BUCKET_MAX_RETRIES: u32 = 5;

/// A6: `maxAttempts` above this are treated as this.
pub const GRPC_MAX_ATTEMPTS_CAP: u32 = 5;

/// The gRPC A6 retry policy, mapped onto MongoDB.
///
/// - `maxAttempts` counts every attempt including the first; at least 2, values above 5 become 5.
/// - A failure is retryable when it is a network or pool-cleared error (gRPC's `UNAVAILABLE`) or a
///   server error whose code is in `retryable_codes`. gRPC has no idempotency flag; here operations
///   that are not safe to run twice (non-retryable writes, `runCommand`, `getMore`, commands in a
///   transaction) are retried only when the error shows the server did not run the command (not
///   sent, `NoWritesPerformed`, or `SystemOverloadedError`).
/// - Backoff: [`GrpcBackoff`]; a server pushback replaces it with exactly the pushed delay and
///   restarts the exponent.
/// - Throttling: an optional [`GrpcThrottle`].
/// - Attempts that were never sent (selection, checkout and connection-establishment failures) are
///   retried at once and counted neither as attempts nor by the throttle. With no CSOT deadline to
///   bound them, at most `maxAttempts` such retries in a row are made (our bound; A6 relies on the
///   call deadline).
#[derive(Clone, Debug)]
pub struct GrpcPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: GrpcBackoff,
    pub(crate) retryable_codes: SmallVec<[i32; 8]>,
    pub(crate) throttle: Option<Arc<GrpcThrottle>>,
}

impl GrpcPolicy {
    /// A policy from the A6 parameters, validated: `maxAttempts` ≥ 2 (clamped to 5),
    /// `initialBackoff` and `maxBackoff` positive, `backoffMultiplier` positive and finite,
    /// `retryableStatusCodes` non-empty.
    pub fn new(
        max_attempts: i64,
        initial_backoff: Duration,
        max_backoff: Duration,
        backoff_multiplier: f64,
        retryable_codes: &[i32],
    ) -> Result<GrpcPolicy, OptionError> {
        if max_attempts < 2 {
            return Err(OptionError::new(
                "maxAttempts",
                "must be an integer of at least 2",
                max_attempts,
            ));
        }
        if initial_backoff.is_zero() {
            return Err(OptionError::new(
                "initialBackoff",
                "must be greater than 0",
                "0s",
            ));
        }
        if max_backoff.is_zero() {
            return Err(OptionError::new(
                "maxBackoff",
                "must be greater than 0",
                "0s",
            ));
        }
        if !(backoff_multiplier.is_finite() && backoff_multiplier > 0.0) {
            return Err(OptionError::new(
                "backoffMultiplier",
                "must be a finite number greater than 0",
                backoff_multiplier,
            ));
        }
        if retryable_codes.is_empty() {
            return Err(OptionError::new(
                "retryableStatusCodes",
                "must not be empty",
                "[]",
            ));
        }
        Ok(GrpcPolicy {
            max_attempts: u32::try_from(max_attempts)
                .unwrap_or(u32::MAX)
                .min(GRPC_MAX_ATTEMPTS_CAP),
            backoff: GrpcBackoff {
                initial: initial_backoff,
                max: max_backoff,
                multiplier: backoff_multiplier,
                jitter: GrpcJitter::Final,
            },
            retryable_codes: retryable_codes.iter().copied().collect(),
            throttle: None,
        })
    }

    /// Uses the 2017 draft's full jitter instead of the final `U(0.8, 1.2)`.
    pub fn with_draft_2017_jitter(mut self) -> GrpcPolicy {
        self.backoff.jitter = GrpcJitter::Draft2017;
        self
    }

    /// Throttles retries with `throttle` (shared with every operation of the client).
    pub fn with_throttle(mut self, throttle: Arc<GrpcThrottle>) -> GrpcPolicy {
        self.throttle = Some(throttle);
        self
    }

    /// The effective `maxAttempts` (2 to 5).
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The backoff parameters.
    pub fn backoff(&self) -> &GrpcBackoff {
        &self.backoff
    }

    /// The throttle, if any.
    pub fn throttle(&self) -> Option<&Arc<GrpcThrottle>> {
        self.throttle.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_rr1_rw1_bp10_bp19() {
        let o = RetryOptions::default();
        assert!(o.retry_reads && o.retry_writes && !o.enable_overload_retargeting);
        assert_eq!(o.max_adaptive_retries, 2);
        assert!(matches!(o.policy, RetryPolicy::Current));
    }

    #[test]
    fn bp10_max_adaptive_retries_must_be_non_negative() {
        let err = RetryOptions::default()
            .max_adaptive_retries(-5)
            .unwrap_err();
        assert_eq!(err.option(), "maxAdaptiveRetries");
        assert_eq!(
            err.to_string(),
            "invalid maxAdaptiveRetries: must be a non-negative integer, got -5"
        );
        assert_eq!(
            RetryOptions::default()
                .max_adaptive_retries(0)
                .unwrap()
                .max_adaptive_retries,
            0
        );
        assert_eq!(
            RetryOptions::default()
                .max_adaptive_retries(3)
                .unwrap()
                .max_adaptive_retries,
            3
        );
        assert!(RetryOptions::default()
            .max_adaptive_retries(i64::MAX)
            .is_err());
    }

    #[test]
    fn grpc_policy_validation_names_the_option_and_clamps_max_attempts() {
        let ms = Duration::from_millis;
        let ok = |n| GrpcPolicy::new(n, ms(100), ms(1000), 2.0, &[91]);
        assert_eq!(ok(1).unwrap_err().option(), "maxAttempts");
        assert_eq!(ok(-3).unwrap_err().option(), "maxAttempts");
        assert_eq!(ok(2).unwrap().max_attempts(), 2);
        assert_eq!(ok(7).unwrap().max_attempts(), 5);
        assert_eq!(ok(i64::MAX).unwrap().max_attempts(), 5);
        assert_eq!(
            GrpcPolicy::new(3, Duration::ZERO, ms(1), 2.0, &[1])
                .unwrap_err()
                .option(),
            "initialBackoff"
        );
        assert_eq!(
            GrpcPolicy::new(3, ms(1), Duration::ZERO, 2.0, &[1])
                .unwrap_err()
                .option(),
            "maxBackoff"
        );
        for m in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(
                GrpcPolicy::new(3, ms(1), ms(1), m, &[1])
                    .unwrap_err()
                    .option(),
                "backoffMultiplier"
            );
        }
        assert_eq!(
            GrpcPolicy::new(3, ms(1), ms(1), 2.0, &[])
                .unwrap_err()
                .option(),
            "retryableStatusCodes"
        );
    }
}
