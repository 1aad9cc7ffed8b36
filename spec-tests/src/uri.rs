//! The connection-string and URI-options suites (URI-14): each case's URI goes through
//! [`ConnectionString::parse`], whose validity, warnings, hosts, auth and options are compared
//! with the case; then through [`ClientOptions::from_connection_string`]. A case whose parse
//! matches but that this client refuses (TLS, authentication, `mongodb+srv`, Unix sockets,
//! proxies) or warns about where the case expects no warning (compression) is *skipped* with the
//! client's reason, never counted as passed.

use std::path::Path;

use retry_driver::{ClientOptions, ConnectionString, HostKind, OptionValue};
use serde_json::Value;

use crate::corpus::read_json;
use crate::{CaseResult, Outcome};

/// Runs every case of one file.
pub fn run_file(path: &Path) -> Result<Vec<CaseResult>, String> {
    let json = read_json(path)?;
    let cases = json
        .get("tests")
        .and_then(Value::as_array)
        .ok_or("missing `tests` array")?;
    Ok(cases
        .iter()
        .map(|case| CaseResult {
            description: case
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string(),
            outcome: run_case(case),
        })
        .collect())
}

fn run_case(case: &Value) -> Outcome {
    let Some(uri) = case.get("uri").and_then(Value::as_str) else {
        return Outcome::Failed("missing `uri`".into());
    };
    let valid = case.get("valid").and_then(Value::as_bool).unwrap_or(true);
    let parsed = match (ConnectionString::parse(uri), valid) {
        (Err(_), false) => return Outcome::Passed,
        (Err(e), true) => return Outcome::Failed(format!("{uri}: rejected: {e}")),
        (Ok(cs), false) => {
            return Outcome::Failed(format!("{uri}: accepted, expected an error ({cs:?})"))
        }
        (Ok(cs), true) => cs,
    };
    if let Err(message) = compare(case, &parsed) {
        return Outcome::Failed(format!("{uri}: {message}"));
    }
    match ClientOptions::from_connection_string(&parsed) {
        Err(e) => Outcome::Skipped(e.reason().to_string()),
        Ok(options) => {
            let expects_warning = case.get("warning").and_then(Value::as_bool);
            match options.warnings.get(parsed.warnings().len()) {
                Some(extra) if expects_warning == Some(false) => Outcome::Skipped(extra.clone()),
                _ => Outcome::Passed,
            }
        }
    }
}

/// Compares warnings, hosts, auth and options; `null` or absent means "not asserted".
fn compare(case: &Value, cs: &ConnectionString) -> Result<(), String> {
    if let Some(expected) = case.get("warning").and_then(Value::as_bool) {
        let warned = !cs.warnings().is_empty();
        if warned != expected {
            return Err(format!(
                "warning expected {expected}, warnings {:?}",
                cs.warnings()
            ));
        }
    }
    if let Some(hosts) = case.get("hosts").and_then(Value::as_array) {
        if hosts.len() != cs.hosts.len() {
            return Err(format!("hosts {:?}, expected {hosts:?}", cs.hosts));
        }
        for (expected, host) in hosts.iter().zip(&cs.hosts) {
            let kind = match host.kind {
                HostKind::Ipv4 => "ipv4",
                HostKind::IpLiteral => "ip_literal",
                HostKind::Hostname => "hostname",
                HostKind::Unix => "unix",
            };
            let checks = [
                ("type", Value::from(kind)),
                ("host", Value::from(host.host.as_str())),
                ("port", host.port.map_or(Value::Null, Value::from)),
            ];
            for (key, actual) in checks {
                match expected.get(key) {
                    None | Some(Value::Null) => {}
                    Some(e) if *e == actual => {}
                    Some(e) => return Err(format!("host {key} {actual}, expected {e}")),
                }
            }
        }
    }
    if let Some(auth) = case.get("auth").filter(|a| !a.is_null()) {
        let checks = [
            ("username", &cs.username),
            ("password", &cs.password),
            ("db", &cs.database),
        ];
        for (key, actual) in checks {
            match auth.get(key) {
                None | Some(Value::Null) => {}
                Some(e) if e.as_str() == actual.as_deref() => {}
                Some(e) => return Err(format!("auth {key} {actual:?}, expected {e}")),
            }
        }
    }
    if let Some(options) = case.get("options").and_then(Value::as_object) {
        for (key, expected) in options {
            match cs.option(key) {
                Some(actual) if option_matches(actual, expected) => {}
                actual => return Err(format!("option {key} is {actual:?}, expected {expected}")),
            }
        }
    }
    Ok(())
}

fn pairs_match(pairs: &[(String, String)], expected: &Value) -> bool {
    expected.as_object().is_some_and(|object| {
        object.len() == pairs.len()
            && pairs
                .iter()
                .all(|(k, v)| object.get(k).and_then(Value::as_str) == Some(v))
    })
}

fn option_matches(actual: &OptionValue, expected: &Value) -> bool {
    match actual {
        OptionValue::Bool(b) => expected.as_bool() == Some(*b),
        OptionValue::Int(v) => expected.as_i64() == Some(*v),
        OptionValue::Str(s) => expected.as_str() == Some(s),
        OptionValue::List(items) => expected.as_array().is_some_and(|e| {
            e.len() == items.len() && e.iter().zip(items).all(|(e, a)| e.as_str() == Some(a))
        }),
        OptionValue::Map(pairs) => pairs_match(pairs, expected),
        OptionValue::TagSets(sets) => expected.as_array().is_some_and(|e| {
            e.len() == sets.len() && e.iter().zip(sets).all(|(e, set)| pairs_match(set, e))
        }),
    }
}
