//! The SDAM topology machine: it owns the [`TopologyDescription`] and one connection pool per
//! server, applies monitoring outcomes by the SDAM update rules, and publishes SDAM events.
//!
//! Inputs take `now`: [`Topology::handle_hello`] and [`Topology::handle_check_failed`] for the
//! monitors' outcomes, [`Topology::handle_application_error`] (in `error_handling`) for errors
//! of application operations, [`Topology::close`]. Outputs are polled until `None`:
//! [`Topology::poll_event`] (SDAM monitoring events) and [`Topology::poll_action`] (monitors to
//! start, stop, hurry or cancel). Pools are reached through [`Topology::pool_mut`]; the topology
//! clears them in the same step as it marks their server Unknown, and marks them ready after a
//! successful check, as SDAM requires (CM-2), unless the server is incompatible (SS-16).

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cmp::Ordering;
use core::fmt;
use core::time::Duration;

use bson::Document;

use super::{
    incompatibility, CheckError, SdamEvent, ServerDescription, ServerType, TopologyAction,
    TopologyDescription, TopologyType, TopologyVersion,
};
use crate::address::ServerAddress;
use crate::error::{ErrorKind, NetworkErrorKind, OperationError};
use crate::pool::{Pool, PoolOptions, PoolState};
use crate::time::Instant;

/// How a client was configured to discover its deployment (the URI options `directConnection`,
/// `replicaSet` and `loadBalanced`, and the seed list).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologySettings {
    /// The seed list, at least one address.
    pub seeds: Vec<ServerAddress>,
    /// `replicaSet`: the required replica set name.
    pub replica_set: Option<String>,
    /// `directConnection=true`: talk to the one seed only, whatever it is.
    pub direct_connection: bool,
    /// `loadBalanced=true` (LB-1).
    pub load_balanced: bool,
    /// Options for every server's pool; `load_balanced` is taken from the field above.
    pub pool: PoolOptions,
}

impl TopologySettings {
    /// Settings for `seeds` with every option at its default.
    pub fn new(seeds: Vec<ServerAddress>) -> TopologySettings {
        TopologySettings {
            seeds,
            replica_set: None,
            direct_connection: false,
            load_balanced: false,
            pool: PoolOptions::default(),
        }
    }

    /// SDAM initial TopologyType: LoadBalanced with `loadBalanced` (LB-3), Single with
    /// `directConnection=true`, ReplicaSetNoPrimary with a `replicaSet`, else Unknown.
    pub fn initial_type(&self) -> TopologyType {
        if self.load_balanced {
            TopologyType::LoadBalanced
        } else if self.direct_connection {
            TopologyType::Single
        } else if self.replica_set.is_some() {
            TopologyType::ReplicaSetNoPrimary
        } else {
            TopologyType::Unknown
        }
    }

    /// SDAM allowed configuration combinations and LB-2.
    fn validate(&self) -> Result<(), SettingsError> {
        let many = self.seeds.len() > 1;
        if self.seeds.is_empty() {
            Err(SettingsError::NoSeeds)
        } else if self.direct_connection && many {
            Err(SettingsError::DirectConnectionWithSeveralSeeds)
        } else if self.load_balanced
            && (many || self.direct_connection || self.replica_set.is_some())
        {
            Err(SettingsError::LoadBalancedConflict)
        } else {
            Ok(())
        }
    }
}

/// Topology settings SDAM or the load-balancer spec forbid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettingsError {
    /// The seed list is empty.
    NoSeeds,
    /// `directConnection=true` with more than one seed.
    DirectConnectionWithSeveralSeeds,
    /// `loadBalanced=true` with more than one seed, `directConnection=true` or a `replicaSet`
    /// (LB-2).
    LoadBalancedConflict,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SettingsError::NoSeeds => "at least one seed address is required",
            SettingsError::DirectConnectionWithSeveralSeeds => {
                "directConnection=true cannot be used with more than one seed"
            }
            SettingsError::LoadBalancedConflict => {
                "loadBalanced=true cannot be used with several seeds, directConnection=true or replicaSet"
            }
        })
    }
}

impl core::error::Error for SettingsError {}

/// The SDAM topology machine (see the module docs).
#[derive(Debug)]
pub struct Topology {
    pub(super) settings: TopologySettings,
    pub(super) description: TopologyDescription,
    pub(super) pools: Vec<Pool>,
    /// Bumped whenever a pool joins or leaves `pools`, which moves their indices (the engine
    /// keeps where each server's pool was; issue 9).
    pub(super) pools_version: u64,
    /// Whether its pools record their monitoring events ([`Topology::set_pool_events`]).
    pub(super) pool_events: bool,
    pub(super) closed: bool,
    pub(super) events: VecDeque<SdamEvent>,
    pub(super) actions: VecDeque<TopologyAction>,
}

impl Topology {
    /// A topology of the seeds, in its initial type, at `now`.
    ///
    /// Publishes the opening events: `TopologyOpening`, a `TopologyDescriptionChanged` from an
    /// empty Unknown topology to the seeds, and one `ServerOpening` per seed. In load-balanced
    /// mode the one server then becomes a LoadBalancer at once, with a `ServerDescriptionChanged`
    /// and a second `TopologyDescriptionChanged`, its pool is ready, and no monitoring is asked
    /// for (LB-3, LB-4).
    pub fn new(mut settings: TopologySettings, now: Instant) -> Result<Topology, SettingsError> {
        settings.validate()?;
        settings.pool.load_balanced = settings.load_balanced;
        let mut description = TopologyDescription::new(settings.initial_type(), Vec::new());
        description.set_name = settings.replica_set.clone();
        let mut topology = Topology {
            pools: Vec::new(),
            pools_version: 0,
            pool_events: true,
            closed: false,
            events: VecDeque::from([SdamEvent::TopologyOpening]),
            actions: VecDeque::new(),
            description,
            settings,
        };
        let empty = TopologyDescription::new(TopologyType::Unknown, Vec::new());
        let seeds = topology.settings.seeds.clone();
        for seed in &seeds {
            topology.add_server(seed.clone());
        }
        topology.description.refresh_derived();
        topology
            .events
            .push_back(SdamEvent::TopologyDescriptionChanged {
                previous: Box::new(empty),
                new: Box::new(topology.description.clone()),
            });
        for seed in seeds {
            topology
                .events
                .push_back(SdamEvent::ServerOpening { address: seed });
        }
        if topology.description.topology_type == TopologyType::LoadBalanced {
            let previous = topology.description.clone();
            if let Some(server) = topology.description.servers.first_mut() {
                *server = ServerDescription::load_balancer(server.address.clone(), now);
            }
            for pool in &mut topology.pools {
                pool.ready(now);
            }
            topology.publish_changes(&previous, None);
        } else {
            topology.actions.extend(
                topology
                    .settings
                    .seeds
                    .iter()
                    .cloned()
                    .map(TopologyAction::StartMonitoring),
            );
        }
        Ok(topology)
    }

    /// The current description.
    pub fn description(&self) -> &TopologyDescription {
        &self.description
    }

    /// The settings.
    pub fn settings(&self) -> &TopologySettings {
        &self.settings
    }

    /// Whether [`Topology::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The pool of the server at `address`, while it is in the topology.
    pub fn pool(&self, address: &ServerAddress) -> Option<&Pool> {
        self.pool_position(address).map(|i| &self.pools[i])
    }

    /// The pool of the server at `address`, to check connections out and in and to drain its
    /// actions and events.
    pub fn pool_mut(&mut self, address: &ServerAddress) -> Option<&mut Pool> {
        self.pool_position(address).map(|i| &mut self.pools[i])
    }

    /// Review38 L7 (house rule 9): the pools are in the servers' order (both join and leave
    /// together), so the description's address index finds a pool in O(log n); checked, with a
    /// scan only when it does not match (a server that left).
    fn pool_position(&self, address: &ServerAddress) -> Option<usize> {
        match self.description.position(address) {
            Some(i) if self.pools.get(i).is_some_and(|p| p.address() == address) => Some(i),
            _ => self.pools.iter().position(|p| p.address() == address),
        }
    }

    /// Every pool, in the order their servers joined.
    pub fn pools(&self) -> impl Iterator<Item = &Pool> {
        self.pools.iter()
    }

    /// Every pool, mutably, in the order their servers joined.
    pub fn pools_mut(&mut self) -> impl Iterator<Item = &mut Pool> {
        self.pools.iter_mut()
    }

    /// Changes whenever a pool joins or leaves [`Topology::pools`] (and so whenever a pool's
    /// index among them may change).
    pub(crate) fn pools_version(&self) -> u64 {
        self.pools_version
    }

    /// Whether its pools, those of servers that join later included, record their monitoring
    /// events ([`Pool::set_record_events`]; issue 9: an engine whose embedder publishes no pool
    /// events has them record none).
    pub(crate) fn set_pool_events(&mut self, on: bool) {
        self.pool_events = on;
        for pool in &mut self.pools {
            pool.set_record_events(on);
        }
    }

    /// The next SDAM monitoring event, in order.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<SdamEvent> {
        self.events.pop_front()
    }

    /// The next thing the owner must do, in order.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<TopologyAction> {
        self.actions.pop_front()
    }

    /// A monitor's `hello` (or legacy hello) to `address` returned `reply` at `now`, with the
    /// server's average RTT after this check.
    ///
    /// The reply becomes a [`ServerDescription`] ([`ServerDescription::from_hello`]) and goes
    /// through the SDAM update rules. A reply from a server no longer in the topology, one older
    /// than the current description by topologyVersion, and any reply in load-balanced mode
    /// (LB-3) are ignored. A reply that is not `ok` or is malformed is a failed check: the server
    /// becomes Unknown and its pool is cleared.
    pub fn handle_hello(
        &mut self,
        address: &ServerAddress,
        reply: &Document,
        average_rtt: Duration,
        now: Instant,
    ) {
        let description = ServerDescription::from_hello(address.clone(), reply, average_rtt, now);
        let failed = description.error.is_some();
        if self.apply_description(description, now) && failed {
            self.clear_pool(
                address,
                None,
                false,
                "the server's monitoring check failed",
                now,
            );
        }
    }

    /// MO-1, MO-2: a connection's handshake to a server returned a valid reply, already read into
    /// `description` (with the RTT to report): it updates the topology like a monitor's `hello`
    /// reply, under the same rules (topologyVersion order, LB-3).
    pub fn handle_handshake(&mut self, description: ServerDescription, now: Instant) {
        self.apply_description(description, now);
    }

    /// A monitor's check of `address` failed at `now` with `error` (the monitoring connection
    /// could not be opened, or its `hello` failed on the network), as the monitor reports it after
    /// its one immediate retry: the server becomes Unknown and its pool is cleared, closing in-use
    /// connections too when the check timed out (server monitoring spec).
    pub fn handle_check_failed(
        &mut self,
        address: &ServerAddress,
        error: &OperationError,
        now: Instant,
    ) {
        let check_error = CheckError::Failed(error.to_string().into());
        let description = ServerDescription::from_check_error(address.clone(), check_error, now);
        if self.apply_description(description, now) {
            let interrupt = matches!(
                &error.kind,
                ErrorKind::Network(n) if n.kind == NetworkErrorKind::Timeout
            );
            self.clear_pool(
                address,
                None,
                interrupt,
                "the server's monitoring check failed",
                now,
            );
        }
    }

    /// Closes the topology (SDAM client closing, LB-4): every server is removed with a
    /// `ServerClosed` event and its pool closed and handed back, the description becomes an empty
    /// Unknown one with a `TopologyDescriptionChanged`, then `TopologyClosed`. Later inputs are
    /// ignored.
    pub fn close(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        let previous = self.description.clone();
        let addresses: Vec<ServerAddress> = self
            .description
            .servers
            .iter()
            .map(|s| s.address.clone())
            .collect();
        for address in addresses {
            self.remove(&address, now);
        }
        self.description.topology_type = TopologyType::Unknown;
        self.description.refresh_derived();
        self.publish_changes(&previous, None);
        self.events.push_back(SdamEvent::TopologyClosed);
        self.closed = true;
    }

    /// SDAM `onServerDescriptionChanged`: replaces the server's description with `new` unless
    /// the server is gone, the topology is load-balanced or closed, or `new` is older by
    /// topologyVersion; then runs the update rules and publishes what changed. Returns whether
    /// `new` was applied.
    pub(super) fn apply_description(&mut self, new: ServerDescription, now: Instant) -> bool {
        if self.closed || self.description.topology_type == TopologyType::LoadBalanced {
            return false;
        }
        let Some(current) = self.description.server(&new.address) else {
            return false;
        };
        let order = TopologyVersion::compare(
            current.topology_version.as_ref(),
            new.topology_version.as_ref(),
        );
        if order == Ordering::Greater {
            return false;
        }
        let previous = self.description.clone();
        let address = new.address.clone();
        self.update(new, now);
        self.description.refresh_derived();
        self.publish_changes(&previous, Some(&address));
        true
    }

    /// The TopologyType table: what a new description does to the topology.
    fn update(&mut self, new: ServerDescription, now: Instant) {
        use ServerType as S;
        use TopologyType as T;
        let address = new.address.clone();
        let server_type = new.server_type;
        if self.description.topology_type == T::Single {
            self.update_single(new, now);
            return;
        }
        self.replace(new.clone());
        if matches!(
            server_type,
            S::Mongos | S::RsPrimary | S::RsSecondary | S::Standalone
        ) {
            self.ready_pool(&new, now);
        }
        match (self.description.topology_type, server_type) {
            (_, S::Unknown | S::RsGhost) if self.is_replica_set() => self.check_if_has_primary(),
            (T::Unknown, S::Unknown | S::RsGhost) | (T::Sharded, S::Unknown | S::Mongos) => {}
            (T::Unknown, S::Standalone) => self.update_unknown_with_standalone(&address, now),
            (T::Unknown, S::Mongos) => self.description.topology_type = T::Sharded,
            (T::Unknown | T::ReplicaSetNoPrimary | T::ReplicaSetWithPrimary, S::RsPrimary) => {
                self.description.topology_type = T::ReplicaSetWithPrimary;
                self.update_rs_from_primary(&new, now);
            }
            (T::Unknown | T::ReplicaSetNoPrimary, S::RsSecondary | S::RsArbiter | S::RsOther) => {
                self.description.topology_type = T::ReplicaSetNoPrimary;
                self.update_rs_without_primary(&new, now);
            }
            (T::ReplicaSetWithPrimary, S::RsSecondary | S::RsArbiter | S::RsOther) => {
                self.update_rs_with_primary_from_member(&new, now);
            }
            // Standalones and mongoses in a replica set, anything but a mongos in a sharded
            // cluster, and a load balancer reported anywhere: not part of this deployment.
            _ => {
                self.remove(&address, now);
                if self.is_replica_set() {
                    self.check_if_has_primary();
                }
            }
        }
    }

    fn is_replica_set(&self) -> bool {
        matches!(
            self.description.topology_type,
            TopologyType::ReplicaSetNoPrimary | TopologyType::ReplicaSetWithPrimary
        )
    }

    /// SDAM TopologyType Single: the one description is always replaced; with a configured
    /// `replicaSet`, a server that reports another set name (or none) is made Unknown. The pool
    /// is ready after any check that found the server (direct connection).
    fn update_single(&mut self, new: ServerDescription, now: Instant) {
        let new = match &self.settings.replica_set {
            Some(expected)
                if new.server_type != ServerType::Unknown
                    && new.set_name.as_deref() != Some(expected.as_str()) =>
            {
                let error = CheckError::WrongSetName {
                    expected: expected.as_str().into(),
                    reported: new.set_name.as_deref().map(Into::into),
                };
                ServerDescription::from_check_error(new.address, error, now)
            }
            _ => new,
        };
        if new.server_type != ServerType::Unknown {
            self.ready_pool(&new, now);
        }
        self.replace(new);
    }

    /// SDAM `updateUnknownWithStandalone`: one seed makes the topology Single; with several the
    /// standalone is not part of the intended deployment and is removed.
    fn update_unknown_with_standalone(&mut self, address: &ServerAddress, now: Instant) {
        if self.settings.seeds.len() == 1 {
            self.description.topology_type = TopologyType::Single;
        } else {
            self.remove(address, now);
        }
    }

    /// Adopts `reported` as the set name if none is known yet; false when it differs from the
    /// known one (the server belongs to another set).
    fn accept_set_name(&mut self, reported: Option<&String>) -> bool {
        match &self.description.set_name {
            None => {
                self.description.set_name = reported.cloned();
                true
            }
            Some(known) => Some(known) == reported,
        }
    }

    /// Whether `me` contradicts the address the client uses (only a reported `me` counts).
    fn me_mismatch(description: &ServerDescription) -> bool {
        description
            .me
            .as_ref()
            .is_some_and(|me| me != &description.address)
    }

    /// SDAM `updateRSWithoutPrimary`, for a secondary, arbiter or other member while no primary is
    /// known: check the set name, add the members it reports, and drop it if `me` says it is
    /// known under another address. (The `primary` hint only orders a single-threaded client's
    /// scan, so this machine does not keep a PossiblePrimary type.)
    fn update_rs_without_primary(&mut self, new: &ServerDescription, now: Instant) {
        if !self.accept_set_name(new.set_name.as_ref()) {
            self.remove(&new.address, now);
            return;
        }
        self.add_members(new);
        if Self::me_mismatch(new) {
            self.remove(&new.address, now);
        }
    }

    /// SDAM `updateRSWithPrimaryFromMember`: a member that belongs to another set or goes by
    /// another name is removed; if the primary is gone (this member may have been it), the
    /// topology has no primary.
    fn update_rs_with_primary_from_member(&mut self, new: &ServerDescription, now: Instant) {
        if self.description.set_name != new.set_name || Self::me_mismatch(new) {
            self.remove(&new.address, now);
        }
        self.check_if_has_primary();
    }

    /// SDAM `updateRSFromPrimary`: set name check, stale-primary detection by
    /// `(electionId, setVersion)`, demotion of any other primary, then the primary's member list
    /// becomes the topology's server list.
    fn update_rs_from_primary(&mut self, new: &ServerDescription, now: Instant) {
        if !self.accept_set_name(new.set_name.as_ref()) {
            self.remove(&new.address, now);
            self.check_if_has_primary();
            return;
        }
        if self.is_stale_primary(new) {
            self.replace(ServerDescription::from_check_error(
                new.address.clone(),
                CheckError::StalePrimary,
                now,
            ));
            self.check_if_has_primary();
            return;
        }
        let demoted: Vec<ServerAddress> = self
            .description
            .servers
            .iter()
            .filter(|s| s.server_type == ServerType::RsPrimary && s.address != new.address)
            .map(|s| s.address.clone())
            .collect();
        for address in demoted {
            // The old primary's pool is left alone; a monitor re-check finds what it is now.
            self.replace(ServerDescription::from_check_error(
                address.clone(),
                CheckError::NewerPrimary,
                now,
            ));
            self.actions.push_back(TopologyAction::CheckNow(address));
        }
        self.add_members(new);
        let gone: Vec<ServerAddress> = self
            .description
            .servers
            .iter()
            .filter(|s| !new.members().any(|m| m == &s.address))
            .map(|s| s.address.clone())
            .collect();
        for address in gone {
            self.remove(&address, now);
        }
        self.check_if_has_primary();
    }

    /// Whether a primary's `(electionId, setVersion)` is older than the newest seen; if not, it
    /// becomes the newest.
    ///
    /// From MongoDB 6.0 (wire version 17) the election id orders first and a missing value is
    /// older than any present one. Before 6.0 the set version orders first and only a primary
    /// reporting both values can be stale; the maximum set version never goes down.
    fn is_stale_primary(&mut self, new: &ServerDescription) -> bool {
        const WIRE_VERSION_6_0: i32 = 17;
        let topology = &mut self.description;
        if new.max_wire_version >= WIRE_VERSION_6_0 {
            let reported = (new.election_id, new.set_version);
            if reported < (topology.max_election_id, topology.max_set_version) {
                return true;
            }
            (topology.max_election_id, topology.max_set_version) = reported;
            return false;
        }
        if let (Some(set_version), Some(election_id)) = (new.set_version, new.election_id) {
            if let (Some(max_set_version), Some(max_election_id)) =
                (topology.max_set_version, topology.max_election_id)
            {
                if (max_set_version, max_election_id) > (set_version, election_id) {
                    return true;
                }
            }
            topology.max_election_id = Some(election_id);
        }
        if let Some(set_version) = new.set_version {
            if topology.max_set_version.is_none_or(|max| set_version > max) {
                topology.max_set_version = Some(set_version);
            }
        }
        false
    }

    /// SDAM `checkIfHasPrimary`.
    fn check_if_has_primary(&mut self) {
        let has_primary = self
            .description
            .servers
            .iter()
            .any(|s| s.server_type == ServerType::RsPrimary);
        self.description.topology_type = if has_primary {
            TopologyType::ReplicaSetWithPrimary
        } else {
            TopologyType::ReplicaSetNoPrimary
        };
    }

    /// Adds every member `reporter` lists that the topology does not have yet, as Unknown.
    fn add_members(&mut self, reporter: &ServerDescription) {
        for member in reporter.members() {
            if self.description.server(member).is_none() {
                self.add_server(member.clone());
                self.actions
                    .push_back(TopologyAction::StartMonitoring(member.clone()));
            }
        }
    }

    /// A new Unknown server with a paused pool.
    pub(super) fn add_server(&mut self, address: ServerAddress) {
        if self.description.server(&address).is_some() {
            return;
        }
        let mut pool = Pool::new(address.clone(), self.settings.pool.clone());
        pool.set_record_events(self.pool_events);
        self.pools.push(pool);
        self.pools_version += 1;
        self.description
            .push_server(ServerDescription::unknown(address));
    }

    /// SDAM `remove`: the server leaves the topology; its monitor stops and its pool is closed
    /// and handed to the owner.
    pub(super) fn remove(&mut self, address: &ServerAddress, now: Instant) {
        self.description.remove_server(address);
        if let Some(index) = self.pools.iter().position(|p| p.address() == address) {
            let mut pool = self.pools.remove(index);
            self.pools_version += 1;
            pool.close(now);
            self.actions.push_back(TopologyAction::StopMonitoring {
                address: address.clone(),
                pool: Box::new(pool),
            });
        }
    }

    /// Puts `new` in place of the description with the same address.
    fn replace(&mut self, new: ServerDescription) {
        if let Some(i) = self.description.position(&new.address) {
            self.description.servers[i] = new;
        }
    }

    /// CM-2: SDAM readies the pool of a server a check found, unless the server is
    /// incompatible (SS-16 step 2, review35 Z1). Selection never picks such a server, and every
    /// connection its pool opened would refuse the handshake, mark the server Unknown and drop
    /// the compatibility error, so its pool stays paused: a ready one (the server was compatible
    /// before) is cleared, which pauses it.
    fn ready_pool(&mut self, server: &ServerDescription, now: Instant) {
        let Some(reason) = incompatibility(server) else {
            if let Some(pool) = self.pool_mut(&server.address) {
                pool.ready(now);
            }
            return;
        };
        if self
            .pool_mut(&server.address)
            .is_some_and(|pool| pool.state() == PoolState::Ready)
        {
            self.clear_pool(&server.address, None, false, &reason, now);
        }
    }

    /// Clears the pool of `address` (only `service_id`'s connections in load-balanced mode).
    pub(super) fn clear_pool(
        &mut self,
        address: &ServerAddress,
        service_id: Option<bson::oid::ObjectId>,
        interrupt_in_use_connections: bool,
        cause: &str,
        now: Instant,
    ) {
        if let Some(pool) = self.pool_mut(address) {
            pool.clear(service_id, interrupt_in_use_connections, cause, now);
        }
    }

    /// Publishes the events of one update, comparing with the description before it: a
    /// `ServerDescriptionChanged` for each server whose description changed (the `checked` one
    /// first), a `ServerOpening` for each new server, a `ServerClosed` for each removed one, then
    /// a `TopologyDescriptionChanged` if anything changed at all.
    pub(super) fn publish_changes(
        &mut self,
        previous: &TopologyDescription,
        checked: Option<&ServerAddress>,
    ) {
        let before = self.events.len();
        let servers = &self.description.servers;
        let checked_first = servers
            .iter()
            .filter(|s| Some(&s.address) == checked)
            .chain(servers.iter().filter(|s| Some(&s.address) != checked));
        for server in checked_first {
            if let Some(old) = previous.server(&server.address) {
                if !old.is_equivalent_to(server) {
                    self.events.push_back(SdamEvent::ServerDescriptionChanged {
                        address: server.address.clone(),
                        previous: Box::new(old.clone()),
                        new: Box::new(server.clone()),
                    });
                }
            }
        }
        for server in servers {
            if previous.server(&server.address).is_none() {
                self.events.push_back(SdamEvent::ServerOpening {
                    address: server.address.clone(),
                });
            }
        }
        for old in &previous.servers {
            if self.description.server(&old.address).is_none() {
                self.events.push_back(SdamEvent::ServerClosed {
                    address: old.address.clone(),
                });
            }
        }
        let topology_changed = self.events.len() > before
            || previous.topology_type != self.description.topology_type
            || previous.set_name != self.description.set_name
            || previous.max_set_version != self.description.max_set_version
            || previous.max_election_id != self.description.max_election_id;
        if topology_changed {
            self.events
                .push_back(SdamEvent::TopologyDescriptionChanged {
                    previous: Box::new(previous.clone()),
                    new: Box::new(self.description.clone()),
                });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{PoolEvent, PoolState};
    use crate::topology::fixtures::{addr, drain, hello, primary, secondary, topology};
    use bson::doc;
    use bson::oid::ObjectId;

    /// A monitoring check's network error (labelled as establishment errors are; the topology
    /// ignores labels on monitoring failures).
    fn check_error(kind: NetworkErrorKind) -> OperationError {
        OperationError::network(kind, crate::error::NetworkPhase::Handshake, addr("a"))
    }

    fn oid(n: u8) -> ObjectId {
        ObjectId::from_bytes([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, n])
    }

    #[test]
    fn lb_2_forbidden_settings_are_rejected_with_a_typed_error() {
        let two = alloc::vec![addr("a"), addr("b")];
        let lb = |seeds: Vec<ServerAddress>| TopologySettings {
            load_balanced: true,
            ..TopologySettings::new(seeds)
        };
        assert_eq!(
            Topology::new(lb(two.clone()), Instant::ZERO).err(),
            Some(SettingsError::LoadBalancedConflict)
        );
        let with_set = TopologySettings {
            replica_set: Some("rs".into()),
            ..lb(alloc::vec![addr("a")])
        };
        assert_eq!(
            Topology::new(with_set, Instant::ZERO).err(),
            Some(SettingsError::LoadBalancedConflict)
        );
        let direct = TopologySettings {
            direct_connection: true,
            ..TopologySettings::new(two)
        };
        assert_eq!(
            Topology::new(direct, Instant::ZERO).err(),
            Some(SettingsError::DirectConnectionWithSeveralSeeds)
        );
        assert_eq!(
            Topology::new(TopologySettings::new(Vec::new()), Instant::ZERO).err(),
            Some(SettingsError::NoSeeds)
        );
    }

    #[test]
    fn lb_3_load_balanced_mode_starts_ready_ignores_hellos_and_never_monitors() {
        let settings = TopologySettings {
            load_balanced: true,
            ..TopologySettings::new(alloc::vec![addr("lb")])
        };
        let mut t = Topology::new(settings, Instant::ZERO).expect("valid");
        assert!(t.poll_action().is_none());
        assert_eq!(t.pool(&addr("lb")).map(Pool::state), Some(PoolState::Ready));
        drain(&mut t);
        t.handle_hello(
            &addr("lb"),
            &doc! {"ok": 1, "msg": "isdbgrid"},
            Duration::ZERO,
            Instant::ZERO,
        );
        t.handle_check_failed(
            &addr("lb"),
            &check_error(NetworkErrorKind::Reset),
            Instant::ZERO,
        );
        assert_eq!(
            t.description().servers[0].server_type,
            ServerType::LoadBalancer
        );
        assert!(t.poll_event().is_none());
        assert!(t.description().supports_sessions());
    }

    #[test]
    fn lb_4_close_removes_every_server_then_closes_the_topology() {
        let settings = TopologySettings {
            load_balanced: true,
            ..TopologySettings::new(alloc::vec![addr("lb")])
        };
        let mut t = Topology::new(settings, Instant::ZERO).expect("valid");
        drain(&mut t);
        t.close(Instant::from_millis(5));
        let events: Vec<SdamEvent> = core::iter::from_fn(|| t.poll_event()).collect();
        assert!(matches!(
            events.as_slice(),
            [
                SdamEvent::ServerClosed { address },
                SdamEvent::TopologyDescriptionChanged { new, .. },
                SdamEvent::TopologyClosed,
            ] if address == &addr("lb") && new.topology_type == TopologyType::Unknown && new.servers.is_empty()
        ));
        match t.poll_action() {
            Some(TopologyAction::StopMonitoring { address, mut pool }) => {
                assert_eq!(address, addr("lb"));
                assert_eq!(pool.state(), PoolState::Closed);
                assert!(
                    core::iter::from_fn(|| pool.poll_event()).any(|e| e == PoolEvent::PoolClosed)
                );
            }
            other => panic!("expected the closed pool, got {other:?}"),
        }
        t.close(Instant::from_millis(6));
        assert!(t.poll_event().is_none());
    }

    #[test]
    fn a_primary_adds_its_members_and_removes_the_rest_with_monitoring_actions() {
        let mut t = topology(&["a", "x"], Some("rs"));
        drain(&mut t);
        t.handle_hello(
            &addr("a"),
            &primary("rs", &["a", "b"]),
            Duration::ZERO,
            Instant::ZERO,
        );
        let actions: Vec<TopologyAction> = core::iter::from_fn(|| t.poll_action()).collect();
        assert!(matches!(
            actions.as_slice(),
            [TopologyAction::StartMonitoring(b), TopologyAction::StopMonitoring { address: x, .. }]
                if b == &addr("b") && x == &addr("x")
        ));
        let servers: Vec<_> = t
            .description()
            .servers
            .iter()
            .map(|s| s.address.clone())
            .collect();
        assert_eq!(servers, [addr("a"), addr("b")]);
        assert_eq!(t.pool(&addr("a")).map(Pool::state), Some(PoolState::Ready));
        assert_eq!(t.pool(&addr("b")).map(Pool::state), Some(PoolState::Paused));
        assert!(t.pool(&addr("x")).is_none());
        // A late reply from the removed server changes nothing.
        drain(&mut t);
        t.handle_hello(
            &addr("x"),
            &primary("rs", &["x"]),
            Duration::ZERO,
            Instant::ZERO,
        );
        assert!(t.poll_event().is_none());
        assert_eq!(
            t.description().topology_type,
            TopologyType::ReplicaSetWithPrimary
        );
    }

    #[test]
    fn one_update_publishes_changes_then_openings_then_closings_then_the_topology() {
        let mut t = topology(&["a", "x"], None);
        drain(&mut t);
        t.handle_hello(
            &addr("a"),
            &primary("rs", &["a", "b"]),
            Duration::ZERO,
            Instant::ZERO,
        );
        let events: Vec<SdamEvent> = core::iter::from_fn(|| t.poll_event()).collect();
        assert!(
            matches!(
                events.as_slice(),
                [
                    SdamEvent::ServerDescriptionChanged { address: a, previous, new },
                    SdamEvent::ServerOpening { address: b },
                    SdamEvent::ServerClosed { address: x },
                    SdamEvent::TopologyDescriptionChanged { previous: before, new: after },
                ] if a == &addr("a")
                    && previous.server_type == ServerType::Unknown
                    && new.server_type == ServerType::RsPrimary
                    && b == &addr("b")
                    && x == &addr("x")
                    && before.topology_type == TopologyType::Unknown
                    && after.topology_type == TopologyType::ReplicaSetWithPrimary
                    && after.set_name.as_deref() == Some("rs")
            ),
            "{events:?}"
        );
    }

    #[test]
    fn a_new_primary_demotes_the_old_one_asks_for_a_check_and_leaves_its_pool_alone() {
        let mut t = topology(&["a", "b"], Some("rs"));
        let mut a = primary("rs", &["a", "b"]);
        a.insert("electionId", oid(1));
        a.insert("setVersion", 1);
        t.handle_hello(&addr("a"), &a, Duration::ZERO, Instant::ZERO);
        drain(&mut t);
        let mut b = primary("rs", &["a", "b"]);
        b.insert("electionId", oid(2));
        b.insert("setVersion", 1);
        t.handle_hello(&addr("b"), &b, Duration::ZERO, Instant::ZERO);
        let old = t.description().server(&addr("a")).expect("kept");
        assert_eq!(old.server_type, ServerType::Unknown);
        assert_eq!(old.error, Some(CheckError::NewerPrimary));
        assert!(matches!(t.poll_action(), Some(TopologyAction::CheckNow(a)) if a == addr("a")));
        assert_eq!(t.pool(&addr("a")).map(Pool::generation), Some(0));
        assert_eq!(t.pool(&addr("a")).map(Pool::state), Some(PoolState::Ready));
        // The old primary still claiming primacy with the older election id is stale.
        t.handle_hello(&addr("a"), &a, Duration::ZERO, Instant::ZERO);
        let a_now = t.description().server(&addr("a")).expect("kept");
        assert_eq!(a_now.error, Some(CheckError::StalePrimary));
        assert_eq!(t.description().max_election_id, Some(oid(2)));
    }

    #[test]
    fn from_6_0_a_primary_without_election_id_is_stale_but_before_6_0_it_is_not() {
        for (wire, stale) in [(17, true), (16, false)] {
            let mut t = topology(&["a", "b"], Some("rs"));
            let mut a = primary("rs", &["a", "b"]);
            a.insert("electionId", oid(1));
            a.insert("setVersion", 1);
            a.insert("maxWireVersion", wire);
            t.handle_hello(&addr("a"), &a, Duration::ZERO, Instant::ZERO);
            let mut b = primary("rs", &["a", "b"]);
            b.insert("setVersion", 2);
            b.insert("maxWireVersion", wire);
            t.handle_hello(&addr("b"), &b, Duration::ZERO, Instant::ZERO);
            let b_type = t.description().server(&addr("b")).map(|s| s.server_type);
            let expected = if stale {
                ServerType::Unknown
            } else {
                ServerType::RsPrimary
            };
            assert_eq!(b_type, Some(expected), "wire version {wire}");
            let max_set_version = if stale { 1 } else { 2 };
            assert_eq!(t.description().max_set_version, Some(max_set_version));
        }
    }

    #[test]
    fn a_reply_older_by_topology_version_is_ignored() {
        let mut t = topology(&["a"], Some("rs"));
        let process = oid(9);
        let mut newer = primary("rs", &["a"]);
        newer.insert(
            "topologyVersion",
            doc! {"processId": process, "counter": 2_i64},
        );
        t.handle_hello(&addr("a"), &newer, Duration::ZERO, Instant::ZERO);
        drain(&mut t);
        let mut older = secondary("rs", &["a"]);
        older.insert(
            "topologyVersion",
            doc! {"processId": process, "counter": 1_i64},
        );
        t.handle_hello(&addr("a"), &older, Duration::ZERO, Instant::from_millis(1));
        assert!(t.poll_event().is_none());
        assert_eq!(
            t.description().topology_type,
            TopologyType::ReplicaSetWithPrimary
        );
        // A new process id is always newer.
        older.insert(
            "topologyVersion",
            doc! {"processId": oid(10), "counter": 0_i64},
        );
        t.handle_hello(&addr("a"), &older, Duration::ZERO, Instant::from_millis(2));
        assert_eq!(
            t.description().topology_type,
            TopologyType::ReplicaSetNoPrimary
        );
    }

    #[test]
    fn a_check_timeout_clears_the_pool_and_interrupts_in_use_connections() {
        let mut t = topology(&["a"], None);
        t.handle_hello(
            &addr("a"),
            &hello(doc! {"msg": "isdbgrid"}),
            Duration::ZERO,
            Instant::ZERO,
        );
        let pool = t.pool_mut(&addr("a")).expect("pool");
        while pool.poll_event().is_some() {}
        t.handle_check_failed(
            &addr("a"),
            &check_error(NetworkErrorKind::Timeout),
            Instant::from_millis(1),
        );
        assert_eq!(t.description().servers[0].server_type, ServerType::Unknown);
        let pool = t.pool_mut(&addr("a")).expect("pool");
        assert_eq!(pool.generation(), 1);
        assert_eq!(
            pool.poll_event(),
            Some(PoolEvent::PoolCleared {
                service_id: None,
                interrupt_in_use_connections: true
            })
        );
        // A hello that is not ok is a failed check too, but not a timeout.
        t.handle_hello(
            &addr("a"),
            &hello(doc! {"msg": "isdbgrid"}),
            Duration::ZERO,
            Instant::from_millis(2),
        );
        t.handle_hello(
            &addr("a"),
            &doc! {"ok": 0, "code": 91},
            Duration::ZERO,
            Instant::from_millis(3),
        );
        let pool = t.pool_mut(&addr("a")).expect("pool");
        assert_eq!(pool.generation(), 2);
        assert!(core::iter::from_fn(|| pool.poll_event()).any(|e| e
            == PoolEvent::PoolCleared {
                service_id: None,
                interrupt_in_use_connections: false
            }));
    }

    #[test]
    fn a_sharded_cluster_keeps_mongoses_and_unknowns_and_removes_everything_else() {
        let replies = [
            hello(doc! {"isreplicaset": true}),
            hello(doc! {}),
            primary("rs", &["a"]),
            secondary("rs", &["a"]),
        ];
        for reply in replies {
            let mut t = topology(&["a", "b"], None);
            t.handle_hello(
                &addr("a"),
                &hello(doc! {"msg": "isdbgrid"}),
                Duration::ZERO,
                Instant::ZERO,
            );
            t.handle_check_failed(
                &addr("a"),
                &check_error(NetworkErrorKind::Reset),
                Instant::ZERO,
            );
            assert_eq!(t.description().topology_type, TopologyType::Sharded);
            assert_eq!(t.description().servers.len(), 2, "{reply}");
            t.handle_hello(&addr("b"), &reply, Duration::ZERO, Instant::ZERO);
            assert_eq!(
                t.description().topology_type,
                TopologyType::Sharded,
                "{reply}"
            );
            let servers: Vec<_> = t
                .description()
                .servers
                .iter()
                .map(|s| s.address.clone())
                .collect();
            assert_eq!(servers, [addr("a")], "{reply}");
        }
    }

    #[test]
    fn single_with_a_set_name_makes_a_server_of_another_set_unknown() {
        let settings = TopologySettings {
            direct_connection: true,
            replica_set: Some("rs".into()),
            ..TopologySettings::new(alloc::vec![addr("a")])
        };
        let mut t = Topology::new(settings, Instant::ZERO).expect("valid");
        t.handle_hello(
            &addr("a"),
            &secondary("other", &["a"]),
            Duration::ZERO,
            Instant::ZERO,
        );
        let a = &t.description().servers[0];
        assert_eq!(t.description().topology_type, TopologyType::Single);
        assert_eq!(a.server_type, ServerType::Unknown);
        assert!(a
            .error
            .as_ref()
            .is_some_and(|e| e.to_string().contains("\"other\"")));
        assert_eq!(t.pool(&addr("a")).map(Pool::state), Some(PoolState::Paused));
        t.handle_hello(
            &addr("a"),
            &secondary("rs", &["a"]),
            Duration::ZERO,
            Instant::ZERO,
        );
        assert_eq!(
            t.description().servers[0].server_type,
            ServerType::RsSecondary
        );
        assert_eq!(t.pool(&addr("a")).map(Pool::state), Some(PoolState::Ready));
    }

    #[test]
    fn a_secondary_with_a_mismatched_me_is_removed_but_a_missing_me_is_not() {
        let mut t = topology(&["a", "b"], Some("rs"));
        let mut b = secondary("rs", &["a", "b"]);
        t.handle_hello(&addr("b"), &b, Duration::ZERO, Instant::ZERO);
        assert!(t.description().server(&addr("b")).is_some());
        b.insert("me", "c:27017");
        t.handle_hello(&addr("b"), &b, Duration::ZERO, Instant::ZERO);
        assert!(t.description().server(&addr("b")).is_none());
        assert!(t.description().server(&addr("c")).is_none());
    }

    #[test]
    fn an_identical_reply_publishes_nothing_but_refreshes_the_description() {
        let mut t = topology(&["a"], None);
        let reply = hello(doc! {"msg": "isdbgrid"});
        t.handle_hello(&addr("a"), &reply, Duration::from_millis(3), Instant::ZERO);
        drain(&mut t);
        t.handle_hello(
            &addr("a"),
            &reply,
            Duration::from_millis(4),
            Instant::from_millis(9),
        );
        assert!(t.poll_event().is_none());
        let a = &t.description().servers[0];
        assert_eq!(a.last_update_time, Instant::from_millis(9));
        assert_eq!(a.average_rtt.get(), Some(Duration::from_millis(4)));
    }

    mod properties {
        use super::*;
        use crate::error::NetworkPhase;
        use crate::topology::{ErrorContext, ErrorHandling};
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Input {
            Hello(u8, Document),
            CheckFailed(u8, bool),
            Error(u8, u8, u32, bool),
        }

        const HOSTS: [&str; 4] = ["a", "b", "c", "d"];

        fn reply() -> impl Strategy<Value = Document> {
            let hosts = prop::sample::subsequence(HOSTS.to_vec(), 0..=4);
            (
                0..8u8,
                hosts,
                prop::option::of(0..3u8),
                prop::option::of(0..3i32),
                0..3u8,
                prop::option::of(0..3i64),
                15..19i32,
            )
                .prop_map(
                    |(kind, hosts, election, set_version, set, counter, wire)| {
                        let mut d = doc! {"ok": 1, "maxWireVersion": wire};
                        match kind {
                            0 => {
                                d.insert("msg", "isdbgrid");
                            }
                            1 => {}
                            2 => {
                                d.insert("isreplicaset", true);
                            }
                            3 => {
                                d.insert("isWritablePrimary", true);
                            }
                            4 => {
                                d.insert("secondary", true);
                            }
                            5 => {
                                d.insert("arbiterOnly", true);
                            }
                            6 => {
                                d.insert("ok", 0);
                            }
                            _ => {
                                d.insert("hidden", true);
                            }
                        }
                        if kind >= 3 {
                            d.insert("setName", ["rs", "rs", "other"][usize::from(set)]);
                        }
                        let hosts: Vec<String> =
                            hosts.iter().map(|h| alloc::format!("{h}:27017")).collect();
                        d.insert("hosts", hosts);
                        if let Some(e) = election {
                            d.insert("electionId", oid(e));
                        }
                        if let Some(v) = set_version {
                            d.insert("setVersion", v);
                        }
                        if let Some(c) = counter {
                            d.insert("topologyVersion", doc! {"processId": oid(1), "counter": c});
                        }
                        d
                    },
                )
        }

        fn input() -> impl Strategy<Value = Input> {
            prop_oneof![
                (0..4u8, reply()).prop_map(|(h, r)| Input::Hello(h, r)),
                (0..4u8, any::<bool>()).prop_map(|(h, t)| Input::CheckFailed(h, t)),
                (0..4u8, 0..4u8, 0..3u32, any::<bool>())
                    .prop_map(|(h, e, g, c)| Input::Error(h, e, g, c)),
            ]
        }

        fn error(kind: u8, address: &ServerAddress) -> OperationError {
            match kind {
                0 => OperationError::network(
                    NetworkErrorKind::Reset,
                    NetworkPhase::AfterSend,
                    address.clone(),
                ),
                1 => OperationError::network(
                    NetworkErrorKind::Timeout,
                    NetworkPhase::Handshake,
                    address.clone(),
                ),
                2 => {
                    OperationError::from_reply(&doc! {"ok": 0, "code": 91}, address).expect("error")
                }
                _ => OperationError::from_reply(&doc! {"ok": 0, "errmsg": "not master"}, address)
                    .expect("error"),
            }
        }

        proptest! {
            /// Any sequence of replies, failed checks and application errors keeps the machine's
            /// invariants: one description and one pool per server, the topology type agrees with
            /// the servers, and every event sequence after an input ends with a topology change.
            #[test]
            fn the_update_rules_keep_their_invariants(
                mode in 0..4u8,
                seeds in 1..4usize,
                inputs in prop::collection::vec(input(), 0..24),
            ) {
                // 0: seeds only; 1: replicaSet=rs; 2: directConnection=true; 3: loadBalanced=true.
                let set = (mode == 1).then_some("rs");
                let seeds = if mode >= 2 { 1 } else { seeds };
                let settings = TopologySettings {
                    replica_set: set.map(String::from),
                    direct_connection: mode == 2,
                    load_balanced: mode == 3,
                    ..TopologySettings::new(HOSTS[..seeds].iter().map(|h| addr(h)).collect())
                };
                let initial = settings.initial_type();
                let mut t = Topology::new(settings, Instant::ZERO).expect("valid settings");
                drain(&mut t);
                for (i, input) in inputs.into_iter().enumerate() {
                    let now = Instant::from_millis(i as u64);
                    match input {
                        Input::Hello(h, r) => t.handle_hello(&addr(HOSTS[usize::from(h)]), &r, Duration::ZERO, now),
                        Input::CheckFailed(h, timeout) => {
                            let kind = if timeout { NetworkErrorKind::Timeout } else { NetworkErrorKind::Reset };
                            t.handle_check_failed(&addr(HOSTS[usize::from(h)]), &check_error(kind), now);
                        }
                        Input::Error(h, kind, generation, handshake_completed) => {
                            let a = addr(HOSTS[usize::from(h)]);
                            let context = ErrorContext { generation, service_id: None, handshake_completed };
                            let handled = t.handle_application_error(&a, &error(kind, &a), context, now);
                            if t.description().server(&a).is_none() {
                                prop_assert_eq!(handled, ErrorHandling::Ignored);
                            }
                        }
                    }
                    let d = t.description();
                    prop_assert_eq!(d.servers.len(), t.pools.len());
                    for (s, p) in d.servers.iter().zip(&t.pools) {
                        prop_assert_eq!(&s.address, p.address());
                    }
                    let primaries = d.servers.iter().filter(|s| s.server_type == ServerType::RsPrimary).count();
                    prop_assert!(primaries <= 1);
                    match d.topology_type {
                        TopologyType::ReplicaSetWithPrimary => prop_assert_eq!(primaries, 1),
                        TopologyType::ReplicaSetNoPrimary | TopologyType::Sharded => prop_assert_eq!(primaries, 0),
                        TopologyType::Single => prop_assert_eq!(d.servers.len(), 1),
                        TopologyType::LoadBalanced => {
                            prop_assert_eq!(d.servers.len(), 1);
                            prop_assert_eq!(d.servers[0].server_type, ServerType::LoadBalancer);
                        }
                        TopologyType::Unknown => {}
                    }
                    // Single and LoadBalanced never change type (SDAM, LB-3).
                    if matches!(initial, TopologyType::Single | TopologyType::LoadBalanced) {
                        prop_assert_eq!(d.topology_type, initial);
                    }
                    if set.is_some() && d.topology_type != TopologyType::Single {
                        prop_assert_eq!(d.set_name.as_deref(), Some("rs"));
                    }
                    let events: Vec<SdamEvent> = core::iter::from_fn(|| t.poll_event()).collect();
                    if let Some(last) = events.last() {
                        prop_assert!(matches!(last, SdamEvent::TopologyDescriptionChanged { .. }), "the last event was {:?}", last);
                    }
                    while t.poll_action().is_some() {}
                }
            }
        }
    }
}
