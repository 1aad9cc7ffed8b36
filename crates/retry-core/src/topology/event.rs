//! SDAM monitoring events and the actions the topology asks of its owner.

use alloc::boxed::Box;

use super::{ServerDescription, TopologyDescription};
use crate::address::ServerAddress;
use crate::pool::Pool;

/// An SDAM monitoring event, published by [`super::Topology::poll_event`] in the order the SDAM
/// logging-and-monitoring spec gives (LB-4 for load-balanced mode).
#[derive(Clone, Debug, PartialEq)]
pub enum SdamEvent {
    /// The topology was created; always the first event.
    TopologyOpening,
    /// A server entered the topology (a seed, or a member another server reported).
    ServerOpening {
        /// The new server.
        address: ServerAddress,
    },
    /// A server's description changed by SDAM server description equality
    /// ([`ServerDescription::is_equivalent_to`]); a repeated identical reply publishes nothing.
    ServerDescriptionChanged {
        /// The server.
        address: ServerAddress,
        /// Its description before.
        previous: Box<ServerDescription>,
        /// Its description now.
        new: Box<ServerDescription>,
    },
    /// A server left the topology.
    ServerClosed {
        /// The removed server.
        address: ServerAddress,
    },
    /// The topology description changed; published after the server events of the same update.
    TopologyDescriptionChanged {
        /// The description before the update.
        previous: Box<TopologyDescription>,
        /// The description after it.
        new: Box<TopologyDescription>,
    },
    /// The topology was closed; always the last event.
    TopologyClosed,
}

/// What the topology needs its owner (the engine) to do, from
/// [`super::Topology::poll_action`].
#[derive(Debug)]
pub enum TopologyAction {
    /// A server joined the topology: start monitoring it. Its pool is
    /// [`super::Topology::pool_mut`]. Never asked in load-balanced mode (LB-3: no monitoring).
    StartMonitoring(ServerAddress),
    /// A server left the topology: stop monitoring it and take its closed pool, whose remaining
    /// events the owner drains and whose in-use connections close when they are checked in.
    StopMonitoring {
        /// The removed server.
        address: ServerAddress,
        /// Its pool, already closed.
        pool: Box<Pool>,
    },
    /// Check this server as soon as the monitor may: it answered with a state-change error, or a
    /// newer primary made its primary claim stale (SDAM, multi-threaded and asynchronous rules).
    CheckNow(ServerAddress),
    /// Cancel the check in progress on this server: an application connection to it failed with
    /// a network error, so the monitor's connection probably failed too (SDAM `handleError`).
    CancelCheck(ServerAddress),
}
