//! RW-2, RW-4, SE-13 (review37 W2): a `txnNumber` in a caller's command never reaches the wire
//! as given: the engine sets one on retryable writes and transaction commands only. A read or a
//! run-command with one is refused by a real server (50768), any on a standalone (20), and a
//! write with `retryWrites=false` would become a retryable write on the server.

use bson::{doc, Bson, Document, RawDocumentBuf};
use retry_core::engine::OperationRequest;
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;
use retry_sim::{address, request, Role, Sim, SimServer, Step};

fn ok() -> Step {
    Step::reply(doc! { "ok": 1, "n": 1 })
}

/// The `txnNumber` of each command the server at `host` recorded.
fn sent_numbers(sim: &Sim, host: &str) -> Vec<Option<Bson>> {
    sim.servers[&address(host)]
        .commands
        .iter()
        .map(|c: &Document| c.get("txnNumber").cloned())
        .collect()
}

/// RW-4 (review37 W2): a read and a run-command carrying a caller's `txnNumber`, in an implicit
/// session on a mongos, go out without it, as a document and encoded.
#[test]
fn rw4_a_callers_txn_number_on_a_read_or_run_command_is_not_sent() {
    let mut sim = Sim::mongos([ok(), ok(), ok()], |_| {});
    let find = doc! { "find": "c", "txnNumber": 5_i64 };
    let read = sim.start_request(request(find.clone(), OperationKind::Read));
    sim.run(read).expect("the find runs");
    let ping = sim.start_request(request(
        doc! { "ping": 1, "txnNumber": 5_i64 },
        OperationKind::RunCommand,
    ));
    sim.run(ping).expect("the ping runs");
    let raw = RawDocumentBuf::try_from(&find).expect("encodes");
    let encoded = sim.start_request(OperationRequest::new_raw(
        "test",
        raw,
        OperationKind::Read,
        SelectionCriteria::Write,
    ));
    sim.run(encoded).expect("the encoded find runs");
    assert_eq!(sent_numbers(&sim, "m"), [None, None, None]);
    assert!(sim.servers[&address("m")].commands[0].contains_key("lsid"));
}

/// RW-2, SE-8 (review37 W2): an insert carrying a caller's `txnNumber`, on a standalone that
/// supports sessions, goes out without it (a standalone refuses any, 20).
#[test]
fn rw2_a_callers_txn_number_never_reaches_a_standalone() {
    let mut server = SimServer::new(Role::Standalone);
    server.record_commands = true;
    server.script.push_back(ok());
    let mut sim = Sim::new(vec![(address("s"), server)], |_| {});
    let insert = doc! { "insert": "c", "documents": [{}], "txnNumber": 5_i64 };
    let op = sim.start_request(request(insert, OperationKind::RetryableWrite));
    sim.run(op).expect("the insert runs");
    assert_eq!(sent_numbers(&sim, "s"), [None]);
    assert!(sim.servers[&address("s")].commands[0].contains_key("lsid"));
}

/// RW-2 (review37 W2): with `retryWrites=false` an insert carrying a caller's `txnNumber` is not
/// made a retryable write on the server: it goes out without one; with retryable writes on, the
/// engine's own number (1, the session's first) replaces the caller's.
#[test]
fn rw2_a_callers_txn_number_is_replaced_or_removed_on_a_write() {
    let insert = doc! { "insert": "c", "documents": [{}], "txnNumber": 5_i64 };
    let mut sim = Sim::mongos([ok()], |o| o.retry = o.retry.clone().retry_writes(false));
    let op = sim.start_request(request(insert.clone(), OperationKind::RetryableWrite));
    sim.run(op).expect("the insert runs");
    assert_eq!(sent_numbers(&sim, "m"), [None]);

    let mut sim = Sim::mongos([ok()], |_| {});
    let op = sim.start_request(request(insert, OperationKind::RetryableWrite));
    sim.run(op).expect("the insert runs");
    assert_eq!(sent_numbers(&sim, "m"), [Some(Bson::Int64(1))]);
}
