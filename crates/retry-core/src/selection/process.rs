//! The selection loop (SS-16) as a sans-IO machine: select, or wait for a topology change until a
//! deadline, or fail with an error that describes the topology and the criteria.

use alloc::boxed::Box;
use alloc::string::{String, ToString};
use core::fmt;
use core::time::Duration;

use rand_core::RngCore;
use smallvec::SmallVec;

use super::{select_server, ReadPreferenceError, SelectionCriteria, SelectionSettings};
use crate::address::ServerAddress;
use crate::time::{Instant, OperationTimeout};
use crate::topology::{ServerDescription, TopologyDescription};

/// Why server selection failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelectionError {
    /// The read preference is invalid for this topology (SS-2).
    InvalidReadPreference(ReadPreferenceError),
    /// A server speaks no wire version this engine supports (SS-16 step 2).
    Incompatible(Box<str>),
    /// No suitable server appeared before the deadline (SS-16 step 10, SS-20).
    TimedOut(Box<TimedOut>),
}

/// The facts of a selection timeout: what was asked for, what the topology looked like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimedOut {
    /// How long selection waited.
    pub waited: Duration,
    /// The criteria, e.g. `read with read preference {mode: secondary}`.
    pub criteria: String,
    /// The addresses selection avoided when it could (SS-11).
    pub deprioritized: String,
    /// The topology at the deadline (its `Display` form).
    pub topology: String,
}

impl fmt::Display for SelectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SelectionError::InvalidReadPreference(e) => write!(f, "server selection failed: {e}"),
            SelectionError::Incompatible(reason) => {
                write!(
                    f,
                    "server selection failed: incompatible topology: {reason}"
                )
            }
            SelectionError::TimedOut(t) => {
                write!(
                    f,
                    "server selection timed out after {} ms: no server available for {}",
                    t.waited.as_millis(),
                    t.criteria
                )?;
                if !t.deprioritized.is_empty() {
                    write!(f, " (deprioritized: {})", t.deprioritized)?;
                }
                write!(f, "; topology: {}", t.topology)
            }
        }
    }
}

impl core::error::Error for SelectionError {}

/// What the selection loop wants next.
#[derive(Clone, Debug, PartialEq)]
pub enum SelectionStep<'a> {
    /// A server was chosen; increment its operation count now (SS-15).
    Selected(&'a ServerDescription),
    /// Nothing is suitable: request an immediate check of the topology, then call
    /// [`ServerSelection::poll`] again when the topology changes or at `until`, whichever is first
    /// (SS-16 step 9). Changes of operation counts are not topology changes.
    Wait {
        /// The selection deadline.
        until: Instant,
        /// True on the first wait of this selection: log "Waiting for suitable server to become
        /// available" now, and only now (SS-19).
        first: bool,
    },
    /// Selection failed; the operation ends with this error (or, for a retry, with the previous
    /// attempt's error: RW-14).
    Failed(SelectionError),
}

/// One server selection in progress (SS-16): criteria, deprioritized addresses and a deadline,
/// kept across waits for topology changes.
#[derive(Clone, Debug)]
pub struct ServerSelection {
    criteria: SelectionCriteria,
    deprioritized: SmallVec<[ServerAddress; 4]>,
    settings: SelectionSettings,
    started: Instant,
    deadline: Instant,
    waiting: bool,
}

impl ServerSelection {
    /// Starts a selection at `now` (SS-16 step 1). The deadline is `serverSelectionTimeoutMS` from
    /// now, or the operation's CSOT deadline if that comes first.
    pub fn new(
        criteria: SelectionCriteria,
        deprioritized: &[ServerAddress],
        settings: SelectionSettings,
        timeout: OperationTimeout,
        now: Instant,
    ) -> ServerSelection {
        ServerSelection {
            criteria,
            deprioritized: deprioritized.iter().cloned().collect(),
            settings,
            started: now,
            deadline: ServerSelection::deadline_from(&settings, timeout, now),
            waiting: false,
        }
    }

    /// SS-16 step 1, CS-3: the deadline of a selection started at `now`,
    /// `serverSelectionTimeoutMS` from now or the operation's CSOT deadline if that comes first
    /// (also the checkout's under CSOT).
    pub(crate) fn deadline_from(
        settings: &SelectionSettings,
        timeout: OperationTimeout,
        now: Instant,
    ) -> Instant {
        let own = now.saturating_add(settings.server_selection_timeout);
        timeout.deadline().map_or(own, |csot| csot.min(own))
    }

    /// The criteria being selected for.
    pub fn criteria(&self) -> &SelectionCriteria {
        &self.criteria
    }

    /// The deprioritized addresses, kept across waits (SS-11).
    pub fn deprioritized(&self) -> &[ServerAddress] {
        &self.deprioritized
    }

    /// When the selection fails if nothing suitable appears.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Runs the pipeline against the current topology at `now` (SS-16 steps 2 to 10): a server,
    /// a wait, or a failure once the deadline has passed. Call it first right after
    /// [`ServerSelection::new`], then after every topology change and at the deadline.
    pub fn poll<'a>(
        &mut self,
        topology: &'a TopologyDescription,
        operation_count: impl Fn(&ServerAddress) -> u32,
        rng: &mut (impl RngCore + ?Sized),
        now: Instant,
    ) -> SelectionStep<'a> {
        match select_server(
            topology,
            &self.criteria,
            &self.deprioritized,
            &self.settings,
            operation_count,
            rng,
        ) {
            Err(e) => SelectionStep::Failed(e),
            Ok(Some(server)) => SelectionStep::Selected(server),
            Ok(None) if now >= self.deadline => {
                SelectionStep::Failed(SelectionError::TimedOut(Box::new(TimedOut {
                    waited: now.saturating_duration_since(self.started),
                    criteria: self.criteria.to_string(),
                    deprioritized: self.deprioritized_list(),
                    topology: topology.to_string(),
                })))
            }
            Ok(None) => {
                let first = !self.waiting;
                self.waiting = true;
                SelectionStep::Wait {
                    until: self.deadline,
                    first,
                }
            }
        }
    }

    fn deprioritized_list(&self) -> String {
        let mut list = String::new();
        for (i, a) in self.deprioritized.iter().enumerate() {
            if i > 0 {
                list.push_str(", ");
            }
            list.push_str(&a.to_string());
        }
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::EngineRng;
    use crate::selection::{ReadPreference, ReadPreferenceMode};
    use crate::topology::{AverageRtt, ServerType, TopologyType};
    use alloc::vec;

    fn server(host: &str, server_type: ServerType) -> ServerDescription {
        ServerDescription {
            server_type,
            average_rtt: AverageRtt::from_duration(Duration::from_millis(5)),
            max_wire_version: 21,
            ..ServerDescription::unknown(ServerAddress::new(host, 27017))
        }
    }

    fn secondary_read() -> SelectionCriteria {
        SelectionCriteria::Read(ReadPreference::from_mode(ReadPreferenceMode::Secondary))
    }

    #[test]
    fn ss16_waits_until_a_topology_change_brings_a_suitable_server() {
        let settings = SelectionSettings::default();
        let t0 = Instant::from_millis(1_000);
        let a = ServerAddress::new("b", 27017);
        let mut sel = ServerSelection::new(
            secondary_read(),
            core::slice::from_ref(&a),
            settings,
            OperationTimeout::Off,
            t0,
        );
        assert_eq!(sel.deadline(), Instant::from_millis(31_000));
        let mut rng = EngineRng::from_seed_u64(3);
        let no_secondary = TopologyDescription::new(
            TopologyType::ReplicaSetWithPrimary,
            vec![server("a", ServerType::RsPrimary)],
        );
        let until = Instant::from_millis(31_000);
        assert_eq!(
            sel.poll(&no_secondary, |_| 0, &mut rng, t0),
            SelectionStep::Wait { until, first: true }
        );
        assert_eq!(
            sel.poll(&no_secondary, |_| 0, &mut rng, Instant::from_millis(2_000)),
            SelectionStep::Wait {
                until,
                first: false
            }
        );
        // SS-11: the set survives the wait: c is chosen over the deprioritized b.
        let two = TopologyDescription::new(
            TopologyType::ReplicaSetWithPrimary,
            vec![
                server("a", ServerType::RsPrimary),
                server("b", ServerType::RsSecondary),
                server("c", ServerType::RsSecondary),
            ],
        );
        for _ in 0..20 {
            match sel.poll(&two, |_| 0, &mut rng, Instant::from_millis(3_000)) {
                SelectionStep::Selected(s) => assert_eq!(s.address.host(), "c"),
                other => panic!("{other:?}"),
            }
        }
    }

    /// SS-16; also SS-20: the error text says no server is available for the read preference
    /// and includes the topology.
    #[test]
    fn ss16_fails_at_the_deadline_with_topology_and_criteria_in_the_message() {
        let settings = SelectionSettings::default();
        let t0 = Instant::from_millis(0);
        let csot = OperationTimeout::Until(Instant::from_millis(5_000));
        let deprioritized = [ServerAddress::new("a", 27017)];
        let mut sel = ServerSelection::new(secondary_read(), &deprioritized, settings, csot, t0);
        assert_eq!(
            sel.deadline(),
            Instant::from_millis(5_000),
            "CSOT comes first"
        );
        let topology = TopologyDescription::new(
            TopologyType::ReplicaSetWithPrimary,
            vec![server("a", ServerType::RsPrimary)],
        );
        let mut rng = EngineRng::from_seed_u64(3);
        let SelectionStep::Failed(err) =
            sel.poll(&topology, |_| 0, &mut rng, Instant::from_millis(5_000))
        else {
            panic!("expected a failure")
        };
        assert_eq!(
            err.to_string(),
            "server selection timed out after 5000 ms: no server available for read with read \
             preference {mode: secondary} (deprioritized: a:27017); topology: {type: \
             ReplicaSetWithPrimary, servers: [a:27017 RsPrimary rtt=5ms]}"
        );
    }

    #[test]
    fn ss16_zero_timeout_tries_once() {
        let settings = SelectionSettings {
            server_selection_timeout: Duration::ZERO,
            ..SelectionSettings::default()
        };
        let now = Instant::from_millis(7);
        let mut sel = ServerSelection::new(
            SelectionCriteria::Write,
            &[],
            settings,
            OperationTimeout::Off,
            now,
        );
        let empty = TopologyDescription::new(TopologyType::Unknown, vec![]);
        let step = sel.poll(&empty, |_| 0, &mut EngineRng::from_seed_u64(0), now);
        assert!(matches!(
            step,
            SelectionStep::Failed(SelectionError::TimedOut(_))
        ));
    }

    #[test]
    fn ss16_step2_an_incompatible_topology_fails_at_once() {
        let settings = SelectionSettings::default();
        let mut old = server("a", ServerType::Standalone);
        old.max_wire_version = 2;
        let topology = TopologyDescription::new(TopologyType::Single, vec![old]);
        let mut sel = ServerSelection::new(
            SelectionCriteria::Write,
            &[],
            settings,
            OperationTimeout::Off,
            Instant::ZERO,
        );
        let step = sel.poll(
            &topology,
            |_| 0,
            &mut EngineRng::from_seed_u64(0),
            Instant::ZERO,
        );
        let SelectionStep::Failed(SelectionError::Incompatible(reason)) = step else {
            panic!("{step:?}")
        };
        assert!(reason.contains("a:27017"), "{reason}");
    }

    #[test]
    fn ss2_an_invalid_max_staleness_fails_with_the_field_named() {
        let settings = SelectionSettings::default();
        let rp = ReadPreference::new(ReadPreferenceMode::Nearest, vec![], Some(30)).unwrap();
        let topology = TopologyDescription::new(
            TopologyType::ReplicaSetNoPrimary,
            vec![server("b", ServerType::RsSecondary)],
        );
        let mut sel = ServerSelection::new(
            SelectionCriteria::Read(rp),
            &[],
            settings,
            OperationTimeout::Off,
            Instant::ZERO,
        );
        let step = sel.poll(
            &topology,
            |_| 0,
            &mut EngineRng::from_seed_u64(0),
            Instant::ZERO,
        );
        let SelectionStep::Failed(err) = step else {
            panic!("{step:?}")
        };
        assert!(err.to_string().contains("`maxStalenessSeconds`"), "{err}");
    }
}
