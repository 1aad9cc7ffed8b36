//! # retry-core
//!
//! A sans-IO engine for MongoDB clients. It decides *whether, when, where and on which connection*
//! each attempt of a command runs, and owns no I/O: no sockets, no clock reads, no threads, no
//! async, no global RNG. Time comes in as a parameter ([`time::Instant`]); randomness comes from an
//! RNG the machine owns, seeded from options ([`rng`]).
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
pub mod error;
pub mod handshake;
pub mod policy;
pub mod retry;
pub mod rng;
pub mod scenario;
pub mod selection;
pub mod time;
pub mod topology;
pub mod wire;
