//! # retry-core
//!
//! A sans-IO engine for MongoDB clients. It decides *whether, when, where and on which connection*
//! each attempt of a command runs, and owns no I/O: no sockets, no clock reads, no threads, no
//! async, no global RNG. Time comes in as a parameter ([`time::Instant`]); randomness comes from an
//! RNG each machine owns, seeded from its caller ([`rng`]). The same seed and the same inputs give
//! the same actions and timestamps, bit for bit.
//!
//! It follows the MongoDB specifications at a pinned commit: client backpressure, retryable reads
//! and writes. Doc comments cite the requirement IDs of the project's spec digest (`BP-14`,
//! `RW-17`, ...). The earlier token-bucket backpressure and gRPC A6 retries are available as
//! explicit, non-default [`policy::RetryPolicy`] variants.
//!
//! ## Modules
//!
//! | module | owns |
//! | --- | --- |
//! | [`time`] | the monotonic [`time::Instant`] newtype and CSOT deadlines |
//! | [`address`] | [`address::ServerAddress`] |
//! | [`topology`] | server and topology descriptions from `hello` replies; the SDAM update machine ([`topology::Topology`]): update rules, error handling, pools per server, SDAM events |
//! | [`selection`] | server selection with deprioritization, the latency window and the selection loop |
//! | [`engine`] | composes every machine behind one sans-IO interface for adapters |
//! | [`error`] | error facts parsed from replies and network failures, and the classifiers |
//! | [`rng`] | the seeded generator and exact jitter |
//! | [`backoff`] | backoff formulas |
//! | [`budget`] | retry budgets shared through `&self` without locks |
//! | [`monitor`] | server monitoring: check schedule, RTT, descriptions from checks |
//! | [`pinning`] | transaction and load-balanced cursor pins (TX-3..5, LB-10..12) |
//! | [`policy`] | retry options and policies, validated |
//! | [`pool`] | connection-pool accounting (CMAP) for one server |
//! | [`retry`] | the per-operation retry state machine |
//! | [`hedging`] | hedged reads (gRPC A6): copies in flight at once, first success wins |
//! | [`service_config`] | the gRPC-style service config (A6): per-command retry or hedging policies, throttling |
//! | [`scenario`] | a scripted, bounded driver for the retry machine in virtual time |
//!
//! ## Driving a machine
//!
//! Inputs are `handle_*` methods that take `now`; outputs are polled until `None`. After any
//! input, drain every `poll_*`, then wait for the earlier of `poll_timeout()` and the next input.
//! A spurious `handle_timeout` is harmless.
//!
//! ```
//! use retry_core::address::ServerAddress;
//! use retry_core::error::OperationError;
//! use retry_core::policy::RetryOptions;
//! use retry_core::retry::{Action, AttemptServer, OperationKind, OperationSpec, RetryMachine};
//! use retry_core::time::Instant;
//! use retry_core::topology::{ServerType, TopologyType};
//!
//! let server = AttemptServer {
//!     address: ServerAddress::new("db0.example.com", 27017),
//!     server_type: ServerType::RsPrimary,
//!     topology_type: TopologyType::ReplicaSetWithPrimary,
//!     max_wire_version: 25,
//!     sessions_supported: true,
//! };
//! // The first attempt is rejected by an overloaded server; the retry succeeds.
//! let overloaded = bson::doc! { "ok": 0, "code": 462,
//!     "errorLabels": ["SystemOverloadedError", "RetryableError"] };
//! let mut replies = vec![Some(overloaded), None].into_iter();
//!
//! let mut now = Instant::ZERO;
//! let spec = OperationSpec::new(OperationKind::Read);
//! let mut op = RetryMachine::new(spec, &RetryOptions::default(), 7, now);
//! let result = loop {
//!     match op.poll_action() {
//!         Some(Action::SelectServer) => op.handle_server_selected(server.clone(), now).unwrap(),
//!         Some(Action::Dispatch(attempt)) => {
//!             // Check out a connection to attempt.address, send the command, read the reply.
//!             op.handle_sent(now).unwrap();
//!             match replies.next().flatten() {
//!                 Some(reply) => {
//!                     let error = OperationError::from_reply(&reply, &attempt.address).unwrap();
//!                     op.handle_failed(error, now).unwrap();
//!                 }
//!                 None => op.handle_succeeded(now).unwrap(),
//!             }
//!         }
//!         Some(Action::ReleaseConnection { .. }) => { /* check the connection in */ }
//!         Some(Action::Wait { .. }) => {}
//!         Some(Action::Finished(result)) => break result,
//!         None => {
//!             // Sleep until the backoff ends (virtual time here), then tell the machine.
//!             now = op.poll_timeout().expect("a backoff is pending");
//!             op.handle_timeout(now);
//!         }
//!     }
//!     while let Some(event) = op.poll_event() {
//!         println!("{event:?}");
//!     }
//! };
//! assert!(result.is_ok());
//! assert_eq!(op.attempts(), 2);
//! assert!(now > Instant::ZERO, "the overload error was backed off");
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

extern crate alloc;

pub mod address;
pub mod backoff;
pub mod budget;
pub mod connection;
pub mod engine;
pub mod error;
pub mod handshake;
pub mod hedging;
pub mod monitor;
pub mod pinning;
pub mod policy;
pub mod pool;
pub mod retry;
pub mod rng;
pub mod scenario;
pub mod selection;
pub mod service_config;
pub mod time;
pub mod topology;
pub mod wire;
