//! UT-2, UT-3: the schema version the runner declares and the gate on each file's version.

use serde_json::Value;

/// The schema version this runner declares (UT-2): the highest the suites use (1.26, the
/// client-side-operations-timeout files'). Of the features 1.22–1.26 added, `awaitMinPoolSizeMS`
/// (1.26) is supported; the others (a `clientEncryption` entity's `keyExpirationMS`, a client's
/// `autoEncryptOpts`, the object form of `csfle`) raise an error, or leave the test unmet, when
/// met, never ignored; 1.24 only removed `storeEventsAsEntities` and `loop`, refused already.
pub const SCHEMA_VERSION: [u32; 3] = [1, 26, 0];

/// A version of one to three numeric parts, missing parts 0, suffixes after `-` dropped (UT-3).
pub fn parse_version(text: &str) -> Option<[u32; 3]> {
    let text = text.split('-').next()?;
    let mut parts = [0; 3];
    for (index, part) in text.split('.').enumerate() {
        *parts.get_mut(index)? = part.parse().ok()?;
    }
    Some(parts)
}

/// UT-2: a file runs only with the declared major version and a version not above it; anything
/// else (absent, malformed, newer) is an error that fails each of its tests.
pub fn check(version: Option<&Value>) -> Result<(), String> {
    let text = version
        .and_then(Value::as_str)
        .ok_or("schemaVersion missing or not a string")?;
    let parsed = parse_version(text).ok_or_else(|| format!("malformed schemaVersion {text:?}"))?;
    if parsed[0] != SCHEMA_VERSION[0] || parsed > SCHEMA_VERSION {
        return Err(format!(
            "schemaVersion {text} is not supported (runner: {}.{})",
            SCHEMA_VERSION[0], SCHEMA_VERSION[1]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// UT-3: one to three parts, missing parts 0, suffix dropped.
    #[test]
    fn versions_parse_part_by_part() {
        assert_eq!(parse_version("1"), Some([1, 0, 0]));
        assert_eq!(parse_version("4.2.99"), Some([4, 2, 99]));
        assert_eq!(parse_version("8.2.0-rc1"), Some([8, 2, 0]));
        assert_eq!(parse_version("1.2.3.4"), None);
        assert_eq!(parse_version("x"), None);
    }

    /// UT-2: the declared major and nothing newer.
    #[test]
    fn schema_gate() {
        for ok in ["1.0", "1.9", "1.21", "1.26"] {
            assert_eq!(check(Some(&json!(ok))), Ok(()), "{ok}");
        }
        for bad in [json!("1.27"), json!("2.0"), json!(1.0), json!("one")] {
            assert!(check(Some(&bad)).is_err(), "{bad}");
        }
        assert!(check(None).is_err());
    }
}
