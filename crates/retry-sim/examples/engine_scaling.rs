//! N reads started at once on three mongos (default pool options) in the simulated driver and run
//! to completion, after a warm-up burst of the same size, for `scripts/bench-engine-scaling.sh`
//! (issue 9: cost follows the work, house rule 9). Only the never-inlined [`measured`] burst is
//! counted: by callgrind (`--toggle-collect=engine_scaling::measured`) for instructions, and by the
//! counting allocator below for allocations, which this program prints.
//!
//! `engine-rp8` is `engine` with eight read preferences in rotation (more than the engine's
//! selection cache keeps per topology revision). `codec` instead runs N OP_MSG round trips
//! through the codec alone (the baseline).
//!
//! ```sh
//! cargo run --release -p retry-sim --example engine_scaling -- engine 100
//! ```

#![allow(unsafe_code)] // The counting allocator forwards to `System`; nothing else is unsafe.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use retry_core::selection::SelectionCriteria;
use retry_core::wire::OpMsg;
use retry_sim::engine_ops;

/// Counts allocations while [`COUNTING`] is on.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are plain
// atomics, so touching them never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The measured burst; never inlined, so callgrind can count it alone.
#[inline(never)]
fn measured(
    sim: Option<&mut retry_sim::Sim>,
    criteria: &[SelectionCriteria],
    messages: &(OpMsg, OpMsg),
    n: usize,
) -> usize {
    match sim {
        Some(sim) => engine_ops::burst_with(sim, n, criteria),
        None => (0..n)
            .map(|_| engine_ops::codec_round_trip(black_box(&messages.0), black_box(&messages.1)))
            .sum(),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [case, n] if ["engine", "engine-rp8", "codec"].contains(&case.as_str()) => n
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .map(|n| (case.as_str(), n)),
        _ => None,
    };
    let Some((case, n)) = parsed else {
        eprintln!("usage: engine_scaling engine|engine-rp8|codec N (N > 0)");
        return ExitCode::FAILURE;
    };
    let messages = engine_ops::round_trip_messages();
    let criteria = match case {
        "engine-rp8" => engine_ops::eight_read_preferences(),
        _ => vec![retry_sim::primary()],
    };
    let engine = case != "codec";
    let mut sim = engine_ops::three_mongos();
    // The warm-up burst: the pools grow to what N in flight needs, the buffers to their size.
    let warm = match engine {
        true => engine_ops::burst_with(&mut sim, n, &criteria),
        false => measured(None, &criteria, &messages, n),
    };
    let sockets_before = sim.sockets.len() + sim.retired.len();
    COUNTING.store(true, Ordering::Relaxed);
    let checksum = measured(engine.then_some(&mut sim), &criteria, &messages, n);
    COUNTING.store(false, Ordering::Relaxed);
    let sockets_opened = sim.sockets.len() + sim.retired.len() - sockets_before;
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    println!(
        "case={case} in_flight={n} allocations={allocations} allocations_per_op={:.1} \
         sockets_opened={sockets_opened} checksum={}",
        allocations as f64 / n as f64,
        checksum + warm
    );
    ExitCode::SUCCESS
}
