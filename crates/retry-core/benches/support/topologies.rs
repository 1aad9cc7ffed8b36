//! The topologies and criteria the selection benchmarks measure, shared by the criterion bench and
//! the instruction-count example so both measure the same thing.

use std::time::Duration;

use retry_core::address::ServerAddress;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::Instant;
use retry_core::topology::{
    AverageRtt, ServerDescription, ServerType, TagSet, TopologyDescription, TopologyType,
};

/// The topology sizes measured.
pub const SIZES: [usize; 3] = [3, 50, 1000];

/// One measured case: a topology, the criteria, and one deprioritized address.
pub struct Case {
    /// `rs-tags` or `sharded`.
    pub shape: &'static str,
    pub topology: TopologyDescription,
    pub criteria: SelectionCriteria,
    pub deprioritized: Vec<ServerAddress>,
}

fn server(i: usize, server_type: ServerType, tags: TagSet) -> ServerDescription {
    ServerDescription {
        server_type,
        // RTTs from 1 to 40 ms, so the 15 ms window keeps part of the list.
        average_rtt: AverageRtt::from_duration(Duration::from_millis(1 + (i as u64 * 7) % 40)),
        max_wire_version: 21,
        last_update_time: Instant::from_millis(1_000),
        tags,
        ..ServerDescription::unknown(ServerAddress::new(&format!("host{i}.example"), 27017))
    }
}

/// A replica set of `n` members (one primary), tagged over three data centers and four racks,
/// read with mode nearest and tag sets `[{dc: "ny", rack: "r1"}, {dc: "ny"}]`, avoiding member 1.
pub fn replica_set_with_tags(n: usize) -> Case {
    let servers = (0..n)
        .map(|i| {
            let dc = ["ny", "sf", "la"][i % 3];
            let rack = ["r0", "r1", "r2", "r3"][i % 4];
            let t = if i == 0 {
                ServerType::RsPrimary
            } else {
                ServerType::RsSecondary
            };
            server(i, t, [("dc", dc), ("rack", rack)].into_iter().collect())
        })
        .collect();
    let tag_sets = vec![
        [("dc", "ny"), ("rack", "r1")].into_iter().collect(),
        [("dc", "ny")].into_iter().collect(),
    ];
    let rp = ReadPreference::new(ReadPreferenceMode::Nearest, tag_sets, None)
        .expect("a valid read preference");
    let topology = TopologyDescription::new(TopologyType::ReplicaSetWithPrimary, servers);
    let deprioritized = vec![topology.servers[1].address.clone()];
    Case {
        shape: "rs-tags",
        topology,
        criteria: SelectionCriteria::Read(rp),
        deprioritized,
    }
}

/// A sharded cluster of `n` mongos, for a write, avoiding mongos 0.
pub fn sharded(n: usize) -> Case {
    let servers = (0..n)
        .map(|i| server(i, ServerType::Mongos, TagSet::new()))
        .collect();
    let topology = TopologyDescription::new(TopologyType::Sharded, servers);
    let deprioritized = vec![topology.servers[0].address.clone()];
    Case {
        shape: "sharded",
        topology,
        criteria: SelectionCriteria::Write,
        deprioritized,
    }
}

/// A server's operations in flight: a fixed spread from 0 to 6.
pub fn operation_count(address: &ServerAddress) -> u32 {
    address.host().len() as u32 % 7
}
