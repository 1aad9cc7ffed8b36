//! The `maxTimeMS` an attempt carries under client-side operation timeouts (CS-4, TO-7, TO-9).
//!
//! The legacy `connectTimeoutMS` and `socketTimeoutMS` (TO-1..TO-3) are enforced by
//! [`crate::connection::ConnectionConfig`]; they never produce a `maxTimeMS` (TO-3). The
//! deprecated `maxCommitTimeMS` ([`crate::transaction::TransactionOptions::max_commit_time`],
//! TO-6) is a commit's `maxTimeMS` only without `timeoutMS`; under it [`max_time_ms`] decides
//! (TO-8).

use core::time::Duration;

use crate::time::{Instant, OperationTimeout};

/// What an attempt does about `maxTimeMS` (CS-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MaxTime {
    /// Send no `maxTimeMS`: CSOT is off (TO-3: `socketTimeoutMS` never produces one) or
    /// `timeoutMS=0` (TO-7).
    Omit,
    /// Append `maxTimeMS` with this many milliseconds: at least 1 and at most
    /// [`MAX_TIME_MS_LIMIT`], so it fits the Int32 a server takes.
    Send(u64),
    /// CS-4, TO-10: the remaining time is not more than the minimum RTT: do not send the command,
    /// fail the attempt with a timeout error.
    Expired,
}

/// The largest `maxTimeMS` a server accepts (`i32::MAX`; a larger value is refused with
/// BadValue, code 2). A longer remaining time is sent as this and still enforced by the client's
/// own deadline.
pub const MAX_TIME_MS_LIMIT: u64 = i32::MAX as u64;

/// CS-4: `maxTimeMS = remaining − minRTT` for an attempt about to be written at `now`, where
/// `min_rtt` is the selected server's minimum RTT (the minimum of its last 10 samples, zero until
/// two exist; MO-13).
///
/// Milliseconds are rounded down. A result below 1 ms counts as expired: `maxTimeMS: 0` would mean
/// "no limit" to the server. A result above [`MAX_TIME_MS_LIMIT`] is clamped to it.
pub fn max_time_ms(timeout: OperationTimeout, min_rtt: Duration, now: Instant) -> MaxTime {
    let OperationTimeout::Until(deadline) = timeout else {
        return MaxTime::Omit;
    };
    let remaining = deadline.saturating_duration_since(now);
    match remaining.checked_sub(min_rtt) {
        Some(left) if !left.is_zero() => {
            let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
            if ms == 0 {
                MaxTime::Expired
            } else {
                MaxTime::Send(ms.min(MAX_TIME_MS_LIMIT))
            }
        }
        _ => MaxTime::Expired,
    }
}

/// TO-13, CS-4 (review37 W14): what a `getMore` does about `maxTimeMS`, given the `maxTimeMS`
/// its command carries (`given`; for a tailable awaitData cursor, the cursor's
/// `maxAwaitTimeMS`), the operation's `timeout`, the server's minimum RTT and `now`.
///
/// - No `maxTimeMS` given (a non-tailable cursor, a tailable one without awaitData, or an
///   awaitData one without `maxAwaitTimeMS`): [`MaxTime::Omit`], none is derived from the
///   timeout (the CSOT spec's cursor rules).
/// - Given, under CSOT with a deadline: the CSOT spec's awaitData rule,
///   `maxTimeMS = min(maxAwaitTimeMS, remaining − minRoundTripTime)`, as [`MaxTime::Send`];
///   [`MaxTime::Expired`] when the remaining time is not more than the minimum RTT (CS-4: the
///   command is not sent).
/// - Given, without CSOT or with `timeoutMS=0` (TO-7: `min(0, x) = x`): [`MaxTime::Omit`], the
///   command's own value goes as given.
///
/// Only a positive integral number counts as given (Int32, Int64, or a Double without a
/// fraction); any other value is left for the server to judge ([`MaxTime::Omit`]). A retried
/// getMore (BP-5) reads the value its previous attempt sent, already capped: the time left only
/// shrinks, so the result is the same as from the caller's value. The check
/// that `maxAwaitTimeMS` is below a non-zero `timeoutMS` belongs to the helper that opens the
/// cursor (the engine sees neither option, only the getMore's command).
pub fn get_more_max_time_ms(
    given: Option<&bson::Bson>,
    timeout: OperationTimeout,
    min_rtt: Duration,
    now: Instant,
) -> MaxTime {
    let given = match given {
        Some(bson::Bson::Int32(ms)) => u64::try_from(*ms).ok(),
        Some(bson::Bson::Int64(ms)) => u64::try_from(*ms).ok(),
        Some(bson::Bson::Double(ms)) if ms.fract() == 0.0 && *ms >= 1.0 && *ms <= 1e18 => {
            Some(*ms as u64)
        }
        _ => None,
    };
    let Some(given) = given.filter(|ms| *ms > 0) else {
        return MaxTime::Omit;
    };
    match max_time_ms(timeout, min_rtt, now) {
        MaxTime::Send(left) => MaxTime::Send(given.min(left)),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn cs4_max_time_is_remaining_minus_min_rtt() {
        let deadline = OperationTimeout::Until(Instant::from_millis(1_000));
        assert_eq!(
            max_time_ms(deadline, ms(0), Instant::from_millis(100)),
            MaxTime::Send(900)
        );
        assert_eq!(
            max_time_ms(deadline, ms(30), Instant::from_millis(100)),
            MaxTime::Send(870)
        );
        // Rounded down.
        let now = Instant::from_millis(100).saturating_add(Duration::from_micros(500));
        assert_eq!(max_time_ms(deadline, ms(0), now), MaxTime::Send(899));
    }

    #[test]
    fn cs4_remaining_not_above_min_rtt_is_a_timeout_without_sending() {
        let deadline = OperationTimeout::Until(Instant::from_millis(1_000));
        assert_eq!(
            max_time_ms(deadline, ms(50), Instant::from_millis(950)),
            MaxTime::Expired
        );
        assert_eq!(
            max_time_ms(deadline, ms(60), Instant::from_millis(950)),
            MaxTime::Expired
        );
        assert_eq!(
            max_time_ms(deadline, ms(0), Instant::from_millis(2_000)),
            MaxTime::Expired
        );
        // Less than a millisecond left would be maxTimeMS 0, which means "no limit".
        let now = Instant::from_millis(1_000).saturating_sub(Duration::from_micros(400));
        assert_eq!(max_time_ms(deadline, ms(0), now), MaxTime::Expired);
    }

    /// Review item 7, CS-4: a deadline further away than `i32::MAX` ms (about 24.8 days) sends
    /// `maxTimeMS` = `i32::MAX`, which a server accepts.
    #[test]
    fn cs4_max_time_is_clamped_to_what_a_server_accepts() {
        let far = OperationTimeout::Until(Instant::from_millis(i64::MAX as u64 / 2));
        assert_eq!(
            max_time_ms(far, ms(0), Instant::ZERO),
            MaxTime::Send(i32::MAX as u64)
        );
        let edge = OperationTimeout::Until(Instant::from_millis(i32::MAX as u64 + 10));
        assert_eq!(
            max_time_ms(edge, ms(10), Instant::ZERO),
            MaxTime::Send(i32::MAX as u64)
        );
        assert_eq!(
            max_time_ms(edge, ms(11), Instant::ZERO),
            MaxTime::Send(i32::MAX as u64 - 1)
        );
    }

    /// TO-13, CS-4 (review37 W14): an awaitData getMore sends the smaller of its own
    /// `maxTimeMS` (the cursor's `maxAwaitTimeMS`) and the time left minus the minimum RTT.
    #[test]
    fn to13_get_more_max_time_is_the_smaller_of_max_await_and_the_time_left() {
        let deadline = OperationTimeout::Until(Instant::from_millis(1_000));
        let at = Instant::from_millis(500);
        let given = |ms: i64| bson::Bson::Int64(ms);
        // The time left (500 − 20) is smaller than the maxAwaitTimeMS given.
        let left = get_more_max_time_ms(Some(&given(10_000)), deadline, ms(20), at);
        assert_eq!(left, MaxTime::Send(480));
        // The maxAwaitTimeMS given is smaller: sent as it is.
        let awaited = get_more_max_time_ms(Some(&bson::Bson::Int32(100)), deadline, ms(20), at);
        assert_eq!(awaited, MaxTime::Send(100));
        let double = get_more_max_time_ms(Some(&bson::Bson::Double(100.0)), deadline, ms(0), at);
        assert_eq!(double, MaxTime::Send(100));
        // CS-4: no time left beyond the minimum RTT: not sent.
        let expired = get_more_max_time_ms(Some(&given(100)), deadline, ms(500), at);
        assert_eq!(expired, MaxTime::Expired);
    }

    /// TO-13: a getMore without `maxTimeMS` gets none under CSOT (non-tailable cursors, and
    /// awaitData ones without `maxAwaitTimeMS`); without CSOT or with `timeoutMS=0` (TO-7) a
    /// given one goes as it is; a value that is not a positive integer is the server's to judge.
    #[test]
    fn to13_get_more_max_time_is_never_derived_from_the_timeout_alone() {
        let deadline = OperationTimeout::Until(Instant::from_millis(1_000));
        let at = Instant::from_millis(500);
        assert_eq!(
            get_more_max_time_ms(None, deadline, ms(0), at),
            MaxTime::Omit
        );
        for timeout in [OperationTimeout::Off, OperationTimeout::Unbounded] {
            let given = bson::Bson::Int64(10_000);
            assert_eq!(
                get_more_max_time_ms(Some(&given), timeout, ms(0), at),
                MaxTime::Omit
            );
        }
        for odd in [
            bson::Bson::Int32(0),
            bson::Bson::Int64(-5),
            bson::Bson::Double(1.5),
            bson::Bson::String("100".into()),
        ] {
            assert_eq!(
                get_more_max_time_ms(Some(&odd), deadline, ms(0), at),
                MaxTime::Omit,
                "{odd:?}"
            );
        }
    }

    #[test]
    fn to3_to7_no_max_time_without_csot_or_with_timeout_zero() {
        assert_eq!(
            max_time_ms(OperationTimeout::Off, ms(0), Instant::ZERO),
            MaxTime::Omit
        );
        assert_eq!(
            max_time_ms(OperationTimeout::Unbounded, ms(0), Instant::ZERO),
            MaxTime::Omit
        );
    }
}
