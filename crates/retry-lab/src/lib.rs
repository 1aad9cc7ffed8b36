//! # retry-lab
//!
//! The command-line program of retry-core. `retry-lab demo` (the default) starts test `mongos`
//! routers on 127.0.0.1 behind ingress rate limiters and drives the same concurrent load through
//! the tokio client under each retry policy, then prints what each policy cost and achieved.
//! `retry-lab probe <uri>` connects to any server, runs a ping with retries and prints every event.
//! `retry-lab serve` runs the fault-injecting test server from the command line ([`serve`]).
//! `retry-lab simulate` compares the policies in a deterministic simulation ([`simulate`]).
//!
//! The lab decides nothing: every retry decision is retry-core's. It only drives the client and
//! counts what the client reports ([`stats`]) and what the servers saw ([`cluster`]).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod cli;
pub mod cluster;
pub mod demo;
pub mod probe;
pub mod report;
pub mod serve;
pub mod service_config;
pub mod simulate;
pub mod stats;
