//! Server and topology types and descriptions, as SDAM defines them.
//!
//! The retry machine needs to know what kind of deployment an attempt ran against (sharded
//! clusters always deprioritize the failed mongos, BP-20; retryable writes need a server that
//! supports sessions, RW-2). Selection reads the [`TopologyDescription`]; each
//! [`ServerDescription`] is built from a `hello` reply ([`ServerDescription::from_hello`]). The
//! [`Topology`] machine maintains a description by the SDAM update rules, owns one connection pool
//! per server, applies application errors by the SDAM error handling, and publishes SDAM events.

mod description;
mod error_handling;
mod event;
#[cfg(test)]
mod fixtures;
mod rtt;
mod server;
mod srv_polling;
mod tags;
mod update;

pub(crate) use description::incompatibility;
pub use description::{
    TopologyDescription, MAX_SUPPORTED_WIRE_VERSION, MIN_SUPPORTED_WIRE_VERSION,
};
pub use error_handling::{ErrorContext, ErrorHandling, StateChange};
pub use event::{SdamEvent, TopologyAction};
pub use rtt::AverageRtt;
pub use server::{CheckError, ServerDescription, TopologyVersion};
pub use srv_polling::{choose_srv_hosts, SrvPoller, SrvPollingOptions, MIN_RESCAN_INTERVAL};
pub use tags::TagSet;
pub use update::{SettingsError, Topology, TopologySettings};

/// The type of one server, from its `hello` reply (SDAM).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ServerType {
    /// Not yet checked, or the last check failed.
    #[default]
    Unknown,
    /// A mongod that is not a replica-set member.
    Standalone,
    /// A mongos router.
    Mongos,
    /// The primary of a replica set.
    RsPrimary,
    /// A secondary of a replica set.
    RsSecondary,
    /// An arbiter.
    RsArbiter,
    /// Any other replica-set member (hidden, starting up, recovering, ...).
    RsOther,
    /// A member not yet configured into a replica set.
    RsGhost,
    /// A load balancer in front of mongos (load-balanced mode).
    LoadBalancer,
}

/// The type of a deployment (SDAM).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum TopologyType {
    /// Not yet known.
    #[default]
    Unknown,
    /// A direct connection to one server.
    Single,
    /// A replica set with no known primary.
    ReplicaSetNoPrimary,
    /// A replica set with a known primary.
    ReplicaSetWithPrimary,
    /// A sharded cluster (one or more mongos).
    Sharded,
    /// Load-balanced mode: one load balancer in front of mongos.
    LoadBalanced,
}

impl TopologyType {
    /// Whether this is a sharded cluster: retries there always go to another mongos when one is
    /// available (BP-20, RR-7, RW-13).
    pub fn is_sharded(self) -> bool {
        self == TopologyType::Sharded
    }
}
