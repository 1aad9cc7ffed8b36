//! Adapter benchmarks (see `benches/round_trip.rs` and `docs/benchmarks.md`); the crate itself is
//! empty.
