//! A virtual clock for the driver's tests: time moves only when a test says, and the timers
//! due are woken when it does (shared by `unflushed.rs` and `scripted_wire.rs`).

use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use retry_core::time::Instant;
use retry_driver::AsyncTimer;

/// A clock the test moves; the timers due are woken when it does.
#[derive(Debug, Default)]
pub struct Clock {
    nanos: AtomicU64,
    timers: Mutex<Vec<Arc<TimerState>>>,
}

#[derive(Debug)]
struct TimerState {
    at: AtomicU64,
    waker: Mutex<Option<Waker>>,
}

impl Clock {
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.nanos.load(Ordering::Acquire))
    }

    /// Moves the clock to `ms` and wakes the timers due then.
    pub fn advance_to(&self, ms: u64) {
        let now = Instant::from_millis(ms);
        self.nanos.store(now.as_nanos(), Ordering::Release);
        for timer in self.timers.lock().unwrap().iter() {
            if timer.at.load(Ordering::Acquire) <= now.as_nanos() {
                if let Some(waker) = timer.waker.lock().unwrap().take() {
                    waker.wake();
                }
            }
        }
    }

    /// A timer on this clock, due at `at`.
    pub fn timer(self: &Arc<Self>, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        let state = Arc::new(TimerState {
            at: AtomicU64::new(at.as_nanos()),
            waker: Mutex::new(None),
        });
        self.timers.lock().unwrap().push(state.clone());
        Box::pin(ClockTimer {
            clock: self.clone(),
            state,
        })
    }
}

#[derive(Debug)]
struct ClockTimer {
    clock: Arc<Clock>,
    state: Arc<TimerState>,
}

impl AsyncTimer for ClockTimer {
    fn reset(self: Pin<&mut Self>, at: Instant) {
        self.state.at.store(at.as_nanos(), Ordering::Release);
    }

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.state.at.load(Ordering::Acquire) <= self.clock.now().as_nanos() {
            return Poll::Ready(());
        }
        *self.state.waker.lock().unwrap() = Some(cx.waker().clone());
        Poll::Pending
    }
}
