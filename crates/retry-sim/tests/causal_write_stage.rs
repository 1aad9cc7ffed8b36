//! SE-21 (review37 W12): in a causally consistent session an `aggregate` with a write stage
//! (`$out` / `$merge`, a write by classify.rs) and an inline `mapReduce` take a read concern, so
//! they carry `readConcern.afterClusterTime`, the session's last `operationTime`.

use bson::{doc, Document, Timestamp};
use retry_core::engine::OperationRequest;
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;
use retry_sim::{address, primary, Sim, Step};

#[test]
fn se21_an_out_aggregate_and_a_map_reduce_read_causally() {
    let time = Timestamp {
        time: 10,
        increment: 2,
    };
    let cursor = doc! { "ok": 1, "cursor": { "id": 0_i64, "ns": "test.c", "firstBatch": [] } };
    let mut found = cursor.clone();
    found.insert("operationTime", time);
    let mut sim = Sim::mongos(
        [
            Step::reply(found),
            Step::reply(cursor.clone()),
            Step::reply(doc! { "ok": 1 }),
        ],
        |_| {},
    );
    let session = sim.engine.start_session();
    let requests = [
        OperationRequest::new("test", doc! { "find": "c" }, OperationKind::Read, primary()),
        OperationRequest::new(
            "test",
            doc! { "aggregate": "c", "pipeline": [{ "$out": "d" }], "cursor": {} },
            OperationKind::NonRetryableWrite,
            SelectionCriteria::Write,
        ),
        OperationRequest::new(
            "test",
            doc! { "mapReduce": "c", "map": "m", "reduce": "r", "out": { "inline": 1 } },
            OperationKind::Read,
            primary(),
        ),
    ];
    for request in requests {
        let op = sim.start_request(request.with_session(session));
        sim.run(op).expect("runs");
    }
    let commands: &Vec<Document> = &sim.servers[&address("m")].commands;
    assert_eq!(commands.len(), 3);
    let expected = doc! { "afterClusterTime": time };
    for command in &commands[1..] {
        assert_eq!(
            command.get_document("readConcern").ok(),
            Some(&expected),
            "{command}"
        );
    }
}
