//! Polling SRV records for mongos discovery (SP-1..SP-6, the "Polling SRV Records for mongos
//! Discovery" spec): when to rescan a `mongodb+srv` name and what a rescan's hosts do to the
//! topology. The driver only looks the name up (and drops targets outside the parent domain,
//! SRV-3); [`SrvPoller`] decides everything else.
//!
//! - SP-1: rescan only while the topology is Sharded or Unknown; never in any other type
//!   (Single, replica set, load-balanced), which a topology never leaves for those two.
//! - SP-2: the rescan interval is the lowest TTL of the last answer's records, at least
//!   [`MIN_RESCAN_INTERVAL`] (60 s without TTLs), counted from the end of the last lookup (the
//!   initial seedlist lookup for the first one).
//! - SP-3: a lookup with no hosts (a DNS error, no records, none in the domain) changes nothing
//!   and rescans after `heartbeatFrequencyMS` until one has hosts.
//! - SP-4: hosts no longer listed leave the topology; hosts still listed are left alone.
//! - SP-5: new hosts join as Unknown: all of them when `srvMaxHosts` is 0 or at least the number
//!   of listed hosts, otherwise randomly chosen ones ([`choose_srv_hosts`], the same algorithm as
//!   the initial seedlist's, SRV-4) until the topology has `srvMaxHosts` hosts.
//! - SP-6: changes publish the usual SDAM events (`ServerOpening`, `ServerClosed`,
//!   `TopologyDescriptionChanged`), and the engine starts and stops monitors as for any other
//!   change.

use alloc::vec::Vec;
use core::time::Duration;

use rand_core::RngCore;

use super::{Topology, TopologyAction, TopologyType};
use crate::address::ServerAddress;
use crate::rng::EngineRng;
use crate::time::Instant;

/// SP-2: the shortest rescan interval, and the interval when TTLs are unknown.
pub const MIN_RESCAN_INTERVAL: Duration = Duration::from_secs(60);

/// SRV polling for a client created from a `mongodb+srv` URI
/// ([`crate::engine::EngineOptions::srv_polling`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SrvPollingOptions {
    /// `srvMaxHosts`: at most this many hosts, 0 for no limit (SRV-4, SP-5).
    pub max_hosts: usize,
    /// The lowest TTL of the initial seedlist's SRV records, when the resolver reported them
    /// (SP-2).
    pub initial_ttl: Option<Duration>,
}

impl SrvPollingOptions {
    /// Polling with `srvMaxHosts` = `max_hosts` after an initial lookup whose lowest TTL was
    /// `initial_ttl`.
    pub fn new(max_hosts: usize, initial_ttl: Option<Duration>) -> SrvPollingOptions {
        SrvPollingOptions {
            max_hosts,
            initial_ttl,
        }
    }
}

/// SRV-4, SP-5: at most `max` of `hosts` (all of them when `max` is 0 or at least their number),
/// chosen by a Fisher–Yates shuffle drawn from `rng`.
pub fn choose_srv_hosts<T>(mut hosts: Vec<T>, max: usize, rng: &mut EngineRng) -> Vec<T> {
    if max == 0 || max >= hosts.len() {
        return hosts;
    }
    for i in (1..hosts.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        hosts.swap(i, j);
    }
    hosts.truncate(max);
    hosts
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// The next rescan is due at this instant.
    Waiting(Instant),
    /// A rescan is due; [`SrvPoller::poll_rescan`] has not handed it out yet.
    Due,
    /// The driver is looking the name up.
    Resolving,
    /// No more rescans (SP-1, or the topology closed).
    Stopped,
}

/// The SRV polling machine: inputs [`SrvPoller::handle_timeout`] and
/// [`SrvPoller::handle_hosts`], outputs [`SrvPoller::poll_rescan`] and
/// [`SrvPoller::poll_timeout`].
#[derive(Clone, Debug)]
pub struct SrvPoller {
    max_hosts: usize,
    heartbeat_frequency: Duration,
    state: State,
}

impl SrvPoller {
    /// A poller whose initial lookup ended at `now` (SP-2: the first rescan is one interval
    /// later); failed lookups retry after `heartbeat_frequency` (SP-3).
    pub fn new(
        options: &SrvPollingOptions,
        heartbeat_frequency: Duration,
        now: Instant,
    ) -> SrvPoller {
        SrvPoller {
            max_hosts: options.max_hosts,
            heartbeat_frequency,
            state: State::Waiting(now.saturating_add(rescan_interval(options.initial_ttl))),
        }
    }

    /// When [`SrvPoller::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Waiting(at) => Some(at),
            _ => None,
        }
    }

    /// Time has passed. A due rescan is handed out by [`SrvPoller::poll_rescan`] while
    /// `topology` is Sharded or Unknown; in any other type, or once it is closed, polling stops
    /// for good (SP-1).
    pub fn handle_timeout(&mut self, topology: &Topology, now: Instant) {
        if let State::Waiting(at) = self.state {
            if now >= at {
                self.state = if polls(topology) {
                    State::Due
                } else {
                    State::Stopped
                };
            }
        }
    }

    /// Whether the SRV name must be looked up now; `true` once per rescan. The answer goes to
    /// [`SrvPoller::handle_hosts`].
    pub fn poll_rescan(&mut self) -> bool {
        if self.state == State::Due {
            self.state = State::Resolving;
            true
        } else {
            false
        }
    }

    /// The rescan ended at `now` with `hosts` (the SRV targets in the parent domain; empty for
    /// a DNS error or no records) whose lowest TTL is `min_ttl`. Applies them to `topology`
    /// (SP-3..SP-6) and schedules the next rescan (SP-2, SP-3). An answer nobody asked for is
    /// ignored.
    pub fn handle_hosts(
        &mut self,
        topology: &mut Topology,
        hosts: Vec<ServerAddress>,
        min_ttl: Option<Duration>,
        rng: &mut EngineRng,
        now: Instant,
    ) {
        if self.state != State::Resolving {
            return;
        }
        if !polls(topology) {
            self.state = State::Stopped;
            return;
        }
        let interval = if hosts.is_empty() {
            self.heartbeat_frequency
        } else {
            topology.apply_srv_hosts(hosts, self.max_hosts, rng, now);
            rescan_interval(min_ttl)
        };
        self.state = State::Waiting(now.saturating_add(interval));
    }
}

/// SP-1: whether `topology` is polled: open, and Sharded or Unknown.
fn polls(topology: &Topology) -> bool {
    !topology.is_closed()
        && matches!(
            topology.description().topology_type,
            TopologyType::Sharded | TopologyType::Unknown
        )
}

/// SP-2: the lowest TTL, but at least 60 s; 60 s without TTLs.
fn rescan_interval(min_ttl: Option<Duration>) -> Duration {
    min_ttl.map_or(MIN_RESCAN_INTERVAL, |ttl| ttl.max(MIN_RESCAN_INTERVAL))
}

impl Topology {
    /// SP-4..SP-6: the topology's hosts become the listed ones (`hosts`, not empty): the others
    /// are removed, the ones already there are left alone, and new ones join as Unknown (at most
    /// `max_hosts` in all when it is not 0), with their SDAM events and monitoring actions.
    fn apply_srv_hosts(
        &mut self,
        mut hosts: Vec<ServerAddress>,
        max_hosts: usize,
        rng: &mut EngineRng,
        now: Instant,
    ) {
        let mut unique = Vec::with_capacity(hosts.len());
        for host in hosts.drain(..) {
            if !unique.contains(&host) {
                unique.push(host);
            }
        }
        let previous = self.description.clone();
        let gone: Vec<ServerAddress> = previous
            .servers
            .iter()
            .map(|s| s.address.clone())
            .filter(|address| !unique.contains(address))
            .collect();
        for address in &gone {
            self.remove(address, now);
        }
        let listed = unique.len();
        let new: Vec<ServerAddress> = unique
            .into_iter()
            .filter(|address| self.description.server(address).is_none())
            .collect();
        let room = if max_hosts == 0 || max_hosts >= listed {
            new.len()
        } else {
            max_hosts.saturating_sub(self.description.servers.len())
        };
        let chosen = match room {
            0 => Vec::new(),
            room if room >= new.len() => new,
            room => choose_srv_hosts(new, room, rng),
        };
        for address in chosen {
            self.add_server(address.clone());
            self.actions
                .push_back(TopologyAction::StartMonitoring(address));
        }
        self.description.refresh_derived();
        self.publish_changes(&previous, None);
    }
}

#[cfg(test)]
mod tests {
    //! Prose N refers to the polling spec's tests README ("SRV Polling Tests"), on the records of
    //! `test1.test.build.10gen.cc` (ports 27017 and 27018 at first).

    use alloc::vec::Vec;
    use core::time::Duration;

    use bson::doc;

    use super::*;
    use crate::topology::fixtures::{drain, hello};
    use crate::topology::{SdamEvent, TopologySettings};

    const HEARTBEAT: Duration = Duration::from_secs(10);
    const HOST: &str = "localhost.test.build.10gen.cc";

    fn at(port: u16) -> ServerAddress {
        ServerAddress::new(HOST, port)
    }

    fn hosts(ports: &[u16]) -> Vec<ServerAddress> {
        ports.iter().map(|p| at(*p)).collect()
    }

    fn secs(s: u64) -> Instant {
        Instant::ZERO.saturating_add(Duration::from_secs(s))
    }

    /// A sharded topology of `ports` (the first one checked as a mongos), events drained.
    fn sharded(ports: &[u16]) -> Topology {
        let mut topology = Topology::new(TopologySettings::new(hosts(ports)), Instant::ZERO)
            .expect("valid settings");
        topology.handle_hello(
            &at(ports[0]),
            &hello(doc! {"msg": "isdbgrid"}),
            Duration::ZERO,
            Instant::ZERO,
        );
        assert_eq!(topology.description().topology_type, TopologyType::Sharded);
        drain(&mut topology);
        topology
    }

    fn ports(topology: &Topology) -> Vec<u16> {
        let mut ports: Vec<u16> = topology
            .description()
            .servers
            .iter()
            .map(|s| s.address.port())
            .collect();
        ports.sort_unstable();
        ports
    }

    fn poller(max_hosts: usize) -> SrvPoller {
        SrvPoller::new(
            &SrvPollingOptions::new(max_hosts, None),
            HEARTBEAT,
            Instant::ZERO,
        )
    }

    /// Runs the rescan due at `poller`'s timeout, answered with `ports` (TTL unknown).
    fn rescan(poller: &mut SrvPoller, topology: &mut Topology, ports: &[u16], rng: &mut EngineRng) {
        let now = poller.poll_timeout().expect("a rescan is scheduled");
        poller.handle_timeout(topology, now);
        assert!(poller.poll_rescan(), "a rescan is due at {now:?}");
        assert!(!poller.poll_rescan(), "handed out once");
        poller.handle_hosts(topology, hosts(ports), None, rng, now);
    }

    #[test]
    fn sp2_the_interval_is_the_lowest_ttl_but_at_least_60_s_from_the_end_of_the_last_lookup() {
        let start = |ttl| {
            SrvPoller::new(&SrvPollingOptions::new(0, ttl), HEARTBEAT, secs(5)).poll_timeout()
        };
        assert_eq!(start(None), Some(secs(65)));
        assert_eq!(start(Some(Duration::from_secs(30))), Some(secs(65)));
        assert_eq!(start(Some(Duration::from_secs(300))), Some(secs(305)));
        let mut poller = poller(0);
        let mut topology = sharded(&[27017, 27018]);
        let mut rng = EngineRng::from_seed_u64(1);
        // Not due a nanosecond early.
        poller.handle_timeout(&topology, secs(60).saturating_sub(Duration::from_nanos(1)));
        assert!(!poller.poll_rescan());
        poller.handle_timeout(&topology, secs(60));
        assert!(poller.poll_rescan());
        assert_eq!(poller.poll_timeout(), None, "no timer while resolving");
        // The lookup ended at 62 s; its lowest TTL was 120 s.
        poller.handle_hosts(
            &mut topology,
            hosts(&[27017, 27018]),
            Some(Duration::from_secs(120)),
            &mut rng,
            secs(62),
        );
        assert_eq!(poller.poll_timeout(), Some(secs(182)));
    }

    #[test]
    fn sp3_prose_6_to_8_a_failed_or_empty_lookup_keeps_the_hosts_and_retries_after_heartbeat() {
        let mut poller = poller(0);
        let mut topology = sharded(&[27017, 27018]);
        let mut rng = EngineRng::from_seed_u64(1);
        // Prose 6 (timeout), 7 (failure), 8 (no records): the driver reports no hosts.
        rescan(&mut poller, &mut topology, &[], &mut rng);
        assert_eq!(ports(&topology), [27017, 27018]);
        assert_eq!(topology.poll_event(), None, "no SDAM event");
        assert_eq!(
            poller.poll_timeout(),
            Some(secs(70)),
            "heartbeatFrequencyMS later"
        );
        rescan(&mut poller, &mut topology, &[], &mut rng);
        assert_eq!(poller.poll_timeout(), Some(secs(80)));
        // Hosts again: back to the TTL rule.
        rescan(&mut poller, &mut topology, &[27017, 27018], &mut rng);
        assert_eq!(poller.poll_timeout(), Some(secs(140)));
    }

    #[test]
    fn sp4_sp5_prose_1_to_5_the_topology_follows_the_records_and_keeps_unchanged_hosts() {
        let cases: [(&[u16], &[u16]); 5] = [
            (&[27017, 27018, 27019], &[27017, 27018, 27019]), // 1: addition
            (&[27017], &[27017]),                             // 2: removal
            (&[27017, 27019], &[27017, 27019]),               // 3: replacement
            (&[27019], &[27019]),                             // 4: both by one
            (&[27019, 27020], &[27019, 27020]),               // 5: both by two
        ];
        for (records, expected) in cases {
            let mut poller = poller(0);
            let mut topology = sharded(&[27017, 27018]);
            let mongos = topology.description().server(&at(27017)).cloned();
            rescan(
                &mut poller,
                &mut topology,
                records,
                &mut EngineRng::from_seed_u64(1),
            );
            assert_eq!(ports(&topology), expected, "{records:?}");
            assert_eq!(topology.description().topology_type, TopologyType::Sharded);
            if expected.contains(&27017) {
                // SP-4: left alone, still the checked mongos.
                assert_eq!(topology.description().server(&at(27017)).cloned(), mongos);
            }
            for new in expected.iter().filter(|p| **p > 27018) {
                let server = topology.description().server(&at(*new)).expect("added");
                assert_eq!(server.server_type, crate::topology::ServerType::Unknown);
            }
        }
    }

    #[test]
    fn sp6_changes_publish_sdam_events_and_monitoring_actions() {
        let mut poller = poller(0);
        let mut topology = sharded(&[27017, 27018]);
        rescan(
            &mut poller,
            &mut topology,
            &[27017, 27019],
            &mut EngineRng::from_seed_u64(1),
        );
        let mut events = Vec::new();
        while let Some(event) = topology.poll_event() {
            events.push(event);
        }
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[0], SdamEvent::ServerOpening { address: at(27019) });
        assert_eq!(events[1], SdamEvent::ServerClosed { address: at(27018) });
        let SdamEvent::TopologyDescriptionChanged { previous, new } = &events[2] else {
            panic!("{events:?}");
        };
        assert_eq!(previous.servers.len(), 2);
        assert!(new.server(&at(27019)).is_some() && new.server(&at(27018)).is_none());
        let mut actions = Vec::new();
        while let Some(action) = topology.poll_action() {
            actions.push(action);
        }
        assert!(
            matches!(&actions[..], [
            TopologyAction::StopMonitoring { address: gone, .. },
            TopologyAction::StartMonitoring(added),
        ] if *gone == at(27018) && *added == at(27019)),
            "{actions:?}"
        );
        // The same records again: nothing changes, nothing is published.
        rescan(
            &mut poller,
            &mut topology,
            &[27019, 27017, 27019],
            &mut EngineRng::from_seed_u64(1),
        );
        assert_eq!(topology.poll_event(), None);
        assert!(topology.poll_action().is_none());
    }

    #[test]
    fn sp5_prose_10_to_12_srv_max_hosts_caps_the_additions() {
        let mut rng = EngineRng::from_seed_u64(1);
        // Prose 10: srvMaxHosts=0 takes every record.
        let mut topology = sharded(&[27017, 27018]);
        rescan(
            &mut poller(0),
            &mut topology,
            &[27017, 27019, 27020],
            &mut rng,
        );
        assert_eq!(ports(&topology), [27017, 27019, 27020]);
        // Prose 11: srvMaxHosts=2 with exactly two records takes both.
        let mut topology = sharded(&[27017, 27018]);
        rescan(&mut poller(2), &mut topology, &[27019, 27020], &mut rng);
        assert_eq!(ports(&topology), [27019, 27020]);
        // Prose 12: srvMaxHosts=2, 27018 replaced by 27019 and 27020: 27017 stays and one new
        // host is drawn; the same seed draws the same host.
        let draw = |seed| {
            let mut topology = sharded(&[27017, 27018]);
            rescan(
                &mut poller(2),
                &mut topology,
                &[27017, 27019, 27020],
                &mut EngineRng::from_seed_u64(seed),
            );
            ports(&topology)
        };
        let drawn: Vec<Vec<u16>> = (0..16).map(draw).collect();
        for ports in &drawn {
            assert_eq!(ports.len(), 2);
            assert_eq!(ports[0], 27017);
            assert!([27019, 27020].contains(&ports[1]));
        }
        assert!(drawn.iter().any(|p| p[1] == 27019) && drawn.iter().any(|p| p[1] == 27020));
        assert_eq!(draw(3), draw(3));
        // A full topology takes nothing new while its hosts are still listed.
        let mut topology = sharded(&[27017, 27018]);
        rescan(
            &mut poller(2),
            &mut topology,
            &[27017, 27018, 27019],
            &mut rng,
        );
        assert_eq!(ports(&topology), [27017, 27018]);
    }

    #[test]
    fn srv4_choose_srv_hosts_is_a_seeded_fisher_yates_pick() {
        let all: Vec<u16> = (0..5).collect();
        let pick =
            |max, seed| choose_srv_hosts(all.clone(), max, &mut EngineRng::from_seed_u64(seed));
        assert_eq!(pick(0, 1), all);
        assert_eq!(pick(5, 1), all);
        assert_eq!(pick(9, 1), all);
        let two = pick(2, 1);
        assert_eq!(two.len(), 2);
        assert_ne!(two[0], two[1]);
        assert_eq!(two, pick(2, 1));
    }

    #[test]
    fn sp1_prose_9_no_polling_outside_sharded_and_unknown() {
        // Prose 9: load-balanced.
        let mut settings = TopologySettings::new(hosts(&[27017]));
        settings.load_balanced = true;
        let lb = Topology::new(settings, Instant::ZERO).expect("valid settings");
        // A replica set.
        let mut rs = replica_set();
        let sharded_later = sharded(&[27017]);
        for topology in [&lb, &rs] {
            let topology_type = topology.description().topology_type;
            let mut poller = poller(0);
            poller.handle_timeout(topology, secs(60));
            assert!(!poller.poll_rescan(), "{topology_type:?}");
            assert_eq!(poller.poll_timeout(), None, "stopped for good");
            poller.handle_timeout(&sharded_later, secs(600));
            assert!(!poller.poll_rescan());
        }
        // Unknown is polled.
        let unknown_topology = Topology::new(TopologySettings::new(hosts(&[27017])), Instant::ZERO)
            .expect("valid settings");
        assert_eq!(
            unknown_topology.description().topology_type,
            TopologyType::Unknown
        );
        let mut unknown = poller(0);
        unknown.handle_timeout(&unknown_topology, secs(60));
        assert!(unknown.poll_rescan());
        // A topology that became a replica set while the lookup ran is left alone.
        unknown.handle_hosts(
            &mut rs,
            hosts(&[27019]),
            None,
            &mut EngineRng::from_seed_u64(1),
            secs(61),
        );
        assert_eq!(ports(&rs), [27017]);
        assert_eq!(unknown.poll_timeout(), None);
    }

    fn replica_set() -> Topology {
        let mut settings = TopologySettings::new(hosts(&[27017]));
        settings.replica_set = Some("rs".into());
        Topology::new(settings, Instant::ZERO).expect("valid settings")
    }

    #[test]
    fn an_answer_nobody_asked_for_and_a_closed_topology_change_nothing() {
        let mut poller = poller(0);
        let mut topology = sharded(&[27017]);
        let mut rng = EngineRng::from_seed_u64(1);
        poller.handle_hosts(&mut topology, hosts(&[27019]), None, &mut rng, secs(1));
        assert_eq!(ports(&topology), [27017]);
        assert_eq!(poller.poll_timeout(), Some(secs(60)));
        poller.handle_timeout(&topology, secs(60));
        assert!(poller.poll_rescan());
        topology.close(secs(61));
        drain(&mut topology);
        poller.handle_hosts(&mut topology, hosts(&[27019]), None, &mut rng, secs(62));
        assert!(topology.description().servers.is_empty());
        assert_eq!(poller.poll_timeout(), None);
        // A closed topology (Unknown and empty) is not polled either.
        let mut poller = SrvPoller::new(&SrvPollingOptions::new(0, None), HEARTBEAT, secs(62));
        poller.handle_timeout(&topology, secs(200));
        assert!(!poller.poll_rescan());
        assert_eq!(poller.poll_timeout(), None);
    }

    #[test]
    fn sp1_sp6_the_engine_asks_for_rescans_on_its_timeout_and_monitors_new_hosts() {
        use crate::engine::{Engine, EngineEvent, EngineOptions};
        use crate::handshake::HandshakeOptions;
        let mut options = EngineOptions::new(
            TopologySettings::new(hosts(&[27017])),
            HandshakeOptions::new(),
        );
        options.srv_polling = Some(SrvPollingOptions::new(0, Some(Duration::from_secs(90))));
        let mut engine = Engine::new(options, Instant::ZERO).expect("an engine");
        engine.handle_timeout(Instant::ZERO);
        let seeds: Vec<ServerAddress> = core::iter::from_fn(|| engine.poll_connect())
            .map(|c| c.address)
            .collect();
        assert_eq!(seeds, [at(27017)], "the seed's monitor connects");
        // The monitor's connect timeout comes first; the rescan is due at 90 s (SP-2).
        engine.handle_timeout(secs(89));
        assert!(!engine.poll_srv_rescan());
        engine.handle_timeout(secs(90));
        assert!(engine.poll_srv_rescan(), "Unknown is polled (SP-1)");
        assert!(!engine.poll_srv_rescan());
        while engine.poll_event().is_some() {}
        engine.handle_srv_hosts(hosts(&[27018]), None, secs(91));
        engine.handle_timeout(secs(91));
        let opened: Vec<ServerAddress> = core::iter::from_fn(|| engine.poll_connect())
            .map(|c| c.address)
            .collect();
        assert!(
            opened.contains(&at(27018)),
            "the new host is monitored: {opened:?}"
        );
        let events: Vec<EngineEvent> = core::iter::from_fn(|| engine.poll_event()).collect();
        assert!(
            events.contains(&EngineEvent::Topology(SdamEvent::ServerClosed {
                address: at(27017)
            }))
        );
        assert!(
            events.contains(&EngineEvent::Topology(SdamEvent::ServerOpening {
                address: at(27018)
            }))
        );
        let next = engine.poll_timeout().expect("timers");
        assert!(
            next <= secs(151),
            "the next rescan at 151 s at the latest: {next:?}"
        );
        // A closed engine asks for no more rescans.
        engine.close(secs(100));
        engine.handle_timeout(secs(1_000));
        assert!(!engine.poll_srv_rescan());
        // No polling without the option.
        let plain = EngineOptions::new(
            TopologySettings::new(hosts(&[27017])),
            HandshakeOptions::new(),
        );
        let mut engine = Engine::new(plain, Instant::ZERO).expect("an engine");
        engine.handle_timeout(secs(600));
        assert!(!engine.poll_srv_rescan());
    }
}
