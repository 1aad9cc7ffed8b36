//! Selection repeated against one topology that does not change: the same pipeline as
//! [`select_server`], with the part that depends only on the topology, the criteria and the
//! deprioritized servers remembered.
//!
//! Up to the power-of-two choice, the pipeline (SS-11 suitability with deprioritization, SS-13 the
//! latency window) is a pure function of the topology, the criteria, the settings and which of the
//! topology's servers are deprioritized. [`RepeatedSelection`] runs that part once per
//! deprioritized set and keeps the window; every call still runs the choice (SS-15) with the
//! caller's operation counts and generator, drawing exactly what [`select_server`] draws. So a
//! call gives the same server and leaves the generator in the same state as [`select_server`] on
//! the same topology.

use alloc::vec::Vec;
use rand_core::RngCore;

use super::window::choose_index;
use super::{
    retain_latency_window, select_server, suitability, SelectionCriteria, SelectionError,
    SelectionSettings, ServerList,
};
use crate::address::ServerAddress;
use crate::topology::{ServerDescription, TopologyDescription};

/// How many deprioritized sets a [`RepeatedSelection`] remembers; further sets run the whole
/// pipeline on every call.
const REMEMBERED_SETS: usize = 16;

/// Server selection repeated many times against one fixed topology (a simulation, or a client
/// between two topology changes), giving the same results as [`select_server`] at a fraction of
/// its cost.
///
/// Topologies of more than 64 servers run the whole pipeline on every call. A call allocates only
/// when it remembers a deprioritized set it has not seen.
#[derive(Clone, Debug)]
pub struct RepeatedSelection {
    topology: TopologyDescription,
    criteria: SelectionCriteria,
    settings: SelectionSettings,
    /// Per deprioritized set (one bit per server, by topology index): the latency window, as
    /// topology indices in topology order.
    windows: Vec<(u64, Vec<u8>)>,
    /// The index in `windows` of the latest set, tried first.
    latest: usize,
    /// For topologies of up to [`DIRECT_SERVERS`] servers, per deprioritized set (the bit set as
    /// the index): 1 + its index in `windows`, 0 while not remembered. Found without a search.
    direct: Vec<u8>,
    /// One bit per server of the topology (the first 64; a larger topology is never remembered).
    all: u64,
}

/// Topologies up to this many servers find a deprioritized set's window by the set itself.
const DIRECT_SERVERS: usize = 6;

impl RepeatedSelection {
    /// Selection for `criteria` with `settings` against `topology`.
    pub fn new(
        topology: TopologyDescription,
        criteria: SelectionCriteria,
        settings: SelectionSettings,
    ) -> RepeatedSelection {
        let all = match topology.servers.len() {
            n if n >= 64 => u64::MAX,
            n => (1u64 << n) - 1,
        };
        RepeatedSelection {
            all,
            topology,
            criteria,
            settings,
            windows: Vec::new(),
            latest: 0,
            direct: Vec::new(),
        }
    }

    /// The topology selected from.
    pub fn topology(&self) -> &TopologyDescription {
        &self.topology
    }

    /// The criteria selected for.
    pub fn criteria(&self) -> &SelectionCriteria {
        &self.criteria
    }

    /// One pass of the selection pipeline, as [`select_server`] with this topology, criteria and
    /// settings: the same server, the same draws from `rng`, the same errors.
    pub fn select(
        &mut self,
        deprioritized: &[ServerAddress],
        operation_count: impl Fn(&ServerAddress) -> u32,
        rng: &mut (impl RngCore + ?Sized),
    ) -> Result<Option<&ServerDescription>, SelectionError> {
        let Some(set) = self.deprioritized_set(deprioritized) else {
            return self.select_uncached(deprioritized, operation_count, rng);
        };
        let Some(slot) = self.remembered(set, |this| this.window(deprioritized))? else {
            return self.select_uncached(deprioritized, operation_count, rng);
        };
        let window = &self.windows[slot].1;
        let servers = &self.topology.servers;
        let at = |i: usize| &servers[usize::from(window[i])];
        Ok(choose_index(window.len(), |i| operation_count(&at(i).address), rng).map(at))
    }

    /// [`RepeatedSelection::select`] by topology index: `deprioritized` is a bit set of topology
    /// indices, 64 to a word (bit `i % 64` of word `i / 64` stands for `topology().servers[i]`;
    /// missing words and bits past the last server deprioritize nothing), `operation_count` takes
    /// a topology index, and the answer is the chosen server's topology index. The same server,
    /// draws and errors as `select` with the addresses of those servers (SS-11, SS-13, SS-15), for
    /// a caller that keeps servers by index (a simulation): up to 64 servers, no address is
    /// compared or cloned; above, every call runs the whole pipeline, as `select` does.
    #[inline]
    pub fn select_index(
        &mut self,
        deprioritized: &[u64],
        operation_count: impl Fn(usize) -> u32,
        rng: &mut (impl RngCore + ?Sized),
    ) -> Result<Option<usize>, SelectionError> {
        let slot = if self.topology.servers.len() > 64 {
            None
        } else {
            let set = deprioritized.first().map_or(0, |&word| word & self.all);
            self.remembered(set, |this| this.window(&this.addresses(&[set])))?
        };
        let Some(slot) = slot else {
            let servers = &self.topology.servers;
            let position = |a: &ServerAddress| servers.iter().position(|s| &s.address == a);
            let chosen = self.select_uncached(
                &self.addresses(deprioritized),
                |a| position(a).map_or(0, &operation_count),
                rng,
            )?;
            return Ok(chosen.and_then(|c| servers.iter().position(|s| core::ptr::eq(s, c))));
        };
        let window = &self.windows[slot].1;
        Ok(choose_index(
            window.len(),
            |i| operation_count(usize::from(window[i])),
            rng,
        )
        .map(|i| usize::from(window[i])))
    }

    /// The addresses of the servers in bit set `set` (64 topology indices to a word).
    fn addresses(&self, set: &[u64]) -> Vec<ServerAddress> {
        self.topology
            .servers
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                set.get(i / 64)
                    .is_some_and(|word| word & (1 << (i % 64)) != 0)
            })
            .map(|(_, s)| s.address.clone())
            .collect()
    }

    /// The index in `windows` of deprioritized set `set`, remembering its window (from `window`)
    /// when it is new; `None` when it is new and no more sets are remembered.
    #[inline]
    fn remembered(
        &mut self,
        set: u64,
        window: impl FnOnce(&Self) -> Result<Vec<u8>, SelectionError>,
    ) -> Result<Option<usize>, SelectionError> {
        let slot = match self.direct.get(set as usize) {
            Some(&known) if known > 0 => usize::from(known - 1),
            _ => match self.windows.get(self.latest) {
                Some((s, _)) if *s == set => self.latest,
                _ => match self.windows.iter().position(|(s, _)| *s == set) {
                    Some(slot) => slot,
                    None if self.windows.len() < REMEMBERED_SETS => {
                        let window = window(self)?;
                        self.windows.push((set, window));
                        let slot = self.windows.len() - 1;
                        if self.topology.servers.len() <= DIRECT_SERVERS {
                            let sets = 1usize << self.topology.servers.len();
                            self.direct.resize(sets, 0);
                            // REMEMBERED_SETS is below u8::MAX.
                            self.direct[set as usize] = (slot + 1) as u8;
                        }
                        slot
                    }
                    None => return Ok(None),
                },
            },
        };
        self.latest = slot;
        Ok(Some(slot))
    }

    fn select_uncached(
        &self,
        deprioritized: &[ServerAddress],
        operation_count: impl Fn(&ServerAddress) -> u32,
        rng: &mut (impl RngCore + ?Sized),
    ) -> Result<Option<&ServerDescription>, SelectionError> {
        select_server(
            &self.topology,
            &self.criteria,
            deprioritized,
            &self.settings,
            operation_count,
            rng,
        )
    }

    /// The deprioritized servers of the topology, one bit per index; `None` above 64 servers.
    /// Addresses the topology does not have change nothing in the pipeline, so they are left out.
    #[inline]
    fn deprioritized_set(&self, deprioritized: &[ServerAddress]) -> Option<u64> {
        let servers = &self.topology.servers;
        if servers.len() > 64 {
            return None;
        }
        if deprioritized.is_empty() {
            return Some(0);
        }
        self.set_of(deprioritized)
    }

    /// [`RepeatedSelection::deprioritized_set`] of a set that is not empty.
    fn set_of(&self, deprioritized: &[ServerAddress]) -> Option<u64> {
        let servers = &self.topology.servers;
        let mut set = 0u64;
        for address in deprioritized {
            if let Some(i) = servers.iter().position(|s| &s.address == address) {
                set |= 1 << i;
            }
        }
        Some(set)
    }

    /// SS-16 steps 2 to 6 (compatibility, suitability, latency window), as [`select_server`] runs
    /// them: the window as topology indices.
    fn window(&self, deprioritized: &[ServerAddress]) -> Result<Vec<u8>, SelectionError> {
        let topology = &self.topology;
        if let Some(reason) = topology.compatibility_error() {
            return Err(SelectionError::Incompatible(reason.into()));
        }
        let mut suitable = ServerList::new();
        suitability::suitable_servers_into(
            topology,
            &self.criteria,
            deprioritized,
            self.settings.heartbeat_frequency,
            &mut suitable,
        )
        .map_err(SelectionError::InvalidReadPreference)?;
        retain_latency_window(&mut suitable, self.settings.local_threshold);
        Ok(suitable
            .iter()
            .filter_map(|chosen| {
                let i = topology
                    .servers
                    .iter()
                    .position(|s| core::ptr::eq(s, *chosen))?;
                u8::try_from(i).ok()
            })
            .collect())
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::rng::EngineRng;
    use crate::selection::{ReadPreference, ReadPreferenceMode};
    use crate::topology::{AverageRtt, ServerType, TagSet, TopologyType};
    use alloc::vec::Vec;
    use core::time::Duration;
    use proptest::prelude::*;

    const TYPES: [ServerType; 5] = [
        ServerType::Unknown,
        ServerType::RsPrimary,
        ServerType::RsSecondary,
        ServerType::RsArbiter,
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

    /// SS-11, SS-15: above 64 servers, `select_index` deprioritizes servers past the 64th too,
    /// and picks what `select` picks with their addresses, with the same draws.
    #[test]
    fn ss11_select_index_beyond_64_servers_matches_select() {
        let servers: Vec<ServerDescription> = (0..70u16)
            .map(|i| ServerDescription {
                server_type: ServerType::RsSecondary,
                average_rtt: AverageRtt::from_duration(Duration::from_millis(5)),
                max_wire_version: 21,
                ..ServerDescription::unknown(ServerAddress::new("h", 1 + i))
            })
            .collect();
        let topology = TopologyDescription::new(TopologyType::ReplicaSetNoPrimary, servers);
        let criteria = SelectionCriteria::Read(
            ReadPreference::new(ReadPreferenceMode::Nearest, Vec::new(), None).unwrap(),
        );
        let mut repeated =
            RepeatedSelection::new(topology.clone(), criteria, SelectionSettings::default());
        let servers = &topology.servers;
        let count = |i: usize| (i as u32 * 7) % 5;
        // Every server but 66; every server but 3 and 67; servers 64..70 only; none; past the
        // last server and a third word (nothing).
        let sets: [&[u64]; 5] = [
            &[u64::MAX, 0x3f & !(1 << 2)],
            &[!(1 << 3), 0x3f & !(1 << 3)],
            &[0, 0x3f],
            &[],
            &[0, !0x3f, u64::MAX],
        ];
        for (n, set) in sets.into_iter().enumerate() {
            let deprioritized: Vec<ServerAddress> = (0..servers.len())
                .filter(|&i| set.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0))
                .map(|i| servers[i].address.clone())
                .collect();
            for seed in 0..8u64 {
                let (mut a, mut b) = (
                    EngineRng::from_seed_u64(seed),
                    EngineRng::from_seed_u64(seed),
                );
                let expected = repeated
                    .select(&deprioritized, |x| count(usize::from(x.port() - 1)), &mut a)
                    .unwrap()
                    .map(|s| usize::from(s.address.port() - 1));
                let got = repeated.select_index(set, count, &mut b).unwrap();
                assert_eq!(got, expected, "set {n}, seed {seed}");
                assert_eq!(a, b, "set {n}, seed {seed}: the same draws");
                match n {
                    0 => assert_eq!(got, Some(66)),
                    1 => assert!(matches!(got, Some(3 | 67))),
                    2 => assert!(got.is_some_and(|i| i < 64)),
                    _ => {}
                }
            }
        }
    }

    /// SS-11, SS-15, review15 finding 6: at 63 and 64 servers (the last topologies of one word,
    /// 64 the one whose all-servers mask is `u64::MAX`) `select_index` takes the remembered path
    /// and picks what `select` picks with those servers' addresses, with the same draws: bit 63
    /// alone (past the last server at 63, so nothing; the last server at 64), every bit, an
    /// empty word and no word.
    #[test]
    fn review15_f6_select_index_at_63_and_64_servers_matches_select() {
        let criteria = SelectionCriteria::Read(
            ReadPreference::new(ReadPreferenceMode::Nearest, Vec::new(), None).unwrap(),
        );
        let count = |i: usize| (i as u32 * 7) % 5;
        for n in [63u16, 64] {
            let servers: Vec<ServerDescription> = (0..n)
                .map(|i| ServerDescription {
                    server_type: ServerType::RsSecondary,
                    average_rtt: AverageRtt::from_duration(Duration::from_millis(5)),
                    max_wire_version: 21,
                    ..ServerDescription::unknown(ServerAddress::new("h", 1 + i))
                })
                .collect();
            let topology = TopologyDescription::new(TopologyType::ReplicaSetNoPrimary, servers);
            let settings = SelectionSettings::default;
            let mut by_address =
                RepeatedSelection::new(topology.clone(), criteria.clone(), settings());
            let mut by_index =
                RepeatedSelection::new(topology.clone(), criteria.clone(), settings());
            let servers = &topology.servers;
            let all = match n {
                64 => u64::MAX,
                _ => (1 << 63) - 1,
            };
            let sets: [&[u64]; 4] = [&[1 << 63], &[u64::MAX], &[0], &[]];
            for (k, set) in sets.into_iter().enumerate() {
                let deprioritized: Vec<ServerAddress> = (0..servers.len())
                    .filter(|&i| set.first().is_some_and(|w| w & (1 << i) != 0))
                    .map(|i| servers[i].address.clone())
                    .collect();
                for seed in 0..8u64 {
                    let (mut a, mut b) = (
                        EngineRng::from_seed_u64(seed),
                        EngineRng::from_seed_u64(seed),
                    );
                    let expected = by_address
                        .select(&deprioritized, |x| count(usize::from(x.port() - 1)), &mut a)
                        .unwrap()
                        .map(|s| usize::from(s.address.port() - 1));
                    let got = by_index.select_index(set, count, &mut b).unwrap();
                    assert_eq!(got, expected, "{n} servers, set {k}, seed {seed}");
                    assert_eq!(a, b, "{n} servers, set {k}, seed {seed}: the same draws");
                    assert!(got.is_some_and(|i| i < usize::from(n)));
                    if n == 64 && k == 0 {
                        assert_ne!(got, Some(63), "seed {seed}: the last server deprioritized");
                    }
                    // The remembered path, keyed by the set within the topology's servers.
                    let key = set.first().map_or(0, |w| w & all);
                    assert_eq!(
                        by_index.windows.get(by_index.latest).map(|(s, _)| *s),
                        Some(key),
                        "{n} servers, set {k}"
                    );
                }
            }
        }
    }

    proptest! {
        /// SS-11, SS-13, SS-15: over a sequence of calls with changing deprioritized sets
        /// (addresses outside the topology included) and changing operation counts,
        /// `RepeatedSelection` picks what `select_server` picks and draws the same numbers.
        #[test]
        fn repeated_selection_matches_select_server(
            spec in prop::collection::vec((0..5usize, 0..40u64, 0..3u8, 0..12u8), 0..20),
            sharded in any::<bool>(),
            mode in 0..5usize,
            tag in prop::option::of(0..3u8),
            calls in prop::collection::vec(
                (prop::collection::vec(0..24u16, 0..4), 0..7u32), 1..40),
            seed in any::<u64>(),
        ) {
            let servers = spec
                .iter()
                .enumerate()
                // One server in twelve is too old: the topology is then incompatible.
                .map(|(i, &(t, rtt, tag, wire))| ServerDescription {
                    server_type: TYPES[t],
                    average_rtt: AverageRtt::from_duration(Duration::from_millis(rtt)),
                    max_wire_version: if wire == 0 { 2 } else { 21 },
                    tags: dc(tag),
                    ..ServerDescription::unknown(ServerAddress::new("h", 1 + i as u16))
                })
                .collect();
            let topology_type = if sharded {
                TopologyType::Sharded
            } else {
                TopologyType::ReplicaSetWithPrimary
            };
            let topology = TopologyDescription::new(topology_type, servers);
            let tag_sets = match (MODES[mode], tag) {
                (ReadPreferenceMode::Primary, _) | (_, None) => Vec::new(),
                (_, Some(t)) => alloc::vec![dc(t)],
            };
            let criteria =
                SelectionCriteria::Read(ReadPreference::new(MODES[mode], tag_sets, None).unwrap());
            let settings = SelectionSettings::default();
            let mut repeated = RepeatedSelection::new(topology.clone(), criteria.clone(), settings);
            let mut by_index = repeated.clone();
            let (mut a, mut b) = (EngineRng::from_seed_u64(seed), EngineRng::from_seed_u64(seed));
            let mut c = a.clone();
            for (ports, shift) in calls {
                // Ports 1..=20 may be in the topology; above are not.
                let deprioritized: Vec<ServerAddress> =
                    ports.iter().map(|&p| ServerAddress::new("h", 1 + p)).collect();
                let count = |x: &ServerAddress| u32::from(x.port()).wrapping_mul(shift + 3) % 5;
                let expected = select_server(&topology, &criteria, &deprioritized, &settings,
                    count, &mut a).map(|s| s.map(|s| s.address.clone()));
                let got = repeated.select(&deprioritized, count, &mut b)
                    .map(|s| s.map(|s| s.address.clone()));
                prop_assert_eq!(&got, &expected);
                prop_assert_eq!(&a, &b);
                // The same by topology index (the server at index i has port 1 + i).
                let set = ports.iter().fold(0u64, |set, &p| set | 1u64.checked_shl(u32::from(p)).unwrap_or(0));
                let servers = &topology.servers;
                let got = by_index.select_index(&[set], |i| count(&servers[i].address), &mut c)
                    .map(|i| i.map(|i| servers[i].address.clone()));
                prop_assert_eq!(got, expected);
                prop_assert_eq!(&a, &c);
            }
        }
    }
}
