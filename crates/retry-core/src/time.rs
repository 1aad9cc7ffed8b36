//! Virtual time: a monotonic [`Instant`] the caller supplies, and saturating arithmetic on it.
//!
//! retry-core never reads a clock. Every input that depends on time takes `now: Instant`, where an
//! `Instant` is a count of nanoseconds since an origin the adapter picks (for example the moment the
//! client was created). Arithmetic saturates instead of overflowing or panicking, so a deadline
//! computed from any user or server value is always representable.

use core::fmt;
use core::time::Duration;

/// A point in monotonic time: nanoseconds since an origin chosen by whoever drives the engine.
///
/// Two instants are only comparable when they come from the same origin. The type is `Copy`, totally
/// ordered, and all arithmetic on it saturates at [`Instant::ZERO`] and [`Instant::MAX`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant(0);
    /// The latest representable instant (about 584 years after the origin); "never".
    pub const MAX: Instant = Instant(u64::MAX);

    /// The instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// The instant `millis` milliseconds after the origin (saturating).
    pub const fn from_millis(millis: u64) -> Instant {
        Instant(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The time elapsed since the origin.
    pub const fn since_origin(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// `self + d`, saturating at [`Instant::MAX`].
    pub fn saturating_add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(duration_nanos(d)))
    }

    /// `self - d`, saturating at [`Instant::ZERO`].
    pub fn saturating_sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(duration_nanos(d)))
    }

    /// The time from `earlier` to `self`, or zero when `earlier` is later than `self`.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Instant({:?})", self.since_origin())
    }
}

impl fmt::Display for Instant {
    /// Formats as seconds since the origin with millisecond precision, e.g. `t+1.250s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0 / 1_000_000;
        write!(f, "t+{}.{:03}s", ms / 1000, ms % 1000)
    }
}

/// A duration as whole nanoseconds, saturating at `u64::MAX` (about 584 years).
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The time limit of one operation under client-side operation timeouts (CSOT).
///
/// CS-1: `timeoutMS` unset means the legacy behaviour ([`OperationTimeout::Off`]); `timeoutMS=0`
/// means CSOT is on with no limit ([`OperationTimeout::Unbounded`]); a positive value gives one
/// deadline for the whole operation ([`OperationTimeout::Until`], CS-2). The distinction matters to
/// retries: with CSOT on, non-overload errors are retried until the deadline (RR/RW-21).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum OperationTimeout {
    /// CSOT is off: at most one non-overload retry (RW-12).
    #[default]
    Off,
    /// CSOT is on with `timeoutMS=0`: retries are limited only by the retry caps.
    Unbounded,
    /// CSOT is on: the operation, all retries and backoffs included, ends by this instant.
    Until(Instant),
}

impl OperationTimeout {
    /// A deadline `timeout` after `now`, or [`OperationTimeout::Unbounded`] for a zero timeout
    /// (CS-1: `timeoutMS=0` means no limit).
    pub fn from_timeout_ms(now: Instant, timeout: Duration) -> OperationTimeout {
        if timeout.is_zero() {
            OperationTimeout::Unbounded
        } else {
            OperationTimeout::Until(now.saturating_add(timeout))
        }
    }

    /// Whether CSOT is on for this operation.
    pub fn is_csot(self) -> bool {
        !matches!(self, OperationTimeout::Off)
    }

    /// The deadline, if there is one.
    pub fn deadline(self) -> Option<Instant> {
        match self {
            OperationTimeout::Until(t) => Some(t),
            _ => None,
        }
    }

    /// Whether the deadline has passed at `now` (CS-6: never start a retry once it has).
    pub fn expired(self, now: Instant) -> bool {
        matches!(self, OperationTimeout::Until(t) if now >= t)
    }

    /// Whether a wait from `now` lasting `wait` would end after the deadline (BP-16).
    pub fn would_pass(self, now: Instant, wait: Duration) -> bool {
        matches!(self, OperationTimeout::Until(t) if now.saturating_add(wait) > t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_at_both_ends() {
        assert_eq!(
            Instant::MAX.saturating_add(Duration::from_secs(1)),
            Instant::MAX
        );
        assert_eq!(
            Instant::ZERO.saturating_sub(Duration::from_secs(1)),
            Instant::ZERO
        );
        assert_eq!(Instant::from_millis(u64::MAX), Instant::MAX);
        assert_eq!(
            Instant::from_millis(5).saturating_duration_since(Instant::from_millis(7)),
            Duration::ZERO
        );
        assert_eq!(Instant::ZERO.saturating_add(Duration::MAX), Instant::MAX);
    }

    #[test]
    fn cs1_zero_timeout_is_unbounded_and_positive_is_a_deadline() {
        let now = Instant::from_millis(10);
        assert_eq!(
            OperationTimeout::from_timeout_ms(now, Duration::ZERO),
            OperationTimeout::Unbounded
        );
        let t = OperationTimeout::from_timeout_ms(now, Duration::from_millis(100));
        assert_eq!(t.deadline(), Some(Instant::from_millis(110)));
        assert!(!t.expired(Instant::from_millis(109)));
        assert!(t.expired(Instant::from_millis(110)));
    }

    #[test]
    fn bp16_a_wait_ending_exactly_at_the_deadline_does_not_pass_it() {
        let t = OperationTimeout::Until(Instant::from_millis(100));
        assert!(!t.would_pass(Instant::from_millis(60), Duration::from_millis(40)));
        assert!(t.would_pass(Instant::from_millis(60), Duration::from_nanos(40_000_001)));
        assert!(!OperationTimeout::Unbounded.would_pass(Instant::MAX, Duration::MAX));
    }

    #[test]
    fn display_is_seconds_with_millis() {
        assert_eq!(Instant::from_millis(1250).to_string(), "t+1.250s");
    }
}
