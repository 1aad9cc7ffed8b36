//! A bounded simulated driver for the [`retry_core`] engine, in the style of quinn-proto's `Pair`:
//! the engine, scripted in-memory servers that speak OP_MSG, a network with a fixed one-way
//! latency ([`LATENCY`]) and a virtual clock. Nothing touches a socket or the system clock, so a
//! run is deterministic (house rule 2): the same servers, options and calls give the same events at
//! the same virtual instants, bit for bit.
//!
//! - **Virtual clock.** [`Sim::now`] only moves when the driver steps to the next delivery or
//!   engine timer ([`Sim::step`], [`Sim::advance_to`], [`Sim::run`]); timing assertions are exact.
//! - **Scripted servers.** A [`SimServer`] answers `hello` by its [`Role`] (standalone, mongos,
//!   load balancer, replica-set member with its [`MemberState`]) and every
//!   other command by its script of [`Step`]s:
//!   replies (optionally late), connection resets, bytes that are not OP_MSG. Tests change a
//!   server's role or script between steps to move the topology.
//! - **Step cap.** Every loop of the driver is capped at [`MAX_STEPS`] and every run at a bound of
//!   virtual time; a run that does not settle panics instead of spinning (house rule 12).
//!
//! - **Fixtures.** The set-ups and readers the tests share: a load balancer or a recording mongos
//!   behind a [`Sim`] ([`Sim::lb`], [`Sim::mongos`]), [`replica_set`], the requests of a
//!   transaction and a cursor on `test.c` ([`request`], [`insert`], [`open_cursor`],
//!   [`get_more`], [`kill_cursors`], [`commit`], [`abort`]), and what the servers received and the
//!   pools did ([`Sim::received`], [`Sim::log`], [`Sim::pool_trace`]).
//!
//! Users: this crate's tests (`engine_sim`, the engine property test `engine_properties`, the
//! regressions it found), the criterion bench `benches/engine.rs`, and the examples
//! `engine_calls` (instructions and allocations of one operation) and `engine_scaling` (a burst of
//! N operations in flight, for `scripts/bench-engine-scaling.sh`); their shared workloads are in
//! [`engine_ops`].
//!
//! ```
//! use bson::doc;
//! use retry_sim::{address, Role, Sim, SimServer};
//!
//! // Three mongos; the engine discovers them and a read goes to one of them.
//! let servers = ["m1", "m2", "m3"]
//!     .into_iter()
//!     .map(|host| (address(host), SimServer::new(Role::Mongos)))
//!     .collect();
//! let mut sim = Sim::new(servers, |_options| {});
//! let op = sim.read(doc! { "find": "c" });
//! let reply = sim.run(op).expect("a healthy mongos answers");
//! assert_eq!(reply.get_i32("ok").ok(), Some(1));
//! // One attempt, and virtual time moved only by the simulated network and handshakes.
//! assert_eq!(sim.attempt_servers(op).len(), 1);
//! assert!(sim.now.since_origin() < std::time::Duration::from_secs(1));
//! ```
#![warn(missing_docs)]

mod driver;
pub mod engine_ops;
mod fixtures;

pub use driver::*;
pub use fixtures::{
    abort, commit, cursor_batch, get_more, insert, kill_cursors, open_cursor, pool_of_one,
    read_request, replica_set, request, FIRST_WRITE, LATER_READ, LATER_WRITE,
};
