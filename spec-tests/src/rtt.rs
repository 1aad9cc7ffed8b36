//! The `rtt` suite: one step of the average-RTT moving average (SS-14).

use std::path::Path;

use retry_core::topology::AverageRtt;
use serde_json::Value;

use crate::corpus::read_json;
use crate::json::{self, field};

/// Runs one file: folds `new_rtt_ms` into `avg_rtt_ms` (`"NULL"` means no average yet) and
/// compares with `new_avg_rtt`, to the nanosecond.
pub fn run_file(path: &Path) -> Result<(), String> {
    let test = read_json(path)?;
    let mut average = match field(&test, "avg_rtt_ms")? {
        Value::String(s) if s == "NULL" => AverageRtt::NONE,
        old => AverageRtt::from_duration(json::millis(old)?),
    };
    let sample = json::millis(field(&test, "new_rtt_ms")?)?;
    let expected = json::millis(field(&test, "new_avg_rtt")?)?;
    let actual = average.update(sample);
    if actual == expected {
        Ok(())
    } else {
        Err(format!("expected {expected:?}, got {actual:?}"))
    }
}
