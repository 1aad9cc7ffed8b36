//! What a driver needs from an async runtime, in the manner of quinn's `Runtime`: a clock, timers,
//! an optional spawn and TCP sockets. Nothing here decides anything; the engine does.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::io;

use retry_core::time::Instant;

use crate::srv::SrvRecord;

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// An async runtime: its clock, its timers, its spawn and its TCP connect.
///
/// A runtime value is created per client ([`Runtime::start`]); its clock reads
/// [`retry_core::time::Instant`]s as nanoseconds since that moment.
pub trait Runtime: Send + Sync + fmt::Debug + 'static {
    /// A runtime whose clock starts now, or why there is none (e.g. no runtime is running).
    fn start() -> io::Result<Self>
    where
        Self: Sized;

    /// The runtime's clock, as nanoseconds since [`Runtime::start`].
    fn now(&self) -> Instant;

    /// A timer that fires at `at` (on the clock of [`Runtime::now`]).
    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>>;

    /// Whether the driver gets a task of its own ([`Runtime::spawn`]). `false` for runtimes
    /// without an executor of their own: the client's futures (operations, event streams,
    /// shutdown) then drive it on the caller's executor, with no task and no thread.
    fn spawns(&self) -> bool {
        true
    }

    /// Runs `future` to completion in the background, or says why it cannot. Called only when
    /// [`Runtime::spawns`]; the default cannot.
    fn spawn(&self, future: BoxFuture<()>) -> io::Result<()> {
        drop(future);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this runtime has no executor; the client drives its engine on the caller's",
        ))
    }

    /// Opens a TCP connection to `host:port`.
    fn connect(&self, host: String, port: u16) -> BoxFuture<io::Result<Pin<Box<dyn Socket>>>>;

    /// The SRV records of `name` (SRV-2), for `mongodb+srv`. The default has no resolver.
    fn resolve_srv(&self, name: String) -> BoxFuture<io::Result<Vec<SrvRecord>>> {
        Box::pin(async move { Err(no_resolver(&name)) })
    }

    /// The TXT records of `name`, each as its character strings in order (SRV-5); an error of
    /// kind `NotFound` when the name has none. The default has no resolver.
    fn resolve_txt(&self, name: String) -> BoxFuture<io::Result<Vec<Vec<String>>>> {
        Box::pin(async move { Err(no_resolver(&name)) })
    }
}

fn no_resolver(name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("cannot look up {name}: this runtime has no DNS resolver for SRV and TXT records"),
    )
}

/// A resettable timer.
///
/// On every runtime, a timer is never `Ready` before its instant (on [`Runtime::now`]'s clock);
/// once the instant has passed, the waker of its last `Pending` poll is woken and a poll returns
/// `Ready` (an early or extra wake is harmless: the timer is polled again; house rule 8); polled
/// after a reset to an instant it has already seen pass, it is `Ready` at once, or, on a runtime
/// that spawns, `Pending` having woken its own waker, then `Ready` when polled after the task
/// yields (tokio's `Sleep` once its task's coop budget is spent; review30 W2).
///
/// On a runtime that does not spawn ([`Runtime::spawns`]), moreover, before it returns,
/// [`AsyncTimer::reset`] (to any instant) may not wake the waker of the timer's last poll, and
/// [`AsyncTimer::poll`] may wake neither the waker it is given nor the last poll's waker when
/// that one `will_wake` it (a timer already due returns `Ready`, it does not wake). The client
/// of such a runtime is driven by its own futures, and its watchdog polls its timer always with
/// one waker: it resets the timer to 5 ms ahead and polls it while holding the lock that this
/// waker's wake takes, and again from within that wake after each firing, so a wake from within
/// either call would deadlock it (review26 S5, review28 U10, review29 V3, review30 W1). As
/// `reset` and `poll` may be called from within that waker's wake, on whatever thread the timer
/// wakes it on, neither may wait for a wake of that waker made on any thread (it blocks on the
/// lock the waiting call's caller holds), and the timer may not wake it while holding a lock
/// its `reset` or `poll` takes (review31 X1). Those
/// 5 ms may have passed by the time of the reset (the thread preempted): hence the rule for
/// instants already past too. A poll may wake a waker it replaces that does not `will_wake` the
/// one it is given: async-io's readiness registration does, and so retry-async-std's timerfd
/// timer does (`async_io::Timer` drops the replaced waker silently). A runtime that spawns runs
/// the driver in a task of its own, which holds no such lock, so these rules do not bind it:
/// tokio's `Sleep` wakes its last poll's waker when reset to an instant its timer wheel has
/// passed, and its own waker from a poll once its task's coop budget is spent.
/// [`crate::conformance::check_timer`] checks this contract; on a runtime that does not spawn,
/// it replays the watchdog's sequence, its re-arm from within the wake included (review31 X1).
pub trait AsyncTimer: Send + fmt::Debug {
    /// Makes the timer fire at `at` instead.
    fn reset(self: Pin<&mut Self>, at: Instant);

    /// Ready once the timer's instant has passed.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()>;
}

/// An open TCP connection, read and written by polling.
pub trait Socket: Send {
    /// Reads into `buf`; `Ok(0)` is the end of the stream.
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>>;

    /// [`Socket::poll_read`], also saying whether `cx`'s waker is left registered for the next
    /// bytes after a read that returned some (a short read drained the socket, and the socket
    /// registered for its readiness at once): the driver then reads again only after that
    /// waker's wake, where it would otherwise read once more to get the `Pending` that
    /// registers it (issue 9: one read poll per reply instead of two). `true` only if a wake is
    /// certain to come when bytes arrive (or are there already), the stream ends or the socket
    /// fails (review28 U1: the driver reads an armed socket only after that wake, so a runtime
    /// that wakes for data alone never shows it a server's FIN or RST); never after a read that
    /// filled `buf` (more bytes may be waiting) or returned the end of the stream. The default
    /// never says so. [`crate::conformance::check_read_armed`] checks this contract.
    fn poll_read_armed(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<(usize, bool)>> {
        self.poll_read(cx, buf).map_ok(|n| (n, false))
    }

    /// Writes from `buf`; returns how many bytes were written.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>>;
}

/// When, on a runtime's own clock whose instant `origin` is the engine's [`Instant::ZERO`], a
/// timer for `at` fires: `origin` plus the time since the engine's origin, where "never"
/// ([`Instant::MAX`], about 584 years) becomes 30 years, which every runtime's clock can
/// represent. The one mapping every adapter's [`AsyncTimer`] uses.
pub fn timer_deadline<T>(origin: T, at: Instant) -> T
where
    T: core::ops::Add<core::time::Duration, Output = T>,
{
    const FAR: core::time::Duration = core::time::Duration::from_secs(86_400 * 365 * 30);
    origin + at.since_origin().min(FAR)
}

/// The socket address of `host:port` when `host` is an IP literal or `localhost` (127.0.0.1), for
/// runtimes without a resolver of their own.
pub fn literal_address(host: &str, port: u16) -> io::Result<std::net::SocketAddr> {
    let ip = if host.eq_ignore_ascii_case("localhost") {
        std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
    } else {
        host.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{host} is not an IP address or localhost; this runtime does not resolve names"
                ),
            )
        })?
    };
    Ok(std::net::SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_is_thirty_years_and_other_instants_are_exact() {
        let origin = std::time::Instant::now();
        assert_eq!(
            timer_deadline(origin, Instant::from_millis(1_500)),
            origin + core::time::Duration::from_millis(1_500)
        );
        assert_eq!(
            timer_deadline(origin, Instant::MAX),
            origin + core::time::Duration::from_secs(86_400 * 365 * 30)
        );
    }

    #[test]
    fn literal_addresses_and_localhost_resolve_others_do_not() {
        assert_eq!(
            literal_address("localhost", 27017).unwrap().to_string(),
            "127.0.0.1:27017"
        );
        assert_eq!(
            literal_address("127.0.0.1", 1).unwrap().to_string(),
            "127.0.0.1:1"
        );
        assert_eq!(literal_address("::1", 2).unwrap().to_string(), "[::1]:2");
        let error = literal_address("db.example.com", 27017).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(error.to_string().contains("db.example.com"), "{error}");
    }
}
