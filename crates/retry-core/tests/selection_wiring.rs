//! The retry machine's `SelectServer` answered by the real selector: the deprioritized set flows
//! from the retry machine into `ServerSelection`, so a retry moves to another server exactly when
//! the rules say (BP-19, BP-20, SS-11, SS-12).

mod support;

use retry_core::address::ServerAddress;
use retry_core::error::OperationError;
use retry_core::policy::RetryOptions;
use retry_core::retry::{Action, AttemptServer, OperationKind, OperationSpec, RetryMachine};
use retry_core::rng::EngineRng;
use retry_core::selection::{
    ReadPreference, ReadPreferenceMode, SelectionCriteria, SelectionSettings, SelectionStep,
    ServerSelection,
};
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::{
    AverageRtt, ServerDescription, ServerType, TopologyDescription, TopologyType,
};
use std::time::Duration;

fn described(host: &str, server_type: ServerType) -> ServerDescription {
    ServerDescription {
        server_type,
        average_rtt: AverageRtt::from_duration(Duration::from_millis(5)),
        max_wire_version: 25,
        logical_session_timeout: Some(Duration::from_secs(1800)),
        ..ServerDescription::unknown(ServerAddress::new(host, 27017))
    }
}

/// Answers `SelectServer` with one `ServerSelection` poll over `topology`, avoiding the machine's
/// deprioritized addresses, and returns the chosen address. Operation counts grow with the host
/// name (`a` is the least busy), so without deprioritization the same server wins every time.
fn select(
    machine: &mut RetryMachine,
    topology: &TopologyDescription,
    criteria: &SelectionCriteria,
    rng: &mut EngineRng,
    now: Instant,
) -> ServerAddress {
    let mut selection = ServerSelection::new(
        criteria.clone(),
        machine.deprioritized(),
        SelectionSettings::default(),
        OperationTimeout::Off,
        now,
    );
    let SelectionStep::Selected(server) =
        selection.poll(topology, |a| u32::from(a.host().as_bytes()[0]), rng, now)
    else {
        panic!("nothing selectable in {topology}");
    };
    machine
        .handle_server_selected(
            AttemptServer::from_description(server, topology.topology_type),
            now,
        )
        .unwrap();
    server.address.clone()
}

/// Runs two attempts: the first fails with `error`; returns the two servers chosen.
fn two_attempts(
    options: &RetryOptions,
    topology: &TopologyDescription,
    criteria: &SelectionCriteria,
    error: OperationError,
) -> (ServerAddress, ServerAddress) {
    let mut rng = EngineRng::from_seed_u64(11);
    let mut machine = RetryMachine::new(
        OperationSpec::new(OperationKind::Read),
        options,
        5,
        Instant::ZERO,
    );
    let mut chosen = Vec::new();
    let mut now = Instant::ZERO;
    // Bounded: two attempts, each a handful of actions, and at most one backoff.
    for _ in 0..20 {
        match machine.poll_action() {
            Some(Action::SelectServer) => {
                chosen.push(select(&mut machine, topology, criteria, &mut rng, now));
            }
            Some(Action::Dispatch(_)) => {
                machine.handle_sent(now).unwrap();
                if chosen.len() == 1 {
                    machine.handle_failed(error.clone(), now).unwrap();
                } else {
                    machine.handle_succeeded(now).unwrap();
                }
            }
            Some(Action::Wait { .. }) => {
                now = machine.poll_timeout().unwrap();
                machine.handle_timeout(now);
            }
            Some(Action::Finished(result)) => {
                assert!(result.is_ok(), "{result:?}");
                break;
            }
            Some(Action::ReleaseConnection { .. }) | None => {}
        }
    }
    assert_eq!(chosen.len(), 2, "expected exactly one retry");
    (chosen[0].clone(), chosen[1].clone())
}

#[test]
fn bp20_ss11_a_sharded_retry_goes_to_the_other_mongos() {
    let topology = TopologyDescription::new(
        TopologyType::Sharded,
        vec![
            described("a", ServerType::Mongos),
            described("b", ServerType::Mongos),
        ],
    );
    let read = SelectionCriteria::Read(ReadPreference::PRIMARY);
    // A retryable read error without overload labels: sharded clusters always deprioritize.
    let (first, second) = two_attempts(
        &RetryOptions::default(),
        &topology,
        &read,
        support::error(91, &[]),
    );
    assert_eq!(
        (first.host(), second.host()),
        ("a", "b"),
        "the least busy mongos first, then the other one"
    );
}

#[test]
fn bp19_ss12_primary_preferred_moves_to_a_secondary_only_with_overload_retargeting() {
    let topology = TopologyDescription::new(
        TopologyType::ReplicaSetWithPrimary,
        vec![
            described("p", ServerType::RsPrimary),
            described("s", ServerType::RsSecondary),
        ],
    );
    let read = SelectionCriteria::Read(ReadPreference::from_mode(
        ReadPreferenceMode::PrimaryPreferred,
    ));
    let overload = support::error(462, &support::OVERLOAD);
    let p = ServerAddress::new("p", 27017);
    let s = ServerAddress::new("s", 27017);

    let default = RetryOptions::default();
    assert_eq!(
        two_attempts(&default, &topology, &read, overload.clone()),
        (p.clone(), p.clone())
    );
    let retargeting = RetryOptions::default().enable_overload_retargeting(true);
    assert_eq!(
        two_attempts(&retargeting, &topology, &read, overload),
        (p, s)
    );
}
