//! Turning the spec tests' JSON into retry-core types.

use std::time::Duration;

use retry_core::address::ServerAddress;
use retry_core::selection::{ReadPreference, ReadPreferenceMode};
use retry_core::time::Instant;
use retry_core::topology::{
    AverageRtt, ServerDescription, ServerType, TagSet, TopologyDescription, TopologyType,
    MAX_SUPPORTED_WIRE_VERSION,
};
use serde_json::Value;

/// `value[key]`, or an error naming the key.
pub fn field<'a>(value: &'a Value, key: &str) -> Result<&'a Value, String> {
    value.get(key).ok_or_else(|| format!("missing `{key}`"))
}

/// A JSON number of milliseconds (integer or fractional) as an exact duration, rounded to the
/// nanosecond.
pub fn millis(value: &Value) -> Result<Duration, String> {
    let ms = value
        .as_f64()
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .ok_or_else(|| format!("expected a non-negative number of milliseconds, got {value}"))?;
    Ok(Duration::from_nanos((ms * 1e6).round() as u64))
}

/// A `host:port` string.
pub fn address(value: &Value) -> Result<ServerAddress, String> {
    let s = value
        .as_str()
        .ok_or_else(|| format!("expected an address string, got {value}"))?;
    s.parse().map_err(|e| format!("{e}"))
}

/// A server's `address` field.
pub fn server_address(server: &Value) -> Result<ServerAddress, String> {
    address(field(server, "address")?)
}

/// The spec's server type names. `PossiblePrimary` (a placeholder the old SDAM spec used for a
/// server named as primary but not yet checked) is not available and never a candidate, exactly
/// like Unknown, so it maps to Unknown.
pub fn server_type(name: &str) -> Result<ServerType, String> {
    Ok(match name {
        "Unknown" | "PossiblePrimary" => ServerType::Unknown,
        "Standalone" => ServerType::Standalone,
        "Mongos" => ServerType::Mongos,
        "RSPrimary" => ServerType::RsPrimary,
        "RSSecondary" => ServerType::RsSecondary,
        "RSArbiter" => ServerType::RsArbiter,
        "RSOther" => ServerType::RsOther,
        "RSGhost" => ServerType::RsGhost,
        "LoadBalancer" => ServerType::LoadBalancer,
        other => return Err(format!("unknown server type {other:?}")),
    })
}

/// The spec's topology type names.
pub fn topology_type(name: &str) -> Result<TopologyType, String> {
    Ok(match name {
        "Unknown" => TopologyType::Unknown,
        "Single" => TopologyType::Single,
        "ReplicaSetNoPrimary" => TopologyType::ReplicaSetNoPrimary,
        "ReplicaSetWithPrimary" => TopologyType::ReplicaSetWithPrimary,
        "Sharded" => TopologyType::Sharded,
        "LoadBalanced" => TopologyType::LoadBalanced,
        other => return Err(format!("unknown topology type {other:?}")),
    })
}

/// A tag document: `{"dc": "ny"}`.
pub fn tag_set(value: &Value) -> Result<TagSet, String> {
    let object = value
        .as_object()
        .ok_or_else(|| format!("expected a tag document, got {value}"))?;
    object
        .iter()
        .map(|(k, v)| {
            v.as_str()
                .map(|v| (k.as_str(), v))
                .ok_or_else(|| format!("tag {k:?} is not a string"))
        })
        .collect()
}

/// A server description as the selection tests write it: `address`, `type`, `avg_rtt_ms`,
/// `tags`, and for max staleness `lastUpdateTime` (ms on the engine clock),
/// `lastWrite.lastWriteDate` (`$numberLong` ms) and `maxWireVersion`.
///
/// The selection tests omit wire versions because they assume a compatible server, so a missing
/// `maxWireVersion` is read as the newest version this engine supports.
pub fn server(value: &Value) -> Result<ServerDescription, String> {
    let server_type = server_type(
        field(value, "type")?
            .as_str()
            .ok_or("`type` is not a string")?,
    )?;
    let average_rtt = match value.get("avg_rtt_ms") {
        Some(rtt) => AverageRtt::from_duration(millis(rtt)?),
        None => AverageRtt::NONE,
    };
    let last_update_time = match value.get("lastUpdateTime") {
        Some(t) => Instant::from_nanos(
            u64::try_from(millis(t)?.as_nanos()).map_err(|_| "lastUpdateTime too large")?,
        ),
        None => Instant::ZERO,
    };
    let last_write_date = match value.pointer("/lastWrite/lastWriteDate/$numberLong") {
        Some(ms) => Some(bson::DateTime::from_millis(
            ms.as_str()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| format!("bad lastWriteDate {ms}"))?,
        )),
        None => None,
    };
    let max_wire_version = match value.get("maxWireVersion") {
        Some(v) => v
            .as_i64()
            .and_then(|v| i32::try_from(v).ok())
            .ok_or_else(|| format!("bad maxWireVersion {v}"))?,
        None => MAX_SUPPORTED_WIRE_VERSION,
    };
    let tags = match value.get("tags") {
        Some(tags) => tag_set(tags)?,
        None => TagSet::new(),
    };
    Ok(ServerDescription {
        server_type,
        average_rtt,
        last_update_time,
        last_write_date,
        max_wire_version,
        tags,
        ..ServerDescription::unknown(server_address(value)?)
    })
}

/// A `topology_description`: `type` and `servers`.
pub fn topology(value: &Value) -> Result<TopologyDescription, String> {
    let topology_type = topology_type(
        field(value, "type")?
            .as_str()
            .ok_or("topology `type` is not a string")?,
    )?;
    let servers = field(value, "servers")?
        .as_array()
        .ok_or("`servers` is not an array")?
        .iter()
        .map(server)
        .collect::<Result<_, _>>()?;
    Ok(TopologyDescription::new(topology_type, servers))
}

/// A `read_preference`: `mode` (default primary), `tag_sets`, `maxStalenessSeconds`. An invalid
/// one is returned as the validation error's message.
pub fn read_preference(value: &Value) -> Result<Result<ReadPreference, String>, String> {
    let mode = match value.get("mode") {
        Some(Value::String(mode)) => match mode.parse::<ReadPreferenceMode>() {
            Ok(mode) => mode,
            Err(e) => return Ok(Err(e.to_string())),
        },
        Some(other) => return Err(format!("`mode` is not a string: {other}")),
        None => ReadPreferenceMode::Primary,
    };
    let tag_sets = match value.get("tag_sets") {
        Some(sets) => sets
            .as_array()
            .ok_or("`tag_sets` is not an array")?
            .iter()
            .map(tag_set)
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let max_staleness = match value.get("maxStalenessSeconds") {
        Some(v) => Some(
            v.as_i64()
                .ok_or_else(|| format!("`maxStalenessSeconds` is not an integer: {v}"))?,
        ),
        None => None,
    };
    Ok(ReadPreference::new(mode, tag_sets, max_staleness).map_err(|e| e.to_string()))
}

/// A JSON value as BSON, reading the extended-JSON forms the spec tests use (`$oid`,
/// `$numberLong`, `$date`); integers become int32 when they fit, else int64.
pub fn to_bson(value: &Value) -> Result<bson::Bson, String> {
    use bson::Bson;
    Ok(match value {
        Value::Null => Bson::Null,
        Value::Bool(b) => Bson::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => i32::try_from(i).map_or(Bson::Int64(i), Bson::Int32),
            None => Bson::Double(n.as_f64().ok_or_else(|| format!("bad number {n}"))?),
        },
        Value::String(s) => Bson::String(s.clone()),
        Value::Array(items) => Bson::Array(items.iter().map(to_bson).collect::<Result<_, _>>()?),
        Value::Object(object) => {
            let single = (object.len() == 1).then(|| object.iter().next()).flatten();
            match single {
                Some((k, Value::String(hex))) if k == "$oid" => Bson::ObjectId(
                    bson::oid::ObjectId::parse_str(hex).map_err(|e| format!("bad $oid: {e}"))?,
                ),
                Some((k, Value::String(code))) if k == "$code" => {
                    Bson::JavaScriptCode(code.clone())
                }
                Some((k, Value::String(n))) if k == "$numberLong" => {
                    Bson::Int64(n.parse().map_err(|e| format!("bad $numberLong: {e}"))?)
                }
                Some((k, date)) if k == "$date" => {
                    let ms = match date {
                        Value::Object(_) => date
                            .get("$numberLong")
                            .and_then(Value::as_str)
                            .and_then(|s| s.parse().ok()),
                        _ => date.as_i64(),
                    }
                    .ok_or_else(|| format!("bad $date {date}"))?;
                    Bson::DateTime(bson::DateTime::from_millis(ms))
                }
                _ => Bson::Document(
                    object
                        .iter()
                        .map(|(k, v)| Ok((k.clone(), to_bson(v)?)))
                        .collect::<Result<_, String>>()?,
                ),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// UT-1: a JSON object keeps its key order as BSON: a `runCommand` document goes out with
    /// its command name first, and a multi-key `sort` sorts in the order written.
    #[test]
    fn ut1_objects_keep_their_key_order() {
        let value: Value =
            serde_json::from_str(r#"{"insert":"c","documents":[{"z":1,"a":2}],"ordered":true}"#)
                .unwrap();
        let bson::Bson::Document(command) = to_bson(&value).unwrap() else {
            panic!("an object is a document");
        };
        let keys: Vec<&str> = command.keys().map(String::as_str).collect();
        assert_eq!(keys, ["insert", "documents", "ordered"]);
        let document = command.get_array("documents").unwrap()[0]
            .as_document()
            .unwrap();
        let keys: Vec<&str> = document.keys().map(String::as_str).collect();
        assert_eq!(keys, ["z", "a"]);
    }
}
