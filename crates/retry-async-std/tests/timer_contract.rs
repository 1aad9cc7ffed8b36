//! Review28 U10, review26 S5 (house rule 8): async-io's timers against `AsyncTimer`'s contract,
//! checked by [`retry_driver::conformance::check_timer`] (bounded, house rule 12). async-io's
//! client is driven by its own futures, which reset and poll the watchdog's timer under the
//! lock its wake takes: a synchronous wake would deadlock it.

use retry_async_std::AsyncIoRuntime;
use retry_driver::Runtime;

#[test]
fn review28_u10_timers_never_wake_synchronously_and_fire() {
    async_io::block_on(async {
        let runtime = AsyncIoRuntime::start().expect("the runtime");
        if let Err(e) = retry_driver::conformance::check_timer(&runtime).await {
            panic!("{e}");
        }
    });
}
