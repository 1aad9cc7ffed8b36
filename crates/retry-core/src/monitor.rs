//! Server monitoring (SDAM server monitoring): when to check a server, its round-trip-time
//! statistics, and the description each check produces.
//!
//! A [`Monitor`] runs the polling or the streaming protocol for one server. It asks for a check
//! ([`MonitorAction::Check`]: send `hello` on the monitor's own connection, or open it: its
//! handshake is the check, MO-1) and measures the round trip; the caller hands each outcome, with
//! the average RTT, to the topology's update rules. When `serverMonitoringMode` allows it and the
//! server's last reply had a `topologyVersion`, the monitor streams instead (MO-7..MO-10): it asks
//! for an awaitable `hello` ([`MonitorAction::Await`], sent with `exhaustAllowed`) and each reply
//! the server pushes is an awaited check; round trips then come from the RTT connection
//! ([`Monitor::handle_rtt_sample`], MO-12), never from streamed replies.
//! Checks run every `heartbeatFrequencyMS` (10 s by default); a
//! requested immediate check (server selection found no suitable server) runs at once, but never
//! sooner than `minHeartbeatFrequencyMS` (500 ms) after the previous one. A network error on a
//! server that was known is reported Unknown (its pool cleared) and rechecked once at once (MO-11). Monitoring
//! checks are never subject to the overload retry policy (BP-6).

use alloc::collections::VecDeque;
use bson::Document;
use core::time::Duration;
use smallvec::SmallVec;

use crate::address::ServerAddress;
use crate::error::{ErrorKind, ErrorSummary, OperationError};
use crate::time::Instant;
use crate::topology::{AverageRtt, TopologyVersion};

/// `heartbeatFrequencyMS`'s default.
pub const DEFAULT_HEARTBEAT_FREQUENCY: Duration = Duration::from_secs(10);
/// `minHeartbeatFrequencyMS`: checks never run closer together than this.
pub const MIN_HEARTBEAT_FREQUENCY: Duration = Duration::from_millis(500);
/// CS-4: the minimum RTT is taken over this many recent samples.
pub const MIN_RTT_SAMPLES: usize = 10;

/// `serverMonitoringMode` (MO-7): whether monitors may use the streaming protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ServerMonitoringMode {
    /// Poll in a FaaS environment (HS-5), otherwise act as [`ServerMonitoringMode::Stream`]. The
    /// default.
    #[default]
    Auto,
    /// Stream when the server supports it, else poll.
    Stream,
    /// Always poll.
    Poll,
}

impl ServerMonitoringMode {
    /// MO-7, MO-8: whether to stream with a server whose last reply `server_streams` (it carried
    /// a `topologyVersion`), when the client runs in a FaaS environment or not (`faas`, HS-5).
    /// When this is false the monitor polls and opens no RTT connection.
    pub fn streams(self, faas: bool, server_streams: bool) -> bool {
        server_streams
            && match self {
                ServerMonitoringMode::Poll => false,
                ServerMonitoringMode::Stream => true,
                ServerMonitoringMode::Auto => !faas,
            }
    }
}

/// MO-8: the awaitable `hello` of the streaming protocol: `hello` (or legacy `isMaster`, HS-3)
/// with the server's last `topologyVersion` and `maxAwaitTimeMS` = `heartbeatFrequencyMS` as an
/// int64. Sent with `exhaustAllowed` (MO-9, WP-6); no `lsid`, `$clusterTime` or `maxTimeMS`
/// (MO-3).
pub fn awaitable_hello(
    use_hello: bool,
    version: &TopologyVersion,
    heartbeat_frequency: Duration,
) -> Document {
    let mut command = Document::new();
    command.insert(if use_hello { "hello" } else { "isMaster" }, 1);
    let mut tv = Document::new();
    tv.insert("processId", version.process_id);
    tv.insert("counter", version.counter);
    command.insert("topologyVersion", tv);
    command.insert(
        "maxAwaitTimeMS",
        i64::try_from(heartbeat_frequency.as_millis()).unwrap_or(i64::MAX),
    );
    command
}

/// What the caller must do for the monitor.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum MonitorAction {
    /// Send `hello` on the monitoring connection (opening it first if needed: its handshake is
    /// the check, [`Monitor::handle_handshake`]), then call [`Monitor::handle_check_succeeded`] or
    /// [`Monitor::handle_check_failed`].
    Check,
    /// MO-8, MO-9: send this awaitable `hello` ([`awaitable_hello`]) with `exhaustAllowed` on the
    /// monitoring connection; every reply goes to [`Monitor::handle_streamed_reply`], a failure
    /// to [`Monitor::handle_check_failed`].
    Await(Document),
    /// MO-12: while streaming, measure a round trip on the RTT connection: send `hello` on it, or
    /// open it (its handshake is the sample); report with [`Monitor::handle_rtt_sample`] or
    /// [`Monitor::handle_rtt_failed`]. No events are published for it.
    MeasureRtt,
}

/// A heartbeat monitoring event (SDAM, MO-15). `awaited` is true for the checks of the streaming
/// protocol, whose durations are not round trips.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeartbeatEvent {
    /// `ServerHeartbeatStartedEvent`.
    Started {
        /// An awaited (streamed) check.
        awaited: bool,
    },
    /// `ServerHeartbeatSucceededEvent`.
    Succeeded {
        /// The check's round trip (for an awaited check: from its start to the reply).
        duration: Duration,
        /// An awaited (streamed) check.
        awaited: bool,
    },
    /// `ServerHeartbeatFailedEvent`.
    Failed {
        /// From the start of the check to the failure.
        duration: Duration,
        /// The failure.
        error: ErrorSummary,
        /// An awaited (streamed) check.
        awaited: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting until the next scheduled check.
    Idle { next: Instant },
    /// A check is in flight since `started`.
    Checking { started: Instant },
    /// MO-9: streaming; the awaited check in flight started at `started`.
    Streaming { started: Instant },
}

/// The monitor of one server. See the [module docs](self).
#[derive(Debug)]
pub struct Monitor {
    address: ServerAddress,
    heartbeat_frequency: Duration,
    /// MO-7: `serverMonitoringMode` and the FaaS detection allow streaming.
    may_stream: bool,
    /// HS-3: awaitable hellos use `hello` whatever the server says (a Stable API version or
    /// load balancing asked for it, see [`Monitor::with_mode`]).
    use_hello: bool,
    /// HS-3: the monitoring connection's handshake reply said `helloOk: true`, so awaitable
    /// hellos use `hello` too.
    hello_ok: bool,
    /// MO-8: the last reply's `topologyVersion`.
    topology_version: Option<TopologyVersion>,
    /// MO-12: while streaming, when the next RTT measurement is due (`None` while one runs).
    rtt_next: Option<Instant>,
    /// MO-12: when the RTT measurement in flight started.
    rtt_started: Option<Instant>,
    state: State,
    last_check_started: Option<Instant>,
    /// The last description was not Unknown (a network error then earns one immediate retry).
    known: bool,
    /// The check in flight is that immediate retry.
    retrying: bool,
    immediate_requested: bool,
    average_rtt: AverageRtt,
    recent_rtts: SmallVec<[Duration; MIN_RTT_SAMPLES]>,
    actions: VecDeque<MonitorAction>,
    events: VecDeque<HeartbeatEvent>,
}

impl Monitor {
    /// A polling monitor that checks `address` every `heartbeat_frequency` (at least
    /// [`MIN_HEARTBEAT_FREQUENCY`]); the first check is due at `now`.
    pub fn new(address: ServerAddress, heartbeat_frequency: Duration, now: Instant) -> Monitor {
        Monitor {
            address,
            heartbeat_frequency: heartbeat_frequency.max(MIN_HEARTBEAT_FREQUENCY),
            may_stream: false,
            use_hello: true,
            hello_ok: false,
            topology_version: None,
            rtt_next: None,
            rtt_started: None,
            state: State::Idle { next: now },
            last_check_started: None,
            known: false,
            retrying: false,
            immediate_requested: false,
            average_rtt: AverageRtt::NONE,
            recent_rtts: SmallVec::new(),
            actions: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// MO-7: lets the monitor stream with servers that support it when `mode` allows it for a
    /// process that `faas` or not (HS-5); awaitable hellos use legacy `isMaster` unless
    /// `use_hello` (HS-3: a Stable API version or load balancing) or the connection's handshake
    /// reply said `helloOk` ([`Monitor::handle_handshake`]).
    pub fn with_mode(mut self, mode: ServerMonitoringMode, faas: bool, use_hello: bool) -> Monitor {
        self.may_stream = mode.streams(faas, true);
        self.use_hello = use_hello;
        self
    }

    /// MO-7, MO-12: whether the monitor streams now (its server supports it and the mode allows
    /// it): the caller then keeps an RTT connection, and closes it when this turns false.
    pub fn is_streaming(&self) -> bool {
        matches!(self.state, State::Streaming { .. })
    }

    /// MO-12: a round trip measured on the RTT connection at `now` (its handshake or a `hello`);
    /// the next is due a heartbeat later. The new average goes out with the next streamed reply.
    pub fn handle_rtt_sample(&mut self, rtt: Duration, now: Instant) {
        if self.is_streaming() {
            self.add_sample(rtt);
            self.rtt_next = Some(now.saturating_add(self.heartbeat_frequency));
        }
    }

    /// MO-12: the RTT connection's `hello` (sent for [`MonitorAction::MeasureRtt`]) came back at
    /// `now`: its round trip is a sample.
    pub fn handle_rtt_reply(&mut self, now: Instant) {
        if let Some(started) = self.rtt_started.take() {
            self.handle_rtt_sample(now.saturating_duration_since(started), now);
        }
    }

    /// MO-12: the RTT connection failed at `now`: the statistics are kept and the caller opens a
    /// new one when the next measurement is due, a heartbeat later.
    pub fn handle_rtt_failed(&mut self, now: Instant) {
        if self.is_streaming() {
            self.rtt_next = Some(now.saturating_add(self.heartbeat_frequency));
        }
    }

    /// The monitored server.
    pub fn address(&self) -> &ServerAddress {
        &self.address
    }

    /// SS-14: the average round trip of the checks so far (cleared when a check fails).
    pub fn average_rtt(&self) -> Option<Duration> {
        self.average_rtt.get()
    }

    /// CS-4: the smallest of the last [`MIN_RTT_SAMPLES`] round trips, or zero until there are two.
    pub fn min_rtt(&self) -> Duration {
        if self.recent_rtts.len() < 2 {
            Duration::ZERO
        } else {
            self.recent_rtts.iter().copied().min().unwrap_or_default()
        }
    }

    /// The next action, in order.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<MonitorAction> {
        self.actions.pop_front()
    }

    /// The next heartbeat event, in order.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<HeartbeatEvent> {
        self.events.pop_front()
    }

    /// When the next check is due, if none is in flight.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Idle { next } => Some(next),
            State::Streaming { .. } => self.rtt_next,
            State::Checking { .. } => None,
        }
    }

    /// Starts a check (or, streaming, an RTT measurement) that is due. Spurious calls are
    /// harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            State::Idle { next } if now >= next => self.start_check(now),
            State::Streaming { .. } if self.rtt_next.is_some_and(|at| now >= at) => {
                self.rtt_next = None;
                self.rtt_started = Some(now);
                self.actions.push_back(MonitorAction::MeasureRtt);
            }
            _ => {}
        }
    }

    /// Server selection found no suitable server: check as soon as `minHeartbeatFrequencyMS`
    /// allows.
    pub fn request_immediate_check(&mut self, now: Instant) {
        // MO-5: ignored during a check (a streaming monitor hears of changes at once).
        self.immediate_requested = true;
        if let State::Idle { next } = self.state {
            let earliest = self.earliest_check(now);
            if earliest < next {
                self.state = State::Idle { next: earliest };
            }
            self.handle_timeout(now);
        }
    }

    /// The check's `hello` reply arrived at `now`. Returns the average RTT to report with the reply
    /// (SS-14), or `None` when the reply is not `ok: 1` (a failed check: the RTT is forgotten).
    pub fn handle_check_succeeded(&mut self, reply: &Document, now: Instant) -> Option<Duration> {
        let State::Checking { started } = self.state else {
            return None;
        };
        self.topology_version = TopologyVersion::from_reply(reply);
        let rtt = now.saturating_duration_since(started);
        self.events.push_back(self.check_ended(reply, rtt, false));
        self.finish_check(crate::reply::is_ok(reply), rtt, now)
    }

    /// MO-15: the event that ends a check whose `hello` got `reply` after `duration`: succeeded
    /// for `ok: 1`, failed with the server's error for `ok: 0`.
    fn check_ended(&self, reply: &Document, duration: Duration, awaited: bool) -> HeartbeatEvent {
        match OperationError::from_reply(reply, &self.address) {
            Some(error) if !crate::reply::is_ok(reply) => HeartbeatEvent::Failed {
                duration,
                error: error.summary(),
                awaited,
            },
            _ => HeartbeatEvent::Succeeded { duration, awaited },
        }
    }

    /// MO-9, MO-10: a reply of the streaming protocol arrived at `now`; `more_to_come` when the
    /// server will push another on its own. An `ok: 1` reply ends the awaited check and starts
    /// the next at once (with `more_to_come` the caller just reads on, otherwise it gets
    /// [`MonitorAction::Await`] with the new `topologyVersion`); it is no RTT sample (MO-12).
    /// Returns the average RTT to report with the reply, or `None` for a reply to report as a
    /// failed check (`ok: 0`: the caller closes the connection, MO-11) or outside streaming.
    pub fn handle_streamed_reply(
        &mut self,
        reply: &Document,
        more_to_come: bool,
        now: Instant,
    ) -> Option<Duration> {
        let State::Streaming { started } = self.state else {
            return None;
        };
        let duration = now.saturating_duration_since(started);
        self.events
            .push_back(self.check_ended(reply, duration, true));
        self.retrying = false;
        self.last_check_started = Some(started);
        self.topology_version = TopologyVersion::from_reply(reply);
        self.known = crate::reply::is_ok(reply);
        if !self.known {
            self.forget_rtt();
            self.rtt_next = None;
            self.schedule_after_check(now);
            return None;
        }
        if more_to_come {
            self.state = State::Streaming { started: now };
            self.events
                .push_back(HeartbeatEvent::Started { awaited: true });
        } else {
            self.stream_or_wait(now);
        }
        Some(self.average_rtt.get().unwrap_or_default())
    }

    /// MO-1, MO-12: the check in flight opened a new monitoring connection, and that connection's
    /// handshake completed at `now` with a valid (`ok: 1`) reply after `round_trip` (from the
    /// handshake `hello` being written to its reply, without the TCP connect). The handshake *is*
    /// the check (no second `hello` is sent) and its round trip is the RTT sample and the
    /// succeeded event's duration (MO-15). Returns the average RTT to report with the reply
    /// (SS-14), or `None` when no check is in flight.
    /// `topology_version` is the reply's (MO-8: a server that sends one can stream); `hello_ok`
    /// is the reply's `helloOk` (HS-3: with it, the awaitable checks on this connection use
    /// `hello`, without it legacy `isMaster` unless [`Monitor::with_mode`] asked for `hello`).
    pub fn handle_handshake(
        &mut self,
        topology_version: Option<TopologyVersion>,
        hello_ok: bool,
        round_trip: Duration,
        now: Instant,
    ) -> Option<Duration> {
        let State::Checking { .. } = self.state else {
            return None;
        };
        self.topology_version = topology_version;
        self.hello_ok = hello_ok;
        self.events.push_back(HeartbeatEvent::Succeeded {
            duration: round_trip,
            awaited: false,
        });
        self.finish_check(true, round_trip, now)
    }

    /// Ends a polling check (its event is already out): `ok` with a sample of `rtt`, or failed.
    fn finish_check(&mut self, ok: bool, rtt: Duration, now: Instant) -> Option<Duration> {
        self.retrying = false;
        self.known = ok;
        if !self.known {
            self.forget_rtt();
            self.schedule_after_check(now);
            return None;
        }
        let average = self.add_sample(rtt);
        self.stream_or_wait(now);
        Some(average)
    }

    /// MO-10: after a successful check, stream at once when the server supports it (its reply
    /// had a `topologyVersion`) and the mode allows it; otherwise wait for the next check.
    fn stream_or_wait(&mut self, now: Instant) {
        match self.topology_version.filter(|_| self.may_stream) {
            Some(version) => {
                if !self.is_streaming() {
                    // MO-12: the RTT connection starts with the stream.
                    self.rtt_next = Some(now);
                }
                self.state = State::Streaming { started: now };
                self.events
                    .push_back(HeartbeatEvent::Started { awaited: true });
                let hello = awaitable_hello(
                    self.use_hello || self.hello_ok,
                    &version,
                    self.heartbeat_frequency,
                );
                self.actions.push_back(MonitorAction::Await(hello));
            }
            None => self.schedule_after_check(now),
        }
    }

    /// Adds an RTT sample (SS-14, MO-13); returns the new average.
    fn add_sample(&mut self, rtt: Duration) -> Duration {
        let average = self.average_rtt.update(rtt);
        if self.recent_rtts.len() == MIN_RTT_SAMPLES {
            self.recent_rtts.remove(0);
        }
        self.recent_rtts.push(rtt);
        average
    }

    /// The check failed at `now` (the connection could not be opened, or the `hello` failed on
    /// the network), and the RTT is forgotten. Returns true: report the failure to the topology,
    /// which marks the server Unknown and clears its pool at once (MO-11 (2), (3); a timeout
    /// interrupts the connections in use). Then a network error on a server that was known is
    /// rechecked at once (MO-11 (4)), once; anything else waits for the next check (MO-11 (5)).
    /// Returns false only when no check was in progress.
    pub fn handle_check_failed(&mut self, error: &OperationError, now: Instant) -> bool {
        let (started, awaited) = match self.state {
            State::Checking { started } => (started, false),
            State::Streaming { started } => (started, true),
            State::Idle { .. } => return false,
        };
        self.events.push_back(HeartbeatEvent::Failed {
            duration: now.saturating_duration_since(started),
            error: error.summary(),
            awaited,
        });
        // MO-11: the next check opens a new connection and polls until it may stream again.
        self.topology_version = None;
        self.rtt_next = None;
        self.forget_rtt();
        let network = matches!(error.kind, ErrorKind::Network(_));
        let recheck = network && self.known && !self.retrying;
        self.known = false;
        self.retrying = recheck;
        if recheck {
            self.start_check(now);
        } else {
            self.schedule_after_check(now);
        }
        true
    }

    fn start_check(&mut self, now: Instant) {
        self.state = State::Checking { started: now };
        self.last_check_started = Some(now);
        self.immediate_requested = false;
        self.events
            .push_back(HeartbeatEvent::Started { awaited: false });
        self.actions.push_back(MonitorAction::Check);
    }

    fn schedule_after_check(&mut self, now: Instant) {
        let next = if self.immediate_requested {
            self.earliest_check(now)
        } else {
            self.last_check_started
                .unwrap_or(now)
                .saturating_add(self.heartbeat_frequency)
        };
        self.state = State::Idle {
            next: next.max(now),
        };
    }

    /// The earliest a new check may start: `minHeartbeatFrequencyMS` after the last one began.
    fn earliest_check(&self, now: Instant) -> Instant {
        match self.last_check_started {
            Some(last) => last.saturating_add(MIN_HEARTBEAT_FREQUENCY).max(now),
            None => now,
        }
    }

    fn forget_rtt(&mut self) {
        self.average_rtt.clear();
        self.recent_rtts.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{NetworkErrorKind, NetworkPhase};
    use bson::doc;

    fn monitor() -> Monitor {
        Monitor::new(
            ServerAddress::new("a", 27017),
            Duration::from_secs(10),
            Instant::ZERO,
        )
    }

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    fn hello() -> Document {
        doc! { "ok": 1, "isWritablePrimary": true, "maxWireVersion": 25, "minWireVersion": 0 }
    }

    fn reset() -> OperationError {
        OperationError::network(
            NetworkErrorKind::Reset,
            NetworkPhase::AfterSend,
            ServerAddress::new("a", 27017),
        )
    }

    #[test]
    fn checks_at_start_then_every_heartbeat_frequency() {
        let mut m = monitor();
        assert_eq!(m.poll_timeout(), Some(ms(0)));
        m.handle_timeout(ms(0));
        assert_eq!(m.poll_action(), Some(MonitorAction::Check));
        assert_eq!(m.poll_timeout(), None);
        assert_eq!(
            m.handle_check_succeeded(&hello(), ms(5)),
            Some(Duration::from_millis(5))
        );
        assert_eq!(
            m.poll_timeout(),
            Some(ms(10_000)),
            "the next check is 10 s after the last one began"
        );
        assert_eq!(
            m.poll_event(),
            Some(HeartbeatEvent::Started { awaited: false })
        );
        assert_eq!(
            m.poll_event(),
            Some(HeartbeatEvent::Succeeded {
                duration: Duration::from_millis(5),
                awaited: false
            })
        );
    }

    #[test]
    fn immediate_checks_respect_min_heartbeat_frequency() {
        let mut m = monitor();
        m.handle_timeout(ms(0));
        let _ = m.handle_check_succeeded(&hello(), ms(100));
        while m.poll_action().is_some() {}
        m.request_immediate_check(ms(200));
        assert_eq!(m.poll_action(), None);
        assert_eq!(
            m.poll_timeout(),
            Some(ms(500)),
            "not sooner than 500 ms after the last check began"
        );
        m.handle_timeout(ms(500));
        assert_eq!(m.poll_action(), Some(MonitorAction::Check));
        let _ = m.handle_check_succeeded(&hello(), ms(510));
        m.request_immediate_check(ms(2000));
        assert_eq!(
            m.poll_action(),
            Some(MonitorAction::Check),
            "long enough after the last check: at once"
        );
    }

    /// MO-11: a network error on a known server is reported at once (the topology marks it
    /// Unknown and clears its pool, interrupting connections in use after a timeout: the
    /// interruptInUse-pool-clear and hello-command-error unified tests, which failed under load
    /// while the report waited for the recheck), then rechecked at once, once.
    #[test]
    fn mo11_a_network_error_on_a_known_server_is_reported_then_rechecked_once_at_once() {
        let mut m = monitor();
        m.handle_timeout(ms(0));
        let _ = m.handle_check_succeeded(&hello(), ms(1));
        while m.poll_action().is_some() {}
        m.handle_timeout(ms(10_000));
        assert_eq!(m.poll_action(), Some(MonitorAction::Check));
        assert!(
            m.handle_check_failed(&reset(), ms(10_001)),
            "reported at once, before the recheck"
        );
        assert_eq!(m.poll_action(), Some(MonitorAction::Check));
        assert!(
            m.handle_check_failed(&reset(), ms(10_002)),
            "the retry's failure is reported"
        );
        assert_eq!(m.average_rtt(), None, "SS-14: the RTT is forgotten");
        assert_eq!(m.poll_timeout(), Some(ms(20_001)));
    }

    #[test]
    fn a_failed_hello_reply_forgets_the_rtt_and_is_not_known() {
        let mut m = monitor();
        m.handle_timeout(ms(0));
        assert_eq!(
            m.handle_check_succeeded(&doc! { "ok": 0, "code": 13 }, ms(2)),
            None
        );
        // MO-15: an `ok: 0` reply ends the check with a failed event carrying the server's code.
        let events: Vec<_> = core::iter::from_fn(|| m.poll_event()).collect();
        assert!(
            matches!(
                events.last(),
                Some(HeartbeatEvent::Failed { error, awaited: false, .. }) if error.code == Some(13)
            ),
            "{events:?}"
        );
        assert_eq!(m.average_rtt(), None);
        m.handle_timeout(ms(10_000));
        while m.poll_action().is_some() {}
        assert!(
            m.handle_check_failed(&reset(), ms(10_001)),
            "not known, so no immediate retry"
        );
    }

    #[test]
    fn cs4_min_rtt_is_zero_until_two_samples_then_the_minimum_of_the_last_ten() {
        let mut m = monitor();
        let mut now = 0;
        let mut check = |m: &mut Monitor, rtt: u64| {
            m.handle_timeout(ms(now));
            let _ = m.handle_check_succeeded(&hello(), ms(now + rtt));
            now += 10_000;
            while m.poll_action().is_some() {}
        };
        check(&mut m, 7);
        assert_eq!(m.min_rtt(), Duration::ZERO);
        check(&mut m, 3);
        assert_eq!(m.min_rtt(), Duration::from_millis(3));
        for _ in 0..10 {
            check(&mut m, 20);
        }
        assert_eq!(
            m.min_rtt(),
            Duration::from_millis(20),
            "the 3 ms sample left the window"
        );
    }

    #[test]
    fn mo1_mo12_the_handshake_reply_is_the_first_check_and_its_round_trip_the_first_rtt() {
        let mut m = monitor();
        m.handle_timeout(ms(0));
        assert_eq!(m.poll_action(), Some(MonitorAction::Check));
        assert_eq!(
            m.poll_event(),
            Some(HeartbeatEvent::Started { awaited: false })
        );
        // TCP connect took 40 ms, the handshake hello written at 40 was answered at 47.
        assert_eq!(
            m.handle_handshake(None, true, Duration::from_millis(7), ms(47)),
            Some(Duration::from_millis(7))
        );
        assert_eq!(
            m.poll_event(),
            Some(HeartbeatEvent::Succeeded {
                duration: Duration::from_millis(7),
                awaited: false
            })
        );
        // No second hello: the next check is a heartbeat later, counted from the check's start.
        assert_eq!(m.poll_action(), None);
        assert_eq!(m.poll_timeout(), Some(ms(10_000)));
        assert_eq!(m.average_rtt(), Some(Duration::from_millis(7)));
        // One sample: the minimum RTT stays zero until there are two (MO-13).
        assert_eq!(m.min_rtt(), Duration::ZERO);
        m.handle_timeout(ms(10_000));
        assert_eq!(m.poll_action(), Some(MonitorAction::Check));
        m.handle_check_succeeded(&hello(), ms(10_003));
        assert_eq!(m.min_rtt(), Duration::from_millis(3));
    }

    #[test]
    fn mo1_a_handshake_outside_a_check_is_ignored() {
        let mut m = monitor();
        assert_eq!(
            m.handle_handshake(None, true, Duration::from_millis(1), ms(1)),
            None
        );
        assert_eq!(m.poll_event(), None);
        assert_eq!(m.average_rtt(), None);
    }

    fn streamable_hello() -> Document {
        doc! { "ok": 1, "isWritablePrimary": true, "maxWireVersion": 25,
        "topologyVersion": { "processId": bson::oid::ObjectId::from_bytes([7; 12]),
        "counter": 2_i64 } }
    }

    /// HS-3: the awaitable hello follows the monitoring connection's handshake: `hello` after a
    /// reply with `helloOk: true`, legacy `isMaster` without it, unless `hello` was asked for
    /// (Stable API, load balancing).
    #[test]
    fn hs3_the_awaitable_hello_follows_the_handshakes_hello_ok() {
        for (asked, hello_ok, expected) in [
            (false, true, "hello"),
            (false, false, "isMaster"),
            (true, false, "hello"),
        ] {
            let mut m = monitor().with_mode(ServerMonitoringMode::Stream, false, asked);
            m.handle_timeout(ms(0));
            assert_eq!(m.poll_action(), Some(MonitorAction::Check));
            let _ = m.handle_handshake(
                TopologyVersion::from_reply(&streamable_hello()),
                hello_ok,
                Duration::from_millis(4),
                ms(5),
            );
            let Some(MonitorAction::Await(hello)) = m.poll_action() else {
                panic!("an awaitable hello")
            };
            assert_eq!(
                hello.keys().next().map(String::as_str),
                Some(expected),
                "asked {asked}, helloOk {hello_ok}"
            );
        }
    }

    #[test]
    fn mo9_mo10_mo15_after_the_handshake_a_streaming_monitor_awaits_and_reads_on() {
        let mut m = monitor().with_mode(ServerMonitoringMode::Stream, false, true);
        m.handle_timeout(ms(0));
        assert_eq!(m.poll_action(), Some(MonitorAction::Check));
        let _ = m.handle_handshake(
            TopologyVersion::from_reply(&streamable_hello()),
            true,
            Duration::from_millis(4),
            ms(5),
        );
        // MO-16: started(false), succeeded(false), started(true).
        let events: Vec<_> = core::iter::from_fn(|| m.poll_event()).collect();
        assert_eq!(
            events,
            [
                HeartbeatEvent::Started { awaited: false },
                HeartbeatEvent::Succeeded {
                    duration: Duration::from_millis(4),
                    awaited: false
                },
                HeartbeatEvent::Started { awaited: true },
            ]
        );
        let Some(MonitorAction::Await(hello)) = m.poll_action() else {
            panic!("an awaitable hello")
        };
        assert_eq!(hello.get_i64("maxAwaitTimeMS").ok(), Some(10_000));
        // MO-12: the RTT connection is measured at once, then every heartbeat.
        assert!(m.is_streaming());
        assert_eq!(m.poll_timeout(), Some(ms(5)));
        m.handle_timeout(ms(5));
        assert_eq!(m.poll_action(), Some(MonitorAction::MeasureRtt));
        assert_eq!(m.poll_timeout(), None, "one measurement at a time");
        // A pushed reply (moreToCome): an awaited check, no RTT sample, the next one started.
        assert_eq!(
            m.handle_streamed_reply(&streamable_hello(), true, ms(10_005)),
            Some(Duration::from_millis(4))
        );
        assert_eq!(m.poll_action(), None, "MO-9: read on");
        assert_eq!(
            m.poll_event(),
            Some(HeartbeatEvent::Succeeded {
                duration: Duration::from_millis(10_000),
                awaited: true
            })
        );
        assert_eq!(
            m.poll_event(),
            Some(HeartbeatEvent::Started { awaited: true })
        );
        assert_eq!(m.min_rtt(), Duration::ZERO, "MO-12: one sample only");
        // MO-12: the RTT connection's samples feed the statistics.
        m.handle_rtt_sample(Duration::from_millis(2), ms(10_006));
        assert_eq!(m.min_rtt(), Duration::from_millis(2));
        assert_eq!(m.poll_timeout(), Some(ms(20_006)));
        assert_eq!(
            m.poll_event(),
            None,
            "MO-12: no events for RTT measurements"
        );
        // Without moreToCome: a new awaitable hello at once.
        let _ = m.handle_streamed_reply(&streamable_hello(), false, ms(20_000));
        assert!(matches!(m.poll_action(), Some(MonitorAction::Await(_))));
        // MO-11: a failure ends streaming and is reported; a known server is rechecked at once
        // by polling.
        assert!(m.handle_check_failed(&reset(), ms(20_001)));
        assert!(!m.is_streaming());
        assert_eq!(m.poll_action(), Some(MonitorAction::Check));
    }

    #[test]
    fn mo11_mo15_a_streamed_ok_0_reply_is_a_failed_awaited_check() {
        let mut m = monitor().with_mode(ServerMonitoringMode::Stream, false, true);
        m.handle_timeout(ms(0));
        while m.poll_action().is_some() {}
        let _ = m.handle_handshake(
            TopologyVersion::from_reply(&streamable_hello()),
            true,
            Duration::from_millis(4),
            ms(5),
        );
        while m.poll_event().is_some() {}
        assert!(m.is_streaming());
        let failed = doc! { "ok": 0, "code": 91, "errmsg": "shutting down" };
        assert_eq!(m.handle_streamed_reply(&failed, false, ms(105)), None);
        assert!(
            matches!(
                m.poll_event(),
                Some(HeartbeatEvent::Failed { duration, error, awaited: true })
                    if duration == Duration::from_millis(100) && error.code == Some(91)
            ),
            "MO-15: failed, not succeeded"
        );
        assert_eq!(m.poll_event(), None);
        assert!(!m.is_streaming(), "MO-11: the stream ends");
        assert_eq!(m.average_rtt(), None, "MO-11: the RTT statistics are reset");
    }

    #[test]
    fn mo7_poll_mode_and_servers_without_topology_version_never_stream() {
        for (mode, reply) in [
            (ServerMonitoringMode::Poll, streamable_hello()),
            (ServerMonitoringMode::Stream, hello()),
        ] {
            let mut m = monitor().with_mode(mode, false, true);
            m.handle_timeout(ms(0));
            while m.poll_action().is_some() {}
            let _ = m.handle_handshake(
                TopologyVersion::from_reply(&reply),
                true,
                Duration::from_millis(1),
                ms(1),
            );
            assert_eq!(m.poll_action(), None);
            assert!(!m.is_streaming());
            assert_eq!(m.poll_timeout(), Some(ms(10_000)));
        }
        // auto polls in a FaaS environment.
        let mut m = monitor().with_mode(ServerMonitoringMode::Auto, true, true);
        m.handle_timeout(ms(0));
        while m.poll_action().is_some() {}
        let _ = m.handle_handshake(
            TopologyVersion::from_reply(&streamable_hello()),
            true,
            Duration::from_millis(1),
            ms(1),
        );
        assert!(!m.is_streaming());
    }

    #[test]
    fn mo7_monitoring_modes() {
        use ServerMonitoringMode::*;
        assert_eq!(ServerMonitoringMode::default(), Auto);
        assert!(Auto.streams(false, true) && !Auto.streams(true, true));
        assert!(Stream.streams(true, true));
        assert!(!Poll.streams(false, true));
        // A server without topologyVersion cannot stream in any mode.
        assert!(!Auto.streams(false, false) && !Stream.streams(false, false));
    }

    #[test]
    fn mo8_awaitable_hello_carries_topology_version_and_max_await_time() {
        let version = TopologyVersion {
            process_id: bson::oid::ObjectId::from_bytes([7; 12]),
            counter: 3,
        };
        let command = awaitable_hello(true, &version, Duration::from_secs(10));
        assert_eq!(
            command,
            doc! { "hello": 1, "topologyVersion": { "processId": version.process_id,
            "counter": 3_i64 }, "maxAwaitTimeMS": 10_000_i64 }
        );
        assert!(awaitable_hello(false, &version, Duration::from_secs(1)).contains_key("isMaster"));
    }
}
