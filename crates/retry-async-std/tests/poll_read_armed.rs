//! Review25 R4, review28 U1–U3 (house rule 8): `Socket::poll_read_armed` on async-io, checked by
//! [`retry_driver::conformance::check_read_armed`] on a 127.0.0.1 pair: this adapter arms its
//! short reads, and the waker of each armed read is woken by the peer's next bytes or by the
//! end of the stream; a read that fills the buffer, and the end of the stream, are not armed.
//! The check is bounded (house rule 12); `conformance_fails.rs` in retry-tokio shows it fails
//! on a socket that breaks the contract (house rule 10).

use retry_async_std::AsyncIoRuntime;
use retry_driver::Runtime;

#[test]
fn review25_r4_short_reads_are_armed_full_reads_and_the_end_are_not() {
    async_io::block_on(async {
        let runtime = AsyncIoRuntime::start().expect("the runtime");
        match retry_driver::conformance::check_read_armed(&runtime).await {
            Ok(armed) => assert!(armed, "this adapter's short reads are armed"),
            Err(e) => panic!("{e}"),
        }
    });
}
