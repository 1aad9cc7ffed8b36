//! SE-21: an explicit session is causally consistent: the `operationTime` of its replies goes on
//! its later reads as `readConcern.afterClusterTime`, as a scripted mongos receives them.

use bson::{doc, Bson, Document, Timestamp};
use retry_core::engine::{OperationRequest, SessionHandle};
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;

use retry_sim::{address, Role, Sim, SimServer, Step};

fn at(time: u32, increment: u32) -> Timestamp {
    Timestamp { time, increment }
}

fn read_concern(command: &Document) -> Option<&Document> {
    command.get_document("readConcern").ok()
}

/// SE-21 (review item 11): no `afterClusterTime` before the session has seen an
/// `operationTime`; then the greatest one seen (failures included) on `find`, `aggregate`,
/// `count`, `distinct` with the command's own level kept; never on a generic command, a write,
/// or an operation outside the session.
#[test]
fn se21_reads_in_an_explicit_session_carry_after_cluster_time() {
    let mut server = SimServer::new(Role::Mongos);
    server.record_commands = true;
    server.script.extend([
        // The first find: no operationTime yet.
        Step::reply(doc! { "ok": 1, "cursor": { "id": 0_i64, "ns": "test.c", "firstBatch": [] } }),
        Step::reply(doc! { "ok": 1, "n": 1, "operationTime": at(10, 2) }),
        // An older time does not go back; a failure's time counts.
        Step::reply(doc! { "ok": 1, "operationTime": at(10, 1) }),
        Step::reply(doc! { "ok": 0, "code": 2, "errmsg": "bad", "operationTime": at(11, 0) }),
    ]);
    let mut sim = Sim::new(vec![(address("m"), server)], |_| {});
    let session = sim.engine.start_session();
    let run = |sim: &mut Sim, session: Option<SessionHandle>, command: Document, kind| {
        let criteria = match kind {
            OperationKind::RetryableWrite => SelectionCriteria::Write,
            _ => retry_sim::primary(),
        };
        let mut request = OperationRequest::new("test", command, kind, criteria);
        request.session = session;
        let op = sim.start_request(request);
        let _ = sim.run(op);
    };
    let s = Some(session);
    run(&mut sim, s, doc! { "find": "c" }, OperationKind::Read);
    run(
        &mut sim,
        s,
        doc! { "insert": "c", "documents": [{}] },
        OperationKind::RetryableWrite,
    );
    run(&mut sim, s, doc! { "count": "c" }, OperationKind::Read);
    run(&mut sim, s, doc! { "ping": 1 }, OperationKind::RunCommand);
    run(
        &mut sim,
        s,
        doc! { "find": "c", "readConcern": { "level": "majority" } },
        OperationKind::Read,
    );
    run(
        &mut sim,
        s,
        doc! { "distinct": "c", "key": "x" },
        OperationKind::Read,
    );
    run(&mut sim, None, doc! { "find": "c" }, OperationKind::Read);

    let commands = &sim.servers[&address("m")].commands;
    assert_eq!(commands.len(), 7);
    assert_eq!(read_concern(&commands[0]), None, "nothing seen yet");
    assert_eq!(read_concern(&commands[1]), None, "a write");
    assert_eq!(
        read_concern(&commands[2]),
        Some(&doc! { "afterClusterTime": at(10, 2) })
    );
    assert_eq!(read_concern(&commands[3]), None, "a generic command");
    assert_eq!(
        read_concern(&commands[4]),
        Some(&doc! { "level": "majority", "afterClusterTime": at(11, 0) }),
        "the greatest time, from a failure's reply, with the command's level"
    );
    assert_eq!(
        commands[5]
            .get_document("readConcern")
            .ok()
            .and_then(|r| r.get("afterClusterTime")),
        Some(&Bson::Timestamp(at(11, 0)))
    );
    assert_eq!(read_concern(&commands[6]), None, "an implicit session");
}

/// SE-21 (DRIVERS-3274: causal-consistency spec "Causally consistent read and write commands",
/// which defers to the read-write-concern spec's "`afterClusterTime`" list;
/// `causal-consistency-write-commands.yml` "create / createIndexes / drop / dropDatabase /
/// dropIndexes includes afterClusterTime", `causal-consistency-clientBulkWrite.yml`; transactions
/// `commit.json` "reset session state commit", `retryable-writes.json` "increment txnNumber"):
/// once the session has seen an `operationTime`, the write commands of that list carry
/// `readConcern.afterClusterTime` too, without a level, and a write command outside it
/// (`collMod`) none; a transaction's first command keeps its `snapshot` level with it
/// (`transaction-options-repl.json`); a command with its own `atClusterTime` gets none (SE-22).
#[test]
fn se21_writes_and_a_snapshot_transaction_carry_after_cluster_time() {
    let mut server = SimServer::new(Role::Mongos);
    server.record_commands = true;
    server.script.extend([Step::reply(
        doc! { "ok": 1, "n": 1, "operationTime": at(20, 1) },
    )]);
    let mut sim = Sim::new(vec![(address("m"), server)], |_| {});
    let session = sim.engine.start_session();
    let run = |sim: &mut Sim, command: Document, kind| {
        let request = OperationRequest::new("test", command, kind, SelectionCriteria::Write)
            .with_session(session);
        let op = sim.start_request(request);
        let _ = sim.run(op);
    };
    let insert = || doc! { "insert": "c", "documents": [{}] };
    run(&mut sim, insert(), OperationKind::RetryableWrite);
    run(&mut sim, insert(), OperationKind::RetryableWrite);
    run(
        &mut sim,
        doc! { "update": "c", "updates": [{ "q": {}, "u": {}, "multi": true }] },
        OperationKind::NonRetryableWrite,
    );
    let listed = [
        doc! { "delete": "c", "deletes": [{ "q": {}, "limit": 1 }] },
        doc! { "findAndModify": "c", "query": {}, "remove": true },
        doc! { "bulkWrite": 1, "ops": [], "nsInfo": [] },
        doc! { "create": "d" },
        doc! { "createIndexes": "c", "indexes": [] },
        doc! { "drop": "d" },
        doc! { "dropDatabase": 1 },
        doc! { "dropIndexes": "c", "index": "*" },
    ];
    for command in listed.iter().cloned() {
        run(&mut sim, command, OperationKind::NonRetryableWrite);
    }
    run(
        &mut sim,
        doc! { "collMod": "c" },
        OperationKind::NonRetryableWrite,
    );
    run(
        &mut sim,
        doc! { "find": "c", "readConcern": { "level": "snapshot", "atClusterTime": at(5, 0) } },
        OperationKind::Read,
    );
    let options = retry_core::transaction::TransactionOptions::default()
        .with_read_concern(doc! { "level": "snapshot" });
    sim.engine
        .start_transaction(session, options, sim.now)
        .expect("a transaction");
    run(&mut sim, insert(), OperationKind::RetryableWrite);

    let commands = &sim.servers[&address("m")].commands;
    let writes = 3 + listed.len();
    assert_eq!(commands.len(), writes + 3);
    assert_eq!(read_concern(&commands[0]), None, "nothing seen yet");
    let after = doc! { "afterClusterTime": at(20, 1) };
    for write in &commands[1..writes] {
        assert_eq!(read_concern(write), Some(&after), "{write}");
    }
    assert_eq!(read_concern(&commands[writes]), None, "not in the list");
    assert_eq!(
        read_concern(&commands[writes + 1]),
        Some(&doc! { "level": "snapshot", "atClusterTime": at(5, 0) }),
        "its own point in time"
    );
    assert_eq!(
        read_concern(&commands[writes + 2]),
        Some(&doc! { "level": "snapshot", "afterClusterTime": at(20, 1) }),
        "TX-1: the transaction's level with the session's time"
    );
}
