//! Read preferences (SS-2) and their validation.

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use core::str::FromStr;
use core::time::Duration;

use crate::topology::TagSet;

/// The smallest `maxStalenessSeconds` a replica-set read may use (SS-1: `smallestMaxStalenessSeconds`).
pub const SMALLEST_MAX_STALENESS: Duration = Duration::from_secs(90);

/// How often an idle primary writes a no-op to its oplog (SS-1: `idleWritePeriodMS`, a constant).
pub const IDLE_WRITE_PERIOD: Duration = Duration::from_secs(10);

/// A read preference mode (SS-2, SS-3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ReadPreferenceMode {
    /// Only the primary.
    #[default]
    Primary,
    /// The primary if known, else eligible secondaries.
    PrimaryPreferred,
    /// Only eligible secondaries.
    Secondary,
    /// Eligible secondaries, else the primary.
    SecondaryPreferred,
    /// The primary and eligible secondaries alike.
    Nearest,
}

impl ReadPreferenceMode {
    /// The mode as `$readPreference` spells it (camel case).
    pub fn as_str(self) -> &'static str {
        match self {
            ReadPreferenceMode::Primary => "primary",
            ReadPreferenceMode::PrimaryPreferred => "primaryPreferred",
            ReadPreferenceMode::Secondary => "secondary",
            ReadPreferenceMode::SecondaryPreferred => "secondaryPreferred",
            ReadPreferenceMode::Nearest => "nearest",
        }
    }
}

impl fmt::Display for ReadPreferenceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReadPreferenceMode {
    type Err = ReadPreferenceError;

    /// Parses a mode name, ignoring ASCII case (`secondaryPreferred`, `SecondaryPreferred`).
    fn from_str(s: &str) -> Result<ReadPreferenceMode, ReadPreferenceError> {
        [
            ReadPreferenceMode::Primary,
            ReadPreferenceMode::PrimaryPreferred,
            ReadPreferenceMode::Secondary,
            ReadPreferenceMode::SecondaryPreferred,
            ReadPreferenceMode::Nearest,
        ]
        .into_iter()
        .find(|m| m.as_str().eq_ignore_ascii_case(s))
        .ok_or_else(|| ReadPreferenceError::UnknownMode(s.into()))
    }
}

/// Why a read preference is invalid. Each message names the offending field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadPreferenceError {
    /// `mode` is not one of the five modes (SS-2).
    UnknownMode(Box<str>),
    /// A non-empty tag set with mode primary (SS-2).
    TagSetsWithPrimary,
    /// A `maxStalenessSeconds` with mode primary (SS-2).
    MaxStalenessWithPrimary,
    /// `maxStalenessSeconds` is neither `-1` (none) nor positive (SS-2, C10: `0` is an error).
    MaxStalenessNotPositive(i64),
    /// In a replica set, `maxStalenessSeconds` is below `max(90 s, heartbeatFrequencyMS +
    /// idleWritePeriodMS)` (SS-2).
    MaxStalenessTooSmall {
        /// The value given, in seconds.
        max_staleness_seconds: u64,
        /// The smallest value allowed with the client's heartbeat frequency, in milliseconds.
        minimum_ms: u128,
    },
}

impl fmt::Display for ReadPreferenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadPreferenceError::UnknownMode(mode) => write!(
                f,
                "invalid read preference: unknown `mode` {mode:?} (expected primary, \
                 primaryPreferred, secondary, secondaryPreferred or nearest)"
            ),
            ReadPreferenceError::TagSetsWithPrimary => {
                f.write_str("invalid read preference: `tag_sets` must be empty with mode primary")
            }
            ReadPreferenceError::MaxStalenessWithPrimary => f.write_str(
                "invalid read preference: `maxStalenessSeconds` cannot be used with mode primary",
            ),
            ReadPreferenceError::MaxStalenessNotPositive(v) => write!(
                f,
                "invalid read preference: `maxStalenessSeconds` must be positive or -1 (no \
                 maximum), got {v}"
            ),
            ReadPreferenceError::MaxStalenessTooSmall {
                max_staleness_seconds,
                minimum_ms,
            } => write!(
                f,
                "invalid read preference: `maxStalenessSeconds` is {max_staleness_seconds} s, but \
                 must be at least 90 s and at least heartbeatFrequencyMS + idleWritePeriodMS \
                 ({minimum_ms} ms)"
            ),
        }
    }
}

impl core::error::Error for ReadPreferenceError {}

/// A validated read preference (SS-2): a mode, tag sets tried in order, and an optional maximum
/// staleness. The deprecated `hedge` is not modelled.
///
/// Cloning never allocates (the tag sets are shared), so a selection can own its criteria.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct ReadPreference {
    mode: ReadPreferenceMode,
    tag_sets: Option<Arc<[TagSet]>>,
    max_staleness: Option<Duration>,
}

impl ReadPreference {
    /// Mode primary, the default.
    pub const PRIMARY: ReadPreference = ReadPreference::from_mode(ReadPreferenceMode::Primary);

    /// A read preference with no tag sets and no maximum staleness; valid for every mode.
    pub const fn from_mode(mode: ReadPreferenceMode) -> ReadPreference {
        ReadPreference {
            mode,
            tag_sets: None,
            max_staleness: None,
        }
    }

    /// Validates and builds a read preference (SS-2).
    ///
    /// `max_staleness_seconds` is `None` or `-1` for "no maximum"; `0` and other non-positive
    /// values are errors (C10). With mode primary, a non-empty tag set or a maximum staleness is an
    /// error. An empty `tag_sets` and `[{}]` both match every server (SS-6). The minimum staleness
    /// depends on the topology and is checked at selection time
    /// ([`ReadPreference::check_max_staleness`]).
    pub fn new(
        mode: ReadPreferenceMode,
        tag_sets: Vec<TagSet>,
        max_staleness_seconds: Option<i64>,
    ) -> Result<ReadPreference, ReadPreferenceError> {
        let max_staleness = match max_staleness_seconds {
            None | Some(-1) => None,
            Some(s) => match u64::try_from(s) {
                Ok(s) if s > 0 => Some(Duration::from_secs(s)),
                _ => return Err(ReadPreferenceError::MaxStalenessNotPositive(s)),
            },
        };
        if mode == ReadPreferenceMode::Primary {
            if tag_sets.iter().any(|t| !t.is_empty()) {
                return Err(ReadPreferenceError::TagSetsWithPrimary);
            }
            if max_staleness.is_some() {
                return Err(ReadPreferenceError::MaxStalenessWithPrimary);
            }
        }
        Ok(ReadPreference {
            mode,
            tag_sets: (!tag_sets.is_empty()).then(|| tag_sets.into()),
            max_staleness,
        })
    }

    /// The mode.
    pub fn mode(&self) -> ReadPreferenceMode {
        self.mode
    }

    /// The tag sets, in the order they are tried (SS-6).
    pub fn tag_sets(&self) -> &[TagSet] {
        self.tag_sets.as_deref().unwrap_or_default()
    }

    /// The maximum staleness, if any (SS-5).
    pub fn max_staleness(&self) -> Option<Duration> {
        self.max_staleness
    }

    /// SS-2: in a replica set, the maximum staleness must be at least 90 s and at least
    /// `heartbeatFrequencyMS + idleWritePeriodMS`.
    pub fn check_max_staleness(
        &self,
        heartbeat_frequency: Duration,
    ) -> Result<(), ReadPreferenceError> {
        let Some(max) = self.max_staleness else {
            return Ok(());
        };
        let minimum = heartbeat_frequency.saturating_add(IDLE_WRITE_PERIOD);
        if max < SMALLEST_MAX_STALENESS || max < minimum {
            return Err(ReadPreferenceError::MaxStalenessTooSmall {
                max_staleness_seconds: max.as_secs(),
                minimum_ms: minimum.max(SMALLEST_MAX_STALENESS).as_millis(),
            });
        }
        Ok(())
    }
}

impl fmt::Display for ReadPreference {
    /// Formats every component (SS-19 asks for all of them): `{mode: nearest, tag_sets: [{dc:
    /// "ny"}], maxStalenessSeconds: 120}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{mode: {}", self.mode)?;
        if !self.tag_sets().is_empty() {
            f.write_str(", tag_sets: [")?;
            for (i, t) in self.tag_sets().iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{t}")?;
            }
            f.write_str("]")?;
        }
        if let Some(max) = self.max_staleness {
            write!(f, ", maxStalenessSeconds: {}", max.as_secs())?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    fn dc(v: &str) -> TagSet {
        [("dc", v)].into_iter().collect()
    }

    #[test]
    fn ss2_modes_parse_in_any_case_and_unknown_modes_name_the_field() {
        assert_eq!(
            "SecondaryPreferred".parse::<ReadPreferenceMode>(),
            Ok(ReadPreferenceMode::SecondaryPreferred)
        );
        assert_eq!("nearest".parse(), Ok(ReadPreferenceMode::Nearest));
        let err = "closest".parse::<ReadPreferenceMode>().unwrap_err();
        assert!(err.to_string().contains("`mode` \"closest\""), "{err}");
    }

    #[test]
    fn ss2_primary_rejects_tags_and_staleness_but_accepts_the_empty_tag_set() {
        use ReadPreferenceMode::*;
        let err = ReadPreference::new(Primary, vec![dc("ny")], None).unwrap_err();
        assert_eq!(err, ReadPreferenceError::TagSetsWithPrimary);
        assert!(err.to_string().contains("`tag_sets`"));
        let err = ReadPreference::new(Primary, vec![], Some(120)).unwrap_err();
        assert!(err.to_string().contains("`maxStalenessSeconds`"));
        assert!(ReadPreference::new(Primary, vec![TagSet::new()], Some(-1)).is_ok());
    }

    #[test]
    fn c10_zero_and_negative_max_staleness_are_errors_and_minus_one_is_none() {
        use ReadPreferenceMode::Nearest;
        for bad in [0, -2, i64::MIN] {
            assert_eq!(
                ReadPreference::new(Nearest, vec![], Some(bad)),
                Err(ReadPreferenceError::MaxStalenessNotPositive(bad))
            );
        }
        let none = ReadPreference::new(Nearest, vec![], Some(-1)).unwrap();
        assert_eq!(none.max_staleness(), None);
    }

    #[test]
    fn ss2_minimum_is_90s_and_heartbeat_plus_idle_write_period() {
        let hb = Duration::from_secs(10);
        let rp = |s| ReadPreference::new(ReadPreferenceMode::Secondary, vec![], Some(s)).unwrap();
        assert!(rp(90).check_max_staleness(hb).is_ok());
        let err = rp(89).check_max_staleness(hb).unwrap_err();
        assert!(
            err.to_string().contains("`maxStalenessSeconds` is 89 s"),
            "{err}"
        );
        let long = Duration::from_secs(120);
        assert!(rp(130).check_max_staleness(long).is_ok());
        assert_eq!(
            rp(129).check_max_staleness(long),
            Err(ReadPreferenceError::MaxStalenessTooSmall {
                max_staleness_seconds: 129,
                minimum_ms: 130_000
            })
        );
        assert!(ReadPreference::PRIMARY.check_max_staleness(long).is_ok());
    }

    #[test]
    fn display_lists_every_component() {
        let rp = ReadPreference::new(
            ReadPreferenceMode::Nearest,
            vec![dc("ny"), TagSet::new()],
            Some(120),
        )
        .unwrap();
        assert_eq!(
            rp.to_string(),
            r#"{mode: nearest, tag_sets: [{dc: "ny"}, {}], maxStalenessSeconds: 120}"#
        );
    }
}
