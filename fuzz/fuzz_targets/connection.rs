#![no_main]

#[path = "../harness.rs"]
#[allow(dead_code)] // each target uses one harness
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::connection(data));
