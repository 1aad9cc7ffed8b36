//! Review28 U10, review26 S5, review30 W1 (house rule 8): this adapter's timers (a timerfd on the
//! reactor on Linux, `async_io::Timer` elsewhere) against `AsyncTimer`'s contract, checked by
//! [`retry_driver::conformance::check_timer`] (bounded, house rule 12). This runtime does not
//! spawn: its client is driven by its own futures, whose watchdog resets and polls one timer
//! with one waker under the lock that waker's wake takes, and again from within that wake, so
//! neither call may wake that waker before returning, nor wait for its wake on another thread;
//! the check replays that sequence on a fresh timer, the re-arm from within the wake (which
//! async-io's reactor makes, on its thread or on the one in `block_on`) included (review31 X1).
//! A poll may
//! wake a replaced waker that does not `will_wake` the new one, as the timerfd's readiness
//! registration does.

use retry_async_std::AsyncIoRuntime;
use retry_driver::Runtime;

#[test]
fn review28_u10_review30_w1_timers_never_wake_the_watchdogs_waker_synchronously_and_fire() {
    async_io::block_on(async {
        let runtime = AsyncIoRuntime::start().expect("the runtime");
        if let Err(e) = retry_driver::conformance::check_timer(&runtime).await {
            panic!("{e}");
        }
    });
}
