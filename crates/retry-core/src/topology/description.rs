//! Topology descriptions: the client's view of the whole deployment.

use alloc::collections::btree_map::{BTreeMap, Entry};
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
    /// `TopologyDescription::push_server` and `TopologyDescription::remove_server`, rebuilt by
    /// [`TopologyDescription::refresh_derived`]; `TopologyDescription::position` checks what it
    /// finds, so a change to `servers` made without them costs a scan, never a wrong answer.
    index: BTreeMap<ServerAddress, usize>,
    /// How many servers the index was exact for (one entry per server, no address twice);
    /// `usize::MAX` when an address is there twice. The index is trusted only while `servers`
    /// has this length.
    indexed: usize,
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
            indexed: 0,
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
    /// index entry found is checked against `servers`, and the index is not trusted when an
    /// address is there twice or `servers` changed length behind it: then this scans, as
    /// `servers.iter().position` does; an address not in the index is looked for by a scan too
    /// (it is absent, or `servers` was changed directly: a removed server's errors are rare).
    pub(crate) fn position(&self, address: &ServerAddress) -> Option<usize> {
        if self.indexed == self.servers.len() {
            let indexed = self.index.get(address).copied();
            if let Some(i) =
                indexed.filter(|&i| self.servers.get(i).is_some_and(|s| &s.address == address))
            {
                return Some(i);
            }
            // Not indexed: absent, or put in `servers` directly (review39 M5): a scan.
        }
        self.servers.iter().position(|s| &s.address == address)
    }

    /// Appends `server` (SDAM: a new server joins) and indexes it (review38 L7).
    pub(crate) fn push_server(&mut self, server: ServerDescription) {
        let in_step = self.indexed == self.servers.len();
        let address = server.address.clone();
        self.servers.push(server);
        if !in_step {
            // `servers` was changed directly (or holds an address twice): rebuilt.
            self.reindex();
            return;
        }
        match self.index.entry(address) {
            Entry::Vacant(entry) => {
                entry.insert(self.servers.len() - 1);
                self.indexed = self.servers.len();
            }
            // An address twice: the first position stays, and `position` scans.
            Entry::Occupied(_) => self.indexed = usize::MAX,
        }
    }

    /// Removes every server at `address` (SDAM `remove`), keeping the others' order, and
    /// re-indexes them (review38 L7; a removal is rare, and already moves the servers after it).
    pub(crate) fn remove_server(&mut self, address: &ServerAddress) {
        self.servers.retain(|s| &s.address != address);
        self.reindex();
    }

    /// Rebuilds the address index from `servers` (review38 L7).
    fn reindex(&mut self) {
        self.index.clear();
        for (i, s) in self.servers.iter().enumerate() {
            self.index.entry(s.address.clone()).or_insert(i);
        }
        self.indexed = match self.index.len() == self.servers.len() {
            true => self.servers.len(),
            false => usize::MAX,
        };
    }

    /// Recomputes what derives from the servers: the compatibility error, the logical session
    /// timeout (SDAM) and the address index (L7). Call after changing
    /// [`TopologyDescription::servers`] other than through `TopologyDescription::push_server`
    /// and `TopologyDescription::remove_server`.
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

    /// Review38 L7 (house rule 9): the indexed lookup gives what a scan of `servers` gives,
    /// through random additions (an address twice included), removals, in-place replacements,
    /// and changes made to `servers` directly: looked up before the `refresh_derived` that
    /// must follow them, and after it.
    mod l7_index {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Change {
            Push(u16),
            Remove(u16),
            Replace(u16),
            /// Directly on `servers`, then `refresh_derived`.
            DirectPush(u16),
            DirectRetain(u16),
            DirectSwap(usize, usize),
        }

        fn change() -> impl Strategy<Value = Change> {
            let port = 0..12u16;
            prop_oneof![
                4 => port.clone().prop_map(Change::Push),
                2 => port.clone().prop_map(Change::Remove),
                2 => port.clone().prop_map(Change::Replace),
                1 => port.clone().prop_map(Change::DirectPush),
                1 => port.prop_map(Change::DirectRetain),
                1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Change::DirectSwap(a, b)),
            ]
        }

        fn at(port: u16) -> ServerAddress {
            ServerAddress::new("m", 27000 + port)
        }

        fn check(t: &TopologyDescription) -> Result<(), TestCaseError> {
            for port in 0..12 {
                let address = at(port);
                let scan = t.servers.iter().position(|s| s.address == address);
                prop_assert_eq!(t.position(&address), scan, "{}", address);
                prop_assert_eq!(
                    t.server(&address).map(|s| s as *const ServerDescription),
                    scan.map(|i| &t.servers[i] as *const ServerDescription)
                );
            }
            Ok(())
        }

        proptest! {
            #[test]
            fn l7_lookup_by_address_matches_a_scan(changes in proptest::collection::vec(change(), 0..40)) {
                let mut t = TopologyDescription::new(TopologyType::Sharded, Vec::new());
                for change in changes {
                    match change.clone() {
                        Change::Push(p) => t.push_server(ServerDescription::unknown(at(p))),
                        Change::Remove(p) => t.remove_server(&at(p)),
                        Change::Replace(p) => {
                            // What SDAM's `replace` does: a new description, same address.
                            if let Some(i) = t.position(&at(p)) {
                                t.servers[i] = ServerDescription {
                                    server_type: ServerType::Mongos,
                                    ..ServerDescription::unknown(at(p))
                                };
                            }
                        }
                        Change::DirectPush(p) => t.servers.push(ServerDescription::unknown(at(p))),
                        Change::DirectRetain(p) => t.servers.retain(|s| s.address != at(p)),
                        Change::DirectSwap(a, b) => {
                            let n = t.servers.len();
                            if n > 0 {
                                t.servers.swap(a % n, b % n);
                            }
                        }
                    }
                    check(&t)?;
                    if matches!(change, Change::DirectPush(_) | Change::DirectRetain(_) | Change::DirectSwap(..)) {
                        t.refresh_derived();
                        check(&t)?;
                    }
                }
            }
        }

        /// L7: the index is invisible: `Debug` writes what the derived one wrote, and equality
        /// follows the servers however the index was built.
        #[test]
        fn l7_the_index_changes_no_output() {
            let servers = alloc::vec![
                ServerDescription::unknown(at(1)),
                ServerDescription::unknown(at(2)),
            ];
            let built = TopologyDescription::new(TopologyType::Sharded, servers.clone());
            let mut pushed = TopologyDescription::new(TopologyType::Sharded, Vec::new());
            pushed.push_server(ServerDescription::unknown(at(3)));
            pushed.push_server(servers[0].clone());
            pushed.remove_server(&at(3));
            pushed.servers.push(servers[1].clone());
            assert_eq!(built, pushed);
            let debug = alloc::format!("{built:?}");
            assert!(
                debug.starts_with("TopologyDescription { topology_type: Sharded, servers: [")
                    && debug.ends_with(
                        ", set_name: None, max_set_version: None, max_election_id: None, compatibility_error: None, logical_session_timeout: None }"
                    ),
                "{debug}"
            );
        }
    }
}
