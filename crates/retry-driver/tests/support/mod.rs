//! Shared scaffolding of the driver's integration tests.

pub mod clock;
