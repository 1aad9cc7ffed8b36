//! The `in_window` suite: selection frequencies under the power of two choices by operation count
//! (SS-15), with a seeded RNG.

use std::collections::BTreeMap;
use std::path::Path;

use retry_core::address::ServerAddress;
use retry_core::rng::EngineRng;
use retry_core::selection::{
    select_server, ReadPreference, ReadPreferenceMode, SelectionCriteria, SelectionSettings,
};

use crate::corpus::read_json;
use crate::json::{self, field};

/// The seed of every `in_window` run: fixed, so the observed frequencies are reproducible.
pub const SEED: u64 = 20_260_813;

/// Runs one file: selects `iterations` times with mode nearest, operation counts fixed from
/// `mocked_topology_state`, and compares each server's frequency with `expected_frequencies`
/// within `tolerance`; frequencies of exactly 0 or 1 must match exactly.
pub fn run_file(path: &Path) -> Result<(), String> {
    let test = read_json(path)?;
    let topology = json::topology(field(&test, "topology_description")?)?;
    let mut counts: BTreeMap<ServerAddress, u32> = BTreeMap::new();
    for state in field(&test, "mocked_topology_state")?
        .as_array()
        .ok_or("`mocked_topology_state` is not an array")?
    {
        let count = field(state, "operation_count")?
            .as_u64()
            .and_then(|c| u32::try_from(c).ok())
            .ok_or("bad `operation_count`")?;
        counts.insert(json::server_address(state)?, count);
    }
    let iterations = field(&test, "iterations")?
        .as_u64()
        .ok_or("`iterations` is not an integer")?;
    let outcome = field(&test, "outcome")?;
    let tolerance = field(outcome, "tolerance")?
        .as_f64()
        .ok_or("`tolerance` is not a number")?;

    let criteria = SelectionCriteria::Read(ReadPreference::from_mode(ReadPreferenceMode::Nearest));
    let settings = SelectionSettings::default();
    let mut rng = EngineRng::from_seed_u64(SEED);
    let mut chosen: BTreeMap<ServerAddress, u64> = BTreeMap::new();
    for _ in 0..iterations {
        let server = select_server(
            &topology,
            &criteria,
            &[],
            &settings,
            |a| counts.get(a).copied().unwrap_or(0),
            &mut rng,
        )
        .map_err(|e| e.to_string())?
        .ok_or("no server selected")?;
        *chosen.entry(server.address.clone()).or_default() += 1;
    }

    let mut failures = Vec::new();
    for (address, expected) in field(outcome, "expected_frequencies")?
        .as_object()
        .ok_or("`expected_frequencies` is not an object")?
    {
        let expected = expected.as_f64().ok_or("frequency is not a number")?;
        let address: ServerAddress = address.parse().map_err(|e| format!("{e}"))?;
        let observed = chosen.get(&address).copied().unwrap_or(0) as f64 / iterations as f64;
        let exact = expected == 0.0 || expected == 1.0;
        let ok = if exact {
            observed == expected
        } else {
            (observed - expected).abs() <= tolerance
        };
        if !ok {
            failures.push(format!(
                "{address}: expected {expected} ± {}, observed {observed}",
                if exact { 0.0 } else { tolerance }
            ));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}
