//! The connection-string and URI-options suites (URI-14): each case's URI goes through
//! [`ConnectionString::parse`], whose validity, warnings, hosts, auth and options are compared
//! with the case; then through [`ClientOptions::from_connection_string`]. A case whose parse
//! matches but that this client refuses (some authentication mechanisms, Unix sockets,
//! proxies) or warns about where the case expects no warning (compression) is *skipped* with the
//! client's reason, never counted as passed.
//!
//! The read-write-concern connection-string cases ([`run_concern_file`]) check the client's
//! `readConcernLevel` and write concern instead of the option map.

use std::path::Path;

use bson::Bson;
use retry_driver::{
    apply_seedlist, ClientOptions, ConnectionString, HostKind, OptionValue, SrvRecord,
};
use serde_json::Value;

use crate::corpus::run_cases;
use crate::{CaseResult, Outcome};

/// Runs every case of one connection-string or uri-options file.
pub fn run_file(path: &Path) -> Result<Vec<CaseResult>, String> {
    run_cases(path, |_, case| run_case(case))
}

/// Runs every case of one read-write-concern connection-string file.
pub fn run_concern_file(path: &Path) -> Result<Vec<CaseResult>, String> {
    run_cases(path, |_, case| run_concern_case(case))
}

/// A case's `uri` through a parser, judged against the case's `valid` flag (true when absent).
pub(crate) enum ParsedCase<'a, T> {
    /// The parse decides the case: it rejected the URI (passed if the case expects an error,
    /// failed if not), or the case has no `uri` (failed).
    Decided(Outcome),
    /// Accepted, as the case expects.
    Valid(&'a str, T),
    /// Accepted, though the case expects an error.
    Accepted(&'a str, T),
}

/// Parses the case's `uri` with `parse` and judges the result against its `valid` flag.
pub(crate) fn parse_case<'a, T, E: std::fmt::Display>(
    case: &'a Value,
    parse: impl Fn(&str) -> Result<T, E>,
) -> ParsedCase<'a, T> {
    let Some(uri) = case.get("uri").and_then(Value::as_str) else {
        return ParsedCase::Decided(Outcome::Failed("missing `uri`".into()));
    };
    let valid = case.get("valid").and_then(Value::as_bool).unwrap_or(true);
    match (parse(uri), valid) {
        (Err(_), false) => ParsedCase::Decided(Outcome::Passed),
        (Err(e), true) => ParsedCase::Decided(Outcome::Failed(format!("{uri}: rejected: {e}"))),
        (Ok(parsed), false) => ParsedCase::Accepted(uri, parsed),
        (Ok(parsed), true) => ParsedCase::Valid(uri, parsed),
    }
}

fn run_case(case: &Value) -> Outcome {
    let (uri, parsed) = match parse_case(case, ConnectionString::parse) {
        ParsedCase::Decided(outcome) => return outcome,
        ParsedCase::Accepted(uri, cs) => {
            return Outcome::Failed(format!("{uri}: accepted, expected an error ({cs:?})"))
        }
        ParsedCase::Valid(uri, cs) => (uri, cs),
    };
    if let Err(message) = compare(case, &parsed) {
        return Outcome::Failed(format!("{uri}: {message}"));
    }
    let parsed = if parsed.srv {
        // SRV-6 (URI-15: srv-options uses real SRV names): a stub DNS answer, one record in the
        // host's domain and no TXT record, stands in for the lookup; the case asserts options
        // and validity, not the seed list.
        let record = SrvRecord {
            target: format!("stub.{}", parsed.hosts[0].host),
            port: 27017,
            ttl: None,
        };
        match apply_seedlist(&parsed, vec![record], &[], 0) {
            Ok(resolved) => resolved,
            Err(e) => return Outcome::Failed(format!("{uri}: after the stub lookup: {e}")),
        }
    } else {
        parsed
    };
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

/// The reason the one contradictory read-write-concern case is skipped (T3).
const T3: &str = "T3: uri-options expects a negative wTimeoutMS to be ignored with a warning, \
read-write-concern expects an error; the parser follows uri-options";

fn run_concern_case(case: &Value) -> Outcome {
    let (uri, options) = match parse_case(case, ClientOptions::parse) {
        ParsedCase::Decided(outcome) => return outcome,
        ParsedCase::Accepted(uri, o) if uri.contains("wtimeoutMS=-") && !o.warnings.is_empty() => {
            return Outcome::Skipped(T3.into())
        }
        ParsedCase::Accepted(uri, _) => {
            return Outcome::Failed(format!("{uri}: accepted, expected an error"))
        }
        ParsedCase::Valid(uri, o) => (uri, o),
    };
    if let Some(expected) = case.get("readConcern") {
        let level = expected.get("level").and_then(Value::as_str);
        if level != options.read_concern_level.as_deref() {
            return Outcome::Failed(format!(
                "{uri}: readConcernLevel {:?}, expected {expected}",
                options.read_concern_level
            ));
        }
    }
    if let Some(expected) = case.get("writeConcern").and_then(Value::as_object) {
        let actual = options.write_concern.clone().unwrap_or_default();
        let ours = |key: &str| match key {
            "w" => actual.get("w"),
            "wtimeoutMS" => actual.get("wtimeout"),
            "journal" => actual.get("j"),
            _ => None,
        };
        let same = |value: &Value, bson: Option<&Bson>| match (value, bson) {
            (Value::String(s), Some(Bson::String(b))) => s == b,
            (Value::Bool(v), Some(Bson::Boolean(b))) => v == b,
            (Value::Number(n), Some(Bson::Int32(b))) => n.as_i64() == Some(i64::from(*b)),
            (Value::Number(n), Some(Bson::Int64(b))) => n.as_i64() == Some(*b),
            _ => false,
        };
        if expected.len() != actual.len() || !expected.iter().all(|(k, v)| same(v, ours(k))) {
            return Outcome::Failed(format!(
                "{uri}: write concern {actual}, expected {}",
                Value::Object(expected.clone())
            ));
        }
    }
    if !options.warnings.is_empty() && case.get("warning").and_then(Value::as_bool) == Some(false) {
        return Outcome::Failed(format!("{uri}: unexpected warnings {:?}", options.warnings));
    }
    Outcome::Passed
}
