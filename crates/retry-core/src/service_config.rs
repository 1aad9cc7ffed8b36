//! The gRPC-style service config (A6), validated into retry and hedging policies per MongoDB
//! command.
//!
//! The core reads the config from a [`bson::Document`] (it has no JSON parser; `retry-lab` turns
//! JSON text into a document first, field for field). The shape follows A6:
//!
//! ```json
//! { "methodConfig": [
//!     { "name": [{ "service": "mongodb", "method": "find" }],
//!       "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.01s",
//!                          "nonFatalStatusCodes": ["IngressRequestRateLimitExceeded"] } },
//!     { "name": [{ "service": "mongodb" }],
//!       "retryPolicy": { "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
//!                        "backoffMultiplier": 2, "retryableStatusCodes": [91, "HostUnreachable"] } } ],
//!   "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 } }
//! ```
//!
//! Rules, with the A6 requirement they follow:
//!
//! - A6-SC1: a method config has a `retryPolicy` or a `hedgingPolicy`, never both; neither means no
//!   retries or hedges for its methods.
//! - A6-SC2: `name` is a non-empty list of `{service, method}`. gRPC methods map onto MongoDB
//!   commands: `service` must be `"mongodb"`, `method` is a command name (`find`, `insert`, ...).
//!   Without `method` the entry covers every command; an empty object covers every command of
//!   every service. The most specific entry wins; a name listed twice is an error.
//! - A6-SC3: `maxAttempts` is an integer of at least 2; values above 5 are treated as 5.
//! - A6-SC4: `initialBackoff`, `maxBackoff` are proto3 JSON durations (`"0.1s"`) above zero;
//!   `backoffMultiplier` is a number above zero; `retryableStatusCodes` is a non-empty list.
//! - A6-SC5: `hedgingDelay` is an optional duration (zero or absent sends every copy at once);
//!   `nonFatalStatusCodes` is optional.
//! - A6-SC6: status codes are MongoDB error codes, as integers or as code names, case-insensitive.
//! - A6-SC7: `retryThrottling.maxTokens` is in (0, 1000] and `tokenRatio` above 0; both keep three
//!   decimals. One throttle serves every policy of the config.
//! - Only read commands may have a `hedgingPolicy` ([`crate::hedging::hedgeable`]); a hedging
//!   policy that covers every command applies to the reads among them, and writes run under the
//!   client's default retry rules.
//!
//! Every error names the field by its path (`methodConfig[1].retryPolicy.maxBackoff`) and the rule.

use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;

use bson::{Bson, Document};

use crate::budget::GrpcThrottle;
use crate::classify::READ_COMMANDS;
use crate::hedging::HedgingPolicy;
use crate::policy::{GrpcPolicy, OptionError};

/// A service-config field that breaks a rule: its path, the rule, and the value given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    field: String,
    rule: String,
    value: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, rule: impl Into<String>, value: impl fmt::Display) -> Self {
        ConfigError {
            field: field.into(),
            rule: rule.into(),
            value: value.to_string(),
        }
    }

    fn from_option(prefix: &str, e: OptionError) -> ConfigError {
        ConfigError::new(
            alloc::format!("{prefix}.{}", e.option()),
            e.rule(),
            e.value(),
        )
    }

    /// The field's path, e.g. `methodConfig[0].hedgingPolicy.maxAttempts`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The rule the field breaks.
    pub fn rule(&self) -> &str {
        &self.rule
    }

    /// The value given.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid service config field {}: {}, got {}",
            self.field, self.rule, self.value
        )
    }
}

impl core::error::Error for ConfigError {}

/// The policy of a set of commands.
#[derive(Clone, Debug)]
pub enum MethodPolicy {
    /// A6 retries.
    Retry(GrpcPolicy),
    /// A6 hedging (reads only).
    Hedging(HedgingPolicy),
    /// Named, but with neither policy: no retries or hedges.
    NoRetries,
}

/// Which commands a method config covers.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Scope {
    Command(String),
    EveryCommand,
    Everything,
}

/// A validated service config.
#[derive(Clone, Debug, Default)]
pub struct ServiceConfig {
    entries: Vec<(Scope, usize)>,
    policies: Vec<MethodPolicy>,
    throttle: Option<Arc<GrpcThrottle>>,
}

/// The other MongoDB commands a method config may name.
pub const OTHER_COMMANDS: [&str; 12] = [
    "insert",
    "update",
    "delete",
    "findAndModify",
    "getMore",
    "killCursors",
    "bulkWrite",
    "createIndexes",
    "dropIndexes",
    "commitTransaction",
    "abortTransaction",
    "ping",
];

/// MongoDB error code names accepted in status-code lists (A6-SC6), with their codes.
pub const CODE_NAMES: [(&str, i32); 15] = [
    ("HostUnreachable", 6),
    ("HostNotFound", 7),
    ("NetworkTimeout", 89),
    ("ShutdownInProgress", 91),
    ("ReadConcernMajorityNotAvailableYet", 134),
    ("PrimarySteppedDown", 189),
    ("ExceededTimeLimit", 262),
    ("IngressRequestRateLimitExceeded", 462),
    ("SocketException", 9001),
    ("NotWritablePrimary", 10107),
    ("InterruptedAtShutdown", 11600),
    ("InterruptedDueToReplStateChange", 11602),
    ("NotPrimaryNoSecondaryOk", 13435),
    ("NotPrimaryOrSecondary", 13436),
    ("WriteConflict", 112),
];

impl ServiceConfig {
    /// Validates a service config (see the [module docs](self) for the rules).
    pub fn from_document(config: &Document) -> Result<ServiceConfig, ConfigError> {
        let throttle = match config.get("retryThrottling") {
            None => None,
            Some(Bson::Document(t)) => Some(Arc::new(parse_throttle(t)?)),
            Some(other) => {
                return Err(ConfigError::new(
                    "retryThrottling",
                    "must be an object",
                    other,
                ))
            }
        };
        let mut parsed = ServiceConfig {
            entries: Vec::new(),
            policies: Vec::new(),
            throttle,
        };
        let methods = match config.get("methodConfig") {
            None => return Ok(parsed),
            Some(Bson::Array(methods)) => methods,
            Some(other) => return Err(ConfigError::new("methodConfig", "must be a list", other)),
        };
        for (i, method) in methods.iter().enumerate() {
            let path = alloc::format!("methodConfig[{i}]");
            let Bson::Document(method) = method else {
                return Err(ConfigError::new(path, "must be an object", method));
            };
            let policy = parsed.parse_policy(&path, method)?;
            let scopes = parse_names(&path, method)?;
            for (j, scope) in scopes.into_iter().enumerate() {
                if matches!(policy, MethodPolicy::Hedging(_)) {
                    if let Scope::Command(c) = &scope {
                        if !READ_COMMANDS.contains(&c.as_str()) {
                            return Err(ConfigError::new(
                                alloc::format!("{path}.hedgingPolicy"),
                                alloc::format!(
                                    "only read commands may be hedged ({} is not one)",
                                    READ_COMMANDS.join(", ")
                                ),
                                c,
                            ));
                        }
                    }
                }
                if parsed.entries.iter().any(|(s, _)| *s == scope) {
                    return Err(ConfigError::new(
                        alloc::format!("{path}.name[{j}]"),
                        "each name may appear in one method config only",
                        describe(&scope),
                    ));
                }
                parsed.entries.push((scope, parsed.policies.len()));
            }
            parsed.policies.push(policy);
        }
        Ok(parsed)
    }

    /// The policy for `command`: its own entry, else the entry for every command (a hedging policy
    /// there only for reads), else none. `None` means the client's default retry rules.
    pub fn policy_for(&self, command: &str) -> Option<&MethodPolicy> {
        let find = |wanted: &Scope| {
            self.entries
                .iter()
                .find(|(s, _)| s == wanted)
                .map(|(_, i)| &self.policies[*i])
        };
        // Looked up without building a `Scope`, which would allocate the name per operation.
        let own = self.entries.iter().find_map(|(s, i)| match s {
            Scope::Command(c) if c == command => Some(&self.policies[*i]),
            _ => None,
        });
        if own.is_some() {
            return own;
        }
        let read = READ_COMMANDS.contains(&command);
        [Scope::EveryCommand, Scope::Everything]
            .iter()
            .filter_map(find)
            .find(|p| read || !matches!(p, MethodPolicy::Hedging(_)))
    }

    /// The throttle of `retryThrottling`, shared by every policy of the config.
    pub fn throttle(&self) -> Option<&Arc<GrpcThrottle>> {
        self.throttle.as_ref()
    }

    fn parse_policy(&self, path: &str, method: &Document) -> Result<MethodPolicy, ConfigError> {
        match (method.get("retryPolicy"), method.get("hedgingPolicy")) {
            (Some(_), Some(_)) => Err(ConfigError::new(
                path,
                "must not have both retryPolicy and hedgingPolicy",
                "both",
            )),
            (Some(retry), None) => {
                let path = alloc::format!("{path}.retryPolicy");
                let retry = object(&path, retry)?;
                let mut policy = parse_retry(&path, retry)?;
                if let Some(t) = &self.throttle {
                    policy = policy.with_throttle(t.clone());
                }
                Ok(MethodPolicy::Retry(policy))
            }
            (None, Some(hedging)) => {
                let path = alloc::format!("{path}.hedgingPolicy");
                let hedging = object(&path, hedging)?;
                let mut policy = parse_hedging(&path, hedging)?;
                if let Some(t) = &self.throttle {
                    policy = policy.with_throttle(t.clone());
                }
                Ok(MethodPolicy::Hedging(policy))
            }
            (None, None) => Ok(MethodPolicy::NoRetries),
        }
    }
}

fn describe(scope: &Scope) -> String {
    match scope {
        Scope::Command(c) => alloc::format!("{{service: mongodb, method: {c}}}"),
        Scope::EveryCommand => "{service: mongodb}".into(),
        Scope::Everything => "{}".into(),
    }
}

fn object<'a>(path: &str, value: &'a Bson) -> Result<&'a Document, ConfigError> {
    match value {
        Bson::Document(d) => Ok(d),
        other => Err(ConfigError::new(path, "must be an object", other)),
    }
}

/// A6-SC2.
fn parse_names(path: &str, method: &Document) -> Result<Vec<Scope>, ConfigError> {
    let field = alloc::format!("{path}.name");
    let names = match method.get("name") {
        Some(Bson::Array(names)) if !names.is_empty() => names,
        Some(other) => {
            return Err(ConfigError::new(
                field,
                "must be a non-empty list of {service, method}",
                other,
            ))
        }
        None => return Err(ConfigError::new(field, "is required", "nothing")),
    };
    let mut scopes = Vec::with_capacity(names.len());
    for (j, name) in names.iter().enumerate() {
        let field = alloc::format!("{path}.name[{j}]");
        let name = object(&field, name)?;
        let service = match name.get("service") {
            None => None,
            Some(Bson::String(s)) if s.is_empty() => None,
            Some(Bson::String(s)) if s == "mongodb" => Some(s),
            Some(other) => {
                return Err(ConfigError::new(
                    alloc::format!("{field}.service"),
                    "must be \"mongodb\" (methods are MongoDB commands)",
                    other,
                ))
            }
        };
        let method = match name.get("method") {
            None => None,
            Some(Bson::String(m)) if m.is_empty() => None,
            Some(Bson::String(m))
                if READ_COMMANDS.contains(&m.as_str()) || OTHER_COMMANDS.contains(&m.as_str()) =>
            {
                Some(m)
            }
            Some(other) => {
                return Err(ConfigError::new(
                    alloc::format!("{field}.method"),
                    "must be a MongoDB command name (find, aggregate, insert, ...)",
                    other,
                ))
            }
        };
        scopes.push(match (service, method) {
            (None, None) => Scope::Everything,
            (Some(_), None) => Scope::EveryCommand,
            (Some(_), Some(m)) => Scope::Command(m.clone()),
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    alloc::format!("{field}.service"),
                    "is required when method is given",
                    "nothing",
                ))
            }
        });
    }
    Ok(scopes)
}

/// A6-SC3, A6-SC4.
fn parse_retry(path: &str, retry: &Document) -> Result<GrpcPolicy, ConfigError> {
    let max_attempts = max_attempts(path, retry)?;
    let initial =
        duration(path, retry, "initialBackoff")?.ok_or_else(|| required(path, "initialBackoff"))?;
    let max = duration(path, retry, "maxBackoff")?.ok_or_else(|| required(path, "maxBackoff"))?;
    let multiplier = match retry.get("backoffMultiplier") {
        Some(Bson::Int32(n)) => f64::from(*n),
        Some(Bson::Int64(n)) => *n as f64,
        Some(Bson::Double(n)) => *n,
        Some(other) => {
            return Err(ConfigError::new(
                alloc::format!("{path}.backoffMultiplier"),
                "must be a number greater than 0",
                other,
            ))
        }
        None => return Err(required(path, "backoffMultiplier")),
    };
    let codes = codes(path, retry, "retryableStatusCodes")?
        .ok_or_else(|| required(path, "retryableStatusCodes"))?;
    GrpcPolicy::new(max_attempts, initial, max, multiplier, &codes)
        .map_err(|e| ConfigError::from_option(path, e))
}

/// A6-SC3, A6-SC5.
fn parse_hedging(path: &str, hedging: &Document) -> Result<HedgingPolicy, ConfigError> {
    let max_attempts = max_attempts(path, hedging)?;
    let delay = duration(path, hedging, "hedgingDelay")?.unwrap_or(Duration::ZERO);
    let codes = codes(path, hedging, "nonFatalStatusCodes")?.unwrap_or_default();
    HedgingPolicy::new(max_attempts, delay, &codes).map_err(|e| ConfigError::from_option(path, e))
}

/// A6-SC7.
fn parse_throttle(throttle: &Document) -> Result<GrpcThrottle, ConfigError> {
    let number = |name: &'static str| match throttle.get(name) {
        Some(Bson::Int32(n)) => Ok(f64::from(*n)),
        Some(Bson::Int64(n)) => Ok(*n as f64),
        Some(Bson::Double(n)) => Ok(*n),
        Some(other) => Err(ConfigError::new(
            alloc::format!("retryThrottling.{name}"),
            "must be a number",
            other,
        )),
        None => Err(required("retryThrottling", name)),
    };
    GrpcThrottle::new(number("maxTokens")?, number("tokenRatio")?)
        .map_err(|e| ConfigError::from_option("retryThrottling", e))
}

fn required(path: &str, name: &str) -> ConfigError {
    ConfigError::new(alloc::format!("{path}.{name}"), "is required", "nothing")
}

fn max_attempts(path: &str, policy: &Document) -> Result<i64, ConfigError> {
    match policy.get("maxAttempts") {
        Some(Bson::Int32(n)) => Ok(i64::from(*n)),
        Some(Bson::Int64(n)) => Ok(*n),
        Some(Bson::Double(n)) if n.fract() == 0.0 && n.abs() < 9.0e15 => Ok(*n as i64),
        Some(other) => Err(ConfigError::new(
            alloc::format!("{path}.maxAttempts"),
            "must be an integer of at least 2",
            other,
        )),
        None => Err(required(path, "maxAttempts")),
    }
}

/// A proto3 JSON duration: `-?digits(.digits{1,9})?s`; negative values are refused here.
fn duration(path: &str, policy: &Document, name: &str) -> Result<Option<Duration>, ConfigError> {
    let field = || alloc::format!("{path}.{name}");
    let text = match policy.get(name) {
        None => return Ok(None),
        Some(Bson::String(s)) => s,
        Some(other) => {
            return Err(ConfigError::new(
                field(),
                "must be a duration string such as \"0.1s\"",
                other,
            ))
        }
    };
    parse_duration(text).map(Some).ok_or_else(|| {
        ConfigError::new(
            field(),
            "must be a non-negative duration string such as \"0.1s\" (at most 9 decimals)",
            alloc::format!("{text:?}"),
        )
    })
}

/// Parses `"1.5s"` into a duration; `None` for anything else (negative values included).
fn parse_duration(text: &str) -> Option<Duration> {
    let number = text.strip_suffix('s')?;
    let (secs, frac) = number.split_once('.').unwrap_or((number, ""));
    if secs.is_empty() || !secs.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) || number.ends_with('.') {
        return None;
    }
    let secs: u64 = secs.parse().ok()?;
    let mut nanos: u32 = 0;
    for (i, b) in frac.bytes().enumerate() {
        nanos += u32::from(b - b'0') * 10u32.pow(8 - i as u32);
    }
    Some(Duration::new(secs, nanos))
}

/// A6-SC6.
fn codes(path: &str, policy: &Document, name: &str) -> Result<Option<Vec<i32>>, ConfigError> {
    let list = match policy.get(name) {
        None => return Ok(None),
        Some(Bson::Array(list)) => list,
        Some(other) => {
            return Err(ConfigError::new(
                alloc::format!("{path}.{name}"),
                "must be a list of error codes or code names",
                other,
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(k, code)| match code {
            Bson::Int32(c) => Ok(*c),
            Bson::Int64(c) if i32::try_from(*c).is_ok() => Ok(*c as i32),
            Bson::String(s) => CODE_NAMES
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(s))
                .map(|(_, c)| *c)
                .ok_or_else(|| {
                    ConfigError::new(
                        alloc::format!("{path}.{name}[{k}]"),
                        "must be a MongoDB error code or a known code name",
                        s,
                    )
                }),
            other => Err(ConfigError::new(
                alloc::format!("{path}.{name}[{k}]"),
                "must be a MongoDB error code or a known code name",
                other,
            )),
        })
        .collect::<Result<Vec<i32>, _>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn retry_policy() -> Document {
        doc! { "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
        "backoffMultiplier": 2, "retryableStatusCodes": [91, "hostunreachable"] }
    }

    fn config() -> Document {
        doc! {
            "methodConfig": [
                { "name": [{ "service": "mongodb", "method": "find" },
                           { "service": "mongodb", "method": "aggregate" }],
                  "hedgingPolicy": { "maxAttempts": 7, "hedgingDelay": "0.010s",
                                     "nonFatalStatusCodes": ["IngressRequestRateLimitExceeded"] } },
                { "name": [{ "service": "mongodb" }], "retryPolicy": retry_policy() },
                { "name": [{ "service": "mongodb", "method": "insert" }] },
            ],
            "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.5466 },
        }
    }

    fn error(config: Document) -> ConfigError {
        ServiceConfig::from_document(&config).unwrap_err()
    }

    #[test]
    fn a6_sc2_commands_map_to_the_most_specific_entry() {
        let c = ServiceConfig::from_document(&config()).unwrap();
        let Some(MethodPolicy::Hedging(h)) = c.policy_for("find") else {
            panic!("find is hedged");
        };
        assert_eq!(h.max_attempts(), 5, "A6-SC3: 7 is treated as 5");
        assert_eq!(h.delay(), Duration::from_millis(10));
        assert_eq!(h.non_fatal_codes(), [462]);
        assert!(h.throttle().is_some());
        let Some(MethodPolicy::Retry(r)) = c.policy_for("update") else {
            panic!("update falls back to the service-wide retry policy");
        };
        assert_eq!(r.max_attempts(), 4);
        assert!(matches!(
            c.policy_for("insert"),
            Some(MethodPolicy::NoRetries)
        ));
        // A6-SC7: three decimals kept; one throttle for every policy.
        let t = c.throttle().unwrap();
        assert_eq!(t.max_millis(), 10_000);
        assert!(Arc::ptr_eq(t, r.throttle().unwrap()));
        assert!(Arc::ptr_eq(t, h.throttle().unwrap()));
        assert!(ServiceConfig::from_document(&doc! {})
            .unwrap()
            .policy_for("find")
            .is_none());
    }

    #[test]
    fn a6_sc1_retry_and_hedging_policies_are_exclusive() {
        let e = error(
            doc! { "methodConfig": [{ "name": [{}], "retryPolicy": retry_policy(),
            "hedgingPolicy": { "maxAttempts": 2 } }] },
        );
        assert_eq!(e.field(), "methodConfig[0]");
        assert!(e.rule().contains("both"), "{e}");
    }

    #[test]
    fn a6_sc3_max_attempts_must_be_at_least_2() {
        let e = error(doc! { "methodConfig": [{ "name": [{}],
        "hedgingPolicy": { "maxAttempts": 1 } }] });
        assert_eq!(e.field(), "methodConfig[0].hedgingPolicy.maxAttempts");
        assert_eq!(
            e.to_string(),
            "invalid service config field methodConfig[0].hedgingPolicy.maxAttempts: must be an \
             integer of at least 2, got 1"
        );
        let e = error(doc! { "methodConfig": [{ "name": [{}],
        "retryPolicy": { "maxAttempts": "three" } }] });
        assert_eq!(e.field(), "methodConfig[0].retryPolicy.maxAttempts");
    }

    #[test]
    fn a6_sc4_retry_policy_fields_are_required_and_positive() {
        for (field, value, rule) in [
            (
                "initialBackoff",
                Bson::String("0s".into()),
                "greater than 0",
            ),
            ("maxBackoff", Bson::String("-1s".into()), "duration"),
            ("maxBackoff", Bson::String("1".into()), "duration"),
            ("backoffMultiplier", Bson::Int32(0), "greater than 0"),
            ("retryableStatusCodes", Bson::Array(Vec::new()), "empty"),
            (
                "retryableStatusCodes",
                Bson::Array(vec!["UNAVAILABLE".into()]),
                "code name",
            ),
        ] {
            let mut p = retry_policy();
            p.insert(field, value);
            let e = error(doc! { "methodConfig": [{ "name": [{}], "retryPolicy": p }] });
            assert!(
                e.field()
                    .starts_with(&format!("methodConfig[0].retryPolicy.{field}")),
                "{e}"
            );
            assert!(e.rule().contains(rule), "{e}");
        }
        let mut p = retry_policy();
        p.remove("maxBackoff");
        let e = error(doc! { "methodConfig": [{ "name": [{}], "retryPolicy": p }] });
        assert_eq!(e.field(), "methodConfig[0].retryPolicy.maxBackoff");
        assert_eq!(e.rule(), "is required");
    }

    #[test]
    fn a6_sc5_hedging_delay_is_optional() {
        let c = ServiceConfig::from_document(&doc! { "methodConfig": [{
        "name": [{ "service": "mongodb", "method": "find" }],
        "hedgingPolicy": { "maxAttempts": 3 } }] })
        .unwrap();
        let Some(MethodPolicy::Hedging(h)) = c.policy_for("find") else {
            panic!()
        };
        assert_eq!(h.delay(), Duration::ZERO);
        assert!(h.non_fatal_codes().is_empty());
    }

    #[test]
    fn only_reads_are_hedged_and_names_are_mongodb_commands() {
        let e = error(doc! { "methodConfig": [{
        "name": [{ "service": "mongodb", "method": "insert" }],
        "hedgingPolicy": { "maxAttempts": 3 } }] });
        assert_eq!(e.field(), "methodConfig[0].hedgingPolicy");
        // A service-wide hedging policy applies to reads only.
        let c = ServiceConfig::from_document(&doc! { "methodConfig": [{
        "name": [{ "service": "mongodb" }], "hedgingPolicy": { "maxAttempts": 3 } }] })
        .unwrap();
        assert!(matches!(
            c.policy_for("find"),
            Some(MethodPolicy::Hedging(_))
        ));
        assert!(c.policy_for("insert").is_none());
        let e = error(doc! { "methodConfig": [{ "name": [{ "service": "grpc.Foo" }] }] });
        assert_eq!(e.field(), "methodConfig[0].name[0].service");
        let e = error(
            doc! { "methodConfig": [{ "name": [{ "service": "mongodb", "method": "Find" }] }] },
        );
        assert_eq!(e.field(), "methodConfig[0].name[0].method");
        let e = error(doc! { "methodConfig": [{ "name": [] }] });
        assert_eq!(e.field(), "methodConfig[0].name");
        let e = error(doc! { "methodConfig": [
        { "name": [{ "service": "mongodb", "method": "find" }] },
        { "name": [{}, { "service": "mongodb", "method": "find" }] }] });
        assert_eq!(e.field(), "methodConfig[1].name[1]");
    }

    #[test]
    fn a6_sc7_throttling_is_validated_by_field() {
        for (t, field) in [
            (
                doc! { "maxTokens": 0, "tokenRatio": 0.1 },
                "retryThrottling.maxTokens",
            ),
            (
                doc! { "maxTokens": 1001, "tokenRatio": 0.1 },
                "retryThrottling.maxTokens",
            ),
            (
                doc! { "maxTokens": 10, "tokenRatio": 0 },
                "retryThrottling.tokenRatio",
            ),
            (doc! { "maxTokens": 10 }, "retryThrottling.tokenRatio"),
            (
                doc! { "maxTokens": "10", "tokenRatio": 1 },
                "retryThrottling.maxTokens",
            ),
        ] {
            assert_eq!(error(doc! { "retryThrottling": t }).field(), field);
        }
    }

    #[test]
    fn proto3_durations() {
        assert_eq!(parse_duration("0.1s"), Some(Duration::from_millis(100)));
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_duration("0.000000001s"),
            Some(Duration::from_nanos(1))
        );
        for bad in [
            "",
            "s",
            "1",
            "1.s",
            ".5s",
            "-1s",
            "1.0000000001s",
            "1ms",
            "1.5e3s",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }
}
