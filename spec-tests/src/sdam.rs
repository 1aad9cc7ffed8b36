//! The SDAM suites (`server-discovery-and-monitoring/tests/{single,rs,sharded,load-balanced,
//! errors,monitoring}`): phases of monitor replies and application errors fed to the
//! [`Topology`] machine, then its description (or, for `monitoring`, the SDAM events it
//! published during the phase) compared with the phase's outcome.

use std::path::Path;

use bson::oid::ObjectId;
use retry_core::address::ServerAddress;
use retry_core::error::{NetworkErrorKind, NetworkPhase, OperationError};
use retry_core::time::Instant;
use retry_core::topology::{
    ErrorContext, SdamEvent, ServerDescription, ServerType, Topology, TopologyDescription,
    TopologySettings, TopologyVersion,
};
use serde_json::Value;

use crate::corpus::read_json;
use crate::json::{self, field};

/// Runs one file, phase by phase; the error names the phase and what differed.
pub fn run_file(path: &Path) -> Result<(), String> {
    let test = read_json(path)?;
    let uri = field(&test, "uri")?
        .as_str()
        .ok_or("`uri` is not a string")?;
    let settings = settings(uri)?;
    let mut now = Instant::ZERO;
    let mut topology = Topology::new(settings, now).map_err(|e| format!("{uri}: {e}"))?;
    let phases = field(&test, "phases")?
        .as_array()
        .ok_or("`phases` is not an array")?;
    for (i, phase) in phases.iter().enumerate() {
        let name = phase
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("");
        run_phase(&mut topology, phase, &mut now)
            .map_err(|e| format!("phase {} ({name}): {e}", i + 1))?;
    }
    Ok(())
}

fn run_phase(topology: &mut Topology, phase: &Value, now: &mut Instant) -> Result<(), String> {
    for response in phase
        .get("responses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        *now = now.saturating_add(std::time::Duration::from_millis(1));
        let address = json::address(response.get(0).ok_or("a response without an address")?)?;
        let reply = response.get(1).ok_or("a response without a reply")?;
        if reply.as_object().is_some_and(|o| o.is_empty()) {
            let error = OperationError::network(
                NetworkErrorKind::Reset,
                NetworkPhase::Connect,
                address.clone(),
            );
            topology.handle_check_failed(&address, &error, *now);
        } else {
            let reply = match json::to_bson(reply)? {
                bson::Bson::Document(d) => d,
                other => return Err(format!("a reply that is not a document: {other}")),
            };
            topology.handle_hello(&address, &reply, std::time::Duration::ZERO, *now);
        }
        drain_actions(topology);
    }
    for error in phase
        .get("applicationErrors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        *now = now.saturating_add(std::time::Duration::from_millis(1));
        apply_error(topology, error, *now)?;
        drain_actions(topology);
    }
    let outcome = field(phase, "outcome")?;
    match outcome.get("events") {
        Some(expected) => compare_events(topology, expected),
        None => compare_topology(topology, outcome),
    }
}

/// The monitors and pools a real engine would run are not needed here; closed pools are
/// dropped.
fn drain_actions(topology: &mut Topology) {
    while topology.poll_action().is_some() {}
}

/// The URI's hosts and the `replicaSet`, `directConnection` and `loadBalanced` options.
fn settings(uri: &str) -> Result<TopologySettings, String> {
    let rest = uri
        .strip_prefix("mongodb://")
        .ok_or_else(|| format!("not a mongodb:// URI: {uri}"))?;
    let (hosts, options) = rest.split_once('/').unwrap_or((rest, ""));
    let seeds = hosts
        .split(',')
        .map(|h| h.parse::<ServerAddress>().map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut settings = TopologySettings::new(seeds);
    for option in options.trim_start_matches('?').split('&') {
        match option.split_once('=') {
            Some(("replicaSet", name)) => settings.replica_set = Some(name.to_owned()),
            Some(("directConnection", value)) => settings.direct_connection = value == "true",
            Some(("loadBalanced", value)) => settings.load_balanced = value == "true",
            None if option.is_empty() => {}
            _ => return Err(format!("unexpected URI option {option:?}")),
        }
    }
    Ok(settings)
}

/// An `applicationErrors` entry: a command error, a network error or a timeout, before or after
/// the handshake, on a connection of the given generation (default: the pool's).
fn apply_error(topology: &mut Topology, error: &Value, now: Instant) -> Result<(), String> {
    let address = json::address(field(error, "address")?)?;
    let handshake_completed = match field(error, "when")?.as_str() {
        Some("beforeHandshakeCompletes") => false,
        Some("afterHandshakeCompletes") => true,
        other => return Err(format!("unexpected `when`: {other:?}")),
    };
    let phase = if handshake_completed {
        NetworkPhase::AfterSend
    } else {
        NetworkPhase::Handshake
    };
    let operation_error = match field(error, "type")?.as_str() {
        Some("command") => {
            let reply = match json::to_bson(field(error, "response")?)? {
                bson::Bson::Document(d) => d,
                other => return Err(format!("a response that is not a document: {other}")),
            };
            match OperationError::from_reply(&reply, &address) {
                Some(e) => e,
                // `ok: 1` (write errors only): nothing for SDAM to handle.
                None => return Ok(()),
            }
        }
        Some("network") => OperationError::network(NetworkErrorKind::Reset, phase, address.clone()),
        Some("timeout") => {
            OperationError::network(NetworkErrorKind::Timeout, phase, address.clone())
        }
        other => return Err(format!("unexpected error `type`: {other:?}")),
    };
    let pool_generation = topology.pool(&address).map_or(0, |p| p.generation());
    let generation = match error.get("generation") {
        Some(g) => g
            .as_u64()
            .and_then(|g| u32::try_from(g).ok())
            .ok_or_else(|| format!("bad generation {g}"))?,
        None => pool_generation,
    };
    let context = ErrorContext {
        generation,
        service_id: None,
        handshake_completed,
    };
    topology.handle_application_error(&address, &operation_error, context, now);
    Ok(())
}

/// Compares the description with an `outcome`; fields the outcome leaves out are not compared.
fn compare_topology(topology: &Topology, outcome: &Value) -> Result<(), String> {
    let description = topology.description();
    if let Some(expected) = outcome.get("topologyType") {
        let expected = json::topology_type(expected.as_str().ok_or("bad topologyType")?)?;
        if description.topology_type != expected {
            return Err(format!(
                "topologyType: expected {expected:?}, got {:?} in {description}",
                description.topology_type
            ));
        }
    }
    if let Some(expected) = outcome.get("setName") {
        check(
            "setName",
            expected.as_str(),
            description.set_name.as_deref(),
        )?;
    }
    if let Some(expected) = outcome.get("logicalSessionTimeoutMinutes") {
        let actual = description
            .logical_session_timeout()
            .map(|t| t.as_secs() / 60);
        check("logicalSessionTimeoutMinutes", expected.as_u64(), actual)?;
    }
    if let Some(expected) = outcome.get("maxSetVersion") {
        check(
            "maxSetVersion",
            expected.as_i64(),
            description.max_set_version.map(i64::from),
        )?;
    }
    if let Some(expected) = outcome.get("maxElectionId") {
        check(
            "maxElectionId",
            object_id(expected)?,
            description.max_election_id,
        )?;
    }
    if let Some(expected) = outcome.get("compatible") {
        check(
            "compatible",
            expected.as_bool(),
            Some(description.is_compatible()),
        )?;
    }
    let servers = field(outcome, "servers")?
        .as_object()
        .ok_or("`servers` is not an object")?;
    if servers.len() != description.servers.len() {
        return Err(format!(
            "expected servers {:?}, got {description}",
            servers.keys().collect::<Vec<_>>()
        ));
    }
    for (address, expected) in servers {
        let address: ServerAddress = address.parse().map_err(|e| format!("{e}"))?;
        let server = description
            .server(&address)
            .ok_or_else(|| format!("server {address} missing from {description}"))?;
        compare_server(topology, server, expected).map_err(|e| format!("server {address}: {e}"))?;
    }
    Ok(())
}

fn compare_server(
    topology: &Topology,
    server: &ServerDescription,
    expected: &Value,
) -> Result<(), String> {
    if let Some(t) = expected.get("type") {
        let t = json::server_type(t.as_str().ok_or("bad type")?)?;
        check("type", Some(t), Some(server.server_type))?;
    }
    if let Some(name) = expected.get("setName") {
        check("setName", name.as_str(), server.set_name.as_deref())?;
    }
    if let Some(v) = expected.get("setVersion") {
        check("setVersion", v.as_i64(), server.set_version.map(i64::from))?;
    }
    if let Some(id) = expected.get("electionId") {
        check("electionId", object_id(id)?, server.election_id)?;
    }
    if let Some(lst) = expected.get("logicalSessionTimeoutMinutes") {
        let actual = server.logical_session_timeout.map(|t| t.as_secs() / 60);
        check("logicalSessionTimeoutMinutes", lst.as_u64(), actual)?;
    }
    for (key, actual) in [
        ("minWireVersion", server.min_wire_version),
        ("maxWireVersion", server.max_wire_version),
    ] {
        if let Some(v) = expected.get(key) {
            // SDAM gives both wire versions a default of 0; the load-balancer test writes the
            // unset value as null.
            let expected = if v.is_null() { Some(0) } else { v.as_i64() };
            check(key, expected, Some(i64::from(actual)))?;
        }
    }
    if let Some(tv) = expected.get("topologyVersion") {
        check(
            "topologyVersion",
            topology_version(tv)?,
            server.topology_version,
        )?;
    }
    if let Some(error) = expected.get("error") {
        let expected = error.as_str().ok_or("bad error")?;
        let actual = server.error.as_ref().map(ToString::to_string);
        if !actual.as_deref().is_some_and(|a| a.contains(expected)) {
            return Err(format!("error: expected {expected:?} in {actual:?}"));
        }
    }
    if let Some(generation) = expected.pointer("/pool/generation") {
        let actual = topology
            .pool(&server.address)
            .map(|p| u64::from(p.generation()));
        check("pool.generation", generation.as_u64(), actual)?;
    }
    Ok(())
}

fn check<T: PartialEq + std::fmt::Debug>(
    what: &str,
    expected: Option<T>,
    actual: Option<T>,
) -> Result<(), String> {
    if expected == actual {
        Ok(())
    } else {
        Err(format!("{what}: expected {expected:?}, got {actual:?}"))
    }
}

/// `{"$oid": "..."}` or null.
fn object_id(value: &Value) -> Result<Option<ObjectId>, String> {
    match value {
        Value::Null => Ok(None),
        _ => match json::to_bson(value)? {
            bson::Bson::ObjectId(id) => Ok(Some(id)),
            other => Err(format!("expected an ObjectId, got {other}")),
        },
    }
}

/// A `topologyVersion` document or null.
fn topology_version(value: &Value) -> Result<Option<TopologyVersion>, String> {
    match value {
        Value::Null => Ok(None),
        _ => match json::to_bson(value)? {
            bson::Bson::Document(d) => {
                let reply = bson::doc! { "topologyVersion": d };
                TopologyVersion::from_reply(&reply)
                    .map(Some)
                    .ok_or_else(|| format!("bad topologyVersion {value}"))
            }
            other => Err(format!("expected a topologyVersion, got {other}")),
        },
    }
}

/// Compares the events published since the previous phase with `outcome.events`, in order.
fn compare_events(topology: &mut Topology, expected: &Value) -> Result<(), String> {
    let expected = expected.as_array().ok_or("`events` is not an array")?;
    let actual: Vec<SdamEvent> = std::iter::from_fn(|| topology.poll_event()).collect();
    if actual.len() != expected.len() {
        return Err(format!(
            "expected {} events, got {}: {:?}",
            expected.len(),
            actual.len(),
            actual.iter().map(event_name).collect::<Vec<_>>()
        ));
    }
    for (i, (actual, expected)) in actual.iter().zip(expected).enumerate() {
        compare_event(actual, expected).map_err(|e| format!("event {}: {e}", i + 1))?;
    }
    Ok(())
}

fn event_name(event: &SdamEvent) -> &'static str {
    match event {
        SdamEvent::TopologyOpening => "topology_opening_event",
        SdamEvent::ServerOpening { .. } => "server_opening_event",
        SdamEvent::ServerDescriptionChanged { .. } => "server_description_changed_event",
        SdamEvent::ServerClosed { .. } => "server_closed_event",
        SdamEvent::TopologyDescriptionChanged { .. } => "topology_description_changed_event",
        SdamEvent::TopologyClosed => "topology_closed_event",
    }
}

fn compare_event(actual: &SdamEvent, expected: &Value) -> Result<(), String> {
    let (name, body) = expected
        .as_object()
        .and_then(|o| o.iter().next())
        .ok_or("an event that is not a one-key object")?;
    if event_name(actual) != name {
        return Err(format!("expected {name}, got {actual:?}"));
    }
    match actual {
        SdamEvent::TopologyOpening | SdamEvent::TopologyClosed => Ok(()),
        SdamEvent::ServerOpening { address } | SdamEvent::ServerClosed { address } => {
            check_address(address, body)
        }
        SdamEvent::ServerDescriptionChanged {
            address,
            previous,
            new,
        } => {
            check_address(address, body)?;
            compare_event_server(previous, field(body, "previousDescription")?)
                .map_err(|e| format!("previousDescription: {e}"))?;
            compare_event_server(new, field(body, "newDescription")?)
                .map_err(|e| format!("newDescription: {e}"))
        }
        SdamEvent::TopologyDescriptionChanged { previous, new } => {
            compare_event_topology(previous, field(body, "previousDescription")?)
                .map_err(|e| format!("previousDescription: {e}"))?;
            compare_event_topology(new, field(body, "newDescription")?)
                .map_err(|e| format!("newDescription: {e}"))
        }
    }
}

fn check_address(actual: &ServerAddress, body: &Value) -> Result<(), String> {
    let expected = json::address(field(body, "address")?)?;
    check("address", Some(&expected), Some(actual))
}

fn compare_event_topology(actual: &TopologyDescription, expected: &Value) -> Result<(), String> {
    let expected_type = json::topology_type(
        field(expected, "topologyType")?
            .as_str()
            .ok_or("bad topologyType")?,
    )?;
    check(
        "topologyType",
        Some(expected_type),
        Some(actual.topology_type),
    )?;
    let servers = field(expected, "servers")?
        .as_array()
        .ok_or("`servers` is not an array")?;
    if servers.len() != actual.servers.len() {
        return Err(format!("expected {} servers in {actual}", servers.len()));
    }
    for expected in servers {
        let address = json::server_address(expected)?;
        let server = actual
            .server(&address)
            .ok_or_else(|| format!("server {address} missing from {actual}"))?;
        compare_event_server(server, expected)?;
    }
    Ok(())
}

/// A server description in an event: address, type, member lists (as sets), `primary` and
/// `setName` when given.
fn compare_event_server(actual: &ServerDescription, expected: &Value) -> Result<(), String> {
    let address = json::server_address(expected)?;
    check("address", Some(&address), Some(&actual.address))?;
    let server_type = json::server_type(field(expected, "type")?.as_str().ok_or("bad type")?)?;
    check::<ServerType>("type", Some(server_type), Some(actual.server_type))?;
    for (key, list) in [
        ("hosts", &actual.hosts),
        ("passives", &actual.passives),
        ("arbiters", &actual.arbiters),
    ] {
        if let Some(expected) = expected.get(key) {
            let mut expected = expected
                .as_array()
                .ok_or_else(|| format!("`{key}` is not an array"))?
                .iter()
                .map(json::address)
                .collect::<Result<Vec<_>, _>>()?;
            let mut actual = list.clone();
            expected.sort();
            actual.sort();
            check(key, Some(expected), Some(actual))?;
        }
    }
    if let Some(primary) = expected.get("primary") {
        let primary = match primary {
            Value::Null => None,
            p => Some(json::address(p)?),
        };
        check("primary", primary, actual.primary.clone())?;
    }
    if let Some(name) = expected.get("setName") {
        check("setName", name.as_str(), actual.set_name.as_deref())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_options_pick_the_initial_type() {
        let s = settings("mongodb://a,B:1/?replicaSet=rs").expect("valid");
        assert_eq!(
            s.seeds,
            [ServerAddress::new("a", 27017), ServerAddress::new("b", 1)]
        );
        assert_eq!(s.replica_set.as_deref(), Some("rs"));
        let s = settings("mongodb://a/?directConnection=true").expect("valid");
        assert!(s.direct_connection);
        let s = settings("mongodb://a/?loadBalanced=true").expect("valid");
        assert!(s.load_balanced);
        assert!(settings("mongodb://a/?w=1").is_err());
    }
}
