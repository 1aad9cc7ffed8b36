//! Issue 9: an operation whose command the caller hands over encoded
//! ([`OperationRequest::new_raw`]) puts on the wire what the same command as a `Document` puts
//! there (WP-5 `$db`, SE-3 `lsid`, RW-6 `txnNumber`, SE-17 `$clusterTime`, SS-9
//! `$readPreference`, CS-4 `maxTimeMS`), attempt by attempt, and publishes the same started
//! events (EV-2); an encoded command that is not valid BSON is a usage error.

use std::time::Duration;

use bson::{doc, Document, RawDocumentBuf, Timestamp};
use retry_core::engine::{CommandEvent, EngineEvent, OperationRequest};
use retry_core::error::ErrorKind;
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::OperationTimeout;
use retry_sim::{address, overload, Sim, Step};

/// One request to compare, built from its command as a `Document` or encoded.
type Build = fn(&mut Sim, OperationRequest) -> OperationRequest;

/// The commands the mongos received and the started events' commands, running each case's
/// request (`raw`: encoded) on a fresh recording mongos that first fails once with a retryable
/// overload error and gossips a `$clusterTime`.
fn sent(command: &Document, kind: OperationKind, build: Build, raw: bool) -> Vec<Document> {
    let cluster_time = doc! {
        "clusterTime": Timestamp { time: 5, increment: 1 },
        "signature": { "hash": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0; 20] }, "keyId": 0_i64 },
    };
    let mut failed = overload(2);
    failed.insert("$clusterTime", cluster_time.clone());
    let mut sim = Sim::mongos(
        [
            Step::reply(failed),
            Step::reply(doc! { "ok": 1, "$clusterTime": cluster_time }),
        ],
        |o| o.command_monitoring = true,
    );
    let criteria = match kind {
        OperationKind::Read => SelectionCriteria::Read(
            ReadPreference::new(ReadPreferenceMode::SecondaryPreferred, Vec::new(), None)
                .expect("valid"),
        ),
        _ => SelectionCriteria::Write,
    };
    let request = match raw {
        true => OperationRequest::new_raw(
            "test",
            RawDocumentBuf::try_from(command).expect("encodable"),
            kind,
            criteria,
        ),
        false => OperationRequest::new("test", command.clone(), kind, criteria),
    };
    let request = build(&mut sim, request);
    let op = sim.start_request(request);
    sim.run(op).expect("the retry succeeds");
    let started = sim.events.iter().filter_map(|(_, e)| match e {
        EngineEvent::Command(event) => match &**event {
            CommandEvent::Started { command, .. } => Some(command.clone()),
            _ => None,
        },
        _ => None,
    });
    let received = sim.servers[&address("m")].commands.clone();
    assert_eq!(received.len(), 2, "two attempts");
    received.into_iter().chain(started).collect()
}

/// Compares the two runs; the retry carries at least the fields `carried`.
fn same_on_the_wire(command: Document, kind: OperationKind, build: Build, carried: &[&str]) {
    let plain = sent(&command, kind, build, false);
    let raw = sent(&command, kind, build, true);
    for field in carried {
        assert!(raw[1].contains_key(field), "{field} in {:?}", raw[1]);
    }
    assert_eq!(plain, raw);
    // Field by field, in order.
    for (plain, raw) in plain.iter().zip(&raw) {
        let keys = |d: &Document| d.keys().cloned().collect::<Vec<String>>();
        assert_eq!(keys(plain), keys(raw));
    }
}

#[test]
fn wp5_se3_rw6_se17_a_retryable_write_sends_the_same_fields() {
    same_on_the_wire(
        doc! { "insert": "c", "documents": [{ "a": 1 }], "ordered": true },
        OperationKind::RetryableWrite,
        |_, r| r,
        &["$db", "lsid", "txnNumber", "$clusterTime"],
    );
}

#[test]
fn ss9_cs4_a_read_sends_the_same_read_preference_and_max_time() {
    same_on_the_wire(
        doc! { "find": "c", "filter": { "a": 1 } },
        OperationKind::Read,
        |sim, r| {
            r.with_timeout(OperationTimeout::Until(
                sim.now.saturating_add(Duration::from_secs(10)),
            ))
        },
        &[
            "$db",
            "lsid",
            "$readPreference",
            "maxTimeMS",
            "$clusterTime",
        ],
    );
}

#[test]
fn se10_an_explicit_session_sends_the_same_fields() {
    same_on_the_wire(
        doc! { "insert": "c", "documents": [{}] },
        OperationKind::RetryableWrite,
        |sim, r| r.with_session(sim.engine.start_session()),
        &["$db", "lsid", "txnNumber", "$clusterTime"],
    );
}

#[test]
fn wp5_a_db_in_the_encoded_command_is_replaced() {
    same_on_the_wire(
        doc! { "ping": 1, "$db": "other" },
        OperationKind::RunCommand,
        |_, r| r,
        &["$db", "lsid", "$clusterTime"],
    );
}

#[test]
fn fields_set_beside_the_encoded_command_replace_its_own() {
    let mut sim = Sim::mongos([Step::reply(doc! { "ok": 1 })], |_| {});
    let mut request = OperationRequest::new_raw(
        "test",
        RawDocumentBuf::try_from(&doc! { "find": "c", "limit": 1, "skip": 2 }).expect("encodable"),
        OperationKind::Read,
        retry_sim::primary(),
    );
    request.command.insert("limit", 5);
    let op = sim.start_request(request);
    sim.run(op).expect("ok");
    let received = &sim.servers[&address("m")].commands[0];
    assert_eq!(received.get_i32("limit").ok(), Some(5));
    assert_eq!(received.get_i32("skip").ok(), Some(2));
    let keys: Vec<&str> = received.keys().map(String::as_str).collect();
    assert_eq!(keys[..3], ["find", "skip", "limit"]);
}

/// House rule 11: an encoded command that is not valid BSON ends the operation at once with a
/// usage error; nothing is sent.
#[test]
fn an_invalid_encoded_command_is_a_usage_error() {
    let mut sim = Sim::mongos([], |_| {});
    // A string element whose length runs past the document.
    let bytes = vec![12, 0, 0, 0, 0x02, b'a', 0, 0xFF, 0xFF, 0xFF, 0x7F, 0];
    let command = RawDocumentBuf::from_bytes(bytes).expect("framed");
    let op = sim.start_request(OperationRequest::new_raw(
        "test",
        command,
        OperationKind::RunCommand,
        SelectionCriteria::Write,
    ));
    let error = sim.run(op).expect_err("refused");
    assert!(matches!(error.kind, ErrorKind::Usage { .. }), "{error:?}");
    assert!(sim.servers[&address("m")].commands.is_empty());
}
