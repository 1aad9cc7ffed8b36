//! SE-10, SE-12: ending an explicit session while one of its operations is in flight, end to end
//! through the engine against a scripted mongos, in virtual time.

use std::time::Duration;

use bson::{doc, Document};
use retry_core::engine::{OpId, OperationRequest, SessionHandle};
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;

use retry_sim::{address, Role, Sim, SimServer, Step};

/// One mongos that records what it receives and answers its first command `delay` late.
fn slow_mongos(delay: Duration) -> Sim {
    let mut server = SimServer::new(Role::Mongos);
    server.record_commands = true;
    server.script.push_back(Step::Reply {
        body: doc! { "ok": 1 },
        delay,
    });
    Sim::new(vec![(address("m"), server)], |_| {})
}

fn lsids(sim: &Sim, name: &str) -> Vec<Document> {
    sim.servers[&address("m")]
        .commands
        .iter()
        .filter(|c| c.keys().next().map(String::as_str) == Some(name))
        .map(|c| c.get_document("lsid").expect("an lsid").clone())
        .collect()
}

fn insert(sim: &mut Sim, session: Option<SessionHandle>) -> OpId {
    let mut request = OperationRequest::new(
        "test",
        doc! { "insert": "c", "documents": [{}] },
        OperationKind::RetryableWrite,
        SelectionCriteria::Write,
    );
    request.session = session;
    sim.start_request(request)
}

fn find(sim: &mut Sim, session: Option<SessionHandle>) -> OpId {
    let mut request = OperationRequest::new(
        "test",
        doc! { "find": "c" },
        OperationKind::Read,
        retry_sim::primary(),
    );
    request.session = session;
    sim.start_request(request)
}

/// SE-12 (review item 3): a session ended while its command is in flight keeps its server
/// session until that operation finishes: a concurrent implicit operation gets another lsid,
/// and when the operation is then cancelled (its connection closed under the command) the server
/// session is dirty and never pooled again.
#[test]
fn se12_ending_a_session_under_a_running_operation_waits_and_a_cancel_still_dirties_it() {
    let mut sim = slow_mongos(Duration::from_secs(10));
    let session = sim.engine.start_session();
    let running = find(&mut sim, Some(session));
    sim.advance_to(sim.now.saturating_add(Duration::from_millis(100)));
    assert!(sim.result(running).is_none(), "still in flight");
    sim.engine.end_session(session, sim.now);
    sim.drain();
    let concurrent = insert(&mut sim, None);
    sim.run(concurrent).unwrap();
    sim.engine.cancel_operation(running, sim.now);
    sim.drain();
    assert!(sim.run(running).is_err(), "cancelled");
    let after = insert(&mut sim, None);
    sim.run(after).unwrap();
    let ended = &lsids(&sim, "find")[0];
    let inserts = lsids(&sim, "insert");
    assert_ne!(&inserts[0], ended, "not shared while its command runs");
    assert_ne!(&inserts[1], ended, "SE-12: dirty, discarded");
    assert_eq!(inserts[1], inserts[0], "SE-5: the clean one is pooled");
}

/// SE-10, SE-5: a session ended while its operation runs refuses new operations at once; the
/// running one still completes, and then the session's clean server session is pooled.
#[test]
fn se10_an_ending_session_refuses_new_operations_and_is_pooled_after_the_last_one() {
    let mut sim = slow_mongos(Duration::from_secs(1));
    let session = sim.engine.start_session();
    let running = find(&mut sim, Some(session));
    sim.advance_to(sim.now.saturating_add(Duration::from_millis(100)));
    sim.engine.end_session(session, sim.now);
    sim.drain();
    let refused = insert(&mut sim, Some(session));
    let error = sim.run(refused).expect_err("the session has ended");
    assert!(
        error.to_string().contains("the session has ended"),
        "{error}"
    );
    sim.run(running).expect("the running operation completes");
    let after = insert(&mut sim, None);
    sim.run(after).unwrap();
    assert_eq!(
        lsids(&sim, "insert"),
        lsids(&sim, "find"),
        "the ended session's server session was pooled once its operation finished"
    );
}
