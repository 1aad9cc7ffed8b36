//! The auth spec's connection-string cases (`source/auth/tests/legacy`, AU-14): each URI goes
//! through [`ConnectionString::parse`], whose validity and [`ConnectionString::credential`] are
//! compared with the case (`credential: null` means none; inside it a missing key is unchecked
//! and `null` means unset; `mechanism_properties` must hold every expected pair). Then
//! [`ClientOptions::from_connection_string`], which checks what the URI alone cannot (MONGODB-OIDC
//! needs an `ENVIRONMENT` or a callback): an invalid case passes when either rejects it for a
//! reason other than a missing feature; a valid case with a mechanism this client does not
//! implement (GSSAPI, PLAIN, MONGODB-X509, MONGODB-AWS, MONGODB-OIDC) is *skipped* with the
//! client's reason, never counted as passed.
//!
//! Two MONGODB-AWS cases that still expect a user name and password from the URI are skipped:
//! the current spec forbids both (tension T1 of the digest; the newer cases that expect an error
//! run and pass).

use std::path::Path;

use bson::Bson;
use retry_driver::{ClientOptions, ConnectionString};
use serde_json::Value;

use crate::corpus::run_cases;
use crate::uri::{parse_case, ParsedCase};
use crate::{CaseResult, Outcome};

/// T1: the stale MONGODB-AWS cases, by description.
const STALE_AWS_CASES: &[&str] = &[
    "should use username and password if specified (MONGODB-AWS)",
    "should use username, password and session token if specified (MONGODB-AWS)",
];

/// Runs every case of the file.
pub fn run_file(path: &Path) -> Result<Vec<CaseResult>, String> {
    run_cases(path, |description, case| {
        if STALE_AWS_CASES.contains(&description) {
            Outcome::Skipped(
                "T1: the current auth spec forbids MONGODB-AWS credentials in the URI".into(),
            )
        } else {
            run_case(case)
        }
    })
}

fn run_case(case: &Value) -> Outcome {
    let (uri, parsed) = match parse_case(case, ConnectionString::parse) {
        ParsedCase::Decided(outcome) => return outcome,
        ParsedCase::Accepted(uri, cs) => {
            return match ClientOptions::from_connection_string(&cs) {
                Err(e) if !e.reason().contains("not supported") => Outcome::Passed,
                Err(e) => Outcome::Skipped(e.reason().to_string()),
                Ok(_) => Outcome::Failed(format!("{uri}: accepted, expected an error ({cs:?})")),
            };
        }
        ParsedCase::Valid(uri, cs) => (uri, cs),
    };
    if let Err(message) = compare(case.get("credential"), &parsed) {
        return Outcome::Failed(format!("{uri}: {message}"));
    }
    match ClientOptions::from_connection_string(&parsed) {
        Err(e) => Outcome::Skipped(e.reason().to_string()),
        Ok(_) => Outcome::Passed,
    }
}

/// AU-14: compares the credential with the case's.
fn compare(expected: Option<&Value>, cs: &ConnectionString) -> Result<(), String> {
    let actual = cs.credential();
    let expected = match expected {
        None | Some(Value::Null) => {
            return match actual {
                None => Ok(()),
                Some(c) => Err(format!("a credential {c:?}, expected none")),
            }
        }
        Some(e) => e,
    };
    let Some(actual) = actual else {
        return Err("no credential".into());
    };
    let fields = [
        ("username", actual.username.as_deref()),
        ("password", actual.password.as_deref()),
        ("source", Some(actual.source.as_str())),
        ("mechanism", actual.mechanism.as_deref()),
    ];
    for (key, value) in fields {
        match expected.get(key) {
            None => {}
            Some(Value::Null) if value.is_none() => {}
            Some(e) if e.as_str().is_some() && e.as_str() == value => {}
            // Compared without printing the values: one of them may be a password.
            Some(_) => return Err(format!("credential {key} differs")),
        }
    }
    let properties = &actual.mechanism_properties;
    match expected.get("mechanism_properties") {
        None => {}
        Some(Value::Null) if properties.is_empty() => {}
        Some(Value::Object(map)) => {
            for (key, value) in map {
                let matches = match (properties.get(key), value) {
                    (Some(Bson::String(a)), Value::String(e)) => a == e,
                    (Some(Bson::Boolean(a)), Value::Bool(e)) => a == e,
                    _ => false,
                };
                if !matches {
                    return Err(format!(
                        "mechanism property {key} is {:?}, expected {value}",
                        properties.get(key)
                    ));
                }
            }
        }
        Some(e) => return Err(format!("mechanism_properties {properties}, expected {e}")),
    }
    Ok(())
}
