//! Server selection between topology changes (issue 9): an attempt's first look at the topology
//! is the same pipeline every time until the description changes, so its topology-only part
//! (SS-11 suitability with deprioritization, SS-13 the latency window) is kept in a
//! [`RepeatedSelection`] and only the power-of-two choice (SS-15) runs per attempt, with the same
//! draws from the engine's RNG as [`crate::selection::select_server`].
//!
//! Whether the description changed is known without comparing it: [`TrackedTopology`] counts the
//! inputs that may change it (every `&mut` access to the topology other than its pools and its
//! output queues goes through [`TrackedTopology::input`], which the compiler enforces: the
//! wrapper gives out no other `&mut Topology`). A selection that picks nothing (wait, failure)
//! is left to the ordinary [`crate::selection::ServerSelection`] loop, which draws nothing more.

use core::ops::Deref;

use crate::address::ServerAddress;
use crate::pool::Pool;
use crate::selection::{RepeatedSelection, SelectionCriteria, SelectionSettings};
use crate::topology::{SdamEvent, ServerDescription, Topology, TopologyAction};
use rand_core::RngCore;

/// The engine's topology, with a count of the inputs that may have changed its description.
pub(super) struct TrackedTopology {
    topology: Topology,
    revision: u64,
}

impl TrackedTopology {
    pub(super) fn new(topology: Topology) -> TrackedTopology {
        TrackedTopology {
            topology,
            revision: 0,
        }
    }

    /// The topology, for an input that may change its description.
    pub(super) fn input(&mut self) -> &mut Topology {
        self.revision += 1;
        &mut self.topology
    }

    /// The pools, which selection does not read.
    pub(super) fn pools_mut(&mut self) -> impl Iterator<Item = &mut Pool> {
        self.topology.pools_mut()
    }

    /// The next SDAM event (reading the output queue changes no description).
    pub(super) fn poll_event(&mut self) -> Option<SdamEvent> {
        self.topology.poll_event()
    }

    /// The next topology action.
    pub(super) fn poll_action(&mut self) -> Option<TopologyAction> {
        self.topology.poll_action()
    }
}

impl Deref for TrackedTopology {
    type Target = Topology;

    fn deref(&self) -> &Topology {
        &self.topology
    }
}

/// The latest criteria's [`RepeatedSelection`], valid for one topology revision.
#[derive(Default)]
pub(super) struct SelectionCache {
    revision: u64,
    repeated: Option<RepeatedSelection>,
}

impl SelectionCache {
    /// SS-11, SS-13, SS-15: the server a first poll of a new selection for `criteria` avoiding
    /// `deprioritized` would select now, with the same draws from `rng`; `None` when it would
    /// select nothing (then nothing was drawn, and the selection loop takes over).
    pub(super) fn select<'a>(
        &'a mut self,
        topology: &TrackedTopology,
        criteria: &SelectionCriteria,
        deprioritized: &[ServerAddress],
        settings: SelectionSettings,
        operation_count: impl Fn(&ServerAddress) -> u32,
        rng: &mut (impl RngCore + ?Sized),
    ) -> Option<&'a ServerDescription> {
        let current = self.revision == topology.revision
            && self
                .repeated
                .as_ref()
                .is_some_and(|r| r.criteria() == criteria);
        if !current {
            self.revision = topology.revision;
            self.repeated = Some(RepeatedSelection::new(
                topology.description().clone(),
                criteria.clone(),
                settings,
            ));
        }
        let repeated = self.repeated.as_mut()?;
        repeated
            .select(deprioritized, operation_count, rng)
            .ok()
            .flatten()
    }
}
