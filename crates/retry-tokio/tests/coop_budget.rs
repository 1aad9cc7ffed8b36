//! House rule 8: what retry-driver's `TimerWake` guards against, on tokio's own timer. A
//! poll made after the task's coop budget is used up returns `Pending` and wakes the poller (at
//! the end of the task's poll) instead of keeping its waker; after a firing (which takes the waker) nothing is then
//! registered, and the next firing wakes nobody unless the timer is polled again. The driver
//! used to take such a poll as arming the timer and skipped it until its deadline neared: a
//! lost wake whenever nothing else woke the driver (retry-driver's
//! `house_rule_8_a_refused_timer_poll_is_polled_again_after_its_wake` drives that case).

use core::future::{poll_fn, Future};
use core::pin::pin;
use core::task::{Context, Poll, Waker};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Wake;
use std::time::Duration;

use retry_core::time::Instant;
use retry_driver::Runtime;
use retry_tokio::TokioRuntime;

/// A waker that counts its wakes.
#[derive(Default)]
struct Counted(AtomicUsize);

impl Wake for Counted {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Uses up the coop budget of the task polled with `cx` (tokio's is 128 units).
fn use_up_budget(cx: &mut Context<'_>) {
    for _ in 0..1_000 {
        if pin!(tokio::task::consume_budget()).poll(cx).is_pending() {
            return;
        }
    }
    panic!("the coop budget was never used up");
}

#[tokio::test(start_paused = true)]
async fn house_rule_8_a_timer_polled_without_coop_budget_keeps_no_waker() {
    let runtime = TokioRuntime::start().unwrap();
    let counted = Arc::new(Counted::default());
    let waker = Waker::from(counted.clone());
    let wakes = || counted.0.load(Ordering::Relaxed);
    let mut timer = runtime.new_timer(Instant::from_millis(100));
    assert!(timer
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(wakes(), 1, "the firing wakes the waker it kept");

    // Re-armed, then polled with the budget used up: refused.
    timer.as_mut().reset(Instant::from_millis(200));
    let refused = poll_fn(|cx| {
        use_up_budget(cx);
        Poll::Ready(timer.as_mut().poll(&mut Context::from_waker(&waker)))
    })
    .await;
    assert!(refused.is_pending());
    // tokio defers that wake to the end of the task's poll.
    tokio::task::yield_now().await;
    assert_eq!(wakes(), 2, "a refused poll wakes the poller at once");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(wakes(), 2, "no waker was kept: the firing wakes nobody");
    // Polled again (what the driver does after any wake of its timer), it has fired.
    assert!(timer
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_ready());
}
