//! Runs `select_server` a given number of times on one benchmark topology, for counting
//! instructions (callgrind) and allocations (valgrind's heap summary) per call.
//!
//! ```sh
//! cargo run --release -p retry-core --example selection_calls -- rs-tags 50 10000
//! ```
//!
//! `docs/benchmarks.md` has the valgrind commands. Only [`select_once`] is counted by callgrind
//! (`--toggle-collect`), so setup does not enter the per-call figures.

use std::hint::black_box;
use std::process::ExitCode;

use retry_core::rng::EngineRng;
use retry_core::selection::{select_server, SelectionSettings};

#[path = "../benches/support/topologies.rs"]
mod topologies;

/// One selection; never inlined, so callgrind can count it alone.
#[inline(never)]
fn select_once(case: &topologies::Case, settings: &SelectionSettings, rng: &mut EngineRng) -> u16 {
    match select_server(
        &case.topology,
        &case.criteria,
        &case.deprioritized,
        settings,
        topologies::operation_count,
        rng,
    ) {
        Ok(Some(server)) => server.address.port(),
        _ => 0,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [shape, n, calls] => n
            .parse::<usize>()
            .ok()
            .zip(calls.parse::<u64>().ok())
            .and_then(|(n, calls)| match shape.as_str() {
                "rs-tags" => Some((topologies::replica_set_with_tags(n), calls)),
                "sharded" => Some((topologies::sharded(n), calls)),
                _ => None,
            }),
        _ => None,
    };
    let Some((case, calls)) = parsed else {
        eprintln!(
            "usage: selection_calls rs-tags|sharded SERVERS CALLS (SERVERS one of {:?})",
            topologies::SIZES
        );
        return ExitCode::FAILURE;
    };
    let settings = SelectionSettings::default();
    let mut rng = EngineRng::from_seed_u64(1);
    let mut checksum = 0u64;
    for _ in 0..calls {
        checksum += u64::from(select_once(black_box(&case), &settings, &mut rng));
    }
    println!(
        "{} n={} calls={calls} checksum={checksum}",
        case.shape,
        case.topology.servers.len()
    );
    ExitCode::SUCCESS
}
