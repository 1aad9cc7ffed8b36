//! Versioned-api spec ("Sending Declared API Version to the Server"; beside WP-5 and HS-2): with
//! a declared Stable API version, every command the engine sends carries `apiVersion` and the
//! `apiStrict` / `apiDeprecationErrors` the client set, exactly once: operations (given as a
//! document or encoded), `getMore`, each command of a transaction (`commitTransaction` and
//! `abortTransaction` included), `killCursors`, the handshakes and the monitors' hellos. Without
//! one, no command carries any. The simulated mongos stands for a server started with
//! `requireApiVersion` (code 498870 for a command without `apiVersion`, a hello included), in
//! virtual time.

use std::time::Duration;

use bson::{doc, Bson, Document, RawDocumentBuf};
use retry_core::engine::{CommandEvent, EngineEvent, EngineOptions, OperationRequest};
use retry_core::error::ErrorKind;
use retry_core::handshake::ServerApi;
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;
use retry_core::time::Instant;
use retry_sim::{
    abort, address, commit, cursor_batch, get_more, insert, kill_cursors, open_cursor, Sim,
};

const API_KEYS: [&str; 3] = ["apiVersion", "apiStrict", "apiDeprecationErrors"];

/// A recording mongos that requires an API version (`requireApiVersion`), with `configure`
/// applied to the client's options; commands answer `{ok: 1}`.
fn mongos(configure: impl FnOnce(&mut EngineOptions)) -> Sim {
    let mut sim = Sim::mongos([], |o| {
        o.command_monitoring = true;
        configure(o);
    });
    let server = sim.servers.get_mut(&address("m")).expect("the mongos");
    server.record_raw = true;
    server.require_api_version = true;
    sim
}

fn declared(o: &mut EngineOptions) {
    o.handshake.server_api = Some(ServerApi {
        version: "1".into(),
        strict: Some(true),
        deprecation_errors: Some(false),
    });
}

/// The raw commands the mongos received since `from`, hellos included.
fn raw_received(sim: &Sim, from: usize) -> Vec<RawDocumentBuf> {
    sim.servers[&address("m")].raw_commands[from..].to_vec()
}

/// Each API field of `command` with how many times it occurs (a repeated key stays visible).
fn api_fields(command: &RawDocumentBuf) -> Vec<(String, Bson, usize)> {
    let mut fields: Vec<(String, Bson, usize)> = Vec::new();
    for element in command.iter() {
        let (key, value) = element.expect("valid BSON");
        let key = key.as_str();
        if !API_KEYS.contains(&key) {
            continue;
        }
        let value = Bson::try_from(value).expect("converts");
        match fields.iter_mut().find(|(k, _, _)| k == key) {
            Some(field) => field.2 += 1,
            None => fields.push((key.to_owned(), value, 1)),
        }
    }
    fields
}

fn name(command: &RawDocumentBuf) -> String {
    command
        .iter()
        .next()
        .and_then(Result::ok)
        .map(|(key, _)| key.as_str().to_owned())
        .unwrap_or_default()
}

fn expected() -> Vec<(String, Bson, usize)> {
    vec![
        ("apiVersion".into(), Bson::String("1".into()), 1),
        ("apiStrict".into(), Bson::Boolean(true), 1),
        ("apiDeprecationErrors".into(), Bson::Boolean(false), 1),
    ]
}

fn run(sim: &mut Sim, request: OperationRequest) -> Document {
    let op = sim.start_request(request);
    sim.run(op).expect("the server accepts the command")
}

/// Versioned-api spec, "Cursors": the cursor-opening `find`, its `getMore` (API parameters
/// required since the 2021-05-05 revision) and its `killCursors` carry the declared fields, as
/// does a plain insert; the handshakes and the polling hello after `heartbeatFrequencyMS` too.
#[test]
fn versioned_api_find_get_more_insert_and_hellos_carry_the_fields_once() {
    let mut sim = mongos(declared);
    {
        let server = sim.servers.get_mut(&address("m")).expect("the mongos");
        server
            .script
            .push_back(retry_sim::Step::reply(cursor_batch(42, "firstBatch")));
        server
            .script
            .push_back(retry_sim::Step::reply(cursor_batch(42, "nextBatch")));
    }
    let find = sim.start_request(open_cursor(OperationKind::Read));
    sim.run(find).expect("the find succeeds");
    let cursor = sim.cursor_opened(find).expect("a cursor");
    run(&mut sim, get_more(42, cursor));
    run(&mut sim, kill_cursors(42, cursor));
    run(&mut sim, insert(OperationKind::RetryableWrite));
    // MO-4: the monitor's next check, on its established connection.
    sim.advance_to(Instant::ZERO.saturating_add(Duration::from_secs(11)));

    let received = raw_received(&sim, 0);
    let names: Vec<String> = received.iter().map(name).collect();
    for command in ["find", "getMore", "killCursors", "insert"] {
        assert_eq!(
            names.iter().filter(|n| *n == command).count(),
            1,
            "{names:?}"
        );
    }
    // Two handshakes (monitor and pool) and at least one polling hello.
    assert!(
        names.iter().filter(|n| *n == "hello").count() >= 3,
        "{names:?}"
    );
    for command in &received {
        assert_eq!(
            api_fields(command),
            expected(),
            "{}: {command:?}",
            name(command)
        );
    }
    // EV-2: the started events show the command as sent.
    let started: Vec<&Document> = sim
        .events
        .iter()
        .filter_map(|(_, event)| match event {
            EngineEvent::Command(event) => match &**event {
                CommandEvent::Started { command, .. } => Some(command),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 4);
    for command in started {
        assert_eq!(command.get_str("apiVersion").ok(), Some("1"), "{command}");
        assert_eq!(command.get_bool("apiStrict").ok(), Some(true), "{command}");
        assert_eq!(
            command.get_bool("apiDeprecationErrors").ok(),
            Some(false),
            "{command}"
        );
    }
}

/// Versioned-api spec, "Transactions": the first command (with `startTransaction`), the next
/// ones, `commitTransaction` and `abortTransaction` all carry the declared fields.
#[test]
fn versioned_api_every_command_of_a_transaction_carries_the_fields() {
    let mut sim = mongos(declared);
    let session = sim.engine.start_session();
    let statement = |first| {
        OperationRequest::new(
            "test",
            doc! { "insert": "c", "documents": [{}] },
            OperationKind::InTransaction { read: false, first },
            SelectionCriteria::Write,
        )
        .with_session(session)
    };
    run(&mut sim, statement(true));
    run(&mut sim, statement(false));
    run(&mut sim, commit(session));
    run(&mut sim, statement(true));
    run(&mut sim, abort(session));

    let received: Vec<RawDocumentBuf> = raw_received(&sim, 0)
        .into_iter()
        .filter(|c| name(c) != "hello")
        .collect();
    let names: Vec<String> = received.iter().map(name).collect();
    assert_eq!(
        names,
        [
            "insert",
            "insert",
            "commitTransaction",
            "insert",
            "abortTransaction"
        ]
    );
    for command in &received {
        assert_eq!(api_fields(command), expected(), "{command:?}");
    }
    let starts = received
        .iter()
        .filter(|c| c.get_bool("startTransaction").ok() == Some(true))
        .count();
    assert_eq!(
        starts, 2,
        "TX-1: each transaction's first command starts it"
    );
}

/// Versioned-api spec ("Generic command helper"): an encoded command (issue 9) gets the same
/// fields; its own API fields are replaced by the declared ones, never sent twice.
#[test]
fn versioned_api_encoded_commands_carry_the_declared_fields_once() {
    let mut sim = mongos(declared);
    let encode = |command: Document| RawDocumentBuf::try_from(&command).expect("encodes");
    let plain = encode(doc! { "insert": "c", "documents": [{}] });
    let own =
        encode(doc! { "insert": "c", "apiStrict": false, "documents": [{}], "apiVersion": "1" });
    for command in [plain, own] {
        let from = sim.servers[&address("m")].raw_commands.len();
        run(
            &mut sim,
            OperationRequest::new_raw(
                "test",
                command,
                OperationKind::RetryableWrite,
                SelectionCriteria::Write,
            ),
        );
        let sent: Vec<RawDocumentBuf> = raw_received(&sim, from)
            .into_iter()
            .filter(|c| name(c) == "insert")
            .collect();
        assert_eq!(sent.len(), 1);
        assert_eq!(api_fields(&sent[0]), expected(), "{:?}", sent[0]);
    }
}

/// Versioned-api spec: without a declared version no command carries an API field, and a
/// server that requires one (`requireApiVersion`) refuses every command of the client, its
/// handshakes included (498870: a real server's `enforceRequireAPIVersion` exempts only a hello
/// with `internalClient`): the server stays Unknown with that error, the operation is never sent
/// and ends with the server selection timeout naming it.
#[test]
fn versioned_api_nothing_is_added_without_a_declared_version() {
    let mut sim = mongos(|_| {});
    let op = sim.start_request(insert(OperationKind::RetryableWrite));
    let error = sim.run(op).expect_err("the server requires an API version");
    assert!(
        matches!(error.kind, ErrorKind::ServerSelection { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("498870"), "{error}");
    let received = raw_received(&sim, 0);
    assert!(!received.is_empty());
    for command in &received {
        let hello = ["hello", "isMaster"].contains(&name(command).as_str());
        assert!(hello, "only handshakes and monitoring: {command:?}");
        assert!(api_fields(command).is_empty(), "{command:?}");
    }
}
