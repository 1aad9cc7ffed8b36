//! TX-1, TX-6: the fields the engine adds to a transaction's commands, as a scripted mongos
//! receives them, in virtual time.

use bson::{doc, Bson, Document};
use retry_core::engine::{OpId, OperationRequest, SessionHandle};
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;

use retry_sim::{address, Role, Sim, SimServer, Step};

/// One mongos that records what it receives and answers with `script`, then `{ok: 1}`.
fn mongos(script: Vec<Step>) -> Sim {
    let mut server = SimServer::new(Role::Mongos);
    server.record_commands = true;
    server.script.extend(script);
    Sim::new(vec![(address("m"), server)], |_| {})
}

fn received(sim: &Sim) -> Vec<Document> {
    sim.servers[&address("m")].commands.clone()
}

fn run(sim: &mut Sim, session: SessionHandle, command: Document, kind: OperationKind) -> OpId {
    let db = if matches!(
        kind,
        OperationKind::CommitTransaction { .. } | OperationKind::AbortTransaction
    ) {
        "admin"
    } else {
        "test"
    };
    let request =
        OperationRequest::new(db, command, kind, SelectionCriteria::Write).with_session(session);
    let op = sim.start_request(request);
    sim.run(op).expect("the command succeeds");
    op
}

fn statement(first: bool) -> OperationKind {
    OperationKind::InTransaction { read: false, first }
}

/// TX-1 (review item 10): every command of a transaction carries `autocommit: false` with its
/// `txnNumber`, commit and abort included, even when the caller's command did not say it.
/// TX-6: the latest `recoveryToken` of the transaction's `ok: 1` replies goes on its commit and
/// abort, unchanged; a new transaction starts without one.
#[test]
fn tx1_tx6_autocommit_false_everywhere_and_the_recovery_token_on_commit_and_abort() {
    let token = |shard: &str| doc! { "recoveryShardId": shard };
    let mut sim = mongos(vec![
        Step::reply(doc! { "ok": 1, "recoveryToken": token("a") }),
        Step::reply(doc! { "ok": 1, "recoveryToken": token("b") }),
        // An error reply's token is not kept.
        Step::reply(doc! { "ok": 0, "code": 2, "recoveryToken": token("bad") }),
    ]);
    let session = sim.engine.start_session();
    let insert = || doc! { "insert": "c", "documents": [{}] };
    run(&mut sim, session, insert(), statement(true));
    run(&mut sim, session, insert(), statement(false));
    let mut request =
        OperationRequest::new("test", insert(), statement(false), SelectionCriteria::Write);
    request.session = Some(session);
    let failing = sim.start_request(request);
    assert!(sim.run(failing).is_err());
    let commit = OperationKind::CommitTransaction { again: false };
    run(&mut sim, session, doc! { "commitTransaction": 1 }, commit);
    // The next transaction has no token until a reply gives it one.
    run(&mut sim, session, insert(), statement(true));
    run(
        &mut sim,
        session,
        doc! { "abortTransaction": 1 },
        OperationKind::AbortTransaction,
    );

    let commands = received(&sim);
    let names: Vec<&str> = commands
        .iter()
        .map(|c| c.keys().next().map_or("", String::as_str))
        .collect();
    assert_eq!(
        names,
        [
            "insert",
            "insert",
            "insert",
            "commitTransaction",
            "insert",
            "abortTransaction"
        ]
    );
    for command in &commands {
        assert_eq!(
            command.get("autocommit"),
            Some(&Bson::Boolean(false)),
            "TX-1: {command}"
        );
        assert!(
            matches!(command.get("txnNumber"), Some(Bson::Int64(_))),
            "{command}"
        );
    }
    assert_eq!(
        commands[3].get_document("recoveryToken").ok(),
        Some(&token("b")),
        "TX-6: the latest ok:1 token"
    );
    assert!(
        !commands[5].contains_key("recoveryToken"),
        "TX-6: cleared at start"
    );
    for statement in [0, 1, 2, 4] {
        assert!(!commands[statement].contains_key("recoveryToken"));
    }
}
