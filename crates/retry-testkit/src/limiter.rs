//! The token bucket behind both rate limiters, on the tokio clock so paused-time tests work.

use tokio::time::Instant;

use crate::config::RateLimit;

/// A token bucket (see [`RateLimit`]): starts full, refills continuously, one token per admission.
#[derive(Clone, Debug)]
pub(crate) struct TokenBucket {
    rate: RateLimit,
    tokens: f64,
    refilled_at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub(crate) fn new(rate: RateLimit, now: Instant) -> TokenBucket {
        TokenBucket {
            rate,
            tokens: f64::from(rate.burst),
            refilled_at: now,
        }
    }

    /// Takes a token if one is there at `now`.
    pub(crate) fn try_acquire(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Changes the rate at `now`, keeping the tokens already there up to the new burst.
    pub(crate) fn set_rate(&mut self, rate: RateLimit, now: Instant) {
        self.refill(now);
        self.rate = rate;
        self.tokens = self.tokens.min(f64::from(rate.burst));
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.refilled_at = self.refilled_at.max(now);
        // NaN and negative rates never refill; an infinite one fills the bucket at once.
        if self.rate.per_second > 0.0 && elapsed > 0.0 {
            let added = elapsed * self.rate.per_second;
            self.tokens = (self.tokens + added).min(f64::from(self.rate.burst));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    fn admitted(bucket: &mut TokenBucket, now: Instant, tries: usize) -> usize {
        (0..tries).filter(|_| bucket.try_acquire(now)).count()
    }

    #[test]
    fn burst_then_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(RateLimit::new(10.0, 5), start);
        assert_eq!(admitted(&mut bucket, start, 8), 5);
        // 10 per second: one token every 100 ms.
        let later = start + Duration::from_millis(250);
        assert_eq!(admitted(&mut bucket, later, 8), 2);
        // A long pause refills to the burst, not beyond.
        let much_later = later + Duration::from_secs(60);
        assert_eq!(admitted(&mut bucket, much_later, 8), 5);
    }

    #[test]
    fn zero_nan_and_negative_rates_never_refill() {
        let start = Instant::now();
        for per_second in [0.0, f64::NAN, -1.0] {
            let mut bucket = TokenBucket::new(RateLimit::new(per_second, 2), start);
            assert_eq!(admitted(&mut bucket, start, 5), 2);
            let later = start + Duration::from_secs(3600);
            assert_eq!(admitted(&mut bucket, later, 5), 0, "{per_second}");
        }
    }

    #[test]
    fn an_infinite_rate_admits_everything() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(RateLimit::new(f64::INFINITY, 1), start);
        let mut now = start;
        for _ in 0..100 {
            now += Duration::from_micros(1);
            assert!(bucket.try_acquire(now));
        }
    }

    #[test]
    fn a_zero_burst_admits_nothing() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(RateLimit::new(1000.0, 0), start);
        assert_eq!(admitted(&mut bucket, start + Duration::from_secs(1), 5), 0);
    }

    #[test]
    fn set_rate_keeps_tokens_up_to_the_new_burst() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(RateLimit::new(0.0, 10), start);
        assert_eq!(admitted(&mut bucket, start, 4), 4);
        bucket.set_rate(RateLimit::new(0.0, 3), start);
        assert_eq!(admitted(&mut bucket, start, 10), 3);
        bucket.set_rate(RateLimit::new(1.0, 3), start);
        assert_eq!(admitted(&mut bucket, start + Duration::from_secs(2), 10), 2);
    }

    #[test]
    fn time_going_backwards_adds_nothing() {
        let start = Instant::now() + Duration::from_secs(10);
        let mut bucket = TokenBucket::new(RateLimit::new(1.0, 1), start);
        assert!(bucket.try_acquire(start));
        assert!(!bucket.try_acquire(start - Duration::from_secs(5)));
        assert!(!bucket.try_acquire(start));
    }
}
