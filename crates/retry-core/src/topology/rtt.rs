//! The average round-trip time of a server's monitoring checks (SS-14).

use core::time::Duration;

use crate::time::duration_nanos;

/// SS-14: a server's average RTT, an exponentially weighted moving average with weight 0.2 on the
/// newest sample.
///
/// The first sample becomes the average; after that `new = 0.2·sample + 0.8·old`. The arithmetic is
/// on whole nanoseconds, rounded to nearest, so it is exact and platform independent. The average is
/// cleared (set to `None`) when the server becomes Unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AverageRtt(Option<Duration>);

impl AverageRtt {
    /// No sample yet (an Unknown server).
    pub const NONE: AverageRtt = AverageRtt(None);

    /// An average that starts from `rtt`.
    pub const fn from_duration(rtt: Duration) -> AverageRtt {
        AverageRtt(Some(rtt))
    }

    /// The current average, if there is one.
    pub const fn get(self) -> Option<Duration> {
        self.0
    }

    /// SS-14: folds one sample into the average and returns the new average.
    pub fn update(&mut self, sample: Duration) -> Duration {
        let new = match self.0 {
            None => sample,
            Some(old) => {
                let (x, old) = (
                    u128::from(duration_nanos(sample)),
                    u128::from(duration_nanos(old)),
                );
                let nanos = (x + 4 * old + 2) / 5;
                Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
            }
        };
        self.0 = Some(new);
        new
    }

    /// SS-14: forgets the average (the server became Unknown).
    pub fn clear(&mut self) {
        self.0 = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1000.0)
    }

    #[test]
    fn ss14_first_sample_becomes_the_average_then_ewma() {
        let mut avg = AverageRtt::NONE;
        assert_eq!(avg.update(ms(10.0)), ms(10.0));
        let mut avg2 = AverageRtt::from_duration(ms(3.1));
        assert_eq!(avg2.update(ms(36.0)), ms(9.68));
        let mut avg3 = AverageRtt::from_duration(ms(1.0));
        assert_eq!(avg3.update(ms(1000.0)), ms(200.8));
        avg.clear();
        assert_eq!(avg.get(), None);
    }

    #[test]
    fn ss14_huge_samples_saturate_instead_of_overflowing() {
        let mut avg = AverageRtt::from_duration(Duration::MAX);
        assert_eq!(avg.update(Duration::MAX), Duration::from_nanos(u64::MAX));
    }
}
