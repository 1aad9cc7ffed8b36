//! gRPC-style service configs (A6) in JSON, turned into retry-core's validated
//! [`ServiceConfig`].
//!
//! retry-core has no JSON parser (its dependencies are bson, rand_core and smallvec), so it
//! validates the config from a BSON document; this module parses the JSON text and hands the
//! document over value for value: integers that fit 32 bits become `Int32`, other integers
//! `Int64`, every other number `Double`. All validation, and every error that names a field, is
//! the core's.

use std::fmt;

use bson::{Bson, Document};
use retry_core::service_config::{ConfigError, ServiceConfig};

/// Why a JSON service config was refused.
#[derive(Debug)]
pub enum ServiceConfigError {
    /// The text is not a JSON object.
    Json(String),
    /// A field breaks an A6 rule.
    Invalid(ConfigError),
}

impl fmt::Display for ServiceConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceConfigError::Json(e) => write!(f, "service config is not a JSON object: {e}"),
            ServiceConfigError::Invalid(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ServiceConfigError {}

/// Parses and validates a JSON service config.
pub fn parse_json(text: &str) -> Result<ServiceConfig, ServiceConfigError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| ServiceConfigError::Json(e.to_string()))?;
    let Bson::Document(document) = to_bson(value) else {
        return Err(ServiceConfigError::Json(
            "the top level must be an object".into(),
        ));
    };
    ServiceConfig::from_document(&document).map_err(ServiceConfigError::Invalid)
}

fn to_bson(value: serde_json::Value) -> Bson {
    use serde_json::Value;
    match value {
        Value::Null => Bson::Null,
        Value::Bool(b) => Bson::Boolean(b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => i32::try_from(i).map_or(Bson::Int64(i), Bson::Int32),
            None => Bson::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Bson::String(s),
        Value::Array(items) => Bson::Array(items.into_iter().map(to_bson).collect()),
        Value::Object(fields) => Bson::Document(
            fields
                .into_iter()
                .map(|(k, v)| (k, to_bson(v)))
                .collect::<Document>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use retry_core::service_config::MethodPolicy;

    #[test]
    fn a6_a_json_config_maps_methods_to_policies() {
        let config = parse_json(
            r#"{ "methodConfig": [
                  { "name": [{ "service": "mongodb", "method": "find" }],
                    "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.5s",
                                       "nonFatalStatusCodes": [462] } },
                  { "name": [{ "service": "mongodb" }],
                    "retryPolicy": { "maxAttempts": 10, "initialBackoff": "0.1s",
                                     "maxBackoff": "1s", "backoffMultiplier": 1.5,
                                     "retryableStatusCodes": ["ShutdownInProgress"] } } ],
                "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 } }"#,
        )
        .unwrap();
        assert!(matches!(
            config.policy_for("find"),
            Some(MethodPolicy::Hedging(_))
        ));
        let Some(MethodPolicy::Retry(retry)) = config.policy_for("insert") else {
            panic!("insert has the service-wide retry policy");
        };
        assert_eq!(retry.max_attempts(), 5, "A6-SC3: values above 5 are 5");
    }

    #[test]
    fn a6_errors_name_the_field_and_the_rule() {
        let e = parse_json(r#"{ "retryThrottling": { "maxTokens": 5000, "tokenRatio": 1 } }"#)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid service config field retryThrottling.maxTokens: must be greater than 0 and \
             at most 1000, got 5000"
        );
        let e = parse_json(
            r#"{ "methodConfig": [{ "name": [{}],
                 "hedgingPolicy": { "maxAttempts": 2, "hedgingDelay": 5 } }] }"#,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("methodConfig[0].hedgingPolicy.hedgingDelay"),
            "{e}"
        );
        assert!(matches!(
            parse_json("[1]"),
            Err(ServiceConfigError::Json(_))
        ));
        assert!(matches!(parse_json("{"), Err(ServiceConfigError::Json(_))));
    }
}
