//! Topology descriptions: the client's view of the whole deployment.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;

use bson::oid::ObjectId;

use super::{ServerDescription, TopologyType};
use crate::address::ServerAddress;

/// The oldest wire version this engine speaks (MongoDB 4.2). A server whose `maxWireVersion` is
/// lower makes the topology incompatible (SDAM).
pub const MIN_SUPPORTED_WIRE_VERSION: i32 = 8;
/// The newest wire version this engine knows. A server whose `minWireVersion` is higher makes the
/// topology incompatible (SDAM).
pub const MAX_SUPPORTED_WIRE_VERSION: i32 = 27;

/// What the client knows about the deployment (SDAM `TopologyDescription`).
///
/// Selection reads it; the SDAM update rules ([`super::Topology`]) replace server descriptions in it
/// and then call [`TopologyDescription::refresh_derived`] so that compatibility and session
/// support follow the servers.
///
/// Review38 L7 (house rule 9, cost follows the work): a server is found by its address through
/// an index kept beside [`TopologyDescription::servers`], in O(log n), so that a pinned
/// transaction's command (TX-3), an error reply and a killCursors do not pay for the other
/// servers. Equality and `Debug` ignore the index, which is a function of the servers.
#[derive(Clone)]
pub struct TopologyDescription {
    /// The deployment type.
    pub topology_type: TopologyType,
    /// One description per known server address, in the order they were added.
    pub servers: Vec<ServerDescription>,
    /// The replica set name, once known.
    pub set_name: Option<String>,
    /// `maxSetVersion`: the `setVersion` of the newest primary seen, the second part of the
    /// `(electionId, setVersion)` order that detects stale primaries (SDAM `updateRSFromPrimary`).
    pub max_set_version: Option<i32>,
    /// `maxElectionId`: the `electionId` of the newest primary seen.
    pub max_election_id: Option<ObjectId>,
    compatibility_error: Option<String>,
    logical_session_timeout: Option<Duration>,
    /// L7: each address's position in `servers` (the first, should one repeat). Kept by
    /// [`TopologyDescription::push_server`] and [`TopologyDescription::remove_server`], rebuilt by
    /// [`TopologyDescription::refresh_derived`]; [`TopologyDescription::position`] checks what it
    /// finds, so a change to `servers` made without them costs a scan, never a wrong answer.
    index: BTreeMap<ServerAddress, usize>,
}

impl PartialEq for TopologyDescription {
    /// Field by field, as a derived one, without the index (which follows the servers).
    fn eq(&self, other: &TopologyDescription) -> bool {
        self.topology_type == other.topology_type
            && self.servers == other.servers
            && self.set_name == other.set_name
            && self.max_set_version == other.max_set_version
            && self.max_election_id == other.max_election_id
            && self.compatibility_error == other.compatibility_error
            && self.logical_session_timeout == other.logical_session_timeout
    }
}

impl fmt::Debug for TopologyDescription {
    /// What a derived `Debug` wrote before the index existed (L7: outputs unchanged).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopologyDescription")
            .field("topology_type", &self.topology_type)
            .field("servers", &self.servers)
            .field("set_name", &self.set_name)
            .field("max_set_version", &self.max_set_version)
            .field("max_election_id", &self.max_election_id)
            .field("compatibility_error", &self.compatibility_error)
            .field("logical_session_timeout", &self.logical_session_timeout)
            .finish()
    }
}

impl TopologyDescription {
    /// A topology of `topology_type` made of `servers`, with compatibility and session support
    /// computed from them.
    pub fn new(
        topology_type: TopologyType,
        servers: Vec<ServerDescription>,
    ) -> TopologyDescription {
        let mut topology = TopologyDescription {
            topology_type,
            servers,
            set_name: None,
            max_set_version: None,
            max_election_id: None,
            compatibility_error: None,
            logical_session_timeout: None,
            index: BTreeMap::new(),
        };
        topology.refresh_derived();
        topology
    }

    /// The description of the server at `address`, found in O(log n) (review38 L7, house rule
    /// 9).
    pub fn server(&self, address: &ServerAddress) -> Option<&ServerDescription> {
        self.position(address).map(|i| &self.servers[i])
    }

    /// The position in [`TopologyDescription::servers`] of the (first) server at `address`, in
    /// O(log n) (review38 L7, house rule 9: the cost does not follow the other servers). The
    /// index entry found is checked against `servers`; when `servers` was changed without
    /// [`TopologyDescription::push_server`], [`TopologyDescription::remove_server`] or
    /// [`TopologyDescription::refresh_derived`] and the index does not match, this falls back to
    /// a scan, so the answer is always the one `servers.iter().position` gives.
    pub fn position(&self, address: &ServerAddress) -> Option<usize> {
        match self.index.get(address) {
            Some(&i) if self.servers.get(i).is_some_and(|s| &s.address == address) => Some(i),
            None if self.index.len() == self.servers.len() => None,
            _ => self.servers.iter().position(|s| &s.address == address),
        }
    }

    /// Appends `server` (SDAM: a new server joins) and indexes it (review38 L7).
    pub fn push_server(&mut self, server: ServerDescription) {
        if self.index.len() == self.servers.len() {
            self.index
                .entry(server.address.clone())
                .or_insert(self.servers.len());
        }
        self.servers.push(server);
        if self.index.len() != self.servers.len() {
            // An address twice (or an index already out of step): rebuilt, first position wins.
            self.reindex();
        }
    }

    /// Removes every server at `address` (SDAM `remove`), keeping the others' order, and
    /// re-indexes them (review38 L7; a removal is rare, and already moves the servers after it).
    pub fn remove_server(&mut self, address: &ServerAddress) {
        self.servers.retain(|s| &s.address != address);
        self.reindex();
    }

    /// Rebuilds the address index from `servers` (review38 L7).
    fn reindex(&mut self) {
        self.index.clear();
        for (i, s) in self.servers.iter().enumerate() {
            self.index.entry(s.address.clone()).or_insert(i);
        }
    }

    /// Recomputes what derives from the servers: the compatibility error, the logical session
    /// timeout (SDAM) and the address index (L7). Call after changing
    /// [`TopologyDescription::servers`] other than through [`TopologyDescription::push_server`]
    /// and [`TopologyDescription::remove_server`].
    pub fn refresh_derived(&mut self) {
        self.reindex();
        self.compatibility_error = self.servers.iter().find_map(incompatibility);
        self.logical_session_timeout = if self.topology_type == TopologyType::LoadBalanced {
            None
        } else {
            self.servers
                .iter()
                .filter(|s| s.is_data_bearing())
                .map(|s| s.logical_session_timeout)
                .reduce(|a, b| Some(a?.min(b?)))
                .flatten()
        };
    }

    /// Whether every available server speaks a wire version this engine supports (SDAM; SS-16
    /// step 2 fails selection otherwise).
    pub fn is_compatible(&self) -> bool {
        self.compatibility_error.is_none()
    }

    /// Why the topology is incompatible, naming the first server at fault.
    pub fn compatibility_error(&self) -> Option<&str> {
        self.compatibility_error.as_deref()
    }

    /// The smallest `logicalSessionTimeoutMinutes` of the data-bearing servers, or none if any of
    /// them lacks one (SDAM).
    pub fn logical_session_timeout(&self) -> Option<Duration> {
        self.logical_session_timeout
    }

    /// Whether the deployment supports sessions: always in load-balanced mode, else when a logical
    /// session timeout is known (SDAM; retryable writes need it, RW-2).
    pub fn supports_sessions(&self) -> bool {
        self.topology_type == TopologyType::LoadBalanced || self.logical_session_timeout.is_some()
    }
}

/// SDAM: why an available server's wire-version range does not overlap ours.
pub(crate) fn incompatibility(server: &ServerDescription) -> Option<String> {
    if !server.is_available() {
        None
    } else if server.min_wire_version > MAX_SUPPORTED_WIRE_VERSION {
        Some(format!(
            "server at {} requires wire version {}, but this engine only supports up to {}",
            server.address, server.min_wire_version, MAX_SUPPORTED_WIRE_VERSION
        ))
    } else if server.max_wire_version < MIN_SUPPORTED_WIRE_VERSION {
        Some(format!(
            "server at {} reports wire version {}, but this engine requires at least {} (MongoDB 4.2)",
            server.address, server.max_wire_version, MIN_SUPPORTED_WIRE_VERSION
        ))
    } else {
        None
    }
}

impl fmt::Display for TopologyDescription {
    /// A one-line summary for error messages and logs (SS-19, SS-20):
    /// `{type: ReplicaSetWithPrimary, servers: [a:27017 RsPrimary rtt=5ms, …]}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{type: {:?}", self.topology_type)?;
        if let Some(name) = &self.set_name {
            write!(f, ", setName: {name:?}")?;
        }
        f.write_str(", servers: [")?;
        for (i, s) in self.servers.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} {:?}", s.address, s.server_type)?;
            if let Some(rtt) = s.average_rtt.get() {
                write!(f, " rtt={rtt:?}")?;
            }
            if !s.tags.is_empty() {
                write!(f, " tags={}", s.tags)?;
            }
            if let Some(error) = &s.error {
                write!(
                    f,
                    " error={error:?}",
                    error = alloc::string::ToString::to_string(error)
                )?;
            }
        }
        f.write_str("]}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Instant;
    use crate::topology::ServerType;

    fn server(
        host: &str,
        server_type: ServerType,
        max_wire: i32,
        lst: Option<u64>,
    ) -> ServerDescription {
        ServerDescription {
            server_type,
            max_wire_version: max_wire,
            logical_session_timeout: lst.map(|m| Duration::from_secs(m * 60)),
            last_update_time: Instant::ZERO,
            ..ServerDescription::unknown(ServerAddress::new(host, 27017))
        }
    }

    #[test]
    fn session_support_is_the_minimum_over_data_bearing_servers() {
        let t = TopologyDescription::new(
            TopologyType::ReplicaSetWithPrimary,
            alloc::vec![
                server("a", ServerType::RsPrimary, 21, Some(30)),
                server("b", ServerType::RsSecondary, 21, Some(10)),
                server("c", ServerType::RsArbiter, 21, None),
                server("d", ServerType::Unknown, 0, None),
            ],
        );
        assert_eq!(t.logical_session_timeout(), Some(Duration::from_secs(600)));
        assert!(t.supports_sessions());
        assert!(t.is_compatible());

        let t = TopologyDescription::new(
            TopologyType::Sharded,
            alloc::vec![
                server("a", ServerType::Mongos, 21, Some(30)),
                server("b", ServerType::Mongos, 21, None),
            ],
        );
        assert!(!t.supports_sessions());
        let lb = TopologyDescription::new(
            TopologyType::LoadBalanced,
            alloc::vec![ServerDescription::load_balancer(
                ServerAddress::new("lb", 27017),
                Instant::ZERO
            )],
        );
        assert!(lb.supports_sessions());
    }

    #[test]
    fn an_available_server_outside_our_wire_range_makes_the_topology_incompatible() {
        let old = TopologyDescription::new(
            TopologyType::Single,
            alloc::vec![server("a", ServerType::Standalone, 1, None)],
        );
        assert!(old
            .compatibility_error()
            .is_some_and(|e| e.contains("a:27017")));
        let mut new = server("a", ServerType::Standalone, 1000, None);
        new.min_wire_version = 999;
        let new = TopologyDescription::new(TopologyType::Single, alloc::vec![new]);
        assert!(!new.is_compatible());
        let unknown = TopologyDescription::new(
            TopologyType::Single,
            alloc::vec![server("a", ServerType::Unknown, 0, None)],
        );
        assert!(unknown.is_compatible());
    }
}
