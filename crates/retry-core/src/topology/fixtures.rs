//! Shared helpers for the topology machine's unit tests.

use alloc::string::String;
use alloc::vec::Vec;

use bson::{doc, Document};

use super::{Topology, TopologySettings};
use crate::address::ServerAddress;
use crate::time::Instant;

/// `host:27017`.
pub fn addr(host: &str) -> ServerAddress {
    ServerAddress::new(host, 27017)
}

/// A topology of `seeds` (ReplicaSetNoPrimary with a set name, else Unknown) at time zero.
pub fn topology(seeds: &[&str], set_name: Option<&str>) -> Topology {
    let settings = TopologySettings {
        replica_set: set_name.map(String::from),
        ..TopologySettings::new(seeds.iter().map(|s| addr(s)).collect())
    };
    Topology::new(settings, Instant::ZERO).expect("valid settings")
}

/// Drops every queued event and action.
pub fn drain(topology: &mut Topology) {
    while topology.poll_event().is_some() {}
    while topology.poll_action().is_some() {}
}

/// An `ok: 1` reply with a current wire version and `fields`.
pub fn hello(fields: Document) -> Document {
    let mut reply = doc! {"ok": 1, "minWireVersion": 0, "maxWireVersion": 21};
    reply.extend(fields);
    reply
}

fn member(set_name: &str, hosts: &[&str], role: &str) -> Document {
    let hosts: Vec<String> = hosts.iter().map(|h| addr(h).to_string()).collect();
    hello(doc! {"setName": set_name, "hosts": hosts, role: true})
}

/// A primary of `set_name` listing `hosts`.
pub fn primary(set_name: &str, hosts: &[&str]) -> Document {
    member(set_name, hosts, "isWritablePrimary")
}

/// A secondary of `set_name` listing `hosts`.
pub fn secondary(set_name: &str, hosts: &[&str]) -> Document {
    member(set_name, hosts, "secondary")
}
