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

/// How many criteria keep a [`RepeatedSelection`] per topology revision: a workload mixes a few
/// (reads with their read preference, writes), and each one's first attempt then selects
/// without rebuilding the pipeline (review8 finding 4).
const CRITERIA_KEPT: usize = 4;

/// The [`RepeatedSelection`]s of the criteria last used, valid for one topology revision.
#[derive(Default)]
pub(super) struct SelectionCache {
    revision: u64,
    /// At most [`CRITERIA_KEPT`], the least recently built first.
    repeated: Vec<RepeatedSelection>,
    /// How many selections were built, for the tests of house rule 9.
    #[cfg(test)]
    built: usize,
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
        if self.revision != topology.revision {
            self.revision = topology.revision;
            self.repeated.clear();
        }
        let index = match self.repeated.iter().position(|r| r.criteria() == criteria) {
            Some(index) => index,
            None => {
                #[cfg(test)]
                {
                    self.built += 1;
                }
                if self.repeated.len() == CRITERIA_KEPT {
                    self.repeated.remove(0);
                }
                self.repeated.push(RepeatedSelection::new(
                    topology.description().clone(),
                    criteria.clone(),
                    settings,
                ));
                self.repeated.len() - 1
            }
        };
        self.repeated[index]
            .select(deprioritized, operation_count, rng)
            .ok()
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selection::ReadPreference;

    /// Review8 finding 4 (issue 9, house rule 9): reads and writes taking turns reuse one
    /// selection each while the topology holds, instead of rebuilding (and cloning the
    /// description) on every change of criteria; a topology input drops them all.
    #[test]
    fn mixed_criteria_keep_one_selection_each_per_revision() {
        let settings =
            crate::topology::TopologySettings::new(alloc::vec![ServerAddress::new("a", 27017)]);
        let topology = Topology::new(settings, crate::time::Instant::ZERO).expect("a topology");
        let mut tracked = TrackedTopology::new(topology);
        let mut cache = SelectionCache::default();
        let mut rng = crate::rng::EngineRng::from_seed_u64(7);
        let read = SelectionCriteria::Read(ReadPreference::PRIMARY);
        let write = SelectionCriteria::Write;
        for _ in 0..3 {
            for criteria in [&read, &write] {
                cache.select(
                    &tracked,
                    criteria,
                    &[],
                    SelectionSettings::default(),
                    |_| 0,
                    &mut rng,
                );
            }
        }
        assert_eq!(cache.built, 2, "one build per criteria, then reused");
        tracked.input();
        cache.select(
            &tracked,
            &write,
            &[],
            SelectionSettings::default(),
            |_| 0,
            &mut rng,
        );
        assert_eq!(
            (cache.built, cache.repeated.len()),
            (3, 1),
            "a new revision drops the old selections"
        );
    }
}
