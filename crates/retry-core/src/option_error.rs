//! [`OptionError`]: an invalid option, named as users write it. Its own module so that the
//! budgets and the policies that build on them both use it without depending on each other.

use alloc::string::{String, ToString};
use core::fmt;

/// An invalid option: which one, why, and the value given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionError {
    option: &'static str,
    rule: &'static str,
    value: String,
}

impl OptionError {
    /// An error for `option`, which breaks `rule`, with the offending `value`.
    pub fn new(option: &'static str, rule: &'static str, value: impl fmt::Display) -> OptionError {
        OptionError {
            option,
            rule,
            value: value.to_string(),
        }
    }

    /// The option's name as users write it (`maxAdaptiveRetries`, `maxAttempts`, ...).
    pub fn option(&self) -> &'static str {
        self.option
    }
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {}: {}, got {}",
            self.option, self.rule, self.value
        )
    }
}

impl core::error::Error for OptionError {}
