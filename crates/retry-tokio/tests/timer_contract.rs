//! Review28 U10, review26 S5 (house rule 8): tokio's timers against `AsyncTimer`'s contract,
//! checked by [`retry_driver::conformance::check_timer`] (bounded, house rule 12). tokio spawns,
//! so the rules against synchronous wakes do not bind it (review29 V3), nor does the
//! watchdog's sequence (review30 W1); the others do.

use retry_driver::Runtime;
use retry_tokio::TokioRuntime;

#[test]
fn review28_u10_timers_fire_on_time() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let runtime = TokioRuntime::start().expect("the runtime");
        if let Err(e) = retry_driver::conformance::check_timer(&runtime).await {
            panic!("{e}");
        }
    });
}
