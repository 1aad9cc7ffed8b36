//! UT-23: how an expected value (from the test file) matches an actual one (from the product or
//! the test server). Root-level documents may carry extra keys, nested ones may not; arrays need
//! the same length; int32, int64 and double compare by value; a document whose only key starts
//! with `$$` is an operator. An operator the runner does not know is an error, never a match.

use bson::{Bson, Document};

/// The lsid of a session entity, for `$$sessionLsid`.
pub type SessionLsids<'a> = &'a dyn Fn(&str) -> Option<Document>;

/// Whether `actual` (absent: `None`) matches `expected`; `Err` names the first difference, with
/// its path.
pub fn matches_root(
    expected: &Bson,
    actual: Option<&Bson>,
    sessions: SessionLsids<'_>,
) -> Result<(), String> {
    matches_at(expected, actual, true, "", sessions)
}

fn matches_at(
    expected: &Bson,
    actual: Option<&Bson>,
    root: bool,
    path: &str,
    sessions: SessionLsids<'_>,
) -> Result<(), String> {
    if let Some((operator, operand)) = special(expected) {
        return operator_matches(operator, operand, actual, root, path, sessions);
    }
    let Some(actual) = actual else {
        return Err(format!("{path}: expected {expected}, found nothing"));
    };
    match (expected, actual) {
        (Bson::Document(expected), Bson::Document(actual)) => {
            for (key, value) in expected {
                let child = format!("{path}.{key}");
                matches_at(value, actual.get(key), false, &child, sessions)?;
            }
            if !root {
                if let Some(extra) = actual.keys().find(|k| !expected.contains_key(*k)) {
                    return Err(format!(
                        "{path}: unexpected key {extra} in a nested document"
                    ));
                }
            }
            Ok(())
        }
        (Bson::Array(expected), Bson::Array(actual)) => {
            if expected.len() != actual.len() {
                return Err(format!(
                    "{path}: expected {} elements, found {}",
                    expected.len(),
                    actual.len()
                ));
            }
            for (index, (e, a)) in expected.iter().zip(actual).enumerate() {
                if special(e).is_some_and(|(op, _)| op == "$$unsetOrMatches") {
                    return Err(format!("{path}[{index}]: $$unsetOrMatches in an array"));
                }
                // Elements of an array of documents are root-level (find results, writeErrors).
                matches_at(e, Some(a), root, &format!("{path}[{index}]"), sessions)?;
            }
            Ok(())
        }
        _ if numbers_equal(expected, actual) => Ok(()),
        _ if expected == actual => Ok(()),
        _ => Err(format!("{path}: expected {expected}, found {actual}")),
    }
}

/// `{"$$op": operand}` with one key.
fn special(value: &Bson) -> Option<(&str, &Bson)> {
    let Bson::Document(d) = value else {
        return None;
    };
    let mut entries = d.iter();
    match (entries.next(), entries.next()) {
        (Some((key, operand)), None) if key.starts_with("$$") => Some((key.as_str(), operand)),
        _ => None,
    }
}

fn operator_matches(
    operator: &str,
    operand: &Bson,
    actual: Option<&Bson>,
    root: bool,
    path: &str,
    sessions: SessionLsids<'_>,
) -> Result<(), String> {
    match operator {
        "$$exists" => match (operand, actual.is_some()) {
            (Bson::Boolean(wanted), present) if *wanted == present => Ok(()),
            (Bson::Boolean(wanted), _) => Err(format!("{path}: $$exists {wanted} does not hold")),
            _ => Err(format!("{path}: $$exists needs a boolean")),
        },
        "$$type" => {
            let aliases: Vec<&str> = match operand {
                Bson::String(alias) => vec![alias.as_str()],
                Bson::Array(list) => list.iter().filter_map(Bson::as_str).collect(),
                _ => return Err(format!("{path}: $$type needs a string or a list")),
            };
            let Some(actual) = actual else {
                return Err(format!("{path}: $$type {aliases:?} but nothing there"));
            };
            let name = type_alias(actual);
            if aliases.contains(&name) || (aliases.contains(&"number") && is_number(actual)) {
                Ok(())
            } else {
                Err(format!("{path}: expected type {aliases:?}, found {name}"))
            }
        }
        "$$unsetOrMatches" => match actual {
            None => Ok(()),
            Some(_) => matches_at(operand, actual, root, path, sessions),
        },
        "$$sessionLsid" => {
            let Bson::String(name) = operand else {
                return Err(format!("{path}: $$sessionLsid needs an entity name"));
            };
            let lsid = sessions(name).ok_or_else(|| format!("{path}: no session {name}"))?;
            match actual {
                Some(Bson::Document(actual)) if *actual == lsid => Ok(()),
                other => Err(format!(
                    "{path}: expected the lsid of {name}, found {other:?}"
                )),
            }
        }
        other => Err(format!(
            "{path}: the runner does not support the operator {other}"
        )),
    }
}

/// The unified format's type alias of a BSON value.
fn type_alias(value: &Bson) -> &'static str {
    match value {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Document(_) => "object",
        Bson::Array(_) => "array",
        Bson::Binary(_) => "binData",
        Bson::Undefined => "undefined",
        Bson::ObjectId(_) => "objectId",
        Bson::Boolean(_) => "bool",
        Bson::DateTime(_) => "date",
        Bson::Null => "null",
        Bson::RegularExpression(_) => "regex",
        Bson::DbPointer(_) => "dbPointer",
        Bson::JavaScriptCode(_) => "javascript",
        Bson::Symbol(_) => "symbol",
        Bson::JavaScriptCodeWithScope(_) => "javascriptWithScope",
        Bson::Int32(_) => "int",
        Bson::Timestamp(_) => "timestamp",
        Bson::Int64(_) => "long",
        Bson::Decimal128(_) => "decimal",
        Bson::MinKey => "minKey",
        Bson::MaxKey => "maxKey",
    }
}

fn is_number(value: &Bson) -> bool {
    matches!(value, Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))
}

/// int32, int64 and double by value.
fn numbers_equal(a: &Bson, b: &Bson) -> bool {
    let value = |v: &Bson| match v {
        Bson::Int32(x) => Some(f64::from(*x)),
        Bson::Int64(x) => Some(*x as f64),
        Bson::Double(x) => Some(*x),
        _ => None,
    };
    matches!((value(a), value(b)), (Some(x), Some(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{bson, doc};

    fn no_sessions(_: &str) -> Option<Document> {
        None
    }

    fn check(expected: Bson, actual: Bson) -> Result<(), String> {
        matches_root(&expected, Some(&actual), &no_sessions)
    }

    /// UT-23: root documents may carry extra keys, nested ones may not.
    #[test]
    fn extra_keys_only_at_the_root() {
        assert!(check(bson!({ "a": 1 }), bson!({ "a": 1, "b": 2 })).is_ok());
        assert!(check(bson!({ "c": {} }), bson!({ "c": { "x": 1 } })).is_err());
        assert!(check(bson!([{ "a": 1 }]), bson!([{ "a": 1, "z": 0 }])).is_ok());
        assert!(check(bson!([1, 2]), bson!([1])).is_err());
        assert!(check(bson!({ "n": 1 }), bson!({ "n": 1.0_f64 })).is_ok());
        assert!(check(bson!({ "n": 1 }), bson!({ "n": 2_i64 })).is_err());
    }

    /// UT-23: $$exists, $$type, $$unsetOrMatches, $$sessionLsid; unknown operators fail.
    #[test]
    fn operators() {
        assert!(check(bson!({ "a": { "$$exists": false } }), bson!({})).is_ok());
        assert!(check(bson!({ "a": { "$$exists": true } }), bson!({})).is_err());
        assert!(check(
            bson!({ "a": { "$$type": ["int", "long"] } }),
            bson!({ "a": 3_i64 })
        )
        .is_ok());
        assert!(check(bson!({ "a": { "$$type": "string" } }), bson!({ "a": 3 })).is_err());
        let unset = bson!({ "u": { "multi": { "$$unsetOrMatches": false } } });
        assert!(check(unset.clone(), bson!({ "u": {} })).is_ok());
        assert!(check(unset.clone(), bson!({ "u": { "multi": false } })).is_ok());
        assert!(check(unset, bson!({ "u": { "multi": true } })).is_err());
        assert!(check(bson!([{ "$$unsetOrMatches": 1 }]), bson!([1])).is_err());
        assert!(check(bson!({ "a": { "$$lte": 1 } }), bson!({ "a": 0 })).is_err());
        let lsid = doc! { "id": 7 };
        let sessions = |name: &str| (name == "session0").then(|| lsid.clone());
        let expected = bson!({ "lsid": { "$$sessionLsid": "session0" } });
        assert!(matches_root(&expected, Some(&bson!({ "lsid": { "id": 7 } })), &sessions).is_ok());
        assert!(matches_root(&expected, Some(&bson!({ "lsid": { "id": 8 } })), &sessions).is_err());
    }
}
