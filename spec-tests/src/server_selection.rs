//! The `server_selection` and `max-staleness` suites: suitable servers and the latency window for
//! one topology, read preference and deprioritized set (SS-2..SS-13, MS).

use std::collections::BTreeSet;
use std::path::Path;

use retry_core::rng::EngineRng;
use retry_core::selection::{
    retain_latency_window, select_server, suitable_servers, SelectionCriteria, SelectionSettings,
};
use retry_core::topology::ServerDescription;
use serde_json::Value;

use crate::corpus::read_json;
use crate::json::{self, field};

/// Runs one file: builds the topology and criteria, then compares `suitable_servers` and
/// `in_latency_window` as sets of addresses (or expects an error when the file says `error:
/// true`), and checks that the whole pipeline picks a server of the window.
pub fn run_file(path: &Path) -> Result<(), String> {
    let test = read_json(path)?;
    let topology = json::topology(field(&test, "topology_description")?)?;
    let mut settings = SelectionSettings::default();
    if let Some(hb) = test.get("heartbeatFrequencyMS") {
        settings.heartbeat_frequency = json::millis(hb)?;
    }
    let expect_error = test.get("error").and_then(Value::as_bool).unwrap_or(false);
    let read_preference = match test.get("read_preference") {
        Some(rp) => json::read_preference(rp)?,
        None => Ok(Default::default()),
    };
    let criteria = match test.get("operation").and_then(Value::as_str) {
        None | Some("read") => match read_preference {
            Ok(rp) => SelectionCriteria::Read(rp),
            Err(e) if expect_error => return expected_error(e),
            Err(e) => return Err(format!("unexpected read preference error: {e}")),
        },
        Some("write") => SelectionCriteria::Write,
        Some(other) => return Err(format!("unknown operation {other:?}")),
    };
    let deprioritized = match test.get("deprioritized_servers") {
        Some(list) => list
            .as_array()
            .ok_or("`deprioritized_servers` is not an array")?
            .iter()
            .map(json::server_address)
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };

    let suitable = suitable_servers(
        &topology,
        &criteria,
        &deprioritized,
        settings.heartbeat_frequency,
    );
    let mut suitable = match (suitable, expect_error) {
        (Err(e), true) => return expected_error(e.to_string()),
        (Err(e), false) => return Err(format!("unexpected error: {e}")),
        (Ok(s), true) => return Err(format!("expected an error, got suitable {:?}", names(&s))),
        (Ok(s), false) => s,
    };
    compare(
        "suitable_servers",
        &suitable,
        field(&test, "suitable_servers")?,
    )?;
    retain_latency_window(&mut suitable, settings.local_threshold);
    compare(
        "in_latency_window",
        &suitable,
        field(&test, "in_latency_window")?,
    )?;

    let mut rng = EngineRng::from_seed_u64(0x5EED);
    let chosen = select_server(
        &topology,
        &criteria,
        &deprioritized,
        &settings,
        |_| 0,
        &mut rng,
    )
    .map_err(|e| format!("select_server failed: {e}"))?;
    match chosen {
        Some(s) if !suitable.iter().any(|w| w.address == s.address) => Err(format!(
            "select_server chose {} outside the window {:?}",
            s.address,
            names(&suitable)
        )),
        None if !suitable.is_empty() => Err("select_server chose nothing".into()),
        _ => Ok(()),
    }
}

/// An expected error happened; its message must name a read-preference field.
fn expected_error(message: String) -> Result<(), String> {
    if message.contains("`maxStalenessSeconds`")
        || message.contains("`tag_sets`")
        || message.contains("`mode`")
    {
        Ok(())
    } else {
        Err(format!("the error does not name a field: {message}"))
    }
}

fn names(servers: &[&ServerDescription]) -> BTreeSet<String> {
    servers.iter().map(|s| s.address.to_string()).collect()
}

/// Compares as sets of addresses (the spec: suitable servers SHOULD, the window MUST match).
fn compare(what: &str, actual: &[&ServerDescription], expected: &Value) -> Result<(), String> {
    let expected: BTreeSet<String> = expected
        .as_array()
        .ok_or_else(|| format!("`{what}` is not an array"))?
        .iter()
        .map(|s| json::server_address(s).map(|a| a.to_string()))
        .collect::<Result<_, _>>()?;
    let actual = names(actual);
    if actual == expected {
        Ok(())
    } else {
        Err(format!("{what}: expected {expected:?}, got {actual:?}"))
    }
}
