//! Server descriptions: what the client knows about one server, built from a `hello` reply by the
//! SDAM parsing rules.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::cmp::Ordering;
use core::fmt;
use core::time::Duration;

use bson::oid::ObjectId;
use bson::{Bson, Document};

use super::{AverageRtt, ServerType, TagSet};
use crate::address::ServerAddress;
use crate::time::Instant;

/// A server's `topologyVersion`: the process id of its current incarnation and a counter that
/// grows with every state change (SDAM). The SDAM update rules compare them to discard stale
/// replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TopologyVersion {
    /// `processId`.
    pub process_id: ObjectId,
    /// `counter`.
    pub counter: i64,
}

impl TopologyVersion {
    /// The `topologyVersion` of a `hello` reply or a state-change error reply, if it has a
    /// well-formed one.
    pub fn from_reply(reply: &Document) -> Option<TopologyVersion> {
        topology_version(reply).ok().flatten()
    }

    /// SDAM topologyVersion comparison of what the client holds (`current`) with what a reply or
    /// error carries (`incoming`): `Greater` when `current` is newer, `Equal` when they are the
    /// same, and `Less` when `incoming` is newer, which it is assumed to be when either is
    /// missing or the process ids differ.
    pub fn compare(
        current: Option<&TopologyVersion>,
        incoming: Option<&TopologyVersion>,
    ) -> Ordering {
        match (current, incoming) {
            (Some(current), Some(incoming)) if current.process_id == incoming.process_id => {
                current.counter.cmp(&incoming.counter)
            }
            _ => Ordering::Less,
        }
    }
}

/// Why a server's description is Unknown: what went wrong with its last check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckError {
    /// The `hello` reply did not follow the protocol: `field` had the wrong type or value.
    MalformedHello {
        /// The reply field at fault, e.g. `"hosts"`.
        field: &'static str,
        /// What the field should have been, e.g. `"an array of host:port strings"`.
        expected: &'static str,
    },
    /// The server answered `hello` with `ok: 0`.
    HelloFailed {
        /// The error `code`, if the reply had one.
        code: Option<i32>,
        /// The `codeName`, if the reply had one.
        code_name: Option<Box<str>>,
        /// The `errmsg`, or empty.
        message: Box<str>,
    },
    /// The check failed before a reply arrived (a network error or a timeout), as reported by the
    /// I/O layer.
    Failed(Box<str>),
    /// An application operation on the server failed with a state-change or network error, so the
    /// SDAM error handling marked it Unknown; the text is the operation error's.
    Application(Box<str>),
    /// The server reported itself primary with an `(electionId, setVersion)` older than the newest
    /// the topology has seen (SDAM `updateRSFromPrimary`).
    StalePrimary,
    /// Another server reported itself primary, so this one's earlier claim is out of date (SDAM
    /// `updateRSFromPrimary`).
    NewerPrimary,
    /// A direct connection was configured with a replica set name the server does not report
    /// (SDAM: verifying setName with TopologyType Single).
    WrongSetName {
        /// The configured `replicaSet`.
        expected: Box<str>,
        /// The server's `setName`, if any.
        reported: Option<Box<str>>,
    },
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::MalformedHello { field, expected } => {
                write!(
                    f,
                    "malformed hello reply: field `{field}` must be {expected}"
                )
            }
            CheckError::HelloFailed {
                code,
                code_name,
                message,
            } => {
                f.write_str("hello failed")?;
                if let Some(code) = code {
                    write!(f, " with code {code}")?;
                }
                if let Some(name) = code_name {
                    write!(f, " ({name})")?;
                }
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            CheckError::Failed(message) | CheckError::Application(message) => f.write_str(message),
            CheckError::StalePrimary => {
                f.write_str("primary marked stale due to electionId/setVersion mismatch")
            }
            CheckError::NewerPrimary => {
                f.write_str("primary marked stale due to discovery of newer primary")
            }
            CheckError::WrongSetName { expected, reported } => match reported {
                Some(reported) => write!(
                    f,
                    "replica set name {reported:?} does not match the configured {expected:?}"
                ),
                None => write!(
                    f,
                    "server reports no replica set name, but {expected:?} is configured"
                ),
            },
        }
    }
}

impl core::error::Error for CheckError {}

/// What the client knows about one server (SDAM `ServerDescription`).
///
/// Built by [`ServerDescription::from_hello`] from a successful check, by
/// [`ServerDescription::from_check_error`] from a failed one, and by
/// [`ServerDescription::load_balancer`] in load-balanced mode. The fields are public so that the
/// SDAM update rules and tests can build and adjust descriptions directly.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerDescription {
    /// The address the client uses for the server (the key in the topology).
    pub address: ServerAddress,
    /// The type, from the reply (SDAM).
    pub server_type: ServerType,
    /// The average RTT of monitoring checks (SS-14); none for an Unknown server.
    pub average_rtt: AverageRtt,
    /// `lastWrite.lastWriteDate`: the server's wall-clock time of its last write (for staleness, SS-5).
    pub last_write_date: Option<bson::DateTime>,
    /// When the client last updated this description, on the engine's clock (for staleness, SS-5).
    pub last_update_time: Instant,
    /// `minWireVersion`, default 0.
    pub min_wire_version: i32,
    /// `maxWireVersion`, default 0.
    pub max_wire_version: i32,
    /// `me`: the address the member calls itself.
    pub me: Option<ServerAddress>,
    /// `hosts`: the set's electable and secondary members.
    pub hosts: Vec<ServerAddress>,
    /// `passives`: members with priority 0.
    pub passives: Vec<ServerAddress>,
    /// `arbiters`.
    pub arbiters: Vec<ServerAddress>,
    /// `tags` (SS-6).
    pub tags: TagSet,
    /// `setName`.
    pub set_name: Option<String>,
    /// `setVersion`.
    pub set_version: Option<i32>,
    /// `electionId`.
    pub election_id: Option<ObjectId>,
    /// `primary`: the member this server believes is primary.
    pub primary: Option<ServerAddress>,
    /// `logicalSessionTimeoutMinutes`; none means the server does not support sessions.
    pub logical_session_timeout: Option<Duration>,
    /// `topologyVersion`.
    pub topology_version: Option<TopologyVersion>,
    /// `serviceId`: the mongos behind a load balancer (load-balanced mode).
    pub service_id: Option<ObjectId>,
    /// Why the server is Unknown, if its last check failed.
    pub error: Option<CheckError>,
}

impl ServerDescription {
    /// A server not yet checked: type Unknown, no RTT, no error.
    pub fn unknown(address: ServerAddress) -> ServerDescription {
        ServerDescription {
            address,
            server_type: ServerType::Unknown,
            average_rtt: AverageRtt::NONE,
            last_write_date: None,
            last_update_time: Instant::ZERO,
            min_wire_version: 0,
            max_wire_version: 0,
            me: None,
            hosts: Vec::new(),
            passives: Vec::new(),
            arbiters: Vec::new(),
            tags: TagSet::new(),
            set_name: None,
            set_version: None,
            election_id: None,
            primary: None,
            logical_session_timeout: None,
            topology_version: None,
            service_id: None,
            error: None,
        }
    }

    /// An Unknown server whose check at `now` failed with `error` (its RTT is cleared, SS-14).
    pub fn from_check_error(
        address: ServerAddress,
        error: CheckError,
        now: Instant,
    ) -> ServerDescription {
        ServerDescription {
            last_update_time: now,
            error: Some(error),
            ..ServerDescription::unknown(address)
        }
    }

    /// The load balancer of a load-balanced topology: always type LoadBalancer, never monitored
    /// (load-balancer spec; SS-7, SS-9).
    pub fn load_balancer(address: ServerAddress, now: Instant) -> ServerDescription {
        ServerDescription {
            server_type: ServerType::LoadBalancer,
            last_update_time: now,
            ..ServerDescription::unknown(address)
        }
    }

    /// Builds a description from a `hello` (or legacy hello) reply received at `now`, with the
    /// server's average RTT after this check, by the SDAM parsing rules.
    ///
    /// The type is decided in SDAM order: `ok` not 1 → Unknown; `isreplicaset: true` → RSGhost;
    /// `msg: "isdbgrid"` → Mongos; with a `setName`: `isWritablePrimary` (or legacy `ismaster`) →
    /// RSPrimary, `hidden` → RSOther, `secondary` → RSSecondary, `arbiterOnly` → RSArbiter, else
    /// RSOther; otherwise Standalone. A reply with a field of the wrong type gives an Unknown
    /// description carrying a [`CheckError`]; this never panics.
    pub fn from_hello(
        address: ServerAddress,
        reply: &Document,
        average_rtt: Duration,
        now: Instant,
    ) -> ServerDescription {
        match parse_hello(address.clone(), reply, average_rtt, now) {
            Ok(description) => description,
            Err(error) => ServerDescription::from_check_error(address, error, now),
        }
    }

    /// Whether the server is available: its type is known (server-selection "Available").
    pub fn is_available(&self) -> bool {
        self.server_type != ServerType::Unknown
    }

    /// SDAM server description equality: whether `self` and `other` agree on every field that
    /// decides whether a change is published (type, error, wire versions, `me`, member lists
    /// compared as sets, tags, set name, set version, election id, primary, logical session
    /// timeout, topologyVersion). RTT and update times are left out, so a repeated identical reply
    /// publishes nothing.
    pub fn is_equivalent_to(&self, other: &ServerDescription) -> bool {
        fn same_members(a: &[ServerAddress], b: &[ServerAddress]) -> bool {
            a.len() == b.len() && a.iter().all(|x| b.contains(x)) && b.iter().all(|x| a.contains(x))
        }
        self.address == other.address
            && self.server_type == other.server_type
            && self.error == other.error
            && self.min_wire_version == other.min_wire_version
            && self.max_wire_version == other.max_wire_version
            && self.me == other.me
            && same_members(&self.hosts, &other.hosts)
            && same_members(&self.passives, &other.passives)
            && same_members(&self.arbiters, &other.arbiters)
            && self.tags == other.tags
            && self.set_name == other.set_name
            && self.set_version == other.set_version
            && self.election_id == other.election_id
            && self.primary == other.primary
            && self.logical_session_timeout == other.logical_session_timeout
            && self.topology_version == other.topology_version
    }

    /// The members this server reports: `hosts`, `passives` and `arbiters`, in that order.
    pub fn members(&self) -> impl Iterator<Item = &ServerAddress> {
        self.hosts
            .iter()
            .chain(&self.passives)
            .chain(&self.arbiters)
    }

    /// Whether the server holds data (SDAM "data-bearing"): the types whose session support
    /// counts for the topology.
    pub fn is_data_bearing(&self) -> bool {
        matches!(
            self.server_type,
            ServerType::Standalone
                | ServerType::Mongos
                | ServerType::RsPrimary
                | ServerType::RsSecondary
                | ServerType::LoadBalancer
        )
    }
}

type Parsed<T> = Result<T, CheckError>;

fn malformed(field: &'static str, expected: &'static str) -> CheckError {
    CheckError::MalformedHello { field, expected }
}

/// An integer field: int32, int64 or an integral double (servers and proxies differ).
fn integer(reply: &Document, field: &'static str) -> Parsed<Option<i64>> {
    match reply.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Int32(v)) => Ok(Some(i64::from(*v))),
        Some(Bson::Int64(v)) => Ok(Some(*v)),
        Some(Bson::Double(v)) if v.fract() == 0.0 && v.abs() < 9.0e15 => Ok(Some(*v as i64)),
        Some(_) => Err(malformed(field, "an integer")),
    }
}

fn int32(reply: &Document, field: &'static str) -> Parsed<Option<i32>> {
    integer(reply, field)?
        .map(|v| i32::try_from(v).map_err(|_| malformed(field, "a 32-bit integer")))
        .transpose()
}

/// A boolean flag; absent means false.
fn flag(reply: &Document, field: &'static str) -> Parsed<bool> {
    match reply.get(field) {
        None | Some(Bson::Null) => Ok(false),
        Some(Bson::Boolean(b)) => Ok(*b),
        Some(_) => Err(malformed(field, "a boolean")),
    }
}

fn string<'a>(reply: &'a Document, field: &'static str) -> Parsed<Option<&'a str>> {
    match reply.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::String(s)) => Ok(Some(s)),
        Some(_) => Err(malformed(field, "a string")),
    }
}

fn object_id(reply: &Document, field: &'static str) -> Parsed<Option<ObjectId>> {
    match reply.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::ObjectId(id)) => Ok(Some(*id)),
        Some(_) => Err(malformed(field, "an ObjectId")),
    }
}

fn host_address(reply: &Document, field: &'static str) -> Parsed<Option<ServerAddress>> {
    string(reply, field)?
        .map(|s| {
            s.parse()
                .map_err(|_| malformed(field, "a host:port string"))
        })
        .transpose()
}

fn addresses(reply: &Document, field: &'static str) -> Parsed<Vec<ServerAddress>> {
    const EXPECTED: &str = "an array of host:port strings";
    match reply.get(field) {
        None | Some(Bson::Null) => Ok(Vec::new()),
        Some(Bson::Array(items)) => items
            .iter()
            .map(|item| match item {
                Bson::String(s) => s.parse().map_err(|_| malformed(field, EXPECTED)),
                _ => Err(malformed(field, EXPECTED)),
            })
            .collect(),
        Some(_) => Err(malformed(field, EXPECTED)),
    }
}

fn tags(reply: &Document) -> Parsed<TagSet> {
    const EXPECTED: &str = "a document of string values";
    match reply.get("tags") {
        None | Some(Bson::Null) => Ok(TagSet::new()),
        Some(Bson::Document(doc)) => {
            let mut set = TagSet::new();
            for (k, v) in doc {
                match v {
                    Bson::String(v) => set.insert(k, v),
                    _ => return Err(malformed("tags", EXPECTED)),
                }
            }
            Ok(set)
        }
        Some(_) => Err(malformed("tags", EXPECTED)),
    }
}

fn last_write_date(reply: &Document) -> Parsed<Option<bson::DateTime>> {
    const FIELD: &str = "lastWrite";
    match reply.get(FIELD) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(last_write)) => match last_write.get("lastWriteDate") {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::DateTime(date)) => Ok(Some(*date)),
            Some(_) => Err(malformed(FIELD, "a document whose lastWriteDate is a date")),
        },
        Some(_) => Err(malformed(FIELD, "a document")),
    }
}

fn topology_version(reply: &Document) -> Parsed<Option<TopologyVersion>> {
    const FIELD: &str = "topologyVersion";
    const EXPECTED: &str = "a document {processId: ObjectId, counter: integer}";
    match reply.get(FIELD) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(doc)) => {
            let process_id = object_id(doc, "processId")
                .ok()
                .flatten()
                .ok_or_else(|| malformed(FIELD, EXPECTED))?;
            let counter = integer(doc, "counter")
                .ok()
                .flatten()
                .ok_or_else(|| malformed(FIELD, EXPECTED))?;
            Ok(Some(TopologyVersion {
                process_id,
                counter,
            }))
        }
        Some(_) => Err(malformed(FIELD, EXPECTED)),
    }
}

/// `ok` is 1 (as any number type) or `true`.
fn ok(reply: &Document) -> Parsed<bool> {
    crate::reply::ok(reply).ok_or_else(|| malformed("ok", "a number"))
}

/// SDAM: the server type of a successful reply.
fn server_type(reply: &Document, set_name: Option<&str>) -> Parsed<ServerType> {
    if flag(reply, "isreplicaset")? {
        return Ok(ServerType::RsGhost);
    }
    if string(reply, "msg")? == Some("isdbgrid") {
        return Ok(ServerType::Mongos);
    }
    if set_name.is_none() {
        return Ok(ServerType::Standalone);
    }
    let primary = flag(reply, "isWritablePrimary")? || flag(reply, "ismaster")?;
    Ok(if primary {
        ServerType::RsPrimary
    } else if flag(reply, "hidden")? {
        ServerType::RsOther
    } else if flag(reply, "secondary")? {
        ServerType::RsSecondary
    } else if flag(reply, "arbiterOnly")? {
        ServerType::RsArbiter
    } else {
        ServerType::RsOther
    })
}

fn parse_hello(
    address: ServerAddress,
    reply: &Document,
    average_rtt: Duration,
    now: Instant,
) -> Parsed<ServerDescription> {
    if !ok(reply)? {
        return Err(CheckError::HelloFailed {
            code: int32(reply, "code").ok().flatten(),
            code_name: string(reply, "codeName").ok().flatten().map(Box::from),
            message: string(reply, "errmsg")
                .ok()
                .flatten()
                .unwrap_or_default()
                .into(),
        });
    }
    let set_name = string(reply, "setName")?;
    let logical_session_timeout = integer(reply, "logicalSessionTimeoutMinutes")?
        .map(|minutes| {
            u64::try_from(minutes)
                .map(|m| Duration::from_secs(m.saturating_mul(60)))
                .map_err(|_| malformed("logicalSessionTimeoutMinutes", "a non-negative integer"))
        })
        .transpose()?;
    Ok(ServerDescription {
        server_type: server_type(reply, set_name)?,
        average_rtt: AverageRtt::from_duration(average_rtt),
        last_write_date: last_write_date(reply)?,
        last_update_time: now,
        min_wire_version: int32(reply, "minWireVersion")?.unwrap_or(0),
        max_wire_version: int32(reply, "maxWireVersion")?.unwrap_or(0),
        me: host_address(reply, "me")?,
        hosts: addresses(reply, "hosts")?,
        passives: addresses(reply, "passives")?,
        arbiters: addresses(reply, "arbiters")?,
        tags: tags(reply)?,
        set_name: set_name.map(String::from),
        set_version: int32(reply, "setVersion")?,
        election_id: object_id(reply, "electionId")?,
        primary: host_address(reply, "primary")?,
        logical_session_timeout,
        topology_version: topology_version(reply)?,
        service_id: object_id(reply, "serviceId")?,
        error: None,
        address,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn a() -> ServerAddress {
        ServerAddress::new("a", 27017)
    }

    fn parse(reply: Document) -> ServerDescription {
        ServerDescription::from_hello(
            a(),
            &reply,
            Duration::from_millis(5),
            Instant::from_millis(7),
        )
    }

    #[test]
    fn server_types_follow_the_sdam_table() {
        let cases = [
            (doc! {"ok": 1, "isreplicaset": true}, ServerType::RsGhost),
            (doc! {"ok": 1, "msg": "isdbgrid"}, ServerType::Mongos),
            (
                doc! {"ok": 1.0, "isWritablePrimary": true},
                ServerType::Standalone,
            ),
            (
                doc! {"ok": 1, "setName": "rs", "isWritablePrimary": true},
                ServerType::RsPrimary,
            ),
            (
                doc! {"ok": 1, "setName": "rs", "ismaster": true},
                ServerType::RsPrimary,
            ),
            (
                doc! {"ok": 1, "setName": "rs", "secondary": true},
                ServerType::RsSecondary,
            ),
            (
                doc! {"ok": 1, "setName": "rs", "secondary": true, "hidden": true},
                ServerType::RsOther,
            ),
            (
                doc! {"ok": 1, "setName": "rs", "arbiterOnly": true},
                ServerType::RsArbiter,
            ),
            (doc! {"ok": 1, "setName": "rs"}, ServerType::RsOther),
            (doc! {"ok": 0, "errmsg": "no"}, ServerType::Unknown),
        ];
        for (reply, expected) in cases {
            assert_eq!(parse(reply.clone()).server_type, expected, "{reply}");
        }
    }

    #[test]
    fn a_full_reply_fills_every_field() {
        let election = ObjectId::from_bytes([1; 12]);
        let process = ObjectId::from_bytes([2; 12]);
        let service = ObjectId::from_bytes([3; 12]);
        let d = parse(doc! {
            "ok": 1, "setName": "rs", "secondary": true, "setVersion": 3_i64,
            "electionId": election, "primary": "B:27017", "me": "a:27017",
            "hosts": ["a:27017", "b:27017"], "passives": ["c"], "arbiters": ["d:1"],
            "tags": {"dc": "ny"}, "minWireVersion": 0, "maxWireVersion": 21,
            "lastWrite": {"lastWriteDate": bson::DateTime::from_millis(42)},
            "logicalSessionTimeoutMinutes": 30,
            "topologyVersion": {"processId": process, "counter": 4_i64},
            "serviceId": service,
        });
        assert_eq!(d.server_type, ServerType::RsSecondary);
        assert_eq!(d.average_rtt.get(), Some(Duration::from_millis(5)));
        assert_eq!(d.last_update_time, Instant::from_millis(7));
        assert_eq!(d.set_name.as_deref(), Some("rs"));
        assert_eq!(d.set_version, Some(3));
        assert_eq!(d.election_id, Some(election));
        assert_eq!(d.primary, Some(ServerAddress::new("b", 27017)));
        assert_eq!(d.me, Some(a()));
        assert_eq!(d.hosts.len(), 2);
        assert_eq!(d.passives, [ServerAddress::new("c", 27017)]);
        assert_eq!(d.arbiters, [ServerAddress::new("d", 1)]);
        assert_eq!(d.tags.get("dc"), Some("ny"));
        assert_eq!((d.min_wire_version, d.max_wire_version), (0, 21));
        assert_eq!(d.last_write_date, Some(bson::DateTime::from_millis(42)));
        assert_eq!(d.logical_session_timeout, Some(Duration::from_secs(1800)));
        assert_eq!(
            d.topology_version,
            Some(TopologyVersion {
                process_id: process,
                counter: 4
            })
        );
        assert_eq!(d.service_id, Some(service));
        assert_eq!(d.error, None);
    }

    #[test]
    fn malformed_replies_give_unknown_with_an_error_naming_the_field() {
        let cases = [
            (doc! {}, "ok"),
            (doc! {"ok": "yes"}, "ok"),
            (doc! {"ok": 1, "setName": 5}, "setName"),
            (doc! {"ok": 1, "hosts": "a"}, "hosts"),
            (doc! {"ok": 1, "hosts": [1]}, "hosts"),
            (doc! {"ok": 1, "hosts": ["a:0"]}, "hosts"),
            (doc! {"ok": 1, "tags": {"dc": 1}}, "tags"),
            (doc! {"ok": 1, "maxWireVersion": 1.5}, "maxWireVersion"),
            (doc! {"ok": 1, "maxWireVersion": i64::MAX}, "maxWireVersion"),
            (
                doc! {"ok": 1, "lastWrite": {"lastWriteDate": 1}},
                "lastWrite",
            ),
            (
                doc! {"ok": 1, "topologyVersion": {"counter": 1}},
                "topologyVersion",
            ),
            (
                doc! {"ok": 1, "logicalSessionTimeoutMinutes": -1},
                "logicalSessionTimeoutMinutes",
            ),
            (
                doc! {"ok": 1, "setName": "rs", "secondary": "yes"},
                "secondary",
            ),
        ];
        for (reply, field) in cases {
            let d = parse(reply.clone());
            assert_eq!(d.server_type, ServerType::Unknown, "{reply}");
            assert_eq!(d.average_rtt, AverageRtt::NONE, "{reply}");
            let error = d.error.expect("an error").to_string();
            assert!(
                error.contains(&alloc::format!("`{field}`")),
                "{reply}: {error}"
            );
        }
    }

    #[test]
    fn a_failed_hello_keeps_code_and_message() {
        let d = parse(doc! {"ok": 0, "code": 13, "codeName": "Unauthorized", "errmsg": "no"});
        assert_eq!(
            d.error.map(|e| e.to_string()).as_deref(),
            Some("hello failed with code 13 (Unauthorized): no")
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        const FIELDS: &[&str] = &[
            "ok",
            "isreplicaset",
            "msg",
            "setName",
            "isWritablePrimary",
            "ismaster",
            "hidden",
            "secondary",
            "arbiterOnly",
            "hosts",
            "passives",
            "arbiters",
            "me",
            "primary",
            "tags",
            "setVersion",
            "electionId",
            "minWireVersion",
            "maxWireVersion",
            "lastWrite",
            "logicalSessionTimeoutMinutes",
            "topologyVersion",
            "serviceId",
            "code",
            "errmsg",
        ];

        fn value() -> impl Strategy<Value = Bson> {
            let leaf = prop_oneof![
                Just(Bson::Null),
                any::<bool>().prop_map(Bson::Boolean),
                any::<i32>().prop_map(Bson::Int32),
                any::<i64>().prop_map(Bson::Int64),
                any::<f64>().prop_map(Bson::Double),
                "[a-zA-Z:0-9\\[\\]]{0,12}".prop_map(Bson::String),
                any::<[u8; 12]>().prop_map(|b| Bson::ObjectId(ObjectId::from_bytes(b))),
                any::<i64>().prop_map(|ms| Bson::DateTime(bson::DateTime::from_millis(ms))),
            ];
            leaf.prop_recursive(2, 16, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
                    prop::collection::vec((prop::sample::select(FIELDS), inner), 0..4).prop_map(
                        |fields| {
                            Bson::Document(fields.into_iter().map(|(k, v)| (k.into(), v)).collect())
                        }
                    ),
                ]
            })
        }

        proptest! {
            /// A reply of any shape gives a description, never a panic; it is Unknown exactly
            /// when it carries an error.
            #[test]
            fn from_hello_never_panics_and_unknown_means_error(
                fields in prop::collection::vec((prop::sample::select(FIELDS), value()), 0..12),
                ok in prop::option::of(any::<bool>()),
            ) {
                let mut reply: Document = fields.into_iter().map(|(k, v)| (k.into(), v)).collect();
                if let Some(ok) = ok {
                    reply.insert("ok", i32::from(ok));
                }
                let d = parse(reply);
                prop_assert_eq!(d.server_type == ServerType::Unknown, d.error.is_some());
            }
        }
    }
}
