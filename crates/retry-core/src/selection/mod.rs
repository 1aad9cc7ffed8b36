//! Server selection (SS-*), with deprioritization and maximum staleness (MS-*), as pure functions
//! and one small machine.
//!
//! The pipeline, in order (docs/server-selection.md walks through it):
//!
//! 1. validate the read preference against the topology (SS-2) and check wire compatibility
//!    (SS-16 step 2);
//! 2. find the suitable servers, avoiding deprioritized addresses unless nothing else is suitable
//!    ([`suitable_servers`]: SS-11, with SS-3..SS-9 inside);
//! 3. keep the latency window ([`retain_latency_window`]: SS-13);
//! 4. pick one by the power of two choices on operation counts ([`choose_by_operation_count`]:
//!    SS-15).
//!
//! [`select_server`] runs the pipeline once; [`RepeatedSelection`] runs it many times against one
//! topology that does not change, remembering what does not depend on the call. [`ServerSelection`]
//! is the selection loop (SS-16): it
//! keeps the criteria and the deprioritized set across waits for a topology change and fails at its
//! deadline. Nothing here allocates for topologies of up to [`INLINE_SERVERS`] servers, except
//! the error of a failed selection.

mod process;
mod read_preference;
mod repeated;
mod suitability;
mod window;

use core::fmt;
use core::time::Duration;

use rand_core::RngCore;
use smallvec::SmallVec;

use crate::address::ServerAddress;
use crate::topology::{ServerDescription, TopologyDescription};

pub use process::{SelectionError, SelectionStep, ServerSelection};
pub use read_preference::{
    ReadPreference, ReadPreferenceError, ReadPreferenceMode, IDLE_WRITE_PERIOD,
    SMALLEST_MAX_STALENESS,
};
pub use repeated::RepeatedSelection;
pub use suitability::suitable_servers;
pub use window::{choose_by_operation_count, retain_latency_window};

/// How many servers a [`ServerList`] holds before it spills to the heap.
pub const INLINE_SERVERS: usize = 16;

/// A list of servers borrowed from a topology; inline (no allocation) up to [`INLINE_SERVERS`].
pub type ServerList<'a> = SmallVec<[&'a ServerDescription; INLINE_SERVERS]>;

/// What a server is selected for (SS-7, SS-10): a read with its read preference, or a write.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SelectionCriteria {
    /// A read (including generic commands, SS-10).
    Read(ReadPreference),
    /// A write: the primary, a mongos, the single server or the load balancer (SS-7).
    Write,
}

impl fmt::Display for SelectionCriteria {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SelectionCriteria::Read(rp) => write!(f, "read with read preference {rp}"),
            SelectionCriteria::Write => f.write_str("write"),
        }
    }
}

/// The client-level options of server selection (SS-1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SelectionSettings {
    /// `localThresholdMS`: the width of the latency window (SS-13). Default 15 ms.
    pub local_threshold: Duration,
    /// `serverSelectionTimeoutMS`: how long selection waits for a suitable server (SS-16).
    /// Default 30 s. Zero means one attempt and no wait.
    pub server_selection_timeout: Duration,
    /// `heartbeatFrequencyMS`: enters the staleness formulas and the minimum maximum staleness
    /// (SS-2, SS-5). Default 10 s. Inside an engine this is a copy: `Engine::new` sets it from
    /// [`EngineOptions::heartbeat_frequency`](crate::engine::EngineOptions::heartbeat_frequency),
    /// the monitors' interval, so that both use one value.
    pub heartbeat_frequency: Duration,
}

impl Default for SelectionSettings {
    fn default() -> SelectionSettings {
        SelectionSettings {
            local_threshold: Duration::from_millis(15),
            server_selection_timeout: Duration::from_secs(30),
            heartbeat_frequency: Duration::from_secs(10),
        }
    }
}

/// One pass of the selection pipeline (SS-16 steps 2 to 7): the chosen server, or `None` when no
/// server is suitable right now.
///
/// `deprioritized` are the addresses a retry should avoid (SS-11). `operation_count` gives each
/// server's number of operations in flight; the caller increments the chosen server's count and
/// decrements it when the operation ends, whatever its outcome (SS-15). `rng` is the engine's
/// generator; it is drawn from only when the window holds two servers or more.
pub fn select_server<'a>(
    topology: &'a TopologyDescription,
    criteria: &SelectionCriteria,
    deprioritized: &[ServerAddress],
    settings: &SelectionSettings,
    operation_count: impl Fn(&ServerAddress) -> u32,
    rng: &mut (impl RngCore + ?Sized),
) -> Result<Option<&'a ServerDescription>, SelectionError> {
    if let Some(reason) = topology.compatibility_error() {
        return Err(SelectionError::Incompatible(reason.into()));
    }
    let mut suitable = ServerList::new();
    suitability::suitable_servers_into(
        topology,
        criteria,
        deprioritized,
        settings.heartbeat_frequency,
        &mut suitable,
    )
    .map_err(SelectionError::InvalidReadPreference)?;
    retain_latency_window(&mut suitable, settings.local_threshold);
    Ok(choose_by_operation_count(&suitable, operation_count, rng))
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::rng::EngineRng;
    use crate::topology::{AverageRtt, ServerType, TagSet, TopologyType};
    use alloc::vec::Vec;
    use proptest::prelude::*;

    const TYPES: [ServerType; 6] = [
        ServerType::Unknown,
        ServerType::RsPrimary,
        ServerType::RsSecondary,
        ServerType::RsArbiter,
        ServerType::RsOther,
        ServerType::Mongos,
    ];
    const MODES: [ReadPreferenceMode; 5] = [
        ReadPreferenceMode::Primary,
        ReadPreferenceMode::PrimaryPreferred,
        ReadPreferenceMode::Secondary,
        ReadPreferenceMode::SecondaryPreferred,
        ReadPreferenceMode::Nearest,
    ];

    fn dc(i: u8) -> TagSet {
        [("dc", ["ny", "sf", "la"][usize::from(i % 3)])]
            .into_iter()
            .collect()
    }

    /// (type index, rtt ms, dc index, deprioritized) per server.
    type Spec = Vec<(usize, u64, u8, bool)>;

    fn topology(spec: &Spec, sharded: bool) -> TopologyDescription {
        let servers = spec
            .iter()
            .enumerate()
            .map(|(i, &(t, rtt, tag, _))| ServerDescription {
                server_type: TYPES[t],
                average_rtt: AverageRtt::from_duration(Duration::from_millis(rtt)),
                max_wire_version: 21,
                tags: dc(tag),
                ..ServerDescription::unknown(ServerAddress::new("h", 1 + i as u16))
            })
            .collect();
        let topology_type = if sharded {
            TopologyType::Sharded
        } else {
            TopologyType::ReplicaSetWithPrimary
        };
        TopologyDescription::new(topology_type, servers)
    }

    proptest! {
        /// SS-11, SS-13, SS-15: the chosen server is in the latency window of the suitable
        /// servers; a deprioritized server is chosen only when no other server is suitable after
        /// filtering; the same seed gives the same choice.
        #[test]
        fn chosen_server_is_suitable_in_window_and_avoids_deprioritized(
            spec in prop::collection::vec((0..6usize, 0..40u64, 0..3u8, any::<bool>()), 0..24),
            sharded in any::<bool>(),
            mode in 0..5usize,
            tag in prop::option::of(0..3u8),
            seed in any::<u64>(),
        ) {
            let topology = topology(&spec, sharded);
            let deprioritized: Vec<ServerAddress> = topology
                .servers
                .iter()
                .zip(&spec)
                .filter(|(_, s)| s.3)
                .map(|(d, _)| d.address.clone())
                .collect();
            let tag_sets = match (MODES[mode], tag) {
                (ReadPreferenceMode::Primary, _) | (_, None) => Vec::new(),
                (_, Some(t)) => alloc::vec![dc(t)],
            };
            let criteria = SelectionCriteria::Read(
                ReadPreference::new(MODES[mode], tag_sets, None).unwrap(),
            );
            let settings = SelectionSettings::default();
            let count = |a: &ServerAddress| u32::from(a.port() % 5);
            let pick = |seed| {
                select_server(&topology, &criteria, &deprioritized, &settings, count,
                    &mut EngineRng::from_seed_u64(seed)).unwrap().map(|s| s.address.clone())
            };
            let chosen = pick(seed);
            prop_assert_eq!(&chosen, &pick(seed));
            let mut window = suitable_servers(&topology, &criteria, &deprioritized,
                settings.heartbeat_frequency).unwrap();
            retain_latency_window(&mut window, settings.local_threshold);
            match &chosen {
                None => prop_assert!(window.is_empty()),
                Some(a) => {
                    prop_assert!(window.iter().any(|s| &s.address == a));
                    if deprioritized.contains(a) {
                        prop_assert!(window.iter().all(|s| deprioritized.contains(&s.address)));
                    }
                }
            }
        }
    }
}
