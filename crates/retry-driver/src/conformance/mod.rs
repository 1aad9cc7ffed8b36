//! Checks of a [`Runtime`]'s sockets ([`check_read_armed`]) and timers ([`check_timer`]) against
//! the contracts the driver relies on, for the authors of adapters: run them from the adapter's
//! tests, on the adapter's own executor.
//!
//! Each check ends within 10 s of std's clock, each of its waits for a wake within 1 s of when
//! the wake is due (2 s for a wake that re-arms the timer, review31 X1; house rule 12), and each
//! of its loops is capped in steps. Its waits are
//! paced by one thread of its own, never by the runtime's timers, so a runtime whose timers
//! never fire, or wake without ever being `Ready`, fails the check instead of hanging it
//! (review29 V1); the thread is joined when the check ends (review30 W4), unless the check's
//! future is dropped on that thread, or the thread does not end within 1 s of being told to: it
//! then ends by the check's deadline on its own (review31 X3). That thread also makes the
//! re-arm of [`check_timer`]'s watchdog replay from within a wake, which waits for it 1 s at
//! most (review31 X1). A wake that a poll
//! makes of its own waker before it returns (tokio's, once its task's coop budget is spent) is
//! followed by one yield of the check's task, never by a busy loop (review30 W2).
//!
//! [`Runtime`]: crate::runtime::Runtime

mod pacing;
mod read_armed;
mod timer;
mod watchdog;

use core::time::Duration;
use std::io::{self, ErrorKind};

pub use read_armed::check_read_armed;
pub use timer::check_timer;

/// The pause between two looks at a socket or a listener.
const STEP: Duration = Duration::from_millis(5);

/// How long a whole check may take (house rule 12), on std's clock.
const BOUND: Duration = Duration::from_secs(10);

/// How long one wait for a wake may take (review28 U4), within [`BOUND`].
const WAIT: Duration = Duration::from_secs(1);

/// How many `Pending` polls of a timer or a socket, each after a wake (or a pause, for a
/// socket), a check makes before it fails (house rule 12: bounded in steps too).
const LOOKS: usize = 1000;

fn failed(kind: ErrorKind, step: &str, why: &str) -> io::Error {
    io::Error::new(kind, format!("check_read_armed: {step}: {why}"))
}

fn timed_out(step: &str) -> io::Error {
    failed(
        ErrorKind::TimedOut,
        step,
        &format!("not done within {BOUND:?}"),
    )
}
