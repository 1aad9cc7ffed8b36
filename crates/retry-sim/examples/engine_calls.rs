//! Runs one whole engine operation in the simulated driver (`engine`), or the codec work of the
//! same OP_MSG round trip alone (`codec`), a given number of times, for counting instructions
//! (callgrind) and allocations (valgrind's heap summary) per operation. Only the never-inlined
//! [`once`] is counted by callgrind (`--toggle-collect`), so building and warming up the
//! simulation is not.
//!
//! ```sh
//! cargo run --release -p retry-sim --example engine_calls -- engine 1000
//! ```
//!
//! `docs/benchmarks.md` has the valgrind commands (`scripts/bench-engine-valgrind.sh`).

use std::hint::black_box;
use std::process::ExitCode;

use retry_core::wire::OpMsg;

use retry_sim::{engine_ops, Sim};

/// One operation or one codec round trip; never inlined, so callgrind can count it alone.
#[inline(never)]
fn once(sim: Option<&mut Sim>, request: &OpMsg, reply: &OpMsg) -> usize {
    match sim {
        Some(sim) => engine_ops::one_operation(sim),
        None => engine_ops::codec_round_trip(black_box(request), black_box(reply)),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [case, calls] if case == "engine" || case == "codec" => calls
            .parse::<u32>()
            .ok()
            .map(|calls| (case.as_str(), calls)),
        _ => None,
    };
    let Some((case, calls)) = parsed else {
        eprintln!("usage: engine_calls engine|codec CALLS");
        return ExitCode::FAILURE;
    };
    let (request, reply) = engine_ops::round_trip_messages();
    // Both cases build and warm up the same simulation, so that it cancels out of the counts.
    let mut sim = engine_ops::three_mongos();
    let mut checksum = 0;
    for _ in 0..calls {
        let sim = (case == "engine").then_some(&mut sim);
        checksum += once(sim, &request, &reply);
    }
    println!("{case} x{calls}: checksum {checksum}");
    ExitCode::SUCCESS
}
