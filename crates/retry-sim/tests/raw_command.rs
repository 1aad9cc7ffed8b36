//! Issue 9: an operation whose command the caller hands over encoded
//! ([`OperationRequest::new_raw`]) puts on the wire what the same command as a `Document` puts
//! there (WP-5 `$db`, SE-3 `lsid`, RW-6 `txnNumber`, SE-17 `$clusterTime`, SS-9
//! `$readPreference`, CS-4 `maxTimeMS`), attempt by attempt, and publishes the same started
//! events (EV-2); an encoded command that is not valid BSON is a usage error.

use std::time::Duration;

use bson::{doc, Document, RawDocument, RawDocumentBuf, Timestamp};
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
/// overload error and gossips a `$clusterTime`; and the top-level keys of the two commands
/// received, read from their bytes, each asserted to be there once (WP-5: a server refuses a
/// duplicate field). EV-2 (review12 finding 4): each attempt's started event is asserted to hold
/// the command the mongos received, byte for byte (the same keys in the same order, the same
/// values), so that the started event and the wire cannot go wrong the same way unseen.
fn sent(
    command: &Document,
    kind: OperationKind,
    build: Build,
    raw: bool,
) -> (Vec<Document>, Vec<Vec<String>>) {
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
    sim.servers
        .get_mut(&address("m"))
        .expect("the mongos")
        .record_raw = true;
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
    let started: Vec<Document> = sim
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Command(event) => match &**event {
                CommandEvent::Started { command, .. } => Some(command.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let server = &sim.servers[&address("m")];
    let received = server.commands.clone();
    assert_eq!(received.len(), 2, "two attempts");
    // EV-2: the started event's command is the command as sent (hellos have no started event).
    let wire: Vec<&RawDocumentBuf> = server
        .raw_commands
        .iter()
        .filter(|command| !matches!(name(command).as_str(), "hello" | "isMaster" | "ismaster"))
        .collect();
    assert_eq!(started.len(), wire.len(), "a started event per attempt");
    for (attempt, (started, wire)) in started.iter().zip(wire).enumerate() {
        let as_started = RawDocumentBuf::try_from(started).expect("encodable");
        assert_eq!(
            keys(&as_started),
            keys(wire),
            "attempt {attempt}: the started event's keys are the keys sent, in order"
        );
        assert_eq!(
            as_started.as_bytes(),
            wire.as_bytes(),
            "attempt {attempt}: the started event's command {started:?} is the command sent {:?}",
            Document::try_from(&**wire)
        );
    }
    for keys in &server.command_keys {
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "a key sent twice: {keys:?}");
    }
    let keys = server.command_keys.clone();
    (received.into_iter().chain(started).collect(), keys)
}

/// The top-level keys of `command`, in order.
fn keys(command: &RawDocument) -> Vec<String> {
    command
        .iter()
        .map(|element| {
            let (key, _) = element.expect("valid BSON");
            key.as_str().to_owned()
        })
        .collect()
}

/// The name of `command` (its first key).
fn name(command: &RawDocument) -> String {
    keys(command).into_iter().next().unwrap_or_default()
}

/// Compares the two runs; the retry carries at least the fields `carried`.
fn same_on_the_wire(command: Document, kind: OperationKind, build: Build, carried: &[&str]) {
    let (plain, plain_keys) = sent(&command, kind, build, false);
    let (raw, raw_keys) = sent(&command, kind, build, true);
    for field in carried {
        assert!(raw[1].contains_key(field), "{field} in {:?}", raw[1]);
    }
    assert_eq!(plain, raw);
    // Field by field, in order: on the wire as sent, and in the started events.
    assert_eq!(plain_keys, raw_keys);
    for (plain, raw) in plain.iter().zip(&raw).skip(2) {
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

/// SS-9, WP-5, EV-2 (review12 finding 4): a `$readPreference` the caller puts in its command is
/// neither refused nor sent twice (`sent` checks every key is there once). When the engine
/// sends one (a secondaryPreferred read to a mongos), the engine's replaces the caller's: in the
/// caller's place in a `Document`, among the fields written after the encoded ones in an
/// encoded command (a field the engine sets beside an encoded command replaces its own there).
/// When it sends none (a command run as primary), the caller's goes on the wire as it is, in
/// its place. Each attempt's started event holds the command received (`sent`).
#[test]
fn ss9_a_callers_own_read_preference_is_replaced_by_the_one_the_engine_sends() {
    let callers = doc! { "mode": "nearest" };
    let command = doc! { "find": "c", "$readPreference": callers.clone(), "filter": { "a": 1 } };
    let engines = doc! { "mode": "secondaryPreferred" };
    // (kind, encoded, the `$readPreference` received, whether in the caller's place)
    let cases = [
        (OperationKind::Read, false, &engines, true),
        (OperationKind::Read, true, &engines, false),
        (OperationKind::RunCommand, false, &callers, true),
        (OperationKind::RunCommand, true, &callers, true),
    ];
    for (kind, raw, expected, in_place) in cases {
        let label = format!("{kind:?}, encoded: {raw}");
        let (commands, keys) = sent(&command, kind, |_, r| r, raw);
        for (attempt, (received, keys)) in commands.iter().zip(&keys).enumerate() {
            assert_eq!(
                received.get_document("$readPreference").ok(),
                Some(expected),
                "{label}, attempt {attempt}: {received:?}"
            );
            let second = if in_place {
                "$readPreference"
            } else {
                "filter"
            };
            assert_eq!(
                keys[..2],
                ["find", second],
                "{label}, attempt {attempt}: {keys:?}"
            );
        }
    }
}

/// A read with a 10 s timeoutMS (CS-4: `maxTimeMS` on every attempt).
fn with_timeout(sim: &mut Sim, request: OperationRequest) -> OperationRequest {
    request.with_timeout(OperationTimeout::Until(
        sim.now.saturating_add(Duration::from_secs(10)),
    ))
}

/// WP-5 (review10 finding 1): an encoded command already holding a field the engine sets
/// (CS-4 `maxTimeMS`, SS-9 `$readPreference`, SE-17 `$clusterTime`, SE-3 `lsid`, RW-6
/// `txnNumber`, WP-5 `$db`) or one it may (`readConcern`, `writeConcern`, `apiVersion`), run
/// with timeoutMS and secondaryPreferred on a mongos with a retry, sends every top-level key once
/// in both attempts (read from the bytes by `sent`), with the values the same command as a
/// `Document` sends; one field at a time, then all of them.
#[test]
fn wp5_an_encoded_field_the_engine_also_sets_goes_on_the_wire_once() {
    let lsid = doc! { "id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] } };
    let cluster_time = doc! {
        "clusterTime": Timestamp { time: 1, increment: 1 },
        "signature": { "hash": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0; 20] }, "keyId": 0_i64 },
    };
    let fields = doc! {
        "maxTimeMS": 60_000,
        "readConcern": { "level": "local" },
        "writeConcern": { "w": 1 },
        "$readPreference": { "mode": "primary" },
        "$clusterTime": cluster_time,
        "lsid": lsid,
        "txnNumber": 3_i64,
        "$db": "other",
        "apiVersion": "1",
    };
    let find = doc! { "find": "c", "filter": { "a": 1 } };
    let mut all = find.clone();
    all.extend(fields.clone());
    let cases = fields.iter().map(|(key, value)| {
        let mut command = find.clone();
        command.insert(key, value.clone());
        (key.clone(), command)
    });
    for (label, command) in cases.chain([("all".to_owned(), all)]) {
        let (plain, _) = sent(&command, OperationKind::Read, with_timeout, false);
        let (raw, keys) = sent(&command, OperationKind::Read, with_timeout, true);
        assert_eq!(plain, raw, "{label}");
        assert!(keys.iter().all(|k| k[0] == "find"), "{label}: {keys:?}");
    }
}

/// `command` encoded with the field `key: <int32 value>` appended again.
fn with_repeated(command: &Document, key: &str, value: i32) -> RawDocumentBuf {
    let mut bytes = command.to_vec().expect("encodable");
    bytes.pop();
    bytes.push(0x10);
    bytes.extend(key.as_bytes());
    bytes.push(0);
    bytes.extend(value.to_le_bytes());
    bytes.push(0);
    let len = i32::try_from(bytes.len()).expect("small");
    bytes[..4].copy_from_slice(&len.to_le_bytes());
    RawDocumentBuf::from_bytes(bytes).expect("framed")
}

/// WP-5, house rules 7 and 11 (review10 finding 1): an encoded command that repeats a top-level
/// key (a real server refuses a duplicate field) ends with a usage error naming it; nothing is
/// sent.
#[test]
fn wp5_an_encoded_command_with_a_repeated_key_is_a_usage_error() {
    for key in ["maxTimeMS", "limit", "find"] {
        let mut sim = Sim::mongos([], |_| {});
        let command = with_repeated(&doc! { "find": "c", "maxTimeMS": 5, "limit": 1 }, key, 6);
        let op = sim.start_request(OperationRequest::new_raw(
            "test",
            command,
            OperationKind::Read,
            retry_sim::primary(),
        ));
        let error = sim.run(op).expect_err("refused");
        assert!(matches!(error.kind, ErrorKind::Usage { .. }), "{error:?}");
        assert!(error.to_string().contains(&format!("`{key}`")), "{error}");
        assert!(sim.servers[&address("m")].commands.is_empty());
    }
}

/// WP-3 (review10 finding 3): the first key names the command. A field set beside an encoded
/// command that names it would replace it after the encoded fields, moving the name off the
/// front: a usage error, nothing sent, no started event. Another field set beside it keeps the
/// name first on the wire and in the started event (EV-2).
#[test]
fn wp3_a_field_beside_an_encoded_command_never_displaces_its_name() {
    for (field, refused) in [("find", true), ("filter", false)] {
        let mut sim = Sim::mongos([Step::reply(doc! { "ok": 1 })], |o| {
            o.command_monitoring = true
        });
        let mut request = OperationRequest::new_raw(
            "test",
            RawDocumentBuf::try_from(&doc! { "find": "c", "filter": {} }).expect("encodable"),
            OperationKind::Read,
            retry_sim::primary(),
        );
        request.command.insert(field, "d");
        let op = sim.start_request(request);
        let result = sim.run(op);
        let started: Vec<String> = sim
            .events
            .iter()
            .filter_map(|(_, e)| match e {
                EngineEvent::Command(event) => match &**event {
                    CommandEvent::Started { info, command } => {
                        assert_eq!(command.keys().next(), Some(&info.command_name));
                        Some(info.command_name.clone())
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect();
        let wire = &sim.servers[&address("m")].command_keys;
        if refused {
            let error = result.expect_err("refused");
            assert!(matches!(error.kind, ErrorKind::Usage { .. }), "{error:?}");
            assert!(
                wire.is_empty() && started.is_empty(),
                "{wire:?} {started:?}"
            );
        } else {
            result.expect("ok");
            assert_eq!(wire.len(), 1);
            assert_eq!(wire[0][0], "find", "{wire:?}");
            assert_eq!(started, ["find"]);
        }
    }
}
