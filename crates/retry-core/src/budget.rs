//! Retry budgets shared by every operation of a client: the token bucket of the early
//! client-backpressure spec and gRPC A6 retry throttling.
//!
//! Both are shared between threads through `&self` without locks: the level is a fixed-point
//! integer in an atomic, updated with compare-and-swap loops, so concurrent deposits and
//! withdrawals never lose an update and the level never leaves `[0, capacity]`. The current
//! MongoDB policy has no budget (BP, contradiction C1); these are the explicit, non-default
//! policies `RetryPolicy::TokenBucket` and `RetryPolicy::Grpc` of the `policy` module.

use core::fmt;
use core::sync::atomic::{AtomicU32, Ordering};

use crate::option_error::OptionError;

/// Applies `f` to the atomic until it succeeds; returns whether `f` accepted the old value.
fn update(level: &AtomicU32, f: impl Fn(u32) -> Option<u32>) -> bool {
    level
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, f)
        .is_ok()
}

/// The retry token bucket of client-backpressure v0/v1 (TB-1..TB-5), kept in tenths of a token.
///
/// One per client. Capacity 1000 tokens; it starts full. Each overload retry consumes 1 token and
/// is refused when fewer than 1 remain; a success on the first attempt deposits 0.1, a success on a
/// retry 1.1, and a retry that fails with a non-overload error 1. Deposits never exceed capacity.
pub struct TokenBucket {
    tenths: AtomicU32,
}

/// What a [`TokenBucket`] is credited for (TB-2..TB-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Deposit {
    /// TB-2: the first attempt succeeded: 0.1 token.
    FirstAttemptSuccess,
    /// TB-3: a retry succeeded: 0.1 + 1 = 1.1 tokens.
    RetrySuccess,
    /// TB-4: a retry failed with a non-overload error, a sign the server is healthy: 1 token.
    RetryFailedWithoutOverload,
}

impl Deposit {
    const fn tenths(self) -> u32 {
        match self {
            Deposit::FirstAttemptSuccess => 1,
            Deposit::RetrySuccess => 11,
            Deposit::RetryFailedWithoutOverload => 10,
        }
    }
}

impl TokenBucket {
    /// TB-1: the bucket's capacity in tokens.
    pub const CAPACITY: u32 = 1000;
    const CAPACITY_TENTHS: u32 = TokenBucket::CAPACITY * 10;
    const RETRY_COST_TENTHS: u32 = 10;

    /// A full bucket (TB-1).
    pub fn new() -> TokenBucket {
        TokenBucket {
            tenths: AtomicU32::new(TokenBucket::CAPACITY_TENTHS),
        }
    }

    /// A bucket holding `tokens` (at most [`TokenBucket::CAPACITY`]), for tests and simulations.
    pub fn with_tokens(tokens: u32) -> TokenBucket {
        TokenBucket {
            tenths: AtomicU32::new(tokens.min(TokenBucket::CAPACITY) * 10),
        }
    }

    /// The current level in tokens.
    pub fn tokens(&self) -> f64 {
        f64::from(self.tenths()) / 10.0
    }

    /// The current level in tenths of a token (exact).
    pub fn tenths(&self) -> u32 {
        self.tenths.load(Ordering::Acquire)
    }

    /// TB-5: takes the 1 token an overload retry costs; false, leaving the bucket unchanged, when
    /// fewer than 1 token remains.
    pub fn try_consume_retry(&self) -> bool {
        update(&self.tenths, |t| {
            t.checked_sub(TokenBucket::RETRY_COST_TENTHS)
        })
    }

    /// Credits the bucket, never past capacity (TB-1).
    pub fn deposit(&self, deposit: Deposit) {
        update(&self.tenths, |t| {
            Some(
                t.saturating_add(deposit.tenths())
                    .min(TokenBucket::CAPACITY_TENTHS),
            )
        });
    }
}

impl Default for TokenBucket {
    fn default() -> TokenBucket {
        TokenBucket::new()
    }
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenBucket({} tokens)", self.tokens())
    }
}

/// gRPC A6 retry throttling for one server name, kept in thousandths of a token.
///
/// gRPC keys throttles by the channel's server name, that is the target a client was created for;
/// for a MongoDB client that is the deployment, so a client holds one. It starts at `maxTokens`.
/// Each counted failure (a retryable failure, or a pushback saying not to retry) takes 1 token, each
/// success adds `tokenRatio`; the level stays in `[0, maxTokens]`. Retries are allowed only while
/// the level is above `maxTokens / 2`.
pub struct GrpcThrottle {
    millis: AtomicU32,
    max_millis: u32,
    ratio_millis: u32,
}

impl GrpcThrottle {
    /// A full throttle. `max_tokens` must be in (0, 1000] and `token_ratio` positive; both keep
    /// three decimals and drop the rest (0.5466 becomes 0.546), as A6 specifies.
    pub fn new(max_tokens: f64, token_ratio: f64) -> Result<GrpcThrottle, OptionError> {
        let max_millis = thousandths(max_tokens)
            .filter(|m| (1..=1_000_000).contains(m))
            .ok_or_else(|| {
                OptionError::new(
                    "maxTokens",
                    "must be greater than 0 and at most 1000",
                    max_tokens,
                )
            })?;
        let ratio_millis = thousandths(token_ratio)
            .filter(|r| *r >= 1)
            .ok_or_else(|| {
                OptionError::new(
                    "tokenRatio",
                    "must be at least 0.001 (three decimals are kept)",
                    token_ratio,
                )
            })?;
        Ok(GrpcThrottle {
            millis: AtomicU32::new(max_millis),
            max_millis,
            ratio_millis,
        })
    }

    /// The current level in tokens.
    pub fn tokens(&self) -> f64 {
        f64::from(self.millis()) / 1000.0
    }

    /// The current level in thousandths of a token (exact).
    pub fn millis(&self) -> u32 {
        self.millis.load(Ordering::Acquire)
    }

    /// `maxTokens` in thousandths.
    pub fn max_millis(&self) -> u32 {
        self.max_millis
    }

    /// Counts a failure (1 token, never below 0) and says whether a retry is still allowed after
    /// it: the new level must be above `maxTokens / 2`.
    pub fn record_failure(&self) -> bool {
        let before = self
            .millis
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |m| {
                Some(m.saturating_sub(1000))
            })
            .unwrap_or_else(|m| m);
        self.above_threshold(before.saturating_sub(1000))
    }

    /// Counts a success: adds `tokenRatio`, never past `maxTokens`.
    pub fn record_success(&self) {
        let (ratio, max) = (self.ratio_millis, self.max_millis);
        update(&self.millis, |m| Some(m.saturating_add(ratio).min(max)));
    }

    /// Whether retries are allowed now (level above `maxTokens / 2`).
    pub fn allows_retry(&self) -> bool {
        self.above_threshold(self.millis())
    }

    fn above_threshold(&self, millis: u32) -> bool {
        u64::from(millis) * 2 > u64::from(self.max_millis)
    }
}

impl fmt::Debug for GrpcThrottle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GrpcThrottle({} of {} tokens)",
            self.tokens(),
            f64::from(self.max_millis) / 1000.0
        )
    }
}

/// `value` in thousandths, truncated; `None` for negative, NaN or huge values.
fn thousandths(value: f64) -> Option<u32> {
    let scaled = (value * 1000.0).trunc();
    // Guard against binary rounding: 0.546 * 1000 = 545.999...; add a tiny epsilon before truncating.
    let scaled = if (value * 1000.0 - scaled) > 1.0 - 1e-9 {
        scaled + 1.0
    } else {
        scaled
    };
    (scaled >= 0.0 && scaled <= f64::from(u32::MAX)).then_some(scaled as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tb1_starts_full_and_deposits_never_overflow() {
        let b = TokenBucket::new();
        assert_eq!(b.tokens(), 1000.0);
        b.deposit(Deposit::FirstAttemptSuccess);
        assert_eq!(b.tokens(), 1000.0);
    }

    /// TB-2, TB-3, TB-4, TB-5: a retry success deposits 1.1, a retry failing without overload
    /// deposits 1, and each overload retry consumes 1 while at least 1 token is left.
    #[test]
    fn tb2_to_tb5_deposits_and_consumption() {
        let b = TokenBucket::with_tokens(2);
        assert!(b.try_consume_retry());
        assert!(b.try_consume_retry());
        assert!(
            !b.try_consume_retry(),
            "TB-5: fewer than 1 token refuses the retry"
        );
        assert_eq!(b.tenths(), 0);
        b.deposit(Deposit::FirstAttemptSuccess);
        assert_eq!(b.tenths(), 1);
        b.deposit(Deposit::RetrySuccess);
        assert_eq!(b.tenths(), 12);
        b.deposit(Deposit::RetryFailedWithoutOverload);
        assert_eq!(b.tenths(), 22);
        assert!(b.try_consume_retry());
        assert_eq!(b.tenths(), 12);
    }

    #[test]
    fn grpc_throttle_validates_its_options_by_name() {
        for bad in [0.0, -1.0, 1000.001, f64::NAN, 0.0004] {
            let err = GrpcThrottle::new(bad, 0.1).unwrap_err();
            assert!(err.to_string().contains("maxTokens"), "{bad}: {err}");
        }
        for bad in [0.0, -0.5, f64::NAN, 0.0009] {
            let err = GrpcThrottle::new(10.0, bad).unwrap_err();
            assert!(err.to_string().contains("tokenRatio"), "{bad}: {err}");
        }
        assert!(GrpcThrottle::new(1000.0, 0.001).is_ok());
    }

    #[test]
    fn grpc_throttle_keeps_three_decimals() {
        let t = GrpcThrottle::new(10.0, 0.5466).unwrap();
        assert_eq!(t.ratio_millis, 546);
        let t = GrpcThrottle::new(0.546, 0.546).unwrap();
        assert_eq!((t.max_millis, t.ratio_millis), (546, 546));
    }

    #[test]
    fn grpc_throttle_allows_retries_only_above_half() {
        // A6 example: 10 tokens; failures take 1; retries stop at or below 5.
        let t = GrpcThrottle::new(10.0, 0.1).unwrap();
        for expected in [true, true, true, true, false] {
            assert_eq!(t.record_failure(), expected);
        }
        assert_eq!(t.millis(), 5000);
        t.record_success();
        assert_eq!(t.millis(), 5100);
        assert!(t.allows_retry());
        for _ in 0..20 {
            t.record_failure();
        }
        assert_eq!(t.millis(), 0);
        for _ in 0..200 {
            t.record_success();
        }
        assert_eq!(t.millis(), 10_000);
    }
}
