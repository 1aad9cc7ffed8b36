//! Backoff formulas: how long to wait before a retry.
//!
//! Every formula is a pure function of the retry number, the policy's parameters, any
//! server-supplied value and a [`Jitter`]. All arithmetic saturates or is capped before it could
//! overflow, so no server value and no retry count can make a backoff panic or wrap.
//!
//! | schedule | formula | source |
//! | --- | --- | --- |
//! | [`current`] | `jitter · min(10 s, base · 2^retry)`, base = `baseBackoffMS` or 100 ms | BP-14, BP-15 |
//! | [`token_bucket_era`] | `jitter · min(10 s, 100 ms · 2^(retry−1))` | TB-6 |
//! | [`GrpcBackoff`] final | `min(initial · mult^(n−1), max) · U(0.8, 1.2)`, n since the last pushback | gRPC A6 |
//! | [`GrpcBackoff`] 2017 draft | `U(0, min(initial · mult^(n−1), max))` (full jitter) | gRPC A6 draft |

use core::time::Duration;

use crate::rng::Jitter;
use crate::time::duration_nanos;

/// `BASE_BACKOFF`: the base of the overload backoff when the server sends none (BP-14).
pub const BASE_BACKOFF: Duration = Duration::from_millis(100);
/// `MAX_BACKOFF`: no overload backoff is longer (BP-14).
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// `min(max, base · 2^exponent)`, saturating: exponents of 64 and more give `max`.
pub fn capped_exponential(base: Duration, exponent: u32, max: Duration) -> Duration {
    let base = duration_nanos(base);
    let grown = match 1u64.checked_shl(exponent) {
        Some(factor) => base.saturating_mul(factor),
        None if base == 0 => 0,
        None => u64::MAX,
    };
    Duration::from_nanos(grown.min(duration_nanos(max)))
}

/// The upper bound of the current overload backoff before jitter: `min(MAX_BACKOFF, base · 2^retry)`
/// where `base` is the error's positive `baseBackoffMS` or [`BASE_BACKOFF`] (BP-14, BP-15).
pub fn current_bound(retry: u32, base_backoff: Option<Duration>) -> Duration {
    let base = base_backoff
        .filter(|b| !b.is_zero())
        .unwrap_or(BASE_BACKOFF);
    capped_exponential(base, retry, MAX_BACKOFF)
}

/// The current overload backoff (BP-14, BP-15): `jitter · min(MAX_BACKOFF, base · 2^retry)`, where
/// `retry` is the number of the retry about to be made (the first retry is 1, so the bounds are
/// 200 ms, 400 ms, 800 ms, ...).
pub fn current(retry: u32, base_backoff: Option<Duration>, jitter: Jitter) -> Duration {
    jitter.scale(current_bound(retry, base_backoff))
}

/// The token-bucket-era overload backoff (TB-6, spec versions v0–v2):
/// `jitter · min(MAX_BACKOFF, 100 ms · 2^(retry−1))`, so the bounds are 100 ms, 200 ms, 400 ms, ...
/// `baseBackoffMS` did not exist then and is not read.
pub fn token_bucket_era(retry: u32, jitter: Jitter) -> Duration {
    jitter.scale(capped_exponential(
        BASE_BACKOFF,
        retry.saturating_sub(1),
        MAX_BACKOFF,
    ))
}

/// Which jitter the gRPC A6 backoff uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum GrpcJitter {
    /// The final A6 text: the capped exponential times `U(0.8, 1.2)`.
    #[default]
    Final,
    /// The 2017 draft: full jitter, `U(0, capped exponential)`.
    Draft2017,
}

/// The gRPC A6 exponential backoff with its parameters (already validated by
/// [`crate::policy::GrpcPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GrpcBackoff {
    /// `initialBackoff`: the first retry's delay before jitter.
    pub initial: Duration,
    /// `maxBackoff`: the cap before jitter.
    pub max: Duration,
    /// `backoffMultiplier`: the growth per retry (finite and positive).
    pub multiplier: f64,
    /// The jitter model.
    pub jitter: GrpcJitter,
}

impl GrpcBackoff {
    /// `min(initial · multiplier^(n−1), max)`, where `n` counts retries since the last pushback
    /// (the first is 1). Computed by repeated multiplication so the result is the same on every
    /// platform; it stops as soon as the cap is reached.
    pub fn bound(&self, n: u32) -> Duration {
        let max = duration_nanos(self.max) as f64;
        let mut value = duration_nanos(self.initial) as f64;
        for _ in 1..n.min(2048) {
            if value.is_nan() || value >= max {
                break;
            }
            value *= self.multiplier;
        }
        if value.is_finite() && value < max {
            // Truncation to whole nanoseconds; `value` is non-negative and below `max`.
            Duration::from_nanos(value as u64)
        } else {
            self.max
        }
    }

    /// The delay before the `n`-th retry since the last pushback.
    pub fn delay(&self, n: u32, jitter: Jitter) -> Duration {
        let bound = self.bound(n);
        match self.jitter {
            GrpcJitter::Final => jitter.scale_between_tenths(bound, 8, 12),
            GrpcJitter::Draft2017 => jitter.scale(bound),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn bp14_current_bounds_are_200_400_800_and_cap_at_10s() {
        let bounds: [Duration; 8] = core::array::from_fn(|i| current_bound(i as u32 + 1, None));
        assert_eq!(
            bounds,
            [
                MS(200),
                MS(400),
                MS(800),
                MS(1600),
                MS(3200),
                MS(6400),
                MS(10_000),
                MS(10_000)
            ]
        );
        assert_eq!(current(1, None, Jitter::MAX_BELOW_ONE), MS(200));
        assert_eq!(current(2, None, Jitter::MAX_BELOW_ONE), MS(400));
        assert_eq!(current(1, None, Jitter::ZERO), Duration::ZERO);
    }

    #[test]
    fn bp15_base_backoff_replaces_the_base_and_max_still_caps() {
        // Prose test 5: baseBackoffMS = 50 gives bounds 100 ms + 200 ms.
        assert_eq!(current_bound(1, Some(MS(50))), MS(100));
        assert_eq!(current_bound(2, Some(MS(50))), MS(200));
        assert_eq!(current_bound(1, Some(MS(9_000))), MAX_BACKOFF);
        assert_eq!(current_bound(1, Some(Duration::ZERO)), MS(200));
    }

    #[test]
    fn overflow_proof_for_any_retry_number_and_base() {
        for retry in [0, 1, 31, 32, 63, 64, 65, 1000, u32::MAX] {
            for base in [None, Some(Duration::from_nanos(1)), Some(Duration::MAX)] {
                assert!(current(retry, base, Jitter::MAX_BELOW_ONE) <= MAX_BACKOFF);
            }
            assert!(token_bucket_era(retry, Jitter::MAX_BELOW_ONE) <= MAX_BACKOFF);
        }
        assert_eq!(
            capped_exponential(Duration::ZERO, 200, Duration::MAX),
            Duration::ZERO
        );
        assert_eq!(
            capped_exponential(Duration::MAX, 3, Duration::MAX),
            Duration::from_nanos(u64::MAX)
        );
    }

    #[test]
    fn tb6_token_bucket_era_uses_exponent_retry_minus_one() {
        let bounds: [Duration; 5] =
            core::array::from_fn(|i| token_bucket_era(i as u32 + 1, Jitter::MAX_BELOW_ONE));
        assert_eq!(bounds, [MS(100), MS(200), MS(400), MS(800), MS(1600)]);
    }

    #[test]
    fn grpc_final_is_capped_exponential_times_u_0_8_1_2() {
        let b = GrpcBackoff {
            initial: MS(100),
            max: MS(1000),
            multiplier: 2.0,
            jitter: GrpcJitter::Final,
        };
        assert_eq!(b.bound(1), MS(100));
        assert_eq!(b.bound(4), MS(800));
        assert_eq!(b.bound(5), MS(1000));
        assert_eq!(b.bound(u32::MAX), MS(1000));
        assert_eq!(b.delay(1, Jitter::ZERO), MS(80));
        assert_eq!(b.delay(1, Jitter::MAX_BELOW_ONE), MS(120));
        // Jitter may take the delay above maxBackoff (A6).
        assert_eq!(b.delay(9, Jitter::MAX_BELOW_ONE), MS(1200));
    }

    #[test]
    fn grpc_draft_2017_is_full_jitter_and_odd_multipliers_are_safe() {
        let b = GrpcBackoff {
            initial: MS(100),
            max: MS(1000),
            multiplier: 1.5,
            jitter: GrpcJitter::Draft2017,
        };
        assert_eq!(b.delay(3, Jitter::ZERO), Duration::ZERO);
        assert_eq!(b.delay(3, Jitter::MAX_BELOW_ONE), MS(225));
        let shrinking = GrpcBackoff {
            multiplier: 0.5,
            ..b
        };
        assert_eq!(shrinking.bound(3), MS(25));
        assert_eq!(shrinking.bound(u32::MAX), Duration::ZERO);
        let huge = GrpcBackoff {
            multiplier: f64::MAX,
            ..b
        };
        assert_eq!(huge.bound(3), MS(1000));
    }
}
