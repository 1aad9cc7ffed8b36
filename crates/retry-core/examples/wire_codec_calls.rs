//! Runs one wire-codec operation (`copy`, `encode` or `decode`) on a 1 KB or 1 MB message a given
//! number of times, for counting instructions (callgrind) and allocations (valgrind's heap summary)
//! per call. Only the never-inlined `once` is counted by callgrind (`--toggle-collect`), so
//! building the message is not.
//!
//! ```sh
//! cargo run --release -p retry-core --example wire_codec_calls -- decode 1MB 10
//! ```
//!
//! `docs/benchmarks.md` has the valgrind commands (`scripts/bench-wire-valgrind.sh`).

use std::hint::black_box;
use std::process::ExitCode;

use retry_core::wire::{FrameDecoder, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES};

#[path = "../benches/support/wire_messages.rs"]
mod wire_messages;

/// One operation; never inlined, so callgrind can count it alone. Returns a length so the work is
/// not optimized away.
#[inline(never)]
fn once(op: &str, message: &OpMsg, bytes: &[u8]) -> usize {
    match op {
        "copy" => black_box(black_box(bytes).to_vec()).len(),
        "encode" => {
            let mut out = Vec::new();
            message
                .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut out)
                .map_or(0, |_| out.len())
        }
        _ => {
            let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
            match decoder.decode(black_box(bytes)) {
                Ok((_, Some(m))) => m.body.len(),
                _ => 0,
            }
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(op), Some(size), Some(calls)) = (args.first(), args.get(1), args.get(2)) else {
        eprintln!("usage: wire_codec_calls copy|encode|decode 1KB|1MB CALLS");
        return ExitCode::FAILURE;
    };
    let (Some(message), Ok(calls)) = (wire_messages::message(size), calls.parse::<u32>()) else {
        eprintln!("usage: wire_codec_calls copy|encode|decode 1KB|1MB CALLS");
        return ExitCode::FAILURE;
    };
    if !["copy", "encode", "decode"].contains(&op.as_str()) {
        eprintln!("unknown operation {op}");
        return ExitCode::FAILURE;
    }
    let bytes = wire_messages::encoded(&message);
    let mut total = 0;
    for _ in 0..calls {
        total += once(op, &message, &bytes);
    }
    println!(
        "{op} {size} x{calls}: {} bytes per message, checksum {total}",
        bytes.len()
    );
    ExitCode::SUCCESS
}
