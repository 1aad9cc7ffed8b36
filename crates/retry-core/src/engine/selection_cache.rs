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
//!
//! At most [`CRITERIA_KEPT`] criteria per revision keep a selection (each with its copy of the
//! description), kept for the whole revision; a further criteria selects from the topology
//! directly. So a revision copies the description at most [`CRITERIA_KEPT`] times, and apart from
//! those copies no selection costs more than [`crate::selection::select_server`] and a small
//! constant (house rule 9, review9 finding 3).

use alloc::vec::Vec;
use core::ops::Deref;

use crate::address::ServerAddress;
use crate::pool::Pool;
use crate::selection::{select_server, RepeatedSelection, SelectionCriteria, SelectionSettings};
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

    /// Whether the pools record their events (selection does not read them).
    pub(super) fn set_pool_events(&mut self, on: bool) {
        self.topology.set_pool_events(on);
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

/// The [`RepeatedSelection`]s of the first [`CRITERIA_KEPT`] criteria used in one topology
/// revision.
///
/// House rule 9 (review9 finding 3): nothing is evicted within a revision, so criteria taking
/// turns never rebuild. A further criteria selects with [`select_server`] on the topology
/// itself: what the cache replaced, with the same draws, and nothing copied or kept.
#[derive(Default)]
pub(super) struct SelectionCache {
    revision: u64,
    /// At most [`CRITERIA_KEPT`], in the order they were first used.
    repeated: Vec<RepeatedSelection>,
    /// How many selections were built, each with a copy of the description, for the tests of
    /// house rule 9.
    #[cfg(test)]
    built: usize,
    /// When set, every selection is left to the selection loop (the engine tests comparing both
    /// paths).
    #[cfg(test)]
    pub(super) disabled: bool,
}

impl SelectionCache {
    /// SS-11, SS-13, SS-15: the server a first poll of a new selection for `criteria` avoiding
    /// `deprioritized` would select now, with the same draws from `rng`; `None` when it would
    /// select nothing (then nothing was drawn, and the selection loop takes over).
    pub(super) fn select<'a>(
        &'a mut self,
        topology: &'a TrackedTopology,
        criteria: &SelectionCriteria,
        deprioritized: &[ServerAddress],
        settings: SelectionSettings,
        operation_count: impl Fn(&ServerAddress) -> u32,
        rng: &mut (impl RngCore + ?Sized),
    ) -> Option<&'a ServerDescription> {
        #[cfg(test)]
        if self.disabled {
            return None;
        }
        if self.revision != topology.revision {
            self.revision = topology.revision;
            self.repeated.clear();
        }
        let index = match self.repeated.iter().position(|r| r.criteria() == criteria) {
            Some(index) => index,
            None if self.repeated.len() < CRITERIA_KEPT => {
                #[cfg(test)]
                {
                    self.built += 1;
                }
                self.repeated.push(RepeatedSelection::new(
                    topology.description().clone(),
                    criteria.clone(),
                    settings,
                ));
                self.repeated.len() - 1
            }
            None => {
                return select_server(
                    topology.description(),
                    criteria,
                    deprioritized,
                    &settings,
                    operation_count,
                    rng,
                )
                .ok()
                .flatten()
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
    use crate::rng::EngineRng;
    use crate::selection::{ReadPreference, ReadPreferenceMode};
    use crate::time::Instant;
    use alloc::string::String;
    use core::time::Duration;

    /// Three mongos, discovered.
    fn three_mongos() -> TrackedTopology {
        let seeds: Vec<ServerAddress> = ["m1", "m2", "m3"]
            .into_iter()
            .map(|host| ServerAddress::new(host, 27017))
            .collect();
        let settings = crate::topology::TopologySettings::new(seeds.clone());
        let topology = Topology::new(settings, Instant::ZERO).expect("a topology");
        let mut tracked = TrackedTopology::new(topology);
        let hello = bson::doc! {
            "ok": 1, "isWritablePrimary": true, "msg": "isdbgrid",
            "minWireVersion": 0, "maxWireVersion": 21,
        };
        for (i, address) in seeds.iter().enumerate() {
            let rtt = Duration::from_millis(1 + i as u64);
            tracked
                .input()
                .handle_hello(address, &hello, rtt, Instant::ZERO);
        }
        tracked
    }

    /// `n` different criteria: the five read preference modes, with and without a tag set, and
    /// writes.
    fn criteria(n: usize) -> Vec<SelectionCriteria> {
        let modes = [
            ReadPreferenceMode::Primary,
            ReadPreferenceMode::PrimaryPreferred,
            ReadPreferenceMode::Secondary,
            ReadPreferenceMode::SecondaryPreferred,
            ReadPreferenceMode::Nearest,
        ];
        let tagged = modes[1..].iter().map(|&mode| {
            let tags = [("dc", "ny")].into_iter().collect();
            ReadPreference::new(mode, alloc::vec![tags], None).expect("valid")
        });
        let untagged = modes
            .iter()
            .map(|&mode| ReadPreference::new(mode, Vec::new(), None).expect("valid"));
        core::iter::once(SelectionCriteria::Write)
            .chain(untagged.chain(tagged).map(SelectionCriteria::Read))
            .take(n)
            .collect()
    }

    /// Review8 finding 4 (issue 9, house rule 9): reads and writes taking turns reuse one
    /// selection each while the topology holds, instead of rebuilding on every change of
    /// criteria; a topology input drops them all.
    #[test]
    fn mixed_criteria_keep_one_selection_each_per_revision() {
        let mut tracked = three_mongos();
        let mut cache = SelectionCache::default();
        let mut rng = EngineRng::from_seed_u64(7);
        let both = criteria(2);
        for _ in 0..3 {
            for criteria in &both {
                let selected = cache.select(
                    &tracked,
                    criteria,
                    &[],
                    SelectionSettings::default(),
                    |_| 0,
                    &mut rng,
                );
                assert!(selected.is_some(), "a mongos is selected");
            }
        }
        assert_eq!(cache.built, 2, "one build per criteria, then reused");
        tracked.input();
        cache.select(
            &tracked,
            &both[0],
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

    /// Review9 finding 3 (house rule 9), SS-15: six criteria in rotation over three rounds and
    /// two topology revisions build (and copy the description for) `CRITERIA_KEPT` selections
    /// per revision, not one per selection; the two criteria beyond them select directly.
    /// Every selection picks the server `select_server` picks, and leaves the generator in the
    /// same state.
    #[test]
    fn six_criteria_in_rotation_copy_the_description_a_bounded_number_of_times() {
        let mut tracked = three_mongos();
        let mut cache = SelectionCache::default();
        let (mut cached, mut plain) = (EngineRng::from_seed_u64(11), EngineRng::from_seed_u64(11));
        let settings = SelectionSettings::default();
        let six = criteria(6);
        for revision in 1..=2 {
            for round in 0..3u32 {
                for criteria in &six {
                    // Changing operation counts, so the power-of-two choice (SS-15) varies.
                    let count = |a: &ServerAddress| (u32::from(a.host().as_bytes()[1]) + round) % 3;
                    let expected = select_server(
                        tracked.description(),
                        criteria,
                        &[],
                        &settings,
                        count,
                        &mut plain,
                    )
                    .expect("compatible")
                    .map(|s| s.address.clone());
                    let got = cache
                        .select(&tracked, criteria, &[], settings, count, &mut cached)
                        .map(|s| s.address.clone());
                    assert!(got.is_some());
                    assert_eq!(got, expected, "{criteria}");
                    assert_eq!(cached, plain, "the same draws");
                }
            }
            assert_eq!(
                cache.built,
                CRITERIA_KEPT * revision,
                "the first four, once"
            );
            tracked.input();
        }
    }

    /// An engine on three mongos, discovered at time zero through the topology's input (as a
    /// monitor's `hello` would), every event family on; `fast: false` turns the cache off, so
    /// every selection runs the selection loop.
    fn engine(fast: bool) -> super::super::Engine {
        use super::super::{Engine, EngineOptions, EventFamilies};
        let seeds: Vec<ServerAddress> = ["m1", "m2", "m3"]
            .into_iter()
            .map(|host| ServerAddress::new(host, 27017))
            .collect();
        let settings = crate::topology::TopologySettings::new(seeds.clone());
        let mut options = EngineOptions::new(settings, crate::handshake::HandshakeOptions::new());
        options.seed = 42;
        // Below the connect timeout, so the checkouts under CSOT end at the selection deadline.
        options.selection.server_selection_timeout = Duration::from_secs(2);
        options.events = EventFamilies::ALL;
        let mut engine = Engine::new(options, Instant::ZERO).expect("valid");
        engine.selection_cache.disabled = !fast;
        engine.run(Instant::ZERO);
        discover(&mut engine, &seeds, 0, Instant::ZERO);
        engine
    }

    /// Each mongos answers a `hello` with a round trip of `shift` + 1 to 3 ms (a topology input,
    /// so a new revision).
    fn discover(
        engine: &mut super::super::Engine,
        seeds: &[ServerAddress],
        shift: u64,
        now: Instant,
    ) {
        let hello = bson::doc! {
            "ok": 1, "isWritablePrimary": true, "msg": "isdbgrid",
            "minWireVersion": 0, "maxWireVersion": 21,
        };
        for (i, address) in seeds.iter().enumerate() {
            let rtt = Duration::from_millis(1 + shift + i as u64);
            engine
                .topology
                .input()
                .handle_hello(address, &hello, rtt, now);
            let server = engine.server_id(address);
            engine.topology_touched(server);
        }
        engine.run(now);
    }

    /// Runs 48 operations over eight criteria (with and without CSOT, before and after a topology
    /// change), then the timers for a minute of virtual time; nobody ever connects, so attempts
    /// wait in their checkouts until their deadlines. The trace: every event, socket request,
    /// selected server and timer, with its time, and the generator's state at the end.
    fn trace(fast: bool) -> (Vec<String>, super::super::Engine) {
        use super::super::{OperationKind, OperationRequest};
        use crate::time::OperationTimeout;
        let mut engine = engine(fast);
        let seeds: Vec<ServerAddress> = ["m1", "m2", "m3"]
            .into_iter()
            .map(|host| ServerAddress::new(host, 27017))
            .collect();
        let eight = criteria(8);
        let mut trace = Vec::new();
        fn record(engine: &mut super::super::Engine, now: Instant, trace: &mut Vec<String>) {
            while let Some(event) = engine.poll_event() {
                trace.push(alloc::format!("{now:?} {event:?}"));
            }
            while let Some(connect) = engine.poll_connect() {
                trace.push(alloc::format!("{now:?} {connect:?}"));
            }
        }
        for i in 0..48u64 {
            let now = Instant::from_millis(i * 10);
            if i == 24 {
                discover(&mut engine, &seeds, 5, now);
            }
            let criteria = eight[i as usize % eight.len()].clone();
            let kind = match criteria {
                SelectionCriteria::Write => OperationKind::RetryableWrite,
                _ => OperationKind::Read,
            };
            let command = bson::doc! { "find": "c" };
            let mut request = OperationRequest::new("test", command, kind, criteria);
            request.timeout = match i % 3 {
                0 => OperationTimeout::Off,
                1 => OperationTimeout::Unbounded,
                _ => {
                    // Before and after the selection deadline (CS-3 takes the earlier).
                    let ms = if i % 2 == 0 { 700 } else { 5_000 };
                    OperationTimeout::Until(now.saturating_add(Duration::from_millis(ms)))
                }
            };
            let op = engine.start_operation(request, now);
            let server = engine.ops.get(&op).and_then(|o| o.slots[0].server.clone());
            trace.push(alloc::format!("{now:?} {op:?} selected {server:?}"));
            record(&mut engine, now, &mut trace);
        }
        let end = Instant::from_millis(60_000);
        for _ in 0..10_000 {
            let Some(now) = engine.poll_timeout().filter(|t| *t <= end) else {
                break;
            };
            engine.handle_timeout(now);
            trace.push(alloc::format!("timer {now:?}"));
            record(&mut engine, now, &mut trace);
        }
        trace.push(alloc::format!("{:?}", engine.rng));
        (trace, engine)
    }

    /// Review9 finding 6, house rule 2, SS-15, CS-3: the same seed and inputs through the
    /// selection cache's first poll and through the selection loop alone give the same events,
    /// socket requests, selected servers, deadlines and timestamps, and leave the generator in
    /// the same state.
    #[test]
    fn ss15_the_cached_first_poll_and_the_selection_loop_give_the_same_trace() {
        let (fast, fast_engine) = trace(true);
        let (slow, slow_engine) = trace(false);
        assert!(
            fast_engine.selection_cache.built > 0 && slow_engine.selection_cache.built == 0,
            "the first engine selected through the cache, the second through the loop"
        );
        let selected = |host: &str| {
            let address = alloc::format!(
                "selected Some(AttemptServer {{ address: ServerAddress({host}:27017)"
            );
            fast.iter().any(|line| line.contains(&address))
        };
        assert!(
            ["m1", "m2", "m3"].into_iter().all(selected),
            "the power-of-two choice picked every mongos"
        );
        assert!(
            fast.iter().any(|line| line.contains("OperationFinished")),
            "deadlines passed"
        );
        assert_eq!(fast.len(), slow.len());
        for (a, b) in fast.iter().zip(&slow) {
            assert_eq!(a, b);
        }
    }
}
